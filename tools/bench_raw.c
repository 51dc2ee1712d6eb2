/*
 * tools/bench_raw.c - the physical yardstick for embstore-bench: a dense
 * float[rows][dim] array. Pull is a memcpy gather of the batch's rows, push
 * is row -= lr * g per id of the batch, with no index, no locks, no
 * optimizer state and no duplicate merging. Ids are row indices. The store's targets are stated
 * against these (pull >= 0.7x raw-gather, SGD push >= 0.5x raw-apply).
 *
 * raw-index-gather is the gather with the one step no hashed store can
 * skip: each id is found through an index first, a linear-probing array
 * of 4-byte slots (row + 1) at the store's load factor, probed from the
 * slot its hash picks, as the store's index is (src/store/shard.c). It
 * tells what of the gap to raw-gather is that lookup's random access;
 * raw-index-apply is raw-apply found the same way.
 *
 * Threads: open/close/mem on the main thread; preload, pull and push from
 * any number of workers at once. Concurrent pushes to one row race, as
 * hogwild training would; the figures do not depend on the float values.
 *
 * A yardstick only says something when it is as fast as plain C gets, so
 * this file is built at -O3 (tools/meson.build gives it a library of its
 * own with that flag; the rest of the build stays at the buildtype's -O2):
 * at -O2 GCC's "very cheap" vectoriser left the apply loop scalar. The
 * array is mapped with transparent huge pages asked for, as the store's
 * arena asks for its slabs (src/store/arena.c), so the two see the same
 * TLB: with 4 KiB pages a 256 MB array costs the loops a page walk per
 * row.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/hash.h"
#include "common/init.h"

struct raw {
	float *rows;	  /* rows * dim floats, page-aligned (mmap) */
	size_t map_bytes; /* bytes mapped at rows */
	uint64_t nrows;	  /* rows in the array */
	uint32_t dim;	  /* floats per row */
	float lr;	  /* SGD learning rate of push */
	uint64_t seed;	  /* initializer seed, as the store's table seed */
	uint32_t *slots;  /* raw-index-gather: row + 1 per slot, 0 = empty */
	uint32_t nslots;  /* slots, rows / 0.8 */
	size_t slots_bytes; /* bytes mapped at slots */
};

/*
 * Both loops prefetch every line of the row PREFETCH_AHEAD ids ahead, as
 * the store's batch code does: without it raw-apply waits for one cache
 * miss at a time (its loads sit behind a row's worth of arithmetic) and
 * ran 3x slower at 1M rows, which would make a poor yardstick. 16 ids
 * ahead rather than 8: on an AMD EPYC (AVX2) 8, 16 and 24 ahead were
 * within the noise of a loaded host, and the longer distance also covers
 * a slower memory.
 */
#define PREFETCH_AHEAD 16u

static inline void prefetch_row(const struct raw *r, uint64_t id, bool write)
{
	const char *p = (const char *)(r->rows + id * r->dim);
	size_t nbytes = (size_t)r->dim * sizeof(float);

	for (size_t b = 0; b < nbytes; b += 64) {
		if (write)
			__builtin_prefetch(p + b, 1);
		else
			__builtin_prefetch(p + b, 0);
	}
}

static int raw_open(const struct emb_bench_cfg *cfg, void **out)
{
	struct raw *r;
	void *p;

	if (!cfg->rows || !cfg->dim ||
	    cfg->rows > SIZE_MAX / sizeof(float) / cfg->dim)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->map_bytes = (size_t)cfg->rows * cfg->dim * sizeof(float);
	p = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		goto err_free_r;
	/* Only a hint: without THP the loops still run, on small pages. */
	madvise(p, r->map_bytes, MADV_HUGEPAGE);
	r->rows = p;
	r->nrows = cfg->rows;
	r->dim = cfg->dim;
	r->lr = cfg->optim.lr;
	r->seed = cfg->seed;
	*out = r;
	return 0;

err_free_r:
	free(r);
	return -ENOMEM;
}

/* The slot where the probe for row id starts. */
static inline uint32_t raw_home(const struct raw *r, uint64_t id)
{
	return emb_fastrange32((uint32_t)(emb_id_hash(id) >> 18), r->nslots);
}

/*
 * raw-index-gather's index: every row indexed, at 0.8 of the slots (the
 * load at which the store's shards grow), on 4 KiB pages as the store's
 * index is (calloc'd per shard).
 */
static int raw_index_open(const struct emb_bench_cfg *cfg, void **out)
{
	struct raw *r;
	void *p;
	int rc;

	if (cfg->rows >= UINT32_MAX / 5 * 4)
		return -EINVAL;
	rc = raw_open(cfg, out);
	if (rc)
		return rc;
	r = *out;
	r->nslots = (uint32_t)(cfg->rows * 5 / 4) + 1;
	r->slots_bytes = (size_t)r->nslots * sizeof(*r->slots);
	p = mmap(NULL, r->slots_bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		munmap(r->rows, r->map_bytes);
		free(r);
		*out = NULL;
		return -ENOMEM;
	}
	r->slots = p;
	for (uint32_t id = 0; id < cfg->rows; id++) {
		uint32_t pos = raw_home(r, id);

		while (r->slots[pos])
			if (++pos == r->nslots)
				pos = 0;
		r->slots[pos] = id + 1;
	}
	return 0;
}

static void raw_close(void *be)
{
	struct raw *r = be;

	if (!r)
		return;
	if (r->slots)
		munmap(r->slots, r->slots_bytes);
	munmap(r->rows, r->map_bytes);
	free(r);
}

static int raw_thread_open(void *be, uint32_t thread, void **ctx)
{
	(void)thread;
	*ctx = be;
	return 0;
}

static void raw_thread_close(void *ctx)
{
	(void)ctx;
}

static int raw_preload(void *ctx, const uint64_t *ids, uint32_t n)
{
	struct raw *r = ctx;
	struct emb_init_cfg init = EMB_INIT_CFG_DEFAULT;

	for (uint32_t i = 0; i < n; i++) {
		if (ids[i] >= r->nrows)
			return -EINVAL;
		emb_init_row(&init, r->seed, ids[i],
			     r->rows + ids[i] * r->dim, r->dim);
	}
	return 0;
}

static int raw_pull(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct raw *r = ctx;
	size_t row_bytes = (size_t)r->dim * sizeof(float);

	/* The first rows' prefetches before the loop, so that none of the
	 * batch's rows is read unannounced. */
	for (uint32_t i = 0; i < n && i < PREFETCH_AHEAD; i++)
		prefetch_row(r, ids[i], false);
	for (uint32_t i = 0; i < n; i++) {
		if (i + PREFETCH_AHEAD < n)
			prefetch_row(r, ids[i + PREFETCH_AHEAD], false);
		memcpy(out + (size_t)i * r->dim, r->rows + ids[i] * r->dim,
		       row_bytes);
	}
	return 0;
}

/* Row of id by its index: the probe runs until the slot holding it. */
static inline float *raw_find(const struct raw *r, const uint32_t *home,
			      uint64_t id)
{
	const uint32_t *p = home, *end = r->slots + r->nslots;

	while (*p != id + 1)
		if (++p == end)
			p = r->slots;
	return r->rows + id * r->dim;
}

/*
 * The index's pipeline, shared by raw-index-gather and raw-index-apply,
 * as the store's batches run theirs: the home slots 2 * PREFETCH_AHEAD
 * ids ahead, each row found by its probe once, PREFETCH_AHEAD ahead, its
 * lines prefetched then (for writing when the op writes) and its address
 * kept in a ring until it is used. Nothing is allocated per batch.
 * Inlined into both loops: a call per row would weaken the yardstick.
 */
static inline __attribute__((always_inline)) int
index_begin(const struct raw *r, const uint64_t *ids, uint32_t n,
	    float **ring, bool write)
{
	/* The batch is checked whole first, as the store checks its ids. */
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] >= r->nrows)
			return -EINVAL;
	for (uint32_t i = 0; i < n && i < 2 * PREFETCH_AHEAD; i++)
		__builtin_prefetch(&r->slots[raw_home(r, ids[i])]);
	for (uint32_t i = 0; i < n && i < PREFETCH_AHEAD; i++) {
		ring[i] = raw_find(r, &r->slots[raw_home(r, ids[i])], ids[i]);
		prefetch_row(r, (uint64_t)(ring[i] - r->rows) / r->dim, write);
	}
	return 0;
}

/* Row i is used: its place in the ring goes to row i + PREFETCH_AHEAD. */
static inline __attribute__((always_inline)) void
index_advance(const struct raw *r, const uint64_t *ids, uint32_t n,
	      uint32_t i, float **ring, bool write)
{
	const uint32_t j = i + PREFETCH_AHEAD, k = i % PREFETCH_AHEAD;

	if (i + 2 * PREFETCH_AHEAD < n)
		__builtin_prefetch(
			&r->slots[raw_home(r, ids[i + 2 * PREFETCH_AHEAD])]);
	if (j < n) {
		ring[k] = raw_find(r, &r->slots[raw_home(r, ids[j])], ids[j]);
		prefetch_row(r, (uint64_t)(ring[k] - r->rows) / r->dim, write);
	}
}

/* The gather through the index: each row copied out of the ring. */
static int raw_index_pull(void *ctx, const uint64_t *ids, uint32_t n,
			  float *out)
{
	struct raw *r = ctx;
	const size_t row_bytes = (size_t)r->dim * sizeof(float);
	float *ring[PREFETCH_AHEAD];

	if (index_begin(r, ids, n, ring, false))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		memcpy(out + (size_t)i * r->dim, ring[i % PREFETCH_AHEAD],
		       row_bytes);
		index_advance(r, ids, n, i, ring, false);
	}
	return 0;
}

static int raw_push(void *ctx, const uint64_t *ids, uint32_t n,
		    const float *grads)
{
	struct raw *r = ctx;
	const float lr = r->lr;
	const uint32_t dim = r->dim;

	for (uint32_t i = 0; i < n && i < PREFETCH_AHEAD; i++)
		prefetch_row(r, ids[i], true);
	for (uint32_t i = 0; i < n; i++) {
		float *restrict w = r->rows + ids[i] * dim;
		const float *restrict g = grads + (size_t)i * dim;

		if (i + PREFETCH_AHEAD < n)
			prefetch_row(r, ids[i + PREFETCH_AHEAD], true);
		for (uint32_t j = 0; j < dim; j++)
			w[j] -= lr * g[j];
	}
	return 0;
}

/*
 * raw-apply through the index: raw_push()'s SGD loop over the rows
 * index_begin() and index_advance() find, so that the push's gap to
 * raw-apply splits into the lookup and the rest.
 */
static int raw_index_push(void *ctx, const uint64_t *ids, uint32_t n,
			  const float *grads)
{
	struct raw *r = ctx;
	const float lr = r->lr;
	const uint32_t dim = r->dim;
	float *ring[PREFETCH_AHEAD];

	if (index_begin(r, ids, n, ring, true))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		float *restrict w = ring[i % PREFETCH_AHEAD];
		const float *restrict g = grads + (size_t)i * dim;

		for (uint32_t c = 0; c < dim; c++)
			w[c] -= lr * g[c];
		index_advance(r, ids, n, i, ring, true);
	}
	return 0;
}

static int raw_mem(void *be, struct emb_bench_mem *out)
{
	struct raw *r = be;

	out->rows = r->nrows;
	out->bytes = r->nrows * r->dim * sizeof(float);
	out->slab_bytes = out->bytes;
	out->index_bytes = r->slots_bytes;
	out->bytes += r->slots_bytes;
	out->record_bytes = r->dim * sizeof(float);
	return 0;
}

const struct emb_bench_backend emb_bench_raw_backend = {
	.name = "raw",
	.dense_ids = true,
	.open = raw_open,
	.close = raw_close,
	.thread_open = raw_thread_open,
	.thread_close = raw_thread_close,
	.preload = raw_preload,
	.pull = raw_pull,
	.push = raw_push,
	.mem = raw_mem,
};

const struct emb_bench_backend emb_bench_raw_index_backend = {
	.name = "raw-index",
	.dense_ids = true,
	.open = raw_index_open,
	.close = raw_close,
	.thread_open = raw_thread_open,
	.thread_close = raw_thread_close,
	.preload = raw_preload,
	.pull = raw_index_pull,
	.push = raw_index_push,
	.mem = raw_mem,
};
