/*
 * src/cache/cache.h - the worker-side vocab cache of one embedding table.
 *
 * The full table lives on the servers; the cache keeps the hot rows of one
 * table in a pool of capacity rows, fetches the misses of the next batches
 * ahead of time, and sends gradients (write-through) or evicted rows
 * (write-back) back. It never touches the network: the worker hands it the
 * callbacks below. See docs/cache.md for the design and the figures.
 *
 * Threads: a cache is used by one trainer thread. Every emb_cache_* call
 * except create comes from that thread, and every callback is called from
 * inside such a call, so on that thread too. A fetch may complete on any
 * thread the worker likes, as long as fetch_wait() reports it on the
 * trainer thread.
 *
 * A trainer step:
 *
 *	emb_cache_lookup(c, ids[b], n, out);	(rows of batch b; waits only
 *						 for rows still in flight)
 *	emb_cache_prefetch(c, ids[b + k], n);	(queue the batch k steps ahead;
 *						 its fetch overlaps compute)
 *	... forward, backward ...
 *	emb_cache_update(c, grads);		(push or apply locally)
 *
 * after prefetching batches 0 .. k-1 before the first step, and
 * emb_cache_flush() at the end of training and before a dump.
 *
 * Compact tables (row_format fp16, bf16 or int8): the pool keeps each row
 * in the table's format, as the servers send and store it, so a cached row
 * takes the compact bytes (plus the fp32 optimizer state in write-back
 * mode); lookups decode into the caller's fp32 rows. A write-back update
 * decodes the row, runs the optimizer in fp32 and rounds the result back
 * as a push on the server would (see emb_cache_update()).
 */
#ifndef EMB_CACHE_CACHE_H
#define EMB_CACHE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/optim.h"
#include "common/rowfmt.h"

struct emb_cache;

enum emb_cache_mode {
	/* Gradients go to the servers every step (server-side optimizer);
	 * cached rows hold weights only and may lag the servers by at most
	 * staleness_steps of this cache's updates. */
	EMB_CACHE_WRITE_THROUGH = 0,
	/* The optimizer runs here on cached rows (weights + state); dirty
	 * rows go back to the servers when evicted or flushed. */
	EMB_CACHE_WRITE_BACK = 1,
};

/*
 * Starts fetching the rows of ids[0..n) into dst[i * stride ...], stride
 * 4-byte words a row, in the table's row format (opts.row_format) as the
 * servers keep them: the weights alone in write-through mode
 * (emb_rowfmt_words() words; dim floats for fp32), the full row, weights
 * then the fp32 optimizer state, in write-back mode. Rows the servers do not hold yet are
 * created there as a pull would create them. Both ids and dst stay valid and
 * untouched by the cache until fetch_wait() has reported on the token.
 * Returns a token >= 0, or a negative code (the cache logs it and fails the
 * lookup that needs the rows with EMB_EFETCH).
 */
typedef int64_t (*emb_fetch_start_fn)(void *arg, const uint64_t *ids,
				      uint32_t n, float *dst, uint32_t stride);

/*
 * Reports on a token from fetch_start: 0 when the rows are in dst, -EAGAIN
 * when block is false and the fetch is still in flight, or another negative
 * code when it failed. The cache asks with block = false first and, after
 * -EAGAIN (counted as a stall), once more with block = true. Every token is
 * reported on before the cache is destroyed; tokens may be waited for in
 * any order.
 */
typedef int (*emb_fetch_wait_fn)(void *arg, int64_t token, bool block);

/*
 * Write-through: sends the gradients of distinct ids[0..n) (grads[i * dim
 * ...], duplicates already summed) for the servers' optimizer. 0 or negative.
 * A fetch started after push returned must see the update.
 */
typedef int (*emb_push_fn)(void *arg, const uint64_t *ids, uint32_t n,
			   const float *grads);

/*
 * Write-back: stores full rows (weights in the table's row format, then the
 * optimizer state; rows[i * stride ...], stride words) of distinct
 * ids[0..n) on the servers, replacing what they hold.
 * 0 or negative; on failure the cache keeps the rows dirty. A fetch started
 * after write_back returned must see the rows.
 */
typedef int (*emb_write_back_fn)(void *arg, const uint64_t *ids, uint32_t n,
				 const float *rows, uint32_t stride);

/* Which idle row to evict; docs/cache.md compares them on a Zipf stream. */
enum emb_cache_policy {
	/* Least recently used: exact order, a doubly linked list through
	 * the slots. */
	EMB_CACHE_LRU = 0,
	/* CLOCK (second chance): a reference bit per slot and a sweeping
	 * hand; no list to keep up on a hit. */
	EMB_CACHE_CLOCK = 1,
	/* W-TinyLFU: new rows enter a small LRU window; a row leaving it
	 * replaces main's LRU victim only if a frequency sketch saw it more
	 * often, so one-off rows cannot flush frequent ones. 8 bytes per row
	 * of capacity for the sketch. */
	EMB_CACHE_TINYLFU = 2,
};

struct emb_cache_ops {
	emb_fetch_start_fn fetch_start; /* required */
	emb_fetch_wait_fn fetch_wait;	/* required */
	emb_push_fn push;		/* required in write-through mode */
	emb_write_back_fn write_back;	/* required in write-back mode */
};

struct emb_cache_opts {
	uint32_t capacity;	    /* rows the pool holds, >= 1 */
	uint32_t dim;		    /* weights per row, 1..4096 */
	uint32_t max_batch;	    /* most ids (with duplicates) per batch */
	uint32_t prefetch_depth;    /* batches queued ahead, 0..64 */
	uint32_t mode;		    /* enum emb_cache_mode */
	uint32_t policy;	    /* enum emb_cache_policy */
	uint32_t staleness_steps;   /* write-through: max age of a used row,
				       in updates of this cache */
	struct emb_optim_cfg optim; /* write-back: the table's optimizer */
	struct emb_cache_ops ops;   /* callbacks; copied */
	void *arg;		    /* passed to every callback */
	uint32_t row_format;	    /* enum emb_row_format: how the table,
				       and so the pool, keeps weights */
	uint32_t rounding;	    /* write-back, compact rows: enum
				       emb_round of an update's result */
	uint64_t seed;		    /* write-back, compact rows: the table's
				       seed, in the stochastic-rounding key */
};

#define EMB_CACHE_OPTS_DEFAULT                                                 \
	((struct emb_cache_opts){.capacity = 1u << 16,                         \
				 .dim = 8,                                     \
				 .max_batch = 4096,                            \
				 .prefetch_depth = 2,                          \
				 .mode = EMB_CACHE_WRITE_THROUGH,              \
				 .policy = EMB_CACHE_TINYLFU,                  \
				 .staleness_steps = 0,                         \
				 .optim = EMB_OPTIM_CFG_DEFAULT,               \
				 .row_format = EMB_ROWFMT_FP32,                \
				 .rounding = EMB_ROUND_STOCHASTIC})

struct emb_cache_stats {
	uint64_t lookups;	/* batches looked up */
	uint64_t hits;		/* distinct ids of looked-up batches found
				   cached and fresh when their batch was
				   prepared (prefetch or lookup) */
	uint64_t misses;	/* distinct ids that had to be fetched */
	double hit_ratio;	/* hits / (hits + misses); 0 before any */
	uint64_t refetches;	/* write-through: cached rows fetched again
				   because they were older than allowed */
	uint64_t evictions;	/* rows dropped to make room */
	uint64_t admitted;	/* TinyLFU: window rows that replaced main's
				   victim */
	uint64_t rejected;	/* TinyLFU: window rows evicted instead of
				   main's victim */
	uint64_t write_backs;	/* rows sent by write_back (evict + flush) */
	uint64_t pushes;	/* push calls */
	uint64_t fetch_calls;	/* fetch_start calls */
	uint64_t sync_fetches;	/* of those, started by lookup itself */
	uint64_t rows_fetched;	/* rows requested by fetch_start */
	uint64_t bytes_fetched; /* rows_fetched * row bytes */
	uint64_t bytes_written; /* bytes of push grads and written-back rows */
	uint64_t stalls;	/* lookups that had to wait for rows */
	uint64_t wait_ns;	/* time lookups spent blocked on fetches */
	uint32_t rows;		/* rows held now */
	uint32_t pinned;	/* rows pinned now by queued/current batches */
	uint32_t dirty;		/* write-back: rows not yet written back */
	uint32_t queued;	/* prefetched batches waiting for lookup */
};

/*
 * Creates a cache; the pool and every buffer are allocated here, once.
 * 0 and *out, or EMB_EBADARG (a zero size, missing callback, unknown mode
 * or policy, depth > 64), EMB_EBADDIM, EMB_EBADOPTIM (write-back with a bad
 * optimizer), EMB_EBADFORMAT (unknown row_format or rounding) or -ENOMEM.
 */
int emb_cache_create(const struct emb_cache_opts *opts, struct emb_cache **out);

/*
 * Waits for fetches still in flight, then frees the cache. Dirty rows are
 * NOT written back: call emb_cache_flush() first. NULL is a no-op.
 */
void emb_cache_destroy(struct emb_cache *c);

/*
 * Queues the batch ids[0..n) for a later emb_cache_lookup() and starts one
 * fetch for its misses. Its rows stay pinned until that lookup's batch is
 * released. Borrows ids for the call. A fetch that would be older than
 * staleness_steps when the batch is used is left to lookup. 0, or
 * -EINVAL (n > max_batch), -EBUSY (prefetch_depth batches queued already),
 * EMB_ECACHEFULL (the pins of queued batches leave no room; the batch is not
 * queued and its lookup will run synchronously) or EMB_EWRITEBACK (evicting
 * dirty rows failed; nothing changed). A failed fetch_start is logged and
 * reported by the lookup of the batch.
 */
int emb_cache_prefetch(struct emb_cache *c, const uint64_t *ids, uint32_t n);

/*
 * Gives the weights of ids[0..n) in out[i * dim ...] (caller-owned, n * dim
 * floats). The batch becomes the current batch, pinned until the next
 * emb_cache_update() or lookup. If the oldest queued batch has exactly these
 * ids it is used and lookup blocks only for its rows still in flight;
 * otherwise the batch is prepared here (the queue is left alone). Releases
 * the previous current batch if it was not updated. 0, or -EINVAL (n >
 * max_batch), EMB_ECACHEFULL (more distinct ids than unpinned rows),
 * EMB_EFETCH (a fetch failed; the cause is logged) or EMB_EWRITEBACK. On
 * error there is no current batch.
 */
int emb_cache_lookup(struct emb_cache *c, const uint64_t *ids, uint32_t n,
		     float *out);

/*
 * Like emb_cache_lookup(), but sets ptrs[i] to the cached weights of ids[i]
 * instead of copying (of a compact table: to the batch's rows decoded once
 * per distinct id into a buffer of the cache). The pointers stay valid
 * until the next update, lookup or cancel call; rows must not be written
 * through them.
 */
int emb_cache_lookup_ptrs(struct emb_cache *c, const uint64_t *ids, uint32_t n,
			  const float **ptrs);

/*
 * Applies gradients grads[i * dim ...] of the current batch's positions (as
 * passed to lookup, duplicates allowed) and releases the batch. Duplicate
 * ids' gradients are summed first and each distinct id is updated once, as
 * the store does. Write-through: one push of the distinct ids. Write-back:
 * emb_optim_apply() on the cached rows, which become dirty. Counts one step.
 * 0, or -EINVAL (no current batch), EMB_ENONFINITE (nothing applied, see
 * below) or EMB_EPUSH (push failed; logged; the batch is released and the
 * step not counted).
 *
 * Write-back on compact rows: each row is decoded, updated in fp32 and
 * encoded back with opts.rounding; stochastic rounding uses the key
 * emb_rowfmt_sr_key(seed, id, count) the store uses for a push. The store's
 * count is the row's accesses, its creation included; the cache cannot
 * see it (pulls do not carry it), so it numbers a row's updates from its
 * fetch on as if the fetch had created the row: count 1 when fetched, one
 * more before each update. For a row the fetch did create (a new id), and
 * a table without an eviction policy (under which pulls count too), the
 * bits are those the server would have written for the same gradients
 * pushed to it. A row fetched again after a write-back starts over at 1
 * where the server, whose assign zeroed its count, would use 0 then 1:
 * the same rounding, other random bits. A batch whose result would not be
 * finite or would not fit the format (fp16 beyond 65504) is refused whole
 * with EMB_ENONFINITE, as the store refuses such a push.
 */
int emb_cache_update(struct emb_cache *c, const float *grads);
/* After emb_cache_update() returned EMB_ENONFINITE (nothing was applied
 * and the batch is released): the first bad id, in distinct-id order, and
 * the element of its gradient (or of the sum of its gradients) that is a
 * NaN or an infinity, or UINT32_MAX when the gradients were finite but the
 * row the write-back update would make is not (or, compact, does not fit
 * the table's format). */
void emb_cache_nonfinite(const struct emb_cache *c, uint64_t *id,
			 uint32_t *elem);

/*
 * Write-back: sends every dirty row to write_back, max_batch rows per call.
 * Rows stay cached (and pinned, if they were) and become clean; fetches in
 * flight are left alone, as their rows are never dirty. 0 or EMB_EWRITEBACK
 * (rows sent before the failure are clean). A no-op returning 0 in
 * write-through mode. Call it at the end of training and before a dump.
 */
int emb_cache_flush(struct emb_cache *c);

/*
 * Drops every queued prefetch (waiting for its fetch) and the current batch,
 * unpinning their rows. For a trainer that changes its plan, e.g. at the end
 * of an epoch. Fetch failures are logged and otherwise ignored.
 */
void emb_cache_cancel(struct emb_cache *c);

void emb_cache_stats(const struct emb_cache *c, struct emb_cache_stats *out);

/* 4-byte words per cached row (4 bytes each): the weights in the table's
 * format (dim for fp32), plus the optimizer state in write-back mode. */
uint32_t emb_cache_row_floats(const struct emb_cache *c);

#endif
