/*
 * tests/alloc_count.h - counts the allocator's calls, for the tests that
 * assert a warmed-up request path allocates nothing.
 *
 * Included once by such a test executable, it defines malloc, calloc,
 * realloc, free, posix_memalign and aligned_alloc: each counts while
 * counting is on (any thread), then forwards to jemalloc's non-standard API
 * (mallocx & co.), which every embstore program links and which serves
 * malloc for the whole process anyway. Under AddressSanitizer or
 * ThreadSanitizer the sanitizer owns the allocator: nothing is interposed,
 * COUNTING is 0 and expect_none() checks nothing, so the test still runs
 * its paths for the leak checker and the race detector.
 */
#ifndef EMB_TESTS_ALLOC_COUNT_H
#define EMB_TESTS_ALLOC_COUNT_H

#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>

#include <jemalloc/jemalloc.h>

#include "harness.h"

/* EMB_ALLOC_TRACE=1 in the environment prints the stack of every counted
 * allocation (link with -rdynamic, or read the addresses with addr2line). */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define COUNTING 0
#endif
#endif
#ifndef COUNTING
#define COUNTING 1
#endif

static int counting;	      /* count allocations while set */
static unsigned long nallocs; /* allocations counted */
static int tracing;	      /* EMB_ALLOC_TRACE set: print each one's stack */

#if COUNTING
static void note(void)
{
	static _Thread_local int in_trace;

	if (!__atomic_load_n(&counting, __ATOMIC_RELAXED))
		return;
	__atomic_fetch_add(&nallocs, 1, __ATOMIC_RELAXED);
	if (tracing && !in_trace) {
		void *pcs[32];
		int n;

		in_trace = 1;
		n = backtrace(pcs, 32);
		fprintf(stderr, "counted allocation:\n");
		backtrace_symbols_fd(pcs, n, 2);
		in_trace = 0;
	}
}

void *malloc(size_t n)
{
	note();
	return mallocx(n ? n : 1, 0);
}

void *calloc(size_t n, size_t size)
{
	size_t bytes;

	if (__builtin_mul_overflow(n, size, &bytes)) {
		errno = ENOMEM;
		return NULL;
	}
	note();
	return mallocx(bytes ? bytes : 1, MALLOCX_ZERO);
}

void free(void *p)
{
	if (p)
		dallocx(p, 0);
}

void *realloc(void *p, size_t n)
{
	note();
	if (!p)
		return mallocx(n ? n : 1, 0);
	if (!n) {
		dallocx(p, 0);
		return NULL;
	}
	return rallocx(p, n, 0);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;

	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	note();
	p = mallocx(n ? n : 1, MALLOCX_ALIGN(align));
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
	note();
	return mallocx(n ? n : 1, MALLOCX_ALIGN(align));
}
#endif

static void count_begin(void)
{
	if (COUNTING && getenv("EMB_ALLOC_TRACE") && !tracing) {
		void *pc;

		backtrace(&pc, 1); /* loads the unwinder now, not while counting */
		tracing = 1;
	}
	__atomic_store_n(&nallocs, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&counting, 1, __ATOMIC_SEQ_CST);
}

/* Allocations since count_begin(). */
static unsigned long count_end(void)
{
	__atomic_store_n(&counting, 0, __ATOMIC_SEQ_CST);
	return __atomic_load_n(&nallocs, __ATOMIC_RELAXED);
}

/* Fails the case when n allocations were counted. */
static void expect_none(unsigned long n, const char *what)
{
	if (!COUNTING)
		return;
	if (n)
		fprintf(stderr, "%s: %lu allocations\n", what, n);
	CU_ASSERT_EQUAL(n, 0);
}

#endif
