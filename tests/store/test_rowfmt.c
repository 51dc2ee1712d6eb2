/*
 * tests/store/test_rowfmt.c - tables whose weights are kept in fp16, bf16
 * or int8 (common/rowfmt.h): what a row costs, what pulls give, that a
 * push is the fp32 optimizer rounded the documented way, that two tables
 * fed alike hold the same bits (what keeps replicas identical), and that
 * nothing out of a format's range is ever stored.
 */
#include <math.h>

#include "store_test.h"

#include "common/optim.h"
#include "common/rowfmt.h"

#define DIM 64u

static struct emb_table_opts opts_of(uint32_t fmt, uint32_t kind)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.name = "compact";
	o.dim = DIM;
	o.row_format = fmt;
	o.optim.kind = kind;
	o.optim.lr = 0.05f;
	o.seed = 7;
	o.nshards = 4;
	return o;
}

static void test_sizes(void)
{
	static const struct {
		uint32_t fmt, kind, words, rec;
	} want[] = {
	    /* 16-byte header + words, rounded up to 8 bytes */
	    {EMB_ROWFMT_FP32, EMB_OPTIM_SGD, 64, 272},
	    {EMB_ROWFMT_FP16, EMB_OPTIM_SGD, 32, 144},
	    {EMB_ROWFMT_BF16, EMB_OPTIM_SGD, 32, 144},
	    {EMB_ROWFMT_INT8, EMB_OPTIM_SGD, 18, 88},
	    {EMB_ROWFMT_FP16, EMB_OPTIM_ADAGRAD, 96, 400},
	    {EMB_ROWFMT_INT8, EMB_OPTIM_ADAM, 18 + 129, 608},
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct emb_table_opts o = opts_of(want[i].fmt, want[i].kind);
		struct emb_table *t = table_new(&o);
		uint64_t id = 1;
		float w[DIM];

		CU_ASSERT_EQUAL(emb_table_row_format(t), want[i].fmt);
		CU_ASSERT_EQUAL(emb_table_row_floats(t), want[i].words);
		CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w, 0, NULL), 1);
		CU_ASSERT_EQUAL(table_stats(t).row_bytes, want[i].rec);
		emb_table_destroy(t);
	}
}

static void test_bad_format(void)
{
	struct emb_table_opts o = opts_of(EMB_ROWFMT_COUNT, EMB_OPTIM_SGD);
	struct emb_table *t = NULL;

	CU_ASSERT_EQUAL(emb_table_create(&o, &t), EMB_EBADFORMAT);
	o = opts_of(EMB_ROWFMT_FP16, EMB_OPTIM_SGD);
	o.rounding = 2;
	CU_ASSERT_EQUAL(emb_table_create(&o, &t), EMB_EBADFORMAT);
	CU_ASSERT_PTR_NULL(t);
}

/* A new row: the initializer's values rounded to nearest, and pull's
 * fp32 is the decode of what pull_raw hands out. */
static void test_new_rows(void)
{
	for (uint32_t fmt = EMB_ROWFMT_FP16; fmt < EMB_ROWFMT_COUNT; fmt++) {
		struct emb_table_opts o = opts_of(fmt, EMB_OPTIM_ADAGRAD);
		struct emb_table *t = table_new(&o);
		uint64_t ids[3] = {11, 12, 11};
		float got[3 * DIM], init[DIM], dec[DIM];
		uint32_t raw[3 * DIM], enc[DIM];
		int bad = 0;

		CU_ASSERT_EQUAL(emb_table_pull(t, ids, 3, got, 0, NULL), 2);
		CU_ASSERT_EQUAL(emb_table_pull_raw(t, ids, 3, raw, 0, NULL), 0);
		for (uint32_t i = 0; i < 3; i++) {
			const uint32_t ww = emb_table_weight_words(t);

			emb_init_row(&o.init, o.seed, ids[i], init, DIM);
			CU_ASSERT_FATAL(emb_rowfmt_encode(fmt, init, enc, DIM,
							  EMB_ROUND_NEAREST,
							  0));
			CU_ASSERT(memcmp(raw + i * ww, enc, ww * 4) == 0);
			emb_rowfmt_decode(fmt, enc, dec, DIM);
			expect_floats("pull", ids[i], got + i * DIM, dec, DIM,
				      &bad);
			emb_table_init_row(t, ids[i], init, false);
			expect_floats("init_row", ids[i], init, dec, DIM,
				      &bad);
		}
		CU_ASSERT_EQUAL(bad, 0);
		emb_table_destroy(t);
	}
}

/*
 * Each push is the fp32 optimizer over the decoded row, rounded back
 * stochastically with the key of (seed, id, the row's access count
 * after the push counted itself): the row's creation by its first push
 * counts 1 and the push 1 more, as if a pull had made it.
 */
static void test_push_reference(void)
{
	const uint32_t kinds[] = {EMB_OPTIM_SGD, EMB_OPTIM_ADAGRAD,
				  EMB_OPTIM_ADAM, EMB_OPTIM_FTRL};

	for (uint32_t fmt = EMB_ROWFMT_FP16; fmt < EMB_ROWFMT_COUNT; fmt++)
		for (size_t k = 0; k < 4; k++) {
			struct emb_table_opts o = opts_of(fmt, kinds[k]);
			struct emb_table *t = table_new(&o);
			const uint32_t rf = emb_table_row_floats(t);
			const uint32_t ww = emb_table_weight_words(t);
			uint32_t *ref = xcalloc(rf, 4), *got = xcalloc(rf, 4);
			float *row = xcalloc(DIM + rf, sizeof(float));
			uint64_t id = 99, st = fmt * 10 + k, gid;
			float g[DIM];
			struct emb_row_meta m;
			struct emb_table_iter *it;

			emb_table_init_row(t, id, (float *)ref, true);
			for (uint32_t step = 1; step <= 5; step++) {
				for (uint32_t j = 0; j < DIM; j++)
					g[j] = (float)rnd_below(&st, 2001) /
						   1000.0f -
					       1.0f;
				CU_ASSERT_EQUAL_FATAL(
				    emb_table_push(t, &id, 1, g), 0);
				/* The reference: decode, apply, round. */
				emb_rowfmt_decode(fmt, ref, row, DIM);
				memcpy(row + DIM, ref + ww, (rf - ww) * 4);
				CU_ASSERT_FATAL(emb_optim_apply_row(
				    &o.optim, row, g, DIM));
				CU_ASSERT_FATAL(emb_rowfmt_encode(
				    fmt, row, ref, DIM, EMB_ROUND_STOCHASTIC,
				    emb_rowfmt_sr_key(o.seed, id, step + 1)));
				memcpy(ref + ww, row + DIM, (rf - ww) * 4);
			}
			CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
			CU_ASSERT_EQUAL(emb_table_iter_next(it, &gid,
							    (float *)got, &m, 1),
					1);
			emb_table_iter_destroy(it);
			CU_ASSERT_EQUAL(gid, id);
			CU_ASSERT_EQUAL(m.count, 6);
			if (memcmp(got, ref, (size_t)rf * 4) != 0)
				fprintf(stderr, "\n    %s/%s: row differs",
					emb_rowfmt_name(fmt),
					emb_optim_name(kinds[k]));
			CU_ASSERT(memcmp(got, ref, (size_t)rf * 4) == 0);
			free(ref);
			free(got);
			free(row);
			emb_table_destroy(t);
		}
}

/* Copies every full row of a into fresh arrays, sorted by id. */
static uint32_t dump_rows(struct emb_table *a, uint64_t *ids, uint32_t *rows,
			  uint32_t max)
{
	struct emb_table_iter *it;
	const uint32_t rf = emb_table_row_floats(a);
	uint32_t n = 0;
	int got;

	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
	while ((got = emb_table_iter_next(it, ids + n, (float *)rows + n * rf,
					  NULL, max - n)) > 0)
		n += (uint32_t)got;
	emb_table_iter_destroy(it);
	/* Insertion sort: a few hundred rows. */
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
			uint64_t x = ids[j];
			uint32_t tmp[DIM * 3 + 1];

			ids[j] = ids[j - 1];
			ids[j - 1] = x;
			memcpy(tmp, rows + j * rf, rf * 4);
			memcpy(rows + j * rf, rows + (j - 1) * rf, rf * 4);
			memcpy(rows + (j - 1) * rf, tmp, rf * 4);
		}
	return n;
}

/*
 * Two tables given the same batches in different splits (as a primary and
 * its backup may be) end bit-identical: the rounding depends on seed, id
 * and each row's own update count, not on batches or the table's clock.
 * Then a copy made by iterating one and assigning with state into a third
 * is bit-identical too (a recovery fill, a snapshot load).
 */
static void test_replicas_identical(void)
{
	enum { NID = 300, BATCH = 64, STEPS = 20 };

	for (uint32_t fmt = EMB_ROWFMT_FP16; fmt < EMB_ROWFMT_COUNT; fmt++) {
		struct emb_table_opts o = opts_of(fmt, EMB_OPTIM_ADAGRAD);
		struct emb_table *a = table_new(&o), *b = table_new(&o),
				 *c = table_new(&o);
		const uint32_t rf = emb_table_row_floats(a);
		uint64_t st = 42 + fmt, ids[BATCH];
		float *g = xcalloc((size_t)BATCH * DIM, sizeof(float));
		uint64_t *ia = xcalloc(NID, 8), *ib = xcalloc(NID, 8),
			 *ic = xcalloc(NID, 8);
		uint32_t *ra = xcalloc((size_t)NID * rf, 4),
			 *rb = xcalloc((size_t)NID * rf, 4),
			 *rc_ = xcalloc((size_t)NID * rf, 4);
		uint32_t na, nb, nc;

		/* a is the primary: its rows are made by pulls, which its
		 * backup b never sees; b makes them at their first push. */
		for (uint32_t i = 0; i < NID; i++) {
			uint64_t id = i;
			float w[DIM];

			CU_ASSERT_EQUAL(emb_table_pull(a, &id, 1, w, 0, NULL),
					1);
		}
		for (uint32_t s = 0; s < STEPS; s++) {
			for (uint32_t i = 0; i < BATCH; i++)
				ids[i] = rnd_below(&st, NID);
			for (uint32_t j = 0; j < BATCH * DIM; j++)
				g[j] = (float)rnd_below(&st, 2001) / 500.0f -
				       2.0f;
			CU_ASSERT_EQUAL_FATAL(emb_table_push(a, ids, BATCH, g),
					      0);
			/* b gets the same batch in two parts; a repeated id
			 * in both halves is summed in a but not in b, so b
			 * gets the half with every id's first occurrence
			 * made distinct: push ids one by one instead. */
			for (uint32_t i = 0; i < BATCH; i++) {
				float sum[DIM];
				bool first = true;

				for (uint32_t q = 0; q < i; q++)
					first &= ids[q] != ids[i];
				if (!first)
					continue;
				memset(sum, 0, sizeof(sum));
				for (uint32_t q = i; q < BATCH; q++)
					if (ids[q] == ids[i])
						for (uint32_t j = 0; j < DIM;
						     j++)
							sum[j] +=
							    g[q * DIM + j];
				CU_ASSERT_EQUAL_FATAL(
				    emb_table_push(b, &ids[i], 1, sum), 0);
			}
		}
		na = dump_rows(a, ia, ra, NID);
		nb = dump_rows(b, ib, rb, NID);
		/* Ids never pushed are on a only. */
		CU_ASSERT_EQUAL(na, NID);
		CU_ASSERT(nb > NID * 9 / 10);
		for (uint32_t i = 0, j = 0; i < na && j < nb; i++) {
			if (ia[i] != ib[j])
				continue;
			CU_ASSERT(memcmp(ra + (size_t)i * rf,
					 rb + (size_t)j * rf, rf * 4) == 0);
			j++;
		}
		CU_ASSERT_EQUAL(emb_table_assign(c, ia, na, (float *)ra, true,
						 NULL),
				0);
		nc = dump_rows(c, ic, rc_, NID);
		CU_ASSERT_EQUAL(nc, na);
		CU_ASSERT(memcmp(rc_, ra, (size_t)na * rf * 4) == 0);
		free(g);
		free(ia);
		free(ib);
		free(ic);
		free(ra);
		free(rb);
		free(rc_);
		emb_table_destroy(a);
		emb_table_destroy(b);
		emb_table_destroy(c);
	}
}

/*
 * Updates smaller than half a unit in the last place: rounding to nearest
 * loses every one (the row never moves); stochastic rounding keeps their
 * sum on average, which is why it is the default.
 */
static void test_small_updates(void)
{
	float w[2];

	for (uint32_t r = 0; r < 2; r++) {
		struct emb_table_opts o = opts_of(EMB_ROWFMT_FP16, EMB_OPTIM_SGD);
		struct emb_table *t;
		uint64_t id = 5;
		float g[DIM];

		o.init.kind = EMB_INIT_CONSTANT;
		o.init.a = 1.0f;
		o.optim.lr = 1.0f;
		o.rounding = r ? EMB_ROUND_NEAREST : EMB_ROUND_STOCHASTIC;
		t = table_new(&o);
		/* fp16's step at 1.0 is 2^-10 = 0.000977: 0.0001 is a tenth
		 * of it. 1000 updates add 0.1. */
		for (uint32_t j = 0; j < DIM; j++)
			g[j] = -0.0001f;
		for (uint32_t s = 0; s < 1000; s++)
			CU_ASSERT_EQUAL_FATAL(emb_table_push(t, &id, 1, g), 0);
		{
			float out[DIM];
			double mean = 0;

			CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, out, 0, NULL),
					0);
			for (uint32_t j = 0; j < DIM; j++)
				mean += out[j];
			w[r] = (float)(mean / DIM);
		}
		emb_table_destroy(t);
	}
	CU_ASSERT_EQUAL(w[1], 1.0f);
	/* The mean of 64 weights, each a sum of 1000 unbiased roundings. */
	CU_ASSERT(fabsf(w[0] - 1.1f) < 0.01f);
	if (fabsf(w[0] - 1.1f) >= 0.01f)
		fprintf(stderr, "\n    stochastic: %.6f", (double)w[0]);
}

/* Nothing out of range is stored: a push that would take an fp16 weight
 * past 65504, an assign of such a weight, and whole rows holding an Inf,
 * a NaN or an int8 row's infinite scale are refused whole. */
static void test_out_of_range(void)
{
	struct emb_table_opts o = opts_of(EMB_ROWFMT_FP16, EMB_OPTIM_SGD);
	struct emb_table *t;
	uint64_t ids[2] = {1, 2};
	float g[2 * DIM], before[2 * DIM], after[2 * DIM];
	uint32_t raw[DIM];

	o.optim.lr = 1.0f;
	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 2, before, 0, NULL), 2);
	memset(g, 0, sizeof(g));
	g[DIM + 3] = -70000.0f; /* id 2's weight 3 would pass 65504 */
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 2, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_nonfinite_id(), 2);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 2, after, 0, NULL), 0);
	CU_ASSERT(memcmp(before, after, sizeof(before)) == 0);

	g[DIM + 3] = 65520.0f; /* rounds to Inf in fp16 */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 2, g, false, NULL),
			EMB_ENONFINITE);
	g[DIM + 3] = 65504.0f; /* the largest finite: fine */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 2, g, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, &ids[1], 1, after, 0, NULL), 0);
	CU_ASSERT_EQUAL(after[3], 65504.0f);

	/* A whole row with fp16 +Inf (0x7c00) in weight 0. */
	memset(raw, 0, sizeof(raw));
	raw[0] = 0x7c00u;
	CU_ASSERT_FALSE(emb_table_row_finite(t, (const float *)raw));
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 1, (float *)raw, true, NULL),
			EMB_ENONFINITE);
	raw[0] = 0x7e00u; /* NaN */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 1, (float *)raw, true, NULL),
			EMB_ENONFINITE);
	emb_table_destroy(t);

	o = opts_of(EMB_ROWFMT_INT8, EMB_OPTIM_SGD);
	t = table_new(&o);
	memset(raw, 0, sizeof(raw));
	{
		float inf = INFINITY;

		memcpy(&raw[0], &inf, 4); /* the scale */
	}
	CU_ASSERT_FALSE(emb_table_row_finite(t, (const float *)raw));
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 1, (float *)raw, true, NULL),
			EMB_ENONFINITE);
	{
		float big = 3e38f, one = 255.0f;

		/* Finite scale and bias whose weights overflow. */
		memcpy(&raw[0], &big, 4);
		memcpy(&raw[1], &big, 4);
		raw[2] = 0xffu;
		(void)one;
	}
	CU_ASSERT_FALSE(emb_table_row_finite(t, (const float *)raw));
	CU_ASSERT_EQUAL(table_stats(t).rows, 0);
	emb_table_destroy(t);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a compact row's words and record bytes", test_sizes},
	    {"an unknown row format or rounding is refused", test_bad_format},
	    {"new rows are the initializer rounded to nearest",
	     test_new_rows},
	    {"a push is the fp32 optimizer, rounded with the row's key",
	     test_push_reference},
	    {"tables fed alike hold the same bits; assign copies them",
	     test_replicas_identical},
	    {"stochastic rounding keeps updates under half an ulp",
	     test_small_updates},
	    {"values out of the format's range are never stored",
	     test_out_of_range},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/rowfmt", cases);
}
