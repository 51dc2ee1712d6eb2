#!/usr/bin/env bash
# tests/examples/ctr_bad_data.sh - the CTR trainer on data it cannot use:
# garbage, or an empty file, makes it exit non-zero and say why, while one
# good line among garbage is enough to train.
#
# usage: ctr_bad_data.sh BUILD_DIR
set -euo pipefail

BUILD=$1
GEN=$BUILD/examples/ctr/gen
TRAIN=$BUILD/examples/ctr/train
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ctr-bad.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
FAILED=0

printf 'not\ta\tctr\tline\n%%%%garbage\n\n' >"$DIR/garbage.tsv"
: >"$DIR/empty.tsv"
# A bad admission or eviction spec: exit 2 and the flag named.
for bad in "--admit count:1" "--evict max_rows:5:mru"; do
    # shellcheck disable=SC2086 # the flag and its value are two words
    if "$TRAIN" --local --data "$DIR/empty.tsv" $bad >"$DIR/flag.log" 2>&1; then
        echo "FAIL $bad: exit status 0"
        FAILED=1
    elif ! grep -q "bad ${bad%% *}" "$DIR/flag.log"; then
        echo "FAIL $bad: no reason given"
        cat "$DIR/flag.log"
        FAILED=1
    else
        echo "ok   $bad: refused"
    fi
done

for f in garbage empty; do
    if "$TRAIN" --local --data "$DIR/$f.tsv" --epochs 1 >"$DIR/$f.log" 2>&1; then
        echo "FAIL $f: exit status 0"
        FAILED=1
    elif ! grep -q 'no valid sample' "$DIR/$f.log"; then
        echo "FAIL $f: no reason given"
        cat "$DIR/$f.log"
        FAILED=1
    else
        echo "ok   $f: refused"
    fi
done

"$GEN" --rows 50 --seed 3 --out "$DIR/data" >/dev/null
cat "$DIR/garbage.tsv" "$DIR/data/train.tsv" >"$DIR/mixed.tsv"
if "$TRAIN" --local --data "$DIR/mixed.tsv" --epochs 1 >"$DIR/mixed.log" 2>&1; then
    echo "ok   mixed: trained, malformed lines skipped"
else
    echo "FAIL mixed: good lines among garbage did not train"
    cat "$DIR/mixed.log"
    FAILED=1
fi
exit "$FAILED"
