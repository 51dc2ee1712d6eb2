#!/usr/bin/env bash
# tools/bench-auc-rowfmt.sh - the training-quality figures of the row
# formats (docs/benchmarks.md, "Row formats: training quality"): the CTR
# examples trained with their sparse tables (embeddings and wide weights)
# kept on the servers in each row format, 2 servers and 2 workers under
# `embstore launch`, on data from examples/ctr/gen. Appends one JSON object
# per run to a results file: the last epoch's test AUC and logloss, the
# wall time, and the servers' rows and memory_bytes of each sparse table as
# `embstore stat --json` reports them once training is done (the PyTorch
# example's --after-train; the C example's takes the same command), with
# the size of one row's record (row_bytes: weights, optimizer state and
# header) and the embeddings' slab and index bytes;
# `--summary FILE` turns that file into median [min..max] per example, mode
# and format.
#
# Runs (all by default, in this order, each REPS times):
#   torch       examples/torch/train.py, asynchronous (the default mode)
#   torch-sync  the same with --mode sync (deterministic up to rounding;
#               run once whatever REPS says)
#   c           examples/ctr/train (build/examples/ctr/train), asynchronous
#
# Repetitions are the outer loop and the formats the inner one, so every
# format sees the same stretch of a shared machine's load. Runs go one at
# a time: 2 workers and 2 servers already share the machine's cores.
#
#   tools/bench-auc-rowfmt.sh                       # 200k lines, 3 reps
#   tools/bench-auc-rowfmt.sh -n 20000 -r 1 torch   # quick look
#   tools/bench-auc-rowfmt.sh --summary out/bench/auc-rowfmt.jsonl
#
# Options: -b BUILD (build), -o FILE (out/bench/auc-rowfmt.jsonl, appended
# to), -n ROWS of generated data (200000; gen --seed 7), -r REPS (3), -s
# FIRST repetition number (1), -e EPOCHS (2), -f "FORMATS" ("fp32 fp16 bf16
# int8"), -k DIR keep the data and every run's log in DIR.
# Needs: the build's embstore, examples/ctr/gen and train,
# src/worker/libembstore.so; /usr/bin/python3 with torch (PYTHON=...); jq.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
out=$root/out/bench/auc-rowfmt.jsonl
rows=200000
reps=3
first=1
epochs=2
formats="fp32 fp16 bf16 int8"
keep=
python=${PYTHON:-/usr/bin/python3}

summary() {
	jq -rs '
	def med: sort | if length % 2 == 1 then .[length / 2 | floor]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r($n): . * pow(10; $n) | round / pow(10; $n);
	def mm(f; $n): map(f) | "\(med | r($n)) [\(min | r($n))..\(max | r($n))]";
	(["example", "mode", "format", "rows", "n", "auc", "logloss",
	  "seconds", "emb B/row", "emb record", "wide B/row", "wide record"]
	 | @tsv),
	(group_by([.example, .mode, .rows, .format_order]) | .[] |
	 [.[0].example, .[0].mode, .[0].format, .[0].rows, length,
	  mm(.auc; 4), mm(.logloss; 4), mm(.seconds; 0),
	  (map(select(.emb_rows > 0) | .emb_bytes / .emb_rows) |
	   if length > 0 then med | r(1) else "" end),
	  (map(.emb_row_bytes // empty) | .[0] // ""),
	  (map(select(.wide_rows > 0) | .wide_bytes / .wide_rows) |
	   if length > 0 then med | r(1) else "" end),
	  (map(.wide_row_bytes // empty) | .[0] // "")] | @tsv)' "$1"
}

while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$(cd "$2" && pwd); shift 2 ;;
	-o) out=$2; shift 2 ;;
	-n) rows=$2; shift 2 ;;
	-r) reps=$2; shift 2 ;;
	-s) first=$2; shift 2 ;;
	-e) epochs=$2; shift 2 ;;
	-f) formats=$2; shift 2 ;;
	-k) keep=$2; shift 2 ;;
	--summary) summary "$2"; exit 0 ;;
	-h | --help) sed -n '2,35s/^# \{0,1\}//p' "$0"; exit 0 ;;
	-*) echo "bench-auc-rowfmt: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
runs=${*:-torch torch-sync c}
for r in $runs; do
	case $r in
	torch | torch-sync | c) ;;
	*) echo "bench-auc-rowfmt: unknown run $r" >&2; exit 2 ;;
	esac
done

command -v jq >/dev/null || { echo "bench-auc-rowfmt: needs jq" >&2; exit 1; }
embstore=$build/tools/embstore
mkdir -p "$(dirname "$out")"
if [ -n "$keep" ]; then
	mkdir -p "$keep"
	work=$(cd "$keep" && pwd)
else
	work=$(mktemp -d "${TMPDIR:-/tmp}/bench-auc-rowfmt.XXXXXX")
	trap 'rm -rf "$work"' EXIT
fi

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain -- src examples python \
	2>/dev/null)" ]; then
	commit="$commit+dirty"
fi
note() { echo "bench-auc-rowfmt: $*" >&2; }

data=$work/data.$rows
if [ ! -f "$data/train.tsv" ]; then
	"$build/examples/ctr/gen" --rows "$rows" --seed 7 --out "$data" \
		>/dev/null
fi

# run EXAMPLE MODE FMT REP: one training under `embstore launch`; appends
# its JSON line, or says why not.
run() {
	local ex=$1 mode=$2 fmt=$3 rep=$4 name log stat t0 t1 cmd j
	name=$ex.$mode.$fmt.$rep
	log=$work/$name.log
	stat=$work/$name.stat.json
	rm -f "$stat"
	if [ "$ex" = torch ]; then
		cmd=("$python" "$root/examples/torch/train.py")
	else
		cmd=("$build/examples/ctr/train")
	fi
	t0=$(date +%s.%N)
	if ! PYTHONPATH=$root/python \
		EMBSTORE_LIB=$build/src/worker/libembstore.so \
		EMB_LOG_LEVEL=warn "$embstore" launch --server_num 2 \
		--worker_num 2 --log-dir "$work/log.$name" -- "${cmd[@]}" \
		--data "$data/train.tsv" --test "$data/test.tsv" \
		--epochs "$epochs" --mode "$mode" --row-format "$fmt" \
		--log-every 1000 --after-train \
		"'$embstore' stat --servers \$EMB_SERVERS --interval 0.1 --json > '$stat'" \
		>"$log" 2>&1; then
		note "$name failed: $(tail -n 3 "$log")"
		return 0
	fi
	t1=$(date +%s.%N)
	# The last "epoch: N test auc=A logloss=L" line; the stat sample's
	# sparse tables summed over the two servers.
	if ! j=$(sed -n 's/.*test auc=\([0-9.]*\) logloss=\([0-9.]*\).*/\1 \2/p' \
		"$log" | tail -n 1 | jq -Rc --arg ex "$ex" --arg mode "$mode" \
		--arg fmt "$fmt" --argjson rep "$rep" --argjson rows "$rows" \
		--argjson epochs "$epochs" --arg commit "$commit" \
		--argjson s "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
		--argjson load "$(cut -d' ' -f1 /proc/loadavg)" \
		--argjson order "$(echo "fp32 fp16 bf16 int8" | tr ' ' '\n' |
			grep -nx "$fmt" | cut -d: -f1 || echo 9)" \
		--slurpfile st "$stat" '
		split(" ") as $v |
		def tab($t): [$st[0].tables[] | select(.table == $t)];
		{fig: "auc-rowfmt", example: $ex, mode: $mode, format: $fmt,
		 format_order: $order, rep: $rep, rows: $rows, epochs: $epochs,
		 auc: ($v[0] | tonumber), logloss: ($v[1] | tonumber),
		 seconds: $s, load1: $load, commit: $commit,
		 emb_rows: (tab("ctr_emb") | map(.rows) | add),
		 emb_bytes: (tab("ctr_emb") | map(.memory_bytes) | add),
		 wide_rows: (tab("ctr_wide") | map(.rows) | add),
		 wide_bytes: (tab("ctr_wide") | map(.memory_bytes) | add),
		 emb_row_bytes: (tab("ctr_emb")[0].totals.row_bytes),
		 emb_slab_bytes: (tab("ctr_emb") | map(.totals.slab_bytes) | add),
		 emb_index_bytes: (tab("ctr_emb") | map(.totals.index_bytes) | add),
		 wide_row_bytes: (tab("ctr_wide")[0].totals.row_bytes),
		 stat_formats: (tab("ctr_emb") | map(.row_format) | unique)}'
		) || [ -z "$j" ]; then
		note "$name: no test auc or stat; see $(tail -n 3 "$log")"
		return 0
	fi
	echo "$j" >>"$out"
	note "$name: $(jq -r '"auc \(.auc) logloss \(.logloss) \(.seconds | floor) s"' <<<"$j")"
}

note "runs: $runs; $rows lines; reps $reps; formats $formats; into $out"
for rep in $(seq "$first" $((first + reps - 1))); do
	for r in $runs; do
		[ "$r" = torch-sync ] && [ "$rep" != "$first" ] && continue
		for fmt in $formats; do
			case $r in
			torch) run torch async "$fmt" "$rep" ;;
			torch-sync) run torch sync "$fmt" "$rep" ;;
			c) run c async "$fmt" "$rep" ;;
			esac
		done
	done
done
