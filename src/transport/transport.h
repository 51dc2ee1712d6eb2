/*
 * src/transport/transport.h - moves framed messages and registered memory
 * between embstore processes, over TCP or RDMA.
 *
 * A message is a frame: the 32-byte header of src/common/frame.h followed
 * by payload_len bytes. The transport reads only the header, to delimit
 * frames and to match each response to its request by req_id; opcodes and
 * payloads are the protocol's (src/proto), which the transport never sees:
 * the one frame it writes itself, the error reply to a frame it refuses,
 * is encoded by the layer above (emb_transport_opts.reject_encode).
 *
 * struct emb_transport is one event loop. Each of tcp.c and rdma_conn.c fills a
 * struct emb_transport_ops; callers use the inline shims below and never
 * learn which transport they run on.
 *
 * Threads: a transport, and every conn, listener and req on it, belongs to
 * the one thread that runs its loop (emb_transport_poll() or
 * emb_transport_run()). Only that thread may call into them, and every
 * callback runs on it. The exceptions, callable from any thread, are
 * emb_transport_exec(), emb_transport_wake(), emb_transport_stop() and
 * emb_transport_stats(). A server runs one transport per thread and has its
 * listener spread accepted connections across them.
 *
 * Callbacks: if a call that takes a callback returns an error, the callback
 * is never called. When it returns 0 the callback fires exactly once, later,
 * from the loop (never from inside the call that posted it).
 */
#ifndef EMB_TRANSPORT_TRANSPORT_H
#define EMB_TRANSPORT_TRANSPORT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/frame.h"

struct emb_transport;
struct emb_transport_ops;
struct emb_listener;
struct emb_conn;
struct emb_req;
struct emb_mr;

/* ---- callbacks ---------------------------------------------------------- */

/*
 * A client call finished. status is 0 and resp is the response header (valid
 * for this callback only) with resp->payload_len bytes now in the caller's
 * resp_buf; or status is negative, resp is NULL and resp_buf holds nothing
 * meaningful: EMB_ERESPTOOBIG (payload beyond resp_cap; the conn stays up),
 * -ETIMEDOUT (no response within call_timeout_ms), EMB_ECLOSED (conn or
 * transport destroyed locally), or the reason the conn closed (EMB_EPEERDEAD,
 * EMB_EBADMAGIC, ...). Either way the request iov and resp_buf are no longer
 * referenced by the transport once this returns.
 */
typedef void (*emb_call_done_fn)(void *ctx, int status,
				 const struct emb_frame_hdr *resp);

/*
 * A reply was handed to the network (0) or dropped because its conn closed
 * (EMB_ECLOSED or the close reason). The reply's iov memory is free again.
 */
typedef void (*emb_send_done_fn)(void *ctx, int status);

/*
 * Server side: a request arrived on conn. hdr and payload (hdr->payload_len
 * bytes, NULL when 0) stay valid until the reply to req completes or
 * emb_req_release(req); exactly one of emb_conn_reply() and
 * emb_req_release() must follow, on this loop's thread, now or later.
 */
typedef void (*emb_request_fn)(void *arg, struct emb_conn *conn,
			       struct emb_req *req,
			       const struct emb_frame_hdr *hdr, void *payload);

/*
 * A conn opened (reason 0, server side: right after accept) or closed
 * (reason 0 for a local close, else why: EMB_EPEERDEAD, EMB_EBADMAGIC,
 * EMB_EBADVERSION, EMB_ETOOBIG, EMB_EBADFRAME, a negative errno). After the
 * close callback of a server conn returns, the conn pointer is dead.
 */
typedef void (*emb_conn_fn)(void *arg, struct emb_conn *conn, int reason);

/*
 * A one-sided read batch finished: status 0 and every segment's bytes are
 * in place, or status negative (the conn failed: a READ named memory the
 * peer no longer has registered, or the conn closed) and none of them may
 * be trusted.
 */
typedef void (*emb_read_done_fn)(void *ctx, int status);

/*
 * Server conns: encodes the error reply to a frame the transport refuses
 * before the conn closes (req is its header; status EMB_ETOOBIG,
 * EMB_EMEMLIMIT, -ETIMEDOUT for a frame slower than frame_timeout_ms, or
 * the status given to emb_conn_refuse(); msg says why, NUL-terminated)
 * into buf[0..cap): a whole
 * frame, header included. Returns its length in bytes, or a negative code
 * if it cannot, and the conn then closes without a reply. The protocol
 * supplies it (emb_wire_reject_encode); it runs on the loop thread and
 * must not call into the transport.
 */
typedef int (*emb_reject_fn)(void *buf, size_t cap,
			     const struct emb_frame_hdr *req, int status,
			     const char *msg);

/* Work posted to a loop from another thread with emb_transport_exec(). */
typedef void (*emb_task_fn)(void *arg);

/*
 * A task the caller owns, for emb_transport_post(): a caller that posts
 * on every batch keeps one instead of having the transport malloc one.
 */
struct emb_task {
	struct emb_task *next; /* the transport's while queued */
	emb_task_fn fn;	       /* set by the caller */
	void *arg;	       /* set by the caller */
	bool heap;	       /* the transport's: malloc'd by _exec() */
};

/* ---- options ------------------------------------------------------------ */

/*
 * Receive memory that several loops share (a server's): every byte a TCP
 * conn holds to receive frames (its read buffer, request buffers, pooled
 * ones) is charged here while held. An idle server conn holds none of it:
 * headers land in a small buffer inside the conn, and the bigger buffers
 * a busy conn keeps go back after a while without input, or at once when
 * more than half the limit is spent. A frame that would pass the limit
 * gets an EMB_EMEMLIMIT error and its conn is closed. Updated with
 * atomics; the owner keeps it alive longer than the transports.
 */
struct emb_buf_budget {
	uint64_t limit;	  /* bytes; 0 = unlimited */
	uint64_t used;	  /* bytes charged now; read with __atomic_load_n */
	uint64_t refused; /* conns closed because it was spent; atomic */
};

struct emb_transport_opts {
	uint32_t max_frame_bytes;    /* header + payload; larger closes conn */
	uint64_t out_queue_max;	     /* bytes queued to one conn before its
					requests stop being read */
	uint32_t max_inflight;	     /* calls in flight per client conn, and
					requests held per server conn */
	uint32_t call_timeout_ms;    /* default per-call deadline; 0 = none */
	uint32_t connect_timeout_ms; /* emb_conn_create() deadline */
	uint32_t sock_buf_bytes;     /* TCP SO_SNDBUF/SO_RCVBUF; 0 = kernel's */
	uint32_t copy_max_bytes;     /* TCP: reply pieces under this many bytes
					are copied into one staging buffer
					before sendmsg, at most 64 KiB; 0 =
					send every piece from its own memory
					(docs/transport.md) */
	uint32_t login_frame_bytes;  /* server conns: largest frame until
					emb_conn_admit(); 0 = max_frame_bytes
					from the start */
	struct emb_buf_budget *rx_budget; /* receive memory charged here;
					     NULL = not counted; borrowed */
	emb_reject_fn reject_encode; /* server conns: the error reply to a
					refused frame; NULL = close
					without one */
	uint32_t frame_timeout_ms;   /* server conns (TCP): a frame must
					arrive whole within this long of
					its first byte, else it is answered
					with -ETIMEDOUT and the conn closes;
					time spent not reading (backpressure)
					does not count; 0 = no bound */
};

#define EMB_TRANSPORT_OPTS_DEFAULT                                             \
	((struct emb_transport_opts){.max_frame_bytes = 64u << 20,             \
				     .out_queue_max = 8u << 20,                \
				     .max_inflight = 1024,                     \
				     .call_timeout_ms = 30000,                 \
				     .connect_timeout_ms = 5000,               \
				     .sock_buf_bytes = 0,                      \
				     .copy_max_bytes = 0,                      \
				     .login_frame_bytes = 0,                   \
				     .rx_budget = NULL,                        \
				     .reject_encode = NULL,                    \
				     .frame_timeout_ms = 0})

struct emb_listen_opts {
	const char *host; /* bind address, e.g. "0.0.0.0"; copied */
	uint16_t port;	  /* 0 picks a free port: emb_listener_port */
	int backlog;	  /* listen(2) backlog; 0 = 128 */
	struct emb_transport *const *loops; /* accepted conns go round-robin
					       to these (same kind as the
					       listener's); NULL = its own */
	uint32_t nloops;		    /* entries in loops */
	emb_request_fn on_request;	    /* required */
	emb_conn_fn on_open;		    /* optional */
	emb_conn_fn on_close;		    /* optional */
	void *arg;			    /* passed to the three callbacks */
};

#define EMB_LISTEN_OPTS_DEFAULT                                                \
	((struct emb_listen_opts){.host = "127.0.0.1", .port = 0})

struct emb_connect_opts {
	const char *host; /* numeric address or host name; copied */
	uint16_t port;
	uint32_t call_timeout_ms; /* 0 = the transport's call_timeout_ms */
	emb_conn_fn on_close;	  /* optional: conn failed under its user */
	void *arg;		  /* passed to on_close */
	const char *via;	  /* a "tcp,rdma" loop: "tcp" or "rdma";
				     NULL = the first one named. Others
				     take NULL or their own name */
};

#define EMB_CONNECT_OPTS_DEFAULT                                               \
	((struct emb_connect_opts){.host = "127.0.0.1", .port = 0})

/* ---- stats -------------------------------------------------------------- */

/* Per transport (loop), counted since create. Read with emb_transport_stats. */
struct emb_transport_stats {
	uint64_t bytes_in;	  /* bytes read from conns */
	uint64_t bytes_out;	  /* bytes written to conns */
	uint64_t frames_in;	  /* complete frames received */
	uint64_t frames_out;	  /* complete frames sent */
	uint64_t conns_opened;	  /* conns accepted or connected */
	uint64_t conns_closed;	  /* conns closed, any reason */
	uint64_t calls_timed_out; /* calls completed with -ETIMEDOUT */
	uint64_t err_bad_magic;	  /* conns closed: bad magic */
	uint64_t err_bad_version; /* conns closed: bad version */
	uint64_t err_too_big;	  /* conns closed: frame > max_frame_bytes */
	uint64_t err_peer_closed; /* conns closed by peer mid-frame or by
				     a reset */
	uint64_t peer_closes;	  /* conns the peer closed cleanly: EOF
				     between frames (no error) */
	uint64_t err_io;	  /* conns closed: other socket/QP errors */
	uint64_t resp_too_big;	  /* calls failed: response > resp_cap */
	uint64_t resp_unmatched;  /* responses for no call (timed out) */
	uint64_t err_no_memory;	  /* conns closed: rx_budget spent */
	uint64_t rx_pauses;	  /* times a conn stopped being read */
	uint64_t out_queue_peak;  /* most bytes ever queued on one conn */
	uint64_t resp_bounced;	  /* RDMA calls whose resp_buf was not
				     registered: the response landed in
				     transport memory and was copied */
	uint64_t frames_timed_out; /* conns closed: a frame slower than
				      frame_timeout_ms */
	uint64_t rx_trims;	   /* idle conns that gave their receive
				      buffers back */
};

/* Per conn; read on the loop thread with emb_conn_stats(). */
struct emb_conn_stats {
	uint64_t bytes_in;   /* bytes read */
	uint64_t bytes_out;  /* bytes written */
	uint64_t frames_in;  /* complete frames received */
	uint64_t frames_out; /* complete frames sent */
	uint64_t out_queued; /* bytes queued, not yet written, now */
	uint32_t inflight;   /* client: calls pending; server: reqs held */
	bool rx_paused;	     /* server: reading stopped by backpressure */
};

/* ---- one-sided reads ---------------------------------------------------- */

/* One RDMA READ: len bytes at raddr of the peer (rkey) into local. */
struct emb_read_seg {
	uint64_t raddr; /* peer address */
	uint32_t rkey;	/* peer's remote key for it */
	uint32_t len;	/* bytes, >= 1 */
	void *local;	/* landing: memory registered on the conn's loop */
};

/*
 * A batch of READs, in memory the caller owns until done fires: segs (n
 * entries, borrowed as long) and the transport's bookkeeping in priv.
 */
struct emb_read_op {
	const struct emb_read_seg *segs; /* n segments */
	uint32_t n;			 /* >= 1 */
	emb_read_done_fn done;		 /* fired once */
	void *ctx;			 /* its argument */
	uint64_t priv[5];		 /* the transport's while posted */
};

/* ---- fault hooks (tests) ------------------------------------------------ */

enum emb_fault_point {
	EMB_FAULT_REG = 0, /* emb_transport_reg_mem() */
	EMB_FAULT_SEND,	   /* emb_conn_call() and emb_conn_reply() */
	EMB_FAULT_CONNECT, /* emb_conn_create() */
	EMB_FAULT_LISTEN,  /* emb_listener_create() */
	EMB_FAULT_IO,	   /* a socket write or WR post inside the loop;
			      the conn closes with the given code */
	EMB_FAULT_NPOINTS,
};

/* ---- the vtable --------------------------------------------------------- */

/*
 * Filled by each transport (emb__tcp_ops, emb__rdma_ops, and the "tcp,rdma"
 * loops' emb__dual_*_ops). Callers go through the shims; the argument
 * checks and fault hooks live there, so an op may assume valid arguments.
 */
struct emb_transport_ops {
	const char *name; /* "tcp", "rdma" */
	int (*create)(const struct emb_transport_opts *opts,
		      struct emb_transport **out);
	void (*destroy)(struct emb_transport *tr);
	int (*poll)(struct emb_transport *tr, int timeout_ms);
	int (*listen)(struct emb_transport *tr,
		      const struct emb_listen_opts *opts,
		      struct emb_listener **out);
	void (*listener_destroy)(struct emb_listener *l);
	int (*connect)(struct emb_transport *tr,
		       const struct emb_connect_opts *opts,
		       struct emb_conn **out);
	void (*conn_destroy)(struct emb_conn *c);
	void (*conn_close)(struct emb_conn *c, int reason);
	int (*call)(struct emb_conn *c, const struct emb_frame_hdr *hdr,
		    const struct iovec *iov, int niov, void *resp_buf,
		    size_t resp_cap, emb_call_done_fn done, void *ctx);
	int (*reply)(struct emb_req *req, const struct emb_frame_hdr *hdr,
		     const struct iovec *iov, int niov, emb_send_done_fn done,
		     void *ctx);
	void (*req_release)(struct emb_req *req);
	int (*reg_mem)(struct emb_transport *tr, void *addr, size_t len,
		       struct emb_mr **out);
	void (*dereg_mem)(struct emb_transport *tr, struct emb_mr *mr);
	void (*admit)(struct emb_conn *c); /* NULL: nothing to lift */
	/* NULL: the transport cannot answer before a request arrives. */
	int (*refuse)(struct emb_conn *c, int status, const char *msg);
	/* One-sided access; NULL on transports without it (TCP). */
	int (*rkey_of)(struct emb_transport *tr, const void *addr, size_t len,
		       uint32_t *rkey);
	int (*read)(struct emb_conn *c, struct emb_read_op *op);
	/* Any thread: a tear-free snapshot of the counters. */
	void (*stats)(const struct emb_transport *tr,
		      struct emb_transport_stats *out);
	/* Arms fault point (< EMB_FAULT_NPOINTS) where its hits count. */
	void (*fault_set)(struct emb_transport *tr, enum emb_fault_point point,
			  uint32_t nth, int rc);
};

/*
 * The parts every transport shares, embedded first in its own structs. The
 * fields belong to the transport; callers use the functions below.
 */
struct emb__transport_common;

struct emb_transport {
	const struct emb_transport_ops *ops;
	struct emb_transport_opts opts;	  /* copy, defaults filled in */
	struct emb_transport_stats stats; /* loop thread writes, any reads */
	uint32_t fault_nth[EMB_FAULT_NPOINTS]; /* fail the nth hit; 0 = off */
	int fault_rc[EMB_FAULT_NPOINTS];      /* what the failing hit returns */
	struct emb__transport_common *common; /* task mailbox, wake fd */
	struct emb_transport *owner; /* the "tcp,rdma" loop that drives this
					one, or NULL */
};

struct emb_listener {
	struct emb_transport *tr; /* the loop that accepts */
	uint16_t port;		  /* bound port, host order */
};

struct emb_conn {
	struct emb_transport *tr;    /* the loop this conn belongs to */
	struct emb_conn_stats stats; /* loop thread only */
	void *user;		     /* emb_conn_set_user() */
	bool server;		     /* accepted (true) or connected */
	char peer[64];		     /* "addr:port" of the other end */
};

struct emb_req {
	struct emb_conn *conn;	  /* the conn it arrived on */
	struct emb_frame_hdr hdr; /* the request's header */
	void *payload;		  /* hdr.payload_len bytes */
};

struct emb_mr {
	void *addr;    /* start of the registered range */
	size_t len;    /* bytes registered */
	uint32_t lkey; /* RDMA local key; 0 on TCP */
	uint32_t rkey; /* RDMA remote key; 0 on TCP */
};

/* ---- transport (event loop) --------------------------------------------- */

/*
 * Opens a transport by name with opts (NULL = defaults; a zero field takes
 * its default, except call_timeout_ms, sock_buf_bytes, copy_max_bytes and
 * frame_timeout_ms, where 0 means none / kernel's / off / none). The
 * names: "tcp", "rdma", and "tcp,rdma" or "rdma,tcp": one loop that
 * drives both, whose listeners listen on TCP and on RDMA at the same port
 * number (the two port spaces are apart), whose conns each run on one of the two (emb_connect_opts.via;
 * the first named by default) and whose registrations are the RDMA
 * transport's. 0 and the handle in *out, or -EINVAL (unknown name;
 * max_frame_bytes < 32, login_frame_bytes 1..31, max_inflight > 2^20 or
 * copy_max_bytes > 64 KiB), -ENODEV (RDMA named without RDMA support built
 * in or without a device), -ENOMEM, or a negative errno from epoll/eventfd.
 */
int emb_transport_create(const char *name,
			 const struct emb_transport_opts *opts,
			 struct emb_transport **out);

/*
 * Destroys a transport; NULL is a no-op. Listeners and client conns on it
 * must be destroyed first. Server conns still open are closed (their
 * on_close runs, pending reply callbacks get EMB_ECLOSED); tasks still
 * queued by emb_transport_exec() run first.
 */
void emb_transport_destroy(struct emb_transport *tr);

static inline const char *emb_transport_name(const struct emb_transport *tr)
{
	return tr->ops->name;
}

/* True if name names a transport built into this binary ("tcp", "rdma"). */
bool emb_transport_available(const char *name);

/*
 * True if a transport of that name can be opened here: built in and, for
 * RDMA, a device present (it opens one and closes it again).
 */
bool emb_transport_usable(const char *name);

/*
 * Runs the loop once: sends what is queued, waits up to timeout_ms (-1 =
 * until something happens, 0 = not at all) and dispatches every callback
 * that is due, including call timeouts. Returns the number of events
 * handled (>= 0), or a negative errno if waiting itself failed.
 */
static inline int emb_transport_poll(struct emb_transport *tr, int timeout_ms)
{
	return tr->ops->poll(tr, timeout_ms);
}

/*
 * Polls until emb_transport_stop() is called (from a callback, a task or
 * another thread); for a loop that runs in a thread of its own. Returns 0,
 * or the negative errno of a failed poll. A stop that comes before run()
 * starts makes it return at once.
 */
int emb_transport_run(struct emb_transport *tr);

/* Any thread: makes emb_transport_run() return soon. */
void emb_transport_stop(struct emb_transport *tr);

/*
 * Any thread: runs fn(arg) on the loop thread during a later poll, in post
 * order. This is how other threads reach conns on a loop. 0, or -ENOMEM.
 * Tasks still queued at destroy run during emb_transport_destroy().
 */
int emb_transport_exec(struct emb_transport *tr, emb_task_fn fn, void *arg);

/*
 * Any thread: the same without allocating, for a task t the caller owns
 * (fn and arg set). t belongs to the transport from the call until fn
 * starts: fn may post t again, or free it. 0, or -EINVAL (no fn).
 */
int emb_transport_post(struct emb_transport *tr, struct emb_task *t);

/* Any thread: makes a poll that is waiting return now. */
void emb_transport_wake(struct emb_transport *tr);

/* Any thread: a snapshot of the loop's counters. */
void emb_transport_stats(const struct emb_transport *tr,
			 struct emb_transport_stats *out);

/*
 * Tests: the nth later hit of point (1 = the next) fails with rc; 0 disarms.
 * Call on the loop thread or before the loop runs.
 */
void emb_transport_fault_set(struct emb_transport *tr,
			     enum emb_fault_point point, uint32_t nth, int rc);

/* Counts a hit of point; returns its injected error, or 0. */
static inline int emb__fault_hit(struct emb_transport *tr,
				 enum emb_fault_point point)
{
	uint32_t n = __atomic_load_n(&tr->fault_nth[point], __ATOMIC_RELAXED);

	if (__builtin_expect(n == 0, 1))
		return 0;
	__atomic_store_n(&tr->fault_nth[point], n - 1, __ATOMIC_RELAXED);
	return n == 1 ? tr->fault_rc[point] : 0;
}

/* ---- memory registration ------------------------------------------------ */

/*
 * Registers [addr, addr + len) so that requests, responses and replies may
 * name it without a bounce copy (ibv_reg_mr on RDMA, bookkeeping only on
 * TCP). The range stays borrowed until emb_transport_dereg_mem(). 0 and a
 * handle in *out, or -EINVAL (NULL addr, len 0), -ENOMEM, or the device's
 * negative errno.
 */
static inline int emb_transport_reg_mem(struct emb_transport *tr, void *addr,
					size_t len, struct emb_mr **out)
{
	int rc;

	if (!addr || !len || !out)
		return -EINVAL;
	rc = emb__fault_hit(tr, EMB_FAULT_REG);
	if (rc)
		return rc;
	return tr->ops->reg_mem(tr, addr, len, out);
}

/*
 * The remote key under which peers of tr's conns may READ [addr, addr +
 * len): 0 and *rkey when one registration on tr covers the range, -ENOENT
 * when none does (not registered, or not yet on this loop), -EOPNOTSUPP on
 * a transport without one-sided access (TCP). A conn's registrations are
 * c->tr's (also on a "tcp,rdma" loop).
 */
static inline int emb_transport_rkey(struct emb_transport *tr,
				     const void *addr, size_t len,
				     uint32_t *rkey)
{
	if (!tr->ops->rkey_of)
		return -EOPNOTSUPP;
	return tr->ops->rkey_of(tr, addr, len, rkey);
}

/* Deregisters; no WR or queued send may still name the range. NULL: no-op. */
static inline void emb_transport_dereg_mem(struct emb_transport *tr,
					   struct emb_mr *mr)
{
	if (mr)
		tr->ops->dereg_mem(tr, mr);
}

/*
 * Allocates len bytes (page aligned) and registers them. 0 with *addr and
 * *mr set, or -EINVAL / -ENOMEM / a registration error. Free with
 * emb_transport_buf_free().
 */
int emb_transport_buf_alloc(struct emb_transport *tr, size_t len, void **addr,
			    struct emb_mr **mr);
/* Deregisters and frees a buffer from emb_transport_buf_alloc(). */
void emb_transport_buf_free(struct emb_transport *tr, void *addr,
			    struct emb_mr *mr);

/* ---- listener (server) -------------------------------------------------- */

/*
 * Listens on opts->host:opts->port; accepted conns are handed round-robin to
 * opts->loops, whose threads then run the callbacks for them. The loops are
 * borrowed and must outlive the listener. 0 and a handle in *out, or
 * -EINVAL (no on_request, bad host), -EADDRINUSE, -ENOMEM, or another
 * negative errno from socket/bind/listen.
 */
static inline int emb_listener_create(struct emb_transport *tr,
				      const struct emb_listen_opts *opts,
				      struct emb_listener **out)
{
	int rc;

	if (!opts || !opts->on_request || !out ||
	    (opts->nloops && !opts->loops))
		return -EINVAL;
	rc = emb__fault_hit(tr, EMB_FAULT_LISTEN);
	if (rc)
		return rc;
	return tr->ops->listen(tr, opts, out);
}

/* The port the listener is bound to (useful after port 0). */
static inline uint16_t emb_listener_port(const struct emb_listener *l)
{
	return l->port;
}

/* Stops accepting; conns already accepted stay open. NULL is a no-op. */
void emb_listener_destroy(struct emb_listener *l);

/* ---- conn --------------------------------------------------------------- */

/*
 * Connects to opts->host:opts->port, blocking for at most the transport's
 * connect_timeout_ms, and returns a client conn in *out. 0, or -EINVAL (bad
 * host), -ETIMEDOUT, -ECONNREFUSED, -ENOMEM, another negative errno.
 */
static inline int emb_conn_create(struct emb_transport *tr,
				  const struct emb_connect_opts *opts,
				  struct emb_conn **out)
{
	int rc;

	if (!opts || !opts->host || !out)
		return -EINVAL;
	/* Only a two-transport loop (its name has a comma) chooses. */
	if (opts->via && !__builtin_strchr(tr->ops->name, ',') &&
	    __builtin_strcmp(opts->via, tr->ops->name) != 0)
		return -EINVAL;
	rc = emb__fault_hit(tr, EMB_FAULT_CONNECT);
	if (rc)
		return rc;
	return tr->ops->connect(tr, opts, out);
}

/*
 * Closes and frees a client conn; pending calls complete with EMB_ECLOSED
 * before it returns. NULL is a no-op. Not for server conns (use
 * emb_conn_close). May be called from this conn's own callbacks.
 */
void emb_conn_destroy(struct emb_conn *c);

/*
 * Server conns: lifts the login limit (login_frame_bytes) once the peer has
 * proved who it is, so its frames may be as large as max_frame_bytes. Until
 * then a larger frame is answered with EMB_ETOOBIG and closes the conn, so
 * a stranger cannot make the server buffer more than login_frame_bytes.
 */
static inline void emb_conn_admit(struct emb_conn *c)
{
	if (c->server && c->tr->ops->admit)
		c->tr->ops->admit(c);
}

/*
 * Server conns: refuses the conn without serving it. The next frame's
 * header (or that of the frame being read) is answered with an error
 * frame of status and msg (at most 159 bytes are kept; encoded by
 * opts.reject_encode), no request reaches on_request any more, and the
 * conn closes once the error is sent and the peer had a moment to read
 * it; one that sends no header within a second closes without it. The
 * conn holds no receive buffer meanwhile, so a flood of refused conns
 * costs little. 0, or -EINVAL (status >= 0, not a server conn, no
 * reject_encode), -EOPNOTSUPP (the transport cannot: RDMA),
 * EMB_ECLOSED.
 */
static inline int emb_conn_refuse(struct emb_conn *c, int status,
				  const char *msg)
{
	if (!c->server || status >= 0 || !msg)
		return -EINVAL;
	if (!c->tr->ops->refuse)
		return -EOPNOTSUPP;
	return c->tr->ops->refuse(c, status, msg);
}

/*
 * Server conns: closes the conn; on_close runs from the loop with reason,
 * held reqs stay valid until replied or released (replies then fail).
 */
void emb_conn_close(struct emb_conn *c, int reason);

/*
 * Sends a request and arranges for its response payload to land in
 * resp_buf. hdr supplies opcode, flags, table_id, count (and status 0); the
 * transport sets magic, version, req_id and payload_len (the sum of iov).
 * hdr and the iov array are copied; the memory iov names, and resp_buf,
 * are borrowed until done fires. 0, or -EINVAL (niov < 0, payload over
 * max_frame_bytes), -ENOMEM, EMB_ECLOSED (conn closed), EMB_ENOCREDIT
 * (max_inflight calls already pending).
 */
static inline int emb_conn_call(struct emb_conn *c,
				const struct emb_frame_hdr *hdr,
				const struct iovec *iov, int niov,
				void *resp_buf, size_t resp_cap,
				emb_call_done_fn done, void *ctx)
{
	int rc;

	if (!hdr || niov < 0 || (niov && !iov) || (resp_cap && !resp_buf) ||
	    !done || c->server)
		return -EINVAL;
	rc = emb__fault_hit(c->tr, EMB_FAULT_SEND);
	if (rc)
		return rc;
	return c->tr->ops->call(c, hdr, iov, niov, resp_buf, resp_cap, done,
				ctx);
}

/*
 * Runs a call to completion on the calling (loop) thread: posts it, then
 * polls the loop until done. Returns the call's status; on 0 *resp holds
 * the response header (resp may be NULL).
 */
int emb_conn_call_sync(struct emb_conn *c, const struct emb_frame_hdr *hdr,
		       const struct iovec *iov, int niov, void *resp_buf,
		       size_t resp_cap, struct emb_frame_hdr *resp);

/*
 * Replies to req, in any order relative to other requests. hdr supplies
 * opcode (the response's, as the protocol has it), flags, table_id, count
 * and status; the transport sets magic, version, req_id (the request's)
 * and payload_len. hdr and the iov array are copied; the memory iov names
 * (it may point straight into table memory) is borrowed until done fires;
 * done may be NULL. req is consumed whatever the return: 0, or -EINVAL,
 * -EMSGSIZE (payload over max_frame_bytes), -ENOMEM, EMB_ECLOSED (the conn
 * has closed).
 */
static inline int emb_conn_reply(struct emb_req *req,
				 const struct emb_frame_hdr *hdr,
				 const struct iovec *iov, int niov,
				 emb_send_done_fn done, void *ctx)
{
	struct emb_transport *tr = req->conn->tr;
	int rc;

	if (!hdr || niov < 0 || (niov && !iov)) {
		tr->ops->req_release(req);
		return -EINVAL;
	}
	rc = emb__fault_hit(tr, EMB_FAULT_SEND);
	if (rc) {
		tr->ops->req_release(req);
		return rc;
	}
	return tr->ops->reply(req, hdr, iov, niov, done, ctx);
}

/*
 * Client conns: posts op's READs in order on c; op->done fires once, from
 * the loop, after the last one completed or the conn failed. A READ of
 * memory the peer does not (or no longer) have registered fails the whole
 * conn (RC queue pairs go to error): run these on a conn of their own so
 * other calls do not die with it. 0, or -EINVAL (bad op, or a landing not
 * registered on c's loop), -EOPNOTSUPP (TCP), EMB_ECLOSED (conn not open);
 * on an error done is never called.
 */
static inline int emb_conn_read(struct emb_conn *c, struct emb_read_op *op)
{
	if (!op || !op->segs || !op->n || !op->done || c->server)
		return -EINVAL;
	if (!c->tr->ops->read)
		return -EOPNOTSUPP;
	return c->tr->ops->read(c, op);
}

/* Drops a request without replying; its payload is dead afterwards. */
static inline void emb_req_release(struct emb_req *req)
{
	req->conn->tr->ops->req_release(req);
}

static inline struct emb_conn *emb_req_conn(const struct emb_req *req)
{
	return req->conn;
}

/*
 * The loop c belongs to, as its user created it: a "tcp,rdma" loop for
 * its conns of either kind (c->tr is then the TCP or RDMA transport
 * inside it). Its thread runs c's callbacks.
 */
static inline struct emb_transport *emb_conn_loop(const struct emb_conn *c)
{
	return c->tr->owner ? c->tr->owner : c->tr;
}

static inline void emb_conn_set_user(struct emb_conn *c, void *user)
{
	c->user = user;
}

static inline void *emb_conn_user(const struct emb_conn *c)
{
	return c->user;
}

/* "tcp" or "rdma": what this conn runs on, also on a "tcp,rdma" loop. */
static inline const char *emb_conn_transport(const struct emb_conn *c)
{
	return c->tr->ops->name;
}

/* "addr:port" of the other end; valid as long as the conn. */
static inline const char *emb_conn_peer(const struct emb_conn *c)
{
	return c->peer;
}

static inline void emb_conn_stats(const struct emb_conn *c,
				  struct emb_conn_stats *out)
{
	*out = c->stats;
}

#endif
