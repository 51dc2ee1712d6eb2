/*
 * tests/worker/test_many.c - emb_client_pull_many() and
 * emb_client_push_many() against real servers in this process: every
 * entry ends exactly as the single-table call would (checked bit for bit
 * against local tables fed the same operations), over tables of several
 * dims on two servers; argument errors name the entry; one entry's server
 * error is the call's and leaves the others applied.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "store/store.h"
#include "worker/client_int.h"

enum { NT = 4, N = 300, SPACE = 2000, ROUNDS = 12 };

static const uint32_t dims[NT] = {4, 16, 33, 8};

struct cluster {
	struct emb_server *s[2];
	struct emb_client *c;
	struct emb_client_table *t[NT];
	struct emb_table *ref[NT];
};

static void cluster_start(struct cluster *k)
{
	struct emb_server_opts so = nt_server_opts();
	uint16_t ports[2];
	char addr[128], name[32];

	for (int i = 0; i < 2; i++) {
		k->s[i] = nt_server_start(&so);
		ports[i] = emb_server_port(k->s[i]);
	}
	nt_addr_list(addr, sizeof(addr), ports, 2);
	k->c = nt_client(addr, 0);
	for (int i = 0; i < NT; i++) {
		struct emb_table_spec sp;

		snprintf(name, sizeof(name), "many%d", i);
		sp = nt_spec(name, dims[i], 40 + i);
		sp.optim.kind = i % 2 ? EMB_OPTIM_ADAGRAD : EMB_OPTIM_SGD;
		sp.optim.lr = 0.25f;
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_create(k->c, &sp, &k->t[i]), 0);
		k->ref[i] = nt_ref_table(&sp);
	}
}

static void cluster_stop(struct cluster *k)
{
	for (int i = 0; i < NT; i++) {
		emb_client_table_close(k->t[i]);
		emb_table_destroy(k->ref[i]);
	}
	emb_client_destroy(k->c);
	for (int i = 0; i < 2; i++)
		emb_server_destroy(k->s[i]);
}

/* Pulls and pushes over all tables at once match per-table references. */
static void test_same_as_single(void)
{
	struct emb_table_batch b[NT];
	struct cluster k;
	uint64_t rng = 11, *ids[NT];
	float *rows[NT], *want[NT];
	uint8_t *found[NT], *fwant[NT];
	int rc;

	cluster_start(&k);
	for (int i = 0; i < NT; i++) {
		ids[i] = calloc(N, sizeof(uint64_t));
		rows[i] = calloc((size_t)N * dims[i], sizeof(float));
		want[i] = calloc((size_t)N * dims[i], sizeof(float));
		found[i] = calloc(N, 1);
		fwant[i] = calloc(N, 1);
		CU_ASSERT_FATAL(ids[i] && rows[i] && want[i] && found[i] &&
				fwant[i]);
	}
	for (uint32_t r = 0; r < ROUNDS; r++) {
		bool push = r % 3 == 1, nocreate = r % 3 == 2;

		for (int i = 0; i < NT; i++) {
			/* Entry 3 is empty every fourth round. */
			uint32_t n = i == 3 && r % 4 == 0 ? 0 : N - 17 * i;

			for (uint32_t j = 0; j < n; j++)
				ids[i][j] = emb_splitmix64(&rng) % SPACE * 0x10001ull;
			b[i] = EMB_SIZED(struct emb_table_batch);
			b[i].table = k.t[i];
			b[i].n = n;
			b[i].ids = ids[i];
			b[i].rows = rows[i];
			b[i].found = found[i];
			if (push)
				for (uint32_t j = 0; j < n * dims[i]; j++)
					rows[i][j] = nt_dyadic(&rng);
		}
		if (push) {
			CU_ASSERT_EQUAL(emb_client_push_many(k.c, b, NT, r, 0),
					0);
			for (int i = 0; i < NT; i++)
				CU_ASSERT_EQUAL(emb_table_push(k.ref[i], ids[i],
							       b[i].n, rows[i]),
						0);
			continue;
		}
		rc = emb_client_pull_many(k.c, b, NT,
					  nocreate ? EMB_CLIENT_NOCREATE : 0);
		if (rc) {
			char msg[512];

			emb_last_error(msg, sizeof(msg));
			fprintf(stderr, "pull_many: %s: %s\n", emb_err_name(rc),
				msg);
		}
		CU_ASSERT_EQUAL(rc, 0);
		for (int i = 0; i < NT; i++) {
			CU_ASSERT(
			    emb_table_pull(k.ref[i], ids[i], b[i].n, want[i],
					   nocreate ? EMB_PULL_NOCREATE : 0,
					   fwant[i]) >= 0);
			CU_ASSERT_EQUAL(memcmp(rows[i], want[i],
					       (size_t)b[i].n * dims[i] * 4),
					0);
			if (nocreate)
				CU_ASSERT_EQUAL(
				    memcmp(found[i], fwant[i], b[i].n), 0);
		}
	}
	/* The same table twice in one call acts as two calls. */
	b[1] = b[0];
	CU_ASSERT_EQUAL(emb_client_push_many(k.c, b, 2, 99, 0), 0);
	CU_ASSERT_EQUAL(emb_table_push(k.ref[0], ids[0], b[0].n, rows[0]), 0);
	CU_ASSERT_EQUAL(emb_table_push(k.ref[0], ids[0], b[0].n, rows[0]), 0);
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(k.t[0], ids[0], b[0].n, rows[0], 0, NULL), 0);
	CU_ASSERT(emb_table_pull(k.ref[0], ids[0], b[0].n, want[0], 0, NULL) >=
		  0);
	CU_ASSERT_EQUAL(memcmp(rows[0], want[0], (size_t)b[0].n * dims[0] * 4),
			0);
	/* No entries: nothing to do. */
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, NULL, 0, 0), 0);
	for (int i = 0; i < NT; i++) {
		free(ids[i]);
		free(rows[i]);
		free(want[i]);
		free(found[i]);
		free(fwant[i]);
	}
	cluster_stop(&k);
}

static uint64_t requests(struct emb_client *c)
{
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);

	CU_ASSERT_EQUAL(emb_client_stats(c, &st), 0);
	return st.requests;
}

/*
 * A pull_many of every table sends one PULL_MANY per server (the servers
 * offer it), one PULL per table to a server that does not offer it, and a
 * WITH_STATE one a PULL per table and server; all give what the single
 * pulls give.
 */
static void test_one_request_per_server(void)
{
	struct emb_table_batch b[NT];
	struct cluster k;
	uint64_t ids[64], before;
	float *rows[NT], *want[NT];

	cluster_start(&k);
	for (uint32_t j = 0; j < 64; j++)
		ids[j] = j * 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < NT; i++) {
		rows[i] = calloc((size_t)64 * 3 * dims[i] + 1, sizeof(float));
		want[i] = calloc((size_t)64 * 3 * dims[i] + 1, sizeof(float));
		CU_ASSERT_FATAL(rows[i] && want[i]);
		b[i] = EMB_SIZED(struct emb_table_batch);
		b[i].table = k.t[i];
		b[i].ids = ids;
		b[i].n = 64;
		b[i].rows = rows[i];
	}
	/* Both servers hold some of the 64 ids. */
	CU_ASSERT(emb_client_server_of(k.c, ids[0]) !=
		      emb_client_server_of(k.c, ids[1]) ||
		  emb_client_server_of(k.c, ids[0]) !=
		      emb_client_server_of(k.c, ids[2]));
	before = requests(k.c);
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, NT, 0), 0);
	CU_ASSERT_EQUAL(requests(k.c) - before, 2);
	for (int i = 0; i < NT; i++) {
		CU_ASSERT_EQUAL(
		    emb_client_table_pull(k.t[i], ids, 64, want[i], 0, NULL),
		    0);
		CU_ASSERT_EQUAL(memcmp(rows[i], want[i], 64 * dims[i] * 4), 0);
	}
	/* A server whose HELLO did not offer PULL_MANY (an older release)
	 * gets one PULL per table. Set before the call posts its task. */
	k.c->srv[1].pull_many = false;
	before = requests(k.c);
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, NT, 0), 0);
	CU_ASSERT_EQUAL(requests(k.c) - before, 1 + NT);
	for (int i = 0; i < NT; i++)
		CU_ASSERT_EQUAL(memcmp(rows[i], want[i], 64 * dims[i] * 4), 0);
	before = requests(k.c);
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, NT, EMB_CLIENT_WITH_STATE),
			0);
	CU_ASSERT_EQUAL(requests(k.c) - before, 2 * NT);
	for (int i = 0; i < NT; i++) {
		uint32_t rf = emb_client_table_row_floats(k.t[i]);

		CU_ASSERT_EQUAL(emb_client_table_pull(k.t[i], ids, 64, want[i],
						      EMB_CLIENT_WITH_STATE,
						      NULL),
				0);
		CU_ASSERT_EQUAL(memcmp(rows[i], want[i], 64 * rf * 4), 0);
		free(rows[i]);
		free(want[i]);
	}
	cluster_stop(&k);
}

/*
 * A push_many of every table sends one PUSH_MANY per server (the servers
 * offer it), one PUSH per table to a server that does not offer it; the
 * rows end as per-table pushes leave them, bit for bit.
 */
static void test_push_one_request_per_server(void)
{
	struct emb_table_batch b[NT];
	struct cluster k;
	uint64_t ids[64], before, rng = 5;
	float *g[NT], *got[NT], *want[NT];

	cluster_start(&k);
	for (uint32_t j = 0; j < 64; j++)
		ids[j] = j * 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < NT; i++) {
		g[i] = calloc((size_t)64 * dims[i], sizeof(float));
		got[i] = calloc((size_t)64 * dims[i], sizeof(float));
		want[i] = calloc((size_t)64 * dims[i], sizeof(float));
		CU_ASSERT_FATAL(g[i] && got[i] && want[i]);
		b[i] = EMB_SIZED(struct emb_table_batch);
		b[i].table = k.t[i];
		b[i].ids = ids;
		b[i].n = 64;
		b[i].rows = g[i];
	}
	for (int r = 0; r < 2; r++) {
		/* Round 1: a server whose HELLO did not offer PUSH_MANY (an
		 * older release) gets one PUSH per table. Set before the
		 * call posts its task. */
		if (r == 1)
			k.c->srv[1].push_many = false;
		for (int i = 0; i < NT; i++)
			for (uint32_t j = 0; j < 64 * dims[i]; j++)
				g[i][j] = nt_dyadic(&rng);
		before = requests(k.c);
		CU_ASSERT_EQUAL(emb_client_push_many(k.c, b, NT, r, 0), 0);
		CU_ASSERT_EQUAL(requests(k.c) - before, r ? 1 + NT : 2);
		for (int i = 0; i < NT; i++)
			CU_ASSERT_EQUAL(emb_table_push(k.ref[i], ids, 64, g[i]),
					0);
	}
	for (int i = 0; i < NT; i++) {
		CU_ASSERT_EQUAL(
		    emb_client_table_pull(k.t[i], ids, 64, got[i], 0, NULL), 0);
		CU_ASSERT(emb_table_pull(k.ref[i], ids, 64, want[i], 0, NULL) >=
			  0);
		CU_ASSERT_EQUAL(memcmp(got[i], want[i], 64 * dims[i] * 4), 0);
		free(g[i]);
		free(got[i]);
		free(want[i]);
	}
	cluster_stop(&k);
}

/*
 * A caller built against a longer emb_table_batch: the array's stride is
 * its struct_size, and a zero tail is accepted.
 */
static void test_stride(void)
{
	struct longer {
		struct emb_table_batch b;
		uint64_t future;
	} e[2];
	struct cluster k;
	uint64_t ids[2][3] = {{1, 2, 3}, {4, 5, 6}};
	float rows[2][3 * 16], want[3 * 16];

	cluster_start(&k);
	memset(e, 0, sizeof(e));
	for (int i = 0; i < 2; i++) {
		e[i].b.struct_size = sizeof(e[i]);
		e[i].b.table = k.t[i];
		e[i].b.n = 3;
		e[i].b.ids = ids[i];
		e[i].b.rows = rows[i];
	}
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, &e[0].b, 2, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(k.t[1], ids[1], 3, want, 0, NULL),
			0);
	CU_ASSERT_EQUAL(memcmp(rows[1], want, sizeof(want)), 0);
	e[1].future = 1; /* a field this library does not know */
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, &e[0].b, 2, 0), -E2BIG);
	cluster_stop(&k);
}

static void expect_msg(const char *part)
{
	char msg[512];

	emb_last_error(msg, sizeof(msg));
	if (!strstr(msg, part))
		fprintf(stderr, "last error \"%s\" lacks \"%s\"\n", msg, part);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, part));
}

static void test_errors(void)
{
	struct emb_table_batch b[2];
	struct cluster k, other;
	uint64_t ids[2] = {7, 8};
	float g[2 * 33], g0[2 * 33], before[2 * 33], after[2 * 33];
	struct emb_client_table *gone;

	cluster_start(&k);
	cluster_start(&other);
	for (int i = 0; i < 2; i++) {
		b[i] = EMB_SIZED(struct emb_table_batch);
		b[i].n = 2;
		b[i].ids = ids;
		b[i].rows = g;
	}
	b[0].table = k.t[2];
	b[1].table = other.t[2];
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, 2, 0), EMB_EBADARG);
	expect_msg("batch 1: the table belongs to another client");
	b[1].table = NULL;
	CU_ASSERT_EQUAL(emb_client_push_many(k.c, b, 2, 0, 0), EMB_EBADARG);
	expect_msg("batch 1: table is NULL");
	b[1].table = k.t[2];
	b[1].struct_size = 8;
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, 2, 0), EMB_EBADARG);
	expect_msg("batch 1: struct_size 8");
	b[1].struct_size = sizeof(b[1]);
	CU_ASSERT_EQUAL(
	    emb_client_pull_many(k.c, b, EMB_CLIENT_MANY_MAX + 1, 0),
	    EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, 2, 0x80), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_client_pull_many(NULL, b, 2, 0), EMB_EBADARG);

	/* A NaN in entry 1 fails the call; entry 0's push is applied. */
	b[0].table = k.t[2];
	b[1].table = k.t[1];
	CU_ASSERT_EQUAL(emb_client_table_pull(k.t[2], ids, 2, before, 0, NULL),
			0);
	for (int i = 0; i < 2 * 33; i++) {
		g[i] = 1.0f;
		g0[i] = 1.0f;
	}
	g[3] = NAN;
	b[0].rows = g0;
	b[1].rows = g;
	CU_ASSERT_EQUAL(emb_client_push_many(k.c, b, 2, 0, 0), EMB_ENONFINITE);
	expect_msg("is NaN or infinite");
	CU_ASSERT_EQUAL(emb_client_table_pull(k.t[2], ids, 2, after, 0, NULL),
			0);
	for (int i = 0; i < 2 * 33; i++)
		CU_ASSERT_EQUAL(after[i], before[i] - 0.25f);

	/* A table dropped on the servers: its entry's error is the call's. */
	CU_ASSERT_EQUAL(emb_client_table_open(k.c, "many3", &gone), 0);
	CU_ASSERT_EQUAL(emb_client_table_drop(gone), 0);
	b[0].table = k.t[0];
	b[0].rows = g;
	b[1].table = gone;
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, 2, 0), EMB_ENOTABLE);
	expect_msg("table many3: ");
	b[0].table = gone;
	b[1].table = k.t[0];
	CU_ASSERT_EQUAL(emb_client_pull_many(k.c, b, 2, 0), EMB_ENOTABLE);
	emb_client_table_close(gone);
	cluster_stop(&other);
	cluster_stop(&k);
}

static const struct emb_test_case cases[] = {
    {"pull_many and push_many end as per-table calls, tables of 4 dims",
     test_same_as_single},
    {"pull_many sends one PULL_MANY per server that offers it, else PULLs",
     test_one_request_per_server},
    {"push_many sends one PUSH_MANY per server that offers it, else PUSHes",
     test_push_one_request_per_server},
    {"the entry array's stride is its struct_size; unknown tail refused",
     test_stride},
    {"bad entries are named; one entry's error fails the call alone",
     test_errors},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "worker", cases);
}
