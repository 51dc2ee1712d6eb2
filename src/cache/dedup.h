/*
 * src/cache/dedup.h - collapse a batch of ids to distinct ids plus an inverse
 * map.
 *
 * A handle holds scratch space for one batch at a time and is not
 * thread-safe: one per thread (the cache keeps one for its trainer thread).
 */
#ifndef EMB_CACHE_DEDUP_H
#define EMB_CACHE_DEDUP_H

#include <stdint.h>

struct emb_dedup;

/* 0 and a new handle in *out, or -EINVAL (max_batch 0 or > 2^30) / -ENOMEM. */
int emb_dedup_create(uint32_t max_batch, struct emb_dedup **out);
void emb_dedup_destroy(struct emb_dedup *d); /* NULL is a no-op */

/*
 * Writes the distinct ids of ids[0..n) to caller-owned uniq (room for n) and
 * sets inv[i] so that uniq[inv[i]] == ids[i]. Returns how many, or -EINVAL
 * if n > max_batch. uniq keeps the order of first appearance, so sums over
 * duplicates taken in inv order match a left-to-right sum over the batch.
 */
int emb_dedup_run(struct emb_dedup *d, const uint64_t *ids, uint32_t n,
		  uint64_t *uniq, uint32_t *inv);

#endif
