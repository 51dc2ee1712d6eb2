/*
 * tests/worker/test_frames.c - a server facing peers that break the
 * protocol: malformed frames written byte by byte over raw TCP sockets, and
 * clients that vanish mid-request. Header errors must close the offending
 * connection, payload errors must be answered with the right status on a
 * connection that stays usable, and in every case a well-behaved client,
 * connected before and after, keeps being served.
 */
#include "server/server.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/authlimit.h"
#include "common/clock.h"
#include "common/err.h"
#include "proto/wire.h"
#include "proto/wire_many.h"
#include "proto/wire_msg.h"
#include "harness.h"
#include "netutil.h"
#include "worker/embstore.h"

#define MAX_IDS 64u
#define DIM 8u
#define BIG_DIM 1024u

struct fixture {
	struct emb_server *s;	     /* max_ids MAX_IDS, 1 MiB frames */
	uint16_t port;		     /* where it listens */
	struct emb_client *c;	     /* the well-behaved client */
	struct emb_client_table *t;  /* "t8", dim DIM */
	struct emb_client_table *tb; /* "t1k", dim BIG_DIM */
	uint32_t id8;		     /* server table id of "t8" */
	uint32_t id1k;		     /* server table id of "t1k" */
};

/* LIST_TABLES over a raw connection: the server's id of table name. */
static uint32_t raw_table_id(int fd, const char *name)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[16 * EMB_WIRE_LIST_ENTRY_SIZE];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_table_info info;
	struct emb_wire_list_resp lr;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 9,
					0);
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, resp, sizeof(resp)), 0);
	f.payload = resp;
	f.lim = &lim;
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_resp_decode(&f, &lr), 0);
	for (uint32_t i = 0; i < lr.n; i++) {
		emb_wire_list_entry(&lr, i, &info);
		if (strcmp(info.spec.name, name) == 0)
			return info.table_id;
	}
	CU_FAIL_FATAL("table not listed");
	return 0;
}

static void fx_setup(struct fixture *fx)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("t8", DIM, 1);
	struct emb_table_spec spb = nt_spec("t1k", BIG_DIM, 2);
	char addr[64];
	int fd;

	memset(fx, 0, sizeof(*fx));
	so.limits.max_ids = MAX_IDS;
	so.limits.max_frame_bytes = 1u << 20;
	fx->s = nt_server_start(&so);
	fx->port = emb_server_port(fx->s);
	nt_addr_list(addr, sizeof(addr), &fx->port, 1);
	fx->c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(fx->c, &sp, &fx->t), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(fx->c, &spb, &fx->tb),
			      0);
	fd = nt_raw_connect(fx->port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	fx->id8 = raw_table_id(fd, "t8");
	fx->id1k = raw_table_id(fd, "t1k");
	close(fd);
}

/*
 * The old client and a brand-new one are both served, and once the server
 * has noticed every closed peer only the old client's connection is open.
 */
static void fx_check_serving(struct fixture *fx)
{
	const uint64_t ids[3] = {1, 2, 3};
	struct emb_client_table *t2;
	struct emb_client *c2;
	float a[3 * DIM], b[3 * DIM];
	char addr[64];

	CU_ASSERT_EQUAL(emb_client_table_pull(fx->t, ids, 3, a, 0, NULL), 0);
	nt_addr_list(addr, sizeof(addr), &fx->port, 1);
	c2 = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c2, "t8", &t2), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t2, ids, 3, b, 0, NULL), 0);
	CU_ASSERT_EQUAL(memcmp(a, b, sizeof(a)), 0);
	emb_client_table_close(t2);
	emb_client_destroy(c2);
	CU_ASSERT_EQUAL(nt_server_wait_conns(fx->s, 1), 1);
}

static void fx_teardown(struct fixture *fx)
{
	emb_client_table_close(fx->t);
	emb_client_table_close(fx->tb);
	emb_client_destroy(fx->c);
	emb_server_destroy(fx->s);
}

/* A connection past HELLO. */
static int raw_ready(struct fixture *fx)
{
	int fd = nt_raw_connect(fx->port);

	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	return fd;
}

/* Sends hdr and payload[0..len), reads the response, returns its status. */
static int raw_call(int fd, struct emb_frame_hdr h, const void *payload,
		    size_t len)
{
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_frame_hdr r;
	int rc;

	emb_wire_hdr_encode(head, &h);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, head, sizeof(head)), 0);
	if (len)
		CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, payload, len), 0);
	rc = nt_raw_recv(fd, &r, resp, sizeof(resp));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL(r.req_id, h.req_id);
	CU_ASSERT_EQUAL(r.opcode, (h.opcode & 0x7f) | EMB_OP_RESPONSE_BIT);
	return r.status;
}

/* ---- header errors: the connection is closed ---- */

static void bad_header_closes(struct fixture *fx, const uint8_t *raw,
			      size_t len)
{
	int fd = raw_ready(fx);

	CU_ASSERT_EQUAL(nt_raw_send(fd, raw, len), 0);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);
}

static void test_bad_headers(void)
{
	_Alignas(8) uint8_t raw[EMB_WIRE_HDR_SIZE + 64];
	struct emb_frame_hdr h;
	struct fixture fx;

	fx_setup(&fx);
	/* Bad magic. */
	h = nt_hdr(EMB_OP_PING, 2, 0, 0, 0);
	emb_wire_hdr_encode(raw, &h);
	emb_le32_store(raw, 0x32424d45u);
	bad_header_closes(&fx, raw, EMB_WIRE_HDR_SIZE);
	/* Bad version. */
	emb_wire_hdr_encode(raw, &h);
	raw[4] = EMB_WIRE_VERSION + 1;
	bad_header_closes(&fx, raw, EMB_WIRE_HDR_SIZE);
	/* A length beyond the frame limit (1 MiB here). */
	h = nt_hdr(EMB_OP_PULL, 2, fx.id8, 1, 2u << 20);
	emb_wire_hdr_encode(raw, &h);
	bad_header_closes(&fx, raw, EMB_WIRE_HDR_SIZE + 8);
	/* A length beyond even the protocol's limit. */
	h = nt_hdr(EMB_OP_PULL, 2, fx.id8, 1, 0xfffffff0u);
	emb_wire_hdr_encode(raw, &h);
	bad_header_closes(&fx, raw, EMB_WIRE_HDR_SIZE);
	/* An opcode that is no opcode: the length still delimits the frame,
	 * so the server can say EMB_EBADOP before it hangs up. */
	{
		int fd = raw_ready(&fx);

		CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(99, 2, 0, 0, 8), raw, 8),
				EMB_EBADOP);
		CU_ASSERT(nt_raw_wait_closed(fd));
		close(fd);
	}
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* ---- truncated frames ---- */

static void test_truncated(void)
{
	_Alignas(8) uint8_t raw[EMB_WIRE_HDR_SIZE + 100 * 8];
	struct emb_frame_hdr h = nt_hdr(EMB_OP_PULL, 3, 0, 50, 50 * 8);
	struct fixture fx;
	int fd, quiet;

	fx_setup(&fx);
	h.table_id = fx.id8;
	memset(raw, 0, sizeof(raw));
	emb_wire_hdr_encode(raw, &h);

	/* Half a header, then the peer's write side closes. */
	fd = raw_ready(&fx);
	CU_ASSERT_EQUAL(nt_raw_send(fd, raw, EMB_WIRE_HDR_SIZE / 2), 0);
	shutdown(fd, SHUT_WR);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);

	/* A header and part of its payload, then EOF. */
	fd = raw_ready(&fx);
	CU_ASSERT_EQUAL(nt_raw_send(fd, raw, EMB_WIRE_HDR_SIZE + 120), 0);
	shutdown(fd, SHUT_WR);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);

	/* A partial frame left hanging: the server waits for the rest on
	 * that connection only and serves everyone else meanwhile. */
	quiet = raw_ready(&fx);
	CU_ASSERT_EQUAL(nt_raw_send(quiet, raw, EMB_WIRE_HDR_SIZE + 120), 0);
	CU_ASSERT_EQUAL(nt_server_wait_conns(fx.s, 2), 2);
	{
		const uint64_t ids[2] = {10, 11};
		float rows[2 * DIM];

		CU_ASSERT_EQUAL(emb_client_table_pull(fx.t, ids, 2, rows, 0,
						      NULL), 0);
	}
	close(quiet);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* ---- payload errors: answered, and the connection stays ---- */

static void test_payload_errors(void)
{
	uint64_t ids[MAX_IDS + 1];
	/* PUSH prefix + 2 ids + 2 rows of dim 4: whole rows of the wrong
	 * dim for the dim-8 table. */
	_Alignas(8) uint8_t push[16 + 2 * 8 + 2 * 4 * 4];
	_Alignas(8) uint8_t ping[8] = "ping-me";
	_Alignas(8) uint8_t echo[16];
	struct emb_frame_hdr h, r;
	struct fixture fx;
	int fd;

	fx_setup(&fx);
	for (uint32_t i = 0; i <= MAX_IDS; i++)
		ids[i] = i;
	memset(push, 0, sizeof(push));
	emb_le64_store(push + 16, 1);
	emb_le64_store(push + 24, 2);
	fd = raw_ready(&fx);

	/* Unknown table. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PULL, 10, 77, 2, 16), ids,
				 16), EMB_ENOTABLE);
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PUSH, 11, 77, 2,
					    sizeof(push)), push, sizeof(push)),
			EMB_ENOTABLE);
	/* A PUSH sized for dim 4 sent to a dim-8 table. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PUSH, 12, fx.id8, 2,
					    sizeof(push)), push, sizeof(push)),
			EMB_EBADDIM);
	/* The same payload is no whole number of rows for count 5. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PUSH, 13, fx.id8, 5,
					    sizeof(push)), push, sizeof(push)),
			EMB_EBADFRAME);
	/* More ids than max_ids, in a frame that is otherwise fine. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PULL, 14, fx.id8,
					    MAX_IDS + 1, (MAX_IDS + 1) * 8),
				 ids, (MAX_IDS + 1) * 8), EMB_ETOOMANYIDS);
	/* A count that disagrees with the payload. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PULL, 15, fx.id8, 3, 16),
				 ids, 16), EMB_EBADFRAME);
	/* An opcode reserved for a later version. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_EVICT, 16, fx.id8, 0, 0),
				 NULL, 0), -EOPNOTSUPP);
	/* A response sent to the server. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PING | EMB_OP_RESPONSE_BIT,
					    17, 0, 0, 0), NULL, 0),
			EMB_EBADFRAME);
	/* A second HELLO with a bad layout. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_HELLO, 18, 0, 0, 4), ids,
				 4), EMB_EBADFRAME);

	/* Still the same connection, still in step. */
	h = nt_hdr(EMB_OP_PING, 19, 0, 0, sizeof(ping));
	{
		_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];

		emb_wire_hdr_encode(head, &h);
		CU_ASSERT_EQUAL(nt_raw_send(fd, head, sizeof(head)), 0);
		CU_ASSERT_EQUAL(nt_raw_send(fd, ping, sizeof(ping)), 0);
	}
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &r, echo, sizeof(echo)), 0);
	CU_ASSERT_EQUAL(r.status, 0);
	CU_ASSERT_EQUAL(r.req_id, 19);
	CU_ASSERT_EQUAL(r.payload_len, sizeof(ping));
	CU_ASSERT_EQUAL(memcmp(echo, ping, sizeof(ping)), 0);
	/* And a valid PULL of max_ids ids is served on it. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PULL, 20, fx.id8, MAX_IDS,
					    MAX_IDS * 8), ids, MAX_IDS * 8), 0);
	close(fd);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* What a raw client gets that the library would never send: duplicates. */
static void test_raw_duplicates(void)
{
	const uint64_t ids[6] = {40, 41, 40, 40, 42, 41};
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	_Alignas(8) float rows[6 * DIM];
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_frame_hdr h, r;
	struct fixture fx;
	float want[DIM];
	int fd;

	fx_setup(&fx);
	fd = raw_ready(&fx);
	h = nt_hdr(EMB_OP_PULL, 30, fx.id8, 6, sizeof(ids));
	emb_wire_hdr_encode(head, &h);
	CU_ASSERT_EQUAL(nt_raw_send(fd, head, sizeof(head)), 0);
	CU_ASSERT_EQUAL(nt_raw_send(fd, ids, sizeof(ids)), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &r, rows, sizeof(rows)), 0);
	CU_ASSERT_EQUAL(r.status, 0);
	CU_ASSERT_EQUAL(r.count, 6);
	CU_ASSERT_EQUAL(r.payload_len, sizeof(rows));
	/* Every copy of an id carries the same row, created once. */
	CU_ASSERT_EQUAL(memcmp(rows + 2 * DIM, rows, sizeof(want)), 0);
	CU_ASSERT_EQUAL(memcmp(rows + 3 * DIM, rows, sizeof(want)), 0);
	CU_ASSERT_EQUAL(memcmp(rows + 5 * DIM, rows + DIM, sizeof(want)), 0);
	CU_ASSERT_EQUAL(emb_client_table_stats(fx.t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, 3);
	/* Erasing 40 once leaves no second copy behind. */
	{
		uint64_t erased = 0;
		uint8_t found = 1;

		CU_ASSERT_EQUAL(emb_client_table_erase(fx.t, ids, 1, &erased),
				0);
		CU_ASSERT_EQUAL(erased, 1);
		CU_ASSERT_EQUAL(emb_client_table_pull(fx.t, ids, 1, want,
						      EMB_CLIENT_NOCREATE,
						      &found), 0);
		CU_ASSERT_EQUAL(found, 0);
	}
	close(fd);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* PUSH of grad g to one id, with a session when session != 0; its status. */
static int raw_push(int fd, uint32_t table_id, uint64_t id, float g,
		    uint64_t session, uint64_t seq)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 64 + DIM * 4];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_wire_iovs v;
	struct emb_frame_hdr r;
	float grad[DIM];
	int len;

	for (uint32_t j = 0; j < DIM; j++)
		grad[j] = g;
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_session(
				  &v, seq + 1, table_id, 0, 0, session, seq,
				  &id, 1, DIM, grad),
			      0);
	len = emb_wire_iovs_flatten(&v, buf, sizeof(buf));
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &r, resp, sizeof(resp)), 0);
	return r.status;
}

static float row0(struct fixture *fx, uint64_t id)
{
	float row[DIM];

	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(fx->t, &id, 1, row, 0, NULL), 0);
	return row[0];
}

static void test_push_session(void)
{
	const uint64_t sess = 0x5e551011u, id = 900;
	const float lr = EMB_OPTIM_CFG_DEFAULT.lr;
	struct fixture fx;
	float v0, v;
	int fd, fd2;

	fx_setup(&fx);
	fd = raw_ready(&fx);
	v0 = row0(&fx, id);
	CU_ASSERT_EQUAL(raw_push(fd, fx.id8, id, 1.0f, sess, 1), 0);
	/* The same push again, as after a reconnect: acknowledged, and the
	 * row moved once. */
	close(fd);
	fd2 = raw_ready(&fx);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 1), 0);
	v = row0(&fx, id);
	CU_ASSERT_DOUBLE_EQUAL(v, v0 - lr, 1e-6);
	/* The next number is a new push; another session has its own. */
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 2), 0);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess + 1, 1), 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 3 * lr, 1e-6);
	/* Out of order within the window is fine; far behind it is refused,
	 * since nobody can tell whether it was applied. */
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 10), 0);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 5), 0);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 10), 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 5 * lr, 1e-6);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 10 + 5000), 0);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, sess, 6),
			EMB_ERETRYLATE);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 6 * lr, 1e-6);
	/* Without a session every push is applied, as before. */
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, 0, 0), 0);
	CU_ASSERT_EQUAL(raw_push(fd2, fx.id8, id, 1.0f, 0, 0), 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 8 * lr, 1e-6);
	/* Sequence number 0 is not one. */
	{
		_Alignas(8) uint8_t pl[32 + 8 + DIM * 4] = {0};
		struct emb_frame_hdr h =
		    nt_hdr(EMB_OP_PUSH, 77, fx.id8, 1, sizeof(pl));

		h.flags = EMB_F_SESSION;
		memcpy(pl + 16, &sess, 8);
		CU_ASSERT_EQUAL(raw_call(fd2, h, pl, sizeof(pl)),
				EMB_EBADFRAME);
	}
	close(fd2);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* HELLO with token on a new connection: its status, the message in msg. */
static int hello_msg(uint16_t port, const char *token, char *msg, size_t cap)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 8 + 64];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.payload = resp, .lim = &lim};
	struct emb_wire_error e;
	int fd = nt_raw_connect(port), len;

	len = emb_wire_hello_req_encode(buf, sizeof(buf), 1, EMB_WIRE_VERSION,
					(const uint8_t *)token,
					(uint32_t)strlen(token), "guesser");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, resp, sizeof(resp)), 0);
	close(fd);
	msg[0] = '\0';
	if (f.hdr.status < 0 && emb_wire_error_decode(&f, &e) == 0)
		snprintf(msg, cap, "%.*s", (int)e.msg_len, e.msg);
	return f.hdr.status;
}

static void test_token_guessing(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *s;
	uint32_t checked = 0, tries = 0;
	uint64_t t0;
	char msg[256];
	uint16_t port;

	so.auth_token = (const uint8_t *)"right-token";
	so.auth_token_len = 11;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	/* A few mistakes are free... */
	for (int i = 0; i < 5; i++) {
		CU_ASSERT_EQUAL(hello_msg(port, "wrong", msg, sizeof(msg)),
				EMB_EAUTH);
		CU_ASSERT_STRING_EQUAL(msg, "authentication failed");
	}
	/* ...then each one buys a wait during which no token is compared,
	 * not even the right one. */
	CU_ASSERT_EQUAL(hello_msg(port, "wrong", msg, sizeof(msg)), EMB_EAUTH);
	CU_ASSERT_EQUAL(hello_msg(port, "right-token", msg, sizeof(msg)),
			EMB_EAUTH);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "too many failed attempts"));
	usleep((EMB_AUTH_WAIT_MIN_MS + 50) * 1000);
	CU_ASSERT_EQUAL(hello_msg(port, "right-token", msg, sizeof(msg)), 0);

	/* A guesser at full speed for one second. */
	t0 = emb_clock_ms();
	while (emb_clock_ms() - t0 < 1000) {
		hello_msg(port, "guess", msg, sizeof(msg));
		tries++;
		checked += strcmp(msg, "authentication failed") == 0;
	}
	fprintf(stderr, "\n    %u HELLOs in 1 s, %u tokens compared\n", tries,
		checked);
	CU_ASSERT(checked <= EMB_AUTH_FREE_FAILS + 3);
	emb_server_destroy(s);
}

static void test_no_hello(void)
{
	static const uint8_t ping[8] = "early";
	struct fixture fx;
	int fd;

	fx_setup(&fx);
	fd = nt_raw_connect(fx.port);
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PING, 5, 0, 0, sizeof(ping)),
				 ping, sizeof(ping)), EMB_ENOHELLO);
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_LIST_TABLES, 6, 0, 0, 0),
				 NULL, 0), EMB_ENOHELLO);
	CU_ASSERT_EQUAL(nt_raw_hello(fd, NULL, 0), 0);
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PING, 7, 0, 0, sizeof(ping)),
				 ping, sizeof(ping)), 0);
	close(fd);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* ---- peers that vanish ---- */

/*
 * In a child: connect, HELLO (response read), then send the first
 * send_bytes of frame and _exit() without reading anything more. With
 * reset, the socket is closed with an RST (SO_LINGER 0) instead of a FIN.
 */
static void vanish(uint16_t port, const void *frame, size_t send_bytes,
		   bool reset)
{
	_Alignas(8) uint8_t hello[EMB_WIRE_HDR_SIZE + 16];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE];
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct linger lg = {1, 0};
	size_t got = 0;
	int fd, len;
	pid_t pid;

	len = emb_wire_hello_req_encode(hello, sizeof(hello), 1,
					EMB_WIRE_VERSION, NULL, 0, "vanish");
	CU_ASSERT_FATAL(len > 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		/* Only system calls from here: the parent has threads. */
		fd = socket(AF_INET, SOCK_STREAM, 0);
		sa.sin_port = htons(port);
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			_exit(2);
		if (send(fd, hello, (size_t)len, MSG_NOSIGNAL) != len)
			_exit(3);
		while (got < sizeof(resp)) {
			ssize_t n = recv(fd, resp + got, sizeof(resp) - got, 0);

			if (n <= 0)
				_exit(4);
			got += (size_t)n;
		}
		if (send_bytes &&
		    send(fd, frame, send_bytes, MSG_NOSIGNAL) !=
			    (ssize_t)send_bytes)
			_exit(5);
		if (reset)
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		_exit(0);
	}
	{
		int status = -1;

		CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
		CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
}

static void test_vanishing_clients(void)
{
	enum { N = MAX_IDS };
	_Alignas(8) uint8_t frame[EMB_WIRE_HDR_SIZE + N * 8];
	struct emb_frame_hdr h;
	struct emb_server_stats ss;
	struct fixture fx;
	uint64_t ids[N];

	fx_setup(&fx);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 1000 + i;
	/* A PULL of 64 rows of 4 KiB: a 256 KiB reply nobody will read. */
	h = nt_hdr(EMB_OP_PULL, 2, fx.id1k, N, N * 8);
	emb_wire_hdr_encode(frame, &h);
	memcpy(frame + EMB_WIRE_HDR_SIZE, ids, sizeof(ids));

	vanish(fx.port, frame, 0, false);		     /* after HELLO */
	vanish(fx.port, frame, EMB_WIRE_HDR_SIZE / 2, false); /* in a header */
	vanish(fx.port, frame, EMB_WIRE_HDR_SIZE + 100, false); /* payload */
	vanish(fx.port, frame, EMB_WIRE_HDR_SIZE + 100, true);
	vanish(fx.port, frame, sizeof(frame), false); /* before the reply */
	vanish(fx.port, frame, sizeof(frame), true);
	for (int k = 0; k < 4; k++)
		vanish(fx.port, frame, sizeof(frame), k & 1);
	fx_check_serving(&fx);
	emb_server_stats(fx.s, &ss);
	CU_ASSERT(ss.conns_total >= 10);
	fx_teardown(&fx);
}

/* ---- memory before login, connection limits, reply size ---- */

/* Polls the server's stats for up to 2 s until pred holds; the last ones. */
static struct emb_server_stats stats_until(struct emb_server *s,
					   bool (*pred)(const struct
							emb_server_stats *))
{
	struct emb_server_stats ss;

	for (int i = 0; i < 200; i++) {
		emb_server_stats(s, &ss);
		if (pred(&ss))
			break;
		usleep(10000);
	}
	return ss;
}

static bool past_1mib(const struct emb_server_stats *ss)
{
	return ss->conn_bytes >= (1u << 20);
}

/* A closed connection's buffers go back when its loop reaps it, a moment
 * after the close is counted: wait for that, not for conns_open alone. */
static bool no_conn_bytes(const struct emb_server_stats *ss)
{
	return ss->conn_bytes == 0;
}

/*
 * Eight strangers announce 64 MiB PINGs before HELLO: each is told
 * EMB_ETOOBIG and closed, and the server buffered nothing for them (it
 * used to allocate the whole announced payload, 512 MiB in all).
 */
static void test_prelogin_big_frames(void)
{
	struct emb_server_opts so = nt_server_opts();
	_Alignas(8) uint8_t raw[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX];
	static uint8_t junk[16 << 10];
	struct emb_server_stats ss;
	struct emb_frame_hdr h, r;
	struct emb_server *s;
	int fds[8];

	s = nt_server_start(&so);
	h = nt_hdr(EMB_OP_PING, 5, 0, 0, (64u << 20) - EMB_WIRE_HDR_SIZE);
	emb_wire_hdr_encode(raw, &h);
	for (int i = 0; i < 8; i++) {
		fds[i] = nt_raw_connect(emb_server_port(s));
		CU_ASSERT_EQUAL(nt_raw_send(fds[i], raw, sizeof(raw)), 0);
		CU_ASSERT_EQUAL(nt_raw_send(fds[i], junk, sizeof(junk)), 0);
	}
	for (int i = 0; i < 8; i++) {
		CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fds[i], &r, resp, sizeof(resp)),
				      0);
		CU_ASSERT_EQUAL(r.status, EMB_ETOOBIG);
		CU_ASSERT_EQUAL(r.req_id, 5);
		CU_ASSERT_EQUAL(r.opcode, EMB_OP_PING | EMB_OP_RESPONSE_BIT);
	}
	emb_server_stats(s, &ss);
	CU_ASSERT(ss.conn_bytes <= 8 * (64u << 10));
	for (int i = 0; i < 8; i++) {
		CU_ASSERT(nt_raw_wait_closed(fds[i]));
		close(fds[i]);
	}
	CU_ASSERT_EQUAL(nt_server_wait_conns(s, 0), 0);
	ss = stats_until(s, no_conn_bytes);
	CU_ASSERT_EQUAL(ss.conn_bytes, 0);
	emb_server_destroy(s);
}

/*
 * After login a frame's buffer grows with the bytes that arrived, not with
 * the length announced, and all connections together stay within
 * conn_mem_limit: the frame that would pass it gets EMB_EMEMLIMIT.
 */
static void test_rx_budget(void)
{
	struct emb_server_opts so = nt_server_opts();
	_Alignas(8) uint8_t raw[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX];
	uint8_t *junk = calloc(1, 4u << 20);
	struct emb_server_stats ss;
	struct emb_frame_hdr h, r;
	struct emb_server *s;
	int fd, fd2;

	CU_ASSERT_FATAL(junk != NULL);
	so.conn_mem_limit = 4u << 20;
	s = nt_server_start(&so);
	fd = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	h = nt_hdr(EMB_OP_PING, 6, 0, 0, 32u << 20);
	emb_wire_hdr_encode(raw, &h);
	CU_ASSERT_EQUAL(nt_raw_send(fd, raw, sizeof(raw)), 0);
	CU_ASSERT_EQUAL(nt_raw_send(fd, junk, 1u << 20), 0);
	ss = stats_until(s, past_1mib);
	CU_ASSERT(ss.conn_bytes >= (1u << 20));
	CU_ASSERT(ss.conn_bytes <= (3u << 20)); /* not 32 MiB */
	/* 4 MiB more would pass the limit. */
	CU_ASSERT_EQUAL(nt_raw_send(fd, junk, 4u << 20), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &r, resp, sizeof(resp)), 0);
	CU_ASSERT_EQUAL(r.status, EMB_EMEMLIMIT);
	CU_ASSERT_EQUAL(r.req_id, 6);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);
	/* The memory came back: the next client is served. */
	CU_ASSERT_EQUAL(nt_server_wait_conns(s, 0), 0);
	fd2 = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(nt_raw_hello(fd2, NULL, 0), 0);
	emb_server_stats(s, &ss);
	CU_ASSERT(ss.conn_bytes <= (1u << 20));
	close(fd2);
	emb_server_destroy(s);
	free(junk);
}

/* Silent strangers and idle clients are closed; a busy client is not. */
static void test_timeouts(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("idle_t", DIM, 1);
	struct emb_client_table *t;
	struct emb_server_stats ss;
	struct emb_server *s;
	struct emb_client *c;
	uint64_t id = 1;
	float row[DIM];
	char addr[64];
	uint16_t port;
	int quiet, idle;

	so.handshake_timeout_ms = 200;
	so.idle_timeout_ms = 500;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	quiet = nt_raw_connect(port);
	idle = nt_raw_connect(port);
	CU_ASSERT_EQUAL(nt_raw_hello(idle, NULL, 0), 0);
	/* The client keeps working through both timeouts. */
	for (int i = 0; i < 12; i++) {
		CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL),
				0);
		usleep(100000);
	}
	CU_ASSERT(nt_raw_wait_closed(quiet));
	CU_ASSERT(nt_raw_wait_closed(idle));
	close(quiet);
	close(idle);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL), 0);
	emb_server_stats(s, &ss);
	CU_ASSERT_EQUAL(ss.conns_timed_out, 2);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* Past max_conns a connection is told why, then closed. */
static void test_max_conns(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server_stats ss;
	struct emb_server *s;
	int a, b, over;

	so.max_conns = 2;
	s = nt_server_start(&so);
	a = nt_raw_connect(emb_server_port(s));
	b = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(nt_raw_hello(a, NULL, 0), 0);
	CU_ASSERT_EQUAL(nt_raw_hello(b, NULL, 0), 0);
	over = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(nt_raw_hello(over, NULL, 0), EMB_ETOOMANYCONNS);
	CU_ASSERT(nt_raw_wait_closed(over));
	close(over);
	close(a);
	CU_ASSERT_EQUAL(nt_server_wait_conns(s, 1), 1);
	a = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(nt_raw_hello(a, NULL, 0), 0);
	emb_server_stats(s, &ss);
	CU_ASSERT_EQUAL(ss.conns_refused, 1);
	close(a);
	close(b);
	emb_server_destroy(s);
}

/*
 * A PULL whose reply cannot fit the frame limit is answered with
 * EMB_ETOOBIG (it used to get no answer at all), and the library splits
 * the same pull by the limit from HELLO so that it works.
 */
static void test_pull_reply_too_big(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("wide", 1024, 1);
	struct emb_client_table *t;
	struct emb_wire_iovs iovs;
	struct emb_server *s;
	struct emb_client *c;
	uint64_t *ids = malloc(4096 * sizeof(*ids));
	float *rows = malloc((size_t)4096 * 1024 * sizeof(float));
	uint8_t *req = malloc(EMB_WIRE_HDR_SIZE + 4096 * 8);
	char addr[64];
	uint16_t port;
	uint32_t id;
	int fd, len;

	CU_ASSERT_FATAL(ids && rows && req);
	so.limits.max_frame_bytes = 4u << 20;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	/* 60 s, not the tests' 5: the pull below makes 16 MB of rows, which
	 * under ThreadSanitizer beside the cluster suite outlasted 5 s. */
	c = nt_client(addr, 60000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < 4096; i++)
		ids[i] = i;
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	id = raw_table_id(fd, "wide");
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_req_encode(&iovs, 8, id, 0, ids, 4096), 0);
	len = emb_wire_iovs_flatten(&iovs, req, EMB_WIRE_HDR_SIZE + 4096 * 8);
	CU_ASSERT_FATAL(len > 0);
	{
		struct emb_frame_hdr h;

		memcpy(&h, req, sizeof(h));
		CU_ASSERT_EQUAL(raw_call(fd, h, req + EMB_WIRE_HDR_SIZE,
					 (size_t)len - EMB_WIRE_HDR_SIZE),
				EMB_ETOOBIG);
	}
	/* The connection stays usable. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PING, 9, 0, 0, 0), NULL, 0),
			0);
	close(fd);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 4096, rows, 0, NULL), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
	free(req);
	free(rows);
	free(ids);
}


/* Appends sub-request PULL i of table tid over ids[0..n) at *off. */
static void many_sub(uint8_t *buf, size_t *off, uint32_t i, uint32_t tid,
		     uint16_t flags, const uint64_t *ids, uint32_t n)
{
	struct emb_frame_hdr h = nt_hdr(EMB_OP_PULL, i, tid, n, n * 8);
	struct iovec v = {(void *)ids, (size_t)n * 8};

	h.flags = flags;
	*off += (size_t)emb_wire_many_sub_put(buf + *off, &h, &v, 1);
}

/* Sends PULL_MANY of count sub-frames buf[32..off); the reply in resp. */
static void many_call(int fd, uint8_t *buf, size_t off, uint32_t count,
		      uint64_t req_id, struct emb_wire_frame *f,
		      uint8_t *resp, size_t cap)
{
	static struct emb_wire_limits lim;

	lim = EMB_WIRE_LIMITS_DEFAULT;
	emb_wire_hdr_encode(buf, &(struct emb_frame_hdr){
				     .magic = EMB_WIRE_MAGIC,
				     .version = EMB_WIRE_VERSION,
				     .opcode = EMB_OP_PULL_MANY,
				     .req_id = req_id,
				     .count = count,
				     .payload_len = (uint32_t)off -
						    EMB_WIRE_HDR_SIZE});
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, off), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f->hdr, resp, cap), 0);
	CU_ASSERT_EQUAL(f->hdr.req_id, req_id);
	f->payload = resp;
	f->lim = &lim;
}

/*
 * PULL_MANY over a raw connection: each sub-request answered as its PULL
 * alone would be (rows, NOCREATE's bitmap, an unknown table's or too many
 * ids' error for that sub-request only); malformed frames and replies over
 * the frame limit are refused whole, and the connection keeps serving.
 */
static void test_pull_many_raw(void)
{
	static _Alignas(8) uint8_t buf[1u << 20], resp[1u << 20];
	struct emb_wire_frame f, subs[EMB_WIRE_MANY_MAX];
	struct emb_wire_pull_resp pr;
	struct emb_wire_error e;
	uint64_t ids[MAX_IDS + 1];
	float want[2 * BIG_DIM];
	struct fixture fx;
	size_t off;
	int fd;

	fx_setup(&fx);
	for (uint32_t i = 0; i <= MAX_IDS; i++)
		ids[i] = 5000 + i;
	fd = raw_ready(&fx);

	off = EMB_WIRE_HDR_SIZE;
	many_sub(buf, &off, 0, fx.id8, EMB_F_NOCREATE, ids, 3);
	many_sub(buf, &off, 1, 77, 0, ids, 2);
	many_sub(buf, &off, 2, fx.id1k, 0, ids + 10, 2);
	many_sub(buf, &off, 3, fx.id8, 0, ids, MAX_IDS + 1);
	many_call(fd, buf, off, 4, 40, &f, resp, sizeof(resp));
	CU_ASSERT_EQUAL_FATAL(f.hdr.status, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_many_decode(&f, subs, 4), 4);
	/* Rows that do not exist, NOCREATE: zeros, none found. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&subs[0], DIM, 0, &pr),
			      0);
	CU_ASSERT_EQUAL(pr.n, 3);
	CU_ASSERT_PTR_NOT_NULL_FATAL(pr.found);
	for (uint32_t i = 0; i < 3; i++)
		CU_ASSERT(!emb_wire_bit_test(pr.found, i));
	for (uint32_t i = 0; i < 3 * DIM; i++)
		CU_ASSERT_EQUAL(pr.rows[i], 0.0f);
	/* The unknown table's error names its id. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_error_decode(&subs[1], &e), 0);
	CU_ASSERT_EQUAL(e.status, EMB_ENOTABLE);
	CU_ASSERT_PTR_NOT_NULL(memmem(e.msg, e.msg_len, "77", 2));
	/* The big table's rows, as the library pulls them. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_resp_decode(&subs[2], BIG_DIM, 0, &pr), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(fx.tb, ids + 10, 2, want, 0,
					      NULL),
			0);
	CU_ASSERT_EQUAL(memcmp(pr.rows, want, sizeof(want)), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_error_decode(&subs[3], &e), 0);
	CU_ASSERT_EQUAL(e.status, EMB_ETOOMANYIDS);

	/* A reply over the 1 MiB frame limit: 5 x 64 rows of 4 KiB. */
	off = EMB_WIRE_HDR_SIZE;
	for (uint32_t i = 0; i < 5; i++)
		many_sub(buf, &off, i, fx.id1k, 0, ids, MAX_IDS);
	many_call(fd, buf, off, 5, 41, &f, resp, sizeof(resp));
	CU_ASSERT_EQUAL(f.hdr.status, EMB_ETOOBIG);
	/* Malformed: no sub-frame; a PUSH inside; a count that lies. */
	off = EMB_WIRE_HDR_SIZE;
	many_call(fd, buf, off, 0, 42, &f, resp, sizeof(resp));
	CU_ASSERT_EQUAL(f.hdr.status, EMB_EBADFRAME);
	many_sub(buf, &off, 0, fx.id8, 0, ids, 2);
	buf[EMB_WIRE_HDR_SIZE + 5] = EMB_OP_PUSH;
	many_call(fd, buf, off, 1, 43, &f, resp, sizeof(resp));
	CU_ASSERT_EQUAL(f.hdr.status, EMB_EBADFRAME);
	off = EMB_WIRE_HDR_SIZE;
	many_sub(buf, &off, 0, fx.id8, 0, ids, 2);
	many_call(fd, buf, off, 2, 44, &f, resp, sizeof(resp));
	CU_ASSERT_EQUAL(f.hdr.status, EMB_EBADFRAME);

	/* Still in step on the same connection. */
	CU_ASSERT_EQUAL(raw_call(fd, nt_hdr(EMB_OP_PULL, 45, fx.id8, 2, 16),
				 ids, 16),
			0);
	close(fd);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

/* Appends sub-request PUSH i: grad g to id, with session sess, seq. */
static void push_sub(uint8_t *buf, size_t *off, uint32_t i, uint32_t tid,
		     uint64_t id, float g, uint64_t sess, uint64_t seq)
{
	_Alignas(8) uint8_t tmp[EMB_WIRE_HDR_SIZE + 64 + DIM * 4];
	struct emb_wire_iovs v;
	float grad[DIM];
	int len;

	for (uint32_t j = 0; j < DIM; j++)
		grad[j] = g;
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_session(
				  &v, i, tid, 0, 0, sess, seq, &id, 1, DIM,
				  grad),
			      0);
	len = emb_wire_iovs_flatten(&v, tmp, sizeof(tmp));
	CU_ASSERT_FATAL(len > 0);
	memcpy(buf + *off, tmp, (size_t)len);
	memset(buf + *off + len, 0,
	       emb_wire_many_sub_size((uint32_t)len - EMB_WIRE_HDR_SIZE) -
		   (size_t)len);
	*off += emb_wire_many_sub_size((uint32_t)len - EMB_WIRE_HDR_SIZE);
}

/* Sends the PUSH_MANY buf[32..off) of count pushes; its sub-statuses. */
static void push_many_call(int fd, uint8_t *buf, size_t off, uint32_t count,
			   uint64_t req_id, int *status)
{
	static _Alignas(8) uint8_t resp[1u << 16];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.payload = resp, .lim = &lim},
			      subs[EMB_WIRE_MANY_MAX];

	emb_wire_hdr_encode(buf, &(struct emb_frame_hdr){
				     .magic = EMB_WIRE_MAGIC,
				     .version = EMB_WIRE_VERSION,
				     .opcode = EMB_OP_PUSH_MANY,
				     .req_id = req_id,
				     .count = count,
				     .payload_len = (uint32_t)off -
						    EMB_WIRE_HDR_SIZE});
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, off), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, resp, sizeof(resp)), 0);
	CU_ASSERT_EQUAL(f.hdr.req_id, req_id);
	CU_ASSERT_EQUAL_FATAL(f.hdr.status, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_many_decode(&f, subs, count),
			      (int)count);
	for (uint32_t i = 0; i < count; i++)
		status[i] = subs[i].hdr.status;
}

/*
 * PUSH_MANY over a raw connection: each sub-request is a PUSH of its own:
 * a sub-push repeated with its session and sequence number (in the same
 * frame, or the whole frame sent again) is applied once, a NaN one and one
 * of an unknown table fail alone, the others are applied; a synchronous
 * table's sub-push is refused with EMB_ENOBUNDLE, untouched.
 */
static void test_push_many_raw(void)
{
	static _Alignas(8) uint8_t buf[1u << 16];
	const uint64_t sess = 0x5e55a0u, id = 901;
	const float lr = EMB_OPTIM_CFG_DEFAULT.lr;
	struct fixture fx;
	int st[8], fd;
	size_t off;
	float v0;

	fx_setup(&fx);
	fd = raw_ready(&fx);
	v0 = row0(&fx, id);
	off = EMB_WIRE_HDR_SIZE;
	push_sub(buf, &off, 0, fx.id8, id, 1.0f, sess, 1);
	push_sub(buf, &off, 1, fx.id8, id, 1.0f, sess, 1);
	push_sub(buf, &off, 2, fx.id8, id, NAN, sess, 2);
	push_sub(buf, &off, 3, 77, id, 1.0f, sess, 3);
	push_sub(buf, &off, 4, fx.id8, id, 1.0f, sess, 4);
	push_many_call(fd, buf, off, 5, 50, st);
	CU_ASSERT_EQUAL(st[0], 0);
	CU_ASSERT_EQUAL(st[1], 0);
	CU_ASSERT_EQUAL(st[2], EMB_ENONFINITE);
	CU_ASSERT_EQUAL(st[3], EMB_ENOTABLE);
	CU_ASSERT_EQUAL(st[4], 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 2 * lr, 1e-6);
	/* The whole frame again, as after a lost connection: the applied
	 * ones are acknowledged, not applied again. */
	close(fd);
	fd = raw_ready(&fx);
	push_many_call(fd, buf, off, 5, 51, st);
	CU_ASSERT_EQUAL(st[0], 0);
	CU_ASSERT_EQUAL(st[2], EMB_ENONFINITE);
	CU_ASSERT_EQUAL(st[4], 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 2 * lr, 1e-6);
	/* Synchronous: refused untouched, and its number not taken. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_set_mode(fx.t, EMB_MODE_SYNC, 1, 0), 0);
	off = EMB_WIRE_HDR_SIZE;
	push_sub(buf, &off, 0, fx.id8, id, 1.0f, sess, 5);
	push_many_call(fd, buf, off, 1, 52, st);
	CU_ASSERT_EQUAL(st[0], EMB_ENOBUNDLE);
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_set_mode(fx.t, EMB_MODE_ASYNC, 0, 0), 0);
	push_many_call(fd, buf, off, 1, 53, st);
	CU_ASSERT_EQUAL(st[0], 0);
	CU_ASSERT_DOUBLE_EQUAL(row0(&fx, id), v0 - 3 * lr, 1e-6);
	close(fd);
	fx_check_serving(&fx);
	fx_teardown(&fx);
}

static const struct emb_test_case cases[] = {
	{"bad magic, version, length or opcode closes the connection",
	 test_bad_headers},
	{"a truncated header or payload closes only that connection",
	 test_truncated},
	{"payload errors get their status and the connection stays usable",
	 test_payload_errors},
	{"a raw PULL with duplicate ids creates each row once",
	 test_raw_duplicates},
	{"a PUSH retried with its session and sequence number is applied once",
	 test_push_session},
	{"failed tokens make the next attempts wait: guessing is slow",
	 test_token_guessing},
	{"requests before HELLO are refused with EMB_ENOHELLO",
	 test_no_hello},
	{"clients that die mid-request leave the server serving",
	 test_vanishing_clients},
	{"big frames before HELLO are refused and never buffered",
	 test_prelogin_big_frames},
	{"receive buffers grow as bytes arrive, within conn_mem_limit",
	 test_rx_budget},
	{"handshake and idle timeouts close silent connections",
	 test_timeouts},
	{"past max_conns a connection is refused with a reason",
	 test_max_conns},
	{"a PULL reply over the frame limit is an error, the library splits",
	 test_pull_reply_too_big},
	{"PULL_MANY answers each PULL alone; malformed ones refused whole",
	 test_pull_many_raw},
	{"PUSH_MANY: each PUSH alone; a repeated session push applied once",
	 test_push_many_raw},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "worker", cases);
}
