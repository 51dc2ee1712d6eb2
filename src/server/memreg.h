/*
 * src/server/memreg.h - RDMA memory registration ("memreg"; the table
 * registry is tables.c): registers a table's arena extents with every event
 * loop of an RDMA server, so PULL replies leave table memory without a copy.
 *
 * The store reports extents through its extent hook (store.h) from any
 * thread that grows a table. Registration is loop-thread only, so it is
 * posted to each loop; until a loop has run it, replies of that loop copy
 * the rows (correct, slower). Deregistration must finish before the store
 * unmaps an extent, so it waits for every loop: it may only happen on a
 * thread that is no loop's (the server's reaper or its controlling thread),
 * or after the loops have stopped.
 */
#ifndef EMB_SERVER_MEMREG_H
#define EMB_SERVER_MEMREG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct emb_transport;
struct emb_memreg;

/*
 * 0 and *out, or -ENOMEM. loops are borrowed; *stopped (borrowed, read with
 * atomics) turns true once no loop runs any more.
 */
int emb__memreg_create(struct emb_transport *const *loops, uint32_t nloops,
		       const bool *stopped, struct emb_memreg **out);
/* Every extent must have been removed (the table destroyed). NULL: no-op. */
void emb__memreg_destroy(struct emb_memreg *m);

/*
 * Deregisters every region now, on the calling thread: for a server whose
 * loops have stopped, before their transports are destroyed. Extents
 * removed later find nothing left to deregister.
 */
void emb__memreg_release_all(struct emb_memreg *m);

/* The store's extent hook (emb_extent_fn); arg is the memreg. */
int emb__memreg_hook(void *arg, void *addr, size_t len, bool added);

/* Marks the calling thread as running loop tr (NULL: no loop). */
void emb__memreg_set_thread_loop(struct emb_transport *tr);
/* True if the calling thread runs an event loop. */
bool emb__memreg_on_loop(void);

#endif
