/*
 * tests/cluster/cut_worker.c - the worker of tests/cluster/netns_cut.sh:
 * joins from the environment with a call deadline of TIMEOUT_MS, then
 * steps (a pull and a push of one batch over every server's slots) until
 * a step fails, and prints how long the failing step took and the error.
 *
 *   cut_worker TIMEOUT_MS
 *
 * Prints "joined" once joined, "steps N" every 50 steps, and at the end
 * "failed after MS ms: CODE_NAME: MESSAGE" (exit 0), or exits 1 when it
 * cannot join or runs 10 minutes without a failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "worker/embstore.h"

#define BATCH 512
#define DIM   8

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec spec = EMB_TABLE_SPEC_DEFAULT;
	static uint64_t ids[BATCH];
	static float rows[BATCH * DIM], grads[BATCH * DIM];
	struct emb_client_table *t;
	struct emb_client *c;
	char msg[512];
	uint64_t start = now_ms(), t0;
	int rc = 0;

	if (argc != 2)
		return 1;
	o.timeout_ms = (uint32_t)strtoul(argv[1], NULL, 10);
	spec.name = "cut";
	spec.dim = DIM;
	if (emb_client_from_env(&o, &c) ||
	    emb_client_table_create(c, &spec, &t)) {
		emb_last_error(msg, sizeof(msg));
		fprintf(stderr, "cannot join: %s\n", msg);
		return 1;
	}
	printf("joined\n");
	fflush(stdout);
	for (uint32_t i = 0; i < BATCH; i++) {
		ids[i] = i * 7919u + 1;
		for (uint32_t j = 0; j < DIM; j++)
			grads[i * DIM + j] = 0.001f;
	}
	for (uint64_t step = 1; now_ms() - start < 600000; step++) {
		t0 = now_ms();
		rc = emb_client_table_pull(t, ids, BATCH, rows, 0, NULL);
		if (!rc)
			rc = emb_client_table_push(t, ids, BATCH, grads, step,
						   emb_client_rank(c));
		if (rc) {
			emb_last_error(msg, sizeof(msg));
			printf("failed after %llu ms: %s: %s\n",
			       (unsigned long long)(now_ms() - t0),
			       emb_err_name(rc), msg);
			fflush(stdout);
			break;
		}
		if (step % 50 == 0) {
			printf("steps %llu\n", (unsigned long long)step);
			fflush(stdout);
		}
	}
	/* The cut server never answers this worker: no goodbye. */
	_Exit(rc ? 0 : 1);
}
