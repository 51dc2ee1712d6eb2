/*
 * src/transport/rdma_conn.c - the RDMA transport's control side: opening
 * the device, the event loop (rdma_cm event channel, CQ completion channel
 * and wake-up eventfd under one epoll), listeners and accept, connect with
 * a HELLO in the private data, memory registration, and orderly teardown
 * (disconnect, drain the CQ of the conn's WRs, deregister, destroy QP and
 * cm_id). The data path is in rdma_dp.c; docs/rdma.md has the design.
 *
 * Threads: as transport.h says, everything runs on the loop's thread,
 * except that a listener hands a connect request to another loop with
 * emb_transport_exec(), which migrates the cm_id to that loop's channel.
 */
#include "transport/rdma_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

#define EV_WAKE 0u
#define EV_CM 1u
#define EV_CQ 2u
#define RESOLVE_MS 2000
#define DRAIN_WAIT_MS 3000	/* transport destroy: wait for drains */
#define ARENA_MIN (256u << 10)
#define ARENA_MAX (8u << 20)

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static void addr_str(const struct sockaddr *sa, char *out, size_t n)
{
	char host[INET6_ADDRSTRLEN] = "?";
	uint16_t port = 0;

	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
	}
	snprintf(out, n, "%s:%u", host, port);
}

/*
 * RoCE has no loopback device (rdma_cm fails to resolve a route to
 * 127.0.0.1), so a loopback address means this device's own address: the
 * first IPv4-mapped entry of port 1's GID table. Other addresses pass.
 */
static void map_loopback(struct emb_rdma_transport *rt, struct sockaddr *sa)
{
	struct sockaddr_in *in = (struct sockaddr_in *)sa;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	uint16_t port;

	if (sa->sa_family == AF_INET) {
		if (ntohl(in->sin_addr.s_addr) >> 24 != 127)
			return;
		port = in->sin_port;
	} else if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;

		if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			return;
		port = in6->sin6_port;
	} else {
		return;
	}
	if (ibv_query_port(rt->verbs, 1, &pa))
		return;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0,
						  0, 0, 0, 0, 0xff, 0xff};

		if (ibv_query_gid(rt->verbs, 1, i, &gid) ||
		    memcmp(gid.raw, v4map, sizeof(v4map)) ||
		    !(gid.raw[12] | gid.raw[13] | gid.raw[14] | gid.raw[15]))
			continue;
		/* sockaddr_in fits in whatever getaddrinfo returned. */
		memset(in, 0, sizeof(*in));
		in->sin_family = AF_INET;
		in->sin_port = port;
		memcpy(&in->sin_addr, &gid.raw[12], 4);
		return;
	}
}

static uint32_t credits_for(const struct emb_transport *tr)
{
	uint32_t n = tr->opts.max_inflight;

	return n < EMB_RDMA_MAX_CREDITS ? n : EMB_RDMA_MAX_CREDITS;
}

static uint32_t arena_pages_for(const struct emb_transport *tr)
{
	uint64_t b = 2ull * tr->opts.max_frame_bytes;

	if (b < ARENA_MIN)
		b = ARENA_MIN;
	if (b > ARENA_MAX)
		b = ARENA_MAX;
	return (uint32_t)(b / EMB_RDMA_PAGE);
}

static void hello_fill(const struct emb_rdma_conn *c, struct emb_rdma_hello *h)
{
	h->magic = EMB_RDMA_HELLO_MAGIC;
	h->version = EMB_RDMA_HELLO_VERSION;
	h->credits = (uint16_t)c->nslots;
	h->slot_bytes = EMB_RDMA_SLOT_BYTES;
	h->max_frame_bytes = c->base.tr->opts.max_frame_bytes;
}

static int hello_check(const void *pd, size_t len, struct emb_rdma_hello *h)
{
	if (!pd || len < sizeof(*h))
		return EMB_ENOHELLO;
	memcpy(h, pd, sizeof(*h));
	if (h->magic != EMB_RDMA_HELLO_MAGIC)
		return EMB_EBADMAGIC;
	if (h->version != EMB_RDMA_HELLO_VERSION)
		return EMB_EBADVERSION;
	if (h->slot_bytes != EMB_RDMA_SLOT_BYTES || h->credits == 0)
		return EMB_EBADFRAME;
	return 0;
}

/* ---- conn lifetime ------------------------------------------------------ */

static int conn_index(struct emb_rdma_transport *rt, struct emb_rdma_conn *c)
{
	for (uint32_t i = 0; i < rt->nconns; i++) {
		if (!rt->conns[i]) {
			rt->conns[i] = c;
			c->idx = i;
			return 0;
		}
	}
	if (rt->nconns == rt->conns_cap) {
		uint32_t cap = rt->conns_cap ? 2 * rt->conns_cap : 16;
		struct emb_rdma_conn **p =
			realloc(rt->conns, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		rt->conns = p;
		rt->conns_cap = cap;
	}
	c->idx = rt->nconns;
	rt->conns[rt->nconns++] = c;
	return 0;
}

static uint32_t cq_need(const struct emb_rdma_conn *c)
{
	return EMB_RDMA_RING + 1 + c->nslots + 1;
}

/*
 * A flushed QP completes every WR it holds, signaled or not, so each conn
 * reserves its full queue depth in the shared CQ; the CQ grows (doubling,
 * up to the device's max_cqe) rather than risk an overrun. 0 or -ENOSPC.
 */
static int cq_reserve(struct emb_rdma_transport *rt, uint32_t need)
{
	uint32_t cap = rt->cq_cap;

	while (rt->cq_used + need > cap && cap < rt->cq_max)
		cap = 2 * cap < rt->cq_max ? 2 * cap : rt->cq_max;
	if (rt->cq_used + need > cap) {
		emb_log(EMB_LOG_WARN, "rdma: CQ full (%u of %u CQEs reserved)",
			rt->cq_used, cap);
		return -ENOSPC;
	}
	if (cap != rt->cq_cap) {
		if (ibv_resize_cq(rt->cq, (int)cap)) {
			emb_log(EMB_LOG_WARN, "rdma: CQ resize to %u CQEs "
				"failed", cap);
			return -ENOSPC;
		}
		rt->cq_cap = cap;
	}
	return 0;
}

/* Frees what conn_setup made; the QP has no WR the CQ could still name. */
static void conn_free_res(struct emb_rdma_conn *c)
{
	struct emb_rdma_transport *rt = c->rt;

	if (c->qp) {
		rdma_destroy_qp(c->id);
		c->qp = NULL;
		rt->cq_used -= cq_need(c);
	}
	if (c->arena_mr)
		ibv_dereg_mr(c->arena_mr);
	if (c->rx_mr)
		ibv_dereg_mr(c->rx_mr);
	free(c->arena);
	free(c->arena_map);
	free(c->rx_mem);
	free(c->rx_wr);
	free(c->rx_sge);
	free(c->ring);
	free(c->ring_sge);
	free(c->calls);
	free(c->sreqs);
	if (rt->conns[c->idx] == c)
		rt->conns[c->idx] = NULL;
}

static struct emb_rdma_conn *conn_alloc(struct emb_rdma_transport *rt,
					bool server)
{
	struct emb_rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->rt = rt;
	c->base.tr = &rt->base;
	c->base.server = server;
	c->nslots = credits_for(&rt->base);
	c->call_timeout_ms = rt->base.opts.call_timeout_ms;
	return c;
}

/* Buffers, ring, QP on id and the receive slots posted. */
static int conn_setup(struct emb_rdma_conn *c, struct rdma_cm_id *id)
{
	struct emb_rdma_transport *rt = c->rt;
	struct ibv_qp_init_attr qa = {0};
	size_t rx_bytes = (size_t)c->nslots * EMB_RDMA_SLOT_BYTES;
	size_t arena_bytes;
	int rc;

	c->id = id;
	rc = conn_index(rt, c);
	if (rc)
		return rc;
	rc = cq_reserve(rt, cq_need(c));
	if (rc)
		goto err_free;
	c->arena_pages = arena_pages_for(&rt->base);
	arena_bytes = (size_t)c->arena_pages * EMB_RDMA_PAGE;
	c->rx_mem = aligned_alloc(EMB_RDMA_PAGE, rx_bytes);
	c->arena = aligned_alloc(EMB_RDMA_PAGE, arena_bytes);
	c->arena_map = calloc((c->arena_pages + 63) / 64, sizeof(uint64_t));
	if (!c->rx_mem || !c->arena || !c->arena_map) {
		rc = -ENOMEM;
		goto err_free;
	}
	c->rx_mr = ibv_reg_mr(rt->pd, c->rx_mem, rx_bytes,
			      IBV_ACCESS_LOCAL_WRITE);
	if (!c->rx_mr) {
		rc = -errno;
		goto err_free;
	}
	c->arena_mr = ibv_reg_mr(rt->pd, c->arena, arena_bytes,
				 IBV_ACCESS_LOCAL_WRITE |
					 IBV_ACCESS_REMOTE_WRITE |
					 IBV_ACCESS_REMOTE_READ);
	if (!c->arena_mr) {
		rc = -errno;
		goto err_free;
	}
	rc = emb__rdma_dp_init(c);
	if (rc)
		goto err_free;

	qa.send_cq = rt->cq;
	qa.recv_cq = rt->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = EMB_RDMA_RING + 1; /* + the drain marker */
	qa.cap.max_recv_wr = c->nslots + 1;
	qa.cap.max_send_sge = rt->max_sge;
	qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, rt->pd, &qa)) {
		rc = -errno;
		goto err_free;
	}
	c->qp = id->qp;
	c->qpn = c->qp->qp_num;
	rt->cq_used += cq_need(c);
	rc = emb__rdma_post_all_recv(c);
	if (rc)
		goto err_free;
	id->context = c;
	return 0;

err_free:
	conn_free_res(c);
	return rc;
}

static void close_list_remove(struct emb_rdma_conn *c)
{
	struct emb_rdma_conn **pp = &c->rt->close_head;

	if (!c->close_pending)
		return;
	while (*pp && *pp != c)
		pp = &(*pp)->close_next;
	if (*pp)
		*pp = c->close_next;
	c->close_pending = false;
}

static void conn_maybe_free(struct emb_rdma_conn *c)
{
	if (c->state != EMB_RDMA_CONN_DRAINING || !c->sq_drained ||
	    !c->user_gone || c->held || c->close_pending || c->busy)
		return;
	emb__rdma_release_bufs(c);
	conn_free_res(c);
	c->id->context = NULL;
	rdma_destroy_id(c->id);
	free(c);
}

static void conn_opened(struct emb_rdma_conn *c)
{
	if (c->opened)
		return;
	c->opened = true;
	c->state = EMB_RDMA_CONN_OPEN;
	EMB__STAT_ADD(c->rt->base.stats.conns_opened, 1);
	emb_log(EMB_LOG_DEBUG, "rdma: accepted %s", c->base.peer);
	if (c->on_open)
		c->on_open(c->arg, &c->base, 0);
}

static void post_drain(struct emb_rdma_conn *c)
{
	struct ibv_send_wr swr = {0}, *sbad;
	struct ibv_recv_wr rwr = {0}, *rbad;
	struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};

	if (!c->qp) {
		c->sq_drained = c->rq_drained = true;
		return;
	}
	/* rdma_disconnect moved it already when connected; make sure. */
	ibv_modify_qp(c->qp, &attr, IBV_QP_STATE);
	swr.wr_id = emb__rdma_wr_id(c->idx, EMB_RDMA_WR_DRAIN_SQ, 0);
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(c->qp, &swr, &sbad))
		c->sq_drained = true;
	rwr.wr_id = emb__rdma_wr_id(c->idx, EMB_RDMA_WR_DRAIN_RQ, 0);
	if (ibv_post_recv(c->qp, &rwr, &rbad))
		c->rq_drained = true;
}

static void conn_fail(struct emb_rdma_conn *c, int reason)
{
	struct emb_rdma_transport *rt = c->rt;
	struct emb_transport_stats *st = &rt->base.stats;
	bool was_open = c->state == EMB_RDMA_CONN_OPEN;

	if (c->state == EMB_RDMA_CONN_DRAINING)
		return;
	c->state = EMB_RDMA_CONN_DRAINING;
	c->reason = reason;
	if (reason == 0 || reason == EMB_ECLOSED)
		emb_log(EMB_LOG_DEBUG, "rdma: conn %s closed",
			c->base.peer);
	else if (reason == EMB_EPEERDEAD && !c->wc_status)
		emb_log(EMB_LOG_DEBUG, "rdma: conn %s: peer disconnected",
			c->base.peer);
	else if (c->wc_status)
		emb_log(EMB_LOG_WARN, "rdma: conn %s failed: %s (work request "
			"status: %s)", c->base.peer, emb_strerror(reason),
			ibv_wc_status_str((enum ibv_wc_status)c->wc_status));
	else
		emb_log(EMB_LOG_WARN, "rdma: conn %s failed: %s", c->base.peer,
			emb_strerror(reason));
	if (was_open || c->opened) {
		EMB__STAT_ADD(st->conns_closed, 1);
		if (reason == EMB_EPEERDEAD && !c->wc_status)
			EMB__STAT_ADD(st->peer_closes, 1);
		else if (reason == EMB_EPEERDEAD)
			EMB__STAT_ADD(st->err_peer_closed, 1);
		else if (reason == EMB_EQPERR || (reason < 0 && reason > -4096))
			EMB__STAT_ADD(st->err_io, 1);
	}
	if (was_open)
		rdma_disconnect(c->id);
	post_drain(c);
	c->close_pending = true;
	c->close_next = rt->close_head;
	rt->close_head = c;
}

/* What rdma_dp.c calls back into when a conn fails, opens or may go. */
static const struct emb_rdma_conn_ops conn_ops = {
	.fail = conn_fail,
	.opened = conn_opened,
	.maybe_free = conn_maybe_free,
};

/* Loop: fails pending work of closed conns and runs their on_close. */
static int run_closes(struct emb_rdma_transport *rt)
{
	struct emb_rdma_conn *c;
	int n = 0;

	while ((c = rt->close_head)) {
		rt->close_head = c->close_next;
		c->close_pending = false;
		c->busy++;
		emb__rdma_fail_ops(c, c->reason);
		if (!c->user_gone) {
			if (c->base.server) {
				c->user_gone = true;
				if (c->opened && c->on_close)
					c->on_close(c->arg, &c->base, c->reason);
			} else if (c->on_close) {
				c->on_close(c->arg, &c->base, c->reason);
			}
		}
		c->busy--;
		conn_maybe_free(c);
		n++;
	}
	return n;
}

/* ---- accept ------------------------------------------------------------- */

struct accept_task {
	struct rdma_cm_id *id;		/* the connect request's id */
	struct emb_rdma_hello hello;	/* the client's */
	uint8_t resp_res;		/* READs the client accepts from us */
	struct emb_transport *tr;	/* target loop */
	emb_request_fn on_request;
	emb_conn_fn on_open;
	emb_conn_fn on_close;
	void *arg;
};

static void reject(struct rdma_cm_id *id, const char *why)
{
	emb_log(EMB_LOG_WARN, "rdma: connect request rejected: %s", why);
	rdma_reject(id, NULL, 0);
	rdma_destroy_id(id);
}

static void accept_on(struct emb_rdma_transport *rt, struct accept_task *t)
{
	struct rdma_conn_param prm = {0};
	struct emb_rdma_hello h;
	struct emb_rdma_conn *c;
	int rc;

	if (t->id->verbs != rt->verbs) {
		reject(t->id, emb_strerror(EMB_ENODEVICE));
		return;
	}
	c = conn_alloc(rt, true);
	if (!c) {
		reject(t->id, emb_strerror(-ENOMEM));
		return;
	}
	c->on_request = t->on_request;
	c->on_open = t->on_open;
	c->on_close = t->on_close;
	c->arg = t->arg;
	addr_str(rdma_get_peer_addr(t->id), c->base.peer, sizeof(c->base.peer));
	rc = conn_setup(c, t->id);
	if (rc) {
		reject(t->id, emb_strerror(rc));
		free(c);
		return;
	}
	hello_fill(c, &h);
	prm.private_data = &h;
	prm.private_data_len = sizeof(h);
	prm.initiator_depth = t->resp_res < rt->rd_atom ? t->resp_res
							: rt->rd_atom;
	prm.responder_resources = rt->rd_atom;
	prm.retry_count = 7;
	prm.rnr_retry_count = 7;
	if (rdma_accept(t->id, &prm)) {
		rc = -errno;
		emb_log(EMB_LOG_WARN, "rdma: accept from %s: %s", c->base.peer,
			emb_strerror(rc));
		conn_free_res(c);
		t->id->context = NULL;
		rdma_reject(t->id, NULL, 0);
		rdma_destroy_id(t->id);
		free(c);
	}
}

static void accept_task_run(void *arg)
{
	struct accept_task *t = arg;
	struct emb_rdma_transport *rt = emb__rdma_tr_of(t->tr);

	if (rt->dying) {
		reject(t->id, "loop shutting down");
	} else if (rdma_migrate_id(t->id, rt->ev_ch)) {
		reject(t->id, emb_strerror(-errno));
	} else {
		accept_on(rt, t);
	}
	free(t);
}

static void on_connect_request(struct emb_rdma_listener *l,
			       struct rdma_cm_id *id,
			       const struct emb_rdma_hello *h, int hello_rc,
			       uint8_t resp_res)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(l->base.tr);
	struct accept_task t = {
		.id = id,
		.hello = *h,
		.resp_res = resp_res,
		.tr = l->base.tr,
		.on_request = l->on_request,
		.on_open = l->on_open,
		.on_close = l->on_close,
		.arg = l->arg,
	};
	struct accept_task *tp;

	if (hello_rc) {
		reject(id, emb_strerror(hello_rc));
		return;
	}
	if (l->nloops)
		t.tr = l->loops[l->rr++ % l->nloops];
	if (t.tr == &rt->base) {
		accept_on(rt, &t);
		return;
	}
	tp = malloc(sizeof(*tp));
	if (!tp) {
		reject(id, emb_strerror(-ENOMEM));
		return;
	}
	*tp = t;
	if (emb_transport_exec(t.tr, accept_task_run, tp)) {
		free(tp);
		reject(id, emb_strerror(-ENOMEM));
	}
}

/* ---- rdma_cm events ----------------------------------------------------- */

static bool is_listener(struct emb_rdma_transport *rt, void *ctx)
{
	for (struct emb_rdma_listener *l = rt->listeners; l; l = l->next)
		if (l == ctx)
			return true;
	return false;
}

static void device_removed(struct emb_rdma_transport *rt)
{
	/* Every cm_id on the device reports it; say it once per loop. */
	if (!rt->dev_gone)
		emb_log(EMB_LOG_ERROR, "rdma: device %s removed; closing every "
			"conn", ibv_get_device_name(rt->verbs->device));
	rt->dev_gone = true;
	for (uint32_t i = 0; i < rt->nconns; i++)
		if (rt->conns[i])
			conn_fail(rt->conns[i], -ENODEV);
}

static int cm_events(struct emb_rdma_transport *rt)
{
	struct rdma_cm_event *ev;
	int n = 0;

	while (rdma_get_cm_event(rt->ev_ch, &ev) == 0) {
		enum rdma_cm_event_type type = ev->event;
		struct rdma_cm_id *id = ev->id;
		void *lctx = ev->listen_id ? ev->listen_id->context : NULL;
		struct emb_rdma_hello h = {0};
		uint8_t resp_res = ev->param.conn.responder_resources;
		int hrc = 0;
		struct emb_rdma_conn *c;

		if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
			hrc = hello_check(ev->param.conn.private_data,
					  ev->param.conn.private_data_len, &h);
		/* Ack first: destroying an id waits for its events' acks. */
		rdma_ack_cm_event(ev);
		n++;
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			if (is_listener(rt, lctx))
				on_connect_request(lctx, id, &h, hrc, resp_res);
			else
				reject(id, "listener gone");
			continue;
		}
		if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
			device_removed(rt);
			continue;
		}
		if (!id->context || is_listener(rt, id->context))
			continue;
		c = id->context;
		switch (type) {
		case RDMA_CM_EVENT_ESTABLISHED:
			if (c->base.server && c->state != EMB_RDMA_CONN_DRAINING)
				conn_opened(c);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			if (c->state != EMB_RDMA_CONN_DRAINING)
				conn_fail(c, EMB_EPEERDEAD);
			break;
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_CONNECT_ERROR:
			conn_fail(c, -ECONNABORTED);
			break;
		default:
			break;
		}
	}
	return n;
}

/* ---- transport ---------------------------------------------------------- */

static int epoll_add(int epfd, int fd, uint32_t tag)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = tag};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

static void op_destroy(struct emb_transport *tr);

static int op_create(const struct emb_transport_opts *opts,
		       struct emb_transport **out)
{
	struct emb_rdma_transport *rt;
	struct ibv_device_attr attr;
	int rc, ndev = 0;

	rt = calloc(1, sizeof(*rt));
	if (!rt)
		return -ENOMEM;
	rt->epfd = -1;
	rc = emb__transport_init(&rt->base, &emb__rdma_ops, opts,
				 &rt->wake_fd);
	if (rc) {
		free(rt);
		return rc;
	}
	rt->conn_ops = &conn_ops;
	rt->devs = rdma_get_devices(&ndev);
	if (!rt->devs || ndev == 0) {
		emb_log(EMB_LOG_DEBUG, "rdma: no RDMA device");
		rc = -ENODEV;
		goto err;
	}
	rt->verbs = rt->devs[0];
	if (ibv_query_device(rt->verbs, &attr)) {
		rc = -ENODEV;
		goto err;
	}
	rt->max_sge = (uint32_t)attr.max_sge < EMB_RDMA_MAX_SGE
			      ? (uint32_t)attr.max_sge
			      : EMB_RDMA_MAX_SGE;
	rt->rd_atom = attr.max_qp_init_rd_atom < 16
			      ? (uint8_t)attr.max_qp_init_rd_atom
			      : 16;
	rt->cq_max = (uint32_t)attr.max_cqe;
	rt->cq_cap = rt->cq_max < 2048 ? rt->cq_max : 2048;
	rt->pd = ibv_alloc_pd(rt->verbs);
	rt->comp_ch = ibv_create_comp_channel(rt->verbs);
	if (!rt->pd || !rt->comp_ch) {
		rc = -ENOMEM;
		goto err;
	}
	rt->cq = ibv_create_cq(rt->verbs, (int)rt->cq_cap, rt, rt->comp_ch, 0);
	if (!rt->cq) {
		rc = -errno;
		goto err;
	}
	rt->ev_ch = rdma_create_event_channel();
	if (!rt->ev_ch) {
		rc = -errno;
		goto err;
	}
	rt->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (rt->epfd < 0) {
		rc = -errno;
		goto err;
	}
	rc = set_nonblock(rt->ev_ch->fd);
	if (!rc)
		rc = set_nonblock(rt->comp_ch->fd);
	if (!rc)
		rc = epoll_add(rt->epfd, rt->wake_fd, EV_WAKE);
	if (!rc)
		rc = epoll_add(rt->epfd, rt->ev_ch->fd, EV_CM);
	if (!rc)
		rc = epoll_add(rt->epfd, rt->comp_ch->fd, EV_CQ);
	if (rc)
		goto err;
	*out = &rt->base;
	return 0;

err:
	op_destroy(&rt->base);
	return rc;
}

/* Polls CQ and channels without sleeping until every conn is freed. */
static void drain_all(struct emb_rdma_transport *rt)
{
	uint64_t deadline = emb__now_ms() + DRAIN_WAIT_MS;
	bool left;

	for (;;) {
		emb__rdma_poll_cq(rt, 1024);
		cm_events(rt);
		run_closes(rt);
		left = false;
		for (uint32_t i = 0; i < rt->nconns; i++)
			left |= rt->conns[i] != NULL;
		if (!left || emb__now_ms() > deadline)
			break;
		usleep(1000);
	}
	for (uint32_t i = 0; i < rt->nconns; i++) {
		struct emb_rdma_conn *c = rt->conns[i];

		if (!c)
			continue;
		/* Held by the user or never drained: free it anyway. */
		emb_log(EMB_LOG_WARN, "rdma: conn %s freed undrained (%u "
			"requests held)", c->base.peer, c->held);
		c->sq_drained = c->user_gone = true;
		c->held = 0;
		c->busy = 0;
		conn_maybe_free(c);
	}
}

static void op_destroy(struct emb_transport *tr)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);

	rt->dying = true;
	if (tr->common)
		emb__transport_run_tasks(tr);
	for (uint32_t i = 0; i < rt->nconns; i++)
		if (rt->conns[i])
			conn_fail(rt->conns[i], EMB_ECLOSED);
	if (rt->cq)
		drain_all(rt);
	emb_log(EMB_LOG_DEBUG, "rdma: loop done: %llu responses bounced, %llu "
		"reply bytes staged, %llu one-off registrations",
		(unsigned long long)rt->bounced,
		(unsigned long long)rt->copied_bytes,
		(unsigned long long)rt->oneoff);
	for (uint32_t i = 0; i < rt->nmrs; i++) {
		emb_log(EMB_LOG_WARN, "rdma: %zu bytes at %p still registered "
			"at destroy", rt->mrs[i]->base.len,
			rt->mrs[i]->base.addr);
		ibv_dereg_mr(rt->mrs[i]->mr);
		free(rt->mrs[i]);
	}
	free(rt->mrs);
	free(rt->conns);
	if (rt->epfd >= 0)
		close(rt->epfd);
	if (rt->ev_ch)
		rdma_destroy_event_channel(rt->ev_ch);
	if (rt->cq)
		ibv_destroy_cq(rt->cq);
	if (rt->comp_ch)
		ibv_destroy_comp_channel(rt->comp_ch);
	if (rt->pd)
		ibv_dealloc_pd(rt->pd);
	if (rt->devs)
		rdma_free_devices(rt->devs);
	emb__transport_fini(tr);
	free(rt);
}

static int cq_event(struct emb_rdma_transport *rt)
{
	struct ibv_cq *cq;
	void *ctx;

	if (ibv_get_cq_event(rt->comp_ch, &cq, &ctx))
		return 0;
	ibv_ack_cq_events(cq, 1);
	rt->armed = false;
	return 1;
}

/* Bounded busy-poll: replies often come within microseconds. */
static int spin(struct emb_rdma_transport *rt)
{
	struct timespec t0, t1;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		n = emb__rdma_poll_cq(rt, 256);
		clock_gettime(CLOCK_MONOTONIC, &t1);
	} while (!n && (t1.tv_sec - t0.tv_sec) * 1000000000L +
				   (t1.tv_nsec - t0.tv_nsec) <
			   EMB_RDMA_SPIN_US * 1000L);
	return n;
}

/* Asks for a CQ event before sleeping; returns CQEs that beat the arming. */
static int arm(struct emb_rdma_transport *rt)
{
	if (rt->armed)
		return 0;
	ibv_req_notify_cq(rt->cq, 0);
	rt->armed = true;
	/* A CQE that came before arming raises no event. */
	return emb__rdma_poll_cq(rt, 256);
}

int emb__rdma_fd(struct emb_transport *tr)
{
	return emb__rdma_tr_of(tr)->epfd;
}

int emb__rdma_sleep_prep(struct emb_transport *tr, int *wait_ms)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	uint64_t now, next = UINT64_MAX;
	int n;

	n = spin(rt);
	if (!n)
		n = arm(rt);
	now = emb__now_ms();
	n += emb__rdma_timeouts(rt, now, &next);
	if (next != UINT64_MAX) {
		uint64_t left = next > now ? next - now : 0;

		if (*wait_ms < 0 || left < (uint64_t)*wait_ms)
			*wait_ms = (int)left;
	}
	return n;
}

static int op_poll(struct emb_transport *tr, int timeout_ms)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	struct epoll_event evs[4];
	uint64_t now, next = UINT64_MAX;
	int n, wait_ms, ne;

	n = emb__rdma_poll_cq(rt, 256);
	n += run_closes(rt);
	now = emb__now_ms();
	n += emb__rdma_timeouts(rt, now, &next);
	if (n == 0 && timeout_ms != 0)
		n = spin(rt);
	wait_ms = n ? 0 : timeout_ms;
	if (wait_ms != 0) {
		n += arm(rt);
		if (n)
			wait_ms = 0;
		if (next != UINT64_MAX && wait_ms != 0) {
			uint64_t left = next > now ? next - now : 0;

			if (wait_ms < 0 || left < (uint64_t)wait_ms)
				wait_ms = (int)left;
		}
	}
	ne = epoll_wait(rt->epfd, evs, 4, wait_ms);
	if (ne < 0)
		return errno == EINTR ? n : -errno;
	for (int i = 0; i < ne; i++) {
		switch (evs[i].data.u32) {
		case EV_WAKE:
			n += emb__transport_run_tasks(tr);
			break;
		case EV_CM:
			n += cm_events(rt);
			break;
		default:
			n += cq_event(rt);
			break;
		}
	}
	if (ne > 0) {
		n += emb__rdma_poll_cq(rt, 256);
		n += run_closes(rt);
		next = UINT64_MAX;
		n += emb__rdma_timeouts(rt, emb__now_ms(), &next);
	}
	return n;
}

/* ---- listeners ---------------------------------------------------------- */

static int op_listen(struct emb_transport *tr,
		       const struct emb_listen_opts *opts,
		       struct emb_listener **out)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct emb_rdma_listener *l;
	struct addrinfo *ai = NULL;
	char port[8];
	int rc;

	for (uint32_t i = 0; i < opts->nloops; i++)
		if (opts->loops[i]->ops != &emb__rdma_ops)
			return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->base.tr = tr;
	l->on_request = opts->on_request;
	l->on_open = opts->on_open;
	l->on_close = opts->on_close;
	l->arg = opts->arg;
	if (opts->nloops) {
		l->loops = calloc(opts->nloops, sizeof(*l->loops));
		if (!l->loops) {
			rc = -ENOMEM;
			goto err_free;
		}
		memcpy(l->loops, opts->loops, opts->nloops * sizeof(*l->loops));
		l->nloops = opts->nloops;
	}
	snprintf(port, sizeof(port), "%u", opts->port);
	rc = getaddrinfo(opts->host, port, &hints, &ai);
	if (rc) {
		rc = -EINVAL;
		goto err_free;
	}
	map_loopback(rt, ai->ai_addr);
	if (rdma_create_id(rt->ev_ch, &l->id, l, RDMA_PS_TCP)) {
		rc = -errno;
		goto err_free_ai;
	}
	if (rdma_bind_addr(l->id, ai->ai_addr) ||
	    rdma_listen(l->id, opts->backlog ? opts->backlog : 128)) {
		rc = -errno;
		goto err_destroy_id;
	}
	l->base.port = ntohs(rdma_get_src_port(l->id));
	emb_log(EMB_LOG_DEBUG, "rdma: listening on %s port %u over %u loop%s",
		opts->host, l->base.port, opts->nloops ? opts->nloops : 1,
		opts->nloops > 1 ? "s" : "");
	freeaddrinfo(ai);
	l->next = rt->listeners;
	rt->listeners = l;
	*out = &l->base;
	return 0;

err_destroy_id:
	rdma_destroy_id(l->id);
err_free_ai:
	emb_log(EMB_LOG_WARN, "rdma: listen on %s port %u: %s", opts->host,
		opts->port, emb_strerror(rc));
	freeaddrinfo(ai);
err_free:
	free(l->loops);
	free(l);
	return rc;
}

static void op_listener_destroy(struct emb_listener *base)
{
	struct emb_rdma_listener *l = (struct emb_rdma_listener *)base;
	struct emb_rdma_transport *rt = emb__rdma_tr_of(base->tr);
	struct emb_rdma_listener **pp = &rt->listeners;

	while (*pp && *pp != l)
		pp = &(*pp)->next;
	if (*pp)
		*pp = l->next;
	rdma_destroy_id(l->id);
	free(l->loops);
	free(l);
}

/* ---- connect ------------------------------------------------------------ */

/* Waits on a private channel for want; other events map to errors. */
static int wait_event(struct rdma_event_channel *ch, uint64_t deadline,
		      enum rdma_cm_event_type want, struct emb_rdma_hello *h)
{
	struct rdma_cm_event *ev;
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	enum rdma_cm_event_type got;
	int rc = 0;

	for (;;) {
		uint64_t now = emb__now_ms();

		if (now >= deadline)
			return -ETIMEDOUT;
		rc = poll(&pfd, 1, (int)(deadline - now));
		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rdma_get_cm_event(ch, &ev) == 0)
			break;
		if (errno != EAGAIN)
			return -errno;
	}
	got = ev->event;
	rc = 0;
	if (got == want && h)
		rc = hello_check(ev->param.conn.private_data,
				 ev->param.conn.private_data_len, h);
	rdma_ack_cm_event(ev);
	if (got == want)
		return rc;
	switch (got) {
	case RDMA_CM_EVENT_REJECTED:
		return -ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return -EHOSTUNREACH;
	case RDMA_CM_EVENT_UNREACHABLE:
		return -ETIMEDOUT;
	default:
		return -ECONNABORTED;
	}
}

static int op_connect(struct emb_transport *tr,
			const struct emb_connect_opts *opts,
			struct emb_conn **out)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICSERV};
	uint64_t deadline = emb__now_ms() + tr->opts.connect_timeout_ms;
	struct rdma_conn_param prm = {0};
	struct emb_rdma_hello h, peer;
	struct rdma_event_channel *ch;
	struct emb_rdma_conn *c;
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	char port[8];
	int rc;

	snprintf(port, sizeof(port), "%u", opts->port);
	if (getaddrinfo(opts->host, port, &hints, &ai))
		return -EINVAL;
	ch = rdma_create_event_channel();
	if (!ch) {
		rc = -errno;
		goto err_free_ai;
	}
	rc = set_nonblock(ch->fd);
	if (rc)
		goto err_destroy_ch;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		rc = -errno;
		goto err_destroy_ch;
	}
	map_loopback(rt, ai->ai_addr);
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, RESOLVE_MS)) {
		rc = -errno;
		goto err_destroy_id;
	}
	rc = wait_event(ch, deadline, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	if (rc)
		goto err_destroy_id;
	if (rdma_resolve_route(id, RESOLVE_MS)) {
		rc = -errno;
		goto err_destroy_id;
	}
	rc = wait_event(ch, deadline, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	if (rc)
		goto err_destroy_id;
	if (id->verbs != rt->verbs) {
		rc = EMB_ENODEVICE;
		goto err_destroy_id;
	}
	c = conn_alloc(rt, false);
	if (!c) {
		rc = -ENOMEM;
		goto err_destroy_id;
	}
	if (opts->call_timeout_ms)
		c->call_timeout_ms = opts->call_timeout_ms;
	c->on_close = opts->on_close;
	c->arg = opts->arg;
	addr_str(ai->ai_addr, c->base.peer, sizeof(c->base.peer));
	rc = conn_setup(c, id);
	if (rc)
		goto err_free_c;
	hello_fill(c, &h);
	prm.private_data = &h;
	prm.private_data_len = sizeof(h);
	prm.responder_resources = rt->rd_atom;
	prm.initiator_depth = rt->rd_atom;
	prm.retry_count = 7;
	prm.rnr_retry_count = 7;
	if (rdma_connect(id, &prm)) {
		rc = -errno;
		goto err_free_res;
	}
	rc = wait_event(ch, deadline, RDMA_CM_EVENT_ESTABLISHED, &peer);
	if (rc)
		goto err_free_res;
	if (rdma_migrate_id(id, rt->ev_ch)) {
		rc = -errno;
		goto err_free_res;
	}
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	c->peer_slots = peer.credits;
	c->credits = peer.credits < c->nslots ? peer.credits : c->nslots;
	c->state = EMB_RDMA_CONN_OPEN;
	c->opened = true;
	EMB__STAT_ADD(tr->stats.conns_opened, 1);
	emb_log(EMB_LOG_DEBUG, "rdma: connected to %s", c->base.peer);
	*out = &c->base;
	return 0;

err_free_res:
	/* Never connected, or the QP is useless: no CQE will name it. */
	conn_free_res(c);
err_free_c:
	free(c);
err_destroy_id:
	rdma_destroy_id(id);
err_destroy_ch:
	rdma_destroy_event_channel(ch);
err_free_ai:
	freeaddrinfo(ai);
	emb_log(EMB_LOG_DEBUG, "rdma: connect to %s port %u: %s", opts->host,
		opts->port, emb_strerror(rc));
	return rc;
}

static void op_conn_destroy(struct emb_conn *base)
{
	struct emb_rdma_conn *c = emb__rdma_conn_of(base);

	c->user_gone = true;
	if (c->state != EMB_RDMA_CONN_DRAINING)
		conn_fail(c, EMB_ECLOSED);
	close_list_remove(c);
	c->busy++;
	emb__rdma_fail_ops(c, EMB_ECLOSED);
	c->busy--;
	conn_maybe_free(c);
}

static void op_conn_close(struct emb_conn *base, int reason)
{
	struct emb_rdma_conn *c = emb__rdma_conn_of(base);

	if (c->state != EMB_RDMA_CONN_DRAINING)
		conn_fail(c, reason);
}

/* ---- memory registration ------------------------------------------------ */

static int op_reg_mem(struct emb_transport *tr, void *addr, size_t len,
			struct emb_mr **out)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	struct emb_rdma_mr *m;
	uint32_t i;

	if (rt->nmrs == rt->mrs_cap) {
		uint32_t cap = rt->mrs_cap ? 2 * rt->mrs_cap : 16;
		struct emb_rdma_mr **p = realloc(rt->mrs, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		rt->mrs = p;
		rt->mrs_cap = cap;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->mr = ibv_reg_mr(rt->pd, addr, len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	if (!m->mr) {
		int rc = errno ? -errno : -ENOMEM;

		free(m);
		return rc;
	}
	m->base.addr = addr;
	m->base.len = len;
	m->base.lkey = m->mr->lkey;
	m->base.rkey = m->mr->rkey;
	/* Keep the table sorted by start for the data path's search. */
	for (i = rt->nmrs; i > 0 && rt->mrs[i - 1]->base.addr > addr; i--)
		rt->mrs[i] = rt->mrs[i - 1];
	rt->mrs[i] = m;
	rt->nmrs++;
	*out = &m->base;
	return 0;
}

static void op_dereg_mem(struct emb_transport *tr, struct emb_mr *base)
{
	struct emb_rdma_transport *rt = emb__rdma_tr_of(tr);
	struct emb_rdma_mr *m = (struct emb_rdma_mr *)base;
	uint32_t i;

	for (i = 0; i < rt->nmrs && rt->mrs[i] != m; i++)
		;
	if (i == rt->nmrs)
		return;
	memmove(&rt->mrs[i], &rt->mrs[i + 1],
		(rt->nmrs - i - 1) * sizeof(*rt->mrs));
	rt->nmrs--;
	ibv_dereg_mr(m->mr);
	free(m);
}

const struct emb_transport_ops emb__rdma_ops = {
	.name = "rdma",
	.create = op_create,
	.destroy = op_destroy,
	.poll = op_poll,
	.listen = op_listen,
	.listener_destroy = op_listener_destroy,
	.connect = op_connect,
	.conn_destroy = op_conn_destroy,
	.conn_close = op_conn_close,
	.call = emb__rdma_call,
	.reply = emb__rdma_reply,
	.req_release = emb__rdma_req_release,
	.reg_mem = op_reg_mem,
	.dereg_mem = op_dereg_mem,
	.rkey_of = emb__rdma_rkey_of,
	.read = emb__rdma_read,
	.stats = emb__transport_stats_read,
	.fault_set = emb__transport_fault_arm,
};
