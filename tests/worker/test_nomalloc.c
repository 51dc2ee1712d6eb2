/*
 * tests/worker/test_nomalloc.c - once warmed up, the client pulls and
 * pushes without one allocation per batch: its ops, their scratch, parts
 * and wait objects come back from the client's pool, responses land in
 * its pooled buffers, and ops reach the network thread through a task
 * each op keeps. The servers run in this process (they allocate nothing
 * per request either, tests/server/nomalloc), so every allocation of the
 * process counts (tests/alloc_count.h): copied tables over one and two
 * servers, a replicated map (R = 2 over three servers, each push sent to
 * both holders), asynchronous calls in flight together, and cached tables
 * in both modes, with the servers' timeout sweeps running. Under
 * AddressSanitizer only the counts go unchecked.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "harness.h"
#include "netutil.h"

#include "cluster/map.h"
#include "common/err.h"
#include "common/hash.h"
#include "worker/client_int.h"

#define DIM    32u
#define NROWS  8192u
#define BATCH  2048u
#define ROUNDS 50

struct rig {
	struct emb_server *srv[3];
	uint32_t nsrv;
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t *all;	/* NROWS distinct ids */
	uint64_t *ids;	/* a batch, with duplicates */
	float *rows;	/* BATCH rows out */
	float *grads;	/* BATCH gradients */
	uint8_t *found; /* BATCH flags */
};

static void rig_up(struct rig *r, uint32_t nsrv, uint32_t replicas)
{
	struct emb_table_spec sp = nt_spec("w", DIM, 7);
	uint16_t ports[3];
	char addrs[128];
	uint64_t st = 11;

	memset(r, 0, sizeof(*r));
	r->nsrv = nsrv;
	for (uint32_t i = 0; i < nsrv; i++) {
		struct emb_server_opts o = nt_server_opts();

		/* Timeout sweeps every 10 ms, so that some fall in the
		 * counted rounds (no conn waits for its HELLO that long). */
		o.handshake_timeout_ms = 40;
		o.idle_timeout_ms = 0;
		r->srv[i] = nt_server_start(&o);
		ports[i] = emb_server_port(r->srv[i]);
	}
	nt_addr_list(addrs, sizeof(addrs), ports, nsrv);
	r->c = nt_client(addrs, 0);
	if (replicas > 1) {
		struct emb_cmap *m = malloc(sizeof(*m));
		uint16_t *slots = malloc(EMB_NSLOTS * sizeof(*slots));

		CU_ASSERT_FATAL(m && slots);
		CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, nsrv, replicas), 0);
		for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
			slots[sl] = emb_cmap_primary(m, sl);
		CU_ASSERT_EQUAL_FATAL(
		    emb__client_set_map(r->c, slots, replicas, NULL), 0);
		free(slots);
		free(m);
	}
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(r->c, &sp, &r->t), 0);
	r->all = malloc(NROWS * sizeof(*r->all));
	r->ids = malloc(BATCH * sizeof(*r->ids));
	r->rows = malloc((size_t)BATCH * DIM * sizeof(float));
	r->grads = malloc((size_t)BATCH * DIM * sizeof(float));
	r->found = malloc(BATCH);
	CU_ASSERT_FATAL(r->all && r->ids && r->rows && r->grads && r->found);
	for (uint32_t i = 0; i < NROWS; i++)
		r->all[i] = emb_splitmix64(&st);
	for (size_t i = 0; i < (size_t)BATCH * DIM; i++)
		r->grads[i] = 0.001f;
	/* Every row made: a store growing its index is not the client's. */
	for (uint32_t i = 0; i < NROWS; i += BATCH)
		CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(r->t, r->all + i,
							    BATCH, r->rows, 0,
							    NULL),
				      0);
}

static void rig_down(struct rig *r)
{
	emb_client_table_close(r->t);
	emb_client_destroy(r->c);
	for (uint32_t i = 0; i < r->nsrv; i++)
		emb_server_destroy(r->srv[i]);
	free(r->found);
	free(r->grads);
	free(r->rows);
	free(r->ids);
	free(r->all);
}

/* Batch k: BATCH ids from the table's rows, about one in four repeated. */
static void batch(struct rig *r, uint32_t k)
{
	for (uint32_t i = 0; i < BATCH; i++) {
		uint32_t j = i % 4 == 3 ? i - 1 : i;

		r->ids[i] = r->all[(k * 977u + j) % NROWS];
	}
}

/* One round of every copied-table call a trainer makes per batch. */
static void round_copied(struct rig *r, uint32_t k)
{
	struct emb_async *a, *b;

	batch(r, k);
	CU_ASSERT_EQUAL(emb_client_table_pull(r->t, r->ids, BATCH, r->rows, 0,
					      NULL),
			0);
	CU_ASSERT_EQUAL(emb_client_table_pull(r->t, r->ids, BATCH / 2, r->rows,
					      EMB_CLIENT_NOCREATE, r->found),
			0);
	CU_ASSERT_EQUAL(emb_client_table_push(r->t, r->ids, BATCH, r->grads,
					      k, 0),
			0);
	/* Two calls in flight at once: two ops out of the pool. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(r->t, r->ids, BATCH,
							  r->rows, 0, NULL, &a),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_push_async(r->t, r->ids, BATCH,
							  r->grads, k, 0, &b),
			      0);
	CU_ASSERT_EQUAL(emb_async_wait(a), 0);
	CU_ASSERT_EQUAL(emb_async_wait(b), 0);
	CU_ASSERT_EQUAL(emb_client_table_assign(r->t, r->ids, 64, r->rows,
						false),
			0);
}

/*
 * Warm-up past what the counted rounds need: DEEP pulls and pushes in
 * flight at once grow every pool (the client's ops and response buffers,
 * each server conn's requests) deeper than two calls at a time ever reach,
 * however the threads happen to interleave.
 */
#define DEEP 8
static void warm_deep(struct rig *r)
{
	struct emb_async *op[2 * DEEP];

	batch(r, 0);
	for (uint32_t i = 0; i < DEEP; i++) {
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull_async(r->t, r->ids, BATCH, r->rows,
						0, NULL, &op[2 * i]),
		    0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_push_async(r->t, r->ids, BATCH, r->grads,
						0, 0, &op[2 * i + 1]),
		    0);
	}
	for (uint32_t i = 0; i < 2 * DEEP; i++)
		CU_ASSERT_EQUAL(emb_async_wait(op[i]), 0);
}

/*
 * Counted passes of ROUNDS batches: the case passes when one of PASSES
 * passes allocates nothing. A pool grows once whenever the threads happen
 * to interleave into a depth it never had (a server conn holding one more
 * request at once than in every warm-up): that is a new high-water mark,
 * not a cost per batch, and the next pass is clean. An allocation per
 * batch or per call shows in every pass, ROUNDS times or more.
 */
#define PASSES 3

static void note_peak(unsigned long n, const char *what)
{
	fprintf(stderr, "%s: %lu allocations in a pass (a pool's new depth?),"
			" counting again\n",
		what, n);
	CU_ASSERT(n < ROUNDS);
}

static void copied(uint32_t nsrv, uint32_t replicas, const char *what)
{
	float before[DIM];
	struct rig r;

	rig_up(&r, nsrv, replicas);
	for (uint32_t k = 0; k < 8; k++)
		round_copied(&r, k);
	warm_deep(&r);
	batch(&r, 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(r.t, r.ids, 1, before, 0, NULL),
			0);

	for (uint32_t pass = 0;; pass++) {
		unsigned long n;

		count_begin();
		for (uint32_t k = 0; k < ROUNDS; k++)
			round_copied(&r, k);
		n = count_end();
		if (!n || pass + 1 == PASSES) {
			expect_none(n, what);
			break;
		}
		note_peak(n, what);
	}

	/* The counted calls did their work: the rows moved. */
	for (uint32_t k = 0; k < 4; k++)
		round_copied(&r, 1000 + k);
	batch(&r, 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(r.t, r.ids, BATCH, r.rows, 0,
					      NULL),
			0);
	CU_ASSERT_NOT_EQUAL(r.rows[0], before[0]);
	rig_down(&r);
}

static void test_one_server(void)
{
	copied(1, 1, "copied table, one server");
}

static void test_two_servers(void)
{
	copied(2, 1, "copied table, two servers");
}

static void test_replicated(void)
{
	copied(3, 2, "copied table, R = 2 over three servers");
}

/* ROUNDS batches of a trainer over a cached table, from batch from. */
static void cached_rounds(struct rig *r, struct emb_cached_table *ct,
			  uint32_t from)
{
	for (uint32_t k = from; k < from + ROUNDS; k++) {
		batch(r, k);
		CU_ASSERT_EQUAL(emb_cached_table_lookup(ct, r->ids, BATCH,
							r->rows),
				0);
		CU_ASSERT_EQUAL(emb_cached_table_push_grads(ct, r->grads), 0);
	}
}

static void cached(uint32_t nsrv, uint32_t mode, const char *what)
{
	struct emb_cached_table_opts o = EMB_CACHED_TABLE_OPTS_DEFAULT;
	struct emb_cached_table *ct;
	struct rig r;

	rig_up(&r, nsrv, 1);
	/* Smaller than the rows used: lookups miss, fetch and evict. */
	o.capacity = NROWS / 2;
	o.max_batch = BATCH;
	o.mode = mode;
	CU_ASSERT_EQUAL_FATAL(emb_cached_table_create(r.t, &o, &ct), 0);
	warm_deep(&r);
	cached_rounds(&r, ct, 0);
	for (uint32_t pass = 0;; pass++) {
		unsigned long n;

		count_begin();
		cached_rounds(&r, ct, (pass + 1) * ROUNDS);
		n = count_end();
		if (!n || pass + 1 == PASSES) {
			expect_none(n, what);
			break;
		}
		note_peak(n, what);
	}
	CU_ASSERT_EQUAL(emb_cached_table_flush(ct), 0);
	emb_cached_table_destroy(ct);
	rig_down(&r);
}

static void test_cached_through(void)
{
	cached(2, EMB_CACHED_WRITE_THROUGH, "cached table, write-through");
}

static void test_cached_back(void)
{
	cached(2, EMB_CACHED_WRITE_BACK, "cached table, write-back");
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"one server: pulls and pushes allocate nothing once warm",
	     test_one_server},
	    {"two servers: pulls and pushes allocate nothing once warm",
	     test_two_servers},
	    {"R = 2: replicated pushes allocate nothing once warm",
	     test_replicated},
	    {"cached table, write-through: nothing allocated once warm",
	     test_cached_through},
	    {"cached table, write-back: nothing allocated once warm",
	     test_cached_back},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "worker/nomalloc", cases);
}
