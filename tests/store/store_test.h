/*
 * tests/store/store_test.h - small helpers shared by the store suites: a
 * seeded random stream, table construction, and reference rows computed with
 * the common code the table is specified against (emb_init_row,
 * emb_optim_state_init, emb_optim_apply). Static inline so each test
 * executable stays one file; single-threaded unless a helper says otherwise.
 */
#ifndef EMB_TESTS_STORE_TEST_H
#define EMB_TESTS_STORE_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "common/err.h"
#include "common/hash.h"
#include "store/store.h"

/* Uniform in [0, n) from a splitmix64 stream; n > 0. */
static inline uint32_t rnd_below(uint64_t *st, uint32_t n)
{
	return emb_fastrange32((uint32_t)(emb_splitmix64(st) >> 32), n);
}

static inline void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	return p;
}

/* Creates a table or fails the test case; prints the code on failure. */
static inline struct emb_table *table_new(const struct emb_table_opts *o)
{
	struct emb_table *t = NULL;
	int rc = emb_table_create(o, &t);

	if (rc)
		fprintf(stderr, "\n    emb_table_create: %d (%s)", rc,
			emb_strerror(rc));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	return t;
}

static inline struct emb_table_stats table_stats(struct emb_table *t)
{
	struct emb_table_stats s;

	memset(&s, 0xa5, sizeof(s));
	emb_table_stats(t, &s);
	return s;
}

/* The full row (weights, then fresh optimizer state) a new id gets. */
static inline void ref_new_row(const struct emb_table_opts *o, uint64_t id,
			       float *row)
{
	emb_init_row(&o->init, o->seed, id, row, o->dim);
	emb_optim_state_init(&o->optim, row + o->dim, o->dim);
}

static inline uint32_t ref_row_floats(const struct emb_table_opts *o)
{
	return o->dim + emb_optim_state_floats(o->optim.kind, o->dim);
}

/* Whether id is in the table, asked without creating it. */
static inline bool table_has(struct emb_table *t, uint64_t id)
{
	float *w = xcalloc(emb_table_dim(t), sizeof(float));
	uint8_t found = 0xee;
	int rc = emb_table_pull(t, &id, 1, w, EMB_PULL_NOCREATE, &found);

	free(w);
	CU_ASSERT(rc == 0 || rc == 1);
	CU_ASSERT(found == (rc == 0));
	return rc == 0;
}

/* Prints the first few float mismatches; counts all of them in *bad. */
static inline void expect_floats(const char *what, uint64_t id,
				 const float *got, const float *want,
				 uint32_t n, int *bad)
{
	for (uint32_t i = 0; i < n; i++) {
		if (memcmp(&got[i], &want[i], sizeof(float)) == 0)
			continue;
		if ((*bad)++ < 5)
			fprintf(stderr,
				"\n    %s id %llu [%u]: expected %.9g got %.9g",
				what, (unsigned long long)id, i, want[i],
				got[i]);
	}
}

#endif
