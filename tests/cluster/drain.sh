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
# With `launch`, the newcomer is started by the job's launch instead,
# asked with `embstore scale --add 1 --launch LOG_DIR/launch.ctl`: the
# job has no --server_max, so only the drained rank is free. Before the
# drain, a server launch starts on a bare `add 1` line (no rank free) is
# refused by the scheduler and exits 1 without ending the job.
#
# With `tier` after the mode, every server keeps its rows mostly on the
# device tier (EMB_MEM_LIMIT 5M, EMB_TIER_DIR): the moves walk tiered
# tables by slot and by their marks.
#
#   drain.sh TOOLS_DIR [hand|launch] [tier]
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: drain.sh TOOLS_DIR [hand|launch] [tier]}
mode=${2:-hand}
tier=${3:-}
moves_setup "$tools" drain
if [ "$tier" = tier ]; then
	mkdir "$work/tier"
	EMB_MEM_LIMIT=5M
	EMB_TIER_DIR=$work/tier
	export EMB_MEM_LIMIT EMB_TIER_DIR
fi

# The workers train through the drain and the join; on the device tier
# each move reads its rows from it, slower, so they train longer.
if [ "$tier" = tier ]; then
	moves_launch 90
else
	moves_launch 60
fi
[ -n "$sched" ] || bad "no scheduler address"
if [ "$tier" = tier ]; then
	big=0
	for _ in $(seq 100); do
		big=$(find "$work/tier" -name '*.tier' -size +256k | wc -l)
		[ "$big" -ge 3 ] && break
		sleep 0.1
	done
	[ "$big" -ge 3 ] || bad "$big of 3 servers hold rows on the device"
fi
# A replicated job without spare ranks still reads launch.ctl.
ctl=$(sed -n 's/^\[launch\] no rank to spare; .* --launch \([^ ]*\) starts servers here$/\1/p' \
	"$out")
[ "$ctl" = "$work/log/launch.ctl" ] && [ -p "$ctl" ] ||
	bad "launch named no control FIFO (${ctl:-none})"
if [ "$mode" = launch ]; then
	# No rank is free: the server started on a bare "add 1" (scale
	# would have refused) is turned away and exits 1; the job goes on.
	# (A FIFO nobody reads would block the write: bounded.)
	# shellcheck disable=SC2016  # $1 is the inner shell's
	timeout 10 sh -c 'echo "add 1" >"$1"' sh "$ctl" ||
		bad "could not write 'add 1' to $ctl"
	moves_wait '^\[launch\] server\.3 exited with 1$' 300 ||
		bad "a server started with no free rank did not exit 1"
	grep -q '^\[server\.3\] .*cluster full' "$out" ||
		bad "server.3 gave no reason for its refusal"
	grep -q '^\[launch\] stopping every process' "$out" &&
		bad "a refused server ended the job"
fi

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

# A newcomer started as `scale --add 1` says, or by launch as `scale --add
# 1 --launch` asks, takes the free rank and is given a third of the copies.
if [ "$mode" = launch ]; then
	embstore scale --sched "$sched" --add 1 --launch "$ctl" \
		>"$work/add.txt" 2>&1 ||
		bad "scale --add 1 --launch failed: $(cat "$work/add.txt")"
	grep -q '^# asked embstore launch' "$work/add.txt" ||
		bad "scale --add --launch said: $(cat "$work/add.txt")"
	moves_wait '^\[launch\] started server\.4, pid' 100 ||
		bad "launch did not start the server asked for"
	npid4=$(sed -n 's/^\[launch\] started server\.4, pid \([0-9]*\)$/\1/p' \
		"$out")
	moves_wait "server 0 (.*pid $npid4) joins at a free rank" 300 ||
		bad "server.4 did not take the free rank 0"
else
	moves_add_by_hand
fi
moves_wait_share 0
[ -n "$share" ] && [ "$share" -ge 2700 ] ||
	bad "the newcomer was not given its share (${share:-none} slots)"
moves_under_load join

moves_end
grep -q 'slots [0-9]*-[0-9]* move from server 0' "$out" ||
	bad "no move logged"
[ "$mode" = launch ] && ! grep -q '^\[launch\] server\.4 exited with 0$' "$out" &&
	bad "the newcomer launch started did not exit 0 at the end"

if [ "$fail" -ne 0 ]; then
	cat "$out"
	exit 1
fi
echo "ok: server 0 drained and exited 0 mid-run, a newcomer ($mode) got" \
	"$share slots, 2 of 2 workers clean"
