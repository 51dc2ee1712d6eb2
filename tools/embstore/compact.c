/*
 * tools/embstore/compact.c - `embstore compact`: merges the newest chain
 * of a checkpoint directory (a full checkpoint and its deltas) into a new
 * full checkpoint there (store/chain.c does the work).
 */
#include <stdlib.h>

#include "cli.h"
#include "common/err.h"
#include "store/chain.h"

static void usage(FILE *f)
{
	fputs("usage: embstore compact DIR [options]\n"
	      "Merges the newest chain of checkpoint directory DIR (a full "
	      "checkpoint and\nits deltas, every link verified) into a new "
	      "full checkpoint in DIR, the one\na server started on DIR loads "
	      "next. The old chain stays until the server\nprunes it. Needs "
	      "memory for the tables.\n" EMB_CLI_HELP_BASE,
	      f);
}

static int run(struct cli *cli)
{
	char why[EMB_SNAP_PATH_MAX + 300];
	struct emb_chain_result res;
	int rc;

	if (!cli->dir)
		return emb_cli_usage_error(cli, usage,
					   "compact needs a directory");
	rc = emb_chain_compact(cli->dir, NULL, &res, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "embstore compact: %s: %s\n", cli->dir,
			why[0] ? why : emb_strerror(rc));
		return 1;
	}
	printf("compact: %s: %s -> %s: %llu rows, %llu bytes\n", cli->dir,
	       why, res.name, (unsigned long long)res.rows,
	       (unsigned long long)res.bytes);
	return 0;
}

int emb_cmd_compact(int argc, char **argv)
{
	static const struct option longopts[] = {
	    EMB_CLI_OPTS_BASE,
	    {NULL, 0, NULL, 0},
	};
	struct cli cli;
	int c, status;

	emb_cli_init(&cli, "compact");
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		status = emb_cli_opt(&cli, c, optarg, usage);
		if (status >= 0)
			return status;
	}
	status = emb_cli_finish_dir(&cli, argc, argv, usage);
	return status ? status : run(&cli);
}
