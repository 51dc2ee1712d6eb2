/*
 * src/server/handlers.c - one function per opcode: decode the request, make
 * one store call, reply. Runs on the loop thread that owns the request's
 * connection (conn.c dispatches here once the connection has logged in and
 * holds the rights the opcode needs).
 *
 * PULL replies are gathered straight from table memory
 * (emb_table_pull_ptrs + an iovec per run of rows), so no row is copied on
 * the server; the table stays pinned until the reply's done callback, so a
 * concurrent DROP_TABLE cannot free memory a reply still names. Over TCP a
 * PULL copies its rows into one pooled buffer instead (pull_copy).
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/authlimit.h"
#include "common/err.h"
#include "common/log.h"
#include "common/optim.h"

#include "server/dump.h"
#include "server/fill.h"
#include "server/replybuf.h"
#include "server/slots.h"

/* A row of zeros for ids missing under NOCREATE, wide enough for a whole
 * record (Adam: weights + 2 * dim + 1 state floats); read-only. */
static const float zero_row[3 * EMB_DIM_MAX + 1];

/* A reply whose frame sits in a buffer of its loop's pool. */
static void rbuf_done(void *ctx, int status)
{
	(void)status;
	emb__rbuf_put(ctx);
}

/*
 * Constant time over the configured token, whatever the client sent, so
 * timing reveals no prefix.
 */
static bool token_ok(const uint8_t *want, uint32_t want_len,
		     const uint8_t *got, uint32_t got_len)
{
	unsigned char diff = (unsigned char)(got_len != want_len);

	for (uint32_t i = 0; i < want_len; i++)
		diff |= (unsigned char)(want[i] ^ (i < got_len ? got[i] : 0));
	return diff == 0;
}

static int on_hello(struct emb_server *s, struct emb_conn *c,
		    struct srv_conn *sc, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	struct emb_wire_hello_req h;
	struct emb_wire_hello_resp r = {0};
	bool ok, admin;
	void *buf;
	int len, rc;

	rc = emb_wire_hello_req_decode(f, &h);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	/* Guessing is slow: after a few failures from an address, no token
	 * of its is compared until its wait is over. */
	if ((s->opts.auth_token_len || s->opts.admin_token_len) &&
	    emb_authlimit_wait_ms(s->authlimit, emb_conn_peer(c))) {
		emb__reply_and_close(s, c, sc, req, EMB_EAUTH,
				     "too many failed attempts: wait");
		return 0;
	}
	/* The admin token grants everything; without one configured every
	 * client that logs in has admin rights (one level of trust). */
	if (h.admin && s->opts.admin_token_len) {
		ok = token_ok(s->admin_token, s->opts.admin_token_len,
			      h.token, h.token_len);
		admin = ok;
	} else {
		ok = !s->opts.auth_token_len ||
		     token_ok(s->token, s->opts.auth_token_len, h.token,
			      h.token_len);
		admin = ok && !s->opts.admin_token_len;
	}
	if (!ok) {
		emb_log(EMB_LOG_WARN, "%s: %sauthentication failed",
			emb_conn_peer(c), h.admin ? "admin " : "");
		emb_authlimit_fail(s->authlimit, emb_conn_peer(c));
		emb__reply_and_close(s, c, sc, req, EMB_EAUTH,
				     h.admin ? "admin authentication failed"
					     : "authentication failed");
		return 0;
	}
	if (s->opts.auth_token_len || s->opts.admin_token_len)
		emb_authlimit_ok(s->authlimit, emb_conn_peer(c));
	sc->hello = true;
	sc->admin = admin;
	/* Proved who it is: its frames may now be as large as the limit. */
	emb_conn_admit(c);
	r.server_version = EMB_WIRE_VERSION;
	r.limits = s->opts.limits;
	r.server_id = s->server_id;
	r.features = EMB_WIRE_FEAT_PUSH_SESSION | EMB_WIRE_FEAT_PULL_MANY |
		     EMB_WIRE_FEAT_ROWFMT | EMB_WIRE_FEAT_TIER |
		     EMB_WIRE_FEAT_META | EMB_WIRE_FEAT_BIRTHS |
		     EMB_WIRE_FEAT_PUSH_MANY;
	/* A client that came over TCP learns it may move to RDMA, at this
	 * host and port number (docs/protocol.md, HELLO). */
	if (s->rdma)
		r.features |= EMB_WIRE_FEAT_RDMA;
	buf = malloc(EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE);
	if (!buf) {
		emb_req_release(req);
		emb__req_end(s);
		return 0;
	}
	len = emb_wire_hello_resp_encode(
	    buf, EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE, req->hdr.req_id,
	    &r);
	if (len < 0) {
		free(buf);
		return emb__reply_error(s, req, len, NULL);
	}
	if (h.name_len)
		emb_log(EMB_LOG_DEBUG, "%s: hello from %.*s", emb_conn_peer(c),
			(int)h.name_len, h.name);
	emb__reply_frame(s, req, buf, len);
	return 0;
}

static int on_create(struct emb_server *s, struct srv_conn *sc,
		     struct emb_req *req, const struct emb_wire_frame *f)
{
	struct emb_wire_spec spec;
	uint32_t id = 0;
	int rc;

	rc = emb_wire_create_req_decode(f, &spec);
	if (!rc)
		rc = emb__tables_create(s, &spec, &id, sc->admin, false);
	if (rc == EMB_ETABLEEXISTS) {
		char why[512];

		if (emb__tables_spec_diff(s, &spec, why, sizeof(why)))
			snprintf(why, sizeof(why),
				 "a table of that name exists with another "
				 "dim, optimizer, initializer or seed");
		return emb__reply_error(s, req, rc, why);
	}
	if (rc == EMB_ENOTIER)
		return emb__reply_error(s, req, rc,
					"the table asks for a device tier "
					"(tier on) and this server was "
					"started without --tier-dir");
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	emb__reply_ack(s, req, id, 0);
	return 0;
}

static int on_list(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_table_info *info;
	uint32_t n = 0, max = s->opts.limits.max_tables;
	size_t cap;
	void *buf;
	int len, rc;

	rc = emb_wire_empty_req_decode(f, EMB_OP_LIST_TABLES);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	info = calloc(max, sizeof(*info));
	cap = EMB_WIRE_HDR_SIZE + (size_t)max * EMB_WIRE_LIST_ENTRY_SIZE;
	buf = malloc(cap);
	if (!info || !buf) {
		free(info);
		free(buf);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	n = emb__tables_list(s, info, max);
	len = emb_wire_list_resp_encode(buf, cap, req->hdr.req_id, info, n);
	free(info);
	if (len < 0) {
		free(buf);
		return emb__reply_error(s, req, len, NULL);
	}
	emb__reply_frame(s, req, buf, len);
	return 0;
}

static int on_stats(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	uint32_t max = s->opts.limits.max_tables, n = 0;
	uint32_t want = f->hdr.table_id;
	struct emb_wire_stats *w;
	size_t cap;
	void *buf;
	int len, rc;

	rc = emb_wire_empty_req_decode(f, EMB_OP_STATS);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	w = calloc(max, sizeof(*w));
	cap = EMB_WIRE_HDR_SIZE + EMB_WIRE_STATS_PREFIX_SIZE +
	      (size_t)max * (8 + 8 * EMB_WIRE_STATS_FIELDS);
	buf = malloc(cap);
	if (!w || !buf) {
		free(w);
		free(buf);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	n = emb__tables_stats(s, want, w, max);
	if (want && !n) {
		free(w);
		free(buf);
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	}
	len = emb_wire_stats_resp_encode(buf, cap, req->hdr.req_id, want, w, n);
	free(w);
	if (len < 0) {
		free(buf);
		return emb__reply_error(s, req, len, NULL);
	}
	emb__reply_frame(s, req, buf, len);
	return 0;
}

/* A worker's calls' latency during a move: the pace of this server's
 * copies ahead under --move-bound (src/server/pacer.h). */
static int on_pace(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_pace_req r;
	int rc = emb_wire_pace_req_decode(f, &r);

	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	emb__fill_pace_report(s->fill, r.p99_us, r.base_us);
	return emb__reply_ack(s, req, 0, 0);
}

static int on_ping(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_blob b;
	struct emb_frame_hdr hdr = {0};
	struct iovec iov;
	int rc;

	rc = emb_wire_ping_decode(f, false, &b);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	hdr.opcode = EMB_OP_PING | EMB_OP_RESPONSE_BIT;
	/* The echo borrows the request payload, which stays valid until the
	 * reply completes. */
	iov.iov_base = (void *)b.data;
	iov.iov_len = b.len;
	emb_conn_reply(req, &hdr, &iov, b.len ? 1 : 0, NULL, NULL);
	emb__req_end(s);
	return 0;
}

/* State of one PULL reply while its rows are on the wire. */
struct pull_ctx {
	struct emb_server *s; /* for the in-flight count */
	struct srv_conn *sc;  /* its connection; kept alive until done */
	struct srv_table *st; /* in use until done */
	struct srv_loop *l;   /* the loop st is pinned on, or NULL */
	const float **ptrs;   /* n row pointers into table memory */
	float *fresh;	      /* rows of ids not admitted yet, or NULL */
	struct iovec *iov;    /* n + 2 entries */
	uint8_t *bits;	      /* found bitmap (NOCREATE) */
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE]; /* unused header slot */
};

static void pull_done(void *ctx, int status)
{
	struct pull_ctx *pc = ctx;
	struct srv_conn *sc = pc->sc;

	(void)status;
	emb__tables_unpin_on(pc->l, pc->st);
	free(pc->fresh);
	emb__rbuf_put(pc);
	if (sc && --sc->zc_replies == 0) {
		if (!sc->c)
			free(sc); /* closed while this reply was out */
		else
			sc->s->conn_drain(sc);
	}
}

/*
 * PULL over a stream transport: copy the rows (prefetched, under the shard
 * locks, so never torn) into one buffer and send it whole. Measured against
 * one iovec per row straight from table memory, this is the faster way to
 * get scattered 256-byte rows into a TCP socket (docs/benchmarks.md); RDMA
 * keeps the zero-copy path, where the NIC does the gathering.
 */
/* Words of a pulled row of p's table: its weights (f32 with EMB_F_FP32
 * or of an fp32 table, else in its format), with the state if asked. */
static uint32_t pull_stride(const struct emb_wire_pull_req *p,
			    struct srv_table *st)
{
	if (p->with_state)
		return emb_table_row_floats(st->t);
	return p->fp32 ? st->spec.dim : emb_table_weight_words(st->t);
}

static int pull_copy(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_pull_req *p, struct srv_table *st)
{
	const uint32_t dim = pull_stride(p, st);
	const size_t bitmap = p->nocreate ? emb_wire_bitmap_bytes(p->n) : 0;
	const size_t rows = (size_t)p->n * dim * sizeof(float);
	struct emb_frame_hdr hdr = {0};
	struct iovec iov;
	uint8_t *buf, *found;
	int rc;

	/* From the loop's pool: a PULL allocates nothing once warm. */
	buf = emb__rbuf_get(emb__reply_pool(s, req),
			    bitmap + rows + (p->nocreate ? p->n : 0) + 1);
	if (!buf) {
		emb__tables_unpin(st);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	found = p->nocreate ? buf + bitmap + rows : NULL;
	/* A compact table's rows go as it keeps them, unless asked in f32;
	 * whole rows as a walk hands them out. */
	rc = p->with_state
		 ? emb_table_pull_raw(st->t, p->ids, p->n, buf + bitmap,
				      (p->nocreate ? EMB_PULL_NOCREATE : 0) |
					  EMB_PULL_STATE,
				      found)
	     : p->fp32 ? emb_table_pull(st->t, p->ids, p->n,
				      (float *)(void *)(buf + bitmap),
				      p->nocreate ? EMB_PULL_NOCREATE : 0, found)
		     : emb_table_pull_raw(st->t, p->ids, p->n, buf + bitmap,
					  p->nocreate ? EMB_PULL_NOCREATE : 0,
					  found);
	emb__tables_unpin(st);
	if (rc < 0) {
		emb__rbuf_put(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	if (found)
		emb_wire_found_pack(found, p->n, buf);
	hdr.opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	hdr.flags = (p->nocreate ? EMB_F_NOCREATE : 0) |
		    (p->with_state ? EMB_F_WITH_STATE : 0) |
		    (p->fp32 && !p->with_state ? EMB_F_FP32 : 0);
	hdr.table_id = p->table_id;
	hdr.count = p->n;
	iov.iov_base = buf;
	iov.iov_len = bitmap + rows;
	if (emb_conn_reply(req, &hdr, &iov, iov.iov_len ? 1 : 0, rbuf_done,
			   buf))
		emb__rbuf_put(buf);
	emb__req_end(s);
	return 0;
}

/*
 * A reply over the frame limit could never be sent, and the client would
 * wait for it until its deadline: answer EMB_ETOOBIG before any row is
 * made instead. False when it fits; true when the error was replied.
 * Clients split batches by the max_frame_bytes of HELLO, so only a raw
 * peer gets here.
 */
static bool reply_fails(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_pull_req *p, struct srv_table *st)
{
	uint64_t stride = pull_stride(p, st);
	uint64_t bytes = EMB_WIRE_HDR_SIZE +
			 (p->nocreate ? emb_wire_bitmap_bytes(p->n) : 0) +
			 (uint64_t)p->n * stride * sizeof(float);
	char msg[160];

	if (bytes <= s->opts.limits.max_frame_bytes)
		return false;
	snprintf(msg, sizeof(msg),
		 "reply of %llu bytes over the frame limit of %u; pull at "
		 "most %llu ids of this table at once",
		 (unsigned long long)bytes, s->opts.limits.max_frame_bytes,
		 (unsigned long long)((s->opts.limits.max_frame_bytes -
				       EMB_WIRE_HDR_SIZE) /
				      (stride * sizeof(float) + 1)));
	emb__reply_error(s, req, EMB_ETOOBIG, msg);
	return true;
}

/* Points each NULL of pc->ptrs at the initial row of its id, in one
 * buffer pc owns. 0 or -ENOMEM. */
static int fill_fresh(struct pull_ctx *pc, const struct emb_wire_pull_req *p,
		      uint32_t stride)
{
	uint32_t k = 0, nnull = 0;

	for (uint32_t i = 0; i < p->n; i++)
		nnull += !pc->ptrs[i];
	if (!nnull)
		return 0;
	pc->fresh = malloc((size_t)nnull * stride * sizeof(float));
	if (!pc->fresh)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->n; i++) {
		float *row;

		if (pc->ptrs[i])
			continue;
		row = pc->fresh + (size_t)k++ * stride;
		/* As the record would hold it: in the table's format. */
		if (p->with_state)
			emb_table_init_row(pc->st->t, p->ids[i], row, true);
		else
			emb_table_init_row_raw(pc->st->t, p->ids[i], row);
		pc->ptrs[i] = row;
	}
	return 0;
}

/*
 * Rows straight from table memory, or copied? A server with both
 * transports copies for its TCP conns whatever zero_copy_pulls says, as a
 * TCP-only server does by default: a TCP reply is gathered by sendmsg long
 * after the shard lock is gone, and TCP rows are never torn.
 */
static bool zero_copy(const struct emb_server *s, const struct emb_req *req)
{
	if (!s->opts.zero_copy_pulls)
		return false;
	return !s->dual ||
	       strcmp(emb_conn_transport(emb_req_conn(req)), "rdma") == 0;
}

static int on_pull(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_pull_req p;
	struct emb_frame_hdr hdr = {0};
	struct srv_table *st;
	struct pull_ctx *pc;
	const char *why;
	uint32_t stride;
	uint16_t wflags;
	size_t bitmap;
	char *mem;
	int rc, niov;

	rc = emb_wire_pull_req_decode(f, &p);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	rc = emb__slots_read(s->slots, p.ids, p.n, &why);
	if (rc)
		return emb__reply_error(s, req, rc, why);
	st = emb__tables_pin(s, p.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	if (reply_fails(s, req, &p, st)) {
		emb__tables_unpin(st);
		return 0;
	}
	/* Copied as any pull on a connection that copies, whole rows too
	 * (EMB_PULL_STATE). f32 rows of a compact table are decoded, so
	 * never straight from table memory; a tiered table's rows may
	 * leave for the device once the shard lock is gone. */
	if (!zero_copy(s, req) ||
	    (p.fp32 && emb_table_row_format(st->t) != EMB_ROWFMT_FP32) ||
	    emb_table_tiered(st->t))
		return pull_copy(s, req, &p, st);
	stride = pull_stride(&p, st);
	wflags = (p.nocreate ? EMB_F_NOCREATE : 0) |
		 (p.with_state ? EMB_F_WITH_STATE : 0) |
		 (p.fp32 ? EMB_F_FP32 : 0);
	bitmap = p.nocreate ? emb_wire_bitmap_bytes(p.n) : 0;
	mem = emb__rbuf_get(emb__reply_pool(s, req),
			    sizeof(*pc) + (size_t)p.n * sizeof(float *) +
				((size_t)p.n + 2) * sizeof(struct iovec) +
				bitmap + p.n);
	if (!mem) {
		emb__tables_unpin(st);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	pc = (struct pull_ctx *)(void *)mem;
	pc->s = s;
	pc->sc = NULL;
	pc->st = st;
	pc->l = emb__this_loop(s);
	pc->fresh = NULL;
	pc->ptrs = (const float **)(void *)(mem + sizeof(*pc));
	pc->iov = (struct iovec *)(void *)(pc->ptrs + p.n);
	pc->bits = (uint8_t *)(pc->iov + p.n + 2);

	rc = emb_table_pull_ptrs(st->t, p.ids, p.n, pc->ptrs,
				 p.nocreate ? EMB_PULL_NOCREATE : 0);
	if (rc < 0) {
		pull_done(pc, 0);
		return emb__reply_error(s, req, rc, NULL);
	}
	/* Without NOCREATE a NULL is an id not admitted yet (admission):
	 * it gets the row it would be created with, from a buffer of ours. */
	if (!p.nocreate && rc > 0) {
		rc = fill_fresh(pc, &p, stride);
		if (rc) {
			pull_done(pc, 0);
			return emb__reply_error(s, req, rc, NULL);
		}
	}
	if (p.nocreate) {
		uint8_t *found = pc->bits + bitmap;

		for (uint32_t i = 0; i < p.n; i++)
			found[i] = pc->ptrs[i] != NULL;
		emb_wire_found_pack(found, p.n, pc->bits);
	}
	niov = emb_wire_pull_resp_encode_ptrs(
	    pc->head, pc->iov, p.n + 2, req->hdr.req_id, p.table_id, wflags,
	    p.n, stride, pc->bits, pc->ptrs, zero_row);
	if (niov < 0) {
		pull_done(pc, 0);
		return emb__reply_error(s, req, niov, NULL);
	}
	hdr.opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	hdr.flags = wflags;
	hdr.table_id = p.table_id;
	hdr.count = p.n;
	/* iov[0] is the encoder's header; the transport writes its own. */
	/* From here until pull_done() the reply reads table memory. */
	pc->sc = emb_conn_user(req->conn);
	if (pc->sc)
		pc->sc->zc_replies++;
	if (emb_conn_reply(req, &hdr, pc->iov + 1, niov - 1, pull_done, pc))
		pull_done(pc, 0);
	emb__req_end(s);
	return 0;
}

/* Ends a request on table st: drops the reference, then acks or errs. */
static int end_table_op(struct emb_server *s, struct emb_req *req,
			struct srv_table *st, int rc, uint32_t count)
{
	uint32_t id = st->id;

	emb__tables_unpin(st);
	if (rc < 0)
		return emb__reply_error(s, req, rc, NULL);
	emb__reply_ack(s, req, id, count);
	return 0;
}

static int on_push(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	char msg[EMB_NAME_MAX + 160];
	int rc = emb__push_one(s, req, f, msg, sizeof(msg));

	if (rc == 1)
		return 0; /* held until its synchronous step is applied */
	if (rc < 0)
		return emb__reply_error(s, req, rc, msg[0] ? msg : NULL);
	emb__reply_ack(s, req, f->hdr.table_id, 0);
	return 0;
}

static int on_set_lifecycle(struct emb_server *s, struct emb_req *req,
			    const struct emb_wire_frame *f)
{
	struct emb_wire_set_lifecycle_req m;
	char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];
	struct srv_table *st;
	int rc;

	rc = emb_wire_set_lifecycle_req_decode(f, &m);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	st = emb__tables_pin(s, m.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	rc = emb__tables_number(st, &m.life);
	if (!rc)
		rc = emb_table_set_lifecycle(st->t, &m.life);
	if (!rc) {
		emb_admit_format(&m.life, a, sizeof(a));
		emb_evict_format(&m.life, e, sizeof(e));
		emb_log(EMB_LOG_INFO, "table %s: admit %s, evict %s",
			st->spec.name, a, e);
	}
	return end_table_op(s, req, st, rc, 0);
}

static int on_set_mode(struct emb_server *s, struct emb_req *req,
		       const struct emb_wire_frame *f)
{
	struct emb_wire_set_mode_req m;
	struct srv_table *st;
	int rc;

	rc = emb_wire_set_mode_req_decode(f, &m);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	st = emb__tables_pin(s, m.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	rc = emb__sync_set_mode(st->sync, m.mode, m.workers, m.staleness);
	if (!rc)
		emb_log(EMB_LOG_INFO, "table %s: mode %s", st->spec.name,
			m.mode == EMB_MODE_SYNC	   ? "sync"
			: m.mode == EMB_MODE_STALE ? "bounded staleness"
						   : "async");
	if (rc == -EBUSY) {
		emb__tables_unpin(st);
		return emb__reply_error(s, req, rc,
					"a synchronous step is being gathered");
	}
	return end_table_op(s, req, st, rc, 0);
}

/*
 * A fill's rows keep their lifecycle data (EMB_F_META): the sender's idle
 * times become last accesses on this table's clock, so that ttl and LRU
 * see a moved row as idle as it was, and LFU as often used. NULL on
 * -ENOMEM (the caller answers it).
 */
static struct emb_row_meta *assign_meta(struct emb_table *t,
					const struct emb_wire_assign_req *a)
{
	struct emb_row_meta *m = malloc((size_t)a->n * sizeof(*m) + 1);
	uint32_t now = emb_table_now(t);

	if (!m)
		return NULL;
	for (uint32_t i = 0; i < a->n; i++) {
		m[i].last_step = now - a->meta[2 * i];
		m[i].count = a->meta[2 * i + 1];
	}
	return m;
}

/*
 * The first rows of a move's copy ahead (a new map epoch) to table st,
 * once applied: its index is sized for the rows still to come, the
 * table's rows per slot held here times the slots between what it holds
 * and its share once the moves end (at least the chunk coming now), so
 * that it does not grow by 1.5x again and again as they land
 * (docs/store.md, "Room for a move"). A newcomer's first chunk has
 * nothing to go by (no slot held): its rows grow the index as they come,
 * and the next chunk sizes it for the rest of the join.
 */
static void size_for_copy(struct emb_server *s, struct srv_table *st,
			  uint64_t epoch)
{
	uint64_t last = __atomic_load_n(&st->sized, __ATOMIC_RELAXED);
	struct emb_table_stats ts;
	uint32_t held, warming, share, coming, sized;
	uint64_t rows;

	if (epoch <= last ||
	    !__atomic_compare_exchange_n(&st->sized, &last, epoch, false,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return;
	emb__slots_warming(s->slots, &held, &warming, &share);
	if (!held || !warming)
		return;
	coming = share > held + warming ? share - held : warming;
	emb_table_stats(st->t, &ts);
	rows = ts.rows * coming / held;
	sized = emb_table_reserve(st->t, rows);
	if (sized)
		emb_log(EMB_LOG_INFO,
			"table %s: index sized for %llu rows more (%u "
			"shards; map epoch %llu: %u slots held, %u to come)",
			st->spec.name, (unsigned long long)rows, sized,
			(unsigned long long)epoch, held, coming);
}

static int on_assign(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	struct emb_wire_assign_req a;
	struct emb_row_meta *meta = NULL;
	struct srv_table *st;
	const char *why;
	uint32_t dim;
	int rc, held;

	st = emb__tables_pin(s, f->hdr.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	dim = st->spec.dim;
	/* Whole rows are in the table's format, weights alone in f32. */
	rc = emb_wire_assign_req_decode(
	    f,
	    (f->hdr.flags & EMB_F_WITH_STATE) ? emb_table_weight_words(st->t)
					      : dim,
	    emb_optim_state_floats(st->spec.optim.kind, dim), &a);
	if (!rc && a.meta && !(meta = assign_meta(st->t, &a)))
		rc = -ENOMEM;
	/* A replicated assign to a table that numbers its rows names the
	 * births its primary gave, as a push does (push.c); a fill's rows
	 * carry their own. */
	if (!rc && (f->hdr.flags & (EMB_F_EPOCH | EMB_F_FILL)) == EMB_F_EPOCH &&
	    !a.births && a.n && emb_table_has_births(st->t)) {
		free(meta);
		emb__tables_unpin(st);
		return emb__reply_error(
		    s, req, EMB_EADMITASK,
		    "this table has an eviction policy: a replicated assign "
		    "must name each row's birth, asked of the primary first "
		    "(a client before replicated eviction, or one that did "
		    "not know the policy)");
	}
	if (!rc) {
		held = emb__slots_begin(s->slots, &f->hdr, a.ids, a.n, &why);
		if (held < 0) {
			free(meta);
			emb__tables_unpin(st);
			return emb__reply_error(s, req, held, why);
		}
		rc = emb_table_assign_births(st->t, a.ids, a.n, a.rows,
					     a.with_state, meta, a.births);
		emb__slots_end(s->slots, held);
	}
	/* Only once the view took the copy's rows: a request that names
	 * a copy this server is not being given (or an epoch it has not
	 * seen) sizes nothing, nor keeps the real copy from sizing. */
	if (!rc && (f->hdr.flags & (EMB_F_FILL | EMB_F_WARM)) ==
		       (EMB_F_FILL | EMB_F_WARM))
		size_for_copy(s, st, emb_wire_req_epoch(&f->hdr));
	free(meta);
	if (rc == EMB_ENONFINITE) {
		char msg[EMB_NAME_MAX + 120];

		emb__count(&s->nonfinite, 1);
		snprintf(msg, sizeof(msg),
			 "table %s: the row of id %llu is NaN or infinite%s; "
			 "no row was changed",
			 st->spec.name,
			 (unsigned long long)emb_table_nonfinite_id(),
			 st->spec.row_format == EMB_ROWFMT_FP32
			     ? ""
			     : ", or out of the row format's range");
		emb__tables_unpin(st);
		return emb__reply_error(s, req, rc, msg);
	}
	return end_table_op(s, req, st, rc, 0);
}

static int on_erase(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	struct emb_wire_ids_req e;
	struct srv_table *st;
	const char *why;
	int rc, held;

	rc = emb_wire_erase_req_decode(f, &e);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	st = emb__tables_pin(s, e.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	held = emb__slots_begin(s->slots, &f->hdr, e.ids, e.n, &why);
	if (held < 0) {
		emb__tables_unpin(st);
		return emb__reply_error(s, req, held, why);
	}
	rc = emb_table_erase(st->t, e.ids, e.n);
	emb__slots_end(s->slots, held);
	return end_table_op(s, req, st, rc, rc > 0 ? (uint32_t)rc : 0);
}

/* BIRTHS of a tiered table (no births): which ids are rows, DRAM or
 * device, by a no-create pull in chunks. */
static int tier_births(struct emb_table *t, const uint64_t *ids, uint32_t n,
		       uint32_t *births)
{
	enum { CHUNK = 256 };
	const uint32_t dim = emb_table_dim(t);
	uint8_t found[CHUNK];
	float *rows = malloc((size_t)CHUNK * dim * sizeof(float));
	int got = 0;

	if (!rows)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i += CHUNK) {
		uint32_t m = n - i < CHUNK ? n - i : CHUNK;
		int rc = emb_table_pull(t, ids + i, m, rows,
					EMB_PULL_NOCREATE, found);

		if (rc < 0) {
			free(rows);
			return rc;
		}
		for (uint32_t k = 0; k < m; k++) {
			births[i + k] = found[k] ? 0 : EMB_BIRTH_NONE;
			got += found[k] != 0;
		}
	}
	free(rows);
	return got;
}

/*
 * BIRTHS with EMB_F_MAKE: the ids that are no rows are made, as the push
 * that follows would make them on a lone server (a table without
 * admission; pflags 0), or as an assign would whatever the admission
 * (EMB_F_ADMITTED too; pflags EMB_PULL_ADMITTED), by a pull in chunks, and
 * their births read again. One evicted between the two reads stays
 * EMB_BIRTH_NONE: its push is dropped, as one racing an eviction may be.
 * Returns how many ids are rows, or the pull's error.
 */
static int births_make(struct emb_table *t, const uint64_t *ids, uint32_t n,
		       uint32_t *births, uint32_t pflags)
{
	enum { CHUNK = 256 };
	const uint32_t dim = emb_table_dim(t);
	uint64_t miss[CHUNK];
	uint32_t at[CHUNK], b[CHUNK];
	float *rows = malloc((size_t)CHUNK * dim * sizeof(float));
	int got = 0;

	if (!rows)
		return -ENOMEM;
	for (uint32_t i = 0; i < n;) {
		uint32_t m = 0;
		int rc;

		for (; i < n && m < CHUNK; i++) {
			if (births[i] != EMB_BIRTH_NONE) {
				got++;
				continue;
			}
			at[m] = i;
			miss[m++] = ids[i];
		}
		if (!m)
			continue;
		rc = emb_table_pull(t, miss, m, rows, pflags, NULL);
		if (rc >= 0)
			rc = emb_table_births(t, miss, m, b);
		if (rc < 0) {
			free(rows);
			return rc;
		}
		for (uint32_t k = 0; k < m; k++) {
			births[at[k]] = b[k];
			got += b[k] != EMB_BIRTH_NONE;
		}
	}
	free(rows);
	return got;
}

/*
 * LOCATE: where the ids' records lie, with the rkey of this conn's loop
 * (each loop registers table memory in its own protection domain, so a
 * location is good for READs on the conn that asked). Creates nothing.
 */
static int on_locate(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	struct emb_transport *tr = emb_req_conn(req)->tr;
	struct emb_wire_locate_resp r;
	struct emb_table_remote rt;
	struct emb_wire_ids_req q;
	struct srv_table *st;
	uint64_t *addrs;
	size_t len;
	char *buf;
	int rc;

	rc = emb_wire_locate_req_decode(f, &q);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	st = emb__tables_get(s, q.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	if (!emb_table_remote(st->t, &rt)) {
		emb__tables_put(st);
		return emb__reply_error(s, req, EMB_ENOTREMOTE, NULL);
	}
	len = emb_wire_locate_resp_bytes(q.n);
	if (len > s->opts.limits.max_frame_bytes) {
		emb__tables_put(st);
		return emb__reply_error(
		    s, req, EMB_ETOOMANYIDS,
		    "LOCATE response would pass the frame limit");
	}
	buf = aligned_alloc(64, (len + 63) & ~(size_t)63);
	if (!buf) {
		emb__tables_put(st);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	/* The addresses go where the entries will be, half as wide: filled
	 * back to front, entry i overwrites only addresses >= i. */
	r.entries = buf + EMB_WIRE_HDR_SIZE + EMB_WIRE_LOCATE_HEAD_SIZE;
	addrs = (uint64_t *)r.entries;
	rc = (int)emb_table_locate(st->t, q.ids, q.n, addrs);
	emb__tables_put(st);
	if (rc < 0) {
		free(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	for (uint32_t i = q.n; i-- > 0;) {
		uint64_t a = addrs[i];
		uint32_t rkey = 0;

		if (a && emb_transport_rkey(tr, (void *)(uintptr_t)a,
					    rt.rec_bytes, &rkey) != 0)
			a = 0;
		emb_wire_locate_entry_put(r.entries, i, a, rkey);
	}
	r.seed = rt.seed;
	r.rec_bytes = rt.rec_bytes;
	r.row_floats = rt.row_floats;
	r.n = q.n;
	rc = emb_wire_locate_resp_encode(buf, len, req->hdr.req_id, q.table_id,
					 &r);
	if (rc < 0) {
		free(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	return emb__reply_frame(s, req, buf, rc);
}

/*
 * BIRTHS: the births of the ids' rows, or which are rows (a table that
 * numbers none answers 0 for each): the ask a replicated client makes of
 * a slot's primary before a push (docs/replication.md). Creates nothing
 * and is no sighting. A tiered table's cold rows are found by a no-create
 * pull, whose rows are dropped.
 */
static int on_births(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	struct emb_wire_ids_req q;
	struct srv_table *st;
	const char *why = NULL;
	uint32_t *births;
	size_t len;
	char *buf;
	int rc;

	rc = emb_wire_births_req_decode(f, &q);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	/* Asked of a slot's primary, as a pull: a stale route is refused
	 * (and rerouted) rather than answered, or rows made, by a server
	 * that holds no copy. */
	rc = emb__slots_read(s->slots, q.ids, q.n, &why);
	if (rc)
		return emb__reply_error(s, req, rc, why);
	st = emb__tables_get(s, q.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	/* 4 bytes an id against the request's 8: never past the limit. */
	len = emb_wire_births_resp_bytes(q.n);
	buf = aligned_alloc(64, (len + 63) & ~(size_t)63);
	if (!buf) {
		emb__tables_put(st);
		return emb__reply_error(s, req, -ENOMEM, NULL);
	}
	births = (uint32_t *)(void *)(buf + EMB_WIRE_HDR_SIZE);
	rc = emb_table_births(st->t, q.ids, q.n, births);
	if (rc == -EOPNOTSUPP)
		rc = tier_births(st->t, q.ids, q.n, births);
	else if (rc >= 0 && (uint32_t)rc < q.n && (f->hdr.flags & EMB_F_MAKE) &&
		 ((f->hdr.flags & EMB_F_ADMITTED) || !emb_table_admits(st->t)))
		rc = births_make(st->t, q.ids, q.n, births,
				 f->hdr.flags & EMB_F_ADMITTED ? EMB_PULL_ADMITTED
							      : 0);
	emb__tables_put(st);
	if (rc < 0) {
		free(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	rc = emb_wire_births_resp_encode(buf, len, req->hdr.req_id, q.table_id,
					 births, q.n);
	if (rc < 0) {
		free(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	return emb__reply_frame(s, req, buf, rc);
}

/*
 * LIST_BIRTHS: every row of some slots with its birth, and each slot's
 * counter read before: what a backup checks its copy of the slots against
 * (docs/replication.md, "Eviction with replicas"). Rows made meanwhile
 * may not fit the first guess: listed again, larger, a few times.
 */
static int on_list_births(struct emb_server *s, struct emb_req *req,
			  const struct emb_wire_frame *f)
{
	struct emb_wire_list_births r = {0};
	struct srv_table *st;
	uint32_t first, n, cap;
	size_t len, head;
	char *buf = NULL;
	int rc, got = 0;

	rc = emb_wire_list_births_req_decode(f, &first, &n);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	st = emb__tables_get(s, f->hdr.table_id);
	if (!st)
		return emb__reply_error(s, req, EMB_ENOTABLE, NULL);
	if (!emb_table_has_births(st->t)) {
		char msg[EMB_NAME_MAX + 64];

		snprintf(msg, sizeof(msg),
			 "table %s does not number its rows", st->spec.name);
		emb__tables_put(st);
		return emb__reply_error(s, req, EMB_EBADARG, msg);
	}
	head = EMB_WIRE_HDR_SIZE + 8 + ((size_t)n * 4 + 7) / 8 * 8;
	rc = 0;
	for (int tries = 0; tries < 4; tries++) {
		if (tries == 0) {
			/* How many there are now, marks aside. */
			uint32_t *tmp = malloc((size_t)n * sizeof(*tmp));

			got = tmp ? emb_table_births_list(st->t, first, n, tmp,
							  NULL, NULL, 0)
				  : -ENOMEM;
			free(tmp);
			if (got < 0)
				break;
		}
		cap = (uint32_t)got + (uint32_t)got / 8 + 64;
		len = emb_wire_list_births_resp_bytes(n, cap);
		if (len > s->opts.limits.max_frame_bytes) {
			got = EMB_ETOOBIG;
			break;
		}
		buf = aligned_alloc(64, (len + 63) & ~(size_t)63);
		if (!buf) {
			got = -ENOMEM;
			break;
		}
		r.marks = (uint32_t *)(void *)(buf + EMB_WIRE_HDR_SIZE + 8);
		r.ids = (uint64_t *)(void *)(buf + head);
		r.births = (uint32_t *)(void *)(buf + head + (size_t)cap * 8);
		got = emb_table_births_list(st->t, first, n,
					    (uint32_t *)r.marks,
					    (uint64_t *)r.ids,
					    (uint32_t *)r.births, cap);
		if (got < 0 || (uint32_t)got <= cap)
			break;
		free(buf);
		buf = NULL;
	}
	emb__tables_put(st);
	if (got >= 0 && !buf)
		got = -EAGAIN; /* rows made faster than listed, each try */
	if (got < 0) {
		free(buf);
		return emb__reply_error(
		    s, req, got,
		    got == EMB_ETOOBIG
			? "the slots' rows pass the frame limit: ask fewer "
			  "slots at a time"
			: NULL);
	}
	r.n = n;
	r.m = (uint32_t)got;
	rc = emb_wire_list_births_resp_encode(
	    buf, emb_wire_list_births_resp_bytes(n, cap), req->hdr.req_id,
	    f->hdr.table_id, &r);
	if (rc < 0) {
		free(buf);
		return emb__reply_error(s, req, rc, NULL);
	}
	return emb__reply_frame(s, req, buf, rc);
}

static int on_drop(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	int rc = emb_wire_empty_req_decode(f, EMB_OP_DROP_TABLE);

	if (!rc)
		rc = emb__tables_drop(s, f->hdr.table_id);
	if (rc)
		return emb__reply_error(s, req, rc, NULL);
	emb__reply_ack(s, req, f->hdr.table_id, 0);
	return 0;
}

int emb__handle(struct emb_server *s, struct emb_conn *c, struct srv_conn *sc,
		struct emb_req *req, const struct emb_wire_frame *f)
{
	switch (f->hdr.opcode) {
	case EMB_OP_HELLO:
		return on_hello(s, c, sc, req, f);
	case EMB_OP_PULL:
		return on_pull(s, req, f);
	case EMB_OP_PULL_MANY:
		return emb__on_pull_many(s, req, f);
	case EMB_OP_PUSH_MANY:
		return emb__on_push_many(s, req, f);
	case EMB_OP_PUSH:
		return on_push(s, req, f);
	case EMB_OP_PING:
		return on_ping(s, req, f);
	case EMB_OP_PACE:
		return on_pace(s, req, f);
	case EMB_OP_CREATE_TABLE:
		return on_create(s, sc, req, f);
	case EMB_OP_DROP_TABLE:
		return on_drop(s, req, f);
	case EMB_OP_LIST_TABLES:
		return on_list(s, req, f);
	case EMB_OP_ASSIGN:
		return on_assign(s, req, f);
	case EMB_OP_ERASE:
		return on_erase(s, req, f);
	case EMB_OP_LOCATE:
		return on_locate(s, req, f);
	case EMB_OP_BIRTHS:
		return on_births(s, req, f);
	case EMB_OP_LIST_BIRTHS:
		return on_list_births(s, req, f);
	case EMB_OP_STATS:
		return on_stats(s, req, f);
	case EMB_OP_SET_MODE:
		return on_set_mode(s, req, f);
	case EMB_OP_SET_LIFECYCLE:
		return on_set_lifecycle(s, req, f);
	case EMB_OP_DUMP_BEGIN:
	case EMB_OP_DUMP_CHUNK:
	case EMB_OP_DUMP_END:
		if (emb__server_dump(s, req, f, &sc->dump))
			emb__count(&s->errors, 1);
		emb__req_end(s);
		return 0;
	default:
		return emb__reply_error(s, req, -EOPNOTSUPP,
					"opcode reserved for a later version");
	}
}
