/*
 * tests/worker/test_failures.c - the client against embstore-server child
 * processes that die (SIGKILL) or hang (SIGSTOP): every call must come back
 * with an error within the client's timeout, never hang, and servers that
 * are still alive keep answering; a server restarted from its checkpoint is
 * reconnected and training goes on. Also runs the daemon's own flags (token
 * file, id limit) and its clean exit on SIGTERM.
 */
#include "worker/embstore.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
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
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
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

/* ---- a server SIGKILLed and restarted from its checkpoint mid-run ---- */

#define TRAIN_IDS   64u
#define TRAIN_STEPS 100000u

/* A training loop on its own thread: pull, then push -1 to every id. */
struct trainer {
	struct emb_client_table *t; /* borrowed */
	uint64_t ids[TRAIN_IDS];    /* the batch of every step */
	bool stop;		    /* set by the test; atomic */
	uint32_t steps;		    /* steps done; atomic */
	int rc;			    /* first failure, 0 if none */
	uint64_t *ack_ms;	    /* wall-clock ms each step's push came back */
};

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *train_main(void *arg)
{
	struct trainer *tr = arg;
	static float grads[TRAIN_IDS * DIM], rows[TRAIN_IDS * DIM];
	uint32_t step = 0;

	for (uint32_t i = 0; i < TRAIN_IDS * DIM; i++)
		grads[i] = -1.0f;
	while (!__atomic_load_n(&tr->stop, __ATOMIC_ACQUIRE) &&
	       step < TRAIN_STEPS) {
		int rc = emb_client_table_pull(tr->t, tr->ids, TRAIN_IDS, rows,
					       0, NULL);

		if (!rc)
			rc = emb_client_table_push(tr->t, tr->ids, TRAIN_IDS,
						   grads, step, 0);
		if (rc) {
			tr->rc = rc;
			break;
		}
		tr->ack_ms[step++] = wall_ms();
		__atomic_store_n(&tr->steps, step, __ATOMIC_RELEASE);
		usleep(2000);
	}
	return NULL;
}

/* The time in the name of dir's newest checkpoint (ckpt-<ms>), or 0. */
static uint64_t newest_ckpt_ms(const char *dir)
{
	struct dirent *de;
	uint64_t best = 0;
	DIR *d = opendir(dir);

	if (!d)
		return 0;
	while ((de = readdir(d)) != NULL) {
		uint64_t ms;

		if (strncmp(de->d_name, "ckpt-", 5) == 0 &&
		    sscanf(de->d_name + 5, "%lu", &ms) == 1 && ms > best)
			best = ms;
	}
	closedir(d);
	return best;
}

static uint32_t wait_steps(struct trainer *tr, uint32_t want, int max_ms)
{
	uint32_t n = 0;

	for (int i = 0; i < max_ms; i++) {
		n = __atomic_load_n(&tr->steps, __ATOMIC_ACQUIRE);
		if (n >= want || tr->rc)
			break;
		usleep(1000);
	}
	return n;
}

/* test_restart_from_checkpoint()'s cleanup, the trainer stopped. */
static void ckpt_case_end(struct trainer *tr, struct emb_client *c,
			  struct nt_child *ch, char **dir)
{
	emb_client_table_close(tr->t);
	emb_client_destroy(c);
	free(tr->ack_ms);
	for (int i = 0; i < 2; i++) {
		nt_child_reap(&ch[i], SIGTERM);
		emb_test_rmtree(dir[i]);
		free(dir[i]);
	}
}

static void test_restart_from_checkpoint(void)
{
	struct emb_table_spec sp = nt_spec("restart", DIM, 5);
	struct trainer tr = {0};
	struct emb_client_stats cs = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	struct nt_child ch[2];
	char *dir[2], port_arg[32];
	const char *args[2][8];
	uint64_t t_kill, t_ckpt, t_back;
	uint32_t at_kill, done, maybe_lost = 0, lost = 0, back;
	static float rows[TRAIN_IDS * DIM];
	pthread_t th;

	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	for (int i = 0; i < 2; i++) {
		dir[i] = emb_test_tmpdir();
		args[i][0] = "--checkpoint-dir";
		args[i][1] = dir[i];
		args[i][2] = "--checkpoint-interval";
		args[i][3] = "1";
		args[i][4] = NULL;
		nt_child_start(&ch[i], args[i]);
	}
	{
		uint16_t ports[2] = {ch[0].port, ch[1].port};
		char addr[64];

		nt_addr_list(addr, sizeof(addr), ports, 2);
		c = nt_client(addr, 10000);
	}
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &tr.t), 0);
	fill_ids(tr.ids, TRAIN_IDS, 100);
	tr.ack_ms = calloc(TRAIN_STEPS, sizeof(*tr.ack_ms));
	CU_ASSERT_PTR_NOT_NULL_FATAL(tr.ack_ms);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, train_main, &tr), 0);

	/* Past its first checkpoint (one a second), with steps after it:
	 * waited for, not slept for, as a loaded machine writes it late;
	 * 30 s at most. */
	for (int i = 0; i < 3000 && !newest_ckpt_ms(dir[1]); i++)
		usleep(10 * 1000);
	wait_steps(&tr, __atomic_load_n(&tr.steps, __ATOMIC_ACQUIRE) + 20,
		   10000);
	nt_child_reap(&ch[1], SIGKILL);
	t_kill = emb_clock_ms();
	at_kill = __atomic_load_n(&tr.steps, __ATOMIC_ACQUIRE);
	t_ckpt = newest_ckpt_ms(dir[1]);
	CU_ASSERT(t_ckpt > 0);
	if (!t_ckpt) {
		/* Not FATAL: the trainer uses this frame; it stops first. */
		__atomic_store_n(&tr.stop, true, __ATOMIC_RELEASE);
		pthread_join(th, NULL);
		ckpt_case_end(&tr, c, ch, dir);
		return;
	}

	/* Down for half a second, then back on its port from its checkpoint. */
	usleep(500 * 1000);
	snprintf(port_arg, sizeof(port_arg), "127.0.0.1:%u", ch[1].port);
	args[1][4] = "--listen";
	args[1][5] = port_arg;
	args[1][6] = NULL;
	nt_child_start(&ch[1], args[1]);
	back = wait_steps(&tr, at_kill + 2, 10000);
	t_back = emb_clock_ms();
	CU_ASSERT(back >= at_kill + 2);
	wait_steps(&tr, back + 50, 10000);
	__atomic_store_n(&tr.stop, true, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	done = tr.steps;
	/* The worker never saw an error: it waited and went on. */
	CU_ASSERT_EQUAL(tr.rc, 0);
	emb_client_stats(c, &cs);
	CU_ASSERT(cs.reconnects >= 1);
	CU_ASSERT(cs.retries >= 1);
	fprintf(stderr,
		"\n    %u steps, %u before the kill; training resumed %llu ms "
		"after the kill (server down 500 ms); %llu retries\n",
		done, at_kill, (unsigned long long)(t_back - t_kill),
		(unsigned long long)cs.retries);

	/* Updates the checkpoint may not hold: acknowledged at or after it. */
	for (uint32_t k = 0; k < at_kill + 1 && k < done; k++)
		maybe_lost += tr.ack_ms[k] >= t_ckpt;
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(tr.t, tr.ids, TRAIN_IDS, rows, 0, NULL), 0);
	for (uint32_t i = 0; i < TRAIN_IDS; i++) {
		float v = rows[i * DIM];

		if (emb_client_server_of(c, tr.ids[i]) == 0) {
			/* The live server saw every step once. */
			CU_ASSERT_EQUAL(v, (float)done);
		} else {
			lost = done - (uint32_t)v;
			/* Never more than was pushed; lost at most what came
			 * after the checkpoint it restarted from. */
			CU_ASSERT(v <= (float)done);
			CU_ASSERT(v >= (float)(done - maybe_lost));
			CU_ASSERT(v > 0);
		}
	}
	fprintf(stderr,
		"    restarted server lost %u updates per row; %u were "
		"acknowledged after its checkpoint\n",
		lost, maybe_lost);
	ckpt_case_end(&tr, c, ch, dir);
}

static void test_deadline(void)
{
	struct emb_table_spec sp = nt_spec("deadline", DIM, 2);
	struct emb_client_table *t;
	struct emb_client *c;
	struct nt_child ch;
	uint64_t ids[16], t0, ms;
	float rows[16 * DIM];

	nt_child_start(&ch, NULL);
	c = client_of(&ch, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	fill_ids(ids, 16, 0);
	nt_child_reap(&ch, SIGKILL);
	/* Nobody comes back: the caller hears of it when the deadline
	 * passes, not before, and not seconds later (the bound is loose:
	 * ThreadSanitizer beside CI's load once took more than 400 ms
	 * past it; a call that outlived its deadline would take the
	 * server's absence for ever). */
	t0 = emb_clock_ms();
	CU_ASSERT_NOT_EQUAL(emb_client_table_pull(t, ids, 16, rows, 0, NULL),
			    0);
	ms = emb_clock_ms() - t0;
	CU_ASSERT(ms >= TIMEOUT_MS - 20 && ms < TIMEOUT_MS + 5000);
	emb_client_table_close(t);
	emb_client_destroy(c);
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
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_table *t;
	struct emb_client_stats cs = EMB_SIZED(struct emb_client_stats);
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

static void test_listen_nohost(void)
{
	char cmd[512], out[1024];
	size_t n;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "%s --listen nohost.invalid:7164 2>&1",
		 getenv("EMB_SERVER_BIN"));
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(out, "cannot resolve host 'nohost.invalid'"));
}

static const struct emb_test_case cases[] = {
	{"a killed server fails every call instead of hanging", test_killed},
	{"a stopped server times calls out; it still exits on SIGTERM",
	 test_hung},
	{"with one of two servers dead, ids on the live one are served",
	 test_one_of_two_dies},
	{"connecting to a closed port is refused", test_refused},
	{"a listen address that does not resolve is named as such",
	 test_listen_nohost},
	{"a server SIGKILLed and restarted from its checkpoint: training goes "
	 "on, losing at most the updates after that checkpoint",
	 test_restart_from_checkpoint},
	{"calls to a server that stays down fail when the deadline passes",
	 test_deadline},
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
