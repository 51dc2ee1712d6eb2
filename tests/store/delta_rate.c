/*
 * tests/store/delta_rate.c - measures a delta checkpoint against a full
 * one on the same table: bytes and time of each, and their ratios, when a
 * fraction of the rows changed in between. Not a test: run by hand,
 *   delta_rate [ROWS] [DIM] [sgd|adagrad|adam|ftrl] [CHANGED] [REPS] [DIR]
 * (CHANGED is the fraction of rows pushed between the two, 0.01 = 1%).
 * Each repetition writes a full checkpoint walk, pushes CHANGED * ROWS
 * random existing rows, and writes the delta walk; both are fsynced files.
 * Prints one line per repetition and the medians. Single-threaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/optim.h"
#include "store/snapshot.h"

#define MAX_REPS 64

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Pushes n gradients to ids drawn from the first rows ids made. */
static void push_some(struct emb_table *t, uint64_t seed, uint32_t rows,
		      uint32_t n, uint32_t dim, uint64_t *st)
{
	uint32_t batch = 8192;
	uint64_t *ids = malloc(batch * sizeof(*ids));
	float *g = malloc((size_t)batch * dim * sizeof(float));

	for (uint32_t done = 0; done < n; done += batch) {
		uint32_t m = n - done < batch ? n - done : batch;

		for (uint32_t i = 0; i < m; i++) {
			/* The k-th id the fill made: splitmix of seed + k. */
			uint64_t s = seed + (emb_splitmix64(st) % rows) *
						0x9e3779b97f4a7c15ull;

			ids[i] = emb_splitmix64(&s);
		}
		for (size_t j = 0; j < (size_t)m * dim; j++)
			g[j] = (float)(emb_splitmix64(st) >> 40) / 1.6e7f - 0.5f;
		emb_table_push(t, ids, m, g);
	}
	free(g);
	free(ids);
}

int main(int argc, char **argv)
{
	uint32_t rows = argc > 1 ? (uint32_t)atoi(argv[1]) : 1000000;
	uint32_t dim = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
	const char *optim = argc > 3 ? argv[3] : "sgd";
	double changed = argc > 4 ? atof(argv[4]) : 0.01;
	int reps = argc > 5 ? atoi(argv[5]) : 5;
	const char *dir = argc > 6 ? argv[6] : "/tmp";
	double bytes_r[MAX_REPS], time_r[MAX_REPS], full_s[MAX_REPS],
	    delta_s[MAX_REPS];
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table *t;
	uint64_t st = 7, seed = 1;
	char full[512], delta[512];
	uint32_t nchanged;

	if (emb_optim_parse(optim, &o.optim) || reps < 1 || reps > MAX_REPS ||
	    changed < 0 || changed > 1) {
		fprintf(stderr, "usage: delta_rate [ROWS] [DIM] [OPTIM] "
				"[CHANGED 0..1] [REPS 1..64] [DIR]\n");
		return 2;
	}
	o.dim = dim;
	o.init =
	    (struct emb_init_cfg){.kind = EMB_INIT_NORMAL, .a = 0, .b = 0.05f};
	if (emb_table_create(&o, &t))
		return 1;
	/* Every row trained once: the k-th id is splitmix(seed + k * phi). */
	{
		uint64_t s = seed;
		uint32_t batch = 8192;
		uint64_t *ids = malloc(batch * sizeof(*ids));
		float *g = malloc((size_t)batch * dim * sizeof(float));

		for (uint32_t done = 0; done < rows; done += batch) {
			uint32_t n = rows - done < batch ? rows - done : batch;

			for (uint32_t i = 0; i < n; i++)
				ids[i] = emb_splitmix64(&s);
			for (size_t j = 0; j < (size_t)n * dim; j++)
				g[j] = (float)(emb_splitmix64(&st) >> 40) /
					   1.6e7f -
				       0.5f;
			emb_table_push(t, ids, n, g);
		}
		free(g);
		free(ids);
	}
	nchanged = (uint32_t)(changed * rows);
	snprintf(full, sizeof(full), "%s/delta_rate.%ld.full.embs", dir,
		 (long)getpid());
	snprintf(delta, sizeof(delta), "%s/delta_rate.%ld.delta.embs", dir,
		 (long)getpid());
	printf("table: %u rows, dim %u, %s; %u pushes (%.2f%%) between the "
	       "full and the delta\n",
	       rows, dim, optim, nchanged, 100.0 * changed);
	for (int r = 0; r < reps; r++) {
		struct emb_snap_result fr, dr;
		double t0, t1, t2, t3;
		int rc;

		t0 = now_s();
		rc = emb_snap_write_ckpt(t, full, false, 0, 0, NULL, &fr);
		t1 = now_s();
		push_some(t, seed, rows, nchanged, dim, &st);
		t2 = now_s();
		if (!rc)
			rc = emb_snap_write_ckpt(t, delta, true, 1, 1, NULL,
						 &dr);
		t3 = now_s();
		if (rc) {
			fprintf(stderr, "write: %s\n", emb_strerror(rc));
			return 1;
		}
		full_s[r] = t1 - t0;
		delta_s[r] = t3 - t2;
		bytes_r[r] = (double)dr.file_bytes / (double)fr.file_bytes;
		time_r[r] = delta_s[r] / full_s[r];
		printf("rep %d: full %llu rows %llu B %.3f s; delta %llu rows "
		       "%llu B %.4f s; bytes %.2f%% time %.2f%%\n",
		       r + 1, (unsigned long long)fr.rows,
		       (unsigned long long)fr.file_bytes, full_s[r],
		       (unsigned long long)dr.rows,
		       (unsigned long long)dr.file_bytes, delta_s[r],
		       100 * bytes_r[r], 100 * time_r[r]);
		unlink(full);
		unlink(delta);
	}
	printf("median of %d: full %.3f s, delta %.4f s; delta/full bytes "
	       "%.2f%%, time %.2f%%\n",
	       reps, median(full_s, reps), median(delta_s, reps),
	       100 * median(bytes_r, reps), 100 * median(time_r, reps));
	emb_table_destroy(t);
	return 0;
}
