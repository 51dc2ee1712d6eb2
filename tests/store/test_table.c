/*
 * tests/store/test_table.c - emb_table_* as store.h specifies it: options and
 * argument checks, pull / push / assign / erase on single rows, optimizers
 * and initializers through the table, eviction, stats, memory limit and the
 * iterator. The randomized index run is in test_index.c, threads in
 * test_threads.c, extent hooks in test_arena.c. Single-threaded.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_test.h"
#include "common/init.h"
#include "common/seal.h"
#include "store/store_int.h"

/* Every option the table keeps comes back from emb_table_get_opts(). */
static void test_create_reports_opts(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT, got;
	char name[] = "user.emb-v2_x";
	struct emb_table *t;

	o.name = name;
	o.dim = 33;
	o.optim.kind = EMB_OPTIM_ADAM;
	o.optim.lr = 0.002f;
	o.init = (struct emb_init_cfg){
	    .kind = EMB_INIT_NORMAL, .a = 0.5f, .b = 0.25f};
	o.seed = 0xfeedbeefcafeull;
	o.nshards = 16;
	o.mem_limit = 1ull << 30;
	t = table_new(&o);
	/* The name is copied. */
	name[0] = 'X';
	CU_ASSERT_STRING_EQUAL(emb_table_name(t), "user.emb-v2_x");
	CU_ASSERT_EQUAL(emb_table_dim(t), 33);
	CU_ASSERT_EQUAL(emb_table_row_floats(t), 33 + 2 * 33 + 1);

	memset(&got, 0, sizeof(got));
	emb_table_get_opts(t, &got);
	CU_ASSERT_STRING_EQUAL(got.name, "user.emb-v2_x");
	CU_ASSERT_EQUAL(got.dim, 33);
	CU_ASSERT_EQUAL(got.optim.kind, EMB_OPTIM_ADAM);
	CU_ASSERT_EQUAL(got.optim.lr, 0.002f);
	CU_ASSERT_EQUAL(got.optim.beta2, o.optim.beta2);
	CU_ASSERT_EQUAL(got.init.kind, EMB_INIT_NORMAL);
	CU_ASSERT_EQUAL(got.init.a, 0.5f);
	CU_ASSERT_EQUAL(got.init.b, 0.25f);
	CU_ASSERT_EQUAL(got.seed, 0xfeedbeefcafeull);
	CU_ASSERT_EQUAL(got.nshards, 16);
	CU_ASSERT_EQUAL(got.mem_limit, 1ull << 30);
	emb_table_destroy(t);
	emb_table_destroy(NULL);
}

/* Limits that are valid at their edges. */
static void test_create_edges(void)
{
	static const uint32_t shards[] = {1, 2, 1024};
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	char name[EMB_NAME_MAX + 1];

	memset(name, 'n', EMB_NAME_MAX);
	name[EMB_NAME_MAX] = '\0';
	o.name = name;
	o.dim = 1;
	emb_table_destroy(table_new(&o));
	o.name = "a";
	o.dim = EMB_DIM_MAX;
	emb_table_destroy(table_new(&o));
	o.dim = 8;
	for (size_t i = 0; i < sizeof(shards) / sizeof(shards[0]); i++) {
		o.nshards = shards[i];
		emb_table_destroy(table_new(&o));
	}
}

static void expect_create_fails(const struct emb_table_opts *o, int want,
				const char *what)
{
	struct emb_table *t = (struct emb_table *)&t;
	int rc = emb_table_create(o, &t);

	if (rc != want)
		fprintf(stderr, "\n    %s: expected %d (%s) got %d (%s)", what,
			want, emb_strerror(want), rc, emb_strerror(rc));
	CU_ASSERT_EQUAL(rc, want);
	/* *out is set only on success. */
	CU_ASSERT_PTR_EQUAL(t, (struct emb_table *)&t);
	if (rc == 0)
		emb_table_destroy(t);
}

static void test_create_rejects(void)
{
	const struct emb_table_opts def = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_opts o;
	char longname[EMB_NAME_MAX + 2];

	memset(longname, 'n', EMB_NAME_MAX + 1);
	longname[EMB_NAME_MAX + 1] = '\0';

	o = def, o.dim = 0;
	expect_create_fails(&o, EMB_EBADDIM, "dim 0");
	o = def, o.dim = EMB_DIM_MAX + 1;
	expect_create_fails(&o, EMB_EBADDIM, "dim 4097");

	o = def, o.name = "";
	expect_create_fails(&o, EMB_EBADNAME, "empty name");
	o = def, o.name = NULL;
	expect_create_fails(&o, EMB_EBADNAME, "NULL name");
	o = def, o.name = longname;
	expect_create_fails(&o, EMB_EBADNAME, "64-byte name");
	o = def, o.name = "a b";
	expect_create_fails(&o, EMB_EBADNAME, "name with space");
	o = def, o.name = "a/b";
	expect_create_fails(&o, EMB_EBADNAME, "name with slash");
	o = def, o.name = "caf\xc3\xa9";
	expect_create_fails(&o, EMB_EBADNAME, "non-ASCII name");
	o = def, o.name = "tab\n";
	expect_create_fails(&o, EMB_EBADNAME, "name with newline");

	o = def, o.optim.kind = 0;
	expect_create_fails(&o, EMB_EBADOPTIM, "optimizer kind 0");
	o = def, o.optim.kind = 99;
	expect_create_fails(&o, EMB_EBADOPTIM, "optimizer kind 99");
	o = def, o.optim.lr = 0.0f;
	expect_create_fails(&o, EMB_EBADOPTIM, "lr 0");
	o = def, o.optim.lr = -0.5f;
	expect_create_fails(&o, EMB_EBADOPTIM, "lr < 0");
	o = def, o.optim.kind = EMB_OPTIM_ADAM, o.optim.beta1 = 1.0f;
	expect_create_fails(&o, EMB_EBADOPTIM, "adam beta1 1");
	o = def, o.optim.kind = EMB_OPTIM_FTRL, o.optim.l1 = -1.0f;
	expect_create_fails(&o, EMB_EBADOPTIM, "ftrl l1 < 0");

	o = def, o.init.kind = 0;
	expect_create_fails(&o, EMB_EBADINIT, "init kind 0");
	o = def, o.init.kind = 17;
	expect_create_fails(&o, EMB_EBADINIT, "init kind 17");
	o = def, o.init = (struct emb_init_cfg){EMB_INIT_UNIFORM, 1.0f, 1.0f};
	expect_create_fails(&o, EMB_EBADINIT, "uniform a == b");
	o = def, o.init = (struct emb_init_cfg){EMB_INIT_NORMAL, 0.0f, -1.0f};
	expect_create_fails(&o, EMB_EBADINIT, "normal std < 0");

	o = def, o.nshards = 0;
	expect_create_fails(&o, EMB_EBADARG, "nshards 0");
	o = def, o.nshards = 3;
	expect_create_fails(&o, EMB_EBADARG, "nshards 3");
	o = def, o.nshards = 96;
	expect_create_fails(&o, EMB_EBADARG, "nshards 96");
	o = def, o.nshards = 2 * EMB_SHARDS_MAX;
	expect_create_fails(&o, EMB_EBADARG, "nshards 2048");
}

/* Three rows with known values for the argument checks below. */
static struct emb_table *table_with_rows(struct emb_table_opts *o,
					 const uint64_t *ids, uint32_t n)
{
	struct emb_table *t;
	float *rows = xcalloc((size_t)n * o->dim, sizeof(float));

	for (uint32_t i = 0; i < n * o->dim; i++)
		rows[i] = (float)i + 0.5f;
	t = table_new(o);
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, n, rows, false, NULL), 0);
	free(rows);
	return t;
}

static void expect_rows_unchanged(struct emb_table *t, const uint64_t *ids,
				  uint32_t n)
{
	uint32_t dim = emb_table_dim(t);
	float *got = xcalloc((size_t)n * dim, sizeof(float));
	uint8_t found[8];
	int bad = 0;

	CU_ASSERT_EQUAL(
	    emb_table_pull(t, ids, n, got, EMB_PULL_NOCREATE, found), 0);
	for (uint32_t i = 0; i < n * dim; i++) {
		float want = (float)i + 0.5f;

		expect_floats("row", ids[i / dim], &got[i], &want, 1, &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(got);
}

static void test_null_buffers(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[3] = {11, 12, 13};
	/* A batch with an absent id: a rejected call must not create it. */
	const uint64_t batch[4] = {11, 12, 13, 99};
	float buf[4 * 8] = {0};
	const float *ptrs[4];
	struct emb_table_stats s0, s1;
	struct emb_table *t;

	o.optim.lr = 1.0f;
	t = table_with_rows(&o, ids, 3);
	s0 = table_stats(t);

	CU_ASSERT_EQUAL(emb_table_pull(t, NULL, 4, buf, 0, NULL), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_pull(t, batch, 4, NULL, 0, NULL),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, NULL, 4, ptrs, 0), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, batch, 4, NULL, 0), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_push(t, NULL, 4, buf), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_push(t, batch, 4, NULL), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_assign(t, NULL, 4, buf, false, NULL),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_assign(t, batch, 4, NULL, false, NULL),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_assign(t, batch, 4, NULL, true, NULL),
			EMB_EBADARG);
	/* erase documents no error code; it must still refuse. */
	CU_ASSERT(emb_table_erase(t, NULL, 3) < 0);

	s1 = table_stats(t);
	CU_ASSERT_EQUAL(s1.rows, 3);
	CU_ASSERT_EQUAL(s1.rows_created, s0.rows_created);
	CU_ASSERT_FALSE(table_has(t, 99));
	expect_rows_unchanged(t, ids, 3);

	/* n = 0 needs no buffers. */
	CU_ASSERT_EQUAL(emb_table_pull(t, NULL, 0, NULL, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, NULL, 0, NULL, 0), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, NULL, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_assign(t, NULL, 0, NULL, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_erase(t, NULL, 0), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, 3);
	expect_rows_unchanged(t, ids, 3);
	emb_table_destroy(t);
}

/* Rows start from (seed, id) alone: another table, or re-creation. */
static void test_pull_initializes(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[5] = {1, 2, 3, 1ull << 40, 77};
	float a[5 * 16], b[5 * 16], want[16];
	struct emb_table *t1, *t2, *t3;
	int bad = 0;

	o.dim = 16;
	o.seed = 1234;
	o.init = (struct emb_init_cfg){EMB_INIT_NORMAL, 0.0f, 0.5f};
	t1 = table_new(&o);
	o.nshards = 4; /* sharding does not change values */
	t2 = table_new(&o);
	o.seed = 1235;
	t3 = table_new(&o);
	o.seed = 1234;

	CU_ASSERT_EQUAL(emb_table_pull(t1, ids, 5, a, 0, NULL), 5);
	for (uint32_t i = 0; i < 5; i++) {
		emb_init_row(&o.init, o.seed, ids[i], want, 16);
		expect_floats("new row", ids[i], &a[i * 16], want, 16, &bad);
	}
	CU_ASSERT_EQUAL(table_stats(t1).rows_created, 5);
	CU_ASSERT_EQUAL(table_stats(t1).rows, 5);

	CU_ASSERT_EQUAL(emb_table_pull(t2, ids, 5, b, 0, NULL), 5);
	expect_floats("second table", 0, b, a, 5 * 16, &bad);

	/* A second pull finds the rows: nothing missing. */
	CU_ASSERT_EQUAL(emb_table_pull(t1, ids, 5, b, 0, NULL), 0);
	expect_floats("second pull", 0, b, a, 5 * 16, &bad);

	/* Erase and re-create: the same values again. */
	CU_ASSERT_EQUAL(emb_table_erase(t1, ids, 5), 5);
	CU_ASSERT_EQUAL(table_stats(t1).rows, 0);
	CU_ASSERT_EQUAL(emb_table_pull(t1, ids, 5, b, 0, NULL), 5);
	expect_floats("re-created", 0, b, a, 5 * 16, &bad);
	CU_ASSERT_EQUAL(table_stats(t1).rows_created, 10);
	CU_ASSERT_EQUAL(bad, 0);

	/* Another seed: other rows. */
	CU_ASSERT_EQUAL(emb_table_pull(t3, ids, 5, b, 0, NULL), 5);
	for (uint32_t i = 0; i < 5; i++)
		CU_ASSERT(memcmp(&a[i * 16], &b[i * 16], 16 * sizeof(float)));
	emb_table_destroy(t1);
	emb_table_destroy(t2);
	emb_table_destroy(t3);
}

static void test_pull_nocreate(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t have[2] = {5, 500};
	const uint64_t ids[5] = {5, 6, 500, 7, 5};
	float out[5 * 8], want[8];
	uint8_t found[5];
	const float *ptrs[5];
	struct emb_table_stats s;
	struct emb_table *t;
	int bad = 0, rc;

	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_pull(t, have, 2, out, 0, NULL), 2);
	for (uint32_t i = 0; i < 5 * 8; i++)
		out[i] = 42.0f;
	memset(found, 0xee, sizeof(found));
	rc = emb_table_pull(t, ids, 5, out, EMB_PULL_NOCREATE, found);
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_EQUAL(found[0], 1);
	CU_ASSERT_EQUAL(found[1], 0);
	CU_ASSERT_EQUAL(found[2], 1);
	CU_ASSERT_EQUAL(found[3], 0);
	CU_ASSERT_EQUAL(found[4], 1);
	for (uint32_t i = 0; i < 5; i++) {
		if (found[i] == 1)
			emb_init_row(&o.init, o.seed, ids[i], want, 8);
		else
			memset(want, 0, sizeof(want));
		expect_floats("nocreate", ids[i], &out[i * 8], want, 8, &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);

	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, 2);
	CU_ASSERT_EQUAL(s.rows_created, 2);
	CU_ASSERT_EQUAL(s.misses, 2);
	CU_ASSERT_FALSE(table_has(t, 6));
	CU_ASSERT_FALSE(table_has(t, 7));

	/* found may be NULL. */
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 5, out, EMB_PULL_NOCREATE, NULL),
			2);
	/* pull_ptrs: NULL for missing ids, the weights for present ones. */
	rc = emb_table_pull_ptrs(t, ids, 5, ptrs, EMB_PULL_NOCREATE);
	CU_ASSERT_EQUAL(rc, 2);
	CU_ASSERT_PTR_NOT_NULL(ptrs[0]);
	CU_ASSERT_PTR_NULL(ptrs[1]);
	CU_ASSERT_PTR_NOT_NULL(ptrs[2]);
	CU_ASSERT_PTR_NULL(ptrs[3]);
	CU_ASSERT_PTR_EQUAL(ptrs[4], ptrs[0]);
	if (ptrs[2]) {
		emb_init_row(&o.init, o.seed, 500, want, 8);
		expect_floats("ptr", 500, ptrs[2], want, 8, &bad);
	}
	CU_ASSERT_EQUAL(table_stats(t).rows, 2);

	/* Without the flag, pull_ptrs creates. */
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, ids, 5, ptrs, 0), 2);
	for (uint32_t i = 0; i < 5; i++) {
		CU_ASSERT_PTR_NOT_NULL_FATAL(ptrs[i]);
		emb_init_row(&o.init, o.seed, ids[i], want, 8);
		expect_floats("ptr created", ids[i], ptrs[i], want, 8, &bad);
	}
	CU_ASSERT_EQUAL(table_stats(t).rows, 4);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_destroy(t);
}

/* A missing id repeated in one batch still becomes one row. */
static void test_pull_duplicate_missing(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[4] = {7, 8, 7, 7};
	float out[4 * 8];
	const float *ptrs[3];
	struct emb_table_stats s;
	struct emb_table *t;
	int bad = 0;

	t = table_new(&o);
	CU_ASSERT(emb_table_pull(t, ids, 4, out, 0, NULL) >= 2);
	s = table_stats(t);
	if (s.rows != 2)
		fprintf(stderr,
			"\n    pull {7, 8, 7, 7}: expected 2 rows, "
			"got %llu (rows_created %llu)",
			(unsigned long long)s.rows,
			(unsigned long long)s.rows_created);
	CU_ASSERT_EQUAL(s.rows, 2);
	CU_ASSERT_EQUAL(s.rows_created, 2);
	expect_floats("dup 1", 7, &out[2 * 8], &out[0], 8, &bad);
	expect_floats("dup 2", 7, &out[3 * 8], &out[0], 8, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	/* One erase removes the id for good. */
	CU_ASSERT_EQUAL(emb_table_erase(t, ids, 1), 1);
	CU_ASSERT_FALSE(table_has(t, 7));
	CU_ASSERT_EQUAL(table_stats(t).rows, 1);

	/* Same through pull_ptrs: one row, one pointer. */
	CU_ASSERT(emb_table_pull_ptrs(t, (const uint64_t[]){9, 9, 9}, 3, ptrs,
				      0) >= 1);
	CU_ASSERT_PTR_EQUAL(ptrs[1], ptrs[0]);
	CU_ASSERT_PTR_EQUAL(ptrs[2], ptrs[0]);
	CU_ASSERT_EQUAL(table_stats(t).rows, 2);
	emb_table_destroy(t);
}

/*
 * The same in a large batch, where repeats of an id lie far apart (a batch
 * may be worked on in chunks): 20000 ids, each of 3000 new ids about seven
 * times, through pull, pull_ptrs and push.
 */
static void test_pull_duplicate_missing_far(void)
{
	enum { N = 20000, DISTINCT = 3000 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	float *out = xcalloc((size_t)N * 8, sizeof(float));
	const float **ptrs = xcalloc(N, sizeof(*ptrs));
	struct emb_table *t;
	int bad = 0, rc;

	o.nshards = 4;
	for (int way = 0; way < 3; way++) {
		uint64_t base = (uint64_t)way << 40;

		t = table_new(&o);
		for (uint32_t i = 0; i < N; i++)
			ids[i] = base + (i * 7919u) % DISTINCT;
		if (way == 0)
			rc = emb_table_pull(t, ids, N, out, 0, NULL);
		else if (way == 1)
			rc = emb_table_pull_ptrs(t, ids, N, ptrs, 0);
		else
			rc = emb_table_push(t, ids, N, out);
		CU_ASSERT(rc >= 0);
		if (table_stats(t).rows != DISTINCT)
			fprintf(
			    stderr,
			    "\n    %s of %u ids over %u distinct: %llu rows",
			    way == 0   ? "pull"
			    : way == 1 ? "pull_ptrs"
				       : "push",
			    N, DISTINCT,
			    (unsigned long long)table_stats(t).rows);
		CU_ASSERT_EQUAL(table_stats(t).rows, DISTINCT);
		CU_ASSERT_EQUAL(table_stats(t).rows_created, DISTINCT);
		/* ids[i] depends on i % DISTINCT only: 7919 is prime. */
		for (uint32_t i = DISTINCT; way == 0 && i < N; i++)
			expect_floats("repeat", ids[i], &out[i * 8],
				      &out[(i % DISTINCT) * 8], 8, &bad);
		for (uint32_t i = DISTINCT; way == 1 && i < N; i++) {
			if (ptrs[i] != ptrs[i % DISTINCT] && bad++ < 3)
				fprintf(stderr, "\n    id %llu: two rows",
					(unsigned long long)ids[i]);
		}
		emb_table_destroy(t);
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(ids);
	free(out);
	free(ptrs);
}

/* Ids are plain integers: no value is reserved as an empty marker. */
static void test_extreme_ids(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[4] = {0, UINT64_MAX, UINT64_MAX - 1, 1ull << 63};
	float rows[4 * 8], out[4 * 8];
	uint8_t found[4];
	struct emb_table *t;
	int bad = 0;

	for (uint32_t i = 0; i < 4 * 8; i++)
		rows[i] = (float)i;
	for (uint32_t shards = 1; shards <= 64; shards *= 64) {
		o.nshards = shards;
		t = table_new(&o);
		CU_ASSERT_EQUAL(
		    emb_table_pull(t, ids, 4, out, EMB_PULL_NOCREATE, found),
		    4);
		CU_ASSERT_EQUAL(emb_table_assign(t, ids, 4, rows, false, NULL),
				0);
		CU_ASSERT_EQUAL(table_stats(t).rows, 4);
		CU_ASSERT_EQUAL(
		    emb_table_pull(t, ids, 4, out, EMB_PULL_NOCREATE, found),
		    0);
		expect_floats("extreme id", 0, out, rows, 4 * 8, &bad);
		CU_ASSERT_EQUAL(emb_table_erase(t, ids, 1), 1);
		CU_ASSERT_FALSE(table_has(t, 0));
		CU_ASSERT_TRUE(table_has(t, UINT64_MAX));
		CU_ASSERT_EQUAL(emb_table_erase(t, ids, 4), 3);
		CU_ASSERT_EQUAL(table_stats(t).rows, 0);
		emb_table_destroy(t);
	}
	CU_ASSERT_EQUAL(bad, 0);
}

/* True when the record at addr holds id, sealed (common/seal.h). */
static bool sealed_as(const struct emb_table_remote *r, uint64_t addr,
		      uint64_t id)
{
	const char *rec = (const char *)(uintptr_t)addr;
	uint64_t got, seal;

	memcpy(&got, rec, 8);
	memcpy(&seal, rec + r->rec_bytes - 8, 8);
	return got == id &&
	       emb_seal(r->seed, id, rec + 16, 4ull * r->row_floats) == seal;
}

static uint32_t count_sealed(const struct emb_table_remote *r,
			     const uint64_t *addrs, const uint64_t *ids,
			     uint32_t n)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < n; i++)
		k += addrs[i] && sealed_as(r, addrs[i], ids[i]);
	return k;
}

static void test_remote_read_seals(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_remote r;
	struct emb_table *t, *plain;
	uint64_t ids[64], addrs[64], again[64];
	float rows[64 * 8], g[64 * 8];

	o.remote_read = true;
	t = table_new(&o);
	o.remote_read = false;
	plain = table_new(&o);
	CU_ASSERT_FALSE(emb_table_remote(plain, &r));
	CU_ASSERT_EQUAL(emb_table_locate(plain, ids, 1, addrs), EMB_EBADARG);
	CU_ASSERT_TRUE_FATAL(emb_table_remote(t, &r));
	/* 8 bytes a row more than a plain table's record. */
	CU_ASSERT_EQUAL(r.rec_bytes, table_stats(plain).row_bytes + 8);
	CU_ASSERT_EQUAL(r.row_floats, 8);
	for (uint32_t i = 0; i < 64; i++) {
		ids[i] = 1000 + 7 * i;
		for (uint32_t j = 0; j < 8; j++)
			g[i * 8 + j] = (float)(i + j) * 0.5f;
	}
	CU_ASSERT_EQUAL(emb_table_locate(t, ids, 64, addrs), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 32, rows, 0, NULL), 32);
	CU_ASSERT_EQUAL(emb_table_locate(t, ids, 64, addrs), 32);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 64), 32); /* created */
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 48, g), 0);
	CU_ASSERT_EQUAL(emb_table_locate(t, ids, 64, addrs), 48);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 64), 48); /* pushed */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 64, g, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_locate(t, ids, 64, addrs), 64);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 64), 64); /* assigned */
	/* A freed record fails the check at its old address. */
	CU_ASSERT_EQUAL(emb_table_erase(t, ids, 16), 16);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 16), 0);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 64), 48);
	/* Reused for another id: not the old id's row either. */
	again[0] = 99999;
	CU_ASSERT_EQUAL(emb_table_pull(t, again, 1, rows, 0, NULL), 1);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 16), 0);
	/* Dropped (memory still there): nothing passes any more. */
	emb_table_unseal_all(t);
	CU_ASSERT_EQUAL(count_sealed(&r, addrs, ids, 64), 0);
	CU_ASSERT_FALSE(emb_table_remote(t, &r));
	CU_ASSERT_EQUAL(emb_table_push(t, ids + 16, 8, g), 0);
	CU_ASSERT_EQUAL(emb_table_locate(t, ids, 64, addrs), EMB_EBADARG);
	emb_table_destroy(t);
	emb_table_destroy(plain);
}

static void test_erase_counts(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[4] = {10, 20, 30, 40};
	const uint64_t gone[3] = {20, 50, 40};
	float out[4 * 8];
	struct emb_table *t;

	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 4, out, 0, NULL), 4);
	CU_ASSERT_EQUAL(emb_table_erase(t, gone, 3), 2);
	CU_ASSERT_EQUAL(emb_table_erase(t, gone, 3), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, 2);
	CU_ASSERT_EQUAL(table_stats(t).rows_erased, 2);
	CU_ASSERT_TRUE(table_has(t, 10));
	CU_ASSERT_FALSE(table_has(t, 20));
	CU_ASSERT_TRUE(table_has(t, 30));
	CU_ASSERT_FALSE(table_has(t, 40));
	emb_table_destroy(t);
}

/* Collects every row through the iterator, max rows per call. */
struct iter_out {
	uint64_t *ids;
	float *rows;
	struct emb_row_meta *meta;
	uint32_t n;
};

static void iter_collect(struct emb_table *t, uint32_t max, uint32_t cap,
			 struct iter_out *r)
{
	uint32_t rf = emb_table_row_floats(t);
	struct emb_table_iter *it = NULL;
	int got;

	/* One spare slot: room to notice rows beyond cap. */
	r->ids = xcalloc(cap + 1, sizeof(*r->ids));
	r->rows = xcalloc((size_t)(cap + 1) * rf, sizeof(float));
	r->meta = xcalloc(cap + 1, sizeof(*r->meta));
	r->n = 0;
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	for (;;) {
		uint32_t room = cap + 1 - r->n < max ? cap + 1 - r->n : max;

		if (room == 0) {
			CU_FAIL(
			    "iterator returns more rows than the table has");
			break;
		}
		got = emb_table_iter_next(it, r->ids + r->n,
					  r->rows + (size_t)r->n * rf,
					  r->meta + r->n, room);
		CU_ASSERT_FATAL(got >= 0 && (uint32_t)got <= room);
		if (got == 0)
			break;
		r->n += (uint32_t)got;
	}
	/* The end stays the end. */
	CU_ASSERT_EQUAL(emb_table_iter_next(it, r->ids, r->rows, NULL, 1), 0);
	emb_table_iter_destroy(it);
}

static void iter_free(struct iter_out *r)
{
	free(r->ids);
	free(r->rows);
	free(r->meta);
}

static int find_id(const uint64_t *ids, uint32_t n, uint64_t id)
{
	for (uint32_t i = 0; i < n; i++) {
		if (ids[i] == id)
			return (int)i;
	}
	return -1;
}

/*
 * assign then pull gives the weights back; with_state assign then iterate
 * gives the full row and meta back; assign without state resets the state.
 */
static void round_trip(uint32_t dim, uint32_t kind)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint32_t n = dim >= 1024 ? 24 : 100;
	uint32_t rf;
	uint64_t *ids = xcalloc(n, sizeof(*ids));
	float *rows, *out, *fresh;
	struct emb_row_meta *meta = xcalloc(n, sizeof(*meta));
	struct iter_out it;
	struct emb_table *t;
	int bad = 0;

	o.dim = dim;
	o.optim.kind = kind;
	o.nshards = 4;
	rf = ref_row_floats(&o);
	t = table_new(&o);
	CU_ASSERT_EQUAL_FATAL(emb_table_row_floats(t), rf);
	rows = xcalloc((size_t)n * rf, sizeof(float));
	out = xcalloc((size_t)n * rf, sizeof(float));
	fresh = xcalloc(rf, sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = 1000003ull * i + dim;
		meta[i].last_step = 7 * i;
		meta[i].count = 3 * i + 1;
	}
	for (size_t j = 0; j < (size_t)n * rf; j++)
		rows[j] = (float)(j % 1000) * 0.25f - 100.0f;

	/* Weights only. */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, n, rows, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, n, out, EMB_PULL_NOCREATE, NULL),
			0);
	expect_floats("assign/pull", dim, out, rows, n * dim, &bad);
	iter_collect(t, 13, n, &it);
	CU_ASSERT_EQUAL(it.n, n);
	emb_optim_state_init(&o.optim, fresh, dim);
	for (uint32_t k = 0; k < it.n; k++)
		expect_floats("reset state", it.ids[k],
			      it.rows + (size_t)k * rf + dim, fresh, rf - dim,
			      &bad);
	iter_free(&it);

	/* Full rows with state and meta. */
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, n, rows, true, meta), 0);
	iter_collect(t, 7, n, &it);
	CU_ASSERT_EQUAL(it.n, n);
	for (uint32_t k = 0; k < it.n; k++) {
		int i = find_id(ids, n, it.ids[k]);

		CU_ASSERT_FATAL(i >= 0);
		expect_floats("with_state", it.ids[k], it.rows + (size_t)k * rf,
			      rows + (size_t)i * rf, rf, &bad);
		CU_ASSERT_EQUAL(it.meta[k].last_step, meta[i].last_step);
		CU_ASSERT_EQUAL(it.meta[k].count, meta[i].count);
	}
	iter_free(&it);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, n, out, EMB_PULL_NOCREATE, NULL),
			0);
	for (uint32_t i = 0; i < n; i++)
		expect_floats("with_state/pull", ids[i], out + (size_t)i * dim,
			      rows + (size_t)i * rf, dim, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	if (bad)
		fprintf(stderr, "\n    (dim %u, %s)", dim,
			emb_optim_name(kind));
	CU_ASSERT_EQUAL(table_stats(t).rows, n);
	emb_table_destroy(t);
	free(ids);
	free(meta);
	free(rows);
	free(out);
	free(fresh);
}

static void test_round_trip_dims(void)
{
	static const uint32_t dims[] = {1, 7, 64, 4096};

	for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
		round_trip(dims[i], EMB_OPTIM_ADAM);
		round_trip(dims[i], EMB_OPTIM_ADAGRAD);
	}
	round_trip(7, EMB_OPTIM_SGD);
	round_trip(7, EMB_OPTIM_FTRL);
	round_trip(1, EMB_OPTIM_ROWWISE_ADAGRAD);
	round_trip(130, EMB_OPTIM_ROWWISE_ADAGRAD);
}

static void test_assign_duplicates_last_wins(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[3] = {9, 8, 9};
	float rows[3 * 2] = {1, 2, 3, 4, 5, 6}, out[2 * 2];
	const uint64_t q[2] = {9, 8};

	o.dim = 2;
	struct emb_table *t = table_new(&o);

	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 3, rows, false, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, q, 2, out, EMB_PULL_NOCREATE, NULL),
			0);
	CU_ASSERT_EQUAL(out[0], 5.0f);
	CU_ASSERT_EQUAL(out[1], 6.0f);
	CU_ASSERT_EQUAL(out[2], 3.0f);
	CU_ASSERT_EQUAL(out[3], 4.0f);
	CU_ASSERT_EQUAL(table_stats(t).rows, 2);
	emb_table_destroy(t);
}

static bool close_rel(float got, float want)
{
	return got == want || fabsf(got - want) <= 1e-6f * fabsf(want);
}

/*
 * Pushes STEPS batches to a few ids, pulling in between, and compares every
 * weight and state float with emb_optim_apply() run here on the same row.
 */
static void push_matches_apply(struct emb_optim_cfg optim)
{
	enum { NIDS = 6, DIM = 5, STEPS = 8 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t ids[NIDS];
	uint32_t rf;
	float *ref, *g, out[NIDS * DIM];
	struct iter_out it;
	struct emb_table *t;
	int bad = 0;

	o.dim = DIM;
	o.optim = optim;
	o.seed = 5;
	rf = ref_row_floats(&o);
	t = table_new(&o);
	ref = xcalloc((size_t)NIDS * rf, sizeof(float));
	g = xcalloc((size_t)NIDS * DIM, sizeof(float));
	for (uint32_t i = 0; i < NIDS; i++) {
		ids[i] = 31 * i + 1;
		ref_new_row(&o, ids[i], ref + (size_t)i * rf);
	}
	for (uint32_t s = 0; s < STEPS; s++) {
		for (uint32_t i = 0; i < NIDS * DIM; i++)
			g[i] =
			    (float)((int)((i * 7 + s * 3) % 11) - 5) * 0.125f;
		CU_ASSERT_EQUAL(emb_table_push(t, ids, NIDS, g), 0);
		for (uint32_t i = 0; i < NIDS; i++)
			emb_optim_apply(&o.optim, ref + (size_t)i * rf,
					ref + (size_t)i * rf + DIM,
					g + (size_t)i * DIM, DIM);
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, NIDS, out, 0, NULL), 0);
		for (uint32_t i = 0; i < NIDS; i++) {
			for (uint32_t j = 0; j < DIM; j++) {
				float w = ref[(size_t)i * rf + j];

				if (!close_rel(out[i * DIM + j], w) &&
				    bad++ < 5)
					fprintf(
					    stderr,
					    "\n    %s step %u id %llu w[%u]: "
					    "expected %.9g got %.9g",
					    emb_optim_name(optim.kind), s,
					    (unsigned long long)ids[i], j, w,
					    out[i * DIM + j]);
			}
		}
	}
	iter_collect(t, 64, NIDS, &it);
	CU_ASSERT_EQUAL(it.n, NIDS);
	for (uint32_t k = 0; k < it.n; k++) {
		int i = find_id(ids, NIDS, it.ids[k]);

		CU_ASSERT_FATAL(i >= 0);
		for (uint32_t j = DIM; j < rf; j++) {
			float want = ref[(size_t)i * rf + j];
			float got = it.rows[(size_t)k * rf + j];

			if (!close_rel(got, want) && bad++ < 5)
				fprintf(stderr,
					"\n    %s id %llu state[%u]: expected "
					"%.9g got %.9g",
					emb_optim_name(optim.kind),
					(unsigned long long)it.ids[k], j - DIM,
					want, got);
		}
	}
	iter_free(&it);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(table_stats(t).step, STEPS);
	emb_table_destroy(t);
	free(ref);
	free(g);
}

/*
 * Runs check with SGD (plain and with decay), Adagrad, Adam, FTRL and
 * row-wise Adagrad.
 */
static void each_optimizer(void (*check)(struct emb_optim_cfg))
{
	struct emb_optim_cfg c = EMB_OPTIM_CFG_DEFAULT;

	c.lr = 0.1f;
	check(c);
	c.weight_decay = 0.05f;
	check(c);
	c.kind = EMB_OPTIM_ADAGRAD;
	check(c);
	c.kind = EMB_OPTIM_ADAM;
	c.lr = 0.01f;
	check(c);
	c.kind = EMB_OPTIM_FTRL;
	c.lr = 0.05f;
	c.l1 = 0.01f;
	c.l2 = 0.1f;
	check(c);
	c.kind = EMB_OPTIM_ROWWISE_ADAGRAD;
	c.lr = 0.1f;
	check(c);
}

/*
 * A rowwise_adagrad table keeps dim + 1 floats a row (one accumulator),
 * and a push applies the update as defined, here in double precision:
 * acc += mean of g^2 over the row (repeated ids summed first), then
 * w -= lr * g / (sqrt(acc) + eps); two pushes, so acc accumulates.
 */
static void test_rowwise_adagrad_rows(void)
{
	enum { DIM = 64 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[3] = {5, 6, 5};
	float g[3 * DIM], out[2 * DIM];
	double w[2][DIM], acc[2] = {0.25, 0.25};
	struct emb_table_stats st;
	struct iter_out it;
	struct emb_table *t;
	int bad = 0;

	o.dim = DIM;
	o.optim.kind = EMB_OPTIM_ROWWISE_ADAGRAD;
	o.optim.lr = 0.1f;
	o.optim.initial_accumulator = 0.25f;
	o.init = (struct emb_init_cfg){.kind = EMB_INIT_CONSTANT, .a = 0.5f};
	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_row_floats(t), DIM + 1);
	for (uint32_t r = 0; r < 2; r++) {
		for (uint32_t j = 0; j < DIM; j++)
			w[r][j] = 0.5;
	}
	for (uint32_t step = 0; step < 2; step++) {
		for (uint32_t i = 0; i < 3 * DIM; i++)
			g[i] = (float)((int)((i * 5 + step) % 9) - 4) * 0.25f;
		CU_ASSERT_EQUAL_FATAL(emb_table_push(t, ids, 3, g), 0);
		for (uint32_t r = 0; r < 2; r++) {
			double sum = 0.0, gj[DIM];

			for (uint32_t j = 0; j < DIM; j++) {
				gj[j] = (double)g[r * DIM + j] +
					(r == 0 ? (double)g[2 * DIM + j] : 0.0);
				sum += gj[j] * gj[j];
			}
			acc[r] += sum / DIM;
			for (uint32_t j = 0; j < DIM; j++)
				w[r][j] -= o.optim.lr * gj[j] /
					   (sqrt(acc[r]) + o.optim.eps);
		}
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, 2, out, 0, NULL), 0);
		for (uint32_t r = 0; r < 2; r++) {
			for (uint32_t j = 0; j < DIM; j++) {
				if (!close_rel(out[r * DIM + j], w[r][j]) &&
				    bad++ < 5)
					fprintf(stderr,
						"\n    step %u id %llu w[%u]: "
						"expected %.9g got %.9g",
						step, (unsigned long long)ids[r],
						j, w[r][j], out[r * DIM + j]);
			}
		}
	}
	/* The one state float, as the iterator hands out whole rows. */
	iter_collect(t, 64, 2, &it);
	CU_ASSERT_EQUAL_FATAL(it.n, 2);
	for (uint32_t k = 0; k < it.n; k++) {
		int r = find_id(ids, 2, it.ids[k]);

		CU_ASSERT_FATAL(r >= 0);
		CU_ASSERT(close_rel(it.rows[(size_t)k * (DIM + 1) + DIM],
				    acc[r]));
	}
	iter_free(&it);
	st = table_stats(t);
	CU_ASSERT(st.row_bytes >= 4 * (DIM + 1));
	CU_ASSERT(st.row_bytes < 4 * 2 * DIM); /* Adagrad's payload */
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_destroy(t);
}

static void test_push_each_optimizer(void)
{
	each_optimizer(push_matches_apply);
}

/* Adagrad tells one update with the sum apart from two updates. */
static void test_push_sums_duplicates(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[4] = {3, 4, 3, 3};
	float g[4 * 4], once[8], twice[8], out[2 * 4], sum[4];
	struct emb_table_stats s;
	struct emb_table *t;
	int bad = 0;

	o.dim = 4;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	o.optim.lr = 0.5f;
	t = table_new(&o);
	for (uint32_t i = 0; i < 16; i++)
		g[i] = 0.25f * (float)(i % 5 + 1);
	for (uint32_t j = 0; j < 4; j++)
		sum[j] = g[j] + g[8 + j] + g[12 + j];

	ref_new_row(&o, 3, once);
	emb_optim_apply(&o.optim, once, once + 4, sum, 4);
	ref_new_row(&o, 3, twice);
	emb_optim_apply(&o.optim, twice, twice + 4, &g[0], 4);
	emb_optim_apply(&o.optim, twice, twice + 4, &g[8], 4);
	emb_optim_apply(&o.optim, twice, twice + 4, &g[12], 4);
	/* The two readings must be far apart for this test to mean much. */
	CU_ASSERT_FATAL(fabsf(once[0] - twice[0]) > 1e-3f);

	CU_ASSERT_EQUAL(emb_table_push(t, ids, 4, g), 0);
	CU_ASSERT_EQUAL(
	    emb_table_pull(t, (const uint64_t[]){3, 4}, 2, out, 0, NULL), 0);
	for (uint32_t j = 0; j < 4; j++) {
		if (!close_rel(out[j], once[j]) && bad++ < 5)
			fprintf(stderr,
				"\n    w[%u]: expected %.9g (summed) got %.9g "
				"(applied one by one: %.9g)",
				j, once[j], out[j], twice[j]);
	}
	CU_ASSERT_EQUAL(bad, 0);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.pushes, 1);
	CU_ASSERT_EQUAL(s.rows_pushed, 2);
	CU_ASSERT_EQUAL(s.step, 1);
	emb_table_destroy(t);
}

/*
 * A batch with repeated ids, pushed in process as a careless caller would,
 * against the same batch with each id once and its gradients summed in
 * batch order (what the client library sends): every row bit for bit the
 * same, weights and optimizer state, and no id made into two rows. Half
 * the ids exist before the push and half are created by it; dim 20 runs
 * the sums' 16-float blocks and their tail.
 */
static void push_repeats_match_summed(struct emb_optim_cfg optim)
{
	enum { NIDS = 200, N = 700, DIM = 20 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t ids[N], uniq[NIDS], st = 42;
	float *g, *sums, *rows;
	uint32_t nu = 0, rf, first[NIDS];
	struct iter_out a, b;
	struct emb_table *ta, *tb;
	int bad = 0;

	o.dim = DIM;
	o.optim = optim;
	o.seed = 9;
	o.nshards = 4;
	rf = ref_row_floats(&o);
	ta = table_new(&o);
	o.name = "summed";
	tb = table_new(&o);
	g = xcalloc((size_t)N * DIM, sizeof(float));
	sums = xcalloc((size_t)NIDS * DIM, sizeof(float));
	rows = xcalloc((size_t)NIDS * DIM, sizeof(float));
	for (uint32_t i = 0; i < NIDS / 2; i++)
		uniq[i] = 1000 + i;
	/* The first half of the ids exist before the push (a pull that
	 * creates returns how many were missing). */
	CU_ASSERT_EQUAL(emb_table_pull(ta, uniq, NIDS / 2, rows, 0, NULL),
			NIDS / 2);
	CU_ASSERT_EQUAL(emb_table_pull(tb, uniq, NIDS / 2, rows, 0, NULL),
			NIDS / 2);

	for (uint32_t i = 0; i < NIDS; i++)
		first[i] = UINT32_MAX;
	for (uint32_t i = 0; i < N; i++) {
		/* Runs of one id (repeats within a chunk), then far ones. */
		uint32_t k = i % 7 < 2 && i ? (uint32_t)(ids[i - 1] - 1000)
					    : rnd_below(&st, NIDS);
		float *sum;

		ids[i] = 1000 + k;
		for (uint32_t j = 0; j < DIM; j++)
			g[(size_t)i * DIM + j] =
			    (float)((int)rnd_below(&st, 2001) - 1000) * 1e-3f;
		if (first[k] == UINT32_MAX) {
			first[k] = nu;
			uniq[nu++] = ids[i];
			memcpy(sums + (size_t)first[k] * DIM,
			       g + (size_t)i * DIM, DIM * sizeof(float));
			continue;
		}
		sum = sums + (size_t)first[k] * DIM;
		for (uint32_t j = 0; j < DIM; j++)
			sum[j] += g[(size_t)i * DIM + j];
	}
	CU_ASSERT_FATAL(nu < N / 2);

	CU_ASSERT_EQUAL(emb_table_push(ta, ids, N, g), 0);
	CU_ASSERT_EQUAL(emb_table_push(tb, uniq, nu, sums), 0);
	CU_ASSERT_EQUAL(table_stats(ta).rows_pushed, nu);
	CU_ASSERT_EQUAL(table_stats(ta).rows, table_stats(tb).rows);

	iter_collect(ta, 64, NIDS, &a);
	iter_collect(tb, 64, NIDS, &b);
	CU_ASSERT_EQUAL_FATAL(a.n, b.n);
	for (uint32_t i = 0; i < a.n; i++) {
		uint32_t j = 0;

		/* Distinct ids, each in b too. */
		for (uint32_t k = 0; k < i; k++)
			CU_ASSERT_NOT_EQUAL(a.ids[k], a.ids[i]);
		while (j < b.n && b.ids[j] != a.ids[i])
			j++;
		CU_ASSERT_FATAL(j < b.n);
		expect_floats(emb_optim_name(optim.kind), a.ids[i],
			      a.rows + (size_t)i * rf, b.rows + (size_t)j * rf,
			      rf, &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	iter_free(&a);
	iter_free(&b);
	emb_table_destroy(ta);
	emb_table_destroy(tb);
	free(rows);
	free(sums);
	free(g);
}

static void test_push_repeats_each_optimizer(void)
{
	each_optimizer(push_repeats_match_summed);
}

/* A push to an absent id creates it from the initializer, then applies. */
static void test_push_creates(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t id = 123456789;
	float g[8], want[8], out[8];
	struct emb_table *t;
	int bad = 0;

	o.optim.lr = 1.0f;
	o.init = (struct emb_init_cfg){EMB_INIT_CONSTANT, 0.5f, 0.0f};
	t = table_new(&o);
	for (uint32_t j = 0; j < 8; j++) {
		g[j] = (float)j;
		want[j] = 0.5f - (float)j;
	}
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows_created, 1);
	CU_ASSERT_EQUAL(emb_table_pull(t, &id, 1, out, EMB_PULL_NOCREATE, NULL),
			0);
	expect_floats("pushed new row", id, out, want, 8, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_destroy(t);
}

/*
 * A push whose group spans many chunks, in one shard: existing ids and
 * absent ones alternate, so the ids it creates grow the index several
 * times while the next chunks are already resolved (a push resolves a
 * chunk ahead), and every tag seen before a growth is checked against
 * the index after it. Each row must end as its initial value minus its
 * gradient, exactly once, and no id become two rows.
 */
static void test_push_pipelined_growth(void)
{
	enum { OLD = 300, N = 5000, DIM = 8 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	float *g = xcalloc((size_t)N * DIM, sizeof(float));
	float *out = xcalloc((size_t)N * DIM, sizeof(float));
	uint64_t old[OLD];
	float want[DIM];
	struct emb_table *t;
	int bad = 0;

	o.dim = DIM;
	o.nshards = 1;
	o.optim.lr = 1.0f;
	o.seed = 5;
	t = table_new(&o);
	/* ids 7 * i + 1; those at every 16th position, the first OLD of
	 * them, exist before the push */
	for (uint32_t i = 0; i < N; i++) {
		ids[i] = 7 * (uint64_t)i + 1;
		for (uint32_t j = 0; j < DIM; j++)
			g[(size_t)i * DIM + j] = (float)(i % 13) - (float)j;
	}
	for (uint32_t k = 0; k < OLD; k++)
		old[k] = ids[16 * k];
	CU_ASSERT_EQUAL(emb_table_pull(t, old, OLD, out, 0, NULL), OLD);
	CU_ASSERT_EQUAL(emb_table_push(t, ids, N, g), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, N);
	CU_ASSERT_EQUAL(table_stats(t).rows_pushed, N);
	CU_ASSERT_EQUAL(table_stats(t).rows_created, N);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, N, out, EMB_PULL_NOCREATE, NULL),
			0);
	for (uint32_t i = 0; i < N; i++) {
		emb_table_init_row(t, ids[i], want, false);
		for (uint32_t j = 0; j < DIM; j++)
			want[j] -= g[(size_t)i * DIM + j];
		expect_floats("pipelined push", ids[i],
			      out + (size_t)i * DIM, want, DIM, &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	emb_table_destroy(t);
	free(out);
	free(g);
	free(ids);
}

/* Pulls ids[0..n) one batch; each id becomes one access at this step. */
static void touch(struct emb_table *t, const uint64_t *ids, uint32_t n)
{
	float *out = xcalloc((size_t)n * emb_table_dim(t), sizeof(float));

	CU_ASSERT(emb_table_pull(t, ids, n, out, 0, NULL) >= 0);
	free(out);
}

/*
 * Pulls record their accesses only under an eviction policy; a row cap far
 * above what a test holds is one that never evicts anything.
 */
static void track_pulls(struct emb_table_opts *o)
{
	o->life.max_rows = 1ull << 40;
}

static void advance(struct emb_table *t, uint32_t steps)
{
	const uint64_t clock_id = UINT64_MAX - 7;
	float g[8] = {0};

	for (uint32_t i = 0; i < steps; i++)
		CU_ASSERT_EQUAL(emb_table_push(t, &clock_id, 1, g), 0);
}

static void test_evict_by_age(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t old_ids[3] = {1, 2, 3}, new_ids[2] = {4, 5};
	struct emb_table_stats s;
	struct emb_table *t;
	float before[2 * 8], after[2 * 8];
	int bad = 0;

	t = table_new(&o);
	touch(t, old_ids, 3);
	advance(t, 20);
	CU_ASSERT_EQUAL(table_stats(t).step, 20);
	touch(t, new_ids, 2);
	CU_ASSERT_EQUAL(emb_table_pull(t, new_ids, 2, before, 0, NULL), 0);

	/* Nothing is idle for 30 steps yet. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 30, 0), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, 6);
	/* The old rows are 20 steps idle, the new ones 0, the clock row 1. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 10, 0), 3);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, 3);
	CU_ASSERT_EQUAL(s.rows_evicted, 3);
	for (uint32_t i = 0; i < 3; i++)
		CU_ASSERT_FALSE(table_has(t, old_ids[i]));
	CU_ASSERT_EQUAL(
	    emb_table_pull(t, new_ids, 2, after, EMB_PULL_NOCREATE, NULL), 0);
	expect_floats("survivor", 0, after, before, 16, &bad);
	CU_ASSERT_EQUAL(bad, 0);
	/* No limits: nothing goes. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 0, 0), 0);
	CU_ASSERT_EQUAL(table_stats(t).rows, 3);
	emb_table_destroy(t);
}

static void test_evict_by_count(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t rare[2] = {10, 11}, hot[2] = {20, 21};
	struct emb_table *t;

	track_pulls(&o);
	t = table_new(&o);
	touch(t, rare, 2);
	for (int i = 0; i < 6; i++)
		touch(t, hot, 2);
	/* Accessed 1 and 6 times. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 0, 3), 2);
	CU_ASSERT_FALSE(table_has(t, 10));
	CU_ASSERT_FALSE(table_has(t, 11));
	CU_ASSERT_TRUE(table_has(t, 20));
	CU_ASSERT_TRUE(table_has(t, 21));
	CU_ASSERT_EQUAL(table_stats(t).rows_evicted, 2);
	CU_ASSERT_EQUAL(table_stats(t).rows, 2);
	emb_table_destroy(t);
}

/* Either limit removes a row. */
static void test_evict_either_limit(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t old_hot = 1, new_rare = 2, new_hot = 3;
	struct emb_table *t;

	track_pulls(&o);
	t = table_new(&o);
	for (int i = 0; i < 5; i++)
		touch(t, &old_hot, 1);
	advance(t, 50);
	touch(t, &new_rare, 1);
	for (int i = 0; i < 5; i++)
		touch(t, &new_hot, 1);
	/* The clock row was pushed 50 times, so it stays too. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 20, 3), 2);
	CU_ASSERT_FALSE(table_has(t, old_hot));
	CU_ASSERT_FALSE(table_has(t, new_rare));
	CU_ASSERT_TRUE(table_has(t, new_hot));
	emb_table_destroy(t);
}

/* Lifecycle data set by assign drives eviction like real accesses. */
static void test_evict_assigned_meta(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[3] = {100, 200, 300};
	const struct emb_row_meta meta[3] = {
	    {.last_step = 0, .count = 100},
	    {.last_step = 95, .count = 100},
	    {.last_step = 95, .count = 1},
	};
	float rows[3 * 8] = {0};
	struct emb_table *t;

	t = table_new(&o);
	advance(t, 100);
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 3, rows, false, meta), 0);
	CU_ASSERT_EQUAL(emb_table_evict(t, 50, 0), 1);
	CU_ASSERT_FALSE(table_has(t, 100));
	CU_ASSERT_EQUAL(emb_table_evict(t, 0, 50), 1);
	CU_ASSERT_FALSE(table_has(t, 300));
	CU_ASSERT_TRUE(table_has(t, 200));
	emb_table_destroy(t);
}

static void test_stats_counters(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	/* The duplicate in a is of a present id: see
	 * test_pull_duplicate_missing for absent ones. */
	const uint64_t a0[3] = {1, 2, 3}, a[4] = {1, 2, 1, 3}, b[3] = {3, 4, 4};
	float out[4 * 8], g[4 * 8] = {0};
	struct emb_table_stats s;
	struct emb_table *t;

	t = table_new(&o);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, 0);
	CU_ASSERT_EQUAL(s.pulls, 0);
	CU_ASSERT_EQUAL(s.step, 0);
	CU_ASSERT(s.row_bytes >= 8 * sizeof(float));

	CU_ASSERT_EQUAL(emb_table_pull(t, a0, 3, out, 0, NULL), 3);
	CU_ASSERT_EQUAL(emb_table_pull(t, a, 4, out, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, b, 3, g), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, b, 3, out, EMB_PULL_NOCREATE, NULL),
			0);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows_pulled, 3 + 4 + 3);
	CU_ASSERT_EQUAL(s.misses, 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, (const uint64_t[]){9}, 1, out,
				       EMB_PULL_NOCREATE, NULL),
			1);
	CU_ASSERT_EQUAL(emb_table_erase(t, (const uint64_t[]){2, 9}, 2), 1);
	s = table_stats(t);
	CU_ASSERT_EQUAL(s.rows, 3);
	CU_ASSERT_EQUAL(s.pulls, 4);
	CU_ASSERT_EQUAL(s.pushes, 1);
	CU_ASSERT_EQUAL(s.rows_pushed, 2);
	CU_ASSERT_EQUAL(s.rows_created, 4);
	CU_ASSERT_EQUAL(s.rows_erased, 1);
	CU_ASSERT_EQUAL(s.rows_evicted, 0);
	CU_ASSERT_EQUAL(s.misses, 1);
	CU_ASSERT_EQUAL(s.step, 1);
	CU_ASSERT(s.extents >= 1);
	CU_ASSERT(s.slab_bytes >= s.rows * s.row_bytes);
	CU_ASSERT(s.bytes >= s.slab_bytes + s.index_bytes);
	emb_table_destroy(t);
}

/*
 * Memory per row: SGD at dim 64 keeps 256 bytes of weights, and the record
 * plus its index entry may add 24 more, over a million rows.
 */
#define BYTES_ROWS 1000000u

static void test_bytes_per_row(void)
{
	enum { BATCH = 4096 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(BATCH, sizeof(*ids));
	float *out = xcalloc((size_t)BATCH * 64, sizeof(float));
	struct emb_table_stats s;
	struct emb_table *t;

	o.dim = 64;
	o.init.kind = EMB_INIT_ZEROS;
	t = table_new(&o);
	for (uint32_t done = 0; done < BYTES_ROWS; done += BATCH) {
		uint32_t n =
		    BYTES_ROWS - done < BATCH ? BYTES_ROWS - done : BATCH;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = emb_id_hash(done + i);
		CU_ASSERT_EQUAL_FATAL(emb_table_pull(t, ids, n, out, 0, NULL),
				      (int)n);
	}
	s = table_stats(t);
	fprintf(stderr,
		"\n    %u rows dim 64: row_bytes %llu bytes %llu (%.1f/row) "
		"slab %llu index %llu extents %llu",
		BYTES_ROWS, (unsigned long long)s.row_bytes,
		(unsigned long long)s.bytes, (double)s.bytes / s.rows,
		(unsigned long long)s.slab_bytes,
		(unsigned long long)s.index_bytes,
		(unsigned long long)s.extents);
	CU_ASSERT_EQUAL(s.rows, BYTES_ROWS);
	CU_ASSERT(s.row_bytes >= 256);
	CU_ASSERT(s.row_bytes <= 256 + 24);
	/* The budget: 256 B of payload + 24 B per row, plus a few MB fixed
	 * (at most one partly filled 64 KiB slab per shard). */
	CU_ASSERT(s.bytes <= (uint64_t)BYTES_ROWS * 280 + (4u << 20));
	CU_ASSERT(s.slab_bytes >= s.rows * s.row_bytes);
	CU_ASSERT(s.bytes >= s.slab_bytes + s.index_bytes);
	emb_table_destroy(t);
	free(ids);
	free(out);
}

static void test_mem_limit(void)
{
	enum { BATCH = 256, MAXROWS = 200000 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(MAXROWS, sizeof(*ids));
	float *out = xcalloc((size_t)MAXROWS * 64, sizeof(float));
	float want[64], g[64] = {0};
	const float *ptr;
	uint8_t *found = xcalloc(MAXROWS, 1);
	struct emb_table_stats s;
	struct emb_table *t;
	uint32_t tried = 0;
	int rc = 0, bad = 0;
	uint64_t fresh = 1ull << 50;

	o.dim = 64;
	o.nshards = 4;
	o.mem_limit = 8u << 20;
	t = table_new(&o);
	while (tried < MAXROWS) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[tried + i] = tried + i;
		rc = emb_table_pull(t, ids + tried, BATCH, out, 0, NULL);
		tried += BATCH;
		if (rc < 0)
			break;
	}
	if (rc != EMB_EMEMLIMIT)
		fprintf(stderr, "\n    after %u rows: expected %d got %d (%s)",
			tried, EMB_EMEMLIMIT, rc, emb_strerror(rc));
	CU_ASSERT_EQUAL_FATAL(rc, EMB_EMEMLIMIT);
	s = table_stats(t);
	fprintf(stderr,
		"\n    limit %llu: %llu rows, slab %llu index %llu bytes %llu",
		(unsigned long long)o.mem_limit, (unsigned long long)s.rows,
		(unsigned long long)s.slab_bytes,
		(unsigned long long)s.index_bytes, (unsigned long long)s.bytes);
	CU_ASSERT(s.rows > 0);
	CU_ASSERT(s.slab_bytes + s.index_bytes <= o.mem_limit);

	/* Existing rows are still served, in full. */
	rc = emb_table_pull(t, ids, tried, out, EMB_PULL_NOCREATE, found);
	CU_ASSERT(rc >= 0);
	CU_ASSERT_EQUAL((uint64_t)(tried - (uint32_t)rc), s.rows);
	for (uint32_t i = 0; i < tried; i++) {
		if (!found[i])
			continue;
		emb_init_row(&o.init, o.seed, ids[i], want, 64);
		expect_floats("under limit", ids[i], out + (size_t)i * 64, want,
			      64, &bad);
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 1, out, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 1, g), 0);

	/*
	 * The failed batch may have stopped short of the last row that fits
	 * (rows created before the error stay); fill up one row at a time.
	 */
	for (int i = 0; i < 4096; i++) {
		rc = emb_table_pull(t, &fresh, 1, out, 0, NULL);
		if (rc < 0)
			break;
		fresh++;
	}
	CU_ASSERT_EQUAL_FATAL(rc, EMB_EMEMLIMIT);
	s = table_stats(t);
	CU_ASSERT(s.slab_bytes + s.index_bytes <= o.mem_limit);
	/* Full: every way of creating a row hits the same limit. */
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, &fresh, 1, &ptr, 0),
			EMB_EMEMLIMIT);
	CU_ASSERT_EQUAL(emb_table_push(t, &fresh, 1, g), EMB_EMEMLIMIT);
	CU_ASSERT_EQUAL(emb_table_assign(t, &fresh, 1, g, false, NULL),
			EMB_EMEMLIMIT);
	CU_ASSERT_FALSE(table_has(t, fresh));
	CU_ASSERT_EQUAL(table_stats(t).rows, s.rows);
	CU_ASSERT_EQUAL(table_stats(t).rows_created, s.rows_created);

	/* Erasing rows makes room again. */
	CU_ASSERT(emb_table_erase(t, ids, tried / 2) > 0);
	rc = emb_table_pull(t, &fresh, 1, out, 0, NULL);
	if (rc != 1)
		fprintf(stderr, "\n    after erase: expected 1 got %d (%s)", rc,
			emb_strerror(rc));
	CU_ASSERT_EQUAL(rc, 1);
	emb_table_destroy(t);
	free(ids);
	free(out);
	free(found);
}

/* Fills t with new ids from *next until a pull fails; returns that code. */
static int fill(struct emb_table *t, uint64_t *next)
{
	enum { BATCH = 256 };
	uint64_t ids[BATCH];
	float *out = xcalloc((size_t)BATCH * emb_table_dim(t), sizeof(float));
	int rc = 0;

	for (int round = 0; round < 10000 && rc >= 0; round++) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (*next)++;
		rc = emb_table_pull(t, ids, BATCH, out, 0, NULL);
	}
	free(out);
	return rc;
}

/* Tables sharing a budget compete for it; destroy gives bytes back. */
static void test_shared_budget(void)
{
	struct emb_mem_budget b = {.limit = 16u << 20, .used = 0};
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table *t1, *t2;
	uint64_t next = 1, used1, one = 1ull << 60;
	float out[64];
	int rc;

	o.dim = 64;
	o.nshards = 4;
	o.budget = &b;
	o.name = "first";
	t1 = table_new(&o);
	o.name = "second";
	t2 = table_new(&o);
	rc = fill(t1, &next);
	CU_ASSERT_EQUAL(rc, EMB_EMEMLIMIT);
	used1 = __atomic_load_n(&b.used, __ATOMIC_RELAXED);
	CU_ASSERT(used1 <= b.limit);
	CU_ASSERT(used1 >= b.limit / 2);
	CU_ASSERT(table_stats(t1).rows > 0);
	/* The other table finds the budget spent. */
	rc = fill(t2, &next);
	CU_ASSERT_EQUAL(rc, EMB_EMEMLIMIT);
	CU_ASSERT(__atomic_load_n(&b.used, __ATOMIC_RELAXED) <= b.limit);
	/* Destroying the first gives its bytes back. */
	emb_table_destroy(t1);
	CU_ASSERT(__atomic_load_n(&b.used, __ATOMIC_RELAXED) < used1);
	rc = emb_table_pull(t2, &one, 1, out, 0, NULL);
	CU_ASSERT_EQUAL(rc, 1);
	emb_table_destroy(t2);
	CU_ASSERT_EQUAL(__atomic_load_n(&b.used, __ATOMIC_RELAXED), 0);
}

static struct emb_row_meta meta_of(struct emb_table *t, uint64_t id)
{
	struct emb_row_meta m = {UINT32_MAX, UINT32_MAX};
	struct iter_out it;

	iter_collect(t, 64, 64, &it);
	for (uint32_t k = 0; k < it.n; k++)
		if (it.ids[k] == id)
			m = it.meta[k];
	iter_free(&it);
	return m;
}

/*
 * Without an eviction policy a pull writes nothing into the rows it reads:
 * the access meta is that of the row's creation and its writes. Under a
 * policy, every pull counts; and a policy set later starts every row's
 * idle time when it is set, so a ttl does not evict rows that were only
 * read meanwhile.
 */
static void test_pull_meta_only_under_eviction(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_lifecycle_cfg ttl = EMB_LIFECYCLE_CFG_DEFAULT;
	const uint64_t id = 77, other = 78;
	float g[8] = {0};
	struct emb_row_meta m;
	struct emb_table *t;

	t = table_new(&o);
	touch(t, &id, 1); /* created at step 0: an access */
	advance(t, 5);
	for (int i = 0; i < 4; i++)
		touch(t, &id, 1);
	m = meta_of(t, id);
	CU_ASSERT_EQUAL(m.count, 1);
	CU_ASSERT_EQUAL(m.last_step, 0);
	/* A write counts. */
	CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), 0);
	m = meta_of(t, id);
	CU_ASSERT_EQUAL(m.count, 2);
	CU_ASSERT_EQUAL(m.last_step, 6);
	/* Admission alone reads no access meta either. */
	CU_ASSERT_EQUAL(emb_admit_parse("count:2", &ttl), 0);
	CU_ASSERT_EQUAL(emb_table_set_lifecycle(t, &ttl), 0);
	touch(t, &id, 1);
	CU_ASSERT_EQUAL(meta_of(t, id).count, 2);

	/* 30 idle steps by the write meta, then a ttl of 10 is set: the
	 * row's idle time starts now, and it stays. */
	advance(t, 30);
	touch(t, &id, 1);
	ttl = EMB_LIFECYCLE_CFG_DEFAULT;
	CU_ASSERT_EQUAL(emb_evict_parse("ttl:10", &ttl), 0);
	CU_ASSERT_EQUAL(emb_table_set_lifecycle(t, &ttl), 0);
	m = meta_of(t, id);
	CU_ASSERT_EQUAL(m.last_step, 36);
	CU_ASSERT_EQUAL(m.count, 2);
	advance(t, 4);
	/* From now on pulls count, and keep the row alive. */
	touch(t, &id, 1);
	touch(t, &id, 1);
	m = meta_of(t, id);
	CU_ASSERT_EQUAL(m.count, 4);
	CU_ASSERT_EQUAL(m.last_step, 40);
	touch(t, &other, 1); /* created at step 40 */
	for (int i = 0; i < 6; i++) {
		advance(t, 4);
		touch(t, &id, 1);
	}
	/* Only the row nobody pulled is idle past 10 steps. */
	CU_ASSERT_EQUAL(meta_of(t, other).count, 1);
	CU_ASSERT_EQUAL(emb_table_evict(t, 10, 0), 1);
	CU_ASSERT_TRUE(table_has(t, id));
	CU_ASSERT_FALSE(table_has(t, other));
	emb_table_destroy(t);
}

/*
 * Rows a pull creates are bit for bit the reference generator's (the
 * scalar emb_init_row_ref), whatever SIMD path the store's initializer
 * takes: dims around the 16-float vector step, ids spread over 64 bits, in
 * one batch and then one id at a time into a second table. A backup that
 * creates the same id from seed and id must get the same row.
 */
static void test_created_rows_match_reference(void)
{
	static const uint32_t dims[] = {1, 7, 15, 16, 17, 31, 64, 100, 257};
	enum { N = 600 };
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	uint32_t bad = 0;

	for (uint32_t i = 0; i < N; i++)
		ids[i] = emb_id_hash(i) ^ ((uint64_t)i << 40);
	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
		struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
		float *out = xcalloc((size_t)N * dims[d], sizeof(float));
		float *one = xcalloc(dims[d], sizeof(float));
		float *ref = xcalloc(dims[d], sizeof(float));
		struct emb_table *t, *t1;

		o.dim = dims[d];
		o.seed = 1000 + d;
		o.init.a = -0.5f;
		o.init.b = 0.25f;
		t = table_new(&o);
		t1 = table_new(&o);
		CU_ASSERT_EQUAL(emb_table_pull(t, ids, N, out, 0, NULL), N);
		for (uint32_t i = 0; i < N; i++) {
			emb_init_row_ref(&o.init, o.seed, ids[i], ref, o.dim);
			if (memcmp(out + (size_t)i * o.dim, ref,
				   o.dim * sizeof(float)))
				bad++;
			CU_ASSERT_EQUAL(
			    emb_table_pull(t1, &ids[i], 1, one, 0, NULL), 1);
			if (memcmp(one, ref, o.dim * sizeof(float)))
				bad++;
		}
		emb_table_destroy(t);
		emb_table_destroy(t1);
		free(out);
		free(one);
		free(ref);
	}
	CU_ASSERT_EQUAL(bad, 0);
	free(ids);
}

/* Access counts stop at EMB_ROW_COUNT_MAX instead of wrapping. */
static void test_count_saturates(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t id = 42;
	const struct emb_row_meta m = {.last_step = 0,
				       .count = EMB_ROW_COUNT_MAX - 1};
	float row[8] = {0}, g[8] = {0};
	struct iter_out it;
	struct emb_table *t;

	t = table_new(&o);
	CU_ASSERT_EQUAL(emb_table_assign(t, &id, 1, row, false, &m), 0);
	for (int i = 0; i < 3; i++) {
		touch(t, &id, 1);
		CU_ASSERT_EQUAL(emb_table_push(t, &id, 1, g), 0);
	}
	iter_collect(t, 4, 1, &it);
	CU_ASSERT_EQUAL_FATAL(it.n, 1);
	CU_ASSERT_EQUAL(it.meta[0].count, EMB_ROW_COUNT_MAX);
	iter_free(&it);
	/* A saturated row is as hot as rows get: a count limit keeps it. */
	CU_ASSERT_EQUAL(emb_table_evict(t, 0, EMB_ROW_COUNT_MAX), 0);
	emb_table_destroy(t);
}

/*
 * The iterator returns every row once, whole: weights, optimizer state and
 * meta. Rows are spread over many shards and read in odd-sized chunks.
 */
static void test_iterator_full_rows(void)
{
	enum { N = 3000, DIM = 3 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	uint32_t *pushes = xcalloc(N, sizeof(*pushes));
	uint8_t *seen = xcalloc(N, 1);
	float *ref, *g, *out;
	uint32_t rf, nb = 0, dup = 0;
	uint64_t *batch = xcalloc(N, sizeof(*batch));
	struct iter_out it;
	struct emb_table *t;
	uint64_t step;
	int bad = 0;

	o.dim = DIM;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	o.optim.lr = 0.1f;
	o.nshards = 32;
	track_pulls(&o);
	rf = ref_row_floats(&o);
	ref = xcalloc((size_t)N * rf, sizeof(float));
	g = xcalloc((size_t)N * DIM, sizeof(float));
	out = xcalloc((size_t)N * DIM, sizeof(float));
	t = table_new(&o);
	for (uint32_t i = 0; i < N; i++) {
		ids[i] = emb_id_hash(i) >> 3;
		ref_new_row(&o, ids[i], ref + (size_t)i * rf);
	}
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, N, out, 0, NULL), N);
	/* Row i is pushed (i % 4) times, each batch distinct ids. */
	for (uint32_t round = 1; round < 4; round++) {
		nb = 0;
		for (uint32_t i = 0; i < N; i++) {
			if (i % 4 < round)
				continue;
			batch[nb] = ids[i];
			for (uint32_t j = 0; j < DIM; j++)
				g[(size_t)nb * DIM + j] =
				    0.5f * (float)(round + j) - 1.0f;
			emb_optim_apply(&o.optim, ref + (size_t)i * rf,
					ref + (size_t)i * rf + DIM,
					g + (size_t)nb * DIM, DIM);
			pushes[i]++;
			nb++;
		}
		CU_ASSERT_EQUAL(emb_table_push(t, batch, nb, g), 0);
	}
	/* A last pull makes the last access a pull at a known step. */
	step = table_stats(t).step;
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, N, out, 0, NULL), 0);

	iter_collect(t, 97, N, &it);
	CU_ASSERT_EQUAL(it.n, N);
	for (uint32_t k = 0; k < it.n; k++) {
		int i = find_id(ids, N, it.ids[k]);

		if (i < 0) {
			CU_FAIL("iterator returned an unknown id");
			continue;
		}
		if (seen[i]++) {
			dup++;
			continue;
		}
		expect_floats("iter row", ids[i], it.rows + (size_t)k * rf,
			      ref + (size_t)i * rf, rf, &bad);
		/* Created by a pull, pushed, pulled again. */
		CU_ASSERT_EQUAL(it.meta[k].count, 2 + pushes[i]);
		CU_ASSERT_EQUAL(it.meta[k].last_step, (uint32_t)step);
	}
	CU_ASSERT_EQUAL(dup, 0);
	CU_ASSERT_EQUAL(bad, 0);
	iter_free(&it);

	/* An emptied table iterates to nothing. */
	CU_ASSERT_EQUAL(emb_table_erase(t, ids, N), N);
	iter_collect(t, 8, 1, &it);
	CU_ASSERT_EQUAL(it.n, 0);
	iter_free(&it);
	emb_table_destroy(t);
	free(ids);
	free(pushes);
	free(seen);
	free(ref);
	free(g);
	free(out);
	free(batch);
}

/* A batch with one NaN or Inf is refused whole; no row changes. */
static void test_nonfinite_refused(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	const uint64_t ids[2] = {7, 8};
	float g[16], before[16], after[16];
	struct emb_table *t;

	o.dim = 8;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	t = table_new(&o);
	for (int i = 0; i < 16; i++)
		g[i] = 0.5f;
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 2, before, 0, NULL), 2);
	g[11] = NAN;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 2, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_assign(t, ids, 2, g, false, NULL),
			EMB_ENONFINITE);
	g[11] = INFINITY;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 2, g), EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 2, after, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(before, after, sizeof(before)), 0);
	CU_ASSERT_EQUAL(table_stats(t).step, 0);
	emb_table_destroy(t);
}

/* Every row an iterator yields, as a bitmap over ids[0..N) (by index);
 * tracked: 0 every row, 1 the tracked rows, 2 those taking the marks. */
static uint32_t iter_mark(struct emb_table *t, int tracked, uint32_t first,
			  uint32_t n, const uint64_t *ids, uint32_t N,
			  uint8_t *seen)
{
	uint32_t rf = emb_table_row_floats(t), got = 0;
	uint64_t *oid = xcalloc(256, sizeof(*oid));
	float *rows = xcalloc((size_t)256 * rf, sizeof(float));
	struct emb_table_iter *it;
	int k;

	memset(seen, 0, N);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL(emb_table_iter_slots(it, first, n), 0);
	if (tracked == 1)
		CU_ASSERT_EQUAL(emb_table_iter_tracked(it), 0);
	if (tracked == 2)
		CU_ASSERT_EQUAL(emb_table_iter_tracked_take(it), 0);
	while ((k = emb_table_iter_next(it, oid, rows, NULL, 256)) > 0)
		for (int j = 0; j < k; j++) {
			uint32_t sl = emb_id_slot(oid[j]);

			CU_ASSERT(sl >= first && sl < first + n);
			for (uint32_t i = 0; i < N; i++)
				if (ids[i] == oid[j]) {
					CU_ASSERT_EQUAL(seen[i], 0);
					seen[i] = 1;
					got++;
				}
		}
	emb_table_iter_destroy(it);
	free(oid);
	free(rows);
	return got;
}

/*
 * What a live move relies on: an iterator over a range of slots yields
 * exactly the rows there; after emb_table_track_begin(), the tracked
 * iterator yields exactly the rows written or made since in that range,
 * and removals there (not elsewhere) are counted.
 */
static void test_track_moves(void)
{
	enum { N = 4000, DIM = 4, FIRST = 1000, NS = 600 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(N, sizeof(*ids));
	uint8_t *seen = xcalloc(N, 1), *want = xcalloc(N, 1);
	float *w = xcalloc((size_t)N * DIM, sizeof(float));
	uint64_t in_id = 0, out_id = 0, made = 1u << 30;
	uint32_t in = 0, wrote = 0;
	struct emb_table *t;

	o.dim = DIM;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	o.nshards = 16;
	t = table_new(&o);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = i + 1;
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, N / 2, w, 0, NULL), N / 2);
	for (uint32_t i = 0; i < N / 2; i++)
		in += emb_id_slot(ids[i]) - FIRST < NS;
	CU_ASSERT_EQUAL(iter_mark(t, false, FIRST, NS, ids, N, seen), in);
	CU_ASSERT_EQUAL(emb_table_iter_slots(NULL, 0, 1), EMB_EBADARG);
	CU_ASSERT_NOT_EQUAL(emb_table_iter_slots((void *)w, 0, 0), 0);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), UINT64_MAX);
	CU_ASSERT_EQUAL(emb_table_track_begin(t, 4000, 200), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_track_begin(t, FIRST, NS), 0);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), 0);
	/* Nothing written yet: the tracked walk is empty. */
	CU_ASSERT_EQUAL(iter_mark(t, true, FIRST, NS, ids, N, seen), 0);
	/* Every 7th old row pushed, every 5th new row made (the table grows
	 * slabs meanwhile: the marks follow). */
	for (uint32_t i = 0; i < N; i += 7)
		if (i < N / 2) {
			CU_ASSERT_EQUAL(emb_table_push(t, &ids[i], 1, w), 0);
			want[i] = emb_id_slot(ids[i]) - FIRST < NS;
		}
	for (uint32_t i = N / 2; i < N; i += 5) {
		CU_ASSERT_EQUAL(emb_table_pull(t, &ids[i], 1, w, 0, NULL), 1);
		want[i] = emb_id_slot(ids[i]) - FIRST < NS;
	}
	for (uint32_t i = 0; i < N; i++)
		wrote += want[i];
	CU_ASSERT_FATAL(wrote > 0);
	CU_ASSERT_EQUAL(iter_mark(t, true, FIRST, NS, ids, N, seen), wrote);
	CU_ASSERT_EQUAL(memcmp(seen, want, N), 0);
	/* A walk that takes the marks yields the same rows and leaves none
	 * (every shard's), so the walks after it yield only what is written
	 * after it: a copy ahead's second pass, then the fenced stream. */
	CU_ASSERT_EQUAL(emb_table_track_count(t, FIRST, NS), wrote);
	CU_ASSERT(emb_table_track_count(t, 0, EMB_NSLOTS) > wrote);
	CU_ASSERT_EQUAL(iter_mark(t, 2, FIRST, NS, ids, N, seen), wrote);
	CU_ASSERT_EQUAL(memcmp(seen, want, N), 0);
	CU_ASSERT_EQUAL(emb_table_track_count(t, 0, EMB_NSLOTS), 0);
	CU_ASSERT_EQUAL(iter_mark(t, 1, 0, EMB_NSLOTS, ids, N, seen), 0);
	CU_ASSERT_EQUAL(iter_mark(t, 2, FIRST, NS, ids, N, seen), 0);
	for (uint32_t i = 0; i < N / 2; i++)
		if (emb_id_slot(ids[i]) - FIRST < NS) {
			CU_ASSERT_EQUAL(emb_table_push(t, &ids[i], 1, w), 0);
			CU_ASSERT_EQUAL(emb_table_track_count(t, FIRST, NS), 1);
			CU_ASSERT_EQUAL(
			    iter_mark(t, 1, FIRST, NS, ids, N, seen), 1);
			CU_ASSERT_EQUAL(seen[i], 1);
			CU_ASSERT_EQUAL(
			    iter_mark(t, 2, FIRST, NS, ids, N, seen), 1);
			CU_ASSERT_EQUAL(
			    iter_mark(t, 1, FIRST, NS, ids, N, seen), 0);
			break;
		}
	CU_ASSERT_EQUAL(emb_table_iter_tracked_take(NULL), EMB_EBADARG);
	/* A removal outside the slots is not counted, one inside is. */
	for (uint32_t i = 1; i < N / 2 && (!in_id || !out_id); i += 2) {
		if (emb_id_slot(ids[i]) - FIRST < NS)
			in_id = in_id ? in_id : ids[i];
		else
			out_id = out_id ? out_id : ids[i];
	}
	CU_ASSERT_EQUAL(emb_table_erase(t, &out_id, 1), 1);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), 0);
	CU_ASSERT_EQUAL(emb_table_erase(t, &in_id, 1), 1);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), 1);
	/* A new begin starts afresh; the end stops it. */
	CU_ASSERT_EQUAL(emb_table_track_begin(t, FIRST, NS), 0);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), 0);
	CU_ASSERT_EQUAL(emb_table_pull(t, &made, 1, w, 0, NULL), 1);
	emb_table_track_end(t);
	CU_ASSERT_EQUAL(emb_table_track_removed(t), UINT64_MAX);
	CU_ASSERT_EQUAL(emb_table_track_count(t, 0, EMB_NSLOTS), 0);
	CU_ASSERT_EQUAL(iter_mark(t, true, 0, EMB_NSLOTS, ids, N, seen), 0);
	emb_table_track_end(t); /* twice: nothing */
	emb_table_destroy(t);
	free(ids);
	free(seen);
	free(want);
	free(w);
}

/* The live ids an ids-only walk over set yields, checked against live[]:
 * each exactly once, none outside the set. */
static void walk_set_check(struct emb_table *t, const uint64_t *set,
			   const uint64_t *ids, const uint8_t *live, uint32_t N)
{
	uint64_t *oid = xcalloc(300, sizeof(*oid));
	uint8_t *seen = xcalloc(N, 1);
	struct emb_table_iter *it;
	uint32_t want = 0, got = 0;
	int k;

	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL(emb_table_iter_slot_set(it, set), 0);
	/* rows NULL: ids only. */
	while ((k = emb_table_iter_next(it, oid, NULL, NULL, 300)) > 0)
		for (int j = 0; j < k; j++) {
			uint32_t sl = emb_id_slot(oid[j]);

			CU_ASSERT((set[sl / 64] >> (sl % 64)) & 1);
			/* ids[i] == i + 1 */
			CU_ASSERT_FATAL(oid[j] >= 1 && oid[j] <= N);
			CU_ASSERT_EQUAL(seen[oid[j] - 1], 0);
			seen[oid[j] - 1] = 1;
			got++;
		}
	emb_table_iter_destroy(it);
	for (uint32_t i = 0; i < N; i++) {
		uint32_t sl = emb_id_slot(ids[i]);
		bool in = live[i] && ((set[sl / 64] >> (sl % 64)) & 1);

		want += in;
		CU_ASSERT_EQUAL(seen[i], in);
	}
	CU_ASSERT(want > 0);
	CU_ASSERT_EQUAL(got, want);
	free(oid);
	free(seen);
}

/*
 * What the sweep of slots given away and a move's stream rely on: a walk
 * over any set of slots yields exactly the live rows there, ids only when
 * asked, through rows made, removed and made again in freed records after
 * the table's first such walk made its record slots (charged, 2 bytes a
 * record).
 */
static void test_slot_walks(void)
{
	enum { N = 6000, DIM = 4 };
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(N, sizeof(*ids)), set[EMB_NSLOTS / 64] = {0};
	uint8_t *live = xcalloc(N, 1);
	float *w = xcalloc((size_t)N * DIM, sizeof(float));
	struct emb_table_iter *it;
	struct emb_table *t;
	uint64_t before;

	o.dim = DIM;
	o.nshards = 16;
	t = table_new(&o);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = i + 1;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl += 3)
		set[sl / 64] |= 1ull << (sl % 64);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, N / 2, w, 0, NULL), N / 2);
	memset(live, 1, N / 2);
	before = table_stats(t).bytes;
	walk_set_check(t, set, ids, live, N);
	CU_ASSERT(table_stats(t).bytes >= before + (uint64_t)N / 2 * 2);
	/* Every 4th row removed, then the rest made: the new rows take the
	 * freed records first, then new slabs. */
	for (uint32_t i = 0; i < N / 2; i += 4) {
		CU_ASSERT_EQUAL(emb_table_erase(t, &ids[i], 1), 1);
		live[i] = 0;
	}
	walk_set_check(t, set, ids, live, N);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids + N / 2, N / 2, w, 0, NULL),
			N / 2);
	memset(live + N / 2, 1, N / 2);
	walk_set_check(t, set, ids, live, N);
	/* The complement as well, and every slot. */
	for (uint32_t i = 0; i < EMB_NSLOTS / 64; i++)
		set[i] = ~set[i];
	walk_set_check(t, set, ids, live, N);
	memset(set, 0xff, sizeof(set));
	walk_set_check(t, set, ids, live, N);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL(emb_table_iter_slot_set(it, NULL), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_iter_slot_set(NULL, set), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_table_iter_next(it, NULL, NULL, NULL, 1),
			EMB_EBADARG);
	emb_table_iter_destroy(it);
	emb_table_destroy(t);
	free(ids);
	free(live);
	free(w);
}

/*
 * A table's first walk by slot fills each shard's record slots a step at
 * a time, letting go of the shard's lock between rounds of steps
 * (shard.c: a whole shard at once stalled its pulls and pushes for up to
 * 18.6 ms). Between the rounds, rows are erased and made again, in records
 * the build has passed and in records it has not reached: every walk by
 * slot must still yield exactly the live rows of its slots.
 */
enum { STEPS_IDS = 30000, STEPS_FIRST = 100, STEPS_N = 900 };

struct steps_state {
	uint8_t *live; /* by id, ids below 2 * STEPS_IDS */
	uint64_t next; /* the next new id */
	uint64_t rng;
	uint32_t calls;
};

static struct steps_state steps;

/* Erases 40 rows and makes 40 new ones, which take the records freed. */
static void steps_churn(struct emb_table *t)
{
	uint64_t ids[40];
	float w[40 * 4];
	int erased = 0;

	for (int i = 0; i < 40; i++) {
		ids[i] = 1 + rnd_below(&steps.rng, STEPS_IDS);
		erased += steps.live[ids[i]];
		steps.live[ids[i]] = 0;
	}
	/* Repeats in ids are erased once. */
	CU_ASSERT_EQUAL(emb_table_erase(t, ids, 40), erased);
	for (int i = 0; i < 40; i++) {
		ids[i] = steps.next++;
		steps.live[ids[i]] = 1;
	}
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, 40, w, 0, NULL), 40);
}

static void steps_between(struct emb_table *t)
{
	steps.calls++;
	steps_churn(t);
}

/* The rows a walk over [STEPS_FIRST, +STEPS_N) yields, against the live
 * set: how many are missing, yielded though not live there, or twice. */
static uint32_t steps_walk_errors(struct emb_table *t)
{
	uint8_t *seen = xcalloc(2 * STEPS_IDS, 1);
	uint64_t ids[256];
	float rows[256 * 4];
	struct emb_table_iter *it;
	uint32_t bad = 0;
	int got;

	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_slots(it, STEPS_FIRST, STEPS_N),
			      0);
	while ((got = emb_table_iter_next(it, ids, rows, NULL, 256)) > 0)
		for (int i = 0; i < got; i++)
			if (ids[i] >= 2 * STEPS_IDS || seen[ids[i]]++)
				bad++;
	CU_ASSERT_EQUAL(got, 0);
	emb_table_iter_destroy(it);
	for (uint64_t id = 1; id < 2 * STEPS_IDS; id++)
		bad += seen[id] != (steps.live[id] &&
				    emb_id_slot(id) - STEPS_FIRST < STEPS_N);
	free(seen);
	return bad;
}

/*
 * A table of 2 shards with the rows 1..STEPS_IDS, its slot index made
 * first when index_first (emb_table_slot_index(), while it is empty),
 * else left for the first walk by slot.
 */
static struct emb_table *steps_table(uint64_t rng, bool index_first)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(STEPS_IDS, sizeof(*ids));
	float *w = xcalloc((size_t)STEPS_IDS * 4, sizeof(float));
	struct emb_table *t;

	o.dim = 4;
	o.nshards = 2; /* 15,000 records a shard: 15 steps each */
	t = table_new(&o);
	steps = (struct steps_state){.live = xcalloc(2 * STEPS_IDS, 1),
				     .next = STEPS_IDS + 1,
				     .rng = rng};
	if (index_first) {
		CU_ASSERT_EQUAL(emb_table_slot_index(t), 0);
		/* Again: nothing to do. */
		CU_ASSERT_EQUAL(emb_table_slot_index(t), 0);
	}
	for (uint32_t i = 0; i < STEPS_IDS; i++) {
		ids[i] = i + 1;
		steps.live[i + 1] = 1;
	}
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, STEPS_IDS, w, 0, NULL),
			STEPS_IDS);
	free(ids);
	free(w);
	return t;
}

static void steps_table_end(struct emb_table *t)
{
	emb__slot_index_between = NULL;
	emb_table_destroy(t);
	free(steps.live);
}

static void test_slot_index_in_steps(void)
{
	struct emb_table *t = steps_table(3, false);

	/* Free records before the build too. */
	steps_churn(t);
	emb__slot_index_between = steps_between;
	CU_ASSERT_EQUAL(steps_walk_errors(t), 0);
	CU_ASSERT(steps.calls >= 3);
	/* Built: later walks build nothing, and rows made since are found. */
	steps.calls = 0;
	steps_churn(t);
	steps_churn(t);
	CU_ASSERT_EQUAL(steps_walk_errors(t), 0);
	CU_ASSERT_EQUAL(steps.calls, 0);
	steps_table_end(t);
}

/*
 * A server in a map makes each table's slot index as it creates it
 * (emb_table_slot_index()), so that no move waits for the pass over the
 * records: made empty, the index is kept by every row made, erased and
 * made again after, and a walk by slot then builds nothing and yields
 * exactly the live rows of its slots.
 */
static void test_slot_index_made_empty(void)
{
	struct emb_table *t;

	CU_ASSERT_EQUAL(emb_table_slot_index(NULL), EMB_EBADARG);
	t = steps_table(5, true);
	for (int i = 0; i < 20; i++)
		steps_churn(t);
	emb__slot_index_between = steps_between;
	CU_ASSERT_EQUAL(steps_walk_errors(t), 0);
	CU_ASSERT_EQUAL(steps.calls, 0);
	steps_table_end(t);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"NaN or Inf in a push or assign changes no row",
	     test_nonfinite_refused},
	    {"a walk over any set of slots yields exactly its live rows",
	     test_slot_walks},
	    {"reports the options it was created with",
	     test_create_reports_opts},
	    {"accepts options at their limits", test_create_edges},
	    {"rejects each bad option and sets nothing", test_create_rejects},
	    {"rejects NULL buffers and changes no row", test_null_buffers},
	    {"pull creates rows from seed and id", test_pull_initializes},
	    {"created rows are bit-identical to the reference generator",
	     test_created_rows_match_reference},
	    {"no-create pull reports misses and creates nothing",
	     test_pull_nocreate},
	    {"a missing id repeated in one pull becomes one row",
	     test_pull_duplicate_missing},
	    {"repeats far apart in a large batch become one row",
	     test_pull_duplicate_missing_far},
	    {"ids 0 and UINT64_MAX are ordinary ids", test_extreme_ids},
	    {"erase returns how many were present", test_erase_counts},
	    {"remote-readable rows are sealed by every writer, broken when "
	     "freed or dropped",
	     test_remote_read_seals},
	    {"dims 1 to 4096 round trip with and without state",
	     test_round_trip_dims},
	    {"assign of a duplicated id keeps the last",
	     test_assign_duplicates_last_wins},
	    {"push applies each optimizer like emb_optim_apply",
	     test_push_each_optimizer},
	    {"push sums duplicate ids before one update",
	     test_push_sums_duplicates},
	    {"a push across index growths applies each row once",
	     test_push_pipelined_growth},
	    {"push of repeated ids equals the summed push, each optimizer",
	     test_push_repeats_each_optimizer},
	    {"rowwise_adagrad rows are dim + 1 floats, pushes apply it",
	     test_rowwise_adagrad_rows},
	    {"push creates a missing row first", test_push_creates},
	    {"evicts rows idle too long", test_evict_by_age},
	    {"evicts rows accessed too rarely", test_evict_by_count},
	    {"evicts on either limit", test_evict_either_limit},
	    {"evicts by meta set through assign", test_evict_assigned_meta},
	    {"stats count operations", test_stats_counters},
	    {"bytes per row stay within budget", test_bytes_per_row},
	    {"memory limit refuses new rows and serves old ones",
	     test_mem_limit},
	    {"tables sharing a budget compete for it", test_shared_budget},
	    {"access counts saturate", test_count_saturates},
	    {"pulls record accesses only under an eviction policy",
	     test_pull_meta_only_under_eviction},
	    {"iterator returns each row once with state and meta",
	     test_iterator_full_rows},
	    {"a move's walks: the rows of a slot range, and those written "
	     "since its tracking began",
	     test_track_moves},
	    {"the first walk by slot builds its index in steps, rows coming "
	     "and going between them",
	     test_slot_index_in_steps},
	    {"a slot index made empty is kept by the rows made, and no walk "
	     "builds it again",
	     test_slot_index_made_empty},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/table", cases);
}
