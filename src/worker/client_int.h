/*
 * src/worker/client_int.h - the client library's shared state: the client,
 * its servers, tables, ops and their parts, and the calls its files make
 * into each other. Not installed.
 *
 * The files, lowest first; each calls only files below it, and those call
 * back up only through c->fns (struct emb__part_fns):
 *   table.c        a table's handle: ids per server, location cache, refs
 *   oppool.c       ops handed out, given back and kept for reuse
 *   conn.c         servers' conns: HELLO, reconnect, read conns, the loop
 *   onesided.c     one-sided pulls: RDMA READs and the location cache
 *   replicas.c     the replicated map: routing, reroute, failover, fixup
 *   batch.c        a batch deduplicated, partitioned and cut into parts
 *   op.c           the data calls (pull, push, assign, erase): one
 *                  skeleton, parts sent, one completion hook per kind
 *   broadcast.c    one request to every server, waited for
 *   table_admin.c  table calls to every server: create, open, drop, modes
 *   pace.c         calls timed; PACE to the servers during moves
 *   client.c       the client: create, destroy, counters
 *   admin.c, cached.c, cluster.c: calls built on the above
 *
 * Threads: fields say who may touch them; "loop" is the client's network
 * thread, which alone runs completions and reconnects.
 */
#ifndef EMB_WORKER_CLIENT_INT_H
#define EMB_WORKER_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "cluster/hello.h"
#include "cluster/map.h"
#include "common/addr.h"
#include "common/token.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
#include "worker/embstore.h"
#include "worker/respbuf.h"

struct emb_dedup;
struct emb_hist;
struct emb_node;
struct emb_wire_spec;
struct emb__part_fns;

#define NONE UINT32_MAX /* no index */
/* Room for an error response: u32 length + message, in 64-byte lines. */
#define ERR_CAP ((4u + EMB_WIRE_ERRMSG_MAX + 63u) & ~63u)

#define NOT_REMOTE UINT32_MAX /* a server table without seals */
#define LOC_WAYS 4u /* locations per bucket; an id may sit in either of two
		       buckets, so ids rarely push each other out below
		       ~90% load */

enum rd_state {
	RD_DOWN = 0, /* no read conn (or not one-sided) */
	RD_HELLO,    /* read conn open, HELLO in flight */
	RD_UP,	     /* READs and LOCATEs may go */
};

enum srv_state {
	SRV_UP = 0, /* conn open and HELLO done */
	SRV_DOWN,   /* no conn: one is made when a part waits */
	SRV_HELLO,  /* conn open, HELLO in flight */
	SRV_TABLES, /* a newcomer on a dead rank: its table ids are being
		       learned (CREATE of each open table) */
};

struct part;
struct emb_async;

/*
 * Ops (struct emb_async) given back by emb_async_wait() and kept with their
 * scratch, mutex and condition variable for the next call: a warmed-up
 * client allocates nothing per batch. Apart from the client because an op
 * may be waited for after emb_client_destroy(): the last put frees it.
 */
struct op_pool {
	pthread_mutex_t mu;	   /* guards the rest */
	struct emb_async *idle[2]; /* reusable, most recently used first:
				      pulls, and the rest (their scratch
				      grows to different sizes) */
	uint32_t nidle;		   /* ops on both lists */
	uint32_t lent;		   /* handed out, not yet given back */
	bool closed;		   /* the client is gone: puts free */
};

struct server {
	char host[EMB_HOST_MAX];    /* as given, without brackets */
	uint16_t port;		    /* as given */
	struct emb_conn *conn;	    /* loop thread only after start; NULL
				       while down */
	struct emb_wire_limits lim; /* from its first HELLO response */
	bool dead;		    /* declared dead by the scheduler; atomic */
	uint32_t gen;		    /* incarnation of this rank: 1, one more
				       each time a newcomer takes it; atomic */
	uint64_t push_seq;	    /* last PUSH sequence number; atomic */
	/* Loop thread only, once the loop runs: */
	struct emb_client *c;	    /* owner */
	uint32_t state;		    /* enum srv_state */
	bool sessions;		    /* it applies retried pushes once */
	bool pull_many;		    /* it takes PULL_MANY (many.c) */
	bool push_many;		    /* it takes PUSH_MANY (many.c) */
	bool no_births;		    /* its last HELLO lacked BIRTHS (written
				       by the loop, read by callers: atomic;
				       false until it said hello) */
	struct part *wait_head;	    /* parts waiting for a conn, FIFO */
	struct part *wait_tail;	    /* last of them */
	struct part *fly;	    /* parts posted on conn, not yet done */
	uint64_t fly_check_ms;	    /* no part in fly has an earlier
				       deadline; monotonic ms */
	uint64_t timeout_log_ms;    /* next timeout to log, monotonic ms */
	uint64_t retry_ms;	    /* next reconnect, monotonic ms */
	uint32_t backoff_ms;	    /* wait after the next failure */
	int last_err;		    /* why the last conn or attempt failed */
	uint64_t server_id;	    /* from HELLO: another one = restarted */
	bool rdma_offered;	    /* its HELLO: it listens on RDMA too */
	bool rdma_refused;	    /* an RDMA connect to it failed: TCP */
	bool on_rdma;		    /* the conn runs on RDMA; atomic */
	bool revived;		    /* a newcomer took this dead rank: learn
				       its table ids before writing */
	_Alignas(8) uint8_t tab_req[EMB_WIRE_CREATE_REQ_MAX]; /* CREATE */
	_Alignas(8) uint8_t tab_resp[8 + EMB_WIRE_ERRMSG_MAX];
	struct emb_wire_spec *tab_specs; /* the open tables, copied */
	uint32_t tab_n, tab_at;		 /* how many; the one asked for */
	_Alignas(8) uint8_t hello_resp[8 + EMB_WIRE_ERRMSG_MAX]; /* payload */
	/* One-sided pulls, loop thread only once the loop runs: */
	struct emb_conn *rconn;	    /* READs and LOCATEs; NULL while down */
	uint32_t rstate;	    /* enum rd_state */
	uint16_t rgen;		    /* bumped per read conn: rkeys belong to
				       the server loop that conn landed on */
	uint64_t rretry_ms;	    /* next read conn attempt, monotonic ms */
	uint32_t rbackoff_ms;	    /* wait after the next failure */
	_Alignas(8) uint8_t rhello_resp[8 + EMB_WIRE_ERRMSG_MAX]; /* payload */
	/* PACE (pace.c), loop thread only: */
	bool pace_busy;		    /* one unanswered */
	_Alignas(8) uint8_t pace_req[EMB_WIRE_HDR_SIZE + EMB_WIRE_PACE_SIZE];
	_Alignas(8) uint8_t pace_resp[8 + EMB_WIRE_ERRMSG_MAX];
};

/* Windows with no move the baseline is made of: 10 s. Its median stays
 * the steady state's through a few seconds of something else (a server
 * starting with --pretouch on the same host faulted pages for 4.7 s
 * before it joined; over 8 windows the baseline was taken from those:
 * 3.7 ms, where the steps' p99, a pull and a push each, was 2.0 ms). */
#define PACE_BASE 40u

/* The calls' latency by window (pace.c), loop thread only. */
struct pace_state {
	struct emb_hist *h;	  /* this window's calls, ns */
	uint64_t win_ms;	  /* when it began, monotonic */
	uint64_t move_ms;	  /* the map last showed a move; 0 never */
	uint32_t base[PACE_BASE]; /* p99s of windows with no move, us */
	uint32_t nbase, base_at;  /* kept; the next to replace */
	bool based;		  /* a baseline was logged */
	uint32_t windows;	  /* reported in this move */
	uint32_t worst;		  /* their worst p99, us */
};

struct emb_client {
	struct emb_transport *tr;      /* the loop */
	const struct emb__part_fns *fns; /* op.c's, for the files below it */
	bool dual;		       /* it is "tcp,rdma": conns choose */
	struct emb__respbufs *bufs;    /* registered pull responses */
	struct op_pool *ops;	       /* ops for reuse */
	pthread_t thread;	       /* runs the loop */
	bool running;		       /* thread started */
	struct server *srv;	       /* nsrv servers, in the order given */
	uint32_t nsrv;		       /* >= 1 */
	uint16_t slot_map[EMB_NSLOTS]; /* slot -> server index */
	uint32_t timeout_ms;	       /* per request */
	uint32_t part_ids;	       /* most ids per request */
	uint8_t admin[EMB_TOKEN_MAX];  /* EMB_ADMIN_TOKEN_FILE's token */
	uint32_t admin_len;	       /* bytes in admin; 0 = none */

	pthread_mutex_t err_lock;		/* guards last_* */
	int last_status;			/* of the last server error */
	char last_msg[EMB_WIRE_ERRMSG_MAX + 1]; /* its message */

	uint64_t requests; /* atomic counters */
	uint64_t errors;
	uint64_t ids_in;
	uint64_t ids_sent;

	struct emb_node *node; /* cluster membership, or NULL */

	uint64_t session; /* PUSH session id: random, not 0 */
	_Alignas(8) uint8_t hello_req[EMB_HELLO_REQ_MAX]; /* HELLO frame */
	uint32_t hello_len;   /* bytes of hello_req */
	bool stopping;	      /* destroy began: no retries; atomic */
	uint64_t retries;     /* parts sent again; atomic */
	uint64_t reconnects;  /* conns made again; atomic */

	bool onesided;		 /* pull_mode ONESIDED */
	/* An observer's client (emb_client_from_sched/_coordinator): a
	 * server of the map it cannot reach at create is tried again at
	 * each call instead of failing the create; set before it. */
	bool observer;
	uint32_t loc_rows;	 /* locations cached per table */
	uint64_t rows_read;	 /* one-sided counters; atomic */
	uint64_t rows_fallback;
	uint64_t seal_failures;
	uint64_t rconn_losses;

	/* Replicated map (R > 1), else NULL. Written by the loop thread on
	 * a death, read by callers while they partition: under map_mu. */
	struct emb_cmap *cmap;
	pthread_mutex_t map_mu;
	uint16_t *grp;	    /* EMB_NSLOTS: slot -> replica group */
	uint16_t (*groups)[EMB_CMAP_REPLICAS_MAX]; /* holders of each group */
	uint32_t ngroups;   /* groups in use */
	/* Epoch of the scheduler's map this client routes writes by, under
	 * map_mu (0: no scheduler map, writes carry no epoch). Failovers
	 * worked out here do not change it: they only drop writers. */
	uint64_t map_epoch;
	/* cmap has deaths the coordinator's last map did not (failover()):
	 * its fills are guesses, under map_mu. A copy whose fill's fate
	 * decides the call waits for a map that has them (emb__rep_lost()). */
	bool map_guessed;

	pthread_mutex_t tab_mu;		 /* guards tabs */
	struct emb_client_table *tabs;	 /* open tables: ids to relearn */
	struct part *delayed;		 /* loop: copies waiting to go again */
	uint64_t moved;			 /* copies refused by a fill; atomic */
	/* Slots the map (cmap) copies ahead or fills: a move is under
	 * way. Written under map_mu, read by the loop (pace.c); atomic. */
	uint32_t map_moves;
	uint64_t map_moves_ms; /* when a map last had one; atomic */
	struct pace_state pace;		 /* loop: pace.c */
	uint64_t pace_sent;		 /* PACE frames sent; atomic */
};

struct emb_client_table {
	struct emb_client *c;	       /* borrowed */
	char name[EMB_WIRE_NAME_SIZE]; /* spec.name points here */
	struct emb_table_spec spec;    /* as created */
	uint32_t row_floats;	       /* wwords + state floats */
	uint32_t wwords;	       /* words of the weights in the
					  table's row format */
	uint32_t push_fmt;	       /* gradients on the wire: fp32 (0),
					  fp16 or bf16 (set_push_format) */
	uint32_t *ids;		       /* table id on each server */
	uint32_t mode; /* enum emb_mode, as set by this client */
	uint32_t admits; /* the table has admission or eviction, as far as
			    this handle knows (created or set by it, or a
			    server refused a push for it): replicated
			    pushes ask the primaries first (atomic) */
	uint32_t evicts; /* the table has eviction, as far as this handle
			    knows (created or set by it): its replicated
			    pushes name births (atomic) */
	/* One-sided pulls: the caches below are the loop thread's. */
	uint32_t refs;		       /* the user's + LOCATEs in flight;
					  atomic, the last frees */
	struct loc *loc;	       /* (loc_mask + 1) * LOC_WAYS slots, or
					  NULL */
	uint32_t loc_mask;	       /* buckets - 1 */
	struct remote *rem;	       /* per server: its record layout */
	struct emb_client_table *tnext, *tprev; /* c->tabs, under tab_mu */
};

/* Where an id's record was, on which server and read conn generation. */
struct loc {
	uint64_t id;   /* the id */
	uint64_t addr; /* record address on the server; 0 = empty slot */
	uint32_t rkey; /* for READs on that server's read conn */
	uint16_t srv;  /* server index */
	uint16_t gen;  /* its rgen when located */
};

/* A server's remote-readable table as LOCATE described it. */
struct remote {
	uint64_t seed;	    /* seal seed */
	uint32_t rec_bytes; /* record bytes; 0 = not known yet, NOT_REMOTE =
			       the server keeps no seals (atomic: read by
			       callers when they size a pull) */
};

enum op_kind {
	OP_PULL,
	OP_PUSH,
	OP_ASSIGN,
	OP_ERASE,
	OP_ADMIN,
	OP_BIRTHS,
};

/* A part's request and its answer: one frame to one server. */
struct part_req {
	uint32_t server;	  /* index into c->srv */
	uint32_t first;		  /* offset into the op's partitioned ids */
	uint32_t n;		  /* ids in this part */
	struct emb_frame_hdr hdr; /* request header (opcode, table, count) */
	struct iovec iov[EMB_WIRE_IOV_MAX]; /* request payload */
	int niov;		  /* entries used */
	const uint32_t *births;	  /* PUSH with EMB_F_BIRTHS: its n rows'
				     births (in the op's memory) */
	uint8_t prefix[EMB_WIRE_PUSH_SESSION_PREFIX_SIZE]; /* PUSH's step,
							      rank, session */
	uint64_t seq;		   /* PUSH: sequence number to its server */
	uint32_t gen;		   /* data calls: its server's gen when routed
				      (a newcomer on that rank is not the
				      server it was routed to); 0 = any */
	bool once;		   /* never sent again: a synchronous push */
	void *resp;		   /* response payload lands here */
	size_t resp_cap;	   /* bytes */
	struct emb_frame_hdr rhdr; /* response header, once done */
	int status;		   /* this part's result */
};

/* A part waiting to go again: for its server's conn, or a back-off; or
 * posted on the conn, in its server's fly list until it is done. */
struct part_retry {
	struct part *wnext; /* next waiting on the server */
	struct part *fnext; /* fly list: next posted on the server */
	struct part *fprev; /* fly list: previous, NULL for the head */
	bool flying;	    /* in its server's fly list */
	bool reading;	    /* ...for its READs on the read conn */
	bool reroute;	    /* pull: routed again before it goes (its
			       server no longer held its slots) */
	uint64_t due_ms;    /* delayed: when it goes again, monotonic ms */
	uint32_t wait_ms;   /* delayed: its next back-off */
	struct part *dnext; /* next delayed part */
};

/* A replicated write's copy (nrep > 0), or a fan-out's skipped part. */
struct part_rep {
	uint32_t lead;	    /* first part of its copies (they follow it) */
	uint32_t nrep;	    /* copies; 0 = not a replicated write */
	bool skip;	    /* fan-out to a removed server whose slots live
			       on: no request, no response */
	bool counted;	    /* erase, lead copy: a copy's count was taken */
	bool source;	    /* a copy emb__rep_trim() made of the copy to its
			       group's acting primary: it is that copy */
	bool asked;	    /* posted on a conn and not answered since: its
			       server may have applied it (conn.c) */
	uint8_t lost;	    /* group's copy whose server died first (enum
			       rep_lost, replicas.c): whether it could have
			       applied the write */
	uint64_t epoch;	    /* map epoch it was routed by (0: none), or
			       last sent again by */
	uint64_t routed;    /* map epoch its group was first routed by */
	uint64_t fixed;	    /* epoch this copy's refusal last completed
			       its group's writers for */
	struct part *ext;   /* lead copy: copies emb__rep_fixup() added */
	struct part *enext; /* next of those */
};

/* A one-sided pull part (os), or a pull that LOCATEs its ids (learn). */
struct part_rd {
	bool os;		   /* READ the rows whose location is known */
	bool os_done;		   /* READs over: the next send is two-sided */
	bool learn;		   /* LOCATE the ids after the PULL */
	bool fb;		   /* PULL of the misses only: miss maps row j
				      of the response to the part's id */
	uint16_t rgen;		   /* the server's rgen its READs went on */
	uint32_t rb;		   /* record bytes the landing was sized for */
	char *land;		   /* n records of rb bytes, registered */
	struct emb_read_seg *segs; /* up to n READs */
	uint32_t *seg_j;	   /* the part's id index of each READ */
	uint32_t *miss;		   /* the part's id indexes sent two-sided */
	uint64_t *miss_ids;	   /* their ids: the fallback's payload */
	uint32_t nmiss;		   /* entries in miss */
	struct emb_read_op rop;	   /* the READ batch */
};

/* One request of an op, with the state of each concern apart. */
struct part {
	struct emb_async *op;	/* owner */
	struct part_req req;	/* the frame and its answer */
	struct part_retry retry; /* waiting to go again */
	struct part_rep rep;	/* replicated writes */
	struct part_rd rd;	/* one-sided pulls */
};

struct emb_async {
	struct emb_client *c; /* borrowed */
	enum op_kind kind;    /* what completes the parts */
	uint32_t dim;	      /* row words the caller sees */
	uint32_t state;	      /* pull with state: of those, state floats */
	uint32_t wire;	      /* pull: words of a row as the servers send
				 it (the table's format) */
	uint32_t decode;      /* pull: enum emb_row_format to decode into
				 f32 rows for the caller, 0 = copy as sent */
	uint32_t n;	      /* caller's ids */
	float *out;	      /* pull: caller's rows */
	uint8_t *found;	      /* pull: caller's found[] or NULL */
	uint32_t *births;     /* births: caller's births[] */
	uint32_t *pu;	      /* partitioned index -> distinct index */
	uint32_t *first;      /* distinct index -> first position */
	uint32_t *next;	      /* position -> next of the same id */
	uint64_t count;	      /* erase: ids that existed */
	struct part *parts;   /* nparts */
	uint32_t nparts;      /* parts posted */
	uint32_t pending;     /* loop thread: parts not done */
	int status;	      /* first error, else 0 */
	char err_msg[EMB_WIRE_ERRMSG_MAX + 1]; /* the server's text for status,
						  copied as the op completes
						  (the client may be gone when
						  it is waited for); "" none */
	uint64_t deadline_ms; /* monotonic: retries stop here */
	uint64_t t0_ns;	      /* posted at, emb_clock_ns() (pace.c) */
	const uint32_t *tids; /* the table's id on each server (updated
				 on the loop when a newcomer's are learned) */
	struct emb_client_table *tbl; /* pull: the table, held (refs) until
					 emb__op_free() */
	struct part *split;   /* pull: parts a reroute split off (their own
				 memory, freed with the op), by rep.enext */
	void *os_mem;	      /* one-sided bookkeeping of the parts (kept) */
	uint32_t stride;      /* replicated write: floats per row sent */
	void *mem;	      /* everything above lives here */
	void *resp_mem;	      /* response buffers */
	struct emb__respbuf *rbuf; /* pull: the registered ones instead */
	bool tainted;		   /* a call failed in the transport: rbuf may
				      still be written to, never reuse it */

	pthread_mutex_t mu; /* guards done, with cv */
	pthread_cond_t cv;  /* signalled once done */
	bool done;	    /* all parts finished */

	/* Kept across uses of the op (struct op_pool), grown on demand: */
	struct op_pool *pool;	     /* where emb_async_wait() puts it */
	struct emb_async *pool_next; /* pool's idle list */
	struct emb_task task;	     /* posts op_issue() to the loop */
	size_t mem_cap;		     /* bytes at mem */
	size_t parts_cap;	     /* bytes at parts */
	size_t resp_mem_cap;	     /* bytes at resp_mem */
	size_t os_mem_cap;	     /* bytes at os_mem */
	uint32_t *cnt;		     /* ids per server or group, and starts */
	size_t cnt_cap;		     /* bytes at cnt */
	struct emb_dedup *dedup;     /* the caller thread's, during the call */
	uint32_t dedup_max;	     /* largest batch dedup takes */
};

static inline void add(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static inline bool stopping(const struct emb_client *c)
{
	return __atomic_load_n(&c->stopping, __ATOMIC_ACQUIRE);
}

static inline bool srv_dead(const struct server *s)
{
	return __atomic_load_n(&s->dead, __ATOMIC_RELAXED);
}

/*
 * What op.c does with a part, for the files below it (conn.c, onesided.c,
 * replicas.c): they reach it only through c->fns, so that no two files
 * call each other. Loop thread.
 */
struct emb__part_fns {
	/* Posts p to its server, or queues it; a failure ends it. */
	void (*send)(struct emb_client *c, struct part *p);
	/* p is over with status and the response header (NULL: none). */
	void (*end)(struct part *p, int status,
		    const struct emb_frame_hdr *resp);
};

/* ---- table.c ---- */

/*
 * A handle for the table ws describes, listed in c->tabs (so that a
 * newcomer on a dead rank learns its id), one reference held, its ids all
 * 0. 0 or -ENOMEM.
 */
int emb__table_new(struct emb_client *c, const struct emb_wire_spec *ws,
		   struct emb_client_table **out);
/* Drops a reference: the user's, a pull's or a LOCATE's; the last frees. */
void emb__table_unref(struct emb_client_table *t);

/* ---- oppool.c ---- */

/*
 * A buffer of at least need bytes (64-byte aligned) in place of old, of
 * *cap bytes, whose contents are dropped. NULL (old kept): -ENOMEM.
 */
void *emb__op_grow(void *old, size_t *cap, size_t need);
/* op->mem of at least need bytes. 0 or -ENOMEM. */
int emb__op_mem(struct emb_async *op, size_t need);
/* An op of kind for a call on c: a reused one, else new. NULL: -ENOMEM. */
struct emb_async *emb__op_new(struct emb_client *c, enum op_kind kind);
/* Gives op back for reuse (or frees it). NULL: no-op. */
void emb__op_free(struct emb_async *op);
/* Client destroy: the pool goes once the ops still out are back. */
void emb__op_pool_close(struct op_pool *pl);
/* Zeroed counts for nkeys servers or groups, then room for nkeys + 1
 * starts, in op->cnt. 0 or -ENOMEM. */
int emb__op_counts(struct emb_async *op, uint32_t nkeys);
/* op->parts with room for nparts, zeroed. 0 or -ENOMEM. */
int emb__op_parts(struct emb_async *op, uint32_t nparts);
/* A buffer for an error message per part of a call whose success has no
 * payload. 0 or -ENOMEM. */
int emb__op_err_bufs(struct emb_async *op);
/*
 * PUSH part p's payload (p->req.n rows): its prefix (p->req.prefix, whose
 * length conn.c sets per send), the ids, their gradients of rowb bytes
 * each (2-byte values when half, then zeros to a multiple of 8), and the
 * births (NULL: none; flagged EMB_F_BIRTHS), zeros to a multiple of 8.
 * An empty part (a synchronous STEP_END) is its prefix alone.
 */
void emb__push_iovs(struct part *p, const uint64_t *ids, const void *rows,
		    size_t rowb, bool half, const uint32_t *births);
/* p's n births appended to its payload, zeros to a multiple of 8, flagged
 * EMB_F_BIRTHS (PUSH and ASSIGN: the births end the frame). */
void emb__births_iovs(struct part *p, const uint32_t *births);
/*
 * Loop thread: what posting op does around its parts' sends (op.c),
 * for a caller that sends them itself (many.c): begin counts them, end
 * finishes op once every part has ended.
 */
void emb__op_issue_begin(struct emb_async *op);
void emb__op_issue_end(struct emb_async *op);
/*
 * emb_client_table_pull_async() but not posted: the op's parts are ready
 * for emb__op_issue_begin() and their sends (an op of no parts is done).
 */
int emb__pull_prepare(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, float *out, uint32_t flags, uint8_t *found,
		      struct emb_async **op);
/* The same for emb_client_table_push_async(). */
int emb__push_prepare(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, const float *grads, uint64_t step,
		      uint32_t rank, struct emb_async **op);
/* Loop thread: op is over; wakes its waiter. */
void emb__op_complete(struct emb_async *op);
/* Any thread: blocks until op is over (it stays the caller's). */
void emb__op_wait_done(struct emb_async *op);

/* ---- pace.c ---- */

/* At create: 0 or -ENOMEM. destroy after the loop stopped. */
int emb__pace_create(struct emb_client *c);
void emb__pace_destroy(struct emb_client *c);
/* Loop thread: op finished (a pull or push counts in the window). */
void emb__pace_record(struct emb_client *c, struct emb_async *op);
/* Loop thread: closes the window once it is due; reports during moves. */
void emb__pace_tick(struct emb_client *c, uint64_t now_ms);

/* ---- conn.c ---- */

/* Connects to every server of c over transport and says HELLO (the
 * creating thread, before the loop runs). 0, or the first failure. */
int emb__conn_connect_all(struct emb_client *c, const char *transport,
			  const struct emb_client_opts *opts);
/* The loop thread's body (arg: the client), until c is stopping. */
void *emb__conn_loop(void *arg);
/* Loop thread: posts p on its server's conn, or queues it until the
 * server is up again. */
void emb__conn_post(struct emb_client *c, struct part *p);
/*
 * Loop thread: p's call completed with status and resp (the answer's
 * header, its payload in p->req.resp), as if p had been posted by
 * emb__conn_post() (p in its server's fly list): a lost conn sends it
 * again while the deadline allows, else it ends.
 */
void emb__conn_part_done(struct part *p, int status,
			 const struct emb_frame_hdr *resp);
/* Loop thread: ends every part waiting on s with status. */
void emb__conn_fail_waiting(struct server *s, int status);
/* Loop thread: p is posted on one of s's conns (p->retry.reading: its
 * READs on the read conn) until its completion takes it off, so that it
 * ends at its op's deadline (the loop drops that conn then). */
void emb__conn_fly_add(struct server *s, struct part *p);
void emb__conn_fly_del(struct server *s, struct part *p);
/* Loop thread: a push part's session flag and prefix, for s as it is now. */
void emb__conn_session_prep(const struct server *s, struct part *p);
/*
 * Loop thread: p's op passed its deadline while p waited for its server
 * or was on its way there; why is the last thing that went wrong (0:
 * nothing but silence). Records the call's error, whose message names the
 * server by address and rank, and returns its code: why when the server
 * refused or dropped the connection (it is down: -ECONNREFUSED,
 * EMB_EPEERDEAD ...), else -ETIMEDOUT.
 */
int emb__conn_timeout(struct emb_client *c, const struct part *p, int why);
/* Loop thread: drops s's read conn (one-sided); a no-op without one. */
void emb__rconn_lost(struct server *s, int reason);

/* ---- onesided.c ---- */

/* Which parts of a pull READ, and their bookkeeping; adds their landing
 * bytes to *resp_bytes. 0 or -ENOMEM. */
int emb__os_plan(struct emb_async *op, struct emb_client_table *t,
		 size_t *resp_bytes);
/* Loop thread: READs for p's ids with a known location, the rest as a
 * PULL. */
void emb__os_start(struct emb_client *c, struct part *p);
/* Loop thread: after p's PULL, LOCATE its ids for the next pull. */
void emb__os_learn(struct emb_async *op, struct part *p);

/* ---- replicas.c ---- */

/* The key of each slot: its replica group (by_group, when replicated),
 * else its primary; *nkeys of them. Replicated, c->map_mu is held until
 * emb__rep_unlock_keys(). */
const uint16_t *emb__rep_keys(struct emb_client *c, bool by_group,
			      uint32_t *nkeys);
void emb__rep_unlock_keys(struct emb_client *c);
/* What emb__rep_reroute() did with a pull part whose server died. */
enum reroute {
	REROUTE_NONE,  /* no live holder for some id: the part fails */
	REROUTE_MOVED, /* one live holder for all: p->req.server is it */
	REROUTE_SPLIT, /* several: parts of its own for each were sent, and
			  p is over (with nothing to scatter) */
};
/* Loop thread: a pull part whose server died goes to the live holders of
 * its slots. */
enum reroute emb__rep_reroute(struct emb_async *op, struct part *p);
/* Loop thread: slots left with no live holder. */
uint32_t emb__rep_lost_slots(const struct emb_client *c);
/* Loop thread: records why a fan-out to a dead server fails. */
void emb__rep_note_lost(struct emb_client *c, const struct part *p,
			uint32_t lost);
/* Loop thread: copy p of a write, routed by an older map, goes again:
 * copies for the writers a newer map added to its group, of the rows
 * whose lack p's refusal shows. 0 or -ENOMEM. */
int emb__rep_fixup(struct emb_client *c, struct emb_async *op,
		   struct part *p);
/* Loop thread: copy p ends because its server died (EMB_ENODEAD). Where
 * that server streamed a fill begun since p's group was routed, its copy
 * alone tells whether the fill's target lacks the write: unasked since
 * its last refusal, it did not apply it, and the target gets the rows (now
 * or when a map shows the fill); asked and unanswered, nobody can tell,
 * and the call fails with EMB_ENODEAD. 0, -ENOMEM, or EMB_REP_WAIT: the
 * client's map guesses that fill's fate (c->map_guessed), and p waits
 * for the coordinator's next map (the caller delays it; it ends again). */
#define EMB_REP_WAIT 1
int emb__rep_lost(struct emb_client *c, struct emb_async *op, struct part *p);
/* Loop thread: whether copy p went to its group's acting primary (the
 * first of its copies whose server is not dead), the server whose
 * refusal means a fill's stream lacks the write where the map does not
 * name the fill's source (emb__rep_fixup()). */
bool emb__rep_source(const struct emb_client *c, const struct part *p);
/* What emb__rep_trim() did with a copy routed by an older map. */
enum trim {
	TRIM_KEEP,  /* its server still takes every row: send it */
	TRIM_DONE,  /* it takes none (a move put another in its place), or
		       some, which went in a copy of their own: p is over */
	TRIM_VOID,  /* none, and some because a fill begun since rebuilt
		       the server's copy of their slot (emb_cmap_refilled()):
		       p is over, applied nowhere, which is no error */
	TRIM_NOMEM, /* that copy could not be made */
};
/* Loop thread: a copy p routed by an older map, whose server a move
 * since dropped from the writers of some of its rows (docs/replication.md,
 * "Moving slots"): those rows' other writers have copies of their own. */
enum trim emb__rep_trim(struct emb_client *c, struct emb_async *op,
			struct part *p);
/* Loop thread: p waits a back-off, then goes again (c->fns->send). */
void emb__rep_delay(struct emb_client *c, struct part *p);

/* ---- batch.c ---- */

/*
 * Deduplicates ids and orders the distinct ones by key[slot] (a server,
 * or a replica group), < nkeys, in op->mem with extra bytes after them;
 * *pinv maps each of the n ids to its distinct index.
 * The number of distinct ids, or a negative code.
 */
int64_t emb__batch_prepare(struct emb_async *op, const uint64_t *ids,
			   uint32_t n, const uint16_t *key, uint32_t nkeys,
			   size_t extra, uint64_t **pids, uint32_t **ppos,
			   uint32_t **pinv, uint32_t *cnt, void **extra_out);
/*
 * ids (and rows of stride floats, or NULL; and births, or NULL) in key
 * order as given, no dedup, in op->mem: *pids, *prows, *pbirths. Counts in
 * op->cnt, starts after its first most entries. 0 or -ENOMEM.
 */
int emb__batch_order(struct emb_async *op, const uint64_t *ids, uint32_t n,
		     const float *rows, uint32_t stride,
		     const uint32_t *births, const uint16_t *key,
		     uint32_t nkeys, uint32_t most, uint64_t **pids,
		     float **prows, uint32_t **pbirths);
/* cnt[s] ids per server cut into parts to the servers' limits. 0 or
 * -ENOMEM. */
int emb__batch_parts(struct emb_async *op, const struct emb_client_table *t,
		     const uint32_t *cnt, uint8_t opcode, uint32_t stride);
/* cnt[g] ids per replica group, each part once per holder (under
 * c->map_mu). 0, -ENOMEM or -EOPNOTSUPP. */
int emb__batch_parts_rep(struct emb_async *op,
			 const struct emb_client_table *t, const uint32_t *cnt,
			 uint8_t opcode, uint32_t stride);

/* ---- op.c ---- */

/* The part functions every client's c->fns points to. */
extern const struct emb__part_fns emb__op_part_fns;
/* Hands op (its parts made) to the loop, which sends them. 0, or the
 * transport's error (nothing was posted). */
int emb__op_post(struct emb_async *op);

/* ---- broadcast.c ---- */

/*
 * Sends the same request (opcode, flags, payload) to every server, with
 * table_ids[s] (or 0) in the header, and waits. The finished op, whose
 * parts hold each server's response, or NULL with *rc set. The caller
 * frees it (emb__op_free()).
 */
struct emb_async *emb__broadcast(struct emb_client *c, uint8_t opcode,
				 uint16_t flags, const uint32_t *table_ids,
				 const void *payload, size_t len, int *rc);
/* A broadcast part's response as a frame to decode, under lim. */
struct emb_wire_frame emb__part_frame(const struct part *p,
				      const struct emb_wire_limits *lim);

/* ---- for cluster.c, admin.c, cached.c (client.c, replicas.c,
 * broadcast.c, table.c hold these) ---- */

struct emb_node;

/*
 * Right after emb_client_create(), before any other call: routes slots by
 * slot_map (EMB_NSLOTS server indexes, copied) instead of contiguous
 * ranges, and takes ownership of node (destroyed with the client). 0, or
 * -EINVAL if an entry is not a server index (nothing changes then).
 */
int emb__client_set_cluster(struct emb_client *c, const uint16_t *slot_map,
			    struct emb_node *node);

/*
 * As emb__client_set_cluster() without a node: replicas r (1 = none) and,
 * with r > 1, removed[nservers] (NULL: none) the servers the map dropped,
 * which the client never asks again. For observers (emb_client_from_sched).
 */
int emb__client_set_map(struct emb_client *c, const uint16_t *slot_map,
			uint32_t r, const bool *removed);

/*
 * emb_client_create() that makes no connection to the servers flagged in
 * removed[] (one per server of opts->servers; NULL: none): they were
 * declared dead, their calls fail with EMB_ENODEAD, and the map set next
 * must remove them too.
 */
int emb__client_create_live(const struct emb_client_opts *opts,
			    const bool *removed, struct emb_client **out);

/*
 * The same for an observer (emb_client_from_sched/_coordinator): a server
 * of the list it cannot reach is left to reconnect at its calls, which
 * fail at their deadline, instead of failing the create (unless no server
 * answered at all). A server that answers and refuses (a bad token) still
 * fails it.
 */
int emb__client_create_observer(const struct emb_client_opts *opts,
				const bool *removed, struct emb_client **out);

/* The node installed above, or NULL. */
struct emb_cmap;
struct emb_wire_node_addr;

/*
 * A scheduler's replicated map (cluster/map.h) in place of the one
 * emb__client_set_map() computed: backups, fills, its epoch, which
 * replicated writes carry from now on. Before the client is shared.
 * 0, or -EINVAL (not replicated, another shape).
 */
int emb__client_set_cmap(struct emb_client *c, const struct emb_cmap *m);

/*
 * Any thread (the node agent's): route by the scheduler's newer map m,
 * with the servers' addresses srv[0..n) by rank, from the client's loop.
 * An older map than the one held is ignored. 0, or -ENOMEM.
 */
int emb__client_adopt_map(struct emb_client *c, const struct emb_cmap *m,
			  const struct emb_wire_node_addr *srv, uint32_t n);

struct emb_node *emb__client_node(const struct emb_client *c);

/*
 * Any thread: server is dead. Its calls in flight fail with EMB_ENODEAD,
 * and so do later ones. 0, or -EINVAL (no such server), -ENOMEM.
 */
int emb__client_server_dead(struct emb_client *c, uint32_t server);

/*
 * Sends opcode (no payload, table id 0) to every server at once and waits,
 * then hands each server's response frame to fn in server order; the frame
 * is valid during the call only. 0, the first error of a server or of fn,
 * or -ENOMEM. For worker/admin.c.
 */
int emb__client_admin(struct emb_client *c, uint8_t opcode,
		      int (*fn)(void *arg, uint32_t server,
				const struct emb_wire_frame *f),
		      void *arg);

/*
 * emb__client_admin() over the servers that answer: a server whose call
 * failed gets its error in err[s] (c->nsrv entries; 0 for the others, and
 * for removed servers, which are not asked) and fn is not called for it.
 * 0 when at least one server answered, else the first server's error; an
 * error of fn ends it.
 */
int emb__client_admin_each(struct emb_client *c, uint8_t opcode,
			   int (*fn)(void *arg, uint32_t server,
				     const struct emb_wire_frame *f),
			   void *arg, int *err);

/* The table's enum emb_mode as this client last set it (ASYNC until then). */
uint32_t emb__client_table_mode(const struct emb_client_table *t);

/* Applies EMB_LOG_LEVEL, if set, to the process's log level. */
void emb__client_env_log_level(void);

#endif
