/*
 * src/store/ckpt.c - the checkpoint walk (emb_table_ckpt_*): the rows a
 * full or incremental checkpoint writes, read from the change tracking of
 * dirty.c.
 *
 * A walk takes the removed ids of every shard at begin, then goes shard by
 * shard copying rows (all of them, or the marked ones for a delta) and
 * clearing their marks, under the shard lock in bounded steps. Removals
 * that happen while a shard is walked stay in its list for the next delta,
 * except those whose id is live again when the walk leaves the shard: the
 * walk or the next delta carries that row whole, and a delta applies its
 * removals before its rows. So the files of a chain, applied in order,
 * give every row's last written value at the walks' ends.
 *
 * Threads: any, at most one walk per table at a time; it takes each
 * shard's lock itself.
 */
#include "store/store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"

struct emb_table_ckpt {
	struct emb_table *t; /* borrowed */
	bool delta;	     /* marked rows only */
	uint32_t shard;	     /* shard being walked */
	uint32_t idx;	     /* next record index in it */
	uint64_t *erased;    /* removed ids taken at begin (delta) */
	uint64_t nerased;    /* ids in erased */
	bool entered;	     /* a tiered table: the shard's walk entered */
	struct emb_tier_walk *tw; /* and it, until the shard is left */
};

int emb_table_ckpt_begin(struct emb_table *t, bool delta,
			 struct emb_table_ckpt **out)
{
	struct emb_table_ckpt *c;
	bool lost = false;
	uint64_t n = 0;

	if (!t || !out)
		return EMB_EBADARG;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->t = t;
	c->delta = delta;
	/* Upper bound first, so that the lists can be taken in one pass. */
	for (uint32_t si = 0; si < t->nshards; si++)
		n += __atomic_load_n(&t->shards[si].nerased, __ATOMIC_RELAXED);
	if (delta) {
		c->erased =
		    malloc((size_t)(n + t->nshards * 64u) * sizeof(*c->erased));
		if (!c->erased) {
			free(c);
			return -ENOMEM;
		}
	}
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];

		pthread_mutex_lock(&s->lock);
		/* Room runs out only if removals came meanwhile. */
		if (delta && !s->erased_lost &&
		    c->nerased + s->nerased > n + t->nshards * 64u)
			s->erased_lost = true;
		if (delta && s->erased_lost) {
			/* The flag stays until a full walk: no delta
			 * before it, even if other lists were taken. */
			lost = true;
		} else {
			/* A full walk needs no list: what it misses, it
			 * never copied. */
			if (delta && s->nerased) {
				/* s->erased is NULL until the first removal. */
				memcpy(c->erased + c->nerased, s->erased,
				       (size_t)s->nerased * sizeof(*c->erased));
				c->nerased += s->nerased;
			}
			s->nerased = 0;
			s->erased_lost = false;
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (lost) {
		/* The marks are intact; the full walk that must follow
		 * clears them. */
		free(c->erased);
		free(c);
		return EMB_EDELTALOST;
	}
	*out = c;
	return 0;
}

uint64_t emb_table_ckpt_erased(const struct emb_table_ckpt *c,
			       const uint64_t **ids)
{
	*ids = c->erased;
	return c->nerased;
}

/* The walk leaves shard si: drops the removals of ids that are live again,
 * in DRAM or on the device (made again and moved there before the walk
 * came, it handed them out from there). */
static void leave_shard(struct emb_table *t, uint32_t si)
{
	struct emb_shard *s = &t->shards[si];
	uint32_t keep = 0;

	for (uint32_t i = 0; i < s->nerased; i++) {
		uint64_t id = s->erased[i], h = emb_id_hash(id);

		if (emb__shard_find(t, s, id, h) < 0 &&
		    !(t->tier && emb__tier_has(t, si, id, h)))
			s->erased[keep++] = id;
	}
	s->nerased = keep;
}

int emb_table_ckpt_next(struct emb_table_ckpt *c, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max)
{
	struct emb_table *t = c->t;
	uint32_t got = 0;

	if (!ids || !rows)
		return EMB_EBADARG;
	while (got < max && c->shard < t->nshards) {
		struct emb_shard *s = &t->shards[c->shard];
		/* Records looked at per lock hold, so pushes wait little. */
		uint32_t budget = 4 * max;

		pthread_mutex_lock(&s->lock);
		if (t->tier && !c->entered) {
			/* A tiered shard: its walk (tier.c, "walks"). */
			int rc = emb__tier_walk_enter(
			    t, c->shard,
			    c->delta ? EMB_TIER_WALK_CKPT : EMB_TIER_WALK_ALL,
			    NULL, &c->tw);

			if (rc) {
				pthread_mutex_unlock(&s->lock);
				return rc;
			}
			c->entered = true;
		}
		while (got < max && budget && c->idx < s->next_idx) {
			uint32_t i = c->idx;
			uint64_t *w = &s->dirty[i >> 6];
			uint64_t bit = 1ull << (i & 63);
			struct emb_row_hdr *r;

			if (c->delta && !(*w >> (i & 63))) {
				/* No mark left in this word: next word. */
				c->idx = (i | 63) + 1;
				budget--;
				continue;
			}
			c->idx++;
			budget--;
			if (c->delta && !(*w & bit))
				continue;
			r = emb__shard_row(t, s, i);
			/* Came back from the device during the walk: the
			 * walk hands it out later, and clears its mark
			 * then (tier.c). */
			if (c->tw && !(r->count & EMB_ROW_FREE) &&
			    emb__tier_walk_owes(c->tw, r->id))
				continue;
			*w &= ~bit;
			if (r->count & EMB_ROW_FREE)
				continue;
			emb__row_put(t, r, got++, ids, rows, meta);
		}
		if (c->tw && c->idx < s->next_idx)
			emb__tier_walk_dram_at(c->tw, c->idx);
		if (c->tw && c->idx >= s->next_idx) {
			/* Then its cold rows, and those owed; never the DRAM
			 * records again: rows made or brought back from now
			 * on are not this walk's. */
			int rc = emb__tier_walk_rest(t, s, c->shard, c->tw,
						     true, ids, rows, meta, &got,
						     max);

			c->idx = UINT32_MAX;
			if (rc || !emb__tier_walk_done(c->tw)) {
				pthread_mutex_unlock(&s->lock);
				if (rc)
					return rc;
				continue; /* got == max */
			}
		}
		if (c->idx >= s->next_idx) {
			leave_shard(t, c->shard);
			emb__tier_walk_leave(t, c->shard, c->tw);
			c->tw = NULL;
			c->entered = false;
			c->shard++;
			c->idx = 0;
		}
		pthread_mutex_unlock(&s->lock);
	}
	return (int)got;
}

void emb_table_ckpt_end(struct emb_table_ckpt *c)
{
	if (!c)
		return;
	if (c->tw) {
		/* Ended in the middle of a shard: its demotions go on. */
		struct emb_shard *s = &c->t->shards[c->shard];

		pthread_mutex_lock(&s->lock);
		emb__tier_walk_leave(c->t, c->shard, c->tw);
		pthread_mutex_unlock(&s->lock);
	}
	free(c->erased);
	free(c);
}
