/*
 * tools/bench_client.c - embstore-bench's network backend: the client
 * library against running servers (--servers), a cluster found through its
 * scheduler (--sched), or one joined as a worker from the environment.
 *
 * Threads: open/close/mem on the main thread. With a server list each
 * worker thread gets a client (a connection per server) of its own; a
 * worker joined from the environment registers once and its threads share
 * that client, which is thread-safe.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/embstore.h"

struct client_be {
	const struct emb_bench_cfg *cfg; /* borrowed for the run */
	struct emb_client *shared;  /* the setup client, or the joined one */
	struct emb_client_table *t; /* the table, through shared */
	struct emb_table_spec spec; /* created with */
};

struct client_ctx {
	struct client_be *be;	    /* shared backend */
	struct emb_client *c;	    /* own client, or be->shared */
	struct emb_client_table *t; /* the table through c */
	float *scratch;		    /* batch * dim: preload's output */
};

static int connect_client(const struct emb_bench_cfg *cfg,
			  struct emb_client **out)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;

	co.servers = cfg->servers;
	co.transport = cfg->transport;
	co.name = "embstore-bench";
	co.timeout_ms = 60000;
	if (cfg->from_env)
		return emb_client_from_env(&co, out);
	return emb_client_create(&co, out);
}

static int client_open(const struct emb_bench_cfg *cfg, void **out)
{
	struct client_be *b = calloc(1, sizeof(*b));
	int rc;

	if (!b)
		return -ENOMEM;
	b->cfg = cfg;
	b->spec = (struct emb_table_spec){.name = cfg->table,
					  .dim = cfg->dim,
					  .optim = cfg->optim,
					  .init = EMB_INIT_CFG_DEFAULT,
					  .seed = cfg->seed};
	rc = connect_client(cfg, &b->shared);
	if (rc)
		goto err_free;
	rc = emb_client_table_create(b->shared, &b->spec, &b->t);
	if (rc) {
		fprintf(stderr, "embstore-bench: table %s: %s\n", cfg->table,
			emb_strerror(rc));
		goto err_destroy;
	}
	*out = b;
	return 0;

err_destroy:
	emb_client_destroy(b->shared);
err_free:
	free(b);
	return rc;
}

static void client_close(void *be)
{
	struct client_be *b = be;

	if (!b)
		return;
	emb_client_table_close(b->t);
	if (b->cfg->from_env)
		emb_client_finish(b->shared);
	emb_client_destroy(b->shared);
	free(b);
}

static int client_thread_open(void *be, uint32_t thread, void **out)
{
	struct client_be *b = be;
	struct client_ctx *x = calloc(1, sizeof(*x));
	int rc;

	(void)thread;
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
	*out = x;
	return 0;

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
	return emb_client_table_pull(x->t, ids, n, x->scratch, 0, NULL);
}

static int client_pull(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct client_ctx *x = ctx;

	return emb_client_table_pull(x->t, ids, n, out, 0, NULL);
}

static int client_push(void *ctx, const uint64_t *ids, uint32_t n,
		       const float *grads)
{
	struct client_ctx *x = ctx;

	return emb_client_table_push(x->t, ids, n, grads, 0, 0);
}

/* The servers' own accounting of the table, summed (STATS). */
static int client_mem(void *be, struct emb_bench_mem *out)
{
	struct client_be *b = be;
	struct emb_client_table_stats st;
	int rc = emb_client_table_stats(b->t, &st);

	if (rc)
		return rc;
	out->rows = st.rows;
	out->bytes = st.bytes;
	return 0;
}

static const char *client_transport(void *be)
{
	struct client_be *b = be;

	return emb_client_transport(b->shared);
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
    .push = client_push,
    .mem = client_mem,
    .transport = client_transport,
};
