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

# emb_have_etcd: whether etcd(1) and python3 (which emb_start_etcd needs
# for free ports) are installed.
emb_have_etcd() {
	command -v etcd >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1
}

# emb_start_etcd DIR NAME: starts a one-member etcd(1) with its log
# (etcd.log) in DIR, on two free loopback ports, in the background. Its
# data go to a directory of its own in /dev/shm where there is one
# (removed once etcd is gone), else to DIR: a test's etcd keeps nothing
# worth a disk, and on a disk the writes of a busy machine can hold etcd's
# fsyncs, and with them every lease renewal, for seconds. Sets epid and
# etcd_port (the client port); returns 1 (after printing the log's tail)
# if it was not ready in 30 s. Needs python3, for the ports.
emb_start_etcd() {
	_dir=$1
	_name=$2
	_data=$_dir/etcd
	if [ -d /dev/shm ] && [ -w /dev/shm ]; then
		# What an earlier test's etcd left when the test was killed
		# with its watcher (below; meson kills a timed-out test's
		# process group): a directory whose .pid names no process.
		# (One being written reads empty, and stays.)
		for _pf in /dev/shm/emb-etcd-*.pid; do
			_op=$(cat "$_pf" 2>/dev/null) || continue
			[ -n "$_op" ] || continue
			kill -0 "$_op" 2>/dev/null && continue
			rm -rf "${_pf%.pid}" "$_pf"
		done
		_data=$(mktemp -d /dev/shm/emb-etcd-XXXXXX 2>/dev/null) ||
			_data=$_dir/etcd
	fi
	# Two free ports at once: picked one after the other, the second
	# could be the first again, and etcd would fail to bind its peer
	# port.
	_ports=$(python3 -c 'import socket
a = socket.socket(); a.bind(("127.0.0.1", 0))
b = socket.socket(); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
	etcd_port=${_ports% *}
	_pp=${_ports#* }
	etcd --name "$_name" --data-dir "$_data" \
		--listen-client-urls "http://127.0.0.1:$etcd_port" \
		--advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$_pp" \
		--initial-advertise-peer-urls "http://127.0.0.1:$_pp" \
		--initial-cluster "$_name=http://127.0.0.1:$_pp" \
		>"$_dir/etcd.log" 2>&1 &
	epid=$!
	case $_data in
	/dev/shm/*)
		echo "$epid" >"$_data.pid"
		# Removed once etcd is gone, by a process that is no child of
		# the test (its `wait` does not wait for it) and holds none of
		# its output open.
		(
			(
				while kill -0 "$epid" 2>/dev/null; do
					sleep 1
				done
				rm -rf "$_data" "$_data.pid"
			) </dev/null >/dev/null 2>&1 &
		)
		;;
	esac
	for _ in $(seq 300); do
		grep -q 'ready to serve client requests' "$_dir/etcd.log" &&
			return 0
		kill -0 "$epid" 2>/dev/null || break
		sleep 0.1
	done
	tail -20 "$_dir/etcd.log" >&2
	echo "etcd did not start" >&2
	return 1
}
