/*
 * src/transport/dual.c - "tcp,rdma": one event loop that drives a TCP and
 * an RDMA transport, so that a server listens on both at one port number
 * and a client picks per connection.
 *
 * The two transports stay whole: each keeps its conns, listeners, mailbox
 * and epoll fd, and a conn made here belongs to one of them (conn->tr), so
 * calls and replies go straight to that transport's ops. This file only
 * adds the loop around them (an outer epoll over their two fds and its own
 * wake-up fd), the listener pair, and the routing of connect and register.
 * Registrations go to the RDMA transport: its keys are what an RDMA conn
 * needs, and a TCP conn ignores keys.
 *
 * Threads: as transport.h. The two inner transports are polled only from
 * this loop's thread (a callback may poll one of them again, as any loop
 * allows); other threads reach them only through emb_transport_exec(),
 * which TCP and RDMA listeners use to hand accepted conns to a loop.
 */
#include "transport/transport_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

#define SUB_TCP	     0
#define SUB_RDMA     1
#define EV_WAKE	     2	/* epoll tag of our own wake-up fd */
#define LISTEN_TRIES 16 /* port-0 listens: TCP ports to try */

struct dual_tr {
	struct emb_transport base;    /* first member */
	struct emb_transport *sub[2]; /* SUB_TCP, SUB_RDMA */
	int first;		      /* sub a connect without via uses */
	int epfd;		      /* over the subs' fds and wake_fd */
	int wake_fd;		      /* emb_transport_exec() to this loop */
};

struct dual_listener {
	struct emb_listener base;  /* tr (the dual loop), port */
	struct emb_listener *l[2]; /* the TCP and the RDMA listener */
};

static struct dual_tr *to_dual(struct emb_transport *tr)
{
	return (struct dual_tr *)tr;
}

static bool dual_is(const struct emb_transport *tr)
{
	return tr->ops == &emb__dual_tcp_ops || tr->ops == &emb__dual_rdma_ops;
}

static void dual_destroy(struct emb_transport *tr);

static int epoll_add(int epfd, int fd, uint32_t tag)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = tag};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

static int dual_create(const struct emb_transport_ops *ops,
		       const struct emb_transport_opts *opts,
		       struct emb_transport **out)
{
	struct dual_tr *d;
	int rc;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->epfd = -1;
	rc = emb__transport_init(&d->base, ops, opts, &d->wake_fd);
	if (rc) {
		free(d);
		return rc;
	}
	d->first = ops == &emb__dual_rdma_ops ? SUB_RDMA : SUB_TCP;
	/* The filled-in copy: both see the same limits and budget. */
	rc = emb__tcp_ops.create(&d->base.opts, &d->sub[SUB_TCP]);
	if (!rc)
		rc = emb__rdma_ops.create(&d->base.opts, &d->sub[SUB_RDMA]);
	if (rc)
		goto err;
	d->sub[SUB_TCP]->owner = d->sub[SUB_RDMA]->owner = &d->base;
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (d->epfd < 0) {
		rc = -errno;
		goto err;
	}
	rc = epoll_add(d->epfd, d->wake_fd, EV_WAKE);
	if (!rc)
		rc = epoll_add(d->epfd, emb__tcp_fd(d->sub[SUB_TCP]), SUB_TCP);
	if (!rc)
		rc = epoll_add(d->epfd, emb__rdma_fd(d->sub[SUB_RDMA]),
			       SUB_RDMA);
	if (rc)
		goto err;
	*out = &d->base;
	return 0;

err:
	dual_destroy(&d->base);
	return rc;
}

static int create_tcp_first(const struct emb_transport_opts *opts,
			    struct emb_transport **out)
{
	return dual_create(&emb__dual_tcp_ops, opts, out);
}

static int create_rdma_first(const struct emb_transport_opts *opts,
			     struct emb_transport **out)
{
	return dual_create(&emb__dual_rdma_ops, opts, out);
}

static void dual_destroy(struct emb_transport *tr)
{
	struct dual_tr *d = to_dual(tr);

	/* Tasks first: they may still name conns of the two below. */
	if (tr->common)
		emb__transport_run_tasks(tr);
	for (int i = 0; i < 2; i++)
		if (d->sub[i])
			d->sub[i]->ops->destroy(d->sub[i]);
	if (d->epfd >= 0)
		close(d->epfd);
	emb__transport_fini(tr);
	free(d);
}

static int dual_poll(struct emb_transport *tr, int timeout_ms)
{
	struct dual_tr *d = to_dual(tr);
	struct epoll_event evs[3];
	int n = 0, ne, wait_ms = 0;

	for (int i = 0; i < 2; i++) {
		int rc = d->sub[i]->ops->poll(d->sub[i], 0);

		if (rc > 0)
			n += rc;
	}
	if (n == 0 && timeout_ms != 0) {
		wait_ms = timeout_ms;
		n += emb__tcp_sleep_prep(d->sub[SUB_TCP], &wait_ms);
		n += emb__rdma_sleep_prep(d->sub[SUB_RDMA], &wait_ms);
		if (n)
			wait_ms = 0;
	}
	ne = epoll_wait(d->epfd, evs, 3, wait_ms);
	if (ne < 0)
		return errno == EINTR ? n : -errno;
	for (int i = 0; i < ne; i++) {
		uint32_t tag = evs[i].data.u32;
		int rc;

		if (tag == EV_WAKE) {
			n += emb__transport_run_tasks(tr);
			continue;
		}
		rc = d->sub[tag]->ops->poll(d->sub[tag], 0);
		if (rc > 0)
			n += rc;
	}
	/* Woken by a deadline alone: the subs must see it pass. */
	if (ne == 0 && wait_ms != 0)
		for (int i = 0; i < 2; i++) {
			int rc = d->sub[i]->ops->poll(d->sub[i], 0);

			if (rc > 0)
				n += rc;
		}
	return n;
}

/* ---- listeners ------------------------------------------------------------
 */

/* The loops the listener hands conns to, as their TCP or RDMA halves. */
static int sub_loops(const struct emb_listen_opts *opts, int which,
		     struct emb_transport ***out)
{
	struct emb_transport **v;

	*out = NULL;
	if (!opts->nloops)
		return 0;
	v = calloc(opts->nloops, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (uint32_t i = 0; i < opts->nloops; i++) {
		if (!opts->loops[i] || !dual_is(opts->loops[i])) {
			free(v);
			return -EINVAL;
		}
		v[i] = to_dual(opts->loops[i])->sub[which];
	}
	*out = v;
	return 0;
}

static int dual_listen(struct emb_transport *tr,
		       const struct emb_listen_opts *opts,
		       struct emb_listener **out)
{
	struct dual_tr *d = to_dual(tr);
	struct emb_transport **tl = NULL, **rl = NULL;
	struct emb_listen_opts o = *opts;
	struct emb_transport *t = d->sub[SUB_TCP], *r = d->sub[SUB_RDMA];
	struct dual_listener *l;
	int rc;

	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	rc = sub_loops(opts, SUB_TCP, &tl);
	if (!rc)
		rc = sub_loops(opts, SUB_RDMA, &rl);
	if (rc)
		goto out;
	for (int tries = 0;; tries++) {
		o.port = opts->port;
		o.loops = tl;
		rc = t->ops->listen(t, &o, &l->l[SUB_TCP]);
		if (rc)
			break;
		/* One port number for both: what clients and the
		 * scheduler know is a single host:port. */
		o.port = emb_listener_port(l->l[SUB_TCP]);
		o.loops = rl;
		rc = r->ops->listen(r, &o, &l->l[SUB_RDMA]);
		if (!rc)
			break;
		t->ops->listener_destroy(l->l[SUB_TCP]);
		l->l[SUB_TCP] = NULL;
		/* A port TCP picked may be taken on the RDMA side: pick
		 * again. A port the caller chose is the caller's error. */
		if (rc != -EADDRINUSE || opts->port ||
		    tries + 1 >= LISTEN_TRIES)
			break;
	}
	if (rc)
		goto out;
	l->base.tr = tr;
	l->base.port = o.port;
	emb_log(EMB_LOG_DEBUG, "tcp,rdma: listening on %s port %u",
		opts->host ? opts->host : "*", l->base.port);
	*out = &l->base;
out:
	free(tl);
	free(rl);
	if (rc)
		free(l);
	return rc;
}

static void dual_listener_destroy(struct emb_listener *base)
{
	struct dual_listener *l = (struct dual_listener *)base;

	for (int i = 0; i < 2; i++)
		l->l[i]->tr->ops->listener_destroy(l->l[i]);
	free(l);
}

/* ---- conns and registrations ----------------------------------------------
 */

static int dual_connect(struct emb_transport *tr,
			const struct emb_connect_opts *opts,
			struct emb_conn **out)
{
	struct dual_tr *d = to_dual(tr);
	struct emb_connect_opts o = *opts;
	struct emb_transport *sub;

	if (!opts->via)
		sub = d->sub[d->first];
	else if (strcmp(opts->via, "tcp") == 0)
		sub = d->sub[SUB_TCP];
	else if (strcmp(opts->via, "rdma") == 0)
		sub = d->sub[SUB_RDMA];
	else
		return -EINVAL;
	o.via = NULL;
	return sub->ops->connect(sub, &o, out);
}

static int dual_reg_mem(struct emb_transport *tr, void *addr, size_t len,
			struct emb_mr **out)
{
	struct emb_transport *r = to_dual(tr)->sub[SUB_RDMA];

	return r->ops->reg_mem(r, addr, len, out);
}

static void dual_dereg_mem(struct emb_transport *tr, struct emb_mr *mr)
{
	struct emb_transport *r = to_dual(tr)->sub[SUB_RDMA];

	r->ops->dereg_mem(r, mr);
}

static int dual_rkey_of(struct emb_transport *tr, const void *addr,
			size_t len, uint32_t *rkey)
{
	struct emb_transport *r = to_dual(tr)->sub[SUB_RDMA];

	return emb_transport_rkey(r, addr, len, rkey);
}

/* The counters of the two added up. */
static void dual_stats(const struct emb_transport *tr,
		       struct emb_transport_stats *out)
{
	const struct dual_tr *d = (const struct dual_tr *)tr;
	struct emb_transport_stats s[2];
	uint64_t *o = (uint64_t *)out;

	d->sub[SUB_TCP]->ops->stats(d->sub[SUB_TCP], &s[0]);
	d->sub[SUB_RDMA]->ops->stats(d->sub[SUB_RDMA], &s[1]);
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		o[i] = ((uint64_t *)&s[0])[i] + ((uint64_t *)&s[1])[i];
	/* A peak is not a count: the larger of the two. */
	out->out_queue_peak = s[0].out_queue_peak > s[1].out_queue_peak
				  ? s[0].out_queue_peak
				  : s[1].out_queue_peak;
}

static void dual_fault_set(struct emb_transport *tr,
			   enum emb_fault_point point, uint32_t nth, int rc)
{
	struct dual_tr *d = to_dual(tr);

	/* Armed here for the shims on this loop, which count registering,
	 * connecting and listening; sends and I/O are counted where the
	 * conn lives, in the two below. */
	emb__transport_fault_arm(tr, point, nth, rc);
	if (point != EMB_FAULT_SEND && point != EMB_FAULT_IO)
		return;
	for (int i = 0; i < 2; i++)
		d->sub[i]->ops->fault_set(d->sub[i], point, nth, rc);
}

/*
 * The conn and req ops are never reached: every conn belongs to the TCP
 * or the RDMA transport, whose own ops the shims call.
 */
const struct emb_transport_ops emb__dual_tcp_ops = {
    .name = "tcp,rdma",
    .create = create_tcp_first,
    .destroy = dual_destroy,
    .poll = dual_poll,
    .listen = dual_listen,
    .listener_destroy = dual_listener_destroy,
    .connect = dual_connect,
    .reg_mem = dual_reg_mem,
    .dereg_mem = dual_dereg_mem,
    .rkey_of = dual_rkey_of,
    .stats = dual_stats,
    .fault_set = dual_fault_set,
};

const struct emb_transport_ops emb__dual_rdma_ops = {
    .name = "rdma,tcp",
    .create = create_rdma_first,
    .destroy = dual_destroy,
    .poll = dual_poll,
    .listen = dual_listen,
    .listener_destroy = dual_listener_destroy,
    .connect = dual_connect,
    .reg_mem = dual_reg_mem,
    .dereg_mem = dual_dereg_mem,
    .rkey_of = dual_rkey_of,
    .stats = dual_stats,
    .fault_set = dual_fault_set,
};
