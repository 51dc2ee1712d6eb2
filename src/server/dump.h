/*
 * src/server/dump.h - the server's DUMP_BEGIN / DUMP_CHUNK / DUMP_END
 * handlers (dump.c), called from handlers.c. One session per
 * conn, owned by the conn and touched only on its loop thread.
 */
#ifndef EMB_SERVER_DUMP_H
#define EMB_SERVER_DUMP_H

#include "proto/wire.h"
#include "server/tables.h"

struct emb_dump_sess;
struct emb_req;

/*
 * Handles one DUMP_* request on the conn whose session pointer is *sess
 * (NULL when none is open): replies or releases req in every case. Returns
 * 0 after a success reply, or the negative status of the error reply.
 */
int emb__server_dump(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f,
		     struct emb_dump_sess **sess);

/* Frees a session (the conn closed); NULL is a no-op. */
void emb__server_dump_free(struct emb_dump_sess *sess);

#endif
