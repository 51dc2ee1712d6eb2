/*
 * tools/pslite/w1.cc - embstore-bench's workload W1 against dmlc/ps-lite, the
 * baseline that embstore's network pull and push are compared with
 * (docs/net-baselines.md, "ps-lite").
 *
 * One program plays all three ps-lite roles on the loopback: started without
 * DMLC_ROLE it picks a free port, forks a scheduler and a server (each a
 * ps-lite node of its own process, over ps-lite's ZMQ van) and is the worker
 * itself. The server keeps rows of dim floats in one array, found through
 * an open-addressed index (both in huge pages, lookups prefetched ahead: see
 * class table), answers a pull by copying rows into the reply and applies
 * SGD (w -= lr * g) to a push in its request handle, on ps-lite's one
 * customer thread. A std::unordered_map and an std::vector there instead
 * cost the server 1.2 ms of a pull's and 3.3 ms of a push's batch of 2090
 * rows on an AMD EPYC VM (a TLB and cache miss or more a key), three to
 * nine times ps-lite's own round trip: the comparison would have been with
 * that table, not with ps-lite. The worker draws W1's ids from
 * embstore-bench's own stream (tools/bench_ids.c, same seed, same bijection
 * and id hash), so both systems see the same keys in the same order.
 *
 * What is timed is what embstore-bench times for its client backend: the
 * call a training step would make with the caller's batch, duplicates and
 * all. ps-lite wants sorted unique keys, so the call dedups the batch (hash
 * set), sorts the distinct keys, then pulls and scatters the rows back to the
 * caller's order, or sums duplicate gradients and pushes one per key. Rows/s
 * counts the caller's ids per second of time inside the call, ids drawn
 * outside the clock; one line of JSON like embstore-bench --json.
 *
 *   pslite-w1 --op pull|push|--serve [--rows N] [--dim N] [--batch N]
 *             [--dist zipf:S|uniform] [--seed N] [--warmup S]
 *             [--duration S | --batches N] [--lr F] [--part-ids N]
 *             [--check] [--json]
 *
 * --part-ids: most keys per request (1024, as embstore's client cuts a
 * batch; 0: the whole batch in one): a batch's requests all go out before
 * the first is waited for. --check first pulls every preloaded row back
 * and fails the run (exit 1) if any differs from what was written.
 * --batches times exactly N batches (as embstore-bench --batches), which
 * no load can cut to none. With --serve the rows are preloaded once, then
 * each line "pull" or "push" on stdin runs one phase (warmup and timed
 * batches) and prints its line.
 *
 * Single-threaded apart from ps-lite's own threads.
 */
#include <ps/ps.h>

#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <string>
#include <vector>

/* embstore's C headers; C++ spells C99's restrict __restrict__. */
#define restrict __restrict__
extern "C" {
#include "bench.h"
#include "common/hash.h"
}
#undef restrict

namespace {

/* Push commands: a preload writes rows, a timed push applies SGD. */
enum { CMD_SGD = 0, CMD_ASSIGN = 1 };

struct opts {
	bool push = false;
	uint64_t rows = 1000000;
	uint32_t dim = 64;
	uint32_t batch = 4096;
	std::string dist_name = "zipf:1.05";
	struct emb_dist dist = {};
	uint64_t seed = 1;
	double warmup_s = 1.0;
	double duration_s = 3.0;
	uint64_t batches = 0; /* timed batches instead of duration_s */
	uint32_t part_ids = 1024; /* most keys per request; 0: one request */
	float lr = 0.01f;
	bool json = false;
	bool serve = false; /* phases named on stdin */
	bool check = false; /* pull every preloaded row back and compare */
};

uint64_t now_ns()
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void usage(FILE *f)
{
	fputs("usage: pslite-w1 --op pull|push|--serve [--rows N] [--dim N]\n"
	      "                 [--batch N] [--dist zipf:S|uniform] [--seed N]\n"
	      "                 [--warmup S] [--duration S | --batches N]\n"
	      "                 [--lr F] [--part-ids N] [--check] [--json]\n"
	      "  --serve: after the preload, one phase per line of stdin,\n"
	      "           \"pull\" or \"push\", until its end\n",
	      f);
}

bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

bool parse_pos(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0.0 && v <= 1e6))
		return false;
	*out = v;
	return true;
}

/* 0, or -1 after a message on stderr. */
int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
	    {"op", required_argument, NULL, 'o'},
	    {"rows", required_argument, NULL, 'r'},
	    {"dim", required_argument, NULL, 'd'},
	    {"batch", required_argument, NULL, 'b'},
	    {"dist", required_argument, NULL, 'D'},
	    {"seed", required_argument, NULL, 's'},
	    {"warmup", required_argument, NULL, 'w'},
	    {"duration", required_argument, NULL, 't'},
	    {"batches", required_argument, NULL, 'n'},
	    {"lr", required_argument, NULL, 'l'},
	    {"part-ids", required_argument, NULL, 'p'},
	    {"check", no_argument, NULL, 'c'},
	    {"json", no_argument, NULL, 'j'},
	    {"serve", no_argument, NULL, 'S'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool have_op = false;
	int c;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		const char *bad = NULL;
		uint64_t v;
		double d;

		switch (c) {
		case 'o':
			if (strcmp(optarg, "pull") == 0)
				o->push = false;
			else if (strcmp(optarg, "push") == 0)
				o->push = true;
			else
				bad = "--op";
			have_op = true;
			break;
		case 'r':
			if (!parse_u64(optarg, 1, UINT64_C(1) << 32, &o->rows))
				bad = "--rows";
			break;
		case 'd':
			if (!parse_u64(optarg, 1, 4096, &v))
				bad = "--dim";
			o->dim = (uint32_t)v;
			break;
		case 'b':
			if (!parse_u64(optarg, 1, 1u << 20, &v))
				bad = "--batch";
			o->batch = (uint32_t)v;
			break;
		case 'D':
			o->dist_name = optarg;
			break;
		case 's':
			if (!parse_u64(optarg, 0, UINT64_MAX, &o->seed))
				bad = "--seed";
			break;
		case 'w':
			if (!parse_pos(optarg, &o->warmup_s))
				bad = "--warmup";
			break;
		case 't':
			if (!parse_pos(optarg, &o->duration_s) ||
			    o->duration_s <= 0.0)
				bad = "--duration";
			break;
		case 'n':
			if (!parse_u64(optarg, 1, UINT64_MAX, &o->batches))
				bad = "--batches";
			break;
		case 'l':
			if (!parse_pos(optarg, &d) || d == 0.0)
				bad = "--lr";
			o->lr = (float)d;
			break;
		case 'p':
			if (!parse_u64(optarg, 0, 1u << 20, &v))
				bad = "--part-ids";
			o->part_ids = (uint32_t)v;
			break;
		case 'c':
			o->check = true;
			break;
		case 'j':
			o->json = true;
			break;
		case 'S':
			o->serve = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
		if (bad) {
			fprintf(stderr, "pslite-w1: bad %s '%s'\n", bad, optarg);
			return -1;
		}
	}
	if (optind != argc || (!have_op && !o->serve)) {
		usage(stderr);
		return -1;
	}
	if (emb_dist_parse(o->dist_name.c_str(), &o->dist)) {
		fprintf(stderr, "pslite-w1: bad --dist '%s'\n",
			o->dist_name.c_str());
		return -1;
	}
	return 0;
}

/*
 * Memory for the server's table: zeroed, in 2 MiB pages where the kernel has
 * them (as embstore's store asks for its rows), so that a batch's random rows
 * do not each cost a TLB miss. Never freed: the server process ends with it.
 */
void *huge_alloc(size_t bytes)
{
	size_t len = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		throw std::bad_alloc();
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

/*
 * The server's table, as a ps-lite user who cares for speed would write it
 * (ps-lite leaves the store to its user): rows of dim floats in one array, an
 * open-addressed index from key to row (linear probing, at most half full),
 * both in huge pages, and a batch's lookups pipelined: the index slot of
 * the key 2 * LOOKAHEAD ahead is prefetched while a key is resolved, then
 * the row LOOKAHEAD ahead while a row is copied or updated. A pull answers
 * from one reply buffer reused while ZeroMQ holds no reference to it (ps-lite's
 * own benchmark reuses its reply the same way).
 */
class table {
      public:
	table(uint32_t dim, uint64_t rows, float lr)
	    : dim_(dim), lr_(lr), cap_rows_(rows)
	{
		size_t n = 16;

		while (n < 2 * rows)
			n <<= 1;
		mask_ = n - 1;
		slots_ = (slot *)huge_alloc(n * sizeof(slot));
		data_ = (float *)huge_alloc(rows * dim * sizeof(float));
	}

	void handle(const ps::KVMeta &meta, const ps::KVPairs<float> &req,
		    ps::KVServer<float> *server)
	{
		size_t n = req.keys.size();

		resolve(req.keys.data(), n);
		if (meta.push) {
			CHECK_EQ(req.vals.size(), n * dim_);
			for (size_t i = 0; i < n; i++) {
				float *w = rows_[i];
				const float *g = &req.vals[i * dim_];

				prefetch_row(i + LOOKAHEAD, n, 1);
				if (meta.cmd == CMD_ASSIGN) {
					memcpy(w, g, dim_ * sizeof(float));
					continue;
				}
				for (uint32_t j = 0; j < dim_; j++)
					w[j] -= lr_ * g[j];
			}
			server->Response(meta);
			return;
		}
		/* Another reference: ZeroMQ may still be sending the last reply. */
		if (res_.vals.ptr().use_count() > 1)
			res_.vals = ps::SArray<float>();
		res_.keys = req.keys;
		res_.vals.resize(n * dim_);
		for (size_t i = 0; i < n; i++) {
			prefetch_row(i + LOOKAHEAD, n, 0);
			memcpy(&res_.vals[i * dim_], rows_[i],
			       dim_ * sizeof(float));
		}
		server->Response(meta, res_);
	}

      private:
	/* Keys and rows resolved this many places ahead of their use. */
	static const size_t LOOKAHEAD = 8;

	struct slot {
		uint64_t key;
		uint64_t row; /* row + 1; 0: empty */
	};

	size_t home(ps::Key key) const
	{
		return (size_t)emb_id_hash(key) & mask_;
	}

	void prefetch_row(size_t i, size_t n, int rw)
	{
		if (i >= n)
			return;
		for (size_t b = 0; b < dim_ * sizeof(float); b += 64) {
			if (rw)
				__builtin_prefetch((char *)rows_[i] + b, 1);
			else
				__builtin_prefetch((char *)rows_[i] + b, 0);
		}
	}

	/* rows_[i]: the row of keys[i], created zeroed when it is new. */
	void resolve(const ps::Key *keys, size_t n)
	{
		if (rows_.size() < n)
			rows_.resize(n);
		for (size_t i = 0; i < n; i++) {
			size_t s;

			if (i + 2 * LOOKAHEAD < n)
				__builtin_prefetch(
				    &slots_[home(keys[i + 2 * LOOKAHEAD])]);
			s = home(keys[i]);
			while (slots_[s].row && slots_[s].key != keys[i])
				s = (s + 1) & mask_;
			if (!slots_[s].row) {
				/* A key never pushed: only a pull gets here. */
				CHECK_LT(used_, cap_rows_)
				    << "pslite-w1: more keys than --rows";
				slots_[s].key = keys[i];
				slots_[s].row = ++used_;
			}
			rows_[i] = data_ + (slots_[s].row - 1) * dim_;
		}
		for (size_t i = 0; i < LOOKAHEAD && i < n; i++)
			prefetch_row(i, n, 0);
	}

	uint32_t dim_;
	float lr_;
	uint64_t cap_rows_;
	uint64_t used_ = 0;
	size_t mask_;
	slot *slots_;
	float *data_;
	std::vector<float *> rows_;
	ps::KVPairs<float> res_;
};

int run_server(const struct opts &o)
{
	ps::Start(0);
	try {
		table t(o.dim, o.rows, o.lr);
		ps::KVServer<float> server(0);

		server.set_request_handle(
		    [&t](const ps::KVMeta &m, const ps::KVPairs<float> &r,
			 ps::KVServer<float> *s) { t.handle(m, r, s); });
		/* The worker sends nothing before the handle is set. */
		ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup +
						      ps::kServerGroup);
		/* Returns once the worker has finalized too. */
		ps::Finalize(0, true);
	} catch (const std::bad_alloc &) {
		/* The worker sees this node die and fails the run. */
		fprintf(stderr, "pslite-w1: server: no memory for %llu rows "
				"of dim %u\n",
			(unsigned long long)o.rows, o.dim);
		return 1;
	}
	return 0;
}

/*
 * A batch as ps-lite takes it: the sorted distinct keys, and for each of the
 * caller's ids the position of its key among them. The hash set is reused
 * from batch to batch; a generation number empties it without a memset.
 */
class deduper {
      public:
	explicit deduper(uint32_t batch)
	{
		size_t n = 2;

		while (n < 2 * (size_t)batch)
			n <<= 1;
		mask_ = n - 1;
		slots_.resize(n);
		slot_of_.resize(batch);
		pos_.resize(batch);
	}

	/* Distinct keys of ids[0..n) into keys, sorted; positions in pos(). */
	size_t run(const uint64_t *ids, uint32_t n, ps::Key *keys)
	{
		size_t u = 0;

		if (++gen_ == 0) {
			std::fill(slots_.begin(), slots_.end(), slot{});
			gen_ = 1;
		}
		for (uint32_t i = 0; i < n; i++) {
			size_t s = emb_id_hash(ids[i]) & mask_;

			while (slots_[s].gen == gen_ && slots_[s].key != ids[i])
				s = (s + 1) & mask_;
			if (slots_[s].gen != gen_) {
				slots_[s] = slot{ids[i], 0, gen_};
				keys[u++] = ids[i];
			}
			slot_of_[i] = (uint32_t)s;
		}
		std::sort(keys, keys + u);
		for (size_t p = 0; p < u; p++) {
			size_t s = emb_id_hash(keys[p]) & mask_;

			while (slots_[s].key != keys[p])
				s = (s + 1) & mask_;
			slots_[s].pos = (uint32_t)p;
		}
		for (uint32_t i = 0; i < n; i++)
			pos_[i] = slots_[slot_of_[i]].pos;
		return u;
	}

	const uint32_t *pos() const { return pos_.data(); }

      private:
	struct slot {
		uint64_t key;
		uint32_t pos;
		uint32_t gen;
	};
	size_t mask_;
	uint32_t gen_ = 0;
	std::vector<slot> slots_;
	std::vector<uint32_t> slot_of_;
	std::vector<uint32_t> pos_;
};

/*
 * The preload's batch of rows r..r+n: its keys, sorted as ps-lite wants
 * them, and its values from rng. preload() writes them and check_rows()
 * expects them back, so both take them from here.
 */
void preload_batch(const struct opts &o, uint64_t r, uint32_t n,
		   ps::SArray<ps::Key> &keys, float *vals, uint64_t *rng)
{
	for (uint32_t i = 0; i < n; i++)
		keys[i] = emb_id_hash(r + i);
	std::sort(keys.begin(), keys.begin() + n);
	for (size_t i = 0; i < (size_t)n * o.dim; i++)
		vals[i] = (float)((int)(emb_splitmix64(rng) % 2001) - 1000) *
			  1e-4f;
}

/* Writes rows r0.. of the table, batch by batch; ps-lite wants them sorted. */
int preload(const struct opts &o, ps::KVWorker<float> *kv)
{
	ps::SArray<ps::Key> keys(o.batch);
	ps::SArray<float> vals((size_t)o.batch * o.dim);
	uint64_t rng = emb_id_hash(o.seed);

	for (uint64_t r = 0; r < o.rows; r += o.batch) {
		uint32_t n = (uint32_t)std::min<uint64_t>(o.batch, o.rows - r);

		preload_batch(o, r, n, keys, vals.data(), &rng);
		kv->Wait(kv->ZPush(keys.segment(0, n),
				   vals.segment(0, (size_t)n * o.dim), {},
				   CMD_ASSIGN));
	}
	return 0;
}

struct result {
	uint64_t batches = 0;
	uint64_t rows = 0;
	uint64_t busy_ns = 0;
	uint64_t prep_ns = 0;
	uint64_t unique = 0;
	std::vector<uint64_t> lat_ns;
};

/*
 * Pushes or pulls the u sorted keys in parts of at most --part-ids keys (of
 * equal size), all sent before the first is waited for, as embstore's client
 * cuts a batch: the server handles one part while the previous one crosses
 * the loopback and the worker takes in the one before. A part's rows are a
 * slice of vals, which a pull's reply is copied into.
 */
void call_parts(const struct opts &o, ps::KVWorker<float> *kv,
		const ps::SArray<ps::Key> &keys, ps::SArray<float> &vals,
		size_t u, bool push)
{
	size_t np = o.part_ids ? (u + o.part_ids - 1) / o.part_ids : 1;
	std::vector<ps::SArray<float>> slices;
	std::vector<int> ts;

	if (np == 0)
		np = 1;
	slices.reserve(np);
	for (size_t k = 0; k < np; k++) {
		size_t a = u * k / np, b = u * (k + 1) / np;

		slices.push_back(vals.segment(a * o.dim, b * o.dim));
		if (push)
			ts.push_back(kv->ZPush(keys.segment(a, b), slices[k]));
		else
			ts.push_back(kv->ZPull(keys.segment(a, b), &slices[k]));
	}
	for (int t : ts)
		kv->Wait(t);
}

/*
 * Pulls every row preload() wrote, in its batches and in parts as a timed
 * pull sends them, and compares each value with the one written. Returns
 * the number of rows that differ (0: the server's table holds them all).
 */
uint64_t check_rows(const struct opts &o, ps::KVWorker<float> *kv)
{
	ps::SArray<ps::Key> keys(o.batch);
	ps::SArray<float> got((size_t)o.batch * o.dim);
	std::vector<float> want((size_t)o.batch * o.dim);
	uint64_t rng = emb_id_hash(o.seed), bad = 0;

	for (uint64_t r = 0; r < o.rows; r += o.batch) {
		uint32_t n = (uint32_t)std::min<uint64_t>(o.batch, o.rows - r);

		preload_batch(o, r, n, keys, want.data(), &rng);
		call_parts(o, kv, keys, got, n, false);
		for (uint32_t i = 0; i < n; i++)
			if (memcmp(&got[(size_t)i * o.dim],
				   &want[(size_t)i * o.dim],
				   o.dim * sizeof(float)))
				bad++;
	}
	return bad;
}

/*
 * Batches until deadline_ns; with r, each one's time inside the call is
 * recorded, and with --batches there are exactly that many.
 */
void run_batches(const struct opts &o, ps::KVWorker<float> *kv,
		 struct emb_idgen *gen, uint64_t deadline_ns, result *r)
{
	size_t row_floats = o.dim;
	std::vector<uint64_t> ids(o.batch);
	std::vector<float> out((size_t)o.batch * o.dim);
	std::vector<float> grads((size_t)o.batch * o.dim);
	ps::SArray<ps::Key> keys(o.batch);
	ps::SArray<float> vals((size_t)o.batch * o.dim);
	uint64_t rng = emb_id_hash(o.seed + 0);
	deduper dd(o.batch);

	/* embstore-bench's gradients: small, in [-1e-3, 1e-3]. */
	for (float &g : grads)
		g = (float)((int)(emb_splitmix64(&rng) % 2001) - 1000) * 1e-6f;
	for (;;) {
		uint64_t t0, t1, t2;
		size_t u;

		if (r && o.batches ? r->batches == o.batches
				   : now_ns() >= deadline_ns)
			break;
		emb_idgen_fill(gen, ids.data(), o.batch);
		for (uint64_t &id : ids)
			id = emb_id_hash(id);
		t0 = now_ns();
		u = dd.run(ids.data(), o.batch, keys.data());
		const uint32_t *pos = dd.pos();
		ps::SArray<float> v = vals.segment(0, u * row_floats);

		if (o.push) {
			memset(v.data(), 0, u * row_floats * sizeof(float));
			for (uint32_t i = 0; i < o.batch; i++) {
				float *d = &v[pos[i] * row_floats];
				const float *g = &grads[i * row_floats];

				for (size_t j = 0; j < row_floats; j++)
					d[j] += g[j];
			}
			t1 = now_ns();
			call_parts(o, kv, keys, v, u, true);
		} else {
			t1 = now_ns();
			call_parts(o, kv, keys, v, u, false);
			for (uint32_t i = 0; i < o.batch; i++)
				memcpy(&out[i * row_floats],
				       &v[pos[i] * row_floats],
				       row_floats * sizeof(float));
		}
		t2 = now_ns();
		if (!r)
			continue;
		r->batches++;
		r->rows += o.batch;
		r->busy_ns += t2 - t0;
		r->prep_ns += t1 - t0;
		r->unique += u;
		r->lat_ns.push_back(t2 - t0);
	}
}

double pct_us(const std::vector<uint64_t> &sorted, double p)
{
	size_t i;

	if (sorted.empty())
		return 0.0;
	i = (size_t)(p / 100.0 * (double)(sorted.size() - 1) + 0.5);
	return (double)sorted[i] / 1e3;
}

/* Set once the worker finalizes: the other nodes may exit from then on. */
volatile sig_atomic_t worker_done;

/*
 * A node that dies while the worker still needs it would leave the worker
 * waiting for an answer forever (ps-lite has no timeout): fail at once.
 */
void on_child(int sig)
{
	static const char msg[] = "pslite-w1: a scheduler or server node died\n";
	int saved = errno, st;
	pid_t pid;

	(void)sig;
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		if (worker_done && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			continue;
		if (write(2, msg, sizeof(msg) - 1) < 0) {
			/* nothing more to say */
		}
		_exit(1);
	}
	errno = saved;
}

/* Prints one phase's figures: a JSON line, or a line for people. */
void report(const struct opts &o, result &r, uint64_t measure_ns,
	    double preload_rows_per_s)
{
	std::sort(r.lat_ns.begin(), r.lat_ns.end());
	double rate = r.busy_ns ? (double)r.rows * 1e9 / (double)r.busy_ns
				: 0.0;
	double mean_us = r.batches ? (double)r.busy_ns / (double)r.batches / 1e3
				   : 0.0;
	double prep_us = r.batches ? (double)r.prep_ns / (double)r.batches / 1e3
				   : 0.0;
	double uniq = r.batches ? (double)r.unique / (double)r.batches : 0.0;
	const char *op = o.push ? "push" : "pull";

	if (o.json) {
		printf("{\"op\":\"%s\",\"backend\":\"ps-lite\",\"transport\":"
		       "\"tcp\",\"van\":\"zmq\",\"dist\":\"%s\",\"optimizer\":"
		       "\"sgd\",\"rows\":%llu,\"dim\":%u,\"batch\":%u,"
		       "\"threads\":1,\"seed\":%llu,\"batches\":%llu,"
		       "\"elapsed_s\":%.3f,\"rows_per_s\":%.0f,"
		       "\"mb_per_s\":%.1f,\"p50_us\":%.1f,\"p90_us\":%.1f,"
		       "\"p99_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
		       "\"prep_us\":%.1f,\"unique_per_batch\":%.1f,"
		       "\"preload_rows_per_s\":%.0f}\n",
		       op, o.dist_name.c_str(), (unsigned long long)o.rows,
		       o.dim, o.batch, (unsigned long long)o.seed,
		       (unsigned long long)r.batches, (double)measure_ns / 1e9,
		       rate, rate * o.dim * sizeof(float) / 1e6,
		       pct_us(r.lat_ns, 50), pct_us(r.lat_ns, 90),
		       pct_us(r.lat_ns, 99), pct_us(r.lat_ns, 100), mean_us,
		       prep_us, uniq, preload_rows_per_s);
	} else {
		printf("ps-lite %s %s: %.2f M rows/s, p50 %.0f us, p99 %.0f us,"
		       " %.1f us of dedup/sort/sum per batch, %.0f distinct"
		       " ids per batch, %llu batches\n",
		       op, o.dist_name.c_str(), rate / 1e6,
		       pct_us(r.lat_ns, 50), pct_us(r.lat_ns, 99), prep_us,
		       uniq, (unsigned long long)r.batches);
	}
	fflush(stdout);
}

/*
 * One phase: warmup, then the timed batches, from the start of the id
 * stream (as each embstore-bench run starts its own). 0, or 1 when no
 * batch was timed.
 */
int run_phase(const struct opts &o, ps::KVWorker<float> *kv, double pre)
{
	struct emb_idgen gen;
	uint64_t t0;
	result r;

	if (emb_idgen_init(&gen, &o.dist, o.rows, o.seed, 0))
		return 1;
	t0 = now_ns();
	run_batches(o, kv, &gen, t0 + (uint64_t)(o.warmup_s * 1e9), NULL);
	t0 = now_ns();
	run_batches(o, kv, &gen, t0 + (uint64_t)(o.duration_s * 1e9), &r);
	report(o, r, now_ns() - t0, pre);
	return r.batches ? 0 : 1;
}

/*
 * Preloads, then runs the --op phase; with --serve, one phase per line
 * "pull" or "push" read from stdin until its end, so that a script can
 * interleave short phases with another system's on one loaded table.
 */
int run_worker(struct opts o)
{
	double pre;
	uint64_t t0;
	int rc = 0;

	ps::Start(0);
	{
		ps::KVWorker<float> kv(0, 0);
		char line[64];

		ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup +
						      ps::kServerGroup);
		t0 = now_ns();
		preload(o, &kv);
		pre = (double)o.rows * 1e9 / (double)(now_ns() - t0 + 1);
		if (o.check) {
			uint64_t bad = check_rows(o, &kv);

			if (bad) {
				fprintf(stderr, "pslite-w1: check: %llu of "
						"%llu rows differ\n",
					(unsigned long long)bad,
					(unsigned long long)o.rows);
				rc = 1;
				o.serve = false;
			}
		}
		if (!o.serve && !rc)
			rc = run_phase(o, &kv, pre);
		while (o.serve && fgets(line, sizeof(line), stdin)) {
			line[strcspn(line, "\r\n")] = '\0';
			if (strcmp(line, "pull") == 0 ||
			    strcmp(line, "push") == 0) {
				o.push = line[1] == 'u' && line[2] == 's';
				rc |= run_phase(o, &kv, pre);
			} else if (line[0]) {
				fprintf(stderr, "pslite-w1: unknown command "
						"'%s' (pull or push)\n",
					line);
				rc = 1;
				break;
			}
		}
	}
	worker_done = 1;
	ps::Finalize(0, true);
	return rc;
}

/* A loopback port free right now, for the scheduler; 0 on failure. */
int free_port()
{
	struct sockaddr_in a = {};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

	if (fd < 0)
		return 0;
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* Forks a ps-lite node of role; the child never returns. -1 on failure. */
pid_t spawn(const char *role, const struct opts &o)
{
	pid_t pid = fork();

	if (pid != 0)
		return pid;
	setenv("DMLC_ROLE", role, 1);
	if (strcmp(role, "server") == 0)
		_exit(run_server(o));
	ps::Start(0);
	ps::Finalize(0, true);
	_exit(0);
}

} // namespace

int main(int argc, char **argv)
{
	struct opts o;
	pid_t kids[2];
	int port, rc, bad = 0;
	char buf[16];

	if (parse_args(argc, argv, &o))
		return 2;
	port = free_port();
	if (!port) {
		perror("pslite-w1: no free loopback port");
		return 1;
	}
	snprintf(buf, sizeof(buf), "%d", port);
	setenv("DMLC_NUM_SERVER", "1", 1);
	setenv("DMLC_NUM_WORKER", "1", 1);
	setenv("DMLC_PS_ROOT_URI", "127.0.0.1", 1);
	setenv("DMLC_PS_ROOT_PORT", buf, 1);
	setenv("DMLC_NODE_HOST", "127.0.0.1", 1);
	signal(SIGCHLD, on_child);
	kids[0] = spawn("scheduler", o);
	kids[1] = spawn("server", o);
	if (kids[0] < 0 || kids[1] < 0) {
		perror("pslite-w1: fork");
		for (pid_t k : kids)
			if (k > 0)
				kill(k, SIGTERM);
		return 1;
	}
	setenv("DMLC_ROLE", "worker", 1);
	rc = run_worker(o);
	/* Reaped by on_child() (ok) or still to come: wait for the rest. */
	signal(SIGCHLD, SIG_DFL);
	for (pid_t k : kids) {
		int st;

		if (waitpid(k, &st, 0) == k &&
		    (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
			bad = 1;
	}
	if (bad)
		fprintf(stderr, "pslite-w1: a scheduler or server node failed\n");
	return rc || bad;
}
