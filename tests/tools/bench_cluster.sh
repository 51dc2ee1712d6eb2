#!/bin/bash
# tests/tools/bench_cluster.sh SRC BUILD - the control-plane commands of
# docs/benchmarks.md at a tiny size: tools/bench-cluster.sh runs one job of
# 2 servers and 4 workers (--replicas 2, a server SIGKILLed while they
# push) and writes its JSON line: formed, failed over, every worker clean,
# the scheduler's CPU and bytes sampled and its /metrics counters read.
# --summary gives the size's line, and tools/bench-plot-cluster.sh draws
# both plots (when gnuplot is there). Then a run cut short by -t: its
# outcome is "timeout" and nothing it started is left. Needs jq, curl and
# ss, as the script does (else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: bench_cluster.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
for t in jq curl ss timeout flock; do
	command -v $t >/dev/null 2>&1 || exit 77
done
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE EMB_HEARTBEAT_TIMEOUT

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench-cluster-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail=0
out=$work/cluster.jsonl

# left DIR: pids of processes whose cwd is under DIR.
left() {
	local p
	for p in /proc/[0-9]*; do
		case $(readlink "$p/cwd" 2>/dev/null) in
		"$1"/*) echo "${p#/proc/}" ;;
		esac
	done
}

"$SRC/tools/bench-cluster.sh" -b "$BUILD" -o "$out" -n 2+4 -r 1 -d 4 -k 1 \
	-t 120 >"$work/run.log" 2>&1 ||
	bad "bench-cluster.sh: $(tail -5 "$work/run.log")"
[ "$(wc -l <"$out")" = 1 ] || bad "not one JSON line: $(cat "$out")"
jq -e '.fig == "cluster" and .nodes == 6 and .servers == 2 and
	.workers == 4 and .replicas == 2 and .rep == 1 and
	.outcome == "ok" and .exit == 0 and .killed_mid_run and
	.workers_clean == 4 and .workers_mismatched == 0 and
	.declared_dead == 1 and .workers_lost_sched == 0 and
	.ready_s > 0 and .formation_s > 0 and .detect_s >= 0 and
	.failover_sched_s >= 0 and .failover_s >= 0 and
	.workers_new_map == 4 and
	.sched_cpu_s >= 0 and .sched_cpu_pct >= 0 and .sched_bytes > 0 and
	.sched_bytes_per_s_per_node > 0 and .sched_io_bytes > 0 and
	.form_bytes_per_node > 0 and .workers_joined == 4 and
	.sched_heartbeats > 0 and .heartbeats_per_s_per_node > 0 and
	.sched_stall_ms >= 0 and .sched_self_suspicions >= 0 and
	.map_epoch == 2 and (.commit | length > 0) and
	(.load1 | type == "number")' "$out" >/dev/null ||
	bad "JSON: $(cat "$out"); $(tail -5 "$work/run.log")"

"$SRC/tools/bench-cluster.sh" --summary "$out" >"$work/summary" ||
	bad "bench-cluster.sh --summary"
grep -q '^6	2+4	1	.*	ok x1$' "$work/summary" ||
	bad "summary: $(cat "$work/summary")"

if command -v gnuplot >/dev/null 2>&1; then
	"$SRC/tools/bench-plot-cluster.sh" "$out" "$work/img" \
		>"$work/plot.log" 2>&1 ||
		bad "bench-plot-cluster.sh: $(cat "$work/plot.log")"
	for f in cluster-formation cluster-sched; do
		[ -s "$work/img/$f.png" ] || bad "no $f.png"
	done
fi

# A run past its -t: the whole launch is stopped, the line says so, and
# no process of it is left.
"$SRC/tools/bench-cluster.sh" -b "$BUILD" -o "$work/short.jsonl" -n 2+4 \
	-r 1 -d 60 -k 30 -t 3 >"$work/short.log" 2>&1 ||
	bad "bench-cluster.sh -t 3: $(tail -5 "$work/short.log")"
jq -e '.outcome == "timeout" and .exit == 124 and .killed_mid_run == false' \
	"$work/short.jsonl" >/dev/null ||
	bad "-t 3: $(cat "$work/short.jsonl")"
pids=$(left "$(dirname "$out")")
[ -z "$pids" ] || bad "left running: $(ps -o pid,args -p "${pids//$'\n'/,}")"
[ $fail = 0 ] && echo "bench_cluster: ok"
exit $fail
