#!/bin/sh
# tests/chaos/self_check.sh - the chaos harness catches what it must: a
# short run without faults passes, and a run in which one worker exits
# non-zero, prints a verify line with mismatched rows (exiting 0), or stops
# at half time, each fails with that failure named (chaos.py --self-check).
#
#   self_check.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: self_check.sh TOOLS_DIR}
chaos=$(dirname "$0")/chaos.py
out=$(mktemp "${TMPDIR:-/tmp}/emb-chaos-check-XXXXXX")
trap 'rm -f "$out"' EXIT
fail=0

# run EXPECTED_STATUS PATTERN [ARGS...]: one 10 s job, no faults, on
# loopback. A 10 s heartbeat timeout: these runs check the harness, and a
# loaded machine must not end their job for it.
run() {
	want=$1
	pat=$2
	shift 2
	python3 "$chaos" --bin-dir "$tools" --seconds 10 --quiet 2 --kinds "" \
		--hb-timeout 10 --netns off \
		--report-interval 1 "$@" >"$out" 2>&1
	st=$?
	if [ "$st" -ne "$want" ] || ! grep -q "$pat" "$out"; then
		bad "chaos.py $* exited $st (want $want) or lacks '$pat'"
		cat "$out" >&2
	fi
}

run 0 '^result: ok$'
# The failures are listed by worker: the other worker, stopped by launch
# when this one failed, may come first ("killed by Terminated").
run 1 '^result: FAILED: .*worker.[01] exited 3' --self-check exit
run 1 '^result: FAILED: .*worker.[01]: 1 mismatched of' --self-check mismatch
run 1 '^result: FAILED: .*worker.[01] ended early' --self-check early
# --json: one object with the figures, the failures named in it.
python3 "$chaos" --bin-dir "$tools" --seconds 10 --quiet 2 --kinds "" \
	--hb-timeout 10 --netns off --report-interval 1 --self-check exit \
	--json >"$out" 2>/dev/null
python3 -c 'import json, sys
f = json.load(open(sys.argv[1]))
# Whichever worker did not exit 3 may be stopped by launch before its
# verify line: one of them printed it.
assert f["failures"], f
assert any(w["verify"] for w in f["workers"].values()), f
assert f["step_latency"]["before_faults"]["intervals"] > 0, f' "$out" ||
	bad "--json: no figures or no failure in it"
exit "$fail"
