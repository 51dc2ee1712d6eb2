#!/bin/sh
# tests/cluster/after_failover.sh - calls that go to every server, after a
# failover: `embstore launch --server_num 3 --worker_num 1 --replicas 2`
# runs tests/cluster/after_failover.c; once it made a table, one server
# picked at random is SIGKILLed. When the worker's map is at epoch 2 it
# creates, opens, pushes and pulls a new table and reads table stats, and
# `embstore stat --sched` (text and --json) must show epoch 2, the
# removed server and the live ones' slots. Unreplicated or before the fix
# those calls fail with EMB_ENODEAD.
#
# `embstore restore --sched` into the replicated job: each of the dump's
# rows lands on both holders of its slot (each server's own dump holds
# it, with the dump's values, on exactly two servers of three), and after
# the failover it restores again, past the removed server. Before the
# fix the rows went to their primaries only, and a restore after the
# failover failed on the dead server. `embstore dump --sched` of the
# restored table holds each row once, as restored, before the failover
# and after it (it failed on the removed server, and held each row once
# per copy).
#
# Then a second server is killed: slots lose every copy, and creating a
# table must fail with EMB_ENODEAD and a message; `embstore dump --sched`
# must fail; `embstore stat --sched` must show the live server's tables,
# mark the dead one (still in the map) not read, and exit 1 (it failed
# with no output at all).
#
#   after_failover.sh TOOLS_DIR WORKER
set -u
. "$(dirname "$0")/../lib.sh"

tools=${1:?usage: after_failover.sh TOOLS_DIR WORKER}
worker=${2:?usage: after_failover.sh TOOLS_DIR WORKER}
tools=$(cd "$tools" && pwd) || exit 1
worker=$(cd "$(dirname "$worker")" && pwd)/$(basename "$worker") || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-after-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_HEARTBEAT_TIMEOUT=1
EMB_CLUSTER_TIMEOUT=30
export EMB_HEARTBEAT_TIMEOUT EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE
lpid=
spid=
fail=0

cleanup() {
	[ -n "$spid" ] && kill "$spid" 2>/dev/null
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# wait_for PATTERN: up to 30 s for a line of the launch's output.
wait_for() {
	for _ in $(seq 300); do
		grep -q "$1" "$out" && return 0
		kill -0 "$lpid" 2>/dev/null || break
		sleep 0.1
	done
	grep -q "$1" "$out"
}

# holders TABLE COPIES SERVER...: dumps TABLE from each server on its
# own and checks that every row of the dump in $work/src is on COPIES of
# them (1-2: on one or two) with the dump's values, and nothing else is.
holders() {
	_t=$1
	_copies=$2
	shift 2
	_i=0
	_files=
	for _a in "$@"; do
		_i=$((_i + 1))
		embstore dump --servers "$_a" --table "$_t" --quiet \
			--out "$work/$_t.$_i" >/dev/null 2>&1 &&
			embstore export --in "$work/$_t.$_i" \
				--out "$work/$_t.$_i.tsv" ||
			{ bad "dump of $_t from $_a failed"; return; }
		_files="$_files $work/$_t.$_i.tsv"
	done
	# shellcheck disable=SC2086
	awk -v copies="$_copies" -v what="$_t" '
	FILENAME == ARGV[1] { src[$1] = $0; n++; next }
	!($1 in src) { print what ": row " $1 " is not in the dump"; e = 1; next }
	$0 != src[$1] { print what ": row " $1 " differs: " $0; e = 1 }
	{ c[$1]++ }
	END {
		split(copies, r, "-"); lo = r[1]; hi = (2 in r) ? r[2] : r[1]
		for (k in src)
			if (c[k] < lo || c[k] > hi) {
				print what ": row " k " on " c[k] + 0 " servers"
				e = 1
			}
		if (n < 1000) { print what ": the dump has " n " rows"; e = 1 }
		exit e
	}' "$work/src.tsv" $_files >&2 || bad "$_t: not every row on $_copies holders"
}

# dump_once TABLE: `embstore dump --sched` of TABLE must hold each row of
# the dump in $work/src once, with its values, and no other row.
dump_once() {
	rm -rf "$work/$1.sched"
	embstore dump --sched "$sched" --table "$1" --out "$work/$1.sched" \
		--quiet >"$work/$1.sched.txt" 2>&1 &&
		embstore export --in "$work/$1.sched" \
			--out "$work/$1.sched.tsv" ||
		{ bad "embstore dump --sched of $1 failed: $(cat "$work/$1.sched.txt")"; return; }
	sort "$work/src.tsv" >"$work/src.sorted"
	sort "$work/$1.sched.tsv" | cmp -s - "$work/src.sorted" ||
		bad "embstore dump --sched of $1: not each row once, as restored ($(wc -l <"$work/$1.sched.tsv") rows)"
}

# The dump to restore: a table of one server on its own, pushed away
# from its initial values.
emb_start_server "$tools/embstore-server" "$work/one.txt" || exit 1
spid=$pid
embstore-bench --servers "127.0.0.1:$port" --table src --op push \
	--rows 2000 --dim 4 --batch 256 --batches 8 >/dev/null 2>&1 ||
	bad "embstore-bench against one server failed"
embstore dump --servers "127.0.0.1:$port" --table src --out "$work/src" \
	--quiet >/dev/null 2>&1 &&
	embstore export --in "$work/src" --out "$work/src.tsv" ||
	bad "the dump to restore failed"
kill "$spid"
wait "$spid" 2>/dev/null
spid=

out=$work/launch.txt
# Every process serves /metrics on a port of its own; the scheduler's
# must count each server's slots by role.
(cd "$work" && EMB_METRICS_LISTEN=127.0.0.1:0 exec embstore launch --server_num 3 --worker_num 1 \
	--replicas 2 --log-dir "$work/log" -- \
	"$worker" "$work/go" "$work/done" "$work/lost") >"$out" 2>&1 &
lpid=$!
wait_for 'ready: sched ' || bad "the worker did not get ready"
sched=$(sed -n 's/.*ready: sched \([^ ]*\)$/\1/p' "$out" | head -1)
# The live servers' addresses, from the scheduler's map.
live_servers() {
	embstore stat --sched "$sched" --interval 0.2 --json 2>/dev/null |
		python3 -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join(s["server"] for s in d["map"]["servers"] if s["state"] == "live"))
'
}
embstore restore --sched "$sched" --in "$work/src" --table restored \
	--quiet >"$work/restore.txt" 2>&1 ||
	bad "embstore restore --sched exited $?: $(cat "$work/restore.txt")"
# shellcheck disable=SC2046
holders restored 2 $(live_servers)
dump_once restored
victim=$(awk 'BEGIN { srand(); print int(rand() * 3) }')
vpid=$(sed -n "s/^\[launch\] started server\.$victim, pid \([0-9]*\)$/\1/p" \
	"$out")
echo "killing server.$victim (pid $vpid); scheduler $sched"
[ -n "$vpid" ] && kill -KILL "$vpid" || bad "no server.$victim to kill"
wait_for 'worker\.0\] .*map epoch 2' || bad "the worker's map did not fail over"
touch "$work/go"
wait_for 'after: ok' || bad "the worker's calls failed after the failover"

# A restore after the failover: the removed server is skipped; the slots
# the dead server held have one copy left, the others two.
embstore restore --sched "$sched" --in "$work/src" --table restored2 \
	--quiet >"$work/restore2.txt" 2>&1 ||
	bad "embstore restore --sched after the failover exited $?: $(cat "$work/restore2.txt")"
# shellcheck disable=SC2046
holders restored2 1-2 $(live_servers)
dump_once restored2

# The observer: the map at epoch 2, the dead server removed, its slots on
# the live ones, and no error.
embstore stat --sched "$sched" --interval 0.2 >"$work/stat.txt" 2>&1 ||
	bad "embstore stat exited $?"
grep -q '^map epoch 2, 2 replicas, 0 lost slots$' "$work/stat.txt" ||
	bad "embstore stat: no map at epoch 2"
[ "$(grep -c ' removed ' "$work/stat.txt")" -eq 1 ] ||
	bad "embstore stat: not one removed server"
[ "$(grep -c ' live .*[0-9]-[0-9]' "$work/stat.txt")" -eq 2 ] ||
	bad "embstore stat: not two live servers with slots"
grep -q '(removed)' "$work/stat.txt" ||
	bad "embstore stat: the removed server's tables are not marked"
grep -q ' after ' "$work/stat.txt" ||
	bad "embstore stat: table 'after' missing"
embstore stat --sched "$sched" --interval 0.2 --json >"$work/stat.json" \
	2>&1 || bad "embstore stat --json exited $?"
grep -q '"map":{"epoch":2,"replicas":2,"lost_slots":0,' "$work/stat.json" ||
	bad "embstore stat --json: no map at epoch 2"
[ "$(grep -o '"state":"removed","primary_slots":0,"backup_slots":0' \
	"$work/stat.json" | wc -l)" -eq 1 ] ||
	bad "embstore stat --json: not one removed server without slots"
if command -v python3 >/dev/null 2>&1; then
	python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
live = [s for s in d["map"]["servers"] if s["state"] == "live"]
assert len(live) == 2, live
assert sum(s["primary_slots"] for s in live) == 4096, live
assert any(t["table"] == "after" for t in d["tables"]), d["tables"]
' "$work/stat.json" || bad "embstore stat --json: bad map or tables"
fi

# The scheduler's /metrics: epoch 2, the removed server holds no slot,
# the live ones every primary.
murl=$(sed -n 's/^\[scheduler\] .*metrics on \(http:[^ ,]*\).*/\1/p' "$out" |
	head -1)
if command -v curl >/dev/null 2>&1 && [ -n "$murl" ]; then
	for _ in $(seq 50); do
		curl -fsS "$murl" >"$work/metrics.txt" 2>/dev/null
		grep -q '^embstore_cluster_map_epoch 2$' "$work/metrics.txt" &&
			break
		sleep 0.1
	done
	grep -q '^embstore_cluster_map_epoch 2$' "$work/metrics.txt" ||
		bad "/metrics: no epoch 2"
	# (A rank is the order of registration, not the launcher's index.)
	z=$(awk -F'[{}" ]+' '/^embstore_cluster_server_slots\{/ { n[$3] += $NF }
		END { for (k in n) z += n[k] == 0; print z + 0 }' \
		"$work/metrics.txt")
	p=$(awk '/^embstore_cluster_server_slots\{.*role="primary"\}/ { n += $2 }
		END { print n + 0 }' "$work/metrics.txt")
	b=$(awk '/^embstore_cluster_server_slots\{.*role="backup"\}/ { n += $2 }
		END { print n + 0 }' "$work/metrics.txt")
	# Slots the dead server held keep one copy: a third of them.
	[ "$p" -eq 4096 ] && [ "$b" -ge 1365 ] && [ "$b" -le 1366 ] &&
		[ "$z" -eq 1 ] ||
		bad "/metrics: $p primary and $b backup slots, $z servers with none"
else
	bad "no scheduler /metrics address or no curl"
fi

# A second death leaves some slots with no copy: the same calls must
# now fail with EMB_ENODEAD and say why.
second=$(( (victim + 1) % 3 ))
spid=$(sed -n "s/^\[launch\] started server\.$second, pid \([0-9]*\)$/\1/p" \
	"$out")
[ -n "$spid" ] && kill -KILL "$spid" || bad "no server.$second to kill"
wait_for 'worker\.0\] .*map epoch 3: .* lost every copy' ||
	bad "the worker's map did not lose slots"
# A dump now would miss the lost slots' rows: it must fail, say why, and
# leave no MANIFEST. (Their last holder is dead but still in the map the
# scheduler serves: the dump names it as the server it cannot reach.)
if embstore dump --sched "$sched" --table restored --out "$work/lost.d" \
	--quiet >"$work/lost.txt" 2>&1; then
	bad "embstore dump --sched with slots lost exited 0"
fi
grep -q "^embstore dump: server [0-9.:]*: cannot connect: " "$work/lost.txt" ||
	bad "embstore dump --sched with slots lost: $(cat "$work/lost.txt")"
[ ! -e "$work/lost.d/MANIFEST" ] ||
	bad "embstore dump --sched with slots lost wrote a MANIFEST"
# What an operator runs then: stat must show the live server's tables,
# mark the dead one (still in the map, unreachable) and exit 1.
rc=0
embstore stat --sched "$sched" --interval 0.2 >"$work/stat3.txt" \
	2>"$work/stat3.err" || rc=$?
[ "$rc" -eq 1 ] || bad "embstore stat with a server unreachable exited $rc"
[ "$(grep -c ' down  ' "$work/stat3.txt")" -eq 1 ] ||
	bad "embstore stat: not one server down in the map"
grep -q '^[1-9][0-9]* slots have no holder answering: ' "$work/stat3.txt" ||
	bad "embstore stat: the slots with no holder answering not counted"
[ "$(grep -c '(not read: ' "$work/stat3.txt")" -eq 1 ] ||
	bad "embstore stat: not one server marked not read"
[ "$(grep -c '(removed)' "$work/stat3.txt")" -eq 1 ] ||
	bad "embstore stat: not one removed server"
[ "$(grep -c '^[0-9.:]* *restored ' "$work/stat3.txt")" -eq 1 ] ||
	bad "embstore stat: the live server's table 'restored' not shown"
grep -q '^embstore stat: server [0-9.:]*: cannot read stats: ' \
	"$work/stat3.err" || bad "embstore stat: $(cat "$work/stat3.err")"
rc=0
embstore stat --sched "$sched" --interval 0.2 --json >"$work/stat3.json" \
	2>/dev/null || rc=$?
[ "$rc" -eq 1 ] || bad "embstore stat --json with a server unreachable exited $rc"
python3 - "$work/stat3.json" <<'PY' || bad "embstore stat --json: $(cat "$work/stat3.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["not_read"]) == 1 and d["not_read"][0]["error"], d.get("not_read")
dead = d["not_read"][0]["server"]
live = [s["server"] for s in d["map"]["servers"] if s["state"] == "live"]
down = [s["server"] for s in d["map"]["servers"] if s["state"] == "down"]
assert down == [dead] and dead not in live, (dead, down, live)
assert 0 < d["map"]["unanswered_slots"] <= 4096, d["map"]
assert {t["server"] for t in d["tables"]} == set(live), d["tables"]
PY
touch "$work/lost"
wait_for 'lost: ok, .*have no live copy' ||
	bad "with slots lost, creating a table did not fail with EMB_ENODEAD"
wait "$lpid"
lpid=
if [ "$fail" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then
	for f in "$out" "$work/stat.txt" "$work/stat.json" "$work/stat3.txt"; do
		echo "== $f" >&2
		cat "$f" >&2
	done
fi
exit "$fail"
