/* tests/harness.c - CUnit runner shared by every test executable. */
#include "harness.h"

#include <CUnit/Basic.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

int emb_test_main(int argc, char **argv, const char *suite,
		  const struct emb_test_case *cases)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	unsigned int failed, run;
	CU_pSuite s;

	if (getenv("EMB_TEST_LOG")) {
		enum emb_log_level lvl;

		if (emb_log_parse_level(getenv("EMB_TEST_LOG"), &lvl) == 0)
			emb_log_set_level(lvl);
	} else {
		emb_log_set_level(EMB_LOG_WARN);
	}
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite(suite, NULL, NULL);
	if (!s)
		goto err;
	for (const struct emb_test_case *c = cases; c->name; c++) {
		if (filter && !strstr(c->name, filter))
			continue;
		if (!CU_add_test(s, c->name, c->fn))
			goto err;
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	failed = CU_get_number_of_tests_failed();
	run = CU_get_number_of_tests_run();
	printf("\n%s: %u cases, %u passed, %u failed\n", suite, run,
	       run - failed, failed);
	CU_cleanup_registry();
	/* A filter that names no case ran nothing: that is no pass (a
	 * case renamed under a filter someone relies on, a typo). */
	if (!run) {
		fprintf(stderr, "%s: no case matches '%s'\n", suite,
			filter ? filter : "");
		return 1;
	}
	return failed ? 1 : 0;
err:
	fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
	CU_cleanup_registry();
	return 1;
}

char *emb_test_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char *path;

	if (!base || !*base)
		base = "/tmp";
	if (asprintf(&path, "%s/embstore-test.XXXXXX", base) < 0)
		return NULL;
	if (!mkdtemp(path)) {
		free(path);
		return NULL;
	}
	return path;
}

char *emb_test_shmdir(void)
{
	char *path = strdup("/dev/shm/embstore-test.XXXXXX");

	if (path && mkdtemp(path))
		return path;
	free(path);
	return emb_test_tmpdir();
}

static int rm_one(const char *p, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

void emb_test_rmtree(const char *path)
{
	if (path)
		nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
