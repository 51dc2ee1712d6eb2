/*
 * tests/transport/test_conformance.c - what every transport must do, run
 * against the transport named by $EMB_TEST_TRANSPORT (default "tcp"). Exits
 * 77 (skip) when that transport is not built in or has no device.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "echo.h"
#include "harness.h"
#include "proto/wire.h"
#include "transport/transport.h"

static const char *tname = "tcp";

struct result {
	bool done;		  /* callback ran */
	int status;		  /* its status */
	struct emb_frame_hdr hdr; /* response header when status is 0 */
	int order;		  /* completion rank, from *seq */
	int *seq;		  /* shared completion counter, or NULL */
};

static void on_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct result *r = ctx;

	CU_ASSERT_FALSE(r->done); /* exactly once */
	r->done = true;
	r->status = status;
	if (resp)
		r->hdr = *resp;
	if (r->seq)
		r->order = (*r->seq)++;
}

static struct emb_transport *client_tr(const struct emb_transport_opts *o)
{
	struct emb_transport *tr = NULL;

	CU_ASSERT_FATAL(emb_transport_create(tname, o, &tr) == 0);
	return tr;
}

static struct emb_conn *dial(struct emb_transport *tr, uint16_t port,
			     uint32_t timeout_ms)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_conn *c = NULL;

	co.port = port;
	co.call_timeout_ms = timeout_ms;
	CU_ASSERT_FATAL(emb_conn_create(tr, &co, &c) == 0);
	return c;
}

static struct echo_server *serve(unsigned nloops,
				 const struct emb_transport_opts *o)
{
	struct echo_server *s = NULL;

	CU_ASSERT_FATAL(echo_start(tname, nloops, o, &s) == 0);
	return s;
}

/* Polls until every result is done; call deadlines bound the wait. */
static void wait_all(struct emb_transport *tr, struct result *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		while (!r[i].done)
			emb_transport_poll(tr, 100);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131u + i * 17u + (i >> 8));
}

static void test_small_frames(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	uint8_t req[2000], resp[2000];
	struct emb_frame_hdr h, rh;
	struct iovec iov[3];

	for (unsigned i = 0; i < 200; i++) {
		size_t len = (i * 37u) % sizeof(req);

		fill(req, len, i);
		h = (struct emb_frame_hdr){.opcode = ECHO_OP_ECHO,
					   .flags = 3,
					   .table_id = i,
					   .count = (uint32_t)len};
		iov[0] = (struct iovec){.iov_base = req, .iov_len = len / 3};
		iov[1] =
		    (struct iovec){.iov_base = req + len / 3, .iov_len = 0};
		iov[2] = (struct iovec){.iov_base = req + len / 3,
					.iov_len = len - len / 3};
		memset(resp, 0, sizeof(resp));
		CU_ASSERT_EQUAL_FATAL(
		    emb_conn_call_sync(c, &h, iov, 3, resp, sizeof(resp), &rh),
		    0);
		CU_ASSERT_EQUAL(rh.magic, EMB_WIRE_MAGIC);
		CU_ASSERT_EQUAL(rh.opcode, ECHO_OP_ECHO | EMB_OP_RESPONSE_BIT);
		CU_ASSERT_EQUAL(rh.flags, 3);
		CU_ASSERT_EQUAL(rh.table_id, i);
		CU_ASSERT_EQUAL(rh.payload_len, len);
		CU_ASSERT_EQUAL(rh.status, 0);
		CU_ASSERT(memcmp(req, resp, len) == 0);
	}
	/* No payload at all, and no response buffer. */
	h = (struct emb_frame_hdr){.opcode = ECHO_OP_ECHO, .count = 7};
	CU_ASSERT_EQUAL(emb_conn_call_sync(c, &h, NULL, 0, NULL, 0, &rh), 0);
	CU_ASSERT_EQUAL(rh.payload_len, 0);
	CU_ASSERT_EQUAL(rh.count, 7);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_big_frames(void)
{
	size_t len = 4u << 20;
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 20000);
	uint8_t *req = malloc(len), *resp = malloc(ECHO_BIG_MAX);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, rh;
	struct iovec iov = {.iov_base = req, .iov_len = len};
	size_t bad = 0;

	CU_ASSERT_FATAL(req && resp);
	for (unsigned i = 0; i < 3; i++) {
		fill(req, len, i + 1);
		memset(resp, 0, len);
		CU_ASSERT_EQUAL_FATAL(
		    emb_conn_call_sync(c, &h, &iov, 1, resp, len, &rh), 0);
		CU_ASSERT_EQUAL(rh.payload_len, len);
		CU_ASSERT(memcmp(req, resp, len) == 0);
	}
	h = (struct emb_frame_hdr){.opcode = ECHO_OP_BIG,
				   .count = ECHO_BIG_MAX};
	CU_ASSERT_EQUAL_FATAL(
	    emb_conn_call_sync(c, &h, NULL, 0, resp, ECHO_BIG_MAX, &rh), 0);
	CU_ASSERT_EQUAL(rh.payload_len, ECHO_BIG_MAX);
	for (size_t i = 0; i < ECHO_BIG_MAX; i++)
		bad += resp[i] != echo_pattern(i);
	CU_ASSERT_EQUAL(bad, 0);

	free(req);
	free(resp);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_three_servers(void)
{
	struct echo_server *s[3];
	struct emb_conn *c[3];
	struct emb_transport *tr = client_tr(NULL);
	struct result r[3][10];
	uint32_t req[3][10], resp[3][10];
	struct iovec iov[3][10];
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};

	memset(r, 0, sizeof(r));
	for (int k = 0; k < 3; k++) {
		s[k] = serve(1, NULL);
		c[k] = dial(tr, echo_port(s[k]), 10000);
	}
	for (int i = 0; i < 10; i++) {
		for (int k = 0; k < 3; k++) {
			req[k][i] = (uint32_t)(k * 1000 + i);
			resp[k][i] = 0;
			iov[k][i] = (struct iovec){.iov_base = &req[k][i],
						   .iov_len = 4};
			h.table_id = (uint32_t)k;
			CU_ASSERT_EQUAL_FATAL(
			    emb_conn_call(c[k], &h, &iov[k][i], 1, &resp[k][i],
					  4, on_done, &r[k][i]),
			    0);
		}
	}
	for (int k = 0; k < 3; k++) {
		wait_all(tr, r[k], 10);
		for (int i = 0; i < 10; i++) {
			CU_ASSERT_EQUAL(r[k][i].status, 0);
			CU_ASSERT_EQUAL(r[k][i].hdr.table_id, (uint32_t)k);
			CU_ASSERT_EQUAL(resp[k][i], req[k][i]);
		}
	}
	for (int k = 0; k < 3; k++) {
		emb_conn_destroy(c[k]);
		echo_stop(s[k]);
	}
	emb_transport_destroy(tr);
}

#define NTHREADS	 4
#define CALLS_PER_THREAD 400
#define WINDOW		 16

struct client_job {
	uint16_t port; /* server to call */
	unsigned id;   /* thread number */
	int errors;    /* mismatches and failures seen */
};

static void *client_thread(void *arg)
{
	struct client_job *j = arg;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_transport *tr = NULL;
	struct emb_conn *c = NULL;
	struct result r[WINDOW];
	uint64_t req[WINDOW][32], resp[WINDOW][32];
	struct iovec iov[WINDOW];
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	unsigned posted = 0, checked = 0;

	co.port = j->port;
	if (emb_transport_create(tname, NULL, &tr) ||
	    emb_conn_create(tr, &co, &c)) {
		j->errors++;
		emb_transport_destroy(tr);
		return NULL;
	}
	memset(r, 0, sizeof(r));
	/* Slot k carries calls k, k + WINDOW, ...; keep every slot busy. */
	while (checked < CALLS_PER_THREAD) {
		while (posted < CALLS_PER_THREAD && posted - checked < WINDOW) {
			unsigned k = posted % WINDOW;
			size_t n = 1 + posted % 32;

			for (size_t w = 0; w < n; w++)
				req[k][w] = ((uint64_t)j->id << 48) |
					    ((uint64_t)posted << 8) | w;
			iov[k] = (struct iovec){.iov_base = req[k],
						.iov_len = n * 8};
			r[k] = (struct result){0};
			h.count = posted;
			if (emb_conn_call(c, &h, &iov[k], 1, resp[k],
					  sizeof(resp[k]), on_done, &r[k])) {
				j->errors++;
				goto out;
			}
			posted++;
		}
		unsigned k = checked % WINDOW;

		while (!r[k].done)
			emb_transport_poll(tr, 100);
		if (r[k].status || r[k].hdr.count != checked ||
		    memcmp(req[k], resp[k], r[k].hdr.payload_len) ||
		    r[k].hdr.payload_len != iov[k].iov_len)
			j->errors++;
		checked++;
	}
out:
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	return NULL;
}

static void test_threads(void)
{
	struct echo_server *s = serve(2, NULL);
	struct client_job jobs[NTHREADS];
	pthread_t th[NTHREADS];
	struct emb_transport_stats st;

	for (unsigned i = 0; i < NTHREADS; i++) {
		jobs[i] = (struct client_job){.port = echo_port(s), .id = i};
		CU_ASSERT_FATAL(
		    pthread_create(&th[i], NULL, client_thread, &jobs[i]) == 0);
	}
	for (unsigned i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(jobs[i].errors, 0);
	}
	echo_stats(s, &st);
	CU_ASSERT_EQUAL(st.frames_in, NTHREADS * CALLS_PER_THREAD);
	CU_ASSERT_EQUAL(st.conns_opened, NTHREADS);
	echo_stop(s);
}

static void test_pipelining(void)
{
	enum { N = 256 };
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	static uint8_t req[N][600], resp[N][600];
	struct result r[N];
	struct iovec iov[N];
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct emb_conn_stats cs;

	memset(r, 0, sizeof(r));
	memset(resp, 0, sizeof(resp));
	for (unsigned i = 0; i < N; i++) {
		fill(req[i], 64 + i * 2, i);
		iov[i] =
		    (struct iovec){.iov_base = req[i], .iov_len = 64 + i * 2};
		h.table_id = i;
		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, &iov[i], 1, resp[i],
						    sizeof(resp[i]), on_done,
						    &r[i]),
				      0);
	}
	emb_conn_stats(c, &cs);
	CU_ASSERT_EQUAL(cs.inflight, N);
	wait_all(tr, r, N);
	for (unsigned i = 0; i < N; i++) {
		CU_ASSERT_EQUAL(r[i].status, 0);
		CU_ASSERT_EQUAL(r[i].hdr.table_id, i);
		CU_ASSERT_EQUAL(r[i].hdr.payload_len, 64 + i * 2);
		CU_ASSERT(memcmp(req[i], resp[i], 64 + i * 2) == 0);
	}
	emb_conn_stats(c, &cs);
	CU_ASSERT_EQUAL(cs.inflight, 0);
	CU_ASSERT_EQUAL(cs.frames_out, N);
	CU_ASSERT_EQUAL(cs.frames_in, N);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_out_of_order(void)
{
	enum { N = 16 };
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	uint32_t req[N], resp[N];
	struct result r[N];
	struct iovec iov[N];
	struct emb_frame_hdr h = {.opcode = ECHO_OP_REV, .table_id = N};
	int seq = 0;

	memset(r, 0, sizeof(r));
	for (unsigned i = 0; i < N; i++) {
		req[i] = 0xabc000 + i;
		resp[i] = 0;
		r[i].seq = &seq;
		iov[i] = (struct iovec){.iov_base = &req[i], .iov_len = 4};
		h.count = i;
		CU_ASSERT_EQUAL_FATAL(emb_conn_call(c, &h, &iov[i], 1, &resp[i],
						    4, on_done, &r[i]),
				      0);
	}
	wait_all(tr, r, N);
	for (unsigned i = 0; i < N; i++) {
		CU_ASSERT_EQUAL(r[i].status, 0);
		CU_ASSERT_EQUAL(r[i].hdr.count, i);
		CU_ASSERT_EQUAL(resp[i], req[i]);
		/* The server answered newest first. */
		CU_ASSERT_EQUAL(r[i].order, (int)(N - 1 - i));
	}
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_resp_too_big(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_BIG, .count = 300000}, rh;
	uint8_t small[1000];
	uint32_t v = 77, back = 0;
	struct iovec iov = {.iov_base = &v, .iov_len = 4};
	struct result r[2] = {{0}, {0}};
	struct emb_transport_stats st;

	CU_ASSERT_EQUAL(
	    emb_conn_call_sync(c, &h, NULL, 0, small, sizeof(small), &rh),
	    EMB_ERESPTOOBIG);
	/* The conn stays usable, also for a call queued right behind. */
	CU_ASSERT_EQUAL(
	    emb_conn_call(c, &h, NULL, 0, small, sizeof(small), on_done, &r[0]),
	    0);
	h = (struct emb_frame_hdr){.opcode = ECHO_OP_ECHO};
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, &iov, 1, &back, 4, on_done, &r[1]),
			0);
	wait_all(tr, r, 2);
	CU_ASSERT_EQUAL(r[0].status, EMB_ERESPTOOBIG);
	CU_ASSERT_EQUAL(r[1].status, 0);
	CU_ASSERT_EQUAL(back, 77);
	emb_transport_stats(tr, &st);
	CU_ASSERT_EQUAL(st.resp_too_big, 2);
	CU_ASSERT_EQUAL(st.conns_closed, 0);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_timeout(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	/* Long enough that the echo below never times out on a busy box. */
	struct emb_conn *c = dial(tr, echo_port(s), 1000);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_SINK}, rh;
	uint32_t v = 5, back = 0;
	struct iovec iov = {.iov_base = &v, .iov_len = 4};
	struct emb_transport_stats st;

	CU_ASSERT_EQUAL(emb_conn_call_sync(c, &h, &iov, 1, &back, 4, &rh),
			-ETIMEDOUT);
	h.opcode = ECHO_OP_ECHO;
	CU_ASSERT_EQUAL(emb_conn_call_sync(c, &h, &iov, 1, &back, 4, &rh), 0);
	CU_ASSERT_EQUAL(back, 5);
	emb_transport_stats(tr, &st);
	CU_ASSERT_EQUAL(st.calls_timed_out, 1);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

struct close_seen {
	int n;	    /* on_close calls */
	int reason; /* last reason */
};

static void on_conn_close(void *arg, struct emb_conn *c, int reason)
{
	struct close_seen *cs = arg;

	(void)c;
	cs->n++;
	cs->reason = reason;
}

static void test_server_gone(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct close_seen seen = {0};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_SINK};
	struct result r[4];
	struct emb_conn *c = NULL;

	co.port = echo_port(s);
	co.on_close = on_conn_close;
	co.arg = &seen;
	CU_ASSERT_FATAL(emb_conn_create(tr, &co, &c) == 0);
	memset(r, 0, sizeof(r));
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(
		    emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[i]), 0);
	/* Let the requests reach the server, then take it away. */
	for (int i = 0; i < 20; i++)
		emb_transport_poll(tr, 10);
	echo_stop(s);
	wait_all(tr, r, 4);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(r[i].status, EMB_EPEERDEAD);
	CU_ASSERT_EQUAL(seen.n, 1);
	CU_ASSERT_EQUAL(seen.reason, EMB_EPEERDEAD);
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[0]),
			EMB_ECLOSED);
	emb_conn_destroy(c);
	CU_ASSERT_EQUAL(seen.n, 1); /* a local destroy is no news */
	emb_transport_destroy(tr);
}

static void test_client_leaves(void)
{
	size_t len = 4u << 20;
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *a = dial(tr, echo_port(s), 10000);
	struct emb_conn *b = dial(tr, echo_port(s), 10000);
	uint8_t *big = malloc(len);
	struct iovec iov = {.iov_base = big, .iov_len = len};
	/*
	 * The big frames go to SINK: never answered, so however fast the
	 * peer (a whole 4 MiB frame can go out and come back within one poll
	 * on some machines), both calls are still pending at the destroy.
	 */
	struct emb_frame_hdr sink = {.opcode = ECHO_OP_SINK};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, rh;
	struct result r[2] = {{0}, {0}};
	struct emb_transport_stats st;
	uint32_t v = 9, back = 0;
	struct iovec small = {.iov_base = &v, .iov_len = 4};

	CU_ASSERT_FATAL(big != NULL);
	memset(big, 1, len);
	CU_ASSERT_EQUAL(
	    emb_conn_call(a, &sink, &iov, 1, NULL, 0, on_done, &r[0]), 0);
	CU_ASSERT_EQUAL(
	    emb_conn_call(a, &sink, &iov, 1, NULL, 0, on_done, &r[1]), 0);
	emb_transport_poll(tr, 0); /* part of the first frame goes out */
	emb_conn_destroy(a);
	CU_ASSERT(r[0].done && r[1].done);
	CU_ASSERT_EQUAL(r[0].status, EMB_ECLOSED);
	CU_ASSERT_EQUAL(r[1].status, EMB_ECLOSED);

	for (int i = 0; i < 50; i++) {
		CU_ASSERT_EQUAL(
		    emb_conn_call_sync(b, &h, &small, 1, &back, 4, &rh), 0);
	}
	CU_ASSERT_EQUAL(back, 9);
	for (int i = 0; i < 500; i++) {
		echo_stats(s, &st);
		if (st.conns_closed >= 1)
			break;
		usleep(10000);
	}
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	CU_ASSERT_EQUAL(emb_conn_call_sync(b, &h, &small, 1, &back, 4, &rh), 0);

	free(big);
	emb_conn_destroy(b);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void never_request(void *arg, struct emb_conn *c, struct emb_req *r,
			  const struct emb_frame_hdr *h, void *payload)
{
	(void)arg;
	(void)c;
	(void)h;
	(void)payload;
	CU_FAIL("no request expected");
	emb_req_release(r);
}

static void test_refused(void)
{
	struct emb_transport *tr = client_tr(NULL);
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_listener *l = NULL;
	struct emb_conn *c = NULL;

	/* Borrow a free port, then let it go. */
	lo.on_request = never_request;
	CU_ASSERT_FATAL(emb_listener_create(tr, &lo, &l) == 0);
	co.port = emb_listener_port(l);
	emb_listener_destroy(l);
	CU_ASSERT_EQUAL(emb_conn_create(tr, &co, &c), -ECONNREFUSED);
	CU_ASSERT_PTR_NULL(c);
	emb_transport_destroy(tr);
}

static void test_bad_args(void)
{
	struct emb_transport *tr = NULL;
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_listener *l = NULL;
	struct echo_server *s = serve(1, NULL);
	struct emb_conn *c;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct result r = {0};

	CU_ASSERT_EQUAL(emb_transport_create("carrier-pigeon", NULL, &tr),
			-EINVAL);
	CU_ASSERT_PTR_NULL(tr);
	if (!emb_transport_available("rdma"))
		CU_ASSERT_EQUAL(emb_transport_create("rdma", NULL, &tr),
				-ENODEV);
	CU_ASSERT_PTR_NULL(tr);
	CU_ASSERT_FALSE(emb_transport_available("carrier-pigeon"));
	CU_ASSERT_TRUE(emb_transport_available("tcp"));

	{
		struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;

		o.copy_max_bytes = (64u << 10) + 1;
		CU_ASSERT_EQUAL(emb_transport_create(tname, &o, &tr), -EINVAL);
		o = EMB_TRANSPORT_OPTS_DEFAULT;
		o.max_frame_bytes = 16;
		CU_ASSERT_EQUAL(emb_transport_create(tname, &o, &tr), -EINVAL);
	}
	tr = client_tr(NULL);
	CU_ASSERT_STRING_EQUAL(emb_transport_name(tr), tname);
	CU_ASSERT_EQUAL(emb_listener_create(tr, &lo, &l), -EINVAL);
	c = dial(tr, echo_port(s), 10000);
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, -1, NULL, 0, on_done, &r),
			-EINVAL);
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, NULL, NULL),
			-EINVAL);
	CU_ASSERT_EQUAL(emb_conn_call(c, NULL, NULL, 0, NULL, 0, on_done, &r),
			-EINVAL);
	CU_ASSERT_FALSE(r.done);
	emb_conn_destroy(c);
	emb_conn_destroy(NULL);
	emb_listener_destroy(NULL);
	emb_transport_destroy(NULL);
	emb_transport_destroy(tr);
	echo_stop(s);
}

/*
 * max calls go out on one conn, the next is refused with EMB_ENOCREDIT,
 * and once they are answered the slots serve again, twice over. A client
 * conn makes its slots as calls need them (tcp.c, calls_grow()): 4 is a
 * short first chunk, 200 crosses three chunks of 64 into a short one.
 */
static void no_credit_at(uint32_t max)
{
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr;
	struct emb_conn *c;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct result *r = calloc(2 * (size_t)max + 1, sizeof(*r));
	uint32_t failed = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	o.max_inflight = max;
	tr = client_tr(&o);
	c = dial(tr, echo_port(s), 10000);
	/* A refused call never completes: only those posted are waited
	 * for, so a bug fails here rather than hangs. */
	for (uint32_t round = 0; round < 2; round++) {
		struct result *q = &r[round * (size_t)max];
		uint32_t posted = 0;

		while (posted < max &&
		       emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done,
				     &q[posted]) == 0)
			posted++;
		CU_ASSERT_EQUAL(posted, max);
		if (round == 0)
			CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0,
						      on_done, &r[2 * max]),
					EMB_ENOCREDIT);
		wait_all(tr, q, posted);
		for (uint32_t i = 0; i < posted; i++)
			failed += q[i].status != 0;
	}
	CU_ASSERT_EQUAL(failed, 0);
	CU_ASSERT_FALSE(r[2 * max].done);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
	free(r);
}

static void test_no_credit(void)
{
	no_credit_at(4);
	no_credit_at(200);
}

static void test_rows_zero_copy(void)
{
	enum { N = 4096 };
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ROWS}, rh;
	size_t rows_bytes = (size_t)N * ECHO_ROW_FLOATS * sizeof(float);
	uint64_t *ids;
	float *rows;
	struct emb_mr *ids_mr = NULL, *rows_mr = NULL;
	struct iovec iov;
	size_t bad = 0;

	CU_ASSERT_FATAL(emb_transport_buf_alloc(tr, N * sizeof(*ids),
						(void **)&ids, &ids_mr) == 0);
	CU_ASSERT_FATAL(emb_transport_buf_alloc(tr, rows_bytes, (void **)&rows,
						&rows_mr) == 0);
	for (uint64_t i = 0; i < N; i++)
		ids[i] = i * 2654435761u;
	iov = (struct iovec){.iov_base = ids, .iov_len = N * sizeof(*ids)};
	CU_ASSERT_EQUAL_FATAL(
	    emb_conn_call_sync(c, &h, &iov, 1, rows, rows_bytes, &rh), 0);
	CU_ASSERT_EQUAL(rh.count, N);
	CU_ASSERT_EQUAL(rh.payload_len, rows_bytes);
	for (size_t i = 0; i < N; i++)
		for (unsigned j = 0; j < ECHO_ROW_FLOATS; j++)
			bad += rows[i * ECHO_ROW_FLOATS + j] !=
			       echo_row_value(ids[i], j);
	CU_ASSERT_EQUAL(bad, 0);

	emb_transport_buf_free(tr, ids, ids_mr);
	emb_transport_buf_free(tr, rows, rows_mr);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_fault_send(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct result r[4];

	memset(r, 0, sizeof(r));
	emb_transport_fault_set(tr, EMB_FAULT_SEND, 3, -EIO);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(
		    emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[i]),
		    i == 2 ? -EIO : 0);
	for (int i = 0; i < 4; i++)
		if (i != 2)
			wait_all(tr, &r[i], 1);
	for (int i = 0; i < 20; i++)
		emb_transport_poll(tr, 0);
	CU_ASSERT_FALSE(r[2].done); /* a failed post never calls back */
	CU_ASSERT_EQUAL(r[3].status, 0);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_fault_reg(void)
{
	struct emb_transport *tr = client_tr(NULL);
	struct emb_mr *mr = NULL;
	void *p = NULL;
	char x;

	emb_transport_fault_set(tr, EMB_FAULT_REG, 1, -ENOMEM);
	CU_ASSERT_EQUAL(emb_transport_buf_alloc(tr, 100, &p, &mr), -ENOMEM);
	CU_ASSERT_PTR_NULL(p);
	CU_ASSERT_EQUAL(emb_transport_buf_alloc(tr, 100, &p, &mr), 0);
	CU_ASSERT_PTR_NOT_NULL(mr);
	emb_transport_buf_free(tr, p, mr);

	emb_transport_fault_set(tr, EMB_FAULT_REG, 2, -EFAULT);
	CU_ASSERT_EQUAL(emb_transport_reg_mem(tr, &x, 1, &mr), 0);
	emb_transport_dereg_mem(tr, mr);
	CU_ASSERT_EQUAL(emb_transport_reg_mem(tr, &x, 1, &mr), -EFAULT);
	CU_ASSERT_EQUAL(emb_transport_reg_mem(tr, NULL, 1, &mr), -EINVAL);
	emb_transport_dereg_mem(tr, NULL);
	emb_transport_destroy(tr);
}

static void test_fault_connect_listen(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_listener *l = NULL;
	struct emb_conn *c = NULL;

	co.port = echo_port(s);
	emb_transport_fault_set(tr, EMB_FAULT_CONNECT, 1, -EHOSTUNREACH);
	CU_ASSERT_EQUAL(emb_conn_create(tr, &co, &c), -EHOSTUNREACH);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(emb_conn_create(tr, &co, &c), 0);
	emb_conn_destroy(c);

	lo.on_request = never_request;
	emb_transport_fault_set(tr, EMB_FAULT_LISTEN, 1, -EADDRINUSE);
	CU_ASSERT_EQUAL(emb_listener_create(tr, &lo, &l), -EADDRINUSE);
	CU_ASSERT_PTR_NULL(l);
	CU_ASSERT_EQUAL(emb_listener_create(tr, &lo, &l), 0);
	emb_listener_destroy(l);

	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_fault_io(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct close_seen seen = {0};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct result r[3];
	struct emb_transport_stats st;
	struct emb_conn *c = NULL;

	co.port = echo_port(s);
	co.on_close = on_conn_close;
	co.arg = &seen;
	CU_ASSERT_FATAL(emb_conn_create(tr, &co, &c) == 0);
	memset(r, 0, sizeof(r));
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[0]),
			0);
	wait_all(tr, r, 1);
	CU_ASSERT_EQUAL(r[0].status, 0);

	emb_transport_fault_set(tr, EMB_FAULT_IO, 1, -EIO);
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[1]),
			0);
	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r[2]),
			0);
	wait_all(tr, &r[1], 2);
	CU_ASSERT_EQUAL(r[1].status, -EIO);
	CU_ASSERT_EQUAL(r[2].status, -EIO);
	CU_ASSERT_EQUAL(seen.n, 1);
	CU_ASSERT_EQUAL(seen.reason, -EIO);
	emb_transport_stats(tr, &st);
	CU_ASSERT_EQUAL(st.err_io, 1);
	CU_ASSERT_EQUAL(st.conns_closed, 1);

	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(s);
}

/* A loop in its own thread; the test thread reaches it with tasks. */
struct bg {
	struct emb_transport *tr;
	struct emb_conn *conn;
	uint16_t port;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stage;	  /* tasks completed */
	int status;	  /* last status */
	uint32_t in, out; /* request and response payload */
	struct iovec iov;
};

static void bg_signal(struct bg *b, int status)
{
	pthread_mutex_lock(&b->lock);
	b->status = status;
	b->stage++;
	pthread_cond_signal(&b->cond);
	pthread_mutex_unlock(&b->lock);
}

static void bg_wait(struct bg *b, int stage)
{
	pthread_mutex_lock(&b->lock);
	while (b->stage < stage)
		pthread_cond_wait(&b->cond, &b->lock);
	pthread_mutex_unlock(&b->lock);
}

static void bg_connect(void *arg)
{
	struct bg *b = arg;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;

	co.port = b->port;
	bg_signal(b, emb_conn_create(b->tr, &co, &b->conn));
}

static void bg_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	(void)resp;
	bg_signal(ctx, status);
}

static void bg_call(void *arg)
{
	struct bg *b = arg;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	int rc;

	b->iov = (struct iovec){.iov_base = &b->in, .iov_len = 4};
	rc = emb_conn_call(b->conn, &h, &b->iov, 1, &b->out, 4, bg_done, b);
	if (rc)
		bg_signal(b, rc);
}

static void bg_destroy(void *arg)
{
	struct bg *b = arg;

	emb_conn_destroy(b->conn);
	emb_transport_stop(b->tr);
}

static void *bg_main(void *arg)
{
	struct bg *b = arg;

	emb_transport_run(b->tr);
	return NULL;
}

static void test_background_loop(void)
{
	struct echo_server *s = serve(1, NULL);
	struct bg b = {.port = echo_port(s), .in = 4242};
	pthread_t th;

	pthread_mutex_init(&b.lock, NULL);
	pthread_cond_init(&b.cond, NULL);
	b.tr = client_tr(NULL);
	CU_ASSERT_FATAL(pthread_create(&th, NULL, bg_main, &b) == 0);
	CU_ASSERT_EQUAL(emb_transport_exec(b.tr, bg_connect, &b), 0);
	bg_wait(&b, 1);
	CU_ASSERT_EQUAL_FATAL(b.status, 0);
	CU_ASSERT_EQUAL(emb_transport_exec(b.tr, bg_call, &b), 0);
	bg_wait(&b, 2);
	CU_ASSERT_EQUAL(b.status, 0);
	CU_ASSERT_EQUAL(b.out, 4242);
	CU_ASSERT_EQUAL(emb_transport_exec(b.tr, bg_destroy, &b), 0);
	pthread_join(th, NULL);
	emb_transport_destroy(b.tr);
	pthread_cond_destroy(&b.cond);
	pthread_mutex_destroy(&b.lock);
	echo_stop(s);
}

static void test_spread(void)
{
	struct echo_server *s = serve(3, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c[6];
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, rh;
	struct emb_transport_stats st;

	for (int i = 0; i < 6; i++)
		c[i] = dial(tr, echo_port(s), 10000);
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(
		    emb_conn_call_sync(c[i], &h, NULL, 0, NULL, 0, &rh), 0);
	for (unsigned k = 0; k < 3; k++) {
		echo_loop_stats(s, k, &st);
		CU_ASSERT_EQUAL(st.conns_opened, 2);
		CU_ASSERT_EQUAL(st.frames_in, 2);
	}
	for (int i = 0; i < 6; i++)
		emb_conn_destroy(c[i]);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_late_reply(void)
{
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *c = dial(tr, echo_port(s), 10000);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_LATE};
	struct emb_transport_stats st;
	struct result r = {0};

	CU_ASSERT_EQUAL(emb_conn_call(c, &h, NULL, 0, NULL, 0, on_done, &r), 0);
	for (int i = 0; i < 1000; i++) {
		emb_transport_poll(tr, 10);
		echo_stats(s, &st);
		if (st.frames_in == 1)
			break;
	}
	CU_ASSERT_EQUAL(st.frames_in, 1);
	emb_conn_destroy(c);
	CU_ASSERT_EQUAL(r.status, EMB_ECLOSED);
	for (int i = 0; i < 1000 && echo_late_rc(s) == 1; i++)
		usleep(10000);
	CU_ASSERT_EQUAL(echo_late_rc(s), EMB_ECLOSED);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static void test_held_bound(void)
{
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	struct echo_server *s;
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *a, *b;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_SINK}, rh;
	struct emb_transport_stats st;
	struct result r[10];
	uint64_t last = 0;

	o.max_inflight = 4;
	s = serve(1, &o);
	a = dial(tr, echo_port(s), 10000);
	memset(r, 0, sizeof(r));
	for (int i = 0; i < 10; i++)
		CU_ASSERT_EQUAL(
		    emb_conn_call(a, &h, NULL, 0, NULL, 0, on_done, &r[i]), 0);
	/* Poll until the server's frame count settles. */
	for (int i = 0, still = 0; i < 1000 && still < 20; i++) {
		emb_transport_poll(tr, 10);
		echo_stats(s, &st);
		still = st.frames_in == last ? still + 1 : 0;
		last = st.frames_in;
	}
	CU_ASSERT_EQUAL(st.frames_in, 4);
	CU_ASSERT(st.rx_pauses >= 1);
	/* Another conn is not held up by it. */
	b = dial(tr, echo_port(s), 10000);
	h.opcode = ECHO_OP_ECHO;
	CU_ASSERT_EQUAL(emb_conn_call_sync(b, &h, NULL, 0, NULL, 0, &rh), 0);
	emb_conn_destroy(a);
	for (int i = 0; i < 10; i++)
		CU_ASSERT_EQUAL(r[i].status, EMB_ECLOSED);
	emb_conn_destroy(b);
	emb_transport_destroy(tr);
	echo_stop(s);
}

struct nested {
	struct emb_conn *other; /* conn the callback calls on */
	int calls;		/* callbacks run */
	int errors;		/* failed nested calls */
};

static void nested_done(void *ctx, int status, const struct emb_frame_hdr *r)
{
	struct nested *n = ctx;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, rh;
	uint32_t v = (uint32_t)n->calls, back = ~0u;
	struct iovec iov = {.iov_base = &v, .iov_len = 4};

	(void)r;
	n->calls++;
	/* A blocking call from inside a callback polls the loop again. */
	if (status ||
	    emb_conn_call_sync(n->other, &h, &iov, 1, &back, 4, &rh) ||
	    back != v)
		n->errors++;
}

static void test_nested_poll(void)
{
	enum { N = 8 };
	struct echo_server *s = serve(1, NULL);
	struct emb_transport *tr = client_tr(NULL);
	struct emb_conn *a = dial(tr, echo_port(s), 10000);
	struct nested n = {.other = dial(tr, echo_port(s), 10000)};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	uint64_t payload[N], back[N];
	struct iovec iov[N];

	for (int i = 0; i < N; i++) {
		payload[i] = (uint64_t)i;
		iov[i] = (struct iovec){.iov_base = &payload[i], .iov_len = 8};
		CU_ASSERT_EQUAL(emb_conn_call(a, &h, &iov[i], 1, &back[i], 8,
					      nested_done, &n),
				0);
	}
	while (n.calls < N)
		emb_transport_poll(tr, 100);
	CU_ASSERT_EQUAL(n.errors, 0);
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(back[i], payload[i]);
	emb_conn_destroy(a);
	emb_conn_destroy(n.other);
	emb_transport_destroy(tr);
	echo_stop(s);
}

static const struct emb_test_case cases[] = {
    {"round trips small frames", test_small_frames},
    {"round trips 4 MiB frames", test_big_frames},
    {"talks to three servers from one loop", test_three_servers},
    {"serves concurrent clients from several threads", test_threads},
    {"matches 256 pipelined responses by request id", test_pipelining},
    {"matches replies sent out of order", test_out_of_order},
    {"fails a response over resp_cap and keeps the conn", test_resp_too_big},
    {"times out a call the server never answers", test_timeout},
    {"fails pending calls when the server goes away", test_server_gone},
    {"keeps serving others when a client leaves mid-frame", test_client_leaves},
    {"refuses a connection to a closed port", test_refused},
    {"rejects bad arguments and unknown transports", test_bad_args},
    {"refuses calls past max_inflight", test_no_credit},
    {"serves rows straight from table memory", test_rows_zero_copy},
    {"fault hook fails the nth send", test_fault_send},
    {"fault hook fails registration and buf_alloc unwinds", test_fault_reg},
    {"fault hook fails connect and listen", test_fault_connect_listen},
    {"fault hook fails a socket write and the conn closes", test_fault_io},
    {"runs a client loop in a background thread", test_background_loop},
    {"spreads accepted conns across server loops", test_spread},
    {"fails a reply posted after its conn closed", test_late_reply},
    {"stops reading a conn that holds max_inflight requests", test_held_bound},
    {"lets a callback poll the loop again", test_nested_poll},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	struct emb_transport *tr = NULL;
	const char *env = getenv("EMB_TEST_TRANSPORT");
	int rc;

	if (env && *env)
		tname = env;
	if (!emb_transport_available(tname))
		return 77;
	rc = emb_transport_create(tname, NULL, &tr);
	if (rc == -ENODEV)
		return 77; /* built in, but no device here */
	emb_transport_destroy(tr);
	return emb_test_main(argc, argv, "transport", cases);
}
