#!/bin/sh
# tests/scale/netdc_fails.sh BUILD - tests/scale/netdc.sh fails when it
# should, and leaves nothing behind however it ends: a worker that exits
# non-zero fails the run; a round trip below --min-rtt (the latency "not
# applied") fails it before any job starts; SIGTERM in mid-job stops it at
# once. After each, none of its namespaces and none of its processes
# remain. Without netem (--delay 0), so it runs on any kernel; exits 77
# (SKIP) without root.
set -u
build=$(cd "${1:?usage: netdc_fails.sh BUILD}" && pwd)
netdc="$(cd "$(dirname "$0")" && pwd)/netdc.sh"
out=$(mktemp "${TMPDIR:-/tmp}/emb-netdcfail-XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }

fail() {
	cat "$out"
	echo "FAIL: $*"
	exit 1
}

# run EXPECTED_STATUS MESSAGE ARGS...: netdc.sh ARGS must exit with
# EXPECTED_STATUS, print MESSAGE, and leave no namespace d<its pid>*.
run() {
	want=$1 msg=$2
	shift 2
	"$netdc" --hosts 2 --delay 0 --bin "$build/tools" --timeout 120 "$@" \
		>"$out" 2>&1 &
	pid=$!
	wait "$pid"
	rc=$?
	[ "$rc" -eq 77 ] && { cat "$out"; exit 77; }
	[ "$rc" -eq "$want" ] || fail "exit status $rc, not $want"
	grep -q "$msg" "$out" || fail "no '$msg'"
	ip netns list | grep -q "^d$pid" && fail "namespaces left behind"
	echo "ok: $msg"
}

run 1 "FAIL: worker.0 exited with 3" --servers 1 --workers 1 -- \
	sh -c 'exit 3'
# A bound (100 s) no round trip reaches, even in a starved VM.
run 1 "the delay is not applied" --min-rtt 100000000 --servers 1 \
	--workers 1 -- true

# SIGTERM while a worker runs (the job never forms: it would wait): the
# harness stops at once, and the worker goes with its namespace.
"$netdc" --hosts 2 --delay 0 --bin "$build/tools" --servers 1 --workers 1 \
	--timeout 120 -- sh -c 'echo $$ >&2; exec sleep 600' >"$out" 2>&1 &
pid=$!
i=0
until [ -n "$(ip netns pids "d${pid}h1" 2>/dev/null)" ]; do
	i=$((i + 1))
	[ "$i" -lt 600 ] || fail "the worker never started"
	sleep 0.1
done
worker=$(ip netns pids "d${pid}h1")
kill -TERM "$pid"
i=0
while kill -0 "$pid" 2>/dev/null; do
	i=$((i + 1))
	[ "$i" -lt 100 ] || fail "SIGTERM did not stop the harness in 10 s"
	sleep 0.1
done
ip netns list | grep -q "^d$pid" && fail "namespaces left after SIGTERM"
for w in $worker; do
	kill -0 "$w" 2>/dev/null && fail "worker process $w left after SIGTERM"
done
echo "ok: SIGTERM cleaned up"
"$netdc" --help | grep -q -- "--min-rtt US" || fail "--help lists no options"
echo "netdc failures: ok"
