/*
 * src/common/optim.c - SGD, Adagrad, Adam, FTRL-proximal and row-wise
 * Adagrad over one row.
 * Called with the row's lock held (store) or from the owning worker thread
 * (cache); keeps no state of its own (emb__optim_vec_max is a knob for
 * tests, optim_int.h).
 */
#include "common/optim.h"
#include "common/optim_int.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

unsigned emb__optim_vec_max = 64;

/*
 * The vector copy to run: 64 (AVX-512), 32 (AVX2) or 0 (the scalar
 * loops), the widest the CPU has and emb__optim_vec_max allows. The CPU is
 * asked per call, as common/init.c does: a load of a word libgcc filled at
 * start-up.
 */
#if defined(__x86_64__) && defined(__GNUC__)
static unsigned vec_width(void)
{
	if (emb__optim_vec_max >= 64 && __builtin_cpu_supports("avx512f"))
		return 64;
	if (emb__optim_vec_max >= 32 && __builtin_cpu_supports("avx2"))
		return 32;
	return 0;
}
#endif

/* A parameter in [0, EMB_OPTIM_PARAM_MAX]; false for NaN too. */
static bool finite_nonneg(float x)
{
	return x >= 0.0f && x <= EMB_OPTIM_PARAM_MAX;
}

static bool good_eps(float x)
{
	return x > 0.0f && x <= 1.0f;
}

/*
 * Exponent all ones is Inf or NaN. No early exit, and blocks of a fixed 16
 * floats: -O2's vectoriser (GCC's "very cheap" model) takes only loops it
 * needs no scalar tail for, and left the plain loop scalar: a quarter of an
 * SGD push's time, 4096 x 64 floats a batch. This is the baseline (SSE2)
 * copy and the tail of the AVX2 and AVX-512 copies below, which the CPU
 * picks: with SSE2's 4 floats a step the check was 5 % of a Zipf SGD push
 * (perf samples; 1.8 % with AVX-512).
 */
static inline __attribute__((always_inline)) bool
floats_finite_body(const float *v, size_t n)
{
	uint32_t acc[16] = {0};
	uint32_t bad = 0;
	size_t i = 0;

	/* One flag per lane, folded once at the end: the blocks then stay
	 * whole vectors with no reduction in the loop. */
	for (; i + 16 <= n; i += 16) {
		uint32_t u[16];

		memcpy(u, &v[i], sizeof(u));
		for (uint32_t k = 0; k < 16; k++)
			acc[k] |= (u[k] & 0x7f800000u) == 0x7f800000u;
	}
	for (uint32_t k = 0; k < 16; k++)
		bad |= acc[k];
	for (; i < n; i++) {
		uint32_t u;

		memcpy(&u, &v[i], sizeof(u));
		bad |= (u & 0x7f800000u) == 0x7f800000u;
	}
	return !bad;
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * The vector copies, with intrinsics: built from floats_finite_body() for
 * AVX2, GCC kept each block's 16 words and the flags on the stack, stored
 * as 16-byte halves and loaded back as 32-byte vectors, a store-forwarding
 * stall every block (AMD EPYC, no AVX-512): the entry check of a push's
 * gradients was 17 % of a W1 Zipf SGD push run's samples there. Here
 * the flags stay in registers, two vectors a step, and the tail (under 16
 * floats) goes to the body.
 */
__attribute__((target("avx2"))) static bool
floats_finite_avx2(const float *v, size_t n)
{
	const __m256i exp = _mm256_set1_epi32(0x7f800000);
	__m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i a = _mm256_and_si256(
		    _mm256_loadu_si256((const __m256i *)(const void *)(v + i)),
		    exp);
		__m256i b = _mm256_and_si256(
		    _mm256_loadu_si256(
			(const __m256i *)(const void *)(v + i + 8)),
		    exp);

		acc0 = _mm256_or_si256(acc0, _mm256_cmpeq_epi32(a, exp));
		acc1 = _mm256_or_si256(acc1, _mm256_cmpeq_epi32(b, exp));
	}
	acc0 = _mm256_or_si256(acc0, acc1);
	if (!_mm256_testz_si256(acc0, acc0))
		return false;
	/* n == 0 may come with v NULL, and NULL + 0 is undefined in C. */
	return i == n || floats_finite_body(v + i, n - i);
}

/* AVX-512F compares into mask registers: the flags are a mask. */
__attribute__((target("avx512f"))) static bool
floats_finite_avx512(const float *v, size_t n)
{
	const __m512i exp = _mm512_set1_epi32(0x7f800000);
	__mmask16 bad = 0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512i a = _mm512_and_si512(_mm512_loadu_si512(v + i), exp);
		__m512i b = _mm512_and_si512(_mm512_loadu_si512(v + i + 16),
					     exp);

		bad |= _mm512_cmpeq_epi32_mask(a, exp) |
		       _mm512_cmpeq_epi32_mask(b, exp);
	}
	if (bad)
		return false;
	return i == n || floats_finite_body(v + i, n - i);
}

bool emb_floats_finite(const float *v, size_t n)
{
	switch (vec_width()) {
	case 64: return floats_finite_avx512(v, n);
	case 32: return floats_finite_avx2(v, n);
	default: return floats_finite_body(v, n);
	}
}
#endif

/*
 * dst += src in blocks of a fixed 16 floats: -O2's vectoriser ("very
 * cheap" model) takes only loops that need no scalar tail, and left the
 * plain loop over a run-time n scalar (addss). Summing a Zipf push's
 * repeated ids was a tenth of the store's push and a quarter of the
 * client's (perf, W1). Built once more for AVX2 (AVX-512 CPUs have it
 * too), which on an AMD EPYC took the store's sums from 14 % of
 * emb_table_push's own samples to 4 %. Each element gets the same one
 * addition in every copy: the sums are bit-identical.
 */
static inline __attribute__((always_inline)) void
floats_add_body(float *restrict dst, const float *restrict src, size_t n)
{
	size_t j = 0;

	for (; j + 16 <= n; j += 16)
		for (size_t k = 0; k < 16; k++)
			dst[j + k] += src[j + k];
	for (; j < n; j++)
		dst[j] += src[j];
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void
floats_add_avx2(float *restrict dst, const float *restrict src, size_t n)
{
	floats_add_body(dst, src, n);
}

void emb_floats_add(float *restrict dst, const float *restrict src, size_t n)
{
	if (vec_width() >= 32)
		floats_add_avx2(dst, src, n);
	else
		floats_add_body(dst, src, n);
}
#else
bool emb_floats_finite(const float *v, size_t n)
{
	return floats_finite_body(v, n);
}

void emb_floats_add(float *restrict dst, const float *restrict src, size_t n)
{
	floats_add_body(dst, src, n);
}
#endif

int emb_optim_validate(const struct emb_optim_cfg *cfg)
{
	if (!cfg)
		return EMB_EBADARG;
	if (!finite_nonneg(cfg->lr) || cfg->lr == 0.0f ||
	    !finite_nonneg(cfg->weight_decay))
		return EMB_EBADOPTIM;
	switch (cfg->kind) {
	case EMB_OPTIM_SGD:
		return 0;
	case EMB_OPTIM_ADAGRAD:
	case EMB_OPTIM_ROWWISE_ADAGRAD:
		if (!finite_nonneg(cfg->initial_accumulator) ||
		    !good_eps(cfg->eps))
			return EMB_EBADOPTIM;
		return 0;
	case EMB_OPTIM_ADAM:
		if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) ||
		    !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f) ||
		    !good_eps(cfg->eps))
			return EMB_EBADOPTIM;
		return 0;
	case EMB_OPTIM_FTRL:
		if (!finite_nonneg(cfg->ftrl_beta) || !finite_nonneg(cfg->l1) ||
		    !finite_nonneg(cfg->l2))
			return EMB_EBADOPTIM;
		return 0;
	default:
		return EMB_EBADOPTIM;
	}
}

uint32_t emb_optim_state_floats(uint32_t kind, uint32_t dim)
{
	switch (kind) {
	case EMB_OPTIM_SGD:
		return 0;
	case EMB_OPTIM_ADAGRAD:
		return dim;
	case EMB_OPTIM_ADAM:
		return 2 * dim + 1;
	case EMB_OPTIM_FTRL:
		return 2 * dim;
	case EMB_OPTIM_ROWWISE_ADAGRAD:
		return 1;
	default:
		return 0;
	}
}

void emb_optim_state_init(const struct emb_optim_cfg *cfg, float *state,
			  uint32_t dim)
{
	uint32_t n = emb_optim_state_floats(cfg->kind, dim);

	if (cfg->kind == EMB_OPTIM_ADAGRAD) {
		for (uint32_t i = 0; i < dim; i++)
			state[i] = cfg->initial_accumulator;
		return;
	}
	if (cfg->kind == EMB_OPTIM_ROWWISE_ADAGRAD) {
		state[0] = cfg->initial_accumulator;
		return;
	}
	if (n)
		memset(state, 0, n * sizeof(*state));
}

/*
 * w -= lr * (g + wd * w), in blocks of a fixed 16 floats that the -O2
 * vectoriser takes (see floats_finite_body()): the baseline copy (SSE2),
 * and the tail of the AVX-512 and AVX2 copies below. Without contraction
 * (-ffp-contract=off for every compiler, meson.build; clang would fuse
 * these into FMAs in the AVX-512 copy) every element gets the same
 * multiply and subtract in every copy,
 * so the rows are bit-identical on every x86-64. The plain loop stayed
 * scalar: three of every five instructions of a Zipf SGD push
 * (callgrind). True when every weight it wrote is finite.
 */
static inline __attribute__((always_inline)) bool
sgd_body(float lr, float wd, float *restrict w, const float *restrict g,
	 uint32_t dim)
{
	/* The finiteness of the result, folded in: x - x is 0 for a finite
	 * x and NaN for an infinite or NaN one (C11 without fast-math keeps
	 * it), so one subtract and add per vector flags the row, where a
	 * second pass over it was 65 instructions a dim-64 row (callgrind). */
	float chk[16] = {0};
	float bad = 0.0f;
	size_t i = 0;

	/* size_t offsets: with 32-bit ones (which may wrap) GCC kept the
	 * blocks scalar. */
	if (wd == 0.0f) {
		for (; i + 16 <= dim; i += 16) {
			float *restrict wb = w + i;
			const float *restrict gb = g + i;

			for (size_t k = 0; k < 16; k++) {
				wb[k] -= lr * gb[k];
				chk[k] += wb[k] - wb[k];
			}
		}
		for (; i < dim; i++) {
			w[i] -= lr * g[i];
			bad += w[i] - w[i];
		}
	} else {
		for (; i + 16 <= dim; i += 16) {
			float *restrict wb = w + i;
			const float *restrict gb = g + i;

			for (size_t k = 0; k < 16; k++) {
				wb[k] -= lr * (gb[k] + wd * wb[k]);
				chk[k] += wb[k] - wb[k];
			}
		}
		for (; i < dim; i++) {
			w[i] -= lr * (g[i] + wd * w[i]);
			bad += w[i] - w[i];
		}
	}
	for (size_t k = 0; k < 16; k++)
		bad += chk[k];
	return bad == bad;
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * The vector copies, with intrinsics so that the check stays in a
 * register: written for the vectoriser, the check's accumulator was kept
 * on the stack and summed in order at the end (78 instructions a dim-64
 * row against 32 without it). The same multiply and subtract (and add
 * for decay) in the same order as sgd_body(): bit-identical rows. NAME
 * for ISA, W floats a step in V, intrinsics P; NAN_ANY(c) is true when a
 * lane of c is NaN. sgd_body() finishes the row from i.
 */
#define SGD_COPY(NAME, ISA, V, P, W, NAN_ANY)                                 \
	__attribute__((target(ISA))) static bool NAME(                        \
	    float lr_, float wd_, float *restrict w,                          \
	    const float *restrict g, uint32_t dim)                            \
	{                                                                     \
		const V lr = P##_set1_ps(lr_);                                \
		const V wd = P##_set1_ps(wd_);                                \
		V chk = P##_setzero_ps();                                     \
		uint32_t i = 0;                                               \
                                                                              \
		if (wd_ == 0.0f) {                                            \
			for (; i + W <= dim; i += W) {                        \
				V x = P##_sub_ps(                             \
				    P##_loadu_ps(w + i),                      \
				    P##_mul_ps(lr, P##_loadu_ps(g + i)));     \
				P##_storeu_ps(w + i, x);                      \
				chk = P##_add_ps(chk, P##_sub_ps(x, x));      \
			}                                                     \
		} else {                                                      \
			for (; i + W <= dim; i += W) {                        \
				V wi = P##_loadu_ps(w + i);                   \
				V x = P##_sub_ps(                             \
				    wi,                                       \
				    P##_mul_ps(lr,                            \
					       P##_add_ps(P##_loadu_ps(g + i), \
							  P##_mul_ps(wd, wi)))); \
				P##_storeu_ps(w + i, x);                      \
				chk = P##_add_ps(chk, P##_sub_ps(x, x));      \
			}                                                     \
		}                                                             \
		if (NAN_ANY(chk))                                             \
			return false;                                         \
		return i == dim ||                                            \
		       sgd_body(lr_, wd_, w + i, g + i, dim - i);             \
	}

#define NAN_ANY_512(c) (_mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q) != 0)
#define NAN_ANY_256(c) (_mm256_movemask_ps(_mm256_cmp_ps(c, c, _CMP_UNORD_Q)) != 0)
SGD_COPY(sgd_avx512, "avx512f", __m512, _mm512, 16, NAN_ANY_512)
SGD_COPY(sgd_avx2, "avx2", __m256, _mm256, 8, NAN_ANY_256)
#undef SGD_COPY
#undef NAN_ANY_512
#undef NAN_ANY_256
#endif

static bool apply_sgd(const struct emb_optim_cfg *cfg, float *restrict w,
		      const float *restrict g, uint32_t dim)
{
#if defined(__x86_64__) && defined(__GNUC__)
	switch (vec_width()) {
	case 64: return sgd_avx512(cfg->lr, cfg->weight_decay, w, g, dim);
	case 32: return sgd_avx2(cfg->lr, cfg->weight_decay, w, g, dim);
	}
#endif
	return sgd_body(cfg->lr, cfg->weight_decay, w, g, dim);
}

/*
 * acc += gi^2; w -= lr * gi / (sqrt(acc) + eps), with gi = g + wd * w.
 * The AVX-512 and AVX2 copies do 16 or 8 elements a step with the same
 * IEEE operations in the same order as the scalar code (multiply, add,
 * multiply, add, square root, add, multiply, divide, subtract; no
 * contraction), so rows stay bit-identical on every x86-64. Intrinsics
 * here, not blocks for the vectoriser as SGD's: each operation and its
 * order are then written in the source, not left to what a GCC version
 * makes of a loop with a square root, a division and (FTRL) a branch.
 * adagrad_tail() finishes the row from i.
 */
static inline __attribute__((always_inline)) void
adagrad_tail(const struct emb_optim_cfg *cfg, float *restrict w,
	     float *restrict acc, const float *restrict g, uint32_t i,
	     uint32_t dim)
{
	for (; i < dim; i++) {
		float gi = g[i] + cfg->weight_decay * w[i];

		acc[i] += gi * gi;
		w[i] -= cfg->lr * gi / (sqrtf(acc[i]) + cfg->eps);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * One definition for both copies: NAME built for ISA, W floats a step in
 * vectors of type V, with the intrinsics of prefix P (_mm512, _mm256).
 */
#define ADAGRAD_COPY(NAME, ISA, V, P, W)                                      \
	__attribute__((target(ISA))) static void NAME(                        \
	    const struct emb_optim_cfg *cfg, float *restrict w,               \
	    float *restrict acc, const float *restrict g, uint32_t dim)       \
	{                                                                     \
		const V wd = P##_set1_ps(cfg->weight_decay);                  \
		const V lr = P##_set1_ps(cfg->lr);                            \
		const V eps = P##_set1_ps(cfg->eps);                          \
		uint32_t i = 0;                                               \
                                                                              \
		for (; i + W <= dim; i += W) {                                \
			V wi = P##_loadu_ps(w + i);                           \
			V gi = P##_add_ps(P##_loadu_ps(g + i),                \
					  P##_mul_ps(wd, wi));                \
			V a = P##_add_ps(P##_loadu_ps(acc + i),               \
					 P##_mul_ps(gi, gi));                 \
                                                                              \
			P##_storeu_ps(acc + i, a);                            \
			P##_storeu_ps(                                        \
			    w + i,                                            \
			    P##_sub_ps(wi, P##_div_ps(P##_mul_ps(lr, gi),     \
						      P##_add_ps(             \
							  P##_sqrt_ps(a),     \
							  eps))));            \
		}                                                             \
		adagrad_tail(cfg, w, acc, g, i, dim);                         \
	}

ADAGRAD_COPY(adagrad_avx512, "avx512f", __m512, _mm512, 16)
ADAGRAD_COPY(adagrad_avx2, "avx2", __m256, _mm256, 8)
#undef ADAGRAD_COPY
#endif

static void apply_adagrad(const struct emb_optim_cfg *cfg, float *restrict w,
			  float *restrict acc, const float *restrict g,
			  uint32_t dim)
{
#if defined(__x86_64__) && defined(__GNUC__)
	switch (vec_width()) {
	case 64: adagrad_avx512(cfg, w, acc, g, dim); return;
	case 32: adagrad_avx2(cfg, w, acc, g, dim); return;
	}
#endif
	adagrad_tail(cfg, w, acc, g, 0, dim);
}

/*
 * m = b1 m + (1 - b1) gi; v = b2 v + (1 - b2) gi gi;
 * w -= step m / (sqrt(v) + epsc), with gi = g + wd * w and step, epsc the
 * row's bias-corrected rate and eps. As Adagrad's: vector copies with the
 * scalar code's IEEE operations in its order, bit-identical rows on every
 * x86-64; adam_tail() finishes the row from i.
 */
static inline __attribute__((always_inline)) void
adam_tail(const struct emb_optim_cfg *cfg, float step, float epsc,
	  float *restrict w, float *restrict m, float *restrict v,
	  const float *restrict g, uint32_t i, uint32_t dim)
{
	for (; i < dim; i++) {
		float gi = g[i] + cfg->weight_decay * w[i];

		m[i] = cfg->beta1 * m[i] + (1.0f - cfg->beta1) * gi;
		v[i] = cfg->beta2 * v[i] + (1.0f - cfg->beta2) * gi * gi;
		w[i] -= step * m[i] / (sqrtf(v[i]) + epsc);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/* As ADAGRAD_COPY: NAME for ISA, W floats a step in V, intrinsics P. */
#define ADAM_COPY(NAME, ISA, V, P, W)                                         \
	__attribute__((target(ISA))) static void NAME(                        \
	    const struct emb_optim_cfg *cfg, float step_, float epsc_,        \
	    float *restrict w, float *restrict m, float *restrict v,          \
	    const float *restrict g, uint32_t dim)                            \
	{                                                                     \
		const V wd = P##_set1_ps(cfg->weight_decay);                  \
		const V b1 = P##_set1_ps(cfg->beta1);                         \
		const V c1 = P##_set1_ps(1.0f - cfg->beta1);                  \
		const V b2 = P##_set1_ps(cfg->beta2);                         \
		const V c2 = P##_set1_ps(1.0f - cfg->beta2);                  \
		const V step = P##_set1_ps(step_);                            \
		const V epsc = P##_set1_ps(epsc_);                            \
		uint32_t i = 0;                                               \
                                                                              \
		for (; i + W <= dim; i += W) {                                \
			V wi = P##_loadu_ps(w + i);                           \
			V gi = P##_add_ps(P##_loadu_ps(g + i),                \
					  P##_mul_ps(wd, wi));                \
			V mi = P##_add_ps(P##_mul_ps(b1, P##_loadu_ps(m + i)), \
					  P##_mul_ps(c1, gi));                \
			V vi = P##_add_ps(                                    \
			    P##_mul_ps(b2, P##_loadu_ps(v + i)),              \
			    P##_mul_ps(P##_mul_ps(c2, gi), gi));              \
                                                                              \
			P##_storeu_ps(m + i, mi);                             \
			P##_storeu_ps(v + i, vi);                             \
			P##_storeu_ps(                                        \
			    w + i,                                            \
			    P##_sub_ps(wi, P##_div_ps(P##_mul_ps(step, mi),   \
						      P##_add_ps(             \
							  P##_sqrt_ps(vi),    \
							  epsc))));           \
		}                                                             \
		adam_tail(cfg, step_, epsc_, w, m, v, g, i, dim);             \
	}

ADAM_COPY(adam_avx512, "avx512f", __m512, _mm512, 16)
ADAM_COPY(adam_avx2, "avx2", __m256, _mm256, 8)
#undef ADAM_COPY
#endif

static void apply_adam(const struct emb_optim_cfg *cfg, float *restrict w,
		       float *restrict st, const float *restrict g,
		       uint32_t dim)
{
	float *m = st;
	float *v = st + dim;
	uint32_t t;
	double c1, c2;
	float step, epsc;

	/* Per-row step count: rows of a sparse table are updated unevenly, so
	 * bias correction must count this row's updates, not global steps. */
	memcpy(&t, &st[2 * dim], sizeof(t));
	t++;
	memcpy(&st[2 * dim], &t, sizeof(t));
	c1 = 1.0 - pow(cfg->beta1, (double)t);
	c2 = 1.0 - pow(cfg->beta2, (double)t);
	step = (float)(cfg->lr * sqrt(c2) / c1);
	/* Kingma & Ba, section 2: eps scaled into the corrected form. */
	epsc = cfg->eps * (float)sqrt(c2);
#if defined(__x86_64__) && defined(__GNUC__)
	switch (vec_width()) {
	case 64: adam_avx512(cfg, step, epsc, w, m, v, g, dim); return;
	case 32: adam_avx2(cfg, step, epsc, w, m, v, g, dim); return;
	}
#endif
	adam_tail(cfg, step, epsc, w, m, v, g, 0, dim);
}

/*
 * McMahan et al. 2013, Algorithm 1, per coordinate: with gi = g + wd * w,
 * n' = n + gi^2, sigma = (sqrt(n') - sqrt(n)) / alpha, z += gi - sigma w;
 * then w = 0 where |z| <= l1, else -(z - sgn(z) l1) / ((beta + sqrt(n'))
 * / alpha + l2). As Adam's and Adagrad's: vector copies with the scalar
 * code's operations in its order (the branch as a compare and a select),
 * bit-identical rows on every x86-64; ftrl_tail() finishes from i.
 */
static inline __attribute__((always_inline)) void
ftrl_tail(const struct emb_optim_cfg *cfg, float *restrict w,
	  float *restrict z, float *restrict n, const float *restrict g,
	  uint32_t i, uint32_t dim)
{
	const float alpha = cfg->lr;

	for (; i < dim; i++) {
		float gi = g[i] + cfg->weight_decay * w[i];
		float n_new = n[i] + gi * gi;
		float sigma = (sqrtf(n_new) - sqrtf(n[i])) / alpha;
		float zi;

		z[i] += gi - sigma * w[i];
		n[i] = n_new;
		zi = z[i];
		if (fabsf(zi) <= cfg->l1) {
			w[i] = 0.0f;
		} else {
			float sgn = zi < 0.0f ? -1.0f : 1.0f;

			w[i] =
			    -(zi - sgn * cfg->l1) /
			    ((cfg->ftrl_beta + sqrtf(n_new)) / alpha + cfg->l2);
		}
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * As ADAM_COPY, with the ISA's compare and select: SMALL(z, l1) is the
 * mask of |z| <= l1, NEG(z) of z < 0, SEL(m, a, b) takes b where m is set,
 * FLIP(x, sign) flips x's sign bit (AVX-512F has no float xor).
 * sgn(z) l1 is -l1 or l1 exactly, and the negation flips the sign bit, as
 * the scalar code's do.
 */
#define FTRL_COPY(NAME, ISA, V, P, W, SMALL, NEG, SEL, FLIP)                  \
	__attribute__((target(ISA))) static void NAME(                        \
	    const struct emb_optim_cfg *cfg, float *restrict w,               \
	    float *restrict z, float *restrict n, const float *restrict g,    \
	    uint32_t dim)                                                     \
	{                                                                     \
		const V wd = P##_set1_ps(cfg->weight_decay);                  \
		const V alpha = P##_set1_ps(cfg->lr);                         \
		const V l1 = P##_set1_ps(cfg->l1);                            \
		const V l1n = P##_set1_ps(-cfg->l1);                          \
		const V l2 = P##_set1_ps(cfg->l2);                            \
		const V beta = P##_set1_ps(cfg->ftrl_beta);                   \
		const V zero = P##_setzero_ps();                              \
		const V sign = P##_set1_ps(-0.0f);                            \
		uint32_t i = 0;                                               \
                                                                              \
		for (; i + W <= dim; i += W) {                                \
			V wi = P##_loadu_ps(w + i);                           \
			V ni = P##_loadu_ps(n + i);                           \
			V gi = P##_add_ps(P##_loadu_ps(g + i),                \
					  P##_mul_ps(wd, wi));                \
			V nn = P##_add_ps(ni, P##_mul_ps(gi, gi));            \
			V rn = P##_sqrt_ps(nn);                               \
			V sigma = P##_div_ps(                                 \
			    P##_sub_ps(rn, P##_sqrt_ps(ni)), alpha);          \
			V zi = P##_add_ps(P##_loadu_ps(z + i),                \
					  P##_sub_ps(gi, P##_mul_ps(sigma, wi))); \
			V sl1 = SEL(NEG(zi, zero), l1, l1n);                  \
			V wn = P##_div_ps(                                    \
			    FLIP(P##_sub_ps(zi, sl1), sign),                  \
			    P##_add_ps(P##_div_ps(P##_add_ps(beta, rn),       \
						  alpha),                     \
				       l2));                                  \
                                                                              \
			P##_storeu_ps(z + i, zi);                             \
			P##_storeu_ps(n + i, nn);                             \
			P##_storeu_ps(w + i, SEL(SMALL(zi, l1), wn, zero));   \
		}                                                             \
		ftrl_tail(cfg, w, z, n, g, i, dim);                           \
	}

#define SMALL_512(z, l1) _mm512_cmp_ps_mask(_mm512_abs_ps(z), l1, _CMP_LE_OQ)
#define NEG_512(z, zero) _mm512_cmp_ps_mask(z, zero, _CMP_LT_OQ)
#define SEL_512(m, a, b) _mm512_mask_blend_ps(m, a, b)
#define FLIP_512(x, sign)                                                     \
	_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),          \
					     _mm512_castps_si512(sign)))
#define SMALL_256(z, l1)                                                      \
	_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), z), l1,         \
		      _CMP_LE_OQ)
#define NEG_256(z, zero) _mm256_cmp_ps(z, zero, _CMP_LT_OQ)
#define SEL_256(m, a, b) _mm256_blendv_ps(a, b, m)
#define FLIP_256(x, sign) _mm256_xor_ps(x, sign)
FTRL_COPY(ftrl_avx512, "avx512f", __m512, _mm512, 16, SMALL_512, NEG_512,
	  SEL_512, FLIP_512)
FTRL_COPY(ftrl_avx2, "avx2", __m256, _mm256, 8, SMALL_256, NEG_256, SEL_256,
	  FLIP_256)
#undef FTRL_COPY
#undef SMALL_512
#undef NEG_512
#undef SEL_512
#undef SMALL_256
#undef NEG_256
#undef SEL_256
#undef FLIP_512
#undef FLIP_256
#endif

static void apply_ftrl(const struct emb_optim_cfg *cfg, float *restrict w,
		       float *restrict st, const float *restrict g,
		       uint32_t dim)
{
#if defined(__x86_64__) && defined(__GNUC__)
	switch (vec_width()) {
	case 64: ftrl_avx512(cfg, w, st, st + dim, g, dim); return;
	case 32: ftrl_avx2(cfg, w, st, st + dim, g, dim); return;
	}
#endif
	ftrl_tail(cfg, w, st, st + dim, g, 0, dim);
}

/*
 * Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD), with gi = g + wd * w:
 * acc += (sum of gi^2) / dim, then w -= step * gi with step = lr /
 * (sqrt(acc) + eps): one square root and one division a row, where
 * Adagrad has one of each per element. Two passes over the row, the sum
 * and then the update; w does not change before the second, so both see
 * the same gi.
 *
 * The other optimizers are element-wise, and their vector copies match
 * the scalar code by doing each element's operations in its order. A sum
 * is not: its order is fixed here by dim alone, so that every copy gives
 * the same bits. Lane k of RW_LANES partial sums adds the squares of the
 * elements i = k mod RW_LANES of the whole blocks, block by block (one
 * AVX-512 vector, two AVX2 ones, or the scalar loop's array); rw_fold()
 * then adds the lanes pairwise in one order, and the tail's squares are
 * added after, in turn.
 */
#define RW_LANES 16

static inline __attribute__((always_inline)) float rw_fold(float *p)
{
	for (uint32_t h = RW_LANES / 2; h; h /= 2) {
		for (uint32_t k = 0; k < h; k++)
			p[k] += p[k + h];
	}
	return p[0];
}

/* sum plus the squares of gi for i in [i, dim), in turn. */
static inline __attribute__((always_inline)) float
rw_sumsq_tail(float wd, const float *restrict w, const float *restrict g,
	      float sum, uint32_t i, uint32_t dim)
{
	for (; i < dim; i++) {
		float gi = g[i] + wd * w[i];

		sum += gi * gi;
	}
	return sum;
}

/* The sum of squares: blocks of a fixed RW_LANES for the vectoriser. */
static inline __attribute__((always_inline)) float
rw_sumsq_body(float wd, const float *restrict w, const float *restrict g,
	      uint32_t dim)
{
	float p[RW_LANES] = {0};
	size_t i = 0;

	for (; i + RW_LANES <= dim; i += RW_LANES) {
		const float *restrict wb = w + i;
		const float *restrict gb = g + i;

		for (size_t k = 0; k < RW_LANES; k++) {
			float gi = gb[k] + wd * wb[k];

			p[k] += gi * gi;
		}
	}
	return rw_sumsq_tail(wd, w, g, rw_fold(p), (uint32_t)i, dim);
}

/* w -= step * (g + wd * w) for i in [i, dim). */
static inline __attribute__((always_inline)) void
rw_update_tail(float step, float wd, float *restrict w,
	       const float *restrict g, uint32_t i, uint32_t dim)
{
	for (; i < dim; i++)
		w[i] -= step * (g[i] + wd * w[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * As ADAGRAD_COPY: NAME##_sumsq and NAME##_update built for ISA, W floats
 * a step in V, intrinsics P; RW_LANES / W vectors of partial sums, each
 * lane the scalar loop's lane of the same number.
 */
#define RW_COPY(NAME, ISA, V, P, W)                                           \
	__attribute__((target(ISA))) static float NAME##_sumsq(               \
	    float wd_, const float *restrict w, const float *restrict g,      \
	    uint32_t dim)                                                     \
	{                                                                     \
		const V wd = P##_set1_ps(wd_);                                \
		V s[RW_LANES / W];                                            \
		float p[RW_LANES];                                            \
		uint32_t i = 0;                                               \
                                                                              \
		for (uint32_t k = 0; k < RW_LANES / W; k++)                   \
			s[k] = P##_setzero_ps();                              \
		for (; i + RW_LANES <= dim; i += RW_LANES) {                  \
			for (uint32_t k = 0; k < RW_LANES / W; k++) {         \
				const uint32_t j = i + k * W;                 \
				V gi = P##_add_ps(                            \
				    P##_loadu_ps(g + j),                      \
				    P##_mul_ps(wd, P##_loadu_ps(w + j)));     \
                                                                              \
				s[k] = P##_add_ps(s[k], P##_mul_ps(gi, gi));  \
			}                                                     \
		}                                                             \
		for (uint32_t k = 0; k < RW_LANES / W; k++)                   \
			P##_storeu_ps(p + k * W, s[k]);                       \
		return rw_sumsq_tail(wd_, w, g, rw_fold(p), i, dim);          \
	}                                                                     \
                                                                              \
	__attribute__((target(ISA))) static void NAME##_update(               \
	    float step_, float wd_, float *restrict w,                        \
	    const float *restrict g, uint32_t dim)                            \
	{                                                                     \
		const V step = P##_set1_ps(step_);                            \
		const V wd = P##_set1_ps(wd_);                                \
		uint32_t i = 0;                                               \
                                                                              \
		for (; i + W <= dim; i += W) {                                \
			V wi = P##_loadu_ps(w + i);                           \
			V gi = P##_add_ps(P##_loadu_ps(g + i),                \
					  P##_mul_ps(wd, wi));                \
                                                                              \
			P##_storeu_ps(w + i,                                  \
				      P##_sub_ps(wi, P##_mul_ps(step, gi)));  \
		}                                                             \
		rw_update_tail(step_, wd_, w, g, i, dim);                     \
	}

RW_COPY(rw_avx512, "avx512f", __m512, _mm512, 16)
RW_COPY(rw_avx2, "avx2", __m256, _mm256, 8)
#undef RW_COPY
#endif

static void apply_rowwise_adagrad(const struct emb_optim_cfg *cfg,
				  float *restrict w, float *restrict acc,
				  const float *restrict g, uint32_t dim)
{
	const float wd = cfg->weight_decay;
	float sum, step;
#if defined(__x86_64__) && defined(__GNUC__)
	const unsigned width = vec_width();

	switch (width) {
	case 64: sum = rw_avx512_sumsq(wd, w, g, dim); break;
	case 32: sum = rw_avx2_sumsq(wd, w, g, dim); break;
	default: sum = rw_sumsq_body(wd, w, g, dim); break;
	}
#else
	sum = rw_sumsq_body(wd, w, g, dim);
#endif
	/* A sum of 0 leaves the row as it is. For a zero gradient that is
	 * the update (acc + 0, w - step * 0), less its NaN of inf * 0 when
	 * acc is 0 and lr / eps overflows a float; the only other such sum
	 * is of a gradient under 4e-23 throughout (squares underflow), whose
	 * mean square fp32 cannot hold either. */
	if (sum == 0.0f)
		return;
	acc[0] += sum / (float)dim;
	step = cfg->lr / (sqrtf(acc[0]) + cfg->eps);
#if defined(__x86_64__) && defined(__GNUC__)
	switch (width) {
	case 64: rw_avx512_update(step, wd, w, g, dim); return;
	case 32: rw_avx2_update(step, wd, w, g, dim); return;
	}
#endif
	rw_update_tail(step, wd, w, g, 0, dim);
}

bool emb_optim_apply_row(const struct emb_optim_cfg *cfg, float *w,
			 const float *g, uint32_t dim)
{
	float *state = w + dim;

	switch (cfg->kind) {
	case EMB_OPTIM_SGD:
		return apply_sgd(cfg, w, g, dim);
	case EMB_OPTIM_ADAGRAD:
		apply_adagrad(cfg, w, state, g, dim);
		return emb_floats_finite(w, 2 * (size_t)dim);
	case EMB_OPTIM_ADAM:
		/* w, m and v lie together; t (a uint32) follows them. */
		apply_adam(cfg, w, state, g, dim);
		return emb_floats_finite(w, 3 * (size_t)dim);
	case EMB_OPTIM_FTRL:
		apply_ftrl(cfg, w, state, g, dim);
		return emb_floats_finite(w, 3 * (size_t)dim);
	case EMB_OPTIM_ROWWISE_ADAGRAD:
		apply_rowwise_adagrad(cfg, w, state, g, dim);
		return emb_floats_finite(w, (size_t)dim + 1);
	default:
		return true;
	}
}

void emb_optim_apply(const struct emb_optim_cfg *cfg, float *w, float *state,
		     const float *g, uint32_t dim)
{
	switch (cfg->kind) {
	case EMB_OPTIM_SGD:
		apply_sgd(cfg, w, g, dim);
		break;
	case EMB_OPTIM_ADAGRAD:
		apply_adagrad(cfg, w, state, g, dim);
		break;
	case EMB_OPTIM_ADAM:
		apply_adam(cfg, w, state, g, dim);
		break;
	case EMB_OPTIM_FTRL:
		apply_ftrl(cfg, w, state, g, dim);
		break;
	case EMB_OPTIM_ROWWISE_ADAGRAD:
		apply_rowwise_adagrad(cfg, w, state, g, dim);
		break;
	default:
		break;
	}
}

const char *emb_optim_name(uint32_t kind)
{
	switch (kind) {
	case EMB_OPTIM_SGD:
		return "sgd";
	case EMB_OPTIM_ADAGRAD:
		return "adagrad";
	case EMB_OPTIM_ADAM:
		return "adam";
	case EMB_OPTIM_FTRL:
		return "ftrl";
	case EMB_OPTIM_ROWWISE_ADAGRAD:
		return "rowwise_adagrad";
	default:
		return "?";
	}
}

static int parse_kv(struct emb_optim_cfg *c, const char *key, size_t klen,
		    float v)
{
	static const struct {
		const char *name;
		size_t off;
	} keys[] = {
	    {"lr", offsetof(struct emb_optim_cfg, lr)},
	    {"alpha", offsetof(struct emb_optim_cfg, lr)},
	    {"wd", offsetof(struct emb_optim_cfg, weight_decay)},
	    {"acc", offsetof(struct emb_optim_cfg, initial_accumulator)},
	    {"beta1", offsetof(struct emb_optim_cfg, beta1)},
	    {"beta2", offsetof(struct emb_optim_cfg, beta2)},
	    {"eps", offsetof(struct emb_optim_cfg, eps)},
	    {"beta", offsetof(struct emb_optim_cfg, ftrl_beta)},
	    {"l1", offsetof(struct emb_optim_cfg, l1)},
	    {"l2", offsetof(struct emb_optim_cfg, l2)},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (strlen(keys[i].name) == klen &&
		    memcmp(keys[i].name, key, klen) == 0) {
			memcpy((char *)c + keys[i].off, &v, sizeof(v));
			return 0;
		}
	}
	return EMB_EBADOPTIM;
}

int emb_optim_parse(const char *s, struct emb_optim_cfg *out)
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;
	const char *p, *colon;
	size_t nlen;
	uint32_t k;

	if (!s || !out)
		return EMB_EBADARG;
	colon = strchr(s, ':');
	nlen = colon ? (size_t)(colon - s) : strlen(s);
	c.kind = 0;
	for (k = EMB_OPTIM_SGD; k <= EMB_OPTIM_ROWWISE_ADAGRAD; k++) {
		if (strlen(emb_optim_name(k)) == nlen &&
		    memcmp(emb_optim_name(k), s, nlen) == 0)
			c.kind = k;
	}
	if (!c.kind)
		return EMB_EBADOPTIM;
	if (c.kind == EMB_OPTIM_FTRL)
		c.lr = 0.05f;
	for (p = colon ? colon + 1 : NULL; p && *p;) {
		const char *eq = strchr(p, '=');
		const char *end = strchr(p, ',');
		char *num_end;
		float v;

		if (!end)
			end = p + strlen(p);
		if (!eq || eq > end)
			return EMB_EBADOPTIM;
		v = strtof(eq + 1, &num_end);
		if (num_end != end)
			return EMB_EBADOPTIM;
		if (parse_kv(&c, p, (size_t)(eq - p), v))
			return EMB_EBADOPTIM;
		p = *end ? end + 1 : end;
	}
	if (emb_optim_validate(&c))
		return EMB_EBADOPTIM;
	*out = c;
	return 0;
}
