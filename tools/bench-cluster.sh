#!/usr/bin/env bash
# tools/bench-cluster.sh - the control plane against node count: for each
# size, `embstore launch --replicas 2` with S servers and W workers running
# `embstore-bench --op push --verify` on small rows, one server SIGKILLed
# mid-run, and one JSON object per run appended to a results file:
#
#   formation_s   launch start to the last worker's "worker N of W joined"
#                 (ready_s: to the scheduler's "cluster ready"); null
#                 unless all W joined (workers_joined says how many did)
#   failover_s    the SIGKILL to the last worker's "map epoch E from the
#                 scheduler" (E >= 2), null unless all W got it
#                 (workers_new_map); detect_s to the scheduler's
#                 "declared dead", failover_sched_s to its "map epoch E:
#                 server K removed"
#   sched_cpu_pct the scheduler's utime + stime (/proc/PID/stat, every
#                 0.2 s) over its life, as a % of one core
#   sched_bytes   what the scheduler's TCP connections on its port sent
#                 and received (ss -ti: bytes_sent + bytes_received of
#                 each, every second): heartbeats, registrations, maps,
#                 barriers; per second and per node over its life
#                 (sched_bytes_per_s_per_node). /proc/PID/io is no help:
#                 its rchar and wchar count read() and write(), not the
#                 sendmsg() the transport sends with (sched_io_bytes has
#                 them, for the record)
#   steady_cpu_pct, steady_bytes_per_s_per_node  the same from 3 s after
#                 the last join to the kill: heartbeats alone
#   form_cpu_s, form_bytes_per_node  up to the last join
#   failover_bytes_per_node  from the kill to the last worker's new map
#   sched_heartbeats, sched_stall_ms, sched_self_suspicions  the
#                 scheduler's /metrics counters
#                 embstore_cluster_heartbeats_total, _stall_ms_total and
#                 _self_suspicions_total (stall: its loop not running
#                 past its poll wait; self-suspicions: times so many
#                 nodes were silent at once that it let no silence
#                 count), scraped every
#                 2 s (EMB_METRICS_LISTEN=127.0.0.1:0 for the job: the
#                 servers serve theirs too)
#   outcome       ok (launch exited 0, every worker verified 0
#                 mismatched after the kill, and the killed server was
#                 the one node declared dead), failed (after the kill),
#                 failed-before-kill (the cluster did not form, or a
#                 worker failed, before the kill was due), timeout (past
#                 -t), no-kill (the workers were done first: -d too
#                 short); with the exit status, workers clean, nodes
#                 declared dead and workers that lost the scheduler
#
# Times come from the millisecond UTC stamps of the processes' logs
# (<log-dir>/*.log) against this machine's clock at the launch's start and
# at the kill: the scheduler's /metrics has no formation or failover
# timings.
#
#   tools/bench-cluster.sh                          # 10..1000 nodes
#   tools/bench-cluster.sh -n "2+4" -r 1 -d 4       # one tiny run
#   tools/bench-cluster.sh -n "100 250" -l /var/lock/bigrun.lock
#   tools/bench-cluster.sh --summary out/bench/cluster.jsonl
#
# SIZES (-n) are node counts N, each S = max(2, N / 10) servers and
# W = N - S workers (a 100 + 900 job at 1000), or S+W pairs.
# Options: -b BUILD (build), -o FILE (out/bench/cluster.jsonl, appended
# to), -n SIZES ("10 50 100 250 500 1000"), -r REPS for N <= 250 (3),
# -R REPS above (1), -s FIRST repetition number (1), -d SECONDS each
# bench pushes (20), -k SECONDS after every worker joined to the kill (8),
# -t SECONDS a run may take in all before the whole launch is stopped
# (300; SIGTERM, then SIGKILL 30 s later, then every process it started),
# -l LOCKFILE: runs above 200 nodes hold an flock on it, so two big jobs
# never share the machine (-L NODES changes 200), -K keep every run's
# logs (a failed run's are always kept, beside the results file).
# Arguments after -- replace the bench's table options (--rows 100*W,
# at least 10000, --dim 8 --batch 32).
# EMB_CLUSTER_TIMEOUT is 240 s unless set (launch's own default is 60 s):
# a slow formation is measured, not cut short.
# Needs: the build's embstore, embstore-server and embstore-bench; jq,
# timeout, flock, curl, ss.
set -eEuo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
out=$root/out/bench/cluster.jsonl
sizes="10 50 100 250 500 1000"
reps=3
bigreps=1
first=1
dur=20
kdelay=8
tmo=300
lock=
locknodes=200
keep=0
replicas=2
HZ=$(getconf CLK_TCK)

summary() {
	# One line per size: median (min..max) of each figure, and the
	# outcomes of its runs.
	jq -rs '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r($d): if . == null then null
		else (. * $d | round) / $d end;
	def fig($k; $d): map(.[$k] | select(. != null)) as $v |
		if ($v | length) == 0 then "-"
		else "\($v | med | r($d)) (\($v | min | r($d))..\($v | max | r($d)))"
		end;
	(["nodes", "S+W", "runs", "ready_s", "formation_s", "failover_s",
	  "sched_cpu_pct", "steady_cpu_pct", "steady_B/s/node",
	  "form_B/node", "stall_ms", "outcomes"] | @tsv),
	(group_by(.nodes)[] |
	 [.[0].nodes, "\(.[0].servers)+\(.[0].workers)", length,
	  fig("ready_s"; 100), fig("formation_s"; 100),
	  fig("failover_s"; 1000),
	  fig("sched_cpu_pct"; 10), fig("steady_cpu_pct"; 10),
	  fig("steady_bytes_per_s_per_node"; 1),
	  fig("form_bytes_per_node"; 1), fig("sched_stall_ms"; 1),
	  (map(.outcome) | group_by(.) | map("\(.[0]) x\(length)")
	   | join(", "))] | @tsv)' "$1"
}

while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$(cd "$2" && pwd); shift 2 ;;
	-o) out=$2; shift 2 ;;
	-n) sizes=$2; shift 2 ;;
	-r) reps=$2; shift 2 ;;
	-R) bigreps=$2; shift 2 ;;
	-s) first=$2; shift 2 ;;
	-d) dur=$2; shift 2 ;;
	-k) kdelay=$2; shift 2 ;;
	-t) tmo=$2; shift 2 ;;
	-l) lock=$2; shift 2 ;;
	-L) locknodes=$2; shift 2 ;;
	-K) keep=1; shift ;;
	--summary) summary "$2"; exit 0 ;;
	-h | --help) sed -n '2,72s/^# \{0,1\}//p' "$0"; exit 0 ;;
	--) shift; break ;;
	*) echo "bench-cluster: unknown option $1" >&2; exit 2 ;;
	esac
done
bench_args=("$@")

note() { echo "bench-cluster: $*" >&2; }
export EMB_CLUSTER_TIMEOUT=${EMB_CLUSTER_TIMEOUT:-240}
export EMB_METRICS_LISTEN=127.0.0.1:0
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE
for t in jq timeout flock curl ss; do
	command -v $t >/dev/null || { note "needs $t"; exit 1; }
done
for t in embstore embstore-server embstore-bench; do
	[ -x "$build/tools/$t" ] || { note "no $build/tools/$t"; exit 1; }
done
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
# Runs happen in a directory beside the results: every process a run
# starts has its cwd there, which tells them from anyone else's.
work=$(mktemp -d "$(dirname "$out")/bench-cluster.XXXXXX")

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain -- src tools 2>/dev/null)" ]; then
	commit="$commit+dirty"
fi

lpid=     # the timeout(1) around the launch now running
spl=      # the scheduler's samplers: CPU
ssp=      # its connections
scr=      # its /metrics
rd=       # the run's directory

# reap RUNDIR: SIGKILL whatever a run started that is still there (the
# launch reaps its children itself; this is for a launch that was
# SIGKILLed): the pids the launch reported, if their cwd is still RUNDIR.
reap() {
	local p
	[ -f "$1/launch.out" ] || return 0
	for p in $(sed -n 's/^\[launch\] started [a-z]*[.0-9]*, pid \([0-9]*\)$/\1/p' \
		"$1/launch.out"); do
		[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$1" ] &&
			kill -KILL "$p" 2>/dev/null
	done
	return 0
}

# On exit, a run under way is stopped: timeout(1) passes the SIGTERM to
# the launch, which stops its process group; what is left after 10 s is
# SIGKILLed.
cleanup() {
	local p
	for p in $spl $ssp $scr; do
		kill "$p" 2>/dev/null || true
	done
	if [ -n "$lpid" ]; then
		kill -TERM "$lpid" 2>/dev/null || true
		for _ in $(seq 100); do
			kill -0 "$lpid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$lpid" 2>/dev/null || true
	fi
	[ -z "$rd" ] || reap "$rd"
	wait 2>/dev/null || true
	[ "$keep" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'note "line $LINENO: status $?"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
# stamp LINE: the UTC time at the head of a log line, in seconds.
stamp() {
	[ -z "$1" ] || date -u -d "${1%% *}" +%s.%N 2>/dev/null || true
}
# secs FROM TO: TO - FROM, 3 decimals; "null" when either is missing. Log
# stamps are cut to the millisecond: one that seems a little before FROM
# is at it.
secs() {
	if [ -n "$1" ] && [ -n "$2" ]; then
		awk -v a="$1" -v b="$2" 'BEGIN { d = b - a
			if (d < 0 && d > -0.002) d = 0
			printf "%.3f", d }'
	else
		echo null
	fi
}

# sample PID FILE: every 0.2 s while PID lives, "time ticks rchar wchar"
# of PID into FILE (its last line is the total at the end).
sample() {
	local s io r w
	while s=$(<"/proc/$1/stat") && io=$(<"/proc/$1/io"); do
		s=${s##*) }
		# shellcheck disable=SC2086
		set -- "$1" "$2" $s
		r=$(sed -n 's/^rchar: //p' <<<"$io")
		w=$(sed -n 's/^wchar: //p' <<<"$io")
		echo "$(now) $((${14} + ${15})) $r $w" >>"$2"
		sleep 0.2
	done 2>/dev/null
}

# scrape PID LOG FILE: while PID lives, once LOG names its metrics
# address, its counters every 2 s into FILE (the last whole scrape).
scrape() {
	local url= m
	while kill -0 "$1" 2>/dev/null; do
		[ -n "$url" ] || url=$(sed -n \
			's|.*metrics on \(http://[^ ]*/metrics\).*|\1|p' \
			"$2" 2>/dev/null | head -n 1 || true)
		if [ -n "$url" ] && m=$(curl -sf -m 2 "$url" 2>/dev/null); then
			grep -E '^embstore_cluster_(heartbeats_total|scheduler_stall_ms_total|scheduler_self_suspicions_total|map_epoch) ' \
				<<<"$m" >"$3.tmp" && mv "$3.tmp" "$3"
		fi
		sleep 2
	done 2>/dev/null || true
}

# ssample PID PORT FILE: every second while PID lives, one line per TCP
# connection on PORT, "time peer bytes" (sent + received so far), and a
# "time - 0" line that marks the snapshot.
ssample() {
	local t
	while kill -0 "$1" 2>/dev/null; do
		t=$(now)
		ss -tinH state established "( sport = :$2 )" 2>/dev/null |
			awk -v t="$t" 'BEGIN { print t, "-", 0 }
			/^[^ \t]/ { peer = $4; next }
			{ b = 0
			  for (i = 1; i <= NF; i++)
				if ($i ~ /^bytes_(sent|received):/) {
					split($i, kv, ":")
					b += kv[2]
				}
			  print t, peer, b }' >>"$3" || true
		sleep 1
	done 2>/dev/null || true
}

# tcp_between T0 T1 in|out: "bytes seconds" the scheduler's connections
# carried between two snapshots: the first at or after T0 and the last at
# or before T1 (in: inside the span), or the last at or before T0 and the
# first at or after T1 (out: all of the span). A connection new since
# counts whole, one gone since not at all; nothing when a snapshot is
# missing. T0 "-": from the start.
tcp_between() {
	[ -n "$1" ] && [ -n "$2" ] && [ -s "$rd/sched.tcp" ] || return 0
	awk -v a="$1" -v b="$2" -v m="$3" '
	NR == FNR { if ($2 == "-") {
			if (a == "-") { if (s0 == "") s0 = $1 }
			else if (m == "in") { if (s0 == "" && $1 >= a) s0 = $1 }
			else if ($1 <= a) s0 = $1
			if (m == "in") { if ($1 <= b) s1 = $1 }
			else if (s1 == "" && $1 >= b) s1 = $1 }
		next }
	$2 == "-" { next }
	a != "-" && $1 == s0 { v0[$2] = $3 }
	$1 == s1 { sum += $3 - v0[$2] }
	END { if (s1 != "" && s0 != "" && s1 >= s0)
		printf "%d %.3f", sum, (a == "-" ? 0 : s1 - s0) }' \
		"$rd/sched.tcp" "$rd/sched.tcp"
}

# tcp_total: bytes over the whole run, each connection's last count.
tcp_total() {
	[ -s "$rd/sched.tcp" ] || return 0
	awk '$2 != "-" { last[$2] = $3 }
	END { for (p in last) s += last[p]; printf "%d", s }' "$rd/sched.tcp"
}

# cpu_at T: the scheduler's CPU ticks at the first sample at or after T.
cpu_at() {
	[ -n "$1" ] && [ -s "$rd/sched.samples" ] || return 0
	awk -v t="$1" '$1 >= t { print $2; exit }' "$rd/sched.samples"
}

# first_stamps PATTERN FILES...: the stamp of PATTERN's first line in each
# file, sorted: one per file that has it.
first_stamps() {
	local pat=$1 f
	shift
	for f in "$@"; do
		grep -m1 -E "$pat" "$f" 2>/dev/null | cut -d' ' -f1 || true
	done | sort
}

# nfiles PATTERN FILES...: how many of FILES have a line matching PATTERN.
nfiles() {
	local pat=$1
	shift
	{ grep -l -- "$pat" "$@" 2>/dev/null || true; } | wc -l
}

# run_one N S W REP: one launch, its kill and its figures.
run_one() {
	local n=$1 S=$2 W=$3 rep=$4 rows t0 tkill= joined=0 rc st
	local log sched_pid= vpid= exited lfd= ready= formed= dead= moved=
	local vrank= newmap= nnew=0 clean=0 mism=0 ndead=0 lost=0 restarts=0
	local cpu=null bytes=null bps=null pct=null tlast r w outcome kill_ok=false
	local hb=null stall=null selfs=null epoch=null hbps=null p a b iobytes=null life
	local steady=null scpu=null sbytes=null fcpu=null fbytes=null fobytes=null
	local tst= sport=
	rd=$work/$n-$rep
	log=$rd/log
	mkdir -p "$rd"
	rows=$((100 * W))
	((rows < 10000)) && rows=10000
	local bargs=(--rows "$rows" --dim 8 --batch 32)
	((${#bench_args[@]})) && bargs=("${bench_args[@]}")

	if [ -n "$lock" ] && ((n > locknodes)); then
		exec {lfd}>>"$lock"
		note "$n nodes: waiting for $lock"
		flock "$lfd"
	fi
	note "rep $rep: $n nodes ($S servers, $W workers)"
	# Made here: the subshell below opens it only once it runs.
	: >"$rd/launch.out"
	t0=$(now)
	(cd "$rd" && exec timeout -k 30 "$tmo" "$build/tools/embstore" launch \
		--server_num "$S" --worker_num "$W" --replicas "$replicas" \
		--log-dir "$log" -- embstore-bench --op push --verify \
		--duration "$dur" "${bargs[@]}") >"$rd/launch.out" 2>&1 &
	lpid=$!

	# The scheduler's pid, to sample it from its start.
	for _ in $(seq 200); do
		sched_pid=$(sed -n 's/^\[launch\] started scheduler, pid \([0-9]*\)$/\1/p' \
			"$rd/launch.out" | head -n 1 || true)
		[ -n "$sched_pid" ] && break
		kill -0 "$lpid" 2>/dev/null || break
		sleep 0.05
	done
	if [ -n "$sched_pid" ]; then
		sample "$sched_pid" "$rd/sched.samples" &
		spl=$!
		scrape "$sched_pid" "$log/scheduler.log" "$rd/sched.metrics" &
		scr=$!
		sport=$(sed -n 's/^\[launch\] scheduler on 127\.0\.0\.1:\([0-9]*\),.*/\1/p' \
			"$rd/launch.out" | head -n 1 || true)
		if [ -n "$sport" ]; then
			ssample "$sched_pid" "$sport" "$rd/sched.tcp" &
			ssp=$!
		fi
	fi

	# Every worker joined: wait kdelay more, then SIGKILL server.0, if
	# no worker has exited yet (the kill must land while they push).
	while kill -0 "$lpid" 2>/dev/null; do
		joined=$(grep -c '^\[worker\.[0-9]*\] .*worker [0-9]* of [0-9]* joined' \
			"$rd/launch.out" || true)
		((joined >= W)) && break
		sleep 0.2
	done
	if ((joined >= W)); then
		sleep "$kdelay"
		vpid=$(sed -n 's/^\[launch\] started server\.0, pid \([0-9]*\)$/\1/p' \
			"$rd/launch.out" | head -n 1 || true)
		exited=$(grep -c '^\[launch\] worker\.[0-9]* exited' \
			"$rd/launch.out" || true)
		tkill=$(now)
		if [ -n "$vpid" ] && kill -0 "$lpid" 2>/dev/null &&
			kill -KILL "$vpid" 2>/dev/null; then
			((exited == 0)) && kill_ok=true
		else
			tkill=
		fi
	fi
	st=0
	wait "$lpid" || st=$?
	lpid=
	for p in $spl $ssp $scr; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	spl= ssp= scr=
	reap "$rd"
	[ -n "$lfd" ] && exec {lfd}>&-

	# Formation: the scheduler's "cluster ready", each worker's join.
	ready=$(stamp "$(grep -m1 'cluster ready' "$log/scheduler.log" \
		2>/dev/null || true)")
	formed=$(first_stamps ' joined: ' "$log"/worker.*.log)
	joined=$(grep -c . <<<"$formed" || true)
	formed=$(stamp "$(tail -n 1 <<<"$formed")")
	((joined == W)) || formed=
	# Failover: the death, the scheduler's new map, each worker's.
	if [ -n "$tkill" ]; then
		# Ranks go in order of registration: the scheduler's
		# "assigned server rank K to ADDR (pid P)" names the victim's.
		vrank=$(sed -n "s/.*assigned server rank \([0-9]*\) to .* (pid $vpid)\$/\1/p" \
			"$log/scheduler.log" 2>/dev/null | head -n 1 || true)
		if [ -n "$vrank" ]; then
			dead=$(stamp "$(grep -m1 "server $vrank .*declared dead" \
				"$log/scheduler.log" || true)")
			moved=$(stamp "$(grep -m1 -E "map epoch [0-9]+: server $vrank removed" \
				"$log/scheduler.log" || true)")
		fi
		newmap=$(first_stamps 'map epoch ([2-9]|[1-9][0-9]+) from the scheduler' \
			"$log"/worker.*.log)
		nnew=$(grep -c . <<<"$newmap" || true)
		newmap=$(stamp "$(tail -n 1 <<<"$newmap")")
		((nnew == W)) || newmap=
	fi
	clean=$(nfiles 'verify: [0-9]* rows checked, 0 mismatched' \
		"$log"/worker.*.log)
	mism=$(nfiles 'verify: [0-9]* rows checked, [1-9][0-9]* mismatched' \
		"$log"/worker.*.log)
	ndead=$(grep -c 'declared dead' "$log/scheduler.log" 2>/dev/null || true)
	lost=$(nfiles 'lost scheduler' "$log"/worker.*.log)
	restarts=$(grep -c '^\[launch\] restarting the scheduler' \
		"$rd/launch.out" || true)

	# The scheduler's CPU and bytes over its life (the first scheduler
	# only, when launch restarted it).
	if [ -s "$rd/sched.samples" ]; then
		read -r tlast cpu r w < <(tail -n 1 "$rd/sched.samples") || true
		iobytes=$((r + w))
		life=$(secs "$t0" "$tlast")
		pct=$(awk -v c="$cpu" -v hz="$HZ" -v t="$life" \
			'BEGIN { printf "%.2f", (t > 0 ? 100 * c / hz / t : 0) }')
		cpu=$(awk -v c="$cpu" -v hz="$HZ" 'BEGIN { printf "%.2f", c / hz }')
		bytes=$(tcp_total)
		bps=$(awk -v b="${bytes:-0}" -v t="$life" -v n="$n" \
			'BEGIN { printf "%.0f", (t > 0 ? b / t / n : 0) }')
		[ -n "$bytes" ] || bytes=null bps=null
	fi

	# Steady state, from 3 s after the last join (the servers fetch their
	# map at their next heartbeat, T / 5 = 2 s at most) to the kill:
	# heartbeats alone. Then what forming and failing over cost.
	if [ -n "$formed" ] && [ -n "$tkill" ]; then
		tst=$(awk -v f="$formed" 'BEGIN { printf "%.3f", f + 3 }')
		steady=$(secs "$tst" "$tkill")
		a=$(cpu_at "$tst") b=$(cpu_at "$tkill")
		[ -n "$a" ] && [ -n "$b" ] && scpu=$(awk -v a="$a" -v b="$b" \
			-v hz="$HZ" -v t="$steady" \
			'BEGIN { printf "%.2f", (t > 0 ? 100 * (b - a) / hz / t : 0) }')
		read -r a b < <(tcp_between "$tst" "$tkill" in; echo) || true
		[ -n "$a" ] && sbytes=$(awk -v a="$a" -v t="$b" -v n="$n" \
			'BEGIN { if (t > 0) printf "%.1f", a / t / n; else print "null" }')
	fi
	if [ -n "$formed" ]; then
		a=$(cpu_at "$formed")
		[ -n "$a" ] && fcpu=$(awk -v a="$a" -v hz="$HZ" \
			'BEGIN { printf "%.2f", a / hz }')
		read -r a b < <(tcp_between - "$formed" out; echo) || true
		[ -n "$a" ] && fbytes=$(awk -v a="$a" -v n="$n" \
			'BEGIN { printf "%.0f", a / n }')
	fi
	if [ -n "$newmap" ]; then
		read -r a b < <(tcp_between "$tkill" "$newmap" out; echo) || true
		[ -n "$a" ] && fobytes=$(awk -v a="$a" -v n="$n" \
			'BEGIN { printf "%.0f", a / n }')
	fi

	if [ -s "$rd/sched.metrics" ]; then
		hb=$(awk '/^embstore_cluster_heartbeats_total / { print $2 }' "$rd/sched.metrics")
		stall=$(awk '/^embstore_cluster_scheduler_stall_ms_total / { print $2 }' "$rd/sched.metrics")
		selfs=$(awk '/^embstore_cluster_scheduler_self_suspicions_total / { print $2 }' "$rd/sched.metrics")
		epoch=$(awk '/^embstore_cluster_map_epoch / { print $2 }' "$rd/sched.metrics")
		hbps=$(awk -v h="${hb:-0}" -v t="$(secs "$t0" "${tlast:-$t0}")" -v n="$n" \
			'BEGIN { printf "%.3f", (t > 0 ? h / t / n : 0) }')
	fi

	if ((st == 124 || st == 137)); then
		outcome=timeout
	elif [ -z "$tkill" ] && ((st != 0)); then
		outcome=failed-before-kill
	elif [ -z "$tkill" ]; then
		outcome=no-kill
	elif ((st == 0 && clean == W && mism == 0 && ndead == 1)); then
		outcome=ok
	else
		outcome=failed
	fi
	note "$n nodes rep $rep: $outcome (exit $st, $clean of $W clean," \
		"$ndead declared dead, $lost lost the scheduler)"

	jq -nc --argjson nodes "$n" --argjson servers "$S" \
		--argjson workers "$W" --argjson replicas "$replicas" \
		--argjson rows "$rows" --argjson duration "$dur" \
		--argjson kill_delay "$kdelay" \
		--argjson formation "$(secs "$t0" "$formed")" \
		--argjson ready "$(secs "$t0" "$ready")" \
		--argjson failover "$(secs "$tkill" "$newmap")" \
		--argjson detect "$(secs "$tkill" "$dead")" \
		--argjson fsched "$(secs "$tkill" "$moved")" \
		--argjson nnew "${nnew:-0}" --argjson killed "$kill_ok" \
		--argjson joined "$joined" \
		--argjson cpu "$cpu" --argjson pct "$pct" \
		--argjson bytes "$bytes" --argjson bps "$bps" \
		--argjson iobytes "$iobytes" \
		--argjson st "$st" --arg outcome "$outcome" \
		--argjson clean "$clean" --argjson mism "$mism" \
		--argjson ndead "$ndead" --argjson lost "$lost" \
		--argjson restarts "$restarts" --argjson rep "$rep" \
		--argjson hb "${hb:-null}" --argjson hbps "$hbps" \
		--argjson stall "${stall:-null}" --argjson epoch "${epoch:-null}" \
		--argjson selfs "${selfs:-null}" \
		--argjson steady "$steady" --argjson scpu "$scpu" \
		--argjson sbytes "$sbytes" --argjson fcpu "$fcpu" \
		--argjson fbytes "$fbytes" --argjson fobytes "$fobytes" \
		--arg commit "$commit" \
		--argjson load "$(cut -d' ' -f1 /proc/loadavg)" \
		--argjson wall "$(secs "$t0" "$(now)")" \
		'{fig: "cluster", op: "push-verify-kill", nodes: $nodes,
		  servers: $servers, workers: $workers, replicas: $replicas,
		  rows: $rows, duration: $duration, kill_delay: $kill_delay,
		  formation_s: $formation, ready_s: $ready,
		  workers_joined: $joined,
		  failover_s: $failover, detect_s: $detect,
		  failover_sched_s: $fsched, workers_new_map: $nnew,
		  killed_mid_run: $killed,
		  sched_cpu_s: $cpu, sched_cpu_pct: $pct,
		  sched_bytes: $bytes, sched_bytes_per_s_per_node: $bps,
		  sched_io_bytes: $iobytes,
		  exit: $st, outcome: $outcome, workers_clean: $clean,
		  workers_mismatched: $mism, declared_dead: $ndead,
		  workers_lost_sched: $lost, sched_restarts: $restarts,
		  sched_heartbeats: $hb, heartbeats_per_s_per_node: $hbps,
		  sched_stall_ms: $stall, sched_self_suspicions: $selfs,
		  map_epoch: $epoch,
		  steady_s: $steady, steady_cpu_pct: $scpu,
		  steady_bytes_per_s_per_node: $sbytes,
		  form_cpu_s: $fcpu, form_bytes_per_node: $fbytes,
		  failover_bytes_per_node: $fobytes,
		  run_s: $wall, rep: $rep, commit: $commit, load1: $load}' \
		>>"$out"

	if [ "$outcome" != ok ] || [ "$keep" = 1 ]; then
		local keepdir=${out%.jsonl}.logs/$n-$rep-$(date -u +%H%M%S)
		mkdir -p "$keepdir"
		cp "$rd/launch.out" "$log/scheduler.log" "$keepdir/" 2>/dev/null || true
		[ -f "$log/server.0.log" ] && cp "$log/server.0.log" "$keepdir/"
		note "logs of $n nodes rep $rep in $keepdir"
	fi
	[ "$keep" = 1 ] || rm -rf "$rd"
	rd=
}

# size N or S+W -> "N S W"
split_size() {
	local s w
	case $1 in
	*+*) s=${1%+*}; w=${1#*+} ;;
	*) s=$(($1 / 10)); ((s < replicas)) && s=$replicas; w=$(($1 - s)) ;;
	esac
	if ! [[ $s =~ ^[0-9]+$ && $w =~ ^[0-9]+$ ]] || ((s < replicas || w < 1)); then
		note "size '$1': need at least $replicas servers and 1 worker"
		exit 2
	fi
	echo "$((s + w)) $s $w"
}

for size in $sizes; do split_size "$size" >/dev/null; done
note "sizes: $sizes; reps $reps (above 250 nodes: $bigreps); ${dur}s" \
	"pushes, kill ${kdelay}s after the joins; into $out"
maxreps=$((reps > bigreps ? reps : bigreps))
for rep in $(seq "$first" $((first + maxreps - 1))); do
	for size in $sizes; do
		read -r n S W < <(split_size "$size")
		if ((n > 250 ? rep - first >= bigreps : rep - first >= reps)); then
			continue
		fi
		run_one "$n" "$S" "$W" "$rep"
	done
done
