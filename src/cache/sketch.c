/*
 * src/cache/sketch.c - the TinyLFU frequency sketch (Einziger, Friedman and
 * Manes 2017), laid out as Caffeine lays it out: counters live in 64-byte
 * blocks of eight words, each word sixteen 4-bit counters, and an id's four
 * counters all sit in one block, so a sighting costs one cache miss. Adds use
 * conservative update (only the smallest of the four counters grow), which
 * keeps the counts of rare ids, the ones admission has to tell apart, close
 * to the truth. Not thread-safe: one per cache.
 */
#include "cache/sketch.h"

#include <errno.h>
#include <stdlib.h>

#include "common/hash.h"

struct emb_sketch {
	uint64_t *words;     /* blocks * 8 words of 16 counters */
	uint32_t block_mask; /* blocks - 1; blocks is a power of two */
	uint64_t added;	     /* additions since the last halving */
	uint64_t sample;     /* additions between halvings */
	uint64_t halvings;   /* since create */
};

/*
 * The cache's id -> slot hash uses the low bits of emb_id_hash(id); the
 * sketch hashes a different function of the id so its collisions are
 * independent of the hash table's.
 */
static uint64_t sk_hash(uint64_t id)
{
	return emb_id_hash(id ^ 0x9e3779b97f4a7c15ull);
}

/*
 * Counter i (0..3) of hash h: word 2i or 2i + 1 of the block, one of its 16
 * nibbles. Returns the word index and sets *shift to the nibble's bit.
 */
static uint32_t counter_at(const struct emb_sketch *s, uint64_t h, uint32_t i,
			   uint32_t *shift)
{
	uint32_t block = (uint32_t)(h >> 32) & s->block_mask;
	uint32_t byte = (uint32_t)(h >> (i * 8)) & 0xffu;

	*shift = ((byte >> 1) & 15u) * 4u;
	return block * 8u + i * 2u + (byte & 1u);
}

int emb_sketch_create(uint32_t capacity, uint64_t sample,
		      struct emb_sketch **out)
{
	struct emb_sketch *s;
	uint32_t nwords = 8;

	if (capacity == 0 || capacity > (1u << 30))
		return -EINVAL;
	while (nwords < capacity)
		nwords <<= 1;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->words = aligned_alloc(64, (size_t)nwords * sizeof(*s->words));
	if (!s->words) {
		free(s);
		return -ENOMEM;
	}
	for (uint32_t w = 0; w < nwords; w++)
		s->words[w] = 0;
	s->block_mask = nwords / 8 - 1;
	s->sample =
	    sample ? sample : (uint64_t)EMB_SKETCH_SAMPLE_PER_ROW * capacity;
	*out = s;
	return 0;
}

void emb_sketch_destroy(struct emb_sketch *s)
{
	if (!s)
		return;
	free(s->words);
	free(s);
}

/* Every counter to half its value: the sketch forgets at a fixed rate. */
static void halve(struct emb_sketch *s)
{
	uint64_t nwords = ((uint64_t)s->block_mask + 1) * 8;

	for (uint64_t w = 0; w < nwords; w++)
		s->words[w] = (s->words[w] >> 1) & 0x7777777777777777ull;
	s->added /= 2;
	s->halvings++;
}

void emb_sketch_add(struct emb_sketch *s, uint64_t id)
{
	uint64_t h = sk_hash(id);
	uint32_t idx[4], shift[4], val[4], min = EMB_SKETCH_MAX;

	for (uint32_t i = 0; i < 4; i++) {
		idx[i] = counter_at(s, h, i, &shift[i]);
		val[i] = (uint32_t)(s->words[idx[i]] >> shift[i]) & 15u;
		if (val[i] < min)
			min = val[i];
	}
	/* A saturated id is not counted: halving should follow the stream
	 * of ids still being told apart. */
	if (min == EMB_SKETCH_MAX)
		return;
	for (uint32_t i = 0; i < 4; i++) {
		if (val[i] == min)
			s->words[idx[i]] += 1ull << shift[i];
	}
	if (++s->added >= s->sample)
		halve(s);
}

uint32_t emb_sketch_estimate(const struct emb_sketch *s, uint64_t id)
{
	uint64_t h = sk_hash(id);
	uint32_t shift, min = EMB_SKETCH_MAX;

	for (uint32_t i = 0; i < 4; i++) {
		uint32_t w = counter_at(s, h, i, &shift);
		uint32_t v = (uint32_t)(s->words[w] >> shift) & 15u;

		if (v < min)
			min = v;
	}
	return min;
}

void emb_sketch_prefetch(const struct emb_sketch *s, uint64_t id)
{
	uint64_t h = sk_hash(id);

	__builtin_prefetch(
	    &s->words[((uint32_t)(h >> 32) & s->block_mask) * 8u], 1);
}

uint64_t emb_sketch_halvings(const struct emb_sketch *s)
{
	return s->halvings;
}
