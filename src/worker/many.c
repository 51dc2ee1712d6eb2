/*
 * src/worker/many.c - one call for the pulls (or pushes) of several tables:
 * what a model with many sparse features does every step.
 *
 * Each table's part is an op of its own (op.c), so deduplication, routing
 * by server or replica group, reroute on a dead server, EMOVING retries,
 * the deadline, one-sided pulls and a push's exactly-once session sequence
 * all hold per table exactly as for the single calls. Every op is started
 * before any is waited for.
 *
 * The ops' parts are then sent together, from one task on the loop, and
 * the parts for one server that takes PULL_MANY (PUSH_MANY; its HELLO
 * says so) go as one PULL_MANY (PUSH_MANY) frame (proto/wire_many.h) over
 * TCP, whose answer is split back into each part's own PULL (PUSH) answer:
 * each part completes as if its own reply had come, so EMOVING's resend,
 * a replicated push's copies and the session's exactly-once sequence
 * (fixed per part, repeated by a resend) are those of the single calls.
 * Anything a bundle cannot carry goes as the single calls send it: a
 * one-sided or WITH_STATE pull, a push to a table this client made
 * synchronous (it is held for its step, which one reply cannot wait for),
 * a part to a server that is down or does not take the bundle, a part the
 * server refused with EMB_ENOBUNDLE (a table made synchronous by another
 * client), and every part again after its bundle's conn was lost (each
 * part is then retried on its own, under its op's deadline).
 *
 * Threads: the caller's; the ops and the bundles run on the client's loop.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/wire_many.h"
#include "worker/abi.h"
#include "worker/client_int.h"

/* Ops held on the stack; a longer list allocates its handle array. */
#define MANY_STACK 64

/*
 * Element i of the caller's array: its stride is b[0].struct_size (a
 * program built against another embstore.h has another sizeof), and every
 * element must say the same. Copied into *e by the struct_size rule.
 */
static int entry_get(const struct emb_table_batch *b, size_t i,
		     struct emb_table_batch *e)
{
	const char *p = (const char *)b + i * b->struct_size;
	const struct emb_table_batch *src = (const void *)p;
	int rc;

	if (src->struct_size != b->struct_size) {
		emb__err_set(EMB_EBADARG,
			     "batch %zu: struct_size %u differs from "
			     "batch 0's %u",
			     i, src->struct_size, b->struct_size);
		return EMB_EBADARG;
	}
	rc = emb__opts_copy(e, sizeof(*e), src, "emb_table_batch");
	return rc;
}

static int end(struct emb_async **ops, struct emb_async **stack_ops, int rc)
{
	if (ops != stack_ops)
		free(ops);
	return rc;
}

/* The parts of one PULL_MANY or PUSH_MANY frame, to one server. */
struct bundle {
	uint32_t server;     /* index into c->srv */
	uint8_t op;	     /* EMB_OP_PULL_MANY or EMB_OP_PUSH_MANY */
	struct emb_client *c;
	uint32_t n;	     /* parts */
	uint64_t req_bytes;  /* payload: sub-requests */
	uint64_t resp_bytes; /* payload: sub-answers */
	uint8_t *req;	     /* the request payload */
	uint8_t *resp;	     /* the reply lands here */
	struct part *parts[EMB_WIRE_MANY_MAX];
	struct emb_wire_frame subs[EMB_WIRE_MANY_MAX]; /* reply, split */
};

/* The parts of one many call, issued by one task on the loop. */
struct issue {
	struct emb_task task;
	struct emb_client *c;
	size_t n;
	struct emb_async *ops[]; /* n ops with parts */
};

/* p's request payload bytes. */
static uint64_t req_len(const struct part *p)
{
	uint64_t len = 0;

	for (int i = 0; i < p->req.niov; i++)
		len += p->req.iov[i].iov_len;
	return len;
}

/* What p's sub-answer may take in a reply: its rows, or an error. */
static uint64_t resp_room(const struct part *p)
{
	uint64_t rows = p->op->kind == OP_PUSH
			    ? 0
			    : emb_wire_many_sub_size((uint32_t)p->req.resp_cap);

	return rows > EMB_WIRE_MANY_ERR_SIZE ? rows : EMB_WIRE_MANY_ERR_SIZE;
}

/* Whether p may go in a PULL_MANY or PUSH_MANY to its server (loop). */
static bool bundle_ok(struct emb_client *c, const struct part *p)
{
	const struct server *s = &c->srv[p->req.server];
	const bool push = p->op->kind == OP_PUSH;

	/* A copy routed by an older map than the client's sends the newer
	 * writers their copies first (part_send() in op.c): alone. */
	if (push ? p->req.once || (p->req.hdr.flags & EMB_F_STEP_END) ||
		       (p->rep.epoch && p->rep.epoch < c->map_epoch)
		 : p->op->kind != OP_PULL || p->rd.os || p->rd.learn ||
		       p->rd.fb || (p->req.hdr.flags & EMB_F_WITH_STATE) ||
		       p->req.resp_cap > UINT32_MAX)
		return false;
	if (!(push ? s->push_many : s->pull_many) || s->state != SRV_UP ||
	    !s->conn || srv_dead(s) || stopping(c) ||
	    (p->req.gen &&
	     p->req.gen != __atomic_load_n(&s->gen, __ATOMIC_RELAXED)))
		return false;
	/* The RDMA transport's replies land in registered buffers. */
	return strcmp(emb_conn_transport(s->conn), "tcp") == 0;
}

static void bundle_free(struct bundle *b)
{
	free(b->req);
	free(b->resp);
	free(b);
}

/*
 * Loop thread: the bundle's reply (or its failure) ends each part as its
 * own PULL or PUSH answer would: the part's sub-answer is copied to its
 * response buffer and the part completes through conn.c, which retries it
 * on its own after a lost conn. A push refused with EMB_ENOBUNDLE goes
 * again, alone and once (its table is synchronous).
 */
static void bundle_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct bundle *b = ctx;
	struct emb_client *c = b->c;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.payload = b->resp, .lim = &lim};
	int n = 0;

	if (!status && !resp)
		status = EMB_EBADFRAME;
	if (!status) {
		lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
		f.hdr = *resp;
		n = resp->status < 0 ? 0
				     : emb_wire_many_decode(&f, b->subs, b->n);
		if (resp->status >= 0 && n != (int)b->n)
			status = EMB_EBADFRAME;
	}
	for (uint32_t i = 0; i < b->n; i++) {
		struct part *p = b->parts[i];
		const struct emb_wire_frame *sf =
		    status || resp->status < 0 ? &f : &b->subs[i];
		struct emb_frame_hdr h;
		uint32_t len;

		if (status) {
			emb__conn_part_done(p, status, NULL);
			continue;
		}
		/* The whole frame refused, or this part's answer: as its
		 * own. */
		h = sf->hdr;
		h.opcode = p->req.hdr.opcode | EMB_OP_RESPONSE_BIT;
		if (sf != &f && h.status == EMB_ENOBUNDLE &&
		    p->op->kind == OP_PUSH) {
			emb__conn_fly_del(&c->srv[p->req.server], p);
			p->req.once = true;
			c->fns->send(c, p);
			continue;
		}
		len = h.payload_len;
		if (len > p->req.resp_cap) {
			if (h.status >= 0) {
				emb__conn_part_done(p, EMB_EBADFRAME, NULL);
				continue;
			}
			/* An error message longer than the rows' room: no
			 * text, the code alone. */
			len = 0;
		}
		if (len)
			memcpy(p->req.resp, sf->payload, len);
		h.payload_len = len;
		emb__conn_part_done(p, 0, &h);
	}
	bundle_free(b);
}

/* Loop thread: sends b, or its part alone when it holds one. */
static void bundle_send(struct emb_client *c, struct bundle *b)
{
	struct server *s = &c->srv[b->server];
	struct emb_frame_hdr hdr = {0};
	struct iovec iov;
	uint64_t off = 0;
	int rc;

	if (b->n == 1) {
		c->fns->send(c, b->parts[0]);
		bundle_free(b);
		return;
	}
	b->req = malloc(b->req_bytes);
	b->resp = malloc(b->resp_bytes);
	if (!b->req || !b->resp) {
		/* Each part goes alone, as it would without bundles. */
		for (uint32_t i = 0; i < b->n; i++)
			c->fns->send(c, b->parts[i]);
		bundle_free(b);
		return;
	}
	for (uint32_t i = 0; i < b->n; i++) {
		struct part *p = b->parts[i];
		struct emb_frame_hdr h = p->req.hdr;

		h.magic = EMB_WIRE_MAGIC;
		h.version = EMB_WIRE_VERSION;
		h.req_id = i;
		h.status = 0;
		h.payload_len = (uint32_t)req_len(p);
		/* A pull rerouted to a newcomer may have waited for its
		 * table ids (as part_send() does). */
		if ((p->op->kind == OP_PULL && p->req.gen) || p->rep.epoch)
			h.table_id = __atomic_load_n(
			    &p->op->tids[p->req.server], __ATOMIC_RELAXED);
		/* A replicated copy carries its map's epoch, as part_send()
		 * stamps it on a PUSH alone. */
		if (p->rep.epoch)
			emb_wire_hdr_set_epoch(&h, p->rep.epoch, 0);
		off += (uint64_t)emb_wire_many_sub_put(b->req + off, &h,
						       p->req.iov, p->req.niov);
		/* Its deadline watched as any posted part's (conn.c). */
		emb__conn_fly_add(s, p);
	}
	hdr.opcode = b->op;
	hdr.count = b->n;
	iov.iov_base = b->req;
	iov.iov_len = off;
	add(&c->requests, 1);
	rc = emb_conn_call(s->conn, &hdr, &iov, 1, b->resp, b->resp_bytes,
			   bundle_done, b);
	if (rc) {
		/* Refused before it was sent: no part was asked. */
		for (uint32_t i = 0; i < b->n; i++)
			b->parts[i]->rep.asked = false;
		bundle_done(b, rc, NULL);
	}
}

/* Loop thread: every part of the call's ops, bundled per server. */
static void issue_run(void *arg)
{
	struct issue *is = arg;
	struct emb_client *c = is->c;
	struct bundle **open = calloc(c->nsrv, sizeof(*open));
	const size_t nops = is->n;

	for (size_t i = 0; i < nops; i++)
		emb__op_issue_begin(is->ops[i]);
	for (size_t i = 0; i < nops; i++) {
		struct emb_async *op = is->ops[i];

		for (uint32_t k = 0; k < op->nparts; k++) {
			struct part *p = &op->parts[k];
			uint32_t sv = p->req.server;
			uint64_t max = c->srv[sv].lim.max_frame_bytes;
			uint64_t rq, rs;
			struct bundle *b = open ? open[sv] : NULL;

			/* Its session flag and prefix, as emb__conn_post()
			 * decides them for a PUSH alone: sized with them. */
			emb__conn_session_prep(&c->srv[sv], p);
			rq = emb_wire_many_sub_size((uint32_t)req_len(p));
			rs = resp_room(p);

			if (!open || !bundle_ok(c, p) ||
			    EMB_WIRE_HDR_SIZE + rq > max ||
			    EMB_WIRE_HDR_SIZE + rs > max) {
				c->fns->send(c, p);
				continue;
			}
			if (b &&
			    (b->n == EMB_WIRE_MANY_MAX ||
			     EMB_WIRE_HDR_SIZE + b->req_bytes + rq > max ||
			     EMB_WIRE_HDR_SIZE + b->resp_bytes + rs > max)) {
				bundle_send(c, b);
				b = open[sv] = NULL;
			}
			if (!b) {
				b = calloc(1, sizeof(*b));
				if (!b) {
					c->fns->send(c, p);
					continue;
				}
				b->server = sv;
				b->op = op->kind == OP_PUSH ? EMB_OP_PUSH_MANY
							    : EMB_OP_PULL_MANY;
				b->c = c;
				open[sv] = b;
			}
			b->parts[b->n++] = p;
			b->req_bytes += rq;
			b->resp_bytes += rs;
		}
	}
	for (uint32_t sv = 0; open && sv < c->nsrv; sv++)
		if (open[sv])
			bundle_send(c, open[sv]);
	free(open);
	for (size_t i = 0; i < nops; i++)
		emb__op_issue_end(is->ops[i]);
	free(is);
}

/*
 * Sends the prepared ops[0..n): those with parts from one task on the
 * loop; if that cannot be posted, each as a single call's is. Every op ends
 * (done) whatever happens here.
 */
static void issue_post(struct emb_client *c, struct emb_async **ops, size_t n)
{
	struct issue *is = malloc(sizeof(*is) + n * sizeof(is->ops[0]));
	uint64_t t0 = emb_clock_ns(), deadline = t0 / 1000000u + c->timeout_ms;
	size_t k = 0;
	int rc = -ENOMEM;

	if (is) {
		for (size_t i = 0; i < n; i++) {
			ops[i]->t0_ns = t0;
			ops[i]->deadline_ms = deadline;
			if (ops[i]->nparts)
				is->ops[k++] = ops[i];
		}
		if (!k) {
			free(is);
			return;
		}
		is->c = c;
		is->n = k;
		is->task.fn = issue_run;
		is->task.arg = is;
		rc = emb_transport_post(c->tr, &is->task);
		if (!rc)
			return;
		free(is);
	}
	for (size_t i = 0; i < n; i++) {
		if (ops[i]->done || !emb__op_post(ops[i]))
			continue;
		ops[i]->status = rc;
		ops[i]->done = true;
	}
}

/*
 * Starts every entry's op, then waits for all of them: also after a start
 * failed (the ops started own borrowed buffers until waited for). Returns
 * 0 or the first error in entry order; its message is the thread's last
 * error, as the failing single call would have left it.
 */
static int many_run(struct emb_client *c, const struct emb_table_batch *b,
		    size_t nb, bool push, uint32_t flags, uint64_t step,
		    uint32_t rank)
{
	struct emb_async *stack_ops[MANY_STACK], **ops = stack_ops;
	/* Whole rows go single: PULL_MANY carries weights only. */
	const bool bundled = push || !(flags & EMB_CLIENT_WITH_STATE);
	size_t started = 0, bad = nb;
	char msg[512];
	int rc = 0;

	if (!c || (nb && !b)) {
		emb__err_set(EMB_EBADARG, "%s",
			     !c ? "client is NULL" : "batch array is NULL");
		return EMB_EBADARG;
	}
	if (nb > EMB_CLIENT_MANY_MAX) {
		emb__err_set(EMB_EBADARG, "%zu tables in one call, at most %u",
			     nb, EMB_CLIENT_MANY_MAX);
		return EMB_EBADARG;
	}
	if (!push && (flags & ~(EMB_CLIENT_NOCREATE | EMB_CLIENT_WITH_STATE))) {
		emb__err_set(EMB_EBADARG, "unknown pull flags 0x%x", flags);
		return EMB_EBADARG;
	}
	if (nb > MANY_STACK) {
		ops = calloc(nb, sizeof(*ops));
		if (!ops) {
			emb__err_set(-ENOMEM,
				     "%zu tables: no memory for their "
				     "ops",
				     nb);
			return -ENOMEM;
		}
	}
	for (; started < nb; started++) {
		struct emb_table_batch e;

		rc = entry_get(b, started, &e);
		if (rc)
			break;
		if (!e.table || e.table->c != c) {
			rc = EMB_EBADARG;
			emb__err_set(rc, "batch %zu: %s", started,
				     e.table ? "the table belongs to another "
					       "client"
					     : "table is NULL");
			break;
		}
		if (push)
			rc = emb__client_err(
			    c, emb__push_prepare(e.table, e.ids, e.n, e.rows,
						 step, rank, &ops[started]));
		else if (bundled)
			rc = emb__client_err(
			    c,
			    emb__pull_prepare(e.table, e.ids, e.n, e.rows,
					      flags, e.found, &ops[started]));
		else
			rc = emb_client_table_pull_async(e.table, e.ids, e.n,
							 e.rows, flags, e.found,
							 &ops[started]);
		if (rc)
			break;
	}
	/* The prepared ops go even after a failed start: their buffers
	 * are the caller's until they are done. */
	if (bundled)
		issue_post(c, ops, started);
	if (rc)
		/* The start error is the call's: keep its message while the
		 * started ops, which borrow the caller's buffers, finish. */
		emb_last_error(msg, sizeof(msg));
	for (size_t i = 0; i < started; i++) {
		emb__op_wait_done(ops[i]);
		if (!rc && bad == nb && ops[i]->status < 0)
			bad = i;
	}
	/* The first failing op is given back last, so that its message (the
	 * server's text, or which server timed out) is the one kept. */
	for (size_t i = 0; i < started; i++)
		if (i != bad)
			emb_async_wait(ops[i]);
	if (bad < nb) {
		struct emb_table_batch e;

		rc = emb_async_wait(ops[bad]);
		emb_last_error(msg, sizeof(msg));
		/* Which of the step's tables failed, unless the message says
		 * so already (a server's EMB_ENOTABLE knows only an id). */
		if (!entry_get(b, bad, &e) && !strstr(msg, e.table->name)) {
			emb__err_set(rc, "table %s: %s", e.table->name, msg);
			return end(ops, stack_ops, rc);
		}
	}
	if (rc)
		emb__err_set(rc, "%s", msg);
	return end(ops, stack_ops, rc);
}

int emb_client_pull_many(struct emb_client *c, const struct emb_table_batch *b,
			 size_t nb, uint32_t flags)
{
	return emb__err(many_run(c, b, nb, false, flags, 0, 0));
}

int emb_client_push_many(struct emb_client *c, const struct emb_table_batch *b,
			 size_t nb, uint64_t step, uint32_t rank)
{
	return emb__err(many_run(c, b, nb, true, 0, step, rank));
}
