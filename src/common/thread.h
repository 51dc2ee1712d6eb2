/*
 * src/common/thread.h - how embstore starts its threads: named, and with
 * the process's asynchronous signals blocked, so that a signal sent to
 * the process (SIGTERM from an operator or from embstore-server's own
 * cluster-end callback, SIGINT from a terminal, a Python program's ^C)
 * reaches a thread of the program that links embstore, never one of
 * embstore's. A program that waits for a signal in one thread
 * (sigsuspend(), sigwait(), a wakeup fd) is woken by every signal only if
 * no other thread can take it: the kernel hands a process-directed signal
 * to any one thread that does not block it, and a handler that ran on a
 * library thread wakes nobody.
 *
 * Left unblocked: the signals the kernel sends a thread for its own fault
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS; blocked, a fault kills
 * the process without its handler, a sanitizer's report among them), and
 * SIGPROF, which sampling profilers send to whichever thread runs.
 *
 * Thread-safe: the mask is the calling thread's own, set back before
 * return.
 */
#ifndef EMB_COMMON_THREAD_H
#define EMB_COMMON_THREAD_H

#include <pthread.h>

/*
 * pthread_create(th, attr, fn, arg) with the signals above blocked in the
 * new thread from its first instruction, then named (at most 15
 * characters; NULL keeps the process's name). 0, or -errno from
 * pthread_create.
 */
int emb_thread_start(pthread_t *th, const pthread_attr_t *attr,
		     void *(*fn)(void *), void *arg, const char *name);

#endif
