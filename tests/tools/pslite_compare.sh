#!/bin/sh
# tests/tools/pslite_compare.sh SRC BUILD [full] - tools/pslite-compare.sh
# at a tiny size (5000 rows of dim 8, batches of 64, two repetitions of
# 20 timed batches a phase).
#
# Without "full": the embstore half alone (no ps-lite source): each
# repetition prints embstore's rows/s for pull and push and no ratio, and
# -o gets one JSON object per run with fig "pslite", which
# tools/bench-report.sh --summary lists.
# With "full": ps-lite is built from $EMB_PSLITE_SRC (a dmlc/ps-lite
# checkout; into BUILD/pslite, kept for the next run) and both systems
# run: every repetition has a ratio and each op a median line, and the
# ps-lite driver's --check pulls back every row it wrote. Either way a
# run with -i 1 adds the in-process rounds after. Exits 77
# (meson SKIP) when EMB_PSLITE_SRC is not set, or without jq.
set -u
. "$(dirname "$0")/../lib.sh"

src=$1
build=$2
mode=${3:-embstore}
command -v jq >/dev/null 2>&1 || { echo "no jq" >&2; exit 77; }
pslite=
if [ "$mode" = full ]; then
	if [ -z "${EMB_PSLITE_SRC:-}" ]; then
		echo "EMB_PSLITE_SRC is not set (a dmlc/ps-lite checkout): skip" >&2
		exit 77
	fi
	pslite=$EMB_PSLITE_SRC
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-pslite-cmp-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0

# shellcheck disable=SC2086
# 20 timed batches a phase, not seconds: no load cuts a phase to none.
if ! "$src/tools/pslite-compare.sh" -b "$build" -r 2 -N 20 -w 0 -n 5000 \
	-B 64 -D 8 -o "$dir/runs.jsonl" $pslite >"$dir/out" 2>"$dir/err"; then
	bad "pslite-compare.sh exited $?"
fi
cat "$dir/out"

# Rows "rep op ps-lite embstore ratio" for reps 1, 2 and ops pull, push.
for rep in 1 2; do
	for op in pull push; do
		line=$(awk -v r=$rep -v o=$op '$1 == r && $2 == o' "$dir/out")
		set -- $line
		[ $# = 5 ] || { bad "no line for rep $rep $op"; continue; }
		case $4 in '' | *[!0-9]*) bad "embstore rate '$4' ($op)" ;; esac
		[ "${4:-0}" -gt 0 ] 2>/dev/null || bad "embstore rate 0 ($op)"
		if [ -n "$pslite" ]; then
			[ "$3" -gt 0 ] 2>/dev/null || bad "ps-lite rate '$3' ($op)"
			awk -v x="$5" 'BEGIN { exit !(x > 0) }' ||
				bad "ratio '$5' ($op)"
		else
			[ "$3" = - ] && [ "$5" = - ] ||
				bad "ps-lite ran without a source: $line"
		fi
	done
done

n=$(grep -c 'embstore / ps-lite' "$dir/out")
if [ -n "$pslite" ]; then
	[ "$n" = 2 ] || bad "$n median lines, want 2"
	grep -q '^pull: embstore / ps-lite [0-9.]*x ([0-9.]*\.\.[0-9.]*), 2 reps$' \
		"$dir/out" || bad "no pull median line"
	want=8
else
	[ "$n" = 0 ] || bad "median lines without ps-lite"
	grep -q 'embstore only' "$dir/err" || bad "no note that ps-lite is absent"
	want=4
fi

# The JSON lines: one per run, each system's own keys, all fig "pslite".
got=$(jq -s 'length' "$dir/runs.jsonl" 2>/dev/null)
[ "$got" = "$want" ] || bad "$got JSON lines, want $want"
jq -e -s 'all(.fig == "pslite" and .rows_per_s > 0 and .dim == 8
	and .batches == 20
	and .batch == 64 and (.op == "pull" or .op == "push")
	and (.rep == 1 or .rep == 2))' "$dir/runs.jsonl" >/dev/null ||
	bad "bad JSON lines: $(cat "$dir/runs.jsonl")"
jq -e -s '[.[] | select(.backend == "client")] | length == 4' \
	"$dir/runs.jsonl" >/dev/null || bad "not 4 embstore runs"
if [ -n "$pslite" ]; then
	jq -e -s '[.[] | select(.backend == "ps-lite" and .van == "zmq"
		and .unique_per_batch > 0)] | length == 4' \
		"$dir/runs.jsonl" >/dev/null || bad "not 4 ps-lite runs"
fi

# The driver's ps-lite server holds what it was given: every preloaded
# row pulled back in requests of 16 keys (a batch in several parts, the
# last one short) equals what was written, before a pull and a push run.
if [ -n "$pslite" ]; then
	w1=${PSLITE_BUILD:-$build/pslite}/pslite-w1
	for op in pull push; do
		if ! timeout 300 "$w1" --op $op --check --rows 5000 --dim 8 \
			--batch 64 --part-ids 16 --batches 5 --warmup 0 --json \
			>"$dir/check" 2>"$dir/check.err"; then
			bad "pslite-w1 --check --op $op: $(tail -3 "$dir/check.err")"
		elif ! jq -e '.batches == 5 and .rows_per_s > 0' "$dir/check" \
			>/dev/null; then
			bad "pslite-w1 --check --op $op: $(cat "$dir/check")"
		fi
	done
fi

# bench-report.sh --summary takes the lines: a row per system and op, and
# with ps-lite the ratio within each repetition.
"$src/tools/bench-report.sh" --summary "$dir/runs.jsonl" >"$dir/summary" ||
	bad "bench-report.sh --summary failed"
n=$(grep -c '^pslite	' "$dir/summary")
[ "$n" = $((want / 2)) ] || bad "$n pslite rows in the summary, want $((want / 2))"
if [ -n "$pslite" ]; then
	grep -q '^pslite push embstore/ps-lite, zipf	[0-9.]*	([0-9.]*\.\.[0-9.]*)	n=2$' \
		"$dir/summary" || bad "no push ratio in the summary"
elif grep -q 'embstore/ps-lite' "$dir/summary"; then
	bad "a ratio without ps-lite runs"
fi

# -i: the same run then measures the store in process against the raw
# loops: per ids (DIST and uniform) a row of median batches a round and
# the four ratios, and one JSON object per in-process run, fig "inproc".
if ! "$src/tools/pslite-compare.sh" -b "$build" -r 1 -N 10 -w 0 -n 5000 \
	-B 64 -D 8 -i 1 -o "$dir/inproc.jsonl" >"$dir/out.i" 2>"$dir/err.i"; then
	bad "pslite-compare.sh -i 1 exited $?: $(tail -3 "$dir/err.i")"
fi
for d in zipf:1.05 uniform; do
	awk -v d="$d" '$1 == 1 && $2 == d && NF == 8' "$dir/out.i" | grep -q . ||
		bad "no round line for $d: $(cat "$dir/out.i")"
	for r in 'push / raw-apply' 'push / raw-index-apply' \
		'pull / raw-gather' 'pull / raw-index-gather'; do
		grep -q "^in process, $d: $r [0-9.]*x ([0-9.]*\.\.[0-9.]*), 1 rounds$" \
			"$dir/out.i" || bad "no '$r' ratio for $d"
	done
done
jq -e -s '[.[] | select(.fig == "inproc" and .round == 1
	and .backend != "client" and .batches == 10)] | length == 12' \
	"$dir/inproc.jsonl" >/dev/null ||
	bad "not 12 in-process runs: $(jq -c '{fig,op,dist}' "$dir/inproc.jsonl")"

# Bad options are refused before anything runs.
if "$src/tools/pslite-compare.sh" -b "$build" -r x >/dev/null 2>&1; then
	bad "-r x was accepted"
fi
if "$src/tools/pslite-compare.sh" -b "$build" -N 0 >/dev/null 2>&1; then
	bad "-N 0 was accepted"
fi
if "$src/tools/pslite-compare.sh" -b "$build" -i x >/dev/null 2>&1; then
	bad "-i x was accepted"
fi
if "$src/tools/pslite-compare.sh" -b "$build" -r 1 "$dir" >/dev/null 2>&1; then
	bad "a directory without ps-lite was accepted as its source"
fi
[ $fail = 0 ] || cat "$dir/err" >&2
exit $fail
