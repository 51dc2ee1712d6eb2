#!/bin/sh
# tests/cluster/prompt.sh - a job's first writes and its end wait for no
# heartbeat. With EMB_HEARTBEAT_TIMEOUT=60 every node heartbeats once at
# its start and then every 12 s; `embstore launch` of 2 servers and 2
# workers pushing a few batches (--verify) must still end in under 10 s,
# unreplicated and with --replicas 2:
#   - the servers hold a FINISH the scheduler answers the moment the last
#     worker is done (docs/protocol.md, "Finish hold"); told by their next
#     heartbeat instead, they ended every job up to 12 s late here (2 s
#     at the default timeout);
#   - a replicated job's server asked a write routed by a map it lacks
#     fetches that map at once (docs/replication.md, "Map epochs"); left
#     to its next heartbeat, its first writes were refused for as long.
#
#   prompt.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: prompt.sh TOOLS_DIR}
tools=$(cd "$tools" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-prompt-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=60
EMB_CLUSTER_TIMEOUT=60
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN
fail=0
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

bad() {
	echo "FAIL: $*" >&2
	fail=1
}

for r in 1 2; do
	t0=$(date +%s.%N)
	embstore launch --server_num 2 --worker_num 2 --replicas $r \
		--log-dir "$work/log$r" -- embstore-bench --op push --verify \
		--rows 2000 --dim 8 --batch 256 --batches 3 \
		>"$work/out$r" 2>&1 || bad "R=$r: launch exited $?"
	t1=$(date +%s.%N)
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	echo "R=$r: the job took $secs s (heartbeats every 12 s)"
	awk -v s="$secs" 'BEGIN { exit !(s < 10) }' ||
		bad "R=$r: the job took $secs s: it waited for a heartbeat"
	[ "$(grep -c 'verify: .* 0 mismatched' "$work/out$r")" = 2 ] ||
		bad "R=$r: not both workers verified 0 mismatched"
	[ "$(cat "$work/log$r"/server.*.log | grep -c ': job finished')" = 2 ] ||
		bad "R=$r: a server did not hear the job finish"
	[ "$fail" = 0 ] || tail -n 20 "$work/out$r" "$work/log$r"/*.log >&2
done
exit $fail
