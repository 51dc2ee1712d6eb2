/*
 * src/server/replica.h - replication control for a server of a replicated
 * job (docs/replication.md, "Recovery"): each newer cluster map the node
 * agent takes becomes the view the server checks writes against, and a
 * fill this server is the source of starts streaming. A map change runs
 * agent -> replica -> server, and a write with a newer epoch than the
 * view's asks the agent for the map (server -> replica -> agent).
 *
 * create and destroy are for the server's controlling thread; the rest
 * runs on the agent's, a loop's and the fill's threads.
 */
#ifndef EMB_SERVER_REPLICA_H
#define EMB_SERVER_REPLICA_H

struct emb_node;
struct emb_replica;
struct emb_server;

/*
 * Wires server s to node agent n (both borrowed; they must outlive r):
 * takes n's map now if it has one, and each newer one from then on. 0 and
 * *out, or -ENOMEM.
 */
int emb_replica_create(struct emb_server *s, struct emb_node *n,
		       struct emb_replica **out);

/*
 * Unhooks r from the agent's maps and from the server, then frees it.
 * Call it with the server stopped (emb_server_stop(): no fill runs and no
 * loop asks for a map) and before the agent is destroyed. NULL is a no-op.
 */
void emb_replica_destroy(struct emb_replica *r);

#endif
