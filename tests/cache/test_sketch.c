/*
 * tests/cache/test_sketch.c - the TinyLFU frequency sketch: counts, the
 * 4-bit ceiling, halving after the sample period, and rare ids told apart
 * from frequent ones when many ids share the counters.
 */
#include "cache/sketch.h"

#include <errno.h>

#include "common/hash.h"
#include "harness.h"

static void test_create_limits(void)
{
	struct emb_sketch *s = NULL;

	CU_ASSERT_EQUAL(emb_sketch_create(0, 0, &s), -EINVAL);
	CU_ASSERT_EQUAL(emb_sketch_create((1u << 30) + 1, 0, &s), -EINVAL);
	CU_ASSERT_PTR_NULL(s);
	CU_ASSERT_EQUAL_FATAL(emb_sketch_create(1, 0, &s), 0);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 42), 0);
	emb_sketch_destroy(s);
	emb_sketch_destroy(NULL);
}

/* Alone in a large sketch, an id's estimate is its count, up to 15. */
static void test_counts_up_to_15(void)
{
	struct emb_sketch *s = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_sketch_create(1024, 1u << 20, &s), 0);
	for (uint32_t k = 1; k <= 20; k++) {
		emb_sketch_add(s, 7);
		CU_ASSERT_EQUAL(emb_sketch_estimate(s, 7),
				k < EMB_SKETCH_MAX ? k : EMB_SKETCH_MAX);
	}
	for (uint32_t k = 0; k < 5; k++)
		emb_sketch_add(s, 8);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 8), 5);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 7), EMB_SKETCH_MAX);
	CU_ASSERT_EQUAL(emb_sketch_halvings(s), 0);
	emb_sketch_destroy(s);
}

/*
 * Aging: after `sample` counted additions every count is halved (rounded
 * down), so an id that stops being seen fades; saturated adds are not
 * counted towards the sample.
 */
static void test_halves_after_sample(void)
{
	struct emb_sketch *s = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_sketch_create(1024, 100, &s), 0);
	for (uint32_t k = 0; k < 11; k++)
		emb_sketch_add(s, 1);
	for (uint32_t k = 0; k < 20; k++)
		emb_sketch_add(s, 2); /* 15 counted, 5 saturated */
	for (uint64_t id = 100; id < 173; id++)
		emb_sketch_add(s, id); /* additions 27..99 */
	CU_ASSERT_EQUAL(emb_sketch_halvings(s), 0);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 1), 11);
	emb_sketch_add(s, 3); /* the 100th */
	CU_ASSERT_EQUAL(emb_sketch_halvings(s), 1);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 1), 5);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 2), 7);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 3), 0);
	/* Half the sample later it halves again. */
	for (uint64_t id = 1000; id < 1049; id++)
		emb_sketch_add(s, id);
	CU_ASSERT_EQUAL(emb_sketch_halvings(s), 1);
	emb_sketch_add(s, 2000);
	CU_ASSERT_EQUAL(emb_sketch_halvings(s), 2);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 1), 2);
	CU_ASSERT_EQUAL(emb_sketch_estimate(s, 2), 3);
	emb_sketch_destroy(s);
}

/*
 * A sketch sized for 1000 rows sees 1000 ids 8 times each and 20000 ids
 * once, without halving: estimates never fall below the truth, and
 * collisions leave the one-off ids far below the frequent ones.
 */
static void test_rare_ids_stay_low(void)
{
	struct emb_sketch *s = NULL;
	uint64_t rng = 5, sum = 0, over = 0;

	CU_ASSERT_EQUAL_FATAL(emb_sketch_create(1000, 1u << 30, &s), 0);
	for (uint32_t round = 0; round < 8; round++) {
		for (uint64_t id = 0; id < 1000; id++)
			emb_sketch_add(s, emb_id_hash(id));
		for (uint32_t k = 0; k < 2500; k++)
			emb_sketch_add(s, emb_splitmix64(&rng) | (1ull << 63));
	}
	for (uint64_t id = 0; id < 1000; id++)
		CU_ASSERT(emb_sketch_estimate(s, emb_id_hash(id)) >= 8);
	rng = 5;
	for (uint32_t round = 0; round < 8; round++) {
		for (uint32_t k = 0; k < 2500; k++) {
			uint32_t e = emb_sketch_estimate(
			    s, emb_splitmix64(&rng) | (1ull << 63));

			CU_ASSERT(e >= 1);
			sum += e;
			over += e >= 8;
		}
	}
	/* 21 ids per row of capacity share the counters: a one-off id
	 * averages under 3 (2.6 here), and under 1% look frequent (0.3%). */
	CU_ASSERT(sum <= 20000 * 3);
	CU_ASSERT(over <= 200);
	emb_sketch_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"rejects bad sizes", test_create_limits},
	    {"counts an id up to 15", test_counts_up_to_15},
	    {"halves every count after the sample period",
	     test_halves_after_sample},
	    {"one-off ids stay far below frequent ones",
	     test_rare_ids_stay_low},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "cache/sketch", cases);
}
