/*
 * tools/embstore/scale.c - `embstore scale`: changes the servers of a
 * running replicated job through its scheduler. --remove RANK drains a
 * server: its slots move to the others while training goes on, then it
 * leaves and exits 0 (docs/replication.md, "Moving slots").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/err.h"
#include "proto/wire_cluster.h"
#include "worker/embstore.h"

static void usage(FILE *f)
{
	fputs("usage: embstore scale --sched HOST:PORT --remove RANK "
	      "[options]\n"
	      "Drains server RANK of the running replicated job whose "
	      "scheduler is at\nHOST:PORT: its slots move to the other "
	      "servers while training goes on, then\nit leaves the job and "
	      "exits 0. Returns once the scheduler queued the drain;\nthe "
	      "scheduler's log and `embstore stat --sched` show the moves.\n"
	      "  --sched HOST:PORT       the job's scheduler (EMB_SCHED_HOST "
	      "and EMB_SCHED_PORT)\n"
	      "  --remove RANK           the server to drain\n"
	      "  --auth-token-file F     the cluster's token "
	      "(EMB_AUTH_TOKEN_FILE)\n" EMB_CLI_HELP_BASE,
	      f);
}

int emb_cmd_scale(int argc, char **argv)
{
	static const struct option longopts[] = {
	    EMB_CLI_OPTS_BASE,
	    {"sched", required_argument, NULL, 'C'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"remove", required_argument, NULL, 'r'},
	    {NULL, 0, NULL, 0},
	};
	static char sched[300];
	const char *h = getenv("EMB_SCHED_HOST"), *p = getenv("EMB_SCHED_PORT");
	char why[EMB_WIRE_ERRMSG_MAX + 1], *end;
	unsigned long rank = 0;
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
	if (!cli.sched)
		return emb_cli_usage_error(&cli, usage, "scale needs --sched");
	if (!have_rank)
		return emb_cli_usage_error(&cli, usage,
					   "scale needs --remove RANK");
	/* Only the log level and the token: --sched here is not resolved
	 * into a server list. */
	h = cli.sched;
	cli.sched = NULL;
	status = emb_cli_setup(&cli);
	if (status)
		return status;
	rc = emb_cluster_drain(h, cli.token, cli.token_len, (uint32_t)rank,
			       why, sizeof(why));
	if (rc) {
		fprintf(stderr, "embstore scale: scheduler %s: %s%s%s\n", h,
			emb_strerror(rc), why[0] ? ": " : "", why);
		return 1;
	}
	printf("scale: server %lu drains: its slots move to the others, then "
	       "it exits\n",
	       rank);
	return 0;
}
