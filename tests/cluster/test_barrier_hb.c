/*
 * tests/cluster/test_barrier_hb.c - a worker keeps heartbeating across
 * barriers: the last worker to reach a barrier (whose BARRIER is answered
 * at once, while a heartbeat may be in flight on the same conn) then waits
 * at the next barrier for longer than the heartbeat timeout and is not
 * declared dead. The scheduler and the nodes run in this process; the
 * server node only registers and heartbeats (nothing connects to it).
 * Single-threaded but for the barrier threads a case starts itself.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "harness.h"
#include "scheduler.h"
#include "worker/node.h"

#define HB_TIMEOUT_MS 1000u /* heartbeats every 200 ms */
#define ROUNDS	      6

struct barrier_arg {
	struct emb_node *n;
	const char *name;
	int rc;
};

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

static void *barrier_main(void *arg)
{
	struct barrier_arg *b = arg;

	b->rc = emb_node_barrier(b->n, b->name);
	return NULL;
}

static void *join_main(void *arg)
{
	struct barrier_arg *b = arg;

	b->rc = emb_node_wait_map(b->n);
	return NULL;
}

static int node_join(const struct emb_sched *s, uint32_t role,
		     struct emb_node **out)
{
	struct emb_node_opts o = {
	    .sched_host = "127.0.0.1",
	    .sched_port = emb_sched_port(s),
	    .role = role,
	    .host = "127.0.0.1",
	    .port = role == EMB_ROLE_SERVER ? 9 : 0,
	    .join_timeout_ms = 10000,
	};

	return emb_node_create(&o, out);
}

/* Worker first enters name and waits; last enters it ms later. */
static void meet(struct emb_node *first, struct emb_node *last,
		 const char *name, unsigned ms)
{
	struct barrier_arg b = {first, name, 1};
	pthread_t th;

	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, barrier_main, &b), 0);
	sleep_ms(ms);
	CU_ASSERT_EQUAL(emb_node_barrier(last, name), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(b.rc, 0);
}

static void test_last_arriver_stays_alive(void)
{
	struct emb_sched_opts so = EMB_SCHED_OPTS_DEFAULT;
	struct emb_node *srv, *w[2];
	struct barrier_arg j[2];
	pthread_t th[2];
	struct emb_sched *s;
	char name[32];

	so.port = 0;
	so.server_num = 1;
	so.worker_num = 2;
	so.hb_timeout_ms = HB_TIMEOUT_MS;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&so, &s), 0);
	CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_SERVER, &srv), 0);
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_WORKER, &w[i]), 0);
	for (int i = 0; i < 2; i++) {
		j[i] = (struct barrier_arg){w[i], NULL, 1};
		pthread_create(&th[i], NULL, join_main, &j[i]);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL_FATAL(j[i].rc, 0);
	}
	/*
	 * Each round, one worker is last at "a" (the offset walks across the
	 * heartbeat interval, so its BARRIER meets its heartbeats in every
	 * phase), then waits at "b" 1.5 heartbeat timeouts for the other.
	 * Without heartbeats in between, the scheduler would declare it dead
	 * and fail "b" with EMB_ENODEAD.
	 */
	for (int r = 0; r < ROUNDS; r++) {
		struct emb_node *last = w[r % 2], *other = w[1 - r % 2];

		snprintf(name, sizeof(name), "a%d", r);
		meet(other, last, name, 20 + 37u * (unsigned)r);
		snprintf(name, sizeof(name), "b%d", r);
		meet(last, other, name, HB_TIMEOUT_MS * 3 / 2);
	}
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL(emb_node_finish(w[i]), 0);
	/* The server acknowledges on its next heartbeat; nobody died. */
	CU_ASSERT_EQUAL(emb_sched_wait(s, 20000), 0);
	for (int i = 0; i < 2; i++)
		emb_node_destroy(w[i]);
	emb_node_destroy(srv);
	emb_sched_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"last worker at a barrier keeps heartbeating through the next",
	     test_last_arriver_stays_alive},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "barrier_hb", cases);
}
