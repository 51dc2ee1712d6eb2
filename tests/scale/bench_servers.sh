#!/bin/sh
# tests/scale/bench_servers.sh SRC BUILD - docs/benchmarks.md's "Step time
# against the number of servers" commands on a tiny table: one repetition
# of tools/bench-servers.sh over 1 and 2 servers, on loopback and through
# netem (skipped, not failed, without sch_netem), then its --summary and
# --plot. Every run must leave one JSON line with the step's figures.
# Exits 77 (SKIP) without jq or gnuplot, or without root (namespaces).
set -u
src=$(cd "${1:?usage: bench_servers.sh SRC BUILD}" && pwd)
build=$(cd "${2:?usage: bench_servers.sh SRC BUILD}" && pwd)
for t in jq gnuplot; do
	command -v $t >/dev/null 2>&1 || { echo "SKIP: no $t"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-benchsrv-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$src/tools/bench-servers.sh" -b "$build" -o "$work/r.jsonl" -r 1 -d 0.5 \
	-n "1 2" --rows 2000 --dim 8 --batch 256 loop netem ||
	fail "bench-servers.sh exited with $?"
# 2 loopback runs, and 2 netem runs where the kernel has netem.
n=$(wc -l <"$work/r.jsonl")
[ "$n" -eq 2 ] || [ "$n" -eq 4 ] || fail "$n results, not 2 or 4"
jq -e 'select(.fig != "servers" or .op != "step" or .batch != 256
	or .dim != 8 or .p50_us <= 0 or .p99_us < .p50_us
	or .rows_per_s <= 0 or (.servers | IN(1, 2) | not))' \
	"$work/r.jsonl" && fail "a result lacks its figures"
"$src/tools/bench-servers.sh" --summary "$work/r.jsonl" | tee "$work/sum"
[ "$(grep -c ' loop ' "$work/sum")" -eq 2 ] || fail "summary lacks loop rows"
"$src/tools/bench-servers.sh" --plot "$work/r.jsonl" "$work/p.png" ||
	fail "no plot"
[ -s "$work/p.png" ] || fail "empty plot"
echo "bench-servers: $n runs, summary and plot: ok"
