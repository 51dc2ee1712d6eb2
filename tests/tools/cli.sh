#!/bin/bash
# tests/tools/cli.sh - the command line as a new user meets it, with the
# built programs: --version on every program, `embstore CMD --help` per
# subcommand, embstore-bench's help, `embstore stat --json` against an
# embstore-server child, and `embstore launch`: a healthy local cluster
# logs no warn or error line at info level, and a worker that exits 0
# without joining (or never joins) ends the launch with status 1 and a
# line naming it, well within the join timeout; /healthz of a server
# before and after it registered, and the scheduler's cluster metrics.
# Needs EMB_BIN_DIR (the build's tools/) and EMB_TRAINER_BIN
# (tests/cluster/trainer); python3 parses the JSON and speaks HTTP (else
# those checks are skipped).
set -u
. "$(dirname "$0")/../lib.sh"
: "${EMB_BIN_DIR:?}" "${EMB_TRAINER_BIN:?}"

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-cli-XXXXXX") || exit 1
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail=0
# --version: "NAME VERSION" on stdout, exit 0.
for p in embstore embstore-server embstore-bench embstore-echo-server \
	embstore-echo-client; do
	out=$("$EMB_BIN_DIR/$p" --version) || bad "$p --version exit status"
	case $out in
	"$p "[0-9]*) ;;
	*) bad "$p --version printed '$out'" ;;
	esac
done

# --table-shards: a power of two up to 1024; anything else exits 2 naming it.
for v in 0 48 2048; do
	"$EMB_BIN_DIR/embstore-server" --table-shards "$v" \
		--listen 127.0.0.1:0 >/dev/null 2>"$dir/shards.err"
	rc=$?
	[ $rc -eq 2 ] && grep -q -e "--table-shards $v" "$dir/shards.err" ||
		bad "embstore-server --table-shards $v: exit $rc, $(cat "$dir/shards.err")"
done

# embstore CMD --help: that command's own usage, on stdout, exit 0.
# help_has CMD WORD...: each WORD appears in the usage.
help_has() {
	cmd=$1
	shift
	"$EMB_BIN_DIR/embstore" "$cmd" --help >"$dir/help" 2>"$dir/help.err" ||
		bad "embstore $cmd --help exit status"
	head -n 1 "$dir/help" | grep -q "^usage: embstore $cmd " ||
		bad "embstore $cmd --help: $(head -n 1 "$dir/help")"
	[ -s "$dir/help.err" ] && bad "embstore $cmd --help wrote to stderr"
	for w in "$@"; do
		grep -q -e "$w" "$dir/help" || bad "embstore $cmd --help lacks $w"
	done
	grep -q '%%' "$dir/help" && bad "embstore $cmd --help prints %%"
}
help_has dump --servers --table --out --quiet --block-size --version
help_has restore --in --servers --table --from
help_has inspect --rows
help_has export --in --format --out
help_has stat --interval --watch --json --sched
help_has launch --server_num --worker_num --trainer_num --sched-port \
	--log-dir
"$EMB_BIN_DIR/embstore" --help | grep -q "^  launch " ||
	bad "embstore --help lacks launch"
"$EMB_BIN_DIR/embstore" inspect --servers x >/dev/null 2>&1
[ $? -eq 2 ] || bad "embstore inspect takes --servers"
"$EMB_BIN_DIR/embstore-bench" --help >"$dir/bench.help" ||
	bad "embstore-bench --help exit status"
grep -q '%%' "$dir/bench.help" && bad "embstore-bench --help prints %%"
grep -q 'pulls 80% of' "$dir/bench.help" || bad "embstore-bench --help mix"

# embstore stat --json against a server holding a table (one index shard
# per table, from the environment: every row in one shard).
EMB_TABLE_SHARDS=1 emb_start_server "$EMB_BIN_DIR/embstore-server" \
	"$dir/server.log" ||
	bad "embstore-server did not report a port"
if [ -n "$port" ]; then
	"$EMB_BIN_DIR/embstore-bench" --servers "127.0.0.1:$port" --rows 500 \
		--dim 4 --batch 50 --batches 5 --table stat_json \
		>/dev/null 2>&1 || bad "embstore-bench to fill a table"
	# A table with admission: its pulls of ids seen once are counted.
	"$EMB_BIN_DIR/embstore-bench" --servers "127.0.0.1:$port" --rows 500 \
		--dim 4 --batch 50 --batches 5 --table stat_life \
		--admit count:3 --evict ttl:2 >/dev/null 2>&1 ||
		bad "embstore-bench with --admit"
	"$EMB_BIN_DIR/embstore" stat --servers "127.0.0.1:$port" \
		--interval 0.2 >"$dir/stat.txt" || bad "embstore stat exit status"
	grep -A1 "stat_life" "$dir/stat.txt" |
		grep -q "admission: [1-9][0-9]* pulls and 0 pushes of ids not admitted" ||
		bad "embstore stat shows no admission line: $(cat "$dir/stat.txt")"
	grep -A1 "stat_json" "$dir/stat.txt" | grep -q "admission:" &&
		bad "embstore stat: an admission line for a table without a policy"
	if "$EMB_BIN_DIR/embstore" stat --servers "127.0.0.1:$port" \
		--interval 0.2 --json >"$dir/stat.json"; then
		if command -v python3 >/dev/null 2>&1; then
			python3 - "$dir/stat.json" "127.0.0.1:$port" <<'EOF' ||
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
j = json.loads(lines[0])
assert j["servers"] == 1 and j["interval_s"] > 0, j
t = [t for t in j["tables"] if t["table"] == "stat_json"]
assert len(t) == 1, j
t = t[0]
assert t["server"] == sys.argv[2] and t["dim"] == 4, t
assert t["rows"] == 500 and t["memory_bytes"] > 0, t
for k in ("pulls_per_s", "pushes_per_s", "rows_pulled_per_s",
          "rows_pushed_per_s"):
    assert t[k] == 0, t
assert t["totals"]["rows"] == 500 and t["totals"]["pulls"] > 0, t
assert t["totals"]["pulls_unadmitted"] == 0, t
life = [t for t in j["tables"] if t["table"] == "stat_life"]
assert len(life) == 1 and life[0]["totals"]["pulls_unadmitted"] > 0, j
assert life[0]["totals"]["admit_filter_bytes"] > 0, j
EOF
				bad "embstore stat --json: $(cat "$dir/stat.json")"
		fi
	else
		bad "embstore stat --json exit status"
	fi
	kill "$pid"
	wait "$pid"
	pid=
fi

# /healthz of a daemon: a server waiting for its scheduler is not ready;
# once it registered it is; the scheduler's /metrics shows it joined.
if command -v python3 >/dev/null 2>&1; then
	sp=$(python3 -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
	# metrics_port LOG: the port a daemon logged it serves metrics on.
	metrics_port() {
		for _ in $(seq 100); do
			sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' \
				"$1" | grep . && return
			sleep 0.1
		done
	}
	# http_get PORT PATH: prints "STATUS BODY" (python3), or nothing.
	http_get() {
		python3 - "$1" "$2" <<'EOF' 2>/dev/null
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{sys.argv[2]}")
    print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
EOF
	}
	EMB_SCHED_HOST=127.0.0.1 EMB_SCHED_PORT=$sp EMB_SERVER_NUM=1 \
		EMB_WORKER_NUM=1 "$EMB_BIN_DIR/embstore-server" --listen 127.0.0.1:0 --threads 1 \
		--metrics-listen 127.0.0.1:0 2>"$dir/hs.log" &
	hpid=$!
	mp1=$(metrics_port "$dir/hs.log")
	h=
	for _ in $(seq 100); do
		h=$(http_get "$mp1" /healthz) && [ -n "$h" ] && break
		sleep 0.1
	done
	[ "$h" = "503 not registered with the scheduler yet" ] ||
		bad "unregistered server's /healthz: '$h': $(cat "$dir/hs.log")"
	EMB_SERVER_NUM=1 EMB_WORKER_NUM=1 EMB_SCHED_HOST=127.0.0.1 \
		EMB_SCHED_PORT=$sp "$EMB_BIN_DIR/embstore-server" --role scheduler \
		--metrics-listen 127.0.0.1:0 2>"$dir/hsched.log" &
	spid=$!
	mp2=$(metrics_port "$dir/hsched.log")
	for _ in $(seq 50); do
		h=$(http_get "$mp1" /healthz)
		[ "$h" = "200 ok" ] && break
		sleep 0.1
	done
	[ "$h" = "200 ok" ] ||
		bad "registered server's /healthz: '$h': $(cat "$dir/hs.log")"
	for _ in $(seq 20); do
		m=$(http_get "$mp2" /metrics)
		echo "$m" | grep -q \
			'^embstore_cluster_nodes{role="server",state="alive"} 1$' &&
			break
		sleep 0.1
	done
	echo "$m" | grep -q \
		'^embstore_cluster_nodes{role="server",state="alive"} 1$' ||
		bad "scheduler /metrics lacks the server: $m"
	echo "$m" | grep -q '^embstore_cluster_state{state="forming"} 1$' ||
		bad "scheduler /metrics: not forming: $m"
	[ "$(http_get "$mp2" /healthz)" = "200 ok" ] || bad "scheduler /healthz"
	kill "$hpid" "$spid"
	wait "$hpid" "$spid" 2>/dev/null
fi

# launch: a healthy job logs nothing at warn or error.
mkdir "$dir/ok" && cd "$dir/ok" || exit 1
EMB_LOG_LEVEL=info "$EMB_BIN_DIR/embstore" launch --server_num 2 \
	--worker_num 2 --log-dir log -- "$EMB_TRAINER_BIN" >out 2>&1 ||
	bad "healthy launch exit status"
if grep -E ' (warn|error) ' out log/*.log; then
	bad "a healthy local cluster logs warn or error lines"
fi
grep -q 'all workers exited 0' out || bad "healthy launch: $(tail -n 3 out)"

# launch: a worker that exits 0 without joining ends the job, named.
mkdir "$dir/nojoin" && cd "$dir/nojoin" || exit 1
start=$(date +%s)
"$EMB_BIN_DIR/embstore" launch --server_num 1 --trainer_num 2 --log-dir log \
	-- sh -c 'exit 0' >out 2>&1
rc=$?
took=$(($(date +%s) - start))
[ $rc -eq 1 ] || bad "worker that never joined: launch exited $rc"
grep -q 'worker\.[01] exited 0 without joining the cluster' out ||
	bad "no line names the worker: $(cat out)"
[ $took -le 15 ] || bad "worker that never joined: launch took $took s"

# launch: a worker that never tries to join ends the job at the timeout.
mkdir "$dir/slow" && cd "$dir/slow" || exit 1
start=$(date +%s)
EMB_CLUSTER_TIMEOUT=1 "$EMB_BIN_DIR/embstore" launch --server_num 1 \
	--worker_num 1 --log-dir log -- sleep 60 >out 2>&1
rc=$?
took=$(($(date +%s) - start))
[ $rc -eq 1 ] || bad "worker that never joins: launch exited $rc"
grep -q 'did not form within 1 s.*still running: worker\.0' out ||
	bad "no line names the waiting worker: $(cat out)"
[ $took -le 20 ] || bad "worker that never joins: launch took $took s"

# launch: children find embstore on PATH.
mkdir "$dir/path" && cd "$dir/path" || exit 1
"$EMB_BIN_DIR/embstore" launch --server_num 1 --worker_num 1 --log-dir log \
	-- sh -c 'embstore --version && exec "$0"' "$EMB_TRAINER_BIN" \
	>out 2>&1 || bad "embstore not on a worker's PATH: $(cat out)"
grep -q '^\[worker\.0\] embstore [0-9]' out || bad "worker ran no embstore"

exit $fail
