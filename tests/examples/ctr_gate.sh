#!/usr/bin/env bash
# tests/examples/ctr_gate.sh - the CTR example's quality gate.
#
# Trains the wide & deep model on small generated data (fixed seeds) in one
# process (--local) and through embstore clusters started by `embstore
# launch`: 1 worker / 1 server and 2 workers / 2 servers, asynchronous and
# synchronous. Each run's final test AUC must be >= 0.70 and within 0.01 of
# the local run of the same global batch (a synchronous step of W workers
# with B examples each is one step over W*B examples). With admission
# (--admit count:2: an id is a row from its second batch on) the local run
# and an asynchronous 1 worker / 1 server run must pass the same bar.
#
# usage: ctr_gate.sh BUILD_DIR
set -euo pipefail

BUILD=$1
GEN=$BUILD/examples/ctr/gen
TRAIN=$BUILD/examples/ctr/train
EMBSTORE=$BUILD/tools/embstore
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ctr-gate.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
ROWS=${CTR_GATE_ROWS:-60000}
EPOCHS=2
FAILED=0

"$GEN" --rows "$ROWS" --seed 7 --out "$DIR/data" >/dev/null

# Prints the last "test auc=" value of a log.
final_auc() {
    sed -n 's/.*test auc=\([0-9.]*\).*/\1/p' "$1" | tail -n 1
}

local_run() { # BATCH [ADMIT]
    "$TRAIN" --local --data "$DIR/data/train.tsv" --test "$DIR/data/test.tsv" \
        --epochs "$EPOCHS" --batch "$1" --log-every 1000 \
        --admit "${2:-none}" >"$DIR/local.$1.${2:-none}.log"
    final_auc "$DIR/local.$1.${2:-none}.log"
}

cluster_run() { # NAME SERVERS WORKERS BATCH MODE [ADMIT]
    local log=$DIR/$1.log
    if ! EMB_LOG_LEVEL=warn "$EMBSTORE" launch --server_num "$2" \
            --worker_num "$3" --log-dir "$DIR/log.$1" -- \
            "$TRAIN" --data "$DIR/data/train.tsv" \
            --test "$DIR/data/test.tsv" --epochs "$EPOCHS" --batch "$4" \
            --mode "$5" --admit "${6:-none}" --log-every 1000 >"$log" 2>&1; then
        echo "FAIL $1: the cluster run failed" >&2
        tail -n 20 "$log" >&2
        return 1
    fi
    final_auc "$log"
}

check() { # NAME AUC REFERENCE
    if awk -v a="$2" -v r="$3" 'BEGIN { d = a - r; if (d < 0) d = -d;
                                       exit !(a >= 0.70 && d <= 0.01) }'; then
        echo "ok   $1: test auc $2 (local $3)"
    else
        echo "FAIL $1: test auc $2, local $3 (need >= 0.70, within 0.01)"
        FAILED=$((FAILED + 1))
    fi
}

ref512=$(local_run 512)
ref1024=$(local_run 1024)
echo "local: batch 512 auc $ref512, batch 1024 auc $ref1024"

check local-count2 "$(local_run 512 count:2)" "$ref512"

for run in "1w1s-async 1 1 512 async $ref512" \
           "2w2s-async 2 2 512 async $ref512" \
           "1w1s-sync 1 1 512 sync $ref512" \
           "2w2s-sync 2 2 512 sync $ref1024" \
           "1w1s-async-count2 1 1 512 async $ref512 count:2"; do
    read -r name s w b mode ref admit <<<"$run"
    if auc=$(cluster_run "$name" "$s" "$w" "$b" "$mode" "$admit") &&
        [[ -n $auc ]]; then
        check "$name" "$auc" "$ref"
    else
        echo "FAIL $name: no test auc"
        FAILED=$((FAILED + 1))
    fi
done
exit $((FAILED > 0))
