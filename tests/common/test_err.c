/*
 * tests/common/test_err.c - emb_strerror() names every code, and the code
 * list keeps its rules (own codes below -1000, no value used twice).
 * Single-threaded.
 */
#include <errno.h>
#include <string.h>

#include "harness.h"

#include "common/err.h"

#define ERR_ENTRY(name, value, msg) {#name, value, msg},
static const struct {
	const char *name;
	int value;
	const char *msg;
} codes[] = {EMB_ERR_LIST(ERR_ENTRY)};
#undef ERR_ENTRY

#define NCODES (sizeof(codes) / sizeof(codes[0]))

static void test_own_codes(void)
{
	for (size_t i = 0; i < NCODES; i++) {
		CU_ASSERT(codes[i].value < -1000);
		CU_ASSERT_STRING_EQUAL(emb_strerror(codes[i].value),
				       codes[i].msg);
		for (size_t j = i + 1; j < NCODES; j++) {
			CU_ASSERT_NOT_EQUAL(codes[i].value, codes[j].value);
			CU_ASSERT(strcmp(codes[i].msg, codes[j].msg) != 0);
		}
	}
}

static void test_errno_and_unknown(void)
{
	CU_ASSERT_STRING_EQUAL(emb_strerror(0), "success");
	CU_ASSERT_STRING_EQUAL(emb_strerror(-EINVAL), strerrordesc_np(EINVAL));
	CU_ASSERT_STRING_EQUAL(emb_strerror(-ENOMEM), strerrordesc_np(ENOMEM));
	CU_ASSERT_STRING_EQUAL(emb_strerror(-1999), "unknown error");
	CU_ASSERT_STRING_EQUAL(emb_strerror(-100000), "unknown error");
	CU_ASSERT_STRING_EQUAL(emb_strerror(5), "unknown error");
	CU_ASSERT_PTR_NOT_NULL(emb_strerror(-4095));
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"own codes are unique, below -1000 and named", test_own_codes},
	    {"names 0, negative errno and unknown codes",
	     test_errno_and_unknown},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/err", cases);
}
