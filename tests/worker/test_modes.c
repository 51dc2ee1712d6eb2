/*
 * tests/worker/test_modes.c - training modes through real servers: a
 * synchronous table equals a sequential reference fed averaged gradients,
 * and bounded staleness discards (and counts) pushes that lag too far.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "store/store.h"
#include "worker/embstore.h"

#define DIM 4
#define WORKERS 3
#define STEPS 12
#define BATCH 64
#define IDS 200

/* Worker w's ids and gradients at step s: overlapping, with duplicates. */
static void make_batch(uint32_t w, uint32_t s, uint64_t *ids, float *g)
{
	uint64_t st = (uint64_t)w * 1000003u + s * 7919u + 1;

	for (uint32_t i = 0; i < BATCH; i++) {
		ids[i] = emb_splitmix64(&st) % IDS;
		for (uint32_t j = 0; j < DIM; j++)
			g[i * DIM + j] =
				(float)((int)(emb_splitmix64(&st) % 17) - 8) / 8.0f;
	}
}

struct worker_arg {
	const char *servers;   /* cluster */
	uint32_t rank;	       /* this worker */
	int rc;		       /* first error */
};

static struct emb_table_spec sync_spec(void)
{
	struct emb_table_spec sp = nt_spec("sync_t", DIM, 5);

	sp.optim.kind = EMB_OPTIM_ADAGRAD; /* nonlinear: averaging matters */
	sp.optim.lr = 0.1f;
	return sp;
}

static void *worker_main(void *arg)
{
	struct worker_arg *a = arg;
	struct emb_table_spec sp = sync_spec();
	struct emb_client *c = nt_client(a->servers, 10000);
	struct emb_client_table *t = NULL;
	uint64_t ids[BATCH];
	float g[BATCH * DIM], rows[BATCH * DIM];

	a->rc = emb_client_table_create(c, &sp, &t);
	if (!a->rc)
		a->rc = emb_client_table_set_mode(t, EMB_MODE_SYNC, WORKERS, 0);
	for (uint32_t s = 0; s < STEPS && !a->rc; s++) {
		make_batch(a->rank, s, ids, g);
		a->rc = emb_client_table_pull(t, ids, BATCH, rows, 0, NULL);
		/* Rank 2 sends nothing at step 3: an empty step still counts. */
		if (!a->rc)
			a->rc = emb_client_table_push(
				t, ids, a->rank == 2 && s == 3 ? 0 : BATCH, g,
				s, a->rank);
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	return NULL;
}

static void test_sync_equals_reference(void)
{
	struct emb_server *srv[2];
	uint16_t ports[2];
	char addr[128];
	pthread_t th[WORKERS];
	struct worker_arg wa[WORKERS];
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sp = sync_spec();
	struct emb_table *ref;
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t all[IDS];
	float got[IDS * DIM], want[IDS * DIM];

	for (int k = 0; k < 2; k++) {
		struct emb_server_opts so = nt_server_opts();

		srv[k] = nt_server_start(&so);
		CU_ASSERT_PTR_NOT_NULL_FATAL(srv[k]);
		ports[k] = emb_server_port(srv[k]);
	}
	nt_addr_list(addr, sizeof(addr), ports, 2);
	for (uint32_t w = 0; w < WORKERS; w++) {
		wa[w] = (struct worker_arg){addr, w, 0};
		pthread_create(&th[w], NULL, worker_main, &wa[w]);
	}
	for (uint32_t w = 0; w < WORKERS; w++) {
		pthread_join(th[w], NULL);
		CU_ASSERT_EQUAL(wa[w].rc, 0);
	}

	/* The reference: one push per step of every worker's gradients,
	 * each divided by the worker count, concatenated in rank order. */
	o.name = sp.name;
	o.dim = DIM;
	o.optim = sp.optim;
	o.init = sp.init;
	o.seed = sp.seed;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &ref), 0);
	for (uint32_t s = 0; s < STEPS; s++) {
		uint64_t ids[WORKERS * BATCH];
		float g[WORKERS * BATCH * DIM], rows[WORKERS * BATCH * DIM];
		uint32_t n = 0;

		for (uint32_t w = 0; w < WORKERS; w++) {
			make_batch(w, s, ids + n, g + (size_t)n * DIM);
			emb_table_pull(ref, ids + n, BATCH, rows, 0, NULL);
			if (w == 2 && s == 3)
				continue;
			n += BATCH;
		}
		for (uint32_t i = 0; i < n * DIM; i++)
			g[i] /= (float)WORKERS;
		CU_ASSERT_EQUAL(emb_table_push(ref, ids, n, g), 0);
	}
	for (uint32_t i = 0; i < IDS; i++)
		all[i] = i;
	emb_table_pull(ref, all, IDS, want, EMB_PULL_NOCREATE, NULL);
	c = nt_client(addr, 5000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "sync_t", &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, all, IDS, got,
					      EMB_CLIENT_NOCREATE, NULL),
			0);
	for (uint32_t i = 0; i < IDS * DIM; i++)
		CU_ASSERT_DOUBLE_EQUAL(got[i], want[i],
				       1e-6 * (1.0 + (double)(want[i] < 0 ? -want[i] : want[i])));
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_table_destroy(ref);
	for (int k = 0; k < 2; k++)
		emb_server_destroy(srv[k]);
}

static void test_sync_rejects_bad_rank_and_step(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = nt_server_start(&so);
	struct emb_table_spec sp = nt_spec("sync_bad", DIM, 1);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t id = 7;
	float g[DIM] = {1, 1, 1, 1};
	char addr[64];
	uint16_t port;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 2000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 2, 0), 0);
	/* The same mode again is a no-op; sync without workers is refused. */
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 2, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 0, 0),
			EMB_EBADARG);
	rc = emb_client_table_push(t, &id, 1, g, 0, 5);
	if (rc != EMB_EBADARG)
		fprintf(stderr, "\n    bad rank gave %d (%s)", rc, emb_strerror(rc));
	CU_ASSERT_EQUAL(rc, EMB_EBADARG);
	/* Rank 0 alone cannot finish a step of 2 workers: the push is held
	 * and the call times out rather than hanging. */
	CU_ASSERT_EQUAL(emb_client_table_push(t, &id, 1, g, 0, 0),
			-ETIMEDOUT);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

static void test_stale_pushes_are_discarded(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = nt_server_start(&so);
	struct emb_table_spec sp = nt_spec("stale_t", DIM, 1);
	struct emb_client_table_stats cs;
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t ids[2] = {1, 2};
	float g[2 * DIM], row[2 * DIM];
	char addr[64];
	uint16_t port;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	for (int i = 0; i < 2 * DIM; i++)
		g[i] = 1.0f;
	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 2000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_STALE, 0, 2), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 10, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 8, 1), 0); /* ok */
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 7, 1), 0); /* old */
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 1, g, 3, 2), 0); /* old */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, row, 0, NULL), 0);
	CU_ASSERT_EQUAL(row[0], -2.0f);
	CU_ASSERT_EQUAL(row[DIM], -2.0f);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &cs), 0);
	CU_ASSERT_EQUAL(cs.grads_discarded, 3);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
		{"sync steps equal a reference fed averaged gradients",
		 test_sync_equals_reference},
		{"sync refuses a bad rank and times out an unfinished step",
		 test_sync_rejects_bad_rank_and_step},
		{"stale pushes are discarded and counted",
		 test_stale_pushes_are_discarded},
		{NULL, NULL},
	};

	return emb_test_main(argc, argv, "worker", cases);
}
