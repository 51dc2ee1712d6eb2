/*
 * src/worker/onesided.c - one-sided pulls (pull_mode ONESIDED,
 * docs/rdma.md). Each RDMA server has a second conn (conn.c), used only
 * for LOCATE calls and RDMA READs, so that a READ of memory the server
 * freed (which fails the whole conn) costs no other call. A pull part
 * READs the records of the ids whose location the table's cache holds,
 * checks each by its seal, and sends the rest as one ordinary PULL on the
 * main conn; then it LOCATEs those ids for next time.
 *
 * A record holds the row as the table keeps it: the weights in the table's
 * row format, then the optimizer state. The seal covers those words
 * whatever the format; only once it checks is a compact row decoded into
 * the caller's fp32 rows (or copied as it is for raw and whole-row pulls),
 * exactly as a two-sided PULL's rows are.
 *
 * Parts are sent and ended through c->fns (op.c).
 *
 * Threads: emb__os_plan() in the caller's thread as it builds a pull; the
 * rest on the loop thread, which alone touches the caches.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/rowfmt.h"
#include "common/seal.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
#include "worker/client_int.h"

/* id's two candidate buckets (they may coincide). */
static void loc_buckets(const struct emb_client_table *t, uint64_t id,
			struct loc **b0, struct loc **b1)
{
	uint64_t h = emb_id_hash(id);

	*b0 = &t->loc[(h & t->loc_mask) * LOC_WAYS];
	*b1 = &t->loc[((h >> 32) & t->loc_mask) * LOC_WAYS];
}

/* id's location, or NULL. */
static struct loc *loc_find(const struct emb_client_table *t, uint64_t id)
{
	struct loc *b[2];

	loc_buckets(t, id, &b[0], &b[1]);
	for (uint32_t k = 0; k < 2; k++)
		for (uint32_t w = 0; w < LOC_WAYS; w++)
			if (b[k][w].addr && b[k][w].id == id)
				return &b[k][w];
	return NULL;
}

/* Where id's location goes: its old slot, a free one in either bucket, or
 * a victim the hash picks. */
static struct loc *loc_put(const struct emb_client_table *t, uint64_t id)
{
	struct loc *e = loc_find(t, id), *b[2];

	if (e)
		return e;
	loc_buckets(t, id, &b[0], &b[1]);
	for (uint32_t k = 0; k < 2; k++)
		for (uint32_t w = 0; w < LOC_WAYS; w++)
			if (!b[k][w].addr)
				return &b[k][w];
	return &b[(id >> 3) & 1][(emb_id_hash(id) >> 20) % LOC_WAYS];
}

/* Sends the part's misses (p->rd.miss) as one PULL, or ends it if none. */
static void os_fallback(struct emb_client *c, struct part *p)
{
	const uint64_t *ids = p->req.iov[0].iov_base;

	if (!p->rd.nmiss) {
		c->fns->end(p, 0, NULL);
		return;
	}
	/* A batch flushed while the client is destroyed: no conn to use. */
	if (stopping(c)) {
		c->fns->end(p, EMB_ECLOSED, NULL);
		return;
	}
	for (uint32_t k = 0; k < p->rd.nmiss; k++)
		p->rd.miss_ids[k] = ids[p->rd.miss[k]];
	p->req.iov[0].iov_base = p->rd.miss_ids;
	p->req.iov[0].iov_len = (size_t)p->rd.nmiss * sizeof(uint64_t);
	p->req.n = p->rd.nmiss;
	p->req.hdr.count = p->rd.nmiss;
	p->rd.fb = true;
	add(&c->rows_fallback, p->rd.nmiss);
	c->fns->send(c, p);
}

/* True when record rec (rb bytes, as READ) is id's row, whole: its
 * row_floats words (weights in the table's format, then state) sealed. */
static bool seal_ok(const struct remote *r, uint32_t rb, uint32_t row_floats,
		    const char *rec, uint64_t id)
{
	uint64_t got_id, seal;

	memcpy(&got_id, rec, sizeof(got_id));
	memcpy(&seal, rec + rb - 8, sizeof(seal));
	return got_id == id &&
	       emb_seal(r->seed, id, rec + 16,
			(size_t)row_floats * sizeof(float)) == seal;
}

static void os_read_done(void *ctx, int status)
{
	struct part *p = ctx;
	struct emb_async *op = p->op;
	struct emb_client *c = op->c;
	struct emb_client_table *t = op->tbl;
	struct server *s = &c->srv[p->req.server];
	const struct remote *r = &t->rem[p->req.server];
	const uint64_t *ids = p->req.iov[0].iov_base;
	const size_t row_sz = (size_t)op->dim * sizeof(float);
	uint64_t good = 0, bad = 0;

	emb__conn_fly_del(s, p);
	p->retry.reading = false;
	if (status) {
		/* Nothing landed that can be trusted: all go two-sided. A
		 * batch of an older read conn leaves the current one be. */
		op->tainted = true;
		if (p->rd.rgen == s->rgen)
			emb__rconn_lost(s, status);
		for (uint32_t k = 0; k < p->rd.rop.n; k++)
			p->rd.miss[p->rd.nmiss++] = p->rd.seg_j[k];
		os_fallback(c, p);
		return;
	}
	for (uint32_t k = 0; k < p->rd.rop.n; k++) {
		uint32_t j = p->rd.seg_j[k];
		const char *rec = p->rd.land + (size_t)j * p->rd.rb;
		const void *row = rec + 16;
		uint32_t u = op->pu[p->req.first + j];
		uint32_t i;

		if (!seal_ok(r, p->rd.rb, t->row_floats, rec, ids[j])) {
			struct loc *e = loc_find(t, ids[j]);

			if (e)
				e->addr = 0; /* LOCATEd again after the PULL */
			p->rd.miss[p->rd.nmiss++] = j;
			bad++;
			continue;
		}
		/* Sealed, so whole: a compact row is decoded (from the
		 * landing, which nothing writes any more) into the first
		 * position and copied to the others. */
		i = op->first[u];
		if (op->decode != EMB_ROWFMT_FP32 && i != NONE) {
			emb_rowfmt_decode(op->decode, row,
					  op->out + (size_t)i * op->dim,
					  op->dim);
			row = op->out + (size_t)i * op->dim;
			if (op->found)
				op->found[i] = 1;
			i = op->next[i];
		}
		for (; i != NONE; i = op->next[i]) {
			memcpy(op->out + (size_t)i * op->dim, row, row_sz);
			if (op->found)
				op->found[i] = 1;
		}
		good++;
	}
	add(&c->rows_read, good);
	add(&c->seal_failures, bad);
	os_fallback(c, p);
}

/* Part p of a one-sided pull: READs for the ids with a location, the rest
 * two-sided. Never sent this way twice (a retry is two-sided). */
void emb__os_start(struct emb_client *c, struct part *p)
{
	struct emb_client_table *t = p->op->tbl;
	struct server *s = &c->srv[p->req.server];
	const uint64_t *ids = p->req.iov[0].iov_base;
	uint32_t nseg = 0;
	int rc;

	p->rd.os_done = true;
	p->rd.nmiss = 0;
	if (s->rstate != RD_UP ||
	    __atomic_load_n(&t->rem[p->req.server].rec_bytes,
			    __ATOMIC_RELAXED) != p->rd.rb) {
		for (uint32_t j = 0; j < p->req.n; j++)
			p->rd.miss[p->rd.nmiss++] = j;
		os_fallback(c, p);
		return;
	}
	for (uint32_t j = 0; j < p->req.n; j++) {
		const struct loc *e = loc_find(t, ids[j]);

		if (e && e->srv == p->req.server && e->gen == s->rgen) {
			p->rd.segs[nseg] = (struct emb_read_seg){
			    .raddr = e->addr,
			    .rkey = e->rkey,
			    .len = p->rd.rb,
			    .local = p->rd.land + (size_t)j * p->rd.rb};
			p->rd.seg_j[nseg++] = j;
		} else {
			p->rd.miss[p->rd.nmiss++] = j;
		}
	}
	if (!nseg) {
		os_fallback(c, p);
		return;
	}
	p->rd.rop = (struct emb_read_op){
	    .segs = p->rd.segs, .n = nseg, .done = os_read_done, .ctx = p};
	p->rd.rgen = s->rgen;
	/* In the fly list before the READs: they may complete at once. */
	p->retry.reading = true;
	emb__conn_fly_add(s, p);
	rc = emb_conn_read(s->rconn, &p->rd.rop);
	if (rc) {
		emb__conn_fly_del(s, p);
		p->retry.reading = false;
		/* A closed conn is replaced; -EINVAL (landing memory not
		 * registered) only costs this part its READs. */
		if (rc == EMB_ECLOSED)
			emb__rconn_lost(s, rc);
		for (uint32_t k = 0; k < nseg; k++)
			p->rd.miss[p->rd.nmiss++] = p->rd.seg_j[k];
		os_fallback(c, p);
	}
}

/* A LOCATE in flight: its own memory, as the pull may be over first. */
struct locreq {
	struct emb_client_table *t; /* holds a reference */
	uint32_t srv;		    /* server index */
	uint16_t gen;		    /* the server's rgen when sent */
	uint32_t n;		    /* ids */
	struct emb_frame_hdr hdr;   /* request header */
	struct iovec iov;	    /* ids */
	void *resp;		    /* response payload */
	size_t resp_cap;	    /* its bytes */
	uint64_t ids[];		    /* n ids */
};

static void loc_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct locreq *q = ctx;
	struct emb_client_table *t = q->t;
	struct emb_client *c = t->c;
	struct server *s = &c->srv[q->srv];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	struct emb_wire_locate_resp r;

	if (status) {
		if (status != EMB_ECLOSED && q->gen == s->rgen)
			emb__rconn_lost(s, status);
		goto out;
	}
	/* A server without --remote-read: stop asking it. */
	if (resp->status == EMB_ENOTREMOTE) {
		__atomic_store_n(&t->rem[q->srv].rec_bytes, NOT_REMOTE,
				 __ATOMIC_RELAXED);
		goto out;
	}
	f = (struct emb_wire_frame){.hdr = *resp, .payload = q->resp,
				    .lim = &lim};
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	if (emb_wire_locate_resp_decode(&f, &r) != 0 || r.n != q->n ||
	    r.row_floats != t->row_floats || q->gen != s->rgen)
		goto out;
	t->rem[q->srv].seed = r.seed;
	__atomic_store_n(&t->rem[q->srv].rec_bytes, r.rec_bytes,
			 __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < r.n; i++) {
		struct loc *e;
		uint64_t addr;
		uint32_t rkey;

		emb_wire_locate_entry_get(&r, i, &addr, &rkey);
		if (!addr)
			continue;
		e = loc_put(t, q->ids[i]);
		*e = (struct loc){.id = q->ids[i],
				  .addr = addr,
				  .rkey = rkey,
				  .srv = (uint16_t)q->srv,
				  .gen = q->gen};
	}
out:
	emb__table_unref(t);
	free(q);
}

/* LOCATEs n ids of table t on server si's read conn, in frame-sized
 * pieces. Best effort: a failure only means more two-sided pulls. */
static void loc_request(struct emb_client *c, struct emb_client_table *t,
			uint32_t si, const uint64_t *ids, uint32_t n)
{
	struct server *s = &c->srv[si];
	uint64_t room = (s->lim.max_frame_bytes - 2 * EMB_WIRE_HDR_SIZE -
			 EMB_WIRE_LOCATE_HEAD_SIZE) /
			EMB_WIRE_LOCATE_ENTRY_SIZE;
	uint32_t step = room < s->lim.max_ids ? (uint32_t)room : s->lim.max_ids;

	for (uint32_t done = 0; done < n && s->rstate == RD_UP;) {
		uint32_t m = n - done < step ? n - done : step;
		size_t cap = EMB_WIRE_LOCATE_HEAD_SIZE +
			     (size_t)m * EMB_WIRE_LOCATE_ENTRY_SIZE;
		struct locreq *q;
		int rc;

		if (cap < ERR_CAP)
			cap = ERR_CAP;
		q = malloc(sizeof(*q) + (size_t)m * sizeof(uint64_t) + cap);
		if (!q)
			return;
		*q = (struct locreq){.t = t, .srv = si, .gen = s->rgen, .n = m};
		memcpy(q->ids, ids + done, (size_t)m * sizeof(uint64_t));
		q->resp = q->ids + m;
		q->resp_cap = cap;
		q->hdr.opcode = EMB_OP_LOCATE;
		q->hdr.table_id = t->ids[si];
		q->hdr.count = m;
		q->iov = (struct iovec){q->ids, (size_t)m * sizeof(uint64_t)};
		__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
		rc = emb_conn_call(s->rconn, &q->hdr, &q->iov, 1, q->resp,
				   q->resp_cap, loc_done, q);
		if (rc) {
			__atomic_fetch_sub(&t->refs, 1, __ATOMIC_RELAXED);
			free(q);
			emb__rconn_lost(s, rc);
			return;
		}
		done += m;
	}
}

/* After a part's PULL: LOCATE the ids it pulled two-sided. */
void emb__os_learn(struct emb_async *op, struct part *p)
{
	struct emb_client *c = op->c;

	if (c->srv[p->req.server].rstate != RD_UP)
		return;
	loc_request(c, op->tbl, p->req.server, p->req.iov[0].iov_base,
		    p->req.n);
}

/*
 * One-sided pulls: which parts READ (their server is on RDMA and its
 * record layout is known), and their bookkeeping; the others LOCATE their
 * ids once pulled, so the next pull may READ. Adds the READ landings to
 * *resp_bytes (they share the registered response buffer). 0 or -ENOMEM.
 */
int emb__os_plan(struct emb_async *op, struct emb_client_table *t,
		   size_t *resp_bytes)
{
	struct emb_client *c = op->c;
	size_t per_id = sizeof(struct emb_read_seg) + 4 + 4 + 8, total = 0;
	char *m;

	if (!c->onesided || !t->loc)
		return 0;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];
		const struct server *s = &c->srv[p->req.server];

		if (!__atomic_load_n(&s->on_rdma, __ATOMIC_RELAXED))
			continue;
		p->rd.rb = __atomic_load_n(&t->rem[p->req.server].rec_bytes,
					__ATOMIC_RELAXED);
		p->rd.os = p->rd.rb != 0 && p->rd.rb != NOT_REMOTE;
		p->rd.learn = p->rd.rb == 0;
		if (p->rd.os) {
			total += p->req.n;
			*resp_bytes +=
			    ((size_t)p->req.n * p->rd.rb + 63) & ~(size_t)63;
		}
	}
	if (!total)
		return 0;
	m = emb__op_grow(op->os_mem, &op->os_mem_cap, total * per_id);
	if (!m)
		return -ENOMEM;
	op->os_mem = m;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		if (!p->rd.os)
			continue;
		p->rd.segs = (struct emb_read_seg *)(void *)m;
		p->rd.miss_ids = (uint64_t *)(void *)(p->rd.segs + p->req.n);
		p->rd.seg_j = (uint32_t *)(void *)(p->rd.miss_ids + p->req.n);
		p->rd.miss = p->rd.seg_j + p->req.n;
		m = (char *)(p->rd.miss + p->req.n);
	}
	return 0;
}

