/*
 * src/worker/cached.c - emb_cached_table: the vocab cache (cache/cache.h)
 * wired to a client table. Misses are asynchronous pulls (with optimizer
 * state in write-back mode), write-through gradients are pushes and
 * write-back rows are assigns with state. Rows stay in the table's row
 * format from the servers to the cache and back: a compact table's misses
 * are pulled raw (or with state, which is raw too), and the cache decodes
 * on lookup. One trainer thread calls in; the
 * pulls complete on the client's network thread and are collected here
 * through emb_async_done() / emb_async_wait().
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdlib.h>

#include "cache/cache.h"
#include "common/rowfmt.h"
#include "worker/abi.h"
#include "worker/client_int.h"

_Static_assert(EMB_CACHED_WRITE_THROUGH == (int)EMB_CACHE_WRITE_THROUGH &&
		   EMB_CACHED_WRITE_BACK == (int)EMB_CACHE_WRITE_BACK,
	       "cached table modes are the cache's");
_Static_assert(EMB_CACHED_LRU == (int)EMB_CACHE_LRU &&
		   EMB_CACHED_CLOCK == (int)EMB_CACHE_CLOCK &&
		   EMB_CACHED_TINYLFU == (int)EMB_CACHE_TINYLFU,
	       "cached table policies are the cache's");

struct emb_cached_table {
	struct emb_client_table *t; /* borrowed */
	struct emb_cache *cache;    /* owns the pool */
	struct emb_async **ops;	    /* nops pulls in flight; NULL = free */
	uint32_t nops;		    /* prefetch_depth + 2 */
	uint32_t dim;		    /* weights per row */
	uint32_t pull_flags;	    /* of every fetch: with state in
				       write-back mode, else raw rows of a
				       compact table */
	bool write_back;	    /* mode is EMB_CACHED_WRITE_BACK */
	uint32_t rank;		    /* passed to push */
	uint64_t step;		    /* pushes sent, passed as the worker step */
};

/* fetch_start: one asynchronous pull; its slot index is the token. */
static int64_t fetch_start(void *arg, const uint64_t *ids, uint32_t n,
			   float *dst, uint32_t stride)
{
	struct emb_cached_table *ct = arg;
	uint32_t i;
	int rc;

	for (i = 0; i < ct->nops; i++)
		if (!ct->ops[i])
			break;
	/* The cache keeps at most depth + 1 fetches in flight. */
	if (i == ct->nops)
		return -EBUSY;
	(void)stride; /* the layout pull_flags ask for, checked at create */
	rc = emb_client_table_pull_async(ct->t, ids, n, dst, ct->pull_flags,
					 NULL, &ct->ops[i]);
	if (rc)
		return rc;
	return i;
}

/* fetch_wait: a poll of the op's completion flag unless block is set. */
static int fetch_wait(void *arg, int64_t token, bool block)
{
	struct emb_cached_table *ct = arg;
	struct emb_async *op;

	if (token < 0 || (uint64_t)token >= ct->nops || !ct->ops[token])
		return -EINVAL;
	op = ct->ops[token];
	if (!block && !emb_async_done(op))
		return -EAGAIN;
	ct->ops[token] = NULL;
	return emb_async_wait(op);
}

static int push(void *arg, const uint64_t *ids, uint32_t n, const float *grads)
{
	struct emb_cached_table *ct = arg;
	int rc;

	rc = emb_client_table_push(ct->t, ids, n, grads, ct->step, ct->rank);
	if (!rc)
		ct->step++;
	return rc;
}

static int write_back(void *arg, const uint64_t *ids, uint32_t n,
		      const float *rows, uint32_t stride)
{
	struct emb_cached_table *ct = arg;

	if (stride != emb_client_table_row_floats(ct->t))
		return EMB_EBADDIM;
	return emb_client_table_assign(ct->t, ids, n, rows, true);
}

static int cached_create(struct emb_client_table *t,
			 const struct emb_cached_table_opts *opts,
			 struct emb_cached_table **out)
{
	struct emb_cache_opts co = EMB_CACHE_OPTS_DEFAULT;
	const struct emb_table_spec *sp;
	struct emb_cached_table *ct;
	uint32_t want;
	int rc;

	if (!t || !opts || !out || opts->prefetch_depth > 64)
		return EMB_EBADARG;
	/* A synchronous step averages every worker's push; rows updated
	 * here and assigned later would bypass that. */
	if (opts->mode == EMB_CACHED_WRITE_BACK &&
	    emb__client_table_mode(t) == EMB_MODE_SYNC) {
		emb_log(EMB_LOG_WARN,
			"cached table %s: write-back on a synchronous table; "
			"use write-through",
			emb_client_table_spec(t)->name);
		return EMB_EBADARG;
	}
	ct = calloc(1, sizeof(*ct));
	if (!ct)
		return -ENOMEM;
	sp = emb_client_table_spec(t);
	ct->t = t;
	ct->dim = emb_client_table_dim(t);
	ct->write_back = opts->mode == EMB_CACHED_WRITE_BACK;
	if (ct->write_back)
		ct->pull_flags = EMB_CLIENT_WITH_STATE;
	else if (sp->row_format != EMB_ROWFMT_FP32)
		ct->pull_flags = EMB_CLIENT_RAW;
	ct->rank = opts->rank;
	ct->nops = opts->prefetch_depth + 2;
	ct->ops = calloc(ct->nops, sizeof(*ct->ops));
	if (!ct->ops) {
		rc = -ENOMEM;
		goto err_free_ct;
	}

	co.capacity = opts->capacity;
	co.dim = ct->dim;
	co.max_batch = opts->max_batch;
	co.prefetch_depth = opts->prefetch_depth;
	co.mode = opts->mode;
	co.policy = opts->policy;
	co.staleness_steps = opts->staleness_steps;
	co.optim = sp->optim;
	co.row_format = sp->row_format;
	co.rounding = sp->rounding;
	co.seed = sp->seed;
	co.ops.fetch_start = fetch_start;
	co.ops.fetch_wait = fetch_wait;
	co.ops.push = push;
	co.ops.write_back = write_back;
	co.arg = ct;
	rc = emb_cache_create(&co, &ct->cache);
	if (rc)
		goto err_free_ops;
	/* Rows come off the wire as the store lays them out, which is the
	 * layout the cache keeps (and its optimizer runs on): whole rows in
	 * write-back mode, the weights alone otherwise. */
	want = ct->write_back ? emb_client_table_row_floats(t)
			      : emb_rowfmt_words(sp->row_format, ct->dim);
	if (emb_cache_row_floats(ct->cache) != want) {
		rc = EMB_EBADOPTIM;
		goto err_destroy_cache;
	}
	*out = ct;
	return 0;

err_destroy_cache:
	emb_cache_destroy(ct->cache);
err_free_ops:
	free(ct->ops);
err_free_ct:
	free(ct);
	return rc;
}

int emb_cached_table_create(struct emb_client_table *t,
			    const struct emb_cached_table_opts *opts,
			    struct emb_cached_table **out)
{
	struct emb_cached_table_opts o;
	int rc =
	    opts ? emb__opts_copy(&o, sizeof(o), opts, "emb_cached_table_opts")
		 : EMB_EBADARG;

	return emb__err(rc ? rc : cached_create(t, &o, out));
}

void emb_cached_table_destroy(struct emb_cached_table *ct)
{
	if (!ct)
		return;
	/* Reports on every token through fetch_wait, freeing the ops. */
	emb_cache_destroy(ct->cache);
	free(ct->ops);
	free(ct);
}

int emb_cached_table_prefetch(struct emb_cached_table *ct, const uint64_t *ids,
			      uint32_t n)
{
	return emb__err(emb_cache_prefetch(ct->cache, ids, n));
}

int emb_cached_table_lookup(struct emb_cached_table *ct, const uint64_t *ids,
			    uint32_t n, float *out)
{
	return emb__err(emb_cache_lookup(ct->cache, ids, n, out));
}

int emb_cached_table_push_grads(struct emb_cached_table *ct, const float *grads)
{
	int rc;

	if (ct->write_back && emb__client_table_mode(ct->t) == EMB_MODE_SYNC)
		return emb__err(EMB_EBADARG);
	rc = emb_cache_update(ct->cache, grads);
	if (rc == EMB_ENONFINITE) {
		uint64_t id;
		uint32_t elem;

		emb_cache_nonfinite(ct->cache, &id, &elem);
		if (elem == UINT32_MAX)
			emb__err_set(
			    rc,
			    "table %s: the update of id %llu would make its "
			    "row NaN, infinite or too large for the table's "
			    "%s rows; nothing of this batch was applied",
			    emb_client_table_spec(ct->t)->name,
			    (unsigned long long)id,
			    emb_rowfmt_name(
				emb_client_table_spec(ct->t)->row_format));
		else
			emb__err_set(rc,
				     "table %s: the gradient of id %llu "
				     "(element %u) is NaN or infinite; nothing "
				     "of this batch was applied",
				     emb_client_table_spec(ct->t)->name,
				     (unsigned long long)id, elem);
	}
	return emb__err(rc);
}

int emb_cached_table_flush(struct emb_cached_table *ct)
{
	return emb__err(emb_cache_flush(ct->cache));
}

void emb_cached_table_cancel(struct emb_cached_table *ct)
{
	emb_cache_cancel(ct->cache);
}

int emb_cached_table_stats(const struct emb_cached_table *ct,
			   struct emb_cached_table_stats *dst)
{
	struct emb_cached_table_stats st = EMB_SIZED(struct emb_cached_table_stats);
	struct emb_cache_stats s;

	emb_cache_stats(ct->cache, &s);
	st = (struct emb_cached_table_stats){
	    .lookups = s.lookups,
	    .hits = s.hits,
	    .misses = s.misses,
	    .hit_ratio = s.hit_ratio,
	    .refetches = s.refetches,
	    .evictions = s.evictions,
	    .write_backs = s.write_backs,
	    .pushes = s.pushes,
	    .fetch_calls = s.fetch_calls,
	    .sync_fetches = s.sync_fetches,
	    .rows_fetched = s.rows_fetched,
	    .bytes_fetched = s.bytes_fetched,
	    .bytes_written = s.bytes_written,
	    .stalls = s.stalls,
	    .wait_ns = s.wait_ns,
	    .rows = s.rows,
	    .dirty = s.dirty,
	};
	return emb__err(
	    emb__stats_copy(dst, &st, sizeof(st), "emb_cached_table_stats"));
}
