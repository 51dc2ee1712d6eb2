/*
 * src/common/rowfmt.c - the row formats' conversions (rowfmt.h): a scalar
 * reference in integer arithmetic, and vector bodies (F16C/AVX2/FMA and
 * AVX-512) picked per call that give the same bits. Pure functions; any
 * thread may call them (emb__rowfmt_vec_max is a knob for tests).
 *
 * Everything here is exact or rounds in one defined way, whatever the
 * caller's MXCSR: integer rounding for fp16 and bf16, explicit-rounding
 * conversion instructions, and for int8 only IEEE operations that both
 * bodies perform in the same order (C11 does not contract a * b + c).
 */
#include "common/rowfmt.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

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

/* MurmurHash3's finalisers: bijections that spread every input bit. */
static inline uint64_t fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

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
	uint64_t k = fmix64(seed + 0x9e3779b97f4a7c15ull);

	k = fmix64(k ^ id);
	return fmix64(k ^ count);
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
	if (rem > half || (rem == half && (q & 1)))
		q++; /* 0x3ff + 1 is the smallest normal's pattern, as it should
		      */
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
static bool int8_params(float mn, float mx, struct int8_par *p)
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

/* Min and max of s[0..n), false when a value is not finite. */
static bool minmax_scalar(const float *s, uint32_t n, float *mn, float *mx)
{
	float lo = n ? s[0] : 0.0f, hi = lo;
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

static void enc_int8_codes_scalar(const float *s, unsigned char *q, uint32_t i0,
				  uint32_t n, const struct int8_par *p,
				  enum emb_round round, uint64_t key)
{
	for (uint32_t i = i0; i < n; i++)
		q[i] = int8_code(s[i], p, round,
				 round == EMB_ROUND_STOCHASTIC ? sr_hash(key, i)
							       : 0);
}

/* ---- dispatch ---------------------------------------------------------- */

/*
 * The vector bodies to run: 64 (AVX-512 F/BW/VL with F16C and FMA), 32
 * (AVX2, F16C and FMA) or 0 (scalar), the widest the CPU has and
 * emb__rowfmt_vec_max allows. Asked per call, as common/optim.c does.
 */
static unsigned vec_width(void)
{
#if ROWFMT_X86
	if (!__builtin_cpu_supports("avx2") ||
	    !__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("fma"))
		return 0;
	if (emb__rowfmt_vec_max >= 64 && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl"))
		return 64;
	if (emb__rowfmt_vec_max >= 32)
		return 32;
#endif
	return 0;
}

/* One row of format f (not fp32) at s into d, by the body of width w. */
static void decode_row(unsigned w, uint32_t f, const unsigned char *s, float *d,
		       uint32_t dim)
{
	float scale, bias;

	(void)w;
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
	decode_row(vec_width(), f, src, dst, dim);
}

void emb_rowfmt_decode_rows(uint32_t f, const void *src, size_t src_stride,
			    float *dst, uint32_t dim, uint32_t n)
{
	const unsigned char *s = src;
	unsigned w;

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
	w = vec_width();
	for (uint32_t r = 0; r < n; r++)
		decode_row(w, f, s + r * src_stride, dst + (size_t)r * dim,
			   dim);
}

static bool encode_fp32(const float *src, unsigned char *d, uint32_t dim)
{
	float mn, mx;

	memcpy(d, src, (size_t)dim * sizeof(*src));
	return minmax_scalar(src, dim, &mn, &mx);
}

static bool encode_int8(unsigned w, const float *src, unsigned char *d,
			uint32_t dim, enum emb_round round, uint64_t key)
{
	struct int8_par p;
	float mn, mx;

	(void)w;
	if (!minmax_scalar(src, dim, &mn, &mx) || !int8_params(mn, mx, &p))
		return false;
	memcpy(d, &p.scale, sizeof(p.scale));
	memcpy(d + 4, &p.bias, sizeof(p.bias));
	enc_int8_codes_scalar(src, d + 8, 0, dim, &p, round, key);
	return true;
}

bool emb_rowfmt_encode(uint32_t f, const float *src, void *dst, uint32_t dim,
		       enum emb_round round, uint64_t key)
{
	unsigned char *d = dst;
	uint32_t nbytes = emb_rowfmt_bytes(f, dim);
	unsigned w;
	bool ok = false;

	if (!nbytes && dim)
		return false; /* unknown format */
	if (round != EMB_ROUND_NEAREST && round != EMB_ROUND_STOCHASTIC)
		return false;
	w = vec_width();
	(void)w;
	switch (f) {
	case EMB_ROWFMT_FP32:
		ok = encode_fp32(src, d, dim);
		break;
	case EMB_ROWFMT_FP16:
		ok = enc_fp16_scalar(src, d, 0, dim, round, key);
		break;
	case EMB_ROWFMT_BF16:
		ok = enc_bf16_scalar(src, d, 0, dim, round, key);
		break;
	case EMB_ROWFMT_INT8:
		ok = encode_int8(w, src, d, dim, round, key);
		break;
	default:
		return false;
	}
	/* The words' tail: stored records and dumps hold no stray bytes. */
	memset(d + nbytes, 0, emb_rowfmt_words(f, dim) * 4u - nbytes);
	return ok;
}
