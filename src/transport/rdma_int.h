/*
 * src/transport/rdma_int.h - what rdma_conn.c (setup, teardown, event loop)
 * shares with rdma_dp.c (posting WRs, polling the CQ). rdma_conn.c calls
 * the data path's functions; the data path reaches back into setup only
 * through the struct emb_rdma_conn_ops that rdma_conn.c puts in each
 * transport, so neither file calls one that calls it. Not seen outside
 * src/transport. Every function here runs on the loop thread of the
 * transport it is given, as transport.h says; nothing here locks.
 *
 * Transport-level prefix that opens every SEND (docs/rdma.md has the why):
 *
 *   OFFSET  SIZE  MEANING
 *   0       1     type: EMB_RDMA_MSG_*
 *   1       3     reserved, 0
 *   4       4     REQ_*: rkey of the response landing area (0 = none,
 *                 the server must answer inline); RESP_*: 0
 *   8       8     REQ_*: address of the response landing area
 *   16      4     REQ_*: bytes the landing area holds (the caller's resp_cap)
 *   20      4     REQ_READ: rkey of the request payload
 *   24      8     REQ_READ: address of the request payload
 *
 * The 32-byte frame header of src/common/frame.h follows, then (REQ_INLINE,
 * RESP_INLINE) the payload. A zero-byte SEND with immediate data returns the
 * credit of a request the server dropped; the immediate is the low 32 bits
 * of its req_id.
 */
#ifndef EMB_TRANSPORT_RDMA_INT_H
#define EMB_TRANSPORT_RDMA_INT_H

#include "transport/transport_int.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define EMB_RDMA_PREFIX_SIZE 32u
#define EMB_RDMA_MSG_HDRS (EMB_RDMA_PREFIX_SIZE + EMB_FRAME_HDR_SIZE)
#define EMB_RDMA_SLOT_BYTES 4096u	/* one receive slot, one page */
#define EMB_RDMA_INLINE_MAX (EMB_RDMA_SLOT_BYTES - EMB_RDMA_MSG_HDRS)
#define EMB_RDMA_MAX_CREDITS 32u	/* receive slots per conn */
#define EMB_RDMA_RING 256u		/* send WRs per conn, power of two */
#define EMB_RDMA_SIG_GAP (EMB_RDMA_RING / 2) /* most unsignaled in a row */
#define EMB_RDMA_MAX_SGE 32u		/* cap on SGEs per WR */
#define EMB_RDMA_PAGE 4096u		/* arena allocation unit */
#define EMB_RDMA_SPIN_US 50u		/* busy-poll before sleeping */
#define EMB_RDMA_IOV_INLINE 8u		/* iov entries kept without malloc */
#define EMB_RDMA_HELLO_MAGIC 0x52424d45u /* "EMBR" little-endian */
#define EMB_RDMA_HELLO_VERSION 1u

enum emb_rdma_msg {
	EMB_RDMA_MSG_REQ_INLINE = 1, /* request with its payload */
	EMB_RDMA_MSG_REQ_READ = 2,   /* request; server READs the payload */
	EMB_RDMA_MSG_RESP_INLINE = 3, /* response with its payload */
	EMB_RDMA_MSG_RESP_WRITTEN = 4, /* payload already WRITTEN to landing */
	EMB_RDMA_MSG_RESP_TOOBIG = 5, /* payload_len > resp_cap, none sent */
};

struct emb_rdma_prefix {
	uint8_t type;	    /* enum emb_rdma_msg */
	uint8_t pad[3];	    /* 0 */
	uint32_t resp_rkey; /* landing area rkey; 0 = inline only */
	uint64_t resp_addr; /* landing area address */
	uint32_t resp_cap;  /* landing area bytes */
	uint32_t req_rkey;  /* REQ_READ: payload rkey */
	uint64_t req_addr;  /* REQ_READ: payload address */
};

_Static_assert(sizeof(struct emb_rdma_prefix) == EMB_RDMA_PREFIX_SIZE,
	       "rdma prefix is 32 bytes on the wire");

/*
 * rdma_cm private data, both ways (the connect request and the accept).
 *
 *   OFFSET  SIZE  MEANING
 *   0       4     magic EMB_RDMA_HELLO_MAGIC
 *   4       2     version EMB_RDMA_HELLO_VERSION
 *   6       2     credits: receive slots the sender pre-posted
 *   8       4     slot_bytes: size of each receive slot
 *   12      4     max_frame_bytes of the sender
 */
struct emb_rdma_hello {
	uint32_t magic;		  /* EMB_RDMA_HELLO_MAGIC */
	uint16_t version;	  /* EMB_RDMA_HELLO_VERSION */
	uint16_t credits;	  /* receive slots posted */
	uint32_t slot_bytes;	  /* bytes per receive slot */
	uint32_t max_frame_bytes; /* sender's frame limit */
};

/* wr_id: conn index in the high half, kind and sequence in the low. */
#define EMB_RDMA_WR_SEND 0u
#define EMB_RDMA_WR_RECV 1u
#define EMB_RDMA_WR_DRAIN_SQ 2u
#define EMB_RDMA_WR_DRAIN_RQ 3u
#define EMB_RDMA_SEQ_MASK 0x3fffffffu

static inline uint64_t emb__rdma_wr_id(uint32_t conn_idx, uint32_t kind,
				       uint32_t seq)
{
	return (uint64_t)conn_idx << 32 | (uint64_t)kind << 30 |
	       (seq & EMB_RDMA_SEQ_MASK);
}

/* A registered span lent to one message: an arena run or a one-off MR. */
struct emb_rdma_buf {
	char *addr;	     /* start; NULL = none held */
	size_t len;	     /* bytes usable */
	uint32_t lkey;	     /* local key */
	uint32_t rkey;	     /* remote key */
	uint32_t page;	     /* first arena page; UINT32_MAX = one-off */
	uint32_t npages;     /* arena pages held */
	struct ibv_mr *mr;   /* one-off only: its own registration */
};

/* One send-queue entry, built at connect time (EMB_RDMA_RING per conn). */
struct emb_rdma_swr {
	struct ibv_send_wr wr;	   /* reused: post changes addr/len/lkey */
	struct ibv_sge *sge;	   /* max_sge entries */
	struct emb_rdma_buf buf;   /* freed when this WR completes */
	emb_send_done_fn done;	   /* reply callback, fired on completion */
	void *ctx;		   /* its argument */
	struct emb_rdma_sreq *read; /* RDMA READ of this request's payload */
};

/* An item waiting in a conn's send queue for credits, WRs or arena. */
struct emb_rdma_op {
	struct emb_rdma_op *prev; /* queue neighbours */
	struct emb_rdma_op *next;
	uint8_t kind;		  /* EMB_RDMA_OP_* */
	bool queued;		  /* on the conn's queue now */
};

#define EMB_RDMA_OP_CALL 1
#define EMB_RDMA_OP_REPLY 2
#define EMB_RDMA_OP_READ 3
#define EMB_RDMA_OP_CREDIT 4
#define EMB_RDMA_OP_RDREAD 5 /* client: a one-sided read batch */

/* What a one-sided read batch keeps in its emb_read_op's priv. */
struct emb_rdma_rd {
	struct emb_rdma_op op; /* send-queue link (first member) */
	uint32_t next;	       /* next segment to post */
};

enum emb_rdma_call_state {
	EMB_RDMA_CALL_FREE = 0,
	EMB_RDMA_CALL_QUEUED,  /* waiting to be posted */
	EMB_RDMA_CALL_POSTED,  /* at the server, caller waiting */
	EMB_RDMA_CALL_ZOMBIE,  /* caller told; server may still write */
};

/* Client call slot; max_inflight per conn, index = low 20 bits of req_id. */
struct emb_rdma_call {
	struct emb_rdma_op op;	       /* send-queue link (first member) */
	struct emb_rdma_call *prev;    /* live list, oldest first */
	struct emb_rdma_call *next;
	struct emb_rdma_call *free_next; /* free list */
	uint64_t req_id;	       /* what the response must echo */
	uint64_t deadline_ms;	       /* emb__now_ms() deadline; 0 = none */
	struct emb_frame_hdr hdr;      /* request header, complete */
	const struct iovec *iov;       /* caller's array, or a copy below */
	int niov;
	struct iovec iov_inl[EMB_RDMA_IOV_INLINE]; /* copy while queued */
	struct iovec *iov_heap;	       /* copy of a longer array */
	void *resp_buf;		       /* caller's buffer */
	size_t resp_cap;	       /* its bytes */
	emb_call_done_fn done;
	void *ctx;
	struct emb_rdma_buf big;       /* payload the server READs */
	struct emb_rdma_buf bounce;    /* landing when resp_buf unregistered */
	uint64_t resp_addr;	       /* landing area told to the server */
	uint32_t resp_rkey;	       /* 0 = inline only */
	uint8_t state;		       /* enum emb_rdma_call_state */
	bool live;		       /* on the live list */
	bool at_server;		       /* sent, no response or credit yet */
};

enum emb_rdma_sreq_state {
	EMB_RDMA_SREQ_IDLE = 0, /* its receive slot is posted */
	EMB_RDMA_SREQ_READING,	/* payload being READ */
	EMB_RDMA_SREQ_HELD,	/* with the user */
	EMB_RDMA_SREQ_REPLYING, /* reply queued, partly posted */
	EMB_RDMA_SREQ_ORPHAN,	/* conn closed while held by the user */
};

/* Server request, one per receive slot. Reply state lives here too. */
struct emb_rdma_sreq {
	struct emb_req base;	   /* conn, hdr, payload (first member) */
	struct emb_rdma_op op;	   /* send-queue link: READ, REPLY, CREDIT */
	uint32_t slot;		   /* receive slot index */
	uint8_t state;		   /* enum emb_rdma_sreq_state */
	struct emb_rdma_prefix pfx; /* from the request */
	struct emb_rdma_buf big;   /* READ landing for large payloads */
	/* reply */
	struct emb_frame_hdr rhdr; /* response header, complete */
	const struct iovec *riov;  /* caller's array, or a copy below */
	int rniov;
	struct iovec riov_inl[EMB_RDMA_IOV_INLINE]; /* copy while queued */
	struct iovec *riov_heap;   /* copy of a longer remainder */
	emb_send_done_fn rdone;
	void *rctx;
	uint8_t rtype;		   /* EMB_RDMA_MSG_RESP_* */
	size_t unreg_bytes;	   /* bytes to copy into staging */
	struct emb_rdma_buf stage; /* final SEND + copied iov bytes */
	size_t stage_used;	   /* bytes of stage filled */
	int ri;			   /* next iov to post */
	size_t roff;		   /* offset within it */
	uint64_t remote_off;	   /* bytes WRITTEN so far */
};

enum emb_rdma_conn_state {
	EMB_RDMA_CONN_SETUP = 0, /* QP made, not connected yet */
	EMB_RDMA_CONN_OPEN,	 /* connected */
	EMB_RDMA_CONN_DRAINING,	 /* failed or closed: flushing WRs */
};

struct emb_rdma_transport;
struct emb_rdma_conn;

/* Connection setup's part in a conn's life, for the data path (rdma_conn.c
 * fills it; the shims at the end of this file call it). */
struct emb_rdma_conn_ops {
	/* Starts an orderly close of c: disconnect, fail pending work,
	 * drain. */
	void (*fail)(struct emb_rdma_conn *c, int reason);
	/* Server: marks c open, counts it and runs on_open (once). */
	void (*opened)(struct emb_rdma_conn *c);
	/* A drain marker or a released request may let c be freed now. */
	void (*maybe_free)(struct emb_rdma_conn *c);
};

struct emb_rdma_conn {
	struct emb_conn base;		/* first member */
	struct emb_rdma_transport *rt;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	uint32_t idx;			/* slot in rt->conns, wr_id high */
	uint8_t state;			/* enum emb_rdma_conn_state */
	int reason;			/* why it closed */
	bool user_gone;			/* destroyed, or on_close ran */
	bool close_pending;		/* on_close queued for the loop */
	bool opened;			/* server: on_open ran */
	bool sq_drained;		/* send drain marker seen: free */
	bool rq_drained;		/* receive marker seen; not waited
					   for, as a QP in error writes no
					   slot and stale CQEs are dropped */
	uint32_t busy;			/* callbacks running; no free */
	uint32_t qpn;			/* qp_num, to drop stale CQEs */
	uint8_t wc_status;		/* failed WR's status, for the log */
	struct emb_rdma_conn *close_next; /* deferred on_close list */
	/* receive slots */
	char *rx_mem;			/* credits * EMB_RDMA_SLOT_BYTES */
	struct ibv_mr *rx_mr;
	struct ibv_recv_wr *rx_wr;	/* one per slot, built at connect */
	struct ibv_sge *rx_sge;
	uint32_t nslots;		/* receive slots posted here */
	/* arena: pages lent to messages */
	char *arena;
	struct ibv_mr *arena_mr;
	uint64_t *arena_map;		/* bit set = page in use */
	uint32_t arena_pages;
	uint32_t arena_hint;		/* where the next search starts */
	/* send ring */
	struct emb_rdma_swr *ring;	/* EMB_RDMA_RING entries */
	struct ibv_sge *ring_sge;	/* EMB_RDMA_RING * max_sge */
	uint32_t sq_head;		/* next sequence to post */
	uint32_t sq_tail;		/* oldest not completed */
	uint32_t sq_last_sig;		/* last signaled sequence */
	/* send queue of ops that wait for resources */
	struct emb_rdma_op *q_head;
	struct emb_rdma_op *q_tail;
	uint64_t q_bytes;		/* bytes of queued ops */
	/* client */
	uint32_t credits;		/* sends the server can still take */
	uint32_t peer_slots;		/* server's receive slots */
	struct emb_rdma_call *calls;	/* max_inflight slots */
	struct emb_rdma_call *call_free;
	struct emb_rdma_call *live_head; /* calls not yet done, oldest first */
	struct emb_rdma_call *live_tail;
	uint32_t calls_used;		/* slots not free (zombies too) */
	uint64_t req_seq;		/* req_id high bits */
	uint32_t call_timeout_ms;
	emb_conn_fn on_close;		/* client or server */
	void *arg;
	/* server */
	struct emb_rdma_sreq *sreqs;	/* nslots entries */
	uint32_t held;			/* sreqs with the user or replying */
	emb_request_fn on_request;
	emb_conn_fn on_open;
};

/* One registered range in the per-transport lookup table. */
struct emb_rdma_mr {
	struct emb_mr base;	/* addr, len, lkey, rkey (first member) */
	struct ibv_mr *mr;
};

struct emb_rdma_transport {
	struct emb_transport base;	 /* first member */
	const struct emb_rdma_conn_ops *conn_ops; /* rdma_conn.c's */
	struct ibv_context **devs;	 /* rdma_get_devices() list */
	struct ibv_context *verbs;	 /* the device every conn uses */
	struct ibv_pd *pd;
	struct ibv_comp_channel *comp_ch;
	struct ibv_cq *cq;
	uint32_t cq_cap;		 /* CQEs the CQ holds */
	uint32_t cq_max;		 /* device limit, for resizing */
	uint32_t cq_used;		 /* CQEs reserved by live QPs */
	struct rdma_event_channel *ev_ch;
	int epfd;
	int wake_fd;
	uint32_t max_sge;		 /* SGEs per WR we use */
	uint8_t rd_atom;		 /* READs in flight per QP */
	bool armed;			 /* CQ notification requested */
	bool dying;			 /* in destroy */
	bool dev_gone;			 /* DEVICE_REMOVAL seen */
	struct emb_rdma_mr **mrs;	 /* sorted by address */
	uint32_t nmrs;
	uint32_t mrs_cap;
	struct emb_rdma_conn **conns;	 /* wr_id index -> conn; NULL free */
	uint32_t nconns;		 /* entries in use or NULL */
	uint32_t conns_cap;
	struct emb_rdma_conn *close_head; /* deferred on_close */
	struct emb_rdma_listener *listeners; /* on this loop's channel */
	uint64_t bounced;		 /* calls whose response bounced */
	uint64_t copied_bytes;		 /* reply bytes copied to staging */
	uint64_t oneoff;		 /* buffers too big for the arena */
};

/* A listening cm_id; its accepted conns may go to other loops. */
struct emb_rdma_listener {
	struct emb_listener base;	  /* tr, port (first member) */
	struct rdma_cm_id *id;		  /* on base.tr's event channel */
	struct emb_rdma_listener *next;	  /* rt->listeners */
	struct emb_transport **loops;	  /* copy of opts->loops */
	uint32_t nloops;
	uint32_t rr;			  /* next loop, round-robin */
	emb_request_fn on_request;
	emb_conn_fn on_open;
	emb_conn_fn on_close;
	void *arg;
};

#define emb__rdma_conn_of(c) ((struct emb_rdma_conn *)(c))
#define emb__rdma_tr_of(t) ((struct emb_rdma_transport *)(t))

/* ---- rdma_dp.c ---------------------------------------------------------- */

/* Builds the ring and receive WRs of c (connect time). 0 or -ENOMEM. */
int emb__rdma_dp_init(struct emb_rdma_conn *c);
/* Posts every receive slot. 0 or a negative errno. */
int emb__rdma_post_all_recv(struct emb_rdma_conn *c);
/* Polls the CQ until empty or budget CQEs; returns CQEs handled. */
int emb__rdma_poll_cq(struct emb_rdma_transport *rt, int budget);
/* Times out calls past their deadline; returns how many. Sets *next_ms to
 * the nearest remaining deadline (unchanged if none). */
int emb__rdma_timeouts(struct emb_rdma_transport *rt, uint64_t now,
		       uint64_t *next_ms);
/* Completes every queued or posted call and reply of c with reason. */
void emb__rdma_fail_ops(struct emb_rdma_conn *c, int reason);
/* Frees c's one-off buffers and call/reply buffers at teardown. */
void emb__rdma_release_bufs(struct emb_rdma_conn *c);
/* Returns a buffer to c's arena (or frees a one-off). */
void emb__rdma_buf_put(struct emb_rdma_conn *c, struct emb_rdma_buf *b);
/* Finds the registered range holding [p, p + len), or NULL. */
struct emb_rdma_mr *emb__rdma_mr_find(struct emb_rdma_transport *rt,
				      const void *p, size_t len);

int emb__rdma_call(struct emb_conn *c, const struct emb_frame_hdr *hdr,
		   const struct iovec *iov, int niov, void *resp_buf,
		   size_t resp_cap, emb_call_done_fn done, void *ctx);
int emb__rdma_read(struct emb_conn *c, struct emb_read_op *op);
int emb__rdma_rkey_of(struct emb_transport *tr, const void *addr, size_t len,
		      uint32_t *rkey);
int emb__rdma_reply(struct emb_req *req, const struct emb_frame_hdr *hdr,
		    const struct iovec *iov, int niov, emb_send_done_fn done,
		    void *ctx);
void emb__rdma_req_release(struct emb_req *req);

/* ---- rdma_conn.c, through rt->conn_ops ---------------------------------- */

static inline void emb__rdma_conn_fail(struct emb_rdma_conn *c, int reason)
{
	c->rt->conn_ops->fail(c, reason);
}

static inline void emb__rdma_conn_opened(struct emb_rdma_conn *c)
{
	c->rt->conn_ops->opened(c);
}

static inline void emb__rdma_conn_maybe_free(struct emb_rdma_conn *c)
{
	c->rt->conn_ops->maybe_free(c);
}

#endif
