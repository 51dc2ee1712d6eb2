/*
 * tools/embstore/main.c - the embstore command line: picks the subcommand
 * by argv[1] and hands it the rest (each parses its own options and
 * answers its own --help).
 *
 *   embstore dump     snapshot a live table              dump.c
 *   embstore restore  load a snapshot into a cluster     restore.c
 *   embstore inspect  verify and describe a snapshot     inspect.c
 *   embstore export   a snapshot's rows as text          export.c
 *   embstore compact  merge a checkpoint chain           compact.c
 *   embstore stat     rows, memory and rates per table   stat.c
 *   embstore launch   a local cluster                    launch.c
 *   embstore scale    drain a server of a running job    scale.c
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
	const char *name;		  /* argv[1] */
	int (*fn)(int argc, char **argv); /* gets argv + 1 */
	const char *what;		  /* one line of the usage */
} commands[] = {
    {"dump", emb_cmd_dump, "snapshot a live table (one file per server)"},
    {"restore", emb_cmd_restore, "load a snapshot into a cluster"},
    {"inspect", emb_cmd_inspect, "verify and describe a snapshot"},
    {"export", emb_cmd_export, "a snapshot's rows as id<TAB>v0 v1 ..."},
    {"compact", emb_cmd_compact,
     "merge a checkpoint chain into a full checkpoint"},
    {"stat", emb_cmd_stat, "rows, memory and op rates per server and table"},
    {"launch", emb_cmd_launch,
     "a scheduler, servers and workers on this machine"},
    {"scale", emb_cmd_scale, "drain a server of a running replicated job"},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	fputs("usage: embstore COMMAND [options]\n", f);
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].what);
	fputs("`embstore COMMAND --help` lists a command's options; "
	      "--version prints the version.\n",
	      f);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("embstore %s\n", EMB_VERSION);
		return 0;
	}
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "embstore: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
