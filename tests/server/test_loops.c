/*
 * tests/server/test_loops.c - what each event loop keeps of its own: the
 * table registry as of its last look (refilled when a create or a drop
 * moved the registry's generation), and its request counters, summed on
 * read. Two clients, whose connections land on the server's two loops,
 * see each other's creates and drops at once; a dropped table is freed
 * although the other loop gets no request to notice it; the requests
 * counted are the frames the loops received; with one clock read per
 * request, every request's latency is still recorded, within the time
 * the client waited for it.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "netutil.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/hist.h"
#include "server/lat.h"
#include "transport/transport.h"

#define DIM 16u
#define N   512u

static void pull(struct emb_client_table *t, const uint64_t *ids, float *out,
		 int want)
{
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, N, out, 0, NULL), want);
}

/* Polls the server's memory in use for up to 5 s until it is 0. */
static uint64_t wait_freed(struct emb_server *s)
{
	struct timespec ts = {0, 10 * 1000 * 1000};
	struct emb_server_stats st;

	for (int i = 0; i < 500; i++) {
		emb_server_stats(s, &st);
		if (st.mem_used == 0 && st.tables == 0)
			return 0;
		nanosleep(&ts, NULL);
	}
	return st.mem_used;
}

static void test_create_drop_across_loops(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_table_spec sp = nt_spec("t", DIM, 1);
	struct emb_client_table *ta, *tb, *ta2, *tb2;
	struct emb_client *a, *b;
	struct emb_server_stats st;
	struct emb_server *s;
	uint64_t ids[N];
	float *ra = malloc((size_t)N * DIM * sizeof(float));
	float *rb = malloc((size_t)N * DIM * sizeof(float));
	char addr[64];
	uint16_t port;

	CU_ASSERT_FATAL(ra && rb);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 1000 + i;
	o.threads = 2;
	s = nt_server_start(&o);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	a = nt_client(addr, 0);
	b = nt_client(addr, 0);

	/* Both loops look the table up, and keep it. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(a, &sp, &ta), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(b, "t", &tb), 0);
	pull(ta, ids, ra, 0);
	pull(tb, ids, rb, 0);
	CU_ASSERT_EQUAL(memcmp(ra, rb, (size_t)N * DIM * sizeof(float)), 0);
	emb_server_stats(s, &st);
	CU_ASSERT(st.mem_used > 0);

	/* Dropped through a: b's loop sees no request, yet lets it go. */
	CU_ASSERT_EQUAL(emb_client_table_drop(ta), 0);
	CU_ASSERT_EQUAL(wait_freed(s), 0);
	pull(tb, ids, rb, EMB_ENOTABLE);
	pull(ta, ids, ra, EMB_ENOTABLE);

	/* Made again in the same slot with another seed: b sees the new
	 * one, not its loop's old pointer. */
	sp.seed = 2;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(a, &sp, &ta2), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(b, "t", &tb2), 0);
	pull(tb2, ids, rb, 0);
	pull(ta2, ids, ra, 0);
	CU_ASSERT_EQUAL(memcmp(ra, rb, (size_t)N * DIM * sizeof(float)), 0);
	pull(tb, ids, ra, 0); /* the same id: the old handle names it too */
	CU_ASSERT_EQUAL(memcmp(ra, rb, (size_t)N * DIM * sizeof(float)), 0);

	emb_client_table_close(tb2);
	emb_client_table_close(ta2);
	emb_client_table_close(tb);
	emb_client_table_close(ta);
	emb_client_destroy(b);
	emb_client_destroy(a);
	emb_server_destroy(s);
	free(rb);
	free(ra);
}

/* Requests counted per loop add up to every frame the loops received. */
static void test_requests_summed(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_table_spec sp = nt_spec("t", DIM, 1);
	struct emb_client_table *t[2];
	struct emb_client *c[2];
	struct emb_server_stats st;
	struct emb_server *s;
	uint64_t ids[N], frames = 0;
	float *rows = calloc((size_t)N * DIM, sizeof(float));
	char addr[64];
	uint16_t port;

	CU_ASSERT_FATAL(rows != NULL);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 7 * i;
	o.threads = 2;
	s = nt_server_start(&o);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	for (int k = 0; k < 2; k++) {
		c[k] = nt_client(addr, 0);
		CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c[k], &sp, &t[k]),
				      0);
		for (int r = 0; r < 25; r++) {
			pull(t[k], ids, rows, 0);
			CU_ASSERT_EQUAL(emb_client_table_push(t[k], ids, N,
							      rows, 0, 0),
					0);
		}
	}
	for (uint32_t i = 0; i < emb_server_nloops(s); i++) {
		struct emb_transport_stats ts;

		emb_server_loop_stats(s, i, &ts);
		CU_ASSERT(ts.frames_in > 0); /* both loops served */
		frames += ts.frames_in;
	}
	emb_server_stats(s, &st);
	/* 2 x (HELLO, CREATE, 25 x (PULL, PUSH)) at least. */
	CU_ASSERT(st.requests >= 2 * 52);
	CU_ASSERT_EQUAL(st.requests, frames);
	for (int k = 0; k < 2; k++) {
		emb_client_table_close(t[k]);
		emb_client_destroy(c[k]);
	}
	emb_server_destroy(s);
	free(rows);
}

/*
 * A request's latency ends at the loop's next clock read (the next
 * request's start, or the end of the wake-up): each one is recorded, and
 * none is longer than the client's wait for it.
 */
static void test_latency_one_read(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_table_spec sp = nt_spec("t", DIM, 1);
	struct timespec ts = {0, 10 * 1000 * 1000};
	struct emb_client_table *t;
	struct emb_client *c;
	struct emb_server *s;
	struct emb_hist h;
	uint64_t ids[N], waited = 0;
	float *rows = calloc((size_t)N * DIM, sizeof(float));
	char addr[64];
	uint16_t port;

	CU_ASSERT_FATAL(rows != NULL);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 3 * i;
	s = nt_server_start(&o);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	for (int r = 0; r < 20; r++) {
		uint64_t t0 = emb_clock_ns();

		pull(t, ids, rows, 0);
		waited += emb_clock_ns() - t0;
	}
	/* The last one is recorded when its wake-up ends: soon. */
	for (int i = 0; i < 500; i++) {
		emb_server_latency(s, EMB_LAT_PULL, &h);
		if (h.count >= 20)
			break;
		nanosleep(&ts, NULL);
	}
	CU_ASSERT_EQUAL(h.count, 20);
	CU_ASSERT(h.sum > 0);
	CU_ASSERT(h.sum <= waited);
	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
	free(rows);
}

/* How many of this process's threads are named name. */
static int threads_named(const char *name)
{
	char path[64], comm[32];
	struct dirent *de;
	int n = 0;
	DIR *d = opendir("/proc/self/task");

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d)) != NULL) {
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm",
			 de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* gone meanwhile */
		if (fgets(comm, sizeof(comm), f)) {
			comm[strcspn(comm, "\n")] = 0;
			n += strcmp(comm, name) == 0;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/*
 * Each thread carries its name, for top -H, perf and gdb (the list is
 * docs/architecture.md, "Threads"): the server's loops and sweeper and
 * a client's connection thread; gone with their owner.
 */
static void test_threads_named(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_server *s;
	struct emb_client *c;
	char addr[64];
	uint16_t port;

	o.threads = 2;
	s = nt_server_start(&o);
	port = emb_server_port(s);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	c = nt_client(addr, 0);
	CU_ASSERT_EQUAL(threads_named("emb-loop0"), 1);
	CU_ASSERT_EQUAL(threads_named("emb-loop1"), 1);
	CU_ASSERT_EQUAL(threads_named("emb-sweep"), 1);
	CU_ASSERT_EQUAL(threads_named("emb-client"), 1);
	emb_client_destroy(c);
	emb_server_destroy(s);
	CU_ASSERT_EQUAL(threads_named("emb-loop0"), 0);
	CU_ASSERT_EQUAL(threads_named("emb-client"), 0);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"creates and drops reach every loop's registry at once",
	     test_create_drop_across_loops},
	    {"per-loop request counts add up to the frames received",
	     test_requests_summed},
	    {"one clock read per request still times every request",
	     test_latency_one_read},
	    {"every thread is named: loops, sweeper, client",
	     test_threads_named},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "server/loops", cases);
}
