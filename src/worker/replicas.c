/*
 * src/worker/replicas.c - the client's replicated map (docs/replication.md):
 * routing by the scheduler's map, replica groups for writes, a pull
 * rerouted when its server died, failover when the scheduler declares a
 * server dead, and the hooks worker/cluster.c installs the map through.
 *
 * With a map of R > 1 copies per slot, a push, assign or erase is
 * partitioned by replica group (the servers that hold a slot) and each
 * part goes to every holder; the op succeeds when every live holder
 * applied it, and a holder the scheduler declared dead does not count.
 * Pulls go to the primary; a pull part whose primary died is sent again to
 * the slot's first live backup.
 *
 * Recovery ("Recovery" there): with a scheduler, every replicated write
 * carries the epoch of the map it was routed by (EMB_F_EPOCH). A server
 * filling a chunk answers EMB_EMOVING, and one whose map grew a writer
 * since that epoch EMB_ESTALEMAP: the copy waits a moment and goes again
 * to the same server with the same sequence number; before it goes, a
 * copy routed by an older map than the client's gets copies for the
 * writers the newer map added (emb__rep_fixup()).
 *
 * Parts are sent again through c->fns (op.c).
 *
 * Threads: c->cmap is written by the loop thread and read by callers as
 * they partition, under c->map_mu; the map setters run before the client
 * is shared.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "proto/wire.h"
#include "transport/transport.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "cluster/map.h"
#include "cluster/node.h"

#define MOVING_MIN_MS 2u  /* first wait of a copy refused for a fill */
#define MOVING_MAX_MS 50u /* longest: a fill's chunk streams in ms */

static int set_map(struct emb_client *c, const uint16_t *slot_map, uint32_t r,
		   const bool *removed, bool mapped, bool check);
static void close_dead(void *arg);
static void failover(struct emb_client *c);

/*
 * The key each slot is partitioned by: its replica group (by_group, and
 * replicated), else its primary server. Replicated, c->map_mu is held
 * until emb__rep_unlock_keys(): the loop may redraw the map meanwhile.
 */
const uint16_t *emb__rep_keys(struct emb_client *c, bool by_group,
			      uint32_t *nkeys)
{
	if (!c->cmap) {
		*nkeys = c->nsrv;
		return c->slot_map;
	}
	pthread_mutex_lock(&c->map_mu);
	if (!by_group) {
		*nkeys = c->nsrv;
		return c->slot_map;
	}
	*nkeys = c->ngroups;
	return c->grp;
}

void emb__rep_unlock_keys(struct emb_client *c)
{
	if (c->cmap)
		pthread_mutex_unlock(&c->map_mu);
}

/* Loop thread: the first holder of slot sl not declared dead, or NONE.
 * The dead flag comes before the map update: go by it. */
static uint32_t live_holder(const struct emb_client *c, uint32_t sl)
{
	const uint16_t *h = c->cmap->slot[sl];

	for (uint32_t i = 0; i < c->cmap->replicas; i++)
		if (h[i] != EMB_CMAP_NONE && !srv_dead(&c->srv[h[i]]))
			return h[i];
	return NONE;
}

/*
 * Loop thread: p's ids go to several live holders (after a rebalance a
 * primary's slots have different backups): one new part per holder, each
 * a PULL of its ids that scatters them to their places as a one-sided
 * part's fallback does (rd.fb, rd.miss), in memory of its own that the op
 * frees. All are made before any is sent. 0, or -ENOMEM (none was).
 */
static int split(struct emb_async *op, struct part *p)
{
	struct emb_client *c = op->c;
	const uint64_t *ids = p->req.iov[0].iov_base;
	struct part *made = NULL, *e;
	uint32_t nmade = 0;

	for (uint32_t j0 = 0; j0 < p->req.n; j0++) {
		uint32_t to = live_holder(c, emb_id_slot(ids[j0])), k = 0,
			 at = 0;
		bool seen = false;
		size_t resp_cap, head = (sizeof(*e) + 63) & ~(size_t)63;
		char *m;

		/* Each holder once: at the first id that goes to it. */
		for (uint32_t j = 0; j < j0 && !seen; j++)
			seen = live_holder(c, emb_id_slot(ids[j])) == to;
		if (seen)
			continue;
		for (uint32_t j = j0; j < p->req.n; j++)
			k += live_holder(c, emb_id_slot(ids[j])) == to;
		/* A BIRTHS part's answer is 4 bytes an id. */
		resp_cap =
		    (op->kind == OP_BIRTHS
			 ? emb_wire_births_resp_bytes(k)
			 : emb_wire_pull_resp_bytes(k, op->dim,
						    p->req.hdr.flags)) -
		    EMB_WIRE_HDR_SIZE;
		if (resp_cap < ERR_CAP)
			resp_cap = ERR_CAP;
		resp_cap = (resp_cap + 63) & ~(size_t)63;
		/* aligned_alloc() takes whole 64-byte lines. */
		m = aligned_alloc(64, (head + resp_cap + (size_t)k * 12 + 63) &
					  ~(size_t)63);
		if (!m)
			goto err;
		e = (struct part *)(void *)m;
		*e = *p;
		memset(&e->retry, 0, sizeof(e->retry));
		memset(&e->rd, 0, sizeof(e->rd));
		e->req.server = to;
		e->req.gen = __atomic_load_n(&c->srv[to].gen, __ATOMIC_RELAXED);
		e->req.hdr.table_id =
		    __atomic_load_n(&op->tids[to], __ATOMIC_RELAXED);
		e->req.n = k;
		e->req.hdr.count = k;
		e->req.status = 0;
		e->req.resp = m + head;
		e->req.resp_cap = resp_cap;
		e->rd.os_done = true;
		e->rd.fb = true;
		e->rd.nmiss = k;
		e->rd.miss_ids = (uint64_t *)(void *)(m + head + resp_cap);
		e->rd.miss = (uint32_t *)(void *)(e->rd.miss_ids + k);
		for (uint32_t j = j0; j < p->req.n; j++) {
			if (live_holder(c, emb_id_slot(ids[j])) != to)
				continue;
			e->rd.miss_ids[at] = ids[j];
			/* Its place in the op: as p's row j says. */
			e->rd.miss[at++] = p->rd.fb ? p->rd.miss[j] : j;
		}
		e->req.iov[0] = (struct iovec){e->rd.miss_ids, k * 8ull};
		e->req.niov = 1;
		e->rep.enext = made;
		made = e;
		nmade++;
	}
	/* Counted before any is sent: one may end at once. */
	op->pending += nmade;
	emb_log(EMB_LOG_DEBUG,
		"a pull part of %u ids for dead server %u goes to %u live "
		"holders",
		p->req.n, p->req.server, nmade);
	while ((e = made)) {
		made = e->rep.enext;
		e->rep.enext = op->split;
		op->split = e;
		c->fns->send(c, e);
	}
	return 0;
err:
	while ((e = made)) {
		made = e->rep.enext;
		free(e);
	}
	return -ENOMEM;
}

/*
 * Loop thread: a pull part whose server died (or whose rank a newcomer
 * took since it was routed) goes to the first live holder of each of its
 * ids' slots: p itself when that is one server for all of them (it is
 * with the successor backups of the first map), else new parts (split()).
 */
enum reroute emb__rep_reroute(struct emb_async *op, struct part *p)
{
	struct emb_client *c = op->c;
	const uint64_t *ids = p->req.iov[0].iov_base;
	uint32_t to = NONE;
	bool several = false;

	if (!c->cmap || (op->kind != OP_PULL && op->kind != OP_BIRTHS) ||
	    stopping(c))
		return REROUTE_NONE;
	for (uint32_t j = 0; j < p->req.n; j++) {
		uint32_t live = live_holder(c, emb_id_slot(ids[j]));

		if (live == NONE)
			return REROUTE_NONE; /* a lost slot: the pull fails */
		if (to == NONE)
			to = live;
		else if (live != to)
			several = true;
	}
	if (to == NONE)
		return REROUTE_NONE;
	if (several)
		return split(op, p) ? REROUTE_NONE : REROUTE_SPLIT;
	/* The server it was sent to, as it is now: no reason to move. */
	if (to == p->req.server &&
	    p->req.gen == __atomic_load_n(&c->srv[to].gen, __ATOMIC_RELAXED))
		return REROUTE_NONE;
	p->req.server = to;
	p->req.gen = __atomic_load_n(&c->srv[to].gen, __ATOMIC_RELAXED);
	p->req.hdr.table_id = __atomic_load_n(&op->tids[to], __ATOMIC_RELAXED);
	return REROUTE_MOVED;
}

/*
 * Loop thread (it writes c->cmap, so it reads it unlocked): slots of the
 * replicated map with no holder the scheduler has not declared dead. A
 * death is flagged (srv_dead) just before failover() redraws the map, so
 * the flags count, not the map alone.
 */
uint32_t emb__rep_lost_slots(const struct emb_client *c)
{
	uint32_t lost = 0;

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		const uint16_t *h = c->cmap->slot[sl];
		bool live = false;

		for (uint32_t i = 0; i < c->cmap->replicas && !live; i++)
			live = h[i] != EMB_CMAP_NONE &&
			       !srv_dead(&c->srv[h[i]]);
		lost += !live;
	}
	return lost;
}

/* Loop thread: why a fan-out to a dead server fails, for
 * emb_client_last_error() and the log. */
void emb__rep_note_lost(struct emb_client *c, const struct part *p,
		      uint32_t lost)
{
	const struct server *s = &c->srv[p->req.server];

	pthread_mutex_lock(&c->err_lock);
	c->last_status = EMB_ENODEAD;
	snprintf(c->last_msg, sizeof(c->last_msg),
		 "server %s:%u is dead and %u slot%s have no live copy",
		 s->host, s->port, lost, lost == 1 ? "" : "s");
	emb_log(EMB_LOG_ERROR, "%s", c->last_msg);
	pthread_mutex_unlock(&c->err_lock);
}

/* Loop thread: p waits a back-off, then is sent again (conn.c's loop). */
void emb__rep_delay(struct emb_client *c, struct part *p)
{
	p->retry.wait_ms =
	    p->retry.wait_ms ? 2 * p->retry.wait_ms : MOVING_MIN_MS;
	if (p->retry.wait_ms > MOVING_MAX_MS)
		p->retry.wait_ms = MOVING_MAX_MS;
	p->retry.due_ms = emb_clock_ms() + p->retry.wait_ms;
	/* No later than the deadline: then it ends (conn.c's loop). */
	if (p->retry.due_ms > p->op->deadline_ms)
		p->retry.due_ms = p->op->deadline_ms;
	p->retry.dnext = c->delayed;
	c->delayed = p;
}

/* The ids and rows (NULL for erase) a replicated write's copy sends. */
static const uint64_t *part_ids(const struct part *p, const float **rows)
{
	if (p->op->kind == OP_PUSH) {
		*rows = p->req.n ? p->req.iov[2].iov_base : NULL;
		return p->req.iov[1].iov_base;
	}
	*rows = p->req.niov > 1 ? p->req.iov[1].iov_base : NULL;
	return p->req.iov[0].iov_base;
}

static bool in_list(const uint16_t *w, uint32_t n, uint32_t rank)
{
	for (uint32_t i = 0; i < n; i++)
		if (w[i] == rank)
			return true;
	return false;
}

/* Whether copy q goes to its server as it is now: not to an earlier
 * server on that rank (a newcomer took it since; such a copy is never
 * sent, op.c). */
static bool current(const struct emb_client *c, const struct part *q)
{
	return !q->req.gen ||
	       q->req.gen == __atomic_load_n(&c->srv[q->req.server].gen,
					     __ATOMIC_RELAXED);
}

/* Whether a copy emb__rep_fixup() added to lead's group sends id to rank. */
static bool ext_has(const struct emb_client *c, const struct part *lead,
		    uint32_t rank, uint64_t id)
{
	for (const struct part *e = lead->rep.ext; e; e = e->rep.enext) {
		const float *unused;
		const uint64_t *ids;

		if (e->req.server != rank || !current(c, e) ||
		    emb_cmap_refilled(c->cmap, emb_id_slot(id), rank,
				      e->rep.epoch))
			continue;
		ids = part_ids(e, &unused);
		for (uint32_t j = 0; j < e->req.n; j++)
			if (ids[j] == id)
				return true;
	}
	return false;
}

/*
 * Loop thread: a new copy of src's rows j with keep(j) (k of them) for
 * server to, in memory of its own that the op frees, on lead's list; not
 * sent. NULL when out of memory.
 */
static struct part *ext_copy(struct emb_client *c, struct emb_async *op,
			     struct part *lead, const struct part *src,
			     uint32_t to, uint32_t k,
			     bool (*keep)(struct emb_client *, const struct part *,
					  uint32_t, uint32_t, uint64_t),
			     const struct part *kctx)
{
	/* A push's gradients may go as 2-byte values, and may name births. */
	const bool half =
	    src->req.hdr.flags & (EMB_F_GRAD_FP16 | EMB_F_GRAD_BF16);
	const uint32_t rowb = op->stride * (half ? 2u : (uint32_t)sizeof(float));
	const uint32_t *births = src->req.births;
	const float *rows;
	const uint64_t *ids = part_ids(src, &rows);
	uint32_t *ebirths = NULL;
	uint64_t *eids;
	float *erows;
	uint32_t at = 0;
	struct part *e;
	char *m;

	/* aligned_alloc() takes whole 64-byte lines. */
	m = aligned_alloc(64, (((sizeof(*e) + 63) & ~(size_t)63) + ERR_CAP +
			       (size_t)k * (8 + rowb + (births ? 4 : 0)) + 4 +
			       63) &
				  ~(size_t)63);
	if (!m)
		return NULL;
	e = (struct part *)(void *)m;
	*e = *src;
	e->rep.ext = e->rep.enext = e->retry.dnext = NULL;
	e->retry.wait_ms = 0;
	e->req.server = to;
	e->req.gen = __atomic_load_n(&c->srv[to].gen, __ATOMIC_RELAXED);
	e->req.n = k;
	e->req.status = 0;
	e->retry.flying = false;
	e->rep.epoch = c->map_epoch;
	e->rep.source = false;
	e->rep.asked = false;
	e->rep.lost = 0;
	e->rep.nrep = lead->rep.nrep; /* a copy: its death is no error */
	e->req.resp = m + ((sizeof(*e) + 63) & ~(size_t)63);
	e->req.resp_cap = ERR_CAP;
	eids = (uint64_t *)(void *)((char *)e->req.resp + ERR_CAP);
	erows = (float *)(void *)(eids + k);
	/* 2-byte gradients may end off a 4-byte boundary. */
	if (births)
		ebirths = (uint32_t *)(void *)((char *)erows +
					       (((size_t)k * rowb + 3) & ~(size_t)3));
	for (uint32_t j = 0; j < src->req.n && at < k; j++) {
		if (!keep(c, kctx, to, j, ids[j]))
			continue;
		eids[at] = ids[j];
		if (rows)
			memcpy((char *)erows + (size_t)at * rowb,
			       (const char *)rows + (size_t)j * rowb, rowb);
		if (births)
			ebirths[at] = births[j];
		at++;
	}
	e->req.hdr.count = k;
	if (op->kind == OP_PUSH) {
		e->req.seq = __atomic_add_fetch(&c->srv[to].push_seq, 1,
						__ATOMIC_RELAXED);
		emb_le64_store(e->req.prefix + 24, e->req.seq);
		emb__push_iovs(e, eids, erows, rowb, half, ebirths);
	} else {
		e->req.iov[0] = (struct iovec){eids, k * 8ull};
		e->req.niov = 1;
		if (rows)
			e->req.iov[e->req.niov++] =
			    (struct iovec){erows, (size_t)k * rowb};
		e->req.hdr.flags &= (uint16_t)~EMB_F_BIRTHS;
		e->req.births = NULL;
		if (births)
			emb__births_iovs(e, ebirths);
	}
	e->rep.enext = lead->rep.ext;
	lead->rep.ext = e;
	op->pending++;
	return e;
}

/* Lead's group's copy for rank that stands for its rows of slot sl, or
 * NULL: one to rank's current server (a copy to a rank's earlier
 * server covers nothing on the newcomer that took it: the newcomer,
 * being filled, gets a copy of its own), and not void there (a fill begun
 * since the copy was last sent rebuilt rank's copy of the slot). */
static const struct part *group_copy(const struct emb_client *c,
				     const struct part *lead, uint32_t rank,
				     uint32_t sl)
{
	const struct part *q = lead;

	for (uint32_t j = 0; j < lead->rep.nrep; j++, q++)
		if (q->req.server == rank && current(c, q))
			return emb_cmap_refilled(c->cmap, sl, rank,
						 q->rep.epoch)
				   ? NULL
				   : q;
	return NULL;
}

/* Whether lead's group has such a copy. */
static bool group_covers(const struct emb_client *c, const struct part *lead,
			 uint32_t rank, uint32_t sl)
{
	return group_copy(c, lead, rank, sl) != NULL;
}

/* What the death of a copy's server says of the write there (part_rep's
 * lost, on the group's own copy to it). */
enum rep_lost {
	REP_LIVE,	/* no death */
	REP_LOST_UNSENT, /* died with the copy unasked since its last
			    refusal: it never applied the write */
	REP_LOST_ASKED,	/* died before it answered: it may have */
};

/* The source of the fill begun since lead's group was routed into writer
 * `to` of slot sl, when the group sent it a copy: that copy, else NULL. */
static const struct part *fill_source_copy(const struct emb_client *c,
					   const struct part *lead,
					   uint32_t sl, uint32_t to)
{
	const struct emb_cmap *m = c->cmap;
	const uint32_t src = m->began_from[sl];

	if (m->began_to[sl] != to || src == EMB_CMAP_NONE ||
	    (uint64_t)m->began[sl] <= lead->rep.routed)
		return NULL;
	return group_copy(c, lead, src, sl);
}

/* Whether copy p sends id: every row of its group, unless it is a copy
 * a trim or a fixup made of some of them. */
static bool part_has(const struct part *p, uint64_t id)
{
	const struct emb_async *op = p->op;
	const float *unused;
	const uint64_t *ids;

	if (p >= op->parts && p < op->parts + op->nparts)
		return true;
	ids = part_ids(p, &unused);
	for (uint32_t j = 0; j < p->req.n; j++)
		if (ids[j] == id)
			return true;
	return false;
}

/*
 * Whether the refusal of copy p (of lead's group, routed by an older map)
 * means that writer `to` lacks row id of slot sl, which the group's copies
 * do not reach. Where `to` was rebuilt by a fill begun since p was routed
 * and the map names the server that streamed it, that server's copy alone
 * tells (its copy routed before the fill, or a copy made of that one):
 * had it applied the write first, its stream carried it, and a copy to
 * `to` as well would apply it twice. The acting primary of p's
 * group is not always that server: a rebalance between p's map and the
 * fill changes the primaries but not the writers (docs/replication.md,
 * "Whose refusal counts"). Elsewhere (the map names no source, or the
 * group sent that server nothing) the acting primary's copy tells, as it
 * did before the maps named sources.
 */
static bool refusal_counts(const struct emb_client *c,
			   const struct part *lead, const struct part *p,
			   uint32_t sl, uint64_t id, uint32_t to)
{
	const struct emb_cmap *m = c->cmap;
	const struct part *q = fill_source_copy(c, lead, sl, to);

	/* The source died: unasked, it never had the write, and its
	 * stream lacked it; asked, nobody knows (emb__rep_fixup() fails
	 * the call). */
	if (q && q->rep.lost)
		return q->rep.lost == REP_LOST_UNSENT;
	if (q)
		return p->req.server == q->req.server && current(c, p) &&
		       (uint64_t)m->began[sl] > p->rep.epoch && part_has(p, id);
	/* A copy whose server died answered nothing it can stand for,
	 * unless it never had the write. */
	if (p->rep.lost == REP_LOST_ASKED)
		return false;
	return emb__rep_source(c, p);
}

/* Whether writer `to` of row id (slot sl) of lead's group gets it in a
 * fixup triggered by copy p: the group's own copy to it does not stand
 * for it, no earlier fixup sent it there, and p's refusal shows it lacks
 * it. */
static bool fixup_lacks(const struct emb_client *c, const struct part *lead,
			const struct part *p, uint32_t to, uint32_t sl,
			uint64_t id)
{
	return !group_covers(c, lead, to, sl) && !ext_has(c, lead, to, id) &&
	       refusal_counts(c, lead, p, sl, id, to);
}

/* ext_copy()'s keep for a fixup triggered by copy p: rows whose writers
 * include to and that it lacks (fixup_lacks()). */
static bool keep_missing(struct emb_client *c, const struct part *p,
			 uint32_t to, uint32_t j, uint64_t id)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	const uint32_t sl = emb_id_slot(id);
	uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

	(void)j;
	return in_list(w, nw, to) &&
	       fixup_lacks(c, &p->op->parts[p->rep.lead], p, to, sl, id);
}

/* ext_copy()'s keep for a trim: rows whose writers still include to,
 * and whose copy there was not rebuilt by a fill begun after p was routed
 * (the fill's stream, or a fixup, brings it what it needs). */
static bool keep_writer(struct emb_client *c, const struct part *p,
			uint32_t to, uint32_t j, uint64_t id)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	const uint32_t sl = emb_id_slot(id);
	uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

	(void)j;
	return in_list(w, nw, to) &&
	       !emb_cmap_refilled(c->cmap, sl, to, p->rep.epoch);
}

bool emb__rep_source(const struct emb_client *c, const struct part *p)
{
	const struct emb_async *op = p->op;

	/* A fixup's own copy went to a writer the map added: never one; a
	 * trim's stands for the copy it was made of. */
	if (p < op->parts || p >= op->parts + op->nparts)
		return p->rep.source;
	for (const struct part *q = &op->parts[p->rep.lead]; q < p; q++)
		if (!srv_dead(&c->srv[q->req.server]))
			return false;
	return true;
}

enum trim emb__rep_trim(struct emb_client *c, struct emb_async *op,
			struct part *p)
{
	const float *rows;
	const uint64_t *ids = part_ids(p, &rows);
	uint32_t k = 0, refilled = 0;
	struct part *e;

	for (uint32_t j = 0; j < p->req.n; j++) {
		const uint32_t sl = emb_id_slot(ids[j]);

		k += keep_writer(c, p, p->req.server, j, ids[j]);
		refilled += emb_cmap_refilled(c->cmap, sl, p->req.server,
					      p->rep.epoch);
	}
	if (k == p->req.n)
		return TRIM_KEEP;
	if (k == 0)
		return refilled ? TRIM_VOID : TRIM_DONE;
	e = ext_copy(c, op, &op->parts[p->rep.lead], p, p->req.server, k,
		     keep_writer, p);
	if (!e)
		return TRIM_NOMEM;
	/* Refused by the acting primary, it is still the one whose refusal
	 * means a fill lacks these rows (emb__rep_fixup()). */
	e->rep.source = emb__rep_source(c, p);
	emb_log(EMB_LOG_DEBUG,
		"map epoch %llu: %u of %u rows of a copy still go to server %u",
		(unsigned long long)c->map_epoch, k, p->req.n, p->req.server);
	c->fns->send(c, e);
	return TRIM_DONE;
}

/*
 * Whether a writer of some row of lead's group was filled, since the group
 * was routed, by a server that died before it answered its copy: whether
 * its stream carried the write is not known, so the call fails with
 * EMB_ENODEAD (emb_last_error() says why) rather than claim a write that
 * may be missing there, or be applied there twice by a copy of its own.
 * 1 then; 0 when no row is so; 2 when some is but the client's map
 * guesses its fill (c->map_guessed: a fill whose source died may have
 * ended before the death, its target a holder, or with it, its target no
 * writer at all), and the coordinator's next map decides.
 */
static int source_unknown(struct emb_client *c, struct emb_async *op,
			  const struct part *lead)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	const float *rows;
	const uint64_t *ids = part_ids(lead, &rows);

	for (uint32_t j = 0; j < lead->req.n; j++) {
		const uint32_t sl = emb_id_slot(ids[j]);
		uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

		for (uint32_t i = 0; i < nw; i++) {
			const struct part *q =
			    fill_source_copy(c, lead, sl, w[i]);
			const struct server *s;

			if (!q || q->rep.lost != REP_LOST_ASKED ||
			    group_covers(c, lead, w[i], sl) ||
			    ext_has(c, lead, w[i], ids[j]))
				continue;
			if (c->map_guessed &&
			    emb_clock_ms() < op->deadline_ms)
				return 2;
			s = &c->srv[q->req.server];
			if (!op->status)
				op->status = EMB_ENODEAD;
			pthread_mutex_lock(&c->err_lock);
			c->last_status = EMB_ENODEAD;
			snprintf(c->last_msg, sizeof(c->last_msg),
				 "server %s:%u died before it answered a "
				 "write whose slot it had streamed to server "
				 "%u since: the write may be missing there",
				 s->host, s->port, w[i]);
			emb_log(EMB_LOG_WARN, "%s", c->last_msg);
			pthread_mutex_unlock(&c->err_lock);
			return 1;
		}
	}
	return 0;
}

int emb__rep_lost(struct emb_client *c, struct emb_async *op, struct part *p)
{
	struct part *lead = &op->parts[p->rep.lead];
	const uint8_t how = p->rep.asked ? REP_LOST_ASKED : REP_LOST_UNSENT;
	int rc;

	if (!c->cmap || !p->rep.epoch)
		return 0;
	/* On the group's own copy to that server, where refusal_counts()
	 * looks for the fill's source (p may be a copy made of it). */
	for (uint32_t j = 0; j < lead->rep.nrep; j++) {
		struct part *q = lead + j;

		if (q->req.server == p->req.server && q->rep.lost < how)
			q->rep.lost = how;
	}
	if (p->rep.lost < how)
		p->rep.lost = how;
	/* The writers the map shows now; a map that shows the fill later
	 * completes them when another copy of the group goes again. */
	p->rep.fixed = 0;
	rc = emb__rep_fixup(c, op, p);
	if (rc)
		return rc;
	/* Asked, with a fill's fate guessed: p waits for the next map. */
	return how == REP_LOST_ASKED && source_unknown(c, op, lead) == 2
		   ? EMB_REP_WAIT
		   : 0;
}

/*
 * Loop thread: copy p of lead's group was routed by an older map and
 * refused; writers the current one added to some of the group's rows (a
 * server being filled) get a copy of the rows whose lack there p's
 * refusal shows (keep_missing()), sent at once. The group's other copies
 * go out as they were: they reach servers that still hold the rows. Each
 * refused copy completes the group once per map: the copy whose refusal
 * counts for one slot may not for another. 0, or -ENOMEM (the op then
 * fails).
 */
int emb__rep_fixup(struct emb_client *c, struct emb_async *op,
		       struct part *p)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	struct part *lead = &op->parts[p->rep.lead];
	const uint64_t *ids;
	const float *rows;

	if (p->rep.fixed >= c->map_epoch)
		return 0;
	p->rep.fixed = c->map_epoch;
	ids = part_ids(lead, &rows);
	if (source_unknown(c, op, lead) == 1)
		return 0;
	for (;;) {
		uint32_t to = NONE, k = 0;
		struct part *e;

		/* The next writer some row's copy does not reach yet, and the
		 * rows it lacks: an earlier fixup may have sent it some. */
		for (uint32_t j = 0; j < lead->req.n; j++) {
			const uint32_t sl = emb_id_slot(ids[j]);
			uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

			for (uint32_t i = 0; i < nw; i++) {
				if ((to != NONE && w[i] != to) ||
				    !fixup_lacks(c, lead, p, w[i], sl, ids[j]))
					continue;
				to = w[i];
				k++;
			}
		}
		if (to == NONE)
			return 0;
		/* The rows are counted by ids alone: ext_has() of a row is
		 * the same before and after this copy is listed. */
		e = ext_copy(c, op, lead, lead, to, k, keep_missing, p);
		if (!e)
			return -ENOMEM;
		emb_log(EMB_LOG_DEBUG,
			"map epoch %llu: %u row%s of a write routed by epoch "
			"%llu go to server %u too",
			(unsigned long long)c->map_epoch, k, k == 1 ? "" : "s",
			(unsigned long long)lead->rep.epoch, to);
		c->fns->send(c, e);
	}
}

/*
 * Under c->map_mu (or before anyone else sees c): the primaries and the
 * replica groups of c->cmap. A lost slot keeps its old primary, whose
 * calls fail with EMB_ENODEAD, as an unreplicated client's do.
 */
static void regroup(struct emb_client *c)
{
	uint32_t moves = 0;

	c->ngroups = 0;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		const uint16_t *h = c->cmap->slot[sl];
		uint16_t gone[EMB_CMAP_REPLICAS_MAX];
		uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
		uint32_t g = 0;

		moves += c->cmap->fill[sl] != EMB_CMAP_NONE ||
			 c->cmap->warm[sl] != EMB_CMAP_NONE;

		/* Writes go to the slot's writers: its holders and the
		 * server being filled with it, R + 1 of them during a move
		 * (a group has room for EMB_CMAP_REPLICAS_MAX: the
		 * scheduler moves slots only with fewer replicas). */
		if (c->cmap->fill[sl] != EMB_CMAP_NONE) {
			uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

			for (uint32_t i = nw; i < EMB_CMAP_REPLICAS_MAX; i++)
				w[i] = EMB_CMAP_NONE;
			h = w;
		}
		if (h[0] == EMB_CMAP_NONE) {
			/* No copy left: a group of the old primary alone,
			 * dead, so that writes fail. */
			memcpy(gone, h, sizeof(gone));
			gone[0] = c->slot_map[sl];
			h = gone;
		} else {
			c->slot_map[sl] = h[0];
		}
		/* Few groups (about one per server): a linear search. */
		while (g < c->ngroups &&
		       memcmp(c->groups[g], h, sizeof(c->groups[g])))
			g++;
		if (g == c->ngroups)
			memcpy(c->groups[c->ngroups++], h, sizeof(c->groups[g]));
		c->grp[sl] = (uint16_t)g;
	}
	__atomic_store_n(&c->map_moves, moves, __ATOMIC_RELAXED);
	if (moves)
		__atomic_store_n(&c->map_moves_ms, emb_clock_ms(),
				 __ATOMIC_RELAXED);
}

int emb__client_set_cluster(struct emb_client *c, const uint16_t *slot_map,
			    struct emb_node *node)
{
	uint32_t r = node ? emb_node_replicas(node) : 1;
	bool mapped = node && emb_node_mapped(node);
	const struct emb_wire_node_addr *srv =
	    node ? emb_node_servers(node) : NULL;
	bool *removed = NULL;
	int rc;

	if (r > 1 || mapped) {
		removed = calloc(c->nsrv, sizeof(*removed));
		if (!removed)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->nsrv; i++)
			removed[i] = srv[i].removed;
	}
	/* With the scheduler's whole map to follow (emb__client_set_cmap()),
	 * primaries are its, not what init and removals give. */
	rc = set_map(c, slot_map, r, removed, mapped,
		     !(r > 1 && emb_node_coord(node) == NULL &&
		       !emb_node_is_static(node)) && !mapped);
	free(removed);
	if (!rc)
		c->node = node;
	return rc;
}

int emb__client_set_map(struct emb_client *c, const uint16_t *slot_map,
			uint32_t r, const bool *removed)
{
	return set_map(c, slot_map, r, removed, false, true);
}

/* check: the primaries must be what init and removals give (no map from
 * the scheduler follows to say otherwise). */
static int set_map(struct emb_client *c, const uint16_t *slot_map, uint32_t r,
		   const bool *removed, bool mapped, bool check)
{
	int rc = -ENOMEM;

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (slot_map[sl] >= c->nsrv)
			return -EINVAL;
	/* One copy with a map too: a job whose servers may join follows
	 * the scheduler's map as a replicated one does. */
	if (r > 1 || mapped) {
		c->cmap = malloc(sizeof(*c->cmap));
		c->grp = calloc(EMB_NSLOTS, sizeof(*c->grp));
		c->groups = calloc(EMB_NSLOTS, sizeof(*c->groups));
		if (!c->cmap || !c->grp || !c->groups)
			goto err;
		rc = -EINVAL;
		if (emb_cmap_init(c->cmap, c->nsrv, r))
			goto err;
		/* A map sent after a failover says who was removed; the
		 * rest follows (cluster/map.h), and must be what was sent. */
		for (uint32_t i = 0; i < c->nsrv; i++) {
			if (!removed || !removed[i])
				continue;
			emb_cmap_remove(c->cmap, i, c->cmap);
			/* Its calls end at once (no connection is made). */
			__atomic_store_n(&c->srv[i].dead, true,
					 __ATOMIC_RELAXED);
		}
		for (uint32_t sl = 0; check && sl < EMB_NSLOTS; sl++)
			if (emb_cmap_primary(c->cmap, sl) != slot_map[sl])
				goto err;
	}
	memcpy(c->slot_map, slot_map, sizeof(c->slot_map));
	if (c->cmap)
		regroup(c);
	return 0;
err:
	free(c->cmap);
	free(c->grp);
	free(c->groups);
	c->cmap = NULL;
	c->grp = NULL;
	c->groups = NULL;
	return rc;
}

int emb__client_set_cmap(struct emb_client *c, const struct emb_cmap *m)
{
	bool *removed;
	int rc;

	if (!c->cmap) {
		/* The shape first, then the scheduler's map over it: after a
		 * join or a rebalance it is no longer init and removals. */
		removed = calloc(c->nsrv, sizeof(*removed));
		if (!removed)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->nsrv; i++)
			removed[i] = srv_dead(&c->srv[i]);
		rc = set_map(c, c->slot_map, m->replicas, removed, true, false);
		free(removed);
		if (rc)
			return rc;
	}
	if (!c->cmap || m->nservers != c->nsrv || m->replicas != c->cmap->replicas)
		return -EINVAL;
	pthread_mutex_lock(&c->map_mu);
	*c->cmap = *m;
	c->map_epoch = m->epoch;
	c->map_guessed = false;
	regroup(c);
	pthread_mutex_unlock(&c->map_mu);
	return 0;
}

/* A scheduler's newer map, on its way to the client's loop. */
struct adopt {
	struct emb_client *c;
	struct emb_cmap m;
	uint32_t n;			     /* servers */
	bool *revive;			     /* n: a newcomer takes the rank
						(after srv[], same block) */
	struct emb_wire_node_addr srv[]; /* by rank */
};

/*
 * Under c->map_mu: the servers declared dead leave c->cmap, as the
 * coordinator's failover takes them out (emb_cmap_remove()), except that
 * a fill into a live server stays one of the slot's writers. The
 * coordinator ends a fill whose slot a dead server held, when the death
 * comes during it; but this map may be older than the fill's end, and
 * then the target holds the slot now, and a write left without a copy
 * there is lost there (cluster/move_kill found rows a push off: a move
 * from F to T was done, F died, and a client whose map was still at the
 * move's fence dropped T from its writes for the milliseconds until the
 * next map). A copy to a fill that did end is refused by its target,
 * which sends the client for the map; one to a fill done is applied.
 */
static void remove_dead(struct emb_client *c)
{
	uint16_t fill[EMB_NSLOTS];

	memcpy(fill, c->cmap->fill, sizeof(fill));
	for (uint32_t i = 0; i < c->nsrv; i++)
		if (srv_dead(&c->srv[i]))
			emb_cmap_remove(c->cmap, i, c->cmap);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (fill[sl] != EMB_CMAP_NONE &&
		    c->cmap->fill[sl] == EMB_CMAP_NONE &&
		    fill[sl] < c->nsrv && !srv_dead(&c->srv[fill[sl]]) &&
		    emb_cmap_holders(c->cmap, sl) > 0)
			c->cmap->fill[sl] = fill[sl];
}

/* Whether rank holds or is being filled with any slot in m. */
static bool in_map(const struct emb_cmap *m, uint32_t rank)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (m->fill[s] == rank || emb_cmap_holds(m, s, rank))
			return true;
	return false;
}

/*
 * Loop thread, with a newer map: every part waiting out a refusal goes
 * at the loop's next turn, its back-off begun again. The refusal was
 * most likely this map's news: a move's fence lifted and its slots
 * handed over, which the source answers with ESTALEMAP and the new
 * holder, until it has the map itself, with EMOVING. Left to its
 * doubling back-off, a write that met a 15 ms fence and then those two
 * refusals went again up to 32 ms later than it could have; a move's
 * every chunk cost one step that long (docs/benchmarks.md, "The
 * hand-over").
 * Refused once more, a part waits MOVING_MIN_MS again.
 */
static void wake_delayed(struct emb_client *c)
{
	const uint64_t now = emb_clock_ms();

	for (struct part *p = c->delayed; p; p = p->retry.dnext) {
		if (p->retry.due_ms > now)
			p->retry.due_ms = now;
		p->retry.wait_ms = 0;
	}
}

/*
 * Loop thread: routes by the scheduler's map from now on. Its removed
 * flags say who is dead, and a dead rank a newcomer took comes back with
 * the newcomer's address: its table ids are learned before anything is
 * sent there (tables_begin()).
 */
static void adopt_run(void *arg)
{
	struct adopt *a = arg;
	struct emb_client *c = a->c;
	uint32_t revived = 0;

	if (!c->cmap || a->n != c->nsrv || a->m.replicas != c->cmap->replicas ||
	    a->m.epoch < c->map_epoch) {
		free(a);
		return;
	}
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct server *s = &c->srv[i];
		const struct emb_wire_node_addr *na = &a->srv[i];
		bool moved = strcmp(s->host, na->host) || s->port != na->port;

		if (na->removed || !in_map(&a->m, i)) {
			if (na->removed)
				__atomic_store_n(&s->dead, true,
						 __ATOMIC_RELAXED);
			continue;
		}
		if (!srv_dead(s) && !moved)
			continue;
		/* A newcomer on this rank (or the map says it lives after a
		 * death heard before it): a fresh conn, ids to learn. Only a
		 * dead rank is taken, so the server this client knew there
		 * is dead even if its death was not heard yet: it leaves the
		 * map first, so that no call is routed to it meanwhile. */
		if (!srv_dead(s)) {
			__atomic_store_n(&s->dead, true, __ATOMIC_RELAXED);
			failover(c);
		}
		/* What was meant for it ends as its death (a pull moves to a
		 * live holder, a copy no longer counts) rather than reach the
		 * newcomer, which holds none of it yet; parts routed to it
		 * later by an older map are told apart by gen (op.c). */
		emb__conn_fail_waiting(s, EMB_ENODEAD);
		emb__rconn_lost(s, EMB_ENODEAD);
		if (s->conn) {
			struct emb_conn *conn = s->conn;

			s->conn = NULL;
			s->state = SRV_DOWN;
			emb_conn_destroy(conn);
		}
		if (moved) {
			snprintf(s->host, sizeof(s->host), "%s", na->host);
			s->port = na->port;
		}
		s->state = SRV_DOWN;
		s->retry_ms = 0;
		s->backoff_ms = 0;
		s->revived = true;
		s->rdma_refused = false;
		if (!s->lim.max_ids)
			for (uint32_t j = 0; j < c->nsrv; j++)
				if (c->srv[j].lim.max_ids) {
					s->lim = c->srv[j].lim;
					break;
				}
		__atomic_store_n(&s->dead, false, __ATOMIC_RELAXED);
		a->revive[i] = true;
		revived++;
	}
	pthread_mutex_lock(&c->map_mu);
	/* The newcomers' incarnations begin with the map that has them, so
	 * a call routed by the old map never reaches them (op.c). */
	for (uint32_t i = 0; i < c->nsrv; i++)
		if (a->revive[i])
			__atomic_add_fetch(&c->srv[i].gen, 1, __ATOMIC_RELAXED);
	*c->cmap = a->m;
	c->map_epoch = a->m.epoch;
	/* Deaths heard since the map was made still count, and make its
	 * fills guesses again. */
	remove_dead(c);
	c->map_guessed = c->cmap->epoch != a->m.epoch;
	regroup(c);
	pthread_mutex_unlock(&c->map_mu);
	wake_delayed(c);
	emb_log(EMB_LOG_INFO, "map epoch %llu from %s%s",
		(unsigned long long)a->m.epoch,
		c->node && emb_node_coord(c->node) ? "etcd" : "the scheduler",
		revived ? ": a newcomer took a dead server's place" : "");
	free(a);
	close_dead(c);
}

int emb__client_adopt_map(struct emb_client *c, const struct emb_cmap *m,
			  const struct emb_wire_node_addr *srv, uint32_t n)
{
	struct adopt *a =
	    malloc(sizeof(*a) + n * (sizeof(a->srv[0]) + sizeof(bool)));
	int rc;

	if (!a)
		return -ENOMEM;
	a->c = c;
	a->m = *m;
	a->n = n;
	a->revive = (bool *)(void *)(a->srv + n);
	memset(a->revive, 0, n * sizeof(bool));
	memcpy(a->srv, srv, n * sizeof(a->srv[0]));
	rc = emb_transport_exec(c->tr, adopt_run, a);
	if (rc)
		free(a);
	return rc;
}

/*
 * Loop thread: a replicated map drops the servers declared dead, before
 * their calls fail, so that pulls find the new primaries.
 */
static void failover(struct emb_client *c)
{
	uint64_t epoch;
	uint32_t lost;

	if (!c->cmap)
		return;
	pthread_mutex_lock(&c->map_mu);
	epoch = c->cmap->epoch;
	remove_dead(c);
	if (c->cmap->epoch != epoch) {
		c->map_guessed = true;
		regroup(c);
	}
	lost = emb_cmap_lost_slots(c->cmap);
	pthread_mutex_unlock(&c->map_mu);
	if (c->cmap->epoch == epoch)
		return;
	if (lost)
		emb_log(EMB_LOG_ERROR,
			"map epoch %llu: %u slot%s lost every copy; their "
			"calls fail",
			(unsigned long long)c->cmap->epoch, lost,
			lost == 1 ? "" : "s");
	else
		emb_log(EMB_LOG_WARN,
			"map epoch %llu: dead servers' slots are served by "
			"their backups",
			(unsigned long long)c->cmap->epoch);
}

/* Loop thread: fails the conns of every server declared dead. */
static void close_dead(void *arg)
{
	struct emb_client *c = arg;

	failover(c);
	for (uint32_t i = 0; i < c->nsrv; i++) {
		if (!srv_dead(&c->srv[i]))
			continue;
		emb__conn_fail_waiting(&c->srv[i], EMB_ENODEAD);
		/* READs in flight there fall back to a PULL, which moves. */
		emb__rconn_lost(&c->srv[i], EMB_ENODEAD);
		if (c->srv[i].conn)
			emb_conn_close(c->srv[i].conn, EMB_ENODEAD);
	}
}

int emb__client_server_dead(struct emb_client *c, uint32_t server)
{
	if (server >= c->nsrv)
		return -EINVAL;
	__atomic_store_n(&c->srv[server].dead, true, __ATOMIC_RELAXED);
	return emb_transport_exec(c->tr, close_dead, c);
}

int emb_client_map(struct emb_client *c, struct emb_client_map *dst)
{
	struct emb_client_map m = {.epoch = 1, .replicas = 1}, *out = &m;

	out->nservers = c->nsrv;
	if (c->cmap) {
		pthread_mutex_lock(&c->map_mu);
		out->epoch = c->cmap->epoch;
		out->replicas = c->cmap->replicas;
		out->lost_slots = emb_cmap_lost_slots(c->cmap);
		pthread_mutex_unlock(&c->map_mu);
	}
	return emb__err(emb__stats_copy(dst, &m, sizeof(m), "emb_client_map"));
}

int emb_client_slot_filling(struct emb_client *c, uint32_t slot)
{
	int r = -1;

	if (!c || slot >= EMB_NSLOTS || !c->cmap)
		return -1;
	pthread_mutex_lock(&c->map_mu);
	if (c->cmap->fill[slot] != EMB_CMAP_NONE)
		r = c->cmap->fill[slot];
	pthread_mutex_unlock(&c->map_mu);
	return r;
}

static int slot_holders(struct emb_client *c, uint32_t slot, uint32_t *out,
			uint32_t cap)
{
	uint32_t n = 0;

	if (!c || slot >= EMB_NSLOTS || (cap && !out))
		return EMB_EBADARG;
	if (!c->cmap) {
		if (cap)
			out[0] = c->slot_map[slot];
		return 1;
	}
	pthread_mutex_lock(&c->map_mu);
	for (uint32_t i = 0; i < c->cmap->replicas; i++) {
		uint16_t h = c->cmap->slot[slot][i];

		if (h == EMB_CMAP_NONE)
			break;
		if (n < cap)
			out[n] = h;
		n++;
	}
	pthread_mutex_unlock(&c->map_mu);
	return (int)n;
}

int emb_client_slot_holders(struct emb_client *c, uint32_t slot, uint32_t *out,
			    uint32_t cap)
{
	return emb__client_err(c, slot_holders(c, slot, out, cap));
}

bool emb_client_server_removed(const struct emb_client *c, uint32_t server)
{
	return c->cmap && server < c->nsrv && srv_dead(&c->srv[server]);
}

uint32_t emb_client_server_of(const struct emb_client *c, uint64_t id)
{
	/* A failover rewrites the map on the network thread, under map_mu;
	 * the lock is the client's own state, not what the caller sees. */
	pthread_mutex_t *mu = (pthread_mutex_t *)&c->map_mu;
	uint32_t r;

	pthread_mutex_lock(mu);
	r = c->slot_map[emb_id_slot(id)];
	pthread_mutex_unlock(mu);
	return r;
}

