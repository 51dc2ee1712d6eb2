/*
 * tests/common/test_optim.c - the optimizers against scalar references.
 *
 * Each reference below is the textbook update written out in double
 * precision. A step is checked from the float row the code under test left
 * behind, so an error cannot hide by compounding: every weight and state
 * float after every step must be within 1e-6 relative error of the double
 * result. Single-threaded.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "common/optim_int.h"

#include "common/err.h"
#include "common/optim.h"

#define DIM	7
#define STEPS	12
#define REL_TOL 1e-6

/* Largest state: Adam's m, v and step count. */
#define STATE_MAX (2 * DIM + 1)

struct ref_row {
	double w[DIM];
	double s[STATE_MAX];
	uint32_t t; /* Adam's step count */
};

static bool close_rel(double got, double want)
{
	double err = fabs(got - want);

	if (err == 0.0)
		return true;
	return err <= REL_TOL * fabs(want);
}

/* Names the first few mismatches, so a failure says expected vs got. */
static void report(const struct emb_optim_cfg *c, const char *what, int step,
		   uint32_t i, double got, double want, int *bad)
{
	if ((*bad)++ < 5)
		fprintf(stderr,
			"\n    %s step %d %s[%u]: expected %.9g got %.9g "
			"(rel %.2g)",
			emb_optim_name(c->kind), step, what, i, want, got,
			fabs(got - want) / fabs(want));
}

/* Gradients with mixed signs and magnitudes that stay well conditioned. */
static float grad_at(int step, uint32_t i)
{
	static const float g[DIM] = {0.5f,   -0.25f, 1.5f,  -2.0f,
				     0.125f, 3.0f,   -0.75f};

	return g[i] * (1.0f + 0.1f * (float)step) * (step % 3 == 2 ? -1 : 1);
}

static void ref_step(const struct emb_optim_cfg *c, struct ref_row *r,
		     const float *g)
{
	double lr = c->lr, wd = c->weight_decay;

	for (uint32_t i = 0; i < DIM; i++) {
		double gi = (double)g[i] + wd * r->w[i];

		switch (c->kind) {
		case EMB_OPTIM_SGD:
			r->w[i] -= lr * gi;
			break;
		case EMB_OPTIM_ADAGRAD:
			r->s[i] += gi * gi;
			r->w[i] -= lr * gi / (sqrt(r->s[i]) + c->eps);
			break;
		case EMB_OPTIM_ADAM: {
			double b1 = c->beta1, b2 = c->beta2;
			double *m = &r->s[0], *v = &r->s[DIM];
			double t = (double)r->t + 1.0;
			double mhat, vhat;

			m[i] = b1 * m[i] + (1.0 - b1) * gi;
			v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
			mhat = m[i] / (1.0 - pow(b1, t));
			vhat = v[i] / (1.0 - pow(b2, t));
			r->w[i] -= lr * mhat / (sqrt(vhat) + c->eps);
			break;
		}
		case EMB_OPTIM_FTRL: {
			double *z = &r->s[0], *n = &r->s[DIM];
			double n_new = n[i] + gi * gi;
			double sigma = (sqrt(n_new) - sqrt(n[i])) / lr;

			z[i] += gi - sigma * r->w[i];
			n[i] = n_new;
			if (fabs(z[i]) <= c->l1)
				r->w[i] = 0.0;
			else
				r->w[i] =
				    -(z[i] - copysign(c->l1, z[i])) /
				    ((c->ftrl_beta + sqrt(n[i])) / lr + c->l2);
			break;
		}
		default:
			CU_FAIL("unknown kind in reference");
		}
	}
	if (c->kind == EMB_OPTIM_ADAM)
		r->t++;
}

/* Loads the float row into the reference, as the step's starting point. */
static void ref_load(const struct emb_optim_cfg *c, struct ref_row *r,
		     const float *w, const float *s)
{
	uint32_t ns = emb_optim_state_floats(c->kind, DIM);

	for (uint32_t i = 0; i < DIM; i++)
		r->w[i] = w[i];
	if (c->kind == EMB_OPTIM_ADAM) {
		memcpy(&r->t, &s[2 * DIM], sizeof(r->t));
		ns = 2 * DIM;
	}
	for (uint32_t i = 0; i < ns; i++)
		r->s[i] = s[i];
}

static void check_steps(const struct emb_optim_cfg *c)
{
	float w[DIM], s[STATE_MAX + 1], g[DIM];
	uint32_t ns = emb_optim_state_floats(c->kind, DIM);
	struct ref_row r;
	int bad = 0;

	CU_ASSERT_EQUAL_FATAL(emb_optim_validate(c), 0);
	/* Weights well away from zero, so no step cancels them. */
	for (uint32_t i = 0; i < DIM; i++)
		w[i] = (i % 2 ? -1.0f : 1.0f) * (2.0f + 0.5f * (float)i);
	emb_optim_state_init(c, s, DIM);
	s[ns] = 12345.0f; /* canary: the state is exactly ns floats */

	for (int step = 0; step < STEPS; step++) {
		for (uint32_t i = 0; i < DIM; i++)
			g[i] = grad_at(step, i);
		ref_load(c, &r, w, s);
		ref_step(c, &r, g);
		emb_optim_apply(c, w, s, g, DIM);

		for (uint32_t i = 0; i < DIM; i++) {
			if (!close_rel(w[i], r.w[i]))
				report(c, "w", step, i, w[i], r.w[i], &bad);
		}
		if (c->kind == EMB_OPTIM_ADAM) {
			uint32_t t;

			memcpy(&t, &s[2 * DIM], sizeof(t));
			CU_ASSERT_EQUAL(t, (uint32_t)step + 1);
		}
		for (uint32_t i = 0;
		     i < (c->kind == EMB_OPTIM_ADAM ? 2 * DIM : ns); i++) {
			if (!close_rel(s[i], r.s[i]))
				report(c, "state", step, i, s[i], r.s[i], &bad);
		}
		CU_ASSERT_EQUAL(s[ns], 12345.0f);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_sgd(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.lr = 0.05f;
	check_steps(&c);
	c.weight_decay = 0.1f;
	check_steps(&c);
}

/* Start values of element i of a wide row, its state and its gradient. */
static float wide_w(uint32_t i)
{
	return 0.3f - 0.011f * (float)i;
}

static float wide_state(uint32_t i)
{
	return 0.1f + 0.003f * (float)(i % 11);
}

static float wide_g(uint32_t i)
{
	return (float)(i % 7) * 0.17f - 0.5f;
}

/*
 * Each optimizer's scalar code written out here, one row at a time: the
 * operations of every element in their order (and Adam's per-row step
 * count and bias correction). st is the row's state (NULL for SGD).
 */
typedef void (*row_ref_fn)(const struct emb_optim_cfg *c, float *w, float *st,
			   const float *g, uint32_t dim);

static void sgd_row_ref(const struct emb_optim_cfg *c, float *w, float *st,
			const float *g, uint32_t dim)
{
	(void)st;
	for (uint32_t i = 0; i < dim; i++) {
		if (c->weight_decay == 0.0f)
			w[i] -= c->lr * g[i];
		else
			w[i] -= c->lr * (g[i] + c->weight_decay * w[i]);
	}
}

static void adagrad_row_ref(const struct emb_optim_cfg *c, float *w,
			    float *st, const float *g, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++) {
		float gi = g[i] + c->weight_decay * w[i];

		st[i] += gi * gi;
		w[i] -= c->lr * gi / (sqrtf(st[i]) + c->eps);
	}
}

static void adam_row_ref(const struct emb_optim_cfg *c, float *w, float *st,
			 const float *g, uint32_t dim)
{
	float *m = st, *v = st + dim;
	uint32_t t;
	double c1, c2;
	float step;

	memcpy(&t, &st[2 * dim], sizeof(t));
	t++;
	memcpy(&st[2 * dim], &t, sizeof(t));
	c1 = 1.0 - pow(c->beta1, (double)t);
	c2 = 1.0 - pow(c->beta2, (double)t);
	step = (float)(c->lr * sqrt(c2) / c1);
	for (uint32_t i = 0; i < dim; i++) {
		float gi = g[i] + c->weight_decay * w[i];

		m[i] = c->beta1 * m[i] + (1.0f - c->beta1) * gi;
		v[i] = c->beta2 * v[i] + (1.0f - c->beta2) * gi * gi;
		w[i] -= step * m[i] / (sqrtf(v[i]) + c->eps * (float)sqrt(c2));
	}
}

static void ftrl_row_ref(const struct emb_optim_cfg *c, float *w, float *st,
			 const float *g, uint32_t dim)
{
	float *z = st, *n = st + dim;

	for (uint32_t i = 0; i < dim; i++) {
		float gi = g[i] + c->weight_decay * w[i];
		float n_new = n[i] + gi * gi;
		float sigma = (sqrtf(n_new) - sqrtf(n[i])) / c->lr;

		z[i] += gi - sigma * w[i];
		n[i] = n_new;
		if (fabsf(z[i]) <= c->l1)
			w[i] = 0.0f;
		else
			w[i] = -(z[i] - (z[i] < 0.0f ? -1.0f : 1.0f) * c->l1) /
			       ((c->ftrl_beta + sqrtf(n_new)) / c->lr + c->l2);
	}
}

/*
 * Row-wise Adagrad's scalar code: the sum of squares in 16 lanes over the
 * whole blocks of 16, the lanes folded pairwise (k + 8 into k, then + 4,
 * + 2, + 1), the tail's squares added in turn; then one step for the row.
 */
static void rowwise_adagrad_row_ref(const struct emb_optim_cfg *c, float *w,
				    float *st, const float *g, uint32_t dim)
{
	float lane[16] = {0}, sum, step;
	uint32_t i = 0;

	for (; i + 16 <= dim; i += 16) {
		for (uint32_t k = 0; k < 16; k++) {
			float gi = g[i + k] + c->weight_decay * w[i + k];

			lane[k] += gi * gi;
		}
	}
	for (uint32_t h = 8; h; h /= 2) {
		for (uint32_t k = 0; k < h; k++)
			lane[k] += lane[k + h];
	}
	sum = lane[0];
	for (; i < dim; i++) {
		float gi = g[i] + c->weight_decay * w[i];

		sum += gi * gi;
	}
	if (sum == 0.0f)
		return;
	st[0] += sum / (float)dim;
	step = c->lr / (sqrtf(st[0]) + c->eps);
	for (i = 0; i < dim; i++)
		w[i] -= step * (g[i] + c->weight_decay * w[i]);
}

/*
 * A row's state to start from: the first dim floats of either sign for
 * Adam's m and FTRL's z, every other float positive (Adagrad's
 * accumulator, Adam's v, FTRL's n), Adam's step count 0.
 */
static void wide_state_row(enum emb_optim_kind kind, float *s, uint32_t dim,
			   uint32_t ns)
{
	const bool signed_first =
	    kind == EMB_OPTIM_ADAM || kind == EMB_OPTIM_FTRL;

	for (uint32_t j = 0; j < ns; j++)
		s[j] = wide_state(j % dim) - (signed_first && j < dim ? 0.115f
								       : 0.0f);
	if (kind == EMB_OPTIM_ADAM)
		s[2 * dim] = 0.0f; /* the bits of step count 0 */
}

/*
 * Rows of whole vector blocks and a tail: three steps of emb_optim_apply()
 * on rows of each length, with and without decay, must leave every weight
 * and state float bit-identical to the scalar code (the vector copies and
 * the scalar tail do the same operations per element, without
 * contraction), on every x86-64, in the copy emb__optim_vec_max allows.
 */
static void rows_match_scalar_at(const struct emb_optim_cfg *base,
				 row_ref_fn ref)
{
	static const uint32_t dims[] = {7, 8, 9, 15, 16, 17, 33, 64, 100, 4096};
	static const float wds[] = {0.0f, 0.01f};

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
		for (size_t k = 0; k < 2; k++) {
			struct emb_optim_cfg c = *base;
			uint32_t dim = dims[d], bad = 0, zeros = 0;
			uint32_t ns = emb_optim_state_floats(c.kind, dim);
			float *w = calloc(dim, sizeof(float));
			float *ww = calloc(dim, sizeof(float));
			float *s = calloc(ns + 1, sizeof(float));
			float *ws = calloc(ns + 1, sizeof(float));
			float *g = calloc(dim, sizeof(float));

			CU_ASSERT_FATAL(w && ww && s && ws && g);
			c.weight_decay = wds[k];
			for (uint32_t i = 0; i < dim; i++) {
				w[i] = ww[i] = wide_w(i);
				g[i] = wide_g(i);
			}
			wide_state_row(c.kind, s, dim, ns);
			wide_state_row(c.kind, ws, dim, ns);
			for (int n = 0; n < 3; n++) {
				emb_optim_apply(&c, w, ns ? s : NULL, g, dim);
				ref(&c, ww, ns ? ws : NULL, g, dim);
			}
			for (uint32_t i = 0; i < dim; i++) {
				bad += memcmp(&w[i], &ww[i], sizeof(float)) != 0;
				zeros += w[i] == 0.0f;
			}
			bad += memcmp(s, ws, ns * sizeof(float)) != 0;
			CU_ASSERT_EQUAL(bad, 0);
			/* FTRL's l1 zeroes some weights and not others: both
			 * sides of its select run. */
			if (c.kind == EMB_OPTIM_FTRL && dim >= 16)
				CU_ASSERT(zeros > 0 && zeros < dim);
			if (bad)
				fprintf(stderr,
					"\n    %s dim %u wd %g width %u: %u differ",
					emb_optim_name(c.kind), dim,
					(double)c.weight_decay, emb__optim_vec_max,
					bad);
			free(g);
			free(ws);
			free(s);
			free(ww);
			free(w);
		}
	}
}

/*
 * The copies the CPU would not pick run too: the widest copy is lowered
 * (emb__optim_vec_max) to AVX2 and to the scalar loop in turn.
 */
static void rows_match_scalar(const struct emb_optim_cfg *base,
			      row_ref_fn ref)
{
	static const unsigned widths[] = {64, 32, 0};

	for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
		emb__optim_vec_max = widths[i];
		rows_match_scalar_at(base, ref);
	}
	emb__optim_vec_max = 64;
}

static void test_sgd_wide_rows_bit_exact(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.lr = 0.037f;
	rows_match_scalar(&c, sgd_row_ref);
}

static void test_adagrad_wide_rows_bit_exact(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_ADAGRAD;
	c.lr = 0.05f;
	c.eps = 1e-3f;
	rows_match_scalar(&c, adagrad_row_ref);
}

static void test_adam_wide_rows_bit_exact(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_ADAM;
	c.lr = 0.02f;
	c.eps = 1e-3f;
	c.beta1 = 0.8f;
	c.beta2 = 0.9f;
	rows_match_scalar(&c, adam_row_ref);
}

static void test_ftrl_wide_rows_bit_exact(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_FTRL;
	c.lr = 0.1f;
	c.l1 = 0.05f;
	c.l2 = 0.01f;
	c.ftrl_beta = 1.0f;
	rows_match_scalar(&c, ftrl_row_ref);
}

static void test_rowwise_adagrad_wide_rows_bit_exact(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_ROWWISE_ADAGRAD;
	c.lr = 0.05f;
	c.eps = 1e-3f;
	rows_match_scalar(&c, rowwise_adagrad_row_ref);
}

/*
 * Row-wise Adagrad against its definition in double precision, from the
 * float row each step left (as check_steps()): acc += mean of g'^2 over
 * the row, w -= lr * g' / (sqrt(acc) + eps), with g' = g + wd * w. Rows
 * of one element, of less than a block of 16, of whole blocks, and of
 * blocks and a tail; with and without decay and a starting accumulator.
 * The float sum of up to 130 positive squares may differ from the
 * double one by a few units in the last place, hence REL_TOL (1e-6,
 * about 8 ulps) for acc too.
 */
static void test_rowwise_adagrad(void)
{
	static const uint32_t dims[] = {1, 7, 16, 64, 130};
	static const struct {
		float wd, acc0, eps;
	} cfgs[] = {{0.0f, 0.1f, 1e-8f}, {0.01f, 0.0f, 1e-3f},
		    {0.5f, 2.0f, 1e-8f}};
	int bad = 0;

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
		for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++) {
			struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
			const uint32_t dim = dims[d];
			/* As the store keeps it: w[dim], acc, and a canary. */
			float row[130 + 2], g[130];

			c.kind = EMB_OPTIM_ROWWISE_ADAGRAD;
			c.lr = 0.1f;
			c.weight_decay = cfgs[k].wd;
			c.initial_accumulator = cfgs[k].acc0;
			c.eps = cfgs[k].eps;
			CU_ASSERT_EQUAL_FATAL(emb_optim_validate(&c), 0);
			for (uint32_t i = 0; i < dim; i++)
				row[i] = (i % 2 ? -1.0f : 1.0f) *
					 (2.0f + 0.05f * (float)i);
			row[dim + 1] = 12345.0f;
			emb_optim_state_init(&c, row + dim, dim);
			CU_ASSERT_EQUAL(row[dim], cfgs[k].acc0);
			for (int step = 0; step < STEPS; step++) {
				double rw[130], racc = row[dim], sum = 0.0;

				for (uint32_t i = 0; i < dim; i++) {
					double gi;

					g[i] = grad_at(step, i % DIM) *
					       (1.0f + 0.01f * (float)i);
					rw[i] = row[i];
					gi = (double)g[i] +
					     c.weight_decay * rw[i];
					sum += gi * gi;
				}
				racc += sum / dim;
				for (uint32_t i = 0; i < dim; i++)
					rw[i] -= c.lr *
						 ((double)g[i] +
						  c.weight_decay * rw[i]) /
						 (sqrt(racc) + c.eps);
				/* Both entry points, in turn. */
				if (step % 2)
					emb_optim_apply(&c, row, row + dim, g,
							dim);
				else
					CU_ASSERT(emb_optim_apply_row(&c, row,
								      g, dim));
				for (uint32_t i = 0; i < dim; i++) {
					if (!close_rel(row[i], rw[i]))
						report(&c, "w", step, i,
						       row[i], rw[i], &bad);
				}
				if (!close_rel(row[dim], racc))
					report(&c, "acc", step, 0, row[dim],
					       racc, &bad);
			}
			CU_ASSERT_EQUAL(row[dim + 1], 12345.0f);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

/*
 * An update that overflows is refused by emb_optim_apply_row(): a
 * gradient whose square does (acc becomes Inf), one whose mean square
 * pushes acc past the float range, and g + wd * w past it. (A weight
 * cannot overflow otherwise: each moves by at most lr * sqrt(dim), as
 * sqrt(acc) is at least the root mean square of g'.) A finite update of
 * the same rows is accepted, and a zero gradient with acc 0 and lr / eps
 * beyond the float range (step Inf) leaves the row as it was, not NaN.
 */
static void test_rowwise_adagrad_overflow_refused(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	float row[64 + 1], g[64];

	c.kind = EMB_OPTIM_ROWWISE_ADAGRAD;
	c.lr = 1.0f;
	for (uint32_t dim = 1; dim <= 64; dim += 63) {
		for (uint32_t i = 0; i < dim; i++) {
			row[i] = 1.0f;
			g[i] = 0.5f;
		}
		emb_optim_state_init(&c, row + dim, dim);
		CU_ASSERT(emb_optim_apply_row(&c, row, g, dim));

		g[dim - 1] = 3e38f; /* its square is Inf */
		CU_ASSERT(!emb_optim_apply_row(&c, row, g, dim));

		for (uint32_t i = 0; i < dim; i++) {
			row[i] = 1.0f;
			g[i] = 1e18f; /* squares of 1e36, sum finite */
		}
		row[dim] = FLT_MAX; /* FLT_MAX + 1e36 rounds to Inf */
		CU_ASSERT(!emb_optim_apply_row(&c, row, g, dim));

		c.weight_decay = 1.0f;
		for (uint32_t i = 0; i < dim; i++) {
			row[i] = 2e38f;
			g[i] = i == dim / 2 ? 2e38f : 0.0f;
		}
		row[dim] = 0.1f;
		CU_ASSERT(!emb_optim_apply_row(&c, row, g, dim));
		c.weight_decay = 0.0f;
	}

	c.lr = 1e6f;
	c.eps = 1e-37f;
	c.initial_accumulator = 0.0f;

	/* A zero gradient there: step is Inf, and the row stays as it was. */
	row[0] = 1.0f;
	emb_optim_state_init(&c, row + 1, 1);
	g[0] = 0.0f;
	CU_ASSERT(emb_optim_apply_row(&c, row, g, 1));
	CU_ASSERT_EQUAL(row[0], 1.0f);
	CU_ASSERT_EQUAL(row[1], 0.0f);
}

static void test_adagrad(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_ADAGRAD;
	c.lr = 0.1f;
	c.initial_accumulator = 0.1f;
	c.eps = 1e-3f;
	check_steps(&c);
	c.weight_decay = 0.01f;
	c.initial_accumulator = 0.0f;
	check_steps(&c);
}

static void test_adam(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_ADAM;
	c.lr = 0.01f;
	/* A visible eps checks where it enters the bias-corrected form. */
	c.eps = 1e-2f;
	check_steps(&c);
	c.beta1 = 0.5f;
	c.beta2 = 0.75f;
	c.weight_decay = 0.05f;
	check_steps(&c);
	c.beta1 = 0.0f;
	check_steps(&c);
}

static void test_ftrl(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.kind = EMB_OPTIM_FTRL;
	c.lr = 0.1f;
	c.ftrl_beta = 1.0f;
	check_steps(&c);
	c.l1 = 0.5f;
	c.l2 = 0.25f;
	check_steps(&c);
	c.weight_decay = 0.02f;
	c.ftrl_beta = 0.5f;
	check_steps(&c);
}

/* With l1 larger than any |z|, FTRL keeps every weight at exactly zero. */
static void test_ftrl_l1_zeroes(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	float w[DIM] = {0}, s[2 * DIM], g[DIM];

	c.kind = EMB_OPTIM_FTRL;
	c.lr = 0.1f;
	c.l1 = 1000.0f;
	emb_optim_state_init(&c, s, DIM);
	for (int step = 0; step < STEPS; step++) {
		for (uint32_t i = 0; i < DIM; i++)
			g[i] = grad_at(step, i);
		emb_optim_apply(&c, w, s, g, DIM);
		for (uint32_t i = 0; i < DIM; i++)
			CU_ASSERT_EQUAL(w[i], 0.0f);
	}
}

/* Adam counts steps per row: a fresh row's first step is fully corrected. */
static void test_adam_first_step(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	float w[1] = {1.0f}, s[3], g[1] = {4.0f};

	c.kind = EMB_OPTIM_ADAM;
	c.lr = 0.5f;
	c.eps = 1e-8f;
	emb_optim_state_init(&c, s, 1);
	emb_optim_apply(&c, w, s, g, 1);
	/* m_hat = g and v_hat = g^2, so the step is lr * sign(g). */
	CU_ASSERT_DOUBLE_EQUAL(w[0], 0.5, 1e-6);
}

static void test_state_floats(void)
{
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_SGD, 64), 0);
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_ADAGRAD, 64), 64);
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_ADAM, 64), 129);
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_FTRL, 64), 128);
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_ROWWISE_ADAGRAD, 64),
			1);
	CU_ASSERT_EQUAL(emb_optim_state_floats(EMB_OPTIM_ROWWISE_ADAGRAD, 1),
			1);
	CU_ASSERT_EQUAL(
	    emb_optim_state_floats(EMB_OPTIM_ROWWISE_ADAGRAD, 4096), 1);
	CU_ASSERT_EQUAL(emb_optim_state_floats(0, 64), 0);
	CU_ASSERT_EQUAL(emb_optim_state_floats(6, 64), 0);
}

static void test_state_init(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	float s[2 * DIM + 2];

	for (uint32_t k = EMB_OPTIM_SGD; k <= EMB_OPTIM_ROWWISE_ADAGRAD; k++) {
		uint32_t ns = emb_optim_state_floats(k, DIM);
		bool acc = k == EMB_OPTIM_ADAGRAD ||
			   k == EMB_OPTIM_ROWWISE_ADAGRAD;

		c.kind = k;
		c.initial_accumulator = 0.25f;
		for (uint32_t i = 0; i < 2 * DIM + 2; i++)
			s[i] = -7.0f;
		emb_optim_state_init(&c, s, DIM);
		for (uint32_t i = 0; i < ns; i++)
			CU_ASSERT_EQUAL(s[i], acc ? 0.25f : 0.0f);
		/* Nothing past the state is written. */
		CU_ASSERT_EQUAL(s[ns], -7.0f);
	}
}

static void test_validate(void)
{
	struct emb_optim_cfg c;

	for (uint32_t k = EMB_OPTIM_SGD; k <= EMB_OPTIM_ROWWISE_ADAGRAD; k++) {
		c = EMB_OPTIM_CFG_DEFAULT;
		c.kind = k;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), 0);
		c.lr = 0.0f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.lr = -0.1f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.lr = NAN;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.lr = INFINITY;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.lr = 0.1f;
		c.weight_decay = -0.1f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	}
	CU_ASSERT_EQUAL(emb_optim_validate(NULL), EMB_EBADARG);

	c = EMB_OPTIM_CFG_DEFAULT;
	c.kind = 0;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.kind = EMB_OPTIM_ROWWISE_ADAGRAD + 1;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);

	for (uint32_t k = EMB_OPTIM_ADAGRAD; k <= EMB_OPTIM_ROWWISE_ADAGRAD;
	     k += EMB_OPTIM_ROWWISE_ADAGRAD - EMB_OPTIM_ADAGRAD) {
		c = EMB_OPTIM_CFG_DEFAULT;
		c.kind = k;
		c.initial_accumulator = -1.0f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.initial_accumulator = 2 * EMB_OPTIM_PARAM_MAX;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.initial_accumulator = 0.0f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), 0);
		c.eps = 0.0f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
		c.eps = 1.5f;
		CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	}

	c = EMB_OPTIM_CFG_DEFAULT;
	c.kind = EMB_OPTIM_ADAM;
	c.beta1 = 1.0f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.beta1 = -0.1f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.beta1 = 0.0f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), 0);
	c.beta2 = 1.0f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.beta2 = 0.999f;
	c.eps = -1e-8f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);

	c = EMB_OPTIM_CFG_DEFAULT;
	c.kind = EMB_OPTIM_FTRL;
	c.l1 = -0.1f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.l1 = 0.0f;
	c.l2 = -0.1f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.l2 = 0.0f;
	c.ftrl_beta = -1.0f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
}

static void test_name(void)
{
	CU_ASSERT_STRING_EQUAL(emb_optim_name(EMB_OPTIM_SGD), "sgd");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(EMB_OPTIM_ADAGRAD), "adagrad");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(EMB_OPTIM_ADAM), "adam");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(EMB_OPTIM_FTRL), "ftrl");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(EMB_OPTIM_ROWWISE_ADAGRAD),
			       "rowwise_adagrad");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(0), "?");
	CU_ASSERT_STRING_EQUAL(emb_optim_name(99), "?");
}

static void test_parse(void)
{
	struct emb_optim_cfg c, def = EMB_OPTIM_CFG_DEFAULT;

	CU_ASSERT_EQUAL_FATAL(emb_optim_parse("sgd", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_SGD);
	CU_ASSERT_EQUAL(c.lr, def.lr);

	CU_ASSERT_EQUAL_FATAL(
	    emb_optim_parse("adam:lr=0.001,beta1=0.8,beta2=0.99,eps=1e-6", &c),
	    0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_ADAM);
	CU_ASSERT_EQUAL(c.lr, 0.001f);
	CU_ASSERT_EQUAL(c.beta1, 0.8f);
	CU_ASSERT_EQUAL(c.beta2, 0.99f);
	CU_ASSERT_EQUAL(c.eps, 1e-6f);
	CU_ASSERT_EQUAL(c.weight_decay, def.weight_decay);

	CU_ASSERT_EQUAL_FATAL(emb_optim_parse("adagrad:acc=0.5,wd=0.01", &c),
			      0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_ADAGRAD);
	CU_ASSERT_EQUAL(c.initial_accumulator, 0.5f);
	CU_ASSERT_EQUAL(c.weight_decay, 0.01f);

	CU_ASSERT_EQUAL_FATAL(
	    emb_optim_parse("ftrl:lr=0.2,beta=0.5,l1=1,l2=2", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_FTRL);
	CU_ASSERT_EQUAL(c.lr, 0.2f);
	CU_ASSERT_EQUAL(c.ftrl_beta, 0.5f);
	CU_ASSERT_EQUAL(c.l1, 1.0f);
	CU_ASSERT_EQUAL(c.l2, 2.0f);

	CU_ASSERT_EQUAL_FATAL(
	    emb_optim_parse("rowwise_adagrad:lr=0.2,wd=0.01,acc=0.5,eps=1e-6",
			    &c),
	    0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_ROWWISE_ADAGRAD);
	CU_ASSERT_EQUAL(c.lr, 0.2f);
	CU_ASSERT_EQUAL(c.weight_decay, 0.01f);
	CU_ASSERT_EQUAL(c.initial_accumulator, 0.5f);
	CU_ASSERT_EQUAL(c.eps, 1e-6f);
	CU_ASSERT_EQUAL_FATAL(emb_optim_parse("rowwise_adagrad", &c), 0);
	CU_ASSERT_EQUAL(c.kind, EMB_OPTIM_ROWWISE_ADAGRAD);
	CU_ASSERT_EQUAL(c.lr, def.lr);
	CU_ASSERT_EQUAL(c.initial_accumulator, def.initial_accumulator);
}

static void test_parse_rejects(void)
{
	static const char *const bad[] = {
	    "",
	    "sg",
	    "sgdx",
	    "SGD",
	    "adam:lr",
	    "adam:lr=",
	    "adam:lr=abc",
	    "adam:lr=0.1x",
	    "adam:foo=1",
	    "adam:lr=0",
	    "adam:lr=-1",
	    "adam:beta1=1",
	    "adagrad:acc=-1",
	    "ftrl:l1=-1",
	    "rowwise_adagrad:acc=-1",
	    "rowwise_adagrad:eps=0",
	    "rowwise",
	    "rowwise_adagrad_",
	    "rowwise_adagradx:lr=1",
	    "sgd:lr=0.1,,",
	    "sgd:lr=0.1;wd=0",
	};
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.lr = 0.125f;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CU_ASSERT_EQUAL(emb_optim_parse(bad[i], &c), EMB_EBADOPTIM);
		/* A rejected string leaves the output alone. */
		CU_ASSERT_EQUAL(c.lr, 0.125f);
	}
	CU_ASSERT_EQUAL(emb_optim_parse(NULL, &c), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_optim_parse("sgd", NULL), EMB_EBADARG);
}

/* Parameters whose update would overflow a float are refused. */
static void test_absurd_params(void)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	const float v[4] = {1.0f, -2.0f, 3e38f, 0.0f};
	float bad[4] = {1.0f, 2.0f, 3.0f, 4.0f};

	CU_ASSERT_EQUAL(emb_optim_validate(&c), 0);
	c.lr = 1e30f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c.lr = EMB_OPTIM_PARAM_MAX;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), 0);
	c.lr = NAN;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c = EMB_OPTIM_CFG_DEFAULT;
	c.kind = EMB_OPTIM_ADAM;
	c.eps = 2.0f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	c = EMB_OPTIM_CFG_DEFAULT;
	c.kind = EMB_OPTIM_FTRL;
	c.l1 = 1e20f;
	CU_ASSERT_EQUAL(emb_optim_validate(&c), EMB_EBADOPTIM);
	CU_ASSERT(emb_floats_finite(v, 4));
	CU_ASSERT(emb_floats_finite(NULL, 0));
	bad[3] = NAN;
	CU_ASSERT(!emb_floats_finite(bad, 4));
	bad[3] = -INFINITY;
	CU_ASSERT(!emb_floats_finite(bad, 4));
	/* A NaN or an infinity anywhere, in the vector blocks or the tail,
	 * and the largest finite float, in arrays of every length to 80, in
	 * every copy the CPU has (AVX-512, AVX2, scalar). */
	for (uint32_t wi = 0; wi < 3; wi++) {
		static const unsigned widths[] = {64, 32, 0};
		float w[80];
		uint32_t missed = 0, wrong = 0;

		emb__optim_vec_max = widths[wi];
		for (uint32_t n = 1; n <= 80; n++) {
			for (uint32_t i = 0; i < n; i++)
				w[i] = FLT_MAX * (i & 1 ? -1.0f : 1.0f);
			if (!emb_floats_finite(w, n))
				wrong++;
			for (uint32_t at = 0; at < n; at++) {
				float keep = w[at];

				w[at] = at & 1 ? NAN : INFINITY;
				if (emb_floats_finite(w, n))
					missed++;
				w[at] = keep;
			}
		}
		CU_ASSERT_EQUAL(missed, 0);
		CU_ASSERT_EQUAL(wrong, 0);
	}
	emb__optim_vec_max = 64;
}

/*
 * emb_floats_add() in every copy the CPU has gives, element by element,
 * the bits of one float addition: sums of a batch's repeated gradients
 * are the same whichever CPU summed them (store and client alike).
 */
static void test_floats_add(void)
{
	static const unsigned widths[] = {64, 32, 0};
	float src[80], dst[80], want[80];
	uint32_t rng = 12345;

	for (uint32_t wi = 0; wi < 3; wi++) {
		uint32_t wrong = 0;

		emb__optim_vec_max = widths[wi];
		for (uint32_t n = 0; n <= 80; n++) {
			for (uint32_t i = 0; i < n; i++) {
				rng = rng * 1664525u + 1013904223u;
				src[i] = (float)(int32_t)rng * 0x1p-20f;
				rng = rng * 1664525u + 1013904223u;
				dst[i] = (float)(int32_t)rng * 0x1p-40f;
				want[i] = dst[i] + src[i];
			}
			emb_floats_add(dst, src, n);
			wrong += memcmp(dst, want, n * sizeof(float)) != 0;
		}
		CU_ASSERT_EQUAL(wrong, 0);
	}
	emb__optim_vec_max = 64;
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"absurd parameters and non-finite floats are refused",
	     test_absurd_params},
	    {"floats_add is one addition a float in every copy",
	     test_floats_add},
	    {"sgd matches the reference, with and without decay", test_sgd},
	    {"sgd on wide rows is bit-exact", test_sgd_wide_rows_bit_exact},
	    {"adagrad on wide rows is bit-exact",
	     test_adagrad_wide_rows_bit_exact},
	    {"adam on wide rows is bit-exact", test_adam_wide_rows_bit_exact},
	    {"ftrl on wide rows is bit-exact", test_ftrl_wide_rows_bit_exact},
	    {"rowwise_adagrad on wide rows is bit-exact",
	     test_rowwise_adagrad_wide_rows_bit_exact},
	    {"rowwise_adagrad matches the reference, dims 1 to 130",
	     test_rowwise_adagrad},
	    {"rowwise_adagrad refuses an update that overflows",
	     test_rowwise_adagrad_overflow_refused},
	    {"adagrad matches the reference", test_adagrad},
	    {"adam with bias correction matches the reference", test_adam},
	    {"ftrl with l1 and l2 matches the reference", test_ftrl},
	    {"ftrl l1 above every |z| keeps weights zero", test_ftrl_l1_zeroes},
	    {"adam first step moves by lr", test_adam_first_step},
	    {"state floats per kind", test_state_floats},
	    {"state init writes exactly the state", test_state_init},
	    {"validate rejects each bad hyper-parameter", test_validate},
	    {"names each kind", test_name},
	    {"parses name and keys on top of the defaults", test_parse},
	    {"parse rejects malformed strings and keeps output",
	     test_parse_rejects},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/optim", cases);
}
