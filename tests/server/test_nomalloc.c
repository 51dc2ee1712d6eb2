/*
 * tests/server/test_nomalloc.c - once warmed up, an in-process server
 * serves PULL and PUSH requests over loopback TCP without one allocation:
 * no reply buffer or reply context per request (they come from the loop's
 * pools), and no scratch per batch in the store. A raw peer on this
 * thread sends the requests from buffers made beforehand, so every
 * allocation counted (tests/alloc_count.h) is the server's. Under
 * AddressSanitizer only the counts go unchecked.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "alloc_count.h"
#include "harness.h"
#include "netutil.h"

#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_msg.h"

#define DIM	 64u
#define NROWS	 8192u
#define BATCH	 1024u
#define NREQS	 100

static uint8_t *payload; /* responses land here */

static void send_iovs(int fd, struct emb_wire_iovs *w)
{
	size_t off = 0;

	/* writev may write part: the rest goes out by plain sends. */
	for (int i = 0; i < w->iovcnt; i++) {
		CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, w->iov[i].iov_base,
						  w->iov[i].iov_len),
				      0);
		off += w->iov[i].iov_len;
	}
	CU_ASSERT_EQUAL(off, w->nbytes);
}

static void pull(int fd, uint32_t table, const uint64_t *ids, uint32_t n,
		 uint16_t flags, struct emb_wire_iovs *w)
{
	struct emb_frame_hdr hdr;

	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_req_encode(w, 1, table, flags, ids, n), 0);
	send_iovs(fd, w);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &hdr, payload,
					  (size_t)n * DIM * 4 + n),
			      0);
	CU_ASSERT_EQUAL(hdr.status, 0);
	CU_ASSERT_EQUAL(hdr.opcode, EMB_OP_PULL | EMB_OP_RESPONSE_BIT);
	CU_ASSERT_EQUAL(hdr.count, n);
}

static void push(int fd, uint32_t table, const uint64_t *ids, uint32_t n,
		 const float *grads, struct emb_wire_iovs *w)
{
	struct emb_frame_hdr hdr;

	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode(w, 2, table, 0, 0, ids,
						       n, DIM, grads),
			      0);
	send_iovs(fd, w);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &hdr, payload, 64), 0);
	CU_ASSERT_EQUAL(hdr.status, 0);
	CU_ASSERT_EQUAL(hdr.opcode, EMB_OP_PUSH | EMB_OP_RESPONSE_BIT);
}

/* NREQS pulls (plain and NOCREATE) and pushes of existing rows after a
 * warm-up; 0 allocations anywhere in the process. */
static void serve(bool zero_copy, const char *what)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_wire_spec spec = {
	    .dim = DIM,
	    .optim = EMB_OPTIM_CFG_DEFAULT,
	    .init = EMB_INIT_CFG_DEFAULT,
	    .seed = 5,
	};
	struct emb_wire_iovs *w = calloc(1, sizeof(*w));
	uint64_t *all = calloc(NROWS, sizeof(*all));
	float *grads = calloc((size_t)BATCH * DIM, sizeof(float));
	struct emb_server *s;
	uint64_t st = 3;
	uint32_t table;
	int fd;

	payload = malloc((size_t)NROWS * DIM * 4 + NROWS);
	CU_ASSERT_FATAL(w && all && grads && payload);
	o.threads = 1;
	o.zero_copy_pulls = zero_copy;
	s = nt_server_start(&o);
	strcpy(spec.name, "w");
	CU_ASSERT_EQUAL_FATAL(emb_server_table_create(s, &spec, &table), 0);
	fd = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	for (uint32_t i = 0; i < NROWS; i++)
		all[i] = emb_splitmix64(&st);
	for (uint32_t i = 0; i < (size_t)BATCH * DIM; i++)
		grads[i] = 0.001f;

	/* Warm-up: every row made, every buffer at its working size. */
	for (int pass = 0; pass < 3; pass++)
		for (uint32_t i = 0; i < NROWS; i += BATCH) {
			pull(fd, table, all + i, BATCH, 0, w);
			pull(fd, table, all + i, BATCH, EMB_F_NOCREATE, w);
			push(fd, table, all + i, BATCH, grads, w);
		}

	count_begin();
	for (int r = 0; r < NREQS; r++) {
		const uint64_t *ids = all + (r * 977u) % (NROWS - BATCH);

		pull(fd, table, ids, BATCH, 0, w);
		pull(fd, table, ids, BATCH / 2, EMB_F_NOCREATE, w);
		push(fd, table, ids, BATCH, grads, w);
	}
	expect_none(count_end(), what);

	close(fd);
	emb_server_destroy(s);
	free(payload);
	free(grads);
	free(all);
	free(w);
}

static void test_copied_pulls(void)
{
	serve(false, "copied pulls and pushes");
}

static void test_zero_copy_pulls(void)
{
	serve(true, "zero-copy pulls and pushes");
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"copied pulls and pushes allocate nothing once warm",
	     test_copied_pulls},
	    {"zero-copy pulls and pushes allocate nothing once warm",
	     test_zero_copy_pulls},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "server/nomalloc", cases);
}
