/*
 * src/common/seal.h - the seal of a remote-readable row: a seeded 64-bit
 * hash over (id, the row's floats) that the store writes after every change
 * of a row and a client recomputes over what one RDMA READ brought back.
 *
 * A READ of a row is not atomic: the NIC fetches its cache lines in no
 * promised order while a push may be rewriting them, and a version at the
 * row's head alone says nothing about the lines behind it. A hash over the
 * whole record is order-free: any mix of two states of a row, a record
 * freed (the store breaks its seal) or reused for another id, or memory of
 * another table (each table has its own seed) matches its seal only by a
 * 64-bit accident. Tearing is accidental, not adversarial, so a fast
 * multiply-xorshift hash stands in for Pilaf's CRC64 (docs/rdma.md).
 * Pure functions, thread-safe.
 */
#ifndef EMB_COMMON_SEAL_H
#define EMB_COMMON_SEAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EMB_SEAL_K1 0x9e3779b97f4a7c15ull
#define EMB_SEAL_K2 0xc2b2ae3d27d4eb4full

static inline uint64_t emb__seal_mix(uint64_t h, uint64_t w)
{
	h ^= w;
	h *= EMB_SEAL_K2;
	return h ^ (h >> 31);
}

/*
 * The seal of a row of id whose nbytes (a multiple of 4) floats start at
 * data, under a table's seed. Four independent lanes keep the multiplies
 * in flight together; each lane is position-dependent, and the lanes are
 * folded in order.
 */
static inline uint64_t emb_seal(uint64_t seed, uint64_t id, const void *data,
				size_t nbytes)
{
	const unsigned char *p = data;
	uint64_t a = seed ^ EMB_SEAL_K1, b = seed + EMB_SEAL_K2,
		 c = ~seed, d = seed * EMB_SEAL_K1 + 1;
	uint64_t w[4];
	size_t i = 0;

	a = emb__seal_mix(a, id);
	for (; i + 32 <= nbytes; i += 32) {
		memcpy(w, p + i, 32);
		a = emb__seal_mix(a, w[0]);
		b = emb__seal_mix(b, w[1]);
		c = emb__seal_mix(c, w[2]);
		d = emb__seal_mix(d, w[3]);
	}
	for (; i + 8 <= nbytes; i += 8) {
		memcpy(w, p + i, 8);
		a = emb__seal_mix(a, w[0]);
	}
	if (i < nbytes) {
		uint32_t t;

		memcpy(&t, p + i, 4);
		b = emb__seal_mix(b, t);
	}
	a = emb__seal_mix(a, b);
	a = emb__seal_mix(a, c);
	a = emb__seal_mix(a, d);
	a = emb__seal_mix(a, nbytes);
	/* fmix64, so that every input bit reaches every output bit. */
	a ^= a >> 33;
	a *= 0xff51afd7ed558ccdull;
	a ^= a >> 33;
	a *= 0xc4ceb9fe1a85ec53ull;
	return a ^ (a >> 33);
}

#endif
