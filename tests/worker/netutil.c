/*
 * tests/worker/netutil.c - servers, clients and a raw TCP peer for the
 * worker suites (see netutil.h). For the test's main thread.
 */
#include "netutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_msg.h"
#include "harness.h"

#define RAW_TIMEOUT_S 5

static void sleep_ms(uint32_t ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

struct emb_server_opts nt_server_opts(void)
{
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;

	o.port = 0;
	o.threads = 2;
	o.table_shards = 8;
	return o;
}

struct emb_server *nt_server_start(const struct emb_server_opts *o)
{
	struct emb_server *s = NULL;
	int rc = emb_server_create(o, &s);

	if (rc)
		fprintf(stderr, "emb_server_create: %s\n", emb_strerror(rc));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_NOT_EQUAL_FATAL(emb_server_port(s), 0);
	return s;
}

void nt_addr_list(char *buf, size_t cap, const uint16_t *ports, uint32_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < n && off < cap; i++)
		off += (size_t)snprintf(buf + off, cap - off, "%s127.0.0.1:%u",
					i ? "," : "", ports[i]);
}

struct emb_client *nt_client(const char *servers, uint32_t timeout_ms)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	int rc;

	o.servers = servers;
	o.timeout_ms = timeout_ms ? timeout_ms : 5000;
	o.name = "test";
	rc = emb_client_create(&o, &c);
	if (rc)
		fprintf(stderr, "emb_client_create(%s): %s\n", servers,
			emb_strerror(rc));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	return c;
}

struct emb_table_spec nt_spec(const char *name, uint32_t dim, uint64_t seed)
{
	struct emb_table_spec sp = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = name,
	    .dim = dim,
	    .optim = EMB_OPTIM_CFG_DEFAULT,
	    .init = EMB_INIT_CFG_DEFAULT,
	    .seed = seed,
	};

	return sp;
}

uint64_t nt_server_wait_conns(struct emb_server *s, uint64_t want)
{
	struct emb_server_stats st;

	for (int i = 0; i < 500; i++) {
		emb_server_stats(s, &st);
		if (st.conns_open == want)
			break;
		sleep_ms(10);
	}
	return st.conns_open;
}

/* ---- raw peer ---- */

int nt_raw_connect(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct timeval tv = {RAW_TIMEOUT_S, 0};
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CU_ASSERT_FATAL(fd >= 0);
	sa.sin_port = htons(port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CU_ASSERT_EQUAL_FATAL(connect(fd, (struct sockaddr *)&sa, sizeof(sa)),
			      0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

int nt_raw_send(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads exactly len bytes into buf (NULL: discard). */
static int read_full(int fd, void *buf, size_t len)
{
	char junk[4096];
	char *p = buf;

	while (len) {
		size_t want = p ? len : (len < sizeof(junk) ? len : sizeof(junk));
		ssize_t n = recv(fd, p ? p : junk, want, 0);

		if (n == 0)
			return EMB_EPEERDEAD;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return -ETIMEDOUT;
			return errno == ECONNRESET ? EMB_EPEERDEAD : -errno;
		}
		if (p)
			p += n;
		len -= (size_t)n;
	}
	return 0;
}

int nt_raw_recv(int fd, struct emb_frame_hdr *hdr, void *payload,
		size_t cap)
{
	_Alignas(8) uint8_t raw[EMB_WIRE_HDR_SIZE];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	size_t keep;
	int rc;

	rc = read_full(fd, raw, sizeof(raw));
	if (rc)
		return rc;
	/* Framing only: an error response may echo an opcode that is no
	 * opcode, which emb_wire_hdr_decode() would refuse. */
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	rc = emb_wire_hdr_decode(raw, sizeof(raw), &lim, hdr);
	if (rc == EMB_EBADOP) {
		memcpy(hdr, raw, sizeof(*hdr));
		rc = 0;
	}
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	keep = hdr->payload_len < cap ? hdr->payload_len : cap;
	rc = read_full(fd, payload, keep);
	if (!rc)
		rc = read_full(fd, NULL, hdr->payload_len - keep);
	return rc;
}

int nt_raw_hello(int fd, const void *token, uint32_t token_len)
{
	return nt_raw_hello_flags(fd, 0, token, token_len);
}

int nt_raw_hello_flags(int fd, uint16_t flags, const void *token,
		       uint32_t token_len)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 8 + EMB_WIRE_TOKEN_MAX +
				EMB_WIRE_CLIENT_NAME_MAX];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_frame_hdr h;
	int len, rc;

	len = emb_wire_hello_req_encode_flags(buf, sizeof(buf), 1,
					      EMB_WIRE_VERSION, flags, token,
					      token_len, "raw/tcp");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	rc = nt_raw_recv(fd, &h, resp, sizeof(resp));
	if (rc)
		return rc;
	CU_ASSERT_EQUAL(h.opcode, EMB_OP_HELLO | EMB_OP_RESPONSE_BIT);
	CU_ASSERT_EQUAL(h.req_id, 1);
	return h.status;
}

bool nt_raw_wait_closed(int fd)
{
	struct emb_frame_hdr h;
	uint8_t junk[64];
	int rc;

	while ((rc = nt_raw_recv(fd, &h, junk, sizeof(junk))) == 0)
		;
	return rc == EMB_EPEERDEAD;
}

bool nt_raw_quiet(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	return poll(&p, 1, ms) == 0;
}

struct emb_frame_hdr nt_hdr(uint8_t op, uint64_t req_id, uint32_t table_id,
			    uint32_t count, uint32_t payload_len)
{
	struct emb_frame_hdr h = {
		.magic = EMB_WIRE_MAGIC,
		.version = EMB_WIRE_VERSION,
		.opcode = op,
		.req_id = req_id,
		.table_id = table_id,
		.count = count,
		.payload_len = payload_len,
	};

	return h;
}

/* ---- embstore-server as a child process ---- */

/* Finds "listening on 127.0.0.1:PORT" in the child's log. */
static bool log_port(const char *path, uint16_t *port)
{
	char line[1024];
	bool found = false;
	FILE *f = fopen(path, "r");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "listening on 127.0.0.1:");
		unsigned v;

		if (p && sscanf(p, "listening on 127.0.0.1:%u", &v) == 1 &&
		    v > 0 && v < 65536) {
			*port = (uint16_t)v;
			found = true;
		}
	}
	fclose(f);
	return found;
}

void nt_child_start(struct nt_child *ch, const char *const *args)
{
	const char *bin = getenv("EMB_SERVER_BIN");
	const char *argv[32];
	int n = 0, fd, status;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	memset(ch, 0, sizeof(*ch));
	snprintf(ch->log, sizeof(ch->log), "%s/emb-net-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	fd = mkstemp(ch->log);
	CU_ASSERT_FATAL(fd >= 0);
	argv[n++] = bin;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--threads";
	argv[n++] = "1";
	while (args && *args && n < 30)
		argv[n++] = *args++;
	argv[n] = NULL;

	ch->pid = fork();
	CU_ASSERT_FATAL(ch->pid >= 0);
	if (ch->pid == 0) {
		/* A file, not a pipe: nobody drains a pipe once the port is
		 * read, and a full pipe would block the server's logging. */
		dup2(fd, STDERR_FILENO);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	close(fd);
	for (int i = 0; i < 1000; i++) {
		if (log_port(ch->log, &ch->port))
			return;
		if (waitpid(ch->pid, &status, WNOHANG) == ch->pid) {
			ch->pid = 0;
			break;
		}
		sleep_ms(10);
	}
	fprintf(stderr, "%s did not report a port (log %s)\n", bin, ch->log);
	nt_child_reap(ch, SIGKILL);
	CU_FAIL_FATAL("embstore-server did not start");
}

void nt_child_reap(struct nt_child *ch, int sig)
{
	if (ch->pid > 0) {
		if (sig)
			kill(ch->pid, sig);
		waitpid(ch->pid, NULL, 0);
		ch->pid = 0;
	}
	if (ch->log[0]) {
		unlink(ch->log);
		ch->log[0] = '\0';
	}
}

void nt_print_file(const char *path, const char *prefix)
{
	char line[1024];
	FILE *f = fopen(path, "r");

	if (!f) {
		fprintf(stderr, "%scannot open %s\n", prefix, path);
		return;
	}
	while (fgets(line, sizeof(line), f))
		fprintf(stderr, "%s%s", prefix, line);
	fclose(f);
}

int nt_child_exit(struct nt_child *ch, int timeout_ms)
{
	int status, code = -1;

	for (int waited = 0; ch->pid > 0; waited += 10) {
		pid_t r = waitpid(ch->pid, &status, WNOHANG);

		if (r == ch->pid) {
			code = WIFEXITED(status) ? WEXITSTATUS(status)
						 : 128 + WTERMSIG(status);
			ch->pid = 0;
			break;
		}
		if (r < 0 && errno != EINTR) {
			ch->pid = 0;
			break;
		}
		if (waited >= timeout_ms) {
			fprintf(stderr, "pid %d has not exited in %d ms: "
				"killed\n", (int)ch->pid, timeout_ms);
			kill(ch->pid, SIGKILL);
			waitpid(ch->pid, NULL, 0);
			ch->pid = 0;
			break;
		}
		sleep_ms(10);
	}
	if (code != 0) {
		if (code < 0)
			fprintf(stderr, "no exit status; its log %s:\n",
				ch->log);
		else
			fprintf(stderr, "exit status %d; its log %s:\n", code,
				ch->log);
		nt_print_file(ch->log, "  | ");
	}
	return code;
}

float nt_dyadic(uint64_t *rng)
{
	return (float)((int)(emb_splitmix64(rng) % 129) - 64) / 64.0f;
}

struct emb_table *nt_ref_table(const struct emb_table_spec *sp)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table *t = NULL;

	o.name = sp->name;
	o.dim = sp->dim;
	o.optim = sp->optim;
	o.init = sp->init;
	o.seed = sp->seed;
	o.nshards = 4;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &t), 0);
	return t;
}
