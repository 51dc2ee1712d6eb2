/*
 * tests/tools/test_bench_ids.c - embstore-bench's id streams: Zipf draws
 * follow the distribution, hot rows are scattered, and a seed repeats a run.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "harness.h"

static void parses_distributions(void)
{
	struct emb_dist d;

	CU_ASSERT_EQUAL(emb_dist_parse("uniform", &d), 0);
	CU_ASSERT_EQUAL(d.kind, EMB_DIST_UNIFORM);
	CU_ASSERT_EQUAL(emb_dist_parse("zipf:1.05", &d), 0);
	CU_ASSERT_EQUAL(d.kind, EMB_DIST_ZIPF);
	CU_ASSERT_DOUBLE_EQUAL(d.exponent, 1.05, 1e-12);
	CU_ASSERT(emb_dist_parse("zipf", &d) < 0);
	CU_ASSERT(emb_dist_parse("zipf:", &d) < 0);
	CU_ASSERT(emb_dist_parse("zipf:0", &d) < 0);
	CU_ASSERT(emb_dist_parse("zipf:-1", &d) < 0);
	CU_ASSERT(emb_dist_parse("zipf:1.0x", &d) < 0);
	CU_ASSERT(emb_dist_parse("normal", &d) < 0);
	CU_ASSERT(emb_dist_parse(NULL, &d) < 0);
}

static void rank_map_is_a_bijection(void)
{
	static const uint64_t sizes[] = {1, 2, 3, 64, 1000, 4096, 99991, 100000};
	struct emb_dist d = {.kind = EMB_DIST_UNIFORM};

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		uint64_t n = sizes[k];
		uint8_t *seen = calloc(n, 1);
		struct emb_idgen g;

		CU_ASSERT_FATAL(seen != NULL);
		CU_ASSERT_EQUAL_FATAL(emb_idgen_init(&g, &d, n, 1, 0), 0);
		for (uint64_t r = 0; r < n; r++) {
			uint64_t row = emb_idgen_row(&g, r);

			CU_ASSERT_FATAL(row < n);
			CU_ASSERT(!seen[row]);
			seen[row] = 1;
		}
		/* the two hottest ranks do not land on neighbouring rows */
		if (n >= 1000) {
			int64_t gap = (int64_t)emb_idgen_row(&g, 1) -
				      (int64_t)emb_idgen_row(&g, 0);

			CU_ASSERT(llabs(gap) > 1);
		}
		free(seen);
	}
}

/* Counts draws per row of a Zipf stream over n rows. */
static uint64_t *zipf_counts(double s, uint64_t n, uint64_t draws,
			     struct emb_idgen *g)
{
	struct emb_dist d = {.kind = EMB_DIST_ZIPF, .exponent = s};
	uint64_t *c = calloc(n, sizeof(*c));
	uint64_t buf[1000];

	CU_ASSERT_FATAL(c != NULL);
	CU_ASSERT_EQUAL_FATAL(emb_idgen_init(g, &d, n, 42, 0), 0);
	for (uint64_t i = 0; i < draws / 1000; i++) {
		emb_idgen_fill(g, buf, 1000);
		for (int j = 0; j < 1000; j++) {
			CU_ASSERT_FATAL(buf[j] < n);
			c[buf[j]]++;
		}
	}
	return c;
}

static void zipf_matches_the_distribution(void)
{
	static const double exps[] = {0.8, 1.0, 1.05, 1.5};
	const uint64_t n = 1000, draws = 2000000;

	for (size_t k = 0; k < sizeof(exps) / sizeof(exps[0]); k++) {
		double s = exps[k], z = 0;
		struct emb_idgen g;
		uint64_t *c = zipf_counts(s, n, draws, &g);

		for (uint64_t i = 1; i <= n; i++)
			z += pow((double)i, -s);
		/* ranks 1, 2, 10, 100: within 5 % of k^-s / H(n, s) */
		for (uint64_t rank = 1; rank <= 100; rank *= 10) {
			double want = pow((double)rank, -s) / z;
			double got = (double)c[emb_idgen_row(&g, rank - 1)] /
				     (double)draws;

			CU_ASSERT(fabs(got - want) < 0.05 * want);
		}
		free(c);
	}
}

static void same_seed_repeats_the_stream(void)
{
	struct emb_dist d = {.kind = EMB_DIST_ZIPF, .exponent = 1.05};
	uint64_t a[512], b[512], other[512];
	struct emb_idgen g1, g2, g3;

	emb_idgen_init(&g1, &d, 1000000, 7, 3);
	emb_idgen_init(&g2, &d, 1000000, 7, 3);
	emb_idgen_init(&g3, &d, 1000000, 7, 4);
	emb_idgen_fill(&g1, a, 512);
	emb_idgen_fill(&g2, b, 512);
	emb_idgen_fill(&g3, other, 512);
	CU_ASSERT(memcmp(a, b, sizeof(a)) == 0);
	/* another thread's stream differs */
	CU_ASSERT(memcmp(a, other, sizeof(a)) != 0);
}

static void uniform_covers_all_rows(void)
{
	struct emb_dist d = {.kind = EMB_DIST_UNIFORM};
	uint64_t buf[1000], c[10] = {0};
	struct emb_idgen g;

	CU_ASSERT_EQUAL_FATAL(emb_idgen_init(&g, &d, 10, 5, 0), 0);
	for (int i = 0; i < 100; i++) {
		emb_idgen_fill(&g, buf, 1000);
		for (int j = 0; j < 1000; j++) {
			CU_ASSERT_FATAL(buf[j] < 10);
			c[buf[j]]++;
		}
	}
	for (int r = 0; r < 10; r++)
		CU_ASSERT(c[r] > 9000 && c[r] < 11000);
}

static void rejects_bad_row_counts(void)
{
	struct emb_dist d = {.kind = EMB_DIST_UNIFORM};
	struct emb_idgen g;

	CU_ASSERT(emb_idgen_init(&g, &d, 0, 1, 0) < 0);
	CU_ASSERT(emb_idgen_init(&g, &d, (UINT64_C(1) << 32) + 1, 1, 0) < 0);
	CU_ASSERT_EQUAL(emb_idgen_init(&g, &d, UINT64_C(1) << 32, 1, 0), 0);
}

static const struct emb_test_case cases[] = {
	{"parses uniform and zipf:S only", parses_distributions},
	{"rank to row map is a bijection", rank_map_is_a_bijection},
	{"zipf draws match k^-s", zipf_matches_the_distribution},
	{"same seed and thread repeat the stream", same_seed_repeats_the_stream},
	{"uniform covers every row evenly", uniform_covers_all_rows},
	{"rejects 0 or more than 2^32 rows", rejects_bad_row_counts},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "bench_ids", cases);
}
