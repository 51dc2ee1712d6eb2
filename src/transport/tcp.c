/*
 * src/transport/tcp.c - the TCP transport: one level-triggered epoll loop per
 * struct emb_transport, non-blocking sockets with TCP_NODELAY.
 *
 * Sending: each frame is a queued struct tx that names its 32-byte header
 * (kept inside the tx) and the caller's iov; a flush gathers the queue into
 * one sendmsg() of up to IOV_MAX pieces, so pipelined frames leave in batches
 * and reply rows go from table memory to the socket without a staging copy.
 * Receiving: small frames are parsed out of a 64 KiB buffer; a payload that
 * still misses more than DIRECT_MIN bytes is read straight into its final
 * place (the caller's resp_buf or the request's buffer). A request's buffer
 * grows as its bytes arrive, never from the header's length alone, and
 * every receive byte is charged to opts.rx_budget: a peer that announces a
 * 64 MiB frame and sends nothing costs the server nothing. A server conn
 * reads headers into RBUF_SMALL bytes inside itself and takes a 64 KiB
 * buffer only once input comes faster than that holds; the buffer and the
 * pooled request buffers go back after IDLE_TRIM_MS without input (at once
 * while the budget is over half spent), so an idle conn holds no receive
 * memory and --max-conns, not the budget, bounds how many may wait. Until
 * emb_conn_admit() a server conn takes frames of login_frame_bytes at
 * most. A frame over the limit, one the budget cannot hold, one slower
 * than frame_timeout_ms, or any frame of a conn refused with
 * emb_conn_refuse(), is answered with an error (the frame that
 * opts.reject_encode writes; without one the conn just closes); then the
 * conn stops writing, discards what still comes for up to LINGER_MS (so the
 * peer gets the error instead of a reset) and closes.
 *
 * Nothing on the per-frame path allocates or logs once a conn is warm:
 * call slots are made CALL_CHUNK at a time, when every slot made is in
 * use (up to max_inflight), and kept; request records are pooled per
 * conn. Conns are never
 * freed while a poll runs, so a callback may close or destroy any conn.
 *
 * Threads: everything here runs on the loop's thread, except that accept
 * builds a conn for another loop and hands it over with emb_transport_exec().
 */
#include "transport/transport_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

#define RBUF_BYTES     (64u << 10)  /* receive buffer of a busy conn */
#define RBUF_SMALL     512u	    /* server conn's own, for headers */
#define IDLE_TRIM_MS   2000	    /* idle server conn frees its buffers */
#define DIRECT_MIN     (16u << 10)  /* read payloads this big in place */
#define READ_BUDGET    (4u << 20)   /* bytes read from one conn per event */
#define EVENTS_MAX     64	    /* epoll events taken per wait */
#define WIOV_MAX       1024	    /* pieces per sendmsg (Linux IOV_MAX) */
#define REQ_BUF_KEEP   (16u << 20)  /* request buffers above this are freed */
#define REQ_POOL_MAX   (64u << 20)  /* buffer bytes pooled per conn at most */
#define REQ_FIT_LOOK   64	    /* pooled requests req_get() looks at */
#define WORK_ROUNDS    64	    /* flush/kick rounds per poll */
#define PREFETCH_MAX   4096	    /* pieces up to this are prefetched */
#define PREFETCH_AHEAD 8	    /* pieces prefetched ahead of a copy */
#define STAGE_BYTES    (256u << 10) /* staging buffer per loop */
#define TX_IOV_INLINE  4	    /* iov entries a tx holds without heap */
#define TX_IOV_KEEP    8192	    /* bigger iov copies are freed on reuse */
#define GROW_MIN       (64u << 10)  /* first size of a growing request buffer */
#define LINGER_MS      1000	    /* rejected conn: wait for the peer's EOF */
#define REJECT_MSG_MAX 160	    /* bytes of a rejection's message */
/* Room for a rejection frame: the header, the message and 8 bytes of the
 * protocol's own (its ERROR payload adds a 4-byte length). */
#define REJECT_BYTES   (EMB_FRAME_HDR_SIZE + 8 + REJECT_MSG_MAX)

enum ep_kind {
	EP_WAKE,
	EP_LISTENER,
	EP_CONN,
};

/* What epoll_event.data.ptr points at: tells the event's owner. */
struct ep {
	enum ep_kind kind;
};

/*
 * One queued outgoing frame: our copy of the header, then our copy of the
 * caller's iov array (the memory it names stays the caller's).
 */
struct tx {
	struct tx *next;	  /* queue order */
	struct emb_frame_hdr hdr; /* sent first */
	const struct iovec *iov;  /* inl or heap */
	int niov;		  /* entries in iov */
	int heap_cap;		  /* entries at heap */
	struct iovec *heap;	  /* copies of arrays over TX_IOV_INLINE */
	struct iovec inl[TX_IOV_INLINE]; /* copies of short arrays */
	int idx;			 /* piece being sent; -1 = the header */
	size_t off;			 /* bytes of that piece already sent */
	uint64_t total;			 /* header + payload bytes */
	bool is_call; /* struct call (client) or tcp_req (server) */
};

/* A client call slot; req_id = generation << 32 | slot index. */
struct call {
	struct tx tx;	   /* the request frame */
	struct call *prev; /* pending list, in deadline order */
	struct call *next;
	uint64_t req_id;       /* id of the call now using the slot */
	uint64_t deadline_ms;  /* emb__now_ms() limit; UINT64_MAX = none */
	void *resp_buf;	       /* caller's buffer for the payload */
	size_t resp_cap;       /* bytes it holds */
	emb_call_done_fn done; /* completion */
	void *ctx;	       /* passed to done */
	uint32_t next_free;    /* free list link (slot index) */
	bool pending;	       /* a call uses the slot */
	bool queued;	       /* tx still in the out queue */
	bool receiving;	       /* its response is being read */
};

/*
 * Call slots are made this many at a time. A client conn holds the most
 * calls it ever had in flight at once, not max_inflight: a worker of a
 * job of 100 servers with 1024 slots made up front held 24 MiB of them
 * (about 240 B a slot), and 900 such workers a machine's 21 GiB.
 */
#define CALL_CHUNK 64u

/* A server request record, pooled per conn. */
struct tcp_req {
	struct emb_req base;	   /* conn, hdr, payload */
	struct tx tx;		   /* the reply frame */
	struct tcp_req *next_free; /* pool link */
	void *buf;		   /* payload storage, reused */
	size_t buf_cap;		   /* bytes at buf */
	emb_send_done_fn done;	   /* reply completion, may be NULL */
	void *ctx;		   /* passed to done */
};

enum rx_state {
	RX_HDR,	    /* collecting a header */
	RX_BODY,    /* payload goes to dst */
	RX_DISCARD, /* payload is read and dropped */
};

struct tcp_conn {
	struct emb_conn base;
	struct ep ep;
	struct tcp_conn *prev; /* tr's list of all conns */
	struct tcp_conn *next;
	struct tcp_conn *dirty_next; /* tr->dirty: output not tried yet */
	struct tcp_conn *kick_next;  /* tr->kick: buffered input to parse */
	struct tcp_conn *dead_next;  /* tr->dead: free at end of poll */
	int fd;			     /* -1 once closed */
	uint32_t events;	     /* epoll mask now installed */
	int busy;		     /* > 0 while our code is on its stack */
	int close_reason;	     /* why it closed; 0 = local */
	bool dirty;		     /* on tr->dirty */
	bool kicked;		     /* on tr->kick */
	bool dead;		     /* on tr->dead */
	bool closed;		     /* socket closed, calls failed */
	bool destroyed;		     /* client: emb_conn_destroy() called */
	bool want_out;		     /* EPOLLOUT wanted: socket was full */
	bool rx_paused;		     /* not reading: output over bound */
	bool in_rx;		     /* conn_rx/rx_parse on the stack */
	bool in_flush;		     /* conn_flush on the stack */
	bool rejecting;		     /* error queued: discard input, close */
	bool refusing;		     /* emb_conn_refuse(): answer the next
					header with refuse_msg */
	int reject_status;	     /* the error sent, the close reason */
	uint64_t linger_ms;	     /* rejecting or refusing: close by this
					emb__now_ms */
	uint64_t rx_ms;		     /* emb__now_ms of the last input */
	uint64_t frame_ms;	     /* first byte of the frame being read
					(or a later resume of reading) */
	uint32_t frame_max;	     /* largest frame taken now, bytes */
	emb_conn_fn on_close;	     /* user callback, may be NULL */
	void *arg;		     /* for on_close / on_request */

	/* output */
	struct tx *txq_head; /* oldest unsent frame */
	struct tx *txq_tail;

	/* input */
	char *rbuf;	 /* rbuf_cap bytes: rsmall, or RBUF_BYTES of heap */
	size_t rbuf_cap; /* RBUF_SMALL or RBUF_BYTES */
	size_t rstart;	 /* first unparsed byte in rbuf */
	size_t rend;   /* end of valid bytes in rbuf */
	enum rx_state rstate;
	struct emb_frame_hdr rhdr; /* header of the frame being read */
	char *dst;		   /* RX_BODY: where the payload goes */
	size_t need;		   /* payload bytes still to come */
	size_t rgot;		   /* server: payload bytes stored so far */
	struct call *rcall;	   /* client: call being received into */
	struct tcp_req *rreq;	   /* server: request being read */

	/* client */
	struct call **chunks;	/* slots, CALL_CHUNK to a chunk, made as
				   needed: [0, made) exist */
	uint32_t ncalls;	/* max_inflight: slots at most */
	uint32_t made;		/* slots made so far */
	uint32_t free_head;	/* first free slot; ncalls = none */
	struct call *pend_head; /* oldest pending call */
	struct call *pend_tail;
	uint32_t timeout_ms; /* per call; 0 = none */

	/* server */
	emb_request_fn on_request;
	struct tcp_req *req_free; /* pooled request records */
	uint32_t held;		  /* requests not yet replied and sent */
	uint64_t pool_bytes;	  /* buffer bytes of pooled requests */
	_Alignas(8) char rej[REJECT_BYTES]; /* the rejection frame, while
					       it is sent */
	char refuse_msg[REJECT_MSG_MAX];    /* refusing: why */
	_Alignas(8) char rsmall[RBUF_SMALL]; /* server conns' rbuf while
						input is slow or idle */
};

struct tcp_listener {
	struct emb_listener base;
	struct ep ep;
	struct tcp_listener *dead_next; /* tr->dead_listeners */
	bool dead;			/* destroyed; freed after this poll */
	int fd;
	int spare_fd;		      /* /dev/null, given up when out of fds */
	struct emb_transport **loops; /* accepted conns go round-robin here */
	uint32_t nloops;
	uint32_t rr; /* next loop index */
	emb_request_fn on_request;
	emb_conn_fn on_open;
	emb_conn_fn on_close;
	void *arg;
};

struct tcp_tr {
	struct emb_transport base;
	struct ep wake_ep;
	int epfd;
	int wake_fd;
	int in_poll;		  /* > 0: defer frees to the end */
	uint64_t ncb;		  /* user callbacks run, ever */
	uint64_t last_timeout_ms; /* last time call deadlines were checked */
	struct tcp_conn *conns;	  /* every conn not yet freed */
	struct tcp_conn *dirty;	  /* conns with output to try */
	struct tcp_conn *kick;	  /* conns with buffered input to parse */
	struct tcp_conn *dead;	  /* conns to free */
	struct tcp_listener *dead_listeners;
	struct iovec wiov[WIOV_MAX]; /* sendmsg scratch */
	char *stage;		     /* STAGE_BYTES, if copy_max_bytes */
};

static inline struct tcp_tr *to_tr(struct emb_transport *tr)
{
	return emb__container_of(tr, struct tcp_tr, base);
}

static inline struct tcp_conn *to_conn(struct emb_conn *c)
{
	return emb__container_of(c, struct tcp_conn, base);
}

static inline struct tcp_tr *conn_tr(struct tcp_conn *c)
{
	return to_tr(c->base.tr);
}

static void conn_fail(struct tcp_conn *c, int reason);
static void tx_trim(struct tx *tx);
static void rx_parse(struct tcp_tr *t, struct tcp_conn *c);
static void conn_reject(struct tcp_tr *t, struct tcp_conn *c, int status,
			const char *msg);

/* ---- small helpers ------------------------------------------------------- */

static void conn_arm(struct tcp_tr *t, struct tcp_conn *c)
{
	struct epoll_event ev;
	uint32_t want =
	    (c->rx_paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);

	if (c->closed || want == c->events)
		return;
	ev.events = want;
	ev.data.ptr = &c->ep;
	if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) {
		conn_fail(c, -errno);
		return;
	}
	c->events = want;
}

static void conn_mark_dirty(struct tcp_tr *t, struct tcp_conn *c)
{
	if (c->dirty || c->want_out)
		return;
	c->dirty = true;
	c->dirty_next = t->dirty;
	t->dirty = c;
}

static void conn_kick(struct tcp_tr *t, struct tcp_conn *c)
{
	if (c->kicked)
		return;
	c->kicked = true;
	c->kick_next = t->kick;
	t->kick = c;
}

static void conn_reap(struct tcp_tr *t, struct tcp_conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	c->dead_next = t->dead;
	t->dead = c;
}

/* Server backpressure: stop reading while output or held requests pile up. */
static void rx_update(struct tcp_tr *t, struct tcp_conn *c)
{
	bool pause;

	if (!c->base.server || c->closed)
		return;
	pause = c->base.stats.out_queued > t->base.opts.out_queue_max ||
		c->held >= t->base.opts.max_inflight;
	if (pause == c->rx_paused)
		return;
	c->rx_paused = pause;
	c->base.stats.rx_paused = pause;
	if (pause) {
		EMB__STAT_ADD(t->base.stats.rx_pauses, 1);
	} else {
		/* The time we did not read is ours, not the sender's. */
		c->frame_ms = emb__now_ms();
		if (c->rend > c->rstart)
			conn_kick(t, c); /* buffered frames get no EPOLLIN */
	}
	conn_arm(t, c);
}

static void set_peer(struct tcp_conn *c, const struct sockaddr *sa,
		     socklen_t len)
{
	char host[48], serv[8]; /* numeric: INET6_ADDRSTRLEN, a port */

	if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		snprintf(c->base.peer, sizeof(c->base.peer), "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(c->base.peer, sizeof(c->base.peer), "[%s]:%s", host,
			 serv);
	else
		snprintf(c->base.peer, sizeof(c->base.peer), "%s:%s", host,
			 serv);
}

static void sock_tune(struct emb_transport *tr, int fd)
{
	int one = 1, sz = (int)tr->opts.sock_buf_bytes;

	/* Failures only cost latency or throughput, never correctness. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (sz > 0) {
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	}
}

/* ---- receive budget ------------------------------------------------------ */

/* Charges n receive bytes to the shared budget; false if it would pass. */
static bool budget_take(struct emb_transport *tr, size_t n)
{
	struct emb_buf_budget *b = tr->opts.rx_budget;
	uint64_t used;

	if (!b || !n)
		return true;
	used = __atomic_add_fetch(&b->used, n, __ATOMIC_RELAXED);
	if (b->limit && used > b->limit) {
		__atomic_fetch_sub(&b->used, n, __ATOMIC_RELAXED);
		return false;
	}
	return true;
}

static void budget_give(struct emb_transport *tr, size_t n)
{
	struct emb_buf_budget *b = tr->opts.rx_budget;

	if (b && n)
		__atomic_fetch_sub(&b->used, n, __ATOMIC_RELAXED);
}

/* Over half the budget spent: pooled buffers go back instead of staying. */
static bool budget_tight(struct emb_transport *tr)
{
	struct emb_buf_budget *b = tr->opts.rx_budget;

	return b && b->limit &&
	       __atomic_load_n(&b->used, __ATOMIC_RELAXED) > b->limit / 2;
}

/* ---- idle conns give their receive memory back (server) ------------------ */

/* Nothing half-read and nothing buffered: its buffers may go. */
static bool conn_between_frames(const struct tcp_conn *c)
{
	return c->rstate == RX_HDR && c->rstart == c->rend && !c->in_rx;
}

static bool conn_holds_buffers(const struct tcp_conn *c)
{
	return c->rbuf != c->rsmall || c->req_free;
}

/*
 * A server conn between frames frees its big read buffer (headers go to
 * rsmall again) and every pooled request record with its buffer; the next
 * busy spell takes them again. Held requests are the server's and stay.
 */
static void conn_trim(struct tcp_tr *t, struct tcp_conn *c)
{
	struct tcp_req *r;

	if (c->rbuf != c->rsmall) {
		budget_give(&t->base, c->rbuf_cap);
		free(c->rbuf);
		c->rbuf = c->rsmall;
		c->rbuf_cap = RBUF_SMALL;
		c->rstart = c->rend = 0;
	}
	while ((r = c->req_free)) {
		c->req_free = r->next_free;
		budget_give(&t->base, r->buf_cap);
		free(r->tx.heap);
		free(r->buf);
		free(r);
	}
	c->pool_bytes = 0;
	EMB__STAT_ADD(t->base.stats.rx_trims, 1);
}

/*
 * The budget is spent: every conn of this loop that sits between frames
 * gives its buffers back now rather than at its idle deadline. True if
 * any did. (Other loops' idle conns give theirs within IDLE_TRIM_MS.)
 */
static bool trim_idle(struct tcp_tr *t)
{
	bool any = false;

	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (!c->base.server || c->closed || c->busy ||
		    !conn_between_frames(c) || !conn_holds_buffers(c))
			continue;
		conn_trim(t, c);
		any = true;
	}
	return any;
}

/*
 * Input comes faster than RBUF_SMALL holds: take the big buffer, if the
 * budget allows (the small one still works, with more reads).
 */
static void rbuf_grow(struct tcp_tr *t, struct tcp_conn *c)
{
	size_t have = c->rend - c->rstart;
	char *p;

	if (!budget_take(&t->base, RBUF_BYTES))
		return;
	p = malloc(RBUF_BYTES);
	if (!p) {
		budget_give(&t->base, RBUF_BYTES);
		return;
	}
	memcpy(p, c->rbuf + c->rstart, have);
	c->rbuf = p;
	c->rbuf_cap = RBUF_BYTES;
	c->rstart = 0;
	c->rend = have;
}

/* ---- request pool (server) ----------------------------------------------- */

/*
 * A request for a payload of len bytes: from the pool, among its first
 * REQ_FIT_LOOK, the smallest buffer that holds len, else the largest.
 * Pulls and pushes share a conn: a pull taking a push's big buffer, or a
 * push a pull's small one, would leave the next push a buffer to grow
 * (an allocation on a warm conn) whenever more records are pooled than
 * are looked at.
 */
static struct tcp_req *req_get(struct tcp_conn *c, size_t len)
{
	struct tcp_req **pp = &c->req_free, **fit = NULL, **big = pp, *r;

	for (int i = 0; *pp && i < REQ_FIT_LOOK; i++, pp = &(*pp)->next_free) {
		size_t cap = (*pp)->buf_cap;

		if (cap >= len && (!fit || cap < (*fit)->buf_cap))
			fit = pp;
		if (cap > (*big)->buf_cap)
			big = pp;
	}
	if (!fit)
		fit = big;
	r = *fit;
	if (r) {
		*fit = r->next_free;
		c->pool_bytes -= r->buf_cap;
	} else {
		r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
		r->base.conn = &c->base;
	}
	c->held++;
	c->base.stats.inflight = c->held;
	return r;
}

/*
 * Back to the pool. Buffers are kept (a 1 MiB push must not cost a fresh
 * mmap and its page faults every time) unless too big or the conn's pool
 * is full.
 */
static void req_put(struct tcp_conn *c, struct tcp_req *r)
{
	if (r->buf_cap > REQ_BUF_KEEP ||
	    c->pool_bytes + r->buf_cap > REQ_POOL_MAX ||
	    budget_tight(c->base.tr)) {
		budget_give(c->base.tr, r->buf_cap);
		free(r->buf);
		r->buf = NULL;
		r->buf_cap = 0;
	}
	r->base.payload = NULL;
	r->done = NULL;
	tx_trim(&r->tx);
	r->next_free = c->req_free;
	c->req_free = r;
	c->pool_bytes += r->buf_cap;
	c->held--;
	c->base.stats.inflight = c->held;
	if (c->closed) {
		if (c->held == 0)
			conn_reap(conn_tr(c), c);
	} else {
		rx_update(conn_tr(c), c);
	}
}

/* ---- calls (client) ------------------------------------------------------ */

static void pend_unlink(struct tcp_conn *c, struct call *call)
{
	if (call->prev)
		call->prev->next = call->next;
	else
		c->pend_head = call->next;
	if (call->next)
		call->next->prev = call->prev;
	else
		c->pend_tail = call->prev;
	call->prev = call->next = NULL;
}

/* The call slot i, which exists (i < c->made). */
static inline struct call *call_at(const struct tcp_conn *c, uint32_t i)
{
	return &c->chunks[i / CALL_CHUNK][i % CALL_CHUNK];
}

/*
 * Makes the next chunk of call slots and puts them on the free list,
 * which is empty (every slot made is in use). A slot's req_id keeps its
 * index in its low 32 bits for life. 0, EMB_ENOCREDIT (max_inflight slots
 * made and all in use) or -ENOMEM.
 */
static int calls_grow(struct tcp_conn *c)
{
	uint32_t n = c->ncalls - c->made, i;
	struct call *ch;

	if (!n)
		return EMB_ENOCREDIT;
	if (n > CALL_CHUNK)
		n = CALL_CHUNK;
	ch = calloc(n, sizeof(*ch)); /* the last chunk may be short */
	if (!ch)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		ch[i].next_free = i + 1 < n ? c->made + i + 1 : c->ncalls;
		ch[i].req_id = c->made + i;
		ch[i].tx.is_call = true;
	}
	c->chunks[c->made / CALL_CHUNK] = ch;
	c->free_head = c->made;
	c->made += n;
	return 0;
}

/* Frees a client conn's call slots and what their frames hold. */
static void calls_free(struct tcp_conn *c)
{
	for (uint32_t i = 0; i < c->made; i++)
		free(call_at(c, i)->tx.heap);
	for (uint32_t k = 0; c->chunks && k * CALL_CHUNK < c->made; k++)
		free(c->chunks[k]);
	free(c->chunks);
}

/* Frees the slot, then runs done: done may post a call into the same slot. */
static void call_finish(struct tcp_conn *c, struct call *call, int status,
			const struct emb_frame_hdr *resp)
{
	emb_call_done_fn done = call->done;
	void *ctx = call->ctx;

	pend_unlink(c, call);
	call->pending = false;
	call->receiving = false;
	call->queued = false;
	tx_trim(&call->tx);
	call->next_free = c->free_head;
	c->free_head = (uint32_t)call->req_id; /* low 32 bits: the slot */
	c->base.stats.inflight--;
	conn_tr(c)->ncb++;
	done(ctx, status, resp);
}

static void txq_unlink(struct tcp_conn *c, struct tx *tx)
{
	struct tx **pp = &c->txq_head, *prev = NULL;

	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		if (*pp != tx)
			continue;
		*pp = tx->next;
		if (c->txq_tail == tx)
			c->txq_tail = prev;
		tx->next = NULL;
		return;
	}
}

/* Fails expired calls; returns the earliest deadline still pending. */
static uint64_t conn_timeouts(struct tcp_tr *t, struct tcp_conn *c,
			      uint64_t now)
{
	struct call *call, *next;

	for (call = c->pend_head; call && !c->closed; call = next) {
		next = call->next;
		if (call->deadline_ms > now)
			return call->deadline_ms;
		if (call->receiving ||
		    (call->queued && c->txq_head == &call->tx &&
		     (call->tx.idx >= 0 || call->tx.off > 0))) {
			/* Half a frame is on the wire: only closing ends it. */
			EMB__STAT_ADD(t->base.stats.calls_timed_out, 1);
			conn_fail(c, -ETIMEDOUT);
			break;
		}
		if (call->queued) {
			txq_unlink(c, &call->tx);
			c->base.stats.out_queued -= call->tx.total;
		}
		EMB__STAT_ADD(t->base.stats.calls_timed_out, 1);
		call_finish(c, call, -ETIMEDOUT, NULL);
	}
	return UINT64_MAX;
}

/*
 * A frame began more than frame_timeout_ms ago and is still not whole: a
 * slow or stalled sender would hold its buffer (and a loop's attention)
 * for ever. Answered with -ETIMEDOUT when its header is known.
 */
static void frame_timeout(struct tcp_tr *t, struct tcp_conn *c)
{
	uint32_t ms = t->base.opts.frame_timeout_ms;
	char msg[REJECT_MSG_MAX];

	EMB__STAT_ADD(t->base.stats.frames_timed_out, 1);
	if (c->rstate == RX_HDR) {
		emb_log(EMB_LOG_WARN,
			"tcp: conn %s: frame header not whole within %u ms; "
			"closing",
			c->base.peer, ms);
		conn_fail(c, -ETIMEDOUT);
		return;
	}
	snprintf(msg, sizeof(msg),
		 "frame of %llu bytes not received within %g s "
		 "(--frame-timeout); %zu bytes still missing",
		 (unsigned long long)(EMB_FRAME_HDR_SIZE +
				      (uint64_t)c->rhdr.payload_len),
		 ms / 1000.0, c->need);
	conn_reject(t, c, -ETIMEDOUT, msg);
}

/*
 * Server conn: closes a frame too slow, or frees buffers idle too long.
 * Returns the next time it needs looking at; UINT64_MAX = none.
 */
static uint64_t server_timeouts(struct tcp_tr *t, struct tcp_conn *c,
				uint64_t now, bool tight)
{
	uint32_t fto = t->base.opts.frame_timeout_ms;
	uint64_t d;

	if (c->rstate != RX_HDR || c->rend > c->rstart) {
		/* Paused: we stopped reading, the sender did not stall. */
		if (!fto || c->rx_paused)
			return UINT64_MAX;
		d = c->frame_ms + fto;
		if (now < d || c->busy)
			return d;
		frame_timeout(t, c);
		return UINT64_MAX;
	}
	if (!conn_holds_buffers(c))
		return UINT64_MAX;
	d = tight ? now : c->rx_ms + IDLE_TRIM_MS;
	if (now < d)
		return d;
	if (!c->busy && conn_between_frames(c))
		conn_trim(t, c);
	return UINT64_MAX;
}

static uint64_t check_timeouts(struct tcp_tr *t)
{
	uint64_t now = emb__now_ms(), next = UINT64_MAX, d;
	bool tight = budget_tight(&t->base);
	struct tcp_conn *c;

	for (c = t->conns; c; c = c->next) {
		if ((c->rejecting || c->refusing) && !c->closed) {
			if (now >= c->linger_ms && !c->busy)
				conn_fail(c, c->reject_status);
			else if (c->linger_ms < next)
				next = c->linger_ms;
			continue;
		}
		if (c->closed)
			continue;
		if (c->base.server) {
			d = server_timeouts(t, c, now, tight);
			if (d < next)
				next = d;
			continue;
		}
		if (!c->pend_head)
			continue;
		d = c->busy ? c->pend_head->deadline_ms
			    : conn_timeouts(t, c, now);
		if (d < next)
			next = d;
	}
	t->last_timeout_ms = now;
	return next;
}

/* ---- close and free ------------------------------------------------------ */

static void conn_log_close(struct tcp_conn *c, int reason)
{
	if (reason == 0)
		emb_log(EMB_LOG_DEBUG, "tcp: conn %s closed", c->base.peer);
	else if (reason == EMB_EPEERDEAD && c->rstate == RX_HDR &&
		 c->rstart == c->rend)
		emb_log(EMB_LOG_DEBUG, "tcp: conn %s closed by peer",
			c->base.peer);
	else if (reason == EMB_EPEERDEAD)
		emb_log(EMB_LOG_WARN, "tcp: conn %s: peer closed mid-frame",
			c->base.peer);
	else
		emb_log(EMB_LOG_WARN, "tcp: conn %s closed: %s", c->base.peer,
			emb_strerror(reason));
}

/*
 * Closes the socket and fails everything queued on it: replies get their
 * done(status), calls complete with status, and on_close tells the user.
 * reason 0 is a local close (callbacks see EMB_ECLOSED). The memory stays
 * until it is safe to free (see conn_reap and the dead list).
 */
static void conn_fail(struct tcp_conn *c, int reason)
{
	struct tcp_tr *t = conn_tr(c);
	int status = reason ? reason : EMB_ECLOSED;
	struct tx *tx, *next;

	if (c->closed)
		return;
	c->closed = true;
	c->close_reason = reason;
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	EMB__STAT_ADD(t->base.stats.conns_closed, 1);
	/* EOF between frames is how a finished client says goodbye. */
	if (reason == EMB_EPEERDEAD && c->rstate == RX_HDR &&
	    c->rstart == c->rend)
		EMB__STAT_ADD(t->base.stats.peer_closes, 1);
	else if (reason == EMB_EPEERDEAD)
		EMB__STAT_ADD(t->base.stats.err_peer_closed, 1);
	else if (reason < 0 && reason > -4096 && reason != -ETIMEDOUT)
		EMB__STAT_ADD(t->base.stats.err_io, 1);
	conn_log_close(c, reason);

	c->busy++;
	if (c->rreq) {
		req_put(c, c->rreq);
		c->rreq = NULL;
	}
	c->rcall = NULL;
	c->rstate = RX_HDR;
	c->rstart = c->rend = 0;

	tx = c->txq_head;
	c->txq_head = c->txq_tail = NULL;
	c->base.stats.out_queued = 0;
	for (; tx; tx = next) {
		next = tx->next;
		if (tx->is_call) {
			emb__container_of(tx, struct call, tx)->queued = false;
		} else {
			struct tcp_req *r =
			    emb__container_of(tx, struct tcp_req, tx);

			if (r->done)
				r->done(r->ctx, status);
			req_put(c, r);
		}
	}
	while (c->pend_head)
		call_finish(c, c->pend_head, status, NULL);
	if (c->on_close && (c->base.server || reason))
		c->on_close(c->arg, &c->base, reason);
	c->busy--;
	if (c->base.server && c->held == 0)
		conn_reap(t, c);
}

static void list_drop(struct tcp_conn **head, struct tcp_conn *c,
		      size_t link_off)
{
	struct tcp_conn **pp = head;

	while (*pp) {
		struct tcp_conn **link =
		    (struct tcp_conn **)((char *)*pp + link_off);

		if (*pp == c) {
			*pp = *link;
			return;
		}
		pp = link;
	}
}

static void conn_free(struct tcp_tr *t, struct tcp_conn *c)
{
	struct tcp_req *r;

	if (c->dirty)
		list_drop(&t->dirty, c, offsetof(struct tcp_conn, dirty_next));
	if (c->kicked)
		list_drop(&t->kick, c, offsetof(struct tcp_conn, kick_next));
	if (c->dead)
		list_drop(&t->dead, c, offsetof(struct tcp_conn, dead_next));
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	while ((r = c->req_free)) {
		c->req_free = r->next_free;
		budget_give(&t->base, r->buf_cap);
		free(r->tx.heap);
		free(r->buf);
		free(r);
	}
	calls_free(c);
	if (c->rbuf != c->rsmall) {
		budget_give(&t->base, c->rbuf_cap);
		free(c->rbuf);
	}
	free(c);
}

static void reap(struct tcp_tr *t)
{
	struct tcp_conn *c, *keep = NULL, *next;
	struct tcp_listener *l;

	c = t->dead;
	t->dead = NULL;
	for (; c; c = next) {
		next = c->dead_next;
		c->dead = false;
		if (c->busy || (c->base.server && c->held)) {
			c->dead = true;
			c->dead_next = keep;
			keep = c;
			continue;
		}
		conn_free(t, c);
	}
	t->dead = keep;
	while ((l = t->dead_listeners)) {
		t->dead_listeners = l->dead_next;
		free(l->loops);
		free(l);
	}
}

/* ---- sending ------------------------------------------------------------- */

/* Copies iov[0..niov) into tx; returns the payload bytes or -ENOMEM. */
static int64_t tx_copy_iov(struct tx *tx, const struct iovec *iov, int niov)
{
	struct iovec *dst = tx->inl;
	uint64_t len = 0;

	if (niov > TX_IOV_INLINE) {
		if (niov > tx->heap_cap) {
			void *p =
			    realloc(tx->heap, (size_t)niov * sizeof(*iov));

			if (!p)
				return -ENOMEM;
			tx->heap = p;
			tx->heap_cap = niov;
		}
		dst = tx->heap;
	}
	for (int i = 0; i < niov; i++) {
		dst[i] = iov[i];
		len += iov[i].iov_len;
	}
	tx->iov = dst;
	tx->niov = niov;
	return (int64_t)(len < INT64_MAX ? len : INT64_MAX);
}

static void tx_trim(struct tx *tx)
{
	if (tx->heap_cap > TX_IOV_KEEP) {
		free(tx->heap);
		tx->heap = NULL;
		tx->heap_cap = 0;
	}
}

static void tx_enqueue(struct tcp_tr *t, struct tcp_conn *c, struct tx *tx)
{
	tx->next = NULL;
	tx->idx = -1;
	tx->off = 0;
	if (c->txq_tail)
		c->txq_tail->next = tx;
	else
		c->txq_head = tx;
	c->txq_tail = tx;
	c->base.stats.out_queued += tx->total;
	emb__stat_max(&t->base.stats.out_queue_peak, c->base.stats.out_queued);
	conn_mark_dirty(t, c);
}

/*
 * Asks for a piece's cache lines ahead of sendmsg. Reply rows are scattered
 * through table memory, and the kernel's copy would otherwise take one
 * cache miss at a time; prefetched, the misses overlap (about 1.5-2x on a
 * 1 MiB reply of 4096 rows).
 */
static inline void prefetch_piece(const char *p, size_t len)
{
	if (len > PREFETCH_MAX)
		return; /* big pieces stream well by themselves */
	for (size_t o = 0; o < len; o += 64)
		__builtin_prefetch(p + o);
}

struct gather {
	int n;	       /* entries used in t->wiov */
	size_t staged; /* bytes used in t->stage */
	size_t sum;    /* bytes gathered */
};

/*
 * Adds one piece to the sendmsg list; false when the list is full. With
 * copy_max_bytes set, pieces under it are copied into the staging buffer
 * and merged with their neighbours (see emb_transport_opts); else every
 * piece goes to the kernel as it is.
 */
static bool gather_piece(struct tcp_tr *t, struct gather *g, const char *p,
			 size_t len)
{
	struct iovec *last = g->n ? &t->wiov[g->n - 1] : NULL;
	char *dst;

	if (len >= t->base.opts.copy_max_bytes) {
		if (g->n == WIOV_MAX)
			return false;
		t->wiov[g->n++] =
		    (struct iovec){.iov_base = (void *)p, .iov_len = len};
		g->sum += len;
		return true;
	}
	if (g->staged + len > STAGE_BYTES)
		return false;
	dst = t->stage + g->staged;
	if (last && (char *)last->iov_base + last->iov_len == dst) {
		last->iov_len += len;
	} else {
		if (g->n == WIOV_MAX)
			return false;
		t->wiov[g->n++] =
		    (struct iovec){.iov_base = dst, .iov_len = len};
	}
	memcpy(dst, p, len);
	g->staged += len;
	g->sum += len;
	return true;
}

/* Gathers the out queue into t->wiov; returns the piece count. */
static int tx_gather(struct tcp_tr *t, struct tcp_conn *c, size_t *bytes)
{
	/* Copies need their lines a little ahead; the kernel's, all of them. */
	int ahead = t->stage ? PREFETCH_AHEAD : 0;
	struct gather g = {0};

	for (struct tx *tx = c->txq_head; tx; tx = tx->next) {
		size_t off = tx->off;
		int i = tx->idx;

		if (i < 0) {
			if (!gather_piece(t, &g, (char *)&tx->hdr + off,
					  EMB_FRAME_HDR_SIZE - off))
				break;
			i = 0;
			off = 0;
			for (int k = 0; k < ahead && k < tx->niov; k++)
				prefetch_piece(tx->iov[k].iov_base,
					       tx->iov[k].iov_len);
		}
		for (; i < tx->niov; i++, off = 0) {
			if (tx->iov[i].iov_len == off)
				continue;
			if (i + ahead < tx->niov)
				prefetch_piece(tx->iov[i + ahead].iov_base,
					       tx->iov[i + ahead].iov_len);
			if (!gather_piece(t, &g,
					  (char *)tx->iov[i].iov_base + off,
					  tx->iov[i].iov_len - off))
				goto out;
		}
	}
out:
	*bytes = g.sum;
	return g.n;
}

/* Moves the head frame on by up to *left bytes; true when it is all sent. */
static bool tx_advance(struct tx *tx, size_t *left)
{
	size_t r;

	if (tx->idx < 0) {
		r = EMB_FRAME_HDR_SIZE - tx->off;
		if (*left < r) {
			tx->off += *left;
			*left = 0;
			return false;
		}
		*left -= r;
		tx->idx = 0;
		tx->off = 0;
	}
	while (tx->idx < tx->niov) {
		r = tx->iov[tx->idx].iov_len - tx->off;
		if (*left < r) {
			tx->off += *left;
			*left = 0;
			return false;
		}
		*left -= r;
		tx->idx++;
		tx->off = 0;
	}
	return true;
}

static void tx_sent(struct tcp_tr *t, struct tcp_conn *c, size_t n)
{
	struct tx *tx;

	while ((tx = c->txq_head) && !c->closed) {
		if (!tx_advance(tx, &n))
			break;
		c->txq_head = tx->next;
		if (!c->txq_head)
			c->txq_tail = NULL;
		c->base.stats.frames_out++;
		EMB__STAT_ADD(t->base.stats.frames_out, 1);
		if (tx->is_call) {
			emb__container_of(tx, struct call, tx)->queued = false;
		} else {
			struct tcp_req *r =
			    emb__container_of(tx, struct tcp_req, tx);

			if (r->done) {
				t->ncb++;
				r->done(r->ctx, 0);
			}
			req_put(c, r);
		}
	}
	/* The rejection is out: a FIN tells the peer nothing else comes. */
	if (c->rejecting && !c->txq_head && !c->closed)
		(void)shutdown(c->fd, SHUT_WR);
}

static void conn_flush(struct tcp_tr *t, struct tcp_conn *c)
{
	struct msghdr msg;
	size_t bytes;
	ssize_t n;
	int cnt, rc;

	if (c->closed)
		return;
	if (c->in_flush) {
		/*
		 * A callback of this flush polled the loop again: frames the
		 * kernel already took are still queued, so only the outer
		 * flush may go on. Try again after it.
		 */
		conn_mark_dirty(t, c);
		return;
	}
	c->busy++;
	c->in_flush = true;
	while (c->txq_head && !c->closed) {
		cnt = tx_gather(t, c, &bytes);
		if (bytes == 0) {
			tx_sent(t, c, 0); /* frames with nothing left */
			continue;
		}
		rc = emb__fault_hit(&t->base, EMB_FAULT_IO);
		if (rc) {
			conn_fail(c, rc);
			break;
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = t->wiov;
		msg.msg_iovlen = (size_t)cnt;
		n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				c->want_out = true;
				break;
			}
			conn_fail(c, errno == EPIPE || errno == ECONNRESET
					 ? EMB_EPEERDEAD
					 : -errno);
			break;
		}
		c->base.stats.bytes_out += (uint64_t)n;
		c->base.stats.out_queued -= (uint64_t)n;
		EMB__STAT_ADD(t->base.stats.bytes_out, (uint64_t)n);
		tx_sent(t, c, (size_t)n);
		if ((size_t)n < bytes) {
			/* The socket buffer is full; EPOLLOUT says when not. */
			c->want_out = true;
			break;
		}
	}
	c->in_flush = false;
	if (!c->txq_head)
		c->want_out = false;
	if (!c->closed) {
		conn_arm(t, c);
		rx_update(t, c);
	}
	c->busy--;
}

/* ---- receiving ----------------------------------------------------------- */

/*
 * Server: answers the frame being read (c->rhdr) with status and msg, then
 * reads and drops everything else until the peer closes or LINGER_MS pass.
 * Closing at once would make the kernel reset the connection over the
 * unread input, and a reset may destroy the error before the peer reads it.
 */
static void conn_reject(struct tcp_tr *t, struct tcp_conn *c, int status,
			const char *msg)
{
	struct tcp_req *r = c->rreq;
	int len;

	c->rreq = NULL;
	if (!r)
		r = req_get(c, 0);
	if (!r) {
		conn_fail(c, status);
		return;
	}
	/* The layer above writes the error; the transport knows no
	 * payload. Without an encoder the conn closes without a reply. */
	len = t->base.opts.reject_encode
		  ? t->base.opts.reject_encode(c->rej, sizeof(c->rej),
					       &c->rhdr, status, msg)
		  : -EOPNOTSUPP;
	if (len < (int)EMB_FRAME_HDR_SIZE || len > (int)sizeof(c->rej)) {
		req_put(c, r);
		conn_fail(c, status);
		return;
	}
	emb_log(EMB_LOG_WARN, "tcp: conn %s: %s; closing", c->base.peer, msg);
	r->base.hdr = c->rhdr;
	r->base.payload = NULL;
	emb_frame_hdr_decode(c->rej, &r->tx.hdr);
	r->tx.inl[0] = (struct iovec){.iov_base = c->rej + EMB_FRAME_HDR_SIZE,
				      .iov_len = (size_t)len -
						 EMB_FRAME_HDR_SIZE};
	r->tx.iov = r->tx.inl;
	r->tx.niov = 1;
	r->tx.total = (uint64_t)len;
	r->tx.is_call = false;
	r->done = NULL;
	c->rejecting = true;
	c->reject_status = status;
	c->linger_ms = emb__now_ms() + LINGER_MS;
	c->rstate = RX_DISCARD;
	c->need = SIZE_MAX;
	tx_enqueue(t, c, &r->tx);
}

/*
 * Bytes the payload being read may store at c->dst now. A server's request
 * buffer grows (doubling from GROW_MIN, at most to 5/4 of the payload's)
 * only when the bytes that fill it have arrived, each growth charged to
 * the budget. 0 when the conn was rejected or failed instead.
 */
static size_t rx_room(struct tcp_tr *t, struct tcp_conn *c)
{
	struct tcp_req *r = c->rreq;
	size_t len = c->rhdr.payload_len, cap;
	char msg[REJECT_MSG_MAX];
	void *p;

	if (!c->base.server || c->rstate != RX_BODY)
		return c->need;
	if (r->buf_cap > c->rgot)
		return r->buf_cap - c->rgot < c->need ? r->buf_cap - c->rgot
						      : c->need;
	cap = r->buf_cap > GROW_MIN / 2 ? 2 * r->buf_cap : GROW_MIN;
	/* A quarter more than this payload: batches of a job vary by a few
	 * percent, and a pooled buffer grown to one exact length would be
	 * grown again by the next slightly larger one. */
	if (cap > len + len / 4)
		cap = ((len + len / 4) + 4095) & ~(size_t)4095;
	if (!budget_take(&t->base, cap - r->buf_cap) &&
	    (!trim_idle(t) || !budget_take(&t->base, cap - r->buf_cap))) {
		struct emb_buf_budget *b = t->base.opts.rx_budget;

		__atomic_fetch_add(&b->refused, 1, __ATOMIC_RELAXED);
		EMB__STAT_ADD(t->base.stats.err_no_memory, 1);
		snprintf(msg, sizeof(msg),
			 "server receive memory full (%llu bytes in use by "
			 "connections)",
			 (unsigned long long)__atomic_load_n(&b->used,
							     __ATOMIC_RELAXED));
		conn_reject(t, c, EMB_EMEMLIMIT, msg);
		return 0;
	}
	p = realloc(r->buf, cap);
	if (!p) {
		budget_give(&t->base, cap - r->buf_cap);
		conn_fail(c, -ENOMEM);
		return 0;
	}
	r->buf = p;
	r->buf_cap = cap;
	c->dst = (char *)p + c->rgot;
	return cap - c->rgot < c->need ? cap - c->rgot : c->need;
}

static void frame_end(struct tcp_tr *t, struct tcp_conn *c)
{
	enum rx_state st = c->rstate;

	c->rstate = RX_HDR;
	/* The next frame began no earlier than the input that ended this
	 * one (a resume after a pause may have set a later start). */
	if (c->rx_ms > c->frame_ms)
		c->frame_ms = c->rx_ms;
	c->base.stats.frames_in++;
	EMB__STAT_ADD(t->base.stats.frames_in, 1);
	if (st != RX_BODY)
		return;
	if (!c->base.server) {
		struct call *call = c->rcall;

		c->rcall = NULL;
		call_finish(c, call, 0, &c->rhdr);
	} else {
		struct tcp_req *r = c->rreq;

		c->rreq = NULL;
		r->base.hdr = c->rhdr;
		r->base.payload = c->rhdr.payload_len ? r->buf : NULL;
		t->ncb++;
		c->on_request(c->arg, &c->base, &r->base, &r->base.hdr,
			      r->base.payload);
		rx_update(t, c);
	}
}

static void frame_begin(struct tcp_tr *t, struct tcp_conn *c)
{
	const struct emb_frame_hdr *h = &c->rhdr;
	size_t len = h->payload_len;

	c->need = len;
	c->rstate = RX_DISCARD;
	if (c->base.server) {
		struct tcp_req *r = req_get(c, len);

		if (!r) {
			conn_fail(c, -ENOMEM);
			return;
		}
		/* The buffer grows in rx_room() as the payload arrives. */
		c->rreq = r;
		c->dst = r->buf;
		c->rgot = 0;
		c->rstate = RX_BODY;
	} else {
		uint32_t slot = (uint32_t)h->req_id;
		struct call *call = slot < c->made ? call_at(c, slot) : NULL;

		if (!call || !call->pending || call->req_id != h->req_id) {
			/* Most likely the call timed out already. */
			EMB__STAT_ADD(t->base.stats.resp_unmatched, 1);
		} else if (call->queued) {
			conn_fail(c, EMB_EBADFRAME); /* reply before request */
			return;
		} else if (len > call->resp_cap) {
			EMB__STAT_ADD(t->base.stats.resp_too_big, 1);
			call_finish(c, call, EMB_ERESPTOOBIG, NULL);
		} else {
			call->receiving = true;
			c->rcall = call;
			c->dst = call->resp_buf;
			c->rstate = RX_BODY;
		}
	}
	if (len == 0 && !c->closed)
		frame_end(t, c);
}

/* The frame in c->rhdr is over the conn's limit: say which, then close. */
static void reject_too_big(struct tcp_tr *t, struct tcp_conn *c)
{
	char msg[REJECT_MSG_MAX];
	uint64_t bytes = EMB_FRAME_HDR_SIZE + (uint64_t)c->rhdr.payload_len;

	if (c->frame_max < t->base.opts.max_frame_bytes)
		snprintf(msg, sizeof(msg),
			 "frame of %llu bytes before login; at most %u until "
			 "HELLO succeeds",
			 (unsigned long long)bytes, c->frame_max);
	else
		snprintf(msg, sizeof(msg),
			 "frame of %llu bytes over the limit of %u",
			 (unsigned long long)bytes, c->frame_max);
	conn_reject(t, c, EMB_ETOOBIG, msg);
}

/* Parses what rbuf holds: headers, payload bytes, whole frames. */
static void rx_parse(struct tcp_tr *t, struct tcp_conn *c)
{
	size_t avail, take;
	int rc;

	while (!c->closed) {
		avail = c->rend - c->rstart;
		if (c->rstate == RX_HDR) {
			if (c->rx_paused || avail < EMB_FRAME_HDR_SIZE)
				break;
			memcpy(&c->rhdr, c->rbuf + c->rstart,
			       EMB_FRAME_HDR_SIZE);
			c->rstart += EMB_FRAME_HDR_SIZE;
			rc = emb__frame_check(&t->base, &c->rhdr);
			if (rc == 0 && EMB_FRAME_HDR_SIZE +
					       (uint64_t)c->rhdr.payload_len >
					   c->frame_max) {
				EMB__STAT_ADD(t->base.stats.err_too_big, 1);
				rc = EMB_ETOOBIG;
			}
			if (c->refusing && (rc == 0 || rc == EMB_ETOOBIG)) {
				/* emb_conn_refuse(): this header gets the
				 * error, whatever it asks. */
				c->refusing = false;
				conn_reject(t, c, c->reject_status,
					    c->refuse_msg);
				continue;
			}
			if (rc == EMB_ETOOBIG && c->base.server) {
				reject_too_big(t, c);
				continue;
			}
			if (rc) {
				conn_fail(c, rc);
				break;
			}
			frame_begin(t, c);
			continue;
		}
		if (avail == 0)
			break;
		take = avail < c->need ? avail : c->need;
		if (c->rstate == RX_BODY) {
			size_t room = rx_room(t, c);

			if (room == 0)
				continue; /* rejected or failed */
			if (take > room)
				take = room;
			memcpy(c->dst, c->rbuf + c->rstart, take);
			c->dst += take;
			c->rgot += take;
		}
		c->rstart += take;
		c->need -= take;
		if (c->need == 0)
			frame_end(t, c);
	}
	if (c->rstart == c->rend)
		c->rstart = c->rend = 0;
}

static void conn_rx(struct tcp_tr *t, struct tcp_conn *c)
{
	size_t budget = READ_BUDGET, want;
	bool direct, boundary, grow = false;
	ssize_t n;
	char *dst;

	if (c->in_rx)
		return; /* nested poll from one of its callbacks: not now */
	c->busy++;
	c->in_rx = true;
	while (!c->closed && !c->rx_paused && budget) {
		direct = c->rstate != RX_HDR && c->rstart == c->rend &&
			 c->need >= DIRECT_MIN;
		if (direct && c->rstate == RX_BODY) {
			want = rx_room(t, c);
			if (want == 0)
				continue; /* rejected or failed */
			dst = c->dst;
		} else if (direct) {
			dst = c->rbuf;
			want = c->need < c->rbuf_cap ? c->need : c->rbuf_cap;
		} else {
			if (grow)
				rbuf_grow(t, c);
			if (c->rstart > 0) {
				memmove(c->rbuf, c->rbuf + c->rstart,
					c->rend - c->rstart);
				c->rend -= c->rstart;
				c->rstart = 0;
			}
			dst = c->rbuf + c->rend;
			want = c->rbuf_cap - c->rend;
			if (want == 0)
				break; /* paused with a full buffer */
		}
		boundary = c->rstate == RX_HDR && c->rstart == c->rend;
		n = recv(c->fd, dst, want, 0);
		if (n == 0) {
			conn_fail(c, c->rejecting || c->refusing
					 ? c->reject_status
					 : EMB_EPEERDEAD);
			break;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				conn_fail(c, c->rejecting || c->refusing
						 ? c->reject_status
					 : errno == ECONNRESET ? EMB_EPEERDEAD
								: -errno);
			break;
		}
		c->rx_ms = emb__now_ms();
		if (boundary)
			c->frame_ms = c->rx_ms; /* a frame's first byte */
		/* A logged-in server conn that filled its small buffer has
		 * more waiting: worth the big one (conn_trim gives it back). */
		grow = !direct && (size_t)n == want && c->rbuf == c->rsmall &&
		       c->frame_max >= t->base.opts.max_frame_bytes &&
		       !c->rejecting && !c->refusing;
		c->base.stats.bytes_in += (uint64_t)n;
		EMB__STAT_ADD(t->base.stats.bytes_in, (uint64_t)n);
		budget -= (size_t)n < budget ? (size_t)n : budget;
		if (direct) {
			if (c->rstate == RX_BODY) {
				c->dst += n;
				c->rgot += (size_t)n;
			}
			c->need -= (size_t)n;
			if (c->need == 0)
				frame_end(t, c);
		} else {
			c->rend += (size_t)n;
			rx_parse(t, c);
		}
		/* A short read means the socket is empty: skip the EAGAIN. */
		if ((size_t)n < want)
			break;
	}
	c->in_rx = false;
	c->busy--;
}

/* ---- conns --------------------------------------------------------------- */

/*
 * A conn for fd on tr. NULL when out of memory, or (server) when the
 * receive budget cannot take its read buffer: *rc says which.
 */
static struct tcp_conn *conn_new(struct emb_transport *tr, int fd, bool server,
				 int *rc)
{
	struct tcp_conn *c = calloc(1, sizeof(*c));

	*rc = -ENOMEM;
	if (!c)
		return NULL;
	c->frame_max = tr->opts.max_frame_bytes;
	if (server) {
		/* Nothing charged: an idle server conn holds no receive
		 * memory (rbuf_grow takes more while input is busy). */
		if (tr->opts.login_frame_bytes &&
		    tr->opts.login_frame_bytes < tr->opts.max_frame_bytes)
			c->frame_max = tr->opts.login_frame_bytes;
		c->rbuf = c->rsmall;
		c->rbuf_cap = RBUF_SMALL;
	} else {
		c->rbuf_cap = RBUF_BYTES;
		if (!budget_take(tr, c->rbuf_cap)) {
			*rc = EMB_EMEMLIMIT;
			goto err_free_c;
		}
		c->rbuf = malloc(c->rbuf_cap);
		if (!c->rbuf)
			goto err_give;

		c->ncalls = tr->opts.max_inflight;
		c->chunks = calloc((c->ncalls + CALL_CHUNK - 1) / CALL_CHUNK,
				   sizeof(*c->chunks));
		if (!c->chunks)
			goto err_free_rbuf;
		c->free_head = c->ncalls; /* none made yet: calls_grow() */
	}
	c->rx_ms = c->frame_ms = emb__now_ms();
	c->base.tr = tr;
	c->base.server = server;
	c->ep.kind = EP_CONN;
	c->fd = fd;
	*rc = 0;
	return c;

err_free_rbuf:
	free(c->rbuf);
err_give:
	budget_give(tr, c->rbuf_cap);
err_free_c:
	free(c);
	return NULL;
}

/* Frees a conn that never joined a loop (conn_new's counterpart). */
static void conn_discard(struct tcp_conn *c)
{
	if (c->rbuf != c->rsmall) {
		budget_give(c->base.tr, c->rbuf_cap);
		free(c->rbuf);
	}
	calls_free(c);
	free(c);
}

/* Adds a new conn to its loop: epoll, conn list, stats, on_open. */
static int conn_attach(struct tcp_conn *c, emb_conn_fn on_open)
{
	struct tcp_tr *t = conn_tr(c);
	struct epoll_event ev;

	ev.events = EPOLLIN;
	ev.data.ptr = &c->ep;
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0)
		return -errno;
	c->events = EPOLLIN;
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	EMB__STAT_ADD(t->base.stats.conns_opened, 1);
	if (on_open) {
		c->busy++;
		on_open(c->arg, &c->base, 0);
		c->busy--;
	}
	return 0;
}

struct handoff {
	struct tcp_conn *c;  /* conn built by the accepting loop */
	emb_conn_fn on_open; /* listener's callback */
};

static void attach_task(void *arg)
{
	struct handoff *h = arg;
	struct tcp_conn *c = h->c;
	int rc;

	rc = conn_attach(c, h->on_open);
	if (rc) {
		emb_log(EMB_LOG_WARN, "tcp: conn %s: epoll add: %s",
			c->base.peer, emb_strerror(rc));
		close(c->fd);
		conn_discard(c);
	}
	free(h);
}

static void listener_accept(struct tcp_tr *t, struct tcp_listener *l)
{
	struct sockaddr_storage sa;
	struct emb_transport *target;
	struct tcp_conn *c;
	struct handoff *h;
	socklen_t len;
	int fd, rc;

	while (!l->dead) {
		len = sizeof(sa);
		fd = accept4(l->fd, (struct sockaddr *)&sa, &len,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) &&
			    l->spare_fd >= 0) {
				/*
				 * Out of fds: the pending conn would keep the
				 * level-triggered listener firing forever.
				 * Spend the spare fd to accept and drop it.
				 */
				close(l->spare_fd);
				fd = accept(l->fd, NULL, NULL);
				if (fd >= 0)
					close(fd);
				l->spare_fd =
				    open("/dev/null", O_RDONLY | O_CLOEXEC);
				/* accept says EMFILE with nothing queued. */
				if (fd < 0)
					return;
				emb_log(EMB_LOG_WARN,
					"tcp: out of fds, refused a conn on "
					"port %u",
					l->base.port);
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				emb_log(EMB_LOG_WARN,
					"tcp: accept on port %u: %s",
					l->base.port, emb_strerror(-errno));
			return;
		}
		target = l->loops[l->rr++ % l->nloops];
		sock_tune(target, fd);
		/* A server conn charges nothing to the budget until it
		 * sends: only memory itself can fail here. */
		c = conn_new(target, fd, true, &rc);
		if (!c) {
			emb_log(EMB_LOG_WARN, "tcp: accept: %s",
				emb_strerror(rc));
			close(fd);
			continue;
		}
		set_peer(c, (struct sockaddr *)&sa, len);
		c->on_request = l->on_request;
		c->on_close = l->on_close;
		c->arg = l->arg;
		emb_log(EMB_LOG_DEBUG, "tcp: accepted %s on port %u",
			c->base.peer, l->base.port);
		if (target == &t->base) {
			rc = conn_attach(c, l->on_open);
		} else {
			h = malloc(sizeof(*h));
			rc = -ENOMEM;
			if (h) {
				h->c = c;
				h->on_open = l->on_open;
				rc = emb_transport_exec(target, attach_task, h);
				if (rc)
					free(h);
			}
		}
		if (rc) {
			emb_log(EMB_LOG_WARN, "tcp: conn %s: %s", c->base.peer,
				emb_strerror(rc));
			close(fd);
			conn_discard(c);
		}
	}
}

static void conn_event(struct tcp_tr *t, struct tcp_conn *c, uint32_t ev)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (c->closed)
		return;
	if (ev & EPOLLERR) {
		/*
		 * A reset drops what this side still had to send, not what
		 * it received: frames the peer sent before it reset (a
		 * scheduler's last answer, then its exit with input unread)
		 * are in the socket and are read first. conn_rx() fails the
		 * conn on the read that meets the reset, or stops short of
		 * it on a short read: then the error is taken here.
		 */
		if (ev & EPOLLIN)
			conn_rx(t, c);
		if (c->closed)
			return;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		conn_fail(c, err == 0 || err == ECONNRESET || err == EPIPE
				 ? EMB_EPEERDEAD
				 : -err);
		return;
	}
	if (ev & EPOLLOUT)
		conn_flush(t, c);
	if (c->closed)
		return;
	if ((ev & EPOLLIN) || ((ev & EPOLLHUP) && !c->rx_paused))
		conn_rx(t, c);
	else if (ev & EPOLLHUP)
		conn_fail(c, EMB_EPEERDEAD);
}

/* ---- ops ----------------------------------------------------------------- */

static int tcp_create(const struct emb_transport_opts *opts,
		      struct emb_transport **out)
{
	struct epoll_event ev;
	struct tcp_tr *t;
	int rc;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	rc = emb__transport_init(&t->base, &emb__tcp_ops, opts, &t->wake_fd);
	if (rc)
		goto err_free_t;
	if (t->base.opts.copy_max_bytes) {
		t->stage = malloc(STAGE_BYTES);
		if (!t->stage) {
			rc = -ENOMEM;
			goto err_fini;
		}
	}
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0) {
		rc = -errno;
		goto err_fini;
	}
	t->wake_ep.kind = EP_WAKE;
	ev.events = EPOLLIN;
	ev.data.ptr = &t->wake_ep;
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev) < 0) {
		rc = -errno;
		goto err_close_ep;
	}
	*out = &t->base;
	return 0;

err_close_ep:
	close(t->epfd);
err_fini:
	free(t->stage);
	emb__transport_fini(&t->base);
err_free_t:
	free(t);
	return rc;
}

static void tcp_destroy(struct emb_transport *tr)
{
	struct tcp_tr *t = to_tr(tr);
	struct tcp_conn *c;

	t->in_poll++;
	emb__transport_run_tasks(tr);
	for (c = t->conns; c; c = c->next) {
		if (!c->base.server && !c->destroyed)
			emb_log(
			    EMB_LOG_WARN,
			    "tcp: conn %s not destroyed before its transport",
			    c->base.peer);
		conn_fail(c, 0);
	}
	/* Everything goes now, even conns whose requests are still held. */
	while ((c = t->conns))
		conn_free(t, c);
	t->dead = NULL;
	t->in_poll--;
	reap(t);
	close(t->epfd);
	emb__transport_fini(tr);
	free(t->stage);
	free(t);
}

/*
 * Flushes dirty conns and parses kicked ones. Each round takes the lists
 * whole, so a conn marked again meanwhile waits for the next round instead
 * of spinning this one.
 */
static int work(struct tcp_tr *t)
{
	struct tcp_conn *c, *list;
	int n = 0;

	for (int round = 0; round < WORK_ROUNDS && (t->dirty || t->kick);
	     round++) {
		list = t->dirty;
		t->dirty = NULL;
		while ((c = list)) {
			list = c->dirty_next;
			c->dirty = false;
			conn_flush(t, c);
			n++;
		}
		list = t->kick;
		t->kick = NULL;
		while ((c = list)) {
			list = c->kick_next;
			c->kicked = false;
			/* in_rx: the parse on the stack goes on by itself. */
			if (c->closed || c->rx_paused || c->in_rx)
				continue;
			c->busy++;
			c->in_rx = true;
			rx_parse(t, c);
			c->in_rx = false;
			c->busy--;
			n++;
		}
	}
	return n;
}

static int tcp_poll(struct emb_transport *tr, int timeout_ms)
{
	struct tcp_tr *t = to_tr(tr);
	/* On the stack: a callback may poll this loop again. */
	struct epoll_event ev[EVENTS_MAX];
	uint64_t next, now, ncb = t->ncb;
	int n, rc = 0, handled;

	t->in_poll++;
	handled = work(t);
	next = check_timeouts(t);
	/* Callbacks already ran: let the caller look before we block. */
	if (t->dirty || t->kick || t->ncb != ncb)
		timeout_ms = 0;
	if (next != UINT64_MAX) {
		now = emb__now_ms();
		/* +1: the coarse clock must have passed the deadline. */
		uint64_t wait = next > now ? next - now + 1 : 0;

		if (timeout_ms < 0 || wait < (uint64_t)timeout_ms)
			timeout_ms = (int)(wait < INT_MAX ? wait : INT_MAX);
	}
	n = epoll_wait(t->epfd, ev, EVENTS_MAX, timeout_ms);
	if (n < 0) {
		rc = -errno;
		n = 0;
	}
	for (int i = 0; i < n; i++) {
		struct ep *ep = ev[i].data.ptr;

		switch (ep->kind) {
		case EP_WAKE:
			emb__transport_run_tasks(tr);
			break;
		case EP_LISTENER:
			listener_accept(
			    t, emb__container_of(ep, struct tcp_listener, ep));
			break;
		case EP_CONN:
			conn_event(t,
				   emb__container_of(ep, struct tcp_conn, ep),
				   ev[i].events);
			break;
		}
	}
	if (emb__now_ms() != t->last_timeout_ms)
		check_timeouts(t);
	handled += work(t);
	t->in_poll--;
	if (!t->in_poll)
		reap(t);
	return rc ? rc : n + handled;
}

int emb__tcp_fd(struct emb_transport *tr)
{
	return to_tr(tr)->epfd;
}

int emb__tcp_sleep_prep(struct emb_transport *tr, int *wait_ms)
{
	struct tcp_tr *t = to_tr(tr);
	uint64_t next, now;
	int busy;

	t->in_poll++;
	next = check_timeouts(t);
	busy = t->dirty || t->kick;
	t->in_poll--;
	if (!t->in_poll)
		reap(t);
	if (busy)
		return 1;
	if (next != UINT64_MAX) {
		now = emb__now_ms();
		/* +1: the coarse clock must have passed the deadline. */
		uint64_t wait = next > now ? next - now + 1 : 0;

		if (*wait_ms < 0 || wait < (uint64_t)*wait_ms)
			*wait_ms = (int)(wait < INT_MAX ? wait : INT_MAX);
	}
	return 0;
}

static int tcp_listen(struct emb_transport *tr,
		      const struct emb_listen_opts *opts,
		      struct emb_listener **out)
{
	struct tcp_tr *t = to_tr(tr);
	struct addrinfo hints, *ai = NULL;
	struct sockaddr_storage sa;
	struct tcp_listener *l;
	struct epoll_event ev;
	socklen_t len = sizeof(sa);
	char port[8];
	int one = 1, rc;

	for (uint32_t i = 0; i < opts->nloops; i++)
		if (!opts->loops[i] || opts->loops[i]->ops != &emb__tcp_ops)
			return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->spare_fd = -1;
	l->nloops = opts->nloops ? opts->nloops : 1;
	l->loops = calloc(l->nloops, sizeof(*l->loops));
	if (!l->loops) {
		rc = -ENOMEM;
		goto err_free_l;
	}
	for (uint32_t i = 0; i < l->nloops; i++)
		l->loops[i] = opts->nloops ? opts->loops[i] : tr;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%u", opts->port);
	if (getaddrinfo(opts->host, port, &hints, &ai) != 0 || !ai) {
		rc = -EINVAL;
		goto err_free_loops;
	}
	l->fd = socket(ai->ai_family,
		       ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0) {
		rc = -errno;
		goto err_free_ai;
	}
	(void)setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
	    listen(l->fd, opts->backlog > 0 ? opts->backlog : 128) < 0 ||
	    getsockname(l->fd, (struct sockaddr *)&sa, &len) < 0) {
		rc = -errno;
		goto err_close_fd;
	}
	l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	l->base.tr = tr;
	l->base.port = ntohs(sa.ss_family == AF_INET6
				 ? ((struct sockaddr_in6 *)&sa)->sin6_port
				 : ((struct sockaddr_in *)&sa)->sin_port);
	l->ep.kind = EP_LISTENER;
	ev.events = EPOLLIN;
	ev.data.ptr = &l->ep;
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, l->fd, &ev) < 0) {
		rc = -errno;
		goto err_close_fd;
	}
	l->on_request = opts->on_request;
	l->on_open = opts->on_open;
	l->on_close = opts->on_close;
	l->arg = opts->arg;
	freeaddrinfo(ai);
	emb_log(EMB_LOG_DEBUG, "tcp: listening on %s port %u over %u loop%s",
		opts->host ? opts->host : "*", l->base.port, l->nloops,
		l->nloops == 1 ? "" : "s");
	*out = &l->base;
	return 0;

err_close_fd:
	if (l->spare_fd >= 0)
		close(l->spare_fd);
	close(l->fd);
err_free_ai:
	freeaddrinfo(ai);
err_free_loops:
	free(l->loops);
err_free_l:
	free(l);
	emb_log(EMB_LOG_WARN, "tcp: listen on %s port %u: %s",
		opts->host ? opts->host : "*", opts->port, emb_strerror(rc));
	return rc;
}

static void tcp_listener_destroy(struct emb_listener *el)
{
	struct tcp_listener *l =
	    emb__container_of(el, struct tcp_listener, base);
	struct tcp_tr *t = to_tr(el->tr);

	l->dead = true;
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, l->fd, NULL);
	close(l->fd);
	if (l->spare_fd >= 0)
		close(l->spare_fd);
	emb_log(EMB_LOG_DEBUG, "tcp: stopped listening on port %u", el->port);
	/* An event for it may still sit in this poll's batch. */
	l->dead_next = t->dead_listeners;
	t->dead_listeners = l;
	if (!t->in_poll)
		reap(t);
}

/* Waits for a non-blocking connect; 0 or a negative errno. */
static int connect_wait(int fd, uint64_t deadline_ms)
{
	struct pollfd pfd = {.fd = fd, .events = POLLOUT};
	int err = 0, n;
	socklen_t len = sizeof(err);
	uint64_t now;

	for (;;) {
		now = emb__now_ms();
		if (now >= deadline_ms)
			return -ETIMEDOUT;
		n = poll(&pfd, 1, (int)(deadline_ms - now));
		if (n > 0)
			break;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -errno;
	return -err;
}

static int tcp_connect(struct emb_transport *tr,
		       const struct emb_connect_opts *opts,
		       struct emb_conn **out)
{
	uint64_t deadline = emb__now_ms() + tr->opts.connect_timeout_ms;
	struct addrinfo hints, *ai = NULL, *a;
	struct tcp_conn *c;
	char port[8];
	int fd = -1, rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%u", opts->port);
	if (getaddrinfo(opts->host, port, &hints, &ai) != 0 || !ai)
		return -EINVAL;
	rc = -EINVAL;
	for (a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family,
			    a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			rc = 0;
		else
			rc = errno == EINPROGRESS ? connect_wait(fd, deadline)
						  : -errno;
		if (rc == 0)
			break;
		close(fd);
		fd = -1;
	}
	if (rc)
		goto err_free_ai;
	sock_tune(tr, fd);
	c = conn_new(tr, fd, false, &rc);
	if (!c)
		goto err_close_fd;
	set_peer(c, a->ai_addr, a->ai_addrlen);
	c->timeout_ms = opts->call_timeout_ms ? opts->call_timeout_ms
					      : tr->opts.call_timeout_ms;
	c->on_close = opts->on_close;
	c->arg = opts->arg;
	rc = conn_attach(c, NULL);
	if (rc)
		goto err_free_c;
	freeaddrinfo(ai);
	emb_log(EMB_LOG_DEBUG, "tcp: connected to %s", c->base.peer);
	*out = &c->base;
	return 0;

err_free_c:
	conn_discard(c);
err_close_fd:
	close(fd);
err_free_ai:
	freeaddrinfo(ai);
	emb_log(EMB_LOG_DEBUG, "tcp: connect to %s port %u: %s", opts->host,
		opts->port, emb_strerror(rc));
	return rc;
}

static void tcp_conn_destroy(struct emb_conn *ec)
{
	struct tcp_conn *c = to_conn(ec);
	struct tcp_tr *t = conn_tr(c);

	if (c->destroyed)
		return;
	if (ec->server) {
		/* Server conns belong to the transport; close is all we do. */
		conn_fail(c, 0);
		return;
	}
	c->destroyed = true;
	conn_fail(c, 0);
	if (!t->in_poll && !c->busy)
		conn_free(t, c);
	else
		conn_reap(t, c);
}

static void tcp_conn_close(struct emb_conn *ec, int reason)
{
	conn_fail(to_conn(ec), reason);
}

static int tcp_call(struct emb_conn *ec, const struct emb_frame_hdr *hdr,
		    const struct iovec *iov, int niov, void *resp_buf,
		    size_t resp_cap, emb_call_done_fn done, void *ctx)
{
	struct tcp_conn *c = to_conn(ec);
	struct tcp_tr *t = conn_tr(c);
	struct call *call;
	int64_t len;

	if (c->closed)
		return EMB_ECLOSED;
	if (c->free_head >= c->ncalls) {
		int rc = calls_grow(c);

		if (rc)
			return rc;
	}
	call = call_at(c, c->free_head);
	len = tx_copy_iov(&call->tx, iov, niov);
	if (len < 0)
		return (int)len;
	if ((uint64_t)len > t->base.opts.max_frame_bytes - EMB_FRAME_HDR_SIZE)
		return -EINVAL;
	c->free_head = call->next_free;

	call->req_id =
	    (call->req_id & 0xffffffffu) | (((call->req_id >> 32) + 1) << 32);
	call->tx.hdr = *hdr;
	call->tx.hdr.magic = EMB_FRAME_MAGIC;
	call->tx.hdr.version = EMB_FRAME_VERSION;
	call->tx.hdr.req_id = call->req_id;
	call->tx.hdr.payload_len = (uint32_t)len;
	call->tx.total = EMB_FRAME_HDR_SIZE + (uint64_t)len;
	call->resp_buf = resp_buf;
	call->resp_cap = resp_cap;
	call->done = done;
	call->ctx = ctx;
	call->deadline_ms =
	    c->timeout_ms ? emb__now_ms() + c->timeout_ms : UINT64_MAX;
	call->pending = true;
	call->queued = true;
	call->receiving = false;
	call->prev = c->pend_tail;
	call->next = NULL;
	if (c->pend_tail)
		c->pend_tail->next = call;
	else
		c->pend_head = call;
	c->pend_tail = call;
	c->base.stats.inflight++;
	tx_enqueue(t, c, &call->tx);
	return 0;
}

static int tcp_reply(struct emb_req *er, const struct emb_frame_hdr *hdr,
		     const struct iovec *iov, int niov, emb_send_done_fn done,
		     void *ctx)
{
	struct tcp_req *r = emb__container_of(er, struct tcp_req, base);
	struct tcp_conn *c = to_conn(er->conn);
	struct tcp_tr *t = conn_tr(c);
	int64_t len;

	if (c->closed) {
		req_put(c, r);
		return EMB_ECLOSED;
	}
	len = tx_copy_iov(&r->tx, iov, niov);
	if (len < 0) {
		req_put(c, r);
		return (int)len;
	}
	if ((uint64_t)len > t->base.opts.max_frame_bytes - EMB_FRAME_HDR_SIZE) {
		req_put(c, r);
		return -EMSGSIZE;
	}
	r->tx.hdr = *hdr;
	r->tx.hdr.magic = EMB_FRAME_MAGIC;
	r->tx.hdr.version = EMB_FRAME_VERSION;
	r->tx.hdr.req_id = er->hdr.req_id;
	r->tx.hdr.payload_len = (uint32_t)len;
	r->tx.total = EMB_FRAME_HDR_SIZE + (uint64_t)len;
	r->tx.is_call = false;
	r->done = done;
	r->ctx = ctx;
	tx_enqueue(t, c, &r->tx);
	rx_update(t, c);
	return 0;
}

/*
 * Lifts the login limit: frames up to max_frame_bytes, and the big read
 * buffer once input is busy (rbuf_grow).
 */
static void tcp_admit(struct emb_conn *ec)
{
	to_conn(ec)->frame_max = ec->tr->opts.max_frame_bytes;
}

/* See emb_conn_refuse() in transport.h. */
static int tcp_refuse(struct emb_conn *ec, int status, const char *msg)
{
	struct tcp_conn *c = to_conn(ec);
	struct tcp_tr *t = conn_tr(c);

	if (c->closed)
		return EMB_ECLOSED;
	if (!t->base.opts.reject_encode)
		return -EINVAL;
	if (c->rejecting || c->refusing)
		return 0; /* already on its way out with an error */
	snprintf(c->refuse_msg, sizeof(c->refuse_msg), "%s", msg);
	c->reject_status = status;
	if (c->rstate == RX_BODY && !c->in_rx) {
		/* A frame is being read: it is the one answered. */
		conn_reject(t, c, status, c->refuse_msg);
		return 0;
	}
	c->refusing = true;
	c->linger_ms = emb__now_ms() + LINGER_MS;
	if (!c->busy && conn_between_frames(c) && conn_holds_buffers(c))
		conn_trim(t, c);
	if (c->rend > c->rstart)
		conn_kick(t, c); /* a header may be buffered already */
	return 0;
}

static void tcp_req_release(struct emb_req *er)
{
	req_put(to_conn(er->conn), emb__container_of(er, struct tcp_req, base));
}

static int tcp_reg_mem(struct emb_transport *tr, void *addr, size_t len,
		       struct emb_mr **out)
{
	struct emb_mr *mr = calloc(1, sizeof(*mr));

	(void)tr;
	if (!mr)
		return -ENOMEM;
	/* TCP reads and writes any memory; the handle only keeps the API. */
	mr->addr = addr;
	mr->len = len;
	*out = mr;
	return 0;
}

static void tcp_dereg_mem(struct emb_transport *tr, struct emb_mr *mr)
{
	(void)tr;
	free(mr);
}

const struct emb_transport_ops emb__tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .poll = tcp_poll,
    .listen = tcp_listen,
    .listener_destroy = tcp_listener_destroy,
    .connect = tcp_connect,
    .conn_destroy = tcp_conn_destroy,
    .conn_close = tcp_conn_close,
    .call = tcp_call,
    .reply = tcp_reply,
    .req_release = tcp_req_release,
    .reg_mem = tcp_reg_mem,
    .dereg_mem = tcp_dereg_mem,
    .admit = tcp_admit,
    .refuse = tcp_refuse,
    .stats = emb__transport_stats_read,
    .fault_set = emb__transport_fault_arm,
};
