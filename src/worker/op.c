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
 * Threads: the public calls from any thread; the rest on the loop thread.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
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
	emb_log(EMB_LOG_DEBUG, "server %s:%u: %s: %.*s", c->srv[p->req.server].host,
		c->srv[p->req.server].port, emb_strerror(e.status), (int)e.msg_len,
		e.msg);
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
	rc = emb_wire_pull_resp_decode(&f, op->dim - op->state, op->state, &r);
	if (rc)
		return rc;
	/* A server that ignored the state flag sends rows of dim floats. */
	if (r.n != p->req.n || r.stride != op->dim)
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < r.n; j++) {
		const float *row = r.rows + (size_t)j * op->dim;
		uint32_t u = op->pu[p->req.first + (p->rd.fb ? p->rd.miss[j] : j)];
		uint8_t hit = r.found ? emb_wire_bit_test(r.found, j) : 1;

		for (uint32_t i = op->first[u]; i != NONE; i = op->next[i]) {
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
	if (op->c->cmap)
		rep_check(op);
	emb__op_complete(op);
}

static void part_send(struct emb_client *c, struct part *p);

static void part_end(struct part *p, int status,
		     const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (status == EMB_ENODEAD && emb__rep_reroute(op, p)) {
		add(&op->c->retries, 1);
		part_send(op->c, p);
		return;
	}
	/* A copy refused because its slots are being filled, or routed by
	 * an older map than the server's: not applied, so it goes again,
	 * same server and sequence number, until the deadline. */
	if (status == 0 && p->rep.epoch &&
	    (resp->status == EMB_EMOVING || resp->status == EMB_ESTALEMAP) &&
	    !stopping(op->c) && emb_clock_ms() < op->deadline_ms) {
		if (resp->status == EMB_ESTALEMAP && op->c->node)
			emb_node_map_refresh(op->c->node);
		add(&op->c->moved, 1);
		emb__rep_delay(op->c, p);
		return;
	}
	/* A fan-out to a server that died, before or during the call: when
	 * the live servers hold every slot it is no longer asked. */
	if (status == EMB_ENODEAD && op->kind == OP_ADMIN && op->c->cmap) {
		uint32_t lost = emb__rep_lost_slots(op->c);

		if (!lost) {
			p->rep.skip = true;
			if (--op->pending == 0)
				op_finish(op);
			return;
		}
		emb__rep_note_lost(op->c, p, lost);
	}
	/* A one-sided part that READ every row has no response. */
	if (status == 0 && resp) {
		p->req.rhdr = *resp;
		if (resp->status < 0) {
			note_server_error(op->c, p);
			status = resp->status;
		} else if (op->kind == OP_PULL) {
			status = pull_scatter(op, p);
		} else if (op->kind == OP_ERASE &&
			   (!p->rep.nrep || p == &op->parts[p->rep.lead])) {
			/* One copy's count: the first holder's. */
			op->count += resp->count;
		}
	}
	p->req.status = status;
	if (status == 0 && (p->rd.learn || p->rd.fb))
		emb__os_learn(op, p);
	if (status) {
		add(&op->c->errors, 1);
		/* A copy on a dead holder: rep_check() decides. */
		if (!op->status && !(p->rep.nrep && status == EMB_ENODEAD))
			op->status = status;
	}
	if (--op->pending == 0)
		op_finish(op);
}

/* Loop thread: posts p on its server's conn, or queues it for the next. */
static void part_send(struct emb_client *c, struct part *p)
{
	struct server *s = &c->srv[p->req.server];
	int rc;

	if (srv_dead(s)) {
		part_end(p, EMB_ENODEAD, NULL);
		return;
	}
	/* An op whose task runs only as the client is destroyed (its loop
	 * thread stopped first) finds every server down for good. */
	if (stopping(c) && s->state != SRV_UP) {
		part_end(p, EMB_ECLOSED, NULL);
		return;
	}
	if (p->rd.os && !p->rd.os_done && s->state == SRV_UP) {
		emb__os_start(c, p);
		return;
	}
	if (p->rep.epoch) {
		/* Routed by an older map: writers it added get their copy
		 * before this one goes out under the new epoch. */
		if (p->rep.epoch < c->map_epoch) {
			rc = emb__rep_fixup(c, p->op, &p->op->parts[p->rep.lead]);
			if (rc) {
				part_end(p, rc, NULL);
				return;
			}
			p->rep.epoch = c->map_epoch;
		}
		p->req.hdr.table_id =
		    __atomic_load_n(&p->op->tids[p->req.server], __ATOMIC_RELAXED);
		emb_wire_hdr_set_epoch(&p->req.hdr, p->rep.epoch, 0);
	}
	emb__conn_post(c, p);
}

/* Loop thread: posts every part of op. */
static void op_issue(void *arg)
{
	struct emb_async *op = arg;
	uint32_t nparts = op->nparts;

	/* Registered here, on the loop, once per buffer's life. */
	if (op->rbuf)
		emb__respbuf_reg(op->rbuf);
	/* Count all parts first: a part that fails at once must not see
	 * pending reach 0 while later parts are still unposted. */
	op->pending = nparts + 1;
	for (uint32_t k = 0; k < nparts; k++)
		part_send(op->c, &op->parts[k]);
	if (--op->pending == 0)
		op_finish(op);
}

int emb__op_post(struct emb_async *op)
{
	if (op->nparts == 0) {
		op->done = true;
		return 0;
	}
	op->deadline_ms = emb_clock_ms() + op->c->timeout_ms;
	op->task.fn = op_issue;
	op->task.arg = op;
	return emb_transport_post(op->c->tr, &op->task);
}

const struct emb__part_fns emb__op_part_fns = {
    .send = part_send,
    .end = part_end,
};

static int pull_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, float *out, uint32_t flags, uint8_t *found,
		      struct emb_async **opp)
{
	struct emb_client *c = t->c;
	const bool nocreate = flags & EMB_CLIENT_NOCREATE;
	const bool with_state = flags & EMB_CLIENT_WITH_STATE;
	const uint16_t wflags = (nocreate ? EMB_F_NOCREATE : 0) |
				(with_state ? EMB_F_WITH_STATE : 0);
	uint32_t *cnt, *ppos;
	uint64_t *pids;
	size_t resp_bytes = 0;
	struct emb_async *op;
	void *unused;
	int64_t nu;
	char *r;
	int rc;

	if (!t || (n && (!ids || !out)) ||
	    (flags & ~(EMB_CLIENT_NOCREATE | EMB_CLIENT_WITH_STATE)))
		return EMB_EBADARG;
	op = emb__op_new(c, OP_PULL);
	if (!op || emb__op_counts(op, c->nsrv)) {
		rc = -ENOMEM;
		goto err;
	}
	cnt = op->cnt;
	op->dim = with_state ? t->row_floats : t->spec.dim;
	op->state = with_state ? t->row_floats - t->spec.dim : 0;
	op->n = n;
	op->out = out;
	op->found = found;
	op->tids = t->ids;
	op->tbl = t;
	__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
	/* Pulls go to primaries; a replicated map moves them on a death. */
	if (c->cmap)
		pthread_mutex_lock(&c->map_mu);
	nu = n ? emb__batch_prepare(op, ids, n, c->slot_map, c->nsrv, 0, &pids, &ppos,
			 cnt, &unused)
	       : 0;
	if (c->cmap)
		pthread_mutex_unlock(&c->map_mu);
	if (nu < 0) {
		rc = (int)nu;
		goto err;
	}
	rc = emb__batch_parts(op, t, cnt, EMB_OP_PULL, op->dim);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp_cap = emb_wire_pull_resp_bytes(p->req.n, op->dim, wflags) -
			      EMB_WIRE_HDR_SIZE;
		if (p->req.resp_cap < ERR_CAP)
			p->req.resp_cap = ERR_CAP;
		resp_bytes += (p->req.resp_cap + 63) & ~(size_t)63;
	}
	rc = emb__os_plan(op, t, &resp_bytes);
	if (rc)
		goto err;
	/* From the pool: over RDMA the rows land here, not in bounce
	 * pages that would be copied (docs/rdma.md). */
	op->rbuf = emb__respbuf_get(c->bufs, resp_bytes ? resp_bytes : 64);
	if (!op->rbuf) {
		rc = -ENOMEM;
		goto err;
	}
	r = op->rbuf->mem;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp = r;
		r += (p->req.resp_cap + 63) & ~(size_t)63;
		if (p->rd.os) {
			p->rd.land = r;
			r += ((size_t)p->req.n * p->rd.rb + 63) & ~(size_t)63;
		}
		p->req.hdr.flags = wflags;
		p->req.iov[0].iov_base = pids + p->req.first;
		p->req.iov[0].iov_len = (size_t)p->req.n * sizeof(uint64_t);
		p->req.niov = 1;
	}
	rc = emb__op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	emb__op_free(op);
	return rc;
}

static int push_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, const float *grads, uint64_t step,
		      uint32_t rank, struct emb_async **opp)
{
	struct emb_client *c = t->c;
	const uint32_t dim = t->spec.dim;
	uint32_t *cnt, *ppos, nkeys;
	const uint16_t *key;
	uint64_t *pids = NULL;
	struct emb_async *op;
	float *pgrad = NULL;
	void *extra;
	int64_t nu;
	int rc;

	if (!t || (n && (!ids || !grads)))
		return EMB_EBADARG;
	op = emb__op_new(c, OP_PUSH);
	/* Counts per server, or per replica group (at most one a slot). */
	if (!op || emb__op_counts(op, c->cmap ? EMB_NSLOTS : c->nsrv)) {
		rc = -ENOMEM;
		goto err;
	}
	cnt = op->cnt;
	op->dim = dim;
	key = emb__rep_write_keys(c, &nkeys);
	nu = n ? emb__batch_prepare(op, ids, n, key, nkeys,
			 (size_t)n * dim * sizeof(float), &pids, &ppos, cnt,
			 &extra)
	       : 0;
	if (nu < 0) {
		emb__rep_unlock_keys(c);
		rc = (int)nu;
		goto err;
	}
	/* Sum duplicates straight into server order: first occurrence
	 * copies, later ones add, in batch order. */
	pgrad = n ? extra : NULL;
	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		float *dst = pgrad + (size_t)ppos[u] * dim;
		uint32_t i = op->first[u];

		memcpy(dst, grads + (size_t)i * dim, dim * sizeof(float));
		for (i = op->next[i]; i != NONE; i = op->next[i])
			for (uint32_t j = 0; j < dim; j++)
				dst[j] += grads[(size_t)i * dim + j];
	}
	rc = c->cmap ? emb__batch_parts_rep(op, t, cnt, EMB_OP_PUSH, dim)
		     : emb__batch_parts(op, t, cnt, EMB_OP_PUSH, dim);
	emb__rep_unlock_keys(c);
	if (!rc)
		rc = emb__op_err_bufs(op);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		/* The sequence number is fixed now, so a retry repeats it. */
		p->req.seq = __atomic_add_fetch(&c->srv[p->req.server].push_seq, 1,
					    __ATOMIC_RELAXED);
		emb_le64_store(p->req.prefix, step);
		emb_le32_store(p->req.prefix + 8, rank);
		emb_le32_store(p->req.prefix + 12, 0);
		emb_le64_store(p->req.prefix + 16, c->session);
		emb_le64_store(p->req.prefix + 24, p->req.seq);
		p->req.iov[0] = (struct iovec){p->req.prefix, EMB_WIRE_PUSH_PREFIX_SIZE};
		p->req.iov[1] = (struct iovec){pids + p->req.first,
					   (size_t)p->req.n * sizeof(uint64_t)};
		p->req.iov[2] = (struct iovec){pgrad + (size_t)p->req.first * dim,
					   (size_t)p->req.n * dim * sizeof(float)};
		p->req.niov = p->req.n ? 3 : 1; /* an empty STEP_END part */
	}
	rc = emb__op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	emb__op_free(op);
	return rc;
}

/* Assign and erase: no dedup (last write wins in batch order per server). */
static int ids_start(struct emb_client_table *t, enum op_kind kind,
		     const uint64_t *ids, uint32_t n, const float *rows,
		     uint32_t stride, uint16_t flags, struct emb_async **opp)
{
	struct emb_client *c = t->c;
	uint32_t *cnt, *start, nkeys, most;
	const uint16_t *key;
	struct emb_async *op;
	uint64_t *pids;
	float *prows = NULL;
	int rc = -ENOMEM;

	op = emb__op_new(c, kind);
	if (!op)
		return -ENOMEM;
	most = c->cmap ? EMB_NSLOTS : c->nsrv;
	if (emb__op_counts(op, most) ||
	    emb__op_mem(op, (size_t)n * (8 + (rows ? 4ull * stride : 0)) + 8))
		goto err;
	cnt = op->cnt;
	start = cnt + most;
	pids = op->mem;
	if (rows)
		prows = (float *)(void *)(pids + n);
	key = emb__rep_write_keys(c, &nkeys);
	for (uint32_t i = 0; i < n; i++)
		cnt[key[emb_id_slot(ids[i])]]++;
	for (uint32_t s = 0; s < nkeys; s++)
		start[s + 1] = start[s] + cnt[s];
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = start[key[emb_id_slot(ids[i])]]++;

		pids[pos] = ids[i];
		if (rows)
			memcpy(prows + (size_t)pos * stride,
			       rows + (size_t)i * stride,
			       (size_t)stride * sizeof(float));
	}
	rc = c->cmap ? emb__batch_parts_rep(op, t, cnt,
				      kind == OP_ASSIGN ? EMB_OP_ASSIGN
							: EMB_OP_ERASE,
				      rows ? stride : 0)
		     : emb__batch_parts(op, t, cnt,
				  kind == OP_ASSIGN ? EMB_OP_ASSIGN
						    : EMB_OP_ERASE,
				  rows ? stride : 0);
	emb__rep_unlock_keys(c);
	if (!rc)
		rc = emb__op_err_bufs(op);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.hdr.flags = flags;
		p->req.iov[0] = (struct iovec){pids + p->req.first,
					   (size_t)p->req.n * sizeof(uint64_t)};
		p->req.niov = 1;
		if (rows) {
			p->req.iov[1] = (struct iovec){
			    prows + (size_t)p->req.first * stride,
			    (size_t)p->req.n * stride * sizeof(float)};
			p->req.niov = 2;
		}
	}
	rc = emb__op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	emb__op_free(op);
	return rc;
}

int emb_client_table_pull_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, float *out, uint32_t flags,
				uint8_t *found, struct emb_async **op)
{
	if (!op)
		return EMB_EBADARG;
	return pull_start(t, ids, n, out, flags, found, op);
}

int emb_client_table_push_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, const float *grads, uint64_t step,
				uint32_t rank, struct emb_async **op)
{
	if (!op)
		return EMB_EBADARG;
	return push_start(t, ids, n, grads, step, rank, op);
}

int emb_client_table_pull(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, float *out, uint32_t flags,
			  uint8_t *found)
{
	struct emb_async *op;
	int rc = pull_start(t, ids, n, out, flags, found, &op);

	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_push(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads, uint64_t step,
			  uint32_t rank)
{
	struct emb_async *op;
	int rc = push_start(t, ids, n, grads, step, rank, &op);

	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_assign(struct emb_client_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state)
{
	struct emb_async *op;
	int rc;

	if (!t || (n && (!ids || !rows)))
		return EMB_EBADARG;
	rc = ids_start(t, OP_ASSIGN, ids, n, rows,
		       with_state ? t->row_floats : t->spec.dim,
		       with_state ? EMB_F_WITH_STATE : 0, &op);
	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_erase(struct emb_client_table *t, const uint64_t *ids,
			   uint32_t n, uint64_t *erased)
{
	struct emb_async *op;
	uint64_t count;
	int rc;

	if (!t || (n && !ids))
		return EMB_EBADARG;
	rc = ids_start(t, OP_ERASE, ids, n, NULL, 0, 0, &op);
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

