/*
 * tests/store/test_pullcopy.c - a pull copies every row exactly, whichever
 * vector copy the CPU gives it. White-box: it lowers emb__pull_vec_max
 * (store/store_int.h) so that the AVX2 copy and the plain one run on a
 * machine with AVX-512 too, and checks each against the initializer's rows
 * for dims whose rows are whole vectors, end in a part of one, or are
 * shorter than one. Also the ways a row leaves the pull's fast path: an
 * absent id, an id created in the same batch and repeated later in it, and
 * a tag shared with another id. And the multiply-and-shift division that
 * finds a record's slab, against the division, at every slab size.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_test.h"

#include "store/store_int.h"

#define NIDS   6000u /* ids per batch: tag collisions (1 in 256) do occur */
#define CANARY 12345.0f

static const uint32_t dims[] = {1, 3, 8, 15, 16, 24, 32, 33, 48, 64, 100, 128, 300};
static const unsigned widths[] = {64, 32, 0};

/* Ids with repeats: every fifth one repeats an earlier position. */
static void make_ids(uint64_t *ids, uint32_t n, uint64_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = i % 5 == 4 ? ids[i / 2] : emb_id_hash(i ^ salt);
}

/* Counts rows of out that differ from the initializer's row of ids[i]. */
static uint32_t bad_rows(const struct emb_table_opts *o, const uint64_t *ids,
			 uint32_t n, const float *out)
{
	float *want = xcalloc(o->dim, sizeof(float));
	uint32_t bad = 0;

	for (uint32_t i = 0; i < n; i++) {
		emb_init_row(&o->init, o->seed, ids[i], want, o->dim);
		if (memcmp(want, out + (size_t)i * o->dim,
			   o->dim * sizeof(float)))
			bad++;
	}
	free(want);
	return bad;
}

static void one(uint32_t dim, unsigned width)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	uint64_t *ids = xcalloc(NIDS, sizeof(*ids));
	uint64_t *mixed = xcalloc(NIDS, sizeof(*mixed));
	float *out = xcalloc((size_t)NIDS * dim + 16, sizeof(float));
	const float **ptrs = xcalloc(NIDS, sizeof(*ptrs));
	uint8_t *found = xcalloc(NIDS, 1);
	struct emb_table *t;
	uint32_t absent = 0, nfound = 0, bad;
	int rc;

	o.name = "pullcopy";
	o.dim = dim;
	o.seed = 77 + dim;
	t = table_new(&o);
	emb__pull_vec_max = width;
	make_ids(ids, NIDS, dim);
	for (uint32_t k = 0; k < 16; k++)
		out[(size_t)NIDS * dim + k] = CANARY;

	/* Creates them (repeats of a new id in the same batch included). */
	rc = emb_table_pull(t, ids, NIDS, out, 0, NULL);
	CU_ASSERT(rc > 0);
	bad = bad_rows(&o, ids, NIDS, out);
	CU_ASSERT_EQUAL(bad, 0);

	/* Again, all present, the plainest pull (rows out, no found[]):
	 * the copies sized for 16, 32, 64 and 128 floats. */
	memset(out, 0, (size_t)NIDS * dim * sizeof(float));
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, NIDS, out, 0, NULL), 0);
	bad = bad_rows(&o, ids, NIDS, out);
	CU_ASSERT_EQUAL(bad, 0);

	/* Again, all present: the fast path, with found[]. */
	memset(out, 0, (size_t)NIDS * dim * sizeof(float));
	memset(found, 0xee, NIDS);
	CU_ASSERT_EQUAL(emb_table_pull(t, ids, NIDS, out, 0, found), 0);
	bad = bad_rows(&o, ids, NIDS, out);
	CU_ASSERT_EQUAL(bad, 0);
	for (uint32_t i = 0; i < NIDS; i++)
		nfound += found[i] == 1;
	CU_ASSERT_EQUAL(nfound, NIDS);

	/* Pointers to the same rows. */
	CU_ASSERT_EQUAL(emb_table_pull_ptrs(t, ids, NIDS, ptrs, 0), 0);
	bad = 0;
	for (uint32_t i = 0; i < NIDS; i++)
		bad += !ptrs[i] || memcmp(ptrs[i], out + (size_t)i * dim,
					  dim * sizeof(float));
	CU_ASSERT_EQUAL(bad, 0);

	/* Half absent, without creating: zeros and found 0 for those. */
	for (uint32_t i = 0; i < NIDS; i++)
		mixed[i] = i % 2 ? ids[i] : emb_id_hash(i + 0x5eed0000ull);
	for (uint32_t i = 0; i < NIDS; i++)
		absent += (i % 2 == 0) && !table_has(t, mixed[i]);
	memset(found, 0xee, NIDS);
	for (size_t i = 0; i < (size_t)NIDS * dim; i++)
		out[i] = -1.0f;
	rc = emb_table_pull(t, mixed, NIDS, out, EMB_PULL_NOCREATE, found);
	CU_ASSERT_EQUAL(rc, (int)absent);
	bad = 0;
	for (uint32_t i = 0; i < NIDS; i++) {
		const float *row = out + (size_t)i * dim;

		if (i % 2) {
			bad += found[i] != 1 || bad_rows(&o, &mixed[i], 1, row);
		} else {
			bad += found[i] != 0;
			for (uint32_t j = 0; j < dim; j++)
				bad += row[j] != 0.0f;
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	for (uint32_t k = 0; k < 16; k++)
		CU_ASSERT_EQUAL(out[(size_t)NIDS * dim + k], CANARY);
	if (bad)
		fprintf(stderr, "\n    dim %u, copy width %u: %u bad", dim,
			width, bad);

	emb__pull_vec_max = 64;
	emb_table_destroy(t);
	free(found);
	free(ptrs);
	free(out);
	free(mixed);
	free(ids);
}

static void test_every_width_and_dim(void)
{
	for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++)
		for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
			one(dims[d], widths[w]);
}

/*
 * A record index is divided by rows_per_slab with a multiply and shift
 * (emb__slab_of); it must agree with the division for every index below
 * 2^24 at every slab size a table can have (size_slabs(): under 600 rows,
 * the check goes to 65535). Checked at the top of the index range, around
 * multiples of the slab size and at random indexes.
 */
static void test_slab_division(void)
{
	uint64_t rng = 1, bad = 0, checks = 0;

	for (uint32_t rps = 1; rps < 65536; rps += rps < 1024 ? 1 : 61) {
		uint64_t div = emb__slab_div(rps);

		for (uint32_t j = 0; j < 2000; j++) {
			uint32_t idx;

			if (j < 500) /* the top of the range */
				idx = (1u << 24) - 1 - j;
			else if (j < 1000) /* either side of a multiple */
				idx = (uint32_t)((emb_splitmix64(&rng) >> 40) /
						 rps * rps) -
				      (j & 1);
			else
				idx = (uint32_t)(emb_splitmix64(&rng) >> 40);
			if (idx >= 1u << 24)
				continue; /* 0 - 1 wrapped */
			bad += emb__slab_of(idx, div) != idx / rps;
			checks++;
		}
	}
	CU_ASSERT(checks > 1000000);
	CU_ASSERT_EQUAL(bad, 0);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"every copy width, every row length", test_every_width_and_dim},
	    {"record index to slab, every slab size", test_slab_division},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "store/pullcopy", cases);
}
