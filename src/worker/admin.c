/*
 * src/worker/admin.c - monitoring calls of the client library: every table
 * of every server with its counters, per server (`embstore stat`). Built
 * on one LIST_TABLES and one STATS broadcast; any thread, as embstore.h
 * says.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "worker/abi.h"
#include "worker/client_int.h"

/* What the two broadcasts fill in. */
struct gather {
	struct emb_client_server_table *out; /* caller's */
	uint32_t cap;			     /* entries out has room for */
	uint32_t n;			     /* tables seen so far */
	uint32_t *ids; /* table id of out[i], cap of them */
};

/* LIST_TABLES: one entry per table and server, names and dims. */
static int on_list(void *arg, uint32_t server, const struct emb_wire_frame *f)
{
	struct gather *g = arg;
	struct emb_wire_list_resp lr;
	struct emb_wire_table_info info;
	int rc = emb_wire_list_resp_decode(f, &lr);

	for (uint32_t i = 0; !rc && i < lr.n; i++, g->n++) {
		struct emb_client_server_table *e;

		if (g->n >= g->cap)
			continue; /* counted only: the caller asks again */
		emb_wire_list_entry(&lr, i, &info);
		e = &g->out[g->n];
		memset(e, 0, sizeof(*e));
		e->server = server;
		memcpy(e->name, info.spec.name, sizeof(e->name) - 1);
		e->dim = info.spec.dim;
		e->row_format = info.spec.row_format;
		e->rows = info.rows;
		g->ids[g->n] = info.table_id;
	}
	return rc;
}

/* STATS of all tables: counters matched to the entries by server and id. */
static int on_stats(void *arg, uint32_t server, const struct emb_wire_frame *f)
{
	struct gather *g = arg;
	struct emb_wire_stats_resp sr;
	struct emb_wire_stats w;
	int rc = emb_wire_stats_resp_decode(f, &sr);

	for (uint32_t i = 0; !rc && i < sr.n; i++) {
		emb_wire_stats_entry(&sr, i, &w);
		for (uint32_t k = 0; k < g->n && k < g->cap; k++) {
			struct emb_client_server_table *e = &g->out[k];

			if (e->server != server || g->ids[k] != w.table_id)
				continue;
#define COPY(name, what) e->name = w.name;
			EMB_TABLE_STATS(COPY)
#undef COPY
			break;
		}
	}
	return rc;
}

/*
 * Drops the entries of servers err names (a server that listed its tables
 * and then failed STATS), keeping the order; the new count.
 */
static uint32_t drop_failed(struct gather *g, const int *err)
{
	uint32_t k = 0, n = g->n < g->cap ? g->n : g->cap;

	for (uint32_t i = 0; i < n; i++) {
		if (err[g->out[i].server])
			continue;
		g->out[k] = g->out[i];
		g->ids[k] = g->ids[i];
		k++;
	}
	return g->n - (n - k);
}

/*
 * server_stats() into the library's own entries tmp[0..cap). With err
 * (c->nsrv entries), over the servers that answer (emb__client_admin_each).
 */
static int server_stats(struct emb_client *c,
			struct emb_client_server_table *tmp, uint32_t cap,
			int *err)
{
	struct gather g = {.out = tmp, .cap = cap};
	int *err2 = NULL;
	int rc;

	g.ids = calloc(cap ? cap : 1, sizeof(*g.ids));
	if (err)
		err2 = calloc(c->nsrv, sizeof(*err2));
	if (!g.ids || (err && !err2)) {
		free(g.ids);
		free(err2);
		return -ENOMEM;
	}
	if (err) {
		rc = emb__client_admin_each(c, EMB_OP_LIST_TABLES, on_list,
					    &g, err);
		if (!rc && g.n && cap)
			rc = emb__client_admin_each(c, EMB_OP_STATS, on_stats,
						    &g, err2);
		for (uint32_t s = 0; !rc && s < c->nsrv; s++)
			err[s] = err[s] ? err[s] : err2[s];
		if (!rc)
			g.n = drop_failed(&g, err);
	} else {
		rc = emb__client_admin(c, EMB_OP_LIST_TABLES, on_list, &g);
		if (!rc && g.n && cap)
			rc = emb__client_admin(c, EMB_OP_STATS, on_stats, &g);
	}
	free(g.ids);
	free(err2);
	if (rc)
		return rc;
	return g.n > INT32_MAX ? INT32_MAX : (int)g.n;
}

static int server_stats_out(struct emb_client *c,
			    struct emb_client_server_table *out, uint32_t cap,
			    int *err)
{
	struct emb_client_server_table *tmp = NULL;
	uint32_t stride = 0;
	int n;

	if (!c || (cap && !out))
		return emb__err(EMB_EBADARG);
	if (cap) {
		/* The caller's entries may be longer or shorter than ours:
		 * out[0].struct_size is the array's stride. */
		n = emb__stats_check(out, "emb_client_server_table");
		if (n)
			return emb__err(n);
		memcpy(&stride, out, sizeof(stride));
		tmp = calloc(cap, sizeof(*tmp));
		if (!tmp)
			return emb__err(-ENOMEM);
	}
	n = server_stats(c, tmp, cap, err);
	for (uint32_t i = 0; n > 0 && i < cap && i < (uint32_t)n; i++) {
		char *e = (char *)out + (size_t)i * stride;

		memcpy(e, &stride, sizeof(stride));
		emb__stats_copy(e, &tmp[i], sizeof(tmp[i]),
				"emb_client_server_table");
	}
	free(tmp);
	return emb__err(n);
}

int emb_client_server_stats(struct emb_client *c,
			    struct emb_client_server_table *out, uint32_t cap)
{
	return server_stats_out(c, out, cap, NULL);
}

int emb_client_server_stats_each(struct emb_client *c,
				 struct emb_client_server_table *out,
				 uint32_t cap, int *err, uint32_t nerr)
{
	if (!c || !err || nerr < c->nsrv)
		return emb__err(EMB_EBADARG);
	return server_stats_out(c, out, cap, err);
}
