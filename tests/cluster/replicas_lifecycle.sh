#!/bin/sh
# tests/cluster/replicas_lifecycle.sh - admission under replicas end to
# end: `embstore launch --server_num 2 --replicas 2` runs two workers of
# `embstore-bench --op step --verify --no-preload --admit count:2` (every
# slot is on both servers: a primary and its backup). Each worker must
# verify its rows (a row takes its pushes from its second batch on), and
# then both servers, dumped one by one while the job still runs, must hold
# the same rows with the same bits: every row the primaries admitted, and
# none they did not.
#
#   replicas_lifecycle.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench;
# EMB_TRAINER_BIN is tests/cluster/trainer (its --hold keeps the job open).
set -u

tools=${1:?usage: replicas_lifecycle.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: replicas_lifecycle.sh TOOLS_DIR SRC_DIR}
trainer=${EMB_TRAINER_BIN:?EMB_TRAINER_BIN: tests/cluster/trainer}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-replife-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_CLUSTER_TIMEOUT=60
export EMB_CLUSTER_TIMEOUT
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN \
	EMB_SERVER_MAX
lpid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# Three workers run this script. The first to take the lock is the
# keeper: a trainer that holds the job open (a job, and so its servers,
# ends when every worker finished) until the dumps are made, while the
# script waits for the other two to finish training and then dumps each
# server alone. The other two train.
cat >"$work/worker.sh" <<EOF
#!/bin/sh
set -u
w=$work
if ! mkdir "\$w/keeper" 2>/dev/null; then
	embstore-bench --op step --verify --no-preload --admit count:2 \\
		--rows 20000 --dim 8 --batch 512 --dist zipf:1.05 \\
		--duration 3 || exit 1
	touch "\$w/trained.\$\$"
	exit 0
fi
"$trainer" --steps 0 --hold "\$w/dumped" &
tpid=\$!
i=0
while [ "\$(ls "\$w" | grep -c '^trained\.')" -lt 2 ]; do
	i=\$((i + 1))
	[ \$i -lt 1200 ] && kill -0 \$tpid 2>/dev/null || exit 2
	sleep 0.1
done
embstore stat --sched "\$EMB_SCHED_HOST:\$EMB_SCHED_PORT" \\
	--interval 0.1 >"\$w/stat.txt" 2>&1 || exit 3
embstore stat --sched "\$EMB_SCHED_HOST:\$EMB_SCHED_PORT" \\
	--interval 0.1 --json >"\$w/stat.json" 2>&1 || exit 3
k=0
for a in \$(awk '\$2 == "live" { print \$1 }' "\$w/stat.txt" | sort -u); do
	embstore dump --servers "\$a" --table bench --out "\$w/dump.\$k" \\
		--quiet && embstore export --in "\$w/dump.\$k" \\
		--out "\$w/rows.\$k" || exit 4
	echo "\$a" >"\$w/addr.\$k"
	k=\$((k + 1))
done
touch "\$w/dumped"
wait \$tpid
EOF
chmod +x "$work/worker.sh"

out=$work/launch.txt
(cd "$work" && exec embstore launch --server_num 2 --worker_num 3 \
	--replicas 2 --log-dir "$work/log" -- "$work/worker.sh") >"$out" 2>&1 &
lpid=$!
wait "$lpid"
st=$?
lpid=
[ "$st" -eq 0 ] || bad "launch exited $st: $(tail -n 20 "$out")"
n=$(grep -c 'verify: [1-9][0-9]* rows checked, 0 mismatched' "$out")
[ "$n" -eq 2 ] || bad "$n of 2 workers verified clean"
grep -q 'admission: [1-9][0-9]* pulls and 0 pushes of ids not admitted' \
	"$work/stat.txt" ||
	bad "no admission on the servers: $(cat "$work/stat.txt")"
[ -s "$work/rows.0" ] && [ -s "$work/rows.1" ] ||
	bad "a server's rows were not dumped"
sort "$work/rows.0" >"$work/sorted.0"
sort "$work/rows.1" >"$work/sorted.1"
r0=$(wc -l <"$work/sorted.0")
r1=$(wc -l <"$work/sorted.1")
# Admission held rows back: fewer than the ids the workers drew.
[ "$r0" -gt 1000 ] || bad "server 0 holds only $r0 rows"
if cmp -s "$work/sorted.0" "$work/sorted.1"; then
	echo "replicas: $r0 and $r1 rows, identical"
else
	bad "the replicas differ ($r0 and $r1 rows): $(diff "$work/sorted.0" \
		"$work/sorted.1" | head -n 6)"
fi

# Each dump holds every row its server has, as its STATS count them, and
# the primaries held back the ids seen once.
for k in 0 1; do
	a=$(cat "$work/addr.$k")
	want=$(python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read())
t = [e for e in j["tables"] if e["server"] == sys.argv[2] and e["table"] == "bench"]
print(t[0]["rows"], t[0]["totals"]["pulls_unadmitted"])' "$work/stat.json" "$a")
	got=$(wc -l <"$work/sorted.$k")
	[ "${want% *}" = "$got" ] ||
		bad "server $a: its stats say ${want% *} rows, its dump $got"
	[ "${want#* }" -gt 0 ] || bad "server $a admitted every id at once"
done

[ "$fail" -eq 0 ] && echo "admission under replicas: ok"
exit "$fail"
