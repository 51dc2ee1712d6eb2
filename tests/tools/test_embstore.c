/*
 * tests/tools/test_embstore.c - the embstore CLI and server checkpoints end
 * to end: real embstore-server child processes ($EMB_SERVER_BIN) on
 * loopback, the built embstore ($EMB_CLI_BIN), the client library to train.
 * Checks that a dump restored onto two servers holds every row with its
 * optimizer state, that Adam training continued after a restore is
 * bit-identical to training never interrupted, that damaged dumps and dim
 * mismatches are refused without touching the cluster, and that a server
 * killed with SIGKILL comes back with every row of its last checkpoint.
 */
#include <arpa/inet.h>
#include <math.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#include "common/err.h"
#include "common/hash.h"
#include "common/init.h"
#include "common/log.h"
#include "common/rowfmt.h"
#include "proto/wire.h"
#include "store/snapshot.h"
#include "worker/embstore.h"

#define NIDS 3000u
#define DIM  8u

static char *tmp;
static const char *server_bin;
static const char *cli_bin;

struct srv {
	pid_t pid;
	uint16_t port;
};

static uint16_t free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CU_ASSERT_FATAL(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CU_ASSERT_FATAL(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/*
 * Runs embstore-server --listen 127.0.0.1:port --threads 1 args... (NULL-
 * terminated) with its log in tmp; returns the child's pid.
 */
static pid_t srv_spawn(uint16_t port, const char *const *args)
{
	char listen[64], log[600];
	const char *argv[32];
	int n = 0;
	pid_t pid;

	snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
	snprintf(log, sizeof(log), "%s/server-%u.log", tmp, port);
	argv[n++] = server_bin;
	argv[n++] = "--listen";
	argv[n++] = listen;
	argv[n++] = "--threads";
	argv[n++] = "1";
	while (args && *args && n < 31)
		argv[n++] = *args++;
	argv[n] = NULL;
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		dup2(fd, 2);
		execv(server_bin, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* Waits up to 10 s for pid to exit: its exit status, or -1. */
static int exit_status(pid_t pid)
{
	int st;

	for (int i = 0; i < 1000; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		sleep_ms(10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* Whether a server on port answers within 5 s (a client connects). */
static bool wait_up(uint16_t port)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	char servers[64];

	snprintf(servers, sizeof(servers), "127.0.0.1:%u", port);
	/* The client retries while the server starts: refusals expected. */
	if (!getenv("EMB_TEST_LOG"))
		emb_log_set_level(EMB_LOG_ERROR);
	co.servers = servers;
	co.timeout_ms = 2000;
	for (int i = 0; i < 200; i++) {
		if (emb_client_create(&co, &c) == 0)
			break;
		sleep_ms(25);
	}
	if (!c)
		return false;
	emb_client_destroy(c);
	return true;
}

/* Starts embstore-server; ckpt_dir may be NULL. Waits until it answers. */
static struct srv srv_start(const char *ckpt_dir, const char *interval)
{
	char listen[64], log[600];
	struct srv s = {.port = free_port()};

	snprintf(listen, sizeof(listen), "127.0.0.1:%u", s.port);
	snprintf(log, sizeof(log), "%s/server-%u.log", tmp, s.port);
	s.pid = fork();
	CU_ASSERT_FATAL(s.pid >= 0);
	if (s.pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		dup2(fd, 2);
		if (ckpt_dir)
			execl(server_bin, server_bin, "--listen", listen,
			      "--threads", "1", "--checkpoint-dir", ckpt_dir,
			      "--checkpoint-interval", interval, (char *)NULL);
		else
			execl(server_bin, server_bin, "--listen", listen,
			      "--threads", "1", (char *)NULL);
		_exit(127);
	}
	CU_ASSERT_FATAL(wait_up(s.port));
	return s;
}

static void srv_stop(struct srv *s, int sig)
{
	int st;

	if (s->pid <= 0)
		return;
	kill(s->pid, sig);
	waitpid(s->pid, &st, 0);
	s->pid = 0;
}

static struct emb_client *connect_to(const struct srv *s, int n)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	char servers[256] = "";

	for (int i = 0; i < n; i++)
		snprintf(servers + strlen(servers),
			 sizeof(servers) - strlen(servers), "%s127.0.0.1:%u",
			 i ? "," : "", s[i].port);
	co.servers = servers;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c), 0);
	return c;
}

static struct emb_table_spec adam_spec(uint32_t dim)
{
	struct emb_table_spec sp = {.struct_size =
					sizeof(struct emb_table_spec),
				    .name = "emb",
				    .dim = dim,
				    .optim = EMB_OPTIM_CFG_DEFAULT,
				    .init = EMB_INIT_CFG_DEFAULT,
				    .seed = 42};

	sp.optim.kind = EMB_OPTIM_ADAM;
	sp.optim.lr = 0.01f;
	return sp;
}

static uint64_t *test_ids(void)
{
	uint64_t *ids = calloc(NIDS, sizeof(*ids));
	uint64_t st = 77;

	CU_ASSERT_PTR_NOT_NULL_FATAL(ids);
	for (uint32_t i = 0; i < NIDS; i++)
		ids[i] = emb_splitmix64(&st) >> 8;
	return ids;
}

/* Deterministic steps first..first+n of training over a slice of ids. */
static void train(struct emb_client_table *t, const uint64_t *ids,
		  uint32_t first, uint32_t n)
{
	uint32_t batch = 500;
	float *g = calloc((size_t)batch * DIM, sizeof(float));

	CU_ASSERT_PTR_NOT_NULL_FATAL(g);
	for (uint32_t step = first; step < first + n; step++) {
		uint64_t st = 1000 + step;
		uint32_t off = (step * 377) % (NIDS - batch);

		for (uint32_t j = 0; j < batch * DIM; j++)
			g[j] = (float)((int32_t)(emb_splitmix64(&st) >> 40) -
				       (1 << 23)) /
			       (float)(1 << 23);
		CU_ASSERT_EQUAL(
		    emb_client_table_push(t, ids + off, batch, g, step, 0), 0);
	}
	free(g);
}

/* Runs the CLI with args; returns its exit status. */
static int run_cli(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_cli(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int n, st;

	n = snprintf(cmd, sizeof(cmd), "%s ", cli_bin);
	va_start(ap, fmt);
	vsnprintf(cmd + n, sizeof(cmd) - (size_t)n, fmt, ap);
	va_end(ap);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* All rows of a dump directory, sorted by id. */
struct rowset {
	uint64_t *ids;
	float *rows;
	uint32_t rf;
	uint64_t n;
};

static int cmp_u64_idx(const void *a, const void *b, void *arg)
{
	const uint64_t *ids = arg;
	uint64_t x = ids[*(const uint64_t *)a], y = ids[*(const uint64_t *)b];

	return x < y ? -1 : x > y;
}

static struct rowset read_dump(const char *dir)
{
	struct emb_snap_entry *e = NULL;
	struct rowset rs = {0}, out = {0};
	uint64_t *idx;
	uint32_t n = 0;
	char p[1200];

	CU_ASSERT_EQUAL_FATAL(emb_snap_manifest_read(dir, &e, &n, NULL), 0);
	for (uint32_t i = 0; i < n; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		const struct emb_snap_meta *m;

		snprintf(p, sizeof(p), "%s/%s", dir, e[i].file);
		CU_ASSERT_EQUAL_FATAL(emb_snap_reader_open(p, 0, &r), 0);
		m = emb_snap_reader_meta(r);
		rs.rf = m->row_floats;
		rs.ids = realloc(rs.ids, (rs.n + m->rows) * sizeof(uint64_t));
		rs.rows =
		    realloc(rs.rows, (rs.n + m->rows) * rs.rf * sizeof(float));
		while (emb_snap_reader_next(r, &b) > 0) {
			memcpy(rs.ids + rs.n, b.ids, b.n * sizeof(uint64_t));
			memcpy(rs.rows + rs.n * rs.rf, b.rows,
			       (size_t)b.n * rs.rf * sizeof(float));
			rs.n += b.n;
		}
		emb_snap_reader_close(r);
	}
	free(e);
	idx = calloc(rs.n ? rs.n : 1, sizeof(*idx));
	for (uint64_t i = 0; i < rs.n; i++)
		idx[i] = i;
	qsort_r(idx, rs.n, sizeof(*idx), cmp_u64_idx, rs.ids);
	out.rf = rs.rf;
	out.n = rs.n;
	out.ids = calloc(rs.n ? rs.n : 1, sizeof(uint64_t));
	out.rows = calloc(rs.n ? rs.n * rs.rf : 1, sizeof(float));
	for (uint64_t i = 0; i < rs.n; i++) {
		out.ids[i] = rs.ids[idx[i]];
		memcpy(out.rows + i * rs.rf, rs.rows + idx[i] * rs.rf,
		       rs.rf * sizeof(float));
	}
	free(idx);
	free(rs.ids);
	free(rs.rows);
	return out;
}

static void rowset_free(struct rowset *rs)
{
	free(rs->ids);
	free(rs->rows);
}

static char *sub(const char *name)
{
	static char buf[8][600];
	static int k;
	char *p = buf[k++ % 8];

	snprintf(p, 600, "%s/%s", tmp, name);
	return p;
}

/* A one-server cluster with the adam table trained for a few steps. */
static struct srv trained_server(struct emb_client **cp,
				 struct emb_client_table **tp, uint64_t *ids)
{
	struct emb_table_spec sp = adam_spec(DIM);
	struct srv s = srv_start(NULL, NULL);

	*cp = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(*cp, &sp, tp), 0);
	train(*tp, ids, 0, 8);
	return s;
}

static void test_dump_restore_two_servers(void)
{
	struct emb_client *c, *c2;
	struct emb_client_table *t;
	struct emb_client_table_stats ts =
	    EMB_SIZED(struct emb_client_table_stats);
	uint64_t *ids = test_ids();
	struct srv a = trained_server(&c, &t, ids), b[2];
	struct rowset ra, rb;
	char line[4096];
	FILE *f;
	uint64_t lines = 0;

	CU_ASSERT_EQUAL(
	    run_cli("dump --quiet --shuffle --servers 127.0.0.1:%u --table "
		    "emb --out %s >/dev/null",
		    a.port, sub("d1")),
	    0);
	b[0] = srv_start(NULL, NULL);
	b[1] = srv_start(NULL, NULL);
	CU_ASSERT_EQUAL(run_cli("restore --quiet --in %s --servers "
				"127.0.0.1:%u,127.0.0.1:%u >/dev/null",
				sub("d1"), b[0].port, b[1].port),
			0);
	c2 = connect_to(b, 2);
	emb_client_table_close(t);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c2, "emb", &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &ts), 0);
	CU_ASSERT_EQUAL(ts.servers, 2);
	emb_client_table_close(t);
	/* Dump the two-server cluster again: same rows, state included. */
	CU_ASSERT_EQUAL(run_cli("dump --quiet --servers "
				"127.0.0.1:%u,127.0.0.1:%u --table emb --out "
				"%s >/dev/null",
				b[0].port, b[1].port, sub("d2")),
			0);
	ra = read_dump(sub("d1"));
	rb = read_dump(sub("d2"));
	CU_ASSERT_EQUAL(ra.n, ts.rows);
	CU_ASSERT_EQUAL_FATAL(ra.n, rb.n);
	CU_ASSERT(ra.n > 0);
	CU_ASSERT(memcmp(ra.ids, rb.ids, ra.n * sizeof(uint64_t)) == 0);
	CU_ASSERT(memcmp(ra.rows, rb.rows, ra.n * ra.rf * sizeof(float)) == 0);
	/* inspect verifies; export writes one line per row. */
	CU_ASSERT_EQUAL(run_cli("inspect %s --rows 2 >/dev/null", sub("d2")),
			0);
	CU_ASSERT_EQUAL(run_cli("export --in %s --format tsv --out %s",
				sub("d1"), sub("rows.tsv")),
			0);
	f = fopen(sub("rows.tsv"), "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f)) {
		CU_ASSERT_PTR_NOT_NULL(strchr(line, '\t'));
		lines++;
	}
	fclose(f);
	CU_ASSERT_EQUAL(lines, ra.n);
	/* A count is no negative number. */
	CU_ASSERT_EQUAL(run_cli("inspect %s --rows -5 >/dev/null 2>&1",
				sub("d2")),
			2);
	/* A full disk (here a file size limit, or /dev/full): export fails
	 * and leaves neither a partial file nor its temporary behind. */
	{
		char cmd[2048];

		snprintf(cmd, sizeof(cmd),
			 "ulimit -f 8; %s export --in %s --out %s 2>/dev/null",
			 cli_bin, sub("d1"), sub("full.tsv"));
		CU_ASSERT_EQUAL(WEXITSTATUS(system(cmd)), 1);
		snprintf(cmd, sizeof(cmd), "ls %s* >/dev/null 2>&1",
			 sub("full.tsv"));
		CU_ASSERT_NOT_EQUAL(system(cmd), 0);
		CU_ASSERT_EQUAL(run_cli("export --in %s --out /dev/full "
					"2>/dev/null",
					sub("d1")),
				1);
	}
	rowset_free(&ra);
	rowset_free(&rb);
	emb_client_destroy(c2);
	emb_client_destroy(c);
	srv_stop(&a, SIGTERM);
	srv_stop(&b[0], SIGTERM);
	srv_stop(&b[1], SIGTERM);
	free(ids);
}

/* Pushes to the live table until told to stop; each row's dims move as one. */
struct pusher {
	struct emb_client_table *t; /* borrowed */
	const uint64_t *ids;	    /* NIDS ids */
	volatile int stop;	    /* set by the test */
	uint32_t pushes;	    /* batches sent */
};

static void *push_main(void *arg)
{
	struct pusher *pu = arg;
	float *g = calloc((size_t)NIDS * 16, sizeof(float));

	while (!pu->stop && g) {
		for (uint32_t i = 0; i < NIDS; i++)
			for (uint32_t d = 0; d < 16; d++)
				g[i * 16 + d] = (float)((i + pu->pushes) % 5);
		if (emb_client_table_push(pu->t, pu->ids, NIDS, g, 0, 0))
			break;
		pu->pushes++;
	}
	free(g);
	return NULL;
}

static void test_dump_of_live_table_has_whole_rows(void)
{
	struct emb_table_spec sp = {.struct_size =
					sizeof(struct emb_table_spec),
				    .name = "live",
				    .dim = 16,
				    .optim = EMB_OPTIM_CFG_DEFAULT,
				    .init = {.kind = EMB_INIT_CONSTANT, .a = 0},
				    .seed = 1};
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t *ids = test_ids();
	struct pusher pu = {0};
	struct rowset rs;
	struct srv s = srv_start(NULL, NULL);
	float *w = calloc((size_t)NIDS * 16, sizeof(float));
	pthread_t th;
	uint32_t torn = 0;

	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	pu.t = t;
	pu.ids = ids;
	/* Every row exists before the dumps begin. */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, w, 0, NULL), 0);
	CU_ASSERT_FATAL(pthread_create(&th, NULL, push_main, &pu) == 0);
	/* Several dumps while SGD updates go on. */
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(run_cli("dump --quiet --block-size 64K "
					"--servers 127.0.0.1:%u --table live "
					"--out %s >/dev/null",
					s.port, sub("live")),
				0);
	pu.stop = 1;
	pthread_join(th, NULL);
	CU_ASSERT(pu.pushes > 0);
	rs = read_dump(sub("live"));
	CU_ASSERT_EQUAL(rs.n, NIDS);
	/* A row copied while a push changed it would mix two versions. */
	for (uint64_t i = 0; i < rs.n; i++)
		for (uint32_t d = 1; d < 16; d++)
			torn += rs.rows[i * rs.rf + d] != rs.rows[i * rs.rf];
	CU_ASSERT_EQUAL(torn, 0);
	rowset_free(&rs);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	free(w);
	free(ids);
}

static void pull_all(struct emb_client_table *t, const uint64_t *ids,
		     float *out)
{
	uint8_t *found = calloc(NIDS, 1);

	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, out,
					      EMB_CLIENT_NOCREATE, found),
			0);
	free(found);
}

static void test_training_after_restore_bit_identical(void)
{
	struct emb_client *c, *c2;
	struct emb_client_table *t, *t2;
	uint64_t *ids = test_ids();
	struct srv a = trained_server(&c, &t, ids), b[2];
	float *wa = calloc((size_t)NIDS * DIM, sizeof(float));
	float *wb = calloc((size_t)NIDS * DIM, sizeof(float));

	CU_ASSERT_EQUAL(run_cli("dump --quiet --servers 127.0.0.1:%u --table "
				"emb --out %s >/dev/null",
				a.port, sub("d3")),
			0);
	/* Uninterrupted: the original keeps training. */
	train(t, ids, 8, 12);
	/* Interrupted: restore the dump elsewhere and train the same way. */
	b[0] = srv_start(NULL, NULL);
	b[1] = srv_start(NULL, NULL);
	CU_ASSERT_EQUAL(run_cli("restore --quiet --in %s --servers "
				"127.0.0.1:%u,127.0.0.1:%u >/dev/null",
				sub("d3"), b[0].port, b[1].port),
			0);
	c2 = connect_to(b, 2);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c2, "emb", &t2), 0);
	train(t2, ids, 8, 12);
	pull_all(t, ids, wa);
	pull_all(t2, ids, wb);
	CU_ASSERT(memcmp(wa, wb, (size_t)NIDS * DIM * sizeof(float)) == 0);
	emb_client_table_close(t2);
	emb_client_table_close(t);
	emb_client_destroy(c2);
	emb_client_destroy(c);
	srv_stop(&a, SIGTERM);
	srv_stop(&b[0], SIGTERM);
	srv_stop(&b[1], SIGTERM);
	free(wa);
	free(wb);
	free(ids);
}

static void flip_byte(const char *path, long off)
{
	int fd = open(path, O_RDWR);
	uint8_t byte;

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(pread(fd, &byte, 1, off) == 1);
	byte ^= 0x40;
	CU_ASSERT_FATAL(pwrite(fd, &byte, 1, off) == 1);
	close(fd);
}

static void test_restore_refuses_without_touching(void)
{
	struct emb_client *c, *c2;
	struct emb_client_table *t, *t2;
	struct emb_client_table_stats ts =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_table_spec sp4 = adam_spec(4);
	uint64_t *ids = test_ids();
	struct srv a = trained_server(&c, &t, ids), b;
	char p[700];
	float g[4] = {1, 2, 3, 4};

	CU_ASSERT_EQUAL(run_cli("dump --quiet --servers 127.0.0.1:%u --table "
				"emb --out %s >/dev/null",
				a.port, sub("d4")),
			0);
	b = srv_start(NULL, NULL);
	c2 = connect_to(&b, 1);

	/* A flipped byte: refused, and no table appears. */
	snprintf(p, sizeof(p), "%s/emb.00000-of-00001.embs", sub("d4"));
	flip_byte(p, 5000);
	CU_ASSERT_NOT_EQUAL(run_cli("restore --quiet --in %s --servers "
				    "127.0.0.1:%u 2>/dev/null",
				    sub("d4"), b.port),
			    0);
	CU_ASSERT_EQUAL(emb_client_table_open(c2, "emb", &t2), EMB_ENOTABLE);
	flip_byte(p, 5000);

	/* A stray file that the manifest does not list: refused. */
	snprintf(p, sizeof(p), "%s/extra.embs", sub("d4"));
	CU_ASSERT_EQUAL(run_cli("inspect %s >/dev/null 2>&1; cp %s/emb.00000-"
				"of-00001.embs %s",
				sub("d4"), sub("d4"), p),
			0);
	CU_ASSERT_NOT_EQUAL(run_cli("restore --quiet --in %s --servers "
				    "127.0.0.1:%u 2>/dev/null",
				    sub("d4"), b.port),
			    0);
	unlink(p);

	/* A dump that hits a file size limit (a full disk) leaves nothing:
	 * no part file, no temporary file, no manifest. */
	snprintf(p, sizeof(p),
		 "ulimit -f 16; %s dump --quiet --servers 127.0.0.1:%u --table "
		 "emb --out %s 2>/dev/null",
		 cli_bin, a.port, sub("full"));
	CU_ASSERT_NOT_EQUAL(system(p), 0);
	snprintf(p, sizeof(p), "test -z \"$(ls -A %s)\"", sub("full"));
	CU_ASSERT_EQUAL(system(p), 0);

	/* A table of another dim exists: refused, its rows unchanged. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c2, &sp4, &t2), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t2, ids, 1, g, 0, 0), 0);
	CU_ASSERT_NOT_EQUAL(run_cli("restore --quiet --in %s --servers "
				    "127.0.0.1:%u 2>/dev/null",
				    sub("d4"), b.port),
			    0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t2, &ts), 0);
	CU_ASSERT_EQUAL(ts.rows, 1);
	/* And the good dump restores once the stray file is gone. */
	CU_ASSERT_EQUAL(emb_client_table_drop(t2), 0);
	emb_client_table_close(t2);
	CU_ASSERT_EQUAL(run_cli("restore --quiet --in %s --servers "
				"127.0.0.1:%u >/dev/null",
				sub("d4"), b.port),
			0);
	emb_client_table_close(t);
	emb_client_destroy(c2);
	emb_client_destroy(c);
	srv_stop(&a, SIGTERM);
	srv_stop(&b, SIGTERM);
	free(ids);
}

/* Newest complete checkpoint directory under dir, into out; false if none. */
static bool newest_ckpt(const char *dir, char *out, size_t cap)
{
	char cmd[800];
	FILE *f;
	bool ok;

	snprintf(cmd, sizeof(cmd),
		 "ls -d %s/ckpt-* 2>/dev/null | sort | tail -1", dir);
	f = popen(cmd, "r");
	ok = f && fgets(out, (int)cap, f) != NULL;
	if (f)
		pclose(f);
	if (ok)
		out[strcspn(out, "\n")] = '\0';
	return ok;
}

static void test_checkpoint_survives_sigkill(void)
{
	struct emb_table_spec sp = adam_spec(DIM);
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t *ids = test_ids();
	float *before = calloc((size_t)NIDS * DIM, sizeof(float));
	float *after = calloc((size_t)NIDS * DIM, sizeof(float));
	uint8_t *found = calloc(NIDS, 1);
	char *dir = sub("ckpt");
	char first[700] = "", last[700] = "", p[1400];
	struct srv s = srv_start(dir, "1");
	uint32_t nfound = 0, want = 0;

	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	train(t, ids, 0, 8);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, before,
					      EMB_CLIENT_NOCREATE, found),
			0);
	for (uint32_t i = 0; i < NIDS; i++)
		want += found[i];
	CU_ASSERT(want > NIDS / 2);
	/* Wait for a checkpoint that began after the training. */
	sleep_ms(100);
	newest_ckpt(dir, first, sizeof(first));
	for (int i = 0; i < 100; i++) {
		sleep_ms(100);
		if (newest_ckpt(dir, last, sizeof(last)) &&
		    strcmp(last, first) != 0)
			break;
	}
	CU_ASSERT_STRING_NOT_EQUAL_FATAL(last, first);
	/* One more, so the one we saw began after the last update. */
	strcpy(first, last);
	for (int i = 0; i < 100; i++) {
		sleep_ms(100);
		if (newest_ckpt(dir, last, sizeof(last)) &&
		    strcmp(last, first) != 0)
			break;
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGKILL);

	s = srv_start(dir, "1000");
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "emb", &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, after,
					      EMB_CLIENT_NOCREATE, found),
			0);
	for (uint32_t i = 0; i < NIDS; i++)
		nfound += found[i];
	CU_ASSERT_EQUAL(nfound, want);
	CU_ASSERT(memcmp(before, after, (size_t)NIDS * DIM * sizeof(float)) ==
		  0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGKILL);

	/* Damage the newest checkpoint: the server refuses it, says so and
	 * starts from the previous one (same rows: no training since). */
	CU_ASSERT_FATAL(newest_ckpt(dir, last, sizeof(last)));
	snprintf(p, sizeof(p), "%s/emb.embs", last);
	flip_byte(p, 3000);
	s = srv_start(dir, "1000");
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "emb", &t), 0);
	memset(found, 0, NIDS);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, after,
					      EMB_CLIENT_NOCREATE, found),
			0);
	nfound = 0;
	for (uint32_t i = 0; i < NIDS; i++)
		nfound += found[i];
	CU_ASSERT_EQUAL(nfound, want);
	CU_ASSERT(memcmp(before, after, (size_t)NIDS * DIM * sizeof(float)) ==
		  0);
	snprintf(p, sizeof(p), "grep -q 'refused' %s/server-%u.log", tmp,
		 s.port);
	CU_ASSERT_EQUAL(system(p), 0);

	/* SIGTERM writes a last checkpoint: later updates survive it. */
	train(t, ids, 8, 4);
	pull_all(t, ids, before);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	s = srv_start(dir, "1000");
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "emb", &t), 0);
	pull_all(t, ids, after);
	CU_ASSERT(memcmp(before, after, (size_t)NIDS * DIM * sizeof(float)) ==
		  0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	free(found);
	free(before);
	free(after);
	free(ids);
}

/* A checkpoint directory with a damaged MANIFEST, named for time ms. */
static void plant_bad_ckpt(const char *dir, unsigned long long ms)
{
	char p[800];
	FILE *f;

	snprintf(p, sizeof(p), "%s/ckpt-%016llu", dir, ms);
	CU_ASSERT_EQUAL_FATAL(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/ckpt-%016llu/MANIFEST", dir, ms);
	f = fopen(p, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs("not a manifest\n", f);
	fclose(f);
}

static uint32_t rows_found(const struct srv *s, const uint64_t *ids)
{
	struct emb_client_table *t;
	struct emb_client *c = connect_to(s, 1);
	uint8_t *found = calloc(NIDS, 1);
	float *rows = calloc((size_t)NIDS * DIM, sizeof(float));
	uint32_t n = 0;

	if (emb_client_table_open(c, "emb", &t) == 0) {
		CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, rows,
						      EMB_CLIENT_NOCREATE,
						      found),
				0);
		for (uint32_t i = 0; i < NIDS; i++)
			n += found[i];
		emb_client_table_close(t);
	}
	emb_client_destroy(c);
	free(found);
	free(rows);
	return n;
}

static void test_checkpoints_never_lose_data(void)
{
	struct emb_table_spec sp = adam_spec(DIM);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t *ids = test_ids();
	char *dir = sub("ckpt-safe"), *bad = sub("ckpt-bad");
	char *file = sub("not-a-dir"), *moved = sub("ckpt-moved"), p[1400];
	const char *args[8];
	uint32_t want;
	struct srv s;
	FILE *f;

	/* A server's rows reach a checkpoint (SIGTERM writes the last). */
	s = srv_start(dir, "1000");
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	train(t, ids, 0, 4);
	emb_client_table_close(t);
	emb_client_destroy(c);
	want = rows_found(&s, ids);
	CU_ASSERT_FATAL(want > 0);
	srv_stop(&s, SIGTERM);

	/* Damaged checkpoints named after the good one (a clock that was
	 * ahead): refused and set aside, and the checkpoints written next
	 * never rotate the good one away behind them. */
	for (int i = 0; i < 3; i++)
		plant_bad_ckpt(dir, 9999999999990ull + (unsigned long long)i);
	s = srv_start(dir, "1");
	CU_ASSERT_EQUAL(rows_found(&s, ids), want);
	sleep_ms(3500);
	srv_stop(&s, SIGTERM);
	snprintf(p, sizeof(p), "test -d %s/refused-ckpt-0009999999999992",
		 dir);
	CU_ASSERT_EQUAL(system(p), 0);
	s = srv_start(dir, "1000");
	CU_ASSERT_EQUAL(rows_found(&s, ids), want);
	srv_stop(&s, SIGTERM);

	/* Nothing valid: no start, unless told to start empty. */
	CU_ASSERT_EQUAL_FATAL(mkdir(bad, 0755), 0);
	plant_bad_ckpt(bad, 1000);
	plant_bad_ckpt(bad, 2000);
	args[0] = "--checkpoint-dir";
	args[1] = bad;
	args[2] = NULL;
	CU_ASSERT_EQUAL(exit_status(srv_spawn(free_port(), args)), 1);
	snprintf(p, sizeof(p), "test -d %s/ckpt-0000000000002000", bad);
	CU_ASSERT_EQUAL(system(p), 0);
	args[2] = "--checkpoint-start-empty";
	args[3] = NULL;
	{
		uint16_t port = free_port();
		pid_t pid = srv_spawn(port, args);

		/* Up and serving (not a fixed wait: under load a start took
		 * longer than 300 ms, and SIGTERM then came before it had set
		 * the damaged checkpoints aside). */
		CU_ASSERT(wait_up(port));
		CU_ASSERT_EQUAL(waitpid(pid, NULL, WNOHANG), 0);
		kill(pid, SIGTERM);
		CU_ASSERT_EQUAL(exit_status(pid), 0);
	}
	snprintf(p, sizeof(p), "test -d %s/refused-ckpt-0000000000002000",
		 bad);
	CU_ASSERT_EQUAL(system(p), 0);

	/* A directory that cannot be written fails at start. */
	f = fopen(file, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	args[1] = file;
	args[2] = NULL;
	CU_ASSERT_EQUAL(exit_status(srv_spawn(free_port(), args)), 1);
	snprintf(p, sizeof(p), "%s/sub", file);
	args[1] = p;
	CU_ASSERT_EQUAL(exit_status(srv_spawn(free_port(), args)), 1);

	/* A final checkpoint that fails makes the exit status 1. */
	s = srv_start(dir, "1000");
	CU_ASSERT_EQUAL_FATAL(rename(dir, moved), 0);
	f = fopen(dir, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	kill(s.pid, SIGTERM);
	CU_ASSERT_EQUAL(exit_status(s.pid), 1);
	unlink(dir);
	free(ids);
}

/*
 * Rewrites the file of dump or checkpoint directory dir that holds id
 * through the store's own writer, with the row's first weight set to v,
 * and updates the MANIFEST's size and checksum: every checksum holds, only
 * the value is wrong (as a version without the push check could write
 * it). A delta's erased blocks are kept. True if a file held id.
 */
static bool spoil_row(const char *dir, uint64_t id, float v)
{
	struct emb_snap_entry *e = NULL;
	uint32_t n = 0;
	bool hit = false;
	char p[1200];

	CU_ASSERT_EQUAL_FATAL(emb_snap_manifest_read(dir, &e, &n, NULL), 0);
	for (uint32_t i = 0; i < n && !hit; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_writer *w;
		struct emb_snap_result res;
		struct emb_snap_block b;
		struct emb_snap_meta m;
		struct emb_row_meta *rm;
		uint64_t *ids, *gone, nrows = 0, ngone = 0;
		float *rows;
		uint32_t rf;

		snprintf(p, sizeof(p), "%s/%s", dir, e[i].file);
		CU_ASSERT_EQUAL_FATAL(
		    emb_snap_reader_open(p, EMB_SNAP_READ_ERASED, &r), 0);
		m = *emb_snap_reader_meta(r);
		rf = m.row_floats;
		ids = calloc(m.rows + 1, sizeof(*ids));
		gone = calloc(m.erased + 1, sizeof(*gone));
		rm = calloc(m.rows + 1, sizeof(*rm));
		rows = calloc((m.rows + 1) * rf, sizeof(float));
		CU_ASSERT_FATAL(ids && gone && rm && rows);
		while (emb_snap_reader_next(r, &b) > 0) {
			if (b.erased) {
				memcpy(gone + ngone, b.ids,
				       b.n * sizeof(*gone));
				ngone += b.n;
				continue;
			}
			for (uint32_t k = 0; k < b.n; k++) {
				ids[nrows] = b.ids[k];
				rm[nrows] = (struct emb_row_meta){
				    .last_step = b.last_step[k],
				    .count = b.count[k]};
				memcpy(rows + nrows * rf,
				       b.rows + (size_t)k * rf,
				       rf * sizeof(float));
				if (b.ids[k] == id) {
					rows[nrows * rf] = v;
					hit = true;
				}
				nrows++;
			}
		}
		emb_snap_reader_close(r);
		if (hit) {
			CU_ASSERT_EQUAL_FATAL(
			    emb_snap_writer_create(p, &m, NULL, &w), 0);
			if (ngone)
				CU_ASSERT_EQUAL(
				    emb_snap_writer_erase(w, gone, ngone), 0);
			CU_ASSERT_EQUAL(emb_snap_writer_add(w, ids, rows, rm,
							    (uint32_t)nrows),
					0);
			CU_ASSERT_EQUAL_FATAL(emb_snap_writer_finish(w, &res),
					      0);
			emb_snap_writer_destroy(w);
			e[i].bytes = res.file_bytes;
			e[i].checksum = res.checksum;
			CU_ASSERT_EQUAL(emb_snap_manifest_write(dir, e, n), 0);
		}
		free(ids);
		free(gone);
		free(rm);
		free(rows);
	}
	free(e);
	return hit;
}

/* Whether file holds the text s (grep -F). */
static bool file_has(const char *file, const char *s)
{
	char cmd[1600];

	snprintf(cmd, sizeof(cmd), "grep -qF -- '%s' '%s'", s, file);
	return system(cmd) == 0;
}

/* GET /metrics from 127.0.0.1:port into buf (NUL-terminated). */
static void scrape(uint16_t port, char *buf, size_t cap)
{
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(port)};
	size_t got = 0;
	ssize_t k;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	buf[0] = '\0';
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(connect(fd, (struct sockaddr *)&a, sizeof(a)),
			      0);
	CU_ASSERT_EQUAL(write(fd, req, sizeof(req) - 1),
			(ssize_t)sizeof(req) - 1);
	while (got + 1 < cap && (k = read(fd, buf + got, cap - 1 - got)) > 0)
		got += (size_t)k;
	buf[got] = '\0';
	close(fd);
}

/* Ids of ids[0..NIDS) the table holds, as found[] flags; their count. */
static uint32_t pull_found(struct emb_client_table *t, const uint64_t *ids,
			   float *out, uint8_t *found)
{
	uint32_t n = 0;

	memset(found, 0, NIDS);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, NIDS, out,
					      EMB_CLIENT_NOCREATE, found),
			0);
	for (uint32_t i = 0; i < NIDS; i++)
		n += found[i];
	return n;
}

/*
 * A checkpoint holding a non-finite row (written by a version without the
 * push check; here spoiled in the newest full checkpoint, its checksums
 * made to match): inspect names the row and exits 0; the server restarts
 * from it and serves every other row as it was, the id is absent and made
 * afresh from the initializer, and the log and /metrics count it.
 */
static void test_checkpoint_nonfinite_row_set_aside(void)
{
	struct emb_table_spec sp = adam_spec(DIM);
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t *ids = test_ids();
	float *before = calloc((size_t)NIDS * DIM, sizeof(float));
	float *after = calloc((size_t)NIDS * DIM, sizeof(float));
	uint8_t *found = calloc(NIDS, 1);
	char *dir = sub("ckpt-nonfinite"), *out = sub("inspect-ckpt.out");
	char last[700], want[256], log[600], maddr[64], *metrics;
	const char *args[] = {"--checkpoint-dir", dir, "--checkpoint-interval",
			      "1000", "--checkpoint-full-every", "1",
			      NULL, NULL, NULL};
	float fresh[DIM], got[DIM];
	uint32_t have, spoilt = NIDS;
	uint16_t mport;
	struct srv s;

	/* Trained rows, and the last checkpoint SIGTERM writes (full). */
	s.port = free_port();
	s.pid = srv_spawn(s.port, args);
	CU_ASSERT_FATAL(wait_up(s.port));
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	train(t, ids, 0, 8);
	have = pull_found(t, ids, before, found);
	CU_ASSERT_FATAL(have > NIDS / 2);
	for (uint32_t i = 0; i < NIDS && spoilt == NIDS; i++)
		if (found[i])
			spoilt = i;
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	CU_ASSERT_FATAL(newest_ckpt(dir, last, sizeof(last)));

	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", dir, out), 0);
	CU_ASSERT(!file_has(out, "NaN or infinite"));
	CU_ASSERT_FATAL(spoil_row(last, ids[spoilt], -INFINITY));
	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", dir, out), 0);
	snprintf(want, sizeof(want),
		 "warning: 1 rows with a NaN or infinite value (a load sets "
		 "them aside); ids %llu",
		 (unsigned long long)ids[spoilt]);
	CU_ASSERT(file_has(out, want));

	/* The restart loads every other row and says which it set aside. */
	s.port = free_port();
	mport = free_port();
	snprintf(maddr, sizeof(maddr), "127.0.0.1:%u", mport);
	args[6] = "--metrics-listen";
	args[7] = maddr;
	s.pid = srv_spawn(s.port, args);
	CU_ASSERT_FATAL(wait_up(s.port));
	c = connect_to(&s, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "emb", &t), 0);
	CU_ASSERT_EQUAL(pull_found(t, ids, after, found), have - 1);
	CU_ASSERT_FALSE(found[spoilt]);
	memset(before + (size_t)spoilt * DIM, 0, DIM * sizeof(float));
	CU_ASSERT(memcmp(before, after, (size_t)NIDS * DIM * sizeof(float)) ==
		  0);
	emb_init_row(&sp.init, sp.seed, ids[spoilt], fresh, DIM);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &ids[spoilt], 1, got, 0,
					      NULL),
			0);
	CU_ASSERT(memcmp(fresh, got, sizeof(got)) == 0);
	snprintf(log, sizeof(log), "%s/server-%u.log", tmp, s.port);
	snprintf(want, sizeof(want),
		 "table emb: 1 rows with a NaN or infinite value set aside "
		 "on load (made afresh when next used); ids %llu",
		 (unsigned long long)ids[spoilt]);
	CU_ASSERT(file_has(log, want));
	metrics = calloc(1, 1 << 20);
	CU_ASSERT_PTR_NOT_NULL_FATAL(metrics);
	scrape(mport, metrics, 1 << 20);
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(metrics, "\nembstore_table_rows_nonfinite_total"
			    "{table=\"emb\"} 1\n"));
	free(metrics);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGKILL);
	free(found);
	free(before);
	free(after);
	free(ids);
}

/*
 * A dump holding a non-finite row: inspect names it (and a clean dump
 * has no warning); restore loads every other row, names the one it set
 * aside and exits 0.
 */
static void test_dump_nonfinite_row_restored_without_it(void)
{
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t *ids = test_ids();
	float *before = calloc((size_t)NIDS * DIM, sizeof(float));
	float *after = calloc((size_t)NIDS * DIM, sizeof(float));
	uint8_t *found = calloc(NIDS, 1);
	char *dump = sub("dump-nonfinite"), *out = sub("inspect-dump.out");
	char *err = sub("restore-nonfinite.err"), want[256];
	struct srv s = trained_server(&c, &t, ids), b;
	uint32_t have, spoilt = NIDS;

	have = pull_found(t, ids, before, found);
	for (uint32_t i = NIDS; i-- > 0 && spoilt == NIDS;)
		if (found[i])
			spoilt = i;
	CU_ASSERT_EQUAL_FATAL(run_cli("dump --servers 127.0.0.1:%u --table emb "
				      "--out %s --quiet >/dev/null",
				      s.port, dump),
			      0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);

	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", dump, out), 0);
	CU_ASSERT(!file_has(out, "NaN or infinite"));
	CU_ASSERT_FATAL(spoil_row(dump, ids[spoilt], NAN));
	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", dump, out), 0);
	snprintf(want, sizeof(want),
		 "warning: 1 rows with a NaN or infinite value (a load sets "
		 "them aside); ids %llu",
		 (unsigned long long)ids[spoilt]);
	CU_ASSERT(file_has(out, want));

	b = srv_start(NULL, NULL);
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--quiet >/dev/null 2>%s",
				dump, b.port, err),
			0);
	snprintf(want, sizeof(want),
		 "1 rows with a NaN or infinite value set aside; ids %llu",
		 (unsigned long long)ids[spoilt]);
	CU_ASSERT(file_has(err, want));
	c = connect_to(&b, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "emb", &t), 0);
	CU_ASSERT_EQUAL(pull_found(t, ids, after, found), have - 1);
	CU_ASSERT_FALSE(found[spoilt]);
	memset(before + (size_t)spoilt * DIM, 0, DIM * sizeof(float));
	CU_ASSERT(memcmp(before, after, (size_t)NIDS * DIM * sizeof(float)) ==
		  0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&b, SIGTERM);
	free(found);
	free(before);
	free(after);
	free(ids);
}

/* Half the gap between x and the next fp16 away from zero. */
static double fp16_half_ulp(float x)
{
	int e;

	frexpf(fabsf(x), &e); /* |x| in [2^(e-1), 2^e) */
	if (e - 1 < -14)
		return ldexp(1.0, -25);
	return ldexp(1.0, e - 1 - 11);
}

/*
 * A compact snapshot written by the store (no server): inspect names its
 * format and checks finiteness on decoded weights (an fp16 Inf is no float
 * Inf in the raw words), export writes the fp32 weights a pull gives.
 */
static void test_inspect_export_compact(void)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_snap_writer *w;
	struct emb_table_iter *it;
	struct emb_snap_meta m;
	struct emb_table *t;
	char *dir = sub("compact"), *out = sub("compact-inspect.out");
	char *tsv = sub("compact.tsv"), p[600], bad[600], want[200];
	uint64_t ids[64], id0;
	float g[64 * 10], w16[10], row[10 / 2 + 10];
	uint16_t inf = 0x7c00;
	FILE *f;
	int n = 0;

	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0755), 0);
	o.name = "c16";
	o.dim = 10;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	o.row_format = EMB_ROWFMT_FP16;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &t), 0);
	for (uint32_t i = 0; i < 64; i++)
		ids[i] = 1000 + 7 * i;
	for (uint32_t j = 0; j < 64 * 10; j++)
		g[j] = 0.01f * (float)(j % 23) - 0.1f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 64, g), 0);
	CU_ASSERT_EQUAL(emb_table_push(t, ids, 64, g), 0);
	snprintf(p, sizeof(p), "%s/c16.embs", dir);
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(t, p, NULL, NULL), 0);

	CU_ASSERT_EQUAL(run_cli("inspect %s --rows 1 >%s", p, out), 0);
	CU_ASSERT(file_has(out, "row format fp16 (20 B of weights a row), "
				"pushes round stochastically"));
	CU_ASSERT(file_has(out, "format v2"));
	CU_ASSERT(!file_has(out, "NaN or infinite"));
	CU_ASSERT_EQUAL(run_cli("export --in %s --out %s", p, tsv), 0);
	f = fopen(tsv, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (;;) {
		unsigned long long id;
		float v[10];

		if (fscanf(f, "%llu %g %g %g %g %g %g %g %g %g %g", &id, &v[0],
			   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7],
			   &v[8], &v[9]) != 11)
			break;
		CU_ASSERT_EQUAL(emb_table_pull(t, (uint64_t *)&id, 1, w16,
					       EMB_PULL_NOCREATE, NULL),
				0);
		CU_ASSERT(memcmp(v, w16, sizeof(v)) == 0);
		n++;
	}
	fclose(f);
	CU_ASSERT_EQUAL(n, 64);

	/* The same rows, one with an fp16 Inf in weight 0 (its word's other
	 * half is weight 1, so the word is a finite float). */
	CU_ASSERT_EQUAL_FATAL(emb_snap_verify(p, 0, &m, NULL), 0);
	snprintf(bad, sizeof(bad), "%s/bad.embs", dir);
	CU_ASSERT_EQUAL_FATAL(emb_snap_writer_create(bad, &m, NULL, &w), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	for (int k = 0; emb_table_iter_next(it, &id0, row, NULL, 1) == 1;
	     k++) {
		if (k == 0) {
			memcpy(row, &inf, 2);
			snprintf(want, sizeof(want),
				 "warning: 1 rows with a NaN or infinite "
				 "value (a load sets them aside); ids %llu",
				 (unsigned long long)id0);
		}
		CU_ASSERT_EQUAL(emb_snap_writer_add(w, &id0, row, NULL, 1), 0);
	}
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(emb_snap_writer_finish(w, NULL), 0);
	emb_snap_writer_destroy(w);
	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", bad, out), 0);
	CU_ASSERT(file_has(out, want));
	emb_table_destroy(t);
}

/*
 * restore --row-format: a trained fp32 table served as fp16 (each weight
 * within half an fp16 ulp) and int8 (within half a step), the fp16 one
 * dumped and restored as fp32 again (exactly its fp16 values), and a dump
 * refused by an existing table of another format, untouched. Needs
 * servers and a client library that keep row formats.
 */
static void test_restore_row_format(void)
{
	struct emb_client *c;
	struct emb_client_table *t, *t16, *t8, *back;
	uint64_t *ids = test_ids();
	float *w32 = calloc((size_t)NIDS * DIM, sizeof(float));
	float *w16 = calloc((size_t)NIDS * DIM, sizeof(float));
	float *w8 = calloc((size_t)NIDS * DIM, sizeof(float));
	float *wb = calloc((size_t)NIDS * DIM, sizeof(float));
	uint8_t *found = calloc(NIDS, 1), *found2 = calloc(NIDS, 1);
	char *d32 = sub("rf-dump32"), *d16 = sub("rf-dump16");
	char *out = sub("rf-restore.out"), *err = sub("rf-restore.err");
	struct srv s = trained_server(&c, &t, ids);
	uint32_t have;

	have = pull_found(t, ids, w32, found);
	CU_ASSERT_FATAL(have > 0);
	CU_ASSERT_EQUAL_FATAL(run_cli("dump --servers 127.0.0.1:%u --table emb "
				      "--out %s --quiet >/dev/null",
				      s.port, d32),
			      0);
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--table e16 --row-format fp16 --quiet >%s",
				d32, s.port, out),
			0);
	CU_ASSERT(file_has(out, "restore: table e16 (fp16 rows from fp32), "));
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--table e8 --row-format int8 --quiet "
				">/dev/null",
				d32, s.port),
			0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "e16", &t16), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "e8", &t8), 0);
	CU_ASSERT_EQUAL(emb_client_table_spec(t16)->row_format,
			EMB_ROWFMT_FP16);
	CU_ASSERT_EQUAL(pull_found(t16, ids, w16, found2), have);
	CU_ASSERT(memcmp(found, found2, NIDS) == 0);
	CU_ASSERT_EQUAL(pull_found(t8, ids, w8, found2), have);
	for (uint32_t i = 0; i < NIDS; i++) {
		const float *a = w32 + (size_t)i * DIM;
		float lo = a[0], hi = a[0];

		if (!found[i])
			continue;
		for (uint32_t d = 0; d < DIM; d++) {
			CU_ASSERT(fabs((double)w16[(size_t)i * DIM + d] - a[d]) <=
				  fp16_half_ulp(a[d]));
			lo = a[d] < lo ? a[d] : lo;
			hi = a[d] > hi ? a[d] : hi;
		}
		for (uint32_t d = 0; d < DIM; d++)
			CU_ASSERT(fabs((double)w8[(size_t)i * DIM + d] - a[d]) <=
				  (hi - lo) / 255.0 / 2 * 1.0001 + 1e-6);
	}

	/* And back: the fp16 table's dump restored as fp32. */
	CU_ASSERT_EQUAL_FATAL(run_cli("dump --servers 127.0.0.1:%u --table e16 "
				      "--out %s --quiet >/dev/null",
				      s.port, d16),
			      0);
	CU_ASSERT_EQUAL(run_cli("inspect %s >%s", d16, out), 0);
	CU_ASSERT(file_has(out, "row format fp16"));
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--table back --row-format fp32 --quiet "
				">/dev/null",
				d16, s.port),
			0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "back", &back), 0);
	CU_ASSERT_EQUAL(pull_found(back, ids, wb, found2), have);
	CU_ASSERT(memcmp(wb, w16, (size_t)NIDS * DIM * sizeof(float)) == 0);

	/* fp16 rows into the existing fp32 table: refused, untouched. */
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--table emb --quiet >/dev/null 2>%s",
				d16, s.port, err),
			1);
	CU_ASSERT(file_has(err, "table emb exists with row format fp32; the "
				"rows would be fp16"));
	CU_ASSERT_EQUAL(pull_found(t, ids, wb, found2), have);
	CU_ASSERT(memcmp(wb, w32, (size_t)NIDS * DIM * sizeof(float)) == 0);
	CU_ASSERT_EQUAL(run_cli("restore --in %s --servers 127.0.0.1:%u "
				"--row-format fp12 2>/dev/null",
				d16, s.port),
			2);

	emb_client_table_close(back);
	emb_client_table_close(t8);
	emb_client_table_close(t16);
	emb_client_table_close(t);
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	free(found2);
	free(found);
	free(wb);
	free(w8);
	free(w16);
	free(w32);
	free(ids);
}

/*
 * A server's checkpoints keep compact tables: fp16 and int8 Adam tables
 * trained, the server stopped (its last checkpoint) and started again on
 * the directory: each comes back in its format, every full row (weights
 * as kept, state) bit for bit. Needs servers and a client library that
 * keep row formats.
 */
static void test_checkpoint_keeps_row_format(void)
{
	static const uint32_t fmts[2] = {EMB_ROWFMT_FP16, EMB_ROWFMT_INT8};
	static const char *const names[2] = {"c16", "c8"};
	struct emb_client *c;
	struct emb_client_table *t[2];
	uint64_t *ids = test_ids();
	float *before[2], *after = calloc((size_t)NIDS * 3 * DIM, 4);
	uint8_t *found = calloc(NIDS, 1), *found2 = calloc(NIDS, 1);
	char *dir = sub("ckpt-rowfmt");
	struct srv s = srv_start(dir, "1000");
	uint32_t rf[2];

	c = connect_to(&s, 1);
	for (int k = 0; k < 2; k++) {
		struct emb_table_spec sp = adam_spec(DIM);

		sp.name = names[k];
		sp.row_format = fmts[k];
		CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t[k]),
				      0);
		train(t[k], ids, 0, 8);
		rf[k] = emb_client_table_row_floats(t[k]);
		CU_ASSERT(rf[k] < 3 * DIM + 1); /* compact weights */
		before[k] = calloc((size_t)NIDS * rf[k], 4);
		CU_ASSERT_EQUAL(
		    emb_client_table_pull(t[k], ids, NIDS, before[k],
					  EMB_CLIENT_NOCREATE |
					      EMB_CLIENT_WITH_STATE,
					  found),
		    0);
		emb_client_table_close(t[k]);
	}
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);

	s = srv_start(dir, "1000");
	c = connect_to(&s, 1);
	for (int k = 0; k < 2; k++) {
		CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, names[k], &t[k]),
				      0);
		CU_ASSERT_EQUAL(emb_client_table_row_floats(t[k]), rf[k]);
		CU_ASSERT_EQUAL(
		    emb_client_table_pull(t[k], ids, NIDS, after,
					  EMB_CLIENT_NOCREATE |
					      EMB_CLIENT_WITH_STATE,
					  found2),
		    0);
		CU_ASSERT(memcmp(before[k], after,
				 (size_t)NIDS * rf[k] * 4) == 0);
		emb_client_table_close(t[k]);
		free(before[k]);
	}
	emb_client_destroy(c);
	srv_stop(&s, SIGTERM);
	free(found2);
	free(found);
	free(after);
	free(ids);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"dump, restore onto two servers keeps every row and state",
	     test_dump_restore_two_servers},
	    {"dump of a table under pushes holds whole rows",
	     test_dump_of_live_table_has_whole_rows},
	    {"adam training after restore is bit-identical",
	     test_training_after_restore_bit_identical},
	    {"restore refuses damage, strays and dim mismatch untouched",
	     test_restore_refuses_without_touching},
	    {"checkpoints: SIGKILL, a damaged one, the last on SIGTERM",
	     test_checkpoint_survives_sigkill},
	    {"checkpoints: the last valid one is never rotated away; none "
	     "valid, an unwritable directory or a failed last one fail",
	     test_checkpoints_never_lose_data},
	    {"a checkpoint's non-finite row: inspect names it, a restart "
	     "sets it aside and serves the rest",
	     test_checkpoint_nonfinite_row_set_aside},
	    {"a dump's non-finite row: inspect names it, restore sets it "
	     "aside and loads the rest",
	     test_dump_nonfinite_row_restored_without_it},
	    {"a compact snapshot: inspect shows its format and decoded "
	     "weights, export writes fp32",
	     test_inspect_export_compact},
	    {"restore --row-format converts fp32 to fp16 and int8 and back; "
	     "another format refused",
	     test_restore_row_format},
	    {"checkpoints keep fp16 and int8 tables bit for bit",
	     test_checkpoint_keeps_row_format},
	    {NULL, NULL},
	};
	int rc;

	server_bin = getenv("EMB_SERVER_BIN");
	cli_bin = getenv("EMB_CLI_BIN");
	if (!server_bin || !cli_bin) {
		fprintf(stderr, "EMB_SERVER_BIN and EMB_CLI_BIN must be set\n");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	tmp = emb_test_tmpdir();
	rc = emb_test_main(argc, argv, "tools/embstore", cases);
	emb_test_rmtree(tmp);
	free(tmp);
	return rc;
}
