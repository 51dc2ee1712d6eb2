/*
 * src/server/session.c - per-session windows of PUSH sequence numbers.
 * Sessions are spread by id over NSTRIPE stripes, each with its own mutex,
 * so that pushes of different clients on different loops do not queue on
 * one lock. In a stripe, sessions live in one array, chained from hash
 * buckets; the least recently used one is reused when the array is full.
 * Any thread, under the stripe's mutex.
 *
 * A claimed number is first pending (its push is being applied), then
 * applied (emb__sessions_done) or released (emb__sessions_undo). A copy
 * sent again while the first is still being applied, on another loop
 * after the first's connection broke, waits on the stripe's condition
 * variable for that outcome: acknowledged as a duplicate once the first
 * is applied, applied itself if the first failed. Answering it a
 * duplicate at once would acknowledge a write that may yet fail.
 */
#include "server/session.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"

#define WORDS	(EMB_SESSION_WINDOW / 64)
#define NSTRIPE 16u			     /* a power of two */
#define PER	(EMB_SESSIONS_MAX / NSTRIPE) /* sessions per stripe */
#define NBUCKET (2 * PER)		     /* a power of two */
#define NIL	UINT32_MAX

struct sess {
	uint64_t id;	      /* client session; 0 = slot unused */
	uint64_t top;	      /* highest sequence number claimed */
	uint64_t used;	      /* ss->clock at its last claim */
	uint32_t next;	      /* next in its bucket, or NIL */
	uint64_t bits[WORDS]; /* bit seq % WINDOW: seq in (top - WINDOW,
				 top] claimed */
	uint64_t pend[WORDS]; /* of those, claimed but not yet applied */
};

struct stripe {
	_Alignas(64) pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;		 /* a pending claim was settled */
	uint32_t waiters;		 /* threads waiting on cv */
	struct sess *s;			 /* PER slots */
	uint32_t n;			 /* slots in use */
	uint32_t bucket[NBUCKET];	 /* first slot of each chain, or NIL */
	uint64_t clock;			 /* claims so far */
	uint64_t dups;			 /* duplicates acknowledged */
};

struct emb_sessions {
	struct stripe st[NSTRIPE]; /* by the id's hash, high bits */
};

static uint32_t bucket_of(uint64_t id)
{
	return (uint32_t)(emb_id_hash(id) & (NBUCKET - 1));
}

static struct stripe *stripe_of(struct emb_sessions *ss, uint64_t id)
{
	return &ss->st[emb_id_hash(id) >> 60 & (NSTRIPE - 1)];
}

void emb__sessions_destroy(struct emb_sessions *ss)
{
	if (!ss)
		return;
	for (uint32_t k = 0; k < NSTRIPE; k++) {
		if (!ss->st[k].s)
			continue;
		pthread_mutex_destroy(&ss->st[k].mu);
		pthread_cond_destroy(&ss->st[k].cv);
		free(ss->st[k].s);
	}
	free(ss);
}

int emb__sessions_create(struct emb_sessions **out)
{
	struct emb_sessions *ss = aligned_alloc(64, sizeof(*ss));

	if (!ss)
		return -ENOMEM;
	memset(ss, 0, sizeof(*ss));
	for (uint32_t k = 0; k < NSTRIPE; k++) {
		struct stripe *t = &ss->st[k];

		t->s = calloc(PER, sizeof(*t->s));
		if (!t->s) {
			emb__sessions_destroy(ss);
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < NBUCKET; i++)
			t->bucket[i] = NIL;
		pthread_mutex_init(&t->mu, NULL);
		pthread_cond_init(&t->cv, NULL);
	}
	*out = ss;
	return 0;
}

static struct sess *find(struct stripe *ss, uint64_t id)
{
	for (uint32_t i = ss->bucket[bucket_of(id)]; i != NIL;
	     i = ss->s[i].next)
		if (ss->s[i].id == id)
			return &ss->s[i];
	return NULL;
}

static void unlink_slot(struct stripe *ss, uint32_t slot)
{
	uint32_t *pp = &ss->bucket[bucket_of(ss->s[slot].id)];

	while (*pp != slot)
		pp = &ss->s[*pp].next;
	*pp = ss->s[slot].next;
}

/* A new session, in a free slot or in the least recently used one. */
static struct sess *add(struct stripe *ss, uint64_t id)
{
	uint32_t slot = ss->n, b = bucket_of(id);
	struct sess *e;

	if (ss->n == PER) {
		slot = 0;
		for (uint32_t i = 1; i < PER; i++)
			if (ss->s[i].used < ss->s[slot].used)
				slot = i;
		unlink_slot(ss, slot);
	} else {
		ss->n++;
	}
	e = &ss->s[slot];
	memset(e, 0, sizeof(*e));
	e->id = id;
	e->next = ss->bucket[b];
	ss->bucket[b] = slot;
	return e;
}

static bool bit_get(const uint64_t *bits, uint64_t seq)
{
	uint64_t b = seq % EMB_SESSION_WINDOW;

	return (bits[b / 64] >> (b % 64)) & 1;
}

/* Whether seq falls in e's window, (top - WINDOW, top]. */
static bool in_window(const struct sess *e, uint64_t seq)
{
	return seq <= e->top && e->top - seq < EMB_SESSION_WINDOW;
}

static void bit_put(uint64_t *bits, uint64_t seq, bool on)
{
	uint64_t b = seq % EMB_SESSION_WINDOW, m = 1ull << (b % 64);

	if (on)
		bits[b / 64] |= m;
	else
		bits[b / 64] &= ~m;
}

/* Claimed and pending both (a push being applied), or else both clear. */
static void put_claim(struct sess *e, uint64_t seq, bool on)
{
	bit_put(e->bits, seq, on);
	bit_put(e->pend, seq, on);
}

/*
 * Waits, under ss->mu, until (session, seq) is no longer pending, and
 * returns its session then (NULL if it was forgotten meanwhile: reused for
 * another, least recently used). A pending claim is settled by the thread
 * applying its push, which never waits here itself, so the wait ends.
 */
static struct sess *wait_settled(struct stripe *ss, uint64_t session,
				 uint64_t seq)
{
	struct sess *e = find(ss, session);

	while (e && in_window(e, seq) && bit_get(e->pend, seq)) {
		ss->waiters++;
		pthread_cond_wait(&ss->cv, &ss->mu);
		ss->waiters--;
		e = find(ss, session);
	}
	return e;
}

/* Wakes the threads waiting on a pending claim of ss. */
static void wake(struct stripe *ss)
{
	if (ss->waiters)
		pthread_cond_broadcast(&ss->cv);
}

int emb__sessions_claim(struct emb_sessions *all, uint64_t session,
			uint64_t seq)
{
	struct stripe *ss = stripe_of(all, session);
	struct sess *e;
	int rc = 0;

	pthread_mutex_lock(&ss->mu);
	e = wait_settled(ss, session, seq);
	if (!e)
		e = add(ss, session);
	e->used = ++ss->clock;
	if (seq > e->top) {
		/* Slide the window: the numbers it passes were never seen. */
		if (seq - e->top >= EMB_SESSION_WINDOW) {
			memset(e->bits, 0, sizeof(e->bits));
			memset(e->pend, 0, sizeof(e->pend));
		} else {
			for (uint64_t q = e->top + 1; q < seq; q++)
				put_claim(e, q, false);
		}
		e->top = seq;
		put_claim(e, seq, true);
	} else if (e->top - seq >= EMB_SESSION_WINDOW) {
		rc = EMB_ERETRYLATE;
	} else if (bit_get(e->bits, seq)) {
		ss->dups++;
		rc = 1;
	} else {
		put_claim(e, seq, true);
	}
	pthread_mutex_unlock(&ss->mu);
	return rc;
}

bool emb__sessions_seen(struct emb_sessions *all, uint64_t session,
			uint64_t seq)
{
	struct stripe *ss = stripe_of(all, session);
	struct sess *e;
	bool seen;

	pthread_mutex_lock(&ss->mu);
	e = wait_settled(ss, session, seq);
	seen = e && in_window(e, seq) && bit_get(e->bits, seq);
	if (seen)
		ss->dups++;
	pthread_mutex_unlock(&ss->mu);
	return seen;
}

/* Settles a pending claim: applied (still claimed) or released. */
static void settle(struct emb_sessions *all, uint64_t session, uint64_t seq,
		   bool applied)
{
	struct stripe *ss = stripe_of(all, session);
	struct sess *e;

	pthread_mutex_lock(&ss->mu);
	e = find(ss, session);
	if (e && in_window(e, seq)) {
		bit_put(e->pend, seq, false);
		if (!applied)
			bit_put(e->bits, seq, false);
	}
	wake(ss);
	pthread_mutex_unlock(&ss->mu);
}

void emb__sessions_undo(struct emb_sessions *all, uint64_t session,
			uint64_t seq)
{
	settle(all, session, seq, false);
}

void emb__sessions_done(struct emb_sessions *all, uint64_t session,
			uint64_t seq)
{
	settle(all, session, seq, true);
}

uint64_t emb__sessions_dups(struct emb_sessions *ss)
{
	uint64_t n = 0;

	for (uint32_t k = 0; k < NSTRIPE; k++) {
		pthread_mutex_lock(&ss->st[k].mu);
		n += ss->st[k].dups;
		pthread_mutex_unlock(&ss->st[k].mu);
	}
	return n;
}
