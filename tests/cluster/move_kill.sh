#!/bin/sh
# tests/cluster/move_kill.sh - either end of a move dies during it
# (docs/replication.md, "Failures during a move"). `embstore launch
# --server_num 3 --server_max 4 --worker_num 2 --replicas 2` runs
# `embstore-bench --op step --verify`, the copies paced (--move-rate) so
# that each chunk's copy takes a second or more:
#
# 1. A newcomer joins at rank 3 and is SIGKILLed while a chunk is copied
#    to it (the target dies): its slots fail over to their other copies
#    and no slot is lost.
# 2. A second newcomer takes the dead rank, is filled back to R copies and
#    given its share; while its third chunk is copied to it, the server
#    streaming that chunk is SIGKILLed (the source dies; stopped first,
#    and a later chunk's taken if that stream had ended, as a loaded
#    machine may show the move late): the chunk's move starts again from the copies left, and the newcomer still gets
#    its share.
# 3. A third newcomer takes the source's rank and is filled with its
#    slots.
#
# Then `embstore stat --sched` shows 4 live servers and no slot lost, and
# both workers exit 0 with 0 mismatched rows: no acknowledged write is
# lost to a death mid-move. Every step waits for its log line, so a loaded
# machine only makes it slower.
#
#   move_kill.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: move_kill.sh TOOLS_DIR}
moves_setup "$tools" movekill
EMB_HEARTBEAT_TIMEOUT=3
# A join moves about 20,000 rows of 40 bytes (a quarter of the copies)
# in 8 chunks: at 64 kB/s each chunk's copy ahead takes about 1.5 s, the
# time the kill of a copier mid-copy has to see the chunk's move and stop
# the servers (moves_kill_copier; 0.15 to 0.3 s beside two CPU hogs, where
# 0.5 s chunks at 200 kB/s were all missed once); the moves still end
# well within the training.
EMB_MOVE_RATE=64000
# A replacement waits while another new server is filled or moved to
# (one at a time), registering again until this timeout.
EMB_CLUSTER_TIMEOUT=150
export EMB_HEARTBEAT_TIMEOUT EMB_MOVE_RATE EMB_CLUSTER_TIMEOUT
pids=

# newcomer NAME: an embstore-server started against the scheduler, its
# log in $work/NAME.txt; its pid in $newpid (and in $pids for the trap).
newcomer() {
	EMB_ROLE=server EMB_SCHED_HOST=${sched%:*} \
		EMB_SCHED_PORT=${sched##*:} \
		embstore-server --listen 127.0.0.1:0 >"$work/$1.txt" 2>&1 &
	newpid=$!
	pids="$pids $newpid"
}

# first_move_to RANK N: waits for the Nth "slots a-b move from server F to
# server RANK ..., copied ahead by server P" line; sets from and by.
first_move_to() {
	moves_wait_count "slots [0-9]*-[0-9]* move from server [0-9]* to server $1 " "$2" ||
		return 1
	_l=$(grep "slots [0-9]*-[0-9]* move from server [0-9]* to server $1 " \
		"$out" | sed -n "$2p")
	from=$(echo "$_l" | sed -n 's/.* move from server \([0-9]*\) to .*/\1/p')
	by=$(echo "$_l" | sed -n 's/.*copied ahead by server \([0-9]*\);.*/\1/p')
	[ -n "$from" ] && [ -n "$by" ]
}

# pid_of RANK: the pid of the server that holds RANK now (the last to be
# assigned it, join it or replace at it).
pid_of() {
	sed -n "s/.*assigned server rank $1 to .* (pid \([0-9]*\)).*/\1/p; s/.*server $1 ([^,]*, pid \([0-9]*\)) \(joins\|replaces\).*/\1/p" \
		"$out" | tail -1
}

kill_trap() {
	for p in $pids; do kill -KILL "$p" 2>/dev/null; done
	moves_cleanup
}
trap kill_trap EXIT

moves_launch 150 --server_max 4
[ -n "$sched" ] || bad "no scheduler address"
sleep 1

# 1. The target dies: a newcomer at rank 3, killed during its first move.
newcomer new1
moves_wait 'server 3 (.*) joins at a free rank' ||
	bad "the first newcomer did not join at rank 3"
first_move_to 3 1 || bad "no move to the first newcomer"
kill -KILL "$newpid" 2>/dev/null || bad "the first newcomer was gone"
moves_wait 'map epoch [0-9]*: server 3 removed' ||
	bad "the newcomer killed mid-move was not failed over"
grep -q 'lost every holder' "$out" && bad "a slot lost every holder"

# 2. The source dies: a second newcomer takes rank 3, is filled, then the
# server streaming its third chunk is killed during the copy. Not the
# first: that one begins as the fill ends, and a write in flight just
# then to a server that dies, whose other copy went to the server being
# filled, may fail with EMB_ENODEAD (docs/coordinator.md, "Limits"); a
# test of a source dying mid-move need not wait on that.
c=$(grep -c 'slots [0-9]*-[0-9]* move from server [0-9]* to server 3 ' "$out")
newcomer new2
moves_wait 'server 3 (.*) \(joins at a free rank\|replaces a dead server\)' ||
	bad "the second newcomer did not take rank 3"
# The copier of its third chunk, or of a later one if that one's stream
# ended before the copier could be stopped.
move_wait() { first_move_to 3 "$1"; }
move_line() {
	grep 'slots [0-9]*-[0-9]* move from server [0-9]* to server 3 ' "$out" |
		sed -n "$1p"
}
rank_pid() { pid_of "$1"; }
moves_kill_copier $((c + 3)) $((c + 8)) || bad "$moves_why"
moves_wait "map epoch [0-9]*: server $victim removed" ||
	bad "the source killed mid-move was not failed over"

# 3. A third newcomer takes the source's rank and is filled with its
# slots; the second one still gets its share.
newcomer new3
moves_wait "server $victim (.*) replaces a dead server" 900 ||
	bad "the third newcomer did not replace server $victim"
moves_wait "server $victim is a full replica" 900 ||
	bad "server $victim's replacement was not filled"
moves_wait 'server 3 has its share' 900 ||
	bad "the second newcomer never got its share"
moves_under_load "moves"
grep -q 'lost every holder' "$out" && bad "a slot lost every holder"

# Every server live, every slot with its copies.
ok=
for _ in $(seq 100); do
	embstore stat --sched "$sched" --interval 0.1 >"$work/stat.txt" 2>&1
	[ "$(grep -c '^[^ ]*  *live ' "$work/stat.txt")" -eq 4 ] &&
		grep -q ' 0 lost slots' "$work/stat.txt" &&
		! grep -q 'filling' "$work/stat.txt" && ok=1 && break
	sleep 0.2
done
[ -n "$ok" ] || bad "the job is not whole after the moves: $(cat "$work/stat.txt")"

moves_stop
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: .* 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified 0 mismatched"

if [ "$fail" -ne 0 ]; then
	cat "$out"
	for f in new1 new2 new3; do
		echo "== $f"
		cat "$work/$f.txt" 2>/dev/null
	done
	exit 1
fi
echo "ok: a newcomer killed mid-move (target) and server $victim killed" \
	"while streaming a chunk (source): every slot kept its copies, the" \
	"moves finished, 2 of 2 workers clean"
