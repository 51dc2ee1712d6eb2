/*
 * tests/store/test_index.c - the id index against a reference map.
 *
 * A fixed-seed random mix of pull, no-create pull, assign, push and erase
 * batches (over a million id operations per run) is applied both to a table
 * and to a plain array indexed by key; every answer the table gives is
 * checked as it comes. Few shards make each shard grow through many resizes;
 * erasing most rows and inserting again exercises deletion and reuse. SGD
 * with lr 1 and integer gradients keeps the expected weights exact.
 * Single-threaded.
 *
 * Two cases look inside (store_int.h): rows removed and made again in the
 * window while a shard's next index is built, on both sides of the build's
 * walk, with the index's entries counted against the records after every
 * operation; and an index sized ahead for the rows coming
 * (emb_table_reserve()).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_test.h"
#include "store/store_int.h"

#define DIM	      2
#define UNIVERSE      (1u << 17) /* distinct keys */
#define BATCH_MAX     48
#define OPS_PER_PHASE 550000u

struct ref {
	uint8_t *present;
	float *w;	 /* UNIVERSE * DIM */
	uint64_t nrows;	 /* keys present */
	uint64_t id_ops; /* ids passed to the table so far */
	uint64_t rng;	 /* splitmix64 state */
	uint32_t hot;	 /* keys are drawn from [0, hot) */
	int bad;	 /* mismatches seen */
	struct emb_table_opts o;
	struct emb_table *t;
};

/* Key -> id: a bijection that spreads keys over 64 bits, plus the two
 * extremes, which an index might be tempted to use as markers. */
static uint64_t key_id(uint32_t k)
{
	if (k == UNIVERSE - 1)
		return UINT64_MAX;
	return (uint64_t)k * 0x9e3779b97f4a7c15ull;
}

static void mismatch(struct ref *r, const char *what, uint32_t k, double want,
		     double got)
{
	if (r->bad++ < 8)
		fprintf(stderr,
			"\n    %s key %u id %llu: expected %.9g got %.9g "
			"(after %llu id ops)",
			what, k, (unsigned long long)key_id(k), want, got,
			(unsigned long long)r->id_ops);
}

static void ref_create(struct ref *r, uint32_t k)
{
	if (r->present[k])
		return;
	emb_init_row(&r->o.init, r->o.seed, key_id(k), &r->w[k * DIM], DIM);
	r->present[k] = 1;
	r->nrows++;
}

/* n keys, all distinct when uniq. */
static uint32_t draw_keys(struct ref *r, uint32_t *keys, uint64_t *ids,
			  bool uniq)
{
	uint32_t n = 1 + rnd_below(&r->rng, BATCH_MAX);

	for (uint32_t i = 0; i < n; i++) {
		uint32_t k;
		bool dup;

		do {
			k = rnd_below(&r->rng, r->hot);
			dup = false;
			for (uint32_t j = 0; uniq && j < i; j++)
				dup |= keys[j] == k;
		} while (dup);
		keys[i] = k;
		ids[i] = key_id(k);
	}
	r->id_ops += n;
	return n;
}

static void op_pull(struct ref *r, bool create)
{
	uint32_t keys[BATCH_MAX], missing = 0, missing_distinct = 0, n;
	uint64_t ids[BATCH_MAX];
	float out[BATCH_MAX * DIM];
	uint8_t found[BATCH_MAX];
	int rc;

	/* Half the batches repeat keys. A no-create pull counts every
	 * occurrence of a missing id; for a creating pull store.h leaves
	 * open whether a repeat counts again, so either count is accepted. */
	n = draw_keys(r, keys, ids, rnd_below(&r->rng, 2));
	for (uint32_t i = 0; i < n; i++) {
		bool first = true;

		for (uint32_t j = 0; j < i && first; j++)
			first = keys[j] != keys[i];
		missing += !r->present[keys[i]];
		missing_distinct += first && !r->present[keys[i]];
	}
	memset(found, 0xee, sizeof(found));
	rc = emb_table_pull(r->t, ids, n, out, create ? 0 : EMB_PULL_NOCREATE,
			    create ? NULL : found);
	if (rc != (int)missing && !(create && rc == (int)missing_distinct))
		mismatch(r, create ? "pull rc" : "nocreate rc", keys[0],
			 missing, rc);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = keys[i];
		float zero[DIM] = {0};
		const float *want;

		if (create)
			ref_create(r, k);
		else if (found[i] != r->present[k])
			mismatch(r, "found", k, r->present[k], found[i]);
		want = r->present[k] ? &r->w[k * DIM] : zero;
		for (uint32_t j = 0; j < DIM; j++) {
			if (memcmp(&out[i * DIM + j], &want[j], sizeof(float)))
				mismatch(r, "pulled weight", k, want[j],
					 out[i * DIM + j]);
		}
	}
}

static void op_assign(struct ref *r)
{
	uint32_t keys[BATCH_MAX], n;
	uint64_t ids[BATCH_MAX];
	float rows[BATCH_MAX * DIM];
	int rc;

	n = draw_keys(r, keys, ids, false);
	for (uint32_t i = 0; i < n * DIM; i++)
		rows[i] = (float)rnd_below(&r->rng, 1000) - 500.0f;
	rc = emb_table_assign(r->t, ids, n, rows, false, NULL);
	if (rc != 0)
		mismatch(r, "assign rc", keys[0], 0, rc);
	/* In order, so the last of a duplicated key wins. */
	for (uint32_t i = 0; i < n; i++) {
		ref_create(r, keys[i]);
		memcpy(&r->w[keys[i] * DIM], &rows[i * DIM],
		       DIM * sizeof(float));
	}
}

static void op_push(struct ref *r)
{
	uint32_t keys[BATCH_MAX], n;
	uint64_t ids[BATCH_MAX];
	float g[BATCH_MAX * DIM], sum[BATCH_MAX * DIM];
	uint8_t done[BATCH_MAX] = {0};
	int rc;

	n = draw_keys(r, keys, ids, false);
	for (uint32_t i = 0; i < n * DIM; i++)
		g[i] = (float)rnd_below(&r->rng, 7) - 3.0f;
	rc = emb_table_push(r->t, ids, n, g);
	if (rc != 0)
		mismatch(r, "push rc", keys[0], 0, rc);
	/* Duplicates are summed first (exact: small integers), then
	 * w -= 1 * sum, rounded once like the table does. */
	for (uint32_t i = 0; i < n; i++) {
		if (done[i])
			continue;
		memcpy(&sum[i * DIM], &g[i * DIM], DIM * sizeof(float));
		for (uint32_t j = i + 1; j < n; j++) {
			if (keys[j] != keys[i])
				continue;
			done[j] = 1;
			for (uint32_t d = 0; d < DIM; d++)
				sum[i * DIM + d] += g[j * DIM + d];
		}
		ref_create(r, keys[i]);
		for (uint32_t d = 0; d < DIM; d++)
			r->w[keys[i] * DIM + d] -= sum[i * DIM + d];
	}
}

static void op_erase(struct ref *r)
{
	uint32_t keys[BATCH_MAX], present = 0, n;
	uint64_t ids[BATCH_MAX];
	int rc;

	n = draw_keys(r, keys, ids, true);
	for (uint32_t i = 0; i < n; i++) {
		present += r->present[keys[i]];
		if (r->present[keys[i]]) {
			r->present[keys[i]] = 0;
			r->nrows--;
		}
	}
	rc = emb_table_erase(r->t, ids, n);
	if (rc != (int)present)
		mismatch(r, "erase rc", keys[0], present, rc);
}

static void random_ops(struct ref *r, uint64_t n_ops, uint32_t erase_pct)
{
	uint64_t end = r->id_ops + n_ops;

	while (r->id_ops < end && r->bad < 8) {
		uint32_t p = rnd_below(&r->rng, 100);

		/* The key range widens as the run goes, so shards keep
		 * growing rather than filling once. */
		if (r->hot < UNIVERSE && rnd_below(&r->rng, 4) == 0)
			r->hot += r->hot / 64 + 1;
		if (r->hot > UNIVERSE)
			r->hot = UNIVERSE;
		if (p < erase_pct)
			op_erase(r);
		else if (p < erase_pct + 30)
			op_pull(r, true);
		else if (p < erase_pct + 50)
			op_pull(r, false);
		else if (p < erase_pct + 65)
			op_assign(r);
		else
			op_push(r);
	}
}

/* The whole table against the whole reference, through the iterator. */
static void verify_all(struct ref *r, const char *phase)
{
	enum { CHUNK = 1000 };
	uint64_t *ids = xcalloc(CHUNK, sizeof(*ids));
	float *rows = xcalloc((size_t)CHUNK * DIM, sizeof(float));
	uint8_t *seen = xcalloc(UNIVERSE, 1);
	struct emb_table_iter *it;
	struct emb_table_stats s = table_stats(r->t);
	uint64_t total = 0;
	int got;

	if (s.rows != r->nrows)
		fprintf(stderr, "\n    %s: stats.rows %llu, reference %llu",
			phase, (unsigned long long)s.rows,
			(unsigned long long)r->nrows);
	CU_ASSERT_EQUAL(s.rows, r->nrows);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(r->t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, CHUNK)) > 0) {
		for (int i = 0; i < got; i++) {
			/* Invert key_id(): multiply by the inverse of the odd
			 * constant modulo 2^64. */
			uint64_t k = ids[i] == UINT64_MAX
					 ? UNIVERSE - 1
					 : ids[i] * 0xf1de83e19937733dull;

			if (k >= UNIVERSE || !r->present[k] || seen[k]++) {
				mismatch(r, "iterated id", 0, 0,
					 (double)ids[i]);
				continue;
			}
			for (uint32_t j = 0; j < DIM; j++) {
				if (memcmp(&rows[i * DIM + j],
					   &r->w[k * DIM + j], sizeof(float)))
					mismatch(r, "iterated weight",
						 (uint32_t)k, r->w[k * DIM + j],
						 rows[i * DIM + j]);
			}
		}
		total += (uint64_t)got;
	}
	CU_ASSERT_EQUAL(got, 0);
	CU_ASSERT_EQUAL(total, r->nrows);
	emb_table_iter_destroy(it);
	free(ids);
	free(rows);
	free(seen);
}

/* Erases all but about one present key in ten, in random batches. */
static void erase_most(struct ref *r)
{
	uint64_t ids[BATCH_MAX];
	uint32_t n = 0, present = 0;
	int rc;

	for (uint32_t k = 0; k < UNIVERSE; k++) {
		if (!r->present[k] || rnd_below(&r->rng, 10) == 0)
			continue;
		ids[n++] = key_id(k);
		present++;
		r->present[k] = 0;
		r->nrows--;
		if (n == BATCH_MAX || k == UNIVERSE - 1) {
			rc = emb_table_erase(r->t, ids, n);
			if (rc != (int)present)
				mismatch(r, "bulk erase rc", k, present, rc);
			r->id_ops += n;
			n = present = 0;
		}
	}
	if (n) {
		rc = emb_table_erase(r->t, ids, n);
		if (rc != (int)present)
			mismatch(r, "bulk erase rc", 0, present, rc);
		r->id_ops += n;
	}
}

static void run(uint32_t nshards, uint64_t seed)
{
	struct ref r = {0};
	uint64_t peak;

	r.o = EMB_TABLE_OPTS_DEFAULT;
	r.o.dim = DIM;
	r.o.nshards = nshards;
	r.o.optim.lr = 1.0f;
	r.o.seed = seed;
	r.rng = seed;
	r.hot = 64;
	r.present = xcalloc(UNIVERSE, 1);
	r.w = xcalloc((size_t)UNIVERSE * DIM, sizeof(float));
	r.t = table_new(&r.o);

	/* Grow: few erases. */
	random_ops(&r, OPS_PER_PHASE, 5);
	verify_all(&r, "grown");
	peak = r.nrows;
	/* Shrink to a tenth, then insert again with mixed traffic. */
	erase_most(&r);
	verify_all(&r, "erased");
	CU_ASSERT(r.nrows < peak / 5);
	random_ops(&r, OPS_PER_PHASE, 10);
	verify_all(&r, "re-inserted");
	CU_ASSERT(r.nrows > peak / 2);
	CU_ASSERT(r.id_ops >= 1000000);
	fprintf(stderr,
		"\n    nshards %u: %llu id ops, peak %llu rows, %llu at end",
		nshards, (unsigned long long)r.id_ops, (unsigned long long)peak,
		(unsigned long long)r.nrows);
	CU_ASSERT_EQUAL(r.bad, 0);
	if (r.bad)
		fprintf(stderr, "\n    nshards %u: %d mismatches", nshards,
			r.bad);
	emb_table_destroy(r.t);
	free(r.present);
	free(r.w);
}

static void test_one_shard(void)
{
	run(1, 0x5eed0001);
}

static void test_four_shards(void)
{
	run(4, 0x5eed0004);
}

/* Entries in an index of n slots. */
static uint32_t entries(const uint32_t *slots, uint32_t n)
{
	uint32_t e = 0;

	for (uint32_t i = 0; i < n; i++)
		e += slots[i] != 0;
	return e;
}

/* Live records below end. */
static uint32_t live_below(struct emb_table *t, struct emb_shard *s,
			   uint32_t end)
{
	uint32_t n = 0;

	for (uint32_t idx = 0; idx < end; idx++)
		n += !(emb__shard_row(t, s, idx)->count & EMB_ROW_FREE);
	return n;
}

/* A live record in [lo, hi), drawn at random; UINT32_MAX if none. */
static uint32_t live_in(struct emb_table *t, struct emb_shard *s, uint64_t *rng,
			uint32_t lo, uint32_t hi)
{
	if (lo >= hi)
		return UINT32_MAX;
	for (uint32_t tries = 0; tries < 64; tries++) {
		uint32_t idx = lo + rnd_below(rng, hi - lo);

		if (!(emb__shard_row(t, s, idx)->count & EMB_ROW_FREE))
			return idx;
	}
	return UINT32_MAX;
}

/*
 * The index grows by a next one built a few records per row made
 * (src/store/shard.c, "Growing the index"). While a build runs, a record
 * removed below its walk must leave both indexes, and one reused below it
 * must enter both: else the swapped-in index lacks a row (a pull makes it
 * again, fresh) or keeps one erased (found again). Rows are erased on
 * both sides of the walk and new ones made into the freed records, build
 * after build, until the shard's index passes 100,000 slots.
 */
static void test_build_window(void)
{
	struct ref r = {0};
	struct emb_shard *s;
	uint32_t next_key = 0, builds = 0, below = 0, above = 0, steps = 0;
	uint64_t rng = 0x5eedb111;

	r.o = EMB_TABLE_OPTS_DEFAULT;
	r.o.dim = DIM;
	r.o.nshards = 1;
	r.o.seed = 7;
	r.present = xcalloc(UNIVERSE, 1);
	r.w = xcalloc((size_t)UNIVERSE * DIM, sizeof(float));
	r.t = table_new(&r.o);
	s = &r.t->shards[0];

	while (s->nslots < 100000 && next_key < UNIVERSE - 2) {
		uint64_t id = key_id(next_key);
		float out[DIM];
		bool building = s->next_slots != NULL;

		/* Outside a build, rows are only made: the shard grows to
		 * the next one. */
		if (!building) {
			CU_ASSERT_EQUAL(emb_table_pull(r.t, &id, 1, out, 0,
						       NULL), 1);
			r.present[next_key++] = 1;
			if (s->next_slots)
				builds++;
			continue;
		}
		/* Inside: one row erased below the walk, one above, then
		 * two made (into those records: the free list is LIFO). */
		for (int side = 0; side < 2; side++) {
			uint32_t idx = side ? live_in(r.t, s, &rng, s->built,
						      s->next_idx)
					    : live_in(r.t, s, &rng, 0, s->built);
			uint64_t gone;

			if (idx == UINT32_MAX)
				continue;
			gone = emb__shard_row(r.t, s, idx)->id;
			CU_ASSERT_EQUAL(emb_table_erase(r.t, &gone, 1), 1);
			r.present[gone == UINT64_MAX
				      ? UNIVERSE - 1
				      : gone * 0xf1de83e19937733dull] = 0;
			if (side)
				above++;
			else
				below++;
		}
		for (int k = 0; k < 2 && next_key < UNIVERSE - 2; k++) {
			id = key_id(next_key);
			CU_ASSERT_EQUAL(emb_table_pull(r.t, &id, 1, out, 0,
						       NULL), 1);
			r.present[next_key++] = 1;
		}
		/* Each count walks the whole index: under ThreadSanitizer
		 * every 16th step (a missing or extra entry stays until
		 * the swap, so a later count still finds it). */
		if (++steps % (EMB_TEST_TSAN ? 16 : 1))
			continue;
		CU_ASSERT_EQUAL(entries(s->slots, s->nslots), s->used);
		if (s->next_slots)
			CU_ASSERT_EQUAL(
			    entries(s->next_slots, s->next_nslots),
			    live_below(r.t, s, s->built));
	}
	CU_ASSERT(s->nslots >= 100000);
	CU_ASSERT(builds >= 15);
	CU_ASSERT(below > 1000 && above > 1000);
	/* Every row present is found, every one erased is not. */
	for (uint32_t k = 0; k < next_key; k++) {
		uint64_t id = key_id(k);
		float out[DIM];
		uint8_t found = 0xee;

		emb_table_pull(r.t, &id, 1, out, EMB_PULL_NOCREATE, &found);
		if (found != r.present[k])
			mismatch(&r, "present after builds", k, r.present[k],
				 found);
	}
	CU_ASSERT_EQUAL(r.bad, 0);
	fprintf(stderr, "\n    %u builds, %u rows erased below the walk, %u "
			"above, index %u slots",
		builds, below, above, s->nslots);
	emb_table_destroy(r.t);
	free(r.present);
	free(r.w);
}

/* Makes rows for ids first*K+1 .. (first+n)*K (K odd: distinct, spread). */
static void make_rows(struct emb_table *t, uint64_t first, uint32_t n)
{
	enum { B = 1024 };
	uint64_t ids[B];
	float *out = xcalloc((size_t)B * DIM, sizeof(float));

	for (uint32_t i = 0; i < n; i += B) {
		uint32_t k = n - i < B ? n - i : B;

		for (uint32_t j = 0; j < k; j++)
			ids[j] = (first + i + j + 1) * 0x9e3779b97f4a7c15ull;
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, k, out, 0, NULL),
				(int)k);
	}
	free(out);
}

/* Whether every row of make_rows(t, 0, n) is found. */
static bool all_found(struct emb_table *t, uint32_t n)
{
	uint64_t id;
	float out[DIM];
	uint8_t found;

	for (uint32_t i = 0; i < n; i++) {
		id = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
		emb_table_pull(t, &id, 1, out, EMB_PULL_NOCREATE, &found);
		if (!found)
			return false;
	}
	return true;
}

/*
 * emb_table_reserve() (shard.c, "Room for a move"): a shard of few
 * records gets an index for its share of the rows coming at once, and
 * making them grows it no more; a fuller shard starts one build of that
 * size, and the rows coming finish it with no growth after. Every row is
 * found, and each index holds exactly the live records.
 */
static void test_reserve(void)
{
	enum { NSH = 4, FEW = 1000, MORE = 40000, LOTS = 200000 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table *t;
	uint32_t sized[NSH];

	o.dim = DIM;
	o.nshards = NSH;
	t = table_new(&o);
	make_rows(t, 0, FEW);
	CU_ASSERT_EQUAL(emb_table_reserve(t, MORE), NSH);
	for (uint32_t i = 0; i < NSH; i++) {
		struct emb_shard *s = &t->shards[i];

		CU_ASSERT_PTR_NULL(s->next_slots); /* swapped in at once */
		CU_ASSERT(s->used + MORE / NSH <= s->nslots * 7 / 10);
		CU_ASSERT_EQUAL(entries(s->slots, s->nslots), s->used);
		sized[i] = s->nslots;
	}
	make_rows(t, FEW, MORE);
	for (uint32_t i = 0; i < NSH; i++) {
		struct emb_shard *s = &t->shards[i];

		CU_ASSERT_EQUAL(s->nslots, sized[i]);
		CU_ASSERT_PTR_NULL(s->next_slots);
		CU_ASSERT_EQUAL(entries(s->slots, s->nslots), s->used);
	}
	CU_ASSERT(all_found(t, FEW + MORE));

	/* Over RESERVE_NOW records a shard: a build, in steps. */
	CU_ASSERT_EQUAL(emb_table_reserve(t, LOTS), NSH);
	for (uint32_t i = 0; i < NSH; i++) {
		struct emb_shard *s = &t->shards[i];

		CU_ASSERT_PTR_NOT_NULL_FATAL(s->next_slots);
		CU_ASSERT(s->used + LOTS / NSH <= s->next_nslots * 7 / 10);
		sized[i] = s->next_nslots;
	}
	make_rows(t, FEW + MORE, LOTS);
	for (uint32_t i = 0; i < NSH; i++) {
		struct emb_shard *s = &t->shards[i];

		CU_ASSERT_EQUAL(s->nslots, sized[i]);
		CU_ASSERT_PTR_NULL(s->next_slots);
		CU_ASSERT_EQUAL(entries(s->slots, s->nslots), s->used);
	}
	CU_ASSERT(all_found(t, FEW + MORE + LOTS));
	/* A reserve with the room there already changes nothing. */
	CU_ASSERT_EQUAL(emb_table_reserve(t, 1000), 0);
	for (uint32_t i = 0; i < NSH; i++)
		CU_ASSERT_PTR_NULL(t->shards[i].next_slots);
	emb_table_destroy(t);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"one shard matches a reference map over 1M ops", test_one_shard},
	    {"four shards match a reference map over 1M ops", test_four_shards},
	    {"rows erased and made again while the index grows",
	     test_build_window},
	    {"a reserve sizes the index once for the rows coming",
	     test_reserve},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/index", cases);
}
