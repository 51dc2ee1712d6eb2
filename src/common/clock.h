/*
 * src/common/clock.h - the monotonic clock every module reads, in the units
 * callers want. CLOCK_MONOTONIC never jumps with wall-clock changes, so
 * deadlines and durations measured with it hold. Thread-safe.
 */
#ifndef EMB_COMMON_CLOCK_H
#define EMB_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary start (boot). */
static inline uint64_t emb_clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Milliseconds, same clock. */
static inline uint64_t emb_clock_ms(void)
{
	return emb_clock_ns() / 1000000u;
}

/* Seconds as a double, for rates and progress lines. */
static inline double emb_clock_s(void)
{
	return (double)emb_clock_ns() * 1e-9;
}

#endif
