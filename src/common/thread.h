/*
 * src/common/thread.h - what one of embstore's threads tells the kernel's
 * scheduler about itself.
 *
 * Background threads (a fill or move's stream, the sweeps, checkpoints,
 * the birth check, the arena's spare) run under SCHED_BATCH. They keep the
 * CPU share of any thread at their nice level, so a move or a checkpoint
 * still progresses on a busy machine (nice 19 would starve them, and with
 * them the shard locks they hold). What they give up is wakeup preemption:
 * a background thread that wakes takes an idle core or waits for the next
 * tick, and never throws a request's thread off its core. That is the
 * cost it had: traced during a move on 2 cores (docs/benchmarks.md,
 * "Moving slots"), every wait of a training thread over 2 ms was a thread
 * preempted while it ran, left waiting about a scheduler tick, and the
 * move's stream was the third most frequent preempter.
 */
#ifndef EMB_COMMON_THREAD_H
#define EMB_COMMON_THREAD_H

#include <pthread.h>
#include <sched.h>

/* The calling thread becomes a background thread. Best effort: a thread
 * whose policy cannot change runs as it was (never an error). */
static inline void emb_thread_background(void)
{
	struct sched_param sp = {.sched_priority = 0};

	(void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
}

#endif
