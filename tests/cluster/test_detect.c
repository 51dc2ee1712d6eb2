/*
 * tests/cluster/test_detect.c - the scheduler's failure detection with a
 * server that is only silent: a fake server node (raw frames on the
 * scheduler connection, so the test decides when it heartbeats) whose
 * serving address is a real in-process server, or a socket that never
 * answers. Silence makes it suspect; the probe of its address decides.
 * The scheduler runs in this process; single-threaded but for its loop.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster_util.h"
#include "cluster/scheduler.h"
#include "common/clock.h"
#include "common/err.h"
#include "harness.h"
#include "proto/wire_cluster.h"
#include "worker/netutil.h"

#define T_MS 1000u

/* A server node that heartbeats only when told to. */
struct fake {
	int fd;		  /* to the scheduler */
	uint32_t node_id; /* from REGISTER */
	uint64_t seq;	  /* last heartbeat's */
};

static struct emb_sched *sched_start_n(uint32_t servers, uint32_t replicas)
{
	struct emb_sched_opts o = EMB_SCHED_OPTS_DEFAULT;
	struct emb_sched *s;

	o.port = 0;
	o.server_num = servers;
	o.worker_num = 1;
	o.replicas = replicas;
	o.hb_timeout_ms = T_MS;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&o, &s), 0);
	return s;
}

static struct emb_sched *sched_start(void)
{
	return sched_start_n(1, 1);
}

static void fake_register_as(struct fake *f, struct emb_sched *s,
			     uint32_t role, uint16_t port)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 64];
	_Alignas(8) uint8_t resp[256];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_register_resp r;
	struct emb_wire_frame fr;
	struct emb_frame_hdr rh;
	int len;

	f->fd = nt_raw_connect(emb_sched_port(s));
	CU_ASSERT_FATAL(f->fd >= 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(f->fd, NULL, 0), 0);
	len = emb_wire_register_req_encode(buf, sizeof(buf), 1, role, port,
					   (uint32_t)getpid(), "127.0.0.1");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(f->fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(f->fd, &rh, resp, sizeof(resp)), 0);
	CU_ASSERT_EQUAL_FATAL(rh.status, 0);
	fr = (struct emb_wire_frame){.hdr = rh, .payload = resp, .lim = &lim};
	CU_ASSERT_EQUAL_FATAL(emb_wire_register_resp_decode(&fr, &r), 0);
	f->node_id = r.node_id;
	f->seq = 0;
}

static void fake_register(struct fake *f, struct emb_sched *s, uint16_t port)
{
	fake_register_as(f, s, EMB_ROLE_SERVER, port);
}

/* One heartbeat; the status of its answer. */
static int fake_beat(struct fake *f)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 32];
	_Alignas(8) uint8_t resp[512];
	struct emb_frame_hdr rh;
	int len, rc;

	len = emb_wire_heartbeat_req_encode(buf, sizeof(buf), 2, f->node_id,
					    ++f->seq);
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(f->fd, buf, (size_t)len), 0);
	rc = nt_raw_recv(f->fd, &rh, resp, sizeof(resp));
	return rc ? rc : rh.status;
}

/* A few heartbeats T / 5 apart, as a node sends them. */
static void fake_beats(struct fake *f, int n)
{
	for (int i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(fake_beat(f), 0);
		sleep_ms(T_MS / 5);
	}
}

static void stats(struct emb_sched *s, struct emb_sched_stats *v)
{
	emb_sched_stats(s, v);
}

/* A server whose agent went quiet while its loops serve (a stuck agent
 * thread, a heartbeat starved by load) answers the probe: not dead. */
static void test_silent_but_serving(void)
{
	struct emb_server_opts vo = nt_server_opts();
	struct emb_server *srv = nt_server_start(&vo);
	struct emb_sched *s = sched_start();
	struct emb_sched_stats v;
	struct fake f;

	fake_register(&f, s, emb_server_port(srv));
	fake_beats(&f, 3);
	/* Three and a half T of silence: a probe after T, answered, then
	 * another after T more, answered. */
	sleep_ms(3 * T_MS + T_MS / 2);
	stats(s, &v);
	CU_ASSERT_EQUAL(v.dead[0], 0);
	CU_ASSERT(v.probes >= 1);
	CU_ASSERT(v.probes_answered >= 1);
	CU_ASSERT_EQUAL(v.probes_answered, v.probes);
	/* It is still a member: its next heartbeat is answered. */
	CU_ASSERT_EQUAL(fake_beat(&f), 0);
	close(f.fd);
	emb_sched_destroy(s);
	emb_server_destroy(srv);
}

/*
 * A socket bound to a free loopback port (*port). Listening, it accepts
 * (the kernel does, into the backlog) and never answers: a frozen process,
 * as far as a probe can tell. Not listening, connects to it are refused,
 * as to the port of a killed process.
 */
static int loopback_socket(uint16_t *port, bool listening)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	if (listening)
		CU_ASSERT_EQUAL_FATAL(listen(fd, 8), 0);
	CU_ASSERT_EQUAL_FATAL(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static int mute_listener(uint16_t *port)
{
	return loopback_socket(port, true);
}

/* Silent, and its address does not answer: dead, no sooner than T and
 * within T (suspect, no history yet) + T (the probe's deadline). */
static void test_silent_and_mute(void)
{
	struct emb_sched *s = sched_start();
	struct emb_sched_stats v;
	struct fake f;
	uint16_t port;
	int lfd = mute_listener(&port);
	int64_t t0, took = -1;

	fake_register(&f, s, port);
	fake_beats(&f, 2);
	CU_ASSERT_EQUAL(fake_beat(&f), 0);
	t0 = (int64_t)emb_clock_ms();
	while ((int64_t)emb_clock_ms() - t0 < 10 * T_MS) {
		stats(s, &v);
		if (v.dead[0]) {
			took = (int64_t)emb_clock_ms() - t0;
			break;
		}
		sleep_ms(10);
	}
	CU_ASSERT(took >= (int64_t)T_MS);
	/* 2 T and the loop's tick, with room for a loaded machine. */
	CU_ASSERT(took > 0 && took <= 2 * T_MS + 1500);
	CU_ASSERT_EQUAL(v.probes, 1);
	CU_ASSERT_EQUAL(v.probes_answered, 0);
	/* A member no more: its heartbeats are refused. */
	CU_ASSERT_EQUAL(fake_beat(&f), EMB_ENODEAD);
	close(f.fd);
	close(lfd);
	emb_sched_destroy(s);
}

/* A scheduler torn down while a probe waits on a mute address returns
 * once the probe has (its deadline bounds the wait). */
static void test_destroy_while_probing(void)
{
	struct emb_sched *s = sched_start();
	struct emb_sched_stats v;
	struct fake f;
	uint16_t port;
	int lfd = mute_listener(&port);
	int64_t t0;

	fake_register(&f, s, port);
	CU_ASSERT_EQUAL(fake_beat(&f), 0);
	t0 = (int64_t)emb_clock_ms();
	do {
		sleep_ms(10);
		stats(s, &v);
	} while (!v.probes && (int64_t)emb_clock_ms() - t0 < 5 * T_MS);
	CU_ASSERT_EQUAL(v.probes, 1);
	t0 = (int64_t)emb_clock_ms();
	emb_sched_destroy(s);
	CU_ASSERT((int64_t)emb_clock_ms() - t0 <= 2 * T_MS + 1000);
	close(f.fd);
	close(lfd);
}

/* Heartbeats from each of fakes[0..n) every T / 5 for ms. */
static void fakes_beat_for(struct fake *fakes, int n, int64_t ms)
{
	int64_t t0 = (int64_t)emb_clock_ms();

	while ((int64_t)emb_clock_ms() - t0 < ms) {
		for (int i = 0; i < n; i++)
			CU_ASSERT_EQUAL(fake_beat(&fakes[i]), 0);
		sleep_ms(T_MS / 5);
	}
}

/*
 * Replicated: a server whose scheduler connection closes while its
 * serving address answers (its agent gave up on a silent link) is probed,
 * answers and is not dead: it has the rejoin window. One whose address
 * refuses (a killed process) is dead at once.
 */
static void test_closed_link(void)
{
	struct emb_server_opts vo = nt_server_opts();
	struct emb_server *srv0 = nt_server_start(&vo);
	struct emb_server *srv1 = nt_server_start(&vo);
	struct emb_sched *s = sched_start_n(2, 2);
	struct emb_sched_stats v;
	struct fake f[3]; /* server 0, server 1, the worker */
	int64_t t0, took = -1;

	fake_register(&f[0], s, emb_server_port(srv0));
	fake_register(&f[1], s, emb_server_port(srv1));
	fake_register_as(&f[2], s, EMB_ROLE_WORKER, 0);
	fakes_beat_for(f, 3, T_MS / 2);
	stats(s, &v);
	CU_ASSERT_EQUAL_FATAL(v.state, EMB_CLUSTER_READY);

	/* Server 0's link closes; it still serves. */
	close(f[0].fd);
	fakes_beat_for(&f[1], 2, T_MS + T_MS / 2);
	stats(s, &v);
	CU_ASSERT_EQUAL(v.dead[0], 0);
	CU_ASSERT(v.probes >= 1);
	CU_ASSERT_EQUAL(v.probes_answered, v.probes);

	/* Server 1 killed: its link closes and its address refuses. */
	emb_server_destroy(srv1);
	srv1 = NULL;
	close(f[1].fd);
	t0 = (int64_t)emb_clock_ms();
	while ((int64_t)emb_clock_ms() - t0 < 10 * T_MS) {
		CU_ASSERT_EQUAL(fake_beat(&f[2]), 0);
		stats(s, &v);
		if (v.dead[0]) {
			took = (int64_t)emb_clock_ms() - t0;
			break;
		}
		sleep_ms(10);
	}
	/* Well within the rejoin window (10 s) it would wait otherwise. */
	CU_ASSERT(took >= 0 && took < 5 * (int64_t)T_MS);
	CU_ASSERT_EQUAL(v.dead[0], 1);
	close(f[2].fd);
	emb_sched_destroy(s);
	emb_server_destroy(srv0);
}

static int refusing_port(uint16_t *port)
{
	return loopback_socket(port, false);
}

/*
 * Every node silent at once, as a scheduler starved of CPU or behind on
 * its socket queues hears its job: it suspects itself, starts no probe and
 * declares nobody dead, although no server would answer a probe (their
 * ports refuse); heard again, they are all members. Then one server
 * silent alone among nodes that beat is dead as before: the rule hides no
 * lone failure.
 */
static void test_all_silent(void)
{
	enum { N = 6 };
	struct emb_sched *s = sched_start_n(N, 2);
	struct emb_sched_stats v;
	struct fake f[N + 1]; /* N servers, then the worker */
	int lfd[N];
	int64_t t0, took = -1;

	for (int i = 0; i < N; i++) {
		uint16_t port;

		lfd[i] = refusing_port(&port);
		fake_register(&f[i], s, port);
	}
	fake_register_as(&f[N], s, EMB_ROLE_WORKER, 0);
	fakes_beat_for(f, N + 1, T_MS);
	stats(s, &v);
	CU_ASSERT_EQUAL_FATAL(v.state, EMB_CLUSTER_READY);

	/* Twice T of silence from all: a lone server so silent would have
	 * been probed after T, refused, and declared dead. */
	sleep_ms(2 * T_MS);
	stats(s, &v);
	CU_ASSERT_EQUAL(v.dead[0], 0);
	CU_ASSERT_EQUAL(v.dead[1], 0);
	CU_ASSERT_EQUAL(v.probes, 0);
	/* (More than once if this thread, beating for all, was itself
	 * starved for T / 2 before: all of them overdue then too.) */
	CU_ASSERT(v.self_suspicions >= 1);
	CU_ASSERT(v.self_suspect);

	/* Heard again: every heartbeat is answered, and the suspicion
	 * ends. */
	fakes_beat_for(f, N + 1, T_MS);
	stats(s, &v);
	CU_ASSERT(!v.self_suspect);
	CU_ASSERT_EQUAL(v.dead[0], 0);

	/* Server 0 silent alone: one of seven is no reason to doubt
	 * oneself. Suspect after T to 3 T (its history), refused at once,
	 * then dead (later if this thread starves for T / 2, which makes
	 * everyone overdue). */
	t0 = (int64_t)emb_clock_ms();
	while ((int64_t)emb_clock_ms() - t0 < 10 * T_MS) {
		fakes_beat_for(&f[1], N, T_MS / 5);
		stats(s, &v);
		if (v.dead[0]) {
			took = (int64_t)emb_clock_ms() - t0;
			break;
		}
	}
	CU_ASSERT(took >= (int64_t)T_MS);
	CU_ASSERT_EQUAL(v.dead[0], 1);
	for (int i = 0; i <= N; i++)
		close(f[i].fd);
	for (int i = 0; i < N; i++)
		close(lfd[i]);
	emb_sched_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a silent server that answers a probe is not dead",
	     test_silent_but_serving},
	    {"a silent server whose address does not answer is dead within "
	     "2 T",
	     test_silent_and_mute},
	    {"destroy waits for a probe under way", test_destroy_while_probing},
	    {"a closed link is probed: alive waits to rejoin, refused is dead",
	     test_closed_link},
	    {"every node silent at once: the scheduler suspects itself; one "
	     "alone is dead",
	     test_all_silent},
	    {NULL, NULL},
	};

	signal(SIGPIPE, SIG_IGN);
	return emb_test_main(argc, argv, "detect", cases);
}
