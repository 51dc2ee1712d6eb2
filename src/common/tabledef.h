/*
 * src/common/tabledef.h - what a table is, as every module and the public API
 * see it: the limits on names and dims, the row formats, the training modes,
 * and the list of a table's counters.
 *
 * Installed: embstore.h inlines the body (includes libc's only).
 */
#ifndef EMB_COMMON_TABLEDEF_H
#define EMB_COMMON_TABLEDEF_H

#include <stdint.h>

#define EMB_DIM_MAX  4096u /* floats per row, at most */
#define EMB_NAME_MAX 63u   /* bytes of a table name, without the NUL */

/*
 * How a table keeps each row's weights (common/rowfmt.h has the layouts).
 * The optimizer always computes in fp32 and its state stays fp32.
 */
enum emb_row_format {
	EMB_ROWFMT_FP32 = 0, /* 4 bytes a weight (the default) */
	EMB_ROWFMT_FP16 = 1, /* IEEE half: 2 bytes */
	EMB_ROWFMT_BF16 = 2, /* bfloat16: 2 bytes, fp32's range */
	EMB_ROWFMT_INT8 = 3, /* 1 byte, with an f32 scale and bias per row */
};
#define EMB_ROWFMT_COUNT 4u

/*
 * Whether a table keeps the rows its server's memory limit leaves out on
 * the server's device tier (docs/store.md, "The device tier"), as its
 * CREATE asks: each server's own setting (--tier-dir), never, or always
 * (a server without a tier then refuses the table, EMB_ENOTIER).
 */
enum emb_tier_mode {
	EMB_TIER_AUTO = 0, /* tiered where the server has --tier-dir */
	EMB_TIER_OFF = 1,  /* all rows in DRAM, as on a server without one */
	EMB_TIER_ON = 2,   /* tiered, or refused */
};
#define EMB_TIER_MODE_COUNT 3u

/* "auto", "off", "on"; "?" for an unknown mode. */
const char *emb_tier_mode_name(uint32_t m);
/* Parses one of those names; 0 and *out, or EMB_EBADARG. */
int emb_tier_mode_parse(const char *s, uint32_t *out);

/* "fp32", "fp16", "bf16", "int8"; "?" for an unknown format. */
const char *emb_rowfmt_name(uint32_t f);
/* Parses one of those names (also "float32", "float16", "bfloat16");
 * 0 and *out, or EMB_EBADARG. */
int emb_rowfmt_parse(const char *s, uint32_t *out);

/* How a push's fp32 result is rounded into a compact row. */
enum emb_round {
	EMB_ROUND_STOCHASTIC = 0, /* stochastic, seeded by table seed, id and
				     the row's update count: replicas and
				     reruns round alike (the default) */
	EMB_ROUND_NEAREST = 1,	  /* to nearest, ties to even */
};

/* Training modes of a table (SET_MODE). */
enum emb_mode {
	EMB_MODE_ASYNC = 0, /* each push is applied on arrival */
	EMB_MODE_SYNC = 1,  /* a step's pushes are averaged and applied once
			       every worker has sent its part */
	EMB_MODE_STALE = 2, /* pushes more than K steps behind the newest are
			       discarded (bounded staleness) */
};

/*
 * The counters of a table, once for every struct that carries them (store,
 * STATS messages, the client's sums and per-server rows, /metrics). The
 * order is the STATS wire order: a new counter goes at the end, and a peer
 * that sends fewer leaves the rest 0. X(name, what it counts).
 */
#define EMB_TABLE_STATS(X)                                                     \
	X(rows, "live rows")                                                   \
	X(bytes, "bytes the table holds: slabs, index and fixed parts")        \
	X(slab_bytes, "bytes of slabs (row records, live or free)")            \
	X(index_bytes, "bytes of the id index")                                \
	X(row_bytes, "bytes of one row record")                                \
	X(pulls, "pull requests served")                                       \
	X(pushes, "push requests applied")                                     \
	X(rows_pulled, "ids served by pull, duplicates counted")               \
	X(rows_pushed, "distinct ids updated by push")                         \
	X(rows_created, "rows made by the initializer")                        \
	X(rows_erased, "rows removed by erase")                                \
	X(rows_evicted, "rows removed by eviction")                            \
	X(misses, "no-create pulls of an absent id")                           \
	X(step, "the table clock: push batches applied")                       \
	X(extents, "arena extents mapped now")                                 \
	X(grads_discarded, "pushed rows dropped as too stale (server's)")      \
	X(pulls_unadmitted, "pulled ids not admitted yet (initializer sent)")  \
	X(pushes_unadmitted, "pushed ids dropped: not admitted yet")           \
	X(admit_filter_bytes, "bytes of the admission filter")                 \
	X(rows_evicted_ttl, "rows evicted as idle for ttl steps")              \
	X(rows_evicted_l2, "rows evicted for an L2 norm under min_l2")         \
	X(rows_evicted_cap, "rows evicted to stay under max_rows")             \
	X(rows_nonfinite, "rows with a NaN or Inf set aside when loaded")      \
	X(rows_cold, "rows on the device tier")                                \
	X(tier_bytes, "bytes of the device tier's file")                       \
	X(tier_reads, "4 KiB blocks the device tier read")                     \
	X(tier_writes, "4 KiB blocks the device tier wrote")                   \
	X(tier_read_us, "microseconds spent waiting on device tier reads")

/* One uint64_t member per counter, for struct bodies. */
#define EMB_TABLE_STAT_FIELD(name, what) uint64_t name;
/* How many counters the list has. */
#define EMB__TABLE_STAT_ONE(name, what) +1
#define EMB_TABLE_NSTATS		(0 EMB_TABLE_STATS(EMB__TABLE_STAT_ONE))

#endif
