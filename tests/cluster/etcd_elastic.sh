#!/bin/sh
# tests/cluster/etcd_elastic.sh - elastic.sh's job kept in etcd, with no
# scheduler (docs/coordinator.md, "Joins and drains"): `embstore launch
# --coordinator etcd://... --server_num 2 --server_max 3 --worker_num 2
# --replicas R` runs `embstore-bench --op step --verify`. A third
# `embstore-server`, started as `embstore scale --coordinator ... --add 1`
# prints it (R = 2) or by launch on `--add 1 --launch` (R = 1), takes the
# free rank and is given a third of the copies by live moves, which the
# leader (the live server of lowest rank) steps in etcd: copy ahead,
# fence, stream, hand over. Then rank 0 is drained, by
# SIGTERM (R = 2) or `embstore scale --coordinator ... --remove 0` (R = 1),
# and exits 0 once it holds nothing; nobody may count it dead. Both
# workers must exit 0 with 0 mismatched rows. With BOUND the servers run
# with --move-bound BOUND: the workers report their calls' p99 during the
# join (PACE), and the servers' /metrics must count the reports and, as a
# BOUND under 1 makes every report over it, the pace cut. Skipped (77)
# without etcd(1) or python3 (free ports).
#
#   etcd_elastic.sh TOOLS_DIR [R [BOUND]]
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: etcd_elastic.sh TOOLS_DIR [R]}
R=${2:-2}
BOUND=${3:-0}
if ! emb_have_etcd; then
	echo "no etcd or python3: skipped"
	exit 77
fi
moves_setup "$tools" etcd-elastic
# 6 s leases: etcd judges them by its own clock, and a CPU hog beside the
# test must not end one (a stall of etcd itself is survived either way:
# etcd_stall.sh).
EMB_HEARTBEAT_TIMEOUT=6
export EMB_HEARTBEAT_TIMEOUT
unset EMB_COORDINATOR EMB_JOB EMB_SERVER_NUM EMB_WORKER_NUM
epid=
# etcd first: moves_cleanup waits for every child.
trap '[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null; moves_cleanup' EXIT
# A third of the copies: slots, and rows of a 40000-row table.
want_slots=$((R * 4096 / 3 - 2))
want_rows=$((R * 40000 / 3 * 3 / 4))

emb_start_etcd "$work" eel || exit 1
ep=etcd://127.0.0.1:$etcd_port

out=$work/launch.txt
# The training runs until moves_end (its --stop-file): the join and the
# drain both happen under it however long they take (under ASan the
# drained server leaves, a lease after its drain, some 25 s in; on a
# loaded machine the join alone took 19 s under ASan and the drain was
# still under way at 36 s), and the test waits for each step, not for a
# time; 90 s bounds a test that hangs.
# Each server serves /metrics; the copies are paced (500 kB/s: the join's
# million bytes take two seconds or more) so that the leader's /metrics
# shows the join under way.
(cd "$work" && EMB_METRICS_LISTEN=127.0.0.1:0 EMB_MOVE_RATE=500000 \
	EMB_MOVE_BOUND=$BOUND exec embstore launch --coordinator "$ep" --job eel \
	--server_num 2 --server_max 3 --worker_num 2 --replicas "$R" \
	--log-dir "$work/log" -- \
	embstore-bench --op step --verify --rows 40000 --dim 8 --batch 512 \
	--duration 90 --stop-file "$work/stop") >"$out" 2>&1 &
lpid=$!
for _ in $(seq 600); do
	n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out" 2>/dev/null)
	[ "${n:-0}" -ge 2 ] && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
[ "$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")" -ge 2 ] ||
	bad "the workers did not join"
grep -q "^\[launch\] 1 rank to spare: embstore scale --coordinator $ep --job eel --add N --launch" \
	"$out" || bad "launch did not say how to add a server"
sleep 1
# Paced by the workers' reports: each worker first learns its calls' p99
# with no move under way (src/worker/pace.c); a report needs it.
[ "$BOUND" != 0 ] && moves_pace_wait

# Join. R = 2: the command `embstore scale --add 1` prints, as an
# operator runs it. R = 1: launch starts it, asked through its FIFO.
if [ "$R" -eq 1 ]; then
	embstore scale --coordinator "$ep" --job eel --add 1 \
		--launch "$work/log/launch.ctl" >"$work/add.txt" 2>&1 ||
		bad "scale --add 1 --launch failed: $(cat "$work/add.txt")"
	for _ in $(seq 100); do
		grep -q '^\[launch\] started server\.2, pid' "$out" && break
		sleep 0.1
	done
	grep -q '^\[launch\] started server\.2, pid' "$out" ||
		bad "launch did not start the server asked for"
	newlog=$out
else
	embstore scale --coordinator "$ep" --job eel --add 1 \
		>"$work/add.txt" 2>&1 ||
		bad "scale --add 1 failed: $(cat "$work/add.txt")"
	cmd=$(grep '^EMB_ROLE=server ' "$work/add.txt")
	[ -n "$cmd" ] ||
		bad "scale --add printed no command: $(cat "$work/add.txt")"
	eval "$cmd" >"$work/new.txt" 2>&1 &
	npid=$!
	newlog=$work/new.txt
fi
# A second one finds no rank free.
embstore scale --coordinator "$ep" --job eel --add 2 >"$work/add2.txt" 2>&1 &&
	bad "scale --add 2 with one rank free succeeded"
grep -q 'free rank' "$work/add2.txt" ||
	bad "no reason for --add 2: $(cat "$work/add2.txt")"

# metrics_urls: the /metrics of the servers launch started.
metrics_urls() {
	sed -n 's/^\[server\.[0-9]*\] .*metrics on \(http:[^ ,]*\).*/\1/p' \
		"$out"
}
# The leader logs in the launch's output (rank 0 or 1 leads), and its
# /metrics shows the join under way: a job in etcd has no scheduler to
# ask.
seen=
for _ in $(seq 900); do
	for u in $(metrics_urls); do
		curl -fsS "$u" 2>/dev/null >"$work/m.txt" || continue
		grep -q '^embstore_cluster_move_slots_left [1-9]' "$work/m.txt" &&
			grep -q '^embstore_cluster_move_bytes_streamed ' \
				"$work/m.txt" && seen=$u
	done
	grep -q 'server 2 has its share' "$out" && break
	kill -0 "$lpid" 2>/dev/null || break
	sleep 0.1
done
[ -n "$seen" ] || bad "no server's /metrics showed the join under way"
# Done, the leader alone shows the gauges, and nothing left to move.
n=0
for u in $(metrics_urls); do
	curl -fsS "$u" >"$work/m.txt" 2>&1 || bad "no /metrics at $u"
	grep -q '^embstore_cluster_move_slots_left' "$work/m.txt" || continue
	n=$((n + 1))
	leader=$u
	grep -q '^embstore_cluster_move_slots_left 0$' "$work/m.txt" &&
		grep -q '^embstore_cluster_move_eta_seconds -1$' "$work/m.txt" ||
		bad "the leader's /metrics shows a move left after the join"
done
[ "$n" -eq 1 ] || bad "$n servers' /metrics show the moves, not the leader alone"
# Scraped in a loop, the leader reads the job's keys once a poll of its
# agent, not at every scrape (two ranges each): etcd's own count of ranges
# over 50 scrapes at once (one curl, 10 in parallel: a fraction of a
# second, which the training's time can spare under ASan), less its count
# over as long a time without any.
ranges() {
	curl -fsS "http://127.0.0.1:$etcd_port/metrics" |
		sed -n 's/^etcd_mvcc_range_total //p'
}
set --
for _ in $(seq 50); do
	set -- "$@" -o /dev/null "$leader"
done
t0=$(date +%s%N)
r0=$(ranges)
curl -fsS -Z --parallel-max 10 "$@" || bad "no /metrics at $leader"
r1=$(ranges)
t1=$(date +%s%N)
r2=$(ranges)
sleep "$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", ns / 1e9 }')"
r3=$(ranges)
case "$r0$r1$r2$r3" in
'' | *[!0-9]*)
	bad "etcd's /metrics gave no etcd_mvcc_range_total ($r0 $r1 $r2 $r3)"
	r0=0 r1=0 r2=0 r3=0
	;;
esac
extra=$(((r1 - r0) - (r3 - r2)))
echo "50 scrapes of the leader: $((r1 - r0)) etcd ranges in $(((t1 - t0) / 1000000)) ms; as long without: $((r3 - r2))"
[ "$extra" -lt 50 ] ||
	bad "50 scrapes of the leader cost etcd $extra more ranges than none"
share=$(sed -n 's/.*server 2 has its share: \([0-9]*\) slots.*/\1/p' "$out" |
	head -1)
grep -q 'server 2 (.*) joins at a free rank' "$newlog" ||
	bad "the newcomer did not join at rank 2"
[ -n "$share" ] && [ "$share" -ge "$want_slots" ] ||
	bad "the newcomer was not given its share (${share:-none} slots)"
grep -q 'slots [0-9]*-[0-9]* move from server [01] to server 2, copied ahead' \
	"$out" || bad "no move was copied ahead"
grep -q 'fenced for the last of their move to server 2, streamed' "$out" ||
	bad "no move was fenced"
# The rows it holds: the copies ahead and the fenced streams to it.
rows=$(sed -n 's/.*slots [0-9]*-[0-9]* \(copied ahead\|streamed\) (\([0-9]*\) rows.*/\2/p' \
	"$out" | awk '{ s += $1 } END { print s + 0 }')
[ "$rows" -ge "$want_rows" ] ||
	bad "$rows rows reached the newcomer, not a third of the copies"
# The rows moved away are freed on the servers that gave them, once
# the maps have taken nothing away for 2 s (src/server/replica.c).
for _ in $(seq 300); do
	[ "$(grep -c 'freed [0-9]* rows of slots moved' "$out")" -ge 2 ] && break
	sleep 0.1
done
[ "$(grep -c 'freed [0-9]* rows of slots moved' "$out")" -ge 2 ] ||
	bad "the servers that gave slots away did not free their rows"
moves_under_load join
# Under --move-bound the workers reported during the join, to servers
# that took their moves from etcd, and as BOUND is under 1 every report
# was over it: the sources cut their pace.
[ "$BOUND" != 0 ] && moves_pace_check $(metrics_urls)
# What an observer sees of the job in etcd: every server, the map and
# nothing moving (embstore stat --coordinator; what it shows of a move
# under way is cluster/coord's "joins and drains").
embstore stat --coordinator "$ep" --job eel --interval 0.2 >"$work/stat.txt" 2>&1 ||
	bad "stat --coordinator failed: $(cat "$work/stat.txt")"
grep -q '^moves: none' "$work/stat.txt" ||
	bad "stat --coordinator showed no moves: $(cat "$work/stat.txt")"
# Each server's table; with 2 copies the map too, every server live.
[ "$(grep -c '^127\.0\.0\.1:[0-9]* *bench ' "$work/stat.txt")" -eq 3 ] ||
	bad "stat --coordinator did not show 3 servers' tables: $(cat "$work/stat.txt")"
[ "$R" -eq 1 ] ||
	[ "$(grep -c '^127\.0\.0\.1:[0-9]* *live ' "$work/stat.txt")" -eq 3 ] ||
	bad "stat --coordinator did not show 3 live servers: $(cat "$work/stat.txt")"
embstore stat --coordinator "$ep" --job eel --interval 0.2 --json >"$work/stat.json" 2>&1 ||
	bad "stat --coordinator --json failed: $(cat "$work/stat.json")"
grep -q '"moves":{"kind":"none"' "$work/stat.json" ||
	bad "stat --coordinator --json showed no moves: $(cat "$work/stat.json")"
[ "$(grep -o '"table":"bench"' "$work/stat.json" | wc -l)" -eq 3 ] ||
	bad "stat --coordinator --json did not show 3 servers' tables"
embstore stat --coordinator "$ep" --job nosuchjob >"$work/stat-no.txt" 2>&1 &&
	bad "stat of a job that does not exist succeeded"
grep -q 'job nosuchjob in .*: no such job running' "$work/stat-no.txt" ||
	bad "stat of no job said: $(cat "$work/stat-no.txt")"

# Leave: rank 0 drains and exits 0 while the workers train.
name0=$(sed -n 's/^\[\(server\.[0-9]*\)\] .* as server 0 of 3$/\1/p' "$out" |
	head -1)
pid0=$(sed -n "s/^\[launch\] started $name0, pid \([0-9]*\)\$/\1/p" "$out")
[ -n "$pid0" ] || bad "no server rank 0 to drain"
if [ "$R" -eq 1 ]; then
	embstore scale --coordinator "$ep" --job eel --remove 0 \
		>"$work/rm.txt" 2>&1 ||
		bad "scale --remove 0 failed: $(cat "$work/rm.txt")"
	grep -q '^scale: server 0 drains' "$work/rm.txt" ||
		bad "scale --remove said: $(cat "$work/rm.txt")"
	# A rank with no server is refused, with the reason.
	embstore scale --coordinator "$ep" --job eel --remove 7 \
		>"$work/rm7.txt" 2>&1 && bad "scale --remove 7 succeeded"
	grep -q 'no live server at rank 7' "$work/rm7.txt" ||
		bad "no reason for --remove 7: $(cat "$work/rm7.txt")"
else
	kill -TERM "$pid0" || bad "cannot signal server 0"
fi
moves_left "$pid0"
grep -q 'server 0: drained: it left job' "$out" ||
	bad "server 0 stopped without draining"
grep -q 'server 0 drained' "$out" || bad "the leader did not drain server 0"
grep -q 'server 0 is dead' "$out" "$newlog" &&
	bad "server 0 was counted dead, not drained"

moves_end

if [ "$fail" -ne 0 ]; then
	cat "$out"
	if [ -f "$work/new.txt" ]; then
		echo "--- newcomer (last 60 lines)"
		tail -60 "$work/new.txt"
	fi
	exit 1
fi
echo "ok: R = $R, etcd: a server joined (${share} slots, ${rows} rows) and" \
	"rank 0 left mid-run; 2 of 2 workers clean"
