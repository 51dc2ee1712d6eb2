#!/bin/sh
# tests/chaos/smoke.sh - a short chaos run: the replicated job of chaos.py
# for 40 s with two faults, a server SIGKILLed (and replaced) and a server
# partitioned by its network namespace (a second kill where namespaces
# cannot be made). Every worker must exit 0 with 0 mismatched rows. CI runs
# the 3-minute version with every fault kind (.ci/run, step_chaos).
#
#   smoke.sh TOOLS_DIR
set -u
tools=${1:?usage: smoke.sh TOOLS_DIR}
exec python3 "$(dirname "$0")/chaos.py" --bin-dir "$tools" --seconds 40 \
	--quiet 8 --fault-every 12 --max-faults 2 --kinds kill,partition \
	--seed "${EMB_CHAOS_SEED:-1}"
