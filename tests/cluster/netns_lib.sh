# tests/cluster/netns_lib.sh - sourced by the network-namespace tests: one
# namespace per node, each joined by a veth pair to a bridge in a "hub"
# namespace, so the host's own network is never touched.
#
# The caller sets, before sourcing:
#   p      a prefix for every name (names stay under 15 bytes: X<pid><suffix>)
#   nodes  the node names, in address order (.1, .2, ... of the /24)
#   logs   a directory for the nodes' logs (shown when the test fails)
# and keeps in $pids what it starts and in $status how it ends (77 = skip).
# Sourcing installs the cleanup: processes killed (those in $pids, then any
# other still inside one of the namespaces), namespaces deleted, logs
# printed on failure and removed (kept when netns_keep_logs is set).

hub=${p}hub
pids=""
status=1

netns_cleanup() {
	for pid in $pids; do
		kill -KILL "$pid" 2>/dev/null
	done
	# A child a node started itself (a worker's own subprocess) is not in
	# $pids but lives in the node's namespace: nothing outlives the test.
	for n in $nodes; do
		for pid in $(ip netns pids "$p$n" 2>/dev/null); do
			kill -KILL "$pid" 2>/dev/null
		done
	done
	wait 2>/dev/null
	for n in $nodes; do
		ip netns del "$p$n" 2>/dev/null
	done
	ip netns del "$hub" 2>/dev/null
	if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then
		for f in "$logs"/*.log; do
			[ -f "$f" ] || continue
			echo "==== $f"
			cat "$f"
		done
	fi
	[ -n "${netns_keep_logs:-}" ] || rm -rf "$logs"
}
trap netns_cleanup EXIT
trap 'exit 1' INT TERM

skip() {
	echo "SKIP: $*"
	status=77
	exit 77
}

fail() {
	echo "FAIL: $*"
	status=1
	exit 1
}

# netns_wait PID NAME: waits for PID until the caller's $deadline (epoch
# seconds); fails unless it exited 0. A hung node fails the test instead
# of hanging it, and a harness whose processes all run in the background
# and are waited for so stops (and cleans up) at a signal at once.
netns_wait() {
	while kill -0 "$1" 2>/dev/null; do
		[ "$(date +%s)" -lt "$deadline" ] || fail "$2 still running"
		sleep 0.1
	done
	wait "$1"
	_netns_rc=$?
	[ "$_netns_rc" -eq 0 ] || fail "$2 exited with $_netns_rc"
}

# netns_up NET: the hub and its bridge, then each node at NET.1, NET.2 ...
# (NET is the first three octets of a /24) on its eth0. Skips (77) where
# namespaces, bridges or veths cannot be made.
netns_up() {
	[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
	command -v ip >/dev/null 2>&1 || skip "no ip(8)"
	ip netns add "$hub" 2>/dev/null || skip "cannot create network namespaces"
	ip -n "$hub" link add name br0 type bridge 2>/dev/null ||
		skip "no bridge support"
	ip -n "$hub" link set br0 up
	ip -n "$hub" link set lo up
	_i=1
	for n in $nodes; do
		ns=$p$n
		ip netns add "$ns" || fail "netns add $ns"
		ip link add name "${p}$n" type veth peer name "${p}${n}h" ||
			skip "no veth support"
		ip link set "${p}$n" netns "$ns"
		ip link set "${p}${n}h" netns "$hub"
		ip -n "$hub" link set "${p}${n}h" master br0 up
		ip -n "$ns" link set lo up
		ip -n "$ns" link set "${p}$n" name eth0
		ip -n "$ns" addr add "$1.$_i/24" dev eth0
		ip -n "$ns" link set eth0 up
		_i=$((_i + 1))
	done
}

# netns_netem NODE DELAY RATE: every packet NODE sends waits DELAY (tc's
# time, e.g. 100us) and leaves at RATE at most (e.g. 10gbit; "" for no
# limit), on NODE's own eth0, so the hosts' links add up: a round trip
# between two nodes costs 2 x DELAY. Skips (77) where the kernel refuses
# netem (no sch_netem module).
netns_netem() {
	command -v tc >/dev/null 2>&1 || skip "no tc(8)"
	# The default queue of 1000 packets would drop, not delay, what a
	# fast sender puts in flight within DELAY.
	# shellcheck disable=SC2086 # no rate: no words
	tc -n "$p$1" qdisc add dev eth0 root netem limit 100000 \
		delay "$2" ${3:+rate "$3"} 2>/dev/null ||
		skip "tc refused netem on $1 (no sch_netem in this kernel?)"
}
