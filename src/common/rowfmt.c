/*
 * src/common/rowfmt.c - the row formats' conversions (rowfmt.h): a scalar
 * reference in integer arithmetic, and vector bodies (F16C/AVX2/FMA and
 * AVX-512) picked per call that give the same bits. Pure functions; any
 * thread may call them (emb__rowfmt_vec_max is a knob for tests).
 *
 * fp16 and bf16 round in integers, and the vectors' conversions take
 * their rounding mode from the instruction, not from MXCSR. The float
 * arithmetic left (int8, and p of stochastic fp16) is the same IEEE
 * operations in the same order in every body (C11 does not contract
 * a * b + c), so the bodies agree bit for bit in any rounding mode; the
 * values documented are those of the default, round to nearest.
 */
#include "common/rowfmt.h"

#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/target.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROWFMT_X86 1
#else
#define ROWFMT_X86 0
#endif

unsigned emb__rowfmt_vec_max = 64;

/* |x|'s bits above these are refused: the largest finite fp16 (65504) and
 * bf16 (0x7f7f0000) as binary32. NaN and Inf lie above both. */
#define FP16_MAX_BITS 0x477fe000u
#define BF16_MAX_BITS 0x7f7f0000u
#define ABS_MASK      0x7fffffffu
#define EXP_MASK      0x7f800000u

/* 1.5 * 2^23: v + MAGIC - MAGIC is v rounded to an integer, ties to even,
 * for 0 <= v < 2^22 (the int8 codes). */
#define MAGIC 12582912.0f

static inline uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint16_t load16(const unsigned char *p)
{
	return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline void store16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

const char *emb_rowfmt_name(uint32_t f)
{
	switch (f) {
	case EMB_ROWFMT_FP32:
		return "fp32";
	case EMB_ROWFMT_FP16:
		return "fp16";
	case EMB_ROWFMT_BF16:
		return "bf16";
	case EMB_ROWFMT_INT8:
		return "int8";
	}
	return "?";
}

int emb_rowfmt_parse(const char *s, uint32_t *out)
{
	static const struct {
		const char *name;
		uint32_t f;
	} names[] = {
	    {"fp32", EMB_ROWFMT_FP32}, {"float32", EMB_ROWFMT_FP32},
	    {"fp16", EMB_ROWFMT_FP16}, {"float16", EMB_ROWFMT_FP16},
	    {"bf16", EMB_ROWFMT_BF16}, {"bfloat16", EMB_ROWFMT_BF16},
	    {"int8", EMB_ROWFMT_INT8},
	};

	if (!s || !out)
		return EMB_EBADARG;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(s, names[i].name) == 0) {
			*out = names[i].f;
			return 0;
		}
	}
	return EMB_EBADARG;
}

/* Tier modes live beside row formats: both are a table's layout on a
 * server, named the same way in flags and in Python. */
static const char *const tier_modes[EMB_TIER_MODE_COUNT] = {"auto", "off",
							     "on"};

const char *emb_tier_mode_name(uint32_t m)
{
	return m < EMB_TIER_MODE_COUNT ? tier_modes[m] : "?";
}

int emb_tier_mode_parse(const char *s, uint32_t *out)
{
	if (!s || !out)
		return EMB_EBADARG;
	for (uint32_t m = 0; m < EMB_TIER_MODE_COUNT; m++) {
		if (strcmp(s, tier_modes[m]) == 0) {
			*out = m;
			return 0;
		}
	}
	return EMB_EBADARG;
}

/* MurmurHash3's finalisers: bijections that spread every input bit
 * (fmix64 is common/hash.h's emb_id_hash()). */
static inline uint32_t fmix32(uint32_t h)
{
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

/*
 * fmix64(fmix64(fmix64(seed + golden) ^ id) ^ count): each stage is a
 * bijection of the last one's output and the new input, so for one seed
 * two writes (id, count) share a key only by a 64-bit collision. The
 * golden-ratio offset keeps seed 0, id 0, count 0 off fmix64's fixed
 * point 0. Part of the stored data's meaning: replicas and reruns must
 * agree, so it never changes.
 */
uint64_t emb_rowfmt_sr_key(uint64_t seed, uint64_t id, uint32_t count)
{
	uint64_t k = emb_id_hash(seed + 0x9e3779b97f4a7c15ull);

	k = emb_id_hash(k ^ id);
	return emb_id_hash(k ^ count);
}

/*
 * The 32 random bits of value i under key: fmix32(fmix32(i * golden +
 * key's low half) ^ key's high half). 32-bit lanes only, so a vector body
 * draws 8 or 16 at once; i * golden is a bijection of i, so the values of
 * one row never share bits. Callers use the top 24 (u = (h >> 8) * 2^-24).
 */
static inline uint32_t sr_hash(uint64_t key, uint32_t i)
{
	uint32_t h = fmix32(i * 0x9e3779b9u + (uint32_t)key);

	return fmix32(h ^ (uint32_t)(key >> 32));
}

static inline float sr_unit(uint32_t h)
{
	return (float)(h >> 8) * 0x1p-24f;
}

float emb_fp16_to_fp32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0) /* zero or subnormal: m * 2^-24, exact in binary32 */
		return u2f(f2u((float)m * 0x1p-24f) | sign);
	if (e == 31) /* Inf, or NaN made quiet as F16C's vcvtph2ps does */
		return u2f(sign | EXP_MASK | m << 13 | (m ? 0x400000u : 0));
	return u2f(sign | (e + 112) << 23 | m << 13);
}

float emb_bf16_to_fp32(uint16_t b)
{
	return u2f((uint32_t)b << 16);
}

/*
 * |x| (bits a, at most FP16_MAX_BITS) in fp16, rounded to nearest even
 * (near) or toward zero.
 */
static inline uint16_t fp16_mag(uint32_t a, bool near)
{
	uint32_t e = a >> 23;
	uint32_t m, shift, q, rem, half;

	if (e >= 113) { /* fp16 normal: rebias the exponent by 127 - 15 */
		if (near)
			a += 0xfffu + ((a >> 13) & 1);
		return (uint16_t)((a - (112u << 23)) >> 13);
	}
	/* fp16 subnormal or zero: |x| in units of 2^-24 is m * 2^(e - 126)
	 * with the implicit bit (binary32 subnormals have e 0 and weigh
	 * 2^-149, as e 1 does). */
	m = (a & 0x7fffffu) | (e ? 0x800000u : 0);
	shift = 126 - (e ? e : 1);
	if (shift > 24) /* below 2^-25: rounds to 0 either way */
		return 0;
	q = m >> shift;
	if (!near)
		return (uint16_t)q;
	rem = m & ((1u << shift) - 1);
	half = 1u << (shift - 1);
	/* A carry out of 0x3ff gives 0x400, the smallest normal: right. */
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return (uint16_t)q;
}

uint16_t emb_fp32_to_fp16(float x, bool *ok)
{
	uint32_t u = f2u(x);
	uint32_t a = u & ABS_MASK;

	if (a > FP16_MAX_BITS) {
		*ok = false;
		return 0;
	}
	*ok = true;
	return (uint16_t)((u >> 16 & 0x8000u) | fp16_mag(a, true));
}

uint16_t emb_fp32_to_bf16(float x, bool *ok)
{
	uint32_t u = f2u(x);

	if ((u & ABS_MASK) > BF16_MAX_BITS) {
		*ok = false;
		return 0;
	}
	*ok = true;
	/* Below the refusal bound the carry never reaches the sign. */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/*
 * Stochastic fp16: lo is x toward zero, hi the next fp16 away from zero;
 * p = (|x| - |lo|) / (|hi| - |lo|) is exact in binary32 (the difference is
 * x's dropped low bits, the divisor a power of two, or Inf above 65504,
 * where x == lo and p is 0). hi when u < p.
 */
static inline uint16_t fp16_sr(uint32_t u, uint32_t h)
{
	uint32_t a = u & ABS_MASK;
	uint16_t lo = (uint16_t)((u >> 16 & 0x8000u) | fp16_mag(a, false));
	uint16_t hi = (uint16_t)(lo + 1);
	float flo = fabsf(emb_fp16_to_fp32(lo));
	float fhi = fabsf(emb_fp16_to_fp32(hi));
	float p = (u2f(a) - flo) / (fhi - flo);

	return sr_unit(h) < p ? hi : lo;
}

/*
 * Stochastic bf16: lo is x's high half (toward zero), hi the next pattern
 * (Inf only above the largest finite, refused). p = low half / 2^16, so
 * u < p, with u = r * 2^-24, is r < low half * 2^8 in integers.
 */
static inline uint16_t bf16_sr(uint32_t u, uint32_t h)
{
	uint32_t lo = u >> 16;

	return (uint16_t)((h >> 8) < (u & 0xffffu) << 8 ? lo + 1 : lo);
}

/* ---- scalar bodies ---------------------------------------------------- */

static void dec_fp16_scalar(const unsigned char *s, float *d, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		d[i] = emb_fp16_to_fp32(load16(s + 2 * i));
}

static void dec_bf16_scalar(const unsigned char *s, float *d, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		d[i] = emb_bf16_to_fp32(load16(s + 2 * i));
}

static void dec_int8_scalar(const unsigned char *q, float scale, float bias,
			    float *d, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		d[i] = fmaf((float)q[i], scale, bias);
}

/* Values i0..n of the row (i0: where a vector body stopped). */
static bool enc_fp16_scalar(const float *s, unsigned char *d, uint32_t i0,
			    uint32_t n, enum emb_round round, uint64_t key)
{
	uint32_t bad = 0;

	for (uint32_t i = i0; i < n; i++) {
		uint32_t u = f2u(s[i]);
		uint16_t h;

		if ((u & ABS_MASK) > FP16_MAX_BITS) {
			bad = 1; /* the row is refused: write anything */
			u = 0;
		}
		if (round == EMB_ROUND_STOCHASTIC)
			h = fp16_sr(u, sr_hash(key, i));
		else
			h = (uint16_t)((u >> 16 & 0x8000u) |
				       fp16_mag(u & ABS_MASK, true));
		store16(d + 2 * i, h);
	}
	return !bad;
}

static bool enc_bf16_scalar(const float *s, unsigned char *d, uint32_t i0,
			    uint32_t n, enum emb_round round, uint64_t key)
{
	uint32_t bad = 0;

	for (uint32_t i = i0; i < n; i++) {
		uint32_t u = f2u(s[i]);
		uint16_t h;

		if ((u & ABS_MASK) > BF16_MAX_BITS) {
			bad = 1; /* the row is refused: write anything */
			u = 0;
		}
		if (round == EMB_ROUND_STOCHASTIC)
			h = bf16_sr(u, sr_hash(key, i));
		else
			h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
		store16(d + 2 * i, h);
	}
	return !bad;
}

/* An int8 row's scale, bias and 1 / scale, from its min and max. */
struct int8_par {
	float scale;
	float bias;
	float inv;
};

/*
 * From the row's min and max (signed zeros made +0, so that the order a
 * body reduced in cannot show in the bits); false when max - min is Inf.
 * inv may be Inf for a subnormal scale: int8_code() then maps the row's
 * min (0 * Inf, NaN) to 0 and the rest to 255.
 */
static inline bool int8_params(float mn, float mx, struct int8_par *p)
{
	float range;

	mn += 0.0f;
	mx += 0.0f;
	range = mx - mn;
	if ((f2u(range) & EXP_MASK) == EXP_MASK)
		return false;
	p->scale = range / 255.0f;
	p->bias = mn;
	p->inv = p->scale > 0.0f ? 1.0f / p->scale : 0.0f;
	return true;
}

/* An int8 row's header: f32 scale, then f32 bias. */
static inline void put_int8_par(unsigned char *d, const struct int8_par *p)
{
	memcpy(d, &p->scale, sizeof(p->scale));
	memcpy(d + 4, &p->bias, sizeof(p->bias));
}

/* x's code: the operations, in this order, of the vector bodies too. */
static inline uint8_t int8_code(float x, const struct int8_par *p,
				enum emb_round round, uint32_t h)
{
	float v = (x - p->bias) * p->inv;

	v = v > 0.0f ? v : 0.0f; /* NaN to 0, as maxps(v, 0) */
	v = v < 255.0f ? v : 255.0f;
	if (round == EMB_ROUND_STOCHASTIC) {
		uint32_t q = (uint32_t)(v + sr_unit(h)); /* floor: v >= 0 */

		return (uint8_t)(q < 255 ? q : 255);
	}
	return (uint8_t)(uint32_t)(v + MAGIC - MAGIC);
}

/* Min and max of s[0..n) and *mn, *mx (the caller starts them at a value
 * of the row), false when a value is not finite. */
static inline bool minmax_scalar(const float *s, uint32_t n, float *mn,
				 float *mx)
{
	float lo = *mn, hi = *mx;
	uint32_t bad = 0;

	for (uint32_t i = 0; i < n; i++) {
		float x = s[i];

		bad |= (f2u(x) & EXP_MASK) == EXP_MASK;
		lo = x < lo ? x : lo;
		hi = x > hi ? x : hi;
	}
	*mn = lo;
	*mx = hi;
	return !bad;
}

static inline void enc_int8_codes_scalar(const float *s, unsigned char *q,
					 uint32_t i0, uint32_t n,
					 const struct int8_par *p,
					 enum emb_round round, uint64_t key)
{
	for (uint32_t i = i0; i < n; i++)
		q[i] = int8_code(s[i], p, round,
				 round == EMB_ROUND_STOCHASTIC ? sr_hash(key, i)
							       : 0);
}

/* ---- vector bodies ----------------------------------------------------- */

/*
 * Each body does whole vectors and leaves the rest to the next narrower
 * one, down to the scalar loops; a partial vector of a decode is staged
 * through a zeroed buffer instead, one conversion for the last 1..7 values.
 * Refused values are only flagged: what a refused row's bytes hold does
 * not matter, so the vectors convert them like any other.
 *
 * F16C's vcvtph2ps is exact and quiets NaNs as emb_fp16_to_fp32() does;
 * vcvtps2ph with an immediate rounding mode ignores MXCSR's and rounds
 * binary32 subnormals as the integer code does (all to 0). AVX2 min/max
 * return their second operand on NaN, as the scalar ternaries do.
 */
#if ROWFMT_X86
#define VEC_INLINE static inline __attribute__((always_inline))

/*
 * Output past which a gather streams its stores (movntps) instead of
 * filling the caches with it: a buffer this large cannot stay cached for
 * its reader anyway, and streaming saves the read-for-ownership of every
 * line, a third of the traffic of an fp16 decode (1M rows of dim 64: 18
 * ms instead of 30, where memcpy, which streams from a similar size, took
 * 24 to 37). Every row must start 64-byte aligned: dst so, dim a multiple
 * of 16.
 */
#define STREAM_BYTES (8u << 20)

static bool streamable(const float *d, uint32_t dim, uint32_t n)
{
	return ((uintptr_t)d & 63) == 0 && dim % 16 == 0 &&
	       (size_t)n * dim * sizeof(*d) >= STREAM_BYTES;
}

EMB_TARGET_BEGIN("avx2,f16c,fma")

static const float sr_scale_v = 0x1p-24f;

/* fmix32() in 8 lanes. */
VEC_INLINE __m256i fmix32_v8(__m256i h)
{
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
	return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

/* sr_hash() of indexes idx in 8 lanes. */
VEC_INLINE __m256i sr_hash_v8(__m256i idx, uint64_t key)
{
	__m256i h = _mm256_add_epi32(
	    _mm256_mullo_epi32(idx, _mm256_set1_epi32((int)0x9e3779b9u)),
	    _mm256_set1_epi32((int)(uint32_t)key));

	h = fmix32_v8(h);
	h = _mm256_xor_si256(h, _mm256_set1_epi32((int)(uint32_t)(key >> 32)));
	return fmix32_v8(h);
}

/* 8 lanes of 0..0xffff to 8 u16. */
VEC_INLINE __m128i pack16_v8(__m256i v)
{
	return _mm_packus_epi32(_mm256_castsi256_si128(v),
				_mm256_extracti128_si256(v, 1));
}

/* 8 floats to d: streamed (nt: d 32-byte aligned) past the caches. */
VEC_INLINE void store_v8(float *d, bool nt, __m256 v)
{
	if (nt)
		_mm256_stream_ps(d, v);
	else
		_mm256_storeu_ps(d, v);
}

VEC_INLINE __m256 bf16_v8(const unsigned char *s)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(
	    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16));
}

VEC_INLINE __m256 int8_v8(const unsigned char *q, __m256 scale, __m256 bias)
{
	__m128i b = _mm_loadl_epi64((const __m128i *)q);

	return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
			       scale, bias);
}

/*
 * The last k (1..7) values of a decode, staged through a zeroed buffer:
 * one conversion, out of line so that the whole-vector loops need no
 * stack frame. q: the first value's bytes (for int8 its code).
 */
__attribute__((noinline)) static void dec_tail_v8(uint32_t f,
						  const unsigned char *q,
						  float scale, float bias,
						  float *d, uint32_t k)
{
	unsigned char t[16] = {0};
	float o[8];
	__m256 v;

	memcpy(t, q, f == EMB_ROWFMT_INT8 ? k : 2 * k);
	if (f == EMB_ROWFMT_FP16)
		v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
	else if (f == EMB_ROWFMT_BF16)
		v = bf16_v8(t);
	else
		v = int8_v8(t, _mm256_set1_ps(scale), _mm256_set1_ps(bias));
	_mm256_storeu_ps(o, v);
	memcpy(d, o, 4 * k);
}

VEC_INLINE void dec_fp16_v8(const unsigned char *s, float *d, uint32_t i,
			    uint32_t n, bool nt)
{
	for (; i + 8 <= n; i += 8)
		store_v8(d + i, nt,
			 _mm256_cvtph_ps(
			     _mm_loadu_si128((const __m128i *)(s + 2 * i))));
	if (i < n)
		dec_tail_v8(EMB_ROWFMT_FP16, s + 2 * i, 0, 0, d + i, n - i);
}

VEC_INLINE void dec_bf16_v8(const unsigned char *s, float *d, uint32_t i,
			    uint32_t n, bool nt)
{
	for (; i + 8 <= n; i += 8)
		store_v8(d + i, nt, bf16_v8(s + 2 * i));
	if (i < n)
		dec_tail_v8(EMB_ROWFMT_BF16, s + 2 * i, 0, 0, d + i, n - i);
}

VEC_INLINE void dec_int8_v8(const unsigned char *q, float scale, float bias,
			    float *d, uint32_t i, uint32_t n, bool nt)
{
	const __m256 vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias);

	for (; i + 8 <= n; i += 8)
		store_v8(d + i, nt, int8_v8(q + i, vs, vb));
	if (i < n)
		dec_tail_v8(EMB_ROWFMT_INT8, q + i, scale, bias, d + i, n - i);
}

VEC_INLINE void dec_row_v8(uint32_t f, const unsigned char *s, float *d,
			   uint32_t dim, bool nt)
{
	float scale, bias;

	switch (f) {
	case EMB_ROWFMT_FP16:
		dec_fp16_v8(s, d, 0, dim, nt);
		break;
	case EMB_ROWFMT_BF16:
		dec_bf16_v8(s, d, 0, dim, nt);
		break;
	case EMB_ROWFMT_INT8:
		memcpy(&scale, s, sizeof(scale));
		memcpy(&bias, s + 4, sizeof(bias));
		dec_int8_v8(s + 8, scale, bias, d, 0, dim, nt);
		break;
	}
}

/* One row; the common dim 64 unrolled whole (see dec_rows_avx2()). */
static void dec_row_avx2(uint32_t f, const unsigned char *s, float *d,
			 uint32_t dim)
{
	if (dim == 64)
		dec_row_v8(f, s, d, 64, false);
	else
		dec_row_v8(f, s, d, dim, false);
}

/*
 * Copies for dim 64 (the common embedding width) that the compiler
 * unrolls whole; rows of any other dim take the general loop. A large
 * gather streams its stores (see streamable()).
 */
static void dec_rows_avx2(uint32_t f, const unsigned char *s, size_t stride,
			  float *d, uint32_t dim, uint32_t n)
{
	const bool nt = streamable(d, dim, n);
	uint32_t r;

	if (dim == 64 && nt)
		for (r = 0; r < n; r++, s += stride, d += 64)
			dec_row_v8(f, s, d, 64, true);
	else if (dim == 64)
		for (r = 0; r < n; r++, s += stride, d += 64)
			dec_row_v8(f, s, d, 64, false);
	else if (nt)
		for (r = 0; r < n; r++, s += stride, d += dim)
			dec_row_v8(f, s, d, dim, true);
	else
		for (r = 0; r < n; r++, s += stride, d += dim)
			dec_row_v8(f, s, d, dim, false);
	if (nt)
		_mm_sfence(); /* the streamed rows before the caller's next
				 store */
}

/* fp16 from value *i on, while 8 remain; *i is where it stopped. The
 * flag is true when nothing was refused. */
VEC_INLINE bool enc_fp16_v8(const float *s, unsigned char *d, uint32_t *pi,
			    uint32_t n, enum emb_round round, uint64_t key)
{
	const __m256i absm = _mm256_set1_epi32((int)ABS_MASK);
	const __m256i maxb = _mm256_set1_epi32((int)FP16_MAX_BITS);
	__m256i bad = _mm256_setzero_si256();
	__m256i idx =
	    _mm256_add_epi32(_mm256_set1_epi32((int)*pi),
			     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	uint32_t i = *pi;

	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(s + i);
		__m256i a = _mm256_and_si256(_mm256_castps_si256(x), absm);
		__m128i h, lo, up16;
		__m256 flo, fhi, p, u;
		__m256i up;

		bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(a, maxb));
		if (round != EMB_ROUND_STOCHASTIC) {
			h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
			_mm_storeu_si128((__m128i *)(d + 2 * i), h);
			continue;
		}
		/* fp16_sr(), 8 at once */
		lo = _mm256_cvtps_ph(x, _MM_FROUND_TO_ZERO);
		flo = _mm256_castsi256_ps(_mm256_and_si256(
		    _mm256_castps_si256(_mm256_cvtph_ps(lo)), absm));
		fhi = _mm256_castsi256_ps(
		    _mm256_and_si256(_mm256_castps_si256(_mm256_cvtph_ps(
					 _mm_add_epi16(lo, _mm_set1_epi16(1)))),
				     absm));
		p = _mm256_div_ps(_mm256_sub_ps(_mm256_castsi256_ps(a), flo),
				  _mm256_sub_ps(fhi, flo));
		u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(
				      sr_hash_v8(idx, key), 8)),
				  _mm256_set1_ps(sr_scale_v));
		up = _mm256_castps_si256(_mm256_cmp_ps(u, p, _CMP_LT_OQ));
		up16 = _mm_packs_epi32(_mm256_castsi256_si128(up),
				       _mm256_extracti128_si256(up, 1));
		_mm_storeu_si128((__m128i *)(d + 2 * i),
				 _mm_sub_epi16(lo, up16));
		idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
	}
	*pi = i;
	return _mm256_testz_si256(bad, bad);
}

VEC_INLINE bool enc_bf16_v8(const float *s, unsigned char *d, uint32_t *pi,
			    uint32_t n, enum emb_round round, uint64_t key)
{
	const __m256i absm = _mm256_set1_epi32((int)ABS_MASK);
	const __m256i maxb = _mm256_set1_epi32((int)BF16_MAX_BITS);
	const __m256i one = _mm256_set1_epi32(1);
	const __m256i low16 = _mm256_set1_epi32(0xffff);
	__m256i bad = _mm256_setzero_si256();
	__m256i idx =
	    _mm256_add_epi32(_mm256_set1_epi32((int)*pi),
			     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	uint32_t i = *pi;

	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i r, up;

		bad = _mm256_or_si256(
		    bad, _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), maxb));
		if (round != EMB_ROUND_STOCHASTIC) {
			r = _mm256_add_epi32(
			    _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
			    _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
			r = _mm256_srli_epi32(r, 16);
		} else { /* bf16_sr(): both sides below 2^24, signed is fine */
			up = _mm256_cmpgt_epi32(
			    _mm256_slli_epi32(_mm256_and_si256(u, low16), 8),
			    _mm256_srli_epi32(sr_hash_v8(idx, key), 8));
			r = _mm256_sub_epi32(_mm256_srli_epi32(u, 16), up);
			idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
		}
		_mm_storeu_si128((__m128i *)(d + 2 * i), pack16_v8(r));
	}
	*pi = i;
	return _mm256_testz_si256(bad, bad);
}

/* min_ps(x, m) is x < m ? x : m, as minmax_scalar()'s ternary. */
VEC_INLINE bool minmax_v8(const float *s, uint32_t *pi, uint32_t n, float *mn,
			  float *mx)
{
	const __m256i expm = _mm256_set1_epi32((int)EXP_MASK);
	__m256 lo = _mm256_set1_ps(*mn), hi = _mm256_set1_ps(*mx);
	__m256i bad = _mm256_setzero_si256();
	float l[8], h[8];
	uint32_t i = *pi;

	for (; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(s + i);
		__m256i e = _mm256_and_si256(_mm256_castps_si256(x), expm);

		bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, expm));
		lo = _mm256_min_ps(x, lo);
		hi = _mm256_max_ps(x, hi);
	}
	_mm256_storeu_ps(l, lo);
	_mm256_storeu_ps(h, hi);
	for (int k = 0; k < 8; k++) {
		*mn = l[k] < *mn ? l[k] : *mn;
		*mx = h[k] > *mx ? h[k] : *mx;
	}
	*pi = i;
	return _mm256_testz_si256(bad, bad);
}

/* int8_code() of 8 values at q. */
VEC_INLINE void codes_v8(__m256 x, const struct int8_par *p,
			 enum emb_round round, __m256i idx, uint64_t key,
			 unsigned char *q)
{
	__m256 v = _mm256_mul_ps(_mm256_sub_ps(x, _mm256_set1_ps(p->bias)),
				 _mm256_set1_ps(p->inv));
	__m256i c;
	__m128i c16;

	v = _mm256_max_ps(v, _mm256_setzero_ps());
	v = _mm256_min_ps(v, _mm256_set1_ps(255.0f));
	if (round == EMB_ROUND_STOCHASTIC) {
		__m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(
					     sr_hash_v8(idx, key), 8)),
					 _mm256_set1_ps(sr_scale_v));

		c = _mm256_cvttps_epi32(_mm256_add_ps(v, u));
		c = _mm256_min_epi32(c, _mm256_set1_epi32(255));
	} else {
		v = _mm256_add_ps(v, _mm256_set1_ps(MAGIC));
		c = _mm256_cvttps_epi32(
		    _mm256_sub_ps(v, _mm256_set1_ps(MAGIC)));
	}
	c16 = pack16_v8(c);
	_mm_storel_epi64((__m128i *)q, _mm_packus_epi16(c16, c16));
}

VEC_INLINE void enc_codes_v8(const float *s, unsigned char *q, uint32_t *pi,
			     uint32_t n, const struct int8_par *p,
			     enum emb_round round, uint64_t key)
{
	__m256i idx =
	    _mm256_add_epi32(_mm256_set1_epi32((int)*pi),
			     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	uint32_t i = *pi;

	for (; i + 8 <= n; i += 8) {
		codes_v8(_mm256_loadu_ps(s + i), p, round, idx, key, q + i);
		idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
	}
	*pi = i;
}

static bool enc_fp16_avx2(const float *s, unsigned char *d, uint32_t n,
			  enum emb_round round, uint64_t key)
{
	uint32_t i = 0;
	bool ok = enc_fp16_v8(s, d, &i, n, round, key);

	return enc_fp16_scalar(s, d, i, n, round, key) && ok;
}

static bool enc_bf16_avx2(const float *s, unsigned char *d, uint32_t n,
			  enum emb_round round, uint64_t key)
{
	uint32_t i = 0;
	bool ok = enc_bf16_v8(s, d, &i, n, round, key);

	return enc_bf16_scalar(s, d, i, n, round, key) && ok;
}

/* A whole int8 row in AVX code: the scalar steps between the vector
 * loops inlined, not calls out to SSE code and back. */
static bool enc_int8_avx2(const float *s, unsigned char *d, uint32_t n,
			  enum emb_round round, uint64_t key)
{
	struct int8_par p;
	float mn = n ? s[0] : 0.0f, mx = mn;
	uint32_t i = 0;
	bool ok = minmax_v8(s, &i, n, &mn, &mx);

	if (!minmax_scalar(s + i, n - i, &mn, &mx) || !ok ||
	    !int8_params(mn, mx, &p))
		return false;
	put_int8_par(d, &p);
	i = 0;
	enc_codes_v8(s, d + 8, &i, n, &p, round, key);
	enc_int8_codes_scalar(s, d + 8, i, n, &p, round, key);
	return true;
}
EMB_TARGET_END

/*
 * AVX-512F only (with AVX2, F16C and FMA for the narrower bodies it ends
 * with): vpmovdw and vpmovdb narrow the lanes, masks replace blends.
 */
EMB_TARGET_BEGIN("avx512f,avx2,f16c,fma")

/* fmix32() in 16 lanes. */
VEC_INLINE __m512i fmix32_v16(__m512i h)
{
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85ebca6bu));
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xc2b2ae35u));
	return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

/* sr_hash() of indexes idx in 16 lanes. */
VEC_INLINE __m512i sr_hash_v16(__m512i idx, uint64_t key)
{
	__m512i h = _mm512_add_epi32(
	    _mm512_mullo_epi32(idx, _mm512_set1_epi32((int)0x9e3779b9u)),
	    _mm512_set1_epi32((int)(uint32_t)key));

	h = fmix32_v16(h);
	h = _mm512_xor_si512(h, _mm512_set1_epi32((int)(uint32_t)(key >> 32)));
	return fmix32_v16(h);
}

VEC_INLINE __m512i idx_v16(uint32_t i)
{
	return _mm512_add_epi32(_mm512_set1_epi32((int)i),
				_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
						  10, 11, 12, 13, 14, 15));
}

VEC_INLINE __m512 sr_unit_v16(__m512i idx, uint64_t key)
{
	return _mm512_mul_ps(
	    _mm512_cvtepi32_ps(_mm512_srli_epi32(sr_hash_v16(idx, key), 8)),
	    _mm512_set1_ps(sr_scale_v));
}

VEC_INLINE void store_v16(float *d, bool nt, __m512 v)
{
	if (nt)
		_mm512_stream_ps(d, v);
	else
		_mm512_storeu_ps(d, v);
}

VEC_INLINE void dec_row_v16(uint32_t f, const unsigned char *s, float *d,
			    uint32_t dim, bool nt)
{
	uint32_t i = 0;
	float scale, bias;
	__m512 vs, vb;

	switch (f) {
	case EMB_ROWFMT_FP16:
		for (; i + 16 <= dim; i += 16)
			store_v16(d + i, nt,
				  _mm512_cvtph_ps(_mm256_loadu_si256(
				      (const __m256i *)(s + 2 * i))));
		dec_fp16_v8(s, d, i, dim, nt);
		break;
	case EMB_ROWFMT_BF16:
		for (; i + 16 <= dim; i += 16)
			store_v16(d + i, nt,
				  _mm512_castsi512_ps(_mm512_slli_epi32(
				      _mm512_cvtepu16_epi32(_mm256_loadu_si256(
					  (const __m256i *)(s + 2 * i))),
				      16)));
		dec_bf16_v8(s, d, i, dim, nt);
		break;
	case EMB_ROWFMT_INT8:
		memcpy(&scale, s, sizeof(scale));
		memcpy(&bias, s + 4, sizeof(bias));
		vs = _mm512_set1_ps(scale);
		vb = _mm512_set1_ps(bias);
		for (; i + 16 <= dim; i += 16) {
			__m128i b =
			    _mm_loadu_si128((const __m128i *)(s + 8 + i));

			store_v16(d + i, nt,
				  _mm512_fmadd_ps(_mm512_cvtepi32_ps(
						      _mm512_cvtepu8_epi32(b)),
						  vs, vb));
		}
		dec_int8_v8(s + 8, scale, bias, d, i, dim, nt);
		break;
	}
}

static void dec_row_avx512(uint32_t f, const unsigned char *s, float *d,
			   uint32_t dim)
{
	if (dim == 64)
		dec_row_v16(f, s, d, 64, false);
	else
		dec_row_v16(f, s, d, dim, false);
}

static void dec_rows_avx512(uint32_t f, const unsigned char *s, size_t stride,
			    float *d, uint32_t dim, uint32_t n)
{
	const bool nt = streamable(d, dim, n);
	uint32_t r;

	if (dim == 64 && nt)
		for (r = 0; r < n; r++, s += stride, d += 64)
			dec_row_v16(f, s, d, 64, true);
	else if (dim == 64)
		for (r = 0; r < n; r++, s += stride, d += 64)
			dec_row_v16(f, s, d, 64, false);
	else if (nt)
		for (r = 0; r < n; r++, s += stride, d += dim)
			dec_row_v16(f, s, d, dim, true);
	else
		for (r = 0; r < n; r++, s += stride, d += dim)
			dec_row_v16(f, s, d, dim, false);
	if (nt)
		_mm_sfence();
}

static bool enc_fp16_avx512(const float *s, unsigned char *d, uint32_t n,
			    enum emb_round round, uint64_t key)
{
	const __m512i absm = _mm512_set1_epi32((int)ABS_MASK);
	const __m512i maxb = _mm512_set1_epi32((int)FP16_MAX_BITS);
	__mmask16 bad = 0;
	uint32_t i = 0;
	bool ok;

	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_loadu_ps(s + i);
		__m512i a = _mm512_and_si512(_mm512_castps_si512(x), absm);
		__m256i lo, hi;
		__m512 flo, fhi, p;
		__mmask16 up;

		bad |= _mm512_cmpgt_epu32_mask(a, maxb);
		if (round != EMB_ROUND_STOCHASTIC) {
			_mm256_storeu_si256(
			    (__m256i *)(d + 2 * i),
			    _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
			continue;
		}
		lo = _mm512_cvtps_ph(x, _MM_FROUND_TO_ZERO);
		hi = _mm256_add_epi16(lo, _mm256_set1_epi16(1));
		flo = _mm512_castsi512_ps(_mm512_and_si512(
		    _mm512_castps_si512(_mm512_cvtph_ps(lo)), absm));
		fhi = _mm512_castsi512_ps(_mm512_and_si512(
		    _mm512_castps_si512(_mm512_cvtph_ps(hi)), absm));
		p = _mm512_div_ps(_mm512_sub_ps(_mm512_castsi512_ps(a), flo),
				  _mm512_sub_ps(fhi, flo));
		up = _mm512_cmp_ps_mask(sr_unit_v16(idx_v16(i), key), p,
					_CMP_LT_OQ);
		_mm256_storeu_si256(
		    (__m256i *)(d + 2 * i),
		    _mm512_cvtepi32_epi16(_mm512_mask_add_epi32(
			_mm512_cvtepu16_epi32(lo), up,
			_mm512_cvtepu16_epi32(lo), _mm512_set1_epi32(1))));
	}
	ok = enc_fp16_v8(s, d, &i, n, round, key);
	return enc_fp16_scalar(s, d, i, n, round, key) && ok && !bad;
}

static bool enc_bf16_avx512(const float *s, unsigned char *d, uint32_t n,
			    enum emb_round round, uint64_t key)
{
	const __m512i absm = _mm512_set1_epi32((int)ABS_MASK);
	const __m512i maxb = _mm512_set1_epi32((int)BF16_MAX_BITS);
	const __m512i one = _mm512_set1_epi32(1);
	__mmask16 bad = 0;
	uint32_t i = 0;
	bool ok;

	for (; i + 16 <= n; i += 16) {
		__m512i u = _mm512_loadu_si512(s + i);
		__m512i r = _mm512_srli_epi32(u, 16);

		bad |= _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), maxb);
		if (round != EMB_ROUND_STOCHASTIC) {
			r = _mm512_add_epi32(
			    _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
			    _mm512_and_si512(r, one));
			r = _mm512_srli_epi32(r, 16);
		} else {
			__mmask16 up = _mm512_cmplt_epu32_mask(
			    _mm512_srli_epi32(sr_hash_v16(idx_v16(i), key), 8),
			    _mm512_slli_epi32(
				_mm512_and_si512(u, _mm512_set1_epi32(0xffff)),
				8));

			r = _mm512_mask_add_epi32(r, up, r, one);
		}
		_mm256_storeu_si256((__m256i *)(d + 2 * i),
				    _mm512_cvtepi32_epi16(r));
	}
	ok = enc_bf16_v8(s, d, &i, n, round, key);
	return enc_bf16_scalar(s, d, i, n, round, key) && ok && !bad;
}

VEC_INLINE bool minmax_v16(const float *s, uint32_t n, float *mn, float *mx)
{
	const __m512i expm = _mm512_set1_epi32((int)EXP_MASK);
	__m512 lo = _mm512_set1_ps(*mn), hi = _mm512_set1_ps(*mx);
	__mmask16 bad = 0;
	float l[16], h[16];
	uint32_t i = 0;
	bool ok;

	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_loadu_ps(s + i);

		bad |= _mm512_cmpeq_epi32_mask(
		    _mm512_and_si512(_mm512_castps_si512(x), expm), expm);
		lo = _mm512_min_ps(x, lo);
		hi = _mm512_max_ps(x, hi);
	}
	_mm512_storeu_ps(l, lo);
	_mm512_storeu_ps(h, hi);
	for (int k = 0; k < 16; k++) {
		*mn = l[k] < *mn ? l[k] : *mn;
		*mx = h[k] > *mx ? h[k] : *mx;
	}
	ok = minmax_v8(s, &i, n, mn, mx);
	return minmax_scalar(s + i, n - i, mn, mx) && ok && !bad;
}

VEC_INLINE void enc_codes_v16(const float *s, unsigned char *q, uint32_t n,
			      const struct int8_par *p, enum emb_round round,
			      uint64_t key)
{
	const __m512 bias = _mm512_set1_ps(p->bias);
	const __m512 inv = _mm512_set1_ps(p->inv);
	uint32_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 v = _mm512_mul_ps(
		    _mm512_sub_ps(_mm512_loadu_ps(s + i), bias), inv);
		__m512i c;

		v = _mm512_max_ps(v, _mm512_setzero_ps());
		v = _mm512_min_ps(v, _mm512_set1_ps(255.0f));
		if (round == EMB_ROUND_STOCHASTIC) {
			c = _mm512_cvttps_epi32(
			    _mm512_add_ps(v, sr_unit_v16(idx_v16(i), key)));
			c = _mm512_min_epi32(c, _mm512_set1_epi32(255));
		} else {
			v = _mm512_add_ps(v, _mm512_set1_ps(MAGIC));
			c = _mm512_cvttps_epi32(
			    _mm512_sub_ps(v, _mm512_set1_ps(MAGIC)));
		}
		_mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(c));
	}
	enc_codes_v8(s, q, &i, n, p, round, key);
	enc_int8_codes_scalar(s, q, i, n, p, round, key);
}
static bool enc_int8_avx512(const float *s, unsigned char *d, uint32_t n,
			    enum emb_round round, uint64_t key)
{
	struct int8_par p;
	float mn = n ? s[0] : 0.0f, mx = mn;

	if (!minmax_v16(s, n, &mn, &mx) || !int8_params(mn, mx, &p))
		return false;
	put_int8_par(d, &p);
	enc_codes_v16(s, d + 8, n, &p, round, key);
	return true;
}
EMB_TARGET_END
#endif

/* ---- dispatch ---------------------------------------------------------- */

/*
 * The vector bodies to run: 64 (AVX-512F, with AVX2, F16C and FMA), 32
 * (AVX2, F16C and FMA) or 0 (scalar), the widest the CPU has and
 * emb__rowfmt_vec_max allows. Asked per call, as common/optim.c does.
 */
static inline __attribute__((always_inline)) unsigned vec_width(void)
{
#if ROWFMT_X86
	if (emb__rowfmt_vec_max < 32 || !__builtin_cpu_supports("avx2") ||
	    !emb_cpu_f16c() || !__builtin_cpu_supports("fma"))
		return 0;
	if (emb__rowfmt_vec_max >= 64 && __builtin_cpu_supports("avx512f"))
		return 64;
	return 32;
#else
	return 0;
#endif
}

static void dec_row_scalar(uint32_t f, const unsigned char *s, float *d,
			   uint32_t dim)
{
	float scale, bias;

	switch (f) {
	case EMB_ROWFMT_FP16:
		dec_fp16_scalar(s, d, dim);
		break;
	case EMB_ROWFMT_BF16:
		dec_bf16_scalar(s, d, dim);
		break;
	case EMB_ROWFMT_INT8:
		memcpy(&scale, s, sizeof(scale));
		memcpy(&bias, s + 4, sizeof(bias));
		dec_int8_scalar(s + 8, scale, bias, d, dim);
		break;
	}
}

void emb_rowfmt_decode(uint32_t f, const void *src, float *dst, uint32_t dim)
{
	if (f == EMB_ROWFMT_FP32) {
		memcpy(dst, src, (size_t)dim * sizeof(*dst));
		return;
	}
	switch (vec_width()) {
#if ROWFMT_X86
	case 64:
		dec_row_avx512(f, src, dst, dim);
		break;
	case 32:
		dec_row_avx2(f, src, dst, dim);
		break;
#endif
	default:
		dec_row_scalar(f, src, dst, dim);
		break;
	}
}

void emb_rowfmt_decode_rows(uint32_t f, const void *src, size_t src_stride,
			    float *dst, uint32_t dim, uint32_t n)
{
	const unsigned char *s = src;

	if (f == EMB_ROWFMT_FP32) {
		if (src_stride == (size_t)dim * sizeof(*dst)) {
			memcpy(dst, src, (size_t)n * src_stride);
			return;
		}
		for (uint32_t r = 0; r < n; r++)
			memcpy(dst + (size_t)r * dim, s + r * src_stride,
			       (size_t)dim * sizeof(*dst));
		return;
	}
	switch (vec_width()) {
#if ROWFMT_X86
	case 64:
		dec_rows_avx512(f, s, src_stride, dst, dim, n);
		break;
	case 32:
		dec_rows_avx2(f, s, src_stride, dst, dim, n);
		break;
#endif
	default:
		for (uint32_t r = 0; r < n; r++)
			dec_row_scalar(f, s + r * src_stride,
				       dst + (size_t)r * dim, dim);
		break;
	}
}

static bool encode_fp32(const float *src, unsigned char *d, uint32_t dim)
{
	float mn = 0.0f, mx = 0.0f;

	memcpy(d, src, (size_t)dim * sizeof(*src));
	return minmax_scalar(src, dim, &mn, &mx);
}

static bool encode_int8(unsigned w, const float *src, unsigned char *d,
			uint32_t dim, enum emb_round round, uint64_t key)
{
	struct int8_par p;
	float mn = dim ? src[0] : 0.0f, mx = mn;

#if ROWFMT_X86
	if (w)
		return w == 64 ? enc_int8_avx512(src, d, dim, round, key)
			       : enc_int8_avx2(src, d, dim, round, key);
#else
	(void)w;
#endif
	if (!minmax_scalar(src, dim, &mn, &mx) || !int8_params(mn, mx, &p))
		return false;
	put_int8_par(d, &p);
	enc_int8_codes_scalar(src, d + 8, 0, dim, &p, round, key);
	return true;
}

bool emb_rowfmt_encode(uint32_t f, const float *src, void *dst, uint32_t dim,
		       enum emb_round round, uint64_t key)
{
	unsigned char *d = dst;
	uint32_t nbytes = emb_rowfmt_bytes(f, dim);
	unsigned w;
	bool ok;

	if (f >= EMB_ROWFMT_COUNT ||
	    (round != EMB_ROUND_NEAREST && round != EMB_ROUND_STOCHASTIC))
		return false;
	w = vec_width();
	switch (f) {
	case EMB_ROWFMT_FP32:
		ok = encode_fp32(src, d, dim);
		break;
	case EMB_ROWFMT_FP16:
#if ROWFMT_X86
		if (w)
			ok = w == 64 ? enc_fp16_avx512(src, d, dim, round, key)
				     : enc_fp16_avx2(src, d, dim, round, key);
		else
#endif
			ok = enc_fp16_scalar(src, d, 0, dim, round, key);
		break;
	case EMB_ROWFMT_BF16:
#if ROWFMT_X86
		if (w)
			ok = w == 64 ? enc_bf16_avx512(src, d, dim, round, key)
				     : enc_bf16_avx2(src, d, dim, round, key);
		else
#endif
			ok = enc_bf16_scalar(src, d, 0, dim, round, key);
		break;
	default:
		ok = encode_int8(w, src, d, dim, round, key);
		break;
	}
	/* The words' tail: stored records and dumps hold no stray bytes. */
	memset(d + nbytes, 0, emb_rowfmt_words(f, dim) * 4u - nbytes);
	return ok;
}
