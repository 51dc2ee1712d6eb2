/*
 * src/worker/oppool.c - ops (struct emb_async): handed out for a call,
 * waited for, and given back with their scratch, mutex and condition
 * variable for the next call, so that a warmed-up client allocates
 * nothing per batch. An op may be waited for after emb_client_destroy():
 * the pool then goes with the last op given back.
 *
 * Threads: any (the pool has a mutex); an op itself belongs to its caller
 * before it is posted and after it is done, and to the loop in between.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/dedup.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"

#define OPS_IDLE_MAX  64u	    /* idle ops kept for reuse, at most */
#define OP_KEEP_BYTES (64ull << 20) /* op scratch beyond this is not kept */

/*
 * A buffer of at least need bytes (64-byte aligned) in place of old, of
 * *cap bytes, whose contents are dropped: old itself while it is large
 * enough. Grows by half again, so that batches of slowly rising size do
 * not allocate each time. NULL (old kept): -ENOMEM.
 */
void *emb__op_grow(void *old, size_t *cap, size_t need)
{
	void *q;

	if (old && need <= *cap)
		return old;
	need += need / 2;
	need = (need + 4095) & ~(size_t)4095;
	q = aligned_alloc(64, need);
	if (!q)
		return NULL;
	free(old);
	*cap = need;
	return q;
}

/* The same for op->mem. 0 or -ENOMEM. */
int emb__op_mem(struct emb_async *op, size_t need)
{
	void *m = emb__op_grow(op->mem, &op->mem_cap, need);

	if (!m)
		return -ENOMEM;
	op->mem = m;
	return 0;
}

/* Frees what an op keeps between uses. */
static void op_scratch_free(struct emb_async *op)
{
	free(op->mem);
	free(op->parts);
	free(op->resp_mem);
	free(op->cnt);
	free(op->os_mem);
	emb_dedup_destroy(op->dedup);
	op->os_mem = NULL;
	op->os_mem_cap = 0;
	op->mem = op->parts = op->resp_mem = op->cnt = NULL;
	op->dedup = NULL;
	op->mem_cap = op->parts_cap = op->resp_mem_cap = op->cnt_cap = 0;
	op->dedup_max = 0;
}

static void op_destroy(struct emb_async *op)
{
	op_scratch_free(op);
	pthread_cond_destroy(&op->cv);
	pthread_mutex_destroy(&op->mu);
	free(op);
}

static void pool_free(struct op_pool *pl)
{
	pthread_mutex_destroy(&pl->mu);
	free(pl);
}

/* An op for a call: a reused one, else a new one. NULL: -ENOMEM. */
struct emb_async *emb__op_new(struct emb_client *c, enum op_kind kind)
{
	struct op_pool *pl = c->ops;
	struct emb_async *op;

	pthread_mutex_lock(&pl->mu);
	op = pl->idle[kind != OP_PULL];
	if (op) {
		pl->idle[kind != OP_PULL] = op->pool_next;
		pl->nidle--;
	}
	pl->lent++;
	pthread_mutex_unlock(&pl->mu);
	if (!op) {
		op = calloc(1, sizeof(*op));
		if (!op) {
			pthread_mutex_lock(&pl->mu);
			pl->lent--;
			pthread_mutex_unlock(&pl->mu);
			return NULL;
		}
		pthread_mutex_init(&op->mu, NULL);
		pthread_cond_init(&op->cv, NULL);
		op->pool = pl;
	}
	/* Everything of the last call but the kept scratch. */
	op->c = c;
	op->kind = kind;
	op->dim = op->state = op->n = 0;
	op->out = NULL;
	op->found = NULL;
	op->pu = op->first = op->next = NULL;
	op->count = 0;
	op->nparts = op->pending = 0;
	op->status = 0;
	op->deadline_ms = 0;
	op->tids = NULL;
	op->tbl = NULL;
	op->stride = 0;
	op->rbuf = NULL;
	op->tainted = false;
	op->done = false;
	return op;
}

/* Gives op back for reuse (or frees it). NULL: no-op. */
void emb__op_free(struct emb_async *op)
{
	struct op_pool *pl;
	bool keep, last;

	if (!op)
		return;
	/* Copies a map change added: the op's own, not kept. */
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *e = op->parts[k].rep.ext;

		op->parts[k].rep.ext = NULL;
		while (e) {
			struct part *next = e->rep.enext;

			free(e);
			e = next;
		}
	}
	/* Parts a pull's reroute split off, likewise. */
	while (op->split) {
		struct part *next = op->split->rep.enext;

		free(op->split);
		op->split = next;
	}
	pl = op->pool;
	/* A pull holds its table: the user may close it while it runs. */
	if (op->tbl)
		emb__table_unref(op->tbl);
	op->tbl = NULL;
	emb__respbuf_put(op->rbuf, !op->tainted);
	op->rbuf = NULL;
	/* A huge batch's scratch is not held for the next, smaller ones. */
	if (op->mem_cap + op->parts_cap + op->resp_mem_cap + op->os_mem_cap >
	    OP_KEEP_BYTES)
		op_scratch_free(op);
	pthread_mutex_lock(&pl->mu);
	pl->lent--;
	keep = !pl->closed && pl->nidle < OPS_IDLE_MAX;
	if (keep) {
		op->pool_next = pl->idle[op->kind != OP_PULL];
		pl->idle[op->kind != OP_PULL] = op;
		pl->nidle++;
	}
	last = pl->closed && !pl->lent;
	pthread_mutex_unlock(&pl->mu);
	if (!keep)
		op_destroy(op);
	if (last)
		pool_free(pl);
}

/*
 * Client destroy: frees the idle ops, and the pool unless ops are still
 * out (the last of them frees it). NULL: no-op.
 */
void emb__op_pool_close(struct op_pool *pl)
{
	struct emb_async *idle[2];
	bool last;

	if (!pl)
		return;
	pthread_mutex_lock(&pl->mu);
	pl->closed = true;
	idle[0] = pl->idle[0];
	idle[1] = pl->idle[1];
	pl->idle[0] = pl->idle[1] = NULL;
	pl->nidle = 0;
	last = !pl->lent;
	pthread_mutex_unlock(&pl->mu);
	for (int i = 0; i < 2; i++) {
		struct emb_async *op = idle[i];

		while (op) {
			struct emb_async *next = op->pool_next;

			op_destroy(op);
			op = next;
		}
	}
	if (last)
		pool_free(pl);
}

/* Zeroed counts for nkeys servers or groups, and room for as many + 1
 * starts after them, in op->cnt. 0 or -ENOMEM. */
int emb__op_counts(struct emb_async *op, uint32_t nkeys)
{
	size_t bytes = (2 * (size_t)nkeys + 1) * sizeof(uint32_t);
	uint32_t *cnt = emb__op_grow(op->cnt, &op->cnt_cap, bytes);

	if (!cnt)
		return -ENOMEM;
	op->cnt = cnt;
	memset(op->cnt, 0, bytes);
	return 0;
}

/* op->parts with room for nparts, zeroed. 0 or -ENOMEM. */
int emb__op_parts(struct emb_async *op, uint32_t nparts)
{
	size_t bytes = (size_t)(nparts ? nparts : 1) * sizeof(struct part);
	struct part *p = emb__op_grow(op->parts, &op->parts_cap, bytes);

	if (!p)
		return -ENOMEM;
	op->parts = p;
	memset(op->parts, 0, bytes);
	return 0;
}

/*
 * Gives parts whose success carries no payload a buffer for the error
 * message a server may send instead. 0 or -ENOMEM.
 */
int emb__op_err_bufs(struct emb_async *op)
{
	char *r;

	if (!op->nparts)
		return 0;
	r = emb__op_grow(op->resp_mem, &op->resp_mem_cap,
			 (size_t)op->nparts * ERR_CAP);
	if (!r)
		return -ENOMEM;
	op->resp_mem = r;
	for (uint32_t k = 0; k < op->nparts; k++) {
		op->parts[k].req.resp = r + (size_t)k * ERR_CAP;
		op->parts[k].req.resp_cap = ERR_CAP;
	}
	return 0;
}

void emb__push_iovs(struct part *p, const uint64_t *ids, const void *rows,
		    size_t rowb, bool half, const uint32_t *births)
{
	static const uint8_t zeros[8];
	const uint32_t n = p->req.n;
	const size_t len = (size_t)n * rowb;
	int k = 0;

	p->req.iov[k++] =
	    (struct iovec){p->req.prefix, EMB_WIRE_PUSH_PREFIX_SIZE};
	p->req.hdr.flags &= (uint16_t)~EMB_F_BIRTHS;
	p->req.births = n ? births : NULL;
	if (n) {
		p->req.iov[k++] = (struct iovec){(void *)ids, (size_t)n * 8};
		p->req.iov[k++] = (struct iovec){(void *)rows, len};
		if (half && len % 8)
			p->req.iov[k++] =
			    (struct iovec){(void *)zeros, 8 - len % 8};
	}
	p->req.niov = k;
	if (p->req.births)
		emb__births_iovs(p, births);
}

void emb__births_iovs(struct part *p, const uint32_t *births)
{
	static const uint8_t zeros[4];
	const uint32_t n = p->req.n;

	/* The births end the frame (the decoder finds them there). */
	p->req.births = births;
	p->req.hdr.flags |= EMB_F_BIRTHS;
	p->req.iov[p->req.niov++] =
	    (struct iovec){(void *)births, (size_t)n * 4};
	if (n % 2)
		p->req.iov[p->req.niov++] = (struct iovec){(void *)zeros, 4};
}

void emb__op_complete(struct emb_async *op)
{
	struct emb_client *c = op->c;

	/* The op may be waited for after its client is destroyed: keep the
	 * server's text for its error now, while the client exists. */
	op->err_msg[0] = '\0';
	if (op->status < 0) {
		pthread_mutex_lock(&c->err_lock);
		if (c->last_status == op->status)
			snprintf(op->err_msg, sizeof(op->err_msg), "%s",
				 c->last_msg);
		pthread_mutex_unlock(&c->err_lock);
	}
	pthread_mutex_lock(&op->mu);
	op->done = true;
	pthread_cond_broadcast(&op->cv);
	pthread_mutex_unlock(&op->mu);
}

void emb__op_wait_done(struct emb_async *op)
{
	pthread_mutex_lock(&op->mu);
	while (!op->done)
		pthread_cond_wait(&op->cv, &op->mu);
	pthread_mutex_unlock(&op->mu);
}

int emb_async_wait(struct emb_async *op)
{
	int rc;

	if (!op)
		return emb__err(EMB_EBADARG);
	emb__op_wait_done(op);
	rc = op->status;
	if (rc < 0 && op->err_msg[0])
		emb__err_set(rc, "%s", op->err_msg);
	emb__op_free(op);
	return emb__err(rc);
}

bool emb_async_done(struct emb_async *op)
{
	bool d;

	pthread_mutex_lock(&op->mu);
	d = op->done;
	pthread_mutex_unlock(&op->mu);
	return d;
}

