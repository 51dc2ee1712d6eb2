/*
 * src/server/bcheck.h - a backup's birth check (docs/replication.md,
 * "Eviction with replicas", point 4): now and then a replicated server
 * asks the primary of each run of slots it backs for the rows it holds
 * there (LIST_BIRTHS) and removes its own rows that the primary evicted
 * (emb_table_births_prune()). Internal to the server module: replica.c
 * starts and feeds it; it calls nothing in replica.c.
 */
#ifndef EMB_SERVER_BCHECK_H
#define EMB_SERVER_BCHECK_H

#include <stdint.h>

#include "cluster/map.h"
#include "proto/wire_cluster.h"
#include "server/server.h"

#define EMB_BCHECK_PERIOD_MS 10000u /* EMB_BIRTH_CHECK_MS unset */

struct emb__bcheck;

/*
 * Starts the check thread of server s (borrowed, outlives it), whose rank
 * is rank. It runs a round every EMB_BIRTH_CHECK_MS milliseconds (the
 * environment, read once here; EMB_BCHECK_PERIOD_MS when unset, and 0
 * runs none) once emb__bcheck_set_map() gave it a map with replicas. 0
 * and *out, or -ENOMEM, or the negative errno of pthread_create().
 */
int emb__bcheck_start(struct emb_server *s, uint32_t rank,
		      struct emb__bcheck **out);

/*
 * Any thread: the map the next rounds check against, and its servers'
 * addresses by rank, addrs[0..n) (both copied). A round under way with an
 * older map stops before its next removal. 0, or -ENOMEM (the last map
 * stays).
 */
int emb__bcheck_set_map(struct emb__bcheck *b, const struct emb_cmap *m,
			const struct emb_wire_node_addr *addrs, uint32_t n);

/* Wakes the thread, waits for it (a round under way ends after its call
 * in flight) and frees b. NULL is a no-op. */
void emb__bcheck_stop(struct emb__bcheck *b);

/*
 * One round, on the calling thread, against map m as server rank, the
 * primaries reached at addrs[0..n) by rank: for each table of s that
 * numbers its rows, and each slot rank backs in m (a holder, not the
 * primary, not being filled with it, not copied ahead), lists the
 * primary's rows 64 slots at a time and removes the rows it lacks. Adds
 * the rows removed to *removed (may be NULL) and to the server's
 * counters. Goes on past a primary it cannot reach, a table the primary
 * does not have and a bad answer, logging the first at WARN; returns 0,
 * or the first such error (-ECONNREFUSED, EMB_ENOTABLE, EMB_EBADFRAME,
 * -ETIMEDOUT, ...), or -ENOMEM.
 */
int emb__bcheck_round(struct emb_server *s, const struct emb_cmap *m,
		      uint32_t rank, const struct emb_wire_node_addr *addrs,
		      uint32_t n, uint64_t *removed);

#endif
