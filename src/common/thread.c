/*
 * src/common/thread.c - emb_thread_start() (thread.h).
 */
#include "common/thread.h"

#include <errno.h>
#include <signal.h>

/* The set emb_thread_start() blocks, into *set. */
static void thread_sigset(sigset_t *set)
{
	static const int keep[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL,
				   SIGTRAP, SIGSYS, SIGPROF};

	sigfillset(set);
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		sigdelset(set, keep[i]);
}

int emb_thread_start(pthread_t *th, const pthread_attr_t *attr,
		     void *(*fn)(void *), void *arg, const char *name)
{
	sigset_t block, old;
	int rc;

	/* The new thread inherits the creator's mask: blocked around the
	 * create, it never runs a moment with the signals open. */
	thread_sigset(&block);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	rc = pthread_create(th, attr, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		return -rc;
	if (name)
		(void)pthread_setname_np(*th, name);
	return 0;
}
