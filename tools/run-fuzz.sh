#!/bin/sh
# tools/run-fuzz.sh - builds the libFuzzer targets with clang in their own
# build dir and fuzzes the frame decoder for a bounded time.
#
#   tools/run-fuzz.sh [SECONDS]        default 60
#
# Starts from the checked-in seeds (tests/fuzz/corpus, read-only) plus a
# scratch corpus that is thrown away, so runs never dirty the tree. Exits 0
# when the time ran out without a finding, non-zero on a crash, a sanitizer
# report, a leak, a timeout of one input or a build failure; the input that
# failed is kept under $BUILD/fuzz-artifacts/ to replay with
#   $BUILD/tests/fuzz/fuzz_frame FILE
# BUILD is $EMB_FUZZ_BUILD or build-fuzz at the top of the tree.
set -eu

secs=${1:-60}
case $secs in
'' | *[!0-9]*)
	echo "usage: $0 [SECONDS]" >&2
	exit 2
	;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
build=${EMB_FUZZ_BUILD:-$root/build-fuzz}
art=$build/fuzz-artifacts

if [ ! -f "$build/build.ninja" ]; then
	CC=clang meson setup "$build" "$root" -Dfuzz=true
fi
ninja -C "$build" ${EMB_NINJA_JOBS:+-j "$EMB_NINJA_JOBS"} tests/fuzz/fuzz_frame

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
mkdir -p "$art"

# The first corpus dir receives new inputs; the seeds stay as they are.
# -timeout: one frame decodes in microseconds, so 10 s means a hang.
if "$build/tests/fuzz/fuzz_frame" -max_total_time="$secs" -timeout=10 \
	-print_final_stats=1 -artifact_prefix="$art/" \
	"$work" "$root/tests/fuzz/corpus"; then
	echo "run-fuzz: no findings in ${secs}s"
else
	rc=$?
	echo "run-fuzz: fuzz_frame failed (exit $rc); inputs in $art/" >&2
	exit "$rc"
fi
