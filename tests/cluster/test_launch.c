/*
 * tests/cluster/test_launch.c - `embstore launch` as a user runs it: a job
 * that succeeds, a worker that fails, and Ctrl-C. Each case runs the
 * launcher as a child (EMB_EMBSTORE_BIN, with EMB_SERVER_BIN and the test
 * trainer EMB_TRAINER_BIN), reads the pids it reports ("started NAME, pid
 * N") and checks that none of them is left once it returned.
 * Single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define PIDS_MAX 16

struct run {
	char *dir;	      /* temp dir: cwd of the launcher */
	char out[512];	      /* its stdout and stderr */
	pid_t pid;	      /* the launcher */
	pid_t pids[PIDS_MAX]; /* the processes it started */
	int npids;
};

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* Set for the next launch: EMB_AUTH_TOKEN_FILE in its environment. */
static const char *token_env;

static void launch(struct run *r, const char *const *trainer_args)
{
	const char *bin = getenv("EMB_EMBSTORE_BIN");
	const char *trainer = getenv("EMB_TRAINER_BIN");
	const char *argv[24];
	int n = 0, fd;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	CU_ASSERT_PTR_NOT_NULL_FATAL(trainer);
	memset(r, 0, sizeof(*r));
	r->dir = emb_test_tmpdir();
	snprintf(r->out, sizeof(r->out), "%s/launch.out", r->dir);
	argv[n++] = bin;
	argv[n++] = "launch";
	argv[n++] = "--server_num";
	argv[n++] = "2";
	argv[n++] = "--worker_num";
	argv[n++] = "2";
	argv[n++] = "--log-dir";
	argv[n++] = "log";
	argv[n++] = "--";
	argv[n++] = trainer;
	while (trainer_args && *trainer_args)
		argv[n++] = *trainer_args++;
	argv[n] = NULL;
	r->pid = fork();
	CU_ASSERT_FATAL(r->pid >= 0);
	if (r->pid == 0) {
		fd = open(r->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || chdir(r->dir))
			_exit(126);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		setenv("EMB_HEARTBEAT_TIMEOUT", "1", 1);
		if (token_env)
			setenv("EMB_AUTH_TOKEN_FILE", token_env, 1);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
}

/* Count of lines of the launcher's output that contain s. */
static int out_count(const struct run *r, const char *s)
{
	char line[1024];
	FILE *f = fopen(r->out, "r");
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	fclose(f);
	return n;
}

/* Waits for the launcher, reads the pids it started; its exit status. */
static int finish(struct run *r)
{
	char line[1024];
	int status;
	FILE *f;

	CU_ASSERT_EQUAL_FATAL(waitpid(r->pid, &status, 0), r->pid);
	f = fopen(r->out, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f) && r->npids < PIDS_MAX) {
		const char *p = strstr(line, "[launch] started ");

		if (p && (p = strstr(p, ", pid ")))
			r->pids[r->npids++] = (pid_t)atoi(p + 6);
	}
	fclose(f);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void assert_none_left(const struct run *r)
{
	/* Scheduler, two servers, two workers. */
	CU_ASSERT_EQUAL(r->npids, 5);
	for (int i = 0; i < r->npids; i++) {
		CU_ASSERT(r->pids[i] > 0);
		errno = 0;
		CU_ASSERT_EQUAL(kill(r->pids[i], 0), -1);
		CU_ASSERT_EQUAL(errno, ESRCH);
	}
}

static bool log_exists(const struct run *r, const char *name)
{
	char path[600];
	struct stat st;

	snprintf(path, sizeof(path), "%s/log/%s", r->dir, name);
	return stat(path, &st) == 0;
}

static void cleanup(struct run *r)
{
	emb_test_rmtree(r->dir);
	free(r->dir);
}

static void test_success(void)
{
	static const char *const args[] = {"--steps", "10", NULL};
	struct run r;

	launch(&r, args);
	CU_ASSERT_EQUAL(finish(&r), 0);
	assert_none_left(&r);
	CU_ASSERT(log_exists(&r, "scheduler.log"));
	CU_ASSERT(log_exists(&r, "server.0.log"));
	CU_ASSERT(log_exists(&r, "server.1.log"));
	CU_ASSERT(log_exists(&r, "worker.0.log"));
	CU_ASSERT(log_exists(&r, "worker.1.log"));
	/* Lines on the terminal carry the process's name. */
	CU_ASSERT_EQUAL(out_count(&r, "] rank "), 2);
	CU_ASSERT(out_count(&r, "[worker.0] ") >= 1);
	CU_ASSERT(out_count(&r, "[server.1] ") >= 1);
	CU_ASSERT(out_count(&r, "cluster ready: 2 servers, 2 workers") >= 1);
	cleanup(&r);
}

static void test_token(void)
{
	static const char *const args[] = {"--steps", "10", NULL};
	char path[512];
	struct run r;
	char *dir = emb_test_tmpdir();
	FILE *f;

	snprintf(path, sizeof(path), "%s/token", dir);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs("launch-secret\n", f);
	fclose(f);
	/* Scheduler, servers and workers all take it from the environment. */
	token_env = path;
	launch(&r, args);
	token_env = NULL;
	CU_ASSERT_EQUAL(finish(&r), 0);
	assert_none_left(&r);
	CU_ASSERT_EQUAL(out_count(&r, "] rank "), 2);
	CU_ASSERT_EQUAL(out_count(&r, "authentication failed"), 0);
	CU_ASSERT_EQUAL(out_count(&r, "before HELLO"), 0);
	cleanup(&r);
	emb_test_rmtree(dir);
	free(dir);
}

/* `embstore launch ARGS`: exit status, and output into out. */
static int launch_cli(const char *args, char *out, size_t cap)
{
	char cmd[1024];
	size_t n = 0;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "%s launch %s 2>&1",
		 getenv("EMB_EMBSTORE_BIN"), args);
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	while (n + 1 < cap && (st = (int)fread(out + n, 1, cap - n - 1, p)) > 0)
		n += (size_t)st;
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bad_numbers(void)
{
	char out[4096];

	CU_ASSERT_EQUAL(launch_cli("--server_num x --worker_num 1 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--server_num takes 1..4096, "
					   "not 'x'"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num -3 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--worker_num takes"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--sched-port 70000 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--sched-port takes 1..65535"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 -- true", out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "give --server_num and "
					   "--worker_num"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--auth-token-file /nonexistent -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "cannot use token file"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 3 --worker_num 1 "
				   "--replicas 9 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--replicas takes 1..8, not '9'"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--replicas 2 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(out, "--replicas 2 needs at least 2 servers, not 1"));
	/* 0 is a value here (workers level with the launcher); 20 is past
	 * nice's range. */
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--worker-nice 20 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--worker-nice takes 0..19, "
					   "not '20'"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--worker-nice -1 -- true",
				   out, sizeof(out)),
			2);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--worker-nice takes 0..19"));
	CU_ASSERT_EQUAL(launch_cli("--server_num 1 --worker_num 1 "
				   "--worker-nice 0 --replicas 9 -- true",
				   out, sizeof(out)),
			2);
	/* --worker-nice 0 was taken: the refusal is the next option's. */
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "--replicas takes 1..8, not '9'"));
}

static void test_failing_worker(void)
{
	static const char *const args[] = {"--steps", "1000000", "--fail-rank",
					   "1", NULL};
	struct run r;

	launch(&r, args);
	CU_ASSERT_NOT_EQUAL(finish(&r), 0);
	assert_none_left(&r);
	CU_ASSERT(out_count(&r, "fails on purpose") >= 1);
	cleanup(&r);
}

static void test_sigint(void)
{
	static const char *const args[] = {"--hang", NULL};
	struct run r;
	int i;

	launch(&r, args);
	/* Both workers joined: every process is up. */
	for (i = 0; i < 2000 && out_count(&r, "joined: rank") < 2; i++)
		sleep_ms(10);
	CU_ASSERT_FATAL(i < 2000);
	kill(r.pid, SIGINT);
	CU_ASSERT_EQUAL(finish(&r), 128 + SIGINT);
	assert_none_left(&r);
	cleanup(&r);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"job succeeds, one log per process", test_success},
	    {"job with EMB_AUTH_TOKEN_FILE succeeds end to end", test_token},
	    {"bad numbers are refused with the reason", test_bad_numbers},
	    {"failing worker stops the rest, exits non-zero",
	     test_failing_worker},
	    {"SIGINT stops every process", test_sigint},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "launch", cases);
}
