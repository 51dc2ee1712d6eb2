/*
 * tools/bench_ids.c - embstore-bench's id streams: uniform, and Zipf by
 * rejection-inversion (Hörmann and Derflinger, "Rejection-inversion to
 * generate variates from monotone discrete distributions", 1996). That
 * method needs no table over the rows and costs a few log/exp per draw,
 * independent of the row count, where a CDF table over 10^8 rows would
 * cost memory and cache misses of its own. Each thread owns its stream.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

int emb_dist_parse(const char *s, struct emb_dist *out)
{
	char *end;
	double e;

	if (!s)
		return -EINVAL;
	if (strcmp(s, "uniform") == 0) {
		*out = (struct emb_dist){.kind = EMB_DIST_UNIFORM};
		return 0;
	}
	if (strncmp(s, "zipf:", 5) != 0)
		return -EINVAL;
	errno = 0;
	e = strtod(s + 5, &end);
	if (errno || end == s + 5 || *end || !(e > 0.0 && e <= 10.0))
		return -EINVAL;
	*out = (struct emb_dist){.kind = EMB_DIST_ZIPF, .exponent = e};
	return 0;
}

/* log1p(x) / x and expm1(x) / x, with series near 0 where they cancel. */
static double helper1(double x)
{
	if (fabs(x) > 1e-8)
		return log1p(x) / x;
	return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

static double helper2(double x)
{
	if (fabs(x) > 1e-8)
		return expm1(x) / x;
	return 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
}

/* h(x) = x^-s, and H, an antiderivative of h that stays finite at s = 1. */
static double zipf_h(double s, double x)
{
	return exp(-s * log(x));
}

static double zipf_hint(double s, double x)
{
	double lx = log(x);

	return helper2((1.0 - s) * lx) * lx;
}

static double zipf_hint_inv(double s, double x)
{
	double t = x * (1.0 - s);

	if (t < -1.0)
		t = -1.0;
	return exp(helper1(t) * x);
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;

		a = b;
		b = t;
	}
	return a;
}

int emb_idgen_init(struct emb_idgen *g, const struct emb_dist *dist,
		   uint64_t rows, uint64_t seed, uint32_t stream)
{
	uint64_t m;

	if (!rows || rows > (UINT64_C(1) << 32))
		return -EINVAL;
	if (dist->kind != EMB_DIST_UNIFORM && dist->kind != EMB_DIST_ZIPF)
		return -EINVAL;
	memset(g, 0, sizeof(*g));
	g->rows = rows;
	g->kind = dist->kind;
	/* Distinct streams per thread, all fixed by the seed. */
	g->rng = emb_id_hash(seed ^ emb_id_hash((uint64_t)stream + 1));
	/*
	 * Multiplying by a unit mod rows is a bijection; a multiplier near
	 * rows / golden ratio puts consecutive ranks far apart. The seed does
	 * not enter, so every thread and run agrees on which rows are hot.
	 */
	m = (uint64_t)((double)rows * 0.6180339887498949);
	if (m < 1)
		m = 1;
	while (gcd64(m, rows) != 1)
		m++;
	g->mult = m % rows ? m % rows : 1;
	if (g->kind == EMB_DIST_ZIPF) {
		g->s = dist->exponent;
		g->h_x1 = zipf_hint(g->s, 1.5) - 1.0;
		g->h_n = zipf_hint(g->s, (double)rows + 0.5);
		g->s_accept = 2.0 - zipf_hint_inv(g->s, zipf_hint(g->s, 2.5) -
							zipf_h(g->s, 2.0));
	}
	return 0;
}

static double next_unit(uint64_t *rng)
{
	return (double)(emb_splitmix64(rng) >> 11) * 0x1.0p-53;
}

/* A rank in [0, rows) with P(k) ~ 1 / (k + 1)^s. */
static uint64_t zipf_rank(struct emb_idgen *g)
{
	for (;;) {
		double u = g->h_n + next_unit(&g->rng) * (g->h_x1 - g->h_n);
		double x = zipf_hint_inv(g->s, u);
		double kd = floor(x + 0.5);
		uint64_t k;

		if (kd < 1.0)
			kd = 1.0;
		else if (kd > (double)g->rows)
			kd = (double)g->rows;
		k = (uint64_t)kd;
		/* Accept outright near the mode, else test against the hat. */
		if (kd - x <= g->s_accept ||
		    u >= zipf_hint(g->s, kd + 0.5) - zipf_h(g->s, kd))
			return k - 1;
	}
}

void emb_idgen_fill(struct emb_idgen *g, uint64_t *out, uint32_t n)
{
	uint32_t i;

	if (g->kind == EMB_DIST_UNIFORM) {
		for (i = 0; i < n; i++) {
			uint64_t r = emb_splitmix64(&g->rng);

			/* rows <= 2^32: multiply-shift of 32 random bits */
			out[i] = ((r >> 32) * g->rows) >> 32;
		}
		return;
	}
	for (i = 0; i < n; i++)
		out[i] = emb_idgen_row(g, zipf_rank(g));
}
