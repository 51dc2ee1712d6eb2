#!/bin/sh
# tests/cluster/give_back.sh - a slot given back to a server before its
# sweep freed the rows it left there (docs/replication.md, "Moving
# slots"): the rows go before the copy lands, so the copy alone is the
# slot's rows there. `embstore launch --server_num 3 --server_max 4
# --replicas 2` with both workers on `embstore-bench --op step --verify`,
# every server's background sweep held back (EMB_SWEEP_QUIET_MS); a
# fourth server joins and gets its share from the others, then is
# drained at once, and its chunks go to servers not holding them: some
# to those that gave them. Each of those must free its left rows as the
# map gives the slot back (`freed N rows of slots given back before their
# copy`), the newcomer exits 0, and both workers verify 0 mismatched.
#
#   give_back.sh TOOLS_DIR
set -u
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/moves_lib.sh"

tools=${1:?usage: give_back.sh TOOLS_DIR}
moves_setup "$tools" give-back
# No background sweep for the test's length: every row a server gave
# away is still there when its slot comes back.
EMB_SWEEP_QUIET_MS=600000
export EMB_SWEEP_QUIET_MS

moves_launch 300 --server_max 4
[ -n "$sched" ] || bad "no scheduler address: $(tail -5 "$out")"
moves_add_by_hand
moves_wait_share 3
[ -n "$share" ] || bad "the newcomer was not given its share: $(tail -5 "$out")"
# Its sweeper thread runs at nice 19 (src/server/replica.c, SWEEP_NICE):
# field 19 of the thread's stat. The server is npid or its child (the
# shell that ran the printed command).
nice=
kids=$(awk -v p="$npid" '$4 == p { print $1 }' /proc/[0-9]*/stat 2>/dev/null)
for t in /proc/"$npid"/task/* $(for c in $kids; do
	echo /proc/"$c"/task/*; done); do
	[ "$(cat "$t/comm" 2>/dev/null)" = emb-rsweep ] &&
		nice=$(awk '{ print $19 }' "$t/stat")
done
[ "$nice" = 19 ] || bad "the newcomer's sweeper runs at nice '$nice', not 19"
moves_under_load join
embstore scale --sched "$sched" --remove 3 >"$work/scale.txt" 2>&1 ||
	bad "embstore scale --remove 3: $(cat "$work/scale.txt")"
moves_wait 'server 3 (.*) drained (' 1200 ||
	bad "the newcomer did not drain: $(tail -5 "$out")"
# It leaves by itself, one heartbeat timeout later.
for _ in $(seq 600); do
	kill -0 "$npid" 2>/dev/null || break
	sleep 0.1
done
wait "$npid"
st=$?
npid=
[ "$st" -eq 0 ] || bad "the drained newcomer exited $st"
moves_under_load drain
n=$(cat "$out" "$work/new.txt" |
	grep -c 'freed [1-9][0-9]* rows of slots given back before their copy')
[ "$n" -ge 1 ] ||
	bad "no server freed the rows of a slot given back to it"
grep -q 'rows of slots moved to other servers' "$out" &&
	bad "a background sweep ran, though EMB_SWEEP_QUIET_MS held it back"
moves_end
exit "$fail"
