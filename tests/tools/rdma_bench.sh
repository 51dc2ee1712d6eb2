#!/bin/sh
# tests/tools/rdma_bench.sh BUILD - tools/rdma-bench-vm.sh (docs/rdma.md)
# for one short round with two client threads: the RDMA run must have
# gone over RDMA and the TCP run over TCP, each receiving bytes, and
# ib_write_bw must have reported its rate. Only in the Soft-RoCE VM
# (RDMA_VM_IP set); elsewhere 77 (SKIP).
[ -n "$RDMA_VM_IP" ] || exit 77
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:?usage: rdma_bench.sh BUILD}" && pwd)
out=$(ROUNDS=1 ROWS=5000 DURATION=2 ITERS=10 THREADS=2 \
	"$SRC/tools/rdma-bench-vm.sh" "$BUILD" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
echo "$out" | grep -q "^round 1 auto: rdma rows/s [1-9].* bytes_in/s [1-9]" ||
	{ echo "FAIL: no RDMA pull figures"; exit 1; }
echo "$out" | grep -q "^round 1 tcp: tcp rows/s [1-9].* bytes_in/s [1-9]" ||
	{ echo "FAIL: no TCP pull figures"; exit 1; }
echo "$out" | grep -q "^round 1 ib_write_bw: bytes/s [1-9]" ||
	{ echo "FAIL: no ib_write_bw figure"; exit 1; }
