#!/usr/bin/env bash
# tools/bench-plot-cluster.sh - the control-plane plots of
# docs/benchmarks.md from the JSON lines tools/bench-cluster.sh wrote,
# against the job's node count: median of the repetitions, min..max as
# error bars, and under each size how many of its runs ended clean. Needs
# jq and gnuplot (pngcairo).
#
#   tools/bench-plot-cluster.sh [RESULTS] [OUTDIR]
#   (defaults: out/bench/cluster.jsonl, docs/img)
#
# Writes OUTDIR/cluster-formation.png (ready, formation and failover
# time) and OUTDIR/cluster-sched.png (the scheduler's CPU as % of one core
# over the whole run and between formation and the kill, and the bytes its
# connections carried per second per node between formation and the kill:
# the heartbeats' cost). A run that failed still has the figures it
# reached (a cluster whose workers never all joined still has the
# scheduler's ready time); a figure no run of a size reached is left out.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
in=${1:-$root/out/bench/cluster.jsonl}
outdir=${2:-$root/docs/img}

for t in jq gnuplot; do
	command -v $t >/dev/null || {
		echo "bench-plot-cluster: needs $t" >&2
		exit 1
	}
done
[ -s "$in" ] || { echo "bench-plot-cluster: no results in $in" >&2; exit 1; }
mkdir -p "$outdir"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-plot-cluster.XXXXXX")
trap 'rm -rf "$work"' EXIT

# series KEY [SCALE]: "nodes median min max" of KEY times SCALE, sorted by
# nodes; sizes where no run has KEY are left out.
series() {
	jq -rs --arg k "$1" --argjson m "${2:-1}" '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	map(select(.fig == "cluster")) | group_by(.nodes)[]
	| map(.[$k] | select(. != null) * $m) as $v
	| select($v | length > 0)
	| "\(.[0].nodes) \($v | med) \($v | min) \($v | max)"' "$in" | sort -n
}

series ready_s >"$work/ready.dat"
series formation_s >"$work/formation.dat"
series failover_s >"$work/failover.dat"
series sched_cpu_pct >"$work/cpu.dat"
series steady_cpu_pct >"$work/cpu-steady.dat"
series steady_bytes_per_s_per_node >"$work/bytes.dat"

# Under each size, its clean runs of all: "ok 3/3", "ok 0/1".
labels=$(jq -rs '
	map(select(.fig == "cluster")) | group_by(.nodes)[]
	| "set label \"ok \(map(select(.outcome == "ok")) | length)/\(length)\" at \(.[0].nodes), graph 0.04 center font \",8\""' "$in")
runs=$(jq -s 'map(select(.fig == "cluster")) | length' "$in")
range=$(jq -rs 'map(select(.fig == "cluster") | .nodes)
	| "[\(min / 1.5):\(max * 1.5)]"' "$in")
xtics=$(jq -rs 'map(select(.fig == "cluster") | .nodes) | unique
	| map(tostring) | join(", ")' "$in")

# plot PNG YLABEL TITLE Y2LABEL FILE TITLE [AXES] ...: yerrorlines of
# each FILE that has points.
plot() {
	local png=$1 ylabel=$2 title=$3 y2label=$4 cmd="" sep="" f t ax
	shift 4
	while [ $# -gt 0 ]; do
		f=$1 t=$2 ax=$3
		shift 3
		[ -s "$f" ] || continue
		cmd="$cmd$sep'$f' using 1:2:3:4 axes x1$ax with yerrorlines title '$t'"
		sep=", "
	done
	[ -n "$cmd" ] || {
		echo "bench-plot-cluster: nothing for $png" >&2
		return 0
	}
	gnuplot <<EOF
set terminal pngcairo size 800,500 font ",10"
set output '$png'
set title "$title"
set xlabel 'nodes in the job (servers + workers, 1 server to 9 workers)'
set ylabel '$ylabel'
set logscale x 10
set xrange $range
set xtics ($xtics)
set yrange [0:*]
$(if [ -n "$y2label" ]; then
	printf "set y2label '%s'\nset y2tics\nset ytics nomirror\nset y2range [0:*]\n" "$y2label"
fi)
set grid
set key top left
set pointsize 0.8
$labels
plot $cmd
EOF
	echo "bench-plot-cluster: wrote $png"
}

plot "$outdir/cluster-formation.png" 'seconds (median, bars: min..max)' \
	"embstore launch --replicas 2, one server SIGKILLed: formation and failover ($runs runs)" '' \
	"$work/ready.dat" 'ready: launch start to the scheduler saying cluster ready' y1 \
	"$work/formation.dat" 'formation: launch start to the last worker joined' y1 \
	"$work/failover.dat" 'failover: SIGKILL to the last worker on the new map' y1
plot "$outdir/cluster-sched.png" 'scheduler CPU, % of one core (median, bars: min..max)' \
	"the scheduler's CPU and heartbeat traffic ($runs runs)" \
	'bytes/s per node, sent + received (right axis)' \
	"$work/cpu.dat" 'CPU %, whole run' y1 \
	"$work/cpu-steady.dat" 'CPU %, formed to the kill (heartbeats)' y1 \
	"$work/bytes.dat" 'bytes/s per node, formed to the kill (right axis)' y2
