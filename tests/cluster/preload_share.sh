#!/bin/sh
# tests/cluster/preload_share.sh - in a job, each embstore-bench worker
# preloads its own share of the table's rows, not all of them: `embstore
# launch --server_num 2 --worker_num 4 --replicas 2` runs `embstore-bench
# --op push --verify --rows 4000`, and each worker must report 1000 rows
# preloaded, the four shares together the whole table, and verify clean.
# Every worker preloading every row made a job's preload grow with the
# square of its size (rows = 100 x workers in tools/bench-cluster.sh): at
# 450 workers, 20 million pulls, which outlasted the run and looked like
# a hang after its server kill.
#
#   preload_share.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: preload_share.sh TOOLS_DIR}
tools=$(cd "$tools" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-preload-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_CLUSTER_TIMEOUT=60
export EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN
fail=0
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

out=$work/launch.txt
(cd "$work" && exec timeout -k 10 150 embstore launch --server_num 2 \
	--worker_num 4 --replicas 2 --log-dir "$work/log" -- \
	embstore-bench --op push --verify --rows 4000 --dim 8 --batch 32 \
	--duration 1) >"$out" 2>&1
st=$?
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c '^\[worker\.[0-3]\]   preload  1000 rows in ' "$out")
[ "$n" -eq 4 ] || bad "$n of 4 workers preloaded 1000 rows: $(grep ' preload ' "$out")"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 4 ] || bad "$n of 4 workers verified clean"
if [ "$fail" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then
	tail -60 "$out" >&2
fi
exit "$fail"
