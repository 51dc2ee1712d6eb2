/*
 * tests/common/test_thread.c - emb_thread_start(): the threads embstore
 * starts take none of the process's signals, so one sent to the process
 * reaches the program's own thread that waits for it. Its threads are
 * this file's; the handler records where it ran.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#include "common/thread.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool go, stop;

struct mask_seen {
	bool term, intr, hup, usr1, chld; /* blocked (want: all) */
	bool segv, bus, fpe, prof;	  /* blocked (want: none) */
	char name[16];
};

static void *record_mask(void *arg)
{
	struct mask_seen *m = arg;
	sigset_t cur;

	/* Once emb_thread_start() returned: it names the thread after it
	 * started. */
	pthread_mutex_lock(&mu);
	while (!go)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	pthread_getname_np(pthread_self(), m->name, sizeof(m->name));
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	m->term = sigismember(&cur, SIGTERM);
	m->intr = sigismember(&cur, SIGINT);
	m->hup = sigismember(&cur, SIGHUP);
	m->usr1 = sigismember(&cur, SIGUSR1);
	m->chld = sigismember(&cur, SIGCHLD);
	m->segv = sigismember(&cur, SIGSEGV);
	m->bus = sigismember(&cur, SIGBUS);
	m->fpe = sigismember(&cur, SIGFPE);
	m->prof = sigismember(&cur, SIGPROF);
	return NULL;
}

static void test_mask(void)
{
	struct mask_seen m = {0};
	sigset_t before, after;
	pthread_t th;

	pthread_sigmask(SIG_BLOCK, NULL, &before);
	CU_ASSERT_FALSE_FATAL(sigismember(&before, SIGTERM));
	CU_ASSERT_EQUAL_FATAL(
	    emb_thread_start(&th, NULL, record_mask, &m, "emb-test"), 0);
	pthread_mutex_lock(&mu);
	go = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(th, NULL);
	CU_ASSERT_STRING_EQUAL(m.name, "emb-test");
	CU_ASSERT_TRUE(m.term && m.intr && m.hup && m.usr1 && m.chld);
	CU_ASSERT_FALSE(m.segv || m.bus || m.fpe || m.prof);
	/* The caller's own mask is as it was. */
	pthread_sigmask(SIG_BLOCK, NULL, &after);
	for (int sig = 1; sig < 32; sig++)
		CU_ASSERT_EQUAL(sigismember(&after, sig),
				sigismember(&before, sig));
}

static volatile sig_atomic_t handled_tid;

static void on_term(int sig)
{
	(void)sig;
	handled_tid = (sig_atomic_t)syscall(SYS_gettid);
}

static void *idle_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	while (!stop)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return NULL;
}

/*
 * What embstore-server does: main blocks SIGTERM except while it waits.
 * A signal sent to the process while main blocks it goes to a thread
 * that does not, if there is one; with none, it stays pending until main
 * opens its mask, and the handler runs there.
 */
static void test_signal_reaches_main(void)
{
	struct sigaction sa, old_sa;
	sigset_t term, old;
	pthread_t th[4];
	sig_atomic_t self = (sig_atomic_t)syscall(SYS_gettid);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	CU_ASSERT_EQUAL_FATAL(sigaction(SIGTERM, &sa, &old_sa), 0);
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &term, &old);
	/* Started with SIGTERM open in their creator: still blocked. */
	pthread_sigmask(SIG_UNBLOCK, &term, NULL);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL_FATAL(
		    emb_thread_start(&th[i], NULL, idle_main, NULL, "emb-idle"),
		    0);
	pthread_sigmask(SIG_BLOCK, &term, NULL);
	for (int round = 0; round < 20; round++) {
		struct timespec ms = {0, 1000000};

		handled_tid = 0;
		CU_ASSERT_EQUAL(kill(getpid(), SIGTERM), 0);
		/* A while with main's mask shut, as main is busy in the
		 * daemon: a thread that could take it would, now. */
		nanosleep(&(struct timespec){0, 20000000}, NULL);
		CU_ASSERT_EQUAL(handled_tid, 0);
		/* Then open main's mask until the handler ran, somewhere;
		 * 5 s at most. */
		for (int i = 0; i < 5000 && !handled_tid; i++) {
			pthread_sigmask(SIG_UNBLOCK, &term, NULL);
			pthread_sigmask(SIG_BLOCK, &term, NULL);
			if (!handled_tid)
				nanosleep(&ms, NULL);
		}
		CU_ASSERT_EQUAL(handled_tid, self);
		if (handled_tid != self)
			break;
	}
	pthread_mutex_lock(&mu);
	stop = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	sigaction(SIGTERM, &old_sa, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a thread it starts is named and blocks the process's signals, "
	     "not a fault's",
	     test_mask},
	    {"a SIGTERM sent to the process runs its handler on the thread "
	     "that waits for it, not on one of embstore's",
	     test_signal_reaches_main},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/thread", cases);
}
