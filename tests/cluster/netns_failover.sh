#!/bin/sh
# tests/cluster/netns_failover.sh - replication across hosts: a scheduler
# (EMB_REPLICAS=2), three servers and two workers running embstore-bench
# --op push --verify, each in a network namespace of its own on a bridge,
# as netns.sh builds them. While the workers push, one server's link is
# cut (its veth on the bridge goes down): the process lives on, but nobody
# hears from it. The scheduler declares it dead after the heartbeat
# timeout, its slots fail over, and both workers must exit 0 with 0
# mismatched rows; the scheduler and the other servers exit 0.
#
#   netns_failover.sh EMBSTORE_SERVER EMBSTORE_BENCH
#
# Exits 77 (meson's SKIP) where namespaces cannot be made. Everything it
# creates is removed on exit, whatever the outcome.
set -u

server=${1:?usage: netns_failover.sh EMBSTORE_SERVER EMBSTORE_BENCH}
bench=${2:?usage: netns_failover.sh EMBSTORE_SERVER EMBSTORE_BENCH}
p=f$$ # names stay under 15 bytes: f<pid><suffix>
nodes="sch s0 s1 s2 w0 w1"
logs=$(mktemp -d "${TMPDIR:-/tmp}/emb-netnsf-XXXXXX")
# shellcheck source=netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# One /24 on the bridge: .1 scheduler, .2 .3 .4 servers, .5 .6 workers.
netns_up 10.78.0

common="EMB_SCHED_HOST=10.78.0.1 EMB_SCHED_PORT=8081 EMB_SERVER_NUM=3
	EMB_WORKER_NUM=2 EMB_REPLICAS=2 EMB_HEARTBEAT_TIMEOUT=1
	EMB_CLUSTER_TIMEOUT=60 EMB_THREADS=1"

# shellcheck disable=SC2086 # $common is a list of assignments
ip netns exec "${p}sch" env $common EMB_ROLE=scheduler "$server" \
	>"$logs/scheduler.log" 2>&1 &
sched=$!
pids="$pids $sched"
for s in 0 1 2; do
	# shellcheck disable=SC2086
	ip netns exec "${p}s$s" env $common EMB_ROLE=server "$server" \
		--listen 0.0.0.0:7164 >"$logs/server.$s.log" 2>&1 &
	eval "srv$s=\$!"
	pids="$pids $!"
done
for w in 0 1; do
	# shellcheck disable=SC2086
	ip netns exec "${p}w$w" env $common EMB_ROLE=worker "$bench" \
		--op push --verify --rows 20000 --dim 8 --batch 512 \
		--duration 8 >"$logs/worker.$w.log" 2>&1 &
	eval "wk$w=\$!"
	pids="$pids $!"
done

# Cut server 1's link 3 s after both workers joined.
deadline=$(($(date +%s) + 90))
while [ "$(cat "$logs"/worker.*.log | grep -c 'of 2 joined')" -lt 2 ]; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "the workers never joined"
	sleep 0.1
done
sleep 3
ip -n "$hub" link set "${p}s1h" down || fail "cannot cut server 1's link"

netns_wait "$wk0" worker.0
netns_wait "$wk1" worker.1
netns_wait "$srv0" server.0
netns_wait "$srv2" server.2
netns_wait "$sched" scheduler

grep -q "declared dead: silent for" "$logs/scheduler.log" ||
	fail "the cut-off server was not declared dead for its silence"
grep -q "map epoch 2: server [0-2] removed" "$logs/scheduler.log" ||
	fail "the map did not fail over"
for w in 0 1; do
	grep -q "verify: [0-9]* rows checked, 0 mismatched" \
		"$logs/worker.$w.log" || fail "worker.$w did not verify clean"
done
status=0
echo "netns failover: a server's link cut, 2 workers verified: ok"
exit 0
