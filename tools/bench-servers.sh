#!/usr/bin/env bash
# tools/bench-servers.sh - one worker's step time and rows/s against the
# number of servers, at a fixed batch: embstore-bench --op step (a pull,
# then a push of the same batch) from one worker of a job with S servers,
# for S in 1 2 4 8 16 32. Appends one JSON object per run (the bench's
# --json, plus fig "servers", net, servers, rep, where, load) to a results
# file; --summary FILE prints the medians and spreads, --plot FILE PNG
# draws them.
#
# Networks (sections, all by default, in this order):
#   loop    `embstore launch`: every process on loopback
#   bridge  tests/scale/netdc.sh --delay 0: 4 network namespaces on a
#           bridge, servers on 3 of them, the worker on the fourth; no netem
#   netem   the same with netem on each host's link: --delay (100us each
#           way) and --rate (10gbit); skipped where the kernel has no
#           sch_netem
#
# Repetitions are the outer loop: each holds one run of every network and
# server count, minutes apart at most, so their ratios compare like with
# like; the summary takes the median over repetitions.
#
#   tools/bench-servers.sh                          # everything, 3 reps
#   tools/bench-servers.sh -r 1 -d 1 -n "1 4" loop  # quick look
#   tools/bench-servers.sh --summary out/bench/servers.jsonl
#   tools/bench-servers.sh --plot out/bench/servers.jsonl docs/img/scale-servers.png
#
# Options: -b BUILD (build), -o FILE (out/bench/servers.jsonl, appended
# to), -r REPS (3), -s FIRST repetition number (1; to add repetitions to
# a file), -d SECONDS per timed run (3), -n COUNTS ("1 2 4 8 16 32"),
# --rows N (200000), --dim N (64), --batch N (4096), --dist D
# (uniform), --warmup S (1: untimed steps first, so the first connections
# and page faults stay out of the figures), --delay D (100us), --rate R
# (10gbit). Needs jq (and gnuplot for --plot); bridge and netem need root.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
out=$root/out/bench/servers.jsonl
reps=3
first=1
dur=3
counts="1 2 4 8 16 32"
rows=200000
dim=64
batch=4096
dist=uniform
warmup=1
delay=100us
rate=10gbit

med='def med: sort | if length % 2 == 1 then .[length / 2 | floor]
	else (.[length / 2 - 1] + .[length / 2]) / 2 end;'

summary() {
	jq -rs "$med"'
	(["where", "net", "servers", "n", "p50_ms", "p50_min", "p50_max",
	  "p99_ms", "Mrows/s", "min", "max"] | @tsv),
	(group_by([.where, .net, .servers])[] |
	 (map(.p50_us / 1000)) as $p | (map(.p99_us / 1000)) as $q |
	 (map(.rows_per_s / 1e6)) as $r |
	 [.[0].where, .[0].net, .[0].servers, length,
	  ($p | med), ($p | min), ($p | max), ($q | med),
	  ($r | med), ($r | min), ($r | max)]
	 | map(if type == "number" then (. * 1000 | round / 1000) else . end)
	 | @tsv)' "$1" | column -t
}

# plot FILE PNG: step p50 and rows/s against servers, one line per
# (where, net), median with min..max bars.
plot() {
	local in=$1 png=$2 work cmd1="" cmd2="" sep="" key f
	command -v gnuplot >/dev/null || { echo "bench-servers: needs gnuplot" >&2; exit 1; }
	work=$(mktemp -d "${TMPDIR:-/tmp}/bench-servers.XXXXXX")
	trap 'rm -rf "$work"' RETURN
	for key in $(jq -rs 'map("\(.where)/\(.net)") | unique[]' "$in"); do
		f=$work/${key//\//-}
		jq -rs --arg k "$key" "$med"'
		map(select("\(.where)/\(.net)" == $k)) | group_by(.servers)[] |
		(map(.p50_us / 1000)) as $p | (map(.rows_per_s / 1e6)) as $r |
		"\(.[0].servers) \($p | med) \($p | min) \($p | max) \($r | med) \($r | min) \($r | max)"' \
			"$in" | sort -n >"$f"
		cmd1="$cmd1$sep'$f' using 1:2:3:4 with yerrorlines title '$key'"
		cmd2="$cmd2$sep'$f' using 1:5:6:7 with yerrorlines title '$key'"
		sep=", "
	done
	[ -n "$cmd1" ] || { echo "bench-servers: no results in $in" >&2; exit 1; }
	mkdir -p "$(dirname "$png")"
	gnuplot <<EOF
set terminal pngcairo size 1000,450 font ",10"
set output '$png'
set multiplot layout 1,2 title "embstore-bench --op step, one worker, batch $(jq -rs '.[0].batch' "$in"), dim $(jq -rs '.[0].dim' "$in") (median, bars: min..max)"
# Log scales: the VM's emulated CPU is two orders of magnitude slower.
set logscale x 2
set logscale y 10
set xlabel 'servers'
set grid
set key top left
set title 'step time p50'
set ylabel 'ms'
plot $cmd1
set title 'rows/s'
set ylabel 'M rows/s (backend time)'
set key top right
plot $cmd2
unset multiplot
EOF
	echo "bench-servers: wrote $png"
}

sections=()
while [ $# -gt 0 ]; do
	case $1 in
	--summary) summary "${2:?}"; exit 0 ;;
	--plot) plot "${2:?}" "${3:?}"; exit 0 ;;
	-b) build=$2; shift ;;
	-o) out=$2; shift ;;
	-r) reps=$2; shift ;;
	-s) first=$2; shift ;;
	-d) dur=$2; shift ;;
	-n) counts=$2; shift ;;
	--rows) rows=$2; shift ;;
	--dim) dim=$2; shift ;;
	--batch) batch=$2; shift ;;
	--dist) dist=$2; shift ;;
	--warmup) warmup=$2; shift ;;
	--delay) delay=$2; shift ;;
	--rate) rate=$2; shift ;;
	loop | bridge | netem) sections+=("$1") ;;
	*) sed -n '2,32p' "$0" >&2; exit 2 ;;
	esac
	shift
done
[ ${#sections[@]} -gt 0 ] || sections=(loop bridge netem)
command -v jq >/dev/null || { echo "bench-servers: needs jq" >&2; exit 1; }
build=$(cd "$build" && pwd)
for b in embstore embstore-server embstore-bench; do
	[ -x "$build/tools/$b" ] || { echo "bench-servers: no $build/tools/$b" >&2; exit 1; }
done
mkdir -p "$(dirname "$out")"
where=host
[ -n "${RDMA_VM:-}" ] && where=vm
# One server thread each, TCP everywhere (a namespace has no RDMA device),
# long timeouts for slow (emulated) machines.
export EMB_THREADS=1 EMB_TRANSPORT=tcp EMB_LOG_LEVEL=warn
export EMB_CLUSTER_TIMEOUT=${EMB_CLUSTER_TIMEOUT:-300}
export EMB_HEARTBEAT_TIMEOUT=${EMB_HEARTBEAT_TIMEOUT:-20}
bench=("$build/tools/embstore-bench" --op step --rows "$rows" --dim "$dim"
	--batch "$batch" --dist "$dist" --warmup "$warmup" --duration "$dur"
	--json)
logs=$(mktemp -d "${TMPDIR:-/tmp}/bench-servers-XXXXXX")
trap 'rm -rf "$logs"' EXIT
skip_netem=

# run NET S REP: one job, its worker's JSON line appended to $out.
run() {
	local net=$1 s=$2 rep=$3 rc=0 line
	rm -rf "$logs/run"
	case $net in
	loop)
		"$build/tools/embstore" launch --server_num "$s" --worker_num 1 \
			--log-dir "$logs/run" -- "${bench[@]}" >"$logs/out" 2>&1 ||
			rc=$?
		;;
	bridge | netem)
		local d=0
		[ "$net" = netem ] && d=$delay
		"$root/tests/scale/netdc.sh" --hosts 4 --server-hosts 3 \
			--delay "$d" --rate "$rate" --servers "$s" --workers 1 \
			--bin "$build/tools" --logs "$logs/run" --timeout 1200 \
			-- "${bench[@]}" >"$logs/out" 2>&1 || rc=$?
		;;
	esac
	if [ "$rc" -eq 77 ]; then
		echo "bench-servers: $net skipped: $(grep SKIP "$logs/out")"
		skip_netem=1
		return 0
	fi
	line=$(grep -h '^{' "$logs/run/worker.0.log" 2>/dev/null | tail -1) || true
	if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
		cat "$logs/out"
		tail -n 20 "$logs"/run/*.log
		echo "bench-servers: $net with $s servers failed ($rc)" >&2
		exit 1
	fi
	echo "$line" | jq -c --arg net "$net" --argjson s "$s" \
		--argjson rep "$rep" --arg where "$where" \
		--arg load "$(cut -d' ' -f1-3 /proc/loadavg)" \
		--arg rtt "$(sed -n 's/^netdc: rtt .*: p50 \([0-9.]*\) us.*/\1/p' "$logs/out" | tail -1)" \
		'. + {fig: "servers", net: $net, servers: $s, rep: $rep,
		      where: $where, load: $load, rtt_us: $rtt}' >>"$out"
	printf 'bench-servers: %s rep %s %-6s %2s servers: p50 %s us, p99 %s us, %s rows/s\n' \
		"$where" "$rep" "$net" "$s" "$(echo "$line" | jq .p50_us)" \
		"$(echo "$line" | jq .p99_us)" "$(echo "$line" | jq '.rows_per_s | floor')"
}

for rep in $(seq "$first" $((first + reps - 1))); do
	for net in "${sections[@]}"; do
		for s in $counts; do
			[ "$net" = netem ] && [ -n "$skip_netem" ] && break
			run "$net" "$s" "$rep"
		done
	done
done
echo "bench-servers: results in $out"
