#!/bin/bash
# deploy/mindspore/Worker.sh - one worker: the CTR example (examples/ctr)
# trains on DATA; put your own training program in its place.
export MS_SERVER_NUM=${MS_SERVER_NUM:-2}
export MS_WORKER_NUM=${MS_WORKER_NUM:-2}
export MS_SCHED_HOST=${MS_SCHED_HOST:-10.0.0.1}
export MS_SCHED_PORT=${MS_SCHED_PORT:-8081}
export MS_ROLE=MS_WORKER
exec "${TRAINER:-build/examples/ctr/train}" --data "${DATA:-data/train.tsv}" \
    --epochs 1
