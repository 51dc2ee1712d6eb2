#!/bin/bash
# deploy/paddle/pserver.sh - one server of a cluster without a scheduler,
# configured the way Paddle's fleet configures a parameter server. POD_IP
# and PADDLE_PORT are this server's address, which must be in the list.
export TRAINING_ROLE=PSERVER
export PADDLE_PSERVERS_IP_PORT_LIST=${PADDLE_PSERVERS_IP_PORT_LIST:-10.0.0.1:6170,10.0.0.2:6170}
export PADDLE_TRAINERS_NUM=${PADDLE_TRAINERS_NUM:-2}
export POD_IP=${POD_IP:-10.0.0.1}
export PADDLE_PORT=${PADDLE_PORT:-6170}
exec embstore-server --mem-limit 64G
