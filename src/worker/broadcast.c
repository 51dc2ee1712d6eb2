/*
 * src/worker/broadcast.c - one request to every server at once, waited
 * for: what table calls (table_admin.c) and monitoring (admin.c) are
 * built on. A server declared dead whose slots live on elsewhere is
 * skipped (its part says skip); with slots lost, the call fails.
 *
 * Threads: any.
 */
#include "worker/embstore.h"

#include <errno.h>

#include "proto/wire.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"

/* A whole number of 64-byte lines: aligned_alloc() needs a multiple. */
#define ADMIN_RESP_MAX                                                         \
	((EMB_WIRE_HDR_SIZE + 1024u * EMB_WIRE_LIST_ENTRY_SIZE + 63u) & ~63u)

/*
 * Sends the same request (opcode, payload) to every server, with table_ids[s]
 * (or 0) in the header, and waits. Returns the finished op, whose parts hold
 * each server's response, or NULL with *rc set. The caller frees the op.
 */
struct emb_async *emb__broadcast(struct emb_client *c, uint8_t opcode,
				   uint16_t flags, const uint32_t *table_ids,
				   const void *payload, size_t len, int *rc)
{
	struct emb_async *op = emb__op_new(c, OP_ADMIN);
	char *r;

	if (!op) {
		*rc = -ENOMEM;
		return NULL;
	}
	/* Registered too: a listing is larger than an inline response. */
	op->rbuf = emb__respbuf_get(c->bufs, (size_t)c->nsrv * ADMIN_RESP_MAX);
	if (emb__op_parts(op, c->nsrv) || !op->rbuf) {
		*rc = -ENOMEM;
		goto err;
	}
	r = op->rbuf->mem;
	for (uint32_t s = 0; s < c->nsrv; s++) {
		struct part *p = &op->parts[s];

		p->op = op;
		p->req.server = s;
		p->req.hdr.opcode = opcode;
		p->req.hdr.flags = flags;
		p->req.hdr.table_id = table_ids ? table_ids[s] : 0;
		p->req.iov[0] = (struct iovec){(void *)payload, len};
		p->req.niov = len ? 1 : 0;
		p->req.resp = r + (size_t)s * ADMIN_RESP_MAX;
		p->req.resp_cap = ADMIN_RESP_MAX;
	}
	op->nparts = c->nsrv;
	*rc = emb__op_post(op);
	if (*rc)
		goto err;
	emb__op_wait_done(op);
	*rc = op->status;
	return op;
err:
	emb__op_free(op);
	return NULL;
}

struct emb_wire_frame emb__part_frame(const struct part *p,
					const struct emb_wire_limits *lim)
{
	struct emb_wire_frame f = {
	    .hdr = p->req.rhdr, .payload = p->req.resp, .lim = lim};

	return f;
}

int emb__client_admin_each(struct emb_client *c, uint8_t opcode,
			   int (*fn)(void *arg, uint32_t server,
				     const struct emb_wire_frame *f),
			   void *arg, int *err)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_async *op;
	uint32_t answered = 0;
	int rc, first = 0;

	lim.max_tables = 65536;
	op = emb__broadcast(c, opcode, 0, NULL, NULL, 0, &rc);
	if (!op)
		return rc;
	rc = 0;
	for (uint32_t s = 0; s < c->nsrv && !rc; s++) {
		const struct part *p = &op->parts[s];
		struct emb_wire_frame f = emb__part_frame(p, &lim);

		err[s] = p->rep.skip ? 0 : p->req.status;
		if (p->rep.skip)
			continue;
		if (err[s]) {
			first = first ? first : err[s];
			continue;
		}
		answered++;
		rc = fn(arg, s, &f);
	}
	emb__op_free(op);
	if (rc)
		return rc;
	return answered || !first ? 0 : first;
}

int emb__client_admin(struct emb_client *c, uint8_t opcode,
		      int (*fn)(void *arg, uint32_t server,
				const struct emb_wire_frame *f),
		      void *arg)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_async *op;
	int rc;

	lim.max_tables = 65536;
	op = emb__broadcast(c, opcode, 0, NULL, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < c->nsrv && !rc; s++) {
		struct emb_wire_frame f = emb__part_frame(&op->parts[s], &lim);

		if (!op->parts[s].rep.skip)
			rc = fn(arg, s, &f);
	}
	emb__op_free(op);
	return rc;
}

