#!/bin/sh
# tests/cluster/elastic_evict.sh - eviction in an elastic job with one copy
# of each slot (docs/replication.md, "Eviction with one copy"): `embstore
# launch --server_num 2 --server_max 3 --replicas 1` runs `embstore-bench
# --op step --evict max_rows:N`, which a replicated job refuses. A third
# server joins and is given its share by live moves, then SIGTERM drains
# rank 0, while the worker trains. Every server that holds rows must keep
# them near its share of the cap and have evicted (the newcomer takes the
# policy with the table), the drained server exits 0, and the worker ends
# without an error.
#
#   elastic_evict.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: elastic_evict.sh TOOLS_DIR}
moves_setup "$tools" elastic-evict
CAP=20000

# "ADDR ROWS EVICTED" for each server of table bench, from `embstore stat
# --sched --json`.
server_rows() {
	embstore stat --sched "$sched" --json >"$work/stat.json" 2>&1 ||
		bad "embstore stat --sched failed: $(cat "$work/stat.json")"
	python3 - "$work/stat.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for t in doc["tables"]:
    if t["table"] == "bench":
        print(t["server"], t["totals"]["rows"], t["totals"]["rows_evicted"])
EOF
}

out=$work/launch.txt
(cd "$work" && exec embstore launch --server_num 2 --server_max 3 \
	--worker_num 1 --replicas 1 --log-dir "$work/log" -- \
	embstore-bench --op step --rows 200000 --dim 8 --batch 512 \
	--evict "max_rows:$CAP" --duration 90 --stop-file "$work/stop" \
	--report-interval 1) >"$out" 2>&1 &
lpid=$!
moves_wait 'worker\.0\] .*worker 0 of 1 joined' 300 ||
	bad "the worker did not join: $(tail -5 "$out")"
sched=$(sed -n 's/^\[launch\] scheduler on \([^,]*\),.*/\1/p' "$out" | head -1)
[ -n "$sched" ] || bad "no scheduler address"
# Rows are evicted by the sweeps of pushes (steps), which begin after the
# bench's preload (pulls only): seconds under a sanitizer. The first
# interval line says training runs.
moves_wait 'worker\.0\] interval:' 900 ||
	bad "the worker never trained: $(tail -5 "$out")"

moves_add_by_hand
moves_wait_share 2
[ -n "$share" ] && [ "$share" -ge $((4096 / 3 - 2)) ] ||
	bad "the newcomer was not given its share (${share:-none} slots)"
moves_under_load join

# Each server holds at most its share of the cap (the client splits it
# over the job's ranks, --server_max of them; each shard may pass its
# share by a batch until the next sweeps) and has evicted, the newcomer
# too. The newcomer's rows came by the moves: its sweeps follow the
# pushes after them, so the check waits for them (a load only delays it).
# held_ok FILE: every server of FILE within its share, evicted, 3 of them.
held_ok() {
	awk -v most=$((CAP / 3 * 12 / 10)) '
		{ n++; if ($2 > most || $3 == 0) bad = 1 }
		END { exit !(n == 3 && !bad) }' "$1"
}
for _ in $(seq 100); do
	server_rows >"$work/rows.txt"
	held_ok "$work/rows.txt" && break
	sleep 0.2
done
n=0
while read -r addr rows evicted; do
	n=$((n + 1))
	[ "$rows" -le $((CAP / 3 * 12 / 10)) ] ||
		bad "server $addr holds $rows rows, past its share of $CAP"
	[ "$evicted" -gt 0 ] || bad "server $addr evicted nothing"
done <"$work/rows.txt"
[ "$n" -eq 3 ] || bad "$n servers hold the table, not 3: $(cat "$work/rows.txt")"

pid0=$(moves_pid 0)
[ -n "$pid0" ] && kill -TERM "$pid0" || bad "no server rank 0 to stop"
moves_left "$pid0"
grep -q 'server 0 (.*) drained' "$out" ||
	bad "SIGTERM stopped server 0 without draining it"

moves_stop
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st"
grep -q '^\[launch\] worker\.0 exited with 0' "$out" ||
	bad "the worker did not exit 0"
wait "$npid"
st=$?
npid=
[ "$st" -eq 0 ] || bad "the newcomer exited $st at the end of the job"

if [ "$fail" -ne 0 ]; then
	cat "$out" "$work/rows.txt" 2>/dev/null
	exit 1
fi
echo "ok: R = 1 with max_rows:$CAP: a server joined ($share slots) and" \
	"rank 0 drained mid-run; rows per server: $(tr '\n' ';' <"$work/rows.txt")"
