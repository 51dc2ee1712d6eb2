/*
 * src/server/replybuf.c - reply buffers pooled per event loop
 * (replybuf.h). Each pool is touched by one loop's thread only.
 */
#include "server/replybuf.h"

#include <stdlib.h>

struct emb__rbuf {
	struct emb__rbuf *next;	     /* in its pool's idle stack */
	struct emb__rbuf_pool *pool; /* where it goes back; NULL = free it */
	size_t cap;		     /* bytes of data */
	_Alignas(16) unsigned char data[];
};

#define RBUF_MIN 4096u /* smallest buffer: a few rows */

static struct emb__rbuf *of(void *mem)
{
	return (struct emb__rbuf *)(void *)((unsigned char *)mem -
					    offsetof(struct emb__rbuf, data));
}

static void unlink_idle(struct emb__rbuf_pool *p, struct emb__rbuf **link)
{
	struct emb__rbuf *b = *link;

	*link = b->next;
	p->nidle--;
	p->idle_bytes -= b->cap;
}

void *emb__rbuf_get(struct emb__rbuf_pool *p, size_t bytes)
{
	struct emb__rbuf *b, **link, **best = NULL, **least = NULL;
	size_t cap = RBUF_MIN;

	if (p) {
		/* The smallest idle buffer that fits, so that a small reply
		 * leaves the big buffers to big ones. */
		for (link = &p->idle; *link; link = &(*link)->next) {
			if ((*link)->cap >= bytes &&
			    (!best || (*link)->cap < (*best)->cap))
				best = link;
			if (!least || (*link)->cap < (*least)->cap)
				least = link;
		}
		if (best) {
			b = *best;
			unlink_idle(p, best);
			return b->data;
		}
		/* None fits: the smallest idle one goes, so that the pool's
		 * sizes follow the loop's replies. Sizes are powers of two,
		 * so this settles after a few replies. */
		if (least) {
			b = *least;
			unlink_idle(p, least);
			free(b);
		}
	}
	while (cap < bytes)
		cap *= 2;
	b = malloc(sizeof(*b) + cap);
	if (!b)
		return NULL;
	b->pool = p;
	b->cap = cap;
	return b->data;
}

void emb__rbuf_put(void *mem)
{
	struct emb__rbuf *b;
	struct emb__rbuf_pool *p;

	if (!mem)
		return;
	b = of(mem);
	p = b->pool;
	if (!p || p->nidle >= EMB_RBUF_KEEP ||
	    p->idle_bytes + b->cap > EMB_RBUF_KEEP_BYTES) {
		free(b);
		return;
	}
	b->next = p->idle;
	p->idle = b;
	p->nidle++;
	p->idle_bytes += b->cap;
}

void emb__rbuf_pool_fini(struct emb__rbuf_pool *p)
{
	while (p->idle) {
		struct emb__rbuf *b = p->idle;

		p->idle = b->next;
		free(b);
	}
	p->nidle = 0;
	p->idle_bytes = 0;
}
