/*
 * examples/ctr/train.c - trains the wide & deep CTR model through embstore.
 *
 *   train --data train.tsv --test test.tsv [--epochs N] [--batch B] [--local]
 *         [--servers LIST] [--cache-rows R] [--prefetch K] [--staleness S]
 *         [--mode async|sync|stale:K]
 *
 * Every weight lives in an embstore table: the embeddings ("ctr_emb", dim 16)
 * and the wide weights ("ctr_wide", dim 1) are read through the worker's
 * vocab cache with prefetch, and the MLP ("ctr_mlp", rows of 256 floats) is
 * pulled every step and its gradients pushed, as in a parameter server's
 * dense mode. Without --servers the worker joins the cluster from the
 * environment (embstore launch sets it). --local trains the same model with
 * the same optimizers on in-process tables, with no servers: the baseline.
 * Workers read the lines whose number modulo the worker count is their rank.
 * Single-threaded (the client library runs its own network thread).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <embstore.h>

#include "ctr.h"
#include "params.h"

/* Seconds on the monotonic clock. */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct cfg {
	const char *data;   /* training file */
	const char *test;   /* held-out file, or NULL */
	uint32_t epochs;    /* passes over the data */
	uint32_t batch;	    /* examples per step */
	uint32_t log_every; /* steps between loss lines */
	uint64_t seed;	    /* tables' and the MLP's initial values */
	uint32_t mode;	    /* enum emb_mode */
	uint32_t staleness; /* bounded staleness: K */
	const char *after;  /* shell command rank 0 runs after training */
	struct ctr_params_opts popts; /* where the parameters live */
};

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: train --data FILE [--test FILE] [--epochs N] "
	    "[--batch B]\n"
	    "             [--local | --servers HOST:PORT,...] "
	    "[--transport tcp|rdma|auto]\n"
	    "             [--cache-rows R] [--prefetch K] [--staleness S] "
	    "[--seed N] [--log-every N]\n"
	    "             [--mode async|sync|stale:K] [--after-train CMD]\n"
	    "             [--admit none|count:N|bloom:N[:BYTES]]\n"
	    "             [--evict ttl:STEPS,min_l2:X,max_rows:N[:lru|lfu]]\n"
	    "             [--row-format fp32|fp16|bf16|int8]\n"
	    "--admit, --evict: admission and eviction of the sparse tables\n"
	    "(docs/store.md).\n"
	    "--row-format: how the servers keep the sparse tables' rows\n"
	    "(docs/store.md, \"Row formats\"); not with --local.\n"
	    "--after-train: once every worker is done, worker 0 runs CMD with\n"
	    "EMB_SERVERS set to the cluster's servers (e.g. an embstore dump)\n"
	    "while they still serve.\n");
}

/* A decimal in 0..UINT32_MAX and nothing else: 0, or -EINVAL. */
static int parse_u32(const char *s, uint32_t *out)
{
	unsigned long long v;
	char *end;

	errno = 0;
	if (*s < '0' || *s > '9')
		return -EINVAL;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static int bad_value(const char *opt, const char *value)
{
	fprintf(stderr, "train: bad --%s '%s': want a number 0..4294967295\n",
		opt, value);
	return 2;
}

/* Lines in path, or 0 if it cannot be read. */
static uint64_t count_lines(const char *path)
{
	char buf[1 << 16];
	uint64_t n = 0;
	size_t got;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0)
		for (size_t i = 0; i < got; i++)
			n += buf[i] == '\n';
	fclose(f);
	return n;
}

/* Copies the batch's categorical ids, example-major, for the tables. */
static void batch_ids(const struct ctr_example *ex, uint32_t n, uint64_t *ids)
{
	for (uint32_t i = 0; i < n; i++)
		memcpy(ids + (size_t)i * CTR_NCAT, ex[i].ids,
		       sizeof(ex[i].ids));
}

/* Scores the whole test file with the current parameters (no updates). */
static int evaluate(struct ctr_params *p, const char *path, uint32_t batch,
		    double *auc, double *logloss)
{
	struct ctr_example *ex = malloc(batch * sizeof(*ex));
	float *emb = malloc((size_t)batch * CTR_NCAT * CTR_EMB_DIM * 4);
	float *wide = malloc((size_t)batch * CTR_NCAT * 4);
	float *dense = malloc(CTR_DENSE_ROWS * CTR_DENSE_ROW * 4);
	uint64_t *ids = malloc((size_t)batch * CTR_NCAT * 8);
	double *scores = NULL, loss = 0.0;
	uint8_t *labels = NULL;
	uint64_t n = 0, cap = 0, lineno = 0, bad = 0;
	FILE *f = fopen(path, "r");
	uint32_t got;
	int rc = 0;

	if (!f || !ex || !emb || !wide || !dense || !ids) {
		rc = f ? -ENOMEM : -errno;
		goto out;
	}
	rc = ctr_params_pull_dense(p, dense);
	while (!rc &&
	       (got = ctr_read_batch(f, ex, batch, 0, 1, &lineno, &bad)) > 0) {
		double pr[1024];

		batch_ids(ex, got, ids);
		rc = ctr_params_eval_rows(p, ids, got * CTR_NCAT, emb, wide);
		if (rc)
			break;
		if (n + got > cap) {
			cap = cap ? 2 * cap : 65536;
			scores = realloc(scores, cap * sizeof(*scores));
			labels = realloc(labels, cap);
			if (!scores || !labels) {
				rc = -ENOMEM;
				break;
			}
		}
		for (uint32_t i = 0; i < got; i += 1024) {
			uint32_t m = got - i < 1024 ? got - i : 1024;

			loss +=
			    m * ctr_forward_backward(
				    ex + i, m,
				    emb + (size_t)i * CTR_NCAT * CTR_EMB_DIM,
				    wide + (size_t)i * CTR_NCAT, dense, NULL,
				    NULL, NULL, pr);
			for (uint32_t k = 0; k < m; k++) {
				scores[n + i + k] = pr[k];
				labels[n + i + k] = (uint8_t)ex[i + k].label;
			}
		}
		n += got;
	}
	if (!rc) {
		*auc = ctr_auc(scores, labels, n);
		*logloss = n ? loss / (double)n : 0.0;
	}
out:
	if (f)
		fclose(f);
	free(scores);
	free(labels);
	free(ex);
	free(emb);
	free(wide);
	free(dense);
	free(ids);
	return rc;
}

static int train(const struct cfg *c, struct ctr_params *p)
{
	const uint32_t b = c->batch;
	struct ctr_example *ex[2];
	uint64_t *ids[2];
	float *emb, *wide, *g_emb, *g_wide, *dense, *g_dense;
	uint32_t rank = ctr_params_rank(p), nw = ctr_params_workers(p);
	uint64_t samples = 0, bad = 0, gstep = 0, sync_steps = 0;
	double t0 = now_s();
	int rc = 0;

	/* Synchronous steps need every worker: all take as many steps as the
	 * largest shard, a worker short of data sending empty ones. */
	if (c->mode == EMB_MODE_SYNC) {
		uint64_t lines = count_lines(c->data);

		sync_steps = ((lines + nw - 1) / nw + b - 1) / b;
	}

	ex[0] = malloc(b * sizeof(**ex));
	ex[1] = malloc(b * sizeof(**ex));
	ids[0] = malloc((size_t)b * CTR_NCAT * 8);
	ids[1] = malloc((size_t)b * CTR_NCAT * 8);
	emb = malloc((size_t)b * CTR_NCAT * CTR_EMB_DIM * 4);
	g_emb = malloc((size_t)b * CTR_NCAT * CTR_EMB_DIM * 4);
	wide = malloc((size_t)b * CTR_NCAT * 4);
	g_wide = malloc((size_t)b * CTR_NCAT * 4);
	dense = malloc(CTR_DENSE_ROWS * CTR_DENSE_ROW * 4);
	g_dense = calloc(CTR_DENSE_ROWS * CTR_DENSE_ROW, 4);
	if (!ex[0] || !ex[1] || !ids[0] || !ids[1] || !emb || !g_emb || !wide ||
	    !g_wide || !dense || !g_dense)
		return -ENOMEM;

	for (uint32_t epoch = 1; epoch <= c->epochs && !rc; epoch++) {
		FILE *f = fopen(c->data, "r");
		uint64_t lineno = 0, step = 0;
		uint32_t n, next;
		double loss_sum = 0.0;
		uint32_t loss_n = 0;
		int cur = 0;

		if (!f) {
			fprintf(stderr, "train: %s: %s\n", c->data,
				strerror(errno));
			return -errno;
		}
		n = ctr_read_batch(f, ex[cur], b, rank, nw, &lineno, &bad);
		if (n)
			batch_ids(ex[cur], n, ids[cur]);
		if (n)
			rc = ctr_params_prefetch(p, ids[cur], n * CTR_NCAT);
		while ((n || step < sync_steps) && !rc) {
			double loss;

			if (!n) {
				rc = ctr_params_push_empty(p, gstep++);
				step++;
				continue;
			}

			/* Read and prefetch the next batch while this one
			 * computes: its misses travel meanwhile. */
			next = ctr_read_batch(f, ex[cur ^ 1], b, rank, nw,
					      &lineno, &bad);
			rc = ctr_params_lookup(p, ids[cur], n * CTR_NCAT, emb,
					       wide);
			if (!rc && next) {
				batch_ids(ex[cur ^ 1], next, ids[cur ^ 1]);
				rc = ctr_params_prefetch(p, ids[cur ^ 1],
							 next * CTR_NCAT);
			}
			if (!rc)
				rc = ctr_params_pull_dense(p, dense);
			if (rc)
				break;
			loss =
			    ctr_forward_backward(ex[cur], n, emb, wide, dense,
						 g_emb, g_wide, g_dense, NULL);
			rc =
			    ctr_params_push(p, g_emb, g_wide, g_dense, gstep++);
			if (rc)
				break;
			step++;
			samples += n;
			loss_sum += loss;
			loss_n++;
			if (step % c->log_every == 0) {
				printf("epoch: %u step: %llu, loss is %.4f\n",
				       epoch, (unsigned long long)step,
				       loss_sum / loss_n);
				fflush(stdout);
				loss_sum = 0.0;
				loss_n = 0;
			}
			n = next;
			cur ^= 1;
		}
		fclose(f);
		if (rc)
			break;
		/* Nothing to learn from: say so rather than report success. */
		if (samples == 0) {
			fprintf(stderr,
				"train: no valid sample in %s for worker %u "
				"(%llu malformed lines)\n",
				c->data, rank, (unsigned long long)bad);
			rc = 1;
			break;
		}
		rc = ctr_params_epoch_end(p);
		/* The last epoch is scored once every worker is done, so the
		 * figure covers all of their updates. */
		if (!rc && epoch == c->epochs)
			rc = ctr_params_barrier(p, "trained");
		if (!rc && c->test && rank == 0) {
			double auc = 0.0, ll = 0.0;

			rc = evaluate(p, c->test, 4096, &auc, &ll);
			if (!rc) {
				printf("epoch: %u test auc=%.4f logloss=%.4f\n",
				       epoch, auc, ll);
				fflush(stdout);
			}
		}
	}
	if (!rc) {
		double dt = now_s() - t0;

		printf("worker %u: %llu samples in %.2f s, %.0f samples/s%s\n",
		       rank, (unsigned long long)samples, dt,
		       dt > 0 ? (double)samples / dt : 0.0,
		       bad ? " (malformed lines skipped)" : "");
	}
	free(ex[0]);
	free(ex[1]);
	free(ids[0]);
	free(ids[1]);
	free(emb);
	free(g_emb);
	free(wide);
	free(g_wide);
	free(dense);
	free(g_dense);
	return rc;
}

/* Says why the after-train command failed, from system()'s status. */
static void report_after(const char *cmd, int st)
{
	if (st == -1)
		fprintf(stderr,
			"train: cannot run the after-train command: "
			"%s\n",
			strerror(errno));
	else if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		fprintf(stderr,
			"train: after-train command not found (exit 127): "
			"%s\ntrain: is the program on PATH? `embstore launch` "
			"puts its own directory first; otherwise see "
			"docs/deploy.md\n",
			cmd);
	else if (WIFEXITED(st))
		fprintf(stderr,
			"train: after-train command exited with %d: "
			"%s\n",
			WEXITSTATUS(st), cmd);
	else if (WIFSIGNALED(st))
		fprintf(stderr, "train: after-train command killed by %s: %s\n",
			strsignal(WTERMSIG(st)), cmd);
}

/*
 * Every worker has flushed; worker 0 runs the command (a dump, say) while
 * the servers still hold the trained tables, then everyone may finish.
 */
static int after_train(const struct cfg *c, struct ctr_params *p)
{
	char servers[4096];
	int rc = 0, st;

	/* train() ended with every worker past the "trained" barrier. */
	if (ctr_params_rank(p) != 0)
		return ctr_params_barrier(p, "after-train");
	rc = ctr_params_servers(p, servers, sizeof(servers));
	if (rc == 0 && setenv("EMB_SERVERS", servers, 1) != 0)
		rc = -errno;
	if (rc == 0) {
		fflush(stdout);
		st = system(c->after);
		if (st != 0) {
			report_after(c->after, st);
			rc = 1; /* reported */
		}
	}
	st = ctr_params_barrier(p, "after-train");
	return rc ? rc : st;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"data", required_argument, NULL, 'd'},
	    {"test", required_argument, NULL, 't'},
	    {"epochs", required_argument, NULL, 'e'},
	    {"batch", required_argument, NULL, 'b'},
	    {"seed", required_argument, NULL, 's'},
	    {"log-every", required_argument, NULL, 'l'},
	    {"local", no_argument, NULL, 'L'},
	    {"servers", required_argument, NULL, 'S'},
	    {"transport", required_argument, NULL, 'T'},
	    {"cache-rows", required_argument, NULL, 'c'},
	    {"prefetch", required_argument, NULL, 'p'},
	    {"staleness", required_argument, NULL, 'z'},
	    {"mode", required_argument, NULL, 'm'},
	    {"after-train", required_argument, NULL, 'A'},
	    {"admit", required_argument, NULL, 'a'},
	    {"evict", required_argument, NULL, 'v'},
	    {"row-format", required_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct cfg c = {
	    .epochs = 1,
	    .batch = 512,
	    .log_every = 100,
	    .seed = 2024,
	    .popts = CTR_PARAMS_OPTS_DEFAULT,
	};
	struct ctr_params *p;
	int o, rc, idx = 0;

	while ((o = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
		switch (o) {
		case 'd':
			c.data = optarg;
			break;
		case 't':
			c.test = optarg;
			break;
		case 'e':
			if (parse_u32(optarg, &c.epochs))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'b':
			if (parse_u32(optarg, &c.batch))
				return bad_value(opts[idx].name, optarg);
			break;
		case 's':
			c.seed = strtoull(optarg, NULL, 10);
			break;
		case 'l':
			if (parse_u32(optarg, &c.log_every))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'L':
			c.popts.local = true;
			break;
		case 'S':
			c.popts.servers = optarg;
			break;
		case 'T':
			c.popts.transport = optarg;
			break;
		case 'c':
			if (parse_u32(optarg, &c.popts.cache_rows))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'p':
			if (parse_u32(optarg, &c.popts.prefetch))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'z':
			if (parse_u32(optarg, &c.popts.staleness))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'A':
			c.after = optarg;
			break;
		case 'R':
			if (emb_rowfmt_parse(optarg, &c.popts.row_format))
				return bad_value(opts[idx].name, optarg);
			break;
		case 'a':
			if (emb_admit_parse(optarg, &c.popts.life)) {
				fprintf(stderr, "train: bad --admit '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'v':
			if (emb_evict_parse(optarg, &c.popts.life)) {
				fprintf(stderr, "train: bad --evict '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'm':
			if (strcmp(optarg, "async") == 0) {
				c.mode = EMB_MODE_ASYNC;
			} else if (strcmp(optarg, "sync") == 0) {
				c.mode = EMB_MODE_SYNC;
			} else if (strncmp(optarg, "stale:", 6) == 0) {
				c.mode = EMB_MODE_STALE;
				if (parse_u32(optarg + 6, &c.staleness))
					return bad_value(opts[idx].name, optarg);
			} else {
				usage(stderr);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!c.data || c.epochs == 0 || c.batch == 0 || c.batch > 65536 ||
	    c.log_every == 0) {
		usage(stderr);
		return 2;
	}
	/* The in-process tables admit as the servers do but evict nothing. */
	if (c.popts.local && (c.popts.life.ttl_steps || c.popts.life.min_l2 ||
			      c.popts.life.max_rows)) {
		fprintf(stderr, "train: --evict needs servers; --local tables "
				"keep every row\n");
		return 2;
	}
	if (c.popts.local && c.popts.row_format != EMB_ROWFMT_FP32) {
		fprintf(stderr, "train: --row-format %s needs servers; --local "
				"tables are fp32\n",
			emb_rowfmt_name(c.popts.row_format));
		return 2;
	}
	c.popts.seed = c.seed;
	c.popts.max_batch = c.batch * CTR_NCAT;
	rc = ctr_params_open(&c.popts, &p);
	if (rc) {
		fprintf(stderr, "train: cannot open parameters: %s\n",
			emb_strerror(rc));
		return 1;
	}
	rc = ctr_params_set_mode(p, c.mode, c.staleness);
	if (rc) {
		fprintf(stderr, "train: cannot set the training mode: %s\n",
			emb_strerror(rc));
		ctr_params_close(p);
		return 1;
	}
	rc = train(&c, p);
	if (!rc && c.after)
		rc = after_train(&c, p);
	ctr_params_close(p);
	if (rc) {
		/* A positive rc was reported where it happened. */
		if (rc < 0)
			fprintf(stderr, "train: %s\n", emb_strerror(rc));
		return 1;
	}
	return 0;
}
