#!/bin/sh
# tests/scale/netdc_job.sh SRC BUILD - docs/deploy.md's "A datacenter on one
# machine", run as written: a training job across tests/scale/netdc.sh's
# 4 hosts whose links add 100 us each way (10 Gbit/s), the scheduler and 2
# servers (R = 2) on two of them, 2 workers running embstore-bench --op
# step --verify on the other two. The measured round trip must show the
# delay, every process must exit 0 and every worker must have verified
# its rows with 0 mismatched.
#
# The command is the sh block after the page's "<!-- not run: needs
# sch_netem ... -->" line, run from a directory with build/ and tests/ as
# in a checkout. Exits 77 (SKIP) where netem is refused (a kernel without
# sch_netem: .ci/run runs the netdc suite in a VM whose kernel has it) or
# without root.
set -u
src=$(cd "${1:?usage: netdc_job.sh SRC BUILD}" && pwd)
build=$(cd "${2:?usage: netdc_job.sh SRC BUILD}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-netdcjob-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"
ln -s "$src/tests" "$work/tests"
awk '/^<!-- not run: needs sch_netem/ { on = 1; next }
	on && /^```sh$/ { body = 1; next }
	body && /^```$/ { exit }
	body { print }' "$src/docs/deploy.md" >"$work/cmd.sh"
grep -q 'tests/scale/netdc.sh' "$work/cmd.sh" ||
	{ echo "FAIL: no netdc.sh command in docs/deploy.md"; exit 1; }
cat "$work/cmd.sh"

(cd "$work" && EMB_BIN_DIR=$build/tools sh ./cmd.sh) >"$work/out" 2>&1
rc=$?
cat "$work/out"
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || { echo "FAIL: netdc.sh exited with $rc"; exit 1; }
grep -q '^netdc: rtt h3 -> h0: p50 ' "$work/out" ||
	{ echo "FAIL: no round trip measured"; exit 1; }
grep -q 'netem delay 100us rate 10gbit' "$work/out" ||
	{ echo "FAIL: the links are not slowed"; exit 1; }
# Where the machine's own round trip is slower than the delay (a VM), the
# round trip alone cannot prove netem: every host's traffic went through it.
for h in 0 1 2 3; do
	grep -q "^netdc: h$h sent through netem: [0-9]* bytes, [1-9][0-9]* packets" \
		"$work/out" || { echo "FAIL: h$h sent nothing through netem"; exit 1; }
done
for w in 0 1; do
	grep -q "^netdc: worker.$w: verify: [1-9][0-9]* rows checked, 0 mismatched" \
		"$work/out" || { echo "FAIL: worker.$w did not verify clean"; exit 1; }
done
echo "netdc job: 4 hosts, 100 us each way, 2 servers (R = 2), 2 workers: ok"
