/*
 * tests/tools/test_hist.c - the log-linear latency histogram (common/hist.h)
 * that embstore-bench and the servers' latency metrics rely on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/hist.h"
#include "harness.h"

static struct emb_hist *new_hist(void)
{
	struct emb_hist *h = malloc(sizeof(*h));

	CU_ASSERT_FATAL(h != NULL);
	emb_hist_reset(h);
	return h;
}

static void empty_reports_zero(void)
{
	struct emb_hist *h = new_hist();

	CU_ASSERT_EQUAL(h->count, 0);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 50), 0);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 99.9), 0);
	CU_ASSERT_EQUAL(emb_hist_mean(h), 0.0);
	free(h);
}

static void small_values_are_exact(void)
{
	struct emb_hist *h = new_hist();

	for (uint64_t v = 1; v <= 100; v++)
		emb_hist_record(h, v);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 50), 50);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 99), 99);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 0), 1);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 100), 100);
	CU_ASSERT_EQUAL(h->min, 1);
	CU_ASSERT_EQUAL(h->max, 100);
	CU_ASSERT_DOUBLE_EQUAL(emb_hist_mean(h), 50.5, 1e-9);
	free(h);
}

static void buckets_tile_the_range(void)
{
	uint32_t i;

	CU_ASSERT_EQUAL(emb_hist_bucket_low(0), 0);
	for (i = 0; i < EMB_HIST_BUCKETS; i++) {
		uint64_t lo = emb_hist_bucket_low(i);
		uint64_t hi = emb_hist_bucket_high(i);

		CU_ASSERT_EQUAL(emb_hist_index(lo), i);
		CU_ASSERT_EQUAL(emb_hist_index(hi), i);
		if (i + 1 < EMB_HIST_BUCKETS)
			CU_ASSERT_EQUAL(emb_hist_bucket_low(i + 1), hi + 1);
		/* relative width: at most 1/64 of the bucket's lowest value */
		if (lo >= 128)
			CU_ASSERT(64 * (hi - lo + 1) <= lo);
	}
	CU_ASSERT_EQUAL(emb_hist_bucket_high(EMB_HIST_BUCKETS - 1),
			EMB_HIST_MAX);
	/* 1 us to 100 s, in ns, is inside the range */
	CU_ASSERT(EMB_HIST_MAX >= UINT64_C(100000000000));
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void percentiles_within_bucket_width(void)
{
	enum { N = 100000 };
	static const double ps[] = {1, 10, 50, 90, 99, 99.9};
	struct emb_hist *h = new_hist();
	uint64_t *v = malloc(N * sizeof(*v));
	uint64_t rng = 12345;

	CU_ASSERT_FATAL(v != NULL);
	for (int i = 0; i < N; i++) {
		/* a long tail from 1 us to about 1 s */
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		v[i] = 1000 + ((rng >> 33) % 1000) * ((rng >> 20) % 1000);
		emb_hist_record(h, v[i]);
	}
	qsort(v, N, sizeof(*v), cmp_u64);
	for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
		size_t rank = (size_t)(ps[k] / 100.0 * N + 0.999999);
		double exact = (double)v[rank - 1];
		double got = (double)emb_hist_percentile(h, ps[k]);

		CU_ASSERT(got >= exact);
		CU_ASSERT(got <= exact * (1.0 + 1.0 / 64));
	}
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 100), v[N - 1]);
	free(v);
	free(h);
}

static void huge_values_clamp(void)
{
	struct emb_hist *h = new_hist();

	emb_hist_record(h, UINT64_MAX);
	emb_hist_record(h, EMB_HIST_MAX + 1);
	CU_ASSERT_EQUAL(h->count, 2);
	CU_ASSERT_EQUAL(h->buckets[EMB_HIST_BUCKETS - 1], 2);
	CU_ASSERT_EQUAL(h->max, EMB_HIST_MAX);
	CU_ASSERT_EQUAL(emb_hist_percentile(h, 50), EMB_HIST_MAX);
	free(h);
}

static void merge_equals_one_histogram(void)
{
	struct emb_hist *a = new_hist(), *b = new_hist(), *all = new_hist();

	for (uint64_t v = 0; v < 50000; v++) {
		uint64_t x = v * v % 9999991;

		emb_hist_record(v % 3 ? a : b, x);
		emb_hist_record(all, x);
	}
	emb_hist_merge(a, b);
	CU_ASSERT_EQUAL(a->count, all->count);
	CU_ASSERT_EQUAL(a->sum, all->sum);
	CU_ASSERT_EQUAL(a->min, all->min);
	CU_ASSERT_EQUAL(a->max, all->max);
	CU_ASSERT(memcmp(a->buckets, all->buckets, sizeof(a->buckets)) == 0);
	CU_ASSERT_EQUAL(emb_hist_percentile(a, 99), emb_hist_percentile(all, 99));
	free(a);
	free(b);
	free(all);
}

static void merge_of_empty_keeps_min(void)
{
	struct emb_hist *a = new_hist(), *b = new_hist();

	emb_hist_record(a, 500);
	emb_hist_merge(a, b);
	emb_hist_merge(b, a);
	CU_ASSERT_EQUAL(a->min, 500);
	CU_ASSERT_EQUAL(b->min, 500);
	CU_ASSERT_EQUAL(b->count, 1);
	free(a);
	free(b);
}

static void count_le_counts_whole_buckets(void)
{
	struct emb_hist *h = new_hist();
	uint32_t i = emb_hist_index(10000);

	emb_hist_record(h, 50);
	emb_hist_record(h, 10000);
	emb_hist_record(h, 2000000);
	CU_ASSERT_EQUAL(emb_hist_count_le(h, 49), 0);
	CU_ASSERT_EQUAL(emb_hist_count_le(h, 50), 1);
	CU_ASSERT_EQUAL(emb_hist_count_le(h, emb_hist_bucket_high(i)), 2);
	CU_ASSERT_EQUAL(emb_hist_count_le(h, EMB_HIST_MAX), 3);
	free(h);
}

static const struct emb_test_case cases[] = {
	{"empty histogram reports zero", empty_reports_zero},
	{"values below 128 are exact", small_values_are_exact},
	{"buckets tile the range at most 1/64 wide", buckets_tile_the_range},
	{"percentiles are within one bucket width",
	 percentiles_within_bucket_width},
	{"values above the range clamp to the last bucket", huge_values_clamp},
	{"merging equals recording into one", merge_equals_one_histogram},
	{"merging an empty histogram keeps min", merge_of_empty_keeps_min},
	{"count_le counts whole buckets", count_le_counts_whole_buckets},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "hist", cases);
}
