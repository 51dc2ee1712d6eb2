/*
 * tests/store/test_tier.c - a table's device tier (docs/store.md, "The
 * device tier"): rows past the memory limit move to a file and come back
 * bit for bit, through pull, push, assign and erase, from one thread and
 * from several; a push refused after promotions puts them back; a full
 * tier fails only what it cannot hold; iterators, move tracking and
 * checkpoint walks reach every row once while rows move between the
 * tiers under them; a remote-readable tiered table locates only rows in
 * DRAM, breaks the seal of a record whose row went to the device and
 * seals the record a row comes back to; what is not built yet is refused.
 *
 * Each tiered table is checked against a twin without a tier that gets
 * the same calls: every row must match it exactly, weights and state.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store_test.h"

#include "common/rowfmt.h"
#include "common/seal.h"

#define DIM 16
#define IDS 40960u /* about 5x what the limit keeps in DRAM */
#define BATCH 512u

static char *dir;

static struct emb_table_opts tier_opts(char *path, size_t cap,
				       const char *name)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.name = name;
	o.dim = DIM;
	o.nshards = 8;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	o.optim.lr = 0.1f;
	o.seed = 11;
	/* The table's fixed part is about 4.1 MiB (store.h), a quarter of
	 * the limit is kept for the indexes: ~1.9 MiB of slabs, ~8k rows
	 * of 160 bytes. */
	o.mem_limit = 8u << 20;
	snprintf(path, cap, "%s/%s.tier", dir, name);
	o.tier_path = path;
	return o;
}

static struct emb_table *twin_of(const struct emb_table_opts *o)
{
	struct emb_table_opts r = *o;

	r.name = "twin";
	r.mem_limit = 0;
	r.tier_path = NULL;
	return table_new(&r);
}

/* Every id of [0, n) is in both tables or in neither, with the same
 * weights (looked up without making rows). */
static void check_same(struct emb_table *a, struct emb_table *b, uint32_t n)
{
	uint64_t ids[BATCH];
	uint8_t fa[BATCH], fb[BATCH];
	float *wa = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wb = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint32_t bad = 0;

	for (uint32_t lo = 0; lo < n; lo += BATCH) {
		uint32_t m = n - lo < BATCH ? n - lo : BATCH;
		int ra, rb;

		for (uint32_t i = 0; i < m; i++)
			ids[i] = (uint64_t)(lo + i) * 7919u + 3;
		ra = emb_table_pull(a, ids, m, wa, EMB_PULL_NOCREATE, fa);
		rb = emb_table_pull(b, ids, m, wb, EMB_PULL_NOCREATE, fb);
		CU_ASSERT(ra >= 0);
		CU_ASSERT_EQUAL(ra, rb);
		bad += memcmp(fa, fb, m) != 0;
		bad += memcmp(wa, wb, (size_t)m * DIM * sizeof(float)) != 0;
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(wa);
	free(wb);
}

/* A batch of m random ids of [0, n) (may repeat), as ids[] feature ids. */
static void draw(uint64_t *st, uint64_t *ids, uint32_t m, uint32_t n)
{
	for (uint32_t i = 0; i < m; i++)
		ids[i] = (uint64_t)rnd_below(st, n) * 7919u + 3;
}

static void grads_fill(uint64_t *st, float *g, size_t n)
{
	for (size_t i = 0; i < n; i++)
		g[i] = (float)rnd_below(st, 2001) / 1000.0f - 1.0f;
}

/* Pulls and pushes of random batches on the tiered table and its twin,
 * each batch's pulled rows compared. */
static void drive(struct emb_table *t, struct emb_table *r, uint64_t seed,
		  uint32_t batches, uint32_t n, uint32_t *bad)
{
	uint64_t st = seed;
	uint64_t ids[BATCH];
	float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wa = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wb = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t k = 0; k < batches; k++) {
		draw(&st, ids, BATCH, n);
		if (emb_table_pull(t, ids, BATCH, wa, 0, NULL) < 0 ||
		    emb_table_pull(r, ids, BATCH, wb, 0, NULL) < 0)
			(*bad)++;
		if (memcmp(wa, wb, sizeof(float) * BATCH * DIM))
			(*bad)++;
		grads_fill(&st, g, (size_t)BATCH * DIM);
		if (emb_table_push(t, ids, BATCH, g) ||
		    emb_table_push(r, ids, BATCH, g))
			(*bad)++;
	}
	free(g);
	free(wa);
	free(wb);
}

/* Every id of [0, IDS) made in both tables, by pushes. */
static void make_all(struct emb_table *t, struct emb_table *r)
{
	for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
		uint64_t ids[BATCH];
		float g[BATCH * DIM];
		uint64_t st = lo;

		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)(lo + i) * 7919u + 3;
		grads_fill(&st, g, BATCH * DIM);
		CU_ASSERT_EQUAL(emb_table_push(t, ids, BATCH, g), 0);
		CU_ASSERT_EQUAL(emb_table_push(r, ids, BATCH, g), 0);
	}
}

static void test_rows_come_back(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "tiered");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats ts;
	struct emb_table_stats s;
	struct stat sb;
	uint32_t bad = 0;

	/* Every id made first (by pushes, so each row differs from its
	 * initial values), then random traffic over all of them. */
	make_all(t, r);
	drive(t, r, 42, 60, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	check_same(t, r, IDS);

	emb_table_tier_stats(t, &ts);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, IDS);
	CU_ASSERT_EQUAL(s.rows_created, IDS);
	CU_ASSERT(ts.rows_cold > IDS / 2);
	CU_ASSERT(ts.demoted > IDS / 2);
	CU_ASSERT(ts.promoted > 1000);
	CU_ASSERT(ts.blocks_read > 0);
	/* The limit holds: DRAM is the slabs and indexes, not the rows. */
	CU_ASSERT(s.bytes <= o.mem_limit);
	CU_ASSERT(s.bytes > 0);
	/* Freed blocks are used again: the file stays near the cold rows'
	 * size (28 records of 144 bytes in a 4 KiB block). */
	CU_ASSERT(ts.file_bytes <= (ts.rows_cold / 28 + 1) * 4096 * 2);
	CU_ASSERT_EQUAL(stat(path, &sb), 0);
	CU_ASSERT_EQUAL((uint64_t)sb.st_size, ts.file_bytes);

	emb_table_destroy(t);
	emb_table_destroy(r);
	/* The tier is scratch: the table takes its file with it. */
	CU_ASSERT_EQUAL(stat(path, &sb), -1);
}

/* Rows of a compact format (int8, with its scale and bias; bf16) move
 * and come back bit for bit as well, stochastic rounding and all, and
 * walks hand them out whole. */
static void test_compact_rows(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_INT8, EMB_ROWFMT_BF16};

	for (size_t k = 0; k < sizeof(fmts) / sizeof(fmts[0]); k++) {
		char path[4096];
		struct emb_table_opts o = tier_opts(path, sizeof(path), "small");
		struct emb_table *t, *r;
		struct emb_table_tier_stats ts;
		struct emb_table_iter *ia = NULL, *ib = NULL;
		uint32_t rf, bad = 0, na = 0, nb = 0;
		uint64_t *ida, *idb;
		float *ra, *rb;
		int got;

		o.row_format = fmts[k];
		/* Stochastic rounding (the default), keyed by the row's
		 * count of writes: a tiered table's reads leave it alone,
		 * so it rounds as the twin does (and as replicas do). */
		t = table_new(&o);
		r = twin_of(&o);
		make_all(t, r);
		drive(t, r, 61, 40, IDS, &bad);
		CU_ASSERT_EQUAL(bad, 0);
		check_same(t, r, IDS);
		emb_table_tier_stats(t, &ts);
		CU_ASSERT(ts.rows_cold > IDS / 4);
		/* Whole rows, as a checkpoint takes them. */
		rf = emb_table_row_floats(t);
		ida = xcalloc(IDS, sizeof(*ida));
		idb = xcalloc(IDS, sizeof(*idb));
		ra = xcalloc((size_t)IDS * rf, sizeof(float));
		rb = xcalloc((size_t)IDS * rf, sizeof(float));
		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &ia), 0);
		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(r, &ib), 0);
		while ((got = emb_table_iter_next(ia, ida + na,
						  ra + (size_t)na * rf, NULL,
						  BATCH)) > 0)
			na += (uint32_t)got;
		while ((got = emb_table_iter_next(ib, idb + nb,
						  rb + (size_t)nb * rf, NULL,
						  BATCH)) > 0)
			nb += (uint32_t)got;
		CU_ASSERT_EQUAL(na, IDS);
		CU_ASSERT_EQUAL(nb, IDS);
		/* Each id's whole row alike in both (orders differ). */
		for (uint32_t i = 0; i < na && na == nb; i++) {
			uint32_t j = 0;

			while (j < nb && idb[j] != ida[i])
				j++;
			bad += j == nb ||
			       memcmp(ra + (size_t)i * rf, rb + (size_t)j * rf,
				      rf * sizeof(float));
			if (i == 2000)
				break; /* a sample: the search is quadratic */
		}
		CU_ASSERT_EQUAL(bad, 0);
		emb_table_iter_destroy(ia);
		emb_table_iter_destroy(ib);
		free(ida);
		free(idb);
		free(ra);
		free(rb);
		emb_table_destroy(t);
		emb_table_destroy(r);
	}
}

static void test_erase_assign_cold(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "ea");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	float row[DIM * 2], w[DIM];
	uint64_t id, rows_before;
	uint8_t found;
	uint32_t bad = 0;

	drive(t, r, 7, 120, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	/* A cold id: the first made, long unused by the hand's reckoning. */
	id = 3;
	{
		struct emb_table_tier_stats ts;

		emb_table_tier_stats(t, &ts);
		CU_ASSERT_FATAL(ts.rows_cold > 0);
	}
	rows_before = table_stats(t).rows;
	/* erase reaches a row wherever it is. */
	CU_ASSERT_EQUAL(emb_table_erase(t, &id, 1), 1);
	CU_ASSERT_EQUAL(emb_table_erase(r, &id, 1), 1);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w, EMB_PULL_NOCREATE,
				       &found),
			1);
	CU_ASSERT_EQUAL(found, 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, rows_before - 1);
	/* assign over every id replaces its row, cold or not, and makes no
	 * row twice. */
	for (uint32_t i = 0; i < DIM * 2; i++)
		row[i] = (float)i / 8.0f;
	for (uint32_t k = 0; k < IDS; k += 97) {
		uint64_t x = (uint64_t)k * 7919u + 3;

		CU_ASSERT_EQUAL(emb_table_assign(t, &x, 1, row, true, NULL),
				0);
		CU_ASSERT_EQUAL(emb_table_assign(r, &x, 1, row, true, NULL),
				0);
	}
	CU_ASSERT_EQUAL(table_stats(t).rows, table_stats(r).rows);
	drive(t, r, 8, 40, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* A push refused for a result that is not finite leaves every row as it
 * was, rows it brought back from the device included. */
static void test_refused_push_puts_back(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "undo");
	struct emb_table *t, *r;
	uint64_t ids[BATCH];
	float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint64_t st = 5;
	uint32_t bad = 0;
	struct emb_table_tier_stats a, b;

	o.optim.kind = EMB_OPTIM_SGD;
	o.optim.lr = 10.0f;
	t = table_new(&o);
	r = twin_of(&o);
	drive(t, r, 9, 100, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_tier_stats(t, &a);
	draw(&st, ids, BATCH, IDS);
	grads_fill(&st, g, (size_t)BATCH * DIM);
	/* The last id's step overflows: -10 * 3.4e38 is no float. */
	g[(size_t)(BATCH - 1) * DIM] = 3.4e38f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, BATCH, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_push(r, ids, BATCH, g), EMB_ENONFINITE);
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.promoted > a.promoted); /* it did bring rows back */
	check_same(t, r, IDS);
	CU_ASSERT_EQUAL(table_stats(t).rows, table_stats(r).rows);
	free(g);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* A pull serves a cold row from the device the first time, and brings it
 * back only when it is read again soon; a push brings it back at once. */
static void test_second_read_promotes(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "ghost");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats a, b, c;
	float wa[DIM], wb[DIM], g[DIM] = {0.5f};
	uint64_t id = 3; /* the first id made: cold after the others */
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
		uint64_t ids[BATCH];

		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)(lo + i) * 7919u + 3;
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, BATCH, w, 0, NULL),
				BATCH);
	}
	free(w);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, wa, 0, NULL), 0);
	emb_table_tier_stats(t, &b);
	CU_ASSERT_EQUAL(b.served_cold, a.served_cold + 1);
	CU_ASSERT_EQUAL(b.promoted, a.promoted);
	CU_ASSERT_EQUAL(b.rows_cold, a.rows_cold);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, wb, 0, NULL), 0);
	emb_table_tier_stats(t, &c);
	CU_ASSERT_EQUAL(c.promoted, b.promoted + 1);
	CU_ASSERT_EQUAL(c.rows_cold, b.rows_cold - 1);
	CU_ASSERT_EQUAL(memcmp(wa, wb, sizeof(wa)), 0);
	/* Its values are the initializer's, as the twin's. */
	CU_ASSERT_EQUAL(emb_table_pull(r, &id, 1, wb, 0, NULL), 1);
	CU_ASSERT_EQUAL(memcmp(wa, wb, sizeof(wa)), 0);
	/* A push of another cold id brings it back at once. */
	id = 3 + 7919u;
	emb_table_tier_stats(t, &a);
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), 0);
	emb_table_tier_stats(t, &b);
	CU_ASSERT_EQUAL(b.promoted, a.promoted + 1);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

struct thread_arg {
	struct emb_table *t, *r;
	uint32_t which;
	uint32_t bad;
};

/* Each thread works its own ids (which mod 3), so the twin's result
 * does not depend on how the threads interleave. */
static void *thread_main(void *p)
{
	struct thread_arg *a = p;
	uint64_t st = 100 + a->which;
	uint64_t ids[BATCH];
	float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wa = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wb = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t k = 0; k < 60; k++) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = ((uint64_t)rnd_below(&st, IDS / 3) * 3 +
				  a->which) *
				     7919u +
				 3;
		if (emb_table_pull(a->t, ids, BATCH, wa, 0, NULL) < 0 ||
		    emb_table_pull(a->r, ids, BATCH, wb, 0, NULL) < 0 ||
		    memcmp(wa, wb, sizeof(float) * BATCH * DIM))
			a->bad++;
		grads_fill(&st, g, (size_t)BATCH * DIM);
		if (emb_table_push(a->t, ids, BATCH, g) ||
		    emb_table_push(a->r, ids, BATCH, g))
			a->bad++;
	}
	free(g);
	free(wa);
	free(wb);
	return NULL;
}

static void test_threads(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "threads");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct thread_arg a[3];
	pthread_t th[3];
	struct emb_table_tier_stats ts;

	for (uint32_t i = 0; i < 3; i++) {
		a[i] = (struct thread_arg){.t = t, .r = r, .which = i};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, thread_main, &a[i]), 0);
	}
	for (uint32_t i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(a[i].bad, 0);
	}
	emb_table_tier_stats(t, &ts);
	CU_ASSERT(ts.promoted > 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, table_stats(r).rows);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* A tier at its bound fails the batches that would need more of it with
 * EMB_ETIERFULL; rows already held keep being served. */
static void test_full_tier(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "full");
	struct emb_table *t;
	uint64_t ids[BATCH];
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint32_t lo = 0;
	int rc = 0;

	o.tier_max = 64u << 10; /* 16 blocks: 400 rows */
	t = table_new(&o);
	for (; lo < IDS && !rc; lo += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)(lo + i) * 7919u + 3;
		rc = emb_table_pull(t, ids, BATCH, w, 0, NULL);
		rc = rc > 0 ? 0 : rc; /* rows made */
	}
	CU_ASSERT_EQUAL(rc, EMB_ETIERFULL);
	CU_ASSERT(lo < IDS);
	/* The first rows made are still there, from either tier. */
	for (uint32_t i = 0; i < 64; i++)
		ids[i] = (uint64_t)i * 7919u + 3;
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 64, w, EMB_PULL_NOCREATE, NULL),
			0);
	CU_ASSERT(table_stats(t).bytes <= o.mem_limit);
	free(w);
	emb_table_destroy(t);
}

/* ---- walks ---- */

/* A walk's rows: ids, full rows (weights and state), sorted by id. */
struct rowset {
	uint64_t *ids;
	float *rows;
	uint32_t n, cap, rf;
};

static void rowset_add(struct rowset *rs, const uint64_t *ids,
		       const float *rows, uint32_t n)
{
	if (rs->n + n > rs->cap) {
		rs->cap = (rs->n + n) * 2;
		rs->ids = realloc(rs->ids, rs->cap * sizeof(*rs->ids));
		rs->rows = realloc(rs->rows,
				   (size_t)rs->cap * rs->rf * sizeof(float));
		CU_ASSERT_PTR_NOT_NULL_FATAL(rs->ids);
		CU_ASSERT_PTR_NOT_NULL_FATAL(rs->rows);
	}
	memcpy(rs->ids + rs->n, ids, n * sizeof(*ids));
	memcpy(rs->rows + (size_t)rs->n * rs->rf, rows,
	       (size_t)n * rs->rf * sizeof(float));
	rs->n += n;
}

static int cmp_idx(const void *a, const void *b, void *ids)
{
	uint64_t x = ((const uint64_t *)ids)[*(const uint32_t *)a];
	uint64_t y = ((const uint64_t *)ids)[*(const uint32_t *)b];

	return x < y ? -1 : x > y;
}

static void rowset_sort(struct rowset *rs)
{
	uint32_t *ord = xcalloc(rs->n, sizeof(*ord));
	uint64_t *ids = xcalloc(rs->n, sizeof(*ids));
	float *rows = xcalloc((size_t)rs->n * rs->rf, sizeof(float));

	for (uint32_t i = 0; i < rs->n; i++)
		ord[i] = i;
	qsort_r(ord, rs->n, sizeof(*ord), cmp_idx, rs->ids);
	for (uint32_t i = 0; i < rs->n; i++) {
		ids[i] = rs->ids[ord[i]];
		memcpy(rows + (size_t)i * rs->rf,
		       rs->rows + (size_t)ord[i] * rs->rf,
		       rs->rf * sizeof(float));
	}
	free(rs->ids);
	free(rs->rows);
	free(ord);
	rs->ids = ids;
	rs->rows = rows;
	rs->cap = rs->n;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void rowset_free(struct rowset *rs)
{
	free(rs->ids);
	free(rs->rows);
}

/* Ids handed out twice in a sorted set. */
static uint32_t rowset_dups(const struct rowset *rs)
{
	uint32_t d = 0;

	for (uint32_t i = 1; i < rs->n; i++)
		d += rs->ids[i] == rs->ids[i - 1];
	return d;
}

/* A whole table by its iterator, quiet. */
static struct rowset walk_all(struct emb_table *t)
{
	struct rowset rs = {.rf = emb_table_row_floats(t)};
	struct emb_table_iter *it = NULL;
	uint64_t ids[BATCH];
	float *rows = xcalloc((size_t)BATCH * rs.rf, sizeof(float));
	int got;

	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, BATCH)) > 0)
		rowset_add(&rs, ids, rows, (uint32_t)got);
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	free(rows);
	rowset_sort(&rs);
	return rs;
}

static bool rowsets_equal(const struct rowset *a, const struct rowset *b)
{
	return a->n == b->n && a->rf == b->rf &&
	       !memcmp(a->ids, b->ids, a->n * sizeof(*a->ids)) &&
	       !memcmp(a->rows, b->rows, (size_t)a->n * a->rf * sizeof(float));
}

/* One step of traffic between a walk's calls: a push over random ids of
 * [0, n) (promoting cold ones), a pull of others. Returns 0 or a code. */
static int busy_step(struct emb_table *t, uint64_t *st, uint32_t n)
{
	uint64_t ids[64];
	float g[64 * DIM], w[64 * DIM];
	int rc;

	draw(st, ids, 64, n);
	grads_fill(st, g, 64 * DIM);
	if ((rc = emb_table_push(t, ids, 64, g)))
		return rc;
	draw(st, ids, 64, n);
	rc = emb_table_pull(t, ids, 64, w, 0, NULL);
	return rc < 0 ? rc : 0;
}

/* An iterator hands out every row once: all of them, bit for bit as the
 * untiered twin, on a quiet table; each exactly once while pushes and
 * pulls bring cold rows back between its calls; by slot, those of the
 * slots only. */
static void test_walk_iter(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "walk");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats a, b;
	struct rowset rt, rr, busy = {.rf = emb_table_row_floats(t)};
	struct emb_table_iter *it = NULL;
	uint64_t ids[BATCH], st = 99;
	float *rows = xcalloc((size_t)BATCH * busy.rf, sizeof(float));
	uint32_t bad = 0, wrong_slot = 0, in_range = 0;
	int got;

	make_all(t, r);
	drive(t, r, 17, 60, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);

	rt = walk_all(t);
	rr = walk_all(r);
	CU_ASSERT_EQUAL(rt.n, rr.n);
	CU_ASSERT(rowsets_equal(&rt, &rr));
	CU_ASSERT_EQUAL(rowset_dups(&rt), 0);

	/* Busy: the set of ids stays (only rows that exist are used). */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, 97)) > 0) {
		rowset_add(&busy, ids, rows, (uint32_t)got);
		CU_ASSERT_EQUAL(busy_step(t, &st, IDS), 0);
	}
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.promoted > a.promoted + 1000);
	rowset_sort(&busy);
	CU_ASSERT_EQUAL(rowset_dups(&busy), 0);
	CU_ASSERT_EQUAL(busy.n, rt.n);
	CU_ASSERT(busy.n == rt.n &&
		  !memcmp(busy.ids, rt.ids, rt.n * sizeof(*rt.ids)));

	/* By slot: a quarter of the slots, busy again. */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL(emb_table_iter_slots(it, 1000, 1024), 0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, 97)) > 0) {
		for (int i = 0; i < got; i++) {
			uint32_t sl = emb_id_slot(ids[i]);

			wrong_slot += sl < 1000 || sl >= 2024;
		}
		in_range += (uint32_t)got;
		CU_ASSERT_EQUAL(busy_step(t, &st, IDS), 0);
	}
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(wrong_slot, 0);
	{
		uint32_t want = 0;

		for (uint32_t i = 0; i < rt.n; i++) {
			uint32_t sl = emb_id_slot(rt.ids[i]);

			want += sl >= 1000 && sl < 2024;
		}
		CU_ASSERT_EQUAL(in_range, want);
	}

	/* An iterator dropped in the middle of a shard lets it demote. */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT(emb_table_iter_next(it, ids, rows, NULL, 5) == 5);
	emb_table_iter_destroy(it);
	emb_table_tier_stats(t, &a);
	drive(t, r, 18, 20, IDS * 2, &bad); /* new rows: demotions */
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.demoted > a.demoted);

	rowset_free(&rt);
	rowset_free(&rr);
	rowset_free(&busy);
	free(rows);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* One checkpoint walk applied to ref: its removals, then its rows. */
static bool ckpt_apply(struct emb_table *t, struct emb_table *ref, bool delta,
		       uint64_t *st, bool busy)
{
	struct emb_table_ckpt *c = NULL;
	uint32_t rf = emb_table_row_floats(t);
	uint64_t ids[BATCH];
	const uint64_t *gone;
	uint64_t ngone;
	float *rows = xcalloc((size_t)BATCH * rf, sizeof(float));
	struct emb_row_meta meta[BATCH];
	int got;

	got = emb_table_ckpt_begin(t, delta, &c);
	if (got == EMB_EDELTALOST && delta) {
		/* Removed too many for a delta: a full one must follow. */
		free(rows);
		return false;
	}
	CU_ASSERT_EQUAL_FATAL(got, 0);
	ngone = emb_table_ckpt_erased(c, &gone);
	for (uint64_t i = 0; i < ngone; i++)
		emb_table_erase(ref, &gone[i], 1);
	while ((got = emb_table_ckpt_next(c, ids, rows, meta, 61)) > 0) {
		CU_ASSERT_EQUAL(emb_table_assign(ref, ids, (uint32_t)got, rows,
						 true, meta),
				0);
		if (busy) {
			uint64_t x[8];

			CU_ASSERT_EQUAL(busy_step(t, st, IDS + IDS / 4), 0);
			/* Removals too, cold rows among them. */
			draw(st, x, 8, IDS);
			emb_table_erase(t, x, 8);
		}
	}
	CU_ASSERT_EQUAL(got, 0);
	emb_table_ckpt_end(c);
	free(rows);
	return true;
}

/* A full checkpoint and deltas, each walked while pushes bring cold rows
 * back, pulls make rows and erases remove cold and hot ones, give the
 * table exactly once applied in order to an empty table (after a last,
 * quiet delta): the marks of rows on the device are kept. */
static void test_walk_ckpt(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "ckpt");
	struct emb_table_opts ro = o;
	struct emb_table *t = table_new(&o), *r = twin_of(&o), *ref;
	struct emb_table_tier_stats a, b;
	struct rowset rt, rref;
	uint64_t st = 5;
	uint32_t bad = 0;

	ro.name = "ref";
	ro.mem_limit = 0;
	ro.tier_path = NULL;
	ref = table_new(&ro);
	make_all(t, r);
	drive(t, r, 21, 60, IDS, &bad);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);

	ckpt_apply(t, ref, false, &st, true);
	for (int k = 0; k < 3; k++) {
		drive(t, r, 30 + k, 10, IDS, &bad);
		ckpt_apply(t, ref, true, &st, true);
	}
	ckpt_apply(t, ref, true, &st, false);
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.promoted > a.promoted + 1000);
	CU_ASSERT(b.demoted > a.demoted);

	rt = walk_all(t);
	rref = walk_all(ref);
	CU_ASSERT_EQUAL(rt.n, rref.n);
	CU_ASSERT(rowsets_equal(&rt, &rref));
	CU_ASSERT_EQUAL(table_stats(t).rows, rt.n);
	/* Nothing changed since the last delta: the next one is empty. */
	{
		struct emb_table_ckpt *c = NULL;
		const uint64_t *gone;
		uint64_t ids[4];
		float rows[4 * 64];

		CU_ASSERT_EQUAL_FATAL(emb_table_ckpt_begin(t, true, &c), 0);
		CU_ASSERT_EQUAL(emb_table_ckpt_erased(c, &gone), 0);
		CU_ASSERT_EQUAL(emb_table_ckpt_next(c, ids, rows, NULL, 4), 0);
		emb_table_ckpt_end(c);
	}
	rowset_free(&rt);
	rowset_free(&rref);
	emb_table_destroy(t);
	emb_table_destroy(r);
	emb_table_destroy(ref);
}

/* A move's tracking marks rows written since it began, whichever tier
 * they are in by the time the tracked walk comes. */
static void test_walk_tracked(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "track");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats a, b;
	struct emb_table_iter *it = NULL;
	uint64_t pushed[256], ids[BATCH], st = 77;
	float g[256 * DIM];
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint32_t bad = 0, got_n = 0, missing = 0;
	uint8_t *hit;
	int got;

	make_all(t, r);
	drive(t, r, 41, 60, IDS, &bad);
	CU_ASSERT_EQUAL(emb_table_track_begin(t, 0, EMB_NSLOTS), 0);
	/* 256 distinct written ids... */
	for (uint32_t i = 0; i < 256; i++)
		pushed[i] = (uint64_t)(i * 151u) * 7919u + 3;
	grads_fill(&st, g, 256 * DIM);
	CU_ASSERT_EQUAL(emb_table_push(t, pushed, 256, g), 0);
	emb_table_tier_stats(t, &a);
	/* ...then reads only, of rows that exist, until the written rows
	 * went to the device: reads promote and demote without marking. */
	for (uint32_t k = 0; k < 150; k++) {
		draw(&st, ids, BATCH, IDS);
		CU_ASSERT(emb_table_pull(t, ids, BATCH, w, 0, NULL) >= 0);
	}
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.demoted > a.demoted + 256);
	hit = xcalloc(256, 1);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	/* Its cold rows keep marks of their own: no walk takes them. */
	CU_ASSERT_EQUAL(emb_table_iter_tracked_take(it), -EOPNOTSUPP);
	CU_ASSERT_EQUAL(emb_table_iter_tracked(it), 0);
	while ((got = emb_table_iter_next(it, ids, NULL, NULL, BATCH)) > 0)
		for (int i = 0; i < got; i++) {
			uint32_t k;

			got_n++;
			for (k = 0; k < 256 && pushed[k] != ids[i]; k++)
				;
			if (k < 256)
				hit[k]++;
		}
	emb_table_iter_destroy(it);
	for (uint32_t k = 0; k < 256; k++)
		missing += hit[k] != 1;
	CU_ASSERT_EQUAL(missing, 0);
	CU_ASSERT_EQUAL(got_n, 256); /* and nothing only read */
	emb_table_track_end(t);
	free(hit);
	free(w);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* Every id of [0, IDS) but those in gone (or all: gone_too), each
 * once, in a sorted set. */
static uint32_t missing_or_twice(const struct rowset *rs, const uint8_t *gone,
				 bool gone_too)
{
	uint32_t bad = rowset_dups(rs);
	uint8_t *seen = xcalloc(IDS, 1);

	for (uint32_t i = 0; i < rs->n; i++)
		seen[(rs->ids[i] - 3) / 7919u] = 1;
	for (uint32_t k = 0; k < IDS; k++)
		bad += seen[k] != (gone_too || !gone[k]);

	free(seen);
	return bad;
}

/* The two moments a row may slip between a walk's parts, forced on a
 * one-shard table: rows coming back from the device into records the
 * DRAM part has passed, and blocks given back and written again with
 * rows the DRAM part handed out, while the device part is still to read
 * them. */
static void test_walk_races(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "race");
	struct emb_table *t, *r;
	struct emb_table_tier_stats a, b;
	struct rowset rs;
	struct emb_table_iter *it = NULL;
	uint64_t *ids = xcalloc(IDS, sizeof(uint64_t)), st = 3;
	uint8_t *gone = xcalloc(IDS, 1);
	uint32_t hot, bad = 0, n;
	float *rows;
	int got;

	o.nshards = 1;
	t = table_new(&o);
	r = twin_of(&o);
	make_all(t, r);
	drive(t, r, 51, 40, IDS, &bad);
	emb_table_tier_stats(t, &a);
	hot = (uint32_t)(table_stats(t).rows - a.rows_cold);
	CU_ASSERT_FATAL(hot > 1000 && a.rows_cold > IDS / 2);
	rs.rf = emb_table_row_floats(t);
	rows = xcalloc((size_t)IDS * rs.rf, sizeof(float));

	/* 1. Half way through the DRAM part: erase hot rows it handed out
	 * (their records are free now, below it), then push every id: the
	 * rows coming back take those records. */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	got = emb_table_iter_next(it, ids, rows, NULL, hot / 2);
	CU_ASSERT_FATAL(got == (int)(hot / 2));
	n = (uint32_t)got;
	for (uint32_t i = 0; i < 200; i++)
		gone[(ids[i] - 3) / 7919u] = 1;
	CU_ASSERT_EQUAL(emb_table_erase(t, ids, 200), 200);
	for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
		uint64_t x[BATCH];
		float g[BATCH * DIM];
		uint32_t m = 0;

		for (uint32_t i = lo; i < lo + BATCH; i++)
			if (!gone[i])
				x[m++] = (uint64_t)i * 7919u + 3;
		grads_fill(&st, g, BATCH * DIM);
		CU_ASSERT_EQUAL(emb_table_push(t, x, m, g), 0);
	}
	while ((got = emb_table_iter_next(it, ids + n, rows, NULL, 4096)) > 0)
		n += (uint32_t)got;
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	rs.ids = ids;
	rs.n = n;
	rs.rows = NULL;
	qsort(ids, n, sizeof(*ids), cmp_u64);
	/* The erased ones were handed out before they went. */
	CU_ASSERT_EQUAL(missing_or_twice(&rs, gone, true), 0);

	/* 2. Just into the device part: push every id twice (their rows
	 * come back, blocks empty and are given back) and pull new ids
	 * (demotions write blocks again, of rows handed out in DRAM). */
	emb_table_tier_stats(t, &a);
	hot = (uint32_t)(table_stats(t).rows - a.rows_cold);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	got = emb_table_iter_next(it, ids, rows, NULL, hot + 5);
	CU_ASSERT_FATAL(got == (int)(hot + 5));
	n = (uint32_t)got;
	for (int k = 0; k < 2; k++)
		for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
			uint64_t x[BATCH];
			float g[BATCH * DIM], w[BATCH * DIM];
			uint32_t m = 0;

			for (uint32_t i = lo; i < lo + BATCH; i++)
				if (!gone[i])
					x[m++] = (uint64_t)i * 7919u + 3;
			grads_fill(&st, g, BATCH * DIM);
			CU_ASSERT_EQUAL(emb_table_push(t, x, m, g), 0);
			draw(&st, x, BATCH, IDS);
			for (uint32_t i = 0; i < BATCH; i++)
				x[i] += (uint64_t)IDS * 7919u; /* new ids */
			CU_ASSERT(emb_table_pull(t, x, BATCH, w,
						 EMB_PULL_NOCREATE, NULL) >= 0);
		}
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.demoted > a.demoted + 1000);
	while ((got = emb_table_iter_next(it, ids + n, rows, NULL, 4096)) > 0)
		n += (uint32_t)got;
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	rs.n = n;
	qsort(ids, n, sizeof(*ids), cmp_u64);
	CU_ASSERT_EQUAL(missing_or_twice(&rs, gone, false), 0);

	free(rows);
	free(ids);
	free(gone);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* A view's rows into a sorted set; with r, traffic (the same on both
 * tables) between its calls: pushes bring cold rows back and erases
 * remove cold and hot ones. */
static struct rowset view_busy(struct emb_table *t, struct emb_table *r,
			       struct emb_table_view *vw, uint64_t seed)
{
	struct rowset rs = {.rf = emb_table_row_floats(t)};
	uint64_t ids[BATCH], st = seed;
	float *rows = xcalloc((size_t)BATCH * rs.rf, sizeof(float));
	int got;

	while ((got = emb_table_view_next(vw, ids, rows, NULL, 211)) > 0) {
		uint64_t x[8], st2 = st;

		rowset_add(&rs, ids, rows, (uint32_t)got);
		if (!r)
			continue;
		CU_ASSERT_EQUAL(busy_step(t, &st, IDS), 0);
		CU_ASSERT_EQUAL(busy_step(r, &st2, IDS), 0);
		draw(&st, x, 8, IDS);
		emb_table_erase(t, x, 8);
		emb_table_erase(r, x, 8);
	}
	CU_ASSERT_EQUAL(got, 0);
	free(rows);
	rowset_sort(&rs);
	return rs;
}

/* A point-in-time view of a tiered table (consistent dumps) is the
 * table at its instant, cold rows and all, while rows move and go
 * under it: the same rows, bit for bit, as a view of the untiered twin
 * taken at the same point of the same calls. */
static void test_view(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "view");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_view *vt = NULL, *vr = NULL;
	struct emb_table_tier_stats a, b;
	struct rowset st_, sr;
	uint32_t bad = 0;

	make_all(t, r);
	drive(t, r, 71, 40, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);
	CU_ASSERT_EQUAL_FATAL(emb_table_view_create(t, &vt), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_view_create(r, &vr), 0);
	CU_ASSERT_EQUAL(emb_table_view_rows(vt), IDS);
	st_ = view_busy(t, r, vt, 5);
	emb_table_tier_stats(t, &b);
	CU_ASSERT(b.promoted > a.promoted + 1000);
	CU_ASSERT(b.demoted > a.demoted);
	/* The twin's view, read after all that traffic: its instant. */
	sr = view_busy(r, NULL, vr, 6);
	CU_ASSERT_EQUAL(st_.n, IDS);
	CU_ASSERT_EQUAL(rowset_dups(&st_), 0);
	CU_ASSERT(rowsets_equal(&st_, &sr));
	emb_table_view_destroy(vt);
	emb_table_view_destroy(vr);
	/* A view dropped before its end lets every shard go. */
	CU_ASSERT_EQUAL_FATAL(emb_table_view_create(t, &vt), 0);
	emb_table_view_destroy(vt);
	drive(t, r, 72, 10, IDS, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	rowset_free(&st_);
	rowset_free(&sr);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* True when the record at addr holds id, sealed (common/seal.h): what a
 * one-sided reader checks before it uses a record it READ. */
static bool sealed_as(const struct emb_table_remote *rm, uint64_t addr,
		      uint64_t id)
{
	const char *rec = (const char *)(uintptr_t)addr;
	uint64_t got, seal;

	memcpy(&got, rec, 8);
	memcpy(&seal, rec + rm->rec_bytes - 8, 8);
	return got == id &&
	       emb_seal(rm->seed, id, rec + 16, 4ull * rm->row_floats) == seal;
}

/* The ids of make_all(), in order. */
static uint64_t *all_ids(void)
{
	uint64_t *ids = xcalloc(IDS, sizeof(*ids));

	for (uint32_t i = 0; i < IDS; i++)
		ids[i] = (uint64_t)i * 7919u + 3;
	return ids;
}

/*
 * Every id of [0, IDS) through the reads a one-sided client makes: the
 * located ones from their records, seal checked and decoded, the others
 * by a pull (two-sided); each must be the twin's row. Counts mismatches
 * (a located record whose seal fails counts too); *located gets how many
 * were located.
 */
static uint32_t read_as_client(struct emb_table *t, struct emb_table *r,
			       const struct emb_table_remote *rm, uint32_t fmt,
			       uint32_t *located)
{
	uint64_t ids[BATCH], addrs[BATCH];
	uint8_t fa[BATCH], fb[BATCH];
	float *wa = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *wb = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float w[DIM];
	uint32_t bad = 0;

	*located = 0;
	for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)(lo + i) * 7919u + 3;
		*located += (uint32_t)emb_table_locate(t, ids, BATCH, addrs);
		CU_ASSERT_EQUAL(emb_table_pull(r, ids, BATCH, wb,
					       EMB_PULL_NOCREATE, fb),
				0);
		for (uint32_t i = 0; i < BATCH; i++) {
			if (!addrs[i])
				continue;
			if (!sealed_as(rm, addrs[i], ids[i])) {
				bad++;
				continue;
			}
			emb_rowfmt_decode(fmt,
					  (const char *)(uintptr_t)addrs[i] + 16,
					  w, DIM);
			bad += memcmp(w, wb + (size_t)i * DIM, sizeof(w)) != 0;
		}
		/* The rest as the client's fallback gets them. */
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, BATCH, wa,
					       EMB_PULL_NOCREATE, fa),
				0);
		for (uint32_t i = 0; i < BATCH; i++)
			bad += !addrs[i] && memcmp(wa + (size_t)i * DIM,
						   wb + (size_t)i * DIM,
						   DIM * sizeof(float)) != 0;
	}
	free(wa);
	free(wb);
	return bad;
}

/*
 * A remote-readable tiered table, in each row format: LOCATE finds
 * exactly the rows in DRAM (a cold row has no record to READ: the client
 * pulls it two-sided); a record a row left for the device fails the seal
 * check at its old address, as an erased row's does; a row brought back
 * (by a second read, by a push) is sealed in its new record; and every
 * row, read as a one-sided client reads it, is the untiered twin's.
 */
static void test_remote_read(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP32, EMB_ROWFMT_INT8,
					EMB_ROWFMT_BF16};

	for (size_t k = 0; k < sizeof(fmts) / sizeof(fmts[0]); k++) {
		char path[4096];
		struct emb_table_opts o = tier_opts(path, sizeof(path), "rr");
		struct emb_table_tier_stats a, b;
		struct emb_table_remote rm;
		struct emb_table *t, *r;
		uint64_t *ids = all_ids();
		uint64_t *before = xcalloc(IDS, sizeof(*before));
		uint64_t *now = xcalloc(IDS, sizeof(*now));
		uint64_t cold[BATCH], addrs[BATCH];
		float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));
		uint32_t bad = 0, left = 0, stayed = 0, ncold = 0, located;
		int64_t found;

		o.remote_read = true;
		o.row_format = fmts[k];
		t = table_new(&o);
		r = twin_of(&o);
		CU_ASSERT_TRUE_FATAL(emb_table_remote(t, &rm));
		make_all(t, r);
		emb_table_tier_stats(t, &a);
		CU_ASSERT_FATAL(a.rows_cold > IDS / 2);
		found = emb_table_locate(t, ids, IDS, before);
		CU_ASSERT_EQUAL(found, (int64_t)(IDS - a.rows_cold));

		/* Traffic moves rows both ways. */
		drive(t, r, 77 + k, 30, IDS, &bad);
		CU_ASSERT_EQUAL(bad, 0);
		emb_table_tier_stats(t, &b);
		CU_ASSERT(b.demoted > a.demoted);
		CU_ASSERT(b.promoted > a.promoted);
		found = emb_table_locate(t, ids, IDS, now);
		CU_ASSERT_EQUAL(found, (int64_t)(IDS - b.rows_cold));
		/* An old location passes the check exactly when the row is
		 * still there; a row now on the device left a record that
		 * fails it. */
		for (uint32_t i = 0; i < IDS; i++) {
			bool ok;

			if (!before[i])
				continue;
			ok = sealed_as(&rm, before[i], ids[i]);
			bad += ok != (now[i] == before[i]);
			left += !now[i];
			stayed += now[i] == before[i];
			if (!now[i] && ncold < BATCH)
				cold[ncold++] = ids[i];
		}
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT(left > 0);
		CU_ASSERT(stayed > 0);
		CU_ASSERT_FATAL(ncold > 2);

		/* Back by reads: the second pull of a cold row brings it
		 * back (unless another id's fingerprint took its place);
		 * those located are sealed, with the twin's values. */
		a = b;
		CU_ASSERT_EQUAL(emb_table_pull(t, cold, ncold / 2, w, 0, NULL),
				0);
		CU_ASSERT_EQUAL(emb_table_pull(t, cold, ncold / 2, w, 0, NULL),
				0);
		emb_table_tier_stats(t, &b);
		CU_ASSERT(b.promoted > a.promoted);
		found = emb_table_locate(t, cold, ncold / 2, addrs);
		CU_ASSERT(found > 0);
		for (uint32_t i = 0; i < ncold / 2; i++)
			bad += addrs[i] && !sealed_as(&rm, addrs[i], cold[i]);
		/* Back by a push: every one, sealed after its write. */
		grads_fill(&(uint64_t){k}, w, (size_t)BATCH * DIM);
		CU_ASSERT_EQUAL(
		    emb_table_push(t, cold + ncold / 2, ncold - ncold / 2, w),
		    0);
		CU_ASSERT_EQUAL(
		    emb_table_push(r, cold + ncold / 2, ncold - ncold / 2, w),
		    0);
		found = emb_table_locate(t, cold + ncold / 2,
					 ncold - ncold / 2, addrs);
		CU_ASSERT_EQUAL(found, (int64_t)(ncold - ncold / 2));
		for (uint32_t i = 0; i < ncold - ncold / 2; i++)
			bad += !sealed_as(&rm, addrs[i], cold[ncold / 2 + i]);
		CU_ASSERT_EQUAL(bad, 0);

		/* Every row as a one-sided client reads it. */
		bad = read_as_client(t, r, &rm, fmts[k], &located);
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT(located > 0 && located < IDS);
		free(ids);
		free(before);
		free(now);
		free(w);
		emb_table_destroy(t);
		emb_table_destroy(r);
	}
}

/* ---- eviction policies on a tiered table ---- */

#define HOT 2048u  /* ids [0, HOT): the rows used all along */
#define WARM 512u  /* ids [HOT, HOT + WARM): used every 49 steps */
#define TTL 64u	   /* steps */

static uint64_t id_of(uint32_t i)
{
	return (uint64_t)i * 7919u + 3;
}

static void set_policy(struct emb_table *t, const char *spec)
{
	struct emb_lifecycle_cfg life = EMB_LIFECYCLE_CFG_DEFAULT;

	CU_ASSERT_EQUAL_FATAL(emb_evict_parse(spec, &life), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_lifecycle(t, &life), 0);
}

/* A pull then a push (one step) of ids [lo, lo + m) in t and, if r, r. */
static void use_range(struct emb_table *t, struct emb_table *r, uint32_t lo,
		      uint32_t m, uint64_t *st)
{
	uint64_t ids[BATCH];
	float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t i = 0; i < m; i++)
		ids[i] = id_of(lo + i);
	grads_fill(st, g, (size_t)m * DIM);
	CU_ASSERT(emb_table_pull(t, ids, m, w, 0, NULL) >= 0);
	CU_ASSERT_EQUAL(emb_table_push(t, ids, m, g), 0);
	if (r) {
		CU_ASSERT(emb_table_pull(r, ids, m, w, 0, NULL) >= 0);
		CU_ASSERT_EQUAL(emb_table_push(r, ids, m, g), 0);
	}
	free(g);
	free(w);
}

/* How many of ids [lo, hi) t has (a no-create pull: an access). */
static uint32_t count_present(struct emb_table *t, uint32_t lo, uint32_t hi)
{
	uint64_t ids[BATCH];
	uint8_t found[BATCH];
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint32_t n = 0;

	for (uint32_t a = lo; a < hi; a += BATCH) {
		uint32_t m = hi - a < BATCH ? hi - a : BATCH;

		for (uint32_t i = 0; i < m; i++)
			ids[i] = id_of(a + i);
		CU_ASSERT(emb_table_pull(t, ids, m, w, EMB_PULL_NOCREATE,
					 found) >= 0);
		for (uint32_t i = 0; i < m; i++)
			n += found[i];
	}
	free(w);
	return n;
}

/*
 * ttl on a tiered table whose rows are mostly on the device: every row
 * idle past ttl goes (a cold one by its block, unread but for its id),
 * no row used within ttl does; ttl counts steps though the rows keep the
 * tier's ticks (two a step here: a pull and a push), so the warm rows,
 * idle 49 steps = 98 ticks, stay. The untiered twin ends the same.
 */
static void test_evict_ttl(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "ttl");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats a, b;
	struct emb_table_stats ts, rs;
	uint64_t st = 3;
	char spec[32];

	make_all(t, r);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);
	snprintf(spec, sizeof(spec), "ttl:%u", TTL);
	set_policy(t, spec);
	set_policy(r, spec);
	/* 60 rounds of 4 hot steps, the warm rows every 12th round: 4.5
	 * ttl, past any lateness (the hand's ttl / 2, the step history's
	 * ttl / 8). */
	for (uint32_t k = 0; k < 60; k++) {
		for (uint32_t lo = 0; lo < HOT; lo += BATCH)
			use_range(t, r, lo, BATCH, &st);
		if (k % 12 == 11)
			use_range(t, r, HOT, WARM, &st);
		/* Rows read once, 48 steps after the policy, and served
		 * from the device without coming back: a read all the
		 * same. 60 steps later (108 since the policy, past its
		 * lateness) they are there still. */
		if (k == 12) {
			CU_ASSERT_EQUAL(count_present(t, HOT + WARM,
						      HOT + 2 * WARM),
					WARM);
			CU_ASSERT_EQUAL(count_present(r, HOT + WARM,
						      HOT + 2 * WARM),
					WARM);
		}
		if (k == 27) {
			CU_ASSERT_EQUAL(count_present(t, HOT + WARM,
						      HOT + 2 * WARM),
					WARM);
			CU_ASSERT_EQUAL(count_present(r, HOT + WARM,
						      HOT + 2 * WARM),
					WARM);
		}
	}
	emb_table_tier_stats(t, &b);
	ts = table_stats(t);
	rs = table_stats(r);
	CU_ASSERT_EQUAL(ts.rows, HOT + WARM);
	CU_ASSERT_EQUAL(ts.rows_evicted, IDS - HOT - WARM);
	CU_ASSERT_EQUAL(ts.rows_evicted_ttl, IDS - HOT - WARM);
	CU_ASSERT_EQUAL(ts.rows_evicted_l2 + ts.rows_evicted_cap, 0);
	CU_ASSERT_EQUAL(rs.rows_evicted_ttl, IDS - HOT - WARM);
	CU_ASSERT(b.rows_cold <= ts.rows);
	/* Cold rows went by their blocks: far fewer reads than rows. */
	CU_ASSERT(b.blocks_read - a.blocks_read < a.rows_cold / 4);
	/* Their blocks went back to the free list. */
	CU_ASSERT(b.file_bytes - b.free_bytes <= b.rows_cold * 4096);
	CU_ASSERT(b.free_bytes > b.file_bytes / 2);
	/* Same rows, same weights: none used within ttl was lost. */
	check_same(t, r, IDS);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/*
 * max_rows counts cold rows too and keeps the table at its cap after
 * every batch, never evicting a row of the batch; cold rows go first,
 * so the newest rows (in DRAM) all stay, and rows used in every batch
 * keep their weights (an untiered table without a policy has the same).
 */
static void test_evict_cap(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "cap");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	const uint32_t cap = 16384, hot = 256;
	uint64_t st = 5, made = hot;
	uint32_t over = 0, lost = 0;
	struct emb_table_tier_stats ta;
	struct emb_table_stats s;
	char spec[32];

	snprintf(spec, sizeof(spec), "max_rows:%u", cap);
	set_policy(t, spec);
	for (uint32_t lo = hot; lo < IDS; lo += hot) {
		uint64_t ids[2 * 256];
		uint8_t found[2 * 256];
		float *g = xcalloc((size_t)2 * hot * DIM, sizeof(float));
		float *w = xcalloc((size_t)2 * hot * DIM, sizeof(float));

		for (uint32_t i = 0; i < hot; i++) {
			ids[i] = id_of(i);
			ids[hot + i] = id_of(lo + i);
		}
		grads_fill(&st, g, (size_t)2 * hot * DIM);
		CU_ASSERT_EQUAL(emb_table_push(t, ids, 2 * hot, g), 0);
		CU_ASSERT_EQUAL(emb_table_push(r, ids, 2 * hot, g), 0);
		made += hot;
		if (table_stats(t).rows > cap)
			over++;
		CU_ASSERT(emb_table_pull(t, ids, 2 * hot, w, EMB_PULL_NOCREATE,
					 found) >= 0);
		for (uint32_t i = 0; i < 2 * hot; i++)
			lost += !found[i];
		free(g);
		free(w);
	}
	emb_table_tier_stats(t, &ta);
	s = table_stats(t);
	CU_ASSERT_EQUAL(over, 0);
	CU_ASSERT_EQUAL(lost, 0);
	CU_ASSERT(ta.rows_cold > 0);
	CU_ASSERT(s.rows <= cap && s.rows >= cap - cap / 16);
	CU_ASSERT_EQUAL(s.rows_evicted_cap, made - s.rows);
	CU_ASSERT_EQUAL(s.rows_evicted, s.rows_evicted_cap);
	CU_ASSERT(ta.rows_cold < s.rows);
	/* Cold first: nearly all evicted rows were cold (a cold row leaves
	 * by promotion or eviction), and nearly all of the 4096 newest rows
	 * are there (the victims are sampled, as in DRAM). */
	CU_ASSERT(ta.demoted - ta.promoted - ta.rows_cold >=
		  s.rows_evicted_cap * 9 / 10);
	CU_ASSERT(ta.demoted - ta.promoted - ta.rows_cold <=
		  s.rows_evicted_cap);
	CU_ASSERT(count_present(t, IDS - 4096, IDS) >= 4096 - 4096 / 100);
	/* The rows of every batch never went: the weights of a table that
	 * never evicts. */
	check_same(t, r, hot);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/* Row i's weights under test_evict_l2: weak (norm 0.004) if i % 3 == 0. */
static void l2_rows(float *rows, uint32_t lo, uint32_t m)
{
	for (uint32_t i = 0; i < m; i++)
		for (uint32_t j = 0; j < DIM; j++)
			rows[(size_t)i * DIM + j] =
			    (lo + i) % 3 == 0 ? 0.001f : 0.5f;
}

static void assign_range(struct emb_table *t, struct emb_table *r,
			 uint32_t lo, uint32_t hi)
{
	uint64_t ids[BATCH];
	float *rows = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t a = lo; a < hi; a += BATCH) {
		uint32_t m = hi - a < BATCH ? hi - a : BATCH;

		for (uint32_t i = 0; i < m; i++)
			ids[i] = id_of(a + i);
		l2_rows(rows, a, m);
		CU_ASSERT_EQUAL(emb_table_assign(t, ids, m, rows, false, NULL),
				0);
		CU_ASSERT_EQUAL(emb_table_assign(r, ids, m, rows, false, NULL),
				0);
	}
	free(rows);
}

/*
 * min_l2 removes weak rows wherever they are: those on the device when
 * it is set (one read of each block), those a demotion would send there
 * after (evicted instead), those in DRAM (the hand); the strong stay.
 */
static void test_evict_l2(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "l2");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	const uint32_t split = 30000;
	struct emb_table_tier_stats a;
	struct emb_table_stats s;
	uint32_t weak = (IDS + 2) / 3, strong = IDS - weak;
	uint64_t st = 9;

	assign_range(t, r, 0, split);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > split / 2);
	set_policy(t, "min_l2:0.01");
	set_policy(r, "min_l2:0.01");
	assign_range(t, r, split, IDS);
	/* Reads and small writes of strong rows only, so that the sweeps
	 * run (and the untiered twin's steps go on): no norm nears 0.01. */
	for (uint32_t k = 0; k < 100; k++) {
		uint64_t ids[BATCH / 4];
		float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));

		for (uint32_t i = 0; i < BATCH / 4; i++) {
			uint32_t x = rnd_below(&st, IDS);

			ids[i] = id_of(x % 3 ? x : x + 1);
		}
		CU_ASSERT(emb_table_pull(t, ids, BATCH / 4, w,
					 EMB_PULL_NOCREATE, NULL) >= 0);
		CU_ASSERT(emb_table_pull(r, ids, BATCH / 4, w,
					 EMB_PULL_NOCREATE, NULL) >= 0);
		memset(w, 0, (size_t)BATCH * DIM * sizeof(float));
		CU_ASSERT_EQUAL(emb_table_push(t, ids, BATCH / 4, w), 0);
		CU_ASSERT_EQUAL(emb_table_push(r, ids, BATCH / 4, w), 0);
		free(w);
	}
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, strong);
	CU_ASSERT_EQUAL(s.rows_evicted_l2, weak);
	CU_ASSERT_EQUAL(s.rows_evicted, weak);
	CU_ASSERT_EQUAL(table_stats(r).rows_evicted_l2, weak);
	check_same(t, r, IDS);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/*
 * A delta checkpoint records the cold rows evicted since the last one, as
 * an erase of a cold row is recorded: applied in order, the checkpoints
 * give the table. One row in 16 is weak here, too few for the delta to
 * give up its list.
 */
static void test_evict_delta(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "evdelta");
	struct emb_table_opts ro = o;
	struct emb_table *t = table_new(&o), *ref;
	struct emb_table_tier_stats a, b;
	struct rowset rt, rref;
	uint64_t ids[BATCH], st = 23;
	float *rows = xcalloc((size_t)BATCH * DIM, sizeof(float));

	ro.name = "ref";
	ro.mem_limit = 0;
	ro.tier_path = NULL;
	ref = table_new(&ro);
	for (uint32_t lo = 0; lo < IDS; lo += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++) {
			ids[i] = id_of(lo + i);
			for (uint32_t j = 0; j < DIM; j++)
				rows[(size_t)i * DIM + j] =
				    (lo + i) % 16 ? 0.5f : 0.001f;
		}
		CU_ASSERT_EQUAL(emb_table_assign(t, ids, BATCH, rows, false,
						 NULL),
				0);
	}
	CU_ASSERT(ckpt_apply(t, ref, false, &st, false));
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);
	set_policy(t, "min_l2:0.01");
	/* Zero pushes of strong rows: the sweeps run, nothing changes. */
	memset(rows, 0, (size_t)BATCH * DIM * sizeof(float));
	for (uint32_t k = 0; k < 100; k++) {
		for (uint32_t i = 0; i < 64; i++)
			ids[i] = id_of(rnd_below(&st, IDS / 16) * 16 + 1);
		CU_ASSERT_EQUAL(emb_table_push(t, ids, 64, rows), 0);
	}
	emb_table_tier_stats(t, &b);
	CU_ASSERT_EQUAL(table_stats(t).rows_evicted_l2, IDS / 16);
	/* Most went from the device: a cold row leaves by promotion or
	 * eviction. */
	CU_ASSERT(b.demoted - b.promoted - b.rows_cold > IDS / 32);
	CU_ASSERT_FATAL(ckpt_apply(t, ref, true, &st, false));
	rt = walk_all(t);
	rref = walk_all(ref);
	CU_ASSERT_EQUAL(rt.n, IDS - IDS / 16);
	CU_ASSERT_EQUAL(rt.n, rref.n);
	CU_ASSERT(rowsets_equal(&rt, &rref));
	rowset_free(&rt);
	rowset_free(&rref);
	free(rows);
	emb_table_destroy(t);
	emb_table_destroy(ref);
}

/* emb_table_evict on a tiered table reaches its cold rows: by access
 * count (every cold block read), and by idle steps (blocks unread). */
static void test_evict_call(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "evcall");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct emb_table_tier_stats a;
	uint64_t st = 13;

	make_all(t, r);
	for (uint32_t k = 0; k < 10; k++)
		for (uint32_t lo = 0; lo < HOT; lo += BATCH)
			use_range(t, NULL, lo, BATCH, &st);
	emb_table_tier_stats(t, &a);
	CU_ASSERT_FATAL(a.rows_cold > IDS / 2);
	/* Every slot held (a move under way): no row goes, cold or hot. */
	{
		uint64_t all[EMB_NSLOTS / 64];

		memset(all, 0xff, sizeof(all));
		emb_table_evict_hold(t, all);
		CU_ASSERT_EQUAL(emb_table_evict(t, 0, 3), 0);
		emb_table_evict_hold(t, NULL);
		CU_ASSERT_EQUAL(table_stats(t).rows, IDS);
	}
	/* Made by one push each (a count of 2: made, pushed); the hot rows
	 * were pushed ten times more. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 0, 3), IDS - HOT);
	CU_ASSERT_EQUAL(table_stats(t).rows, HOT);
	CU_ASSERT_EQUAL(count_present(t, 0, HOT), HOT);
	/* Half the hot rows idle 50 steps, the others used every 2: the
	 * step history answers 30 steps to within 30 / 8, late. */
	for (uint32_t k = 0; k < 25; k++)
		for (uint32_t lo = 0; lo < HOT / 2; lo += BATCH)
			use_range(t, NULL, lo, BATCH, &st);
	CU_ASSERT_EQUAL(emb_table_evict(t, 30, 0), HOT / 2);
	CU_ASSERT_EQUAL(count_present(t, 0, HOT), HOT / 2);
	CU_ASSERT_EQUAL(count_present(t, 0, HOT / 2), HOT / 2);
	CU_ASSERT_EQUAL(table_stats(t).rows_evicted, IDS - HOT / 2);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

/*
 * Walks while ttl evicts cold and hot rows under them: an iterator hands
 * out each row once, and every row used all along; checkpoint deltas
 * record each eviction, so base and deltas applied in order give the
 * table exactly.
 */
static void test_evict_walks(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "evwalk");
	struct emb_table_opts ro = o;
	struct emb_table *t = table_new(&o), *r = twin_of(&o), *ref;
	struct emb_table_iter *it = NULL;
	struct rowset rt, rref;
	uint64_t ids[BATCH], st = 17;
	uint8_t *seen = xcalloc(IDS + IDS / 4, 1);
	uint32_t dup = 0, hot_seen = 0, stray = 0, deltas = 0;
	uint64_t ev0;
	int got;

	ro.name = "ref";
	ro.mem_limit = 0;
	ro.tier_path = NULL;
	ref = table_new(&ro);
	make_all(t, r);
	set_policy(t, "ttl:16");
	ev0 = table_stats(t).rows_evicted;
	/* The iterator, with a hot step between its calls: the rows idle
	 * since make_all leave under it, block by block. */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, NULL, NULL, 97)) > 0) {
		for (int i = 0; i < got; i++) {
			uint32_t x = (uint32_t)((ids[i] - 3) / 7919u);

			if (x >= IDS || (ids[i] - 3) % 7919u) {
				stray++;
				continue;
			}
			dup += seen[x]++ != 0;
			hot_seen += x < HOT / 4;
		}
		use_range(t, NULL, 0, HOT / 4, &st);
	}
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(dup, 0);
	CU_ASSERT_EQUAL(stray, 0);
	CU_ASSERT_EQUAL(hot_seen, HOT / 4);
	CU_ASSERT(table_stats(t).rows_evicted > ev0 + IDS / 2);

	/* Checkpoints while busy steps and ttl remove rows: a delta after
	 * more removals than it keeps ids of is lost, and a full one
	 * follows, into a new copy. */
	make_all(t, r);
	ckpt_apply(t, ref, false, &st, true);
	for (int k = 0; k < 5; k++) {
		for (uint32_t j = 0; j < 20; j++)
			use_range(t, NULL, 0, HOT / 4, &st);
		if (ckpt_apply(t, ref, true, &st, k < 4)) {
			deltas++;
			continue;
		}
		emb_table_destroy(ref);
		ref = table_new(&ro);
		ckpt_apply(t, ref, false, &st, k < 4);
	}
	CU_ASSERT(deltas >= 2);
	/* The last one quiet: the copy is the table. */
	CU_ASSERT_FATAL(ckpt_apply(t, ref, true, &st, false));
	rt = walk_all(t);
	rref = walk_all(ref);
	CU_ASSERT_EQUAL(rt.n, rref.n);
	CU_ASSERT(rowsets_equal(&rt, &rref));
	CU_ASSERT_EQUAL(table_stats(t).rows, rt.n);
	CU_ASSERT(table_stats(t).rows_evicted > ev0 + IDS);
	rowset_free(&rt);
	rowset_free(&rref);
	free(seen);
	emb_table_destroy(t);
	emb_table_destroy(r);
	emb_table_destroy(ref);
}

struct evict_thread {
	struct emb_table *t;
	uint32_t which; /* 3: the evict calls and iterators */
	uint32_t bad;
	uint32_t dup; /* ids an iterator handed out twice */
	uint64_t evicted; /* rows evicted while its iterators ran */
};

static void *evict_thread_main(void *p)
{
	struct evict_thread *a = p;
	uint64_t st = 200 + a->which, ids[BATCH];
	float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
	float *w = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint8_t *seen = xcalloc(IDS, 1);

	for (uint32_t k = 0; k < 60; k++) {
		if (a->which == 3) {
			struct emb_table_iter *it = NULL;
			int got;

			if (emb_table_evict(a->t, 40, k % 2 ? 0 : 2) < 0)
				a->bad++;
			if (k % 10)
				continue;
			uint64_t ev0 = table_stats(a->t).rows_evicted;

			memset(seen, 0, IDS);
			if (emb_table_iter_create(a->t, &it)) {
				a->bad++;
				continue;
			}
			while ((got = emb_table_iter_next(it, ids, NULL, NULL,
							  BATCH)) > 0)
				for (int i = 0; i < got; i++)
					a->dup += seen[(ids[i] - 3) / 7919u]++;
			a->bad += got != 0;
			emb_table_iter_destroy(it);
			a->evicted += table_stats(a->t).rows_evicted - ev0;
			continue;
		}
		draw(&st, ids, BATCH, a->which ? IDS : IDS / 8);
		if (emb_table_pull(a->t, ids, BATCH, w, 0, NULL) < 0)
			a->bad++;
		grads_fill(&st, g, (size_t)BATCH * DIM);
		if (emb_table_push(a->t, ids, BATCH, g))
			a->bad++;
	}
	free(seen);
	free(g);
	free(w);
	return NULL;
}

/*
 * Threads pulling and pushing while every eviction term runs, with a
 * thread calling emb_table_evict and iterating (for the race checkers):
 * iterators hand out each row once, and the counts add up after. An id
 * may come out twice only as two rows: handed out, evicted by a push's
 * sweep, and made again by a pull ahead of the walk (a row made since a
 * walk began may come out); so an iterator's repeats are bounded by the
 * rows evicted while it ran (one CI run in many saw one such repeat).
 */
static void test_evict_threads(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "evthreads");
	struct emb_table *t = table_new(&o), *r = twin_of(&o);
	struct evict_thread a[4];
	pthread_t th[4];
	struct emb_table_stats s;
	struct emb_table_tier_stats ts;
	struct rowset rs;

	make_all(t, r);
	set_policy(t, "ttl:30,min_l2:0.05,max_rows:20000");
	for (uint32_t i = 0; i < 4; i++) {
		a[i] = (struct evict_thread){.t = t, .which = i};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, evict_thread_main, &a[i]), 0);
	}
	for (uint32_t i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(a[i].bad, 0);
		CU_ASSERT(a[i].dup <= a[i].evicted);
	}
	s = table_stats(t);
	emb_table_tier_stats(t, &ts);
	rs = walk_all(t);
	CU_ASSERT_EQUAL(s.rows, rs.n);
	CU_ASSERT(s.rows <= 20000);
	CU_ASSERT(ts.rows_cold <= s.rows);
	CU_ASSERT(s.rows_evicted >=
		  s.rows_evicted_ttl + s.rows_evicted_l2 + s.rows_evicted_cap);
	/* Every row made (pushes and pulls make them) is there or was
	 * evicted: none counted twice, none lost. */
	CU_ASSERT_EQUAL(s.rows + s.rows_evicted, s.rows_created);
	CU_ASSERT(s.rows_evicted_ttl + s.rows_evicted_cap > 0);
	rowset_free(&rs);
	emb_table_destroy(t);
	emb_table_destroy(r);
}

static void test_refused(void)
{
	char path[4096];
	struct emb_table_opts o = tier_opts(path, sizeof(path), "no");
	struct emb_table_opts bad;
	struct emb_table *t = NULL;
	struct emb_lifecycle_cfg life = EMB_LIFECYCLE_CFG_DEFAULT;
	const float *ptrs[1];
	uint64_t id = 1;

	bad = o;
	bad.mem_limit = 0; /* nothing would ever go to the device */
	CU_ASSERT_EQUAL(emb_table_create(&bad, &t), EMB_EBADARG);
	bad = o;
	bad.tier_path = "/nonexistent-embstore-dir/x.tier";
	CU_ASSERT_EQUAL(emb_table_create(&bad, &t), -ENOENT);
	CU_ASSERT_PTR_NULL(t);

	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, &id, 1, ptrs, 0), -EOPNOTSUPP);
	CU_ASSERT_EQUAL(emb_admit_parse("count:2", &life), 0);
	CU_ASSERT_EQUAL(emb_table_set_lifecycle(t, &life), 0);
	emb_table_destroy(t);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"rows past the limit go to the device and come back exactly",
	     test_rows_come_back},
	    {"erase and assign reach cold rows", test_erase_assign_cold},
	    {"compact rows go to the device and come back exactly",
	     test_compact_rows},
	    {"a refused push puts back the rows it brought back",
	     test_refused_push_puts_back},
	    {"a pull brings a cold row back on its second read",
	     test_second_read_promotes},
	    {"threads on one tiered table", test_threads},
	    {"a full tier fails what it cannot hold", test_full_tier},
	    {"an iterator hands out every row once while rows move",
	     test_walk_iter},
	    {"checkpoint walks keep the marks of rows on the device",
	     test_walk_ckpt},
	    {"a move's tracking follows rows to the device",
	     test_walk_tracked},
	    {"rows slip between no two parts of a walk", test_walk_races},
	    {"a view shows the instant, cold rows and all", test_view},
	    {"remote reads find only DRAM rows, sealed as they move",
	     test_remote_read},
	    {"ttl evicts idle rows hot and cold, in steps",
	     test_evict_ttl},
	    {"max_rows counts cold rows and evicts them first",
	     test_evict_cap},
	    {"min_l2 evicts weak rows hot and cold", test_evict_l2},
	    {"a delta records the cold rows evicted", test_evict_delta},
	    {"threads while every eviction term runs", test_evict_threads},
	    {"emb_table_evict reaches cold rows", test_evict_call},
	    {"walks hand out each row once while rows are evicted",
	     test_evict_walks},
	    {"what a tier does not do yet is refused", test_refused},
	    {NULL, NULL},
	};
	int rc;

	dir = emb_test_tmpdir();
	rc = emb_test_main(argc, argv, "store/tier", cases);
	emb_test_rmtree(dir);
	free(dir);
	return rc;
}
