/*
 * tests/cluster/test_map.c - the replicated cluster map: the first map
 * (R = 1 is the contiguous map of a plain server list), failover that
 * promotes the first backup left, joins that fill under-replicated slots,
 * lost slots, and the encoding's round trip and refusals. Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/map.h"
#include "common/err.h"
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

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"the first map: contiguous primaries, successors as backups",
	     test_init},
	    {"a dead server's slots go to their first backup", test_remove},
	    {"a joining server fills under-replicated slots", test_add},
	    {"the encoding round-trips and refuses bad maps", test_encode},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cmap", cases);
}
