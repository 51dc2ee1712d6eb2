/*
 * src/common/init.c - initial row values from (seed, id). Thread-safe.
 *
 * A row's key is H(seed, id); elements 2i and 2i + 1 come from the i-th
 * counter-based draw (below), so a row is filled without a carried state and
 * a shorter row is a prefix of a longer one. The arithmetic is IEEE float
 * (C11 without FP contraction), so values are the same on every x86-64
 * build; normal rows also depend on libm's logf/sinf/cosf. Changing this
 * changes the initial values of rows created afterwards only: dumps store
 * rows whole, so old dumps load unchanged.
 */
#include "common/init.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"

/* Within +-EMB_INIT_PARAM_MAX; false for NaN too. */
static bool bounded(float x)
{
	return x >= -EMB_INIT_PARAM_MAX && x <= EMB_INIT_PARAM_MAX;
}

int emb_init_validate(const struct emb_init_cfg *cfg)
{
	if (!cfg)
		return EMB_EBADARG;
	switch (cfg->kind) {
	case EMB_INIT_ZEROS:
		return 0;
	case EMB_INIT_CONSTANT:
		return bounded(cfg->a) ? 0 : EMB_EBADINIT;
	case EMB_INIT_UNIFORM:
		return bounded(cfg->a) && bounded(cfg->b) && cfg->a < cfg->b
			   ? 0
			   : EMB_EBADINIT;
	case EMB_INIT_NORMAL:
		return bounded(cfg->a) && bounded(cfg->b) && cfg->b >= 0.0f
			   ? 0
			   : EMB_EBADINIT;
	default:
		return EMB_EBADINIT;
	}
}

/*
 * Counter-based draws: pair i of a row (elements 2i and 2i + 1) comes from
 * the 64-bit word mix(key + (i + 1) * gamma), splitmix64's finaliser over a
 * Weyl sequence. No state is carried from one pair to the next, so the pairs
 * are independent iterations the compiler can pipeline, and element j never
 * depends on dim. Each word yields two 24-bit fractions, exactly the
 * precision of a float in [0, 1).
 */
#define GAMMA 0x9e3779b97f4a7c15ull
#define U24   0x1.0p-24f

static inline uint64_t draw(uint64_t key, uint32_t pair)
{
	uint64_t z = key + (uint64_t)(pair + 1) * GAMMA;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * a + (b - a) * u for u in [0, 1), in float. Rounding can land on b itself;
 * such a value becomes below_b, the float just under b (a select, not a
 * call, so the loop stays branch-free).
 */
static inline float scale(float a, float span, float below_b, uint32_t bits24)
{
	float w = a + span * ((float)bits24 * U24);

	return w > below_b ? below_b : w;
}

/* Pairs from..dim/2 of a uniform row, one draw at a time: the reference
 * every other path must match bit for bit, and the tail of those paths. */
static void fill_uniform_from(float a, float span, float below_b, uint64_t key,
			      float *w, uint32_t from, uint32_t dim)
{
	uint32_t i;

	for (i = from; i + 1 < dim; i += 2) {
		uint64_t x = draw(key, i / 2);

		w[i] = scale(a, span, below_b, (uint32_t)(x >> 40));
		w[i + 1] =
		    scale(a, span, below_b, (uint32_t)(x >> 8) & 0xffffff);
	}
	if (i < dim)
		w[i] =
		    scale(a, span, below_b, (uint32_t)(draw(key, i / 2) >> 40));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_UNIFORM_AVX512 1

/*
 * Eight draws per step with AVX-512 (DQ has the 64-bit multiply the
 * finaliser needs): 16 elements at once, the same integer arithmetic and
 * the same three IEEE float operations per element as scale() (multiply,
 * multiply, add; no FMA, as the scalar code is built without contraction),
 * and min(w, below_b) is scale()'s select. So the values are identical to
 * the scalar path; tests/common/test_init.c compares them. Creating a row
 * (a pull of a new id) spent most of its user time here: 70 ns per dim-64
 * row in scalar code, about a third of that here. Returns the elements
 * written (a multiple of 16); the caller finishes the row.
 */
__attribute__((target("avx512f,avx512dq"))) static uint32_t
fill_uniform_avx512(float a, float span, float below_b, uint64_t key, float *w,
		    uint32_t dim)
{
	const __m512i gamma = _mm512_set1_epi64((long long)GAMMA);
	const __m512i m1 = _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull);
	const __m512i m2 = _mm512_set1_epi64((long long)0x94d049bb133111ebull);
	const __m512i mask24 = _mm512_set1_epi64(0xffffff);
	const __m512 va = _mm512_set1_ps(a), vspan = _mm512_set1_ps(span);
	const __m512 vbelow = _mm512_set1_ps(below_b), vu24 = _mm512_set1_ps(U24);
	/* Lane j holds pair j's Weyl term key + (j + 1) * gamma; every step
	 * advances all lanes by 8 pairs. */
	__m512i ctr = _mm512_add_epi64(
	    _mm512_set1_epi64((long long)key),
	    _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1), gamma));
	const __m512i step = _mm512_mullo_epi64(_mm512_set1_epi64(8), gamma);
	uint32_t i;

	for (i = 0; i + 16 <= dim; i += 16) {
		__m512i z = ctr, bits;
		__m512 f;

		ctr = _mm512_add_epi64(ctr, step);
		z = _mm512_mullo_epi64(
		    _mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
		z = _mm512_mullo_epi64(
		    _mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
		z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
		/* Element 2j (low half of lane j) takes bits 40..63, element
		 * 2j + 1 (high half) bits 8..31, as in the scalar code. */
		bits = _mm512_or_si512(
		    _mm512_srli_epi64(z, 40),
		    _mm512_slli_epi64(
			_mm512_and_si512(_mm512_srli_epi64(z, 8), mask24), 32));
		f = _mm512_mul_ps(_mm512_cvtepi32_ps(bits), vu24);
		f = _mm512_add_ps(va, _mm512_mul_ps(vspan, f));
		_mm512_storeu_ps(w + i, _mm512_min_ps(f, vbelow));
	}
	return i;
}
#endif

static void fill_uniform(float a, float b, uint64_t key, float *w, uint32_t dim,
			 bool simd)
{
	const float span = b - a, below_b = nextafterf(b, a);
	uint32_t i = 0;

#ifdef HAVE_UNIFORM_AVX512
	if (simd && dim >= 16 && __builtin_cpu_supports("avx512dq"))
		i = fill_uniform_avx512(a, span, below_b, key, w, dim);
#else
	(void)simd;
#endif
	fill_uniform_from(a, span, below_b, key, w, i, dim);
}

/*
 * Box-Muller in float over a pair's two fractions: r from 1 - u1 in
 * (0, 1], so logf() is finite and |z| <= sqrt(48 ln 2) = 5.77 standard
 * deviations (the 24-bit fraction's smallest step), angle from u2.
 */
static void fill_normal(float mean, float std, uint64_t key, float *w,
			uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i += 2) {
		uint64_t x = draw(key, i / 2);
		float u1 = 1.0f - (float)(x >> 40) * U24;
		float th = 6.28318530717958647692f *
			   ((float)((uint32_t)(x >> 8) & 0xffffff) * U24);
		float r = sqrtf(-2.0f * logf(u1));

		w[i] = mean + std * (r * cosf(th));
		if (i + 1 < dim)
			w[i + 1] = mean + std * (r * sinf(th));
	}
}

static void init_row(const struct emb_init_cfg *cfg, uint64_t seed, uint64_t id,
		     float *w, uint32_t dim, bool simd)
{
	uint64_t key =
	    emb_id_hash(seed ^ emb_id_hash(id + 0x632be59bd9b4e019ull));
	uint32_t i;

	switch (cfg->kind) {
	case EMB_INIT_CONSTANT:
		for (i = 0; i < dim; i++)
			w[i] = cfg->a;
		break;
	case EMB_INIT_UNIFORM:
		fill_uniform(cfg->a, cfg->b, key, w, dim, simd);
		break;
	case EMB_INIT_NORMAL:
		fill_normal(cfg->a, cfg->b, key, w, dim);
		break;
	case EMB_INIT_ZEROS:
	default:
		memset(w, 0, dim * sizeof(*w));
		break;
	}
}

void emb_init_row(const struct emb_init_cfg *cfg, uint64_t seed, uint64_t id,
		  float *w, uint32_t dim)
{
	init_row(cfg, seed, id, w, dim, true);
}

void emb_init_row_ref(const struct emb_init_cfg *cfg, uint64_t seed,
		      uint64_t id, float *w, uint32_t dim)
{
	init_row(cfg, seed, id, w, dim, false);
}

const char *emb_init_name(uint32_t kind)
{
	switch (kind) {
	case EMB_INIT_ZEROS:
		return "zeros";
	case EMB_INIT_CONSTANT:
		return "constant";
	case EMB_INIT_UNIFORM:
		return "uniform";
	case EMB_INIT_NORMAL:
		return "normal";
	default:
		return "?";
	}
}

int emb_init_parse(const char *s, struct emb_init_cfg *out)
{
	struct emb_init_cfg c = {0};
	const char *colon;
	char *end;
	size_t nlen;

	if (!s || !out)
		return EMB_EBADARG;
	colon = strchr(s, ':');
	nlen = colon ? (size_t)(colon - s) : strlen(s);
	for (uint32_t k = EMB_INIT_ZEROS; k <= EMB_INIT_NORMAL; k++) {
		if (strlen(emb_init_name(k)) == nlen &&
		    memcmp(emb_init_name(k), s, nlen) == 0)
			c.kind = k;
	}
	switch (c.kind) {
	case EMB_INIT_ZEROS:
		if (colon)
			return EMB_EBADINIT;
		break;
	case EMB_INIT_CONSTANT:
		if (!colon)
			return EMB_EBADINIT;
		c.a = strtof(colon + 1, &end);
		if (*end || end == colon + 1)
			return EMB_EBADINIT;
		break;
	case EMB_INIT_UNIFORM:
	case EMB_INIT_NORMAL:
		if (!colon)
			return EMB_EBADINIT;
		c.a = strtof(colon + 1, &end);
		if (*end != ',')
			return EMB_EBADINIT;
		c.b = strtof(end + 1, &end);
		if (*end)
			return EMB_EBADINIT;
		break;
	default:
		return EMB_EBADINIT;
	}
	if (emb_init_validate(&c))
		return EMB_EBADINIT;
	*out = c;
	return 0;
}
