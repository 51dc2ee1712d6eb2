/*
 * src/server/slots.c - the replicated server's view of the cluster map and
 * the check of every write against it (slots.h; the argument for each
 * rule is in docs/replication.md, "Recovery").
 */
#include "server/slots.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cluster/map.h"
#include "common/err.h"
#include "common/hash.h"
#include "store/store.h"

/* Rows the sweep leaves: of slots held or filled here, and of a move's
 * copy ahead to here (its fenced stream sends only what changed). */
#define KEEP (EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_WARMING)

struct emb__slots {
	pthread_rwlock_t lock;	 /* writes read, emb__slots_set() writes */
	bool on;		 /* a view was set; atomic */
	struct emb_server_map m; /* under lock */
	uint64_t hinted;	 /* newest epoch passed to hook; atomic */
	void (*hook)(void *, uint64_t);
	void *hook_arg;
	uint64_t refused[2]; /* atomic */
};

int emb__slots_create(struct emb__slots **out)
{
	struct emb__slots *sl = calloc(1, sizeof(*sl));

	if (!sl)
		return -ENOMEM;
	pthread_rwlock_init(&sl->lock, NULL);
	*out = sl;
	return 0;
}

void emb__slots_destroy(struct emb__slots *sl)
{
	if (!sl)
		return;
	pthread_rwlock_destroy(&sl->lock);
	free(sl);
}

int emb__slots_set(struct emb__slots *sl, const struct emb_server_map *m)
{
	if (!m || m->epoch == 0)
		return -EINVAL;
	pthread_rwlock_wrlock(&sl->lock);
	/* Views only go forward: a late answer changes nothing. */
	if (!sl->on || m->epoch >= sl->m.epoch)
		sl->m = *m;
	__atomic_store_n(&sl->on, true, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&sl->lock);
	return 0;
}

void emb__slots_hook(struct emb__slots *sl, void (*fn)(void *, uint64_t),
		     void *arg)
{
	pthread_rwlock_wrlock(&sl->lock);
	sl->hook = fn;
	sl->hook_arg = arg;
	pthread_rwlock_unlock(&sl->lock);
}

static int refuse(struct emb__slots *sl, int code, const char **why,
		  const char *msg)
{
	__atomic_fetch_add(&sl->refused[code == EMB_ESTALEMAP], 1,
			   __ATOMIC_RELAXED);
	*why = msg;
	return code;
}

/* A write was routed by map epoch e, newer than this server's: the hook
 * (the agent) fetches the map at once, not at its next heartbeat, once
 * per epoch. */
static void hint(struct emb__slots *sl, uint64_t e)
{
	if (sl->hook && e > __atomic_load_n(&sl->hinted, __ATOMIC_RELAXED)) {
		__atomic_store_n(&sl->hinted, e, __ATOMIC_RELAXED);
		sl->hook(sl->hook_arg, e);
	}
}

/* Under the read lock: the rules, in the order docs/replication.md
 * gives them. */
static int check(struct emb__slots *sl, const struct emb_frame_hdr *h,
		 const uint64_t *ids, uint32_t n, const char **why)
{
	const struct emb_server_map *m = &sl->m;
	const uint64_t e = emb_wire_req_epoch(h);
	const bool fill = h->flags & EMB_F_FILL;
	const uint8_t fill_flag = h->flags & EMB_F_WARM
				      ? EMB_CMAP_VIEW_WARMING
				      : EMB_CMAP_VIEW_FILLING;

	/* Routed by a map this server has not seen: it may hold a fence
	 * or a writer this view lacks, so nothing is applied yet. */
	if (e > m->epoch) {
		hint(sl, e);
		return refuse(sl, EMB_EMOVING, why,
			      "this server's cluster map is older than the "
			      "request's: retry");
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = emb_id_slot(ids[i]);
		uint8_t f = m->slot[s];

		if (fill) {
			/* Rows of a fill land only in the chunk it fills,
			 * a copy ahead's in the chunk it copies. */
			if (!(f & fill_flag))
				return refuse(sl, EMB_ESTALEMAP, why,
					      "no fill of this slot here");
			continue;
		}
		if (e && e < m->grew[s])
			return refuse(sl, EMB_ESTALEMAP, why,
				      "a newer cluster map adds a copy of "
				      "this slot");
		if (e && !(f & EMB_CMAP_VIEW_MINE))
			return refuse(sl, EMB_ESTALEMAP, why,
				      "this server holds no copy of the slot");
		if (f & EMB_CMAP_VIEW_FENCED)
			return refuse(sl, EMB_EMOVING, why,
				      "slot being copied to a new replica");
	}
	return 0;
}

int emb__slots_begin(struct emb__slots *sl, const struct emb_frame_hdr *h,
		     const uint64_t *ids, uint32_t n, const char **why)
{
	int rc;

	*why = NULL;
	if (!__atomic_load_n(&sl->on, __ATOMIC_ACQUIRE)) {
		/* A replicated write before this server has any map: it
		 * may be a newcomer whose rows are not there yet. A server
		 * of a job just formed asks for its first map here: left to
		 * its next heartbeat, every write to it was refused for up
		 * to 2 s at the start of every replicated job. */
		if (emb_wire_req_epoch(h)) {
			pthread_rwlock_rdlock(&sl->lock);
			hint(sl, emb_wire_req_epoch(h));
			pthread_rwlock_unlock(&sl->lock);
			return refuse(sl, EMB_EMOVING, why,
				      "this server has no cluster map yet");
		}
		return 0;
	}
	pthread_rwlock_rdlock(&sl->lock);
	rc = check(sl, h, ids, n, why);
	if (rc) {
		pthread_rwlock_unlock(&sl->lock);
		return rc;
	}
	return 1;
}

int emb__slots_read(struct emb__slots *sl, const uint64_t *ids, uint32_t n,
		    const char **why)
{
	int rc = 0;

	*why = NULL;
	if (!__atomic_load_n(&sl->on, __ATOMIC_ACQUIRE))
		return 0;
	pthread_rwlock_rdlock(&sl->lock);
	for (uint32_t i = 0; i < n; i++)
		if (!(sl->m.slot[emb_id_slot(ids[i])] & EMB_CMAP_VIEW_MINE)) {
			rc = refuse(sl, EMB_ESTALEMAP, why,
				    "this server holds no copy of the slot");
			break;
		}
	pthread_rwlock_unlock(&sl->lock);
	return rc;
}

uint32_t emb__slots_unheld(struct emb__slots *sl, uint64_t *set)
{
	uint32_t k = 0;

	memset(set, 0, EMB_NSLOTS / 8);
	if (!__atomic_load_n(&sl->on, __ATOMIC_ACQUIRE))
		return 0;
	pthread_rwlock_rdlock(&sl->lock);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		if (!(sl->m.slot[i] & KEEP)) {
			set[i / 64] |= 1ull << (i % 64);
			k++;
		}
	pthread_rwlock_unlock(&sl->lock);
	return k;
}

int64_t emb__slots_drop(struct emb__slots *sl, struct emb_table *t,
			uint64_t *ids, uint32_t n)
{
	uint32_t k = 0;
	int rc;

	if (!__atomic_load_n(&sl->on, __ATOMIC_ACQUIRE))
		return 0;
	/* Under the read lock, as a write: a fill into this server marks
	 * its slots (write lock) before any of its rows can land, so no
	 * filled row is dropped. */
	pthread_rwlock_rdlock(&sl->lock);
	for (uint32_t i = 0; i < n; i++)
		if (!(sl->m.slot[emb_id_slot(ids[i])] & KEEP))
			ids[k++] = ids[i];
	rc = k ? emb_table_erase(t, ids, k) : 0;
	pthread_rwlock_unlock(&sl->lock);
	return rc;
}

void emb__slots_end(struct emb__slots *sl, int held)
{
	if (held == 1)
		pthread_rwlock_unlock(&sl->lock);
}

void emb__slots_warming(struct emb__slots *sl, uint32_t *held,
			uint32_t *warming, uint32_t *share)
{
	const uint8_t moving = EMB_CMAP_VIEW_FILLING | EMB_CMAP_VIEW_WARMING;

	*held = *warming = *share = 0;
	if (!__atomic_load_n(&sl->on, __ATOMIC_ACQUIRE))
		return;
	pthread_rwlock_rdlock(&sl->lock);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
		uint8_t f = sl->m.slot[i];

		*held += (f & EMB_CMAP_VIEW_MINE) && !(f & moving);
		*warming += !!(f & EMB_CMAP_VIEW_WARMING);
	}
	*share = sl->m.share;
	pthread_rwlock_unlock(&sl->lock);
}

bool emb__slots_on(struct emb__slots *sl)
{
	return __atomic_load_n(&sl->on, __ATOMIC_ACQUIRE);
}

void emb__slots_counts(struct emb__slots *sl, uint64_t out[2])
{
	out[0] = __atomic_load_n(&sl->refused[0], __ATOMIC_RELAXED);
	out[1] = __atomic_load_n(&sl->refused[1], __ATOMIC_RELAXED);
}
