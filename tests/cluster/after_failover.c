/*
 * tests/cluster/after_failover.c - a worker for tests/cluster/
 * after_failover.sh: the calls that go to every server, made after a
 * failover of a replicated cluster.
 *
 *   after_failover GO_FILE DONE_FILE [LOST_FILE]
 *
 * Joins from the environment, creates table "before" and pushes to it,
 * prints "ready: sched HOST:PORT", then waits (at most 60 s) for GO_FILE,
 * which the test makes once a server was killed and this worker's map
 * failed over. Then it creates table "after", opens it again by name,
 * pushes to it through one handle and pulls through the other (every row
 * must read what was pushed), pushes to "before" again and reads both
 * tables' stats (the removed server must not be counted). Prints
 * "after: ok" and waits for DONE_FILE (at most 60 s), so that `embstore
 * stat` sees the tables, then exits 0; 1 on any failure, with the reason.
 * With LOST_FILE, the test kills a second server instead and makes
 * LOST_FILE once this worker's map lost slots: creating a table must then
 * fail with EMB_ENODEAD and say so ("lost: ok ..."), and the worker exits 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/embstore.h"

#define N   2000
#define DIM 4

static struct emb_table_spec spec(const char *name)
{
	struct emb_table_spec s = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = name,
	    .dim = DIM,
	    .optim = {.kind = EMB_OPTIM_SGD, .lr = 1.0f},
	    .init = {.kind = EMB_INIT_ZEROS},
	    .seed = 1,
	};

	return s;
}

/* Waits up to 60 s for path to exist. */
static int wait_file(const char *path)
{
	for (int i = 0; i < 600; i++) {
		if (access(path, F_OK) == 0)
			return 0;
		usleep(100 * 1000);
	}
	fprintf(stderr, "after_failover: no %s after 60 s\n", path);
	return -1;
}

static int fail(struct emb_client *c, const char *what, int rc)
{
	char msg[256];

	emb_client_last_error(c, msg, sizeof(msg));
	fprintf(stderr, "after_failover: %s: %s%s%s\n", what, emb_strerror(rc),
		msg[0] ? ": " : "", msg);
	return 1;
}

int main(int argc, char **argv)
{
	static uint64_t ids[N];
	static float grads[N * DIM], rows[N * DIM];
	struct emb_table_spec sb = spec("before"), sa = spec("after");
	struct emb_client_table *before, *after, *opened;
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_map m = EMB_SIZED(struct emb_client_map);
	struct emb_client *c;
	const char *host = getenv("EMB_SCHED_HOST");
	const char *port = getenv("EMB_SCHED_PORT");
	int rc;

	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: after_failover GO_FILE DONE_FILE "
				"[LOST_FILE]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = (uint64_t)i * 7919u + 1;
	for (uint32_t i = 0; i < N * DIM; i++)
		grads[i] = -1.0f; /* SGD, lr 1: every value becomes 1 */
	rc = emb_client_from_env(NULL, &c);
	if (rc) {
		fprintf(stderr, "after_failover: join: %s\n", emb_strerror(rc));
		return 1;
	}
	rc = emb_client_table_create(c, &sb, &before);
	if (rc)
		return fail(c, "create before", rc);
	rc = emb_client_table_push(before, ids, N, grads, 0, 0);
	if (rc)
		return fail(c, "push before", rc);
	printf("ready: sched %s:%s\n", host ? host : "?", port ? port : "?");
	if (wait_file(argv[1]))
		return 1;
	emb_client_map(c, &m);
	printf("map epoch %llu, %u replicas, %u lost slots\n",
	       (unsigned long long)m.epoch, m.replicas, m.lost_slots);
	rc = emb_client_table_create(c, &sa, &after);
	if (rc)
		return fail(c, "create after the failover", rc);
	rc = emb_client_table_open(c, "after", &opened);
	if (rc)
		return fail(c, "open after the failover", rc);
	rc = emb_client_table_push(after, ids, N, grads, 0, 0);
	if (rc)
		return fail(c, "push after", rc);
	rc = emb_client_table_pull(opened, ids, N, rows, 0, NULL);
	if (rc)
		return fail(c, "pull after", rc);
	for (uint32_t i = 0; i < N * DIM; i++)
		if (rows[i] != 1.0f) {
			fprintf(stderr,
				"after_failover: row %llu reads %g, not 1\n",
				(unsigned long long)ids[i / DIM], rows[i]);
			return 1;
		}
	rc = emb_client_table_push(before, ids, N, grads, 1, 0);
	if (!rc)
		rc = emb_client_table_pull(before, ids, N, rows, 0, NULL);
	if (rc)
		return fail(c, "push and pull before", rc);
	for (uint32_t i = 0; i < N * DIM; i++)
		if (rows[i] != 2.0f) {
			fprintf(stderr,
				"after_failover: before's row %llu reads %g, "
				"not 2\n",
				(unsigned long long)ids[i / DIM], rows[i]);
			return 1;
		}
	rc = emb_client_table_stats(opened, &st);
	if (rc)
		return fail(c, "stats", rc);
	/* Every id is pushed to every live holder: one copy of the slots
	 * that lost a holder, two of the others. */
	if (st.servers != emb_client_nservers(c) - 1 || st.rows < N ||
	    st.rows > 2 * N) {
		fprintf(stderr,
			"after_failover: stats: %u servers, %llu rows (want "
			"%u servers, %u..%u rows)\n",
			st.servers, (unsigned long long)st.rows,
			emb_client_nservers(c) - 1, N, 2 * N);
		return 1;
	}
	emb_client_table_close(opened);
	emb_client_table_close(after);
	emb_client_table_close(before);
	printf("after: ok, %u servers answered, %llu row copies\n", st.servers,
	       (unsigned long long)st.rows);
	if (argc == 4) {
		char msg[256];

		if (wait_file(argv[3]))
			return 1;
		sa.name = "lost";
		rc = emb_client_table_create(c, &sa, &after);
		emb_client_last_error(c, msg, sizeof(msg));
		if (rc != EMB_ENODEAD || !strstr(msg, "have no live copy")) {
			fprintf(stderr,
				"after_failover: create with lost slots: %s "
				"(%s), not EMB_ENODEAD\n",
				emb_strerror(rc), msg);
			return 1;
		}
		printf("lost: ok, %s: %s\n", emb_strerror(rc), msg);
		emb_client_destroy(c);
		return 0;
	}
	if (wait_file(argv[2]))
		return 1;
	rc = emb_client_finish(c);
	emb_client_destroy(c);
	return rc ? 1 : 0;
}
