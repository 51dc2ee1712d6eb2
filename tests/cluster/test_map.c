/*
 * tests/cluster/test_map.c - the replicated cluster map: the first map
 * (R = 1 is the contiguous map of a plain server list), failover that
 * promotes the first backup left, joins that fill under-replicated slots,
 * lost slots, recovery (a replacement filled chunk by chunk, fills that
 * end with a death, the rebalance), and the encoding's round trip and
 * refusals. Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/map.h"
#include "common/endian.h"
#include "common/err.h"
#include "proto/wire_cluster.h"
#include "harness.h"

static struct emb_cmap *new_map(uint32_t n, uint32_t r)
{
	struct emb_cmap *m = malloc(sizeof(*m));

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, n, r), 0);
	return m;
}

static void test_init(void)
{
	struct emb_cmap *m = new_map(3, 1), bad;

	CU_ASSERT_EQUAL(m->epoch, 1);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		CU_ASSERT_EQUAL(emb_cmap_primary(m, s),
				(uint16_t)((uint64_t)s * 3 / EMB_NSLOTS));
		CU_ASSERT_EQUAL(emb_cmap_holders(m, s), 1);
	}
	free(m);
	m = new_map(3, 2);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint16_t p = emb_cmap_primary(m, s);

		CU_ASSERT_EQUAL(m->slot[s][1], (p + 1) % 3);
		CU_ASSERT_EQUAL(m->slot[s][2], EMB_CMAP_NONE);
		CU_ASSERT(emb_cmap_holds(m, s, p));
		CU_ASSERT(!emb_cmap_holds(m, s, (p + 2) % 3));
	}
	CU_ASSERT_EQUAL(emb_cmap_primary_slots(m, 0) +
			    emb_cmap_primary_slots(m, 1) +
			    emb_cmap_primary_slots(m, 2),
			EMB_NSLOTS);
	free(m);
	CU_ASSERT_EQUAL(emb_cmap_init(&bad, 0, 1), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_init(&bad, 2, 3), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_init(&bad, 16, 9), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_init(&bad, 4097, 1), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_init(&bad, 4, 0), -EINVAL);
}

static void test_remove(void)
{
	struct emb_cmap *m = new_map(3, 2), *out = malloc(sizeof(*out));
	uint32_t was0 = emb_cmap_primary_slots(m, 0);
	uint32_t was1 = emb_cmap_primary_slots(m, 1);

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	/* Server 0 dies: its slots go to their backup, 1. */
	CU_ASSERT_EQUAL(emb_cmap_remove(m, 0, out), 0);
	CU_ASSERT_EQUAL(out->epoch, 2);
	CU_ASSERT_EQUAL(m->epoch, 1); /* the input is untouched */
	CU_ASSERT_EQUAL(emb_cmap_primary_slots(out, 0), 0);
	CU_ASSERT_EQUAL(emb_cmap_primary_slots(out, 1), was0 + was1);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		CU_ASSERT(!emb_cmap_holds(out, s, 0));
		CU_ASSERT(emb_cmap_holders(out, s) >= 1);
	}
	/* The removed server has left the map; the others are in it. */
	CU_ASSERT(!emb_cmap_in_map(out, 0));
	CU_ASSERT(emb_cmap_in_map(out, 1) && emb_cmap_in_map(out, 2));
	CU_ASSERT(emb_cmap_in_map(m, 0));
	/* Removing it again changes nothing, not even the epoch. */
	CU_ASSERT_EQUAL(emb_cmap_remove(out, 0, out), 0);
	CU_ASSERT_EQUAL(out->epoch, 2);
	/* Then 1: slots that were 0's and 1's have no holder left. */
	CU_ASSERT_EQUAL(emb_cmap_remove(out, 1, out), (int)was0);
	CU_ASSERT_EQUAL(emb_cmap_lost_slots(out), was0);
	CU_ASSERT_EQUAL(out->epoch, 3);
	CU_ASSERT_EQUAL(emb_cmap_remove(out, 3, out), -EINVAL);
	free(out);
	free(m);
}

/* The slots a server became the primary of, having been their backup:
 * after 0's death, 1 in 0's slots; nobody else, and nothing when the map
 * did not change. */
static void test_promoted(void)
{
	struct emb_cmap *m = new_map(3, 2), *out = malloc(sizeof(*out));
	uint64_t set[EMB_NSLOTS / 64];
	uint32_t was0 = emb_cmap_primary_slots(m, 0), n = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_EQUAL(emb_cmap_remove(m, 0, out), 0);
	CU_ASSERT_EQUAL(emb_cmap_promoted(m, out, 1, set), was0);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		bool bit = (set[s / 64] >> (s % 64)) & 1;

		CU_ASSERT_EQUAL(bit, emb_cmap_primary(m, s) == 0);
		n += bit;
	}
	CU_ASSERT_EQUAL(n, was0);
	CU_ASSERT_EQUAL(emb_cmap_promoted(m, out, 2, set), 0);
	CU_ASSERT_EQUAL(emb_cmap_promoted(m, out, 0, set), 0);
	CU_ASSERT_EQUAL(emb_cmap_promoted(m, m, 1, set), 0);
	free(out);
	free(m);
}

/*
 * Who holds eviction back: with replicas, every server where it is not
 * the primary (the primary evicts alone, its backups check) and in the
 * slots copied ahead; with one copy, emb_cmap_evict_hold()'s rule.
 */
static void test_evict_hold_rank(void)
{
	struct emb_cmap *m = new_map(2, 2);
	uint64_t set[EMB_NSLOTS / 64], one[EMB_NSLOTS / 64];
	uint32_t n1 = emb_cmap_primary_slots(m, 1), n = 0;

	CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, 0, set), n1);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		CU_ASSERT_EQUAL((set[s / 64] >> (s % 64)) & 1,
				emb_cmap_primary(m, s) == 1);
	CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, 1, set),
			EMB_NSLOTS - n1);
	/* A third rank, empty: slots 0-63 (rank 0's) copied ahead to it
	 * are held by rank 0 too, and by the newcomer everywhere. */
	m->nservers = 3;
	CU_ASSERT_EQUAL_FATAL(emb_cmap_primary(m, 0), 0);
	CU_ASSERT_EQUAL_FATAL(emb_cmap_warm_begin(m, 0, 2, 0, 64, m), 64);
	CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, 0, set), n1 + 64);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		bool bit = (set[s / 64] >> (s % 64)) & 1;

		CU_ASSERT_EQUAL(bit, s < 64 || emb_cmap_primary(m, s) == 1);
		n += bit;
	}
	CU_ASSERT_EQUAL(n, n1 + 64);
	CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, 2, set), EMB_NSLOTS);
	free(m);
	/* One copy: the slots with a second writer or a copy ahead, for
	 * every rank alike. */
	m = new_map(2, 1);
	m->nservers = 3;
	CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, 0, set), 0);
	CU_ASSERT_EQUAL_FATAL(emb_cmap_move_begin(m, 0, 2, 0, 32, m), 32);
	CU_ASSERT_EQUAL_FATAL(emb_cmap_warm_begin(m, 1, 2, EMB_NSLOTS - 16,
						  16, m),
			      16);
	for (uint32_t r = 0; r < 3; r++) {
		CU_ASSERT_EQUAL(emb_cmap_evict_hold_rank(m, r, set),
				emb_cmap_evict_hold(m, one));
		CU_ASSERT_EQUAL(memcmp(set, one, sizeof(set)), 0);
	}
	CU_ASSERT_EQUAL(emb_cmap_evict_hold(m, one), 48);
	free(m);
}

static void test_add(void)
{
	struct emb_cmap *m = new_map(3, 2);
	uint32_t was0 = emb_cmap_primary_slots(m, 0);
	uint32_t was1 = emb_cmap_primary_slots(m, 1);

	emb_cmap_remove(m, 1, m);
	/* 1 comes back: every slot that lost it (its own, and 0's, whose
	 * backup it was) takes it as last backup. */
	CU_ASSERT_EQUAL(emb_cmap_add(m, 1, m), (int)(was0 + was1));
	CU_ASSERT_EQUAL(m->epoch, 3);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		CU_ASSERT_EQUAL(emb_cmap_holders(m, s), 2);
	/* Nothing is under-replicated now. */
	CU_ASSERT_EQUAL(emb_cmap_add(m, 1, m), 0);
	CU_ASSERT_EQUAL(m->epoch, 3);
	/* A slot with no holder is not brought back empty. */
	emb_cmap_remove(m, 0, m);
	emb_cmap_remove(m, 1, m);
	CU_ASSERT(emb_cmap_lost_slots(m) > 0);
	emb_cmap_add(m, 0, m);
	CU_ASSERT(emb_cmap_lost_slots(m) > 0);
	CU_ASSERT_EQUAL(emb_cmap_add(m, 7, m), -EINVAL);
	free(m);
}

static void test_encode(void)
{
	struct emb_cmap *m = new_map(5, 3), *out = malloc(sizeof(*out));
	size_t sz = emb_cmap_encoded_size(3);
	uint8_t *buf = malloc(sz);

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	emb_cmap_remove(m, 2, m);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz - 1), -ENOSPC);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz), (int64_t)sz);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), 0);
	CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
	/* Short, long, bad magic, a rank out of range, a rank twice, a
	 * hole before a live rank, epoch 0: all refused. */
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz - 1, out), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, 10, out), EMB_EBADFRAME);
	buf[0] ^= 1;
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	buf[0] ^= 1;
	buf[24] = 9;
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	buf[24] = buf[26];
	buf[25] = buf[27];
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	emb_cmap_encode(m, buf, sz);
	buf[24] = 0xff;
	buf[25] = 0xff;
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	emb_cmap_encode(m, buf, sz);
	memset(buf + 8, 0, 8);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	free(buf);
	free(out);
	free(m);
}

/* Every slot's holders are distinct live ranks, padded with NONE. */
static void check_slots(const struct emb_cmap *m)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t n = emb_cmap_holders(m, s);

		for (uint32_t i = n; i < m->replicas; i++)
			CU_ASSERT_EQUAL(m->slot[s][i], EMB_CMAP_NONE);
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t j = 0; j < i; j++)
				CU_ASSERT_NOT_EQUAL(m->slot[s][i], m->slot[s][j]);
		if (m->fill[s] != EMB_CMAP_NONE)
			CU_ASSERT(!emb_cmap_holds(m, s, m->fill[s]));
	}
}

/* Fills rank chunk by chunk as the scheduler does; returns the chunks. */
static uint32_t fill_all(struct emb_cmap *m, uint32_t rank, uint32_t max)
{
	uint32_t first = 0, chunks = 0;
	int n;

	while ((n = emb_cmap_fill_next(m, rank, max, &first)) > 0) {
		uint64_t e = m->epoch;
		uint16_t src = emb_cmap_primary(m, first), w[9];

		CU_ASSERT((uint32_t)n <= max);
		CU_ASSERT_EQUAL(emb_cmap_fill_begin(m, rank, first, (uint32_t)n,
						    m),
				n);
		CU_ASSERT_EQUAL(m->epoch, e + 1);
		{
			/* The one chunk under way, as the map says it. */
			uint32_t f0 = EMB_NSLOTS, r0 = EMB_CMAP_NONE;

			CU_ASSERT_EQUAL(emb_cmap_fill_run(m, &f0, &r0),
					(uint32_t)n);
			CU_ASSERT_EQUAL(f0, first);
			CU_ASSERT_EQUAL(r0, rank);
		}
		for (uint32_t s = first; s < first + (uint32_t)n; s++) {
			/* One source per chunk; the newcomer is written to
			 * but neither holds nor serves the slot. */
			CU_ASSERT_EQUAL(emb_cmap_primary(m, s), src);
			CU_ASSERT_EQUAL(m->fill[s], rank);
			CU_ASSERT(!emb_cmap_holds(m, s, rank));
			/* Being filled counts as in the map. */
			CU_ASSERT(emb_cmap_in_map(m, rank));
			CU_ASSERT_EQUAL(emb_cmap_writers(m, s, w),
					emb_cmap_holders(m, s) + 1);
			CU_ASSERT_EQUAL(w[emb_cmap_holders(m, s)], rank);
		}
		/* A chunk under way is not picked again. */
		if (emb_cmap_fill_next(m, rank, max, &first) > 0)
			CU_ASSERT(m->fill[first] == EMB_CMAP_NONE);
		first = (uint32_t)((first + EMB_NSLOTS - (uint32_t)n) %
				   EMB_NSLOTS);
		while (m->fill[first] != rank)
			first = (first + 1) % EMB_NSLOTS;
		CU_ASSERT_EQUAL(emb_cmap_fill_done(m, rank, first, (uint32_t)n,
						   m),
				n);
		CU_ASSERT_EQUAL(m->epoch, e + 2);
		for (uint32_t s = first; s < first + (uint32_t)n; s++) {
			CU_ASSERT(emb_cmap_holds(m, s, rank));
			CU_ASSERT_EQUAL(m->fill[s], EMB_CMAP_NONE);
		}
		check_slots(m);
		chunks++;
	}
	return chunks;
}

static void test_recover(void)
{
	struct emb_cmap *m = new_map(3, 2), *before = malloc(sizeof(*m));
	uint32_t first = 0, cnt[3], chunks, had;
	int moved;

	CU_ASSERT_PTR_NOT_NULL_FATAL(before);
	/* Server 1 dies; a replacement takes its rank. */
	emb_cmap_remove(m, 1, m);
	CU_ASSERT_EQUAL(emb_cmap_fill_next(m, 9, 64, &first), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_fill_next(m, 1, 0, &first), -EINVAL);
	had = 0;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		had += emb_cmap_holders(m, s) < 2;
	chunks = fill_all(m, 1, 64);
	/* 64-slot chunks that never span two sources. */
	CU_ASSERT(chunks >= (had + 63) / 64);
	CU_ASSERT(chunks <= (had + 63) / 64 + 2);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		CU_ASSERT_EQUAL(emb_cmap_holders(m, s), 2);
	CU_ASSERT_EQUAL(emb_cmap_fill_next(m, 1, 64, &first), 0);
	/* Full again, but 1 is primary nowhere: the rebalance, one epoch,
	 * moves no holder, only their order. */
	CU_ASSERT_EQUAL(emb_cmap_primary_slots(m, 1), 0);
	memcpy(before, m, sizeof(*m));
	moved = emb_cmap_rebalance(m, m);
	/* It takes about a third of the primaries, each counted once. */
	CU_ASSERT(moved >= (int)(EMB_NSLOTS / 3 - 1));
	CU_ASSERT(moved <= (int)(EMB_NSLOTS * 2 / 3 + 1));
	CU_ASSERT_EQUAL(m->epoch, before->epoch + 1);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		CU_ASSERT(emb_cmap_holds(m, s, before->slot[s][0]));
		CU_ASSERT(emb_cmap_holds(m, s, before->slot[s][1]));
	}
	for (uint32_t r = 0; r < 3; r++) {
		cnt[r] = emb_cmap_primary_slots(m, r);
		CU_ASSERT(cnt[r] >= EMB_NSLOTS / 3 - 1);
		CU_ASSERT(cnt[r] <= EMB_NSLOTS / 3 + 1);
	}
	CU_ASSERT_EQUAL(emb_cmap_rebalance(m, m), 0);
	CU_ASSERT_EQUAL(m->epoch, before->epoch + 1);
	emb_cmap_rank_slots(m, 1, cnt);
	CU_ASSERT_EQUAL(cnt[0], emb_cmap_primary_slots(m, 1));
	CU_ASSERT_EQUAL(cnt[0] + cnt[1], EMB_NSLOTS * 2 / 3 + 1);
	CU_ASSERT_EQUAL(cnt[2], 0);
	check_slots(m);
	free(before);
	free(m);
}

static void test_fill_deaths(void)
{
	struct emb_cmap *m = new_map(3, 2);
	uint32_t first = 0, cnt[3];
	uint16_t src;
	int n;

	emb_cmap_remove(m, 1, m);
	n = emb_cmap_fill_next(m, 1, 100, &first);
	CU_ASSERT_FATAL(n > 0);
	src = emb_cmap_primary(m, first);
	CU_ASSERT_EQUAL(emb_cmap_fill_begin(m, 1, first, (uint32_t)n, m), n);
	/* Nothing more to mark there: no epoch for nothing. */
	CU_ASSERT_EQUAL(emb_cmap_fill_begin(m, 1, first, (uint32_t)n, m), 0);
	CU_ASSERT_EQUAL(emb_cmap_fill_begin(m, 1, EMB_NSLOTS - 1, 2, m),
			-EINVAL);
	emb_cmap_rank_slots(m, 1, cnt);
	CU_ASSERT_EQUAL(cnt[2], (uint32_t)n);
	/* The newcomer dies while filling: its fills end, nothing else
	 * changes hands. */
	CU_ASSERT_EQUAL(emb_cmap_remove(m, 1, m), 0);
	emb_cmap_rank_slots(m, 1, cnt);
	CU_ASSERT_EQUAL(cnt[0] + cnt[1] + cnt[2], 0);
	CU_ASSERT_EQUAL(emb_cmap_fill_done(m, 1, first, (uint32_t)n, m), 0);
	for (uint32_t s = first; s < first + (uint32_t)n; s++)
		CU_ASSERT_EQUAL(emb_cmap_primary(m, s), src);
	/* Again, and the source dies mid-stream: the chunk's only holder is
	 * gone, and the half-filled newcomer is not promoted (the slots are
	 * lost rather than served with missing rows). */
	CU_ASSERT_EQUAL(emb_cmap_fill_next(m, 1, 100, &first), n);
	emb_cmap_fill_begin(m, 1, first, (uint32_t)n, m);
	CU_ASSERT(emb_cmap_remove(m, src, m) > 0);
	for (uint32_t s = first; s < first + (uint32_t)n; s++) {
		CU_ASSERT_EQUAL(m->fill[s], EMB_CMAP_NONE);
		CU_ASSERT_EQUAL(emb_cmap_primary(m, s), EMB_CMAP_NONE);
	}
	CU_ASSERT_EQUAL(emb_cmap_fill_done(m, 1, first, (uint32_t)n, m), 0);
	free(m);

	/* R = 3 of 4: a fill ends when a backup of its slot dies too, and
	 * starts again from the holders left. */
	m = new_map(4, 3);
	emb_cmap_remove(m, 3, m);
	first = 0;
	n = emb_cmap_fill_next(m, 3, 32, &first);
	CU_ASSERT_FATAL(n > 0);
	emb_cmap_fill_begin(m, 3, first, (uint32_t)n, m);
	src = m->slot[first][1];
	CU_ASSERT_EQUAL(emb_cmap_remove(m, src, m), 0);
	CU_ASSERT_EQUAL(m->fill[first], EMB_CMAP_NONE);
	CU_ASSERT(emb_cmap_fill_next(m, 3, 32, &first) > 0);
	/* An abort drops just that rank's fills in the range. */
	n = emb_cmap_fill_next(m, 3, 32, &first);
	emb_cmap_fill_begin(m, 3, first, (uint32_t)n, m);
	CU_ASSERT_EQUAL(emb_cmap_fill_abort(m, 2, first, (uint32_t)n, m), 0);
	CU_ASSERT_EQUAL(emb_cmap_fill_abort(m, 3, 0, EMB_NSLOTS, m), n);
	CU_ASSERT_EQUAL(m->fill[first], EMB_CMAP_NONE);
	check_slots(m);
	free(m);
}

static void test_encode_fill(void)
{
	struct emb_cmap *m = new_map(3, 2), *out = malloc(sizeof(*out));
	/* Dense: fill[] and warm[] (2 bytes a slot each), began[],
	 * began_to[] and began_from[] (8): version 6, the largest. */
	size_t dense = emb_cmap_encoded_size(2) + 12 * EMB_NSLOTS, sz;
	uint8_t *buf = malloc(dense);
	uint32_t first = 0;
	int n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	emb_cmap_remove(m, 2, m);
	CU_ASSERT_EQUAL(emb_cmap_size(m), emb_cmap_encoded_size(2));
	n = emb_cmap_fill_next(m, 2, 50, &first);
	CU_ASSERT_FATAL(n > 0 && first + (uint32_t)n <= EMB_NSLOTS);
	emb_cmap_fill_begin(m, 2, first, (uint32_t)n, m);
	CU_ASSERT_EQUAL(m->began[first], m->epoch);
	CU_ASSERT_EQUAL(m->began_to[first], 2);
	/* Its source: the slot's primary, which streams it. */
	CU_ASSERT_EQUAL(m->began_from[first], m->slot[first][0]);
	CU_ASSERT_NOT_EQUAL(m->began_from[first], EMB_CMAP_NONE);
	CU_ASSERT_EQUAL(m->began[(first + (uint32_t)n) % EMB_NSLOTS], 0);
	CU_ASSERT(emb_cmap_refilled(m, first, 2, m->epoch - 1));
	CU_ASSERT(!emb_cmap_refilled(m, first, 2, m->epoch));
	CU_ASSERT(!emb_cmap_refilled(m, first, 1, 0));
	/* A fill begun makes it version 7: after the slots, the fill's
	 * slots (a count, then slot and rank), the copy-ahead's (none),
	 * each slot's latest fill start (slot, target, source, epoch). */
	sz = emb_cmap_encoded_size(2) + 2 + 4 * (size_t)n + 2 + 2 +
	     10 * (size_t)n;
	CU_ASSERT_EQUAL(emb_cmap_size(m), sz);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz - 1), -ENOSPC);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz), (int64_t)sz);
	CU_ASSERT_EQUAL(buf[4], 7);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), 0);
	CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz - 2, out), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz + 2, out), EMB_EBADFRAME);
	{
		const size_t fl = emb_cmap_encoded_size(2) + 2;
		const size_t bt = fl + 4 * (size_t)n + 4;
		uint8_t keep[10];

		/* A fill start after the map's own epoch, into a rank out
		 * of range, or without an epoch, is refused; so is a source
		 * out of range or the target itself. */
		memcpy(keep, buf + bt, 10);
		emb_le32_store(buf + bt + 6, (uint32_t)m->epoch + 1);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		memcpy(buf + bt, keep, 10);
		buf[bt + 2] = 3;
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		memcpy(buf + bt, keep, 10);
		memset(buf + bt + 6, 0, 4);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		memcpy(buf + bt, keep, 10);
		emb_le16_store(buf + bt + 4, 3);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		emb_le16_store(buf + bt + 4, 2);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		memcpy(buf + bt, keep, 10);
		/* Slots out of order, or past the last, are refused. */
		if (n > 1) {
			buf[bt + 10] = buf[bt];
			buf[bt + 11] = buf[bt + 1];
			CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out),
					EMB_EBADFRAME);
			emb_le16_store(buf + bt + 10, (uint16_t)(first + 1));
		}
		emb_le16_store(buf + bt, EMB_NSLOTS);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		memcpy(buf + bt, keep, 10);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), 0);
		/* A count past the bytes that follow is refused. */
		emb_le16_store(buf + fl - 2, (uint16_t)(n + 1));
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		emb_le16_store(buf + fl - 2, (uint16_t)n);
		/* A filling server that holds its slot already, or a rank
		 * out of range, is refused. */
		emb_le16_store(buf + fl + 2, m->slot[first][0]);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		emb_le16_store(buf + fl + 2, 3);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
		emb_le16_store(buf + fl + 2, 2);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), 0);
	}
	/* The fill's end keeps when it began, its target and its source. */
	*out = *m;
	emb_cmap_fill_done(out, 2, first, (uint32_t)n, out);
	CU_ASSERT_EQUAL(out->fill[first], EMB_CMAP_NONE);
	CU_ASSERT_EQUAL(out->began[first], m->epoch);
	CU_ASSERT_EQUAL(out->began_to[first], 2);
	CU_ASSERT_EQUAL(out->began_from[first], m->began_from[first]);
	CU_ASSERT_EQUAL(emb_cmap_size(out), emb_cmap_encoded_size(2) + 6 +
						 10 * (size_t)n);
	{
		/* A map of an older build, whose starts name no source, is
		 * written in version 5 as before (8 bytes a start), and read
		 * back with none. */
		struct emb_cmap *old = malloc(sizeof(*old));

		CU_ASSERT_PTR_NOT_NULL_FATAL(old);
		*old = *out;
		for (uint32_t s = 0; s < EMB_NSLOTS; s++)
			old->began_from[s] = EMB_CMAP_NONE;
		sz = emb_cmap_size(old);
		CU_ASSERT_EQUAL(sz, emb_cmap_encoded_size(2) + 6 +
					8 * (size_t)n);
		CU_ASSERT_EQUAL(emb_cmap_encode(old, buf, sz), (int64_t)sz);
		CU_ASSERT_EQUAL(buf[4], 5);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, m == out ? m : out),
				0);
		CU_ASSERT_EQUAL(memcmp(old, out, sizeof(*old)), 0);
		*out = *m;
		emb_cmap_fill_done(out, 2, first, (uint32_t)n, out);
		free(old);
	}

	/* Every slot being filled, with a fill start: version 6, dense,
	 * is the smaller (14 bytes a slot listed against 12). */
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		m->fill[s] = 2;
		if (!m->began[s]) {
			m->began[s] = (uint32_t)m->epoch;
			m->began_to[s] = 0;
			m->began_from[s] = 1;
		}
	}
	CU_ASSERT_EQUAL(emb_cmap_size(m), dense);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, dense), (int64_t)dense);
	CU_ASSERT_EQUAL(buf[4], 6);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out), 0);
	CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense - 2, out), EMB_EBADFRAME);
	{
		/* The same checks in the dense tables. */
		size_t bt = emb_cmap_encoded_size(2) + 4 * EMB_NSLOTS +
			    8 * (size_t)first;
		size_t at = emb_cmap_encoded_size(2) + 2 * first;

		buf[bt] = (uint8_t)(m->epoch + 1);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out),
				EMB_EBADFRAME);
		buf[bt] = (uint8_t)m->epoch;
		buf[bt + 4] = 3;
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out),
				EMB_EBADFRAME);
		buf[bt + 4] = 2;
		buf[bt + 6] = 2; /* the source is the target */
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out),
				EMB_EBADFRAME);
		emb_le16_store(buf + bt + 6, m->began_from[first]);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out), 0);
		buf[at] = (uint8_t)m->slot[first][0];
		buf[at + 1] = 0;
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, dense, out),
				EMB_EBADFRAME);
	}
	free(buf);
	free(out);
	free(m);
}

/* Each slot has exactly R distinct holders and no fill. */
static void check_whole(const struct emb_cmap *m)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		CU_ASSERT_EQUAL(emb_cmap_holders(m, s), m->replicas);
		CU_ASSERT_EQUAL(m->fill[s], EMB_CMAP_NONE);
	}
}

/* Runs moves to completion as a coordinator does, one chunk at a time,
 * checking that no slot ever has fewer holders than R. Returns chunks. */
static uint32_t run_join(struct emb_cmap *m, uint32_t to)
{
	uint64_t hold[EMB_NSLOTS / 64];
	uint32_t first = 0, from, chunks = 0;
	int n;

	while ((n = emb_cmap_join_next(m, to, 256, &first, &from)) > 0) {
		uint64_t e = m->epoch;

		CU_ASSERT(n <= 256);
		CU_ASSERT_NOT_EQUAL(from, to);
		CU_ASSERT_EQUAL(emb_cmap_move_begin(m, from, to, first,
						    (uint32_t)n, m), n);
		CU_ASSERT_EQUAL(m->epoch, e + 1);
		/* No eviction in a moving slot: with one copy, only there. */
		CU_ASSERT_EQUAL(emb_cmap_evict_hold(m, hold),
				m->replicas == 1 ? (uint32_t)n : EMB_NSLOTS);
		for (uint32_t s = first; s < first + (uint32_t)n; s++)
			CU_ASSERT((hold[s / 64] >> (s % 64)) & 1);
		for (uint32_t s = first; s < first + (uint32_t)n; s++) {
			uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];

			/* During the move the slot has R holders and one more
			 * writer, to. */
			CU_ASSERT_EQUAL(emb_cmap_holders(m, s), m->replicas);
			CU_ASSERT_EQUAL(emb_cmap_writers(m, s, w),
					m->replicas + 1);
			CU_ASSERT_EQUAL(w[m->replicas], to);
		}
		CU_ASSERT_EQUAL(emb_cmap_move_done(m, from, to, first,
						   (uint32_t)n, m), n);
		for (uint32_t s = first; s < first + (uint32_t)n; s++) {
			CU_ASSERT(emb_cmap_holds(m, s, to));
			CU_ASSERT(!emb_cmap_holds(m, s, from));
		}
		check_whole(m);
		chunks++;
		CU_ASSERT_FATAL(chunks < 100);
	}
	CU_ASSERT_EQUAL(n, 0);
	return chunks;
}

static void test_join(void)
{
	for (uint32_t r = 1; r <= 2; r++) {
		/* 2 servers and a third rank that holds nothing yet: the
		 * one that joins. */
		struct emb_cmap *m = new_map(2, r);
		uint32_t held[3][3];

		m->nservers = 3;
		check_whole(m);
		/* A server's share once the moves end: over the two that
		 * hold slots, then over three from the newcomer's first
		 * copy ahead on. */
		CU_ASSERT_EQUAL(emb_cmap_share(m), r * EMB_NSLOTS / 2);
		{
			struct emb_cmap *w = malloc(sizeof(*w));
			uint32_t f0 = 0, src;
			int k;

			CU_ASSERT_PTR_NOT_NULL_FATAL(w);
			memcpy(w, m, sizeof(*w));
			k = emb_cmap_join_next(w, 2, 256, &f0, &src);
			CU_ASSERT_FATAL(k > 0);
			CU_ASSERT_EQUAL(emb_cmap_warm_begin(w, src, 2, f0,
							    (uint32_t)k, w),
					k);
			CU_ASSERT_FALSE(emb_cmap_in_map(w, 2));
			CU_ASSERT_EQUAL(emb_cmap_share(w),
					(r * EMB_NSLOTS + 2) / 3);
			free(w);
		}
		CU_ASSERT(run_join(m, 2) > 0);
		CU_ASSERT_EQUAL(emb_cmap_share(m), (r * EMB_NSLOTS + 2) / 3);
		/* Every server now holds a third of the copies, within a
		 * chunk's rounding. */
		for (uint32_t k = 0; k < 3; k++) {
			emb_cmap_rank_slots(m, k, held[k]);
			CU_ASSERT(held[k][0] + held[k][1] >=
				  r * EMB_NSLOTS / 3 - 1);
			CU_ASSERT(held[k][0] + held[k][1] <=
				  r * EMB_NSLOTS / 3 + 2);
		}
		/* A second join asks nothing more. */
		uint32_t first = 0, from;
		CU_ASSERT_EQUAL(emb_cmap_join_next(m, 2, 256, &first, &from), 0);
		/* Eviction is held nowhere with one copy and no move, and
		 * in the slots copied ahead while a move copies them. */
		uint64_t hold[EMB_NSLOTS / 64];
		const bool ok[3] = {true, true, true};
		int warm;

		CU_ASSERT_EQUAL(emb_cmap_evict_hold(m, hold),
				r == 1 ? 0 : EMB_NSLOTS);
		first = 0;
		CU_ASSERT_EQUAL_FATAL(
		    emb_cmap_drain_next(m, 0, ok, 64, &first, &from), 64);
		warm = emb_cmap_warm_begin(m, 0, from, first, 64, m);
		CU_ASSERT_EQUAL(warm, 64);
		CU_ASSERT_EQUAL(emb_cmap_evict_hold(m, hold),
				r == 1 ? 64 : EMB_NSLOTS);
		CU_ASSERT((hold[first / 64] >> (first % 64)) & 1);
		free(m);
	}
}

static void test_drain(void)
{
	for (uint32_t r = 1; r <= 2; r++) {
		struct emb_cmap *m = new_map(3, r);
		bool ok[3] = {false, true, true};
		uint32_t first = 0, to, chunks = 0, held[3];
		int n;

		while ((n = emb_cmap_drain_next(m, 0, ok, 256, &first, &to)) >
		       0) {
			CU_ASSERT(to == 1 || to == 2);
			CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, to, first,
							    (uint32_t)n, m),
					n);
			CU_ASSERT_EQUAL(emb_cmap_move_done(m, 0, to, first,
							   (uint32_t)n, m),
					n);
			check_whole(m);
			CU_ASSERT_FATAL(++chunks < 100);
		}
		CU_ASSERT_EQUAL(n, 0);
		emb_cmap_rank_slots(m, 0, held);
		CU_ASSERT_EQUAL(held[0] + held[1] + held[2], 0);
		/* The two left share the copies evenly. */
		emb_cmap_rank_slots(m, 1, held);
		CU_ASSERT(held[0] + held[1] >= r * EMB_NSLOTS / 2 - 256);
		/* With R = 2 and two servers, a further drain has nowhere
		 * to go. */
		if (r == 2) {
			bool ok2[3] = {false, false, true};
			first = 0;
			CU_ASSERT_EQUAL(emb_cmap_drain_next(m, 1, ok2, 256,
							    &first, &to),
					-ENOSPC);
		}
		free(m);
	}
}

static void test_move_edges(void)
{
	struct emb_cmap *m = new_map(3, 2);
	uint64_t e;
	uint32_t first = 0, to;
	bool ok[3] = {true, true, true};
	int n;

	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, 0, 0, 1, m), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, 3, 0, 1, m), -EINVAL);
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, 1, EMB_NSLOTS, 1, m),
			-EINVAL);
	/* A slot to holds already, or one from does not hold, is left. */
	e = m->epoch;
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, 1, 0, 1, m), 0);
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 2, 1, 0, 1, m), 0);
	CU_ASSERT_EQUAL(m->epoch, e);
	n = emb_cmap_drain_next(m, 0, ok, 8, &first, &to);
	CU_ASSERT_EQUAL(n, 8);
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 0, to, first, 8, m), 8);
	/* Slots under a move are not picked again. */
	uint32_t f2 = first;
	CU_ASSERT(emb_cmap_drain_next(m, 0, ok, 8, &f2, &to) > 0);
	CU_ASSERT(f2 >= first + 8 || f2 < first);
	/* The source's death ends the move: remove() drops the fill, and
	 * move_done() then changes nothing. */
	emb_cmap_remove(m, 0, m);
	e = m->epoch;
	CU_ASSERT_EQUAL(emb_cmap_move_done(m, 0, to, first, 8, m), 0);
	CU_ASSERT_EQUAL(m->epoch, e);
	free(m);
}

/* A move's copy ahead: warm[] marks the chunk for its target without
 * making it a writer or fencing anything, move_begin() ends it, the
 * encoding is version 3, and deaths end it. */
static void test_warm(void)
{
	struct emb_cmap *m = new_map(3, 2), *out = malloc(sizeof(*out));
	uint8_t flags[EMB_NSLOTS];
	uint32_t grew[EMB_NSLOTS] = {0}, first = 0, to, f, t;
	bool ok[3] = {true, true, false};
	size_t sz = emb_cmap_encoded_size(2) + 4 * EMB_NSLOTS;
	uint8_t *buf = malloc(sz);
	uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
	uint64_t e;
	int n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	/* Rank 2 drains: its first chunk goes to 0 or 1. */
	n = emb_cmap_drain_next(m, 2, ok, 16, &first, &to);
	CU_ASSERT_FATAL(n > 0);
	CU_ASSERT_EQUAL(emb_cmap_warm_begin(m, 2, 2, first, 3, m), -EINVAL);
	e = m->epoch;
	CU_ASSERT_EQUAL(emb_cmap_warm_begin(m, 2, to, first, (uint32_t)n, m),
			n);
	CU_ASSERT_EQUAL(m->epoch, e + 1);
	/* The same again changes nothing. */
	CU_ASSERT_EQUAL(emb_cmap_warm_begin(m, 2, to, first, (uint32_t)n, m),
			n);
	CU_ASSERT_EQUAL(m->epoch, e + 1);
	/* No writer is added, and only the target's view marks it. */
	CU_ASSERT_EQUAL(emb_cmap_writers(m, first, w), 2);
	emb_cmap_view(m, NULL, grew, to, flags, grew);
	CU_ASSERT_EQUAL(flags[first], EMB_CMAP_VIEW_WARMING);
	emb_cmap_view(m, NULL, grew, emb_cmap_primary(m, first), flags, grew);
	CU_ASSERT_EQUAL(flags[first], EMB_CMAP_VIEW_MINE);
	CU_ASSERT_EQUAL(emb_cmap_warm_source(m, emb_cmap_primary(m, first), &f,
					     &t),
			(uint32_t)n);
	CU_ASSERT_EQUAL(f, first);
	CU_ASSERT_EQUAL(t, to);
	CU_ASSERT_EQUAL(emb_cmap_fill_source(m, emb_cmap_primary(m, first),
					     &f, &t),
			0);
	/* Version 3 round-trips; a copy ahead to a holder is refused. */
	CU_ASSERT_EQUAL(emb_cmap_size(m), sz);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz), (int64_t)sz);
	CU_ASSERT_EQUAL(buf[4], 3);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), 0);
	CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
	{
		size_t at = emb_cmap_encoded_size(2) + 2 * EMB_NSLOTS +
			    2 * first;

		buf[at] = (uint8_t)m->slot[first][0];
		buf[at + 1] = 0;
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, sz, out), EMB_EBADFRAME);
	}
	/* The fence ends the copy ahead, in one epoch. */
	e = m->epoch;
	CU_ASSERT_EQUAL(emb_cmap_move_begin(m, 2, to, first, (uint32_t)n, m),
			n);
	CU_ASSERT_EQUAL(m->epoch, e + 1);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		CU_ASSERT_EQUAL(m->warm[s], EMB_CMAP_NONE);
	/* The fenced stream is a fill begun: version 7 (its fill and its
	 * starts, 4 and 10 bytes a slot of the chunk), its source the
	 * chunk's primary. */
	CU_ASSERT_EQUAL(m->began[first], m->epoch);
	CU_ASSERT_EQUAL(m->began_to[first], to);
	CU_ASSERT_EQUAL(m->began_from[first], emb_cmap_primary(m, first));
	CU_ASSERT_EQUAL(emb_cmap_size(m),
			emb_cmap_encoded_size(2) + 6 + 14 * (size_t)n);
	CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, sz), (int64_t)emb_cmap_size(m));
	CU_ASSERT_EQUAL(buf[4], 7);
	CU_ASSERT_EQUAL(emb_cmap_decode(buf, emb_cmap_size(m), out), 0);
	CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
	CU_ASSERT_EQUAL(emb_cmap_move_done(m, 2, to, first, (uint32_t)n, m),
			n);
	/* A death of the target ends a copy ahead; warm_end() ends any. */
	first = 0;
	n = emb_cmap_drain_next(m, 2, ok, 16, &first, &to);
	CU_ASSERT_FATAL(n > 0);
	emb_cmap_warm_begin(m, 2, to, first, (uint32_t)n, m);
	*out = *m;
	e = m->epoch;
	emb_cmap_remove(m, to, m);
	CU_ASSERT_EQUAL(m->warm[first], EMB_CMAP_NONE);
	CU_ASSERT_EQUAL(emb_cmap_warm_end(out, out), n);
	CU_ASSERT_EQUAL(out->epoch, e + 1);
	CU_ASSERT_EQUAL(emb_cmap_warm_end(out, out), 0);
	CU_ASSERT_EQUAL(out->epoch, e + 1);
	free(buf);
	free(out);
	free(m);
}

/*
 * The hole a fill's start epoch closes: slots fenced for a fill into T
 * from P, whose other holder is F; P dies and T is filled again from F.
 * T is a writer before and after, so comparing writers sees no growth;
 * began[] does, for a view that skipped the epochs between as for one
 * that saw them, and a client finds T's copy of a write routed before
 * void.
 */
static void test_fill_again(void)
{
	struct emb_cmap *m = new_map(4, 3), *a = malloc(sizeof(*a));
	uint32_t *grew = calloc(EMB_NSLOTS, sizeof(*grew));
	uint8_t *flags = malloc(EMB_NSLOTS);
	uint32_t first = 0, p, f;
	uint64_t routed;
	int n;

	CU_ASSERT_FATAL(a && grew && flags);
	emb_cmap_remove(m, 3, m); /* rank 3 is taken by a newcomer, T */
	n = emb_cmap_fill_next(m, 3, 16, &first);
	CU_ASSERT_FATAL(n > 0);
	emb_cmap_fill_begin(m, 3, first, (uint32_t)n, m);
	routed = m->epoch; /* a write routed now goes to P, F and T */
	p = emb_cmap_primary(m, first);
	f = m->slot[first][1];
	CU_ASSERT_FATAL(f != EMB_CMAP_NONE);
	*a = *m;
	emb_cmap_view(a, NULL, grew, 3, flags, grew);
	CU_ASSERT_EQUAL(grew[first], routed);
	/* P dies: the fill ends with it; T is filled again, from F. */
	emb_cmap_remove(m, p, m);
	CU_ASSERT_EQUAL(m->fill[first], EMB_CMAP_NONE);
	CU_ASSERT_EQUAL(emb_cmap_fill_next(m, 3, 16, &first), n);
	emb_cmap_fill_begin(m, 3, first, (uint32_t)n, m);
	CU_ASSERT_EQUAL(emb_cmap_primary(m, first), f);
	/* A view that skipped the death's epoch: writers {F, T} against
	 * {P, F, T}, no growth by comparison; the fill's start says. */
	emb_cmap_view(m, a, grew, f, flags, grew);
	CU_ASSERT_EQUAL(grew[first], m->epoch);
	CU_ASSERT(emb_cmap_refilled(m, first, 3, routed));
	CU_ASSERT(!emb_cmap_refilled(m, first, f, routed));
	/* And after the fill ends, T a holder: still void. */
	emb_cmap_fill_done(m, 3, first, (uint32_t)n, m);
	CU_ASSERT(emb_cmap_holds(m, first, 3));
	CU_ASSERT(emb_cmap_refilled(m, first, 3, routed));
	free(flags);
	free(grew);
	free(a);
	free(m);

	/* The largest map a CLUSTER_MAP answer carries: version 6 at the
	 * most copies, every slot filled with a fill start and its source
	 * (version 7, 14 bytes a slot then, would be larger, so it is not
	 * written). */
	m = new_map(EMB_WIRE_REPLICAS_MAX + 1, EMB_WIRE_REPLICAS_MAX);
	emb_cmap_remove(m, 0, m);
	first = 0;
	n = emb_cmap_fill_next(m, 0, 16, &first);
	CU_ASSERT_FATAL(n > 0);
	emb_cmap_fill_begin(m, 0, first, (uint32_t)n, m);
	CU_ASSERT(emb_cmap_size(m) < EMB_WIRE_MAP_CMAP_MAX);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		m->fill[sl] = 0;
		if (!m->began[sl]) {
			m->began[sl] = 1;
			m->began_to[sl] = 0;
			m->began_from[sl] = 1;
		}
	}
	CU_ASSERT_EQUAL(emb_cmap_size(m), EMB_WIRE_MAP_CMAP_MAX);
	{
		uint8_t *buf = malloc(EMB_WIRE_MAP_CMAP_MAX);
		struct emb_cmap *out = malloc(sizeof(*out));

		CU_ASSERT_FATAL(buf && out);
		CU_ASSERT_EQUAL(emb_cmap_encode(m, buf, EMB_WIRE_MAP_CMAP_MAX),
				(int64_t)EMB_WIRE_MAP_CMAP_MAX);
		CU_ASSERT_EQUAL(buf[4], 6);
		CU_ASSERT_EQUAL(emb_cmap_decode(buf, EMB_WIRE_MAP_CMAP_MAX, out),
				0);
		CU_ASSERT_EQUAL(memcmp(m, out, sizeof(*m)), 0);
		free(buf);
		free(out);
	}
	free(m);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"the first map: contiguous primaries, successors as backups",
	     test_init},
	    {"a dead server's slots go to their first backup", test_remove},
	    {"a backup made primary: the slots it was promoted in",
	     test_promoted},
	    {"with replicas only a slot's primary evicts; with one copy, "
	     "no server where a slot has two writers",
	     test_evict_hold_rank},
	    {"a joining server fills under-replicated slots", test_add},
	    {"the encoding round-trips and refuses bad maps", test_encode},
	    {"recovery: a replacement filled chunk by chunk, then the "
	     "rebalance",
	     test_recover},
	    {"a fill ends with its newcomer's or its source's death",
	     test_fill_deaths},
	    {"a fill begun again into the same server from another source "
	     "is seen by its start epoch",
	     test_fill_again},
	    {"a map with a fill begun encodes as version 5, or 4 where smaller", test_encode_fill},
	    {"a join moves a fair share to the new server, R holders "
	     "throughout",
	     test_join},
	    {"a drain moves every slot off a server, evenly", test_drain},
	    {"moves leave slots they cannot take; a source's death ends one",
	     test_move_edges},
	    {"a move's copy ahead: no writer, no fence, version 3, ended by "
	     "the fence or a death",
	     test_warm},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cmap", cases);
}
