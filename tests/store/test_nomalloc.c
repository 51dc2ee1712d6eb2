/*
 * tests/store/test_nomalloc.c - a warmed-up pull or push batch allocates
 * nothing: the batch calls reuse their thread's scratch (src/store/
 * scratch.c) instead of calling malloc per batch. The allocator's calls are
 * counted by tests/alloc_count.h; under AddressSanitizer only the counts go
 * unchecked: the batches, threads and their exits still run, and
 * LeakSanitizer then checks that a thread's scratch goes with it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "store_test.h"

#define DIM	 64
#define NROWS	 20000u
#define BATCH	 4096u
#define NBATCHES 50

/* BATCH ids from 0..NROWS-1, skewed so that ids repeat within a batch (the
 * push's dedup and gradient sums run). */
static void draw(uint64_t *st, uint64_t *ids)
{
	for (uint32_t i = 0; i < BATCH; i++) {
		uint32_t r = rnd_below(st, NROWS);

		ids[i] = i % 4 ? r : r % 64;
	}
}

/* Pulls every id 0..NROWS-1 once. */
static void warm_all(struct emb_table *t)
{
	uint64_t *all = xcalloc(NROWS, sizeof(*all));
	float *buf = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t i = 0; i < NROWS; i++)
		all[i] = i;
	for (uint32_t i = 0; i < NROWS; i += BATCH)
		CU_ASSERT(emb_table_pull(t, all + i,
					 NROWS - i < BATCH ? NROWS - i : BATCH,
					 buf, 0, NULL) >= 0);
	free(buf);
	free(all);
}

/* Pull and push NBATCHES batches of existing rows; 0 allocations. */
static void run_batches(struct emb_table *t, uint64_t seed, const char *what)
{
	uint64_t *ids = xcalloc(BATCH, sizeof(*ids));
	uint64_t *all = xcalloc(NROWS, sizeof(*all));
	float *buf = xcalloc((size_t)BATCH * DIM, sizeof(float));
	uint8_t *found = xcalloc(BATCH, 1);
	const float **ptrs = xcalloc(BATCH, sizeof(*ptrs));
	uint64_t st = seed;
	char msg[96];

	/* Warm-up: every row exists, and this thread's buffers have seen a
	 * full batch of each call. */
	for (uint32_t i = 0; i < NROWS; i++)
		all[i] = i;
	for (uint32_t i = 0; i < NROWS; i += BATCH)
		CU_ASSERT(emb_table_pull(t, all + i,
					 NROWS - i < BATCH ? NROWS - i : BATCH,
					 buf, 0, NULL) >= 0);
	draw(&st, ids);
	for (uint32_t i = 0; i < (size_t)BATCH * DIM; i++)
		buf[i] = 0.001f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, BATCH, buf), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, BATCH, buf, EMB_PULL_NOCREATE,
				       found), 0);
	CU_ASSERT(emb_table_pull_ptrs(t, ids, BATCH, ptrs, 0) >= 0);

	count_begin();
	for (int b = 0; b < NBATCHES; b++) {
		draw(&st, ids);
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, BATCH, buf, 0, NULL), 0);
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, BATCH / 2, buf,
					       EMB_PULL_NOCREATE, found), 0);
		CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, ids, BATCH, ptrs, 0), 0);
		for (uint32_t i = 0; i < (size_t)BATCH * DIM; i++)
			buf[i] = 0.001f;
		CU_ASSERT_EQUAL(emb_table_push(t, ids, BATCH, buf), 0);
		/* A smaller batch reuses the same buffers. */
		CU_ASSERT_EQUAL(emb_table_push(t, ids, 7, buf), 0);
	}
	snprintf(msg, sizeof(msg), "%s: %d pull and push batches", what,
		 NBATCHES);
	expect_none(count_end(), msg);
	free(ptrs);
	free(found);
	free(buf);
	free(all);
	free(ids);
}

static struct emb_table *w1_table(const struct emb_lifecycle_cfg *life)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.name = "w1";
	o.dim = DIM;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	if (life)
		o.life = *life;
	return table_new(&o);
}

/* The counter is live: a plain malloc while counting is seen. */
static void test_counter_sees_malloc(void)
{
	void *volatile p;

	if (!COUNTING)
		return;
	count_begin();
	p = malloc(100);
	CU_ASSERT_EQUAL(count_end(), 1);
	free(p);
}

/* Pull, pull-nocreate, pull-ptrs and push (with repeated ids) of rows that
 * exist make no allocation once the thread is warmed up. */
static void test_batches_allocate_nothing(void)
{
	struct emb_table *t = w1_table(NULL);

	run_batches(t, 1, "plain table");
	emb_table_destroy(t);
}

/* The same with admission and eviction on: the lifecycle's per-batch work
 * (sweeps, counters) allocates nothing either. */
static void test_lifecycle_allocates_nothing(void)
{
	struct emb_lifecycle_cfg life = EMB_LIFECYCLE_CFG_DEFAULT;
	struct emb_table_stats stats;
	struct emb_table *t;

	life.admit = EMB_ADMIT_COUNT;
	life.admit_n = 2;
	life.ttl_steps = 1000000;
	life.max_rows = 1000000;
	t = w1_table(&life);
	/* Admission makes a row on its second sighting: a first pass over
	 * every id only counts them, and run_batches' warm-up makes them. */
	warm_all(t);
	run_batches(t, 3, "admission and eviction");
	emb_table_stats(t, &stats);
	CU_ASSERT_EQUAL(stats.rows, NROWS);
	emb_table_destroy(t);
}

struct worker {
	struct emb_table *t;	/* shared table */
	pthread_barrier_t *bar; /* warm-up done / counting on */
	uint64_t seed;		/* its id stream */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t *ids = calloc(BATCH, sizeof(*ids));
	float *buf = calloc((size_t)BATCH * DIM, sizeof(float));
	uint64_t st = w->seed;

	if (!ids || !buf)
		abort();
	for (int pass = 0; pass < 2; pass++) {
		/* Pass 0 warms up; the main thread counts pass 1. */
		pthread_barrier_wait(w->bar);
		for (int b = 0; b < NBATCHES / 5; b++) {
			draw(&st, ids);
			if (emb_table_pull(w->t, ids, BATCH, buf, 0, NULL) < 0 ||
			    emb_table_push(w->t, ids, BATCH, buf) != 0)
				abort();
		}
		pthread_barrier_wait(w->bar);
	}
	free(buf);
	free(ids);
	return NULL;
}

/* Threads batching on one table at once: none allocates once warm, and
 * each thread's scratch is freed when it exits (LeakSanitizer checks that
 * in the sanitizer build). */
static void test_threads_allocate_nothing(void)
{
	enum { NT = 3 };
	struct emb_table *t = w1_table(NULL);
	struct worker w[NT];
	pthread_t th[NT];
	pthread_barrier_t bar;
	uint64_t *all = xcalloc(NROWS, sizeof(*all));
	float *buf = xcalloc((size_t)BATCH * DIM, sizeof(float));

	for (uint32_t i = 0; i < NROWS; i++)
		all[i] = i;
	for (uint32_t i = 0; i < NROWS; i += BATCH)
		CU_ASSERT(emb_table_pull(t, all + i,
					 NROWS - i < BATCH ? NROWS - i : BATCH,
					 buf, 0, NULL) >= 0);
	pthread_barrier_init(&bar, NULL, NT + 1);
	for (int i = 0; i < NT; i++) {
		w[i] = (struct worker){.t = t, .bar = &bar, .seed = 10 + i};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
	}
	pthread_barrier_wait(&bar); /* warm-up starts */
	pthread_barrier_wait(&bar); /* warm-up done */
	count_begin();
	pthread_barrier_wait(&bar); /* counted pass starts */
	pthread_barrier_wait(&bar); /* counted pass done */
	expect_none(count_end(), "3 threads, pull and push");
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	free(buf);
	free(all);
	emb_table_destroy(t);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"the counter sees a malloc", test_counter_sees_malloc},
	    {"warm batches allocate nothing", test_batches_allocate_nothing},
	    {"with admission and eviction too",
	     test_lifecycle_allocates_nothing},
	    {"threads allocate nothing once warm",
	     test_threads_allocate_nothing},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/nomalloc", cases);
}
