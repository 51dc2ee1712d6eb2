#!/bin/sh
# tests/cluster/many.sh - many nodes on one machine: `embstore launch` with
# 16 servers, 64 workers and --replicas 2 runs `embstore-bench --op push
# --verify`; once every worker joined, one server, picked at random, is
# SIGKILLed while they push. Every worker must exit 0 with 0 mismatched
# rows, and the scheduler must declare that one server dead and nobody
# else (no node lost to a starved scheduler, none giving up on it). Then
# the launcher's own share: its workers run --worker-nice steps below it,
# and every child has the open-file limit raised to the hard limit. The
# heartbeat timeout is the default: what is tested is that a job of this
# size needs no tuning on a loaded machine.
#
#   many.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench.
set -u

tools=${1:?usage: many.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: many.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-many-XXXXXX")
PATH=$tools:$PATH
export PATH
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE EMB_HEARTBEAT_TIMEOUT \
	EMB_COORDINATOR
EMB_CLUSTER_TIMEOUT=120
export EMB_CLUSTER_TIMEOUT
S=16
W=64
lpid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# 1. The job, a server killed under it.
out=$work/many.txt
(cd "$work" && exec embstore launch --server_num "$S" --worker_num "$W" \
	--replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op push --verify --rows 4000 --dim 8 --batch 64 \
	--duration 12) >"$out" 2>&1 &
lpid=$!
joined=0
for _ in $(seq 900); do
	joined=$(grep -c '^\[worker\.[0-9]*\] .*worker [0-9]* of '"$W"' joined' "$out")
	[ "$joined" -ge "$W" ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
[ "$joined" -ge "$W" ] || bad "$joined of $W workers joined"
sleep 2
victim=$(awk -v s="$S" 'BEGIN { srand(); print int(rand() * s) }')
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" "$out")
echo "killing server.$victim (pid $vpid)"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq "$W" ] || bad "$n of $W workers verified clean"
grep -q '^\[launch\] server\.[0-9]* killed by' "$out" ||
	bad "the kill did not happen"
grep -q '^\[scheduler\] .*the job goes on' "$out" ||
	bad "no word of the failover"
n=$(grep -c '^\[scheduler\] .* declared dead' "$out")
[ "$n" -eq 1 ] || bad "$n nodes declared dead, not 1"
grep -q 'lost scheduler' "$out" && bad "a node gave up on the scheduler"
if [ "$fail" -ne 0 ]; then
	grep -v '^\[launch\] started' "$out" | grep -v 'info ' | tail -60 >&2
	exit 1
fi

# 2. The launcher's share of the machine: its workers a step down, every
#    child with the hard open-file limit (the soft one lowered first).
hard=$(ulimit -Hn)
base=$(nice)
out=$work/limits.txt
(
	[ "$hard" = unlimited ] || [ "$hard" -gt 256 ] && ulimit -Sn 256
	cd "$work" && exec embstore launch --server_num 1 --worker_num 1 \
		--log-dir "$work/log2" -- sh -c \
		'echo "limits: nice $(nice) nofile $(ulimit -n)";
		 exec embstore-bench --op push --rows 100 --dim 4 --batch 16 \
			--duration 0.2'
) >"$out" 2>&1
st=$?
[ "$st" -eq 0 ] || bad "limits: launch exited $st"
want=$((base + 10))
[ "$want" -gt 19 ] && want=19
grep -q "limits: nice $want nofile $hard\$" "$out" ||
	bad "limits: want nice $want nofile $hard, got:" \
		"$(grep 'limits:' "$out")"
[ "$fail" -eq 0 ] || cat "$out" >&2
exit "$fail"
