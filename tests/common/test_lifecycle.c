/*
 * tests/common/test_lifecycle.c - admission and eviction specs: parsing,
 * formatting back, and the checks of emb_lifecycle_validate().
 */
#include <math.h>
#include <string.h>

#include "harness.h"

#include "common/err.h"
#include "common/lifecycle.h"

static void round_trip(const char *admit, const char *evict)
{
	struct emb_lifecycle_cfg c = EMB_LIFECYCLE_CFG_DEFAULT, d = c;
	char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];

	CU_ASSERT_EQUAL(emb_admit_parse(admit, &c), 0);
	CU_ASSERT_EQUAL(emb_evict_parse(evict, &c), 0);
	emb_admit_format(&c, a, sizeof(a));
	emb_evict_format(&c, e, sizeof(e));
	CU_ASSERT_EQUAL(emb_admit_parse(a, &d), 0);
	CU_ASSERT_EQUAL(emb_evict_parse(e, &d), 0);
	CU_ASSERT_EQUAL(memcmp(&c, &d, sizeof(c)), 0);
}

static void test_parse(void)
{
	struct emb_lifecycle_cfg c = EMB_LIFECYCLE_CFG_DEFAULT;
	char buf[EMB_LIFECYCLE_STR_MAX];

	CU_ASSERT_TRUE(emb_lifecycle_is_off(&c));
	CU_ASSERT_EQUAL(emb_admit_parse("count:2", &c), 0);
	CU_ASSERT_EQUAL(c.admit, EMB_ADMIT_COUNT);
	CU_ASSERT_EQUAL(c.admit_n, 2);
	CU_ASSERT_FALSE(emb_lifecycle_is_off(&c));
	CU_ASSERT_EQUAL(emb_admit_parse("bloom:3:64m", &c), 0);
	CU_ASSERT_EQUAL(c.admit, EMB_ADMIT_BLOOM);
	CU_ASSERT_EQUAL(c.admit_n, 3);
	CU_ASSERT_EQUAL(c.bloom_bytes, 64u << 20);
	CU_ASSERT_EQUAL(
	    emb_evict_parse("ttl:1000,min_l2:0.25,max_rows:5:lfu", &c), 0);
	CU_ASSERT_EQUAL(c.ttl_steps, 1000);
	CU_ASSERT_EQUAL(c.min_l2, 0.25f);
	CU_ASSERT_EQUAL(c.max_rows, 5);
	CU_ASSERT_EQUAL(c.order, EMB_EVICT_LFU);
	/* The admission fields survive an eviction parse and back. */
	CU_ASSERT_EQUAL(c.admit_n, 3);
	emb_evict_format(&c, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "ttl:1000,min_l2:0.25,max_rows:5:lfu");
	emb_admit_format(&c, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "bloom:3:67108864");
	CU_ASSERT_EQUAL(emb_evict_parse("none", &c), 0);
	CU_ASSERT_EQUAL(emb_admit_parse("none", &c), 0);
	CU_ASSERT_TRUE(emb_lifecycle_is_off(&c));
	emb_evict_format(&c, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "none");
	round_trip("count:65535", "max_rows:1");
	round_trip("bloom:255", "min_l2:1e-3,ttl:1");
}

static void test_rejects(void)
{
	static const char *const bad_admit[] = {
	    "",		"count",       "count:",     "count:1",
	    "count:0",	"count:65536", "count:2x",   "count:-2",
	    "count: 2", "bloom:256",   "bloom:2:1k", "bloom:2:3g",
	    "bloom:2:", "bloom:2:8q",  "lru:2",	     "count:2,ttl:3",
	    "none:1",	NULL};
	static const char *const bad_evict[] = {"",
						"ttl",
						"ttl:0",
						"ttl:4294967296",
						"ttl:1,ttl:2",
						"min_l2:0",
						"min_l2:-1",
						"min_l2:nan",
						"min_l2:inf",
						"max_rows:0",
						"max_rows:5:mru",
						"max_rows:5:",
						"ttl:5,",
						",ttl:5",
						"count:2",
						"ttl:5,,min_l2:1",
						NULL};
	struct emb_lifecycle_cfg c = EMB_LIFECYCLE_CFG_DEFAULT, before;

	CU_ASSERT_EQUAL(emb_admit_parse("count:7", &c), 0);
	CU_ASSERT_EQUAL(emb_evict_parse("ttl:9", &c), 0);
	before = c;
	for (int i = 0; bad_admit[i]; i++) {
		if (emb_admit_parse(bad_admit[i], &c) != EMB_EBADLIFE)
			fprintf(stderr, "\n    admit \"%s\" accepted",
				bad_admit[i]);
		CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof(c)), 0);
	}
	for (int i = 0; bad_evict[i]; i++) {
		if (emb_evict_parse(bad_evict[i], &c) != EMB_EBADLIFE)
			fprintf(stderr, "\n    evict \"%s\" accepted",
				bad_evict[i]);
		CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof(c)), 0);
	}
	c = (struct emb_lifecycle_cfg){.admit = 3, .admit_n = 2};
	CU_ASSERT_EQUAL(emb_lifecycle_validate(&c), EMB_EBADLIFE);
	c = (struct emb_lifecycle_cfg){.admit_n = 2};
	CU_ASSERT_EQUAL(emb_lifecycle_validate(&c), EMB_EBADLIFE);
	c = (struct emb_lifecycle_cfg){
	    .admit = EMB_ADMIT_COUNT, .admit_n = 2, .bloom_bytes = 1 << 20};
	CU_ASSERT_EQUAL(emb_lifecycle_validate(&c), EMB_EBADLIFE);
	c = (struct emb_lifecycle_cfg){.order = 2};
	CU_ASSERT_EQUAL(emb_lifecycle_validate(&c), EMB_EBADLIFE);
	c = (struct emb_lifecycle_cfg){.min_l2 = INFINITY};
	CU_ASSERT_EQUAL(emb_lifecycle_validate(&c), EMB_EBADLIFE);
	CU_ASSERT_EQUAL(emb_lifecycle_validate(NULL), EMB_EBADARG);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"parses and formats back", test_parse},
	    {"rejects bad specs and leaves the config", test_rejects},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/lifecycle", cases);
}
