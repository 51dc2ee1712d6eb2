/*
 * src/worker/table.c - a table's handle in the client: its name and spec,
 * its id on each server, and for one-sided pulls its location cache and
 * the servers' record layouts. Listed in the client (c->tabs) so that a
 * newcomer on a dead rank learns its ids (conn.c), and counted: the user,
 * each pull in flight and each LOCATE hold a reference, the last frees.
 *
 * Threads: any; the list under c->tab_mu, refs atomic.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/optim.h"
#include "common/rowfmt.h"
#include "proto/wire_msg.h"
#include "worker/abi.h"
#include "worker/client_int.h"

int emb__table_new(struct emb_client *c, const struct emb_wire_spec *ws,
		     struct emb_client_table **out)
{
	struct emb_client_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->ids = calloc(c->nsrv, sizeof(*t->ids));
	if (!t->ids) {
		free(t);
		return -ENOMEM;
	}
	t->c = c;
	memcpy(t->name, ws->name, sizeof(t->name));
	t->spec.struct_size = sizeof(t->spec);
	t->spec.name = t->name;
	t->spec.dim = ws->dim;
	t->spec.optim = ws->optim;
	t->spec.init = ws->init;
	t->spec.seed = ws->seed;
	t->spec.row_format = ws->row_format;
	t->spec.rounding = ws->rounding;
	t->spec.tier = ws->tier; /* as asked: a handle opened by name has 0 */
	t->spec.tier_max = ws->tier_max;
	t->evicts = emb_lifecycle_evicts(&ws->life);
	t->admits = ws->life.admit != EMB_ADMIT_NONE || t->evicts;
	t->wwords = emb_rowfmt_words(ws->row_format, ws->dim);
	t->row_floats =
	    t->wwords + emb_optim_state_floats(ws->optim.kind, ws->dim);
	t->refs = 1;
	if (c->onesided) {
		t->loc = calloc(c->loc_rows, sizeof(*t->loc));
		t->rem = calloc(c->nsrv, sizeof(*t->rem));
		if (!t->loc || !t->rem) {
			emb__table_unref(t);
			return -ENOMEM;
		}
		t->loc_mask = c->loc_rows / LOC_WAYS - 1;
	}
	/* Listed, so that a newcomer on a dead rank learns its ids. */
	pthread_mutex_lock(&c->tab_mu);
	t->tnext = c->tabs;
	if (c->tabs)
		c->tabs->tprev = t;
	c->tabs = t;
	pthread_mutex_unlock(&c->tab_mu);
	*out = t;
	return 0;
}

/* The last reference frees: the user's, or a LOCATE still in flight. */
void emb__table_unref(struct emb_client_table *t)
{
	if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL))
		return;
	free(t->loc);
	free(t->rem);
	free(t->ids);
	free(t);
}

void emb_client_table_close(struct emb_client_table *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->c->tab_mu);
	if (t->tprev)
		t->tprev->tnext = t->tnext;
	else
		t->c->tabs = t->tnext;
	if (t->tnext)
		t->tnext->tprev = t->tprev;
	pthread_mutex_unlock(&t->c->tab_mu);
	emb__table_unref(t);
}

uint32_t emb_client_table_dim(const struct emb_client_table *t)
{
	return t->spec.dim;
}

uint32_t emb_client_table_row_floats(const struct emb_client_table *t)
{
	return t->row_floats;
}

uint32_t emb_client_table_weight_words(const struct emb_client_table *t)
{
	return t->wwords;
}

int emb_client_table_set_push_format(struct emb_client_table *t,
				     uint32_t fmt)
{
	int rc = 0;

	if (!t)
		return emb__client_err(NULL, EMB_EBADARG);
	if (fmt != EMB_ROWFMT_FP32 && fmt != EMB_ROWFMT_FP16 &&
	    fmt != EMB_ROWFMT_BF16)
		rc = EMB_EBADFORMAT;
	else
		t->push_fmt = fmt;
	return emb__client_err(t->c, rc);
}

const struct emb_table_spec *
emb_client_table_spec(const struct emb_client_table *t)
{
	return &t->spec;
}

uint32_t emb__client_table_mode(const struct emb_client_table *t)
{
	return t->mode;
}

