/*
 * src/server/reply.c - how a request ends: an error, an acknowledgement,
 * a whole frame, or an error after which the connection closes; and the
 * count of requests in flight that a graceful stop waits for.
 *
 * Loop thread of the request's connection, except emb__reply_sync_ack(),
 * which any thread may call (it posts the reply to the loop), and
 * emb__inflight(), which any thread may read.
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

#include "server/replybuf.h"


/* A reply whose frame sits whole in one malloc'd buffer. */
static void free_done(void *ctx, int status)
{
	(void)status;
	free(ctx);
}

/* An error reply after which the conn closes: auth failures, bad opcodes. */
struct close_ctx {
	struct emb_conn *c; /* closed once the reply is out */
	int reason;	    /* the reply's status, the close reason */
	_Alignas(8) uint8_t frame[EMB_WIRE_HDR_SIZE + 64]; /* the reply */
};

struct emb__rbuf_pool *emb__reply_pool(struct emb_server *s,
				       const struct emb_req *req)
{
	struct srv_conn *sc = emb_conn_user(emb_req_conn(req));

	return sc ? &s->rpools[sc->loop] : NULL;
}

static void close_done(void *ctx, int status)
{
	struct close_ctx *cc = ctx;

	/* status != 0: the conn already closed and may be gone. */
	if (status == 0)
		emb_conn_close(cc->c, cc->reason);
	free(cc);
}

void emb__req_end(struct emb_server *s)
{
	struct srv_loop *l = emb__this_loop(s);

	if (l)
		emb__loop_count(&l->inflight, -1);
	else
		__atomic_fetch_sub(&s->inflight, 1, __ATOMIC_RELEASE);
}

void emb__req_begin(struct emb_server *s)
{
	struct srv_loop *l = emb__this_loop(s);

	if (l)
		emb__loop_count(&l->inflight, 1);
	else
		__atomic_fetch_add(&s->inflight, 1, __ATOMIC_ACQUIRE);
}

int64_t emb__inflight(struct emb_server *s)
{
	int64_t n = __atomic_load_n(&s->inflight, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < s->opts.threads; i++)
		n += __atomic_load_n(&s->lstate[i].inflight, __ATOMIC_ACQUIRE);
	return n;
}

int emb__reply_frame(struct emb_server *s, struct emb_req *req, void *buf,
		     int len)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int rc;

	memcpy(&hdr, buf, sizeof(hdr));
	iov.iov_base = (char *)buf + EMB_WIRE_HDR_SIZE;
	iov.iov_len = (size_t)len - EMB_WIRE_HDR_SIZE;
	rc = emb_conn_reply(req, &hdr, &iov, iov.iov_len ? 1 : 0, free_done,
			    buf);
	if (rc)
		free(buf);
	emb__req_end(s);
	return rc;
}


int emb__reply_error(struct emb_server *s, struct emb_req *req, int status,
		     const char *msg)
{
	size_t cap = EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX;
	void *buf = malloc(cap);
	int len;

	emb__count(&s->errors, 1);
	if (!buf) {
		emb_req_release(req);
		emb__req_end(s);
		return 0;
	}
	len = emb_wire_error_echo_encode(buf, cap, &req->hdr,
					 req->hdr.table_id, status,
					 msg ? msg : emb_strerror(status));
	if (len < 0) {
		free(buf);
		emb_req_release(req);
		emb__req_end(s);
		return 0;
	}
	emb__reply_frame(s, req, buf, len);
	return 0;
}

int emb__reply_ack(struct emb_server *s, struct emb_req *req, uint32_t table_id,
		   uint32_t count)
{
	struct emb_frame_hdr hdr = {
	    .opcode = (uint8_t)(req->hdr.opcode | EMB_OP_RESPONSE_BIT),
	    .table_id = table_id,
	    .count = count,
	};

	emb_conn_reply(req, &hdr, NULL, 0, NULL, NULL);
	emb__req_end(s);
	return 0;
}

/* A held synchronous push, acknowledged on its connection's loop thread. */
struct ack_task {
	struct emb_server *s; /* owner */
	struct emb_req *req;  /* the STEP_END part */
	int status;	      /* 0: step applied */
};

static void ack_task_run(void *arg)
{
	struct ack_task *a = arg;

	if (a->status)
		emb__reply_error(a->s, a->req, a->status,
				 "synchronous step not applied");
	else
		emb__reply_ack(a->s, a->req, a->req->hdr.table_id, 0);
	free(a);
}

void emb__reply_sync_ack(void *arg, struct emb_req *req, int status)
{
	struct emb_server *s = arg;
	struct ack_task *a;

	/* After the loops stopped, this thread owns every conn. */
	if (__atomic_load_n(&s->loops_stopped, __ATOMIC_ACQUIRE)) {
		emb_req_release(req);
		emb__req_end(s);
		return;
	}
	a = malloc(sizeof(*a));
	if (a) {
		a->s = s;
		a->req = req;
		a->status = status;
		if (emb_transport_exec(emb_conn_loop(req->conn), ack_task_run,
				       a) == 0)
			return;
		free(a);
	}
	/* Cannot reach the loop: the client's call times out instead. */
	emb_log(EMB_LOG_ERROR, "%s: cannot acknowledge a synchronous push",
		emb_conn_peer(req->conn));
}

void emb__reply_and_close(struct emb_server *s, struct emb_conn *c,
			  struct srv_conn *sc, struct emb_req *req, int status,
			  const char *msg)
{
	struct close_ctx *cc = malloc(sizeof(*cc));
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len;

	emb__count(&s->errors, 1);
	sc->closing = true;
	len = cc ? emb_wire_error_echo_encode(cc->frame, sizeof(cc->frame),
					      &req->hdr, 0, status, msg)
		 : -ENOMEM;
	if (len < 0) {
		free(cc);
		emb_req_release(req);
		emb__req_end(s);
		emb_conn_close(c, status);
		return;
	}
	cc->c = c;
	cc->reason = status;
	memcpy(&hdr, cc->frame, sizeof(hdr));
	iov.iov_base = cc->frame + EMB_WIRE_HDR_SIZE;
	iov.iov_len = (size_t)len - EMB_WIRE_HDR_SIZE;
	if (emb_conn_reply(req, &hdr, &iov, 1, close_done, cc)) {
		free(cc);
		emb_conn_close(c, status);
	}
	emb__req_end(s);
}
