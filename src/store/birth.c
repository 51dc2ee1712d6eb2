/*
 * src/store/birth.c - births: the number each row of a table is given
 * when made, from a counter per slot (store.h, "Births"; why a replicated
 * table with eviction needs them: docs/replication.md, "Eviction with
 * replicas").
 *
 * Each shard keeps a side array, a birth per record index, beside vslot
 * and for the same reason: the 16-byte record header has no room, and a
 * reader of births (the primary's answer to a client's ask, a backup's
 * check of its slots) reads 4 bytes a row, not the row. shard.c owns the
 * array as it owns vslot: it grows with the shard's slabs
 * (emb__birth_reserve()), and emb__shard_insert() gives each new record
 * the next birth of its slot; this file calls shard.c, never the other
 * way. The counters are per table, one
 * per slot, and atomic: a slot's ids hash to every shard.
 *
 * Numbering is switched on once and never off: births_on is set
 * (release) only after every shard has its array, so a caller that sees
 * it may read any shard's (under that shard's lock). A shard numbers its
 * new records from the moment it has its array; rows made before keep 0.
 */
#include "store/store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* The counters once numbering is on (every shard has its array), or NULL. */
static uint32_t *counters(const struct emb_table *t)
{
	return __atomic_load_n(&t->births_on, __ATOMIC_ACQUIRE) ? t->slot_birth
								 : NULL;
}

int emb_table_births_enable(struct emb_table *t)
{
	int rc = 0;

	if (!t)
		return EMB_EBADARG;
	if (t->tier)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&t->life_lock);
	if (counters(t)) {
		pthread_mutex_unlock(&t->life_lock);
		return 0;
	}
	/* The counters first, kept from then on (a failed try leaves them
	 * to the next): a shard numbers its new records once it has its
	 * array, which it is given under its lock, and reads the counters
	 * there. */
	if (!t->slot_birth) {
		uint32_t *c = calloc(EMB_NSLOTS, sizeof(*c));

		if (!c) {
			pthread_mutex_unlock(&t->life_lock);
			return -ENOMEM;
		}
		emb__mem_charge_force(t, EMB_NSLOTS * sizeof(*c));
		t->slot_birth = c;
	}
	for (uint32_t i = 0; i < t->nshards && !rc; i++) {
		struct emb_shard *s = &t->shards[i];

		pthread_mutex_lock(&s->lock);
		rc = emb__birth_reserve(t, s, s->nslabs * t->rows_per_slab);
		pthread_mutex_unlock(&s->lock);
	}
	if (rc) {
		/* No half-numbered table: every shard stops numbering. */
		for (uint32_t i = 0; i < t->nshards; i++) {
			struct emb_shard *s = &t->shards[i];

			pthread_mutex_lock(&s->lock);
			emb__mem_charge(t, -(int64_t)s->birth_cap *
					       (int64_t)sizeof(uint32_t));
			free(s->birth);
			s->birth = NULL;
			__atomic_store_n(&s->birth_cap, 0, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&s->lock);
		}
	} else {
		__atomic_store_n(&t->births_on, true, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&t->life_lock);
	return rc;
}

bool emb_table_has_births(const struct emb_table *t)
{
	return t && counters(t);
}

/* Calls fn(s, idx or -1, i, arg) for each ids[i] under its shard's lock. */
static void each_id(struct emb_table *t, const uint64_t *ids, uint32_t n,
		    void (*fn)(struct emb_table *t, struct emb_shard *s,
			       int64_t idx, uint32_t i, void *arg),
		    void *arg)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t h = emb_id_hash(ids[i]);
		struct emb_shard *s = &t->shards[h & t->shard_mask];

		pthread_mutex_lock(&s->lock);
		fn(t, s, emb__shard_find(t, s, ids[i], h), i, arg);
		pthread_mutex_unlock(&s->lock);
	}
}

struct births_get {
	uint32_t *births;
	int found;
};

static void get_one(struct emb_table *t, struct emb_shard *s, int64_t idx,
		    uint32_t i, void *arg)
{
	struct births_get *g = arg;

	(void)t;
	if (idx < 0) {
		g->births[i] = EMB_BIRTH_NONE;
		return;
	}
	/* A table that numbers no rows: 0, a row of no known birth. */
	g->births[i] = s->birth ? s->birth[idx] : 0;
	g->found++;
}

int emb_table_births(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     uint32_t *births)
{
	struct births_get g = {.births = births};

	if (!t || (n && (!ids || !births)))
		return EMB_EBADARG;
	/* A cold row is a row too, and only a read finds it. */
	if (t->tier)
		return -EOPNOTSUPP;
	each_id(t, ids, n, get_one, &g);
	return g.found;
}

struct births_put {
	const uint64_t *ids;
	const uint32_t *births;
	int set;
};

static void set_one(struct emb_table *t, struct emb_shard *s, int64_t idx,
		    uint32_t i, void *arg)
{
	struct births_put *g = arg;
	const uint32_t b = g->births[i];

	if (idx < 0 || b == EMB_BIRTH_NONE)
		return;
	s->birth[idx] = b;
	emb__birth_raise(t, emb_id_slot(g->ids[i]), b);
	g->set++;
}

int emb_table_births_set(struct emb_table *t, const uint64_t *ids, uint32_t n,
			 const uint32_t *births)
{
	struct births_put g = {.ids = ids, .births = births};

	if (!t || !counters(t) || (n && (!ids || !births)))
		return EMB_EBADARG;
	each_id(t, ids, n, set_one, &g);
	return g.set;
}

uint32_t emb_table_slot_birth(const struct emb_table *t, uint32_t slot)
{
	const uint32_t *c = t ? counters(t) : NULL;

	if (!c || slot >= EMB_NSLOTS)
		return 0;
	return __atomic_load_n(&c[slot], __ATOMIC_RELAXED);
}

void emb_table_slot_birth_raise(struct emb_table *t, uint32_t slot,
				uint32_t b)
{
	if (t && counters(t) && slot < EMB_NSLOTS && b != EMB_BIRTH_NONE)
		emb__birth_raise(t, slot, b);
}

uint64_t emb_table_births_dropped(const struct emb_table *t)
{
	return t ? __atomic_load_n(&t->births_dropped, __ATOMIC_RELAXED) : 0;
}

/* Calls fn(s, idx, r, arg) for each live record of the slots
 * [first, first + n), a shard at a time under its lock; stops at the
 * first fn that returns false. */
static int each_slot_row(struct emb_table *t, uint32_t first, uint32_t n,
			 bool (*fn)(struct emb_table *t, struct emb_shard *s,
				    uint32_t idx, struct emb_row_hdr *r,
				    void *arg),
			 void *arg)
{
	int rc = emb__slot_index(t);

	if (rc)
		return rc;
	for (uint32_t si = 0; si < t->nshards; si++) {
		struct emb_shard *s = &t->shards[si];
		bool go = true;

		pthread_mutex_lock(&s->lock);
		for (uint32_t i = 0; go && i < s->next_idx; i++) {
			struct emb_row_hdr *r;

			if ((uint32_t)s->vslot[i] - first >= n)
				continue;
			r = emb__shard_row(t, s, i);
			if (r->count & EMB_ROW_FREE)
				continue;
			go = fn(t, s, i, r, arg);
		}
		pthread_mutex_unlock(&s->lock);
		if (!go)
			break;
	}
	return 0;
}

struct births_list {
	uint64_t *ids;
	uint32_t *births;
	uint32_t cap;
	uint32_t got; /* rows seen, listed or not */
};

static bool list_one(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		     struct emb_row_hdr *r, void *arg)
{
	struct births_list *l = arg;

	(void)t;
	if (l->got < l->cap) {
		l->ids[l->got] = r->id;
		l->births[l->got] = s->birth[idx];
	}
	l->got++;
	return true;
}

static bool slots_ok(uint32_t first, uint32_t n)
{
	return n && first < EMB_NSLOTS && n <= EMB_NSLOTS - first;
}

int emb_table_births_list(struct emb_table *t, uint32_t first, uint32_t n,
			  uint32_t *marks, uint64_t *ids, uint32_t *births,
			  uint32_t cap)
{
	struct births_list l = {.ids = ids, .births = births, .cap = cap};
	const uint32_t *c = t ? counters(t) : NULL;
	int rc;

	if (!c || !slots_ok(first, n) || !marks || (cap && (!ids || !births)))
		return EMB_EBADARG;
	/* The marks before the walk: a row of a birth at or under its
	 * slot's mark existed when the walk began, so one the walk did not
	 * find was removed meanwhile. */
	for (uint32_t k = 0; k < n; k++)
		marks[k] = __atomic_load_n(&c[first + k], __ATOMIC_RELAXED);
	rc = each_slot_row(t, first, n, list_one, &l);
	if (rc)
		return rc;
	return l.got > INT32_MAX ? -EOVERFLOW : (int)l.got;
}

/* The primary's rows, sorted by id for the prune's look-ups. */
struct pair {
	uint64_t id;
	uint32_t birth;
};

static int pair_cmp(const void *a, const void *b)
{
	const struct pair *x = a, *y = b;

	return (x->id > y->id) - (x->id < y->id);
}

struct births_prune {
	uint32_t first;
	const uint32_t *marks;
	const struct pair *pairs;
	size_t m;
	uint64_t removed;
};

static bool prune_one(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		      struct emb_row_hdr *r, void *arg)
{
	struct births_prune *p = arg;
	const uint32_t have = s->birth[idx];
	const struct pair key = {.id = r->id};
	const struct pair *on;

	/* Newer than the primary's list: made since, keep. */
	if (have > p->marks[emb_id_slot(r->id) - p->first])
		return true;
	on = bsearch(&key, p->pairs, p->m, sizeof(*p->pairs), pair_cmp);
	/* The primary has this row, or a newer one that a push will make
	 * here again: only a row it no longer has at all, or has newer
	 * and never pushed, goes (the next push would make it again). */
	if (on && on->birth <= have)
		return true;
	emb__shard_remove(t, s, idx, emb_id_hash(r->id));
	p->removed++;
	return true;
}

int emb_table_births_prune(struct emb_table *t, uint32_t first, uint32_t n,
			   const uint32_t *marks, const uint64_t *ids,
			   const uint32_t *births, uint32_t m)
{
	struct births_prune p = {.first = first, .marks = marks, .m = m};
	struct pair *pairs;
	int rc;

	if (!t || !counters(t) || !slots_ok(first, n) || !marks ||
	    (m && (!ids || !births)))
		return EMB_EBADARG;
	pairs = malloc((size_t)(m ? m : 1) * sizeof(*pairs));
	if (!pairs)
		return -ENOMEM;
	for (uint32_t i = 0; i < m; i++) {
		pairs[i].id = ids[i];
		pairs[i].birth = births[i];
	}
	qsort(pairs, m, sizeof(*pairs), pair_cmp);
	p.pairs = pairs;
	/* A writer, as an erase is: a view being taken waits for it. */
	emb__writer_enter(t);
	rc = each_slot_row(t, first, n, prune_one, &p);
	emb__writer_exit(t);
	free(pairs);
	/* Counted as evictions: what the primary evicted, this holder
	 * removes too. */
	__atomic_fetch_sub(&t->rows, p.removed, __ATOMIC_RELAXED);
	__atomic_fetch_add(&t->rows_evicted, p.removed, __ATOMIC_RELAXED);
	if (rc)
		return rc;
	return p.removed > INT32_MAX ? INT32_MAX : (int)p.removed;
}
