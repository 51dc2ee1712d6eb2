/*
 * tests/server/test_conns.c - connections at the server's limits, over raw
 * TCP sockets: idle logged-in connections hold no receive memory, so
 * max_conns is reached before conn_mem_limit; every connection refused
 * (past max_conns, however many) is told why in an error frame before it
 * closes; a frame that stalls or trickles after it began is closed after
 * frame_timeout_ms while a connection idle between frames is not.
 * Waits are bounded by conditions (seconds), never by exact timings, so a
 * loaded machine only makes it slower.
 */
#include "server/server.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "harness.h"
#include "netutil.h"
#include "worker/embstore.h"

#define WAIT_MS 30000 /* the longest any condition is waited for */

/*
 * Sends HELLO and reads the answer: its status, and its error message (if
 * any) into msg. An nt_raw_recv() error if no frame came.
 */
static int hello_msg(int fd, char *msg, size_t cap)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 8 + EMB_WIRE_TOKEN_MAX +
				EMB_WIRE_CLIENT_NAME_MAX];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX + 8];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_error e;
	struct emb_wire_frame f;
	int len, rc;

	msg[0] = 0;
	len = emb_wire_hello_req_encode_flags(
	    buf, sizeof(buf), 1, EMB_WIRE_VERSION, 0, NULL, 0, "raw/tcp");
	CU_ASSERT_FATAL(len > 0);
	if (nt_raw_send(fd, buf, (size_t)len))
		return EMB_EPEERDEAD;
	rc = nt_raw_recv(fd, &f.hdr, resp, sizeof(resp));
	if (rc)
		return rc;
	CU_ASSERT_EQUAL(f.hdr.req_id, 1);
	if (f.hdr.status >= 0)
		return f.hdr.status;
	f.payload = resp;
	f.lim = &lim;
	if (emb_wire_error_decode(&f, &e) == 0)
		snprintf(msg, cap, "%.*s", (int)e.msg_len, e.msg);
	return f.hdr.status;
}

/* PING with an 8-byte payload; its status, or an nt_raw_recv() error. */
static int ping(int fd, uint64_t req_id)
{
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[64];
	struct emb_frame_hdr h = nt_hdr(EMB_OP_PING, req_id, 0, 0, 8);
	uint64_t body = req_id;
	int rc;

	emb_wire_hdr_encode(head, &h);
	if (nt_raw_send(fd, head, sizeof(head)) ||
	    nt_raw_send(fd, &body, sizeof(body)))
		return EMB_EPEERDEAD;
	rc = nt_raw_recv(fd, &h, resp, sizeof(resp));
	if (rc)
		return rc;
	CU_ASSERT_EQUAL(h.req_id, req_id);
	return h.status;
}

/* Server stats once done(stats) holds, or the last seen after WAIT_MS. */
static struct emb_server_stats
stats_until(struct emb_server *s, bool (*done)(const struct emb_server_stats *))
{
	uint64_t until = emb_clock_ms() + WAIT_MS;
	struct emb_server_stats ss;

	for (;;) {
		emb_server_stats(s, &ss);
		if (done(&ss) || emb_clock_ms() > until)
			return ss;
		usleep(20000);
	}
}

static bool no_conn_bytes(const struct emb_server_stats *ss)
{
	return ss->conn_bytes == 0;
}

/*
 * 64 connections log in and each sends a request under a receive budget
 * of 512 KiB, which a 64 KiB buffer per connection would spend by the 8th:
 * all are served, the 65th is refused for max_conns (with the reason), and
 * once idle they hold no receive memory at all.
 */
static void test_idle_conns_reach_max_conns(void)
{
	enum { N = 64 };
	struct emb_server_opts so = nt_server_opts();
	struct emb_server_stats ss;
	struct emb_server *s;
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	int fds[N], over;

	so.conn_mem_limit = 512u << 10;
	so.max_conns = N;
	s = nt_server_start(&so);
	for (int i = 0; i < N; i++) {
		fds[i] = nt_raw_connect(emb_server_port(s));
		CU_ASSERT_EQUAL_FATAL(hello_msg(fds[i], msg, sizeof(msg)), 0);
	}
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(ping(fds[i], 100 + (uint64_t)i), 0);
	over = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(hello_msg(over, msg, sizeof(msg)), EMB_ETOOMANYCONNS);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "server full: 64 connections"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "--max-conns"));
	CU_ASSERT(nt_raw_wait_closed(over));
	close(over);
	/* Idle: every buffer went back. */
	ss = stats_until(s, no_conn_bytes);
	CU_ASSERT_EQUAL(ss.conn_bytes, 0);
	/* And each one is still served. */
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(ping(fds[i], 200 + (uint64_t)i), 0);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	emb_server_destroy(s);
}

static char caught[1024]; /* log lines naming the connection limit */

static void catch_line(enum emb_log_level level, const char *line, void *arg)
{
	(void)arg;
	if (strstr(line, "--max-conns") &&
	    strlen(caught) + strlen(line) + 2 < sizeof(caught)) {
		strcat(caught, line);
		strcat(caught, "\n");
	}
	fprintf(stderr, "%d %s\n", (int)level, line);
}

/*
 * However many connections come past max_conns, each one is answered
 * with an error frame naming the limit, then closed: none is reset
 * without a word, also far past the point where they used to be.
 */
static void test_every_refusal_has_a_frame(void)
{
	enum { OVER = 100 };
	struct emb_server_opts so = nt_server_opts();
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	struct emb_server *s;
	int a, b, fds[OVER];

	so.max_conns = 2;
	s = nt_server_start(&so);
	a = nt_raw_connect(emb_server_port(s));
	b = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL(hello_msg(a, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(hello_msg(b, msg, sizeof(msg)), 0);
	/* All connect first, then all speak: the server sees 102 at once. */
	for (int i = 0; i < OVER; i++)
		fds[i] = nt_raw_connect(emb_server_port(s));
	for (int i = 0; i < OVER; i++) {
		int rc = hello_msg(fds[i], msg, sizeof(msg));

		CU_ASSERT_EQUAL(rc, EMB_ETOOMANYCONNS);
		if (rc != EMB_ETOOMANYCONNS)
			fprintf(stderr, "conn %d past the limit: %s\n", i,
				emb_strerror(rc));
		CU_ASSERT_PTR_NOT_NULL(strstr(msg, "--max-conns"));
		CU_ASSERT(nt_raw_wait_closed(fds[i]));
		close(fds[i]);
	}
	/* The client library returns the status and logs the message. */
	emb_log_set_sink(catch_line, NULL);
	{
		struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
		struct emb_client *c = NULL;
		char addr[64];
		uint16_t port = emb_server_port(s);

		nt_addr_list(addr, sizeof(addr), &port, 1);
		o.servers = addr;
		o.timeout_ms = 20000;
		o.name = "test";
		CU_ASSERT_EQUAL(emb_client_create(&o, &c), EMB_ETOOMANYCONNS);
		emb_client_destroy(c);
	}
	emb_log_set_sink(NULL, NULL);
	CU_ASSERT_PTR_NOT_NULL(strstr(caught, "server full: 2 connections"));
	/* The two inside are still served. */
	CU_ASSERT_EQUAL(ping(a, 7), 0);
	CU_ASSERT_EQUAL(ping(b, 8), 0);
	close(a);
	close(b);
	emb_server_destroy(s);
}

/* Reads one frame if one is there: 0, EMB_EPEERDEAD at EOF, 1 if none. */
static int poll_frame(int fd, struct emb_frame_hdr *h, char *msg, size_t cap)
{
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX + 8];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct pollfd p = {.fd = fd, .events = POLLIN};
	struct emb_wire_error e;
	struct emb_wire_frame f;
	int rc;

	if (poll(&p, 1, 0) <= 0)
		return 1;
	rc = nt_raw_recv(fd, &f.hdr, resp, sizeof(resp));
	if (rc)
		return rc;
	*h = f.hdr;
	msg[0] = 0;
	f.payload = resp;
	f.lim = &lim;
	if (f.hdr.status < 0 && emb_wire_error_decode(&f, &e) == 0)
		snprintf(msg, cap, "%.*s", (int)e.msg_len, e.msg);
	return 0;
}

/*
 * A logged-in peer that starts a frame and then sends one byte every
 * 50 ms (far slower than the frame's 300 ms bound allows), and one that
 * stops mid-frame, are both answered with -ETIMEDOUT and closed; a peer
 * idle between frames for longer than the bound is still served.
 */
static void test_slow_frames_close(void)
{
	struct emb_server_opts so = nt_server_opts();
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	struct emb_frame_hdr h;
	struct emb_server *s;
	uint64_t until;
	int slow, stalled, idle, rc = 1;
	uint8_t byte = 0;

	so.frame_timeout_ms = 300;
	s = nt_server_start(&so);
	slow = nt_raw_connect(emb_server_port(s));
	stalled = nt_raw_connect(emb_server_port(s));
	idle = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL_FATAL(hello_msg(slow, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL_FATAL(hello_msg(stalled, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL_FATAL(hello_msg(idle, msg, sizeof(msg)), 0);

	/* A 4 KiB PING, of which the stalled peer sends 100 bytes. */
	h = nt_hdr(EMB_OP_PING, 11, 0, 0, 4096);
	emb_wire_hdr_encode(head, &h);
	CU_ASSERT_EQUAL(nt_raw_send(stalled, head, sizeof(head)), 0);
	CU_ASSERT_EQUAL(nt_raw_send(stalled, msg, 100), 0);
	h.req_id = 12;
	emb_wire_hdr_encode(head, &h);
	CU_ASSERT_EQUAL(nt_raw_send(slow, head, sizeof(head)), 0);
	/* 4096 bytes at 20 a second would take minutes. */
	until = emb_clock_ms() + WAIT_MS;
	while (emb_clock_ms() < until) {
		rc = poll_frame(slow, &h, msg, sizeof(msg));
		if (rc != 1)
			break;
		if (nt_raw_send(slow, &byte, 1))
			break; /* closed under us: the read tells */
		usleep(50000);
	}
	if (rc == 1)
		rc = nt_raw_recv(slow, &h, msg, 0);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(h.req_id, 12);
	CU_ASSERT_EQUAL(h.status, -ETIMEDOUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "--frame-timeout"));
	CU_ASSERT(nt_raw_wait_closed(slow));

	CU_ASSERT_EQUAL(nt_raw_recv(stalled, &h, msg, 0), 0);
	CU_ASSERT_EQUAL(h.req_id, 11);
	CU_ASSERT_EQUAL(h.status, -ETIMEDOUT);
	CU_ASSERT(nt_raw_wait_closed(stalled));

	/* Idle between frames far longer than the bound: still served. */
	CU_ASSERT_EQUAL(ping(idle, 13), 0);
	close(slow);
	close(stalled);
	close(idle);
	emb_server_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"idle logged-in conns hold no receive memory: max_conns comes "
	     "first",
	     test_idle_conns_reach_max_conns},
	    {"every conn past max_conns gets an error frame, then closes",
	     test_every_refusal_has_a_frame},
	    {"a frame slower than frame_timeout_ms is answered and closed",
	     test_slow_frames_close},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "server/conns", cases);
}
