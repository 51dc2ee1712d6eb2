/*
 * tests/store/test_threads.c - one table shared by several threads.
 *
 * Exactness: SGD with lr 1, zero-initialised rows and small integer
 * gradients makes every partial sum exact in float, so the final weights
 * equal minus the sum of all gradients whatever order the updates land in,
 * and a lost or doubled update shows as a wrong integer. The mixed test only
 * asks that pull, push, assign, erase, evict, stats and iteration run
 * together without a crash or a sanitizer report, and that the table is
 * consistent afterwards. Each test starts and joins its own threads.
 */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store_test.h"

#define NTHREADS 4
#define DIM	 4

struct push_arg {
	struct emb_table *t;
	uint32_t nids;	 /* ids are 0..nids, shared by all threads */
	uint32_t rounds; /* push batches */
	uint64_t seed;
	int64_t *sum; /* nids * DIM: this thread's gradient sums */
	int rc;	      /* first failure, or 0 */
};

static void *push_worker(void *p)
{
	enum { BATCH = 64 };
	struct push_arg *a = p;
	uint64_t ids[BATCH], rng = a->seed;
	float g[BATCH * DIM];

	for (uint32_t r = 0; r < a->rounds; r++) {
		for (uint32_t i = 0; i < BATCH; i++) {
			/* Duplicates within a batch are summed by push. */
			ids[i] = rnd_below(&rng, a->nids);
			for (uint32_t j = 0; j < DIM; j++) {
				int v = (int)rnd_below(&rng, 5) - 2;

				g[i * DIM + j] = (float)v;
				a->sum[ids[i] * DIM + j] += v;
			}
		}
		a->rc = emb_table_push(a->t, ids, BATCH, g);
		if (a->rc)
			break;
	}
	return NULL;
}

static void test_pushes_all_arrive(void)
{
	enum { NIDS = 300, ROUNDS = 3000 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct push_arg args[NTHREADS];
	pthread_t th[NTHREADS];
	uint64_t ids[NIDS];
	float *out = xcalloc((size_t)NIDS * DIM, sizeof(float));
	struct emb_table_stats s;
	struct emb_table *t;
	int bad = 0;

	o.dim = DIM;
	o.nshards = 4; /* few shards: more contention */
	o.optim.lr = 1.0f;
	o.init.kind = EMB_INIT_ZEROS;
	t = table_new(&o);
	for (int i = 0; i < NTHREADS; i++) {
		args[i] = (struct push_arg){
		    .t = t,
		    .nids = NIDS,
		    .rounds = ROUNDS,
		    .seed = 1000 + (uint64_t)i,
		    .sum = xcalloc((size_t)NIDS * DIM, sizeof(int64_t)),
		};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, push_worker, &args[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(args[i].rc, 0);
	}

	for (uint32_t i = 0; i < NIDS; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(
	    emb_table_pull(t, ids, NIDS, out, EMB_PULL_NOCREATE, NULL), 0);
	for (uint32_t i = 0; i < NIDS * DIM; i++) {
		int64_t total = 0;
		float want;

		for (int k = 0; k < NTHREADS; k++)
			total += args[k].sum[i];
		want = (float)-total;
		expect_floats("summed updates", i / DIM, &out[i], &want, 1,
			      &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, NIDS);
	/* Each id was created once, however many threads raced to it. */
	CU_ASSERT_EQUAL(s.rows_created, NIDS);
	CU_ASSERT_EQUAL(s.pushes, (uint64_t)NTHREADS * ROUNDS);
	CU_ASSERT_EQUAL(s.step, (uint64_t)NTHREADS * ROUNDS);
	emb_table_destroy(t);
	for (int i = 0; i < NTHREADS; i++)
		free(args[i].sum);
	free(out);
}

struct pull_arg {
	struct emb_table *t;
	uint32_t n; /* ids 0..n, pulled in the same order by everyone */
	float *out; /* n * DIM */
	int rc;
};

static void *pull_worker(void *p)
{
	enum { BATCH = 32 };
	struct pull_arg *a = p;
	uint64_t ids[BATCH];

	for (uint32_t base = 0; base < a->n; base += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = base + i;
		a->rc = emb_table_pull(a->t, ids, BATCH,
				       a->out + (size_t)base * DIM, 0, NULL);
		if (a->rc < 0)
			break;
	}
	return NULL;
}

/* Threads racing to create the same rows each get the initial values. */
static void test_racing_creates(void)
{
	enum { N = 20000 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct pull_arg args[NTHREADS];
	pthread_t th[NTHREADS];
	float want[DIM];
	struct emb_table_stats s;
	struct emb_table *t;
	int bad = 0;

	o.dim = DIM;
	o.nshards = 2;
	t = table_new(&o);
	for (int i = 0; i < NTHREADS; i++) {
		args[i] = (struct pull_arg){
		    .t = t,
		    .n = N,
		    .out = xcalloc((size_t)N * DIM, sizeof(float)),
		};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, pull_worker, &args[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT(args[i].rc >= 0);
	}
	for (uint32_t id = 0; id < N; id++) {
		emb_init_row(&o.init, o.seed, id, want, DIM);
		for (int i = 0; i < NTHREADS; i++)
			expect_floats("raced create", id,
				      args[i].out + (size_t)id * DIM, want, DIM,
				      &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, N);
	CU_ASSERT_EQUAL(s.rows_created, N);
	/* Each thread counts in a stripe of its own; the stats add them. */
	CU_ASSERT_EQUAL(s.pulls, (uint64_t)NTHREADS * (N / 32));
	CU_ASSERT_EQUAL(s.rows_pulled, (uint64_t)NTHREADS * N);
	emb_table_destroy(t);
	for (int i = 0; i < NTHREADS; i++)
		free(args[i].out);
}

struct mixed_arg {
	struct emb_table *t;
	int role; /* selects the mix of calls */
	uint64_t seed;
	int failures; /* calls that returned an unexpected error */
};

#define MIXED_IDS    4096u
#define MIXED_ROUNDS 3000u

static void *mixed_worker(void *p)
{
	enum { BATCH = 48 };
	struct mixed_arg *a = p;
	uint32_t rf = emb_table_row_floats(a->t);
	uint64_t ids[BATCH], rng = a->seed;
	float *buf = xcalloc((size_t)BATCH * rf, sizeof(float));
	const float *ptrs[BATCH];
	uint8_t found[BATCH];
	struct emb_row_meta meta[BATCH] = {{0}};

	for (uint32_t r = 0; r < MIXED_ROUNDS; r++) {
		uint32_t n = 1 + rnd_below(&rng, BATCH);
		uint32_t op = rnd_below(&rng, 100);
		int64_t rc = 0;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = rnd_below(&rng, MIXED_IDS);
		/* Not negative: an assigned Adam state with v < 0 would
		 * make the next push's result NaN, which is refused. */
		for (uint32_t i = 0; i < n * rf; i++)
			buf[i] = 0.001f * (float)rnd_below(&rng, 200);
		/* Role 0 also walks the table and evicts; the others do
		 * data-path traffic. */
		if (a->role == 0 && op < 3) {
			struct emb_table_iter *it;

			if (emb_table_iter_create(a->t, &it) == 0) {
				while (emb_table_iter_next(it, ids, buf, meta,
							   BATCH) > 0)
					;
				emb_table_iter_destroy(it);
			}
			continue;
		}
		if (a->role == 0 && op < 6) {
			rc = emb_table_evict(a->t, 40, 0);
		} else if (op < 30) {
			rc = emb_table_pull(a->t, ids, n, buf, 0, NULL);
		} else if (op < 45) {
			rc = emb_table_pull(a->t, ids, n, buf,
					    EMB_PULL_NOCREATE, found);
		} else if (op < 55) {
			/* Pointers only: their floats may change while read. */
			rc = emb_table_pull_ptrs(a->t, ids, n, ptrs,
						 EMB_PULL_NOCREATE);
		} else if (op < 80) {
			rc = emb_table_push(a->t, ids, n, buf);
		} else if (op < 88) {
			rc = emb_table_assign(a->t, ids, n, buf, op & 1,
					      (op & 2) ? meta : NULL);
		} else if (op < 98) {
			rc = emb_table_erase(a->t, ids, n);
		} else {
			struct emb_table_stats s;

			emb_table_stats(a->t, &s);
		}
		if (rc < 0)
			a->failures++;
	}
	free(buf);
	return NULL;
}

static void test_mixed_traffic(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct mixed_arg args[NTHREADS];
	pthread_t th[NTHREADS];
	uint64_t *ids = xcalloc(MIXED_IDS + 1, sizeof(*ids));
	uint8_t *seen = xcalloc(MIXED_IDS, 1);
	float *rows;
	struct emb_table_iter *it;
	struct emb_table *t;
	uint32_t rf, total = 0;
	int got, dup = 0, stray = 0;

	o.dim = 6;
	o.nshards = 4;
	o.optim.kind = EMB_OPTIM_ADAM;
	t = table_new(&o);
	rf = emb_table_row_floats(t);
	for (int i = 0; i < NTHREADS; i++) {
		args[i] = (struct mixed_arg){
		    .t = t, .role = i, .seed = 77 + (uint64_t)i};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, mixed_worker, &args[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(args[i].failures, 0);
	}

	/* Quiet again: every row once, every id one of ours, stats agree. */
	rows = xcalloc((size_t)(MIXED_IDS + 1) * rf, sizeof(float));
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, 256)) > 0) {
		for (int i = 0; i < got; i++) {
			if (ids[i] >= MIXED_IDS)
				stray++;
			else if (seen[ids[i]]++)
				dup++;
		}
		total += (uint32_t)got;
	}
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(stray, 0);
	CU_ASSERT_EQUAL(dup, 0);
	CU_ASSERT_EQUAL(total, table_stats(t).rows);
	emb_table_destroy(t);
	free(ids);
	free(seen);
	free(rows);
}

/*
 * Every push moves all floats of a row by the same integer, so a row copied
 * whole has equal floats; an iterator that copied mid-push would see two
 * values.
 */
#define TORN_DIM 256
#define TORN_IDS 64

struct torn_arg {
	struct emb_table *t;
	uint64_t seed;
	int *stop;
	int rc;
};

static void *torn_pusher(void *p)
{
	struct torn_arg *a = p;
	uint64_t ids[8], rng = a->seed;
	float *g = xcalloc(8 * TORN_DIM, sizeof(float));

	while (!__atomic_load_n(a->stop, __ATOMIC_ACQUIRE)) {
		for (uint32_t i = 0; i < 8; i++) {
			float v = (float)((int)rnd_below(&rng, 5) - 2);

			/* Distinct ids: no summing, one step per row. */
			ids[i] = (rnd_below(&rng, TORN_IDS / 8) * 8 + i);
			for (uint32_t j = 0; j < TORN_DIM; j++)
				g[i * TORN_DIM + j] = v;
		}
		a->rc = emb_table_push(a->t, ids, 8, g);
		if (a->rc)
			break;
	}
	free(g);
	return NULL;
}

static void test_iter_rows_not_torn(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct torn_arg args[NTHREADS - 1];
	pthread_t th[NTHREADS - 1];
	uint64_t ids[TORN_IDS];
	float *rows = xcalloc((size_t)TORN_IDS * TORN_DIM, sizeof(float));
	struct emb_table *t;
	int stop = 0, torn = 0;

	o.dim = TORN_DIM;
	o.nshards = 2;
	o.optim.lr = 1.0f;
	o.init.kind = EMB_INIT_ZEROS;
	t = table_new(&o);
	for (uint32_t i = 0; i < TORN_IDS; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, TORN_IDS, rows, 0, NULL),
			TORN_IDS);
	for (int i = 0; i < NTHREADS - 1; i++) {
		args[i] = (struct torn_arg){
		    .t = t, .seed = 9 + (uint64_t)i, .stop = &stop};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th[i], NULL, torn_pusher, &args[i]), 0);
	}
	/* Until the pushers have been at it for a while, however the two
	 * cores are shared out. */
	for (int pass = 0; pass < 200 || table_stats(t).pushes < 5000; pass++) {
		struct emb_table_iter *it;
		int got;

		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
		while ((got = emb_table_iter_next(it, ids, rows, NULL, 5)) >
		       0) {
			for (int i = 0; i < got; i++) {
				const float *r = rows + (size_t)i * TORN_DIM;

				for (uint32_t j = 1; j < TORN_DIM; j++) {
					if (r[j] == r[0])
						continue;
					if (torn++ < 3)
						fprintf(
						    stderr,
						    "\n    id %llu: [0] %g "
						    "[%u] %g",
						    (unsigned long long)ids[i],
						    r[0], j, r[j]);
					break;
				}
			}
		}
		emb_table_iter_destroy(it);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < NTHREADS - 1; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(args[i].rc, 0);
	}
	CU_ASSERT_EQUAL(torn, 0);
	emb_table_destroy(t);
	free(rows);
}

/*
 * The first walk by slot builds each shard's record slots a step at a
 * time, letting go of the shard's lock between steps (shard.c): rows made,
 * erased and made again in records the build has not reached must still
 * be found by slot, then and in every later walk.
 */
#define SLOTS_IDS   60000u /* made before the first walk: 30 steps a shard */
#define SLOTS_FIRST 1000u
#define SLOTS_N	    1500u

struct slots_arg {
	struct emb_table *t;
	int *stop;
	int started;	  /* atomic: the first round is done */
	uint8_t *live;	  /* id -> live, ids below 2 * SLOTS_IDS */
	uint32_t rounds;
	int rc;
};

static void *slots_mutator(void *p)
{
	struct slots_arg *a = p;
	float w[DIM * 8];
	uint64_t rng = 5;

	while (!__atomic_load_n(a->stop, __ATOMIC_ACQUIRE) && !a->rc) {
		uint64_t ids[8];

		/* Erase 8 old rows, then make 8 new ones, which reuse the
		 * records just freed (anywhere in the shard). */
		for (int i = 0; i < 8; i++)
			ids[i] = 1 + rnd_below(&rng, SLOTS_IDS);
		a->rc = emb_table_erase(a->t, ids, 8) < 0;
		for (int i = 0; i < 8; i++)
			a->live[ids[i]] = 0;
		for (int i = 0; i < 8; i++) {
			ids[i] = SLOTS_IDS + 1 + rnd_below(&rng, SLOTS_IDS - 1);
			a->live[ids[i]] = 1;
		}
		if (!a->rc)
			a->rc = emb_table_pull(a->t, ids, 8, w, 0, NULL) < 0;
		a->rounds++;
		__atomic_store_n(&a->started, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

/* One walk over [SLOTS_FIRST, +SLOTS_N): its ids into seen (by id);
 * the number of ids yielded outside the range or twice. */
static int slots_walk(struct emb_table *t, uint8_t *seen)
{
	uint64_t ids[256];
	float rows[256 * DIM * 2];
	struct emb_table_iter *it;
	int got, bad = 0;

	memset(seen, 0, 2 * SLOTS_IDS);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_slots(it, SLOTS_FIRST, SLOTS_N),
			      0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, 256)) > 0)
		for (int i = 0; i < got; i++) {
			if (ids[i] >= 2 * SLOTS_IDS ||
			    emb_id_slot(ids[i]) - SLOTS_FIRST >= SLOTS_N ||
			    seen[ids[i]]++)
				bad++;
		}
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	return bad;
}

static void test_slot_walk_built_in_steps(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(SLOTS_IDS, sizeof(*ids));
	uint8_t *live = xcalloc(2 * SLOTS_IDS, 1);
	uint8_t *seen = xcalloc(2 * SLOTS_IDS, 1);
	float *w = xcalloc((size_t)SLOTS_IDS * DIM, sizeof(float));
	int stop = 0;
	struct slots_arg a = {.stop = &stop, .live = live};
	uint32_t missing = 0, extra = 0, in = 0;
	pthread_t th;

	o.dim = DIM;
	o.nshards = 2;
	a.t = table_new(&o);
	for (uint32_t i = 0; i < SLOTS_IDS; i++) {
		ids[i] = i + 1;
		live[i + 1] = 1;
	}
	CU_ASSERT_EQUAL_FATAL(emb_table_pull(a.t, ids, SLOTS_IDS, w, 0, NULL),
			      (int)SLOTS_IDS);
	/* Free records before the build, for the mutator to reuse. */
	for (uint32_t i = 0; i < SLOTS_IDS; i += 5)
		live[ids[i]] = 0;
	for (uint32_t i = 0; i < SLOTS_IDS; i += 5)
		CU_ASSERT_EQUAL(emb_table_erase(a.t, &ids[i], 1), 1);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, slots_mutator, &a), 0);
	while (!__atomic_load_n(&a.started, __ATOMIC_ACQUIRE))
		sched_yield();
	/* The walk that builds, while rows come and go: nothing outside the
	 * range, nothing twice. */
	CU_ASSERT_EQUAL(slots_walk(a.t, seen), 0);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(a.rc, 0);
	CU_ASSERT(a.rounds > 0);
	/* Quiet: exactly the live rows of the range. */
	CU_ASSERT_EQUAL(slots_walk(a.t, seen), 0);
	for (uint64_t id = 1; id < 2 * SLOTS_IDS; id++) {
		bool want = live[id] && emb_id_slot(id) - SLOTS_FIRST < SLOTS_N;

		in += want;
		missing += want && !seen[id];
		extra += !want && seen[id];
	}
	CU_ASSERT(in > 0);
	CU_ASSERT_EQUAL(missing, 0);
	CU_ASSERT_EQUAL(extra, 0);
	emb_table_destroy(a.t);
	free(ids);
	free(live);
	free(seen);
	free(w);
}

/*
 * Bulk work lets training in (table.c, "Bulk work and the shard locks"):
 * one assign of many rows into a table of one shard, and a pull started
 * while it runs (50 ms in: past the checks and the hashing the assign
 * does before it takes the shard). The pull gets the shard between two
 * of the assign's pieces, so it ends before the assign does. Held for
 * the whole assign, as before, it waited for all of it. An attempt where
 * the assign ended before the pull began says nothing, and goes again
 * with more rows.
 */
struct bulk_arg {
	struct emb_table *t;
	uint32_t n;
	const uint64_t *ids;
	const float *rows;
	int started; /* atomic */
	int done;    /* atomic */
	int rc;
};

static void *bulk_worker(void *p)
{
	struct bulk_arg *a = p;

	__atomic_store_n(&a->started, 1, __ATOMIC_SEQ_CST);
	a->rc = emb_table_assign(a->t, a->ids, a->n, a->rows, false, NULL);
	__atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void test_bulk_lets_pulls_in(void)
{
	enum { BDIM = 8 };
	uint32_t n = emb_test_rounds(1u << 20), conclusive = 0, waited = 0;

	for (int attempt = 0; attempt < 4 && !conclusive; attempt++, n *= 2) {
		struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
		uint64_t *ids = xcalloc(n, sizeof(*ids)), pid = 1ull << 40;
		float *rows = xcalloc((size_t)n * BDIM, sizeof(float));
		float out[BDIM];
		struct bulk_arg a;
		pthread_t th;
		struct timespec ms = {0, 50000000};
		int before;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = i;
		o.dim = BDIM;
		o.nshards = 1; /* every row in the one shard the pull needs */
		a = (struct bulk_arg){.t = table_new(&o), .n = n, .ids = ids,
				      .rows = rows};
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&th, NULL, bulk_worker, &a), 0);
		while (!__atomic_load_n(&a.started, __ATOMIC_SEQ_CST))
			sched_yield();
		nanosleep(&ms, NULL);
		before = __atomic_load_n(&a.done, __ATOMIC_SEQ_CST);
		CU_ASSERT_EQUAL(emb_table_pull(a.t, &pid, 1, out, 0, NULL), 1);
		if (!before) {
			conclusive++;
			waited += __atomic_load_n(&a.done, __ATOMIC_SEQ_CST);
		}
		pthread_join(th, NULL);
		CU_ASSERT_EQUAL(a.rc, 0);
		CU_ASSERT_EQUAL(table_stats(a.t).rows, (uint64_t)n + 1);
		emb_table_destroy(a.t);
		free(ids);
		free(rows);
	}
	if (!conclusive)
		printf("\n  every assign ended before its pull began: "
		       "nothing shown\n");
	CU_ASSERT_EQUAL(waited, 0);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"concurrent pushes to shared ids all arrive",
	     test_pushes_all_arrive},
	    {"racing first pulls create each row once", test_racing_creates},
	    {"iterated rows are never torn by pushes", test_iter_rows_not_torn},
	    {"pull, push, assign, erase, evict and iterate together",
	     test_mixed_traffic},
	    {"a walk by slot finds rows made while its index is built",
	     test_slot_walk_built_in_steps},
	    {"a pull gets a shard between the pieces of a bulk assign",
	     test_bulk_lets_pulls_in},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/threads", cases);
}
