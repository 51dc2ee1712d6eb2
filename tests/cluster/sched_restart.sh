#!/bin/sh
# tests/cluster/sched_restart.sh - the scheduler is no single point of
# failure: `embstore launch` with 3 servers, 2 workers and --replicas 2
# runs `embstore-bench --op step --verify`; the scheduler is SIGKILLed
# while the workers train, launch starts it again on its port, and it
# takes the job up from its state file while the nodes, which went on
# without it, rejoin. Then a server is SIGKILLed: the restarted scheduler
# must still fail it over. Then, in a second job, the scheduler and a
# server die at once: the restarted scheduler declares the server that
# does not rejoin dead and fails it over. Every worker must exit 0 with
# 0 mismatched.
# The job has a token, so every rejoin logs in with it first.
#
#   sched_restart.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench.
set -u

tools=${1:?usage: sched_restart.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: sched_restart.sh TOOLS_DIR SRC_DIR}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-schedrestart-XXXXXX")
PATH=$tools:$PATH
export PATH
# Each step below waits for its log line, so a loaded machine only delays
# it. The kills are seen at once (connections close); 3 s of heartbeat
# timeout keeps a machine that stalls every process for a second or two
# from making the scheduler declare live nodes dead.
EMB_HEARTBEAT_TIMEOUT=3
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_ROLE EMB_SCHED_GRACE EMB_SCHED_STATE
lpid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# wait_for PATTERN FILE [TENTHS]: until a line matches (0), or the time
# is up or the launcher gone (1).
wait_for() {
	for _ in $(seq "${3:-600}"); do
		grep -q "$1" "$2" && return 0
		kill -0 "$lpid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# pid_of NAME: the newest pid launch started NAME with.
pid_of() {
	sed -n "s/^\[launch\] started $1, pid \([0-9]*\)$/\1/p" "$out" | tail -1
}

out=$work/launch.txt
# With a token: the rejoins log in with HELLO as the first joins did.
printf 'sched-restart-token' >"$work/token"
chmod 600 "$work/token"
(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
	--replicas 2 --log-dir "$work/log" --auth-token-file "$work/token" -- \
	embstore-bench --op step --verify --rows 20000 --dim 8 \
	--batch 256 --duration 60 --stop-file "$work/stop1") >"$out" 2>&1 &
lpid=$!
# Ranks need not follow names: worker.0 may be rank 1.
wait_for 'worker\.[01]\] .*worker 1 of 2 joined' "$out" &&
	wait_for 'worker\.[01]\] .*worker 0 of 2 joined' "$out" ||
	bad "the workers did not join"
sleep 1

# 1. The scheduler dies while the workers step.
spid=$(pid_of scheduler)
[ -f "$work/log/scheduler.state" ] || bad "no state file in the log dir"
echo "killing the scheduler (pid $spid)"
[ -n "$spid" ] && kill -KILL "$spid" || bad "no scheduler to kill"
wait_for 'restarting the scheduler' "$out" ||
	bad "launch did not restart the scheduler"
# Every node rejoins the restarted scheduler.
for node in server.0 server.1 server.2 worker.0 worker.1; do
	wait_for "^\[$node\] .*rejoined scheduler" "$out" ||
		bad "$node did not rejoin"
done
grep -q 'taking up cluster' "$out" ||
	bad "the restarted scheduler did not take the job up"

# 2. A server dies after the restart: failed over as ever.
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
vpid=$(pid_of "server\\.$victim")
echo "killing server.$victim (pid $vpid)"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
# The training runs (60 s at most) until two seconds after the failover.
wait_for 'server [0-2] removed.*the job goes on' "$out" ||
	bad "no failover of server.$victim while the workers ran"
sleep 2
: >"$work/stop1"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
# server.N's rank is its own: any removal after the restart is this one.
awk '/taking up cluster/ { t = NR }
     /server [0-2] removed.*the job goes on/ && t { r = NR }
     END { exit !r }' "$out" ||
	bad "the restarted scheduler did not fail server.$victim over"
# The kill came while the workers ran.
awk '/^\[launch\] server\.[0-2] killed/ { k = NR }
     /^\[launch\] worker\.[01] exited/ && !w { w = NR }
     END { exit !(k && w && k < w) }' "$out" ||
	bad "the server died after the workers were done"
[ ! -f "$work/log/scheduler.state" ] ||
	bad "the state file outlived the job"
[ "$fail" -eq 0 ] || cat "$out" >&2
fail1=$fail

# 3. The scheduler and a server die together: the restarted scheduler
#    misses the server among the rejoins, declares it dead when its
#    rejoin window (10 s) passes, and fails it over; the workers' calls
#    to it wait for that map within their 30 s deadline.
out=$work/launch2.txt
(cd "$work" && exec embstore launch --server_num 3 --worker_num 2 \
	--replicas 2 --log-dir "$work/log2" -- \
	embstore-bench --op step --verify --rows 20000 --dim 8 \
	--batch 256 --duration 90 --stop-file "$work/stop2") >"$out" 2>&1 &
lpid=$!
wait_for 'worker\.[01]\] .*worker 1 of 2 joined' "$out" &&
	wait_for 'worker\.[01]\] .*worker 0 of 2 joined' "$out" ||
	bad "together: the workers did not join"
sleep 1
spid=$(pid_of scheduler)
vpid=$(pid_of "server\\.1")
echo "killing the scheduler (pid $spid) and server.1 (pid $vpid)"
if [ -n "$spid" ] && [ -n "$vpid" ]; then
	kill -KILL "$spid" "$vpid"
else
	bad "together: nothing to kill"
fi
# The rejoin window passes, the server is failed over, the workers' calls
# to it go on: two seconds of steps after that, then the end.
wait_for 'server [0-2] removed.*the job goes on' "$out" ||
	bad "together: no failover while the workers ran"
sleep 2
: >"$work/stop2"
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "together: launch exited $st"
n=$(grep -c 'verify: [0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "together: $n of 2 workers verified clean"
awk '/taking up cluster/ { t = NR }
     /declared dead: silent/ && t { d = NR }
     /server [0-2] removed.*the job goes on/ && d { r = NR }
     END { exit !r }' "$out" ||
	bad "together: the missing server was not failed over on return"
[ "$fail" -eq "$fail1" ] || cat "$out" >&2
exit "$fail"
