#!/usr/bin/env bash
# tools/bench-report.sh - reruns every figure of docs/benchmarks.md and
# appends one JSON object per run to a results file; `--summary FILE` turns
# that file into the medians, spreads and ratios the report quotes.
#
# Sections (all by default, in this order):
#   w1     embstore-bench in process: W1 (1M rows, dim 64, batch 4096),
#          zipf:1.05 and uniform, pull push step raw-gather raw-apply,
#          1 and 2 threads
#   sweep  in-process pull and push (zipf:1.05) over batch 256..16384 and
#          dim 8..512
#   net    one embstore-server --threads 2 on loopback TCP, pull and push,
#          zipf and uniform (embstore-bench --servers when the bench has it,
#          else tests/worker/net_rate); beside it iperf3 over loopback and
#          the echo server (static buffer and --gather)
#   tcpsweep  loopback TCP pull (zipf:1.05) over batch 256..16384
#   zerocopy  loopback TCP pull with --zero-copy-pulls off (default) and on
#   redis  tools/redis-compare.sh: Redis MGET/MSET on the same batches
#   ctr    examples/ctr: samples/s of --local and of 2 workers / 2 servers
#          under `embstore launch`
#   scale  (only when named) embstore-bench in process, dim 16, SGD,
#          uniform pull, at each size of $EMB_SCALE_ROWS (default 1M 10M
#          100M rows: about 9 GB at 100M); then, at the largest size, one
#          embstore-server on loopback: preload over TCP, `embstore dump`,
#          and `embstore restore` into a fresh server, timed
#          (EMB_SCALE_TCP=0: in process only)
#   rowfmt (only when named) embstore-bench in process, W1, 1 thread,
#          for each --row-format (fp32 fp16 bf16 int8): pull zipf:1.05
#          and uniform, push zipf:1.05; then bytes_per_row of each format
#          with sgd, adagrad and rowwise_adagrad at each size of
#          $EMB_ROWFMT_ROWS (default 1M 10M), preload and one batch
#          ($EMB_ROWFMT_W1_ROWS sets the W1 runs' rows, for tests)
#   pslite (only when named) tools/pslite-compare.sh: W1 pull and push
#          over loopback TCP, one client, against ps-lite built from
#          $EMB_PSLITE_SRC (a dmlc/ps-lite checkout) into BUILD/pslite;
#          one repetition of the script per repetition here
#
# Every figure runs REPS times. Repetitions are the outer loop, so each
# repetition holds one run of every configuration taken minutes apart at
# most: ratios (pull / raw-gather, embstore / echo) are computed within a
# repetition, then the median is taken. The machine is shared; one run
# alone says little.
#
#   tools/bench-report.sh                         # everything, 3 reps
#   tools/bench-report.sh -r 1 -d 1 w1            # quick look
#   tools/bench-report.sh --summary out/bench/results.jsonl
#
# Options: -b BUILD (build-report), -o FILE (out/bench/results.jsonl,
# appended to), -r REPS (3), -s FIRST repetition number (1; to add
# repetitions to a file), -d SECONDS per timed run (3).
# Needs: the build's embstore-bench, embstore-server, embstore,
# embstore-echo-server/-client, tests/worker/net_rate, examples/ctr/gen and
# train; iperf3, jq; redis-compare.sh installs Redis itself.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-report
out=$root/out/bench/results.jsonl
reps=3
first=1
dur=3

summary() {
	local f=$1
	# Median, min and max of rows/s (samples/s for ctr) per configuration.
	jq -rs '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def key: [.fig, .op, .dist, (.threads // 1), (.batch // 0),
		(.dim // 0), (.backend // ""), (.rows // 0),
		(.row_format // ""), (.optimizer // "")]
		| map(tostring) | join(" ");
	def rate: (.rows_per_s // .samples_per_s);
	(["fig", "op", "dist", "thr", "batch", "dim", "backend", "rows", "n",
	  "median", "min", "max", "p50_us", "p99_us", "B/row", "rss/row",
	  "format", "optimizer"]
	 | @tsv),
	(group_by(key)[] |
	 [.[0].fig, .[0].op, .[0].dist, (.[0].threads // 1),
	  (.[0].batch // ""), (.[0].dim // ""), (.[0].backend // ""),
	  (.[0].rows // ""), length,
	  (map(rate) | med | floor), (map(rate) | min | floor),
	  (map(rate) | max | floor),
	  (map(.p50_us // 0) | med), (map(.p99_us // 0) | med),
	  (map(.bytes_per_row // 0) | med),
	  (map(.rss_bytes_per_row // 0) | med),
	  (.[0].row_format // ""), (.[0].optimizer // "")] | @tsv)' "$f"
	echo
	echo "# ratios within one repetition: median (min..max)"
	jq -rs '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r2: (. * 100 | round) / 100;
	def pick($fig; $op; $dist; $thr):
		map(select(.fig == $fig and .op == $op and
			(.dist == $dist or $dist == "") and
			((.threads // 1) == $thr)))[0].rows_per_s;
	def pickb($fig; $op; $be):
		map(select(.fig == $fig and .op == $op and
			.backend == $be))[0].rows_per_s;
	def fmt($f; $op; $dist):
		map(select(.fig == "rowfmt" and .op == $op and
			.dist == $dist and .row_format == $f))[0].rows_per_s;
	def ratio($name; a; b):
		[group_by(.rep)[] | (a) as $a | (b) as $b |
		 select($a != null and $b != null) | $a / $b] as $v |
		if ($v | length) == 0 then empty else
		"\($name)\t\($v | med | r2)\t(\($v | min | r2)..\($v | max | r2))\tn=\($v | length)" end;
	ratio("w1 pull/raw-gather zipf 1t";
		pick("w1"; "pull"; "zipf:1.05"; 1); pick("w1"; "raw-gather"; "zipf:1.05"; 1)),
	ratio("w1 pull/raw-gather uniform 1t";
		pick("w1"; "pull"; "uniform"; 1); pick("w1"; "raw-gather"; "uniform"; 1)),
	ratio("w1 push/raw-apply zipf 1t";
		pick("w1"; "push"; "zipf:1.05"; 1); pick("w1"; "raw-apply"; "zipf:1.05"; 1)),
	ratio("w1 push/raw-apply uniform 1t";
		pick("w1"; "push"; "uniform"; 1); pick("w1"; "raw-apply"; "uniform"; 1)),
	ratio("w1 pull/raw-gather zipf 2t";
		pick("w1"; "pull"; "zipf:1.05"; 2); pick("w1"; "raw-gather"; "zipf:1.05"; 2)),
	ratio("w1 pull/raw-gather uniform 2t";
		pick("w1"; "pull"; "uniform"; 2); pick("w1"; "raw-gather"; "uniform"; 2)),
	ratio("w1 push/raw-apply zipf 2t";
		pick("w1"; "push"; "zipf:1.05"; 2); pick("w1"; "raw-apply"; "zipf:1.05"; 2)),
	ratio("w1 push/raw-apply uniform 2t";
		pick("w1"; "push"; "uniform"; 2); pick("w1"; "raw-apply"; "uniform"; 2)),
	ratio("tcp pull/echo static, uniform";
		pick("tcp"; "pull"; "uniform"; 1); pick("echo"; "static"; ""; 1)),
	ratio("tcp pull/echo gather, uniform";
		pick("tcp"; "pull"; "uniform"; 1); pick("echo"; "gather"; ""; 1)),
	ratio("tcp pull/echo static, zipf";
		pick("tcp"; "pull"; "zipf:1.05"; 1); pick("echo"; "static"; ""; 1)),
	ratio("tcp pull/echo gather, zipf";
		pick("tcp"; "pull"; "zipf:1.05"; 1); pick("echo"; "gather"; ""; 1)),
	ratio("tcp pull/redis mget, zipf";
		pick("tcp"; "pull"; "zipf:1.05"; 1); pick("redis"; "mget"; "zipf:1.05"; 1)),
	ratio("tcp pull/redis mget, uniform";
		pick("tcp"; "pull"; "uniform"; 1); pick("redis"; "mget"; "uniform"; 1)),
	ratio("tcp push/redis mset, zipf";
		pick("tcp"; "push"; "zipf:1.05"; 1); pick("redis"; "mset"; "zipf:1.05"; 1)),
	ratio("tcp pull 2 clients/echo gather, uniform";
		pick("tcp"; "pull"; "uniform"; 2); pick("echo"; "gather"; ""; 1)),
	ratio("pslite pull embstore/ps-lite, zipf";
		pickb("pslite"; "pull"; "client"); pickb("pslite"; "pull"; "ps-lite")),
	ratio("pslite push embstore/ps-lite, zipf";
		pickb("pslite"; "push"; "client"); pickb("pslite"; "push"; "ps-lite")),
	ratio("tcp pull copy/zero-copy, zipf";
		pick("tcp-zc-off"; "pull"; "zipf:1.05"; 1); pick("tcp-zc-on"; "pull"; "zipf:1.05"; 1)),
	ratio("tcp pull copy/zero-copy, uniform";
		pick("tcp-zc-off"; "pull"; "uniform"; 1); pick("tcp-zc-on"; "pull"; "uniform"; 1)),
	(["fp16", "bf16", "int8"][] as $f |
	 (["pull", "zipf:1.05"], ["pull", "uniform"], ["push", "zipf:1.05"])
	 as [$op, $dist] |
	 ratio("rowfmt \($op) \($f)/fp32, \($dist)";
		fmt($f; $op; $dist); fmt("fp32"; $op; $dist))),
	ratio("ctr 2w2s/local samples/s";
		(map(select(.fig == "ctr" and .op == "launch"))[0].samples_per_s);
		(map(select(.fig == "ctr" and .op == "local"))[0].samples_per_s))
	' "$f"
}

while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$(cd "$2" && pwd); shift 2 ;;
	-o) out=$2; shift 2 ;;
	-r) reps=$2; shift 2 ;;
	-s) first=$2; shift 2 ;;
	-d) dur=$2; shift 2 ;;
	--summary) summary "$2"; exit 0 ;;
	-h | --help) sed -n '2,53s/^# \{0,1\}//p' "$0"; exit 0 ;;
	-*) echo "bench-report: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
sections=${*:-w1 sweep net tcpsweep zerocopy redis ctr}

command -v jq >/dev/null || { echo "bench-report: needs jq" >&2; exit 1; }
bench=$build/tools/embstore-bench
mkdir -p "$(dirname "$out")"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-report.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain -- src tools 2>/dev/null)" ]; then
	commit="$commit+dirty"
fi
note() { echo "bench-report: $*" >&2; }

# emit FIG REP JSON: the tool's JSON object plus fig, rep, commit, load.
emit() {
	local load
	load=$(cut -d' ' -f1 /proc/loadavg)
	jq -c --arg fig "$1" --argjson rep "$2" --arg commit "$commit" \
		--argjson load "$load" \
		'. + {fig: $fig, rep: $rep, commit: $commit, load1: $load}' \
		<<<"$3" >>"$out"
}

# kv2json "WORD WORD k=v k=v ...": the key=value lines that net_rate,
# embstore-echo-client and redis-compare.sh print, as a JSON object.
kv2json() {
	awk '{
		printf "{\"tool\":\"%s\"", $1
		for (i = 2; i <= NF; i++) {
			n = index($i, "=")
			if (n == 0) { printf ",\"op\":\"%s\"", $i; continue }
			k = tolower(substr($i, 1, n - 1)); v = substr($i, n + 1)
			if (v ~ /^-?[0-9.]+$/) printf ",\"%s\":%s", k, v
			else printf ",\"%s\":\"%s\"", k, v
		}
		print "}"
	}' <<<"$1"
}

# start_server: one embstore-server --threads 2 on a free loopback port;
# sets $port and $spid.
start_server() {
	local log=$work/server.log
	"$build/tools/embstore-server" --listen 127.0.0.1:0 --threads 2 \
		2>"$log" &
	spid=$!
	pids+=("$spid")
	port=
	for _ in $(seq 100); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' \
			"$log" | head -n 1)
		[ -n "$port" ] && return 0
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.1
	done
	note "embstore-server did not start: $(tail -3 "$log")"
	return 1
}

stop_pid() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

run_bench() { # FIG REP ARGS...: one embstore-bench run
	local fig=$1 rep=$2 j
	shift 2
	if ! j=$("$bench" --duration "$dur" --json "$@" 2>"$work/bench.err"); then
		note "embstore-bench $* failed: $(tail -2 "$work/bench.err")"
		return 0
	fi
	emit "$fig" "$rep" "$j"
}

sec_w1() {
	local rep=$1 op dist thr
	for thr in 1 2; do
		for dist in zipf:1.05 uniform; do
			for op in pull push step raw-gather raw-apply; do
				run_bench w1 "$rep" --rows 1000000 --dim 64 \
					--batch 4096 --dist "$dist" --op "$op" \
					--threads "$thr"
			done
		done
	done
}

sec_rowfmt() {
	local rep=$1 w1=${EMB_ROWFMT_W1_ROWS:-1000000} f op dist n
	# Formats innermost: the runs a ratio compares are seconds apart.
	for op in pull:zipf:1.05 pull:uniform push:zipf:1.05; do
		dist=${op#*:}
		for f in fp32 fp16 bf16 int8; do
			run_bench rowfmt "$rep" --rows "$w1" --dim 64 \
				--batch 4096 --dist "$dist" --op "${op%%:*}" \
				--row-format "$f"
		done
	done
	# Memory only: bytes_per_row is read after the preload, so one
	# batch is enough.
	for n in ${EMB_ROWFMT_ROWS:-1000000 10000000}; do
		for f in fp32 fp16 bf16 int8; do
			for op in sgd adagrad rowwise_adagrad; do
				run_bench rowfmt-mem "$rep" --rows "$n" \
					--dim 64 --batch 4096 --op push \
					--batches 1 --row-format "$f" \
					--optimizer "$op"
			done
		done
	done
}

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

sec_scale() {
	local rep=$1 n big=0 t0 t1 dump=$work/scale-dump j
	for n in ${EMB_SCALE_ROWS:-1000000 10000000 100000000}; do
		run_bench scale "$rep" --rows "$n" --dim 16 --optimizer sgd \
			--batch 4096 --dist uniform --op pull
		((n > big)) && big=$n
	done
	[ "${EMB_SCALE_TCP:-1}" = 0 ] && return 0
	# The same table through a server: create it over TCP (the bench's
	# preload), dump it, restore the dump into a fresh server.
	start_server || return 1
	run_bench scale-tcp "$rep" --servers "127.0.0.1:$port" --rows "$big" \
		--dim 16 --optimizer sgd --batch 4096 --dist uniform --op pull
	rm -rf "$dump"
	t0=$(date +%s.%N)
	if ! "$build/tools/embstore" dump --servers "127.0.0.1:$port" \
		--table bench --out "$dump" --quiet; then
		note "scale: dump failed"
		stop_pid "$spid"
		return 0
	fi
	t1=$(date +%s.%N)
	j=$(jq -nc --argjson rows "$big" --argjson s "$(secs "$t0" "$t1")" \
		--argjson bytes "$(du -sb "$dump" | cut -f1)" \
		'{op: "dump", rows: $rows, seconds: $s, file_bytes: $bytes,
		  rows_per_s: ($rows / $s)}')
	emit scale-tcp "$rep" "$j"
	stop_pid "$spid"
	start_server || return 1
	t0=$(date +%s.%N)
	if "$build/tools/embstore" restore --in "$dump" \
		--servers "127.0.0.1:$port" --quiet; then
		t1=$(date +%s.%N)
		j=$(jq -nc --argjson rows "$big" \
			--argjson s "$(secs "$t0" "$t1")" \
			'{op: "restore", rows: $rows, seconds: $s,
			  rows_per_s: ($rows / $s)}')
		emit scale-tcp "$rep" "$j"
	else
		note "scale: restore failed"
	fi
	stop_pid "$spid"
	rm -rf "$dump"
}

sec_sweep() {
	local rep=$1 op n
	for op in pull push; do
		for n in 256 512 1024 2048 4096 8192 16384; do
			run_bench batch "$rep" --rows 1000000 --dim 64 \
				--batch "$n" --op "$op"
		done
		for n in 8 16 32 64 128 256 512; do
			run_bench dim "$rep" --rows 1000000 --dim "$n" \
				--batch 4096 --op "$op"
		done
	done
}

# TCP pull with the server copying rows into one reply buffer (the TCP
# default) and with one iovec per row straight from table memory
# (--zero-copy-pulls on), same ids, a fresh server each.
sec_zerocopy() {
	local rep=$1 zc dist line j zarg
	for dist in zipf:1.05 uniform; do
		zarg=()
		[ "$dist" = uniform ] || zarg=(--zipf 1.05)
		for zc in off on; do
			EMB_ZERO_COPY_PULLS=$zc start_server || return 1
			if line=$("$build/tests/worker/net_rate" --servers \
				"127.0.0.1:$port" --op pull --rows 1000000 \
				--dim 64 --batch 4096 --seconds "$dur" \
				"${zarg[@]}" 2>"$work/net.err" | grep '^embstore '); then
				j=$(kv2json "$line" | jq -c --arg d "$dist" \
					--arg zc "$zc" '. + {dist: $d, backend: "tcp",
					threads: 1, zero_copy: $zc}')
				emit "tcp-zc-$zc" "$rep" "$j"
			else
				note "net_rate zero-copy $zc failed: $(tail -2 "$work/net.err")"
			fi
			stop_pid "$spid"
		done
	done
}

# TCP pull over batch sizes, zipf:1.05, for the batch plot: one server.
sec_tcpsweep() {
	local rep=$1 n line j
	start_server || return 1
	for n in 256 512 1024 2048 4096 8192 16384; do
		if line=$("$build/tests/worker/net_rate" --servers \
			"127.0.0.1:$port" --op pull --rows 1000000 --dim 64 \
			--batch "$n" --seconds "$dur" --zipf 1.05 \
			2>"$work/net.err" | grep '^embstore '); then
			j=$(kv2json "$line" | jq -c '. + {dist: "zipf:1.05",
				backend: "tcp", threads: 1}')
			emit tcp-batch "$rep" "$j"
		else
			note "net_rate batch $n failed: $(tail -2 "$work/net.err")"
		fi
	done
	stop_pid "$spid"
}

bench_has_servers() {
	"$bench" --help 2>&1 | grep -q -- '--servers'
}

sec_net() {
	local rep=$1 op dist line j thr zarg
	# embstore over loopback TCP, a fresh server per run so no run sees
	# the rows or the arenas of the one before.
	for dist in zipf:1.05 uniform; do
		for op in pull push; do
			if bench_has_servers; then
				for thr in 1 2; do
					start_server || return 1
					run_bench tcp "$rep" --servers "127.0.0.1:$port" \
						--transport tcp --rows 1000000 --dim 64 \
						--batch 4096 --dist "$dist" --op "$op" \
						--threads "$thr"
					stop_pid "$spid"
				done
				# The bench caches pulls and steps only.
				if [ "$op" = pull ] &&
					"$bench" --help 2>&1 | grep -q -- '--cache'; then
					start_server || return 1
					run_bench tcp-cache "$rep" \
						--servers "127.0.0.1:$port" --transport tcp \
						--cache 262144 --rows 1000000 --dim 64 \
						--batch 4096 --dist "$dist" --op "$op"
					stop_pid "$spid"
				fi
				continue
			fi
			start_server || return 1
			zarg=()
			[ "$dist" = uniform ] || zarg=(--zipf 1.05)
			if line=$("$build/tests/worker/net_rate" --servers \
				"127.0.0.1:$port" --op "$op" --rows 1000000 \
				--dim 64 --batch 4096 --seconds "$dur" \
				"${zarg[@]}" 2>"$work/net.err" | grep '^embstore '); then
				j=$(kv2json "$line" | jq -c --arg d "$dist" \
					'. + {dist: $d, backend: "tcp", threads: 1}')
				emit tcp "$rep" "$j"
			else
				note "net_rate $op $dist failed: $(tail -2 "$work/net.err")"
			fi
			stop_pid "$spid"
		done
	done

	# Two clients at once (net_rate is one client; two processes on one
	# server). Each preloads the same rows first, so their timed phases
	# overlap by all but the difference of their preloads: the runs are
	# twice as long to keep that small. Sum of the two rows/s.
	for dist in zipf:1.05 uniform; do
		for op in pull push; do
			bench_has_servers && continue
			start_server || return 1
			zarg=()
			[ "$dist" = uniform ] || zarg=(--zipf 1.05)
			local c
			for c in 1 2; do
				"$build/tests/worker/net_rate" --servers \
					"127.0.0.1:$port" --op "$op" --rows 1000000 \
					--dim 64 --batch 4096 --seconds $((dur * 2)) \
					"${zarg[@]}" >"$work/net$c.out" 2>&1 &
				pids+=($!)
			done
			wait "${pids[@]: -2}" || true
			if [ "$(grep -c '^embstore ' "$work"/net[12].out | \
				awk -F: '{ s += $2 } END { print s }')" = 2 ]; then
				j=$(cat "$work"/net[12].out | grep '^embstore ' |
					while read -r line; do kv2json "$line"; done |
					jq -cs --arg d "$dist" '.[0] + {dist: $d,
					backend: "tcp", threads: 2,
					rows_per_s: (map(.rows_per_s) | add),
					clients_rows_per_s: map(.rows_per_s),
					p50_us: (map(.p50_us) | max),
					p99_us: (map(.p99_us) | max)}')
				emit tcp "$rep" "$j"
			else
				note "two net_rate $op $dist failed: $(tail -2 "$work/net1.out")"
			fi
			stop_pid "$spid"
		done
	done

	# The echo ceilings: a static buffer (syscalls and loopback copies),
	# and --gather (plus reading random rows of a 1M-row array).
	local mode eport epid
	for mode in static gather; do
		local eargs=(--listen 127.0.0.1:0) cargs=()
		[ $mode = static ] || { eargs+=(--gather --rows 1000000);
			cargs=(--rows 1000000); }
		"$build/tools/embstore-echo-server" "${eargs[@]}" \
			>"$work/echo.out" 2>&1 &
		epid=$!
		pids+=("$epid")
		eport=
		for _ in $(seq 100); do
			eport=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' \
				"$work/echo.out" | head -n 1)
			[ -n "$eport" ] && break
			sleep 0.1
		done
		if [ -n "$eport" ] && line=$("$build/tools/embstore-echo-client" \
			--connect "127.0.0.1:$eport" --seconds "$dur" "${cargs[@]}" |
			grep '^echo '); then
			j=$(kv2json "$line" | jq -c --arg m $mode \
				'. + {op: $m, threads: 1, dim: 64}')
			emit echo "$rep" "$j"
		else
			note "echo $mode failed"
		fi
		stop_pid "$epid"
	done

	# iperf3 over loopback, one stream: the kernel's TCP copy ceiling,
	# given as 256-byte rows/s to sit in the same column.
	local ip ipid
	ip=$((20000 + RANDOM % 30000))
	iperf3 -s -1 -p "$ip" >/dev/null 2>&1 &
	ipid=$!
	pids+=("$ipid")
	sleep 0.5
	if j=$(iperf3 -c 127.0.0.1 -p "$ip" -t "$dur" -J 2>/dev/null); then
		j=$(jq -c '{tool: "iperf3", op: "stream", threads: 1,
			bits_per_s: .end.sum_received.bits_per_second,
			rows_per_s: (.end.sum_received.bits_per_second / 8 / 256
				| floor)}' <<<"$j")
		emit iperf3 "$rep" "$j"
	else
		note "iperf3 failed"
	fi
	stop_pid "$ipid"
}

sec_redis() {
	local rep=$1 line j
	SECONDS_PER_RUN=$dur "$root/tools/redis-compare.sh" >"$work/redis.out" \
		2>"$work/redis.err" || { note "redis-compare failed: $(tail -2 \
		"$work/redis.err")"; return 0; }
	grep '^redis ' "$work/redis.out" | while read -r line; do
		j=$(kv2json "$line" | jq -c '. + {threads: 1, dim: 64,
			dist: (if .dist == "zipf" then "zipf:1.05" else .dist end)}')
		emit redis "$rep" "$j"
	done
}

sec_pslite() {
	local rep=$1 j
	if [ -z "${EMB_PSLITE_SRC:-}" ]; then
		note "pslite: EMB_PSLITE_SRC is not set (a dmlc/ps-lite checkout)"
		return 0
	fi
	rm -f "$work/pslite.jsonl"
	"$root/tools/pslite-compare.sh" -b "$build" -r 1 -d "$dur" \
		-o "$work/pslite.jsonl" "$EMB_PSLITE_SRC" >"$work/pslite.out" \
		2>"$work/pslite.err" || note "pslite-compare: $(tail -2 \
		"$work/pslite.err")"
	[ -f "$work/pslite.jsonl" ] || return 0
	while read -r j; do
		emit pslite "$rep" "$(jq -c 'del(.fig, .rep, .load1)' <<<"$j")"
	done <"$work/pslite.jsonl"
}

ctr_data() {
	[ -f "$work/ctr/data/train.tsv" ] && return 0
	mkdir -p "$work/ctr"
	"$build/examples/ctr/gen" --rows 200000 --seed 1 --out "$work/ctr/data" \
		>/dev/null
}

# ctr_emit REP OP FILE: the "worker N: S samples in T s, R samples/s"
# lines of FILE summed over workers (each trains on its share).
ctr_emit() {
	local j
	j=$(grep -o 'worker [0-9]*: [0-9]* samples in [0-9.]* s' "$3" |
		awk -v op="$2" '{ n++; s += $3; if ($6 > t) t = $6 }
		END { if (n) printf "{\"tool\":\"ctr\",\"op\":\"%s\",\"workers\":%d,\"samples\":%d,\"seconds\":%.2f,\"samples_per_s\":%.0f}\n", op, n, s, t, s / t }')
	if [ -n "$j" ]; then
		emit ctr "$1" "$j"
	else
		note "ctr $2: no samples line; see $(tail -3 "$3")"
	fi
}

sec_ctr() {
	local rep=$1 ex=$build/examples/ctr d=$work/ctr/data
	ctr_data
	"$ex/train" --local --data "$d/train.tsv" --test "$d/test.tsv" \
		--epochs 2 --log-every 100 >"$work/ctr/local.out" 2>&1 || true
	ctr_emit "$rep" local "$work/ctr/local.out"
	EMB_LOG_LEVEL=warn "$build/tools/embstore" launch --server_num 2 \
		--worker_num 2 --log-dir "$work/ctr/log" -- "$ex/train" \
		--data "$d/train.tsv" --test "$d/test.tsv" --epochs 2 \
		--log-every 100 >"$work/ctr/launch.out" 2>&1 || true
	ctr_emit "$rep" launch "$work/ctr/launch.out"
}

note "sections: $sections; reps $reps; ${dur}s per run; into $out"
for rep in $(seq "$first" $((first + reps - 1))); do
	for s in $sections; do
		note "rep $rep: $s"
		"sec_$s" "$rep"
	done
done
