/*
 * tests/cache/cache_sim.c - hit ratio and traffic of the vocab cache on a
 * Zipf id stream, against the uncached path that fetches every distinct id
 * of each batch. Not a test: run it by hand (docs/cache.md has figures).
 *
 *   cache_sim [-n ids] [-c capacity] [-b batch] [-d dim] [-s zipf_s]
 *             [-t steps] [-w warmup_steps] [-S staleness] [-m wt|wb]
 *             [-k depth] [-p lru|clock|tinylfu] [-r seed]
 *
 * Besides the cache's hit ratio it prints the static ideal: the share of
 * each batch's distinct ids among the capacity most popular ids, which is
 * what a cache holding exactly those (and nothing else) would hit.
 *
 * The backend is a stub that answers fetches at once (writing the rows so
 * the copies cost what they would) and counts what it is sent. Single
 * thread; prints to stdout.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/dedup.h"
#include "common/err.h"
#include "common/hash.h"

/* Rejection-inversion sampling of Zipf(s) over 1..n (Hormann & Derflinger
 * 1996), O(1) per draw without a table. */
struct zipf {
	double s;    /* exponent */
	double n;    /* ranks */
	double h_x1; /* H(1.5) - 1 */
	double h_n;  /* H(n + 0.5) */
	double cut;  /* 2 - Hinv(H(2.5) - h(2)) */
};

static double helper1(double x)
{
	return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x / 2.0;
}

static double helper2(double x)
{
	return fabs(x) > 1e-8 ? expm1(x) / x : 1.0 + x / 2.0;
}

static double zh(const struct zipf *z, double x)
{
	return exp(-z->s * log(x));
}

static double zH(const struct zipf *z, double x)
{
	double lx = log(x);

	return helper2((1.0 - z->s) * lx) * lx;
}

static double zHinv(const struct zipf *z, double x)
{
	double t = x * (1.0 - z->s);

	if (t < -1.0)
		t = -1.0;
	return exp(helper1(t) * x);
}

static void zipf_init(struct zipf *z, double s, uint64_t n)
{
	z->s = s;
	z->n = (double)n;
	z->h_x1 = zH(z, 1.5) - 1.0;
	z->h_n = zH(z, z->n + 0.5);
	z->cut = 2.0 - zHinv(z, zH(z, 2.5) - zh(z, 2.0));
}

static uint64_t zipf_draw(const struct zipf *z, uint64_t *rng)
{
	for (;;) {
		double u01 = (double)(emb_splitmix64(rng) >> 11) * 0x1.0p-53;
		double u = z->h_n + u01 * (z->h_x1 - z->h_n);
		double x = zHinv(z, u);
		double k = floor(x + 0.5);

		if (k < 1.0)
			k = 1.0;
		else if (k > z->n)
			k = z->n;
		if (k - x <= z->cut || u >= zH(z, k + 0.5) - zh(z, k))
			return (uint64_t)k;
	}
}

struct stub {
	uint64_t rows_fetched; /* rows asked for */
	uint64_t rows_written; /* rows written back */
	uint64_t rows_pushed;  /* gradient rows pushed */
};

static int64_t stub_fetch_start(void *arg, const uint64_t *ids, uint32_t n,
				float *dst, uint32_t stride)
{
	struct stub *sb = arg;

	(void)ids;
	sb->rows_fetched += n;
	memset(dst, 0, (size_t)n * stride * sizeof(float));
	return 0;
}

static int stub_fetch_wait(void *arg, int64_t token, bool block)
{
	(void)arg;
	(void)token;
	(void)block;
	return 0;
}

static int stub_push(void *arg, const uint64_t *ids, uint32_t n,
		     const float *grads)
{
	struct stub *sb = arg;

	(void)ids;
	(void)grads;
	sb->rows_pushed += n;
	return 0;
}

static int stub_write_back(void *arg, const uint64_t *ids, uint32_t n,
			   const float *rows, uint32_t stride)
{
	struct stub *sb = arg;

	(void)ids;
	(void)rows;
	(void)stride;
	sb->rows_written += n;
	return 0;
}

/* CPU time of this thread: other jobs on the machine do not inflate it. */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	struct emb_cache_opts o = EMB_CACHE_OPTS_DEFAULT;
	uint64_t nids = 10000000, rng = 1;
	uint32_t steps = 3000, warmup = 2000, depth = 2, ring;
	double s = 1.05, t_cache = 0.0, t_lookup = 0.0, t_prefetch = 0.0;
	double t_uncached = 0.0;
	float *resp;
	struct emb_cache_stats st0 = {0}, st;
	struct emb_cache *c = NULL;
	struct emb_dedup *d = NULL;
	struct stub sb = {0}, sb0 = {0};
	uint64_t **ids, *uniq, uncached_rows = 0, ideal_hits = 0;
	uint32_t **ranks, *inv;
	uint8_t *hot;
	float *out, *grads;
	struct zipf z;
	int opt, rc;

	o.capacity = 1000000;
	o.dim = 64;
	o.max_batch = 4096;
	o.staleness_steps = UINT32_MAX;
	o.optim.kind = EMB_OPTIM_ADAGRAD;
	while ((opt = getopt(argc, argv, "n:c:b:d:s:t:w:S:m:k:p:r:")) != -1) {
		switch (opt) {
		case 'n':
			nids = strtoull(optarg, NULL, 0);
			break;
		case 'c':
			o.capacity = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'b':
			o.max_batch = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'd':
			o.dim = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 's':
			s = strtod(optarg, NULL);
			break;
		case 't':
			steps = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'w':
			warmup = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'S':
			o.staleness_steps = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'p':
			if (strcmp(optarg, "clock") == 0)
				o.policy = EMB_CACHE_CLOCK;
			else if (strcmp(optarg, "lru") == 0)
				o.policy = EMB_CACHE_LRU;
			else
				o.policy = EMB_CACHE_TINYLFU;
			break;
		case 'r':
			rng = strtoull(optarg, NULL, 0);
			break;
		case 'k':
			depth = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'm':
			o.mode = strcmp(optarg, "wb") == 0
				     ? EMB_CACHE_WRITE_BACK
				     : EMB_CACHE_WRITE_THROUGH;
			break;
		default:
			fprintf(stderr, "usage: see tests/cache/cache_sim.c\n");
			return 2;
		}
	}
	o.prefetch_depth = depth;
	o.ops.fetch_start = stub_fetch_start;
	o.ops.fetch_wait = stub_fetch_wait;
	o.ops.push = stub_push;
	o.ops.write_back = stub_write_back;
	o.arg = &sb;
	rc = emb_cache_create(&o, &c);
	if (rc) {
		fprintf(stderr, "cache: %s\n", emb_strerror(rc));
		return 1;
	}
	if (emb_dedup_create(o.max_batch, &d))
		return 1;
	ring = depth + 1;
	ids = calloc(ring, sizeof(*ids));
	ranks = calloc(ring, sizeof(*ranks));
	for (uint32_t i = 0; i < ring; i++) {
		ids[i] = malloc(o.max_batch * sizeof(**ids));
		ranks[i] = malloc(o.max_batch * sizeof(**ranks));
	}
	hot = malloc(o.max_batch);
	uniq = malloc(o.max_batch * sizeof(*uniq));
	inv = malloc(o.max_batch * sizeof(*inv));
	out = malloc((size_t)o.max_batch * o.dim * sizeof(float));
	grads = calloc((size_t)o.max_batch * o.dim, sizeof(float));
	resp = calloc((size_t)o.max_batch * o.dim, sizeof(float));
	if (!uniq || !inv || !out || !grads || !resp || !hot)
		return 1;
	zipf_init(&z, s, nids);

	/* Batch b lives in ids[b % ring]; it is drawn when prefetched. */
	for (uint32_t b = 0; b < warmup + steps + depth; b++) {
		uint64_t *cur = ids[b % ring];
		double t0, t1, t2;

		if (b >= warmup + steps) {
			/* Drain: no more batches to draw. */
		} else {
			/* Ranks scattered over the id space, as real ids are.
			 */
			for (uint32_t i = 0; i < o.max_batch; i++) {
				uint64_t r = zipf_draw(&z, &rng);

				ranks[b % ring][i] = (uint32_t)r;
				cur[i] = emb_id_hash(r);
			}
		}
		if (b == warmup + depth) {
			emb_cache_stats(c, &st0);
			sb0 = sb;
			t_cache = 0.0;
			t_lookup = 0.0;
			t_prefetch = 0.0;
		}
		t0 = now_s();
		/* The trainer's order: look up batch b - depth, queue batch
		 * b, then compute and update. */
		if (b >= depth) {
			uint64_t *use = ids[(b - depth) % ring];

			rc = emb_cache_lookup(c, use, o.max_batch, out);
			t1 = now_s();
			t_lookup += t1 - t0;
			if (!rc && depth && b < warmup + steps)
				rc = emb_cache_prefetch(c, cur, o.max_batch);
			t2 = now_s();
			t_prefetch += t2 - t1;
			if (!rc)
				rc = emb_cache_update(c, grads);
			if (rc) {
				fprintf(stderr, "step: %s\n", emb_strerror(rc));
				return 1;
			}
			t_cache += now_s() - t0;
			if (b >= warmup + depth) {
				/* What the uncached path costs the worker's CPU
				 * at least: dedup, then scatter the response
				 * rows to every position. */
				double u0 = now_s();
				int nu = emb_dedup_run(d, use, o.max_batch,
						       uniq, inv);
				const uint32_t *rk = ranks[(b - depth) % ring];

				for (uint32_t i = 0; i < o.max_batch; i++)
					memcpy(out + (size_t)i * o.dim,
					       resp + (size_t)inv[i] * o.dim,
					       o.dim * sizeof(float));
				t_uncached += now_s() - u0;
				uncached_rows += (uint64_t)nu;
				/* Static ideal: distinct ids among the
				 * capacity hottest ranks. */
				memset(hot, 0, (size_t)nu);
				for (uint32_t i = 0; i < o.max_batch; i++)
					hot[inv[i]] = rk[i] <= o.capacity;
				for (int u = 0; u < nu; u++)
					ideal_hits += hot[u];
			}
		} else if (depth) {
			rc = emb_cache_prefetch(c, cur, o.max_batch);
			if (rc) {
				fprintf(stderr, "prefetch: %s\n",
					emb_strerror(rc));
				return 1;
			}
		}
	}
	/* Steady state: the final flush is not part of any step. */
	emb_cache_stats(c, &st);

	{
		uint64_t hits = st.hits - st0.hits,
			 miss = st.misses - st0.misses;
		double rowb = (double)emb_cache_row_floats(c) * sizeof(float);
		double wb = (double)o.dim * sizeof(float);
		double fetched = (double)(sb.rows_fetched - sb0.rows_fetched);
		double written = (double)(sb.rows_written - sb0.rows_written);
		double pushed = (double)(sb.rows_pushed - sb0.rows_pushed);
		double total = fetched * rowb + written * rowb + pushed * wb;

		printf("ids %llu zipf %.2f capacity %u batch %u dim %u mode %s "
		       "policy %s staleness %u depth %u warmup %u steps %u\n",
		       (unsigned long long)nids, s, o.capacity, o.max_batch,
		       o.dim, o.mode ? "write-back" : "write-through",
		       o.policy == EMB_CACHE_TINYLFU ? "tinylfu"
		       : o.policy == EMB_CACHE_CLOCK ? "clock"
						     : "lru",
		       o.staleness_steps, depth, warmup, steps);
		printf("distinct ids per batch      %.1f\n",
		       (double)uncached_rows / steps);
		printf("hit ratio (distinct ids)    %.4f\n",
		       (double)hits / (double)(hits + miss));
		printf("static ideal (hottest %u)  %.4f\n", o.capacity,
		       (double)ideal_hits / (double)uncached_rows);
		printf("admitted / rejected / step  %.1f / %.1f\n",
		       (double)(st.admitted - st0.admitted) / steps,
		       (double)(st.rejected - st0.rejected) / steps);
		printf("rows fetched per step       %.1f (uncached %.1f)\n",
		       fetched / steps, (double)uncached_rows / steps);
		printf("bytes fetched per step      %.0f (uncached %.0f) = "
		       "%.3fx\n",
		       fetched * rowb / steps,
		       (double)uncached_rows * wb / steps,
		       fetched * rowb / ((double)uncached_rows * wb));
		printf("rows written back per step  %.1f (%.0f bytes)\n",
		       written / steps, written * rowb / steps);
		printf("rows pushed per step        %.1f (%.0f bytes)\n",
		       pushed / steps, pushed * wb / steps);
		printf("traffic per step            %.0f (uncached pull + push "
		       "%.0f) = %.3fx\n",
		       total / steps, 2.0 * (double)uncached_rows * wb / steps,
		       total / (2.0 * (double)uncached_rows * wb));
		printf("refetches per step          %.1f\n",
		       (double)(st.refetches - st0.refetches) / steps);
		printf("cache CPU time per step     %.1f us (prefetch + lookup "
		       "+ update)\n",
		       t_cache / steps * 1e6);
		printf("  of which lookup %.1f us, prefetch %.1f us, update "
		       "%.1f us\n",
		       t_lookup / steps * 1e6, t_prefetch / steps * 1e6,
		       (t_cache - t_lookup - t_prefetch) / steps * 1e6);
		printf(
		    "uncached worker CPU per step %.1f us (dedup + scatter of "
		    "the response), plus the wire: %.0f us at 25 Gb/s\n",
		    t_uncached / steps * 1e6,
		    (double)uncached_rows * wb / steps / (25e9 / 8) * 1e6);
		printf("stalls %llu evictions %llu rows %u\n",
		       (unsigned long long)(st.stalls - st0.stalls),
		       (unsigned long long)(st.evictions - st0.evictions),
		       st.rows);
	}
	for (uint32_t i = 0; i < ring; i++) {
		free(ids[i]);
		free(ranks[i]);
	}
	free(ids);
	free(ranks);
	free(hot);
	free(uniq);
	free(inv);
	free(out);
	free(grads);
	free(resp);
	emb_dedup_destroy(d);
	emb_cache_flush(c);
	emb_cache_destroy(c);
	return 0;
}
