/*
 * tests/cluster/test_cluster.c - the scheduler, the node agent and
 * emb_client_from_env(): ranks, the environment's two spellings, the
 * cluster map, barriers, dead nodes and the end of the job. The scheduler
 * and servers run in this process, except where a test needs a process to
 * freeze or to exit: there embstore-server runs as a child
 * (EMB_SERVER_BIN). Single-threaded but for the worker threads a case
 * starts itself.
 */
#include <errno.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_util.h"
#include "harness.h"
#include "worker/netutil.h"
#include "cluster/scheduler.h"
#include "worker/embstore.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "common/clock.h"
#include "common/err.h"
#include "proto/wire_cluster.h"

static struct emb_sched *sched_start(uint32_t S, uint32_t W,
				     uint32_t hb_timeout_ms)
{
	struct emb_sched_opts o = EMB_SCHED_OPTS_DEFAULT;
	struct emb_sched *s;

	o.port = 0;
	o.server_num = S;
	o.worker_num = W;
	o.hb_timeout_ms = hb_timeout_ms;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &s), 0);
	return s;
}

/* The environment a node of this scheduler reads. */
static void env_for(const struct emb_sched *s)
{
	char port[16];

	snprintf(port, sizeof(port), "%u", emb_sched_port(s));
	setenv("EMB_SCHED_HOST", "127.0.0.1", 1);
	setenv("EMB_SCHED_PORT", port, 1);
	setenv("EMB_CLUSTER_TIMEOUT", "20", 1);
}

static void env_clear(void)
{
	static const char *const names[] = {
	    "EMB_ROLE",
	    "EMB_SCHED_HOST",
	    "EMB_SCHED_PORT",
	    "EMB_SERVER_NUM",
	    "EMB_WORKER_NUM",
	    "EMB_HEARTBEAT_TIMEOUT",
	    "EMB_CLUSTER_TIMEOUT",
	    "MS_ROLE",
	    "MS_SCHED_HOST",
	    "MS_SCHED_PORT",
	    "MS_SERVER_NUM",
	    "MS_WORKER_NUM",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unsetenv(names[i]);
}

static int node_join(const struct emb_sched *s, uint32_t role, const char *host,
		     uint16_t port, struct emb_node **out)
{
	struct emb_node_opts o = {
	    .sched_host = "127.0.0.1",
	    .sched_port = emb_sched_port(s),
	    .role = role,
	    .host = host,
	    .port = port,
	    .join_timeout_ms = 10000,
	};

	return emb_node_create(&o, out);
}

/* ---- environment ---------------------------------------------------- */

static void test_env_names(void)
{
	struct emb_cluster_env e;
	const char *bad = NULL;

	env_clear();
	setenv("MS_ROLE", "MS_PSERVER", 1);
	setenv("MS_SCHED_HOST", "10.0.0.1", 1);
	setenv("MS_SCHED_PORT", "8081", 1);
	setenv("MS_SERVER_NUM", "3", 1);
	setenv("MS_WORKER_NUM", "5", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), 0);
	CU_ASSERT_EQUAL(e.role, EMB_ROLE_SERVER);
	CU_ASSERT_STRING_EQUAL(e.sched_host, "10.0.0.1");
	CU_ASSERT_EQUAL(e.sched_port, 8081);
	CU_ASSERT_EQUAL(e.server_num, 3);
	CU_ASSERT_EQUAL(e.worker_num, 5);
	CU_ASSERT_EQUAL(e.hb_timeout_ms, EMB_HEARTBEAT_TIMEOUT_DEFAULT);

	/* embstore's own names win over the aliases. */
	setenv("EMB_ROLE", "scheduler", 1);
	setenv("EMB_SCHED_HOST", "10.0.0.2", 1);
	setenv("EMB_SCHED_PORT", "9000", 1);
	setenv("EMB_SERVER_NUM", "2", 1);
	setenv("EMB_WORKER_NUM", "4", 1);
	setenv("EMB_HEARTBEAT_TIMEOUT", "0.5", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), 0);
	CU_ASSERT_EQUAL(e.role, EMB_ROLE_SCHEDULER);
	CU_ASSERT_STRING_EQUAL(e.sched_host, "10.0.0.2");
	CU_ASSERT_EQUAL(e.sched_port, 9000);
	CU_ASSERT_EQUAL(e.server_num, 2);
	CU_ASSERT_EQUAL(e.worker_num, 4);
	CU_ASSERT_EQUAL(e.hb_timeout_ms, 500);

	setenv("MS_ROLE", "MS_WORKER", 1);
	unsetenv("EMB_ROLE");
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), 0);
	CU_ASSERT_EQUAL(e.role, EMB_ROLE_WORKER);
	env_clear();
}

static void test_env_rejects(void)
{
	struct emb_cluster_env e;
	const char *bad = NULL;

	env_clear();
	setenv("MS_ROLE", "MS_BOSS", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), -EINVAL);
	CU_ASSERT_STRING_EQUAL(bad, "EMB_ROLE");
	env_clear();
	setenv("EMB_SCHED_PORT", "70000", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), -EINVAL);
	CU_ASSERT_STRING_EQUAL(bad, "EMB_SCHED_PORT");
	env_clear();
	setenv("EMB_WORKER_NUM", "0", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), -EINVAL);
	env_clear();
	setenv("EMB_HEARTBEAT_TIMEOUT", "-1", 1);
	CU_ASSERT_EQUAL(emb_cluster_env_read(&e, &bad), -EINVAL);
	env_clear();
}

/* ---- registration and the map --------------------------------------- */

static void test_ranks(void)
{
	struct emb_sched *s = sched_start(2, 2, 10000);
	struct emb_node *sv[3], *wk[3];

	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "127.0.0.1", 1111, &sv[0]), 0);
	CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_WORKER, NULL, 0, &wk[0]),
			      0);
	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "127.0.0.1", 2222, &sv[1]), 0);
	CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_WORKER, NULL, 0, &wk[1]),
			      0);
	CU_ASSERT_EQUAL(emb_node_rank(sv[0]), 0);
	CU_ASSERT_EQUAL(emb_node_rank(sv[1]), 1);
	CU_ASSERT_EQUAL(emb_node_rank(wk[0]), 0);
	CU_ASSERT_EQUAL(emb_node_rank(wk[1]), 1);
	CU_ASSERT_EQUAL(emb_node_nservers(wk[0]), 2);
	CU_ASSERT_EQUAL(emb_node_nworkers(sv[0]), 2);
	/* Every place is taken. */
	CU_ASSERT_EQUAL(
	    node_join(s, EMB_ROLE_SERVER, "127.0.0.1", 3333, &sv[2]),
	    EMB_ECLUSTER);
	CU_ASSERT_EQUAL(node_join(s, EMB_ROLE_WORKER, NULL, 0, &wk[2]),
			EMB_ECLUSTER);
	for (int i = 0; i < 2; i++) {
		emb_node_destroy(wk[i]);
		emb_node_destroy(sv[i]);
	}
	emb_sched_destroy(s);
}

static void test_map(void)
{
	struct emb_sched *s = sched_start(3, 1, 10000);
	struct emb_node *sv[3], *wk;
	const struct emb_wire_node_addr *addr;
	const uint16_t *map;
	uint32_t per[3] = {0};

	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "127.0.0.1", 7001, &sv[0]), 0);
	/* A server bound to every address is reached where it came from. */
	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "0.0.0.0", 7002, &sv[1]), 0);
	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "localhost", 7003, &sv[2]), 0);
	CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_WORKER, NULL, 0, &wk), 0);
	CU_ASSERT_EQUAL_FATAL(emb_node_wait_map(wk), 0);
	map = emb_node_slot_map(wk);
	addr = emb_node_servers(wk);
	CU_ASSERT_PTR_NOT_NULL_FATAL(map);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		CU_ASSERT_FATAL(map[sl] < 3);
		per[map[sl]]++;
		/* Contiguous ranges, as a plain server list routes. */
		if (sl)
			CU_ASSERT(map[sl] >= map[sl - 1]);
	}
	for (int i = 0; i < 3; i++)
		CU_ASSERT(per[i] >= EMB_NSLOTS / 3);
	CU_ASSERT_STRING_EQUAL(addr[0].host, "127.0.0.1");
	CU_ASSERT_EQUAL(addr[0].port, 7001);
	CU_ASSERT_STRING_EQUAL(addr[1].host, "127.0.0.1");
	CU_ASSERT_EQUAL(addr[1].port, 7002);
	CU_ASSERT_STRING_EQUAL(addr[2].host, "localhost");
	CU_ASSERT_EQUAL(addr[2].port, 7003);
	/* Servers get the same map. */
	CU_ASSERT_EQUAL(emb_node_wait_map(sv[2]), 0);
	CU_ASSERT_EQUAL(
	    memcmp(emb_node_slot_map(sv[2]), map, EMB_NSLOTS * sizeof(*map)),
	    0);
	emb_node_destroy(wk);
	for (int i = 0; i < 3; i++)
		emb_node_destroy(sv[i]);
	emb_sched_destroy(s);
}

static void test_map_timeout(void)
{
	struct emb_sched *s = sched_start(1, 2, 10000);
	struct emb_node_opts o = {
	    .sched_host = "127.0.0.1",
	    .sched_port = emb_sched_port(s),
	    .role = EMB_ROLE_WORKER,
	    .join_timeout_ms = 200,
	};
	struct emb_node *wk;

	/* One worker of two, no server: the map never comes. */
	CU_ASSERT_EQUAL_FATAL(emb_node_create(&o, &wk), 0);
	CU_ASSERT_EQUAL(emb_node_wait_map(wk), -ETIMEDOUT);
	emb_node_destroy(wk);
	emb_sched_destroy(s);
}

static void test_no_scheduler(void)
{
	struct emb_node_opts o = {
	    .sched_host = "127.0.0.1",
	    .sched_port = 1,
	    .role = EMB_ROLE_WORKER,
	    .join_timeout_ms = 300,
	};
	struct emb_node *wk;

	CU_ASSERT_EQUAL(emb_node_create(&o, &wk), -ECONNREFUSED);
	env_clear();
	CU_ASSERT_EQUAL(emb_client_from_env(NULL, &(struct emb_client *){0}),
			-EINVAL);
}

/* ---- workers through the client ------------------------------------- */

struct cluster {
	struct emb_sched *sched;
	struct emb_server *srv[4];
	struct emb_node *snode[4];
	uint32_t S, W;
	int ends[4]; /* on_end status per server, or 1 = not yet */
};

static void cluster_up(struct cluster *cl, uint32_t S, uint32_t W,
		       uint32_t hb_timeout_ms)
{
	memset(cl, 0, sizeof(*cl));
	cl->S = S;
	cl->W = W;
	cl->sched = sched_start(S, W, hb_timeout_ms);
	env_clear();
	env_for(cl->sched);
	for (uint32_t i = 0; i < S; i++) {
		struct emb_server_opts so = nt_server_opts();
		struct emb_node_opts no = {
		    .sched_host = "127.0.0.1",
		    .sched_port = emb_sched_port(cl->sched),
		    .role = EMB_ROLE_SERVER,
		    .host = "127.0.0.1",
		    .join_timeout_ms = 10000,
		    .on_end = on_server_end,
		};

		cl->ends[i] = 1;
		no.arg = &cl->ends[i];
		cl->srv[i] = nt_server_start(&so);
		no.port = emb_server_port(cl->srv[i]);
		CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &cl->snode[i]), 0);
	}
}

static void cluster_down(struct cluster *cl)
{
	for (uint32_t i = 0; i < cl->S; i++) {
		emb_node_destroy(cl->snode[i]);
		emb_server_destroy(cl->srv[i]);
	}
	emb_sched_destroy(cl->sched);
	env_clear();
}

static void test_from_env_trains(void)
{
	struct cluster cl;
	struct worker w[2] = {0};
	struct emb_table_spec spec = nt_spec("emb", 4, 7);
	struct emb_client_table *t[2];
	uint64_t ids[64];
	float rows[64 * 4], grads[64 * 4], again[64 * 4];
	bool rank_seen[2] = {false, false};

	cluster_up(&cl, 2, 2, 10000);
	workers_join(w, 2);
	for (int i = 0; i < 2; i++) {
		uint32_t r = emb_client_rank(w[i].c);

		CU_ASSERT_FATAL(r < 2);
		rank_seen[r] = true;
		CU_ASSERT_EQUAL(emb_client_nworkers(w[i].c), 2);
		CU_ASSERT_EQUAL(emb_client_nservers(w[i].c), 2);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_create(w[i].c, &spec, &t[i]), 0);
	}
	CU_ASSERT(rank_seen[0] && rank_seen[1]);

	/* Rows spread over both servers, and both workers see one table. */
	for (int i = 0; i < 64; i++)
		ids[i] = (uint64_t)i * 7919;
	CU_ASSERT_EQUAL(emb_client_table_pull(t[0], ids, 64, rows, 0, NULL), 0);
	for (int i = 0; i < 64 * 4; i++)
		grads[i] = 1.0f;
	CU_ASSERT_EQUAL(emb_client_table_push(t[0], ids, 64, grads, 1, 0), 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t[1], ids, 64, again, 0, NULL),
			0);
	CU_ASSERT(memcmp(rows, again, sizeof(rows)) != 0);
	{
		bool on[2] = {false, false};

		for (int i = 0; i < 64; i++)
			on[emb_client_server_of(w[1].c, ids[i])] = true;
		CU_ASSERT(on[0] && on[1]);
	}
	for (int i = 0; i < 2; i++) {
		emb_client_table_close(t[i]);
		CU_ASSERT_EQUAL(emb_client_finish(w[i].c), 0);
		emb_client_destroy(w[i].c);
	}
	/* Every worker finished: servers are told, then the job is over. */
	CU_ASSERT_EQUAL(emb_sched_wait(cl.sched, 20000), 0);
	/* Each server's agent hears the FINISH answer on its own time. */
	for (uint32_t i = 0; i < cl.S; i++) {
		for (int k = 0;
		     k < 500 &&
		     __atomic_load_n(&cl.ends[i], __ATOMIC_SEQ_CST) == 1;
		     k++)
			sleep_ms(10);
		CU_ASSERT_EQUAL(__atomic_load_n(&cl.ends[i], __ATOMIC_SEQ_CST),
				0);
	}
	cluster_down(&cl);
}

/* ---- the cluster's token ------------------------------------------- */

static void test_token_cluster(void)
{
	static const char token[] = "cluster-secret";
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 16 + 16];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_sched_opts so = EMB_SCHED_OPTS_DEFAULT;
	struct emb_server_opts vo = nt_server_opts();
	struct emb_node_opts no = {
	    .sched_host = "127.0.0.1",
	    .role = EMB_ROLE_SERVER,
	    .host = "127.0.0.1",
	    .join_timeout_ms = 10000,
	};
	struct emb_table_spec spec = nt_spec("tok", 4, 3);
	struct emb_client_table *t;
	struct emb_server *srv;
	struct emb_sched *sched;
	struct emb_node *rogue = NULL, *snode = NULL;
	struct worker w = {0};
	struct emb_frame_hdr rh;
	char path[512], list[256], want[64];
	char *dir = emb_test_tmpdir();
	uint64_t ids[16];
	float rows[16 * 4];
	FILE *f;
	int fd, len;

	snprintf(path, sizeof(path), "%s/token", dir);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fprintf(f, "%s\n", token);
	fclose(f);
	so.port = 0;
	so.auth_token = (const uint8_t *)token;
	so.auth_token_len = sizeof(token) - 1;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&so, &sched), 0);
	no.sched_port = emb_sched_port(sched);

	/* A REGISTER that skips HELLO is refused and its connection closed. */
	fd = nt_raw_connect(emb_sched_port(sched));
	len = emb_wire_register_req_encode(buf, sizeof(buf), 5,
					   EMB_ROLE_SERVER, 9, 1, "10.9.9.9");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL(nt_raw_recv(fd, &rh, resp, sizeof(resp)), 0);
	CU_ASSERT_EQUAL(rh.status, EMB_ENOHELLO);
	CU_ASSERT(nt_raw_wait_closed(fd));
	close(fd);
	/* So does a node without the token, or with another one. */
	no.port = 9;
	CU_ASSERT_EQUAL(emb_node_create(&no, &rogue), EMB_ENOHELLO);
	no.auth_token = (const uint8_t *)"guess";
	no.auth_token_len = 5;
	CU_ASSERT_EQUAL(emb_node_create(&no, &rogue), EMB_EAUTH);

	/* The real server, with the token, still gets rank 0. */
	vo.auth_token = (const uint8_t *)token;
	vo.auth_token_len = sizeof(token) - 1;
	srv = nt_server_start(&vo);
	no.port = emb_server_port(srv);
	no.auth_token = (const uint8_t *)token;
	no.auth_token_len = sizeof(token) - 1;
	CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &snode), 0);
	CU_ASSERT_EQUAL(emb_node_rank(snode), 0);

	/* The worker reads the token file from the environment and uses it
	 * with the scheduler and the server. */
	env_clear();
	env_for(sched);
	setenv("EMB_AUTH_TOKEN_FILE", path, 1);
	workers_join(&w, 1);
	snprintf(want, sizeof(want), "127.0.0.1:%u", emb_server_port(srv));
	CU_ASSERT_EQUAL(emb_client_servers(w.c, list, sizeof(list)), 0);
	CU_ASSERT_STRING_EQUAL(list, want);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(w.c, &spec, &t), 0);
	for (int i = 0; i < 16; i++)
		ids[i] = (uint64_t)i;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 16, rows, 0, NULL), 0);
	emb_client_table_close(t);

	/* An observer needs the token too. */
	snprintf(want, sizeof(want), "127.0.0.1:%u", emb_sched_port(sched));
	CU_ASSERT_EQUAL(emb_cluster_servers(want, list, sizeof(list)),
			EMB_ENOHELLO);
	CU_ASSERT_EQUAL(emb_cluster_servers_auth(want,
						 (const uint8_t *)token,
						 sizeof(token) - 1, list,
						 sizeof(list)),
			0);

	CU_ASSERT_EQUAL(emb_client_finish(w.c), 0);
	emb_client_destroy(w.c);
	CU_ASSERT_EQUAL(emb_sched_wait(sched, 20000), 0);
	emb_node_destroy(snode);
	emb_server_destroy(srv);
	emb_sched_destroy(sched);
	unsetenv("EMB_AUTH_TOKEN_FILE");
	env_clear();
	emb_test_rmtree(dir);
	free(dir);
}

struct barrier_arg {
	struct emb_client *c;
	const char *name;
	int rc;
	bool returned;
};

static void *barrier_main(void *arg)
{
	struct barrier_arg *b = arg;

	b->rc = emb_client_barrier(b->c, b->name);
	__atomic_store_n(&b->returned, true, __ATOMIC_SEQ_CST);
	return NULL;
}

static void test_barrier(void)
{
	struct cluster cl;
	struct worker w[3] = {0};
	struct barrier_arg b[3];
	pthread_t th[3];

	cluster_up(&cl, 1, 3, 10000);
	workers_join(w, 3);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 2; i++) {
			b[i] = (struct barrier_arg){w[i].c, "step", 0, false};
			pthread_create(&th[i], NULL, barrier_main, &b[i]);
		}
		/* Two of three arrived: nobody may pass. */
		sleep_ms(100);
		CU_ASSERT(!__atomic_load_n(&b[0].returned, __ATOMIC_SEQ_CST));
		CU_ASSERT(!__atomic_load_n(&b[1].returned, __ATOMIC_SEQ_CST));
		CU_ASSERT_EQUAL(emb_client_barrier(w[2].c, "step"), 0);
		for (int i = 0; i < 2; i++) {
			pthread_join(th[i], NULL);
			CU_ASSERT_EQUAL(b[i].rc, 0);
		}
	}
	CU_ASSERT_EQUAL(emb_client_barrier(w[0].c, ""), -EINVAL);
	for (int i = 0; i < 3; i++) {
		emb_client_finish(w[i].c);
		emb_client_destroy(w[i].c);
	}
	CU_ASSERT_EQUAL(emb_sched_wait(cl.sched, 20000), 0);
	cluster_down(&cl);
}

static void test_barrier_dead_worker(void)
{
	struct cluster cl;
	struct worker w[2] = {0};
	struct barrier_arg b;
	pthread_t th;

	cluster_up(&cl, 1, 2, 10000);
	workers_join(w, 2);
	b = (struct barrier_arg){w[0].c, "epoch", 0, false};
	pthread_create(&th, NULL, barrier_main, &b);
	sleep_ms(50);
	/* Worker 1 goes away without finishing: it failed. */
	emb_client_destroy(w[1].c);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(b.rc, EMB_ENODEAD);
	CU_ASSERT_EQUAL(emb_client_barrier(w[0].c, "epoch"), EMB_ENODEAD);
	emb_client_finish(w[0].c);
	emb_client_destroy(w[0].c);
	/* The job ends, and says a node died. */
	CU_ASSERT_EQUAL(emb_sched_wait(cl.sched, 20000), EMB_ENODEAD);
	cluster_down(&cl);
}

static void test_scheduler_lost(void)
{
	struct cluster cl;
	struct worker w[2] = {0};
	struct barrier_arg b;
	pthread_t th;

	/* Nodes ride out a missing scheduler for this long, then give up
	 * as they always did. */
	setenv("EMB_SCHED_GRACE", "1", 1);
	cluster_up(&cl, 1, 2, 1000);
	workers_join(w, 2);
	b = (struct barrier_arg){w[0].c, "epoch", 0, false};
	pthread_create(&th, NULL, barrier_main, &b);
	sleep_ms(50);
	emb_sched_destroy(cl.sched);
	cl.sched = NULL;
	/* The waiting barrier, and the servers' agents, hear of it. */
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(b.rc, EMB_ENOSCHED);
	CU_ASSERT_EQUAL(emb_client_finish(w[1].c), EMB_ENOSCHED);
	for (int k = 0;
	     k < 500 && __atomic_load_n(&cl.ends[0], __ATOMIC_SEQ_CST) == 1;
	     k++)
		sleep_ms(10);
	CU_ASSERT_EQUAL(__atomic_load_n(&cl.ends[0], __ATOMIC_SEQ_CST),
			EMB_ENOSCHED);
	for (int i = 0; i < 2; i++)
		emb_client_destroy(w[i].c);
	cluster_down(&cl);
	unsetenv("EMB_SCHED_GRACE");
}

/*
 * A scheduler that dies mid-job and starts again on its port with its
 * state file: every node rejoins, a barrier entered before the death
 * completes after it, and the job ends as ever when the workers finish.
 */
static void test_scheduler_restarts(void)
{
	struct emb_sched_opts o = EMB_SCHED_OPTS_DEFAULT;
	struct emb_sched_stats st;
	struct cluster cl;
	struct worker w[2] = {0};
	struct barrier_arg b;
	char *dir = emb_test_tmpdir(), path[512];
	pthread_t th;
	uint16_t port;

	snprintf(path, sizeof(path), "%s/sched.state", dir);
	cluster_up(&cl, 1, 2, 1000);
	/* cluster_up's scheduler has no state file: this one does, on the
	 * same port, before anyone joined. */
	port = emb_sched_port(cl.sched);
	emb_node_destroy(cl.snode[0]);
	emb_sched_destroy(cl.sched);
	o.port = port;
	o.server_num = 1;
	o.worker_num = 2;
	o.hb_timeout_ms = 1000;
	o.state_file = path;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &cl.sched), 0);
	{
		struct emb_node_opts no = {
		    .sched_host = "127.0.0.1",
		    .sched_port = port,
		    .role = EMB_ROLE_SERVER,
		    .host = "127.0.0.1",
		    .port = emb_server_port(cl.srv[0]),
		    .join_timeout_ms = 10000,
		    .on_end = on_server_end,
		    .arg = &cl.ends[0],
		};

		CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &cl.snode[0]), 0);
	}
	workers_join(w, 2);
	/* The server knows the cluster formed (its heartbeats would tell
	 * it soon): a node rides out only a formed cluster's scheduler. */
	CU_ASSERT_EQUAL(emb_node_wait_map(cl.snode[0]), 0);
	CU_ASSERT_EQUAL(access(path, F_OK), 0);

	b = (struct barrier_arg){w[0].c, "epoch", 0, false};
	pthread_create(&th, NULL, barrier_main, &b);
	sleep_ms(100);
	/* The scheduler dies; nodes go on without it for a while. */
	emb_sched_destroy(cl.sched);
	sleep_ms(300);
	CU_ASSERT(!__atomic_load_n(&b.returned, __ATOMIC_SEQ_CST));
	CU_ASSERT_EQUAL(__atomic_load_n(&cl.ends[0], __ATOMIC_SEQ_CST), 1);
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &cl.sched), 0);
	/* The barrier's first worker sends it again on the new link; the
	 * second arrives there. */
	CU_ASSERT_EQUAL(emb_client_barrier(w[1].c, "epoch"), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(b.rc, 0);
	emb_sched_stats(cl.sched, &st);
	CU_ASSERT_EQUAL(st.alive[0], 1);
	CU_ASSERT_EQUAL(st.alive[1], 2);
	CU_ASSERT_EQUAL(st.dead[0] + st.dead[1], 0);
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(emb_client_finish(w[i].c), 0);
		emb_client_destroy(w[i].c);
	}
	CU_ASSERT_EQUAL(emb_sched_wait(cl.sched, 20000), 0);
	for (int k = 0;
	     k < 500 && __atomic_load_n(&cl.ends[0], __ATOMIC_SEQ_CST) == 1;
	     k++)
		sleep_ms(10);
	CU_ASSERT_EQUAL(__atomic_load_n(&cl.ends[0], __ATOMIC_SEQ_CST), 0);
	/* A job that is over leaves no state to take up. */
	CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
	cluster_down(&cl);
	emb_test_rmtree(dir);
	free(dir);
}

/*
 * A restarted scheduler declares a node that does not come back within
 * its rejoin window dead: a worker that vanished while it was away fails
 * the job, as a worker death always does.
 */
static void test_restart_missing_node(void)
{
	struct emb_sched_opts o = EMB_SCHED_OPTS_DEFAULT;
	struct cluster cl;
	struct worker w[2] = {0};
	char *dir = emb_test_tmpdir(), path[512];
	uint16_t port;

	snprintf(path, sizeof(path), "%s/sched.state", dir);
	cluster_up(&cl, 1, 2, 500);
	port = emb_sched_port(cl.sched);
	emb_node_destroy(cl.snode[0]);
	emb_sched_destroy(cl.sched);
	o.port = port;
	o.server_num = 1;
	o.worker_num = 2;
	o.hb_timeout_ms = 500;
	o.state_file = path;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &cl.sched), 0);
	{
		struct emb_node_opts no = {
		    .sched_host = "127.0.0.1",
		    .sched_port = port,
		    .role = EMB_ROLE_SERVER,
		    .host = "127.0.0.1",
		    .port = emb_server_port(cl.srv[0]),
		    .join_timeout_ms = 10000,
		    .on_end = on_server_end,
		    .arg = &cl.ends[0],
		};

		CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &cl.snode[0]), 0);
	}
	workers_join(w, 2);
	CU_ASSERT_EQUAL(emb_node_wait_map(cl.snode[0]), 0);
	emb_sched_destroy(cl.sched);
	/* Worker 1 is gone before the scheduler comes back. */
	emb_client_destroy(w[1].c);
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &cl.sched), 0);
	/* Worker 0's barrier fails once the window passes (10 s). */
	CU_ASSERT_EQUAL(emb_client_barrier(w[0].c, "x"), EMB_ENODEAD);
	emb_client_destroy(w[0].c);
	CU_ASSERT_EQUAL(emb_sched_wait(cl.sched, 30000), EMB_ENODEAD);
	cluster_down(&cl);
	emb_test_rmtree(dir);
	free(dir);
}

static void test_without_scheduler(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *srv = nt_server_start(&so);
	char list[64];
	uint16_t port = emb_server_port(srv);
	struct emb_client *c;

	nt_addr_list(list, sizeof(list), &port, 1);
	c = nt_client(list, 0);
	CU_ASSERT_EQUAL(emb_client_rank(c), 0);
	CU_ASSERT_EQUAL(emb_client_nworkers(c), 1);
	CU_ASSERT_EQUAL(emb_client_barrier(c, "x"), EMB_ENOSCHED);
	CU_ASSERT_EQUAL(emb_client_finish(c), EMB_ENOSCHED);
	emb_client_destroy(c);
	emb_server_destroy(srv);
}

/* ---- server processes ----------------------------------------------- */

/* embstore-server children joined to s; env_for(s) must be set. */
static void spawn_servers(struct nt_child *ch, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		nt_child_start(&ch[i], NULL);
}

static int exit_code(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct pull_arg {
	struct emb_client_table *t;
	uint64_t *ids;
	uint32_t n;
	float *rows;
	int rc;
};

static void *pull_main(void *arg)
{
	struct pull_arg *p = arg;

	p->rc = emb_client_table_pull(p->t, p->ids, p->n, p->rows, 0, NULL);
	return NULL;
}

static void test_frozen_server_dead(void)
{
	struct emb_sched *s = sched_start(2, 1, 1000);
	struct nt_child ch[2];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_table_spec spec = nt_spec("emb", 8, 1);
	struct pull_arg p;
	uint64_t ids[256];
	float rows[256 * 8];
	pthread_t th;
	int st;

	env_clear();
	env_for(s);
	spawn_servers(ch, 2);
	CU_ASSERT_EQUAL_FATAL(emb_client_from_env(NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &spec, &t), 0);
	for (int i = 0; i < 256; i++)
		ids[i] = (uint64_t)i;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 256, rows, 0, NULL), 0);

	/* Frozen servers keep their sockets open: only silence shows it. */
	kill(ch[1].pid, SIGSTOP);
	kill(ch[0].pid, SIGSTOP);
	p = (struct pull_arg){t, ids, 256, rows, 0};
	pthread_create(&th, NULL, pull_main, &p);
	pthread_join(th, NULL);
	/* Declared dead after ~1 s, well before the client's 30 s timeout. */
	CU_ASSERT_EQUAL(p.rc, EMB_ENODEAD);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 256, rows, 0, NULL),
			EMB_ENODEAD);
	emb_client_table_close(t);
	emb_client_destroy(c);
	for (int i = 0; i < 2; i++) {
		kill(ch[i].pid, SIGKILL);
		kill(ch[i].pid, SIGCONT);
		nt_child_reap(&ch[i], 0);
	}
	st = emb_sched_wait(s, 5000);
	CU_ASSERT(st == EMB_ENODEAD || st == -ETIMEDOUT);
	emb_sched_destroy(s);
	env_clear();
}

/*
 * A server stopped for less than the scheduler's verdict takes (suspect
 * after T, then a probe with a deadline of T) is not dead, and does not
 * itself count the time it was stopped as the scheduler's silence: it
 * goes on, and the job ends with 0.
 */
static void test_short_stop_survives(void)
{
	struct emb_sched *s = sched_start(1, 1, 1000);
	struct emb_sched_stats v;
	struct nt_child ch;
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_table_spec spec = nt_spec("emb", 8, 1);
	uint64_t ids[64];
	float rows[64 * 8];
	int status;

	env_clear();
	env_for(s);
	spawn_servers(&ch, 1);
	CU_ASSERT_EQUAL_FATAL(emb_client_from_env(NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &spec, &t), 0);
	for (int i = 0; i < 64; i++)
		ids[i] = (uint64_t)i;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL), 0);
	kill(ch.pid, SIGSTOP);
	sleep_ms(1500);
	kill(ch.pid, SIGCONT);
	sleep_ms(2000);
	CU_ASSERT_EQUAL(waitpid(ch.pid, &status, WNOHANG), 0);
	emb_sched_stats(s, &v);
	CU_ASSERT_EQUAL(v.dead[0], 0);
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 64, rows, 0, NULL), 0);
	emb_client_table_close(t);
	CU_ASSERT_EQUAL(emb_client_finish(c), 0);
	emb_client_destroy(c);
	CU_ASSERT_EQUAL(exit_code(ch.pid), 0);
	ch.pid = 0;
	nt_child_reap(&ch, 0);
	CU_ASSERT_EQUAL(emb_sched_wait(s, 10000), 0);
	emb_sched_destroy(s);
	env_clear();
}

static void test_killed_server_dead(void)
{
	struct emb_sched *s = sched_start(2, 1, 1000);
	struct nt_child ch[2];
	struct emb_client *c;
	struct emb_client_table *t;
	struct emb_table_spec spec = nt_spec("emb", 8, 1);
	uint64_t ids[256];
	float rows[256 * 8];
	int rc;

	env_clear();
	env_for(s);
	spawn_servers(ch, 2);
	CU_ASSERT_EQUAL_FATAL(emb_client_from_env(NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &spec, &t), 0);
	for (int i = 0; i < 256; i++)
		ids[i] = (uint64_t)i;
	nt_child_reap(&ch[0], SIGKILL);
	/* The first calls may see the reset itself; soon every call says
	 * the scheduler declared the server dead. */
	for (int i = 0; i < 100; i++) {
		rc = emb_client_table_pull(t, ids, 256, rows, 0, NULL);
		if (rc == EMB_ENODEAD)
			break;
		CU_ASSERT(rc != 0);
		sleep_ms(50);
	}
	CU_ASSERT_EQUAL(rc, EMB_ENODEAD);
	emb_client_table_close(t);
	/* The rest of the job still ends: the surviving server exits. */
	CU_ASSERT_EQUAL(emb_client_finish(c), 0);
	emb_client_destroy(c);
	CU_ASSERT_EQUAL(exit_code(ch[1].pid), 0);
	ch[1].pid = 0;
	nt_child_reap(&ch[1], 0);
	CU_ASSERT_EQUAL(emb_sched_wait(s, 10000), EMB_ENODEAD);
	emb_sched_destroy(s);
	env_clear();
}

/* SGD lr 1 from zeros, gradient -1 on 32 ids: each row counts its steps. */
static int count_steps(struct emb_client_table *t, uint32_t n)
{
	uint64_t ids[32];
	float g[32 * 4];
	int rc = 0;

	for (int i = 0; i < 32; i++)
		ids[i] = (uint64_t)i * 7919;
	for (int i = 0; i < 32 * 4; i++)
		g[i] = -1.0f;
	for (uint32_t k = 0; k < n && !rc; k++) {
		rc = emb_client_table_push(t, ids, 32, g, k, 0);
		sleep_ms(10);
	}
	if (rc)
		fprintf(stderr, "push %s\n", emb_strerror(rc));
	return rc;
}

static void test_server_restarts(void)
{
	struct emb_sched *s = sched_start(1, 1, 3000);
	struct emb_table_spec spec = nt_spec("emb", 4, 1);
	struct emb_client_table *t;
	struct emb_client *c;
	struct nt_child ch;
	char *dir = emb_test_tmpdir(), listen[32];
	const char *args[8] = {"--checkpoint-dir", dir,
			       "--checkpoint-interval", "1", NULL};
	uint64_t ids[32];
	float rows[32 * 4];

	spec.optim.lr = 1.0f;
	spec.init.kind = EMB_INIT_ZEROS;
	env_clear();
	env_for(s);
	nt_child_start(&ch, args);
	CU_ASSERT_EQUAL_FATAL(emb_client_from_env(NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &spec, &t), 0);
	/* About 1.5 s: a checkpoint holds some of it. */
	CU_ASSERT_EQUAL(count_steps(t, 100), 0);

	/* Killed, and back on its address from its checkpoint within the
	 * heartbeat timeout: it gets its rank again, the worker its calls. */
	nt_child_reap(&ch, SIGKILL);
	sleep_ms(300);
	snprintf(listen, sizeof(listen), "127.0.0.1:%u", ch.port);
	args[4] = "--listen";
	args[5] = listen;
	nt_child_start(&ch, args);
	CU_ASSERT_EQUAL(count_steps(t, 20), 0);
	for (int i = 0; i < 32; i++)
		ids[i] = (uint64_t)i * 7919;
	CU_ASSERT_EQUAL(emb_client_table_pull(t, ids, 32, rows, 0, NULL), 0);
	/* Updates after the last checkpoint are lost, none counted twice. */
	CU_ASSERT(rows[0] > 20.0f && rows[0] <= 120.0f);
	emb_client_table_close(t);

	/* Nobody died: the job ends with 0 everywhere. */
	CU_ASSERT_EQUAL(emb_client_finish(c), 0);
	emb_client_destroy(c);
	CU_ASSERT_EQUAL(exit_code(ch.pid), 0);
	ch.pid = 0;
	nt_child_reap(&ch, 0);
	CU_ASSERT_EQUAL(emb_sched_wait(s, 10000), 0);
	emb_sched_destroy(s);
	env_clear();
	emb_test_rmtree(dir);
	free(dir);
}

/* ---- moves ----------------------------------------------------------- */

/*
 * A server the scheduler sees: a node, and a socket listening on its
 * advertised port so that the probe of a live one connects. It serves
 * nothing; the case plays its fills' reports itself.
 */
struct fake_server {
	int fd;
	uint16_t port;
	struct emb_node *n;
};

static void fake_server_start(const struct emb_sched *s, struct fake_server *f)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CU_ASSERT_FATAL(f->fd >= 0);
	CU_ASSERT_EQUAL_FATAL(bind(f->fd, (struct sockaddr *)&a, sizeof(a)), 0);
	CU_ASSERT_EQUAL_FATAL(listen(f->fd, 16), 0);
	CU_ASSERT_EQUAL_FATAL(
	    getsockname(f->fd, (struct sockaddr *)&a, &len), 0);
	f->port = ntohs(a.sin_port);
	CU_ASSERT_EQUAL_FATAL(
	    node_join(s, EMB_ROLE_SERVER, "127.0.0.1", f->port, &f->n), 0);
}

/* Killed: the probe of its address is refused, so it is declared dead at
 * once. */
static void fake_server_kill(struct fake_server *f)
{
	emb_node_destroy(f->n);
	f->n = NULL;
	close(f->fd);
	f->fd = -1;
}

/* Polls n's map until ok(m, arg): true, with the map in *m. */
static bool map_until(struct emb_node *n, struct emb_cmap *m,
		      bool (*ok)(const struct emb_cmap *, const void *),
		      const void *arg)
{
	for (int i = 0; i < 1000; i++) {
		if (emb_node_cmap(n, m) == 0 && ok(m, arg))
			return true;
		sleep_ms(10);
	}
	return false;
}

static bool copying_ahead_to_3(const struct emb_cmap *m, const void *arg)
{
	(void)arg;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->warm[sl] == 3)
			return true;
	return false;
}

static bool without(const struct emb_cmap *m, const void *arg)
{
	return !emb_cmap_in_map(m, *(const uint32_t *)arg);
}

/* A move's slots [first, first + n). */
struct chunk {
	uint32_t first, n;
};

/* A scheduler of 3 servers (fake, f[0..2]) and a worker *w with its map,
 * R = 2, a rank to spare for a newcomer (f[3]), heartbeat timeout hb_ms. */
static struct emb_sched *spare_rank_job(uint32_t hb_ms, struct fake_server *f,
					struct emb_node **w)
{
	struct emb_sched_opts o = EMB_SCHED_OPTS_DEFAULT;
	struct emb_sched *s;

	o.port = 0;
	o.server_num = 3;
	o.server_max = 4;
	o.worker_num = 1;
	o.replicas = 2;
	o.hb_timeout_ms = hb_ms;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &s), 0);
	for (int i = 0; i < 3; i++)
		fake_server_start(s, &f[i]);
	CU_ASSERT_EQUAL_FATAL(node_join(s, EMB_ROLE_WORKER, NULL, 0, w), 0);
	return s;
}

/* The chunk m copies ahead to rank 3. */
static struct chunk warm_chunk(const struct emb_cmap *m)
{
	struct chunk c = {UINT32_MAX, 0};

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->warm[sl] == 3) {
			if (c.first == UINT32_MAX)
				c.first = sl;
			c.n++;
		}
	return c;
}

static bool fenced(const struct emb_cmap *m, const void *arg)
{
	const struct chunk *c = arg;

	for (uint32_t sl = c->first; sl < c->first + c->n; sl++)
		if (m->fill[sl] != 3 || m->warm[sl] != EMB_CMAP_NONE)
			return false;
	return true;
}

/* Rank 3 filled with a slot outside the chunk. */
static bool filling_other(const struct emb_cmap *m, const void *arg)
{
	const struct chunk *c = arg;

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->fill[sl] == 3 && (sl < c->first || sl >= c->first + c->n))
			return true;
	return false;
}

/*
 * R = 2, 3 servers, a fourth joins and its first move is being copied
 * ahead when a server that holds none of the moving slots dies. The move
 * goes on (its ends both live); once it is done, the newcomer is filled
 * with the slots the death left with one copy. Before, the death was
 * taken for the loss of a recovery fill's source: the newcomer was filled
 * with another chunk while the scheduler still took it for the move's
 * copy ahead, that fill's end fenced it as the move, and the writes to it
 * were refused until the job gave up (cluster/move_kill, on a loaded
 * machine, killing a source a move late).
 */
static void test_death_during_move(void)
{
	struct fake_server f[4];
	struct emb_node *w;
	struct emb_sched *s;
	struct emb_cmap *m = malloc(sizeof(*m));
	uint32_t first, n, p, k = UINT32_MAX;
	struct chunk c;
	uint64_t epoch;

	CU_ASSERT_FATAL(m != NULL);
	s = spare_rank_job(3000, f, &w);
	CU_ASSERT_EQUAL_FATAL(emb_node_wait_map(w), 0);

	/* The newcomer's first chunk, copied ahead by its primary. */
	fake_server_start(s, &f[3]);
	CU_ASSERT_EQUAL_FATAL(emb_node_rank(f[3].n), 3);
	CU_ASSERT_FATAL(map_until(w, m, copying_ahead_to_3, NULL));
	c = warm_chunk(m);
	first = c.first;
	n = c.n;
	epoch = m->epoch;
	p = emb_cmap_primary(m, first);
	/* The server that holds none of the chunk's slots. */
	for (uint32_t r = 0; r < 3 && k == UINT32_MAX; r++) {
		bool holds = false;

		for (uint32_t sl = first; sl < first + n; sl++)
			holds |= emb_cmap_holds(m, sl, r);
		if (!holds)
			k = r;
	}
	CU_ASSERT_FATAL(k != UINT32_MAX && k != p);

	/* It dies: the copy ahead stays, and nothing else is filled. */
	fake_server_kill(&f[k]);
	CU_ASSERT_FATAL(map_until(w, m, without, &k));
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		CU_ASSERT_EQUAL(m->warm[sl],
				sl >= first && sl < first + n ? 3
							      : EMB_CMAP_NONE);
		CU_ASSERT_EQUAL(m->fill[sl], EMB_CMAP_NONE);
		CU_ASSERT(emb_cmap_holders(m, sl) >= 1);
	}

	/* The copy ahead ends: the chunk is fenced for its last stream... */
	CU_ASSERT_EQUAL(emb_node_fill_done(f[p].n, first, n, epoch, 0, 0, 0),
			0);
	CU_ASSERT_FATAL(map_until(w, m, fenced, &c));
	CU_ASSERT_FALSE(filling_other(m, &c));
	/* ...whose end makes the newcomer a holder of the chunk, and then
	 * fills it with the slots left with one copy. */
	CU_ASSERT_EQUAL(emb_node_fill_done(f[p].n, first, n, m->epoch, 0, 0, 0),
			0);
	CU_ASSERT_FATAL(map_until(w, m, filling_other, &c));
	for (uint32_t sl = first; sl < first + n; sl++)
		CU_ASSERT(emb_cmap_holds(m, sl, 3));
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (m->fill[sl] == 3)
			CU_ASSERT_EQUAL(emb_cmap_holders(m, sl), 1);

	emb_node_destroy(w);
	for (int i = 0; i < 4; i++)
		if (f[i].n)
			fake_server_kill(&f[i]);
	emb_sched_destroy(s);
	free(m);
}

static bool at_least(const struct emb_cmap *m, const void *arg)
{
	return m->epoch >= *(const uint64_t *)arg;
}

/*
 * Servers watch the map: each new one reaches every server within a
 * round trip of its making, not at the server's next heartbeat. With a
 * 60 s heartbeat timeout (a heartbeat every 12 s) a newcomer joins; the
 * copy ahead it starts (map epoch 2) and then, its source reporting the
 * copy done, the chunk's fence (epoch 3) must reach each of the three
 * servers within 5 s. Without the watches they learned them at their
 * heartbeats, 12 s apart.
 */
static void test_servers_watch_maps(void)
{
	struct fake_server f[4];
	struct emb_node *w;
	struct emb_sched *s;
	struct emb_cmap *m = malloc(sizeof(*m));
	struct chunk c;
	uint32_t p;
	uint64_t want = 2, t0;

	CU_ASSERT_FATAL(m != NULL);
	s = spare_rank_job(60000, f, &w);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL_FATAL(emb_node_wait_map(f[i].n), 0);
	CU_ASSERT_EQUAL_FATAL(emb_node_wait_map(w), 0);

	t0 = emb_clock_ms();
	fake_server_start(s, &f[3]);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_FATAL(map_until(f[i].n, m, at_least, &want));
	CU_ASSERT_FATAL(copying_ahead_to_3(m, NULL));
	c = warm_chunk(m);
	p = emb_cmap_primary(m, c.first);
	want = m->epoch + 1;
	CU_ASSERT_EQUAL(
	    emb_node_fill_done(f[p].n, c.first, c.n, m->epoch, 0, 0, 0), 0);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_FATAL(map_until(f[i].n, m, at_least, &want));
	CU_ASSERT(emb_clock_ms() - t0 < 5000);
	printf("(epochs 2 and 3 on every server in %llu ms) ",
	       (unsigned long long)(emb_clock_ms() - t0));

	emb_node_destroy(w);
	for (int i = 0; i < 4; i++)
		if (f[i].n)
			fake_server_kill(&f[i]);
	emb_sched_destroy(s);
	free(m);
}

/*
 * Threads of process pid other than its main thread that take SIGTERM
 * (do not block it), by /proc/pid/task/TID/status: each is logged; -1
 * while no thread named last is there yet. The daemon waits for SIGTERM
 * in sigsuspend() on its main thread, and the cluster's end is a SIGTERM:
 * one taken elsewhere would not wake it.
 */
static int threads_taking_sigterm(pid_t pid, const char *last)
{
	bool seen = false;
	char path[320], line[256], comm[64];
	struct dirent *e;
	int bad = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((e = readdir(d))) {
		unsigned long long blk = 0;
		FILE *f;

		if (e->d_name[0] == '.' || atoi(e->d_name) == (int)pid)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status",
			 (int)pid, e->d_name);
		if (!(f = fopen(path, "r")))
			continue; /* ended meanwhile */
		comm[0] = '\0';
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "Name: %63s", comm);
			sscanf(line, "SigBlk: %llx", &blk);
		}
		fclose(f);
		seen |= !strcmp(comm, last);
		if (!(blk >> (SIGTERM - 1) & 1)) {
			fprintf(stderr, "pid %d: thread %s (%s) takes "
				"SIGTERM\n", (int)pid, e->d_name, comm);
			bad++;
		}
	}
	closedir(d);
	return seen ? bad : -1;
}

/* threads_taking_sigterm() once the thread named last started: 10 s. */
static int threads_taking_sigterm_wait(pid_t pid, const char *last)
{
	int bad = -1;

	for (int i = 0; i < 1000 && bad < 0; i++) {
		bad = threads_taking_sigterm(pid, last);
		if (bad < 0)
			sleep_ms(10);
	}
	return bad;
}

static void test_finish_exits(void)
{
	const char *bin = getenv("EMB_SERVER_BIN");
	struct emb_client *c = NULL;
	struct nt_child ch[2], sched = {0};
	char port[16];
	int fd;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	env_clear();
	/* A free port for the scheduler process: bind, read, release. */
	{
		struct emb_sched *probe = sched_start(1, 1, 1000);

		snprintf(port, sizeof(port), "%u", emb_sched_port(probe));
		emb_sched_destroy(probe);
	}
	setenv("MS_ROLE", "MS_SCHED", 1);
	setenv("MS_SCHED_HOST", "127.0.0.1", 1);
	setenv("MS_SCHED_PORT", port, 1);
	setenv("MS_SERVER_NUM", "2", 1);
	setenv("MS_WORKER_NUM", "1", 1);
	setenv("EMB_HEARTBEAT_TIMEOUT", "1", 1);
	/* Every wait bounded: a node that cannot join fails the case in a
	 * minute rather than hang it for the join's default five. */
	setenv("EMB_CLUSTER_TIMEOUT", "60", 1);
	snprintf(sched.log, sizeof(sched.log), "%s/emb-sched-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	fd = mkstemp(sched.log);
	CU_ASSERT_FATAL(fd >= 0);
	sched.pid = fork();
	CU_ASSERT_FATAL(sched.pid >= 0);
	if (sched.pid == 0) {
		dup2(fd, STDERR_FILENO);
		execl(bin, bin, NULL);
		_exit(127);
	}
	close(fd);
	/* Servers and the worker find it through the MindSpore names. */
	setenv("MS_ROLE", "MS_PSERVER", 1);
	spawn_servers(ch, 2);
	setenv("MS_ROLE", "MS_WORKER", 1);
	CU_ASSERT_EQUAL(emb_client_from_env(NULL, &c), 0);
	if (c) {
		CU_ASSERT_EQUAL(emb_client_nservers(c), 2);
		/* A server's last thread starts with its replication, after
		 * it registered: its background check. */
		for (int i = 0; i < 2; i++)
			CU_ASSERT_EQUAL(threads_taking_sigterm_wait(
					    ch[i].pid, "emb-bcheck"),
					0);
		CU_ASSERT_EQUAL(threads_taking_sigterm_wait(sched.pid,
							    "emb-sched"),
				0);
		CU_ASSERT_EQUAL(emb_client_finish(c), 0);
		emb_client_destroy(c);
	}
	/* Told by the scheduler, both servers and then the scheduler exit
	 * 0 by themselves: in seconds, 60 s on a loaded machine at most. */
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL(nt_child_exit(&ch[i], 60000), 0);
		nt_child_reap(&ch[i], SIGKILL);
	}
	CU_ASSERT_EQUAL(nt_child_exit(&sched, 60000), 0);
	nt_child_reap(&sched, SIGKILL);
	env_clear();
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"reads EMB_ and MindSpore variable names", test_env_names},
	    {"rejects malformed variables", test_env_rejects},
	    {"assigns ranks in registration order", test_ranks},
	    {"map covers every slot and lists server addresses", test_map},
	    {"map wait times out while nodes are missing", test_map_timeout},
	    {"join fails without a scheduler", test_no_scheduler},
	    {"workers join from the environment and train",
	     test_from_env_trains},
	    {"with a token the cluster forms; a REGISTER without it is "
	     "refused and takes no rank",
	     test_token_cluster},
	    {"barrier waits for every worker, and again", test_barrier},
	    {"barrier fails when a worker dies", test_barrier_dead_worker},
	    {"losing the scheduler for longer than EMB_SCHED_GRACE fails "
	     "barrier, finish and servers",
	     test_scheduler_lost},
	    {"a scheduler restarted on its state file takes the job up: "
	     "nodes rejoin, a barrier across the restart completes, the job "
	     "ends",
	     test_scheduler_restarts},
	    {"a restarted scheduler declares a node that does not rejoin "
	     "dead",
	     test_restart_missing_node},
	    {"client without scheduler has rank 0 of 1",
	     test_without_scheduler},
	    {"frozen server is declared dead and calls fail",
	     test_frozen_server_dead},
	    {"a server stopped for 1.5 T is not dead and goes on",
	     test_short_stop_survives},
	    {"killed server is declared dead, the rest finishes",
	     test_killed_server_dead},
	    {"a server restarted from its checkpoint on its address gets its "
	     "rank back; the worker goes on",
	     test_server_restarts},
	    {"a server dying while another's move is copied ahead leaves the "
	     "move going, then its target is filled",
	     test_death_during_move},
	    {"servers take each new map at once: they watch it",
	     test_servers_watch_maps},
	    {"finish stops server and scheduler processes with 0",
	     test_finish_exits},
	    {NULL, NULL},
	};

	signal(SIGPIPE, SIG_IGN);
	return emb_test_main(argc, argv, "cluster", cases);
}
