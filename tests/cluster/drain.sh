#!/bin/sh
# tests/cluster/drain.sh - draining a server of a running job
# (docs/replication.md, "Moving slots"): `embstore launch --server_num 3
# --worker_num 2 --replicas 2` runs `embstore-bench --op step --verify`;
# `embstore scale --remove 0` while the workers train moves server 0's
# slots to the other two, after which server 0 exits 0 by itself, before
# the workers end. Then a new `embstore-server`, started with the command
# `embstore scale --add 1` prints (refused while no rank is free), takes
# the free rank and is given its share of the slots by
# the same moves. Every worker must exit 0 with 0 mismatched rows, so no
# acknowledged update was lost in a move either way. A rank that does not
# exist, and a drain that would leave fewer servers than copies, are
# refused with the scheduler's reason.
#
#   drain.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: drain.sh TOOLS_DIR}
tools=$(cd "$tools" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-drain-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=2
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

moves_launch 16
[ -n "$sched" ] || bad "no scheduler address"
sleep 1

# Refusals: no such rank; then (below) too few servers left for R = 2.
embstore scale --sched "$sched" --remove 7 >"$work/bad.txt" 2>&1 &&
	bad "draining a rank the job does not have succeeded"
grep -q 'no server rank 7' "$work/bad.txt" ||
	bad "no reason for refusing rank 7: $(cat "$work/bad.txt")"

embstore scale --sched "$sched" --add 1 >"$work/add0.txt" 2>&1 &&
	bad "scale --add found a free rank in a full job"
grep -q 'the job has 0 free ranks for 1 server' "$work/add0.txt" ||
	bad "no reason for refusing --add: $(cat "$work/add0.txt")"
embstore scale --sched "$sched" --remove 0 >"$work/scale.txt" 2>&1 ||
	bad "embstore scale --remove 0 failed: $(cat "$work/scale.txt")"
grep -q 'server 0 drains' "$work/scale.txt" || bad "scale printed no drain"
for _ in $(seq 300); do
	grep -q 'server 0 (.*) drained' "$out" && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
grep -q 'server 0 (.*) drained' "$out" || bad "server 0 was not drained"
embstore scale --sched "$sched" --remove 1 >"$work/bad2.txt" 2>&1 &&
	bad "draining one of the last two servers of an R = 2 job succeeded"
grep -q '1 server would stay for 2 copies' "$work/bad2.txt" ||
	bad "no reason for refusing the drain: $(cat "$work/bad2.txt")"

# Rank 0's process (the scheduler's log names its pid) exits 0 by itself,
# while the workers still train.
pid0=$(moves_pid 0)
[ -n "$pid0" ] || bad "no pid for server rank 0"
moves_left "$pid0"

# A newcomer started as `scale --add 1` says takes the free rank and is
# given a third of the copies.
embstore scale --sched "$sched" --add 1 >"$work/add.txt" 2>&1 ||
	bad "scale --add 1 failed: $(cat "$work/add.txt")"
cmd=$(grep '^EMB_ROLE=server ' "$work/add.txt")
[ -n "$cmd" ] || bad "scale --add printed no command"
eval "$cmd" >"$work/new.txt" 2>&1 &
npid=$!
moves_wait_share 0
[ -n "$share" ] && [ "$share" -ge 2700 ] ||
	bad "the newcomer was not given its share (${share:-none} slots)"
moves_under_load join

moves_end
grep -q 'slots [0-9]*-[0-9]* move from server 0' "$out" ||
	bad "no move logged"

if [ "$fail" -ne 0 ]; then
	cat "$out"
	exit 1
fi
echo "ok: server 0 drained and exited 0 mid-run, a newcomer got $share" \
	"slots, 2 of 2 workers clean"
