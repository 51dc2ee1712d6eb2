/*
 * tests/harness.h - a CUnit main for embstore's test executables.
 *
 * Each executable lists its cases and calls emb_test_main(); the exit status
 * is 0 when every case passed, 1 otherwise, and 77 (meson's SKIP) when the
 * executable called emb_test_skip() before running.
 */
#ifndef EMB_TESTS_HARNESS_H
#define EMB_TESTS_HARNESS_H

#include <CUnit/CUnit.h>

struct emb_test_case {
	const char *name; /* behaviour, e.g. "rejects oversized batch" */
	void (*fn)(void);
};

/*
 * Runs cases[] (terminated by a {NULL, NULL} entry) as one suite named
 * suite; argv[1], if given, runs only cases whose name contains it (none
 * matching fails: nothing ran).
 */
int emb_test_main(int argc, char **argv, const char *suite,
		  const struct emb_test_case *cases);

/* Makes a fresh directory under $TMPDIR (or /tmp); caller frees the path. */
char *emb_test_tmpdir(void);
/* The same in /dev/shm where there is one (a test's etcd keeps its data
 * there: no fsync waits on a busy disk), else emb_test_tmpdir(). */
char *emb_test_shmdir(void);
/* Removes a directory tree made by emb_test_tmpdir(). */
void emb_test_rmtree(const char *path);

/*
 * EMB_TEST_TSAN is 1 in a ThreadSanitizer build. It slows each memory
 * access 5 to 30 times and finds races only, which a loop on one thread
 * cannot have: long single-threaded loops run fewer rounds, or check
 * less often, there (emb_test_rounds()); the plain and ASan builds run
 * them whole.
 */
#if defined(__SANITIZE_THREAD__)
#define EMB_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMB_TEST_TSAN 1
#endif
#endif
#ifndef EMB_TEST_TSAN
#define EMB_TEST_TSAN 0
#endif

/* n rounds, or a quarter of them (at least 1) under ThreadSanitizer. */
static inline unsigned emb_test_rounds(unsigned n)
{
	return EMB_TEST_TSAN ? (n / 4 ? n / 4 : 1) : n;
}

#endif
