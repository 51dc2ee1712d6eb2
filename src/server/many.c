/*
 * src/server/many.c - PULL_MANY and PUSH_MANY: the PULLs (PUSHes) of
 * several tables in one frame (proto/wire_many.h), answered in one reply.
 *
 * Each sub-request is a PULL checked by the PULL decoder and served as a
 * PULL over TCP is (the rows copied under the shard locks, admission
 * applied, NOCREATE's bitmap), its answer a whole PULL response or error
 * frame in the reply, so that a sub-request that fails (an unknown table,
 * too many ids) fails alone. Rows are always copied here, on RDMA too: a
 * reply gathered from table memory would need one iovec per row of every
 * table. Pulls take no slot fence, and need no rights beyond HELLO, as
 * PULL; the tables' own counters count each sub-request as one pull.
 *
 * Each PUSH_MANY sub-request goes through what a PUSH goes through
 * (emb__push_one(): slot fences, the session's exactly-once claim, the
 * mode, the non-finite check), its answer an acknowledgement or an error
 * frame of its own, so that a refused part (EMOVING, non-finite) fails
 * alone while the others are applied, as separate PUSHes would be. A
 * synchronous table's push would be held until its step is applied, which
 * a bundle's one reply cannot wait for: it is refused with EMB_ENOBUNDLE,
 * untouched, and the client sends it again as a PUSH of its own.
 *
 * Threads: the request's loop thread.
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/wire_many.h"
#include "server/replybuf.h"
#include "server/slots.h"
#include "store/store.h"

/* Bytes kept for a sub-request's error frame: header, length, message. */
#define ERR_FRAME EMB_WIRE_MANY_ERR_SIZE
_Static_assert(EMB_WIRE_HDR_SIZE + 4 + 160 <= ERR_FRAME,
	       "sub_error()'s longest message fits");

/* One sub-request between the sizing pass and the filling pass. */
struct sub {
	struct emb_wire_pull_req p;
	struct srv_table *st; /* pinned, or NULL */
	int rc;		      /* its error, else 0 */
	uint64_t size;	      /* bytes kept for its answer */
};

static void many_done(void *ctx, int status)
{
	(void)status;
	emb__rbuf_put(ctx);
}

/* Sends the n answers in buf[0..len), a buffer of the reply pool, as op's
 * reply; the buffer goes back to its pool once sent. */
static int reply(struct emb_server *s, struct emb_req *req, uint8_t op,
		 uint32_t n, uint8_t *buf, uint64_t len)
{
	struct emb_frame_hdr hdr = {0};
	struct iovec iov = {.iov_base = buf, .iov_len = len};

	hdr.opcode = op | EMB_OP_RESPONSE_BIT;
	hdr.count = n;
	if (emb_conn_reply(req, &hdr, &iov, 1, many_done, buf))
		emb__rbuf_put(buf);
	emb__req_end(s);
	return 0;
}

/* Checks sub-request f and pins its table; *u says what it needs. */
static void sub_size(struct emb_server *s, const struct emb_wire_frame *f,
		     struct sub *u)
{
	uint64_t rows;

	u->st = NULL;
	u->rc = emb_wire_pull_req_decode(f, &u->p);
	/* Whole rows come from table memory only: not in PULL_MANY. */
	if (!u->rc && u->p.with_state)
		u->rc = EMB_EBADARG;
	if (!u->rc) {
		const char *why;

		u->rc = emb__slots_read(s->slots, u->p.ids, u->p.n, &why);
	}
	if (!u->rc) {
		u->st = emb__tables_pin(s, u->p.table_id);
		if (!u->st)
			u->rc = EMB_ENOTABLE;
	}
	u->size = ERR_FRAME;
	if (u->rc)
		return;
	rows = (uint64_t)u->p.n * u->st->spec.dim * sizeof(float);
	rows += u->p.nocreate ? emb_wire_bitmap_bytes(u->p.n) : 0;
	/* Over 4 GiB: more than any frame, refused whole below. */
	u->size =
	    rows > UINT32_MAX ? rows : emb_wire_many_sub_size((uint32_t)rows);
	if (u->size < ERR_FRAME)
		u->size = ERR_FRAME;
}

/*
 * An error answer of opcode op for sub-request i at p (ERR_FRAME bytes of
 * room), padded to the next sub-frame; its size. A message too long for
 * ERR_FRAME goes as the code alone.
 */
static uint64_t put_error(uint8_t *p, uint8_t op, uint32_t i,
			  uint32_t table_id, int rc, const char *msg)
{
	int len = emb_wire_error_encode(p, ERR_FRAME, op, i, table_id, rc, msg);
	uint64_t size;

	if (len < 0)
		len = emb_wire_error_encode(p, ERR_FRAME, op, i, table_id, rc,
					    NULL);
	size = emb_wire_many_sub_size((uint32_t)len - EMB_WIRE_HDR_SIZE);
	memset(p + len, 0, size - (uint64_t)len);
	return size;
}

/* A PULL sub-request's error answer at p. */
static uint64_t sub_error(uint8_t *p, uint32_t i, const struct sub *u,
			  uint32_t table_id)
{
	char msg[160];

	if (u->rc == EMB_ENOTABLE)
		snprintf(msg, sizeof(msg), "no table of id %u on this server",
			 table_id);
	else if (u->rc == EMB_EBADARG)
		snprintf(msg, sizeof(msg), "%s",
			 "PULL_MANY takes no WITH_STATE pull");
	else
		snprintf(msg, sizeof(msg), "%s", emb_strerror(u->rc));
	return put_error(p, EMB_OP_PULL, i, table_id, u->rc, msg);
}

/* Sub-request i's rows at p (u->size bytes of room), or its error. */
static uint64_t sub_fill(uint8_t *p, uint32_t i, struct sub *u, uint8_t *found)
{
	const uint32_t dim = u->st->spec.dim;
	const uint64_t bitmap =
	    u->p.nocreate ? emb_wire_bitmap_bytes(u->p.n) : 0;
	const uint64_t rows = (uint64_t)u->p.n * dim * sizeof(float);
	struct emb_frame_hdr hdr = {0};
	int rc;

	rc = emb_table_pull(u->st->t, u->p.ids, u->p.n,
			    (float *)(void *)(p + EMB_WIRE_HDR_SIZE + bitmap),
			    u->p.nocreate ? EMB_PULL_NOCREATE : 0,
			    u->p.nocreate ? found : NULL);
	if (rc < 0) {
		u->rc = rc;
		return sub_error(p, i, u, u->p.table_id);
	}
	if (u->p.nocreate)
		emb_wire_found_pack(found, u->p.n, p + EMB_WIRE_HDR_SIZE);
	hdr.magic = EMB_WIRE_MAGIC;
	hdr.version = EMB_WIRE_VERSION;
	hdr.opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	hdr.flags = u->p.nocreate ? EMB_F_NOCREATE : 0;
	hdr.req_id = i;
	hdr.table_id = u->p.table_id;
	hdr.count = u->p.n;
	hdr.payload_len = (uint32_t)(bitmap + rows);
	emb_wire_hdr_encode(p, &hdr);
	/* An odd count of floats leaves 4 bytes to the next sub-frame. */
	memset(p + EMB_WIRE_HDR_SIZE + hdr.payload_len, 0,
	       emb_wire_many_sub_size(hdr.payload_len) - EMB_WIRE_HDR_SIZE -
		   hdr.payload_len);
	return emb_wire_many_sub_size(hdr.payload_len);
}

int emb__on_pull_many(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_frame *f)
{
	struct emb_wire_frame subs[EMB_WIRE_MANY_MAX];
	struct sub u[EMB_WIRE_MANY_MAX];
	const uint32_t max_frame = s->opts.limits.max_frame_bytes;
	uint64_t total = 0, off = 0;
	uint32_t max_n = 0;
	uint8_t *buf = NULL, *found = NULL;
	int n, rc = 0;

	n = emb_wire_many_decode(f, subs, EMB_WIRE_MANY_MAX);
	if (n < 0)
		return emb__reply_error(s, req, n, "malformed PULL_MANY");
	for (int i = 0; i < n; i++) {
		sub_size(s, &subs[i], &u[i]);
		total += u[i].size;
		if (!u[i].rc && u[i].p.nocreate && u[i].p.n > max_n)
			max_n = u[i].p.n;
	}
	/* Clients size each frame to fit both ways (docs/protocol.md). */
	if (EMB_WIRE_HDR_SIZE + total > max_frame) {
		char msg[160];

		snprintf(msg, sizeof(msg),
			 "PULL_MANY reply of %llu bytes over the frame limit "
			 "of %u",
			 (unsigned long long)(EMB_WIRE_HDR_SIZE + total),
			 max_frame);
		rc = emb__reply_error(s, req, EMB_ETOOBIG, msg);
		goto unpin;
	}
	buf = emb__rbuf_get(emb__reply_pool(s, req), total + max_n + 1);
	if (!buf) {
		rc = emb__reply_error(s, req, -ENOMEM, NULL);
		goto unpin;
	}
	found = buf + total;
	for (int i = 0; i < n; i++) {
		off += u[i].rc ? sub_error(buf + off, (uint32_t)i, &u[i],
					   subs[i].hdr.table_id)
			       : sub_fill(buf + off, (uint32_t)i, &u[i], found);
		if (u[i].st)
			emb__tables_unpin(u[i].st);
		u[i].st = NULL;
	}
	return reply(s, req, EMB_OP_PULL_MANY, (uint32_t)n, buf, off);

unpin:
	for (int i = 0; i < n; i++)
		if (u[i].st)
			emb__tables_unpin(u[i].st);
	return rc;
}

/* Sub-request i's answer at p (ERR_FRAME bytes of room): ack or error. */
static uint64_t push_answer(uint8_t *p, uint32_t i,
			    const struct emb_frame_hdr *h, int rc,
			    const char *msg)
{
	struct emb_frame_hdr a = {0};

	if (rc < 0)
		return put_error(p, EMB_OP_PUSH, i, h->table_id, rc,
				 msg[0] ? msg : NULL);
	a.magic = EMB_WIRE_MAGIC;
	a.version = EMB_WIRE_VERSION;
	a.opcode = EMB_OP_PUSH | EMB_OP_RESPONSE_BIT;
	a.req_id = i;
	a.table_id = h->table_id;
	emb_wire_hdr_encode(p, &a);
	return EMB_WIRE_HDR_SIZE;
}

int emb__on_push_many(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_frame *f)
{
	struct emb_wire_frame subs[EMB_WIRE_MANY_MAX];
	const uint32_t max_frame = s->opts.limits.max_frame_bytes;
	char msg[EMB_NAME_MAX + 160];
	uint64_t off = 0;
	uint8_t *buf;
	int n;

	n = emb_wire_many_decode(f, subs, EMB_WIRE_MANY_MAX);
	if (n < 0)
		return emb__reply_error(s, req, n, "malformed PUSH_MANY");
	/* Checked before any sub-request is applied: all or none go. */
	if (EMB_WIRE_HDR_SIZE + (uint64_t)n * ERR_FRAME > max_frame) {
		snprintf(msg, sizeof(msg),
			 "PUSH_MANY of %d pushes: its reply may exceed the "
			 "frame limit of %u",
			 n, max_frame);
		return emb__reply_error(s, req, EMB_ETOOBIG, msg);
	}
	buf = emb__rbuf_get(emb__reply_pool(s, req), (size_t)n * ERR_FRAME);
	if (!buf)
		return emb__reply_error(s, req, -ENOMEM, NULL);
	for (int i = 0; i < n; i++) {
		int rc = emb__push_one(s, NULL, &subs[i], msg, sizeof(msg));

		off +=
		    push_answer(buf + off, (uint32_t)i, &subs[i].hdr, rc, msg);
	}
	return reply(s, req, EMB_OP_PUSH_MANY, (uint32_t)n, buf, off);
}
