/*
 * tools/bench.h - pieces of embstore-bench shared between its files: the run
 * configuration, the id streams, and the backend vtable the timed loop calls.
 *
 * A backend is whatever serves pull and push: the in-process store today,
 * remote servers over a transport (and a worker cache in front) later. The
 * loop only sees struct emb_bench_backend, so a new backend is one more file
 * and one more entry in the selection in embstore-bench.c.
 *
 * Threads: open, close, mem, thread_open and thread_close run on the main
 * thread; each worker thread then uses only its own context, and the calls
 * of different workers run at the same time.
 */
#ifndef EMB_TOOLS_BENCH_H
#define EMB_TOOLS_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/init.h"
#include "common/lifecycle.h"
#include "common/optim.h"

enum emb_bench_op {
	EMB_BENCH_PULL = 1, /* gather rows */
	EMB_BENCH_PUSH = 2, /* apply gradients */
	EMB_BENCH_STEP = 3, /* pull then push of the same batch */
	EMB_BENCH_MIX = 4,  /* each batch a pull or a push, at random */
};

enum emb_dist_kind {
	EMB_DIST_UNIFORM = 1,
	EMB_DIST_ZIPF = 2,
};

struct emb_dist {
	uint32_t kind;	 /* enum emb_dist_kind */
	double exponent; /* zipf: P(rank k) ~ 1 / k^exponent, > 0 */
};

struct emb_bench_cfg {
	const char *table;	    /* table name */
	uint64_t rows;		    /* rows preloaded; ids drawn from these */
	uint32_t dim;		    /* floats per row */
	uint32_t batch;		    /* ids per batch */
	uint32_t threads;	    /* worker threads */
	struct emb_optim_cfg optim; /* applied by push */
	struct emb_init_cfg init;   /* new rows' values */
	uint32_t row_format;	    /* enum emb_row_format of the table's
				       weights (store backend) */
	uint64_t seed;		    /* id streams and table seed */
	struct emb_lifecycle_cfg life; /* admission and eviction (store and
					  client backends) */
	/* store and rocksdb backends only */
	uint64_t mem_limit;	    /* the table's memory limit; 0 = none
				       (rocksdb: block cache + memtables) */
	const char *tier_dir;	    /* device tier file in DIR, or NULL
				       (rocksdb: the database's parent) */
	/* client backend only */
	const char *servers;	    /* "host:port,..." */
	const char *transport;	    /* "tcp", "rdma" or "auto" */
	uint32_t pull_mode;	    /* enum emb_pull_mode */
	bool from_env;		    /* join the cluster from the environment */
	const uint8_t *auth_token;  /* sent to servers and scheduler, or NULL */
	uint32_t auth_token_len;    /* bytes */
	bool preload;		    /* create the rows before timing */
	uint32_t cache_rows;	    /* a cached table per thread; 0 = none */
	uint32_t prefetch;	    /* cache: batches fetched ahead */
	uint32_t staleness;	    /* cache, write-through: max row age */
	uint32_t cache_mode;	    /* enum emb_cached_mode */
	uint32_t cache_policy;	    /* enum emb_cached_policy */
	uint32_t tables;	    /* tables a batch goes to (features of a
				       step), 1..EMB_BENCH_TABLES_MAX */
	bool multi;		    /* tables > 1: one pull_many/push_many
				       per batch, not one call per table */
};

/* Most --tables: a model's sparse features, with room. */
#define EMB_BENCH_TABLES_MAX 256

/*
 * What a backend moved, summed over threads since open; the bench reports
 * the difference across the timed phase. Zero where it does not apply.
 */
struct emb_bench_report {
	bool cached;		 /* a cache sits in front */
	uint64_t hits;		 /* cache: distinct ids found */
	uint64_t misses;	 /* cache: distinct ids fetched */
	uint64_t bytes_fetched;	 /* row bytes pulled from the servers */
	uint64_t bytes_written;	 /* gradient and written-back row bytes */
	uint64_t wire_bytes_in;	 /* frames received, headers and ids too */
	uint64_t wire_bytes_out; /* frames sent */
	uint64_t rows_read;	 /* one-sided: rows READ and validated */
	uint64_t rows_fallback;	 /* one-sided: rows pulled two-sided */
	uint64_t stalls;	 /* cache: lookups that waited for rows */
	uint64_t wait_ns;	 /* cache: time they waited */
};

/* The memory a backend holds for the table, for bytes_per_row. */
struct emb_bench_mem {
	uint64_t rows;	/* rows the backend holds */
	uint64_t bytes; /* bytes of table memory */
	/* Its parts, where the backend knows them (0 otherwise): row
	 * records in slabs, the id index, and one record's size. bytes -
	 * slab_bytes - index_bytes is the table's fixed cost. */
	uint64_t slab_bytes;
	uint64_t index_bytes;
	uint64_t record_bytes;
	/* Admission and eviction counters (store and client backends). */
	uint64_t filter_bytes;	    /* admission filter, part of bytes */
	uint64_t pulls_unadmitted;  /* pulled ids not admitted yet */
	uint64_t pushes_unadmitted; /* pushed ids dropped: not admitted */
	uint64_t rows_created;	    /* rows ever made */
	uint64_t rows_evicted;	    /* rows removed by eviction */
	/* A tiered table's device tier (store backend), summed since
	 * open: rows on the device now, the file's size, 4 KiB reads and
	 * writes, and time spent waiting for reads. */
	uint64_t rows_cold;
	uint64_t tier_file_bytes;
	uint64_t tier_reads;
	uint64_t tier_writes;
	uint64_t tier_read_ns;
};

/*
 * Every function returns 0 (or a count >= 0 where noted) or a negative code.
 * Pointers passed in are borrowed for the call.
 */
struct emb_bench_backend {
	const char *name;
	/* ids are row indices in [0, rows), not hashed feature ids */
	bool dense_ids;
	int (*open)(const struct emb_bench_cfg *cfg, void **out);
	void (*close)(void *be);
	/* Per-thread context (a connection, a cache); closed before close(). */
	int (*thread_open)(void *be, uint32_t thread, void **ctx);
	void (*thread_close)(void *ctx);
	/* Creates (or loads) rows ids[0..n) with their initial values. */
	int (*preload)(void *ctx, const uint64_t *ids, uint32_t n);
	/* Gathers weights of ids[0..n) into out[i * dim ...]. */
	int (*pull)(void *ctx, const uint64_t *ids, uint32_t n, float *out);
	/*
	 * Optional (NULL: pull): gathers the weights of ids[0..n) without
	 * creating rows (a missing row reads as zeros) nor counting an
	 * admission sighting, so that --verify's check leaves the rows as
	 * the run made them.
	 */
	int (*peek)(void *ctx, const uint64_t *ids, uint32_t n, float *out);
	/* Applies grads[i * dim ...] to ids[0..n). */
	int (*push)(void *ctx, const uint64_t *ids, uint32_t n,
		    const float *grads);
	int (*mem)(void *be, struct emb_bench_mem *out);
	/* The transport in use ("tcp", "rdma"), or NULL in-process. */
	const char *(*transport)(void *be);
	/*
	 * Optional (NULL = no cache): announces a batch that a later pull
	 * will ask for, cfg.prefetch batches ahead, so its fetch overlaps.
	 */
	int (*prefetch)(void *ctx, const uint64_t *ids, uint32_t n);
	/* Optional: traffic and cache counters, see struct above. */
	void (*report)(void *be, struct emb_bench_report *out);
	/*
	 * Optional (NULL: rank 0 of 1): this process's worker rank and the
	 * number of worker processes, so --verify gives each its own rows.
	 */
	void (*rank)(void *be, uint32_t *rank, uint32_t *nworkers);
	/*
	 * Optional: called once on the main thread after the preload and
	 * before the warmup, to bring the table to the state the timed
	 * phase starts from (RocksDB: flushed, compacted, its cache filled).
	 */
	int (*settle)(void *be);
};

extern const struct emb_bench_backend emb_bench_store_backend;
extern const struct emb_bench_backend emb_bench_raw_backend;
/* raw-index-gather: the raw gather through a hashed index (bench_raw.c). */
extern const struct emb_bench_backend emb_bench_raw_index_backend;
extern const struct emb_bench_backend emb_bench_client_backend;
/* embstore-bench-rocks's in-process backend: a RocksDB database
 * (bench_rocks.c), built where librocksdb is found. */
extern const struct emb_bench_backend emb_bench_rocks_backend;

/*
 * One thread's id stream: draws ranks (0 = hottest) from the distribution
 * and maps each through a bijection of [0, rows) so hot rows are spread
 * over the table instead of adjacent. A plain struct, one per thread.
 */
struct emb_idgen {
	uint64_t rng;	   /* splitmix64 state */
	uint64_t rows;	   /* ids are in [0, rows) */
	uint64_t mult;	   /* rank -> row: rank * mult mod rows, coprime */
	uint32_t kind;	   /* enum emb_dist_kind */
	double s;	   /* zipf exponent */
	double h_x1;	   /* rejection-inversion constants, see bench_ids.c */
	double h_n;
	double s_accept;
};

/* Parses "uniform" or "zipf:S" (0 < S <= 10). 0, or -EINVAL. */
int emb_dist_parse(const char *s, struct emb_dist *out);

/*
 * Sets up the stream of thread `stream` under seed: the same (dist, rows,
 * seed, stream) always yields the same ids. rows must be in 1..2^32. 0, or
 * -EINVAL.
 */
int emb_idgen_init(struct emb_idgen *g, const struct emb_dist *dist,
		   uint64_t rows, uint64_t seed, uint32_t stream);

/* Writes the next n row indices (each in [0, rows)) to out. */
void emb_idgen_fill(struct emb_idgen *g, uint64_t *out, uint32_t n);

/* The row a rank maps to; exposed so tests and preload agree with fill. */
static inline uint64_t emb_idgen_row(const struct emb_idgen *g, uint64_t rank)
{
	return (rank * g->mult) % g->rows;
}

#endif
