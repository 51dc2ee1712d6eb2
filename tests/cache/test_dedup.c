/* tests/cache/test_dedup.c - emb_dedup against a quadratic reference. */
#include "cache/dedup.h"

#include <errno.h>
#include <stdlib.h>

#include "common/hash.h"
#include "harness.h"

#define MAXB 4096u

/* Distinct ids in first-appearance order, by brute force. */
static uint32_t ref_dedup(const uint64_t *ids, uint32_t n, uint64_t *uniq,
			  uint32_t *inv)
{
	uint32_t nu = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t u;

		for (u = 0; u < nu; u++) {
			if (uniq[u] == ids[i])
				break;
		}
		if (u == nu)
			uniq[nu++] = ids[i];
		inv[i] = u;
	}
	return nu;
}

static void test_random_vs_reference(void)
{
	static uint64_t ids[MAXB], uniq[MAXB], ruq[MAXB];
	static uint32_t inv[MAXB], rinv[MAXB];
	struct emb_dedup *d;
	uint64_t rng = 42;

	CU_ASSERT_EQUAL_FATAL(emb_dedup_create(MAXB, &d), 0);
	for (int round = 0; round < 200; round++) {
		uint32_t n = (uint32_t)(emb_splitmix64(&rng) % (MAXB + 1));
		/* From all-duplicates to nearly all-distinct. */
		uint64_t range = 1 + emb_splitmix64(&rng) % (4 * MAXB);
		int got;
		uint32_t want;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = emb_splitmix64(&rng) % range * 0x10001ull;
		got = emb_dedup_run(d, ids, n, uniq, inv);
		want = ref_dedup(ids, n, ruq, rinv);
		CU_ASSERT_EQUAL_FATAL(got, (int)want);
		for (uint32_t u = 0; u < want; u++)
			CU_ASSERT_EQUAL_FATAL(uniq[u], ruq[u]);
		for (uint32_t i = 0; i < n; i++) {
			CU_ASSERT_EQUAL_FATAL(inv[i], rinv[i]);
			CU_ASSERT_EQUAL_FATAL(uniq[inv[i]], ids[i]);
		}
	}
	emb_dedup_destroy(d);
}

static void test_batches_independent(void)
{
	const uint64_t a[] = {5, 6, 7, 5};
	const uint64_t b[] = {7, 8, 7};
	uint64_t uniq[4];
	uint32_t inv[4];
	struct emb_dedup *d;

	CU_ASSERT_EQUAL_FATAL(emb_dedup_create(4, &d), 0);
	CU_ASSERT_EQUAL(emb_dedup_run(d, a, 4, uniq, inv), 3);
	CU_ASSERT_EQUAL(emb_dedup_run(d, b, 3, uniq, inv), 2);
	CU_ASSERT_EQUAL(uniq[0], 7);
	CU_ASSERT_EQUAL(uniq[1], 8);
	CU_ASSERT_EQUAL(inv[0], 0);
	CU_ASSERT_EQUAL(inv[1], 1);
	CU_ASSERT_EQUAL(inv[2], 0);
	emb_dedup_destroy(d);
}

static void test_limits(void)
{
	uint64_t ids[3] = {1, 2, 3}, uniq[3];
	uint32_t inv[3];
	struct emb_dedup *d = NULL;

	CU_ASSERT_EQUAL(emb_dedup_create(0, &d), -EINVAL);
	CU_ASSERT_EQUAL(emb_dedup_create((1u << 30) + 1, &d), -EINVAL);
	CU_ASSERT_PTR_NULL(d);
	CU_ASSERT_EQUAL_FATAL(emb_dedup_create(2, &d), 0);
	CU_ASSERT_EQUAL(emb_dedup_run(d, ids, 3, uniq, inv), -EINVAL);
	CU_ASSERT_EQUAL(emb_dedup_run(d, ids, 0, uniq, inv), 0);
	CU_ASSERT_EQUAL(emb_dedup_run(d, ids, 2, uniq, inv), 2);
	emb_dedup_destroy(d);
	emb_dedup_destroy(NULL);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"matches reference on random batches", test_random_vs_reference},
	    {"forgets the previous batch", test_batches_independent},
	    {"rejects oversized batch and bad size", test_limits},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cache/dedup", cases);
}
