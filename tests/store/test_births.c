/*
 * tests/store/test_births.c - births (store.h, "Births"): the number each
 * row is given when made, per slot, and what a push naming births does on
 * a holder: apply, make the row again, drop, or make an absent one. The
 * last case plays a primary and its backup through an eviction and a
 * remake, the race docs/replication.md ("Eviction with replicas") gives
 * births for.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_test.h"

#define DIM 4

static struct emb_table_opts births_opts(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.dim = DIM;
	o.nshards = 4;
	o.optim.kind = EMB_OPTIM_SGD;
	o.optim.lr = 1.0f;
	return o;
}

static struct emb_table *births_table(const struct emb_table_opts *o)
{
	struct emb_table *t = table_new(o);

	CU_ASSERT_EQUAL_FATAL(emb_table_births_enable(t), 0);
	return t;
}

static uint32_t birth_of(struct emb_table *t, uint64_t id)
{
	uint32_t b = 0;

	CU_ASSERT(emb_table_births(t, &id, 1, &b) >= 0);
	return b;
}

/* Two ids of one slot, the second found past after. */
static uint64_t same_slot(uint64_t id, uint64_t after)
{
	for (uint64_t j = after + 1;; j++)
		if (emb_id_slot(j) == emb_id_slot(id) && j != id)
			return j;
}

static void weights(struct emb_table *t, uint64_t id, float *w)
{
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w, EMB_PULL_NOCREATE, NULL),
			0);
}

/* Rows are numbered from 1 per slot as they are made, by a pull or a push;
 * rows made before numbering keep 0; the counter is the slot's newest. */
static void test_numbering(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = table_new(&o);
	uint64_t a = 1000, b = same_slot(a, a), c = same_slot(a, b), old = 5;
	float w[DIM], g[DIM] = {0};
	uint32_t got[3];

	CU_ASSERT_FALSE(emb_table_has_births(t));
	{
		/* Numbering costs the table its counters, in its bytes. */
		struct emb_table *u = table_new(&o);
		uint64_t before = table_stats(u).bytes;

		CU_ASSERT_EQUAL_FATAL(emb_table_births_enable(u), 0);
		CU_ASSERT_EQUAL(table_stats(u).bytes,
				before + EMB_NSLOTS * sizeof(uint32_t));
		emb_table_destroy(u);
	}
	/* Before numbering: which ids are rows, each of birth 0. */
	CU_ASSERT_EQUAL(emb_table_births(t, &a, 1, got), 0);
	CU_ASSERT_EQUAL(got[0], EMB_BIRTH_NONE);
	CU_ASSERT_EQUAL(emb_table_push_births(t, &a, 1, g, got, 0),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_pull(t, &old, 1, w, 0, NULL), 1);
	CU_ASSERT_EQUAL(emb_table_births(t, &old, 1, got), 1);
	CU_ASSERT_EQUAL(got[0], 0);
	CU_ASSERT_EQUAL(emb_table_births_enable(t), 0);
	CU_ASSERT_EQUAL(emb_table_births_enable(t), 0); /* idempotent */
	CU_ASSERT_TRUE(emb_table_has_births(t));
	CU_ASSERT_EQUAL(birth_of(t, old), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, &a, 1, w, 0, NULL), 1);
	CU_ASSERT_EQUAL(emb_table_push(t, &b, 1, g), 0);
	CU_ASSERT_EQUAL(birth_of(t, a), 1);
	CU_ASSERT_EQUAL(birth_of(t, b), 2);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(a)), 2);
	/* An absent id: EMB_BIRTH_NONE, and not counted as found. */
	{
		uint64_t ids[3] = {a, c, b};

		CU_ASSERT_EQUAL(emb_table_births(t, ids, 3, got), 2);
		CU_ASSERT_EQUAL(got[0], 1);
		CU_ASSERT_EQUAL(got[1], EMB_BIRTH_NONE);
		CU_ASSERT_EQUAL(got[2], 2);
	}
	/* Erased and made again: a newer birth than any before. */
	CU_ASSERT_EQUAL(emb_table_erase(t, &a, 1), 1);
	CU_ASSERT_EQUAL(birth_of(t, a), EMB_BIRTH_NONE);
	CU_ASSERT_EQUAL(emb_table_pull(t, &a, 1, w, 0, NULL), 1);
	CU_ASSERT_EQUAL(birth_of(t, a), 3);
	/* Another slot counts on its own. */
	{
		uint64_t d = a + 1;

		while (emb_id_slot(d) == emb_id_slot(a))
			d++;
		CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(d)), 0);
		CU_ASSERT_EQUAL(emb_table_pull(t, &d, 1, w, 0, NULL), 1);
		CU_ASSERT_EQUAL(birth_of(t, d), 1);
	}
	/* Raised: the next row is made past it; lower is no change. */
	emb_table_slot_birth_raise(t, emb_id_slot(a), 100);
	emb_table_slot_birth_raise(t, emb_id_slot(a), 50);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(a)), 100);
	CU_ASSERT_EQUAL(emb_table_pull(t, &c, 1, w, 0, NULL), 1);
	CU_ASSERT_EQUAL(birth_of(t, c), 101);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, EMB_NSLOTS), 0);
	emb_table_destroy(t);
}

/* Many rows in many slabs, numbered as the shards grow: every row has a
 * birth, and in each slot they are 1..n with none repeated. */
static void test_numbering_grows(void)
{
	enum { N = 60000 };
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	uint32_t *got = xcalloc(N, sizeof(*got));
	uint32_t *seen = xcalloc(EMB_NSLOTS, sizeof(*seen));
	float *w = xcalloc((size_t)N * DIM, sizeof(float));
	uint64_t sum = 0, want = 0;

	for (uint32_t i = 0; i < N; i++)
		ids[i] = 1 + 7 * (uint64_t)i;
	for (uint32_t i = 0; i < N; i += 1000)
		CU_ASSERT_EQUAL(emb_table_pull(t, ids + i, 1000, w, 0, NULL),
				1000);
	CU_ASSERT_EQUAL(emb_table_births(t, ids, N, got), N);
	for (uint32_t i = 0; i < N; i++) {
		CU_ASSERT(got[i] >= 1);
		seen[emb_id_slot(ids[i])]++;
		sum += got[i];
	}
	/* Per slot: births 1..n, so their sum is n(n+1)/2. */
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		want += (uint64_t)seen[sl] * (seen[sl] + 1) / 2;
		CU_ASSERT_EQUAL(emb_table_slot_birth(t, sl), seen[sl]);
	}
	CU_ASSERT_EQUAL(sum, want);
	free(w);
	free(seen);
	free(got);
	free(ids);
	emb_table_destroy(t);
}

/* A backup's push naming births: absent rows are made with the birth
 * named; the same birth takes the gradient; an older row is made again
 * first; a newer one drops it. */
static void test_backup_rules(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t id = 4242;
	uint32_t b7 = 7, b3 = 3, b9 = 9;
	float init[DIM], w[DIM], g[DIM] = {1.0f, 1.0f, 1.0f, 1.0f};

	ref_new_row(&o, id, init);
	/* Absent: made, with birth 7, the slot's counter raised to it. */
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b7, 0), 0);
	CU_ASSERT_EQUAL(birth_of(t, id), 7);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(id)), 7);
	weights(t, id, w);
	for (int j = 0; j < DIM; j++)
		CU_ASSERT_EQUAL(w[j], init[j] - 1.0f);
	/* The same birth: applied. */
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b7, 0), 0);
	weights(t, id, w);
	for (int j = 0; j < DIM; j++)
		CU_ASSERT_EQUAL(w[j], (init[j] - 1.0f) - 1.0f);
	/* Older than the row: dropped, counted, nothing changed. */
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b3, 0), 0);
	CU_ASSERT_EQUAL(emb_table_births_dropped(t), 1);
	CU_ASSERT_EQUAL(birth_of(t, id), 7);
	weights(t, id, w);
	for (int j = 0; j < DIM; j++)
		CU_ASSERT_EQUAL(w[j], (init[j] - 1.0f) - 1.0f);
	/* Newer than the row (it was removed and made again on the
	 * primary): the row starts over from its initial values. */
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b9, 0), 0);
	CU_ASSERT_EQUAL(birth_of(t, id), 9);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(id)), 9);
	weights(t, id, w);
	for (int j = 0; j < DIM; j++)
		CU_ASSERT_EQUAL(w[j], init[j] - 1.0f);
	CU_ASSERT_EQUAL(table_stats(t).rows, 1);
	/* Flags past the two are refused, as are births without ids'. */
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b9, 0x4),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, NULL, 0),
			EMB_EBADARG);
	emb_table_destroy(t);
}

/* A primary's push naming births: an absent row with a birth at or under
 * the counter was removed since (dropped); one above it was given by a
 * primary before this one (made). */
static void test_primary_rules(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t id = 31337, other;
	uint32_t b;
	float w[DIM], g[DIM] = {1.0f, 1.0f, 1.0f, 1.0f};

	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w, 0, NULL), 1);
	b = birth_of(t, id);
	CU_ASSERT_EQUAL(b, 1);
	CU_ASSERT_EQUAL(emb_table_erase(t, &id, 1), 1);
	CU_ASSERT_EQUAL(
	    emb_table_push_births(t, &id, 1, g, &b, EMB_PUSH_PRIMARY), 0);
	CU_ASSERT_FALSE(table_has(t, id));
	CU_ASSERT_EQUAL(emb_table_births_dropped(t), 1);
	/* Above the counter: made, with that birth. */
	other = same_slot(id, id);
	b = 40;
	CU_ASSERT_EQUAL(
	    emb_table_push_births(t, &other, 1, g, &b, EMB_PUSH_PRIMARY), 0);
	CU_ASSERT_EQUAL(birth_of(t, other), 40);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(id)), 40);
	emb_table_destroy(t);
}

/* emb_table_lead(): the slots a server leads drop as EMB_PUSH_PRIMARY
 * does, whatever the flags; the others make the absent row. */
static void test_births_lead(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t id = 4242, set[EMB_NSLOTS / 64] = {0};
	const uint32_t sl = emb_id_slot(id);
	uint32_t b;
	float w[DIM], g[DIM] = {1.0f, 1.0f, 1.0f, 1.0f};

	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, w, 0, NULL), 1);
	b = birth_of(t, id);
	CU_ASSERT_EQUAL(emb_table_erase(t, &id, 1), 1);
	set[sl / 64] = 1ull << (sl % 64);
	emb_table_lead(t, set);
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b, 0), 0);
	CU_ASSERT_FALSE(table_has(t, id));
	CU_ASSERT_EQUAL(emb_table_births_dropped(t), 1);
	/* Led no longer (a backup now): made with the birth named. */
	emb_table_lead(t, NULL);
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b, 0), 0);
	CU_ASSERT_TRUE(table_has(t, id));
	CU_ASSERT_EQUAL(birth_of(t, id), b);
	emb_table_destroy(t);
}

/* Under admission a push naming births makes its rows as an admitted one
 * does: the primary said they were rows. */
static void test_births_admit(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t;
	uint64_t id = 99;
	uint32_t b = 5;
	float g[DIM] = {1.0f, 1.0f, 1.0f, 1.0f};

	CU_ASSERT_EQUAL_FATAL(emb_admit_parse("count:2", &o.life), 0);
	t = births_table(&o);
	CU_ASSERT_EQUAL(emb_table_push_births(t, &id, 1, g, &b, 0), 0);
	CU_ASSERT_TRUE(table_has(t, id));
	CU_ASSERT_EQUAL(table_stats(t).pushes_unadmitted, 0);
	emb_table_destroy(t);
}

/* A push refused as not finite puts back a row it made again, birth
 * included, and removes the rows it made. */
static void test_refused_push_undone(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t ids[3] = {10, 11, 12};
	uint32_t b[3], got[3];
	float w[DIM], before[DIM], g[3 * DIM];

	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 1, w, 0, NULL), 1);
	b[0] = birth_of(t, ids[0]);
	for (int j = 0; j < 3 * DIM; j++)
		g[j] = 0.5f;
	CU_ASSERT_EQUAL(emb_table_push_births(t, ids, 1, g, b, 0), 0);
	weights(t, ids[0], before);
	/* Made again (newer birth), made (absent), and one that overflows. */
	b[0] += 10;
	b[1] = 4;
	b[2] = 4;
	g[2 * DIM] = -3.0e38f; /* on a row near +3e38: overflows */
	CU_ASSERT_EQUAL(emb_table_pull(t, &ids[2], 1, w, 0, NULL), 1);
	{
		float big[DIM] = {-3.0e38f, -3.0e38f, -3.0e38f, -3.0e38f};
		uint32_t b2 = birth_of(t, ids[2]);

		CU_ASSERT_EQUAL(emb_table_push_births(t, &ids[2], 1, big,
						      &b2, 0),
				0);
		b[2] = b2;
	}
	CU_ASSERT_EQUAL(emb_table_push_births(t, ids, 3, g, b, 0),
			EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_births(t, ids, 3, got), 2);
	CU_ASSERT_EQUAL(got[0], b[0] - 10);
	CU_ASSERT_EQUAL(got[1], EMB_BIRTH_NONE);
	weights(t, ids[0], w);
	CU_ASSERT_EQUAL(memcmp(w, before, sizeof(w)), 0);
	emb_table_destroy(t);
}

/* A fill's rows get their primary's births; absent ids are skipped. */
static void test_births_set(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *t = births_table(&o);
	uint64_t ids[2] = {21, 22};
	uint32_t b[2] = {500, 600}, got[2];
	float rows[2 * DIM] = {0};

	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 1, rows, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_births_set(t, ids, 2, b), 1);
	CU_ASSERT_EQUAL(emb_table_births(t, ids, 2, got), 1);
	CU_ASSERT_EQUAL(got[0], 500);
	CU_ASSERT_EQUAL(got[1], EMB_BIRTH_NONE);
	CU_ASSERT_EQUAL(emb_table_slot_birth(t, emb_id_slot(ids[0])), 500);
	emb_table_destroy(t);
}

/* A tiered table cannot number its rows (its cold rows have no record). */
static void test_tier_refused(void)
{
	struct emb_table_opts o = births_opts();
	char dir[] = "/tmp/emb-births-XXXXXX", path[64];
	struct emb_table *t;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/t.tier", dir);
	o.tier_path = path;
	o.mem_limit = 8u << 20;
	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_births_enable(t), -EOPNOTSUPP);
	{
		uint64_t id = 1;
		uint32_t b;

		CU_ASSERT_EQUAL(emb_table_births(t, &id, 1, &b), -EOPNOTSUPP);
	}
	CU_ASSERT_FALSE(emb_table_has_births(t));
	emb_table_destroy(t);
	unlink(path);
	rmdir(dir);
}

/*
 * The race births close, played by two tables: the primary P makes X
 * (pull), the client asks its birth and pushes to both; P evicts X (an
 * erase here) and a pull makes it again, newer, at its initial values,
 * while the backup B still holds the old X. The next push names the new
 * birth: B makes X again before applying, and ends as P does. A push
 * asked before the eviction and arriving after it is dropped by both.
 */
static void test_primary_and_backup(void)
{
	struct emb_table_opts o = births_opts();
	struct emb_table *p = births_table(&o), *b = births_table(&o);
	uint64_t x = 777;
	uint32_t asked, late;
	float wp[DIM], wb[DIM], g[DIM] = {0.25f, 0.5f, 0.75f, 1.0f};

	CU_ASSERT_EQUAL(emb_table_pull(p, &x, 1, wp, 0, NULL), 1);
	for (int step = 0; step < 3; step++) {
		CU_ASSERT_EQUAL(emb_table_births(p, &x, 1, &asked), 1);
		CU_ASSERT_EQUAL(emb_table_push_births(p, &x, 1, g, &asked,
						      EMB_PUSH_PRIMARY),
				0);
		CU_ASSERT_EQUAL(emb_table_push_births(b, &x, 1, g, &asked, 0),
				0);
	}
	late = asked; /* a push asked now, sent after the eviction */
	CU_ASSERT_EQUAL(emb_table_erase(p, &x, 1), 1);
	CU_ASSERT_EQUAL(
	    emb_table_push_births(p, &x, 1, g, &late, EMB_PUSH_PRIMARY), 0);
	CU_ASSERT_FALSE(table_has(p, x));
	CU_ASSERT_EQUAL(emb_table_pull(p, &x, 1, wp, 0, NULL), 1);
	/* The next push names the new birth: B makes its X again. */
	CU_ASSERT_EQUAL(emb_table_births(p, &x, 1, &asked), 1);
	CU_ASSERT(asked > late);
	CU_ASSERT_EQUAL(
	    emb_table_push_births(p, &x, 1, g, &asked, EMB_PUSH_PRIMARY), 0);
	CU_ASSERT_EQUAL(emb_table_push_births(b, &x, 1, g, &asked, 0), 0);
	weights(p, x, wp);
	weights(b, x, wb);
	CU_ASSERT_EQUAL(memcmp(wp, wb, sizeof(wp)), 0);
	CU_ASSERT_EQUAL(birth_of(b, x), asked);
	/* The late push, arriving at B after all: older than B's X now. */
	CU_ASSERT_EQUAL(emb_table_push_births(b, &x, 1, g, &late, 0), 0);
	weights(b, x, wb);
	CU_ASSERT_EQUAL(memcmp(wp, wb, sizeof(wp)), 0);
	CU_ASSERT_EQUAL(emb_table_births_dropped(b), 1);
	emb_table_destroy(b);
	emb_table_destroy(p);
}

/* Every row of a slot range with its birth, the marks read before. */
static uint32_t list_all(struct emb_table *t, uint32_t first, uint32_t n,
			 uint32_t *marks, uint64_t **ids, uint32_t **births)
{
	int got = emb_table_births_list(t, first, n, marks, NULL, NULL, 0);

	CU_ASSERT_FATAL(got >= 0);
	*ids = xcalloc((size_t)got, sizeof(**ids));
	*births = xcalloc((size_t)got, sizeof(**births));
	CU_ASSERT_EQUAL_FATAL(
	    emb_table_births_list(t, first, n, marks, *ids, *births, got), got);
	return (uint32_t)got;
}

/*
 * A backup checks its slots against its primary's list: rows the primary
 * evicted go, rows it has (at that birth) stay, rows made since the list
 * stay, and rows of other slots are not looked at. Then both hold the
 * same rows of those slots, with the same values.
 */
static void test_list_and_prune(void)
{
	enum { N = 4000, FIRST = 1000, NS = 1000 };
	struct emb_table_opts o = births_opts();
	struct emb_table *p = births_table(&o), *b = births_table(&o);
	uint64_t *ids = xcalloc(N, sizeof(*ids)), *lid;
	uint32_t *bir = xcalloc(N, sizeof(*bir)), *lbir, m;
	uint32_t *marks = xcalloc(NS, sizeof(*marks));
	float *g = xcalloc((size_t)N * DIM, sizeof(float));
	float wp[DIM], wb[DIM];
	uint32_t in = 0, gone = 0, outside_gone = 0, newer = 0;
	uint64_t late = 0;

	for (uint32_t i = 0; i < N; i++) {
		ids[i] = 100 + 13 * (uint64_t)i;
		in += emb_id_slot(ids[i]) - FIRST < NS;
	}
	CU_ASSERT(in > N / 8);
	for (size_t i = 0; i < (size_t)N * DIM; i++)
		g[i] = 0.125f;
	/* Both hold every row, as pushed through the primary's births. */
	CU_ASSERT_EQUAL(emb_table_pull(p, ids, N, g + 0, 0, NULL), N);
	for (size_t i = 0; i < (size_t)N * DIM; i++)
		g[i] = 0.125f;
	CU_ASSERT_EQUAL(emb_table_births(p, ids, N, bir), N);
	CU_ASSERT_EQUAL(emb_table_push_births(p, ids, N, g, bir, 0), 0);
	CU_ASSERT_EQUAL(emb_table_push_births(b, ids, N, g, bir, 0), 0);
	/* The primary evicts every third row; of the rows in range, every
	 * ninth is made again (newer, never pushed). */
	for (uint32_t i = 0; i < N; i += 3) {
		CU_ASSERT_EQUAL(emb_table_erase(p, &ids[i], 1), 1);
		if (i % 9 == 0) {
			CU_ASSERT_EQUAL(emb_table_pull(p, &ids[i], 1, wp, 0,
						       NULL),
					1);
			newer += emb_id_slot(ids[i]) - FIRST < NS;
		} else if (emb_id_slot(ids[i]) - FIRST < NS) {
			gone++;
		} else {
			outside_gone++;
		}
	}
	m = list_all(p, FIRST, NS, marks, &lid, &lbir);
	/* A row the backup is given after the list (a push of a row made
	 * since): newer than the mark, it stays. */
	for (uint64_t j = 1u << 30;; j++) {
		uint32_t nb;

		if (emb_id_slot(j) - FIRST >= NS)
			continue;
		CU_ASSERT_EQUAL(emb_table_pull(p, &j, 1, wp, 0, NULL), 1);
		nb = birth_of(p, j);
		CU_ASSERT_EQUAL(emb_table_push_births(b, &j, 1, g, &nb, 0), 0);
		late = j;
		break;
	}
	CU_ASSERT_EQUAL(emb_table_births_prune(b, FIRST, NS, marks, lid, lbir,
					       m),
			(int)(gone + newer));
	CU_ASSERT_TRUE(table_has(b, late));
	for (uint32_t i = 0; i < N; i++) {
		bool inr = emb_id_slot(ids[i]) - FIRST < NS;
		bool ph = table_has(p, ids[i]), bh = table_has(b, ids[i]);

		if (!inr) {
			/* Not checked: the backup keeps them all. */
			CU_ASSERT_TRUE(bh);
			continue;
		}
		/* Rows made again and never pushed are the primary's alone,
		 * as any row a pull made. */
		if (i % 9 == 0) {
			CU_ASSERT_TRUE(ph);
			CU_ASSERT_FALSE(bh);
			continue;
		}
		CU_ASSERT_EQUAL(ph, bh);
		if (ph && bh) {
			weights(p, ids[i], wp);
			weights(b, ids[i], wb);
			CU_ASSERT_EQUAL(memcmp(wp, wb, sizeof(wp)), 0);
		}
	}
	CU_ASSERT(outside_gone > 0);
	CU_ASSERT_EQUAL(table_stats(b).rows_evicted, gone + newer);
	/* Checked again: nothing more to remove. */
	CU_ASSERT_EQUAL(emb_table_births_prune(b, FIRST, NS, marks, lid, lbir,
					       m),
			0);
	/* Bad ranges and tables without births are refused. */
	CU_ASSERT_EQUAL(emb_table_births_list(p, EMB_NSLOTS - 1, 2, marks,
					      NULL, NULL, 0),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_births_prune(b, 0, 0, marks, NULL, NULL, 0),
			EMB_EBADARG);
	free(lid);
	free(lbir);
	free(g);
	free(marks);
	free(bir);
	free(ids);
	emb_table_destroy(b);
	emb_table_destroy(p);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"rows are numbered per slot as they are made", test_numbering},
	    {"numbering keeps up as shards grow", test_numbering_grows},
	    {"a backup applies, remakes, drops or makes", test_backup_rules},
	    {"a primary drops what it removed since", test_primary_rules},
	    {"births make rows under admission", test_births_admit},
	    {"a refused push puts births back", test_refused_push_undone},
	    {"a fill's rows get their primary's births", test_births_set},
	    {"a tiered table cannot number rows", test_tier_refused},
	    {"a primary and its backup through an eviction",
	     test_primary_and_backup},
	    {"a backup removes what its primary evicted", test_list_and_prune},
	    {"a slot the table leads drops as a primary does", test_births_lead},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/births", cases);
}
