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

/* server_stats() into the library's own entries tmp[0..cap). */
static int server_stats(struct emb_client *c,
			struct emb_client_server_table *tmp, uint32_t cap)
{
	struct gather g = {.out = tmp, .cap = cap};
	int rc;

	if (cap) {
		g.ids = calloc(cap, sizeof(*g.ids));
		if (!g.ids)
			return -ENOMEM;
	}
	rc = emb__client_admin(c, EMB_OP_LIST_TABLES, on_list, &g);
	if (!rc && g.n && cap)
		rc = emb__client_admin(c, EMB_OP_STATS, on_stats, &g);
	free(g.ids);
	if (rc)
		return rc;
	return g.n > INT32_MAX ? INT32_MAX : (int)g.n;
}

int emb_client_server_stats(struct emb_client *c,
			    struct emb_client_server_table *out, uint32_t cap)
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
	n = server_stats(c, tmp, cap);
	for (uint32_t i = 0; n > 0 && i < cap && i < (uint32_t)n; i++) {
		char *e = (char *)out + (size_t)i * stride;

		memcpy(e, &stride, sizeof(stride));
		emb__stats_copy(e, &tmp[i], sizeof(tmp[i]),
				"emb_client_server_table");
	}
	free(tmp);
	return emb__err(n);
}
