#!/bin/sh
# tests/scale/netdc.sh - a datacenter on one machine: H network namespaces
# ("hosts") on one bridge, each host's link slowed by netem (a one-way
# delay and a rate limit), and an embstore job spread over them: the
# scheduler on host 0, servers round-robin on the first half of the hosts,
# workers round-robin on the others. Before the job, a TCP ping-pong
# between the last host and host 0 (embstore-echo-server and -client, one
# 8-byte row a round trip) measures the round trip the job will see, and
# the run fails if it is below 2 x DELAY: the latency is real or nothing
# runs.
#
#   netdc.sh [--hosts H] [--delay D] [--rate R] [--servers S]
#            [--workers W] [--replicas R] [--server-hosts K]
#            [--timeout SECONDS] [--min-rtt US] [--bin DIR] [--logs DIR]
#            -- WORKER COMMAND...
#
#   --hosts H         namespaces, 2..64 (4)
#   --delay D         tc's time, e.g. 100us, added to every packet a host
#                     sends; 0 for no netem at all (100us)
#   --rate R          tc's rate, e.g. 10gbit, each host's send rate at most;
#                     "" for no limit (10gbit)
#   --servers S       servers (2), on hosts 0 .. K-1, ports 7164, 7165 ...
#   --workers W       workers (2), on hosts K .. H-1, each running the
#                     command with EMB_ROLE=worker and the job's EMB_*
#                     variables; it joins with emb_client_from_env()
#   --replicas R      EMB_REPLICAS of the job (1)
#   --server-hosts K  hosts that run servers (H / 2)
#   --timeout S       the whole job, formation to the last exit (600)
#   --min-rtt US      fail unless the measured round trip's median is at
#                     least this (default 2 x DELAY; 0: no check)
#   --bin DIR         embstore-server and embstore-echo-server/-client
#                     ($EMB_BIN_DIR, else the checkout's build/tools)
#   --logs DIR        keep every process's log there (scheduler.log,
#                     server.N.log, worker.N.log: stdout and stderr);
#                     otherwise they are printed on failure and removed
#
# The rest of the environment (EMB_THREADS, EMB_LOG_LEVEL, ...) reaches
# every process; EMB_HEARTBEAT_TIMEOUT (10) and EMB_CLUSTER_TIMEOUT (120)
# default long, for slow machines, and EMB_TRANSPORT to tcp. Exits 0 when
# every process exited 0, 1 otherwise, 77 (meson's SKIP) where namespaces
# or netem cannot be made (not root, no sch_netem). Needs root, ip(8) and tc(8). Everything it
# creates is named after its pid and removed on exit, whatever the
# outcome; it touches no interface or address outside its namespaces.
set -u

usage() {
	sed -n '12,16p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
case ${1:-} in
-h | --help)
	sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
	;;
esac

here=$(cd "$(dirname "$0")" && pwd)
hosts=4
delay=100us
rate=10gbit
nserv=2
nwork=2
replicas=1
shosts=
timeout=600
min_rtt=
bin=${EMB_BIN_DIR:-$here/../../build/tools}
keep=
while [ $# -gt 0 ]; do
	case $1 in
	--hosts) hosts=$2 ;;
	--delay) delay=$2 ;;
	--rate) rate=$2 ;;
	--servers) nserv=$2 ;;
	--workers) nwork=$2 ;;
	--replicas) replicas=$2 ;;
	--server-hosts) shosts=$2 ;;
	--timeout) timeout=$2 ;;
	--min-rtt) min_rtt=$2 ;;
	--bin) bin=$2 ;;
	--logs) keep=$2 ;;
	--) shift; break ;;
	*) usage ;;
	esac
	[ $# -ge 2 ] || usage
	shift 2
done
[ $# -gt 0 ] || usage
isnum() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }
for v in "$hosts" "$nserv" "$nwork" "$replicas" "$timeout"; do
	isnum "$v" || usage
done
[ -n "$shosts" ] || shosts=$((hosts / 2))
isnum "$shosts" || usage
if [ "$hosts" -lt 2 ] || [ "$hosts" -gt 64 ] || [ "$shosts" -lt 1 ] ||
	[ "$shosts" -ge "$hosts" ] || [ "$nserv" -lt 1 ] ||
	[ "$nserv" -gt 200 ] || [ "$nwork" -lt 1 ] || [ "$replicas" -lt 1 ]; then
	echo "netdc: need 2 <= hosts <= 64, 1 <= server-hosts < hosts," \
		"1..200 servers, workers and replicas >= 1" >&2
	exit 2
fi
# The delay in microseconds, for the round trip's check: tc's units.
delay_us=$(echo "$delay" | awk '
	/^[0-9.]+(us|usec)?$/ { printf "%d", $0 + 0; ok = 1 }
	/^[0-9.]+(ms|msec)$/  { printf "%d", ($0 + 0) * 1000; ok = 1 }
	/^[0-9.]+(s|sec)$/    { printf "%d", ($0 + 0) * 1000000; ok = 1 }
	END { exit !ok }') || {
	echo "netdc: bad --delay '$delay' (e.g. 100us, 0.2ms)" >&2
	exit 2
}
[ -n "$min_rtt" ] || min_rtt=$((2 * delay_us))
isnum "$min_rtt" || usage
for b in embstore-server embstore-echo-server embstore-echo-client; do
	[ -x "$bin/$b" ] || {
		echo "netdc: no $bin/$b (build first, or --bin DIR)" >&2
		exit 2
	}
done
bin=$(cd "$bin" && pwd)

p=d$$ # names stay under 15 bytes: d<pid>h<n>h
nodes=
i=0
while [ "$i" -lt "$hosts" ]; do
	nodes="$nodes h$i"
	i=$((i + 1))
done
if [ -n "$keep" ]; then
	mkdir -p "$keep" || exit 2
	logs=$(cd "$keep" && pwd)
	netns_keep_logs=1
else
	logs=$(mktemp -d "${TMPDIR:-/tmp}/emb-netdc-XXXXXX")
fi
# shellcheck source=tests/cluster/netns_lib.sh
. "$here/../cluster/netns_lib.sh"

# One /24 on the bridge: host i at .i+1.
net=10.81.0
netns_up "$net"
# Everything runs in the background and is waited for with netns_wait
# (netns_lib.sh): a signal then stops the harness (and cleans up) at once,
# not after a command in the foreground ends.
deadline=$(($(date +%s) + timeout))

# The round trip as the job will meet it, last host -> host 0: one second
# of ping-pong, one 8-byte row each way. Sets rtt50 and rtt99 (us). The
# first round trip on fresh links can take a second or two (the first
# neighbour lookups): an untimed warm-up takes it.
last=h$((hosts - 1))
ip netns exec "${p}h0" "$bin/embstore-echo-server" --listen "$net.1:7180" \
	--row-bytes 8 >"$logs/echo-server.log" 2>&1 &
echo_pid=$!
pids="$pids $echo_pid"
until grep -q '^listening on' "$logs/echo-server.log"; do
	kill -0 "$echo_pid" 2>/dev/null || fail "the echo server exited"
	[ "$(date +%s)" -lt "$deadline" ] || fail "the echo server never listened"
	sleep 0.1
done
measure_rtt() {
	for _m in warmup timed; do
		ip netns exec "$p$last" "$bin/embstore-echo-client" \
			--connect "$net.1:7180" --batch 1 --row-bytes 8 \
			--seconds 1 >"$logs/rtt.log" 2>&1 &
		pids="$pids $!"
		netns_wait $! "the round-trip measure"
		[ -n "${rtt_warm:-}" ] && break
		rtt_warm=1
	done
	rtt50=$(sed -n 's/.* p50_us=\([0-9.]*\).*/\1/p' "$logs/rtt.log")
	rtt99=$(sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' "$logs/rtt.log")
	[ -n "$rtt50" ] || fail "no round trip measured"
}

# The bare bridge first, for comparison, then netem on every host.
link="no netem"
if [ "$delay_us" -gt 0 ]; then
	measure_rtt
	echo "netdc: rtt $last -> h0 without netem: p50 $rtt50 us, p99 $rtt99 us"
	for n in $nodes; do
		netns_netem "$n" "$delay" "$rate"
	done
	link="netem delay $delay rate ${rate:-unlimited}"
fi
echo "netdc: $hosts hosts on a bridge, each link: $link;" \
	"servers on h0..h$((shosts - 1)), workers on h$shosts..h$((hosts - 1))"
measure_rtt
kill "$echo_pid" 2>/dev/null
wait "$echo_pid" 2>/dev/null
echo "netdc: rtt $last -> h0: p50 $rtt50 us, p99 $rtt99 us" \
	"(expected at least $min_rtt us)"
awk -v r="$rtt50" -v m="$min_rtt" 'BEGIN { exit !(r >= m) }' ||
	fail "round trip $rtt50 us is below $min_rtt us: the delay is not applied"

# The job. Every process gets the job's variables; the caller's
# EMB_HEARTBEAT_TIMEOUT, EMB_CLUSTER_TIMEOUT and EMB_TRANSPORT win over
# these defaults (TCP: a namespace has no RDMA device, even where the
# machine has one).
export EMB_SCHED_HOST="$net.1" EMB_SCHED_PORT=8081 EMB_SERVER_NUM="$nserv" \
	EMB_WORKER_NUM="$nwork" EMB_REPLICAS="$replicas" \
	EMB_HEARTBEAT_TIMEOUT="${EMB_HEARTBEAT_TIMEOUT:-10}" \
	EMB_TRANSPORT="${EMB_TRANSPORT:-tcp}" \
	EMB_CLUSTER_TIMEOUT="${EMB_CLUSTER_TIMEOUT:-120}"
ip netns exec "${p}h0" env EMB_ROLE=scheduler "$bin/embstore-server" \
	>"$logs/scheduler.log" 2>&1 &
sched=$!
pids="$pids $sched"
servers=
s=0
while [ "$s" -lt "$nserv" ]; do
	h=$((s % shosts))
	ip netns exec "${p}h$h" env EMB_ROLE=server "$bin/embstore-server" \
		--listen "$net.$((h + 1)):$((7164 + s))" \
		>"$logs/server.$s.log" 2>&1 &
	servers="$servers $!"
	pids="$pids $!"
	s=$((s + 1))
done
workers=
w=0
while [ "$w" -lt "$nwork" ]; do
	h=$((shosts + w % (hosts - shosts)))
	ip netns exec "${p}h$h" env EMB_ROLE=worker "$@" \
		>"$logs/worker.$w.log" 2>&1 &
	workers="$workers $!"
	pids="$pids $!"
	w=$((w + 1))
done
start=$(date +%s)

# Every process must exit 0: the workers when their command is done, the
# servers and the scheduler on their own after that. The first one that
# fails ends the run at once (a server that cannot listen would otherwise
# leave the workers waiting for the cluster to form).
names=scheduler
s=0
for pid in $servers; do
	names="$names server.$s"
	s=$((s + 1))
done
w=0
for pid in $workers; do
	names="$names worker.$w"
	w=$((w + 1))
done
running="$sched $servers $workers"
while [ -n "$running" ]; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "still running after $timeout s"
	left=
	for pid in $running; do
		if kill -0 "$pid" 2>/dev/null; then
			left="$left $pid"
			continue
		fi
		wait "$pid"
		rc=$?
		[ "$rc" -eq 0 ] && continue
		# The name at the same place in $names as pid in the job.
		i=0
		for q in $sched $servers $workers; do
			i=$((i + 1))
			[ "$q" = "$pid" ] && break
		done
		fail "$(echo "$names" | cut -d' ' -f"$i") exited with $rc"
	done
	running=$left
	[ -z "$running" ] || sleep 0.2
done
# What went through each host's netem: the job's traffic was delayed.
if [ "$delay_us" -gt 0 ]; then
	for n in $nodes; do
		sent=$(tc -s -n "$p$n" qdisc show dev eth0 | sed -n \
			's/^ *Sent \([0-9]*\) bytes \([0-9]*\) pkt.*/\1 bytes, \2 packets/p')
		echo "netdc: $n sent through netem: $sent"
	done
fi
# Each worker's last line (embstore-bench: its verify line, if any).
w=0
for pid in $workers; do
	echo "netdc: worker.$w: $(tail -n 1 "$logs/worker.$w.log")"
	w=$((w + 1))
done
status=0
echo "netdc: $nserv servers, $nwork workers on $hosts hosts: every" \
	"process exited 0 ($(($(date +%s) - start)) s)"
exit 0
