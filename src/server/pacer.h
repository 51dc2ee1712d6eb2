/*
 * src/server/pacer.h - the pace of a move's copy ahead under --move-bound:
 * how fast a source may stream, from what the workers say of their calls.
 *
 * Workers send PACE while a move is under way (src/worker/pace.c): their
 * calls' p99 over the last window against their p99 before the move. The
 * server counts the reports since its last look, and those whose ratio
 * is over the bound (emb__pacer_report(), any loop thread); the fill's
 * thread looks every EMB_PACER_TICK_MS while it streams
 * (emb__pacer_tick()) and sets its rate as a congestion window is set:
 * more than a tenth of the reports over the bound halve the rate (down
 * to EMB_PACER_FLOOR, or a quarter of a cap below it); otherwise reports
 * grow it by a quarter (up to the cap, --move-rate, or without one).
 * With one or two workers one report over is enough; with hundreds, the
 * one worker whose window caught a hiccup of its own does not hold the
 * move at the floor. A tick with no report holds the rate while workers are
 * reporting (one report a window, 250 ms, spans two or three ticks), and
 * grows it once none has reported for EMB_PACER_QUIET_MS: a move with no
 * one training soon runs as fast as unpaced (1.3 s from the floor to
 * 1 GB/s).
 *
 * Why the source, and a rate: the copy ahead is the only part of a move
 * that can wait (the fenced stream holds the chunk's writes and is never
 * paced), and it is streamed by one thread that already paces by rate.
 *
 * Threads: report is any thread's (atomics); tick and the rate are the
 * fill thread's; the counters are read by the metrics with relaxed loads.
 */
#ifndef EMB_SERVER_PACER_H
#define EMB_SERVER_PACER_H

#include <stdbool.h>
#include <stdint.h>

#define EMB_PACER_TICK_MS 100u
#define EMB_PACER_FLOOR	  (4.0 * 1024 * 1024)	/* bytes/s: the least */
#define EMB_PACER_START	  (128.0 * 1024 * 1024) /* the first move's */
#define EMB_PACER_MAX	  (64.0 * 1024 * 1024 * 1024) /* "unpaced" */
#define EMB_PACER_IDLE_MS 5000u /* no tick for this long: start over */
#define EMB_PACER_QUIET_MS 1000u /* no report for this long: no one
				    trains, the rate may grow */

struct emb__pacer {
	uint32_t bound_milli; /* --move-bound x 1000; 0 = off (atomic: the
				 reports read it) */
	double cap;	      /* --move-rate, bytes/s; 0 = none */
	uint64_t tally;	      /* atomic: reports since the last tick (low
				 32 bits) and of them those over the bound
				 (high 32), taken at once by the tick */
	uint64_t reports;     /* atomic: PACE reports taken */
	uint64_t report_ms;   /* atomic: when the last came, monotonic */
	uint64_t cuts;	      /* atomic: ticks that halved the rate */
	uint64_t rate_now;    /* atomic: the rate, bytes/s, for metrics */
	double rate;	      /* fill thread: bytes/s; 0 = not begun */
	uint64_t last_ms;     /* fill thread: the last tick */
};

/* Any thread: a worker's p99 in its window against before the move,
 * at now_ms (monotonic). (The counts wrap after 2^32 reports in one
 * tick: never.) */
static inline void emb__pacer_report(struct emb__pacer *p, uint32_t p99_us,
				     uint32_t base_us, uint64_t now_ms)
{
	uint64_t r = base_us ? (uint64_t)p99_us * 1000u / base_us : 0;
	bool over = r > __atomic_load_n(&p->bound_milli, __ATOMIC_RELAXED);

	__atomic_fetch_add(&p->reports, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&p->report_ms, now_ms, __ATOMIC_RELAXED);
	__atomic_fetch_add(&p->tally, 1u + ((uint64_t)over << 32),
			   __ATOMIC_RELAXED);
}

/*
 * The rate after one look that found seen reports, over of them over the
 * bound, and quiet whether none has come for EMB_PACER_QUIET_MS: pure,
 * for the tests.
 */
static inline double emb__pacer_next(double rate, uint32_t seen,
				     uint32_t over, bool quiet, double cap)
{
	double top = cap > 0 ? cap : EMB_PACER_MAX;
	/* Under a cap below it, the floor is a quarter of the cap: a cut
	 * must still slow a copy that --move-rate holds low already. */
	double floor = cap > 0 && cap / 4 < EMB_PACER_FLOOR ? cap / 4
							    : EMB_PACER_FLOOR;

	if ((uint64_t)over * 10u > seen)
		rate *= 0.5;
	else if (seen || quiet)
		rate *= 1.25;
	if (rate < floor)
		rate = floor;
	if (rate > top)
		rate = top;
	return rate;
}

/* Fill thread, while it streams a copy ahead: the rate to send at now
 * (now_ms monotonic), looked again once a tick has passed. */
static inline double emb__pacer_tick(struct emb__pacer *p, uint64_t now_ms)
{
	if (!p->rate || now_ms - p->last_ms > EMB_PACER_IDLE_MS) {
		/* A new move (or one after a long pause): what the workers
		 * said before it says nothing of now. */
		p->rate = p->cap > 0 && p->cap < EMB_PACER_START
			      ? p->cap
			      : EMB_PACER_START;
		p->last_ms = now_ms;
		__atomic_store_n(&p->tally, 0, __ATOMIC_RELAXED);
	}
	while (now_ms - p->last_ms >= EMB_PACER_TICK_MS) {
		uint64_t t = __atomic_exchange_n(&p->tally, 0,
						 __ATOMIC_RELAXED);
		uint64_t last = __atomic_load_n(&p->report_ms,
						__ATOMIC_RELAXED);
		/* A report may land after now_ms was read: not quiet. */
		bool quiet = last <= now_ms &&
			     now_ms - last >= EMB_PACER_QUIET_MS;
		double r = emb__pacer_next(p->rate, (uint32_t)t,
					   (uint32_t)(t >> 32), quiet, p->cap);

		if (r < p->rate)
			__atomic_fetch_add(&p->cuts, 1, __ATOMIC_RELAXED);
		p->rate = r;
		/* Ticks missed (the thread was starved) count once: a
		 * report seen late is one report. */
		p->last_ms = now_ms - p->last_ms >= 2 * EMB_PACER_TICK_MS
				 ? now_ms
				 : p->last_ms + EMB_PACER_TICK_MS;
	}
	__atomic_store_n(&p->rate_now, (uint64_t)p->rate, __ATOMIC_RELAXED);
	return p->rate;
}

#endif
