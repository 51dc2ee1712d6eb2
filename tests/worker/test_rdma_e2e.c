/*
 * tests/worker/test_rdma_e2e.c - the whole path over RDMA verbs: a server
 * whose loops are RDMA (table extents registered as they are mapped) and
 * clients that pull and push through it. Rows are checked bit for bit
 * against a local table with the same seed. Runs where an RDMA device and
 * RDMA_VM_IP exist (the Soft-RoCE VM, see .ci/run); elsewhere it exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "store/store.h"
#include "transport/transport.h"
#include "worker/embstore.h"

#define DIM 64
#define BATCH 4096

static const char *ip;

static struct emb_server *start_rdma_server(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = NULL;

	so.host = ip;
	so.port = 0;
	so.transport = "rdma";
	so.threads = 2;
	so.zero_copy_pulls = true;
	CU_ASSERT_EQUAL(emb_server_create(&so, &srv), 0);
	return srv;
}

static struct emb_client *rdma_client(uint16_t port)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	char addr[128];

	snprintf(addr, sizeof(addr), "%s:%u", ip, port);
	co.servers = addr;
	co.transport = "rdma";
	co.timeout_ms = 60000; /* the VM is emulated: slow, not hung */
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), 0);
	if (c)
		CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "rdma");
	return c;
}

/*
 * Rows created while the table grows land in extents mapped after the
 * connection was set up; each must be registered and sent correctly.
 */
static void test_rows_of_a_growing_table(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sp = nt_spec("grow", DIM, 11);
	struct emb_server *srv = start_rdma_server();
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_table *t;
	struct emb_client *c;
	struct emb_table *ref;
	uint64_t *ids = malloc(BATCH * sizeof(*ids));
	float *got = malloc((size_t)BATCH * DIM * sizeof(float));
	float *want = malloc((size_t)BATCH * DIM * sizeof(float));
	float *g = malloc((size_t)BATCH * DIM * sizeof(float));
	uint64_t seed = 5;
	uint32_t bad = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = rdma_client(emb_server_port(srv));
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	o.name = "grow";
	o.dim = DIM;
	o.optim = sp.optim;
	o.init = sp.init;
	o.seed = sp.seed;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &ref), 0);

	/* 24 batches of new ids (~25 MB of rows: several extents), then
	 * pushes and pulls of ids spread over all of them. */
	for (uint32_t b = 0; b < 32; b++) {
		for (uint32_t i = 0; i < BATCH; i++) {
			ids[i] = b < 24 ? (uint64_t)b * BATCH + i
					: emb_splitmix64(&seed) % (24 * BATCH);
			for (uint32_t j = 0; j < DIM; j++)
				g[(size_t)i * DIM + j] = (float)((i + j) % 7) - 3.0f;
		}
		if (b >= 24) {
			CU_ASSERT_EQUAL(emb_client_table_push(t, ids, BATCH, g,
							      b, 0),
					0);
			CU_ASSERT_EQUAL(emb_table_push(ref, ids, BATCH, g), 0);
		}
		CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, BATCH, got,
							    0, NULL),
				      0);
		CU_ASSERT_FATAL(emb_table_pull(ref, ids, BATCH, want, 0,
					       NULL) >= 0);
		for (size_t k = 0; k < (size_t)BATCH * DIM; k++)
			bad += memcmp(&got[k], &want[k], sizeof(float)) != 0;
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, 24 * BATCH);

	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
	emb_table_destroy(ref);
	free(ids);
	free(got);
	free(want);
	free(g);
}

/* A dropped table's extents are deregistered while others keep serving. */
static void test_drop_while_another_table_serves(void)
{
	struct emb_table_spec a = nt_spec("keep", 16, 1), b = nt_spec("drop", 16, 2);
	struct emb_server *srv = start_rdma_server();
	struct emb_client_table *ta, *tb;
	struct emb_client *c;
	uint64_t ids[512];
	float rows[512 * 16], again[512 * 16];

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = rdma_client(emb_server_port(srv));
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &a, &ta), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &b, &tb), 0);
	for (uint32_t i = 0; i < 512; i++)
		ids[i] = i * 7919u;
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, 512, rows, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(tb, ids, 512, again, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_drop(tb), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, 512, again, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(rows, again, sizeof(rows)), 0);
	emb_client_table_close(ta);
	emb_client_table_close(tb);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

static struct emb_server *start_server(const char *transport, uint16_t port)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = NULL;

	so.host = ip;
	so.port = port;
	so.transport = transport;
	so.threads = 2;
	so.zero_copy_pulls = strstr(transport, "rdma") != NULL;
	CU_ASSERT_EQUAL(emb_server_create(&so, &srv), 0);
	return srv;
}

static struct emb_client *client_over(const char *servers,
				      const char *transport)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;

	co.servers = servers;
	co.transport = transport;
	co.timeout_ms = 60000;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), 0);
	return c;
}

/*
 * Pushes and pulls BATCH ids of table name through c and through a local
 * table with the same spec; returns the floats that differ (0 = bit-exact).
 */
static uint32_t rounds(struct emb_client *c, const char *name, uint64_t seed)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sp = nt_spec(name, DIM, 21);
	struct emb_client_table *t = NULL;
	struct emb_table *ref = NULL;
	uint64_t *ids = malloc(BATCH * sizeof(*ids));
	float *got = malloc((size_t)BATCH * DIM * sizeof(float));
	float *want = malloc((size_t)BATCH * DIM * sizeof(float));
	float *g = malloc((size_t)BATCH * DIM * sizeof(float));
	uint32_t bad = 0;

	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	o.name = name;
	o.dim = DIM;
	o.optim = sp.optim;
	o.init = sp.init;
	o.seed = sp.seed;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &ref), 0);
	for (uint32_t b = 0; b < 4; b++) {
		for (uint32_t i = 0; i < BATCH; i++) {
			/* Distinct within a batch, overlapping across. */
			ids[i] = (seed + b * 7919u + i * 4u) % (4 * BATCH);
			for (uint32_t j = 0; j < DIM; j++)
				g[(size_t)i * DIM + j] =
				    (float)((i + j + b) % 5) - 2.0f;
		}
		CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, BATCH, got, 0,
						      NULL),
				0);
		CU_ASSERT(emb_table_pull(ref, ids, BATCH, want, 0, NULL) >= 0);
		for (size_t k = 0; k < (size_t)BATCH * DIM; k++)
			bad += memcmp(&got[k], &want[k], sizeof(float)) != 0;
		CU_ASSERT_EQUAL(emb_client_table_push(t, ids, BATCH, g, b, 0),
				0);
		CU_ASSERT_EQUAL(emb_table_push(ref, ids, BATCH, g), 0);
	}
	emb_client_table_close(t);
	emb_table_destroy(ref);
	free(ids);
	free(got);
	free(want);
	free(g);
	return bad;
}

/*
 * One "tcp,rdma" server, one port: an "auto" client moves to RDMA, a TCP
 * client (a worker without a device) stays on TCP, an "rdma" client goes
 * straight there; rows are exact for all three, and the RDMA clients'
 * 1 MiB responses land in registered memory, never copied.
 */
static void test_both_transports_at_one_port(void)
{
	struct emb_server *srv = start_server("tcp,rdma", 0);
	struct emb_client *c[3];
	static const char *const tp[3] = {"auto", "tcp", "rdma"};
	static const char *const want[3] = {"rdma", "tcp", "rdma"};
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	char addr[128], name[16];

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	snprintf(addr, sizeof(addr), "%s:%u", ip, emb_server_port(srv));
	for (int i = 0; i < 3; i++) {
		c[i] = client_over(addr, tp[i]);
		CU_ASSERT_PTR_NOT_NULL_FATAL(c[i]);
		CU_ASSERT_STRING_EQUAL(emb_client_transport(c[i]), want[i]);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "both%d", i);
		CU_ASSERT_EQUAL(rounds(c[i], name, 40 + (uint64_t)i), 0);
		emb_client_stats(c[i], &st);
		CU_ASSERT(st.bytes_in > (uint64_t)4 * BATCH * DIM * 4);
		CU_ASSERT_EQUAL(st.resp_copied, 0);
	}
	for (int i = 0; i < 3; i++)
		emb_client_destroy(c[i]);
	emb_server_destroy(srv);
}

/*
 * A cluster where one server has no RDMA (a TCP-only server on a host
 * that has a device; its rdma_cm port is closed): "auto" uses RDMA to the
 * other and TCP to this one, and every row is right.
 */
static void test_auto_with_a_tcp_only_server(void)
{
	struct emb_server *a = start_server("tcp,rdma", 0);
	struct emb_server *b = start_server("tcp", 0);
	struct emb_client *c;
	char addr[256];

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	snprintf(addr, sizeof(addr), "%s:%u", ip, emb_server_port(b));
	c = client_over(addr, "auto");
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "tcp");
	CU_ASSERT_EQUAL(rounds(c, "tcponly", 7), 0);
	emb_client_destroy(c);

	snprintf(addr, sizeof(addr), "%s:%u,%s:%u", ip, emb_server_port(a), ip,
		 emb_server_port(b));
	c = client_over(addr, "auto");
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "tcp,rdma");
	CU_ASSERT_EQUAL(rounds(c, "mixed", 8), 0);
	emb_client_destroy(c);
	emb_server_destroy(a);
	emb_server_destroy(b);
}

/* A restarted server: the client reconnects over RDMA again. */
static void test_reconnect_stays_on_rdma(void)
{
	struct emb_server *srv = start_server("tcp,rdma", 0);
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	uint16_t port;
	char addr[128];

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	port = emb_server_port(srv);
	snprintf(addr, sizeof(addr), "%s:%u", ip, port);
	c = client_over(addr, "auto");
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(rounds(c, "before", 1), 0);
	emb_server_destroy(srv);
	srv = start_server("tcp,rdma", port);
	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	CU_ASSERT_EQUAL(rounds(c, "after", 2), 0);
	emb_client_stats(c, &st);
	CU_ASSERT(st.reconnects >= 1);
	CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "rdma");
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/*
 * Async pulls over RDMA still out when the client is destroyed: their
 * registered response buffers are deregistered before the transport goes,
 * and waiting for the ops afterwards frees the memory (no call into the
 * dead transport).
 */
static void test_async_outlives_client(void)
{
	struct emb_server *srv = start_server("tcp,rdma", 0);
	struct emb_table_spec sp = nt_spec("outlive", DIM, 3);
	struct emb_client_table *t = NULL;
	struct emb_async *op[3];
	struct emb_client *c;
	uint64_t *ids = malloc(BATCH * sizeof(*ids));
	float *rows = malloc((size_t)3 * BATCH * DIM * sizeof(float));
	char addr[128];
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	snprintf(addr, sizeof(addr), "%s:%u", ip, emb_server_port(srv));
	c = client_over(addr, "auto");
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_STRING_EQUAL(emb_client_transport(c), "rdma");
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = i * 13u;
	for (int k = 0; k < 3; k++)
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull_async(t, ids, BATCH,
						rows + (size_t)k * BATCH * DIM,
						0, NULL, &op[k]),
		    0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int k = 0; k < 3; k++) {
		rc = emb_async_wait(op[k]);
		CU_ASSERT(rc == 0 || rc == EMB_ECLOSED);
	}
	emb_server_destroy(srv);
	free(ids);
	free(rows);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
		{"rows of a growing table are pulled exactly over RDMA",
		 test_rows_of_a_growing_table},
		{"a dropped table leaves the others serving over RDMA",
		 test_drop_while_another_table_serves},
		{"a tcp,rdma server takes RDMA and TCP clients at one port",
		 test_both_transports_at_one_port},
		{"auto uses TCP to a server without RDMA, RDMA to the others",
		 test_auto_with_a_tcp_only_server},
		{"a client reconnects over RDMA to a restarted server",
		 test_reconnect_stays_on_rdma},
		{"async pulls over RDMA waited for after the client is gone",
		 test_async_outlives_client},
		{NULL, NULL},
	};

	ip = getenv("RDMA_VM_IP");
	if (!ip || !emb_transport_available("rdma")) {
		fprintf(stderr, "worker/rdma_e2e: no RDMA device here (set "
				"RDMA_VM_IP inside ../shared/rdma-vm); skipped\n");
		return 77;
	}
	return emb_test_main(argc, argv, "worker", cases);
}
