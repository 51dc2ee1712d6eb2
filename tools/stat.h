/*
 * tools/stat.h - `embstore stat`: servers x tables with rows, memory and
 * op rates, once or refreshed in place (docs/operations.md).
 */
#ifndef EMB_TOOLS_STAT_H
#define EMB_TOOLS_STAT_H

/*
 * Runs `embstore stat` with argv[0] = "stat". Returns the process's exit
 * status: 0 (also when Ctrl-C ends --watch), 1 when a server cannot be
 * read, 2 for a usage error.
 */
int emb_stat_main(int argc, char **argv);

#endif
