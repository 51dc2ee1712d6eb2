#!/usr/bin/env bash
# tests/examples/ctr_rdma.sh - the CTR example under `embstore launch` with
# every server and worker on RDMA verbs (2 servers, 2 workers). Needs an
# RDMA device: it runs in the Soft-RoCE VM (RDMA_VM_IP set, .ci/run's RDMA
# step) and exits 77 (skipped) elsewhere.
#
# usage: ctr_rdma.sh BUILD_DIR
set -euo pipefail

BUILD=$1
if [[ -z ${RDMA_VM_IP:-} ]]; then
    echo "ctr_rdma: no RDMA device here (runs inside ../shared/rdma-vm); skipped"
    exit 77
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ctr-rdma.XXXXXX")
trap 'rm -rf "$DIR"' EXIT

"$BUILD/examples/ctr/gen" --rows 4000 --seed 3 --out "$DIR/data" >/dev/null
EMB_TRANSPORT=rdma EMB_LOG_LEVEL=info "$BUILD/tools/embstore" launch \
    --server_num 2 --worker_num 2 --log-dir "$DIR/log" -- \
    "$BUILD/examples/ctr/train" --data "$DIR/data/train.tsv" \
    --test "$DIR/data/test.tsv" --epochs 1 --batch 256 --log-every 4 \
    >"$DIR/out.log" 2>&1 || { tail -n 30 "$DIR/out.log"; exit 1; }
grep -q "test auc=" "$DIR/out.log" || { echo "no test auc"; exit 1; }
# Both workers reached both servers over RDMA, not TCP.
n=$(cat "$DIR"/log/worker.*.log | grep -c "connected to 2 servers over rdma" || true)
if [[ $n -ne 2 ]]; then
    echo "workers did not connect over rdma:"
    grep -h "connected to" "$DIR"/log/worker.*.log
    exit 1
fi
grep "test auc=" "$DIR/out.log"
