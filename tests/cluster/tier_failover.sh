#!/bin/sh
# tests/cluster/tier_failover.sh - a replicated job whose tables live
# mostly on the device tier: `embstore launch` with 3 servers under
# EMB_MEM_LIMIT=12M and EMB_TIER_DIR (the servers' --mem-limit and
# --tier-dir), --replicas 2, 2 workers running `embstore-bench --op push
# --verify` over 240,000 rows of dim 32 (about 35 MB of rows a server
# against a 12 MB limit). One server is SIGKILLed while the workers push:
# the job must go on, every worker verify 0 mismatched, and the servers
# must have kept rows on the device (their tier files grew past 4 MB).
#
#   tier_failover.sh TOOLS_DIR SRC_DIR
set -u

tools=${1:?usage: tier_failover.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: tier_failover.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-tierfo-XXXXXX")
PATH=$tools:$PATH
EMB_HEARTBEAT_TIMEOUT=1
EMB_CLUSTER_TIMEOUT=30
EMB_MEM_LIMIT=12M
EMB_TIER_DIR=$work/tier
export PATH EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT EMB_MEM_LIMIT EMB_TIER_DIR
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE
mkdir "$work/tier"
lpid=
fail=0
cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

out=$work/launch.txt
(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
	--replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op push --verify --rows 240000 --dim 32 \
	--batch 2048 --duration 12) >"$out" 2>&1 &
lpid=$!
for _ in $(seq 600); do
	n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
	[ "$n" -ge 2 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
# Until the tier files hold rows (the preload makes them), then the kill.
big=0
for _ in $(seq 600); do
	big=$(find "$work/tier" -name '*.tier' -size +4M | wc -l)
	[ "$big" -ge 3 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
[ "$big" -ge 3 ] || bad "$big of 3 servers' tier files grew past 4 MB"
sleep 1
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
	"$out")
echo "killing server.$victim (pid $vpid)"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q 'the job goes on' "$out" || bad "no word of the failover"
grep -q "^\[launch\] server\.$victim killed by" "$out" ||
	bad "the kill did not happen"
awk '/^\[launch\] server\.[0-2] killed/ { k = NR }
     /^\[launch\] worker\.[01] exited/ && !w { w = NR }
     END { exit !(k && w && k < w) }' "$out" ||
	bad "the server died after the workers were done"
[ "$fail" -eq 0 ] || { cat "$out" >&2; tail -5 "$work"/log/server.*.log >&2; }
exit $fail
