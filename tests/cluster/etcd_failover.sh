#!/bin/sh
# tests/cluster/etcd_failover.sh - failover of a replicated job kept in
# etcd, with no scheduler, as its clients see it: `embstore launch
# --coordinator etcd://... --server_num 3 --worker_num 2 --replicas 2`
# runs `embstore-bench --op step --verify` (pull, train, push); one
# server, picked at random, is SIGKILLed 1 to 3 s into training. Its
# lease expires, the live server of lowest rank writes map epoch 2 to
# etcd, and every worker follows that map (`map epoch 2 from etcd`) as it
# would a scheduler's: both workers exit 0 with 0
# mismatched rows, the live servers took the map too (their writes are
# checked against it), and the job ends cleanly. Skipped (77) without
# etcd(1) or python3 (free ports).
#
#   etcd_failover.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench.
set -u

tools=${1:?usage: etcd_failover.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: etcd_failover.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
if ! emb_have_etcd; then
	echo "no etcd or python3: skipped"
	exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-etcd-failover-XXXXXX")
PATH=$tools:$PATH
export PATH
# A 4 s lease: the killed server is dead to the others within about 4.8 s
# (the TTL and one poll), inside the workers' 14 s run. Not 2 s: with the
# suites running side by side, renewals starved past 2 s ended every
# lease of the job at once (`its etcd lease expired`).
EMB_HEARTBEAT_TIMEOUT=4
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_COORDINATOR \
	EMB_JOB EMB_SERVER_MAX
lpid=
epid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

emb_start_etcd "$work" efo || exit 1
cp=$etcd_port

out=$work/launch.txt
(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
	--replicas 2 --coordinator "etcd://127.0.0.1:$cp" --job efo \
	--log-dir "$work/log" -- \
	embstore-bench --op step --verify --rows 20000 --dim 8 --batch 512 \
	--duration 14) >"$out" 2>&1 &
lpid=$!
for _ in $(seq 300); do
	n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
	[ "$n" -ge 2 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
delay=$(awk 'BEGIN { srand(); printf "%.1f", 1 + rand() * 2 }')
sleep "$delay"
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
	"$out")
echo "killing server.$victim (pid $vpid) ${delay} s after the workers joined"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
wait "$lpid"
st=$?
lpid=

[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q '^\[launch\] server\.[0-2] killed by' "$out" ||
	bad "the kill did not happen"
# The kill came while the workers trained: their exits come after it.
awk '/^\[launch\] server\.[0-2] killed/ { k = NR }
     /^\[launch\] worker\.[01] exited/ && !w { w = NR }
     END { exit !(k && w && k < w) }' "$out" ||
	bad "the server died after the workers were done"
grep -q 'the job goes on' "$out" || bad "no word of the failover"
# Ranks are taken in etcd in any order: the victim's is in its log.
rank=$(sed -n "s/^\[server\.$victim\] .* as server \([0-9]*\) of 3$/\1/p" \
	"$out" | head -1)
[ -n "$rank" ] || bad "server.$victim logged no rank"
# A live server wrote the failover map to etcd ...
grep -q "server [0-2]: server $rank is dead: its slots go to their backups (map epoch 2)" \
	"$out" || bad "no live server wrote map epoch 2"
# ... and both workers routed by it, as they would by a scheduler's map.
for w in 0 1; do
	grep -q "^\[worker\.$w\] .*map epoch 2 from etcd" "$out" ||
		bad "worker $w did not follow map epoch 2"
done
# The live servers took it as their view, against which they check the
# epochs writes carry.
for s in 0 1 2; do
	[ "$s" = "$victim" ] && continue
	grep -q "^\[server\.$s\] .*map epoch 2: server $rank left the map; this server checks writes" \
		"$out" || bad "server $s took no view of map epoch 2"
done
# Ended cleanly: each live server exits 0 once both workers finished.
for s in 0 1 2; do
	[ "$s" = "$victim" ] && continue
	grep -q "^\[launch\] server\.$s exited with 0" "$out" ||
		bad "server $s did not exit 0"
done
if [ "$fail" -ne 0 ]; then
	cat "$out" >&2
	tail -20 "$work/etcd.log" >&2
fi
exit "$fail"
