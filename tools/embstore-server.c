/*
 * tools/embstore-server.c - the embstore server daemon.
 *
 * Parses flags (each with an EMB_* environment fallback), starts the server
 * and waits for SIGTERM or SIGINT, then stops accepting, lets in-flight
 * requests finish and exits 0. Single-threaded here; the server runs its own
 * loop threads.
 */
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
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/token.h"
#include "metrics/metrics.h"
#include "server/server.h"
#include "server/checkpoint.h"
#include "server/metrics.h"
#include "server/replica.h"
#include "cluster/scheduler.h"
#include "cluster/coord.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "transport/transport.h"

#define DEFAULT_PORT		7164
#define CKPT_KEEP		3
#define CKPT_DEFAULT_INTERVAL_S 300

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
	got_signal = sig;
}

/* Set before the cluster's end wakes main (docs/cluster.md). */
static volatile sig_atomic_t job_over;
static volatile sig_atomic_t job_failed;

/* Scheduler or node agent thread: the job ended; main stops as on SIGTERM. */
static void on_cluster_end(void *arg, int status)
{
	(void)arg;
	job_failed = status != 0;
	job_over = 1;
	kill(getpid(), SIGTERM);
}

/* Where metrics are served, with the bound port (--metrics-listen H:0). */
static void log_metrics_addr(const char *addr, uint16_t port)
{
	struct emb_addr a;
	char buf[EMB_HOST_MAX + 16];

	if (emb_addr_parse(addr, strlen(addr), -1, &a) == 0) {
		a.port = port;
		if (emb_addr_format(&a, buf, sizeof(buf)) > 0)
			addr = buf;
	}
	emb_log(EMB_LOG_INFO,
		"metrics on http://%s/metrics, health on /healthz", addr);
}

/* --metrics-listen: Prometheus /metrics from fn(arg); logs a failure. */
static int start_metrics(const char *addr, emb_metrics_collect_fn fn, void *arg,
			 struct emb_metrics **out)
{
	int rc = emb_metrics_create(addr, fn, arg, out);

	if (rc)
		emb_log(EMB_LOG_ERROR, "cannot serve metrics on %s: %s", addr,
			emb_strerror(rc));
	else
		log_metrics_addr(addr, emb_metrics_port(*out));
	return rc;
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
	so.on_done = on_cluster_end;
	so.auth_token = o->auth_token;
	so.auth_token_len = o->auth_token_len;
	rc = emb_sched_create(&so, &sched);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "cannot schedule on %s:%u: %s", host,
			port, emb_strerror(rc));
		return 1;
	}
	/* A listening scheduler is ready: nodes may join from now on. */
	if (metrics_addr &&
	    start_metrics(metrics_addr, emb_sched_metrics_collect, sched,
			  &metrics)) {
		emb_sched_destroy(sched);
		return 1;
	}
	while (!got_signal)
		sigsuspend(old);
	if (!job_over)
		emb_log(EMB_LOG_INFO, "%s: stopping", strsignal(got_signal));
	rc = job_over ? emb_sched_wait(sched, 0) : 1;
	emb_metrics_destroy(metrics);
	emb_sched_destroy(sched);
	emb_log(EMB_LOG_INFO, "scheduler stopped");
	return rc ? 1 : 0;
}

/*
 * /healthz of a server: ready once it has loaded its checkpoint (before
 * it listens) and, in a cluster, registered with the scheduler; not ready
 * again once it stops.
 */
static volatile sig_atomic_t joined;

static bool server_health(void *arg, char *why, size_t cap)
{
	(void)arg;
	if (got_signal) {
		snprintf(why, cap, "stopping");
		return false;
	}
	if (!joined) {
		snprintf(why, cap, "not registered with the scheduler yet");
		return false;
	}
	return true;
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
	    "  --max-ids N            ids per request (EMB_MAX_IDS)\n"
	    "  --max-frame SIZE       bytes per frame (EMB_MAX_FRAME)\n"
	    "  --max-tables N         tables (EMB_MAX_TABLES)\n"
	    "  --table-shards N       index shards per table, a power of two "
	    "<= 1024\n"
	    "                         (EMB_TABLE_SHARDS; default 64); each "
	    "holds at most\n"
	    "                         2^24 - 2 rows\n"
	    "  --log-level L          error|warn|info|debug (EMB_LOG_LEVEL)\n"
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
	    "  --help, --version\n");
}

/* "123", "64K", "8M", "2G", "1T" -> bytes; -EINVAL if malformed. */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mul = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mul = 1ull << 30;
		end++;
		break;
	case 't':
	case 'T':
		mul = 1ull << 40;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (v && mul > UINT64_MAX / v))
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v;

	if (parse_size(s, &v) || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/*
 * The default --mem-limit: 5/8 of physical memory, or of the cgroup's
 * limit when that is lower, so that tables, connection buffers (a quarter
 * of it) and the process itself fit. 0 when neither can be read.
 */
static uint64_t default_mem_limit(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page
					      : 0;
	unsigned long long cg;
	FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");

	if (f) {
		if (fscanf(f, "%llu", &cg) == 1 && cg && (!phys || cg < phys))
			phys = cg;
		fclose(f);
	}
	return phys / 8 * 5;
}

/* emb_server_opts.on_start: tables come back before the listener opens. */
struct ckpt_start {
	const char *dir;  /* --checkpoint-dir */
	bool start_empty; /* --checkpoint-start-empty */
};

static int load_checkpoint(struct emb_server *s, void *arg)
{
	const struct ckpt_start *cs = arg;

	return emb_ckpt_load(s, cs->dir, cs->start_empty);
}

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);

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

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"transport", required_argument, NULL, 't'},
	    {"threads", required_argument, NULL, 'n'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"admin-token-file", required_argument, NULL, 'A'},
	    {"conn-mem-limit", required_argument, NULL, 'c'},
	    {"max-conns", required_argument, NULL, 'x'},
	    {"handshake-timeout", required_argument, NULL, 'H'},
	    {"idle-timeout", required_argument, NULL, 'D'},
	    {"mem-limit", required_argument, NULL, 'm'},
	    {"max-ids", required_argument, NULL, 'i'},
	    {"max-frame", required_argument, NULL, 'f'},
	    {"max-tables", required_argument, NULL, 'T'},
	    {"table-shards", required_argument, NULL, 'S'},
	    {"log-level", required_argument, NULL, 'L'},
	    {"zero-copy-pulls", required_argument, NULL, 'Z'},
	    {"remote-read", no_argument, NULL, 'W'},
	    {"checkpoint-dir", required_argument, NULL, 'C'},
	    {"checkpoint-interval", required_argument, NULL, 'I'},
	    {"checkpoint-full-every", required_argument, NULL, 'K'},
	    {"checkpoint-start-empty", no_argument, NULL, 'E'},
	    {"role", required_argument, NULL, 'R'},
	    {"replicas", required_argument, NULL, 'P'},
	    {"metrics-listen", required_argument, NULL, 'M'},
	    {"coordinator", required_argument, NULL, 'O'},
	    {"job", required_argument, NULL, 'J'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;
	const char *listen = env_or("EMB_LISTEN", "127.0.0.1:7164");
	const char *threads = env_or("EMB_THREADS", NULL);
	const char *token_file = env_or("EMB_AUTH_TOKEN_FILE", NULL);
	const char *admin_file = env_or("EMB_ADMIN_TOKEN_FILE", NULL);
	const char *conn_mem = env_or("EMB_CONN_MEM_LIMIT", NULL);
	const char *max_conns = env_or("EMB_MAX_CONNS", NULL);
	const char *hs_timeout = env_or("EMB_HANDSHAKE_TIMEOUT", NULL);
	const char *idle_timeout = env_or("EMB_IDLE_TIMEOUT", NULL);
	uint32_t secs;
	char mem_desc[32];
	const char *mem = env_or("EMB_MEM_LIMIT", NULL);
	const char *max_ids = env_or("EMB_MAX_IDS", NULL);
	const char *max_frame = env_or("EMB_MAX_FRAME", NULL);
	const char *max_tables = env_or("EMB_MAX_TABLES", NULL);
	const char *table_shards = env_or("EMB_TABLE_SHARDS", NULL);
	const char *level = env_or("EMB_LOG_LEVEL", "info");
	const char *zero_copy = env_or("EMB_ZERO_COPY_PULLS", NULL);
	const char *remote_read = env_or("EMB_REMOTE_READ", NULL);
	const char *ckpt_dir = env_or("EMB_CHECKPOINT_DIR", NULL);
	const char *ckpt_iv = env_or("EMB_CHECKPOINT_INTERVAL", NULL);
	const char *ckpt_full = env_or("EMB_CHECKPOINT_FULL_EVERY", NULL);
	const char *metrics_addr = env_or("EMB_METRICS_LISTEN", NULL);
	struct emb_metrics *metrics = NULL;
	struct emb_ckpt_opts copts = {.keep = CKPT_KEEP,
				      .interval_s = CKPT_DEFAULT_INTERVAL_S};
	struct emb_ckpt *ckpt = NULL;
	struct ckpt_start cstart = {0};
	bool ckpt_failed = false;
	struct emb_cluster_env cenv;
	struct emb_node *node = NULL;
	struct emb_replica *replica = NULL;
	const char *role = NULL, *bad = NULL, *replicas = NULL;
	const char *coordinator = NULL, *job = NULL;
	bool listen_set = false;
	uint8_t token[EMB_WIRE_TOKEN_MAX + 1];
	uint8_t admin_token[EMB_WIRE_TOKEN_MAX + 1];
	struct emb_server *srv;
	struct sigaction sa;
	sigset_t block, old;
	enum emb_log_level lvl;
	struct emb_addr la;
	long ncpu;
	int c, rc;

	o.transport = env_or("EMB_TRANSPORT", NULL);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'l':
			listen = optarg;
			listen_set = true;
			break;
		case 't':
			o.transport = optarg;
			break;
		case 'n':
			threads = optarg;
			break;
		case 'a':
			token_file = optarg;
			break;
		case 'A':
			admin_file = optarg;
			break;
		case 'c':
			conn_mem = optarg;
			break;
		case 'x':
			max_conns = optarg;
			break;
		case 'H':
			hs_timeout = optarg;
			break;
		case 'D':
			idle_timeout = optarg;
			break;
		case 'm':
			mem = optarg;
			break;
		case 'i':
			max_ids = optarg;
			break;
		case 'f':
			max_frame = optarg;
			break;
		case 'T':
			max_tables = optarg;
			break;
		case 'S':
			table_shards = optarg;
			break;
		case 'L':
			level = optarg;
			break;
		case 'Z':
			zero_copy = optarg;
			break;
		case 'W':
			remote_read = "1";
			break;
		case 'C':
			ckpt_dir = optarg;
			break;
		case 'I':
			ckpt_iv = optarg;
			break;
		case 'K':
			ckpt_full = optarg;
			break;
		case 'E':
			cstart.start_empty = true;
			break;
		case 'R':
			role = optarg;
			break;
		case 'P':
			replicas = optarg;
			break;
		case 'M':
			metrics_addr = optarg;
			break;
		case 'O':
			coordinator = optarg;
			break;
		case 'J':
			job = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("embstore-server %s\n", EMB_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "embstore-server: unexpected argument '%s'\n",
			argv[optind]);
		return 2;
	}
	if (emb_log_parse_level(level, &lvl)) {
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
	if (cenv.role == EMB_ROLE_SCHEDULER && !listen_set)
		listen = cenv.sched_host[0] ? cenv.sched_host : "127.0.0.1";
	else if (!listen_set && !env_or("EMB_LISTEN", NULL) && cenv.listen[0])
		listen = cenv.listen;
	if (emb_addr_parse(listen, strlen(listen), DEFAULT_PORT, &la)) {
		fprintf(stderr,
			"embstore-server: bad listen address '%s': want HOST, "
			"HOST:PORT or [V6]:PORT with PORT in 0..65535\n",
			listen);
		return 2;
	}
	if (cenv.role == EMB_ROLE_SCHEDULER && !listen_set)
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
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	o.threads = ncpu > 0 ? (uint32_t)ncpu : 1;
	if (threads && parse_u32(threads, 1, 256, &o.threads)) {
		fprintf(stderr, "embstore-server: bad thread count '%s'\n",
			threads);
		return 2;
	}
	o.mem_limit = default_mem_limit();
	if (mem && parse_size(mem, &o.mem_limit)) {
		fprintf(stderr, "embstore-server: bad memory limit '%s'\n",
			mem);
		return 2;
	}
	if (conn_mem && parse_size(conn_mem, &o.conn_mem_limit)) {
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
	if (hs_timeout) {
		if (parse_u32(hs_timeout, 0, 86400, &secs)) {
			fprintf(stderr,
				"embstore-server: bad --handshake-timeout "
				"'%s' (seconds, 0..86400)\n",
				hs_timeout);
			return 2;
		}
		o.handshake_timeout_ms = secs * 1000;
	}
	if (idle_timeout) {
		if (parse_u32(idle_timeout, 0, 86400 * 30, &secs)) {
			fprintf(stderr,
				"embstore-server: bad --idle-timeout '%s' "
				"(seconds, 0..2592000)\n",
				idle_timeout);
			return 2;
		}
		o.idle_timeout_ms = secs * 1000;
	}
	if (o.mem_limit)
		snprintf(mem_desc, sizeof(mem_desc), "%llu MiB",
			 (unsigned long long)(o.mem_limit >> 20));
	else
		snprintf(mem_desc, sizeof(mem_desc), "none");
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
	if (token_file) {
		rc = emb_token_read_file(token_file, token, &o.auth_token_len);
		if (rc) {
			fprintf(stderr,
				"embstore-server: cannot use token file %s: "
				"%s\n",
				token_file,
				rc == -EINVAL ? "empty or longer than 256 bytes"
					      : emb_strerror(rc));
			return 2;
		}
		o.auth_token = token;
	}
	if (admin_file) {
		rc = emb_token_read_file(admin_file, admin_token,
					 &o.admin_token_len);
		if (rc) {
			fprintf(stderr,
				"embstore-server: cannot use admin token file "
				"%s: %s\n",
				admin_file,
				rc == -EINVAL ? "empty or longer than 256 bytes"
					      : emb_strerror(rc));
			return 2;
		}
		o.admin_token = admin_token;
	}

	if (ckpt_iv && parse_u32(ckpt_iv, 1, 1u << 30, &copts.interval_s)) {
		fprintf(stderr, "embstore-server: bad checkpoint interval\n");
		return 2;
	}
	if (ckpt_full && parse_u32(ckpt_full, 1, EMB_CKPT_FULL_EVERY_MAX,
				   &copts.full_every)) {
		fprintf(stderr,
			"embstore-server: bad --checkpoint-full-every (1..%u)\n",
			EMB_CKPT_FULL_EVERY_MAX);
		return 2;
	}
	if (ckpt_dir) {
		copts.dir = ckpt_dir;
		cstart.dir = ckpt_dir;
		o.on_start = load_checkpoint;
		o.start_arg = &cstart;
	}

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

	rc = emb_server_create(&o, &srv);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "cannot serve %s:%u over %s: %s", la.host,
			o.port, o.transport, emb_strerror(rc));
		return 1;
	}
	emb_log(EMB_LOG_INFO,
		"listening on %s:%u (%s, %u thread%s%s%s, mem limit %s)",
		la.host, emb_server_port(srv), o.transport, o.threads,
		o.threads == 1 ? "" : "s", o.auth_token_len ? ", auth" : "",
		o.admin_token_len ? ", admin token" : "", mem_desc);
	if (metrics_addr &&
	    start_metrics(metrics_addr, emb_server_metrics_collect, srv,
			  &metrics)) {
		emb_server_destroy(srv);
		return 1;
	}
	/* Checkpoint loaded (emb_server_create ran on_start); a server in
	 * a cluster is ready once it registered. */
	joined = !cenv.sched_host[0] && !cenv.coordinator;
	if (metrics)
		emb_metrics_set_health(metrics, server_health, NULL);
	if (ckpt_dir) {
		rc = emb_ckpt_start(srv, &copts, &ckpt);
		if (rc) {
			emb_log(EMB_LOG_ERROR, "cannot start checkpoints: %s",
				emb_strerror(rc));
			emb_metrics_destroy(metrics);
			emb_server_destroy(srv);
			return 1;
		}
	}
	if (cenv.sched_host[0] || cenv.coordinator) {
		struct emb_node_opts no = {
		    .coordinator = cenv.coordinator,
		    .job = cenv.job,
		    .server_num = cenv.server_num,
		    .worker_num = cenv.worker_num,
		    .hb_timeout_ms = cenv.hb_timeout_ms,
		    .replicas = cenv.replicas,
		    .sched_host = cenv.sched_host,
		    .sched_port = cenv.sched_port,
		    .role = EMB_ROLE_SERVER,
		    .host = la.host,
		    .port = emb_server_port(srv),
		    .join_timeout_ms = cenv.join_timeout_ms,
		    .on_end = on_cluster_end,
		    .cancel = &got_signal,
		    .auth_token = o.auth_token,
		    .auth_token_len = o.auth_token_len,
		};

		/* Signals count while the scheduler may not be up yet. */
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		rc = emb_node_create(&no, &node);
		pthread_sigmask(SIG_BLOCK, &block, NULL);
		if (rc && !got_signal) {
			emb_ckpt_stop(ckpt);
			emb_metrics_destroy(metrics);
			emb_server_destroy(srv);
			return 1;
		}
		joined = rc == 0;
		/* Replicated: writes are checked against the scheduler's
		 * map, and fills stream from here (docs/replication.md). */
		if (joined && !cenv.coordinator &&
		    emb_replica_create(srv, node, &replica))
			emb_log(EMB_LOG_ERROR, "cannot follow the cluster map: %s",
				emb_strerror(-ENOMEM));
	}
	while (!got_signal)
		sigsuspend(&old);
	emb_log(EMB_LOG_INFO, "%s: stopping",
		job_over ? (job_failed ? (cenv.coordinator ? "out of the job"
							    : "scheduler lost")
				       : "job finished")
			 : strsignal(got_signal));
	emb_server_stop(srv, 10000);
	/* Requests have stopped: the last checkpoint holds every update. */
	if (ckpt) {
		rc = emb_ckpt_write_final(ckpt);
		ckpt_failed = rc != 0;
		if (rc)
			emb_log(EMB_LOG_ERROR,
				"final checkpoint failed: %s; exiting 1, "
				"updates since the last checkpoint are lost",
				emb_strerror(rc));
	}
	emb_ckpt_stop(ckpt);
	emb_metrics_destroy(metrics);
	emb_replica_destroy(replica);
	emb_server_destroy(srv);
	emb_node_destroy(node);
	emb_log(EMB_LOG_INFO, "stopped");
	return job_failed || ckpt_failed ? 1 : 0;
}
