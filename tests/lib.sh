# tests/lib.sh - shell helpers for the script tests; source it.

# bad MSG...: reports a failed check on stderr and marks the run failed
# (fail=1); the scripts go on checking and exit with $fail at the end.
bad() {
	echo "FAIL: $*" >&2
	fail=1
}

# emb_start_server BIN LOG [ARGS...]: starts embstore-server BIN on a free
# loopback port with its log in LOG, in the background. Sets pid and port;
# returns 1 (after printing the log) if it did not report a port in
# EMB_START_WAIT seconds (10; a server loading a checkpoint reports its
# port only once it is loaded).
emb_start_server() {
	_bin=$1
	_log=$2
	shift 2
	"$_bin" --listen 127.0.0.1:0 --threads 1 "$@" 2>"$_log" &
	pid=$!
	port=
	for _ in $(seq $((${EMB_START_WAIT:-10} * 10))); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' \
			"$_log" | head -n 1)
		[ -n "$port" ] && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "embstore-server did not report a port:" >&2
	cat "$_log" >&2
	return 1
}
