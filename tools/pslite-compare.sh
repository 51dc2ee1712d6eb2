#!/usr/bin/env bash
# tools/pslite-compare.sh - embstore against dmlc/ps-lite over loopback TCP,
# one client, workload W1 (docs/bench.md), measured side by side in one run.
#
# Builds ps-lite from PSLITE_SRC_DIR (a checkout of github.com/dmlc/ps-lite)
# against the system's libzmq and protobuf, out of tree (in $PSLITE_BUILD,
# default BUILD/pslite), and its W1 driver tools/pslite/w1.cc beside it.
# Then it starts both systems once and loads ROWS rows into each:
#   ps-lite: pslite-w1 --serve (scheduler, one server, one worker; ZMQ van)
#   embstore: `embstore-server --transport tcp --threads 1`, loaded by
#             `embstore-bench --servers ... --transport tcp --threads 1`
# and for each repetition and op (pull, push with SGD) runs one phase of
# each (warmup, then the timed seconds) with the same ids (embstore-bench's
# id stream, same seed, from its start in every phase), alternating which
# system goes first from one repetition to the next so that a drift in
# the machine's load falls on both. Prints each repetition's rows/s and
# embstore / ps-lite ratio, then per op the median ratio (min..max).
#
# Without PSLITE_SRC_DIR only the embstore half runs (no ratios).
#
# With -i ROUNDS the same run then measures the store in one process
# against the raw loops (docs/bench.md, "The raw ops"), ROUNDS rounds of
# `embstore-bench --in-process --threads 1 --optimizer sgd` with the same
# rows, dim, batch and timing, under DIST and under uniform ids: push,
# raw-apply, raw-index-apply, pull, raw-gather and raw-index-gather in
# turn (the order reversed every other round). Prints each round's median
# batches (p50_us), then per ids the store's speed over each raw op's
# (the raw op's median batch over the store's), taken within each round:
# median (min..max) over the rounds.
#
#   tools/pslite-compare.sh ~/src/ps-lite               # W1, 5 reps, 3 s
#   tools/pslite-compare.sh -r 1 -N 200 -n 20000 -B 256 ~/src/ps-lite
#   tools/pslite-compare.sh -b build-rel -r 6 -i 5 -d 2 ~/src/ps-lite
#
# Options: -b BUILD (build), -r REPS (5), -d SECONDS per timed run (3),
# -N BATCHES: time exactly that many batches instead of -d seconds,
# -w SECONDS of warmup (1), -n ROWS (1000000), -B BATCH (4096), -D DIM (64),
# -t DIST (zipf:1.05), -i ROUNDS in process after (0: none), -o FILE:
# append every run's JSON object (with fig "pslite", rep and load1; the
# in-process ones fig "inproc" and round) to FILE.
# Needs: jq, cmake, g++, libzmq3-dev, libprotobuf-dev, protobuf-compiler
# (the ps-lite half only needs the last four). Nothing leaves the loopback;
# every process it starts is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
reps=5
dur=3
warmup=1
rows=1000000
batch=4096
dim=64
dist=zipf:1.05
out=
inproc=0

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit "${1:-2}"
}

nbatch=
while getopts b:r:d:w:n:B:D:t:o:N:i:h opt; do
	case $opt in
	b) build=$(cd "$OPTARG" && pwd) ;;
	r) reps=$OPTARG ;;
	d) dur=$OPTARG ;;
	w) warmup=$OPTARG ;;
	n) rows=$OPTARG ;;
	B) batch=$OPTARG ;;
	D) dim=$OPTARG ;;
	t) dist=$OPTARG ;;
	o) out=$OPTARG ;;
	N) nbatch=$OPTARG ;;
	i) inproc=$OPTARG ;;
	h) usage 0 ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || usage
src=${1:-}
case $reps in '' | *[!0-9]* | 0) echo "pslite-compare: bad -r '$reps'" >&2; exit 2 ;; esac
case $nbatch in *[!0-9]* | 0) echo "pslite-compare: bad -N '$nbatch'" >&2; exit 2 ;; esac
case $inproc in '' | *[!0-9]*) echo "pslite-compare: bad -i '$inproc'" >&2; exit 2 ;; esac
# The timed part of a phase: seconds, or a number of batches.
timed=(--duration "$dur")
timed_what="$dur s"
[ -z "$nbatch" ] || { timed=(--batches "$nbatch"); timed_what="$nbatch batches"; }

note() { echo "pslite-compare: $*" >&2; }
command -v jq >/dev/null || { note "needs jq"; exit 1; }
for b in embstore-server embstore-bench; do
	[ -x "$build/tools/$b" ] || { note "no $build/tools/$b (build first)"; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/pslite-compare.XXXXXX")
spid=
ppid=
cleanup() {
	local p
	for p in $spid $ppid; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

# build_pslite SRC: libpslite.a and pslite-w1 in $pbuild; sets $w1.
build_pslite() {
	local s=$1 p
	[ -f "$s/include/ps/ps.h" ] && [ -f "$s/CMakeLists.txt" ] ||
		{ note "$s is not a ps-lite source tree"; return 1; }
	for p in /usr/include/zmq.h /usr/include/google/protobuf/message.h; do
		[ -f "$p" ] || { note "missing $p: apt-get install libzmq3-dev" \
			"libprotobuf-dev protobuf-compiler"; return 1; }
	done
	pbuild=${PSLITE_BUILD:-$build/pslite}
	mkdir -p "$pbuild"
	# The system's libzmq and protobuf; never let CMake fetch its own.
	if ! { cmake -S "$s" -B "$pbuild/lib" -DCMAKE_BUILD_TYPE=Release \
		-DFETCHCONTENT_FULLY_DISCONNECTED=ON -DCMAKE_CXX_FLAGS=-w &&
		cmake --build "$pbuild/lib" --target pslite -j 2; } \
		>"$pbuild/build.log" 2>&1; then
		note "building ps-lite failed: $(tail -5 "$pbuild/build.log")"
		return 1
	fi
	w1=$pbuild/pslite-w1
	# Up to date: nothing to do (ps-lite's library was checked above).
	if [ -x "$w1" ] && [ "$w1" -nt "$root/tools/pslite/w1.cc" ] &&
		[ "$w1" -nt "$root/tools/bench_ids.c" ] &&
		[ "$w1" -nt "$root/tools/bench.h" ] &&
		[ "$w1" -nt "$pbuild/lib/libpslite.a" ]; then
		return 0
	fi
	# ps-lite's own flags (-O3); the ids are tools/bench_ids.c itself.
	if ! { gcc -std=c11 -O2 -I "$root/tools" -I "$root/src" -c \
		"$root/tools/bench_ids.c" -o "$pbuild/bench_ids.o" &&
		g++ -std=c++14 -O3 -Wall -I "$s/include" -I "$pbuild/lib" \
		-I "$root/tools" -I "$root/src" "$root/tools/pslite/w1.cc" \
		"$pbuild/bench_ids.o" "$pbuild/lib/libpslite.a" -lzmq \
		-lprotobuf -pthread -lm -o "$w1"; } >"$pbuild/w1.log" 2>&1; then
		note "building pslite-w1 failed: $(tail -5 "$pbuild/w1.log")"
		return 1
	fi
}

w1=
if [ -n "$src" ]; then
	build_pslite "$src" || exit 1
else
	note "no ps-lite source given: embstore only, no ratios"
fi

# emit REP JSON: the run's object, plus fig, rep and load, to $out.
emit() {
	[ -n "$out" ] || return 0
	jq -c --argjson rep "$1" --argjson load "$(cut -d' ' -f1 /proc/loadavg)" \
		'. + {fig: "pslite", rep: $rep, load1: $load}' <<<"$2" >>"$out"
}

# start_pslite: pslite-w1 --serve as a coprocess (PSL), which preloads
# its rows once and then runs one phase per op written to it.
start_pslite() {
	coproc PSL { exec "$w1" --serve --rows "$rows" --dim "$dim" \
		--batch "$batch" --dist "$dist" --warmup "$warmup" \
		"${timed[@]}" --json 2>"$work/pslite.err"; }
	ppid=$PSL_PID
}

# run_pslite OP: one phase of the running pslite-w1; prints its JSON.
run_pslite() {
	local j
	if [ -z "${PSL[1]:-}" ] || ! echo "$1" >&"${PSL[1]}" ||
		! read -r -t 900 j <&"${PSL[0]}"; then
		note "pslite-w1 $1 failed: $(tail -3 "$work/pslite.err")"
		return 1
	fi
	echo "$j"
}

# start_embstore: one `embstore-server --threads 1` on a free loopback
# port for the whole run (sets port, spid), its table preloaded by an
# untimed embstore-bench batch.
start_embstore() {
	local log=$work/server.log
	"$build/tools/embstore-server" --listen 127.0.0.1:0 --transport tcp \
		--threads 1 2>"$log" &
	spid=$!
	port=
	for _ in $(seq 300); do
		port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' \
			"$log" | head -n 1)
		[ -n "$port" ] && break
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.1
	done
	if [ -z "$port" ]; then
		note "embstore-server did not start: $(tail -3 "$log")"
		return 1
	fi
	bench_args=(--servers "127.0.0.1:$port" --transport tcp --threads 1
		--rows "$rows" --dim "$dim" --batch "$batch" --dist "$dist"
		--optimizer sgd)
	timeout 900 "$build/tools/embstore-bench" "${bench_args[@]}" \
		--op pull --batches 1 >/dev/null 2>"$work/bench.err" ||
		{ note "embstore preload failed: $(tail -3 "$work/bench.err")";
		  return 1; }
}

# run_embstore OP: one embstore-bench run on the loaded table; its JSON.
run_embstore() {
	timeout 900 "$build/tools/embstore-bench" "${bench_args[@]}" \
		--no-preload --op "$1" --warmup "$warmup" "${timed[@]}" \
		--json 2>"$work/bench.err" ||
		{ note "embstore-bench --op $1 failed: $(tail -3 "$work/bench.err")";
		  return 1; }
}

rate() { jq -r '.rows_per_s' <<<"$1"; }

# median_line LABEL UNIT: the ratios on stdin, one a line, as
# "LABEL M.MMx (MIN..MAX), N UNIT"; nothing when there are none.
median_line() {
	sort -g | awk -v label="$1" -v unit="$2" '
		{ v[NR] = $1 }
		END {
			if (!NR) exit
			m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
			printf "%s %.2fx (%.2f..%.2f), %d %s\n",
				label, m, v[1], v[NR], NR, unit
		}'
}

echo "W1 over loopback TCP: rows $rows, dim $dim, batch $batch, $dist," \
	"1 client, $timed_what timed after ${warmup} s warmup; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-4s %-5s %14s %14s %8s\n' rep op "ps-lite rows/s" \
	"embstore rows/s" ratio
declare -A ratios=()
fail=0
# Both systems stay up with their tables loaded, and their short phases
# alternate: a burst of load from elsewhere falls on both alike.
start_embstore || exit 1
[ -z "$w1" ] || start_pslite
for rep in $(seq "$reps"); do
	for op in pull push; do
		order="pslite embstore"
		[ $((rep % 2)) = 1 ] || order="embstore pslite"
		pj=
		ej=
		for sys in $order; do
			if [ "$sys" = pslite ]; then
				[ -n "$w1" ] || continue
				pj=$(run_pslite "$op") || { fail=1; continue; }
				emit "$rep" "$pj"
			else
				ej=$(run_embstore "$op") || { fail=1; continue; }
				emit "$rep" "$ej"
			fi
		done
		pr=-
		er=-
		ratio=-
		[ -z "$pj" ] || pr=$(rate "$pj")
		[ -z "$ej" ] || er=$(rate "$ej")
		if [ -n "$pj" ] && [ -n "$ej" ]; then
			ratio=$(awk -v e="$er" -v p="$pr" 'BEGIN {
				printf "%.2f", (p > 0 ? e / p : 0) }')
			ratios[$op]="${ratios[$op]:-} $ratio"
		fi
		printf '%-4s %-5s %14s %14s %8s\n' "$rep" "$op" "$pr" "$er" \
			"$ratio"
	done
done

for op in pull push; do
	[ -n "${ratios[$op]:-}" ] || continue
	# shellcheck disable=SC2086
	printf '%s\n' ${ratios[$op]} |
		median_line "$op: embstore / ps-lite" reps
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$ppid" ]; then
	# End of input: pslite-w1 finalizes its nodes and exits.
	eval "exec ${PSL[1]}>&-"
	wait "$ppid" || { note "pslite-w1 exited $?: $(tail -3 \
		"$work/pslite.err")"; fail=1; }
	ppid=
fi
# Both systems are down: the in-process rounds have the cores to
# themselves, as the TCP phases had.
kill "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
spid=
[ "$inproc" -gt 0 ] || exit $fail

# The in-process rounds. p50[ROUND,IDS,OP] = the op's median batch, us.
inops=(push raw-apply raw-index-apply pull raw-gather raw-index-gather)
dists=("$dist")
[ "$dist" = uniform ] || dists+=(uniform)
declare -A p50=()
echo
echo "In process, 1 thread: rows $rows, dim $dim, batch $batch," \
	"$timed_what timed after ${warmup} s warmup;" \
	"median batch in us; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-10s' round ids
printf ' %9s' "${inops[@]/raw-index-/ri-}"
echo
for round in $(seq "$inproc"); do
	for d in "${dists[@]}"; do
		order=("${inops[@]}")
		if [ $((round % 2)) = 0 ]; then
			order=()
			for ((k = ${#inops[@]} - 1; k >= 0; k--)); do
				order+=("${inops[k]}")
			done
		fi
		for op in "${order[@]}"; do
			if ! j=$(timeout 900 "$build/tools/embstore-bench" \
				--in-process --threads 1 --optimizer sgd \
				--rows "$rows" --dim "$dim" --batch "$batch" \
				--dist "$d" --op "$op" --warmup "$warmup" \
				"${timed[@]}" --json 2>"$work/bench.err"); then
				note "in process --op $op failed: $(tail -3 \
					"$work/bench.err")"
				fail=1
				continue
			fi
			p50[$round,$d,$op]=$(jq -r '.p50_us' <<<"$j")
			if [ -n "$out" ]; then
				jq -c --argjson r "$round" --argjson load \
					"$(cut -d' ' -f1 /proc/loadavg)" \
					'. + {fig: "inproc", round: $r, load1: $load}' \
					<<<"$j" >>"$out"
			fi
		done
		printf '%-5s %-10s' "$round" "$d"
		for op in "${inops[@]}"; do
			printf ' %9s' "${p50[$round,$d,$op]:--}"
		done
		echo
	done
done
# store / raw by speed: the raw op's median batch over the store's.
for d in "${dists[@]}"; do
	for pair in push:raw-apply push:raw-index-apply pull:raw-gather \
		pull:raw-index-gather; do
		st=${pair%%:*}
		raw=${pair#*:}
		for round in $(seq "$inproc"); do
			a=${p50[$round,$d,$st]:-}
			b=${p50[$round,$d,$raw]:-}
			[ -n "$a" ] && [ -n "$b" ] || continue
			awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.3f\n", b / a }'
		done | median_line "in process, $d: $st / $raw" rounds
	done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $fail
