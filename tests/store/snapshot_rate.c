/*
 * tests/store/snapshot_rate.c - measures snapshot write and load rates (MB/s
 * of raw rows: ids, meta and full rows) and the compression ratio on one
 * table. Not a test: run by hand,
 *   snapshot_rate [ROWS] [DIM] [sgd|adagrad|adam|ftrl] [DIR]
 * Single-threaded.
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

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run(struct emb_table *t, const char *path, bool shuffle)
{
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_snap_result res;
	struct emb_table *back = NULL;
	double t0, t1, t2, t3;
	int rc;

	wo.shuffle = shuffle;
	t0 = now_s();
	rc = emb_snap_write_table(t, path, &wo, &res);
	t1 = now_s();
	if (rc) {
		fprintf(stderr, "write: %s\n", emb_strerror(rc));
		exit(1);
	}
	rc = emb_snap_verify(path, 0, NULL, NULL);
	t2 = now_s();
	if (!rc)
		rc = emb_snap_load_new(path, NULL, &back);
	t3 = now_s();
	if (rc) {
		fprintf(stderr, "load: %s\n", emb_strerror(rc));
		exit(1);
	}
	printf("shuffle=%d rows=%llu raw=%.1f MB file=%.1f MB ratio=%.3f "
	       "write=%.0f MB/s verify=%.0f MB/s load(verify+assign)=%.0f "
	       "MB/s\n",
	       shuffle, (unsigned long long)res.rows, res.raw_bytes / 1e6,
	       res.file_bytes / 1e6,
	       (double)res.raw_bytes / (double)res.file_bytes,
	       res.raw_bytes / 1e6 / (t1 - t0), res.raw_bytes / 1e6 / (t2 - t1),
	       res.raw_bytes / 1e6 / (t3 - t2));
	emb_table_destroy(back);
	unlink(path);
}

int main(int argc, char **argv)
{
	uint32_t rows = argc > 1 ? (uint32_t)atoi(argv[1]) : 1000000;
	uint32_t dim = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
	const char *optim = argc > 3 ? argv[3] : "sgd";
	const char *dir = argc > 4 ? argv[4] : "/tmp";
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table *t;
	uint64_t st = 1, *ids;
	float *g;
	char path[512];
	uint32_t batch = 8192;

	if (emb_optim_parse(optim, &o.optim)) {
		fprintf(stderr, "bad optimizer %s\n", optim);
		return 2;
	}
	o.dim = dim;
	o.init =
	    (struct emb_init_cfg){.kind = EMB_INIT_NORMAL, .a = 0, .b = 0.05f};
	if (emb_table_create(&o, &t))
		return 1;
	ids = malloc(batch * sizeof(*ids));
	g = malloc((size_t)batch * dim * sizeof(float));
	/* Rows trained once, so optimizer state is not all zeros. */
	for (uint32_t done = 0; done < rows; done += batch) {
		uint32_t n = rows - done < batch ? rows - done : batch;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = emb_splitmix64(&st);
		for (size_t j = 0; j < (size_t)n * dim; j++)
			g[j] =
			    (float)(emb_splitmix64(&st) >> 40) / 1.6e7f - 0.5f;
		emb_table_push(t, ids, n, g);
	}
	snprintf(path, sizeof(path), "%s/snapshot_rate.%ld.embs", dir,
		 (long)getpid());
	printf("table: %u rows, dim %u, %s (row floats %u)\n", rows, dim, optim,
	       emb_table_row_floats(t));
	run(t, path, true);
	run(t, path, false);
	emb_table_destroy(t);
	free(ids);
	free(g);
	return 0;
}
