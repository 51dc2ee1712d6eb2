/*
 * src/server/sync.c - synchronous and bounded-staleness training.
 *
 * Synchronous: for step s every worker sends this server its gradients
 * (possibly none) and flags its last part with STEP_END. Parts are copied,
 * scaled by 1/workers, into a buffer per rank; when the last worker's
 * STEP_END arrives, the buffers are concatenated in rank order and pushed
 * as one batch (the store sums duplicate ids), so every id gets one update
 * with the average gradient, in an order that does not depend on arrival.
 * Each worker's STEP_END part is acknowledged only then, which is what
 * makes its next pull see step s applied.
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

struct rank_buf {
	uint64_t *ids;		/* gathered ids */
	float *grads;		/* gathered gradients / workers */
	uint32_t n;		/* ids gathered */
	uint32_t cap;		/* room in ids (and cap * dim in grads) */
	struct emb_req *waiter; /* its STEP_END part, held */
};

struct emb_sync {
	pthread_mutex_t lock;  /* guards everything below */
	uint32_t dim;	       /* floats per row */
	uint32_t mode;	       /* enum emb_mode */
	uint32_t workers;      /* SYNC: ranks per step */
	uint32_t staleness;    /* STALE: K */
	uint64_t newest;       /* STALE: newest step seen */
	uint64_t discarded;    /* rows dropped as stale */
	bool gathering;	       /* SYNC: some rank sent part of step */
	uint64_t step;	       /* SYNC: the step being gathered */
	uint32_t nended;       /* SYNC: ranks done with step */
	struct rank_buf *bufs; /* SYNC: workers entries */
	emb_sync_ack_fn ack;   /* acknowledges held parts */
	void *arg;	       /* for ack */
};

int emb__sync_create(uint32_t dim, emb_sync_ack_fn ack, void *arg,
		     struct emb_sync **out)
{
	struct emb_sync *y = calloc(1, sizeof(*y));

	if (!y)
		return -ENOMEM;
	pthread_mutex_init(&y->lock, NULL);
	y->dim = dim;
	y->mode = EMB_MODE_ASYNC;
	y->ack = ack;
	y->arg = arg;
	*out = y;
	return 0;
}

static void free_bufs(struct emb_sync *y)
{
	for (uint32_t r = 0; y->bufs && r < y->workers; r++) {
		free(y->bufs[r].ids);
		free(y->bufs[r].grads);
	}
	free(y->bufs);
	y->bufs = NULL;
}

void emb__sync_abort(struct emb_sync *y)
{
	for (;;) {
		struct emb_req *req = NULL;

		pthread_mutex_lock(&y->lock);
		for (uint32_t r = 0; y->bufs && r < y->workers && !req; r++) {
			req = y->bufs[r].waiter;
			y->bufs[r].waiter = NULL;
		}
		if (!req) {
			for (uint32_t r = 0; y->bufs && r < y->workers; r++)
				y->bufs[r].n = 0;
			y->nended = 0;
			y->gathering = false;
		}
		pthread_mutex_unlock(&y->lock);
		if (!req)
			return;
		y->ack(y->arg, req, EMB_ECLOSED);
	}
}

void emb__sync_destroy(struct emb_sync *y)
{
	if (!y)
		return;
	emb__sync_abort(y);
	free_bufs(y);
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
	free_bufs(y);
	y->bufs = bufs;
	y->mode = mode;
	y->workers = mode == EMB_MODE_SYNC ? workers : 0;
	y->staleness = staleness;
	y->newest = 0;
	y->nended = 0;
out:
	pthread_mutex_unlock(&y->lock);
	return rc;
}

static int append(struct emb_sync *y, struct rank_buf *b,
		  const struct emb_wire_push_req *p)
{
	const float scale = 1.0f / (float)y->workers;
	size_t dim = y->dim;

	if (b->n + p->n > b->cap) {
		uint32_t cap = b->cap ? b->cap : 1024;
		uint64_t *ids;
		float *grads;

		while (cap < b->n + p->n)
			cap *= 2;
		ids = realloc(b->ids, cap * sizeof(*ids));
		if (!ids)
			return -ENOMEM;
		b->ids = ids;
		grads = realloc(b->grads, cap * dim * sizeof(*grads));
		if (!grads)
			return -ENOMEM;
		b->grads = grads;
		b->cap = cap;
	}
	memcpy(b->ids + b->n, p->ids, p->n * sizeof(*p->ids));
	for (size_t i = 0; i < (size_t)p->n * dim; i++)
		b->grads[b->n * dim + i] = p->grads[i] * scale;
	b->n += p->n;
	return 0;
}

/* Applies the gathered step; called with the lock held. */
static int apply_step(struct emb_sync *y, struct emb_table *t)
{
	size_t dim = y->dim, total = 0, at = 0;
	uint64_t *ids;
	float *grads;
	int rc;

	for (uint32_t r = 0; r < y->workers; r++)
		total += y->bufs[r].n;
	if (total == 0)
		return 0;
	if (total > UINT32_MAX)
		return -E2BIG;
	ids = malloc(total * sizeof(*ids));
	grads = malloc(total * dim * sizeof(*grads));
	if (!ids || !grads) {
		free(ids);
		free(grads);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < y->workers; r++) {
		struct rank_buf *b = &y->bufs[r];

		memcpy(ids + at, b->ids, b->n * sizeof(*ids));
		memcpy(grads + at * dim, b->grads, b->n * dim * sizeof(*grads));
		at += b->n;
	}
	rc = emb_table_push(t, ids, (uint32_t)total, grads);
	free(ids);
	free(grads);
	return rc;
}

static int push_sync(struct emb_sync *y, struct emb_table *t,
		     const struct emb_wire_push_req *p, struct emb_req *req)
{
	struct emb_req *done[256], **waiters = done;
	uint32_t nw = 0;
	struct rank_buf *b;
	int rc;

	pthread_mutex_lock(&y->lock);
	if (p->rank >= y->workers) {
		rc = EMB_EBADARG;
		goto unlock;
	}
	if (!y->gathering) {
		y->gathering = true;
		y->step = p->step;
	}
	b = &y->bufs[p->rank];
	if (p->step != y->step || b->waiter) {
		emb_log(EMB_LOG_WARN,
			"sync push from rank %u for step %llu while gathering "
			"step %llu%s",
			p->rank, (unsigned long long)p->step,
			(unsigned long long)y->step,
			b->waiter ? " (rank already done)" : "");
		rc = EMB_EBADARG;
		goto unlock;
	}
	rc = append(y, b, p);
	if (rc || !p->step_end)
		goto unlock;
	b->waiter = req;
	if (++y->nended < y->workers) {
		rc = 1;
		goto unlock;
	}
	/* The last worker's part: apply, then release every waiter. */
	rc = apply_step(y, t);
	if (rc)
		emb_log(EMB_LOG_ERROR, "sync step %llu not applied: %s",
			(unsigned long long)y->step, emb_strerror(rc));
	if (y->workers > 256)
		waiters = malloc(y->workers * sizeof(*waiters));
	for (uint32_t r = 0; r < y->workers; r++) {
		if (waiters && y->bufs[r].waiter != req)
			waiters[nw++] = y->bufs[r].waiter;
		else if (y->bufs[r].waiter != req)
			y->ack(y->arg, y->bufs[r].waiter, -ENOMEM);
		y->bufs[r].waiter = NULL;
		y->bufs[r].n = 0;
	}
	y->nended = 0;
	y->gathering = false;
	pthread_mutex_unlock(&y->lock);
	for (uint32_t k = 0; k < nw; k++)
		y->ack(y->arg, waiters[k], rc);
	if (waiters != done)
		free(waiters);
	return rc;
unlock:
	pthread_mutex_unlock(&y->lock);
	return rc;
}

int emb__sync_push(struct emb_sync *y, struct emb_table *t,
		   const struct emb_wire_push_req *p, struct emb_req *req)
{
	uint32_t mode;

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
	if (mode == EMB_MODE_SYNC)
		return push_sync(y, t, p, req);
	return emb_table_push(t, p->ids, p->n, p->grads);
}

uint64_t emb__sync_discarded(struct emb_sync *y)
{
	uint64_t n;

	pthread_mutex_lock(&y->lock);
	n = y->discarded;
	pthread_mutex_unlock(&y->lock);
	return n;
}
