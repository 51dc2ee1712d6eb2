/*
 * tools/embstore/inspect.c - `embstore inspect`: reads every block of a
 * dump or one snapshot file, verifies the checksums (and the MANIFEST's),
 * and describes it: metadata, rows, a histogram of weight norms, and the
 * first rows if asked.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/hash.h"
#include "common/optim.h"
#include "common/init.h"
#include "common/err.h"
#include "store/chain.h"

static void usage(FILE *f)
{
	fputs("usage: embstore inspect DIR|FILE [options]\n"
	      "Verifies a dump (every checksum) and describes it; exits 1 if "
	      "a file is bad.\n"
	      "A checkpoint directory (--checkpoint-dir) is shown as chains: "
	      "each full\ncheckpoint and the deltas that follow it, every link "
	      "verified.\n"
	      "  --rows N                also print the first N "
	      "rows\n" EMB_CLI_HELP_BASE,
	      f);
}

#define NORM_BUCKETS 16

/* Rows with a NaN or an infinity (written by an older version: a load
 * sets them aside): how many, and the first ids. */
struct nonfinite {
	uint64_t n;
	uint64_t ids[8];
};

/* Whether row w of a file with metadata m is finite, its weights decoded;
 * counts it in nf if not. */
static bool row_finite(const struct emb_snap_meta *m, const float *w,
		       uint64_t id, struct nonfinite *nf)
{
	if (emb_snap_row_finite(m, w))
		return true;
	if (nf->n < 8)
		nf->ids[nf->n] = id;
	nf->n++;
	return false;
}

static void print_nonfinite(const char *indent, const struct nonfinite *nf)
{
	if (!nf->n)
		return;
	printf("%swarning: %llu rows with a NaN or infinite value "
	       "(a load sets them aside); ids",
	       indent, (unsigned long long)nf->n);
	for (uint64_t k = 0; k < nf->n && k < 8; k++)
		printf(" %llu", (unsigned long long)nf->ids[k]);
	printf("%s\n", nf->n > 8 ? " ..." : "");
}

/*
 * Decodes the rows of checkpoint link l (verified) and counts the
 * non-finite ones in nf: the checksums cannot tell, and a restart would
 * set them aside. A delta's erased blocks hold no rows and are skipped.
 * 0, or the reader's error (l->bad names the file).
 */
static int link_nonfinite(const char *root, struct emb_chain_link *l,
			  struct nonfinite *nf)
{
	char p[EMB_SNAP_PATH_MAX + 300];
	uint32_t i;
	int rc = 0;

	for (i = 0; i < l->ne && !rc; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		const struct emb_snap_meta *m;

		snprintf(p, sizeof(p), "%s/%s/%s", root, l->name, l->e[i].file);
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc)
			continue; /* ends the loop, past file i */
		m = emb_snap_reader_meta(r);
		while ((rc = emb_snap_reader_next(r, &b)) > 0)
			for (uint32_t k = 0; k < b.n; k++)
				row_finite(m,
					   b.rows + (size_t)k * m->row_floats,
					   b.ids[k], nf);
		emb_snap_reader_close(r);
	}
	if (rc)
		snprintf(l->bad, sizeof(l->bad), "%s", l->e[i - 1].file);
	return rc;
}

static void print_meta(const char *file, const struct emb_snap_meta *m,
		       uint64_t checksum)
{
	const struct emb_optim_cfg *o = &m->optim;

	printf("file %s\n", file);
	printf("  table %s  dim %u  state floats %u  part %u of %u\n", m->name,
	       m->dim, m->state_floats, m->part, m->nparts);
	if (m->row_format == EMB_ROWFMT_FP32)
		printf("  row format fp32\n");
	else
		printf("  row format %s (%u B of weights a row), pushes round "
		       "%s\n",
		       emb_rowfmt_name(m->row_format),
		       emb_rowfmt_bytes(m->row_format, m->dim),
		       m->rounding == EMB_ROUND_NEAREST ? "to nearest"
							: "stochastically");
	/* Only a table whose CREATE asked for its own tier says so. */
	if (m->tier_mode != EMB_TIER_AUTO || m->tier_request)
		printf("  device tier %s, up to %llu MiB (0: the server's "
		       "bound)\n",
		       emb_tier_mode_name(m->tier_mode),
		       (unsigned long long)(m->tier_request >> 20));
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
	    m->version,
	    (m->flags & EMB_SNAP_F_SHUFFLE) ? " shuffled" : "",
	    (unsigned long long)checksum);
	if (m->flags & EMB_SNAP_F_DELTA)
		printf("  delta of checkpoint %016llu after %016llu: %llu rows "
		       "changed, %llu removed\n",
		       (unsigned long long)m->base_id,
		       (unsigned long long)m->prev_id,
		       (unsigned long long)m->rows,
		       (unsigned long long)m->erased);
}

/* A checkpoint directory: one line per link, grouped into chains. The
 * newest chain must verify whole for exit status 0. */
static int show_chains(const char *root)
{
	struct emb_chain_link *l;
	uint32_t n, newest_full = UINT32_MAX, bad_newest = 0;
	int rc;

	rc = emb_chain_list(root, &l, &n);
	if (rc) {
		fprintf(stderr, "embstore inspect: %s: %s\n", root,
			emb_strerror(rc));
		return 1;
	}
	for (uint32_t i = 0; i < n; i++)
		if (!l[i].delta)
			newest_full = i;
	printf("checkpoint directory %s: %u checkpoint%s\n", root, n,
	       n == 1 ? "" : "s");
	for (uint32_t i = 0; i < n; i++) {
		struct emb_chain_link *k = &l[i];
		struct nonfinite nf = {0};
		bool in_newest = newest_full != UINT32_MAX && i >= newest_full;

		if (!k->delta) {
			uint32_t span = emb_chain_span(l, n, i);

			printf("chain %s: full + %u delta%s%s\n", k->name, span,
			       span == 1 ? "" : "s",
			       i == newest_full ? " (the newest)"
						: "");
		}
		if (!emb_chain_verify(root, k))
			k->status = link_nonfinite(root, k, &nf);
		printf("  %-6s %s  %u table%s  %llu rows  %llu removed  %llu B"
		       "  %s%s\n",
		       k->delta ? "delta" : "full", k->name, k->ne,
		       k->ne == 1 ? "" : "s", (unsigned long long)k->rows,
		       (unsigned long long)k->erased,
		       (unsigned long long)k->bytes,
		       k->status ? "REFUSED: " : "OK", k->status ? k->bad : "");
		print_nonfinite("         ", &nf);
		if (k->status) {
			printf("         %s\n", emb_cli_snap_err(k->status));
			if (in_newest)
				bad_newest++;
		}
	}
	if (newest_full != UINT32_MAX &&
	    newest_full + emb_chain_span(l, n, newest_full) + 1 < n) {
		printf("%s does not continue the newest chain\n",
		       l[newest_full + emb_chain_span(l, n, newest_full) + 1]
			   .name);
		bad_newest++;
	}
	emb_chain_free(l, n);
	if (bad_newest || newest_full == UINT32_MAX) {
		printf("the newest chain is %s\n",
		       newest_full == UINT32_MAX ? "missing its full checkpoint"
						 : "damaged");
		return 1;
	}
	printf("all checksums OK\n");
	return 0;
}

static int run(struct cli *cli)
{
	struct emb_cli_fileset fs;
	char p[EMB_SNAP_PATH_MAX + 300];
	uint64_t hist[NORM_BUCKETS + 2], total = 0;
	struct nonfinite nf = {0};
	uint32_t shown = 0, sf, ww;
	int rc, bad = 0;
	/* A decoded row: at most dim weights and 2 dim + 1 state floats. */
	static float w[3 * EMB_DIM_MAX + 1];

	if (!cli->dir)
		return emb_cli_usage_error(cli, usage,
					   "inspect needs a directory or file");
	if (!emb_cli_is_dump(cli->dir) && emb_chain_is_root(cli->dir))
		return show_chains(cli->dir);
	if (emb_cli_fileset_open("inspect", cli->dir, &fs))
		return 1;
	memset(hist, 0, sizeof(hist));
	for (uint32_t i = 0; i < fs.n; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		const struct emb_snap_meta *m;

		emb_cli_fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc) {
			fprintf(stderr, "embstore inspect: %s: %s\n", p,
				emb_cli_snap_err(rc));
			bad++;
			continue;
		}
		m = emb_snap_reader_meta(r);
		/* Rows are shown decoded: fp32 weights, then the state. */
		sf = m->state_floats;
		ww = m->row_floats - sf;
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			for (uint32_t k = 0; k < b.n; k++) {
				const float *raw =
				    b.rows + (size_t)k * m->row_floats;
				double sq = 0;
				int bucket;

				/* A load sets such a row aside, so it is
				 * counted, not put in the histogram. */
				if (!row_finite(m, raw, b.ids[k], &nf))
					continue;
				emb_rowfmt_decode(m->row_format, raw, w,
						  m->dim);
				memcpy(w + m->dim, raw + ww,
				       (size_t)sf * sizeof(float));
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
					     d < m->dim + sf && d < 16; d++)
						printf(" %.6g", (double)w[d]);
					printf("%s\n", m->dim + sf > 16
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
				if (fs.e[i].consistent)
					printf("  consistent: every row as of "
					       "one instant, table step "
					       "%llu\n",
					       (unsigned long long)fs.e[i].step);
			}
		} else {
			fprintf(stderr, "embstore inspect: %s: %s\n", p,
				emb_cli_snap_err(rc));
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
	print_nonfinite("", &nf);
	emb_cli_fileset_close(&fs);
	if (bad) {
		printf("%d file%s FAILED verification\n", bad,
		       bad == 1 ? "" : "s");
		return 1;
	}
	printf("all checksums OK\n");
	return 0;
}

int emb_cmd_inspect(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"rows", required_argument, NULL, 'r'},
	    {"in", required_argument, NULL, 'i'},
	    EMB_CLI_OPTS_BASE,
	    {NULL, 0, NULL, 0},
	};
	struct cli cli;
	unsigned long rows;
	char *end;
	int c, status;

	emb_cli_init(&cli, "inspect");
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			/* strtoul() takes "-5" as a huge number. */
			errno = 0;
			rows = strtoul(optarg, &end, 10);
			if (*end || optarg[0] < '0' || optarg[0] > '9' ||
			    errno || rows > UINT32_MAX)
				return emb_cli_usage_error(
				    &cli, usage,
				    "--rows takes a count, 0..4294967295");
			cli.rows = (uint32_t)rows;
			break;
		case 'i':
			cli.dir = optarg;
			break;
		default:
			status = emb_cli_opt(&cli, c, optarg, usage);
			if (status >= 0)
				return status;
		}
	}
	status = emb_cli_finish_dir(&cli, argc, argv, usage);
	return status ? status : run(&cli);
}
