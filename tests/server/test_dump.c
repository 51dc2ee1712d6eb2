/*
 * tests/server/test_dump.c - the server's DUMP_BEGIN / DUMP_CHUNK /
 * DUMP_END handlers (src/server/dump.c) through a raw connection to an
 * in-process server: malformed and out-of-order requests are refused, a
 * session streams every row exactly once with its state, a table dropped
 * during a dump still streams to the end, and a conn that closes mid-dump
 * leaves nothing behind (ASan runs check the last). Single-threaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_dump.h"
#include "proto/wire_msg.h"

#define NIDS 1000u
#define DIM  4u
#define CAP  (4u << 20)

static struct emb_server *srv;
static uint16_t port;
static uint8_t *payload;	   /* 8-aligned response payloads */
static struct emb_wire_limits lim; /* what responses are checked against */

/* Starts the shared server on first use (CUnit must be running). */
static void server_up(void)
{
	struct emb_server_opts o = nt_server_opts();

	if (srv)
		return;
	o.threads = 1;
	srv = nt_server_start(&o);
	port = emb_server_port(srv);
}

/* Sends a DUMP_* request without payload; returns the response status. */
static int dump_call(int fd, uint8_t op, uint32_t table_id, uint32_t count,
		     struct emb_wire_frame *f)
{
	struct emb_frame_hdr hdr = nt_hdr(op, 7, table_id, count, 0);
	uint8_t buf[EMB_WIRE_HDR_SIZE];

	emb_wire_hdr_encode(buf, &hdr);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, sizeof(buf)), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f->hdr, payload, CAP), 0);
	CU_ASSERT_EQUAL(f->hdr.opcode, op | EMB_OP_RESPONSE_BIT);
	f->payload = payload;
	f->lim = &lim;
	return f->hdr.status;
}

/* The id of table name as LIST_TABLES reports it, 0 if none. */
static uint32_t table_id_of(const char *name)
{
	struct emb_frame_hdr hdr = nt_hdr(EMB_OP_LIST_TABLES, 9, 0, 0, 0);
	struct emb_wire_list_resp lr;
	struct emb_wire_table_info info;
	struct emb_wire_frame f = {.payload = payload, .lim = &lim};
	uint8_t buf[EMB_WIRE_HDR_SIZE];
	uint32_t id = 0;
	int fd = nt_raw_connect(port);

	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	emb_wire_hdr_encode(buf, &hdr);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, sizeof(buf)), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, payload, CAP), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_resp_decode(&f, &lr), 0);
	for (uint32_t i = 0; i < lr.n; i++) {
		emb_wire_list_entry(&lr, i, &info);
		if (strcmp(info.spec.name, name) == 0)
			id = info.table_id;
	}
	close(fd);
	return id;
}

static uint32_t table_id_of_d(void)
{
	return table_id_of("d");
}

/* A table "d" with NIDS rows trained once; returns its id. */
static uint32_t make_table(struct emb_client *c, struct emb_client_table **t,
			   uint64_t *ids)
{
	struct emb_table_spec sp = nt_spec("d", DIM, 3);
	float *g = calloc((size_t)NIDS * DIM, sizeof(float));
	uint64_t st = 11;

	sp.optim.kind = EMB_OPTIM_ADAGRAD;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, t), 0);
	for (uint32_t i = 0; i < NIDS; i++)
		ids[i] = emb_splitmix64(&st);
	for (uint32_t j = 0; j < NIDS * DIM; j++)
		g[j] = (float)(j % 13) * 0.1f;
	CU_ASSERT_EQUAL(emb_client_table_push(*t, ids, NIDS, g, 0, 0), 0);
	free(g);
	return table_id_of_d();
}

static void test_out_of_order_and_malformed_refused(void)
{
	struct emb_wire_frame f;
	struct emb_frame_hdr hdr;
	uint8_t buf[EMB_WIRE_HDR_SIZE + 8] = {0};
	int fd;

	server_up();
	fd = nt_raw_connect(port);

	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_CHUNK, 1, 10, &f),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_BEGIN, 999, 0, &f),
			EMB_ENOTABLE);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_BEGIN, 0, 0, &f),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_CHUNK, 1, 0, &f),
			EMB_EBADFRAME);
	/* A payload where none belongs. */
	hdr = nt_hdr(EMB_OP_DUMP_BEGIN, 8, 1, 0, 8);
	emb_wire_hdr_encode(buf, &hdr);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, sizeof(buf)), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &hdr, payload, CAP), 0);
	CU_ASSERT_EQUAL(hdr.status, EMB_EBADFRAME);
	/* END without a session is harmless. */
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_END, 1, 0, &f), 0);
	close(fd);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Streams table id in chunks of `chunk` rows; after the first chunk calls
 * mid(arg). Returns the ids seen (sorted, caller frees) and their count.
 */
static uint64_t *stream(int fd, uint32_t id, uint32_t chunk, uint32_t *n,
			void (*mid)(void *), void *arg, const uint64_t *ids,
			struct emb_client_table *t)
{
	struct emb_wire_dump_info info;
	struct emb_wire_dump_chunk ch;
	struct emb_wire_frame f;
	uint64_t *seen = calloc(2 * NIDS, sizeof(*seen));
	float *w = calloc(DIM, sizeof(float));
	uint32_t got = 0, calls = 0;

	CU_ASSERT_EQUAL_FATAL(dump_call(fd, EMB_OP_DUMP_BEGIN, id, 0, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_dump_info_decode(&f, &info), 0);
	CU_ASSERT_STRING_EQUAL(info.spec.name, "d");
	CU_ASSERT_EQUAL(info.spec.dim, DIM);
	CU_ASSERT_EQUAL(info.row_floats, 2 * DIM);
	CU_ASSERT_EQUAL(info.rows, NIDS);
	for (;;) {
		uint32_t rf = info.row_floats;

		CU_ASSERT_EQUAL_FATAL(
		    dump_call(fd, EMB_OP_DUMP_CHUNK, id, chunk, &f), 0);
		CU_ASSERT_EQUAL_FATAL(emb_wire_dump_chunk_decode(&f, rf, &ch),
				      0);
		CU_ASSERT(ch.n <= chunk);
		if (ch.n == 0)
			break;
		for (uint32_t i = 0; i < ch.n && got < 2 * NIDS; i++) {
			seen[got++] = ch.ids[i];
			/* Adagrad: the accumulator grew from 0.1. */
			CU_ASSERT(ch.rows[i * rf + DIM] >= 0.1f);
			CU_ASSERT(ch.meta[2 * i + 1] >= 1); /* count */
		}
		/* Weights as PULL reports them (first chunk only). */
		if (calls++ == 0 && t) {
			CU_ASSERT_EQUAL(
			    emb_client_table_pull(t, &ch.ids[0], 1, w,
						  EMB_CLIENT_NOCREATE, NULL),
			    0);
			CU_ASSERT(memcmp(w, ch.rows, DIM * sizeof(float)) == 0);
		}
		if (calls == 1 && mid)
			mid(arg);
	}
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_END, id, 0, &f), 0);
	qsort(seen, got, sizeof(*seen), cmp_u64);
	(void)ids;
	free(w);
	*n = got;
	return seen;
}

static void test_session_streams_every_row_once(void)
{
	char addr[64];
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t ids[NIDS], *seen;
	uint32_t n, id;
	int fd;

	server_up();

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	id = make_table(c, &t, ids);
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	seen = stream(fd, id, 37, &n, NULL, NULL, ids, t);
	CU_ASSERT_EQUAL(n, NIDS);
	qsort(ids, NIDS, sizeof(ids[0]), cmp_u64);
	CU_ASSERT(memcmp(seen, ids, NIDS * sizeof(ids[0])) == 0);
	free(seen);
	/* A second session on the same conn starts over. */
	seen = stream(fd, id, 1000000, &n, NULL, NULL, ids, NULL);
	CU_ASSERT_EQUAL(n, NIDS);
	free(seen);
	close(fd);
	CU_ASSERT_EQUAL(emb_client_table_drop(t), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
}

static void drop_table(void *arg)
{
	CU_ASSERT_EQUAL(emb_client_table_drop(arg), 0);
}

static void test_dropped_table_streams_to_the_end(void)
{
	char addr[64];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_wire_frame f;
	uint64_t ids[NIDS], *seen;
	uint32_t n, id;
	int fd;

	server_up();

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	id = make_table(c, &t, ids);
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	seen = stream(fd, id, 100, &n, drop_table, t, ids, NULL);
	CU_ASSERT_EQUAL(n, NIDS);
	free(seen);
	/* The table is gone now. */
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_BEGIN, id, 0, &f),
			EMB_ENOTABLE);
	close(fd);
	emb_client_table_close(t);
	emb_client_destroy(c);
}

static void test_close_mid_dump_frees_session(void)
{
	char addr[64];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_wire_frame f;
	uint64_t ids[NIDS];
	uint32_t id;
	int fd;

	server_up();

	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	id = make_table(c, &t, ids);
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_BEGIN, id, 0, &f), 0);
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_CHUNK, id, 10, &f), 0);
	close(fd);
	/* Only the client's conns remain once the server noticed. */
	CU_ASSERT_EQUAL(nt_server_wait_conns(srv, 1), 1);
	/* The session's table reference is gone: drop frees the table. */
	CU_ASSERT_EQUAL(emb_client_table_drop(t), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
}

/*
 * Streams table id (sgd, zero init, every row pushed alike) with or without
 * EMB_F_CONSISTENT, pushing every row once more after each chunk. Returns
 * how many distinct weight values the rows came with; *step gets the
 * step the server reported.
 */
static uint32_t stream_while_pushing(int fd, uint32_t id, bool consistent,
				     struct emb_client_table *t,
				     const uint64_t *ids, const float *g,
				     uint64_t *step, uint32_t *rows)
{
	struct emb_frame_hdr hdr =
	    nt_hdr(EMB_OP_DUMP_BEGIN, 7, id, 0, 0);
	struct emb_wire_dump_info info;
	struct emb_wire_dump_chunk ch;
	struct emb_wire_frame f = {.payload = payload, .lim = &lim};
	uint8_t buf[EMB_WIRE_HDR_SIZE];
	float vals[8];
	uint32_t nvals = 0;

	hdr.flags = consistent ? EMB_F_CONSISTENT : 0;
	emb_wire_hdr_encode(buf, &hdr);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, sizeof(buf)), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, payload, CAP), 0);
	CU_ASSERT_EQUAL_FATAL(f.hdr.status, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_dump_info_decode(&f, &info), 0);
	CU_ASSERT_EQUAL(!!(info.flags & EMB_WIRE_DUMP_CONSISTENT), consistent);
	*step = info.step;
	*rows = 0;
	for (;;) {
		CU_ASSERT_EQUAL_FATAL(
		    dump_call(fd, EMB_OP_DUMP_CHUNK, id, 50, &f), 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_wire_dump_chunk_decode(&f, info.row_floats, &ch), 0);
		if (ch.n == 0)
			break;
		for (uint32_t i = 0; i < ch.n; i++) {
			float v = ch.rows[i * info.row_floats];
			uint32_t k = 0;

			while (k < nvals && vals[k] != v)
				k++;
			if (k == nvals && nvals < 8)
				vals[nvals++] = v;
		}
		*rows += ch.n;
		CU_ASSERT_EQUAL(emb_client_table_push(t, ids, NIDS, g, 0, 0),
				0);
	}
	CU_ASSERT_EQUAL(dump_call(fd, EMB_OP_DUMP_END, id, 0, &f), 0);
	return nvals;
}

static void test_consistent_session_is_one_instant(void)
{
	char addr[64];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_table_spec sp = nt_spec("cons", DIM, 5);
	uint64_t ids[NIDS], st = 3, step;
	float *g = calloc((size_t)NIDS * DIM, sizeof(float));
	struct emb_wire_frame f;
	uint32_t id, rows, nvals;
	int fd, fd2;

	server_up();
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	sp.init = (struct emb_init_cfg){.kind = EMB_INIT_ZEROS};
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < NIDS; i++)
		ids[i] = emb_splitmix64(&st);
	for (uint32_t j = 0; j < NIDS * DIM; j++)
		g[j] = 1.0f;
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, NIDS, g, 0, 0), 0);
	id = table_id_of("cons");
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	/* A plain dump sees rows of different steps: the test can tell. */
	nvals = stream_while_pushing(fd, id, false, t, ids, g, &step, &rows);
	CU_ASSERT_EQUAL(rows, NIDS);
	CU_ASSERT(nvals > 1);
	/* A consistent one: one value, every row pushed step times. */
	nvals = stream_while_pushing(fd, id, true, t, ids, g, &step, &rows);
	CU_ASSERT_EQUAL(rows, NIDS);
	CU_ASSERT_EQUAL(nvals, 1);
	CU_ASSERT(step > 1);
	/* One view per table: a second consistent BEGIN waits its turn. */
	fd2 = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd2, NULL, 0), 0);
	{
		struct emb_frame_hdr hdr =
		    nt_hdr(EMB_OP_DUMP_BEGIN, 7, id, 0, 0);
		uint8_t buf[EMB_WIRE_HDR_SIZE];

		hdr.flags = EMB_F_CONSISTENT;
		emb_wire_hdr_encode(buf, &hdr);
		CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, sizeof(buf)), 0);
		CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &f.hdr, payload, CAP),
				      0);
		CU_ASSERT_EQUAL(f.hdr.status, 0);
		CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd2, buf, sizeof(buf)), 0);
		CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd2, &f.hdr, payload, CAP),
				      0);
		CU_ASSERT_EQUAL(f.hdr.status, -EBUSY);
	}
	close(fd2);
	close(fd);
	CU_ASSERT_EQUAL(emb_client_table_drop(t), 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	free(g);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"out-of-order and malformed dump requests refused",
	     test_out_of_order_and_malformed_refused},
	    {"a session streams every row once with its state",
	     test_session_streams_every_row_once},
	    {"a table dropped mid-dump streams to the end",
	     test_dropped_table_streams_to_the_end},
	    {"a consistent session is one instant while pushes go on",
	     test_consistent_session_is_one_instant},
	    {"closing a conn mid-dump frees the session",
	     test_close_mid_dump_frees_session},
	    {NULL, NULL},
	};
	int rc;

	lim = EMB_WIRE_LIMITS_DEFAULT;
	payload = aligned_alloc(8, CAP);
	rc = emb_test_main(argc, argv, "tools/server_dump", cases);
	emb_server_destroy(srv);
	free(payload);
	return rc;
}
