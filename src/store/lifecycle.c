/*
 * src/store/lifecycle.c - admission filters and the eviction clock hand of
 * a table (common/lifecycle.h says what the policies mean).
 *
 * Every shard keeps its own part: a copy of the policy, its admission filter
 * (exact counters, or a slice of the counting Bloom filter) and a clock hand
 * over its record indexes. The batch operations in table.c call in with the
 * shard's lock held, so none of this needs locks of its own; only
 * emb_table_set_lifecycle() takes the table's life_lock to serialise changes.
 * Nothing here is allocated while admission and eviction are off: a table
 * that never sets a policy pays one NULL test per shard group. On a tiered
 * table a sweep asks tier.c to evict cold rows first (emb__tier_evict), and
 * its rows' last_step is the tier's clock, which emb__tier_idle_upto maps
 * ttl's steps to (docs/store.md, "Eviction on a tiered table").
 */
#include "store/store_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"

#define ADMIT_SALT    0x5bd1e9955bd1e995ull /* filter hash apart from h */
#define CNT_MIN_SLOTS 64u
#define BLOOM_K	      3u
#define SAMPLE	      8u    /* rows compared per max_rows victim */
#define SWEEP_BASE    16u   /* records the hand visits per group, at least */
#define SWEEP_MAX     8192u /* at most, so a group's pause stays short */

static uint64_t filter_hash(uint64_t id)
{
	return emb_id_hash(id ^ ADMIT_SALT);
}

/* ---- exact counters: open addressing, counts[i] == 0 is empty ---- */

static uint64_t cnt_bytes(uint32_t nslots)
{
	return (uint64_t)nslots * (sizeof(uint64_t) + sizeof(uint16_t));
}

static void cnt_free(struct emb_table *t, struct emb_life_shard *l)
{
	if (l->cnt_slots)
		emb__mem_charge(t, -(int64_t)cnt_bytes(l->cnt_slots));
	free(l->cnt_ids);
	l->cnt_ids = NULL;
	l->cnt_counts = NULL;
	__atomic_store_n(&l->cnt_slots, 0, __ATOMIC_RELAXED);
	l->cnt_used = 0;
}

static void cnt_place(uint64_t *ids, uint16_t *counts, uint32_t mask,
		      uint64_t id, uint16_t c)
{
	uint32_t i = (uint32_t)(filter_hash(id) >> 32) & mask;

	while (counts[i])
		i = (i + 1) & mask;
	ids[i] = id;
	counts[i] = c;
}

/* Doubles the counter table (or makes the first); 0 or EMB_EMEMLIMIT /
 * -ENOMEM with the old table kept. */
static int cnt_grow(struct emb_table *t, struct emb_life_shard *l)
{
	uint32_t n = l->cnt_slots ? 2 * l->cnt_slots : CNT_MIN_SLOTS;
	uint64_t *ids;
	uint16_t *counts;
	int rc;

	if (n < l->cnt_slots)
		return -ENOMEM;
	rc = emb__mem_charge(t, (int64_t)cnt_bytes(n));
	if (rc)
		return rc;
	ids = malloc(cnt_bytes(n));
	if (!ids) {
		emb__mem_charge(t, -(int64_t)cnt_bytes(n));
		return -ENOMEM;
	}
	counts = (uint16_t *)(void *)(ids + n);
	memset(counts, 0, (size_t)n * sizeof(*counts));
	for (uint32_t i = 0; i < l->cnt_slots; i++)
		if (l->cnt_counts[i])
			cnt_place(ids, counts, n - 1, l->cnt_ids[i],
				  l->cnt_counts[i]);
	if (l->cnt_slots)
		emb__mem_charge(t, -(int64_t)cnt_bytes(l->cnt_slots));
	free(l->cnt_ids);
	l->cnt_ids = ids;
	l->cnt_counts = counts;
	__atomic_store_n(&l->cnt_slots, n, __ATOMIC_RELAXED);
	return 0;
}

/* Removes slot i with backward-shift deletion, so probes need no
 * tombstones. */
static void cnt_delete(struct emb_life_shard *l, uint32_t i)
{
	uint32_t mask = l->cnt_slots - 1, hole = i, pos = i;

	for (;;) {
		uint32_t home;

		pos = (pos + 1) & mask;
		if (!l->cnt_counts[pos])
			break;
		home = (uint32_t)(filter_hash(l->cnt_ids[pos]) >> 32) & mask;
		/* pos may move into the hole iff its home is not in
		 * (hole, pos], cyclically. */
		if (((pos - home) & mask) >= ((pos - hole) & mask)) {
			l->cnt_ids[hole] = l->cnt_ids[pos];
			l->cnt_counts[hole] = l->cnt_counts[pos];
			hole = pos;
		}
	}
	l->cnt_counts[hole] = 0;
	l->cnt_used--;
}

/* One sighting of id: 1 when this one admits it (its counter is gone),
 * 0 when still pending, or a negative error. */
static int cnt_sight(struct emb_table *t, struct emb_life_shard *l, uint64_t id)
{
	uint32_t mask, i;
	int rc;

	if (4 * ((uint64_t)l->cnt_used + 1) > 3 * (uint64_t)l->cnt_slots) {
		rc = cnt_grow(t, l);
		if (rc)
			return rc;
	}
	mask = l->cnt_slots - 1;
	i = (uint32_t)(filter_hash(id) >> 32) & mask;
	while (l->cnt_counts[i] && l->cnt_ids[i] != id)
		i = (i + 1) & mask;
	if (!l->cnt_counts[i]) {
		/* admit_n >= 2: a first sighting never admits. */
		l->cnt_ids[i] = id;
		l->cnt_counts[i] = 1;
		l->cnt_used++;
		return 0;
	}
	if (++l->cnt_counts[i] < l->cfg.admit_n)
		return 0;
	cnt_delete(l, i);
	return 1;
}

/* ---- counting Bloom filter: 8-bit counters, k = 3 ---- */

static void bloom_pos(const struct emb_life_shard *l, uint64_t id,
		      uint32_t pos[BLOOM_K])
{
	uint64_t g = filter_hash(id), g2 = emb_id_hash(g);

	pos[0] = emb_fastrange32((uint32_t)g, l->bloom_n);
	pos[1] = emb_fastrange32((uint32_t)(g >> 32), l->bloom_n);
	pos[2] = emb_fastrange32((uint32_t)g2, l->bloom_n);
}

/*
 * One sighting, with conservative update: only the counters at the id's
 * current estimate (the least of its k) go up, which keeps collisions from
 * inflating the others and lowers false admissions. Saturates at 255. The
 * filter never forgets: an admitted id that is evicted later is admitted
 * again at its next sighting. (Taking admit_n back off its counters would
 * let it start over, but then ids sharing a counter with a wrongly admitted
 * one lose sightings: measured, 16% of ids seen twice stayed out.)
 */
static int bloom_sight(struct emb_life_shard *l, uint64_t id)
{
	uint32_t pos[BLOOM_K], est = 255;

	bloom_pos(l, id, pos);
	for (uint32_t k = 0; k < BLOOM_K; k++)
		if (l->bloom[pos[k]] < est)
			est = l->bloom[pos[k]];
	if (est < 255) {
		est++;
		for (uint32_t k = 0; k < BLOOM_K; k++)
			if (l->bloom[pos[k]] < est)
				l->bloom[pos[k]] = (uint8_t)est;
	}
	return est >= l->cfg.admit_n;
}

int emb__admit_sight(struct emb_table *t, struct emb_life_shard *l, uint64_t id)
{
	switch (l->cfg.admit) {
	case EMB_ADMIT_COUNT:
		return cnt_sight(t, l, id);
	case EMB_ADMIT_BLOOM:
		return bloom_sight(l, id);
	default:
		return 1;
	}
}

int emb__admit_batch_sight(struct emb_table *t, struct emb_life_shard *l,
			   struct emb_admit_batch *b, uint32_t n, uint64_t id)
{
	uint32_t i;
	int a;

	if (!b->ids) {
		uint32_t size = 16;

		while (size < 2 * (uint64_t)n)
			size <<= 1;
		b->ids = emb__scratch(EMB_SCRATCH_ADMIT,
				      (size_t)size * (sizeof(*b->ids) + 1));
		if (!b->ids)
			return -ENOMEM;
		b->used = (uint8_t *)(b->ids + size);
		memset(b->used, 0, size);
		b->mask = size - 1;
	}
	i = (uint32_t)filter_hash(id) & b->mask;
	for (; b->used[i]; i = (i + 1) & b->mask)
		if (b->ids[i] == id)
			return 0; /* sighted earlier in this call */
	a = emb__admit_sight(t, l, id);
	if (a == 0) {
		b->ids[i] = id;
		b->used[i] = 1;
	}
	return a;
}

void emb__admit_batch_fini(struct emb_admit_batch *b)
{
	emb__scratch_done(b->ids);
	b->ids = NULL;
}

/* ---- eviction: the clock hand ---- */

/* Larger is a better victim: older for LRU, rarer for LFU. */
static uint64_t victim_score(const struct emb_life_shard *l,
			     const struct emb_row_hdr *r, uint32_t step)
{
	if (l->cfg.order == EMB_EVICT_LFU)
		return (uint64_t)EMB_ROW_COUNT_MAX - r->count;
	return step - r->last_step;
}

/*
 * Records the hand visits after a group of nids ids: enough for each policy
 * and no more. ttl: the whole shard twice per ttl steps (a step is a push
 * batch; pulls sweep too), so a row goes at most about ttl / 2 steps late.
 * min_l2: 4 per id, as norms change where pushes land and where rows are
 * made. Over max_rows: 2 * SAMPLE per row over the share, the visits that
 * pick its victim. Measured on Zipf traffic over 100M ids with ttl:2000,
 * a fixed 64 + 16 per id made the run 3.5x slower than without eviction.
 */
static uint64_t sweep_budget(const struct emb_shard *s,
			     const struct emb_life_shard *l, uint32_t nids,
			     uint64_t rows)
{
	uint64_t want = SWEEP_BASE, v;

	if (l->cfg.ttl_steps) {
		v = 2 * (uint64_t)s->next_idx / l->cfg.ttl_steps + SWEEP_BASE;
		want = v > want ? v : want;
	}
	if (l->cfg.min_l2 > 0.0f) {
		v = 4 * (uint64_t)nids + SWEEP_BASE;
		want = v > want ? v : want;
	}
	if (l->cap && rows > l->cap) {
		v = 2 * SAMPLE * (rows - l->cap);
		/* The hand passes held rows by: as many more visits as it
		 * meets them. (Free records cost none: emb__evict_sweep().) */
		if (s->used > s->held && s->held)
			v = v * s->used / (s->used - s->held);
		v += SWEEP_BASE;
		want = v > want ? v : want;
	}
	return want < SWEEP_MAX ? want : SWEEP_MAX;
}

/* The shard's rows: in DRAM, and on its tier's device. max_rows bounds
 * both: a tiered table's cold rows are rows of the table all the same.
 * Rows of held slots are not counted: no eviction here may remove them
 * (a backup's copies, which follow their primary's evictions; a moving
 * slot's), and counting them would make the others pay for them. */
static uint64_t shard_rows(struct emb_table *t, struct emb_shard *s)
{
	return s->used - emb__shard_held(t, s) +
	       (t->tier ? emb__tier_cold_of(t, (uint32_t)(s - t->shards)) : 0);
}

bool emb__evict_wanted(struct emb_table *t, struct emb_shard *s,
		       const struct emb_life_shard *l)
{
	return l->cfg.ttl_steps || l->cfg.min_l2 > 0.0f ||
	       (l->cap && shard_rows(t, s) > l->cap);
}

/*
 * A tiered shard's cold rows first (tier.c, "eviction of cold rows"):
 * they are the coldest of the shard, as demotion sends the least used
 * rows to the device, and most of them are looked at by block without
 * a read. step is the batch's tick; *idle and *upto get the ttl test in
 * ticks for the DRAM hand (docs/store.md, "The device tier").
 */
static void sweep_cold(struct emb_table *t, struct emb_shard *s,
		       struct emb_life_shard *l, uint32_t step, bool *idle,
		       uint32_t *upto, struct emb_evict_counts *out)
{
	uint32_t si = (uint32_t)(s - t->shards);
	uint64_t rows = shard_rows(t, s), cold = emb__tier_cold_of(t, si);
	struct emb_tier_evict e = {.now = step,
				   .ttl_steps = l->cfg.ttl_steps,
				   .min_l2 = l->cfg.min_l2};

	*idle = l->cfg.ttl_steps &&
		emb__tier_idle_upto(t, l->cfg.ttl_steps, upto);
	e.idle = *idle;
	e.upto = *upto;
	if (l->cap && rows > l->cap)
		e.over = rows - l->cap < cold ? rows - l->cap : cold;
	/* A read error is logged there; the rows wait for a later sweep. */
	(void)emb__tier_evict(t, s, si, &e, out);
}

/* Whether the shard, cold rows in hand (sweep_cold() may have changed
 * them), holds more than its share: the hand's test at every record. */
static bool over_share(const struct emb_shard *s,
		       const struct emb_life_shard *l, uint64_t cold)
{
	return l->cap && s->used - s->held + cold > l->cap;
}

void emb__evict_sweep(struct emb_table *t, struct emb_shard *s,
		      struct emb_life_shard *l, uint32_t step, uint32_t nids,
		      struct emb_evict_counts *out)
{
	uint64_t budget, frees;
	uint32_t best = UINT32_MAX, sampled = 0, upto = 0;
	uint64_t best_score = 0, cold = 0;
	bool idle = l->cfg.ttl_steps != 0;

	if (t->tier) {
		sweep_cold(t, s, l, step, &idle, &upto, out);
		cold = emb__tier_cold_of(t, (uint32_t)(s - t->shards));
	}
	/* Counted again here if the hold changed: s->held is current for
	 * sweep_budget() and the hand below. */
	budget = sweep_budget(s, l, nids, s->used - emb__shard_held(t, s) + cold);

	if (budget > SWEEP_MAX)
		budget = SWEEP_MAX;
	/*
	 * Over the cap, free records are passed without spending the budget,
	 * each at most once (and SWEEP_MAX at most): they lie in runs (a
	 * demotion or an eviction frees many records together), so an
	 * allowance for them in proportion to their number fell short where
	 * the hand met a run. store/tier's max_rows case found a shard 2
	 * rows over its cap after a batch whose every visit, 54 of them, was
	 * a free record, with 1,322 live of 1,606.
	 */
	frees = s->next_idx - s->used;
	if (frees > SWEEP_MAX)
		frees = SWEEP_MAX;
	while (s->next_idx) {
		struct emb_row_hdr *r;
		uint32_t idx;
		int32_t age;

		if (l->hand >= s->next_idx)
			l->hand = 0;
		idx = l->hand;
		r = emb__shard_row(t, s, idx);
		if ((r->count & EMB_ROW_FREE) && frees &&
		    over_share(s, l, cold)) {
			frees--;
			l->hand++;
			continue;
		}
		if (!budget)
			break;
		budget--;
		l->hand++;
		if (r->count & EMB_ROW_FREE)
			continue;
		/* A row read or written this step (or by a newer push) may
		 * have been handed out by this very batch: never evict it. */
		age = (int32_t)(step - r->last_step);
		if (age <= 0 || emb__evict_held(t, r->id))
			continue;
		/* A tiered table's last_step is a tick: upto says which
		 * ticks are idle past ttl. */
		if (idle && (t->tier ? (int32_t)(r->last_step - upto) <= 0
				     : (uint32_t)age > l->cfg.ttl_steps)) {
			emb__shard_remove(t, s, idx, emb_id_hash(r->id));
			out->ttl++;
			continue;
		}
		if (l->cfg.min_l2 > 0.0f && emb__row_l2(t, r) < l->cfg.min_l2) {
			emb__shard_remove(t, s, idx, emb_id_hash(r->id));
			out->l2++;
			continue;
		}
		if (!over_share(s, l, cold)) {
			if (!l->cfg.ttl_steps && l->cfg.min_l2 <= 0.0f)
				break; /* nothing left to look for */
			continue;
		}
		/* Over the cap: evict the best of every SAMPLE rows passed
		 * (sampled LRU/LFU, as Redis does), which needs no list. */
		if (best == UINT32_MAX ||
		    victim_score(l, r, step) > best_score) {
			best = idx;
			best_score = victim_score(l, r, step);
		}
		if (++sampled == SAMPLE) {
			struct emb_row_hdr *v = emb__shard_row(t, s, best);

			emb__shard_remove(t, s, best, emb_id_hash(v->id));
			out->cap++;
			best = UINT32_MAX;
			sampled = 0;
		}
	}
}

/* ---- setting a policy ---- */

static uint64_t shard_cap(const struct emb_table *t, uint64_t max_rows)
{
	return max_rows ? (max_rows + t->nshards - 1) / t->nshards : 0;
}

static uint32_t bloom_slice(const struct emb_table *t,
			    const struct emb_lifecycle_cfg *c)
{
	uint32_t bytes = c->bloom_bytes ? c->bloom_bytes : EMB_BLOOM_BYTES_DEF;
	uint32_t n = bytes / t->nshards;

	return n < 64 ? 64 : n;
}

static bool same_filter(const struct emb_lifecycle_cfg *a,
			const struct emb_lifecycle_cfg *b)
{
	return a->admit == b->admit && a->admit_n == b->admit_n &&
	       a->bloom_bytes == b->bloom_bytes;
}

/* True when c is an eviction policy (pulls record accesses under it). */
static bool is_eviction(const struct emb_lifecycle_cfg *c)
{
	return c->ttl_steps || c->min_l2 > 0.0f || c->max_rows;
}

/*
 * Pulls do not record accesses while no eviction policy is set, so when
 * one is set, a row's last_step is its last write (push, assign,
 * creation), however often it was pulled since. Every live row of shard s
 * starts its idle time now instead, so that a new ttl does not evict rows
 * that were only read, all at once; counts stay those of writes. One walk
 * over the shard's records, under its lock, when the policy is set.
 * A tiered table's pulls do record accesses (its demotions go by them),
 * but not those served from the device, and a policy means the same on
 * either kind of table: its rows start now too, in its tier's ticks, and
 * its cold rows by their blocks (no read).
 */
static void stamp_rows(struct emb_table *t, struct emb_shard *s)
{
	uint32_t step =
	    t->tier ? emb__tier_stamp(t, (uint32_t)(s - t->shards))
		    : (uint32_t)__atomic_load_n(&t->step, __ATOMIC_RELAXED);

	for (uint32_t i = 0; i < s->next_idx; i++) {
		struct emb_row_hdr *r = emb__shard_row(t, s, i);

		if (!(r->count & EMB_ROW_FREE))
			r->last_step = step;
	}
}

int emb_table_set_lifecycle(struct emb_table *t,
			    const struct emb_lifecycle_cfg *c)
{
	struct emb_life_shard *life;
	uint8_t **blooms = NULL;
	uint32_t slice = 0;
	bool refilter;
	int rc;

	if (!t || !c)
		return EMB_EBADARG;
	rc = emb_lifecycle_validate(c);
	if (rc)
		return rc;
	pthread_mutex_lock(&t->life_lock);
	life = t->life;
	if (!life && emb_lifecycle_is_off(c))
		goto out; /* nothing to undo, nothing to allocate */
	if (!life) {
		life = aligned_alloc(64, t->nshards * sizeof(*life));
		if (!life) {
			rc = -ENOMEM;
			goto out;
		}
		memset(life, 0, t->nshards * sizeof(*life));
	}
	refilter = !same_filter(&t->opts.life, c);
	if (refilter && c->admit == EMB_ADMIT_BLOOM) {
		/* Everything that can fail happens before any shard changes. */
		slice = bloom_slice(t, c);
		blooms = calloc(t->nshards, sizeof(*blooms));
		rc = blooms ? emb__mem_charge(t, (int64_t)slice * t->nshards)
			    : -ENOMEM;
		if (rc)
			goto err_free;
		for (uint32_t i = 0; i < t->nshards; i++) {
			blooms[i] = calloc(slice, 1);
			if (!blooms[i]) {
				emb__mem_charge(t,
						-(int64_t)slice * t->nshards);
				rc = -ENOMEM;
				goto err_free;
			}
		}
	}
	for (uint32_t i = 0; i < t->nshards; i++) {
		struct emb_life_shard *l = &life[i];

		pthread_mutex_lock(&t->shards[i].lock);
		if (refilter) {
			cnt_free(t, l);
			if (l->bloom) {
				emb__mem_charge(t, -(int64_t)l->bloom_n);
				free(l->bloom);
			}
			l->bloom = blooms ? blooms[i] : NULL;
			__atomic_store_n(&l->bloom_n, blooms ? slice : 0,
					 __ATOMIC_RELAXED);
		}
		if (!emb__life_tracks(l) && is_eviction(c))
			stamp_rows(t, &t->shards[i]);
		/* Cold rows are checked against min_l2 when they go to the
		 * device; those there before it was set or raised, once. */
		if (t->tier && c->min_l2 > 0.0f && c->min_l2 > l->cfg.min_l2)
			emb__tier_l2_pass(t, i);
		l->cfg = *c;
		l->cap = shard_cap(t, c->max_rows);
		pthread_mutex_unlock(&t->shards[i].lock);
	}
	t->opts.life = *c;
	__atomic_store_n(&t->admits, c->admit, __ATOMIC_RELAXED);
	/* Publish once every shard is set up; readers load with acquire. */
	__atomic_store_n(&t->life, life, __ATOMIC_RELEASE);
	free(blooms);
	goto out;

err_free:
	if (blooms)
		for (uint32_t i = 0; i < t->nshards; i++)
			free(blooms[i]);
	free(blooms);
	if (life != t->life)
		free(life);
out:
	pthread_mutex_unlock(&t->life_lock);
	return rc;
}

void emb__life_destroy(struct emb_table *t)
{
	struct emb_life_shard *life = t->life;

	if (!life)
		return;
	for (uint32_t i = 0; i < t->nshards; i++) {
		cnt_free(t, &life[i]);
		if (life[i].bloom)
			emb__mem_charge(t, -(int64_t)life[i].bloom_n);
		free(life[i].bloom);
	}
	free(life);
	t->life = NULL;
}

bool emb_table_admits(const struct emb_table *t)
{
	return __atomic_load_n(&t->admits, __ATOMIC_RELAXED) != EMB_ADMIT_NONE;
}

uint64_t emb__life_filter_bytes(struct emb_table *t)
{
	struct emb_life_shard *life =
	    __atomic_load_n(&t->life, __ATOMIC_ACQUIRE);
	uint64_t bytes = 0;

	if (!life)
		return 0;
	/* Read without the shard locks, as the other stats are: a gauge. */
	for (uint32_t i = 0; i < t->nshards; i++)
		bytes += cnt_bytes(__atomic_load_n(&life[i].cnt_slots,
						   __ATOMIC_RELAXED)) +
			 __atomic_load_n(&life[i].bloom_n, __ATOMIC_RELAXED);
	return bytes;
}
