#!/bin/sh
# tests/tools/bench_net.sh - embstore-bench over the network: starts
# embstore-server ($EMB_SERVER_BIN) as a child on a free loopback port, runs
# tiny uncached and cached runs of embstore-bench ($EMB_BENCH) against it,
# and checks that each exits 0 and prints one JSON object with the network
# keys. Exits 77 (meson SKIP) without python3, which parses the JSON.
set -u
. "$(dirname "$0")/../lib.sh"

command -v python3 >/dev/null 2>&1 || exit 77
: "${EMB_BENCH:?}" "${EMB_SERVER_BIN:?}"

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-net-XXXXXX") || exit 1
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

emb_start_server "$EMB_SERVER_BIN" "$dir/server.log" || exit 1

fail=0
# run NAME CHECK ARGS...: CHECK is a python expression over the object j.
run() {
	name=$1
	check=$2
	shift 2
	if ! "$EMB_BENCH" --servers "127.0.0.1:$port" --rows 2000 --dim 8 \
		--batch 64 --batches 30 --json "$@" >"$dir/$name.json" \
		2>"$dir/$name.err"; then
		echo "FAIL $name: exit status" >&2
		cat "$dir/$name.err" >&2
		fail=1
		return
	fi
	if ! python3 - "$dir/$name.json" "$check" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "one line of JSON"
j = json.loads(lines[0])
for k in ("op", "backend", "rows_per_s", "p99_us", "bytes_per_row",
          "transport", "cache_hit_ratio", "bytes_fetched", "bytes_written"):
    assert k in j, "missing key " + k
assert j["backend"] == "client" and j["transport"] == "tcp", j
assert j["batches"] == 30 * j["threads"], j["batches"]
assert j["bytes_per_row"] > 0, "STATS gave the table's bytes"
assert eval(sys.argv[2]), sys.argv[2]
EOF
	then
		echo "FAIL $name: bad JSON:" >&2
		cat "$dir/$name.json" >&2
		fail=1
		return
	fi
	echo "ok $name"
}

run pull 'j["bytes_fetched"] > 0 and j["preload_rows_per_s"] > 0' \
	--op pull --preload --table plain
run step2 'j["threads"] == 2 and j["bytes_written"] > 0' \
	--op step --threads 2 --table plain
run through 'j["cache_mode"] == "through" and j["cache_rows"] == 500' \
	--op step --cache 500 --prefetch 1 --staleness 4 --cache-mode through \
	--cache-policy clock --table through
run back '(j["cache_mode"] == "back" and j["cache_policy"] == "lru" and
	j["cache_hit_ratio"] > 0)' \
	--op step --cache 1000 --prefetch 2 --cache-mode back \
	--cache-policy lru --optimizer adagrad --compute-us 50 --table back
# --cache alone: write-back with TinyLFU, which hits.
run defaults '(j["cache_mode"] == "back" and j["cache_policy"] == "tinylfu"
	and j["staleness"] == 0 and j["cache_hit_ratio"] > 0)' \
	--op step --cache 1000 --table defaults

# Options that contradict each other are refused before any work.
if "$EMB_BENCH" --servers "127.0.0.1:$port" --in-process --batches 1 \
	>/dev/null 2>&1; then
	echo "FAIL: --in-process with --servers was accepted" >&2
	fail=1
fi
if "$EMB_BENCH" --in-process --cache 10 --batches 1 >/dev/null 2>&1; then
	echo "FAIL: --cache without servers was accepted" >&2
	fail=1
fi
exit $fail
