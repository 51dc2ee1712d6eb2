/*
 * tests/tools/test_stat.c - emb_client_server_stats() (worker/admin.c) and
 * the `embstore stat` command against two in-process servers.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "harness.h"
#include "server/server.h"
#include "worker/embstore.h"

#define DIM  4
#define NIDS 1000

static struct emb_server *srv[2];
static struct emb_client *cli;
static struct emb_client_table *tab;
static char addrs[64];

static void start(void)
{
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = "clicks",
	    .dim = DIM,
	    .optim = EMB_OPTIM_CFG_DEFAULT,
	    .init = EMB_INIT_CFG_DEFAULT,
	    .seed = 3,
	};
	static uint64_t ids[NIDS];
	static float rows[NIDS * DIM];

	o.port = 0;
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL_FATAL(emb_server_create(&o, &srv[i]), 0);
	snprintf(addrs, sizeof(addrs), "127.0.0.1:%u,127.0.0.1:%u",
		 emb_server_port(srv[0]), emb_server_port(srv[1]));
	co.servers = addrs;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &cli), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &tab), 0);
	for (uint32_t i = 0; i < NIDS; i++)
		ids[i] = (uint64_t)i * 104729u + 1;
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(tab, ids, NIDS, rows, 0, NULL), 0);
}

static void stop(void)
{
	emb_client_table_close(tab);
	emb_client_destroy(cli);
	for (int i = 0; i < 2; i++)
		emb_server_destroy(srv[i]);
	tab = NULL;
	cli = NULL;
}

static void test_server_stats(void)
{
	struct emb_client_server_table t[4] = {
	    EMB_SIZED(struct emb_client_server_table)};
	struct emb_client_server_table one =
	    EMB_SIZED(struct emb_client_server_table);
	uint64_t rows = 0, pulled = 0;

	start();
	CU_ASSERT_EQUAL_FATAL(emb_client_server_stats(cli, t, 4), 2);
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(t[i].server, (uint32_t)i);
		CU_ASSERT_STRING_EQUAL(t[i].name, "clicks");
		CU_ASSERT_EQUAL(t[i].dim, DIM);
		CU_ASSERT(t[i].rows > 0); /* ids spread over both */
		CU_ASSERT(t[i].bytes > 0);
		CU_ASSERT_EQUAL(t[i].pulls, 1);
		CU_ASSERT_EQUAL(t[i].pushes, 0);
		CU_ASSERT_EQUAL(t[i].rows_created, t[i].rows);
		rows += t[i].rows;
		pulled += t[i].rows_pulled;
	}
	CU_ASSERT_EQUAL(rows, NIDS);
	CU_ASSERT_EQUAL(pulled, NIDS);
	/* Too little room: the count says how much to ask for. */
	CU_ASSERT_EQUAL(emb_client_server_stats(cli, &one, 1), 2);
	CU_ASSERT_EQUAL(emb_client_server_stats(cli, NULL, 0), 2);
	CU_ASSERT_EQUAL(emb_client_server_stats(NULL, t, 4), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_client_table_drop(tab), 0);
	CU_ASSERT_EQUAL(emb_client_server_stats(cli, t, 4), 0);
	stop();
}

/*
 * A server gone: emb_client_server_stats() fails whole, and
 * emb_client_server_stats_each() lists the other's tables and says why
 * the gone one gave none.
 */
static void test_server_stats_each(void)
{
	struct emb_client_server_table t[4] = {
	    EMB_SIZED(struct emb_client_server_table)};
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c;
	int err[2] = {-1, -1};

	start();
	co.servers = addrs;
	co.timeout_ms = 500; /* the gone server's part ends at its deadline */
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
	CU_ASSERT_EQUAL(emb_client_server_stats_each(c, t, 4, err, 2), 2);
	CU_ASSERT(err[0] == 0 && err[1] == 0);
	emb_server_destroy(srv[1]);
	srv[1] = NULL;
	CU_ASSERT(emb_client_server_stats(c, t, 4) < 0);
	CU_ASSERT_EQUAL(emb_client_server_stats_each(c, t, 4, err, 2), 1);
	CU_ASSERT_EQUAL(t[0].server, 0);
	CU_ASSERT_STRING_EQUAL(t[0].name, "clicks");
	CU_ASSERT(t[0].rows > 0);
	CU_ASSERT_EQUAL(err[0], 0);
	CU_ASSERT(err[1] < 0);
	/* err must have a place for every server. */
	CU_ASSERT_EQUAL(emb_client_server_stats_each(c, t, 4, err, 1),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_client_server_stats_each(c, t, 4, NULL, 2),
			EMB_EBADARG);
	/* None answering: the first one's error. */
	emb_server_destroy(srv[0]);
	srv[0] = NULL;
	CU_ASSERT(emb_client_server_stats_each(c, t, 4, err, 2) < 0);
	CU_ASSERT(err[0] < 0 && err[1] < 0);
	emb_client_destroy(c);
	stop();
}

/* Runs the CLI with args, output in out (cap bytes); the exit status. */
static int run_cli(const char *args, char *out, size_t cap)
{
	const char *bin = getenv("EMB_CLI_BIN");
	char cmd[512];
	size_t n = 0;
	FILE *p;
	int st;

	out[0] = '\0';
	if (!bin)
		return -1;
	snprintf(cmd, sizeof(cmd), "%s stat %s 2>&1", bin, args);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (n + 1 < cap) {
		size_t r = fread(out + n, 1, cap - n - 1, p);

		if (!r)
			break;
		n += r;
	}
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void)
{
	char args[256], out[8192], want[64];
	struct emb_client_server_table t[2] = {
	    EMB_SIZED(struct emb_client_server_table)};

	start();
	CU_ASSERT_EQUAL_FATAL(emb_client_server_stats(cli, t, 2), 2);
	snprintf(args, sizeof(args), "--servers %s --interval 0.2", addrs);
	CU_ASSERT_EQUAL(run_cli(args, out, sizeof(out)), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "ROWS"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "2 servers, 2 tables"));
	for (int i = 0; i < 2; i++) {
		/* The server's line names the table and shows its rows. */
		char *line;

		snprintf(want, sizeof(want), "127.0.0.1:%u",
			 emb_server_port(srv[i]));
		line = strstr(out, want);
		CU_ASSERT_PTR_NOT_NULL_FATAL(line);
		snprintf(want, sizeof(want), " %llu ",
			 (unsigned long long)t[i].rows);
		CU_ASSERT_PTR_NOT_NULL(strstr(line, "clicks"));
		CU_ASSERT_PTR_NOT_NULL(strstr(line, want));
	}
	/* Not a terminal: no escape sequences in the output. */
	CU_ASSERT_PTR_NULL(strchr(out, '\033'));
	if (!strstr(out, "clicks"))
		fprintf(stderr, "%s", out);

	CU_ASSERT_EQUAL(run_cli("--servers 127.0.0.1:1", out, sizeof(out)), 1);
	/* No scheduler there: a clear error, not a hang. */
	CU_ASSERT_EQUAL(run_cli("--sched 127.0.0.1:1", out, sizeof(out)), 1);
	CU_ASSERT_EQUAL(run_cli("--servers ''", out, sizeof(out)), 2);
	CU_ASSERT_EQUAL(
	    run_cli("--servers 127.0.0.1:7164 --watch x", out, sizeof(out)), 2);
	stop();
}

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

static void test_watch_restart(void)
{
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;
	const char *bin = getenv("EMB_CLI_BIN");
	char *dir = emb_test_tmpdir(), out[512], cmd[1024];
	uint16_t port;
	int st, rc = -1;
	pid_t pid;
	FILE *p;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	start();
	snprintf(out, sizeof(out), "%s/watch.out", dir);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		execl(bin, bin, "stat", "--servers", addrs, "--watch", "0.2",
		      (char *)NULL);
		_exit(127);
	}
	nap_ms(700);
	/* Server 0 goes away and comes back on its port, empty. */
	port = emb_server_port(srv[0]);
	emb_server_destroy(srv[0]);
	nap_ms(500);
	o.port = port;
	for (int i = 0; i < 50 && rc; i++) {
		rc = emb_server_create(&o, &srv[0]);
		if (rc)
			nap_ms(50);
	}
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	nap_ms(1200);
	/* Still watching: Ctrl-C ends it with 0. */
	CU_ASSERT_EQUAL(waitpid(pid, &st, WNOHANG), 0);
	kill(pid, SIGINT);
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* And it drew tables after the restart (an empty server 0 lists no
	 * table, so the header says one). */
	snprintf(cmd, sizeof(cmd), "grep -c '2 servers, 1 table' %s", out);
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT(fscanf(p, "%d", &rc) == 1 && rc >= 2);
	pclose(p);
	stop();
	emb_test_rmtree(dir);
	free(dir);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"per-server stats list each server's tables and counters",
	     test_server_stats},
	    {"per-server stats over the servers that answer",
	     test_server_stats_each},
	    {"embstore stat prints a line per server and table", test_cli},
	    {"embstore stat --watch goes on through a server restart",
	     test_watch_restart},
	    {NULL, NULL},
	};

	emb_log_set_level(EMB_LOG_WARN);
	return emb_test_main(argc, argv, "stat", cases);
}
