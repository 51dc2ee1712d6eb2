/*
 * tests/worker/test_failures.c - the client against embstore-server child
 * processes that die (SIGKILL) or hang (SIGSTOP): every call must come back
 * with an error within the client's timeout, never hang, and servers that
 * are still alive keep answering. Also runs the daemon's own flags (token
 * file, id limit) and its clean exit on SIGTERM.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "harness.h"
#include "netutil.h"

#define TIMEOUT_MS 500u
#define DIM 8u

static struct emb_client *client_of(const struct nt_child *ch, uint32_t n)
{
	uint16_t ports[4];
	char addr[128];

	for (uint32_t i = 0; i < n; i++)
		ports[i] = ch[i].port;
	nt_addr_list(addr, sizeof(addr), ports, n);
	return nt_client(addr, TIMEOUT_MS);
}

static void fill_ids(uint64_t *ids, uint32_t n, uint64_t base)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = base + i;
}

static void test_killed(void)
{
	struct emb_table_spec sp = nt_spec("k", DIM, 1);
	struct emb_client_table_stats st;
	struct emb_client_table *t;
	struct emb_async *op;
	struct emb_client *c;
	struct nt_child ch;
	uint64_t ids[64];
	float rows[64 * DIM];

	nt_child_start(&ch, NULL);
	c = client_of(&ch, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	fill_ids(ids, 64, 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL), 0);

	nt_child_reap(&ch, SIGKILL);
	CU_ASSERT_NOT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL),
			    0);
	CU_ASSERT_NOT_EQUAL(emb_client_table_push(t, ids, 64, rows, 1, 0), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(t, ids, 64, rows, 0,
							  NULL, &op), 0);
	CU_ASSERT_NOT_EQUAL(emb_async_wait(op), 0);
	CU_ASSERT_NOT_EQUAL(emb_client_table_stats(t, &st), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
}

static void test_hung(void)
{
	struct emb_table_spec sp = nt_spec("h", DIM, 1);
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client_table *t;
	struct emb_client *c, *c2 = NULL;
	struct emb_async *op;
	struct nt_child ch;
	uint64_t ids[64];
	float rows[64 * DIM];
	char addr[64];
	int status = -1;

	nt_child_start(&ch, NULL);
	c = client_of(&ch, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	fill_ids(ids, 64, 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL), 0);

	/* The kernel still accepts bytes for a stopped process, so requests
	 * go out and only the deadline can end them. */
	CU_ASSERT_EQUAL_FATAL(kill(ch.pid, SIGSTOP), 0);
	/* kill() returns before every thread has stopped; this does not. */
	CU_ASSERT_EQUAL_FATAL(waitpid(ch.pid, &status, WUNTRACED), ch.pid);
	CU_ASSERT_FATAL(WIFSTOPPED(status));
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL),
			-ETIMEDOUT);
	CU_ASSERT_NOT_EQUAL(emb_client_table_push(t, ids, 64, rows, 1, 0), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull_async(t, ids, 64, rows, 0,
							  NULL, &op), 0);
	CU_ASSERT_NOT_EQUAL(emb_async_wait(op), 0);
	/* A new client gets its connection from the backlog, then no HELLO
	 * answer. */
	nt_addr_list(addr, sizeof(addr), &ch.port, 1);
	co.servers = addr;
	co.timeout_ms = TIMEOUT_MS;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c2), -ETIMEDOUT);

	/* Woken up, the server still stops cleanly on SIGTERM. */
	CU_ASSERT_EQUAL(kill(ch.pid, SIGCONT), 0);
	CU_ASSERT_EQUAL(kill(ch.pid, SIGTERM), 0);
	CU_ASSERT_EQUAL(waitpid(ch.pid, &status, 0), ch.pid);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	ch.pid = 0;
	nt_child_reap(&ch, 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
}

static void test_one_of_two_dies(void)
{
	enum { N = 256 };
	struct emb_table_spec sp = nt_spec("half", DIM, 4);
	struct emb_client_table *t;
	struct emb_client *c;
	struct nt_child ch[2];
	uint64_t ids[N], live[N];
	float rows[N * DIM], before[N * DIM];
	uint32_t nlive = 0;

	nt_child_start(&ch[0], NULL);
	nt_child_start(&ch[1], NULL);
	c = client_of(ch, 2);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	fill_ids(ids, N, 7000);
	for (uint32_t i = 0; i < N; i++)
		if (emb_client_server_of(c, ids[i]) == 0)
			live[nlive++] = ids[i];
	CU_ASSERT_FATAL(nlive > 0 && nlive < N);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, live, nlive, before, 0, NULL),
			0);

	nt_child_reap(&ch[1], SIGKILL);
	/* A batch that needs the dead server fails as a whole... */
	CU_ASSERT_NOT_EQUAL(emb_client_table_pull(t, ids, N, rows, 0, NULL),
			    0);
	/* ...and one that does not is served as before. */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, live, nlive, rows, 0, NULL),
			0);
	CU_ASSERT_EQUAL(memcmp(rows, before, nlive * DIM * sizeof(float)), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	nt_child_reap(&ch[0], SIGTERM);
}

static void test_refused(void)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	struct nt_child ch;
	char addr[64];

	/* A port that was just served and is closed now. */
	nt_child_start(&ch, NULL);
	nt_child_reap(&ch, SIGKILL);
	nt_addr_list(addr, sizeof(addr), &ch.port, 1);
	co.servers = addr;
	co.timeout_ms = TIMEOUT_MS;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), -ECONNREFUSED);
	co.servers = "127.0.0.1";
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), -EINVAL);
}

static void test_daemon_flags(void)
{
	static const char token[] = "daemon-token";
	struct emb_table_spec sp = nt_spec("flags", DIM, 9);
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client_table_stats st;
	struct emb_client_table *t;
	struct emb_client_stats cs;
	struct emb_client *c = NULL;
	struct nt_child ch;
	char path[256], addr[64];
	const char *args[6];
	uint64_t ids[100];
	float rows[100 * DIM];
	FILE *f;

	snprintf(path, sizeof(path), "%s/emb-token-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	{
		int fd = mkstemp(path);

		CU_ASSERT_FATAL(fd >= 0);
		f = fdopen(fd, "w");
	}
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fprintf(f, "%s\n", token);
	fclose(f);
	args[0] = "--auth-token-file";
	args[1] = path;
	args[2] = "--max-ids";
	args[3] = "16";
	args[4] = NULL;
	nt_child_start(&ch, args);
	unlink(path);

	nt_addr_list(addr, sizeof(addr), &ch.port, 1);
	co.servers = addr;
	co.timeout_ms = 5000;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), EMB_EAUTH);
	co.auth_token = (const uint8_t *)token;
	co.auth_token_len = sizeof(token) - 1;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	/* 100 ids against max_ids 16: the client splits into 7 requests. */
	fill_ids(ids, 100, 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 100, rows, 0, NULL), 0);
	emb_client_stats(c, &cs);
	CU_ASSERT(cs.requests >= 7);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.rows, 100);
	emb_client_table_close(t);
	emb_client_destroy(c);
	nt_child_reap(&ch, SIGTERM);
}

static const struct emb_test_case cases[] = {
	{"a killed server fails every call instead of hanging", test_killed},
	{"a stopped server times calls out; it still exits on SIGTERM",
	 test_hung},
	{"with one of two servers dead, ids on the live one are served",
	 test_one_of_two_dies},
	{"connecting to a closed port is refused", test_refused},
	{"the daemon's token file and id limit are honoured",
	 test_daemon_flags},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	/* A dead peer must show up as an error, not as SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	return emb_test_main(argc, argv, "worker", cases);
}
