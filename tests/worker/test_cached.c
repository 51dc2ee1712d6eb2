/*
 * tests/worker/test_cached.c - cached tables against a real server: PULL
 * with optimizer state, training through the cache in both modes ends with
 * the table the uncached path gives, prefetch pulls ahead of lookup,
 * staleness refetches, oversized batches fail, write-back is refused on a
 * synchronous table, and a dead server is an error rather than a hang.
 * Compact tables (fp16, bf16, int8) through the cache: write-through
 * lookups are the uncached pulls bit for bit, rows cross and stay in the
 * table's bytes, and write-back rounds as the servers do.
 * Single-threaded apart from the servers.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/hash.h"
#include "common/rowfmt.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "worker/embstore.h"

#define DIM	 8
#define BATCH	 96
#define IDS	 400 /* id range of the training loops */
#define STEPS	 40
#define CAPACITY 256 /* < IDS: the loops evict and write back */

/* Relative difference within 1e-5 (absolute near zero). */
static bool close_to(float a, float b)
{
	double scale = fmax(1.0, fmax(fabs((double)a), fabs((double)b)));

	return fabs((double)a - (double)b) <= 1e-5 * scale;
}

static bool rows_close(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!close_to(a[i], b[i]))
			return false;
	return true;
}

/* Batch s: skewed ids over [0, IDS) with duplicates (a few hot ids). */
static void make_ids(uint32_t s, uint64_t *ids, uint32_t n)
{
	uint64_t st = 0x5eed + s * 7919u;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t r = emb_splitmix64(&st);

		ids[i] = (r & 3) ? r % 24 : (r >> 8) % IDS;
	}
}

/* Gradients that depend on the rows looked up, as a model's would. */
static void make_grads(uint32_t s, const uint64_t *ids, const float *rows,
		       uint32_t n, float *g)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < DIM; j++)
			g[i * DIM + j] = 0.5f * rows[i * DIM + j] +
					 0.01f * (float)((ids[i] + j + s) % 7) -
					 0.03f;
}

static struct emb_table_spec spec_of(const char *name, uint32_t kind)
{
	struct emb_table_spec sp = nt_spec(name, DIM, 77);

	sp.optim.kind = kind;
	sp.optim.lr = 0.05f;
	return sp;
}

static void test_pull_with_state(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_server *srv = nt_server_start(&o);
	char addr[64];
	uint16_t port = emb_server_port(srv);
	struct emb_client *c;
	struct emb_table_spec sp = spec_of("state", EMB_OPTIM_ADAGRAD);
	struct emb_client_table *t = NULL;
	const uint64_t ids[3] = {11, 12, 11};
	const uint64_t missing[2] = {12, 999};
	float rows[3 * 2 * DIM], got[3 * 2 * DIM], g[3 * DIM];
	uint8_t found[2];
	uint32_t rf;

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	rf = emb_client_table_row_floats(t);
	CU_ASSERT_EQUAL_FATAL(rf, 2 * DIM); /* Adagrad: one sum per weight */

	/* What assign with state stores, pull with state gives back. */
	for (uint32_t i = 0; i < 2 * rf; i++)
		rows[i] = (float)i * 0.25f + 1.0f;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_assign(t, ids, 2, rows, true),
			      0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(t, ids, 3, got, EMB_CLIENT_WITH_STATE, NULL),
	    0);
	CU_ASSERT_EQUAL(memcmp(got, rows, 2 * rf * sizeof(float)), 0);
	CU_ASSERT_EQUAL(memcmp(got + 2 * rf, rows, rf * sizeof(float)), 0);

	/* A push moves weights and state the way the optimizer says. */
	for (uint32_t i = 0; i < DIM; i++)
		g[i] = 0.5f;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_push(t, ids, 1, g, 0, 0), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(t, ids, 1, got, EMB_CLIENT_WITH_STATE, NULL),
	    0);
	for (uint32_t j = 0; j < DIM; j++) {
		CU_ASSERT(close_to(got[DIM + j], rows[DIM + j] + 0.25f));
		CU_ASSERT(got[j] < rows[j]);
	}

	/* Missing under NOCREATE: a whole row of zeros. */
	memset(got, 0xff, sizeof(got));
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(t, missing, 2, got,
				  EMB_CLIENT_WITH_STATE | EMB_CLIENT_NOCREATE,
				  found),
	    0);
	CU_ASSERT_EQUAL(found[0], 1);
	CU_ASSERT_EQUAL(found[1], 0);
	for (uint32_t j = 0; j < rf; j++)
		CU_ASSERT_EQUAL(got[rf + j], 0.0f);

	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/*
 * Trains a cached table "cached" and an uncached one "plain" (same spec,
 * so the same initial rows) in lockstep on one server, each with gradients
 * from its own looked-up rows; every lookup must equal the uncached pull,
 * and after a flush both tables must agree, optimizer state included.
 */
static void train_and_compare(uint32_t kind, uint32_t mode, uint32_t depth,
			      uint32_t policy)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_server *srv = nt_server_start(&o);
	uint16_t port = emb_server_port(srv);
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sa = spec_of("cached", kind);
	struct emb_table_spec sb = spec_of("plain", kind);
	struct emb_client_table *ta = NULL, *tb = NULL;
	struct emb_cached_table *ct = NULL;
	struct emb_cached_table_stats st =
	    EMB_SIZED(struct emb_cached_table_stats);
	struct emb_client *c;
	static uint64_t ids[STEPS + 64][BATCH];
	static float ra[BATCH * DIM], rb[BATCH * DIM], ga[BATCH * DIM],
	    gb[BATCH * DIM];
	uint64_t all[IDS];
	float *wa, *wb;
	uint32_t rf, mism = 0;
	char addr[64];

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sa, &ta), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sb, &tb), 0);
	co.capacity = CAPACITY;
	co.max_batch = BATCH;
	co.prefetch_depth = depth;
	co.mode = mode;
	co.policy = policy;
	co.staleness_steps = 0;
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(ta, &co, &ct), 0);

	for (uint32_t s = 0; s < STEPS + depth; s++)
		make_ids(s, ids[s], BATCH);
	for (uint32_t s = 0; s < depth; s++)
		CU_ASSERT_EQUAL(emb_cached_table_prefetch(ct, ids[s], BATCH),
				0);
	for (uint32_t s = 0; s < STEPS; s++) {
		CU_ASSERT_EQUAL_FATAL(
		    emb_cached_table_lookup(ct, ids[s], BATCH, ra), 0);
		if (depth)
			CU_ASSERT_EQUAL(emb_cached_table_prefetch(
					    ct, ids[s + depth], BATCH),
					0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull(tb, ids[s], BATCH, rb, 0, NULL), 0);
		if (!rows_close(ra, rb, BATCH * DIM))
			mism++;
		make_grads(s, ids[s], ra, BATCH, ga);
		make_grads(s, ids[s], rb, BATCH, gb);
		CU_ASSERT_EQUAL_FATAL(emb_cached_table_push_grads(ct, ga), 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_push(tb, ids[s], BATCH, gb, s, 0), 0);
	}
	CU_ASSERT_EQUAL(mism, 0);
	emb_cached_table_cancel(ct); /* the prefetches past the last step */
	CU_ASSERT_EQUAL(emb_cached_table_flush(ct), 0);
	emb_cached_table_stats(ct, &st);
	CU_ASSERT_EQUAL(st.lookups, STEPS);
	CU_ASSERT_EQUAL(st.dirty, 0);
	if (mode == EMB_CACHED_WRITE_BACK) {
		CU_ASSERT(st.evictions > 0);
		CU_ASSERT(st.write_backs > 0);
		CU_ASSERT(st.hits > 0);
	} else {
		CU_ASSERT_EQUAL(st.pushes, STEPS);
	}

	/* Whole rows of every id either path touched. */
	rf = emb_client_table_row_floats(ta);
	wa = malloc((size_t)IDS * rf * sizeof(float));
	wb = malloc((size_t)IDS * rf * sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(wa);
	CU_ASSERT_PTR_NOT_NULL_FATAL(wb);
	for (uint32_t i = 0; i < IDS; i++)
		all[i] = i;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(ta, all, IDS, wa,
						    EMB_CLIENT_WITH_STATE,
						    NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(tb, all, IDS, wb,
						    EMB_CLIENT_WITH_STATE,
						    NULL),
			      0);
	mism = 0;
	for (size_t i = 0; i < (size_t)IDS * rf; i++)
		if (!close_to(wa[i], wb[i]))
			mism++;
	CU_ASSERT_EQUAL(mism, 0);

	free(wa);
	free(wb);
	emb_cached_table_destroy(ct);
	emb_client_table_close(ta);
	emb_client_table_close(tb);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

static void test_write_through_equals_uncached(void)
{
	train_and_compare(EMB_OPTIM_ADAGRAD, EMB_CACHED_WRITE_THROUGH, 2,
			  EMB_CACHED_LRU);
	train_and_compare(EMB_OPTIM_SGD, EMB_CACHED_WRITE_THROUGH, 0,
			  EMB_CACHED_LRU);
}

static void test_write_back_equals_uncached(void)
{
	train_and_compare(EMB_OPTIM_ADAGRAD, EMB_CACHED_WRITE_BACK, 2,
			  EMB_CACHED_LRU);
	train_and_compare(EMB_OPTIM_ADAM, EMB_CACHED_WRITE_BACK, 1,
			  EMB_CACHED_CLOCK);
	train_and_compare(EMB_OPTIM_FTRL, EMB_CACHED_WRITE_BACK, 0,
			  EMB_CACHED_LRU);
	train_and_compare(EMB_OPTIM_ROWWISE_ADAGRAD, EMB_CACHED_WRITE_BACK, 1,
			  EMB_CACHED_LRU);
}

/*
 * A compact table trained through a cached table and, in lockstep, an
 * uncached twin (same spec: the same initial rows, the same rounding keys).
 * Exact where the cache promises it (cache.h, emb_cache_update()): every
 * write-through lookup, and write-back while no row is evicted; after
 * evictions a refetched row rounds with other random bits, and the tables
 * must only stay finite and close. Returns the bytes of a cached row, or 0
 * when the client cannot make compact tables.
 */
static uint32_t train_compact(uint32_t fmt, uint32_t kind, uint32_t mode,
			      uint32_t capacity)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_server *srv = nt_server_start(&o);
	uint16_t port = emb_server_port(srv);
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sa = spec_of("cached", kind);
	struct emb_table_spec sb = spec_of("plain", kind);
	struct emb_client_table *ta = NULL, *tb = NULL;
	struct emb_cached_table *ct = NULL;
	struct emb_cached_table_stats st =
	    EMB_SIZED(struct emb_cached_table_stats);
	struct emb_client *c;
	static uint64_t ids[STEPS][BATCH];
	static float ra[BATCH * DIM], rb[BATCH * DIM], g[BATCH * DIM];
	const bool exact = mode == EMB_CACHED_WRITE_THROUGH || capacity >= IDS;
	uint32_t rf, bytes = 0, diff = 0, far = 0, bad = 0;
	uint64_t all[IDS];
	float *wa = NULL, *wb = NULL, da[DIM], db[DIM];
	char addr[64];

	sa.row_format = sb.row_format = fmt;
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sa, &ta), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sb, &tb), 0);
	CU_ASSERT_EQUAL(emb_client_table_spec(ta)->row_format, fmt);
	if (emb_client_table_spec(ta)->row_format != fmt)
		goto out;
	co.capacity = capacity;
	co.max_batch = BATCH;
	co.prefetch_depth = 2;
	co.mode = mode;
	co.policy = EMB_CACHED_LRU;
	co.staleness_steps = 0;
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(ta, &co, &ct), 0);

	for (uint32_t s = 0; s < STEPS; s++)
		make_ids(s, ids[s], BATCH);
	for (uint32_t s = 0; s < 2; s++)
		CU_ASSERT_EQUAL(emb_cached_table_prefetch(ct, ids[s], BATCH),
				0);
	for (uint32_t s = 0; s < STEPS; s++) {
		CU_ASSERT_EQUAL_FATAL(
		    emb_cached_table_lookup(ct, ids[s], BATCH, ra), 0);
		if (s + 2 < STEPS)
			CU_ASSERT_EQUAL(
			    emb_cached_table_prefetch(ct, ids[s + 2], BATCH),
			    0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull(tb, ids[s], BATCH, rb, 0, NULL), 0);
		diff += memcmp(ra, rb, sizeof(ra)) != 0;
		for (uint32_t i = 0; i < BATCH * DIM; i++)
			far += !(fabsf(ra[i] - rb[i]) <=
				 0.05f * fabsf(rb[i]) + 0.02f);
		/* Both sides push the cache's gradients. */
		make_grads(s, ids[s], ra, BATCH, g);
		CU_ASSERT_EQUAL_FATAL(emb_cached_table_push_grads(ct, g), 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_push(tb, ids[s], BATCH, g, s, 0), 0);
	}
	CU_ASSERT_EQUAL(far, 0);
	if (exact)
		CU_ASSERT_EQUAL(diff, 0);
	emb_cached_table_cancel(ct);
	CU_ASSERT_EQUAL(emb_cached_table_flush(ct), 0);
	emb_cached_table_stats(ct, &st);
	CU_ASSERT(st.rows_fetched > 0);
	bytes = (uint32_t)(st.bytes_fetched / st.rows_fetched);
	CU_ASSERT_EQUAL(st.bytes_fetched, (uint64_t)st.rows_fetched * bytes);
	CU_ASSERT(exact || st.evictions > 0);

	/* Whole rows of every id, in the table's format. */
	rf = emb_client_table_row_floats(ta);
	wa = malloc((size_t)IDS * rf * sizeof(float));
	wb = malloc((size_t)IDS * rf * sizeof(float));
	CU_ASSERT_FATAL(wa && wb);
	for (uint32_t i = 0; i < IDS; i++)
		all[i] = i;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(ta, all, IDS, wa,
						    EMB_CLIENT_WITH_STATE,
						    NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(tb, all, IDS, wb,
						    EMB_CLIENT_WITH_STATE,
						    NULL),
			      0);
	diff = 0;
	for (uint32_t i = 0; i < IDS; i++) {
		const float *xa = wa + (size_t)i * rf, *xb = wb + (size_t)i * rf;

		diff += memcmp(xa, xb, rf * sizeof(float)) != 0;
		emb_rowfmt_decode(fmt, xa, da, DIM);
		emb_rowfmt_decode(fmt, xb, db, DIM);
		for (uint32_t j = 0; j < DIM; j++)
			bad += !isfinite(da[j]) ||
			       !(fabsf(da[j] - db[j]) <=
				 0.05f * fabsf(db[j]) + 0.02f);
	}
	CU_ASSERT_EQUAL(bad, 0);
	if (exact)
		CU_ASSERT_EQUAL(diff, 0);
	free(wa);
	free(wb);
	emb_cached_table_destroy(ct);
out:
	emb_client_table_close(ta);
	emb_client_table_close(tb);
	emb_client_destroy(c);
	emb_server_destroy(srv);
	return bytes;
}

/*
 * Cached rows of a compact table take its bytes: at dim 8, fp16 and bf16
 * weights 16 bytes, int8 16 (8 codes, a scale and a bias), fp32 32; with
 * Adagrad's state (8 floats) in write-back mode, 32 more.
 */
static void test_compact_through_cache(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP16, EMB_ROWFMT_BF16,
					EMB_ROWFMT_INT8};
	uint32_t b;

	CU_ASSERT(train_compact(EMB_ROWFMT_FP16, EMB_OPTIM_SGD,
				EMB_CACHED_WRITE_THROUGH, CAPACITY));
	for (uint32_t k = 0; k < 3; k++) {
		b = train_compact(fmts[k], EMB_OPTIM_ADAGRAD,
				  EMB_CACHED_WRITE_THROUGH, CAPACITY);
		CU_ASSERT_EQUAL(b, 16);
		printf("\n    write-through %s: %u bytes a cached row (fp32: "
		       "32)",
		       emb_rowfmt_name(fmts[k]), b);
	}
	b = train_compact(EMB_ROWFMT_FP16, EMB_OPTIM_ADAGRAD,
			  EMB_CACHED_WRITE_BACK, 512);
	CU_ASSERT_EQUAL(b, 16 + 32);
	printf("\n    write-back fp16 + adagrad: %u bytes a cached row (fp32: "
	       "64) ",
	       b);
	CU_ASSERT_EQUAL(train_compact(EMB_ROWFMT_FP16, EMB_OPTIM_ADAGRAD,
				      EMB_CACHED_WRITE_BACK, CAPACITY),
			16 + 32);
	CU_ASSERT_EQUAL(train_compact(EMB_ROWFMT_INT8, EMB_OPTIM_SGD,
				      EMB_CACHED_WRITE_BACK, CAPACITY),
			16);
}

/* A server, a client and table "t" for the cases below. */
struct rig {
	struct emb_server *srv;
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_cached_table *ct;
};

static void rig_up(struct rig *r, const struct emb_cached_table_opts *co)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_table_spec sp = spec_of("t", EMB_OPTIM_ADAGRAD);
	uint16_t port;
	char addr[64];

	r->srv = nt_server_start(&o);
	port = emb_server_port(r->srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	r->c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(r->c, &sp, &r->t), 0);
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(r->t, co, &r->ct), 0);
}

static void rig_down(struct rig *r)
{
	emb_cached_table_destroy(r->ct);
	emb_client_table_close(r->t);
	emb_client_destroy(r->c);
	emb_server_destroy(r->srv);
}

static uint64_t requests(struct emb_client *c)
{
	struct emb_client_stats s = EMB_SIZED(struct emb_client_stats);

	emb_client_stats(c, &s);
	return s.requests;
}

/* The loop thread counts a request when it posts it: wait up to 5 s. */
static uint64_t wait_requests(struct emb_client *c, uint64_t want)
{
	uint64_t n = requests(c);

	for (int i = 0; i < 500 && n < want; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};

		nanosleep(&ts, NULL);
		n = requests(c);
	}
	return n;
}

static void test_prefetch_pulls_before_lookup(void)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_cached_table_stats st =
	    EMB_SIZED(struct emb_cached_table_stats);
	uint64_t a[16], b[16], before;
	float out[16 * DIM], g[16 * DIM] = {0};
	struct rig r;

	co.capacity = 128;
	co.max_batch = 16;
	co.prefetch_depth = 2;
	co.mode = EMB_CACHED_WRITE_BACK;
	rig_up(&r, &co);
	for (uint32_t i = 0; i < 16; i++) {
		a[i] = 100 + i;
		b[i] = 200 + i;
	}
	before = requests(r.c);
	CU_ASSERT_EQUAL(emb_cached_table_prefetch(r.ct, a, 16), 0);
	CU_ASSERT_EQUAL(emb_cached_table_prefetch(r.ct, b, 16), 0);
	/* Both pulls are on their way before any lookup. */
	CU_ASSERT_EQUAL(wait_requests(r.c, before + 2), before + 2);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, a, 16, out), 0);
	CU_ASSERT_EQUAL(emb_cached_table_push_grads(r.ct, g), 0);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, b, 16, out), 0);
	CU_ASSERT_EQUAL(requests(r.c), before + 2);
	emb_cached_table_stats(r.ct, &st);
	CU_ASSERT_EQUAL(st.fetch_calls, 2);
	CU_ASSERT_EQUAL(st.sync_fetches, 0);
	CU_ASSERT_EQUAL(st.rows_fetched, 32);
	/* Batch a again: all hits, nothing sent. */
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, a, 16, out), 0);
	CU_ASSERT_EQUAL(requests(r.c), before + 2);
	emb_cached_table_stats(r.ct, &st);
	CU_ASSERT_EQUAL(st.hits, 16);
	CU_ASSERT_EQUAL(emb_cached_table_flush(r.ct), 0);
	rig_down(&r);
}

static void test_staleness_refetches(void)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_cached_table_stats st =
	    EMB_SIZED(struct emb_cached_table_stats);
	uint64_t ids[8];
	float out[8 * DIM], ref[8 * DIM], g[8 * DIM];
	uint64_t n0, n1, n2;
	struct rig r;

	co.capacity = 64;
	co.max_batch = 8;
	co.prefetch_depth = 0;
	co.mode = EMB_CACHED_WRITE_THROUGH;
	co.staleness_steps = 1;
	rig_up(&r, &co);
	for (uint32_t i = 0; i < 8; i++)
		ids[i] = 40 + i;
	for (uint32_t i = 0; i < 8 * DIM; i++)
		g[i] = 0.25f;

	/* Step 0 fetches; step 1 may use rows one push old. */
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_lookup(r.ct, ids, 8, out), 0);
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_push_grads(r.ct, g), 0);
	n0 = requests(r.c);
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_lookup(r.ct, ids, 8, out), 0);
	n1 = requests(r.c);
	CU_ASSERT_EQUAL(n1, n0);
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_push_grads(r.ct, g), 0);
	/* Step 2: two pushes old is too old, so the rows come again and
	 * carry both pushes. */
	n1 = requests(r.c);
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_lookup(r.ct, ids, 8, out), 0);
	n2 = requests(r.c);
	CU_ASSERT_EQUAL(n2, n1 + 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(r.t, ids, 8, ref, 0, NULL),
			      0);
	CU_ASSERT(rows_close(out, ref, 8 * DIM));
	emb_cached_table_stats(r.ct, &st);
	CU_ASSERT_EQUAL(st.refetches, 8);
	CU_ASSERT_EQUAL(st.hits, 8);
	rig_down(&r);
}

static void test_batch_larger_than_cache(void)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	uint64_t ids[32];
	float out[32 * DIM];
	struct rig r;

	co.capacity = 16;
	co.max_batch = 32;
	co.prefetch_depth = 1;
	rig_up(&r, &co);
	for (uint32_t i = 0; i < 32; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_cached_table_prefetch(r.ct, ids, 32),
			EMB_ECACHEFULL);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, ids, 32, out),
			EMB_ECACHEFULL);
	/* Duplicates do not count: 16 distinct ids fit. */
	for (uint32_t i = 0; i < 32; i++)
		ids[i] = i % 16;
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, ids, 32, out), 0);
	rig_down(&r);
}

/*
 * The defaults are write-back with TinyLFU, and write-back is refused on a
 * synchronous table (at create, and at push_grads once the table turned
 * synchronous), where it would bypass the step's averaging; write-through
 * with the default staleness of 0 is accepted there.
 */
static void test_sync_table_refuses_write_back(void)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_cached_table *ct = NULL;
	uint64_t ids[4] = {1, 2, 3, 4};
	float out[4 * DIM], g[4 * DIM] = {0};
	struct rig r;

	CU_ASSERT_EQUAL(co.mode, EMB_CACHED_WRITE_BACK);
	CU_ASSERT_EQUAL(co.policy, EMB_CACHED_TINYLFU);
	CU_ASSERT_EQUAL(co.staleness_steps, 0);
	co.capacity = 64;
	co.max_batch = 4;
	rig_up(&r, &co);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, ids, 4, out), 0);
	CU_ASSERT_EQUAL(emb_cached_table_push_grads(r.ct, g), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_set_mode(r.t, EMB_MODE_SYNC, 1, 0), 0);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(r.ct, ids, 4, out), 0);
	CU_ASSERT_EQUAL(emb_cached_table_push_grads(r.ct, g), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_cached_table_create(r.t, &co, &ct), EMB_EBADARG);
	CU_ASSERT_PTR_NULL(ct);
	co.mode = EMB_CACHED_WRITE_THROUGH;
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(r.t, &co, &ct), 0);
	CU_ASSERT_EQUAL(emb_cached_table_lookup(ct, ids, 4, out), 0);
	CU_ASSERT_EQUAL(emb_cached_table_push_grads(ct, g), 0);
	emb_cached_table_destroy(ct);
	rig_down(&r);
}

static void test_dead_server_is_an_error(void)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sp = spec_of("t", EMB_OPTIM_ADAGRAD);
	const uint32_t modes[2] = {EMB_CACHED_WRITE_THROUGH,
				   EMB_CACHED_WRITE_BACK};

	for (uint32_t m = 0; m < 2; m++) {
		struct emb_client_table *t = NULL;
		struct emb_cached_table *ct = NULL;
		struct emb_client *c;
		struct nt_child ch;
		uint64_t ids[BATCH];
		float out[BATCH * DIM], g[BATCH * DIM];
		uint32_t s;
		char addr[64];
		int rc = 0;

		nt_child_start(&ch, NULL);
		nt_addr_list(addr, sizeof(addr), &ch.port, 1);
		c = nt_client(addr, 2000);
		CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
		co.capacity = CAPACITY;
		co.max_batch = BATCH;
		co.prefetch_depth = 1;
		co.mode = modes[m];
		CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(t, &co, &ct), 0);
		for (s = 0; s < 200 && !rc; s++) {
			if (s == 5)
				nt_child_reap(&ch, SIGKILL);
			make_ids(s, ids, BATCH);
			rc = emb_cached_table_lookup(ct, ids, BATCH, out);
			if (rc)
				break;
			make_ids(s + 1, ids, BATCH);
			/* A failed prefetch surfaces in its lookup. */
			(void)emb_cached_table_prefetch(ct, ids, BATCH);
			make_grads(s, ids, out, BATCH, g);
			rc = emb_cached_table_push_grads(ct, g);
		}
		CU_ASSERT(s >= 5);
		CU_ASSERT(rc == EMB_EFETCH || rc == EMB_EPUSH ||
			  rc == EMB_EWRITEBACK);
		if (modes[m] == EMB_CACHED_WRITE_BACK)
			CU_ASSERT_EQUAL(emb_cached_table_flush(ct),
					EMB_EWRITEBACK);
		emb_cached_table_destroy(ct);
		emb_client_table_close(t);
		emb_client_destroy(c);
	}
}

static const struct emb_test_case cases[] = {
    {"pull with state returns whole rows as assign stores them",
     test_pull_with_state},
    {"write-through training ends with the uncached table",
     test_write_through_equals_uncached},
    {"write-back training ends with the uncached table and state after flush",
     test_write_back_equals_uncached},
    {"prefetch pulls before lookup", test_prefetch_pulls_before_lookup},
    {"rows older than the staleness bound are pulled again",
     test_staleness_refetches},
    {"batch with more distinct ids than the cache fails",
     test_batch_larger_than_cache},
    {"defaults are write-back and TinyLFU; a sync table refuses write-back",
     test_sync_table_refuses_write_back},
    {"a server killed mid-training is an error, not a hang",
     test_dead_server_is_an_error},
    {"compact tables: lookups are the uncached pulls, rows the table's bytes",
     test_compact_through_cache},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "cached", cases);
}
