/*
 * src/cluster/sched_state.h - the scheduler's state file: what a scheduler
 * restarted at the same address needs to carry a running job on (ranks
 * and addresses, who died and who finished, the replicated map, the fill
 * under way). docs/cluster.md, "When the scheduler restarts".
 *
 * The scheduler writes the file whole at each change that matters (a new
 * map epoch, the cluster forming, a worker finishing) to PATH.tmp and
 * renames it over PATH, so a reader sees the old file or the new one,
 * never a mix. The file guards against the scheduler process dying, not
 * the machine: it is not fsynced (a map epoch that a power cut loses is
 * one the nodes never acted on for long). Pure functions, any thread.
 *
 * File layout, little-endian:
 *   OFFSET  SIZE   MEANING
 *   0       8      magic "EMBSCHD\0"
 *   8       4      version, 2 (1 is read too: offset 68 is then 0 and node
 *                  flags have bits 0 and 1 only)
 *   12      4      cluster state: 2 ready, 3 finishing (1 forming is
 *                  never written)
 *   16      8      cluster id of the run that made the job, not 0
 *   24      4      server_num, 1..EMB_WIRE_SERVERS_MAX
 *   28      4      worker_num, 1..EMB_WIRE_WORKERS_MAX
 *   32      4      replicas, 1..EMB_WIRE_REPLICAS_MAX
 *   36      4      ndead: entries in the dead list
 *   40      4      rank being filled, or 0xffffffff: none
 *   44      4      first slot of the chunk being filled
 *   48      4      slots in that chunk
 *   52      4      failed streams of that fill so far
 *   56      8      map epoch the chunk's fill began with
 *   64      4      cmap_len: bytes of the replicated map, 0: none
 *   68      4      source rank of the move (drain or join) the chunk
 *                  being filled belongs to, plus 1; 0: the fill is a
 *                  recovery's, or none
 *   72      272*N  nodes, N = server_num + worker_num, servers first:
 *     0     4        role: 0 never registered, 2 server, 3 worker
 *     4     4        flags: bit 0 declared dead, bit 1 finished, bit 2
 *                      server being drained, bit 3 server being given its
 *                      share (joining), bit 4 server drained and gone
 *     8     2        port (servers)
 *     10    2        host_len, 0..255 (servers: 1..255)
 *     12    4        pid, for logs
 *     16    256      host, host_len bytes then NUL padding
 *   ...     8*ndead  the dead list in order of death: role u32, rank u32
 *   ...     cl       the replicated map, emb_cmap_encode()
 *   ...     pad      0 to 8 bytes of 0 up to a multiple of 8
 *   end-8   8      emb_seal(0, total length, every byte before it)
 */
#ifndef EMB_CLUSTER_SCHED_STATE_H
#define EMB_CLUSTER_SCHED_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/map.h"
#include "proto/wire_cluster.h"

#define EMB_SCHED_STATE_VERSION 2u
#define EMB_SCHED_STATE_NO_FILL UINT32_MAX

/* One node's place, as the state file keeps it. */
struct emb_sched_state_node {
	uint32_t role; /* 0: never registered */
	bool dead;     /* declared dead */
	bool finished; /* worker FINISH / server acknowledged */
	bool draining; /* server: asked to drain, its slots still moving */
	bool joining;  /* server: being given its share of the slots */
	bool left;     /* server: drained, then gone (dead too) */
	uint32_t pid;  /* as registered, for logs */
	struct emb_wire_node_addr addr; /* servers: where workers connect */
};

struct emb_sched_state {
	uint32_t state;	     /* EMB_CLUSTER_READY or _FINISHING */
	uint64_t cluster_id; /* not 0 */
	uint32_t server_num; /* servers in the job */
	uint32_t worker_num; /* workers in the job */
	uint32_t replicas;   /* copies of each slot, >= 1 */
	struct emb_sched_state_node *nodes; /* server_num + worker_num */
	struct emb_wire_node_ref *dead;	    /* in order of death */
	uint32_t ndead;			    /* entries in dead */
	struct emb_cmap *cmap;		    /* replicated map, or NULL */
	uint32_t fill_rank;  /* EMB_SCHED_STATE_NO_FILL: no fill */
	uint32_t fill_first; /* chunk under way: first slot */
	uint32_t fill_n;     /* its slots */
	uint32_t fill_fails; /* streams of this fill that failed */
	uint64_t fill_epoch; /* epoch the chunk began with */
	bool move;	     /* the chunk is a move's (drain or join), */
	uint32_t move_from;  /* from this rank; not: a recovery's */
};

/*
 * Writes st to path (through path.tmp and a rename); st and its arrays
 * are borrowed. 0, or EMB_EBADARG (counts out of range), -ENOMEM,
 * -ENAMETOOLONG, or the negative errno of a failed open, write or rename.
 */
int emb_sched_state_save(const char *path, const struct emb_sched_state *st);

/*
 * Reads path into *st, checking every field; st's arrays are allocated
 * (emb_sched_state_free()). 0, or -ENOENT (no file: a first start),
 * EMB_ESCHEDSTATE (not a state file, damaged, or a version this one does
 * not read), -ENOMEM, another negative errno of the read.
 */
int emb_sched_state_load(const char *path, struct emb_sched_state *st);

/* Frees what load allocated; st itself is the caller's. */
void emb_sched_state_free(struct emb_sched_state *st);

#endif
