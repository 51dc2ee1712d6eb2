#!/bin/sh
# tests/tools/onesided_cpu.sh BUILD - tools/onesided-cpu-vm.sh on a tiny
# table, one short round: it must print a line per run and a summary per
# pull mode with figures, and the one-sided runs must have READ rows. Only
# in the Soft-RoCE VM (RDMA_VM_IP set); elsewhere 77 (SKIP).
[ -n "$RDMA_VM_IP" ] || exit 77
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:?usage: onesided_cpu.sh BUILD}" && pwd)
out=$(ROUNDS=1 ROWS=5000 WARMUP=1 DURATION=4 \
	"$SRC/tools/onesided-cpu-vm.sh" "$BUILD" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
for m in twosided onesided; do
	echo "$out" | grep -q "^$m: rows/s median [1-9]" ||
		{ echo "FAIL: no $m summary"; exit 1; }
done
echo "$out" | grep "^round 1 onesided:" | grep -q "rows READ [1-9]" ||
	{ echo "FAIL: the one-sided run READ no rows"; exit 1; }
