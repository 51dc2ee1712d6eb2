/*
 * tests/tools/test_bench.c - runs the built embstore-bench (path in
 * $EMB_BENCH) on tiny tables and checks what scripts rely on: exit status,
 * and one parseable JSON object on stdout with the documented keys.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define TINY "--rows 5000 --dim 16 --batch 128 --batches 20 "

struct jfield {
	char key[48];	/* top-level key */
	bool is_num;	/* value is a number */
	double num;	/* its value */
	char str[64];	/* string value, truncated */
};

struct jobj {
	struct jfield f[64];
	int n;
};

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* p at '"'; copies the unescaped-enough text to out. NULL if malformed. */
static const char *scan_string(const char *p, char *out, size_t cap)
{
	size_t n = 0;

	if (*p++ != '"')
		return NULL;
	while (*p && *p != '"') {
		if ((unsigned char)*p < 0x20)
			return NULL;
		if (*p == '\\') {
			p++;
			if (*p == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!isxdigit((unsigned char)p[i]))
						return NULL;
				p += 4;
			} else if (!strchr("\"\\/bfnrt", *p) || !*p) {
				return NULL;
			}
		}
		if (out && n + 1 < cap)
			out[n++] = *p;
		p++;
	}
	if (out)
		out[n] = '\0';
	return *p == '"' ? p + 1 : NULL;
}

static const char *scan_number(const char *p, double *v)
{
	char *end;

	if (*p != '-' && !isdigit((unsigned char)*p))
		return NULL;
	*v = strtod(p, &end);
	/* JSON has no inf, nan, hex or leading '+' */
	for (const char *q = p; q < end; q++)
		if (!strchr("-+.eE0123456789", *q))
			return NULL;
	return end;
}

static const char *scan_value(const char *p, int depth, struct jfield *f);

static const char *scan_container(const char *p, int depth, struct jobj *o)
{
	char close = *p == '{' ? '}' : ']';
	bool obj = *p == '{';

	if (depth > 16)
		return NULL;
	p = skip_ws(p + 1);
	if (*p == close)
		return p + 1;
	for (;;) {
		struct jfield scratch, *f = &scratch;

		if (obj) {
			if (o && o->n < 64)
				f = &o->f[o->n++];
			p = scan_string(skip_ws(p), f->key, sizeof(f->key));
			if (!p)
				return NULL;
			p = skip_ws(p);
			if (*p++ != ':')
				return NULL;
		}
		p = scan_value(skip_ws(p), depth + 1, f);
		if (!p)
			return NULL;
		p = skip_ws(p);
		if (*p == close)
			return p + 1;
		if (*p++ != ',')
			return NULL;
	}
}

static const char *scan_value(const char *p, int depth, struct jfield *f)
{
	f->is_num = false;
	f->str[0] = '\0';
	if (*p == '"')
		return scan_string(p, f->str, sizeof(f->str));
	if (*p == '{' || *p == '[')
		return scan_container(p, depth, NULL);
	if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))
		return p + 4;
	if (!strncmp(p, "false", 5))
		return p + 5;
	f->is_num = true;
	return scan_number(p, &f->num);
}

/* 0 if s is exactly one JSON object (and whitespace); keys go to *o. */
static int parse_object(const char *s, struct jobj *o)
{
	const char *p = skip_ws(s);

	memset(o, 0, sizeof(*o));
	if (*p != '{')
		return -1;
	p = scan_container(p, 0, o);
	if (!p)
		return -1;
	return *skip_ws(p) ? -1 : 0;
}

static const struct jfield *field(const struct jobj *o, const char *key)
{
	for (int i = 0; i < o->n; i++)
		if (!strcmp(o->f[i].key, key))
			return &o->f[i];
	return NULL;
}

static double num(const struct jobj *o, const char *key)
{
	const struct jfield *f = field(o, key);

	CU_ASSERT_PTR_NOT_NULL(f);
	if (!f)
		return -1;
	CU_ASSERT(f->is_num);
	return f->num;
}

static const char *str(const struct jobj *o, const char *key)
{
	const struct jfield *f = field(o, key);

	CU_ASSERT_PTR_NOT_NULL(f);
	if (!f)
		return "";
	CU_ASSERT(!f->is_num);
	return f->str;
}

/* Runs the bench with args; stdout into out. Returns the exit status. */
static int run_bench(const char *args, char *out, size_t cap)
{
	const char *bin = getenv("EMB_BENCH");
	char cmd[1024];
	size_t n = 0;
	FILE *f;
	int st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	snprintf(cmd, sizeof(cmd), "'%s' %s", bin, args);
	f = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (n + 1 < cap) {
		size_t got = fread(out + n, 1, cap - 1 - n, f);

		if (!got)
			break;
		n += got;
	}
	out[n] = '\0';
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs a tiny config with --json and parses its one line into *o. */
static void run_json(const char *args, struct jobj *o)
{
	char cmd[512], out[8192];
	char *nl;

	snprintf(cmd, sizeof(cmd), TINY "--json %s", args);
	CU_ASSERT_EQUAL_FATAL(run_bench(cmd, out, sizeof(out)), 0);
	/* exactly one line on stdout */
	nl = strchr(out, '\n');
	CU_ASSERT_PTR_NOT_NULL_FATAL(nl);
	CU_ASSERT_EQUAL(nl[1], '\0');
	CU_ASSERT_EQUAL_FATAL(parse_object(out, o), 0);
}

static void json_has_the_documented_keys(void)
{
	static const char *const nums[] = {
		"rows",	     "dim",		   "batch",
		"threads",   "rows_per_s",	   "p50_us",
		"p90_us",    "p99_us",		   "max_us",
		"mb_per_s",  "unique_per_batch",   "preload_rows_per_s",
		"preload_cpu_rows_per_s",
		"rss_bytes", "rss_bytes_per_row", "bytes_per_row",
		"record_bytes", "slab_bytes_per_row", "index_bytes_per_row",
		"fixed_bytes", "rss_peak_bytes",
	};
	struct jobj o;

	run_json("--op pull --dist zipf:1.05 --table tiny", &o);
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		num(&o, nums[i]);
	CU_ASSERT_STRING_EQUAL(str(&o, "op"), "pull");
	CU_ASSERT_STRING_EQUAL(str(&o, "dist"), "zipf:1.05");
	CU_ASSERT_STRING_EQUAL(str(&o, "table"), "tiny");
	CU_ASSERT_STRING_EQUAL(str(&o, "row_format"), "fp32");
	CU_ASSERT_EQUAL(num(&o, "rows"), 5000);
	CU_ASSERT_EQUAL(num(&o, "dim"), 16);
	CU_ASSERT_EQUAL(num(&o, "batch"), 128);
	CU_ASSERT_EQUAL(num(&o, "threads"), 1);
	CU_ASSERT(num(&o, "rows_per_s") > 0);
	CU_ASSERT(num(&o, "p50_us") > 0);
	CU_ASSERT(num(&o, "p50_us") <= num(&o, "p90_us"));
	CU_ASSERT(num(&o, "p90_us") <= num(&o, "p99_us"));
	CU_ASSERT(num(&o, "p99_us") <= num(&o, "max_us"));
	/* a row holds at least its 16 floats */
	CU_ASSERT(num(&o, "bytes_per_row") >= 64);
	CU_ASSERT(num(&o, "rss_bytes") > 0);
	CU_ASSERT(num(&o, "unique_per_batch") >= 1);
	CU_ASSERT(num(&o, "unique_per_batch") <= 128);
}

static void every_op_runs_on_both_distributions(void)
{
	static const char *const ops[] = {
		"pull",	     "push",		  "step",	    "raw-gather",
		"raw-apply", "raw-index-gather", "raw-index-apply"};
	static const char *const dists[] = {"zipf:1.05", "uniform"};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		for (size_t j = 0; j < 2; j++) {
			char args[128];
			struct jobj o;

			snprintf(args, sizeof(args), "--op %s --dist %s",
				 ops[i], dists[j]);
			run_json(args, &o);
			CU_ASSERT_STRING_EQUAL(str(&o, "op"), ops[i]);
			CU_ASSERT_STRING_EQUAL(str(&o, "dist"), dists[j]);
			CU_ASSERT_EQUAL(num(&o, "batches"), 20);
			CU_ASSERT(num(&o, "rows_per_s") > 0);
		}
	}
}

/*
 * raw-index-gather is raw-gather through an index of 4-byte slots at 0.8
 * load: the same rows, plus 5 bytes a row of index, which the memory
 * figures count (the plain gather has none).
 */
static void raw_index_gather_counts_its_index(void)
{
	struct jobj plain, idx;

	run_json("--op raw-gather", &plain);
	run_json("--op raw-index-gather", &idx);
	CU_ASSERT_STRING_EQUAL(str(&idx, "backend"), "raw-index");
	CU_ASSERT_EQUAL(num(&plain, "index_bytes_per_row"), 0);
	CU_ASSERT(num(&idx, "index_bytes_per_row") >= 5.0);
	CU_ASSERT(num(&idx, "index_bytes_per_row") < 5.1);
	CU_ASSERT_EQUAL(num(&idx, "record_bytes"), num(&plain, "record_bytes"));
	CU_ASSERT_EQUAL(num(&idx, "unique_per_batch"),
			num(&plain, "unique_per_batch"));
}

/*
 * raw-index-apply is raw-apply through the same index (a row its probe
 * did not find would spin the run past the test's limit): its JSON says
 * which backend ran and counts the index; like raw-apply it applies plain
 * SGD only (rejects_bad_arguments).
 */
static void raw_index_apply_runs_through_its_index(void)
{
	struct jobj plain, idx;

	run_json("--op raw-apply --dist uniform", &plain);
	run_json("--op raw-index-apply --dist uniform", &idx);
	CU_ASSERT_STRING_EQUAL(str(&idx, "backend"), "raw-index");
	CU_ASSERT_STRING_EQUAL(str(&plain, "backend"), "raw");
	CU_ASSERT(num(&idx, "index_bytes_per_row") >= 5.0);
	CU_ASSERT_EQUAL(num(&idx, "batches"), 20);
}

static void every_optimizer_runs_step(void)
{
	static const char *const opts[] = {"sgd",	      "adagrad",
					   "adam",	      "ftrl",
					   "rowwise_adagrad", "adam:lr=0.001"};

	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		char args[128];
		struct jobj o;

		snprintf(args, sizeof(args), "--op step --optimizer %s",
			 opts[i]);
		run_json(args, &o);
		CU_ASSERT_EQUAL(strncmp(str(&o, "optimizer"), opts[i], 3), 0);
		/* Adam's and FTRL's state makes a row bigger than SGD's */
		CU_ASSERT(num(&o, "bytes_per_row") >= 64);
	}
}

/*
 * --row-format makes the table keep its weights in that format, and
 * bytes_per_row shows it. Sizes, not timings: at dim 64 a record is 16
 * bytes of header, the weights and the optimizer's fp32 state, so fp16
 * and bf16 save 128 bytes a row and int8 184; each run's index and fixed
 * cost are the same, so a smaller record is a smaller bytes_per_row. 50000
 * rows, so that the table's 4 MiB of fixed cost does not swamp the rows.
 */
static void row_format_shrinks_bytes_per_row(void)
{
	static const struct {
		const char *name;
		double record; /* bytes of a record with SGD at dim 64 */
	} fmts[] = {{"fp32", 272}, {"fp16", 144}, {"bf16", 144},
		    {"int8", 88}};
	double bpr[4];

	for (size_t i = 0; i < 4; i++) {
		char args[128];
		struct jobj o;

		snprintf(args, sizeof(args),
			 "--op step --rows 50000 --dim 64 --row-format %s",
			 fmts[i].name);
		run_json(args, &o);
		CU_ASSERT_STRING_EQUAL(str(&o, "row_format"), fmts[i].name);
		CU_ASSERT_EQUAL(num(&o, "dim"), 64);
		CU_ASSERT_EQUAL(num(&o, "record_bytes"), fmts[i].record);
		CU_ASSERT(num(&o, "slab_bytes_per_row") >= fmts[i].record);
		bpr[i] = num(&o, "bytes_per_row");
		CU_ASSERT(bpr[i] > fmts[i].record);
	}
	/* half the weights' bytes: at least 100 of 272+ fewer a row */
	CU_ASSERT(bpr[1] < bpr[0] - 100);
	CU_ASSERT_EQUAL(bpr[1], bpr[2]);
	CU_ASSERT(bpr[3] < bpr[1] - 40);
}

/* The options that have no compact table to apply to refuse it. */
static void row_format_needs_a_table(void)
{
	static const char *const bad[] = {
		"--row-format fp8",
		"--row-format ''",
		"--row-format int8 --op raw-gather",
		"--row-format fp16 --op push --verify",
	};
	char out[4096];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char args[256];

		snprintf(args, sizeof(args), TINY "%s 2>/dev/null", bad[i]);
		CU_ASSERT_EQUAL(run_bench(args, out, sizeof(out)), 2);
		CU_ASSERT_EQUAL(out[0], '\0');
	}
	/* fp32 is the default, so naming it changes nothing anywhere */
	CU_ASSERT_EQUAL(run_bench(TINY "--row-format fp32 --op raw-gather"
				       " >/dev/null",
				  out, sizeof(out)),
			0);
}

/*
 * --optimizer rowwise_adagrad keeps one float of state a row, Adagrad dim
 * floats: at dim 64 its records are 256 B smaller (280 B against 536 B
 * with header and padding). 50,000 rows, so that the tables' fixed part
 * (a partly filled slab per shard) is some 80 B a row, not 800.
 */
static void rowwise_adagrad_rows_are_small(void)
{
	struct jobj rw, ada;

	run_json("--rows 50000 --dim 64 --op step "
		 "--optimizer rowwise_adagrad",
		 &rw);
	run_json("--rows 50000 --dim 64 --op step --optimizer adagrad", &ada);
	CU_ASSERT_STRING_EQUAL(str(&rw, "optimizer"), "rowwise_adagrad");
	CU_ASSERT(num(&rw, "bytes_per_row") + 200 < num(&ada, "bytes_per_row"));
}

static void threads_each_run_their_batches(void)
{
	struct jobj o;

	run_json("--op step --threads 3", &o);
	CU_ASSERT_EQUAL(num(&o, "threads"), 3);
	CU_ASSERT_EQUAL(num(&o, "batches"), 60);
}

static void seed_repeats_the_id_stream(void)
{
	struct jobj a, b, c;

	run_json("--op raw-gather --seed 9", &a);
	run_json("--op raw-gather --seed 9", &b);
	run_json("--op raw-gather --seed 10", &c);
	CU_ASSERT_EQUAL(num(&a, "unique_per_batch"),
			num(&b, "unique_per_batch"));
	CU_ASSERT_NOT_EQUAL(num(&a, "unique_per_batch"),
			    num(&c, "unique_per_batch"));
	/* uniform draws repeat ids far less often than Zipf draws */
	run_json("--op raw-gather --dist uniform --seed 9", &c);
	CU_ASSERT(num(&c, "unique_per_batch") > num(&a, "unique_per_batch"));
}

static void duration_and_warmup_bound_the_run(void)
{
	char out[8192];
	struct jobj o;

	CU_ASSERT_EQUAL_FATAL(run_bench("--rows 1000 --dim 8 --batch 64"
					" --duration 0.2 --warmup 0.1 --json",
					out, sizeof(out)),
			      0);
	CU_ASSERT_EQUAL_FATAL(parse_object(out, &o), 0);
	CU_ASSERT(num(&o, "batches") >= 1);
	CU_ASSERT(num(&o, "elapsed_s") >= 0.2);
}

/*
 * --stop-file: a test (tests/cluster) ends a job's training once its
 * checks are done, --duration only bounding it. The file made while the
 * bench runs ends it long before its 120 s, with its batches counted and
 * its rows verified (stderr, without --json's line on stdout); one there
 * from the start ends the warmup and the timed run at once.
 */
static void stop_file_ends_the_run(void)
{
	char *dir = emb_test_tmpdir();
	char args[1024], out[8192], err[256];
	struct jobj o;
	FILE *f;

	snprintf(args, sizeof(args),
		 "--rows 1000 --dim 8 --batch 64 --op push --verify"
		 " --duration 120 --stop-file '%s/stop' --json 2>'%s/err' &"
		 " p=$!; sleep 0.3; : >'%s/stop'; wait $p",
		 dir, dir, dir);
	CU_ASSERT_EQUAL_FATAL(run_bench(args, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL_FATAL(parse_object(out, &o), 0);
	CU_ASSERT(num(&o, "batches") >= 1);
	CU_ASSERT(num(&o, "elapsed_s") < 60);
	snprintf(args, sizeof(args), "%s/err", dir);
	f = fopen(args, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	err[0] = '\0';
	while (fgets(err, sizeof(err), f) && strncmp(err, "verify:", 7))
		;
	fclose(f);
	CU_ASSERT(strstr(err, " 0 mismatched") != NULL);
	CU_ASSERT(strstr(err, "verify: 0 rows") == NULL);

	snprintf(args, sizeof(args),
		 "--rows 1000 --dim 8 --batch 64 --duration 120 --warmup 120"
		 " --stop-file '%s/stop' --json",
		 dir);
	CU_ASSERT_EQUAL_FATAL(run_bench(args, out, sizeof(out)), 0);
	CU_ASSERT_EQUAL_FATAL(parse_object(out, &o), 0);
	CU_ASSERT(num(&o, "elapsed_s") < 60);
	CU_ASSERT_EQUAL(run_bench("--stop-file '' 2>/dev/null", out,
				  sizeof(out)),
			2);
	emb_test_rmtree(dir);
	free(dir);
}

/*
 * --simd: the store's narrower vector copies, run on this CPU, train the
 * rows --verify expects (its sums are exact), and the JSON line says which
 * width ran; a width that is none of the three is refused with status 2.
 */
static void simd_widths_verify(void)
{
	static const char *const widths[] = {"avx512", "avx2", "none"};
	char *dir = emb_test_tmpdir();
	char args[512], out[8192], err[256];
	struct jobj o;
	FILE *f;

	for (int i = 0; i < 3; i++) {
		snprintf(args, sizeof(args),
			 "--rows 2000 --dim 24 --batch 128 --op push --verify"
			 " --batches 20 --simd %s --json"
			 " 2>'%s/err'",
			 widths[i], dir);
		CU_ASSERT_EQUAL_FATAL(run_bench(args, out, sizeof(out)), 0);
		CU_ASSERT_EQUAL_FATAL(parse_object(out, &o), 0);
		CU_ASSERT_STRING_EQUAL(str(&o, "simd"), widths[i]);
		snprintf(args, sizeof(args), "%s/err", dir);
		f = fopen(args, "r");
		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		err[0] = '\0';
		while (fgets(err, sizeof(err), f) &&
		       strncmp(err, "verify:", 7))
			;
		fclose(f);
		CU_ASSERT(strstr(err, " 0 mismatched") != NULL);
	}
	CU_ASSERT_EQUAL_FATAL(run_bench("--batches 1 --json", out, sizeof(out)),
			      0);
	CU_ASSERT_EQUAL_FATAL(parse_object(out, &o), 0);
	CU_ASSERT_STRING_EQUAL(str(&o, "simd"), "auto");
	CU_ASSERT_EQUAL(run_bench("--simd sse 2>/dev/null", out, sizeof(out)),
			2);
	emb_test_rmtree(dir);
	free(dir);
}

/*
 * --report-interval: latency lines on stderr while timing, the last one for
 * the shorter rest, and together they count every timed batch. Only the
 * sum is exact (how many lines depends on the clock): at least the last
 * and one before it in 2 s of 0.25 s intervals. Their times go up, the
 * last one's (the rest of the run) possibly to the one before it, when
 * the run ended at a boundary.
 */
static void report_interval_lines_count_every_batch(void)
{
	static char out[1 << 16];
	unsigned long long lines = 0, sum = 0, total = 0, b;
	double at, p50, p99, max, last_at = 0, prev_at = 0;
	bool rose = true;
	char *line, *save = NULL;

	CU_ASSERT_EQUAL_FATAL(run_bench("--rows 1000 --dim 8 --batch 64"
					" --op step --threads 2 --duration 2"
					" --report-interval 0.25 2>&1",
					out, sizeof(out)),
			      0);
	for (line = strtok_r(out, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (sscanf(line, "  timed %llu batches", &b) == 1)
			total = b;
		if (strncmp(line, "interval: ", 10))
			continue;
		CU_ASSERT_EQUAL_FATAL(sscanf(line,
					     "interval: %lf s, %llu batches, "
					     "p50 %lf us, p99 %lf us, max %lf "
					     "us",
					     &at, &b, &p50, &p99, &max),
				      5);
		/* each line's time above the one before the line before it:
		 * a line equal to its predecessor must be the last */
		CU_ASSERT(at >= last_at);
		rose = rose && (lines < 2 || last_at > prev_at);
		CU_ASSERT(b == 0 || (p50 > 0 && p50 <= p99 && p99 <= max));
		prev_at = last_at;
		last_at = at;
		sum += b;
		lines++;
	}
	CU_ASSERT(rose); /* only the last may repeat a time */
	CU_ASSERT(lines >= 2);
	CU_ASSERT(total > 0);
	CU_ASSERT_EQUAL(sum, total);
}

static void summary_without_json_is_not_json(void)
{
	char out[8192];
	struct jobj o;

	CU_ASSERT_EQUAL_FATAL(run_bench(TINY "--op pull", out, sizeof(out)),
			      0);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "rows/s"));
	CU_ASSERT_NOT_EQUAL(parse_object(out, &o), 0);
}

static void rejects_bad_arguments(void)
{
	static const char *const bad[] = {
		"--op nope",
		"--dist zipf",
		"--dist zipf:0",
		"--dist poisson",
		"--rows 0",
		"--rows 12x",
		"--dim 0",
		"--dim 5000",
		"--batch 0",
		"--threads 0",
		"--optimizer bogus",
		"--optimizer sgd:lr=-1",
		"--op raw-apply --optimizer adam",
		"--op raw-index-apply --optimizer adam",
		"--op raw-index-gather --row-format fp16",
		"--op raw-gather --servers 127.0.0.1:1",
		"--op raw-index-apply --sched 127.0.0.1:1",
		"--duration 0",
		"--report-interval 0.1",
		"--report-interval soon",
		"stray",
	};
	char out[4096];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char args[256];

		snprintf(args, sizeof(args), TINY "%s 2>/dev/null", bad[i]);
		CU_ASSERT_EQUAL(run_bench(args, out, sizeof(out)), 2);
		CU_ASSERT_EQUAL(out[0], '\0');
	}
}

/*
 * --mem-limit with --tier-dir: rows past the limit go to the device tier
 * and come back (docs/store.md, "The device tier"), the JSON line says so,
 * and the file is gone afterwards. 60000 rows of 80 bytes (dim 16, SGD)
 * and the table's 4 MiB fixed part pass three quarters of 8 MiB.
 */
static void tier_dir_sends_rows_to_the_device(void)
{
	char *dir = emb_test_tmpdir();
	char args[512], path[512];
	struct jobj o;
	FILE *f;

	snprintf(args, sizeof(args),
		 "--op step --rows 60000 --batch 512 --mem-limit 8M"
		 " --tier-dir '%s'",
		 dir);
	run_json(args, &o);
	CU_ASSERT_EQUAL(num(&o, "mem_limit"), 8 << 20);
	CU_ASSERT(num(&o, "rows_cold") > 10000);
	CU_ASSERT(num(&o, "rows_cold") < 60000);
	CU_ASSERT(num(&o, "tier_file_bytes") >= num(&o, "rows_cold") * 80);
	CU_ASSERT(num(&o, "tier_reads") > 0);
	CU_ASSERT(num(&o, "tier_writes") > 0);
	CU_ASSERT(num(&o, "rss_peak_bytes") >= num(&o, "rss_bytes"));
	snprintf(path, sizeof(path), "%s/bench.tier", dir);
	f = fopen(path, "r");
	CU_ASSERT_PTR_NULL(f);
	if (f)
		fclose(f);
	/* Without the limit nothing would ever go there; and the limit is
	 * this process's table's, not servers'. */
	snprintf(args, sizeof(args), TINY "--tier-dir '%s' 2>/dev/null", dir);
	CU_ASSERT_EQUAL(run_bench(args, path, sizeof(path)), 2);
	CU_ASSERT_EQUAL(run_bench(TINY "--mem-limit 8M --op raw-gather"
				       " 2>/dev/null",
				  path, sizeof(path)),
			2);
	CU_ASSERT_EQUAL(run_bench(TINY "--mem-limit 8Q 2>/dev/null", path,
				  sizeof(path)),
			2);
	emb_test_rmtree(dir);
	free(dir);
}

static void bad_table_name_fails_cleanly(void)
{
	char out[4096];

	CU_ASSERT_EQUAL(run_bench(TINY "--table 'no spaces' 2>/dev/null", out,
				  sizeof(out)),
			1);
	CU_ASSERT_EQUAL(out[0], '\0');
}

static const struct emb_test_case cases[] = {
	{"json line has the documented keys", json_has_the_documented_keys},
	{"every op runs on zipf and uniform",
	 every_op_runs_on_both_distributions},
	{"raw-index-apply runs through its index",
	 raw_index_apply_runs_through_its_index},
	{"raw-index-gather counts its index",
	 raw_index_gather_counts_its_index},
	{"every optimizer runs step", every_optimizer_runs_step},
	{"--row-format shrinks bytes_per_row",
	 row_format_shrinks_bytes_per_row},
	{"--row-format needs a table", row_format_needs_a_table},
	{"rowwise_adagrad rows are smaller than adagrad's",
	 rowwise_adagrad_rows_are_small},
	{"each thread runs --batches batches", threads_each_run_their_batches},
	{"same seed repeats the id stream", seed_repeats_the_id_stream},
	{"duration and warmup bound the run",
	 duration_and_warmup_bound_the_run},
	{"--stop-file ends the run before --duration", stop_file_ends_the_run},
	{"--simd: each width's vector copies verify", simd_widths_verify},
	{"report-interval lines count every timed batch",
	 report_interval_lines_count_every_batch},
	{"summary without --json is not json",
	 summary_without_json_is_not_json},
	{"rejects bad arguments with status 2", rejects_bad_arguments},
	{"bad table name fails with status 1", bad_table_name_fails_cleanly},
	{"--tier-dir sends rows to the device", tier_dir_sends_rows_to_the_device},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "bench", cases);
}
