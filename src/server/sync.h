/*
 * src/server/sync.h - a table's training mode on the server: asynchronous
 * (every push applied on arrival), synchronous (a step's pushes from all
 * workers averaged and applied once) or bounded staleness (pushes too far
 * behind the newest step discarded). Thread-safe: pushes of one table arrive
 * on any loop thread; a mutex per table guards the step being gathered.
 */
#ifndef EMB_SERVER_SYNC_H
#define EMB_SERVER_SYNC_H

#include <stdint.h>

#include "proto/wire_msg.h"
#include "store/store.h"

struct emb_sync;
struct emb_req;
struct emb_conn;

/*
 * Acknowledges a held STEP_END push once its step is applied (status 0) or
 * abandoned (negative). Called from whichever thread completed the step,
 * with no sync lock held; the callee must reach req's loop thread itself.
 */
typedef void (*emb_sync_ack_fn)(void *arg, struct emb_req *req, int status);

/*
 * 0 and *out (asynchronous mode), or -ENOMEM. Held pushes are charged to
 * budget (borrowed, may be NULL) while they wait for their step.
 */
int emb__sync_create(uint32_t dim, struct emb_mem_budget *budget,
		     emb_sync_ack_fn ack, void *arg, struct emb_sync **out);
/* Held pushes are acknowledged with EMB_ECLOSED. NULL is a no-op. */
void emb__sync_destroy(struct emb_sync *y);

/*
 * Drops the step being gathered and acknowledges its held pushes with
 * EMB_ECLOSED now (a server shutting down does this while its connections
 * still exist).
 */
void emb__sync_abort(struct emb_sync *y);

/*
 * conn is closing: the step loses every part of each rank that has a part
 * from conn; they are acknowledged with EMB_ECLOSED and their memory is
 * released. Those ranks may send their step again.
 */
void emb__sync_drop_conn(struct emb_sync *y, const struct emb_conn *conn);

/*
 * Sets the mode (values as SET_MODE carries them, already validated).
 * Setting the current mode again is a no-op. -EBUSY while a synchronous
 * step is half gathered, -ENOMEM.
 */
int emb__sync_set_mode(struct emb_sync *y, uint32_t mode, uint32_t workers,
		       uint32_t staleness);

/*
 * Applies a decoded PUSH to t under the mode; p's pointers must stay valid
 * as long as req is held. Returns 0 when the caller should acknowledge now
 * (applied, or discarded as stale), 1 when req is held and will be
 * acknowledged through the ack function once its step is applied (every
 * part of a synchronous step is held), or a negative code to reply with
 * (EMB_EBADARG for a rank or step that does not fit the step being
 * gathered, EMB_EMEMLIMIT when the budget cannot hold the part, or the
 * store's error). req NULL: a push that cannot be held (a PUSH_MANY's
 * sub-request, answered in its bundle's reply) is refused with
 * EMB_ENOBUNDLE, untouched, when the table is synchronous.
 */
int emb__sync_push(struct emb_sync *y, struct emb_table *t,
		   const struct emb_wire_push_req *p, struct emb_req *req);

/* Pushed rows discarded as too stale, since create. */
uint64_t emb__sync_discarded(struct emb_sync *y);

#endif
