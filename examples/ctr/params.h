/*
 * examples/ctr/params.h - where the CTR model's parameters live: embstore
 * servers (through the client library and its vocab cache) or, with
 * opts.local, tables in this process (local.h). The trainer sees one
 * interface.
 * One thread per handle.
 */
#ifndef EMB_EXAMPLES_CTR_PARAMS_H
#define EMB_EXAMPLES_CTR_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <embstore.h>

struct ctr_params;

struct ctr_params_opts {
	bool local;	       /* in-process tables, no servers */
	const char *servers;   /* "host:port,..."; NULL = from environment */
	const char *transport; /* "tcp", "rdma", "auto"; NULL = EMB_TRANSPORT
				  or tcp */
	uint32_t cache_rows;   /* vocab cache rows per sparse table; 0 = off */
	uint32_t prefetch;     /* batches fetched ahead by the cache */
	uint32_t staleness;    /* cached rows older than this are refetched */
	uint64_t seed;	       /* initial values */
	uint32_t max_batch;    /* ids per lookup */
	struct emb_lifecycle_cfg life; /* admission and eviction of the sparse
					  tables (emb, wide); not the MLP */
	uint32_t row_format; /* enum emb_row_format of the sparse tables on
				the servers (not --local); the MLP is fp32 */
};

#define CTR_PARAMS_OPTS_DEFAULT                                                \
	((struct ctr_params_opts){.transport = NULL,                           \
				  .cache_rows = 1u << 18,                      \
				  .prefetch = 1,                               \
				  .staleness = 2,                              \
				  .max_batch = 512 * 26})

int ctr_params_open(const struct ctr_params_opts *opts,
		    struct ctr_params **out);
void ctr_params_close(struct ctr_params *p);

uint32_t ctr_params_rank(const struct ctr_params *p);
uint32_t ctr_params_workers(const struct ctr_params *p);

/* Queues the next batch's ids so their rows travel while this one runs. */
int ctr_params_prefetch(struct ctr_params *p, const uint64_t *ids, uint32_t n);
/* Embedding rows (n x 16) and wide weights (n) of ids, for training. */
int ctr_params_lookup(struct ctr_params *p, const uint64_t *ids, uint32_t n,
		      float *emb, float *wide);
/* The MLP: CTR_DENSE_ROWS rows of CTR_DENSE_ROW floats. */
int ctr_params_pull_dense(struct ctr_params *p, float *dense);
/* Gradients of the last looked-up batch, and of the MLP. */
int ctr_params_push(struct ctr_params *p, const float *g_emb,
		    const float *g_wide, const float *g_dense, uint64_t step);
/* Rows for evaluation: never creates rows; unseen ids read as zeros. */
int ctr_params_eval_rows(struct ctr_params *p, const uint64_t *ids, uint32_t n,
			 float *emb, float *wide);
/*
 * Sets the training mode of every table (enum emb_mode): every worker calls
 * it with the same values. A no-op in local mode.
 */
int ctr_params_set_mode(struct ctr_params *p, uint32_t mode,
			uint32_t staleness);
/* A synchronous step in which this worker has no examples. */
int ctr_params_push_empty(struct ctr_params *p, uint64_t step);
/*
 * Waits for every worker (a no-op for one worker or local mode). 0, or the
 * cluster's error.
 */
int ctr_params_barrier(struct ctr_params *p, const char *name);
/* The cluster's servers as "host:port,...", or -EINVAL in local mode. */
int ctr_params_servers(struct ctr_params *p, char *buf, size_t cap);
/* End of an epoch: flushes cached updates to the servers. */
int ctr_params_epoch_end(struct ctr_params *p);

#endif
