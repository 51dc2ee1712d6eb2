/*
 * src/store/store_int.h - the store's own types: arena, shard, row records.
 * Only the store's own .c files include this.
 *
 * Calls between the store's files run one way, so that no file calls a
 * file that calls it back (a file that needs to reach up takes a function
 * pointer, as the arena's extent hook does):
 *
 *   chain.c -> snapshot.c -> ckpt.c, table.c
 *   table.c -> lifecycle.c -> shard.c -> dirty.c, view.c, arena.c
 *   table.c -> lifecycle.c -> tier.c -> shard.c, dirty.c (eviction of a
 *   tiered table's cold rows); table.c -> tier.c
 *   ckpt.c -> shard.c;  table.c -> view.c, shard.c, arena.c
 *   mem.c (memory charges) and scratch.c (per-thread buffers) are leaves
 *   every level may call; dirty.c, arena.c and mem.c call no store file.
 */
#ifndef EMB_STORE_STORE_INT_H
#define EMB_STORE_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/hash.h"
#include "common/lifecycle.h"
#include "common/seal.h"
#include "store/store.h"

/*
 * A row record in a slab:
 *
 *   OFFSET  SIZE            MEANING
 *   0       8               feature id
 *   8       4               last_step: table step of last access (live);
 *                           next free record index + 1, 0 = none (free)
 *   12      4               bit 31: record is free; bits 0..30: access count
 *   16      4 * row_floats  dim weights in the table's row format
 *                           (4 * wwords bytes, common/rowfmt.h), then
 *                           the optimizer's fp32 state
 *   ...     0..4            padding to a multiple of 8
 *   ...     8               remote-readable tables only (opts.remote_read):
 *                           the seal, emb_seal(seal_seed, id, floats);
 *                           its complement while the record is free
 */
struct emb_row_hdr {
	uint64_t id;	    /* feature id */
	uint32_t last_step; /* see the table above */
	uint32_t count;	    /* see the table above */
};

#define EMB_ROW_HDR_SIZE 16u
#define EMB_ROW_FREE	 0x80000000u

_Static_assert(sizeof(struct emb_row_hdr) == EMB_ROW_HDR_SIZE, "row header");

static inline float *emb__row_data(struct emb_row_hdr *r)
{
	return (float *)(void *)((char *)r + EMB_ROW_HDR_SIZE);
}

/* ---- scratch.c: per-thread buffers a batch call reuses ---- */

/* One buffer per use: a call takes each slot at most once at a time. */
enum {
	EMB_SCRATCH_BATCH, /* hashes and shard groups (table.c) */
	EMB_SCRATCH_DEDUP, /* push: the set of hashes seen (repeat check) */
	EMB_SCRATCH_UNIQ,  /* push: repeats' positions and their sum rows */
	EMB_SCRATCH_SUMS,  /* push: summed gradients of repeated ids */
	EMB_SCRATCH_ADMIT, /* pull: ids sighted by admission in this call */
	EMB_SCRATCH_UNDO,  /* push: rows as they were, until its verdict */
	EMB_SCRATCH_ROW,   /* push, assign: one fp32 row of a compact table */
	EMB_SCRATCH_NSLOTS
};

/*
 * At least bytes of the calling thread's buffer for slot, kept for the
 * thread's next calls (grown on demand, freed when the thread exits), or
 * NULL when memory is out. Contents are undefined. Pass it to
 * emb__scratch_done() when the call ends.
 */
void *emb__scratch(unsigned slot, size_t bytes);
/* Ends a call's use of p (from emb__scratch; NULL is fine). */
void emb__scratch_done(void *p);

/* ---- table.c ---- */

/*
 * The widest vector copy a pull uses for a row: 64 (AVX-512), 32 (AVX2)
 * or 0 (memcpy), and never wider than the CPU has. Only tests lower it,
 * to run the narrower copies on a machine that has the wider ones.
 */
extern unsigned emb__pull_vec_max;

/* Counts n rows a load set aside as not finite (stats rows_nonfinite). */
void emb__table_count_nonfinite(struct emb_table *t, uint64_t n);

/* ---- arena.c: one jemalloc arena over extents the store maps itself ---- */

struct emb_arena;

/* 0 and *out, or EMB_EARENA / -ENOMEM. */
int emb__arena_create(struct emb_arena **out);
/* Destroys the jemalloc arena, then reports and unmaps every extent. */
void emb__arena_destroy(struct emb_arena *a);
/* n bytes from the arena without the thread cache; NULL on failure. */
void *emb__arena_alloc(struct emb_arena *a, size_t n);
void emb__arena_free(struct emb_arena *a, void *p);
/* The usable size jemalloc would give a request of n bytes. */
size_t emb__arena_size_class(size_t n);
int emb__arena_set_hook(struct emb_arena *a, emb_extent_fn fn, void *arg);
/* Extents mapped now, and their total bytes. */
void emb__arena_usage(struct emb_arena *a, uint64_t *extents, uint64_t *bytes);
/* With no shard lock held, after a batch that made rows: asks the arena's
 * helper thread to map and fault in its next extent ahead when it is
 * growing by whole steps and has none ready (arena.c, "The spare"). */
void emb__arena_prepare(struct emb_arena *a);
/* Tests: waits until no spare is asked for or being made. */
void emb__arena_settle(struct emb_arena *a);
/* Tests: whether a spare is ready, and where. */
bool emb__arena_spare(struct emb_arena *a, void **addr, size_t *len);
/* Tests: whether the arena asks the next batch for a spare. */
bool emb__arena_wants_spare(struct emb_arena *a);
/* Tests: called where the spare is made (the helper thread, or the batch
 * in a forked process) once the making is claimed, before it is mapped,
 * with no lock held (NULL: nothing). */
extern void (*emb__arena_while_preparing)(struct emb_arena *a);

/* ---- shard.c: index + slabs of one shard; caller holds shard->lock ---- */

/*
 * Linear-probing index over 32-bit slots: 0 is empty, otherwise the top 8
 * bits are a tag from the id hash and the low 24 bits a record index + 1.
 * A probe touches the row only when the tag matches (1 in 256 otherwise).
 */
#define EMB_SLOT_IDX_BITS  24u
#define EMB_SLOT_IDX_MASK  ((1u << EMB_SLOT_IDX_BITS) - 1)
#define EMB_SHARD_ROWS_MAX (EMB_SLOT_IDX_MASK - 1u)

struct emb_shard {
	pthread_mutex_t lock; /* guards everything below */
	uint32_t waiting;     /* atomic: threads a batch found the lock held
				 for, until they have it (table.c, "Bulk
				 work and the shard locks") */
	uint32_t *slots;      /* index, nslots entries */
	uint32_t nslots;      /* any size >= 8; positions via fastrange */
	uint32_t used;	      /* occupied slots == live rows */
	uint32_t held;	      /* of those, rows of slots held back from
				 eviction (emb_table_evict_hold()): not
				 counted against max_rows; read through
				 emb__shard_held() */
	uint32_t held_gen;    /* the table's evict_hold_gen held was
				 counted by */
	uint32_t grow_at;     /* resize when used reaches this */
	/* The index of the next size, built a few records per row made
	 * (shard.c, "Growing the index"): slots stays the index every
	 * lookup reads until next_slots has every record, then replaces
	 * it. next_slots is NULL between builds. */
	uint32_t build_at;    /* start the next build when used reaches this */
	uint32_t *next_slots; /* being built, next_nslots entries */
	uint32_t next_nslots;
	uint32_t built;	      /* records [0, built) are in next_slots */
	uint32_t build_rows;  /* rows made since the last step of the build */
	uint32_t touched;     /* pages of next_slots written so far */
	uint32_t next_idx;    /* records ever handed out (high water) */
	uint32_t free_head;   /* first free record index + 1, 0 = none */
	uint32_t nslabs;      /* slabs in use */
	uint32_t slabs_cap;   /* room in slabs[] */
	bool tier_pinned;     /* a walk is inside this tiered shard: it
				 demotes nothing, so its slabs grow past
				 the limit (tier.c, walks) */
	uint32_t tier_force_slabs; /* slabs it may add past the limit, for
				 a group demotion could not make room
				 for (tier.c, short_of) */
	char **slabs;	      /* slab base addresses */
	/* Incremental checkpoints (dirty.c, read by ckpt.c): what changed
	 * since the last checkpoint walk took this shard. */
	uint64_t *dirty;      /* bit per record index: written since */
	uint32_t dirty_words; /* words in dirty, covers every slab record */
	uint32_t nerased;     /* ids in erased */
	uint32_t erased_cap;  /* room in erased */
	bool erased_lost;     /* a removal was not recorded: no delta */
	uint64_t *erased;     /* ids removed since */
	/* The virtual slot (emb_id_slot()) of each record's id, so that a
	 * walk over some slots (a move's stream, the sweep of slots given
	 * away) skips the others by 2 bytes a record instead of reading
	 * each record's header. NULL until the table's first such walk
	 * builds it (emb__slot_index(): a pass over the headers, a step of
	 * VSLOT_STEP records per hold of the shard's lock); from then on
	 * kept as records are handed out. vslot_cap entries. The records
	 * [vslot_built, vslot_end) were made before vslot was and still
	 * wait for their entry; records made or reused since set their own.
	 * Read it only when emb__vslot_ready(). */
	uint16_t *vslot;
	uint32_t vslot_cap;
	uint32_t vslot_built, vslot_end;
	/* Births (birth.c, emb_table_births_enable()): the number each
	 * record's row was given when made, birth_cap entries; NULL while
	 * the table numbers no rows. */
	uint32_t *birth;
	uint32_t birth_cap;
	/* A live move's copy ahead of its fence (emb_table_track_begin()):
	 * the records written since it began, and how many rows of its
	 * slots were removed. NULL when no move tracks this table. */
	uint64_t *track;	 /* bit per record index, dirty_words words */
	uint32_t track_first;	 /* slots whose removals count */
	uint32_t track_n;
	uint64_t track_removed;	 /* rows of those slots removed since */
	struct emb_view_shard *view; /* a point-in-time view's state, or
					NULL (view.c) */
} __attribute__((aligned(64)));

/*
 * The counters every pull or push batch adds to, and the writers a view
 * waits for, one copy per stripe on a cache line of its own: a thread
 * always uses the same stripe (emb__stripe(), handed out round robin), so
 * batches of different threads (a server's loops) write no line in
 * common. Stats and views sum the stripes. Atomics still, since more
 * threads than stripes may share one.
 */
#define EMB_TABLE_STRIPES 16u

struct emb_table_stripe {
	uint64_t pulls;		    /* pull batches */
	uint64_t pushes;	    /* push batches */
	uint64_t rows_pulled;	    /* ids served by pull */
	uint64_t rows_pushed;	    /* distinct ids updated by push */
	uint64_t rows_created;	    /* rows made by the initializer */
	uint64_t misses;	    /* no-create pulls of an absent id */
	uint64_t pulls_unadmitted;  /* pulled ids not admitted yet */
	uint64_t pushes_unadmitted; /* pushed ids dropped: not admitted */
	uint32_t writers;	    /* push/assign/erase batches in progress */
} __attribute__((aligned(64)));

/* The calling thread's stripe of any table (scratch.c). */
unsigned emb__stripe(void);

struct emb_table {
	char name[EMB_NAME_MAX + 1]; /* NUL-terminated */
	struct emb_table_opts opts;  /* as created; opts.name points at name */
	uint32_t dim;		     /* weights per row */
	uint32_t fmt;		     /* enum emb_row_format of the weights */
	uint32_t wwords;	     /* 4-byte words of the weights */
	uint32_t row_floats;	     /* wwords + optimizer state floats */
	uint32_t row_bytes;	     /* record size, multiple of 8 */
	uint32_t prefetch_lines;     /* cache lines of a row a pull reads */
	uint32_t rows_per_slab;	     /* records in one slab */
	uint64_t slab_div;	 /* emb__slab_div(rows_per_slab) */
	size_t slab_bytes;	 /* bytes requested per slab */
	size_t slab_alloc_bytes; /* bytes jemalloc really gives per slab */
	uint32_t nshards;	 /* power of two */
	uint32_t shard_mask;	 /* nshards - 1 */
	struct emb_shard *shards; /* nshards, cache-line aligned */
	struct emb_arena *arena;  /* owns the slabs */

	/* Counters written only when rows are made or freed, or by pushes,
	 * with relaxed atomics once per batch. */
	uint64_t mem_used;     /* slab + index + fixed bytes charged */
	uint64_t fixed_bytes;  /* charged at create: see EMB_TABLE_TAIL_BYTES */
	uint64_t rows;	       /* live rows */
	uint64_t step;	       /* push batches applied: the table's clock */
	uint64_t rows_erased;  /* rows removed by erase */
	uint64_t rows_evicted; /* rows removed by evict */
	/* What every batch counts, one copy per stripe (see above). */
	struct emb_table_stripe stripe[EMB_TABLE_STRIPES];

	/* Admission and eviction (lifecycle.c). */
	pthread_mutex_t life_lock;   /* serialises emb_table_set_lifecycle */
	uint32_t admits; /* opts.life.admit, for readers without life_lock
			    (atomic) */
	struct emb_life_shard *life; /* nshards, or NULL while never set;
					load with acquire */
	uint64_t rows_evicted_ttl;   /* by ttl */
	uint64_t rows_evicted_l2;    /* by min_l2 */
	uint64_t rows_evicted_cap;   /* by max_rows */
	uint64_t rows_nonfinite;     /* loaded rows set aside: not finite */
	/* Slots whose rows no eviction removes (emb_table_evict_hold()): a
	 * bit per slot, read and written with relaxed atomics; hold_any
	 * is false while no bit is set, so tables never held pay one test. */
	uint64_t evict_hold[EMB_NSLOTS / 64];
	bool evict_hold_any;
	/* Bumped (release) after each change of evict_hold: a shard whose
	 * held_gen differs counts its held rows again when eviction next
	 * needs them (emb__shard_held()). */
	uint32_t evict_hold_gen;
	/* Slots this holder is the primary of (emb_table_lead()), the same
	 * way: a push naming births drops the gradient of an absent row
	 * there, as with EMB_PUSH_PRIMARY. */
	uint64_t lead[EMB_NSLOTS / 64];

	/* Point-in-time views (view.c): batches that write rows count
	 * themselves in their stripe's writers and wait while fence is up. */
	uint32_t fence; /* a view is being taken: writers wait */
	bool viewed;	  /* a view exists (one at a time) */

	/* Remote-readable tables (opts.remote_read): every record ends in a
	 * seal that writers renew after each change (common/seal.h). */
	bool sealed;	    /* records carry a seal */
	uint64_t seal_seed; /* random per table: a stale location that now
			       points into another table never validates */

	/* Births (birth.c): per slot, the highest birth its rows were
	 * given (atomics: a slot's ids lie in every shard); EMB_NSLOTS
	 * counters, or NULL before emb_table_births_enable(). */
	uint32_t *slot_birth;
	bool births_on;		 /* every shard has its births (acquire) */
	uint64_t births_dropped; /* emb_table_births_dropped() (atomic) */

	/* The device tier (tier.c), or NULL. */
	struct emb_tier *tier;
	/* What view.c asks of tier.c, which it may not call (it is below
	 * it: store_int.h's order; a call through a pointer goes up). Set
	 * with tier. */
	const struct emb_tier_view_ops *tier_view;
};

/* True when no eviction may remove the row of id (its slot is held). */
static inline bool emb__evict_held(const struct emb_table *t, uint64_t id)
{
	uint32_t sl;

	if (!__atomic_load_n(&t->evict_hold_any, __ATOMIC_RELAXED))
		return false;
	sl = emb_id_slot(id);
	return (__atomic_load_n(&t->evict_hold[sl / 64], __ATOMIC_RELAXED) >>
		(sl % 64)) & 1;
}

static inline struct emb_table_stripe *emb__my_stripe(struct emb_table *t)
{
	return &t->stripe[emb__stripe()];
}

/*
 * Remote-readable tables: stores record r's seal xor mask, the seal over
 * its id and floats (caller holds the shard lock, the change is complete).
 * A no-op for other tables. mask 0 renews the seal after a change; ~0
 * breaks it as the record is freed, so a reader holding the old location
 * falls back (shard.c's remove).
 */
static inline void emb__row_seal_mask(const struct emb_table *t,
				      struct emb_row_hdr *r, uint64_t mask)
{
	uint64_t v;

	if (!__atomic_load_n(&t->sealed, __ATOMIC_RELAXED))
		return;
	v = emb_seal(t->seal_seed, r->id, (const char *)r + EMB_ROW_HDR_SIZE,
		     (size_t)t->row_floats * sizeof(float));
	__atomic_store_n((uint64_t *)(void *)((char *)r + t->row_bytes - 8),
			 v ^ mask, __ATOMIC_RELEASE);
}

static inline void emb__row_seal(const struct emb_table *t,
				 struct emb_row_hdr *r)
{
	emb__row_seal_mask(t, r, 0);
}

static inline void emb__row_unseal(const struct emb_table *t,
				   struct emb_row_hdr *r)
{
	emb__row_seal_mask(t, r, ~(uint64_t)0);
}

/*
 * Copies record r (a live row) to entry got of an iterator's output: its
 * id, its floats (weights and optimizer state), and its access meta when
 * the caller asked for it. Every walk over rows (iterator, checkpoint,
 * view) hands rows out this way.
 */
static inline void emb__row_put(const struct emb_table *t,
				const struct emb_row_hdr *r, uint32_t got,
				uint64_t *ids, float *rows,
				struct emb_row_meta *meta)
{
	ids[got] = r->id;
	if (rows) /* NULL: ids (and meta) only */
		memcpy(rows + (size_t)got * t->row_floats,
		       (const char *)r + EMB_ROW_HDR_SIZE,
		       (size_t)t->row_floats * sizeof(float));
	if (meta) {
		meta[got].last_step = r->last_step;
		meta[got].count = r->count;
	}
}

/* The slot tag and probe start for an id hash (bit use: common/hash.h). */
static inline uint32_t emb__hash_tag(uint64_t h)
{
	return (uint32_t)((h >> 10) & 0xff) << EMB_SLOT_IDX_BITS;
}

/*
 * The table's slab_div for rows_per_slab: ceil(2^40 / rows_per_slab).
 * Then idx / rows_per_slab is a 64-bit multiply and shift (emb__slab_of),
 * exact for every idx < 2^24 (a record index) when rows_per_slab < 2^16
 * (size_slabs() keeps it far below): the error term idx * (slab_div *
 * rows_per_slab - 2^40) stays under 2^40. One instruction where the
 * 128-bit product took four, fixed registers included.
 */
static inline uint64_t emb__slab_div(uint32_t rows_per_slab)
{
	return ((UINT64_C(1) << 40) + rows_per_slab - 1) / rows_per_slab;
}

/* idx / rows_per_slab, for idx < 2^24 and div = emb__slab_div(). */
static inline uint32_t emb__slab_of(uint32_t idx, uint64_t div)
{
	return (uint32_t)(((uint64_t)idx * div) >> 40);
}

/*
 * Record idx of a shard whose slab addresses are slabs, for a table's
 * slab_div, rows_per_slab and row_bytes (loops keep them in locals).
 */
static inline struct emb_row_hdr *emb__slab_row(char *const *slabs,
						uint64_t div, uint32_t rps,
						uint32_t row_bytes, uint32_t idx)
{
	uint32_t slab = emb__slab_of(idx, div);
	uint32_t off = idx - slab * rps;

	return (struct emb_row_hdr *)(void *)(slabs[slab] +
					      (size_t)off * row_bytes);
}

static inline struct emb_row_hdr *emb__shard_row(const struct emb_table *t,
						 const struct emb_shard *s,
						 uint32_t idx)
{
	return emb__slab_row(s->slabs, t->slab_div, t->rows_per_slab,
			     t->row_bytes, idx);
}

int emb__shard_init(struct emb_shard *s);
void emb__shard_fini(struct emb_table *t, struct emb_shard *s);
/* Record index of id, or -1. */
int64_t emb__shard_find(const struct emb_table *t, const struct emb_shard *s,
			uint64_t id, uint64_t h);
/* Slot where the probe for hash h starts (the shard must have slots). */
static inline uint32_t *emb__shard_home(const struct emb_shard *s, uint64_t h)
{
	return &s->slots[emb_fastrange32((uint32_t)(h >> 18), s->nslots)];
}
/* Shard lock held: sizes s's index for more records (emb_table_reserve);
 * whether it did. */
bool emb__shard_reserve(struct emb_table *t, struct emb_shard *s,
			uint32_t more);
/*
 * Creates a record for id (absent) and indexes it; the record's data is
 * uninitialised. Record index, or EMB_EMEMLIMIT / -ENOMEM / -ENOSPC.
 */
int64_t emb__shard_insert(struct emb_table *t, struct emb_shard *s, uint64_t id,
			  uint64_t h);
/* The L2 norm of a record's weights (any row format), as min_l2 reads
 * it; r may be a copy of a record (a cold row read from the device). */
float emb__row_l2(const struct emb_table *t, const struct emb_row_hdr *r);
/*
 * The shard's rows of held slots (emb_table_evict_hold()), counted again
 * first when the hold changed since they were last counted: one pass over
 * the shard's records, paid only by an eviction that needs the count.
 */
uint32_t emb__shard_held(struct emb_table *t, struct emb_shard *s);
/* Unindexes and frees record idx (live, holding id). */
void emb__shard_remove(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       uint64_t h);
/* The same for a row that moves to the device tier: not a removal, so
 * neither checkpoints nor moves record it (tier.c carries its marks). */
void emb__shard_unlink(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       uint64_t h);

/* ---- lifecycle.c: admission and eviction; caller holds the shard lock ---- */

/* A shard's part of the table's lifecycle. */
struct emb_life_shard {
	struct emb_lifecycle_cfg cfg; /* the policy, copied in under the lock */
	uint64_t cap;	      /* max_rows share of this shard; 0 = none */
	uint32_t hand;	      /* next record index the hand visits */
	uint32_t cnt_slots;   /* COUNT: slots (power of two), 0 = none */
	uint32_t cnt_used;    /* COUNT: ids pending */
	uint64_t *cnt_ids;    /* COUNT: ids, then cnt_counts, one block */
	uint16_t *cnt_counts; /* COUNT: sightings, 0 = empty slot */
	uint8_t *bloom;	      /* BLOOM: bloom_n 8-bit counters */
	uint32_t bloom_n;     /* BLOOM: counters (bytes) */
} __attribute__((aligned(64)));

/*
 * True when pulls must record each access in the row (last_step, count):
 * only eviction reads them (ttl and max_rows their values, min_l2 and the
 * others the guard that keeps rows used in the current step). Without an
 * eviction policy a pull writes nothing into the rows it reads. Caller
 * holds the shard lock (the policy is set under it).
 */
static inline bool emb__life_tracks(const struct emb_life_shard *l)
{
	return l && (l->cfg.ttl_steps || l->cfg.min_l2 > 0.0f ||
		     l->cfg.max_rows);
}

/* Rows a sweep removed, by reason. */
struct emb_evict_counts {
	uint64_t ttl; /* idle too long */
	uint64_t l2;  /* weights' norm too small */
	uint64_t cap; /* over max_rows */
	uint64_t count; /* fewer accesses than emb_table_evict's min_count */
};

/*
 * One sighting of an absent id under l's admission: 1 when the id is
 * admitted now (create its row), 0 while it is pending, or EMB_EMEMLIMIT /
 * -ENOMEM when the counters cannot grow.
 */
int emb__admit_sight(struct emb_table *t, struct emb_life_shard *l,
		     uint64_t id);
/*
 * The ids a pull call found pending so far: a batch counts one sighting per
 * distinct id, as the client library sends each id of a batch once. Made
 * on the first pending id (zeroed before) in the thread's scratch (scratch.c);
 * emb__admit_batch_fini() ends its use.
 */
struct emb_admit_batch {
	uint64_t *ids; /* slots, valid where used[i] */
	uint8_t *used; /* slot occupancy */
	uint32_t mask; /* slots - 1 */
};

/* As emb__admit_sight(), once per distinct id of the call (n ids). */
int emb__admit_batch_sight(struct emb_table *t, struct emb_life_shard *l,
			   struct emb_admit_batch *b, uint32_t n, uint64_t id);
void emb__admit_batch_fini(struct emb_admit_batch *b);

/* True when a sweep of shard s could evict anything. */
bool emb__evict_wanted(struct emb_table *t, struct emb_shard *s,
		       const struct emb_life_shard *l);
/*
 * Advances s's clock hand by a bounded number of records (more for bigger
 * groups, nids ids) and removes the rows the policy condemns, adding them to
 * out. Rows whose last_step is step or later are never removed, so the
 * batch that calls it keeps every row it handed out.
 */
void emb__evict_sweep(struct emb_table *t, struct emb_shard *s,
		      struct emb_life_shard *l, uint32_t step, uint32_t nids,
		      struct emb_evict_counts *out);
/* Frees the filters and shard parts (emb_table_destroy). */
void emb__life_destroy(struct emb_table *t);
/* Bytes the admission filters hold now. */
uint64_t emb__life_filter_bytes(struct emb_table *t);

/* ---- dirty.c: change tracking for incremental checkpoints ---- */

/*
 * Every path that writes a row's floats marks its record (push, assign,
 * and creation in emb__shard_insert); every removal goes through
 * emb__shard_remove, which records the id. Caller holds the shard lock.
 * -DEMB_NO_DIRTY builds the store without the marks, to measure what
 * they cost (docs/store.md).
 */
static inline void emb__dirty_mark(struct emb_shard *s, uint32_t idx)
{
#ifndef EMB_NO_DIRTY
	s->dirty[idx >> 6] |= 1ull << (idx & 63);
#endif
	/* Not optional: a move's final stream sends only these rows. */
	if (s->track)
		s->track[idx >> 6] |= 1ull << (idx & 63);
}

/* Makes room for nrec records' bits (before a slab is added): 0/-ENOMEM. */
int emb__dirty_reserve(struct emb_shard *s, uint32_t nrec);
/* shard.c, under the shard lock: room for nrec records' slots (charged to
 * the table), and the slots of every record there is (0 or as reserve). */
/* shard.c, under the shard lock: room for nrec records' births (charged
 * to the table), for birth.c and as slabs are added. */
int emb__birth_reserve(struct emb_table *t, struct emb_shard *s,
		       uint32_t nrec);

/* Raises slot's birth counter to at least b (a birth a holder was given
 * by the slot's primary). */
static inline void emb__birth_raise(struct emb_table *t, uint32_t slot,
				    uint32_t b)
{
	uint32_t *c = &t->slot_birth[slot];
	uint32_t have = __atomic_load_n(c, __ATOMIC_RELAXED);

	while (have < b && !__atomic_compare_exchange_n(
			       c, &have, b, true, __ATOMIC_RELAXED,
			       __ATOMIC_RELAXED))
		;
}

int emb__vslot_reserve(struct emb_table *t, struct emb_shard *s,
		       uint32_t nrec);
/* Shard lock held: one step of s's vslot build (allocating it first).
 * 0, -ENOMEM or EMB_EMEMLIMIT. */
int emb__vslot_step(struct emb_table *t, struct emb_shard *s);
/* Shard lock held: whether every record of s has its vslot entry. */
static inline bool emb__vslot_ready(const struct emb_shard *s)
{
	return s->vslot && s->vslot_built >= s->vslot_end;
}
/* Every shard's vslot, complete when it returns 0 (shard.c); takes each
 * shard's lock itself, a step at a time. -ENOMEM or EMB_EMEMLIMIT (the
 * steps done are kept). */
int emb__slot_index(struct emb_table *t);
/* Tests: called between two rounds of emb__slot_index()'s steps, with no
 * lock held (NULL: nothing). */
extern void (*emb__slot_index_between)(struct emb_table *t);
/* Records that id was removed; past the bound, the shard forgets and
 * sets erased_lost (the next checkpoint must be full). */
void emb__dirty_erased(struct emb_shard *s, uint64_t id);
void emb__dirty_fini(struct emb_shard *s);

/* ---- view.c: copy-on-write for point-in-time views ---- */

/* Saves record idx as it is now, if a view still needs it (the caller is
 * about to change or free it). Caller holds the shard lock. */
void emb__view_save(struct emb_table *t, struct emb_shard *s, uint32_t idx);
/* A tiered shard's cold row (its record's bytes) leaves the device
 * before the view read it: saved as emb__view_save() saves a record. */
void emb__view_save_cold(struct emb_table *t, struct emb_shard *s,
			 const void *rec);
/* Record idx was just made: no view taken before may show it. */
void emb__view_born(struct emb_shard *s, uint32_t idx);
/* A batch that writes rows begins (waits while a view is being taken)
 * and ends, both on the same thread: they count in its stripe. */
void emb__writer_enter(struct emb_table *t);
static inline void emb__writer_exit(struct emb_table *t)
{
	__atomic_sub_fetch(&emb__my_stripe(t)->writers, 1, __ATOMIC_SEQ_CST);
}

/*
 * Every write of a record's floats goes through here first: the dirty
 * mark for the next delta checkpoint, and the old row for a view.
 */
static inline void emb__row_write(struct emb_table *t, struct emb_shard *s,
				  uint32_t idx)
{
	emb__dirty_mark(s, idx);
	if (__builtin_expect(s->view != NULL, 0))
		emb__view_save(t, s, idx);
}

/* ---- tier.c: cold rows on a device; caller holds the named shard's lock
 * unless said otherwise ---- */

struct emb_tier;
struct emb_tier_pre;

/* Makes the file and the tier (create, no lock); 0 or an error. */
int emb__tier_open(struct emb_table *t, const char *path, uint64_t max_bytes);
/* Frees it and removes the file (destroy, no lock). */
void emb__tier_close(struct emb_table *t);
/* The file's path (as given); rows on the device now (any thread). */
const char *emb__tier_path(const struct emb_table *t);
uint64_t emb__tier_rows_cold(struct emb_table *t);
/* The next tick of the tier's access clock (a batch's; any thread). */
uint32_t emb__tier_tick(struct emb_table *t);
/* A push's new table step, which a tiered table remembers the tick of
 * (any thread): use it instead of incrementing t->step. */
uint32_t emb__tier_step(struct emb_table *t);
/* The clock emb__tier_tick() advances, as it is now. */
uint32_t emb__tier_now(const struct emb_table *t);
/*
 * For ttl on a tiered table (any thread): true and *upto such that a row
 * whose last_step (a tick) is at or before *upto, as a distance, was
 * last accessed more than idle_steps table steps ago; false when no row
 * can be known to be yet. Late by up to about idle_steps / 8, never early.
 */
bool emb__tier_idle_upto(struct emb_table *t, uint32_t idle_steps,
			 uint32_t *upto);
/*
 * Before a group of need ids of shard si (their hashes h[pos[0..need))):
 * makes sure that need records can be made without passing the memory
 * limit, moving the least recently used rows of the shard to the device
 * as needed, or evicting them where the table's eviction policy condemns
 * them and the group has them not (added to ev). Nothing else demotes,
 * so record pointers a group resolves stay valid through it.
 */
int emb__tier_room(struct emb_table *t, struct emb_shard *s, uint32_t si,
		   const uint64_t *h, const uint32_t *pos, uint32_t need,
		   struct emb_evict_counts *ev);
/* Shard si's cold rows. */
uint32_t emb__tier_cold_of(struct emb_table *t, uint32_t si);
/* What emb__tier_evict() removes from a shard's cold rows. */
struct emb_tier_evict {
	uint32_t now;	    /* the batch's tick: a block read at or after it
			       has a row of the batch and stays */
	uint32_t ttl_steps; /* the policy's ttl (the hand's pace), 0 = none */
	bool idle;	    /* rows idle past ttl go: last access <= upto */
	uint32_t upto;	    /* from emb__tier_idle_upto() */
	float min_l2;	    /* rows weaker go (the pass, 0 = none) */
	uint64_t over;	    /* rows the shard has over max_rows */
	uint32_t min_count; /* emb_table_evict: rows accessed fewer times */
	bool all;	    /* emb_table_evict: every block, no budget */
};
/*
 * Evicts cold rows of shard si as e says, adding them to out: blocks
 * whose rows are all idle past ttl, the oldest blocks while over, the
 * weak rows of blocks written before min_l2 was set (emb__tier_l2_pass),
 * reading only the blocks it drops rows of. 0 or a read error.
 */
int emb__tier_evict(struct emb_table *t, struct emb_shard *s, uint32_t si,
		    const struct emb_tier_evict *e,
		    struct emb_evict_counts *out);
/* The first eviction policy: shard si's cold rows start their idle time
 * now, as its rows in DRAM do; the tick now, to stamp those with. */
uint32_t emb__tier_stamp(struct emb_table *t, uint32_t si);
/* min_l2 was set or raised: shard si's blocks written so far are read
 * once each, by its next emb__tier_evict() calls, for weak rows. */
void emb__tier_l2_pass(struct emb_table *t, uint32_t si);
/*
 * Finds id (absent from shard si's index) on the device: NULL with *rc 0
 * (not there) or an error, else its record. A write (push, assign), and a
 * read of an id read lately, bring the row back into DRAM (*in_dram); a
 * first read leaves it on the device and returns a copy the caller may
 * only read from, and only until its next take. pre: the batch's
 * read-ahead, or NULL.
 */
struct emb_row_hdr *emb__tier_take(struct emb_table *t, struct emb_shard *s,
				   uint32_t si, uint64_t id, uint64_t h,
				   const struct emb_tier_pre *pre, bool write,
				   bool *in_dram, int *rc);
/* Whether id has a cold row (a read error counts as yes). */
bool emb__tier_has(struct emb_table *t, uint32_t si, uint64_t id, uint64_t h);
/* Drops id's cold row: true if it had one. lives_on: an assign makes it
 * again at once, in DRAM; else an erase. */
bool emb__tier_forget(struct emb_table *t, uint32_t si, uint64_t id,
		      uint64_t h, bool lives_on, int *rc);
/* A batch's read-ahead: note each id absent from its shard's index
 * (under that shard's lock), then fetch (no lock), then pass it to the
 * takes, then free. */
struct emb_tier_pre *emb__tier_pre_new(void);
void emb__tier_note(struct emb_table *t, uint32_t si, uint64_t h,
		    struct emb_tier_pre *p);
int emb__tier_fetch(struct emb_table *t, struct emb_tier_pre *p);
const char *emb__tier_pre_block(const struct emb_tier_pre *p, uint32_t si,
				uint32_t sb, uint32_t gen);
void emb__tier_pre_free(struct emb_tier_pre *p);
void emb__tier_stats(struct emb_table *t, struct emb_table_tier_stats *out);
/* The bytes a tiered table's DRAM may hold: the smaller of its limit and
 * its budget's (0 = none), any thread. */
uint64_t emb__tier_limit(const struct emb_table *t);

/*
 * Walks over a tiered table's rows (tier.c, "walks"): an iterator or a
 * checkpoint enters each shard, walks its DRAM records as in any table
 * but for the ids emb__tier_walk_owes() names, then calls rest until
 * done, then leaves. While a walk is in DRAM the shard
 * demotes nothing. All under the shard's lock.
 */
struct emb_tier_walk;
enum {
	EMB_TIER_WALK_ALL,  /* every row */
	EMB_TIER_WALK_CKPT, /* those a delta checkpoint must carry */
	EMB_TIER_WALK_MOVE, /* those marked since emb_table_track_begin() */
};
/* slots: a bitmap of the EMB_NSLOTS slots whose rows to hand out, or
 * NULL for all (copied). 0 or -ENOMEM. */
int emb__tier_walk_enter(struct emb_table *t, uint32_t si, int kind,
			 const uint64_t *slots, struct emb_tier_walk **out);
/* The DRAM walk is at record idx: the shard may demote the records
 * before it (the walk is done with them), and no others. */
void emb__tier_walk_dram_at(struct emb_tier_walk *w, uint32_t idx);
/* Whether the DRAM walk must skip id (the walk hands it out later). */
bool emb__tier_walk_owes(const struct emb_tier_walk *w, uint64_t id);
/* The DRAM records are done (hot_done, if not yet): hands out cold and
 * owed rows as emb__row_put() from ids[*got] on, up to max in all. 0 or
 * a read error or -ENOMEM. Drops s's lock while it reads and takes it
 * again. clear_ckpt: the rows lose their checkpoint marks. */
int emb__tier_walk_rest(struct emb_table *t, struct emb_shard *s, uint32_t si,
			struct emb_tier_walk *w, bool clear_ckpt,
			uint64_t *ids, float *rows, struct emb_row_meta *meta,
			uint32_t *got, uint32_t max);
/* Every row handed out: leave. */
bool emb__tier_walk_done(const struct emb_tier_walk *w);
/* A view's walk of shard si's cold rows at the instant (the shard is
 * locked), read by emb__tier_walk_rest after the DRAM records; a listed
 * row that leaves the device before is saved to the view. 0/-ENOMEM. */
int emb__tier_view_enter(struct emb_table *t, uint32_t si,
			 struct emb_tier_walk **out);
void emb__tier_walk_leave(struct emb_table *t, uint32_t si,
			  struct emb_tier_walk *w);
/* tier.c's functions view.c reaches through emb_table.tier_view. */
struct emb_tier_view_ops {
	int (*enter)(struct emb_table *t, uint32_t si,
		     struct emb_tier_walk **out);
	int (*rest)(struct emb_table *t, struct emb_shard *s, uint32_t si,
		    struct emb_tier_walk *w, bool clear_ckpt, uint64_t *ids,
		    float *rows, struct emb_row_meta *meta, uint32_t *got,
		    uint32_t max);
	bool (*done)(const struct emb_tier_walk *w);
	void (*leave)(struct emb_table *t, uint32_t si,
		      struct emb_tier_walk *w);
	uint64_t (*limit)(const struct emb_table *t);
};

/* emb_table_track_begin() on shard si: the cold rows' move marks go. */
void emb__tier_track_reset(struct emb_table *t, uint32_t si);

/*
 * mem.c: charges (n > 0) or releases (n < 0) table memory against the
 * table's limit and its budget; 0 or EMB_EMEMLIMIT (nothing charged).
 */
int emb__mem_charge(struct emb_table *t, int64_t n);
/*
 * Charges n bytes that must not fail, past the limit if need be (a tiered
 * table's cold maps and hot index: a demotion cannot be refused for the
 * memory it needs to record where rows went). Released with
 * emb__mem_charge(t, -n).
 */
void emb__mem_charge_force(struct emb_table *t, uint64_t n);

#endif
