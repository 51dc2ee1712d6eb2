/*
 * tests/cluster/cluster_util.h - helpers the cluster suites share: workers
 * that join from the environment at once (each waits for the others, so
 * they must run in threads), and small waits.
 */
#ifndef EMB_TESTS_CLUSTER_UTIL_H
#define EMB_TESTS_CLUSTER_UTIL_H

#include <pthread.h>
#include <time.h>

#include "harness.h"
#include "worker/embstore.h"

struct worker {
	pthread_t th;
	struct emb_client *c;
	int rc;
};

static inline void *emb_test_join_main(void *arg)
{
	struct worker *w = arg;

	w->rc = emb_client_from_env(NULL, &w->c);
	return NULL;
}

/* Joins n workers at once (each waits for the others). */
static inline void workers_join(struct worker *w, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		pthread_create(&w[i].th, NULL, emb_test_join_main, &w[i]);
	for (uint32_t i = 0; i < n; i++) {
		pthread_join(w[i].th, NULL);
		CU_ASSERT_EQUAL_FATAL(w[i].rc, 0);
	}
}

/* An in-process server's on_end: its exit status, for the test to read. */
static inline void on_server_end(void *arg, int status)
{
	__atomic_store_n((int *)arg, status, __ATOMIC_SEQ_CST);
}

static inline void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

#endif
