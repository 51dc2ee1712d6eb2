/*
 * src/server/tables.h - the server's tables for in-process users: dump
 * sessions (dump.c), recovery fills (fill.c), checkpoints and the metrics
 * collector hold tables through these calls, which tables.c (the table
 * registry) implements; none of them goes through server.c. Any thread.
 */
#ifndef EMB_SERVER_TABLES_H
#define EMB_SERVER_TABLES_H

#include <stdint.h>

#include "proto/wire_msg.h"

struct emb_server;
struct emb_table;

/*
 * A table held by an in-process user (dump sessions, checkpoints): t stays
 * valid, even through a DROP_TABLE, until emb_server_table_release().
 */
struct emb_server_table {
	struct emb_table *t;	   /* the store table */
	struct emb_wire_spec spec; /* as created */
	uint32_t id;		   /* >= 1 */
	void *ref;		   /* the registry entry held */
};

/* Any thread: writes up to cap table ids, returns how many tables exist. */
uint32_t emb_server_table_ids(struct emb_server *s, uint32_t *ids,
			      uint32_t cap);
/* Any thread: 0 and *out, or EMB_ENOTABLE. */
int emb_server_table_acquire(struct emb_server *s, uint32_t id,
			     struct emb_server_table *out);
void emb_server_table_release(struct emb_server_table *st); /* NULL: no-op */
/*
 * Any thread: creates a table as CREATE_TABLE does, or finds an identical
 * one; the server's own (a checkpoint load), so the table, made without a
 * policy, takes the first CREATE's. 0 and *id, or EMB_ETABLEEXISTS and
 * the errors of emb_table_create().
 */
int emb_server_table_create(struct emb_server *s,
			    const struct emb_wire_spec *spec, uint32_t *id);

/* Any thread: the STATS counters of table id. 0, or EMB_ENOTABLE. */
int emb_server_table_stats(struct emb_server *s, uint32_t id,
			   struct emb_wire_stats *out);

#endif
