#!/bin/bash
# tests/tools/bench_auc_rowfmt.sh SRC BUILD - tools/bench-auc-rowfmt.sh,
# the script behind docs/benchmarks.md's "Row formats: training quality",
# on tiny data: the C example, 2 servers and 2 workers, fp32 and int8 rows,
# one run each. Each run appends its JSON line (an AUC, a logloss, the
# servers' rows and bytes of both sparse tables in the format asked for),
# int8 embedding rows take fewer bytes than fp32 ones, and --summary gives
# one line per format. Needs jq, as the script does (else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_auc_rowfmt.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
command -v jq >/dev/null 2>&1 || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-auc-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
out=$work/results.jsonl
"$SRC/tools/bench-auc-rowfmt.sh" -b "$BUILD" -o "$out" -n 4000 -r 1 \
	-f "fp32 int8" -k "$work/keep" c >"$work/run.log" 2>&1 ||
	bad "bench-auc-rowfmt.sh: $(tail -5 "$work/run.log")"
grep -q "failed\|no test auc" "$work/run.log" &&
	bad "bench-auc-rowfmt.sh: $(cat "$work/run.log")"

for fmt in fp32 int8; do
	jq -e -s --arg f "$fmt" 'map(select(.example == "c" and
		.mode == "async" and .format == $f and .rows == 4000 and
		.auc > 0 and .auc <= 1 and .logloss > 0 and .seconds > 0 and
		.emb_rows > 0 and .emb_bytes > 0 and .wide_rows > 0 and
		.wide_bytes > 0 and .stat_formats == [$f])) | length == 1' \
		"$out" >/dev/null || bad "no $fmt line: $(cat "$out")"
done
jq -e -s '(map(select(.format == "int8"))[0] | .emb_bytes / .emb_rows) <
	(map(select(.format == "fp32"))[0] | .emb_bytes / .emb_rows)' \
	"$out" >/dev/null || bad "int8 rows not smaller: $(cat "$out")"

"$SRC/tools/bench-auc-rowfmt.sh" --summary "$out" >"$work/summary" ||
	bad "bench-auc-rowfmt.sh --summary"
[ "$(grep -c '^c	async	' "$work/summary")" = 2 ] ||
	bad "summary: $(cat "$work/summary")"
# Bad usage is refused before anything runs.
"$SRC/tools/bench-auc-rowfmt.sh" -b "$BUILD" nosuchrun >/dev/null 2>&1 &&
	bad "an unknown run was accepted"
[ $fail = 0 ] && echo "bench_auc_rowfmt: ok"
exit $fail
