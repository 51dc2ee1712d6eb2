/*
 * src/cluster/map.c - the replicated cluster map's arithmetic: the first
 * map, failover and joins, and its encoding. Pure functions; any thread.
 */
#include "cluster/map.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/endian.h"
#include "common/err.h"

#define CMAP_MAGIC   0x4d424d45u /* "EMBM" */
#define CMAP_VERSION 1u
#define CMAP_VERSION_FILL 2u /* with the fill table */
#define CMAP_VERSION_WARM 3u /* with the fill and warm tables */
#define CMAP_VERSION_BEGAN 4u /* and each slot's latest fill begun */
/* The three tables of version 4 as lists of the slots that have an
 * entry: a fill start stays in the map for good, so after a recovery a
 * few hundred slots of 4096 have one, and the dense tables were 10 bytes
 * a slot over the holders (docs/scale.md, "Map traffic"). Written where
 * it is the smaller of the two. */
#define CMAP_VERSION_SPARSE 5u
/* Versions 4 and 5 with each fill's source (began_from[]): dense, listed. */
#define CMAP_VERSION_FROM 6u
#define CMAP_VERSION_FROM_SPARSE 7u

static bool ver_sparse(uint32_t ver)
{
	return ver == CMAP_VERSION_SPARSE || ver == CMAP_VERSION_FROM_SPARSE;
}

static bool ver_from(uint32_t ver)
{
	return ver >= CMAP_VERSION_FROM;
}

int emb_cmap_init(struct emb_cmap *m, uint32_t nservers, uint32_t replicas)
{
	if (!m || nservers == 0 || nservers > EMB_CMAP_SERVERS_MAX ||
	    replicas == 0 || replicas > EMB_CMAP_REPLICAS_MAX ||
	    replicas > nservers)
		return -EINVAL;
	m->epoch = 1;
	m->nservers = nservers;
	m->replicas = replicas;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t home = (uint32_t)((uint64_t)s * nservers / EMB_NSLOTS);

		for (uint32_t i = 0; i < EMB_CMAP_REPLICAS_MAX; i++)
			m->slot[s][i] = i < replicas
					    ? (uint16_t)((home + i) % nservers)
					    : EMB_CMAP_NONE;
		m->fill[s] = EMB_CMAP_NONE;
		m->warm[s] = EMB_CMAP_NONE;
		m->began[s] = 0;
		m->began_to[s] = m->began_from[s] = EMB_CMAP_NONE;
	}
	return 0;
}

uint32_t emb_cmap_holders(const struct emb_cmap *m, uint32_t slot)
{
	uint32_t n = 0;

	while (n < m->replicas && m->slot[slot][n] != EMB_CMAP_NONE)
		n++;
	return n;
}

bool emb_cmap_holds(const struct emb_cmap *m, uint32_t slot, uint32_t rank)
{
	for (uint32_t i = 0; i < m->replicas; i++)
		if (m->slot[slot][i] == rank)
			return true;
	return false;
}

int emb_cmap_remove(const struct emb_cmap *in, uint32_t rank,
		    struct emb_cmap *out)
{
	bool changed = false;

	if (rank >= in->nservers)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint16_t *h = out->slot[s];
		uint32_t k = 0;
		bool held;

		/* Keep the others in order: the first backup left is the
		 * one promoted, as every reader of the map expects. */
		for (uint32_t i = 0; i < out->replicas; i++)
			if (h[i] != rank)
				h[k++] = h[i];
		held = k < out->replicas;
		if (held) {
			changed = true;
			while (k < out->replicas)
				h[k++] = EMB_CMAP_NONE;
		}
		/* A fill from or to the dead server may have missed rows:
		 * it starts again later, from a live holder. */
		if (out->fill[s] != EMB_CMAP_NONE &&
		    (out->fill[s] == rank || held)) {
			out->fill[s] = EMB_CMAP_NONE;
			changed = true;
		}
		/* So may a copy ahead: the move starts again. */
		if (out->warm[s] != EMB_CMAP_NONE &&
		    (out->warm[s] == rank || held)) {
			out->warm[s] = EMB_CMAP_NONE;
			changed = true;
		}
	}
	if (changed)
		out->epoch++;
	return (int)emb_cmap_lost_slots(out);
}

int emb_cmap_add(const struct emb_cmap *in, uint32_t rank,
		 struct emb_cmap *out)
{
	int added = 0;

	if (rank >= in->nservers)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t n = emb_cmap_holders(out, s);

		/* A slot with no holder has no rows to stream from: it
		 * stays lost rather than coming back empty. */
		if (n == 0 || n >= out->replicas || emb_cmap_holds(out, s, rank))
			continue;
		out->slot[s][n] = (uint16_t)rank;
		if (out->fill[s] == rank)
			out->fill[s] = EMB_CMAP_NONE;
		if (out->warm[s] == rank)
			out->warm[s] = EMB_CMAP_NONE;
		added++;
	}
	if (added)
		out->epoch++;
	return added;
}

/* The slot needs rank filled into it: a holder to stream from, a place
 * free, rank not there yet, no fill under way. */
static bool needs(const struct emb_cmap *m, uint32_t s, uint32_t rank)
{
	uint32_t n = emb_cmap_holders(m, s);

	return n > 0 && n < m->replicas && !emb_cmap_holds(m, s, rank) &&
	       m->fill[s] == EMB_CMAP_NONE;
}

static bool range_ok(const struct emb_cmap *m, uint32_t rank, uint32_t first,
		     uint32_t n)
{
	return rank < m->nservers && first <= EMB_NSLOTS &&
	       n <= EMB_NSLOTS - first;
}

int emb_cmap_fill_next(const struct emb_cmap *m, uint32_t rank, uint32_t max,
		       uint32_t *first)
{
	uint32_t s0 = EMB_NSLOTS, n = 0;

	if (rank >= m->nservers || max == 0 || !first || *first >= EMB_NSLOTS)
		return -EINVAL;
	for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
		uint32_t s = (*first + i) % EMB_NSLOTS;

		if (needs(m, s, rank)) {
			s0 = s;
			break;
		}
	}
	if (s0 == EMB_NSLOTS)
		return 0;
	/* One source per chunk: it fences and streams it in one go. */
	while (n < max && s0 + n < EMB_NSLOTS && needs(m, s0 + n, rank) &&
	       m->slot[s0 + n][0] == m->slot[s0][0])
		n++;
	*first = s0;
	return (int)n;
}

int emb_cmap_fill_begin(const struct emb_cmap *in, uint32_t rank,
			uint32_t first, uint32_t n, struct emb_cmap *out)
{
	int marked = 0;

	if (!range_ok(in, rank, first, n))
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = first; s < first + n; s++) {
		if (!needs(out, s, rank))
			continue;
		out->fill[s] = (uint16_t)rank;
		out->began[s] = (uint32_t)(in->epoch + 1);
		out->began_to[s] = (uint16_t)rank;
		/* The source streams the slots it is primary of
		 * (emb_cmap_fill_source()). */
		out->began_from[s] = out->slot[s][0];
		marked++;
	}
	if (marked)
		out->epoch++;
	return marked;
}

int emb_cmap_fill_done(const struct emb_cmap *in, uint32_t rank,
		       uint32_t first, uint32_t n, struct emb_cmap *out)
{
	int held = 0;

	if (!range_ok(in, rank, first, n))
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = first; s < first + n; s++) {
		uint32_t k = emb_cmap_holders(out, s);

		if (out->fill[s] != rank)
			continue;
		out->fill[s] = EMB_CMAP_NONE;
		/* fill_begin() left room, and remove() ends a fill whose
		 * slot lost a holder, so there is room still. */
		if (k < out->replicas && !emb_cmap_holds(out, s, rank)) {
			out->slot[s][k] = (uint16_t)rank;
			held++;
		}
	}
	if (held || memcmp(out->fill, in->fill, sizeof(out->fill)))
		out->epoch++;
	return held;
}

int emb_cmap_fill_abort(const struct emb_cmap *in, uint32_t rank,
			uint32_t first, uint32_t n, struct emb_cmap *out)
{
	int dropped = 0;

	if (!range_ok(in, rank, first, n))
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = first; s < first + n; s++)
		if (out->fill[s] == rank) {
			out->fill[s] = EMB_CMAP_NONE;
			dropped++;
		}
	if (dropped)
		out->epoch++;
	return dropped;
}

/* ---- moves (docs/replication.md, "Moving slots") ---- */

/* The slot may move from `from` to `to`: from holds it, to does not, no
 * fill is under way, and no copy ahead but to's. */
static bool movable(const struct emb_cmap *m, uint32_t s, uint32_t from,
		    uint32_t to)
{
	return emb_cmap_holds(m, s, from) && !emb_cmap_holds(m, s, to) &&
	       m->fill[s] == EMB_CMAP_NONE &&
	       (m->warm[s] == EMB_CMAP_NONE || m->warm[s] == to);
}

/* Slots each rank holds (primary or backup), in cnt[nservers]. */
static void holdings(const struct emb_cmap *m, uint32_t *cnt)
{
	memset(cnt, 0, m->nservers * sizeof(*cnt));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		for (uint32_t i = 0; i < m->replicas; i++)
			if (m->slot[s][i] != EMB_CMAP_NONE)
				cnt[m->slot[s][i]]++;
}

/* From s0 on: the run of slots movable from `from` to `to` with s0's
 * primary (the one source that fences and streams a chunk), up to max. */
static uint32_t run_of(const struct emb_cmap *m, uint32_t s0, uint32_t from,
		       uint32_t to, uint32_t max)
{
	uint32_t n = 0;

	while (n < max && s0 + n < EMB_NSLOTS && movable(m, s0 + n, from, to) &&
	       m->slot[s0 + n][0] == m->slot[s0][0])
		n++;
	return n;
}

int emb_cmap_join_next(const struct emb_cmap *m, uint32_t to, uint32_t max,
		       uint32_t *first, uint32_t *from)
{
	uint32_t *cnt, live = 0, share, v = EMB_CMAP_NONE, total = 0, want;
	int n = 0;

	if (to >= m->nservers || max == 0 || !first || !from ||
	    *first >= EMB_NSLOTS)
		return -EINVAL;
	cnt = malloc(m->nservers * sizeof(*cnt));
	if (!cnt)
		return -ENOMEM;
	holdings(m, cnt);
	for (uint32_t r = 0; r < m->nservers; r++) {
		total += cnt[r];
		live += cnt[r] > 0 || r == to;
		if (r != to && (v == EMB_CMAP_NONE || cnt[r] > cnt[v]))
			v = r;
	}
	share = total / live;
	/* Done when it has its share; the most loaded server gives what it
	 * holds beyond the share, so all end within one of it. */
	if (v == EMB_CMAP_NONE || cnt[to] >= share || cnt[v] <= share)
		goto out;
	want = share - cnt[to];
	if (want > cnt[v] - share)
		want = cnt[v] - share;
	if (want > max)
		want = max;
	for (uint32_t i = 0; i < EMB_NSLOTS && !n; i++) {
		uint32_t s = (*first + i) % EMB_NSLOTS;

		if (movable(m, s, v, to)) {
			n = (int)run_of(m, s, v, to, want);
			*first = s;
		}
	}
	*from = v;
out:
	free(cnt);
	return n;
}

int emb_cmap_drain_next(const struct emb_cmap *m, uint32_t from,
			const bool *ok, uint32_t max, uint32_t *first,
			uint32_t *to)
{
	uint32_t *cnt;
	bool stuck = false;
	int n = 0;

	if (from >= m->nservers || !ok || max == 0 || !first || !to ||
	    *first >= EMB_NSLOTS)
		return -EINVAL;
	cnt = malloc(m->nservers * sizeof(*cnt));
	if (!cnt)
		return -ENOMEM;
	holdings(m, cnt);
	for (uint32_t i = 0; i < EMB_NSLOTS && !n; i++) {
		uint32_t s = (*first + i) % EMB_NSLOTS, t = EMB_CMAP_NONE;

		if (!emb_cmap_holds(m, s, from) || m->fill[s] != EMB_CMAP_NONE)
			continue;
		/* The least loaded server that may take it. */
		for (uint32_t r = 0; r < m->nservers; r++)
			if (ok[r] && r != from && !emb_cmap_holds(m, s, r) &&
			    (t == EMB_CMAP_NONE || cnt[r] < cnt[t]))
				t = r;
		if (t == EMB_CMAP_NONE) {
			stuck = true;
			continue;
		}
		n = (int)run_of(m, s, from, t, max);
		*first = s;
		*to = t;
	}
	free(cnt);
	return n ? n : stuck ? -ENOSPC : 0;
}

/* Sets tab[s] (fill[] or warm[]) to `to` for the slots of [first, first +
 * n) that may move from `from` to `to`; *changed when an entry changed.
 * Returns the slots marked. */
static int mark_movable(struct emb_cmap *m, uint16_t *tab, uint32_t from,
			uint32_t to, uint32_t first, uint32_t n, bool *changed)
{
	int marked = 0;

	for (uint32_t s = first; s < first + n; s++) {
		if (!movable(m, s, from, to))
			continue;
		if (tab == m->fill && tab[s] != to) {
			/* The fenced stream begins (the epoch goes up). */
			m->began[s] = (uint32_t)(m->epoch + 1);
			m->began_to[s] = (uint16_t)to;
			m->began_from[s] = m->slot[s][0];
		}
		*changed |= tab[s] != to;
		tab[s] = (uint16_t)to;
		marked++;
	}
	return marked;
}

/* Ends every copy ahead of m; true when there was one. */
static bool clear_warm(struct emb_cmap *m)
{
	bool any = false;

	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (m->warm[s] != EMB_CMAP_NONE) {
			m->warm[s] = EMB_CMAP_NONE;
			any = true;
		}
	return any;
}

int emb_cmap_warm_begin(const struct emb_cmap *in, uint32_t from, uint32_t to,
			uint32_t first, uint32_t n, struct emb_cmap *out)
{
	bool changed = false;
	int marked;

	if (!range_ok(in, to, first, n) || from >= in->nservers || from == to)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	marked = mark_movable(out, out->warm, from, to, first, n, &changed);
	if (changed)
		out->epoch++;
	return marked;
}

int emb_cmap_warm_end(const struct emb_cmap *in, struct emb_cmap *out)
{
	int cleared = 0;

	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		cleared += out->warm[s] != EMB_CMAP_NONE;
	if (clear_warm(out))
		out->epoch++;
	return cleared;
}

int emb_cmap_move_begin(const struct emb_cmap *in, uint32_t from, uint32_t to,
			uint32_t first, uint32_t n, struct emb_cmap *out)
{
	bool changed = false;
	int marked;

	if (!range_ok(in, to, first, n) || from >= in->nservers || from == to)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	/* A movable slot has no fill: each one marked is a change. */
	marked = mark_movable(out, out->fill, from, to, first, n, &changed);
	/* The copy ahead is over: the fence's stream finishes it. */
	changed |= clear_warm(out);
	if (changed)
		out->epoch++;
	return marked;
}

int emb_cmap_move_done(const struct emb_cmap *in, uint32_t from, uint32_t to,
		       uint32_t first, uint32_t n, struct emb_cmap *out)
{
	int moved = 0;

	if (!range_ok(in, to, first, n) || from >= in->nservers || from == to)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = first; s < first + n; s++) {
		uint16_t *h = out->slot[s];
		uint32_t k = emb_cmap_holders(out, s);

		if (out->fill[s] != to)
			continue;
		out->fill[s] = EMB_CMAP_NONE;
		/* to takes from's place: the same rank in the holders' order,
		 * so a primary's slots get a primary (the rebalance evens
		 * them out later), and the slot never has fewer writers. */
		for (uint32_t i = 0; i < k; i++)
			if (h[i] == from) {
				h[i] = (uint16_t)to;
				moved++;
				goto next;
			}
		/* from died meanwhile (remove() ends a fill whose slot lost
		 * a holder, so this is only a caller's slip): to joins as a
		 * last backup where there is room, as fill_done() does. */
		if (k < out->replicas) {
			h[k] = (uint16_t)to;
			moved++;
		}
next:;
	}
	if (moved || memcmp(out->fill, in->fill, sizeof(out->fill)))
		out->epoch++;
	return moved;
}

int emb_cmap_rebalance(const struct emb_cmap *in, struct emb_cmap *out)
{
	uint32_t *cnt = calloc(in->nservers, sizeof(*cnt));
	uint16_t was[EMB_NSLOTS]; /* primaries before */
	int moved = 0;
	bool again = true;

	if (!cnt)
		return -ENOMEM;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		was[s] = out->slot[s][0];
		if (out->slot[s][0] != EMB_CMAP_NONE)
			cnt[out->slot[s][0]]++;
	}
	/* Each swap narrows the gap between two counts by at least one, so
	 * the passes end; a few suffice in practice (successor backups). */
	for (uint32_t pass = 0; again && pass < 2 * EMB_CMAP_REPLICAS_MAX;
	     pass++) {
		again = false;
		for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
			uint16_t *h = out->slot[s], t;
			uint32_t n = emb_cmap_holders(out, s), best = 0;

			for (uint32_t i = 1; i < n; i++)
				if (cnt[h[i]] + 1 < cnt[h[0]] &&
				    (!best || cnt[h[i]] < cnt[h[best]]))
					best = i;
			if (!best)
				continue;
			cnt[h[0]]--;
			cnt[h[best]]++;
			/* The old primary takes the backup's place: the
			 * order of the others, which fail over in turn,
			 * stays. */
			t = h[0];
			h[0] = h[best];
			h[best] = t;
			moved++;
			again = true;
		}
	}
	free(cnt);
	/* A slot may swap in two passes: count the slots whose primary
	 * changed. */
	moved = 0;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		moved += out->slot[s][0] != was[s];
	if (moved)
		out->epoch++;
	return moved;
}

uint32_t emb_cmap_writers(const struct emb_cmap *m, uint32_t slot,
			  uint16_t out[EMB_CMAP_REPLICAS_MAX + 1])
{
	uint32_t n = emb_cmap_holders(m, slot);

	memcpy(out, m->slot[slot], n * sizeof(*out));
	if (m->fill[slot] != EMB_CMAP_NONE)
		out[n++] = m->fill[slot];
	return n;
}

void emb_cmap_view(const struct emb_cmap *m, const struct emb_cmap *prev,
		   const uint32_t *prev_grew, uint32_t rank, uint8_t *flags,
		   uint32_t *grew)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1], pw[EMB_CMAP_REPLICAS_MAX + 1];

	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t n = emb_cmap_writers(m, s, w), pn;
		bool grown = !prev;
		uint8_t f = 0;

		if (prev) {
			pn = emb_cmap_writers(prev, s, pw);
			for (uint32_t i = 0; i < n && !grown; i++) {
				bool had = false;

				for (uint32_t j = 0; j < pn; j++)
					had |= pw[j] == w[i];
				grown = !had;
			}
		}
		grew[s] = grown ? (uint32_t)m->epoch : prev_grew[s];
		/* A fill begun again into a server that was a writer already
		 * (its first fill's source died) grows nothing a comparison
		 * of writers sees, nor does one a view skipped whole: the map
		 * says when the latest began. */
		if (m->began[s] > grew[s])
			grew[s] = m->began[s];
		if (emb_cmap_holds(m, s, rank) || m->fill[s] == rank)
			f |= EMB_CMAP_VIEW_MINE;
		if (m->fill[s] == rank)
			f |= EMB_CMAP_VIEW_FILLING;
		if (m->fill[s] != EMB_CMAP_NONE &&
		    (m->fill[s] == rank || m->slot[s][0] == rank))
			f |= EMB_CMAP_VIEW_FENCED;
		if (m->warm[s] == rank)
			f |= EMB_CMAP_VIEW_WARMING;
		flags[s] = f;
	}
}

/* The first run of slots whose primary is rank and whose entry in tab
 * (fill[] or warm[]) names one same server: its length, *first and *to. */
static uint32_t source_run(const struct emb_cmap *m, const uint16_t *tab,
			   uint32_t rank, uint32_t *first, uint32_t *to)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t n = 0;

		if (tab[s] == EMB_CMAP_NONE || m->slot[s][0] != rank)
			continue;
		while (s + n < EMB_NSLOTS && tab[s + n] == tab[s] &&
		       m->slot[s + n][0] == rank)
			n++;
		*first = s;
		*to = tab[s];
		return n;
	}
	return 0;
}

uint32_t emb_cmap_fill_source(const struct emb_cmap *m, uint32_t rank,
			      uint32_t *first, uint32_t *to)
{
	return source_run(m, m->fill, rank, first, to);
}

uint32_t emb_cmap_warm_source(const struct emb_cmap *m, uint32_t rank,
			      uint32_t *first, uint32_t *to)
{
	return source_run(m, m->warm, rank, first, to);
}

uint32_t emb_cmap_fill_run(const struct emb_cmap *m, uint32_t *first,
			   uint32_t *rank)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t e = s;

		if (m->fill[s] == EMB_CMAP_NONE)
			continue;
		while (e < EMB_NSLOTS && m->fill[e] == m->fill[s])
			e++;
		*first = s;
		*rank = m->fill[s];
		return e - s;
	}
	return 0;
}

bool emb_cmap_in_map(const struct emb_cmap *m, uint32_t rank)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (m->fill[s] == rank || emb_cmap_holds(m, s, rank))
			return true;
	return false;
}

uint32_t emb_cmap_share(const struct emb_cmap *m)
{
	uint8_t in[EMB_CMAP_SERVERS_MAX] = {0};
	uint32_t n = 0;

	/* One pass over the slots, not emb_cmap_in_map() per rank: a map
	 * of many ranks, most of them gone, comes with every change. */
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		for (uint32_t i = 0; i < m->replicas; i++)
			if (m->slot[s][i] < EMB_CMAP_SERVERS_MAX)
				in[m->slot[s][i]] = 1;
		if (m->fill[s] < EMB_CMAP_SERVERS_MAX)
			in[m->fill[s]] = 1;
		if (m->warm[s] < EMB_CMAP_SERVERS_MAX)
			in[m->warm[s]] = 1;
	}
	for (uint32_t i = 0; i < EMB_CMAP_SERVERS_MAX; i++)
		n += in[i];
	return n ? (m->replicas * EMB_NSLOTS + n - 1) / n : 0;
}

void emb_cmap_rank_slots(const struct emb_cmap *m, uint32_t rank,
			 uint32_t out[3])
{
	out[0] = out[1] = out[2] = 0;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		for (uint32_t i = 0; i < m->replicas; i++)
			if (m->slot[s][i] == rank)
				out[i > 0]++;
		out[2] += m->fill[s] == rank;
	}
}

uint32_t emb_cmap_primary_slots(const struct emb_cmap *m, uint32_t rank)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		n += m->slot[s][0] == rank;
	return n;
}

uint32_t emb_cmap_lost_slots(const struct emb_cmap *m)
{
	return emb_cmap_primary_slots(m, EMB_CMAP_NONE);
}

/* Entries of v (NONE: none). */
static uint32_t count_of(const uint16_t *v)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		n += v[s] != EMB_CMAP_NONE;
	return n;
}

/* Slots with a fill start. */
static uint32_t began_count(const struct emb_cmap *m)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		n += m->began[s] != 0;
	return n;
}

/* Whether some fill start names its source (versions 6 and 7). */
static bool began_sourced(const struct emb_cmap *m)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (m->began[s] && m->began_from[s] != EMB_CMAP_NONE)
			return true;
	return false;
}

/* Bytes a fill start takes: listed (slot, target, [source,] epoch), or
 * dense (epoch, target[, source]). */
static size_t began_bytes(uint32_t ver)
{
	return ver_sparse(ver) ? 8u + 2u * ver_from(ver)
			       : 6u + 2u * ver_from(ver);
}

/* Bytes a sparse version adds to the holders: a 2-byte count for each
 * table, 4 bytes (slot, rank) a fill or copy-ahead entry, and a fill
 * start's. */
static size_t sparse_bytes(const struct emb_cmap *m, uint32_t ver)
{
	return 6u + 4u * (size_t)count_of(m->fill) +
	       4u * (size_t)count_of(m->warm) +
	       began_bytes(ver) * (size_t)began_count(m);
}

/* Bytes a dense version adds to the holders: 2 a slot for fill[] (2 on),
 * 2 for warm[] (3 on), and a fill start's (4 and 6). */
static size_t extra_bytes(uint32_t ver)
{
	return (size_t)EMB_NSLOTS *
	       (2u * (ver >= CMAP_VERSION_FILL) + 2u * (ver >= CMAP_VERSION_WARM) +
		(ver >= CMAP_VERSION_BEGAN ? began_bytes(ver) : 0));
}

/* The version m is written in: the oldest that holds it, which a reader
 * of an older build (a coordinator's) still decodes; with fill starts,
 * the smaller of versions 4 and 5, or of 6 and 7 once a start names its
 * source. */
static uint32_t version_of(const struct emb_cmap *m)
{
	if (began_count(m)) {
		const bool from = began_sourced(m);
		uint32_t dense = from ? CMAP_VERSION_FROM : CMAP_VERSION_BEGAN;
		uint32_t sparse = from ? CMAP_VERSION_FROM_SPARSE
				       : CMAP_VERSION_SPARSE;

		return sparse_bytes(m, sparse) < extra_bytes(dense) ? sparse
								    : dense;
	}
	return count_of(m->warm)   ? CMAP_VERSION_WARM
	       : count_of(m->fill) ? CMAP_VERSION_FILL
				   : CMAP_VERSION;
}

/* Bytes m takes written in version ver. */
static size_t size_in(const struct emb_cmap *m, uint32_t ver)
{
	return emb_cmap_encoded_size(m->replicas) +
	       (ver_sparse(ver) ? sparse_bytes(m, ver) : extra_bytes(ver));
}

size_t emb_cmap_size(const struct emb_cmap *m)
{
	return size_in(m, version_of(m));
}

/* Version 5's list of v's entries at p: a count, then (slot, rank). */
static uint8_t *put_list(uint8_t *p, const uint16_t *v)
{
	emb_le16_store(p, (uint16_t)count_of(v));
	p += 2;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (v[s] != EMB_CMAP_NONE) {
			emb_le16_store(p, (uint16_t)s);
			emb_le16_store(p + 2, v[s]);
			p += 4;
		}
	return p;
}

int64_t emb_cmap_encode(const struct emb_cmap *m, void *buf, size_t cap)
{
	const uint32_t ver = version_of(m);
	const size_t need = size_in(m, ver);
	bool dense = !ver_sparse(ver);
	uint8_t *p = buf;

	if (cap < need)
		return -ENOSPC;
	emb_le32_store(p, CMAP_MAGIC);
	emb_le32_store(p + 4, ver);
	emb_le64_store(p + 8, m->epoch);
	emb_le32_store(p + 16, m->nservers);
	emb_le32_store(p + 20, m->replicas);
	p += EMB_CMAP_HDR_SIZE;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		for (uint32_t i = 0; i < m->replicas; i++, p += 2)
			emb_le16_store(p, m->slot[s][i]);
	if (!dense) {
		uint16_t nb = 0;
		uint8_t *at;

		p = put_list(p, m->fill);
		p = put_list(p, m->warm);
		at = p;
		p += 2;
		for (uint32_t s = 0; s < EMB_NSLOTS; s++)
			if (m->began[s]) {
				emb_le16_store(p, (uint16_t)s);
				emb_le16_store(p + 2, m->began_to[s]);
				if (ver_from(ver)) {
					emb_le16_store(p + 4,
						       m->began_from[s]);
					p += 2;
				}
				emb_le32_store(p + 4, m->began[s]);
				p += 8;
				nb++;
			}
		emb_le16_store(at, nb);
		return (int64_t)need;
	}
	for (uint32_t s = 0; ver >= CMAP_VERSION_FILL && s < EMB_NSLOTS;
	     s++, p += 2)
		emb_le16_store(p, m->fill[s]);
	for (uint32_t s = 0; ver >= CMAP_VERSION_WARM && s < EMB_NSLOTS;
	     s++, p += 2)
		emb_le16_store(p, m->warm[s]);
	for (uint32_t s = 0; ver >= CMAP_VERSION_BEGAN && s < EMB_NSLOTS;
	     s++, p += began_bytes(ver)) {
		emb_le32_store(p, m->began[s]);
		emb_le16_store(p + 4, m->began_to[s]);
		if (ver_from(ver))
			emb_le16_store(p + 6, m->began_from[s]);
	}
	return (int64_t)need;
}

/*
 * Version 5's list at *p (end: the buffer's end) into v, whose slots
 * were all NONE: entries of strictly ascending slots. 0, or
 * EMB_EBADFRAME.
 */
static int get_list(const uint8_t **p, const uint8_t *end, uint16_t *v)
{
	uint32_t k, last = 0;

	if (end - *p < 2)
		return EMB_EBADFRAME;
	k = emb_le16_load(*p);
	*p += 2;
	if (k > EMB_NSLOTS || (size_t)(end - *p) < 4u * k)
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < k; j++, *p += 4) {
		uint32_t s = emb_le16_load(*p);

		if (s >= EMB_NSLOTS || (j && s <= last))
			return EMB_EBADFRAME;
		last = s;
		v[s] = emb_le16_load(*p + 2);
		if (v[s] == EMB_CMAP_NONE)
			return EMB_EBADFRAME;
	}
	return 0;
}

/* Version 5's or 7's tables at p, which must end the buffer exactly at
 * end. */
static int get_sparse(const uint8_t *p, const uint8_t *end, uint32_t ver,
		      struct emb_cmap *out)
{
	const size_t eb = began_bytes(ver);
	uint32_t k, last = 0;

	if (get_list(&p, end, out->fill) || get_list(&p, end, out->warm) ||
	    end - p < 2)
		return EMB_EBADFRAME;
	k = emb_le16_load(p);
	p += 2;
	if (k > EMB_NSLOTS || (size_t)(end - p) != eb * k)
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < k; j++, p += eb) {
		uint32_t s = emb_le16_load(p);

		if (s >= EMB_NSLOTS || (j && s <= last))
			return EMB_EBADFRAME;
		last = s;
		out->began_to[s] = emb_le16_load(p + 2);
		if (ver_from(ver))
			out->began_from[s] = emb_le16_load(p + 4);
		out->began[s] = emb_le32_load(p + eb - 4);
		/* An entry without an epoch is none (the checks below). */
		if (!out->began[s])
			return EMB_EBADFRAME;
	}
	return 0;
}

int emb_cmap_decode(const void *buf, size_t len, struct emb_cmap *out)
{
	const uint8_t *p = buf;
	uint32_t n, r, ver;

	if (!buf || len < EMB_CMAP_HDR_SIZE ||
	    emb_le32_load(p) != CMAP_MAGIC)
		return EMB_EBADFRAME;
	ver = emb_le32_load(p + 4);
	if (ver < CMAP_VERSION || ver > CMAP_VERSION_FROM_SPARSE)
		return EMB_EBADFRAME;
	out->epoch = emb_le64_load(p + 8);
	n = emb_le32_load(p + 16);
	r = emb_le32_load(p + 20);
	if (out->epoch == 0 || n == 0 || n > EMB_CMAP_SERVERS_MAX || r == 0 ||
	    r > EMB_CMAP_REPLICAS_MAX || r > n ||
	    len < emb_cmap_encoded_size(r) ||
	    (!ver_sparse(ver) &&
	     len != emb_cmap_encoded_size(r) + extra_bytes(ver)))
		return EMB_EBADFRAME;
	out->nservers = n;
	out->replicas = r;
	p += EMB_CMAP_HDR_SIZE;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		bool ended = false;

		for (uint32_t i = 0; i < EMB_CMAP_REPLICAS_MAX; i++) {
			uint16_t v = i < r ? emb_le16_load(p + 2 * i)
					   : EMB_CMAP_NONE;

			out->slot[s][i] = v;
			if (i >= r)
				continue;
			if (v == EMB_CMAP_NONE) {
				ended = true;
				continue;
			}
			if (ended || v >= n)
				return EMB_EBADFRAME;
			for (uint32_t j = 0; j < i; j++)
				if (out->slot[s][j] == v)
					return EMB_EBADFRAME;
		}
		p += 2 * r;
	}
	/* The tables, each checked below whichever way it came. */
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		out->fill[s] = out->warm[s] = out->began_to[s] =
		    out->began_from[s] = EMB_CMAP_NONE;
		out->began[s] = 0;
	}
	if (ver_sparse(ver)) {
		if (get_sparse(p, (const uint8_t *)buf + len, ver, out))
			return EMB_EBADFRAME;
	} else {
		for (uint32_t s = 0; ver >= CMAP_VERSION_FILL && s < EMB_NSLOTS;
		     s++, p += 2)
			out->fill[s] = emb_le16_load(p);
		for (uint32_t s = 0; ver >= CMAP_VERSION_WARM && s < EMB_NSLOTS;
		     s++, p += 2)
			out->warm[s] = emb_le16_load(p);
		for (uint32_t s = 0; ver >= CMAP_VERSION_BEGAN &&
				     s < EMB_NSLOTS;
		     s++, p += began_bytes(ver)) {
			out->began[s] = emb_le32_load(p);
			out->began_to[s] = emb_le16_load(p + 4);
			if (ver_from(ver))
				out->began_from[s] = emb_le16_load(p + 6);
		}
	}
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint16_t f = out->fill[s], w = out->warm[s],
			 t = out->began_to[s], fr = out->began_from[s];
		uint32_t b = out->began[s];

		/* A filling server is no holder of its slot yet, and a
		 * slot without a holder has no rows to fill it with. */
		if (f != EMB_CMAP_NONE &&
		    (f >= n || emb_cmap_holds(out, s, f) ||
		     out->slot[s][0] == EMB_CMAP_NONE))
			return EMB_EBADFRAME;
		/* Copied ahead to a server that does not hold the slot, from
		 * a holder, and never while a fill of the slot runs. */
		if (w != EMB_CMAP_NONE &&
		    (w >= n || emb_cmap_holds(out, s, w) ||
		     out->slot[s][0] == EMB_CMAP_NONE || f != EMB_CMAP_NONE))
			return EMB_EBADFRAME;
		/* A fill begun by a map up to this one, into a server of the
		 * job; none named without an epoch. */
		if ((uint64_t)b > out->epoch || (b && t >= n) ||
		    (!b && t != EMB_CMAP_NONE))
			return EMB_EBADFRAME;
		/* Its source, when named, another server of the job. */
		if (fr != EMB_CMAP_NONE && (!b || fr >= n || fr == t))
			return EMB_EBADFRAME;
	}
	return 0;
}

uint32_t emb_cmap_promoted(const struct emb_cmap *prev,
			   const struct emb_cmap *m, uint32_t rank,
			   uint64_t *set)
{
	uint32_t n = 0;

	memset(set, 0, EMB_NSLOTS / 8);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (emb_cmap_primary(m, sl) == rank &&
		    emb_cmap_primary(prev, sl) != rank &&
		    emb_cmap_holds(prev, sl, rank)) {
			set[sl / 64] |= 1ull << (sl % 64);
			n++;
		}
	return n;
}

uint32_t emb_cmap_evict_hold(const struct emb_cmap *m, uint64_t *set)
{
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	uint32_t n = 0;

	memset(set, 0, EMB_NSLOTS / 8);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->warm[sl] != EMB_CMAP_NONE ||
		    emb_cmap_writers(m, sl, w) > 1) {
			set[sl / 64] |= 1ull << (sl % 64);
			n++;
		}
	return n;
}

uint32_t emb_cmap_evict_hold_rank(const struct emb_cmap *m, uint32_t rank,
				  uint64_t *set)
{
	uint32_t n = 0;

	if (m->replicas <= 1)
		return emb_cmap_evict_hold(m, set);
	memset(set, 0, EMB_NSLOTS / 8);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->warm[sl] != EMB_CMAP_NONE ||
		    emb_cmap_primary(m, sl) != rank) {
			set[sl / 64] |= 1ull << (sl % 64);
			n++;
		}
	return n;
}
