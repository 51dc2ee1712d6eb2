#!/bin/bash
# tests/tools/bench_conn_mem.sh SRC BUILD - docs/benchmarks.md's memory per
# connection commands at a tiny size: tools/bench-conn-mem.py with 0, 8
# and 24 idle connections to one embstore-server, one client to 1 and 6
# servers (one server's address repeated), a 64 KiB request in flight on
# each of the 24, a storm of 64 connects at once;
# then a client to 1 and 3 server processes (--client-distinct). Checks
# that every step printed its JSON line, that the server kept its thread
# count whatever the connections (no thread per connection), that one
# client added one thread whatever its servers, that the storm timed all
# 64 connects, and that an idle client connection costs under 128 KiB. Needs
# /usr/bin/python3 (the Python package's ctypes; else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_conn_mem.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-conn-mem-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
"$py" "$SRC/tools/bench-conn-mem.py" --build "$BUILD" \
	--server-conns 0,8,24 --client-servers 1,6 --settle 0.2 --storm 64 \
	--busy 65536 \
	>"$work/out.jsonl" 2>"$work/err" ||
	bad "bench-conn-mem.py: $(tail -5 "$work/err")"
if ! "$py" - "$work/out.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
srv = [l for l in lines if l.get("side") == "server" and "state" not in l]
busy = [l for l in lines if l.get("side") == "server" and "state" in l]
cli = [l for l in lines if l.get("side") == "client"]
assert [l["conns"] for l in srv] == [0, 8, 24], srv
assert [l["conns"] for l in cli] == [1, 6], cli
assert len({l["threads"] for l in srv}) == 1, "server threads grew"
assert all(l["threads"] == 1 for l in cli), "client threads per server"
assert all(l["rss_bytes"] > 0 for l in srv), srv
assert [(l["state"], l["conns"]) for l in busy] == [("busy", 24),
                                                     ("after", 24)], busy
assert busy[0]["rss_bytes"] > 0 and busy[0]["ping_bytes"] == 65536, busy
st = [l for l in lines if l.get("fig") == "conn-storm"]
assert len(st) == 1 and st[0]["conns"] == 64, st
assert 0 <= st[0]["p50_ms"] <= st[0]["max_ms"], st
assert 0 <= st[0]["over_1s"] <= 64, st
s = lines[-1]
assert s["fig"] == "conn-mem-summary", s
# An idle client connection holds its first 64 call slots, not 1,024
# (about 240 KiB): bounded, not positive, since the pages one connection
# needs may already be resident from the first client's.
assert s["client_bytes_per_conn"]["median"] < 128 << 10, s
for k in ("server_bytes_per_conn", "client_anon_bytes_per_conn"):
    assert set(s[k]) == {"median", "min", "max"}, s
PYEOF
then
	bad "bad output: $(cat "$work/out.jsonl")"
fi
# One server process per client connection: the client's figure again.
"$py" "$SRC/tools/bench-conn-mem.py" --build "$BUILD" --server-conns 0,4 \
	--client-servers 1,3 --client-distinct --settle 0.2 \
	>"$work/distinct.jsonl" 2>"$work/err" ||
	bad "bench-conn-mem.py --client-distinct: $(tail -5 "$work/err")"
if ! "$py" - "$work/distinct.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
cli = [l for l in lines if l.get("side") == "client"]
assert [(l["conns"], l["distinct"]) for l in cli] == [(1, True), (3, True)]
assert lines[-1]["client_bytes_per_conn"]["median"] < 128 << 10, lines[-1]
PYEOF
then
	bad "bad --client-distinct output: $(cat "$work/distinct.jsonl")"
fi
[ $fail = 0 ] && echo "bench_conn_mem: ok"
exit $fail
