/*
 * tools/bench_store.c - embstore-bench's in-process backend: one store table
 * in this process, called directly, so the figures are the engine's own
 * (index, locks, optimizer, allocator) without a network in between.
 *
 * Threads: open/close/mem on the main thread; each worker thread has its
 * own context (a scratch buffer for preload) and calls the table, which is
 * thread-safe for pull and push.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/store.h"

struct store_be {
	struct emb_table *t; /* the table under test */
	uint32_t batch;	     /* largest n any call passes */
	uint32_t dim;	     /* floats per row */
	bool preload;	     /* false: rows appear as the timed batches
				touch them (and pass admission) */
	char tier_path[4096]; /* --tier-dir's file */
};

struct store_ctx {
	struct store_be *be; /* shared backend */
	float *scratch;	     /* batch * dim floats: preload's pull output */
};

static int store_open(const struct emb_bench_cfg *cfg, void **out)
{
	struct emb_table_opts opts = EMB_TABLE_OPTS_DEFAULT;
	struct store_be *s;
	int rc;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	opts.name = cfg->table;
	opts.dim = cfg->dim;
	opts.optim = cfg->optim;
	opts.init = cfg->init;
	opts.seed = cfg->seed;
	opts.row_format = cfg->row_format;
	opts.life = cfg->life;
	opts.mem_limit = cfg->mem_limit;
	if (cfg->tier_dir) {
		if (snprintf(s->tier_path, sizeof(s->tier_path), "%s/%s.tier",
			     cfg->tier_dir,
			     cfg->table) >= (int)sizeof(s->tier_path)) {
			rc = -ENAMETOOLONG;
			goto err_free_s;
		}
		opts.tier_path = s->tier_path;
	}
	rc = emb_table_create(&opts, &s->t);
	if (rc)
		goto err_free_s;
	s->batch = cfg->batch;
	s->dim = cfg->dim;
	s->preload = cfg->preload;
	*out = s;
	return 0;

err_free_s:
	free(s);
	return rc;
}

static void store_close(void *be)
{
	struct store_be *s = be;

	if (!s)
		return;
	emb_table_destroy(s->t);
	free(s);
}

static int store_thread_open(void *be, uint32_t thread, void **out)
{
	struct store_be *s = be;
	struct store_ctx *c;

	(void)thread;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->scratch = malloc((size_t)s->batch * s->dim * sizeof(float));
	if (!c->scratch)
		goto err_free_c;
	c->be = s;
	*out = c;
	return 0;

err_free_c:
	free(c);
	return -ENOMEM;
}

static void store_thread_close(void *ctx)
{
	struct store_ctx *c = ctx;

	if (!c)
		return;
	free(c->scratch);
	free(c);
}

static int store_preload(void *ctx, const uint64_t *ids, uint32_t n)
{
	struct store_ctx *c = ctx;
	int rc;

	if (n > c->be->batch)
		return -EINVAL;
	if (!c->be->preload)
		return 0;
	/* A pull creates missing rows with the initializer, as training does. */
	rc = emb_table_pull(c->be->t, ids, n, c->scratch, 0, NULL);
	return rc < 0 ? rc : 0;
}

static int store_pull(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct store_ctx *c = ctx;
	int rc;

	rc = emb_table_pull(c->be->t, ids, n, out, 0, NULL);
	return rc < 0 ? rc : 0;
}

static int store_push(void *ctx, const uint64_t *ids, uint32_t n,
		      const float *grads)
{
	struct store_ctx *c = ctx;

	return emb_table_push(c->be->t, ids, n, grads);
}

static int store_mem(void *be, struct emb_bench_mem *out)
{
	struct store_be *s = be;
	struct emb_table_tier_stats ts;
	struct emb_table_stats st;

	emb_table_stats(s->t, &st);
	out->rows = st.rows;
	out->bytes = st.bytes;
	out->slab_bytes = st.slab_bytes;
	out->index_bytes = st.index_bytes;
	out->record_bytes = st.row_bytes;
	out->filter_bytes = st.admit_filter_bytes;
	out->pulls_unadmitted = st.pulls_unadmitted;
	out->pushes_unadmitted = st.pushes_unadmitted;
	out->rows_created = st.rows_created;
	out->rows_evicted = st.rows_evicted;
	emb_table_tier_stats(s->t, &ts);
	out->rows_cold = ts.rows_cold;
	out->tier_file_bytes = ts.file_bytes;
	out->tier_reads = ts.blocks_read;
	out->tier_writes = ts.blocks_written;
	out->tier_read_ns = ts.read_ns;
	return 0;
}

const struct emb_bench_backend emb_bench_store_backend = {
	.name = "store",
	.dense_ids = false,
	.open = store_open,
	.close = store_close,
	.thread_open = store_thread_open,
	.thread_close = store_thread_close,
	.preload = store_preload,
	.pull = store_pull,
	.push = store_push,
	.mem = store_mem,
};
