/*
 * src/server/sync.c - synchronous and bounded-staleness training.
 *
 * Synchronous: for step s every worker sends this server its gradients
 * (possibly none) and flags its last part with STEP_END. Every part is
 * held, request and all, in a list per rank: its ids and gradients stay in
 * the request's own buffer, and the held bytes are charged to the server's
 * memory budget. When the last worker's STEP_END arrives, the parts are
 * concatenated in rank order, scaled by 1/workers, and pushed as one batch
 * (the store sums duplicate ids), so every id gets one update with the
 * average gradient, in an order that does not depend on arrival. Every
 * part is acknowledged only then: a success always means "applied", which
 * is also what makes a worker's next pull see step s. A connection that
 * closes takes its ranks' parts of the step with it (they are answered
 * with EMB_ECLOSED and their memory is released).
 *
 * Bounded staleness: a push whose step is more than K behind the newest
 * step seen is dropped and counted (Paddle's lagged-gradient discard).
 */
#include "server/sync.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/optim.h"
#include "transport/transport.h"

struct part {
	struct part *next;     /* arrival order within its rank */
	struct emb_req *req;   /* held until the step is applied */
	struct emb_conn *conn; /* req's conn: dropped when it closes */
	const uint64_t *ids;   /* n ids, in req's payload */
	const float *grads;    /* n * dim gradients, in req's payload */
	uint32_t n;	       /* ids */
	uint64_t bytes;	       /* charged to the budget */
};

struct rank_buf {
	struct part *head; /* parts of the step being gathered */
	struct part *tail;
	bool ended;	   /* its STEP_END part arrived */
};

struct emb_sync {
	pthread_mutex_t lock;	       /* guards everything below */
	uint32_t dim;		       /* floats per row */
	uint32_t mode;		       /* enum emb_mode */
	uint32_t workers;	       /* SYNC: ranks per step */
	uint32_t staleness;	       /* STALE: K */
	uint64_t newest;	       /* STALE: newest step seen */
	uint64_t discarded;	       /* rows dropped as stale */
	bool gathering;		       /* SYNC: some rank sent part of step */
	uint64_t step;		       /* SYNC: the step being gathered */
	uint32_t nended;	       /* SYNC: ranks done with step */
	struct rank_buf *bufs;	       /* SYNC: workers entries */
	struct emb_mem_budget *budget; /* held bytes charged here, or NULL */
	emb_sync_ack_fn ack;	       /* acknowledges held parts */
	void *arg;		       /* for ack */
};

int emb__sync_create(uint32_t dim, struct emb_mem_budget *budget,
		     emb_sync_ack_fn ack, void *arg, struct emb_sync **out)
{
	struct emb_sync *y = calloc(1, sizeof(*y));

	if (!y)
		return -ENOMEM;
	pthread_mutex_init(&y->lock, NULL);
	y->dim = dim;
	y->mode = EMB_MODE_ASYNC;
	y->budget = budget;
	y->ack = ack;
	y->arg = arg;
	*out = y;
	return 0;
}

/* Charges n held bytes; EMB_EMEMLIMIT if the budget cannot take them. */
static int charge(struct emb_sync *y, uint64_t n)
{
	struct emb_mem_budget *b = y->budget;
	uint64_t used;

	if (!b)
		return 0;
	used = __atomic_add_fetch(&b->used, n, __ATOMIC_RELAXED);
	if (b->limit && used > b->limit) {
		__atomic_fetch_sub(&b->used, n, __ATOMIC_RELAXED);
		return EMB_EMEMLIMIT;
	}
	return 0;
}

static void uncharge(struct emb_sync *y, uint64_t n)
{
	if (y->budget)
		__atomic_fetch_sub(&y->budget->used, n, __ATOMIC_RELAXED);
}

/* Moves rank r's parts to the front of *out; called with the lock held. */
static void take_rank(struct emb_sync *y, uint32_t r, struct part **out)
{
	struct rank_buf *b = &y->bufs[r];

	if (b->tail) {
		b->tail->next = *out;
		*out = b->head;
	}
	b->head = b->tail = NULL;
	if (b->ended)
		y->nended--;
	b->ended = false;
}

/* Called with the lock held: the step is over, whatever became of it. */
static void end_gathering(struct emb_sync *y)
{
	for (uint32_t r = 0; y->bufs && r < y->workers; r++)
		if (y->bufs[r].head)
			return;
	y->gathering = false;
	y->nended = 0;
}

/* Without the lock: answers every part of list with status and frees it. */
static void ack_parts(struct emb_sync *y, struct part *list, int status)
{
	while (list) {
		struct part *pt = list;

		list = pt->next;
		uncharge(y, pt->bytes);
		y->ack(y->arg, pt->req, status);
		free(pt);
	}
}

void emb__sync_abort(struct emb_sync *y)
{
	struct part *list = NULL;

	pthread_mutex_lock(&y->lock);
	for (uint32_t r = 0; y->bufs && r < y->workers; r++)
		take_rank(y, r, &list);
	end_gathering(y);
	pthread_mutex_unlock(&y->lock);
	ack_parts(y, list, EMB_ECLOSED);
}

void emb__sync_drop_conn(struct emb_sync *y, const struct emb_conn *conn)
{
	struct part *list = NULL;

	pthread_mutex_lock(&y->lock);
	for (uint32_t r = 0; y->bufs && r < y->workers; r++) {
		bool mine = false;

		for (struct part *pt = y->bufs[r].head; pt && !mine;
		     pt = pt->next)
			mine = pt->conn == conn;
		/* A rank missing some of its parts cannot count: all go. */
		if (mine)
			take_rank(y, r, &list);
	}
	if (list)
		end_gathering(y);
	pthread_mutex_unlock(&y->lock);
	ack_parts(y, list, EMB_ECLOSED);
}

void emb__sync_destroy(struct emb_sync *y)
{
	if (!y)
		return;
	emb__sync_abort(y);
	free(y->bufs);
	pthread_mutex_destroy(&y->lock);
	free(y);
}

int emb__sync_set_mode(struct emb_sync *y, uint32_t mode, uint32_t workers,
		       uint32_t staleness)
{
	struct rank_buf *bufs = NULL;
	int rc = 0;

	pthread_mutex_lock(&y->lock);
	if (y->mode == mode && y->workers == workers &&
	    y->staleness == staleness)
		goto out;
	if (y->gathering) {
		rc = -EBUSY;
		goto out;
	}
	if (mode == EMB_MODE_SYNC) {
		bufs = calloc(workers, sizeof(*bufs));
		if (!bufs) {
			rc = -ENOMEM;
			goto out;
		}
	}
	free(y->bufs);
	y->bufs = bufs;
	/* Read without the lock by asynchronous pushes. */
	__atomic_store_n(&y->mode, mode, __ATOMIC_RELEASE);
	y->workers = mode == EMB_MODE_SYNC ? workers : 0;
	y->staleness = staleness;
	y->newest = 0;
	y->nended = 0;
out:
	pthread_mutex_unlock(&y->lock);
	return rc;
}

/*
 * Applies the gathered step and moves every part to *done; called with the
 * lock held.
 */
static int apply_step(struct emb_sync *y, struct emb_table *t,
		      struct part **done)
{
	const float scale = 1.0f / (float)y->workers;
	size_t dim = y->dim, total = 0, at = 0;
	uint64_t *ids = NULL;
	float *grads = NULL;
	int rc = 0;

	for (uint32_t r = 0; r < y->workers; r++)
		for (struct part *pt = y->bufs[r].head; pt; pt = pt->next)
			total += pt->n;
	if (total > UINT32_MAX) {
		rc = -E2BIG;
		goto out;
	}
	if (total) {
		ids = malloc(total * sizeof(*ids));
		grads = malloc(total * dim * sizeof(*grads));
		if (!ids || !grads) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t r = 0; r < y->workers; r++) {
		for (struct part *pt = y->bufs[r].head; pt; pt = pt->next) {
			memcpy(ids + at, pt->ids, pt->n * sizeof(*ids));
			for (size_t i = 0; i < (size_t)pt->n * dim; i++)
				grads[at * dim + i] = pt->grads[i] * scale;
			at += pt->n;
		}
	}
	if (total)
		rc = emb_table_push(t, ids, (uint32_t)total, grads);
out:
	free(ids);
	free(grads);
	for (uint32_t r = 0; r < y->workers; r++)
		take_rank(y, r, done);
	y->nended = 0;
	y->gathering = false;
	return rc;
}

static int push_sync(struct emb_sync *y, struct emb_table *t,
		     const struct emb_wire_push_req *p, struct emb_req *req)
{
	struct part *pt, *done = NULL, *mine = NULL;
	struct rank_buf *b;
	int rc;

	/* Checked before the part is held: one NaN would spoil the whole
	 * step, and every row it touches for good. (Applied pushes are
	 * checked by the store itself.) */
	if (!emb_floats_finite(p->grads, (size_t)p->n * emb_table_dim(t)))
		return EMB_ENONFINITE;
	pt = calloc(1, sizeof(*pt));
	if (!pt)
		return -ENOMEM;
	pt->req = req;
	pt->conn = emb_req_conn(req);
	pt->ids = p->ids;
	pt->grads = p->grads;
	pt->n = p->n;
	pt->bytes = sizeof(*pt) + EMB_WIRE_HDR_SIZE + req->hdr.payload_len;

	pthread_mutex_lock(&y->lock);
	if (p->rank >= y->workers) {
		rc = EMB_EBADARG;
		goto unlock;
	}
	b = &y->bufs[p->rank];
	if ((y->gathering && p->step != y->step) || b->ended) {
		emb_log(EMB_LOG_WARN,
			"sync push from rank %u for step %llu while gathering "
			"step %llu%s",
			p->rank, (unsigned long long)p->step,
			(unsigned long long)y->step,
			b->ended ? " (rank already done)" : "");
		rc = EMB_EBADARG;
		goto unlock;
	}
	rc = charge(y, pt->bytes);
	if (rc)
		goto unlock;
	if (!y->gathering) {
		y->gathering = true;
		y->step = p->step;
	}
	if (b->tail)
		b->tail->next = pt;
	else
		b->head = pt;
	b->tail = pt;
	if (p->step_end) {
		b->ended = true;
		y->nended++;
	}
	if (y->nended < y->workers) {
		pthread_mutex_unlock(&y->lock);
		return 1;
	}
	/* The last worker's part: apply, then answer every part. */
	rc = apply_step(y, t, &done);
	if (rc)
		emb_log(EMB_LOG_ERROR, "sync step %llu not applied: %s",
			(unsigned long long)y->step, emb_strerror(rc));
	pthread_mutex_unlock(&y->lock);
	/* This request is answered by the caller, the others through ack. */
	for (struct part **pp = &done; *pp; pp = &(*pp)->next) {
		if ((*pp)->req == req) {
			mine = *pp;
			*pp = mine->next;
			break;
		}
	}
	if (mine) {
		uncharge(y, mine->bytes);
		free(mine);
	}
	ack_parts(y, done, rc);
	return rc;
unlock:
	pthread_mutex_unlock(&y->lock);
	free(pt);
	return rc;
}

/* The store's flags of a push request. */
static uint32_t push_flags(const struct emb_wire_push_req *p)
{
	return p->admitted ? EMB_PUSH_ADMITTED : 0;
}

/* An asynchronous or bounded-staleness push, births and all. */
static int push_now(struct emb_table *t, const struct emb_wire_push_req *p)
{
	if (p->births)
		return emb_table_push_births(t, p->ids, p->n, p->grads,
					     p->births, push_flags(p));
	return emb_table_push_flags(t, p->ids, p->n, p->grads, push_flags(p));
}

int emb__sync_push(struct emb_sync *y, struct emb_table *t,
		   const struct emb_wire_push_req *p, struct emb_req *req)
{
	uint32_t mode = __atomic_load_n(&y->mode, __ATOMIC_ACQUIRE);

	/* Asynchronous (the default) needs nothing of y: no lock that every
	 * loop's pushes to this table would share. */
	if (mode == EMB_MODE_ASYNC)
		return push_now(t, p);
	pthread_mutex_lock(&y->lock);
	mode = y->mode;
	if (mode == EMB_MODE_STALE) {
		if (p->step > y->newest)
			y->newest = p->step;
		if (p->step + y->staleness < y->newest) {
			y->discarded += p->n;
			pthread_mutex_unlock(&y->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&y->lock);
	/* Decided on the mode read under the lock with the part's queueing
	 * in push_sync(): a mode set in between is SET_MODE's -EBUSY race,
	 * as for a single PUSH. */
	/* A held part keeps pointers into its frame, and half-precision
	 * gradients were widened into a buffer that lives for this call. */
	if (mode == EMB_MODE_SYNC && (p->half || p->births))
		return EMB_EBADFORMAT;
	if (mode == EMB_MODE_SYNC)
		return req ? push_sync(y, t, p, req) : EMB_ENOBUNDLE;
	return push_now(t, p);
}

uint64_t emb__sync_discarded(struct emb_sync *y)
{
	uint64_t n;

	pthread_mutex_lock(&y->lock);
	n = y->discarded;
	pthread_mutex_unlock(&y->lock);
	return n;
}
