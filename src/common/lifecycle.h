/*
 * src/common/lifecycle.h - a table's row lifecycle: when an id becomes a row
 * (admission) and when a row goes away again (eviction).
 *
 * Shared by the store (which applies it), the wire codecs (CREATE_TABLE and
 * SET_LIFECYCLE carry it) and the client options. Pure and thread-safe.
 * Installed: embstore.h inlines the body (libc includes only).
 */
#ifndef EMB_COMMON_LIFECYCLE_H
#define EMB_COMMON_LIFECYCLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Admission: how an id earns a row. */
enum emb_admit_kind {
	EMB_ADMIT_NONE = 0,  /* every first touch creates the row */
	EMB_ADMIT_COUNT = 1, /* exact per-id counters (DeepRec's counter
				filter) */
	EMB_ADMIT_BLOOM = 2, /* counting Bloom filter of bounded size */
};

/* Which rows max_rows evicts first. */
enum emb_evict_order {
	EMB_EVICT_LRU = 0, /* the least recently pulled or pushed */
	EMB_EVICT_LFU = 1, /* the least often pulled or pushed */
};

#define EMB_ADMIT_COUNT_MAX   65535u		   /* count:N, N at most */
#define EMB_ADMIT_BLOOM_MAX   255u		   /* bloom:N: 8-bit counters */
#define EMB_BLOOM_BYTES_DEF   ((uint32_t)16 << 20) /* bloom:N alone */
#define EMB_BLOOM_BYTES_MIN   ((uint32_t)64 << 10)
#define EMB_BLOOM_BYTES_MAX   ((uint32_t)1 << 31)
#define EMB_LIFECYCLE_STR_MAX 96u /* emb_lifecycle_format() needs at most */

struct emb_lifecycle_cfg {
	uint32_t admit;	      /* enum emb_admit_kind */
	uint32_t admit_n;     /* sightings that make a row; >= 2 unless NONE */
	uint32_t bloom_bytes; /* BLOOM: counters (one byte each) over all
				 shards; 0 = EMB_BLOOM_BYTES_DEF */
	uint32_t ttl_steps;   /* evict rows idle this many table steps;
				 0 = off */
	float min_l2;	      /* evict rows whose weights' L2 norm is below;
				 0 = off */
	uint32_t order;	      /* enum emb_evict_order, for max_rows */
	uint64_t max_rows;    /* evict down to this many rows; 0 = off */
};

#define EMB_LIFECYCLE_CFG_DEFAULT ((struct emb_lifecycle_cfg){0})

/*
 * 0, or EMB_EBADLIFE: unknown admission kind or order, admit_n out of range
 * (2..EMB_ADMIT_COUNT_MAX, ..EMB_ADMIT_BLOOM_MAX for bloom; 0 without
 * admission), bloom_bytes outside EMB_BLOOM_BYTES_MIN..MAX (or set without
 * bloom), min_l2 negative or not finite.
 */
int emb_lifecycle_validate(const struct emb_lifecycle_cfg *c);

/*
 * Parses an admission spec into c's admission fields: "none", "count:N",
 * "bloom:N" or "bloom:N:BYTES" (BYTES may end in k, m or g, powers of 1024).
 * 0, or EMB_EBADLIFE (c untouched).
 */
int emb_admit_parse(const char *s, struct emb_lifecycle_cfg *c);

/*
 * Parses an eviction spec into c's eviction fields: "none", or terms joined
 * by commas: "ttl:STEPS", "min_l2:X", "max_rows:N" or "max_rows:N:lru|lfu"
 * (lru by default). Each term at most once. 0, or EMB_EBADLIFE (c untouched).
 */
int emb_evict_parse(const char *s, struct emb_lifecycle_cfg *c);

/* Writes the admission ("count:2") and eviction ("ttl:1000,max_rows:5:lfu")
 * specs that parse back to c; "none" when off. */
void emb_admit_format(const struct emb_lifecycle_cfg *c, char *buf, size_t cap);
void emb_evict_format(const struct emb_lifecycle_cfg *c, char *buf, size_t cap);

/* True when c admits every id and evicts nothing. */
bool emb_lifecycle_is_off(const struct emb_lifecycle_cfg *c);

/* True when c has an eviction term (ttl, min_l2 or max_rows). */
bool emb_lifecycle_evicts(const struct emb_lifecycle_cfg *c);

#endif
