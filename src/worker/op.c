/*
 * src/worker/op.c - the data calls: pull, push, assign and erase.
 *
 * A call builds an op in the caller's thread (batch.c: dedup, partition
 * by server or replica group, split to the servers' limits), hands it to
 * the loop with emb__op_post(), and the loop thread sends one request per
 * part (conn.c; onesided.c READs a one-sided pull's rows). As responses
 * arrive, the loop thread scatters rows into the caller's buffer, so an
 * asynchronous pull overlaps with the caller's compute; the last part to
 * finish wakes the waiter. Op fields other than mu/cv/done are touched by
 * the caller before posting and after completion, and by the loop thread
 * in between, never by both at once.
 *
 * Pushes carry the client's session id and a per-server sequence number,
 * so a server applies a retried push at most once (docs/protocol.md,
 * PUSH).
 *
 * One skeleton (op_start()) serves the four calls, and a struct kind says
 * what differs: the opcode, whether ids are deduplicated, whether a
 * replicated map partitions them by replica group, the response buffers,
 * each part's payload, and what a part's end means (one completion hook
 * per kind of op: a pull reroutes and scatters, a write goes again when a
 * fill refused it, an erase counts, a fan-out skips dead servers).
 *
 * Threads: the public calls from any thread; the rest on the loop thread.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"
#include "cluster/node.h"

static void note_server_error(struct emb_client *c, struct part *p)
{
	struct emb_wire_frame f = {.hdr = p->req.rhdr, .payload = p->req.resp};
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_error e;

	f.lim = &lim;
	if (emb_wire_error_decode(&f, &e) != 0)
		return;
	pthread_mutex_lock(&c->err_lock);
	c->last_status = e.status;
	snprintf(c->last_msg, sizeof(c->last_msg), "%.*s", (int)e.msg_len,
		 e.msg);
	pthread_mutex_unlock(&c->err_lock);
	emb_log(EMB_LOG_DEBUG, "server %s:%u: %s: %.*s",
		c->srv[p->req.server].host, c->srv[p->req.server].port,
		emb_strerror(e.status), (int)e.msg_len, e.msg);
}

/* Loop thread: copies a pull part's rows to every position of its ids. */
static int pull_scatter(struct emb_async *op, struct part *p)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.hdr = p->req.rhdr, .payload = p->req.resp};
	struct emb_wire_pull_resp r;
	const size_t row_sz = (size_t)op->dim * sizeof(float);
	int rc;

	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f.lim = &lim;
	rc = emb_wire_pull_resp_decode(&f, op->wire - op->state, op->state,
				       &r);
	if (rc)
		return rc;
	/* A server that ignored the state flag sends rows of dim floats. */
	if (r.n != p->req.n || r.stride != op->wire ||
	    (f.hdr.flags & EMB_F_FP32))
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < r.n; j++) {
		const float *row = r.rows + (size_t)j * op->wire;
		uint32_t u =
		    op->pu[p->req.first + (p->rd.fb ? p->rd.miss[j] : j)];
		uint8_t hit = r.found ? emb_wire_bit_test(r.found, j) : 1;
		uint32_t i = op->first[u];

		/* Decoded once, into the first position; copied to the
		 * others. */
		if (op->decode != EMB_ROWFMT_FP32 && i != NONE) {
			emb_rowfmt_decode(op->decode, row,
					  op->out + (size_t)i * op->dim,
					  op->dim);
			row = op->out + (size_t)i * op->dim;
			if (op->found)
				op->found[i] = hit;
			i = op->next[i];
		}
		for (; i != NONE; i = op->next[i]) {
			memcpy(op->out + (size_t)i * op->dim, row, row_sz);
			if (op->found)
				op->found[i] = hit;
		}
	}
	return 0;
}

/*
 * Loop thread, once every part ended: a replicated write failed only
 * when no copy of some part was applied. Its dead holders are no error.
 */
static void rep_check(struct emb_async *op)
{
	for (uint32_t k = 0; k < op->nparts; k++) {
		const struct part *p = &op->parts[k];
		bool applied = false;

		if (!p->rep.nrep || p->rep.lead != k)
			continue;
		for (uint32_t j = 0; j < p->rep.nrep; j++)
			applied |= op->parts[k + j].req.status == 0;
		if (!applied && !op->status)
			op->status = p->req.status;
	}
}

static void op_finish(struct emb_async *op)
{
	if (op->c->cmap) {
		rep_check(op);
		emb__pace_record(op->c, op);
	}
	emb__op_complete(op);
}

/*
 * Loop thread: the server's verdict on p's request (resp NULL: none, as
 * for a one-sided part that READ every row). Keeps the response header;
 * a server error is noted for emb_client_last_error() and returned, else
 * status as given.
 */
static int resp_status(struct part *p, int status,
		       const struct emb_frame_hdr *resp)
{
	if (status || !resp)
		return status;
	p->req.rhdr = *resp;
	if (resp->status < 0) {
		note_server_error(p->op->c, p);
		return resp->status;
	}
	return 0;
}

/* Loop thread: p is over with status; the last part ends the op. */
static void part_close(struct part *p, int status)
{
	struct emb_async *op = p->op;

	p->req.status = status;
	if (status) {
		add(&op->c->errors, 1);
		/* A copy on a dead holder: rep_check() decides. */
		if (!op->status && !(p->rep.nrep && status == EMB_ENODEAD))
			op->status = status;
	}
	if (--op->pending == 0)
		op_finish(op);
}

static void part_send(struct emb_client *c, struct part *p);

/*
 * Pull: a part whose server died goes to a live holder of its slots; the
 * rows scatter to the caller; ids pulled two-sided are LOCATEd for the
 * next one-sided pull.
 */
/*
 * A read's part (pull, BIRTHS) that goes again: its server died (to a
 * live holder of its slots, p or parts split off it), or holds no copy
 * of some of its slots any more (a move put them elsewhere,
 * docs/replication.md "Moving slots": nothing was read; again by the
 * newer map, after a back-off). True when p is taken care of.
 */
static bool read_again(struct part *p, int status,
		       const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (status == EMB_ENODEAD) {
		switch (emb__rep_reroute(op, p)) {
		case REROUTE_MOVED:
			add(&op->c->retries, 1);
			part_send(op->c, p);
			return true;
		case REROUTE_SPLIT:
			/* Its ids went out in parts of their own. */
			part_close(p, 0);
			return true;
		case REROUTE_NONE:
			break;
		}
	}
	if (status == 0 && resp && resp->status == EMB_ESTALEMAP &&
	    op->c->cmap && !stopping(op->c) &&
	    emb_clock_ms() < op->deadline_ms) {
		if (op->c->node)
			emb_node_map_refresh(op->c->node);
		add(&op->c->moved, 1);
		p->req.status = resp->status;
		p->retry.reroute = true;
		emb__rep_delay(op->c, p);
		return true;
	}
	return false;
}

static void pull_end(struct part *p, int status,
		     const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (read_again(p, status, resp))
		return;
	status = resp_status(p, status, resp);
	if (status == 0 && resp)
		status = pull_scatter(op, p);
	if (status == 0 && (p->rd.learn || p->rd.fb))
		emb__os_learn(op, p);
	part_close(p, status);
}

/* Loop thread: copies a BIRTHS part's answer to every position of its
 * ids. */
static int births_scatter(struct emb_async *op, struct part *p)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.hdr = p->req.rhdr, .payload = p->req.resp};
	const uint32_t *b;
	uint32_t n;
	int rc;

	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f.lim = &lim;
	rc = emb_wire_births_resp_decode(&f, &n, &b);
	if (rc)
		return rc;
	if (n != p->req.n)
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < n; j++) {
		/* A part split off a dead server's (replicas.c) says where
		 * each of its ids goes, as a pull's does. */
		uint32_t u =
		    op->pu[p->req.first + (p->rd.fb ? p->rd.miss[j] : j)];

		for (uint32_t i = op->first[u]; i != NONE; i = op->next[i])
			op->births[i] = b[j];
	}
	return 0;
}

/* BIRTHS: as a pull (a dead primary's part goes to the slots' next
 * holder, a stale route again by the newer map), the births scattered. */
static void births_end(struct part *p, int status,
		       const struct emb_frame_hdr *resp)
{
	if (read_again(p, status, resp))
		return;
	status = resp_status(p, status, resp);
	if (status == 0 && resp)
		status = births_scatter(p->op, p);
	part_close(p, status);
}

/*
 * Loop thread: a copy refused because its slots are being filled, or
 * routed by an older map than the server's: not applied (the server
 * refuses only a push its session window has not seen), so it goes
 * again, same server and sequence number, after a back-off. True when p
 * is taken care of: delayed, or over with -ETIMEDOUT once the deadline
 * passed (emb_last_error() names the server that kept refusing).
 */
static bool write_again(struct part *p, int status,
			const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	/* A stale map is worth a retry only where a newer one can come: from
	 * the node agent, or as a fixup of a copy routed by an older one. */
	if (status || stopping(op->c) ||
	    (resp->status != EMB_EMOVING &&
	     !(resp->status == EMB_ESTALEMAP && (op->c->node || p->rep.epoch))))
		return false;
	if (emb_clock_ms() >= op->deadline_ms) {
		part_close(p, emb__conn_timeout(op->c, p, resp->status));
		return true;
	}
	if (resp->status == EMB_ESTALEMAP && op->c->node)
		emb_node_map_refresh(op->c->node);
	add(&op->c->moved, 1);
	/* What the server said, should the deadline pass meanwhile. */
	p->req.status = resp->status;
	emb__rep_delay(op->c, p);
	return true;
}

/*
 * A copy whose server died: the group's other copies decide (rep_check()),
 * unless the server was the source of a fill its copy spoke for
 * (emb__rep_lost()): then the fill's target gets the rows, or the call
 * fails, or, while the client's map guesses that fill's fate, p waits for
 * the next map and ends again. True when p waits.
 */
static bool lost_copy(struct part *p, int status)
{
	struct emb_async *op = p->op;
	int rc;

	if (status != EMB_ENODEAD || !p->rep.nrep)
		return false;
	rc = emb__rep_lost(op->c, op, p);
	if (rc == EMB_REP_WAIT) {
		p->req.status = status;
		emb__rep_delay(op->c, p);
		return true;
	}
	if (rc && !op->status)
		op->status = rc;
	return false;
}

/* Push and assign: applied, refused for a fill (again), or failed. */
static void write_end(struct part *p, int status,
		      const struct emb_frame_hdr *resp)
{
	if (write_again(p, status, resp) || lost_copy(p, status))
		return;
	part_close(p, resp_status(p, status, resp));
}

/* Erase: as a write, and the ids that existed, counted once per part. */
static void erase_end(struct part *p, int status,
		      const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (write_again(p, status, resp) || lost_copy(p, status))
		return;
	status = resp_status(p, status, resp);
	/* One copy's count: the first to answer of the group's own copies
	 * (the first holder may be dead; a fixup's copy has some rows
	 * only). */
	if (status == 0 && resp && !p->rep.nrep) {
		op->count += resp->count;
	} else if (status == 0 && resp && p >= op->parts &&
		   p < op->parts + op->nparts &&
		   !op->parts[p->rep.lead].rep.counted) {
		op->parts[p->rep.lead].rep.counted = true;
		op->count += resp->count;
	}
	part_close(p, status);
}

/*
 * A fan-out (broadcast.c): a server that died, before or during the call,
 * is no longer asked when the live servers hold every slot.
 */
static void admin_end(struct part *p, int status,
		      const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (status == EMB_ENODEAD && op->c->cmap) {
		uint32_t lost = emb__rep_lost_slots(op->c);

		if (!lost) {
			p->rep.skip = true;
			part_close(p, 0);
			return;
		}
		emb__rep_note_lost(op->c, p, lost);
	}
	part_close(p, resp_status(p, status, resp));
}

/* A data call's arguments and its batch as arranged, for the hooks. */
struct call {
	struct emb_client_table *t; /* the table */
	const uint64_t *ids;	    /* caller's, n of them */
	uint32_t n;		    /* caller's ids */
	const float *rows;	    /* push: gradients, assign: rows; else
				       NULL */
	float *out;		    /* pull: caller's rows */
	uint32_t *births;	    /* births: caller's births[] */
	const uint32_t *push_births; /* push, assign: each id's birth on its
					slot's primary (repeats name the
					same), named in the frame; or NULL */
	uint8_t *found;		    /* pull: caller's found[] or NULL */
	uint32_t stride;	    /* floats per row sent or received */
	uint16_t flags;		    /* wire flags of every part */
	bool raw;		    /* pull: rows as the table keeps them */
	uint32_t half;		    /* push: EMB_ROWFMT_FP16/BF16 gradients on
				       the wire, prows then holds 2-byte
				       values; 0 = f32 */
	uint64_t step;		    /* push */
	uint32_t rank;		    /* push */
	uint64_t *pids;		    /* ids in partitioned order (op->mem) */
	float *prows;		    /* their rows, or NULL */
	uint32_t *pbirths;	    /* push, assign: their births, or NULL */
};

/* What one kind of data call does at each step of op_start(). */
struct kind {
	enum op_kind kind; /* what completes the parts */
	uint8_t opcode;	   /* of every part */
	bool dedup;	   /* ids deduplicated (rows summed), else sent as
			      given: last write wins in batch order */
	bool by_group;	   /* a replicated map sends it to every holder */
	/* Before the batch is arranged (NULL: nothing). */
	void (*init)(struct emb_async *op, const struct call *a);
	/* Response buffers of the parts made. 0 or -ENOMEM. */
	int (*resp)(struct emb_async *op, const struct call *a);
	/* Part p's request payload and flags. */
	void (*payload)(struct emb_async *op, const struct call *a,
			struct part *p);
};

/* The pull holds its table: the user may close it while it runs. */
static void pull_init(struct emb_async *op, const struct call *a)
{
	struct emb_client_table *t = a->t;

	op->dim = a->stride;
	/* The servers send a compact table's rows as they keep them; they
	 * are decoded here, unless the caller asked for them raw. */
	op->state = (a->flags & EMB_F_WITH_STATE) ? t->row_floats - t->wwords
						   : 0;
	op->wire = (a->flags & EMB_F_WITH_STATE) ? t->row_floats : t->wwords;
	op->decode = !(a->flags & EMB_F_WITH_STATE) && !a->raw
			 ? t->spec.row_format
			 : EMB_ROWFMT_FP32;
	op->n = a->n;
	op->out = a->out;
	op->found = a->found;
	op->tids = t->ids;
	op->tbl = t;
	__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
}

/*
 * Room for each part's rows (or an error), and the landings of its READs
 * when one-sided, in a registered buffer from the pool: over RDMA the rows
 * land there, not in bounce pages that would be copied (docs/rdma.md).
 */
static int pull_resp(struct emb_async *op, const struct call *a)
{
	size_t resp_bytes = 0;
	char *r;
	int rc;

	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp_cap =
		    emb_wire_pull_resp_bytes(p->req.n, op->wire, a->flags) -
		    EMB_WIRE_HDR_SIZE;
		if (p->req.resp_cap < ERR_CAP)
			p->req.resp_cap = ERR_CAP;
		resp_bytes += (p->req.resp_cap + 63) & ~(size_t)63;
	}
	rc = emb__os_plan(op, a->t, &resp_bytes);
	if (rc)
		return rc;
	op->rbuf = emb__respbuf_get(op->c->bufs, resp_bytes ? resp_bytes : 64);
	if (!op->rbuf)
		return -ENOMEM;
	r = op->rbuf->mem;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp = r;
		r += (p->req.resp_cap + 63) & ~(size_t)63;
		if (p->rd.os) {
			p->rd.land = r;
			r += ((size_t)p->req.n * p->rd.rb + 63) & ~(size_t)63;
		}
	}
	return 0;
}

/* Writes answer nothing on success: room for an error only. */
static int write_resp(struct emb_async *op, const struct call *a)
{
	(void)a;
	return emb__op_err_bufs(op);
}

static void pull_payload(struct emb_async *op, const struct call *a,
			 struct part *p)
{
	(void)op;
	p->req.hdr.flags = a->flags;
	p->req.iov[0].iov_base = a->pids + p->req.first;
	p->req.iov[0].iov_len = (size_t)p->req.n * sizeof(uint64_t);
	p->req.niov = 1;
}

static void push_payload(struct emb_async *op, const struct call *a,
			 struct part *p)
{
	struct emb_client *c = op->c;

	p->req.hdr.flags |= a->flags; /* EMB_F_ADMITTED */
	/* The sequence number is fixed now, so a retry repeats it. */
	p->req.seq = __atomic_add_fetch(&c->srv[p->req.server].push_seq, 1,
					__ATOMIC_RELAXED);
	emb_le64_store(p->req.prefix, a->step);
	emb_le32_store(p->req.prefix + 8, a->rank);
	emb_le32_store(p->req.prefix + 12, 0);
	emb_le64_store(p->req.prefix + 16, c->session);
	emb_le64_store(p->req.prefix + 24, p->req.seq);
	if (a->half && p->req.n) {
		/* 2-byte values */
		p->req.hdr.flags |= a->half == EMB_ROWFMT_FP16 ? EMB_F_GRAD_FP16
							       : EMB_F_GRAD_BF16;
		emb__push_iovs(p, a->pids + p->req.first,
			       (uint16_t *)(void *)a->prows +
				   (size_t)p->req.first * a->stride,
			       (size_t)a->stride * 2, true,
			       a->pbirths ? a->pbirths + p->req.first : NULL);
		return;
	}
	emb__push_iovs(p, a->pids + p->req.first,
		       a->prows ? a->prows + (size_t)p->req.first * a->stride
				: NULL,
		       (size_t)a->stride * sizeof(float), false,
		       a->pbirths ? a->pbirths + p->req.first : NULL);
}

/*
 * A push's summed gradients (n rows of dim f32 in a->prows) as 2-byte
 * values of a->half, in place: value k is written at byte 2k after the
 * f32 at 4k was read. 0, or EMB_ENONFINITE for a value out of fp16's range
 * (its id named as the store would: the push is refused, nothing sent).
 */
static int push_narrow(struct emb_client *c, struct call *a, uint32_t n)
{
	uint16_t *out = (uint16_t *)(void *)a->prows;

	for (size_t k = 0; k < (size_t)n * a->stride; k++) {
		bool ok;

		out[k] = a->half == EMB_ROWFMT_FP16
			     ? emb_fp32_to_fp16(a->prows[k], &ok)
			     : emb_fp32_to_bf16(a->prows[k], &ok);
		if (!ok) {
			pthread_mutex_lock(&c->err_lock);
			c->last_status = EMB_ENONFINITE;
			snprintf(c->last_msg, sizeof(c->last_msg),
				 "table %s: a gradient (%g) is out of %s's "
				 "range; no row was changed",
				 a->t->name, (double)a->prows[k],
				 emb_rowfmt_name(a->half));
			pthread_mutex_unlock(&c->err_lock);
			return EMB_ENONFINITE;
		}
	}
	return 0;
}

/* Assign (ids and rows) and erase (ids). */
static void ids_payload(struct emb_async *op, const struct call *a,
			struct part *p)
{
	(void)op;
	p->req.hdr.flags = a->flags;
	p->req.iov[0] = (struct iovec){a->pids + p->req.first,
				       (size_t)p->req.n * sizeof(uint64_t)};
	p->req.niov = 1;
	if (a->rows) {
		p->req.iov[1] = (struct iovec){
		    a->prows + (size_t)p->req.first * a->stride,
		    (size_t)p->req.n * a->stride * sizeof(float)};
		p->req.niov = 2;
	}
	if (a->pbirths)
		emb__births_iovs(p, a->pbirths + p->req.first);
}

/* BIRTHS holds its table as a pull does. */
static void births_init(struct emb_async *op, const struct call *a)
{
	struct emb_client_table *t = a->t;

	op->n = a->n;
	op->births = a->births;
	op->tids = t->ids;
	op->tbl = t;
	__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
}

/* Room for each part's births (4 bytes an id), or an error. */
static int births_resp(struct emb_async *op, const struct call *a)
{
	size_t resp_bytes = 0;
	char *r;

	(void)a;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp_cap = emb_wire_births_resp_bytes(p->req.n) -
				  EMB_WIRE_HDR_SIZE;
		if (p->req.resp_cap < ERR_CAP)
			p->req.resp_cap = ERR_CAP;
		resp_bytes += (p->req.resp_cap + 63) & ~(size_t)63;
	}
	op->rbuf = emb__respbuf_get(op->c->bufs, resp_bytes ? resp_bytes : 64);
	if (!op->rbuf)
		return -ENOMEM;
	r = op->rbuf->mem;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp = r;
		r += (p->req.resp_cap + 63) & ~(size_t)63;
	}
	return 0;
}

static const struct kind births_kind = {
    .kind = OP_BIRTHS,
    .opcode = EMB_OP_BIRTHS,
    .dedup = true,
    .by_group = false, /* to primaries, as a pull */
    .init = births_init,
    .resp = births_resp,
    .payload = pull_payload,
};

static const struct kind pull_kind = {
    .kind = OP_PULL,
    .opcode = EMB_OP_PULL,
    .dedup = true,
    .by_group = false, /* to primaries; a death moves them (pull_end) */
    .init = pull_init,
    .resp = pull_resp,
    .payload = pull_payload,
};

static const struct kind push_kind = {
    .kind = OP_PUSH,
    .opcode = EMB_OP_PUSH,
    .dedup = true,
    .by_group = true,
    .resp = write_resp,
    .payload = push_payload,
};

static const struct kind assign_kind = {
    .kind = OP_ASSIGN,
    .opcode = EMB_OP_ASSIGN,
    .by_group = true,
    .resp = write_resp,
    .payload = ids_payload,
};

static const struct kind erase_kind = {
    .kind = OP_ERASE,
    .opcode = EMB_OP_ERASE,
    .by_group = true,
    .resp = write_resp,
    .payload = ids_payload,
};

/* How each kind of op completes a part: one hook per kind. */
static void (*const part_ends[])(struct part *p, int status,
				 const struct emb_frame_hdr *resp) = {
    [OP_PULL] = pull_end,
    [OP_PUSH] = write_end,
    [OP_ASSIGN] = write_end,
    [OP_ERASE] = erase_end,
    [OP_ADMIN] = admin_end,
    [OP_BIRTHS] = births_end,
};

/* Loop thread: p is over; its kind of op says what that means. */
static void part_end(struct part *p, int status,
		     const struct emb_frame_hdr *resp)
{
	part_ends[p->op->kind](p, status, resp);
}

/* Loop thread: posts p on its server's conn, or queues it for the next. */
static void part_send(struct emb_client *c, struct part *p)
{
	struct server *s = &c->srv[p->req.server];
	int rc;

	/* Dead, or a newcomer took its rank since p was routed: what p was
	 * meant for is gone (a copy on a dead holder, a pull to reroute). */
	if (srv_dead(s) ||
	    (p->req.gen &&
	     p->req.gen != __atomic_load_n(&s->gen, __ATOMIC_RELAXED))) {
		part_end(p, EMB_ENODEAD, NULL);
		return;
	}
	/* A pull its server refused for a stale route: by the map now. The
	 * same server again when the map has not come yet. */
	if (p->retry.reroute) {
		p->retry.reroute = false;
		if (emb__rep_reroute(p->op, p) == REROUTE_SPLIT) {
			part_close(p, 0);
			return;
		}
		s = &c->srv[p->req.server];
	}
	/* An op whose task runs only as the client is destroyed (its loop
	 * thread stopped first) finds every server down for good. */
	if (stopping(c) && s->state != SRV_UP) {
		part_end(p, EMB_ECLOSED, NULL);
		return;
	}
	/* A pull rerouted to a newcomer may have waited for its table ids. */
	if ((p->op->kind == OP_PULL || p->op->kind == OP_BIRTHS) &&
	    p->req.gen)
		p->req.hdr.table_id = __atomic_load_n(
		    &p->op->tids[p->req.server], __ATOMIC_RELAXED);
	if (p->rd.os && !p->rd.os_done && s->state == SRV_UP) {
		emb__os_start(c, p);
		return;
	}
	if (p->rep.epoch) {
		/* Routed by an older map: writers it added get their copy
		 * before this one goes out under the new epoch. */
		if (p->rep.epoch < c->map_epoch) {
			rc = emb__rep_fixup(c, p->op, p);
			if (rc) {
				part_end(p, rc, NULL);
				return;
			}
			/* A move may have dropped this server from the
			 * writers of some rows: they are not sent there. */
			switch (emb__rep_trim(c, p->op, p)) {
			case TRIM_KEEP:
				break;
			case TRIM_DONE:
				part_close(p, 0);
				return;
			case TRIM_VOID:
				/* Applied nowhere, and no error: the group's
				 * other copies decide (rep_check()). */
				p->req.status = EMB_ENODEAD;
				if (--p->op->pending == 0)
					op_finish(p->op);
				return;
			case TRIM_NOMEM:
				part_end(p, -ENOMEM, NULL);
				return;
			}
			p->rep.epoch = c->map_epoch;
		}
		p->req.hdr.table_id = __atomic_load_n(
		    &p->op->tids[p->req.server], __ATOMIC_RELAXED);
		emb_wire_hdr_set_epoch(&p->req.hdr, p->rep.epoch, 0);
	}
	emb__conn_post(c, p);
}

void emb__op_issue_begin(struct emb_async *op)
{
	/* Registered here, on the loop, once per buffer's life. */
	if (op->rbuf)
		emb__respbuf_reg(op->rbuf);
	/* Count all parts first: a part that fails at once must not see
	 * pending reach 0 while later parts are still unposted. */
	op->pending = op->nparts + 1;
}

void emb__op_issue_end(struct emb_async *op)
{
	if (--op->pending == 0)
		op_finish(op);
}

/* Loop thread: posts every part of op. */
static void op_issue(void *arg)
{
	struct emb_async *op = arg;
	uint32_t nparts = op->nparts;

	emb__op_issue_begin(op);
	for (uint32_t k = 0; k < nparts; k++)
		part_send(op->c, &op->parts[k]);
	emb__op_issue_end(op);
}

int emb__op_post(struct emb_async *op)
{
	if (op->nparts == 0) {
		op->done = true;
		return 0;
	}
	op->t0_ns = emb_clock_ns();
	op->deadline_ms = op->t0_ns / 1000000u + op->c->timeout_ms;
	op->task.fn = op_issue;
	op->task.arg = op;
	return emb_transport_post(op->c->tr, &op->task);
}

const struct emb__part_fns emb__op_part_fns = {
    .send = part_send,
    .end = part_end,
};

/*
 * Deduplicates a->ids in server (or group) order; rows given (a push's
 * gradients) are summed per distinct id into a->prows: the first
 * occurrence copies, later ones add, in batch order. 0 or negative.
 *
 * The sum walks the gradients in batch order, a sequential read the
 * hardware prefetches. Walking each id's chain of duplicates instead
 * (first[], next[]) read the rows in random order, and the adds waited on
 * those loads: nine tenths of the sum's samples sat on one add (perf
 * annotate, W1 Zipf push).
 */
static int arrange_dedup(struct emb_async *op, struct call *a,
			 const uint16_t *key, uint32_t nkeys)
{
	const uint32_t dim = a->stride;
	const size_t row_sz = (size_t)dim * sizeof(float);
	uint32_t *ppos, *inv;
	void *extra;
	int64_t nu;

	a->pids = NULL;
	a->prows = NULL;
	a->pbirths = NULL;
	if (!a->n)
		return 0;
	nu = emb__batch_prepare(
	    op, a->ids, a->n, key, nkeys,
	    a->rows ? (size_t)a->n * (row_sz + (a->push_births ? 4 : 0)) : 0,
	    &a->pids, &ppos, &inv, op->cnt, &extra);
	if (nu < 0)
		return (int)nu;
	if (!a->rows)
		return 0;
	a->prows = extra;
	/* Each distinct id's birth, by its first occurrence (a repeat names
	 * the same), in partitioned order beside its summed gradient. */
	if (a->push_births) {
		a->pbirths = (uint32_t *)(void *)(a->prows + (size_t)a->n * dim);
		for (uint32_t u = 0; u < (uint32_t)nu; u++)
			a->pbirths[ppos[u]] = a->push_births[op->first[u]];
	}
	for (uint32_t i = 0; i < a->n; i++) {
		const uint32_t u = inv[i];
		float *dst = a->prows + (size_t)ppos[u] * dim;
		const float *src = a->rows + (size_t)i * dim;

		if (op->first[u] == i)
			memcpy(dst, src, row_sz);
		else
			emb_floats_add(dst, src, dim);
	}
	/* Sums in f32, then narrowed once for the wire. */
	return a->half ? push_narrow(op->c, a, (uint32_t)nu) : 0;
}

/*
 * The one skeleton of the data calls: an op of kind k for the call a,
 * its batch arranged by server (or by replica group), cut into parts,
 * given response buffers and payloads, and posted (unless !post: the
 * caller sends the parts, many.c). 0 and the op in *opp, or negative
 * (nothing was sent).
 */
static int op_start(const struct kind *k, struct call *a,
		    struct emb_async **opp, bool post)
{
	struct emb_client *c = a->t->c;
	const bool rep = k->by_group && c->cmap;
	const uint32_t most = rep ? EMB_NSLOTS : c->nsrv;
	const uint16_t *key;
	struct emb_async *op;
	uint32_t nkeys;
	int rc;

	op = emb__op_new(c, k->kind);
	/* Counts per server, or per replica group (at most one a slot). */
	if (!op || emb__op_counts(op, most)) {
		rc = -ENOMEM;
		goto err;
	}
	if (k->init)
		k->init(op, a);
	key = emb__rep_keys(c, k->by_group, &nkeys);
	rc = k->dedup ? arrange_dedup(op, a, key, nkeys)
		      : emb__batch_order(op, a->ids, a->n, a->rows, a->stride,
					 a->push_births, key, nkeys, most,
					 &a->pids, &a->prows, &a->pbirths);
	if (!rc)
		rc = rep ? emb__batch_parts_rep(op, a->t, op->cnt, k->opcode,
						a->stride)
			 : emb__batch_parts(op, a->t, op->cnt, k->opcode,
					    a->stride);
	emb__rep_unlock_keys(c);
	if (!rc)
		rc = k->resp(op, a);
	if (rc)
		goto err;
	for (uint32_t j = 0; j < op->nparts; j++)
		k->payload(op, a, &op->parts[j]);
	rc = post ? emb__op_post(op) : 0;
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	emb__op_free(op);
	return rc;
}

static int pull_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, float *out, uint32_t flags, uint8_t *found,
		      struct emb_async **opp, bool post)
{
	const bool with_state = flags & EMB_CLIENT_WITH_STATE;
	struct call a = {.t = t, .ids = ids, .n = n, .out = out,
			 .found = found};

	if (!t || (n && (!ids || !out)) ||
	    (flags & ~(EMB_CLIENT_NOCREATE | EMB_CLIENT_WITH_STATE |
		       EMB_CLIENT_RAW)))
		return EMB_EBADARG;
	a.raw = flags & EMB_CLIENT_RAW;
	a.stride = with_state ? t->row_floats
		   : a.raw    ? t->wwords
			      : t->spec.dim;
	a.flags = (flags & EMB_CLIENT_NOCREATE ? EMB_F_NOCREATE : 0) |
		  (with_state ? EMB_F_WITH_STATE : 0);
	return op_start(&pull_kind, &a, opp, post);
}

/* True unless a server said in its HELLO that it does not take BIRTHS
 * (an older one). One not connected yet (a rank to spare in an elastic
 * job, one coming up) counts as taking it: a server too old for BIRTHS
 * refuses the ask, and the call fails, rather than every push of an
 * eviction table waiting on a rank that may never come. */
static bool births_everywhere(struct emb_client *c)
{
	for (uint32_t s = 0; s < c->nsrv; s++)
		if (__atomic_load_n(&c->srv[s].no_births, __ATOMIC_RELAXED))
			return false;
	return c->nsrv > 0;
}

/* The births of n ids' rows on their slots' primaries, in births (BIRTHS:
 * EMB_WIRE_BIRTH_NONE for no row), flags EMB_F_MAKE or 0. 0 or the call's
 * error. */
static int ask_births(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, uint32_t *births, uint16_t flags)
{
	struct call a = {.t = t, .ids = ids, .n = n, .births = births,
			 .flags = flags};
	struct emb_async *op;
	int rc = op_start(&births_kind, &a, &op, true);

	return rc ? rc : emb_async_wait(op);
}

/*
 * Replicated admission and eviction (docs/replication.md, "Admission with
 * replicas", "Eviction with replicas"): only a slot's primary sees the
 * pulls that admit ids and age rows, so before a push the primaries are
 * asked which ids are rows and their births (BIRTHS, 4 bytes an id; a
 * no-create pull, which sends the rows, to servers that do not take it;
 * neither is a sighting). EMB_F_MAKE has a primary without admission make
 * the absent rows first, as a lone server's push would. The push carries
 * just the rows, flagged EMB_F_ADMITTED, to every holder: each creates the
 * rows it lacks and applies the same gradients. The gradients of the other
 * ids are dropped here, as the primary's admission would drop them. A
 * table that numbers its rows (one with eviction: its births are 1 and
 * up, others' 0) gets each row's birth named, so that every holder applies
 * the gradient to the row it was computed for, or to none. 0, or the
 * query's error (nothing pushed).
 */
static int push_admitted(struct emb_client_table *t, struct call *a,
			 struct emb_async **opp, bool post)
{
	const uint32_t dim = t->spec.dim;
	uint64_t *ids;
	uint8_t *found;
	uint32_t *births;
	float *rows, *grads;
	bool numbered = false;
	uint32_t k = 0;
	int rc;

	rows = malloc((size_t)a->n * dim * sizeof(float) + (size_t)a->n * 13);
	if (!rows)
		return -ENOMEM;
	ids = (uint64_t *)(void *)(rows + (size_t)a->n * dim);
	births = (uint32_t *)(void *)(ids + a->n);
	found = (uint8_t *)(births + a->n);
	if (births_everywhere(t->c)) {
		rc = ask_births(t, a->ids, a->n, births, EMB_F_MAKE);
		/* Rows a table had before it was given eviction are birth
		 * 0: its policy, as this handle knows it, tells too. */
		numbered = __atomic_load_n(&t->evicts, __ATOMIC_RELAXED) != 0;
		for (uint32_t i = 0; !rc && i < a->n; i++) {
			found[i] = births[i] != EMB_WIRE_BIRTH_NONE;
			numbered |= found[i] && births[i] != 0;
		}
	} else {
		rc = emb_client_table_pull(t, a->ids, a->n, rows,
					   EMB_CLIENT_NOCREATE, found);
	}
	if (rc)
		goto out;
	/* The rows the query filled are not needed: the kept gradients go
	 * in their place, in the caller's order. */
	grads = rows;
	for (uint32_t i = 0; i < a->n; i++) {
		if (!found[i])
			continue;
		ids[k] = a->ids[i];
		births[k] = births[i];
		memmove(grads + (size_t)k * dim, a->rows + (size_t)i * dim,
			(size_t)dim * sizeof(float));
		k++;
	}
	a->ids = ids;
	a->n = k;
	a->rows = grads;
	/* A server without BIRTHS numbers no rows: the pull asked. */
	a->push_births = numbered ? births : NULL;
	a->flags = EMB_F_ADMITTED;
	/* The op copies ids and gradients as it starts. */
	rc = op_start(&push_kind, a, opp, post);
out:
	free(rows);
	return rc;
}

static int push_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, const float *grads, uint64_t step,
		      uint32_t rank, struct emb_async **opp, bool post)
{
	struct call a = {.t = t, .ids = ids, .n = n, .rows = grads,
			 .step = step, .rank = rank};

	if (!t || (n && (!ids || !grads)))
		return EMB_EBADARG;
	a.stride = t->spec.dim;
	a.half = t->push_fmt;
	if (n && t->c->cmap && __atomic_load_n(&t->admits, __ATOMIC_RELAXED))
		return push_admitted(t, &a, opp, post);
	return op_start(&push_kind, &a, opp, post);
}

int emb_client_table_pull_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, float *out, uint32_t flags,
				uint8_t *found, struct emb_async **op)
{
	return emb__client_err(
	    t ? t->c : NULL,
	    op ? pull_start(t, ids, n, out, flags, found, op, true)
	       : EMB_EBADARG);
}

int emb_client_table_push_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, const float *grads, uint64_t step,
				uint32_t rank, struct emb_async **op)
{
	return emb__client_err(
	    t ? t->c : NULL,
	    op ? push_start(t, ids, n, grads, step, rank, op, true)
	       : EMB_EBADARG);
}

int emb__pull_prepare(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, float *out, uint32_t flags, uint8_t *found,
		      struct emb_async **op)
{
	int rc = pull_start(t, ids, n, out, flags, found, op, false);

	/* A pull of nothing has no part to wait for: over already. */
	if (!rc && !(*op)->nparts)
		(*op)->done = true;
	return rc;
}

int emb__push_prepare(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, const float *grads, uint64_t step,
		      uint32_t rank, struct emb_async **op)
{
	int rc = push_start(t, ids, n, grads, step, rank, op, false);

	if (!rc && !(*op)->nparts)
		(*op)->done = true;
	return rc;
}

int emb_client_table_pull(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, float *out, uint32_t flags,
			  uint8_t *found)
{
	struct emb_async *op;
	int rc = pull_start(t, ids, n, out, flags, found, &op, true);

	return rc ? emb__client_err(t ? t->c : NULL, rc) : emb_async_wait(op);
}

int emb_client_table_push(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads, uint64_t step,
			  uint32_t rank)
{
	struct emb_async *op;
	int rc = push_start(t, ids, n, grads, step, rank, &op, true);

	if (rc)
		return emb__client_err(t ? t->c : NULL, rc);
	rc = emb_async_wait(op);
	/* Every holder refused the push before applying any of it: the table
	 * has admission that this handle did not know of (opened, or set by
	 * another client). Ask the primaries, and push again. */
	if (rc == EMB_EADMITASK &&
	    !__atomic_exchange_n(&t->admits, 1, __ATOMIC_RELAXED)) {
		rc = push_start(t, ids, n, grads, step, rank, &op, true);
		rc = rc ? emb__client_err(t->c, rc) : emb_async_wait(op);
	}
	return rc;
}

static int assign_once(struct emb_client_table *t, const uint64_t *ids,
		       uint32_t n, const float *rows, bool with_state)
{
	struct call a = {.t = t, .ids = ids, .n = n, .rows = rows};
	struct emb_async *op;
	int rc;

	a.stride = with_state ? t->row_floats : t->spec.dim;
	a.flags = with_state ? EMB_F_WITH_STATE : 0;
	/* A replicated table with eviction: each row is made on its
	 * primary first, whatever its admission (an assign writes rows
	 * whole), and every holder gets the birth it gave, as a push's
	 * (docs/replication.md, "Eviction with replicas"). */
	if (n && t->c->cmap && __atomic_load_n(&t->evicts, __ATOMIC_RELAXED)) {
		uint32_t *births = malloc((size_t)n * sizeof(*births));

		if (!births)
			return -ENOMEM;
		rc = ask_births(t, ids, n, births,
				EMB_F_MAKE | EMB_F_ADMITTED);
		a.push_births = births;
		if (!rc)
			rc = op_start(&assign_kind, &a, &op, true);
		free(births);
		return rc ? rc : emb_async_wait(op);
	}
	rc = op_start(&assign_kind, &a, &op, true);
	return rc ? rc : emb_async_wait(op);
}

static int table_assign(struct emb_client_table *t, const uint64_t *ids,
			uint32_t n, const float *rows, bool with_state)
{
	int rc;

	if (!t || (n && (!ids || !rows)))
		return EMB_EBADARG;
	rc = assign_once(t, ids, n, rows, with_state);
	/* Every holder refused it before writing any of it: the table has
	 * eviction that this handle did not know of. Name births, again. */
	if (rc == EMB_EADMITASK && t->c->cmap &&
	    !__atomic_exchange_n(&t->evicts, 1, __ATOMIC_RELAXED))
		rc = assign_once(t, ids, n, rows, with_state);
	return rc;
}

static int table_erase(struct emb_client_table *t, const uint64_t *ids,
		       uint32_t n, uint64_t *erased)
{
	struct call a = {.t = t, .ids = ids, .n = n};
	struct emb_async *op;
	uint64_t count;
	int rc;

	if (!t || (n && !ids))
		return EMB_EBADARG;
	rc = op_start(&erase_kind, &a, &op, true);
	if (rc)
		return rc;
	/* Read the count before emb_async_wait() frees the op. */
	emb__op_wait_done(op);
	count = op->count;
	rc = emb_async_wait(op);
	if (erased)
		*erased = count;
	return rc;
}

int emb_client_table_assign(struct emb_client_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state)
{
	return emb__client_err(t ? t->c : NULL,
			       table_assign(t, ids, n, rows, with_state));
}

int emb_client_table_erase(struct emb_client_table *t, const uint64_t *ids,
			   uint32_t n, uint64_t *erased)
{
	return emb__client_err(t ? t->c : NULL, table_erase(t, ids, n, erased));
}
