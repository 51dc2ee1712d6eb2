/*
 * tests/cache/test_dedup_wrap.c - emb_dedup across its batch stamp's wrap.
 * The table is never cleared between batches: a slot is live only if the
 * running batch stamped it. After 2^32 batches the stamp comes back to
 * values old slots still hold, and the table must be cleared then. This
 * file builds dedup.c itself, to set the stamp next to its wrap.
 */
#include "../../src/cache/dedup.c"

#include "harness.h"

/* The batch right after the wrap sees none of the ids of the batch whose
 * stamp it reuses. */
static void test_wrap_clears(void)
{
	const uint64_t a[] = {11, 12, 13, 11};
	const uint64_t b[] = {12, 14, 12, 11, 15};
	uint64_t uniq[5];
	uint32_t inv[5];
	struct emb_dedup *d = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_dedup_create(8, &d), 0);
	/* Stamp 1: a's ids. */
	CU_ASSERT_EQUAL(emb_dedup_run(d, a, 4, uniq, inv), 3);
	CU_ASSERT_EQUAL(d->gen, 1u);
	/* 2^32 - 2 batches later: the next one wraps to stamp 1 again. */
	d->gen = UINT32_MAX;
	CU_ASSERT_EQUAL(emb_dedup_run(d, b, 5, uniq, inv), 4);
	CU_ASSERT_EQUAL(d->gen, 1u);
	CU_ASSERT_EQUAL(uniq[0], 12);
	CU_ASSERT_EQUAL(uniq[1], 14);
	CU_ASSERT_EQUAL(uniq[2], 11);
	CU_ASSERT_EQUAL(uniq[3], 15);
	CU_ASSERT_EQUAL(inv[0], 0);
	CU_ASSERT_EQUAL(inv[1], 1);
	CU_ASSERT_EQUAL(inv[2], 0);
	CU_ASSERT_EQUAL(inv[3], 2);
	CU_ASSERT_EQUAL(inv[4], 3);
	/* And the batch after it, stamp 2, is its own again. */
	CU_ASSERT_EQUAL(emb_dedup_run(d, a, 4, uniq, inv), 3);
	CU_ASSERT_EQUAL(uniq[0], 11);
	CU_ASSERT_EQUAL(inv[3], 0);
	emb_dedup_destroy(d);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"the stamp's wrap clears the table", test_wrap_clears},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cache/dedup_wrap", cases);
}
