#!/usr/bin/env bash
# tools/bench-dump.sh - dumps, restores and checkpoints of one server's
# table against the disk's own rates, in one run (docs/benchmarks.md,
# "Dumps and checkpoints against the disk"; docs/format.md, Performance):
#
#  1. the disk: dd with O_DIRECT writes a file as large as the table's raw
#     rows (4 MiB blocks, fsync) to DIR and reads it back, twice each;
#  2. one embstore-server (--threads 2) with ROWS rows of DIM floats (SGD)
#     made by `embstore-bench --op pull --batches 1` (its preload);
#  3. `embstore dump` of the table into DIR, then `embstore restore` of
#     that dump onto a second, empty server;
#  4. the first server's checkpoint: stopped with SIGTERM, it writes its
#     final checkpoint into DIR, and started again, it loads it.
#
# Each step prints MB/s of raw rows (ids, meta and rows, as format.md
# counts them) and its share of dd's rate of the same direction; after the
# restore, how fast this machine gives fresh memory (first touch of 1 GiB,
# numpy), which bounds a server making rows.
#
#   flock /var/lock/bigrun.lock tools/bench-dump.sh -b build-rel --dir /var/tmp
#   tools/bench-dump.sh --rows 100000              # a smoke run
#
# Options: -b BUILD (build), --rows N (10000000), --dim N (64), --dir DIR
# (where the files go, on the disk measured; default $TMPDIR or /tmp),
# --huge-pages on|off (the servers' option; default on), --keep (keep the
# files).
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
rows=10000000
dim=64
base=${TMPDIR:-/tmp}
keep=
huge=on
# shellcheck source=tests/lib.sh
. "$root/tests/lib.sh"
while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	--rows) rows=$2; shift 2 ;;
	--dim) dim=$2; shift 2 ;;
	--dir) base=$2; shift 2 ;;
	--huge-pages) huge=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	*) echo "usage: bench-dump.sh [-b BUILD] [--rows N] [--dim N]" \
		"[--dir DIR] [--huge-pages on|off] [--keep]" >&2; exit 2 ;;
	esac
done
tools=$(cd "$build/tools" && pwd) || exit 2
work=$(mktemp -d "$base/emb-bench-dump-XXXXXX") || exit 2
raw=$((rows * (16 + 4 * dim)))
pids=

cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	if [ -n "$keep" ]; then echo "work dir: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

die() {
	echo "bench-dump: $*" >&2
	exit 1
}

# dd_mbs WHAT: MB/s of an O_DIRECT dd write (WHAT=write) or read.
dd_mbs() {
	blocks=$(( (raw + 4194303) / 4194304 ))
	t0=$(date +%s.%N)
	if [ "$1" = write ]; then
		dd if=/dev/zero of="$work/dd" bs=4M count=$blocks oflag=direct \
			conv=fsync status=none || die "dd write failed"
	else
		dd if="$work/dd" of=/dev/null bs=4M iflag=direct status=none ||
			die "dd read failed"
	fi
	t1=$(date +%s.%N)
	awk -v b=$((blocks * 4194304)) -v a="$t0" -v z="$t1" \
		'BEGIN { printf "%.0f", b / 1e6 / (z - a) }'
}

# start LOG ARGS...: an embstore-server on a free loopback port, its log in
# LOG; sets pid and port. A server loading a checkpoint reports its port
# only once loaded, so this waits up to 10 minutes.
start() {
	_slog=$1
	shift
	EMB_START_WAIT=600 emb_start_server "$tools/embstore-server" "$_slog" \
		--threads 2 --huge-pages "$huge" "$@"
	_ok=$?
	pids="$pids $pid"
	[ "$_ok" -eq 0 ] || die "embstore-server did not report a port"
}

# figure NAME VALUE: VALUE, or the run fails if it is not a number.
figure() {
	case $2 in
	'' | *[!0-9.]*) die "no figure for $1" ;;
	esac
}

# share OUR DD: OUR as a percentage of DD.
share() {
	awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f %%", 100 * a / b }'
}

echo "table: $rows rows x dim $dim, SGD: $((raw / 1000000)) MB of raw rows;" \
	"servers --threads 2 --huge-pages $huge;" \
	"files in $work ($(df --output=source "$work" | tail -n 1))"
w1=$(dd_mbs write); r1=$(dd_mbs read)
w2=$(dd_mbs write); r2=$(dd_mbs read)
rm -f "$work/dd"
ddw=$(printf '%s\n%s\n' "$w1" "$w2" | sort -n | tail -n 1)
ddr=$(printf '%s\n%s\n' "$r1" "$r2" | sort -n | tail -n 1)
echo "dd O_DIRECT 4 MiB: write $w1, $w2 MB/s; read $r1, $r2 MB/s" \
	"(the better of each is the reference)"

start "$work/a.log" --log-level info --checkpoint-dir "$work/ckpt" \
	--checkpoint-interval 100000
apid=$pid aport=$port
"$tools/embstore-bench" --servers "127.0.0.1:$aport" --table big \
	--rows "$rows" --dim "$dim" --op pull --batches 1 >/dev/null 2>&1 ||
	die "preload failed"

"$tools/embstore" dump --servers "127.0.0.1:$aport" --table big \
	--out "$work/dump" >"$work/dump.out" 2>&1 || {
	cat "$work/dump.out" >&2; die "dump failed"; }
grep '^dump:' "$work/dump.out" | tail -n 1 >"$work/dump.txt"
dmbs=$(sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p' "$work/dump.txt")
figure dump "$dmbs"
cat "$work/dump.txt"
echo "  dump: $dmbs MB/s, $(share "$dmbs" "$ddw") of dd's write"

start "$work/b.log"
bpid=$pid bport=$port
"$tools/embstore" restore --in "$work/dump" \
	--servers "127.0.0.1:$bport" >"$work/restore.out" 2>&1 || {
	cat "$work/restore.out" >&2; die "restore failed"; }
grep '^restore:' "$work/restore.out" | tail -n 1 >"$work/restore.txt"
rmbs=$(sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p' "$work/restore.txt")
figure restore "$rmbs"
cat "$work/restore.txt"
echo "  restore: $rmbs MB/s, $(share "$rmbs" "$ddr") of dd's read"
# A restore's rows land in memory the server never touched: what this
# machine gives fresh pages (1 GiB written once, first touch), measured
# while both servers still hold their rows.
py=/usr/bin/python3 # Debian's, which has numpy
[ -x "$py" ] || py=python3
fresh=$("$py" -c 'import time, numpy as np
t = time.perf_counter(); a = np.ones(1 << 28, dtype=np.float32)
print("%.0f" % ((1 << 30) / 1e6 / (time.perf_counter() - t)))' 2>/dev/null)
echo "  fresh memory: ${fresh:-?} MB/s (first touch)"
kill "$bpid"
rm -rf "$work/dump"

kill -TERM "$apid"
wait "$apid" 2>/dev/null
line=$(grep 'checkpoint .* bytes in ' "$work/a.log" | tail -n 1)
[ -n "$line" ] || die "no checkpoint written: $(tail -n 3 "$work/a.log")"
cs=$(echo "$line" | sed -n 's/.* bytes in \([0-9.]*\) s .*/\1/p')
figure checkpoint "$cs"
cmbs=$(awk -v b="$raw" -v s="$cs" 'BEGIN { printf "%.0f", b / 1e6 / s }')
echo "checkpoint: ${line#*checkpoint }"
echo "  checkpoint: $cmbs MB/s of raw rows, $(share "$cmbs" "$ddw") of dd's write"

start "$work/a2.log" --log-level info --checkpoint-dir "$work/ckpt" \
	--checkpoint-interval 100000
line=$(grep 'loaded: .* in ' "$work/a2.log" | tail -n 1)
[ -n "$line" ] || die "no checkpoint loaded: $(tail -n 3 "$work/a2.log")"
ls=$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s$/\1/p')
figure load "$ls"
lmbs=$(awk -v b="$raw" -v s="$ls" 'BEGIN { printf "%.0f", b / 1e6 / s }')
echo "load: ${line#*checkpoint }"
echo "  checkpoint load: $lmbs MB/s of raw rows, $(share "$lmbs" "$ddr") of dd's read"
