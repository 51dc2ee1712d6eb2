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
 *   version 2 on (written when some slot is being filled):
 *   24+2*R*N 2*N    for each slot in order, the u16 rank of the server
 *                   being filled with it, or EMB_CMAP_NONE
 *   version 3 on (written when some slot is copied ahead of a move):
 *   24+2*R*N+2*N 2*N for each slot in order, the u16 rank of the server
 *                   its rows are copied to ahead of a move, or
 *                   EMB_CMAP_NONE
 *   version 4 (written once any fill has begun, where smaller than 5):
 *   24+2*R*N+4*N 6*N for each slot in order, the u32 epoch of the map
 *                   that began its latest fill (0: none) and the u16
 *                   rank it filled (EMB_CMAP_NONE: none)
 *   size = 24 + 2 * replicas * EMB_NSLOTS (version 1), plus
 *          2 * EMB_NSLOTS (version 2), plus 2 * EMB_NSLOTS (version 3),
 *          plus 6 * EMB_NSLOTS (version 4)
 *   version 5 (the same tables as 4, listed; written where smaller):
 *   24+2*R*N 2      kf, then kf entries of u16 slot, u16 filling rank
 *           2       kw, then kw entries of u16 slot, u16 copy-ahead rank
 *           2       kb, then kb entries of u16 slot, u16 rank filled,
 *                   u32 epoch the fill began (> 0)
 *                   slots strictly ascending in each list
 *   size = 24 + 2 * replicas * EMB_NSLOTS + 6 + 4 kf + 4 kw + 8 kb
 *   versions 6 and 7 (4 and 5 with the rank that streamed each fill,
 *   written once a fill has a known source, whichever is smaller):
 *   version 6: as 4, but 8*N: u32 epoch, u16 rank filled, u16 rank that
 *                   streamed it (EMB_CMAP_NONE: not known)
 *   version 7: as 5, but kb entries of u16 slot, u16 rank filled, u16
 *                   rank that streamed it, u32 epoch (10 bytes)
 *
 * Recovery (docs/replication.md, "Recovery"): a server that joins a
 * running job takes the place of a dead rank and is first a *filling*
 * holder of a chunk of slots (fill[]): clients write to it, nobody reads
 * from it, and it is never promoted. Once every row of the chunk reached
 * it, emb_cmap_fill_done() makes it the chunk's last backup; when no slot
 * is under-replicated, emb_cmap_rebalance() hands it a fair share of
 * primaries. Each step is one epoch.
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
	/* Server being filled with each slot's rows, or EMB_CMAP_NONE: it
	 * takes the slot's writes but is no holder (not read, not
	 * promoted) until emb_cmap_fill_done(). */
	uint16_t fill[EMB_NSLOTS];
	/* Server a move copies each slot's rows to ahead of its fence, or
	 * EMB_CMAP_NONE: no writer, no holder, nothing fenced; its rows land
	 * there apart, and the fenced stream that follows
	 * (emb_cmap_move_begin()) sends only the rows written since. */
	uint16_t warm[EMB_NSLOTS];
	/* The epoch of the map that began the slot's latest fill (or a
	 * move's fenced stream), 0 for none yet, and the server it filled:
	 * kept after the fill ends. That server's copy of the slot was
	 * rebuilt from the source's stream then, so a copy of a write routed
	 * to it by an earlier map is void there: the stream carried the
	 * write if the source applied it first, and the source's refusal
	 * sends it a fresh copy otherwise (docs/replication.md, "A fill
	 * begun again"). Servers' views take it as the epoch the slot's
	 * writers grew, which a view that skipped epochs cannot see. */
	uint32_t began[EMB_NSLOTS];
	uint16_t began_to[EMB_NSLOTS];
	/* ...and the server that streamed that fill (the slot's primary
	 * when it began), EMB_CMAP_NONE when not known (a map of version 4
	 * or 5). Only its copy of a write routed before the fill tells
	 * whether the stream carried the write: a client whose map is older
	 * than a rebalance would take another holder for it
	 * (docs/replication.md, "Whose refusal counts"). */
	uint16_t began_from[EMB_NSLOTS];
};

/* Whether rank's copy of slot in m was rebuilt by a fill begun after
 * epoch e (a copy routed to it by e is void there). */
static inline bool emb_cmap_refilled(const struct emb_cmap *m, uint32_t slot,
				     uint32_t rank, uint64_t e)
{
	return m->began_to[slot] == rank && (uint64_t)m->began[slot] > e;
}

/* Bytes emb_cmap_encode() writes for a map with this many replicas. */
static inline size_t emb_cmap_encoded_size(uint32_t replicas)
{
	return EMB_CMAP_HDR_SIZE + 2u * (size_t)replicas * EMB_NSLOTS;
}

/* Bytes emb_cmap_encode() writes for m: once a fill has begun, the
 * smaller of versions 4 and 5; else version 3 when a slot is copied ahead
 * of a move, 2 when one is being filled, else version 1
 * (emb_cmap_encoded_size()). */
size_t emb_cmap_size(const struct emb_cmap *m);

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
 * left becomes primary. A fill of a slot that rank held or was filled
 * with ends too (the filling server may have missed rows: it is filled
 * again from a live holder later, never promoted). The epoch goes up by
 * one when anything changed.
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
 * Recovery, step 1: the next chunk rank should be filled with. Finds the
 * first slot from *first on (wrapping around) that has a holder, fewer
 * than replicas of them, not rank among them and no fill under way, and
 * extends it over the following slots alike with the same primary (the
 * source that streams the chunk), up to max slots. Returns the chunk's
 * length and its first slot in *first, or 0 when rank is needed nowhere
 * (or -EINVAL: rank >= nservers, max 0, *first >= EMB_NSLOTS).
 */
int emb_cmap_fill_next(const struct emb_cmap *m, uint32_t rank, uint32_t max,
		       uint32_t *first);

/*
 * Recovery, step 2: rank becomes the filling server of the slots
 * [first, first + n) that emb_cmap_fill_next() would pick (others are
 * left alone). The epoch goes up by one when anything changed. Returns
 * the slots marked, or -EINVAL (rank >= nservers, a range past the end).
 */
int emb_cmap_fill_begin(const struct emb_cmap *in, uint32_t rank,
			uint32_t first, uint32_t n, struct emb_cmap *out);

/*
 * Recovery, step 3: every row of the slots [first, first + n) that rank is
 * being filled with reached it: it becomes their last backup. The epoch
 * goes up by one when anything changed. Returns the slots it now holds,
 * or -EINVAL.
 */
int emb_cmap_fill_done(const struct emb_cmap *in, uint32_t rank,
		       uint32_t first, uint32_t n, struct emb_cmap *out);

/*
 * A fill of [first, first + n) by rank that cannot finish (its source
 * died, the stream failed): the slots drop it, and a later
 * emb_cmap_fill_next() picks them again. The epoch goes up by one when
 * anything changed. Returns the slots dropped, or -EINVAL.
 */
int emb_cmap_fill_abort(const struct emb_cmap *in, uint32_t rank,
			uint32_t first, uint32_t n, struct emb_cmap *out);

/*
 * Moving slots between live servers (docs/replication.md, "Moving slots"):
 * a join gives a new server a share of slots, a drain empties one. A move
 * of a chunk reuses the recovery's fill: to is its filling server while
 * the chunk's primary streams it (emb_cmap_move_begin()), then takes
 * from's place among its holders (emb_cmap_move_done()), so a slot never
 * has fewer than its holders' copies and writers only grow at the begin.
 */

/*
 * A join, next chunk: slots the most loaded server *from holds and to does
 * not, with one primary, from *first on (wrapping), at most max, and
 * neither giving to more than its share (the copies over the servers
 * holding any, to included) nor taking *from below it. Returns its length,
 * *first and *from; 0 when to has its share; -EINVAL, -ENOMEM.
 */
int emb_cmap_join_next(const struct emb_cmap *m, uint32_t to, uint32_t max,
		       uint32_t *first, uint32_t *from);

/*
 * A drain, next chunk: slots from holds, with one primary, from *first on
 * (wrapping), up to max, all going to *to, the least loaded server with
 * ok[rank] that does not hold them. Returns its length, *first and *to; 0
 * when from holds nothing; -ENOSPC when from still holds slots that no
 * server allowed by ok can take (every one holds them already); -EINVAL,
 * -ENOMEM.
 */
int emb_cmap_drain_next(const struct emb_cmap *m, uint32_t from,
			const bool *ok, uint32_t max, uint32_t *first,
			uint32_t *to);

/*
 * A move, step 0, the copy ahead: the slots of [first, first + n) that
 * could move from `from` to `to` (as emb_cmap_move_begin() picks them) are
 * copied to `to` while writes go on, unfenced (warm[]). The epoch goes up
 * by one when anything changed. Returns the slots marked, or -EINVAL.
 */
int emb_cmap_warm_begin(const struct emb_cmap *in, uint32_t from, uint32_t to,
			uint32_t first, uint32_t n, struct emb_cmap *out);

/* Ends every copy ahead (one that failed, or a move given up); the epoch
 * goes up by one when anything changed. Returns the slots cleared. */
int emb_cmap_warm_end(const struct emb_cmap *in, struct emb_cmap *out);

/*
 * A move, step 1: to becomes the filling server of the slots of [first,
 * first + n) that from holds, to does not and that have no fill under way
 * (others are left alone), and every copy ahead ends. The epoch goes up
 * by one when anything changed. Returns the slots marked, or -EINVAL.
 */
int emb_cmap_move_begin(const struct emb_cmap *in, uint32_t from, uint32_t to,
			uint32_t first, uint32_t n, struct emb_cmap *out);

/*
 * A move, step 2: every row of the slots of [first, first + n) that to is
 * filled with reached it; it takes from's place among their holders (a
 * last backup where from is gone). The epoch goes up by one when anything
 * changed. Returns the slots to now holds, or -EINVAL.
 */
int emb_cmap_move_done(const struct emb_cmap *in, uint32_t from, uint32_t to,
		       uint32_t first, uint32_t n, struct emb_cmap *out);

/*
 * Recovery, last step: primaries spread over the live servers by
 * reordering each slot's holders (no holder is added or removed, so no
 * row moves): a backup takes a slot's first place while it has at least
 * two primaries fewer than the slot's primary. Afterwards the live
 * servers' primary counts differ by at most one wherever the holders
 * allow it. The epoch goes up by one when anything changed. Returns the
 * slots whose primary changed, or -ENOMEM.
 */
int emb_cmap_rebalance(const struct emb_cmap *in, struct emb_cmap *out);

/*
 * The servers a write to slot must reach: its holders, then its filling
 * server if any. Writes out[0..n) and returns n (<= replicas + 1).
 */
uint32_t emb_cmap_writers(const struct emb_cmap *m, uint32_t slot,
			  uint16_t out[EMB_CMAP_REPLICAS_MAX + 1]);

/*
 * The slots whose rows no server may evict in m: those with more than one
 * writer (backups, a fill's or a move's target) or a copy ahead under way.
 * One server's eviction there would leave the copies different, or a copy
 * ahead to be streamed again whole (docs/replication.md, "Eviction with
 * one copy"). Sets bit k % 64 of set[k / 64] for each such slot k, clears
 * the others (EMB_NSLOTS / 64 words); returns how many are set. With one
 * copy of each slot and no move, none is.
 */
uint32_t emb_cmap_evict_hold(const struct emb_cmap *m, uint64_t *set);

/*
 * The slots whose rows server rank may not evict in m. With one copy of
 * each slot, emb_cmap_evict_hold()'s. With replicas, a slot's primary
 * evicts alone, by the pulls only it sees, and its backups carry its
 * evictions out by their check of the slot (docs/replication.md,
 * "Eviction with replicas"): rank holds every slot it is not the primary
 * of, and those being copied ahead, whose stream would have to go again
 * whole. Sets set as emb_cmap_evict_hold() does; returns how many.
 */
uint32_t emb_cmap_evict_hold_rank(const struct emb_cmap *m, uint32_t rank,
				  uint64_t *set);

/*
 * The slots rank became the primary of from prev to m, having held them
 * in prev as a backup (a failover, a drain or a move that promoted it):
 * the rows there are numbered by births its old primary gave, some of
 * which it never saw (docs/replication.md, "Eviction with replicas").
 * Sets their bits in set (EMB_NSLOTS / 64 words, the others cleared) and
 * returns how many.
 */
uint32_t emb_cmap_promoted(const struct emb_cmap *prev,
			   const struct emb_cmap *m, uint32_t rank,
			   uint64_t *set);

/*
 * What a server checks writes against (docs/replication.md): the state of
 * each slot in a server's view, flags of these. The one list of them: the
 * server's view (struct emb_server_map, src/server/slots.c) holds these.
 */
enum emb_cmap_view_flag {
	EMB_CMAP_VIEW_MINE = 0x1,    /* rank holds it or is filled with it:
					writes land */
	EMB_CMAP_VIEW_FENCED = 0x2,  /* a fill from (rank is primary) or to
					rank is under way: writes wait
					(EMB_EMOVING) */
	EMB_CMAP_VIEW_FILLING = 0x4, /* rank is being filled with it: the
					fill's rows (EMB_F_FILL) land */
	EMB_CMAP_VIEW_WARMING = 0x8, /* rank is its copy ahead of a move:
					the copy's rows (EMB_F_FILL |
					EMB_F_WARM) land, and stay */
};

/*
 * Server rank's view of m: flags[EMB_NSLOTS] (EMB_CMAP_VIEW_*), and
 * grew[EMB_NSLOTS], the epoch each slot's writers last grew at: m's epoch
 * where m has a writer prev lacked (or there is no prev), else
 * prev_grew's (grew may be prev_grew), and no earlier than m->began[s].
 * Writes routed before grew[s] miss a writer (or were routed by a fill
 * begun again since) and are refused.
 */
void emb_cmap_view(const struct emb_cmap *m, const struct emb_cmap *prev,
		   const uint32_t *prev_grew, uint32_t rank, uint8_t *flags,
		   uint32_t *grew);

/*
 * The first chunk rank is the source of: slots with a fill under way whose
 * primary is rank, the run of them from there with the same filling
 * server (*to). Returns its length and *first, or 0 when there is none.
 */
uint32_t emb_cmap_fill_source(const struct emb_cmap *m, uint32_t rank,
			      uint32_t *first, uint32_t *to);

/* As emb_cmap_fill_source() for the copies ahead of moves (warm[]). */
uint32_t emb_cmap_warm_source(const struct emb_cmap *m, uint32_t rank,
			      uint32_t *first, uint32_t *to);

/* The first run of slots being filled with one same server: its length,
 * *first and *rank (the server); 0 when no slot is being filled. */
uint32_t emb_cmap_fill_run(const struct emb_cmap *m, uint32_t *first,
			   uint32_t *rank);

/* Whether rank holds any slot of m or is being filled with one: a
 * server the map still counts (one that holds nothing has left it). */
bool emb_cmap_in_map(const struct emb_cmap *m, uint32_t rank);

/*
 * The slots each server holds once the moves under way end: every copy
 * (replicas x EMB_NSLOTS) over the servers the map counts
 * (emb_cmap_in_map()) and those a copy ahead goes to, rounded up; 0 for
 * none. A server being drained counts until it holds nothing.
 */
uint32_t emb_cmap_share(const struct emb_cmap *m);

/* Slots rank holds as [0] primary, [1] backup, [2] filling. */
void emb_cmap_rank_slots(const struct emb_cmap *m, uint32_t rank,
			 uint32_t out[3]);

/*
 * Slots whose primary is rank, after emb_cmap_remove()/add() changed
 * things: a coordinator's log line. Counts slots, 0..EMB_NSLOTS.
 */
uint32_t emb_cmap_primary_slots(const struct emb_cmap *m, uint32_t rank);

/* Slots with no holder left. */
uint32_t emb_cmap_lost_slots(const struct emb_cmap *m);

/*
 * Writes the encoded map (layout above) to buf[0..cap). Returns its size
 * (emb_cmap_size()), or -ENOSPC when cap is too small.
 */
int64_t emb_cmap_encode(const struct emb_cmap *m, void *buf, size_t cap);

/*
 * Decodes buf[0..len) into *out, checking every field: magic and version
 * (1 or 2), epoch >= 1, counts in range, the length, every rank <
 * nservers or NONE, no rank twice in a slot, NONE only after the live
 * ones, a filling server < nservers and not a holder of its slot. 0, or
 * EMB_EBADFRAME (*out is then unspecified).
 */
int emb_cmap_decode(const void *buf, size_t len, struct emb_cmap *out);

#endif
