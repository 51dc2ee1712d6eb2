/*
 * src/worker/respbuf.h - the client's pool of response buffers, registered
 * with its loop's transport so that RDMA responses land in them directly
 * (no bounce copy, docs/rdma.md). Not installed.
 *
 * Threads: get and put from any thread (one mutex, taken once per op, not
 * per row); register and destroy on the loop thread, or after it has gone.
 */
#ifndef EMB_WORKER_RESPBUF_H
#define EMB_WORKER_RESPBUF_H

#include <stdbool.h>
#include <stddef.h>

struct emb_transport;
struct emb__respbufs;

/* One buffer: cap bytes at mem, page aligned; mr once registered. */
struct emb__respbuf {
	struct emb__respbuf *next;  /* idle list */
	char *mem;		    /* cap bytes */
	size_t cap;		    /* a power of two, >= 64 KiB */
	struct emb_mr *mr;	    /* NULL until registered (or on TCP) */
	struct emb__respbufs *pool; /* owner */
	struct emb__respbuf *lent_next; /* pool's list of lent buffers */
	struct emb__respbuf *lent_prev;
};

/*
 * A pool over tr (borrowed; outlives the pool). reg: register buffers
 * (the transport moves data by RDMA). 0 and *out, or -ENOMEM.
 */
int emb__respbufs_create(struct emb_transport *tr, bool reg,
			 struct emb__respbufs **out);
/*
 * After the loop thread is gone and the conns are destroyed (nothing can
 * WRITE any more), before tr is destroyed: deregisters every buffer and
 * frees the idle ones. Buffers still lent (an async op not yet waited for)
 * are freed by their put, the last of which frees the pool. NULL: no-op.
 */
void emb__respbufs_destroy(struct emb__respbufs *p);

/* Any thread: a buffer of at least len bytes, or NULL (-ENOMEM). */
struct emb__respbuf *emb__respbuf_get(struct emb__respbufs *p, size_t len);

/*
 * Loop thread: registers b if the pool registers and it is not yet; a
 * failure leaves it unregistered (the transport then bounces, still
 * correct).
 */
void emb__respbuf_reg(struct emb__respbuf *b);

/*
 * Any thread: gives b back. reuse false (a call on it failed in the
 * transport, so a late RDMA WRITE might still come): it is deregistered
 * on the loop thread and freed, never handed out again. NULL: no-op.
 */
void emb__respbuf_put(struct emb__respbuf *b, bool reuse);

#endif
