#!/bin/sh
# tests/cluster/drain_restart.sh - drains and joins outlive the scheduler
# (docs/replication.md, "Moving slots"): `embstore launch --server_num 3
# --worker_num 2 --replicas 2` runs `embstore-bench --op step --verify`
# with the servers' copies paced (--move-rate) so that each move takes
# seconds. The scheduler is SIGKILLed during the drain of server 0, launch
# starts it again, and the restarted scheduler takes the drain up from its
# state file: the chunk starts again, the rest follow, and server 0 exits
# 0 by itself while the workers train. Then a newcomer takes the free rank
# and the scheduler is SIGKILLed again while the newcomer is given its
# share: the second restart takes the join up, and the newcomer gets its
# share. Every worker must exit 0 with 0 mismatched.
#
#   drain_restart.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: drain_restart.sh TOOLS_DIR}
moves_setup "$tools" drainrestart
# Every step waits for its log line, so a loaded machine only delays it.
EMB_HEARTBEAT_TIMEOUT=3
# About 1 MB of rows leave server 0: at 200 kB/s its drain takes seconds,
# so the scheduler dies during it, not after.
EMB_MOVE_RATE=200000
export EMB_HEARTBEAT_TIMEOUT EMB_MOVE_RATE

moves_launch 90
[ -n "$sched" ] || bad "no scheduler address"
sleep 1
pid0=$(moves_pid 0)
[ -n "$pid0" ] || bad "no pid for server rank 0"

embstore scale --sched "$sched" --remove 0 >"$work/scale.txt" 2>&1 ||
	bad "embstore scale --remove 0 failed: $(cat "$work/scale.txt")"
moves_wait 'slots [0-9]*-[0-9]* move from server 0' ||
	bad "the drain moved nothing"
grep -q 'server 0 (.*) drained' "$out" &&
	bad "the drain ended before the scheduler died: pace it more"

# kill_sched N WHAT: SIGKILLs the scheduler; launch restarts it (its Nth
# restart), and it takes the move up.
kill_sched() {
	spid=$(sed -n 's/^\[launch\] started scheduler, pid \([0-9]*\)$/\1/p' \
		"$out" | tail -1)
	echo "killing the scheduler (pid $spid) during the $2"
	[ -n "$spid" ] && kill -KILL "$spid" || bad "no scheduler to kill"
	moves_wait "restarting the scheduler .*(restart $1)" ||
		bad "launch did not restart the scheduler ($2)"
	moves_wait_count 'drains and joins asked for go on' "$1" ||
		bad "the restarted scheduler forgot the $2"
}

kill_sched 1 drain
# Drained after the restart, by the restarted scheduler.
moves_wait 'server 0 (.*) drained' 900 || bad "server 0 was not drained"
awk '/taking up cluster/ { t = NR }
     /server 0 \(.*\) drained/ && t { d = NR }
     END { exit !d }' "$out" ||
	bad "the drain did not end after the restart"

# Rank 0's process exits 0 by itself, while the workers still train.
moves_left "$pid0"

# A newcomer takes the free rank; the scheduler dies while it is given
# its share.
moves_add_by_hand
moves_wait 'join of server 0: 0 slots moved' ||
	bad "the newcomer was given nothing"
grep -q 'server 0 has its share' "$out" &&
	bad "the join ended before the scheduler died: pace it more"
kill_sched 2 join
moves_wait_share 0
[ -n "$share" ] && [ "$share" -ge 2700 ] ||
	bad "the newcomer was not given its share (${share:-none} slots)"
moves_under_load join

moves_end

if [ "$fail" -ne 0 ]; then
	cat "$out"
	if [ -s "$work/new.txt" ]; then
		echo "--- the newcomer's log:"
		cat "$work/new.txt"
	fi
	exit 1
fi
echo "ok: the drain and the join went on after the scheduler's restarts;" \
	"server 0 exited 0 mid-run, the newcomer got $share slots, 2 of 2" \
	"workers clean"
