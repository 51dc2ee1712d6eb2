/*
 * src/store/table.c - emb_table_*: batch operations over a sharded table.
 *
 * Concurrency: striped locks, one mutex per shard. A batch is first grouped
 * by shard (a stable counting sort of its ids), then each group runs under
 * one lock acquisition, so a 4096-id batch over 64 shards takes 64 locks, not
 * 4096. Inside a group, lookups are pipelined the way MICA does it: prefetch
 * the home slots of a chunk, then follow tags to prefetch the rows, then do
 * the work, so one chunk's cache misses overlap instead of queueing.
 * Any thread may call any function here except create/destroy.
 */
#include "store/store_int.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/optim.h"
#include "common/optim_int.h"
#include "common/rowfmt.h"
#include "common/target.h"

/* -DEMB_NO_PREFETCH builds the store without software prefetch, to measure
 * what it buys (docs/store.md). */
#ifdef EMB_NO_PREFETCH
#define prefetch(addr, rw) ((void)(addr))
#define prefetch_l2(addr) ((void)(addr))
#else
#define prefetch(addr, rw) __builtin_prefetch((addr), (rw), 3)
#define prefetch_l2(addr)  __builtin_prefetch((addr), 0, 2)
#endif

#define CHUNK	       16u    /* ids whose misses are overlapped at once */
#define PULL_CHUNK     32u    /* the same for pulls: see pull_common() */
#define PREFETCH_LINES 8u     /* row cache lines prefetched per id */
#define SLAB_TARGET    65536u /* a jemalloc size class: no rounding waste */

/* Ids in the pull chunk that starts at position c of a group ending at hi. */
#define CHUNK_LEN(c, hi) ((hi) - (c) < PULL_CHUNK ? (hi) - (c) : PULL_CHUNK)
/* The same for a push's chunks. */
#define PUSH_CHUNK_LEN(c, hi) ((hi) - (c) < CHUNK ? (hi) - (c) : CHUNK)

static void add_stat(uint64_t *c, uint64_t n)
{
	if (n)
		__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static uint64_t load_stat(const uint64_t *c)
{
	return __atomic_load_n(c, __ATOMIC_RELAXED);
}

static bool valid_name(const char *name)
{
	size_t n;

	if (!name)
		return false;
	n = strnlen(name, EMB_NAME_MAX + 1);
	if (n == 0 || n > EMB_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' ||
		      c == '-'))
			return false;
	}
	return true;
}

/*
 * Picks the slab size. jemalloc pads every large allocation (above 14 KiB)
 * with a page for cache-oblivious placement, which would cost a 64 KiB slab
 * 6% more memory, so rows up to 1 KiB go in slabs of a small size class,
 * the one whose rounding wastes least. Bigger rows take 2..8 per slab, as
 * few bytes as jemalloc's classes waste.
 */
static void size_slabs(struct emb_table *t)
{
	static const uint32_t small[] = {14336, 12288, 10240, 8192, 7168};
	double best_fill = 0.0;
	uint32_t best = 2;

	if (t->row_bytes <= 1024) {
		for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
			uint32_t k = small[i] / t->row_bytes;
			double fill = (double)k * t->row_bytes /
				      (double)emb__arena_size_class(small[i]);

			if (fill > best_fill + 1e-9) {
				best_fill = fill;
				best = k;
			}
		}
		t->rows_per_slab = best;
		t->slab_bytes = (size_t)best * t->row_bytes;
	} else if (t->row_bytes <= SLAB_TARGET / 4) {
		t->rows_per_slab = SLAB_TARGET / t->row_bytes;
		t->slab_bytes = (size_t)t->rows_per_slab * t->row_bytes;
	} else {
		double best_waste = 1.0;

		for (uint32_t k = 2; k <= 8; k++) {
			size_t want = (size_t)k * t->row_bytes;
			size_t got = emb__arena_size_class(want);
			double waste = (double)(got - want) / (double)got;

			if (waste < best_waste - 1e-9) {
				best_waste = waste;
				best = k;
			}
		}
		t->rows_per_slab = best;
		t->slab_bytes = (size_t)best * t->row_bytes;
	}
	t->slab_alloc_bytes = emb__arena_size_class(t->slab_bytes);
	/* A multiply and shift divides record indexes by rows_per_slab
	 * (store_int.h): exact while rows_per_slab < 2^16, and the largest
	 * above is 14336 / 24 = 597. */
	t->slab_div = emb__slab_div(t->rows_per_slab);
}

int emb_table_create(const struct emb_table_opts *opts, struct emb_table **out)
{
	uint64_t ext, ext_bytes;
	struct emb_table *t;
	uint32_t i;
	int rc;

	if (!opts || !out)
		return EMB_EBADARG;
	if (!valid_name(opts->name))
		return EMB_EBADNAME;
	if (opts->dim == 0 || opts->dim > EMB_DIM_MAX)
		return EMB_EBADDIM;
	if (opts->nshards == 0 || opts->nshards > EMB_SHARDS_MAX ||
	    (opts->nshards & (opts->nshards - 1)))
		return EMB_EBADARG;
	rc = emb_optim_validate(&opts->optim);
	if (rc)
		return rc;
	rc = emb_init_validate(&opts->init);
	if (rc)
		return rc;
	rc = emb_lifecycle_validate(&opts->life);
	if (rc)
		return rc;
	if (opts->row_format >= EMB_ROWFMT_COUNT ||
	    opts->rounding > EMB_ROUND_NEAREST)
		return EMB_EBADFORMAT;
	/* A tier holds what the memory limit leaves out, so it needs one
	 * (docs/store.md). Remote reads are fine: only DRAM records are
	 * located, a demotion frees its record as an erase does (the seal
	 * broken) and a promotion seals its record as a write does, so a
	 * reader falls back to a two-sided pull for a cold row. */
	if (opts->tier_path &&
	    (!*opts->tier_path ||
	     (!opts->mem_limit && !(opts->budget && opts->budget->limit))))
		return EMB_EBADARG;

	t = aligned_alloc(64, (sizeof(*t) + 63) & ~(size_t)63);
	if (!t)
		return -ENOMEM;
	memset(t, 0, sizeof(*t));
	strcpy(t->name, opts->name);
	t->opts = *opts;
	t->opts.name = t->name;
	t->opts.life = EMB_LIFECYCLE_CFG_DEFAULT; /* set below, once usable */
	pthread_mutex_init(&t->life_lock, NULL);
	t->dim = opts->dim;
	t->fmt = opts->row_format;
	t->wwords = emb_rowfmt_words(t->fmt, t->dim);
	t->row_floats =
	    t->wwords + emb_optim_state_floats(opts->optim.kind, opts->dim);
	t->row_bytes = (EMB_ROW_HDR_SIZE + 4 * t->row_floats + 7) & ~7u;
	if (opts->remote_read) {
		t->sealed = true;
		t->row_bytes += 8; /* the seal (store_int.h) */
		if (getrandom(&t->seal_seed, sizeof(t->seal_seed), 0) !=
		    (ssize_t)sizeof(t->seal_seed))
			t->seal_seed = emb_id_hash((uintptr_t)t ^
						   (uint64_t)time(NULL));
	}
	t->prefetch_lines = (EMB_ROW_HDR_SIZE + 4 * t->wwords + 63) / 64;
	if (t->prefetch_lines > PREFETCH_LINES)
		t->prefetch_lines = PREFETCH_LINES;
	size_slabs(t);
	t->nshards = opts->nshards;
	t->shard_mask = opts->nshards - 1;

	rc = emb__arena_create(&t->arena);
	if (rc)
		goto err_free_t;
	t->shards = aligned_alloc(64, t->nshards * sizeof(*t->shards));
	if (!t->shards) {
		rc = -ENOMEM;
		goto err_destroy_arena;
	}
	for (i = 0; i < t->nshards; i++) {
		rc = emb__shard_init(&t->shards[i]);
		if (rc)
			goto err_fini_shards;
	}
	emb__arena_usage(t->arena, &ext, &ext_bytes);
	t->fixed_bytes = ext_bytes + EMB_TABLE_TAIL_BYTES +
			 (uint64_t)t->nshards * sizeof(struct emb_shard) +
			 sizeof(*t);
	rc = emb__mem_charge(t, (int64_t)t->fixed_bytes);
	if (rc)
		goto err_fini_shards;
	t->opts.tier_path = NULL;
	if (opts->tier_path) {
		rc = emb__tier_open(t, opts->tier_path, opts->tier_max);
		if (rc)
			goto err_uncharge;
		t->opts.tier_path = emb__tier_path(t);
	}
	rc = emb_table_set_lifecycle(t, &opts->life);
	if (rc)
		goto err_uncharge;
	*out = t;
	return 0;

err_uncharge:
	emb__tier_close(t);
	emb__mem_charge(t, -(int64_t)t->fixed_bytes);
	i = t->nshards;
err_fini_shards:
	while (i-- > 0)
		emb__shard_fini(t, &t->shards[i]);
	free(t->shards);
err_destroy_arena:
	emb__arena_destroy(t->arena);
err_free_t:
	pthread_mutex_destroy(&t->life_lock);
	free(t);
	return rc;
}

void emb_table_destroy(struct emb_table *t)
{
	if (!t)
		return;
	emb__life_destroy(t);
	emb__tier_close(t);
	for (uint32_t i = 0; i < t->nshards; i++)
		emb__shard_fini(t, &t->shards[i]);
	free(t->shards);
	free(t->slot_birth);
	emb__mem_charge(t, -(int64_t)load_stat(&t->mem_used));
	emb__arena_destroy(t->arena);
	pthread_mutex_destroy(&t->life_lock);
	free(t);
}

int emb_table_set_extent_hook(struct emb_table *t, emb_extent_fn fn, void *arg)
{
	if (!t)
		return EMB_EBADARG;
	return emb__arena_set_hook(t->arena, fn, arg);
}

const char *emb_table_name(const struct emb_table *t)
{
	return t->name;
}

uint32_t emb_table_dim(const struct emb_table *t)
{
	return t->dim;
}

uint32_t emb_table_row_floats(const struct emb_table *t)
{
	return t->row_floats;
}

uint32_t emb_table_row_format(const struct emb_table *t)
{
	return t->fmt;
}

uint32_t emb_table_weight_words(const struct emb_table *t)
{
	return t->wwords;
}

void emb_table_get_opts(const struct emb_table *t, struct emb_table_opts *out)
{
	/* The lifecycle changes online, under life_lock. */
	pthread_mutex_t *lock = (pthread_mutex_t *)&t->life_lock;

	pthread_mutex_lock(lock);
	*out = t->opts;
	pthread_mutex_unlock(lock);
}

/*
 * The weights a new row of id gets, in the table's format at out
 * (t->wwords words): the initializer's fp32 values rounded to nearest. An
 * initializer's values are finite and small, so the encode cannot refuse
 * them; a table whose initializer could overflow fp16 (uniform with a
 * bound over 65504) keeps the largest finite instead of a refused row.
 */
static void init_weights(const struct emb_table *t, uint64_t id, void *out)
{
	float w[EMB_DIM_MAX];

	if (t->fmt == EMB_ROWFMT_FP32) {
		emb_init_row(&t->opts.init, t->opts.seed, id, out, t->dim);
		return;
	}
	emb_init_row(&t->opts.init, t->opts.seed, id, w, t->dim);
	if (!emb_rowfmt_encode(t->fmt, w, out, t->dim, EMB_ROUND_NEAREST, 0)) {
		for (uint32_t j = 0; j < t->dim; j++)
			w[j] = w[j] > 65504.0f	  ? 65504.0f
			       : w[j] < -65504.0f ? -65504.0f
						  : w[j];
		emb_rowfmt_encode(t->fmt, w, out, t->dim, EMB_ROUND_NEAREST,
				  0);
	}
}

void emb_table_init_row(const struct emb_table *t, uint64_t id, float *out,
			bool with_state)
{
	if (with_state) {
		init_weights(t, id, out);
		emb_optim_state_init(&t->opts.optim, out + t->wwords, t->dim);
		return;
	}
	if (t->fmt == EMB_ROWFMT_FP32) {
		emb_init_row(&t->opts.init, t->opts.seed, id, out, t->dim);
		return;
	}
	{
		uint32_t raw[EMB_DIM_MAX];

		init_weights(t, id, raw);
		emb_rowfmt_decode(t->fmt, raw, out, t->dim);
	}
}

void emb_table_init_row_raw(const struct emb_table *t, uint64_t id, void *out)
{
	init_weights(t, id, out);
}

/* ---- batch plumbing ---- */

/*
 * Per-call scratch: hashes of the ids and their positions grouped by shard.
 * pos[] lists indexes into ids[]; start[s]..start[s+1] is shard s's group.
 * The memory is the calling thread's kept buffer (scratch.c), so a batch
 * allocates nothing once its thread has seen a batch as large.
 */
struct batch {
	uint64_t *h;	 /* emb_id_hash(ids[i]) */
	uint32_t *pos;	 /* positions, grouped by shard, stable */
	uint32_t *start; /* nshards + 1 group bounds */
	uint32_t npos;	 /* entries in pos */
};

static int batch_init(struct emb_table *t, struct batch *b, uint32_t n)
{
	size_t bytes = (size_t)n * (sizeof(uint64_t) + sizeof(uint32_t)) +
		       (t->nshards + 1) * sizeof(uint32_t);
	char *mem = emb__scratch(EMB_SCRATCH_BATCH, bytes);

	if (!mem)
		return -ENOMEM;
	b->h = (uint64_t *)(void *)mem;
	b->pos = (uint32_t *)(void *)(mem + (size_t)n * sizeof(uint64_t));
	b->start = b->pos + n;
	b->npos = 0;
	return 0;
}

static void batch_fini(struct batch *b)
{
	emb__scratch_done(b->h);
}

/*
 * Groups the positions 0..n of b by shard. Inlined; the local restrict
 * pointers keep the counts apart from the hashes (through b, GCC
 * reloaded them per id). A push groups with its duplicate check folded
 * in instead (group_push()).
 */
static inline __attribute__((always_inline)) void
batch_group(struct emb_table *t, struct batch *b, uint32_t n)
{
	const uint64_t *restrict h = b->h;
	uint32_t *restrict start = b->start;
	uint32_t *restrict pos = b->pos;
	const uint32_t mask = t->shard_mask;
	uint32_t s, i, sum = 0;

	memset(start, 0, (t->nshards + 1) * sizeof(*start));
	for (i = 0; i < n; i++)
		start[(h[i] & mask) + 1]++;
	for (s = 0; s <= t->nshards; s++) {
		sum += start[s];
		start[s] = sum;
	}
	/* start[s + 1] is used as the fill cursor of shard s, then restored. */
	for (i = 0; i < n; i++)
		pos[start[h[i] & mask]++] = i;
	memmove(start + 1, start, t->nshards * sizeof(*start));
	start[0] = 0;
	b->npos = n;
}

/*
 * h[i] = emb_id_hash(ids[i]) for i < n, in blocks of a fixed 8 that GCC
 * vectorises; the AVX-512 copy (DQ has the 64-bit multiply) does a block
 * in about ten instructions where the scalar code takes eleven an id.
 */
static inline __attribute__((always_inline)) void
hash_body(uint64_t *restrict h, const uint64_t *restrict ids, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t *restrict hb = h + i;
		const uint64_t *restrict ib = ids + i;

		for (size_t k = 0; k < 8; k++)
			hb[k] = emb_id_hash(ib[k]);
	}
	for (; i < n; i++)
		h[i] = emb_id_hash(ids[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512dq"))) static void
hash_avx512(uint64_t *restrict h, const uint64_t *restrict ids, size_t n)
{
	hash_body(h, ids, n);
}
#endif

static void hash_all(uint64_t *restrict h, const uint64_t *restrict ids,
		     size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (emb__pull_vec_max >= 64 && __builtin_cpu_supports("avx512dq")) {
		hash_avx512(h, ids, n);
		return;
	}
#endif
	hash_body(h, ids, n);
}

/* Hashes ids[0..n) into b->h and groups every position by shard. */
static void hash_group(struct emb_table *t, struct batch *b,
		       const uint64_t *ids, uint32_t n)
{
	hash_all(b->h, ids, n);
	batch_group(t, b, n);
}

/*
 * A pull's prefetches go to L2 (prefetcht1, for reading), a push's to L1
 * for writing. A pull keeps 32 rows of five lines in flight; prefetcht0
 * would hold one of L1's few miss buffers per line, so after a couple of
 * dozen lines every further prefetch instruction waits for one to free
 * (half of a pull's time stalled there). Into L2 the same misses overlap
 * far better: that alone took Zipf pulls 0.79x the time, in one process
 * with the variants interleaved (docs/store.md, "Reads and row creation,
 * second round"). The row is then copied from L2, which costs little next
 * to the miss.
 *
 * always_inline, here, in prefetch_line() and prefetch_homes(): GCC
 * counts a prefetch as no side effect, so a helper left out of line that
 * does nothing else is a "const" function to its IPA passes, and its calls
 * are deleted (it did so to prefetch_homes(), whose prefetches never ran;
 * docs/store.md, "Third round"). Inlined, pull is a constant at each call
 * site, so the choice between the two prefetches costs nothing per line.
 */
static inline __attribute__((always_inline)) void
prefetch_line(const char *p, bool pull)
{
	if (pull)
		prefetch_l2(p);
	else
		prefetch(p, 1);
}

static inline __attribute__((always_inline)) void
prefetch_row(const struct emb_table *t, const void *r, bool pull,
	     unsigned lines)
{
	const char *c = r;

	/* Straight-line, entered by the line count (at most PREFETCH_LINES):
	 * the loop took seven instructions a line, 35 of a pull's 204 a row
	 * at dim 64; the jump in and five prefetches take twelve
	 * (docs/store.md, "Fourth round"). A pull passes the table's count
	 * as a constant (lines > 0, see resolve_pull[]), so the jump is
	 * folded away: the indirect jump per row cost a pull 5-7 % of its
	 * time (docs/store.md, "Fifth round"). */
	switch (lines ? lines : t->prefetch_lines) {
	case 8: prefetch_line(c + 448, pull); /* fall through */
	case 7: prefetch_line(c + 384, pull); /* fall through */
	case 6: prefetch_line(c + 320, pull); /* fall through */
	case 5: prefetch_line(c + 256, pull); /* fall through */
	case 4: prefetch_line(c + 192, pull); /* fall through */
	case 3: prefetch_line(c + 128, pull); /* fall through */
	case 2: prefetch_line(c + 64, pull); /* fall through */
	default: prefetch_line(c, pull);
	}
}

/* Prefetches the home slots of pos[0..m) (into L2: a pull's): only a
 * hint, so it is harmless even if the index is replaced before they are
 * read. */
static inline __attribute__((always_inline)) void
prefetch_homes(const struct emb_shard *s, const struct batch *b,
	       const uint32_t *pos, uint32_t m)
{
	if (!s->nslots)
		return;
	for (uint32_t k = 0; k < m; k++)
		prefetch_l2(emb__shard_home(s, b->h[pos[k]]));
}

/*
 * First half of a pipelined lookup of pos[0..m) in shard s: prefetches the
 * home slots, then follows the first matching tag of each and prefetches
 * that record, leaving it in row[k] (NULL when no tag matches: absent).
 * The ids are not checked yet: verify_chunk() (or a pull's fast path,
 * pull_chunk_body()) does that once the records have had time to arrive.
 */
static inline __attribute__((always_inline)) void
resolve_chunk(const struct emb_table *t, const struct emb_shard *s,
	      const struct batch *b, const uint32_t *pos, uint32_t m,
	      struct emb_row_hdr **row, uint32_t *idx, unsigned lines)
{
	const uint32_t *home[PULL_CHUNK];
	const bool pull = !idx; /* only a pull passes no record indexes */
	uint32_t k;

	if (!s->nslots) {
		for (k = 0; k < m; k++)
			row[k] = NULL;
		return;
	}
	/* In locals: the stores to row[] and idx[] would otherwise make GCC
	 * load these again for every id. */
	const uint32_t *const slots = s->slots, nslots = s->nslots;
	const uint32_t *const end = slots + nslots;
	char *const *const slabs = s->slabs;
	const uint64_t div = t->slab_div;
	const uint32_t rps = t->rows_per_slab, row_bytes = t->row_bytes;
	const uint64_t *const h = b->h;
	uint32_t tag[PULL_CHUNK];

	for (k = 0; k < m; k++) {
		uint64_t hk = h[pos[k]];

		home[k] = &slots[emb_fastrange32((uint32_t)(hk >> 18), nslots)];
		tag[k] = emb__hash_tag(hk);
		prefetch(home[k], 0);
	}
	for (k = 0; k < m; k++) {
		const uint32_t *p = home[k];
		struct emb_row_hdr *r = NULL;

		for (; *p; p = p + 1 == end ? slots : p + 1) {
			if ((*p & ~EMB_SLOT_IDX_MASK) == tag[k]) {
				uint32_t i = (*p & EMB_SLOT_IDX_MASK) - 1;

				r = emb__slab_row(slabs, div, rps, row_bytes,
						  i);
				if (idx) {
					idx[k] = i;
					/* The word of the record's dirty
					 * mark: a push ORs into it, and
					 * cold it was a miss a row. */
					prefetch(&s->dirty[i >> 6], 1);
				}
				prefetch_row(t, r, pull, lines);
				break;
			}
		}
		row[k] = r;
	}
}

/* Second half: a tag that matched another id (1 in 256) takes the slow
 * path, which finds the id or reports it absent. */
static void verify_chunk(const struct emb_table *t, const struct emb_shard *s,
			 const uint64_t *ids, const struct batch *b,
			 const uint32_t *pos, uint32_t m,
			 struct emb_row_hdr **row, uint32_t *idx)
{
	for (uint32_t k = 0; k < m; k++) {
		uint64_t id = ids[pos[k]];
		int64_t found;

		if (!row[k] || row[k]->id == id)
			continue;
		found = emb__shard_find(t, s, id, b->h[pos[k]]);
		row[k] =
		    found < 0 ? NULL : emb__shard_row(t, s, (uint32_t)found);
		if (idx && found >= 0)
			idx[k] = (uint32_t)found;
	}
}

/*
 * A pull's resolve_chunk(), one copy per row line count (a table's
 * prefetch_lines, 1..PREFETCH_LINES), so that count is a constant in it.
 */
typedef void (*resolve_fn)(const struct emb_table *t,
			   const struct emb_shard *s, const struct batch *b,
			   const uint32_t *pos, uint32_t m,
			   struct emb_row_hdr **row);

#define RESOLVE_PULL(n)                                                       \
	static void resolve_pull_##n(const struct emb_table *t,               \
				     const struct emb_shard *s,               \
				     const struct batch *b,                   \
				     const uint32_t *pos, uint32_t m,         \
				     struct emb_row_hdr **row)                \
	{                                                                     \
		resolve_chunk(t, s, b, pos, m, row, NULL, n);                 \
	}
RESOLVE_PULL(1)
RESOLVE_PULL(2)
RESOLVE_PULL(3)
RESOLVE_PULL(4)
RESOLVE_PULL(5)
RESOLVE_PULL(6)
RESOLVE_PULL(7)
RESOLVE_PULL(8)
#undef RESOLVE_PULL

static const resolve_fn resolve_pull[PREFETCH_LINES + 1] = {
    NULL,	     resolve_pull_1, resolve_pull_2, resolve_pull_3,
    resolve_pull_4, resolve_pull_5, resolve_pull_6, resolve_pull_7,
    resolve_pull_8};

static void touch(struct emb_row_hdr *r, uint32_t step)
{
	r->last_step = step;
	if (r->count < EMB_ROW_COUNT_MAX)
		r->count++;
}

/*
 * A read's access: the last step, and the count unless count is false. A
 * tiered table's demotions go by both, but the count also keys a compact
 * row's stochastic rounding (apply_compact), which must see writes only:
 * the holders of a replicated table see the same writes, not the same
 * reads. Such a table's reads leave the count alone.
 */
static inline void touch_read(struct emb_row_hdr *r, uint32_t step,
			      bool count)
{
	if (count)
		touch(r, step);
	else
		r->last_step = step;
}

/* Creates and initialises the row for ids[p]; record pointer or NULL. */
static struct emb_row_hdr *create_row(struct emb_table *t, struct emb_shard *s,
				      uint64_t id, uint64_t h, int *rc)
{
	struct emb_row_hdr *r;
	int64_t idx;
	float *w;

	idx = emb__shard_insert(t, s, id, h);
	if (idx < 0) {
		*rc = (int)idx;
		return NULL;
	}
	r = emb__shard_row(t, s, (uint32_t)idx);
	w = emb__row_data(r);
	init_weights(t, id, w);
	emb_optim_state_init(&t->opts.optim, w + t->wwords, t->dim);
	emb__row_seal(t, r);
	return r;
}

static uint32_t now_step(const struct emb_table *t)
{
	return (uint32_t)load_stat(&t->step);
}

/* The shard's lifecycle part, or NULL while the table never had one. */
static struct emb_life_shard *life_of(struct emb_life_shard *life, uint32_t si)
{
	return life ? &life[si] : NULL;
}

/* Runs shard s's eviction hand after a group of nids ids (lock held). */
static void sweep(struct emb_table *t, struct emb_shard *s,
		  struct emb_life_shard *l, uint32_t step, uint32_t nids,
		  struct emb_evict_counts *ev)
{
	if (l && emb__evict_wanted(t, s, l))
		emb__evict_sweep(t, s, l, step, nids, ev);
}

static void add_evicted(struct emb_table *t, const struct emb_evict_counts *ev)
{
	uint64_t n = ev->ttl + ev->l2 + ev->cap;

	if (!n)
		return;
	__atomic_fetch_sub(&t->rows, n, __ATOMIC_RELAXED);
	add_stat(&t->rows_evicted, n);
	add_stat(&t->rows_evicted_ttl, ev->ttl);
	add_stat(&t->rows_evicted_l2, ev->l2);
	add_stat(&t->rows_evicted_cap, ev->cap);
}

/*
 * The per-shard batch loop that every batch operation (pull, push,
 * assign, erase) runs: for each shard that b's grouping gave ids, takes
 * the shard's lock once, runs body over its group, b->pos[lo..hi), and
 * lets go; stops after a body that returns false. The op's state is in
 * ctx.
 *
 * always_inline, and each body a static always_inline function passed by
 * name: once this is inlined into an op, body is a constant at the call,
 * so GCC inlines the body too and specialises the loop per op, as the
 * hand-written copies were (no indirect call per group; the pull's hot
 * loops are its chunk functions, called from inside its body, as before).
 */
typedef bool (*group_fn)(struct emb_table *t, struct emb_shard *s,
			 uint32_t si, uint32_t lo, uint32_t hi, void *ctx);

/*
 * Bulk work and the shard locks. A training batch reaches every shard,
 * and a push keeps each shard's lock until its last group is done
 * (push_groups()): one shard held long stalls every pull and push that
 * comes to it, and a push waiting for it holds all the shards it has.
 * Bulk work came in runs of one shard: a move's rows were read shard by
 * shard, so each of its batches of 2,048 was one shard's on the target
 * too, and a sweep erased 4,096 ids of one shard at a time. Those holds
 * lasted 2 to 8 ms on a busy 2-core host, more when the thread holding
 * the lock lost its core meanwhile, and training's steps took 56 to
 * 86 ms where their p99 was 3 to 5 (docs/benchmarks.md, "Bulk work and
 * the shard locks"). So bulk work (assign, erase, walks) holds a shard's
 * lock for at most BULK_HOLD rows at a time, and between two holds lets
 * in the batches that found the lock taken (shard_lock() counts them): a
 * mutex let go and taken again at once would keep them out, as glibc's
 * wakes a waiter but does not hand it the lock. Bulk work does not count
 * itself: a move's batches land on a target's two loops at once, often
 * in the same shard, and each yielding to the other would only slow the
 * move.
 */
#define BULK_HOLD     256u
#define BULK_YIELDS   64u /* sched_yield()s a bulk hold waits at most for
			     waiters between two holds */

/* Out of line: the wait is slow anyway, and GCC 12 inlined into some
 * callers took the counter for one past an array (-Wstringop-overflow). */
static __attribute__((noinline)) void shard_wait(struct emb_shard *s)
{
	__atomic_add_fetch(&s->waiting, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&s->lock);
	__atomic_sub_fetch(&s->waiting, 1, __ATOMIC_RELAXED);
}

static inline void shard_lock(struct emb_shard *s)
{
	if (pthread_mutex_trylock(&s->lock))
		shard_wait(s);
}

/* Lets go of s's lock, lets its waiters have it first, takes it again. */
static void shard_breathe(struct emb_shard *s)
{
	pthread_mutex_unlock(&s->lock);
	for (uint32_t i = 0;
	     i < BULK_YIELDS && __atomic_load_n(&s->waiting, __ATOMIC_RELAXED);
	     i++)
		sched_yield();
	pthread_mutex_lock(&s->lock);
}

static inline __attribute__((always_inline)) void
each_group(struct emb_table *t, const struct batch *b, group_fn body,
	   void *ctx)
{
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];
		uint32_t lo = b->start[si], hi = b->start[si + 1];
		bool go;

		if (lo == hi)
			continue;
		shard_lock(s);
		go = body(t, s, si, lo, hi, ctx);
		pthread_mutex_unlock(&s->lock);
		if (!go)
			break;
	}
}

/* each_group() for bulk work: a group over BULK_HOLD ids goes in pieces,
 * the lock let go between them (body must allow it: each id on its own). */
static inline __attribute__((always_inline)) void
each_group_bulk(struct emb_table *t, const struct batch *b, group_fn body,
		void *ctx)
{
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];
		uint32_t lo = b->start[si], hi = b->start[si + 1];
		bool go = true;

		if (lo == hi)
			continue;
		pthread_mutex_lock(&s->lock);
		for (uint32_t c = lo; go && c < hi; c += BULK_HOLD) {
			if (c != lo)
				shard_breathe(s);
			go = body(t, s, si, c,
				  hi - c > BULK_HOLD ? c + BULK_HOLD : hi, ctx);
		}
		pthread_mutex_unlock(&s->lock);
		if (!go)
			break;
	}
}

/*
 * The other walk over shards: every live record of every shard, each
 * shard under its lock (unseal_all, evict). body may remove the record
 * it is given (it is then free, and the walk goes on after it).
 */
typedef void (*row_fn)(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       struct emb_row_hdr *r, void *ctx);

static inline __attribute__((always_inline)) void
each_live_row(struct emb_table *t, row_fn body, void *ctx)
{
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];

		pthread_mutex_lock(&s->lock);
		for (uint32_t i = 0; i < s->next_idx; i++) {
			struct emb_row_hdr *r = emb__shard_row(t, s, i);

			if (!(r->count & EMB_ROW_FREE))
				body(t, s, i, r, ctx);
		}
		pthread_mutex_unlock(&s->lock);
	}
}

/*
 * A tiered table's batch: the ids its shards' indexes lack, looked up
 * in the cold maps and their blocks read from the device together
 * (tier.c), before the groups take the rows back one by one. Each shard
 * is locked only to look; a row that moves meanwhile is read again by
 * its take. NULL when nothing is cold (or memory is out: the takes then
 * read their own blocks).
 */
static struct emb_tier_pre *tier_read_ahead(struct emb_table *t,
					    const struct batch *b,
					    const uint64_t *ids)
{
	struct emb_tier_pre *p;

	if (!emb__tier_rows_cold(t))
		return NULL;
	p = emb__tier_pre_new();
	if (!p)
		return NULL;
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];
		uint32_t lo = b->start[si], hi = b->start[si + 1];

		if (lo == hi)
			continue;
		pthread_mutex_lock(&s->lock);
		for (uint32_t c = lo; c < hi; c++) {
			uint32_t q = b->pos[c];

			if (emb__shard_find(t, s, ids[q], b->h[q]) < 0)
				emb__tier_note(t, si, b->h[q], p);
		}
		pthread_mutex_unlock(&s->lock);
	}
	emb__tier_fetch(t, p);
	return p;
}

/* ---- pull ---- */

/* Counts a sighting of absent id under ls's admission (once per call):
 * true when the row may be created now; false while pending or on error
 * (*rc set). */
static bool admitted(struct emb_table *t, struct emb_life_shard *ls,
		     struct emb_admit_batch *ab, uint32_t n, uint64_t id,
		     int *rc)
{
	int a = emb__admit_batch_sight(t, ls, ab, n, id);

	if (a < 0)
		*rc = a;
	return a > 0;
}

/* Where a pull's rows go, and what it does to each; fixed for a call. */
struct pull_out {
	float *out;	     /* rows, dim words per id, or NULL: ptrs */
	const float **ptrs;  /* row pointers when out is NULL */
	uint8_t *found;	     /* per id: the row exists, or NULL */
	size_t row_sz;	     /* dim words in bytes */
	uint32_t dim;	     /* words of an out row: the table's dim
				(fp32 out) or weight words (raw out) */
	uint32_t step;	     /* the access time of touch() */
	bool track;	     /* the shard's policy reads access meta */
	bool count_reads;    /* track counts reads in the access count
				(else it sets the last step only) */
	bool decode;	     /* out is fp32 of a compact table: decode */
	bool raw;	     /* out is in the table's format (compact) */
	bool state;	     /* out rows are whole: weights, then state */
	uint32_t fmt;	     /* the table's row format */
};

/*
 * Copies a row's floats. vec is 64 or 32 in the copies of pull_chunk()
 * built for AVX-512 or AVX2 (whole vectors, then memcpy for a tail), 0
 * in the baseline one. glibc's memcpy was a sixth of a pull's
 * instructions, its size dispatch and call around a 256-byte copy that
 * four AVX-512 loads and stores do.
 */
static inline __attribute__((always_inline)) void
copy_row(void *restrict dst, const void *restrict src, size_t n, unsigned vec)
{
	typedef char v64 __attribute__((vector_size(64)));
	typedef char v32 __attribute__((vector_size(32)));
	char *d = dst;
	const char *s = src;
	size_t off = 0;

	/* Blocks of 128 bytes written out, then single vectors: a rolled
	 * loop's count, compare and branch doubled a row's instructions, and
	 * GCC's own unrolling of it added a computed entry longer still. */
#define COPY_VEC(T, at)                                                       \
	do {                                                                  \
		T x_;                                                         \
		memcpy(&x_, s + (at), sizeof(T));                            \
		memcpy(d + (at), &x_, sizeof(T));                            \
	} while (0)
	if (vec == 64) {
		for (; off + 128 <= n; off += 128) {
			COPY_VEC(v64, off);
			COPY_VEC(v64, off + 64);
		}
		if (off + 64 <= n) {
			COPY_VEC(v64, off);
			off += 64;
		}
	} else if (vec == 32) {
		for (; off + 128 <= n; off += 128) {
			COPY_VEC(v32, off);
			COPY_VEC(v32, off + 32);
			COPY_VEC(v32, off + 64);
			COPY_VEC(v32, off + 96);
		}
		for (; off + 32 <= n; off += 32)
			COPY_VEC(v32, off);
	}
#undef COPY_VEC
	if (off < n)
		memcpy(d + off, s + off, n - off);
}

/*
 * A pull's common case over one resolved chunk, in one tight loop: every
 * id whose record is resolved and holds it is served. The rest (absent,
 * or a tag that matched another id: 1 in 256) are listed in slow[] for
 * the general path of pull_common(); returns how many.
 *
 * size > 0 builds the copy for the plainest pull, the common one (a
 * server's copied replies make it): rows copied out (no pointers, no
 * found[]), no access meta to write, and rows of size bytes, a constant,
 * so the copy is its whole vectors with no loop. Those tests per row and
 * the copy's loop were 5 % and 5 % of a Zipf pull's time (docs/store.md,
 * "Fifth round").
 */
static inline __attribute__((always_inline)) uint32_t
pull_chunk_body(const uint64_t *ids, const uint32_t *pos, uint32_t m,
		struct emb_row_hdr *const *row, const struct pull_out *o,
		uint32_t *slow, unsigned vec, size_t size, bool decode)
{
	/* In locals: the copies write memory, so fields read through o
	 * would be loaded again for every row. */
	float *const out = o->out;
	const float **const ptrs = o->ptrs;
	uint8_t *const found = size ? NULL : o->found;
	const size_t row_sz = size ? size : o->row_sz;
	const uint32_t dim = size ? (uint32_t)(size / sizeof(float)) : o->dim;
	const uint32_t step = o->step;
	const bool track = size ? false : o->track;
	const bool count = o->count_reads;
	uint32_t nslow = 0;

	for (uint32_t k = 0; k < m; k++) {
		uint32_t p = pos[k];
		struct emb_row_hdr *r = row[k];

		if (__builtin_expect(!r || r->id != ids[p], 0)) {
			slow[nslow++] = k;
			continue;
		}
		/* Without an eviction policy nothing reads the access meta,
		 * and a pull stays read only: it dirties no line of the
		 * row, so the row is not written back to memory and a hot
		 * row's line is not passed between the cores of threads
		 * pulling it at once. */
		if (track)
			touch_read(r, step, count);
		if (found)
			found[p] = 1;
		if (decode)
			emb_rowfmt_decode(o->fmt, emb__row_data(r),
					  out + (size_t)p * dim, dim);
		else if (size || out)
			copy_row(out + (size_t)p * dim, emb__row_data(r),
				 row_sz, vec);
		else
			ptrs[p] = emb__row_data(r);
	}
	return nslow;
}

typedef uint32_t (*pull_chunk_fn)(const uint64_t *ids, const uint32_t *pos,
				  uint32_t m, struct emb_row_hdr *const *row,
				  const struct pull_out *o, uint32_t *slow);

/* One copy of the loop per vector width, general (size 0) or for the
 * plainest pull of size-byte rows. */
#define PULL_CHUNK_FN(name, vec, size)                                        \
	static uint32_t name(const uint64_t *ids, const uint32_t *pos,         \
			     uint32_t m, struct emb_row_hdr *const *row,       \
			     const struct pull_out *o, uint32_t *slow)         \
	{                                                                     \
		return pull_chunk_body(ids, pos, m, row, o, slow, vec, size,   \
				       false);                                \
	}
PULL_CHUNK_FN(pull_chunk_plain, 0, 0)

/* Compact rows into fp32: common/rowfmt.c picks the vector body. */
static uint32_t pull_chunk_decode(const uint64_t *ids, const uint32_t *pos,
				  uint32_t m, struct emb_row_hdr *const *row,
				  const struct pull_out *o, uint32_t *slow)
{
	return pull_chunk_body(ids, pos, m, row, o, slow, 0, 0, true);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* For one ISA: the general loop pull_chunk_ISA, and pull_sized_ISA[i] for
 * a plain pull of rows of 64 << i bytes (16, 32, 64 and 128 floats). */
#define PULL_CHUNK_FNS(isa, vec)                                              \
	PULL_CHUNK_FN(pull_chunk_##isa, vec, 0)                               \
	PULL_CHUNK_FN(pull_chunk_##isa##_64, vec, 64)                         \
	PULL_CHUNK_FN(pull_chunk_##isa##_128, vec, 128)                       \
	PULL_CHUNK_FN(pull_chunk_##isa##_256, vec, 256)                       \
	PULL_CHUNK_FN(pull_chunk_##isa##_512, vec, 512)                       \
	static const pull_chunk_fn pull_sized_##isa[4] = {                    \
	    pull_chunk_##isa##_64, pull_chunk_##isa##_128,                    \
	    pull_chunk_##isa##_256, pull_chunk_##isa##_512};
EMB_TARGET_BEGIN("avx512f")
PULL_CHUNK_FNS(avx512, 64)
EMB_TARGET_END
EMB_TARGET_BEGIN("avx2")
PULL_CHUNK_FNS(avx2, 32)
EMB_TARGET_END
#undef PULL_CHUNK_FNS
#endif
#undef PULL_CHUNK_FN

unsigned emb__pull_vec_max = 64;

void emb_store_set_vec_max(unsigned bits)
{
	emb__pull_vec_max = emb__optim_vec_max = emb__rowfmt_vec_max = bits;
}

/*
 * The loop for a pull that writes o (the CPU is asked per call, as
 * common/optim.c does). plain: rows copied out, no found[], no table
 * lifecycle; those of 64, 128, 256 or 512 bytes get a sized copy.
 */
static pull_chunk_fn pull_chunk(const struct pull_out *o, bool plain)
{
	if (o->decode)
		return pull_chunk_decode;
#if defined(__x86_64__) && defined(__GNUC__)
	const size_t sz = o->row_sz;
	/* 64 << i == sz for i in 0..3 */
	const int sized = plain && sz >= 64 && sz <= 512 && !(sz & (sz - 1))
			      ? __builtin_ctzll(sz) - 6
			      : -1;

	if (emb__pull_vec_max >= 64 && __builtin_cpu_supports("avx512f"))
		return sized >= 0 ? pull_sized_avx512[sized] : pull_chunk_avx512;
	if (emb__pull_vec_max >= 32 && __builtin_cpu_supports("avx2"))
		return sized >= 0 ? pull_sized_avx2[sized] : pull_chunk_avx2;
#endif
	(void)o;
	(void)plain;
	return pull_chunk_plain;
}

/* A pull call's state, shared by its groups (pull_group()). */
struct pull_ctx {
	const uint64_t *ids;	  /* the call's ids */
	uint32_t n;		  /* how many */
	bool create;		  /* make missing rows (no EMB_PULL_NOCREATE) */
	bool admitted;		  /* whatever admission (EMB_PULL_ADMITTED) */
	bool have_step;		  /* o.step holds the table's clock */
	const struct batch *b;	  /* hashes and groups */
	struct emb_life_shard *life; /* the table's lifecycle, or NULL */
	resolve_fn resolve;	  /* resolve_pull[] for the table's rows */
	pull_chunk_fn copy_chunk; /* the fast path, see pull_chunk() */
	struct pull_out o;	  /* where rows go; o.step: access time */
	uint64_t missing;	  /* ids absent when looked up */
	uint64_t created;	  /* rows made */
	uint64_t pending;	  /* ids not admitted yet */
	struct emb_admit_batch ab; /* ids sighted by admission */
	struct emb_evict_counts ev; /* rows the sweeps removed */
	struct emb_tier_pre *pre; /* a tiered table's read-ahead, or NULL */
	int rc;			  /* first error; stops the call */
};

/* Pulls shard s's group b->pos[lo..hi) (lock held); false on an error. */
/* Copies out a row a pull read from a tiered table's device without
 * bringing it back (emb__tier_take()), as the pull copies any row. */
static void copy_cold(const struct emb_table *t, const struct pull_out *o,
		      const struct emb_row_hdr *r, uint32_t p)
{
	const void *w = (const char *)r + EMB_ROW_HDR_SIZE;

	if (o->out && o->decode)
		emb_rowfmt_decode(t->fmt, w, o->out + (size_t)p * o->dim,
				  t->dim);
	else if (o->out)
		memcpy(o->out + (size_t)p * o->dim, w, o->row_sz);
}

static inline __attribute__((always_inline)) bool
pull_group(struct emb_table *t, struct emb_shard *s, uint32_t si, uint32_t lo,
	   uint32_t hi, void *ctx)
{
	struct pull_ctx *x = ctx;
	const uint64_t *const ids = x->ids;
	const struct batch *const b = x->b;
	const resolve_fn resolve = x->resolve;
	const pull_chunk_fn copy_chunk = x->copy_chunk;
	float *const out = x->o.out;
	const float **const ptrs = x->o.ptrs;
	uint8_t *const found = x->o.found;
	const size_t row_sz = x->o.row_sz;
	const bool create = x->create;
	struct emb_life_shard *ls = life_of(x->life, si);
	struct emb_row_hdr *rows[2][PULL_CHUNK];
	uint32_t used_at[2];
	bool track;
	int rc = 0;

	/* The policy is read under the shard lock it is set under. A
	 * tiered table's demotions pick rows by their last access. */
	track = emb__life_tracks(ls) || t->tier;
	if (t->tier) {
		rc = emb__tier_room(t, s, si, b->h, &b->pos[lo], hi - lo,
				    &x->ev);
		if (rc) {
			x->rc = rc;
			return false;
		}
	}
	/*
	 * Three chunks in flight: the home slots of chunk c + 2 are
	 * prefetched and chunk c + 1 is resolved (its records prefetched)
	 * before chunk c's records are read, so each miss has a whole
	 * chunk's work to arrive in. Chunks of 32 ids, with the prefetches
	 * into L2, were faster than 16 (by 8%) and 64; a push keeps 16, as
	 * before. Rows created meanwhile (s->used moved) may be ids an
	 * already-resolved chunk found absent, so its misses look again.
	 */
	resolve(t, s, b, &b->pos[lo], CHUNK_LEN(lo, hi), rows[0]);
	used_at[0] = s->used;
	x->o.track = track;
	x->o.count_reads = emb__life_tracks(ls) || !t->tier ||
			   t->fmt == EMB_ROWFMT_FP32 ||
			   t->opts.rounding != EMB_ROUND_STOCHASTIC;
	for (uint32_t c = lo, cur = 0; c < hi && !rc; c += PULL_CHUNK, cur ^= 1) {
		uint32_t m = CHUNK_LEN(c, hi), slow[PULL_CHUNK], nslow;

		if (c + 2 * PULL_CHUNK < hi)
			prefetch_homes(s, b, &b->pos[c + 2 * PULL_CHUNK],
				       CHUNK_LEN(c + 2 * PULL_CHUNK, hi));
		if (c + PULL_CHUNK < hi) {
			resolve(t, s, b, &b->pos[c + PULL_CHUNK],
				CHUNK_LEN(c + PULL_CHUNK, hi), rows[cur ^ 1]);
			used_at[cur ^ 1] = s->used;
		}
		nslow = copy_chunk(ids, &b->pos[c], m, rows[cur], &x->o, slow);
		for (uint32_t j = 0; j < nslow && !rc; j++) {
			uint32_t p = b->pos[c + slow[j]];
			struct emb_row_hdr *r = rows[cur][slow[j]];

			/* A tag that matched another id looks the id up; so
			 * does an absent one when rows were created since its
			 * chunk was resolved (it may be one of them). */
			if (r || s->used != used_at[cur]) {
				int64_t again =
				    emb__shard_find(t, s, ids[p], b->h[p]);

				r = again < 0 ? NULL
					      : emb__shard_row(t, s,
							       (uint32_t)again);
			}
			if (!r && t->tier) {
				bool in_dram;

				r = emb__tier_take(t, s, si, ids[p], b->h[p],
						   x->pre, false, &in_dram,
						   &rc);
				if (rc)
					break;
				if (r && !in_dram) {
					/* Read from the device and left
					 * there: copied out, not touched. */
					if (found)
						found[p] = 1;
					copy_cold(t, &x->o, r, p);
					continue;
				}
			}
			if (!r) {
				x->missing++;
				if (create && ls && ls->cfg.admit &&
				    !x->admitted &&
				    !admitted(t, ls, &x->ab, x->n, ids[p],
					      &rc)) {
					if (rc)
						break;
					x->pending++;
					if (found)
						found[p] = 0;
					if (out && (x->o.raw || x->o.state))
						emb_table_init_row_raw(
						    t, ids[p],
						    out + (size_t)p * x->o.dim);
					else if (out)
						emb_table_init_row(
						    t, ids[p],
						    out + (size_t)p * x->o.dim,
						    false);
					else
						ptrs[p] = NULL;
					if (out && x->o.state)
						emb_optim_state_init(
						    &t->opts.optim,
						    out + (size_t)p * x->o.dim +
							t->wwords,
						    t->dim);
					continue;
				}
				if (create) {
					r = create_row(t, s, ids[p], b->h[p],
						       &rc);
					if (!r)
						break;
					x->created++;
					if (!x->have_step) {
						x->o.step = now_step(t);
						x->have_step = true;
					}
					/* Being written anyway: its creation
					 * is an access. */
					if (!track)
						touch(r, x->o.step);
				}
			}
			if (found)
				found[p] = r != NULL;
			if (!r) {
				if (out)
					memset(out + (size_t)p * x->o.dim, 0,
					       row_sz);
				else
					ptrs[p] = NULL;
				continue;
			}
			if (track)
				touch_read(r, x->o.step, x->o.count_reads);
			if (out && x->o.decode)
				emb_rowfmt_decode(t->fmt, emb__row_data(r),
						  out + (size_t)p * x->o.dim,
						  t->dim);
			else if (out)
				memcpy(out + (size_t)p * x->o.dim,
				       emb__row_data(r), row_sz);
			else
				ptrs[p] = emb__row_data(r);
		}
	}
	sweep(t, s, ls, x->o.step, hi - lo, &x->ev);
	x->rc = rc;
	return !rc;
}

static int pull_common(struct emb_table *t, const uint64_t *ids, uint32_t n,
		       float *out, const float **ptrs, uint32_t flags,
		       uint8_t *found, bool raw)
{
	/* Raw rows of a compact table are its weight words, copied like
	 * fp32 rows of that many floats; fp32 rows of it are decoded. */
	const bool compact = t->fmt != EMB_ROWFMT_FP32;
	const bool state = flags & EMB_PULL_STATE;
	const uint32_t words = state ? t->row_floats
			       : raw ? t->wwords
				     : t->dim;
	struct emb_life_shard *life =
	    __atomic_load_n(&t->life, __ATOMIC_ACQUIRE);
	struct emb_table_stripe *st = emb__my_stripe(t);
	/* The table's clock is a line every push writes: a pull reads it
	 * only for a table that has had a lifecycle policy (whose access
	 * meta and eviction hand use it), or when it makes a row (its
	 * creation is its first access). */
	struct pull_ctx x = {.ids = ids,
			     .n = n,
			     .create = !(flags & EMB_PULL_NOCREATE),
			     .admitted = flags & EMB_PULL_ADMITTED,
			     .have_step = life != NULL,
			     .life = life,
			     .resolve = resolve_pull[t->prefetch_lines],
			     .o = {.out = out,
				   .ptrs = ptrs,
				   .found = found,
				   .row_sz = (size_t)words * sizeof(float),
				   .dim = words,
				   .step = life ? now_step(t) : 0,
				   .decode = compact && !raw && out,
				   .raw = compact && raw,
				   .state = state,
				   .fmt = t->fmt}};
	struct batch b;
	int rc;

	if (n && (!ids || (!out && !ptrs)))
		return EMB_EBADARG;
	if ((flags & ~(EMB_PULL_NOCREATE | EMB_PULL_STATE |
		       EMB_PULL_ADMITTED)) ||
	    (state && (!raw || !out)))
		return EMB_EBADARG;
	if (!n)
		return 0;
	if (t->tier) {
		/* Rows served are accesses the demotions go by. */
		x.o.step = emb__tier_tick(t);
		x.have_step = true;
	}
	x.copy_chunk = pull_chunk(&x.o, out && !found && !life && !t->tier);
	rc = batch_init(t, &b, n);
	if (rc)
		return rc;
	hash_group(t, &b, ids, n);
	x.b = &b;
	if (t->tier)
		x.pre = tier_read_ahead(t, &b, ids);
	each_group(t, &b, pull_group, &x);
	emb__tier_pre_free(x.pre);
	batch_fini(&b);
	emb__admit_batch_fini(&x.ab);

	add_evicted(t, &x.ev);
	add_stat(&st->pulls_unadmitted, x.pending);
	if (x.created)
		emb__arena_prepare(t->arena);
	add_stat(&t->rows, x.created);
	add_stat(&st->rows_created, x.created);
	add_stat(&st->pulls, 1);
	add_stat(&st->rows_pulled, n);
	if (!x.create)
		add_stat(&st->misses, x.missing);
	if (x.rc)
		return x.rc;
	return (int)x.missing;
}

int emb_table_pull(struct emb_table *t, const uint64_t *ids, uint32_t n,
		   float *out, uint32_t flags, uint8_t *found)
{
	if (!t || (n && !out))
		return EMB_EBADARG;
	return pull_common(t, ids, n, out, NULL, flags, found, false);
}

int emb_table_pull_raw(struct emb_table *t, const uint64_t *ids, uint32_t n,
		       void *out, uint32_t flags, uint8_t *found)
{
	if (!t || (n && !out))
		return EMB_EBADARG;
	return pull_common(t, ids, n, out, NULL, flags, found, true);
}

bool emb_table_tiered(const struct emb_table *t)
{
	return t && t->tier;
}

int emb_table_pull_ptrs(struct emb_table *t, const uint64_t *ids, uint32_t n,
			const float **ptrs, uint32_t flags)
{
	if (!t || (n && !ptrs))
		return EMB_EBADARG;
	/* A demotion frees records: no pointer into a tiered table's rows
	 * outlives the shard lock. */
	if (t->tier)
		return -EOPNOTSUPP;
	return pull_common(t, ids, n, NULL, ptrs, flags, NULL, true);
}

/* ---- push ---- */


/*
 * What a push's grouping found repeated: the gradients of each id that
 * occurs more than once, summed in batch order into a row of sums, and
 * which sum row each first occurrence takes. Both NULL when every id of
 * the batch is distinct (the client library's pushes, after its own
 * dedup): then each position's gradient is the caller's row.
 */
struct push_sums {
	const uint32_t *sum_of; /* per position: its row in sums, or
				   UINT32_MAX: the caller's gradient */
	float *sums;		/* dim floats per repeated id (scratch) */
	void *buf;		/* the scratch buffer sum_of lies in */
};

/*
 * Groups a push's positions by shard (as batch_group()) and checks for
 * repeated ids in the same pass: the counting loop probes a set of the
 * hashes seen so far (emb_id_hash is a bijection, so equal hashes are
 * equal ids, and the ids themselves are never read again). Only the
 * first occurrence of an id goes into its group; the later ones are
 * listed, and their gradients added to the first one's in a sum row.
 * So a batch with repeats gives the same rows as one with each id once
 * and the gradients summed, it never makes a row twice, and a batch of
 * distinct ids pays one probe per id and nothing else: no separate dedup
 * pass, no gradient pointers per id (docs/store.md, "One dedup per
 * push"). 0, or -ENOMEM (nothing is left to release then).
 */
static int group_push(struct emb_table *t, struct batch *b, uint32_t n,
		      const float *grads, struct push_sums *ps)
{
	const uint64_t *restrict h = b->h;
	uint32_t *restrict start = b->start;
	uint32_t *restrict pos = b->pos;
	const uint32_t smask = t->shard_mask;
	const size_t dim = t->dim;
	uint32_t *map, *rep = NULL, *of, *sum_of, *first;
	uint32_t nrep = 0, nsum = 0;
	uint64_t size = 16;
	uint32_t mask;
	float *sums;

	ps->sum_of = NULL;
	ps->sums = NULL;
	ps->buf = NULL;
	while (size < 2 * (uint64_t)n)
		size <<= 1;
	mask = (uint32_t)(size - 1);
	/* map[slot]: a batch position + 1 whose hash is there, 0 = empty. */
	map = emb__scratch(EMB_SCRATCH_DEDUP, (size_t)size * sizeof(*map));
	if (!map)
		return -ENOMEM;
	memset(map, 0, (size_t)size * sizeof(*map));
	memset(start, 0, (t->nshards + 1) * sizeof(*start));
	for (uint32_t i = 0; i < n; i++) {
		const uint64_t hi = h[i];
		uint32_t slot = (uint32_t)(hi >> 20) & mask, q;

		while ((q = map[slot]) && h[q - 1] != hi)
			slot = (slot + 1) & mask;
		if (__builtin_expect(!q, 1)) {
			map[slot] = i + 1;
			start[(hi & smask) + 1]++;
			continue;
		}
		/* A repeat: rep[] lists its position (in batch order), of[]
		 * the first occurrence's. One buffer, made at the first
		 * repeat: rep[n + 1], of[n], sum_of[n], first[n]. */
		if (!rep) {
			rep = emb__scratch(EMB_SCRATCH_UNIQ,
					   ((size_t)n * 4 + 1) * sizeof(*rep));
			if (!rep) {
				emb__scratch_done(map);
				return -ENOMEM;
			}
		}
		rep[nrep] = i;
		rep[n + 1 + nrep++] = q - 1;
	}
	emb__scratch_done(map);
	for (uint32_t si = 0, sum = 0; si <= t->nshards; si++) {
		sum += start[si];
		start[si] = sum;
	}
	/* start[s + 1] is used as the fill cursor of shard s, then restored. */
	if (!nrep) {
		for (uint32_t i = 0; i < n; i++)
			pos[start[h[i] & smask]++] = i;
		memmove(start + 1, start, t->nshards * sizeof(*start));
		start[0] = 0;
		b->npos = n;
		return 0;
	}
	of = rep + n + 1;
	sum_of = of + n;
	first = sum_of + n;
	/* Repeats stay out of the groups; a first occurrence has its own
	 * gradient (UINT32_MAX) until it is given a sum row below. rep[nrep]
	 * = n ends the list for the test. */
	rep[nrep] = n;
	for (uint32_t i = 0, d = 0; i < n; i++) {
		if (rep[d] == i) {
			d++;
			continue;
		}
		sum_of[i] = UINT32_MAX;
		pos[start[h[i] & smask]++] = i;
	}
	memmove(start + 1, start, t->nshards * sizeof(*start));
	start[0] = 0;
	b->npos = n - nrep;

	/* A sum row per repeated id, in the order of first occurrence. */
	for (uint32_t d = 0; d < nrep; d++) {
		uint32_t q = of[d];

		if (sum_of[q] == UINT32_MAX) {
			sum_of[q] = nsum;
			first[nsum++] = q;
		}
	}
	sums = emb__scratch(EMB_SCRATCH_SUMS, (size_t)nsum * dim * sizeof(*sums));
	if (!sums) {
		emb__scratch_done(rep);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < nsum; k++)
		memcpy(sums + (size_t)k * dim, grads + (size_t)first[k] * dim,
		       dim * sizeof(*sums));
	for (uint32_t d = 0; d < nrep; d++)
		emb_floats_add(sums + (size_t)sum_of[of[d]] * dim,
			       grads + (size_t)rep[d] * dim, dim);
	ps->sum_of = sum_of;
	ps->sums = sums;
	ps->buf = rep;
	return 0;
}

/*
 * What a push changed, kept until its verdict: the push holds the locks of
 * the shards it has reached until it ends, and a result that is not finite
 * anywhere puts every row back from here, so no row (in any shard) shows a
 * refused push. One entry per row reached, in order; a row that existed
 * has its whole record (header, floats, seal) in saved, one made by this
 * push is removed instead.
 */
struct push_undo {
	struct emb_row_hdr *r; /* the record */
	uint32_t si;	       /* its shard */
	bool created;	       /* made by this push: remove it */
	uint32_t idx;	       /* made again (births): its record index,
				  else UINT32_MAX */
	uint32_t birth;	       /* made again: its birth before the push */
};

/* A push call's state, shared by its groups (push_group()). */
struct push_ctx {
	const uint64_t *ids;	    /* the call's ids */
	const struct batch *b;	    /* hashes and groups */
	struct emb_life_shard *life; /* the table's lifecycle, or NULL */
	bool admitted;		    /* EMB_PUSH_ADMITTED: create absent rows
				       whatever the admission */
	const uint32_t *births;	    /* emb_table_push_births(), or NULL */
	bool primary;		    /* EMB_PUSH_PRIMARY */
	uint64_t stale;		    /* births: gradients dropped */
	const float *grads;	    /* the caller's, dim floats per id */
	struct push_sums ps;	    /* repeated ids' summed gradients */
	struct push_undo *undo;	    /* rows reached so far (scratch) */
	char *saved;		    /* row_bytes per undo entry */
	uint32_t nundo;		    /* entries in undo */
	float *tmp;		    /* compact tables: one fp32 row (weights
				       and state) the optimizer works on */
	uint32_t step;		    /* this push's step: the access time */
	bool bad;		    /* a result was not finite: refused */
	uint64_t bad_id;	    /* the first id whose result was not */
	uint64_t created;	    /* rows made */
	uint64_t applied;	    /* rows updated */
	uint64_t dropped;	    /* ids not admitted: not applied */
	struct emb_evict_counts ev; /* rows the sweeps removed */
	struct emb_tier_pre *pre;   /* a tiered table's read-ahead, or NULL */
	int rc;			    /* first error; the push goes on */
};

/*
 * Applies gradient g to record r of a compact table: the weights decoded
 * into tmp with the state after them, the optimizer in fp32, and the
 * result rounded back, stochastically by default with the key of the
 * row's update count (touch() counted this update already), so replicas
 * and reruns write the same bits. False when the result is not finite or
 * out of the format's range: the record may then hold a partial write,
 * which the refused push's undo puts back.
 */
static bool apply_compact(const struct emb_table *t, struct emb_row_hdr *r,
			  const float *g, float *tmp)
{
	char *data = (char *)emb__row_data(r);
	const size_t state = (size_t)(t->row_floats - t->wwords) * 4;

	emb_rowfmt_decode(t->fmt, data, tmp, t->dim);
	memcpy(tmp + t->dim, data + (size_t)t->wwords * 4, state);
	if (!emb_optim_apply_row(&t->opts.optim, tmp, g, t->dim))
		return false;
	if (!emb_rowfmt_encode(
		t->fmt, tmp, data, t->dim, t->opts.rounding,
		emb_rowfmt_sr_key(t->opts.seed, r->id, r->count)))
		return false;
	memcpy(data + (size_t)t->wwords * 4, tmp + t->dim, state);
	return true;
}

/* The id of the last row the calling thread's push found would become
 * non-finite (emb_table_nonfinite_id()). */
static _Thread_local uint64_t nonfinite_id;

uint64_t emb_table_nonfinite_id(void)
{
	return nonfinite_id;
}

void emb__table_count_nonfinite(struct emb_table *t, uint64_t n)
{
	add_stat(&t->rows_nonfinite, n);
}

/* The first of ids[0..n) whose stride floats at v are not all finite. */
static uint64_t first_nonfinite(const struct emb_table *t, const uint64_t *ids,
				uint32_t n, const float *v, uint32_t stride)
{
	(void)t;
	for (uint32_t i = 0; i < n; i++)
		if (!emb_floats_finite(v + (size_t)i * stride, stride))
			return ids[i];
	return 0;
}

/* What emb_table_push_births() does with a row (store.h). */
enum birth_verdict { BIRTH_APPLY, BIRTH_RENEW, BIRTH_DROP };

/*
 * The verdict for the gradient of id, which the slot's primary said was
 * of a row born want, on this holder's row r (record idx; NULL: absent).
 * BIRTH_APPLY on an absent row means: make it (set_birth() then gives it
 * want).
 */
static enum birth_verdict birth_verdict(const struct emb_table *t,
					const struct emb_shard *s,
					const struct emb_row_hdr *r,
					uint32_t idx, uint64_t id,
					uint32_t want, bool primary)
{
	const uint32_t sl = emb_id_slot(id);
	uint32_t have;

	if (!r)
		/* A primary gave every birth of its slots up to its
		 * counter: an absent one was removed since. A backup
		 * cannot tell a row it has not seen yet from one removed
		 * since, and makes it (docs/replication.md: a backup's
		 * check of its slots removes what its primary no longer
		 * has). */
		return (primary || ((__atomic_load_n(&t->lead[sl / 64],
						     __ATOMIC_RELAXED) >>
				     (sl % 64)) &
				    1)) &&
			       want <= emb_table_slot_birth(t, sl)
			   ? BIRTH_DROP
			   : BIRTH_APPLY;
	have = s->birth[idx];
	if (have == want)
		return BIRTH_APPLY;
	return have < want ? BIRTH_RENEW : BIRTH_DROP;
}

/* A row made again in place: initial weights and state, and a new row's
 * access count (push_group() counts this push's own). */
static void renew_row(const struct emb_table *t, struct emb_row_hdr *r)
{
	float *w = emb__row_data(r);

	init_weights(t, r->id, w);
	emb_optim_state_init(&t->opts.optim, w + t->wwords, t->dim);
	r->count = 1;
}

/* Gives the row of id, just made, the birth its primary named. */
static void set_birth(struct emb_table *t, struct emb_shard *s, uint64_t id,
		      uint64_t h, uint32_t b)
{
	int64_t idx = emb__shard_find(t, s, id, h);

	if (idx < 0)
		return;
	s->birth[idx] = b;
	emb__birth_raise(t, emb_id_slot(id), b);
}

/*
 * Applies shard s's group b->pos[lo..hi) (lock held, and kept by the
 * caller until the push's verdict); false once a result is not finite.
 */
static inline __attribute__((always_inline)) bool
push_group(struct emb_table *t, struct emb_shard *s, uint32_t si, uint32_t lo,
	   uint32_t hi, void *ctx)
{
	struct push_ctx *x = ctx;
	/* In locals: the row writes would make GCC load fields of x again
	 * for every row, and keep the counts in memory. */
	const uint64_t *const ids = x->ids;
	const struct batch *const b = x->b;
	const float *const grads = x->grads;
	const uint32_t *const sum_of = x->ps.sum_of;
	const float *const sums = x->ps.sums;
	const uint32_t *const births = x->births;
	const size_t dim = t->dim;
	const uint32_t step = x->step;
	const uint32_t row_bytes = t->row_bytes;
	struct push_undo *const undo = x->undo;
	char *const saved = x->saved;
	float *const tmp = x->tmp;
	uint32_t nundo = x->nundo;
	struct emb_life_shard *ls = life_of(x->life, si);
	uint64_t created = 0, applied = 0, dropped = 0;
	struct emb_row_hdr *rows[2][CHUNK];
	uint32_t idx[2][CHUNK];
	bool ok = true;

	if (t->tier) {
		int err = emb__tier_room(t, s, si, b->h, &b->pos[lo], hi - lo,
					 &x->ev);

		if (err) {
			if (!x->rc)
				x->rc = err;
			return true; /* the push goes on, as for a create */
		}
	}

	/*
	 * Pipelined as a pull is (pull_group()): the home slots of chunk
	 * c + 2 are prefetched and chunk c + 1 resolved (its records and
	 * dirty words prefetched) before chunk c is verified and applied.
	 * Resolving and verifying one chunk back to back waited for its
	 * home slots, then for its records and dirty words: on an AMD EPYC
	 * (AVX2) nearly half of emb_table_push's own samples in a Zipf SGD
	 * push. A push's ids are distinct (group_push() merged repeats),
	 * so a row this push creates is never one a resolved chunk found
	 * absent; an index grown meanwhile leaves the records, and so the
	 * resolved pointers, where they were, and verify_chunk() looks up
	 * the ids whose tag matched another in the index as it is now.
	 */
	resolve_chunk(t, s, b, &b->pos[lo], PUSH_CHUNK_LEN(lo, hi), rows[0],
		      idx[0], 0);
	for (uint32_t c = lo, cur = 0; c < hi && ok; c += CHUNK, cur ^= 1) {
		uint32_t m = PUSH_CHUNK_LEN(c, hi);

		if (c + 2 * CHUNK < hi)
			prefetch_homes(s, b, &b->pos[c + 2 * CHUNK],
				       PUSH_CHUNK_LEN(c + 2 * CHUNK, hi));
		if (c + CHUNK < hi)
			resolve_chunk(t, s, b, &b->pos[c + CHUNK],
				      PUSH_CHUNK_LEN(c + CHUNK, hi),
				      rows[cur ^ 1], idx[cur ^ 1], 0);
		verify_chunk(t, s, ids, b, &b->pos[c], m, rows[cur], idx[cur]);
		for (uint32_t k = 0; k < m; k++) {
			uint32_t p = b->pos[c + k];
			struct emb_row_hdr *r = rows[cur][k];
			struct push_undo *u = &undo[nundo];
			const float *g;
			float *w;
			int err = 0;

			if (!r && t->tier) {
				bool in_dram;

				r = emb__tier_take(t, s, si, ids[p], b->h[p],
						   x->pre, true, &in_dram,
						   &err);
				if (err) {
					if (!x->rc)
						x->rc = err;
					continue;
				}
				/* Back from the device: an existing row,
				 * which an undo puts back as it was. */
				if (r)
					idx[cur][k] = (uint32_t)emb__shard_find(
					    t, s, ids[p], b->h[p]);
			}
			if (births) {
				switch (birth_verdict(t, s, r, idx[cur][k],
						      ids[p], births[p],
						      x->primary)) {
				case BIRTH_DROP:
					x->stale++;
					continue;
				case BIRTH_RENEW:
					/* The holder's row is older than the
					 * gradient's: it is made again in
					 * place, and the undo can put the
					 * old one back. */
					memcpy(saved +
						   (size_t)nundo * row_bytes,
					       r, row_bytes);
					u->created = false;
					u->idx = idx[cur][k];
					u->birth = s->birth[idx[cur][k]];
					emb__row_write(t, s, idx[cur][k]);
					renew_row(t, r);
					s->birth[idx[cur][k]] = births[p];
					emb__birth_raise(t,
							 emb_id_slot(ids[p]),
							 births[p]);
					goto reached;
				case BIRTH_APPLY:
					break;
				}
			}
			if (!r && ls && ls->cfg.admit && !x->admitted &&
			    !births) {
				dropped++;
				continue;
			}
			if (!r) {
				/* Marked by the insert. */
				r = create_row(t, s, ids[p], b->h[p], &err);
				if (!r) {
					if (!x->rc)
						x->rc = err;
					continue;
				}
				if (births)
					set_birth(t, s, ids[p], b->h[p],
						  births[p]);
				u->created = true;
				created++;
				/* Its creation is an access, as a pull's is,
				 * and the push another: a row counts the same
				 * whether a pull or this push made it, so a
				 * backup (which sees no pulls) keeps the
				 * count, and with it the rounding key, of its
				 * primary. */
				r->count = 1;
			} else {
				memcpy(saved + (size_t)nundo * row_bytes, r,
				       row_bytes);
				u->created = false;
				u->idx = UINT32_MAX;
				emb__row_write(t, s, idx[cur][k]);
			}
		reached:
			u->r = r;
			u->si = si;
			nundo++;
			touch(r, step);
			w = emb__row_data(r);
			g = sum_of && sum_of[p] != UINT32_MAX
				? sums + (size_t)sum_of[p] * dim
				: grads + (size_t)p * dim;
			/* Checked after the optimizer, every copy of it
			 * alike: finite gradients can still overflow a row
			 * (or its state), and one summed from repeats can
			 * overflow on its own. */
			if (__builtin_expect(
				tmp ? !apply_compact(t, r, g, tmp)
				    : !emb_optim_apply_row(&t->opts.optim, w,
							   g, t->dim),
				0)) {
				x->bad = true;
				x->bad_id = ids[p];
				ok = false;
				break;
			}
			emb__row_seal(t, r);
			applied++;
		}
	}
	x->nundo = nundo;
	x->created += created;
	x->applied += applied;
	x->dropped += dropped;
	if (ok)
		sweep(t, s, ls, step, hi - lo, &x->ev);
	return ok;
}

/*
 * Puts back every row a refused push reached, newest first, while it
 * still holds their shards' locks: a row it made is removed, any other
 * gets its whole record back (floats, access meta and seal).
 */
static void push_undo(struct emb_table *t, struct push_ctx *x)
{
	for (uint32_t i = x->nundo; i-- > 0;) {
		struct push_undo *u = &x->undo[i];
		struct emb_shard *s = &t->shards[u->si];

		if (u->created) {
			uint64_t h = emb_id_hash(u->r->id);
			int64_t idx = emb__shard_find(t, s, u->r->id, h);

			if (idx >= 0)
				emb__shard_remove(t, s, (uint32_t)idx, h);
			continue;
		}
		memcpy(u->r, x->saved + (size_t)i * t->row_bytes,
		       t->row_bytes);
		/* A row the push made again gets its old birth back (the
		 * slot's counter stays raised: births only grow). */
		if (u->idx != UINT32_MAX)
			s->birth[u->idx] = u->birth;
	}
}

/*
 * Runs push_group() over b's groups in shard order, like each_group(),
 * but keeps each shard's lock until every group is done: the verdict
 * (every result finite, or the push refused and undone) is reached while
 * no other batch can see or change a row the push reached. Shards are
 * locked in increasing order, as every batch that holds more than one at
 * a time does (views), so this cannot deadlock.
 */
static void push_groups(struct emb_table *t, const struct batch *b,
			struct push_ctx *x)
{
	uint32_t last = 0;
	bool any = false;

	for (uint32_t si = 0; si < t->nshards; si++) {
		uint32_t lo = b->start[si], hi = b->start[si + 1];

		if (lo == hi)
			continue;
		shard_lock(&t->shards[si]);
		last = si;
		any = true;
		if (!push_group(t, &t->shards[si], si, lo, hi, x))
			break;
	}
	if (x->bad)
		push_undo(t, x);
	for (uint32_t si = 0; any && si <= last; si++)
		if (b->start[si] != b->start[si + 1])
			pthread_mutex_unlock(&t->shards[si].lock);
}

static int push_call(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     const float *grads, const uint32_t *births,
		     uint32_t flags);

int emb_table_push(struct emb_table *t, const uint64_t *ids, uint32_t n,
		   const float *grads)
{
	return emb_table_push_flags(t, ids, n, grads, 0);
}

int emb_table_push_flags(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 const float *grads, uint32_t flags)
{
	if (flags & ~EMB_PUSH_ADMITTED)
		return EMB_EBADARG;
	return push_call(t, ids, n, grads, NULL, flags);
}

int emb_table_push_births(struct emb_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads,
			  const uint32_t *births, uint32_t flags)
{
	if (!t || !emb_table_has_births(t) || (n && !births) ||
	    (flags & ~(EMB_PUSH_ADMITTED | EMB_PUSH_PRIMARY)))
		return EMB_EBADARG;
	return push_call(t, ids, n, grads, births, flags);
}

static int push_call(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     const float *grads, const uint32_t *births,
		     uint32_t flags)
{
	struct push_ctx x = {.ids = ids,
			     .grads = grads,
			     .admitted = flags & EMB_PUSH_ADMITTED,
			     .births = births,
			     .primary = flags & EMB_PUSH_PRIMARY};
	struct emb_table_stripe *st;
	struct batch b;
	int rc;

	if (!t || (n && (!ids || !grads)))
		return EMB_EBADARG;
	if (!n)
		return 0;
	if (!emb_floats_finite(grads, (size_t)n * t->dim)) {
		nonfinite_id = first_nonfinite(t, ids, n, grads, t->dim);
		return EMB_ENONFINITE;
	}
	x.life = __atomic_load_n(&t->life, __ATOMIC_ACQUIRE);
	/* Inside the fence, so that a view's step counts whole batches. */
	emb__writer_enter(t);
	if (t->tier) {
		/* The step is remembered against the tier's clock (ttl
		 * counts steps, rows keep ticks: tier.c, emb__tier_step). */
		(void)emb__tier_step(t);
		x.step = emb__tier_tick(t); /* one clock for pulls and pushes */
	} else {
		x.step = (uint32_t)__atomic_add_fetch(&t->step, 1,
						      __ATOMIC_RELAXED);
	}
	rc = batch_init(t, &b, n);
	if (rc) {
		emb__writer_exit(t);
		return rc;
	}
	hash_all(b.h, ids, n);
	x.undo = emb__scratch(EMB_SCRATCH_UNDO,
			      (size_t)n * (sizeof(*x.undo) + t->row_bytes));
	if (!x.undo) {
		batch_fini(&b);
		emb__writer_exit(t);
		return -ENOMEM;
	}
	x.saved = (char *)(x.undo + n);
	if (t->fmt != EMB_ROWFMT_FP32) {
		x.tmp = emb__scratch(EMB_SCRATCH_ROW,
				     ((size_t)t->dim + t->row_floats) *
					 sizeof(float));
		if (!x.tmp) {
			emb__scratch_done(x.undo);
			batch_fini(&b);
			emb__writer_exit(t);
			return -ENOMEM;
		}
	}
	rc = group_push(t, &b, n, grads, &x.ps);
	if (!rc) {
		x.b = &b;
		if (t->tier)
			x.pre = tier_read_ahead(t, &b, ids);
		push_groups(t, &b, &x);
		emb__tier_pre_free(x.pre);
		rc = x.rc;
	}
	if (x.bad) {
		/* The rows it made are gone again; nothing was applied. */
		x.created = x.applied = 0;
		nonfinite_id = x.bad_id;
		rc = EMB_ENONFINITE;
	}
	add_stat(&t->rows, x.created);
	add_evicted(t, &x.ev);
	st = emb__my_stripe(t);
	add_stat(&st->pushes_unadmitted, x.dropped);
	add_stat(&t->births_dropped, x.stale);
	add_stat(&st->rows_created, x.created);
	add_stat(&st->pushes, !x.bad);
	add_stat(&st->rows_pushed, x.applied);
	emb__scratch_done(x.undo);
	emb__scratch_done(x.tmp);
	emb__scratch_done(x.ps.sums);
	emb__scratch_done(x.ps.buf);
	batch_fini(&b);
	emb__writer_exit(t);
	/* Out of the view's fence too: a dump's instant need not wait. */
	if (x.created)
		emb__arena_prepare(t->arena);
	return rc;
}

bool emb_table_row_finite(const struct emb_table *t, const float *row)
{
	const uint32_t adam = t->opts.optim.kind == EMB_OPTIM_ADAM;
	float w[EMB_DIM_MAX];

	if (t->fmt == EMB_ROWFMT_FP32)
		return emb_floats_finite(row, t->row_floats - adam);
	/* An int8 row's scale and bias, then its decoded weights: a finite
	 * scale and bias can still make an infinite weight. */
	if (t->fmt == EMB_ROWFMT_INT8 && !emb_floats_finite(row, 2))
		return false;
	emb_rowfmt_decode(t->fmt, row, w, t->dim);
	return emb_floats_finite(w, t->dim) &&
	       emb_floats_finite(row + t->wwords,
				 t->row_floats - t->wwords - adam);
}

/* The first of ids[0..n) whose full row at rows (stride words) is not
 * finite (emb_table_row_finite()), or 0. */
static uint64_t first_bad_row(const struct emb_table *t, const uint64_t *ids,
			      uint32_t n, const float *rows, uint32_t stride,
			      bool *bad)
{
	for (uint32_t i = 0; i < n; i++)
		if (!emb_table_row_finite(t, rows + (size_t)i * stride)) {
			*bad = true;
			return ids[i];
		}
	*bad = false;
	return 0;
}

/* An assign call's state, shared by its groups (assign_group()). */
struct assign_ctx {
	const uint64_t *ids;		 /* the call's ids */
	const struct batch *b;		 /* hashes and groups */
	const float *rows;		 /* stride floats per id */
	const uint32_t *enc;		 /* compact, without state: the rows
					    encoded, wwords words per id */
	const struct emb_row_meta *meta; /* per id, or NULL: now, count 0 */
	const uint32_t *births;		 /* per id, or NULL: the slot's next */
	uint32_t stride;		 /* row_floats with state, else dim */
	bool with_state;		 /* rows carry optimizer state */
	uint32_t step;			 /* last_step when meta is NULL */
	uint64_t created;		 /* rows made */
	struct emb_evict_counts ev;	 /* rows evicted making room */
	int rc;				 /* first error; the assign goes on */
};

#define ASSIGN_AHEAD 16u /* ids an assign prefetches home slots ahead */

/* Overwrites the rows of shard s's group b->pos[lo..hi) (lock held). */
static inline __attribute__((always_inline)) bool
assign_group(struct emb_table *t, struct emb_shard *s, uint32_t si,
	     uint32_t lo, uint32_t hi, void *ctx)
{
	struct assign_ctx *x = ctx;
	const uint64_t *const ids = x->ids;
	const struct batch *const b = x->b;
	const uint32_t stride = x->stride;

	if (t->tier) {
		int err = emb__tier_room(t, s, si, b->h, &b->pos[lo], hi - lo,
					 &x->ev);

		if (err) {
			if (!x->rc)
				x->rc = err;
			return true;
		}
	}
	/* The home slots ASSIGN_AHEAD ids ahead: a fill's rows are new to
	 * this server, so each lookup missed in the index and waited for
	 * its line, a quarter of the target's time in a join (the records
	 * themselves are written in order, into fresh slabs). */
	prefetch_homes(s, b, &b->pos[lo],
		       hi - lo < ASSIGN_AHEAD ? hi - lo : ASSIGN_AHEAD);
	for (uint32_t c = lo; c < hi; c++) {
		uint32_t p = b->pos[c];
		int64_t idx;
		struct emb_row_hdr *r;
		bool cold = false;
		float *w;

		if (c + ASSIGN_AHEAD < hi)
			prefetch_homes(s, b, &b->pos[c + ASSIGN_AHEAD], 1);
		idx = emb__shard_find(t, s, ids[p], b->h[p]);

		if (idx < 0 && t->tier) {
			int err;

			/* Assigned over: its cold copy goes. */
			cold = emb__tier_forget(t, si, ids[p], b->h[p], true,
						 &err);
			if (err) {
				if (!x->rc)
					x->rc = err;
				continue;
			}
		}
		if (idx < 0) {
			idx = emb__shard_insert(t, s, ids[p], b->h[p]);
			if (idx < 0) {
				if (!x->rc)
					x->rc = (int)idx;
				continue;
			}
			x->created += !cold;
		}
		r = emb__shard_row(t, s, (uint32_t)idx);
		emb__row_write(t, s, (uint32_t)idx);
		w = emb__row_data(r);
		if (x->enc)
			memcpy(w, x->enc + (size_t)p * t->wwords,
			       (size_t)t->wwords * 4);
		else
			memcpy(w, x->rows + (size_t)p * stride,
			       (size_t)stride * sizeof(*w));
		if (!x->with_state)
			emb_optim_state_init(&t->opts.optim, w + t->wwords,
					     t->dim);
		emb__row_seal(t, r);
		if (x->meta) {
			r->last_step = x->meta[p].last_step;
			r->count = x->meta[p].count & EMB_ROW_COUNT_MAX;
		} else {
			r->last_step = x->step;
			r->count = 0;
		}
		/* Under the shard lock with the row: no push naming births
		 * sees the row with another birth than its primary's. */
		if (x->births && s->birth &&
		    x->births[p] != EMB_BIRTH_NONE) {
			s->birth[idx] = x->births[p];
			emb__birth_raise(t, emb_id_slot(ids[p]), x->births[p]);
		}
	}
	return true;
}

int emb_table_assign(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     const float *rows, bool with_state,
		     const struct emb_row_meta *meta)
{
	return emb_table_assign_births(t, ids, n, rows, with_state, meta,
				       NULL);
}

int emb_table_assign_births(struct emb_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state,
			    const struct emb_row_meta *meta,
			    const uint32_t *births)
{
	struct assign_ctx x = {.ids = ids,
			       .rows = rows,
			       .meta = meta,
			       .births = births,
			       .with_state = with_state};
	uint32_t *enc = NULL;
	struct batch b;
	int rc;

	if (!t || (n && (!ids || !rows)))
		return EMB_EBADARG;
	if (!n)
		return 0;
	x.stride = with_state ? t->row_floats : t->dim;
	if (with_state && t->fmt != EMB_ROWFMT_FP32) {
		bool bad;
		uint64_t id = first_bad_row(t, ids, n, rows, x.stride, &bad);

		if (bad) {
			nonfinite_id = id;
			return EMB_ENONFINITE;
		}
	} else if (!emb_floats_finite(rows, (size_t)n * x.stride)) {
		nonfinite_id = first_nonfinite(t, ids, n, rows, x.stride);
		return EMB_ENONFINITE;
	}
	/* fp32 weights into a compact table: rounded to nearest first, so
	 * that a value out of the format's range refuses the call whole. */
	if (!with_state && t->fmt != EMB_ROWFMT_FP32) {
		enc = malloc((size_t)n * t->wwords * 4);
		if (!enc)
			return -ENOMEM;
		for (uint32_t i = 0; i < n; i++)
			if (!emb_rowfmt_encode(t->fmt, rows + (size_t)i * t->dim,
					       enc + (size_t)i * t->wwords,
					       t->dim, EMB_ROUND_NEAREST, 0)) {
				nonfinite_id = ids[i];
				free(enc);
				return EMB_ENONFINITE;
			}
		x.enc = enc;
	}
	emb__writer_enter(t);
	x.step = t->tier ? emb__tier_tick(t) : now_step(t);
	rc = batch_init(t, &b, n);
	if (rc) {
		emb__writer_exit(t);
		free(enc);
		return rc;
	}
	hash_group(t, &b, ids, n);
	x.b = &b;
	each_group_bulk(t, &b, assign_group, &x);
	batch_fini(&b);
	emb__writer_exit(t);
	free(enc);
	if (x.created)
		emb__arena_prepare(t->arena);
	add_stat(&t->rows, x.created);
	add_evicted(t, &x.ev);
	return x.rc;
}

bool emb_table_remote(const struct emb_table *t, struct emb_table_remote *out)
{
	if (!t || !__atomic_load_n(&t->sealed, __ATOMIC_RELAXED))
		return false;
	out->seed = t->seal_seed;
	out->rec_bytes = t->row_bytes;
	out->row_floats = t->row_floats;
	return true;
}

int64_t emb_table_locate(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 uint64_t *addrs)
{
	int64_t found = 0;

	if (!t || !__atomic_load_n(&t->sealed, __ATOMIC_RELAXED) ||
	    (n && (!ids || !addrs)))
		return EMB_EBADARG;
	/* One lock per id: a lookup is rare next to the READs it enables.
	 * Only the index is looked at: a tiered table's cold rows (on the
	 * device) have no record to READ and answer 0 like absent ones, so
	 * the reader pulls them two-sided (which serves them from the
	 * device) and asks again later, when they may be back in DRAM. */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t h = emb_id_hash(ids[i]);
		struct emb_shard *s = &t->shards[h & t->shard_mask];
		int64_t idx;

		pthread_mutex_lock(&s->lock);
		idx = s->slots ? emb__shard_find(t, s, ids[i], h) : -1;
		addrs[i] = idx < 0 ? 0
				   : (uint64_t)(uintptr_t)emb__shard_row(
					 t, s, (uint32_t)idx);
		pthread_mutex_unlock(&s->lock);
		found += idx >= 0;
	}
	return found;
}

/* Breaks live record r's seal (unseal_all). */
static inline __attribute__((always_inline)) void
break_seal(struct emb_table *t, struct emb_shard *s, uint32_t idx,
	   struct emb_row_hdr *r, void *ctx)
{
	uint64_t *seal = (uint64_t *)(void *)((char *)r + t->row_bytes - 8);

	(void)s;
	(void)idx;
	(void)ctx;
	__atomic_store_n(seal, ~*seal, __ATOMIC_RELAXED);
}

void emb_table_unseal_all(struct emb_table *t)
{
	if (!t || !__atomic_load_n(&t->sealed, __ATOMIC_RELAXED))
		return;
	/* Writers read the flag under their shard's lock: once a shard's
	 * lock was taken here, none of them seals in it again. Free records
	 * are broken already: flipping them back is what must not happen,
	 * so only live ones are walked. */
	__atomic_store_n(&t->sealed, false, __ATOMIC_RELAXED);
	each_live_row(t, break_seal, NULL);
}

/* An erase call's state, shared by its groups (erase_group()). */
struct erase_ctx {
	const uint64_t *ids;   /* the call's ids */
	const struct batch *b; /* hashes and groups */
	uint64_t erased;       /* rows removed */
	int rc;		       /* a tier's read error; the others go on */
};

/* Removes the ids of shard s's group b->pos[lo..hi) (lock held). */
static inline __attribute__((always_inline)) bool
erase_group(struct emb_table *t, struct emb_shard *s, uint32_t si,
	    uint32_t lo, uint32_t hi, void *ctx)
{
	struct erase_ctx *x = ctx;

	for (uint32_t c = lo; c < hi; c++) {
		uint32_t p = x->b->pos[c];
		int64_t idx = emb__shard_find(t, s, x->ids[p], x->b->h[p]);
		int err = 0;

		if (idx >= 0) {
			emb__shard_remove(t, s, (uint32_t)idx, x->b->h[p]);
			x->erased++;
		} else if (t->tier &&
			   emb__tier_forget(t, si, x->ids[p], x->b->h[p],
					    false, &err)) {
			/* Recorded as emb__shard_remove() records one. */
			emb__dirty_erased(s, x->ids[p]);
			x->erased++;
		}
		if (err && !x->rc)
			x->rc = err;
	}
	return true;
}

uint32_t emb_table_reserve(struct emb_table *t, uint64_t rows)
{
	uint32_t sized = 0;
	uint64_t per;

	if (!t || !rows || t->tier)
		return 0;
	/* A shard's share, plus four standard deviations of it (ids fall
	 * on shards at random) and a little. */
	per = rows / t->nshards;
	per += 4 * (uint64_t)sqrt((double)per) + 16;
	if (per > UINT32_MAX)
		per = UINT32_MAX;
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];

		pthread_mutex_lock(&s->lock);
		sized += emb__shard_reserve(t, s, (uint32_t)per);
		pthread_mutex_unlock(&s->lock);
	}
	return sized;
}

int emb_table_erase(struct emb_table *t, const uint64_t *ids, uint32_t n)
{
	struct erase_ctx x = {.ids = ids};
	struct batch b;
	int rc;

	if (!t || (n && !ids))
		return EMB_EBADARG;
	if (!n)
		return 0;
	emb__writer_enter(t);
	rc = batch_init(t, &b, n);
	if (rc) {
		emb__writer_exit(t);
		return rc;
	}
	hash_group(t, &b, ids, n);
	x.b = &b;
	each_group_bulk(t, &b, erase_group, &x);
	batch_fini(&b);
	emb__writer_exit(t);
	__atomic_fetch_sub(&t->rows, x.erased, __ATOMIC_RELAXED);
	add_stat(&t->rows_erased, x.erased);
	if (x.rc)
		return x.rc;
	return (int)x.erased;
}

/* emb_table_evict()'s test, per live record. */
struct evict_ctx {
	uint32_t step;		 /* the table's clock now */
	uint32_t max_idle_steps; /* 0 = no idle test */
	uint32_t min_count;	 /* 0 = no count test */
	bool tiered;		 /* last_step is a tick: idle and upto */
	bool idle;		 /* tiered: some rows may be idle past it */
	uint32_t upto;		 /* tiered: ticks at or before it are */
	uint64_t evicted;	 /* rows removed */
};

static inline __attribute__((always_inline)) void
evict_row(struct emb_table *t, struct emb_shard *s, uint32_t idx,
	  struct emb_row_hdr *r, void *ctx)
{
	struct evict_ctx *x = ctx;
	uint32_t age = x->step - r->last_step;
	bool old = x->tiered ? x->idle && (int32_t)(r->last_step - x->upto) <= 0
			     : x->max_idle_steps && age > x->max_idle_steps;

	if (emb__evict_held(t, r->id))
		return;
	if (old || (x->min_count && r->count < x->min_count)) {
		emb__shard_remove(t, s, idx, emb_id_hash(r->id));
		x->evicted++;
	}
}

/*
 * emb_table_evict()'s cold rows: the blocks whose newest access is idle
 * past max_idle_steps are found without a read, and read only for their
 * ids; min_count reads every cold block (the counts are only on the
 * device). 0 or the first read error (the other
 * shards are still done).
 */
static int evict_cold(struct emb_table *t, struct evict_ctx *x)
{
	/* A tick of its own: a block read at or after it is a batch's. */
	struct emb_tier_evict e = {.now = emb__tier_tick(t),
				   .idle = x->idle,
				   .upto = x->upto,
				   .min_count = x->min_count,
				   .all = true};
	int rc = 0;

	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];
		struct emb_evict_counts ev = {0};
		int err;

		pthread_mutex_lock(&s->lock);
		err = emb__tier_evict(t, s, si, &e, &ev);
		pthread_mutex_unlock(&s->lock);
		x->evicted += ev.ttl + ev.count;
		if (err && !rc)
			rc = err;
	}
	return rc;
}

uint32_t emb_table_now(const struct emb_table *t)
{
	return t->tier ? emb__tier_now(t) : now_step(t);
}

void emb_table_evict_hold(struct emb_table *t, const uint64_t *set)
{
	bool any = false, changed = false;

	if (!t)
		return;
	for (uint32_t w = 0; w < EMB_NSLOTS / 64; w++) {
		uint64_t v = set ? set[w] : 0;

		changed |= __atomic_exchange_n(&t->evict_hold[w], v,
					       __ATOMIC_RELAXED) != v;
		any |= v != 0;
	}
	__atomic_store_n(&t->evict_hold_any, any, __ATOMIC_RELEASE);
	/* Each shard's count of held rows is now stale: the next eviction
	 * that needs it counts it again (emb__shard_held()). Counting here
	 * walked every record of every shard under its lock for each map
	 * that changed the hold, a dozen maps a move, on tables with no
	 * max_rows too: a tenth of a joining job's server time, and shard
	 * locks held for milliseconds in the middle of training. */
	if (changed)
		__atomic_add_fetch(&t->evict_hold_gen, 1, __ATOMIC_RELEASE);
}

void emb_table_lead(struct emb_table *t, const uint64_t *set)
{
	if (!t)
		return;
	for (uint32_t w = 0; w < EMB_NSLOTS / 64; w++)
		__atomic_store_n(&t->lead[w], set ? set[w] : 0,
				 __ATOMIC_RELAXED);
}

int64_t emb_table_evict(struct emb_table *t, uint32_t max_idle_steps,
			uint32_t min_count)
{
	struct evict_ctx x = {.max_idle_steps = max_idle_steps,
			      .min_count = min_count};
	int rc = 0;

	if (!t)
		return EMB_EBADARG;
	if (!max_idle_steps && !min_count)
		return 0;
	x.step = now_step(t);
	if (t->tier) {
		x.tiered = true;
		x.idle = max_idle_steps &&
			 emb__tier_idle_upto(t, max_idle_steps, &x.upto);
	}
	each_live_row(t, evict_row, &x);
	if (t->tier)
		rc = evict_cold(t, &x);
	__atomic_fetch_sub(&t->rows, x.evicted, __ATOMIC_RELAXED);
	add_stat(&t->rows_evicted, x.evicted);
	return rc ? rc : (int64_t)x.evicted;
}

void emb_table_stats(struct emb_table *t, struct emb_table_stats *out)
{
	uint64_t index_bytes = 0, slab_bytes = 0, slot_bytes = 0, ext_bytes;

	memset(out, 0, sizeof(*out));
	/* No shard lock: stats may be called from an extent hook, which runs
	 * while a shard grows under its lock. */
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];

		index_bytes +=
		    ((uint64_t)__atomic_load_n(&s->nslots, __ATOMIC_RELAXED) +
		     __atomic_load_n(&s->next_nslots, __ATOMIC_RELAXED)) *
		    sizeof(*s->slots);
		slab_bytes +=
		    (uint64_t)__atomic_load_n(&s->nslabs, __ATOMIC_RELAXED) *
		    t->slab_alloc_bytes;
		slot_bytes +=
		    (uint64_t)__atomic_load_n(&s->vslot_cap, __ATOMIC_RELAXED) *
			sizeof(uint16_t) +
		    (uint64_t)__atomic_load_n(&s->birth_cap, __ATOMIC_RELAXED) *
			sizeof(uint32_t);
	}
	/* A table that numbers its rows: its counters too (birth.c). */
	if (__atomic_load_n(&t->births_on, __ATOMIC_ACQUIRE))
		slot_bytes += EMB_NSLOTS * sizeof(uint32_t);
	out->rows = load_stat(&t->rows);
	out->slab_bytes = slab_bytes;
	out->index_bytes = index_bytes;
	out->bytes = slab_bytes + index_bytes + slot_bytes + t->fixed_bytes;
	out->row_bytes = t->row_bytes;
	out->pulls = out->pushes = out->rows_pulled = out->rows_pushed = 0;
	out->rows_created = out->misses = 0;
	out->pulls_unadmitted = out->pushes_unadmitted = 0;
	for (unsigned i = 0; i < EMB_TABLE_STRIPES; i++) {
		const struct emb_table_stripe *st = &t->stripe[i];

		out->pulls += load_stat(&st->pulls);
		out->pushes += load_stat(&st->pushes);
		out->rows_pulled += load_stat(&st->rows_pulled);
		out->rows_pushed += load_stat(&st->rows_pushed);
		out->rows_created += load_stat(&st->rows_created);
		out->misses += load_stat(&st->misses);
		out->pulls_unadmitted += load_stat(&st->pulls_unadmitted);
		out->pushes_unadmitted += load_stat(&st->pushes_unadmitted);
	}
	out->rows_erased = load_stat(&t->rows_erased);
	out->rows_evicted = load_stat(&t->rows_evicted);
	out->step = load_stat(&t->step);
	out->admit_filter_bytes = emb__life_filter_bytes(t);
	out->bytes += out->admit_filter_bytes;
	if (t->tier) {
		struct emb_table_tier_stats ts;

		/* The DRAM the device's rows cost: their index and the
		 * tier's other tables. */
		emb__tier_stats(t, &ts);
		out->bytes += ts.map_bytes;
		out->rows_cold = ts.rows_cold;
		out->tier_bytes = ts.file_bytes;
		out->tier_reads = ts.blocks_read;
		out->tier_writes = ts.blocks_written;
		out->tier_read_us = ts.read_ns / 1000;
	}
	out->rows_evicted_ttl = load_stat(&t->rows_evicted_ttl);
	out->rows_evicted_l2 = load_stat(&t->rows_evicted_l2);
	out->rows_evicted_cap = load_stat(&t->rows_evicted_cap);
	out->rows_nonfinite = load_stat(&t->rows_nonfinite);
	emb__arena_usage(t->arena, &out->extents, &ext_bytes);
}

void emb_table_tier_stats(struct emb_table *t,
			  struct emb_table_tier_stats *out)
{
	emb__tier_stats(t, out);
}

/* ---- iteration ---- */

struct emb_table_iter {
	struct emb_table *t; /* borrowed */
	uint32_t shard;	     /* shard being walked */
	uint32_t idx;	     /* next record index in it */
	bool by_slot;	     /* only rows of the slots in set */
	bool tracked;	     /* only rows a move's tracking marked */
	bool take;	     /* tracked, the marks taken shard by shard */
	uint64_t *taken;     /* take: this shard's marks, taken_words */
	uint32_t taken_words;
	bool entered;	     /* a tiered table: shard's walk entered */
	struct emb_tier_walk *tw; /* and it, until the shard is left */
	uint64_t set[EMB_NSLOTS / 64]; /* by_slot: the slots yielded */
};

int emb_table_iter_create(struct emb_table *t, struct emb_table_iter **out)
{
	struct emb_table_iter *it;

	if (!t || !out)
		return EMB_EBADARG;
	it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->t = t;
	*out = it;
	return 0;
}

void emb_table_iter_destroy(struct emb_table_iter *it)
{
	if (it)
		free(it->taken);
	if (it && it->tw) {
		/* Left in the middle of a shard: its demotions go on. */
		struct emb_shard *s = &it->t->shards[it->shard];

		pthread_mutex_lock(&s->lock);
		emb__tier_walk_leave(it->t, it->shard, it->tw);
		pthread_mutex_unlock(&s->lock);
	}
	free(it);
}

int emb_table_iter_tracked(struct emb_table_iter *it)
{
	if (!it)
		return EMB_EBADARG;
	it->tracked = true;
	return 0;
}

int emb_table_iter_tracked_take(struct emb_table_iter *it)
{
	if (!it)
		return EMB_EBADARG;
	if (it->t->tier)
		return -EOPNOTSUPP;
	it->tracked = true;
	it->take = true;
	return 0;
}

uint64_t emb_table_track_count(struct emb_table *t, uint32_t first,
			       uint32_t n)
{
	uint64_t marked = 0;

	for (uint32_t i = 0; t && i < t->nshards; i++) {
		struct emb_shard *s = &t->shards[i];
		uint32_t words;

		pthread_mutex_lock(&s->lock);
		words = s->track ? (s->next_idx + 63) / 64 : 0;
		for (uint32_t w = 0; w < words; w++) {
			uint64_t b = s->track[w];

			while (b) {
				uint32_t idx = w * 64 + (uint32_t)__builtin_ctzll(b);

				b &= b - 1;
				/* Unsigned: a slot below first wraps past n. */
				marked += idx < s->next_idx &&
					  (!emb__vslot_ready(s) ||
					   (uint32_t)s->vslot[idx] - first < n);
			}
		}
		pthread_mutex_unlock(&s->lock);
	}
	return marked;
}

/*
 * Shard lock held: a taking walk entering shard s takes its marks and
 * gives it a clear set (none when the tracking ended: nothing is taken).
 * 0 or -ENOMEM.
 */
static int take_marks(struct emb_table_iter *it, struct emb_shard *s)
{
	uint64_t *fresh;

	free(it->taken);
	it->taken = NULL;
	it->taken_words = 0;
	if (!s->track)
		return 0;
	fresh = calloc(s->dirty_words ? s->dirty_words : 1, sizeof(*fresh));
	if (!fresh)
		return -ENOMEM;
	it->taken = s->track;
	it->taken_words = s->dirty_words;
	s->track = fresh;
	return 0;
}

int emb_table_track_begin(struct emb_table *t, uint32_t first, uint32_t n)
{
	if (!t || !n || first >= EMB_NSLOTS || n > EMB_NSLOTS - first)
		return EMB_EBADARG;
	for (uint32_t i = 0; i < t->nshards; i++) {
		struct emb_shard *s = &t->shards[i];
		uint64_t *b;

		pthread_mutex_lock(&s->lock);
		b = calloc(s->dirty_words ? s->dirty_words : 1, sizeof(*b));
		if (b) {
			if (t->tier)
				emb__tier_track_reset(t, i);
			free(s->track);
			s->track = b;
			s->track_first = first;
			s->track_n = n;
			s->track_removed = 0;
		}
		pthread_mutex_unlock(&s->lock);
		if (!b) {
			emb_table_track_end(t);
			return -ENOMEM;
		}
	}
	return 0;
}

void emb_table_track_end(struct emb_table *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->nshards; i++) {
		struct emb_shard *s = &t->shards[i];

		pthread_mutex_lock(&s->lock);
		free(s->track);
		s->track = NULL;
		pthread_mutex_unlock(&s->lock);
	}
}

uint64_t emb_table_track_removed(struct emb_table *t)
{
	uint64_t n = 0;

	for (uint32_t i = 0; t && i < t->nshards; i++) {
		struct emb_shard *s = &t->shards[i];

		pthread_mutex_lock(&s->lock);
		if (!s->track)
			n = UINT64_MAX;
		else if (n != UINT64_MAX)
			n += s->track_removed;
		pthread_mutex_unlock(&s->lock);
	}
	return t ? n : UINT64_MAX;
}

int emb_table_slot_index(struct emb_table *t)
{
	return t ? emb__slot_index(t) : EMB_EBADARG;
}

int emb_table_iter_slot_set(struct emb_table_iter *it, const uint64_t *set)
{
	int rc;

	if (!it || !set)
		return EMB_EBADARG;
	rc = emb__slot_index(it->t);
	if (rc)
		return rc;
	memcpy(it->set, set, sizeof(it->set));
	it->by_slot = true;
	return 0;
}

int emb_table_iter_slots(struct emb_table_iter *it, uint32_t first,
			 uint32_t n)
{
	uint64_t set[EMB_NSLOTS / 64] = {0};

	if (!it || !n || first >= EMB_NSLOTS || n > EMB_NSLOTS - first)
		return EMB_EBADARG;
	for (uint32_t sl = first; sl < first + n; sl++)
		set[sl / 64] |= 1ull << (sl % 64);
	return emb_table_iter_slot_set(it, set);
}

/* Records a walk over some slots looks ahead (iter_next()). */
#define ITER_AHEAD 96u

/* Shard lock held: whether the tracked walk it yields record idx of s. */
static inline bool mark_at(const struct emb_table_iter *it,
			   const struct emb_shard *s, uint32_t idx)
{
	const uint64_t *mk = it->take ? it->taken : s->track;
	uint32_t nw = it->take ? it->taken_words : s->dirty_words;

	return mk && (idx >> 6) < nw && ((mk[idx >> 6] >> (idx & 63)) & 1);
}

static inline void prefetch_record(const struct emb_table *t,
				   struct emb_shard *s, uint32_t idx)
{
	const char *r = (const char *)emb__shard_row(t, s, idx);

	for (uint32_t off = 0; off < t->row_bytes; off += 64)
		__builtin_prefetch(r + off);
}

int emb_table_iter_next(struct emb_table_iter *it, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max)
{
	return emb_table_iter_next_births(it, ids, rows, meta, NULL, max);
}

int emb_table_iter_next_births(struct emb_table_iter *it, uint64_t *ids,
			       float *rows, struct emb_row_meta *meta,
			       uint32_t *births, uint32_t max)
{
	struct emb_table *t = it->t;
	uint32_t got = 0;

	if (!ids)
		return EMB_EBADARG;
	while (got < max && it->shard < t->nshards) {
		struct emb_shard *s = &t->shards[it->shard];
		uint32_t held = got; /* rows yielded when the lock was taken */

		pthread_mutex_lock(&s->lock);
		if (it->take && it->idx == 0 && !it->taken) {
			int rc = take_marks(it, s);

			if (rc) {
				pthread_mutex_unlock(&s->lock);
				return rc;
			}
			/* Nothing marked: the next shard. */
			if (!it->taken)
				it->idx = UINT32_MAX;
		}
		if (t->tier && !it->entered) {
			/* A tiered shard: its walk (tier.c, "walks"). */
			int rc = emb__tier_walk_enter(
			    t, it->shard,
			    it->tracked ? EMB_TIER_WALK_MOVE
					: EMB_TIER_WALK_ALL,
			    it->by_slot ? it->set : NULL, &it->tw);

			if (rc) {
				pthread_mutex_unlock(&s->lock);
				return rc;
			}
			it->entered = true;
		}
		while (got < max && it->idx < s->next_idx) {
			struct emb_row_hdr *r;

			/* The mark before the slot: a fenced stream wants
			 * the few rows written since its copy ahead, so an
			 * unmarked record is not looked at at all, a clear
			 * word skips 64, and only marked records of the
			 * chunk are fetched ahead (walking the chunk's
			 * slots first fetched every row of the chunk, all
			 * under the fence). */
			if (it->tracked) {
				const uint64_t *mk =
				    it->take ? it->taken : s->track;
				uint32_t nw = it->take ? it->taken_words
						       : s->dirty_words;
				uint64_t w = mk && (it->idx >> 6) < nw
						 ? mk[it->idx >> 6]
						 : 0;

				if (!(w >> (it->idx & 63))) {
					it->idx = (it->idx | 63) + 1;
					continue;
				}
				if (!((w >> (it->idx & 63)) & 1)) {
					it->idx++;
					continue;
				}
			}

			/* Then its slot, before the record: a record of
			 * another slot is not read at all (a free record's
			 * slot is its last row's, and the header check below
			 * drops it). */
			if (it->by_slot) {
				uint16_t sl = s->vslot[it->idx];
				uint32_t pf = it->idx + ITER_AHEAD;

				/* The records of some slots are scattered
				 * over the shard, beyond what the hardware
				 * prefetcher follows: reading each header
				 * waited on a cache miss (three quarters of
				 * the walk's samples in a move's profile).
				 * The record ITER_AHEAD on is fetched now. */
				if (pf < s->next_idx &&
				    (!it->tracked || mark_at(it, s, pf))) {
					uint16_t ps = s->vslot[pf];

					if ((it->set[ps / 64] >> (ps % 64)) & 1)
						prefetch_record(t, s, pf);
				}
				if (!((it->set[sl / 64] >> (sl % 64)) & 1)) {
					it->idx++;
					continue;
				}
			}
			/* Bulk work ("Bulk work and the shard locks"), but
			 * inside a tiered shard's walk, which the lock keeps
			 * whole. */
			if (got - held >= BULK_HOLD && !it->tw) {
				shard_breathe(s);
				held = got;
				continue;
			}
			r = emb__shard_row(t, s, it->idx++);
			if (r->count & EMB_ROW_FREE)
				continue;
			/* Came back from the device during the walk: the
			 * walk hands it out later (tier.c). */
			if (it->tw && emb__tier_walk_owes(it->tw, r->id))
				continue;
			/* Read under the shard lock with the row: the birth
			 * of the row copied (a tiered table has none). */
			if (births)
				births[got] =
				    s->birth ? s->birth[it->idx - 1] : 0;
			emb__row_put(t, r, got++, ids, rows, meta);
		}
		if (it->tw && it->idx < s->next_idx)
			emb__tier_walk_dram_at(it->tw, it->idx);
		if (it->tw && it->idx >= s->next_idx) {
			/* Then its cold rows, and those owed; never the DRAM
			 * records again: rows made or brought back from now
			 * on are not this walk's. */
			int rc = emb__tier_walk_rest(t, s, it->shard, it->tw,
						     false, ids, rows, meta, &got,
						     max);

			it->idx = UINT32_MAX;
			if (rc || !emb__tier_walk_done(it->tw)) {
				pthread_mutex_unlock(&s->lock);
				if (rc)
					return rc;
				continue; /* got == max */
			}
		}
		if (it->idx >= s->next_idx) {
			emb__tier_walk_leave(t, it->shard, it->tw);
			it->tw = NULL;
			it->entered = false;
			it->shard++;
			it->idx = 0;
			free(it->taken);
			it->taken = NULL;
			it->taken_words = 0;
		}
		pthread_mutex_unlock(&s->lock);
	}
	return (int)got;
}
