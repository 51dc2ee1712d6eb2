/*
 * tools/embstore/scale.c - `embstore scale`: changes the servers of a
 * running replicated job through its scheduler, or in etcd for a job kept
 * there (--coordinator, docs/coordinator.md). --remove RANK drains a
 * server: its slots move to the others while training goes on, then it
 * leaves and exits 0 (docs/replication.md, "Moving slots"). --add N
 * prints the commands that start N servers to join, after checking that
 * the job has ranks free for them; with --launch CTL it asks the
 * `embstore launch` that reads the FIFO CTL to start them instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cluster/coord.h"
#include "common/err.h"
#include "proto/wire_cluster.h"
#include "worker/embstore.h"

static void usage(FILE *f)
{
	fputs("usage: embstore scale --sched HOST:PORT --remove RANK | --add N "
	      "[options]\n"
	      "       embstore scale --coordinator etcd://HOST:PORT --job J "
	      "--remove RANK | --add N\n"
	      "Drains server RANK of the running replicated job whose "
	      "scheduler is at\nHOST:PORT: its slots move to the other "
	      "servers while training goes on, then\nit leaves the job and "
	      "exits 0. Returns once the scheduler queued the drain;\nthe "
	      "scheduler's log and `embstore stat --sched` show the moves.\n"
	      "  --sched HOST:PORT       the job's scheduler (EMB_SCHED_HOST "
	      "and EMB_SCHED_PORT)\n"
	      "  --coordinator etcd://HOST:PORT[,HOST:PORT]  the job is kept "
	      "in etcd\n"
	      "                          (EMB_COORDINATOR); its servers' "
	      "logs show the moves\n"
	      "  --job J                 with --coordinator: the job's name "
	      "(EMB_JOB;\n"
	      "                          default embstore)\n"
	      "  --remove RANK           the server to drain\n"
	      "  --add N                 print the commands that start N "
	      "servers to join (each\n"
	      "                          takes a free rank: a spare one of "
	      "--server_max, or\n"
	      "                          a drained or dead server's)\n"
	      "  --launch CTL            with --add: have the job's embstore "
	      "launch start them\n"
	      "                          (CTL: the FIFO its output names, "
	      "LOG_DIR/launch.ctl)\n"
	      "  --auth-token-file F     the cluster's token "
	      "(EMB_AUTH_TOKEN_FILE)\n" EMB_CLI_HELP_BASE,
	      f);
}

/* --add with --launch: "add N" to the launcher's FIFO. A FIFO with no
 * reader refuses a non-blocking open (ENXIO): no launch runs there. Any
 * other file is refused before a byte is written to it. */
static int ask_launch(const char *ctl, uint32_t n)
{
	char line[32];
	int fd = open(ctl, O_WRONLY | O_NONBLOCK | O_CLOEXEC), len;
	struct stat st;

	if (fd < 0) {
		fprintf(stderr, "embstore scale: %s: %s\n", ctl,
			errno == ENXIO ? "no embstore launch reads it"
				       : strerror(errno));
		return 1;
	}
	if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
		fprintf(stderr,
			"embstore scale: %s: not a FIFO (embstore launch makes "
			"LOG_DIR/launch.ctl)\n",
			ctl);
		close(fd);
		return 1;
	}
	len = snprintf(line, sizeof(line), "add %u\n", n);
	/* Under PIPE_BUF: written whole or not at all. */
	if (write(fd, line, (size_t)len) != len) {
		fprintf(stderr, "embstore scale: %s: %s\n", ctl,
			strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	printf("# asked embstore launch (%s) to start %u server%s to join\n",
	       ctl, n, n == 1 ? "" : "s");
	return 0;
}

/* --add: true (after saying so) when the job has fewer than n ranks free. */
static bool no_room(uint32_t free_ranks, uint32_t n)
{
	if (free_ranks >= n)
		return false;
	fprintf(stderr,
		"embstore scale: the job has %u free rank%s for %u server%s: "
		"start it with more room (embstore launch --server_max, "
		"EMB_SERVER_MAX) or drain servers first\n",
		free_ranks, free_ranks == 1 ? "" : "s", n, n == 1 ? "" : "s");
	return true;
}

/* --add: the commands, once the scheduler's map shows free ranks. */
static int add_servers(const char *sched, const struct cli *cli, uint32_t n,
		       const char *ctl)
{
	struct emb_client_opts co;
	struct emb_client *c = NULL;
	const char *colon = strrchr(sched, ':');
	uint32_t free_ranks = 0;
	int rc;

	emb_client_opts_init(&co);
	co.auth_token = cli->token;
	co.auth_token_len = cli->token_len;
	rc = emb_client_from_sched(&co, sched, &c);
	if (rc) {
		fprintf(stderr, "embstore scale: scheduler %s: %s\n", sched,
			emb_strerror(rc));
		return 1;
	}
	for (uint32_t s = 0; s < emb_client_nservers(c); s++)
		free_ranks += emb_client_server_removed(c, s);
	emb_client_destroy(c);
	if (free_ranks < n || ctl)
		return no_room(free_ranks, n) ? 1 : ask_launch(ctl, n);
	printf("# %u server%s to join the job of scheduler %s, one per "
	       "machine (%u rank%s free):\n",
	       n, n == 1 ? "" : "s", sched, free_ranks,
	       free_ranks == 1 ? "" : "s");
	for (uint32_t i = 0; i < n; i++)
		printf("EMB_ROLE=server EMB_SCHED_HOST=%.*s EMB_SCHED_PORT=%s "
		       "embstore-server --listen 0.0.0.0:0%s\n",
		       (int)(colon - sched), sched, colon + 1,
		       cli->token_file ? " --auth-token-file TOKEN_FILE" : "");
	return 0;
}

/* --add for a job in etcd: the commands, once the job has free ranks. */
static int add_servers_etcd(const char *ep, const char *job, uint32_t n,
			    const char *ctl)
{
	uint32_t ranks = 0, free_ranks = 0;
	int rc = emb_coord_job_free_ranks(ep, job, &ranks, &free_ranks);

	if (rc) {
		fprintf(stderr, "embstore scale: job %s in %s: %s\n",
			job ? job : "embstore", ep,
			rc == EMB_ECLUSTER ? "no such job running"
					   : emb_strerror(rc));
		return 1;
	}
	if (free_ranks < n || ctl)
		return no_room(free_ranks, n) ? 1 : ask_launch(ctl, n);
	printf("# %u server%s to join job %s in %s, one per machine (%u "
	       "rank%s free):\n",
	       n, n == 1 ? "" : "s", job ? job : "embstore", ep, free_ranks,
	       free_ranks == 1 ? "" : "s");
	for (uint32_t i = 0; i < n; i++)
		printf("EMB_ROLE=server EMB_COORDINATOR=%s EMB_JOB=%s "
		       "embstore-server --listen 0.0.0.0:0\n",
		       ep, job ? job : "embstore");
	return 0;
}

int emb_cmd_scale(int argc, char **argv)
{
	static const struct option longopts[] = {
	    EMB_CLI_OPTS_BASE,
	    {"sched", required_argument, NULL, 'C'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"remove", required_argument, NULL, 'r'},
	    {"add", required_argument, NULL, 'A'},
	    {"launch", required_argument, NULL, 'L'},
	    {"coordinator", required_argument, NULL, 'O'},
	    {"job", required_argument, NULL, 'J'},
	    {NULL, 0, NULL, 0},
	};
	static char sched[300];
	const char *h = getenv("EMB_SCHED_HOST"), *p = getenv("EMB_SCHED_PORT");
	char why[EMB_WIRE_ERRMSG_MAX + 1], *end;
	unsigned long rank = 0, add = 0;
	const char *ctl = NULL, *ep = getenv("EMB_COORDINATOR"),
		   *job = getenv("EMB_JOB");
	bool have_rank = false;
	struct cli cli;
	int c, status, rc;

	emb_cli_init(&cli, "scale");
	if (h && *h && p && *p) {
		snprintf(sched, sizeof(sched), "%s:%s", h, p);
		cli.sched = sched;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (c == 'A') {
			errno = 0;
			add = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || add == 0 ||
			    add > EMB_WIRE_SERVERS_MAX)
				return emb_cli_usage_error(
				    &cli, usage, "--add takes 1..4096 servers");
			continue;
		}
		if (c == 'L') {
			ctl = optarg;
			continue;
		}
		if (c == 'O') {
			if (!emb_coord_is_etcd(optarg))
				return emb_cli_usage_error(
				    &cli, usage,
				    "--coordinator takes etcd://HOST:PORT");
			ep = optarg;
			continue;
		}
		if (c == 'J') {
			job = optarg;
			continue;
		}
		if (c == 'r') {
			errno = 0;
			rank = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end ||
			    rank >= EMB_WIRE_SERVERS_MAX)
				return emb_cli_usage_error(
				    &cli, usage, "--remove takes a server rank");
			have_rank = true;
			continue;
		}
		status = emb_cli_opt(&cli, c, optarg, usage);
		if (status >= 0)
			return status;
	}
	if (optind < argc)
		return emb_cli_usage_error(&cli, usage, "unexpected argument");
	if (ep && !*ep)
		ep = NULL;
	if (ep && !emb_coord_is_etcd(ep))
		return emb_cli_usage_error(&cli, usage,
					   "EMB_COORDINATOR is no etcd://");
	if (!cli.sched && !ep)
		return emb_cli_usage_error(
		    &cli, usage, "scale needs --sched or --coordinator");
	if (have_rank == (add > 0))
		return emb_cli_usage_error(&cli, usage,
					   "scale needs --remove RANK or --add N");
	if (ctl && !add)
		return emb_cli_usage_error(&cli, usage,
					   "--launch goes with --add");
	/* Only the log level and the token: --sched here is not resolved
	 * into a server list. */
	h = cli.sched;
	cli.sched = NULL;
	status = emb_cli_setup(&cli);
	if (status)
		return status;
	/* A job in etcd: its keys, no scheduler (a --sched given too is
	 * the environment's, or a mistake: etcd holds the job). */
	if (ep && add)
		return add_servers_etcd(ep, job, (uint32_t)add, ctl);
	if (add)
		return add_servers(h, &cli, (uint32_t)add, ctl);
	why[0] = '\0';
	rc = ep ? emb_coord_job_drain(ep, job, (uint32_t)rank, why,
				      sizeof(why))
		: emb_cluster_drain(h, cli.token, cli.token_len,
				    (uint32_t)rank, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "embstore scale: %s %s: %s%s%s\n",
			ep ? "etcd" : "scheduler", ep ? ep : h,
			emb_strerror(rc), why[0] ? ": " : "", why);
		return 1;
	}
	printf("scale: server %lu drains: its slots move to the others, then "
	       "it exits\n",
	       rank);
	return 0;
}
