/*
 * tools/embstore/cli.h - what the `embstore` subcommands share: their
 * options, progress lines, raw connections to servers and reading a dump
 * directory. One file per subcommand (dump.c, restore.c, inspect.c,
 * export.c, launch.c, stat.c); main.c picks one by argv[1].
 *
 * Each emb_cmd_* takes argv with argv[0] the subcommand's name, parses its
 * own options and returns the process's exit status: 0, 1 when the work
 * failed (the reason is printed), 2 for a usage error.
 */
#ifndef EMB_TOOLS_EMBSTORE_CLI_H
#define EMB_TOOLS_EMBSTORE_CLI_H

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/addr.h"
#include "proto/wire.h"
#include "store/snapshot.h"
#include "transport/transport.h"

#define EMB_CLI_MAX_SERVERS 256u
#define EMB_CLI_CHUNK_BYTES (8u << 20) /* rows asked per DUMP_CHUNK */

int emb_cmd_dump(int argc, char **argv);
int emb_cmd_restore(int argc, char **argv);
int emb_cmd_inspect(int argc, char **argv);
int emb_cmd_export(int argc, char **argv);
int emb_cmd_compact(int argc, char **argv);
int emb_cmd_launch(int argc, char **argv);
int emb_cmd_stat(int argc, char **argv);
int emb_cmd_scale(int argc, char **argv);

/* Options the subcommands share; each uses what it needs. */
struct cli {
	const char *cmd;	/* "dump", ...: for messages */
	const char *servers;	/* "host:port,..." */
	const char *sched;	/* --sched HOST:PORT, or NULL */
	const char *transport;	/* "tcp" or "rdma" */
	const char *table;	/* table name */
	const char *dir;	/* --out of dump, --in of restore/export */
	bool consistent;	/* dump --consistent */
	const char *from;	/* restore --from: the table to take */
	const char *row_format; /* restore --row-format, or NULL */
	uint32_t row_format_value; /* its enum emb_row_format */
	const char *out;	/* export's output file, NULL = stdout */
	const char *format;	/* export format */
	const char *token_file; /* --auth-token-file */
	const char *level;	/* --log-level */
	uint8_t token[EMB_WIRE_TOKEN_MAX]; /* auth token */
	uint32_t token_len;		   /* 0 = none */
	uint32_t rows;			   /* inspect --rows */
	uint32_t block_bytes;		   /* dump block size */
	bool shuffle;			   /* dump byte planes */
	bool quiet;			   /* no progress */
};

/* getopt_long entries every subcommand takes, and those that reach servers. */
#define EMB_CLI_OPTS_BASE                                                      \
	{"log-level", required_argument, NULL, 'L'},                           \
	    {"help", no_argument, NULL, 'h'},                                  \
	{                                                                      \
		"version", no_argument, NULL, 'V'                              \
	}
#define EMB_CLI_OPTS_CONN                                                      \
	{"servers", required_argument, NULL, 's'},                             \
	    {"sched", required_argument, NULL, 'C'},                           \
	    {"transport", required_argument, NULL, 'T'},                       \
	    {"auth-token-file", required_argument, NULL, 'a'},                 \
	{                                                                      \
		"quiet", no_argument, NULL, 'q'                                \
	}

/* Usage lines for EMB_CLI_OPTS_CONN and EMB_CLI_OPTS_BASE. */
#define EMB_CLI_HELP_CONN                                                      \
	"  --servers LIST          host:port[,host:port...] (EMB_SERVERS)\n"   \
	"  --sched HOST:PORT       find the servers through the scheduler, "   \
	"without joining\n"                                                    \
	"  --transport tcp|rdma    (EMB_TRANSPORT; default tcp)\n"             \
	"  --auth-token-file F     the servers' token (EMB_AUTH_TOKEN_FILE)\n" \
	"  --quiet                 no progress line on stderr\n"
#define EMB_CLI_HELP_BASE                                                      \
	"  --log-level L           error|warn|info|debug (default warn)\n"     \
	"  --help, --version\n"

/* Fills *cli with defaults and the environment (EMB_SERVERS, ...). */
void emb_cli_init(struct cli *cli, const char *cmd);

/*
 * Handles option c (a letter of EMB_CLI_OPTS_*) for cli. -1: taken, go
 * on; 0: --help or --version printed, exit 0; 2: not an option of this
 * command (usage printed), exit 2.
 */
int emb_cli_opt(struct cli *cli, int c, const char *arg,
		void (*usage)(FILE *f));

/*
 * After parsing: sets the log level, SIGINT/SIGTERM handling, resolves
 * --sched into cli->servers and reads the token. 0, or the exit status
 * (the reason printed).
 */
int emb_cli_setup(struct cli *cli);

/*
 * The end of parsing for a command that reads a dump or checkpoint: one
 * positional DIR when --in did not give it, no other argument, then
 * emb_cli_setup(). 0, or the exit status.
 */
int emb_cli_finish_dir(struct cli *cli, int argc, char **argv,
		       void (*usage)(FILE *f));

/* Prints "embstore CMD: msg" and the usage; returns 2. */
int emb_cli_usage_error(const struct cli *cli, void (*usage)(FILE *f),
			const char *msg);

/*
 * Set by SIGINT / SIGTERM: dump and restore stop at the next chunk, so a
 * dump removes its temporary files instead of leaving them behind.
 */
extern volatile sig_atomic_t emb_cli_interrupted;

/* ---- progress ---- */

/* Counters the workers bump and a progress line reads. */
struct emb_cli_progress {
	const char *what;    /* "dump", "restore" */
	uint64_t rows;	     /* done; atomic */
	uint64_t bytes;	     /* raw row bytes done; atomic */
	uint64_t rows_total; /* expected, 0 = unknown */
	double t0;	     /* start, emb_clock_s() */
	double last;	     /* last print */
	bool tty;	     /* stderr is a terminal and not --quiet */
};

void emb_cli_progress_init(struct emb_cli_progress *p, const char *what,
			   bool quiet);
void emb_cli_progress_add(struct emb_cli_progress *p, uint64_t rows,
			  uint64_t bytes); /* any thread */
/* Prints at most 5 times a second (force: now); from one thread only. */
void emb_cli_progress_show(struct emb_cli_progress *p, bool force);
void emb_cli_progress_end(struct emb_cli_progress *p);

/* ---- raw connections ---- */

/* One connection used with blocking calls from one thread. */
struct emb_cli_conn {
	struct emb_transport *tr;	      /* this thread's loop */
	struct emb_conn *c;		      /* to the server */
	struct emb_wire_limits lim;	      /* the server's, from HELLO */
	uint8_t *resp;			      /* response payloads land here */
	size_t resp_cap;		      /* bytes of resp */
	char errmsg[EMB_WIRE_ERRMSG_MAX + 1]; /* last server error */
};

/*
 * Connects and says HELLO (with cli's token); responses of up to a chunk
 * fit. 0, or an error.
 */
int emb_cli_conn_open(struct emb_cli_conn *r, const struct cli *cli,
		      const struct emb_addr *a);
void emb_cli_conn_close(struct emb_cli_conn *r);

/*
 * Sends op with payload[0..len) and waits. 0 and *f (a view of r->resp),
 * or a transport error, or the server's negative status (message kept in
 * r->errmsg).
 */
int emb_cli_conn_call(struct emb_cli_conn *r, uint8_t op, uint32_t table_id,
		      uint32_t count, const void *payload, uint32_t len,
		      struct emb_wire_frame *f);
/* The same with header flags (EMB_F_*). */
int emb_cli_conn_call_flags(struct emb_cli_conn *r, uint8_t op,
			    uint16_t flags, uint32_t table_id, uint32_t count,
			    struct emb_wire_frame *f);

/* The id of table name on the server: 0 and *id, or EMB_ENOTABLE. */
int emb_cli_conn_find_table(struct emb_cli_conn *r, const char *name,
			    uint32_t *id);

/* ---- reading a dump directory ---- */

/* The files to read: a dump directory's manifest, or one file. */
struct emb_cli_fileset {
	struct emb_snap_entry *e;    /* entries (one for a single file) */
	uint32_t n;		     /* entries */
	char dir[EMB_SNAP_PATH_MAX]; /* directory the names are in */
	bool merged;		     /* dir is a merged chain: close
					removes it */
};

/* True when dir holds a MANIFEST (a dump or one checkpoint). */
bool emb_cli_is_dump(const char *dir);

/* Opens path (a dump directory, one file, or a checkpoint directory,
 * whose newest chain is merged into a temporary dump); prints why not. */
int emb_cli_fileset_open(const char *what, const char *path,
			 struct emb_cli_fileset *fs);
void emb_cli_fileset_close(struct emb_cli_fileset *fs);
void emb_cli_fileset_path(const struct emb_cli_fileset *fs, uint32_t i,
			  char *buf, size_t cap);

/*
 * Verifies every file of fs (all checksums; for a manifest, that the file
 * checksum is the listed one). Fills metas[i]. Prints why and returns the
 * error of the first bad file.
 */
int emb_cli_fileset_verify(const char *what, const struct emb_cli_fileset *fs,
			   struct emb_snap_meta *metas);

/* A snapshot error as a user reads it. */
const char *emb_cli_snap_err(int rc);

#endif
