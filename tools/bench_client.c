/*
 * tools/bench_client.c - embstore-bench's network backend: the client
 * library against running servers (--servers), a cluster found through its
 * scheduler (--sched), or one joined as a worker from the environment.
 *
 * With --cache each worker thread also gets a cached table
 * (emb_cached_table) of its own over its table handle, as each trainer
 * thread of a job would: pull is its lookup, push its push_grads, and
 * prefetch queues the batch --prefetch steps ahead.
 *
 * With --tables N a batch goes to N tables of the same spec (the sparse
 * features of a step): the table, then NAME.1 ... NAME.N-1, each given the
 * batch's ids, pulled and pushed by one call per table in turn (what a
 * model with a module per table does) or, with --multi, by one
 * emb_client_pull_many() and one emb_client_push_many() per batch.
 *
 * Threads: open/close/mem/report on the main thread. With a server list
 * each worker thread gets a client (a connection per server) of its own; a
 * worker joined from the environment registers once and its threads share
 * that client, which is thread-safe.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/embstore.h"

struct client_be {
	const struct emb_bench_cfg *cfg; /* borrowed for the run */
	struct emb_client *shared;  /* the setup client, or the joined one */
	struct emb_client_table *t; /* the table, through shared */
	struct emb_client_table **more; /* tables 1..tables-1, through shared */
	struct emb_table_spec spec;	/* created with */
	struct client_ctx **ctxs;	/* cfg->threads, for report */
};

struct client_ctx {
	struct client_be *be;	      /* shared backend */
	struct emb_client *c;	      /* own client, or be->shared */
	struct emb_client_table *t;   /* the table through c */
	struct emb_client_table **tt; /* every table through c: tables */
	struct emb_table_batch *mb;   /* --tables: one entry per table */
	float *scratch;		      /* batch * dim: preload's output */
	float *outs;		      /* (tables - 1) * batch * dim: the
					 other tables' rows */
	struct emb_cached_table *ct;  /* --cache, or NULL */
	uint64_t rows_fetched;	      /* uncached: distinct ids pulled */
	uint64_t rows_pushed;	      /* uncached: distinct ids pushed */
	uint32_t thread;	      /* index into be->ctxs */
};

static int connect_client(const struct emb_bench_cfg *cfg,
			  struct emb_client **out)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;

	co.servers = cfg->servers;
	co.transport = cfg->transport;
	co.pull_mode = cfg->pull_mode;
	/* Locations for every row, with room for the hash to spread them. */
	if (cfg->rows && cfg->rows <= (1u << 29))
		co.loc_cache_rows = (uint32_t)(2 * cfg->rows);
	co.name = "embstore-bench";
	/* The library's deadline (30 s), the one docs/api.md gives. */
	co.auth_token = cfg->auth_token;
	co.auth_token_len = cfg->auth_token_len;
	if (cfg->from_env)
		return emb_client_from_env(&co, out);
	return emb_client_create(&co, out);
}

/* "NAME.i": table i of a --tables run (table 0 is NAME itself). */
static void table_name(const struct emb_bench_cfg *cfg, uint32_t i, char *buf,
		       size_t cap)
{
	snprintf(buf, cap, "%s.%u", cfg->table, i);
}

static void tables_close(struct emb_client_table **tt, uint32_t n)
{
	for (uint32_t i = 0; tt && i < n; i++)
		emb_client_table_close(tt[i]);
	free(tt);
}

/* Creates tables 1..tables-1 through b->shared (same spec as the first). */
static int tables_create(struct client_be *b)
{
	const struct emb_bench_cfg *cfg = b->cfg;
	char name[128];
	uint32_t i;
	int rc = 0;

	if (cfg->tables <= 1)
		return 0;
	b->more = calloc(cfg->tables, sizeof(*b->more));
	if (!b->more)
		return -ENOMEM;
	for (i = 1; i < cfg->tables; i++) {
		struct emb_table_spec sp = b->spec;

		table_name(cfg, i, name, sizeof(name));
		sp.name = name;
		rc = emb_client_table_create(b->shared, &sp, &b->more[i]);
		if (rc) {
			fprintf(stderr, "embstore-bench: table %s: %s\n", name,
				emb_strerror(rc));
			break;
		}
	}
	if (rc) {
		tables_close(b->more, i);
		b->more = NULL;
	}
	return rc;
}

static int client_open(const struct emb_bench_cfg *cfg, void **out)
{
	struct client_be *b = calloc(1, sizeof(*b));
	int rc;

	if (!b)
		return -ENOMEM;
	b->ctxs = calloc(cfg->threads, sizeof(*b->ctxs));
	if (!b->ctxs) {
		free(b);
		return -ENOMEM;
	}
	b->cfg = cfg;
	b->spec = (struct emb_table_spec){.struct_size =
					      sizeof(struct emb_table_spec),
					  .name = cfg->table,
					  .dim = cfg->dim,
					  .optim = cfg->optim,
					  .init = cfg->init,
					  .seed = cfg->seed,
					  .life = cfg->life,
					  .row_format = cfg->row_format};
	rc = connect_client(cfg, &b->shared);
	if (rc)
		goto err_free;
	rc = emb_client_table_create(b->shared, &b->spec, &b->t);
	if (rc) {
		fprintf(stderr, "embstore-bench: table %s: %s\n", cfg->table,
			emb_strerror(rc));
		goto err_destroy;
	}
	rc = tables_create(b);
	if (rc)
		goto err_close;
	*out = b;
	return 0;

err_close:
	emb_client_table_close(b->t);
err_destroy:
	emb_client_destroy(b->shared);
err_free:
	free(b->ctxs);
	free(b);
	return rc;
}

static void client_close(void *be)
{
	struct client_be *b = be;

	if (!b)
		return;
	emb_client_table_close(b->t);
	tables_close(b->more, b->cfg->tables);
	if (b->cfg->from_env)
		emb_client_finish(b->shared);
	emb_client_destroy(b->shared);
	free(b->ctxs);
	free(b);
}

static int cache_open(struct client_ctx *x)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	const struct emb_bench_cfg *cfg = x->be->cfg;

	co.capacity = cfg->cache_rows;
	co.max_batch = cfg->batch;
	co.prefetch_depth = cfg->prefetch;
	co.staleness_steps = cfg->staleness;
	co.mode = cfg->cache_mode;
	co.policy = cfg->cache_policy;
	co.rank = emb_client_rank(x->c);
	return emb_cached_table_create(x->t, &co, &x->ct);
}

/* Tables 1.. of a thread's own client (or the shared ones), and buffers. */
static void thread_tables_close(struct client_ctx *x)
{
	const struct emb_bench_cfg *cfg = x->be->cfg;

	if (x->tt && x->c != x->be->shared)
		for (uint32_t i = 1; i < cfg->tables; i++)
			emb_client_table_close(x->tt[i]);
	free(x->tt);
	free(x->mb);
	free(x->outs);
	x->tt = NULL;
	x->mb = NULL;
	x->outs = NULL;
}

static int thread_tables_open(struct client_ctx *x)
{
	const struct emb_bench_cfg *cfg = x->be->cfg;
	char name[128];
	int rc = 0;

	if (cfg->tables <= 1)
		return 0;
	x->tt = calloc(cfg->tables, sizeof(*x->tt));
	x->mb = calloc(cfg->tables, sizeof(*x->mb));
	x->outs = malloc((size_t)(cfg->tables - 1) * cfg->batch * cfg->dim *
			 sizeof(float));
	if (!x->tt || !x->mb || !x->outs) {
		rc = -ENOMEM;
		goto err;
	}
	x->tt[0] = x->t;
	for (uint32_t i = 1; i < cfg->tables; i++) {
		if (x->c == x->be->shared) {
			x->tt[i] = x->be->more[i];
			continue;
		}
		table_name(cfg, i, name, sizeof(name));
		rc = emb_client_table_open(x->c, name, &x->tt[i]);
		if (rc)
			goto err;
	}
	for (uint32_t i = 0; i < cfg->tables; i++) {
		x->mb[i] = EMB_SIZED(struct emb_table_batch);
		x->mb[i].table = x->tt[i];
	}
	return 0;
err:
	thread_tables_close(x);
	return rc;
}

/*
 * A batch over every table: the ids (the same for each), rows into out
 * for the first table and x->outs for the others; grads (push) are the
 * same for each table.
 */
static int tables_op(struct client_ctx *x, const uint64_t *ids, uint32_t n,
		     float *out, const float *grads)
{
	const struct emb_bench_cfg *cfg = x->be->cfg;
	size_t stride = (size_t)n * cfg->dim;
	int rc = 0;

	for (uint32_t i = 0; i < cfg->tables; i++) {
		x->mb[i].ids = ids;
		x->mb[i].n = n;
		x->mb[i].rows = grads ? (float *)grads
				: i   ? x->outs + (i - 1) * stride
				      : out;
	}
	if (cfg->multi)
		return grads
			   ? emb_client_push_many(x->c, x->mb, cfg->tables, 0,
						  0)
			   : emb_client_pull_many(x->c, x->mb, cfg->tables, 0);
	/* One call per table, each waiting for the one before. */
	for (uint32_t i = 0; !rc && i < cfg->tables; i++)
		rc = grads
			 ? emb_client_table_push(x->tt[i], ids, n, grads, 0, 0)
			 : emb_client_table_pull(x->tt[i], ids, n,
						 x->mb[i].rows, 0, NULL);
	return rc;
}

static int client_thread_open(void *be, uint32_t thread, void **out)
{
	struct client_be *b = be;
	struct client_ctx *x = calloc(1, sizeof(*x));
	int rc;

	if (!x)
		return -ENOMEM;
	x->be = b;
	x->scratch =
	    malloc((size_t)b->cfg->batch * b->cfg->dim * sizeof(float));
	if (!x->scratch) {
		rc = -ENOMEM;
		goto err_free;
	}
	if (b->cfg->from_env) {
		x->c = b->shared;
		x->t = b->t;
	} else {
		rc = connect_client(b->cfg, &x->c);
		if (rc)
			goto err_free;
		rc = emb_client_table_open(x->c, b->cfg->table, &x->t);
		if (rc) {
			emb_client_destroy(x->c);
			goto err_free;
		}
	}
	if (b->cfg->cache_rows) {
		rc = cache_open(x);
		if (rc)
			goto err_close;
	}
	rc = thread_tables_open(x);
	if (rc)
		goto err_close;
	x->thread = thread;
	b->ctxs[thread] = x;
	*out = x;
	return 0;

err_close:
	emb_cached_table_destroy(x->ct);
	thread_tables_close(x);
	if (x->c != b->shared) {
		emb_client_table_close(x->t);
		emb_client_destroy(x->c);
	}
err_free:
	free(x->scratch);
	free(x);
	return rc;
}

static void client_thread_close(void *ctx)
{
	struct client_ctx *x = ctx;

	if (!x)
		return;
	x->be->ctxs[x->thread] = NULL;
	if (x->ct) {
		/* Rows trained here belong on the servers before we go. */
		int rc = emb_cached_table_flush(x->ct);

		if (rc)
			fprintf(stderr, "embstore-bench: cache flush: %s\n",
				emb_strerror(rc));
		emb_cached_table_destroy(x->ct);
	}
	thread_tables_close(x);
	if (x->c != x->be->shared) {
		emb_client_table_close(x->t);
		emb_client_destroy(x->c);
	}
	free(x->scratch);
	free(x);
}

static int client_preload(void *ctx, const uint64_t *ids, uint32_t n)
{
	struct client_ctx *x = ctx;

	if (!x->be->cfg->preload)
		return 0;
	/* A pull creates missing rows on the servers, as training does. */
	for (uint32_t i = 1; i < x->be->cfg->tables; i++) {
		int rc = emb_client_table_pull(x->tt[i], ids, n, x->scratch, 0,
					       NULL);

		if (rc)
			return rc;
	}
	return emb_client_table_pull(x->t, ids, n, x->scratch, 0, NULL);
}

/*
 * Distinct ids the client sent since *last (its ids_sent counter). Exact
 * for a thread's own client; a shared one mixes in the other threads'.
 */
static uint64_t sent_since(struct client_ctx *x, uint64_t *last)
{
	struct emb_client_stats s = EMB_SIZED(struct emb_client_stats);
	uint64_t d;

	emb_client_stats(x->c, &s);
	d = s.ids_sent - *last;
	*last = s.ids_sent;
	return d;
}

static int client_pull(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct client_ctx *x = ctx;
	uint64_t last = 0;
	int rc;

	if (x->ct)
		return emb_cached_table_lookup(x->ct, ids, n, out);
	sent_since(x, &last);
	if (x->tt)
		rc = tables_op(x, ids, n, out, NULL);
	else
		rc = emb_client_table_pull(x->t, ids, n, out, 0, NULL);
	x->rows_fetched += sent_since(x, &last);
	return rc;
}

static int client_peek(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct client_ctx *x = ctx;

	return emb_client_table_pull(x->t, ids, n, out, EMB_CLIENT_NOCREATE,
				     NULL);
}

static int client_push(void *ctx, const uint64_t *ids, uint32_t n,
		       const float *grads)
{
	struct client_ctx *x = ctx;
	uint64_t last = 0;
	int rc;

	if (x->ct)
		return emb_cached_table_push_grads(x->ct, grads);
	sent_since(x, &last);
	if (x->tt)
		rc = tables_op(x, ids, n, NULL, grads);
	else
		rc = emb_client_table_push(x->t, ids, n, grads, 0, 0);
	x->rows_pushed += sent_since(x, &last);
	return rc;
}

static int client_prefetch(void *ctx, const uint64_t *ids, uint32_t n)
{
	struct client_ctx *x = ctx;
	int rc;

	if (!x->ct)
		return 0;
	rc = emb_cached_table_prefetch(x->ct, ids, n);
	/* A batch that does not fit beside the queued ones is fetched by its
	 * own lookup instead: slower, not wrong. */
	return rc == EMB_ECACHEFULL ? 0 : rc;
}

/* The servers' own accounting of the table, summed (STATS). */
static int client_mem(void *be, struct emb_bench_mem *out)
{
	struct client_be *b = be;
	struct emb_client_table_stats st =
	    EMB_SIZED(struct emb_client_table_stats);
	int rc = emb_client_table_stats(b->t, &st);

	if (rc)
		return rc;
	out->rows = st.rows;
	out->bytes = st.bytes;
	out->slab_bytes = st.slab_bytes;
	out->index_bytes = st.index_bytes;
	out->record_bytes = st.row_bytes;
	out->filter_bytes = st.admit_filter_bytes;
	out->pulls_unadmitted = st.pulls_unadmitted;
	out->pushes_unadmitted = st.pushes_unadmitted;
	out->rows_created = st.rows_created;
	out->rows_evicted = st.rows_evicted;
	return 0;
}

static const char *client_transport(void *be)
{
	struct client_be *b = be;

	return emb_client_transport(b->shared);
}

static void add_wire(struct emb_client *c, struct emb_bench_report *out)
{
	struct emb_client_stats s = EMB_SIZED(struct emb_client_stats);

	emb_client_stats(c, &s);
	out->wire_bytes_in += s.bytes_in;
	out->wire_bytes_out += s.bytes_out;
	out->rows_read += s.rows_read;
	out->rows_fallback += s.rows_fallback;
}

static void client_report(void *be, struct emb_bench_report *out)
{
	struct client_be *b = be;
	const uint64_t row = (uint64_t)b->cfg->dim * sizeof(float);

	memset(out, 0, sizeof(*out));
	out->cached = b->cfg->cache_rows != 0;
	add_wire(b->shared, out);
	for (uint32_t i = 0; i < b->cfg->threads; i++) {
		struct client_ctx *x = b->ctxs[i];
		struct emb_cached_table_stats st =
		    EMB_SIZED(struct emb_cached_table_stats);

		if (!x)
			continue;
		if (x->c != b->shared)
			add_wire(x->c, out);
		if (!x->ct) {
			out->bytes_fetched += x->rows_fetched * row;
			out->bytes_written += x->rows_pushed * row;
			continue;
		}
		emb_cached_table_stats(x->ct, &st);
		out->hits += st.hits;
		out->misses += st.misses;
		out->bytes_fetched += st.bytes_fetched;
		out->bytes_written += st.bytes_written;
		out->stalls += st.stalls;
		out->wait_ns += st.wait_ns;
	}
}

static void client_rank(void *be, uint32_t *rank, uint32_t *nworkers)
{
	struct client_be *b = be;

	*rank = 0;
	*nworkers = 1;
	if (b->cfg->from_env) {
		*rank = emb_client_rank(b->shared);
		*nworkers = emb_client_nworkers(b->shared);
	}
}

const struct emb_bench_backend emb_bench_client_backend = {
    .name = "client",
    .dense_ids = false,
    .open = client_open,
    .close = client_close,
    .thread_open = client_thread_open,
    .thread_close = client_thread_close,
    .preload = client_preload,
    .pull = client_pull,
    .peek = client_peek,
    .push = client_push,
    .mem = client_mem,
    .transport = client_transport,
    .prefetch = client_prefetch,
    .report = client_report,
    .rank = client_rank,
};
