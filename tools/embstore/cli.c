/*
 * tools/embstore/cli.c - what the embstore subcommands share: options,
 * the environment, progress lines, raw server connections (HELLO with the
 * token) and reading dump directories. Progress counters may be bumped
 * from any thread; the rest runs on the thread that calls it.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/token.h"
#include "proto/wire_msg.h"
#include "store/chain.h"
#include "worker/embstore.h"
#include "cluster/hello.h"

volatile sig_atomic_t emb_cli_interrupted;

static void on_signal(int sig)
{
	emb_cli_interrupted = sig;
}

/* ---- options ---- */

void emb_cli_init(struct cli *cli, const char *cmd)
{
	const char *t = getenv("EMB_TRANSPORT");

	memset(cli, 0, sizeof(*cli));
	cli->cmd = cmd;
	cli->servers = getenv("EMB_SERVERS");
	cli->transport = t && *t ? t : "tcp";
	cli->token_file = getenv("EMB_AUTH_TOKEN_FILE");
	cli->level = "warn";
	cli->block_bytes = 1u << 20;
}

int emb_cli_opt(struct cli *cli, int c, const char *arg, void (*usage)(FILE *f))
{
	switch (c) {
	case 's':
		cli->servers = arg;
		return -1;
	case 'C':
		cli->sched = arg;
		return -1;
	case 'T':
		cli->transport = arg;
		return -1;
	case 'a':
		cli->token_file = arg;
		return -1;
	case 'q':
		cli->quiet = true;
		return -1;
	case 'L':
		cli->level = arg;
		return -1;
	case 'h':
		usage(stdout);
		return 0;
	case 'V':
		printf("embstore %s\n", EMB_VERSION);
		return 0;
	default:
		return emb_cli_usage_error(cli, usage, NULL);
	}
}

int emb_cli_usage_error(const struct cli *cli, void (*usage)(FILE *f),
			const char *msg)
{
	if (msg)
		fprintf(stderr, "embstore %s: %s\n", cli->cmd, msg);
	usage(stderr);
	return 2;
}

int emb_cli_setup(struct cli *cli)
{
	static char sched_servers[65536];
	enum emb_log_level lvl;
	int rc;

	if (emb_log_parse_level(cli->level, &lvl)) {
		fprintf(stderr, "embstore %s: bad --log-level '%s'\n", cli->cmd,
			cli->level);
		return 2;
	}
	emb_log_set_level(lvl);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	/* A file size limit must fail write() (EFBIG), not kill us before
	 * the temporary files are removed. */
	signal(SIGXFSZ, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	if (cli->token_file && *cli->token_file &&
	    emb_token_read_file(cli->token_file, cli->token, &cli->token_len)) {
		fprintf(stderr, "embstore %s: cannot use token file %s\n",
			cli->cmd, cli->token_file);
		return 2;
	}
	if (cli->sched) {
		/* An observer: it asks for the map without joining the job. */
		rc = emb_cluster_servers_auth(cli->sched, cli->token,
					      cli->token_len, sched_servers,
					      sizeof(sched_servers));
		if (rc) {
			fprintf(stderr, "embstore %s: scheduler %s: %s\n",
				cli->cmd, cli->sched, emb_strerror(rc));
			return 1;
		}
		cli->servers = sched_servers;
	}
	return 0;
}

/* ---- progress ---- */

void emb_cli_progress_init(struct emb_cli_progress *p, const char *what,
			   bool quiet)
{
	memset(p, 0, sizeof(*p));
	p->what = what;
	p->t0 = emb_clock_s();
	p->tty = !quiet && isatty(2);
}

void emb_cli_progress_add(struct emb_cli_progress *p, uint64_t rows,
			  uint64_t bytes)
{
	__atomic_fetch_add(&p->rows, rows, __ATOMIC_RELAXED);
	__atomic_fetch_add(&p->bytes, bytes, __ATOMIC_RELAXED);
}

/* Prints at most 5 times a second; from one thread only. */
void emb_cli_progress_show(struct emb_cli_progress *p, bool force)
{
	double t = emb_clock_s(), dt = t - p->t0;
	uint64_t rows = __atomic_load_n(&p->rows, __ATOMIC_RELAXED);
	uint64_t bytes = __atomic_load_n(&p->bytes, __ATOMIC_RELAXED);
	double mbs = dt > 0 ? (double)bytes / 1e6 / dt : 0;
	char eta[32] = "?";

	if (!p->tty || (!force && t - p->last < 0.2))
		return;
	p->last = t;
	if (p->rows_total && rows && rows <= p->rows_total)
		snprintf(eta, sizeof(eta), "%.0fs",
			 dt * (double)(p->rows_total - rows) / (double)rows);
	fprintf(stderr, "\r%s: %llu/%llu rows, %.1f MB/s, ETA %s   ", p->what,
		(unsigned long long)rows, (unsigned long long)p->rows_total,
		mbs, eta);
	fflush(stderr);
}

void emb_cli_progress_end(struct emb_cli_progress *p)
{
	if (p->tty) {
		emb_cli_progress_show(p, true);
		fputc('\n', stderr);
	}
}

/* ---- server list and raw connections ---- */

void emb_cli_conn_close(struct emb_cli_conn *r)
{
	emb_conn_destroy(r->c);
	emb_transport_destroy(r->tr);
	free(r->resp);
	memset(r, 0, sizeof(*r));
}

/*
 * Sends op with payload[0..len) and waits. 0 and *f (a view of r->resp),
 * or a transport error, or the server's negative status (message kept in
 * r->errmsg).
 */
static int call(struct emb_cli_conn *r, uint8_t op, uint16_t flags,
		uint32_t table_id, uint32_t count, const void *payload,
		uint32_t len, struct emb_wire_frame *f)
{
	struct emb_frame_hdr hdr = {.opcode = op,
				    .flags = flags,
				    .table_id = table_id,
				    .count = count};
	struct iovec iov = {(void *)payload, len};
	struct emb_wire_error e;
	int rc;

	rc = emb_conn_call_sync(r->c, &hdr, &iov, len ? 1 : 0, r->resp,
				r->resp_cap, &f->hdr);
	if (rc)
		return rc;
	f->payload = r->resp;
	f->lim = &r->lim;
	if (f->hdr.status < 0) {
		r->errmsg[0] = '\0';
		if (emb_wire_error_decode(f, &e) == 0)
			snprintf(r->errmsg, sizeof(r->errmsg), "%.*s",
				 (int)e.msg_len, e.msg);
		return f->hdr.status;
	}
	return 0;
}

int emb_cli_conn_call(struct emb_cli_conn *r, uint8_t op, uint32_t table_id,
		      uint32_t count, const void *payload, uint32_t len,
		      struct emb_wire_frame *f)
{
	return call(r, op, 0, table_id, count, payload, len, f);
}

int emb_cli_conn_call_flags(struct emb_cli_conn *r, uint8_t op,
			    uint16_t flags, uint32_t table_id, uint32_t count,
			    struct emb_wire_frame *f)
{
	return call(r, op, flags, table_id, count, NULL, 0, f);
}

int emb_cli_conn_open(struct emb_cli_conn *r, const struct cli *cli,
		      const struct emb_addr *a)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts copts = EMB_CONNECT_OPTS_DEFAULT;
	int rc;

	memset(r, 0, sizeof(*r));
	r->lim = EMB_WIRE_LIMITS_DEFAULT;
	r->lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	topts.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	topts.call_timeout_ms = 120000;
	r->resp_cap = EMB_CLI_CHUNK_BYTES + (1u << 20);
	r->resp = malloc(r->resp_cap);
	if (!r->resp)
		return -ENOMEM;
	rc = emb_transport_create(cli->transport, &topts, &r->tr);
	if (rc)
		goto err;
	copts.host = a->host;
	copts.port = a->port;
	rc = emb_conn_create(r->tr, &copts, &r->c);
	if (rc)
		goto err;
	rc = emb_hello(r->c, cli->token, cli->token_len, "embstore-cli",
		       &r->lim, r->errmsg, sizeof(r->errmsg));
	if (rc)
		goto err;
	return 0;
err:
	emb_cli_conn_close(r);
	return rc;
}

/* The id of table name on the server: 0 and *id, or EMB_ENOTABLE. */
int emb_cli_conn_find_table(struct emb_cli_conn *r, const char *name,
			    uint32_t *id)
{
	struct emb_wire_list_resp lr;
	struct emb_wire_table_info info;
	struct emb_wire_frame f;
	int rc;

	rc = emb_cli_conn_call(r, EMB_OP_LIST_TABLES, 0, 0, NULL, 0, &f);
	if (!rc)
		rc = emb_wire_list_resp_decode(&f, &lr);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < lr.n; i++) {
		emb_wire_list_entry(&lr, i, &info);
		if (strcmp(info.spec.name, name) == 0) {
			*id = info.table_id;
			return 0;
		}
	}
	return EMB_ENOTABLE;
}

/* ---- reading a dump directory ---- */

void emb_cli_fileset_path(const struct emb_cli_fileset *fs, uint32_t i,
			  char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", fs->dir, fs->e[i].file);
}

static bool file_exists(const char *dir, const char *name)
{
	char p[2 * EMB_SNAP_PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

bool emb_cli_is_dump(const char *dir)
{
	return file_exists(dir, EMB_SNAP_MANIFEST);
}

/* A checkpoint directory: its newest chain, merged into a temporary dump
 * under $TMPDIR that emb_cli_fileset_close() removes. */
static int open_chain(const char *what, const char *path,
		      struct emb_cli_fileset *fs)
{
	const char *tmp = getenv("TMPDIR");
	char why[EMB_SNAP_PATH_MAX + 300], bad[EMB_SNAP_PATH_MAX];
	int rc;

	snprintf(fs->dir, sizeof(fs->dir), "%s/embstore-chain-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(fs->dir)) {
		rc = -errno;
		fprintf(stderr, "embstore %s: %s: %s\n", what, fs->dir,
			strerror(errno));
		return rc;
	}
	fs->merged = true;
	rc = emb_chain_compact(path, fs->dir, NULL, why, sizeof(why));
	if (!rc)
		rc = emb_snap_manifest_read(fs->dir, &fs->e, &fs->n, bad);
	if (rc) {
		fprintf(stderr, "embstore %s: %s: checkpoint chain: %s\n",
			what, path, why[0] ? why : emb_strerror(rc));
		emb_cli_fileset_close(fs);
		return rc;
	}
	fprintf(stderr, "embstore %s: %s: checkpoint chain %s\n", what, path,
		why);
	return 0;
}

int emb_cli_fileset_open(const char *what, const char *path,
			 struct emb_cli_fileset *fs)
{
	char bad[EMB_SNAP_PATH_MAX];
	struct stat st;
	int rc;

	memset(fs, 0, sizeof(*fs));
	if (stat(path, &st) != 0) {
		fprintf(stderr, "embstore %s: %s: %s\n", what, path,
			strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode)) {
		const char *slash = strrchr(path, '/');

		fs->e = calloc(1, sizeof(*fs->e));
		if (!fs->e)
			return -ENOMEM;
		fs->n = 1;
		if (slash)
			snprintf(fs->dir, sizeof(fs->dir), "%.*s",
				 (int)(slash - path), path);
		else
			snprintf(fs->dir, sizeof(fs->dir), ".");
		snprintf(fs->e[0].file, sizeof(fs->e[0].file), "%s",
			 slash ? slash + 1 : path);
		fs->e[0].nparts = 1;
		return 0;
	}
	snprintf(fs->dir, sizeof(fs->dir), "%s", path);
	if (!file_exists(path, EMB_SNAP_MANIFEST) && emb_chain_is_root(path))
		return open_chain(what, path, fs);
	rc = emb_snap_manifest_read(path, &fs->e, &fs->n, bad);
	if (rc == -ENOENT)
		fprintf(stderr,
			"embstore %s: %s has no MANIFEST: not a finished "
			"dump\n",
			what, path);
	else if (rc == EMB_EMANIFEST && strcmp(bad, EMB_SNAP_MANIFEST) != 0)
		fprintf(stderr, "embstore %s: %s: %s: %s\n", what, path, bad,
			file_exists(path, bad)
			    ? "present but not listed in the MANIFEST"
			    : "listed in the MANIFEST but missing");
	else if (rc)
		fprintf(stderr, "embstore %s: %s: %s: %s\n", what, path, bad,
			emb_strerror(rc));
	return rc;
}

void emb_cli_fileset_close(struct emb_cli_fileset *fs)
{
	free(fs->e);
	fs->e = NULL;
	if (fs->merged) {
		char *slash = strrchr(fs->dir, '/');

		*slash = '\0';
		emb_chain_rm(fs->dir, slash + 1);
		*slash = '/';
		fs->merged = false;
	}
}

const char *emb_cli_snap_err(int rc)
{
	switch (rc) {
	case EMB_EBADDUMP:
		return "checksum mismatch: the file is damaged";
	case EMB_ETRUNCATED:
		return "the file is truncated";
	case EMB_EDUMPFORMAT:
		return "not a snapshot file of a format version this embstore "
		       "reads";
	default:
		return emb_strerror(rc);
	}
}

/*
 * Verifies every file of fs (all checksums; for a manifest, that the file
 * checksum is the listed one). Fills metas[i]. Prints why and returns the
 * error of the first bad file.
 */
int emb_cli_fileset_verify(const char *what, const struct emb_cli_fileset *fs,
			   struct emb_snap_meta *metas)
{
	char p[EMB_SNAP_PATH_MAX + 300];
	uint64_t sum;
	int rc;

	for (uint32_t i = 0; i < fs->n; i++) {
		emb_cli_fileset_path(fs, i, p, sizeof(p));
		rc = emb_snap_verify(p, EMB_SNAP_READ_VERIFY_ONLY, &metas[i],
				     &sum);
		if (!rc && fs->e[i].bytes && sum != fs->e[i].checksum)
			rc = EMB_EMANIFEST;
		if (rc) {
			fprintf(stderr, "embstore %s: %s: %s\n", what, p,
				rc == EMB_EMANIFEST
				    ? "checksum differs from the manifest"
				    : emb_cli_snap_err(rc));
			return rc;
		}
	}
	return 0;
}

int emb_cli_finish_dir(struct cli *cli, int argc, char **argv,
		       void (*usage)(FILE *f))
{
	if (optind < argc && !cli->dir)
		cli->dir = argv[optind++];
	if (optind < argc)
		return emb_cli_usage_error(cli, usage, "unexpected argument");
	return emb_cli_setup(cli);
}
