/*
 * src/store/shard.c - one shard: a linear-probing id index over records in
 * slabs. Every function here runs with the shard's lock held by the caller
 * (table.c), but emb__slot_index(), which takes each shard's lock itself.
 * The index grows by a next one built a few records per row made
 * ("Growing the index"), not by a rehash of the shard at once.
 */
#include "store/store_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"

/* Grow at 80% full by 1.5x: probes stay short (about 3 for a hit, 13 for a
 * miss at worst) while the index averages under 6 bytes per row. */
#define LOAD_NUM  4u
#define LOAD_DEN  5u
#define MIN_SLOTS 16u
#define REHASH_AHEAD 8u /* records a build prefetches ahead */
#define PLACE_BATCH 32u /* records whose home slots are prefetched at once */
#define VSLOT_STEP 1024u /* records a vslot build fills per lock hold */

static inline uint32_t home_pos(uint64_t h, uint32_t nslots)
{
	return emb_fastrange32((uint32_t)(h >> 18), nslots);
}

int emb__shard_init(struct emb_shard *s)
{
	memset(s, 0, sizeof(*s));
	return -pthread_mutex_init(&s->lock, NULL);
}

void emb__shard_fini(struct emb_table *t, struct emb_shard *s)
{
	for (uint32_t i = 0; i < s->nslabs; i++)
		emb__arena_free(t->arena, s->slabs[i]);
	free(s->slabs);
	free(s->slots);
	free(s->next_slots);
	emb__dirty_fini(s);
	pthread_mutex_destroy(&s->lock);
}

int64_t emb__shard_find(const struct emb_table *t, const struct emb_shard *s,
			uint64_t id, uint64_t h)
{
	uint32_t tag = emb__hash_tag(h);
	uint32_t n = s->nslots;
	uint32_t pos, v;

	if (!n)
		return -1;
	pos = home_pos(h, n);
	for (;;) {
		v = s->slots[pos];
		if (!v)
			return -1;
		if ((v & ~EMB_SLOT_IDX_MASK) == tag) {
			uint32_t idx = (v & EMB_SLOT_IDX_MASK) - 1;

			if (emb__shard_row(t, s, idx)->id == id)
				return idx;
		}
		if (++pos == n)
			pos = 0;
	}
}

static void place(uint32_t *slots, uint32_t n, uint64_t h, uint32_t v)
{
	uint32_t pos = home_pos(h, n);

	while (slots[pos])
		if (++pos == n)
			pos = 0;
	slots[pos] = v;
}

/*
 * Growing the index. A rehash of the whole shard at once (every record's
 * id read, every one placed again) held the shard's lock 10 to 35 ms at
 * 100,000 to 150,000 records, and a batch reaches every shard: a table
 * growing by a move's copy or by new ids stalled a pull or a push every
 * growth (docs/benchmarks.md, "Moving slots"). So the next index is built
 * while this one serves: from BUILD_NUM / BUILD_DEN full, each row made
 * places BUILD_STEP more records into it, walking the records in slab
 * order (a sequential scan the prefetcher follows), and the row that
 * finds every record placed swaps it in. Until then slots is the only
 * index anything reads, so no lookup changes; next_slots holds exactly
 * the live records below built:
 *  - a record made at or above built is reached by the walk later; one
 *    reused below it is placed in both (emb__shard_insert());
 *  - a record removed below built leaves both; at or above it, only
 *    slots, and the walk skips it as free (unlink_rec()).
 * With its pages faulted in first, one a step, a build started at 70 % is
 * done at 77 % (measured), before the 80 % that forces the rest at once
 * (grow_at), which happens only when rows are removed and made again in
 * the same records meanwhile.
 */
#define BUILD_NUM  7u	/* a build starts at 7/10 full */
#define BUILD_DEN  10u
#define BUILD_STEP 16u	/* records a row made places in the next index */
#define BUILD_ROWS 16u	/* rows made between two steps of the build */
#define TOUCH_PAGE 4096u /* bytes of the next index a step faults in */

static void set_size(struct emb_shard *s, uint32_t n)
{
	s->grow_at = (uint32_t)((uint64_t)n * LOAD_NUM / LOAD_DEN);
	s->build_at = (uint32_t)((uint64_t)n * BUILD_NUM / BUILD_DEN);
}

static int build_start_n(struct emb_table *t, struct emb_shard *s,
			 uint32_t n)
{
	uint32_t *slots;
	int rc;

	/* Both indexes are charged until the build ends. A tiered table's
	 * index grows with rows that came back from the device into
	 * records it already has: nothing to refuse then, and only the
	 * growth is charged, at once, as before builds. (Charging both
	 * there too moved its demotions enough to show an edge of max_rows:
	 * the eviction hand spent its visits on a run of free records,
	 * which it now passes without spending them, lifecycle.c.) */
	if (t->tier) {
		emb__mem_charge_force(t, ((uint64_t)n - s->nslots) * 4);
	} else {
		rc = emb__mem_charge(t, (int64_t)n * 4);
		if (rc)
			return rc;
	}
	slots = calloc(n, sizeof(*slots));
	if (!slots) {
		emb__mem_charge(t, -((int64_t)n - (t->tier ? s->nslots : 0)) *
				       4);
		return -ENOMEM;
	}
	s->next_slots = slots;
	__atomic_store_n(&s->next_nslots, n, __ATOMIC_RELAXED);
	s->built = 0;
	s->touched = 0;
	return 0;
}

static int build_start(struct emb_table *t, struct emb_shard *s)
{
	return build_start_n(t, s,
			     s->nslots ? s->nslots + s->nslots / 2 : MIN_SLOTS);
}

/* Places the live records of [built, built + max) in the next index; a
 * free record is skipped (it is in no index, or only in slots while its
 * removal is pending there: see unlink_rec()).
 *
 * Two kinds of miss, each taken many at a time rather than one by one:
 * the records' headers (a header every row_bytes is a stride the hardware
 * prefetcher follows late; with a cold table the walk waited on each, two
 * fifths of an insert's time at 1M rows), prefetched REHASH_AHEAD ahead;
 * and the next index's home slots, prefetched for PLACE_BATCH records
 * before any is placed. A build's steps interleave with every other
 * shard's, so its index is cold at each step: placed one by one, the
 * records of a 10M-row table's growth took twice as long as in one
 * rehash (docs/store.md, "Growing the index"). */
static void build_step(struct emb_table *t, struct emb_shard *s, uint32_t max)
{
	uint32_t idx = s->built;
	uint32_t end = s->next_idx - idx > max ? idx + max : s->next_idx;
	uint32_t *slots = s->next_slots, n = s->next_nslots;
	uint64_t hs[PLACE_BATCH];
	uint32_t vs[PLACE_BATCH], m = 0;

	/* First the index's pages, one a step: calloc's memory is fresh,
	 * and the walk's first step, placing at random over all of it,
	 * faulted every page in at once (1 to 3 ms a shard where a page
	 * costs 8 us; a table's shards grow together, so one batch met
	 * dozens: 30 to 120 ms). Only time: a page left untouched is
	 * still zeros. */
	if (max != UINT32_MAX &&
	    s->touched < ((size_t)n * sizeof(*slots) + TOUCH_PAGE - 1) /
			     TOUCH_PAGE) {
		((volatile char *)slots)[(size_t)s->touched++ * TOUCH_PAGE] =
		    0;
		return;
	}

	for (uint32_t j = idx; j < end && j < idx + REHASH_AHEAD; j++)
		__builtin_prefetch(emb__shard_row(t, s, j));
	for (; idx < end; idx++) {
		const struct emb_row_hdr *r = emb__shard_row(t, s, idx);
		uint64_t h;

		if (idx + REHASH_AHEAD < end)
			__builtin_prefetch(
			    emb__shard_row(t, s, idx + REHASH_AHEAD));
		if (r->count & EMB_ROW_FREE)
			continue;
		h = emb_id_hash(r->id);
		__builtin_prefetch(&slots[home_pos(h, n)], 1);
		hs[m] = h;
		vs[m++] = emb__hash_tag(h) | (idx + 1);
		if (m == PLACE_BATCH) {
			for (uint32_t j = 0; j < m; j++)
				place(slots, n, hs[j], vs[j]);
			m = 0;
		}
	}
	/* The last records, fewer than PLACE_BATCH. */
	for (uint32_t j = 0; j < m; j++)
		place(slots, n, hs[j], vs[j]);
	s->built = end;
}

/* The next index has every record: it becomes the index. */
static void build_finish(struct emb_table *t, struct emb_shard *s)
{
	if (!t->tier)
		emb__mem_charge(t, -(int64_t)s->nslots * 4);
	free(s->slots);
	s->slots = s->next_slots;
	__atomic_store_n(&s->nslots, s->next_nslots, __ATOMIC_RELAXED);
	set_size(s, s->next_nslots);
	s->next_slots = NULL;
	__atomic_store_n(&s->next_nslots, 0, __ATOMIC_RELAXED);
	s->built = 0;
}

/* Keeps the index able to take one more row: a step of the build under
 * way, a build started, or one finished at once at grow_at. */
static int index_room(struct emb_table *t, struct emb_shard *s)
{
	int rc;

	if (s->used + 1 > s->grow_at) {
		if (!s->next_slots && (rc = build_start(t, s)))
			return rc;
		build_step(t, s, UINT32_MAX);
	} else if (s->next_slots) {
		if (++s->build_rows == BUILD_ROWS) {
			s->build_rows = 0;
			build_step(t, s, BUILD_ROWS * BUILD_STEP);
		}
	} else if (s->used + 1 > s->build_at) {
		/* Refused (the memory limit): tried again by the next row,
		 * and at grow_at the refusal is the row's. */
		if (build_start(t, s))
			return 0;
		s->build_rows = 0;
	}
	if (s->next_slots && s->built == s->next_idx)
		build_finish(t, s);
	return 0;
}

/*
 * Room for a move. A join's target starts empty and its shards' indexes
 * grew by 1.5x about twenty times each on the way to a third of a 10M-row
 * table: every record was placed again two to three times, and the
 * build's steps were a fifth of the target's time (a paused join's
 * profile, docs/benchmarks.md, "Room for a move"). Sized at once for what
 * comes, the index is also emptier while the rows land, so each lookup of
 * a row not there yet (every one of them) stops sooner. A shard of at
 * most RESERVE_NOW records gets the new index at once; a fuller one
 * starts a build of it, stepped as any (its steps keep the lock short).
 */
#define RESERVE_NOW 4096u

bool emb__shard_reserve(struct emb_table *t, struct emb_shard *s,
			uint32_t more)
{
	uint64_t want = (uint64_t)s->used + more, n;

	/* Only past the 80 % that forces a growth: below it, the rows
	 * that come start one build at most, as they would anyway, and a
	 * later estimate a little over the last one (each chunk's rows
	 * vary) would make the index 1.5x again for nothing. */
	if (t->tier || s->next_slots || want <= s->grow_at)
		return false;
	/* Never smaller than the growth the rows would make anyway: a
	 * reserve for one chunk of many must not add builds. */
	n = want * BUILD_DEN / BUILD_NUM + 1;
	if (n < (uint64_t)s->nslots + s->nslots / 2)
		n = (uint64_t)s->nslots + s->nslots / 2;
	if (n > EMB_SHARD_ROWS_MAX || n <= s->nslots ||
	    build_start_n(t, s, (uint32_t)n))
		return false;
	s->build_rows = 0;
	if (s->used <= RESERVE_NOW) {
		build_step(t, s, UINT32_MAX);
		build_finish(t, s);
	}
	return true;
}

static int add_slab(struct emb_table *t, struct emb_shard *s)
{
	char *slab;
	int rc;

	if (s->nslabs == s->slabs_cap) {
		uint32_t ncap = s->slabs_cap ? 2 * s->slabs_cap : 4;
		char **v = realloc(s->slabs, ncap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->slabs = v;
		s->slabs_cap = ncap;
	}
	if (emb__dirty_reserve(s, (s->nslabs + 1) * t->rows_per_slab))
		return -ENOMEM;
	if (s->vslot) {
		rc = emb__vslot_reserve(t, s,
					(s->nslabs + 1) * t->rows_per_slab);
		if (rc)
			return rc;
	}
	if (s->birth) {
		rc = emb__birth_reserve(t, s,
					(s->nslabs + 1) * t->rows_per_slab);
		if (rc)
			return rc;
	}
	if (s->tier_pinned || s->tier_force_slabs) {
		emb__mem_charge_force(t, t->slab_alloc_bytes);
		if (s->tier_force_slabs)
			s->tier_force_slabs--;
	} else if ((rc = emb__mem_charge(t, (int64_t)t->slab_alloc_bytes)))
		return rc;
	/* From the table's arena whether charged or forced past the limit
	 * (a tier's walks and short groups): its extent hook registers
	 * every extent for RDMA, so a remote-readable tiered table's rows
	 * in such slabs are READ like any. */
	slab = emb__arena_alloc(t->arena, t->slab_bytes);
	if (!slab) {
		emb__mem_charge(t, -(int64_t)t->slab_alloc_bytes);
		return EMB_EARENA;
	}
	s->slabs[s->nslabs] = slab;
	__atomic_store_n(&s->nslabs, s->nslabs + 1, __ATOMIC_RELAXED);
	return 0;
}

int64_t emb__shard_insert(struct emb_table *t, struct emb_shard *s, uint64_t id,
			  uint64_t h)
{
	struct emb_row_hdr *r;
	uint32_t idx;
	int rc;

	if ((rc = index_room(t, s)))
		return rc;
	if (s->free_head) {
		idx = s->free_head - 1;
		r = emb__shard_row(t, s, idx);
		s->free_head = r->last_step;
	} else {
		if (s->next_idx >= EMB_SHARD_ROWS_MAX)
			return -ENOSPC;
		if (s->next_idx == s->nslabs * t->rows_per_slab) {
			rc = add_slab(t, s);
			if (rc)
				return rc;
		}
		idx = s->next_idx++;
		r = emb__shard_row(t, s, idx);
	}
	/* A reused record's seal is broken since its removal, so a reader
	 * sees no valid row until the creator seals the new one. */
	r->id = id;
	r->last_step = 0;
	r->count = 0;
	if (s->vslot)
		s->vslot[idx] = (uint16_t)emb_fastrange32((uint32_t)(h >> 32),
							  EMB_NSLOTS);
	/* The next birth of its slot; a holder given the row's birth by
	 * the primary (emb_table_push_births()) sets it over this one. */
	if (s->birth)
		s->birth[idx] = __atomic_add_fetch(
		    &t->slot_birth[emb_fastrange32((uint32_t)(h >> 32),
						   EMB_NSLOTS)],
		    1, __ATOMIC_RELAXED);
	place(s->slots, s->nslots, h, emb__hash_tag(h) | (idx + 1));
	/* Below the build's walk: the walk will not reach it. */
	if (s->next_slots && idx < s->built)
		place(s->next_slots, s->next_nslots, h,
		      emb__hash_tag(h) | (idx + 1));
	s->used++;
	s->held += emb__evict_held(t, id);
	/* A new row is a change the next delta checkpoint must carry. */
	emb__dirty_mark(s, idx);
	if (s->view)
		emb__view_born(s, idx);
	return idx;
}

/* Takes the entry of record want - 1 (home h) out of an index of n slots. */
static void index_remove(const struct emb_table *t, const struct emb_shard *s,
			 uint32_t *slots, uint32_t n, uint64_t h, uint32_t want)
{
	uint32_t hole, pos, home;

	hole = home_pos(h, n);
	while ((slots[hole] & EMB_SLOT_IDX_MASK) != want)
		if (++hole == n)
			hole = 0;
	/* Backward-shift deletion: pull later entries of the run into the
	 * hole unless that would move them before their home slot. */
	pos = hole;
	for (;;) {
		uint32_t v;

		if (++pos == n)
			pos = 0;
		v = slots[pos];
		if (!v)
			break;
		home = home_pos(
		    emb_id_hash(
			emb__shard_row(t, s, (v & EMB_SLOT_IDX_MASK) - 1)->id),
		    n);
		/* Entry at pos may fill the hole iff home is not in (hole,
		 * pos]. */
		if (hole <= pos ? (home <= hole || home > pos)
				: (home <= hole && home > pos)) {
			slots[hole] = v;
			hole = pos;
		}
	}
	slots[hole] = 0;
}

/* Takes record idx out of the index and frees it; erased: the row is
 * gone (recorded for checkpoints and moves), not moved to the device. */
static void unlink_rec(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       uint64_t h, bool erased)
{
	uint32_t want = idx + 1;
	struct emb_row_hdr *r;

	index_remove(t, s, s->slots, s->nslots, h, want);
	/* At or above the build's walk it is not in the next index yet,
	 * and the walk will find it free. */
	if (s->next_slots && idx < s->built)
		index_remove(t, s, s->next_slots, s->next_nslots, h, want);
	s->used--;

	r = emb__shard_row(t, s, idx);
	/* Counted with the hold it was made under; a hold changed since is
	 * counted again before it is read (emb__shard_held()). */
	if (s->held && emb__evict_held(t, r->id))
		s->held--;
	if (erased)
		emb__dirty_erased(s, r->id);
	if (s->view)
		emb__view_save(t, s, idx);
	emb__row_unseal(t, r);
	r->count = EMB_ROW_FREE;
	r->last_step = s->free_head;
	s->free_head = want;
}

float emb__row_l2(const struct emb_table *t, const struct emb_row_hdr *r)
{
	const float *w = (const float *)(const void *)((const char *)r +
							 EMB_ROW_HDR_SIZE);
	float buf[EMB_DIM_MAX];
	double sum = 0.0;

	if (t->fmt != EMB_ROWFMT_FP32) {
		emb_rowfmt_decode(t->fmt, w, buf, t->dim);
		w = buf;
	}
	for (uint32_t j = 0; j < t->dim; j++)
		sum += (double)w[j] * w[j];
	return (float)sqrt(sum);
}

uint32_t emb__shard_held(struct emb_table *t, struct emb_shard *s)
{
	/* Acquire: the hold's words read below are at least those of gen.
	 * A change that lands during the count bumps gen after its words,
	 * so the next call counts again. */
	uint32_t gen = __atomic_load_n(&t->evict_hold_gen, __ATOMIC_ACQUIRE);
	bool any = __atomic_load_n(&t->evict_hold_any, __ATOMIC_RELAXED);
	uint32_t n = 0;

	if (s->held_gen == gen)
		return s->held;
	/* No slot held: nothing to walk. */
	for (uint32_t idx = 0; any && idx < s->next_idx; idx++) {
		const struct emb_row_hdr *r = emb__shard_row(t, s, idx);

		if (!(r->count & EMB_ROW_FREE))
			n += emb__evict_held(t, r->id);
	}
	s->held = n;
	s->held_gen = gen;
	return n;
}

void emb__shard_remove(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       uint64_t h)
{
	unlink_rec(t, s, idx, h, true);
}

void emb__shard_unlink(struct emb_table *t, struct emb_shard *s, uint32_t idx,
		       uint64_t h)
{
	unlink_rec(t, s, idx, h, false);
}

int emb__vslot_reserve(struct emb_table *t, struct emb_shard *s, uint32_t nrec)
{
	uint32_t cap = s->vslot_cap;
	uint16_t *v;
	int rc;

	if (nrec <= cap && s->vslot)
		return 0;
	if (nrec < 2 * cap)
		nrec = 2 * cap;
	/* A tiered table lives at its limit: a move's walk by slot must not
	 * fail for 2 bytes a record (its index and cold maps are forced the
	 * same way). */
	if (t->tier)
		emb__mem_charge_force(t, ((uint64_t)nrec - cap) * sizeof(*v));
	else if ((rc = emb__mem_charge(t, ((int64_t)nrec - cap) *
					       (int64_t)sizeof(*v))))
		return rc;
	v = realloc(s->vslot, (size_t)(nrec ? nrec : 1) * sizeof(*v));
	if (!v) {
		emb__mem_charge(t, -((int64_t)nrec - cap) *
				       (int64_t)sizeof(*v));
		return -ENOMEM;
	}
	s->vslot = v;
	__atomic_store_n(&s->vslot_cap, nrec, __ATOMIC_RELAXED);
	return 0;
}

int emb__birth_reserve(struct emb_table *t, struct emb_shard *s,
		       uint32_t nrec)
{
	uint32_t cap = s->birth_cap;
	uint32_t *v;
	int rc;

	if (nrec <= cap && s->birth)
		return 0;
	if (nrec < 2 * cap)
		nrec = 2 * cap;
	rc = emb__mem_charge(t, ((int64_t)nrec - cap) * (int64_t)sizeof(*v));
	if (rc)
		return rc;
	v = realloc(s->birth, (size_t)(nrec ? nrec : 1) * sizeof(*v));
	if (!v) {
		emb__mem_charge(t,
				-((int64_t)nrec - cap) * (int64_t)sizeof(*v));
		return -ENOMEM;
	}
	/* Records that exist now were made before numbering: birth 0. */
	memset(v + cap, 0, (size_t)(nrec - cap) * sizeof(*v));
	s->birth = v;
	__atomic_store_n(&s->birth_cap, nrec, __ATOMIC_RELAXED);
	return 0;
}

/*
 * The first walk by slot fills the entries of the records that exist,
 * VSLOT_STEP at a time: a whole shard at once held its lock 1.8 to
 * 18.6 ms at 90,000 to 156,000 records (servers of 10M rows, 64 shards),
 * and each such hold stalled every pull and push of that shard, at a
 * move's start, on every server that gives slots away. Records made or reused
 * between the steps set their own entry (emb__shard_insert()), and a
 * step that reaches such a record sets the same value again.
 */
int emb__vslot_step(struct emb_table *t, struct emb_shard *s)
{
	uint32_t i, end;

	if (!s->vslot) {
		int rc = emb__vslot_reserve(t, s, s->nslabs * t->rows_per_slab);

		if (rc)
			return rc;
		s->vslot_built = 0;
		s->vslot_end = s->next_idx;
	}
	i = s->vslot_built;
	end = s->vslot_end - i > VSLOT_STEP ? i + VSLOT_STEP : s->vslot_end;
	for (; i < end; i++) {
		const struct emb_row_hdr *r = emb__shard_row(t, s, i);

		/* A free record's entry is never read as its row's. */
		s->vslot[i] = r->count & EMB_ROW_FREE
				  ? 0
				  : (uint16_t)emb_id_slot(r->id);
	}
	s->vslot_built = end;
	return 0;
}

/*
 * Every shard's record slots (store_int.h, vslot), made by the table's
 * first walk over some slots and kept from then on. One step of each
 * shard in turn, round after round, so that between two holds of a
 * shard's lock the other shards' steps run and its waiters get in (a
 * mutex let go and taken again at once would not let them).
 */
void (*emb__slot_index_between)(struct emb_table *t);

int emb__slot_index(struct emb_table *t)
{
	bool more = false;
	int rc = 0;

	do {
		if (more && emb__slot_index_between)
			emb__slot_index_between(t);
		more = false;
		for (uint32_t si = 0; si < t->nshards && !rc; si++) {
			struct emb_shard *s = &t->shards[si];

			pthread_mutex_lock(&s->lock);
			if (!emb__vslot_ready(s)) {
				rc = emb__vslot_step(t, s);
				more |= !emb__vslot_ready(s);
			}
			pthread_mutex_unlock(&s->lock);
		}
	} while (more && !rc);
	return rc;
}
