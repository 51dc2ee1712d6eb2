#!/bin/sh
# tests/scale/netdc_job.sh BUILD - a training job across a simulated
# datacenter (tests/scale/netdc.sh): 4 hosts whose links add 100 us each
# way (10 Gbit/s), the scheduler and 2 servers (R = 2) on two of them, 2
# workers running embstore-bench --op step --verify on the other two. The
# measured round trip must show the delay, every process must exit 0 and
# every worker must have verified its rows with 0 mismatched.
#
# The same command as docs/deploy.md's "A datacenter on one machine". Exits
# 77 (SKIP) where netem is refused (a kernel without sch_netem: .ci/run
# runs the netdc suite in a VM whose kernel has it) or without root.
set -u
build=$(cd "${1:?usage: netdc_job.sh BUILD}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/emb-netdcjob-XXXXXX") || exit 1
trap 'rm -rf "$logs"' EXIT

# A slow machine (a VM emulating its CPU) forms the job slowly: long
# timeouts, a fixed number of batches rather than a duration.
"$here/netdc.sh" --hosts 4 --delay 100us --rate 10gbit --servers 2 \
	--workers 2 --replicas 2 --bin "$build/tools" --logs "$logs" \
	--timeout 500 -- "$build/tools/embstore-bench" --op step --verify \
	--rows 20000 --dim 8 --batch 512 --batches 200 | tee "$logs/netdc.out"
rc=$?
# tee's status hides netdc.sh's: read it from the output.
grep -q '^SKIP: ' "$logs/netdc.out" && exit 77
grep -q 'every process exited 0' "$logs/netdc.out" || {
	for f in "$logs"/*.log; do
		echo "==== $f"
		cat "$f"
	done
	echo "FAIL: the job did not end cleanly ($rc)"
	exit 1
}
grep -q '^netdc: rtt h3 -> h0: p50 ' "$logs/netdc.out" ||
	{ echo "FAIL: no round trip measured"; exit 1; }
for w in 0 1; do
	grep -q "verify: [1-9][0-9]* rows checked, 0 mismatched" \
		"$logs/worker.$w.log" ||
		{ cat "$logs/worker.$w.log"; echo "FAIL: worker.$w"; exit 1; }
	grep 'verify:' "$logs/worker.$w.log"
done
echo "netdc job: 4 hosts, 100 us each way, 2 servers (R = 2), 2 workers: ok"
