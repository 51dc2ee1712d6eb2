/*
 * tools/embstore/dump.c - `embstore dump`: streams each server's rows of
 * one table (DUMP_* ops, src/proto/wire_dump.h) into one snapshot file per
 * server (store/snapshot.h), one thread per server, and writes the
 * MANIFEST last: a dump without one is not a dump.
 *
 * Through the scheduler (--sched) it reads the job's map first: servers
 * the job removed are not asked, each row is kept from its slot's primary
 * only (a replicated job's servers hold each row once per copy), and a
 * map that changed before the dump ended (a death, a move) fails it.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_dump.h"
#include "proto/wire_msg.h"
#include "worker/embstore.h"

static void usage(FILE *f)
{
	fputs("usage: embstore dump --servers LIST --table T --out DIR "
	      "[options]\n"
	      "Snapshots a live table: one file per server and a MANIFEST, "
	      "while the servers\nkeep serving.\n"
	      "  --table T               the table\n"
	      "  --out DIR               where the files go (made if "
	      "missing; empty, or an\n"
	      "                          earlier dump of the table)\n"
	      "  --block-size BYTES      rows per compressed block (4K..64M, "
	      "default 1M)\n"
	      "  --shuffle               byte planes: about 8% smaller, "
	      "slower\n"
	      "  --consistent            each server's rows as of one "
	      "instant (copy-on-write\n"
	      "                          while pushes go on); the step goes "
	      "in the MANIFEST\n" EMB_CLI_HELP_CONN EMB_CLI_HELP_BASE,
	      f);
}

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

static int chunk_post(struct emb_cli_conn *r, struct chunk_call *cc,
		      uint32_t id, uint32_t want)
{
	struct emb_frame_hdr hdr = {
	    .opcode = EMB_OP_DUMP_CHUNK, .table_id = id, .count = want};

	cc->done = false;
	return emb_conn_call(r->c, &hdr, NULL, 0, cc->buf, r->resp_cap,
			     chunk_done, cc);
}

/* Waits for cc and decodes it: 0 and *ch, or an error (errmsg set). */
static int chunk_wait(struct emb_cli_conn *r, struct chunk_call *cc,
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
	const struct cli *cli;	       /* borrowed */
	const struct emb_addr *addr;   /* this server */
	uint32_t part;		       /* index in the server list */
	uint32_t nparts;	       /* servers */
	struct emb_cli_progress *prog; /* shared */
	struct emb_snap_entry entry;   /* filled on success */
	struct emb_snap_result res;    /* filled on success */
	char path[EMB_SNAP_PATH_MAX];  /* final file */
	char errmsg[EMB_SNAP_PATH_MAX + EMB_WIRE_ERRMSG_MAX + 64]; /* why */
	int rc;	    /* 0 or the failure */
	bool began; /* DUMP_BEGIN answered (rows_total known) */
	uint32_t pause_us; /* consistent: server held writers back, us */
	/* Through the scheduler: each slot's primary, as an index of the
	 * job's servers (removed ones included), and this server's; NULL
	 * keeps every row. */
	const uint32_t *primary;
	uint32_t rank;
};

/*
 * Keeps the rows of chunk ch whose slot's primary is this server: a
 * replicated job's other holders hold copies of the same rows. Compacts
 * them in place: ch's arrays point into the response buffer this side
 * allocated (chunk_call.buf), which is writable.
 */
static void keep_primary(struct emb_wire_dump_chunk *ch,
			 const uint32_t *primary, uint32_t rank)
{
	uint64_t *ids = (uint64_t *)(uintptr_t)ch->ids;
	uint32_t *meta = (uint32_t *)(uintptr_t)ch->meta;
	float *rows = (float *)(uintptr_t)ch->rows;
	size_t rb = (size_t)ch->row_floats * sizeof(float);
	uint32_t k = 0;

	for (uint32_t i = 0; i < ch->n; i++) {
		if (primary[emb_id_slot(ids[i])] != rank)
			continue;
		if (k != i) {
			ids[k] = ids[i];
			meta[2 * k] = meta[2 * i];
			meta[2 * k + 1] = meta[2 * i + 1];
			memmove(rows + (size_t)k * ch->row_floats,
				rows + (size_t)i * ch->row_floats, rb);
		}
		k++;
	}
	ch->n = k;
}

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
	struct emb_cli_conn r;
	uint32_t id = 0, want;
	int rc;

	rc = emb_cli_conn_open(&r, cli, j->addr);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "cannot connect: %s",
			 emb_strerror(rc));
		j->rc = rc;
		return NULL;
	}
	rc = emb_cli_conn_find_table(&r, cli->table, &id);
	if (rc) {
		snprintf(j->errmsg, sizeof(j->errmsg), "table %s: %s",
			 cli->table, emb_strerror(rc));
		goto out;
	}
	rc = emb_cli_conn_call_flags(&r, EMB_OP_DUMP_BEGIN,
				     cli->consistent ? EMB_F_CONSISTENT : 0,
				     id, 0, &f);
	if (!rc)
		rc = emb_wire_dump_info_decode(&f, &info);
	if (!rc && cli->consistent &&
	    !(info.flags & EMB_WIRE_DUMP_CONSISTENT))
		rc = EMB_EBADFRAME;
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
	m.row_format = info.spec.row_format;
	m.rounding = info.spec.rounding;
	m.optim = info.spec.optim;
	m.init = info.spec.init;
	m.seed = info.spec.seed;
	m.step = info.step;
	j->entry.consistent = cli->consistent;
	j->entry.step = info.step;
	j->pause_us = info.pause_us;
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
	want = EMB_CLI_CHUNK_BYTES /
	       (uint32_t)emb_wire_dump_row_bytes(m.row_floats);
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
		emb_cli_progress_add(j->prog, ch.n,
				     (uint64_t)ch.n * 4 * m.row_floats);
		if (j->primary)
			keep_primary(&ch, j->primary, j->rank);
		rc = emb_snap_writer_add(
		    w, ch.ids, ch.rows,
		    (const struct emb_row_meta *)(const void *)ch.meta, ch.n);
		if (rc) {
			snprintf(j->errmsg, sizeof(j->errmsg), "writing %s: %s",
				 j->path, emb_strerror(rc));
			goto out;
		}
		if (emb_cli_interrupted) {
			rc = -EINTR;
			snprintf(j->errmsg, sizeof(j->errmsg),
				 "emb_cli_interrupted");
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
	(void)emb_cli_conn_call(&r, EMB_OP_DUMP_END, id, 0, NULL, 0, &f);
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
	emb_cli_conn_close(&r);
	for (k = 0; k < CHUNKS_INFLIGHT; k++)
		free(calls[k].buf);
	j->rc = rc;
	return NULL;
}

/* mkdir -p: dir and its missing parents. 0, or -1 with errno set. */
static int mkdir_p(const char *dir)
{
	char p[EMB_SNAP_PATH_MAX];

	if ((size_t)snprintf(p, sizeof(p), "%s", dir) >= sizeof(p)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		if (mkdir(p, 0755) != 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
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

/* What a dump through the scheduler reads of the job's map. */
struct job_map {
	uint64_t epoch;			     /* the map's */
	uint32_t primary[EMB_NSLOTS];	     /* server index per slot */
	uint32_t rank[EMB_CLI_MAX_SERVERS];  /* server index per part */
	bool removed[EMB_CLI_MAX_SERVERS];   /* by server index */
	char servers[65536];		     /* every server, host:port,... */
};

static int sched_client(const struct cli *cli, struct emb_client **c)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;

	co.transport = cli->transport;
	co.auth_token = cli->token_len ? cli->token : NULL;
	co.auth_token_len = cli->token_len;
	co.name = "embstore-dump";
	return emb_client_from_sched(&co, cli->sched, c);
}

/*
 * The job's map from the scheduler: its epoch, each slot's primary, the
 * servers and which were removed. 0; 1 after saying why (a slot with no
 * live copy: the dump would miss its rows).
 */
static int read_map(const struct cli *cli, struct job_map *jm)
{
	struct emb_client_map m = EMB_SIZED(struct emb_client_map);
	struct emb_client *c = NULL;
	int rc = sched_client(cli, &c);

	if (!rc)
		rc = emb_client_map(c, &m);
	if (!rc)
		rc = emb_client_servers(c, jm->servers, sizeof(jm->servers));
	if (rc) {
		fprintf(stderr,
			"embstore dump: the job's map and live servers "
			"(scheduler %s): %s\n",
			cli->sched, emb_strerror(rc));
		emb_client_destroy(c);
		return 1;
	}
	jm->epoch = m.epoch;
	for (uint32_t s = 0; s < m.nservers && s < EMB_CLI_MAX_SERVERS; s++)
		jm->removed[s] = emb_client_server_removed(c, s);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		uint32_t h[1];

		if (emb_client_slot_holders(c, sl, h, 1) < 1) {
			fprintf(stderr,
				"embstore dump: %u slots have no live copy "
				"(map epoch %llu): a dump would miss their "
				"rows\n",
				m.lost_slots, (unsigned long long)m.epoch);
			emb_client_destroy(c);
			return 1;
		}
		jm->primary[sl] = h[0];
	}
	emb_client_destroy(c);
	return 0;
}

static int run(struct cli *cli)
{
	struct emb_addr addrs[EMB_CLI_MAX_SERVERS];
	struct job_map *jm = NULL;
	struct emb_snap_entry *entries = NULL;
	struct dump_job *jobs = NULL;
	pthread_t *th = NULL;
	struct emb_cli_progress prog;
	uint64_t raw = 0, file = 0, rows = 0;
	char mpath[EMB_SNAP_PATH_MAX];
	int n, rc = 0;
	double dt;

	if (!cli->servers || !cli->table || !cli->dir)
		return emb_cli_usage_error(
		    cli, usage, "dump needs --servers, --table and --out");
	if (cli->sched) {
		jm = calloc(1, sizeof(*jm));
		if (!jm) {
			fprintf(stderr, "embstore dump: out of memory\n");
			return 1;
		}
		if (read_map(cli, jm)) {
			free(jm);
			return 1;
		}
		/* The live servers only, in the map's order. */
		n = emb_addr_list_parse(jm->servers, addrs,
					EMB_CLI_MAX_SERVERS);
		if (n > 0) {
			int live = 0;

			for (int i = 0; i < n; i++)
				if (!jm->removed[i]) {
					addrs[live] = addrs[i];
					jm->rank[live++] = (uint32_t)i;
				}
			n = live;
		}
	} else {
		n = emb_addr_list_parse(cli->servers, addrs,
					EMB_CLI_MAX_SERVERS);
	}
	if (n < 0)
		return emb_cli_usage_error(
		    cli, usage, "bad --servers list (host:port,...)");
	if (mkdir_p(cli->dir)) {
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
	emb_cli_progress_init(&prog, "dump", cli->quiet);
	for (int i = 0; i < n; i++) {
		jobs[i].cli = cli;
		jobs[i].addr = &addrs[i];
		jobs[i].part = (uint32_t)i;
		jobs[i].nparts = (uint32_t)n;
		jobs[i].prog = &prog;
		jobs[i].primary = jm ? jm->primary : NULL;
		jobs[i].rank = jm ? jm->rank[i] : 0;
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
			emb_cli_progress_show(&prog, false);
			usleep(50 * 1000);
		}
	}
	emb_cli_progress_end(&prog);
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
	/* Every row was kept from the primary of its slot by the map read
	 * first: a map changed since (a death, a move) may have moved some
	 * rows' primaries to servers that dropped them already. */
	if (!rc && jm) {
		uint64_t was = jm->epoch;

		if (read_map(cli, jm))
			rc = 1;
		else if (jm->epoch != was) {
			fprintf(stderr,
				"embstore dump: the job's map changed during "
				"the dump (epoch %llu, now %llu: a server died "
				"or slots moved); dump again\n",
				(unsigned long long)was,
				(unsigned long long)jm->epoch);
			rc = 1;
		}
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
	for (int i = 0; cli->consistent && i < n; i++)
		printf("dump: server %s:%u: consistent at step %llu (writers "
		       "held back %u us)\n",
		       addrs[i].host, addrs[i].port,
		       (unsigned long long)jobs[i].entry.step,
		       jobs[i].pause_us);
out:
	free(th);
	free(entries);
	free(jobs);
	free(jm);
	return rc;
}

int emb_cmd_dump(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"table", required_argument, NULL, 't'},
	    {"out", required_argument, NULL, 'o'},
	    {"block-size", required_argument, NULL, 'b'},
	    {"shuffle", no_argument, NULL, 'P'},
	    {"no-shuffle", no_argument, NULL, 'S'},
	    {"consistent", no_argument, NULL, 'c'},
	    EMB_CLI_OPTS_CONN,
	    EMB_CLI_OPTS_BASE,
	    {NULL, 0, NULL, 0},
	};
	struct cli cli;
	char *end;
	int c, status;

	emb_cli_init(&cli, "dump");
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			cli.table = optarg;
			break;
		case 'o':
			cli.dir = optarg;
			break;
		case 'b':
			cli.block_bytes = (uint32_t)strtoul(optarg, &end, 10);
			if (*end == 'K' || *end == 'k')
				cli.block_bytes <<= 10, end++;
			else if (*end == 'M' || *end == 'm')
				cli.block_bytes <<= 20, end++;
			if (*end || cli.block_bytes < 4096 ||
			    cli.block_bytes > EMB_SNAP_BLOCK_MAX)
				return emb_cli_usage_error(
				    &cli, usage, "bad --block-size (4K..64M)");
			break;
		case 'P':
			cli.shuffle = true;
			break;
		case 'S':
			cli.shuffle = false;
			break;
		case 'c':
			cli.consistent = true;
			break;
		default:
			status = emb_cli_opt(&cli, c, optarg, usage);
			if (status >= 0)
				return status;
		}
	}
	if (optind < argc)
		return emb_cli_usage_error(&cli, usage, "unexpected argument");
	status = emb_cli_setup(&cli);
	return status ? status : run(&cli);
}
