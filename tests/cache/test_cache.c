/*
 * tests/cache/test_cache.c - emb_cache over an in-process emb_table standing
 * in for the servers. The backend below can hold fetches "in flight" until a
 * blocking wait, fail the Nth call of each callback, and logs the ids it was
 * asked to fetch. The table may keep compact rows (fp16, bf16, int8): the
 * backend then moves them as the servers would, in the table's format.
 */
#include "cache/cache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "harness.h"
#include "store/store.h"

#define NTOK 80

struct backend {
	struct emb_table *t;	 /* the "servers" */
	uint32_t dim;		 /* weights per row */
	uint32_t rf;		 /* words of a full table row */
	uint32_t ww;		 /* words of a row's weights */
	bool full_rows;		 /* fetch weights + state (write-back) */
	bool slow;		 /* non-blocking waits report -EAGAIN */
	bool live[NTOK];	 /* token issued and not yet reported */
	uint32_t fetch_calls;	 /* fetch_start calls */
	uint32_t push_calls;	 /* push calls */
	uint32_t wb_calls;	 /* write_back calls */
	uint32_t wb_rows;	 /* rows written back */
	uint32_t fail_start;	 /* fail this fetch_start call (1-based) */
	uint32_t fail_wait;	 /* fail the wait of this fetch_start call */
	uint32_t fail_wb;	 /* fail this write_back call */
	uint32_t fail_push;	 /* fail this push call */
	uint32_t tok_call[NTOK]; /* fetch_start call number of a token */
	uint64_t log[1 << 16];	 /* ids asked for since the log was reset */
	uint32_t nlog;		 /* entries in log */
};

static int64_t be_fetch_start(void *arg, const uint64_t *ids, uint32_t n,
			      float *dst, uint32_t stride)
{
	struct backend *be = arg;
	const float **p;
	int64_t tok;
	int rc;

	be->fetch_calls++;
	if (be->fetch_calls == be->fail_start)
		return -ECONNRESET;
	CU_ASSERT_EQUAL(stride, be->full_rows ? be->rf : be->ww);
	for (uint32_t i = 0; i < n && be->nlog < (1u << 16); i++)
		be->log[be->nlog++] = ids[i];
	/* The rows are read now: the fetch sees the servers as of its start. */
	if (be->full_rows) {
		p = malloc(n * sizeof(*p));
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		rc = emb_table_pull_ptrs(be->t, ids, n, p, 0);
		/* A row record is the weights followed by the optimizer
		 * state (store_int.h), so the weights pointer is the row. */
		for (uint32_t i = 0; rc >= 0 && i < n; i++)
			memcpy(dst + (size_t)i * stride, p[i],
			       be->rf * sizeof(float));
		free(p);
	} else {
		rc = emb_table_pull_raw(be->t, ids, n, dst, 0, NULL);
	}
	if (rc < 0)
		return rc;
	for (tok = 0; tok < NTOK && be->live[tok]; tok++)
		;
	CU_ASSERT_FATAL(tok < NTOK);
	be->live[tok] = true;
	be->tok_call[tok] = be->fetch_calls;
	return tok;
}

static int be_fetch_wait(void *arg, int64_t tok, bool block)
{
	struct backend *be = arg;

	CU_ASSERT_FATAL(tok >= 0 && tok < NTOK && be->live[tok]);
	if (be->slow && !block)
		return -EAGAIN;
	be->live[tok] = false;
	return be->tok_call[tok] == be->fail_wait ? -ETIMEDOUT : 0;
}

static int be_push(void *arg, const uint64_t *ids, uint32_t n,
		   const float *grads)
{
	struct backend *be = arg;

	if (++be->push_calls == be->fail_push)
		return -EPIPE;
	return emb_table_push(be->t, ids, n, grads);
}

static int be_write_back(void *arg, const uint64_t *ids, uint32_t n,
			 const float *rows, uint32_t stride)
{
	struct backend *be = arg;

	if (++be->wb_calls == be->fail_wb)
		return -EPIPE;
	CU_ASSERT_EQUAL(stride, be->rf);
	be->wb_rows += n;
	return emb_table_assign(be->t, ids, n, rows, true, NULL);
}

/* Row format of the tables table_new() makes. */
static uint32_t g_fmt = EMB_ROWFMT_FP32;

static struct emb_table_opts table_opts(uint32_t dim, uint32_t optim)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.row_format = g_fmt;
	o.dim = dim;
	o.optim.kind = optim;
	o.optim.lr = 0.05f;
	o.seed = 7;
	o.nshards = 4;
	return o;
}

static struct emb_table *table_new(uint32_t dim, uint32_t optim)
{
	struct emb_table_opts o = table_opts(dim, optim);
	struct emb_table *t = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &t), 0);
	return t;
}

/* Eviction policy of the caches cache_new() makes. */
static uint32_t g_policy = EMB_CACHE_LRU;

/* A cache in mode over a fresh table; be must be zeroed by the caller. */
static struct emb_cache *cache_new(struct backend *be, uint32_t mode,
				   uint32_t optim, uint32_t dim,
				   uint32_t capacity, uint32_t depth,
				   uint32_t staleness)
{
	struct emb_cache_opts o = EMB_CACHE_OPTS_DEFAULT;
	struct emb_cache *c = NULL;

	be->t = table_new(dim, optim);
	be->dim = dim;
	be->rf = emb_table_row_floats(be->t);
	be->ww = emb_table_weight_words(be->t);
	be->full_rows = mode == EMB_CACHE_WRITE_BACK;
	o.capacity = capacity;
	o.dim = dim;
	o.max_batch = 1024;
	o.prefetch_depth = depth;
	o.mode = mode;
	o.policy = g_policy;
	o.staleness_steps = staleness;
	o.optim = table_opts(dim, optim).optim;
	o.row_format = g_fmt;
	o.seed = table_opts(dim, optim).seed;
	o.ops.fetch_start = be_fetch_start;
	o.ops.fetch_wait = be_fetch_wait;
	o.ops.push = be_push;
	o.ops.write_back = be_write_back;
	o.arg = be;
	CU_ASSERT_EQUAL_FATAL(emb_cache_create(&o, &c), 0);
	CU_ASSERT_EQUAL(emb_cache_row_floats(c),
			be->full_rows ? be->rf : be->ww);
	return c;
}

static void done(struct backend *be, struct emb_cache *c)
{
	emb_cache_destroy(c);
	emb_table_destroy(be->t);
	free(be);
}

static struct backend *be_new(void)
{
	struct backend *be = calloc(1, sizeof(*be));

	CU_ASSERT_PTR_NOT_NULL_FATAL(be);
	return be;
}

static bool close_to(float a, float b)
{
	return fabsf(a - b) <= 1e-5f * fabsf(b) + 1e-7f;
}

/* Looks up one id alone; returns the fetch calls it made. */
static uint32_t touch(struct backend *be, struct emb_cache *c, uint64_t id)
{
	uint32_t before = be->fetch_calls;
	float out[8];

	CU_ASSERT_EQUAL(emb_cache_lookup(c, &id, 1, out), 0);
	return be->fetch_calls - before;
}

static void test_bad_opts(void)
{
	struct emb_cache_opts o = EMB_CACHE_OPTS_DEFAULT;
	struct emb_cache *c = NULL;

	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADARG); /* no ops */
	o.ops.fetch_start = be_fetch_start;
	o.ops.fetch_wait = be_fetch_wait;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADARG); /* no push */
	o.ops.push = be_push;
	o.dim = 0;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADDIM);
	o.dim = 8;
	o.capacity = 0;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADARG);
	o.capacity = 16;
	o.mode = EMB_CACHE_WRITE_BACK;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADARG); /* no wb */
	o.ops.write_back = be_write_back;
	o.optim.kind = 99;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADOPTIM);
	CU_ASSERT_PTR_NULL(c);
	o.optim.kind = EMB_OPTIM_ADAM;
	CU_ASSERT_EQUAL_FATAL(emb_cache_create(&o, &c), 0);
	CU_ASSERT_EQUAL(emb_cache_row_floats(c), 8 + 17);
	emb_cache_destroy(c);
	emb_cache_destroy(NULL);
}

static void test_lru_order(void)
{
	struct backend *be = be_new();
	struct emb_cache *c = cache_new(be, EMB_CACHE_WRITE_THROUGH,
					EMB_OPTIM_SGD, 4, 4, 0, 1000);
	struct emb_cache_stats st;

	for (uint64_t id = 1; id <= 4; id++)
		CU_ASSERT_EQUAL(touch(be, c, id), 1);
	CU_ASSERT_EQUAL(touch(be, c, 1), 0); /* 1 is now most recent */
	CU_ASSERT_EQUAL(touch(be, c, 5), 1); /* evicts 2, the oldest */
	CU_ASSERT_EQUAL(touch(be, c, 1), 0);
	CU_ASSERT_EQUAL(touch(be, c, 3), 0);
	CU_ASSERT_EQUAL(touch(be, c, 4), 0);
	CU_ASSERT_EQUAL(touch(be, c, 5), 0);
	CU_ASSERT_EQUAL(touch(be, c, 2), 1); /* evicts 1 */
	CU_ASSERT_EQUAL(touch(be, c, 1), 1); /* evicts 3 */
	CU_ASSERT_EQUAL(touch(be, c, 4), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.rows, 4);
	CU_ASSERT_EQUAL(st.evictions, 3);
	CU_ASSERT_EQUAL(st.write_backs, 0);
	done(be, c);
}

static void test_hits_misses(void)
{
	struct backend *be = be_new();
	struct emb_cache *c = cache_new(be, EMB_CACHE_WRITE_THROUGH,
					EMB_OPTIM_SGD, 4, 64, 0, 1000);
	const uint64_t a[] = {1, 2, 2, 3, 1};
	const uint64_t b[] = {2, 3, 4, 4};
	struct emb_cache_stats st;
	float out[5 * 4];

	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 5, out), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.misses, 3);
	CU_ASSERT_EQUAL(st.hits, 0);
	CU_ASSERT_EQUAL(st.rows_fetched, 3);
	CU_ASSERT_EQUAL(st.bytes_fetched, 3 * 4 * sizeof(float));
	CU_ASSERT_EQUAL(emb_cache_lookup(c, b, 4, out), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.misses, 4);
	CU_ASSERT_EQUAL(st.hits, 2);
	CU_ASSERT_EQUAL(st.lookups, 2);
	CU_ASSERT_EQUAL(st.fetch_calls, 2);
	CU_ASSERT_DOUBLE_EQUAL(st.hit_ratio, 2.0 / 6.0, 1e-12);
	done(be, c);
}

static void test_rows_per_position(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD, 4, 64, 1, 0);
	const uint64_t ids[] = {9, 3, 9, 9, 12, 3};
	float out[6 * 4], ref[6 * 4];
	const float *ptrs[6];

	CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids, 6), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, ids, 6, out), 0);
	CU_ASSERT_EQUAL(emb_table_pull(be->t, ids, 6, ref, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(out, ref, sizeof(out)), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup_ptrs(c, ids, 6, ptrs), 0);
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(memcmp(ptrs[i], ref + i * 4, 4 * sizeof(float)),
				0);
	CU_ASSERT_PTR_EQUAL(ptrs[0], ptrs[2]);
	CU_ASSERT_PTR_NOT_EQUAL(ptrs[0], ptrs[1]);
	done(be, c);
}

static void test_prefetch_before_lookup(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 64, 2, 2);
	const uint64_t b1[] = {1, 2, 3, 1};
	const uint64_t b2[] = {3, 4, 5};
	const uint64_t b3[] = {6};
	float out[4 * 4], g[4 * 4] = {0};
	struct emb_cache_stats st;

	CU_ASSERT_EQUAL(emb_cache_prefetch(c, b1, 4), 0);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, b2, 3), 0);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, b3, 1), -EBUSY);
	CU_ASSERT_EQUAL(be->fetch_calls, 2);
	CU_ASSERT_EQUAL(be->nlog, 5); /* 3 was in flight for b1 already */
	CU_ASSERT_EQUAL(emb_cache_lookup(c, b1, 4, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, b3, 1), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, b2, 3, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, b3, 1, out), 0);
	CU_ASSERT_EQUAL(be->fetch_calls, 3);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.stalls, 0);
	CU_ASSERT_EQUAL(st.sync_fetches, 0);
	CU_ASSERT_EQUAL(st.queued, 0);

	/* A fetch still in flight at lookup is waited for, and counted. */
	be->slow = true;
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, (const uint64_t[]){7, 8}, 2), 0);
	CU_ASSERT_EQUAL(be->fetch_calls, 4);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, (const uint64_t[]){7, 8}, 2, out),
			0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.stalls, 1);
	CU_ASSERT_EQUAL(st.sync_fetches, 0);
	CU_ASSERT_EQUAL(be->fetch_calls, 4);
	done(be, c);
}

static void pins_survive(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 8, 2, 100);
	const uint64_t q[] = {1, 2, 3, 4};
	uint64_t other[5], stalls;
	float out[5 * 4];
	struct emb_cache_stats st;

	CU_ASSERT_EQUAL(emb_cache_prefetch(c, q, 4), 0);
	/* Unrelated batches churn through the 4 unpinned slots. */
	for (uint64_t k = 0; k < 10; k++) {
		for (uint64_t i = 0; i < 4; i++)
			other[i] = 100 + 4 * k + i;
		CU_ASSERT_EQUAL(emb_cache_lookup(c, other, 4, out), 0);
	}
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.pinned, 4 + 4); /* queued + current */
	CU_ASSERT(st.evictions >= 30);
	/* Five distinct ids do not fit beside four pinned ones. */
	for (uint64_t i = 0; i < 5; i++)
		other[i] = 900 + i;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, other, 5, out), EMB_ECACHEFULL);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, other, 5), EMB_ECACHEFULL);

	be->fetch_calls = 0;
	stalls = st.stalls;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, q, 4, out), 0);
	CU_ASSERT_EQUAL(be->fetch_calls, 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.stalls, stalls);
	CU_ASSERT_EQUAL(st.pinned, 4);
	done(be, c);
}

/*
 * Write-through prefetch fetches ahead only what will still be fresh when
 * used: with depth k and the trainer's order (lookup, prefetch, update), a
 * queued batch is used k updates later.
 */
static void prefetch_vs_staleness(uint32_t depth, uint32_t staleness)
{
	enum { STEPS = 12 };
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 256, depth,
		      staleness);
	uint64_t ids[STEPS + 4][3];
	float out[3 * 4], g[3 * 4] = {0};
	struct emb_cache_stats st;
	uint32_t before;

	/* Every batch new ids, so every row is fetched exactly once. */
	for (uint64_t s = 0; s < STEPS + 4; s++)
		for (uint64_t i = 0; i < 3; i++)
			ids[s][i] = 1000 + 3 * s + i;
	for (uint32_t s = 0; s < depth; s++)
		CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids[s], 3), 0);
	for (uint32_t s = 0; s < STEPS; s++) {
		CU_ASSERT_EQUAL(emb_cache_lookup(c, ids[s], 3, out), 0);
		before = be->fetch_calls;
		CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids[s + depth], 3), 0);
		/* Fetched now only if depth updates of age are allowed. */
		CU_ASSERT_EQUAL(be->fetch_calls - before,
				depth <= staleness ? 1u : 0u);
		CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	}
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.rows_fetched,
			3 * (STEPS + depth) -
			    (depth <= staleness ? 0 : 3 * depth));
	CU_ASSERT_EQUAL(st.refetches, 0);
	/* Before the first step, batch s is used s updates later. */
	CU_ASSERT_EQUAL(st.sync_fetches,
			depth <= staleness ? 0u : STEPS - (staleness + 1));
	done(be, c);
}

static void test_prefetch_vs_staleness(void)
{
	prefetch_vs_staleness(2, 2);
	prefetch_vs_staleness(2, 1);
	prefetch_vs_staleness(1, 0);
	prefetch_vs_staleness(3, 7);
}

static void test_pins_survive(void)
{
	g_policy = EMB_CACHE_LRU;
	pins_survive();
	g_policy = EMB_CACHE_CLOCK;
	pins_survive();
	g_policy = EMB_CACHE_TINYLFU;
	pins_survive();
	g_policy = EMB_CACHE_LRU;
}

/*
 * Uses 50 hot ids 5 times each, then scans 1000 ids used once, then looks
 * at the hot ids again. Returns how many of them had to be fetched.
 */
static uint32_t hot_after_scan(uint32_t policy, struct emb_cache_stats *st)
{
	struct backend *be = be_new();
	struct emb_cache *c;
	uint32_t refetched = 0;

	g_policy = policy;
	c = cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 100, 0,
		      1000);
	g_policy = EMB_CACHE_LRU;
	for (int round = 0; round < 5; round++)
		for (uint64_t id = 1; id <= 50; id++)
			touch(be, c, id);
	for (uint64_t id = 1000; id < 2000; id++)
		CU_ASSERT_EQUAL(touch(be, c, id), 1);
	for (uint64_t id = 1; id <= 50; id++)
		refetched += touch(be, c, id);
	emb_cache_stats(c, st);
	done(be, c);
	return refetched;
}

/* TinyLFU: rows seen once lose against rows seen often, LRU's do not. */
static void test_tinylfu_scan_keeps_hot_rows(void)
{
	struct emb_cache_stats st;

	CU_ASSERT_EQUAL(hot_after_scan(EMB_CACHE_TINYLFU, &st), 0);
	CU_ASSERT(st.rejected > 0);
	CU_ASSERT_EQUAL(st.rows, 100);
	CU_ASSERT_EQUAL(hot_after_scan(EMB_CACHE_LRU, &st), 50);
	CU_ASSERT_EQUAL(st.admitted + st.rejected, 0);
}

/*
 * TinyLFU with 10 rows (a window of 1, 9 in main): a new row used often
 * while in the window replaces main's victim when it leaves; one used once
 * does not.
 */
static void test_tinylfu_admits_frequent_rows(void)
{
	struct backend *be = be_new();
	struct emb_cache *c;
	struct emb_cache_stats st;

	g_policy = EMB_CACHE_TINYLFU;
	c = cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 10, 0,
		      1000);
	g_policy = EMB_CACHE_LRU;
	/* 1..9 pass through the window into probation (1 at its tail). */
	for (uint64_t id = 1; id <= 10; id++)
		CU_ASSERT_EQUAL(touch(be, c, id), 1);
	/* 100 enters the window; 10 leaves it and ties with main's victim
	 * 1 (both seen once): 10 goes, 1 survives. */
	CU_ASSERT_EQUAL(touch(be, c, 100), 1);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.rejected, 1);
	CU_ASSERT_EQUAL(st.admitted, 0);
	/* 100, seen five times, beats main's next victim 2 (seen once)
	 * when 101 pushes it out of the window. */
	for (int k = 0; k < 4; k++)
		CU_ASSERT_EQUAL(touch(be, c, 100), 0);
	CU_ASSERT_EQUAL(touch(be, c, 101), 1);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.admitted, 1);
	CU_ASSERT_EQUAL(st.rejected, 1);
	CU_ASSERT_EQUAL(touch(be, c, 100), 0);
	CU_ASSERT_EQUAL(touch(be, c, 1), 0);
	CU_ASSERT_EQUAL(touch(be, c, 2), 1);
	CU_ASSERT_EQUAL(touch(be, c, 10), 1);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.rows, 10);
	done(be, c);
}

/* CLOCK keeps a row used since the hand last passed, LRU-like. */
static void test_clock_second_chance(void)
{
	struct backend *be = be_new();
	struct emb_cache *c;
	struct emb_cache_stats st;

	g_policy = EMB_CACHE_CLOCK;
	c = cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 4, 0,
		      1000);
	g_policy = EMB_CACHE_LRU;
	for (uint64_t id = 1; id <= 4; id++)
		CU_ASSERT_EQUAL(touch(be, c, id), 1);
	/* All four were used: one sweep clears their bits, then 1 goes. */
	CU_ASSERT_EQUAL(touch(be, c, 5), 1);
	CU_ASSERT_EQUAL(touch(be, c, 2), 0);
	/* 2 was used again and survives; 3 was not and goes. */
	CU_ASSERT_EQUAL(touch(be, c, 6), 1);
	CU_ASSERT_EQUAL(touch(be, c, 2), 0);
	CU_ASSERT_EQUAL(touch(be, c, 4), 0);
	CU_ASSERT_EQUAL(touch(be, c, 3), 1);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.evictions, 3);
	CU_ASSERT_EQUAL(st.rows, 4);
	done(be, c);
}

/* Full table row of id (weights + state) into row. */
static void table_row(struct emb_table *t, uint64_t id, float *row)
{
	const float *p = NULL;

	CU_ASSERT_EQUAL_FATAL(
	    emb_table_pull_ptrs(t, &id, 1, &p, EMB_PULL_NOCREATE), 0);
	memcpy(row, p, emb_table_row_floats(t) * sizeof(float));
}

static void test_write_back_on_evict(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD, 4, 2, 0, 0);
	const uint64_t ab[] = {1, 2};
	float out[2 * 4], g[2 * 4], want[8], got[8], before[8];
	uint64_t three = 3;
	const float *p[2];
	struct emb_cache_stats st;

	for (int i = 0; i < 8; i++)
		g[i] = 0.5f + (float)i;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, ab, 2, out), 0);
	table_row(be->t, 1, before);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup_ptrs(c, ab, 2, p), 0);
	memcpy(want, p[0], 8 * sizeof(float)); /* cached row 1 with state */
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.dirty, 2);
	/* The servers have not seen the update yet. */
	table_row(be->t, 1, got);
	CU_ASSERT_EQUAL(memcmp(got, before, sizeof(got)), 0);

	CU_ASSERT_EQUAL(emb_cache_lookup(c, &three, 1, out), 0);
	CU_ASSERT_EQUAL(be->wb_calls, 1);
	CU_ASSERT_EQUAL(be->wb_rows, 1);
	table_row(be->t, 1, got);
	CU_ASSERT_EQUAL(memcmp(got, want, sizeof(got)), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.write_backs, 1);
	CU_ASSERT_EQUAL(st.dirty, 1);
	CU_ASSERT_EQUAL(st.bytes_written, 8 * sizeof(float));

	/* The same update applied on the server gives the same row. */
	CU_ASSERT_EQUAL(emb_cache_flush(c), 0);
	CU_ASSERT_EQUAL(be->wb_rows, 2);
	table_row(be->t, 2, got);
	{
		struct emb_table *ref = table_new(4, EMB_OPTIM_ADAGRAD);
		uint64_t two = 2;

		CU_ASSERT_EQUAL(emb_table_push(ref, &two, 1, g + 4), 0);
		table_row(ref, 2, want);
		for (int i = 0; i < 8; i++)
			CU_ASSERT(close_to(got[i], want[i]));
		emb_table_destroy(ref);
	}
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.dirty, 0);
	CU_ASSERT_EQUAL(emb_cache_flush(c), 0);
	CU_ASSERT_EQUAL(be->wb_calls, 2); /* nothing left to write */
	done(be, c);
}

static void test_write_back_failure_keeps_dirty(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_BACK, EMB_OPTIM_SGD, 4, 1, 0, 0);
	uint64_t one = 1, two = 2;
	float out[4], g[4] = {1, 1, 1, 1};
	struct emb_cache_stats st;

	CU_ASSERT_EQUAL(emb_cache_lookup(c, &one, 1, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	be->fail_wb = 1;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, &two, 1, out), EMB_EWRITEBACK);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.dirty, 1);
	CU_ASSERT_EQUAL(st.rows, 1);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, &two, 1, out), 0);
	CU_ASSERT_EQUAL(be->wb_rows, 1);
	done(be, c);
}

/* Zipf-ish ids in [0, range): log-uniform ranks, scattered. */
static uint64_t draw_id(uint64_t *rng, uint32_t range)
{
	double u = (double)(emb_splitmix64(rng) >> 11) * 0x1.0p-53;
	uint64_t rank = (uint64_t)pow((double)range, u) - 1;

	return emb_id_hash(rank) >> 8;
}

static float draw_noise(uint64_t *rng)
{
	return (float)((double)(emb_splitmix64(rng) >> 11) * 0x1.0p-53) - 0.5f;
}

/*
 * Trains through the cache and, in lockstep, straight on a reference table:
 * gradients depend on the rows looked up, so any stale or wrong row shows up
 * in the result. Each lookup must equal the reference pull, and the tables
 * must agree at the end.
 */
static void train_vs_reference(uint32_t mode, uint32_t optim, uint32_t depth)
{
	enum { DIM = 8, BATCH = 256, STEPS = 150, RANGE = 3000, CAP = 800 };
	struct backend *be = be_new();
	struct emb_cache *c = cache_new(be, mode, optim, DIM, CAP, depth, 0);
	struct emb_table *ref = table_new(DIM, optim);
	static uint64_t ids[STEPS][BATCH];
	static float out[BATCH * DIM], want[BATCH * DIM], g[BATCH * DIM];
	uint64_t rng = 1234, nrng = 99;
	uint32_t rf = emb_table_row_floats(ref), bad = 0;
	struct emb_cache_stats st;
	float *ra, *rb;

	for (int s = 0; s < STEPS; s++)
		for (int i = 0; i < BATCH; i++)
			ids[s][i] = draw_id(&rng, RANGE);
	for (uint32_t s = 0; s < depth && s < STEPS; s++)
		CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids[s], BATCH), 0);
	for (uint32_t s = 0; s < STEPS; s++) {
		CU_ASSERT_EQUAL_FATAL(emb_cache_lookup(c, ids[s], BATCH, out),
				      0);
		if (s + depth < STEPS && depth)
			CU_ASSERT_EQUAL(
			    emb_cache_prefetch(c, ids[s + depth], BATCH), 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_table_pull(ref, ids[s], BATCH, want, 0, NULL) >= 0,
		    true);
		for (int i = 0; i < BATCH * DIM; i++) {
			if (!close_to(out[i], want[i]))
				bad++;
			g[i] = 0.5f * want[i] + draw_noise(&nrng);
		}
		CU_ASSERT_EQUAL_FATAL(emb_cache_update(c, g), 0);
		CU_ASSERT_EQUAL_FATAL(emb_table_push(ref, ids[s], BATCH, g), 0);
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(emb_cache_flush(c), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT(st.evictions > 0);
	CU_ASSERT(mode == EMB_CACHE_WRITE_THROUGH || st.write_backs > 0);
	if (depth)
		CU_ASSERT(st.fetch_calls >= STEPS - depth);

	/* Every row the reference holds, weights and optimizer state. */
	ra = malloc(rf * sizeof(float));
	rb = malloc(rf * sizeof(float));
	bad = 0;
	for (int s = 0; s < STEPS; s++) {
		for (int i = 0; i < BATCH; i++) {
			table_row(be->t, ids[s][i], ra);
			table_row(ref, ids[s][i], rb);
			for (uint32_t j = 0; j < rf; j++)
				bad += !close_to(ra[j], rb[j]);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(ra);
	free(rb);
	emb_table_destroy(ref);
	done(be, c);
}

static void test_write_through_matches(void)
{
	train_vs_reference(EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_ADAGRAD, 2);
	train_vs_reference(EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 0);
}

static void test_write_back_matches(void)
{
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD, 2);
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAM, 1);
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_FTRL, 0);
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ROWWISE_ADAGRAD, 1);
	g_policy = EMB_CACHE_CLOCK;
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD, 2);
	train_vs_reference(EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 1);
	g_policy = EMB_CACHE_TINYLFU;
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD, 2);
	train_vs_reference(EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAM, 0);
	train_vs_reference(EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 1);
	g_policy = EMB_CACHE_LRU;
}

/*
 * Compact tables: trains through the cache over a table of format fmt and,
 * in lockstep, straight on a reference table of that format, as
 * train_vs_reference() does. Write-through (staleness 0) and write-back
 * while every row stays cached are bit for bit the reference: lookups
 * decode the bits the table holds, and a write-back update rounds with the
 * key the store's push uses. A write-back cache that evicts (cap < the
 * rows used) numbers a refetched row's updates from 1 again, where the
 * store's count of a row it was assigned restarts from 0: other rounding
 * bits, so there the rows must only stay finite and close. Returns the
 * bytes of one cached row.
 */
static uint32_t train_compact(uint32_t fmt, uint32_t mode, uint32_t optim,
			      uint32_t depth, uint32_t cap)
{
	enum { DIM = 64, BATCH = 128, STEPS = 60, RANGE = 600 };
	struct backend *be = be_new();
	struct emb_cache *c;
	struct emb_table *ref;
	static uint64_t ids[STEPS][BATCH];
	static float out[BATCH * DIM], want[BATCH * DIM], g[BATCH * DIM];
	const float *ptrs[BATCH];
	uint64_t rng = 4321, nrng = 77;
	uint32_t rf, bytes, diff = 0, far = 0, bad = 0, ptr_bad = 0;
	const bool exact = mode == EMB_CACHE_WRITE_THROUGH || cap >= RANGE;
	struct emb_cache_stats st;
	float *ra, *rb, *wa, *wb;

	g_fmt = fmt;
	c = cache_new(be, mode, optim, DIM, cap, depth, 0);
	ref = table_new(DIM, optim);
	g_fmt = EMB_ROWFMT_FP32;
	rf = emb_table_row_floats(ref);
	CU_ASSERT_EQUAL(emb_table_row_format(ref), fmt);
	for (int s = 0; s < STEPS; s++)
		for (int i = 0; i < BATCH; i++)
			ids[s][i] = draw_id(&rng, RANGE);
	for (uint32_t s = 0; s < depth; s++)
		CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids[s], BATCH), 0);
	for (uint32_t s = 0; s < STEPS; s++) {
		if (s % 7 == 3) {
			/* lookup_ptrs decodes too. */
			CU_ASSERT_EQUAL_FATAL(
			    emb_cache_lookup_ptrs(c, ids[s], BATCH, ptrs), 0);
			for (int i = 0; i < BATCH; i++) {
				memcpy(out + (size_t)i * DIM, ptrs[i],
				       DIM * sizeof(float));
				ptr_bad += ptrs[i] != ptrs[0] &&
					   ids[s][i] == ids[s][0];
			}
		} else {
			CU_ASSERT_EQUAL_FATAL(
			    emb_cache_lookup(c, ids[s], BATCH, out), 0);
		}
		if (depth && s + depth < STEPS)
			CU_ASSERT_EQUAL(
			    emb_cache_prefetch(c, ids[s + depth], BATCH), 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_table_pull(ref, ids[s], BATCH, want, 0, NULL) >= 0,
		    true);
		for (int i = 0; i < BATCH * DIM; i++) {
			diff += memcmp(&out[i], &want[i], sizeof(float)) != 0;
			far += !(fabsf(out[i] - want[i]) <=
				 0.05f * fabsf(want[i]) + 0.02f);
			g[i] = 0.5f * out[i] + draw_noise(&nrng);
		}
		CU_ASSERT_EQUAL_FATAL(emb_cache_update(c, g), 0);
		/* The reference's gradients are the cache's: any
		 * difference in the rows is the rows', not the model's. */
		CU_ASSERT_EQUAL_FATAL(emb_table_push(ref, ids[s], BATCH, g), 0);
	}
	CU_ASSERT_EQUAL(ptr_bad, 0);
	CU_ASSERT_EQUAL(far, 0);
	if (exact)
		CU_ASSERT_EQUAL(diff, 0);
	emb_cache_cancel(c);
	CU_ASSERT_EQUAL(emb_cache_flush(c), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT(mode == EMB_CACHE_WRITE_THROUGH || st.write_backs > 0);
	CU_ASSERT(exact || st.evictions > 0);
	/* Rows cross from the servers as the table keeps them. */
	bytes = emb_cache_row_floats(c) * 4;
	CU_ASSERT_EQUAL(st.bytes_fetched, (uint64_t)st.rows_fetched * bytes);

	/* Every row either side holds: whole, in the table's format. */
	ra = malloc(rf * sizeof(float));
	rb = malloc(rf * sizeof(float));
	wa = malloc(DIM * sizeof(float));
	wb = malloc(DIM * sizeof(float));
	CU_ASSERT_FATAL(ra && rb && wa && wb);
	diff = 0;
	for (int s = 0; s < STEPS; s++) {
		for (int i = 0; i < BATCH; i++) {
			table_row(be->t, ids[s][i], ra);
			table_row(ref, ids[s][i], rb);
			bad += !emb_table_row_finite(be->t, ra);
			diff += memcmp(ra, rb, rf * sizeof(float)) != 0;
			emb_rowfmt_decode(fmt, ra, wa, DIM);
			emb_rowfmt_decode(fmt, rb, wb, DIM);
			for (uint32_t j = 0; j < DIM; j++)
				bad += !(fabsf(wa[j] - wb[j]) <=
					 0.05f * fabsf(wb[j]) + 0.02f);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	if (exact) {
		CU_ASSERT_EQUAL(diff, 0);
	} else {
		CU_ASSERT(diff > 0); /* the keys did differ: see above */
	}
	free(ra);
	free(rb);
	free(wa);
	free(wb);
	emb_table_destroy(ref);
	done(be, c);
	return bytes;
}

static void test_compact_write_through(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP32, EMB_ROWFMT_FP16,
					EMB_ROWFMT_BF16, EMB_ROWFMT_INT8};
	/* Bytes of a cached row of dim 64: the weights as the table keeps
	 * them (int8: 64 codes, a scale and a bias). */
	static const uint32_t want[] = {256, 128, 128, 72};

	for (uint32_t k = 0; k < 4; k++) {
		uint32_t b = train_compact(fmts[k], EMB_CACHE_WRITE_THROUGH,
					   EMB_OPTIM_ADAGRAD, 2, 200);

		CU_ASSERT_EQUAL(b, want[k]);
		printf("\n    write-through %s: %u bytes a cached row",
		       emb_rowfmt_name(fmts[k]), b);
	}
}

static void test_compact_write_back(void)
{
	/* Adagrad's state is dim fp32 floats after the weights. */
	CU_ASSERT_EQUAL(train_compact(EMB_ROWFMT_FP16, EMB_CACHE_WRITE_BACK,
				      EMB_OPTIM_ADAGRAD, 2, 1024),
			128 + 256);
	CU_ASSERT_EQUAL(train_compact(EMB_ROWFMT_INT8, EMB_CACHE_WRITE_BACK,
				      EMB_OPTIM_SGD, 1, 1024),
			72);
	CU_ASSERT_EQUAL(train_compact(EMB_ROWFMT_BF16, EMB_CACHE_WRITE_BACK,
				      EMB_OPTIM_ADAM, 0, 1024),
			128 + 4 * (2 * 64 + 1));
	g_policy = EMB_CACHE_TINYLFU;
	train_compact(EMB_ROWFMT_FP16, EMB_CACHE_WRITE_BACK, EMB_OPTIM_ADAGRAD,
		      2, 400);
	train_compact(EMB_ROWFMT_INT8, EMB_CACHE_WRITE_BACK, EMB_OPTIM_SGD, 0,
		      300);
	g_policy = EMB_CACHE_LRU;
}

/*
 * The rounding key of a write-back update, exactly: (seed, id, 2) for the
 * first update after a fetch, 3 for the next, and 2 again once the row
 * was written back, evicted and fetched anew. A result fp16 cannot hold
 * is refused whole, nothing changed.
 */
static void test_compact_write_back_key(void)
{
	enum { DIM = 16 };
	struct backend *be = be_new();
	struct emb_cache *c;
	struct emb_optim_cfg oc;
	const uint64_t ab[2] = {5, 6};
	uint64_t id = 5, other = 9;
	float g[2 * DIM], out[2 * DIM], w[DIM], before[2 * DIM];
	uint16_t want[DIM], got[DIM];
	uint32_t count = 2, elem = 0;
	uint64_t bad_id = 0;
	struct emb_cache_stats st;

	g_fmt = EMB_ROWFMT_FP16;
	c = cache_new(be, EMB_CACHE_WRITE_BACK, EMB_OPTIM_SGD, DIM, 2, 0, 0);
	g_fmt = EMB_ROWFMT_FP32;
	oc = table_opts(DIM, EMB_OPTIM_SGD).optim;
	for (int j = 0; j < 2 * DIM; j++)
		g[j] = 0.37f + 0.011f * (float)j;
	for (int round = 0; round < 2; round++) {
		for (int k = 0; k < 2; k++, count++) {
			/* Expected: the row as the table (or the last
			 * update) left it, stepped in fp32, rounded with
			 * the key of this update. */
			CU_ASSERT_EQUAL_FATAL(emb_cache_lookup(c, &id, 1, w),
					      0);
			CU_ASSERT_FATAL(emb_optim_apply_row(&oc, w, g, DIM));
			CU_ASSERT_FATAL(emb_rowfmt_encode(
			    EMB_ROWFMT_FP16, w, want, DIM,
			    EMB_ROUND_STOCHASTIC,
			    emb_rowfmt_sr_key(7, id, count)));
			CU_ASSERT_EQUAL_FATAL(emb_cache_update(c, g), 0);
		}
		CU_ASSERT_EQUAL(emb_cache_flush(c), 0);
		table_row(be->t, id, (float *)(void *)got);
		CU_ASSERT(memcmp(got, want, sizeof(want)) == 0);
		/* Capacity 2: 9 and 6 push 5 out; it comes back with
		 * count 1. */
		CU_ASSERT_EQUAL(emb_cache_lookup(c, &other, 1, out), 0);
		CU_ASSERT_EQUAL(emb_cache_lookup(c, &ab[1], 1, out), 0);
		count = 2;
	}
	emb_cache_stats(c, &st);
	CU_ASSERT(st.evictions >= 2);

	/* 5 and 6 cached; 6's step leaves fp16's range: nothing changes. */
	CU_ASSERT_EQUAL_FATAL(emb_cache_lookup(c, ab, 2, before), 0);
	for (int j = 0; j < DIM; j++)
		g[DIM + j] = 1e7f;
	CU_ASSERT_EQUAL(emb_cache_update(c, g), EMB_ENONFINITE);
	emb_cache_nonfinite(c, &bad_id, &elem);
	CU_ASSERT_EQUAL(bad_id, 6);
	CU_ASSERT_EQUAL(elem, UINT32_MAX);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.dirty, 0);
	CU_ASSERT_EQUAL(st.pinned, 0);
	CU_ASSERT_EQUAL_FATAL(emb_cache_lookup(c, ab, 2, out), 0);
	CU_ASSERT(memcmp(out, before, sizeof(out)) == 0);
	done(be, c);
}

static void test_compact_bad_format(void)
{
	struct emb_cache_opts o = EMB_CACHE_OPTS_DEFAULT;
	struct emb_cache *c = NULL;

	o.ops.fetch_start = be_fetch_start;
	o.ops.fetch_wait = be_fetch_wait;
	o.ops.push = be_push;
	o.row_format = EMB_ROWFMT_COUNT;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADFORMAT);
	o.row_format = EMB_ROWFMT_INT8;
	o.rounding = 2;
	CU_ASSERT_EQUAL(emb_cache_create(&o, &c), EMB_EBADFORMAT);
	CU_ASSERT_PTR_NULL(c);
	o.rounding = EMB_ROUND_NEAREST;
	CU_ASSERT_EQUAL_FATAL(emb_cache_create(&o, &c), 0);
	CU_ASSERT_EQUAL(emb_cache_row_floats(c), (8 + 8) / 4);
	emb_cache_destroy(c);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Synchronous lookups with S = 2: a model of when each id was fetched
 * predicts exactly which ids each lookup fetches.
 */
static void test_staleness_refetch(void)
{
	enum { S = 2, RANGE = 40, BATCH = 16, STEPS = 60 };
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 64, 0, S);
	int64_t fetched[RANGE];
	uint64_t ids[BATCH], want[BATCH];
	float out[BATCH * 4], g[BATCH * 4];
	uint64_t rng = 5;
	uint32_t nwant, total_stale = 0;
	struct emb_cache_stats st;

	for (int i = 0; i < RANGE; i++)
		fetched[i] = -1;
	for (int i = 0; i < BATCH * 4; i++)
		g[i] = 0.25f;
	for (int64_t step = 0; step < STEPS; step++) {
		nwant = 0;
		for (int i = 0; i < BATCH; i++) {
			uint64_t id = emb_splitmix64(&rng) % RANGE;
			bool dup = false;

			ids[i] = id;
			for (int k = 0; k < i; k++)
				dup |= ids[k] == id;
			if (dup)
				continue;
			if (fetched[id] < 0 || step - fetched[id] > S) {
				total_stale += fetched[id] >= 0;
				want[nwant++] = id;
				fetched[id] = step;
			}
		}
		be->nlog = 0;
		CU_ASSERT_EQUAL_FATAL(emb_cache_lookup(c, ids, BATCH, out), 0);
		CU_ASSERT_EQUAL_FATAL(be->nlog, nwant);
		qsort(want, nwant, sizeof(*want), cmp_u64);
		qsort(be->log, be->nlog, sizeof(*be->log), cmp_u64);
		CU_ASSERT_EQUAL(memcmp(want, be->log, nwant * sizeof(*want)),
				0);
		/* Each row seen is no older than S updates. */
		{
			float srv[BATCH * 4];

			CU_ASSERT(emb_table_pull(be->t, ids, BATCH, srv, 0,
						 NULL) >= 0);
			for (int i = 0; i < BATCH; i++) {
				int64_t age = step - fetched[ids[i]];
				float lag = srv[i * 4] - out[i * 4];

				CU_ASSERT(age >= 0 && age <= S);
				if (age == 0)
					CU_ASSERT(lag == 0.0f);
				/* sgd, lr 0.05, grad 0.25 per update */
				CU_ASSERT(lag <= 0.0f &&
					  lag >= -0.0125f * S * BATCH - 1e-4f);
			}
		}
		CU_ASSERT_EQUAL_FATAL(emb_cache_update(c, g), 0);
	}
	emb_cache_stats(c, &st);
	CU_ASSERT(total_stale > 0);
	CU_ASSERT_EQUAL(st.refetches, total_stale);
	done(be, c);
}

static void test_batch_larger_than_cache(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 4, 1, 0);
	uint64_t ids[8] = {1, 2, 3, 4, 5, 1, 2, 3};
	float out[8 * 4];
	struct emb_cache_stats st;

	CU_ASSERT_EQUAL(emb_cache_lookup(c, ids, 5, out), EMB_ECACHEFULL);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, ids, 5), EMB_ECACHEFULL);
	CU_ASSERT_EQUAL(be->fetch_calls, 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.pinned, 0);
	CU_ASSERT_EQUAL(st.queued, 0);
	/* Eight ids but four distinct fit. */
	ids[4] = 4;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, ids, 8, out), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, ids, 1025, out), -EINVAL);
	done(be, c);
}

static void test_fetch_error(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_BACK, EMB_OPTIM_SGD, 4, 16, 2, 0);
	const uint64_t a[] = {1, 2, 3};
	const uint64_t b[] = {3, 4};
	float out[3 * 4], g[3 * 4] = {0};
	struct emb_cache_stats st;

	/* A synchronous fetch that cannot start. */
	be->fail_start = 1;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 3, out), EMB_EFETCH);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), -EINVAL);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.rows, 0);
	CU_ASSERT_EQUAL(st.pinned, 0);

	/* A prefetch whose wait fails: the lookup reports it... */
	be->fail_wait = 2;
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, a, 3), 0);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, b, 2), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 3, out), EMB_EFETCH);
	/* ...and the next batch, sharing row 3, still works. */
	CU_ASSERT_EQUAL(emb_cache_lookup(c, b, 2, out), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 3, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);

	/* A prefetch that cannot start is retried by lookup. */
	be->fail_start = be->fetch_calls + 1;
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, (const uint64_t[]){7}, 1), 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, (const uint64_t[]){7}, 1, out), 0);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.queued, 0);
	CU_ASSERT_EQUAL(st.pinned, 1);
	done(be, c);
}

static void test_push_error(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 16, 0, 0);
	const uint64_t a[] = {1, 2};
	float out[2 * 4], g[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1};
	struct emb_cache_stats st;

	be->fail_push = 1;
	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 2, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), EMB_EPUSH);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.pinned, 0);
	CU_ASSERT_EQUAL(emb_cache_lookup(c, a, 2, out), 0);
	CU_ASSERT_EQUAL(emb_cache_update(c, g), 0);
	CU_ASSERT_EQUAL(be->push_calls, 2);
	done(be, c);
}

static void test_cancel(void)
{
	struct backend *be = be_new();
	struct emb_cache *c =
	    cache_new(be, EMB_CACHE_WRITE_THROUGH, EMB_OPTIM_SGD, 4, 16, 2, 5);
	struct emb_cache_stats st;

	be->slow = true;
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, (const uint64_t[]){1, 2}, 2), 0);
	CU_ASSERT_EQUAL(emb_cache_prefetch(c, (const uint64_t[]){3}, 1), 0);
	emb_cache_cancel(c);
	emb_cache_stats(c, &st);
	CU_ASSERT_EQUAL(st.queued, 0);
	CU_ASSERT_EQUAL(st.pinned, 0);
	CU_ASSERT_EQUAL(st.rows, 3);
	for (int t = 0; t < NTOK; t++)
		CU_ASSERT(!be->live[t]);
	CU_ASSERT_EQUAL(touch(be, c, 3), 0);
	done(be, c);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"rejects bad options", test_bad_opts},
	    {"evicts the least recently used row", test_lru_order},
	    {"counts hits and misses of distinct ids", test_hits_misses},
	    {"returns the row of every position", test_rows_per_position},
	    {"prefetch fetches before lookup", test_prefetch_before_lookup},
	    {"write-through prefetch fetches only rows fresh at use",
	     test_prefetch_vs_staleness},
	    {"pinned rows survive eviction pressure", test_pins_survive},
	    {"clock gives a used row a second chance",
	     test_clock_second_chance},
	    {"tinylfu: a scan of one-off rows does not flush hot rows",
	     test_tinylfu_scan_keeps_hot_rows},
	    {"tinylfu: a row used often is admitted over main's victim",
	     test_tinylfu_admits_frequent_rows},
	    {"writes back dirty rows on eviction and flush",
	     test_write_back_on_evict},
	    {"failed write-back keeps rows dirty",
	     test_write_back_failure_keeps_dirty},
	    {"write-through S=0 matches the table", test_write_through_matches},
	    {"write-back after flush matches the table (lru, clock, tinylfu)",
	     test_write_back_matches},
	    {"staleness refetches exactly the stale rows",
	     test_staleness_refetch},
	    {"rejects a batch larger than the cache",
	     test_batch_larger_than_cache},
	    {"fetch error surfaces from lookup", test_fetch_error},
	    {"push error surfaces from update", test_push_error},
	    {"cancel drops queued batches", test_cancel},
	    {"compact rows: write-through is the table bit for bit, in the "
	     "table's bytes",
	     test_compact_write_through},
	    {"compact rows: write-back rounds as the store does; evicting "
	     "stays finite and close",
	     test_compact_write_back},
	    {"compact rows: write-back rounding key, and refused results",
	     test_compact_write_back_key},
	    {"compact rows: unknown format or rounding is refused",
	     test_compact_bad_format},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cache/cache", cases);
}
