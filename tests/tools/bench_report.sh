#!/bin/bash
# tests/tools/bench_report.sh SRC BUILD - the commands of docs/benchmarks.md's
# scale section, on tiny tables: tools/bench-report.sh's `scale` section
# writes its JSON lines (in process at two sizes; create, dump and restore
# through a server at the larger), --summary keeps the sizes apart, and
# tools/bench-plot.sh draws bench-scale.png from them (when gnuplot is
# there). Then the rowfmt section the same way. Needs jq, as the scripts
# do (else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_report.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
command -v jq >/dev/null 2>&1 || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-report-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
out=$work/results.jsonl
EMB_SCALE_ROWS="20000 50000" "$SRC/tools/bench-report.sh" -b "$BUILD" \
	-r 1 -d 1 -o "$out" scale >"$work/report.log" 2>&1 ||
	bad "bench-report.sh scale: $(tail -5 "$work/report.log")"
grep -q "failed" "$work/report.log" &&
	bad "bench-report.sh scale: $(grep failed "$work/report.log")"

# One in-process pull per size with its creation rate; the server's pull,
# dump and restore at the larger size.
n=$(jq -s '[.[] | select(.fig == "scale" and .op == "pull"
	and .rows_per_s > 0 and .preload_rows_per_s > 0) | .rows]
	| sort | map(tostring) | join(" ")' -r "$out")
[ "$n" = "20000 50000" ] || bad "in-process scale runs: '$n'"
for op in pull dump restore; do
	jq -e -s --arg op "$op" 'map(select(.fig == "scale-tcp" and .op == $op
		and .rows == 50000 and .rows_per_s > 0)) | length == 1' \
		"$out" >/dev/null || bad "no scale-tcp $op at 50000 rows"
done
jq -e -s 'map(select(.op == "dump"))[0].file_bytes > 50000 * 16' "$out" \
	>/dev/null || bad "dump size not recorded"

# --summary: one line per size, the size in its own column.
"$SRC/tools/bench-report.sh" --summary "$out" >"$work/summary" ||
	bad "bench-report.sh --summary"
head -n 1 "$work/summary" | grep -q "rows" || bad "summary has no rows column"
[ "$(grep -c '^scale	pull' "$work/summary")" = 2 ] ||
	bad "summary: $(cat "$work/summary")"

# The rowfmt section on tiny tables: a W1 run per format and op, and
# bytes_per_row per format and optimizer, smaller for fp16 than for fp32;
# --summary gives each compact format's rate against fp32's.
rf=$work/rowfmt.jsonl
EMB_ROWFMT_W1_ROWS=20000 EMB_ROWFMT_ROWS=50000 "$SRC/tools/bench-report.sh" \
	-b "$BUILD" -r 1 -d 0.2 -o "$rf" rowfmt >"$work/rowfmt.log" 2>&1 ||
	bad "bench-report.sh rowfmt: $(tail -5 "$work/rowfmt.log")"
jq -e -s 'map(select(.fig == "rowfmt" and .rows_per_s > 0)) | length == 12' \
	"$rf" >/dev/null || bad "rowfmt: not 12 W1 runs: $(cat "$rf")"
for opt in sgd adagrad; do
	jq -e -s --arg o "$opt" 'map(select(.fig == "rowfmt-mem" and
		.optimizer == $o and .rows == 50000))
		| (map(.row_format) | sort) == ["bf16", "fp16", "fp32", "int8"]
		and (map(select(.row_format == "fp16"))[0].bytes_per_row <
		     map(select(.row_format == "fp32"))[0].bytes_per_row)' \
		"$rf" >/dev/null || bad "rowfmt-mem $opt: $(cat "$rf")"
done
"$SRC/tools/bench-report.sh" --summary "$rf" >"$work/rowfmt.summary" ||
	bad "bench-report.sh --summary of rowfmt"
[ "$(grep -c '^rowfmt pull .*/fp32' "$work/rowfmt.summary")" = 6 ] ||
	bad "rowfmt summary: $(cat "$work/rowfmt.summary")"

if command -v gnuplot >/dev/null 2>&1; then
	"$SRC/tools/bench-plot.sh" "$out" "$work/img" >"$work/plot.log" 2>&1 ||
		bad "bench-plot.sh: $(cat "$work/plot.log")"
	[ -s "$work/img/bench-scale.png" ] || bad "no bench-scale.png"
	# Figures it has no lines for are left alone, not drawn empty.
	[ -e "$work/img/bench-batch.png" ] && bad "bench-batch.png drawn empty"
fi
[ $fail = 0 ] && echo "bench_report: ok"
exit $fail
