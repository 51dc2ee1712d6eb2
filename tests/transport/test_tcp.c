/*
 * tests/transport/test_tcp.c - the TCP transport against raw sockets: broken
 * and truncated frames, byte-at-a-time writes, a client that stops reading,
 * and a hand-written server that answers badly.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "echo.h"
#include "harness.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

/* ---- raw socket helpers -------------------------------------------------- */

static int raw_connect(uint16_t port, int rcvbuf)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	CU_ASSERT_FATAL(fd >= 0);
	if (rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CU_ASSERT_FATAL(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		CU_ASSERT_FATAL(w > 0);
		c += w;
		n -= (size_t)w;
	}
}

/* Reads exactly n bytes within 10 s; false on EOF, error or timeout. */
static bool raw_recv(int fd, void *p, size_t n)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	char *c = p;

	while (n) {
		if (poll(&pfd, 1, 10000) <= 0)
			return false;
		ssize_t r = recv(fd, c, n, 0);

		if (r <= 0)
			return false;
		c += r;
		n -= (size_t)r;
	}
	return true;
}

/* True if the peer closes fd within 10 s (EOF or reset). */
static bool raw_closed(int fd)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	char buf[4096];

	for (;;) {
		if (poll(&pfd, 1, 10000) <= 0)
			return false;
		ssize_t r = recv(fd, buf, sizeof(buf), 0);

		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return true;
		if (r < 0)
			return false;
	}
}

static struct emb_frame_hdr hdr(uint8_t op, uint32_t len, uint64_t id)
{
	return (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				      .version = EMB_WIRE_VERSION,
				      .opcode = op,
				      .req_id = id,
				      .payload_len = len};
}

/* Waits until the server has closed at least n conns. */
static void wait_closed(struct echo_server *s, uint64_t n,
			struct emb_transport_stats *st)
{
	for (int i = 0; i < 1000; i++) {
		echo_stats(s, st);
		if (st->conns_closed >= n)
			return;
		usleep(10000);
	}
}

/* One ECHO round trip over a proper client conn. */
static void good_call(struct emb_conn *c)
{
	uint64_t v = 0x1122334455667788u, back = 0;
	struct iovec iov = {.iov_base = &v, .iov_len = sizeof(v)};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, rh;

	CU_ASSERT_EQUAL(
	    emb_conn_call_sync(c, &h, &iov, 1, &back, sizeof(back), &rh), 0);
	CU_ASSERT_EQUAL(back, v);
}

struct fixture {
	struct echo_server *s;
	struct emb_transport *tr;
	struct emb_conn *c; /* a well-behaved client */
};

static void setup(struct fixture *f, const struct emb_transport_opts *o)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;

	CU_ASSERT_FATAL(echo_start("tcp", 1, o, &f->s) == 0);
	CU_ASSERT_FATAL(emb_transport_create("tcp", NULL, &f->tr) == 0);
	co.port = echo_port(f->s);
	CU_ASSERT_FATAL(emb_conn_create(f->tr, &co, &f->c) == 0);
	good_call(f->c);
}

static void teardown(struct fixture *f)
{
	emb_conn_destroy(f->c);
	emb_transport_destroy(f->tr);
	echo_stop(f->s);
}

struct result {
	bool done;
	int status;
};

static void on_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct result *r = ctx;

	(void)resp;
	r->done = true;
	r->status = status;
}

static void wait_done_tr(struct emb_transport *tr, struct result *r)
{
	while (!r->done)
		emb_transport_poll(tr, 100);
}

/* ---- cases --------------------------------------------------------------- */

static void bad_header_case(struct emb_frame_hdr h, size_t counter_off,
			    const struct emb_transport_opts *o)
{
	struct fixture f;
	struct emb_transport_stats st;
	char junk[64] = {0};
	int fd;

	setup(&f, o);
	fd = raw_connect(echo_port(f.s), 0);
	raw_send(fd, &h, sizeof(h));
	raw_send(fd, junk, sizeof(junk));
	CU_ASSERT_TRUE(raw_closed(fd));
	close(fd);
	wait_closed(f.s, 1, &st);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	CU_ASSERT_EQUAL(*(uint64_t *)((char *)&st + counter_off), 1);
	CU_ASSERT_EQUAL(st.frames_in, 1); /* the good call's only */
	good_call(f.c);
	teardown(&f);
}

static void test_bad_magic(void)
{
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 8, 1);

	h.magic = 0x464f4f42;
	bad_header_case(h, offsetof(struct emb_transport_stats, err_bad_magic),
			NULL);
}

static void test_bad_version(void)
{
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 8, 1);

	h.version = 9;
	bad_header_case(
	    h, offsetof(struct emb_transport_stats, err_bad_version), NULL);
}

static void test_too_big(void)
{
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;

	o.max_frame_bytes = 1u << 20;
	bad_header_case(hdr(ECHO_OP_ECHO, 1u << 20, 1),
			offsetof(struct emb_transport_stats, err_too_big), &o);
}

/*
 * The reply to a refused frame is the layer above's: with reject_encode the
 * peer reads exactly the frame it writes (here the protocol's ERROR, to an
 * opcode the protocol does not know), then EOF; without one, EOF alone.
 */
static void reject_case(bool with_encoder)
{
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_frame_hdr h = hdr(0x77, 1u << 20, 0xabcdef);
	struct emb_transport_stats st;
	_Alignas(8) char want[256], got[256];
	struct fixture f;
	char junk[64] = {0};
	ssize_t r;
	int fd, n;

	o.max_frame_bytes = 1u << 20;
	o.reject_encode = with_encoder ? emb_wire_reject_encode : NULL;
	setup(&f, &o);
	fd = raw_connect(echo_port(f.s), 0);
	raw_send(fd, &h, sizeof(h));
	raw_send(fd, junk, sizeof(junk));
	if (with_encoder) {
		n = emb_wire_reject_encode(
		    want, sizeof(want), &h, EMB_ETOOBIG,
		    "frame of 1048608 bytes over the limit of 1048576");
		CU_ASSERT_FATAL(n > 32);
		CU_ASSERT_FATAL(raw_recv(fd, got, (size_t)n));
		CU_ASSERT(memcmp(got, want, (size_t)n) == 0);
		CU_ASSERT_EQUAL((uint8_t)got[5], 0x77 | EMB_OP_RESPONSE_BIT);
	}
	/* Nothing more: the next read is the end of the stream. */
	r = recv(fd, got, sizeof(got), 0);
	CU_ASSERT(r == 0 || (r < 0 && errno == ECONNRESET));
	close(fd);
	wait_closed(f.s, 1, &st);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	CU_ASSERT_EQUAL(st.err_too_big, 1);
	good_call(f.c);
	teardown(&f);
}

static void test_reject_encoded(void)
{
	reject_case(true);
}

static void test_reject_unencoded(void)
{
	reject_case(false);
}

static void truncated_case(const void *bytes, size_t n)
{
	struct fixture f;
	struct emb_transport_stats st;
	int fd;

	setup(&f, NULL);
	fd = raw_connect(echo_port(f.s), 0);
	raw_send(fd, bytes, n);
	close(fd);
	wait_closed(f.s, 1, &st);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	CU_ASSERT_EQUAL(st.err_peer_closed, 1);
	CU_ASSERT_EQUAL(st.frames_in, 1);
	good_call(f.c);
	teardown(&f);
}

static void test_truncated_header(void)
{
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 8, 1);

	truncated_case(&h, 10);
}

static void test_truncated_payload(void)
{
	char buf[32 + 500];
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 1000, 1);

	memcpy(buf, &h, sizeof(h));
	memset(buf + 32, 0x5a, 500);
	truncated_case(buf, sizeof(buf));
}

static void test_byte_at_a_time(void)
{
	struct fixture f;
	char out[32 + 100], in[32 + 100];
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 100, 0xfeed), rh;
	char batch[10][32 + 16];
	int fd;

	setup(&f, NULL);
	fd = raw_connect(echo_port(f.s), 0);
	memcpy(out, &h, 32);
	for (int i = 0; i < 100; i++)
		out[32 + i] = (char)i;
	for (size_t i = 0; i < sizeof(out); i++)
		raw_send(fd, &out[i], 1);
	CU_ASSERT_FATAL(raw_recv(fd, in, sizeof(in)));
	memcpy(&rh, in, 32);
	CU_ASSERT_EQUAL(rh.magic, EMB_WIRE_MAGIC);
	CU_ASSERT_EQUAL(rh.req_id, 0xfeed);
	CU_ASSERT_EQUAL(rh.payload_len, 100);
	CU_ASSERT(memcmp(in + 32, out + 32, 100) == 0);

	/* Ten frames in one write come back as ten replies, in order. */
	for (int i = 0; i < 10; i++) {
		h = hdr(ECHO_OP_ECHO, 16, (uint64_t)i);
		memcpy(batch[i], &h, 32);
		memset(batch[i] + 32, i, 16);
	}
	raw_send(fd, batch, sizeof(batch));
	for (int i = 0; i < 10; i++) {
		CU_ASSERT_FATAL(raw_recv(fd, in, 32 + 16));
		memcpy(&rh, in, 32);
		CU_ASSERT_EQUAL(rh.req_id, (uint64_t)i);
		CU_ASSERT(memcmp(in + 32, batch[i] + 32, 16) == 0);
	}
	close(fd);
	teardown(&f);
}

static void slow_reader_case(uint32_t copy_max)
{
	enum { N = 400, REPLY = 64 << 10, BOUND = 256 << 10 };
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_transport_stats st;
	struct emb_frame_hdr h, rh;
	static char body[REPLY];
	struct fixture f;
	int fd, got = 0;

	o.out_queue_max = BOUND;
	o.copy_max_bytes = copy_max;
	setup(&f, &o);
	fd = raw_connect(echo_port(f.s), 16 << 10);
	for (int i = 0; i < N; i++) {
		h = hdr(ECHO_OP_BIG, 0, (uint64_t)i);
		h.count = REPLY;
		raw_send(fd, &h, sizeof(h));
	}
	/*
	 * We read nothing: once the socket buffers are full the server must
	 * stop reading our requests. Wait until its frame count settles.
	 */
	uint64_t last = UINT64_MAX;

	for (int i = 0, still = 0; i < 1000 && still < 30; i++) {
		echo_stats(f.s, &st);
		still = st.frames_in == last ? still + 1 : 0;
		last = st.frames_in;
		usleep(10000);
	}
	CU_ASSERT(st.rx_pauses > 0);
	CU_ASSERT(st.frames_in < N + 1); /* +1: the fixture's good call */
	CU_ASSERT(st.out_queue_peak <= BOUND + REPLY + 32);
	/* Other clients are still served meanwhile. */
	good_call(f.c);

	/* Drain: every request is answered, in order, once we read. */
	for (int i = 0; i < N; i++) {
		if (!raw_recv(fd, &rh, sizeof(rh)) ||
		    !raw_recv(fd, body, REPLY))
			break;
		got += rh.req_id == (uint64_t)i && rh.payload_len == REPLY &&
		       (uint8_t)body[REPLY - 1] == echo_pattern(REPLY - 1);
	}
	CU_ASSERT_EQUAL(got, N);
	echo_stats(f.s, &st);
	CU_ASSERT(st.out_queue_peak <= BOUND + REPLY + 32);
	CU_ASSERT_EQUAL(st.conns_closed, 0);
	close(fd);
	teardown(&f);
}

static void test_slow_reader(void)
{
	slow_reader_case(0);
}

/* Every reply piece is staged, and each sendmsg only part-accepted. */
static void test_slow_reader_staged(void)
{
	slow_reader_case(64u << 10);
}

static void test_staged_replies(void)
{
	enum { N = 4096, DEPTH = 3 };
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;
	size_t rows_bytes = (size_t)N * ECHO_ROW_FLOATS * sizeof(float);
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ROWS}, rh;
	static uint64_t ids[DEPTH][N];
	struct iovec iov[DEPTH], piece[3];
	struct result r[DEPTH];
	size_t bad = 0;
	float *rows[DEPTH];
	struct fixture f;
	char *big, *back;

	o.copy_max_bytes = 300; /* rows (256 B) and headers are copied */
	setup(&f, &o);
	memset(r, 0, sizeof(r));
	for (int d = 0; d < DEPTH; d++) {
		rows[d] = malloc(rows_bytes);
		CU_ASSERT_FATAL(rows[d] != NULL);
		for (uint64_t i = 0; i < N; i++)
			ids[d][i] = (i + (uint64_t)d * N) * 2654435761u;
		iov[d] = (struct iovec){.iov_base = ids[d],
					.iov_len = sizeof(ids[d])};
		CU_ASSERT_FATAL(emb_conn_call(f.c, &h, &iov[d], 1, rows[d],
					      rows_bytes, on_done, &r[d]) == 0);
	}
	for (int d = 0; d < DEPTH; d++) {
		wait_done_tr(f.tr, &r[d]);
		CU_ASSERT_EQUAL(r[d].status, 0);
		for (size_t i = 0; i < N; i++)
			for (unsigned j = 0; j < ECHO_ROW_FLOATS; j++)
				bad += rows[d][i * ECHO_ROW_FLOATS + j] !=
				       echo_row_value(ids[d][i], j);
		free(rows[d]);
	}
	CU_ASSERT_EQUAL(bad, 0);

	/* Small and big pieces mixed: staged, by reference, staged. */
	big = malloc(200000);
	back = malloc(200000);
	CU_ASSERT_FATAL(big && back);
	for (size_t i = 0; i < 200000; i++)
		big[i] = (char)(i * 13);
	piece[0] = (struct iovec){.iov_base = big, .iov_len = 100};
	piece[1] = (struct iovec){.iov_base = big + 100, .iov_len = 199800};
	piece[2] = (struct iovec){.iov_base = big + 199900, .iov_len = 100};
	h = (struct emb_frame_hdr){.opcode = ECHO_OP_ECHO};
	CU_ASSERT_EQUAL(
	    emb_conn_call_sync(f.c, &h, piece, 3, back, 200000, &rh), 0);
	CU_ASSERT(memcmp(big, back, 200000) == 0);
	free(big);
	free(back);
	teardown(&f);
}

/*
 * The server's process runs out of fds (in a child, so the limit hurts no
 * one else): a conn it cannot take is refused instead of spinning the
 * listener, and once fds are back it serves again.
 */
static void fd_exhaustion_child(int up, int down)
{
	struct echo_server *srv;
	struct rlimit rl;
	int fill[4096], n = 0;
	uint16_t port;
	char cmd;

	if (echo_start("tcp", 1, NULL, &srv))
		_exit(2);
	port = echo_port(srv);
	rl.rlim_cur = 256;
	rl.rlim_max = 256;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		_exit(4);
	while (n < 4096 && (fill[n] = open("/dev/null", O_RDONLY)) >= 0)
		n++;
	if (n == 4096 || write(up, &port, sizeof(port)) != sizeof(port))
		_exit(3);
	/* 'f': give the fds back and say so; EOF: done. */
	while (read(down, &cmd, 1) == 1) {
		while (n)
			close(fill[--n]);
		if (write(up, &cmd, 1) != 1)
			_exit(5);
	}
	echo_stop(srv);
	_exit(0);
}

static void test_fd_exhaustion(void)
{
	int up[2], down[2], status = 0, fd;
	struct emb_frame_hdr h = hdr(ECHO_OP_ECHO, 4, 7), rh;
	char buf[36], back[36];
	uint16_t port = 0;
	pid_t pid;

	CU_ASSERT_FATAL(pipe(up) == 0 && pipe(down) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		fd_exhaustion_child(up[1], down[0]);
	}
	close(up[1]);
	close(down[0]);
	CU_ASSERT_FATAL(read(up[0], &port, sizeof(port)) == sizeof(port));

	fd = raw_connect(port, 0);
	CU_ASSERT_TRUE(raw_closed(fd)); /* refused: no fd to take it */
	close(fd);

	CU_ASSERT_FATAL(write(down[1], "f", 1) == 1);
	CU_ASSERT_FATAL(read(up[0], buf, 1) == 1);
	fd = raw_connect(port, 0);
	memcpy(buf, &h, 32);
	memcpy(buf + 32, "ping", 4);
	raw_send(fd, buf, sizeof(buf));
	CU_ASSERT_TRUE(raw_recv(fd, back, sizeof(back)));
	memcpy(&rh, back, 32);
	CU_ASSERT_EQUAL(rh.req_id, 7);
	CU_ASSERT(memcmp(back + 32, "ping", 4) == 0);
	close(fd);

	close(down[1]);
	close(up[0]);
	CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- a hand-written server for the client side ------------------------ */

struct raw_server {
	int lfd; /* listening socket */
	int fd;	 /* the accepted conn */
	struct emb_transport *tr;
	struct emb_conn *c;
};

static void raw_server_start(struct raw_server *rs, uint32_t timeout_ms)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	socklen_t len = sizeof(sa);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	rs->lfd = socket(AF_INET, SOCK_STREAM, 0);
	CU_ASSERT_FATAL(rs->lfd >= 0);
	CU_ASSERT_FATAL(bind(rs->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CU_ASSERT_FATAL(listen(rs->lfd, 4) == 0);
	CU_ASSERT_FATAL(getsockname(rs->lfd, (struct sockaddr *)&sa, &len) ==
			0);
	CU_ASSERT_FATAL(emb_transport_create("tcp", NULL, &rs->tr) == 0);
	co.port = ntohs(sa.sin_port);
	co.call_timeout_ms = timeout_ms;
	CU_ASSERT_FATAL(emb_conn_create(rs->tr, &co, &rs->c) == 0);
	rs->fd = accept(rs->lfd, NULL, NULL);
	CU_ASSERT_FATAL(rs->fd >= 0);
}

static void raw_server_stop(struct raw_server *rs)
{
	emb_conn_destroy(rs->c);
	emb_transport_destroy(rs->tr);
	if (rs->fd >= 0)
		close(rs->fd);
	close(rs->lfd);
}

/* Posts one call and returns the request header the raw server read. */
static struct emb_frame_hdr post(struct raw_server *rs, struct result *r,
				 void *resp, size_t cap)
{
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO}, got;

	CU_ASSERT_FATAL(
	    emb_conn_call(rs->c, &h, NULL, 0, resp, cap, on_done, r) == 0);
	emb_transport_poll(rs->tr, 0); /* sends it */
	CU_ASSERT_FATAL(raw_recv(rs->fd, &got, sizeof(got)));
	return got;
}

static void wait_done(struct raw_server *rs, struct result *r)
{
	while (!r->done)
		emb_transport_poll(rs->tr, 100);
}

static void test_client_bad_response(void)
{
	struct raw_server rs;
	struct result r = {0};
	struct emb_frame_hdr req, h;
	struct emb_transport_stats st;
	char buf[8];

	raw_server_start(&rs, 10000);
	req = post(&rs, &r, buf, sizeof(buf));
	h = hdr(ECHO_OP_ECHO | EMB_OP_RESPONSE_BIT, 0, req.req_id);
	h.magic = 0;
	raw_send(rs.fd, &h, sizeof(h));
	wait_done(&rs, &r);
	CU_ASSERT_EQUAL(r.status, EMB_EBADMAGIC);
	emb_transport_stats(rs.tr, &st);
	CU_ASSERT_EQUAL(st.err_bad_magic, 1);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	raw_server_stop(&rs);
}

static void test_client_unmatched(void)
{
	struct raw_server rs;
	struct result r = {0};
	struct emb_frame_hdr req, h;
	struct emb_transport_stats st;
	uint64_t v = 0, want = 0xabcdef;

	raw_server_start(&rs, 10000);
	req = post(&rs, &r, &v, sizeof(v));
	h = hdr(ECHO_OP_ECHO | EMB_OP_RESPONSE_BIT, 8, req.req_id + 12345);
	raw_send(rs.fd, &h, sizeof(h));
	raw_send(rs.fd, &req, 8); /* some payload to be dropped */
	h.req_id = req.req_id;
	raw_send(rs.fd, &h, sizeof(h));
	raw_send(rs.fd, &want, 8);
	wait_done(&rs, &r);
	CU_ASSERT_EQUAL(r.status, 0);
	CU_ASSERT_EQUAL(v, want);
	emb_transport_stats(rs.tr, &st);
	CU_ASSERT_EQUAL(st.resp_unmatched, 1);
	CU_ASSERT_EQUAL(st.conns_closed, 0);
	raw_server_stop(&rs);
}

static void test_client_stalled_response(void)
{
	struct raw_server rs;
	struct result r = {0}, r2 = {0};
	struct emb_frame_hdr req, h = {.opcode = ECHO_OP_ECHO};
	struct emb_transport_stats st;
	char buf[1000], part[100] = {0};

	raw_server_start(&rs, 200);
	req = post(&rs, &r, buf, sizeof(buf));
	h = hdr(ECHO_OP_ECHO | EMB_OP_RESPONSE_BIT, 1000, req.req_id);
	raw_send(rs.fd, &h, sizeof(h));
	raw_send(rs.fd, part, sizeof(part)); /* and then nothing */
	wait_done(&rs, &r);
	CU_ASSERT_EQUAL(r.status, -ETIMEDOUT);
	/* Half a frame cannot be skipped: the conn is gone. */
	h = (struct emb_frame_hdr){.opcode = ECHO_OP_ECHO};
	CU_ASSERT_EQUAL(emb_conn_call(rs.c, &h, NULL, 0, NULL, 0, on_done, &r2),
			EMB_ECLOSED);
	emb_transport_stats(rs.tr, &st);
	CU_ASSERT_EQUAL(st.calls_timed_out, 1);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	raw_server_stop(&rs);
}

static void test_client_unread_request(void)
{
	size_t len = 16u << 20;
	struct raw_server rs;
	struct result r = {0};
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ECHO};
	struct emb_transport_stats st;
	char *big = calloc(1, len);
	struct iovec iov = {.iov_base = big, .iov_len = len};

	CU_ASSERT_FATAL(big != NULL);
	raw_server_start(&rs, 300);
	/* The raw server never reads: the request cannot all go out. */
	CU_ASSERT_EQUAL(emb_conn_call(rs.c, &h, &iov, 1, NULL, 0, on_done, &r),
			0);
	wait_done(&rs, &r);
	CU_ASSERT_EQUAL(r.status, -ETIMEDOUT);
	emb_transport_stats(rs.tr, &st);
	CU_ASSERT_EQUAL(st.calls_timed_out, 1);
	CU_ASSERT_EQUAL(st.conns_closed, 1);
	raw_server_stop(&rs);
	free(big);
}

/*
 * A peer that answers and then resets the conn (a process exiting with
 * input unread closes with RST): the answer came first, so it counts.
 * Both are in the socket before the client polls, so its loop sees the
 * error and the data in one event.
 */
static void test_client_reply_before_reset(void)
{
	struct raw_server rs;
	struct result r = {0};
	struct emb_frame_hdr req, h;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	uint64_t v = 0, want = 0x5eedf00d;

	raw_server_start(&rs, 10000);
	req = post(&rs, &r, &v, sizeof(v));
	h = hdr(ECHO_OP_ECHO | EMB_OP_RESPONSE_BIT, 8, req.req_id);
	raw_send(rs.fd, &h, sizeof(h));
	raw_send(rs.fd, &want, 8);
	CU_ASSERT_FATAL(setsockopt(rs.fd, SOL_SOCKET, SO_LINGER, &lg,
				   sizeof(lg)) == 0);
	close(rs.fd);
	rs.fd = -1;
	usleep(50 * 1000); /* loopback: both are there well before */
	wait_done(&rs, &r);
	CU_ASSERT_EQUAL(r.status, 0);
	CU_ASSERT_EQUAL(v, want);
	raw_server_stop(&rs);
}

static const struct emb_test_case cases[] = {
    {"closes only the conn that sends bad magic", test_bad_magic},
    {"closes only the conn that sends a bad version", test_bad_version},
    {"closes only the conn whose frame is over the limit", test_too_big},
    {"answers a refused frame with the frame reject_encode writes",
     test_reject_encoded},
    {"closes on a refused frame without a reply when no encoder is set",
     test_reject_unencoded},
    {"survives a peer that stops mid-header", test_truncated_header},
    {"survives a peer that stops mid-payload", test_truncated_payload},
    {"assembles frames written a byte at a time", test_byte_at_a_time},
    {"stops reading a slow reader and resumes when drained", test_slow_reader},
    {"bounds a slow reader with staged replies too", test_slow_reader_staged},
    {"sends staged small reply pieces intact", test_staged_replies},
    {"refuses conns while out of fds and recovers", test_fd_exhaustion},
    {"client closes on a response with bad magic", test_client_bad_response},
    {"client drops a response for an unknown request", test_client_unmatched},
    {"client times out a response that stops halfway",
     test_client_stalled_response},
    {"client times out a request the server never reads",
     test_client_unread_request},
    {"client takes a reply that came just before the peer reset the conn",
     test_client_reply_before_reset},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "transport", cases);
}
