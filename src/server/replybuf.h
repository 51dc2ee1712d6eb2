/*
 * src/server/replybuf.h - reply buffers pooled per event loop.
 *
 * A PULL reply's rows (or its reply context with the row pointers) must
 * outlive the request: they stay with the transport until the reply's
 * completion fires. Taking that memory from malloc put an allocation on
 * every PULL; a loop instead keeps the buffers of completed replies and
 * hands them to its next requests. A pool is used by its loop's thread
 * only (requests run on their connection's loop, and the transport fires a
 * reply's completion there too, or in the thread destroying the stopped
 * transport), so it takes no lock.
 *
 * Bound: a pool keeps at most EMB_RBUF_KEEP idle buffers of at most
 * EMB_RBUF_KEEP_BYTES together; more are freed as they come back, so only
 * replies bigger than that allocate each time. Sizes are powers of two.
 */
#ifndef EMB_SERVER_REPLYBUF_H
#define EMB_SERVER_REPLYBUF_H

#include <stddef.h>
#include <stdint.h>

#define EMB_RBUF_KEEP	    8u		/* idle buffers a loop keeps */
#define EMB_RBUF_KEEP_BYTES (64u << 20) /* their bytes at most */

struct emb__rbuf;

struct emb__rbuf_pool {
	struct emb__rbuf *idle; /* buffers to reuse, a stack */
	uint32_t nidle;		/* entries in idle */
	size_t idle_bytes;	/* their capacities summed, bytes */
};

/*
 * At least bytes of memory (16-byte aligned) from pool p, or from malloc
 * when p is NULL; NULL when memory is out. Give it back with
 * emb__rbuf_put(). Thread of p's loop only.
 */
void *emb__rbuf_get(struct emb__rbuf_pool *p, size_t bytes);
/* Returns mem (from emb__rbuf_get; NULL is fine) to its pool. */
void emb__rbuf_put(void *mem);
/* Frees p's idle buffers; every buffer must be back. */
void emb__rbuf_pool_fini(struct emb__rbuf_pool *p);

#endif
