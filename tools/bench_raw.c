/*
 * tools/bench_raw.c - the physical yardstick for embstore-bench: a dense
 * float[rows][dim] array. Pull is a memcpy gather of the batch's rows, push
 * is row -= lr * g per id of the batch, with no index, no locks, no
 * optimizer state and no duplicate merging. Ids are row indices. The store's targets are stated
 * against these (pull >= 0.7x raw-gather, SGD push >= 0.5x raw-apply).
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

#include "common/init.h"

struct raw {
	float *rows;	  /* rows * dim floats, page-aligned (mmap) */
	size_t map_bytes; /* bytes mapped at rows */
	uint64_t nrows;	  /* rows in the array */
	uint32_t dim;	  /* floats per row */
	float lr;	  /* SGD learning rate of push */
	uint64_t seed;	  /* initializer seed, as the store's table seed */
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

static void raw_close(void *be)
{
	struct raw *r = be;

	if (!r)
		return;
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

static int raw_mem(void *be, struct emb_bench_mem *out)
{
	struct raw *r = be;

	out->rows = r->nrows;
	out->bytes = r->nrows * r->dim * sizeof(float);
	out->slab_bytes = out->bytes;
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
