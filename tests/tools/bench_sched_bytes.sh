#!/bin/bash
# tests/tools/bench_sched_bytes.sh SRC BUILD - docs/scale.md's check of its
# control-plane formulas at a tiny size: tools/bench-sched-bytes.py on 3
# servers and 2 workers with R = 2 and a heartbeat timeout of 2 s (room
# for a loaded machine), one server SIGKILLed. Checks that the
# job survived (the script exits 1 otherwise), that heartbeats were seen
# in both directions, and that the failover's burst held at least one map
# per live node less one (a map is 25,432 bytes here; a node whose
# heartbeat answer came late may fall outside the window, and the steady
# rate subtracted is an estimate). Needs /usr/bin/python3 and ss (else
# SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_sched_bytes.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || exit 77
command -v ss >/dev/null 2>&1 || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-sched-bytes-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
"$py" "$SRC/tools/bench-sched-bytes.py" --build "$BUILD" --servers 3 \
	--workers 2 --timeout 2 --kill-at 3 >"$work/out.jsonl" 2>"$work/err" ||
	bad "bench-sched-bytes.py: $(tail -20 "$work/err")"
if ! "$py" - "$work/out.jsonl" <<'PYEOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert j["fig"] == "sched-bytes", j
assert j["hb_in_formula"] == 5 * 48 / 0.4, j
assert j["hb_out_formula"] == 5 * 40 / 0.4, j
assert j["hb_in_bytes_per_s"] > 0 and j["hb_out_bytes_per_s"] > 0, j
assert j["failover_burst_formula"] == 4 * 25432, j
assert j["failover_burst_bytes"] >= 3 * 25432, j
PYEOF
then
	bad "bad output: $(cat "$work/out.jsonl")"
fi
[ $fail = 0 ] && echo "bench_sched_bytes: ok"
exit $fail
