/*
 * examples/ctr/gen.c - Criteo-format click data with a planted ground truth.
 *
 *   gen --rows N --seed S --out DIR [--test-frac F]
 *
 * writes DIR/train.tsv and DIR/test.tsv: label, 13 integer features and 26
 * categorical features (8 hex digits), tab-separated, some fields empty, as
 * in Criteo's Display Advertising Challenge files. Categorical values are
 * Zipf-distributed per field; the label is drawn from a known logistic model
 * over per-value weights, the log of the integer features and a few field
 * crosses, so a trained model's AUC can be compared with the truth's. The
 * model's AUC on the test file is printed at the end. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctr.h"

#define ZIPF_S 1.1

struct field {
	uint32_t vocab; /* distinct values */
	double *cdf;	/* Zipf CDF over ranks */
	double scale;	/* std of this field's value weights */
};

static const uint32_t vocab_sizes[CTR_NCAT] = {
    1000,  500,	 20000, 8000, 200,  50,	  5000, 300,  2000,
    15000, 3000, 100,	4000, 30,   9000, 600,	10,   700,
    1500,  5,	 12000, 40,   2500, 800,  60,	25000};

/* Crossed field pairs that carry signal of their own. */
static const int crosses[][2] = {{0, 2}, {3, 9}, {5, 13}};

static double unit(uint64_t *st)
{
	return (double)(ctr_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0);
}

/* A standard normal from a hash: the same key always gives the same draw. */
static double hnormal(uint64_t key)
{
	uint64_t st = ctr_hash(key);
	double u1 = 1.0 - unit(&st), u2 = unit(&st);

	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static uint32_t draw_rank(const struct field *f, uint64_t *st)
{
	double u = unit(st);
	uint32_t lo = 0, hi = f->vocab - 1;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if (f->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int make_fields(struct field *fs, uint64_t seed)
{
	for (int f = 0; f < CTR_NCAT; f++) {
		double sum = 0.0;

		fs[f].vocab = vocab_sizes[f];
		fs[f].cdf = malloc(fs[f].vocab * sizeof(double));
		if (!fs[f].cdf)
			return -ENOMEM;
		for (uint32_t r = 0; r < fs[f].vocab; r++)
			sum += 1.0 / pow(r + 1.0, ZIPF_S);
		for (uint32_t r = 0, acc = 0; r < fs[f].vocab; r++) {
			double p = 1.0 / pow(r + 1.0, ZIPF_S) / sum;

			(void)acc;
			fs[f].cdf[r] = (r ? fs[f].cdf[r - 1] : 0.0) + p;
		}
		fs[f].cdf[fs[f].vocab - 1] = 1.0;
		/* Some fields matter, most a little, a few not at all. */
		fs[f].scale = (f % 5 == 4)
				  ? 0.0
				  : 0.25 + 0.35 * ((f * 7 + seed) % 4) / 3.0;
	}
	return 0;
}

/* The categorical value of rank r in field f, as Criteo's hashed hex. */
static uint32_t cat_value(uint64_t seed, int f, uint32_t r)
{
	return (uint32_t)ctr_hash(seed * 1000003u + (uint64_t)f * 7919u + r);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"rows", required_argument, NULL, 'n'},
	    {"seed", required_argument, NULL, 's'},
	    {"out", required_argument, NULL, 'o'},
	    {"test-frac", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct field fs[CTR_NCAT];
	uint64_t rows = 100000, seed = 1, st;
	double test_frac = 0.2, *scores = NULL;
	uint8_t *labels = NULL;
	const char *out = NULL;
	char path[4096];
	FILE *ftr, *fte;
	uint64_t ntest = 0, pos = 0;
	int c;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			rows = strtoull(optarg, NULL, 10);
			break;
		case 's':
			seed = strtoull(optarg, NULL, 10);
			break;
		case 'o':
			out = optarg;
			break;
		case 't':
			test_frac = atof(optarg);
			break;
		default:
			fprintf(stderr,
				"usage: gen --rows N --seed S --out DIR "
				"[--test-frac F]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (!out || rows == 0 || test_frac <= 0.0 || test_frac >= 1.0) {
		fprintf(stderr,
			"gen: --out DIR and --rows N > 0 are required\n");
		return 2;
	}
	if (mkdir(out, 0755) && errno != EEXIST) {
		fprintf(stderr, "gen: mkdir %s: %s\n", out, strerror(errno));
		return 1;
	}
	if (make_fields(fs, seed)) {
		fprintf(stderr, "gen: out of memory\n");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/train.tsv", out);
	ftr = fopen(path, "w");
	snprintf(path, sizeof(path), "%s/test.tsv", out);
	fte = fopen(path, "w");
	scores = malloc(rows * sizeof(*scores));
	labels = malloc(rows);
	if (!ftr || !fte || !scores || !labels) {
		fprintf(stderr, "gen: cannot write to %s\n", out);
		return 1;
	}
	st = ctr_hash(seed ^ 0x5eedull);
	for (uint64_t i = 0; i < rows; i++) {
		uint32_t rank[CTR_NCAT];
		double ints[CTR_NINT];
		double logit = -1.2;
		bool test = unit(&st) < test_frac;
		FILE *f = test ? fte : ftr;
		int label;

		for (int k = 0; k < CTR_NINT; k++) {
			/* Counts with a heavy tail; about 1 in 8 missing. */
			ints[k] =
			    unit(&st) < 0.125
				? -1.0
				: floor(exp(2.5 * unit(&st) * (1 + k % 3)) -
					1.0);
			if (ints[k] >= 0)
				logit += 0.15 * hnormal(seed * 31 + 100 + k) *
					 (log1p(ints[k]) - 1.5);
		}
		for (int k = 0; k < CTR_NCAT; k++) {
			rank[k] = draw_rank(&fs[k], &st);
			logit += fs[k].scale * hnormal(((uint64_t)k << 40) ^
						       (seed << 20) ^ rank[k]);
		}
		for (size_t x = 0; x < sizeof(crosses) / sizeof(crosses[0]);
		     x++) {
			int a = crosses[x][0], b = crosses[x][1];

			logit += 0.6 *
				 hnormal(ctr_hash(((uint64_t)rank[a] << 32) |
						     rank[b]) ^
					 (seed + x));
		}
		label = unit(&st) < 1.0 / (1.0 + exp(-logit));
		if (test) {
			scores[ntest] = logit;
			labels[ntest++] = (uint8_t)label;
		}
		pos += (uint64_t)label;

		fprintf(f, "%d", label);
		for (int k = 0; k < CTR_NINT; k++) {
			if (ints[k] < 0)
				fputs("\t", f);
			else
				fprintf(f, "\t%.0f", ints[k]);
		}
		for (int k = 0; k < CTR_NCAT; k++) {
			/* Empty categorical fields happen in Criteo too. */
			if (rank[k] == fs[k].vocab - 1 ||
			    (k % 7 == 6 && unit(&st) < 0.05))
				fputs("\t", f);
			else
				fprintf(f, "\t%08x",
					cat_value(seed, k, rank[k]));
		}
		fputc('\n', f);
	}
	if (fclose(ftr) || fclose(fte)) {
		fprintf(stderr, "gen: write failed: %s\n", strerror(errno));
		return 1;
	}
	printf("gen: %llu rows (%llu test), %.1f%% clicks, ground-truth test "
	       "auc=%.4f\n",
	       (unsigned long long)rows, (unsigned long long)ntest,
	       100.0 * (double)pos / (double)rows,
	       ctr_auc(scores, labels, ntest));
	for (int k = 0; k < CTR_NCAT; k++)
		free(fs[k].cdf);
	free(scores);
	free(labels);
	return 0;
}
