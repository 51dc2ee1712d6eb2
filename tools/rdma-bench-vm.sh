#!/bin/sh
# tools/rdma-bench-vm.sh - embstore-bench against one "tcp,rdma" server in
# the Soft-RoCE VM, once over RDMA (--transport auto) and once over TCP at
# the same port, and perftest's ib_write_bw at the response size, in rounds
# within one VM run, so the ratios come from the same run.
#
#   ../shared/rdma-vm/run -- tools/rdma-bench-vm.sh [BUILD_DIR]
#
# Environment: ROWS (100000), DIST (uniform: ~4000 distinct ids of 4096,
# so a pull's response is ~1 MiB like perftest's messages), ROUNDS (3),
# DURATION (5 s), ITERS (150 ib_write_bw messages), ZC (on|off: the
# server's zero-copy pulls over RDMA), THREADS (1: client threads, each
# its own connection with one pull in flight).
# Per round it prints the bytes/s the client received (the transport's
# byte count of whole frames, not rows x row size) and ib_write_bw's.
B=${1:-build}
ROWS=${ROWS:-100000}
DIST=${DIST:-uniform}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
THREADS=${THREADS:-1}
ITERS=${ITERS:-150}
if [ -z "$RDMA_VM_IP" ]; then
    echo "rdma-bench-vm: run inside ../shared/rdma-vm (RDMA_VM_IP unset)" >&2
    exit 2
fi
# No --transport: where a device exists the default is tcp,rdma.
$B/tools/embstore-server --listen "$RDMA_VM_IP:7164" --threads 2 \
    --log-level info ${ZC:+--zero-copy-pulls $ZC} 2>/tmp/rdma-bench-server.log &
S=$!
sleep 3
grep -o "over [a-z,]*" /tmp/rdma-bench-server.log | head -n 1

# bytes/s received by the client, from embstore-bench's JSON line.
rate() {
    sed -n 's/.*"transport":"\([^"]*\)".*"elapsed_s":\([0-9.]*\).*"rows_per_s":\([0-9]*\).*"unique_per_batch":\([0-9.]*\).*"wire_bytes_in":\([0-9]*\).*/\1 \2 \3 \4 \5/p' |
        awk '{ printf "%s rows/s %s unique/batch %s bytes_in/s %.0f\n", $1, $3, $4, $5 / $2 }'
}

r=1
while [ $r -le "$ROUNDS" ]; do
    for t in auto tcp; do
        echo "round $r $t: $($B/tools/embstore-bench --servers "$RDMA_VM_IP:7164" \
            --transport $t --rows "$ROWS" --batch 4096 --dim 64 --dist "$DIST" \
            --threads "$THREADS" --op pull --duration "$DURATION" --json 2>/dev/null | rate)"
    done
    # perftest's MB/sec are MiB/s (its message rate agrees only so).
    ib_write_bw -R -d rxe0 -s 1048576 -n "$ITERS" >/dev/null 2>&1 &
    sleep 2
    echo "round $r ib_write_bw: $(ib_write_bw -R -d rxe0 -s 1048576 \
        -n "$ITERS" "$RDMA_VM_IP" 2>&1 | grep -A1 '#bytes' | tail -n 1 |
        awk '{ printf "bytes/s %.0f (%s MB/sec average)", $4 * 1048576, $4 }')"
    wait $!
    r=$((r + 1))
done
kill $S
wait
