#!/bin/sh
# tests/cluster/kill_calls.sh - no call fails for a death its replicas
# cover (docs/replication.md, "What survives a death"): `embstore launch
# --server_num 3 --worker_num 2 --replicas 2` runs `embstore-bench --op
# step --verify` (each step a pull, then a push, of one batch) while
# servers are SIGKILLed at random moments, each replaced by a new
# `embstore-server` that is filled and becomes a full replica before the
# next kill. The second kill is of that replacement, just made a full
# replica: its rank is taken a second time, and after the rebalance the
# slots it is primary of have different backups, so a pull part in flight
# to it must be split between them. Every worker must exit 0 with 0
# mismatched rows.
#
#   kill_calls.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: kill_calls.sh TOOLS_DIR}
tools=$(cd "$tools" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-killcalls-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=2
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN
lpid=
newpids=
fail=0
kills=3

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	for p in $newpids; do
		kill -KILL "$p" 2>/dev/null
	done
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# A random number of ms in [$1, $2).
rand_ms() {
	awk -v lo="$1" -v hi="$2" -v s="$$$(date +%N)" \
		'BEGIN { srand(s); print int(lo + rand() * (hi - lo)) }'
}

out=$work/launch.txt
(cd "$work" && EMB_METRICS_LISTEN=127.0.0.1:0 exec embstore launch \
	--server_num 3 --worker_num 2 --replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op step --verify --rows 20000 --dim 8 --batch 512 \
	--duration 90 --stop-file "$work/stop") >"$out" 2>&1 &
lpid=$!
for _ in $(seq 300); do
	n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
	[ "$n" -ge 2 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
sched=$(sed -n 's/^\[launch\] scheduler on \([^,]*\),.*/\1/p' "$out" | head -1)
murl=$(sed -n 's/^\[scheduler\] .*metrics on \(http:[^ ,]*\).*/\1/p' "$out" |
	head -1)
[ -n "$sched" ] && [ -n "$murl" ] || bad "no scheduler address or /metrics"
live=$(sed -n 's/^\[launch\] started server\.[0-2], pid \([0-9]*\)$/\1/p' "$out")
[ "$(echo "$live" | wc -w)" -eq 3 ] || bad "launch did not start 3 servers"
last=

i=1
while [ "$i" -le "$kills" ] && [ "$fail" -eq 0 ]; do
	kill -0 "$lpid" 2>/dev/null || bad "the job ended before kill $i"
	sleep "$(awk -v m="$(rand_ms 200 1500)" 'BEGIN { print m / 1000 }')"
	# Kill 2 is the replacement of kill 1, a full replica by now.
	if [ "$i" -eq 2 ]; then
		victim=$last
	else
		n=$(echo "$live" | wc -w)
		k=$(( $(rand_ms 0 "$n") + 1 ))
		victim=$(echo "$live" | tr ' ' '\n' | grep . | sed -n "${k}p")
	fi
	echo "kill $i: pid $victim"
	kill -KILL "$victim" 2>/dev/null || bad "pid $victim was not running"
	live=$(echo "$live" | tr ' ' '\n' | grep -v "^$victim\$")
	removed=0
	for _ in $(seq 100); do
		removed=$(grep -c 'map epoch [0-9]*: server [0-2] removed' "$out")
		[ "$removed" -ge "$i" ] && break
		sleep 0.05
	done
	[ "$removed" -ge "$i" ] || bad "kill $i: the scheduler did not fail it over"
	EMB_ROLE=server EMB_SCHED_HOST=${sched%:*} \
		EMB_SCHED_PORT=${sched##*:} EMB_METRICS_LISTEN= \
		embstore-server --listen 127.0.0.1:0 >"$work/new.$i.txt" 2>&1 &
	last=$!
	newpids="$newpids $last"
	live="$live $last"
	full=
	for _ in $(seq 600); do
		curl -fsS "$murl" >"$work/m.txt" 2>/dev/null
		if grep -q "^embstore_cluster_recoveries_total $i\$" \
			"$work/m.txt"; then
			full=1
			break
		fi
		sleep 0.05
	done
	[ -n "$full" ] || bad "kill $i: the replacement never became a full replica"
	i=$((i + 1))
done
# Two more seconds of steps on the last replacement, then the end (the
# training's --stop-file; 90 s bounds a test that hangs).
sleep 2
: >"$work/stop"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q 'lost every holder' "$out" && bad "slots were lost"
grep -q 'step failed' "$out" && bad "a step failed"
if [ "$fail" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then
	grep -v '^\[worker' "$out" | tail -80 >&2
	grep '^\[worker' "$out" | tail -40 >&2
fi
exit "$fail"
