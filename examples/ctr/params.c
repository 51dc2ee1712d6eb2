/*
 * examples/ctr/params.c - the CTR model's parameters in embstore tables.
 *
 * Three tables: "ctr_emb" (dim 16, Adagrad), "ctr_wide" (dim 1, Adagrad) and
 * "ctr_mlp" (dense rows of 256 floats, Adam). The MLP's initial values need
 * per-layer scales, so the first worker assigns them once; the others wait
 * until every dense row exists (no-create pulls) before training. Local mode
 * runs the same tables, optimizers and initial values in this process
 * (local.h), through libembstore's public API alone.
 */
#include "params.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <embstore.h>

#include "ctr.h"
#include "local.h"

struct ctr_params {
	struct ctr_params_opts o; /* as opened */
	uint32_t rank;		  /* this worker */
	uint32_t workers;	  /* all workers */
	/* local */
	struct ctr_local *lt[3]; /* emb, wide, mlp */
	/* servers */
	struct emb_client *c;		/* connection to the cluster */
	struct emb_client_table *rt[3]; /* emb, wide, mlp */
	struct emb_cached_table *ct[2]; /* caches over emb, wide, or NULL */
	bool from_env;			/* joined through a scheduler */
	uint32_t mode;			/* enum emb_mode of the tables */
	/* the batch being trained */
	uint64_t *ids;			    /* last looked-up ids */
	uint32_t n;			    /* how many */
	uint64_t dense_ids[CTR_DENSE_ROWS]; /* 0 .. rows-1 */
};

enum { T_EMB, T_WIDE, T_MLP };

static void specs(uint64_t seed, const struct emb_lifecycle_cfg *life,
		  uint32_t row_format, struct emb_table_spec *s)
{
	struct emb_optim_cfg ada = EMB_OPTIM_CFG_DEFAULT;
	struct emb_optim_cfg adam = EMB_OPTIM_CFG_DEFAULT;

	ada.kind = EMB_OPTIM_ADAGRAD;
	ada.lr = 0.05f;
	ada.initial_accumulator = 0.1f;
	adam.kind = EMB_OPTIM_ADAM;
	adam.lr = 0.001f;
	s[T_EMB] = (struct emb_table_spec){
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = "ctr_emb",
	    .dim = CTR_EMB_DIM,
	    .optim = ada,
	    .init = {.kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 0.05f},
	    .seed = seed,
	    .life = *life,
	    .row_format = row_format};
	s[T_WIDE] = (struct emb_table_spec){.struct_size =
						sizeof(struct emb_table_spec),
					    .name = "ctr_wide",
					    .dim = 1,
					    .optim = ada,
					    .init = {.kind = EMB_INIT_ZEROS},
					    .seed = seed,
					    .life = *life,
					    .row_format = row_format};
	s[T_MLP] = (struct emb_table_spec){.struct_size =
					       sizeof(struct emb_table_spec),
					   .name = "ctr_mlp",
					   .dim = CTR_DENSE_ROW,
					   .optim = adam,
					   .init = {.kind = EMB_INIT_ZEROS},
					   .seed = seed};
}

static int open_local(struct ctr_params *p)
{
	struct emb_table_spec s[3];
	int rc;

	specs(p->o.seed, &p->o.life, p->o.row_format, s);
	for (int k = 0; k < 3; k++) {
		rc = ctr_local_create(&s[k], &p->lt[k]);
		if (rc)
			return rc;
	}
	return 0;
}

static int pull_dense_rows(struct ctr_params *p, float *dense, uint32_t flags,
			   uint8_t *found)
{
	if (p->o.local)
		return ctr_local_pull(p->lt[T_MLP], p->dense_ids,
				      CTR_DENSE_ROWS, dense, !flags, found);
	return emb_client_table_pull(p->rt[T_MLP], p->dense_ids, CTR_DENSE_ROWS,
				     dense, flags ? EMB_CLIENT_NOCREATE : 0,
				     found);
}

/* The first worker writes the MLP's initial values; the others wait. */
static int init_dense(struct ctr_params *p)
{
	float *dense = calloc(CTR_DENSE_ROWS * CTR_DENSE_ROW, sizeof(float));
	uint8_t found[CTR_DENSE_ROWS];
	struct timespec pause = {0, 20 * 1000 * 1000};
	int rc = -ENOMEM;

	if (!dense)
		return rc;
	for (int tries = 0; tries < 1500; tries++) {
		bool all = true;

		rc = pull_dense_rows(p, dense, 1, found);
		if (rc)
			break;
		for (uint32_t r = 0; r < CTR_DENSE_ROWS; r++)
			all = all && found[r];
		if (all)
			break;
		if (p->rank == 0) {
			ctr_dense_init(dense, p->o.seed);
			rc = p->o.local
				 ? ctr_local_assign(p->lt[T_MLP], p->dense_ids,
						    CTR_DENSE_ROWS, dense)
				 : emb_client_table_assign(
				       p->rt[T_MLP], p->dense_ids,
				       CTR_DENSE_ROWS, dense, false);
			break;
		}
		nanosleep(&pause, NULL);
		rc = -ETIMEDOUT;
	}
	free(dense);
	return rc;
}

static int open_remote(struct ctr_params *p)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec s[3];
	int rc;

	co.servers = p->o.servers;
	/* Under `embstore launch` the servers' transport is in the
	 * environment; the trainer follows it unless told otherwise. */
	co.transport = p->o.transport		 ? p->o.transport
		       : getenv("EMB_TRANSPORT") ? getenv("EMB_TRANSPORT")
						 : "tcp";
	co.name = "ctr-train";
	if (p->o.servers) {
		rc = emb_client_create(&co, &p->c);
	} else {
		/* Started by `embstore launch` or a cluster script. */
		rc = emb_client_from_env(&co, &p->c);
		p->from_env = rc == 0;
	}
	if (rc)
		return rc;
	p->rank = emb_client_rank(p->c);
	p->workers = emb_client_nworkers(p->c);
	specs(p->o.seed, &p->o.life, p->o.row_format, s);
	for (int k = 0; k < 3; k++) {
		rc = emb_client_table_create(p->c, &s[k], &p->rt[k]);
		if (rc)
			return rc;
	}
	return 0;
}

/* Caches over the sparse tables; not for synchronous training, where every
 * step must read the rows the previous step wrote. */
static int open_caches(struct ctr_params *p)
{
	struct emb_cached_table_opts co = EMB_CACHED_TABLE_OPTS_DEFAULT;
	int rc = 0;

	if (p->o.local || !p->o.cache_rows || p->mode == EMB_MODE_SYNC)
		return 0;
	co.capacity = p->o.cache_rows;
	co.max_batch = p->o.max_batch;
	co.prefetch_depth = p->o.prefetch;
	/* Workers share rows, so gradients go to the servers (write-back
	 * would be last writer wins); --staleness bounds the lag. */
	co.mode = EMB_CACHED_WRITE_THROUGH;
	co.staleness_steps = p->o.staleness;
	co.rank = p->rank;
	for (int k = 0; k < 2 && !rc; k++)
		rc = emb_cached_table_create(p->rt[k], &co, &p->ct[k]);
	return rc;
}

int ctr_params_open(const struct ctr_params_opts *opts, struct ctr_params **out)
{
	struct ctr_params *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	p->o = *opts;
	p->rank = 0;
	p->workers = 1;
	for (uint32_t r = 0; r < CTR_DENSE_ROWS; r++)
		p->dense_ids[r] = r;
	p->ids = malloc((size_t)opts->max_batch * sizeof(*p->ids));
	if (!p->ids) {
		free(p);
		return -ENOMEM;
	}
	rc = opts->local ? open_local(p) : open_remote(p);
	if (!rc)
		rc = init_dense(p);
	if (rc) {
		ctr_params_close(p);
		return rc;
	}
	*out = p;
	return 0;
}

void ctr_params_close(struct ctr_params *p)
{
	if (!p)
		return;
	for (int k = 0; k < 2; k++)
		emb_cached_table_destroy(p->ct[k]);
	for (int k = 0; k < 3; k++) {
		ctr_local_destroy(p->lt[k]);
		emb_client_table_close(p->rt[k]);
	}
	/* The last worker to finish lets the servers and scheduler exit. */
	if (p->from_env && emb_client_finish(p->c))
		fprintf(stderr, "train: the scheduler did not take finish\n");
	emb_client_destroy(p->c);
	free(p->ids);
	free(p);
}

uint32_t ctr_params_rank(const struct ctr_params *p)
{
	return p->rank;
}

uint32_t ctr_params_workers(const struct ctr_params *p)
{
	return p->workers;
}

int ctr_params_prefetch(struct ctr_params *p, const uint64_t *ids, uint32_t n)
{
	for (int k = 0; k < 2; k++) {
		int rc;

		if (!p->ct[k])
			continue;
		rc = emb_cached_table_prefetch(p->ct[k], ids, n);
		/* Not queued: lookup fetches the batch itself. */
		if (rc == EMB_ECACHEFULL || rc == -EBUSY)
			rc = 0;
		if (rc)
			return rc;
	}
	return 0;
}

int ctr_params_lookup(struct ctr_params *p, const uint64_t *ids, uint32_t n,
		      float *emb, float *wide)
{
	struct emb_async *a, *b;
	int rc;

	if (n > p->o.max_batch)
		return EMB_EBADARG;
	memcpy(p->ids, ids, (size_t)n * sizeof(*ids));
	p->n = n;
	if (p->ct[0]) {
		rc = emb_cached_table_lookup(p->ct[0], ids, n, emb);
		return rc ? rc
			  : emb_cached_table_lookup(p->ct[1], ids, n, wide);
	}
	if (p->o.local) {
		rc = ctr_local_pull(p->lt[T_EMB], ids, n, emb, true, NULL);
		return rc ? rc
			  : ctr_local_pull(p->lt[T_WIDE], ids, n, wide, true,
					   NULL);
	}
	rc =
	    emb_client_table_pull_async(p->rt[T_EMB], ids, n, emb, 0, NULL, &a);
	if (rc)
		return rc;
	rc = emb_client_table_pull_async(p->rt[T_WIDE], ids, n, wide, 0, NULL,
					 &b);
	if (rc) {
		emb_async_wait(a);
		return rc;
	}
	rc = emb_async_wait(a);
	return emb_async_wait(b) ? EMB_EFETCH : rc;
}

int ctr_params_pull_dense(struct ctr_params *p, float *dense)
{
	return pull_dense_rows(p, dense, 0, NULL);
}

int ctr_params_push(struct ctr_params *p, const float *g_emb,
		    const float *g_wide, const float *g_dense, uint64_t step)
{
	struct emb_async *op[3];
	int rc = 0, r;

	if (p->o.local) {
		rc = ctr_local_push(p->lt[T_EMB], p->ids, p->n, g_emb);
		if (!rc)
			rc = ctr_local_push(p->lt[T_WIDE], p->ids, p->n,
					    g_wide);
		if (!rc)
			rc = ctr_local_push(p->lt[T_MLP], p->dense_ids,
					    CTR_DENSE_ROWS, g_dense);
		return rc;
	}
	if (p->ct[0]) {
		rc = emb_client_table_push_async(p->rt[T_MLP], p->dense_ids,
						 CTR_DENSE_ROWS, g_dense, step,
						 p->rank, &op[2]);
		if (rc)
			return rc;
		rc = emb_cached_table_push_grads(p->ct[0], g_emb);
		r = emb_cached_table_push_grads(p->ct[1], g_wide);
		if (r && !rc)
			rc = r;
		r = emb_async_wait(op[2]);
		return rc ? rc : r;
	}
	r = emb_client_table_push_async(p->rt[T_EMB], p->ids, p->n, g_emb, step,
					p->rank, &op[0]);
	if (r)
		return r;
	r = emb_client_table_push_async(p->rt[T_WIDE], p->ids, p->n, g_wide,
					step, p->rank, &op[1]);
	if (r) {
		emb_async_wait(op[0]);
		return r;
	}
	r = emb_client_table_push_async(p->rt[T_MLP], p->dense_ids,
					CTR_DENSE_ROWS, g_dense, step, p->rank,
					&op[2]);
	if (r) {
		emb_async_wait(op[0]);
		emb_async_wait(op[1]);
		return r;
	}
	for (int k = 0; k < 3; k++) {
		r = emb_async_wait(op[k]);
		if (r && !rc)
			rc = r;
	}
	return rc;
}

int ctr_params_eval_rows(struct ctr_params *p, const uint64_t *ids, uint32_t n,
			 float *emb, float *wide)
{
	int rc;

	if (p->o.local) {
		rc = ctr_local_pull(p->lt[T_EMB], ids, n, emb, false, NULL);
		return rc ? rc
			  : ctr_local_pull(p->lt[T_WIDE], ids, n, wide, false,
					   NULL);
	}
	rc = emb_client_table_pull(p->rt[T_EMB], ids, n, emb,
				   EMB_CLIENT_NOCREATE, NULL);
	if (!rc)
		rc = emb_client_table_pull(p->rt[T_WIDE], ids, n, wide,
					   EMB_CLIENT_NOCREATE, NULL);
	return rc;
}

int ctr_params_set_mode(struct ctr_params *p, uint32_t mode, uint32_t staleness)
{
	int rc = 0;

	p->mode = mode;
	if (p->o.local)
		return 0;
	for (int k = 0; k < 3 && !rc; k++)
		rc = emb_client_table_set_mode(
		    p->rt[k], mode, mode == EMB_MODE_SYNC ? p->workers : 0,
		    mode == EMB_MODE_STALE ? staleness : 0);
	return rc ? rc : open_caches(p);
}

int ctr_params_push_empty(struct ctr_params *p, uint64_t step)
{
	int rc = 0;

	if (p->o.local)
		return 0;
	for (int k = 0; k < 3 && !rc; k++)
		rc = emb_client_table_push(p->rt[k], NULL, 0, NULL, step,
					   p->rank);
	return rc;
}

int ctr_params_epoch_end(struct ctr_params *p)
{
	for (int k = 0; k < 2; k++) {
		int rc = p->ct[k] ? emb_cached_table_flush(p->ct[k]) : 0;

		if (rc)
			return rc;
	}
	return 0;
}

int ctr_params_barrier(struct ctr_params *p, const char *name)
{
	if (p->o.local || p->workers <= 1 || !p->from_env)
		return 0;
	return emb_client_barrier(p->c, name);
}

int ctr_params_servers(struct ctr_params *p, char *buf, size_t cap)
{
	if (p->o.local)
		return -EINVAL;
	return emb_client_servers(p->c, buf, cap);
}
