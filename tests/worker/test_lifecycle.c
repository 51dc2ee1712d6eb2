/*
 * tests/worker/test_lifecycle.c - admission and eviction end to end: tables
 * created with a policy through the client over TCP (two servers, copying
 * and zero-copy pulls), the policy changed online with admin rights, and
 * raw CREATE_TABLE / SET_LIFECYCLE frames the server must refuse while it
 * keeps serving.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

#include "common/init.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "server/server.h"

#define DIM 8
#define N   500

static struct emb_table_spec spec_with(const char *name, const char *admit,
				       const char *evict)
{
	struct emb_table_spec sp = nt_spec(name, DIM, 7);

	sp.optim = EMB_OPTIM_CFG_DEFAULT;
	sp.optim.kind = EMB_OPTIM_SGD;
	sp.optim.lr = 1.0f;
	CU_ASSERT_EQUAL_FATAL(emb_admit_parse(admit, &sp.life), 0);
	CU_ASSERT_EQUAL_FATAL(emb_evict_parse(evict, &sp.life), 0);
	return sp;
}

static struct emb_client_table_stats stats_of(struct emb_client_table *t)
{
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);

	CU_ASSERT_EQUAL(emb_client_table_stats(t, &st), 0);
	return st;
}

/*
 * count:2 over two servers, one copying and one zero-copy: the first pull
 * answers initial values and stores nothing, a push then is dropped, the
 * second pull admits. With state, a pending id comes back with fresh
 * optimizer state.
 */
static void test_count_over_wire(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = spec_with("admitted", "count:2", "none");
	struct emb_server *s[2];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	uint64_t *ids = malloc(N * sizeof(*ids));
	float *rows = malloc((size_t)N * DIM * sizeof(float));
	float *g = malloc((size_t)N * DIM * sizeof(float));
	float want[DIM], full[3 * DIM];
	uint16_t port[2];
	char addr[128];
	int bad = 0;

	for (int k = 0; k < 2; k++) {
		so.zero_copy_pulls = k == 1;
		s[k] = nt_server_start(&so);
		port[k] = emb_server_port(s[k]);
	}
	nt_addr_list(addr, sizeof(addr), port, 2);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 0x9e3779b97f4a7c15ull * (i + 1);
	for (size_t i = 0; i < (size_t)N * DIM; i++)
		g[i] = 0.5f;

	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, N, rows, 0, NULL), 0);
	for (uint32_t i = 0; i < N; i++) {
		emb_init_row(&sp.init, sp.seed, ids[i], want, DIM);
		if (memcmp(rows + (size_t)i * DIM, want, sizeof(want)))
			bad++;
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, N, g, 0, 0), 0);
	st = stats_of(t);
	CU_ASSERT_EQUAL(st.rows, 0);
	CU_ASSERT_EQUAL(st.pulls_unadmitted, N);
	CU_ASSERT_EQUAL(st.pushes_unadmitted, N);
	CU_ASSERT(st.admit_filter_bytes > 0);

	/* A whole-row pull of a pending id (zero-copy on both servers). */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &ids[N - 1], 1, full,
					      EMB_CLIENT_WITH_STATE, NULL),
			0);
	emb_init_row(&sp.init, sp.seed, ids[N - 1], want, DIM);
	CU_ASSERT_EQUAL(memcmp(full, want, sizeof(want)), 0);
	CU_ASSERT_EQUAL(stats_of(t).rows, 1); /* its second sighting */

	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, N, rows, 0, NULL), 0);
	CU_ASSERT_EQUAL(stats_of(t).rows, N);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, N, g, 1, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, N, rows, 0, NULL), 0);
	bad = 0;
	for (uint32_t i = 0; i < N; i++) {
		emb_init_row(&sp.init, sp.seed, ids[i], want, DIM);
		if (rows[(size_t)i * DIM] != want[0] - 0.5f)
			bad++;
	}
	CU_ASSERT_EQUAL(bad, 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int k = 0; k < 2; k++)
		emb_server_destroy(s[k]);
	free(g);
	free(rows);
	free(ids);
}

/*
 * max_rows is for the table: two servers keep half each. The policy then
 * changes online only with admin rights; a CREATE of the existing table
 * does not change it.
 */
static void test_max_rows_and_online(void)
{
	static const char admin[] = "lc-admin";
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = spec_with("capped", "none", "max_rows:200");
	struct emb_table_spec other = spec_with("capped", "count:3", "none");
	struct emb_server *s[2];
	struct emb_client *c, *ca;
	struct emb_client_table *t, *t2, *ta;
	struct emb_lifecycle_cfg life = EMB_LIFECYCLE_CFG_DEFAULT;
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	uint64_t ids[64];
	float g[64 * DIM] = {0};
	uint16_t port[2];
	char addr[128], path[] = "/tmp/emb-lc-XXXXXX";
	int fd;

	so.admin_token = (const uint8_t *)admin;
	so.admin_token_len = sizeof(admin) - 1;
	for (int k = 0; k < 2; k++) {
		s[k] = nt_server_start(&so);
		port[k] = emb_server_port(s[k]);
	}
	nt_addr_list(addr, sizeof(addr), port, 2);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t b = 0; b < 40; b++) {
		for (uint32_t i = 0; i < 64; i++)
			ids[i] = (uint64_t)b * 64 + i;
		CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 64, g, b, 0), 0);
	}
	/* 2560 ids pushed; each server keeps about 100, and a batch may
	 * pass its shards' shares until the next batch sweeps them. */
	CU_ASSERT(stats_of(t).rows <= 200 + 64);
	CU_ASSERT(stats_of(t).rows >= 150);
	CU_ASSERT_EQUAL(stats_of(t).rows_evicted_cap,
			stats_of(t).rows_created - stats_of(t).rows);

	/* An identical CREATE with another policy opens the table and leaves
	 * the policy: no admission appears. */
	CU_ASSERT_EQUAL(emb_client_table_create(c, &other, &t2), 0);
	ids[0] = 1u << 30;
	CU_ASSERT_EQUAL(emb_client_table_pull(t2, ids, 1, g, 0, NULL), 0);
	CU_ASSERT_EQUAL(stats_of(t2).pulls_unadmitted, 0);
	emb_client_table_close(t2);

	CU_ASSERT_EQUAL(emb_admit_parse("count:2", &life), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_lifecycle(t, &life), EMB_ENOADMIN);
	fd = mkstemp(path);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write(fd, admin, strlen(admin)) ==
			(ssize_t)strlen(admin));
	close(fd);
	setenv("EMB_ADMIN_TOKEN_FILE", path, 1);
	co.servers = addr;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &ca), 0);
	unsetenv("EMB_ADMIN_TOKEN_FILE");
	unlink(path);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(ca, "capped", &ta), 0);
	life.admit_n = 1;
	CU_ASSERT_EQUAL(emb_client_table_set_lifecycle(ta, &life),
			EMB_EBADLIFE);
	life.admit_n = 2;
	CU_ASSERT_EQUAL(emb_client_table_set_lifecycle(ta, &life), 0);
	ids[0] = (1u << 30) + 1;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 1, g, 0, NULL), 0);
	CU_ASSERT_EQUAL(stats_of(t).pulls_unadmitted, 1);
	emb_client_table_close(ta);
	emb_client_destroy(ca);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int k = 0; k < 2; k++)
		emb_server_destroy(s[k]);
}

/*
 * With an admin token set, a training client's CREATE of a live table
 * that has no policy does not give it one (max_rows:1 would evict every
 * row of it); a table the server made itself (a checkpoint keeps no
 * policy) takes the first CREATE's, and only the first.
 */
static void test_create_rights(void)
{
	static const char admin[] = "lc-admin";
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec plain = spec_with("plain", "none", "none");
	struct emb_table_spec capped = spec_with("plain", "none", "max_rows:1");
	struct emb_table_spec restored =
	    spec_with("restored", "count:3", "none");
	struct emb_table_spec later = spec_with("restored", "none", "max_rows:1");
	struct emb_wire_spec ws = {0};
	struct emb_server *s;
	struct emb_client *c;
	struct emb_client_table *t, *t2, *t3;
	uint64_t ids[64];
	float g[64 * DIM] = {0};
	uint16_t port;
	char addr[64];
	uint32_t id;

	so.admin_token = (const uint8_t *)admin;
	so.admin_token_len = sizeof(admin) - 1;
	s = nt_server_start(&so);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	for (uint32_t i = 0; i < 64; i++)
		ids[i] = i;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &plain, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 64, g, 0, 0), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &capped, &t2), 0);
	for (uint32_t b = 1; b <= 4; b++) {
		for (uint32_t i = 0; i < 64; i++)
			ids[i] = (uint64_t)b * 64 + i;
		CU_ASSERT_EQUAL(emb_client_table_push(t2, ids, 64, g, b, 0), 0);
	}
	CU_ASSERT_EQUAL(stats_of(t).rows, 5 * 64);
	CU_ASSERT_EQUAL(stats_of(t).rows_evicted, 0);

	/* As a checkpoint load makes it: no policy, not claimed yet. */
	snprintf(ws.name, sizeof(ws.name), "%s", restored.name);
	ws.dim = restored.dim;
	ws.optim = restored.optim;
	ws.init = restored.init;
	ws.seed = restored.seed;
	CU_ASSERT_EQUAL_FATAL(emb_server_table_create(s, &ws, &id), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &restored, &t3), 0);
	ids[0] = 1u << 30;
	CU_ASSERT_EQUAL(emb_client_table_pull(t3, ids, 1, g, 0, NULL), 0);
	CU_ASSERT_EQUAL(stats_of(t3).pulls_unadmitted, 1);
	emb_client_table_close(t3);
	/* Claimed: the next CREATE's policy is not taken. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &later, &t3), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t3, ids, 1, g, 0, NULL), 0);
	CU_ASSERT_EQUAL(stats_of(t3).pulls_unadmitted, 2);
	CU_ASSERT_EQUAL(stats_of(t3).rows_evicted, 0);

	emb_client_table_close(t3);
	emb_client_table_close(t2);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* Sends a request and returns the response's status. */
static int raw_call(int fd, uint8_t op, uint32_t table_id, const void *payload,
		    uint32_t len)
{
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_frame_hdr h = nt_hdr(op, 77, table_id, 0, len), r;

	emb_wire_hdr_encode(head, &h);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, head, sizeof(head)), 0);
	if (len)
		CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, payload, len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &r, resp, sizeof(resp)), 0);
	return r.status;
}

/* Bad lifecycle blocks get clear errors; the connection keeps serving. */
static void test_raw_frames(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_wire_spec ws;
	struct emb_server *s;
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE +
				EMB_WIRE_LIFECYCLE_SIZE];
	uint8_t *life = buf + EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE;
	const uint32_t plen = EMB_WIRE_SPEC_SIZE + EMB_WIRE_LIFECYCLE_SIZE;
	int fd, len;

	so.mem_limit = 256u << 20;
	s = nt_server_start(&so);
	memset(&ws, 0, sizeof(ws));
	snprintf(ws.name, sizeof(ws.name), "raw");
	ws.dim = 4;
	ws.optim = EMB_OPTIM_CFG_DEFAULT;
	ws.init = EMB_INIT_CFG_DEFAULT;
	CU_ASSERT_EQUAL(emb_admit_parse("bloom:4", &ws.life), 0);
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &ws);
	CU_ASSERT_EQUAL_FATAL(len, (int)sizeof(buf));
	fd = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);

	/* Admission 9 is no kind; count:1 admits nothing; NaN min_l2. */
	life[0] = 9;
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    EMB_EBADLIFE);
	life[0] = 1;
	life[4] = 1;
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    EMB_EBADLIFE);
	life[4] = 2;
	memset(life + 16, 0xff, 4);
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    EMB_EBADLIFE);
	/* All off must be sent without the block. */
	memset(life, 0, EMB_WIRE_LIFECYCLE_SIZE);
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    EMB_EBADFRAME);
	/* A Bloom filter larger than the server's memory limit. */
	life[0] = 2;
	life[4] = 2;
	life[11] = 0x7f; /* bloom_bytes 0x7f000000: 2032 MiB */
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    EMB_EMEMLIMIT);
	life[11] = 0;
	CU_ASSERT_EQUAL(
	    raw_call(fd, EMB_OP_CREATE_TABLE, 0, buf + EMB_WIRE_HDR_SIZE, plen),
	    0);
	/* SET_LIFECYCLE: a wrong size, an unknown table, then a good one
	 * (no admin token configured: everyone is admin). */
	CU_ASSERT_EQUAL(raw_call(fd, EMB_OP_SET_LIFECYCLE, 1, life, 16),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(raw_call(fd, EMB_OP_SET_LIFECYCLE, 99, life,
				 EMB_WIRE_LIFECYCLE_SIZE),
			EMB_ENOTABLE);
	memset(life, 0, EMB_WIRE_LIFECYCLE_SIZE);
	CU_ASSERT_EQUAL(raw_call(fd, EMB_OP_SET_LIFECYCLE, 1, life,
				 EMB_WIRE_LIFECYCLE_SIZE),
			0);
	close(fd);
	emb_server_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"count:2 over the wire, copying and zero-copy",
	     test_count_over_wire},
	    {"a CREATE sets a policy only with admin rights or on a table "
	     "loaded from a checkpoint",
	     test_create_rights},
	    {"max_rows over two servers; online change needs admin",
	     test_max_rows_and_online},
	    {"bad lifecycle frames are refused", test_raw_frames},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "worker/lifecycle", cases);
}
