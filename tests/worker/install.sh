#!/bin/sh
# tests/worker/install.sh BUILD_DIR CONSUMER_C - libembstore as a user outside
# the tree gets it: `meson install --destdir` into a temp dir, then
# consumer.c compiled with nothing but `pkg-config --cflags --libs embstore`
# (pointed into that dir) and strict warnings, which proves the installed
# header self-contained (the only one installed). The installed embstore-server serves it; the
# consumer connects, creates a table, pulls and pushes; then the installed
# libembstore.so is loaded with dlopen() as an interpreter would.
set -u
. "$(dirname "$0")/../lib.sh"
build=$1
src=$2

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-install-XXXXXX") || exit 1
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
dest=$dir/root

if ! meson install -C "$build" --no-rebuild --quiet --destdir "$dest" \
	>"$dir/install.log" 2>&1; then
	echo "FAIL meson install" >&2
	cat "$dir/install.log" >&2
	exit 1
fi
pc=$(find "$dest" -name embstore.pc | head -n 1)
lib=$(find "$dest" -name 'libembstore.so' | head -n 1)
server=$(find "$dest" -path '*/bin/embstore-server' | head -n 1)
for f in "$pc" "$lib" "$server" \
	"$(find "$dest" -name libembstore.a | head -n 1)" \
	"$(find "$dest" -path '*/include/embstore/embstore.h' | head -n 1)"; do
	if [ -z "$f" ] || [ ! -e "$f" ]; then
		echo "FAIL: install tree lacks a file:" >&2
		find "$dest" -type f >&2
		exit 1
	fi
done

# One header is installed, and nothing of the tree's internals.
hdrs=$(find "$dest" -path '*/include/*' -type f)
if [ "$(printf '%s\n' "$hdrs" | wc -l)" -ne 1 ]; then
	echo "FAIL: headers other than embstore.h installed:" >&2
	printf '%s\n' "$hdrs" >&2
	exit 1
fi

# The .pc names the real prefix; the sysroot variable maps -I and -L into
# the destdir, as for a staged install.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest \
	pkg-config --cflags --libs embstore) || {
	echo "FAIL pkg-config" >&2
	exit 1
}
echo "pkg-config: $flags"
# shellcheck disable=SC2086  # flags are a list
if ! ${CC:-cc} -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$dir/consumer" \
	"$src" $flags -lm -ldl; then
	echo "FAIL: consumer.c does not build from the installed headers" >&2
	exit 1
fi

emb_start_server "$server" "$dir/server.log" || exit 1

export LD_LIBRARY_PATH
LD_LIBRARY_PATH=$(dirname "$lib")
"$dir/consumer" "127.0.0.1:$port" || exit 1
"$dir/consumer" --dlopen "$lib" || exit 1
# What the library needs at run time: no allocator of its own.
if ldd "$lib" | grep -q jemalloc; then
	echo "FAIL: libembstore.so links jemalloc" >&2
	exit 1
fi
exit 0
