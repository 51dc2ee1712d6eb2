/*
 * src/common/hash.h - the id hash and the id -> virtual slot map.
 *
 * Every node must agree on these forever: slots decide which server holds an
 * id, and dump files group rows by slot so a snapshot can be restored onto a
 * different number of servers. Pure functions, thread-safe.
 *
 * Bits of h = emb_id_hash(id) are spent so that the uses stay independent:
 *   slot (routing)      fastrange over bits 32..63
 *   store shard         bits 0..9
 *   index tag           bits 10..17
 *   index position      fastrange over bits 18..49
 */
#ifndef EMB_COMMON_HASH_H
#define EMB_COMMON_HASH_H

#include <stdint.h>

/* Virtual slots per table; fixed by the protocol and the dump format. */
#define EMB_NSLOTS 4096u

/* MurmurHash3's fmix64: a bijection, so distinct ids never share a hash. */
static inline uint64_t emb_id_hash(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	id *= 0xc4ceb9fe1a85ec53ull;
	id ^= id >> 33;
	return id;
}

/* Lemire's multiply-shift range reduction: x in [0, 2^32) to [0, n). */
static inline uint32_t emb_fastrange32(uint32_t x, uint32_t n)
{
	return (uint32_t)(((uint64_t)x * n) >> 32);
}

static inline uint32_t emb_id_slot(uint64_t id)
{
	return emb_fastrange32((uint32_t)(emb_id_hash(id) >> 32), EMB_NSLOTS);
}

/* splitmix64 step: the stream behind initializers and benchmark id draws. */
static inline uint64_t emb_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif
