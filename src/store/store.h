/*
 * src/store/store.h - the embedding table engine: what other modules see.
 *
 * A table maps uint64 feature ids to fixed-size rows: dim weights in the
 * table's row format (fp32, fp16, bf16 or int8; common/rowfmt.h) followed by
 * the optimizer's fp32 state (common/optim.h). A full row, as iterators,
 * checkpoints, views and assign with state carry it, is
 * emb_table_row_floats() 4-byte words: emb_rowfmt_words() words of weights
 * in the table's format, then the state floats; for an fp32 table that is
 * just floats. Pulls give fp32 weights unless asked for the table's format;
 * pushes take fp32 gradients, and the optimizer computes in fp32. Row records live in slabs that
 * come from a jemalloc arena the table owns; an id index split into shards
 * finds them. Every batch operation is thread-safe: any number of threads may
 * call pull/push/assign/erase/evict/stats on one table at once. Create and
 * destroy are not: the creator destroys once no call is in flight.
 */
#ifndef EMB_STORE_STORE_H
#define EMB_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/init.h"
#include "common/lifecycle.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "common/tabledef.h"

#define EMB_SHARDS_MAX	  1024u
#define EMB_ROW_COUNT_MAX 0x7fffffffu /* access counts saturate here */

/*
 * Every table charges a fixed cost at create besides its slabs and index:
 * the table and shard structs, the jemalloc arena's own metadata (a 2 MiB
 * block, resident once touched with transparent huge pages), and this
 * much for the part of the arena's current extent that slabs do not fill
 * yet (extents grow in huge pages; measured: an empty table costs 2 MiB of
 * RSS, one row 2 MiB more). Without it a stream of CREATE_TABLE passed any
 * memory limit while charging a few KiB each.
 */
#define EMB_TABLE_TAIL_BYTES ((uint64_t)2 << 20)

/*
 * A memory budget shared by several tables (a server's --mem-limit): each
 * table charges its slab and index bytes here as well as to its own limit.
 * Updated with atomics; the owner keeps it alive longer than the tables.
 */
struct emb_mem_budget {
	uint64_t limit; /* bytes; 0 = unlimited */
	uint64_t used;	/* bytes charged now; read with __atomic_load_n */
};

struct emb_table;
struct emb_table_iter;

/*
 * Whether tables map their rows' memory asking for 2 MiB pages
 * (MADV_HUGEPAGE; default true). Rows are read at random, and huge pages
 * keep their translations in the TLB. Off: 4 KiB pages, for machines where
 * a huge page's first touch is slow, such as virtual machines whose host
 * takes back free guest memory (free page reporting hands it the free
 * 2 MiB blocks, so each new huge page faults on the host). Process-wide,
 * for extents mapped from then on; set it before creating tables.
 */
void emb_store_set_huge_pages(bool on);

/*
 * Maps bytes of memory (rounded up to 2 MiB; on 2 MiB pages unless
 * emb_store_set_huge_pages(false) came first) and faults every page in
 * now; the extents of every table, made before or after, are cut from it
 * until it is used up, and only then is fresh memory mapped. For a process
 * about to take many rows at once, such as a server that joins a job:
 * where fresh pages are slow to give (the kernel zeroes each at its first
 * write), this pays that once at start rather than during the moves. The
 * pool is process memory from then on, resident whether tables use it or
 * not; it is not charged to any table until one takes a piece. Once a
 * process: 0, -EALREADY, -EINVAL (0 bytes), -ENOMEM.
 */
int emb_store_pretouch(uint64_t bytes);

/* Bytes of the pretouched pool no table has taken yet. */
uint64_t emb_store_pretouch_left(void);

/*
 * The widest vector copies the store's loops and the common ones they call
 * (optimizer updates, the non-finite check, pull gathers, row formats, the
 * ids' hash) may take: 64 (AVX-512, the default), 32 (AVX2) or 0 (scalar),
 * never wider than the CPU has. Process-wide; for benchmarks, which measure
 * on one CPU the copies another would run (embstore-bench --simd). Set it
 * before any table is used: it is read without synchronisation.
 */
void emb_store_set_vec_max(unsigned bits);

/*
 * Extent hook: called with added = true when the table's arena maps a new
 * extent [addr, addr + len) and with added = false before it is unmapped.
 * A non-zero return from an "added" call fails the allocation that needed
 * the extent (the operation returns EMB_EARENA). Called from whichever thread
 * grows the table, with no store lock held that the hook could re-enter.
 */
typedef int (*emb_extent_fn)(void *arg, void *addr, size_t len, bool added);

struct emb_table_opts {
	const char *name; /* 1..EMB_NAME_MAX of [A-Za-z0-9_.-]; copied */
	uint32_t dim;	  /* floats per row, 1..EMB_DIM_MAX */
	struct emb_optim_cfg optim;    /* applied by push */
	struct emb_init_cfg init;      /* values of rows created by pull/push */
	uint64_t seed;		       /* with the id, decides initial values */
	uint32_t nshards;	       /* index shards, power of two <= 1024 */
	uint64_t mem_limit;	       /* bytes of rows + index + fixed cost;
					  0 = unlimited */
	struct emb_mem_budget *budget; /* shared limit, or NULL; borrowed */
	struct emb_lifecycle_cfg life; /* admission and eviction; all off by
					  default */
	bool remote_read; /* records carry a seal, so clients may READ rows
			     straight out of table memory (8 bytes a row;
			     docs/store.md, docs/rdma.md) */
	uint32_t row_format; /* enum emb_row_format: how weights are kept */
	uint32_t rounding;   /* enum emb_round: how a push's fp32 result is
				rounded into a compact row (stochastic by
				default; creation and assign round to
				nearest) */
	/* The device tier (docs/store.md, "The device tier"): a file the
	 * table makes (truncated) and removes when destroyed, holding the
	 * rows mem_limit leaves no DRAM for; NULL = none. Needs mem_limit;
	 * with remote_read, only rows in DRAM are located
	 * (emb_table_locate()). An eviction policy reaches its cold rows too
	 * (docs/store.md, "Eviction on a tiered table"). */
	const char *tier_path;
	uint64_t tier_max; /* bytes the file may grow to; 0 = no bound */
	/* What the table's CREATE asked of its server's tier (enum
	 * emb_tier_mode, and tier file bytes, 0 = the server's bound). The
	 * store does not act on them: snapshots keep them (docs/format.md),
	 * so a server that loads the table makes it as it was asked. */
	uint32_t tier_mode;
	uint64_t tier_request;
};

#define EMB_TABLE_OPTS_DEFAULT                                                 \
	((struct emb_table_opts){.name = "table",                              \
				 .dim = 8,                                     \
				 .optim = EMB_OPTIM_CFG_DEFAULT,               \
				 .init = EMB_INIT_CFG_DEFAULT,                 \
				 .seed = 0,                                    \
				 .nshards = 64,                                \
				 .mem_limit = 0,                               \
				 .budget = NULL,                               \
				 .life = EMB_LIFECYCLE_CFG_DEFAULT,            \
				 .remote_read = false,                         \
				 .row_format = EMB_ROWFMT_FP32,                \
				 .rounding = EMB_ROUND_STOCHASTIC,             \
				 .tier_path = NULL,                            \
				 .tier_max = 0,                                \
				 .tier_mode = EMB_TIER_AUTO,                   \
				 .tier_request = 0})

/* Flags for emb_table_pull() and emb_table_pull_ptrs(). */
#define EMB_PULL_NOCREATE 0x1u /* report missing ids instead of creating */
/* emb_table_pull_raw() only: whole rows, the weight words and then the
 * optimizer's state (emb_table_row_floats() words a row), as a walk hands
 * them out; an id not admitted yet gets its initial row and fresh state.
 * The copying way to whole rows, for a tiered table, which has no
 * emb_table_pull_ptrs(). */
#define EMB_PULL_STATE 0x2u
/* Missing rows are made whatever the table's admission, and no sighting
 * is counted: rows an assign will write on every copy of a replicated
 * slot (docs/replication.md, "Eviction with replicas"). */
#define EMB_PULL_ADMITTED 0x4u

/* Whether t keeps rows on a device tier (opts.tier_path). */
bool emb_table_tiered(const struct emb_table *t);

/* A tiered table's device tier; all 0 for a table without one. */
struct emb_table_tier_stats {
	uint64_t rows_cold;	 /* rows on the device (stats.rows counts
				    them too) */
	uint64_t file_bytes;	 /* the tier file's size */
	uint64_t free_bytes;	 /* of which blocks no row uses */
	uint64_t map_bytes;	 /* DRAM of the cold rows' index */
	uint64_t demoted;	 /* rows moved to the device */
	uint64_t promoted;	 /* rows brought back */
	uint64_t served_cold;	 /* pulled rows served from the device
				    without being brought back */
	uint64_t blocks_read;	 /* 4 KiB device reads */
	uint64_t blocks_written; /* 4 KiB device writes */
	uint64_t read_ns;	 /* time waiting for reads */
};

void emb_table_tier_stats(struct emb_table *t,
			  struct emb_table_tier_stats *out);

/* A table's counters (common/tabledef.h); the store leaves the server's
 * own (grads_discarded) at 0. */
struct emb_table_stats {
	EMB_TABLE_STATS(EMB_TABLE_STAT_FIELD)
};

/* Per-row lifecycle data, as kept in the row record. */
struct emb_row_meta {
	uint32_t last_step; /* table step of the last access (low 32 bits);
			       pulls count only under an eviction policy */
	uint32_t count;	    /* accesses, saturating at EMB_ROW_COUNT_MAX:
			       creation, pushes, assigns' meta, and pulls
			       under an eviction policy */
};

/*
 * Creates a table. 0 and *out on success; EMB_EBADNAME, EMB_EBADDIM,
 * EMB_EBADOPTIM, EMB_EBADINIT, EMB_EBADFORMAT (row_format, rounding),
 * EMB_EBADARG (nshards), EMB_EARENA, -ENOMEM,
 * or EMB_EMEMLIMIT when its fixed cost (EMB_TABLE_TAIL_BYTES) would pass
 * opts.mem_limit or the budget.
 */
int emb_table_create(const struct emb_table_opts *opts, struct emb_table **out);
void emb_table_destroy(struct emb_table *t); /* NULL is a no-op */

/*
 * Sets the extent hook and replays every extent mapped so far as "added"
 * (fn = NULL clears the hook after replaying nothing). If a replayed call
 * fails, the hook is cleared, earlier replays are undone with "removed" calls
 * and the error is returned. Not safe against concurrent table growth: set it
 * before the table is shared.
 */
int emb_table_set_extent_hook(struct emb_table *t, emb_extent_fn fn, void *arg);

/*
 * Remote-readable tables (opts.remote_read): what a reader needs to check a
 * record it READ out of table memory. The record of an id is rec_bytes
 * long: the 16-byte header (id first), row_floats floats, padding, and an
 * 8-byte seal at rec_bytes - 8 equal to emb_seal(seed, id, floats,
 * 4 * row_floats) (common/seal.h) while the row is live and unchanging.
 */
struct emb_table_remote {
	uint64_t seed;	     /* the table's seal seed */
	uint32_t rec_bytes;  /* bytes of one record */
	uint32_t row_floats; /* words of weights + optimizer state */
};

/* True, with *out filled, when t is remote-readable. */
bool emb_table_remote(const struct emb_table *t, struct emb_table_remote *out);

/*
 * Remote-readable tables: the address of each id's record now, or 0 where
 * the id has no row (none is created) or, in a tiered table, its row is on
 * the device (pull it instead; it may be in DRAM later). An address stays a record of this
 * table until the table is destroyed, but may be freed or reused for
 * another id at any time: a reader validates every READ by its seal. Counts
 * ids found, or EMB_EBADARG (NULL arguments, or a table without seals).
 */
int64_t emb_table_locate(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 uint64_t *addrs);

/*
 * Remote-readable tables about to go (dropped): breaks every record's seal
 * and stops sealing, so a READ through a stale location fails from now on
 * although the memory stays until the table is destroyed. Writers that run
 * later keep working, unsealed, and emb_table_remote() says false. One pass
 * over the records, under each shard's lock in turn. No-op for other
 * tables.
 */
void emb_table_unseal_all(struct emb_table *t);

const char *emb_table_name(const struct emb_table *t);
uint32_t emb_table_dim(const struct emb_table *t);
/* 4-byte words of a full row: the weights in the table's format, then
 * the optimizer's state floats (dim + state floats for fp32 tables). */
uint32_t emb_table_row_floats(const struct emb_table *t);
/* The table's enum emb_row_format. */
uint32_t emb_table_row_format(const struct emb_table *t);
/* 4-byte words of a row's weights in the table's format. */
uint32_t emb_table_weight_words(const struct emb_table *t);
/* The options the table was created with, with the lifecycle as last set;
 * name points into the table. */
void emb_table_get_opts(const struct emb_table *t, struct emb_table_opts *out);

/*
 * Sets the table's admission and eviction (common/lifecycle.h) while it
 * serves: shard by shard, each under its lock, so a batch sees a shard's
 * old policy or its new one. A changed admission filter starts empty (ids
 * pending under the old one start over); a Bloom filter is allocated whole
 * here. Eviction runs as batches pass (docs/store.md, "Admission and
 * eviction"). 0, EMB_EBADLIFE, or EMB_EMEMLIMIT / -ENOMEM with the old
 * policy kept. Any thread; calls are serialised.
 */
int emb_table_set_lifecycle(struct emb_table *t,
			    const struct emb_lifecycle_cfg *c);

/* True when the table has an admission policy (count or bloom). Any
 * thread; a policy being set may or may not be seen. */
bool emb_table_admits(const struct emb_table *t);

/*
 * Writes the row an absent id would be created with: the initializer's
 * weights, then (with_state) the fresh optimizer state, at out (dim or
 * emb_table_row_floats() floats). With state, or raw, the row is in the
 * table's format (a full row, or emb_table_weight_words() words of
 * weights) exactly as a new record would hold it; otherwise fp32 weights
 * as the record decodes to. Pure; for ids not admitted yet.
 */
void emb_table_init_row(const struct emb_table *t, uint64_t id, float *out,
			bool with_state);
void emb_table_init_row_raw(const struct emb_table *t, uint64_t id,
			    void *out);

/*
 * Gathers the weights of ids[0..n) into out[i * dim ...]. Duplicates are
 * allowed. Missing rows are created with the initializer, or with
 * EMB_PULL_NOCREATE left missing: their out rows are zero and, when found is
 * not NULL, found[i] is 0 (1 for present rows). Returns the number of ids
 * that were missing (>= 0), EMB_EBADARG (NULL buffer with n > 0) or
 * EMB_EMEMLIMIT / -ENOMEM / EMB_EARENA when a row cannot be created; on error
 * rows created before it stay and out is undefined.
 * Under admission (common/lifecycle.h) a pull that creates counts one
 * sighting of each distinct absent id; one not admitted yet gets the
 * initializer's values in out without being stored, and found[i] = 0.
 */
int emb_table_pull(struct emb_table *t, const uint64_t *ids, uint32_t n,
		   float *out, uint32_t flags, uint8_t *found);

/*
 * Like emb_table_pull(), but out gets each row's weights in the table's
 * row format, emb_table_weight_words() words a row, as the record holds
 * them (missing rows: zeros; ids not admitted: emb_table_init_row_raw()).
 * For an fp32 table the same as emb_table_pull().
 */
int emb_table_pull_raw(struct emb_table *t, const uint64_t *ids, uint32_t n,
		       void *out, uint32_t flags, uint8_t *found);

/*
 * Like emb_table_pull(), but sets ptrs[i] to the row's weights in table
 * memory (in the table's row format, emb_table_weight_words() words)
 * instead of copying (NULL for a missing id under EMB_PULL_NOCREATE).
 * For zero-copy senders: the memory stays mapped until the table is
 * destroyed, but a concurrent push may change the floats while they are
 * read, and an erase or evict may reuse the record for another id.
 * An id not admitted yet gets NULL, as a missing one does under
 * EMB_PULL_NOCREATE: emb_table_init_row() gives its values.
 */
int emb_table_pull_ptrs(struct emb_table *t, const uint64_t *ids, uint32_t n,
			const float **ptrs, uint32_t flags);

/*
 * Applies grads[i * dim ...] to ids[0..n) with the table's optimizer. The
 * gradients of duplicate ids are summed first, so each distinct id is
 * updated once. Missing rows are created first. Advances the table clock by
 * one. 0, or as for pull; rows of an id whose creation failed are untouched.
 * EMB_ENONFINITE when a gradient is NaN or infinite, or when the update
 * would make any float of a row (weights or optimizer state) NaN or
 * infinite, as finite gradients can (a huge step, a sum of repeats): the
 * push is refused whole, in every shard, and no row is changed (rows it
 * would have made are not made); emb_table_nonfinite_id() names the id.
 * Under admission, gradients of absent ids are dropped and counted
 * (pushes_unadmitted), never applied, and are no sighting: a training step
 * pulls every id it pushes, so counting both would admit every id at once.
 */
int emb_table_push(struct emb_table *t, const uint64_t *ids, uint32_t n,
		   const float *grads);

/*
 * Replicated admission (docs/replication.md, "Admission with replicas"):
 * the ids were rows on the slot's primary when the client asked, so every
 * holder creates the absent ones, admitted or not, and no holder drops a
 * gradient. Without a policy it is emb_table_push().
 */
#define EMB_PUSH_ADMITTED 0x1u

/* emb_table_push() with flags (EMB_PUSH_*; others are EMB_EBADARG). */
int emb_table_push_flags(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 const float *grads, uint32_t flags);

/*
 * Births (docs/replication.md, "Eviction with replicas"). A table that
 * numbers its rows gives each row it makes the next number of the row's
 * slot (emb_id_slot()): a row made again after an eviction or an erase
 * has a higher birth than every earlier row of its id. A slot's primary
 * tells the client its rows' births (emb_table_births()), and the client's
 * push names them to every holder (emb_table_push_births()), so that a
 * holder tells a gradient meant for its row from one meant for a row
 * since removed. Rows that existed before the table numbered its rows
 * have birth 0; births are neither checkpointed nor dumped (a restored
 * table starts numbering afresh, on every holder alike). Costs 4 bytes a
 * record and 16 KiB a table.
 */
#define EMB_BIRTH_NONE UINT32_MAX /* emb_table_births(): no such row */

/*
 * Numbers the table's rows from now on. Idempotent: 0, -ENOMEM, or
 * -EOPNOTSUPP for a tiered table (its cold rows have no record to keep a
 * birth in). Safe beside any other call on t.
 */
int emb_table_births_enable(struct emb_table *t);

/* True once emb_table_births_enable() succeeded. */
bool emb_table_has_births(const struct emb_table *t);

/*
 * births[i] = the birth of ids[i]'s row, EMB_BIRTH_NONE when t has none.
 * A table that numbers no rows gives its rows 0, which tells which ids are
 * rows (the ask before a replicated push under admission). Returns how
 * many were found, or -EOPNOTSUPP for a tiered table (its cold rows are
 * found only by a read: emb_table_pull() with EMB_PULL_NOCREATE).
 */
int emb_table_births(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     uint32_t *births);

/*
 * Gives the rows of ids the births a slot's primary gave them (a holder
 * filled with the primary's rows: a recovery, a move), raising each slot's
 * counter to at least its rows' births. Absent ids are skipped. Returns how
 * many rows were set, or EMB_EBADARG when t numbers no rows.
 */
int emb_table_births_set(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 const uint32_t *births);

/* Slot's counter: the highest birth given in it (0 while t numbers no
 * rows). */
uint32_t emb_table_slot_birth(const struct emb_table *t, uint32_t slot);

/*
 * Raises slot's counter to at least b: a backup promoted to primary raises
 * its slots past every birth its old primary may have given, so that the
 * rows it makes are newer than any of theirs.
 */
void emb_table_slot_birth_raise(struct emb_table *t, uint32_t slot,
				uint32_t b);

/*
 * For emb_table_push_births(): this server is the primary of the slots of
 * ids, which gave every birth; an absent row with a birth at or under its
 * slot's counter was removed since, and its gradient is dropped. Without
 * it (a backup) an absent row is made with the birth named: a backup
 * cannot tell a row it has not seen yet from one removed since.
 */
#define EMB_PUSH_PRIMARY 0x2u

/*
 * emb_table_push_flags() on a table that numbers its rows, births[i]
 * being the birth the slot's primary gave ids[i]'s row (repeats of an id
 * name the same). Per row:
 *   - same birth: the gradient is applied;
 *   - an older row (this holder missed its removal): the row is made
 *     again (initial weights and state), given births[i], and the gradient
 *     applied;
 *   - a newer row (removed and made again since the client asked): the
 *     gradient is dropped;
 *   - absent: made with births[i] (dropped by a primary, see
 *     EMB_PUSH_PRIMARY).
 * Dropped gradients are counted (emb_table_births_dropped()). A push
 * refused as not finite restores births too. EMB_EBADARG when t numbers
 * no rows.
 */
int emb_table_push_births(struct emb_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads,
			  const uint32_t *births, uint32_t flags);

/*
 * A primary's rows of the slots [first, first + n) as its backups check
 * theirs against (emb_table_births_prune()): marks[k] = slot first + k's
 * counter, read before the walk, then each row's id and birth, the first
 * cap of them. Returns how many rows the slots hold (call again with a
 * larger cap when over cap), or EMB_EBADARG (no births, a bad range).
 */
int emb_table_births_list(struct emb_table *t, uint32_t first, uint32_t n,
			  uint32_t *marks, uint64_t *ids, uint32_t *births,
			  uint32_t cap);

/*
 * A backup's check of its slots [first, first + n) against its primary's
 * list (emb_table_births_list(): marks, and m rows): removes each row of
 * a birth at or under its slot's mark that the primary no longer has, or
 * has only as a newer row (the push that would make it here again has not
 * come). Rows newer than the mark were made since the list, and stay.
 * The removals count as evictions (the primary's, carried out here).
 * Returns how many rows were removed, or EMB_EBADARG, -ENOMEM.
 */
int emb_table_births_prune(struct emb_table *t, uint32_t first, uint32_t n,
			   const uint32_t *marks, const uint64_t *ids,
			   const uint32_t *births, uint32_t m);

/* Gradients emb_table_push_births() dropped, their rows removed or made
 * again since the client asked (a server adds them to grads_discarded). */
uint64_t emb_table_births_dropped(const struct emb_table *t);

/*
 * The id named by the calling thread's last EMB_ENONFINITE from
 * emb_table_push() or emb_table_assign(): the first id whose gradient or
 * row was not finite, or whose update would not have been. 0 before any.
 */
uint64_t emb_table_nonfinite_id(void);
/*
 * Overwrites rows: rows[i * stride ...] holds a full row in the table's
 * format when with_state (stride = emb_table_row_floats() words), or dim
 * fp32 weights otherwise (stride = dim), rounded to nearest into the
 * table's format, with the state reset as for a new row; admission does
 * not apply (restores bring rows back whole). meta, if not
 * NULL, sets each row's lifecycle data. For a duplicated id the last wins.
 * 0, or as for pull; EMB_ENONFINITE (a float is NaN or infinite, or a
 * weight is out of the format's range) touches nothing.
 */
int emb_table_assign(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     const float *rows, bool with_state,
		     const struct emb_row_meta *meta);
/*
 * The same with each row's birth as its primary gave it (births[i];
 * EMB_BIRTH_NONE keeps the row's own), set with the row under its shard's
 * lock and raising its slot's counter: a fill's rows on a table that
 * numbers its rows (ignored on one that does not).
 */
int emb_table_assign_births(struct emb_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state,
			    const struct emb_row_meta *meta,
			    const uint32_t *births);

/*
 * True when a full row of t (emb_table_row_floats() words in the table's
 * format) holds only finite values: its decoded weights (an int8 row's
 * scale and bias too) and its state floats, Adam's step count aside. What
 * assign with state checks; loaders use it to set bad rows aside.
 */
bool emb_table_row_finite(const struct emb_table *t, const float *row);

/* Removes ids[0..n); returns how many were present (>= 0). */
int emb_table_erase(struct emb_table *t, const uint64_t *ids, uint32_t n);

/*
 * A hint that rows more rows are about to be made (a move's copy landing
 * here): each shard's index is sized for its share of them now, once,
 * rather than grown by 1.5x again and again as they come (docs/store.md,
 * "Room for a move"). A shard holding few records gets its new index at
 * once; a fuller one builds it in steps as usual, only bigger. Nothing
 * for a tiered table, a shard whose index is growing already or has the
 * room, or when the memory limit refuses the index (rows then grow it as
 * they come). Never fails: returns the shards whose index it resized or
 * began to build.
 */
uint32_t emb_table_reserve(struct emb_table *t, uint64_t rows);

/*
 * The clock a row's emb_row_meta.last_step counts in, as it is now: the
 * table step, or a tiered table's batch clock (docs/store.md, "The device
 * tier"). A row's idle time is now minus its last_step, modulo 2^32: what
 * a row keeps when it moves to another table (a fill's EMB_F_META).
 */
uint32_t emb_table_now(const struct emb_table *t);

/*
 * Holds the rows of some slots back from every eviction (the policy's
 * hands and emb_table_evict()): slot k is held while bit k % 64 of
 * set[k / 64] is set (EMB_NSLOTS / 64 words, copied); NULL holds none.
 * A server holds the slots another server also writes, where its own
 * eviction would leave the two copies different (docs/replication.md,
 * "Eviction with one copy"). Any thread; batches see it from their next
 * shard group on.
 */
void emb_table_evict_hold(struct emb_table *t, const uint64_t *set);

/*
 * The slots this holder is the primary of (set as emb_table_evict_hold()
 * takes it; NULL: none): emb_table_push_births() treats the ids of those
 * slots as with EMB_PUSH_PRIMARY, whatever its flags. A replicated server
 * sets them from each map (docs/replication.md, "Eviction with
 * replicas"): a push naming the birth of a row the primary evicted since
 * is dropped there, and does not make the row again from its initial
 * values while its backups still hold it as it was. Any thread.
 */
void emb_table_lead(struct emb_table *t, const uint64_t *set);

/*
 * Removes rows not accessed in the last max_idle_steps table steps (0: no age
 * limit) or accessed fewer than min_count times (0: no count limit). Returns
 * how many rows were removed (>= 0). Pulls are accesses only while the table
 * has an eviction policy (struct emb_row_meta); without one, this goes by
 * creation and writes. On a tiered table it reaches the cold rows too: by
 * idle steps without reading them but for the blocks it empties (late by up
 * to max_idle_steps / 8), by min_count reading every cold block; a device
 * read error is returned (negative) after the other shards were done.
 */
int64_t emb_table_evict(struct emb_table *t, uint32_t max_idle_steps,
			uint32_t min_count);

void emb_table_stats(struct emb_table *t, struct emb_table_stats *out);

/*
 * Iterates over all rows, shard by shard, copying under the shard's lock.
 * Rows added or removed meanwhile may or may not be seen; a row seen is
 * copied whole (never torn by a concurrent push). 0 and *out, or -ENOMEM.
 */
int emb_table_iter_create(struct emb_table *t, struct emb_table_iter **out);
void emb_table_iter_destroy(struct emb_table_iter *it); /* NULL is a no-op */

/*
 * Copies up to max rows: ids[k], full rows (weights + state) at
 * rows[k * emb_table_row_floats() ...] unless rows is NULL (ids only), and
 * meta[k] if meta is not NULL. Returns how many (0 at the end), or
 * EMB_EBADARG (ids NULL).
 */
/*
 * The same with each row's birth in births[k] (0 for a table that numbers
 * no rows, and for a tiered table's rows), read with the row: what a fill
 * sends so that its target's rows keep their primary's births.
 */
int emb_table_iter_next_births(struct emb_table_iter *it, uint64_t *ids,
			       float *rows, struct emb_row_meta *meta,
			       uint32_t *births, uint32_t max);
int emb_table_iter_next(struct emb_table_iter *it, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max);

/*
 * From now on, emb_table_iter_next() yields only rows whose id falls in
 * the slots [first, first + n) (emb_id_slot()): a move streams a chunk of
 * slots, and the rows outside it are then skipped by the slot the store
 * keeps for each record, without reading the records. That array (2 bytes
 * a row, charged to the table) is made by the table's first such call, in
 * one pass over the records, and kept from then on. 0, EMB_EBADARG (n 0,
 * or a range past EMB_NSLOTS), or -ENOMEM / EMB_EMEMLIMIT.
 */
int emb_table_iter_slots(struct emb_table_iter *it, uint32_t first,
			 uint32_t n);
/*
 * Makes the slot index emb_table_iter_slots() makes at its first call,
 * now. Made while a table is empty, it costs nothing: each row then sets
 * its entry as it is made. A server that may give slots away makes it for
 * each table it creates, so that no move waits for the pass over the
 * table's records (docs/store.md, "The slot index"). 0, EMB_EBADARG, or
 * -ENOMEM / EMB_EMEMLIMIT.
 */
int emb_table_slot_index(struct emb_table *t);

/*
 * The same for any set of slots: slot k is yielded when bit k % 64 of
 * set[k / 64] is set (EMB_NSLOTS / 64 words, copied). The sweep of the
 * slots a server gave away walks them so. 0, or as emb_table_iter_slots().
 */
int emb_table_iter_slot_set(struct emb_table_iter *it, const uint64_t *set);

/*
 * A live move copies a chunk of slots ahead of its fence, then sends
 * under the fence only what changed meanwhile (docs/replication.md,
 * "Moving slots"). From emb_table_track_begin() on, every row written or
 * made is marked (as a delta checkpoint's marks, but apart from them),
 * and removals of rows in the slots [first, first + n) are counted;
 * emb_table_track_end() stops it. One tracking per table at a time: a
 * begin replaces the last. 0, EMB_EBADARG or -ENOMEM.
 */
int emb_table_track_begin(struct emb_table *t, uint32_t first, uint32_t n);
void emb_table_track_end(struct emb_table *t); /* NULL is a no-op */
/* Rows of the tracked slots removed since the begin, or UINT64_MAX when
 * the table is not tracked. */
uint64_t emb_table_track_removed(struct emb_table *t);
/* From now on, emb_table_iter_next() yields only rows marked since the
 * table's emb_table_track_begin() (none once it ended). 0 or EMB_EBADARG. */
int emb_table_iter_tracked(struct emb_table_iter *it);
/*
 * The same, and the marks it yields are taken: on entering each shard the
 * walk takes the shard's marks and leaves it with none, so a row written
 * after that is marked again (and yielded by the next such walk, or by
 * the fenced one). A copy ahead walks so once or twice more before its
 * fence, so that the fence has only what changed during the last walk to
 * send. 0, EMB_EBADARG, or -EOPNOTSUPP for a tiered table (its cold rows
 * keep marks of their own).
 */
int emb_table_iter_tracked_take(struct emb_table_iter *it);
/*
 * How many records of the slots [first, first + n) are marked now (rows a
 * tracked walk would yield, free records not told apart): what a copy
 * ahead weighs before another taking walk. Reads the marks and the
 * records' slots (emb_table_iter_slots() built them), not the rows. 0 when
 * the table is not tracked.
 */
uint64_t emb_table_track_count(struct emb_table *t, uint32_t first,
			       uint32_t n);

/* ---- point-in-time views (view.c) ---- */

/*
 * A view reads every row of a table as it was at one instant, between two
 * write batches (push, assign, erase), while writes go on: a row is saved
 * before its first write after the instant, until the view has read it.
 * Taking the view holds writers back for a moment (emb_table_view_pause_ns).
 * Weights and optimizer state are those of the instant; lifecycle meta may
 * be newer (pulls are not held back). One view per table at a time.
 */
struct emb_table_view;

/* 0 and *out, EMB_EBADARG, -EBUSY (a view exists) or -ENOMEM. */
int emb_table_view_create(struct emb_table *t, struct emb_table_view **out);
/* The table's step (push batches applied) and rows at the instant, and
 * how long writers were held back. */
uint64_t emb_table_view_step(const struct emb_table_view *v);
uint64_t emb_table_view_rows(const struct emb_table_view *v);
uint64_t emb_table_view_pause_ns(const struct emb_table_view *v);
/*
 * Copies up to max rows of the view like emb_table_iter_next(). Returns
 * how many (0 at the end), EMB_EBADARG, or EMB_EMEMLIMIT when saving rows
 * for the view did not fit the table's memory limit (the view is then
 * incomplete: destroy it).
 */
int emb_table_view_next(struct emb_table_view *v, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max);
void emb_table_view_destroy(struct emb_table_view *v); /* NULL: no-op */

/* ---- incremental checkpoints (ckpt.c) ---- */

/*
 * A table remembers which rows were written (pushed, assigned, created)
 * and which ids were removed since the last checkpoint walk. A walk copies
 * rows like the iterator and clears their marks, so consecutive walks
 * give a full image and then deltas: the rows changed since, written
 * whole, and the ids removed since. At most one walk per table at a time.
 */
struct emb_table_ckpt;

/*
 * Starts a walk over every row (delta false) or over the rows changed
 * since the last walk (delta true), and takes the removed ids. 0 and *out,
 * EMB_EBADARG, -ENOMEM, or EMB_EDELTALOST (delta only: more removals came
 * than the table keeps, so only a full walk is right now; nothing was
 * started and the marks are intact).
 */
int emb_table_ckpt_begin(struct emb_table *t, bool delta,
			 struct emb_table_ckpt **out);

/*
 * The ids removed since the last walk (delta walks; 0 for full ones):
 * *ids points into c until end. A delta applies them before its rows.
 */
uint64_t emb_table_ckpt_erased(const struct emb_table_ckpt *c,
			       const uint64_t **ids);

/* Copies up to max rows as emb_table_iter_next() and clears their marks.
 * Returns how many (0 at the end) or EMB_EBADARG. */
int emb_table_ckpt_next(struct emb_table_ckpt *c, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max);

/*
 * Ends the walk. A walk whose rows did not reach durable storage loses
 * the changes it took: the caller's next walk must be full.
 */
void emb_table_ckpt_end(struct emb_table_ckpt *c); /* NULL is a no-op */

#endif
