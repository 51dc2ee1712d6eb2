# tests/cluster/netns_lib.sh - sourced by the network-namespace tests: one
# namespace per node, each joined by a veth pair to a bridge in a "hub"
# namespace, so the host's own network is never touched.
#
# The caller sets, before sourcing:
#   p      a prefix for every name (names stay under 15 bytes: X<pid><suffix>)
#   nodes  the node names, in address order (.1, .2, ... of the /24)
#   logs   a directory for the nodes' logs (shown when the test fails)
# and keeps in $pids what it starts and in $status how it ends (77 = skip).
# Sourcing installs the cleanup: processes killed, namespaces deleted,
# logs printed on failure and removed.

hub=${p}hub
pids=""
status=1

netns_cleanup() {
	for pid in $pids; do
		kill -KILL "$pid" 2>/dev/null
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
	rm -rf "$logs"
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
