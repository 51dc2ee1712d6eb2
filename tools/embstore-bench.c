/*
 * tools/embstore-bench.c - load generator for the embedding store: preloads
 * a table, drives pull / push / step batches from N threads with uniform or
 * Zipf ids, and reports throughput, a latency histogram and memory per row.
 * The raw-gather and raw-apply ops run the same id stream against a dense
 * array: the physical limit the store's figures are judged against.
 *
 * Only ids are generated outside the clock: each batch's time is taken
 * around the backend call, rows_per_s is the sum over threads of the rows a
 * thread moved divided by its time inside backend calls.
 *
 * With --cache (client backend) each thread trains through a cached table:
 * a step is lookup, prefetch of the batch --prefetch steps ahead (its ids
 * drawn before the clock starts), --compute-us of busy work standing in for
 * the model, and push; the JSON adds hit ratio and bytes moved.
 *
 * With --verify each thread pushes gradients of 1 to rows of its own (per
 * worker process and thread: nobody shares a row) through SGD with lr 0.5
 * from zeros, counts how often each row was in an acknowledged push, and
 * at the end pulls every row it touched: a row pushed k times must read
 * -0.5 k in every element, exactly (multiples of 0.5 add without rounding
 * in any order). A push that fails fails the run, so every counted push
 * was acknowledged, and none is counted twice.
 *
 * Built with EMB_BENCH_ROCKSDB (as embstore-bench-rocks, where librocksdb
 * is found), the in-process ops run on a RocksDB database in --tier-dir
 * with --mem-limit as its block cache and memtables (bench_rocks.c): the
 * baseline the device tier is measured against, with the same id streams,
 * batches, timing and report.
 *
 * Threads: main parses options, runs the phases and prints; workers each own
 * one struct worker and touch shared state only through atomics.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/hist.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "common/seconds.h"
#include "common/token.h"
#include "store/store.h"
#include "worker/embstore.h"

#define THREADS_MAX 256u
#define BATCH_MAX (1u << 20)
#define PROGRESS_NS 250000000ull /* progress line refresh */

struct opts {
	struct emb_bench_cfg cfg;	/* what the backend sees */
	const char *op_name;		/* as given: pull, raw-gather, ... */
	uint32_t op;			/* enum emb_bench_op */
	const struct emb_bench_backend *backend;
	const char *dist_name;		/* as given: zipf:1.05, uniform */
	struct emb_dist dist;		/* parsed dist_name */
	const char *optim_name;		/* as given to --optimizer */
	double duration_s;		/* timed phase, when batches is 0 */
	double warmup_s;		/* untimed phase before it */
	double report_s;		/* --report-interval; 0 = no lines */
	uint64_t batches;		/* per thread; 0 = run for duration_s */
	const char *stop_file;		/* --stop-file: the run ends once it
					   exists */
	const char *pause_file;		/* --pause-file: no batch while it
					   exists */
	const char *simd;		/* --simd as given, or "auto" */
	bool json;			/* one JSON line on stdout */
	bool in_process;		/* --in-process given */
	const char *sched;		/* --sched HOST:PORT */
	const char *token_file;		/* --auth-token-file, or the env */
	double mix;			/* op mix: share of batches that pull */
	const char *transport_name;	/* for the report, after open */
	uint32_t compute_us;		/* busy wait between pull and push */
	const char *cache_mode_name;	/* as given: through, back */
	const char *cache_policy_name;	/* as given: lru, clock, tinylfu */
	bool cache_opts_given;		/* --prefetch, --staleness,
					   --cache-mode or --cache-policy */
	bool verify;			/* --verify */
	bool optim_given;		/* --optimizer given */
	bool rowfmt_given;		/* --row-format given */
};

/* What a worker does in the current phase. */
enum phase {
	PHASE_PRELOAD = 1, /* create rows [lo, hi) */
	PHASE_WARMUP = 2,  /* run the op untimed until the deadline */
	PHASE_MEASURE = 3, /* run the op, record every batch */
};

struct worker {
	pthread_t tid;
	bool joined;			/* tid already joined this phase */
	uint32_t idx;			/* 0..threads-1 */
	const struct opts *o;
	const struct emb_bench_backend *be;
	void *ctx;			/* backend's per-thread context */
	enum phase phase;
	uint64_t lo, hi;		/* preload: row range */
	uint64_t deadline_ns;		/* warmup / duration: stop after */
	uint64_t max_batches;		/* measure: stop after; 0 = deadline */
	uint64_t stop_check_ns;		/* next look for --stop-file */
	uint64_t pause_check_ns;	/* next look for --pause-file */
	struct emb_idgen gen;		/* this thread's id stream */
	uint64_t *ids;			/* ring of k + 1 batches of ids */
	uint32_t k;			/* batches prefetched ahead */
	uint32_t head;			/* ring slot of the next batch */
	bool primed;			/* batches 0..k-1 prefetched */
	float *out;			/* batch * dim: pull output */
	float *grads;			/* batch * dim: push input */
	uint64_t *set;			/* open-addressing set: distinct ids */
	uint32_t set_mask;		/* set slots - 1 */
	struct emb_hist hist;		/* batch latency, ns */
	pthread_mutex_t ilock;		/* guards ihist: main reads it */
	struct emb_hist ihist;		/* --report-interval: this interval's
					   batch latency, ns */
	uint64_t batches_done;		/* timed batches */
	uint64_t rows_done;		/* ids in timed batches */
	uint64_t busy_ns;		/* time inside backend calls */
	uint64_t end_ns;		/* when this phase's loop ended */
	uint64_t cpu_ns;		/* this thread's CPU time in preload */
	uint64_t unique_sum;		/* distinct ids summed over batches */
	uint64_t mix_rng;		/* op mix: pull or push per batch */
	_Atomic uint64_t progress;	/* rows so far, read by main */
	_Atomic uint64_t progress_ns;	/* their time in backend calls */
	int rc;				/* first error, 0 if none */
	/* --verify: this thread's rows [vlo, vlo + vlen) */
	uint64_t vlo;			/* first row */
	uint64_t vlen;			/* rows, >= 1 */
	uint32_t *vcnt;			/* acknowledged pushes per row */
	/* Their gradients' sum: a batch's are all +1 or all -1, in turn,
	 * so that a row stays near 0, where float sums of 1 are exact
	 * (a hot row of a long run takes 10^8 pushes: past 2^24, adding 1
	 * no longer changes a float, and a lost push would hide). */
	int32_t *vsum;
	/* Under --admit count:N, pull batches that held each row (a row's
	 * pushes count once it has N: the N-th sighting admits it, and that
	 * step's push applies), and the last batch counted per row. */
	uint32_t *vseen;
	uint64_t *vlast;
	uint64_t vbatch; /* batches pushed so far */
	float vsign; /* the gradients of the batch being pushed */
	uint64_t *vrows;		/* the batch's rows, before hashing */
};

static void usage(FILE *f)
{
	fputs(
	    "usage: embstore-bench [options]\n"
	    "  --in-process          drive a table in this process (default)\n"
	    "  --servers LIST        drive running servers: host:port,...\n"
	    "  --sched HOST:PORT     find the servers through the scheduler\n"
	    "                        (neither, with EMB_SCHED_HOST, "
	    "EMB_COORDINATOR\n"
	    "                        or Paddle's PADDLE_PSERVERS_IP_PORT_LIST"
	    " set: join\n"
	    "                        the cluster as a worker)\n"
	    "  --transport T         tcp | rdma | auto (tcp)\n"
	    "  --pull-mode M         twosided | onesided (twosided): onesided "
	    "READs rows\n"
	    "                        out of --remote-read servers' memory over "
	    "RDMA\n"
	    "  --auth-token-file F   token for the servers and the scheduler\n"
	    "                        (EMB_AUTH_TOKEN_FILE)\n"
	    "  --preload | --no-preload  create the rows first (default on)\n"
	    "  --op OP               pull | push | step | mix:F | raw-gather |"
	    " raw-apply |\n"
	    "                        raw-index-gather | raw-index-apply;\n"
	    "                        mix:0.8 pulls 80% of batches, pushes"
	    " the rest\n"
	    "  --cache ROWS          client: a cached table of ROWS rows per"
	    " thread\n"
	    "  --prefetch K          cache: batches fetched ahead (0)\n"
	    "  --staleness S         cache, write-through: max row age in"
	    " steps (0)\n"
	    "  --cache-mode M        cache: through | back (back)\n"
	    "  --cache-policy P      cache: tinylfu | lru | clock"
	    " (tinylfu)\n"
	    "  --compute-us N        busy-wait N us between pull and push (0)\n"
	    "  --verify              push or step: each thread pushes to rows"
	    " of its own\n"
	    "                        (sgd lr 0.5 from zeros), then checks"
	    " every row\n"
	    "                        it touched; exit 1 on a mismatch\n"
	    "  --rows N              rows preloaded, 1..2^32 (1000000)\n"
	    "  --dim N               floats per row (64)\n"
	    "  --batch N             ids per batch (4096)\n"
	    "  --dist D              uniform | zipf:S (zipf:1.05)\n"
	    "  --optimizer SPEC      sgd|adagrad|adam|ftrl|rowwise_adagrad"
	    "[:key=value,...] (sgd)\n"
	    "  --row-format F        in process: fp32 | fp16 | bf16 | int8,"
	    " how the table\n"
	    "                        keeps its weights (fp32)\n"
	    "  --mem-limit SIZE      in process: the table's memory limit"
	    " (64M, 2G; none)\n"
	    "  --tier-dir DIR        in process: rows past --mem-limit go to"
	    " a device\n"
	    "                        tier, a file in DIR (docs/store.md)\n"
	    "  --admit SPEC          none | count:N | bloom:N[:BYTES] (none)\n"
	    "  --evict SPEC          none | ttl:STEPS,min_l2:X,"
	    "max_rows:N[:lru|lfu] (none)\n"
	    "  --threads N           worker threads (1)\n"
	    "  --duration SECONDS    timed run length (5)\n"
	    "  --batches N           batches per thread instead of --duration\n"
	    "  --warmup SECONDS      untimed run before timing (0)\n"
	    "  --simd W              in process: the store's vector copies at"
	    " most W wide:\n"
	    "                        avx512, avx2 or none (auto: the CPU's"
	    " widest)\n"
	    "  --stop-file PATH      end the run (warmup or timed) early once"
	    " PATH exists,\n"
	    "                        looked for every 0.1 s; --duration or"
	    " --batches\n"
	    "                        still bound it\n"
	    "  --pause-file PATH     run no batch while PATH exists (looked"
	    " for every\n"
	    "                        0.1 s): the connections and the job stay"
	    " up, idle\n"
	    "  --report-interval S   timed run: a latency line on stderr"
	    " every S seconds\n"
	    "  --seed N              id streams and table seed (1)\n"
	    "  --table NAME          table name (bench)\n"
	    "  --tables N            client: each batch goes to N tables\n"
	    "                        (NAME, NAME.1 ...; a step of N sparse\n"
	    "                        features), one call per table (1)\n"
	    "  --multi               with --tables: one pull_many and one\n"
	    "                        push_many per batch instead\n"
	    "  --json                one JSON object on stdout; summary to"
	    " stderr\n"
	    "  -h, --help            this text\n"
	    "  --version             the version\n",
	    f);
#ifdef EMB_BENCH_ROCKSDB
	fputs("embstore-bench-rocks: pull, push, step and mix run on a RocksDB"
	      " database in\n"
	      "--tier-dir (made empty, removed at exit) with --mem-limit as its"
	      " block cache\n"
	      "and memtables; both are needed (docs/bench.md).\n",
	      f);
#endif
}

static bool nonempty_env(const char *name)
{
	const char *v = getenv(name);

	return v && *v;
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!s || *s == '-' || *s == '\0')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Seconds, fractions allowed, in [0, 10^6]. */
static int parse_secs(const char *s, double *out)
{
	uint64_t ms;
	int rc = emb_seconds_parse(s, 0, 1000000000, &ms);

	if (rc == 0)
		*out = ms / 1000.0;
	return rc;
}

enum {
	OPT_IN_PROCESS = 256,
	OPT_OP,
	OPT_ROWS,
	OPT_DIM,
	OPT_BATCH,
	OPT_DIST,
	OPT_OPTIMIZER,
	OPT_THREADS,
	OPT_DURATION,
	OPT_BATCHES,
	OPT_WARMUP,
	OPT_STOP_FILE,
	OPT_PAUSE_FILE,
	OPT_SEED,
	OPT_TABLE,
	OPT_JSON,
	OPT_SERVERS,
	OPT_SCHED,
	OPT_TOKEN_FILE,
	OPT_TRANSPORT,
	OPT_PRELOAD,
	OPT_NO_PRELOAD,
	OPT_CACHE,
	OPT_PREFETCH,
	OPT_STALENESS,
	OPT_CACHE_MODE,
	OPT_CACHE_POLICY,
	OPT_COMPUTE_US,
	OPT_ADMIT,
	OPT_EVICT,
	OPT_VERIFY,
	OPT_REPORT_INTERVAL,
	OPT_PULL_MODE,
	OPT_TABLES,
	OPT_MULTI,
	OPT_ROW_FORMAT,
	OPT_MEM_LIMIT,
	OPT_TIER_DIR,
	OPT_SIMD,
};

static const struct option long_opts[] = {
    {"in-process", no_argument, NULL, OPT_IN_PROCESS},
    {"op", required_argument, NULL, OPT_OP},
    {"rows", required_argument, NULL, OPT_ROWS},
    {"dim", required_argument, NULL, OPT_DIM},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"dist", required_argument, NULL, OPT_DIST},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"row-format", required_argument, NULL, OPT_ROW_FORMAT},
    {"mem-limit", required_argument, NULL, OPT_MEM_LIMIT},
    {"tier-dir", required_argument, NULL, OPT_TIER_DIR},
    {"simd", required_argument, NULL, OPT_SIMD},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"stop-file", required_argument, NULL, OPT_STOP_FILE},
    {"pause-file", required_argument, NULL, OPT_PAUSE_FILE},
    {"batches", required_argument, NULL, OPT_BATCHES},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"table", required_argument, NULL, OPT_TABLE},
    {"tables", required_argument, NULL, OPT_TABLES},
    {"multi", no_argument, NULL, OPT_MULTI},
    {"json", no_argument, NULL, OPT_JSON},
    {"servers", required_argument, NULL, OPT_SERVERS},
    {"sched", required_argument, NULL, OPT_SCHED},
    {"auth-token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"transport", required_argument, NULL, OPT_TRANSPORT},
    {"pull-mode", required_argument, NULL, OPT_PULL_MODE},
    {"preload", no_argument, NULL, OPT_PRELOAD},
    {"no-preload", no_argument, NULL, OPT_NO_PRELOAD},
    {"cache", required_argument, NULL, OPT_CACHE},
    {"prefetch", required_argument, NULL, OPT_PREFETCH},
    {"staleness", required_argument, NULL, OPT_STALENESS},
    {"cache-mode", required_argument, NULL, OPT_CACHE_MODE},
    {"cache-policy", required_argument, NULL, OPT_CACHE_POLICY},
    {"compute-us", required_argument, NULL, OPT_COMPUTE_US},
    {"admit", required_argument, NULL, OPT_ADMIT},
    {"evict", required_argument, NULL, OPT_EVICT},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"report-interval", required_argument, NULL, OPT_REPORT_INTERVAL},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* A raw op: the dense array, with or without its index (bench_raw.c). */
static bool raw_op(const struct opts *o)
{
	return o->backend == &emb_bench_raw_backend ||
	       o->backend == &emb_bench_raw_index_backend;
}

static int parse_op(struct opts *o, const char *s)
{
	static const struct {
		const char *name;
		uint32_t op;
		const struct emb_bench_backend *be;
	} ops[] = {
		{"pull", EMB_BENCH_PULL, &emb_bench_store_backend},
		{"push", EMB_BENCH_PUSH, &emb_bench_store_backend},
		{"step", EMB_BENCH_STEP, &emb_bench_store_backend},
		{"raw-gather", EMB_BENCH_PULL, &emb_bench_raw_backend},
		{"raw-apply", EMB_BENCH_PUSH, &emb_bench_raw_backend},
		{"raw-index-gather", EMB_BENCH_PULL,
		 &emb_bench_raw_index_backend},
		{"raw-index-apply", EMB_BENCH_PUSH,
		 &emb_bench_raw_index_backend},
	};

	if (strncmp(s, "mix:", 4) == 0) {
		char *end;
		double f = strtod(s + 4, &end);

		if (*end || end == s + 4 || !(f >= 0.0 && f <= 1.0))
			return -EINVAL;
		o->op_name = s;
		o->op = EMB_BENCH_MIX;
		o->mix = f;
		o->backend = &emb_bench_store_backend;
		return 0;
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		if (strcmp(s, ops[i].name) == 0) {
			o->op_name = ops[i].name;
			o->op = ops[i].op;
			o->backend = ops[i].be;
			return 0;
		}
	}
	return -EINVAL;
}

/* The cache options fit the backend and op. 0, or -EINVAL after saying why. */
static int check_cache_opts(const struct opts *o)
{
	bool any = o->cfg.cache_rows || o->cache_opts_given;

	if (!any)
		return 0;
	if (o->backend != &emb_bench_client_backend) {
		fprintf(stderr, "embstore-bench: --cache and its options need"
				" servers (--servers, --sched or the"
				" environment)\n");
		return -EINVAL;
	}
	if (!o->cfg.cache_rows) {
		fprintf(stderr, "embstore-bench: --prefetch, --staleness,"
				" --cache-mode and --cache-policy need"
				" --cache\n");
		return -EINVAL;
	}
	/* A cached push applies the gradients of the batch looked up last. */
	if (o->op != EMB_BENCH_STEP && o->op != EMB_BENCH_PULL) {
		fprintf(stderr, "embstore-bench: with --cache, --op is step or"
				" pull\n");
		return -EINVAL;
	}
	return 0;
}

/* Fills *o from argv. 0, or -EINVAL after printing why. */
static int check_verify(struct opts *o);

/*
 * --simd: the widest vector copies the store's loops (the optimizers, the
 * pull's gathers, the row formats, the ids' hash, the non-finite check)
 * may take, whatever the CPU has: one CPU then measures the copies a CPU
 * without AVX-512, or without AVX2, would run (docs/bench.md). Set while
 * parsing, before any table exists.
 */
static int set_simd(const char *w)
{
	unsigned bits;

	if (!strcmp(w, "avx512") || !strcmp(w, "auto"))
		bits = 64;
	else if (!strcmp(w, "avx2"))
		bits = 32;
	else if (!strcmp(w, "none"))
		bits = 0;
	else
		return -EINVAL;
	emb_store_set_vec_max(bits);
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	uint64_t v = 0;
	int c, rc = 0;

	*o = (struct opts){
	    .simd = "auto",
		.cfg = {.table = "bench",
			.rows = 1000000,
			.dim = 64,
			.batch = 4096,
			.threads = 1,
			.optim = EMB_OPTIM_CFG_DEFAULT,
			.init = EMB_INIT_CFG_DEFAULT,
			.seed = 1,
			.tables = 1},
		.optim_name = "sgd",
		.dist_name = "zipf:1.05",
		.duration_s = 5.0,
	};
	o->cfg.transport = "tcp";
	o->cfg.preload = true;
	o->token_file = getenv("EMB_AUTH_TOKEN_FILE");
	/* The cache flags default to the cached table's defaults. */
	o->cfg.cache_mode = EMB_CACHED_TABLE_OPTS_DEFAULT.mode;
	o->cfg.cache_policy = EMB_CACHED_TABLE_OPTS_DEFAULT.policy;
	o->cfg.staleness = EMB_CACHED_TABLE_OPTS_DEFAULT.staleness_steps;
	o->cache_mode_name =
	    o->cfg.cache_mode == EMB_CACHED_WRITE_BACK ? "back" : "through";
	o->cache_policy_name = "tinylfu";
	parse_op(o, "pull");
	emb_dist_parse(o->dist_name, &o->dist);

	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		const char *what = NULL;

		switch (c) {
		case OPT_IN_PROCESS:
			o->in_process = true;
			break;
		case OPT_SERVERS:
			o->cfg.servers = optarg;
			break;
		case OPT_SCHED:
			o->sched = optarg;
			break;
		case OPT_TOKEN_FILE:
			o->token_file = optarg;
			break;
		case OPT_TRANSPORT:
			o->cfg.transport = optarg;
			if (strcmp(optarg, "tcp") && strcmp(optarg, "rdma") &&
			    strcmp(optarg, "auto"))
				what = "--transport";
			break;
		case OPT_PULL_MODE:
			if (strcmp(optarg, "twosided") == 0)
				o->cfg.pull_mode = EMB_PULL_TWOSIDED;
			else if (strcmp(optarg, "onesided") == 0)
				o->cfg.pull_mode = EMB_PULL_ONESIDED;
			else
				what = "--pull-mode";
			break;
		case OPT_PRELOAD:
			o->cfg.preload = true;
			break;
		case OPT_NO_PRELOAD:
			o->cfg.preload = false;
			break;
		case OPT_CACHE:
			if (parse_u64(optarg, 1, UINT32_MAX, &v))
				what = "--cache";
			o->cfg.cache_rows = (uint32_t)v;
			break;
		case OPT_PREFETCH:
			if (parse_u64(optarg, 0, 64, &v))
				what = "--prefetch";
			o->cfg.prefetch = (uint32_t)v;
			o->cache_opts_given = true;
			break;
		case OPT_STALENESS:
			if (parse_u64(optarg, 0, UINT32_MAX, &v))
				what = "--staleness";
			o->cfg.staleness = (uint32_t)v;
			o->cache_opts_given = true;
			break;
		case OPT_CACHE_POLICY:
			o->cache_policy_name = optarg;
			o->cache_opts_given = true;
			if (!strcmp(optarg, "tinylfu"))
				o->cfg.cache_policy = EMB_CACHED_TINYLFU;
			else if (!strcmp(optarg, "lru"))
				o->cfg.cache_policy = EMB_CACHED_LRU;
			else if (!strcmp(optarg, "clock"))
				o->cfg.cache_policy = EMB_CACHED_CLOCK;
			else
				what = "--cache-policy";
			break;
		case OPT_CACHE_MODE:
			o->cache_mode_name = optarg;
			o->cache_opts_given = true;
			if (!strcmp(optarg, "through"))
				o->cfg.cache_mode = EMB_CACHED_WRITE_THROUGH;
			else if (!strcmp(optarg, "back"))
				o->cfg.cache_mode = EMB_CACHED_WRITE_BACK;
			else
				what = "--cache-mode";
			break;
		case OPT_VERIFY:
			o->verify = true;
			break;
		case OPT_COMPUTE_US:
			if (parse_u64(optarg, 0, 10000000, &v))
				what = "--compute-us";
			o->compute_us = (uint32_t)v;
			break;
		case OPT_OP:
			if (parse_op(o, optarg))
				what = "--op";
			break;
		case OPT_ROWS:
			if (parse_u64(optarg, 1, UINT64_C(1) << 32, &o->cfg.rows))
				what = "--rows";
			break;
		case OPT_DIM:
			if (parse_u64(optarg, 1, 4096, &v))
				what = "--dim";
			o->cfg.dim = (uint32_t)v;
			break;
		case OPT_BATCH:
			if (parse_u64(optarg, 1, BATCH_MAX, &v))
				what = "--batch";
			o->cfg.batch = (uint32_t)v;
			break;
		case OPT_DIST:
			o->dist_name = optarg;
			if (emb_dist_parse(optarg, &o->dist))
				what = "--dist";
			break;
		case OPT_OPTIMIZER:
			o->optim_name = optarg;
			o->optim_given = true;
			if (emb_optim_parse(optarg, &o->cfg.optim))
				what = "--optimizer";
			break;
		case OPT_MEM_LIMIT:
			if (emb_bytes_parse(optarg, &o->cfg.mem_limit) ||
			    !o->cfg.mem_limit)
				what = "--mem-limit";
			break;
		case OPT_TIER_DIR:
			o->cfg.tier_dir = optarg;
			break;
		case OPT_SIMD:
			if (set_simd(optarg))
				what = "--simd";
			o->simd = optarg;
			break;
		case OPT_ROW_FORMAT:
			o->rowfmt_given = true;
			if (emb_rowfmt_parse(optarg, &o->cfg.row_format))
				what = "--row-format";
			break;
		case OPT_ADMIT:
			if (emb_admit_parse(optarg, &o->cfg.life))
				what = "--admit";
			break;
		case OPT_EVICT:
			if (emb_evict_parse(optarg, &o->cfg.life))
				what = "--evict";
			break;
		case OPT_THREADS:
			if (parse_u64(optarg, 1, THREADS_MAX, &v))
				what = "--threads";
			o->cfg.threads = (uint32_t)v;
			break;
		case OPT_DURATION:
			if (parse_secs(optarg, &o->duration_s) ||
			    o->duration_s <= 0.0)
				what = "--duration";
			break;
		case OPT_BATCHES:
			if (parse_u64(optarg, 1, UINT64_MAX, &o->batches))
				what = "--batches";
			break;
		case OPT_WARMUP:
			if (parse_secs(optarg, &o->warmup_s))
				what = "--warmup";
			break;
		case OPT_STOP_FILE:
			if (!*optarg)
				what = "--stop-file";
			o->stop_file = optarg;
			break;
		case OPT_PAUSE_FILE:
			if (!*optarg)
				what = "--pause-file";
			o->pause_file = optarg;
			break;
		case OPT_REPORT_INTERVAL:
			/* Finer than the 250 ms nap of run_phase() cannot be
			 * kept; a lone long stall still shows, as a line of
			 * 0 batches. */
			if (parse_secs(optarg, &o->report_s) ||
			    o->report_s < 0.25)
				what = "--report-interval";
			break;
		case OPT_SEED:
			if (parse_u64(optarg, 0, UINT64_MAX, &o->cfg.seed))
				what = "--seed";
			break;
		case OPT_TABLE:
			o->cfg.table = optarg;
			break;
		case OPT_TABLES:
			if (parse_u64(optarg, 1, EMB_BENCH_TABLES_MAX, &v))
				what = "--tables";
			o->cfg.tables = (uint32_t)v;
			break;
		case OPT_MULTI:
			o->cfg.multi = true;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("embstore-bench %s\n", EMB_VERSION);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
		if (what) {
			fprintf(stderr, "embstore-bench: bad %s '%s'\n", what,
				optarg);
			rc = -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "embstore-bench: unexpected argument '%s'\n",
			argv[optind]);
		rc = -EINVAL;
	}
	if (!rc && o->in_process && (o->cfg.servers || o->sched)) {
		fprintf(stderr, "embstore-bench: --in-process excludes "
				"--servers and --sched\n");
		rc = -EINVAL;
	}
	if (!rc && o->cfg.tier_dir && !o->cfg.mem_limit) {
		fprintf(stderr, "embstore-bench: --tier-dir needs --mem-limit:"
				" the tier holds what the limit leaves out\n");
		rc = -EINVAL;
	}
	/* Which backend: raw ops have their own; otherwise the servers, the
	 * cluster of the environment, or this process. */
	if (!rc && !raw_op(o)) {
		if (o->cfg.servers || o->sched) {
			o->backend = &emb_bench_client_backend;
		} else if (!o->in_process &&
			   (nonempty_env("EMB_SCHED_HOST") ||
			    nonempty_env("MS_SCHED_HOST") ||
			    nonempty_env("EMB_COORDINATOR") ||
			    nonempty_env("PADDLE_PSERVERS_IP_PORT_LIST"))) {
			o->backend = &emb_bench_client_backend;
			o->cfg.from_env = true;
		}
	}
	if (!rc && raw_op(o) && (o->cfg.servers || o->sched)) {
		/* Before, the op ran in this process and the servers went
		 * unused, without a word. */
		fprintf(stderr, "embstore-bench: the raw ops run in this"
				" process, over a plain array: not on"
				" --servers or --sched\n");
		rc = -EINVAL;
	}
#ifdef EMB_BENCH_ROCKSDB
	/* The in-process table is RocksDB's, on the device, in the budget. */
	if (!rc && o->backend == &emb_bench_store_backend) {
		o->backend = &emb_bench_rocks_backend;
		if (!o->cfg.tier_dir) {
			fprintf(stderr, "embstore-bench: RocksDB needs"
					" --tier-dir (where its database goes)"
					" and --mem-limit (its block cache and"
					" memtables)\n");
			rc = -EINVAL;
		} else if (o->cfg.row_format != EMB_ROWFMT_FP32 ||
			   !emb_lifecycle_is_off(&o->cfg.life)) {
			fprintf(stderr, "embstore-bench: RocksDB rows are"
					" fp32, without --admit or --evict\n");
			rc = -EINVAL;
		}
	}
#endif
	if (!rc && (o->cfg.mem_limit || o->cfg.tier_dir) &&
	    (raw_op(o) ||
	     o->backend == &emb_bench_client_backend)) {
		fprintf(stderr, "embstore-bench: --mem-limit and --tier-dir"
				" are for a table in this process (servers"
				" take embstore-server --mem-limit)\n");
		rc = -EINVAL;
	}
	if (!rc && o->token_file && *o->token_file) {
		static uint8_t token[EMB_TOKEN_MAX];

		if (emb_token_read_file(o->token_file, token,
					&o->cfg.auth_token_len)) {
			fprintf(stderr,
				"embstore-bench: cannot use token file %s\n",
				o->token_file);
			rc = -EINVAL;
		}
		o->cfg.auth_token = token;
	}
	if (!rc && o->sched) {
		static char list[65536];
		int err = emb_cluster_servers_auth(o->sched, o->cfg.auth_token,
						   o->cfg.auth_token_len, list,
						   sizeof(list));

		if (err) {
			fprintf(stderr, "embstore-bench: scheduler %s: %s\n",
				o->sched, emb_strerror(err));
			rc = -EINVAL;
		}
		o->cfg.servers = list;
	}
	if (!rc)
		rc = check_cache_opts(o);
	if (!rc && (o->cfg.tables > 1 || o->cfg.multi) &&
	    (o->backend != &emb_bench_client_backend || o->cfg.cache_rows ||
	     o->verify)) {
		fprintf(stderr, "embstore-bench: --tables and --multi need"
				" servers, without --cache or --verify\n");
		rc = -EINVAL;
	}
	if (!rc && o->verify)
		rc = check_verify(o);
	if (!rc && raw_op(o) &&
	    o->cfg.optim.kind != EMB_OPTIM_SGD) {
		fprintf(stderr, "embstore-bench: raw-apply and raw-index-apply"
				" apply plain SGD;"
				" use --optimizer sgd\n");
		rc = -EINVAL;
	}
	if (!rc && o->rowfmt_given && o->cfg.row_format != EMB_ROWFMT_FP32 &&
	    raw_op(o)) {
		/* The raw ops gather fp32 arrays. */
		fprintf(stderr, "embstore-bench: --row-format %s needs a table"
				" (in this process or on servers), not a raw "
				"op\n",
			emb_rowfmt_name(o->cfg.row_format));
		rc = -EINVAL;
	}
	if (!rc && raw_op(o) &&
	    !emb_lifecycle_is_off(&o->cfg.life)) {
		fprintf(stderr, "embstore-bench: --admit and --evict need a"
				" table, not a raw op\n");
		rc = -EINVAL;
	}
	return rc;
}

/*
 * --verify fixes the optimizer and the initializer so that the expected
 * value of a row is exact; ops that do not push, and caches (whose pushes
 * are deferred), have nothing to verify.
 */
static int check_verify(struct opts *o)
{
	const char *why = NULL;

	if (o->op != EMB_BENCH_PUSH && o->op != EMB_BENCH_STEP)
		why = "--op push or step";
	else if (o->optim_given)
		why = "no --optimizer (it uses sgd with lr 0.5)";
	else if (o->cfg.cache_rows)
		why = "no --cache";
	else if (o->cfg.life.admit && o->cfg.preload)
		/* A preload's pulls are sightings of rows not of this
		 * thread's count. */
		why = "--no-preload with --admit";
	else if (o->cfg.life.admit == EMB_ADMIT_BLOOM)
		/* A Bloom filter may admit an id before its N-th sighting. */
		why = "--admit none or count:N";
	else if (o->cfg.life.ttl_steps || o->cfg.life.min_l2 > 0.0f ||
		 o->cfg.life.max_rows)
		why = "no --evict (an evicted row starts over)";
	else if (o->cfg.row_format != EMB_ROWFMT_FP32)
		/* Its sums of 0.5 are exact in fp32 only: bf16 and int8
		 * rows round a hot row's value. */
		why = "--row-format fp32";
	if (why) {
		fprintf(stderr, "embstore-bench: --verify takes %s\n", why);
		return -EINVAL;
	}
	o->cfg.optim = EMB_OPTIM_CFG_DEFAULT;
	o->cfg.optim.kind = EMB_OPTIM_SGD;
	o->cfg.optim.lr = 0.5f;
	o->optim_name = "sgd:lr=0.5";
	o->cfg.init = (struct emb_init_cfg){.kind = EMB_INIT_ZEROS};
	return 0;
}

/* A field of /proc/self/status in kB ("VmRSS", "VmHWM" for the peak), as
 * bytes; 0 if unknown. */
static uint64_t status_bytes(const char *field)
{
	char line[256];
	size_t n = strlen(field);
	uint64_t kb = 0;
	FILE *f;

	f = fopen("/proc/self/status", "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, field, n) && line[n] == ':' &&
		    sscanf(line + n + 1, " %" SCNu64 " kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb * 1024;
}

static uint64_t rss_bytes(void)
{
	return status_bytes("VmRSS");
}

/* Number of distinct ids in ids[0..n), through the worker's set. */
static uint32_t count_unique(struct worker *w, const uint64_t *ids, uint32_t n)
{
	uint32_t uniq = 0;

	/* Slots hold id + 1 so that 0 marks an empty slot. */
	memset(w->set, 0, ((size_t)w->set_mask + 1) * sizeof(*w->set));
	for (uint32_t i = 0; i < n; i++) {
		uint64_t key = ids[i] + 1;
		uint32_t s = (uint32_t)emb_id_hash(ids[i]) & w->set_mask;

		while (w->set[s] && w->set[s] != key)
			s = (s + 1) & w->set_mask;
		if (!w->set[s]) {
			w->set[s] = key;
			uniq++;
		}
	}
	return uniq;
}

/* Backend ids for row indices: feature ids unless the backend is dense. */
static void map_ids(const struct worker *w, uint64_t *ids, uint32_t n)
{
	if (w->be->dense_ids)
		return;
	/*
	 * emb_id_hash() is a bijection, so every row keeps its own id while the
	 * table sees sparse 64-bit ids, as a real job sends.
	 */
	for (uint32_t i = 0; i < n; i++)
		ids[i] = emb_id_hash(ids[i]);
}

static int run_preload(struct worker *w)
{
	uint32_t batch = w->o->cfg.batch;

	for (uint64_t r = w->lo; r < w->hi; r += batch) {
		uint32_t n = (uint32_t)(w->hi - r < batch ? w->hi - r : batch);
		int rc;

		for (uint32_t i = 0; i < n; i++)
			w->ids[i] = r + i;
		map_ids(w, w->ids, n);
		rc = w->be->preload(w->ctx, w->ids, n);
		if (rc)
			return rc;
		atomic_fetch_add_explicit(&w->progress, n,
					  memory_order_relaxed);
	}
	return 0;
}

/* The model's forward and backward pass, as far as the network can tell. */
static void compute(uint32_t us)
{
	uint64_t end;

	if (!us)
		return;
	end = emb_clock_ns() + (uint64_t)us * 1000;
	while (emb_clock_ns() < end)
		;
}

/* Ring slot i (mod k + 1) of the worker's batches. */
static uint64_t *slot(struct worker *w, uint32_t i)
{
	return w->ids + (size_t)(i % (w->k + 1)) * w->o->cfg.batch;
}

/* The next batch of the thread's stream, as backend ids, into ids. */
static void next_batch(struct worker *w, uint64_t *ids)
{
	emb_idgen_fill(&w->gen, ids, w->o->cfg.batch);
	if (w->vcnt) {
		/* Folded into the thread's own rows, skew and all. */
		for (uint32_t i = 0; i < w->o->cfg.batch; i++) {
			ids[i] = w->vlo + ids[i] % w->vlen;
			w->vrows[i] = ids[i];
		}
	}
	map_ids(w, ids, w->o->cfg.batch);
}

/*
 * One batch: pull it, announce the batch k ahead (ahead, already drawn;
 * NULL without prefetch), compute, push; only the pull or the push where
 * the op says so.
 */
static int run_op(struct worker *w, const uint64_t *ids, const uint64_t *ahead,
		  uint32_t n)
{
	bool pull = w->o->op != EMB_BENCH_PUSH, push = w->o->op != EMB_BENCH_PULL;
	int rc = 0;

	if (w->o->op == EMB_BENCH_MIX) {
		/* 53 random bits against the pull share. */
		pull = (double)(emb_splitmix64(&w->mix_rng) >> 11) /
			       9007199254740992.0 <
		       w->o->mix;
		push = !pull;
	}
	if (pull)
		rc = w->be->pull(w->ctx, ids, n, w->out);
	if (!rc && ahead)
		rc = w->be->prefetch(w->ctx, ahead, n);
	if (rc)
		return rc;
	compute(w->o->compute_us);
	if (push)
		rc = w->be->push(w->ctx, ids, n, w->grads);
	return rc;
}

/*
 * --verify: the batch of n rows in w->vrows was pushed and acknowledged.
 * Without admission every push applies; under count:N (a step pulls each
 * batch first, one sighting per distinct row) a row takes its pushes from
 * its N-th batch on, and a push alone (--op push) admits nothing.
 */
static void verify_count(struct worker *w, uint32_t n)
{
	const uint32_t admit_n = w->o->cfg.life.admit == EMB_ADMIT_COUNT
					 ? w->o->cfg.life.admit_n
					 : 0;

	w->vbatch++;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t r = w->vrows[i] - w->vlo;

		w->vcnt[r]++;
		if (admit_n && w->o->op == EMB_BENCH_STEP &&
		    w->vlast[r] != w->vbatch) {
			w->vlast[r] = w->vbatch;
			w->vseen[r]++;
		}
		if (!admit_n || w->vseen[r] >= admit_n)
			w->vsum[r] += (int32_t)w->vsign;
	}
}

/*
 * Whether path exists, looked for at most every STOP_CHECK_NS (*next_ns
 * is when next), so a run pays one access() a tenth of a second, not one
 * a batch. NULL: never.
 */
#define STOP_CHECK_NS 100000000ull
static bool file_seen(const char *path, uint64_t *next_ns)
{
	uint64_t now;

	if (!path)
		return false;
	now = emb_clock_ns();
	if (now < *next_ns)
		return false;
	*next_ns = now + STOP_CHECK_NS;
	return access(path, F_OK) == 0;
}

/* --stop-file: true once the file exists. */
static bool stop_asked(struct worker *w)
{
	return file_seen(w->o->stop_file, &w->stop_check_ns);
}

/*
 * --pause-file: while the file exists, wait here (a look every
 * STOP_CHECK_NS) instead of running a batch; the deadline and the stop
 * file still end the run. What a job does with its training paused is
 * measured so (tools/bench-elastic.sh --paused: a move alone).
 */
static bool pause_asked(struct worker *w)
{
	const struct timespec nap = {0, (long)STOP_CHECK_NS};

	if (!file_seen(w->o->pause_file, &w->pause_check_ns))
		return false;
	nanosleep(&nap, NULL);
	return true;
}

static int run_batches(struct worker *w, bool timed)
{
	uint32_t n = w->o->cfg.batch;
	uint64_t done = 0;
	int rc;

	/* Fill the prefetch queue once; it carries over from warmup. */
	for (; !w->primed && w->head < w->k; w->head++) {
		next_batch(w, slot(w, w->head));
		rc = w->be->prefetch(w->ctx, slot(w, w->head), n);
		if (rc)
			return rc;
	}
	if (!w->primed)
		w->head = 0;
	w->primed = true;
	for (;;) {
		uint64_t *ids = slot(w, w->head), *ahead = NULL;
		uint64_t t0, t1;

		if (timed && w->max_batches) {
			if (done == w->max_batches)
				return 0;
		} else if (emb_clock_ns() >= w->deadline_ns) {
			return 0;
		}
		if (stop_asked(w))
			return 0;
		if (pause_asked(w))
			continue;
		if (w->k) {
			/* The slot of the batch before this one is free. */
			ahead = slot(w, w->head + w->k);
			next_batch(w, ahead);
		} else {
			next_batch(w, ids);
		}
		if (timed)
			w->unique_sum += count_unique(w, ids, n);

		if (w->vcnt) {
			size_t floats = (size_t)n * w->o->cfg.dim;

			w->vsign = -w->vsign;
			for (size_t i = 0; i < floats; i++)
				w->grads[i] = w->vsign;
		}
		t0 = emb_clock_ns();
		rc = run_op(w, ids, ahead, n);
		t1 = emb_clock_ns();
		w->head = (w->head + 1) % (w->k + 1);
		if (rc)
			return rc;
		if (w->vcnt)
			verify_count(w, n);
		done++;
		atomic_fetch_add_explicit(&w->progress, n,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(&w->progress_ns, t1 - t0,
					  memory_order_relaxed);
		if (!timed)
			continue;
		emb_hist_record(&w->hist, t1 - t0);
		if (w->o->report_s > 0) {
			pthread_mutex_lock(&w->ilock);
			emb_hist_record(&w->ihist, t1 - t0);
			pthread_mutex_unlock(&w->ilock);
		}
		w->busy_ns += t1 - t0;
		w->batches_done++;
		w->rows_done += n;
	}
}

/* CPU time of the calling thread, user and system, in ns. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	switch (w->phase) {
	case PHASE_PRELOAD: {
		uint64_t c0 = thread_cpu_ns();

		w->rc = run_preload(w);
		w->cpu_ns = thread_cpu_ns() - c0;
		break;
	}
	case PHASE_WARMUP:
		w->rc = run_batches(w, false);
		break;
	case PHASE_MEASURE:
		w->rc = run_batches(w, true);
		break;
	}
	w->end_ns = emb_clock_ns();
	return NULL;
}

static void worker_fini(struct worker *w)
{
	if (w->ctx)
		w->be->thread_close(w->ctx);
	free(w->ids);
	free(w->out);
	free(w->grads);
	free(w->set);
	free(w->vcnt);
	free(w->vsum);
	free(w->vseen);
	free(w->vlast);
	free(w->vrows);
	pthread_mutex_destroy(&w->ilock);
}

static int worker_init(struct worker *w, const struct opts *o, void *be,
		       uint32_t idx)
{
	size_t floats = (size_t)o->cfg.batch * o->cfg.dim;
	uint64_t rng = emb_id_hash(o->cfg.seed + idx);
	uint32_t slots = 2;
	int rc;

	memset(w, 0, sizeof(*w));
	w->idx = idx;
	w->o = o;
	w->be = o->backend;
	w->k = o->backend->prefetch && o->cfg.cache_rows ? o->cfg.prefetch : 0;
	w->mix_rng = emb_id_hash(o->cfg.seed * 31 + idx + 7);
	emb_hist_reset(&w->hist);
	emb_hist_reset(&w->ihist);
	pthread_mutex_init(&w->ilock, NULL);
	rc = emb_idgen_init(&w->gen, &o->dist, o->cfg.rows, o->cfg.seed, idx);
	if (rc)
		return rc;
	while (slots < 2 * o->cfg.batch)
		slots <<= 1;
	w->set_mask = slots - 1;
	w->ids = malloc((size_t)(w->k + 1) * o->cfg.batch * sizeof(*w->ids));
	w->out = malloc(floats * sizeof(float));
	w->grads = malloc(floats * sizeof(float));
	w->set = malloc((size_t)slots * sizeof(*w->set));
	if (!w->ids || !w->out || !w->grads || !w->set) {
		rc = -ENOMEM;
		goto err_fini;
	}
	/* Small gradients in [-1e-3, 1e-3] keep weights finite for any run;
	 * --verify's are +-1 (set per batch), so that every sum is exact. */
	for (size_t i = 0; i < floats; i++)
		w->grads[i] = o->verify ? 1.0f
					: (float)((int)(emb_splitmix64(&rng) %
							2001) -
						  1000) * 1e-6f;
	rc = w->be->thread_open(be, idx, &w->ctx);
	if (rc) {
		w->ctx = NULL;
		goto err_fini;
	}
	return 0;

err_fini:
	worker_fini(w);
	return rc;
}

static uint64_t progress_sum(struct worker *ws, uint32_t n)
{
	uint64_t s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += atomic_load_explicit(&ws[i].progress,
					  memory_order_relaxed);
	return s;
}

/*
 * Rows per second so far as the result counts them: per thread, rows over
 * time inside backend calls, summed. 0 when no thread has timed a call
 * (preload, which is timed by the wall clock).
 */
static double progress_rate(struct worker *ws, uint32_t n)
{
	double r = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t rows =
		    atomic_load_explicit(&ws[i].progress, memory_order_relaxed);
		uint64_t ns = atomic_load_explicit(&ws[i].progress_ns,
						   memory_order_relaxed);

		if (ns)
			r += (double)rows * 1e9 / (double)ns;
	}
	return r;
}

/*
 * --report-interval: merges and empties every thread's interval histogram
 * and writes one line for the interval that ends at at_s seconds into the
 * timed run: batches done in it (0 is a stall: no call returned) and their
 * latency p50, p99 and max in us. A watcher (tests/chaos) reads these to
 * see latency before and during faults, so the format is fixed.
 */
static void report_interval(struct worker *ws, uint32_t n, double at_s,
			    bool tty)
{
	struct emb_hist h;

	emb_hist_reset(&h);
	for (uint32_t i = 0; i < n; i++) {
		pthread_mutex_lock(&ws[i].ilock);
		emb_hist_merge(&h, &ws[i].ihist);
		emb_hist_reset(&ws[i].ihist);
		pthread_mutex_unlock(&ws[i].ilock);
	}
	fprintf(stderr,
		"%sinterval: %.3f s, %" PRIu64 " batches, p50 %.1f us, "
		"p99 %.1f us, max %.1f us\n",
		tty ? "\r\033[K" : "", at_s, h.count,
		(double)emb_hist_percentile(&h, 50) / 1e3,
		(double)emb_hist_percentile(&h, 99) / 1e3,
		(double)(h.count ? h.max : 0) / 1e3);
}

/*
 * Runs one phase on every worker and waits for them. With a terminal on
 * stderr it redraws one progress line meanwhile: rows so far, rate, time
 * elapsed and left (estimated from expected rows when there is no clock).
 * Sets *wall_s to the time until the last worker finished. Returns the
 * first worker error, or 0.
 */
static int run_phase(struct worker *ws, const struct opts *o, enum phase ph,
		     const char *label, uint64_t expect_rows, double limit_s,
		     double *wall_s)
{
	uint32_t n = o->cfg.threads, started = 0;
	bool tty = isatty(STDERR_FILENO);
	bool lines = ph == PHASE_MEASURE && o->report_s > 0;
	uint64_t t0 = emb_clock_ns(), end = t0;
	uint64_t every_ns = (uint64_t)(o->report_s * 1e9);
	uint64_t next_line = t0 + every_ns, last_line = t0;
	char tname[16];
	int rc = 0;

	for (uint32_t i = 0; i < n; i++) {
		ws[i].phase = ph;
		ws[i].joined = false;
		ws[i].deadline_ns = t0 + (uint64_t)(limit_s * 1e9);
		atomic_store(&ws[i].progress, 0);
		atomic_store(&ws[i].progress_ns, 0);
		rc = -pthread_create(&ws[i].tid, NULL, worker_main, &ws[i]);
		if (rc)
			break;
		snprintf(tname, sizeof(tname), "bench-w%u",
			 (unsigned)(uint16_t)i);
		pthread_setname_np(ws[i].tid, tname);
		started++;
	}
	while ((tty || lines) && !rc) {
		struct timespec nap = {0, PROGRESS_NS};
		uint64_t rows = progress_sum(ws, n);
		double el = (double)(emb_clock_ns() - t0) / 1e9, left, rate;
		bool done = true;

		for (uint32_t i = 0; i < n; i++) {
			if (ws[i].joined)
				continue;
			if (pthread_tryjoin_np(ws[i].tid, NULL) == EBUSY)
				done = false;
			else
				ws[i].joined = true;
		}
		if (done)
			break;
		if (lines && emb_clock_ns() >= next_line) {
			report_interval(ws, n, (double)(next_line - t0) / 1e9,
					tty);
			last_line = next_line;
			next_line += every_ns;
		}
		/* the first draw waits for a rate worth showing */
		if (tty && el >= PROGRESS_NS / 1e9) {
			if (expect_rows && rows)
				left = el * (double)(expect_rows - rows) /
				       (double)rows;
			else
				left = limit_s - el;
			/* The same rate the result reports: time in the
			 * backend, id drawing left out; preload counts the
			 * wall clock, as its result does. */
			rate = progress_rate(ws, n);
			fprintf(stderr,
				"\r\033[K%s: %.2f M rows/s (%s), %.1f s "
				"elapsed, %.1f s left",
				label,
				(rate > 0 ? rate : (double)rows / el) / 1e6,
				rate > 0 ? "backend time" : "wall clock", el,
				left > 0 ? left : 0.0);
		}
		nanosleep(&nap, NULL);
	}
	if (tty)
		fputs("\r\033[K", stderr);
	for (uint32_t i = 0; i < started; i++) {
		if (!ws[i].joined)
			pthread_join(ws[i].tid, NULL);
		if (!rc && ws[i].rc)
			rc = ws[i].rc;
		if (ws[i].end_ns > end)
			end = ws[i].end_ns;
	}
	/*
	 * The last, shorter interval: the threads are joined. It ends where
	 * the run did, but never before the line printed last: a worker may
	 * finish just before a boundary whose line the loop prints before it
	 * sees the worker gone, and a reader takes the lines' times as
	 * ordered (a run that ends on a boundary gives two lines with one
	 * time; the batches still add up).
	 */
	if (lines && started == n) {
		bool any = false;

		for (uint32_t i = 0; i < n; i++)
			any |= ws[i].ihist.count > 0;
		if (any)
			report_interval(ws, n,
					(double)((end > last_line ? end
								  : last_line) -
						 t0) / 1e9,
					tty);
	}
	*wall_s = (double)(end - t0) / 1e9;
	return rc;
}

/* Writes s as a JSON string literal. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

struct result {
	double preload_s;		/* wall time of the preload phase */
	uint64_t preload_rows;		/* rows this process preloaded: its
					   share of a job's */
	double preload_cpu_s;		/* its threads' CPU time, summed */
	double measure_s;		/* wall time of the timed phase */
	uint64_t batches;		/* timed batches, all threads */
	uint64_t rows;			/* ids in them */
	double rows_per_s;		/* sum of per-thread rows / busy time */
	double mb_per_s;		/* row payload moved, 10^6 bytes/s */
	double unique_per_batch;	/* mean distinct ids per batch */
	struct emb_bench_mem mem;	/* backend table memory after preload */
	uint64_t rss;			/* VmRSS after preload (or after
					   timing without one), bytes */
	uint64_t rss_peak;		/* VmHWM at the end, bytes */
	struct emb_bench_mem mem_start; /* the tier's counters as the timed
					   phase starts, and at its end */
	struct emb_bench_mem mem_end;
	struct emb_hist hist;		/* all threads' batch latencies */
	bool has_net;			/* net filled in by the backend */
	struct emb_bench_report net;	/* timed phase only */
};

/* What the backend moved during the timed phase: after - before. */
static void report_diff(const struct emb_bench_report *a,
			const struct emb_bench_report *b,
			struct emb_bench_report *out)
{
	*out = *b;
	out->hits -= a->hits;
	out->misses -= a->misses;
	out->bytes_fetched -= a->bytes_fetched;
	out->bytes_written -= a->bytes_written;
	out->wire_bytes_in -= a->wire_bytes_in;
	out->wire_bytes_out -= a->wire_bytes_out;
	out->rows_read -= a->rows_read;
	out->rows_fallback -= a->rows_fallback;
	out->stalls -= a->stalls;
	out->wait_ns -= a->wait_ns;
}

static double hit_ratio(const struct emb_bench_report *n)
{
	return n->hits + n->misses
		       ? (double)n->hits / (double)(n->hits + n->misses)
		       : 0.0;
}

/* Per timed batch, all threads together. */
static double per_batch(const struct result *r, uint64_t v)
{
	return r->batches ? (double)v / (double)r->batches : 0.0;
}

/* Bytes of the table's memory per row it holds; 0 when it holds none. */
static double bytes_per_row(const struct emb_bench_mem *m, uint64_t bytes)
{
	return m->rows ? (double)bytes / (double)m->rows : 0.0;
}

/* What the table holds besides its slabs and index. */
static uint64_t fixed_bytes(const struct emb_bench_mem *m)
{
	uint64_t parts = m->slab_bytes + m->index_bytes;

	return m->bytes > parts ? m->bytes - parts : 0;
}

static void print_summary(FILE *f, const struct opts *o,
			  const struct result *r)
{
	const struct emb_hist *h = &r->hist;

	fprintf(f,
		"embstore-bench: %s on %s table \"%s\": %" PRIu64
		" rows x %u floats (%s), batch %u, %s, %u thread%s, %s\n",
		o->op_name, o->backend->name, o->cfg.table, o->cfg.rows,
		o->cfg.dim, emb_rowfmt_name(o->cfg.row_format), o->cfg.batch,
		o->dist_name, o->cfg.threads, o->cfg.threads == 1 ? "" : "s",
		emb_optim_name(o->cfg.optim.kind));
	if (o->cfg.tables > 1)
		fprintf(f, "  tables   %u per batch, %s\n", o->cfg.tables,
			o->cfg.multi ? "one pull_many + push_many call"
				     : "one call per table");
	fprintf(f,
		"  preload  %" PRIu64 " rows in %.2f s = %.2f M rows/s"
		" (%.2f M per CPU second)\n",
		r->preload_rows, r->preload_s,
		r->preload_s > 0 ? (double)r->preload_rows / r->preload_s / 1e6
				 : 0.0,
		r->preload_cpu_s > 0
		    ? (double)r->preload_rows / r->preload_cpu_s / 1e6
		    : 0.0);
	fprintf(f,
		"  timed    %" PRIu64 " batches, %.2f M rows in %.2f s\n",
		r->batches, (double)r->rows / 1e6, r->measure_s);
	fprintf(f, "  rate     %.2f M rows/s, %.0f MB/s, %.0f distinct ids"
		   "/batch\n",
		r->rows_per_s / 1e6, r->mb_per_s, r->unique_per_batch);
	fprintf(f,
		"  latency  p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f"
		" us\n",
		(double)emb_hist_percentile(h, 50) / 1e3,
		(double)emb_hist_percentile(h, 90) / 1e3,
		(double)emb_hist_percentile(h, 99) / 1e3,
		(double)h->max / 1e3);
	fprintf(f,
		"  memory   table %.1f B/row (record %" PRIu64 " B, slabs %.1f,"
		" index %.1f, fixed %.1f), RSS %.1f MiB = %.1f B/row\n",
		bytes_per_row(&r->mem, r->mem.bytes), r->mem.record_bytes,
		bytes_per_row(&r->mem, r->mem.slab_bytes),
		bytes_per_row(&r->mem, r->mem.index_bytes),
		bytes_per_row(&r->mem, fixed_bytes(&r->mem)),
		(double)r->rss / 1048576.0,
		(double)r->rss / (double)o->cfg.rows);
	if (!emb_lifecycle_is_off(&o->cfg.life) || !o->cfg.preload) {
		char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];

		emb_admit_format(&o->cfg.life, a, sizeof(a));
		emb_evict_format(&o->cfg.life, e, sizeof(e));
		fprintf(f,
			"  rows     admit %s, evict %s: %" PRIu64
			" rows held, %" PRIu64 " created, %" PRIu64
			" evicted; filter %.1f MiB; not admitted: %" PRIu64
			" pulled, %" PRIu64 " pushed ids\n",
			a, e, r->mem.rows, r->mem.rows_created,
			r->mem.rows_evicted,
			(double)r->mem.filter_bytes / 1048576.0,
			r->mem.pulls_unadmitted, r->mem.pushes_unadmitted);
	}
	if (o->cfg.tier_dir) {
		const struct emb_bench_mem *a = &r->mem_start, *b = &r->mem_end;
		double s = r->measure_s > 0 ? r->measure_s : 1;

		fprintf(f,
			"  tier     %" PRIu64 " of %" PRIu64
			" rows on the device, file %.1f MiB; timed: %.0f"
			" reads/s (%.1f MB/s), %.0f writes/s, %.1f us"
			" waiting on reads per batch; peak RSS %.1f MiB\n",
			b->rows_cold, b->rows,
			(double)b->tier_file_bytes / 1048576.0,
			(double)(b->tier_reads - a->tier_reads) / s,
			(double)(b->tier_reads - a->tier_reads) * 4096 / s /
			    1e6,
			(double)(b->tier_writes - a->tier_writes) / s,
			r->batches ? (double)(b->tier_read_ns -
					      a->tier_read_ns) /
					 1e3 / (double)r->batches
				   : 0.0,
			(double)r->rss_peak / 1048576.0);
	}
	if (!r->has_net)
		return;
	fprintf(f,
		"  network  per batch: %.0f KB fetched, %.0f KB written,"
		" wire %.0f KB in / %.0f KB out\n",
		per_batch(r, r->net.bytes_fetched) / 1e3,
		per_batch(r, r->net.bytes_written) / 1e3,
		per_batch(r, r->net.wire_bytes_in) / 1e3,
		per_batch(r, r->net.wire_bytes_out) / 1e3);
	if (o->cfg.pull_mode == EMB_PULL_ONESIDED)
		fprintf(f,
			"  one-sided  %" PRIu64 " rows READ, %" PRIu64
			" pulled two-sided\n",
			r->net.rows_read, r->net.rows_fallback);
	if (r->net.cached)
		fprintf(f,
			"  cache    %u rows, %s, %s, prefetch %u: hit ratio %.3f,"
			" %.0f%% of lookups stalled, %.1f us waited per batch\n",
			o->cfg.cache_rows, o->cache_mode_name,
			o->cache_policy_name, o->cfg.prefetch,
			hit_ratio(&r->net),
			r->batches ? 100.0 * (double)r->net.stalls /
					     (double)r->batches
				   : 0.0,
			per_batch(r, r->net.wait_ns) / 1e3);
}

static void print_json(FILE *f, const struct opts *o, const struct result *r)
{
	const struct emb_hist *h = &r->hist;

	fputs("{\"op\":", f);
	json_str(f, o->op_name);
	fputs(",\"backend\":", f);
	json_str(f, o->backend->name);
	fputs(",\"transport\":", f);
	json_str(f, o->transport_name);
	fputs(",\"dist\":", f);
	json_str(f, o->dist_name);
	fputs(",\"table\":", f);
	json_str(f, o->cfg.table);
	fputs(",\"optimizer\":", f);
	json_str(f, emb_optim_name(o->cfg.optim.kind));
	fputs(",\"row_format\":", f);
	json_str(f, emb_rowfmt_name(o->cfg.row_format));
	fputs(",\"simd\":", f);
	json_str(f, o->simd);
	fprintf(f, ",\"tables\":%u,\"multi\":%s", o->cfg.tables,
		o->cfg.multi ? "true" : "false");
	fprintf(f,
		",\"rows\":%" PRIu64 ",\"dim\":%u,\"batch\":%u,\"threads\":%u"
		",\"seed\":%" PRIu64 ",\"batches\":%" PRIu64
		",\"elapsed_s\":%.3f,\"rows_per_s\":%.0f,\"mb_per_s\":%.1f"
		",\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f"
		",\"max_us\":%.1f,\"mean_us\":%.1f,\"unique_per_batch\":%.1f"
		",\"preload_rows_per_s\":%.0f,\"preload_cpu_rows_per_s\":%.0f"
		",\"bytes_per_row\":%.1f"
		",\"rss_bytes\":%" PRIu64 ",\"rss_bytes_per_row\":%.1f",
		o->cfg.rows, o->cfg.dim, o->cfg.batch, o->cfg.threads,
		o->cfg.seed, r->batches, r->measure_s, r->rows_per_s,
		r->mb_per_s, (double)emb_hist_percentile(h, 50) / 1e3,
		(double)emb_hist_percentile(h, 90) / 1e3,
		(double)emb_hist_percentile(h, 99) / 1e3,
		(double)h->max / 1e3, emb_hist_mean(h) / 1e3,
		r->unique_per_batch,
		r->preload_s > 0 ? (double)r->preload_rows / r->preload_s
				 : 0.0,
		r->preload_cpu_s > 0
		    ? (double)r->preload_rows / r->preload_cpu_s
		    : 0.0,
		bytes_per_row(&r->mem, r->mem.bytes), r->rss,
		(double)r->rss / (double)o->cfg.rows);
	fprintf(f,
		",\"record_bytes\":%" PRIu64 ",\"slab_bytes_per_row\":%.1f"
		",\"index_bytes_per_row\":%.1f,\"fixed_bytes\":%" PRIu64,
		r->mem.record_bytes, bytes_per_row(&r->mem, r->mem.slab_bytes),
		bytes_per_row(&r->mem, r->mem.index_bytes),
		fixed_bytes(&r->mem));
	fprintf(f, ",\"rss_peak_bytes\":%" PRIu64, r->rss_peak);
	if (o->cfg.tier_dir)
		fprintf(f,
			",\"mem_limit\":%" PRIu64 ",\"rows_cold\":%" PRIu64
			",\"tier_file_bytes\":%" PRIu64
			",\"tier_reads\":%" PRIu64 ",\"tier_writes\":%" PRIu64
			",\"tier_read_ns\":%" PRIu64,
			o->cfg.mem_limit, r->mem_end.rows_cold,
			r->mem_end.tier_file_bytes,
			r->mem_end.tier_reads - r->mem_start.tier_reads,
			r->mem_end.tier_writes - r->mem_start.tier_writes,
			r->mem_end.tier_read_ns - r->mem_start.tier_read_ns);
	{
		char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];

		emb_admit_format(&o->cfg.life, a, sizeof(a));
		emb_evict_format(&o->cfg.life, e, sizeof(e));
		fputs(",\"admit\":", f);
		json_str(f, a);
		fputs(",\"evict\":", f);
		json_str(f, e);
		fprintf(f,
			",\"rows_held\":%" PRIu64 ",\"table_bytes\":%" PRIu64
			",\"rows_created\":%" PRIu64
			",\"rows_evicted\":%" PRIu64
			",\"filter_bytes\":%" PRIu64
			",\"pulls_unadmitted\":%" PRIu64
			",\"pushes_unadmitted\":%" PRIu64,
			r->mem.rows, r->mem.bytes, r->mem.rows_created,
			r->mem.rows_evicted, r->mem.filter_bytes,
			r->mem.pulls_unadmitted, r->mem.pushes_unadmitted);
	}
	if (r->has_net) {
		fputs(",\"cache_mode\":", f);
		json_str(f, r->net.cached ? o->cache_mode_name : "none");
		fputs(",\"cache_policy\":", f);
		json_str(f, r->net.cached ? o->cache_policy_name : "none");
		fprintf(f,
			",\"cache_rows\":%u,\"prefetch\":%u,\"staleness\":%u"
			",\"compute_us\":%u,\"cache_hit_ratio\":%.4f"
			",\"bytes_fetched\":%" PRIu64
			",\"bytes_written\":%" PRIu64
			",\"bytes_fetched_per_batch\":%.0f"
			",\"bytes_written_per_batch\":%.0f"
			",\"wire_bytes_in\":%" PRIu64
			",\"wire_bytes_out\":%" PRIu64
			",\"stalls\":%" PRIu64 ",\"wait_us_per_batch\":%.1f"
			",\"pull_mode\":\"%s\",\"rows_read\":%" PRIu64
			",\"rows_fallback\":%" PRIu64,
			o->cfg.cache_rows, o->cfg.prefetch, o->cfg.staleness,
			o->compute_us, hit_ratio(&r->net), r->net.bytes_fetched,
			r->net.bytes_written,
			per_batch(r, r->net.bytes_fetched),
			per_batch(r, r->net.bytes_written),
			r->net.wire_bytes_in, r->net.wire_bytes_out,
			r->net.stalls, per_batch(r, r->net.wait_ns) / 1e3,
			o->cfg.pull_mode == EMB_PULL_ONESIDED ? "onesided"
							      : "twosided",
			r->net.rows_read, r->net.rows_fallback);
	}
	fputs("}\n", f);
}

/*
 * --verify: gives thread idx of worker process rank (of nworkers) its own
 * rows of the table. 0 or -ENOMEM, or -EINVAL when there are fewer rows
 * than threads in the whole job.
 */
static int verify_init(struct worker *w, const struct opts *o, uint32_t rank,
		       uint32_t nworkers)
{
	uint64_t parts = (uint64_t)nworkers * o->cfg.threads;
	uint64_t k = (uint64_t)rank * o->cfg.threads + w->idx;

	w->vlo = o->cfg.rows * k / parts;
	w->vlen = o->cfg.rows * (k + 1) / parts - w->vlo;
	if (w->vlen == 0)
		return -EINVAL;
	w->vcnt = calloc(w->vlen, sizeof(*w->vcnt));
	w->vsum = calloc(w->vlen, sizeof(*w->vsum));
	w->vseen = calloc(w->vlen, sizeof(*w->vseen));
	w->vlast = calloc(w->vlen, sizeof(*w->vlast));
	w->vrows = malloc((size_t)o->cfg.batch * sizeof(*w->vrows));
	w->vsign = 1.0f;
	return w->vcnt && w->vsum && w->vseen && w->vlast && w->vrows
		   ? 0
		   : -ENOMEM;
}

/*
 * --verify: pulls every row a thread pushed to and compares each element
 * with -0.5 times the sum of its acknowledged gradients. Rows checked and mismatched
 * go to *checked and *bad; 0, or the first pull error.
 */
static int verify_rows(struct worker *w, uint64_t *checked, uint64_t *bad)
{
	uint32_t batch = w->o->cfg.batch, dim = w->o->cfg.dim, n = 0;
	uint64_t *rows = w->vrows;
	int rc;

	for (uint64_t r = 0; r <= w->vlen; r++) {
		if (r < w->vlen && w->vcnt[r])
			rows[n++] = w->vlo + r;
		if (n < batch && (r < w->vlen || n == 0))
			continue;
		memcpy(w->ids, rows, (size_t)n * sizeof(*w->ids));
		map_ids(w, w->ids, n);
		rc = w->be->peek ? w->be->peek(w->ctx, w->ids, n, w->out)
				 : w->be->pull(w->ctx, w->ids, n, w->out);
		if (rc)
			return rc;
		for (uint32_t i = 0; i < n; i++) {
			float want = -0.5f * (float)w->vsum[rows[i] - w->vlo];
			const float *got = w->out + (size_t)i * dim;
			uint32_t j = 0;

			while (j < dim && got[j] == want)
				j++;
			if (j < dim && *bad < 5)
				fprintf(stderr,
					"verify: row %" PRIu64 " element %u:"
					" %g, want %g (%u pushes)\n",
					rows[i], j, (double)got[j],
					(double)want,
					w->vcnt[rows[i] - w->vlo]);
			*bad += j < dim;
		}
		*checked += n;
		n = 0;
	}
	return 0;
}

static void collect(const struct opts *o, struct worker *ws, struct result *r)
{
	double payload = (double)o->cfg.dim * sizeof(float);

	emb_hist_reset(&r->hist);
	for (uint32_t i = 0; i < o->cfg.threads; i++) {
		struct worker *w = &ws[i];

		emb_hist_merge(&r->hist, &w->hist);
		r->batches += w->batches_done;
		r->rows += w->rows_done;
		if (w->busy_ns)
			r->rows_per_s += (double)w->rows_done * 1e9 /
					 (double)w->busy_ns;
		r->unique_per_batch += (double)w->unique_sum;
	}
	if (r->batches)
		r->unique_per_batch /= (double)r->batches;
	/* step moves each row twice: weights out, gradients in */
	if (o->op == EMB_BENCH_STEP)
		payload *= 2;
	r->mb_per_s = r->rows_per_s * payload / 1e6;
}

int main(int argc, char **argv)
{
	struct emb_bench_report net0 = {0}, net1 = {0};
	struct result *r = NULL;
	struct worker *ws = NULL;
	uint32_t nready = 0, rank = 0, nworkers = 1;
	uint64_t plo, phi;
	double warmup_s;
	struct opts o;
	void *be;
	int rc;

	if (parse_args(argc, argv, &o))
		return 2;
	rc = o.backend->open(&o.cfg, &be);
	if (rc) {
		fprintf(stderr, "embstore-bench: open %s backend: %s\n",
			o.backend->name, emb_strerror(rc));
		return 1;
	}
	o.transport_name = o.backend->transport ? o.backend->transport(be)
						 : "in-process";
	ws = calloc(o.cfg.threads, sizeof(*ws));
	r = calloc(1, sizeof(*r));
	if (!ws || !r) {
		rc = -ENOMEM;
		goto out;
	}
	if (o.backend->rank)
		o.backend->rank(be, &rank, &nworkers);
	/* The worker's share of the rows to preload: in a job of W workers
	 * each creates rows / W of them, so that the table is made once.
	 * Each preloading all of them made the job's preload W times the
	 * table: at 450 workers of a 45,000-row table, 20 million pulls,
	 * which this machine's 2 cores did not get through in 5 minutes. */
	plo = o.cfg.rows * rank / nworkers;
	phi = o.cfg.rows * (rank + 1) / nworkers;
	for (; nready < o.cfg.threads; nready++) {
		rc = worker_init(&ws[nready], &o, be, nready);
		if (rc)
			goto out;
		ws[nready].lo = plo + (phi - plo) * nready / o.cfg.threads;
		ws[nready].hi = plo + (phi - plo) * (nready + 1) / o.cfg.threads;
		ws[nready].max_batches = o.batches;
	}
	for (uint32_t i = 0; o.verify && i < nready && !rc; i++)
		rc = verify_init(&ws[i], &o, rank, nworkers);
	if (rc)
		goto out;

	r->preload_rows = phi - plo;
	rc = run_phase(ws, &o, PHASE_PRELOAD, "preload", phi - plo, 0,
		       &r->preload_s);
	if (rc)
		goto out;
	for (uint32_t i = 0; i < nready; i++)
		r->preload_cpu_s += (double)ws[i].cpu_ns / 1e9;
	if (o.backend->settle) {
		rc = o.backend->settle(be);
		if (rc)
			goto out;
	}
	r->rss = rss_bytes();
	rc = o.backend->mem(be, &r->mem);
	if (rc)
		goto out;

	if (o.warmup_s > 0) {
		rc = run_phase(ws, &o, PHASE_WARMUP, "warmup", 0, o.warmup_s,
			       &warmup_s);
		if (rc)
			goto out;
	}
	if (o.backend->report)
		o.backend->report(be, &net0);
	if (o.cfg.tier_dir) {
		rc = o.backend->mem(be, &r->mem_start);
		if (rc)
			goto out;
	}
	rc = run_phase(ws, &o, PHASE_MEASURE, o.op_name,
		       o.batches ? o.batches * o.cfg.batch * o.cfg.threads : 0,
		       o.duration_s, &r->measure_s);
	if (rc)
		goto out;
	collect(&o, ws, r);
	r->rss_peak = status_bytes("VmHWM");
	if (o.cfg.tier_dir) {
		rc = o.backend->mem(be, &r->mem_end);
		if (rc)
			goto out;
	}
	/* Without a preload the table filled up while timing. */
	if (!o.cfg.preload) {
		r->rss = rss_bytes();
		rc = o.backend->mem(be, &r->mem);
		if (rc)
			goto out;
	}
	if (o.backend->report) {
		o.backend->report(be, &net1);
		report_diff(&net0, &net1, &r->net);
		r->has_net = true;
	}

	print_summary(o.json ? stderr : stdout, &o, r);
	if (o.json)
		print_json(stdout, &o, r);
	if (o.verify) {
		uint64_t checked = 0, bad = 0;

		for (uint32_t i = 0; i < nready && !rc; i++)
			rc = verify_rows(&ws[i], &checked, &bad);
		if (rc)
			goto out;
		fprintf(o.json ? stderr : stdout,
			"verify: %" PRIu64 " rows checked, %" PRIu64
			" mismatched\n",
			checked, bad);
		if (bad)
			rc = EMB_EINTERNAL;
	}
	fflush(stdout);
out:
	if (rc)
		fprintf(stderr, "embstore-bench: %s failed: %s\n", o.op_name,
			emb_strerror(rc));
	for (uint32_t i = 0; i < nready; i++)
		worker_fini(&ws[i]);
	free(ws);
	free(r);
	o.backend->close(be);
	return rc ? 1 : 0;
}
