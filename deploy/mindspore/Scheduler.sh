#!/bin/bash
# deploy/mindspore/Scheduler.sh - the scheduler, on a machine at MS_SCHED_HOST.
export MS_SERVER_NUM=${MS_SERVER_NUM:-2}
export MS_WORKER_NUM=${MS_WORKER_NUM:-2}
export MS_SCHED_HOST=${MS_SCHED_HOST:-10.0.0.1}
export MS_SCHED_PORT=${MS_SCHED_PORT:-8081}
export MS_ROLE=MS_SCHED
exec embstore-server
