/*
 * tools/embstore/restore.c - `embstore restore`: verifies every file of a
 * dump and checks the target before it changes anything, then assigns
 * rows with their optimizer state through the client library, which
 * routes each id by slot, so any number of servers may receive them.
 * With --row-format the rows are converted on the way (weights decoded to
 * fp32 and encoded to nearest, state as it is): a table trained in fp32
 * can be served compact, and back.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/rowfmt.h"
#include "worker/embstore.h"

#define ASSIGN_BYTES (8u << 20) /* rows per restore assign call */

static void usage(FILE *f)
{
	fputs("usage: embstore restore --in DIR --servers LIST [options]\n"
	      "Loads a dump (or one of its files) into a cluster of any "
	      "size; the table is made\nif it does not exist.\n"
	      "  --in DIR|FILE           the dump\n"
	      "  --table NAME            the table to create or fill "
	      "(default: the dump's)\n"
	      "  --from TABLE            which table to take from a directory "
	      "that holds\n"
	      "                          several (a checkpoint)\n"
	      "  --row-format FMT        fp32|fp16|bf16|int8: convert the "
	      "rows to FMT\n"
	      "                          (default: keep the dump's)\n"
	      EMB_CLI_HELP_CONN EMB_CLI_HELP_BASE,
	      f);
}

/*
 * Restore overlaps reading with sending: this thread decodes blocks into
 * batch buffers, ASSIGN_THREADS threads send them (the client library is
 * thread-safe and routes each id by slot). A dump holds an id once, so the
 * order of the assigns does not matter. Each sender has a client of its
 * own, so a server takes the rows on two conns, on two of its loop
 * threads: making rows (index inserts, first touches of new memory) is
 * what bounds a restore, and one loop thread does it on one core.
 */
#define ASSIGN_THREADS 2
#define ASSIGN_BUFS    4

struct abatch {
	uint64_t *ids; /* cap ids */
	float *rows;   /* cap * row_floats floats */
	uint32_t n;    /* rows held */
};

struct apool;

struct asender {
	struct apool *ap; /* shared */
	uint32_t i;	  /* which of ap->t */
};

struct apool {
	struct emb_client_table *t[ASSIGN_THREADS]; /* borrowed, by sender */
	struct emb_cli_progress *prog;	 /* shared */
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
	struct asender sd[ASSIGN_THREADS]; /* their arguments */
	uint32_t nth;			 /* started */
};

static void *apool_main(void *arg)
{
	const struct asender *sd = arg;
	struct apool *ap = sd->ap;

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
		    emb_client_table_assign(ap->t[sd->i], b->ids, b->n, b->rows,
					    true);
		if (!rc)
			emb_cli_progress_add(ap->prog, b->n,
					     4ull * b->n * ap->rf);
		pthread_mutex_lock(&ap->lock);
		if (rc && !ap->err)
			ap->err = rc;
		ap->freel[ap->nfree++] = k;
		pthread_cond_broadcast(&ap->cond);
	}
	pthread_mutex_unlock(&ap->lock);
	return NULL;
}

static int apool_start(struct apool *ap, struct emb_client_table *const *t,
		       struct emb_cli_progress *prog, uint32_t rf)
{
	memset(ap, 0, sizeof(*ap));
	for (uint32_t i = 0; i < ASSIGN_THREADS; i++) {
		ap->t[i] = t[i];
		ap->sd[i] = (struct asender){.ap = ap, .i = i};
	}
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
		if (pthread_create(&ap->th[ap->nth], NULL, apool_main,
				   &ap->sd[ap->nth]))
			return ap->nth ? 0 : -EAGAIN;
	return 0;
}

/* Rows left out of a file's restore: how many, and the first ids. */
struct aside {
	uint64_t n;	 /* rows */
	uint64_t ids[8]; /* the first min(n, 8) */
};

static void aside_add(struct aside *a, uint64_t id)
{
	if (a->n < 8)
		a->ids[a->n] = id;
	a->n++;
}

static void aside_print(const char *file, const struct aside *a,
			const char *why)
{
	if (!a->n)
		return;
	fprintf(stderr, "embstore restore: %s: %llu rows %s set aside; ids",
		file, (unsigned long long)a->n, why);
	for (uint64_t j = 0; j < a->n && j < 8; j++)
		fprintf(stderr, " %llu", (unsigned long long)a->ids[j]);
	fprintf(stderr, "%s\n", a->n > 8 ? " ..." : "");
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

/*
 * Through the scheduler (--sched) the client has the job's map: a
 * replicated job's every holder of a slot gets its rows, as a worker's
 * assign does, and removed servers are skipped. Given a list of servers
 * it routes each id to one server, as an unreplicated client.
 */
static int connect_client(const struct cli *cli,
			  const struct emb_client_opts *co,
			  struct emb_client **c)
{
	return cli->sched ? emb_client_from_sched(co, cli->sched, c)
			  : emb_client_create(co, c);
}

/* Closes the senders' own clients (not c, which the others may share). */
static void close_senders(struct emb_client **cs, struct emb_client_table **ts,
			  const struct emb_client *c)
{
	for (uint32_t i = 1; i < ASSIGN_THREADS; i++) {
		if (!cs[i] || cs[i] == c)
			continue;
		emb_client_table_close(ts[i]);
		emb_client_destroy(cs[i]);
	}
}

static int run(struct cli *cli)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	struct emb_client_table *t = NULL;
	/* The senders' clients and tables: c and t first, then more. */
	struct emb_client *cs[ASSIGN_THREADS] = {0};
	struct emb_client_table *ts[ASSIGN_THREADS] = {0};
	struct emb_snap_meta *metas = NULL;
	struct emb_table_spec spec = EMB_TABLE_SPEC_DEFAULT;
	struct emb_cli_fileset fs;
	struct emb_cli_progress prog;
	char p[EMB_SNAP_PATH_MAX + 300], fmt_note[40] = "";
	const char *name;
	uint64_t raw = 0;
	uint32_t nsel = 0, fmt, rounding;
	bool created = false;
	double dt;
	int rc;

	if (!cli->servers || !cli->dir)
		return emb_cli_usage_error(cli, usage,
					   "restore needs --in and --servers");
	rc = emb_cli_fileset_open("restore", cli->dir, &fs);
	if (rc)
		return 1;
	metas = calloc(fs.n ? fs.n : 1, sizeof(*metas));
	if (!metas)
		goto fail;
	rc = emb_cli_fileset_verify("restore", &fs, metas);
	if (rc)
		goto fail;
	if (cli->from) {
		/* Keep the files of that table only. */
		uint32_t k = 0;

		for (uint32_t i = 0; i < fs.n; i++) {
			if (strcmp(metas[i].name, cli->from) != 0)
				continue;
			fs.e[k] = fs.e[i];
			metas[k++] = metas[i];
		}
		if (k == 0) {
			fprintf(stderr, "embstore restore: %s holds no table "
					"%s\n",
				cli->dir, cli->from);
			goto fail;
		}
		fs.n = k;
	}
	for (uint32_t i = 0; i < fs.n; i++) {
		/* One table per restore: the first one, unless named. */
		if (strcmp(metas[i].name, metas[0].name) != 0) {
			fprintf(stderr,
				"embstore restore: %s holds more than one "
				"table (%s, %s, ...); pick one with --from "
				"TABLE\n",
				cli->dir, metas[0].name, metas[i].name);
			goto fail;
		}
		if (metas[i].dim != metas[0].dim ||
		    metas[i].optim.kind != metas[0].optim.kind ||
		    metas[i].row_format != metas[0].row_format) {
			fprintf(stderr,
				"embstore restore: files of %s disagree on "
				"dim, optimizer or row format\n",
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
	/* The rows' format on the servers: the dump's unless converted. A
	 * table made compact from fp32 rounds its pushes stochastically
	 * (the default); one that stays compact keeps its rounding. */
	fmt = cli->row_format ? cli->row_format_value : metas[0].row_format;
	rounding = metas[0].rounding;

	co.servers = cli->servers;
	co.transport = cli->transport;
	co.auth_token = cli->token_len ? cli->token : NULL;
	co.auth_token_len = cli->token_len;
	co.name = "embstore-restore";
	rc = connect_client(cli, &co, &c);
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
		if (have->row_format != fmt) {
			fprintf(stderr,
				"embstore restore: table %s exists with row "
				"format %s; the rows would be %s (--row-format "
				"converts them); nothing changed\n",
				name, emb_rowfmt_name(have->row_format),
				emb_rowfmt_name(fmt));
			goto fail;
		}
	} else {
		spec.name = name;
		spec.dim = metas[0].dim;
		spec.optim = metas[0].optim;
		spec.init = metas[0].init;
		spec.seed = metas[0].seed;
		spec.row_format = fmt;
		spec.rounding = rounding;
		rc = emb_client_table_create(c, &spec, &t);
		created = rc == 0;
		if (rc) {
			fprintf(stderr,
				"embstore restore: cannot create table %s: "
				"%s\n",
				name, emb_strerror(rc));
			goto fail;
		}
	}

	/* The rows must have the size the servers' table takes: a server
	 * that keeps no row formats makes an fp32 table of any CREATE. */
	if (emb_client_table_row_floats(t) !=
	    emb_rowfmt_words(fmt, metas[0].dim) + metas[0].state_floats) {
		fprintf(stderr,
			"embstore restore: table %s on the servers takes rows "
			"of %u words, not the %u of %s rows (servers without "
			"row formats?); nothing restored\n",
			name, emb_client_table_row_floats(t),
			emb_rowfmt_words(fmt, metas[0].dim) +
			    metas[0].state_floats,
			emb_rowfmt_name(fmt));
		/* The table this restore made goes again. */
		if (created)
			emb_client_table_drop(t);
		goto fail;
	}
	/* The other senders' clients; one that cannot connect sends on the
	 * first client's conns instead. */
	cs[0] = c;
	ts[0] = t;
	for (uint32_t i = 1; i < ASSIGN_THREADS; i++) {
		if (connect_client(cli, &co, &cs[i]) == 0 &&
		    emb_client_table_open(cs[i], name, &ts[i]) == 0)
			continue;
		emb_client_destroy(cs[i]);
		cs[i] = c;
		ts[i] = t;
	}
	emb_cli_progress_init(&prog, "restore", cli->quiet);
	for (uint32_t i = 0; i < fs.n; i++)
		prog.rows_total += metas[i].rows;
	for (uint32_t i = 0; i < fs.n; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		struct abatch *ab = NULL;
		struct apool ap;
		const struct emb_snap_meta *m = &metas[i];
		uint32_t rf = m->row_floats, k = 0;
		/* Rows as the servers will keep them. */
		uint32_t out_rf =
		    emb_rowfmt_words(fmt, m->dim) + m->state_floats;
		bool convert = fmt != m->row_format;
		struct aside bad = {0}, range = {0};
		int arc;

		emb_cli_fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (!rc)
			rc = apool_start(&ap, ts, &prog, out_rf);
		if (rc) {
			fprintf(stderr, "embstore restore: %s: %s\n", p,
				emb_cli_snap_err(rc));
			goto fail;
		}
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			if (emb_cli_interrupted) {
				rc = -EINTR;
				break;
			}
			for (uint32_t off = 0; off < b.n;) {
				uint32_t n;

				/* NULL: an assign failed; stop reading. */
				if (!ab && !(ab = apool_get(&ap, &k))) {
					rc = -ECANCELED;
					break;
				}
				n = b.n - off < ap.cap - ab->n ? b.n - off
							       : ap.cap - ab->n;
				for (uint32_t j = off; j < off + n; j++) {
					const float *src =
					    b.rows + (size_t)j * rf;
					float *dst =
					    ab->rows + (size_t)ab->n * out_rf;

					/* A row with a NaN or Inf (an older
					 * version could write one) would make
					 * the server refuse its whole batch:
					 * it is set aside, to be made afresh
					 * when next used. So is one the new
					 * format cannot hold (|w| > 65504 in
					 * fp16). */
					if (!emb_snap_row_finite(m, src)) {
						aside_add(&bad, b.ids[j]);
						continue;
					}
					if (!convert)
						memcpy(dst, src,
						       (size_t)rf *
							   sizeof(float));
					else if (!emb_snap_row_convert(
						     m, fmt, src, dst)) {
						aside_add(&range, b.ids[j]);
						continue;
					}
					ab->ids[ab->n++] = b.ids[j];
				}
				off += n;
				if (ab->n == ap.cap) {
					apool_put(&ap, k);
					ab = NULL;
				}
			}
			if (rc < 0)
				break;
			emb_cli_progress_show(&prog, false);
		}
		if (ab && ab->n)
			apool_put(&ap, k);
		arc = apool_finish(&ap);
		if (!rc || rc == -ECANCELED)
			rc = arc;
		emb_snap_reader_close(r);
		aside_print(p, &bad, "with a NaN or infinite value");
		aside_print(p, &range, "beyond the row format's range");
		if (rc) {
			char msg[256] = "";

			for (uint32_t j = 0; j < ASSIGN_THREADS && !msg[0]; j++)
				emb_client_last_error(cs[j], msg, sizeof(msg));
			fprintf(stderr,
				"embstore restore: %s: %s%s%s (table %s now "
				"holds part of the snapshot)\n",
				p, emb_cli_snap_err(rc), msg[0] ? ": " : "",
				msg, name);
			goto fail;
		}
	}
	emb_cli_progress_end(&prog);
	dt = emb_clock_s() - prog.t0;
	/* fp32 kept as it was says nothing about formats. */
	if (fmt != metas[0].row_format)
		snprintf(fmt_note, sizeof(fmt_note), " (%s rows from %s)",
			 emb_rowfmt_name(fmt),
			 emb_rowfmt_name(metas[0].row_format));
	else if (fmt != EMB_ROWFMT_FP32)
		snprintf(fmt_note, sizeof(fmt_note), " (%s rows)",
			 emb_rowfmt_name(fmt));
	printf("restore: table %s%s, %llu rows from %u file%s onto %u "
	       "server%s, %.1f MB of rows, %.2f s, %.0f MB/s\n",
	       name, fmt_note, (unsigned long long)prog.rows, fs.n, fs.n == 1 ? "" : "s",
	       emb_client_nservers(c), emb_client_nservers(c) == 1 ? "" : "s",
	       (double)raw / 1e6, dt, dt > 0 ? (double)raw / 1e6 / dt : 0.0);
	close_senders(cs, ts, c);
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(metas);
	emb_cli_fileset_close(&fs);
	return 0;
fail:
	close_senders(cs, ts, c);
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(metas);
	emb_cli_fileset_close(&fs);
	return 1;
}

int emb_cmd_restore(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"in", required_argument, NULL, 'i'},
	    {"table", required_argument, NULL, 't'},
	    {"from", required_argument, NULL, 'F'},
	    {"row-format", required_argument, NULL, 'R'},
	    EMB_CLI_OPTS_CONN,
	    EMB_CLI_OPTS_BASE,
	    {NULL, 0, NULL, 0},
	};
	struct cli cli;
	int c, status;

	emb_cli_init(&cli, "restore");
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'i':
			cli.dir = optarg;
			break;
		case 't':
			cli.table = optarg;
			break;
		case 'F':
			cli.from = optarg;
			break;
		case 'R':
			cli.row_format = optarg;
			if (emb_rowfmt_parse(optarg,
					     &cli.row_format_value) != 0)
				return emb_cli_usage_error(
				    &cli, usage,
				    "--row-format takes fp32, fp16, bf16 or "
				    "int8");
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
