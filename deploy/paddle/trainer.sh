#!/bin/bash
# deploy/paddle/trainer.sh - one trainer; PADDLE_TRAINER_ID is its rank,
# 0 .. PADDLE_TRAINERS_NUM-1. The CTR example stands for your program.
export TRAINING_ROLE=TRAINER
export PADDLE_PSERVERS_IP_PORT_LIST=${PADDLE_PSERVERS_IP_PORT_LIST:-10.0.0.1:6170,10.0.0.2:6170}
export PADDLE_TRAINERS_NUM=${PADDLE_TRAINERS_NUM:-2}
export PADDLE_TRAINER_ID=${PADDLE_TRAINER_ID:?set to this trainer\'s rank}
exec "${TRAINER:-build/examples/ctr/train}" --data "${DATA:-data/train.tsv}" \
    --epochs 1
