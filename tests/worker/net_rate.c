/*
 * tests/worker/net_rate.c - not a test: rows/s of pull or push through the
 * client library against running embstore-servers, one client, one batch in
 * flight, ids uniform over --rows or Zipf(--zipf S) over them, the hot
 * ranks spread over the id space (preloaded first). Meant to be read next
 * to embstore-echo-client's figure for the same batch and row size
 * (docs/net-baselines.md).
 *
 *   net_rate --servers 127.0.0.1:7164 --op pull --dim 64 --batch 4096
 *
 * Single-threaded apart from the client's own network thread.
 */
#include "worker/embstore.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/hist.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"servers", required_argument, NULL, 's'},
		{"op", required_argument, NULL, 'o'},
		{"dim", required_argument, NULL, 'd'},
		{"batch", required_argument, NULL, 'b'},
		{"rows", required_argument, NULL, 'n'},
		{"seconds", required_argument, NULL, 't'},
		{"zipf", required_argument, NULL, 'z'},
		{NULL, 0, NULL, 0},
	};
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = "net_rate",
	    .dim = 64,
	    .optim = EMB_OPTIM_CFG_DEFAULT,
	    .init = EMB_INIT_CFG_DEFAULT,
	    .seed = 1,
	};
	struct emb_client_table *t;
	struct emb_client *c;
	const char *op = "pull";
	uint32_t batch = 4096;
	uint64_t rows = 1u << 20, rng = 1, batches = 0, deadline, end;
	double seconds = 5, zipf = 0, total = 0;
	double *cdf = NULL;
	struct emb_hist *h = malloc(sizeof(*h));
	uint64_t *ids;
	float *buf;
	int rc, ch;

	while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': co.servers = optarg; break;
		case 'o': op = optarg; break;
		case 'd': sp.dim = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'b': batch = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'n': rows = strtoull(optarg, NULL, 10); break;
		case 't': seconds = strtod(optarg, NULL); break;
		case 'z': zipf = strtod(optarg, NULL); break;
		default: return 2;
		}
	}
	if (!h || batch == 0 || rows < batch ||
	    (strcmp(op, "pull") && strcmp(op, "push")))
		return 2;
	ids = malloc((size_t)(batch > 65536 ? batch : 65536) * sizeof(*ids));
	buf = calloc((size_t)(batch > 65536 ? batch : 65536) * sp.dim,
		     sizeof(float));
	rc = ids && buf ? emb_client_create(&co, &c) : -1;
	if (!rc)
		rc = emb_client_table_create(c, &sp, &t);
	if (rc) {
		fprintf(stderr, "net_rate: %s\n", emb_strerror(rc));
		return 1;
	}
	/* Preload every row so the timed pulls create none. */
	for (uint64_t lo = 0; lo < rows && !rc; lo += 65536) {
		uint32_t n = rows - lo < 65536 ? (uint32_t)(rows - lo) : 65536;

		for (uint32_t i = 0; i < n; i++)
			ids[i] = lo + i;
		rc = emb_client_table_pull(t, ids, n, buf, 0, NULL);
	}
	/* Zipf: the inverse of the rank CDF, as tools/redis-compare.sh. */
	if (zipf > 0) {
		cdf = malloc(rows * sizeof(*cdf));
		if (!cdf)
			return 1;
		for (uint64_t r = 0; r < rows; r++)
			cdf[r] = (total += pow((double)(r + 1), -zipf));
		for (uint64_t r = 0; r < rows; r++)
			cdf[r] /= total;
	}
	emb_hist_reset(h);
	deadline = now_ns() + (uint64_t)(seconds * 1e9);
	do {
		uint64_t t0;

		for (uint32_t i = 0; i < batch && !cdf; i++)
			ids[i] = splitmix(&rng) % rows;
		for (uint32_t i = 0; i < batch && cdf; i++) {
			double u = (double)(splitmix(&rng) >> 11) * 0x1.0p-53;
			uint64_t lo = 0, hi = rows - 1;

			while (lo < hi) {
				uint64_t m = (lo + hi) / 2;

				if (cdf[m] < u)
					lo = m + 1;
				else
					hi = m;
			}
			ids[i] = lo * 0x9e3779b1ull % rows;
		}
		t0 = now_ns();
		rc = rc ? rc
			: op[1] == 'u' && op[2] == 'l'
				? emb_client_table_pull(t, ids, batch, buf, 0,
							NULL)
				: emb_client_table_push(t, ids, batch, buf,
							batches, 0);
		end = now_ns();
		emb_hist_record(h, end - t0);
		batches++;
	} while (!rc && end < deadline);
	if (rc) {
		fprintf(stderr, "net_rate: %s\n", emb_strerror(rc));
		return 1;
	}
	{
		double r = (double)batches * batch / ((double)h->sum / 1e9);

		printf("embstore %s dist=%s batch=%" PRIu32 " dim=%" PRIu32
		       " batches=%" PRIu64 " rows_per_s=%.0f MB_per_s=%.1f"
		       " p50_us=%.1f p99_us=%.1f\n",
		       op, cdf ? "zipf" : "uniform", batch, sp.dim, batches, r, r * sp.dim * 4 / 1e6,
		       (double)emb_hist_percentile(h, 50) / 1e3,
		       (double)emb_hist_percentile(h, 99) / 1e3);
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(cdf);
	free(buf);
	free(ids);
	free(h);
	return 0;
}
