/*
 * tests/worker/test_client.c - the client library against real servers run
 * in this process on ephemeral loopback ports: results checked bit for bit
 * against a local emb_table fed the same operations (rows are a function of
 * (seed, id) and the updates applied), routing over three servers, table
 * admin, concurrent clients, deep pipelining, auth and the memory limit.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "harness.h"
#include "common/hash.h"
#include "netutil.h"
#include "server/server.h"
#include "store/store.h"

/* A local table with the spec's configuration: the reference. */
static struct emb_client_table *make_table(struct emb_client *c,
					   const struct emb_table_spec *sp)
{
	struct emb_client_table *t = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, sp, &t), 0);
	return t;
}

/* Pulls ids through the client and from ref; the rows must be identical. */
static void check_same(struct emb_client_table *t, struct emb_table *ref,
		       const uint64_t *ids, uint32_t n, uint32_t flags)
{
	uint32_t dim = emb_client_table_dim(t);
	float *a = calloc((size_t)n * dim, sizeof(float));
	float *b = calloc((size_t)n * dim, sizeof(float));
	uint8_t *fa = calloc(n, 1), *fb = calloc(n, 1);

	CU_ASSERT_FATAL(a && b && fa && fb);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, n, a, flags, fa), 0);
	CU_ASSERT(emb_table_pull(ref, ids, n, b,
				 flags & EMB_CLIENT_NOCREATE ? EMB_PULL_NOCREATE
							     : 0,
				 fb) >= 0);
	CU_ASSERT_EQUAL(memcmp(a, b, (size_t)n * dim * sizeof(float)), 0);
	if (flags & EMB_CLIENT_NOCREATE)
		CU_ASSERT_EQUAL(memcmp(fa, fb, n), 0);
	free(fa);
	free(fb);
	free(a);
	free(b);
}

/* ---- round trips against the store engine ---- */

static void run_against_store(bool with_state)
{
	enum { DIM = 16, N = 512, SPACE = 3000, ROUNDS = 24 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("roundtrip", DIM, 42);
	struct emb_server *s = nt_server_start(&so);
	uint16_t port = emb_server_port(s);
	char addr[64];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_table *ref;
	uint32_t rf;
	uint64_t rng = 7, ids[N], all[SPACE];
	float *buf;

	sp.optim.kind = EMB_OPTIM_ADAGRAD;
	sp.optim.lr = 0.1f;
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	t = make_table(c, &sp);
	ref = nt_ref_table(&sp);
	rf = emb_client_table_row_floats(t);
	CU_ASSERT_EQUAL(rf, emb_table_row_floats(ref));
	buf = calloc((size_t)N * rf, sizeof(float));
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);

	for (uint32_t r = 0; r < ROUNDS; r++) {
		/* Ids drawn with replacement: batches carry duplicates. */
		for (uint32_t i = 0; i < N; i++)
			ids[i] = emb_splitmix64(&rng) % SPACE * 0x10001ull;
		switch (r % 4) {
		case 0:
			check_same(t, ref, ids, N, 0);
			break;
		case 1:
			for (uint32_t i = 0; i < N * DIM; i++)
				buf[i] = nt_dyadic(&rng);
			CU_ASSERT_EQUAL(emb_client_table_push(t, ids, N, buf,
							      r, 0), 0);
			CU_ASSERT_EQUAL(emb_table_push(ref, ids, N, buf), 0);
			break;
		case 2: {
			uint32_t stride = with_state ? rf : DIM;

			for (uint32_t i = 0; i < N * stride; i++)
				buf[i] = nt_dyadic(&rng) + (i % stride >= DIM);
			CU_ASSERT_EQUAL(emb_client_table_assign(t, ids, N / 4,
						buf, with_state), 0);
			CU_ASSERT_EQUAL(emb_table_assign(ref, ids, N / 4, buf,
							 with_state, NULL), 0);
			break;
		}
		case 3: {
			uint64_t erased = UINT64_MAX;
			int want = emb_table_erase(ref, ids, N / 8);

			CU_ASSERT(want >= 0);
			CU_ASSERT_EQUAL(emb_client_table_erase(t, ids, N / 8,
							       &erased), 0);
			CU_ASSERT_EQUAL(erased, (uint64_t)want);
			break;
		}
		}
	}
	/* Every id, without creating: same rows, same found[]. */
	for (uint32_t i = 0; i < SPACE; i++)
		all[i] = i * 0x10001ull;
	check_same(t, ref, all, SPACE, EMB_CLIENT_NOCREATE);

	free(buf);
	emb_table_destroy(ref);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

static void test_roundtrip(void)
{
	run_against_store(false);
}

static void test_roundtrip_state(void)
{
	run_against_store(true);
}

static void test_nocreate(void)
{
	enum { DIM = 8 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("nocreate", DIM, 5);
	struct emb_server *s = nt_server_start(&so);
	uint16_t port = emb_server_port(s);
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t ids[200];
	float have[100 * DIM], got[200 * DIM];
	uint8_t found[200];
	char addr[64];

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	t = make_table(c, &sp);
	for (uint32_t i = 0; i < 200; i++)
		ids[i] = 1000 + i;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 100, have, 0, NULL), 0);

	memset(found, 0xee, sizeof(found));
	memset(got, 0xff, sizeof(got));
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids + 50, 150, got,
					      EMB_CLIENT_NOCREATE, found), 0);
	for (uint32_t i = 0; i < 150; i++) {
		bool present = 50 + i < 100;

		CU_ASSERT_EQUAL(found[i], present);
		if (present) {
			CU_ASSERT_EQUAL(memcmp(got + i * DIM,
					       have + (50 + i) * DIM,
					       DIM * sizeof(float)), 0);
		} else {
			for (uint32_t j = 0; j < DIM; j++)
				CU_ASSERT_EQUAL(got[i * DIM + j], 0.0f);
		}
	}
	/* found may be NULL, and nothing was created either way. */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids + 100, 100, got,
					      EMB_CLIENT_NOCREATE, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, 100);
	CU_ASSERT_EQUAL(st.servers, 1);

	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

static void test_duplicates(void)
{
	enum { DIM = 4 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("dups", DIM, 1);
	struct emb_server *s = nt_server_start(&so);
	uint16_t port = emb_server_port(s);
	const uint64_t pull_ids[5] = {7, 7, 3, 7, 3};
	const uint64_t push_ids[4] = {7, 7, 3, 7};
	const float want[5] = {-7, -7, -3, -7, -3};
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_table *t;
	struct emb_client_stats cs = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	float grads[4 * DIM], rows[5 * DIM];
	char addr[64];

	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	t = make_table(c, &sp);
	memset(rows, 0xff, sizeof(rows));
	CU_ASSERT_EQUAL(emb_client_table_pull(t, pull_ids, 5, rows, 0, NULL),
			0);
	for (uint32_t i = 0; i < 5 * DIM; i++)
		CU_ASSERT_EQUAL(rows[i], 0.0f);
	for (uint32_t i = 0; i < 4; i++)
		for (uint32_t j = 0; j < DIM; j++)
			grads[i * DIM + j] = (float)(i + 1);
	/* id 7 gets 1 + 2 + 4 in one update, id 3 gets 3. */
	CU_ASSERT_EQUAL(emb_client_table_push(t, push_ids, 4, grads, 1, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, pull_ids, 5, rows, 0, NULL),
			0);
	for (uint32_t i = 0; i < 5; i++)
		for (uint32_t j = 0; j < DIM; j++)
			CU_ASSERT_EQUAL(rows[i * DIM + j], want[i]);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, 2);
	CU_ASSERT_EQUAL(st.rows_pushed, 2);
	emb_client_stats(c, &cs);
	CU_ASSERT_EQUAL(cs.ids_in, 5 + 4 + 5);
	CU_ASSERT_EQUAL(cs.ids_sent, 2 + 2 + 2);

	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* ---- three servers ---- */

static void test_three_servers(void)
{
	enum { DIM = 8, N = 3000, NS = 3 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("spread", DIM, 99);
	struct emb_server *s[NS];
	struct emb_client *c, *c2, *one[NS];
	struct emb_client_table *t, *t2, *t1;
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_server_stats ss;
	uint16_t ports[NS];
	uint64_t *ids = malloc(N * sizeof(*ids));
	float *rows = malloc((size_t)N * DIM * sizeof(float));
	float *rows1 = malloc((size_t)N * DIM * sizeof(float));
	uint8_t *found = malloc(N);
	uint32_t count[NS] = {0};
	char addr[128];

	CU_ASSERT_FATAL(ids && rows && rows1 && found);
	for (uint32_t k = 0; k < NS; k++) {
		s[k] = nt_server_start(&so);
		ports[k] = emb_server_port(s[k]);
	}
	nt_addr_list(addr, sizeof(addr), ports, NS);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL(emb_client_nservers(c), NS);
	t = make_table(c, &sp);
	for (uint32_t i = 0; i < N; i++) {
		ids[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
		count[emb_client_server_of(c, ids[i])]++;
	}
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, N, rows, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, N);
	CU_ASSERT_EQUAL(st.servers, NS);

	/* Each server alone: it has the table, exactly the rows routed to it,
	 * and the same values the cluster returned. */
	for (uint32_t k = 0; k < NS; k++) {
		nt_addr_list(addr, sizeof(addr), &ports[k], 1);
		one[k] = nt_client(addr, 0);
		CU_ASSERT(count[k] > 0);
		CU_ASSERT_EQUAL_FATAL(emb_client_table_open(one[k], "spread",
							    &t1), 0);
		CU_ASSERT_EQUAL(emb_client_table_stats(t1, &st), 0);
		CU_ASSERT_EQUAL(st.rows, count[k]);
		CU_ASSERT_EQUAL(emb_client_table_pull(t1, ids, N, rows1,
						      EMB_CLIENT_NOCREATE,
						      found), 0);
		for (uint32_t i = 0; i < N; i++) {
			bool mine = emb_client_server_of(c, ids[i]) == k;

			CU_ASSERT_EQUAL(found[i], mine);
			if (mine)
				CU_ASSERT_EQUAL(memcmp(rows1 + (size_t)i * DIM,
						       rows + (size_t)i * DIM,
						       DIM * sizeof(float)), 0);
		}
		emb_client_table_close(t1);
	}

	/* Another client opens the table by name and sees the same rows. */
	nt_addr_list(addr, sizeof(addr), ports, NS);
	c2 = nt_client(addr, 0);
	CU_ASSERT_EQUAL(emb_client_table_open(c2, "nosuch", &t2),
			EMB_ENOTABLE);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c2, "spread", &t2), 0);
	CU_ASSERT_EQUAL(emb_client_table_dim(t2), DIM);
	CU_ASSERT_EQUAL(emb_client_table_spec(t2)->seed, 99);
	CU_ASSERT_STRING_EQUAL(emb_client_table_spec(t2)->name, "spread");
	CU_ASSERT_EQUAL(emb_client_table_pull(t2, ids, N, rows1,
					      EMB_CLIENT_NOCREATE, found), 0);
	CU_ASSERT_EQUAL(memcmp(rows, rows1, (size_t)N * DIM * sizeof(float)),
			0);
	/* Creating it again with the same spec opens it; another spec is
	 * refused. */
	emb_client_table_close(t2);
	CU_ASSERT_EQUAL(emb_client_table_create(c2, &sp, &t2), 0);
	emb_client_table_close(t2);
	sp.seed = 100;
	CU_ASSERT_EQUAL(emb_client_table_create(c2, &sp, &t2),
			EMB_ETABLEEXISTS);

	/* Drop: gone from every server, the old handle fails cleanly. */
	CU_ASSERT_EQUAL(emb_client_table_drop(t), 0);
	for (uint32_t k = 0; k < NS; k++) {
		emb_server_stats(s[k], &ss);
		CU_ASSERT_EQUAL(ss.tables, 0);
	}
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 16, rows, 0, NULL),
			EMB_ENOTABLE);
	CU_ASSERT_EQUAL(emb_client_table_open(c2, "spread", &t2),
			EMB_ENOTABLE);
	emb_client_table_close(t);

	emb_client_destroy(c2);
	for (uint32_t k = 0; k < NS; k++)
		emb_client_destroy(one[k]);
	emb_client_destroy(c);
	for (uint32_t k = 0; k < NS; k++)
		emb_server_destroy(s[k]);
	free(found);
	free(rows1);
	free(rows);
	free(ids);
}

/* ---- concurrent clients ---- */

enum { CC_THREADS = 4, CC_ROUNDS = 30, CC_IDS = 512, CC_DUPS = 64, CC_DIM = 8 };

struct cc_arg {
	const char *addr;	/* servers */
	uint32_t t;		/* thread index */
	int rc;			/* first failure */
};

static void *cc_main(void *arg)
{
	struct cc_arg *a = arg;
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client_table *t = NULL;
	struct emb_client *c = NULL;
	uint64_t ids[CC_IDS + CC_DUPS];
	static _Thread_local float g[(CC_IDS + CC_DUPS) * CC_DIM];
	static _Thread_local float rows[CC_IDS * CC_DIM];
	int rc;

	o.servers = a->addr;
	o.timeout_ms = 10000;
	rc = emb_client_create(&o, &c);
	if (!rc)
		rc = emb_client_table_open(c, "sums", &t);
	/* Every thread pushes every id, each round, and ids < CC_DUPS twice
	 * per batch: integer gradients with lr 1 give exact sums. */
	for (uint32_t i = 0; i < CC_IDS + CC_DUPS; i++) {
		ids[i] = i < CC_IDS ? i : i - CC_IDS;
		for (uint32_t j = 0; j < CC_DIM; j++)
			g[i * CC_DIM + j] =
				(float)((a->t + 1) * (1 + ids[i] % 3));
	}
	for (uint32_t r = 0; !rc && r < CC_ROUNDS; r++) {
		rc = emb_client_table_push(t, ids, CC_IDS + CC_DUPS, g, r,
					   a->t);
		if (!rc && r % 5 == 0)
			rc = emb_client_table_pull(t, ids, CC_IDS, rows, 0,
						   NULL);
		for (uint32_t i = 0; !rc && r % 5 == 0 && i < CC_IDS * CC_DIM;
		     i++)
			if (rows[i] > 0 || rows[i] != (float)(int)rows[i])
				rc = EMB_EINTERNAL;
	}
	a->rc = rc;
	emb_client_table_close(t);
	emb_client_destroy(c);
	return NULL;
}

static void test_concurrent_clients(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("sums", CC_DIM, 3);
	struct cc_arg args[CC_THREADS];
	pthread_t th[CC_THREADS];
	struct emb_server *s[2];
	struct emb_client_table *t;
	struct emb_client *c;
	uint16_t ports[2];
	uint64_t ids[CC_IDS];
	float rows[CC_IDS * CC_DIM];
	char addr[128];

	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	for (uint32_t k = 0; k < 2; k++) {
		s[k] = nt_server_start(&so);
		ports[k] = emb_server_port(s[k]);
	}
	nt_addr_list(addr, sizeof(addr), ports, 2);
	c = nt_client(addr, 0);
	t = make_table(c, &sp);
	for (uint32_t k = 0; k < CC_THREADS; k++) {
		args[k] = (struct cc_arg){.addr = addr, .t = k};
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[k], NULL, cc_main,
						     &args[k]), 0);
	}
	for (uint32_t k = 0; k < CC_THREADS; k++) {
		pthread_join(th[k], NULL);
		CU_ASSERT_EQUAL(args[k].rc, 0);
	}
	for (uint32_t i = 0; i < CC_IDS; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, CC_IDS, rows, 0, NULL),
			0);
	for (uint32_t i = 0; i < CC_IDS; i++) {
		/* sum over threads of (t + 1) = 10 */
		float want = -(float)(CC_ROUNDS * 10 * (1 + i % 3) *
				      (i < CC_DUPS ? 2 : 1));

		for (uint32_t j = 0; j < CC_DIM; j++)
			CU_ASSERT_EQUAL(rows[i * CC_DIM + j], want);
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (uint32_t k = 0; k < 2; k++)
		emb_server_destroy(s[k]);
}

/* ---- pipelining ---- */

static void test_pipelined(void)
{
	enum { OPS = 256, PER = 16, DIM = 8 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("pipe", DIM, 11);
	struct emb_server *s[2];
	struct emb_async *op[OPS];
	struct emb_client_table *t;
	struct emb_client_stats cs = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	uint16_t ports[2];
	uint64_t *ids = malloc(OPS * PER * sizeof(*ids));
	float *g = malloc((size_t)OPS * PER * DIM * sizeof(float));
	float *out = malloc((size_t)OPS * PER * DIM * sizeof(float));
	uint8_t *found = malloc(OPS * PER);
	char addr[128];

	CU_ASSERT_FATAL(ids && g && out && found);
	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	for (uint32_t k = 0; k < 2; k++) {
		s[k] = nt_server_start(&so);
		ports[k] = emb_server_port(s[k]);
	}
	nt_addr_list(addr, sizeof(addr), ports, 2);
	c = nt_client(addr, 0);
	t = make_table(c, &sp);
	for (uint32_t i = 0; i < OPS * PER; i++) {
		ids[i] = 50000 + i;
		for (uint32_t j = 0; j < DIM; j++)
			g[i * DIM + j] = (float)(i / PER + 1);
	}
	/* All pushes in flight at once, then all pulls. */
	for (uint32_t k = 0; k < OPS; k++)
		CU_ASSERT_EQUAL_FATAL(emb_client_table_push_async(
			t, ids + k * PER, PER, g + (size_t)k * PER * DIM, k, 0,
			&op[k]), 0);
	for (uint32_t k = 0; k < OPS; k++)
		CU_ASSERT_EQUAL(emb_async_wait(op[k]), 0);
	memset(out, 0xff, (size_t)OPS * PER * DIM * sizeof(float));
	memset(found, 0, OPS * PER);
	for (uint32_t k = 0; k < OPS; k++)
		CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(
			t, ids + k * PER, PER, out + (size_t)k * PER * DIM,
			EMB_CLIENT_NOCREATE, found + k * PER, &op[k]), 0);
	for (uint32_t k = OPS; k-- > 0;)
		CU_ASSERT_EQUAL(emb_async_wait(op[k]), 0);
	for (uint32_t i = 0; i < OPS * PER; i++) {
		CU_ASSERT_EQUAL(found[i], 1);
		for (uint32_t j = 0; j < DIM; j++)
			CU_ASSERT_EQUAL(out[i * DIM + j], -(float)(i / PER + 1));
	}
	/* A pull and a push of the same ids in flight together: the push was
	 * posted second on the same connections, so the pull sees the old
	 * values (the server holds the push back until the pull's zero-copy
	 * reply is out) and a later pull the new ones. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(t, ids, PER, out, 0,
							  NULL, &op[0]), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_push_async(t, ids, PER, g, 0, 0,
							  &op[1]), 0);
	CU_ASSERT_EQUAL(emb_async_wait(op[1]), 0);
	CU_ASSERT_EQUAL(emb_async_wait(op[0]), 0);
	CU_ASSERT_EQUAL(out[0], -1.0f);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, PER, out, 0, NULL), 0);
	CU_ASSERT_EQUAL(out[0], -2.0f);
	emb_client_stats(c, &cs);
	CU_ASSERT(cs.requests >= 2 * OPS);
	CU_ASSERT_EQUAL(cs.errors, 0);

	emb_client_table_close(t);
	emb_client_destroy(c);
	for (uint32_t k = 0; k < 2; k++)
		emb_server_destroy(s[k]);
	free(found);
	free(out);
	free(g);
	free(ids);
}

/* ---- auth ---- */

static void test_auth(void)
{
	static const uint8_t token[] = "s3cret-token";
	static const uint8_t wrong[] = "s3cret-tokem";
	struct emb_server_opts so = nt_server_opts();
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = nt_spec("authed", 4, 1);
	struct emb_client_table *t;
	struct emb_client *c = NULL;
	struct emb_server *s;
	const uint64_t id = 5;
	uint16_t port;
	float row[4];
	char addr[64];
	int fd;

	so.auth_token = token;
	so.auth_token_len = sizeof(token) - 1;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	co.servers = addr;
	co.timeout_ms = 5000;

	CU_ASSERT_EQUAL(emb_client_create(&co, &c), EMB_EAUTH);
	co.auth_token = wrong;
	co.auth_token_len = sizeof(wrong) - 1;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), EMB_EAUTH);
	co.auth_token_len = 4; /* a prefix of the right one */
	co.auth_token = token;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), EMB_EAUTH);

	/* On the wire: EMB_EAUTH, then the server hangs up. */
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL(nt_raw_hello(fd, wrong, sizeof(wrong) - 1), EMB_EAUTH);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);

	co.auth_token_len = sizeof(token) - 1;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
	t = make_table(c, &sp);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* ---- transport names ---- */

/*
 * "auto", and "tcp,rdma" as a server's EMB_TRANSPORT may say, reach a
 * TCP-only server over TCP (its HELLO offers no RDMA, device or not); a
 * name that is no transport is refused before anything connects.
 */
static void test_transport_names(void)
{
	static const char *const names[] = {"auto", "tcp,rdma", "rdma,tcp"};
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = nt_spec("names", 4, 1);
	struct emb_server_opts so = nt_server_opts();
	struct emb_client_table *t;
	struct emb_client *c = NULL;
	struct emb_server *s;
	const uint64_t id = 9;
	uint16_t port;
	float row[4];
	char addr[64];

	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	co.servers = addr;
	co.timeout_ms = 5000;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		co.transport = names[i];
		CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
		CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "tcp");
		t = make_table(c, &sp);
		CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL),
				0);
		emb_client_table_close(t);
		emb_client_destroy(c);
		c = NULL;
	}
	co.transport = "carrier-pigeon";
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), -EINVAL);
	CU_ASSERT_PTR_NULL(c);
	emb_server_destroy(s);
}

/*
 * An async pull still out when its client is destroyed: waiting for it
 * afterwards gives its status and frees its response buffer, which the
 * client's pool no longer holds (ASan sees a use after free otherwise).
 */
static void test_async_outlives_client(void)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = nt_spec("outlive", 16, 1);
	struct emb_server_opts so = nt_server_opts();
	struct emb_client_table *t;
	struct emb_async *op[2];
	struct emb_client *c = NULL;
	struct emb_server *s;
	static uint64_t ids[4096];
	static float rows[2][4096 * 16];
	uint16_t port;
	char addr[64];
	int rc;

	for (uint32_t i = 0; i < 4096; i++)
		ids[i] = i * 31u;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	co.servers = addr;
	co.timeout_ms = 5000;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
	t = make_table(c, &sp);
	for (int k = 0; k < 2; k++)
		CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(
					  t, ids, 4096, rows[k], 0, NULL, &op[k]),
				      0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int k = 0; k < 2; k++) {
		rc = emb_async_wait(op[k]);
		CU_ASSERT(rc == 0 || rc == EMB_ECLOSED);
	}
	emb_server_destroy(s);
}

/* ---- memory limit ---- */

static void test_mem_limit(void)
{
	enum { DIM = 64, BATCH = 1024, MAXB = 1024 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sa = nt_spec("big", DIM, 1);
	struct emb_table_spec sb = nt_spec("small", DIM, 2);
	struct emb_client_table *ta, *tb;
	struct emb_server_stats ss;
	struct emb_client *c;
	struct emb_server *s;
	uint64_t ids[BATCH];
	float *rows = malloc((size_t)BATCH * DIM * sizeof(float));
	float *again = malloc((size_t)BATCH * DIM * sizeof(float));
	float bref[16 * DIM], bgot[16 * DIM];
	uint8_t found[BATCH];
	uint32_t full = 0;
	uint16_t port;
	char addr[64];
	int rc = 0;

	CU_ASSERT_FATAL(rows && again);
	so.mem_limit = 16u << 20;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	ta = make_table(c, &sa);
	tb = make_table(c, &sb);
	for (uint32_t i = 0; i < 16; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_client_table_pull(tb, ids, 16, bref, 0, NULL), 0);

	/* Fill "big" until the server refuses to create rows. */
	for (uint32_t b = 0; b < MAXB; b++) {
		for (uint32_t i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)b * BATCH + i;
		rc = emb_client_table_pull(ta, ids, BATCH, rows, 0, NULL);
		if (rc) {
			full = b;
			break;
		}
	}
	CU_ASSERT_EQUAL_FATAL(rc, EMB_EMEMLIMIT);
	CU_ASSERT(full > 0);
	CU_ASSERT_EQUAL(emb_client_last_error(c, NULL, 0), EMB_EMEMLIMIT);
	emb_server_stats(s, &ss);
	CU_ASSERT(ss.mem_used <= so.mem_limit);

	/* A fresh batch of new ids still fails... */
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = (uint64_t)(MAXB + 1) * BATCH + i;
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, BATCH, rows, 0, NULL),
			EMB_EMEMLIMIT);
	/* ...but existing rows are served, pushed to, and unchanged by a
	 * failed pull. */
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, BATCH, rows, 0, NULL),
			0);
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, BATCH, again,
					      EMB_CLIENT_NOCREATE, found), 0);
	CU_ASSERT_EQUAL(memcmp(rows, again, (size_t)BATCH * DIM * 4), 0);
	for (uint32_t i = 0; i < BATCH; i++)
		CU_ASSERT_EQUAL(found[i], 1);
	CU_ASSERT_EQUAL(emb_client_table_push(ta, ids, BATCH, rows, 1, 0), 0);
	/* The other table's rows read as before. */
	for (uint32_t i = 0; i < 16; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL(emb_client_table_pull(tb, ids, 16, bgot, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(bref, bgot, sizeof(bref)), 0);
	/* Dropping the big table gives the memory back. */
	CU_ASSERT_EQUAL(emb_client_table_drop(ta), 0);
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = 1u << 30 | i;
	CU_ASSERT_EQUAL(emb_client_table_pull(tb, ids, BATCH, rows, 0, NULL),
			0);

	emb_client_table_close(ta);
	emb_client_table_close(tb);
	emb_client_destroy(c);
	emb_server_destroy(s);
	free(again);
	free(rows);
}

/*
 * NaN and Inf gradients are refused whole: the rows and their optimizer
 * state stay as they were, and the server counts the refusal. Absurd
 * optimizer and initializer parameters are refused at create.
 */
static void test_nonfinite_refused(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("nan_t", 4, 1);
	struct emb_client_table *t, *t2;
	struct emb_server_stats ss;
	struct emb_server *s;
	struct emb_client *c;
	uint64_t ids[2] = {1, 2};
	float g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, before[8], after[8];
	char addr[64];
	uint16_t port;

	sp.optim.kind = EMB_OPTIM_ADAGRAD;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, before, 0, NULL), 0);
	g[5] = NAN;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 0, 0),
			EMB_ENONFINITE);
	g[5] = INFINITY;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 0, 0),
			EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_client_table_assign(t, ids, 2, g, false),
			EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, after, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(before, after, sizeof(before)), 0);
	/* A finite push afterwards works: the state was not poisoned. */
	g[5] = 1.0f;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 0, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, after, 0, NULL), 0);
	for (int i = 0; i < 8; i++)
		CU_ASSERT(isfinite(after[i]) && after[i] < before[i]);
	emb_server_stats(s, &ss);
	CU_ASSERT_EQUAL(ss.nonfinite, 3);

	sp = nt_spec("absurd", 4, 1);
	sp.init.kind = EMB_INIT_CONSTANT;
	sp.init.a = 3e38f;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_EBADINIT);
	sp = nt_spec("absurd", 4, 1);
	sp.optim.lr = 1e30f;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_EBADOPTIM);
	sp = nt_spec("absurd", 4, 1);
	sp.optim.kind = EMB_OPTIM_ADAM;
	sp.optim.eps = 1e20f;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_EBADOPTIM);
	/* A tier mode past "on", or the padding beside it set. */
	sp = nt_spec("absurd", 4, 1);
	sp.tier = EMB_TIER_MODE_COUNT;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_EBADARG);
	sp = nt_spec("absurd", 4, 1);
	sp._pad1 = 1;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_EBADARG);
	/* "on" on a server without a tier: refused by the server. */
	sp = nt_spec("absurd", 4, 1);
	sp.tier = EMB_TIER_ON;
	CU_ASSERT_EQUAL(emb_client_table_create(c, &sp, &t2), EMB_ENOTIER);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* A synchronous table refuses a NaN part before holding it for the step. */
static void test_nonfinite_refused_sync(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("nan_sync", 4, 1);
	struct emb_client_table *t;
	struct emb_server_stats ss;
	struct emb_server *s;
	struct emb_client *c;
	uint64_t ids[2] = {1, 2};
	float g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, before[8], after[8];
	char addr[64];
	uint16_t port;

	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 1, 0),
			      0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, before, 0, NULL), 0);
	g[2] = NAN;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 1, 0),
			EMB_ENONFINITE);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, after, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(before, after, sizeof(before)), 0);
	g[2] = 1.0f;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 1, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, after, 0, NULL), 0);
	for (int i = 0; i < 8; i++)
		CU_ASSERT(after[i] < before[i]);
	emb_server_stats(s, &ss);
	CU_ASSERT_EQUAL(ss.nonfinite, 1);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/*
 * Each table charges its fixed cost (about 4 MiB: arena metadata and the
 * first extent), so at the memory limit CREATE_TABLE is refused with
 * EMB_EMEMLIMIT while the existing tables keep serving. It used to charge
 * 8.5 KiB, and a 32 MiB server took 1024 tables (2 GiB of RSS).
 */
static void test_table_fixed_cost(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_client_table *t[64] = {0};
	struct emb_server_stats ss;
	struct emb_server *s;
	struct emb_client *c;
	uint64_t id = 5;
	float row[8], again[8];
	char addr[64], name[16];
	uint16_t port;
	int n = 0, rc = 0;

	so.mem_limit = 32u << 20;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	for (n = 0; n < 64; n++) {
		struct emb_table_spec sp;

		snprintf(name, sizeof(name), "fixed%d", n);
		sp = nt_spec(name, 8, 1);
		rc = emb_client_table_create(c, &sp, &t[n]);
		if (rc)
			break;
		CU_ASSERT_EQUAL(emb_client_table_pull(t[n], &id, 1, row, 0,
						      NULL),
				0);
	}
	CU_ASSERT_EQUAL(rc, EMB_EMEMLIMIT);
	CU_ASSERT(n >= 2 && n <= 8);
	emb_server_stats(s, &ss);
	CU_ASSERT(ss.mem_used <= so.mem_limit);
	CU_ASSERT(ss.mem_used >= (uint64_t)n * (4u << 20));
	/* Existing rows keep being served. */
	CU_ASSERT_EQUAL(emb_client_table_pull(t[0], &id, 1, again, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t[0], &id, 1, row, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(row, again, sizeof(row)), 0);
	for (int i = 0; i < n; i++)
		emb_client_table_close(t[i]);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

static const struct emb_test_case cases[] = {
	{"pull, push, assign and erase match the store engine bit for bit",
	 test_roundtrip},
	{"assign with optimizer state matches the store engine",
	 test_roundtrip_state},
	{"pull with NOCREATE reports found and creates nothing",
	 test_nocreate},
	{"duplicate ids: pull fills every copy, push sums them",
	 test_duplicates},
	{"three servers hold exactly the rows routed to them; open and drop",
	 test_three_servers},
	{"four clients pushing overlapping ids sum exactly",
	 test_concurrent_clients},
	{"256 async pushes and pulls in flight on one client complete",
	 test_pipelined},
	{"auto and tcp,rdma reach a TCP-only server over TCP; bad names fail",
	 test_transport_names},
	{"an async pull waited for after its client is gone frees cleanly",
	 test_async_outlives_client},
	{"a wrong or missing auth token is refused, the right one works",
	 test_auth},
	{"at the memory limit new rows fail, existing rows are served",
	 test_mem_limit},
	{"NaN and Inf gradients and absurd parameters are refused",
	 test_nonfinite_refused},
	    {"a synchronous table refuses a NaN part before holding it",
	     test_nonfinite_refused_sync},
	{"tables charge their fixed cost; create fails at the limit",
	 test_table_fixed_cost},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "worker", cases);
}
