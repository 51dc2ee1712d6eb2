/*
 * src/server/conn.c - the event loops, their connections and dispatch.
 *
 * Each connection belongs to one event loop thread (the transport spreads
 * them), and every request is handled to completion on that thread:
 * dispatch checks what the connection may send (before its HELLO, at most
 * EMB_SERVER_LOGIN_FRAME bytes; admin opcodes need admin rights), then
 * handlers.c decodes, calls the store and replies. A write that arrives
 * while a zero-copy PULL reply of the same connection is still on the wire
 * waits, with everything behind it, so a client sees its requests take
 * effect in the order it sent them. Each loop times its requests with one
 * clock read per request (loop_clock). Everything here runs on the
 * connection's loop thread, except emb__loop_stop().
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#include "server/dump.h"
#include "server/lat.h"
#include "server/memreg.h"

/*
 * Where the transport cannot refuse a conn itself (RDMA), conns past
 * max_conns are kept to tell them why on their first request; beyond this
 * many more, they close at once.
 */
#define REFUSE_SLACK 64u

static int dispatch(void *arg, struct emb_conn *c, struct emb_req *req,
		    const struct emb_frame_hdr *hdr, void *payload)
{
	struct emb_server *s = arg;
	struct srv_conn *sc = emb_conn_user(c);
	struct emb_wire_frame f = {
	    .hdr = *hdr,
	    .payload = payload,
	    .lim = &s->opts.limits,
	};

	emb__req_begin(s);
	if (emb__this_loop(s))
		emb__loop_count(&emb__this_loop(s)->requests, 1);
	else
		emb__count(&s->requests, 1);
	if (!sc || sc->closing) {
		emb_req_release(req);
		emb__req_end(s);
		return 0;
	}
	if (sc->refused) {
		emb__reply_and_close(
		    s, c, sc, req, EMB_ETOOMANYCONNS,
		    "server full (--max-conns); retry later");
		return 0;
	}
	/* The TCP transport enforces this before buffering; RDMA receives
	 * into fixed buffers, so only the check here applies to it. */
	if (!sc->hello && EMB_WIRE_HDR_SIZE + (uint64_t)hdr->payload_len >
			      EMB_SERVER_LOGIN_FRAME) {
		emb__reply_and_close(s, c, sc, req, EMB_ETOOBIG,
				     "frame too large before HELLO");
		return 0;
	}
	if (hdr->opcode & EMB_OP_RESPONSE_BIT)
		return emb__reply_error(s, req, EMB_EBADFRAME,
					"a response sent to the server");
	/* The transport checks framing only; a number that is no opcode
	 * means a peer that does not speak this protocol (docs/protocol.md). */
	if (!emb_wire_op_known(hdr->opcode)) {
		emb__reply_and_close(s, c, sc, req, EMB_EBADOP,
				     "unknown opcode");
		return 0;
	}
	if (hdr->opcode != EMB_OP_HELLO && !sc->hello)
		return emb__reply_error(s, req, EMB_ENOHELLO, NULL);
	/* Admin rights: what changes a table for everyone else. */
	if ((hdr->opcode == EMB_OP_SET_MODE ||
	     hdr->opcode == EMB_OP_SET_LIFECYCLE ||
	     hdr->opcode == EMB_OP_DROP_TABLE) &&
	    !sc->admin) {
		emb__count(&s->not_admin, 1);
		emb_log(EMB_LOG_WARN, "%s: %s refused: not admin",
			emb_conn_peer(c), emb_wire_op_name(hdr->opcode));
		return emb__reply_error(s, req, EMB_ENOADMIN,
					"this operation needs the admin token "
					"(HELLO with EMB_F_ADMIN)");
	}
	return emb__handle(s, c, sc, req, &f);
}

/*
 * The loop's one clock read per request: it starts the request about to
 * run, and ends the one before, whose latency it records. Requests of a
 * loop run one after the other, so the next one's start is the last
 * one's end; after the last request of a wake-up, emb__loop_main() reads the
 * clock to end it. In ns.
 */
static uint64_t loop_clock(struct srv_loop *l)
{
	uint64_t now = emb_clock_ns();

	if (l->lat_open) {
		emb_lat_record(
		    &l->s->lat[(size_t)l->index * EMB_LAT_NOPS + l->lat_op],
		    now - l->lat_t0);
		l->lat_open = false;
	}
	return now;
}

/* A clock read for a request arriving now: on a loop, loop_clock(). */
static uint64_t request_clock(struct emb_server *s)
{
	struct srv_loop *l = emb__this_loop(s);

	return l ? loop_clock(l) : emb_clock_ns();
}

/*
 * dispatch(), then records the time from arrival (t0_ns) to the reply
 * being posted in the loop's own histogram (lat.h): on the loop, at
 * its next clock read. A synchronous push held for its step counts until
 * it is held.
 */
static void dispatch_timed(struct emb_server *s, struct emb_conn *c,
			   struct emb_req *req, const struct emb_frame_hdr *hdr,
			   void *payload, uint64_t t0_ns)
{
	struct srv_conn *sc = emb_conn_user(c);
	struct srv_loop *l = emb__this_loop(s);
	uint32_t op = emb_lat_op_of(hdr->opcode);
	uint32_t loop = sc ? sc->loop : UINT32_MAX;

	/* A held request run from a reply's completion: the request that
	 * ran before it ends here. */
	if (l && l->lat_open)
		(void)loop_clock(l);
	(void)dispatch(s, c, req, hdr, payload);
	if (loop == UINT32_MAX)
		return;
	if (l && l->index == loop) {
		l->lat_t0 = t0_ns;
		l->lat_op = op;
		l->lat_open = true;
		return;
	}
	emb_lat_record(&s->lat[(size_t)loop * EMB_LAT_NOPS + op],
		       emb_clock_ns() - t0_ns);
}

/* Requests that change rows a queued PULL reply may still be reading
 * (a PUSH_MANY is PUSHes). */
static bool writes_rows(uint8_t op)
{
	return op == EMB_OP_PUSH || op == EMB_OP_PUSH_MANY ||
	       op == EMB_OP_ASSIGN || op == EMB_OP_ERASE ||
	       op == EMB_OP_DROP_TABLE;
}

void emb__conn_drain(struct srv_conn *sc)
{
	while (sc->held && sc->c) {
		struct held *h = sc->held;

		if (writes_rows(h->req->hdr.opcode) && sc->zc_replies)
			return;
		sc->held = h->next;
		if (!sc->held)
			sc->held_tail = NULL;
		emb__req_end(sc->s); /* dispatch() counts it again */
		dispatch_timed(sc->s, sc->c, h->req, &h->req->hdr,
			       h->req->payload, h->t0_ns);
		free(h);
	}
}

static void conn_release_held(struct srv_conn *sc)
{
	while (sc->held) {
		struct held *h = sc->held;

		sc->held = h->next;
		emb_req_release(h->req);
		emb__req_end(sc->s);
		free(h);
	}
	sc->held_tail = NULL;
}

/*
 * PULL replies are sent straight from table memory, so a PUSH on the same
 * connection that arrives while one is still on the wire would change rows
 * under it. Such writes wait until the connection's PULL replies are out,
 * and everything after a waiting request waits behind it: a client sees
 * its own requests take effect in the order it sent them.
 */
void emb__conn_on_request(void *arg, struct emb_conn *c, struct emb_req *req,
			  const struct emb_frame_hdr *hdr, void *payload)
{
	struct srv_conn *sc = emb_conn_user(c);
	uint64_t t0_ns = request_clock(arg);
	struct held *h;

	if (sc)
		sc->last_ns = t0_ns;
	if (sc && (sc->held || (sc->zc_replies && writes_rows(hdr->opcode)))) {
		h = malloc(sizeof(*h));
		if (h) {
			h->req = req;
			h->next = NULL;
			h->t0_ns = t0_ns;
			if (sc->held_tail)
				sc->held_tail->next = h;
			else
				sc->held = h;
			sc->held_tail = h;
			/* Counted as in flight, so a graceful stop waits. */
			emb__req_begin(sc->s);
			return;
		}
		emb_log(EMB_LOG_ERROR, "%s: out of memory, closing",
			emb_conn_peer(c));
		emb_req_release(req);
		emb_conn_close(c, -ENOMEM);
		return;
	}
	dispatch_timed(arg, c, req, hdr, payload, t0_ns);
}

void emb__conn_on_open(void *arg, struct emb_conn *c, int reason)
{
	struct emb_server *s = arg;
	struct srv_conn *sc;
	uint64_t open;

	(void)reason;
	sc = calloc(1, sizeof(*sc));
	if (!sc) {
		emb_log(EMB_LOG_ERROR, "%s: out of memory, closing",
			emb_conn_peer(c));
		if (emb_conn_refuse(c, -ENOMEM, "server out of memory"))
			emb_conn_close(c, -ENOMEM);
		return;
	}
	sc->s = s;
	sc->c = c;
	sc->opened_ns = sc->last_ns = emb_clock_ns();
	while (sc->loop + 1 < s->opts.threads &&
	       s->loops[sc->loop] != emb_conn_loop(c))
		sc->loop++;
	emb_conn_set_user(c, sc);
	sc->next = s->loop_conns[sc->loop];
	if (sc->next)
		sc->next->prev = sc;
	s->loop_conns[sc->loop] = sc;
	open = __atomic_add_fetch(&s->conns_open, 1, __ATOMIC_RELAXED);
	emb__count(&s->conns_total, 1);
	/* Debug, as its close: every worker connects to every server, so a
	 * job of W workers logs W lines per server (a thousand-node job's
	 * servers would write 90,000 lines while it forms). */
	emb_log(EMB_LOG_DEBUG, "connection from %s (%s)", emb_conn_peer(c),
		emb_conn_transport(c));
	if (s->opts.max_conns && open > s->opts.max_conns) {
		char msg[96];

		/* Its first request (a HELLO) gets the reason, from the
		 * transport where it can (no buffer held meanwhile), else
		 * from dispatch(); past the slack there, a flood of conns
		 * that send nothing closes at once. */
		emb__count(&s->conns_refused, 1);
		sc->refused = true;
		emb_log(EMB_LOG_WARN, "%s: refused: %u connections open",
			emb_conn_peer(c), s->opts.max_conns);
		snprintf(msg, sizeof(msg),
			 "server full: %u connections (--max-conns); retry "
			 "later",
			 s->opts.max_conns);
		if (emb_conn_refuse(c, EMB_ETOOMANYCONNS, msg) &&
		    open > s->opts.max_conns + REFUSE_SLACK)
			emb_conn_close(c, EMB_ETOOMANYCONNS);
	}
}

void emb__conn_on_close(void *arg, struct emb_conn *c, int reason)
{
	struct emb_server *s = arg;
	struct srv_conn *sc = emb_conn_user(c);

	if (!sc)
		return;
	emb_conn_set_user(c, NULL);
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->loop_conns[sc->loop] = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	emb__server_dump_free(sc->dump);
	conn_release_held(sc);
	emb__tables_drop_conn(s, c);
	sc->c = NULL;
	/* A PULL reply still out frees it when it completes. */
	if (!sc->zc_replies)
		free(sc);
	__atomic_fetch_sub(&s->conns_open, 1, __ATOMIC_RELAXED);
	if (reason && reason != EMB_EPEERDEAD)
		emb_log(EMB_LOG_WARN, "connection from %s closed: %s",
			emb_conn_peer(c), emb_strerror(reason));
	else
		emb_log(EMB_LOG_DEBUG, "connection from %s closed",
			emb_conn_peer(c));
}

void *emb__loop_main(void *arg)
{
	struct srv_loop *l = arg;
	struct emb_transport *tr = l->s->loops[l->index];
	int rc;

	emb__cur_loop = l;
	emb__memreg_set_thread_loop(tr);
	/* emb_transport_run(), but the last request of each wake-up gets
	 * its end read here (loop_clock). */
	while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
		rc = emb_transport_poll(tr, -1);
		if (l->lat_open)
			(void)loop_clock(l);
		if (rc < 0 && rc != -EINTR) {
			emb_log(EMB_LOG_ERROR, "event loop failed: %s",
				emb_strerror(rc));
			break;
		}
	}
	return NULL;
}

void emb__loop_stop(struct emb_server *s, uint32_t i)
{
	__atomic_store_n(&s->lstate[i].stop, true, __ATOMIC_RELEASE);
	emb_transport_wake(s->loops[i]);
}
