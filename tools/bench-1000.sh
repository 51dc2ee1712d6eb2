#!/usr/bin/env bash
# tools/bench-1000.sh - a big job on one machine (docs/benchmarks.md, "A
# 1,000-node job on one machine"): `embstore launch` with S servers, W
# workers and --replicas R runs `embstore-bench --op push --verify`; once
# every worker joined and pushed for a while, one server is SIGKILLed.
# Reports, one `key: value` per line:
#
#   formation_s   launch start to the scheduler's "cluster ready"
#   joined_s      launch start to the last worker's "joined"
#   failover_s    the kill to the scheduler's new map ("the job goes on")
#   exit          the launcher's exit status (0: every worker exited 0)
#   clean         workers whose --verify found 0 mismatched rows
#   mismatched    workers that reported a mismatch
#   blind_ms      the scheduler's loop time it did not count as silence
#   self_suspicions  times the scheduler suspected itself (too many nodes
#                 silent at once) and let no silence count
#   false_dead    servers declared dead that were not killed
#   sched_cpu_s   CPU seconds the scheduler process used
#
# and exits 0 only when the launch exited 0, every worker verified clean,
# exactly the killed server was declared dead and the job went on.
#
#   tools/bench-1000.sh [--servers S] [--workers W] [--replicas R]
#                       [--duration SECONDS] [--kill-after SECONDS]
#                       [--tools DIR] [--out DIR] [--lock FILE]
#
# Defaults: 100 servers, 900 workers, R = 2, 40 s of pushes, the kill 8 s
# after the last worker joined, the build in ./build, logs in a new
# directory under $TMPDIR (kept, and named at the end). --lock FILE runs
# the whole job under flock(1) on FILE, so that two big jobs never share
# one machine. The launcher raises its open-file limit to the hard limit
# for itself and its children; 1,000 nodes need about 1,100 descriptors
# per server.
set -u

S=100
W=900
R=2
duration=40
kill_after=8
tools=build/tools
out=
lock=
while [ $# -gt 0 ]; do
	case $1 in
	--servers) S=$2; shift 2 ;;
	--workers) W=$2; shift 2 ;;
	--replicas) R=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--kill-after) kill_after=$2; shift 2 ;;
	--tools) tools=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--lock) lock=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-1000.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
if [ -n "$lock" ]; then
	exec flock "$lock" "$0" --servers "$S" --workers "$W" --replicas "$R" \
		--duration "$duration" --kill-after "$kill_after" \
		--tools "$tools" ${out:+--out "$out"}
fi
tools=$(cd "$tools" && pwd) || exit 2
[ -x "$tools/embstore" ] && [ -x "$tools/embstore-bench" ] || {
	echo "bench-1000.sh: no embstore or embstore-bench in $tools" >&2
	exit 2
}
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/emb-bench1000-XXXXXX")
mkdir -p "$out" || exit 2
PATH=$tools:$PATH
export PATH
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE EMB_COORDINATOR
# Forming 1,000 processes on two cores takes a while: the launcher's
# default of 60 s is short for it.
: "${EMB_CLUSTER_TIMEOUT:=300}"
export EMB_CLUSTER_TIMEOUT
log=$out/launch.txt
lpid=

cleanup() {
	if [ -n "$lpid" ]; then
		kill -INT "$lpid" 2>/dev/null
		wait "$lpid" 2>/dev/null
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }

# The scheduler's CPU time so far, in clock ticks (utime + stime), kept in
# cpu while its process lives.
spid=
cpu=0
sample_cpu() {
	[ -n "$spid" ] || spid=$(sed -n 's/^\[launch\] started scheduler, pid \([0-9]*\)$/\1/p' "$log" | tail -n 1)
	[ -n "$spid" ] || return
	c=$(awk '{ print $14 + $15 }' "/proc/$spid/stat" 2>/dev/null) && cpu=$c
}

t0=$(now_ms)
(cd "$out" && exec embstore launch --server_num "$S" --worker_num "$W" \
	--replicas "$R" --log-dir "$out/log" -- \
	embstore-bench --op push --verify --rows 4000 --dim 8 --batch 64 \
	--duration "$duration") >"$log" 2>&1 &
lpid=$!

formation=
joined=
while kill -0 "$lpid" 2>/dev/null; do
	if [ -z "$formation" ] && grep -q '^\[scheduler\] .*cluster ready' "$log"; then
		formation=$(( $(now_ms) - t0 ))
	fi
	if [ -n "$formation" ]; then
		n=$(grep -c '^\[worker\.[0-9]*\] .*joined' "$log")
		if [ "$n" -ge "$W" ]; then
			joined=$(( $(now_ms) - t0 ))
			break
		fi
	fi
	sample_cpu
	sleep 0.2
done

killed=
failover=
if [ -n "$joined" ]; then
	sleep "$kill_after"
	victim=$(( RANDOM % S ))
	vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" "$log")
	if [ -n "$vpid" ] && kill -KILL "$vpid" 2>/dev/null; then
		tk=$(now_ms)
		killed=$victim
		echo "killed server.$victim (pid $vpid)" >&2
		while kill -0 "$lpid" 2>/dev/null; do
			if grep -q '^\[scheduler\] .*the job goes on' "$log"; then
				failover=$(( $(now_ms) - tk ))
				break
			fi
			sample_cpu
			sleep 0.1
		done
	fi
fi
while kill -0 "$lpid" 2>/dev/null; do
	sample_cpu
	sleep 0.5
done
wait "$lpid"
st=$?
lpid=

sec() { [ -n "$1" ] && awk -v m="$1" 'BEGIN { printf "%.1f", m / 1000 }' || echo none; }
clean=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$log")
mism=$(grep -c 'verify: [0-9]* rows checked, [1-9][0-9]* mismatched' "$log")
dead=$(grep -c '^\[scheduler\] .*server [0-9]* (.*) declared dead' "$log")
blind=$(sed -n 's/^\[scheduler\] .*did not run for \([0-9]*\) ms.*/\1/p' "$log" |
	awk '{ s += $1 } END { print s + 0 }')
self=$(grep -c '^\[scheduler\] .*suspects itself' "$log")
echo "servers: $S"
echo "workers: $W"
echo "replicas: $R"
echo "formation_s: $(sec "$formation")"
echo "joined_s: $(sec "$joined")"
echo "killed: ${killed:-none}"
echo "failover_s: $(sec "$failover")"
echo "exit: $st"
echo "clean: $clean"
echo "mismatched: $mism"
echo "blind_ms: $blind"
echo "self_suspicions: $self"
echo "false_dead: $(( dead > 0 ? dead - 1 : 0 ))"
echo "sched_cpu_s: $(awk -v t="$cpu" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t / hz }')"
echo "log: $out"
ok=0
[ "$st" -eq 0 ] || ok=1
[ "$clean" -eq "$W" ] || ok=1
[ -n "$killed" ] && [ -n "$failover" ] && [ "$dead" -eq 1 ] || ok=1
exit "$ok"
