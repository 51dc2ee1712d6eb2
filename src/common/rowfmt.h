/*
 * src/common/rowfmt.h - how a table keeps a row's weights: fp32, fp16, bf16
 * or int8, and the conversions between them and the fp32 every optimizer
 * computes in. The store, the wire, the worker cache and snapshots share
 * these; docs/store.md ("Row formats") tells why each is what it is.
 *
 * A row of dim weights in format f takes emb_rowfmt_bytes(f, dim) bytes:
 *
 *   format  bytes     layout
 *   fp32    4 * dim   IEEE binary32, little-endian
 *   fp16    2 * dim   IEEE binary16
 *   bf16    2 * dim   the high half of a binary32
 *   int8    8 + dim   f32 scale, f32 bias, then dim u8 codes q:
 *                     w[i] = fmaf(q[i], scale, bias) (FBGEMM's 8-bit rows)
 *
 * and emb_rowfmt_words(f, dim) 4-byte words (the bytes rounded up, the
 * tail zero), so that the optimizer's fp32 state that follows the weights
 * in a store record stays 4-aligned.
 *
 * Encoding refuses, and writes nothing meaningful, when any value is NaN,
 * infinite, or beyond the format's largest finite value (65504 for fp16,
 * about 3.39e38 for bf16): a row is never stored as something it was not.
 * Rounding is to nearest, ties to even, or stochastic: rounded away from
 * zero with probability equal to the value's distance from the number
 * toward zero, in units of the gap between the two, using 24 random bits
 * per value drawn from a counter-based hash of (key, index). The key is
 * emb_rowfmt_sr_key(table seed, id, the row's update count), so every replica
 * and every rerun rounds the same way.
 *
 * An int8 row has scale = (max - min) / 255 and bias = min of its values,
 * and codes q = (x - bias) * (1 / scale) (0 for a zero scale) clamped to
 * [0, 255], then rounded to nearest even, or stochastically as floor(q + u)
 * with u in [0, 1) from the same hash. The error of nearest is at most
 * half a step (scale / 2) and a few float ulps.
 *
 * Each conversion has a scalar body and vector ones (F16C/AVX2, AVX-512)
 * chosen at run time; all give the same bits (tests/common/test_rowfmt.c
 * holds them to the scalar reference). Pure and thread-safe.
 */
#ifndef EMB_COMMON_ROWFMT_H
#define EMB_COMMON_ROWFMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tabledef.h"

/* Bytes of dim weights in format f; 0 for an unknown format. */
static inline uint32_t emb_rowfmt_bytes(uint32_t f, uint32_t dim)
{
	switch (f) {
	case EMB_ROWFMT_FP32:
		return 4 * dim;
	case EMB_ROWFMT_FP16:
	case EMB_ROWFMT_BF16:
		return 2 * dim;
	case EMB_ROWFMT_INT8:
		return 8 + dim;
	}
	return 0;
}

/* 4-byte words of dim weights in format f (bytes rounded up). */
static inline uint32_t emb_rowfmt_words(uint32_t f, uint32_t dim)
{
	return (emb_rowfmt_bytes(f, dim) + 3) / 4;
}

/* emb_rowfmt_name() and emb_rowfmt_parse(): common/tabledef.h. */

/*
 * The stochastic-rounding key of one write of a row:
 * fmix64(fmix64(fmix64(seed + 0x9e3779b97f4a7c15) ^ id) ^ count), with
 * fmix64 MurmurHash3's 64-bit finaliser. Fixed forever: it decides stored
 * bits that replicas and reruns must reproduce.
 */
uint64_t emb_rowfmt_sr_key(uint64_t seed, uint64_t id, uint32_t count);

/*
 * Decodes dim weights of format f at src (emb_rowfmt_bytes() bytes, any
 * alignment) into dst[0..dim). fp32 is a copy; an unknown f writes
 * nothing (formats are checked where a table is defined).
 */
void emb_rowfmt_decode(uint32_t f, const void *src, float *dst, uint32_t dim);

/*
 * Encodes src[0..dim) into format f at dst (emb_rowfmt_words() words, not
 * overlapping src; the tail bytes past emb_rowfmt_bytes() are zeroed). key is
 * used only by EMB_ROUND_STOCHASTIC. true, or false when a value is not finite
 * or out of the format's range (int8: when max - min of the row overflows), or
 * f or round is unknown: dst is then undefined and the caller keeps the row it
 * had. fp32 refuses NaN and Inf too.
 */
bool emb_rowfmt_encode(uint32_t f, const float *src, void *dst, uint32_t dim,
		       enum emb_round round, uint64_t key);

/*
 * Decodes n rows: row i of src starts at src + i * src_stride bytes, and
 * goes to dst + i * dim. For gathers (a pull of n rows into fp32). When
 * dst is 64-byte aligned, dim a multiple of 16 and the output 8 MiB or
 * more, the stores bypass the caches (too large to stay cached anyway).
 */
void emb_rowfmt_decode_rows(uint32_t f, const void *src, size_t src_stride,
			    float *dst, uint32_t dim, uint32_t n);

/* One value, the scalar reference the vector bodies match bit for bit. */
float emb_fp16_to_fp32(uint16_t h);
float emb_bf16_to_fp32(uint16_t b);
/* Nearest-even; *ok false when x is not finite or out of range. */
uint16_t emb_fp32_to_fp16(float x, bool *ok);
uint16_t emb_fp32_to_bf16(float x, bool *ok);

/*
 * For tests: the widest vector body the conversions use, 64 (AVX-512),
 * 32 (AVX2 + F16C) or 0 (scalar), never wider than the CPU has.
 */
extern unsigned emb__rowfmt_vec_max;

#endif
