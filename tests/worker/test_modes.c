/*
 * tests/worker/test_modes.c - training modes through real servers: a
 * synchronous table equals a sequential reference fed averaged gradients,
 * and bounded staleness discards (and counts) pushes that lag too far.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/endian.h"
#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_msg.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "store/store.h"
#include "worker/embstore.h"

#define DIM 4
#define WORKERS 3
#define STEPS 12
#define BATCH 64
#define IDS 200

/* Worker w's ids and gradients at step s: overlapping, with duplicates. */
static void make_batch(uint32_t w, uint32_t s, uint64_t *ids, float *g)
{
	uint64_t st = (uint64_t)w * 1000003u + s * 7919u + 1;

	for (uint32_t i = 0; i < BATCH; i++) {
		ids[i] = emb_splitmix64(&st) % IDS;
		for (uint32_t j = 0; j < DIM; j++)
			g[i * DIM + j] =
				(float)((int)(emb_splitmix64(&st) % 17) - 8) / 8.0f;
	}
}

struct worker_arg {
	const char *servers;   /* cluster */
	uint32_t rank;	       /* this worker */
	int rc;		       /* first error */
};

static struct emb_table_spec sync_spec(void)
{
	struct emb_table_spec sp = nt_spec("sync_t", DIM, 5);

	sp.optim.kind = EMB_OPTIM_ADAGRAD; /* nonlinear: averaging matters */
	sp.optim.lr = 0.1f;
	return sp;
}

static void *worker_main(void *arg)
{
	struct worker_arg *a = arg;
	struct emb_table_spec sp = sync_spec();
	struct emb_client *c = nt_client(a->servers, 10000);
	struct emb_client_table *t = NULL;
	uint64_t ids[BATCH];
	float g[BATCH * DIM], rows[BATCH * DIM];

	a->rc = emb_client_table_create(c, &sp, &t);
	if (!a->rc)
		a->rc = emb_client_table_set_mode(t, EMB_MODE_SYNC, WORKERS, 0);
	for (uint32_t s = 0; s < STEPS && !a->rc; s++) {
		make_batch(a->rank, s, ids, g);
		a->rc = emb_client_table_pull(t, ids, BATCH, rows, 0, NULL);
		/* Rank 2 sends nothing at step 3: an empty step still counts. */
		if (!a->rc)
			a->rc = emb_client_table_push(
				t, ids, a->rank == 2 && s == 3 ? 0 : BATCH, g,
				s, a->rank);
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	return NULL;
}

static void test_sync_equals_reference(void)
{
	struct emb_server *srv[2];
	uint16_t ports[2];
	char addr[128];
	pthread_t th[WORKERS];
	struct worker_arg wa[WORKERS];
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct emb_table_spec sp = sync_spec();
	struct emb_table *ref;
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t all[IDS];
	float got[IDS * DIM], want[IDS * DIM];

	for (int k = 0; k < 2; k++) {
		struct emb_server_opts so = nt_server_opts();

		srv[k] = nt_server_start(&so);
		CU_ASSERT_PTR_NOT_NULL_FATAL(srv[k]);
		ports[k] = emb_server_port(srv[k]);
	}
	nt_addr_list(addr, sizeof(addr), ports, 2);
	for (uint32_t w = 0; w < WORKERS; w++) {
		wa[w] = (struct worker_arg){addr, w, 0};
		pthread_create(&th[w], NULL, worker_main, &wa[w]);
	}
	for (uint32_t w = 0; w < WORKERS; w++) {
		pthread_join(th[w], NULL);
		CU_ASSERT_EQUAL(wa[w].rc, 0);
	}

	/* The reference: one push per step of every worker's gradients,
	 * each divided by the worker count, concatenated in rank order. */
	o.name = sp.name;
	o.dim = DIM;
	o.optim = sp.optim;
	o.init = sp.init;
	o.seed = sp.seed;
	CU_ASSERT_EQUAL_FATAL(emb_table_create(&o, &ref), 0);
	for (uint32_t s = 0; s < STEPS; s++) {
		uint64_t ids[WORKERS * BATCH];
		float g[WORKERS * BATCH * DIM], rows[WORKERS * BATCH * DIM];
		uint32_t n = 0;

		for (uint32_t w = 0; w < WORKERS; w++) {
			make_batch(w, s, ids + n, g + (size_t)n * DIM);
			emb_table_pull(ref, ids + n, BATCH, rows, 0, NULL);
			if (w == 2 && s == 3)
				continue;
			n += BATCH;
		}
		for (uint32_t i = 0; i < n * DIM; i++)
			g[i] /= (float)WORKERS;
		CU_ASSERT_EQUAL(emb_table_push(ref, ids, n, g), 0);
	}
	for (uint32_t i = 0; i < IDS; i++)
		all[i] = i;
	emb_table_pull(ref, all, IDS, want, EMB_PULL_NOCREATE, NULL);
	c = nt_client(addr, 5000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(c, "sync_t", &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, all, IDS, got,
					      EMB_CLIENT_NOCREATE, NULL),
			0);
	for (uint32_t i = 0; i < IDS * DIM; i++)
		CU_ASSERT_DOUBLE_EQUAL(got[i], want[i],
				       1e-6 * (1.0 + (double)(want[i] < 0 ? -want[i] : want[i])));
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_table_destroy(ref);
	for (int k = 0; k < 2; k++)
		emb_server_destroy(srv[k]);
}

static void test_sync_rejects_bad_rank_and_step(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = nt_server_start(&so);
	struct emb_table_spec sp = nt_spec("sync_bad", DIM, 1);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t id = 7;
	float g[DIM] = {1, 1, 1, 1};
	char addr[64];
	uint16_t port;
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 2000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 2, 0), 0);
	/* The same mode again is a no-op; sync without workers is refused. */
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 2, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 0, 0),
			EMB_EBADARG);
	rc = emb_client_table_push(t, &id, 1, g, 0, 5);
	if (rc != EMB_EBADARG)
		fprintf(stderr, "\n    bad rank gave %d (%s)", rc, emb_strerror(rc));
	CU_ASSERT_EQUAL(rc, EMB_EBADARG);
	/* Rank 0 alone cannot finish a step of 2 workers: the push is held
	 * and the call times out rather than hanging. */
	CU_ASSERT_EQUAL(emb_client_table_push(t, &id, 1, g, 0, 0),
			-ETIMEDOUT);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

static void test_stale_pushes_are_discarded(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = nt_server_start(&so);
	struct emb_table_spec sp = nt_spec("stale_t", DIM, 1);
	struct emb_client_table_stats cs =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t ids[2] = {1, 2};
	float g[2 * DIM], row[2 * DIM];
	char addr[64];
	uint16_t port;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	for (int i = 0; i < 2 * DIM; i++)
		g[i] = 1.0f;
	sp.optim.lr = 1.0f;
	sp.init.kind = EMB_INIT_ZEROS;
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 2000);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_STALE, 0, 2), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 10, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 8, 1), 0); /* ok */
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 2, g, 7, 1), 0); /* old */
	CU_ASSERT_EQUAL(emb_client_table_push(t, ids, 1, g, 3, 2), 0); /* old */
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, row, 0, NULL), 0);
	CU_ASSERT_EQUAL(row[0], -2.0f);
	CU_ASSERT_EQUAL(row[DIM], -2.0f);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &cs), 0);
	CU_ASSERT_EQUAL(cs.grads_discarded, 3);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/*
 * A client of servers that presents admin (NULL: none): the library reads
 * the admin token from the file EMB_ADMIN_TOKEN_FILE names.
 */
static struct emb_client *client_as(const char *servers, const char *admin,
				    int *rc)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	char path[] = "/tmp/emb-admin-XXXXXX";
	int fd = -1;

	o.servers = servers;
	o.timeout_ms = 2000;
	if (admin) {
		fd = mkstemp(path);
		CU_ASSERT_FATAL(fd >= 0);
		CU_ASSERT_FATAL(write(fd, admin, strlen(admin)) ==
				(ssize_t)strlen(admin));
		setenv("EMB_ADMIN_TOKEN_FILE", path, 1);
	}
	*rc = emb_client_create(&o, &c);
	if (admin) {
		unsetenv("EMB_ADMIN_TOKEN_FILE");
		close(fd);
		unlink(path);
	}
	return c;
}

/*
 * With an admin token configured, a training client pulls, pushes and
 * creates but cannot change a table's mode or drop it; the admin can, and
 * a wrong admin token is refused at HELLO.
 */
static void test_admin_rights(void)
{
	static const char admin[] = "root-secret";
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("guarded", DIM, 1);
	struct emb_client_table *t, *ta;
	struct emb_client *c, *ca, *bad;
	struct emb_server_stats ss;
	struct emb_server *srv;
	uint64_t id = 3;
	float g[DIM] = {1, 1, 1, 1}, row[DIM];
	char addr[64];
	uint16_t port;
	int rc, fd;

	so.admin_token = (const uint8_t *)admin;
	so.admin_token_len = sizeof(admin) - 1;
	srv = nt_server_start(&so);
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = client_as(addr, NULL, &rc);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL), 0);
	CU_ASSERT_EQUAL(emb_client_table_push(t, &id, 1, g, 0, 0), 0);
	/* The stranger's SET_MODE(sync, 65536 workers) of the report. */
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 65536, 0),
			EMB_ENOADMIN);
	CU_ASSERT_EQUAL(emb_client_table_drop(t), EMB_ENOADMIN);
	/* Pushes still apply: the mode did not change. */
	CU_ASSERT_EQUAL(emb_client_table_push(t, &id, 1, g, 1, 0), 0);
	emb_server_stats(srv, &ss);
	CU_ASSERT_EQUAL(ss.not_admin, 2);

	bad = client_as(addr, "not-the-token", &rc);
	CU_ASSERT_EQUAL(rc, EMB_EAUTH);
	CU_ASSERT_PTR_NULL(bad);
	/* Raw: a wrong admin token closes the connection. */
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL(nt_raw_hello_flags(fd, EMB_F_ADMIN, "nope", 4),
			EMB_EAUTH);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);

	ca = client_as(addr, admin, &rc);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(ca, "guarded", &ta), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(ta, EMB_MODE_STALE, 0, 4),
			0);
	CU_ASSERT_EQUAL(emb_client_table_drop(ta), 0);
	emb_client_table_close(ta);
	emb_client_table_close(t);
	emb_client_destroy(ca);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/* A raw PUSH of n ids (value v) for rank at step; STEP_END if end. */
static void raw_push(int fd, uint64_t req_id, uint32_t table_id,
		     uint64_t step, uint32_t rank, bool end, uint32_t n,
		     float v)
{
	uint64_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	float *g = malloc((size_t)(n ? n : 1) * DIM * sizeof(*g));
	size_t cap = EMB_WIRE_HDR_SIZE + 16 + (size_t)n * (8 + 4 * DIM);
	uint8_t *buf = malloc(cap);
	struct emb_wire_iovs iovs;
	int len;

	CU_ASSERT_FATAL(ids && g && buf);
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = 1000 + i;
		for (uint32_t j = 0; j < DIM; j++)
			g[i * DIM + j] = v;
	}
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode(&iovs, req_id, table_id,
						       step, rank, ids, n, DIM,
						       g),
			      0);
	len = emb_wire_iovs_flatten(&iovs, buf, cap);
	CU_ASSERT_FATAL(len > 0);
	if (end)
		emb_le16_store(buf + 6, EMB_F_STEP_END);
	CU_ASSERT_EQUAL(nt_raw_send(fd, buf, (size_t)len), 0);
	free(buf);
	free(g);
	free(ids);
}

/* The status of the next response on fd (which must be req_id's). */
static int raw_status(int fd, uint64_t req_id)
{
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_frame_hdr h;

	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &h, resp, sizeof(resp)), 0);
	CU_ASSERT_EQUAL(h.req_id, req_id);
	return h.status;
}

static uint64_t mem_used(struct emb_server *s)
{
	struct emb_server_stats ss;

	emb_server_stats(s, &ss);
	return ss.mem_used;
}

/*
 * Under a synchronous table every part of a step is held until the step
 * is applied, so a success always means "applied" (a part without
 * STEP_END used to be acknowledged at once, and dropped when the step
 * never completed). Held parts are charged to the memory limit and go,
 * memory and all, with their connection.
 */
static void test_sync_holds_and_frees(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_table_spec sp = nt_spec("held_t", DIM, 1);
	struct emb_client_table *t;
	struct emb_server *srv;
	struct emb_client *c;
	uint64_t base, ids[2] = {1000, 1001};
	uint8_t found[2];
	float rows[2 * DIM];
	char addr[64];
	uint16_t port;
	uint32_t tid;
	int r0, r1, rc;

	so.mem_limit = 256u << 20;
	sp.init.kind = EMB_INIT_ZEROS;
	sp.optim.lr = 1.0f;
	srv = nt_server_start(&so);
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = client_as(addr, NULL, &rc);
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_set_mode(t, EMB_MODE_SYNC, 2, 0), 0);
	tid = 1;
	base = mem_used(srv);

	/* Rank 0's part of step 0 waits, charged; its conn goes: freed. */
	r0 = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(r0, NULL, 0), 0);
	raw_push(r0, 11, tid, 0, 0, false, 20000, 1.0f);
	CU_ASSERT(nt_raw_quiet(r0, 300));
	CU_ASSERT(mem_used(srv) >= base + 20000 * (8 + 4 * DIM));
	close(r0);
	for (int i = 0; i < 200 && mem_used(srv) != base; i++)
		usleep(10000);
	CU_ASSERT_EQUAL(mem_used(srv), base);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, rows,
					      EMB_CLIENT_NOCREATE, found),
			0);
	CU_ASSERT_EQUAL(found[0], 0);

	/* A whole step: nothing is acknowledged before it is applied. */
	r0 = nt_raw_connect(port);
	r1 = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(r0, NULL, 0), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(r1, NULL, 0), 0);
	raw_push(r0, 21, tid, 0, 0, false, 2, 1.0f);
	raw_push(r0, 22, tid, 0, 0, true, 0, 0.0f);
	CU_ASSERT(nt_raw_quiet(r0, 200));
	raw_push(r1, 31, tid, 0, 1, true, 2, 3.0f);
	CU_ASSERT_EQUAL(raw_status(r1, 31), 0);
	CU_ASSERT_EQUAL(raw_status(r0, 21), 0);
	CU_ASSERT_EQUAL(raw_status(r0, 22), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 2, rows, 0, NULL), 0);
	/* SGD, lr 1, mean gradient (1 + 3) / 2. */
	CU_ASSERT_EQUAL(rows[0], -2.0f);
	CU_ASSERT_EQUAL(rows[DIM], -2.0f);
	/* The parts' charge went with them: what stays is two rows. */
	CU_ASSERT(mem_used(srv) < base + (64u << 10));
	close(r0);
	close(r1);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
		{"sync steps equal a reference fed averaged gradients",
		 test_sync_equals_reference},
		{"sync refuses a bad rank and times out an unfinished step",
		 test_sync_rejects_bad_rank_and_step},
		{"stale pushes are discarded and counted",
		 test_stale_pushes_are_discarded},
		{"without the admin token SET_MODE and DROP are refused",
		 test_admin_rights},
		{"sync parts are held until applied, charged, freed on close",
		 test_sync_holds_and_frees},
		{NULL, NULL},
	};

	return emb_test_main(argc, argv, "worker", cases);
}
