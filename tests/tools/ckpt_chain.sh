#!/bin/bash
# tests/tools/ckpt_chain.sh - incremental checkpoints end to end: a server
# writes a full checkpoint and then 10 deltas while pushes change rows and
# create new ones; the chain, exported offline, and a server restarted
# from it (after SIGKILL) and the chain restored onto a fresh server all
# hold exactly the live table, compared through `embstore export`. Then `embstore compact` merges the chain, `inspect`
# shows it, and a damaged middle delta is refused by name: the restarted
# server loads the links before it and sets the later ones aside, and the
# CLI refuses the chain. Needs EMB_BIN_DIR (the build's tools/).
set -u
. "$(dirname "$0")/../lib.sh"
: "${EMB_BIN_DIR:?}"
B=$EMB_BIN_DIR

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-chain-XXXXXX") || exit 1
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail=0
ck=$dir/ck
links() { ls "$ck" 2>/dev/null | grep -c '^ckpt-'; }
# wait_link N: until ck holds more than N links (10 s at most).
wait_link() {
	for _ in $(seq 100); do
		[ "$(links)" -gt "$1" ] && return 0
		sleep 0.1
	done
	bad "no new checkpoint after $1"
	return 1
}
# push I: 3 batches of 200 uniform ids over 0..1000 I: old rows change
# and new ones come (the seed is the table's too, so it stays).
push() {
	"$B/embstore-bench" --servers "127.0.0.1:$port" --op push \
		--no-preload --rows $((1000 * $1)) --dist uniform --dim 8 \
		--batch 200 --batches 3 --optimizer adam --table chain \
		>/dev/null 2>&1 || bad "embstore-bench push $1"
}
# export_live FILE: the live table, dumped and exported, sorted.
export_live() {
	rm -rf "$dir/live"
	"$B/embstore" dump --servers "127.0.0.1:$port" --table chain \
		--out "$dir/live" --quiet >/dev/null || bad "dump"
	"$B/embstore" export --in "$dir/live" | sort >"$1" || bad "export live"
}

emb_start_server "$B/embstore-server" "$dir/s1.log" --checkpoint-dir "$ck" \
	--checkpoint-interval 1 --checkpoint-full-every 100 || exit 1
push 1
wait_link 0
for i in $(seq 2 11); do
	n=$(links)
	push "$i"
	wait_link "$n"
done
export_live "$dir/live.tsv"
# One more link after the last push, so the chain holds every update.
wait_link "$(links)"
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=
full=$(ls "$ck" | grep -c '^ckpt-[0-9]*$')
deltas=$(ls "$ck" | grep -c '^ckpt-[0-9]*-delta$')
[ "$full" -eq 1 ] || bad "$full full checkpoints, want 1"
[ "$deltas" -ge 10 ] || bad "$deltas deltas, want >= 10"
rows=$(wc -l <"$dir/live.tsv")
[ "$rows" -gt 3000 ] || bad "live table has $rows rows"

# The chain, exported offline, is the live table.
"$B/embstore" export --in "$ck" 2>"$dir/export.err" | sort >"$dir/chain.tsv"
cmp -s "$dir/live.tsv" "$dir/chain.tsv" ||
	bad "export of the chain differs from the live table"
grep -q "checkpoint chain ckpt-[0-9]* and $deltas deltas" "$dir/export.err" ||
	bad "export did not say which chain: $(cat "$dir/export.err")"

# inspect shows one chain, every link OK.
"$B/embstore" inspect "$ck" >"$dir/inspect.out" || bad "inspect of the chain"
grep -q "^chain ckpt-[0-9]*: full + $deltas deltas (the newest)" \
	"$dir/inspect.out" || bad "inspect: $(head -n 3 "$dir/inspect.out")"
[ "$(grep -c '^  delta .* OK$' "$dir/inspect.out")" -eq "$deltas" ] ||
	bad "inspect: not every delta OK"

# A server restarted from the chain serves the live table.
emb_start_server "$B/embstore-server" "$dir/s2.log" --checkpoint-dir "$ck" \
	--checkpoint-interval 1000 || exit 1
grep -q "loaded: 1 tables, .*and $deltas deltas)" "$dir/s2.log" ||
	bad "restart did not load the chain: $(cat "$dir/s2.log")"
export_live "$dir/restarted.tsv"
cmp -s "$dir/live.tsv" "$dir/restarted.tsv" ||
	bad "restarted server differs from the live table"
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=

# restore takes the chain too.
emb_start_server "$B/embstore-server" "$dir/s4.log" || exit 1
"$B/embstore" restore --in "$ck" --servers "127.0.0.1:$port" \
	--from nosuch --quiet >/dev/null 2>"$dir/restore.err" &&
	bad "restore --from a table the chain lacks succeeded"
grep -q "holds no table nosuch" "$dir/restore.err" ||
	bad "restore --from nosuch: $(cat "$dir/restore.err")"
"$B/embstore" restore --in "$ck" --servers "127.0.0.1:$port" --from chain \
	--quiet >/dev/null 2>"$dir/restore.err" ||
	bad "restore: $(cat "$dir/restore.err")"
export_live "$dir/restored.tsv"
cmp -s "$dir/live.tsv" "$dir/restored.tsv" ||
	bad "the chain restored onto a server differs from the live table"
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=

# compact: a new full checkpoint with the same rows.
cp -r "$ck" "$dir/ck2"
"$B/embstore" compact "$dir/ck2" >"$dir/compact.out" ||
	bad "compact: $(cat "$dir/compact.out")"
grep -q "and $deltas deltas.* -> ckpt-[0-9]*: $rows rows" \
	"$dir/compact.out" || bad "compact said: $(cat "$dir/compact.out")"
"$B/embstore" export --in "$dir/ck2" 2>"$dir/export2.err" |
	sort >"$dir/compact.tsv"
cmp -s "$dir/live.tsv" "$dir/compact.tsv" || bad "compacted chain differs"
grep -q "and 0 deltas" "$dir/export2.err" ||
	bad "export after compact: $(cat "$dir/export2.err")"

# A damaged middle delta: named, the links before it loaded, none after.
mid=$(ls "$ck" | grep -- '-delta$' | sed -n 5p)
f="$ck/$mid/chain.embs"
printf '\377' | dd of="$f" bs=1 seek=300 conv=notrunc 2>/dev/null
"$B/embstore" export --in "$ck" >/dev/null 2>"$dir/export3.err" &&
	bad "export of a damaged chain succeeded"
grep -q "$mid/chain.embs" "$dir/export3.err" ||
	bad "export did not name the damaged delta: $(cat "$dir/export3.err")"
"$B/embstore" inspect "$ck" >"$dir/inspect2.out" &&
	bad "inspect of a damaged chain exited 0"
grep -q "$mid  .*REFUSED: chain.embs" "$dir/inspect2.out" ||
	bad "inspect did not refuse $mid"
emb_start_server "$B/embstore-server" "$dir/s3.log" --checkpoint-dir "$ck" \
	--checkpoint-interval 1000 || exit 1
grep -q "checkpoint .*/$mid refused: chain.embs: .* and the 4 deltas before it" \
	"$dir/s3.log" || bad "server did not name the damaged delta: $(cat "$dir/s3.log")"
grep -q "loaded: 1 tables, .*and 4 deltas)" "$dir/s3.log" ||
	bad "server did not load the 4 deltas before it"
[ "$(ls "$ck" | grep -c '^refused-ckpt-.*-delta$')" -eq $((deltas - 4)) ] ||
	bad "the damaged delta and the later ones were not set aside"
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=
exit $fail
