/*
 * tests/transport/rdma_bench.c - reply throughput of a transport: a server
 * loop in its own thread answers each call with 1 MiB made of 4096 x 256 B
 * row iovecs scattered over a registered table (zero copy on RDMA); the
 * client keeps `window` calls in flight into registered response buffers.
 * Run by hand, not by meson test:
 *
 *   rdma_bench [transport=rdma] [host=$RDMA_VM_IP|127.0.0.1] [seconds=5]
 *              [window=4] [reg=1]
 *
 * reg=0 leaves the table unregistered (staged copies) and the response
 * buffers plain (bounced), to show what registration saves.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "proto/wire.h"
#include "transport/transport.h"

#define ROWS 4096u
#define ROW_BYTES 256u
#define TABLE_ROWS 65536u
#define RESP_BYTES (ROWS * ROW_BYTES)

struct bench_srv {
	struct emb_transport *tr;
	char *table;
	struct iovec iov[ROWS];
	uint32_t turn;	/* varies which rows each reply sends */
};

static void on_request(void *arg, struct emb_conn *c, struct emb_req *r,
		       const struct emb_frame_hdr *h, void *payload)
{
	struct bench_srv *s = arg;
	struct emb_frame_hdr rh = {.opcode = h->opcode | EMB_OP_RESPONSE_BIT,
				   .count = ROWS};

	(void)c;
	(void)payload;
	s->turn++;
	for (uint32_t i = 0; i < ROWS; i++) {
		uint32_t row = (i * 16u + s->turn) % TABLE_ROWS;

		s->iov[i].iov_base = s->table + (size_t)row * ROW_BYTES;
		s->iov[i].iov_len = ROW_BYTES;
	}
	emb_conn_reply(r, &rh, s->iov, ROWS, NULL, NULL);
}

static void *srv_main(void *arg)
{
	struct bench_srv *s = arg;

	emb_transport_run(s->tr);
	return NULL;
}

struct slot {
	bool done;
	int status;
};

static void on_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct slot *sl = ctx;

	(void)resp;
	sl->done = true;
	sl->status = status;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *tname = argc > 1 ? argv[1] : "rdma";
	const char *host = getenv("RDMA_VM_IP");
	double secs = argc > 3 ? atof(argv[3]) : 5;
	int window = argc > 4 ? atoi(argv[4]) : 4;
	int reg = argc > 5 ? atoi(argv[5]) : 1;
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_listener *l = NULL;
	struct emb_transport *tr = NULL;
	struct emb_mr *tmr = NULL, *rmr[64] = {0};
	void *resp[64];
	struct slot sl[64];
	struct emb_conn *c = NULL;
	struct bench_srv s = {0};
	struct emb_frame_hdr h = {.opcode = 6};
	uint64_t replies = 0;
	double t0, t1;
	pthread_t th;
	int rc, err = 0;

	if (argc > 2)
		host = argv[2];
	if (!host)
		host = "127.0.0.1";
	if (window < 1 || window > 64)
		window = 4;
	rc = emb_transport_create(tname, NULL, &s.tr);
	if (!rc)
		rc = emb_transport_create(tname, NULL, &tr);
	if (rc) {
		fprintf(stderr, "rdma_bench: %s: %s\n", tname, emb_strerror(rc));
		return rc == -ENODEV ? 77 : 1;
	}
	s.table = aligned_alloc(4096, (size_t)TABLE_ROWS * ROW_BYTES);
	if (!s.table)
		return 1;
	memset(s.table, 0x5a, (size_t)TABLE_ROWS * ROW_BYTES);
	if (reg && emb_transport_reg_mem(s.tr, s.table,
					 (size_t)TABLE_ROWS * ROW_BYTES, &tmr))
		return 1;
	lo.host = host;
	lo.on_request = on_request;
	lo.arg = &s;
	if (emb_listener_create(s.tr, &lo, &l))
		return 1;
	if (pthread_create(&th, NULL, srv_main, &s))
		return 1;
	co.host = host;
	co.port = emb_listener_port(l);
	rc = emb_conn_create(tr, &co, &c);
	if (rc) {
		fprintf(stderr, "rdma_bench: connect: %s\n", emb_strerror(rc));
		return 1;
	}
	for (int i = 0; i < window; i++) {
		if (reg)
			rc = emb_transport_buf_alloc(tr, RESP_BYTES, &resp[i],
						     &rmr[i]);
		else
			rc = (resp[i] = malloc(RESP_BYTES)) ? 0 : -ENOMEM;
		if (rc)
			return 1;
		sl[i] = (struct slot){.done = true};
	}
	t0 = now_s();
	t1 = t0;
	while (t1 - t0 < secs && !err) {
		for (int i = 0; i < window && !err; i++) {
			if (!sl[i].done)
				continue;
			err = sl[i].status;
			if (err)
				break;
			if (t1 > t0)
				replies++;
			sl[i].done = false;
			err = emb_conn_call(c, &h, NULL, 0, resp[i], RESP_BYTES,
					    on_done, &sl[i]);
			if (err)
				sl[i].done = true;
		}
		emb_transport_poll(tr, 10);
		t1 = now_s();
	}
	if (err)
		fprintf(stderr, "rdma_bench: call: %s\n", emb_strerror(err));
	printf("%s reg=%d window=%d: %llu replies of %u x %u B in %.2f s: "
	       "%.1f MB/s, %.1f replies/s\n",
	       tname, reg, window, (unsigned long long)replies, ROWS, ROW_BYTES,
	       t1 - t0, (double)replies * RESP_BYTES / (t1 - t0) / 1e6,
	       (double)replies / (t1 - t0));
	for (int i = 0; i < window; i++)
		while (!sl[i].done)
			emb_transport_poll(tr, 10);
	emb_conn_destroy(c);
	emb_transport_stop(s.tr);
	pthread_join(th, NULL);
	emb_listener_destroy(l);
	for (int i = 0; i < window; i++) {
		if (reg)
			emb_transport_buf_free(tr, resp[i], rmr[i]);
		else
			free(resp[i]);
	}
	emb_transport_dereg_mem(s.tr, tmr);
	emb_transport_destroy(s.tr);
	emb_transport_destroy(tr);
	free(s.table);
	return err ? 1 : 0;
}
