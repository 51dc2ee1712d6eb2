#!/bin/bash
# deploy/mindspore/Server.sh - one server; run one per server machine.
export MS_SERVER_NUM=${MS_SERVER_NUM:-2}
export MS_WORKER_NUM=${MS_WORKER_NUM:-2}
export MS_SCHED_HOST=${MS_SCHED_HOST:-10.0.0.1}
export MS_SCHED_PORT=${MS_SCHED_PORT:-8081}
export MS_ROLE=MS_PSERVER
exec embstore-server --listen "${LISTEN:-0.0.0.0:7164}" --mem-limit 64G
