/*
 * tests/cluster/test_barrier_hb.c - a worker keeps heartbeating across
 * barriers: the last worker to reach a barrier (whose BARRIER is answered
 * at once, while a heartbeat may be in flight on the same conn) then waits
 * at the next barrier for longer than the heartbeat timeout and is not
 * declared dead; and a signal that interrupts the agents' and the
 * scheduler's polls stops neither. The scheduler and the nodes run in this
 * process; the server node only registers and heartbeats (nothing connects
 * to it). Single-threaded but for the barrier threads a case starts itself.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "harness.h"
#include "cluster/scheduler.h"
#include "cluster/node.h"

#define HB_TIMEOUT_MS 1000u /* heartbeats every 200 ms */
#define ROUNDS	      6

struct barrier_arg {
	struct emb_node *n;
	const char *name;
	int rc;
	bool returned; /* atomic: the call came back */
};

struct cluster {
	struct emb_sched *s;
	struct emb_node *srv;
	struct emb_node *w[2];
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
	__atomic_store_n(&b->returned, true, __ATOMIC_SEQ_CST);
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
	struct barrier_arg b = {first, name, 1, false};
	pthread_t th;

	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, barrier_main, &b), 0);
	sleep_ms(ms);
	CU_ASSERT_EQUAL(emb_node_barrier(last, name), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(b.rc, 0);
}

/* One server node and two joined workers, heartbeat timeout HB_TIMEOUT_MS. */
static void cluster_up(struct cluster *cl)
{
	struct emb_sched_opts so = EMB_SCHED_OPTS_DEFAULT;
	struct barrier_arg j[2];
	pthread_t th[2];

	so.port = 0;
	so.server_num = 1;
	so.worker_num = 2;
	so.hb_timeout_ms = HB_TIMEOUT_MS;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&so, &cl->s), 0);
	CU_ASSERT_EQUAL_FATAL(node_join(cl->s, EMB_ROLE_SERVER, &cl->srv), 0);
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL_FATAL(
		    node_join(cl->s, EMB_ROLE_WORKER, &cl->w[i]), 0);
	for (int i = 0; i < 2; i++) {
		j[i] = (struct barrier_arg){cl->w[i], NULL, 1, false};
		pthread_create(&th[i], NULL, join_main, &j[i]);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL_FATAL(j[i].rc, 0);
	}
}

/* Both workers finish; the job must end with nobody declared dead. */
static void cluster_down(struct cluster *cl)
{
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL(emb_node_finish(cl->w[i]), 0);
	/* The server acknowledges on its next heartbeat. */
	CU_ASSERT_EQUAL(emb_sched_wait(cl->s, 20000), 0);
	for (int i = 0; i < 2; i++)
		emb_node_destroy(cl->w[i]);
	emb_node_destroy(cl->srv);
	emb_sched_destroy(cl->s);
}

static void test_last_arriver_stays_alive(void)
{
	struct cluster cl;
	char name[32];

	cluster_up(&cl);
	/*
	 * Each round, one worker is last at "a" (the offset walks across the
	 * heartbeat interval, so its BARRIER meets its heartbeats in every
	 * phase), then waits at "b" 1.5 heartbeat timeouts for the other.
	 * Without heartbeats in between, the scheduler would declare it dead
	 * and fail "b" with EMB_ENODEAD.
	 */
	for (int r = 0; r < ROUNDS; r++) {
		struct emb_node *last = cl.w[r % 2], *other = cl.w[1 - r % 2];

		snprintf(name, sizeof(name), "a%d", r);
		meet(other, last, name, 20 + 37u * (unsigned)r);
		snprintf(name, sizeof(name), "b%d", r);
		meet(last, other, name, HB_TIMEOUT_MS * 3 / 2);
	}
	cluster_down(&cl);
}

static void on_usr1(int sig)
{
	(void)sig;
}

/* Interrupts every other thread of this process (their polls get EINTR). */
static void signal_others(void)
{
	long self = syscall(SYS_gettid);
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((e = readdir(d))) {
		long tid = strtol(e->d_name, NULL, 10);

		if (tid > 0 && tid != self)
			syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR1);
	}
	closedir(d);
}

static void test_signal_keeps_loops(void)
{
	struct sigaction sa = {0}, old;
	struct cluster cl;
	struct barrier_arg b[2];
	pthread_t th[2];
	bool back = false;

	/* No SA_RESTART: epoll_wait fails with EINTR in whichever loop. */
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	CU_ASSERT_EQUAL_FATAL(sigaction(SIGUSR1, &sa, &old), 0);
	cluster_up(&cl);
	for (int i = 0; i < 5; i++) {
		signal_others();
		sleep_ms(50);
	}
	/* Every node must heartbeat through a heartbeat timeout alone. */
	sleep_ms(HB_TIMEOUT_MS * 3 / 2);
	for (int i = 0; i < 2; i++) {
		b[i] = (struct barrier_arg){cl.w[i], "after", 1, false};
		pthread_create(&th[i], NULL, barrier_main, &b[i]);
	}
	/* A loop that stopped would leave its barrier waiting forever. */
	for (int t = 0; t < 200 && !back; t++) {
		back = __atomic_load_n(&b[0].returned, __ATOMIC_SEQ_CST) &&
		       __atomic_load_n(&b[1].returned, __ATOMIC_SEQ_CST);
		if (!back)
			sleep_ms(50);
	}
	CU_ASSERT_FATAL(back);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(b[i].rc, 0);
	}
	cluster_down(&cl);
	sigaction(SIGUSR1, &old, NULL);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"last worker at a barrier keeps heartbeating through the next",
	     test_last_arriver_stays_alive},
	    {"a signal stops neither the node agents nor the scheduler",
	     test_signal_keeps_loops},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "barrier_hb", cases);
}
