/*
 * src/cache/cache.c - the worker-side vocab cache: a slot pool with an
 * id -> slot hash, W-TinyLFU, LRU or CLOCK eviction, pinned prefetch batches
 * and the two update modes. Used by one trainer thread; every callback runs
 * on it.
 *
 * A slot is in one of four states. FREE slots sit on the free list. PENDING
 * slots are mapped but hold no data yet (a deferred or failed fetch).
 * INFLIGHT slots wait for fetch record rec. VALID slots hold data. A slot is
 * pinned while a queued or current batch names it. Only unpinned VALID
 * slots ("idle") may be evicted: under LRU and TinyLFU they alone are on
 * the lists, so eviction takes a tail without a scan; under CLOCK the hand
 * skips the rest. An unpinned PENDING slot is freed at once.
 *
 * TinyLFU (W-TinyLFU, as in Caffeine) splits the slots into regions, kept
 * in the flags and unchanged while a slot is pinned: a window (about 1% of
 * the capacity) where every new row enters, and a main region, segmented
 * into probation and protected (80% of main). Each region's idle slots
 * form an LRU list. A batch's misses always get a slot (they are pinned in
 * the window), so admission decides what stays, not what is served: when
 * the window grows past its size its LRU row becomes a candidate, and the
 * frequency sketch (sketch.h) decides between it and main's LRU victim
 * (probation's tail, else protected's). The loser is evicted; a winning
 * candidate moves to probation. A probation row used again moves to
 * protected; protected's overflow goes back to probation. Rows seen once
 * (a scan) lose against rows seen often, so they leave through the window
 * without flushing main.
 *
 * The pool keeps rows as the table does (opts.row_format): a row is ww
 * words of weights, in the table's format, and in write-back mode the
 * fp32 optimizer state after them, rf words in all. Only lookups and
 * write-back updates decode; fetches, evictions and flushes move the words
 * as they are. A write-back slot counts its updates (count, where a
 * write-through slot keeps fetched_step) for the rounding key.
 */
#include "cache/cache.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cache/dedup.h"
#include "cache/sketch.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/optim.h"
#include "common/tabledef.h"

#define NIL UINT32_MAX
/*
 * Rows of a batch are scattered over a pool far larger than the CPU caches,
 * so loops over a batch prefetch this many items ahead to keep several
 * memory loads in flight instead of one.
 */
#define AHEAD	  8u
#define DEPTH_MAX 64u
/*
 * TinyLFU: window and protected shares, in percent of the capacity and of
 * main. A small window suits frequency-skewed streams like Zipf ids; it is
 * there so a new row gets a few batches to prove itself before it has to
 * beat a row of main (Caffeine starts from the same 1% and 80%).
 */
#define WINDOW_PCT    1u
#define PROTECTED_PCT 80u
/* A write-back row's update count saturates where the store's does
 * (EMB_ROW_COUNT_MAX), so both keep rounding with the same key. */
#define COUNT_MAX 0x7fffffffu

enum slot_state {
	SLOT_FREE = 0,
	SLOT_PENDING = 1,
	SLOT_INFLIGHT = 2,
	SLOT_VALID = 3,
};

#define F_DIRTY	    0x1u  /* write-back: updated since fetched or written */
#define F_REF	    0x2u  /* CLOCK: used since the hand last passed */
#define F_VICTIM    0x4u  /* CLOCK, TinyLFU: chosen by this eviction */
#define F_PROBATION 0x8u  /* TinyLFU: in main, probation (else window) */
#define F_PROTECTED 0x10u /* TinyLFU: in main, protected */

/* LRU lists: LRU uses L_RECENT alone; TinyLFU all three. */
enum {
	L_RECENT = 0,	 /* LRU's list; TinyLFU's window */
	L_PROBATION = 1, /* TinyLFU: main, not used since admitted */
	L_PROTECTED = 2, /* TinyLFU: main, used again */
	NLISTS = 3,
};

struct slot {
	uint64_t id;   /* row held, unless FREE */
	uint32_t prev; /* LRU: towards the head (most recent) */
	uint32_t next; /* LRU: towards the tail; free-list link */
	union {
		/* Write-through: low 32 bits of the step its fetch began. */
		uint32_t fetched_step;
		/* Write-back: the row's update count in the stochastic
		 * rounding key: 1 when fetched, one more per update
		 * (emb_cache_update() tells why). */
		uint32_t count;
	};
	uint8_t pins;	       /* batches naming the slot, <= DEPTH_MAX + 1 */
	uint8_t state;	       /* enum slot_state */
	uint8_t flags;	       /* F_* bits */
	uint8_t rec;	       /* fetch record while INFLIGHT */
};

struct hent {
	uint64_t id;   /* key */
	uint32_t slot; /* NIL = empty entry */
	uint32_t pad;  /* keeps entries 16 bytes */
};

/* One fetch_start() in flight: where its rows land until fetch_wait(). */
struct fetch {
	uint64_t *ids;	 /* ids asked for [max_batch] */
	uint32_t *slots; /* their slots [max_batch] */
	float *buf;	 /* staging rows [max_batch * rf] words */
	int64_t token;	 /* from fetch_start */
	uint32_t n;	 /* rows asked for */
	uint32_t step;	 /* low 32 bits of c->step at fetch_start */
	bool busy;	 /* token not yet reported by fetch_wait */
};

/* A prepared batch: queued by prefetch, or the current one after lookup. */
struct batch {
	uint64_t *ids;	   /* ids as given [max_batch], matched by lookup */
	uint64_t *uniq;	   /* distinct ids [max_batch] */
	uint32_t *inv;	   /* uniq[inv[i]] == ids[i] [max_batch] */
	uint32_t *slots;   /* slot of each distinct id [max_batch] */
	uint32_t n;	   /* ids */
	uint32_t nuniq;	   /* distinct ids */
	uint32_t nfetch;   /* rows this batch had fetched */
	uint32_t nrefetch; /* of those, stale rows fetched again */
};

struct lru {
	uint32_t head; /* most recently released */
	uint32_t tail; /* next victim */
};

struct emb_cache {
	struct emb_cache_opts o; /* as created; ops copied */
	uint32_t rf;		 /* words per row in the pool */
	uint32_t ww;		 /* of those, the weights' (row_format) */
	bool compact;		 /* row_format is not fp32 */
	float *pool;		 /* capacity * rf words, one allocation */
	struct slot *slots;	 /* capacity entries */
	struct hent *hash;	 /* id -> slot, linear probing */
	uint32_t hmask;		 /* hash entries - 1 */
	uint32_t free_head;	 /* free-list of FREE slots */
	struct lru lru[NLISTS];	 /* idle slots by region (L_*) */
	uint32_t hand;		 /* CLOCK: next slot to look at */
	uint32_t nwin;		 /* TinyLFU: window slots, pinned included */
	uint32_t nprot;		 /* TinyLFU: protected slots, pinned included */
	uint32_t win_max;	 /* TinyLFU: window rows before one leaves */
	uint32_t prot_max;	 /* TinyLFU: protected size before demotion */
	uint32_t nidle;		 /* unpinned VALID slots: evictable */
	uint32_t nfree;		 /* slots on the free list */
	uint32_t nrows;		 /* slots mapped in the hash */
	uint32_t npinned;	 /* slots with pins > 0 */
	uint32_t ndirty;	 /* slots with dirty set */
	uint64_t step;		 /* updates applied: the staleness clock */
	uint64_t bad_id;	 /* the last update refused as non-finite: */
	uint32_t bad_elem;	 /* its first bad id and element */

	struct emb_dedup *dedup; /* for the trainer thread's batches */
	struct emb_sketch *sk;	 /* TinyLFU: how often ids were asked for */
	struct batch *batches;	 /* depth + 1 records */
	struct batch **spare;	 /* unused batch records, a stack */
	uint32_t nspare;	 /* entries on spare */
	struct batch **queue;	 /* ring of prefetched batches [depth] */
	uint32_t qhead;		 /* oldest queued batch */
	uint32_t qcount;	 /* batches queued */
	struct batch *cur;	 /* looked up, not yet updated; or NULL */
	struct fetch *fetches;	 /* depth + 1 records */
	uint32_t nfetches;	 /* records */

	uint64_t *wb_ids;    /* write-back staging [max_batch] */
	float *wb_rows;	     /* [max_batch * rf] words; also a compact
				write-back update's new rows */
	uint32_t *tmp_slots; /* slots gathered for a fetch or evict */
	float *gsum;	     /* summed grads [max_batch * dim] */
	float *dec;	     /* compact rows: lookup_ptrs' decoded rows
				[max_batch * dim] */
	float *work;	     /* compact write-back: one fp32 row, dim
				weights then the state */

	struct emb_cache_stats st; /* counters; gauges filled on read */
};

/*
 * The pool, slots and hash are hundreds of MB touched at random, one row at
 * a time: with 4 KB pages nearly every access also misses the TLB. Large
 * arrays are 2 MB aligned and marked for transparent huge pages (a hint;
 * without THP they are plain memory). Freed with free().
 */
static void *big_alloc(size_t nbytes)
{
	const size_t huge = 2u << 20;
	void *p;

	if (nbytes < huge)
		return aligned_alloc(64, (nbytes + 63) & ~(size_t)63);
	nbytes = (nbytes + huge - 1) & ~(huge - 1);
	p = aligned_alloc(huge, nbytes);
	if (p)
		(void)madvise(p, nbytes, MADV_HUGEPAGE);
	return p;
}

static float *row_of(const struct emb_cache *c, uint32_t s)
{
	return c->pool + (size_t)s * c->rf;
}

static void prefetch_floats(const float *p, uint32_t n)
{
	for (uint32_t j = 0; j < n; j += 64 / sizeof(float))
		__builtin_prefetch(p + j);
}

/* ---- id -> slot hash ---- */

static uint32_t hhome(const struct emb_cache *c, uint64_t id)
{
	return (uint32_t)emb_id_hash(id) & c->hmask;
}

static uint32_t hash_find(const struct emb_cache *c, uint64_t id)
{
	uint32_t i = hhome(c, id);

	while (c->hash[i].slot != NIL) {
		if (c->hash[i].id == id)
			return c->hash[i].slot;
		i = (i + 1) & c->hmask;
	}
	return NIL;
}

static void hash_insert(struct emb_cache *c, uint64_t id, uint32_t slot)
{
	uint32_t i = hhome(c, id);

	while (c->hash[i].slot != NIL)
		i = (i + 1) & c->hmask;
	c->hash[i].id = id;
	c->hash[i].slot = slot;
}

/* Backward-shift deletion: no tombstones, so probe runs stay short. */
static void hash_remove(struct emb_cache *c, uint64_t id)
{
	uint32_t i = hhome(c, id);
	uint32_t j;

	while (c->hash[i].id != id || c->hash[i].slot == NIL) {
		assert(c->hash[i].slot != NIL);
		i = (i + 1) & c->hmask;
	}
	j = i;
	for (;;) {
		uint32_t k;

		j = (j + 1) & c->hmask;
		if (c->hash[j].slot == NIL)
			break;
		k = hhome(c, c->hash[j].id);
		/* Entry j may fill the hole at i unless its home lies
		 * cyclically in (i, j]. */
		if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
			c->hash[i] = c->hash[j];
			i = j;
		}
	}
	c->hash[i].slot = NIL;
}

/* ---- LRU lists and free list ---- */

/* The list an idle slot is on: its TinyLFU region, or LRU's one list. */
static uint32_t list_of(const struct slot *sl)
{
	if (sl->flags & F_PROBATION)
		return L_PROBATION;
	return sl->flags & F_PROTECTED ? L_PROTECTED : L_RECENT;
}

static void lru_unlink(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];
	struct lru *l = &c->lru[list_of(sl)];

	if (sl->prev != NIL)
		c->slots[sl->prev].next = sl->next;
	else
		l->head = sl->next;
	if (sl->next != NIL)
		c->slots[sl->next].prev = sl->prev;
	else
		l->tail = sl->prev;
	sl->prev = NIL;
	sl->next = NIL;
}

static void lru_push_head(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];
	struct lru *l = &c->lru[list_of(sl)];

	sl->prev = NIL;
	sl->next = l->head;
	if (l->head != NIL)
		c->slots[l->head].prev = s;
	else
		l->tail = s;
	l->head = s;
}

/* TinyLFU: moves idle slot s, of any region, to probation's head. */
static void to_probation(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];

	lru_unlink(c, s);
	if (sl->flags & F_PROTECTED)
		c->nprot--;
	else if (!(sl->flags & F_PROBATION))
		c->nwin--;
	sl->flags = (uint8_t)((sl->flags & ~F_PROTECTED) | F_PROBATION);
	lru_push_head(c, s);
}

static void slot_free(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];

	hash_remove(c, sl->id);
	c->nrows--;
	if (sl->flags & F_DIRTY)
		c->ndirty--;
	if (sl->flags & F_PROTECTED)
		c->nprot--;
	else if (!(sl->flags & F_PROBATION))
		c->nwin--;
	sl->flags = 0;
	sl->state = SLOT_FREE;
	sl->prev = NIL;
	sl->next = c->free_head;
	c->free_head = s;
	c->nfree++;
}

static uint32_t slot_alloc(struct emb_cache *c, uint64_t id)
{
	uint32_t s = c->free_head;
	struct slot *sl = &c->slots[s];

	assert(s != NIL);
	c->free_head = sl->next;
	c->nfree--;
	sl->id = id;
	sl->prev = NIL;
	sl->next = NIL;
	sl->state = SLOT_PENDING;
	sl->pins = 0;
	sl->flags = 0; /* TinyLFU: new rows enter the window */
	c->nwin++;
	hash_insert(c, id, s);
	c->nrows++;
	return s;
}

static void pin(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];

	if (sl->pins++ == 0) {
		c->npinned++;
		if (sl->state != SLOT_VALID)
			return;
		c->nidle--;
		if (c->o.policy != EMB_CACHE_CLOCK)
			lru_unlink(c, s);
	}
}

/*
 * TinyLFU: a probation row used again is promoted to protected; when that
 * overflows, protected's LRU row goes back to probation, where it competes
 * with the window's candidates again.
 */
static void promote(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];
	uint32_t t;

	sl->flags = (uint8_t)((sl->flags & ~F_PROBATION) | F_PROTECTED);
	c->nprot++;
	lru_push_head(c, s);
	t = c->lru[L_PROTECTED].tail;
	if (c->nprot > c->prot_max && t != NIL && t != s)
		to_probation(c, t);
}

static void unpin(struct emb_cache *c, uint32_t s)
{
	struct slot *sl = &c->slots[s];

	assert(sl->pins > 0);
	if (--sl->pins)
		return;
	c->npinned--;
	assert(sl->state != SLOT_INFLIGHT);
	if (sl->state != SLOT_VALID) {
		slot_free(c, s);
		return;
	}
	c->nidle++;
	if (c->o.policy == EMB_CACHE_CLOCK)
		sl->flags |= F_REF;
	else if (c->o.policy == EMB_CACHE_TINYLFU && (sl->flags & F_PROBATION))
		promote(c, s);
	else
		lru_push_head(c, s);
}

/* ---- batches and fetch records ---- */

static void batch_release(struct emb_cache *c, struct batch *b)
{
	for (uint32_t u = 0; u < b->nuniq; u++) {
		if (u + AHEAD < b->nuniq)
			__builtin_prefetch(&c->slots[b->slots[u + AHEAD]], 1);
		unpin(c, b->slots[u]);
	}
	b->nuniq = 0;
	b->n = 0;
	c->spare[c->nspare++] = b;
}

static struct fetch *fetch_get(struct emb_cache *c)
{
	for (uint32_t r = 0; r < c->nfetches; r++) {
		if (!c->fetches[r].busy)
			return &c->fetches[r];
	}
	/* Queued batches own at most one record each, lookup one more. */
	assert(0 && "no free fetch record");
	return NULL;
}

/*
 * Starts one fetch of the slots in c->tmp_slots[0..n). 0, or the callback's
 * negative code (rows unchanged).
 */
static int fetch_begin(struct emb_cache *c, uint32_t n)
{
	struct fetch *f = fetch_get(c);
	int64_t token;

	for (uint32_t i = 0; i < n; i++) {
		f->slots[i] = c->tmp_slots[i];
		f->ids[i] = c->slots[c->tmp_slots[i]].id;
	}
	c->st.fetch_calls++;
	token = c->o.ops.fetch_start(c->o.arg, f->ids, n, f->buf, c->rf);
	if (token < 0)
		return token < INT32_MIN ? EMB_EFETCH : (int)token;
	f->token = token;
	f->n = n;
	f->step = (uint32_t)c->step;
	f->busy = true;
	for (uint32_t i = 0; i < n; i++) {
		struct slot *sl = &c->slots[f->slots[i]];

		sl->state = SLOT_INFLIGHT;
		sl->rec = (uint8_t)(f - c->fetches);
	}
	c->st.rows_fetched += n;
	c->st.bytes_fetched += (uint64_t)n * c->rf * sizeof(float);
	return 0;
}

/*
 * Collects fetch_wait() for f and moves its rows into their slots (VALID),
 * or on failure leaves them PENDING for a later fetch. Sets *stalled when
 * the rows were not there yet. 0 or the callback's negative code.
 */
static int fetch_end(struct emb_cache *c, struct fetch *f, bool *stalled)
{
	int rc = c->o.ops.fetch_wait(c->o.arg, f->token, false);

	if (rc == -EAGAIN) {
		uint64_t t0 = emb_clock_ns();

		*stalled = true;
		rc = c->o.ops.fetch_wait(c->o.arg, f->token, true);
		c->st.wait_ns += emb_clock_ns() - t0;
		if (rc == -EAGAIN)
			rc = EMB_EINTERNAL; /* a blocking wait must finish */
	}
	f->busy = false;
	for (uint32_t i = 0; i < f->n; i++) {
		uint32_t s = f->slots[i];
		struct slot *sl = &c->slots[s];

		assert(sl->state == SLOT_INFLIGHT && sl->id == f->ids[i]);
		if (i + AHEAD < f->n) {
			__builtin_prefetch(&c->slots[f->slots[i + AHEAD]], 1);
			if (rc == 0)
				prefetch_floats(row_of(c, f->slots[i + AHEAD]),
						c->rf);
		}
		if (rc == 0) {
			memcpy(row_of(c, s), f->buf + (size_t)i * c->rf,
			       c->rf * sizeof(float));
			sl->state = SLOT_VALID;
			if (c->o.mode == EMB_CACHE_WRITE_BACK)
				sl->count = 1;
			else
				sl->fetched_step = f->step;
		} else {
			sl->state = SLOT_PENDING;
		}
	}
	if (rc)
		emb_log(EMB_LOG_WARN, "cache: fetch of %u rows failed: %s",
			f->n, emb_strerror(rc));
	return rc;
}

/* True when a write-through row fetched at fetched_step is too old at the
 * step use_step. */
static bool too_old(const struct emb_cache *c, const struct slot *sl,
		    uint64_t use_step)
{
	return c->o.mode == EMB_CACHE_WRITE_THROUGH &&
	       (uint32_t)use_step - sl->fetched_step > c->o.staleness_steps;
}

/*
 * TinyLFU: the idle slot after s in main's eviction order (probation from
 * its tail, then protected from its tail) that is not already a victim, or
 * NIL. s = NIL starts from the beginning.
 */
static uint32_t main_next(const struct emb_cache *c, uint32_t s)
{
	do {
		if (s == NIL)
			s = c->lru[L_PROBATION].tail != NIL
				? c->lru[L_PROBATION].tail
				: c->lru[L_PROTECTED].tail;
		else if (c->slots[s].prev != NIL)
			s = c->slots[s].prev;
		else if (c->slots[s].flags & F_PROBATION)
			s = c->lru[L_PROTECTED].tail;
		else
			s = NIL;
	} while (s != NIL && (c->slots[s].flags & F_VICTIM));
	return s;
}

/*
 * TinyLFU: chooses need victims into c->tmp_slots for nmiss rows about to
 * enter the window. While the window (with them) is over its size, its LRU
 * row is a candidate against main's LRU victim: the one the sketch saw less
 * often is chosen (a tie keeps main's), and a winning candidate moves to
 * probation. With the window at its size, main's victims go; with main
 * empty of idle rows, the window's. Victims stay linked until evict() frees
 * them; the cursors never revisit a slot. Window rows beyond its size that
 * free slots make room for move to probation without a contest.
 */
static void pick_tinylfu(struct emb_cache *c, uint32_t nmiss, uint32_t need)
{
	uint32_t w = c->lru[L_RECENT].tail;
	uint32_t m = main_next(c, NIL);
	uint32_t nwin = c->nwin + nmiss;
	uint32_t k = 0;

	while (k < need) {
		uint32_t v;

		if (nwin > c->win_max && w != NIL) {
			uint32_t cand = w;

			w = c->slots[w].prev;
			nwin--;
			if (m != NIL &&
			    emb_sketch_estimate(c->sk, c->slots[cand].id) >
				emb_sketch_estimate(c->sk, c->slots[m].id)) {
				v = m;
				m = main_next(c, m);
				to_probation(c, cand);
				c->st.admitted++;
			} else {
				v = cand;
				if (m != NIL) {
					uint32_t kept = m;

					/* The survivor goes to probation's
					 * head, so the next candidate meets
					 * the next victim: a row whose count
					 * is inflated by collisions in the
					 * sketch, but never used, cannot
					 * block admission for good. */
					m = main_next(c, m);
					to_probation(c, kept);
					c->st.rejected++;
				}
			}
		} else if (m != NIL) {
			v = m;
			m = main_next(c, m);
		} else if (w != NIL) {
			v = w;
			w = c->slots[w].prev;
			nwin--;
		} else {
			/* Winners and survivors moved behind the cursor;
			 * nidle >= need, so a second pass finds the rest. */
			v = main_next(c, NIL);
			assert(v != NIL);
		}
		c->slots[v].flags |= F_VICTIM;
		c->tmp_slots[k++] = v;
	}
	while (nwin > c->win_max && w != NIL) {
		uint32_t prev = c->slots[w].prev;

		to_probation(c, w);
		w = prev;
		nwin--;
	}
}

/*
 * Chooses need victims into c->tmp_slots for nmiss new rows. LRU takes the
 * list's tail, TinyLFU see above. CLOCK sweeps the hand over the pool: an
 * idle slot used since the last pass loses its reference bit and survives,
 * one not used is taken. nidle >= need, so two passes at most.
 */
static void pick_victims(struct emb_cache *c, uint32_t nmiss, uint32_t need)
{
	uint32_t s = c->lru[L_RECENT].tail;
	uint32_t k = 0;

	if (c->o.policy == EMB_CACHE_LRU) {
		for (; k < need; k++, s = c->slots[s].prev)
			c->tmp_slots[k] = s;
		return;
	}
	if (c->o.policy == EMB_CACHE_TINYLFU) {
		pick_tinylfu(c, nmiss, need);
		return;
	}
	while (k < need) {
		struct slot *sl = &c->slots[c->hand];

		if (sl->state == SLOT_VALID && !sl->pins &&
		    !(sl->flags & F_VICTIM)) {
			if (sl->flags & F_REF) {
				sl->flags &= ~F_REF;
			} else {
				sl->flags |= F_VICTIM;
				c->tmp_slots[k++] = c->hand;
			}
		}
		if (++c->hand == c->o.capacity)
			c->hand = 0;
	}
}

/*
 * Makes room for nmiss new rows, writing the dirty victims back in one call
 * first. 0 or EMB_EWRITEBACK (nothing evicted).
 */
static int evict(struct emb_cache *c, uint32_t nmiss)
{
	uint32_t need = nmiss > c->nfree ? nmiss - c->nfree : 0;
	uint32_t ndirty = 0;
	int rc;

	if (!need) {
		/* Room for all: the window still hands its overflow on. */
		if (c->o.policy == EMB_CACHE_TINYLFU)
			pick_tinylfu(c, nmiss, 0);
		return 0;
	}
	pick_victims(c, nmiss, need);
	for (uint32_t k = 0; k < need; k++) {
		uint32_t s = c->tmp_slots[k];

		if (k + AHEAD < need)
			__builtin_prefetch(&c->hash[hhome(
			    c, c->slots[c->tmp_slots[k + AHEAD]].id)]);
		if (!(c->slots[s].flags & F_DIRTY))
			continue;
		c->wb_ids[ndirty] = c->slots[s].id;
		memcpy(c->wb_rows + (size_t)ndirty * c->rf, row_of(c, s),
		       c->rf * sizeof(float));
		ndirty++;
	}
	if (ndirty) {
		rc = c->o.ops.write_back(c->o.arg, c->wb_ids, ndirty,
					 c->wb_rows, c->rf);
		if (rc) {
			emb_log(
			    EMB_LOG_WARN,
			    "cache: write-back of %u evicted rows failed: %s",
			    ndirty, emb_strerror(rc));
			for (uint32_t k = 0; k < need; k++)
				c->slots[c->tmp_slots[k]].flags &= ~F_VICTIM;
			return EMB_EWRITEBACK;
		}
		c->st.write_backs += ndirty;
		c->st.bytes_written += (uint64_t)ndirty * c->rf * sizeof(float);
	}
	for (uint32_t k = 0; k < need; k++) {
		if (c->o.policy != EMB_CACHE_CLOCK)
			lru_unlink(c, c->tmp_slots[k]);
		slot_free(c, c->tmp_slots[k]);
	}
	c->nidle -= need;
	c->st.evictions += need;
	return 0;
}

/*
 * Dedups ids into b, pins its rows and maps slots for its misses (PENDING).
 * When fetch is set, also starts one fetch of every row that is not in
 * flight and would not be fresh at step use_step; a failed start is logged
 * and left for lookup. 0, -EINVAL, EMB_ECACHEFULL or EMB_EWRITEBACK, with
 * nothing pinned on error.
 */
static int batch_prepare(struct emb_cache *c, struct batch *b,
			 const uint64_t *ids, uint32_t n, bool fetch,
			 uint64_t use_step)
{
	uint32_t nmiss = 0, nf = 0, nstale = 0;
	int rc;

	rc = emb_dedup_run(c->dedup, ids, n, b->uniq, b->inv);
	if (rc < 0)
		return rc;
	memcpy(b->ids, ids, n * sizeof(*ids));
	b->n = n;
	b->nuniq = (uint32_t)rc;
	b->nfetch = 0;
	b->nrefetch = 0;

	for (uint32_t u = 0; u < b->nuniq; u++) {
		uint32_t s;

		if (u + AHEAD < b->nuniq)
			__builtin_prefetch(
			    &c->hash[hhome(c, b->uniq[u + AHEAD])]);
		s = hash_find(c, b->uniq[u]);
		b->slots[u] = s;
		if (s != NIL)
			__builtin_prefetch(&c->slots[s]);
	}
	/* Every use counts, hits and misses alike: admission compares how
	 * often rows are asked for, not how often they were fetched. */
	if (c->sk) {
		for (uint32_t u = 0; u < b->nuniq; u++) {
			if (u + AHEAD < b->nuniq)
				emb_sketch_prefetch(c->sk, b->uniq[u + AHEAD]);
			emb_sketch_add(c->sk, b->uniq[u]);
		}
	}
	for (uint32_t u = 0; u < b->nuniq; u++) {
		uint32_t s = b->slots[u];

		if (c->o.policy != EMB_CACHE_CLOCK && u + AHEAD < b->nuniq &&
		    b->slots[u + AHEAD] != NIL) {
			const struct slot *ahead =
			    &c->slots[b->slots[u + AHEAD]];

			/* pin() unlinks it from the LRU list. */
			if (ahead->prev != NIL)
				__builtin_prefetch(&c->slots[ahead->prev]);
			if (ahead->next != NIL)
				__builtin_prefetch(&c->slots[ahead->next]);
		}
		if (s == NIL)
			nmiss++;
		else
			pin(c, s);
	}
	/* Every list entry is unpinned, hence evictable. */
	if (nmiss > c->nfree + c->nidle) {
		rc = EMB_ECACHEFULL;
		goto err_unpin;
	}
	rc = evict(c, nmiss);
	if (rc)
		goto err_unpin;
	for (uint32_t u = 0; u < b->nuniq; u++) {
		if (u + AHEAD < b->nuniq && b->slots[u + AHEAD] == NIL)
			__builtin_prefetch(
			    &c->hash[hhome(c, b->uniq[u + AHEAD])], 1);
		if (b->slots[u] == NIL) {
			b->slots[u] = slot_alloc(c, b->uniq[u]);
			pin(c, b->slots[u]);
		}
	}
	if (!fetch || !b->nuniq)
		return 0;

	for (uint32_t u = 0; u < b->nuniq; u++) {
		uint32_t s = b->slots[u];
		struct slot *sl = &c->slots[s];

		if (sl->state == SLOT_PENDING) {
			c->tmp_slots[nf++] = s;
		} else if (sl->state == SLOT_VALID &&
			   too_old(c, sl, use_step)) {
			c->tmp_slots[nf++] = s;
			nstale++;
		}
	}
	if (!nf)
		return 0;
	rc = fetch_begin(c, nf);
	if (rc) {
		emb_log(EMB_LOG_WARN,
			"cache: prefetch of %u rows failed to start: %s", nf,
			emb_strerror(rc));
		return 0;
	}
	b->nfetch += nf;
	b->nrefetch += nstale;
	return 0;

err_unpin:
	for (uint32_t u = 0; u < b->nuniq; u++) {
		if (b->slots[u] != NIL)
			unpin(c, b->slots[u]);
	}
	b->nuniq = 0;
	return rc;
}

/* ---- create / destroy ---- */

static int check_opts(const struct emb_cache_opts *o)
{
	if (o->dim == 0 || o->dim > EMB_DIM_MAX)
		return EMB_EBADDIM;
	if (o->capacity == 0 || o->capacity > (1u << 30) || o->max_batch == 0 ||
	    o->max_batch > (1u << 30) || o->prefetch_depth > DEPTH_MAX ||
	    (o->policy != EMB_CACHE_LRU && o->policy != EMB_CACHE_CLOCK &&
	     o->policy != EMB_CACHE_TINYLFU))
		return EMB_EBADARG;
	if (!o->ops.fetch_start || !o->ops.fetch_wait)
		return EMB_EBADARG;
	if (o->row_format >= EMB_ROWFMT_COUNT ||
	    (o->rounding != EMB_ROUND_NEAREST &&
	     o->rounding != EMB_ROUND_STOCHASTIC))
		return EMB_EBADFORMAT;
	switch (o->mode) {
	case EMB_CACHE_WRITE_THROUGH:
		return o->ops.push ? 0 : EMB_EBADARG;
	case EMB_CACHE_WRITE_BACK:
		if (!o->ops.write_back)
			return EMB_EBADARG;
		return emb_optim_validate(&o->optim) ? EMB_EBADOPTIM : 0;
	default:
		return EMB_EBADARG;
	}
}

static void free_all(struct emb_cache *c)
{
	if (c->batches) {
		for (uint32_t i = 0; i <= c->o.prefetch_depth; i++) {
			free(c->batches[i].ids);
			free(c->batches[i].uniq);
			free(c->batches[i].inv);
			free(c->batches[i].slots);
		}
	}
	if (c->fetches) {
		for (uint32_t i = 0; i < c->nfetches; i++) {
			free(c->fetches[i].ids);
			free(c->fetches[i].slots);
			free(c->fetches[i].buf);
		}
	}
	free(c->work);
	free(c->dec);
	free(c->gsum);
	free(c->tmp_slots);
	free(c->wb_rows);
	free(c->wb_ids);
	free(c->fetches);
	free(c->queue);
	free(c->spare);
	free(c->batches);
	emb_dedup_destroy(c->dedup);
	emb_sketch_destroy(c->sk);
	free(c->hash);
	free(c->slots);
	free(c->pool);
	free(c);
}

int emb_cache_create(const struct emb_cache_opts *opts, struct emb_cache **out)
{
	struct emb_cache *c;
	uint32_t nb, mb, hsize = 2;
	size_t pool_bytes;
	int rc;

	if (!opts || !out)
		return EMB_EBADARG;
	rc = check_opts(opts);
	if (rc)
		return rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->o = *opts;
	c->ww = emb_rowfmt_words(opts->row_format, opts->dim);
	c->compact = opts->row_format != EMB_ROWFMT_FP32;
	c->rf = c->ww;
	if (opts->mode == EMB_CACHE_WRITE_BACK)
		c->rf += emb_optim_state_floats(opts->optim.kind, opts->dim);
	mb = opts->max_batch;
	nb = opts->prefetch_depth + 1;

	/* One allocation for every row: rf words each. */
	pool_bytes = (size_t)opts->capacity * c->rf * sizeof(float);
	c->pool = big_alloc(pool_bytes);
	c->slots = big_alloc((size_t)opts->capacity * sizeof(*c->slots));
	while (hsize < 2 * opts->capacity)
		hsize <<= 1;
	c->hash = big_alloc((size_t)hsize * sizeof(*c->hash));
	c->batches = calloc(nb, sizeof(*c->batches));
	c->spare = calloc(nb, sizeof(*c->spare));
	c->queue = calloc(nb, sizeof(*c->queue));
	c->fetches = calloc(nb, sizeof(*c->fetches));
	c->wb_ids = malloc((size_t)mb * sizeof(*c->wb_ids));
	c->wb_rows = malloc((size_t)mb * c->rf * sizeof(float));
	c->tmp_slots = malloc((size_t)mb * sizeof(*c->tmp_slots));
	c->gsum = malloc((size_t)mb * opts->dim * sizeof(float));
	if (c->compact) {
		c->dec = malloc((size_t)mb * opts->dim * sizeof(float));
		/* dim weights, then as much state as the pool row has. */
		c->work = malloc(((size_t)opts->dim + c->rf - c->ww) *
				 sizeof(float));
	}
	if (!c->pool || !c->slots || !c->hash || !c->batches || !c->spare ||
	    !c->queue || !c->fetches || !c->wb_ids || !c->wb_rows ||
	    !c->tmp_slots || !c->gsum ||
	    (c->compact && (!c->dec || !c->work)))
		goto err_free;
	c->nfetches = nb;
	for (uint32_t i = 0; i < nb; i++) {
		struct batch *b = &c->batches[i];
		struct fetch *f = &c->fetches[i];

		b->ids = malloc((size_t)mb * sizeof(*b->ids));
		b->uniq = malloc((size_t)mb * sizeof(*b->uniq));
		b->inv = malloc((size_t)mb * sizeof(*b->inv));
		b->slots = malloc((size_t)mb * sizeof(*b->slots));
		f->ids = malloc((size_t)mb * sizeof(*f->ids));
		f->slots = malloc((size_t)mb * sizeof(*f->slots));
		f->buf = malloc((size_t)mb * c->rf * sizeof(float));
		if (!b->ids || !b->uniq || !b->inv || !b->slots || !f->ids ||
		    !f->slots || !f->buf)
			goto err_free;
		c->spare[c->nspare++] = b;
	}
	rc = emb_dedup_create(mb, &c->dedup);
	if (rc)
		goto err_free;
	if (opts->policy == EMB_CACHE_TINYLFU) {
		rc = emb_sketch_create(opts->capacity, 0, &c->sk);
		if (rc)
			goto err_free;
	}
	c->win_max = (uint32_t)((uint64_t)opts->capacity * WINDOW_PCT / 100);
	if (c->win_max == 0)
		c->win_max = 1;
	c->prot_max = (uint32_t)((uint64_t)(opts->capacity - c->win_max) *
				 PROTECTED_PCT / 100);

	c->hmask = hsize - 1;
	for (uint32_t i = 0; i < hsize; i++)
		c->hash[i].slot = NIL;
	/* Free list in slot order, so a fresh cache fills the pool front to
	 * back. */
	memset(c->slots, 0, (size_t)opts->capacity * sizeof(*c->slots));
	for (uint32_t s = 0; s < opts->capacity; s++) {
		c->slots[s].next = s + 1 < opts->capacity ? s + 1 : NIL;
		c->slots[s].prev = NIL;
	}
	c->free_head = 0;
	c->nfree = opts->capacity;
	for (uint32_t l = 0; l < NLISTS; l++) {
		c->lru[l].head = NIL;
		c->lru[l].tail = NIL;
	}
	*out = c;
	return 0;

err_free:
	free_all(c);
	return -ENOMEM;
}

void emb_cache_cancel(struct emb_cache *c)
{
	bool stalled = false;

	if (c->cur) {
		batch_release(c, c->cur);
		c->cur = NULL;
	}
	/* Rows of a failed fetch turn PENDING and are freed on release. */
	for (uint32_t r = 0; r < c->nfetches; r++) {
		if (c->fetches[r].busy)
			(void)fetch_end(c, &c->fetches[r], &stalled);
	}
	while (c->qcount) {
		batch_release(c, c->queue[c->qhead]);
		c->qhead = (c->qhead + 1) % c->o.prefetch_depth;
		c->qcount--;
	}
	c->qhead = 0;
}

void emb_cache_destroy(struct emb_cache *c)
{
	if (!c)
		return;
	emb_cache_cancel(c);
	if (c->ndirty)
		emb_log(EMB_LOG_WARN,
			"cache: destroyed with %u dirty rows not written back",
			c->ndirty);
	free_all(c);
}

/* ---- trainer calls ---- */

int emb_cache_prefetch(struct emb_cache *c, const uint64_t *ids, uint32_t n)
{
	struct batch *b;
	uint32_t ahead;
	bool fetch;
	int rc;

	if (n > c->o.max_batch || (n && !ids))
		return -EINVAL;
	if (c->qcount >= c->o.prefetch_depth)
		return -EBUSY;
	/* Steps until this batch is used: the queue ahead of it, and the
	 * current batch's update. A fetch now is that old at use. */
	ahead = c->qcount + (c->cur ? 1 : 0);
	fetch =
	    c->o.mode == EMB_CACHE_WRITE_BACK || ahead <= c->o.staleness_steps;
	b = c->spare[--c->nspare];
	rc = batch_prepare(c, b, ids, n, fetch, c->step + ahead);
	if (rc) {
		c->spare[c->nspare++] = b;
		return rc;
	}
	c->queue[(c->qhead + c->qcount) % c->o.prefetch_depth] = b;
	c->qcount++;
	return 0;
}

static bool queue_head_matches(const struct emb_cache *c, const uint64_t *ids,
			       uint32_t n)
{
	const struct batch *b;

	if (!c->qcount)
		return false;
	b = c->queue[c->qhead];
	return b->n == n &&
	       (n == 0 || memcmp(b->ids, ids, n * sizeof(*ids)) == 0);
}

/* Brings the batch of ids to VALID, fresh rows and makes it current. */
static int lookup_batch(struct emb_cache *c, const uint64_t *ids, uint32_t n)
{
	bool stalled = false;
	struct batch *b;
	uint32_t nf = 0, nstale = 0;
	int rc = 0, wrc;

	if (n > c->o.max_batch || (n && !ids))
		return -EINVAL;
	if (c->cur) {
		batch_release(c, c->cur);
		c->cur = NULL;
	}
	if (queue_head_matches(c, ids, n)) {
		b = c->queue[c->qhead];
		c->qhead = (c->qhead + 1) % c->o.prefetch_depth;
		c->qcount--;
	} else {
		b = c->spare[--c->nspare];
		rc = batch_prepare(c, b, ids, n, false, c->step);
		if (rc) {
			c->spare[c->nspare++] = b;
			return rc;
		}
	}

	/* Rows in flight: wait for every record they are in, even after a
	 * failure, so that no row of this batch stays INFLIGHT. */
	for (uint32_t u = 0; u < b->nuniq; u++) {
		struct slot *sl = &c->slots[b->slots[u]];

		if (u + AHEAD < b->nuniq)
			__builtin_prefetch(&c->slots[b->slots[u + AHEAD]]);
		if (sl->state != SLOT_INFLIGHT)
			continue;
		wrc = fetch_end(c, &c->fetches[sl->rec], &stalled);
		if (wrc && !rc)
			rc = EMB_EFETCH;
	}
	if (rc)
		goto err_release;

	/* Rows never fetched (deferred or failed) and rows too old now. */
	for (uint32_t u = 0; u < b->nuniq; u++) {
		uint32_t s = b->slots[u];
		struct slot *sl = &c->slots[s];

		if (sl->state == SLOT_PENDING) {
			c->tmp_slots[nf++] = s;
		} else if (too_old(c, sl, c->step)) {
			c->tmp_slots[nf++] = s;
			nstale++;
		}
	}
	if (nf) {
		uint64_t t0 = emb_clock_ns();
		struct fetch *f;

		stalled = true;
		c->st.sync_fetches++;
		rc = fetch_begin(c, nf);
		if (rc) {
			emb_log(EMB_LOG_WARN,
				"cache: fetch of %u rows failed to start: %s",
				nf, emb_strerror(rc));
			rc = EMB_EFETCH;
			c->st.wait_ns += emb_clock_ns() - t0;
			goto err_release;
		}
		f = &c->fetches[c->slots[c->tmp_slots[0]].rec];
		wrc = fetch_end(c, f, &stalled);
		c->st.wait_ns += emb_clock_ns() - t0;
		if (wrc) {
			rc = EMB_EFETCH;
			goto err_release;
		}
		b->nfetch += nf;
		b->nrefetch += nstale;
	}

	if (stalled)
		c->st.stalls++;
	c->st.lookups++;
	c->st.misses += b->nfetch;
	c->st.hits += b->nuniq - b->nfetch;
	c->st.refetches += b->nrefetch;
	c->cur = b;
	return 0;

err_release:
	if (stalled)
		c->st.stalls++;
	batch_release(c, b);
	return rc;
}

int emb_cache_lookup(struct emb_cache *c, const uint64_t *ids, uint32_t n,
		     float *out)
{
	const struct batch *b;
	int rc;

	if (n && !out)
		return -EINVAL;
	rc = lookup_batch(c, ids, n);
	if (rc)
		return rc;
	b = c->cur;
	for (uint32_t i = 0; i < n; i++) {
		const float *row = row_of(c, b->slots[b->inv[i]]);

		if (i + AHEAD < n)
			prefetch_floats(row_of(c, b->slots[b->inv[i + AHEAD]]),
					c->ww);
		if (c->compact)
			emb_rowfmt_decode(c->o.row_format, row,
					  out + (size_t)i * c->o.dim, c->o.dim);
		else
			memcpy(out + (size_t)i * c->o.dim, row,
			       c->o.dim * sizeof(float));
	}
	return 0;
}

int emb_cache_lookup_ptrs(struct emb_cache *c, const uint64_t *ids, uint32_t n,
			  const float **ptrs)
{
	const struct batch *b;
	int rc;

	if (n && !ptrs)
		return -EINVAL;
	rc = lookup_batch(c, ids, n);
	if (rc)
		return rc;
	b = c->cur;
	if (!c->compact) {
		for (uint32_t i = 0; i < n; i++)
			ptrs[i] = row_of(c, b->slots[b->inv[i]]);
		return 0;
	}
	/* Compact rows have no fp32 weights to point at: each distinct row
	 * is decoded once, into a buffer the next call reuses. */
	for (uint32_t u = 0; u < b->nuniq; u++) {
		if (u + AHEAD < b->nuniq)
			prefetch_floats(row_of(c, b->slots[u + AHEAD]), c->ww);
		emb_rowfmt_decode(c->o.row_format, row_of(c, b->slots[u]),
				  c->dec + (size_t)u * c->o.dim, c->o.dim);
	}
	for (uint32_t i = 0; i < n; i++)
		ptrs[i] = c->dec + (size_t)b->inv[i] * c->o.dim;
	return 0;
}

static void mark_dirty(struct emb_cache *c, uint32_t s)
{
	if (!(c->slots[s].flags & F_DIRTY)) {
		c->slots[s].flags |= F_DIRTY;
		c->ndirty++;
	}
}

static uint32_t count_next(uint32_t count)
{
	return count < COUNT_MAX ? count + 1 : COUNT_MAX;
}

/*
 * Write-back update of compact rows, with the summed gradients in c->gsum:
 * each distinct row is decoded into c->work with its state after it,
 * updated in fp32 and encoded into c->wb_rows (unused between evictions)
 * as the store's push would encode it; only when every row came out finite
 * and in range do they replace the cached ones, so a refused batch changes
 * nothing, as on the server. 0, or EMB_ENONFINITE with c->bad_id set.
 */
static int update_compact(struct emb_cache *c, const struct batch *b)
{
	const uint32_t dim = c->o.dim, fmt = c->o.row_format;
	const size_t wbytes = (size_t)c->ww * sizeof(float);
	const size_t state = (size_t)(c->rf - c->ww) * sizeof(float);
	float *w = c->work;

	for (uint32_t u = 0; u < b->nuniq; u++) {
		const struct slot *sl = &c->slots[b->slots[u]];
		const char *row = (const char *)row_of(c, b->slots[u]);
		char *nrow = (char *)(c->wb_rows + (size_t)u * c->rf);
		uint64_t key =
		    emb_rowfmt_sr_key(c->o.seed, sl->id, count_next(sl->count));

		if (u + AHEAD < b->nuniq)
			prefetch_floats(row_of(c, b->slots[u + AHEAD]), c->rf);
		emb_rowfmt_decode(fmt, row, w, dim);
		memcpy(w + dim, row + wbytes, state);
		if (!emb_optim_apply_row(&c->o.optim, w,
					 c->gsum + (size_t)u * dim, dim) ||
		    !emb_rowfmt_encode(fmt, w, nrow, dim, c->o.rounding, key)) {
			c->bad_id = sl->id;
			c->bad_elem = UINT32_MAX;
			return EMB_ENONFINITE;
		}
		memcpy(nrow + wbytes, w + dim, state);
	}
	for (uint32_t u = 0; u < b->nuniq; u++) {
		uint32_t s = b->slots[u];

		memcpy(row_of(c, s), c->wb_rows + (size_t)u * c->rf,
		       c->rf * sizeof(float));
		c->slots[s].count = count_next(c->slots[s].count);
		mark_dirty(c, s);
	}
	return 0;
}

int emb_cache_update(struct emb_cache *c, const float *grads)
{
	struct batch *b = c->cur;
	const uint32_t dim = c->o.dim;
	int rc = 0;

	if (!b || (b->n && !grads))
		return -EINVAL;
	/* Sum duplicates in batch order, then update each row once, as
	 * emb_table_push() does on the server. */
	memset(c->gsum, 0, (size_t)b->nuniq * dim * sizeof(float));
	for (uint32_t i = 0; i < b->n; i++) {
		float *restrict g = c->gsum + (size_t)b->inv[i] * dim;
		const float *restrict src = grads + (size_t)i * dim;

		emb_floats_add(g, src, dim);
	}
	/* A NaN or an infinity in a gradient (or in a sum of them) would go
	 * into cached rows (write-back) or be pushed, where the server
	 * refuses the push whole: refused here, checked on the sums (a NaN
	 * or an infinity summed stays one), before anything changes, and the
	 * batch released as after any failed update. The first bad element
	 * is kept for the message. */
	if (!emb_floats_finite(c->gsum, (size_t)b->nuniq * dim)) {
		for (size_t k = 0; k < (size_t)b->nuniq * dim; k++) {
			if (!isfinite(c->gsum[k])) {
				c->bad_id = b->uniq[k / dim];
				c->bad_elem = (uint32_t)(k % dim);
				break;
			}
		}
		rc = EMB_ENONFINITE;
		goto out_release;
	}

	if (c->o.mode == EMB_CACHE_WRITE_THROUGH) {
		if (b->nuniq) {
			rc =
			    c->o.ops.push(c->o.arg, b->uniq, b->nuniq, c->gsum);
			c->st.pushes++;
		}
		if (rc) {
			emb_log(EMB_LOG_WARN,
				"cache: push of %u rows failed: %s", b->nuniq,
				emb_strerror(rc));
			rc = EMB_EPUSH;
			goto out_release;
		}
		c->st.bytes_written += (uint64_t)b->nuniq * dim * sizeof(float);
	} else if (c->compact) {
		rc = update_compact(c, b);
		if (rc)
			goto out_release;
	} else {
		for (uint32_t u = 0; u < b->nuniq; u++) {
			uint32_t s = b->slots[u];
			float *row = row_of(c, s);

			if (u + AHEAD < b->nuniq)
				prefetch_floats(row_of(c, b->slots[u + AHEAD]),
						c->rf);
			emb_optim_apply(&c->o.optim, row, row + dim,
					c->gsum + (size_t)u * dim, dim);
			c->slots[s].count = count_next(c->slots[s].count);
			mark_dirty(c, s);
		}
	}
	c->step++;

out_release:
	batch_release(c, b);
	c->cur = NULL;
	return rc;
}

void emb_cache_nonfinite(const struct emb_cache *c, uint64_t *id,
			 uint32_t *elem)
{
	*id = c->bad_id;
	*elem = c->bad_elem;
}

int emb_cache_flush(struct emb_cache *c)
{
	uint32_t n = 0;
	int rc;

	if (c->o.mode != EMB_CACHE_WRITE_BACK || !c->ndirty)
		return 0;
	/* Only VALID rows are ever dirty: write-back never refetches a
	 * cached row, so rows in flight need no wait. */
	for (uint32_t s = 0; s <= c->o.capacity; s++) {
		if (s < c->o.capacity && (c->slots[s].flags & F_DIRTY)) {
			c->tmp_slots[n] = s;
			c->wb_ids[n] = c->slots[s].id;
			memcpy(c->wb_rows + (size_t)n * c->rf, row_of(c, s),
			       c->rf * sizeof(float));
			n++;
		}
		if (!n || (n < c->o.max_batch && s < c->o.capacity))
			continue;
		rc = c->o.ops.write_back(c->o.arg, c->wb_ids, n, c->wb_rows,
					 c->rf);
		if (rc) {
			emb_log(EMB_LOG_WARN,
				"cache: flush of %u rows failed: %s", n,
				emb_strerror(rc));
			return EMB_EWRITEBACK;
		}
		for (uint32_t k = 0; k < n; k++)
			c->slots[c->tmp_slots[k]].flags &= ~F_DIRTY;
		c->ndirty -= n;
		c->st.write_backs += n;
		c->st.bytes_written += (uint64_t)n * c->rf * sizeof(float);
		n = 0;
	}
	return 0;
}

void emb_cache_stats(const struct emb_cache *c, struct emb_cache_stats *out)
{
	uint64_t seen;

	*out = c->st;
	seen = out->hits + out->misses;
	out->hit_ratio = seen ? (double)out->hits / (double)seen : 0.0;
	out->rows = c->nrows;
	out->pinned = c->npinned;
	out->dirty = c->ndirty;
	out->queued = c->qcount;
}

uint32_t emb_cache_row_floats(const struct emb_cache *c)
{
	return c->rf;
}
