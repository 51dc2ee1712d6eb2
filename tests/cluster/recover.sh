#!/bin/sh
# tests/cluster/recover.sh - recovery end to end (docs/replication.md,
# "Recovery"): `embstore launch --server_num 3 --worker_num 2 --replicas 2`
# runs `embstore-bench --op push --verify`; a server is SIGKILLed while the
# workers push, and a replacement `embstore-server` started against the
# job's scheduler takes the dead rank. Once the scheduler's /metrics says
# it holds its slots in full (no slot filling, none under-replicated, one
# recovery) and `embstore stat --sched` shows it live with no filling
# range, the other holder of some of its slots is killed: every worker
# must exit 0 with 0 mismatched rows, so the replacement held every
# acknowledged update of those slots. A replacement the scheduler does not
# need (no dead server) is refused and takes no rank.
#
#   recover.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: recover.sh TOOLS_DIR}
tools=$(cd "$tools" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-recover-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=1
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN
lpid=
npid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$npid" ] && kill -KILL "$npid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

out=$work/launch.txt
(cd "$work" && EMB_METRICS_LISTEN=127.0.0.1:0 exec embstore launch \
	--server_num 3 --worker_num 2 --replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op push --verify --rows 20000 --dim 8 --batch 512 \
	--duration 14) >"$out" 2>&1 &
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

# A server that no dead rank waits for is refused.
EMB_ROLE=server EMB_SCHED_HOST=${sched%:*} EMB_SCHED_PORT=${sched##*:} \
	embstore-server --listen 127.0.0.1:0 >"$work/extra.txt" 2>&1
grep -q 'cluster full' "$work/extra.txt" ||
	bad "a server joining a full job was not refused"

sleep 1.5
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
	"$out")
echo "killing server.$victim (pid $vpid); scheduler $sched"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
for _ in $(seq 50); do
	grep -q 'server [0-2] removed' "$out" && break
	sleep 0.1
done
rank=$(sed -n 's/.*map epoch [0-9]*: server \([0-2]\) removed.*/\1/p' "$out" |
	head -1)
[ -n "$rank" ] || bad "the scheduler did not fail the server over"

# The replacement: the same server, against the running job.
EMB_ROLE=server EMB_SCHED_HOST=${sched%:*} EMB_SCHED_PORT=${sched##*:} \
	EMB_METRICS_LISTEN= embstore-server --listen 127.0.0.1:0 \
	>"$work/new.txt" 2>&1 &
npid=$!
t0=$(date +%s%N)
full=
seen=
for _ in $(seq 500); do
	curl -fsS "$murl" >"$work/m.txt" 2>/dev/null
	# While it is filled, some of its slots are always being filled.
	grep -q "^embstore_cluster_slot_holders{server=\"$rank\",state=\"filling\"} [1-9]" \
		"$work/m.txt" && seen=1
	if grep -q '^embstore_cluster_recoveries_total 1$' "$work/m.txt"; then
		full=1
		break
	fi
	sleep 0.02
done
t1=$(date +%s%N)
# A fill may end between two scrapes: since servers watch the map, 12
# chunks took 149 ms beside CPU hogs. Then the scheduler's log says it.
if [ -z "$seen" ]; then
	grep -q "map epoch [0-9]*: server $rank is being filled with slots" \
		"$out" && grep -q "server $rank is a full replica" "$out" ||
		bad "/metrics never showed the replacement filling, nor did the scheduler's log"
	echo "the fill ended between two scrapes of /metrics:" \
		"$(sed -n "s/.*\(server $rank is a full replica ([^)]*)\).*/\1/p" "$out")"
fi
[ -n "$full" ] || bad "the replacement did not become a full replica"
echo "replacement full after $(( (t1 - t0) / 1000000 )) ms"
curl -fsS "$murl" >"$work/metrics.txt" 2>/dev/null
grep -q "^embstore_cluster_slot_holders{server=\"$rank\",state=\"filling\"} 0$" \
	"$work/metrics.txt" || bad "/metrics: the replacement still filling"
p=$(sed -n "s/^embstore_cluster_slot_holders{server=\"$rank\",state=\"primary\"} //p" \
	"$work/metrics.txt")
b=$(sed -n "s/^embstore_cluster_slot_holders{server=\"$rank\",state=\"backup\"} //p" \
	"$work/metrics.txt")
# Every slot has two holders again, and it is primary of about a third.
[ "${p:-0}" -ge 1300 ] && [ $(( ${p:-0} + ${b:-0} )) -ge 2730 ] ||
	bad "/metrics: the replacement holds $p primary and $b backup slots"
[ "$(awk '$1 == "embstore_cluster_filling_server" { print $2 }' \
	"$work/metrics.txt")" = -1 ] || bad "/metrics: a fill still under way"
embstore stat --sched "$sched" --interval 0.2 >"$work/stat.txt" 2>&1 ||
	bad "embstore stat exited $?"
naddr=$(sed -n 's/.*listening on \([^ ]*\) .*/\1/p' "$work/new.txt" | head -1)
grep -q "^$naddr  *live  *[0-9].*[0-9]-[0-9]" "$work/stat.txt" ||
	bad "embstore stat: the replacement ($naddr) is not live with slots"
grep -q '^map epoch [0-9]*, 2 replicas, 0 lost slots$' "$work/stat.txt" ||
	bad "embstore stat: no map line"
grep -q 'filling' "$work/stat.txt" && bad "embstore stat: still filling"

# The other holder of the replacement's slots: any other live server
# shares some with it; with it gone, those slots live on the newcomer.
other=$(( (victim + 1) % 3 ))
opid=$(sed -n "s/^\[launch\] started server\.$other, pid \([0-9]*\)$/\1/p" \
	"$out")
echo "killing server.$other (pid $opid)"
[ -n "$opid" ] && kill -KILL "$opid" || bad "no server.$other to kill"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q 'lost every holder' "$out" && bad "slots were lost"
if [ "$fail" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then
	for f in "$out" "$work/new.txt" "$work/extra.txt" "$work/stat.txt"; do
		echo "== $f" >&2
		cat "$f" >&2
	done
fi
exit "$fail"
