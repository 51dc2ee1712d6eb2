/*
 * src/cluster/map.h - the replicated cluster map: for each of the EMB_NSLOTS
 * slots, the servers that hold it (primary first, then its backups), and
 * the epoch that numbers the map's versions. The scheduler keeps one, the
 * clients compute the same one from the deaths the scheduler announces,
 * and a coordinator may store it (emb_cmap_encode()). docs/replication.md
 * has the rules; this file is only the arithmetic.
 *
 * A map is a plain value (about 64 KiB, so keep it on the heap); every
 * function here is pure: it reads its inputs and writes only its outputs,
 * so any thread may call it on maps it owns.
 *
 * Encoded map (emb_cmap_encode), little-endian:
 *   OFFSET  SIZE    MEANING
 *   0       4       magic "EMBM" = 0x4d424d45
 *   4       4       version, 1
 *   8       8       epoch, >= 1
 *   16      4       nservers, 1..EMB_CMAP_SERVERS_MAX
 *   20      4       replicas wanted per slot, 1..EMB_CMAP_REPLICAS_MAX
 *   24      2*R*N   for each slot in order, R u16 server ranks, primary
 *                   first; EMB_CMAP_NONE after the last live one
 *   size = 24 + 2 * replicas * EMB_NSLOTS
 */
#ifndef EMB_CLUSTER_MAP_H
#define EMB_CLUSTER_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hash.h"

#define EMB_CMAP_REPLICAS_MAX 8u     /* copies of a slot, primary included */
#define EMB_CMAP_SERVERS_MAX  4096u  /* ranks fit a u16, NONE excluded */
#define EMB_CMAP_NONE	      0xffffu /* no server in this place */
#define EMB_CMAP_HDR_SIZE     24u

struct emb_cmap {
	uint64_t epoch;	    /* 1 for the first map, +1 per change */
	uint32_t nservers;  /* ranks 0..nservers-1 ever in the cluster */
	uint32_t replicas;  /* copies wanted per slot, <= nservers */
	/* Holders of each slot: primary first, then backups in the order
	 * they take over; EMB_CMAP_NONE pads after the last one. */
	uint16_t slot[EMB_NSLOTS][EMB_CMAP_REPLICAS_MAX];
};

/* Bytes emb_cmap_encode() writes for a map with this many replicas. */
static inline size_t emb_cmap_encoded_size(uint32_t replicas)
{
	return EMB_CMAP_HDR_SIZE + 2u * (size_t)replicas * EMB_NSLOTS;
}

/*
 * The first map of a cluster of nservers with replicas copies of each
 * slot, epoch 1. Slot s's primary is its home rank h = s * nservers /
 * EMB_NSLOTS (the contiguous ranges a plain server list gives, so R = 1 is
 * today's map), and its backups are h + 1, h + 2, ... modulo nservers: a
 * dead server's slots all fall to its successor, which is the server a
 * reader expects. 0, or -EINVAL (nservers 0 or over the maximum, replicas
 * 0, over EMB_CMAP_REPLICAS_MAX or over nservers).
 */
int emb_cmap_init(struct emb_cmap *m, uint32_t nservers, uint32_t replicas);

/* Primary of slot (< EMB_NSLOTS), or EMB_CMAP_NONE when no holder is left. */
static inline uint16_t emb_cmap_primary(const struct emb_cmap *m,
					uint32_t slot)
{
	return m->slot[slot][0];
}

/* Live holders of slot, 0..replicas. */
uint32_t emb_cmap_holders(const struct emb_cmap *m, uint32_t slot);

/* True when rank holds slot, as primary or backup. */
bool emb_cmap_holds(const struct emb_cmap *m, uint32_t slot, uint32_t rank);

/*
 * Failover: the map without server rank (dead, or cut off). Every slot
 * drops rank from its holders; where rank was primary, the first backup
 * left becomes primary. The epoch goes up by one when anything changed.
 * *out may be in. Returns the number of slots left with no holder (their
 * rows are lost: the job cannot go on), or -EINVAL for a rank >= nservers.
 */
int emb_cmap_remove(const struct emb_cmap *in, uint32_t rank,
		    struct emb_cmap *out);

/*
 * A server joining (a new rank < nservers, or a dead one restarted): it
 * becomes the last backup of every slot with fewer than replicas holders
 * whose holders do not include it. The epoch goes up by one when anything
 * changed. The caller streams those slots to it before it counts for acks
 * (docs/replication.md). Returns the number of slots it was added to, or
 * -EINVAL for a rank >= nservers.
 */
int emb_cmap_add(const struct emb_cmap *in, uint32_t rank,
		 struct emb_cmap *out);

/*
 * Slots whose primary is rank, after emb_cmap_remove()/add() changed
 * things: a coordinator's log line. Counts slots, 0..EMB_NSLOTS.
 */
uint32_t emb_cmap_primary_slots(const struct emb_cmap *m, uint32_t rank);

/* Slots with no holder left. */
uint32_t emb_cmap_lost_slots(const struct emb_cmap *m);

/*
 * Writes the encoded map (layout above) to buf[0..cap). Returns its size,
 * or -ENOSPC when cap is too small.
 */
int64_t emb_cmap_encode(const struct emb_cmap *m, void *buf, size_t cap);

/*
 * Decodes buf[0..len) into *out, checking every field: magic and version,
 * epoch >= 1, counts in range, the length, every rank < nservers or NONE,
 * no rank twice in a slot, NONE only after the live ones. 0, or
 * EMB_EBADFRAME (*out is then unspecified).
 */
int emb_cmap_decode(const void *buf, size_t len, struct emb_cmap *out);

#endif
