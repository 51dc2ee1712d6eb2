/*
 * src/worker/respbuf.c - registered response buffers for the client, in
 * power-of-two classes from 64 KiB, reused across ops. Registering costs a
 * pinning syscall and a device update per buffer, so it happens once per
 * buffer, not per pull; copying every response out of bounce pages is what
 * it replaces. Threads as respbuf.h says.
 */
#include "worker/respbuf.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/log.h"
#include "transport/transport.h"

#define CLASS_MIN      16u /* 64 KiB */
#define CLASS_MAX      31u /* 2 GiB: above any frame */
#define NCLASS	       (CLASS_MAX - CLASS_MIN + 1)
#define IDLE_MAX_BYTES (256ull << 20) /* kept idle beyond this are freed */

struct emb__respbufs {
	struct emb_transport *tr;	   /* the loop; borrowed */
	bool reg;			   /* register buffers */
	pthread_mutex_t mu;		   /* guards the lists and idle_bytes */
	struct emb__respbuf *idle[NCLASS]; /* per class, most recent first */
	struct emb__respbuf *dead;	   /* could not be released on the
					      loop: freed at destroy */
	size_t idle_bytes;		   /* bytes on the idle lists */
	struct emb__respbuf *lent;	   /* handed out, not yet put back */
	bool closed;			   /* destroyed: puts free */
};

int emb__respbufs_create(struct emb_transport *tr, bool reg,
			 struct emb__respbufs **out)
{
	struct emb__respbufs *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->tr = tr;
	p->reg = reg;
	pthread_mutex_init(&p->mu, NULL);
	*out = p;
	return 0;
}

static void buf_free(struct emb__respbufs *p, struct emb__respbuf *b)
{
	emb_transport_dereg_mem(p->tr, b->mr);
	free(b->mem);
	free(b);
}

static void free_list(struct emb__respbufs *p, struct emb__respbuf *b)
{
	while (b) {
		struct emb__respbuf *next = b->next;

		buf_free(p, b);
		b = next;
	}
}

void emb__respbufs_destroy(struct emb__respbufs *p)
{
	bool last;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->closed = true;
	for (unsigned i = 0; i < NCLASS; i++)
		free_list(p, p->idle[i]);
	free_list(p, p->dead);
	/* The transport goes next: no registration may outlive it. */
	for (struct emb__respbuf *b = p->lent; b; b = b->lent_next) {
		emb_transport_dereg_mem(p->tr, b->mr);
		b->mr = NULL;
	}
	last = !p->lent;
	pthread_mutex_unlock(&p->mu);
	if (last) {
		pthread_mutex_destroy(&p->mu);
		free(p);
	}
}

static void lend(struct emb__respbufs *p, struct emb__respbuf *b)
{
	b->lent_prev = NULL;
	b->lent_next = p->lent;
	if (p->lent)
		p->lent->lent_prev = b;
	p->lent = b;
}

static void unlend(struct emb__respbufs *p, struct emb__respbuf *b)
{
	if (b->lent_prev)
		b->lent_prev->lent_next = b->lent_next;
	else
		p->lent = b->lent_next;
	if (b->lent_next)
		b->lent_next->lent_prev = b->lent_prev;
}

static unsigned class_of(size_t len)
{
	unsigned k = CLASS_MIN;

	while (k < CLASS_MAX && ((size_t)1 << k) < len)
		k++;
	return k;
}

struct emb__respbuf *emb__respbuf_get(struct emb__respbufs *p, size_t len)
{
	unsigned k = class_of(len);
	struct emb__respbuf *b;

	if (len > ((size_t)1 << CLASS_MAX))
		return NULL;
	pthread_mutex_lock(&p->mu);
	b = p->idle[k - CLASS_MIN];
	if (b) {
		p->idle[k - CLASS_MIN] = b->next;
		p->idle_bytes -= b->cap;
		lend(p, b);
	}
	pthread_mutex_unlock(&p->mu);
	if (b)
		return b;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->cap = (size_t)1 << k;
	b->pool = p;
	b->mem = aligned_alloc(4096, b->cap);
	if (!b->mem) {
		free(b);
		return NULL;
	}
	pthread_mutex_lock(&p->mu);
	lend(p, b);
	pthread_mutex_unlock(&p->mu);
	return b;
}

void emb__respbuf_reg(struct emb__respbuf *b)
{
	int rc;

	if (b->mr || !b->pool->reg)
		return;
	rc = emb_transport_reg_mem(b->pool->tr, b->mem, b->cap, &b->mr);
	if (rc) {
		b->mr = NULL;
		emb_log(EMB_LOG_DEBUG,
			"client: registering %zu response bytes: %s; responses are copied",
			b->cap, emb_strerror(rc));
	}
}

static void release_task(void *arg)
{
	struct emb__respbuf *b = arg;

	buf_free(b->pool, b);
}

void emb__respbuf_put(struct emb__respbuf *b, bool reuse)
{
	struct emb__respbufs *p;

	if (!b)
		return;
	p = b->pool;
	pthread_mutex_lock(&p->mu);
	unlend(p, b);
	if (p->closed) {
		/* Its op outlived the client: registration already gone. */
		bool last = !p->lent;

		pthread_mutex_unlock(&p->mu);
		free(b->mem);
		free(b);
		if (last) {
			pthread_mutex_destroy(&p->mu);
			free(p);
		}
		return;
	}
	if (reuse && p->idle_bytes + b->cap <= IDLE_MAX_BYTES) {
		unsigned k = class_of(b->cap) - CLASS_MIN;

		b->next = p->idle[k];
		p->idle[k] = b;
		p->idle_bytes += b->cap;
		pthread_mutex_unlock(&p->mu);
		return;
	}
	pthread_mutex_unlock(&p->mu);
	/* Unregistered memory may go now; a registration only on the loop. */
	if (!b->mr) {
		buf_free(p, b);
		return;
	}
	if (emb_transport_exec(p->tr, release_task, b) == 0)
		return;
	pthread_mutex_lock(&p->mu);
	b->next = p->dead;
	p->dead = b;
	pthread_mutex_unlock(&p->mu);
}
