/*
 * src/store/dirty.c - change tracking for incremental checkpoints: what
 * each shard wrote and removed since the last checkpoint walk (ckpt.c
 * reads and clears it).
 *
 * Each shard keeps a bit per record (set when the record's floats are
 * written or the record is created: emb__dirty_mark in store_int.h) and a
 * list of the ids it removed. A push pays one OR into a bitmap that stays
 * cache resident (1 bit per row, 128 KiB per million rows), under the
 * shard lock it already holds.
 *
 * A leaf: the shard calls down into it, it calls no other file of the
 * store. Every function runs under the caller's shard lock.
 */
#include "store/store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Removed ids a shard remembers: beyond this a delta would be about as big
 * as a full checkpoint, so the shard stops counting and asks for one. */
#define ERASED_MIN 1024u

int emb__dirty_reserve(struct emb_shard *s, uint32_t nrec)
{
	uint32_t words = (nrec + 63) / 64;
	uint64_t *d;

	if (words <= s->dirty_words)
		return 0;
	if (words < 2 * s->dirty_words)
		words = 2 * s->dirty_words;
	d = realloc(s->dirty, (size_t)words * sizeof(*d));
	if (!d)
		return -ENOMEM;
	memset(d + s->dirty_words, 0,
	       (size_t)(words - s->dirty_words) * sizeof(*d));
	s->dirty = d;
	if (s->track) {
		/* A move's marks cover every record too. */
		d = realloc(s->track, (size_t)words * sizeof(*d));
		if (!d)
			return -ENOMEM;
		memset(d + s->dirty_words, 0,
		       (size_t)(words - s->dirty_words) * sizeof(*d));
		s->track = d;
	}
	s->dirty_words = words;
	return 0;
}

void emb__dirty_erased(struct emb_shard *s, uint64_t id)
{
	/* Unsigned: a slot below track_first wraps past track_n. */
	if (s->track && emb_id_slot(id) - s->track_first < s->track_n)
		s->track_removed++;
#ifndef EMB_NO_DIRTY
	if (s->erased_lost)
		return;
	if (s->nerased == s->erased_cap) {
		uint32_t cap = s->erased_cap ? 2 * s->erased_cap : 64;
		uint64_t *v;

		/* Bounded by a quarter of the shard's rows (at least
		 * ERASED_MIN): 2 bytes a row at most. */
		if (s->nerased >= ERASED_MIN && s->nerased >= s->used / 4) {
			s->erased_lost = true;
			return;
		}
		v = realloc(s->erased, (size_t)cap * sizeof(*v));
		if (!v) {
			s->erased_lost = true;
			return;
		}
		s->erased = v;
		s->erased_cap = cap;
	}
	s->erased[s->nerased++] = id;
#else
	(void)s;
	(void)id;
#endif
}

void emb__dirty_fini(struct emb_shard *s)
{
	free(s->dirty);
	free(s->erased);
	free(s->track);
	free(s->vslot);
	s->vslot = NULL;
	free(s->birth);
	s->birth = NULL;
	s->dirty = NULL;
	s->erased = NULL;
	s->track = NULL;
}
