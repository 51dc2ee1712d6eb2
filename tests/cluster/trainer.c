/*
 * tests/cluster/trainer.c - a small training-like job for cluster tests:
 * joins from the environment, pulls and pushes a batch per step, meets the
 * other workers at a barrier each step, then finishes.
 *
 *   trainer [--steps N] [--fail-rank R] [--hang] [--hold FILE]
 *
 * --fail-rank R makes the worker of rank R exit 3 once joined, --hang makes
 * every worker sleep once joined (until a signal), --hold FILE makes it wait
 * once joined until FILE exists (at most 300 s; a job, and so its servers,
 * lasts until every worker finished), then go on. Prints one line on
 * joining ("joined: rank R of W") and one at the end. Single-threaded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/embstore.h"

#define BATCH 256
#define DIM   8

int main(int argc, char **argv)
{
	struct emb_table_spec spec = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = "ctr",
	    .dim = DIM,
	    .optim = {.kind = EMB_OPTIM_SGD, .lr = 0.1f},
	    .init = {.kind = EMB_INIT_UNIFORM, .a = -0.01f, .b = 0.01f},
	    .seed = 1,
	};
	static uint64_t ids[BATCH];
	static float rows[BATCH * DIM], grads[BATCH * DIM];
	struct emb_client_table *t;
	struct emb_client *c;
	long steps = 5, fail_rank = -1;
	const char *hold = NULL;
	int hang = 0, rc;
	uint32_t rank;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atol(argv[++i]);
		else if (!strcmp(argv[i], "--fail-rank") && i + 1 < argc)
			fail_rank = atol(argv[++i]);
		else if (!strcmp(argv[i], "--hang"))
			hang = 1;
		else if (!strcmp(argv[i], "--hold") && i + 1 < argc)
			hold = argv[++i];
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	rc = emb_client_from_env(NULL, &c);
	if (rc) {
		fprintf(stderr, "trainer: join: %s\n", emb_strerror(rc));
		return 1;
	}
	rank = emb_client_rank(c);
	printf("joined: rank %u of %u, %u servers\n", rank,
	       emb_client_nworkers(c), emb_client_nservers(c));
	if ((long)rank == fail_rank) {
		fprintf(stderr, "trainer: rank %u fails on purpose\n", rank);
		return 3;
	}
	while (hang)
		pause();
	for (int i = 0; hold && access(hold, F_OK) != 0; i++) {
		if (i == 3000) {
			fprintf(stderr, "trainer: %s never came\n", hold);
			return 1;
		}
		usleep(100 * 1000);
	}
	rc = emb_client_table_create(c, &spec, &t);
	if (rc) {
		fprintf(stderr, "trainer: table: %s\n", emb_strerror(rc));
		return 1;
	}
	for (long s = 0; s < steps && rc == 0; s++) {
		for (int i = 0; i < BATCH; i++)
			ids[i] = (uint64_t)(s * 7 + i * 13 + rank);
		rc = emb_client_table_pull(t, ids, BATCH, rows, 0, NULL);
		for (int i = 0; rc == 0 && i < BATCH * DIM; i++)
			grads[i] = rows[i] * 0.5f + 0.01f;
		if (rc == 0)
			rc = emb_client_table_push(t, ids, BATCH, grads,
						   (uint64_t)s, rank);
		if (rc == 0)
			rc = emb_client_barrier(c, "step");
	}
	if (rc) {
		fprintf(stderr, "trainer: step failed: %s\n", emb_strerror(rc));
		return 1;
	}
	emb_client_table_close(t);
	rc = emb_client_finish(c);
	emb_client_destroy(c);
	printf("rank %u: %ld steps done, finish: %s\n", rank, steps,
	       emb_strerror(rc));
	return rc ? 1 : 0;
}
