#!/bin/bash
# tests/tools/bench_tier.sh SRC BUILD - docs/benchmarks.md's tier figures
# on a tiny table: tools/bench-tier.sh runs each op all in DRAM and with
# half the rows on the device, prints a line for each with the share of
# rows on the device, the device reads and the ratio to all in DRAM, and
# writes its JSON lines; with gnuplot there, the plot too. Needs jq (else
# SKIP). The RocksDB baseline beside it is tests/tools/bench_rocks.sh.
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_tier.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
command -v jq >/dev/null 2>&1 || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-tier-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
plot=
command -v gnuplot >/dev/null 2>&1 && plot=$work/tier.png
"$SRC/tools/bench-tier.sh" -b "$BUILD" --dir "$work" --rows 40000 \
	--dim 16 --shares "100 50" --ops "pull:zipf:1.05 push:uniform" \
	--warmup 0 --duration 0.3 --json "$work/tier.jsonl" --no-rocksdb \
	${plot:+--plot "$plot"} >"$work/out.txt" 2>&1 ||
	bad "bench-tier.sh failed: $(tail -5 "$work/out.txt")"
cat "$work/out.txt"

grep -q '^device: ' "$work/out.txt" || bad "no device line"
for op in "pull zipf:1.05" "push uniform"; do
	grep -q "^100 % in DRAM: $op [0-9.]* M rows/s" "$work/out.txt" ||
		bad "no all-in-DRAM line for $op"
	grep -q "^50 % in DRAM: $op [0-9.]* M rows/s, [0-9.]*x of all in DRAM, p50 [0-9]* us, [0-9]* rows on the device, [0-9]* reads/s" \
		"$work/out.txt" || bad "no tier line for $op"
done
# Half the rows, more or less, went to the device: the limit is sized
# for it (the indexes take some of it too).
n=$(jq -s '[.[] | select(.share == 50) | .rows_cold] | min' \
	"$work/tier.jsonl")
[ "$n" -ge 12000 ] && [ "$n" -le 36000 ] ||
	bad "rows on the device at 50 %: $n of 40000"
[ "$(jq -s 'length' "$work/tier.jsonl")" -eq 4 ] || bad "not 4 JSON lines"
[ -z "$plot" ] || [ -s "$plot" ] || bad "no plot"
# The tier's files are gone with their tables.
ls "$work"/*/*.tier >/dev/null 2>&1 && bad "a tier file was left behind"
[ "$fail" -eq 0 ] || exit 1
echo "ok: bench-tier.sh printed every figure"
