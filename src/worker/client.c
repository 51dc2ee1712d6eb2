/*
 * src/worker/client.c - emb_client: routing, dedup, and parallel requests.
 *
 * The client owns one transport and one network thread running its loop.
 * A call builds an emb_async in the caller's thread (dedup, partition by
 * server, split to the servers' limits), hands it to the loop with
 * emb_transport_exec(), and the loop thread posts one request per part. As
 * responses arrive, the loop thread scatters rows into the caller's buffer,
 * so an asynchronous pull overlaps with the caller's compute; the last part
 * to finish wakes the waiter. Op fields other than mu/cv/done are touched by
 * the caller before posting and after completion, and by the loop thread in
 * between, never by both at once.
 *
 * Lost connections: a part that fails because its connection broke (closed,
 * reset, timed out) waits on its server while the loop thread reconnects
 * with backoff (HELLO included) and is then sent again, until the op's
 * deadline (timeout_ms after it was posted) passes. Pushes carry the
 * client's session id and a per-server sequence number, so a server applies
 * a retried push at most once (docs/protocol.md, PUSH).
 *
 * Replicas (docs/replication.md): with a map of R > 1 copies per slot, a
 * push, assign or erase is partitioned by replica group (the servers that
 * hold a slot) and each part goes to every holder; the op succeeds when
 * every live holder applied it, and a holder the scheduler declared dead
 * does not count. Pulls go to the primary; a pull part whose primary died
 * is sent again to the slot's first live backup.
 *
 * One-sided pulls (pull_mode ONESIDED, docs/rdma.md): each RDMA server gets
 * a second conn, used only for LOCATE calls and RDMA READs, so that a READ
 * of memory the server freed (which fails the whole conn) costs no other
 * call. A pull part READs the records of the ids whose location the
 * table's cache holds, checks each by its seal, and sends the rest as one
 * ordinary PULL on the main conn; then it LOCATEs those ids for next time.
 * All of it runs on the loop thread, which alone touches the caches.
 *
 * Recovery (docs/replication.md, "Recovery"): with a scheduler, every
 * replicated write carries the epoch of the map it was routed by
 * (EMB_F_EPOCH). A server filling a chunk answers EMB_EMOVING, and one
 * whose map grew a writer since that epoch EMB_ESTALEMAP: the copy waits
 * a moment and goes again to the same server with the same sequence
 * number; before it goes, a copy routed by an older map than the client's
 * gets copies for the writers the newer map added (group_fixup()).
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cache/dedup.h"
#include "common/addr.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/seal.h"
#include "common/token.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"
#include "cluster/hello.h"
#include "cluster/map.h"
#include "cluster/node.h"

#define NONE UINT32_MAX
/* Room for an error response: u32 length + message, in 64-byte lines. */
#define ERR_CAP ((4u + EMB_WIRE_ERRMSG_MAX + 63u) & ~63u)
/* A whole number of 64-byte lines: aligned_alloc() needs a multiple. */
#define ADMIN_RESP_MAX                                                         \
	((EMB_WIRE_HDR_SIZE + 1024u * EMB_WIRE_LIST_ENTRY_SIZE + 63u) & ~63u)

#define OPS_IDLE_MAX  64u	    /* idle ops kept for reuse, at most */
#define OP_KEEP_BYTES (64ull << 20) /* op scratch beyond this is not kept */

#define BACKOFF_MIN_MS 10u   /* wait after the first failed reconnect */
#define BACKOFF_MAX_MS 500u /* longest wait between reconnects */
#define LOC_ROWS_DEFAULT (1u << 20) /* one-sided: cached locations */
#define NOT_REMOTE UINT32_MAX	    /* a server table without seals */
#define LOC_WAYS 4u		    /* locations per bucket; an id may sit in
				       either of two buckets, so ids rarely
				       push each other out below ~90% load */

enum rd_state {
	RD_DOWN = 0, /* no read conn (or not one-sided) */
	RD_HELLO,    /* read conn open, HELLO in flight */
	RD_UP,	     /* READs and LOCATEs may go */
};
#define MOVING_MIN_MS 2u   /* first wait of a copy refused for a fill */
#define MOVING_MAX_MS 50u  /* longest: a fill's chunk streams in ms */

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
	uint64_t push_seq;	    /* last PUSH sequence number; atomic */
	/* Loop thread only, once the loop runs: */
	struct emb_client *c;	    /* owner */
	uint32_t state;		    /* enum srv_state */
	bool sessions;		    /* it applies retried pushes once */
	struct part *wait_head;	    /* parts waiting for a conn, FIFO */
	struct part *wait_tail;	    /* last of them */
	uint64_t retry_ms;	    /* next reconnect, monotonic ms */
	uint32_t backoff_ms;	    /* wait after the next failure */
	int last_err;		    /* why the last conn or attempt failed */
	uint64_t server_id;	    /* from HELLO: another one = restarted */
	bool rdma_offered;	    /* its HELLO: it listens on RDMA too */
	bool rdma_refused;	    /* an RDMA connect to it failed: TCP */
	bool on_rdma;		    /* the conn runs on RDMA; atomic */
	bool revived;		    /* a newcomer took this dead rank: learn
				       its table ids before writing */
	_Alignas(8) uint8_t tab_req[EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE +
				    EMB_WIRE_LIFECYCLE_SIZE]; /* CREATE */
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
};

struct emb_client {
	struct emb_transport *tr;      /* the loop */
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

	pthread_mutex_t tab_mu;		 /* guards tabs */
	struct emb_client_table *tabs;	 /* open tables: ids to relearn */
	struct part *delayed;		 /* loop: copies waiting to go again */
	uint64_t moved;			 /* copies refused by a fill; atomic */
};

struct emb_client_table {
	struct emb_client *c;	       /* borrowed */
	char name[EMB_WIRE_NAME_SIZE]; /* spec.name points here */
	struct emb_table_spec spec;    /* as created */
	uint32_t row_floats;	       /* dim + state floats */
	uint32_t *ids;		       /* table id on each server */
	uint32_t mode; /* enum emb_mode, as set by this client */
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
};

/* A part's request and its answer: one frame to one server. */
struct part_req {
	uint32_t server;	  /* index into c->srv */
	uint32_t first;		  /* offset into the op's partitioned ids */
	uint32_t n;		  /* ids in this part */
	struct emb_frame_hdr hdr; /* request header (opcode, table, count) */
	struct iovec iov[3];	  /* request payload */
	int niov;		  /* entries used */
	uint8_t prefix[EMB_WIRE_PUSH_SESSION_PREFIX_SIZE]; /* PUSH's step,
							      rank, session */
	uint64_t seq;		   /* PUSH: sequence number to its server */
	bool once;		   /* never sent again: a synchronous push */
	void *resp;		   /* response payload lands here */
	size_t resp_cap;	   /* bytes */
	struct emb_frame_hdr rhdr; /* response header, once done */
	int status;		   /* this part's result */
};

/* A part waiting to go again: for its server's conn, or a back-off. */
struct part_retry {
	struct part *wnext; /* next waiting on the server */
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
	uint64_t epoch;	    /* map epoch it was routed by (0: none) */
	uint64_t fixed;	    /* lead copy: epoch its group's writers were
			       last completed for */
	struct part *ext;   /* lead copy: copies group_fixup() added */
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
	uint32_t dim;	      /* row floats the caller sees */
	uint32_t state;	      /* pull with state: of those, state floats */
	uint32_t n;	      /* caller's ids */
	float *out;	      /* pull: caller's rows */
	uint8_t *found;	      /* pull: caller's found[] or NULL */
	uint32_t *pu;	      /* partitioned index -> distinct index */
	uint32_t *first;      /* distinct index -> first position */
	uint32_t *next;	      /* position -> next of the same id */
	uint64_t count;	      /* erase: ids that existed */
	struct part *parts;   /* nparts */
	uint32_t nparts;      /* parts posted */
	uint32_t pending;     /* loop thread: parts not done */
	int status;	      /* first error, else 0 */
	uint64_t deadline_ms; /* monotonic: retries stop here */
	const uint32_t *tids; /* the table's id on each server (updated
				 on the loop when a newcomer's are learned) */
	struct emb_client_table *tbl; /* pull: the table, held (refs) until
					 op_free() */
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

static void add(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}


/* ---- op lifecycle ---- */

static void op_issue(void *arg);

/*
 * A buffer of at least need bytes (64-byte aligned) in place of old, of
 * *cap bytes, whose contents are dropped: old itself while it is large
 * enough. Grows by half again, so that batches of slowly rising size do
 * not allocate each time. NULL (old kept): -ENOMEM.
 */
static void *grow(void *old, size_t *cap, size_t need)
{
	void *q;

	if (old && need <= *cap)
		return old;
	need += need / 2;
	need = (need + 4095) & ~(size_t)4095;
	q = aligned_alloc(64, need);
	if (!q)
		return NULL;
	free(old);
	*cap = need;
	return q;
}

/* The same for op->mem. 0 or -ENOMEM. */
static int op_mem(struct emb_async *op, size_t need)
{
	void *m = grow(op->mem, &op->mem_cap, need);

	if (!m)
		return -ENOMEM;
	op->mem = m;
	return 0;
}

/* Frees what an op keeps between uses. */
static void op_scratch_free(struct emb_async *op)
{
	free(op->mem);
	free(op->parts);
	free(op->resp_mem);
	free(op->cnt);
	free(op->os_mem);
	emb_dedup_destroy(op->dedup);
	op->os_mem = NULL;
	op->os_mem_cap = 0;
	op->mem = op->parts = op->resp_mem = op->cnt = NULL;
	op->dedup = NULL;
	op->mem_cap = op->parts_cap = op->resp_mem_cap = op->cnt_cap = 0;
	op->dedup_max = 0;
}

static void op_destroy(struct emb_async *op)
{
	op_scratch_free(op);
	pthread_cond_destroy(&op->cv);
	pthread_mutex_destroy(&op->mu);
	free(op);
}

static void pool_free(struct op_pool *pl)
{
	pthread_mutex_destroy(&pl->mu);
	free(pl);
}

/* An op for a call: a reused one, else a new one. NULL: -ENOMEM. */
static struct emb_async *op_new(struct emb_client *c, enum op_kind kind)
{
	struct op_pool *pl = c->ops;
	struct emb_async *op;

	pthread_mutex_lock(&pl->mu);
	op = pl->idle[kind != OP_PULL];
	if (op) {
		pl->idle[kind != OP_PULL] = op->pool_next;
		pl->nidle--;
	}
	pl->lent++;
	pthread_mutex_unlock(&pl->mu);
	if (!op) {
		op = calloc(1, sizeof(*op));
		if (!op) {
			pthread_mutex_lock(&pl->mu);
			pl->lent--;
			pthread_mutex_unlock(&pl->mu);
			return NULL;
		}
		pthread_mutex_init(&op->mu, NULL);
		pthread_cond_init(&op->cv, NULL);
		op->pool = pl;
		op->task.fn = op_issue;
		op->task.arg = op;
	}
	/* Everything of the last call but the kept scratch. */
	op->c = c;
	op->kind = kind;
	op->dim = op->state = op->n = 0;
	op->out = NULL;
	op->found = NULL;
	op->pu = op->first = op->next = NULL;
	op->count = 0;
	op->nparts = op->pending = 0;
	op->status = 0;
	op->deadline_ms = 0;
	op->tids = NULL;
	op->tbl = NULL;
	op->stride = 0;
	op->rbuf = NULL;
	op->tainted = false;
	op->done = false;
	return op;
}

static void table_unref(struct emb_client_table *t);

/* Gives op back for reuse (or frees it). NULL: no-op. */
static void op_free(struct emb_async *op)
{
	struct op_pool *pl;
	bool keep, last;

	if (!op)
		return;
	/* Copies a map change added: the op's own, not kept. */
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *e = op->parts[k].rep.ext;

		op->parts[k].rep.ext = NULL;
		while (e) {
			struct part *next = e->rep.enext;

			free(e);
			e = next;
		}
	}
	pl = op->pool;
	/* A pull holds its table: the user may close it while it runs. */
	if (op->tbl)
		table_unref(op->tbl);
	op->tbl = NULL;
	emb__respbuf_put(op->rbuf, !op->tainted);
	op->rbuf = NULL;
	/* A huge batch's scratch is not held for the next, smaller ones. */
	if (op->mem_cap + op->parts_cap + op->resp_mem_cap + op->os_mem_cap >
	    OP_KEEP_BYTES)
		op_scratch_free(op);
	pthread_mutex_lock(&pl->mu);
	pl->lent--;
	keep = !pl->closed && pl->nidle < OPS_IDLE_MAX;
	if (keep) {
		op->pool_next = pl->idle[op->kind != OP_PULL];
		pl->idle[op->kind != OP_PULL] = op;
		pl->nidle++;
	}
	last = pl->closed && !pl->lent;
	pthread_mutex_unlock(&pl->mu);
	if (!keep)
		op_destroy(op);
	if (last)
		pool_free(pl);
}

/*
 * Client destroy: frees the idle ops, and the pool unless ops are still
 * out (the last of them frees it). NULL: no-op.
 */
static void pool_close(struct op_pool *pl)
{
	struct emb_async *idle[2];
	bool last;

	if (!pl)
		return;
	pthread_mutex_lock(&pl->mu);
	pl->closed = true;
	idle[0] = pl->idle[0];
	idle[1] = pl->idle[1];
	pl->idle[0] = pl->idle[1] = NULL;
	pl->nidle = 0;
	last = !pl->lent;
	pthread_mutex_unlock(&pl->mu);
	for (int i = 0; i < 2; i++) {
		struct emb_async *op = idle[i];

		while (op) {
			struct emb_async *next = op->pool_next;

			op_destroy(op);
			op = next;
		}
	}
	if (last)
		pool_free(pl);
}

/* Zeroed counts for nkeys servers or groups, and room for as many + 1
 * starts after them, in op->cnt. 0 or -ENOMEM. */
static int op_counts(struct emb_async *op, uint32_t nkeys)
{
	size_t bytes = (2 * (size_t)nkeys + 1) * sizeof(uint32_t);
	uint32_t *cnt = grow(op->cnt, &op->cnt_cap, bytes);

	if (!cnt)
		return -ENOMEM;
	op->cnt = cnt;
	memset(op->cnt, 0, bytes);
	return 0;
}

/* op->parts with room for nparts, zeroed. 0 or -ENOMEM. */
static int op_parts(struct emb_async *op, uint32_t nparts)
{
	size_t bytes = (size_t)(nparts ? nparts : 1) * sizeof(struct part);
	struct part *p = grow(op->parts, &op->parts_cap, bytes);

	if (!p)
		return -ENOMEM;
	op->parts = p;
	memset(op->parts, 0, bytes);
	return 0;
}

static void op_complete(struct emb_async *op)
{
	pthread_mutex_lock(&op->mu);
	op->done = true;
	pthread_cond_broadcast(&op->cv);
	pthread_mutex_unlock(&op->mu);
}

static void note_server_error(struct emb_client *c, struct part *p)
{
	struct emb_wire_frame f = {.hdr = p->req.rhdr, .payload = p->req.resp};
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_error e;

	f.lim = &lim;
	if (emb_wire_error_decode(&f, &e) != 0)
		return;
	pthread_mutex_lock(&c->err_lock);
	c->last_status = e.status;
	snprintf(c->last_msg, sizeof(c->last_msg), "%.*s", (int)e.msg_len,
		 e.msg);
	pthread_mutex_unlock(&c->err_lock);
	emb_log(EMB_LOG_DEBUG, "server %s:%u: %s: %.*s", c->srv[p->req.server].host,
		c->srv[p->req.server].port, emb_strerror(e.status), (int)e.msg_len,
		e.msg);
}

/* Loop thread: copies a pull part's rows to every position of its ids. */
static int pull_scatter(struct emb_async *op, struct part *p)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.hdr = p->req.rhdr, .payload = p->req.resp};
	struct emb_wire_pull_resp r;
	const size_t row_sz = (size_t)op->dim * sizeof(float);
	int rc;

	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f.lim = &lim;
	rc = emb_wire_pull_resp_decode(&f, op->dim - op->state, op->state, &r);
	if (rc)
		return rc;
	/* A server that ignored the state flag sends rows of dim floats. */
	if (r.n != p->req.n || r.stride != op->dim)
		return EMB_EBADFRAME;
	for (uint32_t j = 0; j < r.n; j++) {
		const float *row = r.rows + (size_t)j * op->dim;
		uint32_t u = op->pu[p->req.first + (p->rd.fb ? p->rd.miss[j] : j)];
		uint8_t hit = r.found ? emb_wire_bit_test(r.found, j) : 1;

		for (uint32_t i = op->first[u]; i != NONE; i = op->next[i]) {
			memcpy(op->out + (size_t)i * op->dim, row, row_sz);
			if (op->found)
				op->found[i] = hit;
		}
	}
	return 0;
}

static bool stopping(const struct emb_client *c)
{
	return __atomic_load_n(&c->stopping, __ATOMIC_ACQUIRE);
}

static bool srv_dead(const struct server *s)
{
	return __atomic_load_n(&s->dead, __ATOMIC_RELAXED);
}

static void part_send(struct emb_client *c, struct part *p);
static void os_learn(struct emb_async *op, struct part *p);

/*
 * Loop thread: a pull part whose server died goes to the first live
 * holder of its slots, when that is one server for all of them (it is
 * with the successor backups of cluster/map.h). False when there is none.
 */
static bool pull_reroute(struct emb_async *op, struct part *p)
{
	struct emb_client *c = op->c;
	const uint64_t *ids = p->req.iov[0].iov_base;
	uint32_t to = NONE;

	if (!c->cmap || op->kind != OP_PULL || stopping(c))
		return false;
	for (uint32_t j = 0; j < p->req.n; j++) {
		const uint16_t *h = c->cmap->slot[emb_id_slot(ids[j])];
		uint32_t live = NONE;

		/* The dead flag comes before the map update: go by it. */
		for (uint32_t i = 0; i < c->cmap->replicas && live == NONE;
		     i++)
			if (h[i] != EMB_CMAP_NONE && !srv_dead(&c->srv[h[i]]))
				live = h[i];
		if (live == NONE || (to != NONE && live != to))
			return false;
		to = live;
	}
	if (to == NONE || to == p->req.server)
		return false;
	p->req.server = to;
	p->req.hdr.table_id = op->tids[to];
	add(&c->retries, 1);
	part_send(c, p);
	return true;
}

/*
 * Loop thread, once every part ended: a replicated write failed only
 * when no copy of some part was applied. Its dead holders are no error.
 */
static void rep_check(struct emb_async *op)
{
	for (uint32_t k = 0; k < op->nparts; k++) {
		const struct part *p = &op->parts[k];
		bool applied = false;

		if (!p->rep.nrep || p->rep.lead != k)
			continue;
		for (uint32_t j = 0; j < p->rep.nrep; j++)
			applied |= op->parts[k + j].req.status == 0;
		if (!applied && !op->status)
			op->status = p->req.status;
	}
}

static void op_finish(struct emb_async *op)
{
	if (op->c->cmap)
		rep_check(op);
	op_complete(op);
}

/*
 * Loop thread (it writes c->cmap, so it reads it unlocked): slots of the
 * replicated map with no holder the scheduler has not declared dead. A
 * death is flagged (srv_dead) just before failover() redraws the map, so
 * the flags count, not the map alone.
 */
static uint32_t lost_to_deaths(const struct emb_client *c)
{
	uint32_t lost = 0;

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		const uint16_t *h = c->cmap->slot[sl];
		bool live = false;

		for (uint32_t i = 0; i < c->cmap->replicas && !live; i++)
			live = h[i] != EMB_CMAP_NONE &&
			       !srv_dead(&c->srv[h[i]]);
		lost += !live;
	}
	return lost;
}

/* Loop thread: why a fan-out to a dead server fails, for
 * emb_client_last_error() and the log. */
static void note_lost(struct emb_client *c, const struct part *p,
		      uint32_t lost)
{
	const struct server *s = &c->srv[p->req.server];

	pthread_mutex_lock(&c->err_lock);
	c->last_status = EMB_ENODEAD;
	snprintf(c->last_msg, sizeof(c->last_msg),
		 "server %s:%u is dead and %u slot%s have no live copy",
		 s->host, s->port, lost, lost == 1 ? "" : "s");
	emb_log(EMB_LOG_ERROR, "%s", c->last_msg);
	pthread_mutex_unlock(&c->err_lock);
}

static void part_delay(struct emb_client *c, struct part *p);

static void part_end(struct part *p, int status,
		     const struct emb_frame_hdr *resp)
{
	struct emb_async *op = p->op;

	if (status == EMB_ENODEAD && pull_reroute(op, p))
		return;
	/* A copy refused because its slots are being filled, or routed by
	 * an older map than the server's: not applied, so it goes again,
	 * same server and sequence number, until the deadline. */
	if (status == 0 && p->rep.epoch &&
	    (resp->status == EMB_EMOVING || resp->status == EMB_ESTALEMAP) &&
	    !stopping(op->c) && emb_clock_ms() < op->deadline_ms) {
		if (resp->status == EMB_ESTALEMAP && op->c->node)
			emb_node_map_refresh(op->c->node);
		add(&op->c->moved, 1);
		part_delay(op->c, p);
		return;
	}
	/* A fan-out to a server that died, before or during the call: when
	 * the live servers hold every slot it is no longer asked. */
	if (status == EMB_ENODEAD && op->kind == OP_ADMIN && op->c->cmap) {
		uint32_t lost = lost_to_deaths(op->c);

		if (!lost) {
			p->rep.skip = true;
			if (--op->pending == 0)
				op_finish(op);
			return;
		}
		note_lost(op->c, p, lost);
	}
	/* A one-sided part that READ every row has no response. */
	if (status == 0 && resp) {
		p->req.rhdr = *resp;
		if (resp->status < 0) {
			note_server_error(op->c, p);
			status = resp->status;
		} else if (op->kind == OP_PULL) {
			status = pull_scatter(op, p);
		} else if (op->kind == OP_ERASE &&
			   (!p->rep.nrep || p == &op->parts[p->rep.lead])) {
			/* One copy's count: the first holder's. */
			op->count += resp->count;
		}
	}
	p->req.status = status;
	if (status == 0 && (p->rd.learn || p->rd.fb))
		os_learn(op, p);
	if (status) {
		add(&op->c->errors, 1);
		/* A copy on a dead holder: rep_check() decides. */
		if (!op->status && !(p->rep.nrep && status == EMB_ENODEAD))
			op->status = status;
	}
	if (--op->pending == 0)
		op_finish(op);
}

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
static void fail_waiting(struct server *s, int status)
{
	struct part *p = s->wait_head;

	s->wait_head = s->wait_tail = NULL;
	while (p) {
		struct part *next = p->retry.wnext;

		part_end(p, status, NULL);
		p = next;
	}
}

static void part_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct part *p = ctx;
	struct emb_client *c = p->op->c;
	struct server *s = &c->srv[p->req.server];

	if (status)
		p->op->tainted = true;
	/* A dead server's broken conn is its death, whichever came first:
	 * replicated calls go on without it (part_end). */
	if (status && conn_lost(status) && srv_dead(s))
		status = EMB_ENODEAD;
	if (status && conn_lost(status) && !srv_dead(s)) {
		/* A timeout as much as a reset: the next call gets a new
		 * conn rather than one with a stuck request on it. */
		server_lost(s, status);
		/* Not again: a part whose attempt timed out (that took the
		 * whole deadline), and a push to a synchronous table (the
		 * server may still hold it for its step). */
		if (!stopping(c) && status != -ETIMEDOUT && !p->req.once &&
		    emb_clock_ms() < p->op->deadline_ms) {
			add(&c->retries, 1);
			part_wait(s, p);
			return;
		}
	}
	part_end(p, status, resp);
}

/* ---- one-sided pulls (loop thread) ---- */


/* id's two candidate buckets (they may coincide). */
static void loc_buckets(const struct emb_client_table *t, uint64_t id,
			struct loc **b0, struct loc **b1)
{
	uint64_t h = emb_id_hash(id);

	*b0 = &t->loc[(h & t->loc_mask) * LOC_WAYS];
	*b1 = &t->loc[((h >> 32) & t->loc_mask) * LOC_WAYS];
}

/* id's location, or NULL. */
static struct loc *loc_find(const struct emb_client_table *t, uint64_t id)
{
	struct loc *b[2];

	loc_buckets(t, id, &b[0], &b[1]);
	for (uint32_t k = 0; k < 2; k++)
		for (uint32_t w = 0; w < LOC_WAYS; w++)
			if (b[k][w].addr && b[k][w].id == id)
				return &b[k][w];
	return NULL;
}

/* Where id's location goes: its old slot, a free one in either bucket, or
 * a victim the hash picks. */
static struct loc *loc_put(const struct emb_client_table *t, uint64_t id)
{
	struct loc *e = loc_find(t, id), *b[2];

	if (e)
		return e;
	loc_buckets(t, id, &b[0], &b[1]);
	for (uint32_t k = 0; k < 2; k++)
		for (uint32_t w = 0; w < LOC_WAYS; w++)
			if (!b[k][w].addr)
				return &b[k][w];
	return &b[(id >> 3) & 1][(emb_id_hash(id) >> 20) % LOC_WAYS];
}

/* Loop thread: drops s's read conn; READs and LOCATEs on it fail (and fall
 * back), and locations learnt through it are stale from now on. */
static void rconn_lost(struct server *s, int reason)
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

/* Sends the part's misses (p->rd.miss) as one PULL, or ends it if none. */
static void os_fallback(struct emb_client *c, struct part *p)
{
	const uint64_t *ids = p->req.iov[0].iov_base;

	if (!p->rd.nmiss) {
		part_end(p, 0, NULL);
		return;
	}
	/* A batch flushed while the client is destroyed: no conn to use. */
	if (stopping(c)) {
		part_end(p, EMB_ECLOSED, NULL);
		return;
	}
	for (uint32_t k = 0; k < p->rd.nmiss; k++)
		p->rd.miss_ids[k] = ids[p->rd.miss[k]];
	p->req.iov[0].iov_base = p->rd.miss_ids;
	p->req.iov[0].iov_len = (size_t)p->rd.nmiss * sizeof(uint64_t);
	p->req.n = p->rd.nmiss;
	p->req.hdr.count = p->rd.nmiss;
	p->rd.fb = true;
	add(&c->rows_fallback, p->rd.nmiss);
	part_send(c, p);
}

/* True when record rec (rb bytes, as READ) is id's row, whole. */
static bool seal_ok(const struct remote *r, uint32_t rb, uint32_t row_floats,
		    const char *rec, uint64_t id)
{
	uint64_t got_id, seal;

	memcpy(&got_id, rec, sizeof(got_id));
	memcpy(&seal, rec + rb - 8, sizeof(seal));
	return got_id == id &&
	       emb_seal(r->seed, id, rec + 16,
			(size_t)row_floats * sizeof(float)) == seal;
}

static void os_read_done(void *ctx, int status)
{
	struct part *p = ctx;
	struct emb_async *op = p->op;
	struct emb_client *c = op->c;
	struct emb_client_table *t = op->tbl;
	struct server *s = &c->srv[p->req.server];
	const struct remote *r = &t->rem[p->req.server];
	const uint64_t *ids = p->req.iov[0].iov_base;
	const size_t row_sz = (size_t)op->dim * sizeof(float);
	uint64_t good = 0, bad = 0;

	if (status) {
		/* Nothing landed that can be trusted: all go two-sided. A
		 * batch of an older read conn leaves the current one be. */
		op->tainted = true;
		if (p->rd.rgen == s->rgen)
			rconn_lost(s, status);
		for (uint32_t k = 0; k < p->rd.rop.n; k++)
			p->rd.miss[p->rd.nmiss++] = p->rd.seg_j[k];
		os_fallback(c, p);
		return;
	}
	for (uint32_t k = 0; k < p->rd.rop.n; k++) {
		uint32_t j = p->rd.seg_j[k];
		const char *rec = p->rd.land + (size_t)j * p->rd.rb;
		uint32_t u = op->pu[p->req.first + j];

		if (!seal_ok(r, p->rd.rb, t->row_floats, rec, ids[j])) {
			struct loc *e = loc_find(t, ids[j]);

			if (e)
				e->addr = 0; /* LOCATEd again after the PULL */
			p->rd.miss[p->rd.nmiss++] = j;
			bad++;
			continue;
		}
		for (uint32_t i = op->first[u]; i != NONE; i = op->next[i]) {
			memcpy(op->out + (size_t)i * op->dim, rec + 16, row_sz);
			if (op->found)
				op->found[i] = 1;
		}
		good++;
	}
	add(&c->rows_read, good);
	add(&c->seal_failures, bad);
	os_fallback(c, p);
}

/* Part p of a one-sided pull: READs for the ids with a location, the rest
 * two-sided. Never sent this way twice (a retry is two-sided). */
static void os_start(struct emb_client *c, struct part *p)
{
	struct emb_client_table *t = p->op->tbl;
	struct server *s = &c->srv[p->req.server];
	const uint64_t *ids = p->req.iov[0].iov_base;
	uint32_t nseg = 0;
	int rc;

	p->rd.os_done = true;
	p->rd.nmiss = 0;
	if (s->rstate != RD_UP ||
	    __atomic_load_n(&t->rem[p->req.server].rec_bytes, __ATOMIC_RELAXED) !=
		p->rd.rb) {
		for (uint32_t j = 0; j < p->req.n; j++)
			p->rd.miss[p->rd.nmiss++] = j;
		os_fallback(c, p);
		return;
	}
	for (uint32_t j = 0; j < p->req.n; j++) {
		const struct loc *e = loc_find(t, ids[j]);

		if (e && e->srv == p->req.server && e->gen == s->rgen) {
			p->rd.segs[nseg] = (struct emb_read_seg){
			    .raddr = e->addr,
			    .rkey = e->rkey,
			    .len = p->rd.rb,
			    .local = p->rd.land + (size_t)j * p->rd.rb};
			p->rd.seg_j[nseg++] = j;
		} else {
			p->rd.miss[p->rd.nmiss++] = j;
		}
	}
	if (!nseg) {
		os_fallback(c, p);
		return;
	}
	p->rd.rop = (struct emb_read_op){
	    .segs = p->rd.segs, .n = nseg, .done = os_read_done, .ctx = p};
	p->rd.rgen = s->rgen;
	rc = emb_conn_read(s->rconn, &p->rd.rop);
	if (rc) {
		/* A closed conn is replaced; -EINVAL (landing memory not
		 * registered) only costs this part its READs. */
		if (rc == EMB_ECLOSED)
			rconn_lost(s, rc);
		for (uint32_t k = 0; k < nseg; k++)
			p->rd.miss[p->rd.nmiss++] = p->rd.seg_j[k];
		os_fallback(c, p);
	}
}

/* A LOCATE in flight: its own memory, as the pull may be over first. */
struct locreq {
	struct emb_client_table *t; /* holds a reference */
	uint32_t srv;		    /* server index */
	uint16_t gen;		    /* the server's rgen when sent */
	uint32_t n;		    /* ids */
	struct emb_frame_hdr hdr;   /* request header */
	struct iovec iov;	    /* ids */
	void *resp;		    /* response payload */
	size_t resp_cap;	    /* its bytes */
	uint64_t ids[];		    /* n ids */
};

static void loc_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct locreq *q = ctx;
	struct emb_client_table *t = q->t;
	struct emb_client *c = t->c;
	struct server *s = &c->srv[q->srv];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	struct emb_wire_locate_resp r;

	if (status) {
		if (status != EMB_ECLOSED && q->gen == s->rgen)
			rconn_lost(s, status);
		goto out;
	}
	/* A server without --remote-read: stop asking it. */
	if (resp->status == EMB_ENOTREMOTE) {
		__atomic_store_n(&t->rem[q->srv].rec_bytes, NOT_REMOTE,
				 __ATOMIC_RELAXED);
		goto out;
	}
	f = (struct emb_wire_frame){.hdr = *resp, .payload = q->resp,
				    .lim = &lim};
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	if (emb_wire_locate_resp_decode(&f, &r) != 0 || r.n != q->n ||
	    r.row_floats != t->row_floats || q->gen != s->rgen)
		goto out;
	t->rem[q->srv].seed = r.seed;
	__atomic_store_n(&t->rem[q->srv].rec_bytes, r.rec_bytes,
			 __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < r.n; i++) {
		struct loc *e;
		uint64_t addr;
		uint32_t rkey;

		emb_wire_locate_entry_get(&r, i, &addr, &rkey);
		if (!addr)
			continue;
		e = loc_put(t, q->ids[i]);
		*e = (struct loc){.id = q->ids[i],
				  .addr = addr,
				  .rkey = rkey,
				  .srv = (uint16_t)q->srv,
				  .gen = q->gen};
	}
out:
	table_unref(t);
	free(q);
}

/* LOCATEs n ids of table t on server si's read conn, in frame-sized
 * pieces. Best effort: a failure only means more two-sided pulls. */
static void loc_request(struct emb_client *c, struct emb_client_table *t,
			uint32_t si, const uint64_t *ids, uint32_t n)
{
	struct server *s = &c->srv[si];
	uint64_t room = (s->lim.max_frame_bytes - 2 * EMB_WIRE_HDR_SIZE -
			 EMB_WIRE_LOCATE_HEAD_SIZE) /
			EMB_WIRE_LOCATE_ENTRY_SIZE;
	uint32_t step = room < s->lim.max_ids ? (uint32_t)room : s->lim.max_ids;

	for (uint32_t done = 0; done < n && s->rstate == RD_UP;) {
		uint32_t m = n - done < step ? n - done : step;
		size_t cap = EMB_WIRE_LOCATE_HEAD_SIZE +
			     (size_t)m * EMB_WIRE_LOCATE_ENTRY_SIZE;
		struct locreq *q;
		int rc;

		if (cap < ERR_CAP)
			cap = ERR_CAP;
		q = malloc(sizeof(*q) + (size_t)m * sizeof(uint64_t) + cap);
		if (!q)
			return;
		*q = (struct locreq){.t = t, .srv = si, .gen = s->rgen, .n = m};
		memcpy(q->ids, ids + done, (size_t)m * sizeof(uint64_t));
		q->resp = q->ids + m;
		q->resp_cap = cap;
		q->hdr.opcode = EMB_OP_LOCATE;
		q->hdr.table_id = t->ids[si];
		q->hdr.count = m;
		q->iov = (struct iovec){q->ids, (size_t)m * sizeof(uint64_t)};
		__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
		rc = emb_conn_call(s->rconn, &q->hdr, &q->iov, 1, q->resp,
				   q->resp_cap, loc_done, q);
		if (rc) {
			__atomic_fetch_sub(&t->refs, 1, __ATOMIC_RELAXED);
			free(q);
			rconn_lost(s, rc);
			return;
		}
		done += m;
	}
}

/* After a part's PULL: LOCATE the ids it pulled two-sided. */
static void os_learn(struct emb_async *op, struct part *p)
{
	struct emb_client *c = op->c;

	if (c->srv[p->req.server].rstate != RD_UP)
		return;
	loc_request(c, op->tbl, p->req.server, p->req.iov[0].iov_base, p->req.n);
}

/* Loop thread: p waits a back-off, then part_send() again. */
static void part_delay(struct emb_client *c, struct part *p)
{
	p->retry.wait_ms = p->retry.wait_ms ? 2 * p->retry.wait_ms : MOVING_MIN_MS;
	if (p->retry.wait_ms > MOVING_MAX_MS)
		p->retry.wait_ms = MOVING_MAX_MS;
	p->retry.due_ms = emb_clock_ms() + p->retry.wait_ms;
	p->retry.dnext = c->delayed;
	c->delayed = p;
}

/* The ids and rows (NULL for erase) a replicated write's copy sends. */
static const uint64_t *part_ids(const struct part *p, const float **rows)
{
	if (p->op->kind == OP_PUSH) {
		*rows = p->req.n ? p->req.iov[2].iov_base : NULL;
		return p->req.iov[1].iov_base;
	}
	*rows = p->req.niov > 1 ? p->req.iov[1].iov_base : NULL;
	return p->req.iov[0].iov_base;
}

static bool in_list(const uint16_t *w, uint32_t n, uint32_t rank)
{
	for (uint32_t i = 0; i < n; i++)
		if (w[i] == rank)
			return true;
	return false;
}

/* Whether a copy group_fixup() added to lead's group sends id to rank. */
static bool ext_has(const struct part *lead, uint32_t rank, uint64_t id)
{
	for (const struct part *e = lead->rep.ext; e; e = e->rep.enext) {
		const float *unused;
		const uint64_t *ids;

		if (e->req.server != rank)
			continue;
		ids = part_ids(e, &unused);
		for (uint32_t j = 0; j < e->req.n; j++)
			if (ids[j] == id)
				return true;
	}
	return false;
}

/*
 * Loop thread: the copies of lead's group were routed by an older map;
 * writers the current one added to some of their rows (a server being
 * filled) get a copy of those rows now, sent at once. The group's other
 * copies go out as they were: they reach servers that still hold the
 * rows. 0, or -ENOMEM (the op then fails).
 */
static int group_fixup(struct emb_client *c, struct emb_async *op,
		       struct part *lead)
{
	const uint32_t k0 = (uint32_t)(lead - op->parts);
	uint16_t covered[EMB_CMAP_REPLICAS_MAX + 1], w[EMB_CMAP_REPLICAS_MAX + 1];
	uint32_t nsib = 0, rowb;
	const uint64_t *ids;
	const float *rows;

	if (lead->rep.fixed >= c->map_epoch)
		return 0;
	lead->rep.fixed = c->map_epoch;
	ids = part_ids(lead, &rows);
	rowb = op->stride * (uint32_t)sizeof(float);
	for (uint32_t j = 0; j < lead->rep.nrep && nsib < EMB_CMAP_REPLICAS_MAX; j++)
		covered[nsib++] = (uint16_t)op->parts[k0 + j].req.server;
	for (;;) {
		uint32_t to = NONE, k = 0;
		struct part *e;
		char *m;

		/* The next writer some row's copy does not reach yet, and the
		 * rows it lacks: an earlier fixup may have sent it some. */
		for (uint32_t j = 0; j < lead->req.n; j++) {
			uint32_t nw = emb_cmap_writers(c->cmap,
						       emb_id_slot(ids[j]), w);

			for (uint32_t i = 0; i < nw; i++) {
				if (in_list(covered, nsib, w[i]) ||
				    (to != NONE && w[i] != to) ||
				    ext_has(lead, w[i], ids[j]))
					continue;
				to = w[i];
				k++;
			}
		}
		if (to == NONE)
			return 0;
		/* aligned_alloc() takes whole 64-byte lines. */
		m = aligned_alloc(64, (((sizeof(*e) + 63) & ~(size_t)63) +
				       ERR_CAP + (size_t)k * (8 + rowb) + 63) &
					  ~(size_t)63);
		if (!m)
			return -ENOMEM;
		e = (struct part *)(void *)m;
		*e = *lead;
		e->rep.ext = e->rep.enext = e->retry.dnext = NULL;
		e->retry.wait_ms = 0;
		e->req.server = to;
		e->req.n = k;
		e->rep.epoch = c->map_epoch;
		e->rep.nrep = lead->rep.nrep; /* a copy: its death is no error */
		e->req.resp = m + ((sizeof(*e) + 63) & ~(size_t)63);
		e->req.resp_cap = ERR_CAP;
		{
			uint64_t *eids = (uint64_t *)(void *)((char *)e->req.resp +
							      ERR_CAP);
			float *erows = (float *)(void *)(eids + k);
			uint32_t at = 0;

			for (uint32_t j = 0; j < lead->req.n && at < k; j++) {
				uint32_t nw = emb_cmap_writers(
				    c->cmap, emb_id_slot(ids[j]), w);

				if (!in_list(w, nw, to) ||
				    ext_has(lead, to, ids[j]))
					continue;
				eids[at] = ids[j];
				if (rows)
					memcpy(erows + (size_t)at * op->stride,
					       rows + (size_t)j * op->stride,
					       rowb);
				at++;
			}
			e->req.hdr.count = k;
			if (op->kind == OP_PUSH) {
				e->req.seq = __atomic_add_fetch(
				    &c->srv[to].push_seq, 1, __ATOMIC_RELAXED);
				emb_le64_store(e->req.prefix + 24, e->req.seq);
				e->req.iov[0].iov_base = e->req.prefix;
				e->req.iov[1] = (struct iovec){eids, k * 8ull};
				e->req.iov[2] = (struct iovec){erows,
							   (size_t)k * rowb};
			} else {
				e->req.iov[0] = (struct iovec){eids, k * 8ull};
				if (rows)
					e->req.iov[1] = (struct iovec){
					    erows, (size_t)k * rowb};
			}
		}
		e->rep.enext = lead->rep.ext;
		lead->rep.ext = e;
		op->pending++;
		emb_log(EMB_LOG_DEBUG,
			"map epoch %llu: %u row%s of a write routed by epoch "
			"%llu go to server %u too",
			(unsigned long long)c->map_epoch, k, k == 1 ? "" : "s",
			(unsigned long long)lead->rep.epoch, to);
		part_send(c, e);
	}
}

/* Loop thread: posts p on its server's conn, or queues it for the next. */
static void part_send(struct emb_client *c, struct part *p)
{
	struct server *s = &c->srv[p->req.server];
	int rc;

	if (srv_dead(s)) {
		part_end(p, EMB_ENODEAD, NULL);
		return;
	}
	/* An op whose task runs only as the client is destroyed (its loop
	 * thread stopped first) finds every server down for good. */
	if (stopping(c) && s->state != SRV_UP) {
		part_end(p, EMB_ECLOSED, NULL);
		return;
	}
	if (p->rd.os && !p->rd.os_done && s->state == SRV_UP) {
		os_start(c, p);
		return;
	}
	if (p->rep.epoch) {
		/* Routed by an older map: writers it added get their copy
		 * before this one goes out under the new epoch. */
		if (p->rep.epoch < c->map_epoch) {
			rc = group_fixup(c, p->op, &p->op->parts[p->rep.lead]);
			if (rc) {
				part_end(p, rc, NULL);
				return;
			}
			p->rep.epoch = c->map_epoch;
		}
		p->req.hdr.table_id =
		    __atomic_load_n(&p->op->tids[p->req.server], __ATOMIC_RELAXED);
		emb_wire_hdr_set_epoch(&p->req.hdr, p->rep.epoch, 0);
	}
	if (s->state != SRV_UP) {
		part_wait(s, p);
		return;
	}
	if (p->req.seq) {
		/* Decided per send: a server restarted as an older version
		 * may not take sessions. */
		p->req.hdr.flags = (uint16_t)((p->req.hdr.flags & ~EMB_F_SESSION) |
					  (s->sessions ? EMB_F_SESSION : 0));
		p->req.iov[0].iov_len = s->sessions
					? EMB_WIRE_PUSH_SESSION_PREFIX_SIZE
					: EMB_WIRE_PUSH_PREFIX_SIZE;
	}
	add(&c->requests, 1);
	rc = emb_conn_call(s->conn, &p->req.hdr, p->req.iov, p->req.niov, p->req.resp,
			   p->req.resp_cap, part_done, p);
	if (rc)
		part_done(p, rc, NULL);
}

/* Loop thread: posts every part of op. */
static void op_issue(void *arg)
{
	struct emb_async *op = arg;
	uint32_t nparts = op->nparts;

	/* Registered here, on the loop, once per buffer's life. */
	if (op->rbuf)
		emb__respbuf_reg(op->rbuf);
	/* Count all parts first: a part that fails at once must not see
	 * pending reach 0 while later parts are still unposted. */
	op->pending = nparts + 1;
	for (uint32_t k = 0; k < nparts; k++)
		part_send(op->c, &op->parts[k]);
	if (--op->pending == 0)
		op_finish(op);
}

/*
 * Gives parts whose success carries no payload a buffer for the error
 * message a server may send instead. 0 or -ENOMEM.
 */
static int give_err_bufs(struct emb_async *op)
{
	char *r;

	if (!op->nparts)
		return 0;
	r = grow(op->resp_mem, &op->resp_mem_cap, (size_t)op->nparts * ERR_CAP);
	if (!r)
		return -ENOMEM;
	op->resp_mem = r;
	for (uint32_t k = 0; k < op->nparts; k++) {
		op->parts[k].req.resp = r + (size_t)k * ERR_CAP;
		op->parts[k].req.resp_cap = ERR_CAP;
	}
	return 0;
}

static int op_post(struct emb_async *op)
{
	if (op->nparts == 0) {
		op->done = true;
		return 0;
	}
	op->deadline_ms = emb_clock_ms() + op->c->timeout_ms;
	return emb_transport_post(op->c->tr, &op->task);
}

int emb_async_wait(struct emb_async *op)
{
	int rc;

	if (!op)
		return EMB_EBADARG;
	pthread_mutex_lock(&op->mu);
	while (!op->done)
		pthread_cond_wait(&op->cv, &op->mu);
	pthread_mutex_unlock(&op->mu);
	rc = op->status;
	op_free(op);
	return rc;
}

bool emb_async_done(struct emb_async *op)
{
	bool d;

	pthread_mutex_lock(&op->mu);
	d = op->done;
	pthread_mutex_unlock(&op->mu);
	return d;
}

/* ---- batch preparation ---- */

/* Largest ids per request to server s for rows of stride floats. */
static uint32_t part_max(const struct emb_client *c, uint32_t s,
			 uint32_t stride)
{
	const struct emb_wire_limits *lim = &c->srv[s].lim;
	uint64_t per_id = 8 + 1 + 4ull * stride;
	uint64_t room = lim->max_frame_bytes - 2 * EMB_WIRE_HDR_SIZE;
	uint64_t m = room / per_id;

	if (m > lim->max_ids)
		m = lim->max_ids;
	/* Smaller parts pipeline: the server computes one while the previous
	 * one crosses the network and this side scatters the one before. */
	if (m > c->part_ids)
		m = c->part_ids;
	return m ? (uint32_t)m : 1;
}

/*
 * Deduplicates ids and orders the distinct ones by key[slot] (a server,
 * or a replica group), < nkeys. Fills op->pu, op->first, op->next (in
 * op->mem), the partitioned ids in *pids, the distinct index ->
 * partitioned index map in *ppos, and per-key counts in cnt[nkeys].
 * Returns the number of distinct ids, or a negative code.
 */
static int64_t prepare(struct emb_async *op, const uint64_t *ids, uint32_t n,
		       const uint16_t *key, uint32_t nkeys, size_t extra,
		       uint64_t **pids, uint32_t **ppos, uint32_t *cnt,
		       void **extra_out)
{
	struct emb_client *c = op->c;
	uint64_t *uniq;
	uint32_t *inv, *srv_of, *start;
	size_t bytes;
	int64_t nu;
	char *m;
	int rc;

	bytes = (size_t)n * (8 + 8 + 4 + 4 + 4 + 4 + 4 + 4) +
		(size_t)(nkeys + 1) * 4 + extra + 64;
	if (op_mem(op, bytes))
		return -ENOMEM;
	m = op->mem;
	uniq = (uint64_t *)(void *)m;
	*pids = uniq + n;
	inv = (uint32_t *)(void *)(*pids + n);
	*ppos = inv + n;
	srv_of = *ppos + n;
	op->pu = srv_of + n;
	op->first = op->pu + n;
	op->next = op->first + n;
	start = op->next + n;
	*extra_out =
	    (void *)(((uintptr_t)(start + nkeys + 1) + 63) & ~(uintptr_t)63);

	if (n > op->dedup_max) {
		/* Sized for this batch and then some, like grow(). */
		uint32_t max = n > (1u << 29) ? n : n + n / 2;

		emb_dedup_destroy(op->dedup);
		op->dedup = NULL;
		op->dedup_max = 0;
		rc = emb_dedup_create(max, &op->dedup);
		if (rc)
			return rc;
		op->dedup_max = max;
	}
	nu = emb_dedup_run(op->dedup, ids, n, uniq, inv);
	if (nu < 0)
		return nu;

	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		srv_of[u] = key[emb_id_slot(uniq[u])];
		cnt[srv_of[u]]++;
	}
	start[0] = 0;
	for (uint32_t s = 0; s < nkeys; s++)
		start[s + 1] = start[s] + cnt[s];
	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		uint32_t pos = start[srv_of[u]]++;

		(*pids)[pos] = uniq[u];
		op->pu[pos] = u;
		(*ppos)[u] = pos;
		op->first[u] = NONE;
	}
	for (uint32_t i = n; i-- > 0;) {
		op->next[i] = op->first[inv[i]];
		op->first[inv[i]] = i;
	}
	add(&c->ids_in, n);
	add(&c->ids_sent, (uint64_t)nu);
	return nu;
}

/*
 * Splits cnt[s] ids per server into parts of at most part_max() ids, all
 * with opcode op and the table's id on each server. A synchronous table's
 * push gives every server at least one part (empty if it has no ids) and
 * flags each server's last part STEP_END. Returns 0 or -ENOMEM.
 */
static int make_parts(struct emb_async *op, const struct emb_client_table *t,
		      const uint32_t *cnt, uint8_t opcode, uint32_t stride)
{
	const bool sync = opcode == EMB_OP_PUSH && t->mode == EMB_MODE_SYNC;
	struct emb_client *c = op->c;
	uint32_t total = 0, k = 0, off = 0;

	for (uint32_t s = 0; s < c->nsrv; s++) {
		uint32_t m = part_max(c, s, stride);

		total += (cnt[s] + m - 1) / m;
		if (sync && cnt[s] == 0)
			total++;
	}
	if (op_parts(op, total))
		return -ENOMEM;
	for (uint32_t s = 0; s < c->nsrv; s++) {
		uint32_t m = part_max(c, s, stride);
		uint32_t done = 0;

		do {
			struct part *p;

			if (done >= cnt[s] && !(sync && cnt[s] == 0))
				break;
			p = &op->parts[k++];
			p->op = op;
			p->req.server = s;
			p->req.first = off + done;
			p->req.n = cnt[s] - done < m ? cnt[s] - done : m;
			p->req.hdr.opcode = opcode;
			p->req.hdr.table_id = t->ids[s];
			p->req.hdr.count = p->req.n;
			p->req.once = sync;
			done += m;
			if (sync && done >= cnt[s])
				p->req.hdr.flags = EMB_F_STEP_END;
		} while (done < cnt[s]);
		off += cnt[s];
	}
	op->nparts = total;
	return 0;
}

/*
 * Replicated writes: cnt[g] ids per replica group g, split into parts of
 * at most part_max() ids for every holder, and each part made once per
 * holder, copies side by side (lead, nrep). Under c->map_mu. 0, -ENOMEM,
 * or -EOPNOTSUPP for a synchronous table's push (its per-server step
 * ends are not replicated).
 */
static int make_parts_rep(struct emb_async *op,
			  const struct emb_client_table *t,
			  const uint32_t *cnt, uint8_t opcode, uint32_t stride)
{
	struct emb_client *c = op->c;
	uint32_t total = 0, k = 0, off = 0;

	if (opcode == EMB_OP_PUSH && t->mode == EMB_MODE_SYNC)
		return -EOPNOTSUPP;
	for (uint32_t g = 0; g < c->ngroups; g++) {
		const uint16_t *h = c->groups[g];
		uint32_t m = UINT32_MAX, nh = 0;

		for (; nh < c->cmap->replicas && h[nh] != EMB_CMAP_NONE; nh++)
			if (part_max(c, h[nh], stride) < m)
				m = part_max(c, h[nh], stride);
		total += (cnt[g] + m - 1) / m * nh;
	}
	if (op_parts(op, total))
		return -ENOMEM;
	op->tids = t->ids;
	op->stride = stride;
	for (uint32_t g = 0; g < c->ngroups; g++) {
		const uint16_t *h = c->groups[g];
		uint32_t m = UINT32_MAX, nh = 0;

		for (; nh < c->cmap->replicas && h[nh] != EMB_CMAP_NONE; nh++)
			if (part_max(c, h[nh], stride) < m)
				m = part_max(c, h[nh], stride);
		for (uint32_t done = 0; done < cnt[g]; done += m) {
			uint32_t lead = k;

			for (uint32_t j = 0; j < nh; j++) {
				struct part *p = &op->parts[k++];

				p->op = op;
				p->req.server = h[j];
				p->req.first = off + done;
				p->req.n = cnt[g] - done < m ? cnt[g] - done : m;
				p->req.hdr.opcode = opcode;
				p->req.hdr.table_id = t->ids[h[j]];
				p->req.hdr.count = p->req.n;
				p->rep.lead = lead;
				p->rep.nrep = nh;
				p->rep.epoch = c->map_epoch;
				p->rep.fixed = c->map_epoch;
			}
		}
		off += cnt[g];
	}
	op->nparts = total;
	return 0;
}

/*
 * How writes are partitioned: by replica group when replicated (then
 * c->map_mu is held until unlock_keys()), else by server.
 */
static const uint16_t *write_keys(struct emb_client *c, uint32_t *nkeys)
{
	if (!c->cmap) {
		*nkeys = c->nsrv;
		return c->slot_map;
	}
	pthread_mutex_lock(&c->map_mu);
	*nkeys = c->ngroups;
	return c->grp;
}

static void unlock_keys(struct emb_client *c)
{
	if (c->cmap)
		pthread_mutex_unlock(&c->map_mu);
}

/* ---- table operations ---- */

/*
 * One-sided pulls: which parts READ (their server is on RDMA and its
 * record layout is known), and their bookkeeping; the others LOCATE their
 * ids once pulled, so the next pull may READ. Adds the READ landings to
 * *resp_bytes (they share the registered response buffer). 0 or -ENOMEM.
 */
static int os_plan(struct emb_async *op, struct emb_client_table *t,
		   size_t *resp_bytes)
{
	struct emb_client *c = op->c;
	size_t per_id = sizeof(struct emb_read_seg) + 4 + 4 + 8, total = 0;
	char *m;

	if (!c->onesided || !t->loc)
		return 0;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];
		const struct server *s = &c->srv[p->req.server];

		if (!__atomic_load_n(&s->on_rdma, __ATOMIC_RELAXED))
			continue;
		p->rd.rb = __atomic_load_n(&t->rem[p->req.server].rec_bytes,
					__ATOMIC_RELAXED);
		p->rd.os = p->rd.rb != 0 && p->rd.rb != NOT_REMOTE;
		p->rd.learn = p->rd.rb == 0;
		if (p->rd.os) {
			total += p->req.n;
			*resp_bytes += ((size_t)p->req.n * p->rd.rb + 63) & ~(size_t)63;
		}
	}
	if (!total)
		return 0;
	m = grow(op->os_mem, &op->os_mem_cap, total * per_id);
	if (!m)
		return -ENOMEM;
	op->os_mem = m;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		if (!p->rd.os)
			continue;
		p->rd.segs = (struct emb_read_seg *)(void *)m;
		p->rd.miss_ids = (uint64_t *)(void *)(p->rd.segs + p->req.n);
		p->rd.seg_j = (uint32_t *)(void *)(p->rd.miss_ids + p->req.n);
		p->rd.miss = p->rd.seg_j + p->req.n;
		m = (char *)(p->rd.miss + p->req.n);
	}
	return 0;
}

static int pull_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, float *out, uint32_t flags, uint8_t *found,
		      struct emb_async **opp)
{
	struct emb_client *c = t->c;
	const bool nocreate = flags & EMB_CLIENT_NOCREATE;
	const bool with_state = flags & EMB_CLIENT_WITH_STATE;
	const uint16_t wflags = (nocreate ? EMB_F_NOCREATE : 0) |
				(with_state ? EMB_F_WITH_STATE : 0);
	uint32_t *cnt, *ppos;
	uint64_t *pids;
	size_t resp_bytes = 0;
	struct emb_async *op;
	void *unused;
	int64_t nu;
	char *r;
	int rc;

	if (!t || (n && (!ids || !out)) ||
	    (flags & ~(EMB_CLIENT_NOCREATE | EMB_CLIENT_WITH_STATE)))
		return EMB_EBADARG;
	op = op_new(c, OP_PULL);
	if (!op || op_counts(op, c->nsrv)) {
		rc = -ENOMEM;
		goto err;
	}
	cnt = op->cnt;
	op->dim = with_state ? t->row_floats : t->spec.dim;
	op->state = with_state ? t->row_floats - t->spec.dim : 0;
	op->n = n;
	op->out = out;
	op->found = found;
	op->tids = t->ids;
	op->tbl = t;
	__atomic_fetch_add(&t->refs, 1, __ATOMIC_RELAXED);
	/* Pulls go to primaries; a replicated map moves them on a death. */
	if (c->cmap)
		pthread_mutex_lock(&c->map_mu);
	nu = n ? prepare(op, ids, n, c->slot_map, c->nsrv, 0, &pids, &ppos,
			 cnt, &unused)
	       : 0;
	if (c->cmap)
		pthread_mutex_unlock(&c->map_mu);
	if (nu < 0) {
		rc = (int)nu;
		goto err;
	}
	rc = make_parts(op, t, cnt, EMB_OP_PULL, op->dim);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp_cap = emb_wire_pull_resp_bytes(p->req.n, op->dim, wflags) -
			      EMB_WIRE_HDR_SIZE;
		if (p->req.resp_cap < ERR_CAP)
			p->req.resp_cap = ERR_CAP;
		resp_bytes += (p->req.resp_cap + 63) & ~(size_t)63;
	}
	rc = os_plan(op, t, &resp_bytes);
	if (rc)
		goto err;
	/* From the pool: over RDMA the rows land here, not in bounce
	 * pages that would be copied (docs/rdma.md). */
	op->rbuf = emb__respbuf_get(c->bufs, resp_bytes ? resp_bytes : 64);
	if (!op->rbuf) {
		rc = -ENOMEM;
		goto err;
	}
	r = op->rbuf->mem;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.resp = r;
		r += (p->req.resp_cap + 63) & ~(size_t)63;
		if (p->rd.os) {
			p->rd.land = r;
			r += ((size_t)p->req.n * p->rd.rb + 63) & ~(size_t)63;
		}
		p->req.hdr.flags = wflags;
		p->req.iov[0].iov_base = pids + p->req.first;
		p->req.iov[0].iov_len = (size_t)p->req.n * sizeof(uint64_t);
		p->req.niov = 1;
	}
	rc = op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	op_free(op);
	return rc;
}

static int push_start(struct emb_client_table *t, const uint64_t *ids,
		      uint32_t n, const float *grads, uint64_t step,
		      uint32_t rank, struct emb_async **opp)
{
	struct emb_client *c = t->c;
	const uint32_t dim = t->spec.dim;
	uint32_t *cnt, *ppos, nkeys;
	const uint16_t *key;
	uint64_t *pids = NULL;
	struct emb_async *op;
	float *pgrad = NULL;
	void *extra;
	int64_t nu;
	int rc;

	if (!t || (n && (!ids || !grads)))
		return EMB_EBADARG;
	op = op_new(c, OP_PUSH);
	/* Counts per server, or per replica group (at most one a slot). */
	if (!op || op_counts(op, c->cmap ? EMB_NSLOTS : c->nsrv)) {
		rc = -ENOMEM;
		goto err;
	}
	cnt = op->cnt;
	op->dim = dim;
	key = write_keys(c, &nkeys);
	nu = n ? prepare(op, ids, n, key, nkeys,
			 (size_t)n * dim * sizeof(float), &pids, &ppos, cnt,
			 &extra)
	       : 0;
	if (nu < 0) {
		unlock_keys(c);
		rc = (int)nu;
		goto err;
	}
	/* Sum duplicates straight into server order: first occurrence
	 * copies, later ones add, in batch order. */
	pgrad = n ? extra : NULL;
	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		float *dst = pgrad + (size_t)ppos[u] * dim;
		uint32_t i = op->first[u];

		memcpy(dst, grads + (size_t)i * dim, dim * sizeof(float));
		for (i = op->next[i]; i != NONE; i = op->next[i])
			for (uint32_t j = 0; j < dim; j++)
				dst[j] += grads[(size_t)i * dim + j];
	}
	rc = c->cmap ? make_parts_rep(op, t, cnt, EMB_OP_PUSH, dim)
		     : make_parts(op, t, cnt, EMB_OP_PUSH, dim);
	unlock_keys(c);
	if (!rc)
		rc = give_err_bufs(op);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		/* The sequence number is fixed now, so a retry repeats it. */
		p->req.seq = __atomic_add_fetch(&c->srv[p->req.server].push_seq, 1,
					    __ATOMIC_RELAXED);
		emb_le64_store(p->req.prefix, step);
		emb_le32_store(p->req.prefix + 8, rank);
		emb_le32_store(p->req.prefix + 12, 0);
		emb_le64_store(p->req.prefix + 16, c->session);
		emb_le64_store(p->req.prefix + 24, p->req.seq);
		p->req.iov[0] = (struct iovec){p->req.prefix, EMB_WIRE_PUSH_PREFIX_SIZE};
		p->req.iov[1] = (struct iovec){pids + p->req.first,
					   (size_t)p->req.n * sizeof(uint64_t)};
		p->req.iov[2] = (struct iovec){pgrad + (size_t)p->req.first * dim,
					   (size_t)p->req.n * dim * sizeof(float)};
		p->req.niov = p->req.n ? 3 : 1; /* an empty STEP_END part */
	}
	rc = op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	op_free(op);
	return rc;
}

/* Assign and erase: no dedup (last write wins in batch order per server). */
static int ids_start(struct emb_client_table *t, enum op_kind kind,
		     const uint64_t *ids, uint32_t n, const float *rows,
		     uint32_t stride, uint16_t flags, struct emb_async **opp)
{
	struct emb_client *c = t->c;
	uint32_t *cnt, *start, nkeys, most;
	const uint16_t *key;
	struct emb_async *op;
	uint64_t *pids;
	float *prows = NULL;
	int rc = -ENOMEM;

	op = op_new(c, kind);
	if (!op)
		return -ENOMEM;
	most = c->cmap ? EMB_NSLOTS : c->nsrv;
	if (op_counts(op, most) ||
	    op_mem(op, (size_t)n * (8 + (rows ? 4ull * stride : 0)) + 8))
		goto err;
	cnt = op->cnt;
	start = cnt + most;
	pids = op->mem;
	if (rows)
		prows = (float *)(void *)(pids + n);
	key = write_keys(c, &nkeys);
	for (uint32_t i = 0; i < n; i++)
		cnt[key[emb_id_slot(ids[i])]]++;
	for (uint32_t s = 0; s < nkeys; s++)
		start[s + 1] = start[s] + cnt[s];
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = start[key[emb_id_slot(ids[i])]]++;

		pids[pos] = ids[i];
		if (rows)
			memcpy(prows + (size_t)pos * stride,
			       rows + (size_t)i * stride,
			       (size_t)stride * sizeof(float));
	}
	rc = c->cmap ? make_parts_rep(op, t, cnt,
				      kind == OP_ASSIGN ? EMB_OP_ASSIGN
							: EMB_OP_ERASE,
				      rows ? stride : 0)
		     : make_parts(op, t, cnt,
				  kind == OP_ASSIGN ? EMB_OP_ASSIGN
						    : EMB_OP_ERASE,
				  rows ? stride : 0);
	unlock_keys(c);
	if (!rc)
		rc = give_err_bufs(op);
	if (rc)
		goto err;
	for (uint32_t k = 0; k < op->nparts; k++) {
		struct part *p = &op->parts[k];

		p->req.hdr.flags = flags;
		p->req.iov[0] = (struct iovec){pids + p->req.first,
					   (size_t)p->req.n * sizeof(uint64_t)};
		p->req.niov = 1;
		if (rows) {
			p->req.iov[1] = (struct iovec){
			    prows + (size_t)p->req.first * stride,
			    (size_t)p->req.n * stride * sizeof(float)};
			p->req.niov = 2;
		}
	}
	rc = op_post(op);
	if (rc)
		goto err;
	*opp = op;
	return 0;
err:
	op_free(op);
	return rc;
}

int emb_client_table_pull_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, float *out, uint32_t flags,
				uint8_t *found, struct emb_async **op)
{
	if (!op)
		return EMB_EBADARG;
	return pull_start(t, ids, n, out, flags, found, op);
}

int emb_client_table_push_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, const float *grads, uint64_t step,
				uint32_t rank, struct emb_async **op)
{
	if (!op)
		return EMB_EBADARG;
	return push_start(t, ids, n, grads, step, rank, op);
}

int emb_client_table_pull(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, float *out, uint32_t flags,
			  uint8_t *found)
{
	struct emb_async *op;
	int rc = pull_start(t, ids, n, out, flags, found, &op);

	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_push(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads, uint64_t step,
			  uint32_t rank)
{
	struct emb_async *op;
	int rc = push_start(t, ids, n, grads, step, rank, &op);

	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_assign(struct emb_client_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state)
{
	struct emb_async *op;
	int rc;

	if (!t || (n && (!ids || !rows)))
		return EMB_EBADARG;
	rc = ids_start(t, OP_ASSIGN, ids, n, rows,
		       with_state ? t->row_floats : t->spec.dim,
		       with_state ? EMB_F_WITH_STATE : 0, &op);
	return rc ? rc : emb_async_wait(op);
}

int emb_client_table_erase(struct emb_client_table *t, const uint64_t *ids,
			   uint32_t n, uint64_t *erased)
{
	struct emb_async *op;
	uint64_t count;
	int rc;

	if (!t || (n && !ids))
		return EMB_EBADARG;
	rc = ids_start(t, OP_ERASE, ids, n, NULL, 0, 0, &op);
	if (rc)
		return rc;
	/* Read the count before emb_async_wait() frees the op. */
	pthread_mutex_lock(&op->mu);
	while (!op->done)
		pthread_cond_wait(&op->cv, &op->mu);
	pthread_mutex_unlock(&op->mu);
	count = op->count;
	rc = emb_async_wait(op);
	if (erased)
		*erased = count;
	return rc;
}

/* ---- admin requests: one to every server ---- */

/*
 * Sends the same request (opcode, payload) to every server, with table_ids[s]
 * (or 0) in the header, and waits. Returns the finished op, whose parts hold
 * each server's response, or NULL with *rc set. The caller frees the op.
 */
static struct emb_async *broadcast(struct emb_client *c, uint8_t opcode,
				   const uint32_t *table_ids,
				   const void *payload, size_t len, int *rc)
{
	struct emb_async *op = op_new(c, OP_ADMIN);
	char *r;

	if (!op) {
		*rc = -ENOMEM;
		return NULL;
	}
	/* Registered too: a listing is larger than an inline response. */
	op->rbuf = emb__respbuf_get(c->bufs, (size_t)c->nsrv * ADMIN_RESP_MAX);
	if (op_parts(op, c->nsrv) || !op->rbuf) {
		*rc = -ENOMEM;
		goto err;
	}
	r = op->rbuf->mem;
	for (uint32_t s = 0; s < c->nsrv; s++) {
		struct part *p = &op->parts[s];

		p->op = op;
		p->req.server = s;
		p->req.hdr.opcode = opcode;
		p->req.hdr.table_id = table_ids ? table_ids[s] : 0;
		p->req.iov[0] = (struct iovec){(void *)payload, len};
		p->req.niov = len ? 1 : 0;
		p->req.resp = r + (size_t)s * ADMIN_RESP_MAX;
		p->req.resp_cap = ADMIN_RESP_MAX;
	}
	op->nparts = c->nsrv;
	*rc = op_post(op);
	if (*rc)
		goto err;
	pthread_mutex_lock(&op->mu);
	while (!op->done)
		pthread_cond_wait(&op->cv, &op->mu);
	pthread_mutex_unlock(&op->mu);
	*rc = op->status;
	return op;
err:
	op_free(op);
	return NULL;
}

static void admin_free(struct emb_async *op)
{
	op_free(op);
}

static struct emb_wire_frame part_frame(const struct part *p,
					const struct emb_wire_limits *lim)
{
	struct emb_wire_frame f = {
	    .hdr = p->req.rhdr, .payload = p->req.resp, .lim = lim};

	return f;
}

static int table_new(struct emb_client *c, const struct emb_wire_spec *ws,
		     struct emb_client_table **out)
{
	struct emb_client_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->ids = calloc(c->nsrv, sizeof(*t->ids));
	if (!t->ids) {
		free(t);
		return -ENOMEM;
	}
	t->c = c;
	memcpy(t->name, ws->name, sizeof(t->name));
	t->spec.name = t->name;
	t->spec.dim = ws->dim;
	t->spec.optim = ws->optim;
	t->spec.init = ws->init;
	t->spec.seed = ws->seed;
	t->row_floats =
	    ws->dim + emb_optim_state_floats(ws->optim.kind, ws->dim);
	t->refs = 1;
	if (c->onesided) {
		t->loc = calloc(c->loc_rows, sizeof(*t->loc));
		t->rem = calloc(c->nsrv, sizeof(*t->rem));
		if (!t->loc || !t->rem) {
			table_unref(t);
			return -ENOMEM;
		}
		t->loc_mask = c->loc_rows / LOC_WAYS - 1;
	}
	/* Listed, so that a newcomer on a dead rank learns its ids. */
	pthread_mutex_lock(&c->tab_mu);
	t->tnext = c->tabs;
	if (c->tabs)
		c->tabs->tprev = t;
	c->tabs = t;
	pthread_mutex_unlock(&c->tab_mu);
	*out = t;
	return 0;
}

/* What one server keeps of a table-wide policy: ids hash evenly over the
 * servers, so each holds its share of max_rows. */
static struct emb_lifecycle_cfg per_server(const struct emb_client *c,
					   const struct emb_lifecycle_cfg *l)
{
	struct emb_lifecycle_cfg r = *l;

	if (r.max_rows)
		r.max_rows = (r.max_rows + c->nsrv - 1) / c->nsrv;
	return r;
}

/*
 * Copies of a slot must hold the same rows, but pulls reach the primary
 * only: a backup would count no sightings (admitting nothing, dropping
 * every push) and age rows by pushes alone. So a replicated map takes no
 * policy, as it takes no synchronous mode.
 */
static bool life_replicable(const struct emb_client *c,
			    const struct emb_lifecycle_cfg *l)
{
	return !c->cmap || emb_lifecycle_is_off(l);
}

int emb_client_table_create(struct emb_client *c,
			    const struct emb_table_spec *spec,
			    struct emb_client_table **out)
{
	uint8_t payload[EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE +
			EMB_WIRE_LIFECYCLE_SIZE];
	struct emb_client_table *t;
	struct emb_wire_spec ws = {0};
	struct emb_async *op;
	int rc, len;

	if (!c || !spec || !out || !spec->name)
		return EMB_EBADARG;
	if (strlen(spec->name) >= sizeof(ws.name))
		return EMB_EBADNAME;
	strcpy(ws.name, spec->name);
	ws.dim = spec->dim;
	ws.optim = spec->optim;
	ws.init = spec->init;
	ws.seed = spec->seed;
	ws.life = per_server(c, &spec->life);
	if (!life_replicable(c, &ws.life))
		return -EOPNOTSUPP;
	rc = emb_optim_validate(&ws.optim);
	if (!rc)
		rc = emb_init_validate(&ws.init);
	if (!rc)
		rc = emb_lifecycle_validate(&ws.life);
	if (rc)
		return rc;
	len = emb_wire_create_req_encode(payload, sizeof(payload), 0, &ws);
	if (len < 0)
		return len;
	op =
	    broadcast(c, EMB_OP_CREATE_TABLE, NULL, payload + EMB_WIRE_HDR_SIZE,
		      (size_t)len - EMB_WIRE_HDR_SIZE, &rc);
	if (!op)
		return rc;
	if (rc)
		goto out;
	rc = table_new(c, &ws, &t);
	if (rc)
		goto out;
	for (uint32_t s = 0; s < c->nsrv; s++)
		t->ids[s] = op->parts[s].req.rhdr.table_id;
	*out = t;
out:
	admin_free(op);
	return rc;
}

static bool spec_equal(const struct emb_wire_spec *a,
		       const struct emb_wire_spec *b)
{
	return a->dim == b->dim && a->seed == b->seed &&
	       memcmp(&a->optim, &b->optim, sizeof(a->optim)) == 0 &&
	       memcmp(&a->init, &b->init, sizeof(a->init)) == 0;
}

int emb_client_table_open(struct emb_client *c, const char *name,
			  struct emb_client_table **out)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_client_table *t = NULL;
	struct emb_wire_spec first = {0};
	struct emb_async *op;
	int rc;

	if (!c || !name || !out)
		return EMB_EBADARG;
	lim.max_tables = 65536;
	op = broadcast(c, EMB_OP_LIST_TABLES, NULL, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < c->nsrv && !rc; s++) {
		struct emb_wire_frame f = part_frame(&op->parts[s], &lim);
		struct emb_wire_list_resp lr;
		struct emb_wire_table_info info;
		bool hit = false;

		if (op->parts[s].rep.skip)
			continue; /* removed: its tables live on its backups */
		rc = emb_wire_list_resp_decode(&f, &lr);
		for (uint32_t i = 0; !rc && i < lr.n && !hit; i++) {
			emb_wire_list_entry(&lr, i, &info);
			if (strcmp(info.spec.name, name) != 0)
				continue;
			hit = true;
			if (!t) {
				first = info.spec;
				rc = table_new(c, &info.spec, &t);
			} else if (!spec_equal(&first, &info.spec)) {
				rc = EMB_ETABLEEXISTS;
			}
			if (!rc)
				t->ids[s] = info.table_id;
		}
		if (!rc && !hit)
			rc = EMB_ENOTABLE;
	}
	admin_free(op);
	if (rc) {
		emb_client_table_close(t);
		return rc;
	}
	*out = t;
	return 0;
}

/* The last reference frees: the user's, or a LOCATE still in flight. */
static void table_unref(struct emb_client_table *t)
{
	if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL))
		return;
	free(t->loc);
	free(t->rem);
	free(t->ids);
	free(t);
}

void emb_client_table_close(struct emb_client_table *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->c->tab_mu);
	if (t->tprev)
		t->tprev->tnext = t->tnext;
	else
		t->c->tabs = t->tnext;
	if (t->tnext)
		t->tnext->tprev = t->tprev;
	pthread_mutex_unlock(&t->c->tab_mu);
	table_unref(t);
}

int emb_client_table_drop(struct emb_client_table *t)
{
	struct emb_async *op;
	int rc;

	if (!t)
		return EMB_EBADARG;
	op = broadcast(t->c, EMB_OP_DROP_TABLE, t->ids, NULL, 0, &rc);
	admin_free(op);
	return rc;
}

int emb_client_table_set_mode(struct emb_client_table *t, uint32_t mode,
			      uint32_t workers, uint32_t staleness)
{
	struct emb_wire_set_mode_req m = {.table_id = 1,
					  .mode = mode,
					  .workers = workers,
					  .staleness = staleness};
	uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_SET_MODE_SIZE];
	struct emb_async *op;
	int rc, len;

	if (!t)
		return EMB_EBADARG;
	/* A step's end is per server; replicas would each need them all. */
	if (t->c->cmap && mode == EMB_MODE_SYNC)
		return -EOPNOTSUPP;
	len = emb_wire_set_mode_req_encode(buf, sizeof(buf), 0, &m);
	if (len < 0)
		return len;
	op = broadcast(t->c, EMB_OP_SET_MODE, t->ids, buf + EMB_WIRE_HDR_SIZE,
		       (size_t)len - EMB_WIRE_HDR_SIZE, &rc);
	admin_free(op);
	if (!rc)
		t->mode = mode;
	return rc;
}

int emb_client_table_set_lifecycle(struct emb_client_table *t,
				   const struct emb_lifecycle_cfg *life)
{
	struct emb_wire_set_lifecycle_req m = {.table_id = 1};
	uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_LIFECYCLE_SIZE];
	struct emb_async *op;
	int rc, len;

	if (!t || !life)
		return EMB_EBADARG;
	m.life = per_server(t->c, life);
	if (!life_replicable(t->c, &m.life))
		return -EOPNOTSUPP;
	len = emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 0, &m);
	if (len < 0)
		return len;
	op = broadcast(t->c, EMB_OP_SET_LIFECYCLE, t->ids,
		       buf + EMB_WIRE_HDR_SIZE, (size_t)len - EMB_WIRE_HDR_SIZE,
		       &rc);
	admin_free(op);
	return rc;
}

int emb_client_table_stats(struct emb_client_table *t,
			   struct emb_client_table_stats *out)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_async *op;
	uint64_t row_bytes = 0, step = 0;
	int rc;

	if (!t || !out)
		return EMB_EBADARG;
	memset(out, 0, sizeof(*out));
	lim.max_tables = 65536;
	op = broadcast(t->c, EMB_OP_STATS, t->ids, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < t->c->nsrv && !rc; s++) {
		struct emb_wire_frame f = part_frame(&op->parts[s], &lim);
		struct emb_wire_stats_resp sr;
		struct emb_wire_stats w;

		if (op->parts[s].rep.skip)
			continue; /* removed, its slots served by backups */
		rc = emb_wire_stats_resp_decode(&f, &sr);
		if (rc || sr.n != 1) {
			rc = rc ? rc : EMB_EBADFRAME;
			break;
		}
		emb_wire_stats_entry(&sr, 0, &w);
#define SUM(name, what) out->name += w.name;
		EMB_TABLE_STATS(SUM)
#undef SUM
		/* Per-table, not additive: the largest of any server. */
		row_bytes = w.row_bytes > row_bytes ? w.row_bytes : row_bytes;
		step = w.step > step ? w.step : step;
		out->servers++;
	}
	out->row_bytes = row_bytes;
	out->step = step;
	admin_free(op);
	return rc;
}

uint32_t emb_client_table_dim(const struct emb_client_table *t)
{
	return t->spec.dim;
}

uint32_t emb_client_table_row_floats(const struct emb_client_table *t)
{
	return t->row_floats;
}

const struct emb_table_spec *
emb_client_table_spec(const struct emb_client_table *t)
{
	return &t->spec;
}

uint32_t emb__client_table_mode(const struct emb_client_table *t)
{
	return t->mode;
}

/* ---- client ---- */

static int parse_servers(struct emb_client *c, const char *list)
{
	uint32_t n = 1;
	struct emb_addr *a;
	int rc;

	for (const char *q = list; *q; q++)
		n += *q == ',';
	c->srv = calloc(n, sizeof(*c->srv));
	a = calloc(n, sizeof(*a));
	if (!c->srv || !a) {
		free(a);
		return -ENOMEM;
	}
	rc = emb_addr_list_parse(list, a, n);
	for (int i = 0; i < rc; i++) {
		memcpy(c->srv[i].host, a[i].host, sizeof(c->srv[i].host));
		c->srv[i].port = a[i].port;
	}
	free(a);
	if (rc < 0)
		return -EINVAL;
	c->nsrv = n;
	/* Slots go to servers in contiguous ranges, so a dump grouped by slot
	 * splits cleanly when restored onto another number of servers. */
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		c->slot_map[sl] = (uint16_t)((uint64_t)sl * n / EMB_NSLOTS);
	return 0;
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

static void server_up(struct emb_client *c, struct server *s);
static void tables_next(struct emb_client *c, struct server *s);

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
			fail_waiting(s, status);
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

		part_send(c, p);
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
		rconn_lost(s, status);
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
		rconn_lost(s, rc);
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
 * Loop thread: ends waiting parts whose deadline passed and reconnects
 * servers that have parts waiting and whose backoff is over. Returns how
 * long the loop may sleep before the next call, in ms.
 */
static int maintain(struct emb_client *c)
{
	uint64_t now = emb_clock_ms();
	struct part *p, **pp = &c->delayed, *due = NULL;
	int wait = 100;

	rmaintain(c, now);
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
		add(&c->retries, 1);
		part_send(c, p);
	}

	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct server *s = &c->srv[i];
		struct part **wp = &s->wait_head, *last = NULL;

		while (*wp) {
			p = *wp;

			if (now < p->op->deadline_ms) {
				last = p;
				wp = &p->retry.wnext;
				continue;
			}
			*wp = p->retry.wnext;
			part_end(p, s->last_err ? s->last_err : -ETIMEDOUT,
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

static void *loop_main(void *arg)
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

static int connect_all(struct emb_client *c, const char *transport,
		       const struct emb_client_opts *opts)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	uint32_t i;
	int rc;

	topts.call_timeout_ms = c->timeout_ms;
	topts.connect_timeout_ms = c->timeout_ms < 5000 ? c->timeout_ms : 5000;
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
		rc = emb_conn_create(c->tr, &co, &c->srv[i].conn);
		if (rc) {
			emb_log(EMB_LOG_WARN, "connect to %s:%u over %s: %s",
				c->srv[i].host, c->srv[i].port,
				co.via ? co.via : transport, emb_strerror(rc));
			goto err;
		}
		rc = hello(c, &c->srv[i]);
		if (rc) {
			emb_log(EMB_LOG_WARN, "hello to %s:%u: %s",
				c->srv[i].host, c->srv[i].port,
				emb_strerror(rc));
			i++;
			goto err;
		}
		if (c->dual && c->srv[i].rdma_offered)
			move_to_rdma(c, &c->srv[i]);
		note_via(&c->srv[i]);
		if (c->onesided && c->srv[i].on_rdma)
			rconnect(c, &c->srv[i], true);
	}
	return 0;
err:
	while (i-- > 0) {
		emb_conn_destroy(c->srv[i].conn);
		c->srv[i].conn = NULL;
		rconn_lost(&c->srv[i], EMB_ECLOSED);
	}
	emb__respbufs_destroy(c->bufs);
	c->bufs = NULL;
err_tr:
	emb_transport_destroy(c->tr);
	c->tr = NULL;
	return rc;
}

void emb__client_env_log_level(void)
{
	const char *v = getenv("EMB_LOG_LEVEL");
	enum emb_log_level lvl;

	/* A trainer has no flag for it: the library honours the variable the
	 * servers and tools read. */
	if (v && emb_log_parse_level(v, &lvl) == 0)
		emb_log_set_level(lvl);
}

/*
 * EMB_ADMIN_TOKEN_FILE names the admin token the client presents in HELLO
 * (EMB_F_ADMIN), as the servers and tools read it: a trainer that sets
 * modes, or the CLI, gets admin rights from its environment, and the
 * options struct (mirrored by the Python binding) keeps its layout.
 */
static int env_admin_token(struct emb_client *c)
{
	const char *path = getenv("EMB_ADMIN_TOKEN_FILE");
	int rc;

	if (!path || !*path)
		return 0;
	rc = emb_token_read_file(path, c->admin, &c->admin_len);
	if (rc)
		emb_log(EMB_LOG_ERROR, "admin token file %s: %s", path,
			rc == -EINVAL ? "empty or longer than 256 bytes"
				      : emb_strerror(rc));
	return rc;
}

static int client_create(const struct emb_client_opts *opts,
			 const bool *removed, struct emb_client **out);

int emb_client_create(const struct emb_client_opts *opts,
		      struct emb_client **out)
{
	return client_create(opts, NULL, out);
}

int emb__client_create_live(const struct emb_client_opts *opts,
			    const bool *removed, struct emb_client **out)
{
	return client_create(opts, removed, out);
}

static int client_create(const struct emb_client_opts *opts,
			 const bool *removed, struct emb_client **out)
{
	const char *tp;
	struct emb_client *c;
	int rc;

	if (!opts || !out || !opts->servers || !*opts->servers ||
	    opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token))
		return -EINVAL;
	emb__client_env_log_level();
	tp = opts->transport ? opts->transport : "tcp";
	/* Both named, as a server's EMB_TRANSPORT may be: that is "auto". */
	if (strcmp(tp, "tcp,rdma") == 0 || strcmp(tp, "rdma,tcp") == 0)
		tp = "auto";
	if (strcmp(tp, "tcp") && strcmp(tp, "rdma") && strcmp(tp, "auto"))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->ops = calloc(1, sizeof(*c->ops));
	if (!c->ops) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->ops->mu, NULL);
	pthread_mutex_init(&c->err_lock, NULL);
	pthread_mutex_init(&c->map_mu, NULL);
	pthread_mutex_init(&c->tab_mu, NULL);
	c->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 30000;
	c->part_ids = opts->part_ids ? opts->part_ids : 1024;
	if (opts->pull_mode > EMB_PULL_ONESIDED ||
	    opts->loc_cache_rows > (1u << 30)) {
		rc = -EINVAL;
		goto err_free;
	}
	c->onesided = opts->pull_mode == EMB_PULL_ONESIDED;
	c->loc_rows = LOC_ROWS_DEFAULT;
	if (opts->loc_cache_rows) {
		/* A power of two, so a bucket is a mask of the id hash. */
		c->loc_rows = LOC_WAYS;
		while (c->loc_rows < opts->loc_cache_rows)
			c->loc_rows <<= 1;
	}
	rc = env_admin_token(c);
	if (rc)
		goto err_free;
	while (c->session == 0)
		if (getrandom(&c->session, sizeof(c->session), 0) !=
		    (ssize_t)sizeof(c->session))
			c->session = emb_clock_ms() ^ ((uint64_t)getpid() << 32);
	rc = parse_servers(c, opts->servers);
	if (rc)
		goto err_free;
	for (uint32_t i = 0; i < c->nsrv; i++) {
		c->srv[i].c = c;
		c->srv[i].dead = removed && removed[i];
	}
	if (strcmp(tp, "auto") == 0) {
		/* Both where this host has a device; each server's HELLO
		 * then says whether RDMA is there too (move_to_rdma). */
		rc = connect_all(c,
				 emb_transport_usable("rdma") ? "tcp,rdma"
							      : "tcp",
				 opts);
	} else {
		rc = connect_all(c, tp, opts);
	}
	if (rc)
		goto err_free;
	emb_log(EMB_LOG_INFO, "connected to %u server%s over %s", c->nsrv,
		c->nsrv == 1 ? "" : "s", emb_client_transport(c));
	rc = -pthread_create(&c->thread, NULL, loop_main, c);
	if (rc)
		goto err_conns;
	c->running = true;
	*out = c;
	return 0;

err_conns:
	for (uint32_t i = 0; i < c->nsrv; i++) {
		emb_conn_destroy(c->srv[i].conn);
		rconn_lost(&c->srv[i], EMB_ECLOSED);
	}
	emb__respbufs_destroy(c->bufs);
	emb_transport_destroy(c->tr);
err_free:
	free(c->srv);
	pool_close(c->ops);
	pthread_mutex_destroy(&c->tab_mu);
	pthread_mutex_destroy(&c->map_mu);
	pthread_mutex_destroy(&c->err_lock);
	free(c);
	return rc;
}

void emb_client_destroy(struct emb_client *c)
{
	if (!c)
		return;
	/* First: the node's agent posts to this client's loop. */
	emb_node_destroy(c->node);
	__atomic_store_n(&c->stopping, true, __ATOMIC_RELEASE);
	if (c->running) {
		emb_transport_wake(c->tr);
		pthread_join(c->thread, NULL);
	}
	/* The loop thread is gone: this thread may now own the conns. A
	 * call still on one (a reconnect's HELLO) comes back during the
	 * destroy and must find the server without it. */
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct emb_conn *conn = c->srv[i].conn;

		/* READ batches still out fall back to the main conn: end
		 * them first, so that what falls back fails with it below. */
		rconn_lost(&c->srv[i], EMB_ECLOSED);
		c->srv[i].conn = NULL;
		c->srv[i].state = SRV_DOWN;
		emb_conn_destroy(conn);
		fail_waiting(&c->srv[i], EMB_ECLOSED);
	}
	while (c->delayed) {
		struct part *p = c->delayed;

		c->delayed = p->retry.dnext;
		part_end(p, EMB_ECLOSED, NULL);
	}
	/* Buffers given back late are released by loop tasks: run them,
	 * then the pool goes before the transport that registered it. */
	emb_transport_poll(c->tr, 0);
	emb__respbufs_destroy(c->bufs);
	emb_transport_destroy(c->tr);
	for (uint32_t i = 0; i < c->nsrv; i++)
		free(c->srv[i].tab_specs);
	free(c->srv);
	free(c->cmap);
	free(c->grp);
	free(c->groups);
	pool_close(c->ops);
	pthread_mutex_destroy(&c->tab_mu);
	pthread_mutex_destroy(&c->map_mu);
	pthread_mutex_destroy(&c->err_lock);
	free(c);
}

uint32_t emb_client_nservers(const struct emb_client *c)
{
	return c->nsrv;
}

const char *emb_client_transport(const struct emb_client *c)
{
	uint32_t n = 0;

	if (!c->dual)
		return emb_transport_name(c->tr);
	for (uint32_t i = 0; i < c->nsrv; i++)
		n += __atomic_load_n(&c->srv[i].on_rdma, __ATOMIC_RELAXED);
	return n == c->nsrv ? "rdma" : n ? "tcp,rdma" : "tcp";
}

int emb_client_servers(const struct emb_client *c, char *buf, size_t cap)
{
	size_t at = 0;

	if (!c || !buf || !cap)
		return EMB_EBADARG;
	buf[0] = '\0';
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct emb_addr a = {.port = c->srv[i].port};
		int n;

		memcpy(a.host, c->srv[i].host, sizeof(a.host));
		if (i) {
			if (cap - at < 2)
				return -ENOSPC;
			buf[at++] = ',';
		}
		n = emb_addr_format(&a, buf + at, cap - at);
		if (n < 0)
			return -ENOSPC;
		at += (size_t)n;
	}
	return 0;
}

void emb_client_map(struct emb_client *c, struct emb_client_map *out)
{
	memset(out, 0, sizeof(*out));
	out->epoch = 1;
	out->replicas = 1;
	out->nservers = c->nsrv;
	if (!c->cmap)
		return;
	pthread_mutex_lock(&c->map_mu);
	out->epoch = c->cmap->epoch;
	out->replicas = c->cmap->replicas;
	out->lost_slots = emb_cmap_lost_slots(c->cmap);
	pthread_mutex_unlock(&c->map_mu);
}

int emb_client_slot_filling(struct emb_client *c, uint32_t slot)
{
	int r = -1;

	if (!c || slot >= EMB_NSLOTS || !c->cmap)
		return -1;
	pthread_mutex_lock(&c->map_mu);
	if (c->cmap->fill[slot] != EMB_CMAP_NONE)
		r = c->cmap->fill[slot];
	pthread_mutex_unlock(&c->map_mu);
	return r;
}

int emb_client_slot_holders(struct emb_client *c, uint32_t slot,
			    uint32_t *out, uint32_t cap)
{
	uint32_t n = 0;

	if (!c || slot >= EMB_NSLOTS || (cap && !out))
		return EMB_EBADARG;
	if (!c->cmap) {
		if (cap)
			out[0] = c->slot_map[slot];
		return 1;
	}
	pthread_mutex_lock(&c->map_mu);
	for (uint32_t i = 0; i < c->cmap->replicas; i++) {
		uint16_t h = c->cmap->slot[slot][i];

		if (h == EMB_CMAP_NONE)
			break;
		if (n < cap)
			out[n] = h;
		n++;
	}
	pthread_mutex_unlock(&c->map_mu);
	return (int)n;
}

bool emb_client_server_removed(const struct emb_client *c, uint32_t server)
{
	return c->cmap && server < c->nsrv && srv_dead(&c->srv[server]);
}

uint32_t emb_client_server_of(const struct emb_client *c, uint64_t id)
{
	return c->slot_map[emb_id_slot(id)];
}

void emb_client_stats(struct emb_client *c, struct emb_client_stats *out)
{
	struct emb_transport_stats ts;

	emb_transport_stats(c->tr, &ts);
	out->requests = __atomic_load_n(&c->requests, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&c->errors, __ATOMIC_RELAXED);
	out->ids_in = __atomic_load_n(&c->ids_in, __ATOMIC_RELAXED);
	out->ids_sent = __atomic_load_n(&c->ids_sent, __ATOMIC_RELAXED);
	out->bytes_out = ts.bytes_out;
	out->bytes_in = ts.bytes_in;
	out->retries = __atomic_load_n(&c->retries, __ATOMIC_RELAXED);
	out->reconnects = __atomic_load_n(&c->reconnects, __ATOMIC_RELAXED);
	out->resp_copied = ts.resp_bounced;
	out->rows_read = __atomic_load_n(&c->rows_read, __ATOMIC_RELAXED);
	out->rows_fallback =
	    __atomic_load_n(&c->rows_fallback, __ATOMIC_RELAXED);
	out->seal_failures =
	    __atomic_load_n(&c->seal_failures, __ATOMIC_RELAXED);
	out->read_conn_losses =
	    __atomic_load_n(&c->rconn_losses, __ATOMIC_RELAXED);
}

int emb_client_last_error(struct emb_client *c, char *buf, size_t cap)
{
	int st;

	pthread_mutex_lock(&c->err_lock);
	st = c->last_status;
	if (buf && cap)
		snprintf(buf, cap, "%s", c->last_msg);
	pthread_mutex_unlock(&c->err_lock);
	return st;
}

/* ---- cluster hooks (worker/cluster.c) ---- */

/*
 * Under c->map_mu (or before anyone else sees c): the primaries and the
 * replica groups of c->cmap. A lost slot keeps its old primary, whose
 * calls fail with EMB_ENODEAD, as an unreplicated client's do.
 */
static void regroup(struct emb_client *c)
{
	c->ngroups = 0;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		const uint16_t *h = c->cmap->slot[sl];
		uint16_t gone[EMB_CMAP_REPLICAS_MAX];
		uint16_t w[EMB_CMAP_REPLICAS_MAX + 1];
		uint32_t g = 0;

		/* Writes go to the slot's writers: its holders and the
		 * server being filled with it, which never takes a holder's
		 * place (a fill needs room), so R entries hold them. */
		if (c->cmap->fill[sl] != EMB_CMAP_NONE) {
			uint32_t nw = emb_cmap_writers(c->cmap, sl, w);

			for (uint32_t i = nw; i < EMB_CMAP_REPLICAS_MAX; i++)
				w[i] = EMB_CMAP_NONE;
			h = w;
		}
		if (h[0] == EMB_CMAP_NONE) {
			/* No copy left: a group of the old primary alone,
			 * dead, so that writes fail. */
			memcpy(gone, h, sizeof(gone));
			gone[0] = c->slot_map[sl];
			h = gone;
		} else {
			c->slot_map[sl] = h[0];
		}
		/* Few groups (about one per server): a linear search. */
		while (g < c->ngroups &&
		       memcmp(c->groups[g], h, sizeof(c->groups[g])))
			g++;
		if (g == c->ngroups)
			memcpy(c->groups[c->ngroups++], h, sizeof(c->groups[g]));
		c->grp[sl] = (uint16_t)g;
	}
}

static int set_map(struct emb_client *c, const uint16_t *slot_map, uint32_t r,
		   const bool *removed, bool check);

int emb__client_set_cluster(struct emb_client *c, const uint16_t *slot_map,
			    struct emb_node *node)
{
	uint32_t r = node ? emb_node_replicas(node) : 1;
	const struct emb_wire_node_addr *srv =
	    node ? emb_node_servers(node) : NULL;
	bool *removed = NULL;
	int rc;

	if (r > 1) {
		removed = calloc(c->nsrv, sizeof(*removed));
		if (!removed)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->nsrv; i++)
			removed[i] = srv[i].removed;
	}
	/* With the scheduler's whole map to follow (emb__client_set_cmap()),
	 * primaries are its, not what init and removals give. */
	rc = set_map(c, slot_map, r, removed,
		     !(r > 1 && emb_node_coord(node) == NULL &&
		       !emb_node_is_static(node)));
	free(removed);
	if (!rc)
		c->node = node;
	return rc;
}

int emb__client_set_map(struct emb_client *c, const uint16_t *slot_map,
			uint32_t r, const bool *removed)
{
	return set_map(c, slot_map, r, removed, true);
}

/* check: the primaries must be what init and removals give (no map from
 * the scheduler follows to say otherwise). */
static int set_map(struct emb_client *c, const uint16_t *slot_map, uint32_t r,
		   const bool *removed, bool check)
{
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		if (slot_map[sl] >= c->nsrv)
			return -EINVAL;
	if (r > 1) {
		c->cmap = malloc(sizeof(*c->cmap));
		c->grp = calloc(EMB_NSLOTS, sizeof(*c->grp));
		c->groups = calloc(EMB_NSLOTS, sizeof(*c->groups));
		if (!c->cmap || !c->grp || !c->groups)
			goto err;
		if (emb_cmap_init(c->cmap, c->nsrv, r))
			goto err_inval;
		/* A map sent after a failover says who was removed; the
		 * rest follows (cluster/map.h), and must be what was sent. */
		for (uint32_t i = 0; i < c->nsrv; i++) {
			if (!removed || !removed[i])
				continue;
			emb_cmap_remove(c->cmap, i, c->cmap);
			/* Its calls end at once (no connection is made). */
			__atomic_store_n(&c->srv[i].dead, true,
					 __ATOMIC_RELAXED);
		}
		for (uint32_t sl = 0; check && sl < EMB_NSLOTS; sl++)
			if (emb_cmap_primary(c->cmap, sl) != slot_map[sl])
				goto err_inval;
	}
	memcpy(c->slot_map, slot_map, sizeof(c->slot_map));
	if (c->cmap)
		regroup(c);
	return 0;
err_inval:
	free(c->cmap);
	free(c->grp);
	free(c->groups);
	c->cmap = NULL;
	c->grp = NULL;
	c->groups = NULL;
	return -EINVAL;
err:
	free(c->cmap);
	free(c->grp);
	free(c->groups);
	c->cmap = NULL;
	c->grp = NULL;
	c->groups = NULL;
	return -ENOMEM;
}

struct emb_node *emb__client_node(const struct emb_client *c)
{
	return c->node;
}

int emb__client_set_cmap(struct emb_client *c, const struct emb_cmap *m)
{
	bool *removed;
	int rc;

	if (!c->cmap) {
		/* The shape first, then the scheduler's map over it: after a
		 * join or a rebalance it is no longer init and removals. */
		removed = calloc(c->nsrv, sizeof(*removed));
		if (!removed)
			return -ENOMEM;
		for (uint32_t i = 0; i < c->nsrv; i++)
			removed[i] = srv_dead(&c->srv[i]);
		rc = set_map(c, c->slot_map, m->replicas, removed, false);
		free(removed);
		if (rc)
			return rc;
	}
	if (!c->cmap || m->nservers != c->nsrv || m->replicas != c->cmap->replicas)
		return -EINVAL;
	pthread_mutex_lock(&c->map_mu);
	*c->cmap = *m;
	c->map_epoch = m->epoch;
	regroup(c);
	pthread_mutex_unlock(&c->map_mu);
	return 0;
}

/* A scheduler's newer map, on its way to the client's loop. */
struct adopt {
	struct emb_client *c;
	struct emb_cmap m;
	uint32_t n;			     /* servers */
	struct emb_wire_node_addr srv[]; /* by rank */
};

static void close_dead(void *arg);

/* Whether rank holds or is being filled with any slot in m. */
static bool in_map(const struct emb_cmap *m, uint32_t rank)
{
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		if (m->fill[s] == rank || emb_cmap_holds(m, s, rank))
			return true;
	return false;
}

/*
 * Loop thread: routes by the scheduler's map from now on. Its removed
 * flags say who is dead, and a dead rank a newcomer took comes back with
 * the newcomer's address: its table ids are learned before anything is
 * sent there (tables_begin()).
 */
static void adopt_run(void *arg)
{
	struct adopt *a = arg;
	struct emb_client *c = a->c;
	uint32_t revived = 0;

	if (!c->cmap || a->n != c->nsrv || a->m.replicas != c->cmap->replicas ||
	    a->m.epoch < c->map_epoch) {
		free(a);
		return;
	}
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct server *s = &c->srv[i];
		const struct emb_wire_node_addr *na = &a->srv[i];
		bool moved = strcmp(s->host, na->host) || s->port != na->port;

		if (na->removed || !in_map(&a->m, i)) {
			if (na->removed)
				__atomic_store_n(&s->dead, true,
						 __ATOMIC_RELAXED);
			continue;
		}
		if (!srv_dead(s) && !moved)
			continue;
		/* A newcomer on this rank (or the map says it lives after a
		 * death heard before it): a fresh conn, ids to learn. */
		if (moved) {
			snprintf(s->host, sizeof(s->host), "%s", na->host);
			s->port = na->port;
		}
		if (s->conn) {
			struct emb_conn *conn = s->conn;

			s->conn = NULL;
			s->state = SRV_DOWN;
			emb_conn_destroy(conn);
		}
		s->state = SRV_DOWN;
		s->retry_ms = 0;
		s->backoff_ms = 0;
		s->revived = true;
		s->rdma_refused = false;
		if (!s->lim.max_ids)
			for (uint32_t j = 0; j < c->nsrv; j++)
				if (c->srv[j].lim.max_ids) {
					s->lim = c->srv[j].lim;
					break;
				}
		__atomic_store_n(&s->dead, false, __ATOMIC_RELAXED);
		revived++;
	}
	pthread_mutex_lock(&c->map_mu);
	*c->cmap = a->m;
	c->map_epoch = a->m.epoch;
	/* Deaths heard since the map was made still count. */
	for (uint32_t i = 0; i < c->nsrv; i++)
		if (srv_dead(&c->srv[i]))
			emb_cmap_remove(c->cmap, i, c->cmap);
	regroup(c);
	pthread_mutex_unlock(&c->map_mu);
	emb_log(EMB_LOG_INFO, "map epoch %llu from the scheduler%s",
		(unsigned long long)a->m.epoch,
		revived ? ": a newcomer took a dead server's place" : "");
	free(a);
	close_dead(c);
}

int emb__client_adopt_map(struct emb_client *c, const struct emb_cmap *m,
			  const struct emb_wire_node_addr *srv, uint32_t n)
{
	struct adopt *a = malloc(sizeof(*a) + n * sizeof(a->srv[0]));
	int rc;

	if (!a)
		return -ENOMEM;
	a->c = c;
	a->m = *m;
	a->n = n;
	memcpy(a->srv, srv, n * sizeof(a->srv[0]));
	rc = emb_transport_exec(c->tr, adopt_run, a);
	if (rc)
		free(a);
	return rc;
}

/*
 * Loop thread: a replicated map drops the servers declared dead, before
 * their calls fail, so that pulls find the new primaries.
 */
static void failover(struct emb_client *c)
{
	uint64_t epoch;
	uint32_t lost;

	if (!c->cmap)
		return;
	pthread_mutex_lock(&c->map_mu);
	epoch = c->cmap->epoch;
	for (uint32_t i = 0; i < c->nsrv; i++)
		if (srv_dead(&c->srv[i]))
			emb_cmap_remove(c->cmap, i, c->cmap);
	if (c->cmap->epoch != epoch)
		regroup(c);
	lost = emb_cmap_lost_slots(c->cmap);
	pthread_mutex_unlock(&c->map_mu);
	if (c->cmap->epoch == epoch)
		return;
	if (lost)
		emb_log(EMB_LOG_ERROR,
			"map epoch %llu: %u slot%s lost every copy; their "
			"calls fail",
			(unsigned long long)c->cmap->epoch, lost,
			lost == 1 ? "" : "s");
	else
		emb_log(EMB_LOG_WARN,
			"map epoch %llu: dead servers' slots are served by "
			"their backups",
			(unsigned long long)c->cmap->epoch);
}

/* Loop thread: fails the conns of every server declared dead. */
static void close_dead(void *arg)
{
	struct emb_client *c = arg;

	failover(c);
	for (uint32_t i = 0; i < c->nsrv; i++) {
		if (!srv_dead(&c->srv[i]))
			continue;
		fail_waiting(&c->srv[i], EMB_ENODEAD);
		if (c->srv[i].conn)
			emb_conn_close(c->srv[i].conn, EMB_ENODEAD);
	}
}

int emb__client_server_dead(struct emb_client *c, uint32_t server)
{
	if (server >= c->nsrv)
		return -EINVAL;
	__atomic_store_n(&c->srv[server].dead, true, __ATOMIC_RELAXED);
	return emb_transport_exec(c->tr, close_dead, c);
}

int emb__client_admin(struct emb_client *c, uint8_t opcode,
		      int (*fn)(void *arg, uint32_t server,
				const struct emb_wire_frame *f),
		      void *arg)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_async *op;
	int rc;

	lim.max_tables = 65536;
	op = broadcast(c, opcode, NULL, NULL, 0, &rc);
	if (!op)
		return rc;
	for (uint32_t s = 0; s < c->nsrv && !rc; s++) {
		struct emb_wire_frame f = part_frame(&op->parts[s], &lim);

		if (!op->parts[s].rep.skip)
			rc = fn(arg, s, &f);
	}
	admin_free(op);
	return rc;
}
