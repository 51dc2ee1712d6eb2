#!/usr/bin/env bash
# tools/bench-plot.sh - the plots of docs/benchmarks.md from the JSON lines
# that tools/bench-report.sh wrote: rows/s against batch size and against
# dim, median of the repetitions with min..max as error bars. Needs jq and
# gnuplot (Debian's gnuplot-nox has the pngcairo terminal).
#
#   tools/bench-plot.sh [RESULTS] [OUTDIR]
#   (defaults: out/bench/results.jsonl, docs/img)
#
# Writes OUTDIR/bench-batch.png (in-process pull and push, loopback TCP
# pull, over batch 256..16384 at dim 64) and OUTDIR/bench-dim.png
# (in-process pull and push over dim 8..512 at batch 4096), both Zipf(1.05)
# over 1M rows, one thread; and OUTDIR/bench-scale.png (in-process pull and
# row creation against the table's size, from bench-report.sh's `scale`
# section). A plot whose figures are not in RESULTS is left as it is.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
in=${1:-$root/out/bench/results.jsonl}
outdir=${2:-$root/docs/img}

for t in jq gnuplot; do
	command -v $t >/dev/null || { echo "bench-plot: needs $t" >&2; exit 1; }
done
[ -s "$in" ] || { echo "bench-plot: no results in $in" >&2; exit 1; }
mkdir -p "$outdir"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-plot.XXXXXX")
trap 'rm -rf "$work"' EXIT

# series FIG OP XKEY [YKEY]: "x median min max" in M rows/s (YKEY, default
# rows_per_s), sorted by x.
series() {
	jq -rs --arg fig "$1" --arg op "$2" --arg x "$3" \
		--arg y "${4:-rows_per_s}" '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	map(select(.fig == $fig and .op == $op and (.threads // 1) == 1
		and .[$y] != null))
	| group_by(.[$x])[]
	| map(.[$y] / 1e6) as $r
	| "\(.[0][$x]) \($r | med) \($r | min) \($r | max)"' "$in" |
		sort -n
}

series batch pull batch >"$work/batch-pull.dat"
series batch push batch >"$work/batch-push.dat"
series tcp-batch pull batch >"$work/batch-tcp.dat"
series dim pull dim >"$work/dim-pull.dat"
series dim push dim >"$work/dim-push.dat"
series scale pull rows >"$work/scale-pull.dat"
series scale pull rows preload_rows_per_s >"$work/scale-create.dat"

reps=$(jq -s 'map(.rep) | unique | length' "$in")
sreps=$(jq -s 'map(select(.fig == "scale") | .rep) | unique | length' "$in")

# One plot; a series with no points is left out (gnuplot fails on it).
# XLOG is gnuplot's log base for x (2 or 10).
plot() {
	local png=$1 xlabel=$2 title=$3 xlog=${XLOG:-2} xrange=${XRANGE:-[*:*]}
	shift 3
	local cmd="" f t sep=""
	while [ $# -gt 0 ]; do
		f=$1 t=$2
		shift 2
		[ -s "$f" ] || continue
		cmd="$cmd$sep'$f' using 1:2:3:4 with yerrorlines title '$t'"
		sep=", "
	done
	[ -n "$cmd" ] || { echo "bench-plot: nothing for $png" >&2; return 0; }
	gnuplot <<EOF
set terminal pngcairo size 800,500 font ",10"
set output '$png'
set title "$title"
set xlabel '$xlabel'
set ylabel 'M rows/s (median, bars: min..max)'
set logscale x $xlog
set xrange $xrange
set format x '${XFORMAT:-% h}'
set logscale y 2
set grid
set key below
set pointsize 0.8
plot $cmd
EOF
	echo "bench-plot: wrote $png"
}

plot "$outdir/bench-batch.png" 'ids per batch' \
	"rows/s vs batch: 1M rows, dim 64, Zipf 1.05, 1 thread ($reps runs)" \
	"$work/batch-pull.dat" 'in-process pull' \
	"$work/batch-push.dat" 'in-process push (SGD)' \
	"$work/batch-tcp.dat" 'loopback TCP pull (net\_rate, 1 server, 2 loops)'
plot "$outdir/bench-dim.png" 'dim (floats per row)' \
	"rows/s vs dim: 1M rows, batch 4096, Zipf 1.05, 1 thread ($reps runs)" \
	"$work/dim-pull.dat" 'in-process pull' \
	"$work/dim-push.dat" 'in-process push (SGD)'
# Half a decade of room either side of the sizes measured.
srange=$(awk 'NR == 1 { lo = $1 } { hi = $1 }
	END { if (NR) printf "[%g:%g]", lo / 2, hi * 2; else print "[*:*]" }' \
	"$work/scale-pull.dat")
XLOG=10 XRANGE=$srange XFORMAT='%.0s%c' plot "$outdir/bench-scale.png" 'rows in the table' \
	"rows/s vs table size: dim 16, SGD, uniform ids, batch 4096, 1 thread ($sreps runs)" \
	"$work/scale-pull.dat" 'in-process pull' \
	"$work/scale-create.dat" 'in-process row creation (preload)'
