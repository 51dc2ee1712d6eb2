/*
 * src/server/server.c - request handling for embstore-server.
 *
 * Each connection belongs to one event loop thread (the transport spreads
 * them), and every request is handled to completion on that thread: decode,
 * one store call, reply. PULL replies are gathered straight from table
 * memory (emb_table_pull_ptrs + an iovec per run of rows), so no row is
 * copied on the server; the table stays referenced until the reply's done
 * callback, so a concurrent DROP_TABLE cannot free memory a reply still
 * names. The table registry is an array under a rwlock, written by create
 * and drop; each loop keeps a copy of it (struct srv_loop), refilled when
 * the registry's generation moved, so a request takes no lock and writes
 * nothing another loop reads (docs/architecture.md, "What loops share").
 *
 * Before its HELLO succeeds a connection may send frames of
 * EMB_SERVER_LOGIN_FRAME bytes at most and has handshake_timeout_ms to log
 * in; after it, idle_timeout_ms without a request closes it. A sweeper
 * thread posts a check to every loop a few times per timeout; each loop
 * walks its own connections, so no lock guards them.
 */
#include "server/server.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/authlimit.h"
#include "common/err.h"
#include "common/log.h"
#include "common/optim.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

#include "server/dump.h"
#include "server/lat.h"
#include "server/memreg.h"
#include "server/replybuf.h"
#include "server/session.h"
#include "server/fill.h"
#include "server/slots.h"
#include "server/sync.h"

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
	struct srv_table **gone;	   /* max_tables: loop_sync()'s
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
	struct emb_task sweep;		   /* posts sweep_run() to the loop */
	bool sweep_queued;		   /* sweep posted, not yet run;
					      atomic */
};

/* The loop whose thread this is; NULL on any other thread. */
static _Thread_local struct srv_loop *cur_loop;

/* A request held back to keep a connection's order (see on_request). */
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
	struct emb_dump_sess *dump; /* open DUMP session (server_dump.c) */
	bool closing; /* auth failed or stream untrusted: close once the
		       * error is sent */
};

struct emb_server {
	struct emb_server_opts opts;	   /* host/transport point at copies */
	char *host;			   /* owned copy */
	char *transport;		   /* owned copy */
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

	pthread_rwlock_t tables_lock; /* guards tables[] */
	struct srv_table **tables;    /* limits.max_tables slots; id = i + 1 */
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
};

/* Conns past max_conns kept to tell them why; beyond, they close at once. */
#define REFUSE_SLACK 64u

/* A row of zeros for ids missing under NOCREATE, wide enough for a whole
 * record (Adam: weights + 2 * dim + 1 state floats); read-only. */
static const float zero_row[3 * EMB_DIM_MAX + 1];

static void add(uint64_t *c, int64_t n)
{
	__atomic_fetch_add(c, (uint64_t)n, __ATOMIC_RELAXED);
}

/* ---- table registry ---- */

static struct srv_table *table_get(struct emb_server *s, uint32_t id)
{
	struct srv_table *st = NULL;

	if (id == 0 || id > s->opts.limits.max_tables)
		return NULL;
	pthread_rwlock_rdlock(&s->tables_lock);
	st = s->tables[id - 1];
	if (st)
		__atomic_fetch_add(&st->refs, 1, __ATOMIC_ACQ_REL);
	pthread_rwlock_unlock(&s->tables_lock);
	return st;
}

static void table_put(struct srv_table *st);

/*
 * Loop thread: refills l's cache from the registry after a create or a
 * drop (s->tables_gen moved). A table gone from a slot leaves its
 * reference to the last of this loop's users, if it has any left.
 */
static void loop_sync(struct srv_loop *l)
{
	struct emb_server *s = l->s;
	uint32_t ngone = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	l->gen = __atomic_load_n(&s->tables_gen, __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++) {
		struct srv_table *st = s->tables[i], *old = l->tabs[i];

		if (st == old)
			continue;
		if (st)
			__atomic_fetch_add(&st->refs, 1, __ATOMIC_ACQ_REL);
		l->tabs[i] = st;
		if (old && l->pins[i]) {
			struct orphan *o = malloc(sizeof(*o));

			/* Without memory the reference stays taken: a
			 * table leaked is better than one freed in use. */
			if (o) {
				o->st = old;
				o->pins = l->pins[i];
				o->next = l->orphans;
				l->orphans = o;
			}
		} else if (old) {
			/* Not chained through the table: every loop drops
			 * the same tables, each at its own time. */
			l->gone[ngone++] = old;
		}
		l->pins[i] = 0;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	/* Outside the lock: a last put may free the table. */
	for (uint32_t i = 0; i < ngone; i++)
		table_put(l->gone[i]);
}

/*
 * Request path: table id for a request on loop l (or, on any other
 * thread, l NULL, with a reference of its own). On the loop it is the
 * loop's cached pointer, pinned for the request by a counter of the
 * loop's own: no lock, no shared write. NULL if there is none.
 */
static struct srv_table *ltable_get(struct srv_loop *l, struct emb_server *s,
				    uint32_t id)
{
	struct srv_table *st;

	if (!l)
		return table_get(s, id);
	if (id == 0 || id > s->opts.limits.max_tables)
		return NULL;
	/* One load of a line written only by creates and drops. */
	if (__atomic_load_n(&s->tables_gen, __ATOMIC_ACQUIRE) != l->gen)
		loop_sync(l);
	st = l->tabs[id - 1];
	if (st)
		l->pins[id - 1]++;
	return st;
}

/* Ends a use of st that ltable_get(l, ...) began, on the same loop. */
static void ltable_put(struct srv_loop *l, struct srv_table *st)
{
	struct orphan **pp;

	if (!st)
		return;
	if (!l) {
		table_put(st);
		return;
	}
	if (l->tabs[st->id - 1] == st) {
		l->pins[st->id - 1]--;
		return;
	}
	for (pp = &l->orphans; *pp; pp = &(*pp)->next) {
		struct orphan *o = *pp;

		if (o->st != st)
			continue;
		if (--o->pins == 0) {
			*pp = o->next;
			free(o);
			table_put(st);
		}
		return;
	}
}

/* The loop of the calling thread, if it is one of s's loops. */
static struct srv_loop *this_loop(const struct emb_server *s)
{
	struct srv_loop *l = cur_loop;

	return l && l->s == s ? l : NULL;
}

static struct srv_table *rtable_get(struct emb_server *s, uint32_t id)
{
	return ltable_get(this_loop(s), s, id);
}

static void rtable_put(struct srv_table *st)
{
	ltable_put(this_loop(st->s), st);
}

/* Loop thread, after the loop stopped or at destroy: drops l's cache. */
static void loop_fini(struct srv_loop *l)
{
	for (uint32_t i = 0; l->tabs && i < l->s->opts.limits.max_tables; i++)
		table_put(l->tabs[i]);
	while (l->orphans) {
		struct orphan *o = l->orphans;

		l->orphans = o->next;
		table_put(o->st);
		free(o);
	}
	free(l->tabs);
	free(l->pins);
	free(l->gone);
	l->tabs = NULL;
	l->pins = NULL;
	l->gone = NULL;
}

/* Task: a loop with no request to prompt it lets go of dropped tables. */
static void loop_sync_task(void *arg)
{
	struct srv_loop *l = arg;

	if (l->gen != __atomic_load_n(&l->s->tables_gen, __ATOMIC_ACQUIRE))
		loop_sync(l);
}

static void table_free(struct srv_table *st)
{
	pthread_mutex_lock(&st->s->reap_mu);
	*st->all_pprev = st->all_next;
	if (st->all_next)
		st->all_next->all_pprev = st->all_pprev;
	pthread_mutex_unlock(&st->s->reap_mu);
	emb_log(EMB_LOG_INFO, "table %s (id %u) freed", st->spec.name, st->id);
	emb__sync_destroy(st->sync);
	emb_table_destroy(st->t);
	emb__memreg_destroy(st->memreg);
	free(st);
}

static void table_put(struct srv_table *st)
{
	struct emb_server *s;

	if (!st || __atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	s = st->s;
	/* Deregistering RDMA regions waits for every loop, which a loop
	 * thread must not do: the reaper frees the table instead. */
	if (st->memreg && emb__memreg_on_loop()) {
		/* Without a reaper (stopping), emb_server_destroy() frees
		 * it once the loops are gone. */
		pthread_mutex_lock(&s->reap_mu);
		st->reap_next = s->reap_head;
		s->reap_head = st;
		pthread_cond_signal(&s->reap_cv);
		pthread_mutex_unlock(&s->reap_mu);
		return;
	}
	table_free(st);
}

static void *reaper_main(void *arg)
{
	struct emb_server *s = arg;

	pthread_mutex_lock(&s->reap_mu);
	for (;;) {
		struct srv_table *st = s->reap_head;

		if (st) {
			s->reap_head = st->reap_next;
			pthread_mutex_unlock(&s->reap_mu);
			table_free(st);
			pthread_mutex_lock(&s->reap_mu);
			continue;
		}
		if (s->reap_stop)
			break;
		pthread_cond_wait(&s->reap_cv, &s->reap_mu);
	}
	pthread_mutex_unlock(&s->reap_mu);
	return NULL;
}

static bool same_spec(const struct emb_wire_spec *a,
		      const struct emb_wire_spec *b)
{
	return a->dim == b->dim && a->seed == b->seed &&
	       memcmp(&a->optim, &b->optim, sizeof(a->optim)) == 0 &&
	       memcmp(&a->init, &b->init, sizeof(a->init)) == 0;
}

/*
 * A CREATE of an existing table: a policy it carries is set only if the
 * table has none and either the client has admin rights or the table is
 * one the server made from a checkpoint (which keeps no policy) that no
 * CREATE has claimed yet, so a restarted server gets its policy back from
 * the first worker. Otherwise changing a policy stays SET_LIFECYCLE's,
 * which needs admin rights: a training client cannot, say, put max_rows:1
 * on a live table. Caller holds tables_lock for writing.
 */
static int adopt_lifecycle(struct srv_table *st,
			   const struct emb_wire_spec *spec, bool admin)
{
	struct emb_table_opts o;
	char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];
	bool unclaimed = st->life_unclaimed;
	int rc;

	st->life_unclaimed = false;
	if (emb_lifecycle_is_off(&spec->life) || (!admin && !unclaimed))
		return 0;
	emb_table_get_opts(st->t, &o);
	if (!emb_lifecycle_is_off(&o.life))
		return 0;
	rc = emb_table_set_lifecycle(st->t, &spec->life);
	if (rc)
		return rc;
	emb_admit_format(&spec->life, a, sizeof(a));
	emb_evict_format(&spec->life, e, sizeof(e));
	emb_log(EMB_LOG_INFO, "table %s: admit %s, evict %s (from a CREATE)",
		spec->name, a, e);
	return 0;
}

/* Creates a table, or returns the id of an identical one. */
static void sync_ack(void *arg, struct emb_req *req, int status);

/*
 * admin: the caller's rights (adopt_lifecycle); own: the server makes the
 * table itself (a checkpoint load), so a CREATE may still give it a policy.
 */
static int table_create(struct emb_server *s, const struct emb_wire_spec *spec,
			uint32_t *id_out, bool admin, bool own)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;
	struct srv_table *st;
	uint32_t i, free_slot = UINT32_MAX;
	int rc;

	pthread_rwlock_wrlock(&s->tables_lock);
	for (i = 0; i < s->opts.limits.max_tables; i++) {
		st = s->tables[i];
		if (!st) {
			if (free_slot == UINT32_MAX)
				free_slot = i;
			continue;
		}
		if (strcmp(st->spec.name, spec->name) == 0) {
			rc = same_spec(&st->spec, spec) ? 0 : EMB_ETABLEEXISTS;
			if (!rc)
				rc = adopt_lifecycle(st, spec, admin);
			*id_out = st->id;
			goto out_unlock;
		}
	}
	if (free_slot == UINT32_MAX) {
		rc = EMB_ETOOMANYTABLES;
		goto out_unlock;
	}
	st = calloc(1, sizeof(*st));
	if (!st) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	o.name = spec->name;
	o.dim = spec->dim;
	o.optim = spec->optim;
	o.init = spec->init;
	o.seed = spec->seed;
	o.nshards = s->opts.table_shards;
	o.budget = &s->budget;
	o.life = spec->life;
	o.remote_read = s->opts.remote_read;
	rc = emb_table_create(&o, &st->t);
	if (rc) {
		free(st);
		goto out_unlock;
	}
	st->s = s;
	st->life_unclaimed = own && emb_lifecycle_is_off(&spec->life);
	if (s->rdma) {
		rc = emb__memreg_create(s->loops, s->opts.threads,
					&s->loops_stopped, &st->memreg);
		if (!rc)
			rc = emb_table_set_extent_hook(st->t, emb__memreg_hook,
						       st->memreg);
		if (rc) {
			emb_table_destroy(st->t);
			emb__memreg_destroy(st->memreg);
			free(st);
			goto out_unlock;
		}
	}
	rc = emb__sync_create(spec->dim, &s->budget, sync_ack, s, &st->sync);
	if (rc) {
		emb_table_destroy(st->t);
		emb__memreg_destroy(st->memreg);
		free(st);
		goto out_unlock;
	}
	st->spec = *spec;
	st->id = free_slot + 1;
	st->refs = 1;
	pthread_mutex_lock(&s->reap_mu);
	st->all_next = s->all_tables;
	if (st->all_next)
		st->all_next->all_pprev = &st->all_next;
	st->all_pprev = &s->all_tables;
	s->all_tables = st;
	pthread_mutex_unlock(&s->reap_mu);
	s->tables[free_slot] = st;
	__atomic_add_fetch(&s->tables_gen, 1, __ATOMIC_RELEASE);
	*id_out = st->id;
	{
		char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];

		emb_admit_format(&spec->life, a, sizeof(a));
		emb_evict_format(&spec->life, e, sizeof(e));
		emb_log(EMB_LOG_INFO,
			"table %s (id %u) created: dim %u, %s, %s, admit %s, "
			"evict %s",
			spec->name, st->id, spec->dim,
			emb_optim_name(spec->optim.kind),
			emb_init_name(spec->init.kind), a, e);
	}
out_unlock:
	pthread_rwlock_unlock(&s->tables_lock);
	return rc;
}

static int table_drop(struct emb_server *s, uint32_t id)
{
	struct srv_table *st = NULL;

	if (id == 0 || id > s->opts.limits.max_tables)
		return EMB_ENOTABLE;
	pthread_rwlock_wrlock(&s->tables_lock);
	st = s->tables[id - 1];
	s->tables[id - 1] = NULL;
	if (st)
		__atomic_add_fetch(&s->tables_gen, 1, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&s->tables_lock);
	if (!st)
		return EMB_ENOTABLE;
	emb_log(EMB_LOG_INFO, "table %s (id %u) dropped", st->spec.name, id);
	/* Its memory lives on until the last request on it ends; a client
	 * that READs it meanwhile must not see rows of a dropped table. */
	emb_table_unseal_all(st->t);
	table_put(st);
	/* Every loop's cache holds a reference: loops that see no request
	 * soon let go of it through a task. Without one (no memory, or
	 * stopping) the reference goes at their next request or destroy. */
	for (uint32_t i = 0; i < s->nstarted; i++)
		if (&s->lstate[i] != this_loop(s))
			(void)emb_transport_exec(s->loops[i], loop_sync_task,
						 &s->lstate[i]);
	if (this_loop(s))
		loop_sync(this_loop(s));
	return 0;
}

/* Tables for in-process users: dump sessions, checkpoints. */

uint32_t emb_server_table_ids(struct emb_server *s, uint32_t *ids, uint32_t cap)
{
	uint32_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++) {
		if (!s->tables[i])
			continue;
		if (n < cap)
			ids[n] = s->tables[i]->id;
		n++;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	return n;
}

int emb_server_table_acquire(struct emb_server *s, uint32_t id,
			     struct emb_server_table *out)
{
	struct srv_table *st = table_get(s, id);

	if (!st)
		return EMB_ENOTABLE;
	out->t = st->t;
	out->spec = st->spec;
	out->id = st->id;
	out->ref = st;
	return 0;
}

void emb_server_table_release(struct emb_server_table *st)
{
	if (st && st->ref) {
		table_put(st->ref);
		st->ref = NULL;
	}
}

int emb_server_table_create(struct emb_server *s,
			    const struct emb_wire_spec *spec, uint32_t *id)
{
	return table_create(s, spec, id, true, true);
}

/* ---- replies ---- */

/* A reply whose frame sits whole in one malloc'd buffer. */
static void free_done(void *ctx, int status)
{
	(void)status;
	free(ctx);
}

/* An error reply after which the conn closes: auth failures, bad opcodes. */
struct close_ctx {
	struct emb_conn *c; /* closed once the reply is out */
	int reason;	    /* the reply's status, the close reason */
	_Alignas(8) uint8_t frame[EMB_WIRE_HDR_SIZE + 64]; /* the reply */
};

/* A reply whose frame sits in a buffer of its loop's pool. */
static void rbuf_done(void *ctx, int status)
{
	(void)status;
	emb__rbuf_put(ctx);
}

/*
 * The reply pool of req's loop: requests run on their connection's loop
 * thread, the one pool user. NULL (plain malloc) for a request without a
 * server connection.
 */
static struct emb__rbuf_pool *pool_of(struct emb_server *s,
				      const struct emb_req *req)
{
	struct srv_conn *sc = emb_conn_user(emb_req_conn(req));

	return sc ? &s->rpools[sc->loop] : NULL;
}

static void close_done(void *ctx, int status)
{
	struct close_ctx *cc = ctx;

	/* status != 0: the conn already closed and may be gone. */
	if (status == 0)
		emb_conn_close(cc->c, cc->reason);
	free(cc);
}

/* A plain read-modify-write: the loop's thread is its one writer. */
static void loop_add(int64_t *c, int64_t n)
{
	__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELEASE);
}

/* A request was replied to (or dropped): no longer in flight. */
static void finish(struct emb_server *s)
{
	struct srv_loop *l = this_loop(s);

	if (l)
		loop_add(&l->inflight, -1);
	else
		__atomic_fetch_sub(&s->inflight, 1, __ATOMIC_RELEASE);
}

/* A request arrived, or a held one is counted again. */
static void start(struct emb_server *s)
{
	struct srv_loop *l = this_loop(s);

	if (l)
		loop_add(&l->inflight, 1);
	else
		__atomic_fetch_add(&s->inflight, 1, __ATOMIC_ACQUIRE);
}

/* Requests not yet replied, on every loop and off them. */
static int64_t inflight(struct emb_server *s)
{
	int64_t n = __atomic_load_n(&s->inflight, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < s->opts.threads; i++)
		n += __atomic_load_n(&s->lstate[i].inflight, __ATOMIC_ACQUIRE);
	return n;
}

/* Sends the frame buf[0..len) (header included) and frees buf afterwards. */
static int reply_frame(struct emb_server *s, struct emb_req *req, void *buf,
		       int len)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int rc;

	memcpy(&hdr, buf, sizeof(hdr));
	iov.iov_base = (char *)buf + EMB_WIRE_HDR_SIZE;
	iov.iov_len = (size_t)len - EMB_WIRE_HDR_SIZE;
	rc = emb_conn_reply(req, &hdr, &iov, iov.iov_len ? 1 : 0, free_done,
			    buf);
	if (rc)
		free(buf);
	finish(s);
	return rc;
}

/*
 * An error frame echoing the request's opcode. The encoder takes known
 * request opcodes only, but a peer may send a response opcode or a number
 * that is no opcode and still deserves its answer: encode as PING, then put
 * the peer's opcode (frame offset 5) back.
 */
static int encode_error(void *buf, size_t cap, const struct emb_frame_hdr *rq,
			uint32_t table_id, int status, const char *msg)
{
	int len = emb_wire_error_encode(buf, cap, EMB_OP_PING, rq->req_id,
					table_id, status, msg);

	if (len > 0)
		((uint8_t *)buf)[5] =
		    (uint8_t)(rq->opcode | EMB_OP_RESPONSE_BIT);
	return len;
}

static int reply_error(struct emb_server *s, struct emb_req *req, int status,
		       const char *msg)
{
	size_t cap = EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX;
	void *buf = malloc(cap);
	int len;

	add(&s->errors, 1);
	if (!buf) {
		emb_req_release(req);
		finish(s);
		return 0;
	}
	len = encode_error(buf, cap, &req->hdr, req->hdr.table_id, status,
			   msg ? msg : emb_strerror(status));
	if (len < 0) {
		free(buf);
		emb_req_release(req);
		finish(s);
		return 0;
	}
	reply_frame(s, req, buf, len);
	return 0;
}

static int reply_ack(struct emb_server *s, struct emb_req *req,
		     uint32_t table_id, uint32_t count)
{
	struct emb_frame_hdr hdr = {
	    .opcode = (uint8_t)(req->hdr.opcode | EMB_OP_RESPONSE_BIT),
	    .table_id = table_id,
	    .count = count,
	};

	emb_conn_reply(req, &hdr, NULL, 0, NULL, NULL);
	finish(s);
	return 0;
}

/* A held synchronous push, acknowledged on its connection's loop thread. */
struct ack_task {
	struct emb_server *s; /* owner */
	struct emb_req *req;  /* the STEP_END part */
	int status;	      /* 0: step applied */
};

static void ack_task_run(void *arg)
{
	struct ack_task *a = arg;

	if (a->status)
		reply_error(a->s, a->req, a->status,
			    "synchronous step not applied");
	else
		reply_ack(a->s, a->req, a->req->hdr.table_id, 0);
	free(a);
}

static void sync_ack(void *arg, struct emb_req *req, int status)
{
	struct emb_server *s = arg;
	struct ack_task *a;

	/* After the loops stopped, this thread owns every conn. */
	if (__atomic_load_n(&s->loops_stopped, __ATOMIC_ACQUIRE)) {
		emb_req_release(req);
		finish(s);
		return;
	}
	a = malloc(sizeof(*a));
	if (a) {
		a->s = s;
		a->req = req;
		a->status = status;
		if (emb_transport_exec(emb_conn_loop(req->conn), ack_task_run,
				       a) == 0)
			return;
		free(a);
	}
	/* Cannot reach the loop: the client's call times out instead. */
	emb_log(EMB_LOG_ERROR, "%s: cannot acknowledge a synchronous push",
		emb_conn_peer(req->conn));
}

/* Sends status (msg under 64 bytes), then closes the conn. */
static void reply_and_close(struct emb_server *s, struct emb_conn *c,
			    struct srv_conn *sc, struct emb_req *req,
			    int status, const char *msg)
{
	struct close_ctx *cc = malloc(sizeof(*cc));
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len;

	add(&s->errors, 1);
	sc->closing = true;
	len = cc ? encode_error(cc->frame, sizeof(cc->frame), &req->hdr, 0,
				status, msg)
		 : -ENOMEM;
	if (len < 0) {
		free(cc);
		emb_req_release(req);
		finish(s);
		emb_conn_close(c, status);
		return;
	}
	cc->c = c;
	cc->reason = status;
	memcpy(&hdr, cc->frame, sizeof(hdr));
	iov.iov_base = cc->frame + EMB_WIRE_HDR_SIZE;
	iov.iov_len = (size_t)len - EMB_WIRE_HDR_SIZE;
	if (emb_conn_reply(req, &hdr, &iov, 1, close_done, cc)) {
		free(cc);
		emb_conn_close(c, status);
	}
	finish(s);
}

/* ---- handlers ---- */

/*
 * Constant time over the configured token, whatever the client sent, so
 * timing reveals no prefix.
 */
static bool token_ok(const uint8_t *want, uint32_t want_len,
		     const uint8_t *got, uint32_t got_len)
{
	unsigned char diff = (unsigned char)(got_len != want_len);

	for (uint32_t i = 0; i < want_len; i++)
		diff |= (unsigned char)(want[i] ^ (i < got_len ? got[i] : 0));
	return diff == 0;
}

static int on_hello(struct emb_server *s, struct emb_conn *c,
		    struct srv_conn *sc, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	struct emb_wire_hello_req h;
	struct emb_wire_hello_resp r = {0};
	bool ok, admin;
	void *buf;
	int len, rc;

	rc = emb_wire_hello_req_decode(f, &h);
	if (rc)
		return reply_error(s, req, rc, NULL);
	/* Guessing is slow: after a few failures from an address, no token
	 * of its is compared until its wait is over. */
	if ((s->opts.auth_token_len || s->opts.admin_token_len) &&
	    emb_authlimit_wait_ms(s->authlimit, emb_conn_peer(c))) {
		reply_and_close(s, c, sc, req, EMB_EAUTH,
				"too many failed attempts: wait");
		return 0;
	}
	/* The admin token grants everything; without one configured every
	 * client that logs in has admin rights (one level of trust). */
	if (h.admin && s->opts.admin_token_len) {
		ok = token_ok(s->admin_token, s->opts.admin_token_len,
			      h.token, h.token_len);
		admin = ok;
	} else {
		ok = !s->opts.auth_token_len ||
		     token_ok(s->token, s->opts.auth_token_len, h.token,
			      h.token_len);
		admin = ok && !s->opts.admin_token_len;
	}
	if (!ok) {
		emb_log(EMB_LOG_WARN, "%s: %sauthentication failed",
			emb_conn_peer(c), h.admin ? "admin " : "");
		emb_authlimit_fail(s->authlimit, emb_conn_peer(c));
		reply_and_close(s, c, sc, req, EMB_EAUTH,
				h.admin ? "admin authentication failed"
					: "authentication failed");
		return 0;
	}
	if (s->opts.auth_token_len || s->opts.admin_token_len)
		emb_authlimit_ok(s->authlimit, emb_conn_peer(c));
	sc->hello = true;
	sc->admin = admin;
	/* Proved who it is: its frames may now be as large as the limit. */
	emb_conn_admit(c);
	r.server_version = EMB_WIRE_VERSION;
	r.limits = s->opts.limits;
	r.server_id = s->server_id;
	r.features = EMB_WIRE_FEAT_PUSH_SESSION;
	/* A client that came over TCP learns it may move to RDMA, at this
	 * host and port number (docs/protocol.md, HELLO). */
	if (s->rdma)
		r.features |= EMB_WIRE_FEAT_RDMA;
	buf = malloc(EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE);
	if (!buf) {
		emb_req_release(req);
		finish(s);
		return 0;
	}
	len = emb_wire_hello_resp_encode(
	    buf, EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE, req->hdr.req_id,
	    &r);
	if (len < 0) {
		free(buf);
		return reply_error(s, req, len, NULL);
	}
	if (h.name_len)
		emb_log(EMB_LOG_DEBUG, "%s: hello from %.*s", emb_conn_peer(c),
			(int)h.name_len, h.name);
	reply_frame(s, req, buf, len);
	return 0;
}

static int on_create(struct emb_server *s, struct srv_conn *sc,
		     struct emb_req *req, const struct emb_wire_frame *f)
{
	struct emb_wire_spec spec;
	uint32_t id = 0;
	int rc;

	rc = emb_wire_create_req_decode(f, &spec);
	if (!rc)
		rc = table_create(s, &spec, &id, sc->admin, false);
	if (rc == EMB_ETABLEEXISTS)
		return reply_error(s, req, rc,
				   "a table of that name exists with another "
				   "dim, optimizer, initializer or seed");
	if (rc)
		return reply_error(s, req, rc, NULL);
	reply_ack(s, req, id, 0);
	return 0;
}

static int on_list(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_table_info *info;
	uint32_t n = 0, max = s->opts.limits.max_tables;
	size_t cap;
	void *buf;
	int len, rc;

	rc = emb_wire_empty_req_decode(f, EMB_OP_LIST_TABLES);
	if (rc)
		return reply_error(s, req, rc, NULL);
	info = calloc(max, sizeof(*info));
	cap = EMB_WIRE_HDR_SIZE + (size_t)max * EMB_WIRE_LIST_ENTRY_SIZE;
	buf = malloc(cap);
	if (!info || !buf) {
		free(info);
		free(buf);
		return reply_error(s, req, -ENOMEM, NULL);
	}
	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < max; i++) {
		struct srv_table *st = s->tables[i];
		struct emb_table_stats ts;

		if (!st)
			continue;
		emb_table_stats(st->t, &ts);
		info[n].table_id = st->id;
		info[n].spec = st->spec;
		info[n].rows = ts.rows;
		n++;
	}
	pthread_rwlock_unlock(&s->tables_lock);
	len = emb_wire_list_resp_encode(buf, cap, req->hdr.req_id, info, n);
	free(info);
	if (len < 0) {
		free(buf);
		return reply_error(s, req, len, NULL);
	}
	reply_frame(s, req, buf, len);
	return 0;
}

static void fill_stats(const struct srv_table *st, struct emb_wire_stats *w)
{
	struct emb_table_stats ts;

	emb_table_stats(st->t, &ts);
	w->table_id = st->id;
#define COPY(name, what) w->name = ts.name;
	EMB_TABLE_STATS(COPY)
#undef COPY
	w->grads_discarded = emb__sync_discarded(st->sync);
}

static int on_stats(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	uint32_t max = s->opts.limits.max_tables, n = 0;
	uint32_t want = f->hdr.table_id;
	struct emb_wire_stats *w;
	size_t cap;
	void *buf;
	int len, rc;

	rc = emb_wire_empty_req_decode(f, EMB_OP_STATS);
	if (rc)
		return reply_error(s, req, rc, NULL);
	w = calloc(max, sizeof(*w));
	cap = EMB_WIRE_HDR_SIZE + EMB_WIRE_STATS_PREFIX_SIZE +
	      (size_t)max * (8 + 8 * EMB_WIRE_STATS_FIELDS);
	buf = malloc(cap);
	if (!w || !buf) {
		free(w);
		free(buf);
		return reply_error(s, req, -ENOMEM, NULL);
	}
	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < max; i++) {
		struct srv_table *st = s->tables[i];

		if (st && (!want || want == st->id))
			fill_stats(st, &w[n++]);
	}
	pthread_rwlock_unlock(&s->tables_lock);
	if (want && !n) {
		free(w);
		free(buf);
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	}
	len = emb_wire_stats_resp_encode(buf, cap, req->hdr.req_id, want, w, n);
	free(w);
	if (len < 0) {
		free(buf);
		return reply_error(s, req, len, NULL);
	}
	reply_frame(s, req, buf, len);
	return 0;
}

static int on_ping(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_blob b;
	struct emb_frame_hdr hdr = {0};
	struct iovec iov;
	int rc;

	rc = emb_wire_ping_decode(f, false, &b);
	if (rc)
		return reply_error(s, req, rc, NULL);
	hdr.opcode = EMB_OP_PING | EMB_OP_RESPONSE_BIT;
	/* The echo borrows the request payload, which stays valid until the
	 * reply completes. */
	iov.iov_base = (void *)b.data;
	iov.iov_len = b.len;
	emb_conn_reply(req, &hdr, &iov, b.len ? 1 : 0, NULL, NULL);
	finish(s);
	return 0;
}

/* State of one PULL reply while its rows are on the wire. */
struct pull_ctx {
	struct emb_server *s; /* for the in-flight count */
	struct srv_conn *sc;  /* its connection; kept alive until done */
	struct srv_table *st; /* in use until done */
	struct srv_loop *l;   /* st's loop (ltable_get), or NULL */
	const float **ptrs;   /* n row pointers into table memory */
	float *fresh;	      /* rows of ids not admitted yet, or NULL */
	struct iovec *iov;    /* n + 2 entries */
	uint8_t *bits;	      /* found bitmap (NOCREATE) */
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE]; /* unused header slot */
};

static void conn_drain(struct srv_conn *sc);

static void pull_done(void *ctx, int status)
{
	struct pull_ctx *pc = ctx;
	struct srv_conn *sc = pc->sc;

	(void)status;
	ltable_put(pc->l, pc->st);
	free(pc->fresh);
	emb__rbuf_put(pc);
	if (sc && --sc->zc_replies == 0) {
		if (!sc->c)
			free(sc); /* closed while this reply was out */
		else
			conn_drain(sc);
	}
}

/*
 * PULL over a stream transport: copy the rows (prefetched, under the shard
 * locks, so never torn) into one buffer and send it whole. Measured against
 * one iovec per row straight from table memory, this is the faster way to
 * get scattered 256-byte rows into a TCP socket (docs/benchmarks.md); RDMA
 * keeps the zero-copy path, where the NIC does the gathering.
 */
static int pull_copy(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_pull_req *p, struct srv_table *st)
{
	const uint32_t dim = st->spec.dim;
	const size_t bitmap = p->nocreate ? emb_wire_bitmap_bytes(p->n) : 0;
	const size_t rows = (size_t)p->n * dim * sizeof(float);
	struct emb_frame_hdr hdr = {0};
	struct iovec iov;
	uint8_t *buf, *found;
	int rc;

	/* From the loop's pool: a PULL allocates nothing once warm. */
	buf = emb__rbuf_get(pool_of(s, req),
			    bitmap + rows + (p->nocreate ? p->n : 0) + 1);
	if (!buf) {
		rtable_put(st);
		return reply_error(s, req, -ENOMEM, NULL);
	}
	found = p->nocreate ? buf + bitmap + rows : NULL;
	rc =
	    emb_table_pull(st->t, p->ids, p->n, (float *)(void *)(buf + bitmap),
			   p->nocreate ? EMB_PULL_NOCREATE : 0, found);
	rtable_put(st);
	if (rc < 0) {
		emb__rbuf_put(buf);
		return reply_error(s, req, rc, NULL);
	}
	if (found)
		emb_wire_found_pack(found, p->n, buf);
	hdr.opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	hdr.flags = p->nocreate ? EMB_F_NOCREATE : 0;
	hdr.table_id = p->table_id;
	hdr.count = p->n;
	iov.iov_base = buf;
	iov.iov_len = bitmap + rows;
	if (emb_conn_reply(req, &hdr, &iov, iov.iov_len ? 1 : 0, rbuf_done,
			   buf))
		emb__rbuf_put(buf);
	finish(s);
	return 0;
}

/*
 * A reply over the frame limit could never be sent, and the client would
 * wait for it until its deadline: answer EMB_ETOOBIG before any row is
 * made instead. False when it fits; true when the error was replied.
 * Clients split batches by the max_frame_bytes of HELLO, so only a raw
 * peer gets here.
 */
static bool reply_fails(struct emb_server *s, struct emb_req *req,
		      const struct emb_wire_pull_req *p, struct srv_table *st)
{
	uint64_t stride = p->with_state ? emb_table_row_floats(st->t)
					: st->spec.dim;
	uint64_t bytes = EMB_WIRE_HDR_SIZE +
			 (p->nocreate ? emb_wire_bitmap_bytes(p->n) : 0) +
			 (uint64_t)p->n * stride * sizeof(float);
	char msg[160];

	if (bytes <= s->opts.limits.max_frame_bytes)
		return false;
	snprintf(msg, sizeof(msg),
		 "reply of %llu bytes over the frame limit of %u; pull at "
		 "most %llu ids of this table at once",
		 (unsigned long long)bytes, s->opts.limits.max_frame_bytes,
		 (unsigned long long)((s->opts.limits.max_frame_bytes -
				       EMB_WIRE_HDR_SIZE) /
				      (stride * sizeof(float) + 1)));
	reply_error(s, req, EMB_ETOOBIG, msg);
	return true;
}

/* Points each NULL of pc->ptrs at the initial row of its id, in one
 * buffer pc owns. 0 or -ENOMEM. */
static int fill_fresh(struct pull_ctx *pc, const struct emb_wire_pull_req *p,
		      uint32_t stride)
{
	uint32_t k = 0, nnull = 0;

	for (uint32_t i = 0; i < p->n; i++)
		nnull += !pc->ptrs[i];
	if (!nnull)
		return 0;
	pc->fresh = malloc((size_t)nnull * stride * sizeof(float));
	if (!pc->fresh)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->n; i++) {
		float *row;

		if (pc->ptrs[i])
			continue;
		row = pc->fresh + (size_t)k++ * stride;
		emb_table_init_row(pc->st->t, p->ids[i], row, p->with_state);
		pc->ptrs[i] = row;
	}
	return 0;
}

/*
 * Rows straight from table memory, or copied? A server with both
 * transports copies for its TCP conns whatever zero_copy_pulls says, as a
 * TCP-only server does by default: a TCP reply is gathered by sendmsg long
 * after the shard lock is gone, and TCP rows are never torn.
 */
static bool zero_copy(const struct emb_server *s, const struct emb_req *req)
{
	if (!s->opts.zero_copy_pulls)
		return false;
	return !s->dual ||
	       strcmp(emb_conn_transport(emb_req_conn(req)), "rdma") == 0;
}

static int on_pull(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_pull_req p;
	struct emb_frame_hdr hdr = {0};
	struct srv_table *st;
	struct pull_ctx *pc;
	uint32_t stride;
	uint16_t wflags;
	size_t bitmap;
	char *mem;
	int rc, niov;

	rc = emb_wire_pull_req_decode(f, &p);
	if (rc)
		return reply_error(s, req, rc, NULL);
	st = rtable_get(s, p.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	if (reply_fails(s, req, &p, st)) {
		rtable_put(st);
		return 0;
	}
	/* Whole rows (weights + optimizer state) always go zero-copy: the
	 * store's copying pull gives weights only. */
	if (!zero_copy(s, req) && !p.with_state)
		return pull_copy(s, req, &p, st);
	stride = p.with_state ? emb_table_row_floats(st->t) : st->spec.dim;
	wflags = (p.nocreate ? EMB_F_NOCREATE : 0) |
		 (p.with_state ? EMB_F_WITH_STATE : 0);
	bitmap = p.nocreate ? emb_wire_bitmap_bytes(p.n) : 0;
	mem = emb__rbuf_get(pool_of(s, req),
			    sizeof(*pc) + (size_t)p.n * sizeof(float *) +
				((size_t)p.n + 2) * sizeof(struct iovec) +
				bitmap + p.n);
	if (!mem) {
		rtable_put(st);
		return reply_error(s, req, -ENOMEM, NULL);
	}
	pc = (struct pull_ctx *)(void *)mem;
	pc->s = s;
	pc->sc = NULL;
	pc->st = st;
	pc->l = this_loop(s);
	pc->fresh = NULL;
	pc->ptrs = (const float **)(void *)(mem + sizeof(*pc));
	pc->iov = (struct iovec *)(void *)(pc->ptrs + p.n);
	pc->bits = (uint8_t *)(pc->iov + p.n + 2);

	rc = emb_table_pull_ptrs(st->t, p.ids, p.n, pc->ptrs,
				 p.nocreate ? EMB_PULL_NOCREATE : 0);
	if (rc < 0) {
		pull_done(pc, 0);
		return reply_error(s, req, rc, NULL);
	}
	/* Without NOCREATE a NULL is an id not admitted yet (admission):
	 * it gets the row it would be created with, from a buffer of ours. */
	if (!p.nocreate && rc > 0) {
		rc = fill_fresh(pc, &p, stride);
		if (rc) {
			pull_done(pc, 0);
			return reply_error(s, req, rc, NULL);
		}
	}
	if (p.nocreate) {
		uint8_t *found = pc->bits + bitmap;

		for (uint32_t i = 0; i < p.n; i++)
			found[i] = pc->ptrs[i] != NULL;
		emb_wire_found_pack(found, p.n, pc->bits);
	}
	niov = emb_wire_pull_resp_encode_ptrs(
	    pc->head, pc->iov, p.n + 2, req->hdr.req_id, p.table_id, wflags,
	    p.n, stride, pc->bits, pc->ptrs, zero_row);
	if (niov < 0) {
		pull_done(pc, 0);
		return reply_error(s, req, niov, NULL);
	}
	hdr.opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	hdr.flags = wflags;
	hdr.table_id = p.table_id;
	hdr.count = p.n;
	/* iov[0] is the encoder's header; the transport writes its own. */
	/* From here until pull_done() the reply reads table memory. */
	pc->sc = emb_conn_user(req->conn);
	if (pc->sc)
		pc->sc->zc_replies++;
	if (emb_conn_reply(req, &hdr, pc->iov + 1, niov - 1, pull_done, pc))
		pull_done(pc, 0);
	finish(s);
	return 0;
}

/* Ends a request on table st: drops the reference, then acks or errs. */
static int end_table_op(struct emb_server *s, struct emb_req *req,
			struct srv_table *st, int rc, uint32_t count)
{
	uint32_t id = st->id;

	rtable_put(st);
	if (rc < 0)
		return reply_error(s, req, rc, NULL);
	reply_ack(s, req, id, count);
	return 0;
}

static int on_push(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct emb_wire_push_req p;
	struct srv_table *st;
	bool claimed = false;
	const char *why;
	int rc, held = 0;

	st = rtable_get(s, f->hdr.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	rc = emb_wire_push_req_decode(f, st->spec.dim, &p);
	/* Checked against the map before its sequence number is claimed:
	 * a refused push is sent again as it was. */
	if (!rc) {
		held = emb__slots_begin(s->slots, &f->hdr, p.ids, p.n, &why);
		if (held < 0) {
			rtable_put(st);
			return reply_error(s, req, held, why);
		}
	}
	/* A retried push is applied at most once. A synchronous STEP_END
	 * part is held, not applied, so it is not claimed. */
	if (!rc && p.session && !p.step_end) {
		rc = emb__sessions_claim(s->sessions, p.session, p.seq);
		if (rc == 1) {
			emb__slots_end(s->slots, held);
			return end_table_op(s, req, st, 0, 0);
		}
		claimed = rc == 0;
	}
	if (!rc)
		rc = emb__sync_push(st->sync, st->t, &p, req);
	emb__slots_end(s->slots, held);
	/* Failed, or held for a synchronous step (and dropped if its
	 * connection goes): either way not applied yet. */
	if (rc != 0 && claimed)
		emb__sessions_undo(s->sessions, p.session, p.seq);
	if (rc == 1) {
		rtable_put(st);
		return 0; /* held until its synchronous step is applied */
	}
	/* Refused whole, by the store or before a synchronous step. */
	if (rc == EMB_ENONFINITE) {
		add(&s->nonfinite, 1);
		rtable_put(st);
		return reply_error(s, req, rc,
				   "a gradient is NaN or infinite; no row "
				   "was changed");
	}
	return end_table_op(s, req, st, rc, 0);
}

static int on_set_lifecycle(struct emb_server *s, struct emb_req *req,
			    const struct emb_wire_frame *f)
{
	struct emb_wire_set_lifecycle_req m;
	char a[EMB_LIFECYCLE_STR_MAX], e[EMB_LIFECYCLE_STR_MAX];
	struct srv_table *st;
	int rc;

	rc = emb_wire_set_lifecycle_req_decode(f, &m);
	if (rc)
		return reply_error(s, req, rc, NULL);
	st = rtable_get(s, m.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	rc = emb_table_set_lifecycle(st->t, &m.life);
	if (!rc) {
		emb_admit_format(&m.life, a, sizeof(a));
		emb_evict_format(&m.life, e, sizeof(e));
		emb_log(EMB_LOG_INFO, "table %s: admit %s, evict %s",
			st->spec.name, a, e);
	}
	return end_table_op(s, req, st, rc, 0);
}

static int on_set_mode(struct emb_server *s, struct emb_req *req,
		       const struct emb_wire_frame *f)
{
	struct emb_wire_set_mode_req m;
	struct srv_table *st;
	int rc;

	rc = emb_wire_set_mode_req_decode(f, &m);
	if (rc)
		return reply_error(s, req, rc, NULL);
	st = rtable_get(s, m.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	rc = emb__sync_set_mode(st->sync, m.mode, m.workers, m.staleness);
	if (!rc)
		emb_log(EMB_LOG_INFO, "table %s: mode %s", st->spec.name,
			m.mode == EMB_MODE_SYNC	   ? "sync"
			: m.mode == EMB_MODE_STALE ? "bounded staleness"
						   : "async");
	if (rc == -EBUSY) {
		rtable_put(st);
		return reply_error(s, req, rc,
				   "a synchronous step is being gathered");
	}
	return end_table_op(s, req, st, rc, 0);
}

static int on_assign(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	struct emb_wire_assign_req a;
	struct srv_table *st;
	const char *why;
	uint32_t dim;
	int rc, held;

	st = rtable_get(s, f->hdr.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	dim = st->spec.dim;
	rc = emb_wire_assign_req_decode(
	    f, dim, emb_optim_state_floats(st->spec.optim.kind, dim), &a);
	if (!rc) {
		held = emb__slots_begin(s->slots, &f->hdr, a.ids, a.n, &why);
		if (held < 0) {
			rtable_put(st);
			return reply_error(s, req, held, why);
		}
		rc = emb_table_assign(st->t, a.ids, a.n, a.rows, a.with_state,
				      NULL);
		emb__slots_end(s->slots, held);
	}
	if (rc == EMB_ENONFINITE)
		add(&s->nonfinite, 1);
	return end_table_op(s, req, st, rc, 0);
}

static int on_erase(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f)
{
	struct emb_wire_ids_req e;
	struct srv_table *st;
	const char *why;
	int rc, held;

	rc = emb_wire_erase_req_decode(f, &e);
	if (rc)
		return reply_error(s, req, rc, NULL);
	st = rtable_get(s, e.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	held = emb__slots_begin(s->slots, &f->hdr, e.ids, e.n, &why);
	if (held < 0) {
		rtable_put(st);
		return reply_error(s, req, held, why);
	}
	rc = emb_table_erase(st->t, e.ids, e.n);
	emb__slots_end(s->slots, held);
	return end_table_op(s, req, st, rc, rc > 0 ? (uint32_t)rc : 0);
}

/*
 * LOCATE: where the ids' records lie, with the rkey of this conn's loop
 * (each loop registers table memory in its own protection domain, so a
 * location is good for READs on the conn that asked). Creates nothing.
 */
static int on_locate(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	struct emb_transport *tr = emb_req_conn(req)->tr;
	struct emb_wire_locate_resp r;
	struct emb_table_remote rt;
	struct emb_wire_ids_req q;
	struct srv_table *st;
	uint64_t *addrs;
	size_t len;
	char *buf;
	int rc;

	rc = emb_wire_locate_req_decode(f, &q);
	if (rc)
		return reply_error(s, req, rc, NULL);
	st = table_get(s, q.table_id);
	if (!st)
		return reply_error(s, req, EMB_ENOTABLE, NULL);
	if (!emb_table_remote(st->t, &rt)) {
		table_put(st);
		return reply_error(s, req, EMB_ENOTREMOTE, NULL);
	}
	len = emb_wire_locate_resp_bytes(q.n);
	if (len > s->opts.limits.max_frame_bytes) {
		table_put(st);
		return reply_error(s, req, EMB_ETOOMANYIDS,
				   "LOCATE response would pass the frame limit");
	}
	buf = aligned_alloc(64, (len + 63) & ~(size_t)63);
	if (!buf) {
		table_put(st);
		return reply_error(s, req, -ENOMEM, NULL);
	}
	/* The addresses go where the entries will be, half as wide: filled
	 * back to front, entry i overwrites only addresses >= i. */
	r.entries = buf + EMB_WIRE_HDR_SIZE + EMB_WIRE_LOCATE_HEAD_SIZE;
	addrs = (uint64_t *)r.entries;
	rc = (int)emb_table_locate(st->t, q.ids, q.n, addrs);
	table_put(st);
	if (rc < 0) {
		free(buf);
		return reply_error(s, req, rc, NULL);
	}
	for (uint32_t i = q.n; i-- > 0;) {
		uint64_t a = addrs[i];
		uint32_t rkey = 0;

		if (a && emb_transport_rkey(tr, (void *)(uintptr_t)a,
					    rt.rec_bytes, &rkey) != 0)
			a = 0;
		emb_wire_locate_entry_put(r.entries, i, a, rkey);
	}
	r.seed = rt.seed;
	r.rec_bytes = rt.rec_bytes;
	r.row_floats = rt.row_floats;
	r.n = q.n;
	rc = emb_wire_locate_resp_encode(buf, len, req->hdr.req_id, q.table_id,
					 &r);
	if (rc < 0) {
		free(buf);
		return reply_error(s, req, rc, NULL);
	}
	return reply_frame(s, req, buf, rc);
}

static int on_drop(struct emb_server *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	int rc = emb_wire_empty_req_decode(f, EMB_OP_DROP_TABLE);

	if (!rc)
		rc = table_drop(s, f->hdr.table_id);
	if (rc)
		return reply_error(s, req, rc, NULL);
	reply_ack(s, req, f->hdr.table_id, 0);
	return 0;
}

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

	start(s);
	if (this_loop(s))
		loop_add(&this_loop(s)->requests, 1);
	else
		add(&s->requests, 1);
	if (!sc || sc->closing) {
		emb_req_release(req);
		finish(s);
		return 0;
	}
	if (sc->refused) {
		reply_and_close(s, c, sc, req, EMB_ETOOMANYCONNS,
				"server at its --max-conns limit; retry later");
		return 0;
	}
	/* The TCP transport enforces this before buffering; RDMA receives
	 * into fixed buffers, so only the check here applies to it. */
	if (!sc->hello && EMB_WIRE_HDR_SIZE + (uint64_t)hdr->payload_len >
			      EMB_SERVER_LOGIN_FRAME) {
		reply_and_close(s, c, sc, req, EMB_ETOOBIG,
				"frame too large before HELLO");
		return 0;
	}
	if (hdr->opcode & EMB_OP_RESPONSE_BIT)
		return reply_error(s, req, EMB_EBADFRAME,
				   "a response sent to the server");
	/* The transport checks framing only; a number that is no opcode
	 * means a peer that does not speak this protocol (docs/protocol.md). */
	if (!emb_wire_op_known(hdr->opcode)) {
		reply_and_close(s, c, sc, req, EMB_EBADOP, "unknown opcode");
		return 0;
	}
	if (hdr->opcode == EMB_OP_HELLO)
		return on_hello(s, c, sc, req, &f);
	if (!sc->hello)
		return reply_error(s, req, EMB_ENOHELLO, NULL);
	/* Admin rights: what changes a table for everyone else. */
	if ((hdr->opcode == EMB_OP_SET_MODE ||
	     hdr->opcode == EMB_OP_SET_LIFECYCLE ||
	     hdr->opcode == EMB_OP_DROP_TABLE) &&
	    !sc->admin) {
		add(&s->not_admin, 1);
		emb_log(EMB_LOG_WARN, "%s: %s refused: not admin",
			emb_conn_peer(c), emb_wire_op_name(hdr->opcode));
		return reply_error(s, req, EMB_ENOADMIN,
				   "this operation needs the admin token "
				   "(HELLO with EMB_F_ADMIN)");
	}

	switch (hdr->opcode) {
	case EMB_OP_PULL:
		return on_pull(s, req, &f);
	case EMB_OP_PUSH:
		return on_push(s, req, &f);
	case EMB_OP_PING:
		return on_ping(s, req, &f);
	case EMB_OP_CREATE_TABLE:
		return on_create(s, sc, req, &f);
	case EMB_OP_DROP_TABLE:
		return on_drop(s, req, &f);
	case EMB_OP_LIST_TABLES:
		return on_list(s, req, &f);
	case EMB_OP_ASSIGN:
		return on_assign(s, req, &f);
	case EMB_OP_ERASE:
		return on_erase(s, req, &f);
	case EMB_OP_LOCATE:
		return on_locate(s, req, &f);
	case EMB_OP_STATS:
		return on_stats(s, req, &f);
	case EMB_OP_SET_MODE:
		return on_set_mode(s, req, &f);
	case EMB_OP_SET_LIFECYCLE:
		return on_set_lifecycle(s, req, &f);
	case EMB_OP_DUMP_BEGIN:
	case EMB_OP_DUMP_CHUNK:
	case EMB_OP_DUMP_END:
		if (emb__server_dump(s, req, &f, &sc->dump))
			add(&s->errors, 1);
		finish(s);
		return 0;
	default:
		return reply_error(s, req, -EOPNOTSUPP,
				   "opcode reserved for a later version");
	}
}

/*
 * The loop's one clock read per request: it starts the request about to
 * run, and ends the one before, whose latency it records. Requests of a
 * loop run one after the other, so the next one's start is the last
 * one's end; after the last request of a wake-up, loop_main() reads the
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
	struct srv_loop *l = this_loop(s);

	return l ? loop_clock(l) : emb_clock_ns();
}

/*
 * dispatch(), then records the time from arrival (t0_ns) to the reply
 * being posted in the loop's own histogram (server_lat.h): on the loop, at
 * its next clock read. A synchronous push held for its step counts until
 * it is held.
 */
static void dispatch_timed(struct emb_server *s, struct emb_conn *c,
			   struct emb_req *req, const struct emb_frame_hdr *hdr,
			   void *payload, uint64_t t0_ns)
{
	struct srv_conn *sc = emb_conn_user(c);
	struct srv_loop *l = this_loop(s);
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

/* Requests that change rows a queued PULL reply may still be reading. */
static bool writes_rows(uint8_t op)
{
	return op == EMB_OP_PUSH || op == EMB_OP_ASSIGN || op == EMB_OP_ERASE ||
	       op == EMB_OP_DROP_TABLE;
}

/*
 * Runs held requests in arrival order until one must wait again. Loop
 * thread of the conn only.
 */
static void conn_drain(struct srv_conn *sc)
{
	while (sc->held && sc->c) {
		struct held *h = sc->held;

		if (writes_rows(h->req->hdr.opcode) && sc->zc_replies)
			return;
		sc->held = h->next;
		if (!sc->held)
			sc->held_tail = NULL;
		finish(sc->s); /* dispatch() counts it again */
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
		finish(sc->s);
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
static void on_request(void *arg, struct emb_conn *c, struct emb_req *req,
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
			start(sc->s);
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

static void on_open(void *arg, struct emb_conn *c, int reason)
{
	struct emb_server *s = arg;
	struct srv_conn *sc;
	uint64_t open;

	(void)reason;
	sc = calloc(1, sizeof(*sc));
	if (!sc) {
		emb_log(EMB_LOG_ERROR, "%s: out of memory, closing",
			emb_conn_peer(c));
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
	add(&s->conns_total, 1);
	emb_log(EMB_LOG_INFO, "connection from %s (%s)", emb_conn_peer(c),
		emb_conn_transport(c));
	if (s->opts.max_conns && open > s->opts.max_conns) {
		/* Its first request (a HELLO) gets the reason; a flood of
		 * conns that send nothing closes at once. */
		add(&s->conns_refused, 1);
		sc->refused = true;
		emb_log(EMB_LOG_WARN, "%s: refused: %u connections open",
			emb_conn_peer(c), s->opts.max_conns);
		if (open > s->opts.max_conns + REFUSE_SLACK)
			emb_conn_close(c, EMB_ETOOMANYCONNS);
	}
}

/* A closing conn's held synchronous pushes go, with their memory. */
static void drop_sync_parts(struct emb_server *s, struct emb_conn *c)
{
	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb__sync_drop_conn(s->tables[i]->sync, c);
	pthread_rwlock_unlock(&s->tables_lock);
}

static void on_close(void *arg, struct emb_conn *c, int reason)
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
	drop_sync_parts(s, c);
	sc->c = NULL;
	/* A PULL reply still out frees it when it completes. */
	if (!sc->zc_replies)
		free(sc);
	__atomic_fetch_sub(&s->conns_open, 1, __ATOMIC_RELAXED);
	if (reason && reason != EMB_EPEERDEAD)
		emb_log(EMB_LOG_WARN, "connection from %s closed: %s",
			emb_conn_peer(c), emb_strerror(reason));
	else
		emb_log(EMB_LOG_INFO, "connection from %s closed",
			emb_conn_peer(c));
}

/* ---- timeouts ---- */

/* Loop thread: closes the loop's conns that outstayed a timeout. */
static void sweep_run(void *arg)
{
	struct srv_loop *l = arg;
	struct emb_server *s = l->s;
	const uint64_t hs_ns = (uint64_t)s->opts.handshake_timeout_ms * 1000000;
	const uint64_t idle_ns = (uint64_t)s->opts.idle_timeout_ms * 1000000;
	uint64_t now = emb_clock_ns();
	struct srv_conn *sc, *next;
	uint32_t loop = l->index;

	/* From here the sweeper may post the task again. */
	__atomic_store_n(&l->sweep_queued, false, __ATOMIC_RELEASE);
	/* Tasks left at destroy run while the conns are being torn down. */
	if (__atomic_load_n(&s->loops_stopped, __ATOMIC_ACQUIRE))
		return;
	for (sc = s->loop_conns[loop]; sc; sc = next) {
		struct emb_conn_stats cs;
		const char *why = NULL;

		next = sc->next; /* closing sc may free it */
		if (!sc->c)
			continue;
		if (!sc->hello) {
			if (hs_ns && now - sc->opened_ns > hs_ns)
				why = "no HELLO within the handshake timeout";
		} else if (idle_ns && now - sc->last_ns > idle_ns &&
			   !sc->held && !sc->zc_replies) {
			/* A request still held (a synchronous step) or a
			 * reply still queued is not idleness. */
			emb_conn_stats(sc->c, &cs);
			if (cs.inflight == 0 && cs.out_queued == 0)
				why = "idle timeout";
		}
		if (!why)
			continue;
		add(&s->conns_timed_out, 1);
		emb_log(EMB_LOG_WARN, "%s: closing: %s", emb_conn_peer(sc->c),
			why);
		emb_conn_close(sc->c, -ETIMEDOUT);
	}
}

/* Posts sweep_run to every loop a few times per timeout until stopped. */
static void *sweeper_main(void *arg)
{
	struct emb_server *s = arg;
	uint32_t t = s->opts.handshake_timeout_ms;
	uint64_t period_ms;
	struct timespec dl;

	if (!t || (s->opts.idle_timeout_ms && s->opts.idle_timeout_ms < t))
		t = s->opts.idle_timeout_ms;
	period_ms = t / 4;
	if (period_ms < 10)
		period_ms = 10;
	if (period_ms > 1000)
		period_ms = 1000;
	pthread_mutex_lock(&s->reap_mu);
	while (!s->sweep_stop) {
		clock_gettime(CLOCK_MONOTONIC, &dl);
		dl.tv_nsec += (long)(period_ms % 1000) * 1000000;
		dl.tv_sec += (time_t)(period_ms / 1000) + dl.tv_nsec / 1000000000;
		dl.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&s->sweep_cv, &s->reap_mu, &dl);
		if (s->sweep_stop)
			break;
		pthread_mutex_unlock(&s->reap_mu);
		/* Each loop's own task, not a malloc'd one: a server
		 * serving requests allocates nothing on a timer either. A
		 * loop too busy to have run the last one is not sent
		 * another. */
		for (uint32_t i = 0; i < s->opts.threads; i++) {
			struct srv_loop *l = &s->lstate[i];

			if (!__atomic_exchange_n(&l->sweep_queued, true,
						 __ATOMIC_ACQ_REL))
				(void)emb_transport_post(s->loops[i],
							 &l->sweep);
		}
		pthread_mutex_lock(&s->reap_mu);
	}
	pthread_mutex_unlock(&s->reap_mu);
	return NULL;
}

static void sweeper_stop(struct emb_server *s)
{
	if (!s->sweeper_running)
		return;
	pthread_mutex_lock(&s->reap_mu);
	s->sweep_stop = true;
	pthread_cond_signal(&s->sweep_cv);
	pthread_mutex_unlock(&s->reap_mu);
	pthread_join(s->sweeper, NULL);
	s->sweeper_running = false;
}

/* ---- lifecycle ---- */

static void *loop_main(void *arg)
{
	struct srv_loop *l = arg;
	struct emb_transport *tr = l->s->loops[l->index];
	int rc;

	cur_loop = l;
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

/* Any thread: makes loop i's thread leave loop_main(). */
static void loop_stop(struct emb_server *s, uint32_t i)
{
	__atomic_store_n(&s->lstate[i].stop, true, __ATOMIC_RELEASE);
	emb_transport_wake(s->loops[i]);
}

static uint64_t random_id(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
	       ((uint64_t)getpid() << 40);
}

int emb_server_create(const struct emb_server_opts *opts,
		      struct emb_server **out)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_listen_opts lopts = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_server *s;
	pthread_condattr_t ca;
	uint32_t i;
	int rc;

	if (!opts || !out || !opts->host || !opts->transport ||
	    opts->threads == 0 || opts->threads > 256 ||
	    opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token) ||
	    opts->admin_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->admin_token_len && !opts->admin_token) ||
	    emb_wire_limits_validate(&opts->limits))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->opts = *opts;
	s->host = strdup(opts->host);
	s->transport = strdup(opts->transport);
	s->tables = calloc(opts->limits.max_tables, sizeof(*s->tables));
	s->loops = calloc(opts->threads, sizeof(*s->loops));
	s->threads = calloc(opts->threads, sizeof(*s->threads));
	s->lat = calloc((size_t)opts->threads * EMB_LAT_NOPS, sizeof(*s->lat));
	s->loop_conns = calloc(opts->threads, sizeof(*s->loop_conns));
	s->rpools = calloc(opts->threads, sizeof(*s->rpools));
	s->lstate = aligned_alloc(64, opts->threads * sizeof(*s->lstate));
	if (s->lstate) {
		memset(s->lstate, 0, opts->threads * sizeof(*s->lstate));
		for (i = 0; i < opts->threads; i++) {
			struct srv_loop *l = &s->lstate[i];

			l->s = s;
			l->index = i;
			l->sweep.fn = sweep_run;
			l->sweep.arg = l;
			l->tabs =
			    calloc(opts->limits.max_tables, sizeof(*l->tabs));
			l->pins =
			    calloc(opts->limits.max_tables, sizeof(*l->pins));
			l->gone =
			    calloc(opts->limits.max_tables, sizeof(*l->gone));
			if (!l->tabs || !l->pins || !l->gone) {
				rc = -ENOMEM;
				goto err_free;
			}
		}
	}
	if (!s->host || !s->transport || !s->tables || !s->loops ||
	    !s->threads || !s->lat || !s->loop_conns || !s->rpools ||
	    !s->lstate ||
	    emb__sessions_create(&s->sessions) ||
	    emb__slots_create(&s->slots) ||
	    emb__fill_create(&s->fill) ||
	    emb_authlimit_create(&s->authlimit)) {
		rc = -ENOMEM;
		goto err_free;
	}
	s->opts.host = s->host;
	s->opts.transport = s->transport;
	s->opts.auth_token = s->token;
	if (opts->auth_token_len)
		memcpy(s->token, opts->auth_token, opts->auth_token_len);
	s->opts.admin_token = s->admin_token;
	if (opts->admin_token_len)
		memcpy(s->admin_token, opts->admin_token,
		       opts->admin_token_len);
	s->budget.limit = opts->mem_limit;
	s->rx_budget.limit = opts->conn_mem_limit;
	if (!s->rx_budget.limit && !opts->mem_limit)
		s->rx_budget.limit = 1ull << 30;
	else if (!s->rx_budget.limit)
		s->rx_budget.limit = opts->mem_limit / 4 < (64u << 20)
					 ? 64u << 20
					 : opts->mem_limit / 4;
	s->server_id = random_id();
	pthread_rwlock_init(&s->tables_lock, NULL);
	pthread_mutex_init(&s->reap_mu, NULL);
	pthread_cond_init(&s->reap_cv, NULL);
	/* The sweeper's waits must not jump with the wall clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->sweep_cv, &ca);
	pthread_condattr_destroy(&ca);
	s->rdma = strstr(opts->transport, "rdma") != NULL;
	s->dual = s->rdma && strstr(opts->transport, "tcp") != NULL;
	/* Before the listener exists, so no client sees a partial state. */
	if (opts->on_start) {
		rc = opts->on_start(s, opts->start_arg);
		if (rc)
			goto err_loops;
	}

	topts.max_frame_bytes = opts->limits.max_frame_bytes;
	if (EMB_SERVER_LOGIN_FRAME < topts.max_frame_bytes)
		topts.login_frame_bytes = EMB_SERVER_LOGIN_FRAME;
	topts.rx_budget = &s->rx_budget;
	for (i = 0; i < opts->threads; i++) {
		rc =
		    emb_transport_create(opts->transport, &topts, &s->loops[i]);
		if (rc)
			goto err_loops;
	}
	lopts.host = s->host;
	lopts.port = opts->port;
	lopts.loops = s->loops;
	lopts.nloops = opts->threads;
	lopts.on_request = on_request;
	lopts.on_open = on_open;
	lopts.on_close = on_close;
	lopts.arg = s;
	rc = emb_listener_create(s->loops[0], &lopts, &s->listener);
	if (rc)
		goto err_loops;
	s->port = emb_listener_port(s->listener);
	for (i = 0; i < opts->threads; i++) {
		rc = -pthread_create(&s->threads[i], NULL, loop_main,
				     &s->lstate[i]);
		if (rc)
			goto err_threads;
		s->nstarted++;
	}
	if (s->rdma) {
		rc = -pthread_create(&s->reaper, NULL, reaper_main, s);
		if (rc)
			goto err_threads;
		s->reaper_running = true;
	}
	if (opts->handshake_timeout_ms || opts->idle_timeout_ms) {
		rc = -pthread_create(&s->sweeper, NULL, sweeper_main, s);
		if (rc)
			goto err_reaper;
		s->sweeper_running = true;
	}
	*out = s;
	return 0;

err_reaper:
	if (s->reaper_running) {
		pthread_mutex_lock(&s->reap_mu);
		s->reap_stop = true;
		pthread_cond_signal(&s->reap_cv);
		pthread_mutex_unlock(&s->reap_mu);
		pthread_join(s->reaper, NULL);
		s->reaper_running = false;
	}
err_threads:
	for (i = 0; i < s->nstarted; i++) {
		loop_stop(s, i);
		pthread_join(s->threads[i], NULL);
	}
	emb_listener_destroy(s->listener);
err_loops:
	for (i = 0; i < opts->threads; i++)
		emb_transport_destroy(s->loops[i]);
	for (i = 0; i < opts->limits.max_tables; i++)
		table_put(s->tables[i]);
	pthread_rwlock_destroy(&s->tables_lock);
err_free:
	for (i = 0; s->lstate && i < opts->threads; i++)
		loop_fini(&s->lstate[i]);
	free(s->lstate);
	for (i = 0; s->rpools && i < opts->threads; i++)
		emb__rbuf_pool_fini(&s->rpools[i]);
	free(s->rpools);
	free(s->loop_conns);
	emb_authlimit_destroy(s->authlimit);
	emb__sessions_destroy(s->sessions);
	emb__slots_destroy(s->slots);
	emb__fill_destroy(s->fill);
	free(s->lat);
	free(s->threads);
	free(s->loops);
	free(s->tables);
	free(s->transport);
	free(s->host);
	free(s);
	return rc;
}

uint16_t emb_server_port(const struct emb_server *s)
{
	return s->port;
}

static void destroy_listener_task(void *arg)
{
	struct emb_server *s = arg;

	emb_listener_destroy(s->listener);
	/* emb_server_stop() polls this from the controlling thread. */
	__atomic_store_n(&s->listener, NULL, __ATOMIC_RELEASE);
}

void emb_server_stop(struct emb_server *s, uint32_t grace_ms)
{
	struct timespec ts = {0, 5 * 1000 * 1000};

	if (!s || s->stopped)
		return;
	s->stopped = true;
	sweeper_stop(s);
	/* A fill reads tables: it ends before they can go. */
	emb__fill_stop(s->fill);
	/* The listener belongs to loop 0's thread. */
	if (emb_transport_exec(s->loops[0], destroy_listener_task, s) == 0) {
		for (uint32_t waited = 0; waited < 2000; waited += 5) {
			if (!__atomic_load_n(&s->listener, __ATOMIC_ACQUIRE))
				break;
			nanosleep(&ts, NULL);
		}
	}
	for (uint32_t waited = 0; waited < grace_ms; waited += 5) {
		if (inflight(s) <= 0)
			break;
		nanosleep(&ts, NULL);
	}
	/* One more round so replies just posted reach the socket. */
	nanosleep(&ts, NULL);
	/* The reaper waits on the loops: it finishes while they still run. */
	if (s->reaper_running) {
		pthread_mutex_lock(&s->reap_mu);
		s->reap_stop = true;
		pthread_cond_signal(&s->reap_cv);
		pthread_mutex_unlock(&s->reap_mu);
		pthread_join(s->reaper, NULL);
		s->reaper_running = false;
	}
	for (uint32_t i = 0; i < s->nstarted; i++)
		loop_stop(s, i);
	for (uint32_t i = 0; i < s->nstarted; i++)
		pthread_join(s->threads[i], NULL);
	s->nstarted = 0;
	__atomic_store_n(&s->loops_stopped, true, __ATOMIC_RELEASE);
}

void emb_server_destroy(struct emb_server *s)
{
	if (!s)
		return;
	emb_server_stop(s, 1000);
	if (s->listener)
		emb_listener_destroy(s->listener);
	/* Tables left to the reaper after it stopped: the loops are gone,
	 * so this thread deregisters their regions itself. */
	while (s->reap_head) {
		struct srv_table *st = s->reap_head;

		s->reap_head = st->reap_next;
		table_free(st);
	}
	/* Regions must go before the transports that registered them; a
	 * table freed later (a reply completing at transport destroy) then
	 * finds none left. */
	for (struct srv_table *st = s->all_tables; st; st = st->all_next)
		emb__memreg_release_all(st->memreg);
	/* Held synchronous pushes name requests of connections that the
	 * transports free: release them while they exist. */
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		if (s->tables[i])
			emb__sync_abort(s->tables[i]->sync);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb_transport_destroy(s->loops[i]);
	/* Every reply has completed now, its buffer back in its pool, and
	 * its table use ended. */
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb__rbuf_pool_fini(&s->rpools[i]);
	free(s->rpools);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		loop_fini(&s->lstate[i]);
	free(s->lstate);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		table_put(s->tables[i]);
	pthread_rwlock_destroy(&s->tables_lock);
	pthread_cond_destroy(&s->reap_cv);
	pthread_cond_destroy(&s->sweep_cv);
	pthread_mutex_destroy(&s->reap_mu);
	free(s->loop_conns);
	emb__sessions_destroy(s->sessions);
	emb__slots_destroy(s->slots);
	emb__fill_destroy(s->fill);
	emb_authlimit_destroy(s->authlimit);
	free(s->lat);
	free(s->threads);
	free(s->loops);
	free(s->tables);
	free(s->transport);
	free(s->host);
	free(s);
}

void emb_server_stats(struct emb_server *s, struct emb_server_stats *out)
{
	uint64_t n = 0;

	pthread_rwlock_rdlock(&s->tables_lock);
	for (uint32_t i = 0; i < s->opts.limits.max_tables; i++)
		n += s->tables[i] != NULL;
	pthread_rwlock_unlock(&s->tables_lock);
	out->conns_open = __atomic_load_n(&s->conns_open, __ATOMIC_RELAXED);
	out->conns_total = __atomic_load_n(&s->conns_total, __ATOMIC_RELAXED);
	out->requests = __atomic_load_n(&s->requests, __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		out->requests += (uint64_t)__atomic_load_n(
		    &s->lstate[i].requests, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&s->errors, __ATOMIC_RELAXED);
	out->tables = n;
	out->mem_used = __atomic_load_n(&s->budget.used, __ATOMIC_RELAXED);
	out->mem_limit = s->budget.limit;
	out->conn_bytes = __atomic_load_n(&s->rx_budget.used, __ATOMIC_RELAXED);
	out->conns_refused =
	    __atomic_load_n(&s->conns_refused, __ATOMIC_RELAXED) +
	    __atomic_load_n(&s->rx_budget.refused, __ATOMIC_RELAXED);
	out->conns_timed_out =
	    __atomic_load_n(&s->conns_timed_out, __ATOMIC_RELAXED);
	out->nonfinite = __atomic_load_n(&s->nonfinite, __ATOMIC_RELAXED);
	out->not_admin = __atomic_load_n(&s->not_admin, __ATOMIC_RELAXED);
}

uint32_t emb_server_nloops(const struct emb_server *s)
{
	return s->opts.threads;
}

void emb_server_loop_stats(struct emb_server *s, uint32_t i,
			   struct emb_transport_stats *out)
{
	emb_transport_stats(s->loops[i], out);
}

void emb_server_latency(struct emb_server *s, uint32_t op, struct emb_hist *out)
{
	emb_hist_reset(out);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb_lat_merge(out, &s->lat[(size_t)i * EMB_LAT_NOPS + op]);
}

int emb_server_table_stats(struct emb_server *s, uint32_t id,
			   struct emb_wire_stats *out)
{
	struct srv_table *st = table_get(s, id);

	if (!st)
		return EMB_ENOTABLE;
	fill_stats(st, out);
	table_put(st);
	return 0;
}

int emb_server_set_map(struct emb_server *s, const struct emb_server_map *m)
{
	return emb__slots_set(s->slots, m);
}

void emb_server_on_newer_map(struct emb_server *s,
			     void (*fn)(void *arg, uint64_t epoch), void *arg)
{
	emb__slots_hook(s->slots, fn, arg);
}

int emb_server_fill(struct emb_server *s, const char *host, uint16_t port,
		    uint32_t first, uint32_t n, uint64_t epoch,
		    emb_server_fill_fn done, void *arg)
{
	struct emb__fill_req r = {
	    .host = host,
	    .port = port,
	    .first = first,
	    .n = n,
	    .epoch = epoch,
	    .token = s->opts.auth_token_len ? s->token : NULL,
	    .token_len = s->opts.auth_token_len,
	    .done = done,
	    .arg = arg,
	};

	if (s->stopped)
		return -ECANCELED;
	return emb__fill_start(s->fill, s, &r);
}

void emb_server_map_counts(struct emb_server *s, uint64_t out[2])
{
	emb__slots_counts(s->slots, out);
}
