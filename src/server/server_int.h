/*
 * src/server/server_int.h - what the files of the server's request path
 * share: the server, its tables, its loops and its connections, and the
 * functions each file offers the others (emb__*). Not for use outside
 * src/server.
 *
 * Who calls whom (no file calls back into one that calls it; the two
 * upward paths go through function pointers held in struct emb_server):
 *
 *   server.c   create, stop, destroy, stats: every file below
 *   conn.c     loops, connections, dispatch -> handlers, reply, tables, dump
 *   sweeper.c  handshake and idle timeouts (a task posted to each loop)
 *   handlers.c one function per opcode -> reply, tables, dump, slots, sync
 *   reply.c    replies and the in-flight count -> tables (emb__cur_loop)
 *   tables.c   the table registry, per-loop caches, the reaper -> memreg,
 *              sync; dump.c, fill.c and checkpoint.c use it through the
 *              emb_server_table_* calls of tables.h
 *
 *   (replica.c, role.c, metrics.c and checkpoint.c use server.h and
 *   tables.h only, and nothing here calls them.)
 *
 *   s->sync_ack   tables.c hands it to each table's sync (it is reply.c's
 *                 emb__reply_sync_ack)
 *   s->conn_drain handlers.c calls it when a connection's last zero-copy
 *                 PULL reply is out (it is conn.c's emb__conn_drain)
 *
 * Threads: loop state (struct srv_loop, a conn's struct srv_conn) belongs
 * to its loop's thread; the registry is under tables_lock; counters that
 * other threads read are atomics, each noted where it is declared.
 */
#ifndef EMB_SERVER_SERVER_INT_H
#define EMB_SERVER_SERVER_INT_H

#include "server/server.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/authlimit.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

#include "server/sync.h"

struct emb_dump_sess;
struct emb_memreg;
struct emb_sessions;
struct emb__fill;
struct emb__rbuf_pool;
struct emb__slots;

struct srv_table {
	struct emb_server *s;	      /* owner */
	struct emb_table *t;	      /* owned; destroyed with the last ref */
	struct emb_memreg *memreg;    /* RDMA: its extents' regions; owned */
	struct srv_table *reap_next;  /* reaper queue */
	struct srv_table *all_next;   /* every table not yet freed */
	struct srv_table **all_pprev; /* link to this one in that list */
	struct emb_sync *sync;	      /* training mode; owned */
	struct emb_wire_spec spec;    /* as created */
	uint32_t id;		      /* >= 1 */
	uint32_t refs;		      /* registry + in-flight replies; atomic */
	uint64_t sized;	     /* map epoch of the last copy ahead its index
				was sized for (handlers.c); atomic */
	bool life_unclaimed; /* made by the server itself (a checkpoint keeps
				no policy) and no CREATE seen since: the
				first may give it one; tables_lock */
};

/* A table a loop's cache dropped while requests or replies still used it. */
struct orphan {
	struct srv_table *st; /* the cache's reference, put at pins 0 */
	uint32_t pins;	      /* users left */
	struct orphan *next;
};

/*
 * What a loop's requests touch besides their connection and table, kept
 * per loop so that loops write no shared cache line per request
 * (docs/architecture.md, "What loops share"). Written by the loop's
 * thread only; other threads read the counters with atomic loads.
 */
struct srv_loop {
	_Alignas(64) struct emb_server *s; /* owner */
	uint32_t index;			   /* in s->loops */
	int64_t requests;		   /* handled; atomic loads elsewhere */
	int64_t inflight;		   /* dispatched and not yet replied
					      here (a reply ended on another
					      thread counts in s->inflight) */
	uint64_t gen;			   /* s->tables_gen tabs reflects */
	struct srv_table **tabs;	   /* max_tables: the registry at
					      gen, a reference on each */
	struct srv_table **gone;	   /* max_tables: tables.c's loop_sync()
					      tables to put, its own (other
					      loops drop the same tables) */
	uint32_t *pins;			   /* max_tables: this loop's requests
					      and replies using tabs[i] */
	struct orphan *orphans;		   /* dropped from tabs while pinned */
	uint64_t lat_t0;		   /* the last request's start, ns */
	uint32_t lat_op;		   /* its enum emb_lat_op */
	bool lat_open;			   /* its latency waits for the next
					      clock read (loop_clock) */
	bool stop;			   /* leave the loop; atomic */
	struct emb_task sweep;		   /* posts emb__sweep_run() to the loop */
	bool sweep_queued;		   /* sweep posted, not yet run;
					      atomic */
};

/* The loop whose thread this is; NULL on any other thread. Set by
 * emb__loop_main() (conn.c), defined in tables.c, whose per-loop caches
 * read it first. */
extern _Thread_local struct srv_loop *emb__cur_loop;

/* A request held back to keep a connection's order (emb__conn_on_request). */
struct held {
	struct emb_req *req; /* still owned: replied when dispatched */
	struct held *next;   /* FIFO */
	uint64_t t0_ns;	     /* arrival, CLOCK_MONOTONIC */
};

struct srv_conn {
	struct emb_server *s;	/* owner */
	struct emb_conn *c;	/* NULL once closed */
	struct srv_conn *prev;	/* its loop's list of open conns */
	struct srv_conn *next;
	uint32_t loop;		/* index of its loop in s->loops */
	uint32_t zc_replies;	/* PULL replies still reading table memory */
	struct held *held;	/* oldest held request */
	struct held *held_tail; /* newest held request */
	uint64_t opened_ns;	/* accepted, emb_clock_ns() */
	uint64_t last_ns;	/* last request arrived, emb_clock_ns() */
	bool hello;		/* HELLO accepted */
	bool admin;		/* admin rights (admin token, or none set) */
	bool refused;		/* over max_conns: refuse its first request */
	struct emb_dump_sess *dump; /* open DUMP session (dump.c) */
	bool closing; /* auth failed or stream untrusted: close once the
		       * error is sent */
};

struct emb_server {
	struct emb_server_opts opts;	   /* host/transport point at copies */
	char *host;			   /* owned copy */
	char *transport;		   /* owned copy */
	char *tier_dir;			   /* owned copy, or NULL */
	uint8_t token[EMB_WIRE_TOKEN_MAX]; /* auth token */
	uint8_t admin_token[EMB_WIRE_TOKEN_MAX]; /* admin token */
	struct emb_buf_budget rx_budget;   /* receive memory of all conns */
	struct srv_conn **loop_conns;	   /* per loop: its open conns; only
					      that loop's thread touches it */
	pthread_t sweeper;		   /* posts timeout checks */
	bool sweeper_running;		   /* started and not joined */
	bool sweep_stop;		   /* guarded by reap_mu */
	pthread_cond_t sweep_cv;	   /* wakes the sweeper to stop */
	struct emb_transport **loops;	   /* opts.threads event loops */
	struct emb__rbuf_pool *rpools;	   /* per loop: its PULL reply
					      buffers (replybuf.h) */
	pthread_t *threads;		   /* one per loop */
	uint32_t nstarted;		   /* threads running */
	struct emb_listener *listener;	   /* on loops[0] */
	uint16_t port;			   /* bound port */
	uint64_t server_id;		   /* random per process */
	struct emb_sessions *sessions;	   /* pushes' at-most-once windows */
	struct emb__slots *slots;	   /* replicated: the map's view */
	struct emb__fill *fill;		   /* recovery: a fill streaming out */
	struct emb_authlimit *authlimit;   /* failed HELLOs per address */
	struct emb_mem_budget budget;	   /* shared by all tables */

	pthread_rwlock_t tables_lock; /* guards tables[], evict_hold and
					 lead */
	struct srv_table **tables;    /* limits.max_tables slots; id = i + 1 */
	uint64_t evict_hold[EMB_NSLOTS / 64]; /* emb_server_evict_hold():
						 every table's, new ones
						 too */
	uint64_t lead[EMB_NSLOTS / 64]; /* emb_server_lead(): the slots
					   this server is the primary of */
	uint64_t tables_gen;	      /* bumped on every change of tables[],
					 under tables_lock; atomic loads */
	struct srv_loop *lstate;      /* opts.threads: per-loop state */

	int64_t inflight;	      /* requests not yet replied, beyond
					 the loops' own counts; atomic */
	uint64_t conns_open;	      /* atomic */
	uint64_t conns_total;	      /* atomic */
	uint64_t requests;	      /* off the loops (lstate[] has the
					 rest); atomic */
	uint64_t errors;	      /* atomic */
	uint64_t conns_refused;	      /* over max_conns; atomic */
	uint64_t conns_timed_out;     /* handshake or idle; atomic */
	uint64_t nonfinite;	      /* PUSH/ASSIGN with NaN/Inf; atomic */
	uint64_t not_admin;	      /* admin ops refused; atomic */
	uint64_t birth_checks;	      /* a backup's check rounds
					 (bcheck.c); atomic */
	uint64_t births_pruned;	      /* rows those removed; atomic */
	struct emb_hist *lat;	      /* threads x EMB_LAT_NOPS latencies;
					 loop i alone writes row i */
	bool stopped;		      /* emb_server_stop() ran */
	bool loops_stopped;	      /* loop threads joined; atomic */
	bool rdma;		      /* loops serve RDMA: register tables */
	bool dual;		      /* and TCP too ("tcp,rdma") */
	pthread_t reaper;	      /* frees tables off the loop threads */
	bool reaper_running;	      /* reaper started and not joined */
	pthread_mutex_t reap_mu;      /* guards reap_head, reap_stop */
	pthread_cond_t reap_cv;	      /* work for the reaper */
	struct srv_table *reap_head;  /* tables to free */
	struct srv_table *all_tables; /* not yet freed, dropped or not;
					 guarded by reap_mu */
	bool reap_stop;		      /* reaper: exit once drained */

	emb_sync_ack_fn sync_ack;     /* each table's sync acks held pushes
					 with it: emb__reply_sync_ack */
	void (*conn_drain)(struct srv_conn *sc); /* a conn's last zero-copy
						    reply is out:
						    emb__conn_drain */
};


/* A counter other threads read: any thread adds. */
static inline void emb__count(uint64_t *c, int64_t n)
{
	__atomic_fetch_add(c, (uint64_t)n, __ATOMIC_RELAXED);
}

/* A loop's own counter: a plain read-modify-write, its thread the one
 * writer, other threads reading with atomic loads. */
static inline void emb__loop_count(int64_t *c, int64_t n)
{
	__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELEASE);
}

/* The loop of the calling thread, if it is one of s's loops. */
static inline struct srv_loop *emb__this_loop(const struct emb_server *s)
{
	struct srv_loop *l = emb__cur_loop;

	return l && l->s == s ? l : NULL;
}

/* ---- tables.c: the table registry ---- */

/* Any thread: a reference on table id (emb__tables_put() ends it), or
 * NULL if there is none. */
struct srv_table *emb__tables_get(struct emb_server *s, uint32_t id);
/* Ends a reference; the last one frees the table (on a loop thread of an
 * RDMA server, through the reaper). NULL is a no-op. */
void emb__tables_put(struct srv_table *st);
/*
 * Request path: table id for a request. On a loop thread it is the loop's
 * cached pointer, pinned by a counter of the loop's own (no lock, no shared
 * write); elsewhere a reference. NULL if there is none.
 */
struct srv_table *emb__tables_pin(struct emb_server *s, uint32_t id);
/*
 * A table whose policy l evicts numbers its rows (births: store.h) from
 * before its first row on every holder, so that its replicas can carry
 * out their primary's evictions (docs/replication.md, "Eviction with
 * replicas"); a tiered table cannot, and does not. 0 or -ENOMEM.
 */
int emb__tables_number(struct srv_table *st,
		       const struct emb_lifecycle_cfg *l);
/* Ends emb__tables_pin() on the thread that pinned. */
void emb__tables_unpin(struct srv_table *st);
/* Ends a pin taken on loop l (NULL: a reference) from l's thread, e.g. at
 * a reply's completion. NULL st is a no-op. */
void emb__tables_unpin_on(struct srv_loop *l, struct srv_table *st);
/*
 * Creates a table, or finds an identical one (then a policy the spec
 * carries may be adopted: admin is the caller's rights, own a table the
 * server makes itself, a checkpoint load). 0 and *id_out, or
 * EMB_ETABLEEXISTS, EMB_ETOOMANYTABLES, -ENOMEM and the errors of
 * emb_table_create().
 */
/* Which field of spec differs from its existing table's, and both values,
 * as a message into buf; -1 if no table of spec's name exists. Takes
 * tables_lock for reading. */
int emb__tables_spec_diff(struct emb_server *s,
			  const struct emb_wire_spec *spec, char *buf,
			  size_t cap);
int emb__tables_create(struct emb_server *s, const struct emb_wire_spec *spec,
		       uint32_t *id_out, bool admin, bool own);
/* Drops table id from the registry; its memory goes with its last use.
 * 0, or EMB_ENOTABLE. */
int emb__tables_drop(struct emb_server *s, uint32_t id);
/* Every table's id, spec and rows into info[0..cap); returns how many. */
uint32_t emb__tables_list(struct emb_server *s,
			  struct emb_wire_table_info *info, uint32_t cap);
/* The STATS counters of table want (0: of every table) into w[0..cap);
 * returns how many. */
uint32_t emb__tables_stats(struct emb_server *s, uint32_t want,
			   struct emb_wire_stats *w, uint32_t cap);
/* Tables in the registry now. */
uint64_t emb__tables_count(struct emb_server *s);
/* A closing conn's held synchronous pushes go, with their memory. */
void emb__tables_drop_conn(struct emb_server *s, struct emb_conn *c);
/* The reaper: frees tables a loop thread let go of (RDMA servers, whose
 * deregistration waits for every loop). 0, or a negative errno. */
int emb__tables_reaper_start(struct emb_server *s);
/* Lets the reaper drain its queue and joins it; no-op when not running.
 * The loops must still run. */
void emb__tables_reaper_stop(struct emb_server *s);
/*
 * Loops stopped, transports not yet destroyed: frees the tables left to
 * the reaper, deregisters every table's regions and acknowledges held
 * synchronous pushes, while the conns they name exist.
 */
void emb__tables_quiesce(struct emb_server *s);
/* Loop thread after the loop stopped, or at destroy: drops l's cache. */
void emb__tables_loop_fini(struct srv_loop *l);
/* Destroy: every loop's cache, then the registry's references. */
void emb__tables_fini(struct emb_server *s);

/* ---- reply.c: replies and the in-flight count ---- */

/* A request arrived, or a held one is counted again. */
void emb__req_begin(struct emb_server *s);
/* A request was replied to (or dropped): no longer in flight. */
void emb__req_end(struct emb_server *s);
/* Requests not yet replied, on every loop and off them. */
int64_t emb__inflight(struct emb_server *s);
/*
 * The reply pool of req's loop: requests run on their connection's loop
 * thread, the one pool user. NULL (plain malloc) for a request without a
 * server connection.
 */
struct emb__rbuf_pool *emb__reply_pool(struct emb_server *s,
				       const struct emb_req *req);
/* Sends the frame buf[0..len) (header included) and frees buf afterwards;
 * the request is no longer in flight. */
int emb__reply_frame(struct emb_server *s, struct emb_req *req, void *buf,
		     int len);
/* An error reply (msg NULL: emb_strerror's); always 0. */
int emb__reply_error(struct emb_server *s, struct emb_req *req, int status,
		     const char *msg);
/* A bare acknowledgement with table_id and count; always 0. */
int emb__reply_ack(struct emb_server *s, struct emb_req *req,
		   uint32_t table_id, uint32_t count);
/* Sends status (msg under 64 bytes), then closes the conn. */
void emb__reply_and_close(struct emb_server *s, struct emb_conn *c,
			  struct srv_conn *sc, struct emb_req *req, int status,
			  const char *msg);
/* emb_sync_ack_fn (arg is the server): acknowledges a held synchronous
 * push on its connection's loop thread. */
void emb__reply_sync_ack(void *arg, struct emb_req *req, int status);

/* ---- handlers.c: one function per opcode ---- */

/*
 * Handles request f on conn c (sc its state) once dispatch let it through
 * (logged in, rights checked): decodes, calls the store, replies or
 * releases req in every case. Loop thread of c. Returns 0.
 */
int emb__handle(struct emb_server *s, struct emb_conn *c, struct srv_conn *sc,
		struct emb_req *req, const struct emb_wire_frame *f);

/* ---- many.c ---- */

/* PULL_MANY (proto/wire_many.h), as emb__handle()'s handlers. Returns 0. */
int emb__on_pull_many(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_frame *f);
/* PUSH_MANY: each sub-request as emb__push_one(), answered in one reply. */
int emb__on_push_many(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_frame *f);

/* ---- handlers.c ---- */

/*
 * The PUSH f, as one request or a PUSH_MANY's sub-request (req NULL: it
 * cannot be held for a synchronous step). Returns 0 to acknowledge (applied,
 * discarded as stale, or a retry seen before), 1 when req is held until its
 * synchronous step is applied, or a negative code; msg (msg_len bytes) is
 * then the text to send with it, or "".
 */
int emb__push_one(struct emb_server *s, struct emb_req *req,
		  const struct emb_wire_frame *f, char *msg, size_t msg_len);

/* ---- conn.c: loops, connections, dispatch ---- */

/* The listener's callbacks; arg is the server. */
void emb__conn_on_request(void *arg, struct emb_conn *c, struct emb_req *req,
			  const struct emb_frame_hdr *hdr, void *payload);
void emb__conn_on_open(void *arg, struct emb_conn *c, int reason);
void emb__conn_on_close(void *arg, struct emb_conn *c, int reason);
/* Runs held requests in arrival order until one must wait again. Loop
 * thread of the conn only. */
void emb__conn_drain(struct srv_conn *sc);
/* A loop thread's body; arg is its struct srv_loop. */
void *emb__loop_main(void *arg);
/* Any thread: makes loop i's thread leave emb__loop_main(). */
void emb__loop_stop(struct emb_server *s, uint32_t i);

/* ---- sweeper.c: handshake and idle timeouts ---- */

/* Loop thread (the task l->sweep): closes the loop's conns that outstayed
 * a timeout; arg is the struct srv_loop. */
void emb__sweep_run(void *arg);
/* Starts the thread that posts emb__sweep_run to every loop a few times
 * per timeout. 0, or a negative errno. */
int emb__sweeper_start(struct emb_server *s);
/* Stops and joins it; no-op when not running. */
void emb__sweeper_stop(struct emb_server *s);

/* tables.c: removes the tier files in dir that no live table holds (a
 * process killed left them); 0, or -errno if dir is no writable
 * directory (logged). */
int emb__tier_dir_sweep(const char *dir);

#endif
