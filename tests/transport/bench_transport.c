/*
 * tests/transport/bench_transport.c - loopback throughput of W1-shaped pulls:
 * one client keeps `depth` requests of `ids` uint64 ids in flight against the
 * echo server's ROWS op, whose replies are iovs straight into its row table
 * (64 floats = 256 bytes per row), and reports rows/s.
 *
 *   bench_transport [transport] [ids] [depth] [seconds] [server loops]
 *                   [big | copy=N]
 *
 * With "big" the reply is one contiguous buffer of the same size (the BIG
 * op) instead of one iov per row: the cost of gathering rows, measured.
 * With "copy=N" the server's transports stage pieces under N bytes
 * (emb_transport_opts.copy_max_bytes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/err.h"
#include "echo.h"
#include "transport/transport.h"

struct slot {
	uint64_t *ids; /* request payload */
	float *rows;   /* response buffer */
	struct emb_mr *ids_mr;
	struct emb_mr *rows_mr;
	struct iovec iov;
	bool done;
	int status;
};

static uint64_t completed; /* pulls answered with status 0 */

static void on_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct slot *s = ctx;

	(void)resp;
	s->done = true;
	s->status = status;
	completed += status == 0;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "tcp";
	uint32_t nids = argc > 2 ? (uint32_t)atoi(argv[2]) : 4096;
	int depth = argc > 3 ? atoi(argv[3]) : 4;
	double secs = argc > 4 ? atof(argv[4]) : 3.0;
	unsigned loops = argc > 5 ? (unsigned)atoi(argv[5]) : 1;
	bool big = argc > 6 && strcmp(argv[6], "big") == 0;
	struct emb_transport_opts so = EMB_TRANSPORT_OPTS_DEFAULT;
	size_t rows_bytes = (size_t)nids * ECHO_ROW_FLOATS * sizeof(float);
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_frame_hdr h = {.opcode = ECHO_OP_ROWS};
	struct emb_transport *tr = NULL;
	struct echo_server *srv = NULL;
	struct emb_conn *c = NULL;
	struct slot *sl;
	uint64_t pulls = 0, next_id = 0;
	double t0, t1, c0, c1;
	int rc;

	if (depth < 1 || nids < 1)
		return 2;
	if (big) {
		h.opcode = ECHO_OP_BIG;
		h.count = (uint32_t)rows_bytes;
	}
	if (argc > 6 && strncmp(argv[6], "copy=", 5) == 0)
		so.copy_max_bytes = (uint32_t)atoi(argv[6] + 5);
	rc = echo_start(name, loops, &so, &srv);
	if (rc == 0)
		rc = emb_transport_create(name, NULL, &tr);
	co.port = rc == 0 ? echo_port(srv) : 0;
	if (rc == 0)
		rc = emb_conn_create(tr, &co, &c);
	if (rc) {
		fprintf(stderr, "bench: setup: %s\n", emb_strerror(rc));
		return 1;
	}
	sl = calloc((size_t)depth, sizeof(*sl));
	for (int i = 0; i < depth; i++) {
		if (emb_transport_buf_alloc(tr, nids * sizeof(uint64_t),
					    (void **)&sl[i].ids,
					    &sl[i].ids_mr) ||
		    emb_transport_buf_alloc(
			tr, rows_bytes, (void **)&sl[i].rows, &sl[i].rows_mr))
			return 1;
		sl[i].iov.iov_base = sl[i].ids;
		sl[i].iov.iov_len = nids * sizeof(uint64_t);
		sl[i].done = true;
	}
	t0 = now_s();
	t1 = t0;
	c0 = cpu_s();
	for (;;) {
		for (int i = 0; i < depth; i++) {
			if (!sl[i].done)
				continue;
			if (sl[i].status) {
				fprintf(stderr, "bench: call: %s\n",
					emb_strerror(sl[i].status));
				return 1;
			}
			for (uint32_t k = 0; k < nids; k++)
				sl[i].ids[k] = next_id++ * 2654435761u;
			sl[i].done = false;
			rc = emb_conn_call(c, &h, &sl[i].iov, 1, sl[i].rows,
					   rows_bytes, on_done, &sl[i]);
			if (rc) {
				fprintf(stderr, "bench: post: %s\n",
					emb_strerror(rc));
				return 1;
			}
		}
		emb_transport_poll(tr, 100);
		t1 = now_s();
		if (t1 - t0 >= secs)
			break;
	}
	pulls = completed;
	c1 = cpu_s();
	for (int i = 0; i < depth; i++)
		while (!sl[i].done)
			emb_transport_poll(tr, 100);
	printf("%s%s copy_max %u: %u ids x %u floats, depth %d, %u loops: "
	       "%llu pulls in %.2f s = %.2f M rows/s, %.2f GiB/s; "
	       "%.0f us cpu (client + server) per pull\n",
	       name, big ? " (contiguous)" : "", so.copy_max_bytes, nids,
	       ECHO_ROW_FLOATS, depth, loops, (unsigned long long)pulls,
	       t1 - t0, (double)pulls * nids / (t1 - t0) / 1e6,
	       (double)pulls * (double)rows_bytes / (t1 - t0) /
		   (1024.0 * 1024 * 1024),
	       pulls ? (c1 - c0) / (double)pulls * 1e6 : 0.0);
	for (int i = 0; i < depth; i++) {
		emb_transport_buf_free(tr, sl[i].ids, sl[i].ids_mr);
		emb_transport_buf_free(tr, sl[i].rows, sl[i].rows_mr);
	}
	free(sl);
	emb_conn_destroy(c);
	emb_transport_destroy(tr);
	echo_stop(srv);
	return 0;
}
