#!/bin/bash
# tests/tools/seconds.sh - every flag and variable in seconds takes
# fractions, and refuses junk by name: embstore-server with
# --checkpoint-interval 1.5 (and fractional handshake, idle and frame
# timeouts) runs and writes checkpoints; EMB_FRAME_TIMEOUT=0.5 is taken;
# "1.5x", "-1", "nan" exit 2 with a message naming the flag; embstore-bench
# --duration 0.5. Needs EMB_BIN_DIR (the build's tools/).
set -u
. "$(dirname "$0")/../lib.sh"
: "${EMB_BIN_DIR:?}"
B=$EMB_BIN_DIR

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-secs-XXXXXX") || exit 1
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail=0

# Refused values: exit 2, and the message names the flag and the value.
for flag in checkpoint-interval frame-timeout handshake-timeout idle-timeout; do
	for v in 1.5x -1 nan ""; do
		"$B/embstore-server" --listen 127.0.0.1:0 --"$flag" "$v" \
			>/dev/null 2>"$dir/bad.err"
		rc=$?
		[ $rc -eq 2 ] && grep -q -e "--$flag '$v'" "$dir/bad.err" ||
			bad "--$flag '$v': exit $rc, $(cat "$dir/bad.err")"
	done
done

# Fractions run: a checkpoint every 1.5 s, so two within 10 s.
emb_start_server "$B/embstore-server" "$dir/s.log" \
	--checkpoint-dir "$dir/ck" --checkpoint-interval 1.5 \
	--handshake-timeout 2.5 --idle-timeout 60.25 --frame-timeout 0.75 ||
	exit 1
"$B/embstore-bench" --servers "127.0.0.1:$port" --op push --rows 1000 \
	--dim 8 --batch 100 --duration 0.5 >/dev/null 2>"$dir/bench.err" ||
	bad "embstore-bench --duration 0.5: $(cat "$dir/bench.err")"
n=0
for _ in $(seq 100); do
	n=$(ls "$dir/ck" 2>/dev/null | grep -c '^ckpt-')
	[ "$n" -ge 2 ] && break
	sleep 0.1
done
[ "$n" -ge 2 ] || bad "--checkpoint-interval 1.5: $n checkpoints in 10 s"
kill "$pid"
wait "$pid" 2>/dev/null
pid=

# The same through the environment.
EMB_FRAME_TIMEOUT=0.5 EMB_CHECKPOINT_INTERVAL=2.5 emb_start_server \
	"$B/embstore-server" "$dir/s2.log" --checkpoint-dir "$dir/ck2" ||
	bad "EMB_FRAME_TIMEOUT=0.5 EMB_CHECKPOINT_INTERVAL=2.5 refused"
[ -n "$pid" ] && kill "$pid" && wait "$pid" 2>/dev/null
pid=
exit $fail
