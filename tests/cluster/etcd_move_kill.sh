#!/bin/sh
# tests/cluster/etcd_move_kill.sh - move_kill.sh with the job kept in etcd
# (docs/coordinator.md, "Joins and drains"): either end of a move dies
# during it, and the leader, stepping the moves in etcd, falls back to the
# copies left and moves again. `embstore launch --coordinator ...
# --server_num 3 --server_max 4 --worker_num 2 --replicas 2` runs
# `embstore-bench --op step --verify`, the copies paced (--move-rate) so
# that each chunk's copy takes a second or more:
#
# 1. A newcomer joins at rank 3 and is SIGKILLed while its second chunk is
#    copied to it (the target dies, holding the first): its lease ends, it
#    is failed over, no slot is lost.
# 2. A second newcomer takes the dead rank 3, is filled back to R copies
#    and given its share; while its third chunk is copied to it, the
#    server copying it is SIGKILLed (the source dies; stopped first, and
#    a later chunk's taken if that stream had ended; it may be the
#    leader, and the next live server then goes on from the keys in
#    etcd).
# 3. A third newcomer takes the source's rank. The slots the death left
#    short of copies go to whichever newcomer the leader fills first (the
#    second, before its share, or the third); both end with their share.
#
# Both workers exit 0 with 0 mismatched rows, the launch and the
# newcomers exit 0, and no slot lost every copy. Every step waits for its
# log line, so a loaded machine only makes it slower. Skipped (77) without
# etcd(1) or python3.
#
#   etcd_move_kill.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: etcd_move_kill.sh TOOLS_DIR}
if ! emb_have_etcd; then
	echo "no etcd or python3: skipped"
	exit 77
fi
moves_setup "$tools" etcd-movekill
# 6 s leases: a death is seen in seconds, and a CPU hog beside the test
# ends none.
EMB_HEARTBEAT_TIMEOUT=6
# A join moves about 20,000 rows of 40 bytes (a quarter of the copies)
# in 8 chunks: at 64 kB/s each chunk's copy ahead takes about 1.5 s, the
# time the kill of a copier mid-copy has to see the chunk's move and stop
# the servers (moves_kill_copier; 0.15 to 0.3 s beside two CPU hogs, where
# 0.5 s chunks at 200 kB/s were all missed once); the moves still end
# well within the training.
EMB_MOVE_RATE=64000
EMB_CLUSTER_TIMEOUT=150
export EMB_HEARTBEAT_TIMEOUT EMB_MOVE_RATE EMB_CLUSTER_TIMEOUT
unset EMB_COORDINATOR EMB_JOB EMB_SERVER_NUM EMB_WORKER_NUM
pids=
epid=

kill_trap() {
	for p in $pids; do kill -KILL "$p" 2>/dev/null; done
	[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
	moves_cleanup
}
trap kill_trap EXIT

emb_start_etcd "$work" emk || exit 1
ep=etcd://127.0.0.1:$etcd_port

# newcomer NAME: an embstore-server started against the job, its log in
# $work/NAME.txt; its pid in $newpid (and in $pids for the trap).
newcomer() {
	EMB_ROLE=server EMB_COORDINATOR=$ep EMB_JOB=emk \
		embstore-server --listen 127.0.0.1:0 >"$work/$1.txt" 2>&1 &
	newpid=$!
	pids="$pids $newpid"
}

# logs: the launch's output and every newcomer's (a newcomer at rank 0
# leads, and logs the steps there).
logs() {
	cat "$out" "$work"/new*.txt 2>/dev/null
}

# wait_logs PATTERN [N [TENTHS]]: until N lines of all the logs match.
wait_logs() {
	for _ in $(seq "${3:-900}"); do
		[ "$(logs | grep -c "$1")" -ge "${2:-1}" ] && return 0
		kill -0 "$lpid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# move_to RANK N: waits for the Nth "slots a-b move from server F to
# server RANK, copied ahead by server P" line; sets by to P.
move_to() {
	_p="slots [0-9]*-[0-9]* move from server [0-9]* to server $1, copied"
	wait_logs "$_p" "$2" || return 1
	by=$(logs | grep "$_p" | sed -n "$2p" |
		sed -n 's/.*copied ahead by server \([0-9]*\);.*/\1/p')
	[ -n "$by" ]
}

out=$work/launch.txt
(cd "$work" && exec embstore launch --coordinator "$ep" --job emk \
	--server_num 3 --server_max 4 --worker_num 2 --replicas 2 \
	--log-dir "$work/log" -- \
	embstore-bench --op step --verify --rows 40000 --dim 8 --batch 512 \
	--duration 120 --stop-file "$work/stop") >"$out" 2>&1 &
lpid=$!
wait_logs 'worker\.[01]\] .*worker [01] of 2 joined' 2 600 ||
	bad "the workers did not join"
sleep 1

# 1. The target dies: a newcomer at rank 3, killed while its second
# chunk is copied to it.
newcomer new1
pid1=$newpid
wait_logs 'server 3 (.*) joins at a free rank' ||
	bad "the first newcomer did not join at rank 3"
move_to 3 2 || bad "no second move to the first newcomer"
kill -KILL "$newpid" 2>/dev/null || bad "the first newcomer was gone"
wait_logs 'server [0-9]: server 3 is dead: its slots go to their backups' ||
	bad "the newcomer killed mid-move was not failed over"

# 2. The source dies: a second newcomer takes rank 3, is filled, then the
# server copying its third chunk to it is killed (not the first, which
# begins as the fill ends: move_kill.sh says why).
c=$(logs | grep -c 'slots [0-9]*-[0-9]* move from server [0-9]* to server 3, copied')
# Each move to the dead newcomer fails twice (its copy ahead, then its
# fenced stream), once each per map that asks: the source does not begin
# a failed stream again before the leader's next map (a stream begun
# again at once failed and was reported to etcd dozens of times a
# second until that map came).
a1=$(sed -n 's/.* listening on \(127\.0\.0\.1:[0-9]*\) .*/\1/p' "$work/new1.txt")
f1=$(logs | grep -c "fill of slots [0-9]*-[0-9]* to $a1 failed")
[ -n "$a1" ] && [ "$f1" -le $((3 * c)) ] ||
	bad "$f1 failed streams to the dead newcomer (${a1:-no address}) for $c moves"
newcomer new2
wait_logs "takes dead server 3's place" ||
	bad "the second newcomer did not take rank 3"
# Stopped first, and killed only if its chunk's stream had not ended (a
# loaded machine shows the move's line late); else a later chunk's copier.
move_wait() { move_to 3 "$1"; }
move_line() {
	logs | grep "slots [0-9]*-[0-9]* move from server [0-9]* to server 3, copied" |
		sed -n "$1p"
}
rank_pid() {
	sed -n "s/^\[launch\] started $2, pid \([0-9]*\)\$/\1/p" "$out"
}
moves_kill_copier $((c + 3)) $((c + 8)) || bad "$moves_why"
wait_logs "server [0-9]: server $victim is dead: its slots go to their backups" ||
	bad "the source killed mid-move was not failed over"

# 3. A third newcomer takes the source's rank and is filled with its
# slots; the second one still gets its share.
newcomer new3
wait_logs "takes dead server $victim's place" ||
	bad "the third newcomer did not take rank $victim"
# The slots the source's death left short go to whichever newcomer the
# leader fills first: the second one, taking them before its share, or
# the third, filled as a replacement and then given its share.
wait_logs "server $victim \(is a full replica\|has its share\)" ||
	bad "server $victim's replacement was not filled"
wait_logs 'server 3 has its share' ||
	bad "the second newcomer never got its share"
moves_under_load "moves"
logs | grep -q 'have no live holder' && bad "a slot lost every holder"

# The launch exits 0 and both workers verify 0 mismatched rows.
moves_end
# The job over, the newcomers alive leave as the others do (new1 was
# killed).
for p in $pids; do
	[ "$p" = "$pid1" ] && continue
	for _ in $(seq 300); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	wait "$p" || bad "a newcomer (pid $p) exited $? at the job's end"
done

if [ "$fail" -ne 0 ]; then
	cat "$out"
	for f in new1 new2 new3; do
		echo "== $f"
		cat "$work/$f.txt" 2>/dev/null
	done
	exit 1
fi
echo "ok: etcd: a newcomer killed mid-move (target) and server $victim" \
	"killed while copying a chunk (source): every slot kept its copies," \
	"the moves finished, 2 of 2 workers clean"
