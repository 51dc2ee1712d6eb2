#!/usr/bin/env bash
# tools/bench-elastic.sh - how fast a live job moves rows, and what the
# moves cost training (docs/benchmarks.md, "Moving slots: migration rate
# and training cost"). One run:
#
#  1. the loopback TCP ceiling: embstore-echo-server and -client, as
#     docs/net-baselines.md runs them (static buffer, then --gather from
#     1M rows), batches of 4096 rows of DIM floats;
#  2. `embstore launch --server_num 2 --server_max 3 --replicas 2` with
#     one worker running `embstore-bench --op step` (Zipf 1.05, batch
#     4096, SGD, --report-interval 1) on a preloaded table of ROWS rows;
#  3. after BEFORE seconds of steps, a third embstore-server joins and is
#     given a third of the copies by live moves (the join);
#  4. then `embstore scale --remove 0` drains rank 0 (the drain).
#
# For each move it prints the rows streamed (the sum of the servers'
# "slots a-b streamed (N rows)" lines), the scheduler's time ("chunks
# moved in X ms", "drained (K chunks in X ms"), rows/s and MB/s (rows x
# DIM x 4 bytes: SGD keeps no optimizer state), and the share of the
# static echo's MB/s; and the worker's step time, the medians over the
# report intervals of their p50 and p99, for the intervals before the
# newcomer starts, while it starts (until it registers: its --pretouch
# runs then), during the join (from its registration), between it and the drain (when the sources free the
# rows they gave away: the sweeps) and during the drain, with the worst
# interval p99; and the sweeps' rows and their longest time.
#
#   flock /var/lock/bigrun.lock tools/bench-elastic.sh           # 10M rows
#   tools/bench-elastic.sh -b build --rows 20000 --before 2     # smoke
#
# Options: -b BUILD (build), --rows N (10000000), --dim N (64), --before S
# (8: seconds of steps before the join), --move-rate SIZE (the servers'
# --move-rate: bytes/s of each copy ahead; default unlimited), --move-bound
# X (the servers' --move-bound: copies ahead paced by the worker's calls'
# p99, at most X times its p99 before; default off), --paused
# (the worker runs no step from the join to the drain's end: the moves'
# rate with the cores to themselves, no step figures during them),
# --pretouch SIZE (every server's --pretouch: SIZE of memory faulted in
# at start, which its tables take first), --keep (keep the work dir).
# An interval without a step (a stall) is counted apart from the medians.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
rows=10000000
dim=64
before=8
keep=
paused=
pretouch=
move_rate=0
move_bound=0
while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	--rows) rows=$2; shift 2 ;;
	--dim) dim=$2; shift 2 ;;
	--before) before=$2; shift 2 ;;
	--move-rate) move_rate=$2; shift 2 ;;
	--move-bound) move_bound=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	--paused) paused=1; shift ;;
	--pretouch) pretouch=$2; shift 2 ;;
	*) echo "usage: bench-elastic.sh [-b BUILD] [--rows N] [--dim N]" \
		"[--before S] [--move-rate SIZE] [--move-bound X] [--paused]" \
		"[--pretouch SIZE] [--keep]" >&2
	   exit 2 ;;
	esac
done
tools=$(cd "$build/tools" && pwd) || exit 2
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=2
EMB_CLUSTER_TIMEOUT=300
EMB_MOVE_RATE=$move_rate
EMB_MOVE_BOUND=$move_bound
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT EMB_MOVE_RATE EMB_MOVE_BOUND
if [ -n "$pretouch" ]; then
	EMB_PRETOUCH=$pretouch
	export EMB_PRETOUCH
else
	unset EMB_PRETOUCH
fi
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN \
	EMB_SERVER_MAX
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-elastic-XXXXXX")
out=$work/launch.txt
new=$work/new.txt
row_bytes=$((dim * 4))
epid= lpid= npid=

cleanup() {
	[ -n "$epid" ] && kill "$epid" 2>/dev/null
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$npid" ] && kill -TERM "$npid" 2>/dev/null
	wait 2>/dev/null
	[ -n "$keep" ] && echo "work dir: $work" >&2
	[ -n "$keep" ] || rm -rf "$work"
}
trap cleanup EXIT

die() {
	echo "bench-elastic: $*" >&2
	# A worker that failed says why (a step past its call deadline).
	grep -h 'worker\.0\] embstore-bench: \|worker\.0 exited' "$out" >&2 \
		2>/dev/null
	tail -20 "$out" >&2 2>/dev/null
	exit 1
}

now() { date +%s.%N; }

# Wait up to $2 seconds for the regex $1 in file $3 (launch output).
# Once a second: the wait runs beside the job it measures, and at ten
# looks a second its grep and sleep processes took a fifth of a core on
# the 2-core hosts of docs/benchmarks.md (perf sched, during a join),
# where the phase before the join, one sleep, took none. A phase's end
# is read from its log line (logged_at), not from when the wait saw it.
wait_for() {
	local i
	for i in $(seq "$2"); do
		grep -q "$1" "${3:-$out}" 2>/dev/null && return 0
		[ -n "$lpid" ] && ! kill -0 "$lpid" 2>/dev/null && break
		sleep 1
	done
	grep -q "$1" "${3:-$out}" 2>/dev/null
}

# When the first line matching $1 was logged (its UTC timestamp, as
# now() gives it); now() if it carries none.
logged_at() {
	local ts
	ts=$(grep -m1 "$1" "$out" |
		sed -n 's/^\[[^]]*\] \([0-9-]*T[0-9:.]*Z\) .*/\1/p')
	[ -n "$ts" ] && date -u -d "$ts" +%s.%N 2>/dev/null || now
}

# Rows moved so far by every server (launch's children and the
# newcomer): the sum of "slots a-b copied ahead (N rows" lines and of
# "slots a-b streamed (N rows)" lines of chunks streamed whole.
streamed() {
	cat "$out" "$new" 2>/dev/null | grep -v 'written since' |
		sed -n 's/.*slots [0-9]*-[0-9]* \(streamed\|copied ahead\) (\([0-9]*\) rows.*/\2/p' |
		awk '{ s += $1 } END { print s + 0 }'
}

# Rows sent again under the fences so far: written since their chunk's
# copy ahead ("streamed (N rows written since the copy ahead").
resent() {
	cat "$out" "$new" 2>/dev/null |
		sed -n 's/.*slots [0-9]*-[0-9]* streamed (\([0-9]*\) rows written since.*/\1/p' |
		awk '{ s += $1 } END { print s + 0 }'
}

# Every fence's length so far, in ms, one a line ("fence on slots a-b
# lifted after N ms", logged by each chunk's source).
fences() {
	cat "$out" "$new" 2>/dev/null |
		sed -n 's/.*fence on slots [0-9]*-[0-9]* lifted after \([0-9]*\) ms.*/\1/p'
}

# Median and longest of the fences from line A + 1 to line B of fences().
fence_fig() { # A B
	fences | sed -n "$(($1 + 1)),$2p" | sort -n | awk '
		{ v[++n] = $1 }
		END {
			if (!n) { print "no fence"; exit }
			m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
			printf "%d fences, median %.0f ms, longest %d ms\n", n, m, v[n]
		}'
}

# 1. The loopback ceiling, as docs/net-baselines.md measures it.
echo_run() { # ARGS-for-server... -- ARGS-for-client...
	local sargs=() cargs=() port
	while [ "$1" != -- ]; do sargs+=("$1"); shift; done
	shift
	cargs=("$@")
	# A fresh log: the last run's "listening on" line would name its
	# port (gone) if read before this server's redirect truncates it.
	rm -f "$work/echo-srv.txt"
	embstore-echo-server --listen 127.0.0.1:0 "${sargs[@]}" \
		>"$work/echo-srv.txt" 2>&1 &
	epid=$!
	wait_for 'listening on' 10 "$work/echo-srv.txt" ||
		die "echo server did not start"
	port=$(sed -n 's/.*listening on [^:]*:\([0-9]*\).*/\1/p' \
		"$work/echo-srv.txt")
	embstore-echo-client --connect "127.0.0.1:$port" "${cargs[@]}" \
		--seconds 3 | sed -n 's/.*MB_per_s=\([0-9.]*\).*/\1/p'
	kill "$epid" 2>/dev/null
	wait "$epid" 2>/dev/null
	epid=
}
echo_static=$(echo_run -- --row-bytes "$row_bytes")
echo_gather=$(echo_run --gather --rows 1000000 --row-bytes "$row_bytes" -- \
	--rows 1000000 --row-bytes "$row_bytes")
[ -n "$echo_static" ] && [ -n "$echo_gather" ] || die "no echo figure"
# Rows land in memory the target never touched: what this machine gives
# fresh pages (first touch, written once), 1 GiB.
py=/usr/bin/python3 # Debian's, which has numpy
[ -x "$py" ] || py=python3
fresh=$("$py" -c 'import time, numpy as np
t = time.perf_counter(); a = np.ones(1 << 28, dtype=np.float32)
print("%.0f" % ((1 << 30) / 1e6 / (time.perf_counter() - t)))' 2>/dev/null)

# 2. The job, one worker stepping with a line per second.
t_launch=$(now)
(cd "$work" && exec embstore launch --server_num 2 --server_max 3 \
	--worker_num 1 --replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op step --rows "$rows" --dim "$dim" --batch 4096 \
	--dist zipf:1.05 --optimizer sgd --duration 3600 \
	--report-interval 1 --pause-file "$work/pause") >"$out" 2>&1 &
lpid=$!
wait_for 'worker\.0\] interval: ' 600 || die "no step interval"
# The timed phase's start on our clock, from its first line (T s in).
t0=$(now)
t1=$(sed -n 's/.*worker\.0\] interval: \([0-9.]*\) s,.*/\1/p' "$out" |
	head -1)
tstart=$(echo "$t0 $t1" | awk '{ printf "%.3f", $1 - $2 }')
preload_s=$(echo "$t_launch $tstart" | awk '{ printf "%.0f", $2 - $1 }')
sched=$(sed -n 's/^\[launch\] scheduler on \([^,]*\),.*/\1/p' "$out" | head -1)
[ -n "$sched" ] || die "no scheduler address"
sleep "$before"

# 3. The join.
[ -n "$paused" ] && : >"$work/pause" && sleep 1
r0=$(streamed)
s0=$(resent)
f0=$(fences | wc -l)
jn=$(now)
EMB_ROLE=server EMB_SCHED_HOST=${sched%:*} EMB_SCHED_PORT=${sched##*:} \
	embstore-server --listen 127.0.0.1:0 >"$new" 2>&1 &
npid=$!
wait_for 'server 2 has its share' 600 || die "the newcomer got no share"
# The join begins when the newcomer registers, after its start (with
# --pretouch, seconds of page faults on the cores training uses): its
# steps are counted apart, neither before nor during the join.
j0=$(logged_at 'server 2 (.*) joins at a free rank')
j1=$(logged_at 'server 2 has its share')
sleep 1
r1=$(streamed)
s1=$(resent)
f1=$(fences | wc -l)
sleep 2
# Both sources free the rows they gave once the maps are quiet
# (docs/replication.md, "Why the sweep waits"), 2 s after the join and
# for 0.7 to 2.3 s at 10M rows. The drain starts after them (or after
# 30 s, a sweep that freed nothing logging no line): a sweep that
# ran into it took a core from its first chunks, and the drain's rate
# swung from 33 to 53 % of the echo with where the sweeps fell.
for i in $(seq 30); do
	[ "$(grep -c ' freed [0-9]* rows of slots moved to other servers' \
		"$out")" -ge 2 ] && break
	sleep 1
done

# 4. The drain.
d0=$(now)
embstore scale --sched "$sched" --remove 0 >"$work/scale.txt" 2>&1 ||
	die "embstore scale --remove 0: $(cat "$work/scale.txt")"
wait_for 'server 0 (.*) drained (' 600 || die "rank 0 did not drain"
d1=$(logged_at 'server 0 (.*) drained (')
sleep 1
r2=$(streamed)
s2=$(resent)
f2=$(fences | wc -l)
rm -f "$work/pause"
sleep 2
kill -INT "$lpid" 2>/dev/null
wait "$lpid" 2>/dev/null
lpid=
kill -TERM "$npid" 2>/dev/null
wait "$npid" 2>/dev/null
npid=

# Every server pretouched, when asked: the three of them.
if [ -n "$pretouch" ]; then
	n=$(cat "$out" "$new" | grep -c 'pretouched [0-9]* MiB')
	[ "$n" -ge 3 ] || die "$n of 3 servers logged their --pretouch"
fi

# The figures.
jline=$(grep 'server 2 has its share' "$out" | head -1)
jms=$(echo "$jline" | sed -n 's/.*chunks* moved in \([0-9]*\) ms.*/\1/p')
jch=$(echo "$jline" | sed -n 's/.*(\([0-9]*\) chunks* moved.*/\1/p')
dline=$(grep 'server 0 (.*) drained (' "$out" | head -1)
dms=$(echo "$dline" | sed -n 's/.*drained (\([0-9]*\) chunks* in \([0-9]*\) ms.*/\2/p')
dch=$(echo "$dline" | sed -n 's/.*drained (\([0-9]*\) chunks* in.*/\1/p')
[ -n "$jms" ] && [ -n "$dms" ] || die "no move times in the scheduler log"
[ $((r1 - r0)) -gt 0 ] && [ $((r2 - r1)) -gt 0 ] ||
	die "no rows streamed by the join ($((r1 - r0))) or the drain ($((r2 - r1)))"

rate() { # NAME ROWS CHUNKS MS
	echo "$2 $3 $4 $row_bytes $echo_static" | awk -v name="$1" '{
		ms = $3 > 0 ? $3 : 1
		r = $1 / (ms / 1e3); mb = r * $4 / 1e6
		printf "%s: %d rows in %d chunks in %d ms: %.0f rows/s, " \
			"%.1f MB/s, %.1f %% of the static echo\n", name, $1, $2,
			$3, r, mb, 100 * mb / $5 }'
}

# Medians over the intervals that overlap [A, B] (seconds into the timed
# phase; B empty = every interval ending before A, the first left out) of
# their p50 and p99, the worst p99, and the intervals without a step.
steps() { # NAME A B
	sed -n 's/.*worker\.0\] interval: \([0-9.]*\) s, \([0-9]*\) batches, p50 \([0-9.]*\) us, p99 \([0-9.]*\) us.*/\1 \2 \3 \4/p' \
		"$out" | awk -v name="$1" -v a="$2" -v b="$3" '
		function med(v, n,   i, j, t) {
			for (i = 2; i <= n; i++)
				for (j = i; j > 1 && v[j - 1] > v[j]; j--) {
					t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
				}
			return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
		}
		{
			if (b == "") { if (NR == 1 || $1 > a) next }
			else if ($1 <= a || $1 - 1 >= b) next
			# An interval without a step is a stall: counted, and
			# kept out of the medians (its p50 and p99 read 0).
			if ($2 == 0) { stalls++; next }
			n++; p50[n] = $3; p99[n] = $4; nb += $2
			if ($4 > worst) worst = $4
		}
		END {
			if (!n && !stalls) { printf "%s: no interval\n", name; exit }
			if (!n) {
				printf "%s: %d intervals, 0 steps, %d stalled " \
					"intervals\n", name, stalls, stalls
				exit
			}
			printf "%s: %d intervals, %d steps, p50 %.0f us, " \
				"p99 %.0f us (worst interval %.0f us), " \
				"%d stalled intervals\n", name, n + stalls, nb,
				med(p50, n), med(p99, n), worst, stalls
		}'
}

rel() { echo "$1 $tstart" | awk '{ printf "%.2f", $1 - $2 }'; }

# Every figure or none: a phase without an interval is a failed run.
figs=$(steps "steps before" "$(rel "$jn")" ""
	steps "steps while the newcomer started" "$(rel "$jn")" "$(rel "$j0")"
	steps "steps during join" "$(rel "$j0")" "$(rel "$j1")"
	[ -z "$paused" ] &&
		steps "steps between (the sweeps)" "$(rel "$j1")" "$(rel "$d0")"
	steps "steps during drain" "$(rel "$d0")" "$(rel "$d1")")
# Paused, the steps during the moves are none: a short move may meet no
# interval line at all; nor may a newcomer's start without --pretouch.
if [ -n "$paused" ]; then
	echo "$figs" | grep -q 'steps before: no interval' && die "$figs"
else
	echo "$figs" | grep -v '^steps while the newcomer started' |
		grep -q 'no interval' && die "$figs"
fi

echo "table: $rows rows, dim $dim, SGD, R = 2 ($row_bytes bytes a row);" \
	"preload and start ${preload_s} s; --move-rate $move_rate;" \
	"--move-bound $move_bound$(
	[ -n "$pretouch" ] && printf '; every server --pretouch %s' "$pretouch"
	[ -n "$paused" ] &&
		printf '; steps paused from the join to the end of the drain')"
echo "echo: static ${echo_static} MB/s, gather ${echo_gather} MB/s" \
	"(loopback, batch 4096); fresh memory ${fresh:-?} MB/s (first touch)"
rate "join 2->3" $((r1 - r0)) "$jch" "$jms"
echo "join fences: $(fence_fig "$f0" "$f1"); $((s1 - s0)) rows sent again under them"
rate "drain 3->2" $((r2 - r1)) "$dch" "$dms"
echo "drain fences: $(fence_fig "$f1" "$f2"); $((s2 - s1)) rows sent again under them"
echo "$figs"
# The sources free the rows they gave away once the maps are quiet
# (docs/replication.md, "Why the sweep waits"): after the join, between
# it and the drain, and after the drain.
sed -n 's/.* freed \([0-9]*\) rows of slots moved to other servers (\([0-9]*\) ms).*/\1 \2/p' \
	"$out" | awk '{ n++; rows += $1; if ($2 > ms) ms = $2 }
	END { printf "sweeps: %d, %d rows freed, longest %d ms\n", n, rows, ms }'
# Under --move-bound the worker says, after each move, how many windows
# it reported and their worst p99 (src/worker/pace.c).
if [ "$move_bound" != 0 ]; then
	sed -n "s/.*the move is over: \(.*\)/pace: \1/p" "$out"
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
