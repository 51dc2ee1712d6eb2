/*
 * tools/embstore-server.c - the embstore server daemon.
 *
 * Parses flags (each with an EMB_* environment fallback), starts the
 * server role (src/server/role.h) or the scheduler role, and waits for
 * SIGTERM or SIGINT or the job's end, then stops accepting, lets in-flight
 * requests finish and exits 0. Single-threaded here; the server runs its
 * own loop threads, and replication runs in the library (replica.c).
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/addr.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/seconds.h"
#include "common/token.h"
#include "metrics/metrics.h"
#include "server/checkpoint.h"
#include "server/metrics.h"
#include "server/role.h"
#include "server/server.h"
#include "store/store.h"
#include "cluster/scheduler.h"
#include "cluster/coord.h"
#include "cluster/node.h"
#include "transport/transport.h"

#define DEFAULT_PORT		7164
#define CKPT_KEEP		3
#define CKPT_DEFAULT_INTERVAL_MS 300000

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
	got_signal = sig;
}

/* Set before the cluster's end wakes main (docs/cluster.md), by another
 * thread: atomics, as a signal carries no ordering between threads. */
static int cluster_ended;
static int cluster_failed;

/* The thread that waits for the signals in sigsuspend(). */
static pthread_t main_thread;

/*
 * Scheduler or node agent thread: the job ended; main stops as on SIGTERM.
 * Sent to main itself: a signal sent to the process goes to any one
 * thread that does not block it, and its handler run elsewhere would not
 * wake main's sigsuspend(). (embstore's own threads block it, see
 * common/thread.h; this holds without that.)
 */
static void on_cluster_end(void *arg, int status)
{
	(void)arg;
	__atomic_store_n(&cluster_failed, status != 0, __ATOMIC_RELAXED);
	__atomic_store_n(&cluster_ended, 1, __ATOMIC_RELEASE);
	pthread_kill(main_thread, SIGTERM);
}

static bool job_over(void)
{
	return __atomic_load_n(&cluster_ended, __ATOMIC_ACQUIRE);
}

static bool job_failed(void)
{
	return job_over() && __atomic_load_n(&cluster_failed, __ATOMIC_RELAXED);
}

/* --role scheduler: serve the cluster until the job ends or a signal. */
static int run_scheduler(const struct emb_cluster_env *env, const char *host,
			 uint16_t port, const char *metrics_addr,
			 const struct emb_server_opts *o, const sigset_t *old)
{
	struct emb_sched_opts so = EMB_SCHED_OPTS_DEFAULT;
	struct emb_metrics *metrics = NULL;
	struct emb_sched *sched;
	int rc;

	if (!env->server_num || !env->worker_num) {
		emb_log(EMB_LOG_ERROR, "scheduler: set EMB_SERVER_NUM and "
				       "EMB_WORKER_NUM (or MS_SERVER_NUM and "
				       "MS_WORKER_NUM)");
		return 2;
	}
	so.host = host;
	so.port = port;
	so.server_num = env->server_num;
	so.worker_num = env->worker_num;
	so.hb_timeout_ms = env->hb_timeout_ms;
	so.replicas = env->replicas;
	if (so.replicas > so.server_num) {
		emb_log(EMB_LOG_ERROR,
			"scheduler: EMB_REPLICAS %u is more than the %u "
			"servers",
			so.replicas, so.server_num);
		return 2;
	}
	so.server_max = env->server_max;
	if (so.server_max &&
	    (so.server_max < so.server_num ||
	     (so.server_max > so.server_num && so.replicas > 7))) {
		emb_log(EMB_LOG_ERROR,
			"scheduler: EMB_SERVER_MAX %u needs at least the %u "
			"servers and, to be more, EMB_REPLICAS 1..7",
			so.server_max, so.server_num);
		return 2;
	}
	so.on_done = on_cluster_end;
	so.auth_token = o->auth_token;
	so.auth_token_len = o->auth_token_len;
	so.state_file = env->sched_state;
	rc = emb_sched_create(&so, &sched);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "cannot schedule on %s:%u: %s", host,
			port, emb_strerror(rc));
		return 1;
	}
	/* A listening scheduler is ready: nodes may join from now on. */
	if (metrics_addr &&
	    emb_server_metrics_serve(metrics_addr, emb_sched_metrics_collect,
				     sched, &metrics)) {
		emb_sched_destroy(sched);
		return 1;
	}
	while (!got_signal)
		sigsuspend(old);
	if (!job_over())
		emb_log(EMB_LOG_INFO, "%s: stopping", strsignal(got_signal));
	rc = job_over() ? emb_sched_wait(sched, 0) : 1;
	emb_metrics_destroy(metrics);
	emb_sched_destroy(sched);
	emb_log(EMB_LOG_INFO, "scheduler stopped");
	return rc ? 1 : 0;
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: embstore-server [options]\n"
	    "  --listen HOST:PORT     address to serve (EMB_LISTEN; default "
	    "127.0.0.1:7164)\n"
	    "  --transport tcp|rdma|tcp,rdma  (EMB_TRANSPORT; default "
	    "tcp,rdma where an RDMA\n"
	    "                         device exists, else tcp)\n"
	    "  --threads N            event loop threads (EMB_THREADS; "
	    "default: cores)\n"
	    "  --auth-token-file F    require this token in HELLO; the "
	    "scheduler's too, and a\n"
	    "                         server logs in to its scheduler with "
	    "it "
	    "(EMB_AUTH_TOKEN_FILE)\n"
	    "  --admin-token-file F   SET_MODE and DROP_TABLE need this "
	    "token (EMB_ADMIN_TOKEN_FILE)\n"
	    "  --mem-limit SIZE       bytes of all tables, e.g. 8G; 0 = "
	    "unlimited\n"
	    "                         (EMB_MEM_LIMIT; default 5/8 of "
	    "physical memory)\n"
	    "  --tier-dir DIR         keep the rows --mem-limit leaves out in "
	    "files here, on\n"
	    "                         a device (EMB_TIER_DIR; docs/store.md, "
	    "\"The device tier\")\n"
	    "  --tier-max SIZE        bytes each table's tier file may grow to "
	    "(EMB_TIER_MAX;\n"
	    "                         default 0 = no bound)\n"
	    "  --move-rate SIZE       bytes per second at most of each move's "
	    "copy ahead this\n"
	    "                         server streams, e.g. 200M (EMB_MOVE_RATE;"
	    " default 0 =\n"
	    "                         unlimited; docs/replication.md)\n"
	    "  --move-bound X         pace that copy ahead so the workers' "
	    "calls' p99 stays\n"
	    "                         under X times their p99 before the move "
	    "(EMB_MOVE_BOUND;\n"
	    "                         e.g. 2; default 0 = off; --move-rate "
	    "caps it)\n"
	    "  --conn-mem-limit SIZE  receive buffers of all connections "
	    "(EMB_CONN_MEM_LIMIT;\n"
	    "                         default a quarter of --mem-limit)\n"
	    "  --max-conns N          connections at once (EMB_MAX_CONNS; "
	    "default 1024)\n"
	    "  --handshake-timeout S  seconds to log in (EMB_HANDSHAKE_TIMEOUT;"
	    " default 10)\n"
	    "  --idle-timeout S       seconds a connection may be silent "
	    "(EMB_IDLE_TIMEOUT;\n"
	    "                         default 600; 0 = never)\n"
	    "  --frame-timeout S      seconds a frame may take to arrive once "
	    "begun; a slower\n"
	    "                         sender is closed (EMB_FRAME_TIMEOUT; "
	    "default 30; 0 = never)\n"
	    "  --max-ids N            ids per request (EMB_MAX_IDS)\n"
	    "  --max-frame SIZE       bytes per frame (EMB_MAX_FRAME)\n"
	    "  --max-tables N         tables (EMB_MAX_TABLES)\n"
	    "  --table-shards N       index shards per table, a power of two "
	    "<= 1024\n"
	    "                         (EMB_TABLE_SHARDS; default 64); each "
	    "holds at most\n"
	    "                         2^24 - 2 rows\n"
	    "  --log-level L          error|warn|info|debug (EMB_LOG_LEVEL)\n"
	    "  --huge-pages on|off    map rows asking for 2 MiB pages "
	    "(EMB_HUGE_PAGES;\n"
	    "                         default on; off where a huge page's "
	    "first touch\n"
	    "                         is slow: docs/operations.md)\n"
	    "  --pretouch SIZE        map SIZE of memory at start and fault it"
	    " in; tables\n"
	    "                         take their memory from it first "
	    "(EMB_PRETOUCH): for\n"
	    "                         a server that joins a job and takes its"
	    " rows at once\n");
	/* Two literals: one would pass the 4095 bytes C99 promises. */
	fputs(
	    "  --zero-copy-pulls on|off  PULL rows straight from table memory\n"
	    "                         (EMB_ZERO_COPY_PULLS; default on for "
	    "rdma, off for tcp)\n"
	    "  --remote-read          tables are remote-readable: RDMA clients "
	    "with\n"
	    "                         pull_mode onesided READ rows without this "
	    "server's\n"
	    "                         CPU; 8 more bytes a row "
	    "(EMB_REMOTE_READ=1)\n"
	    "  --metrics-listen HOST:PORT  serve Prometheus /metrics and "
	    "/healthz there "
	    "(EMB_METRICS_LISTEN; default off)\n"
	    "  --checkpoint-dir D     load the newest checkpoint at start, "
	    "write them here (EMB_CHECKPOINT_DIR)\n"
	    "  --checkpoint-start-empty  start empty when every checkpoint in "
	    "the directory\n"
	    "                         is damaged (they are set aside; default: "
	    "refuse to start)\n"
	    "  --checkpoint-interval S  seconds between checkpoints "
	    "(EMB_CHECKPOINT_INTERVAL; default 300)\n"
	    "  --checkpoint-full-every K  a full checkpoint every K, deltas "
	    "(changed rows only)\n"
	    "                         between (EMB_CHECKPOINT_FULL_EVERY; "
	    "default 1: all full)\n"
	    "  --role scheduler|server  cluster role (EMB_ROLE or MS_ROLE; "
	    "default server);\n"
	    "                         see docs/cluster.md for EMB_SCHED_* "
	    "and the other variables\n"
	    "  --coordinator etcd://HOST:PORT[,HOST:PORT]  the job lives in "
	    "etcd, no scheduler\n"
	    "                         (EMB_COORDINATOR; docs/coordinator.md)\n"
	    "  --job NAME             the job's name in etcd (EMB_JOB; "
	    "default embstore)\n"
	    "  --replicas R           scheduler: copies of each slot, 1..8 "
	    "(EMB_REPLICAS; default 1;\n"
	    "                         docs/replication.md)\n"
	    "  --help, --version\n",
	    f);
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v;

	if (emb_bytes_parse(s, &v) || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/*
 * A flag in seconds, fractions allowed, to ms in [min_ms, max_ms]: 0, or 1
 * after printing why.
 */
static int parse_ms(const char *flag, const char *s, uint64_t min_ms,
		    uint64_t max_ms, uint32_t *out)
{
	uint64_t ms;
	int rc = emb_seconds_parse(s, min_ms, max_ms, &ms);

	if (rc) {
		fprintf(stderr,
			"embstore-server: bad --%s '%s': %s (seconds, "
			"%g..%g)\n",
			flag, s, emb_seconds_strerror(rc), min_ms / 1000.0,
			max_ms / 1000.0);
		return 1;
	}
	*out = (uint32_t)ms;
	return 0;
}

/* --auth-token-file or --admin-token-file (what: "" or "admin "). 0, or 1
 * after printing why. */
static int read_token(const char *what, const char *file, uint8_t *buf,
		      uint32_t *len)
{
	int rc = emb_token_read_file(file, buf, len);

	if (rc)
		fprintf(stderr,
			"embstore-server: cannot use %stoken file %s: %s\n",
			what, file,
			rc == -EINVAL ? "empty or longer than 256 bytes"
				      : emb_strerror(rc));
	return rc ? 1 : 0;
}

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = name ? getenv(name) : NULL;

	return v && *v ? v : dflt;
}

/*
 * Resolves host as bind() will, so that a name that does not resolve is
 * reported as that rather than as "Invalid argument" from the transport.
 * 0, or 1 after printing why.
 */
static int check_host(const char *flag, const char *host)
{
	struct addrinfo hints = {.ai_flags = AI_PASSIVE,
				 .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host, NULL, &hints, &ai);

	if (rc == 0) {
		freeaddrinfo(ai);
		return 0;
	}
	fprintf(stderr,
		"embstore-server: --listen %s: cannot resolve host '%s': %s; "
		"give an address of this machine (127.0.0.1, 0.0.0.0, [::]) "
		"or a name that resolves to one\n",
		flag, host,
		rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
	return 1;
}

/* A flag's value: from --name, else from the environment variable env. */
struct flag {
	const char *name; /* long option */
	int has_arg;	  /* required_argument, or no_argument ("1") */
	const char *env;  /* EMB_* fallback, or NULL */
	const char **val; /* where the value goes */
};

int main(int argc, char **argv)
{
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;
	struct emb_cluster_env cenv;
	struct emb_server_role_opts ro = {
	    .ckpt = {.keep = CKPT_KEEP, .interval_ms = CKPT_DEFAULT_INTERVAL_MS},
	    .env = &cenv,
	    .on_end = on_cluster_end,
	    .cancel = &got_signal,
	};
	const char *listen = NULL, *listen_flag = NULL, *transport = NULL;
	const char *threads = NULL, *token_file = NULL, *admin_file = NULL;
	const char *conn_mem = NULL, *max_conns = NULL, *hs_timeout = NULL;
	const char *idle_timeout = NULL, *mem = NULL, *max_ids = NULL;
	const char *frame_timeout = NULL;
	const char *max_frame = NULL, *max_tables = NULL, *level = NULL;
	const char *table_shards = NULL, *zero_copy = NULL, *huge = NULL;
	const char *remote_read = NULL, *ckpt_dir = NULL, *ckpt_iv = NULL;
	const char *ckpt_full = NULL, *start_empty = NULL, *role = NULL;
	const char *replicas = NULL, *metrics_addr = NULL, *move_rate = NULL;
	const char *move_bound = NULL;
	const char *coordinator = NULL, *job = NULL, *bad = NULL;
	const char *tier_dir = NULL, *tier_max = NULL, *pretouch = NULL;
	uint64_t pretouch_bytes = 0;
	const struct flag flags[] = {
	    {"listen", required_argument, NULL, &listen_flag},
	    {"transport", required_argument, "EMB_TRANSPORT", &transport},
	    {"threads", required_argument, "EMB_THREADS", &threads},
	    {"auth-token-file", required_argument, "EMB_AUTH_TOKEN_FILE",
	     &token_file},
	    {"admin-token-file", required_argument, "EMB_ADMIN_TOKEN_FILE",
	     &admin_file},
	    {"conn-mem-limit", required_argument, "EMB_CONN_MEM_LIMIT",
	     &conn_mem},
	    {"max-conns", required_argument, "EMB_MAX_CONNS", &max_conns},
	    {"handshake-timeout", required_argument, "EMB_HANDSHAKE_TIMEOUT",
	     &hs_timeout},
	    {"idle-timeout", required_argument, "EMB_IDLE_TIMEOUT",
	     &idle_timeout},
	    {"frame-timeout", required_argument, "EMB_FRAME_TIMEOUT",
	     &frame_timeout},
	    {"mem-limit", required_argument, "EMB_MEM_LIMIT", &mem},
	    {"move-rate", required_argument, "EMB_MOVE_RATE", &move_rate},
	    {"move-bound", required_argument, "EMB_MOVE_BOUND", &move_bound},
	    {"tier-dir", required_argument, "EMB_TIER_DIR", &tier_dir},
	    {"tier-max", required_argument, "EMB_TIER_MAX", &tier_max},
	    {"max-ids", required_argument, "EMB_MAX_IDS", &max_ids},
	    {"max-frame", required_argument, "EMB_MAX_FRAME", &max_frame},
	    {"max-tables", required_argument, "EMB_MAX_TABLES", &max_tables},
	    {"table-shards", required_argument, "EMB_TABLE_SHARDS",
	     &table_shards},
	    {"log-level", required_argument, "EMB_LOG_LEVEL", &level},
	    {"zero-copy-pulls", required_argument, "EMB_ZERO_COPY_PULLS",
	     &zero_copy},
	    {"huge-pages", required_argument, "EMB_HUGE_PAGES", &huge},
	    {"pretouch", required_argument, "EMB_PRETOUCH", &pretouch},
	    {"remote-read", no_argument, "EMB_REMOTE_READ", &remote_read},
	    {"checkpoint-dir", required_argument, "EMB_CHECKPOINT_DIR",
	     &ckpt_dir},
	    {"checkpoint-interval", required_argument,
	     "EMB_CHECKPOINT_INTERVAL", &ckpt_iv},
	    {"checkpoint-full-every", required_argument,
	     "EMB_CHECKPOINT_FULL_EVERY", &ckpt_full},
	    {"checkpoint-start-empty", no_argument, NULL, &start_empty},
	    {"role", required_argument, NULL, &role},
	    {"replicas", required_argument, NULL, &replicas},
	    {"metrics-listen", required_argument, "EMB_METRICS_LISTEN",
	     &metrics_addr},
	    {"coordinator", required_argument, NULL, &coordinator},
	    {"job", required_argument, NULL, &job},
	};
	enum { NFLAGS = sizeof(flags) / sizeof(flags[0]) };
	struct option longopts[NFLAGS + 3] = {
	    [NFLAGS] = {"help", no_argument, NULL, 'h'},
	    [NFLAGS + 1] = {"version", no_argument, NULL, 'V'},
	};
	struct emb_server_role *srole = NULL;
	uint8_t token[EMB_WIRE_TOKEN_MAX + 1];
	uint8_t admin_token[EMB_WIRE_TOKEN_MAX + 1];
	struct sigaction sa;
	sigset_t block, old;
	enum emb_log_level lvl;
	struct emb_addr la;
	long ncpu;
	int c, rc;

	for (int i = 0; i < NFLAGS; i++) {
		longopts[i] = (struct option){flags[i].name, flags[i].has_arg,
					      NULL, 256 + i};
		*flags[i].val = env_or(flags[i].env, NULL);
	}
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (c >= 256 && c < 256 + NFLAGS) {
			*flags[c - 256].val = optarg ? optarg : "1";
		} else if (c == 'h') {
			usage(stdout);
			return 0;
		} else if (c == 'V') {
			printf("embstore-server %s\n", EMB_VERSION);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	listen = listen_flag ? listen_flag
			     : env_or("EMB_LISTEN", "127.0.0.1:7164");
	o.transport = transport;
	if (optind < argc) {
		fprintf(stderr, "embstore-server: unexpected argument '%s'\n",
			argv[optind]);
		return 2;
	}
	if (emb_log_parse_level(level ? level : "info", &lvl)) {
		fprintf(stderr, "embstore-server: bad log level '%s'\n", level);
		return 2;
	}
	emb_log_set_level(lvl);
	if (emb_cluster_env_read(&cenv, &bad) ||
	    (role && emb_role_parse(role, &cenv.role)) ||
	    cenv.role == EMB_ROLE_WORKER) {
		fprintf(stderr, "embstore-server: bad %s\n",
			bad ? bad : "role (scheduler or server)");
		return 2;
	}
	if (coordinator && !emb_coord_is_etcd(coordinator)) {
		fprintf(stderr,
			"embstore-server: --coordinator wants "
			"etcd://HOST:PORT[,HOST:PORT], not '%s'\n",
			coordinator);
		return 2;
	}
	if (coordinator)
		cenv.coordinator = coordinator;
	if (job)
		cenv.job = job;
	if (cenv.coordinator && cenv.role == EMB_ROLE_SCHEDULER) {
		fprintf(stderr, "embstore-server: a job in etcd has no "
				"scheduler\n");
		return 2;
	}
	if (replicas) {
		char *end;
		unsigned long r = strtoul(replicas, &end, 10);

		if (end == replicas || *end || r < 1 ||
		    r > EMB_WIRE_REPLICAS_MAX) {
			fprintf(stderr,
				"embstore-server: bad --replicas '%s' "
				"(1..%u)\n",
				replicas, EMB_WIRE_REPLICAS_MAX);
			return 2;
		}
		cenv.replicas = (uint32_t)r;
	}
	/* The scheduler listens where the nodes look for it; a server of
	 * Paddle's environment at POD_IP:PADDLE_PORT, unless told. */
	if (cenv.role == EMB_ROLE_SCHEDULER && !listen_flag)
		listen = cenv.sched_host[0] ? cenv.sched_host : "127.0.0.1";
	else if (!listen_flag && !env_or("EMB_LISTEN", NULL) && cenv.listen[0])
		listen = cenv.listen;
	if (emb_addr_parse(listen, strlen(listen), DEFAULT_PORT, &la)) {
		fprintf(stderr,
			"embstore-server: bad listen address '%s': want HOST, "
			"HOST:PORT or [V6]:PORT with PORT in 0..65535\n",
			listen);
		return 2;
	}
	if (cenv.role == EMB_ROLE_SCHEDULER && !listen_flag)
		la.port = cenv.sched_port;
	o.port = la.port;
	if (check_host(listen, la.host))
		return 2;
	o.host = la.host;
	/* Both where a device exists: a client without RDMA still gets
	 * in over TCP, one with it moves to RDMA (docs/rdma.md). */
	if (!o.transport)
		o.transport = cenv.role != EMB_ROLE_SCHEDULER &&
				      emb_transport_usable("rdma")
				  ? "tcp,rdma"
				  : "tcp";
	if (strcmp(o.transport, "rdma,tcp") == 0)
		o.transport = "tcp,rdma";
	if (strcmp(o.transport, "tcp") && strcmp(o.transport, "rdma") &&
	    strcmp(o.transport, "tcp,rdma")) {
		fprintf(stderr, "embstore-server: --transport takes tcp, rdma "
				"or tcp,rdma\n");
		return 2;
	}
	o.zero_copy_pulls = strstr(o.transport, "rdma") != NULL;
	o.remote_read = remote_read && strcmp(remote_read, "1") == 0;
	if (zero_copy) {
		if (strcmp(zero_copy, "on") && strcmp(zero_copy, "off")) {
			fprintf(stderr,
				"embstore-server: --zero-copy-pulls takes on "
				"or off\n");
			return 2;
		}
		o.zero_copy_pulls = strcmp(zero_copy, "on") == 0;
	}
	if (huge) {
		if (strcmp(huge, "on") && strcmp(huge, "off")) {
			fprintf(stderr, "embstore-server: --huge-pages takes on "
					"or off\n");
			return 2;
		}
		emb_store_set_huge_pages(strcmp(huge, "on") == 0);
	}
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	o.threads = ncpu > 0 ? (uint32_t)ncpu : 1;
	if (threads && parse_u32(threads, 1, 256, &o.threads)) {
		fprintf(stderr, "embstore-server: bad thread count '%s'\n",
			threads);
		return 2;
	}
	o.mem_limit = emb_server_default_mem_limit();
	if (mem && emb_bytes_parse(mem, &o.mem_limit)) {
		fprintf(stderr, "embstore-server: bad memory limit '%s'\n",
			mem);
		return 2;
	}
	if (tier_max && emb_bytes_parse(tier_max, &o.tier_max)) {
		fprintf(stderr, "embstore-server: bad --tier-max '%s'\n",
			tier_max);
		return 2;
	}
	if (tier_max && !tier_dir) {
		fprintf(stderr, "embstore-server: --tier-max needs "
				"--tier-dir\n");
		return 2;
	}
	if (tier_dir && (!*tier_dir || !o.mem_limit)) {
		fprintf(stderr, "embstore-server: --tier-dir needs a directory "
				"and a --mem-limit\n");
		return 2;
	}
	o.tier_dir = tier_dir;
	if (pretouch && emb_bytes_parse(pretouch, &pretouch_bytes)) {
		fprintf(stderr, "embstore-server: bad --pretouch '%s'\n",
			pretouch);
		return 2;
	}
	if (o.mem_limit && pretouch_bytes > o.mem_limit) {
		fprintf(stderr,
			"embstore-server: --pretouch %s is more than the memory "
			"limit (%llu bytes)\n",
			pretouch, (unsigned long long)o.mem_limit);
		return 2;
	}
	if (move_rate && emb_bytes_parse(move_rate, &o.move_rate)) {
		fprintf(stderr, "embstore-server: bad --move-rate '%s'\n",
			move_rate);
		return 2;
	}
	if (move_bound) {
		char *end = NULL;

		errno = 0;
		o.move_bound = strtod(move_bound, &end);
		/* Under 1 is allowed: every report is then over the bound,
		 * which the tests use to see the pace cut for sure. */
		if (errno || end == move_bound || *end ||
		    !(o.move_bound >= 0 && o.move_bound <= 1000)) {
			fprintf(stderr,
				"embstore-server: bad --move-bound '%s' (a "
				"ratio, 0 to 1000; 0 = off)\n",
				move_bound);
			return 2;
		}
	}
	if (conn_mem && emb_bytes_parse(conn_mem, &o.conn_mem_limit)) {
		fprintf(stderr,
			"embstore-server: bad connection memory limit '%s'\n",
			conn_mem);
		return 2;
	}
	if (max_conns && parse_u32(max_conns, 0, 1u << 20, &o.max_conns)) {
		fprintf(stderr, "embstore-server: bad --max-conns '%s'\n",
			max_conns);
		return 2;
	}
	if ((hs_timeout && parse_ms("handshake-timeout", hs_timeout, 0,
				    86400000, &o.handshake_timeout_ms)) ||
	    (idle_timeout && parse_ms("idle-timeout", idle_timeout, 0,
				      2592000000u, &o.idle_timeout_ms)) ||
	    (frame_timeout && parse_ms("frame-timeout", frame_timeout, 0,
				       86400000, &o.frame_timeout_ms)))
		return 2;
	if ((max_ids && parse_u32(max_ids, 1, 1u << 26, &o.limits.max_ids)) ||
	    (max_frame && parse_u32(max_frame, 4096, EMB_WIRE_FRAME_MAX,
				    &o.limits.max_frame_bytes)) ||
	    (max_tables &&
	     parse_u32(max_tables, 1, 65536, &o.limits.max_tables))) {
		fprintf(stderr, "embstore-server: bad limit\n");
		return 2;
	}
	/* A shard indexes at most 2^24 - 2 rows (store_int.h): the shard
	 * count is what caps a table's rows on one server. */
	if (table_shards &&
	    (parse_u32(table_shards, 1, 1024, &o.table_shards) ||
	     (o.table_shards & (o.table_shards - 1)))) {
		fprintf(stderr,
			"embstore-server: bad --table-shards %s (a power of "
			"two, 1..1024)\n",
			table_shards);
		return 2;
	}
	if ((token_file &&
	     read_token("", token_file, token, &o.auth_token_len)) ||
	    (admin_file && read_token("admin ", admin_file, admin_token,
				      &o.admin_token_len)))
		return 2;
	o.auth_token = token_file ? token : NULL;
	o.admin_token = admin_file ? admin_token : NULL;

	if (ckpt_iv && parse_ms("checkpoint-interval", ckpt_iv, 1,
				UINT32_MAX, &ro.ckpt.interval_ms))
		return 2;
	if (ckpt_full && parse_u32(ckpt_full, 1, EMB_CKPT_FULL_EVERY_MAX,
				   &ro.ckpt.full_every)) {
		fprintf(stderr,
			"embstore-server: bad --checkpoint-full-every (1..%u)\n",
			EMB_CKPT_FULL_EVERY_MAX);
		return 2;
	}
	ro.ckpt.dir = ckpt_dir;
	ro.ckpt_start_empty = start_empty != NULL;

	main_thread = pthread_self();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* Loop threads inherit the blocked mask, so only this thread takes
	 * the signals, and sigsuspend() cannot miss one that came early. */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	if (cenv.role == EMB_ROLE_SCHEDULER)
		return run_scheduler(&cenv, la.host, o.port, metrics_addr, &o,
				     &old);

	/* Before any table is made or loaded: every extent comes from it
	 * while it lasts. */
	if (pretouch_bytes) {
		uint64_t t0 = emb_clock_ns(), ns;
		int prc = emb_store_pretouch(pretouch_bytes);

		if (prc) {
			emb_log(EMB_LOG_ERROR, "--pretouch %s: %s", pretouch,
				emb_strerror(prc));
			return 1;
		}
		ns = emb_clock_ns() - t0;
		emb_log(EMB_LOG_INFO,
			"pretouched %llu MiB in %llu ms (%.0f MB/s): tables "
			"take their memory from it first",
			(unsigned long long)((pretouch_bytes + (1u << 20) - 1) >>
					     20),
			(unsigned long long)(ns / 1000000),
			ns ? (double)pretouch_bytes * 1e3 / (double)ns : 0.0);
	}
	ro.metrics_addr = metrics_addr;
	ro.server = o;
	if (emb_server_role_start(&ro, &srole))
		return 1;
	/* Signals count while the scheduler may not be up yet. */
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	rc = emb_server_role_join(srole);
	pthread_sigmask(SIG_BLOCK, &block, NULL);
	if (rc) {
		emb_server_role_destroy(srole);
		return 1;
	}
	for (bool drain_asked = false;;) {
		while (!got_signal)
			sigsuspend(&old);
		/* SIGTERM in a running replicated job with servers to
		 * spare drains this one first: its slots move to the
		 * others and it stops when it holds none. A second one, or
		 * a refusal, stops it at once (a failover). */
		if (job_over() || got_signal != SIGTERM || drain_asked)
			break;
		drain_asked = true;
		if (emb_server_role_drain(srole))
			break;
		emb_log(EMB_LOG_INFO,
			"SIGTERM: draining: this server's slots move to the "
			"others, then it stops (SIGTERM again stops it now)");
		got_signal = 0;
	}
	emb_log(EMB_LOG_INFO, "%s: stopping",
		job_over() ? (job_failed() ? (cenv.coordinator
						  ? "out of the job"
						  : "scheduler lost")
					   : "job finished")
			   : strsignal(got_signal));
	rc = emb_server_role_stop(srole);
	return job_failed() || rc ? 1 : 0;
}
