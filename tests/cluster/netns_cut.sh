#!/bin/sh
# tests/cluster/netns_cut.sh - a link cut between one worker and one server
# alone (docs/api.md, "Deadlines"): the scheduler, three servers (R = 2)
# and a worker, each in a network namespace of its own on one bridge. Once
# the worker steps (tests/cluster/cut_worker.c, a 3 s call deadline), the
# path between it and server 1 is cut both ways: each side's neighbour
# entry for the other points at a MAC address nobody has, so frames
# vanish without a reset, while both still reach the scheduler, which
# therefore declares nobody dead. The worker's next step must fail within
# its deadline (plus a margin for the loop's reaction and one connect
# attempt) with -ETIMEDOUT, the message naming server 1's address and
# rank; the scheduler must not have failed the server over.
#
#   netns_cut.sh EMBSTORE_SERVER CUT_WORKER
#
# Exits 77 (meson's SKIP) where namespaces cannot be made. Everything it
# creates is removed on exit.
set -u

server=${1:?usage: netns_cut.sh EMBSTORE_SERVER CUT_WORKER}
worker=${2:?usage: netns_cut.sh EMBSTORE_SERVER CUT_WORKER}
p=c$$ # names stay under 15 bytes: c<pid><suffix>
nodes="sch s0 s1 s2 w0"
logs=$(mktemp -d "${TMPDIR:-/tmp}/emb-netnscut-XXXXXX")
# shellcheck source=netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# One /24 on the bridge: .1 scheduler, .2 .3 .4 servers, .5 the worker.
netns_up 10.79.0
timeout_ms=3000

common="EMB_SCHED_HOST=10.79.0.1 EMB_SCHED_PORT=8081 EMB_SERVER_NUM=3
	EMB_WORKER_NUM=1 EMB_REPLICAS=2 EMB_HEARTBEAT_TIMEOUT=2
	EMB_CLUSTER_TIMEOUT=60 EMB_THREADS=1"

# shellcheck disable=SC2086 # $common is a list of assignments
ip netns exec "${p}sch" env $common EMB_ROLE=scheduler "$server" \
	>"$logs/scheduler.log" 2>&1 &
pids="$pids $!"
for s in 0 1 2; do
	# shellcheck disable=SC2086
	ip netns exec "${p}s$s" env $common EMB_ROLE=server "$server" \
		--listen 0.0.0.0:7164 >"$logs/server.$s.log" 2>&1 &
	pids="$pids $!"
done
# shellcheck disable=SC2086
ip netns exec "${p}w0" env $common EMB_ROLE=worker "$worker" "$timeout_ms" \
	>"$logs/worker.log" 2>&1 &
wk=$!
pids="$pids $wk"

deadline=$(($(date +%s) + 90))
until grep -q '^steps ' "$logs/worker.log"; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "the worker never stepped"
	kill -0 "$wk" 2>/dev/null || fail "the worker exited"
	sleep 0.1
done

# The cut: worker <-> server 1 only. (What the scheduler logged before it.)
sched_lines=$(wc -l <"$logs/scheduler.log")
ip -n "${p}w0" neigh replace 10.79.0.3 lladdr 02:00:00:00:00:99 \
	dev eth0 nud permanent || fail "cannot cut the worker's side"
ip -n "${p}s1" neigh replace 10.79.0.5 lladdr 02:00:00:00:00:98 \
	dev eth0 nud permanent || fail "cannot cut server 1's side"

while kill -0 "$wk" 2>/dev/null; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "the worker is still stepping"
	sleep 0.1
done
wait "$wk"
[ $? -eq 0 ] || fail "the worker did not fail a step"
line=$(grep '^failed after' "$logs/worker.log")
echo "$line"
ms=$(echo "$line" | sed -n 's/^failed after \([0-9]*\) ms: .*/\1/p')
[ -n "$ms" ] || fail "no failed step"
echo "$line" | grep -q ': ETIMEDOUT: server 10\.79\.0\.3:7164 (rank [0-2]): ' ||
	fail "the step did not fail with -ETIMEDOUT naming server 1"
# The deadline, plus the loop's reaction (100 ms), one connect attempt
# (1 s) and scheduling on a loaded machine; plus any time the machine
# itself stood still after the cut (a disk that held every process for
# seconds), which no deadline can hold to: the scheduler's loop measures
# it and logs each gap of a second or more.
frozen=$(tail -n "+$((sched_lines + 1))" "$logs/scheduler.log" |
	sed -n 's/.*its loop did not run for \([0-9]*\) ms.*/\1/p' |
	awk '{ t += $1 } END { print t + 0 }')
[ "$ms" -le $((timeout_ms + 1500 + frozen)) ] ||
	fail "the step took $ms ms, past its $timeout_ms ms deadline ($frozen ms of the machine frozen)"
grep -q "removed" "$logs/scheduler.log" &&
	fail "the scheduler failed a live server over"
status=0
echo "netns cut: the worker's step ended in $ms ms (deadline $timeout_ms): ok"
exit 0
