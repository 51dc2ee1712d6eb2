/*
 * tests/worker/test_onesided.c - one-sided pulls (pull_mode ONESIDED) over
 * RDMA verbs against a --remote-read server in this process: rows READ out
 * of table memory are bit for bit what two-sided pulls and the initializer
 * give, a row being pushed is never handed out torn, and rows that were
 * erased, evicted or whose table was dropped fall back to two-sided pulls.
 * Compact tables (fp16, int8): records READ hold the table's format and
 * are decoded after the seal check into what two-sided pulls give.
 * A tiered table (a device tier, most rows on it) is read one-sided
 * under pushes: cold rows come two-sided, every value checks.
 * Runs where an RDMA device and RDMA_VM_IP exist (the Soft-RoCE VM, see
 * .ci/run); elsewhere it exits 77.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/init.h"
#include "common/rowfmt.h"
#include "harness.h"
#include "netutil.h"
#include "server/server.h"
#include "transport/transport.h"
#include "worker/embstore.h"

#define DIM 64
#define BATCH 2048
/* Pulls a test makes at most while locations are being learnt: LOCATE
 * follows a pull's fallback without holding it up. */
#define LEARN_TRIES 50

static const char *ip;

static struct emb_server *start_server(bool remote_read)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = NULL;

	so.host = ip;
	so.transport = "rdma";
	so.zero_copy_pulls = true;
	so.remote_read = remote_read;
	CU_ASSERT_EQUAL(emb_server_create(&so, &srv), 0);
	return srv;
}

static struct emb_client *client(uint16_t port, uint32_t mode)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c = NULL;
	char addr[128];

	snprintf(addr, sizeof(addr), "%s:%u", ip, port);
	co.servers = addr;
	co.transport = "rdma";
	co.timeout_ms = 60000; /* the VM is emulated: slow, not hung */
	co.pull_mode = mode;
	co.loc_cache_rows = 1u << 16;
	CU_ASSERT_EQUAL(emb_client_create(&co, &c), 0);
	return c;
}

static uint64_t rows_read(struct emb_client *c)
{
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);

	emb_client_stats(c, &st);
	return st.rows_read;
}

/*
 * Pulls ids through t until one pull READ all n rows (their LOCATEs have
 * come back); true if one did within LEARN_TRIES pulls.
 */
static bool learn(struct emb_client *c, struct emb_client_table *t,
		  const uint64_t *ids, uint32_t n, float *out)
{
	for (int i = 0; i < LEARN_TRIES; i++) {
		uint64_t before = rows_read(c);

		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull(t, ids, n, out, 0, NULL), 0);
		if (rows_read(c) - before == n)
			return true;
		usleep(20000);
	}
	{
		struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);

		emb_client_stats(c, &st);
		fprintf(stderr,
			"  locations not learnt: %llu rows READ, %llu two-sided, "
			"%llu seal failures, %llu read conns lost\n",
			(unsigned long long)st.rows_read,
			(unsigned long long)st.rows_fallback,
			(unsigned long long)st.seal_failures,
			(unsigned long long)st.read_conn_losses);
	}
	return false;
}

/* Floats of rows[n][DIM] that differ from the initializer's (bitwise). */
static uint32_t not_initial(const struct emb_table_spec *sp,
			    const uint64_t *ids, uint32_t n, const float *rows)
{
	float want[DIM];
	uint32_t bad = 0;

	for (uint32_t i = 0; i < n; i++) {
		emb_init_row(&sp->init, sp->seed, ids[i], want, DIM);
		bad += memcmp(want, rows + (size_t)i * DIM, sizeof(want)) != 0;
	}
	return bad;
}

static void test_rows_match_two_sided(void)
{
	struct emb_table_spec sp = nt_spec("match", DIM, 3);
	struct emb_server *srv = start_server(true);
	struct emb_client *one, *two;
	struct emb_client_table *t1, *t2;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	uint64_t *ids = malloc(BATCH * sizeof(*ids));
	float *a = malloc((size_t)BATCH * DIM * sizeof(float));
	float *b = malloc((size_t)BATCH * DIM * sizeof(float));
	float *g = malloc((size_t)BATCH * DIM * sizeof(float));
	uint32_t bad = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	one = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	two = client(emb_server_port(srv), EMB_PULL_TWOSIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(one);
	CU_ASSERT_PTR_NOT_NULL_FATAL(two);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(one, &sp, &t1), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(two, "match", &t2), 0);
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = (uint64_t)i * 2654435761u + 17;
	CU_ASSERT_FATAL(learn(one, t1, ids, BATCH, a));
	CU_ASSERT_EQUAL(not_initial(&sp, ids, BATCH, a), 0);
	/* Pushed rows are what the next READ brings: a push is applied, and
	 * its rows sealed, before it is acknowledged. */
	for (uint32_t r = 0; r < 4; r++) {
		for (size_t k = 0; k < (size_t)BATCH * DIM; k++)
			g[k] = (float)((k + r) % 9) - 4.0f;
		CU_ASSERT_EQUAL(emb_client_table_push(t2, ids, BATCH, g, r, 0),
				0);
		CU_ASSERT_EQUAL(emb_client_table_pull(t1, ids, BATCH, a, 0,
						      NULL),
				0);
		CU_ASSERT_EQUAL(emb_client_table_pull(t2, ids, BATCH, b, 0,
						      NULL),
				0);
		bad += memcmp(a, b, (size_t)BATCH * DIM * sizeof(float)) != 0;
	}
	CU_ASSERT_EQUAL(bad, 0);
	emb_client_stats(one, &st);
	CU_ASSERT(st.rows_read >= 5ull * BATCH);
	CU_ASSERT_EQUAL(st.read_conn_losses, 0);
	emb_client_stats(two, &st);
	CU_ASSERT_EQUAL(st.rows_read, 0);
	emb_client_table_close(t1);
	emb_client_table_close(t2);
	emb_client_destroy(one);
	emb_client_destroy(two);
	emb_server_destroy(srv);
	free(ids);
	free(a);
	free(b);
	free(g);
}

/*
 * A compact table read one-sided: the records hold fp16 or int8 weights
 * (then Adagrad's fp32 state), so a READ brings fewer bytes, and the rows
 * the caller gets, decoded after the seal check, are bit for bit the
 * two-sided pull's, before and after pushes; raw and whole-row pulls get
 * the words as read. 0 when the client made no compact table.
 */
static uint32_t compact_rows_match(uint32_t fmt)
{
	enum { N = 512 };
	struct emb_table_spec sp = nt_spec("compact", DIM, 5);
	struct emb_server *srv = start_server(true);
	struct emb_client *one, *two;
	struct emb_client_table *t1 = NULL, *t2 = NULL;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	uint64_t ids[N];
	static float a[N * 2 * DIM], b[N * 2 * DIM], g[N * DIM];
	uint32_t bad = 0, made = 0, rf, ww = emb_rowfmt_words(fmt, DIM);
	uint64_t before;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	sp.row_format = fmt;
	sp.optim.kind = EMB_OPTIM_ADAGRAD;
	one = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	two = client(emb_server_port(srv), EMB_PULL_TWOSIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(one);
	CU_ASSERT_PTR_NOT_NULL_FATAL(two);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(one, &sp, &t1), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(two, "compact", &t2), 0);
	CU_ASSERT_EQUAL(emb_client_table_spec(t1)->row_format, fmt);
	if (emb_client_table_spec(t1)->row_format != fmt)
		goto out;
	made = 1;
	rf = emb_client_table_row_floats(t1);
	CU_ASSERT_EQUAL(rf, ww + DIM);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = (uint64_t)i * 2654435761u + 99;
	CU_ASSERT_FATAL(learn(one, t1, ids, N, a));
	for (uint32_t r = 0; r < 3; r++) {
		for (size_t k = 0; k < (size_t)N * DIM; k++)
			g[k] = 0.25f * (float)((k * 7 + r) % 9) - 1.0f;
		CU_ASSERT_EQUAL(emb_client_table_push(t2, ids, N, g, r, 0), 0);
		before = rows_read(one);
		CU_ASSERT_EQUAL(emb_client_table_pull(t1, ids, N, a, 0, NULL),
				0);
		CU_ASSERT_EQUAL(rows_read(one) - before, N);
		CU_ASSERT_EQUAL(emb_client_table_pull(t2, ids, N, b, 0, NULL),
				0);
		bad += memcmp(a, b, (size_t)N * DIM * sizeof(float)) != 0;
	}
	/* Raw weights and whole rows: the record's words as they are. */
	before = rows_read(one);
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(t1, ids, N, a, EMB_CLIENT_RAW, NULL), 0);
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(t2, ids, N, b, EMB_CLIENT_RAW, NULL), 0);
	bad += memcmp(a, b, (size_t)N * ww * sizeof(float)) != 0;
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(t1, ids, N, a, EMB_CLIENT_WITH_STATE, NULL),
	    0);
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(t2, ids, N, b, EMB_CLIENT_WITH_STATE, NULL),
	    0);
	bad += memcmp(a, b, (size_t)N * rf * sizeof(float)) != 0;
	CU_ASSERT_EQUAL(rows_read(one) - before, 2 * N);
	CU_ASSERT_EQUAL(bad, 0);
	emb_client_stats(one, &st);
	CU_ASSERT_EQUAL(st.seal_failures, 0);
	CU_ASSERT_EQUAL(st.read_conn_losses, 0);
out:
	emb_client_table_close(t1);
	emb_client_table_close(t2);
	emb_client_destroy(one);
	emb_client_destroy(two);
	emb_server_destroy(srv);
	return made;
}

static void test_compact_rows_match_two_sided(void)
{
	CU_ASSERT(compact_rows_match(EMB_ROWFMT_FP16));
	CU_ASSERT(compact_rows_match(EMB_ROWFMT_INT8));
}

/* A server without --remote-read: every row comes two-sided, right. */
static void test_plain_server_pulls_two_sided(void)
{
	struct emb_table_spec sp = nt_spec("plain", DIM, 4);
	struct emb_server *srv = start_server(false);
	struct emb_client_table *t;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	uint64_t ids[256];
	float rows[256 * DIM];

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < 256; i++)
		ids[i] = i;
	for (int r = 0; r < 3; r++) {
		CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 256, rows, 0,
						      NULL),
				0);
		CU_ASSERT_EQUAL(not_initial(&sp, ids, 256, rows), 0);
	}
	emb_client_stats(c, &st);
	CU_ASSERT_EQUAL(st.rows_read, 0);
	CU_ASSERT_EQUAL(st.rows_fallback, 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/*
 * Torn rows: every row starts with equal elements and every push adds the
 * same gradient to all of them, so a row is only ever all-equal. A READ
 * that mixed two versions of a row would show unequal elements, unless the
 * seal check let it through.
 */
#define HOT 512
#define READS 60

struct pusher {
	struct emb_client_table *t; /* two-sided client's */
	uint64_t *ids;		    /* HOT ids */
	int stop;		    /* atomic */
	uint32_t pushes;	    /* done */
	int rc;			    /* first failure */
};

static void *push_main(void *arg)
{
	struct pusher *p = arg;
	float *g = malloc((size_t)HOT * DIM * sizeof(float));

	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && !p->rc) {
		float v = (float)(p->pushes % 7) * 0.125f - 0.375f;

		for (size_t k = 0; k < (size_t)HOT * DIM; k++)
			g[k] = v;
		p->rc = emb_client_table_push(p->t, p->ids, HOT, g,
					      p->pushes, 0);
		p->pushes++;
	}
	free(g);
	return NULL;
}

static void test_no_torn_rows_under_pushes(void)
{
	struct emb_table_spec sp = nt_spec("torn", DIM, 5);
	struct emb_server *srv = start_server(true);
	struct emb_client_table *t1, *t2;
	struct emb_client *one, *two;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	struct pusher p = {0};
	pthread_t th;
	uint64_t ids[HOT];
	float *rows = malloc((size_t)HOT * DIM * sizeof(float));
	uint32_t torn = 0;

	sp.init = (struct emb_init_cfg){.kind = EMB_INIT_CONSTANT, .a = 0.5f};
	sp.optim.lr = 1.0f;
	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	one = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	two = client(emb_server_port(srv), EMB_PULL_TWOSIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(one);
	CU_ASSERT_PTR_NOT_NULL_FATAL(two);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(one, &sp, &t1), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(two, "torn", &t2), 0);
	for (uint32_t i = 0; i < HOT; i++)
		ids[i] = (uint64_t)i * 7919u + 3;
	CU_ASSERT_FATAL(learn(one, t1, ids, HOT, rows));
	p.t = t2;
	p.ids = ids;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, push_main, &p), 0);
	for (uint32_t r = 0; r < READS; r++) {
		CU_ASSERT_EQUAL(emb_client_table_pull(t1, ids, HOT, rows, 0,
						      NULL),
				0);
		for (uint32_t i = 0; i < HOT; i++) {
			const float *w = rows + (size_t)i * DIM;

			for (uint32_t j = 1; j < DIM; j++)
				if (memcmp(&w[j], &w[0], sizeof(float))) {
					torn++;
					break;
				}
		}
	}
	__atomic_store_n(&p.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(p.rc, 0);
	CU_ASSERT_EQUAL(torn, 0);
	CU_ASSERT(p.pushes > 0);
	emb_client_stats(one, &st);
	/* The reads ran one-sided (the seal broke for rows caught mid-push,
	 * which then came two-sided). */
	CU_ASSERT(st.rows_read > (uint64_t)HOT * READS / 4);
	fprintf(stderr, "  %u pushes, %llu rows READ, %llu seal failures\n",
		p.pushes, (unsigned long long)st.rows_read,
		(unsigned long long)st.seal_failures);
	emb_client_table_close(t1);
	emb_client_table_close(t2);
	emb_client_destroy(one);
	emb_client_destroy(two);
	emb_server_destroy(srv);
	free(rows);
}

static void test_erased_and_evicted_rows_fall_back(void)
{
	struct emb_table_spec sp = nt_spec("evict", DIM, 6);
	struct emb_server *srv = start_server(true);
	struct emb_client_table_stats ts =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_stats st0 = EMB_SIZED(struct emb_client_stats),
				st = EMB_SIZED(struct emb_client_stats);
	struct emb_client_table *t;
	struct emb_client *c;
	uint64_t *ids = malloc(4 * BATCH * sizeof(*ids));
	float *rows = malloc((size_t)4 * BATCH * DIM * sizeof(float));
	uint64_t erased = 0;

	/* Room for a quarter of the ids: pulling the rest evicts. */
	sp.life.max_rows = BATCH;
	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < 4 * BATCH; i++)
		ids[i] = 1000003ull * i + 11;

	/* Erased: the freed records' seals are broken. */
	CU_ASSERT_FATAL(learn(c, t, ids, 512, rows));
	CU_ASSERT_EQUAL(emb_client_table_erase(t, ids, 256, &erased), 0);
	CU_ASSERT_EQUAL(erased, 256);
	emb_client_stats(c, &st0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 512, rows, 0, NULL), 0);
	CU_ASSERT_EQUAL(not_initial(&sp, ids, 512, rows), 0);
	emb_client_stats(c, &st);
	CU_ASSERT(st.seal_failures - st0.seal_failures >= 256);
	CU_ASSERT(st.rows_fallback - st0.rows_fallback >= 256);

	/* Evicted (max_rows; pushes sweep), records reused for other ids.
	 * Zero gradients leave every row at its initial value. */
	CU_ASSERT_FATAL(learn(c, t, ids, BATCH / 2, rows));
	memset(rows, 0, (size_t)BATCH * DIM * sizeof(float));
	for (uint32_t b = 1; b < 4; b++)
		CU_ASSERT_EQUAL(emb_client_table_push(t, ids + b * BATCH,
						      BATCH, rows, b, 0),
				0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &ts), 0);
	CU_ASSERT(ts.rows_evicted_cap > 0);
	emb_client_stats(c, &st0);
	CU_ASSERT_EQUAL(
	    emb_client_table_pull(t, ids, BATCH / 2, rows, 0, NULL), 0);
	CU_ASSERT_EQUAL(not_initial(&sp, ids, BATCH / 2, rows), 0);
	emb_client_stats(c, &st);
	CU_ASSERT(st.seal_failures > st0.seal_failures);
	CU_ASSERT_EQUAL(st.read_conn_losses, 0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(srv);
	free(ids);
	free(rows);
}

/*
 * A dropped table: pulls fail with EMB_ENOTABLE, never with old rows.
 * Once its memory is deregistered a READ of it ends the read conn (not the
 * main one); before that (the server frees it on its reaper thread, which
 * no stat reports exactly) the READs find the seals the drop broke. Either
 * way, another table is READ again afterwards, over a new read conn if the
 * old one went. (Broken seals alone: store/table's test.)
 */
static void test_dropped_table_is_never_read(void)
{
	struct emb_table_spec a = nt_spec("gone", DIM, 7),
			      b = nt_spec("next", DIM, 8);
	struct emb_server *srv = start_server(true);
	struct emb_server_stats ss;
	struct emb_client_table *ta, *tb;
	struct emb_client_stats st = EMB_SIZED(struct emb_client_stats);
	struct emb_client *c;
	uint64_t ids[512];
	float rows[512 * DIM];
	uint64_t mem, read0;
	int i;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &a, &ta), 0);
	for (i = 0; i < 512; i++)
		ids[i] = (uint64_t)i * 31 + 5;
	CU_ASSERT_FATAL(learn(c, ta, ids, 512, rows));
	read0 = rows_read(c);
	emb_server_stats(srv, &ss);
	mem = ss.mem_used;

	CU_ASSERT_EQUAL(emb_client_table_drop(ta), 0);
	for (i = 0; i < 500; i++) {
		emb_server_stats(srv, &ss);
		if (ss.tables == 0 && ss.mem_used < mem)
			break;
		usleep(10000);
	}
	CU_ASSERT_EQUAL(emb_client_table_pull(ta, ids, 512, rows, 0, NULL),
			EMB_ENOTABLE);
	emb_client_stats(c, &st);
	CU_ASSERT(st.read_conn_losses >= 1 || st.seal_failures >= 512);
	CU_ASSERT_EQUAL(st.rows_read, read0); /* no row of it passed */
	fprintf(stderr, "  after the drop: %s\n",
		st.read_conn_losses ? "READ failed, read conn replaced"
				    : "READs found broken seals");

	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &b, &tb), 0);
	CU_ASSERT(learn(c, tb, ids, 512, rows));
	CU_ASSERT_EQUAL(not_initial(&b, ids, 512, rows), 0);
	emb_client_table_close(ta);
	emb_client_table_close(tb);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/* One-sided pulls still in flight when their client is destroyed end
 * (rows or EMB_ECLOSED), and are waited for afterwards. */
static void test_async_outlives_client(void)
{
	struct emb_table_spec sp = nt_spec("async", DIM, 9);
	struct emb_server *srv = start_server(true);
	struct emb_client_table *t;
	struct emb_async *op[3];
	struct emb_client *c;
	uint64_t *ids = malloc(BATCH * sizeof(*ids));
	float *rows = malloc((size_t)3 * BATCH * DIM * sizeof(float));
	int rc;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	c = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (uint32_t i = 0; i < BATCH; i++)
		ids[i] = (uint64_t)i * 104729u + 1;
	CU_ASSERT_FATAL(learn(c, t, ids, BATCH, rows));
	for (int k = 0; k < 3; k++)
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull_async(t, ids, BATCH,
						rows + (size_t)k * BATCH * DIM,
						0, NULL, &op[k]),
		    0);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int k = 0; k < 3; k++) {
		rc = emb_async_wait(op[k]);
		CU_ASSERT(rc == 0 || rc == EMB_ECLOSED);
	}
	emb_server_destroy(srv);
	free(ids);
	free(rows);
}

/*
 * A tiered table (tier_dir, a memory limit that leaves most rows on the
 * device) read one-sided while another client pushes. Row i is assigned
 * i * TIER_BASE in every element and each push adds 1 to its rows (SGD,
 * lr 1, gradient -1: exact in floats), so a pulled row is right when its
 * elements are equal and it is i * TIER_BASE + k for an integer k between
 * the pushes to it acknowledged before the pull began and those begun by
 * its end: a READ of a record that now holds another id, or that a
 * demotion freed (the row's older self), or torn by a push, would break
 * one of these. Half of each pull
 * is a hot set (kept in DRAM, so READ once located), half any row (cold,
 * so pulled two-sided; LOCATE says so). The pushes move rows both ways.
 */
#define TIER_ROWS   16384u
#define TIER_DIM    32u
#define TIER_HOT    1024u
#define TIER_BATCH  1024u
#define TIER_PULLS  40u
#define TIER_WINDOW 1024u /* ids a push covers, consecutive */
#define TIER_BASE   1024.0f

struct tier_pusher {
	struct emb_client_table *t; /* two-sided client's */
	uint32_t *sent;		    /* per row: pushes begun (atomic) */
	uint32_t *done;		    /* per row: pushes acknowledged (atomic) */
	int stop;		    /* atomic */
	uint32_t pushes;	    /* done */
	int rc;			    /* first failure */
};

/* Uniform in [0, n) from a splitmix64 stream. */
static uint32_t rnd_id(uint64_t *st, uint32_t n)
{
	return (uint32_t)((emb_splitmix64(st) >> 32) * n >> 32);
}

static uint64_t tier_id(uint32_t i)
{
	return (uint64_t)i * 2654435761u + 101;
}

static void *tier_push_main(void *arg)
{
	struct tier_pusher *p = arg;
	uint64_t *ids = malloc(TIER_WINDOW * sizeof(*ids));
	float *g = malloc((size_t)TIER_WINDOW * TIER_DIM * sizeof(float));

	for (size_t k = 0; k < (size_t)TIER_WINDOW * TIER_DIM; k++)
		g[k] = -1.0f;
	/* Every other push is the hot set's (so its rows change while they
	 * are READ), the others anywhere (so rows come back from the device
	 * and push others out). k stays below TIER_BASE: a hot row
	 * gets 900 pushes of the hot set's and one window in about 16 of
	 * the others (1024 of 16384 rows). */
	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && !p->rc &&
	       p->pushes < 1800) {
		uint32_t lo = p->pushes % 2 ? 0 : (p->pushes * 2963u) % TIER_ROWS;

		for (uint32_t j = 0; j < TIER_WINDOW; j++) {
			uint32_t i = (lo + j) % TIER_ROWS;

			ids[j] = tier_id(i);
			__atomic_add_fetch(&p->sent[i], 1, __ATOMIC_SEQ_CST);
		}
		p->rc = emb_client_table_push(p->t, ids, TIER_WINDOW, g,
					      p->pushes, 0);
		for (uint32_t j = 0; j < TIER_WINDOW && !p->rc; j++)
			__atomic_add_fetch(&p->done[(lo + j) % TIER_ROWS], 1,
					   __ATOMIC_SEQ_CST);
		p->pushes++;
	}
	free(ids);
	free(g);
	return NULL;
}

static void test_tiered_table_read_one_sided(void)
{
	struct emb_table_spec sp = nt_spec("tiered", TIER_DIM, 12);
	struct emb_server_opts so = nt_server_opts();
	struct emb_client_table_stats ts =
	    EMB_SIZED(struct emb_client_table_stats);
	struct emb_client_stats st0 = EMB_SIZED(struct emb_client_stats),
				st = EMB_SIZED(struct emb_client_stats);
	struct emb_server *srv = NULL;
	struct emb_client_table *t1, *t2;
	struct emb_client *one, *two;
	struct tier_pusher p = {0};
	pthread_t th;
	char *dir = emb_test_tmpdir();
	uint64_t *ids = malloc(TIER_ROWS * sizeof(*ids));
	uint32_t *idx = malloc(TIER_BATCH * sizeof(*idx));
	uint32_t *least = malloc(TIER_BATCH * sizeof(*least));
	float *rows = malloc((size_t)TIER_ROWS * TIER_DIM * sizeof(float));
	uint64_t rnd = 5, checked = 0, mismatched = 0;

	so.host = ip;
	so.transport = "rdma";
	so.remote_read = true;
	so.tier_dir = dir;
	/* 8 shards' fixed part (about 5.3 MiB with the server's own) and
	 * room for about a third of the rows (152-byte records, and their
	 * index and marks): the rest is cold. */
	so.mem_limit = 13u << 19;
	CU_ASSERT_EQUAL_FATAL(emb_server_create(&so, &srv), 0);
	sp.optim.kind = EMB_OPTIM_SGD;
	sp.optim.lr = 1.0f;
	one = client(emb_server_port(srv), EMB_PULL_ONESIDED);
	two = client(emb_server_port(srv), EMB_PULL_TWOSIDED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(one);
	CU_ASSERT_PTR_NOT_NULL_FATAL(two);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(one, &sp, &t1), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(two, "tiered", &t2), 0);
	for (uint32_t i = 0; i < TIER_ROWS; i++) {
		ids[i] = tier_id(i);
		for (uint32_t j = 0; j < TIER_DIM; j++)
			rows[(size_t)i * TIER_DIM + j] = (float)i * TIER_BASE;
	}
	for (uint32_t lo = 0; lo < TIER_ROWS; lo += TIER_BATCH)
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_assign(t2, ids + lo, TIER_BATCH,
					    rows + (size_t)lo * TIER_DIM,
					    false),
		    0);
	CU_ASSERT_EQUAL(emb_client_table_stats(t1, &ts), 0);
	CU_ASSERT(ts.rows == TIER_ROWS);
	CU_ASSERT(ts.rows_cold > TIER_ROWS / 2);
	/* The hot set back in DRAM (a push brings a row back at once; a
	 * zero gradient leaves it as it is), and its locations learnt,
	 * before the pushes begin. */
	memset(rows, 0, (size_t)TIER_HOT * TIER_DIM * sizeof(float));
	CU_ASSERT_EQUAL(emb_client_table_push(t2, ids, TIER_HOT, rows, 0, 0),
			0);
	CU_ASSERT(learn(one, t1, ids, TIER_HOT, rows));
	emb_client_stats(one, &st0);

	p.t = t2;
	p.sent = calloc(TIER_ROWS, sizeof(*p.sent));
	p.done = calloc(TIER_ROWS, sizeof(*p.done));
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, tier_push_main, &p),
			      0);
	for (uint32_t r = 0; r < TIER_PULLS; r++) {
		uint64_t bid[TIER_BATCH];

		for (uint32_t k = 0; k < TIER_BATCH; k++) {
			idx[k] = k % 2 ? rnd_id(&rnd, TIER_HOT)
				       : rnd_id(&rnd, TIER_ROWS);
			bid[k] = ids[idx[k]];
			least[k] = __atomic_load_n(&p.done[idx[k]],
						   __ATOMIC_SEQ_CST);
		}
		CU_ASSERT_EQUAL(emb_client_table_pull(t1, bid, TIER_BATCH,
						      rows, 0, NULL),
				0);
		for (uint32_t k = 0; k < TIER_BATCH; k++) {
			const float *w = rows + (size_t)k * TIER_DIM;
			uint32_t i = idx[k];
			float kf = w[0] - (float)i * TIER_BASE;
			uint32_t sent = __atomic_load_n(&p.sent[i],
							__ATOMIC_SEQ_CST);
			bool ok = kf >= 0.0f && kf <= (float)sent &&
				  kf == (float)(uint32_t)kf &&
				  (uint32_t)kf >= least[k];

			for (uint32_t j = 1; j < TIER_DIM && ok; j++)
				ok = memcmp(&w[j], &w[0], sizeof(float)) == 0;
			if (!ok) {
				if (mismatched++ < 5)
					fprintf(stderr,
						"  row %u: %g (base %g, pushes "
						"%u acknowledged before, %u "
						"sent after)\n",
						i, (double)w[0],
						(double)((float)i * TIER_BASE),
						least[k], sent);
				continue;
			}
			checked++;
		}
	}
	__atomic_store_n(&p.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(p.rc, 0);
	CU_ASSERT(p.pushes > 0);
	CU_ASSERT_EQUAL(mismatched, 0);
	CU_ASSERT_EQUAL(checked, (uint64_t)TIER_PULLS * TIER_BATCH);
	emb_client_stats(one, &st);
	CU_ASSERT_EQUAL(emb_client_table_stats(t1, &ts), 0);
	/* Both ways happened: hot rows READ, cold ones two-sided. */
	CU_ASSERT(st.rows_read > st0.rows_read);
	CU_ASSERT(st.rows_fallback > st0.rows_fallback);
	CU_ASSERT(ts.rows_cold > TIER_ROWS / 2);
	CU_ASSERT(ts.tier_reads > 0 && ts.tier_writes > 0);
	fprintf(stderr,
		"  %u pushes; %llu rows READ, %llu two-sided (%.0f %%), %llu "
		"seal failures; %llu of %u rows cold\n",
		p.pushes, (unsigned long long)(st.rows_read - st0.rows_read),
		(unsigned long long)(st.rows_fallback - st0.rows_fallback),
		100.0 * (double)(st.rows_fallback - st0.rows_fallback) /
		    (double)(st.rows_read - st0.rows_read + st.rows_fallback -
			     st0.rows_fallback + !(st.rows_read + st.rows_fallback)),
		(unsigned long long)(st.seal_failures - st0.seal_failures),
		(unsigned long long)ts.rows_cold, TIER_ROWS);
	emb_client_table_close(t1);
	emb_client_table_close(t2);
	emb_client_destroy(one);
	emb_client_destroy(two);
	emb_server_destroy(srv);
	emb_test_rmtree(dir);
	free(dir);
	free(p.sent);
	free(p.done);
	free(ids);
	free(idx);
	free(least);
	free(rows);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
		{"one-sided pulls give the rows two-sided pulls give",
		 test_rows_match_two_sided},
		{"a server without remote reads is pulled two-sided",
		 test_plain_server_pulls_two_sided},
		{"rows being pushed are never read torn",
		 test_no_torn_rows_under_pushes},
		{"erased and evicted rows fall back to two-sided pulls",
		 test_erased_and_evicted_rows_fall_back},
		{"a dropped table is never read, and reads resume after",
		 test_dropped_table_is_never_read},
		{"one-sided pulls waited for after the client is gone",
		 test_async_outlives_client},
		{"compact rows READ decode to what two-sided pulls give",
		 test_compact_rows_match_two_sided},
		{"a tiered table's cold rows come two-sided, all rows right",
		 test_tiered_table_read_one_sided},
		{NULL, NULL},
	};

	ip = getenv("RDMA_VM_IP");
	if (!ip || !emb_transport_available("rdma")) {
		fprintf(stderr, "worker/onesided: no RDMA device here (set "
				"RDMA_VM_IP inside ../shared/rdma-vm); skipped\n");
		return 77;
	}
	return emb_test_main(argc, argv, "worker", cases);
}
