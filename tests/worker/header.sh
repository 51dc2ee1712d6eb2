#!/bin/sh
# tests/worker/header.sh HEADER LIBRARY - the installed embstore.h (HEADER,
# as the build makes it) stands alone: it includes libc headers only,
# compiles by itself as C11 and as C++17 with strict warnings, its _DEFAULT
# macros expand cleanly, and a program built with it finds that its
# EMBSTORE_VERSION_* are those of LIBRARY (emb_version(),
# emb_version_number()).
set -u
hdr=$1
lib=$2
cc=${CC:-cc}
cxx=${CXX:-c++}
strict="-Wall -Wextra -Wpedantic -Werror"

dir=$(mktemp -d "${TMPDIR:-/tmp}/emb-header-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

if grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$hdr"; then
	echo "FAIL: $hdr includes a header of the tree" >&2
	exit 1
fi
for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' "$hdr"); do
	case $inc in
	stdbool.h | stddef.h | stdint.h) ;;
	*)
		echo "FAIL: $hdr includes <$inc>, not a libc header it needs" >&2
		exit 1
		;;
	esac
done
if ! $cc -std=c11 $strict -fsyntax-only -x c "$hdr"; then
	echo "FAIL: $hdr alone is not clean C11" >&2
	exit 1
fi
if command -v "$cxx" >/dev/null 2>&1; then
	if ! $cxx -std=c++17 $strict -fsyntax-only -x c++ "$hdr"; then
		echo "FAIL: $hdr alone is not clean C++17" >&2
		exit 1
	fi
fi

cat >"$dir/v.c" <<'PROG'
#include <embstore.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec s = EMB_TABLE_SPEC_DEFAULT;
	struct emb_cached_table_opts c = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	char v[32];

	snprintf(v, sizeof(v), "%d.%d.%d", EMBSTORE_VERSION_MAJOR,
		 EMBSTORE_VERSION_MINOR, EMBSTORE_VERSION_PATCH);
	if (strcmp(v, emb_version()) || strcmp(v, EMBSTORE_VERSION_STRING) ||
	    emb_version_number() != EMBSTORE_VERSION_NUMBER ||
	    EMBSTORE_VERSION_NUMBER != EMBSTORE_VERSION_MAJOR * 10000 +
					   EMBSTORE_VERSION_MINOR * 100 +
					   EMBSTORE_VERSION_PATCH) {
		fprintf(stderr, "header %s (%d), library %s (%u)\n", v,
			EMBSTORE_VERSION_NUMBER, emb_version(),
			(unsigned)emb_version_number());
		return 1;
	}
	if (emb_struct_size("emb_client_opts") != sizeof(o) ||
	    emb_struct_size("emb_table_spec") != sizeof(s) ||
	    emb_struct_size("emb_cached_table_opts") != sizeof(c) ||
	    emb_struct_size("emb_client_stats") != st.struct_size) {
		fprintf(stderr, "struct sizes differ from the library's\n");
		return 1;
	}
	printf("embstore.h %s = library %s\n", v, emb_version());
	return 0;
}
PROG
ln -s "$hdr" "$dir/embstore.h"
# A sanitized library needs its runtime in the program too (EMB_SANITIZE:
# the build's b_sanitize).
san=
case ${EMB_SANITIZE:-none} in none | '') ;; *) san=-fsanitize=$EMB_SANITIZE ;; esac
if ! $cc -std=c11 $strict $san -I"$dir" -o "$dir/v" "$dir/v.c" "$lib"; then
	echo "FAIL: a program does not build with $hdr" >&2
	exit 1
fi
LD_LIBRARY_PATH=$(dirname "$lib") "$dir/v"
