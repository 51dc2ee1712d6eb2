/*
 * tests/store/test_nonfinite.c - a row is never non-finite: a push whose
 * result would make any float of a row (weights or optimizer state) NaN or
 * infinite is refused whole, in every shard, for each optimizer and each
 * vector copy of it; a snapshot holding such a row (written by an older
 * version) loads the rest. Single-threaded.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_test.h"
#include "common/optim.h"
#include "common/optim_int.h"
#include "store/chain.h"
#include "store/snapshot.h"

#define DIM   20u /* whole AVX2 and AVX-512 blocks plus a scalar tail */
#define NROWS 64u /* rows over every shard */
#define BIG   3e38f

/* Every row of t as the iterator gives it (ids, floats, meta), in order. */
struct image {
	uint64_t *ids;
	float *rows;
	struct emb_row_meta *meta;
	int n;
};

static struct image take_image(struct emb_table *t)
{
	struct image im;
	struct emb_table_iter *it;
	uint32_t rf = emb_table_row_floats(t);

	im.ids = xcalloc(4 * NROWS, sizeof(*im.ids));
	im.rows = xcalloc((size_t)4 * NROWS * rf, sizeof(*im.rows));
	im.meta = xcalloc(4 * NROWS, sizeof(*im.meta));
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	im.n = emb_table_iter_next(it, im.ids, im.rows, im.meta, 4 * NROWS);
	emb_table_iter_destroy(it);
	return im;
}

static bool same_image(struct emb_table *t, const struct image *a,
		       const struct image *b)
{
	size_t rf = emb_table_row_floats(t);

	return a->n == b->n &&
	       !memcmp(a->ids, b->ids, (size_t)a->n * sizeof(*a->ids)) &&
	       !memcmp(a->rows, b->rows, (size_t)a->n * rf * sizeof(float)) &&
	       !memcmp(a->meta, b->meta, (size_t)a->n * sizeof(*a->meta));
}

static void free_image(struct image *im)
{
	free(im->ids);
	free(im->rows);
	free(im->meta);
}

static struct emb_table *overflow_table(uint32_t kind)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t ids[NROWS];
	float g[NROWS * DIM];

	o.dim = DIM;
	o.nshards = 8;
	o.optim.kind = kind;
	/* SGD: 4 * 3e38 overflows; the others overflow their state with
	 * the square of 3e38. */
	if (kind == EMB_OPTIM_SGD)
		o.optim.lr = 4.0f;
	struct emb_table *t = table_new(&o);

	for (uint32_t i = 0; i < NROWS; i++)
		ids[i] = 1000 + i;
	for (uint32_t i = 0; i < NROWS * DIM; i++)
		g[i] = 0.01f * (float)(i % 7);
	CU_ASSERT_EQUAL_FATAL(emb_table_push(t, ids, NROWS, g), 0);
	return t;
}

/*
 * For one optimizer and the vector copy vec: a batch over every shard
 * whose one row (at position at) would overflow, or whose repeated id's
 * finite gradients sum past the float range, is refused, and no row of
 * any shard changed; a row the push would have made is not there. The
 * same batch without the bad row is then applied.
 */
static void overflow_case(uint32_t kind, unsigned vec, uint32_t at,
			  bool repeats)
{
	enum { N = NROWS + 1 + 64 };
	uint64_t ids[N], fresh = 777777;
	float *g = xcalloc((size_t)N * DIM, sizeof(float));
	struct emb_table *t = overflow_table(kind);
	struct emb_table_stats before = table_stats(t);
	struct image a, b;
	uint8_t found;
	float row[DIM];
	uint32_t n = NROWS + 1;

	emb__optim_vec_max = vec;
	for (uint32_t i = 0; i < NROWS; i++)
		ids[i] = 1000 + i;
	ids[NROWS] = fresh; /* a row the push would make */
	for (uint32_t i = 0; i < n * DIM; i++)
		g[i] = -0.02f;
	if (repeats) {
		/* 64 more of ids[at], 3e38 each but the first: every
		 * gradient is finite, their sum is not. */
		for (uint32_t r = 0; r < 64; r++) {
			ids[n] = ids[at];
			for (uint32_t j = 0; j < DIM; j++)
				g[(size_t)n * DIM + j] = BIG;
			n++;
		}
	} else {
		g[(size_t)at * DIM + DIM - 1] = BIG; /* in the scalar tail */
		g[(size_t)at * DIM + 3] = BIG;	     /* in a vector block */
	}
	a = take_image(t);
	CU_ASSERT_EQUAL(emb_table_push(t, ids, n, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_nonfinite_id(), ids[at]);
	b = take_image(t);
	CU_ASSERT(same_image(t, &a, &b));
	CU_ASSERT_EQUAL(emb_table_pull(t, &fresh, 1, row, EMB_PULL_NOCREATE,
				       &found),
			1);
	CU_ASSERT_EQUAL(found, 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, before.rows);
	CU_ASSERT_EQUAL(table_stats(t).rows_pushed, before.rows_pushed);
	free_image(&b);

	/* The locks were let go, and a finite push still applies. */
	ids[at] = 5;
	for (uint32_t j = 0; j < DIM; j++)
		g[(size_t)at * DIM + j] = -0.02f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, NROWS + 1, g), 0);
	b = take_image(t);
	CU_ASSERT(!same_image(t, &a, &b));
	CU_ASSERT_EQUAL(table_stats(t).rows, before.rows + 2);
	free_image(&a);
	free_image(&b);
	emb_table_destroy(t);
	free(g);
	emb__optim_vec_max = 64;
}

static void overflow_all(uint32_t kind)
{
	static const unsigned vecs[] = {0, 32, 64};

	for (size_t v = 0; v < sizeof(vecs) / sizeof(vecs[0]); v++) {
		/* The bad row first, last and in the middle of the batch:
		 * its shard comes before, after or among the others. */
		overflow_case(kind, vecs[v], 0, false);
		overflow_case(kind, vecs[v], NROWS - 1, false);
		overflow_case(kind, vecs[v], NROWS / 2, false);
		overflow_case(kind, vecs[v], NROWS / 3, true);
	}
}

static void test_sgd(void)
{
	overflow_all(EMB_OPTIM_SGD);
}

static void test_adagrad(void)
{
	overflow_all(EMB_OPTIM_ADAGRAD);
}

static void test_adam(void)
{
	overflow_all(EMB_OPTIM_ADAM);
}

static void test_ftrl(void)
{
	overflow_all(EMB_OPTIM_FTRL);
}

static void test_rowwise_adagrad(void)
{
	overflow_all(EMB_OPTIM_ROWWISE_ADAGRAD);
}

/* Three pushes of 3e38 at lr 1 take a weight to -inf: the third is
 * refused and the row keeps the second's values. */
static void test_sgd_three_pushes(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t id = 42;
	float g[8], w1[8], w2[8];
	struct emb_table *t;

	o.dim = 8;
	o.optim.lr = 1.0f;
	t = table_new(&o);
	for (int i = 0; i < 8; i++)
		g[i] = BIG;
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w1, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w2, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(w1, w2, sizeof(w1)), 0);
	for (int i = 0; i < 8; i++)
		CU_ASSERT(isfinite(w2[i]));
	emb_table_destroy(t);
}

/*
 * A snapshot holding rows with an infinity in the weights or a NaN in the
 * optimizer state (as an older version wrote them, straight through the
 * writer here) loads every other row; those are left out and counted.
 */
static void test_load_sets_aside(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	char path[] = "/tmp/emb_nonfinite_XXXXXX";
	struct emb_snap_writer *w;
	struct emb_snap_result res;
	struct emb_row_meta meta[NROWS];
	struct emb_snap_meta m;
	struct emb_table *src, *dst;
	uint64_t ids[NROWS];
	float *rows, got[DIM];
	uint32_t rf;
	int fd;

	o.dim = DIM;
	o.nshards = 8;
	o.optim.kind = EMB_OPTIM_ADAM;
	src = table_new(&o);
	dst = table_new(&o);
	rf = emb_table_row_floats(src);
	rows = xcalloc((size_t)NROWS * rf, sizeof(float));
	for (uint32_t i = 0; i < NROWS; i++) {
		ids[i] = 500 + i;
		meta[i] = (struct emb_row_meta){.last_step = 1, .count = 1};
		emb_table_init_row(src, ids[i], rows + (size_t)i * rf, true);
	}
	rows[(size_t)3 * rf + 1] = -INFINITY;	 /* a weight */
	rows[(size_t)40 * rf + DIM + 2] = NAN;	 /* Adam's m */
	rows[(size_t)63 * rf + DIM + DIM + 5] = INFINITY; /* Adam's v */
	emb_snap_meta_from_table(src, &m);
	fd = mkstemp(path);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	CU_ASSERT_EQUAL_FATAL(emb_snap_writer_create(path, &m, &wo, &w), 0);
	CU_ASSERT_EQUAL(emb_snap_writer_add(w, ids, rows, meta, NROWS), 0);
	CU_ASSERT_EQUAL(emb_snap_writer_finish(w, &res), 0);
	emb_snap_writer_destroy(w);

	CU_ASSERT_EQUAL(emb_snap_load_table(path, dst), NROWS - 3);
	CU_ASSERT_EQUAL(table_stats(dst).rows, NROWS - 3);
	CU_ASSERT_EQUAL(table_stats(dst).rows_nonfinite, 3);
	for (uint32_t i = 0; i < NROWS; i++) {
		uint8_t found;
		bool bad = i == 3 || i == 40 || i == 63;

		CU_ASSERT_EQUAL(emb_table_pull(dst, &ids[i], 1, got,
					       EMB_PULL_NOCREATE, &found),
				bad ? 1 : 0);
		CU_ASSERT_EQUAL(found, !bad);
	}
	/* A set-aside id is made afresh from the initializer when used. */
	CU_ASSERT_EQUAL(emb_table_pull(dst, &ids[3], 1, got, 0, NULL), 1);
	for (uint32_t j = 0; j < DIM; j++)
		CU_ASSERT(isfinite(got[j]));
	unlink(path);
	free(rows);
	emb_table_destroy(src);
	emb_table_destroy(dst);
}

/*
 * A server's restart path: a checkpoint chain (a full link and a delta)
 * whose rows include non-finite ones loads every other row. The rows are
 * spoiled in table memory through emb_table_pull_ptrs(), as a store
 * without the push check could leave them, before each link is written.
 */
static void test_chain_load_sets_aside(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	char *root = emb_test_tmpdir();
	struct emb_chain_result full, delta;
	struct emb_chain_table ct;
	struct emb_table *t, **got = NULL;
	uint64_t ids[NROWS];
	float g[NROWS * 4], w[4];
	const float *p;
	uint32_t n = 0;
	char why[256];

	CU_ASSERT_PTR_NOT_NULL_FATAL(root);
	o.dim = 4;
	o.optim.kind = EMB_OPTIM_FTRL;
	t = table_new(&o);
	for (uint32_t i = 0; i < NROWS; i++)
		ids[i] = 9000 + i;
	for (uint32_t i = 0; i < NROWS * 4; i++)
		g[i] = 0.1f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, NROWS, g), 0);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, &ids[5], 1, &p, 0), 0);
	((float *)p)[2] = -INFINITY;
	ct = (struct emb_chain_table){.t = t, .delta = false};
	CU_ASSERT_EQUAL_FATAL(emb_chain_write(root, &ct, 1, 0, 0, &full), 0);
	/* The delta: one more row changed and spoiled (its z). */
	CU_ASSERT_EQUAL(emb_table_push(t, &ids[9], 1, g), 0);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, &ids[9], 1, &p, 0), 0);
	((float *)p)[4 + 1] = NAN;
	ct.delta = true;
	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_write(root, &ct, 1, full.id, full.id, &delta), 0);

	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_load_newest(root, &got, &n, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(table_stats(got[0]).rows, NROWS - 2);
	CU_ASSERT_EQUAL(table_stats(got[0]).rows_nonfinite, 2);
	for (uint32_t i = 0; i < NROWS; i++) {
		uint8_t found;

		emb_table_pull(got[0], &ids[i], 1, w, EMB_PULL_NOCREATE,
			       &found);
		CU_ASSERT_EQUAL(found, i != 5 && i != 9);
	}
	emb_table_destroy(got[0]);
	free(got);
	emb_table_destroy(t);
	emb_test_rmtree(root);
	CU_ASSERT_EQUAL(access(root, F_OK), -1); /* links and all */
	free(root);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"sgd: an overflowing push is refused whole", test_sgd},
	    {"adagrad: an overflowing push is refused whole", test_adagrad},
	    {"adam: an overflowing push is refused whole", test_adam},
	    {"ftrl: an overflowing push is refused whole", test_ftrl},
	    {"rowwise_adagrad: an overflowing push is refused whole",
	     test_rowwise_adagrad},
	    {"sgd: repeated huge pushes never make a row infinite",
	     test_sgd_three_pushes},
	    {"a snapshot's non-finite rows are set aside, the rest load",
	     test_load_sets_aside},
	    {"a checkpoint chain's non-finite rows are set aside",
	     test_chain_load_sets_aside},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/nonfinite", cases);
}
