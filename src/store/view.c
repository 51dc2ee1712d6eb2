/*
 * src/store/view.c - point-in-time views of a table: every row as it was
 * at one instant, read while pushes go on (copy-on-write).
 *
 * Taking a view raises the table's fence: batches that write rows (push,
 * assign, erase) wait at their start, and the ones in progress finish; then
 * every shard is locked at once and given a bitmap of its records: the
 * instant. The fence comes down after a few microseconds per shard.
 * From then on a record that the view has not read yet is saved, whole,
 * before it is first written or freed (emb__row_write, emb__shard_remove),
 * and records made after the instant are marked so that the view skips
 * them. The view walks shard by shard: the live records it has not seen,
 * then the saved ones; once it leaves a shard, writes there cost nothing
 * again. Saved rows are charged to the table's memory limit; a save that
 * does not fit breaks the view (the reader gets EMB_EMEMLIMIT), never the
 * write. Lifecycle meta (last step, count) changed by pulls is not saved:
 * a view's meta may be newer than its instant.
 *
 * Threads: any; one view per table at a time. emb__* run under the
 * shard lock, as their callers hold it.
 */
#include "store/store_int.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"

struct emb_view_shard {
	uint64_t *seen;	 /* bit per record below limit: read, saved, or
			    made after the instant */
	uint32_t limit;	 /* records handed out at the instant */
	char *saved;	 /* saved records, row_bytes each */
	uint32_t nsaved; /* records in saved */
	uint32_t cap;	 /* room in saved */
	bool broken;	 /* a save did not fit */
	struct emb_tier_walk *tw; /* a tiered shard: its cold rows at the
				     instant, read last (tier.c) */
};

struct emb_table_view {
	struct emb_table *t; /* borrowed */
	uint64_t step;	     /* push batches applied at the instant */
	uint64_t rows;	     /* rows at the instant */
	uint64_t pause_ns;   /* writers held back for this long */
	uint32_t shard;	     /* shard being read */
	uint32_t idx;	     /* next record below limit in it */
	uint32_t saved_pos;  /* next saved record, after the live ones */
};

/* Batches writing rows now, over every stripe. */
static uint32_t writers_in(struct emb_table *t)
{
	uint32_t n = 0;

	for (unsigned i = 0; i < EMB_TABLE_STRIPES; i++)
		n += __atomic_load_n(&t->stripe[i].writers, __ATOMIC_SEQ_CST);
	return n;
}

void emb__writer_enter(struct emb_table *t)
{
	uint32_t *w = &emb__my_stripe(t)->writers;

	/* Dekker's pattern, all seq_cst: a writer that saw no fence counted
	 * itself before the fence went up, so the view's sum sees it. */
	for (;;) {
		__atomic_add_fetch(w, 1, __ATOMIC_SEQ_CST);
		if (!__atomic_load_n(&t->fence, __ATOMIC_SEQ_CST))
			return;
		__atomic_sub_fetch(w, 1, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&t->fence, __ATOMIC_SEQ_CST))
			sched_yield();
	}
}

void emb__view_born(struct emb_shard *s, uint32_t idx)
{
	struct emb_view_shard *v = s->view;

	if (idx < v->limit)
		v->seen[idx >> 6] |= 1ull << (idx & 63);
}

/* Copies record bytes rec into shard s's saved ones, or breaks the view. */
static void save_rec(struct emb_table *t, struct emb_shard *s, const void *rec)
{
	struct emb_view_shard *v = s->view;

	if (v->broken)
		return;
	if (v->nsaved == v->cap) {
		uint32_t cap = v->cap ? 2 * v->cap : 64;
		int64_t more = (int64_t)(cap - v->cap) * t->row_bytes;
		char *p;

		/* A tiered table lives at its limit: its saves may pass it
		 * by a quarter, then the view breaks as any would. */
		if (emb__mem_charge(t, more)) {
			uint64_t lim = t->tier ? t->tier_view->limit(t) : 0;

			if (!lim || __atomic_load_n(&t->mem_used,
						    __ATOMIC_RELAXED) +
						(uint64_t)more >
					lim + lim / 4) {
				v->broken = true;
				return;
			}
			emb__mem_charge_force(t, (uint64_t)more);
		}
		p = realloc(v->saved, (size_t)cap * t->row_bytes);
		if (!p) {
			emb__mem_charge(t, -(int64_t)(cap - v->cap) *
					       t->row_bytes);
			v->broken = true;
			return;
		}
		v->saved = p;
		v->cap = cap;
	}
	memcpy(v->saved + (size_t)v->nsaved++ * t->row_bytes, rec, t->row_bytes);
}

void emb__view_save(struct emb_table *t, struct emb_shard *s, uint32_t idx)
{
	struct emb_view_shard *v = s->view;
	uint64_t bit = 1ull << (idx & 63);

	if (idx >= v->limit || (v->seen[idx >> 6] & bit))
		return;
	v->seen[idx >> 6] |= bit;
	save_rec(t, s, emb__shard_row(t, s, idx));
}

void emb__view_save_cold(struct emb_table *t, struct emb_shard *s,
			 const void *rec)
{
	save_rec(t, s, rec);
}

/* Detaches and frees shard s's view state. Caller holds the lock. */
static void drop_shard(struct emb_table *t, struct emb_shard *s)
{
	struct emb_view_shard *v = s->view;

	if (!v)
		return;
	if (v->tw)
		t->tier_view->leave(t, (uint32_t)(s - t->shards), v->tw);
	s->view = NULL;
	emb__mem_charge(t, -(int64_t)v->cap * t->row_bytes);
	free(v->saved);
	free(v->seen);
	free(v);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int emb_table_view_create(struct emb_table *t, struct emb_table_view **out)
{
	struct emb_table_view *vw;
	uint64_t t0;
	uint32_t si;
	int rc = 0;

	if (!t || !out)
		return EMB_EBADARG;
	if (__atomic_exchange_n(&t->viewed, true, __ATOMIC_ACQ_REL))
		return -EBUSY;
	vw = calloc(1, sizeof(*vw));
	if (!vw) {
		__atomic_store_n(&t->viewed, false, __ATOMIC_RELEASE);
		return -ENOMEM;
	}
	vw->t = t;
	t0 = mono_ns();
	__atomic_store_n(&t->fence, 1, __ATOMIC_SEQ_CST);
	while (writers_in(t))
		sched_yield();
	/* All at once: pulls may still make rows, and evict remove them. */
	for (si = 0; si < t->nshards; si++)
		pthread_mutex_lock(&t->shards[si].lock);
	for (si = 0; si < t->nshards && !rc; si++) {
		struct emb_shard *s = &t->shards[si];
		struct emb_view_shard *v = calloc(1, sizeof(*v));

		if (v)
			v->seen = calloc((s->next_idx + 63) / 64 + 1,
					 sizeof(*v->seen));
		if (!v || !v->seen) {
			free(v);
			rc = -ENOMEM;
			break;
		}
		v->limit = s->next_idx;
		s->view = v;
		/* A tiered shard's cold rows at the instant, too. */
		if (t->tier && (rc = t->tier_view->enter(t, si, &v->tw)))
			break;
	}
	vw->step = __atomic_load_n(&t->step, __ATOMIC_RELAXED);
	vw->rows = __atomic_load_n(&t->rows, __ATOMIC_RELAXED);
	if (rc)
		for (si = 0; si < t->nshards; si++)
			drop_shard(t, &t->shards[si]);
	for (si = t->nshards; si-- > 0;)
		pthread_mutex_unlock(&t->shards[si].lock);
	__atomic_store_n(&t->fence, 0, __ATOMIC_SEQ_CST);
	vw->pause_ns = mono_ns() - t0;
	if (rc) {
		free(vw);
		__atomic_store_n(&t->viewed, false, __ATOMIC_RELEASE);
		return rc;
	}
	*out = vw;
	return 0;
}

uint64_t emb_table_view_step(const struct emb_table_view *vw)
{
	return vw->step;
}

uint64_t emb_table_view_rows(const struct emb_table_view *vw)
{
	return vw->rows;
}

uint64_t emb_table_view_pause_ns(const struct emb_table_view *vw)
{
	return vw->pause_ns;
}

int emb_table_view_next(struct emb_table_view *vw, uint64_t *ids, float *rows,
			struct emb_row_meta *meta, uint32_t max)
{
	struct emb_table *t = vw->t;
	uint32_t got = 0;
	int rc = 0;

	if (!ids || !rows)
		return EMB_EBADARG;
	while (got < max && vw->shard < t->nshards && !rc) {
		struct emb_shard *s = &t->shards[vw->shard];
		struct emb_view_shard *v;

		pthread_mutex_lock(&s->lock);
		v = s->view;
		if (v->broken) {
			rc = EMB_EMEMLIMIT;
			pthread_mutex_unlock(&s->lock);
			break;
		}
		while (got < max && vw->idx < v->limit) {
			uint32_t i = vw->idx++;
			uint64_t bit = 1ull << (i & 63);
			struct emb_row_hdr *r;

			if (v->seen[i >> 6] & bit)
				continue;
			v->seen[i >> 6] |= bit;
			r = emb__shard_row(t, s, i);
			if (r->count & EMB_ROW_FREE)
				continue;
			emb__row_put(t, r, got++, ids, rows, meta);
		}
		/* Every live record read: a tiered shard's cold rows of the
		 * instant (tier.c; it may drop the lock and save more)... */
		if (v->tw && got < max && vw->idx >= v->limit &&
		    !t->tier_view->done(v->tw)) {
			rc = t->tier_view->rest(t, s, vw->shard, v->tw, false,
						 ids, rows, meta, &got, max);
			if (!rc && v->broken)
				rc = EMB_EMEMLIMIT;
			if (rc || !t->tier_view->done(v->tw)) {
				pthread_mutex_unlock(&s->lock);
				continue;
			}
		}
		/* ...then the saved ones, then let go. */
		while (got < max && vw->idx >= v->limit &&
		       (!v->tw || t->tier_view->done(v->tw)) &&
		       vw->saved_pos < v->nsaved)
			emb__row_put(
			    t,
			    (const struct emb_row_hdr
				 *)(const void *)(v->saved +
						  (size_t)vw->saved_pos++ *
						      t->row_bytes),
			    got++, ids, rows, meta);
		if (vw->idx >= v->limit && vw->saved_pos >= v->nsaved &&
		    (!v->tw || t->tier_view->done(v->tw))) {
			drop_shard(t, s);
			vw->shard++;
			vw->idx = 0;
			vw->saved_pos = 0;
		}
		pthread_mutex_unlock(&s->lock);
	}
	return rc ? rc : (int)got;
}

void emb_table_view_destroy(struct emb_table_view *vw)
{
	struct emb_table *t;

	if (!vw)
		return;
	t = vw->t;
	for (uint32_t si = vw->shard; si < t->nshards; si++) {
		pthread_mutex_lock(&t->shards[si].lock);
		drop_shard(t, &t->shards[si]);
		pthread_mutex_unlock(&t->shards[si].lock);
	}
	__atomic_store_n(&t->viewed, false, __ATOMIC_RELEASE);
	free(vw);
}
