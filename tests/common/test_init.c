/*
 * tests/common/test_init.c - row initializers: values, distributions and
 * determinism from (seed, id). Statistical checks use wide rows over many ids
 * and bounds of a few standard errors, with fixed seeds so a run never
 * flakes. Single-threaded.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "common/err.h"
#include "common/init.h"

#define WIDE  4096u
#define NROWS 64u

static float *row_alloc(uint32_t dim)
{
	float *w = malloc((dim + 1) * sizeof(*w));

	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	return w;
}

static void test_zeros_constant(void)
{
	struct emb_init_cfg z = {.kind = EMB_INIT_ZEROS};
	struct emb_init_cfg k = {.kind = EMB_INIT_CONSTANT, .a = -1.25f};
	float *w = row_alloc(65);

	for (uint32_t i = 0; i < 66; i++)
		w[i] = 9.0f;
	emb_init_row(&z, 1, 42, w, 65);
	for (uint32_t i = 0; i < 65; i++)
		CU_ASSERT_EQUAL(w[i], 0.0f);
	/* Only dim floats are written. */
	CU_ASSERT_EQUAL(w[65], 9.0f);

	emb_init_row(&k, 1, 42, w, 65);
	for (uint32_t i = 0; i < 65; i++)
		CU_ASSERT_EQUAL(w[i], -1.25f);
	CU_ASSERT_EQUAL(w[65], 9.0f);
	free(w);
}

/* Mean and standard deviation of n samples, accumulated in double. */
struct moments {
	double sum;
	double sumsq;
	uint64_t n;
};

static void moments_add(struct moments *m, const float *w, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++) {
		m->sum += w[i];
		m->sumsq += (double)w[i] * w[i];
	}
	m->n += dim;
}

static double moments_mean(const struct moments *m)
{
	return m->sum / (double)m->n;
}

static double moments_std(const struct moments *m)
{
	double mean = moments_mean(m);

	return sqrt(m->sumsq / (double)m->n - mean * mean);
}

static void test_uniform_range_and_moments(void)
{
	struct emb_init_cfg c = {
	    .kind = EMB_INIT_UNIFORM, .a = -0.5f, .b = 1.5f};
	float *w = row_alloc(WIDE);
	struct moments m = {0};
	double mean_want = 0.5, std_want = 2.0 / sqrt(12.0), se;
	int out_of_range = 0;

	for (uint64_t id = 0; id < NROWS; id++) {
		emb_init_row(&c, 7, id, w, WIDE);
		for (uint32_t i = 0; i < WIDE; i++)
			out_of_range += !(w[i] >= c.a && w[i] < c.b);
		moments_add(&m, w, WIDE);
	}
	CU_ASSERT_EQUAL(out_of_range, 0);
	se = std_want / sqrt((double)m.n);
	CU_ASSERT(fabs(moments_mean(&m) - mean_want) < 5 * se);
	/* The sample std of a uniform has standard error about
	 * std * sqrt(0.8 / (4n)) (kurtosis 1.8). */
	se = std_want * sqrt(0.8 / (4.0 * (double)m.n));
	CU_ASSERT(fabs(moments_std(&m) - std_want) < 5 * se);
	free(w);
}

/*
 * [a, b) excludes b. a + (b - a) * u with u just below 1 can round to b in
 * float; over [1, 1 + 3 ulp) every u above 5/6 does, so many elements must
 * take the float just under b instead.
 */
static void test_uniform_excludes_b(void)
{
	struct emb_init_cfg c = {
	    .kind = EMB_INIT_UNIFORM, .a = 1.0f, .b = 1.0f + 0x3p-23f};
	float *w = row_alloc(WIDE);
	uint32_t hits = 0, below_b = 0;

	for (uint64_t id = 0; id < 64; id++) {
		emb_init_row(&c, 0, id, w, WIDE);
		for (uint32_t i = 0; i < WIDE; i++) {
			hits += !(w[i] >= c.a && w[i] < c.b);
			below_b += w[i] == 1.0f + 0x2p-23f;
		}
	}
	CU_ASSERT_EQUAL(hits, 0);
	CU_ASSERT(below_b > 64 * WIDE / 6);
	free(w);
}

/*
 * The values themselves: a table created before and after a change of the
 * generator would start differently, so a change must be deliberate (and
 * said in docs/store.md). Uniform is exact IEEE float arithmetic; normal
 * also goes through libm's logf/cosf/sinf, so it is checked to 1e-6.
 */
static void test_pinned_values(void)
{
	static const float uni[5] = {0x1.a88644p-6f, 0x1.6b94p-8f,
				     -0x1.2b6adap-5f, -0x1.002168p-6f,
				     0x1.81af96p-5f};
	static const float nrm[5] = {-0x1.95f5cap+0f, -0x1.27108ap-1f,
				     -0x1.318d3ap-2f, 0x1.c9c938p-2f,
				     -0x1.5324dep+1f};
	struct emb_init_cfg u = EMB_INIT_CFG_DEFAULT;
	struct emb_init_cfg n = {.kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 1.0f};
	float w[5];

	/* Elements 16..20 of a 40-wide row: past the first SIMD step, as
	 * the scalar generator made them before there was one. */
	static const float uni16[5] = {-0x1.017044p-5f, 0x1.3f16eep-5f,
				       0x1.f24088p-7f, 0x1.02286ep-5f,
				       0x1.17c71ap-5f};
	float wide[40];

	emb_init_row(&u, 1, 42, w, 5);
	CU_ASSERT_EQUAL(memcmp(w, uni, sizeof(w)), 0);
	emb_init_row(&u, 1, 42, wide, 40);
	CU_ASSERT_EQUAL(memcmp(wide, uni, sizeof(uni)), 0);
	CU_ASSERT_EQUAL(memcmp(wide + 16, uni16, sizeof(uni16)), 0);
	emb_init_row(&n, 1, 42, w, 5);
	for (uint32_t i = 0; i < 5; i++)
		CU_ASSERT(fabsf(w[i] - nrm[i]) <=
			  1e-6f * (1.0f + fabsf(nrm[i])));
}

static void test_normal_moments(void)
{
	struct emb_init_cfg c = {
	    .kind = EMB_INIT_NORMAL, .a = 0.25f, .b = 0.1f};
	float *w = row_alloc(WIDE);
	struct moments m = {0};
	uint64_t within_1sd = 0;
	double se, frac, frac_se;

	for (uint64_t id = 0; id < NROWS; id++) {
		emb_init_row(&c, 11, id, w, WIDE);
		for (uint32_t i = 0; i < WIDE; i++) {
			CU_ASSERT_FATAL(isfinite(w[i]));
			within_1sd += fabs(w[i] - c.a) < c.b;
		}
		moments_add(&m, w, WIDE);
	}
	se = c.b / sqrt((double)m.n);
	CU_ASSERT(fabs(moments_mean(&m) - c.a) < 5 * se);
	/* Standard error of a normal sample's std: std / sqrt(2n). */
	se = c.b / sqrt(2.0 * (double)m.n);
	CU_ASSERT(fabs(moments_std(&m) - c.b) < 5 * se);
	/* Shape, not just moments: 68.27% within one sd. */
	frac = (double)within_1sd / (double)m.n;
	frac_se = sqrt(0.6827 * 0.3173 / (double)m.n);
	CU_ASSERT(fabs(frac - 0.6827) < 5 * frac_se);
	free(w);
}

/* Odd dims take the last value of a pair; it is still a normal draw. */
static void test_normal_odd_dim(void)
{
	struct emb_init_cfg c = {.kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 1.0f};
	float w[8];
	struct moments m = {0};

	for (uint64_t id = 0; id < 20000; id++) {
		w[7] = NAN;
		emb_init_row(&c, 3, id, w, 7);
		CU_ASSERT_FATAL(isfinite(w[6]));
		/* Nothing past dim is written. */
		CU_ASSERT_FATAL(isnan(w[7]));
		moments_add(&m, &w[6], 1);
	}
	CU_ASSERT(fabs(moments_mean(&m)) < 5 / sqrt((double)m.n));
	CU_ASSERT(fabs(moments_std(&m) - 1.0) < 5 / sqrt(2.0 * (double)m.n));
}

static void test_normal_zero_std(void)
{
	struct emb_init_cfg c = {.kind = EMB_INIT_NORMAL, .a = 3.0f, .b = 0.0f};
	float w[9];

	CU_ASSERT_EQUAL(emb_init_validate(&c), 0);
	emb_init_row(&c, 3, 99, w, 9);
	for (uint32_t i = 0; i < 9; i++)
		CU_ASSERT_EQUAL(w[i], 3.0f);
}

static void test_determinism(void)
{
	static const struct emb_init_cfg cfgs[] = {
	    {.kind = EMB_INIT_UNIFORM, .a = -1.0f, .b = 1.0f},
	    {.kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 1.0f},
	};
	float *a = row_alloc(64), *b = row_alloc(64);

	for (size_t k = 0; k < 2; k++) {
		const struct emb_init_cfg *c = &cfgs[k];

		emb_init_row(c, 5, 1234, a, 64);
		emb_init_row(c, 5, 1234, b, 64);
		CU_ASSERT_EQUAL(memcmp(a, b, 64 * sizeof(*a)), 0);
		/* Another seed, another id: different rows. */
		emb_init_row(c, 6, 1234, b, 64);
		CU_ASSERT_NOT_EQUAL(memcmp(a, b, 64 * sizeof(*a)), 0);
		emb_init_row(c, 5, 1235, b, 64);
		CU_ASSERT_NOT_EQUAL(memcmp(a, b, 64 * sizeof(*a)), 0);
		/* Seed and id do not commute into the same stream. */
		emb_init_row(c, 1234, 5, b, 64);
		CU_ASSERT_NOT_EQUAL(memcmp(a, b, 64 * sizeof(*a)), 0);
		/* Element j is the j-th draw: a shorter row is a prefix. */
		emb_init_row(c, 5, 1234, b, 6);
		CU_ASSERT_EQUAL(memcmp(a, b, 6 * sizeof(*a)), 0);
	}
	free(a);
	free(b);
}

/*
 * emb_init_row() (SIMD where the CPU has it) gives exactly the reference
 * generator's values: every dim from 1 to 130 (the SIMD steps, their
 * tails, rows shorter than one step), many ids and seeds, and ranges
 * where rounding lands on b (the select to the float under b). A
 * difference would give a backup another row than its primary.
 */
static void test_simd_matches_reference(void)
{
	static const struct emb_init_cfg cfgs[] = {
	    {.kind = EMB_INIT_UNIFORM, .a = -0.05f, .b = 0.05f},
	    {.kind = EMB_INIT_UNIFORM, .a = -1.0f, .b = 1.0f},
	    {.kind = EMB_INIT_UNIFORM, .a = 1.0f, .b = 1.0000002f},
	    {.kind = EMB_INIT_UNIFORM, .a = -EMB_INIT_PARAM_MAX, .b = 3.0f},
	    {.kind = EMB_INIT_NORMAL, .a = 0.5f, .b = 2.0f},
	    {.kind = EMB_INIT_CONSTANT, .a = 7.0f},
	};
	float *a = row_alloc(130), *b = row_alloc(130);
	uint32_t bad = 0;

	for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++)
		for (uint32_t dim = 1; dim <= 130; dim++)
			for (uint64_t id = 0; id < 40; id++) {
				uint64_t big = id * 0x9e3779b97f4a7c15ull;
				uint64_t seed = id % 3;

				memset(a, 0xa5, 130 * sizeof(*a));
				memset(b, 0x5a, 130 * sizeof(*b));
				emb_init_row(&cfgs[k], seed, big, a, dim);
				emb_init_row_ref(&cfgs[k], seed, big, b, dim);
				if (memcmp(a, b, dim * sizeof(*a)))
					bad++;
			}
	CU_ASSERT_EQUAL(bad, 0);
	free(a);
	free(b);
}

/* Neighbouring ids (and seeds) must not give correlated rows. */
static void test_neighbour_ids_uncorrelated(void)
{
	struct emb_init_cfg c = {
	    .kind = EMB_INIT_UNIFORM, .a = -1.0f, .b = 1.0f};
	float a[256], b[256];
	double dot = 0, na = 0, nb = 0, r;

	for (uint64_t id = 0; id < 256; id++) {
		emb_init_row(&c, 0, id, a, 256);
		emb_init_row(&c, 0, id + 1, b, 256);
		for (uint32_t i = 0; i < 256; i++) {
			dot += (double)a[i] * b[i];
			na += (double)a[i] * a[i];
			nb += (double)b[i] * b[i];
		}
	}
	r = dot / sqrt(na * nb);
	/* 65536 pairs: the correlation's standard error is 1/256. */
	CU_ASSERT(fabs(r) < 5.0 / 256.0);
}

static void test_validate(void)
{
	struct emb_init_cfg c;

	CU_ASSERT_EQUAL(emb_init_validate(NULL), EMB_EBADARG);
	c = (struct emb_init_cfg){.kind = 0};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_NORMAL + 1};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_ZEROS};
	CU_ASSERT_EQUAL(emb_init_validate(&c), 0);
	c = (struct emb_init_cfg){.kind = EMB_INIT_CONSTANT, .a = NAN};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_CONSTANT, .a = -2};
	CU_ASSERT_EQUAL(emb_init_validate(&c), 0);
	c = (struct emb_init_cfg){.kind = EMB_INIT_UNIFORM, .a = 1, .b = 1};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_UNIFORM, .a = 1, .b = 0};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){
	    .kind = EMB_INIT_UNIFORM, .a = 0, .b = INFINITY};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_NORMAL, .a = 0, .b = -0.1f};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_NORMAL, .a = NAN, .b = 1};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
}

static void test_parse(void)
{
	struct emb_init_cfg c;

	CU_ASSERT_EQUAL_FATAL(emb_init_parse("zeros", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_INIT_ZEROS);
	CU_ASSERT_EQUAL_FATAL(emb_init_parse("constant:0.5", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_INIT_CONSTANT);
	CU_ASSERT_EQUAL(c.a, 0.5f);
	CU_ASSERT_EQUAL_FATAL(emb_init_parse("uniform:-0.1,0.2", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_INIT_UNIFORM);
	CU_ASSERT_EQUAL(c.a, -0.1f);
	CU_ASSERT_EQUAL(c.b, 0.2f);
	CU_ASSERT_EQUAL_FATAL(emb_init_parse("normal:1,0.01", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_INIT_NORMAL);
	CU_ASSERT_EQUAL(c.a, 1.0f);
	CU_ASSERT_EQUAL(c.b, 0.01f);
}

static void test_parse_rejects(void)
{
	static const char *const bad[] = {
	    "",
	    "zero",
	    "zeros:1",
	    "constant",
	    "constant:",
	    "constant:x",
	    "constant:1,2",
	    "uniform",
	    "uniform:1",
	    "uniform:1,0",
	    "uniform:0,1,2",
	    "uniform:a,b",
	    "normal:0,-1",
	    "normal:0",
	    "gauss:0,1",
	    "uniform:0,1x",
	};
	struct emb_init_cfg c = {.kind = EMB_INIT_CONSTANT, .a = 4.0f};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = emb_init_parse(bad[i], &c);

		if (rc != EMB_EBADINIT)
			fprintf(stderr, "\n    \"%s\": expected %d got %d",
				bad[i], EMB_EBADINIT, rc);
		CU_ASSERT_EQUAL(rc, EMB_EBADINIT);
		CU_ASSERT_EQUAL(c.kind, EMB_INIT_CONSTANT);
		CU_ASSERT_EQUAL(c.a, 4.0f);
	}
	CU_ASSERT_EQUAL(emb_init_parse(NULL, &c), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_init_parse("zeros", NULL), EMB_EBADARG);
}

static void test_name(void)
{
	CU_ASSERT_STRING_EQUAL(emb_init_name(EMB_INIT_ZEROS), "zeros");
	CU_ASSERT_STRING_EQUAL(emb_init_name(EMB_INIT_CONSTANT), "constant");
	CU_ASSERT_STRING_EQUAL(emb_init_name(EMB_INIT_UNIFORM), "uniform");
	CU_ASSERT_STRING_EQUAL(emb_init_name(EMB_INIT_NORMAL), "normal");
	CU_ASSERT_STRING_EQUAL(emb_init_name(0), "?");
}

/* Values whose rows would overflow (or hold 3e38) are refused. */
static void test_absurd_params(void)
{
	struct emb_init_cfg c = {.kind = EMB_INIT_CONSTANT, .a = 3e38f};

	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c.a = EMB_INIT_PARAM_MAX;
	CU_ASSERT_EQUAL(emb_init_validate(&c), 0);
	c = (struct emb_init_cfg){.kind = EMB_INIT_UNIFORM, .a = -3e38f,
				  .b = 3e38f};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
	c = (struct emb_init_cfg){.kind = EMB_INIT_NORMAL, .a = 0.0f,
				  .b = 1e20f};
	CU_ASSERT_EQUAL(emb_init_validate(&c), EMB_EBADINIT);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"absurd parameters are refused", test_absurd_params},
	    {"zeros and constant fill exactly dim floats", test_zeros_constant},
	    {"uniform stays in [a, b) with the right moments",
	     test_uniform_range_and_moments},
	    {"uniform never returns b", test_uniform_excludes_b},
	    {"rows have the pinned values of seed 1, id 42",
	     test_pinned_values},
	    {"normal has the configured mean and std", test_normal_moments},
	    {"normal with odd dim fills the last element", test_normal_odd_dim},
	    {"normal with std 0 is the mean", test_normal_zero_std},
	    {"same seed and id give the same row, others differ",
	     test_determinism},
	    {"SIMD rows are bit-identical to the reference generator",
	     test_simd_matches_reference},
	    {"neighbouring ids are uncorrelated",
	     test_neighbour_ids_uncorrelated},
	    {"validate rejects each bad config", test_validate},
	    {"parses each kind", test_parse},
	    {"parse rejects malformed strings and keeps output",
	     test_parse_rejects},
	    {"names each kind", test_name},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/init", cases);
}
