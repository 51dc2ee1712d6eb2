# tests/cluster/moves_lib.sh - steps the moving-slots tests share
# (drain.sh, drain_restart.sh, elastic.sh); source it after tests/lib.sh.
# They read $out (the launch's output), $lpid (the launch) and $npid (the
# newcomer), and report through bad().

# moves_setup TOOLS_DIR NAME: the start every moving-slots test shares:
# TOOLS_DIR (the built programs) first on PATH as $tools, a scratch dir
# $work (emb-NAME-XXXXXX, kept when KEEP is set), 2 s heartbeats, none of
# the caller's own job's EMB_* settings, and an exit trap that stops the
# launch ($lpid) and the newcomer ($npid). A test changes what it needs
# afterwards.
moves_setup() {
	tools=$(cd "$1" && pwd) || exit 1
	work=$(mktemp -d "${TMPDIR:-/tmp}/emb-$2-XXXXXX") || exit 1
	PATH=$tools:$PATH
	export PATH
	EMB_HEARTBEAT_TIMEOUT=2
	EMB_CLUSTER_TIMEOUT=30
	export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
	unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN \
		EMB_SERVER_MAX EMB_MEM_LIMIT EMB_TIER_DIR EMB_SCHED_GRACE \
		EMB_SCHED_STATE
	lpid=
	npid=
	fail=0
	trap moves_cleanup EXIT
}

moves_cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	[ -n "$npid" ] && kill -KILL "$npid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}

# moves_launch SECONDS [LAUNCH_ARGS...]: starts the job the drains run
# under, into $out and $lpid: `embstore launch --server_num 3 --worker_num
# 2 --replicas 2 LAUNCH_ARGS` with `embstore-bench --op step --verify`
# until moves_end (its --stop-file, $work/stop), for SECONDS at most;
# returns once both workers joined (or the launch ended), with $sched its
# scheduler. SECONDS bounds a test that hangs: a loaded machine that makes
# the steps slow only makes the training longer.
moves_launch() {
	out=$work/launch.txt
	_secs=$1
	shift
	(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
		--replicas 2 --log-dir "$work/log" "$@" -- \
		embstore-bench --op step --verify --rows 40000 --dim 8 \
		--batch 512 --duration "$_secs" --stop-file "$work/stop") \
		>"$out" 2>&1 &
	lpid=$!
	for _ in $(seq 300); do
		_n=$(grep -c 'worker\.[01]\] .*worker [01] of 2 joined' "$out")
		[ "$_n" -ge 2 ] && break
		kill -0 "$lpid" 2>/dev/null || break
		sleep 0.1
	done
	sched=$(sed -n 's/^\[launch\] scheduler on \([^,]*\),.*/\1/p' \
		"$out" | head -1)
}

# moves_wait_count PATTERN N [TENTHS]: until N lines of the launch output
# match (0), or the time is up or the launcher gone (1).
moves_wait_count() {
	for _ in $(seq "${3:-600}"); do
		[ "$(grep -c "$1" "$out")" -ge "$2" ] && return 0
		kill -0 "$lpid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# moves_wait PATTERN [TENTHS]: until a line matches.
moves_wait() {
	moves_wait_count "$1" 1 "${2:-600}"
}

# moves_wait_share RANK: waits until the scheduler gave RANK its share;
# sets share to its slots ("" when it never did).
moves_wait_share() {
	for _ in $(seq 200); do
		grep -q "server $1 has its share" "$out" && break
		kill -0 "$lpid" 2>/dev/null || break
		sleep 0.1
	done
	share=$(sed -n "s/.*server $1 has its share: \([0-9]*\) slots.*/\1/p" \
		"$out")
}

# moves_pid RANK: the pid the scheduler's log gives server RANK.
moves_pid() {
	sed -n "s/.*assigned server rank $1 to .* (pid \([0-9]*\)).*/\1/p" \
		"$out" | head -1
}

# moves_left PID: the drained server PID exits 0 by itself, while the
# workers still train. Waited for until it exits or a worker ends, not for
# a fixed time: its moves and then one heartbeat timeout (it stays that
# long, answering) took 17 s under ASan on a loaded machine, past the
# 15 s this waited once.
moves_left() {
	for _ in $(seq 1200); do
		kill -0 "$1" 2>/dev/null || break
		kill -0 "$lpid" 2>/dev/null || break
		grep -q "^\[launch\] worker\.[0-9]* exited" "$out" && break
		sleep 0.1
	done
	kill -0 "$1" 2>/dev/null &&
		bad "server pid $1 still runs: it did not leave while the workers trained"
	_name=$(sed -n "s/^\[launch\] started \(server\.[0-9]*\), pid $1\$/\1/p" \
		"$out")
	# launch writes its line just after it reaps the server.
	for _ in $(seq 50); do
		grep -q "^\[launch\] $_name exited" "$out" && break
		sleep 0.1
	done
	grep -q "^\[launch\] $_name exited with 0" "$out" ||
		bad "drained server ($_name) did not exit 0"
	moves_under_load drain
}

# moves_add_by_hand: asks the scheduler for one server (`embstore scale
# --add 1`) and starts the command it prints, in the background, its log
# in $work/new.txt; sets npid.
moves_add_by_hand() {
	embstore scale --sched "$sched" --add 1 >"$work/add.txt" 2>&1 ||
		bad "scale --add 1 failed: $(cat "$work/add.txt")"
	_cmd=$(grep '^EMB_ROLE=server ' "$work/add.txt")
	[ -n "$_cmd" ] || bad "scale --add printed no command"
	eval "$_cmd" >"$work/new.txt" 2>&1 &
	npid=$!
}

# moves_under_load WHAT: no worker ended before WHAT was done.
moves_under_load() {
	grep -q "^\[launch\] worker\.[01] exited" "$out" &&
		bad "the workers ended before the $1 did: no move under load"
}

# moves_stop: ends the training (its --stop-file) after two more
# seconds of steps on the map the test's last event left, so that writes
# routed by it are verified too.
moves_stop() {
	sleep 2
	: >"$work/stop"
}

# moves_end: the training ends (moves_stop), the launch and the newcomer
# exit 0, and both workers verify 0 mismatched rows.
moves_end() {
	moves_stop
	wait "$lpid"
	_st=$?
	lpid=
	[ "$_st" -eq 0 ] || bad "launch exited $_st"
	# A newcomer launch started is launch's to wait for.
	if [ -n "$npid" ]; then
		wait "$npid"
		_st=$?
		npid=
		[ "$_st" -eq 0 ] ||
			bad "the newcomer exited $_st at the end of the job"
	fi
	_n=$(grep -c 'verify: .* 0 mismatched' "$out")
	[ "$_n" -eq 2 ] || bad "$_n of 2 workers verified 0 mismatched"
}

# moves_unstreamed LOG CHUNK ADDR: whether the log LOG of a stopped server
# does not show the fenced stream of chunk CHUNK ("a-b") to the server at
# ADDR begun (an earlier newcomer may have been sent the same chunk). Its
# copy ahead may be under way or done: a stream begun may end any moment,
# and its line is logged after the stream's thread starts, so a stop
# before the line stops that thread too. Read after a moment, for the
# launcher to write out what the server wrote before its stop. A loaded
# machine may show the line of a move late: a source killed after its
# chunk's stream ended is not a source dying mid-move but the window
# docs/replication.md ("The source dies after its stream") calls
# unknowable, where a write in flight to it fails with EMB_ENODEAD.
moves_unstreamed() {
	sleep 0.3
	! grep -q "streaming slots $2 to server [0-9]* ($3)" "$1" 2>/dev/null
}

# moves_kill_copier FIRST LAST: SIGKILLs the copier of the first move to
# rank 3, from the FIRST-th to the LAST-th, whose fenced stream to the
# second newcomer ($work/new2.txt) had not begun (moves_unstreamed): as
# soon as a move's line shows, every server of ranks 0 to 2 is stopped
# (SIGSTOP), then the copier is looked up, killed or let go on, and the
# others go on. Sets victim to its rank; 1 when none was (or a move or a
# server was not found: why in moves_why). The caller defines move_wait N
# (waits for the N-th move line to rank 3, setting by to its copier),
# move_line N (prints that line) and rank_pid RANK NAME (the pid of
# launch's server NAME, which holds RANK).
moves_kill_copier() {
	_n=$1
	victim=
	moves_why="every chunk was streamed before its copier stopped"
	_a2=$(sed -n 's/.* listening on \(127\.0\.0\.1:[0-9]*\) .*/\1/p' \
		"$work/new2.txt")
	_all=
	for _r in 0 1 2; do
		_nm=$(sed -n "s/^\[\(server\.[0-9]*\)\] .* as server $_r of 4\$/\1/p" \
			"$out" | head -1)
		_all="$_all $(rank_pid "$_r" "$_nm")"
	done
	while [ -z "$victim" ] && [ "$_n" -le "$2" ]; do
		move_wait "$_n" || { moves_why="no move $_n to rank 3"; return 1; }
		# shellcheck disable=SC2086
		kill -STOP $_all 2>/dev/null
		[ "$by" != 3 ] || {
			kill -CONT $_all 2>/dev/null
			moves_why="a chunk copied by the newcomer itself"
			return 1
		}
		_chunk=$(move_line "$_n" |
			sed -n 's/.*slots \([0-9]*-[0-9]*\) move .*/\1/p')
		_name=$(sed -n "s/^\[\(server\.[0-9]*\)\] .* as server $by of 4\$/\1/p" \
			"$out" | head -1)
		_pid=$(rank_pid "$by" "$_name")
		if [ -z "$_pid" ] || [ -z "$_name" ]; then
			kill -CONT $_all 2>/dev/null
			moves_why="no server $by (${_pid:-no pid}) to kill"
			return 1
		fi
		if moves_unstreamed "$work/log/$_name.log" "$_chunk" "$_a2"; then
			kill -KILL "$_pid" 2>/dev/null
			victim=$by
		fi
		kill -CONT $_all 2>/dev/null
		_n=$((_n + 1))
	done
	[ -n "$victim" ]
}

# moves_pace_wait: under --move-bound, waits (up to 30 s) until both
# workers logged their calls' p99 with no move under way, which a report
# needs (src/worker/pace.c).
moves_pace_wait() {
	_n=0
	for _ in $(seq 300); do
		_n=$(grep -c "worker\.[01]\] .*calls' p99 with no move under way" \
			"$out")
		[ "$_n" -ge 2 ] && return 0
		sleep 0.1
	done
	bad "$_n of 2 workers logged their calls' p99"
}

# moves_pace_check URL...: a worker reported during the join, and the
# servers whose /metrics are at URL... took reports and, the bound being
# under 1 (every report over it), cut their pace.
moves_pace_check() {
	grep -q "worker\.[01]\] .*a move is under way: reporting this worker's calls' p99" \
		"$out" || bad "no worker reported its calls' p99 during the join"
	_reports=0 _cuts=0
	for _u in "$@"; do
		curl -fsS "$_u" >"$work/sm.txt" 2>&1 || continue
		_r=$(sed -n 's/^embstore_move_pace_reports_total \([0-9]*\)$/\1/p' "$work/sm.txt")
		_c=$(sed -n 's/^embstore_move_pace_cuts_total \([0-9]*\)$/\1/p' "$work/sm.txt")
		_reports=$((_reports + ${_r:-0}))
		_cuts=$((_cuts + ${_c:-0}))
	done
	[ "$_reports" -gt 0 ] && [ "$_cuts" -gt 0 ] ||
		bad "the sources took $_reports reports and cut their pace $_cuts times"
	echo "paced by step time: $_reports reports, $_cuts cuts"
}
