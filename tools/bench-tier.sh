#!/usr/bin/env bash
# tools/bench-tier.sh - the device tier's figures (docs/store.md, "The
# device tier"; docs/benchmarks.md, "Tables larger than memory"): rows/s of
# an in-process table with a share of its rows in DRAM and the rest on the
# device, against the same table all in DRAM, in one run; beside them the
# device's own random 4 KiB read rate (fio, O_DIRECT, io_uring, 64 in
# flight, on a file in the same directory), and the same workload on a
# RocksDB database with the same DRAM budget (embstore-bench-rocks).
#
#   tools/bench-tier.sh [-b BUILD] [--dir DIR] [--rows N] [--dim D]
#       [--shares "100 50 20 10"] [--ops "pull:zipf:1.05 ..."]
#       [--warmup S] [--duration S] [--json FILE] [--plot PNG]
#       [--rocksdb | --no-rocksdb]
#
# Each op is OP:DIST (embstore-bench's --op and --dist). A share S < 100
# runs with --mem-limit sized so that S % of the rows fit the slabs the
# limit allows (three quarters of it, less the table's fixed part) and
# --tier-dir DIR; 100 runs without a limit or tier. One line per run, and
# with --json one JSON object per run (embstore-bench's, plus "share" and
# "fio_iops") appended to FILE; --plot draws rows/s against the share
# (gnuplot). Exit 1 if a run fails.
#
# RocksDB: where BUILD has tools/embstore-bench-rocks (built when librocksdb
# is found), each share also runs the same op on a RocksDB database in DIR
# with the share's limit as its block cache and memtables (100 too: the
# limit that holds every row), one more line and JSON object each
# ("backend": "rocksdb"), and a dashed line in the plot. --rocksdb fails
# without the program; --no-rocksdb leaves RocksDB out.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
dir=${TMPDIR:-/tmp}
rows=4000000
dim=64
shares="100 50 20 10"
ops="pull:zipf:1.05 pull:uniform push:zipf:1.05"
warmup=20
duration=5
json=
plot=
rocksdb=auto

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--rows) rows=$2; shift 2 ;;
	--dim) dim=$2; shift 2 ;;
	--shares) shares=$2; shift 2 ;;
	--ops) ops=$2; shift 2 ;;
	--warmup) warmup=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--json) json=$2; shift 2 ;;
	--plot) plot=$2; shift 2 ;;
	--rocksdb) rocksdb=yes; shift ;;
	--no-rocksdb) rocksdb=no; shift ;;
	-h|--help) usage ;;
	*) echo "bench-tier: unknown argument '$1'" >&2; usage ;;
	esac
done

bench=$build/tools/embstore-bench
[ -x "$bench" ] || { echo "bench-tier: no $bench (build first)" >&2; exit 1; }
rbench=
if [ "$rocksdb" != no ]; then
	if [ -x "$build/tools/embstore-bench-rocks" ]; then
		rbench=$build/tools/embstore-bench-rocks
	elif [ "$rocksdb" = yes ]; then
		echo "bench-tier: no $build/tools/embstore-bench-rocks" \
			"(librocksdb-dev, then build)" >&2
		exit 1
	fi
fi
command -v jq >/dev/null || { echo "bench-tier: needs jq" >&2; exit 1; }
[ -d "$dir" ] || { echo "bench-tier: no directory $dir" >&2; exit 1; }
work=$(mktemp -d "$dir/bench-tier.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A record with SGD: 16 bytes of header and dim floats, to 8 bytes.
record=$(( (16 + 4 * dim + 7) / 8 * 8 ))
# The table's fixed part (store.h): the arena's first extent, its tail,
# and the structs; measured 4.1 to 4.3 MiB.
fixed=$(( 9 * 1024 * 1024 / 2 ))

# The device's reference: random 4 KiB O_DIRECT reads, 64 in flight, on a
# file the size of the table's rows (at most 4 GiB, at least 64 MiB).
fio_iops=0
if command -v fio >/dev/null; then
	size=$(( rows * record ))
	[ $size -gt $((4 << 30)) ] && size=$((4 << 30))
	[ $size -lt $((64 << 20)) ] && size=$((64 << 20))
	if fio --name=ref --filename="$work/fio.dat" --size=$size \
		--direct=1 --rw=randread --bs=4k --ioengine=io_uring \
		--iodepth=64 --runtime=5 --time_based --output-format=json \
		>"$work/fio.json" 2>"$work/fio.err"; then
		fio_iops=$(jq '.jobs[0].read.iops | floor' "$work/fio.json")
	else
		echo "bench-tier: fio failed: $(tail -1 "$work/fio.err")" >&2
	fi
	rm -f "$work/fio.dat"
fi
if [ "$fio_iops" -gt 0 ]; then
	echo "device: fio random 4 KiB reads, O_DIRECT, io_uring, 64 in flight: $fio_iops IOPS"
else
	echo "device: no fio; the device's read rate is not measured"
fi

fail=0
for op in $ops; do
	o=${op%%:*}
	dist=${op#*:}
	base=
	for share in $shares; do
		args=(--in-process --rows "$rows" --dim "$dim" --op "$o"
		      --dist "$dist" --warmup "$warmup" --duration "$duration"
		      --json)
		if [ "$share" -lt 100 ]; then
			slabs=$(( rows * record * share / 100 ))
			limit=$(( (slabs + fixed) * 4 / 3 ))
			args+=(--mem-limit "$limit" --tier-dir "$work")
		fi
		if ! "$bench" "${args[@]}" >"$work/run.json" \
			2>"$work/run.err"; then
			echo "bench-tier: $o $dist at $share %: $(tail -3 "$work/run.err")" >&2
			fail=1
			continue
		fi
		jq -c --argjson share "$share" --argjson fio "$fio_iops" \
			'. + {share: $share, fio_iops: $fio}' \
			"$work/run.json" >"$work/line.json"
		[ -n "$json" ] && cat "$work/line.json" >>"$json"
		rate=$(jq '.rows_per_s' "$work/line.json")
		[ "$share" -eq 100 ] && base=$rate
		jq -r --argjson base "${base:-0}" --arg op "$o $dist" '
			"\(.share) % in DRAM: \($op) " +
			"\((.rows_per_s / 1e6 * 100 | round) / 100) M rows/s" +
			(if $base > 0 and .share < 100 then
			   ", \((.rows_per_s / $base * 1000 | round) / 1000)x of all in DRAM"
			 else "" end) +
			", p50 \(.p50_us | round) us" +
			(if .rows_cold then
			   ", \(.rows_cold) rows on the device" +
			   ", \((.tier_reads / .elapsed_s) | round) reads/s" +
			   (if .fio_iops > 0 then
			      " = \((.tier_reads / .elapsed_s / .fio_iops * 100) | round) % of fio"
			    else "" end)
			 else "" end) +
			", peak RSS \((.rss_peak_bytes / 1048576) | round) MiB"' \
			"$work/line.json"
		[ -n "$rbench" ] || continue
		# RocksDB at every share, 100 too: its budget is the limit
		# the share's rows need in the tier.
		slabs=$(( rows * record * share / 100 ))
		limit=$(( (slabs + fixed) * 4 / 3 ))
		if ! "$rbench" --rows "$rows" --dim "$dim" --op "$o" \
			--dist "$dist" --warmup "$warmup" \
			--duration "$duration" --mem-limit "$limit" \
			--tier-dir "$work" --json >"$work/run.json" \
			2>"$work/run.err"; then
			echo "bench-tier: RocksDB $o $dist at $share %: $(tail -3 "$work/run.err")" >&2
			fail=1
			continue
		fi
		tier=$(jq '.rows_per_s' "$work/line.json")
		jq -c --argjson share "$share" --argjson fio "$fio_iops" \
			'. + {share: $share, fio_iops: $fio}' \
			"$work/run.json" >"$work/line.json"
		[ -n "$json" ] && cat "$work/line.json" >>"$json"
		jq -r --argjson tier "$tier" --arg op "$o $dist" '
			"\(.share) % in DRAM, RocksDB: \($op) " +
			"\((.rows_per_s / 1e6 * 100 | round) / 100) M rows/s" +
			", \((.rows_per_s / $tier * 1000 | round) / 1000)x of" +
			" embstore" +
			", p50 \(.p50_us | round) us" +
			", \((.tier_reads / .batches) | round) reads a batch" +
			", \((.tier_reads / .elapsed_s) | round) reads/s" +
			(if .fio_iops > 0 then
			   " = \((.tier_reads / .elapsed_s / .fio_iops * 100) | round) % of fio"
			 else "" end) +
			", \((.tier_writes / .elapsed_s) | round) writes/s" +
			", peak RSS \((.rss_peak_bytes / 1048576) | round) MiB"' \
			"$work/line.json"
	done
done

if [ -n "$plot" ]; then
	[ -n "$json" ] || { echo "bench-tier: --plot needs --json" >&2; exit 2; }
	command -v gnuplot >/dev/null || {
		echo "bench-tier: --plot needs gnuplot" >&2; exit 1; }
	set --
	k=0
	for op in $ops; do
		o=${op%%:*}
		dist=${op#*:}
		k=$((k + 1))
		f=$work/plot.$o.${dist//:/_}
		jq -r --arg o "$o" --arg d "$dist" \
			'select(.op == $o and .dist == $d and
			        .backend != "rocksdb") |
			 "\(.share) \(.rows_per_s / 1e6)"' "$json" |
			sort -n >"$f"
		set -- "$@" "'$f' using 1:2 with linespoints lt $k dt 1 title '$o $dist'"
		[ -n "$rbench" ] || continue
		jq -r --arg o "$o" --arg d "$dist" \
			'select(.op == $o and .dist == $d and
			        .backend == "rocksdb") |
			 "\(.share) \(.rows_per_s / 1e6)"' "$json" |
			sort -n >"$f.rocksdb"
		set -- "$@" "'$f.rocksdb' using 1:2 with linespoints lt $k dt 2 title '$o $dist, RocksDB'"
	done
	gnuplot <<EOF
set terminal pngcairo size 800,500
set output '$plot'
set title "In-process table, $rows rows x dim $dim, with a share in DRAM${rbench:+\\n(dashed: RocksDB, the same DRAM budget)}"
set xlabel 'rows in DRAM (%)'
set ylabel 'M rows/s'
set logscale y
set key top left
plot $(IFS=,; echo "$*")
EOF
	echo "plot: $plot"
fi
exit $fail
