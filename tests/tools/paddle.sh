#!/bin/sh
# tests/tools/paddle.sh - a cluster formed from Paddle's parameter-server
# variables alone, no scheduler: two embstore-servers started with
# TRAINING_ROLE=PSERVER, POD_IP and PADDLE_PORT, and two trainers
# (tests/cluster/trainer: pull, push and a barrier per step, then finish)
# with TRAINING_ROLE=TRAINER, PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM and
# PADDLE_PSERVERS_IP_PORT_LIST. Each trainer must learn its rank and the
# counts, train and finish; embstore-bench joins the same way; both
# servers hold the table. Needs EMB_BIN_DIR and EMB_TRAINER_BIN; python3
# finds two free ports (else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
: "${EMB_BIN_DIR:?}" "${EMB_TRAINER_BIN:?}"
command -v python3 >/dev/null 2>&1 || exit 77

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-paddle-XXXXXX") || exit 1
pids=
cleanup() {
	for p in $pids; do
		kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT
fail=0
# Two ports nobody listens on now.
set -- $(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
list="127.0.0.1:$1,127.0.0.1:$2"
unset EMB_ROLE EMB_SCHED_HOST MS_ROLE MS_SCHED_HOST EMB_SERVERS

i=0
for port in "$1" "$2"; do
	TRAINING_ROLE=PSERVER POD_IP=127.0.0.1 PADDLE_PORT=$port \
		PADDLE_PSERVERS_IP_PORT_LIST=$list PADDLE_TRAINERS_NUM=2 \
		"$EMB_BIN_DIR/embstore-server" --threads 1 \
		2>"$dir/server.$i.log" &
	pids="$pids $!"
	i=$((i + 1))
done
for i in 0 1; do
	for _ in $(seq 100); do
		grep -q 'listening on' "$dir/server.$i.log" && break
		sleep 0.1
	done
	grep -q "listening on 127.0.0.1:" "$dir/server.$i.log" ||
		bad "server $i: $(cat "$dir/server.$i.log")"
done

for id in 0 1; do
	TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=$id PADDLE_TRAINERS_NUM=2 \
		PADDLE_PSERVERS_IP_PORT_LIST=$list \
		"$EMB_TRAINER_BIN" --steps 20 >"$dir/trainer.$id.out" 2>&1 &
	eval "tpid$id=\$!"
done
wait "$tpid0" || bad "trainer 0 exit status: $(cat "$dir/trainer.0.out")"
wait "$tpid1" || bad "trainer 1 exit status: $(cat "$dir/trainer.1.out")"
for id in 0 1; do
	grep -q "^joined: rank $id of 2, 2 servers" "$dir/trainer.$id.out" ||
		bad "trainer $id: $(cat "$dir/trainer.$id.out")"
	grep -q "^rank $id: 20 steps done, finish: success" \
		"$dir/trainer.$id.out" ||
		bad "trainer $id: $(cat "$dir/trainer.$id.out")"
done

# The bench joins through the same environment, unchanged.
TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=0 PADDLE_TRAINERS_NUM=1 \
	PADDLE_PSERVERS_IP_PORT_LIST=$list \
	"$EMB_BIN_DIR/embstore-bench" --rows 1000 --dim 4 --batch 100 \
	--batches 5 --table paddle_bench --json >"$dir/bench.json" \
	2>"$dir/bench.err" || bad "bench: $(cat "$dir/bench.err")"
grep -q '"backend":"client"' "$dir/bench.json" ||
	bad "bench did not join: $(cat "$dir/bench.json")"

# Both servers hold the tables: rows went to each by slot.
"$EMB_BIN_DIR/embstore" stat --servers "$list" --interval 0.1 \
	>"$dir/stat.out" 2>&1 || bad "stat: $(cat "$dir/stat.out")"
for port in "$1" "$2"; do
	grep -q "^127.0.0.1:$port .*ctr " "$dir/stat.out" ||
		bad "server :$port lacks the table: $(cat "$dir/stat.out")"
done
exit $fail
