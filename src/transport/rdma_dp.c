/*
 * src/transport/rdma_dp.c - the RDMA data path: posting SENDs, WRITEs and
 * READs from the per-conn send ring, the receive slots, the per-conn arena
 * of registered pages, and polling the loop's CQ.
 *
 * Nothing here allocates, logs or locks: send WRs and their SGE arrays are
 * built once per conn (emb__rdma_dp_init) and a post fills in address,
 * length and key. The one exception is a buffer larger than the whole
 * arena, which gets a one-off registration (counted in rt->oneoff).
 * Failures on this path only mark the conn (emb__rdma_conn_fail), which
 * logs and tears down from the loop. Loop thread only.
 */
#include "transport/rdma_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define CALL_IDX_BITS 20
#define CALL_IDX_MASK ((1u << CALL_IDX_BITS) - 1)

/* ---- registered memory lookup ------------------------------------------- */

/* The registered range holding p, or NULL: binary search on start. */
static struct emb_rdma_mr *mr_at(struct emb_rdma_transport *rt, uintptr_t p)
{
	uint32_t lo = 0, hi = rt->nmrs;
	struct emb_rdma_mr *m;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if ((uintptr_t)rt->mrs[mid]->base.addr <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	m = rt->mrs[lo - 1];
	if (p - (uintptr_t)m->base.addr >= m->base.len)
		return NULL;
	return m;
}

struct emb_rdma_mr *emb__rdma_mr_find(struct emb_rdma_transport *rt,
				      const void *p, size_t len)
{
	struct emb_rdma_mr *m = mr_at(rt, (uintptr_t)p);

	if (!m || (uintptr_t)p - (uintptr_t)m->base.addr + len > m->base.len)
		return NULL;
	return m;
}

/* Bytes of [p, p + len) to send from p on: registered run, or all of it. */
static size_t piece(struct emb_rdma_transport *rt, uintptr_t p, size_t len,
		    struct emb_rdma_mr **mr)
{
	struct emb_rdma_mr *m = mr_at(rt, p);
	size_t left;

	*mr = m;
	if (!m)
		return len;
	left = m->base.len - (p - (uintptr_t)m->base.addr);
	return left < len ? left : len;
}

/* ---- arena -------------------------------------------------------------- */

static bool page_used(const struct emb_rdma_conn *c, uint32_t i)
{
	return c->arena_map[i / 64] >> (i % 64) & 1;
}

static void pages_mark(struct emb_rdma_conn *c, uint32_t first, uint32_t n,
		       bool used)
{
	for (uint32_t i = first; i < first + n; i++) {
		if (used)
			c->arena_map[i / 64] |= 1ull << (i % 64);
		else
			c->arena_map[i / 64] &= ~(1ull << (i % 64));
	}
}

/* First fit from the hint, wrapping once. UINT32_MAX if no run fits. */
static uint32_t pages_find(struct emb_rdma_conn *c, uint32_t n)
{
	uint32_t total = c->arena_pages, run = 0, start = 0;

	for (uint32_t k = 0; k < 2 * total; k++) {
		uint32_t i = (c->arena_hint + k) % total;

		if (i == 0)
			run = 0; /* runs do not wrap around the end */
		if (page_used(c, i)) {
			run = 0;
			continue;
		}
		if (run == 0)
			start = i;
		if (++run == n)
			return start;
	}
	return UINT32_MAX;
}

static uint32_t buf_pages(const struct emb_rdma_buf *b)
{
	return b->addr ? b->npages : 0;
}

/*
 * Lends len bytes of registered memory: arena pages when the arena could
 * hold them next to the held_pages the same message already holds (else
 * it would wait for itself), -EAGAIN while the arena is full; otherwise a
 * one-off registration.
 */
static int buf_get(struct emb_rdma_conn *c, size_t len, uint32_t held_pages,
		   struct emb_rdma_buf *b)
{
	struct emb_rdma_transport *rt = c->rt;
	size_t n = (len + EMB_RDMA_PAGE - 1) / EMB_RDMA_PAGE;
	uint32_t first;

	if (n == 0)
		n = 1;
	if (n + held_pages > c->arena_pages) {
		size_t bytes = n * EMB_RDMA_PAGE;
		void *p = aligned_alloc(EMB_RDMA_PAGE, bytes);

		if (!p)
			return -ENOMEM;
		b->mr = ibv_reg_mr(rt->pd, p, bytes,
				   IBV_ACCESS_LOCAL_WRITE |
					   IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ);
		if (!b->mr) {
			free(p);
			return -ENOMEM;
		}
		b->addr = p;
		b->len = bytes;
		b->lkey = b->mr->lkey;
		b->rkey = b->mr->rkey;
		b->page = UINT32_MAX;
		b->npages = 0;
		rt->oneoff++;
		return 0;
	}
	first = pages_find(c, (uint32_t)n);
	if (first == UINT32_MAX)
		return -EAGAIN;
	pages_mark(c, first, (uint32_t)n, true);
	c->arena_hint = (first + (uint32_t)n) % c->arena_pages;
	b->addr = c->arena + (size_t)first * EMB_RDMA_PAGE;
	b->len = n * EMB_RDMA_PAGE;
	b->lkey = c->arena_mr->lkey;
	b->rkey = c->arena_mr->rkey;
	b->page = first;
	b->npages = (uint32_t)n;
	b->mr = NULL;
	return 0;
}

void emb__rdma_buf_put(struct emb_rdma_conn *c, struct emb_rdma_buf *b)
{
	if (!b->addr)
		return;
	if (b->page == UINT32_MAX) {
		ibv_dereg_mr(b->mr);
		free(b->addr);
	} else {
		pages_mark(c, b->page, b->npages, false);
	}
	b->addr = NULL;
	b->len = 0;
	b->mr = NULL;
}

/* ---- setup -------------------------------------------------------------- */

int emb__rdma_dp_init(struct emb_rdma_conn *c)
{
	struct emb_rdma_transport *rt = c->rt;
	uint32_t max_sge = rt->max_sge;

	c->ring = calloc(EMB_RDMA_RING, sizeof(*c->ring));
	c->ring_sge = calloc((size_t)EMB_RDMA_RING * max_sge,
			     sizeof(*c->ring_sge));
	c->rx_wr = calloc(c->nslots, sizeof(*c->rx_wr));
	c->rx_sge = calloc(c->nslots, sizeof(*c->rx_sge));
	if (!c->ring || !c->ring_sge || !c->rx_wr || !c->rx_sge)
		return -ENOMEM;
	for (uint32_t i = 0; i < EMB_RDMA_RING; i++) {
		c->ring[i].sge = &c->ring_sge[(size_t)i * max_sge];
		c->ring[i].wr.sg_list = c->ring[i].sge;
	}
	for (uint32_t i = 0; i < c->nslots; i++) {
		c->rx_sge[i].addr =
			(uintptr_t)(c->rx_mem + (size_t)i * EMB_RDMA_SLOT_BYTES);
		c->rx_sge[i].length = EMB_RDMA_SLOT_BYTES;
		c->rx_sge[i].lkey = c->rx_mr->lkey;
		c->rx_wr[i].wr_id =
			emb__rdma_wr_id(c->idx, EMB_RDMA_WR_RECV, i);
		c->rx_wr[i].sg_list = &c->rx_sge[i];
		c->rx_wr[i].num_sge = 1;
	}
	if (c->base.server) {
		c->sreqs = calloc(c->nslots, sizeof(*c->sreqs));
		if (!c->sreqs)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->nslots; i++) {
			c->sreqs[i].slot = i;
			c->sreqs[i].base.conn = &c->base;
			c->sreqs[i].op.kind = EMB_RDMA_OP_REPLY;
		}
	} else {
		uint32_t n = c->base.tr->opts.max_inflight;

		c->calls = calloc(n, sizeof(*c->calls));
		if (!c->calls)
			return -ENOMEM;
		for (uint32_t i = n; i-- > 0;) {
			c->calls[i].op.kind = EMB_RDMA_OP_CALL;
			c->calls[i].free_next = c->call_free;
			c->call_free = &c->calls[i];
		}
	}
	return 0;
}

static int post_recv(struct emb_rdma_conn *c, uint32_t slot)
{
	struct ibv_recv_wr *bad;
	int rc;

	c->rx_wr[slot].next = NULL;
	rc = ibv_post_recv(c->qp, &c->rx_wr[slot], &bad);
	return rc ? -rc : 0;
}

int emb__rdma_post_all_recv(struct emb_rdma_conn *c)
{
	struct ibv_recv_wr *bad;
	int rc;

	for (uint32_t i = 0; i < c->nslots; i++)
		c->rx_wr[i].next = i + 1 < c->nslots ? &c->rx_wr[i + 1] : NULL;
	rc = ibv_post_recv(c->qp, &c->rx_wr[0], &bad);
	return rc ? -rc : 0;
}

/* ---- send ring ---------------------------------------------------------- */

struct chain {
	struct ibv_send_wr *first; /* to post */
	struct ibv_send_wr *last;
	uint32_t n;		   /* entries taken */
};

static uint32_t ring_free(const struct emb_rdma_conn *c, const struct chain *ch)
{
	return EMB_RDMA_RING - (c->sq_head - c->sq_tail) - ch->n;
}

/*
 * Takes the next ring entry for ch. Signals it if sig, or if the last
 * signaled WR is EMB_RDMA_SIG_GAP back, so a full ring always holds a WR
 * whose completion frees it.
 */
static struct emb_rdma_swr *chain_add(struct emb_rdma_conn *c,
				      struct chain *ch, bool sig)
{
	uint32_t seq = c->sq_head + ch->n;
	struct emb_rdma_swr *e = &c->ring[seq & (EMB_RDMA_RING - 1)];

	if (seq - c->sq_last_sig >= EMB_RDMA_SIG_GAP)
		sig = true;
	if (sig)
		c->sq_last_sig = seq;
	e->buf.addr = NULL;
	e->done = NULL;
	e->ctx = NULL;
	e->read = NULL;
	e->wr.next = NULL;
	e->wr.wr_id = emb__rdma_wr_id(c->idx, EMB_RDMA_WR_SEND, seq);
	e->wr.num_sge = 0;
	e->wr.send_flags = sig ? IBV_SEND_SIGNALED : 0;
	e->wr.imm_data = 0;
	if (ch->last)
		ch->last->next = &e->wr;
	else
		ch->first = &e->wr;
	ch->last = &e->wr;
	ch->n++;
	return e;
}

static int chain_post(struct emb_rdma_conn *c, struct chain *ch)
{
	struct ibv_send_wr *bad;
	int rc;

	if (!ch->n)
		return 0;
	c->sq_head += ch->n;
	/* On failure the taken entries stay between tail and head; the
	 * teardown frees their buffers. */
	rc = emb__fault_hit(c->base.tr, EMB_FAULT_IO);
	if (!rc)
		rc = -ibv_post_send(c->qp, ch->first, &bad);
	ch->first = ch->last = NULL;
	ch->n = 0;
	if (rc) {
		emb__rdma_conn_fail(c, rc);
		return rc;
	}
	return 0;
}

static void sge_set(struct ibv_sge *s, const void *addr, size_t len,
		    uint32_t lkey)
{
	s->addr = (uintptr_t)addr;
	s->length = (uint32_t)len;
	s->lkey = lkey;
}

/* ---- send queue --------------------------------------------------------- */

static void q_push(struct emb_rdma_conn *c, struct emb_rdma_op *op,
		   uint64_t bytes)
{
	op->next = NULL;
	op->prev = c->q_tail;
	if (c->q_tail)
		c->q_tail->next = op;
	else
		c->q_head = op;
	c->q_tail = op;
	op->queued = true;
	c->q_bytes += bytes;
	c->base.stats.out_queued = c->q_bytes;
	emb__stat_max(&c->base.tr->stats.out_queue_peak, c->q_bytes);
}

static void q_remove(struct emb_rdma_conn *c, struct emb_rdma_op *op,
		     uint64_t bytes)
{
	if (op->prev)
		op->prev->next = op->next;
	else
		c->q_head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		c->q_tail = op->prev;
	op->prev = op->next = NULL;
	op->queued = false;
	c->q_bytes -= bytes;
	c->base.stats.out_queued = c->q_bytes;
}

static uint64_t iov_bytes(const struct iovec *iov, int niov)
{
	uint64_t n = 0;

	for (int i = 0; i < niov; i++)
		n += iov[i].iov_len;
	return n;
}

static void iov_copy(char *dst, const struct iovec *iov, int niov)
{
	for (int i = 0; i < niov; i++) {
		if (iov[i].iov_len)
			memcpy(dst, iov[i].iov_base, iov[i].iov_len);
		dst += iov[i].iov_len;
	}
}

/*
 * The interface copies the caller's iov array. A post that goes out at
 * once needs no copy; an op that has to wait keeps one, inline up to
 * EMB_RDMA_IOV_INLINE entries, else on the heap (only on a backlogged
 * conn). 0 or -ENOMEM.
 */
static int iov_keep(const struct iovec *src, int n, struct iovec *inl,
		    struct iovec **heap, const struct iovec **out)
{
	struct iovec *dst = inl;

	if (n > (int)EMB_RDMA_IOV_INLINE) {
		dst = malloc((size_t)n * sizeof(*dst));
		if (!dst)
			return -ENOMEM;
		*heap = dst;
	}
	if (n)
		memcpy(dst, src, (size_t)n * sizeof(*dst));
	*out = dst;
	return 0;
}

static void iov_drop(struct iovec **heap)
{
	free(*heap);
	*heap = NULL;
}

static struct emb_rdma_call *op_call(struct emb_rdma_op *op)
{
	return emb__container_of(op, struct emb_rdma_call, op);
}

static struct emb_rdma_sreq *op_sreq(struct emb_rdma_op *op)
{
	return emb__container_of(op, struct emb_rdma_sreq, op);
}

static uint64_t op_bytes(struct emb_rdma_op *op)
{
	if (op->kind == EMB_RDMA_OP_CALL)
		return EMB_FRAME_HDR_SIZE + op_call(op)->hdr.payload_len;
	if (op->kind == EMB_RDMA_OP_REPLY)
		return EMB_FRAME_HDR_SIZE + op_sreq(op)->rhdr.payload_len;
	return 0;
}

/* Client: sends the request of call if credit, ring and arena allow. */
static int call_post(struct emb_rdma_conn *c, struct emb_rdma_call *call)
{
	uint32_t plen = call->hdr.payload_len;
	bool inl = plen <= EMB_RDMA_INLINE_MAX;
	struct emb_rdma_prefix pfx = {0};
	struct chain ch = {0};
	struct emb_rdma_buf tx = {0};
	struct emb_rdma_swr *e;
	/* No response outgrows a frame: bounce no more than that. */
	size_t land = c->base.tr->opts.max_frame_bytes - EMB_FRAME_HDR_SIZE;
	char *msg;
	int rc;

	if (call->resp_cap < land)
		land = call->resp_cap;
	if (!c->credits || ring_free(c, &ch) < 1)
		return -EAGAIN;
	if (!inl && !call->big.addr) {
		/* Prefix and header first, then the payload the server READs;
		 * one run, so a frame the size of the arena still fits. */
		rc = buf_get(c, EMB_RDMA_MSG_HDRS + plen,
			     buf_pages(&call->bounce), &call->big);
		if (rc)
			return rc;
		iov_copy(call->big.addr + EMB_RDMA_MSG_HDRS, call->iov,
			 call->niov);
	}
	if (!call->resp_rkey && call->resp_cap > EMB_RDMA_INLINE_MAX) {
		if (!call->bounce.addr) {
			rc = buf_get(c, land, buf_pages(&call->big),
				     &call->bounce);
			if (rc)
				return rc;
			c->rt->bounced++;
			EMB__STAT_ADD(c->rt->base.stats.resp_bounced, 1);
		}
		pfx.resp_rkey = call->bounce.rkey;
		pfx.resp_addr = (uintptr_t)call->bounce.addr;
	} else {
		pfx.resp_rkey = call->resp_rkey;
		pfx.resp_addr = call->resp_addr;
	}
	if (inl) {
		rc = buf_get(c, EMB_RDMA_MSG_HDRS + plen,
			     buf_pages(&call->bounce), &tx);
		if (rc)
			return rc;
		msg = tx.addr;
	} else {
		msg = call->big.addr;
	}

	pfx.resp_cap = (uint32_t)land;
	if (inl) {
		pfx.type = EMB_RDMA_MSG_REQ_INLINE;
		iov_copy(msg + EMB_RDMA_MSG_HDRS, call->iov, call->niov);
	} else {
		pfx.type = EMB_RDMA_MSG_REQ_READ;
		pfx.req_rkey = call->big.rkey;
		pfx.req_addr = (uintptr_t)call->big.addr + EMB_RDMA_MSG_HDRS;
	}
	memcpy(msg, &pfx, sizeof(pfx));
	memcpy(msg + EMB_RDMA_PREFIX_SIZE, &call->hdr, sizeof(call->hdr));

	e = chain_add(c, &ch, false);
	e->wr.opcode = IBV_WR_SEND;
	sge_set(&e->sge[0], msg, EMB_RDMA_MSG_HDRS + (inl ? plen : 0),
		inl ? tx.lkey : call->big.lkey);
	e->wr.num_sge = 1;
	e->buf = tx; /* inline: freed on completion; else the call owns it */
	call->iov = NULL;
	call->niov = 0;
	iov_drop(&call->iov_heap);
	c->credits--;
	call->state = EMB_RDMA_CALL_POSTED;
	call->at_server = true;
	EMB__STAT_ADD(c->base.tr->stats.frames_out, 1);
	EMB__STAT_ADD(c->base.tr->stats.bytes_out, EMB_FRAME_HDR_SIZE + plen);
	c->base.stats.frames_out++;
	c->base.stats.bytes_out += EMB_FRAME_HDR_SIZE + plen;
	return chain_post(c, &ch);
}

/* Server: RDMA READ of a large request payload into arena pages. */
static int read_post(struct emb_rdma_conn *c, struct emb_rdma_sreq *sr)
{
	uint32_t plen = sr->base.hdr.payload_len;
	struct chain ch = {0};
	struct emb_rdma_swr *e;
	int rc;

	if (ring_free(c, &ch) < 1)
		return -EAGAIN;
	if (!sr->big.addr) {
		rc = buf_get(c, plen, 0, &sr->big);
		if (rc)
			return rc;
	}
	e = chain_add(c, &ch, true);
	e->wr.opcode = IBV_WR_RDMA_READ;
	e->wr.wr.rdma.remote_addr = sr->pfx.req_addr;
	e->wr.wr.rdma.rkey = sr->pfx.req_rkey;
	sge_set(&e->sge[0], sr->big.addr, plen, sr->big.lkey);
	e->wr.num_sge = 1;
	e->read = sr;
	return chain_post(c, &ch);
}

/* Server: a zero-byte SEND with immediate gives back a dropped request's
 * credit, after its slot is posted again. */
static int credit_post(struct emb_rdma_conn *c, struct emb_rdma_sreq *sr)
{
	struct chain ch = {0};
	struct emb_rdma_swr *e;
	int rc;

	if (ring_free(c, &ch) < 1)
		return -EAGAIN;
	rc = post_recv(c, sr->slot);
	if (rc) {
		emb__rdma_conn_fail(c, rc);
		return rc;
	}
	sr->state = EMB_RDMA_SREQ_IDLE;
	e = chain_add(c, &ch, false);
	e->wr.opcode = IBV_WR_SEND_WITH_IMM;
	e->wr.imm_data = htonl((uint32_t)sr->base.hdr.req_id);
	return chain_post(c, &ch);
}

/*
 * Server: posts as much of a reply as the ring allows. WRITEs carry the
 * payload (registered iov entries in place, the rest copied to stage),
 * then one SEND carries prefix and header (and an inline payload). The
 * slot is posted again just before that SEND, whose arrival gives the
 * client its credit back. -EAGAIN: call again when WRs complete.
 */
static int reply_post(struct emb_rdma_conn *c, struct emb_rdma_sreq *sr)
{
	struct emb_rdma_transport *rt = c->rt;
	uint32_t plen = sr->rhdr.payload_len;
	struct emb_rdma_prefix pfx = {0};
	struct chain ch = {0};
	struct emb_rdma_swr *e;
	size_t need, len;
	int rc;

	if (!sr->stage.addr) {
		need = EMB_RDMA_MSG_HDRS;
		if (sr->rtype == EMB_RDMA_MSG_RESP_INLINE)
			need += plen;
		else if (sr->rtype == EMB_RDMA_MSG_RESP_WRITTEN)
			need += sr->unreg_bytes;
		rc = buf_get(c, need, buf_pages(&sr->big), &sr->stage);
		if (rc)
			return rc;
		sr->stage_used = EMB_RDMA_MSG_HDRS;
	}
	while (sr->rtype == EMB_RDMA_MSG_RESP_WRITTEN && sr->ri < sr->rniov) {
		struct ibv_sge *prev = NULL;
		uint32_t ns = 0;
		uint64_t wlen = 0;

		if (ring_free(c, &ch) < 2) {
			rc = chain_post(c, &ch);
			return rc ? rc : -EAGAIN;
		}
		e = chain_add(c, &ch, false);
		e->wr.opcode = IBV_WR_RDMA_WRITE;
		e->wr.wr.rdma.remote_addr = sr->pfx.resp_addr + sr->remote_off;
		e->wr.wr.rdma.rkey = sr->pfx.resp_rkey;
		while (sr->ri < sr->rniov && ns < rt->max_sge) {
			const struct iovec *v = &sr->riov[sr->ri];
			uintptr_t p = (uintptr_t)v->iov_base + sr->roff;
			struct emb_rdma_mr *m;
			size_t n;

			if (sr->roff == v->iov_len) {
				sr->ri++;
				sr->roff = 0;
				continue;
			}
			n = piece(rt, p, v->iov_len - sr->roff, &m);
			if (m) {
				prev = &e->sge[ns++];
				sge_set(prev, (void *)p, n, m->mr->lkey);
			} else {
				char *dst = sr->stage.addr + sr->stage_used;

				if (sr->stage_used + n > sr->stage.len) {
					/* The MR table changed under the reply. */
					emb__rdma_conn_fail(c, EMB_EINTERNAL);
					return EMB_EINTERNAL;
				}
				memcpy(dst, (void *)p, n);
				sr->stage_used += n;
				rt->copied_bytes += n;
				if (prev && prev->lkey == sr->stage.lkey &&
				    prev->addr + prev->length == (uintptr_t)dst)
					prev->length += (uint32_t)n;
				else {
					prev = &e->sge[ns++];
					sge_set(prev, dst, n, sr->stage.lkey);
				}
			}
			sr->roff += n;
			wlen += n;
		}
		e->wr.num_sge = (int)ns;
		sr->remote_off += wlen;
	}
	if (ring_free(c, &ch) < 1) {
		rc = chain_post(c, &ch);
		return rc ? rc : -EAGAIN;
	}

	pfx.type = sr->rtype;
	memcpy(sr->stage.addr, &pfx, sizeof(pfx));
	memcpy(sr->stage.addr + EMB_RDMA_PREFIX_SIZE, &sr->rhdr,
	       sizeof(sr->rhdr));
	len = EMB_RDMA_MSG_HDRS;
	if (sr->rtype == EMB_RDMA_MSG_RESP_INLINE) {
		iov_copy(sr->stage.addr + EMB_RDMA_MSG_HDRS, sr->riov,
			 sr->rniov);
		len += plen;
	}
	e = chain_add(c, &ch, true);
	e->wr.opcode = IBV_WR_SEND;
	sge_set(&e->sge[0], sr->stage.addr, len, sr->stage.lkey);
	e->wr.num_sge = 1;
	e->buf = sr->stage;
	e->done = sr->rdone;
	e->ctx = sr->rctx;
	sr->stage.addr = NULL;
	emb__rdma_buf_put(c, &sr->big);
	iov_drop(&sr->riov_heap);

	rc = post_recv(c, sr->slot);
	if (rc) {
		/* The entries taken stay unposted; teardown frees them. */
		c->sq_head += ch.n;
		emb__rdma_conn_fail(c, rc);
		return rc;
	}
	sr->state = EMB_RDMA_SREQ_IDLE;
	EMB__STAT_ADD(rt->base.stats.frames_out, 1);
	EMB__STAT_ADD(rt->base.stats.bytes_out, EMB_FRAME_HDR_SIZE + plen);
	c->base.stats.frames_out++;
	c->base.stats.bytes_out += EMB_FRAME_HDR_SIZE + plen;
	return chain_post(c, &ch);
}

/* ---- one-sided reads --------------------------------------------------- */

static struct emb_read_op *op_rd(struct emb_rdma_op *op)
{
	return emb__container_of((void *)op, struct emb_read_op, priv);
}

/*
 * Client: posts the read batch's next READs while the ring has room; only
 * the last carries the batch's callback, and completions arrive in post
 * order, so it fires once every READ before it has landed. 0 once all are
 * posted, -EAGAIN when the ring is full.
 */
static int rd_post(struct emb_rdma_conn *c, struct emb_read_op *ro)
{
	struct emb_rdma_rd *rd = (struct emb_rdma_rd *)(void *)ro->priv;
	struct emb_rdma_mr *m = NULL;
	struct chain ch = {0};
	int rc;

	while (rd->next < ro->n && ring_free(c, &ch) >= 1) {
		const struct emb_read_seg *sg = &ro->segs[rd->next];
		bool last = rd->next + 1 == ro->n;
		struct emb_rdma_swr *e;

		/* Landings usually share one region: search on a change. */
		if (!m || (uintptr_t)sg->local < (uintptr_t)m->base.addr ||
		    (uintptr_t)sg->local + sg->len >
			(uintptr_t)m->base.addr + m->base.len)
			m = emb__rdma_mr_find(c->rt, sg->local, sg->len);
		e = chain_add(c, &ch, last);
		e->wr.opcode = IBV_WR_RDMA_READ;
		e->wr.wr.rdma.remote_addr = sg->raddr;
		e->wr.wr.rdma.rkey = sg->rkey;
		sge_set(&e->sge[0], sg->local, sg->len, m->mr->lkey);
		e->wr.num_sge = 1;
		if (last) {
			e->done = ro->done;
			e->ctx = ro->ctx;
		}
		rd->next++;
	}
	rc = chain_post(c, &ch);
	if (rc) {
		/* The conn failed. Once the last READ is in the ring, the
		 * teardown fires done from there: the queue lets go. */
		if (rd->next == ro->n && rd->op.queued)
			q_remove(c, &rd->op, 0);
		return rc;
	}
	return rd->next < ro->n ? -EAGAIN : 0;
}

int emb__rdma_read(struct emb_conn *conn, struct emb_read_op *ro)
{
	struct emb_rdma_conn *c = emb__rdma_conn_of(conn);
	struct emb_rdma_rd *rd = (struct emb_rdma_rd *)(void *)ro->priv;
	int rc;

	_Static_assert(sizeof(struct emb_rdma_rd) <= sizeof(ro->priv),
		       "read batch bookkeeping fits in priv");
	if (c->state != EMB_RDMA_CONN_OPEN)
		return EMB_ECLOSED;
	for (uint32_t i = 0; i < ro->n; i++)
		if (!ro->segs[i].len ||
		    !emb__rdma_mr_find(c->rt, ro->segs[i].local,
				       ro->segs[i].len))
			return -EINVAL;
	memset(rd, 0, sizeof(*rd));
	rd->op.kind = EMB_RDMA_OP_RDREAD;
	if (!c->q_head) {
		rc = rd_post(c, ro);
		if (rc == 0)
			return 0;
		/* Failed with the conn: the teardown fires done if the last
		 * READ reached the ring; if not, nothing ever will. */
		if (c->state != EMB_RDMA_CONN_OPEN)
			return rd->next == ro->n ? 0 : EMB_ECLOSED;
		if (rc != -EAGAIN)
			return rc;
	}
	q_push(c, &rd->op, 0);
	return 0;
}

int emb__rdma_rkey_of(struct emb_transport *tr, const void *addr, size_t len,
		      uint32_t *rkey)
{
	struct emb_rdma_mr *m = emb__rdma_mr_find(emb__rdma_tr_of(tr), addr,
						  len);

	if (!m)
		return -ENOENT;
	*rkey = m->mr->rkey;
	return 0;
}

/* Posts queued ops in order until one has to wait. */
static void q_run(struct emb_rdma_conn *c)
{
	struct emb_rdma_op *op;
	int rc;

	while (c->state == EMB_RDMA_CONN_OPEN && (op = c->q_head)) {
		uint64_t bytes = op_bytes(op);

		switch (op->kind) {
		case EMB_RDMA_OP_CALL:
			rc = call_post(c, op_call(op));
			break;
		case EMB_RDMA_OP_READ:
			rc = read_post(c, op_sreq(op));
			break;
		case EMB_RDMA_OP_CREDIT:
			rc = credit_post(c, op_sreq(op));
			break;
		case EMB_RDMA_OP_RDREAD:
			rc = rd_post(c, op_rd(op));
			break;
		default:
			rc = reply_post(c, op_sreq(op));
			break;
		}
		if (rc == -EAGAIN)
			return;
		if (rc == -ENOMEM) {
			emb__rdma_conn_fail(c, rc);
			return;
		}
		if (c->state != EMB_RDMA_CONN_OPEN)
			return;
		q_remove(c, op, bytes);
	}
}

/* ---- client calls ------------------------------------------------------- */

static void live_unlink(struct emb_rdma_conn *c, struct emb_rdma_call *call)
{
	if (!call->live)
		return;
	if (call->prev)
		call->prev->next = call->next;
	else
		c->live_head = call->next;
	if (call->next)
		call->next->prev = call->prev;
	else
		c->live_tail = call->prev;
	call->prev = call->next = NULL;
	call->live = false;
}

static void call_free(struct emb_rdma_conn *c, struct emb_rdma_call *call)
{
	emb__rdma_buf_put(c, &call->big);
	emb__rdma_buf_put(c, &call->bounce);
	iov_drop(&call->iov_heap);
	call->state = EMB_RDMA_CALL_FREE;
	call->at_server = false;
	call->free_next = c->call_free;
	c->call_free = call;
	c->calls_used--;
	c->base.stats.inflight = c->calls_used;
}

int emb__rdma_call(struct emb_conn *conn, const struct emb_frame_hdr *hdr,
		   const struct iovec *iov, int niov, void *resp_buf,
		   size_t resp_cap, emb_call_done_fn done, void *ctx)
{
	struct emb_rdma_conn *c = emb__rdma_conn_of(conn);
	struct emb_transport *tr = conn->tr;
	struct emb_rdma_call *call;
	struct emb_rdma_mr *m;
	uint64_t plen = iov_bytes(iov, niov);
	uint32_t idx;
	int rc;

	if (plen > tr->opts.max_frame_bytes - EMB_FRAME_HDR_SIZE)
		return -EINVAL;
	/* A conn that failed but whose close is not yet delivered still
	 * takes calls; they fail with the close reason, as queued ones do. */
	if (c->state != EMB_RDMA_CONN_OPEN && !c->close_pending)
		return EMB_ECLOSED;
	call = c->call_free;
	if (!call)
		return EMB_ENOCREDIT;
	c->call_free = call->free_next;
	c->calls_used++;
	conn->stats.inflight = c->calls_used;

	idx = (uint32_t)(call - c->calls);
	call->req_id = (++c->req_seq << CALL_IDX_BITS) | idx;
	call->hdr = *hdr;
	call->hdr.magic = EMB_FRAME_MAGIC;
	call->hdr.version = EMB_FRAME_VERSION;
	call->hdr.req_id = call->req_id;
	call->hdr.payload_len = (uint32_t)plen;
	call->iov = iov;
	call->niov = niov;
	call->resp_buf = resp_buf;
	call->resp_cap = resp_cap;
	call->done = done;
	call->ctx = ctx;
	call->resp_rkey = 0;
	call->resp_addr = 0;
	if (resp_cap) {
		m = emb__rdma_mr_find(c->rt, resp_buf, resp_cap);
		if (m) {
			call->resp_rkey = m->mr->rkey;
			call->resp_addr = (uintptr_t)resp_buf;
		}
	}
	call->deadline_ms = c->call_timeout_ms
				    ? emb__now_ms() + c->call_timeout_ms
				    : 0;
	call->prev = c->live_tail;
	call->next = NULL;
	if (c->live_tail)
		c->live_tail->next = call;
	else
		c->live_head = call;
	c->live_tail = call;
	call->live = true;
	call->state = EMB_RDMA_CALL_QUEUED;
	if (!c->q_head && c->state == EMB_RDMA_CONN_OPEN) {
		rc = call_post(c, call);
		if (rc == 0 || c->state != EMB_RDMA_CONN_OPEN)
			return 0; /* posted, or failed with the conn */
		if (rc != -EAGAIN)
			goto err_undo;
	}
	rc = iov_keep(iov, niov, call->iov_inl, &call->iov_heap, &call->iov);
	if (rc)
		goto err_undo;
	q_push(c, &call->op, EMB_FRAME_HDR_SIZE + plen);
	return 0;

err_undo:
	live_unlink(c, call);
	call_free(c, call);
	return rc;
}

/* Completes a live call: unlinks it, frees or parks its slot, runs done. */
static void call_finish(struct emb_rdma_conn *c, struct emb_rdma_call *call,
			int status, const struct emb_frame_hdr *resp)
{
	emb_call_done_fn done = call->done;
	void *ctx = call->ctx;

	live_unlink(c, call);
	if (call->op.queued)
		q_remove(c, &call->op, op_bytes(&call->op));
	if (call->at_server)
		call->state = EMB_RDMA_CALL_ZOMBIE;
	else
		call_free(c, call);
	done(ctx, status, resp);
}

int emb__rdma_timeouts(struct emb_rdma_transport *rt, uint64_t now,
		       uint64_t *next_ms)
{
	int n = 0;

	for (uint32_t i = 0; i < rt->nconns; i++) {
		struct emb_rdma_conn *c = rt->conns[i];
		struct emb_rdma_call *call;

		if (!c || c->base.server || c->state != EMB_RDMA_CONN_OPEN)
			continue;
		c->busy++;
		while (c->state == EMB_RDMA_CONN_OPEN &&
		       (call = c->live_head) && call->deadline_ms) {
			if (call->deadline_ms > now) {
				if (call->deadline_ms < *next_ms)
					*next_ms = call->deadline_ms;
				break;
			}
			EMB__STAT_ADD(rt->base.stats.calls_timed_out, 1);
			call_finish(c, call, -ETIMEDOUT, NULL);
			n++;
		}
		c->busy--;
		emb__rdma_conn_maybe_free(c);
	}
	return n;
}

void emb__rdma_fail_ops(struct emb_rdma_conn *c, int reason)
{
	struct emb_rdma_op *op;
	int status = reason ? reason : EMB_ECLOSED;

	c->busy++;
	/* Read batches not fully posted: their last READ, which carries the
	 * callback, never went out. */
	for (op = c->q_head; op;) {
		struct emb_rdma_op *next = op->next;

		if (op->kind == EMB_RDMA_OP_RDREAD) {
			struct emb_read_op *ro = op_rd(op);
			struct emb_rdma_rd *rd =
			    (struct emb_rdma_rd *)(void *)ro->priv;

			q_remove(c, op, 0);
			/* A last READ in the ring fires done from there. */
			if (rd->next < ro->n)
				ro->done(ro->ctx, status);
		}
		op = next;
	}
	/* Queued server ops: replies fail, READs and credits just stop. */
	while ((op = c->q_head) && op->kind != EMB_RDMA_OP_CALL) {
		struct emb_rdma_sreq *sr = op_sreq(op);
		emb_send_done_fn done = NULL;

		q_remove(c, op, op_bytes(op));
		if (op->kind == EMB_RDMA_OP_REPLY) {
			done = sr->rdone;
			sr->state = EMB_RDMA_SREQ_IDLE;
			iov_drop(&sr->riov_heap);
		}
		if (done)
			done(sr->rctx, status);
		if (op->kind == EMB_RDMA_OP_CREDIT)
			sr->state = EMB_RDMA_SREQ_IDLE;
	}
	/* Calls: the QP is in error, so nothing lands in the caller's
	 * memory any more; parked slots are freed at teardown. */
	while (c->live_head) {
		struct emb_rdma_call *call = c->live_head;

		call->at_server = true; /* keep buffers until teardown */
		call_finish(c, call, status, NULL);
	}
	c->busy--;
}

void emb__rdma_release_bufs(struct emb_rdma_conn *c)
{
	int status = c->reason ? c->reason : EMB_ECLOSED;

	/* Entries never posted (a failed post) or never completed. */
	while (c->sq_tail != c->sq_head) {
		struct emb_rdma_swr *e =
			&c->ring[c->sq_tail++ & (EMB_RDMA_RING - 1)];

		emb__rdma_buf_put(c, &e->buf);
		if (e->done)
			e->done(e->ctx, status);
		e->done = NULL;
	}
	if (c->calls) {
		for (uint32_t i = 0; i < c->base.tr->opts.max_inflight; i++) {
			emb__rdma_buf_put(c, &c->calls[i].big);
			emb__rdma_buf_put(c, &c->calls[i].bounce);
			iov_drop(&c->calls[i].iov_heap);
		}
	}
	if (c->sreqs) {
		for (uint32_t i = 0; i < c->nslots; i++) {
			emb__rdma_buf_put(c, &c->sreqs[i].big);
			emb__rdma_buf_put(c, &c->sreqs[i].stage);
			iov_drop(&c->sreqs[i].riov_heap);
		}
	}
}

/* ---- server requests ---------------------------------------------------- */

static void deliver(struct emb_rdma_conn *c, struct emb_rdma_sreq *sr,
		    void *payload)
{
	struct emb_rdma_transport *rt = c->rt;
	uint32_t plen = sr->base.hdr.payload_len;

	sr->state = EMB_RDMA_SREQ_HELD;
	sr->base.payload = plen ? payload : NULL;
	c->held++;
	c->base.stats.inflight = c->held;
	if (c->held == c->nslots) {
		/* Every receive slot is held: the client is out of credit
		 * and this conn is, in effect, no longer read. */
		c->base.stats.rx_paused = true;
		EMB__STAT_ADD(rt->base.stats.rx_pauses, 1);
	}
	c->base.stats.frames_in++;
	c->base.stats.bytes_in += EMB_FRAME_HDR_SIZE + plen;
	EMB__STAT_ADD(rt->base.stats.frames_in, 1);
	EMB__STAT_ADD(rt->base.stats.bytes_in, EMB_FRAME_HDR_SIZE + plen);
	if (c->state != EMB_RDMA_CONN_OPEN)
		return; /* closed from on_open: req stays held */
	c->on_request(c->arg, &c->base, &sr->base, &sr->base.hdr,
		      sr->base.payload);
}

static void srv_recv(struct emb_rdma_conn *c, uint32_t slot,
		     const struct ibv_wc *wc)
{
	struct emb_rdma_sreq *sr = &c->sreqs[slot];
	char *p = c->rx_mem + (size_t)slot * EMB_RDMA_SLOT_BYTES;
	int rc;

	if (!c->opened) {
		/* Data can beat ESTABLISHED to this loop. */
		emb__rdma_conn_opened(c);
		if (c->state != EMB_RDMA_CONN_OPEN)
			return;
	}
	if (wc->byte_len < EMB_RDMA_MSG_HDRS) {
		emb__rdma_conn_fail(c, EMB_ETRUNCFRAME);
		return;
	}
	memcpy(&sr->pfx, p, sizeof(sr->pfx));
	memcpy(&sr->base.hdr, p + EMB_RDMA_PREFIX_SIZE, sizeof(sr->base.hdr));
	rc = emb__frame_check(c->base.tr, &sr->base.hdr);
	if (rc) {
		emb__rdma_conn_fail(c, rc);
		return;
	}
	switch (sr->pfx.type) {
	case EMB_RDMA_MSG_REQ_INLINE:
		if (wc->byte_len != EMB_RDMA_MSG_HDRS +
					    sr->base.hdr.payload_len) {
			emb__rdma_conn_fail(c, EMB_EBADFRAME);
			return;
		}
		deliver(c, sr, p + EMB_RDMA_MSG_HDRS);
		return;
	case EMB_RDMA_MSG_REQ_READ:
		if (wc->byte_len != EMB_RDMA_MSG_HDRS || !sr->pfx.req_rkey ||
		    sr->base.hdr.payload_len <= EMB_RDMA_INLINE_MAX) {
			emb__rdma_conn_fail(c, EMB_EBADFRAME);
			return;
		}
		sr->state = EMB_RDMA_SREQ_READING;
		sr->op.kind = EMB_RDMA_OP_READ;
		q_push(c, &sr->op, 0);
		return;
	default:
		emb__rdma_conn_fail(c, EMB_EBADFRAME);
		return;
	}
}

int emb__rdma_reply(struct emb_req *req, const struct emb_frame_hdr *hdr,
		    const struct iovec *iov, int niov, emb_send_done_fn done,
		    void *ctx)
{
	struct emb_rdma_sreq *sr = (struct emb_rdma_sreq *)req;
	struct emb_rdma_conn *c = emb__rdma_conn_of(req->conn);
	struct emb_rdma_transport *rt = c->rt;
	uint64_t plen = iov_bytes(iov, niov);
	int rc;

	if (sr->state != EMB_RDMA_SREQ_HELD)
		return -EINVAL;
	if (c->state != EMB_RDMA_CONN_OPEN) {
		emb__rdma_req_release(req);
		return EMB_ECLOSED;
	}
	if (plen > rt->base.opts.max_frame_bytes - EMB_FRAME_HDR_SIZE) {
		emb__rdma_req_release(req);
		return -EMSGSIZE;
	}
	c->held--;
	c->base.stats.inflight = c->held;
	c->base.stats.rx_paused = false;
	sr->rhdr = *hdr;
	sr->rhdr.magic = EMB_FRAME_MAGIC;
	sr->rhdr.version = EMB_FRAME_VERSION;
	sr->rhdr.req_id = sr->base.hdr.req_id;
	sr->rhdr.payload_len = (uint32_t)plen;
	sr->riov = iov;
	sr->rniov = niov;
	sr->rdone = done;
	sr->rctx = ctx;
	sr->ri = 0;
	sr->roff = 0;
	sr->remote_off = 0;
	sr->unreg_bytes = 0;
	if (plen > sr->pfx.resp_cap)
		sr->rtype = EMB_RDMA_MSG_RESP_TOOBIG;
	else if (plen <= EMB_RDMA_INLINE_MAX)
		sr->rtype = EMB_RDMA_MSG_RESP_INLINE;
	else if (!sr->pfx.resp_rkey)
		sr->rtype = EMB_RDMA_MSG_RESP_TOOBIG;
	else
		sr->rtype = EMB_RDMA_MSG_RESP_WRITTEN;
	if (sr->rtype == EMB_RDMA_MSG_RESP_WRITTEN) {
		/* Size the staging copy now: one run of pages per reply. */
		for (int i = 0; i < niov; i++) {
			uintptr_t p = (uintptr_t)iov[i].iov_base;
			size_t left = iov[i].iov_len;

			while (left) {
				struct emb_rdma_mr *m;
				size_t n = piece(rt, p, left, &m);

				if (!m)
					sr->unreg_bytes += n;
				p += n;
				left -= n;
			}
		}
	}
	sr->state = EMB_RDMA_SREQ_REPLYING;
	sr->op.kind = EMB_RDMA_OP_REPLY;
	if (!c->q_head) {
		rc = reply_post(c, sr);
		if (rc == 0 || c->state != EMB_RDMA_CONN_OPEN)
			return 0;
		if (rc != -EAGAIN) {
			emb__rdma_conn_fail(c, rc);
			return 0;
		}
	}
	/* Keep what is left of the array while the reply waits. */
	rc = iov_keep(sr->riov + sr->ri, sr->rniov - sr->ri, sr->riov_inl,
		      &sr->riov_heap, &sr->riov);
	if (rc) {
		sr->state = EMB_RDMA_SREQ_IDLE;
		emb__rdma_conn_fail(c, rc);
		return rc;
	}
	sr->rniov -= sr->ri;
	sr->ri = 0;
	q_push(c, &sr->op, EMB_FRAME_HDR_SIZE + plen);
	return 0;
}

void emb__rdma_req_release(struct emb_req *req)
{
	struct emb_rdma_sreq *sr = (struct emb_rdma_sreq *)req;
	struct emb_rdma_conn *c = emb__rdma_conn_of(req->conn);

	if (sr->state != EMB_RDMA_SREQ_HELD)
		return;
	c->held--;
	c->base.stats.inflight = c->held;
	c->base.stats.rx_paused = false;
	emb__rdma_buf_put(c, &sr->big);
	if (c->state != EMB_RDMA_CONN_OPEN) {
		sr->state = EMB_RDMA_SREQ_IDLE;
		emb__rdma_conn_maybe_free(c);
		return;
	}
	sr->state = EMB_RDMA_SREQ_REPLYING;
	sr->op.kind = EMB_RDMA_OP_CREDIT;
	q_push(c, &sr->op, 0);
	q_run(c);
}

/* ---- client responses --------------------------------------------------- */

static void cli_recv(struct emb_rdma_conn *c, uint32_t slot,
		     const struct ibv_wc *wc)
{
	struct emb_rdma_transport *rt = c->rt;
	char *p = c->rx_mem + (size_t)slot * EMB_RDMA_SLOT_BYTES;
	struct emb_rdma_call *call = NULL;
	struct emb_rdma_prefix pfx;
	struct emb_frame_hdr hdr;
	uint32_t idx, plen;
	int rc, status = 0;

	if ((wc->wc_flags & IBV_WC_WITH_IMM) && wc->byte_len == 0) {
		uint32_t imm = ntohl(wc->imm_data);

		rc = post_recv(c, slot);
		if (rc) {
			emb__rdma_conn_fail(c, rc);
			return;
		}
		c->credits++;
		idx = imm & CALL_IDX_MASK;
		if (idx < rt->base.opts.max_inflight)
			call = &c->calls[idx];
		if (call && (uint32_t)call->req_id == imm && call->at_server) {
			call->at_server = false;
			if (call->state == EMB_RDMA_CALL_ZOMBIE)
				call_free(c, call);
		}
		return;
	}
	if (wc->byte_len < EMB_RDMA_MSG_HDRS) {
		emb__rdma_conn_fail(c, EMB_ETRUNCFRAME);
		return;
	}
	memcpy(&pfx, p, sizeof(pfx));
	memcpy(&hdr, p + EMB_RDMA_PREFIX_SIZE, sizeof(hdr));
	rc = emb__frame_check(&rt->base, &hdr);
	if (rc) {
		emb__rdma_conn_fail(c, rc);
		return;
	}
	plen = hdr.payload_len;
	idx = (uint32_t)(hdr.req_id & CALL_IDX_MASK);
	if (idx < rt->base.opts.max_inflight &&
	    c->calls[idx].req_id == hdr.req_id && c->calls[idx].at_server)
		call = &c->calls[idx];
	if (pfx.type == EMB_RDMA_MSG_RESP_INLINE &&
	    wc->byte_len != EMB_RDMA_MSG_HDRS + plen) {
		emb__rdma_conn_fail(c, EMB_EBADFRAME);
		return;
	}
	if (call && call->state == EMB_RDMA_CALL_POSTED) {
		switch (pfx.type) {
		case EMB_RDMA_MSG_RESP_INLINE:
			if (plen > call->resp_cap)
				status = EMB_ERESPTOOBIG;
			else if (plen)
				memcpy(call->resp_buf, p + EMB_RDMA_MSG_HDRS,
				       plen);
			break;
		case EMB_RDMA_MSG_RESP_WRITTEN:
			if (plen > call->resp_cap)
				status = EMB_ERESPTOOBIG;
			else if (call->bounce.addr)
				memcpy(call->resp_buf, call->bounce.addr, plen);
			break;
		case EMB_RDMA_MSG_RESP_TOOBIG:
			status = EMB_ERESPTOOBIG;
			break;
		default:
			emb__rdma_conn_fail(c, EMB_EBADFRAME);
			return;
		}
	}
	rc = post_recv(c, slot);
	if (rc) {
		emb__rdma_conn_fail(c, rc);
		return;
	}
	c->credits++;
	c->base.stats.frames_in++;
	c->base.stats.bytes_in += EMB_FRAME_HDR_SIZE + plen;
	EMB__STAT_ADD(rt->base.stats.frames_in, 1);
	EMB__STAT_ADD(rt->base.stats.bytes_in, EMB_FRAME_HDR_SIZE + plen);
	if (!call || call->state != EMB_RDMA_CALL_POSTED) {
		EMB__STAT_ADD(rt->base.stats.resp_unmatched, 1);
		if (call) {
			call->at_server = false;
			call_free(c, call);
		}
		return;
	}
	call->at_server = false;
	if (status == EMB_ERESPTOOBIG)
		EMB__STAT_ADD(rt->base.stats.resp_too_big, 1);
	call_finish(c, call, status, status ? NULL : &hdr);
}

/* ---- completions -------------------------------------------------------- */

/* Frees ring entries up to the completed seq; fires reply callbacks. */
static void sq_complete(struct emb_rdma_conn *c, uint32_t low, bool ok)
{
	uint32_t seq = c->sq_tail + ((low - c->sq_tail) & EMB_RDMA_SEQ_MASK);
	int status = ok ? 0 : (c->reason ? c->reason : EMB_ECLOSED);

	if ((int32_t)(seq - c->sq_head) >= 0)
		return; /* not a WR we posted: ignore */
	while ((int32_t)(c->sq_tail - seq) <= 0) {
		struct emb_rdma_swr *e =
			&c->ring[c->sq_tail++ & (EMB_RDMA_RING - 1)];
		emb_send_done_fn done = e->done;
		struct emb_rdma_sreq *rd = e->read;

		emb__rdma_buf_put(c, &e->buf);
		e->done = NULL;
		e->read = NULL;
		if (done)
			done(e->ctx, status);
		if (rd && ok && c->state == EMB_RDMA_CONN_OPEN &&
		    rd->state == EMB_RDMA_SREQ_READING)
			deliver(c, rd, rd->big.addr);
	}
}

static void wc_failed(struct emb_rdma_conn *c, const struct ibv_wc *wc)
{
	int reason = EMB_EQPERR;

	if (c->state == EMB_RDMA_CONN_DRAINING)
		return; /* flushed: expected after a close */
	if (wc->status == IBV_WC_RETRY_EXC_ERR ||
	    wc->status == IBV_WC_RNR_RETRY_EXC_ERR)
		reason = EMB_EPEERDEAD;
	c->wc_status = (uint8_t)wc->status;
	emb__rdma_conn_fail(c, reason);
}

static void wc_handle(struct emb_rdma_transport *rt, const struct ibv_wc *wc)
{
	uint32_t idx = (uint32_t)(wc->wr_id >> 32);
	uint32_t low = (uint32_t)wc->wr_id;
	uint32_t kind = low >> 30;
	struct emb_rdma_conn *c;

	if (idx >= rt->nconns)
		return;
	c = rt->conns[idx];
	if (!c || c->qpn != wc->qp_num)
		return; /* a CQE left by a QP already destroyed */
	c->busy++;
	switch (kind) {
	case EMB_RDMA_WR_DRAIN_SQ:
		c->sq_drained = true;
		break;
	case EMB_RDMA_WR_DRAIN_RQ:
		c->rq_drained = true;
		break;
	case EMB_RDMA_WR_RECV:
		if (wc->status != IBV_WC_SUCCESS)
			wc_failed(c, wc);
		else if (c->state == EMB_RDMA_CONN_OPEN ||
			 (c->state == EMB_RDMA_CONN_SETUP && c->base.server))
			(c->base.server ? srv_recv : cli_recv)(
				c, low & EMB_RDMA_SEQ_MASK, wc);
		break;
	default:
		if (wc->status != IBV_WC_SUCCESS)
			wc_failed(c, wc);
		sq_complete(c, low & EMB_RDMA_SEQ_MASK,
			    wc->status == IBV_WC_SUCCESS);
		break;
	}
	if (c->state == EMB_RDMA_CONN_OPEN)
		q_run(c);
	c->busy--;
	emb__rdma_conn_maybe_free(c);
}

int emb__rdma_poll_cq(struct emb_rdma_transport *rt, int budget)
{
	struct ibv_wc wc[32];
	int total = 0, n;

	while (total < budget) {
		n = ibv_poll_cq(rt->cq, 32, wc);
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++)
			wc_handle(rt, &wc[i]);
		total += n;
		if (n < 32)
			break;
	}
	return total;
}
