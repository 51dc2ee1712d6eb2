#!/bin/bash
# tests/tools/bench_replicas.sh SRC BUILD - tools/bench-replicas.py, the
# R = 2 against R = 1 figure of docs/replication.md, on a tiny table: one
# pair of runs under embstore launch, each a JSON line with a rate and the
# servers' and bench's CPU per row, then the medians and the ratio line.
# Needs python3 (else SKIP).
set -u
SRC=$(cd "${1:?usage: bench_replicas.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
command -v python3 >/dev/null 2>&1 || exit 77

out=$(python3 "$SRC/tools/bench-replicas.py" --build "$BUILD" --pairs 1 \
	--duration 1.5 --warmup 0.5 -- --rows 20000 --dim 16 --batch 512 \
	--dist uniform --optimizer sgd 2>&1) || {
	echo "FAIL: bench-replicas.py: $out" >&2
	exit 1
}
echo "$out"
printf '%s\n' "$out" | python3 -c '
import json, sys
lines = sys.stdin.read().splitlines()
runs = [json.loads(l) for l in lines if l.startswith("{")]
assert [r["R"] for r in runs] == [1, 2], runs
for r in runs:
    assert r["rows_per_s"] > 0, r
    # A server applied rows, the bench sent them: both used some CPU.
    assert r["server_ns_per_row"] > 0 and r["client_ns_per_row"] > 0, r
assert any(l.startswith("R=2/R=1 rows/s per pair: median ") for l in lines)
' || {
	echo "FAIL: unexpected output" >&2
	exit 1
}
