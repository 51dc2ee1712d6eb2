/*
 * src/worker/table_admin.c - the table calls that go to every server:
 * create, open, drop, set mode, set lifecycle, stats. Each is one
 * broadcast (broadcast.c), waited for.
 *
 * Threads: any, as embstore.h says.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <string.h>

#include "common/endian.h"
#include "common/init.h"
#include "common/lifecycle.h"
#include "common/optim.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "worker/abi.h"
#include "worker/client_int.h"

/* What one server keeps of a table-wide policy: ids hash evenly over the
 * servers, so each holds its share of max_rows. With replicas that is
 * its share as a primary: a server counts only the rows it may evict
 * against max_rows, and its backups' copies follow their primaries'
 * evictions (docs/replication.md, "Eviction with replicas"). */
static struct emb_lifecycle_cfg per_server(const struct emb_client *c,
					   const struct emb_lifecycle_cfg *l)
{
	struct emb_lifecycle_cfg r = *l;

	if (r.max_rows)
		r.max_rows = (r.max_rows + c->nsrv - 1) / c->nsrv;
	return r;
}

/*
 * Copies of a slot must hold the same rows. A push asks the primaries
 * which ids are rows, and their births, and every holder applies just
 * those (docs/replication.md, "Admission with replicas"); a primary
 * evicts alone and its backups check their copies against it ("Eviction
 * with replicas"). Births are kept beside DRAM records only: a table
 * asked to be tiered takes no eviction in a map of several copies (one
 * tiered by a server's own setting refuses pushes naming births). A map of one copy (an elastic job without
 * replicas) does: each slot has one writer but while it moves, and its
 * servers hold eviction back in those slots ("Eviction with one copy").
 */
static bool life_replicable(const struct emb_client *c, uint32_t tier,
			    const struct emb_lifecycle_cfg *l)
{
	return !c->cmap || c->cmap->replicas == 1 || tier != EMB_TIER_ON ||
	       !emb_lifecycle_evicts(l);
}

static int table_create(struct emb_client *c, const struct emb_table_spec *spec,
			struct emb_client_table **out)
{
	uint8_t payload[EMB_WIRE_CREATE_REQ_MAX];
	struct emb_client_table *t;
	struct emb_wire_spec ws = {0};
	struct emb_async *op;
	int rc, len;

	if (!c || !spec || !out || !spec->name)
		return EMB_EBADARG;
	if (strlen(spec->name) >= sizeof(ws.name))
		return EMB_EBADNAME;
	strcpy(ws.name, spec->name);
	ws.dim = spec->dim;
	ws.optim = spec->optim;
	ws.init = spec->init;
	ws.seed = spec->seed;
	ws.row_format = spec->row_format;
	/* Rounding means nothing to fp32 rows: one spec per table. */
	ws.rounding = spec->row_format == EMB_ROWFMT_FP32 ? 0 : spec->rounding;
	if (ws.row_format >= EMB_ROWFMT_COUNT || spec->rounding > 1)
		return EMB_EBADFORMAT;
	if (spec->tier >= EMB_TIER_MODE_COUNT || spec->_pad1)
		return EMB_EBADARG;
	/* Likewise a server before per-table tiers refuses EMB_F_TIER: no
	 * table that asked for no tier is tiered, nor the reverse. */
	ws.tier = spec->tier;
	ws.tier_max = spec->tier_max;
	/* A server before row formats refuses the CREATE's flag: no table
	 * is made fp32 that was asked compact. */
	ws.life = per_server(c, &spec->life);
	if (!life_replicable(c, spec->tier, &ws.life))
		return -EOPNOTSUPP;
	rc = emb_optim_validate(&ws.optim);
	if (!rc)
		rc = emb_init_validate(&ws.init);
	if (!rc)
		rc = emb_lifecycle_validate(&ws.life);
	if (rc)
		return rc;
	len = emb_wire_create_req_encode(payload, sizeof(payload), 0, &ws);
	if (len < 0)
		return len;
	/* The encoder's flags: EMB_F_ROWFMT and EMB_F_TIER when their
	 * blocks follow. */
	op = emb__broadcast(c, EMB_OP_CREATE_TABLE, emb_le16_load(payload + 6),
			    NULL,
			    payload + EMB_WIRE_HDR_SIZE,
			    (size_t)len - EMB_WIRE_HDR_SIZE, &rc);
	if (!op)
		return rc;
	if (rc)
		goto out;
	rc = emb__table_new(c, &ws, &t);
	if (rc)
		goto out;
	for (uint32_t s = 0; s < c->nsrv; s++)
		t->ids[s] = op->parts[s].req.rhdr.table_id;
	*out = t;
out:
	emb__op_free(op);
	return rc;
}

static bool spec_equal(const struct emb_wire_spec *a,
		       const struct emb_wire_spec *b)
{
	return a->dim == b->dim && a->seed == b->seed &&
	       a->row_format == b->row_format && a->rounding == b->rounding &&
	       memcmp(&a->optim, &b->optim, sizeof(a->optim)) == 0 &&
	       memcmp(&a->init, &b->init, sizeof(a->init)) == 0;
}

static int table_open(struct emb_client *c, const char *name,
		      struct emb_client_table **out)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_client_table *t = NULL;
	struct emb_wire_spec first = {0};
	struct emb_async *op;
	int rc;

	if (!c || !name || !out)
		return EMB_EBADARG;
	lim.max_tables = 65536;
	op = emb__broadcast(c, EMB_OP_LIST_TABLES, 0, NULL, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < c->nsrv && !rc; s++) {
		struct emb_wire_frame f = emb__part_frame(&op->parts[s], &lim);
		struct emb_wire_list_resp lr;
		struct emb_wire_table_info info;
		bool hit = false;

		if (op->parts[s].rep.skip)
			continue; /* removed: its tables live on its backups */
		rc = emb_wire_list_resp_decode(&f, &lr);
		for (uint32_t i = 0; !rc && i < lr.n && !hit; i++) {
			emb_wire_list_entry(&lr, i, &info);
			if (strcmp(info.spec.name, name) != 0)
				continue;
			hit = true;
			if (!t) {
				first = info.spec;
				rc = emb__table_new(c, &info.spec, &t);
			} else if (!spec_equal(&first, &info.spec)) {
				rc = EMB_ETABLEEXISTS;
			}
			if (!rc)
				t->ids[s] = info.table_id;
		}
		if (!rc && !hit)
			rc = EMB_ENOTABLE;
	}
	emb__op_free(op);
	if (rc) {
		emb_client_table_close(t);
		return rc;
	}
	*out = t;
	return 0;
}

static int table_drop(struct emb_client_table *t)
{
	struct emb_async *op;
	int rc;

	if (!t)
		return EMB_EBADARG;
	op = emb__broadcast(t->c, EMB_OP_DROP_TABLE, 0, t->ids, NULL, 0, &rc);
	emb__op_free(op);
	return rc;
}

static int table_set_mode(struct emb_client_table *t, uint32_t mode,
			  uint32_t workers, uint32_t staleness)
{
	struct emb_wire_set_mode_req m = {.table_id = 1,
					  .mode = mode,
					  .workers = workers,
					  .staleness = staleness};
	uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_SET_MODE_SIZE];
	struct emb_async *op;
	int rc, len;

	if (!t)
		return EMB_EBADARG;
	/* A step's end is per server; replicas would each need them all. */
	if (t->c->cmap && mode == EMB_MODE_SYNC)
		return -EOPNOTSUPP;
	len = emb_wire_set_mode_req_encode(buf, sizeof(buf), 0, &m);
	if (len < 0)
		return len;
	op = emb__broadcast(t->c, EMB_OP_SET_MODE, 0, t->ids,
			    buf + EMB_WIRE_HDR_SIZE,
			    (size_t)len - EMB_WIRE_HDR_SIZE, &rc);
	emb__op_free(op);
	if (!rc)
		t->mode = mode;
	return rc;
}

static int table_set_lifecycle(struct emb_client_table *t,
			       const struct emb_lifecycle_cfg *life)
{
	struct emb_wire_set_lifecycle_req m = {.table_id = 1};
	uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_LIFECYCLE_SIZE];
	struct emb_async *op;
	int rc, len;

	if (!t || !life)
		return EMB_EBADARG;
	m.life = per_server(t->c, life);
	if (!life_replicable(t->c, t->spec.tier, &m.life))
		return -EOPNOTSUPP;
	len = emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 0, &m);
	if (len < 0)
		return len;
	op = emb__broadcast(t->c, EMB_OP_SET_LIFECYCLE, 0, t->ids,
		       buf + EMB_WIRE_HDR_SIZE, (size_t)len - EMB_WIRE_HDR_SIZE,
		       &rc);
	emb__op_free(op);
	/* Asking first (and naming births) while some server may have the
	 * policy is harmless. */
	if (!rc || m.life.admit != EMB_ADMIT_NONE ||
	    emb_lifecycle_evicts(&m.life)) {
		__atomic_store_n(&t->evicts, emb_lifecycle_evicts(&m.life),
				 __ATOMIC_RELAXED);
		__atomic_store_n(&t->admits,
				 m.life.admit != EMB_ADMIT_NONE ||
				     emb_lifecycle_evicts(&m.life),
				 __ATOMIC_RELAXED);
	}
	return rc;
}

static int table_stats(struct emb_client_table *t,
		       struct emb_client_table_stats *out)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_async *op;
	uint64_t row_bytes = 0, step = 0;
	int rc;

	if (!t || !out)
		return EMB_EBADARG;
	memset(out, 0, sizeof(*out));
	lim.max_tables = 65536;
	op = emb__broadcast(t->c, EMB_OP_STATS, 0, t->ids, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < t->c->nsrv && !rc; s++) {
		struct emb_wire_frame f = emb__part_frame(&op->parts[s], &lim);
		struct emb_wire_stats_resp sr;
		struct emb_wire_stats w;

		if (op->parts[s].rep.skip)
			continue; /* removed, its slots served by backups */
		rc = emb_wire_stats_resp_decode(&f, &sr);
		if (rc || sr.n != 1) {
			rc = rc ? rc : EMB_EBADFRAME;
			break;
		}
		emb_wire_stats_entry(&sr, 0, &w);
#define SUM(name, what) out->name += w.name;
		EMB_TABLE_STATS(SUM)
#undef SUM
		/* Per-table, not additive: the largest of any server. */
		row_bytes = w.row_bytes > row_bytes ? w.row_bytes : row_bytes;
		step = w.step > step ? w.step : step;
		out->servers++;
	}
	out->row_bytes = row_bytes;
	out->step = step;
	emb__op_free(op);
	return rc;
}

/* ---- the public calls: each sets the calling thread's last error ---- */

int emb_client_table_create(struct emb_client *c,
			    const struct emb_table_spec *spec,
			    struct emb_client_table **out)
{
	struct emb_table_spec sp;
	int rc = spec ? emb__opts_copy(&sp, sizeof(sp), spec, "emb_table_spec")
		      : EMB_EBADARG;

	return emb__client_err(c, rc ? rc : table_create(c, &sp, out));
}

int emb_client_table_open(struct emb_client *c, const char *name,
			  struct emb_client_table **out)
{
	return emb__client_err(c, table_open(c, name, out));
}

int emb_client_table_drop(struct emb_client_table *t)
{
	return emb__client_err(t ? t->c : NULL, table_drop(t));
}

int emb_client_table_set_mode(struct emb_client_table *t, uint32_t mode,
			      uint32_t workers, uint32_t staleness)
{
	return emb__client_err(t ? t->c : NULL,
			       table_set_mode(t, mode, workers, staleness));
}

int emb_client_table_set_lifecycle(struct emb_client_table *t,
				   const struct emb_lifecycle_cfg *life)
{
	return emb__client_err(t ? t->c : NULL, table_set_lifecycle(t, life));
}

int emb_client_table_stats(struct emb_client_table *t,
			   struct emb_client_table_stats *out)
{
	struct emb_client_table_stats st = EMB_SIZED(struct emb_client_table_stats);
	int rc = emb__stats_check(out, "emb_client_table_stats");

	if (!rc) {
		rc = table_stats(t, &st);
		emb__stats_copy(out, &st, sizeof(st), "emb_client_table_stats");
	}
	return emb__client_err(t ? t->c : NULL, rc);
}
