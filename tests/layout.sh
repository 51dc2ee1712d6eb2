#!/bin/sh
# tests/layout.sh SRC_ROOT - the module graph of docs/architecture.md holds:
# every #include "module/..." in src/<module>/ names the module itself or one
# it may use, and no library code includes a header from tools/. Prints each
# offending line; exits 1 if there is any.
set -u
root=$1
fail=0

allowed() {
	case $1 in
	common) echo "common" ;;
	proto | store | cache | metrics) echo "common $1" ;;
	transport) echo "common transport" ;;
	cluster) echo "common proto transport metrics cluster" ;;
	server) echo "common proto transport store metrics cluster server" ;;
	worker) echo "common proto transport cache cluster worker" ;;
	plugin) echo "common worker plugin" ;;
	*) echo "" ;;
	esac
}

for dir in "$root"/src/*/; do
	mod=$(basename "$dir")
	ok=$(allowed "$mod")
	if [ -z "$ok" ]; then
		echo "src/$mod: a module docs/architecture.md does not list" >&2
		fail=1
		continue
	fi
	for f in "$dir"*.c "$dir"*.h; do
		[ -e "$f" ] || continue
		grep -n '^#include "' "$f" | while IFS= read -r line; do
			inc=$(printf '%s\n' "$line" | sed 's/.*#include "\([^"]*\)".*/\1/')
			case $inc in
			*/*) dep=${inc%%/*} ;;
			*) dep= ;; # a same-folder include: only tools do that
			esac
			good=0
			for m in $ok; do
				[ "$dep" = "$m" ] && good=1
			done
			if [ $good = 0 ]; then
				echo "src/$mod/$(basename "$f"):$line: not an arrow of the module graph"
			fi
		done
	done
done >"${TMPDIR:-/tmp}/emb-layout.$$"
if [ -s "${TMPDIR:-/tmp}/emb-layout.$$" ]; then
	cat "${TMPDIR:-/tmp}/emb-layout.$$" >&2
	fail=1
fi
rm -f "${TMPDIR:-/tmp}/emb-layout.$$"

# tools/ holds programs only: at most a quarter of the C lines.
src_lines=$(cat "$root"/src/*/*.[ch] | wc -l)
tool_lines=$(find "$root/tools" -name '*.[ch]' -exec cat {} + | wc -l)
if [ $((tool_lines * 4)) -gt $((src_lines + tool_lines)) ]; then
	echo "tools/ has $tool_lines of $((src_lines + tool_lines)) C lines (> 25%)" >&2
	fail=1
fi
echo "tools/: $tool_lines of $((src_lines + tool_lines)) C lines"
exit $fail
