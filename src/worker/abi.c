/*
 * src/worker/abi.c - what lets a program and libembstore of different
 * releases work together: the version, the size of each public struct by
 * name, the struct_size copy rule of embstore.h, and the init functions
 * that set defaults where a C macro cannot (C++, Python). Thread-safe: no
 * state.
 */
#include "worker/abi.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "worker/embstore.h"

/*
 * Every public struct that embstore.h lets grow, with the size it had when
 * first published: a caller's struct_size below that cannot be a version of
 * the struct. A new field goes at the end of its struct; its _V0 stays.
 */
static const struct {
	const char *name;
	size_t size;	/* this library's sizeof */
	size_t size_v0; /* the first published size */
} structs[] = {
    {"emb_client_opts", sizeof(struct emb_client_opts), 56},
    {"emb_table_spec", sizeof(struct emb_table_spec), 112},
    {"emb_cached_table_opts", sizeof(struct emb_cached_table_opts), 32},
    {"emb_client_stats", sizeof(struct emb_client_stats), 112},
    {"emb_client_table_stats", sizeof(struct emb_client_table_stats), 184},
    {"emb_cached_table_stats", sizeof(struct emb_cached_table_stats), 136},
    {"emb_client_map", sizeof(struct emb_client_map), 24},
    {"emb_client_server_table", sizeof(struct emb_client_server_table), 256},
    {"emb_table_batch", sizeof(struct emb_table_batch), 40},
    /* Fixed value types inside the ones above: no struct_size. */
    {"emb_optim_cfg", sizeof(struct emb_optim_cfg), 40},
    {"emb_init_cfg", sizeof(struct emb_init_cfg), 12},
    {"emb_lifecycle_cfg", sizeof(struct emb_lifecycle_cfg), 32},
};

_Static_assert(offsetof(struct emb_client_opts, struct_size) == 0 &&
		   offsetof(struct emb_table_spec, struct_size) == 0 &&
		   offsetof(struct emb_cached_table_opts, struct_size) == 0 &&
		   offsetof(struct emb_client_stats, struct_size) == 0 &&
		   offsetof(struct emb_client_table_stats, struct_size) == 0 &&
		   offsetof(struct emb_cached_table_stats, struct_size) == 0 &&
		   offsetof(struct emb_client_map, struct_size) == 0 &&
		   offsetof(struct emb_client_server_table, struct_size) == 0 &&
		   offsetof(struct emb_table_batch, struct_size) == 0,
	       "struct_size opens every sized struct");

static size_t size_v0(const char *type)
{
	for (size_t i = 0; i < sizeof(structs) / sizeof(structs[0]); i++)
		if (!strcmp(structs[i].name, type))
			return structs[i].size_v0;
	return 0;
}

const char *emb_version(void)
{
	return EMBSTORE_VERSION_STRING;
}

uint32_t emb_version_number(void)
{
	return EMBSTORE_VERSION_NUMBER;
}

size_t emb_struct_size(const char *name)
{
	for (size_t i = 0; name && i < sizeof(structs) / sizeof(structs[0]);
	     i++)
		if (!strcmp(structs[i].name, name))
			return structs[i].size;
	return 0;
}

static int size_ok(uint32_t size, const char *type)
{
	size_t v0 = size_v0(type);

	if (size == 0) {
		emb__err_set(-EINVAL,
			     "struct %s: struct_size is 0 (start from its "
			     "_DEFAULT macro or _init() function, or set it "
			     "to sizeof)",
			     type);
		return -EINVAL;
	}
	if (size < v0) {
		emb__err_set(-EINVAL,
			     "struct %s: struct_size %u is below its first "
			     "published size %zu",
			     type, size, v0);
		return -EINVAL;
	}
	return 0;
}

int emb__opts_copy(void *dst, size_t dst_size, const void *src,
		   const char *type)
{
	const unsigned char *s = src;
	uint32_t size;
	int rc;

	if (!src) {
		emb__err_set(-EINVAL, "struct %s: NULL", type);
		return -EINVAL;
	}
	memcpy(&size, src, sizeof(size));
	rc = size_ok(size, type);
	if (rc)
		return rc;
	/* A newer caller's fields this library does not know must be
	 * unset: dropping a set one would change what the call means. */
	for (size_t i = dst_size; i < size; i++) {
		if (s[i]) {
			emb__err_set(-E2BIG,
				     "struct %s: struct_size %u, and byte %zu "
				     "(beyond the %zu bytes of this library, "
				     "release %s) is set",
				     type, size, i, dst_size,
				     EMBSTORE_VERSION_STRING);
			return -E2BIG;
		}
	}
	memcpy(dst, src, size < dst_size ? size : dst_size);
	if (size < dst_size)
		memset((unsigned char *)dst + size, 0, dst_size - size);
	size = (uint32_t)dst_size;
	memcpy(dst, &size, sizeof(size));
	return 0;
}

int emb__stats_check(const void *dst, const char *type)
{
	uint32_t size;

	if (!dst) {
		emb__err_set(-EINVAL, "struct %s: NULL", type);
		return -EINVAL;
	}
	memcpy(&size, dst, sizeof(size));
	return size_ok(size, type);
}

int emb__stats_copy(void *dst, const void *src, size_t src_size,
		    const char *type)
{
	uint32_t size;
	int rc = emb__stats_check(dst, type);

	if (rc)
		return rc;
	memcpy(&size, dst, sizeof(size));
	/* struct_size itself stays the caller's. */
	memcpy((unsigned char *)dst + sizeof(size),
	       (const unsigned char *)src + sizeof(size),
	       (size < src_size ? size : src_size) - sizeof(size));
	if (size > src_size)
		memset((unsigned char *)dst + src_size, 0, size - src_size);
	return 0;
}

void emb_client_opts_init(struct emb_client_opts *o)
{
	*o = EMB_CLIENT_OPTS_DEFAULT;
}

void emb_table_spec_init(struct emb_table_spec *s)
{
	*s = EMB_TABLE_SPEC_DEFAULT;
}

void emb_cached_table_opts_init(struct emb_cached_table_opts *o)
{
	*o = EMB_CACHED_TABLE_OPTS_DEFAULT;
}
