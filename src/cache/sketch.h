/*
 * src/cache/sketch.h - how often ids were seen lately, for the cache's
 * TinyLFU admission: a count-min sketch of 4-bit counters whose counts are
 * all halved every sample period, so old popularity fades. Not thread-safe:
 * one per cache, used by its trainer thread.
 */
#ifndef EMB_CACHE_SKETCH_H
#define EMB_CACHE_SKETCH_H

#include <stdint.h>

struct emb_sketch;

/* Largest count an id can have: counters are 4 bits wide. */
#define EMB_SKETCH_MAX 15u

/*
 * Creates a sketch for a cache of capacity rows: 16 counters (8 bytes) per
 * row, and a halving of every counter after sample additions (0 picks
 * EMB_SKETCH_SAMPLE_PER_ROW * capacity). 0 and *out, or -EINVAL (capacity
 * 0 or > 2^30) / -ENOMEM.
 */
int emb_sketch_create(uint32_t capacity, uint64_t sample,
		      struct emb_sketch **out);
void emb_sketch_destroy(struct emb_sketch *s); /* NULL is a no-op */

/* Additions per cached row between two halvings when sample is 0. */
#define EMB_SKETCH_SAMPLE_PER_ROW 16u

/* Counts one sighting of id; may halve every counter (see create). */
void emb_sketch_add(struct emb_sketch *s, uint64_t id);

/* How often id was seen, 0..EMB_SKETCH_MAX; never less than the truth
 * since the last halvings, more when other ids share its counters. */
uint32_t emb_sketch_estimate(const struct emb_sketch *s, uint64_t id);

/* Starts loading id's counters, for loops that add a batch of ids. */
void emb_sketch_prefetch(const struct emb_sketch *s, uint64_t id);

/* Halvings so far. */
uint64_t emb_sketch_halvings(const struct emb_sketch *s);

#endif
