#!/bin/sh
# tests/cluster/replicas_evict.sh - admission and eviction under replicas
# end to end (docs/replication.md, "Eviction with replicas"): `embstore
# launch --server_num 2 --replicas 2` runs two workers of `embstore-bench
# --op step --no-preload --admit count:2 --evict max_rows:CAP` (every slot
# on both servers: a primary and its backup). The primaries evict alone;
# each push names the rows' births to both holders, and each backup's
# check (every EMB_BIRTH_CHECK_MS) removes the rows its primary evicted.
# Once the workers are done, both servers, dumped one by one, must hold
# the same rows (ids) with the same weights, near the cap, and both must
# have evicted and pruned. Weights agree to rounding, not bit for bit: two
# workers' pushes of a row reach its two holders in either order, and f32
# sums depend on the order (replicas_lifecycle.sh, with --verify's exact
# gradients, compares bits).
#
#   replicas_evict.sh TOOLS_DIR SRC_DIR
#
# TOOLS_DIR holds embstore, embstore-server and embstore-bench;
# EMB_TRAINER_BIN is tests/cluster/trainer (its --hold keeps the job open).
set -u

tools=${1:?usage: replicas_evict.sh TOOLS_DIR SRC_DIR}
src=${2:?usage: replicas_evict.sh TOOLS_DIR SRC_DIR}
trainer=${EMB_TRAINER_BIN:?EMB_TRAINER_BIN: tests/cluster/trainer}
tools=$(cd "$tools" && pwd) || exit 1
src=$(cd "$src" && pwd) || exit 1
. "$src/tests/lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/emb-repevict-XXXXXX")
PATH=$tools:$PATH
export PATH
EMB_CLUSTER_TIMEOUT=60
# The backups check their slots five times a second: the dumps below
# wait for the round after the last push, not for the default 10 s.
EMB_BIRTH_CHECK_MS=200
export EMB_CLUSTER_TIMEOUT EMB_BIRTH_CHECK_MS
unset EMB_REPLICAS EMB_SCHED_HOST EMB_SCHED_PORT EMB_ROLE EMB_LISTEN \
	EMB_SERVER_MAX
CAP=6000
lpid=
fail=0

cleanup() {
	[ -n "$lpid" ] && kill -INT "$lpid" 2>/dev/null
	wait 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# Three workers run this script. The first to take the lock is the
# keeper: a trainer that holds the job open until the dumps are made,
# while the script waits for the other two to finish training and then
# dumps each server alone, again until the two hold the same ids (a
# backup prunes what its primary evicted at its next check) or 100 tries
# pass. The other two train.
cat >"$work/worker.sh" <<EOF
#!/bin/sh
set -u
w=$work
if ! mkdir "\$w/keeper" 2>/dev/null; then
	embstore-bench --op step --no-preload --admit count:2 \\
		--evict max_rows:$CAP --rows 200000 --dim 8 --batch 512 \\
		--dist zipf:1.05 --duration 3 || exit 1
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
try=0
while :; do
	try=\$((try + 1))
	k=0
	for a in \$(awk '\$2 == "live" { print \$1 }' "\$w/stat.txt" | sort -u); do
		embstore dump --servers "\$a" --table bench \\
			--out "\$w/dump.\$k" --quiet &&
			embstore export --in "\$w/dump.\$k" \\
				--out "\$w/rows.\$k" || exit 4
		sort "\$w/rows.\$k" >"\$w/sorted.\$k"
		cut -f 1 "\$w/sorted.\$k" >"\$w/ids.\$k"
		echo "\$a" >"\$w/addr.\$k"
		k=\$((k + 1))
	done
	cmp -s "\$w/ids.0" "\$w/ids.1" && break
	[ \$try -lt 100 ] || break
	sleep 0.3
done
echo "\$try" >"\$w/tries"
embstore stat --sched "\$EMB_SCHED_HOST:\$EMB_SCHED_PORT" \\
	--interval 0.1 --json >"\$w/stat.json" 2>&1 || exit 3
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
[ -s "$work/sorted.0" ] && [ -s "$work/sorted.1" ] ||
	bad "a server's rows were not dumped"
r0=$(wc -l <"$work/sorted.0")
r1=$(wc -l <"$work/sorted.1")
if cmp -s "$work/ids.0" "$work/ids.1"; then
	echo "replicas: $r0 and $r1 rows, the same ids (dump $(cat "$work/tries"))"
else
	bad "the replicas hold other rows ($r0 and $r1): $(diff "$work/ids.0" \
		"$work/ids.1" | head -n 6)"
fi
python3 - "$work/sorted.0" "$work/sorted.1" <<'EOF' >"$work/weights.txt" 2>&1 ||
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
worst, n = 0.0, 0
for x, y in zip(a, b):
    if x[0] != y[0] or len(x) != len(y):
        sys.exit("row %s against %s" % (x[0], y[0]))
    d = max(abs(float(u) - float(v)) for u, v in zip(x[1:], y[1:]))
    worst = max(worst, d)
    n += d > 2e-5
print("weights: largest difference %.3g over %d rows, %d past 2e-5"
      % (worst, len(a), n))
sys.exit(1 if n else 0)
EOF
	bad "the replicas' weights differ: $(cat "$work/weights.txt")"
cat "$work/weights.txt"
# Each server holds every slot (R = 2 of 2 servers), half of them as
# their primary: it keeps its share of the cap (CAP / 2) of the rows of
# those, and the other half follows the other primary's evictions. The
# primaries evict down to it as rows come; pulls made since the last
# eviction, and rows a backup keeps until its next check, may pass it by
# a few batches. The small cap makes the primaries evict rows that late
# pushes still name, the race the births close.
[ "$r0" -le $((CAP + 4096)) ] || bad "server 0 holds $r0 rows, cap $CAP"
[ "$r0" -ge $((CAP / 2)) ] || bad "server 0 holds only $r0 rows"

# Both servers evicted as primaries, pruned as backups, and admitted.
python3 - "$work/stat.json" "$(cat "$work/addr.0")" "$(cat "$work/addr.1")" \
	<<'EOF' >"$work/check.txt" 2>&1 || bad "$(cat "$work/check.txt")"
import json, sys
doc = json.load(open(sys.argv[1]))
for a in sys.argv[2:]:
    t = [e for e in doc["tables"] if e["server"] == a and e["table"] == "bench"]
    if not t:
        sys.exit("server %s: no table bench in %s" % (a, sys.argv[1]))
    tot = t[0]["totals"]
    print(a, "rows", tot["rows"], "evicted", tot["rows_evicted"],
          "unadmitted pulls", tot["pulls_unadmitted"])
    if tot["rows_evicted"] <= 0:
        sys.exit("server %s evicted nothing" % a)
    if tot["pulls_unadmitted"] <= 0:
        sys.exit("server %s admitted every id at once" % a)
EOF
cat "$work/check.txt"
n=$(grep -h -c 'birth check: removed' "$work"/log/server* 2>/dev/null |
	awk '{ s += $1 } END { print s + 0 }')
[ "$n" -gt 0 ] || bad "no backup's check removed a row: $(ls "$work/log")"
echo "birth checks that removed rows: $n"

[ "$fail" -eq 0 ] && echo "eviction under replicas: ok"
exit "$fail"
