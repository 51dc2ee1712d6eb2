/*
 * src/server/slots.h - a replicated server's view of the cluster map, which
 * every write is checked against during a recovery (docs/replication.md,
 * "Recovery"): writes to a chunk being filled wait (EMB_EMOVING), writes
 * routed by a map that lacks a writer since added are refused
 * (EMB_ESTALEMAP), and writes routed by a newer map than the server's wait
 * until it has that map. Refused writes change nothing and are not
 * recorded in the push session windows, so the client sends them again
 * with the same sequence numbers (a push the window shows applied is
 * acknowledged instead: src/server/push.c).
 *
 * A server without a view (every unreplicated one) checks nothing and
 * takes no lock. With one, a write holds the view's read lock from the
 * check until it is applied, and emb__slots_set() takes the write lock:
 * once it returns, no write that passed the old view is still being
 * applied, so a fill may snapshot the rows of a chunk it just fenced.
 */
#ifndef EMB_SERVER_SLOTS_H
#define EMB_SERVER_SLOTS_H

#include <stdint.h>

#include "proto/wire.h"
#include "server/server.h"

struct emb__slots;

/* 0 and *out, or -ENOMEM. */
int emb__slots_create(struct emb__slots **out);
void emb__slots_destroy(struct emb__slots *sl); /* NULL is a no-op */

/* Takes m as the view (see emb_server_set_map()); any thread. */
int emb__slots_set(struct emb__slots *sl, const struct emb_server_map *m);

/* Called (from a loop thread, under the view's read lock: fn must not
 * block or take the view) with an epoch newer than the view's that a
 * write carried, or any epoch while there is no view yet: the host
 * fetches the map. */
void emb__slots_hook(struct emb__slots *sl, void (*fn)(void *, uint64_t),
		     void *arg);

/* Whether a view was set: this server is in a map, whose moves may take
 * slots from it (any thread). */
bool emb__slots_on(struct emb__slots *sl);

/*
 * Before a write of ids[0..n) with header h: 0 or 1 (apply it, then call
 * emb__slots_end() with that value: 1 means the view's read lock is
 * held), EMB_EMOVING or EMB_ESTALEMAP (refuse it; nothing is held). *why
 * gets a message for the refusal.
 */
int emb__slots_begin(struct emb__slots *sl, const struct emb_frame_hdr *h,
		     const uint64_t *ids, uint32_t n, const char **why);
void emb__slots_end(struct emb__slots *sl, int held);

/*
 * A pull of ids[0..n): EMB_ESTALEMAP (*why says why) when the view says
 * this server holds no copy of some id's slot (a move took it elsewhere:
 * its rows here are no longer written to), else 0. Always 0 before a
 * view was set (an unreplicated server).
 */
int emb__slots_read(struct emb__slots *sl, const uint64_t *ids, uint32_t n,
		    const char **why);

/*
 * Erases from t those of ids[0..n) (reordered in place) whose slot this
 * server holds no copy of in its view; the rows a move took elsewhere.
 * Returns how many were present (0 before a view was set), or an error.
 */
struct emb_table;
/* The slots this server neither holds nor is filled with, as a set for
 * emb_table_iter_slot_set() (EMB_NSLOTS / 64 words), under one read of
 * the view; how many (0 before a view was set: an empty set). */
uint32_t emb__slots_unheld(struct emb__slots *sl, uint64_t *set);
int64_t emb__slots_drop(struct emb__slots *sl, struct emb_table *t,
			uint64_t *ids, uint32_t n);

/*
 * In the view: the slots this server holds and is not being given
 * (*held), those a move is copying ahead to it (*warming), and its share
 * once the moves end (*share, struct emb_server_map); all 0 before a view
 * was set. What a copy ahead's first rows size the table's index by
 * (handlers.c, emb_table_reserve()).
 */
void emb__slots_warming(struct emb__slots *sl, uint32_t *held,
			uint32_t *warming, uint32_t *share);

/* Writes refused so far: [0] EMB_EMOVING, [1] EMB_ESTALEMAP. */
void emb__slots_counts(struct emb__slots *sl, uint64_t out[2]);

#endif
