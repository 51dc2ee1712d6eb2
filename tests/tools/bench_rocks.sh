#!/bin/bash
# tests/tools/bench_rocks.sh SRC BUILD - the device tier's RocksDB baseline
# (docs/benchmarks.md, tools/bench-tier.sh --rocksdb) on a tiny table:
# embstore-bench-rocks runs each op at each share beside the tier and
# prints its rate, reads a batch and peak RSS, with a JSON line
# ("backend": "rocksdb") each; its pushes are read-modify-writes that lose
# nothing (--verify); and its databases are gone afterwards. SKIP (77)
# where embstore-bench-rocks is not built (no librocksdb-dev) or jq is
# missing.
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_rocks.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
rocks=$BUILD/tools/embstore-bench-rocks
command -v jq >/dev/null 2>&1 || exit 77
[ -x "$rocks" ] || { echo "SKIP: no $rocks (librocksdb-dev)"; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-rocks-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0

"$SRC/tools/bench-tier.sh" -b "$BUILD" --dir "$work" --rows 40000 \
	--dim 16 --shares "100 50" --ops "pull:zipf:1.05 push:uniform" \
	--warmup 0 --duration 0.3 --json "$work/tier.jsonl" --rocksdb \
	>"$work/out.txt" 2>&1 ||
	bad "bench-tier.sh --rocksdb failed: $(tail -5 "$work/out.txt")"
cat "$work/out.txt"
for op in "pull zipf:1.05" "push uniform"; do
	for share in 100 50; do
		grep -q "^$share % in DRAM: $op [0-9.]* M rows/s" \
			"$work/out.txt" || bad "no tier line for $op at $share"
		grep -q "^$share % in DRAM, RocksDB: $op [0-9.]* M rows/s, [0-9.]*x of embstore, p50 [0-9]* us, [0-9]* reads a batch, [0-9]* reads/s.*, [0-9]* writes/s, peak RSS [0-9]* MiB" \
			"$work/out.txt" || bad "no RocksDB line for $op at $share"
	done
done
[ "$(jq -s '[.[] | select(.backend == "rocksdb")] | length' \
	"$work/tier.jsonl")" -eq 4 ] || bad "not 4 RocksDB JSON lines"
[ "$(jq -s '[.[] | select(.backend == "store")] | length' \
	"$work/tier.jsonl")" -eq 4 ] || bad "not 4 store JSON lines"
# Every row is in RocksDB's files, and its budget is the share's limit.
jq -e -s 'all(.[] | select(.backend == "rocksdb");
	.rows_cold == 40000 and .rows_held == 40000 and
	.tier_file_bytes > 40000 * 64 and .mem_limit > 0)' \
	"$work/tier.jsonl" >/dev/null || bad "RocksDB JSON: rows or file wrong"
# Read-modify-write: every acknowledged push is in the rows, exactly; and
# the pushes reached the device (40 batches of ~4000 rows of 32 bytes
# overflow the 1 MiB memtables: flushes).
"$rocks" --rows 20000 --dim 8 --op push --batches 40 --verify --json \
	--mem-limit 8M --tier-dir "$work" --threads 2 >"$work/verify.txt" 2>&1 ||
	bad "embstore-bench-rocks --verify failed: $(tail -3 "$work/verify.txt")"
grep -q "^verify: [1-9][0-9]* rows checked, 0 mismatched" \
	"$work/verify.txt" || bad "no verify line: $(cat "$work/verify.txt")"
grep '^{' "$work/verify.txt" | jq -e '.tier_writes > 0' >/dev/null ||
	bad "RocksDB pushes wrote nothing to the device"

# Bad input: RocksDB needs a place and a budget.
"$rocks" --rows 1000 --op pull --duration 0.1 >"$work/bad.txt" 2>&1 &&
	bad "embstore-bench-rocks ran without --tier-dir"
grep -q "needs --tier-dir" "$work/bad.txt" ||
	bad "no reason given: $(cat "$work/bad.txt")"

# The databases are removed with their tables.
ls -d "$work"/*.rocksdb "$work"/*/*.rocksdb >/dev/null 2>&1 &&
	bad "a RocksDB database was left behind"
[ "$fail" -eq 0 ] || exit 1
echo "ok: the RocksDB baseline printed every figure"
