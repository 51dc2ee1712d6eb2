/*
 * tests/common/test_rowfmt.c - the row formats' conversions against slow
 * references written here in double arithmetic: every fp16 and bf16
 * pattern, ties, subnormals, the range's ends and refusals; int8 error
 * bounds; stochastic rounding's determinism, targets and bias; and every
 * vector body (emb__rowfmt_vec_max 64, 32, 0) bit for bit against the
 * scalar one. Single-threaded.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "common/err.h"
#include "common/rowfmt.h"

static const unsigned widths[] = {64, 32, 0};
#define NWIDTHS (sizeof(widths) / sizeof(widths[0]))

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* xorshift64*: a fixed stream, so every run tests the same values. */
static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* The value of fp16 pattern p (sign included); Inf and NaN as such. */
static double ref_fp16_val(uint16_t p)
{
	int e = (p >> 10) & 0x1f;
	int m = p & 0x3ff;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return (p & 0x8000) ? -v : v;
}

static double ref_bf16_val(uint16_t p)
{
	return u2f((uint32_t)p << 16);
}

/*
 * Nearest-even by search: the largest positive pattern whose value is at
 * most |x|, then the nearer of it and the next (ties: the even one).
 * *ok false when |x| is beyond max_pat's value or not finite.
 */
static uint16_t ref_encode(double (*val)(uint16_t), uint16_t max_pat, float x,
			   bool *ok)
{
	double a = fabs((double)x);
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	uint32_t lo = 0, hi = max_pat;
	double dlo, dhi;

	*ok = isfinite(a) && a <= val(max_pat);
	if (!*ok)
		return 0;
	while (lo < hi) { /* largest p with val(p) <= a */
		uint32_t mid = (lo + hi + 1) / 2;

		if (val((uint16_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	if (lo == max_pat)
		return (uint16_t)(sign | lo);
	dlo = a - val((uint16_t)lo);
	dhi = val((uint16_t)(lo + 1)) - a;
	if (dhi < dlo || (dhi == dlo && (lo & 1)))
		lo++;
	return (uint16_t)(sign | lo);
}

/* The pattern toward zero (the search above without the rounding). */
static uint16_t ref_trunc(double (*val)(uint16_t), uint16_t max_pat, float x)
{
	double a = fabs((double)x);
	uint32_t lo = 0, hi = max_pat;

	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;

		if (val((uint16_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	return (uint16_t)((signbit(x) ? 0x8000 : 0) | lo);
}

static void test_names(void)
{
	static const char *names[] = {"fp32", "fp16", "bf16", "int8"};
	static const char *alias[] = {"float32", "float16", "bfloat16"};
	uint32_t f = 99;

	for (uint32_t i = 0; i < 4; i++) {
		CU_ASSERT_STRING_EQUAL(emb_rowfmt_name(i), names[i]);
		CU_ASSERT_EQUAL(emb_rowfmt_parse(names[i], &f), 0);
		CU_ASSERT_EQUAL(f, i);
	}
	for (uint32_t i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(emb_rowfmt_parse(alias[i], &f), 0);
		CU_ASSERT_EQUAL(f, i);
	}
	CU_ASSERT_STRING_EQUAL(emb_rowfmt_name(EMB_ROWFMT_COUNT), "?");
	f = 99;
	CU_ASSERT_EQUAL(emb_rowfmt_parse("fp8", &f), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_rowfmt_parse("FP16x", &f), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_rowfmt_parse("", &f), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_rowfmt_parse(NULL, &f), EMB_EBADARG);
	CU_ASSERT_EQUAL(f, 99);
	CU_ASSERT_EQUAL(emb_rowfmt_bytes(EMB_ROWFMT_INT8, 5), 13);
	CU_ASSERT_EQUAL(emb_rowfmt_words(EMB_ROWFMT_INT8, 5), 4);
	CU_ASSERT_EQUAL(emb_rowfmt_words(EMB_ROWFMT_FP16, 3), 2);
}

/* Every pattern, one at a time and as one row through each body. */
static void check_all_patterns(uint32_t f, double (*val)(uint16_t),
			       float (*one)(uint16_t))
{
	static uint16_t pat[65536];
	static float out[65536];
	uint32_t bad = 0;

	for (uint32_t p = 0; p < 65536; p++) {
		float x = one((uint16_t)p);
		double v = val((uint16_t)p);

		pat[p] = (uint16_t)p;
		if (isnan(v) && f == EMB_ROWFMT_BF16) /* the same bits */
			bad += f2u(x) != p << 16;
		else if (isnan(v)) /* made quiet, as F16C does */
			bad += !isnan(x) || !(f2u(x) & 0x400000u) ||
			       (f2u(x) >> 31) != (p >> 15) ||
			       (f2u(x) >> 13 & 0x1ffu) != (p & 0x1ffu);
		else
			bad += (double)x != v || !signbit(x) != !signbit(v);
	}
	CU_ASSERT_EQUAL(bad, 0);
	for (size_t w = 0; w < NWIDTHS; w++) {
		emb__rowfmt_vec_max = widths[w];
		emb_rowfmt_decode(f, pat, out, 65536);
		bad = 0;
		for (uint32_t p = 0; p < 65536; p++)
			bad += f2u(out[p]) != f2u(one((uint16_t)p));
		CU_ASSERT_EQUAL(bad, 0);
	}
	emb__rowfmt_vec_max = 64;
}

static void test_decode_all(void)
{
	check_all_patterns(EMB_ROWFMT_FP16, ref_fp16_val, emb_fp16_to_fp32);
	check_all_patterns(EMB_ROWFMT_BF16, ref_bf16_val, emb_bf16_to_fp32);
}

/* A float near every kind of case: ties, neighbours of ties, subnormals
 * of both formats, the range's end, random bits. */
static float interesting(double (*val)(uint16_t), uint16_t max_pat)
{
	uint16_t p = (uint16_t)(rnd() % max_pat);
	double mid = (val(p) + val((uint16_t)(p + 1))) / 2;
	float x;

	switch (rnd() % 6) {
	case 0: /* an exact tie (representable in binary32) */
		x = (float)mid;
		break;
	case 1: /* one binary32 ulp off a tie */
		x = nextafterf((float)mid, rnd() & 1 ? INFINITY : 0);
		break;
	case 2: /* a pattern's own value */
		x = (float)val(p);
		break;
	case 3: /* binary32 subnormal or tiny */
		x = u2f((uint32_t)(rnd() % 0x02000000u));
		break;
	default: /* any finite binary32 up to twice the max */
		x = (float)ldexp((double)(rnd() >> 40) / (1 << 24),
				 (int)(rnd() % 300) - 160);
		if (fabs((double)x) > 2 * val(max_pat))
			x = (float)(val(max_pat) * 2 *
				    ((double)(rnd() >> 11) /
				     9007199254740992.0));
		break;
	}
	return rnd() & 1 ? -x : x;
}

static void check_encode_nearest(uint32_t f, double (*val)(uint16_t),
				 uint16_t max_pat,
				 uint16_t (*one)(float, bool *))
{
	float fmax = (float)val(max_pat);
	float edges[] = {
	    0.0f,
	    -0.0f,
	    fmax,
	    -fmax,
	    nextafterf(fmax, 0),
	    u2f(1),
	    u2f(0x807fffffu),
	    (float)val(1),
	    (float)val(1) / 2,
	    nextafterf((float)val(1) / 2, 1),
	    (float)val(0x400),
	    (float)(val(0x3ff) + val(0x400)) / 2,
	};
	float refused[] = {nextafterf(fmax, INFINITY),
			   -nextafterf(fmax, INFINITY),
			   INFINITY,
			   -INFINITY,
			   NAN,
			   -NAN,
			   u2f(0x7f800001u),
			   FLT_MAX};
	uint32_t bad = 0;
	bool ok, rok;

	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		uint16_t h = one(edges[i], &ok);

		CU_ASSERT_TRUE(ok);
		CU_ASSERT_EQUAL(h, ref_encode(val, max_pat, edges[i], &rok));
	}
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		float row[3] = {1.0f, refused[i], 2.0f};
		uint16_t out[4];

		ok = true;
		one(refused[i], &ok);
		CU_ASSERT_FALSE(ok);
		for (size_t w = 0; w < NWIDTHS; w++) {
			emb__rowfmt_vec_max = widths[w];
			CU_ASSERT_FALSE(emb_rowfmt_encode(
			    f, row, out, 3, EMB_ROUND_NEAREST, 0));
			CU_ASSERT_FALSE(emb_rowfmt_encode(
			    f, row, out, 3, EMB_ROUND_STOCHASTIC, 7));
		}
		emb__rowfmt_vec_max = 64;
	}
	for (int i = 0; i < 400000; i++) {
		float x = interesting(val, max_pat);
		uint16_t r = ref_encode(val, max_pat, x, &rok);
		uint16_t h = one(x, &ok);

		bad += ok != rok || (ok && h != r);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_encode_nearest(void)
{
	bool ok;

	check_encode_nearest(EMB_ROWFMT_FP16, ref_fp16_val, 0x7bff,
			     emb_fp32_to_fp16);
	check_encode_nearest(EMB_ROWFMT_BF16, ref_bf16_val, 0x7f7f,
			     emb_fp32_to_bf16);
	/* fixed facts, beside the search */
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(65504.0f, &ok), 0x7bff);
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(1.0f + 0x1p-11f, &ok), 0x3c00);
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(1.0f + 3 * 0x1p-11f, &ok), 0x3c02);
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(0x1p-25f, &ok), 0x0000);
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(-3 * 0x1p-25f, &ok), 0x8002);
	CU_ASSERT_EQUAL(emb_fp32_to_fp16(0x1p-24f, &ok), 0x0001);
	CU_ASSERT_EQUAL(emb_fp32_to_bf16(1.0f + 0x1p-8f, &ok), 0x3f80);
	CU_ASSERT_EQUAL(emb_fp32_to_bf16(1.0f + 3 * 0x1p-8f, &ok), 0x3f82);
	CU_ASSERT_EQUAL(emb_fp32_to_bf16(u2f(0x7f7f7fffu), &ok), 0);
	CU_ASSERT_FALSE(ok); /* would round to the max, but is past it */
	CU_ASSERT_EQUAL(emb_fp32_to_bf16(u2f(0x00008000u), &ok), 0x0000);
	CU_ASSERT_EQUAL(emb_fp32_to_bf16(u2f(0x00018000u), &ok), 0x0002);
}

static void test_int8(void)
{
	float row[130], out[130], back[130];
	uint32_t buf[50];
	float scale;

	for (uint32_t dim = 1; dim <= 130; dim++) {
		float lo =
		    (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5) *
		    (float)ldexp(1, (int)(rnd() % 40) - 20);
		float span = (float)ldexp(1, (int)(rnd() % 40) - 20);

		for (uint32_t i = 0; i < dim; i++)
			row[i] = lo + span * (float)((double)(rnd() >> 11) /
						     9007199254740992.0);
		buf[(8 + dim + 3) / 4 - 1] = 0xdeadbeef;
		CU_ASSERT_TRUE_FATAL(emb_rowfmt_encode(
		    EMB_ROWFMT_INT8, row, buf, dim, EMB_ROUND_NEAREST, 0));
		if ((8 + dim) % 4) /* tail bytes zeroed */
			CU_ASSERT_EQUAL(((unsigned char *)buf)[8 + dim], 0);
		emb_rowfmt_decode(EMB_ROWFMT_INT8, buf, back, dim);
		memcpy(&scale, buf, sizeof(scale));
		for (uint32_t i = 0; i < dim; i++) {
			double err = fabs((double)back[i] - row[i]);
			double ulp =
			    ldexp(1, ilogbf(fabsf(row[i]) + 1e-30f) - 23);

			CU_ASSERT(err <= scale * 0.5001 + 2 * ulp);
		}
	}
	/* a constant row comes back exactly */
	for (uint32_t i = 0; i < 64; i++)
		row[i] = -3.25f;
	CU_ASSERT_TRUE(emb_rowfmt_encode(EMB_ROWFMT_INT8, row, buf, 64,
					 EMB_ROUND_NEAREST, 0));
	emb_rowfmt_decode(EMB_ROWFMT_INT8, buf, out, 64);
	CU_ASSERT_EQUAL(memcmp(row, out, 64 * sizeof(float)), 0);
	/* refusals: non-finite values, and max - min past binary32 */
	row[10] = NAN;
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_INT8, row, buf, 64,
					  EMB_ROUND_NEAREST, 0));
	row[10] = -INFINITY;
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_INT8, row, buf, 64,
					  EMB_ROUND_STOCHASTIC, 1));
	row[10] = 3e38f;
	row[11] = -3e38f;
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_INT8, row, buf, 64,
					  EMB_ROUND_NEAREST, 0));
	row[11] = 0.0f; /* 3e38 wide fits */
	CU_ASSERT_TRUE(emb_rowfmt_encode(EMB_ROWFMT_INT8, row, buf, 64,
					 EMB_ROUND_NEAREST, 0));
	/* fp32 refuses non-finite too, and bad arguments are refused */
	row[11] = INFINITY;
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_FP32, row, buf, 12,
					  EMB_ROUND_NEAREST, 0));
	CU_ASSERT_TRUE(emb_rowfmt_encode(EMB_ROWFMT_FP32, row, buf, 11,
					 EMB_ROUND_NEAREST, 0));
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_COUNT, row, buf, 4,
					  EMB_ROUND_NEAREST, 0));
	CU_ASSERT_FALSE(emb_rowfmt_encode(EMB_ROWFMT_FP16, row, buf, 4,
					  (enum emb_round)2, 0));
}

/* Decodes one value of format f's pattern p (fp16 or bf16). */
static double val_of(uint32_t f, uint16_t p)
{
	return f == EMB_ROWFMT_FP16 ? ref_fp16_val(p) : ref_bf16_val(p);
}

static void test_sr_targets(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP16, EMB_ROWFMT_BF16};
	uint16_t a[64], b[64], near[64];
	float row[64];
	uint32_t moved = 0, bad = 0;

	for (int f = 0; f < 2; f++) {
		uint32_t fmt = fmts[f];
		double (*val)(uint16_t) =
		    fmt == EMB_ROWFMT_FP16 ? ref_fp16_val : ref_bf16_val;
		uint16_t maxp = fmt == EMB_ROWFMT_FP16 ? 0x7bff : 0x7f7f;

		for (int t = 0; t < 2000; t++) {
			uint64_t key = emb_rowfmt_sr_key(5, (uint64_t)t, 1);

			for (int i = 0; i < 64; i++)
				row[i] = interesting(val, maxp);
			for (int i = 0; i < 64; i++)
				if (fabs((double)row[i]) > val(maxp))
					row[i] = (float)val(maxp);
			CU_ASSERT_TRUE_FATAL(emb_rowfmt_encode(
			    fmt, row, a, 64, EMB_ROUND_STOCHASTIC, key));
			CU_ASSERT_TRUE_FATAL(emb_rowfmt_encode(
			    fmt, row, b, 64, EMB_ROUND_STOCHASTIC, key));
			bad += memcmp(a, b, sizeof(a)) != 0; /* deterministic */
			for (int i = 0; i < 64; i++) {
				uint16_t lo = ref_trunc(val, maxp, row[i]);
				bool exact = val_of(fmt, lo) == (double)row[i];

				if (exact)
					bad += a[i] != lo;
				else
					bad += a[i] != lo && a[i] != lo + 1;
				moved += a[i] != lo;
			}
		}
		/* exactly representable rows never change */
		for (int i = 0; i < 64; i++)
			row[i] = (float)val((uint16_t)(rnd() % maxp)) *
				 (rnd() & 1 ? -1.0f : 1.0f);
		emb_rowfmt_encode(fmt, row, near, 64, EMB_ROUND_NEAREST, 0);
		CU_ASSERT_TRUE(emb_rowfmt_encode(fmt, row, a, 64,
						 EMB_ROUND_STOCHASTIC, 99));
		CU_ASSERT_EQUAL(memcmp(a, near, sizeof(a)), 0);
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT(moved > 1000); /* it does round up too */
}

static void test_sr_keys(void)
{
	uint16_t a[256], b[256];
	float row[256];
	uint32_t differ = 0;

	for (int i = 0; i < 256; i++)
		row[i] = 1.0f + (float)(i + 1) * 0x1p-20f; /* between fp16s */
	CU_ASSERT_TRUE(emb_rowfmt_encode(EMB_ROWFMT_FP16, row, a, 256,
					 EMB_ROUND_STOCHASTIC,
					 emb_rowfmt_sr_key(1, 2, 3)));
	CU_ASSERT_TRUE(emb_rowfmt_encode(EMB_ROWFMT_FP16, row, b, 256,
					 EMB_ROUND_STOCHASTIC,
					 emb_rowfmt_sr_key(1, 2, 4)));
	for (int i = 0; i < 256; i++)
		differ += a[i] != b[i];
	CU_ASSERT(differ > 40);
	/* the key mixes all three inputs */
	CU_ASSERT_NOT_EQUAL(emb_rowfmt_sr_key(1, 2, 3),
			    emb_rowfmt_sr_key(2, 2, 3));
	CU_ASSERT_NOT_EQUAL(emb_rowfmt_sr_key(1, 2, 3),
			    emb_rowfmt_sr_key(1, 3, 3));
	CU_ASSERT_NOT_EQUAL(emb_rowfmt_sr_key(0, 0, 0), 0);
	CU_ASSERT_NOT_EQUAL(emb_rowfmt_sr_key(1, 2, 3),
			    emb_rowfmt_sr_key(1, 3, 2));
}

/*
 * Unbiased: over K fixed keys the mean of each value's results is within
 * 5 standard deviations of the value (sd of the mean: gap * sqrt(p(1-p)
 * / K)). The keys are fixed, so the outcome is too.
 */
static void test_sr_unbiased(void)
{
	enum { K = 4096, DIM = 48 };
	static const uint32_t fmts[] = {EMB_ROWFMT_FP16, EMB_ROWFMT_BF16,
					EMB_ROWFMT_INT8};
	static double sum[DIM];
	uint32_t buf[DIM];
	float row[DIM], out[DIM];
	uint32_t bad = 0;

	for (int f = 0; f < 3; f++) {
		for (int i = 0; i < DIM; i++) {
			row[i] = (float)(0.1 + 0.37 * i) * (i & 1 ? -1 : 1);
			sum[i] = 0;
		}
		row[5] = 0x1p-20f; /* an fp16 subnormal's neighbourhood */
		for (int k = 0; k < K; k++) {
			CU_ASSERT_TRUE_FATAL(emb_rowfmt_encode(
			    fmts[f], row, buf, DIM, EMB_ROUND_STOCHASTIC,
			    emb_rowfmt_sr_key(77, 1234, (uint32_t)k)));
			emb_rowfmt_decode(fmts[f], buf, out, DIM);
			for (int i = 0; i < DIM; i++)
				sum[i] += out[i];
		}
		for (int i = 0; i < DIM; i++) {
			double gap, lo;

			if (fmts[f] == EMB_ROWFMT_INT8) {
				float scale;

				memcpy(&scale, buf, sizeof(scale));
				gap = scale;
			} else {
				double (*val)(uint16_t) =
				    fmts[f] == EMB_ROWFMT_FP16 ? ref_fp16_val
							       : ref_bf16_val;
				uint16_t maxp = fmts[f] == EMB_ROWFMT_FP16
						    ? 0x7bff
						    : 0x7f7f;
				uint16_t p = ref_trunc(val, maxp, row[i]);

				lo = val(p);
				gap = fabs(val((uint16_t)(p + 1)) - lo);
			}
			/* sd <= gap / 2 / sqrt(K); 5 sd, plus int8's own
			 * float error */
			bad += fabs(sum[i] / K - row[i]) >
			       5 * gap / 2 / sqrt(K) + 1e-6 * fabs(row[i]);
		}
		CU_ASSERT_EQUAL(bad, 0);
	}
	/* and nearest is biased for those (the check can fail) */
	for (int i = 0; i < DIM; i++)
		row[i] = 1.0f + 0x1p-12f; /* a quarter gap above 1 in fp16 */
	emb_rowfmt_encode(EMB_ROWFMT_FP16, row, buf, DIM, EMB_ROUND_NEAREST, 0);
	emb_rowfmt_decode(EMB_ROWFMT_FP16, buf, out, DIM);
	CU_ASSERT_EQUAL(out[0], 1.0f);
}

/* A row of dim values of every kind, a few refused with probability. */
static void random_row(float *row, uint32_t dim, bool allow_refused)
{
	for (uint32_t i = 0; i < dim; i++) {
		switch (rnd() % 5) {
		case 0:
			row[i] = interesting(ref_fp16_val, 0x7bff);
			break;
		case 1:
			row[i] = interesting(ref_bf16_val, 0x7f7f);
			break;
		case 2: /* fp16 subnormals and their ties */
			row[i] = (float)ldexp((double)(rnd() % 4096), -26) *
				 (rnd() & 1 ? -1 : 1);
			break;
		default:
			row[i] =
			    (float)((double)(rnd() >> 11) / 9007199254740992.0 -
				    0.5) *
			    4;
			break;
		}
		if (!allow_refused && fabsf(row[i]) > 65504.0f)
			row[i] = 65504.0f;
	}
	if (allow_refused && rnd() % 4 == 0)
		row[rnd() % dim] = rnd() & 1 ? NAN : 1e30f;
}

/*
 * Rows that only a careless body gets wrong: 1 then signed zeros (an int8
 * row's min must not depend on the order of a reduction: the first zero
 * a lane meets is not the row's first), values 2^-130 apart (int8's scale
 * is subnormal, 1 / scale Inf, (min - bias) * Inf NaN), and neighbours.
 */
static void special_row(float *row, uint32_t dim, int kind)
{
	for (uint32_t i = 0; i < dim; i++) {
		if (kind == 0)
			row[i] = rnd() & 1 ? -0.0f : 0.0f;
		else if (kind == 1)
			row[i] = rnd() & 1 ? 0x1p-130f : 0.0f;
		else
			row[i] = rnd() & 1 ? nextafterf(1.5f, 2) : 1.5f;
	}
	if (kind == 0)
		row[0] = 1.0f;
}

static void test_vector_bodies(void)
{
	static uint32_t want[140], got[140];
	float row[130], dwant[130], dgot[130];
	uint32_t bad = 0;

	for (int rep = 0; rep < 9; rep++) {
		for (uint32_t dim = 1; dim <= 130; dim++) {
			if (rep < 6)
				random_row(row, dim, rep >= 4);
			else
				special_row(row, dim, rep - 6);
			for (uint32_t f = 0; f < EMB_ROWFMT_COUNT; f++) {
				for (int r = 0; r < 2; r++) {
					enum emb_round round =
					    (enum emb_round)r;
					uint64_t key = rnd();
					bool okw, okg;

					emb__rowfmt_vec_max = 0;
					memset(want, 0xa5, sizeof(want));
					okw = emb_rowfmt_encode(
					    f, row, want, dim, round, key);
					if (okw)
						emb_rowfmt_decode(f, want,
								  dwant, dim);
					for (size_t w = 0; w < 2; w++) {
						emb__rowfmt_vec_max = widths[w];
						memset(got, 0x5a, sizeof(got));
						okg = emb_rowfmt_encode(
						    f, row, got, dim, round,
						    key);
						bad += okg != okw;
						if (!okw)
							continue;
						bad += memcmp(got, want,
							      emb_rowfmt_words(
								  f, dim) *
								  4) != 0;
						emb_rowfmt_decode(f, want, dgot,
								  dim);
						bad += memcmp(dgot, dwant,
							      dim * 4) != 0;
					}
				}
			}
		}
	}
	emb__rowfmt_vec_max = 64;
	CU_ASSERT_EQUAL(bad, 0);
}

/* decode_rows over rows at an odd stride equals one decode per row. */
static void test_decode_rows(void)
{
	static const uint32_t dims[] = {1, 7, 8, 16, 33, 64, 100, 128};
	enum { N = 37 };
	static unsigned char src[N * (4 * 128 + 13)];
	static float want[N * 128], got[N * 128];
	uint32_t bad = 0;

	for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
		uint32_t dim = dims[di];

		for (uint32_t f = 0; f < EMB_ROWFMT_COUNT; f++) {
			size_t bytes = emb_rowfmt_bytes(f, dim);
			size_t strides[] = {bytes, bytes + 13};

			for (int s = 0; s < 2; s++) {
				size_t stride = strides[s];

				for (uint32_t r = 0; r < N; r++) {
					float row[128];

					random_row(row, dim, false);
					CU_ASSERT_TRUE_FATAL(emb_rowfmt_encode(
					    f, row, want, dim,
					    EMB_ROUND_NEAREST, 0));
					memcpy(src + r * stride, want, bytes);
				}
				emb__rowfmt_vec_max = 0;
				for (uint32_t r = 0; r < N; r++)
					emb_rowfmt_decode(f, src + r * stride,
							  want + r * dim, dim);
				for (size_t w = 0; w < NWIDTHS; w++) {
					emb__rowfmt_vec_max = widths[w];
					memset(got, 0, sizeof(got));
					emb_rowfmt_decode_rows(f, src, stride,
							       got, dim, N);
					bad += memcmp(got, want,
						      (size_t)N * dim * 4) != 0;
				}
			}
		}
	}
	emb__rowfmt_vec_max = 64;
	CU_ASSERT_EQUAL(bad, 0);
}

/*
 * A gather of 8 MiB or more into an aligned buffer streams its stores
 * (rowfmt.c's STREAM_BYTES): the same values by another store path.
 */
static void test_decode_rows_large(void)
{
	static const uint32_t dims[] = {64, 48};
	const size_t out_bytes = (size_t)9 << 20;
	float *want = aligned_alloc(64, out_bytes);
	float *got = aligned_alloc(64, out_bytes);
	unsigned char *src = malloc(out_bytes);
	uint32_t bad = 0;

	CU_ASSERT_FATAL(want && got && src);
	for (size_t i = 0; i < out_bytes; i++)
		src[i] = (unsigned char)rnd();
	for (size_t di = 0; di < 2; di++) {
		uint32_t dim = dims[di];
		uint32_t n = (uint32_t)(out_bytes / 4 / dim);

		for (uint32_t f = 1; f < EMB_ROWFMT_COUNT; f++) {
			size_t stride = emb_rowfmt_bytes(f, dim);

			if (f == EMB_ROWFMT_INT8) /* finite scales and biases */
				for (uint32_t r = 0; r < n; r++) {
					float sb[2] = {0.01f * (float)(r % 7),
						       -(float)(r % 5)};

					memcpy(src + r * stride, sb,
					       sizeof(sb));
				}
			emb__rowfmt_vec_max = 0;
			emb_rowfmt_decode_rows(f, src, stride, want, dim, n);
			for (size_t w = 0; w < 2; w++) {
				emb__rowfmt_vec_max = widths[w];
				memset(got, 0, out_bytes);
				emb_rowfmt_decode_rows(f, src, stride, got, dim,
						       n);
				bad +=
				    memcmp(got, want, (size_t)n * dim * 4) != 0;
			}
		}
	}
	emb__rowfmt_vec_max = 64;
	CU_ASSERT_EQUAL(bad, 0);
	free(src);
	free(got);
	free(want);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"names and parses the formats", test_names},
	    {"decodes every fp16 and bf16 pattern exactly", test_decode_all},
	    {"encodes to nearest even, refuses past the range",
	     test_encode_nearest},
	    {"int8 rows round trip within half a step, refuse overflow",
	     test_int8},
	    {"stochastic rounding is keyed and lands on a neighbour",
	     test_sr_targets},
	    {"stochastic rounding differs by key", test_sr_keys},
	    {"stochastic rounding is unbiased", test_sr_unbiased},
	    {"vector bodies give the scalar body's bits", test_vector_bodies},
	    {"decodes many rows at a stride", test_decode_rows},
	    {"streams a large gather to the same values",
	     test_decode_rows_large},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/rowfmt", cases);
}
