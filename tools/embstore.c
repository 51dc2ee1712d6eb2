/*
 * tools/embstore.c - the embstore command line: snapshots of live tables.
 *
 *   embstore dump    --servers LIST --table T --out DIR
 *   embstore restore --in DIR --servers LIST [--table NAME]
 *   embstore inspect DIR|FILE [--rows N]
 *   embstore export  --in DIR|FILE --format tsv [--out FILE]
 *
 * dump streams each server's rows (DUMP_* ops, src/proto/wire_dump.h) into one
 * snapshot file per server (store/snapshot.h), one thread per server, and
 * writes the MANIFEST last: a dump without one is not a dump. restore
 * verifies every file and checks the target before it changes anything,
 * then assigns rows with their optimizer state through the client library,
 * which routes each id by slot, so any number of servers may receive them.
 * Progress goes to stderr when it is a terminal; results to stdout.
 * launch (tools/launch.c) and stat (tools/stat.c) parse their own options
 * and are handed argv from main() before the options here are parsed.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/addr.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/token.h"
#include "proto/wire.h"
#include "proto/wire_dump.h"
#include "proto/wire_msg.h"
#include "store/snapshot.h"
#include "transport/transport.h"
#include "worker/embstore.h"
#include "worker/hello.h"
#include "launch.h"
#include "stat.h"

#define CHUNK_BYTES  (8u << 20) /* rows asked per DUMP_CHUNK */
#define ASSIGN_BYTES (8u << 20) /* rows per restore assign call */
#define MAX_SERVERS  256u

/* Options shared by the subcommands. */
struct cli {
	const char *servers;   /* "host:port,..." */
	const char *transport; /* "tcp" or "rdma" */
	const char *table;     /* table name */
	const char *dir;       /* --out of dump, --in of restore/export */
	const char *out;       /* export's output file, NULL = stdout */
	const char *format;    /* export format */
	uint8_t token[EMB_WIRE_TOKEN_MAX]; /* auth token */
	uint32_t token_len;		   /* 0 = none */
	uint32_t rows;			   /* inspect --rows */
	uint32_t block_bytes;		   /* dump block size */
	bool shuffle;			   /* dump byte planes */
	bool quiet;			   /* no progress */
};

/*
 * Set by SIGINT / SIGTERM: dump and restore stop at the next chunk, so a
 * dump removes its temporary files instead of leaving them behind.
 */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

static void die_usage(const char *msg)
{
	fprintf(stderr, "embstore: %s (see embstore --help)\n", msg);
	exit(2);
}

/* ---- progress ---- */

/* Counters the workers bump and a progress line reads. */
struct progress {
	const char *what;    /* "dump", "restore" */
	uint64_t rows;	     /* done; atomic */
	uint64_t bytes;	     /* raw row bytes done; atomic */
	uint64_t rows_total; /* expected, 0 = unknown */
	double t0;	     /* start, emb_clock_s() */
	double last;	     /* last print */
	bool tty;	     /* stderr is a terminal and not --quiet */
};

static void progress_init(struct progress *p, const char *what, bool quiet)
{
	memset(p, 0, sizeof(*p));
	p->what = what;
	p->t0 = emb_clock_s();
	p->tty = !quiet && isatty(2);
}

static void progress_add(struct progress *p, uint64_t rows, uint64_t bytes)
{
	__atomic_fetch_add(&p->rows, rows, __ATOMIC_RELAXED);
	__atomic_fetch_add(&p->bytes, bytes, __ATOMIC_RELAXED);
}

/* Prints at most 5 times a second; from one thread only. */
static void progress_show(struct progress *p, bool force)
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

static void progress_end(struct progress *p)
{
	if (p->tty) {
		progress_show(p, true);
		fputc('\n', stderr);
	}
}

/* ---- server list and raw connections ---- */

/* One connection used with blocking calls from one thread. */
struct rconn {
	struct emb_transport *tr;	      /* this thread's loop */
	struct emb_conn *c;		      /* to the server */
	struct emb_wire_limits lim;	      /* the server's, from HELLO */
	uint8_t *resp;			      /* response payloads land here */
	size_t resp_cap;		      /* bytes of resp */
	char errmsg[EMB_WIRE_ERRMSG_MAX + 1]; /* last server error */
};

static void rconn_close(struct rconn *r)
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
static int rconn_call(struct rconn *r, uint8_t op, uint32_t table_id,
		      uint32_t count, const void *payload, uint32_t len,
		      struct emb_wire_frame *f)
{
	struct emb_frame_hdr hdr = {
	    .opcode = op, .table_id = table_id, .count = count};
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

static int rconn_open(struct rconn *r, const struct cli *cli,
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
	r->resp_cap = CHUNK_BYTES + (1u << 20);
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
	rconn_close(r);
	return rc;
}

/* The id of table name on the server: 0 and *id, or EMB_ENOTABLE. */
static int rconn_find_table(struct rconn *r, const char *name, uint32_t *id)
{
	struct emb_wire_list_resp lr;
	struct emb_wire_table_info info;
	struct emb_wire_frame f;
	int rc;

	rc = rconn_call(r, EMB_OP_LIST_TABLES, 0, 0, NULL, 0, &f);
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

/* ---- dump ---- */

/*
 * DUMP_CHUNK calls kept in flight, so the server copies the next rows while
 * this side compresses the last ones. The server answers a conn's requests
 * in order, so chunks arrive in order.
 */
#define CHUNKS_INFLIGHT 2

struct chunk_call {
	uint8_t *buf;		  /* response payload lands here */
	struct emb_frame_hdr hdr; /* response header once done */
	int status;		  /* call status once done */
	bool done;		  /* the callback ran */
};

static void chunk_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct chunk_call *cc = ctx;

	cc->status = status;
	if (!status)
		cc->hdr = *resp;
	cc->done = true;
}

static int chunk_post(struct rconn *r, struct chunk_call *cc, uint32_t id,
		      uint32_t want)
{
	struct emb_frame_hdr hdr = {
	    .opcode = EMB_OP_DUMP_CHUNK, .table_id = id, .count = want};

	cc->done = false;
	return emb_conn_call(r->c, &hdr, NULL, 0, cc->buf, r->resp_cap,
			     chunk_done, cc);
}

/* Waits for cc and decodes it: 0 and *ch, or an error (errmsg set). */
static int chunk_wait(struct rconn *r, struct chunk_call *cc,
		      uint32_t row_floats, struct emb_wire_dump_chunk *ch)
{
	struct emb_wire_frame f;
	struct emb_wire_error e;

	while (!cc->done)
		emb_transport_poll(r->tr, 100);
	if (cc->status)
		return cc->status;
	f = (struct emb_wire_frame){
	    .hdr = cc->hdr, .payload = cc->buf, .lim = &r->lim};
	if (f.hdr.status < 0) {
		r->errmsg[0] = '\0';
		if (emb_wire_error_decode(&f, &e) == 0)
			snprintf(r->errmsg, sizeof(r->errmsg), "%.*s",
				 (int)e.msg_len, e.msg);
		return f.hdr.status;
	}
	return emb_wire_dump_chunk_decode(&f, row_floats, ch);
}

struct dump_job {
	const struct cli *cli;	      /* borrowed */
	const struct emb_addr *addr;      /* this server */
	uint32_t part;		      /* index in the server list */
	uint32_t nparts;	      /* servers */
	struct progress *prog;	      /* shared */
	struct emb_snap_entry entry;  /* filled on success */
	struct emb_snap_result res;   /* filled on success */
	char path[EMB_SNAP_PATH_MAX]; /* final file */
	char errmsg[EMB_SNAP_PATH_MAX + EMB_WIRE_ERRMSG_MAX + 64]; /* why */
	int rc;	    /* 0 or the failure */
	bool began; /* DUMP_BEGIN answered (rows_total known) */
};

static void *dump_main(void *arg)
{
	struct dump_job *j = arg;
	const struct cli *cli = j->cli;
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_snap_writer *w = NULL;
	struct emb_wire_dump_info info;
	struct emb_wire_dump_chunk ch;
	struct emb_snap_meta m;
	struct emb_wire_frame f;
	struct chunk_call calls[CHUNKS_INFLIGHT] = {0};
	uint32_t posted = 0, k = 0;
	struct rconn r;
	uint32_t id = 0, want;
	int rc;

	rc = rconn_open(&r, cli, j->addr);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "cannot connect: %s",
			 emb_strerror(rc));
		j->rc = rc;
		return NULL;
	}
	rc = rconn_find_table(&r, cli->table, &id);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "table %s: %s",
			 cli->table, emb_strerror(rc));
		goto out;
	}
	rc = rconn_call(&r, EMB_OP_DUMP_BEGIN, id, 0, NULL, 0, &f);
	if (!rc)
		rc = emb_wire_dump_info_decode(&f, &info);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "DUMP_BEGIN: %s%s%s",
			 emb_strerror(rc), r.errmsg[0] ? ": " : "", r.errmsg);
		goto out;
	}
	__atomic_fetch_add(&j->prog->rows_total, info.rows, __ATOMIC_RELAXED);
	memset(&m, 0, sizeof(m));
	snprintf(m.name, sizeof(m.name), "%s", info.spec.name);
	m.dim = info.spec.dim;
	m.state_floats = info.state_floats;
	m.row_floats = info.row_floats;
	m.optim = info.spec.optim;
	m.init = info.spec.init;
	m.seed = info.spec.seed;
	m.step = info.step;
	m.part = j->part;
	m.nparts = j->nparts;
	wo.block_bytes = cli->block_bytes;
	wo.shuffle = cli->shuffle;
	rc = emb_snap_writer_create(j->path, &m, &wo, &w);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "cannot create %s: %s",
			 j->path, emb_strerror(rc));
		goto out;
	}
	want = CHUNK_BYTES / (uint32_t)emb_wire_dump_row_bytes(m.row_floats);
	if (want == 0)
		want = 1;
	for (k = 0; k < CHUNKS_INFLIGHT; k++) {
		calls[k].buf = malloc(r.resp_cap);
		if (!calls[k].buf) {
			rc = -ENOMEM;
			snprintf(j->errmsg, sizeof(j->errmsg), "out of memory");
			goto out;
		}
	}
	for (k = 0; k < CHUNKS_INFLIGHT; k++) {
		rc = chunk_post(&r, &calls[k], id, want);
		if (rc)
			goto chunk_err;
		posted++;
	}
	/* Chunks come back in order; the first empty one ends the table,
	 * and the calls still in flight come back empty too. */
	for (k = 0;; k = (k + 1) % CHUNKS_INFLIGHT) {
		rc = chunk_wait(&r, &calls[k], m.row_floats, &ch);
		posted--;
		if (rc)
			goto chunk_err;
		if (ch.n == 0)
			break;
		rc = emb_snap_writer_add(
		    w, ch.ids, ch.rows,
		    (const struct emb_row_meta *)(const void *)ch.meta, ch.n);
		if (rc) {
			snprintf(j->errmsg, sizeof(j->errmsg), "writing %s: %s",
				 j->path, emb_strerror(rc));
			goto out;
		}
		progress_add(j->prog, ch.n, (uint64_t)ch.n * 4 * m.row_floats);
		if (interrupted) {
			rc = -EINTR;
			snprintf(j->errmsg, sizeof(j->errmsg), "interrupted");
			goto out;
		}
		rc = chunk_post(&r, &calls[k], id, want);
		if (rc)
			goto chunk_err;
		posted++;
	}
	for (; posted; posted--) {
		k = (k + 1) % CHUNKS_INFLIGHT;
		rc = chunk_wait(&r, &calls[k], m.row_floats, &ch);
		if (rc)
			goto chunk_err;
	}
	(void)rconn_call(&r, EMB_OP_DUMP_END, id, 0, NULL, 0, &f);
	rc = emb_snap_writer_finish(w, &j->res);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "writing %s: %s",
			 j->path, emb_strerror(rc));
		goto out;
	}
	snprintf(j->entry.table, sizeof(j->entry.table), "%s", m.name);
	j->entry.part = j->part;
	j->entry.nparts = j->nparts;
	j->entry.rows = j->res.rows;
	j->entry.bytes = j->res.file_bytes;
	j->entry.checksum = j->res.checksum;
	goto out;
chunk_err:
	snprintf(j->errmsg, sizeof(j->errmsg), "DUMP_CHUNK: %s%s%s",
		 emb_strerror(rc), r.errmsg[0] ? ": " : "", r.errmsg);
out:
	emb_snap_writer_destroy(w);
	/* Destroying the conn completes calls still in flight. */
	rconn_close(&r);
	for (k = 0; k < CHUNKS_INFLIGHT; k++)
		free(calls[k].buf);
	j->rc = rc;
	return NULL;
}

/* The name of part i of n of a dump of table. */
static void part_name(char *buf, size_t cap, const char *table, int i, int n)
{
	snprintf(buf, cap, "%s.%05d-of-%05d.embs", table, i, n);
}

/*
 * True if dir holds a *.embs file that a dump of table onto n servers would
 * not overwrite: a restore would then find it unlisted and refuse.
 */
static bool stray_snapshot(const char *dir, const char *table, int n)
{
	struct dirent *de;
	bool stray = false;
	DIR *d = opendir(dir);

	if (!d)
		return false;
	while (!stray && (de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);
		bool ours = false;

		if (len < 5 || strcmp(de->d_name + len - 5, ".embs") != 0)
			continue;
		for (int i = 0; i < n && !ours; i++) {
			char name[300];

			part_name(name, sizeof(name), table, i, n);
			ours = strcmp(name, de->d_name) == 0;
		}
		stray = !ours;
	}
	closedir(d);
	return stray;
}

static int cmd_dump(struct cli *cli)
{
	struct emb_addr addrs[MAX_SERVERS];
	struct emb_snap_entry *entries = NULL;
	struct dump_job *jobs = NULL;
	pthread_t *th = NULL;
	struct progress prog;
	uint64_t raw = 0, file = 0, rows = 0;
	char mpath[EMB_SNAP_PATH_MAX];
	int n, rc = 0;
	double dt;

	if (!cli->servers || !cli->table || !cli->dir)
		die_usage("dump needs --servers, --table and --out");
	n = emb_addr_list_parse(cli->servers, addrs, MAX_SERVERS);
	if (n < 0)
		die_usage("bad --servers list (host:port,...)");
	if (mkdir(cli->dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "embstore dump: cannot create %s: %s\n",
			cli->dir, strerror(errno));
		return 1;
	}
	if (stray_snapshot(cli->dir, cli->table, n)) {
		fprintf(stderr,
			"embstore dump: %s holds snapshot files this dump "
			"would not replace; use an empty directory\n",
			cli->dir);
		return 1;
	}
	/* An older dump's manifest would describe files being replaced. */
	snprintf(mpath, sizeof(mpath), "%s/%s", cli->dir, EMB_SNAP_MANIFEST);
	unlink(mpath);
	jobs = calloc((size_t)n, sizeof(*jobs));
	entries = calloc((size_t)n, sizeof(*entries));
	th = calloc((size_t)n, sizeof(*th));
	if (!jobs || !entries || !th) {
		fprintf(stderr, "embstore dump: out of memory\n");
		rc = 1;
		goto out;
	}
	progress_init(&prog, "dump", cli->quiet);
	for (int i = 0; i < n; i++) {
		jobs[i].cli = cli;
		jobs[i].addr = &addrs[i];
		jobs[i].part = (uint32_t)i;
		jobs[i].nparts = (uint32_t)n;
		jobs[i].prog = &prog;
		part_name(jobs[i].entry.file, sizeof(jobs[i].entry.file),
			  cli->table, i, n);
		snprintf(jobs[i].path, sizeof(jobs[i].path), "%s/%s", cli->dir,
			 jobs[i].entry.file);
		if (pthread_create(&th[i], NULL, dump_main, &jobs[i]) != 0) {
			jobs[i].rc = -EAGAIN;
			snprintf(jobs[i].errmsg, sizeof(jobs[i].errmsg),
				 "cannot start a thread");
			th[i] = 0;
		}
	}
	for (int i = 0; i < n; i++) {
		while (th[i] && pthread_tryjoin_np(th[i], NULL) == EBUSY) {
			progress_show(&prog, false);
			usleep(50 * 1000);
		}
	}
	progress_end(&prog);
	for (int i = 0; i < n; i++) {
		if (jobs[i].rc) {
			fprintf(stderr, "embstore dump: server %s:%u: %s\n",
				addrs[i].host, addrs[i].port, jobs[i].errmsg);
			rc = 1;
		}
		entries[i] = jobs[i].entry;
		rows += jobs[i].res.rows;
		raw += jobs[i].res.raw_bytes;
		file += jobs[i].res.file_bytes;
	}
	if (!rc) {
		int mrc =
		    emb_snap_manifest_write(cli->dir, entries, (uint32_t)n);

		if (mrc) {
			fprintf(stderr,
				"embstore dump: cannot write the manifest: "
				"%s\n",
				emb_strerror(mrc));
			rc = 1;
		}
	}
	if (rc) {
		/* Finished parts of a failed dump are not a dump. */
		for (int i = 0; i < n; i++)
			if (jobs[i].rc == 0)
				unlink(jobs[i].path);
		fprintf(stderr, "embstore dump: failed; %s holds no dump\n",
			cli->dir);
		goto out;
	}
	dt = emb_clock_s() - prog.t0;
	printf("dump: table %s, %llu rows from %d server%s, %.1f MB of rows "
	       "-> %.1f MB in %d file%s (ratio %.2f), %.2f s, %.0f MB/s\n",
	       cli->table, (unsigned long long)rows, n, n == 1 ? "" : "s",
	       (double)raw / 1e6, (double)file / 1e6, n, n == 1 ? "" : "s",
	       file ? (double)raw / (double)file : 0.0, dt,
	       dt > 0 ? (double)raw / 1e6 / dt : 0.0);
out:
	free(th);
	free(entries);
	free(jobs);
	return rc;
}

/* ---- reading a dump directory ---- */

/* The files to read: a dump directory's manifest, or one file. */
struct fileset {
	struct emb_snap_entry *e;    /* entries (one for a single file) */
	uint32_t n;		     /* entries */
	char dir[EMB_SNAP_PATH_MAX]; /* directory the names are in */
};

static void fileset_path(const struct fileset *fs, uint32_t i, char *buf,
			 size_t cap)
{
	snprintf(buf, cap, "%s/%s", fs->dir, fs->e[i].file);
}

static bool file_exists(const char *dir, const char *name)
{
	char p[2 * EMB_SNAP_PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static int fileset_open(const char *what, const char *path, struct fileset *fs)
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

static void fileset_close(struct fileset *fs)
{
	free(fs->e);
	fs->e = NULL;
}

static const char *snap_err(int rc)
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
static int fileset_verify(const char *what, const struct fileset *fs,
			  struct emb_snap_meta *metas)
{
	char p[EMB_SNAP_PATH_MAX + 300];
	uint64_t sum;
	int rc;

	for (uint32_t i = 0; i < fs->n; i++) {
		fileset_path(fs, i, p, sizeof(p));
		rc = emb_snap_verify(p, EMB_SNAP_READ_VERIFY_ONLY, &metas[i],
				     &sum);
		if (!rc && fs->e[i].bytes && sum != fs->e[i].checksum)
			rc = EMB_EMANIFEST;
		if (rc) {
			fprintf(stderr, "embstore %s: %s: %s\n", what, p,
				rc == EMB_EMANIFEST
				    ? "checksum differs from the manifest"
				    : snap_err(rc));
			return rc;
		}
	}
	return 0;
}

/* ---- restore ---- */

/*
 * Restore overlaps reading with sending: this thread decodes blocks into
 * batch buffers, ASSIGN_THREADS threads send them (the client library is
 * thread-safe and routes each id by slot). A dump holds an id once, so the
 * order of the assigns does not matter.
 */
#define ASSIGN_THREADS 2
#define ASSIGN_BUFS    4

struct abatch {
	uint64_t *ids; /* cap ids */
	float *rows;   /* cap * row_floats floats */
	uint32_t n;    /* rows held */
};

struct apool {
	struct emb_client_table *t;	 /* borrowed */
	struct progress *prog;		 /* shared */
	uint32_t rf;			 /* row floats */
	uint32_t cap;			 /* rows per batch */
	struct abatch bufs[ASSIGN_BUFS]; /* batches */
	uint32_t freel[ASSIGN_BUFS];	 /* free batch indexes */
	uint32_t nfree;			 /* entries in freel */
	uint32_t fullq[ASSIGN_BUFS];	 /* filled batches, FIFO */
	uint32_t qhead;			 /* first in fullq */
	uint32_t qlen;			 /* entries in fullq */
	bool closing;			 /* no more batches */
	int err;			 /* first assign error */
	pthread_mutex_t lock;		 /* guards the fields above */
	pthread_cond_t cond;		 /* any change */
	pthread_t th[ASSIGN_THREADS];	 /* senders */
	uint32_t nth;			 /* started */
};

static void *apool_main(void *arg)
{
	struct apool *ap = arg;

	pthread_mutex_lock(&ap->lock);
	for (;;) {
		struct abatch *b;
		uint32_t k;
		int rc;

		while (!ap->qlen && !ap->closing)
			pthread_cond_wait(&ap->cond, &ap->lock);
		if (!ap->qlen)
			break;
		k = ap->fullq[ap->qhead];
		ap->qhead = (ap->qhead + 1) % ASSIGN_BUFS;
		ap->qlen--;
		pthread_mutex_unlock(&ap->lock);
		b = &ap->bufs[k];
		rc =
		    emb_client_table_assign(ap->t, b->ids, b->n, b->rows, true);
		if (!rc)
			progress_add(ap->prog, b->n, 4ull * b->n * ap->rf);
		pthread_mutex_lock(&ap->lock);
		if (rc && !ap->err)
			ap->err = rc;
		ap->freel[ap->nfree++] = k;
		pthread_cond_broadcast(&ap->cond);
	}
	pthread_mutex_unlock(&ap->lock);
	return NULL;
}

static int apool_start(struct apool *ap, struct emb_client_table *t,
		       struct progress *prog, uint32_t rf)
{
	memset(ap, 0, sizeof(*ap));
	ap->t = t;
	ap->prog = prog;
	ap->rf = rf;
	ap->cap = ASSIGN_BYTES / (8 + 4 * rf);
	if (ap->cap == 0)
		ap->cap = 1;
	pthread_mutex_init(&ap->lock, NULL);
	pthread_cond_init(&ap->cond, NULL);
	for (uint32_t k = 0; k < ASSIGN_BUFS; k++) {
		ap->bufs[k].ids = malloc((size_t)ap->cap * sizeof(uint64_t));
		ap->bufs[k].rows = malloc((size_t)ap->cap * rf * sizeof(float));
		if (!ap->bufs[k].ids || !ap->bufs[k].rows)
			return -ENOMEM;
		ap->freel[ap->nfree++] = k;
	}
	for (; ap->nth < ASSIGN_THREADS; ap->nth++)
		if (pthread_create(&ap->th[ap->nth], NULL, apool_main, ap))
			return ap->nth ? 0 : -EAGAIN;
	return 0;
}

/* A free batch to fill, or NULL once an assign failed. */
static struct abatch *apool_get(struct apool *ap, uint32_t *k)
{
	struct abatch *b = NULL;

	pthread_mutex_lock(&ap->lock);
	while (!ap->nfree && !ap->err)
		pthread_cond_wait(&ap->cond, &ap->lock);
	if (!ap->err) {
		*k = ap->freel[--ap->nfree];
		b = &ap->bufs[*k];
		b->n = 0;
	}
	pthread_mutex_unlock(&ap->lock);
	return b;
}

static void apool_put(struct apool *ap, uint32_t k)
{
	pthread_mutex_lock(&ap->lock);
	ap->fullq[(ap->qhead + ap->qlen) % ASSIGN_BUFS] = k;
	ap->qlen++;
	pthread_cond_broadcast(&ap->cond);
	pthread_mutex_unlock(&ap->lock);
}

/* Sends what is queued, stops the threads, frees; the first error. */
static int apool_finish(struct apool *ap)
{
	int rc;

	pthread_mutex_lock(&ap->lock);
	ap->closing = true;
	pthread_cond_broadcast(&ap->cond);
	pthread_mutex_unlock(&ap->lock);
	for (uint32_t i = 0; i < ap->nth; i++)
		pthread_join(ap->th[i], NULL);
	rc = ap->err;
	for (uint32_t k = 0; k < ASSIGN_BUFS; k++) {
		free(ap->bufs[k].ids);
		free(ap->bufs[k].rows);
	}
	pthread_cond_destroy(&ap->cond);
	pthread_mutex_destroy(&ap->lock);
	return rc;
}

static int cmd_restore(struct cli *cli)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	struct emb_client_table *t = NULL;
	struct emb_snap_meta *metas = NULL;
	struct emb_table_spec spec;
	struct fileset fs;
	struct progress prog;
	char p[EMB_SNAP_PATH_MAX + 300];
	const char *name;
	uint64_t raw = 0;
	uint32_t nsel = 0;
	double dt;
	int rc;

	if (!cli->servers || !cli->dir)
		die_usage("restore needs --in and --servers");
	rc = fileset_open("restore", cli->dir, &fs);
	if (rc)
		return 1;
	metas = calloc(fs.n ? fs.n : 1, sizeof(*metas));
	if (!metas)
		goto fail;
	rc = fileset_verify("restore", &fs, metas);
	if (rc)
		goto fail;
	for (uint32_t i = 0; i < fs.n; i++) {
		/* One table per restore: the first one, unless named. */
		if (strcmp(metas[i].name, metas[0].name) != 0) {
			fprintf(stderr,
				"embstore restore: %s holds more than one "
				"table; restore them one directory at a "
				"time\n",
				cli->dir);
			goto fail;
		}
		if (metas[i].dim != metas[0].dim ||
		    metas[i].optim.kind != metas[0].optim.kind) {
			fprintf(stderr,
				"embstore restore: files of %s disagree on "
				"dim or optimizer\n",
				cli->dir);
			goto fail;
		}
		raw += metas[i].raw_bytes;
		nsel++;
	}
	if (nsel == 0) {
		fprintf(stderr, "embstore restore: %s holds no files\n",
			cli->dir);
		goto fail;
	}
	name = cli->table ? cli->table : metas[0].name;

	co.servers = cli->servers;
	co.transport = cli->transport;
	co.auth_token = cli->token_len ? cli->token : NULL;
	co.auth_token_len = cli->token_len;
	co.name = "embstore-restore";
	rc = emb_client_create(&co, &c);
	if (rc) {
		fprintf(stderr, "embstore restore: cannot connect to %s: %s\n",
			cli->servers, emb_strerror(rc));
		goto fail;
	}
	/* Refuse before touching: an existing table must take the rows as
	 * they are (same dim, same optimizer state layout). */
	rc = emb_client_table_open(c, name, &t);
	if (rc == 0) {
		const struct emb_table_spec *have = emb_client_table_spec(t);

		if (have->dim != metas[0].dim ||
		    have->optim.kind != metas[0].optim.kind) {
			fprintf(stderr,
				"embstore restore: table %s exists with dim "
				"%u and optimizer %s; the snapshot has dim %u "
				"and %s; nothing changed\n",
				name, have->dim,
				emb_optim_name(have->optim.kind), metas[0].dim,
				emb_optim_name(metas[0].optim.kind));
			goto fail;
		}
	} else {
		spec.name = name;
		spec.dim = metas[0].dim;
		spec.optim = metas[0].optim;
		spec.init = metas[0].init;
		spec.seed = metas[0].seed;
		rc = emb_client_table_create(c, &spec, &t);
		if (rc) {
			fprintf(stderr,
				"embstore restore: cannot create table %s: "
				"%s\n",
				name, emb_strerror(rc));
			goto fail;
		}
	}

	progress_init(&prog, "restore", cli->quiet);
	for (uint32_t i = 0; i < fs.n; i++)
		prog.rows_total += metas[i].rows;
	for (uint32_t i = 0; i < fs.n; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		struct abatch *ab = NULL;
		struct apool ap;
		uint32_t rf = metas[i].row_floats, k = 0;
		int arc;

		fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (!rc)
			rc = apool_start(&ap, t, &prog, rf);
		if (rc) {
			fprintf(stderr, "embstore restore: %s: %s\n", p,
				snap_err(rc));
			goto fail;
		}
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			if (interrupted) {
				rc = -EINTR;
				break;
			}
			for (uint32_t off = 0; off < b.n;) {
				uint32_t m;

				/* NULL: an assign failed; stop reading. */
				if (!ab && !(ab = apool_get(&ap, &k))) {
					rc = -ECANCELED;
					break;
				}
				m = b.n - off < ap.cap - ab->n ? b.n - off
							       : ap.cap - ab->n;
				memcpy(ab->ids + ab->n, b.ids + off,
				       m * sizeof(uint64_t));
				memcpy(ab->rows + (size_t)ab->n * rf,
				       b.rows + (size_t)off * rf,
				       (size_t)m * rf * sizeof(float));
				ab->n += m;
				off += m;
				if (ab->n == ap.cap) {
					apool_put(&ap, k);
					ab = NULL;
				}
			}
			if (rc < 0)
				break;
			progress_show(&prog, false);
		}
		if (ab && ab->n)
			apool_put(&ap, k);
		arc = apool_finish(&ap);
		if (!rc || rc == -ECANCELED)
			rc = arc;
		emb_snap_reader_close(r);
		if (rc) {
			char msg[256] = "";

			emb_client_last_error(c, msg, sizeof(msg));
			fprintf(stderr,
				"embstore restore: %s: %s%s%s (table %s now "
				"holds part of the snapshot)\n",
				p, snap_err(rc), msg[0] ? ": " : "", msg, name);
			goto fail;
		}
	}
	progress_end(&prog);
	dt = emb_clock_s() - prog.t0;
	printf("restore: table %s, %llu rows from %u file%s onto %u "
	       "server%s, %.1f MB of rows, %.2f s, %.0f MB/s\n",
	       name, (unsigned long long)prog.rows, fs.n, fs.n == 1 ? "" : "s",
	       emb_client_nservers(c), emb_client_nservers(c) == 1 ? "" : "s",
	       (double)raw / 1e6, dt, dt > 0 ? (double)raw / 1e6 / dt : 0.0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(metas);
	fileset_close(&fs);
	return 0;
fail:
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(metas);
	fileset_close(&fs);
	return 1;
}

/* ---- inspect and export ---- */

#define NORM_BUCKETS 16

static void print_meta(const char *file, const struct emb_snap_meta *m,
		       uint64_t checksum)
{
	const struct emb_optim_cfg *o = &m->optim;

	printf("file %s\n", file);
	printf("  table %s  dim %u  state floats %u  part %u of %u\n", m->name,
	       m->dim, m->state_floats, m->part, m->nparts);
	printf("  optimizer %s lr=%g wd=%g acc=%g beta1=%g beta2=%g eps=%g "
	       "beta=%g l1=%g l2=%g\n",
	       emb_optim_name(o->kind), (double)o->lr, (double)o->weight_decay,
	       (double)o->initial_accumulator, (double)o->beta1,
	       (double)o->beta2, (double)o->eps, (double)o->ftrl_beta,
	       (double)o->l1, (double)o->l2);
	printf("  initializer %s a=%g b=%g  seed %llu  table step %llu\n",
	       emb_init_name(m->init.kind), (double)m->init.a,
	       (double)m->init.b, (unsigned long long)m->seed,
	       (unsigned long long)m->step);
	printf(
	    "  rows %llu  blocks %llu  raw %llu B  file %llu B  ratio "
	    "%.2f  format v%u%s  checksum %016llx OK\n",
	    (unsigned long long)m->rows, (unsigned long long)m->blocks,
	    (unsigned long long)m->raw_bytes, (unsigned long long)m->file_bytes,
	    m->file_bytes ? (double)m->raw_bytes / (double)m->file_bytes : 0.0,
	    EMB_SNAP_VERSION,
	    (m->flags & EMB_SNAP_F_SHUFFLE) ? " shuffled" : "",
	    (unsigned long long)checksum);
}

static int cmd_inspect(struct cli *cli)
{
	struct fileset fs;
	char p[EMB_SNAP_PATH_MAX + 300];
	uint64_t hist[NORM_BUCKETS + 2], total = 0;
	uint32_t shown = 0;
	int rc, bad = 0;

	if (!cli->dir)
		die_usage("inspect needs a directory or file");
	if (fileset_open("inspect", cli->dir, &fs))
		return 1;
	memset(hist, 0, sizeof(hist));
	for (uint32_t i = 0; i < fs.n; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		const struct emb_snap_meta *m;

		fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc) {
			fprintf(stderr, "embstore inspect: %s: %s\n", p,
				snap_err(rc));
			bad++;
			continue;
		}
		m = emb_snap_reader_meta(r);
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			for (uint32_t k = 0; k < b.n; k++) {
				const float *w =
				    b.rows + (size_t)k * m->row_floats;
				double sq = 0;
				int bucket;

				for (uint32_t d = 0; d < m->dim; d++)
					sq += (double)w[d] * w[d];
				/* Buckets are powers of two of the norm,
				 * 2^-10 .. 2^5, with under/overflow. */
				bucket = sq > 0
					     ? (int)floor(log2(sqrt(sq))) + 11
					     : 0;
				if (bucket < 0)
					bucket = 0;
				if (bucket > NORM_BUCKETS + 1)
					bucket = NORM_BUCKETS + 1;
				hist[bucket]++;
				total++;
				if (shown < cli->rows) {
					shown++;
					printf("row id %llu slot %u step %u "
					       "count %u:",
					       (unsigned long long)b.ids[k],
					       emb_id_slot(b.ids[k]),
					       b.last_step[k], b.count[k]);
					for (uint32_t d = 0;
					     d < m->row_floats && d < 16; d++)
						printf(" %.6g", (double)w[d]);
					printf("%s\n", m->row_floats > 16
							   ? " ..."
							   : "");
				}
			}
		}
		if (rc == 0) {
			if (fs.e[i].bytes &&
			    emb_snap_reader_checksum(r) != fs.e[i].checksum) {
				fprintf(stderr,
					"embstore inspect: %s: checksum "
					"differs from the manifest\n",
					p);
				bad++;
			} else {
				print_meta(fs.e[i].file, m,
					   emb_snap_reader_checksum(r));
			}
		} else {
			fprintf(stderr, "embstore inspect: %s: %s\n", p,
				snap_err(rc));
			bad++;
		}
		emb_snap_reader_close(r);
	}
	printf("rows %llu in %u file%s; weight L2 norm histogram:\n",
	       (unsigned long long)total, fs.n, fs.n == 1 ? "" : "s");
	for (int k = 0; k < NORM_BUCKETS + 2; k++) {
		if (!hist[k])
			continue;
		if (k == 0)
			printf("  [0, 2^-10)     %llu\n",
			       (unsigned long long)hist[k]);
		else if (k == NORM_BUCKETS + 1)
			printf("  [2^%d, inf)     %llu\n", k - 11,
			       (unsigned long long)hist[k]);
		else
			printf("  [2^%d, 2^%d)  %llu\n", k - 11, k - 10,
			       (unsigned long long)hist[k]);
	}
	fileset_close(&fs);
	if (bad) {
		printf("%d file%s FAILED verification\n", bad,
		       bad == 1 ? "" : "s");
		return 1;
	}
	printf("all checksums OK\n");
	return 0;
}

static int cmd_export(struct cli *cli)
{
	struct fileset fs;
	struct emb_snap_meta *metas;
	char p[EMB_SNAP_PATH_MAX + 300];
	FILE *out = stdout;
	int rc = 0;

	if (!cli->dir)
		die_usage("export needs --in");
	if (cli->format && strcmp(cli->format, "tsv") != 0)
		die_usage("export knows --format tsv only");
	if (fileset_open("export", cli->dir, &fs))
		return 1;
	metas = calloc(fs.n ? fs.n : 1, sizeof(*metas));
	/* Verify first, so a damaged dump exports nothing. */
	if (!metas || fileset_verify("export", &fs, metas)) {
		free(metas);
		fileset_close(&fs);
		return 1;
	}
	if (cli->out) {
		out = fopen(cli->out, "w");
		if (!out) {
			fprintf(stderr, "embstore export: %s: %s\n", cli->out,
				strerror(errno));
			free(metas);
			fileset_close(&fs);
			return 1;
		}
	}
	for (uint32_t i = 0; i < fs.n && !rc; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;

		fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc)
			break;
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			for (uint32_t k = 0; k < b.n; k++) {
				const float *w =
				    b.rows + (size_t)k * metas[i].row_floats;

				fprintf(out, "%llu\t",
					(unsigned long long)b.ids[k]);
				/* %.9g prints a float that reads back
				 * bit-exact. */
				for (uint32_t d = 0; d < metas[i].dim; d++)
					fprintf(out, d ? " %.9g" : "%.9g",
						(double)w[d]);
				fputc('\n', out);
			}
		}
		emb_snap_reader_close(r);
	}
	if (rc)
		fprintf(stderr, "embstore export: %s: %s\n", p, snap_err(rc));
	if (out != stdout && fclose(out) != 0 && !rc) {
		fprintf(stderr, "embstore export: %s: %s\n", cli->out,
			strerror(errno));
		rc = -EIO;
	}
	free(metas);
	fileset_close(&fs);
	return rc ? 1 : 0;
}

/* ---- main ---- */

static void usage(FILE *f)
{
	fprintf(
	    f, "usage: embstore COMMAND [options]\n"
	       "  dump    --servers LIST --table T --out DIR   snapshot a "
	       "live table\n"
	       "  restore --in DIR --servers LIST [--table NAME]\n"
	       "                                              load a snapshot "
	       "into a cluster\n"
	       "  inspect DIR|FILE [--rows N]                 verify and "
	       "describe a snapshot\n"
	       "  export  --in DIR|FILE --format tsv [--out F] rows as "
	       "id<TAB>v0 v1 ...\n"
	       "  stat    --servers LIST [--watch N]          rows, memory "
	       "and op rates per server and table\n"
	       "options: --transport tcp|rdma (EMB_TRANSPORT), "
	       "--auth-token-file F (EMB_AUTH_TOKEN_FILE),\n"
	       "  --block-size BYTES (dump, default 1M), --shuffle (dump: "
	       "byte planes, ~8%% smaller, slower),\n  --quiet, --log-level L\n"
	       "  launch  --server_num N --worker_num N -- CMD ...  a local "
	       "cluster\n"
	       "LIST is host:port[,host:port...] (EMB_SERVERS); --sched "
	       "HOST:PORT finds it through the scheduler\n");
}

struct command {
	const char *name;
	int (*fn)(struct cli *cli);
};

static const struct command commands[] = {
    {"dump", cmd_dump},
    {"restore", cmd_restore},
    {"inspect", cmd_inspect},
    {"export", cmd_export},
    /* launch and stat: see main(). */
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"servers", required_argument, NULL, 's'},
	    {"sched", required_argument, NULL, 'C'},
	    {"table", required_argument, NULL, 't'},
	    {"out", required_argument, NULL, 'o'},
	    {"in", required_argument, NULL, 'i'},
	    {"rows", required_argument, NULL, 'r'},
	    {"format", required_argument, NULL, 'f'},
	    {"transport", required_argument, NULL, 'T'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"block-size", required_argument, NULL, 'b'},
	    {"no-shuffle", no_argument, NULL, 'S'},
	    {"shuffle", no_argument, NULL, 'P'},
	    {"quiet", no_argument, NULL, 'q'},
	    {"log-level", required_argument, NULL, 'L'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct cli cli = {.block_bytes = 1u << 20};
	const struct command *cmd;
	const char *token_file = getenv("EMB_AUTH_TOKEN_FILE");
	const char *level = "warn";
	const char *sched = NULL;
	static char sched_servers[65536];
	enum emb_log_level lvl;
	char *end;
	int c;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "launch") == 0) /* tools/launch.c */
		return emb_launch_main(argc - 1, argv + 1);
	if (strcmp(argv[1], "stat") == 0) /* tools/stat.c */
		return emb_stat_main(argc - 1, argv + 1);
	for (cmd = commands; cmd->name; cmd++)
		if (strcmp(cmd->name, argv[1]) == 0)
			break;
	if (!cmd->name) {
		fprintf(stderr, "embstore: unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	cli.servers = getenv("EMB_SERVERS");
	cli.transport =
	    getenv("EMB_TRANSPORT") ? getenv("EMB_TRANSPORT") : "tcp";
	argc--;
	argv++;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			cli.servers = optarg;
			break;
		case 'C':
			sched = optarg;
			break;
		case 't':
			cli.table = optarg;
			break;
		case 'o':
			if (strcmp(cmd->name, "export") == 0)
				cli.out = optarg;
			else
				cli.dir = optarg;
			break;
		case 'i':
			cli.dir = optarg;
			break;
		case 'r':
			cli.rows = (uint32_t)strtoul(optarg, &end, 10);
			if (*end)
				die_usage("bad --rows");
			break;
		case 'f':
			cli.format = optarg;
			break;
		case 'T':
			cli.transport = optarg;
			break;
		case 'a':
			token_file = optarg;
			break;
		case 'b':
			cli.block_bytes = (uint32_t)strtoul(optarg, &end, 10);
			if (*end == 'K' || *end == 'k')
				cli.block_bytes <<= 10, end++;
			else if (*end == 'M' || *end == 'm')
				cli.block_bytes <<= 20, end++;
			if (*end || cli.block_bytes < 4096 ||
			    cli.block_bytes > EMB_SNAP_BLOCK_MAX)
				die_usage("bad --block-size (4K..64M)");
			break;
		case 'S':
			cli.shuffle = false;
			break;
		case 'P':
			cli.shuffle = true;
			break;
		case 'q':
			cli.quiet = true;
			break;
		case 'L':
			level = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc && !cli.dir &&
	    (strcmp(cmd->name, "inspect") == 0 ||
	     strcmp(cmd->name, "export") == 0))
		cli.dir = argv[optind++];
	if (optind < argc) {
		fprintf(stderr, "embstore: unexpected argument '%s'\n",
			argv[optind]);
		return 2;
	}
	if (emb_log_parse_level(level, &lvl))
		die_usage("bad --log-level");
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	/* A file size limit must fail write() (EFBIG), not kill us before
	 * the temporary files are removed. */
	signal(SIGXFSZ, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	emb_log_set_level(lvl);
	if (sched) {
		/* An observer: it asks for the map without joining the job. */
		c = emb_cluster_servers(sched, sched_servers,
					sizeof(sched_servers));
		if (c) {
			fprintf(stderr, "embstore: scheduler %s: %s\n", sched,
				emb_strerror(c));
			return 1;
		}
		cli.servers = sched_servers;
	}
	if (token_file && *token_file && emb_token_read_file(token_file, cli.token, &cli.token_len)) {
		fprintf(stderr, "embstore: cannot use token file %s\n",
			token_file);
		return 2;
	}
	return cmd->fn(&cli);
}
