/*
 * tests/common/test_seconds.c - the one parser of durations in seconds:
 * fractions accepted, junk, negatives, NaN and overflow refused.
 * Single-threaded.
 */
#include <errno.h>
#include <stdint.h>

#include "harness.h"

#include "common/seconds.h"

static uint64_t ms_of(const char *s)
{
	uint64_t ms = 777;

	CU_ASSERT_EQUAL(emb_seconds_parse(s, 0, UINT64_MAX, &ms), 0);
	return ms;
}

static void test_forms(void)
{
	CU_ASSERT_EQUAL(ms_of("30"), 30000);
	CU_ASSERT_EQUAL(ms_of("1.5"), 1500);
	CU_ASSERT_EQUAL(ms_of("0.25"), 250);
	CU_ASSERT_EQUAL(ms_of(".5"), 500);
	CU_ASSERT_EQUAL(ms_of("2e-3"), 2);
	CU_ASSERT_EQUAL(ms_of("1E2"), 100000);
	CU_ASSERT_EQUAL(ms_of("+3"), 3000);
	CU_ASSERT_EQUAL(ms_of("0"), 0);
	CU_ASSERT_EQUAL(ms_of("0.0015"), 2); /* nearest ms */
	CU_ASSERT_EQUAL(ms_of("0.0014"), 1);
	/* Above zero never rounds to 0, which means "none" to most users. */
	CU_ASSERT_EQUAL(ms_of("0.0001"), 1);
	CU_ASSERT_EQUAL(ms_of("86400"), 86400000);
}

static void test_refusals(void)
{
	static const char *junk[] = {
	    "",	   "abc",  "1.5s", "1,5", " 1", "1 ",	 "nan", "NaN",
	    "inf", "0x10", "1e",   "--1", "e3", "1.2.3", "+",	"-",
	};
	static const char *range[] = {"-1", "-0.5", "1e300", "1e20"};
	uint64_t ms = 777;

	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
		CU_ASSERT_EQUAL(emb_seconds_parse(junk[i], 0, UINT64_MAX, &ms),
				-EINVAL);
	for (size_t i = 0; i < sizeof(range) / sizeof(range[0]); i++)
		CU_ASSERT_EQUAL(emb_seconds_parse(range[i], 0, UINT64_MAX, &ms),
				-ERANGE);
	CU_ASSERT_EQUAL(emb_seconds_parse(NULL, 0, 1, &ms), -EINVAL);
	CU_ASSERT_EQUAL(ms, 777); /* untouched on failure */
}

static void test_bounds(void)
{
	uint64_t ms = 0;

	CU_ASSERT_EQUAL(emb_seconds_parse("0", 1, 1000, &ms), -ERANGE);
	CU_ASSERT_EQUAL(emb_seconds_parse("1.001", 1, 1000, &ms), -ERANGE);
	CU_ASSERT_EQUAL(emb_seconds_parse("1", 1, 1000, &ms), 0);
	CU_ASSERT_EQUAL(ms, 1000);
	CU_ASSERT_STRING_EQUAL(emb_seconds_strerror(-ERANGE), "out of range");
	CU_ASSERT_PTR_NOT_NULL(emb_seconds_strerror(-EINVAL));
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"accepts whole and fractional seconds", test_forms},
	    {"refuses junk, negatives, NaN and overflow", test_refusals},
	    {"keeps to the caller's bounds", test_bounds},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/seconds", cases);
}
