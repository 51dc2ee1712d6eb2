#!/bin/sh
# tests/cluster/etcd_stall.sh - etcd itself stalls past the lease TTL
# while a replicated job trains (docs/coordinator.md, "When etcd
# stalls"). `embstore launch --coordinator etcd://... --server_num 3
# --worker_num 2 --replicas 2` runs `embstore-bench --op step --verify`;
# the one etcd member is SIGSTOPped for twice the TTL, then SIGCONTed.
# Waking, etcd finds every lease past its end and revokes them all at
# once: every node's rank key goes. Nobody died, so nobody may be counted
# dead: each node takes its rank back on a new lease ("took its rank back
# on a new lease"), no failover map is written, and the job goes on as if
# nothing happened. Then the whole machine pauses (etcd and every node
# SIGSTOPped together, then SIGCONTed): the same. Then a server is
# SIGSTOPped for twice the TTL with etcd up: its lease ends and it is dead to the others (a failover map);
# thawed, it must not take its rank back but leave the job (`out of job`,
# exit 1): its slots went on without it. Both workers verify 0 mismatched
# rows, the other servers exit 0. Skipped (77) without etcd(1) or
# python3 (free ports).
#
#   etcd_stall.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench.
set -u

tools=${1:?usage: etcd_stall.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: etcd_stall.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
if ! emb_have_etcd; then
	echo "no etcd or python3: skipped"
	exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-etcd-stall-XXXXXX")
PATH=$tools:$PATH
export PATH
# 4 s leases, etcd stopped for 8 s: past every lease's end whatever
# phase each renewal was in.
EMB_HEARTBEAT_TIMEOUT=4
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_COORDINATOR \
	EMB_JOB EMB_SERVER_MAX
lpid=
epid=
fail=0

cleanup() {
	[ -n "$epid" ] && kill -CONT "$epid" 2>/dev/null
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

emb_start_etcd "$work" est || exit 1

out=$work/launch.txt
# The training runs until the thawed server is out of the job (its
# --stop-file): the stall (8 s), the leases taken back, the pause (8 s),
# the frozen server (8 s) and its failover all happen under it however
# long a loaded machine makes them; the test waits for each step, not
# for a time, and 90 s bounds a test that hangs.
(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
	--replicas 2 --coordinator "etcd://127.0.0.1:$etcd_port" --job est \
	--log-dir "$work/log" -- \
	embstore-bench --op step --verify --rows 20000 --dim 8 --batch 512 \
	--duration 90 --stop-file "$work/stop") >"$out" 2>&1 &
lpid=$!
for _ in $(seq 600); do
	n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
	[ "$n" -ge 2 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
[ "${n:-0}" -ge 2 ] || bad "the workers did not join"
sleep 2
# stall_back PIDS WANT WHAT: stops PIDS for 8 s and thaws them; all 5
# nodes must take their rank back (WANT such lines in all, so far) and
# nobody may be counted dead for WHAT.
stall_back() {
	# shellcheck disable=SC2086  # the pids
	kill -STOP $1
	sleep 8
	# shellcheck disable=SC2086
	kill -CONT $1
	for _ in $(seq 300); do
		n=$(grep -c 'took its rank back on a new lease' "$out")
		[ "$n" -ge "$2" ] && break
		sleep 0.1
	done
	[ "$n" -ge "$2" ] ||
		bad "$((n - $2 + 5)) of 5 nodes took their rank back after $3"
	grep -Eq 'is dead|out of job|left the map' "$out" &&
		bad "a node was counted dead for $3"
}

echo "stopping etcd (pid $epid) for 8 s"
stall_back "$epid" 5 "etcd's stall"

# The whole machine pauses: etcd and every node stopped together for
# 8 s, then thawed together. etcd revokes every lease on waking while no
# node ran: each takes its rank back all the same, and nobody is dead.
pids=$(sed -n 's/^\[launch\] started \(server\|worker\)\.[0-9]*, pid \([0-9]*\)$/\2/p' \
	"$out")
[ "$(echo $pids | wc -w)" -eq 5 ] || bad "not 5 node pids: $pids"
echo "pausing etcd and every node for 8 s"
stall_back "$epid $pids" 10 "the machine's pause"

# A frozen server, etcd up: dead to the others, and it stays dead.
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
	"$out")
rank=$(sed -n "s/^\[server\.$victim\] .* as server \([0-9]*\) of 3$/\1/p" \
	"$out" | head -1)
echo "freezing server.$victim (rank $rank, pid $vpid) for 8 s"
kill -STOP "$vpid"
for _ in $(seq 200); do
	grep -q "server $rank is dead: its slots go to their backups" "$out" &&
		break
	sleep 0.1
done
sleep 2
kill -CONT "$vpid"
# Thawed, it finds its lease gone and leaves; two more seconds of steps
# show it does not come back.
for _ in $(seq 300); do
	grep -q "^\[server\.$victim\] .*out of job" "$out" && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
sleep 2
: >"$work/stop"
wait "$lpid"
st=$?
lpid=

[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q "server $rank is dead: its slots go to their backups" "$out" ||
	bad "no live server failed the frozen server $rank over"
grep -q "^\[server\.$victim\] .*out of job .*its etcd lease expired" "$out" ||
	bad "the thawed server did not leave the job"
# Twice, for etcd's stall and the machine's pause; not again, thawed.
n=$(grep -c "^\[server\.$victim\] .*server $rank: its etcd lease ended while it lived" "$out")
[ "$n" -eq 2 ] || bad "the thawed server took its rank back ($n times in all)"
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
