/*
 * tests/store/test_arena.c - the extent hook, as a transport uses it to
 * register table memory.
 *
 * A tracker stands in for the transport: it keeps the byte ranges currently
 * "registered" and flags any call that would confuse one (an add over a range
 * already held, a removal of bytes never added). Row pointers from
 * emb_table_pull_ptrs() must fall inside registered ranges, and after destroy
 * nothing may stay registered. Single-threaded, but the tracker locks since
 * the hook runs on whichever thread grows the table.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdbool.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store_test.h"
#include "store/store_int.h"

#define MAX_RANGES 4096

struct range {
	uintptr_t lo;
	uintptr_t hi; /* exclusive */
};

struct tracker {
	pthread_mutex_t lock;
	struct range r[MAX_RANGES]; /* registered now, unordered, disjoint */
	uint32_t n;
	uint64_t adds;	  /* successful "added" calls */
	uint64_t removes; /* "removed" calls */
	uint64_t bytes_added;
	uint64_t bytes_removed;
	uint64_t calls;	    /* every call, refused ones too */
	int errors;	    /* overlapping adds, unknown removals */
	int64_t fail_after; /* refuse adds once adds reaches this; -1 never */
	struct emb_table *peek; /* if set, the hook calls back into it */
};

static void tracker_init(struct tracker *k)
{
	memset(k, 0, sizeof(*k));
	pthread_mutex_init(&k->lock, NULL);
	k->fail_after = -1;
}

static void tracker_error(struct tracker *k, const char *what, uintptr_t lo,
			  size_t len)
{
	if (k->errors++ < 5)
		fprintf(stderr, "\n    hook: %s [%#lx, +%zu)", what,
			(unsigned long)lo, len);
}

/* Removes [lo, hi) from the registered set; all of it must be there. */
static void tracker_cut(struct tracker *k, uintptr_t lo, uintptr_t hi)
{
	uint64_t covered = 0;

	for (uint32_t i = 0; i < k->n;) {
		struct range *r = &k->r[i];
		uintptr_t a = r->lo > lo ? r->lo : lo;
		uintptr_t b = r->hi < hi ? r->hi : hi;

		if (a >= b) {
			i++;
			continue;
		}
		covered += b - a;
		if (r->lo < a && r->hi > b && k->n < MAX_RANGES) {
			/* Punch a hole: keep both sides. */
			k->r[k->n++] = (struct range){b, r->hi};
			r->hi = a;
			i++;
		} else if (r->lo < a) {
			r->hi = a;
			i++;
		} else if (r->hi > b) {
			r->lo = b;
			i++;
		} else {
			*r = k->r[--k->n];
		}
	}
	if (covered != hi - lo)
		tracker_error(k, "removed bytes that were never added", lo,
			      hi - lo);
}

static int hook(void *arg, void *addr, size_t len, bool added)
{
	struct tracker *k = arg;
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	int rc = 0;

	if (k->peek) {
		/* The hook runs with no store lock it could re-enter. */
		struct emb_table_stats s;

		emb_table_stats(k->peek, &s);
	}
	pthread_mutex_lock(&k->lock);
	k->calls++;
	if (len == 0)
		tracker_error(k, "empty extent", lo, len);
	if (!added) {
		tracker_cut(k, lo, hi);
		k->removes++;
		k->bytes_removed += len;
		goto out;
	}
	if (k->fail_after >= 0 && k->adds >= (uint64_t)k->fail_after) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < k->n; i++) {
		if (k->r[i].lo < hi && lo < k->r[i].hi)
			tracker_error(k, "added over a registered range", lo,
				      len);
	}
	if (k->n == MAX_RANGES) {
		tracker_error(k, "too many extents for the tracker", lo, len);
		goto out;
	}
	k->r[k->n++] = (struct range){lo, hi};
	k->adds++;
	k->bytes_added += len;
out:
	pthread_mutex_unlock(&k->lock);
	return rc;
}

static bool tracker_covers(struct tracker *k, const void *p, size_t len)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + len;
	bool ok = false;

	pthread_mutex_lock(&k->lock);
	for (uint32_t i = 0; i < k->n && !ok; i++)
		ok = k->r[i].lo <= lo && hi <= k->r[i].hi;
	pthread_mutex_unlock(&k->lock);
	return ok;
}

/* Creates ids [first, first + n) by pull, in batches. Returns the first
 * error, or 0. */
static int grow(struct emb_table *t, uint64_t first, uint32_t n)
{
	enum { BATCH = 2048 };
	uint64_t *ids = xcalloc(BATCH, sizeof(*ids));
	float *out = xcalloc((size_t)BATCH * emb_table_dim(t), sizeof(float));
	int rc = 0;

	for (uint32_t done = 0; done < n && rc >= 0; done += BATCH) {
		uint32_t m = n - done < BATCH ? n - done : BATCH;

		for (uint32_t i = 0; i < m; i++)
			ids[i] = first + done + i;
		rc = emb_table_pull(t, ids, m, out, 0, NULL);
	}
	free(ids);
	free(out);
	return rc < 0 ? rc : 0;
}

/* Every row of ids [first, first + n) lies inside a registered extent. */
static void expect_rows_registered(struct emb_table *t, struct tracker *k,
				   uint64_t first, uint32_t n)
{
	enum { BATCH = 2048 };
	uint64_t *ids = xcalloc(BATCH, sizeof(*ids));
	const float **ptrs = xcalloc(BATCH, sizeof(*ptrs));
	size_t len = emb_table_dim(t) * sizeof(float);
	int outside = 0;

	for (uint32_t done = 0; done < n; done += BATCH) {
		uint32_t m = n - done < BATCH ? n - done : BATCH;

		for (uint32_t i = 0; i < m; i++)
			ids[i] = first + done + i;
		CU_ASSERT_EQUAL_FATAL(
		    emb_table_pull_ptrs(t, ids, m, ptrs, EMB_PULL_NOCREATE), 0);
		for (uint32_t i = 0; i < m; i++) {
			if (tracker_covers(k, ptrs[i], len))
				continue;
			if (outside++ < 3)
				fprintf(stderr,
					"\n    row %llu at %p not in a "
					"registered extent",
					(unsigned long long)ids[i],
					(const void *)ptrs[i]);
		}
	}
	CU_ASSERT_EQUAL(outside, 0);
	free(ids);
	free(ptrs);
}

static void expect_all_removed(struct tracker *k)
{
	if (k->n || k->bytes_added != k->bytes_removed)
		fprintf(stderr,
			"\n    after destroy: %u ranges still registered, "
			"%llu bytes added, %llu removed",
			k->n, (unsigned long long)k->bytes_added,
			(unsigned long long)k->bytes_removed);
	CU_ASSERT_EQUAL(k->n, 0);
	CU_ASSERT_EQUAL(k->bytes_added, k->bytes_removed);
	CU_ASSERT_EQUAL(k->errors, 0);
}

static struct emb_table *table_dim(uint32_t dim)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.dim = dim;
	o.nshards = 4;
	o.init.kind = EMB_INIT_ZEROS;
	return table_new(&o);
}

#define ROWS 60000u

static void test_hook_from_start(void)
{
	struct tracker k;
	struct emb_table *t = table_dim(64);
	struct emb_table_stats s;

	tracker_init(&k);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_extent_hook(t, hook, &k), 0);
	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0);
	s = table_stats(t);
	CU_ASSERT(k.adds >= 1);
	CU_ASSERT(k.bytes_added - k.bytes_removed >= s.rows * s.row_bytes);
	CU_ASSERT_EQUAL(s.extents, k.adds - k.removes);
	expect_rows_registered(t, &k, 0, ROWS);
	/* Shrinking and growing again keeps the books straight. */
	{
		uint64_t ids[1000];

		for (uint32_t i = 0; i < 1000; i++)
			ids[i] = i * 7;
		CU_ASSERT_EQUAL(emb_table_erase(t, ids, 1000), 1000);
		CU_ASSERT_EQUAL(grow(t, ROWS, 20000), 0);
		expect_rows_registered(t, &k, ROWS, 20000);
	}
	CU_ASSERT_EQUAL(k.errors, 0);
	emb_table_destroy(t);
	expect_all_removed(&k);
	pthread_mutex_destroy(&k.lock);
}

static void test_hook_replays(void)
{
	struct tracker k;
	struct emb_table *t = table_dim(64);
	struct emb_table_stats s;

	tracker_init(&k);
	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0);
	s = table_stats(t);
	CU_ASSERT_FATAL(s.extents >= 1);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_extent_hook(t, hook, &k), 0);
	/* One "added" call per extent mapped so far. */
	CU_ASSERT_EQUAL(k.adds, s.extents);
	CU_ASSERT_EQUAL(k.removes, 0);
	expect_rows_registered(t, &k, 0, ROWS);
	CU_ASSERT_EQUAL(grow(t, ROWS, ROWS), 0);
	expect_rows_registered(t, &k, 0, 2 * ROWS);
	CU_ASSERT_EQUAL(table_stats(t).extents, k.adds - k.removes);
	emb_table_destroy(t);
	expect_all_removed(&k);
	pthread_mutex_destroy(&k.lock);
}

/*
 * A refused extent fails the pull that needed it with EMB_EARENA; rows made
 * before stay intact, and once the hook accepts again the same pull works.
 */
static void test_hook_refuses(void)
{
	enum { STEP = 4096, LIMIT = 400000 };
	struct tracker k;
	struct emb_table *t = table_dim(64);
	struct emb_table_stats s0, s1;
	uint64_t *ids = xcalloc(LIMIT, sizeof(*ids));
	uint8_t *found = xcalloc(LIMIT, 1);
	float *out = xcalloc((size_t)LIMIT * 64, sizeof(float));
	uint32_t made;
	int rc = 0, bad = 0;
	const uint64_t old_id = 5;
	const struct emb_optim_cfg def = EMB_OPTIM_CFG_DEFAULT;
	float g[64], want[64];

	tracker_init(&k);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_extent_hook(t, hook, &k), 0);
	CU_ASSERT_EQUAL(grow(t, 0, 10000), 0);
	s0 = table_stats(t);
	k.fail_after = (int64_t)k.adds;
	for (made = 10000; made < LIMIT; made += STEP) {
		rc = grow(t, made, STEP);
		if (rc < 0)
			break;
	}
	if (rc >= 0) {
		CU_FAIL("table grew by 390k rows without a new extent");
		goto out;
	}
	if (rc != EMB_EARENA)
		fprintf(stderr, "\n    refused extent: expected %d got %d (%s)",
			EMB_EARENA, rc, emb_strerror(rc));
	CU_ASSERT_EQUAL(rc, EMB_EARENA);
	CU_ASSERT_EQUAL(k.errors, 0);

	/* Consistent: the rows that exist are whole, and stats agree. */
	for (uint32_t i = 0; i < made + STEP; i++)
		ids[i] = i;
	rc = emb_table_pull(t, ids, made + STEP, out, EMB_PULL_NOCREATE, found);
	CU_ASSERT_FATAL(rc >= 0);
	s1 = table_stats(t);
	CU_ASSERT_EQUAL(s1.rows, (uint64_t)(made + STEP - (uint32_t)rc));
	for (uint32_t i = 0; i < made; i++)
		CU_ASSERT_FATAL(found[i]);
	for (uint32_t i = 0; i < made + STEP; i++) {
		float zero[64] = {0};

		if (found[i])
			expect_floats("row", i, out + (size_t)i * 64, zero, 64,
				      &bad);
	}
	CU_ASSERT(s1.rows >= s0.rows);
	CU_ASSERT_EQUAL(s1.extents, k.adds - k.removes);
	expect_rows_registered(t, &k, 0, made);
	/* Existing rows still take updates. */
	for (uint32_t j = 0; j < 64; j++) {
		g[j] = 1.0f;
		want[j] = 0.0f - def.lr * g[j];
	}
	CU_ASSERT_EQUAL(emb_table_push(t, &old_id, 1, g), 0);
	CU_ASSERT_EQUAL(
	    emb_table_pull(t, &old_id, 1, out, EMB_PULL_NOCREATE, NULL), 0);
	expect_floats("pushed", old_id, out, want, 64, &bad);
	CU_ASSERT_EQUAL(bad, 0);

	/* Accept again: the failed batch now goes through. */
	k.fail_after = -1;
	CU_ASSERT_EQUAL(grow(t, made, STEP), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, (uint64_t)made + STEP);
	expect_rows_registered(t, &k, 0, made + STEP);
out:
	emb_table_destroy(t);
	expect_all_removed(&k);
	pthread_mutex_destroy(&k.lock);
	free(ids);
	free(found);
	free(out);
}

/* A replay that fails half-way takes back what it reported. */
static void test_hook_replay_fails(void)
{
	struct tracker k;
	struct emb_table *t = table_dim(64);
	struct emb_table_stats s;
	uint64_t calls;
	int rc;

	tracker_init(&k);
	CU_ASSERT_EQUAL(grow(t, 0, 2 * ROWS), 0);
	s = table_stats(t);
	CU_ASSERT_FATAL(s.extents >= 1);
	/* Fail the last extent, so that earlier ones need undoing. */
	k.fail_after = (int64_t)s.extents - 1;
	rc = emb_table_set_extent_hook(t, hook, &k);
	CU_ASSERT(rc < 0);
	CU_ASSERT_EQUAL(k.n, 0);
	CU_ASSERT_EQUAL(k.bytes_added, k.bytes_removed);
	CU_ASSERT_EQUAL(k.adds, s.extents - 1);
	CU_ASSERT_EQUAL(k.errors, 0);
	/* The hook is gone: growth and destroy call nothing. */
	calls = k.calls;
	CU_ASSERT_EQUAL(grow(t, 2 * ROWS, ROWS), 0);
	emb_table_destroy(t);
	CU_ASSERT_EQUAL(k.calls, calls);
	pthread_mutex_destroy(&k.lock);
}

static void test_hook_cleared(void)
{
	struct tracker k;
	struct emb_table *t = table_dim(64);
	uint64_t calls;

	tracker_init(&k);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_extent_hook(t, hook, &k), 0);
	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0);
	calls = k.calls;
	CU_ASSERT(calls > 0);
	CU_ASSERT_EQUAL(emb_table_set_extent_hook(t, NULL, NULL), 0);
	CU_ASSERT_EQUAL(k.calls, calls);
	CU_ASSERT_EQUAL(grow(t, ROWS, ROWS), 0);
	emb_table_destroy(t);
	CU_ASSERT_EQUAL(k.calls, calls);
	pthread_mutex_destroy(&k.lock);
}

/*
 * The hook calls emb_table_stats() on its own table. Run on a helper thread:
 * if a store lock is held around the hook this deadlocks, and the case
 * reports that instead of hanging the suite (the table is then leaked, as
 * destroying it would block too).
 */
struct reenter_arg {
	struct emb_table *t;
	struct tracker *k;
	bool replay; /* set the hook after rows exist, rather than before */
	bool done;
};

static void *reenter_worker(void *p)
{
	struct reenter_arg *a = p;

	/* Growth: the hook re-enters only on extents mapped after it was
	 * set. Replay: only on the replayed ones, and growth after. */
	if (!a->replay)
		emb_table_set_extent_hook(a->t, hook, a->k);
	grow(a->t, 0, 1000);
	a->k->peek = a->t;
	if (a->replay)
		emb_table_set_extent_hook(a->t, hook, a->k);
	grow(a->t, 1000, ROWS);
	__atomic_store_n(&a->done, true, __ATOMIC_RELEASE);
	return NULL;
}

#define REENTER_WAIT_S 5

static void reenter(bool replay)
{
	struct tracker k;
	struct reenter_arg a = {.t = table_dim(64), .k = &k, .replay = replay};
	struct timespec until;
	pthread_t th;

	tracker_init(&k);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, reenter_worker, &a), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += REENTER_WAIT_S;
	if (pthread_timedjoin_np(th, NULL, &until) != 0) {
		fprintf(stderr,
			"\n    hook calling emb_table_stats() %s did not "
			"return in %d s: a store lock is held around it",
			replay ? "during replay" : "during growth",
			REENTER_WAIT_S);
		CU_FAIL("hook re-entering the table deadlocks");
		pthread_detach(th);
		return;
	}
	CU_ASSERT(a.done);
	CU_ASSERT(k.adds >= 2);
	k.peek = NULL;
	emb_table_destroy(a.t);
	expect_all_removed(&k);
	pthread_mutex_destroy(&k.lock);
}

static void test_hook_reenters_growth(void)
{
	reenter(false);
}

static void test_hook_reenters_replay(void)
{
	reenter(true);
}

/* Whether [addr, +len) is registered whole, as one range. */
static bool tracker_has(struct tracker *k, void *addr, size_t len)
{
	bool has = false;

	pthread_mutex_lock(&k->lock);
	for (uint32_t i = 0; i < k->n; i++)
		has |= k->r[i].lo == (uintptr_t)addr &&
		       k->r[i].hi == (uintptr_t)addr + len;
	pthread_mutex_unlock(&k->lock);
	return has;
}

/*
 * A table growing by whole extents has its next one mapped and its pages
 * faulted in ahead, after a batch let go of its locks (arena.c, "The
 * spare"): the first writes to it do not fault under a shard's lock. The
 * spare is not the owner's until jemalloc takes it (then the hook hears of
 * it like any extent), and destroy unmaps it.
 */
static void test_spare_extent(void)
{
	struct tracker k;
	struct emb_table *t = table_dim(64);
	unsigned char vec[4096 / 4];
	uint64_t extents, bytes, first = ROWS;
	void *addr, *next;
	size_t len, len2, page = (size_t)sysconf(_SC_PAGESIZE);
	int resident = 0;

	tracker_init(&k);
	CU_ASSERT_EQUAL_FATAL(emb_table_set_extent_hook(t, hook, &k), 0);
	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0); /* 16 MB of rows */
	emb__arena_settle(t->arena); /* the helper thread makes it */
	CU_ASSERT_FATAL(emb__arena_spare(t->arena, &addr, &len));
	CU_ASSERT_FATAL(len > 0 && len / page <= sizeof(vec));
	CU_ASSERT_FALSE(tracker_has(&k, addr, len));
	CU_ASSERT_EQUAL(mincore(addr, len, vec), 0);
	for (size_t i = 0; i < len / page; i++)
		resident += vec[i] & 1;
	CU_ASSERT_EQUAL(resident, (int)(len / page));
	/* Grow until the arena maps another extent: it is the spare. */
	emb__arena_usage(t->arena, &extents, &bytes);
	for (int i = 0; i < 40; i++) {
		uint64_t e2, b2;

		CU_ASSERT_EQUAL(grow(t, first, 2048), 0);
		first += 2048;
		emb__arena_usage(t->arena, &e2, &b2);
		if (e2 > extents)
			break;
	}
	CU_ASSERT(tracker_has(&k, addr, len));
	emb__arena_settle(t->arena);
	CU_ASSERT(emb__arena_spare(t->arena, &next, &len2));
	CU_ASSERT(next != addr);
	expect_rows_registered(t, &k, 0, (uint32_t)first);
	CU_ASSERT_EQUAL(k.errors, 0);
	emb_table_destroy(t);
	expect_all_removed(&k);
	pthread_mutex_destroy(&k.lock);
}

/* test_spare_taken_while_made(): the table, and the next id to make. */
static struct emb_table *prep_t;
static uint64_t prep_next;
static int prep_calls;

/* Makes rows until the arena maps another extent, while the spare is
 * being made: the extent goes out fresh, the spare not yet there. */
static void grow_while_preparing(struct emb_arena *a)
{
	uint64_t e0, e = 0, b;

	(void)a;
	emb__arena_while_preparing = NULL; /* once */
	prep_calls++;
	emb__arena_usage(prep_t->arena, &e0, &b);
	for (int i = 0; i < 40; i++) {
		uint64_t first = prep_next;

		prep_next += 2048;
		CU_ASSERT_EQUAL(grow(prep_t, first, 2048), 0);
		emb__arena_usage(prep_t->arena, &e, &b);
		if (e > e0)
			break;
	}
	CU_ASSERT(e > e0);
	CU_ASSERT(emb__arena_wants_spare(prep_t->arena));
}

/*
 * An extent that goes out while the spare is being made is mapped fresh
 * and asks for a spare again; once the one being made is ready, the
 * arena asks no more, so the batches that make rows after it do not take
 * the arena's lock each until the spare is used.
 */
static void test_spare_taken_while_made(void)
{
	struct emb_table *t = table_dim(64);
	void *addr;
	size_t len;

	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0);
	emb__arena_settle(t->arena);
	CU_ASSERT_FATAL(emb__arena_spare(t->arena, &addr, &len));
	CU_ASSERT_FALSE(emb__arena_wants_spare(t->arena));
	prep_t = t;
	prep_next = ROWS;
	prep_calls = 0;
	emb__arena_while_preparing = grow_while_preparing;
	/* Until jemalloc takes the spare: the batch that took it asks for
	 * the next one, and while the helper makes it the hook takes
	 * another extent (on the helper's thread; this one waits). */
	for (int i = 0; i < 40 && !prep_calls; i++) {
		uint64_t first = prep_next;

		prep_next += 2048;
		CU_ASSERT_EQUAL(grow(t, first, 2048), 0);
		emb__arena_settle(t->arena);
	}
	emb__arena_while_preparing = NULL;
	CU_ASSERT_EQUAL_FATAL(prep_calls, 1);
	CU_ASSERT(emb__arena_spare(t->arena, &addr, &len));
	CU_ASSERT_FALSE(emb__arena_wants_spare(t->arena));
	emb_table_destroy(t);
}

/* test_spare_thread(): where the last spare was made, and how often. */
static pthread_t made_on;
static int made_calls;

static void note_thread(struct emb_arena *a)
{
	(void)a;
	made_on = pthread_self();
	made_calls++;
}

/*
 * The spare is made by the arena's helper thread, not by the batch that
 * asked (in a server, a loop thread with other connections to serve). A
 * process forked from this one has no helper: its batches make the spare
 * themselves, and destroying the table there waits for no thread.
 */
static void test_spare_thread(void)
{
	struct emb_table *t = table_dim(64);
	void *addr;
	size_t len;
	pid_t pid;
	int st = -1;

	made_calls = 0;
	emb__arena_while_preparing = note_thread;
	CU_ASSERT_EQUAL(grow(t, 0, ROWS), 0);
	emb__arena_settle(t->arena);
	emb__arena_while_preparing = NULL;
	CU_ASSERT(made_calls >= 1);
	CU_ASSERT_FALSE(pthread_equal(made_on, pthread_self()));
	CU_ASSERT(emb__arena_spare(t->arena, &addr, &len));

	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		bool ok;

		made_calls = 0;
		emb__arena_while_preparing = note_thread;
		ok = grow(t, ROWS, ROWS) == 0 && made_calls >= 1 &&
		     pthread_equal(made_on, pthread_self()) &&
		     emb__arena_spare(t->arena, &addr, &len);
		emb_table_destroy(t);
		_exit(ok ? 0 : 1);
	}
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	emb_table_destroy(t);
}

/*
 * emb_store_pretouch() (arena.c, "The pretouched pool"), in a child, whose
 * pool is its own: made once; tables' extents are cut from it, the hook
 * hears of them as of any, while it lasts, then fresh memory is mapped;
 * rows made in either are the same. Returns 0, or the step that failed.
 */
static int pretouch_child(void)
{
	const uint64_t pool = 32u << 20;
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct tracker k;
	struct emb_table *a, *b;
	uint64_t left, ids[512];
	float *ra, *rb;
	int rc = 0;

	if (emb_store_pretouch(0) != -EINVAL)
		return 1;
	if (emb_store_pretouch(pool) != 0)
		return 2;
	if (emb_store_pretouch(pool) != -EALREADY)
		return 3;
	if (emb_store_pretouch_left() != pool)
		return 4;
	o.dim = 64;
	o.nshards = 4;
	tracker_init(&k);
	a = table_new(&o);
	if (emb_table_set_extent_hook(a, hook, &k) || grow(a, 0, ROWS))
		return 5;
	/* 60,000 records of 272 bytes: 16 MB of extents at least. */
	left = emb_store_pretouch_left();
	if (left > pool - (16u << 20))
		return 6;
	/* Past the pool: fresh memory, the same rows. */
	if (grow(a, ROWS, 3 * ROWS) || emb_store_pretouch_left() != 0)
		return 7;
	b = table_new(&o);
	ra = xcalloc(512 * 64, sizeof(float));
	rb = xcalloc(512 * 64, sizeof(float));
	for (uint32_t i = 0; i < 512; i++)
		ids[i] = (uint64_t)i * (4 * ROWS / 512);
	if (emb_table_pull(a, ids, 512, ra, 0, NULL) < 0 ||
	    emb_table_pull(b, ids, 512, rb, 0, NULL) < 0)
		rc = 8;
	else if (memcmp(ra, rb, 512 * 64 * sizeof(float)))
		rc = 9;
	expect_rows_registered(a, &k, 0, 4 * ROWS);
	if (!rc && k.errors)
		rc = 10;
	emb_table_destroy(a);
	emb_table_destroy(b);
	free(ra);
	free(rb);
	return rc;
}

static void test_pretouch(void)
{
	pid_t pid = fork();
	int st;

	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(pretouch_child());
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFEXITED(st));
	if (WIFEXITED(st) && WEXITSTATUS(st))
		fprintf(stderr, "\n    pretouch child failed at step %d",
			WEXITSTATUS(st));
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"hook sees every extent holding rows, all removed on destroy",
	     test_hook_from_start},
	    {"setting the hook late replays mapped extents", test_hook_replays},
	    {"refused extent fails the pull, table stays consistent",
	     test_hook_refuses},
	    {"failed replay is undone and clears the hook",
	     test_hook_replay_fails},
	    {"cleared hook is not called again", test_hook_cleared},
	    {"hook may call back into the table while it grows",
	     test_hook_reenters_growth},
	    {"a growing table's next extent is faulted in ahead",
	     test_spare_extent},
	    {"an extent taken while the spare is made: none is asked for "
	     "once it is ready",
	     test_spare_taken_while_made},
	    {"the spare is made by the arena's thread; a forked child makes "
	     "its own",
	     test_spare_thread},
	    {"a pretouched pool gives tables their extents until it is used "
	     "up, with the same rows",
	     test_pretouch},
	    {"hook may call back into the table during replay",
	     test_hook_reenters_replay},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/arena", cases);
}
