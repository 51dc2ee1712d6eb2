#!/bin/sh
# tests/cluster/failover.sh - replication end to end: `embstore launch`
# with 3 servers, 2 workers and --replicas 2 runs `embstore-bench --op push
# --verify`; one server, picked at random, is SIGKILLed at a random moment
# while the workers push. Every worker must exit 0 and report 0
# mismatched rows, and the launcher must say the job went on. Then the
# checks that make it a test: the same kill with --replicas 1 must stop
# the job, and --verify must see mismatches when two benches push to the
# same rows of one server. Where etcd(1) is installed, the replicated kill
# runs once more with the job in etcd (--coordinator) instead of a
# scheduler.
#
#   failover.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench.
set -u

tools=${1:?usage: failover.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: failover.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-failover-XXXXXX")
PATH=$tools:$PATH
export PATH
# A short heartbeat timeout: a frozen server would be dead within 1 s. A
# killed one is dead at once (its scheduler connection closes).
EMB_HEARTBEAT_TIMEOUT=1
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE
lpid=
spid=
epid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null
	[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# run_kill R OUT [LAUNCH_ARGS...]: the launch with --replicas R; kills
# one server 1.5 to 4.5 s after every worker started pushing. Returns the
# launcher's status.
run_kill() {
	r=$1
	out=$2
	shift 2
	(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
		--replicas "$r" --log-dir "$work/log-$r" "$@" -- \
		embstore-bench --op push --verify --rows 20000 --dim 8 \
		--batch 512 --duration 8) >"$out" 2>&1 &
	lpid=$!
	for _ in $(seq 300); do
		n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
		[ "$n" -ge 2 ] && break
		kill -0 "$lpid" 2>/dev/null || break
		sleep 0.1
	done
	victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
	delay=$(awk 'BEGIN { srand(); printf "%.1f", 1.5 + rand() * 3 }')
	sleep "$delay"
	vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
		"$out")
	echo "killing server.$victim (pid $vpid) ${delay} s after the workers" \
		"joined"
	[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
	wait "$lpid"
	st=$?
	lpid=
	return $st
}

# 1. Replicated: the job goes on and loses nothing.
out=$work/r2.txt
run_kill 2 "$out"
st=$?
[ "$st" -eq 0 ] || bad "--replicas 2: launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "--replicas 2: $n of 2 workers verified clean"
grep -q 'the job goes on' "$out" || bad "--replicas 2: no word of the failover"
grep -q '^\[launch\] server\.[0-2] killed by' "$out" ||
	bad "--replicas 2: the kill did not happen"
# The kill came while the workers ran: their exits are reported after it.
awk '/^\[launch\] server\.[0-2] killed/ { k = NR }
     /^\[launch\] worker\.[01] exited/ && !w { w = NR }
     END { exit !(k && w && k < w) }' "$out" ||
	bad "--replicas 2: the server died after the workers were done"
grep -q 'map epoch 2' "$out" || bad "--replicas 2: the map did not change"
[ "$fail" -eq 0 ] || cat "$out" >&2

# 1b. The same with the job in etcd, no scheduler: the dead server's
#     lease expires, a live server writes the failover map.
if ! emb_have_etcd; then
	echo "no etcd: the run with --coordinator is skipped"
elif ! emb_start_etcd "$work" failover; then
	bad "etcd did not start"
else
	cp=$etcd_port
	out=$work/etcd.txt
	# 4 s leases, not the 1 s heartbeats above: a lease is renewed by
	# the node itself, and at the load of the suites side by side (15
	# and more) 1 s renewals starve and end every lease of the job at
	# once (`its etcd lease expired`); the scheduler's verdicts probe
	# before they count a silent node dead.
	EMB_HEARTBEAT_TIMEOUT=4
	run_kill 2 "$out" --coordinator "etcd://127.0.0.1:$cp" --job failover
	st=$?
	EMB_HEARTBEAT_TIMEOUT=1
	[ "$st" -eq 0 ] || bad "etcd, --replicas 2: launch exited $st"
	n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
	[ "$n" -eq 2 ] || bad "etcd, --replicas 2: $n of 2 workers verified clean"
	grep -q 'the job goes on' "$out" ||
		bad "etcd, --replicas 2: no word of the failover"
	grep -q 'map epoch 2' "$out" ||
		bad "etcd, --replicas 2: the workers' map did not change"
	[ "$fail" -eq 0 ] || { cat "$out" >&2; tail -20 "$work/etcd.log" >&2; }
	kill -KILL "$epid" 2>/dev/null
	wait "$epid" 2>/dev/null
	epid=
fi

# 2. Unreplicated, the same kill stops the job: the test above can fail.
out=$work/r1.txt
run_kill 1 "$out"
st=$?
[ "$st" -ne 0 ] || bad "--replicas 1: the job survived a server's death"
grep -q 'stopping every process' "$out" ||
	bad "--replicas 1: the launcher did not stop the job"

# 3. --verify sees lost or foreign updates: two benches that think they
#    own the same rows of one server each find the other's pushes.
emb_start_server "$tools/embstore-server" "$work/server.log" || exit 1
spid=$pid
embstore-bench --servers "127.0.0.1:$port" --op push --verify \
	--rows 2000 --dim 4 --batch 256 --duration 2 >"$work/a.txt" 2>&1 &
apid=$!
embstore-bench --servers "127.0.0.1:$port" --op push --verify \
	--rows 2000 --dim 4 --batch 256 --duration 2 >"$work/b.txt" 2>&1
bst=$?
wait "$apid"
ast=$?
[ "$ast" -eq 1 ] && [ "$bst" -eq 1 ] ||
	bad "shared rows: benches exited $ast and $bst, not 1 and 1"
grep -q 'verify: [0-9]* rows checked, [1-9][0-9]* mismatched' \
	"$work/a.txt" || bad "shared rows: no mismatch reported"
# And alone, over the network, it is clean.
embstore-bench --servers "127.0.0.1:$port" --op push --verify --table own \
	--rows 2000 --dim 4 --batch 256 --duration 1 >"$work/c.txt" 2>&1 ||
	bad "alone: bench exited $?"
# (how many rows a 1 s run touched depends on the machine's load)
grep -q 'verify: [1-9][0-9]* rows checked, 0 mismatched' "$work/c.txt" ||
	bad "alone: $(grep verify "$work/c.txt")"
if [ "$fail" -ne 0 ]; then
	for f in "$work"/a.txt "$work"/c.txt "$work"/r1.txt; do
		echo "== $f" >&2
		cat "$f" >&2
	done
fi
exit "$fail"
