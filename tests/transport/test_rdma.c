/*
 * tests/transport/test_rdma.c - what the RDMA transport must do beyond the
 * conformance suite: replies of more row iovecs than one WR takes, 16 KiB
 * rows, rows in memory registered after the conn came up, a push the size
 * of max_frame_bytes, pipelining far past the credit window, a client
 * killed mid-request and malformed frames from a raw verbs peer. Server and
 * client loops run on the test thread, pumped in turn. Exits 77 where
 * "rdma" is not built in or has no device. The host is $RDMA_VM_IP when
 * set (rdma-vm), else 127.0.0.1 (which the transport maps to the device).
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common/err.h"
#include "harness.h"
#include "proto/wire.h"
#include "transport/transport.h"

#define OP_ROWS 1 /* payload u32 row numbers; reply one iov per row */
#define OP_PUSH 2 /* payload u64 ids then floats; reply u64 checksum */
#define OP_HOLD 3 /* held until the test replies with rows of region 0 */
#define NREGIONS 3
#define REGION_FLOATS (4096u * 256u) /* 4 MiB per region */

static const char *host = "127.0.0.1";

struct server {
	struct emb_transport *tr;
	struct emb_listener *l;
	float *region[NREGIONS];     /* row memory, registered or not */
	struct emb_mr *mr[NREGIONS]; /* NULL = not registered */
	struct iovec *iov;	     /* reply scratch; the transport copies */
	uint64_t prefix;	     /* reply head on no MR: staged copy */
	uint64_t sum;		     /* PUSH reply */
	int closes;		     /* on_close calls */
	int last_reason;	     /* their last reason */
	int bad_seen;		     /* requests that failed a check */
	struct emb_req *held;	     /* OP_HOLD request */
	struct emb_frame_hdr held_hdr; /* its header */
};

static float row_value(unsigned region, uint32_t row, unsigned j)
{
	return (float)region * 1000000.0f + (float)row + (float)j / 8192.0f;
}

static void on_request(void *arg, struct emb_conn *c, struct emb_req *r,
		       const struct emb_frame_hdr *h, void *payload)
{
	struct server *s = arg;
	struct emb_frame_hdr rh = {.opcode = h->opcode | EMB_OP_RESPONSE_BIT,
				   .count = h->count,
				   .table_id = h->table_id};
	const uint32_t *rows = payload;
	uint32_t n = h->payload_len / 4, dim = h->count;

	(void)c;
	if (h->opcode == OP_ROWS) {
		s->prefix = n;
		s->iov[0] = (struct iovec){.iov_base = &s->prefix,
					   .iov_len = sizeof(s->prefix)};
		for (uint32_t i = 0; i < n; i++)
			s->iov[i + 1] = (struct iovec){
				.iov_base = s->region[h->table_id] +
					    (size_t)rows[i] * dim,
				.iov_len = dim * sizeof(float)};
		emb_conn_reply(r, &rh, s->iov, (int)n + 1, NULL, NULL);
		return;
	}
	if (h->opcode == OP_PUSH) {
		const uint64_t *ids = payload;
		const float *g = (const float *)(ids + h->count);
		size_t nf = (h->payload_len - h->count * 8u) / 4;

		s->sum = 0;
		for (uint32_t i = 0; i < h->count; i++)
			s->sum += ids[i];
		for (size_t i = 0; i < nf; i++)
			if (g[i] != (float)(i % 1000))
				s->bad_seen++;
		emb_conn_reply(r, &rh,
			       &(struct iovec){.iov_base = &s->sum,
					       .iov_len = sizeof(s->sum)},
			       1, NULL, NULL);
		return;
	}
	if (h->opcode == OP_HOLD) {
		s->held = r;
		s->held_hdr = *h;
		return;
	}
	emb_req_release(r);
}

static void on_close(void *arg, struct emb_conn *c, int reason)
{
	struct server *s = arg;

	(void)c;
	s->closes++;
	s->last_reason = reason;
}

static void server_start(struct server *s,
			 const struct emb_transport_opts *o)
{
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;

	memset(s, 0, sizeof(*s));
	CU_ASSERT_FATAL(emb_transport_create("rdma", o, &s->tr) == 0);
	for (unsigned k = 0; k < NREGIONS; k++) {
		s->region[k] = malloc(REGION_FLOATS * sizeof(float));
		CU_ASSERT_FATAL(s->region[k] != NULL);
		for (uint32_t i = 0; i < REGION_FLOATS; i++)
			s->region[k][i] = -1;
	}
	/* Region 0 registered from the start, the others later or never. */
	CU_ASSERT_FATAL(emb_transport_reg_mem(s->tr, s->region[0],
					      REGION_FLOATS * sizeof(float),
					      &s->mr[0]) == 0);
	s->iov = malloc((16384 + 1) * sizeof(*s->iov));
	CU_ASSERT_FATAL(s->iov != NULL);
	lo.host = host;
	lo.on_request = on_request;
	lo.on_close = on_close;
	lo.arg = s;
	CU_ASSERT_FATAL(emb_listener_create(s->tr, &lo, &s->l) == 0);
}

static void server_stop(struct server *s)
{
	emb_listener_destroy(s->l);
	for (unsigned k = 0; k < NREGIONS; k++)
		emb_transport_dereg_mem(s->tr, s->mr[k]);
	emb_transport_destroy(s->tr);
	for (unsigned k = 0; k < NREGIONS; k++)
		free(s->region[k]);
	free(s->iov);
}

/* Fills rows [0, nrows) of region k with their values for dim. */
static void region_fill(struct server *s, unsigned k, uint32_t nrows,
			uint32_t dim)
{
	for (uint32_t r = 0; r < nrows; r++)
		for (uint32_t j = 0; j < dim; j++)
			s->region[k][(size_t)r * dim + j] = row_value(k, r, j);
}

struct result {
	bool done;
	int status;
	struct emb_frame_hdr hdr;
};

static void on_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct result *r = ctx;

	CU_ASSERT_FALSE(r->done);
	r->done = true;
	r->status = status;
	if (resp)
		r->hdr = *resp;
}

static void pump(struct emb_transport *a, struct emb_transport *b,
		 const bool *done)
{
	while (!*done) {
		emb_transport_poll(a, 0);
		emb_transport_poll(b, 0);
	}
}

struct accepter {
	struct server *s;
	int stop; /* atomic */
};

static void *accept_main(void *arg)
{
	struct accepter *a = arg;

	while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE))
		emb_transport_poll(a->s->tr, 1);
	return NULL;
}

/*
 * emb_conn_create() blocks until the server accepts, so the server loop
 * runs in a thread meanwhile; the join hands it back to this thread.
 */
static struct emb_conn *dial_timeout(struct emb_transport *tr,
				     struct server *s, uint32_t timeout_ms);

static struct emb_conn *dial(struct emb_transport *tr, struct server *s)
{
	return dial_timeout(tr, s, 30000);
}

static struct emb_conn *dial_timeout(struct emb_transport *tr,
				     struct server *s, uint32_t timeout_ms)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct accepter a = {.s = s};
	struct emb_conn *c = NULL;
	pthread_t th;
	int rc;

	co.host = host;
	co.port = emb_listener_port(s->l);
	co.call_timeout_ms = timeout_ms;
	CU_ASSERT_FATAL(pthread_create(&th, NULL, accept_main, &a) == 0);
	rc = emb_conn_create(tr, &co, &c);
	__atomic_store_n(&a.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	return c;
}

/* Pulls rows[] of region k at dim into resp and checks every float. */
static void pull_check(struct emb_transport *tr, struct server *s,
		       struct emb_conn *c, unsigned k, const uint32_t *rows,
		       uint32_t n, uint32_t dim, void *resp, size_t cap)
{
	struct emb_frame_hdr h = {.opcode = OP_ROWS, .table_id = k,
				  .count = dim};
	struct iovec iov = {.iov_base = (void *)rows, .iov_len = n * 4u};
	struct result r = {0};
	const float *f = (const float *)((char *)resp + 8);
	size_t bad = 0;

	memset(resp, 0, cap);
	CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, &iov, 1, resp, cap,
					    on_done, &r),
			      0);
	pump(tr, s->tr, &r.done);
	CU_ASSERT_EQUAL_FATAL(r.status, 0);
	CU_ASSERT_EQUAL(r.hdr.payload_len, 8 + (size_t)n * dim * 4);
	CU_ASSERT_EQUAL(*(uint64_t *)resp, n);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < dim; j++)
			bad += f[(size_t)i * dim + j] != row_value(k, rows[i], j);
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_many_iovs(void)
{
	enum { N = 4096, DIM = 64 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	size_t cap = 8 + (size_t)N * DIM * 4;
	uint32_t *rows = malloc(N * 4);
	void *reg_buf, *plain = malloc(cap);
	struct emb_mr *mr;

	server_start(&s, NULL);
	region_fill(&s, 0, 16384, DIM);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	CU_ASSERT_FATAL(emb_transport_buf_alloc(tr, cap, &reg_buf, &mr) == 0);
	for (uint32_t i = 0; i < N; i++)
		rows[i] = (i * 7919u) % 16384; /* scattered: no two adjacent */
	/* Registered landing (zero copy both ends), then a bounced one. */
	pull_check(tr, &s, c, 0, rows, N, DIM, reg_buf, cap);
	pull_check(tr, &s, c, 0, rows, N, DIM, plain, cap);
	/* 16384 iovecs: more WRs than the send ring holds at once. */
	free(rows);
	rows = malloc(16384 * 4);
	free(plain);
	plain = malloc(8 + (size_t)16384 * 16 * 4);
	for (uint32_t i = 0; i < 16384; i++)
		rows[i] = 16383 - i;
	region_fill(&s, 0, 16384, 16);
	pull_check(tr, &s, c, 0, rows, 16384, 16, plain,
		   8 + (size_t)16384 * 16 * 4);

	emb_transport_buf_free(tr, reg_buf, mr);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
	free(rows);
	free(plain);
}

static void test_dim_4096(void)
{
	enum { N = 200, DIM = 4096 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	size_t cap = 8 + (size_t)N * DIM * 4;
	uint32_t rows[N];
	void *buf;
	struct emb_mr *mr;

	server_start(&s, NULL);
	region_fill(&s, 0, 256, DIM);
	region_fill(&s, 2, 256, DIM); /* never registered: staged copies */
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	CU_ASSERT_FATAL(emb_transport_buf_alloc(tr, cap, &buf, &mr) == 0);
	for (uint32_t i = 0; i < N; i++)
		rows[i] = (i * 37u) % 256;
	pull_check(tr, &s, c, 0, rows, N, DIM, buf, cap);
	pull_check(tr, &s, c, 2, rows, N, DIM, buf, cap);

	emb_transport_buf_free(tr, buf, mr);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

static void test_late_registration(void)
{
	enum { N = 1024, DIM = 32 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	size_t cap = 8 + (size_t)N * DIM * 4;
	uint32_t rows[N];
	void *buf;
	struct emb_mr *mr;

	server_start(&s, NULL);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	CU_ASSERT_FATAL(emb_transport_buf_alloc(tr, cap, &buf, &mr) == 0);
	for (uint32_t i = 0; i < N; i++)
		rows[i] = (i * 131u) % 8192;
	/* A table grows: region 1 gets rows and is registered only now. */
	region_fill(&s, 1, 8192, DIM);
	CU_ASSERT_FATAL(emb_transport_reg_mem(s.tr, s.region[1],
					      REGION_FLOATS * sizeof(float),
					      &s.mr[1]) == 0);
	pull_check(tr, &s, c, 1, rows, N, DIM, buf, cap);
	/* Deregistered again (a shrinking arena): the rows are copied. */
	emb_transport_dereg_mem(s.tr, s.mr[1]);
	s.mr[1] = NULL;
	pull_check(tr, &s, c, 1, rows, N, DIM, buf, cap);

	emb_transport_buf_free(tr, buf, mr);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

static void test_max_frame_push(void)
{
	enum { IDS = 4096, DIM = 64 };
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	size_t plen = (size_t)IDS * 8 + (size_t)IDS * DIM * 4;
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	uint64_t *ids = malloc(plen), sum = 0, back = 0;
	float *g = (float *)(ids + IDS);
	struct iovec iov[2] = {{ids, IDS * 8}, {g, (size_t)IDS * DIM * 4}};
	struct emb_frame_hdr h = {.opcode = OP_PUSH, .count = IDS};
	struct result r = {0};

	o.max_frame_bytes = (uint32_t)(EMB_WIRE_HDR_SIZE + plen);
	server_start(&s, &o);
	CU_ASSERT_FATAL(emb_transport_create("rdma", &o, &tr) == 0);
	c = dial(tr, &s);
	for (uint32_t i = 0; i < IDS; i++) {
		ids[i] = (uint64_t)i * 1000003u;
		sum += ids[i];
	}
	for (size_t i = 0; i < (size_t)IDS * DIM; i++)
		g[i] = (float)(i % 1000);
	for (int k = 0; k < 3; k++) {
		r = (struct result){0};
		back = 0;
		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, iov, 2, &back, 8,
						    on_done, &r),
				      0);
		pump(tr, s.tr, &r.done);
		CU_ASSERT_EQUAL(r.status, 0);
		CU_ASSERT_EQUAL(back, sum);
	}
	CU_ASSERT_EQUAL(s.bad_seen, 0);
	/* One byte more is refused before anything is sent. */
	iov[1].iov_len++;
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, iov, 2, &back, 8, on_done, &r),
			-EINVAL);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
	free(ids);
}

static void test_deep_pipeline(void)
{
	enum { N = 1000, DIM = 8 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	static uint32_t rows[N][64];
	static char resp[N][8 + 64 * DIM * 4 + 8];
	static struct result r[N];
	static struct iovec iov[N];
	struct emb_frame_hdr h = {.opcode = OP_ROWS, .count = DIM};
	size_t bad = 0;

	server_start(&s, NULL);
	region_fill(&s, 0, 4096, DIM);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	memset(r, 0, sizeof(r));
	for (uint32_t i = 0; i < N; i++) {
		uint32_t n = 1 + i % 64;

		for (uint32_t k = 0; k < n; k++)
			rows[i][k] = (i * 64 + k) % 4096;
		iov[i] = (struct iovec){rows[i], n * 4};
		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, &iov[i], 1, resp[i],
						    sizeof(resp[i]), on_done,
						    &r[i]),
				      0);
	}
	for (uint32_t i = 0; i < N; i++) {
		uint32_t n = 1 + i % 64;
		const float *f = (const float *)(resp[i] + 8);

		pump(tr, s.tr, &r[i].done);
		CU_ASSERT_EQUAL(r[i].status, 0);
		for (uint32_t k = 0; k < n; k++)
			for (uint32_t j = 0; j < DIM; j++)
				bad += f[k * DIM + j] !=
				       row_value(0, rows[i][k], j);
	}
	CU_ASSERT_EQUAL(bad, 0);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

static void test_dropped_credit(void)
{
	enum { N = 80 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	struct emb_frame_hdr h = {.opcode = 77};
	struct emb_transport_stats st;
	struct result r[N];
	uint32_t rows[4] = {4, 3, 2, 1};
	char resp[8 + 4 * 4 * 4];

	server_start(&s, NULL);
	region_fill(&s, 0, 8, 4);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial_timeout(tr, &s, 500);
	/* The server drops them all: more than the credit window. */
	memset(r, 0, sizeof(r));
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, NULL, 0, NULL, 0,
						    on_done, &r[i]),
				      0);
	for (int i = 0; i < N; i++) {
		pump(tr, s.tr, &r[i].done);
		CU_ASSERT_EQUAL(r[i].status, -ETIMEDOUT);
	}
	emb_transport_stats(tr, &st);
	CU_ASSERT_EQUAL(st.calls_timed_out, N);
	/* Their credits came back: the conn still carries calls. */
	pull_check(tr, &s, c, 0, rows, 4, 4, resp, sizeof(resp));

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

static void test_late_response(void)
{
	enum { N = 2048, DIM = 16 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	size_t cap = 8 + (size_t)N * DIM * 4;
	char *late = malloc(cap), *resp = malloc(cap);
	struct emb_frame_hdr h = {.opcode = OP_HOLD};
	struct emb_frame_hdr rh = {.opcode = OP_HOLD | EMB_OP_RESPONSE_BIT};
	struct emb_transport_stats st;
	struct result r = {0};
	uint32_t rows[N];

	server_start(&s, NULL);
	region_fill(&s, 0, N, DIM);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial_timeout(tr, &s, 300);
	for (uint32_t i = 0; i < N; i++)
		rows[i] = i;
	memset(late, 0x77, cap);
	/* Plain resp buffer: the answer would land in bounce pages. */
	CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, NULL, 0, late, cap, on_done,
					    &r),
			      0);
	pump(tr, s.tr, &r.done);
	CU_ASSERT_EQUAL(r.status, -ETIMEDOUT);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s.held);
	/* The server answers after all, with 1 MiB WRITTEN to the bounce. */
	for (uint32_t i = 0; i < N; i++)
		s.iov[i] = (struct iovec){.iov_base = s.region[0] + i * DIM,
					  .iov_len = DIM * 4};
	CU_ASSERT_EQUAL(emb_conn_reply(s.held, &rh, s.iov, N, NULL, NULL), 0);
	s.held = NULL;
	for (int i = 0; i < 200; i++) {
		emb_transport_poll(s.tr, 0);
		emb_transport_poll(tr, 1);
		emb_transport_stats(tr, &st);
		if (st.resp_unmatched)
			break;
	}
	CU_ASSERT_EQUAL(st.resp_unmatched, 1);
	/* The caller's buffer was left alone, the conn still works. */
	for (size_t i = 0; i < cap; i++)
		if (late[i] != 0x77) {
			CU_FAIL("late response landed in the caller's buffer");
			break;
		}
	{
		struct emb_frame_hdr ph = {.opcode = OP_ROWS, .count = DIM};
		struct iovec iov = {rows, 64 * 4};
		struct result r2 = {0};

		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &ph, &iov, 1, resp, cap,
						    on_done, &r2),
				      0);
		pump(tr, s.tr, &r2.done);
		CU_ASSERT_EQUAL(r2.status, 0);
		CU_ASSERT_EQUAL(r2.hdr.payload_len, 8 + 64 * DIM * 4);
	}

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
	free(late);
	free(resp);
}

static void test_many_conns(void)
{
	enum { N = 40 };
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c[N];
	uint32_t rows[2] = {5, 6};
	char resp[8 + 2 * 4 * 4];

	/* Small frames keep 2 x 40 arenas small; the CQs must grow. */
	o.max_frame_bytes = 64u << 10;
	server_start(&s, &o);
	region_fill(&s, 0, 8, 4);
	CU_ASSERT_FATAL(emb_transport_create("rdma", &o, &tr) == 0);
	for (int i = 0; i < N; i++)
		c[i] = dial(tr, &s);
	for (int i = 0; i < N; i++)
		pull_check(tr, &s, c[i], 0, rows, 2, 4, resp, sizeof(resp));
	for (int i = 0; i < N; i++)
		emb_conn_destroy(c[i]);
	emb_transport_destroy(tr);
	server_stop(&s);
}

/* The child's completion: CUnit is not running in the child process, so
 * the callback must not assert (the server may answer before the kill). */
static void child_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	(void)ctx;
	(void)status;
	(void)resp;
}

/* The child of test_killed_client: connect, send a 1 MiB push, die. */
static int child_main(uint16_t port)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	size_t plen = 4096 * 8 + 4096 * 64 * 4;
	struct emb_transport *tr;
	struct emb_conn *c;
	uint64_t *buf = calloc(1, plen), back;
	struct iovec iov = {buf, plen};
	struct emb_frame_hdr h = {.opcode = OP_PUSH, .count = 4096};

	co.host = host;
	co.port = port;
	if (!buf || emb_transport_create("rdma", NULL, &tr) ||
	    emb_conn_create(tr, &co, &c))
		return 2;
	if (emb_conn_call(c, &h, &iov, 1, &back, 8, child_done, NULL))
		return 3;
	emb_transport_poll(tr, 0);
	kill(getpid(), SIGKILL);
	return 4;
}

static void test_killed_client(void)
{
	enum { N = 16, DIM = 16 };
	struct server s;
	struct emb_transport *tr;
	struct emb_conn *c;
	uint32_t rows[N];
	char resp[8 + N * DIM * 4];
	char port[8];
	pid_t pid;
	int st = 0;

	server_start(&s, NULL);
	region_fill(&s, 0, 64, DIM);
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	snprintf(port, sizeof(port), "%u", emb_listener_port(s.l));
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		/* A fresh process image: verbs state is not fork-safe. */
		execl("/proc/self/exe", "test_rdma", "--child", port, host,
		      (char *)NULL);
		_exit(5);
	}
	while (waitpid(pid, &st, WNOHANG) == 0) {
		emb_transport_poll(s.tr, 0);
		emb_transport_poll(tr, 0);
	}
	CU_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	/* The server notices the dead peer and keeps serving others. */
	while (s.closes < 1) {
		emb_transport_poll(s.tr, 10);
		emb_transport_poll(tr, 0);
	}
	/* Gone before or during the READ of its payload. */
	CU_ASSERT(s.last_reason == EMB_EPEERDEAD ||
		  s.last_reason == EMB_EQPERR);
	for (uint32_t i = 0; i < N; i++)
		rows[i] = i * 3;
	pull_check(tr, &s, c, 0, rows, N, DIM, resp, sizeof(resp));

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

/* ---- a raw verbs peer that speaks the handshake, then sends junk ------ */

struct raw {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	char buf[256];
};

static int raw_wait(struct raw *w, enum rdma_cm_event_type want,
		    struct server *s)
{
	struct rdma_cm_event *ev;
	int type;

	/* The server runs on this thread too: pump it while waiting. */
	while (rdma_get_cm_event(w->ch, &ev)) {
		if (errno != EAGAIN)
			return -errno;
		emb_transport_poll(s->tr, 0);
	}
	type = ev->event;
	rdma_ack_cm_event(ev);
	return type == (int)want ? 0 : -ECONNABORTED;
}

/* Connects with the given HELLO words; 0 once ESTABLISHED. */
static int raw_connect(struct raw *w, struct server *s, uint32_t magic)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *ai;
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4,
					      .max_recv_wr = 4,
					      .max_send_sge = 1,
					      .max_recv_sge = 1}};
	uint32_t hello[4] = {magic, 1u | (4u << 16), 4096, 1u << 20};
	struct rdma_conn_param prm = {.private_data = hello,
				      .private_data_len = sizeof(hello),
				      .retry_count = 7,
				      .rnr_retry_count = 7};
	char port[8];
	int rc;

	snprintf(port, sizeof(port), "%u", emb_listener_port(s->l));
	memset(w, 0, sizeof(*w));
	w->ch = rdma_create_event_channel();
	if (!w->ch || rdma_getaddrinfo(host, port, &hints, &ai))
		return -EINVAL;
	rdma_create_id(w->ch, &w->id, NULL, RDMA_PS_TCP);
	rc = rdma_resolve_addr(w->id, NULL, ai->ai_dst_addr, 2000);
	rdma_freeaddrinfo(ai);
	if (rc)
		return -errno;
	{
		int fl = fcntl(w->ch->fd, F_GETFL);

		fcntl(w->ch->fd, F_SETFL, fl | O_NONBLOCK);
	}
	if (raw_wait(w, RDMA_CM_EVENT_ADDR_RESOLVED, s) ||
	    rdma_resolve_route(w->id, 2000) ||
	    raw_wait(w, RDMA_CM_EVENT_ROUTE_RESOLVED, s) ||
	    rdma_create_qp(w->id, NULL, &qa))
		return -EIO;
	w->mr = ibv_reg_mr(w->id->qp->pd, w->buf, sizeof(w->buf),
			   IBV_ACCESS_LOCAL_WRITE);
	if (!w->mr || rdma_connect(w->id, &prm))
		return -EIO;
	return raw_wait(w, RDMA_CM_EVENT_ESTABLISHED, s);
}

static void raw_close(struct raw *w)
{
	if (w->id) {
		rdma_disconnect(w->id);
		if (w->mr)
			ibv_dereg_mr(w->mr);
		if (w->id->qp)
			rdma_destroy_qp(w->id);
		rdma_destroy_id(w->id);
	}
	if (w->ch)
		rdma_destroy_event_channel(w->ch);
}

/* Sends len bytes of w->buf as one SEND. */
static void raw_send(struct raw *w, uint32_t len)
{
	struct ibv_sge sge = {(uintptr_t)w->buf, len, w->mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;

	CU_ASSERT_EQUAL(ibv_post_send(w->id->qp, &wr, &bad), 0);
}

static void expect_close(struct server *s, int n, int reason)
{
	while (s->closes < n)
		emb_transport_poll(s->tr, 10);
	CU_ASSERT_EQUAL(s->last_reason, reason);
}

static void test_malformed(void)
{
	struct server s;
	struct raw w;
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = OP_ROWS};
	struct emb_transport_stats st;
	struct emb_transport *tr;
	struct emb_conn *c;
	uint32_t rows[4] = {1, 2, 3, 4};
	char resp[8 + 4 * 4 * 4];

	server_start(&s, NULL);
	region_fill(&s, 0, 8, 4);
	/* A bad HELLO is rejected: no conn opens. */
	CU_ASSERT(raw_connect(&w, &s, 0xdeadbeef) < 0);
	raw_close(&w);
	/* Bad frame magic closes that conn alone. */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&w, &s, 0x52424d45u), 0);
	h.magic = 0x12345678;
	w.buf[0] = 1; /* REQ_INLINE */
	memcpy(w.buf + 32, &h, sizeof(h));
	raw_send(&w, 64);
	expect_close(&s, 1, EMB_EBADMAGIC);
	raw_close(&w);
	/* A payload_len that disagrees with the bytes received. */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&w, &s, 0x52424d45u), 0);
	h.magic = EMB_WIRE_MAGIC;
	h.payload_len = 100;
	memcpy(w.buf + 32, &h, sizeof(h));
	raw_send(&w, 64 + 10);
	expect_close(&s, 2, EMB_EBADFRAME);
	raw_close(&w);
	/* Shorter than prefix and header. */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&w, &s, 0x52424d45u), 0);
	raw_send(&w, 20);
	expect_close(&s, 3, EMB_ETRUNCFRAME);
	raw_close(&w);
	/* An unknown message type. */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&w, &s, 0x52424d45u), 0);
	h.payload_len = 0;
	w.buf[0] = 99;
	memcpy(w.buf + 32, &h, sizeof(h));
	raw_send(&w, 64);
	expect_close(&s, 4, EMB_EBADFRAME);
	raw_close(&w);

	emb_transport_stats(s.tr, &st);
	CU_ASSERT_EQUAL(st.err_bad_magic, 1);
	/* A well-behaved client is still served. */
	CU_ASSERT_FATAL(emb_transport_create("rdma", NULL, &tr) == 0);
	c = dial(tr, &s);
	pull_check(tr, &s, c, 0, rows, 4, 4, resp, sizeof(resp));
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	server_stop(&s);
}

static const struct emb_test_case cases[] = {
	{"sends replies of 4096 and 16384 row iovecs", test_many_iovs},
	{"sends 16 KiB rows from registered and plain memory",
	 test_dim_4096},
	{"sends rows from memory registered after connect",
	 test_late_registration},
	{"moves a push of max_frame_bytes", test_max_frame_push},
	{"pipelines 1000 calls past the credit window", test_deep_pipeline},
	{"returns the credit of every request the server drops",
	 test_dropped_credit},
	{"parks a timed-out call until its late response",
	 test_late_response},
	{"grows the shared CQ for 40 conns on one loop", test_many_conns},
	{"keeps serving when a client is killed mid-request",
	 test_killed_client},
	{"closes only the conn that sends a malformed frame", test_malformed},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	struct emb_transport *tr = NULL;
	const char *ip = getenv("RDMA_VM_IP");
	int rc;

	if (ip && *ip)
		host = ip;
	if (argc == 4 && strcmp(argv[1], "--child") == 0) {
		host = argv[3];
		return child_main((uint16_t)atoi(argv[2]));
	}
	if (argc > 1 && strcmp(argv[1], "rdma") == 0) {
		argv[1] = argv[0];
		argc--;
		argv++;
	}
	if (!emb_transport_available("rdma")) {
		fprintf(stderr, "test_rdma: rdma transport not built in\n");
		return 77;
	}
	rc = emb_transport_create("rdma", NULL, &tr);
	if (rc) {
		fprintf(stderr, "test_rdma: no RDMA device (%s): skipped\n",
			emb_strerror(rc));
		return 77;
	}
	emb_transport_destroy(tr);
	return emb_test_main(argc, argv, "transport/rdma", cases);
}
