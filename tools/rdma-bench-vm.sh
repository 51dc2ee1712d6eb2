#!/bin/sh
# tools/rdma-bench-vm.sh - embstore-bench over RDMA and over TCP against
# servers in the Soft-RoCE VM, and perftest at the response size, in one run.
#
#   ../shared/rdma-vm/run -- tools/rdma-bench-vm.sh [BUILD_DIR]
#
# Environment: ROWS (100000), ZC (on|off: the RDMA server's zero-copy pulls).
B=${1:-build}
ROWS=${ROWS:-100000}
if [ -z "$RDMA_VM_IP" ]; then
    echo "rdma-bench-vm: run inside ../shared/rdma-vm (RDMA_VM_IP unset)" >&2
    exit 2
fi
$B/tools/embstore-server --transport rdma --listen "$RDMA_VM_IP:7164" \
    --threads 2 --log-level warn ${ZC:+--zero-copy-pulls $ZC} &
S1=$!
$B/tools/embstore-server --transport tcp --listen "$RDMA_VM_IP:7165" \
    --threads 2 --log-level warn &
S2=$!
sleep 3
for t in rdma tcp; do
    port=7164
    [ $t = tcp ] && port=7165
    for op in pull push; do
        $B/tools/embstore-bench --servers "$RDMA_VM_IP:$port" --transport $t \
            --rows "$ROWS" --batch 4096 --dim 64 --dist zipf:1.05 --op $op \
            --duration 5 --json 2>/dev/null
    done
done
kill $S1 $S2
wait
for tool in ib_write_bw ib_send_bw; do
    $tool -R -d rxe0 -s 1048576 -n 100 >/dev/null 2>&1 &
    sleep 2
    echo "$tool: $($tool -R -d rxe0 -s 1048576 -n 100 "$RDMA_VM_IP" 2>&1 |
        grep -A1 '#bytes' | tail -n 1)"
    wait
done
