#!/bin/sh
# tests/cluster/netns.sh - a multi-host cluster on one machine: scheduler,
# two servers and two workers, each in a network namespace of its own,
# joined by veth pairs to a bridge in a sixth ("hub") namespace, so the
# host's own network is never touched. The workers train over TCP through
# emb_client_from_env() (the MindSpore variable names, for once) and
# finish; every process must exit 0, and servers bound to 0.0.0.0 must be
# recorded at their namespace's address.
#
#   netns.sh EMBSTORE_SERVER TRAINER
#
# Exits 77 (meson's SKIP) with a message where namespaces cannot be made
# (not root, no ip(8), no netns support). Everything it creates is removed
# on exit, whatever the outcome.
set -u

server=${1:?usage: netns.sh EMBSTORE_SERVER TRAINER}
trainer=${2:?usage: netns.sh EMBSTORE_SERVER TRAINER}
p=e$$ # names stay under 15 bytes: e<pid><suffix>
nodes="sch s0 s1 w0 w1"
logs=$(mktemp -d "${TMPDIR:-/tmp}/emb-netns-XXXXXX")
# shellcheck source=netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# One /24 on the bridge: .1 scheduler, .2 .3 servers, .4 .5 workers.
netns_up 10.77.0

# The MindSpore names: the scripts of docs/deploy.md, one per namespace.
common="MS_SCHED_HOST=10.77.0.1 MS_SCHED_PORT=8081 MS_SERVER_NUM=2
	MS_WORKER_NUM=2 EMB_HEARTBEAT_TIMEOUT=3 EMB_CLUSTER_TIMEOUT=60
	EMB_THREADS=1"

# shellcheck disable=SC2086 # $common is a list of assignments
ip netns exec "${p}sch" env $common MS_ROLE=MS_SCHED "$server" \
	>"$logs/scheduler.log" 2>&1 &
sched=$!
pids="$pids $sched"
for s in 0 1; do
	# shellcheck disable=SC2086
	ip netns exec "${p}s$s" env $common MS_ROLE=MS_PSERVER "$server" \
		--listen 0.0.0.0:7164 >"$logs/server.$s.log" 2>&1 &
	eval "srv$s=\$!"
	pids="$pids $!"
done
for w in 0 1; do
	# shellcheck disable=SC2086
	ip netns exec "${p}w$w" env $common MS_ROLE=MS_WORKER "$trainer" \
		--steps 50 >"$logs/worker.$w.log" 2>&1 &
	eval "wk$w=\$!"
	pids="$pids $!"
done

# Bounded waits: a hung node fails the test instead of hanging it.
deadline=$(($(date +%s) + 90))
netns_wait "$wk0" worker.0
netns_wait "$wk1" worker.1
netns_wait "$srv0" server.0
netns_wait "$srv1" server.1
netns_wait "$sched" scheduler

grep -q "cluster ready: 2 servers, 2 workers" "$logs/scheduler.log" ||
	fail "scheduler never reported the cluster ready"
for a in 10.77.0.2:7164 10.77.0.3:7164; do
	grep -q "assigned server rank [01] to $a " "$logs/scheduler.log" ||
		fail "no server registered at $a"
done
for w in 0 1; do
	grep -q "50 steps done, finish: success" "$logs/worker.$w.log" ||
		fail "worker.$w did not finish its steps"
done
status=0
echo "netns cluster: 2 servers, 2 workers in 5 namespaces: ok"
exit 0
