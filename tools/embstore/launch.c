/*
 * tools/embstore/launch.c - `embstore launch`: starts a scheduler, the servers
 * and the workers of a cluster on this machine, each with the environment of
 * docs/cluster.md, like Paddle's fleetrun or MindSpore's scripts.
 *
 * Every child's stdout and stderr go through a pipe: each line is written
 * to <log-dir>/<name>.log and to our stdout as "[name] line". The children
 * share one process group of their own, so a signal to the group reaches
 * whatever they start in turn, and the launcher is their subreaper, so
 * orphans come back to it to be reaped. When a worker fails, or on SIGINT
 * or SIGTERM, the group gets SIGTERM, then SIGKILL after a grace period,
 * and the launcher returns only once every process is reaped. A scheduler
 * killed by a signal is started again on its port with the same
 * environment: it takes the job up from its state file in the log
 * directory, and the nodes, which ride out its absence, rejoin it.
 *
 * Single-threaded: one poll loop over the pipes and a signalfd.
 */
#include "cli.h"
#include "common/err.h"
#include "worker/embstore.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/coord.h"
#include "common/clock.h"
#include "common/seconds.h"
#include "common/token.h"

#define GRACE_MS       5000  /* SIGTERM to SIGKILL */
#define LINGER_MS      30000 /* servers' own exit after the workers' */
#define LINE_MAX_LEN   4096  /* longer lines are cut into pieces */
#define DRAIN_BYTES    65536 /* read from a child's pipe at once: a pipe's
				size, so one read empties it */
#define CHILDREN_MAX   1024
#define JOIN_TIMEOUT_S 60 /* EMB_CLUSTER_TIMEOUT unless set */
#define SCHED_RESTARTS_MAX 16 /* scheduler restarts in one job */
#define ENV_MAX		   24 /* a child's environment pairs, flat */
/*
 * The workers' nice value above the launcher's (--worker-nice). With more
 * processes than cores, the kernel shares the CPU evenly among them, and
 * one scheduler among a thousand busy workers gets a thousandth of it
 * while its work (heartbeats, the map) grows with their number; the
 * servers' loops and this launcher's log relay, which every worker waits
 * on, starve the same way. Workers a step down the queue leave the
 * processes they wait on first; with cores to spare nice changes nothing.
 */
#define WORKER_NICE 10

enum kind { K_SCHED, K_SERVER, K_WORKER };

struct child {
	enum kind kind;		 /* scheduler, server or worker */
	char name[32];		 /* "worker.3": log file and prefix */
	pid_t pid;		 /* 0 once reaped */
	int status;		 /* wait status once reaped */
	int out;		 /* read end of its stdout+stderr; -1 at EOF */
	FILE *log;		 /* <log-dir>/<name>.log */
	char line[LINE_MAX_LEN]; /* partial line */
	size_t len;		 /* bytes in line */
	bool added;		 /* a server started on request */
};

struct launch {
	struct child *ch; /* nch children */
	uint32_t nch;
	char sched[32];	    /* "127.0.0.1:PORT": the scheduler */
	bool formed;	    /* the scheduler answered with the map */
	uint8_t token[EMB_TOKEN_MAX]; /* the cluster's, to ask for the map */
	uint32_t token_len;	    /* 0 = none */
	double timeout_s;   /* EMB_CLUSTER_TIMEOUT the children got */
	int64_t form_by_ms; /* the cluster must have formed by then */
	pid_t pgid;	    /* the children's process group; 0 before */
	int sigfd;	    /* SIGCHLD, SIGINT, SIGTERM */
	sigset_t oldmask;   /* restored in children */
	int failed;	    /* first failure: 1, or 128 + signal */
	int64_t kill_at_ms; /* SIGKILL the group then; 0 = not due */
	bool stopping;	    /* the group got SIGTERM */
	const char *coord;  /* --coordinator etcd://...: no scheduler */
	char job[EMB_COORD_JOB_MAX + 1]; /* the job's name in etcd */
	uint32_t replicas;  /* copies of each slot (--replicas) */
	int worker_nice;    /* added to the workers' nice value */
	uint32_t nservers;  /* servers started */
	uint32_t servers_lost; /* servers that died while the job ran */
	char *const *sched_argv;	/* to start the scheduler again */
	const char *sched_env[ENV_MAX]; /* its environment, NULL-ended */
	uint32_t sched_restarts;	/* times it was started again */
	uint32_t cap;			/* room in ch; grows */
	/* Servers started on request (`embstore scale --add N --launch
	 * CTL`): a FIFO read as lines "add N", in a job whose ranks may
	 * come free (replicated, or with --server_max to spare). */
	int ctl;			 /* its read end, or -1 */
	char ctl_path[PATH_MAX];	 /* removed at the end */
	char ctl_line[64];		 /* partial line */
	size_t ctl_len;
	const char *dir;		 /* the log directory */
	char *const *server_argv;	 /* to start more servers */
	const char *server_env[ENV_MAX]; /* their environment */
};

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The launcher's own lines, prefixed like the children's. */
static void say(const char *fmt, ...)
{
	va_list ap;

	fputs("[launch] ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: embstore launch --server_num N --worker_num N "
		"[options] -- COMMAND [ARGS...]\n"
		"Starts a scheduler, N servers and N copies of COMMAND (the "
		"workers) on this\nmachine, each with the cluster's "
		"environment (docs/deploy.md), and waits for\nthe workers. "
		"Exit status: 0 when every worker exited 0, 1 when one "
		"failed or\nnever joined, 128 + N after signal N, 2 for bad "
		"usage.\n"
		"  --server_num N     servers to start (also --server-num)\n"
		"  --worker_num N     workers to start: COMMAND, N times "
		"(also --worker-num,\n"
		"                     and Paddle's --trainer_num)\n"
		"  --sched-port P     scheduler port (default: a free one)\n"
		"  --log-dir D        one log per process (default: log)\n"
		"  --replicas R       copies of each slot, 1..8 (default: "
		"EMB_REPLICAS or 1);\n"
		"                     with R > 1 the job goes on when a "
		"server dies\n"
		"                     (docs/replication.md)\n"
		"  --server_max N     ranks servers may hold; with N > "
		"server_num (R <= 7),\n"
		"                     servers started later against the "
		"scheduler join\n"
		"                     and are given a share of the slots "
		"(also --server-max)\n"
		"  --worker-nice N    the workers' nice value above the "
		"launcher's, 0..19\n"
		"                     (default %d): with more processes than "
		"cores, the\n"
		"                     scheduler and servers they wait on go "
		"first\n"
		"  --auth-token-file F  the cluster's token, for every "
		"process\n"
		"                     (default: EMB_AUTH_TOKEN_FILE)\n"
		"  --coordinator etcd://HOST:PORT[,HOST:PORT]  keep the job in "
		"etcd and start\n"
		"                     no scheduler (docs/coordinator.md)\n"
		"  --job NAME         the job's name in etcd (default: "
		"launch-PID-TIME); its\n"
		"                     keys are deleted before and after\n"
		"A scheduler killed by a signal is started again on its port; "
		"it takes the\njob up from D/scheduler.state and the nodes "
		"rejoin it (docs/cluster.md).\n"
		"With ranks to spare or --replicas above 1, `embstore scale "
		"--add N --launch\nD/launch.ctl` starts servers here for the "
		"free ranks (spare, drained or dead).\n"
		"  --help, --version\n"
		"Children find the cluster through EMB_SCHED_HOST and "
		"EMB_SCHED_PORT; the\nlauncher's directory comes first on "
		"their PATH, so COMMAND may call embstore\nand "
		"embstore-server. The cluster must form within "
		"EMB_CLUSTER_TIMEOUT seconds\n(default here: %d). The "
		"server binary is EMB_SERVER_BIN or embstore-server next\n"
		"to embstore.\n",
		WORKER_NICE, JOIN_TIMEOUT_S);
}

/* A port nobody listens on now (the scheduler binds it right after). */
static int free_port(uint16_t *port)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = 0;

	if (fd < 0)
		return -errno;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &len))
		rc = -errno;
	else
		*port = ntohs(a.sin_port);
	close(fd);
	return rc;
}

/* The directory embstore runs from. */
static int self_dir(char *buf, size_t cap)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n < 0)
		return -errno;
	self[n] = '\0';
	snprintf(buf, cap, "%s", dirname(self));
	return 0;
}

static int server_bin(const char *dir, char *buf, size_t cap)
{
	const char *env = getenv("EMB_SERVER_BIN");

	if (env && *env) {
		snprintf(buf, cap, "%s", env);
		return 0;
	}
	if ((size_t)snprintf(buf, cap, "%s/embstore-server", dir) >= cap)
		return -ENAMETOOLONG;
	return access(buf, X_OK) ? -errno : 0;
}

/* dir, then $PATH: the children find embstore and embstore-server. */
static char *child_path(const char *dir)
{
	const char *path = getenv("PATH");
	size_t len = strlen(dir) + (path ? strlen(path) : 0) + 2;
	char *p = malloc(len);

	if (p)
		snprintf(p, len, "%s%s%s", dir, path && *path ? ":" : "",
			 path ? path : "");
	return p;
}

/* EMB_CLUSTER_TIMEOUT in seconds (fractions allowed), or JOIN_TIMEOUT_S
 * if unset or not a duration in (0, 86400]. */
static double join_timeout_s(void)
{
	const char *v = getenv("EMB_CLUSTER_TIMEOUT");
	uint64_t ms;

	if (!v || !*v)
		return JOIN_TIMEOUT_S;
	if (emb_seconds_parse(v, 1, 86400000, &ms)) {
		say("EMB_CLUSTER_TIMEOUT '%s' is not a duration in seconds "
		    "(0..86400): using %d",
		    v, JOIN_TIMEOUT_S);
		return JOIN_TIMEOUT_S;
	}
	return ms / 1000.0;
}

/* ---- output --------------------------------------------------------- */

static void emit(struct child *c)
{
	fprintf(stdout, "[%s] %.*s\n", c->name, (int)c->len, c->line);
	if (c->log)
		fprintf(c->log, "%.*s\n", (int)c->len, c->line);
	c->len = 0;
}

/*
 * Reads what the child wrote; false at EOF. Up to DRAIN_BYTES at a time,
 * flushed once per read, not per line: a child blocks in write(2) while
 * its pipe is full, and with a thousand children logging at once a
 * launcher that takes a page per child per turn and a system call per
 * line is what the whole job waits for (a server blocked on its log
 * accepts nobody).
 */
static bool drain(struct child *c)
{
	static char buf[DRAIN_BYTES];
	ssize_t n = read(c->out, buf, sizeof(buf));

	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return true;
	if (n <= 0) {
		if (c->len)
			emit(c);
		close(c->out);
		c->out = -1;
		return false;
	}
	for (ssize_t i = 0; i < n; i++) {
		if (buf[i] == '\n') {
			emit(c);
			continue;
		}
		if (c->len == sizeof(c->line))
			emit(c);
		c->line[c->len++] = buf[i];
	}
	if (c->log)
		fflush(c->log);
	fflush(stdout);
	return true;
}

/* ---- children ------------------------------------------------------- */

/*
 * Raises the open-file limit to the hard limit, for the launcher and so
 * for every child (the limit is inherited). A server holds a connection
 * per worker and per peer server, a worker one per server, and the
 * launcher a pipe and a log per child: at 100 servers and 900 workers
 * that passes the usual soft limit of 1024. Says so when even the hard
 * limit is short (a process then fails its accept or connect with
 * EMFILE, which its log names).
 */
static void raise_nofile(uint32_t S, uint32_t W)
{
	/* Per process: the peers, plus the listeners, the scheduler link,
	 * snapshot files and slack. */
	rlim_t need = (rlim_t)S + W + 64, launcher = 2 * ((rlim_t)S + W) + 64;
	struct rlimit rl;

	if (launcher > need)
		need = launcher;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		say("open files are limited to %llu (ulimit -n), and %u servers "
		    "with %u workers need about %llu per process: raise the "
		    "hard limit",
		    (unsigned long long)rl.rlim_cur, S, W,
		    (unsigned long long)need);
}

static int spawn(struct launch *l, struct child *c, char *const *argv,
		 const char *const *env)
{
	int fds[2];
	pid_t pid;

	if (pipe2(fds, O_CLOEXEC))
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -errno;
	}
	if (pid == 0) {
		/* Die with the launcher, even if it is killed outright. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		setpgid(0, l->pgid);
		/* Ignored on failure: a priority, not a need. */
		if (c->kind == K_WORKER && l->worker_nice &&
		    nice(l->worker_nice) == -1)
			errno = 0;
		dup2(fds[1], STDOUT_FILENO);
		dup2(fds[1], STDERR_FILENO);
		sigprocmask(SIG_SETMASK, &l->oldmask, NULL);
		signal(SIGPIPE, SIG_DFL);
		for (; env && env[0]; env += 2)
			setenv(env[0], env[1], 1);
		execvp(argv[0], argv);
		fprintf(stderr, "cannot run %s: %s\n", argv[0],
			strerror(errno));
		_exit(127);
	}
	/* Both sides set the group, so neither order of events races. */
	setpgid(pid, l->pgid ? l->pgid : pid);
	if (!l->pgid)
		l->pgid = pid;
	close(fds[1]);
	c->pid = pid;
	c->out = fds[0];
	fcntl(c->out, F_SETFL, O_NONBLOCK);
	say("started %s, pid %d", c->name, (int)pid);
	return 0;
}

static void stop_all(struct launch *l, int why)
{
	if (!l->failed)
		l->failed = why;
	if (l->stopping || !l->pgid)
		return;
	l->stopping = true;
	l->kill_at_ms = (int64_t)emb_clock_ms() + GRACE_MS;
	say("stopping every process (SIGTERM, SIGKILL after %d s)",
	    GRACE_MS / 1000);
	kill(-l->pgid, SIGTERM);
}

static struct child *child_of(struct launch *l, pid_t pid)
{
	for (uint32_t i = 0; i < l->nch; i++)
		if (l->ch[i].pid == pid)
			return &l->ch[i];
	return NULL;
}

static bool workers_done(const struct launch *l)
{
	for (uint32_t i = 0; i < l->nch; i++)
		if (l->ch[i].kind == K_WORKER && l->ch[i].pid)
			return false;
	return true;
}

static bool all_reaped(const struct launch *l)
{
	for (uint32_t i = 0; i < l->nch; i++)
		if (l->ch[i].pid || l->ch[i].out >= 0)
			return false;
	return true;
}

/*
 * False only when the scheduler says the cluster is still forming (it
 * gives an observer the map once formed), or never listened. A scheduler
 * that is gone ended the job.
 */
static bool cluster_formed(struct launch *l)
{
	char servers[256];
	int rc;

	/* In etcd: formed once the map is there. An error (etcd gone)
	 * must not fail a job that may be training. */
	if (l->coord) {
		if (!l->formed)
			l->formed =
			    emb_coord_job_formed(l->coord, l->job) != 0;
		return l->formed;
	}
	for (int i = 0; !l->formed && i < 100; i++) {
		siginfo_t si = {0};

		/* A scheduler not listening yet refuses too; one that
		 * exited (reaped, or a zombie: WNOWAIT leaves it to reap())
		 * ended the job. */
		if (!l->ch[0].pid ||
		    (waitid(P_PID, (id_t)l->ch[0].pid, &si,
			    WEXITED | WNOHANG | WNOWAIT) == 0 &&
		     si.si_pid))
			return true;
		rc = emb_cluster_servers_auth(l->sched, l->token, l->token_len,
					      servers, sizeof(servers));
		if (rc == -ECONNREFUSED) {
			usleep(100 * 1000);
			continue;
		}
		/* Only "still forming" is a no; an answer we cannot read
		 * (refused observer, say) must not fail a job. */
		l->formed = rc != EMB_ECLUSTER;
		break;
	}
	return l->formed;
}

/* "worker.0, worker.3": the workers not reaped yet, cut to cap. */
static void running_workers(const struct launch *l, char *buf, size_t cap)
{
	size_t at = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < l->nch && at < cap; i++) {
		if (l->ch[i].kind != K_WORKER || !l->ch[i].pid)
			continue;
		at += (size_t)snprintf(buf + at, cap - at, "%s%s",
				       at ? ", " : "", l->ch[i].name);
	}
	if (!buf[0])
		snprintf(buf, cap, "none");
}

/*
 * A server died while the workers run: with replicas the job may go on.
 * Fewer deaths than copies lose no slot; more may (slots whose holders
 * all died), and then the workers' calls fail and they stop the job, so
 * the launcher keeps going until a worker fails or no server is left.
 */
static bool server_covered(struct launch *l)
{
	l->servers_lost++;
	/* Replicated, the scheduler judges: servers started outside launch
	 * may have taken the dead ranks, and a slot that lost every copy
	 * fails its workers' calls, which ends the job through them. */
	if (l->replicas < 2)
		return false;
	if (l->servers_lost < l->replicas)
		say("%u of %u servers lost; with --replicas %u their slots' "
		    "backups take over: the job goes on",
		    l->servers_lost, l->nservers, l->replicas);
	else
		say("%u of %u servers lost, --replicas %u: slots whose "
		    "copies all died fail their workers' calls; the job goes "
		    "on while the workers do",
		    l->servers_lost, l->nservers, l->replicas);
	return true;
}

/*
 * The scheduler was killed (a crash, the OOM killer, an operator): the
 * job need not end. It starts again on its port with its environment and
 * takes the job up from its state file; true when it did. Exits with a
 * status are the scheduler's own verdict and are not retried.
 */
static bool sched_restart(struct launch *l, struct child *c, int status)
{
	int rc;

	if (c->kind != K_SCHED || !WIFSIGNALED(status) || l->stopping ||
	    !l->sched_argv)
		return false;
	if (l->sched_restarts == SCHED_RESTARTS_MAX) {
		say("the scheduler died %u times: not starting it again",
		    SCHED_RESTARTS_MAX + 1);
		return false;
	}
	/* The old pipe's last lines first: the new one takes its place. */
	for (int i = 0; i < 64 && c->out >= 0 && drain(c); i++)
		;
	if (c->out >= 0) {
		close(c->out);
		c->out = -1;
	}
	l->sched_restarts++;
	say("restarting the scheduler on %s from its state file (restart "
	    "%u)",
	    l->sched, l->sched_restarts);
	rc = spawn(l, c, l->sched_argv, l->sched_env);
	if (rc) {
		say("cannot restart the scheduler: %s", strerror(-rc));
		return false;
	}
	return true;
}

/* Reaps every child that exited, ours or orphans handed to us. */
static void reap(struct launch *l)
{
	int status;
	pid_t pid;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		struct child *c = child_of(l, pid);
		bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;

		if (!c)
			continue;
		c->pid = 0;
		c->status = status;
		if (WIFEXITED(status))
			say("%s exited with %d", c->name, WEXITSTATUS(status));
		else
			say("%s killed by %s", c->name,
			    strsignal(WTERMSIG(status)));
		if (sched_restart(l, c, status))
			continue;
		/* A server started on request that fails (refused by the
		 * scheduler, say) ends nothing: the scheduler judges what
		 * its loss means, as for a server added by hand. */
		if (!ok && c->added && !l->stopping)
			continue;
		/* A failure while the job runs stops the job, except a
		 * server's while others hold copies of its slots. */
		if (!ok && !l->stopping && c->kind == K_SERVER &&
		    !workers_done(l) && server_covered(l))
			continue;
		if (!ok && !l->stopping &&
		    (c->kind == K_WORKER || !workers_done(l)))
			stop_all(l, 1);
		/* A worker that never joined leaves the others waiting for
		 * a cluster that cannot form. */
		if (ok && c->kind == K_WORKER && !l->stopping &&
		    !cluster_formed(l)) {
			say("%s exited 0 without joining the cluster: a worker "
			    "must join it (emb_client_from_env(), or "
			    "embstore.connect() in Python) before it ends",
			    c->name);
			stop_all(l, 1);
		}
	}
}

static void on_signal(struct launch *l)
{
	struct signalfd_siginfo si;

	while (read(l->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGCHLD)
			continue;
		say("%s", strsignal((int)si.ssi_signo));
		if (l->stopping)
			l->kill_at_ms =
			    (int64_t)emb_clock_ms(); /* second Ctrl-C: now */
		stop_all(l, 128 + (int)si.ssi_signo);
	}
	reap(l);
}

static int add_child(struct launch *l, enum kind k, const char *name,
		     const char *dir);

/* Starts n more servers, asked for on the control FIFO. The scheduler
 * gives each a free rank, or refuses it (it then exits 1, which a job
 * whose servers cover each other survives): it alone knows which ranks
 * are free (spare, drained or dead), so launch starts as many as it is
 * asked for and keeps no count of its own. */
static void add_servers(struct launch *l, uint32_t n)
{
	char name[32];

	if (l->stopping || workers_done(l)) {
		say("not starting %u server%s: the job is ending", n,
		    n == 1 ? "" : "s");
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		int rc;

		snprintf(name, sizeof(name), "server.%u", l->nservers);
		rc = add_child(l, K_SERVER, name, l->dir);
		if (rc == 0) {
			l->ch[l->nch - 1].added = true;
			rc = spawn(l, &l->ch[l->nch - 1], l->server_argv,
				   l->server_env);
		}
		if (rc) {
			say("cannot start %s: %s", name, strerror(-rc));
			return;
		}
		l->nservers++;
	}
}

/* Reads the control FIFO's lines: "add N". Anything else is logged and
 * dropped; a line too long is dropped whole. */
static void on_ctl(struct launch *l)
{
	char buf[256];
	ssize_t got;

	while ((got = read(l->ctl, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < got; i++) {
			char *end;
			unsigned long n;

			if (buf[i] != '\n') {
				if (l->ctl_len < sizeof(l->ctl_line) - 1)
					l->ctl_line[l->ctl_len] = buf[i];
				l->ctl_len++;
				continue;
			}
			if (l->ctl_len >= sizeof(l->ctl_line)) {
				say("%s: a line too long, ignored",
				    l->ctl_path);
				l->ctl_len = 0;
				continue;
			}
			l->ctl_line[l->ctl_len] = 0;
			l->ctl_len = 0;
			n = strncmp(l->ctl_line, "add ", 4) == 0
				? strtoul(l->ctl_line + 4, &end, 10)
				: 0;
			if (!n || *end || n > EMB_WIRE_SERVERS_MAX) {
				say("%s: '%s' is not 'add N', ignored",
				    l->ctl_path, l->ctl_line);
				continue;
			}
			say("starting %lu server%s, as asked on %s", n,
			    n == 1 ? "" : "s", l->ctl_path);
			add_servers(l, (uint32_t)n);
		}
	}
}

/* A child that exited and whose pipe is closed writes no more: its log
 * is closed now, so that servers started again and again over a long job
 * do not hold a file each until its end. */
static void close_done_logs(struct launch *l)
{
	for (uint32_t i = 0; i < l->nch; i++) {
		struct child *c = &l->ch[i];

		if (!c->pid && c->out < 0 && c->log) {
			fclose(c->log);
			c->log = NULL;
		}
	}
}

/* Poll slot of the control FIFO in run()'s index map. */
#define SLOT_CTL UINT32_MAX

static int run(struct launch *l)
{
	struct pollfd *pf = NULL;
	uint32_t *map = NULL, room = 0;
	int64_t linger_at = 0;

	while (!all_reaped(l)) {
		uint32_t n = 0;
		int64_t now = (int64_t)emb_clock_ms(), wait = -1;

		/* Indexes into l->ch, not pointers: a line on the FIFO
		 * adds servers while the results are read, and the table
		 * may move as it grows. */
		if (room < l->nch + 2) {
			uint32_t want = 2 * l->nch + 2;
			struct pollfd *npf = realloc(pf, want * sizeof(*pf));
			uint32_t *nmap;

			if (npf)
				pf = npf;
			nmap = npf ? realloc(map, want * sizeof(*map)) : NULL;
			if (!nmap) {
				/* Every process is killed below. */
				say("out of memory: ending the job");
				l->failed = 1;
				break;
			}
			map = nmap;
			room = want;
		}

		if (!l->stopping && !l->formed && now >= l->form_by_ms) {
			/* Checked once: a formed cluster stays formed. */
			if (!cluster_formed(l)) {
				char names[256];

				running_workers(l, names, sizeof(names));
				say("the cluster did not form within %g s "
				    "(EMB_CLUSTER_TIMEOUT): not every worker "
				    "joined; still running: %s",
				    l->timeout_s, names);
				stop_all(l, 1);
			}
		}
		if (!linger_at && workers_done(l) && !l->stopping)
			linger_at = now + LINGER_MS;
		if (linger_at && !l->stopping && now >= linger_at) {
			say("servers still up %d s after the workers",
			    LINGER_MS / 1000);
			stop_all(l, 0);
		}
		if (l->stopping && l->kill_at_ms && now >= l->kill_at_ms) {
			kill(-l->pgid, SIGKILL);
			l->kill_at_ms = 0;
		}
		pf[n++] = (struct pollfd){.fd = l->sigfd, .events = POLLIN};
		if (l->ctl >= 0) {
			map[n] = SLOT_CTL;
			pf[n++] = (struct pollfd){.fd = l->ctl, .events = POLLIN};
		}
		for (uint32_t i = 0; i < l->nch; i++) {
			if (l->ch[i].out < 0)
				continue;
			map[n] = i;
			pf[n++] = (struct pollfd){.fd = l->ch[i].out,
						  .events = POLLIN};
		}
		if (l->stopping && l->kill_at_ms)
			wait = l->kill_at_ms - now;
		else if (linger_at && !l->stopping)
			wait = linger_at - now;
		else if (!l->formed && !l->stopping)
			wait = l->form_by_ms - now;
		if (wait < 0 && wait != -1)
			wait = 0;
		/* Children may outlive their pipes (closed stdout): look
		 * for exits now and then even without a signal. */
		if (wait == -1 || wait > 500)
			wait = 500;
		if (poll(pf, n, (int)wait) < 0 && errno != EINTR)
			break;
		if (pf[0].revents)
			on_signal(l);
		for (uint32_t i = 1; i < n; i++) {
			if (!pf[i].revents)
				continue;
			if (map[i] != SLOT_CTL)
				drain(&l->ch[map[i]]);
			else
				on_ctl(l);
		}
		reap(l);
		close_done_logs(l);
	}
	/* Orphans of the group still running: their leaders are gone. */
	if (l->pgid && kill(-l->pgid, 0) == 0) {
		kill(-l->pgid, SIGKILL);
		while (waitpid(-1, NULL, 0) > 0)
			;
	}
	free(pf);
	free(map);
	return 0;
}

/* ---- main ----------------------------------------------------------- */

/* Appends a child to l->ch, growing it: pointers into it held across
 * this call are stale after it. */
static int add_child(struct launch *l, enum kind k, const char *name,
		     const char *dir)
{
	struct child *c;
	char path[PATH_MAX];

	if (l->nch == l->cap) {
		uint32_t cap = 2 * l->cap;
		struct child *ch = realloc(l->ch, cap * sizeof(*ch));

		if (!ch)
			return -ENOMEM;
		l->ch = ch;
		l->cap = cap;
	}
	c = &l->ch[l->nch++];
	memset(c, 0, sizeof(*c));
	c->kind = k;
	c->out = -1;
	snprintf(c->name, sizeof(c->name), "%s", name);
	snprintf(path, sizeof(path), "%s/%s.log", dir, name);
	c->log = fopen(path, "we");
	if (!c->log) {
		say("cannot write %s: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

static int parse_num(const char *s, unsigned long lo, unsigned long hi,
		     uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi || s[0] == '-')
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int emb_cmd_launch(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"server_num", required_argument, NULL, 's'},
	    {"server-num", required_argument, NULL, 's'},
	    {"worker_num", required_argument, NULL, 'w'},
	    {"worker-num", required_argument, NULL, 'w'},
	    {"trainer_num", required_argument, NULL, 'w'},
	    {"trainer-num", required_argument, NULL, 'w'},
	    {"sched-port", required_argument, NULL, 'p'},
	    {"sched_port", required_argument, NULL, 'p'},
	    {"log-dir", required_argument, NULL, 'd'},
	    {"log_dir", required_argument, NULL, 'd'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"coordinator", required_argument, NULL, 'O'},
	    {"job", required_argument, NULL, 'J'},
	    {"replicas", required_argument, NULL, 'r'},
	    {"server_max", required_argument, NULL, 'M'},
	    {"server-max", required_argument, NULL, 'M'},
	    {"worker-nice", required_argument, NULL, 'n'},
	    {"worker_nice", required_argument, NULL, 'n'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	struct launch l = {.sigfd = -1, .ctl = -1, .worker_nice = WORKER_NICE};
	const char *token_file = getenv("EMB_AUTH_TOKEN_FILE");
	uint32_t S = 0, W = 0, R = 0, port32 = 0;
	const char *dir = "log";
	char bin[PATH_MAX], self[PATH_MAX], port[8], snum[16], wnum[16];
	char rnum[16], smaxnum[16];
	uint32_t smax = 0;
	char name[32], tmo[24], *path = NULL, state[PATH_MAX];
	double timeout_s;
	char *sched_argv[4], *server_argv[2];
	uint16_t sched_port = 0;
	sigset_t mask;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (parse_num(optarg, 1, 4096, &S)) {
				say("--server_num takes 1..4096, not '%s'",
				    optarg);
				goto bad_usage;
			}
			break;
		case 'w':
			if (parse_num(optarg, 1, CHILDREN_MAX, &W)) {
				say("--worker_num takes 1..%u, not '%s'",
				    CHILDREN_MAX, optarg);
				goto bad_usage;
			}
			break;
		case 'p':
			if (parse_num(optarg, 1, 65535, &port32)) {
				say("--sched-port takes 1..65535, not '%s'",
				    optarg);
				goto bad_usage;
			}
			sched_port = (uint16_t)port32;
			break;
		case 'd':
			dir = optarg;
			break;
		case 'a':
			token_file = optarg;
			break;
		case 'O':
			if (!emb_coord_is_etcd(optarg)) {
				say("--coordinator takes "
				    "etcd://HOST:PORT[,HOST:PORT], not '%s'",
				    optarg);
				goto bad_usage;
			}
			l.coord = optarg;
			break;
		case 'J':
			if (strlen(optarg) > EMB_COORD_JOB_MAX) {
				say("--job: at most %u bytes",
				    EMB_COORD_JOB_MAX);
				goto bad_usage;
			}
			snprintf(l.job, sizeof(l.job), "%s", optarg);
			break;
		case 'M':
			if (parse_num(optarg, 1, 4096, &smax)) {
				say("--server_max takes 1..4096, not '%s'",
				    optarg);
				goto bad_usage;
			}
			break;
		case 'r':
			if (parse_num(optarg, 1, 8, &R)) {
				say("--replicas takes 1..8, not '%s'", optarg);
				goto bad_usage;
			}
			break;
		case 'n': {
			uint32_t v;

			if (parse_num(optarg, 0, 19, &v)) {
				say("--worker-nice takes 0..19, not '%s'",
				    optarg);
				goto bad_usage;
			}
			l.worker_nice = (int)v;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("embstore %s\n", EMB_VERSION);
			return 0;
		default:
			goto bad_usage;
		}
	}
	if (!S || !W) {
		say("give --server_num and --worker_num");
		goto bad_usage;
	}
	if (optind >= argc) {
		say("give the worker command after --");
		goto bad_usage;
	}
	if (!R && getenv("EMB_REPLICAS") &&
	    parse_num(getenv("EMB_REPLICAS"), 1, 8, &R)) {
		say("EMB_REPLICAS takes 1..8, not '%s'", getenv("EMB_REPLICAS"));
		goto bad_usage;
	}
	if (!R)
		R = 1;
	if (R > S) {
		say("--replicas %u needs at least %u servers, not %u", R, R, S);
		goto bad_usage;
	}
	if (!smax)
		smax = S;
	if (smax < S || (smax > S && R > 7)) {
		say("--server_max %u needs at least --server_num (%u) and, to "
		    "be more, --replicas 1..7",
		    smax, S);
		goto bad_usage;
	}
	l.replicas = R;
	l.nservers = S;
	if (S + W + 1 > CHILDREN_MAX) {
		say("at most %u processes: %u servers and %u workers are too "
		    "many",
		    CHILDREN_MAX - 1, S, W);
		goto bad_usage;
	}
	raise_nofile(S, W);
	/* Checked here once, then every process reads it from the
	 * environment: scheduler, servers and workers share it. */
	if (token_file && *token_file) {
		rc = emb_token_read_file(token_file, l.token, &l.token_len);
		if (rc) {
			say("cannot use token file %s: %s", token_file,
			    rc == -EINVAL ? "empty or over 256 bytes"
					  : strerror(-rc));
			return 2;
		}
		setenv("EMB_AUTH_TOKEN_FILE", token_file, 1);
	}
	if (self_dir(self, sizeof(self)) ||
	    server_bin(self, bin, sizeof(bin))) {
		say("no embstore-server next to embstore; set EMB_SERVER_BIN");
		return 2;
	}
	if (l.coord) {
		if (!l.job[0])
			snprintf(l.job, sizeof(l.job), "launch-%d-%lld",
				 (int)getpid(), (long long)time(NULL));
		/* A job of this name from before would confuse this one. */
		rc = emb_coord_job_delete(l.coord, l.job);
		if (rc) {
			say("cannot clear job %s in etcd %s: %s", l.job,
			    l.coord,
			    rc == -EINVAL ? "bad job name or endpoints"
					  : emb_strerror(rc));
			return rc == -EINVAL ? 2 : 1;
		}
	} else if (!sched_port && (rc = free_port(&sched_port))) {
		say("no free port for the scheduler: %s", strerror(-rc));
		return 1;
	}
	l.dir = dir;
	if (mkdir(dir, 0755) && errno != EEXIST) {
		say("cannot make %s: %s", dir, strerror(errno));
		return 1;
	}
	snprintf(port, sizeof(port), "%u", sched_port);
	/* The scheduler's state file, for its restarts; one from a job
	 * before in the same directory is not this job's. */
	if ((size_t)snprintf(state, sizeof(state), "%s/scheduler.state", dir) >=
	    sizeof(state)) {
		say("--log-dir %s: path too long", dir);
		return 2;
	}
	if (!l.coord && unlink(state) && errno != ENOENT) {
		say("cannot remove %s: %s", state, strerror(errno));
		return 1;
	}
	snprintf(snum, sizeof(snum), "%u", S);
	snprintf(wnum, sizeof(wnum), "%u", W);
	snprintf(rnum, sizeof(rnum), "%u", R);
	snprintf(smaxnum, sizeof(smaxnum), "%u", smax);

	timeout_s = join_timeout_s();
	snprintf(tmo, sizeof(tmo), "%.3f", timeout_s);
	snprintf(l.sched, sizeof(l.sched), "127.0.0.1:%u", sched_port);
	l.timeout_s = timeout_s;
	/* The nodes give up at the timeout; the launcher a little later,
	 * should they not (a worker that never tries keeps waiting). */
	l.form_by_ms =
	    (int64_t)emb_clock_ms() + (int64_t)(timeout_s * 1000) + 5000;
	path = child_path(self);
	/* Servers added later grow it (add_child()). */
	l.cap = S + W + 1;
	l.ch = calloc(l.cap, sizeof(*l.ch));
	if (!path || !l.ch) {
		free(path);
		free(l.ch);
		return 1;
	}
	/* Orphans of our children come back to us to be reaped. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigprocmask(SIG_BLOCK, &mask, &l.oldmask);
	l.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (l.sigfd < 0) {
		rc = 1;
		goto out;
	}
	if (l.coord)
		say("job %s in etcd %s, %u server%s, %u worker%s, logs in %s",
		    l.job, l.coord, S, S == 1 ? "" : "s", W, W == 1 ? "" : "s",
		    dir);
	else
		say("scheduler on 127.0.0.1:%u, %u server%s, %u worker%s, "
		    "logs in %s",
		    sched_port, S, S == 1 ? "" : "s", W, W == 1 ? "" : "s",
		    dir);
	if (R > 1)
		say("%u copies of each slot: the job survives %u server "
		    "death%s",
		    R, R - 1, R == 2 ? "" : "s");

	sched_argv[0] = bin;
	sched_argv[1] = "--role";
	sched_argv[2] = "scheduler";
	sched_argv[3] = NULL;
	server_argv[0] = bin;
	server_argv[1] = NULL;
	/* With etcd there is no scheduler to start: from i = 1. */
	for (uint32_t i = l.coord ? 1 : 0; i < 1 + S + W && !l.stopping;
	     i++) {
		enum kind k = i == 0 ? K_SCHED : i <= S ? K_SERVER : K_WORKER;
		const char *role = k == K_SCHED	   ? "scheduler"
				   : k == K_SERVER ? "server"
						   : "worker";
		const char *env[] = {
		    "EMB_ROLE",
		    role,
		    l.coord ? "EMB_COORDINATOR" : "EMB_SCHED_HOST",
		    l.coord ? l.coord : "127.0.0.1",
		    l.coord ? "EMB_JOB" : "EMB_SCHED_PORT",
		    l.coord ? l.job : port,
		    "EMB_SERVER_NUM",
		    snum,
		    "EMB_WORKER_NUM",
		    wnum,
		    "EMB_CLUSTER_TIMEOUT",
		    tmo,
		    "EMB_REPLICAS",
		    rnum,
		    "EMB_SERVER_MAX",
		    smaxnum,
		    "PATH",
		    path,
		    /* Servers bind a free port and register it; the
		     * scheduler keeps its state for its restarts. */
		    k == K_SERVER  ? "EMB_LISTEN"
		    : k == K_SCHED ? "EMB_SCHED_STATE"
				   : NULL,
		    k == K_SERVER ? "127.0.0.1:0" : state,
		    NULL,
		    NULL,
		};
		_Static_assert(sizeof(env) / sizeof(env[0]) <= ENV_MAX,
			       "room for the scheduler's environment");

		if (k == K_SCHED) {
			memcpy(l.sched_env, env, sizeof(env));
			l.sched_argv = sched_argv;
		}
		if (k == K_SERVER) {
			memcpy(l.server_env, env, sizeof(env));
			l.server_argv = server_argv;
		}

		if (k == K_SCHED)
			snprintf(name, sizeof(name), "scheduler");
		else
			snprintf(name, sizeof(name), "%s.%u", role,
				 k == K_SERVER ? i - 1 : i - 1 - S);
		rc = add_child(&l, k, name, dir);
		if (rc == 0)
			rc = spawn(&l, &l.ch[l.nch - 1],
				   k == K_SCHED	   ? sched_argv
				   : k == K_SERVER ? server_argv
						   : argv + optind,
				   env);
		if (rc) {
			say("cannot start %s: %s", name, strerror(-rc));
			stop_all(&l, 1);
		}
		/* Signals that came while starting are handled by run(). */
	}
	/* Ranks that are or may come free (spare ones, or a replicated
	 * job's drained or dead servers'): `embstore scale --add N --launch
	 * CTL` starts servers for them here, through a FIFO in the log
	 * directory. An unreplicated job without spare ranks never has a
	 * free one. */
	if ((smax > S || R > 1) && !l.stopping) {
		char how[600];

		/* How `embstore scale` reaches the job: its scheduler, or
		 * its keys in etcd. */
		if (l.coord)
			snprintf(how, sizeof(how), "--coordinator %s --job %s",
				 l.coord, l.job);
		else
			snprintf(how, sizeof(how), "--sched %s", l.sched);
		snprintf(l.ctl_path, sizeof(l.ctl_path), "%s/launch.ctl", dir);
		unlink(l.ctl_path);
		/* O_RDWR: a writer closing it is no EOF here. */
		if (mkfifo(l.ctl_path, 0600) ||
		    (l.ctl = open(l.ctl_path,
				  O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0) {
			say("cannot make %s: %s; start servers to add by "
			    "hand (embstore scale --add)",
			    l.ctl_path, strerror(errno));
			l.ctl_path[0] = 0;
		} else if (smax > S) {
			say("%u rank%s to spare: embstore scale %s --add N "
			    "--launch %s starts servers here",
			    smax - S, smax - S == 1 ? "" : "s", how,
			    l.ctl_path);
		} else {
			say("no rank to spare; for the rank of a server "
			    "drained or lost, embstore scale %s --add N "
			    "--launch %s starts servers here",
			    how, l.ctl_path);
		}
	}
	run(&l);
	if (l.ctl >= 0)
		close(l.ctl);
	if (l.ctl_path[0])
		unlink(l.ctl_path);
	rc = l.failed;
	if (!rc)
		say("all workers exited 0");
	if (l.coord && emb_coord_job_delete(l.coord, l.job))
		say("could not delete job %s's keys in etcd", l.job);
out:
	for (uint32_t i = 0; i < l.nch; i++)
		if (l.ch[i].log)
			fclose(l.ch[i].log);
	if (l.sigfd >= 0)
		close(l.sigfd);
	sigprocmask(SIG_SETMASK, &l.oldmask, NULL);
	free(l.ch);
	free(path);
	return rc;

bad_usage:
	usage(stderr);
	return 2;
}
