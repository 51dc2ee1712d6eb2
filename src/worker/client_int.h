/*
 * src/worker/client_int.h - what client.c lets worker/cluster.c do to a
 * client: install the scheduler's slot map and membership, and fail the
 * connection of a server the scheduler declared dead; and what it tells
 * worker/cached.c about a table. Not installed.
 */
#ifndef EMB_WORKER_CLIENT_INT_H
#define EMB_WORKER_CLIENT_INT_H

#include <stdbool.h>
#include <stdint.h>

struct emb_client;
struct emb_client_table;
struct emb_node;
struct emb_wire_frame;
struct emb_client_opts;

/*
 * Right after emb_client_create(), before any other call: routes slots by
 * slot_map (EMB_NSLOTS server indexes, copied) instead of contiguous
 * ranges, and takes ownership of node (destroyed with the client). 0, or
 * -EINVAL if an entry is not a server index (nothing changes then).
 */
int emb__client_set_cluster(struct emb_client *c, const uint16_t *slot_map,
			    struct emb_node *node);

/*
 * As emb__client_set_cluster() without a node: replicas r (1 = none) and,
 * with r > 1, removed[nservers] (NULL: none) the servers the map dropped,
 * which the client never asks again. For observers (emb_client_from_sched).
 */
int emb__client_set_map(struct emb_client *c, const uint16_t *slot_map,
			uint32_t r, const bool *removed);

/*
 * emb_client_create() that makes no connection to the servers flagged in
 * removed[] (one per server of opts->servers; NULL: none): they were
 * declared dead, their calls fail with EMB_ENODEAD, and the map set next
 * must remove them too.
 */
int emb__client_create_live(const struct emb_client_opts *opts,
			    const bool *removed, struct emb_client **out);

/* The node installed above, or NULL. */
struct emb_cmap;
struct emb_wire_node_addr;

/*
 * A scheduler's replicated map (cluster/map.h) in place of the one
 * emb__client_set_map() computed: backups, fills, its epoch, which
 * replicated writes carry from now on. Before the client is shared.
 * 0, or -EINVAL (not replicated, another shape).
 */
int emb__client_set_cmap(struct emb_client *c, const struct emb_cmap *m);

/*
 * Any thread (the node agent's): route by the scheduler's newer map m,
 * with the servers' addresses srv[0..n) by rank, from the client's loop.
 * An older map than the one held is ignored. 0, or -ENOMEM.
 */
int emb__client_adopt_map(struct emb_client *c, const struct emb_cmap *m,
			  const struct emb_wire_node_addr *srv, uint32_t n);

struct emb_node *emb__client_node(const struct emb_client *c);

/*
 * Any thread: server is dead. Its calls in flight fail with EMB_ENODEAD,
 * and so do later ones. 0, or -EINVAL (no such server), -ENOMEM.
 */
int emb__client_server_dead(struct emb_client *c, uint32_t server);

/*
 * Sends opcode (no payload, table id 0) to every server at once and waits,
 * then hands each server's response frame to fn in server order; the frame
 * is valid during the call only. 0, the first error of a server or of fn,
 * or -ENOMEM. For worker/admin.c.
 */
int emb__client_admin(struct emb_client *c, uint8_t opcode,
		      int (*fn)(void *arg, uint32_t server,
				const struct emb_wire_frame *f),
		      void *arg);

/* The table's enum emb_mode as this client last set it (ASYNC until then). */
uint32_t emb__client_table_mode(const struct emb_client_table *t);

/* Applies EMB_LOG_LEVEL, if set, to the process's log level. */
void emb__client_env_log_level(void);

#endif
