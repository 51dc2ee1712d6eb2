/*
 * src/worker/conn.c - the client's servers and their connections: the
 * first connect and HELLO of each, the loop thread that runs every
 * completion, and reconnects with backoff. A part posted to a server that
 * is down waits on it; a part whose conn broke (closed, reset, timed out)
 * waits for the next conn and is sent again, until its op's deadline
 * passes. A newcomer on a dead rank first learns the ids of the open
 * tables (a CREATE of each). One-sided clients keep a second, read conn
 * to each RDMA server (docs/rdma.md), reopened here too.
 *
 * Parts are sent and ended through c->fns (op.c), which this file never
 * calls directly.
 *
 * Threads: the creating thread until the loop starts
 * (emb__conn_connect_all()), then the loop thread alone.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"
#include "cluster/hello.h"

#define BACKOFF_MIN_MS 10u  /* wait after the first failed reconnect */
#define BACKOFF_MAX_MS 500u /* longest wait between reconnects */
/* Longest connect attempt: a connect blocks the loop thread, and with it
 * every other server's calls and every deadline, so a server whose SYNs
 * vanish (a cut link) must not hold it long; a reachable server answers
 * a connect in well under a millisecond, and a miss is tried again. */
#define CONNECT_MAX_MS 1000u
#define TIMEOUT_LOG_MS 1000u /* at most one timeout logged per server */
/* First pause after a first connect that timed out, and the longest. */
#define CONNECT_PAUSE_MS     50u
#define CONNECT_PAUSE_MAX_MS 1000u
#define CONNECT_FIRST_MS     30000u /* retries end, without a deadline */

static void server_up(struct emb_client *c, struct server *s);
static void tables_next(struct emb_client *c, struct server *s);

/* Codes that mean the connection broke, not that the request was wrong. */
static bool conn_lost(int status)
{
	switch (status) {
	case EMB_EPEERDEAD:
	case EMB_ECLOSED:
	case EMB_EQPERR:
	case -ETIMEDOUT:
	case -ECONNRESET:
	case -ECONNREFUSED:
	case -ECONNABORTED:
	case -EPIPE:
	case -EIO:
	case -ENETUNREACH:
	case -EHOSTUNREACH:
		return true;
	default:
		return false;
	}
}

/* Loop thread: the next reconnect of s, after a loss or a failed try. */
static void schedule_retry(struct server *s)
{
	s->retry_ms = emb_clock_ms() + s->backoff_ms;
	s->backoff_ms = s->backoff_ms ? 2 * s->backoff_ms : BACKOFF_MIN_MS;
	if (s->backoff_ms > BACKOFF_MAX_MS)
		s->backoff_ms = BACKOFF_MAX_MS;
}

/*
 * Loop thread: drops s's conn; calls still on it come back with EMB_ECLOSED
 * and wait for the next one. A no-op when s has none.
 */
static void server_lost(struct server *s, int reason)
{
	struct emb_conn *conn = s->conn;

	if (!conn)
		return;
	s->conn = NULL;
	s->state = SRV_DOWN;
	s->last_err = reason;
	if (!stopping(s->c))
		emb_log(EMB_LOG_WARN, "server %s:%u: connection lost: %s",
			s->host, s->port, emb_strerror(reason));
	schedule_retry(s);
	emb_conn_destroy(conn);
}

void emb__conn_fly_add(struct server *s, struct part *p)
{
	p->retry.fprev = NULL;
	p->retry.fnext = s->fly;
	if (s->fly)
		s->fly->retry.fprev = p;
	s->fly = p;
	p->retry.flying = true;
	p->rep.asked = true;
	if (p->op->deadline_ms < s->fly_check_ms)
		s->fly_check_ms = p->op->deadline_ms;
}

void emb__conn_fly_del(struct server *s, struct part *p)
{
	if (!p->retry.flying)
		return;
	if (p->retry.fprev)
		p->retry.fprev->retry.fnext = p->retry.fnext;
	else
		s->fly = p->retry.fnext;
	if (p->retry.fnext)
		p->retry.fnext->retry.fprev = p->retry.fprev;
	p->retry.flying = false;
}

int emb__conn_timeout(struct emb_client *c, const struct part *p, int why)
{
	struct server *s = &c->srv[p->req.server];
	uint64_t now = emb_clock_ms();
	/* A server that refused or dropped the connection is down, and
	 * says so; one that said nothing (a cut link, a frozen process, a
	 * conn this client closed) or only refused writes for a fill timed
	 * out. */
	int rc = conn_lost(why) && why != -ETIMEDOUT && why != EMB_ECLOSED
		     ? why
		     : -ETIMEDOUT;
	bool show = why && why != -ETIMEDOUT;

	pthread_mutex_lock(&c->err_lock);
	c->last_status = rc;
	snprintf(c->last_msg, sizeof(c->last_msg),
		 "server %s:%u (rank %u): no answer within the call's %u ms "
		 "deadline%s%s",
		 s->host, s->port, p->req.server, c->timeout_ms,
		 show ? ": last " : "", show ? emb_strerror(why) : "");
	if (now >= s->timeout_log_ms) {
		s->timeout_log_ms = now + TIMEOUT_LOG_MS;
		emb_log(EMB_LOG_WARN, "%s", c->last_msg);
	}
	pthread_mutex_unlock(&c->err_lock);
	return rc;
}

static void part_wait(struct server *s, struct part *p)
{
	p->retry.wnext = NULL;
	if (s->wait_tail)
		s->wait_tail->retry.wnext = p;
	else
		s->wait_head = p;
	s->wait_tail = p;
}

/* Loop thread: ends every part waiting on s with status. */
void emb__conn_fail_waiting(struct server *s, int status)
{
	struct part *p = s->wait_head;

	s->wait_head = s->wait_tail = NULL;
	while (p) {
		struct part *next = p->retry.wnext;

		s->c->fns->end(p, status, NULL);
		p = next;
	}
}

static void part_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct part *p = ctx;
	struct emb_client *c = p->op->c;
	struct server *s = &c->srv[p->req.server];

	emb__conn_fly_del(s, p);
	/* Answered: the server decided this attempt (a refusal applied
	 * nothing). Lost with the conn, it may have applied it. */
	if (!status)
		p->rep.asked = false;
	if (status)
		p->op->tainted = true;
	/* A dead server's broken conn is its death, whichever came first:
	 * replicated calls go on without it (op.c). */
	if (status && conn_lost(status) && srv_dead(s))
		status = EMB_ENODEAD;
	if (status && conn_lost(status) && !srv_dead(s)) {
		/* A timeout as much as a reset: the next call gets a new
		 * conn rather than one with a stuck request on it. */
		server_lost(s, status);
		/* Again on the next conn while the op's deadline allows, but
		 * never a push to a synchronous table (the server may still
		 * hold it for its step). The deadline is the op's, not the
		 * attempt's: a retry does not start the clock again. */
		if (!stopping(c) && !p->req.once &&
		    emb_clock_ms() < p->op->deadline_ms) {
			add(&c->retries, 1);
			part_wait(s, p);
			return;
		}
		if (!stopping(c) && emb_clock_ms() >= p->op->deadline_ms)
			status = emb__conn_timeout(c, p, status);
	}
	c->fns->end(p, status, resp);
}

void emb__conn_part_done(struct part *p, int status,
			 const struct emb_frame_hdr *resp)
{
	part_done(p, status, resp);
}

void emb__conn_session_prep(const struct server *s, struct part *p)
{
	if (!p->req.seq)
		return;
	/* Decided per send: a server restarted as an older version may not
	 * take sessions. */
	p->req.hdr.flags = (uint16_t)((p->req.hdr.flags & ~EMB_F_SESSION) |
				      (s->sessions ? EMB_F_SESSION : 0));
	p->req.iov[0].iov_len = s->sessions ? EMB_WIRE_PUSH_SESSION_PREFIX_SIZE
					    : EMB_WIRE_PUSH_PREFIX_SIZE;
}

void emb__conn_post(struct emb_client *c, struct part *p)
{
	struct server *s = &c->srv[p->req.server];
	int rc;

	if (s->state != SRV_UP) {
		part_wait(s, p);
		return;
	}
	emb__conn_session_prep(s, p);
	add(&c->requests, 1);
	/* In the fly list before the call: a transport may complete it at
	 * once. */
	emb__conn_fly_add(s, p);
	rc = emb_conn_call(s->conn, &p->req.hdr, p->req.iov, p->req.niov,
			   p->req.resp, p->req.resp_cap, part_done, p);
	if (rc) {
		p->rep.asked = false; /* refused before it was sent */
		part_done(p, rc, NULL);
	}
}

/* Loop thread: drops s's read conn; READs and LOCATEs on it fail (and fall
 * back), and locations learnt through it are stale from now on. */
void emb__rconn_lost(struct server *s, int reason)
{
	struct emb_conn *conn = s->rconn;

	if (!conn)
		return;
	s->rconn = NULL;
	s->rstate = RD_DOWN;
	s->rgen++;
	if (reason != EMB_ECLOSED)
		add(&s->c->rconn_losses, 1);
	if (!stopping(s->c))
		emb_log(EMB_LOG_INFO,
			"server %s:%u: read connection lost (%s): "
			"pulls go two-sided until it is back",
			s->host, s->port, emb_strerror(reason));
	s->rretry_ms = emb_clock_ms() + s->rbackoff_ms;
	s->rbackoff_ms = s->rbackoff_ms ? 2 * s->rbackoff_ms : BACKOFF_MIN_MS;
	if (s->rbackoff_ms > BACKOFF_MAX_MS)
		s->rbackoff_ms = BACKOFF_MAX_MS;
	emb_conn_destroy(conn);
}

/* Encodes the HELLO every connection of c starts with. 0 or an error. */
static int hello_encode(struct emb_client *c,
			const struct emb_client_opts *opts)
{
	char name[EMB_WIRE_CLIENT_NAME_MAX];
	int len;

	snprintf(name, sizeof(name), "%s/%s",
		 opts->name ? opts->name : "embstore",
		 emb_transport_name(c->tr));
	/* The admin token proves training rights too: sent alone. */
	if (c->admin_len)
		len = emb_hello_encode(c->hello_req, sizeof(c->hello_req),
				       EMB_F_ADMIN, c->admin, c->admin_len,
				       name);
	else
		len = emb_hello_encode(c->hello_req, sizeof(c->hello_req), 0,
				       opts->auth_token, opts->auth_token_len,
				       name);
	if (len < 0)
		return len;
	c->hello_len = (uint32_t)len;
	return 0;
}

/* Reads s's HELLO response (rhdr, payload): 0, or its refusal. */
static int hello_check(struct server *s, const struct emb_frame_hdr *rhdr,
		       const void *payload, bool first)
{
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	struct emb_wire_hello_resp hr;
	int rc;

	rc = emb_hello_decode(rhdr, payload, &hr, msg, sizeof(msg));
	if (rc < 0 && msg[0])
		emb_log(EMB_LOG_ERROR, "server %s:%u refused HELLO: %s",
			s->host, s->port, msg);
	if (rc)
		return rc;
	/* First contact: at creation, or a newcomer on a rank this client
	 * never reached. */
	if (first || !s->lim.max_ids)
		s->lim = hr.limits; /* read by callers from now on */
	else if (hr.server_id != s->server_id)
		emb_log(EMB_LOG_INFO, "server %s:%u restarted: reconnected",
			s->host, s->port);
	else
		emb_log(EMB_LOG_INFO, "server %s:%u: reconnected", s->host,
			s->port);
	s->server_id = hr.server_id;
	s->sessions = hr.features & EMB_WIRE_FEAT_PUSH_SESSION;
	s->pull_many = hr.features & EMB_WIRE_FEAT_PULL_MANY;
	s->push_many = hr.features & EMB_WIRE_FEAT_PUSH_MANY;
	__atomic_store_n(&s->no_births,
			 !(hr.features & EMB_WIRE_FEAT_BIRTHS), __ATOMIC_RELAXED);
	s->rdma_offered = hr.features & EMB_WIRE_FEAT_RDMA;
	return 0;
}

/* On the creating thread, before the loop thread starts. */
static int hello(struct emb_client *c, struct server *s)
{
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX];
	struct emb_frame_hdr hdr, rhdr;
	struct iovec iov;
	int rc;

	memcpy(&hdr, c->hello_req, sizeof(hdr));
	iov = (struct iovec){c->hello_req + EMB_WIRE_HDR_SIZE,
			     c->hello_len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call_sync(s->conn, &hdr, &iov, 1, resp, sizeof(resp),
				&rhdr);
	if (rc)
		return rc;
	return hello_check(s, &rhdr, resp, true);
}

/* Loop thread: CREATE answered with the table's id on the newcomer s. */
static void tab_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct server *s = ctx;
	struct emb_client *c = s->c;
	const struct emb_wire_spec *ws;
	uint32_t i = (uint32_t)(s - c->srv);

	if (!s->conn || s->state != SRV_TABLES)
		return;
	if (status) {
		server_lost(s, status);
		return;
	}
	ws = &s->tab_specs[s->tab_at];
	if (resp->status < 0) {
		/* Its id there stays unknown (0): writes to it fail rather
		 * than reach another table. */
		emb_log(EMB_LOG_ERROR, "server %s:%u: table %s: %s", s->host,
			s->port, ws->name, emb_strerror(resp->status));
	}
	pthread_mutex_lock(&c->tab_mu);
	for (struct emb_client_table *t = c->tabs; t; t = t->tnext)
		if (strcmp(t->name, ws->name) == 0)
			__atomic_store_n(&t->ids[i],
					 resp->status < 0 ? 0 : resp->table_id,
					 __ATOMIC_RELAXED);
	pthread_mutex_unlock(&c->tab_mu);
	s->tab_at++;
	tables_next(c, s);
}

/* Loop thread: asks the newcomer s for the next table's id, or is done. */
static void tables_next(struct emb_client *c, struct server *s)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	if (s->tab_at >= s->tab_n) {
		free(s->tab_specs);
		s->tab_specs = NULL;
		s->revived = false;
		emb_log(EMB_LOG_INFO, "server %s:%u: %u table id%s learned",
			s->host, s->port, s->tab_n, s->tab_n == 1 ? "" : "s");
		server_up(c, s);
		return;
	}
	/* CREATE with the same spec: made if missing (the fill's source
	 * makes it too), else its id. */
	len = emb_wire_create_req_encode(s->tab_req, sizeof(s->tab_req), 0,
					 &s->tab_specs[s->tab_at]);
	if (len < 0) {
		server_lost(s, len);
		return;
	}
	memcpy(&hdr, s->tab_req, sizeof(hdr));
	iov = (struct iovec){s->tab_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(s->conn, &hdr, &iov, 1, s->tab_resp,
			   sizeof(s->tab_resp), tab_done, s);
	if (rc)
		server_lost(s, rc);
}

/*
 * Loop thread: s is a newcomer on a dead rank; the ids this client holds
 * for it are the dead server's. Learn every open table's id there before
 * anything is sent to it.
 */
static void tables_begin(struct emb_client *c, struct server *s)
{
	uint32_t n = 0;

	s->state = SRV_TABLES;
	free(s->tab_specs);
	s->tab_specs = NULL;
	pthread_mutex_lock(&c->tab_mu);
	for (struct emb_client_table *t = c->tabs; t; t = t->tnext)
		n++;
	s->tab_specs = calloc(n ? n : 1, sizeof(*s->tab_specs));
	n = 0;
	for (struct emb_client_table *t = c->tabs; s->tab_specs && t;
	     t = t->tnext, n++) {
		struct emb_wire_spec *ws = &s->tab_specs[n];

		memcpy(ws->name, t->name, sizeof(ws->name));
		ws->dim = t->spec.dim;
		ws->optim = t->spec.optim;
		ws->init = t->spec.init;
		ws->seed = t->spec.seed;
		ws->row_format = t->spec.row_format;
		ws->rounding = t->spec.rounding;
	}
	pthread_mutex_unlock(&c->tab_mu);
	if (!s->tab_specs) {
		server_lost(s, -ENOMEM);
		return;
	}
	s->tab_n = n;
	s->tab_at = 0;
	tables_next(c, s);
}

/* Loop thread: the HELLO of a new conn to s came back. */
static void hello_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct server *s = ctx;
	struct emb_client *c = s->c;

	/* The conn was dropped underneath (destroy, or a loss). */
	if (!s->conn || s->state != SRV_HELLO)
		return;
	if (status == 0) {
		status = hello_check(s, resp, s->hello_resp, false);
		/* Refused (a token the restarted server does not take):
		 * retrying cannot help the parts waiting. */
		if (status && resp->status < 0)
			emb__conn_fail_waiting(s, status);
	}
	if (status) {
		server_lost(s, status);
		return;
	}
	s->backoff_ms = 0;
	add(&c->reconnects, 1);
	if (s->revived) {
		tables_begin(c, s);
		return;
	}
	server_up(c, s);
}

/* Loop thread: s is ready for requests: the parts waiting go. */
static void server_up(struct emb_client *c, struct server *s)
{
	struct part *p;

	s->state = SRV_UP;
	p = s->wait_head;
	s->wait_head = s->wait_tail = NULL;
	while (p) {
		struct part *next = p->retry.wnext;

		c->fns->send(c, p);
		p = next;
	}
}

/*
 * On a "tcp,rdma" loop: RDMA to a server whose HELLO offered it (unless
 * that failed before), else TCP. NULL on a one-transport loop.
 */
static const char *via_for(const struct emb_client *c, const struct server *s)
{
	if (!c->dual)
		return NULL;
	return s->rdma_offered && !s->rdma_refused ? "rdma" : "tcp";
}

/* s->conn was just set: record what it runs on, for other threads. */
static void note_via(struct server *s)
{
	__atomic_store_n(&s->on_rdma,
			 strcmp(emb_conn_transport(s->conn), "rdma") == 0,
			 __ATOMIC_RELAXED);
}

/* Loop thread: one connect attempt to s, then HELLO (answered later). */
static void reconnect(struct emb_client *c, struct server *s)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_frame_hdr hdr;
	struct emb_conn *conn;
	struct iovec iov;
	int rc;

	co.host = s->host;
	co.port = s->port;
	co.via = via_for(c, s);
	rc = emb_conn_create(c->tr, &co, &conn);
	if (rc && co.via && strcmp(co.via, "rdma") == 0) {
		co.via = "tcp";
		if (emb_conn_create(c->tr, &co, &conn) == 0) {
			emb_log(EMB_LOG_WARN,
				"server %s:%u: RDMA connect failed (%s): TCP from now on",
				s->host, s->port, emb_strerror(rc));
			s->rdma_refused = true;
			rc = 0;
		}
	}
	if (rc) {
		s->last_err = rc;
		schedule_retry(s);
		/* An observer does not wait for a server it cannot reach: in
		 * a formed job that one is dead, and what it asks of the
		 * others is worth showing now (embstore stat). */
		if (c->observer)
			emb__conn_fail_waiting(s, rc);
		return;
	}
	s->conn = conn;
	note_via(s);
	s->state = SRV_HELLO;
	memcpy(&hdr, c->hello_req, sizeof(hdr));
	iov = (struct iovec){c->hello_req + EMB_WIRE_HDR_SIZE,
			     c->hello_len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(conn, &hdr, &iov, 1, s->hello_resp,
			   sizeof(s->hello_resp), hello_done, s);
	if (rc)
		server_lost(s, rc);
}

/* Loop thread: the HELLO of s's new read conn came back. */
static void rhello_done(void *ctx, int status,
			const struct emb_frame_hdr *resp)
{
	struct server *s = ctx;
	char msg[8];
	struct emb_wire_hello_resp hr;

	if (!s->rconn || s->rstate != RD_HELLO)
		return;
	if (status == 0)
		status = emb_hello_decode(resp, s->rhello_resp, &hr, msg,
					  sizeof(msg));
	if (status) {
		emb__rconn_lost(s, status);
		return;
	}
	s->rstate = RD_UP;
	s->rbackoff_ms = 0;
}

/*
 * Loop thread, or the creating thread before the loop runs (sync): opens
 * s's read conn over RDMA and sends its HELLO. A failure waits for the
 * next try; pulls go two-sided meanwhile.
 */
static void rconnect(struct emb_client *c, struct server *s, bool sync)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_frame_hdr hdr, rhdr;
	struct emb_conn *conn;
	struct iovec iov;
	int rc;

	co.host = s->host;
	co.port = s->port;
	co.via = c->dual ? "rdma" : NULL;
	rc = emb_conn_create(c->tr, &co, &conn);
	if (rc) {
		s->rretry_ms = emb_clock_ms() + BACKOFF_MAX_MS;
		emb_log(EMB_LOG_WARN,
			"server %s:%u: read connection for one-sided pulls: "
			"%s; pulling two-sided",
			s->host, s->port, emb_strerror(rc));
		return;
	}
	s->rconn = conn;
	s->rgen++;
	s->rstate = RD_HELLO;
	memcpy(&hdr, c->hello_req, sizeof(hdr));
	iov = (struct iovec){c->hello_req + EMB_WIRE_HDR_SIZE,
			     c->hello_len - EMB_WIRE_HDR_SIZE};
	if (sync) {
		rc = emb_conn_call_sync(conn, &hdr, &iov, 1, s->rhello_resp,
					sizeof(s->rhello_resp), &rhdr);
		rhello_done(s, rc, rc ? NULL : &rhdr);
		return;
	}
	rc = emb_conn_call(conn, &hdr, &iov, 1, s->rhello_resp,
			   sizeof(s->rhello_resp), rhello_done, s);
	if (rc)
		emb__rconn_lost(s, rc);
}

/* Loop thread: one-sided clients reopen lost read conns, with backoff. */
static void rmaintain(struct emb_client *c, uint64_t now)
{
	for (uint32_t i = 0; i < c->nsrv && c->onesided; i++) {
		struct server *s = &c->srv[i];

		if (s->rstate == RD_DOWN && s->state == SRV_UP &&
		    !srv_dead(s) &&
		    __atomic_load_n(&s->on_rdma, __ATOMIC_RELAXED) &&
		    now >= s->rretry_ms && !stopping(c))
			rconnect(c, s, false);
	}
}

/*
 * Loop thread: when a part posted on s's conn belongs to an op whose
 * deadline passed, the server did not answer in time (cut off, frozen, or
 * its reply lost): the conn is dropped, so that part ends now with
 * -ETIMEDOUT (part_done()) and the others on it go again on a new conn.
 * The transport's own call timeout counts from each send, and a part sent
 * again (after a reconnect, a refusal for a fill, a reroute) would
 * otherwise outlive its op's deadline by up to a whole timeout.
 */
static void fly_check(struct server *s, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	bool over = false, rover = false;

	if (now < s->fly_check_ms)
		return;
	for (struct part *p = s->fly; p; p = p->retry.fnext) {
		if (p->op->deadline_ms > now) {
			if (p->op->deadline_ms < next)
				next = p->op->deadline_ms;
		} else if (p->retry.reading) {
			rover = true;
		} else {
			over = true;
		}
	}
	s->fly_check_ms = next;
	/* READs past it: they fall back to a PULL, which ends at once. */
	if (rover && !stopping(s->c))
		emb__rconn_lost(s, -ETIMEDOUT);
	if (over && s->conn && !stopping(s->c)) {
		emb_log(EMB_LOG_WARN,
			"server %s:%u: no reply within a call's deadline: "
			"dropping its connection",
			s->host, s->port);
		/* The calls on it complete with -ETIMEDOUT (part_done()). */
		emb_conn_close(s->conn, -ETIMEDOUT);
		server_lost(s, -ETIMEDOUT);
	}
}

/*
 * Loop thread: ends parts whose deadline passed (waiting for a conn, for
 * their back-off, or posted and unanswered) and reconnects servers that
 * have parts waiting and whose backoff is over. Returns how long the loop
 * may sleep before the next call, in ms.
 */
static int maintain(struct emb_client *c)
{
	uint64_t now = emb_clock_ms();
	struct part *p, **pp = &c->delayed, *due = NULL;
	int wait = 100;

	rmaintain(c, now);
	emb__pace_tick(c, now);
	/* Copies refused by a fill go again once their back-off is over. */
	while ((p = *pp)) {
		if (p->retry.due_ms <= now) {
			*pp = p->retry.dnext;
			p->retry.dnext = due;
			due = p;
			continue;
		}
		if (p->retry.due_ms - now < (uint64_t)wait)
			wait = (int)(p->retry.due_ms - now);
		pp = &p->retry.dnext;
	}
	while ((p = due)) {
		due = p->retry.dnext;
		/* Refused until the deadline: the server named, and what it
		 * last said (the part's status holds it meanwhile). */
		if (now >= p->op->deadline_ms && !stopping(c)) {
			c->fns->end(p, emb__conn_timeout(c, p, p->req.status),
				    NULL);
			continue;
		}
		add(&c->retries, 1);
		c->fns->send(c, p);
	}

	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct server *s = &c->srv[i];
		struct part **wp = &s->wait_head, *last = NULL;

		fly_check(s, now);
		if (s->fly && s->fly_check_ms > now &&
		    s->fly_check_ms - now < (uint64_t)wait)
			wait = (int)(s->fly_check_ms - now);
		while (*wp) {
			p = *wp;

			if (now < p->op->deadline_ms) {
				last = p;
				wp = &p->retry.wnext;
				continue;
			}
			*wp = p->retry.wnext;
			c->fns->end(p, emb__conn_timeout(c, p, s->last_err),
				    NULL);
		}
		s->wait_tail = last;
		if (!s->wait_head || s->state != SRV_DOWN)
			continue;
		if (now >= s->retry_ms) {
			reconnect(c, s);
			now = emb_clock_ms();
		}
		if (s->state == SRV_DOWN && s->retry_ms > now &&
		    s->retry_ms - now < (uint64_t)wait)
			wait = (int)(s->retry_ms - now);
	}
	return wait > 0 ? wait : 1;
}

void *emb__conn_loop(void *arg)
{
	struct emb_client *c = arg;
	int wait = 100, rc;

	while (!stopping(c)) {
		rc = emb_transport_poll(c->tr, wait);
		if (rc < 0 && rc != -EINTR) {
			emb_log(EMB_LOG_ERROR, "client loop failed: %s",
				emb_strerror(rc));
			break;
		}
		wait = maintain(c);
	}
	return NULL;
}

/*
 * Creating thread: s answered HELLO over TCP and offers RDMA at the same
 * port number; connect there, HELLO again, and keep whichever conn got
 * through (a worker whose RDMA cannot reach the server stays on TCP).
 */
static void move_to_rdma(struct emb_client *c, struct server *s)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_conn *tcp = s->conn, *conn;
	int rc;

	co.host = s->host;
	co.port = s->port;
	co.via = "rdma";
	rc = emb_conn_create(c->tr, &co, &conn);
	if (rc == 0) {
		s->conn = conn;
		rc = hello(c, s);
		if (rc) {
			emb_conn_destroy(conn);
			s->conn = tcp;
		}
	}
	if (rc) {
		emb_log(EMB_LOG_WARN,
			"server %s:%u offers RDMA, but it failed here (%s): TCP",
			s->host, s->port, emb_strerror(rc));
		s->rdma_refused = true;
		return;
	}
	emb_conn_destroy(tcp);
}

/*
 * A connection to srv could not be made: the last error names the address
 * and the cause, and an unresolvable host is told apart from the other
 * EINVALs of a connect (the transports map a failed lookup to it).
 */
static void connect_failed(const struct server *srv, const char *via, int rc)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
	struct addrinfo *ai = NULL;
	int gai = 0;

	if (rc == -EINVAL) {
		gai = getaddrinfo(srv->host, NULL, &hints, &ai);
		if (ai)
			freeaddrinfo(ai);
	}
	if (gai)
		emb__err_set(rc, "connect to server %s:%u: cannot resolve "
				 "host %s: %s",
			     srv->host, srv->port, srv->host, gai_strerror(gai));
	else
		emb__err_set(rc, "could not connect to server %s:%u over %s",
			     srv->host, srv->port, via);
	emb_log(EMB_LOG_WARN, "connect to %s:%u over %s: %s", srv->host,
		srv->port, via, emb_strerror(rc));
}

/* Failures of a first connect worth another try (connect_first()). */
static bool first_retry(int rc, bool said_hello)
{
	if (rc == -ETIMEDOUT)
		return true;
	/* The server closed a conn whose HELLO it did not read in time:
	 * the refusal, or the close that raced it. */
	return said_hello && (rc == EMB_EPEERDEAD || rc == EMB_ECLOSED ||
			      rc == -ECONNRESET || rc == -EPIPE);
}

/*
 * The first connect to srv and its HELLO, before the loop runs: 0, or the
 * error with *said_hello telling whether the connect or the HELLO failed
 * (srv->conn is then NULL). Either that timed out is tried again, after
 * a random pause, until the client's timeout passed. When a job forms,
 * every worker connects to every server at once: a SYN that a full accept
 * queue dropped comes back only after the kernel's 1 s retransmit, past
 * CONNECT_MAX_MS, and on a machine with more processes than cores a
 * worker may be off the CPU between its connect and its HELLO for longer
 * than the server's handshake timeout (the server then closes it with
 * -ETIMEDOUT, or the close reaches the HELLO first). The pause spreads
 * the retries so that they do not meet again. Any other answer (a
 * refused connect, a bad token) is final.
 */
static int connect_first(struct emb_client *c, struct server *srv,
			 const struct emb_connect_opts *co, bool *said_hello)
{
	/* No call deadline (0) is no reason to wait forever here. */
	int64_t until = (int64_t)emb_clock_ms() +
			(c->timeout_ms ? c->timeout_ms : CONNECT_FIRST_MS);
	uint32_t pause = CONNECT_PAUSE_MS, r;
	int rc, tries = 0;

	for (;;) {
		*said_hello = false;
		rc = emb_conn_create(c->tr, co, &srv->conn);
		if (rc == 0) {
			*said_hello = true;
			rc = hello(c, srv);
			if (rc) {
				emb_conn_destroy(srv->conn);
				srv->conn = NULL;
			}
		}
		tries++;
		/* An observer comes to a formed job: a server refusing is
		 * not one still starting (and it need not fail the create). */
		if (c->observer || !first_retry(rc, *said_hello) ||
		    (int64_t)emb_clock_ms() + pause >= until)
			break;
		if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
			r = (uint32_t)emb_clock_ms();
		usleep((useconds_t)(pause / 2 + r % pause) * 1000u);
		if (pause < CONNECT_PAUSE_MAX_MS)
			pause *= 2;
	}
	if (tries > 1)
		emb_log(rc ? EMB_LOG_WARN : EMB_LOG_INFO,
			"server %s:%u: %s after %d tries", co->host, co->port,
			rc ? emb_strerror(rc) : "connected", tries);
	return rc;
}

int emb__conn_connect_all(struct emb_client *c, const char *transport,
		       const struct emb_client_opts *opts)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	bool said_hello;
	uint32_t i, up = 0, down = 0;
	int rc, first_err = 0;

	topts.call_timeout_ms = c->timeout_ms;
	topts.connect_timeout_ms =
	    c->timeout_ms < CONNECT_MAX_MS ? c->timeout_ms : CONNECT_MAX_MS;
	topts.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	rc = emb_transport_create(transport, &topts, &c->tr);
	if (rc)
		return rc;
	c->dual = strchr(transport, ',') != NULL;
	rc = emb__respbufs_create(c->tr,
				  strstr(transport, "rdma") != NULL, &c->bufs);
	if (rc)
		goto err_tr;
	rc = hello_encode(c, opts);
	if (rc) {
		i = 0;
		goto err;
	}
	for (i = 0; i < c->nsrv; i++) {
		struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;

		/* Removed from the map before this client came: never asked,
		 * so never connected to (it may well be gone). */
		if (srv_dead(&c->srv[i])) {
			c->srv[i].state = SRV_DOWN;
			continue;
		}
		co.host = c->srv[i].host;
		co.port = c->srv[i].port;
		co.via = via_for(c, &c->srv[i]);
		rc = connect_first(c, &c->srv[i], &co, &said_hello);
		if (rc && !said_hello) {
			connect_failed(&c->srv[i], co.via ? co.via : transport,
				       rc);
			if (!c->observer)
				goto err;
			/* A job in trouble is when it is observed: a server
			 * the map still names may be dead (its slots lost
			 * every copy). The others are served; its calls try
			 * a connect and fail at once when it is refused
			 * (reconnect()). */
			c->srv[i].state = SRV_DOWN;
			c->srv[i].last_err = rc;
			schedule_retry(&c->srv[i]);
			first_err = first_err ? first_err : rc;
			down++;
			continue;
		}
		if (rc) {
			/* The server's own message, if it sent one, says
			 * more (a bad token, too many connections). */
			emb__err_set(rc, "hello to server %s:%u: %s",
				     c->srv[i].host, c->srv[i].port,
				     emb_strerror(rc));
			emb_log(EMB_LOG_WARN, "hello to %s:%u: %s",
				c->srv[i].host, c->srv[i].port,
				emb_strerror(rc));
			goto err;
		}
		if (c->dual && c->srv[i].rdma_offered)
			move_to_rdma(c, &c->srv[i]);
		note_via(&c->srv[i]);
		if (c->onesided && c->srv[i].on_rdma)
			rconnect(c, &c->srv[i], true);
		up++;
	}
	if (down && !up) {
		rc = first_err; /* nothing to observe: its message stays */
		goto err;
	}
	if (down)
		emb_log(EMB_LOG_WARN,
			"observing with %u of %u servers unreachable: their "
			"calls fail",
			down, up + down);
	return 0;
err:
	while (i-- > 0) {
		emb_conn_destroy(c->srv[i].conn);
		c->srv[i].conn = NULL;
		emb__rconn_lost(&c->srv[i], EMB_ECLOSED);
	}
	emb__respbufs_destroy(c->bufs);
	c->bufs = NULL;
err_tr:
	emb_transport_destroy(c->tr);
	c->tr = NULL;
	return rc;
}

