/*
 * src/cluster/coord.c - the coordinator on etcd (coord.h). Keys under
 * P = /embstore/<job>/ (docs/coordinator.md):
 *
 *   P config            "servers=S workers=W ttl_ms=T replicas=R
 *                       [servers_max=M]": the first node's, which every
 *                       later node must match (M > S: ranks to spare)
 *   P server/<rank>     "host:port", on the server's lease: its rank, and
 *                       that it is alive
 *   P worker/<rank>     "pid N", on the worker's lease
 *   P map               the replicated map, emb_cmap_encode() (map.h):
 *                       epoch 1 written by CAS when every rank is taken,
 *                       later epochs by CAS on its mod_revision
 *   P servers           "h:p,h:p,...": the servers' addresses by rank,
 *                       written with epoch 1 (rank keys die with leases)
 *   P finish/worker/<r> a worker finished (no lease: it outlives it)
 *   P filling/<r>       a newcomer took dead rank r and is to be filled
 *                       (written with its claim; deleted by the map that
 *                       ends its fill)
 *   P fill              "rank first n epoch [kind from]": the chunk being
 *                       filled (kind f), copied ahead of a move (w) or
 *                       moved fenced (m) from server `from`, and the epoch
 *                       of the map that began that step (written with
 *                       that map)
 *   P joining/<r>       server r is given its share by moves (written
 *                       with the map that ends its fill; deleted with the
 *                       one that gives it its share)
 *   P drain/<r>         server r is to leave: its slots move to the others
 *                       (emb_coord_drain(), `embstore scale`); deleted
 *                       when it leaves, or by the leader if it cannot be
 *                       drained
 *   P left/server/<r>   server r was drained and left: its key's end is no
 *                       death (no lease; deleted by a claim of rank r)
 *   P fill_done         "source first n epoch status rows bytes": the
 *                       chunk's source streamed it (or failed to), and
 *                       what it sent; deleted by the map that takes the
 *                       next step
 *   P move              "kind rank t0 slots rows bytes": the drain, join
 *                       or recovery under way, its wall-clock start, the
 *                       slots it had to move, the rows and bytes streamed
 *                       for it so far (for observers: written with the
 *                       leader's steps, deleted with the one ending it)
 *   P fill_fails        "rank count": failed streams of rank's recovery
 *                       so far (written with the map that gives a chunk
 *                       up; deleted by a claim, the fill's end and the
 *                       give-up at FILL_TRIES)
 *   P barrier/<name>/<gen>/<rank>  a worker entered a barrier (no lease)
 *   P dead/<role>/<rank> a node counted the rank dead (no lease; written
 *                       only while the rank key is absent; deleted by a
 *                       newcomer's claim): a node whose lease ended while
 *                       it lived takes its rank back only without it
 *
 * Threads: the lease thread renews the lease, on an etcd handle of its
 * own, so that no other request delays a renewal; the agent thread polls
 * the keys; callers' threads wait for the map and at barriers by polling
 * too. Shared state is under c->mu; each etcd handle serializes its own
 * requests.
 */
#include "cluster/coord.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/etcd.h"
#include "cluster/map.h"
#include "common/addr.h"
#include "common/clock.h"
#include "common/endian.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"

#define TTL_DEFAULT_MS	 10000u
#define JOIN_DEFAULT_MS	 300000u
#define POLL_MS		 100 /* waits for config and members */
#define ETCD_RETRY_MS	 500 /* waits for etcd itself when joining */
#define KEY_MAX		 (EMB_ETCD_KEY_MAX + 1)
#define BARRIER_NAMES_MAX 64 /* barrier names a worker tracks */
/* Polls asked for (emb_coord_poll_now()) come at most this often: every
 * write refused for its epoch asks, and etcd need not read the job for
 * each one. */
#define POKE_MIN_MS 20
/* A move or fill under way: how often the servers it waits on poll (the
 * leader, the chunk's source and target); each step of a chunk waits for
 * one of their polls, and every other node polls every POLL_MS. */
#define FAST_POLL_MS 20
/* A recovery in etcd (docs/coordinator.md): slots per chunk, as the
 * scheduler's, and how long the leader waits for a chunk's source. */
#define FILL_CHUNK_SLOTS 256u
#define FILL_TIMEOUT_MS	 60000
/* Failed streams of a recovery before it is given up (the scheduler's
 * FILL_TRIES): a source that fails every stream (a full disk on the
 * newcomer, a table it cannot make) would otherwise be asked for ever. */
#define FILL_TRIES 8u
/* Leases past the first an unanswering etcd is waited for (lease_main()),
 * and how long, in leases, a rank that vanished with many others is
 * waited for before it counts as dead (poll_job()): a stalled etcd that
 * woke revoked every lease at once, and each node takes its own back
 * within a renewal. */
#define STALL_LEASES 4
#define VANISH_LEASES 2

/* An observer's read of a job's keys (job_read_on()). */
struct job_view;
static void job_view_free(struct job_view *v);

struct emb_coord {
	struct emb_etcd *etcd;		   /* the client, for all but the lease */
	struct emb_etcd *lease_etcd;	   /* the lease's: grant, renew, revoke */
	uint32_t timeout_ms;		   /* per request and endpoint */
	char prefix[32 + EMB_COORD_JOB_MAX]; /* "/embstore/<job>/" */
	int64_t lease;			   /* this node's */
	uint32_t replicas;		   /* copies of each slot, the job's */
	uint32_t start;			   /* servers the job forms with;
					      reg.server_num is its ranks
					      (servers_max) */
	struct emb_wire_register_resp reg; /* role, rank, counts, TTL */
	char rank_val[EMB_WIRE_HOST_MAX + 16]; /* the rank key's value */
	uint32_t join_timeout_ms;	   /* waits */
	emb_coord_end_fn on_end;	   /* optional */
	void *end_arg;			   /* for on_end */
	const volatile sig_atomic_t *cancel; /* optional */
	void (*hook)(void *, enum emb_coord_hook); /* tests */
	void *hook_arg;			   /* for hook */
	int64_t lease_at;		   /* when the join's lease was
					      granted (emb_clock_ms()) */
	pthread_t thread;		   /* runs agent_main */
	pthread_t lease_thread;		   /* runs lease_main */
	bool running;			   /* both threads started */

	pthread_mutex_t mu;  /* guards the fields below */
	pthread_cond_t cv;   /* stop, for the threads' sleeps */
	bool stop;	     /* destroy asked the threads to exit */
	bool poke;	     /* emb_coord_poll_now(): the agent polls soon */
	int lost;	     /* 0, or why this node is out of the job */
	bool ended;	     /* job over for this node: no more reports */
	uint64_t epoch;	     /* of map; 0 before the first */
	struct emb_cmap *map; /* the newest map read (heap: ~64 KiB) */
	int64_t map_rev;     /* mod_revision of the map key then */
	emb_coord_map_fn map_fn; /* emb_coord_watch_map() */
	void *map_arg;		 /* for map_fn */
	uint8_t *dead_srv;   /* [server_num]: declared dead */
	uint8_t *dead_wrk;   /* [worker_num]: declared dead */
	uint8_t *srv_live;   /* [server_num]: rank key there at the last
				poll (or waited for, vanished()) */
	struct emb_wire_node_ref *dead; /* in order of discovery */
	uint32_t ndead;			/* entries in dead */
	uint32_t dead_cap;		/* room in dead */
	bool fast;	/* busy, and this server is the leader or the step's
			   source or target: it polls every FAST_POLL_MS */
	bool busy;	/* a fill under way or a newcomer waiting for one:
			   the agent polls every POLL_MS */
	bool leads;	/* this server led the job at the last poll (the
			   live server of lowest rank) */
	uint64_t polls;	/* agent polls ended (c->mu) */
	/* emb_coord_moves()'s last read of the job's keys (NULL if it
	 * failed, with its error in moves_rc), and c->polls then: a scrape
	 * reuses it, or its error, until the agent's next poll ends, so
	 * scrapes in a loop cost etcd at most one read a poll, answered or
	 * not (a silent etcd must not hold the agent's handle for a
	 * timeout per scrape). Under moves_mu, which serializes the
	 * scrapes. */
	pthread_mutex_t moves_mu;
	struct job_view *moves_view;
	int moves_rc;
	uint64_t moves_polls;
	int64_t relet_at;    /* emb_clock_ms() of this node's last re-let
				(relet()), 0 if none */
	int64_t silent_at;   /* of the lease thread's last renewal that
				etcd did not answer, or of the agent's
				first poll after it paused; 0 if none */
	int64_t polled_at;   /* agent: emb_clock_ms() of its last poll of
				the job's keys, 0 before the first */
	int64_t drained_at;  /* agent: when this server, asked to drain,
				first held nothing; 0 if not */
	int64_t *gone_since; /* agent: [S + W] when a rank's key was first
				missing in a vanish of many (poll_job()),
				0 if not waited for */
	/* Leader: no chunk begins before this emb_clock_ms() (0: any
	 * time), after a failed stream (retry_after()). */
	int64_t plan_after;
	/* Leader: the job's move key as its steps() read it ("" if none):
	 * the drain, join or recovery under way, "kind rank t0 slots rows
	 * bytes", for observers (emb_coord_job_moves()). Agent thread
	 * only. */
	char move_val[96];
	/* Rows and bytes the report this step took streamed, which the
	 * step's transaction adds to the move key. Agent thread only. */
	uint64_t add_rows, add_bytes;
	/* The leader's clock on the chunk under way (fill_timeout()). */
	uint32_t watch_rank, watch_first;
	uint64_t watch_epoch;
	int64_t watch_since;
	emb_coord_dead_fn watch_fn;	/* emb_coord_watch() */
	void *watch_arg;		/* for watch_fn */
	char (*bar_names)[EMB_WIRE_BARRIER_NAME_MAX + 1]; /* nbar names */
	uint64_t *bar_gens;				   /* entries */
	uint32_t nbar;					   /* names */
};

/* ---- helpers -------------------------------------------------------- */

static bool job_ok(const char *job)
{
	size_t n = strlen(job);

	if (n == 0 || n > EMB_COORD_JOB_MAX)
		return false;
	for (const char *p = job; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
		      *p == '-'))
			return false;
	return true;
}

bool emb_coord_is_etcd(const char *s)
{
	return s && !strncmp(s, "etcd://", 7);
}

static void key_of(const struct emb_coord *c, char *buf, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* P + fmt into buf (KEY_MAX bytes). */
static void key_of(const struct emb_coord *c, char *buf, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(buf, KEY_MAX, "%s", c->prefix);

	va_start(ap, fmt);
	vsnprintf(buf + n, KEY_MAX - (size_t)n, fmt, ap);
	va_end(ap);
}

static const char *role_dir(uint32_t role)
{
	return role == EMB_ROLE_SERVER ? "server" : "worker";
}

/* Set on the agent and lease threads: the caller's cancel flag stops
 * the callers' waits, never these threads. A server's SIGTERM sets it,
 * and a server asked to drain by SIGTERM lives on, renewing its lease
 * and polling, until it holds nothing. */
static _Thread_local bool own_thread;

/* True when the caller's wait is to give up (its cancel flag is set). */
static bool cancelled(const struct emb_coord *c)
{
	return !own_thread && c->cancel && *c->cancel;
}

/* Sleeps ms unless stopped or cancelled; false if it should give up. */
static bool nap(struct emb_coord *c, uint32_t ms)
{
	struct timespec ts;
	bool stop;

	if (cancelled(c))
		return false;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&c->mu);
	if (!c->stop)
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	stop = c->stop;
	pthread_mutex_unlock(&c->mu);
	return !stop && !cancelled(c);
}

/* The job is over for this node (status 0, or why); reports it once. */
static void end_job(struct emb_coord *c, int status, const char *why)
{
	bool was;

	pthread_mutex_lock(&c->mu);
	was = c->ended || c->lost;
	if (!was) {
		if (status)
			c->lost = status;
		else
			c->ended = true;
	}
	pthread_mutex_unlock(&c->mu);
	if (was)
		return;
	if (status)
		emb_log(EMB_LOG_ERROR, "%s %u: out of job %s: %s",
			emb_role_name(c->reg.role), c->reg.rank, c->prefix,
			why);
	else
		emb_log(EMB_LOG_INFO, "%s %u: job finished",
			emb_role_name(c->reg.role), c->reg.rank);
	if (c->on_end)
		c->on_end(c->end_arg, status);
}

/*
 * A caller's request that etcd did not answer in time (EMB_ENOETCD) is no
 * verdict: on a starved machine the answer comes late because etcd or
 * this process did not run, and the lease may be alive. The lease thread
 * alone says when etcd is lost (once the lease has surely expired:
 * c->lost). True after a short nap when the request is worth another try
 * (every one retried is idempotent); otherwise *rc is what the caller
 * returns: its own error, the node's loss, or -ECANCELED.
 */
static bool again(struct emb_coord *c, int *rc)
{
	int lost;
	bool ended;

	if (*rc != EMB_ENOETCD)
		return false;
	pthread_mutex_lock(&c->mu);
	lost = c->lost;
	ended = c->ended;
	pthread_mutex_unlock(&c->mu);
	/* Ended: the lease is renewed no more, so nobody would say. */
	if (lost || ended) {
		*rc = lost ? lost : *rc;
		return false;
	}
	if (!nap(c, POLL_MS)) {
		*rc = -ECANCELED;
		return false;
	}
	return true;
}

/* ---- config --------------------------------------------------------- */

/* servers_max is optional: a job written without it has none to spare
 * (*m = *s). A move has one writer more than a slot's copies, so ranks
 * to spare need fewer than the most copies a map lists. */
static int config_parse(const struct emb_etcd_kv *kv, uint32_t *s, uint32_t *w,
			uint32_t *ttl, uint32_t *r, uint32_t *m)
{
	char buf[128];
	int used = 0;

	if (!kv->value || kv->value_len >= sizeof(buf))
		return EMB_EETCD;
	memcpy(buf, kv->value, kv->value_len);
	buf[kv->value_len] = '\0';
	if (sscanf(buf, "servers=%u workers=%u ttl_ms=%u replicas=%u%n", s, w,
		   ttl, r, &used) != 4)
		return EMB_EETCD;
	*m = *s;
	if (buf[used]) {
		int more = 0;

		/* Nothing may follow it: a config this node does not
		 * understand whole is no config to join by. */
		if (sscanf(buf + used, " servers_max=%u%n", m, &more) != 1 ||
		    buf[used + more] || *m < *s || *m > EMB_WIRE_SERVERS_MAX)
			return EMB_EETCD;
	}
	if (!*s || *s > EMB_WIRE_SERVERS_MAX || !*w ||
	    *w > EMB_WIRE_WORKERS_MAX || !*ttl || !*r ||
	    *r > EMB_CMAP_REPLICAS_MAX || *r > *s ||
	    (*m > *s && *r >= EMB_CMAP_REPLICAS_MAX))
		return EMB_EETCD;
	return 0;
}

/*
 * The job's counts and TTL: ours written if the job has none yet, else
 * the job's, which must match ours where we have them.
 */
static int config_join(struct emb_coord *c, const struct emb_coord_opts *o,
		       int64_t deadline)
{
	char key[KEY_MAX], val[128];
	uint32_t ttl = o->ttl_ms ? o->ttl_ms : TTL_DEFAULT_MS;
	bool logged = false, etcd_logged = false;
	int rc;

	key_of(c, key, "config");
	{
		int n = snprintf(val, sizeof(val),
				 "servers=%u workers=%u ttl_ms=%u replicas=%u",
				 o->server_num, o->worker_num, ttl,
				 o->replicas ? o->replicas : 1);

		if (o->server_max > o->server_num)
			snprintf(val + n, sizeof(val) - (size_t)n,
				 " servers_max=%u", o->server_max);
	}
	for (;;) {
		struct emb_etcd_range r;
		uint32_t s, w, t, rp, m;

		if (o->server_num && o->worker_num) {
			struct emb_etcd_cmp cmp = {.key = key,
						   .target = EMB_ETCD_CREATE};
			struct emb_etcd_op op = {.key = key,
						 .value = val,
						 .value_len = strlen(val)};
			bool ok;

			rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
			if (rc)
				goto etcd_down;
			if (ok)
				emb_log(EMB_LOG_INFO, "job %s: %s", c->prefix,
					val);
		}
		rc = emb_etcd_get(c->etcd, key, false, false, &r);
		if (rc)
			goto etcd_down;
		if (r.n) {
			rc = config_parse(&r.kvs[0], &s, &w, &t, &rp, &m);
			if (rc)
				emb_log(EMB_LOG_ERROR, "job %s: bad config '%s'",
					c->prefix, (char *)r.kvs[0].value);
			emb_etcd_range_free(&r);
			if (rc)
				return rc;
			if ((o->server_num && o->server_num != s) ||
			    (o->worker_num && o->worker_num != w) ||
			    (o->replicas && o->replicas != rp) ||
			    (o->server_max && o->server_max != m)) {
				emb_log(EMB_LOG_ERROR,
					"job %s has %u servers (ranks for %u), "
					"%u workers and %u replicas, not %u "
					"(%u), %u and %u (a stale job? delete "
					"its keys or pick another EMB_JOB)",
					c->prefix, s, m, w, rp, o->server_num,
					o->server_max, o->worker_num,
					o->replicas);
				return EMB_ECLUSTER;
			}
			c->replicas = rp;
			c->start = s;
			c->reg.server_num = m;
			c->reg.worker_num = w;
			c->reg.hb_timeout_ms = t;
			return 0;
		}
		emb_etcd_range_free(&r);
		if ((int64_t)emb_clock_ms() + POLL_MS > deadline)
			return -ETIMEDOUT;
		if (!logged) {
			emb_log(EMB_LOG_INFO,
				"job %s: waiting for a node that knows the "
				"counts (EMB_SERVER_NUM, EMB_WORKER_NUM)",
				c->prefix);
			logged = true;
		}
		if (!nap(c, POLL_MS))
			return -ECANCELED;
		continue;
etcd_down:
		/* etcd coming up after its nodes is normal, as for a
		 * scheduler: wait for it within the join timeout. */
		if (rc != EMB_ENOETCD ||
		    (int64_t)emb_clock_ms() + ETCD_RETRY_MS > deadline)
			return rc;
		if (!etcd_logged) {
			emb_log(EMB_LOG_INFO, "job %s: waiting for etcd %s",
				c->prefix, emb_etcd_endpoint(c->etcd));
			etcd_logged = true;
		}
		if (!nap(c, ETCD_RETRY_MS))
			return -ECANCELED;
	}
}

/*
 * While joining (no lease thread yet): a request etcd did not answer in
 * time is tried again after a nap until the join's deadline, as again()
 * does later. True when worth another try.
 */
static bool again_until(struct emb_coord *c, int rc, int64_t deadline)
{
	return rc == EMB_ENOETCD &&
	       (int64_t)emb_clock_ms() + POLL_MS <= deadline &&
	       nap(c, POLL_MS);
}

/* ---- ranks ---------------------------------------------------------- */

/*
 * True when key is on our lease: a claim etcd applied whose answer came
 * too late for us (its retry then found the key taken).
 */
static bool claimed(struct emb_coord *c, const char *key, int64_t deadline)
{
	struct emb_etcd_range r;
	bool ours;
	int rc;

	do
		rc = emb_etcd_get(c->etcd, key, false, true, &r);
	while (again_until(c, rc, deadline));
	if (rc)
		return false;
	ours = r.n && r.kvs[0].lease == c->lease;
	emb_etcd_range_free(&r);
	return ours;
}

static int64_t rank_in(const char *s, const char *dir, uint32_t count);

/*
 * "h:p,h:p,..." with entry rank replaced by addr, into out (cap bytes).
 * -EINVAL when list has no such entry or out is too small.
 */
static int list_with(const char *list, uint32_t rank, const char *addr,
		     char *out, size_t cap)
{
	const char *p = list;
	size_t at = 0;

	for (uint32_t i = 0; *p || i == 0; i++) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		const char *v = i == rank ? addr : p;
		size_t vlen = i == rank ? strlen(addr) : len;

		if (at + vlen + 2 > cap)
			return -EINVAL;
		if (i)
			out[at++] = ',';
		memcpy(out + at, v, vlen);
		at += vlen;
		if (!e) {
			out[at] = '\0';
			return i >= rank ? 0 : -EINVAL;
		}
		p = e + 1;
	}
	return -EINVAL;
}

/*
 * A server joining a formed job with copies takes a dead server's rank:
 * the lowest r with no server/r key that holds no slot in the map (its
 * death was failed over). Claims server/r on our lease, puts our address
 * in the servers list at r and puts filling/r, in one transaction that
 * holds only while server/r is absent and the map and the list are as
 * read, so that no failover or other newcomer races the claim. The
 * leader fills it from there (recover()). Waits, within the join's
 * deadline, while a rank is dead but not failed over yet.
 */
static int claim_dead_rank(struct emb_coord *c, const char *addr,
			   int64_t deadline)
{
	const uint32_t S = c->reg.server_num;
	size_t cap = (size_t)S * (EMB_HOST_MAX + 9) + 64;
	char *list = malloc(cap), *lv = malloc(cap);
	struct emb_cmap *m = malloc(sizeof(*m));
	uint8_t *taken = calloc(2 * (size_t)S, 1), *marked = taken + S;
	char kmap[KEY_MAX], ksrv[KEY_MAX], kr[KEY_MAX], kw[KEY_MAX],
	    kf[KEY_MAX], kd[KEY_MAX], kl[KEY_MAX], kdr[KEY_MAX], kj[KEY_MAX];
	bool logged = false;
	int rc = -ENOMEM;

	if (!list || !lv || !m || !taken)
		goto out;
	key_of(c, kmap, "map");
	key_of(c, ksrv, "servers");
	for (;;) {
		struct emb_etcd_range r;
		int64_t map_rev = 0, srv_rev = 0;
		size_t plen = strlen(c->prefix);
		uint32_t rank = UINT32_MAX, down = 0;
		bool ok;

		memset(taken, 0, 2 * (size_t)S);
		rc = emb_etcd_get(c->etcd, c->prefix, true, false, &r);
		if (again_until(c, rc, deadline))
			continue;
		if (rc)
			goto out;
		rc = EMB_EBADFRAME;
		for (uint32_t i = 0; i < r.n; i++) {
			const struct emb_etcd_kv *kv = &r.kvs[i];
			const char *k = kv->key + plen;
			int64_t v;

			if ((v = rank_in(k, "server", S)) >= 0) {
				taken[v] = 1;
			} else if ((v = rank_in(k, "dead/server", S)) >= 0) {
				marked[v] = 1;
			} else if (!strcmp(k, "map") && kv->value) {
				map_rev = kv->mod_revision;
				rc = emb_cmap_decode(kv->value, kv->value_len,
						     m);
			} else if (!strcmp(k, "servers") && kv->value &&
				   kv->value_len < cap) {
				srv_rev = kv->mod_revision;
				memcpy(list, kv->value, kv->value_len);
				list[kv->value_len] = '\0';
			}
		}
		emb_etcd_range_free(&r);
		if (rc || !srv_rev || m->nservers != S ||
		    m->replicas != c->replicas) {
			emb_log(EMB_LOG_ERROR, "job %s: bad map or server list "
					       "in etcd", c->prefix);
			rc = EMB_EBADFRAME;
			goto out;
		}
		for (uint32_t i = 0; i < S; i++) {
			if (taken[i])
				continue;
			down++;
			if (!emb_cmap_in_map(m, i) && rank == UINT32_MAX)
				rank = i;
		}
		if (rank == UINT32_MAX && !down) {
			emb_log(EMB_LOG_ERROR,
				"job %s: every server rank (%u) is alive: no "
				"place to take (start the job with ranks to "
				"spare, --server_max, to add servers)",
				c->prefix, S);
			rc = EMB_ECLUSTER;
			goto out;
		}
		if (rank == UINT32_MAX) {
			/* A server whose lease is gone still holds slots
			 * until the leader's next poll fails it over. */
			if (!logged)
				emb_log(EMB_LOG_INFO,
					"job %s: waiting for a dead server's "
					"slots to go to their backups",
					c->prefix);
			logged = true;
			if ((int64_t)emb_clock_ms() + POLL_MS > deadline) {
				rc = -ETIMEDOUT;
				goto out;
			}
			if (!nap(c, POLL_MS)) {
				rc = -ECANCELED;
				goto out;
			}
			continue;
		}
		rc = list_with(list, rank, addr, lv, cap);
		if (rc) {
			emb_log(EMB_LOG_ERROR, "job %s: bad server list in etcd",
				c->prefix);
			rc = EMB_EBADFRAME;
			goto out;
		}
		key_of(c, kr, "server/%u", rank);
		key_of(c, kw, "filling/%u", rank);
		key_of(c, kf, "fill_fails");
		key_of(c, kd, "dead/server/%u", rank);
		key_of(c, kl, "left/server/%u", rank);
		key_of(c, kdr, "drain/%u", rank);
		key_of(c, kj, "joining/%u", rank);
		{
			struct emb_etcd_cmp cmps[3] = {
			    {.key = kr, .target = EMB_ETCD_CREATE},
			    {.key = kmap,
			     .target = EMB_ETCD_MOD,
			     .revision = map_rev},
			    {.key = ksrv,
			     .target = EMB_ETCD_MOD,
			     .revision = srv_rev},
			};
			struct emb_etcd_op ops[8] = {
			    {.key = kr,
			     .value = addr,
			     .value_len = strlen(addr),
			     .lease = c->lease},
			    {.key = ksrv, .value = lv, .value_len = strlen(lv)},
			    {.key = kw, .value = "", .value_len = 0},
			    /* A recovery of an earlier newcomer that died
			     * counted its failed streams: this one's are
			     * its own. */
			    {.key = kf, .del = true},
			    /* Its death is over: the newcomer's own may be
			     * marked again (dead_mark()). */
			    {.key = kd, .del = true},
			    /* A server drained from this rank left it; a
			     * drain or join asked of an earlier holder is
			     * not this one's. */
			    {.key = kl, .del = true},
			    {.key = kdr, .del = true},
			    {.key = kj, .del = true},
			};

			rc = emb_etcd_txn(c->etcd, cmps, 3, ops, 8, &ok);
		}
		/* A claim applied whose answer was lost: the retry finds
		 * the key ours. */
		if (rc == EMB_ENOETCD && claimed(c, kr, deadline)) {
			rc = 0;
			ok = true;
		}
		if (again_until(c, rc, deadline))
			continue;
		if (rc)
			goto out;
		if (!ok) {
			/* The map or the list moved (a fill under way writes
			 * a map every few polls): look again, within the
			 * join's deadline. */
			if ((int64_t)emb_clock_ms() + POLL_MS > deadline) {
				rc = -ETIMEDOUT;
				goto out;
			}
			continue;
		}
		c->reg.rank = rank;
		c->reg.node_id = rank + 1;
		c->reg.role = EMB_ROLE_SERVER;
		if (marked[rank])
			emb_log(EMB_LOG_INFO,
				"job %s: takes dead server %u's place at %s "
				"(map epoch %llu); the leader fills it with "
				"its slots",
				c->prefix, rank, addr,
				(unsigned long long)m->epoch);
		else
			emb_log(EMB_LOG_INFO,
				"job %s: server %u (%s) joins at a free rank "
				"(map epoch %llu); the leader moves its share "
				"of slots to it",
				c->prefix, rank, addr,
				(unsigned long long)m->epoch);
		rc = 0;
		break;
	}
out:
	free(taken);
	free(m);
	free(lv);
	free(list);
	return rc;
}

/* Claims the lowest free rank of our role, on our lease. */
static int claim_rank(struct emb_coord *c, const struct emb_coord_opts *o,
		      int64_t deadline)
{
	/* The job forms with its first servers; ranks to spare past them
	 * are taken by servers that join later (claim_dead_rank()). */
	uint32_t count = o->role == EMB_ROLE_SERVER ? c->start
						    : c->reg.worker_num;
	char key[KEY_MAX], val[EMB_WIRE_HOST_MAX + 16];
	struct emb_etcd_range r;
	int rc;

	if (o->role == EMB_ROLE_SERVER) {
		const char *h = o->host;
		char ip[64];

		/* A wildcard is no address to give others: the one our
		 * connection to etcd came from is, on one interface. */
		if (!h || !*h || !strcmp(h, "0.0.0.0") || !strcmp(h, "::")) {
			emb_etcd_local_ip(c->etcd, ip, sizeof(ip));
			h = ip[0] ? ip : "127.0.0.1";
		}
		snprintf(val, sizeof(val), strchr(h, ':') ? "[%s]:%u" : "%s:%u",
			 h, o->port);
	} else {
		snprintf(val, sizeof(val), "pid %d", (int)getpid());
	}
	snprintf(c->rank_val, sizeof(c->rank_val), "%s", val);
	key_of(c, key, "map");
	do
		rc = emb_etcd_get(c->etcd, key, false, true, &r);
	while (again_until(c, rc, deadline));
	if (rc)
		return rc;
	if (r.n) {
		emb_etcd_range_free(&r);
		/* A server may take a dead server's place in a job with
		 * copies, or a free rank in one with ranks to spare
		 * (claim_dead_rank()); nobody else joins late. */
		if (o->role == EMB_ROLE_SERVER && emb_coord_mapped(c))
			return claim_dead_rank(c, val, deadline);
		emb_log(EMB_LOG_ERROR,
			"job %s formed already: a node cannot join it (a "
			"stale job? delete its keys or pick another EMB_JOB)",
			c->prefix);
		return EMB_ECLUSTER;
	}
	for (uint32_t rank = 0; rank < count; rank++) {
		struct emb_etcd_cmp cmp = {.key = key,
					   .target = EMB_ETCD_CREATE};
		struct emb_etcd_op op = {.key = key,
					 .value = val,
					 .value_len = strlen(val),
					 .lease = c->lease};
		bool ok, retried = false;

		key_of(c, key, "%s/%u", role_dir(o->role), rank);
		for (;;) {
			rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
			if (!again_until(c, rc, deadline))
				break;
			retried = true;
		}
		if (rc)
			return rc;
		if (!ok && retried && claimed(c, key, deadline))
			ok = true;
		if (ok) {
			c->reg.rank = rank;
			c->reg.node_id = rank + 1;
			c->reg.role = o->role;
			return 0;
		}
	}
	emb_log(EMB_LOG_ERROR, "job %s: every %s rank (%u) is taken",
		c->prefix, role_dir(o->role), count);
	return EMB_ECLUSTER;
}

/* ---- the agent ------------------------------------------------------ */

/* Parses "<dir>/<rank>" at s; -1 if it is not that. */
static int64_t rank_in(const char *s, const char *dir, uint32_t count)
{
	size_t n = strlen(dir);
	char *end;
	unsigned long v;

	if (strncmp(s, dir, n) || s[n] != '/' || !s[n + 1])
		return -1;
	v = strtoul(s + n + 1, &end, 10);
	return *end || v >= count ? -1 : (int64_t)v;
}

/* Records a death and tells the watcher, outside the lock. */
static void declare_dead(struct emb_coord *c, uint32_t role, uint32_t rank)
{
	emb_coord_dead_fn fn;
	void *arg;

	pthread_mutex_lock(&c->mu);
	/* A rank a newcomer took may die again: the list grows. */
	if (c->ndead == c->dead_cap) {
		uint32_t cap = 2 * c->dead_cap;
		struct emb_wire_node_ref *d = realloc(c->dead, cap * sizeof(*d));

		if (!d) {
			pthread_mutex_unlock(&c->mu);
			emb_log(EMB_LOG_ERROR, "no memory to record a death");
			return;
		}
		c->dead = d;
		c->dead_cap = cap;
	}
	c->dead[c->ndead++] = (struct emb_wire_node_ref){role, rank};
	fn = c->watch_fn;
	arg = c->watch_arg;
	pthread_mutex_unlock(&c->mu);
	emb_log(EMB_LOG_WARN, "%s %u: %s %u is dead: its etcd lease expired",
		emb_role_name(c->reg.role), c->reg.rank, emb_role_name(role),
		rank);
	if (fn)
		fn(arg, role, rank);
}

/*
 * Agent thread: records in etcd that this node counts role's rank dead,
 * if its rank key is still absent (a transaction: against relet(), which
 * puts the key back only without the mark). 0 and *dead, or an etcd
 * error (the next poll tries again).
 */
static int dead_mark(struct emb_coord *c, uint32_t role, uint32_t rank,
		     bool *dead)
{
	char krank[KEY_MAX], kdead[KEY_MAX];
	struct emb_etcd_cmp cmp = {.key = krank, .target = EMB_ETCD_CREATE};
	struct emb_etcd_op op = {.key = kdead, .value = "", .value_len = 0};

	key_of(c, krank, "%s/%u", role_dir(role), rank);
	key_of(c, kdead, "dead/%s/%u", role_dir(role), rank);
	return emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, dead);
}

static int map_read(struct emb_coord *c, bool *newer);

/* Agent thread: a new map epoch for the watcher. */
static void map_notify(struct emb_coord *c)
{
	struct emb_cmap *m = malloc(sizeof(*m));
	emb_coord_map_fn fn;
	void *arg;

	if (!m)
		return;
	pthread_mutex_lock(&c->mu);
	*m = *c->map;
	fn = c->map_fn;
	arg = c->map_arg;
	pthread_mutex_unlock(&c->mu);
	emb_log(EMB_LOG_INFO, "%s %u: job %s map epoch %llu",
		emb_role_name(c->reg.role), c->reg.rank, c->prefix,
		(unsigned long long)m->epoch);
	if (fn)
		fn(arg, m);
	free(m);
}

/*
 * Writes m as the map, by CAS on the map's mod_revision rev, with
 * ops[0..nops) in the same transaction; *ok says whether it was written.
 * Encoded at m's own size: version 2 while a slot is being filled.
 */
static int map_cas(struct emb_coord *c, const struct emb_cmap *m, int64_t rev,
		   const struct emb_etcd_op *ops, uint32_t nops, bool *ok)
{
	size_t len = emb_cmap_size(m);
	uint8_t *buf = malloc(len);
	struct emb_etcd_op all[9];
	char key[KEY_MAX];
	int rc;

	*ok = false;
	if (!buf || nops > 8) {
		free(buf);
		return buf ? -EINVAL : -ENOMEM;
	}
	if (emb_cmap_encode(m, buf, len) != (int64_t)len) {
		free(buf);
		return EMB_EINTERNAL;
	}
	key_of(c, key, "map");
	all[0] = (struct emb_etcd_op){.key = key, .value = buf, .value_len = len};
	for (uint32_t i = 0; i < nops; i++)
		all[1 + i] = ops[i];
	{
		struct emb_etcd_cmp cmp = {
		    .key = key, .target = EMB_ETCD_MOD, .revision = rev};

		rc = emb_etcd_txn(c->etcd, &cmp, 1, all, 1 + nops, ok);
	}
	free(buf);
	return rc;
}

/*
 * Agent thread of the live server of lowest rank: the map without the
 * dead servers (live[r] == 0) that still hold slots, written by CAS on the
 * map's mod_revision. Losing the race is fine: the next poll reads the
 * winner's map and finds nothing left to do.
 */
static int failover(struct emb_coord *c, const uint8_t *live)
{
	const uint32_t S = c->reg.server_num;
	struct emb_cmap *m = malloc(sizeof(*m));
	uint64_t epoch0;
	int64_t rev;
	int lost = 0, rc = -ENOMEM;
	bool ok;

	if (!m)
		goto out;
	pthread_mutex_lock(&c->mu);
	*m = *c->map;
	rev = c->map_rev;
	pthread_mutex_unlock(&c->mu);
	epoch0 = m->epoch;
	for (uint32_t r = 0; r < S; r++) {
		/* Holding nothing but being filled counts: a newcomer that
		 * died before its first chunk was done leaves a fill that
		 * only its removal drops. */
		if (live[r] || !emb_cmap_in_map(m, r))
			continue;
		lost = emb_cmap_remove(m, r, m);
		emb_log(EMB_LOG_WARN,
			"server %u: server %u is dead: its slots go to their "
			"backups (map epoch %llu)",
			c->reg.rank, r, (unsigned long long)m->epoch);
	}
	rc = 0;
	if (m->epoch == epoch0)
		goto out; /* nothing to do */
	if (lost > 0)
		emb_log(EMB_LOG_ERROR,
			"server %u: %u slots have no live holder: their rows "
			"are lost",
			c->reg.rank, emb_cmap_lost_slots(m));
	rc = map_cas(c, m, rev, NULL, 0, &ok);
	if (!rc && !ok)
		emb_log(EMB_LOG_DEBUG, "job %s: map changed under failover",
			c->prefix);
out:
	free(m);
	return rc;
}

/* ---- recovery: a newcomer filled, chunk by chunk --------------------- */

/*
 * Reads the short value of P name into buf (cap bytes, NUL-terminated)
 * and its mod_revision. 0, -ENOENT (no such key), or an etcd error.
 */
static int small_get(struct emb_coord *c, const char *name, char *buf,
		     size_t cap, int64_t *rev)
{
	char key[KEY_MAX];
	struct emb_etcd_range r;
	int rc;

	key_of(c, key, "%s", name);
	rc = emb_etcd_get(c->etcd, key, false, false, &r);
	if (rc)
		return rc;
	if (!r.n || !r.kvs[0].value) {
		emb_etcd_range_free(&r);
		return -ENOENT;
	}
	snprintf(buf, cap, "%.*s",
		 (int)(r.kvs[0].value_len < cap ? r.kvs[0].value_len : cap - 1),
		 (const char *)r.kvs[0].value);
	*rev = r.kvs[0].mod_revision;
	emb_etcd_range_free(&r);
	return 0;
}

/*
 * Leader, after the fails-th failed stream in a row: the next chunk waits
 * 0.5 s, doubled with each failure, at most a TTL. A target that died
 * refuses every stream at once while its lease lives (up to a TTL): begun
 * again at once, its chunk would use up FILL_TRIES in milliseconds and
 * give the job's moves or recovery up before anyone could count it dead.
 */
static void retry_after(struct emb_coord *c, uint32_t fails)
{
	int64_t wait = 500;

	for (uint32_t i = 1; i < fails && wait < c->reg.hb_timeout_ms; i++)
		wait *= 2;
	if (wait > (int64_t)c->reg.hb_timeout_ms)
		wait = c->reg.hb_timeout_ms;
	c->plan_after = (int64_t)emb_clock_ms() + wait;
}

/* ---- the move key: what observers are shown -------------------------- */

/* Milliseconds of the wall clock: a move's start, read by observers on
 * other machines (a monotonic clock means nothing there). */
static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Leader: ops[*nops] adds the rows and bytes of the report this step took
 * (add_rows, add_bytes) to the move key, if there is one and they are
 * not 0. key and val are the caller's (they live until the transaction).
 */
static void move_add(struct emb_coord *c, struct emb_etcd_op *ops,
		     uint32_t *nops, char *key, char *val, size_t cap)
{
	char kind[16];
	unsigned rank, slots;
	unsigned long long t0, rows = 0, bytes = 0;
	int k;

	if (!c->move_val[0] || (!c->add_rows && !c->add_bytes))
		return;
	k = sscanf(c->move_val, "%15s %u %llu %u %llu %llu", kind, &rank, &t0,
		   &slots, &rows, &bytes);
	if (k != 4 && k != 6)
		return;
	key_of(c, key, "move");
	snprintf(val, cap, "%s %u %llu %u %llu %llu", kind, rank, t0, slots,
		 rows + c->add_rows, bytes + c->add_bytes);
	ops[(*nops)++] = (struct emb_etcd_op){
	    .key = key, .value = val, .value_len = strlen(val)};
}

/*
 * Leader: ops[*nops] puts the move key for the drain, join or recovery
 * ("drain", "join", "recovery") of rank, with left slots to move, unless
 * the key says that one already: its start and its slots then stay those
 * of its first chunk, whichever leader planned it, and the rows and bytes
 * streamed grow by the step's report (move_add()). key and val are the
 * caller's (they live until the transaction).
 */
static void move_put(struct emb_coord *c, const char *kind, uint32_t rank,
		     uint32_t left, struct emb_etcd_op *ops, uint32_t *nops,
		     char *key, char *val, size_t cap)
{
	char head[32];

	snprintf(head, sizeof(head), "%s %u ", kind, rank);
	if (!strncmp(c->move_val, head, strlen(head))) {
		move_add(c, ops, nops, key, val, cap);
		return;
	}
	key_of(c, key, "move");
	snprintf(val, cap, "%s%llu %u 0 0", head,
		 (unsigned long long)wall_ms(), left);
	ops[(*nops)++] = (struct emb_etcd_op){
	    .key = key, .value = val, .value_len = strlen(val)};
}

/* Leader: ops[*nops] deletes the move key, if there is one. */
static void move_del(struct emb_coord *c, struct emb_etcd_op *ops,
		     uint32_t *nops, char *key)
{
	if (!c->move_val[0])
		return;
	key_of(c, key, "move");
	ops[(*nops)++] = (struct emb_etcd_op){.key = key, .del = true};
}

/* The chunk being filled in m: its rank, first slot and length; false
 * when none is. One chunk at a time: the leader begins no other. */
static bool fill_under_way(const struct emb_cmap *m, uint32_t *rank,
			   uint32_t *first, uint32_t *n)
{
	*n = emb_cmap_fill_run(m, first, rank);
	return *n > 0;
}

/*
 * Leader: writes the map m (read at rev) with the next step of rank's
 * fill: its next chunk, from slot from on, or, when rank holds every slot
 * it should, the fill's end: the rebalance that gives it its primaries,
 * written with filling/<rank> and fill_fails deleted. done_rev (0: none):
 * the fill_done key goes in the same transaction.
 */
static int fill_step(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		     uint32_t rank, uint32_t from, int64_t done_rev)
{
	char kfill[KEY_MAX], kdone[KEY_MAX], kwait[KEY_MAX], kfails[KEY_MAX],
	    kjoin[KEY_MAX], kmove[KEY_MAX], val[96], mval[96];
	struct emb_etcd_op ops[7];
	uint32_t nops = 0, first = from % EMB_NSLOTS;
	int n = emb_cmap_fill_next(m, rank, FILL_CHUNK_SLOTS, &first);
	int rb = 0, rc;
	bool ok;

	key_of(c, kfill, "fill");
	key_of(c, kdone, "fill_done");
	key_of(c, kwait, "filling/%u", rank);
	key_of(c, kfails, "fill_fails");
	key_of(c, kjoin, "joining/%u", rank);
	if (n < 0) {
		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
	} else if (n > 0) {
		emb_cmap_fill_begin(m, rank, first, (uint32_t)n, m);
		snprintf(val, sizeof(val), "%u %u %d %llu", rank, first, n,
			 (unsigned long long)m->epoch);
		ops[nops++] = (struct emb_etcd_op){
		    .key = kfill, .value = val, .value_len = strlen(val)};
		move_put(c, "recovery", rank, 0, ops, &nops, kmove, mval,
			 sizeof(mval));
	} else {
		rb = emb_cmap_rebalance(m, m);
		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kwait, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
		/* A rank that never held anything, or was drained, holds
		 * little now: moves give it its share (R + 1 writers, so
		 * not with the most copies a map lists), as the scheduler
		 * does after a fill. */
		if (m->replicas < EMB_CMAP_REPLICAS_MAX)
			ops[nops++] = (struct emb_etcd_op){
			    .key = kjoin, .value = "", .value_len = 0};
	}
	if (n <= 0)
		move_del(c, ops, &nops, kmove);
	if (done_rev)
		ops[nops++] = (struct emb_etcd_op){.key = kdone, .del = true};
	rc = map_cas(c, m, rev, ops, nops, &ok);
	if (rc || !ok)
		return rc; /* lost the race: the next poll looks again */
	if (n > 0)
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u is being filled with slots "
			"%u-%u from server %u",
			(unsigned long long)m->epoch, rank, first,
			first + (uint32_t)n - 1, emb_cmap_primary(m, first));
	else if (n == 0 && emb_cmap_in_map(m, rank))
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u is a full replica; %d "
			"primary slot%s rebalanced, it is primary of %u",
			(unsigned long long)m->epoch, rank, rb > 0 ? rb : 0,
			rb == 1 ? "" : "s", emb_cmap_primary_slots(m, rank));
	else if (n == 0)
		emb_log(EMB_LOG_INFO,
			"server %u: no slot is short of copies; moves give "
			"it its share",
			rank);
	return 0;
}

/*
 * Leader: the stream of chunk first..first+n-1 to rank failed (its source
 * said so, or said nothing for FILL_TIMEOUT_MS): a recovery's fill or,
 * with move, a move's fenced stream. The chunk is given up in a map of
 * its own (the next poll begins it again, after retry_after()'s wait) and
 * the failures in a row are counted in fill_fails ("rank count"). At
 * FILL_TRIES the work is given up, as the scheduler gives it up: a
 * recovery's filling/r goes (r keeps the slots it got), or every drain
 * and join asked for ends where it is. done_rev as fill_step()'s.
 */
static int fill_fail(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		     uint32_t rank, uint32_t first, uint32_t n,
		     int64_t done_rev, bool move)
{
	char kfill[KEY_MAX], kdone[KEY_MAX], kwait[KEY_MAX], kfails[KEY_MAX],
	    kd[KEY_MAX], kj[KEY_MAX], kmove[KEY_MAX], v[64];
	struct emb_etcd_op ops[7];
	uint32_t nops = 0, fr, fails = 0;
	int64_t frev;
	bool ok;
	int rc;

	rc = small_get(c, "fill_fails", v, sizeof(v), &frev);
	if (rc && rc != -ENOENT)
		return rc; /* etcd did not answer: the next poll looks again */
	if (!rc && (sscanf(v, "%u %u", &fr, &fails) != 2 || fr != rank))
		fails = 0;
	fails++;
	key_of(c, kfill, "fill");
	key_of(c, kdone, "fill_done");
	key_of(c, kwait, "filling/%u", rank);
	key_of(c, kfails, "fill_fails");
	key_of(c, kd, "drain/");
	key_of(c, kj, "joining/");
	emb_cmap_fill_abort(m, rank, first, n, m);
	ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
	if (fails < FILL_TRIES) {
		snprintf(v, sizeof(v), "%u %u", rank, fails);
		ops[nops++] = (struct emb_etcd_op){
		    .key = kfails, .value = v, .value_len = strlen(v)};
	} else if (move) {
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
		ops[nops++] =
		    (struct emb_etcd_op){.key = kd, .del = true, .prefix = true};
		ops[nops++] =
		    (struct emb_etcd_op){.key = kj, .del = true, .prefix = true};
	} else {
		ops[nops++] = (struct emb_etcd_op){.key = kwait, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
	}
	if (fails >= FILL_TRIES)
		move_del(c, ops, &nops, kmove);
	if (done_rev)
		ops[nops++] = (struct emb_etcd_op){.key = kdone, .del = true};
	rc = map_cas(c, m, rev, ops, nops, &ok);
	if (rc || !ok)
		return rc; /* lost the race: the next poll looks again */
	retry_after(c, fails);
	if (move)
		emb_log(fails >= FILL_TRIES ? EMB_LOG_ERROR : EMB_LOG_WARN,
			"map epoch %llu: the move of slots %u-%u to server %u "
			"failed%s",
			(unsigned long long)m->epoch, first, first + n - 1,
			rank,
			fails >= FILL_TRIES
			    ? ": moves given up after 8 failed streams; the "
			      "drains and joins asked for end where they are"
			    : ": moved again after a wait");
	else if (fails >= FILL_TRIES)
		emb_log(EMB_LOG_ERROR,
			"server %u: recovery given up after %u failed "
			"streams; it keeps the %u slots it got",
			rank, fails, emb_cmap_primary_slots(m, rank));
	return 0;
}

/* ---- joins and drains: moves, chunk by chunk ------------------------ */

/* The leader's view of the job's keys, from one poll (poll_job()). */
struct job_keys {
	const uint8_t *live;	 /* [S] server rank key present */
	const uint8_t *waiting;	 /* [S] filling/<r> */
	const uint8_t *joining;	 /* [S] joining/<r> */
	const uint8_t *draining; /* [S] drain/<r> */
	bool have_done;		 /* fill_done exists */
	bool have_move;		 /* move exists */
};

/* The step under way, as the fill key says it: kind 'f' a recovery's
 * fill, 'w' a move's copy ahead, 'm' its fenced stream; from, a move's
 * source (whose place the target takes). */
struct step {
	uint32_t rank, first, n, from;
	unsigned long long epoch;
	char kind;
};

/* Parses the fill key's value; false when it is not one. The kind and
 * source are optional: a fill written before moves existed has none. */
static bool step_parse(const char *v, struct step *st)
{
	int k;

	st->kind = 'f';
	st->from = UINT32_MAX;
	k = sscanf(v, "%u %u %u %llu %c %u", &st->rank, &st->first, &st->n,
		   &st->epoch, &st->kind, &st->from);
	return (k == 4 || k == 6) &&
	       (st->kind == 'f' || st->kind == 'w' || st->kind == 'm');
}

/* The first run of slots copied ahead to one server in m: its length,
 * *first and *to; 0 when none is. */
static uint32_t warm_run(const struct emb_cmap *m, uint32_t *first,
			 uint32_t *to)
{
	for (uint32_t r = 0; r < m->nservers; r++) {
		uint32_t n = emb_cmap_warm_source(m, r, first, to);

		if (n)
			return n;
	}
	return 0;
}

/* Slots rank holds, primary or backup. */
static uint32_t held(const struct emb_cmap *m, uint32_t rank)
{
	uint32_t k[3];

	emb_cmap_rank_slots(m, rank, k);
	return k[0] + k[1];
}

/* Slots a join of j has still to move: its share (the copies over the
 * servers holding any, j included, as emb_cmap_join_next() counts it)
 * less what it holds; a drain of d: all it holds. */
static uint32_t move_left(const struct emb_cmap *m, uint32_t d, uint32_t j)
{
	uint32_t total = 0, nlive = 0, share;

	if (d != UINT32_MAX)
		return held(m, d);
	for (uint32_t r = 0; r < m->nservers; r++) {
		uint32_t h = held(m, r);

		total += h;
		nlive += h > 0 || r == j;
	}
	share = nlive ? total / nlive : 0;
	return share > held(m, j) ? share - held(m, j) : 0;
}

/*
 * Leader, with no chunk under way in m (read at rev): the next step of a
 * recovery, drain or join, in the scheduler's order: a newcomer waiting
 * to be filled, then drains (a server waiting to leave holds its
 * machine), then joins; with none, the primaries spread. Each chunk of a
 * move starts with its copy ahead (warm[]): the fence then waits only for
 * the rows written meanwhile. from: where the next chunk's search starts;
 * done_rev as fill_step()'s (the report of the chunk just ended goes in
 * the same transaction).
 */
static int plan(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		const struct job_keys *k, uint32_t from, int64_t done_rev,
		bool moved)
{
	const uint32_t S = c->reg.server_num;
	char kfill[KEY_MAX], kdone[KEY_MAX], kkey[KEY_MAX], kfails[KEY_MAX],
	    kmove[KEY_MAX], val[96], mval[96];
	/* At most: the report, fill_fails, two keys of the outcome, the
	 * fill key and the move key. */
	struct emb_etcd_op ops[6];
	uint32_t nops = 0, d = UINT32_MAX, j = UINT32_MAX, src = 0, to = 0;
	uint32_t first = from % EMB_NSLOTS;
	bool ok;
	int n, rc;

	/* A stream just failed: the next chunk waits (retry_after()). A
	 * step that just ended (done_rev) cleared the wait. */
	if (!done_rev && (int64_t)emb_clock_ms() < c->plan_after)
		return 0;
	for (uint32_t r = 0; r < S; r++)
		if (k->waiting[r] && k->live[r])
			return fill_step(c, m, rev, r, 0, done_rev);
	key_of(c, kfill, "fill");
	key_of(c, kdone, "fill_done");
	key_of(c, kfails, "fill_fails");
	if (done_rev)
		ops[nops++] = (struct emb_etcd_op){.key = kdone, .del = true};
	/* A chunk moved: the failed streams counted are not in a row. */
	if (moved)
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
	for (uint32_t r = 0; r < S && d == UINT32_MAX; r++)
		if (k->draining[r] && k->live[r] && emb_cmap_in_map(m, r))
			d = r;
	/* A joiner asked to drain meanwhile joins no more. */
	for (uint32_t r = 0; r < S && d == UINT32_MAX && j == UINT32_MAX; r++)
		if (k->joining[r] && k->live[r] && !k->draining[r])
			j = r;
	if (d != UINT32_MAX) {
		bool *okr = calloc(S, sizeof(*okr));

		if (!okr)
			return -ENOMEM;
		/* To any live server staying, the least loaded. */
		for (uint32_t r = 0; r < S; r++)
			okr[r] = k->live[r] && !k->draining[r];
		src = d;
		n = emb_cmap_drain_next(m, d, okr, FILL_CHUNK_SLOTS, &first,
					&to);
		free(okr);
		if (n == -ENOSPC) {
			/* The drain is dropped with the map of the step
			 * that just ended, if any, in one transaction. */
			emb_log(EMB_LOG_ERROR,
				"server %u cannot be drained: every server "
				"staying holds a copy of some of its slots "
				"already (%u copies of each slot need %u "
				"servers)",
				d, m->replicas, m->replicas);
			key_of(c, kkey, "drain/%u", d);
			ops[nops++] =
			    (struct emb_etcd_op){.key = kkey, .del = true};
			ops[nops++] =
			    (struct emb_etcd_op){.key = kfill, .del = true};
			move_del(c, ops, &nops, kmove);
			return map_cas(c, m, rev, ops, nops, &ok);
		}
	} else if (j != UINT32_MAX) {
		uint32_t f0 = 0;

		if (emb_cmap_fill_next(m, j, FILL_CHUNK_SLOTS, &f0) > 0) {
			/* A server died during the join: the joiner takes
			 * the slots left short of copies first, as a
			 * newcomer at a dead rank does; the alternative
			 * leaves them a death away from lost. */
			char kw[KEY_MAX];

			key_of(c, kw, "filling/%u", j);
			key_of(c, kkey, "joining/%u", j);
			ops[nops++] = (struct emb_etcd_op){
			    .key = kw, .value = "", .value_len = 0};
			ops[nops++] =
			    (struct emb_etcd_op){.key = kkey, .del = true};
			ops[nops++] =
			    (struct emb_etcd_op){.key = kfill, .del = true};
			rc = map_cas(c, m, rev, ops, nops, &ok);
			if (!rc && ok)
				emb_log(EMB_LOG_INFO,
					"server %u, joining, is filled with "
					"the slots short of copies first",
					j);
			return rc;
		}
		to = j;
		n = emb_cmap_join_next(m, j, FILL_CHUNK_SLOTS, &first, &src);
		/* Never from a server being drained: it is going. */
		if (n > 0 && src < S && k->draining[src])
			n = 0;
	} else {
		/* Nothing to move: the map of the step just ended, if any,
		 * with its report and record deleted (and the move key of a
		 * join whose server died). */
		move_del(c, ops, &nops, kmove);
		if (!nops)
			return 0;
		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
		return map_cas(c, m, rev, ops, nops, &ok);
	}
	if (n < 0) {
		emb_log(EMB_LOG_ERROR, "cannot plan a move: %s",
			emb_strerror(n));
		/* The step that just ended is written all the same. */
		if (nops) {
			ops[nops++] =
			    (struct emb_etcd_op){.key = kfill, .del = true};
			(void)map_cas(c, m, rev, ops, nops, &ok);
		}
		return n;
	}
	if (n == 0) {
		/* The drained server holds nothing (it leaves by itself,
		 * poll_job()), or the joiner has its share. */
		int rb = emb_cmap_rebalance(m, m);

		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
		move_del(c, ops, &nops, kmove);
		if (d != UINT32_MAX) {
			emb_log(EMB_LOG_INFO,
				"map epoch %llu: server %u drained",
				(unsigned long long)m->epoch, d);
			return map_cas(c, m, rev, ops, nops, &ok);
		}
		key_of(c, kkey, "joining/%u", j);
		ops[nops++] = (struct emb_etcd_op){.key = kkey, .del = true};
		rc = map_cas(c, m, rev, ops, nops, &ok);
		if (!rc && ok)
			emb_log(EMB_LOG_INFO,
				"map epoch %llu: server %u has its share: %u "
				"slots (%d primary slot%s rebalanced, it is "
				"primary of %u)",
				(unsigned long long)m->epoch, j, held(m, j),
				rb > 0 ? rb : 0, rb == 1 ? "" : "s",
				emb_cmap_primary_slots(m, j));
		return rc;
	}
	{
		uint32_t left = move_left(m, d, j);

		emb_cmap_warm_end(m, m);
		emb_cmap_warm_begin(m, src, to, first, (uint32_t)n, m);
		snprintf(val, sizeof(val), "%u %u %d %llu w %u", to, first, n,
			 (unsigned long long)m->epoch, src);
		ops[nops++] = (struct emb_etcd_op){
		    .key = kfill, .value = val, .value_len = strlen(val)};
		move_put(c, d != UINT32_MAX ? "drain" : "join",
			 d != UINT32_MAX ? d : j, left, ops, &nops, kmove, mval,
			 sizeof(mval));
		rc = map_cas(c, m, rev, ops, nops, &ok);
		if (!rc && ok)
			emb_log(EMB_LOG_INFO,
				"map epoch %llu: slots %u-%u move from server "
				"%u to server %u, copied ahead by server %u; "
				"%s of server %u: %u to go",
				(unsigned long long)m->epoch, first,
				first + (uint32_t)n - 1, src, to,
				emb_cmap_primary(m, first),
				d != UINT32_MAX ? "drain" : "join",
				d != UINT32_MAX ? d : j, left);
	}
	return rc;
}

/*
 * Leader: the move of st's chunk is copied ahead (or its copy failed:
 * the fenced stream then sends the whole chunk): the chunk is fenced and
 * its source streams what changed since the copy began.
 */
static int fence(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		 const struct step *st, int64_t done_rev, const char *why)
{
	char kfill[KEY_MAX], kdone[KEY_MAX], kmove[KEY_MAX], val[96],
	    mval[96];
	struct emb_etcd_op ops[3];
	uint32_t nops = 0;
	bool ok;
	int rc;

	emb_cmap_move_begin(m, st->from, st->rank, st->first, st->n, m);
	move_add(c, ops, &nops, kmove, mval, sizeof(mval));
	key_of(c, kfill, "fill");
	key_of(c, kdone, "fill_done");
	snprintf(val, sizeof(val), "%u %u %u %llu m %u", st->rank, st->first,
		 st->n, (unsigned long long)m->epoch, st->from);
	ops[nops++] = (struct emb_etcd_op){
	    .key = kfill, .value = val, .value_len = strlen(val)};
	if (done_rev)
		ops[nops++] = (struct emb_etcd_op){.key = kdone, .del = true};
	rc = map_cas(c, m, rev, ops, nops, &ok);
	if (!rc && ok)
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: slots %u-%u fenced for the last of "
			"their move to server %u%s%s, streamed by server %u",
			(unsigned long long)m->epoch, st->first,
			st->first + st->n - 1, st->rank, why ? ": " : "",
			why ? why : "", emb_cmap_primary(m, st->first));
	return rc;
}

/*
 * Leader: the fenced stream of a move is done: the target takes its
 * source's place among the chunk's holders (the map drops a writer,
 * never adds one, so writes in flight lose nothing), and the next chunk
 * is planned in the same map.
 */
static int move_done(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		     const struct step *st, const struct job_keys *k,
		     int64_t done_rev)
{
	emb_cmap_move_done(m, st->from, st->rank, st->first, st->n, m);
	c->plan_after = 0;
	emb_log(EMB_LOG_DEBUG,
		"map epoch %llu: server %u holds slots %u-%u in server %u's "
		"place",
		(unsigned long long)m->epoch, st->rank, st->first,
		st->first + st->n - 1, st->from);
	if (st->from < c->reg.server_num && k->draining[st->from] &&
	    !emb_cmap_in_map(m, st->from)) {
		/* Drained: the primaries spread over those staying. The
		 * server stays one TTL longer, answering, and then leaves
		 * (poll_job()): a write a client routed to it by an older
		 * map is refused there and sent again by the newer one. */
		int rb = emb_cmap_rebalance(m, m);

		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u drained (%d primary slot%s "
			"rebalanced): it holds no slot and leaves in %u ms",
			(unsigned long long)m->epoch, st->from,
			rb > 0 ? rb : 0, rb == 1 ? "" : "s",
			c->reg.hb_timeout_ms);
	}
	return plan(c, m, rev, k, st->first + st->n, done_rev, true);
}

/*
 * Agent thread of the leader (the live server of lowest rank), in a
 * mapped job (copies, or ranks to spare): the next step of a recovery,
 * a join or a drain, kept in etcd so that a new leader goes on where the
 * last one stopped (docs/coordinator.md). With a chunk under way: the
 * source's fill_done ends that step (a fill's chunk done or begun again;
 * a copy ahead fenced; a fenced move done or begun again) and plans the
 * next; without one, plan(). The steps are the scheduler's map functions;
 * a death in between is failover()'s (emb_cmap_remove() drops a fill
 * whose source or target died), and a copy ahead whose server died ends
 * here.
 */
static int steps(struct emb_coord *c, const struct job_keys *k)
{
	const uint32_t S = c->reg.server_num;
	struct emb_cmap *m = malloc(sizeof(*m));
	uint32_t t, first, n;
	struct step st = {0};
	char v[128];
	int64_t rev, vrev, frev;
	bool warm = false, have_step;
	int rc = 0;

	if (!m)
		return -ENOMEM;
	/* The move key's value (the poll reads keys only): the steps below
	 * keep it, or replace or delete it. */
	c->move_val[0] = '\0';
	c->add_rows = c->add_bytes = 0;
	if (k->have_move) {
		rc = small_get(c, "move", c->move_val, sizeof(c->move_val),
			       &vrev);
		if (rc == -ENOENT)
			rc = 0;
		if (rc) {
			free(m);
			return rc;
		}
	}
	pthread_mutex_lock(&c->mu);
	*m = *c->map;
	rev = c->map_rev;
	pthread_mutex_unlock(&c->mu);
	n = emb_cmap_fill_run(m, &first, &t);
	if (!n) {
		n = warm_run(m, &first, &t);
		warm = n > 0;
	}
	if (!n) {
		rc = plan(c, m, rev, k, 0, 0, false);
		goto out;
	}
	if (t >= S || (!warm && !k->live[t]))
		goto out; /* failover() drops it */
	/* The step, as the map that began it wrote it: which kind, from
	 * where, at what epoch (a report of an older stream of the same
	 * chunk is not its). */
	rc = small_get(c, "fill", v, sizeof(v), &frev);
	if (rc && rc != -ENOENT)
		goto out;
	have_step = !rc && step_parse(v, &st) && st.rank == t &&
		    st.first == first && st.n == n;
	rc = 0;
	if (!have_step) {
		st = (struct step){.rank = t, .first = first, .n = n,
				   .from = UINT32_MAX, .kind = 'f'};
	}
	if (warm && (st.kind != 'w' || st.from >= S || !k->live[st.from] ||
		     !k->live[t] || emb_cmap_primary(m, first) >= S ||
		     !k->live[emb_cmap_primary(m, first)])) {
		/* A copy ahead whose target, source or streamer died (or
		 * whose step is not on record): it ends, and the next poll
		 * plans the move again from the servers left. */
		char kfill[KEY_MAX];
		struct emb_etcd_op op = {.key = kfill, .del = true};
		bool ok;

		key_of(c, kfill, "fill");
		emb_cmap_warm_end(m, m);
		rc = map_cas(c, m, rev, &op, 1, &ok);
		if (!rc && ok)
			emb_log(EMB_LOG_WARN,
				"map epoch %llu: the move of slots %u-%u to "
				"server %u is given up (a server it needs "
				"died): planned again",
				(unsigned long long)m->epoch, first,
				first + n - 1, t);
		goto out;
	}
	if (st.kind == 'm' && st.from >= S)
		st.kind = 'f'; /* no source on record: a fill, as before */
	{
		uint32_t dr, df, dn;
		unsigned long long de, drows = 0, dbytes = 0;
		int status, k_done;

		rc = k->have_done
			 ? small_get(c, "fill_done", v, sizeof(v), &vrev)
			 : -ENOENT;
		if (rc == -ENOENT) {
			rc = 0;
			/* No word from the source: a chunk stuck past the
			 * timeout begins again (a new leader starts the
			 * clock again). */
			if (c->watch_rank != t || c->watch_first != first ||
			    c->watch_epoch != st.epoch) {
				c->watch_rank = t;
				c->watch_first = first;
				c->watch_epoch = st.epoch;
				c->watch_since = (int64_t)emb_clock_ms();
				goto out;
			}
			if ((int64_t)emb_clock_ms() - c->watch_since <=
			    FILL_TIMEOUT_MS)
				goto out;
			emb_log(EMB_LOG_WARN,
				"the %s of slots %u-%u to server %u had no "
				"word from its source in %d s",
				st.kind == 'f'	 ? "fill"
				: st.kind == 'w' ? "copy ahead"
						 : "move",
				first, first + n - 1, t,
				FILL_TIMEOUT_MS / 1000);
			c->watch_rank = UINT32_MAX;
			rc = st.kind == 'w'
				 ? fence(c, m, rev, &st, 0,
					 "without a copy ahead")
				 : fill_fail(c, m, rev, t, first, n, 0,
					     st.kind == 'm');
			goto out;
		}
		if (rc)
			goto out;
		k_done = sscanf(v, "%u %u %u %llu %d %llu %llu", &dr, &df, &dn,
				&de, &status, &drows, &dbytes);
		if ((k_done != 5 && k_done != 7) ||
		    dr != emb_cmap_primary(m, first) || df != first ||
		    dn != n || (de < st.epoch && st.kind != 'w')) {
			/* Not this chunk's: an older stream's report. (A
			 * copy ahead's counts whatever its epoch, as the
			 * scheduler counts it.) */
			char kdone[KEY_MAX];
			struct emb_etcd_cmp cmp = {.key = kdone,
						   .target = EMB_ETCD_MOD,
						   .revision = vrev};
			struct emb_etcd_op op = {.key = kdone, .del = true};
			bool ok;

			key_of(c, kdone, "fill_done");
			rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
			goto out;
		}
		c->watch_rank = UINT32_MAX;
		/* What it streamed goes into the move key (an older
		 * server's report says nothing of it). */
		if (!status && k_done == 7) {
			c->add_rows = drows;
			c->add_bytes = dbytes;
		}
		if (st.kind == 'w') {
			if (status)
				emb_log(EMB_LOG_WARN,
					"the copy ahead of slots %u-%u to "
					"server %u failed: %s",
					first, first + n - 1, t,
					emb_strerror(status));
			rc = fence(c, m, rev, &st, vrev,
				   status ? "without a copy ahead" : NULL);
		} else if (st.kind == 'm') {
			if (status)
				emb_log(EMB_LOG_WARN,
					"server %u could not stream slots "
					"%u-%u to server %u (%s)",
					dr, first, first + n - 1, t,
					emb_strerror(status));
			rc = status ? fill_fail(c, m, rev, t, first, n, vrev,
						true)
				    : move_done(c, m, rev, &st, k, vrev);
		} else if (status) {
			emb_log(EMB_LOG_WARN,
				"server %u could not stream slots %u-%u to "
				"server %u (%s): filling them again",
				dr, first, first + n - 1, t,
				emb_strerror(status));
			rc = fill_fail(c, m, rev, t, first, n, vrev, false);
		} else {
			emb_cmap_fill_done(m, t, first, n, m);
			rc = fill_step(c, m, rev, t, first + n, vrev);
		}
	}
out:
	free(m);
	return rc;
}

bool emb_coord_server_live(struct emb_coord *c, uint32_t rank)
{
	bool live;

	if (rank >= c->reg.server_num)
		return false;
	pthread_mutex_lock(&c->mu);
	live = c->srv_live[rank];
	pthread_mutex_unlock(&c->mu);
	return live;
}

bool emb_coord_mapped(const struct emb_coord *c)
{
	return c->replicas >= 2 || c->reg.server_num > c->start;
}

/*
 * Puts drain/<rank> in the job at prefix on e, if the job can move slots
 * and rank has a live server: the checks of the scheduler's DRAIN. self:
 * the asking server's own rank (it counts as live whatever it read).
 */
static int drain_ask(struct emb_etcd *e, const char *prefix, uint32_t rank,
		     char *why, size_t cap)
{
	size_t plen = strlen(prefix);
	struct emb_etcd_range r;
	uint32_t s = 0, w, t, rp = 0, M = 0, staying = 0;
	int64_t crev = 0;
	uint8_t *live = NULL, *drain = NULL;
	bool formed = false, have_config = false, ok;
	char kr[KEY_MAX], kd[KEY_MAX];
	int rc;

	why[0] = '\0';
	rc = emb_etcd_get(e, prefix, true, true, &r);
	if (rc)
		return rc;
	/* The config's value: the keys-only read above has none. */
	{
		struct emb_etcd_range cr;

		snprintf(kr, sizeof(kr), "%sconfig", prefix);
		rc = emb_etcd_get(e, kr, false, false, &cr);
		if (rc) {
			emb_etcd_range_free(&r);
			return rc;
		}
		have_config = cr.n && !config_parse(&cr.kvs[0], &s, &w, &t,
						    &rp, &M);
		emb_etcd_range_free(&cr);
	}
	if (!have_config) {
		snprintf(why, cap, "no job at %s", prefix);
		rc = EMB_ECLUSTER;
		goto out;
	}
	live = calloc(M, 1);
	drain = calloc(M, 1);
	if (!live || !drain) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < r.n; i++) {
		const char *k = r.kvs[i].key + plen;
		int64_t v;

		if ((v = rank_in(k, "server", M)) >= 0) {
			live[v] = 1;
			if ((uint32_t)v == rank)
				crev = r.kvs[i].create_revision;
		} else if ((v = rank_in(k, "drain", M)) >= 0) {
			drain[v] = 1;
		} else if (!strcmp(k, "map")) {
			formed = true;
		}
	}
	rc = EMB_ECLUSTER;
	if (!formed) {
		snprintf(why, cap, "the job is not running (no map yet)");
		goto out;
	}
	/* Unmapped, clients route by primaries alone and send writes no
	 * epoch: a move's fence and new writer would go unseen. A move has
	 * R + 1 writers, which a map of the most copies cannot list. */
	if ((rp < 2 && M == s) || rp >= EMB_CMAP_REPLICAS_MAX) {
		snprintf(why, cap,
			 "moving slots needs a job with ranks to spare "
			 "(--server_max) or replicas, at most %u copies",
			 EMB_CMAP_REPLICAS_MAX - 1);
		goto out;
	}
	if (rank >= M || !live[rank]) {
		snprintf(why, cap, "no live server at rank %u (the job has %u)",
			 rank, M);
		rc = EMB_EBADARG;
		goto out;
	}
	if (drain[rank]) {
		rc = 0; /* asked before */
		goto out;
	}
	for (uint32_t i = 0; i < M; i++)
		staying += i != rank && live[i] && !drain[i];
	if (staying < rp) {
		snprintf(why, cap,
			 "%u server%s would stay for %u copies of each slot",
			 staying, staying == 1 ? "" : "s", rp);
		goto out;
	}
	snprintf(kr, sizeof(kr), "%sserver/%u", prefix, rank);
	snprintf(kd, sizeof(kd), "%sdrain/%u", prefix, rank);
	{
		/* Only while that server holds the rank: a newcomer that
		 * took it since was not asked. */
		struct emb_etcd_cmp cmp = {
		    .key = kr, .target = EMB_ETCD_CREATE, .revision = crev};
		struct emb_etcd_op op = {.key = kd, .value = "", .value_len = 0};

		rc = emb_etcd_txn(e, &cmp, 1, &op, 1, &ok);
	}
	if (!rc && !ok) {
		snprintf(why, cap, "server %u left or died meanwhile", rank);
		rc = EMB_EBADARG;
	}
out:
	free(live);
	free(drain);
	emb_etcd_range_free(&r);
	return rc;
}

int emb_coord_drain(struct emb_coord *c, char *why, size_t cap)
{
	int rc;

	if (c->reg.role != EMB_ROLE_SERVER) {
		snprintf(why, cap, "not a server");
		return EMB_ECLUSTER;
	}
	do
		rc = drain_ask(c->etcd, c->prefix, c->reg.rank, why, cap);
	while (again(c, &rc));
	if (!rc) {
		emb_log(EMB_LOG_INFO,
			"server %u asked to drain: its slots move to the "
			"others, then it leaves",
			c->reg.rank);
		emb_coord_poll_now(c);
	}
	return rc;
}

int emb_coord_fill_done(struct emb_coord *c, uint32_t first, uint32_t n,
			uint64_t epoch, int status, uint64_t rows,
			uint64_t bytes)
{
	char key[KEY_MAX], val[128];
	int rc;

	if (c->reg.role != EMB_ROLE_SERVER || !emb_coord_mapped(c))
		return EMB_ECLUSTER;
	key_of(c, key, "fill_done");
	snprintf(val, sizeof(val), "%u %u %u %llu %d %llu %llu", c->reg.rank,
		 first, n, (unsigned long long)epoch, status,
		 (unsigned long long)rows, (unsigned long long)bytes);
	do
		rc = emb_etcd_put(c->etcd, key, val, strlen(val), 0);
	while (again(c, &rc));
	return rc;
}

/*
 * Agent thread, before poll_job() counts deaths: ranks whose key vanished
 * with many others count as alive for VANISH_LEASES leases (live[] and
 * lw[] set). More than half of the ranks not yet dead gone in one read,
 * or any gone soon after etcd did not answer this node's renewal or this
 * node took its own lease back (relet()), is etcd's doing: a stall past
 * the TTL after which it revoked every lease at once, while the nodes
 * lived. Each takes its rank back within a renewal or two; one that does
 * not is dead when the wait is up. This node's own key counts as there:
 * its lease thread judges it.
 */
static void vanished(struct emb_coord *c, uint8_t *live, uint8_t *lw,
		     const uint8_t *fin, const uint8_t *left)
{
	const uint32_t S = c->reg.server_num, W = c->reg.worker_num;
	const int64_t now = (int64_t)emb_clock_ms();
	const int64_t wait = (int64_t)VANISH_LEASES * c->reg.hb_timeout_ms;
	uint32_t missing = 0, counted = 0, waited = 0;
	bool many;

	/* The dead flags are the agent's own, but written under mu. */
	pthread_mutex_lock(&c->mu);
	for (uint32_t i = 0; i < S + W; i++) {
		bool srv = i < S;
		uint32_t rank = srv ? i : i - S;

		/* A server rank that is gone and holds nothing (left, a
		 * spare one never taken, a joiner that died empty) is no
		 * vanish: a job with many ranks to spare would otherwise
		 * look like most of it vanished. */
		if (srv ? c->dead_srv[rank] || left[rank] ||
			      (!live[rank] && !emb_cmap_in_map(c->map, rank))
			: (c->dead_wrk[rank] || fin[rank]))
			continue;
		counted++;
		missing += !(srv ? live[rank] : lw[rank]);
	}
	many = 2 * missing > counted ||
	       (c->relet_at && now - c->relet_at < wait) ||
	       (c->silent_at && now - c->silent_at < wait);
	for (uint32_t i = 0; i < S + W; i++) {
		bool srv = i < S;
		uint32_t rank = srv ? i : i - S;
		uint8_t *here = srv ? &live[rank] : &lw[rank];

		if (*here || (srv ? left[rank] || !emb_cmap_in_map(c->map, rank)
				  : fin[rank])) {
			c->gone_since[i] = 0;
			continue;
		}
		if (srv ? c->dead_srv[rank] : c->dead_wrk[rank])
			continue; /* told already */
		if (rank == c->reg.rank &&
		    (c->reg.role == EMB_ROLE_SERVER) == srv) {
			*here = 1;
			continue;
		}
		if (!c->gone_since[i] && many) {
			c->gone_since[i] = now;
			waited++;
		}
		if (c->gone_since[i] && now - c->gone_since[i] < wait)
			*here = 1;
		else
			c->gone_since[i] = 0;
	}
	pthread_mutex_unlock(&c->mu);
	if (waited)
		emb_log(EMB_LOG_WARN,
			"%s %u: %u of %u ranks' etcd keys vanished at once "
			"(etcd stalled past their leases?): each is waited "
			"for %lld ms before it counts as dead",
			emb_role_name(c->reg.role), c->reg.rank, missing,
			counted, (long long)wait);
}

/*
 * Agent thread of a server asked to drain (drain/<rank>): once the map
 * gives it no slot (nor a copy ahead), it stays one TTL, answering (a
 * write a client routed to it by an older map is refused there and sent
 * again by the newer one), then records that it left (left/server/<rank>,
 * with its drain key deleted, in one transaction) and ends its part of
 * the job with status 0: the others see its key go without counting it
 * dead.
 */
static void drained_leave(struct emb_coord *c)
{
	const int64_t now = (int64_t)emb_clock_ms();
	const uint32_t me = c->reg.rank;
	uint32_t f, to;
	bool empty, ok;

	pthread_mutex_lock(&c->mu);
	empty = c->epoch && !emb_cmap_in_map(c->map, me) &&
		!(warm_run(c->map, &f, &to) && to == me);
	pthread_mutex_unlock(&c->mu);
	if (!empty) {
		c->drained_at = 0;
		return;
	}
	if (!c->drained_at) {
		c->drained_at = now;
		emb_log(EMB_LOG_INFO,
			"server %u: drained, it holds no slot: it leaves the "
			"job in %u ms",
			me, c->reg.hb_timeout_ms);
		return;
	}
	if (now - c->drained_at < (int64_t)c->reg.hb_timeout_ms)
		return;
	{
		char kl[KEY_MAX], kd[KEY_MAX];
		struct emb_etcd_op ops[2] = {
		    {.key = kl, .value = "", .value_len = 0},
		    {.key = kd, .del = true},
		};

		key_of(c, kl, "left/server/%u", me);
		key_of(c, kd, "drain/%u", me);
		if (emb_etcd_txn(c->etcd, NULL, 0, ops, 2, &ok))
			return; /* the next poll tries again */
	}
	emb_log(EMB_LOG_INFO, "server %u: drained: it left job %s", me,
		c->prefix);
	end_job(c, 0, NULL);
}

/*
 * Agent thread: which ranks are alive and which workers finished, from one
 * keys-only read of the job. Dead: a rank key gone (its lease expired or
 * was revoked) without a finish record, once the job formed (its map
 * exists: servers never wait for it, so the agent looks). A map key whose
 * revision moved is read again: a new epoch.
 */
static int poll_job(struct emb_coord *c)
{
	const uint32_t S = c->reg.server_num, W = c->reg.worker_num;
	size_t plen = strlen(c->prefix);
	uint8_t *live = calloc(5u * S + 2u * W, 1);
	uint8_t *lw = live + S, *fin = lw + W, *waiting = fin + W;
	uint8_t *joining = waiting + S, *draining = joining + S,
		*left = draining + S;
	struct emb_etcd_range r;
	int64_t map_rev = 0, have_rev;
	uint32_t gone = 0, first_live = UINT32_MAX, t, f, nf;
	bool have_done = false, have_move = false, busy;
	int rc;

	if (!live)
		return -ENOMEM;
	/* Whether this node had the map before the read: the join takes it
	 * on another thread, and a map taken while this read was on its way
	 * is not in it (a worker that joined as the job formed read that as
	 * "its keys were deleted" and left the job). */
	pthread_mutex_lock(&c->mu);
	have_rev = c->map_rev;
	pthread_mutex_unlock(&c->mu);
	rc = emb_etcd_get(c->etcd, c->prefix, true, true, &r);
	if (rc) {
		free(live);
		return rc;
	}
	for (uint32_t i = 0; i < r.n; i++) {
		const char *k = r.kvs[i].key + plen;
		int64_t v;

		if ((v = rank_in(k, "server", S)) >= 0)
			live[v] = 1;
		else if ((v = rank_in(k, "worker", W)) >= 0)
			lw[v] = 1;
		else if ((v = rank_in(k, "finish/worker", W)) >= 0)
			fin[v] = 1;
		else if ((v = rank_in(k, "filling", S)) >= 0)
			waiting[v] = 1;
		else if ((v = rank_in(k, "joining", S)) >= 0)
			joining[v] = 1;
		else if ((v = rank_in(k, "drain", S)) >= 0)
			draining[v] = 1;
		else if ((v = rank_in(k, "left/server", S)) >= 0)
			left[v] = 1;
		else if (!strcmp(k, "fill_done"))
			have_done = true;
		else if (!strcmp(k, "map"))
			map_rev = r.kvs[i].mod_revision;
		else if (!strcmp(k, "move"))
			have_move = true;
	}
	emb_etcd_range_free(&r);
	if (!map_rev && have_rev) {
		/* Formed, and its keys are gone: whoever started the job
		 * deleted them at its end (embstore launch does, once its
		 * own nodes exited; a newcomer started by hand may look only
		 * after that). A server's part is over; a worker that still
		 * runs has lost its job. */
		free(live);
		emb_log(EMB_LOG_INFO, "job %s: its keys were deleted",
			c->prefix);
		end_job(c, c->reg.role == EMB_ROLE_SERVER ? 0 : EMB_ECLUSTER,
			"its keys were deleted from etcd");
		return 0;
	}
	if (!map_rev) {
		free(live);
		return 0; /* not formed yet */
	}
	{
		/* This agent did not run for a lease (the process, or the
		 * whole machine with etcd on it, paused): keys that vanished
		 * meanwhile are as suspect as after etcd's silence, and
		 * get the same wait (vanished()) while their nodes, paused
		 * too, take their ranks back. */
		int64_t now = (int64_t)emb_clock_ms();

		if (c->polled_at &&
		    now - c->polled_at > (int64_t)c->reg.hb_timeout_ms) {
			pthread_mutex_lock(&c->mu);
			c->silent_at = now;
			/* Waits begun before the pause ran out during it,
			 * with nobody able to come back: they start over. */
			memset(c->gone_since, 0,
			       (S + W) * sizeof(*c->gone_since));
			pthread_mutex_unlock(&c->mu);
		}
		c->polled_at = now;
	}
	vanished(c, live, lw, fin, left);
	pthread_mutex_lock(&c->mu);
	memcpy(c->srv_live, live, S);
	pthread_mutex_unlock(&c->mu);
	/* Every worker finished or died: the job is over, and servers that
	 * leave now are done, not dead. */
	for (uint32_t w = 0; w < W; w++)
		gone += fin[w] || !lw[w];
	if (gone == W) {
		free(live);
		if (c->reg.role == EMB_ROLE_SERVER)
			end_job(c, 0, NULL);
		return 0;
	}
	for (uint32_t i = 0; i < S + W; i++) {
		bool srv = i < S;
		uint32_t rank = srv ? i : i - S;
		bool dead, tell;

		if (srv && live[rank]) {
			/* A newcomer took a dead rank: its death would be
			 * news again. */
			pthread_mutex_lock(&c->mu);
			c->dead_srv[rank] = 0;
			pthread_mutex_unlock(&c->mu);
			continue;
		}
		/* Drained and gone, or a rank to spare never taken: no
		 * death. */
		if (srv && (left[rank] || rank >= c->start)) {
			bool held;

			pthread_mutex_lock(&c->mu);
			held = emb_cmap_in_map(c->map, rank);
			pthread_mutex_unlock(&c->mu);
			if (!held)
				continue;
		}
		if (!srv && (lw[rank] || fin[rank]))
			continue;
		pthread_mutex_lock(&c->mu);
		dead = (srv ? c->dead_srv[rank] : c->dead_wrk[rank]) ||
		       c->ended;
		pthread_mutex_unlock(&c->mu);
		if (!dead) {
			bool marked = false;

			/* Dead only once etcd has it so: a rank whose node
			 * took it back meanwhile is alive (and not failed
			 * over below). */
			if (dead_mark(c, srv ? EMB_ROLE_SERVER
					     : EMB_ROLE_WORKER,
				      rank, &marked) ||
			    !marked) {
				if (srv)
					live[rank] = 1;
				continue;
			}
		}
		pthread_mutex_lock(&c->mu);
		tell = !dead && !c->ended;
		if (tell) {
			if (srv)
				c->dead_srv[rank] = 1;
			else
				c->dead_wrk[rank] = 1;
		}
		pthread_mutex_unlock(&c->mu);
		if (tell)
			declare_dead(c, srv ? EMB_ROLE_SERVER : EMB_ROLE_WORKER,
				     rank);
	}
	/* Deaths before the map: the map may be newer than the keys read
	 * above, and list a newcomer at a rank whose death this read shows;
	 * told in this order, a watcher takes the death for the server
	 * that died, and the map for the one that took its place. */
	if (map_rev != have_rev) {
		bool newer;

		rc = map_read(c, &newer);
		if (rc) {
			free(live);
			return rc;
		}
		if (newer)
			map_notify(c);
	}
	for (uint32_t i = 0; i < S && first_live == UINT32_MAX; i++)
		if (live[i])
			first_live = i;
	/* One writer per round, the live server of lowest rank; if it dies
	 * too, the next one takes over at its next poll. */
	if (c->reg.role == EMB_ROLE_SERVER && c->reg.rank == first_live &&
	    !c->ended) {
		rc = failover(c, live);
		if (rc)
			emb_log(EMB_LOG_WARN, "job %s: failover map: %s",
				c->prefix, emb_strerror(rc));
		if (emb_coord_mapped(c)) {
			struct job_keys k = {.live = live,
					     .waiting = waiting,
					     .joining = joining,
					     .draining = draining,
					     .have_done = have_done,
					     .have_move = have_move};

			rc = steps(c, &k);
		}
		if (rc)
			emb_log(EMB_LOG_WARN, "job %s: recovery step: %s",
				c->prefix, emb_strerror(rc));
	}
	if (c->reg.role == EMB_ROLE_SERVER && draining[c->reg.rank])
		drained_leave(c);
	else
		c->drained_at = 0;
	/* While a newcomer waits or is filled, every node polls often: the
	 * leader for the source's word, the source and the newcomer for the
	 * next chunk's map, workers for the map that lifts a fence. */
	pthread_mutex_lock(&c->mu);
	if (!fill_under_way(c->map, &t, &f, &nf))
		nf = warm_run(c->map, &f, &t);
	busy = nf > 0;
	for (uint32_t i = 0; i < S && !busy; i++)
		busy = (waiting[i] || joining[i] || draining[i]) && live[i];
	c->busy = busy;
	/* The servers a step waits on poll faster still: the leader (for
	 * the source's report) and the chunk's source and target (for the
	 * map that asks for the next step). Three nodes at most, whatever
	 * the job's size. */
	c->leads = c->reg.role == EMB_ROLE_SERVER &&
		   c->reg.rank == first_live;
	c->fast = busy && c->reg.role == EMB_ROLE_SERVER &&
		  (c->reg.rank == first_live ||
		   (nf > 0 && (c->reg.rank == t ||
			       c->reg.rank == emb_cmap_primary(c->map, f))));
	pthread_mutex_unlock(&c->mu);
	free(live);
	return 0;
}

/* Whether key exists in etcd (*present), or an etcd error. */
static int key_present(struct emb_etcd *e, const char *key, bool *present)
{
	struct emb_etcd_range r;
	int rc = emb_etcd_get(e, key, false, true, &r);

	if (!rc) {
		*present = r.n > 0;
		emb_etcd_range_free(&r);
	}
	return rc;
}

/*
 * Lease thread: etcd says this node's lease is gone while the node lives.
 * etcd itself stalled past the TTL (a disk that stopped, a paused VM or
 * process) and, waking, revoked every lease it held at once; or this
 * node could not renew in time. The node takes its rank back on a new
 * lease if nobody counts it dead: its rank key is absent (no newcomer
 * took the rank), so is dead/<role>/<rank> (no node counted it dead:
 * dead_mark()), and the map is the one in which the server still holds
 * slots (no failover moved them), all compared in the transaction that
 * puts the key back. A job that had no map yet (still forming: a rank
 * was not taken when etcd stalled) has nothing to fail over; the node
 * takes its rank back while the map is still absent and the job's
 * config is there. The others wait for ranks that vanish many at once
 * (vanished()). 0, or why not: EMB_ENODEAD if the job went on without
 * this node, EMB_ECLUSTER if its keys are gone, or an etcd error (the
 * lease thread tries again).
 */
static int relet(struct emb_coord *c)
{
	const int64_t ttl_s = ((int64_t)c->reg.hb_timeout_ms + 999) / 1000;
	struct emb_cmap *m = malloc(sizeof(*m));
	char kmap[KEY_MAX], krank[KEY_MAX], kdead[KEY_MAX], kconf[KEY_MAX];
	int64_t lease;
	int rc;

	if (!m)
		return -ENOMEM;
	rc = emb_etcd_lease_grant(c->lease_etcd, ttl_s, &lease);
	if (rc) {
		free(m);
		return rc;
	}
	if (c->hook)
		c->hook(c->hook_arg, EMB_COORD_GRANTED);
	key_of(c, kmap, "map");
	key_of(c, krank, "%s/%u", role_dir(c->reg.role), c->reg.rank);
	key_of(c, kdead, "dead/%s/%u", role_dir(c->reg.role), c->reg.rank);
	key_of(c, kconf, "config");
	/* A few tries: each lost race is a map written meanwhile, which
	 * may or may not drop this server. */
	for (int tries = 0; tries < 8; tries++) {
		struct emb_etcd_range r;
		/* Against dead_mark(): whichever of the two etcd applies
		 * first, the other fails, so a rank some node counted dead
		 * never comes back, and one that came back is counted dead
		 * by nobody. */
		struct emb_etcd_cmp cmps[3] = {
		    {.key = krank, .target = EMB_ETCD_CREATE},
		    {.key = kdead, .target = EMB_ETCD_CREATE},
		    {.key = kmap, .target = EMB_ETCD_MOD},
		};
		struct emb_etcd_op op = {.key = krank,
					 .value = c->rank_val,
					 .value_len = strlen(c->rank_val),
					 .lease = lease};
		bool ok;

		rc = emb_etcd_get(c->lease_etcd, kmap, false, false, &r);
		if (rc)
			break;
		if (!r.n) {
			/* No map yet: a job still forming, if its config
			 * is there; the map must still be absent when the
			 * key goes back (create revision 0). */
			emb_etcd_range_free(&r);
			rc = key_present(c->lease_etcd, kconf, &ok);
			if (rc)
				break;
			if (!ok) {
				rc = EMB_ECLUSTER; /* the job's keys are gone */
				break;
			}
			cmps[2].target = EMB_ETCD_CREATE;
			cmps[2].revision = 0;
		} else if (!r.kvs[0].value ||
			   emb_cmap_decode(r.kvs[0].value,
					   r.kvs[0].value_len, m)) {
			emb_etcd_range_free(&r);
			rc = EMB_ECLUSTER;
			break;
		} else {
			cmps[2].target = EMB_ETCD_MOD;
			cmps[2].revision = r.kvs[0].mod_revision;
			emb_etcd_range_free(&r);
			if (c->reg.role == EMB_ROLE_SERVER &&
			    (c->reg.rank >= m->nservers ||
			     !emb_cmap_in_map(m, c->reg.rank))) {
				rc = EMB_ENODEAD;
				break;
			}
		}
		rc = emb_etcd_txn(c->lease_etcd, cmps, 3, &op, 1, &ok);
		if (rc == EMB_ENOLEASE) {
			/* The new lease ended before the key went on it:
			 * etcd stalled again, or this process did, past the
			 * TTL since the grant. Not a death (nothing says
			 * anybody counted this node dead): a new lease, and
			 * another try. Out of tries, the lease thread tries
			 * again later, as for an etcd that did not answer. */
			rc = emb_etcd_lease_grant(c->lease_etcd, ttl_s, &lease);
			if (rc)
				break;
			if (c->hook)
				c->hook(c->hook_arg, EMB_COORD_GRANTED);
			rc = EMB_ENOETCD;
			continue;
		}
		if (rc || ok)
			break;
		/* Taken by a newcomer, or counted dead: over; else the map
		 * moved (the last try gives up). */
		rc = key_present(c->lease_etcd, krank, &ok);
		if (!rc && !ok)
			rc = key_present(c->lease_etcd, kdead, &ok);
		if (rc)
			break;
		rc = EMB_ENODEAD;
		if (ok)
			break;
	}
	free(m);
	if (rc) {
		emb_etcd_lease_revoke(c->lease_etcd, lease);
		return rc;
	}
	pthread_mutex_lock(&c->mu);
	c->lease = lease;
	c->relet_at = (int64_t)emb_clock_ms();
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/*
 * Lease thread: renews the lease every TTL / 3 and alone judges whether
 * etcd is lost. A thread of its own, on a handle of its own: a poll, a
 * failover or a barrier that waits on a slow etcd must not hold a renewal
 * back past the lease's end (the node would be counted dead while it
 * lives).
 *
 * An etcd that does not answer past the lease's end is waited for up to
 * STALL_LEASES leases more: while it answers nobody, nobody can count
 * this node dead either, and a stalled etcd comes back with every lease
 * revoked (relet() takes the rank back). A node cut off from an etcd the
 * others still reach is failed over by them meanwhile, and finds so when
 * it reaches etcd again, or ends when the wait is up.
 */
static void *lease_main(void *arg)
{
	struct emb_coord *c = arg;
	const uint32_t ttl = c->reg.hb_timeout_ms;
	const uint32_t renew = ttl / 3 ? ttl / 3 : 1;
	/* After a failed renewal, the next try comes sooner: the lease
	 * has a third of its life less left. */
	const uint32_t retry = renew / 4 ? renew / 4 : 1;
	const uint32_t nep = emb_etcd_nendpoints(c->lease_etcd);
	/* The lease lives from its grant, not from this thread's start:
	 * a claim etcd applied late in the lease's life (a slow etcd, a
	 * starved join) may leave it ended before the first renewal. That
	 * renewal then finds the node past its lease, as if it had paused,
	 * and takes its rank back if nobody counted it dead (relet()),
	 * rather than leave a job it just joined. */
	int64_t last_ok = c->lease_at, next_renew = (int64_t)emb_clock_ms();
	/* The lease's life as etcd granted it: at least the job's TTL
	 * rounded up to seconds, more where etcd has a higher minimum. */
	int64_t lease_ms = ((int64_t)ttl + 999) / 1000 * 1000, got_s;
	bool past = false; /* told that etcd is silent past the lease */
	bool silent = false; /* a renewal etcd did not answer since the
				last that it did */

	own_thread = true;

	for (;;) {
		int64_t now = (int64_t)emb_clock_ms(), left, wait;
		bool quiet;
		int rc;

		pthread_mutex_lock(&c->mu);
		quiet = c->lost || c->ended;
		pthread_mutex_unlock(&c->mu);
		if (!quiet && now >= next_renew) {
			/* Past the lease's end already, with no renewal
			 * etcd failed to answer: this thread did not run
			 * (the process, or the whole machine, paused). */
			bool paused = now - last_ok > lease_ms;

			next_renew = now + renew;
			/* Each endpoint gets its share of the time the lease
			 * may have left, at least the usual wait: a member
			 * that is down costs no more than it did, and the
			 * answer of one that is up counts however late this
			 * process, starved, gets to read it. */
			left = lease_ms - (now - last_ok);
			emb_etcd_set_timeout(c->lease_etcd,
					     left / nep > c->timeout_ms
						 ? (uint32_t)(left / nep)
						 : c->timeout_ms);
			rc = emb_etcd_lease_keepalive(c->lease_etcd, c->lease,
						      &got_s);
			/* Or it paused during the renewal: sent in time,
			 * answered (by an etcd that had paused with it, and
			 * revoked every lease on waking) past the lease's
			 * end. Judged before the call alone, a machine paused
			 * just after it sent made this node leave a job that
			 * nobody had counted it dead in. */
			if (!paused && rc == EMB_ENOLEASE)
				paused = (int64_t)emb_clock_ms() - last_ok >
					 lease_ms;
			/* Only when etcd cannot have heard from this node
			 * through the lease: etcd was silent to it, or it
			 * did not run (a machine paused whole stops etcd and
			 * every node at once, and etcd revokes every lease
			 * on waking). A node frozen alone has been counted
			 * dead by the others meanwhile (their dead mark),
			 * and relet() then fails: it is out, as before. */
			if (rc == EMB_ENOLEASE && (silent || paused)) {
				int64_t gap = (int64_t)emb_clock_ms() - last_ok;

				rc = relet(c);
				if (!rc) {
					emb_log(EMB_LOG_WARN,
						"%s %u: its etcd lease ended "
						"while it lived (etcd %s for "
						"%lld ms): took its rank "
						"back on a new lease",
						emb_role_name(c->reg.role),
						c->reg.rank,
						silent ? "silent"
						       : "unheard, this node "
							 "paused",
						(long long)gap);
					got_s = 0;
				}
			}
			now = (int64_t)emb_clock_ms();
			if (rc == 0) {
				last_ok = now;
				past = false;
				silent = false;
				if (got_s * 1000 > lease_ms)
					lease_ms = got_s * 1000;
			} else if (rc == EMB_ENOLEASE || rc == EMB_ENODEAD ||
				   rc == EMB_ECLUSTER) {
				end_job(c, EMB_ENODEAD,
					"its etcd lease expired: the others "
					"count it dead");
			} else if (now - last_ok >
				   lease_ms * (1 + STALL_LEASES)) {
				char why[96];

				snprintf(why, sizeof(why),
					 "etcd unreachable for %lld ms: %s",
					 (long long)(now - last_ok),
					 emb_strerror(rc));
				end_job(c, EMB_ENOETCD, why);
			} else {
				silent = true;
				pthread_mutex_lock(&c->mu);
				c->silent_at = now;
				pthread_mutex_unlock(&c->mu);
				if (!past && now - last_ok > lease_ms) {
					past = true;
					emb_log(EMB_LOG_WARN,
						"%s %u: etcd silent for %lld "
						"ms, past the lease: serving "
						"on while it may come back",
						emb_role_name(c->reg.role),
						c->reg.rank,
						(long long)(now - last_ok));
				}
				next_renew = now + retry;
			}
		}
		/* Once out of the job there is nothing to do but wait for
		 * destroy. */
		wait = quiet ? renew : next_renew - (int64_t)emb_clock_ms();
		if (!nap(c, wait < 1 ? 1 : (uint32_t)wait))
			break;
	}
	return NULL;
}

/*
 * Agent thread: sleeps until due (a monotonic emb_clock_ms() time), or
 * until poked once poke_at has come. False if it should give up.
 */
static bool agent_nap(struct emb_coord *c, int64_t due, int64_t poke_at)
{
	for (;;) {
		int64_t now = (int64_t)emb_clock_ms(), until;
		struct timespec ts;
		bool poked, stop;

		pthread_mutex_lock(&c->mu);
		poked = c->poke;
		pthread_mutex_unlock(&c->mu);
		if (now >= due || (poked && now >= poke_at))
			return !cancelled(c);
		until = poked && poke_at < due ? poke_at : due;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += (until - now) / 1000;
		ts.tv_nsec += (long)((until - now) % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		/* A poke made since the look above is seen here, under the
		 * lock its broadcast needs: no wake-up is lost. */
		pthread_mutex_lock(&c->mu);
		if (!c->stop && c->poke == poked)
			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		stop = c->stop;
		pthread_mutex_unlock(&c->mu);
		if (stop || cancelled(c))
			return false;
	}
}

/* Agent thread: polls the job's keys every TTL / 5 (poll_job()), and
 * sooner when asked (emb_coord_poll_now()). */
static void *agent_main(void *arg)
{
	struct emb_coord *c = arg;
	const uint32_t ttl = c->reg.hb_timeout_ms;
	const uint32_t poll = ttl / 5 ? ttl / 5 : 1;

	own_thread = true;
	for (;;) {
		int64_t last = (int64_t)emb_clock_ms();
		uint32_t wait;
		bool quiet;
		int rc;

		pthread_mutex_lock(&c->mu);
		quiet = c->lost || c->ended;
		c->poke = false;
		pthread_mutex_unlock(&c->mu);
		if (!quiet) {
			rc = poll_job(c);
			if (rc)
				emb_log(EMB_LOG_DEBUG, "job %s: poll: %s",
					c->prefix, emb_strerror(rc));
		}
		/* Its reads and writes are done: a scrape reads anew. */
		pthread_mutex_lock(&c->mu);
		c->polls++;
		pthread_mutex_unlock(&c->mu);
		/* Until the job formed, a server looks for its map every
		 * POLL_MS: without one it refuses the writes of a
		 * replicated job's workers, which have it at once (they
		 * wait for it themselves). So does every node during a
		 * recovery (c->busy): each chunk is a few map steps. */
		pthread_mutex_lock(&c->mu);
		wait = c->fast ? FAST_POLL_MS
		       : (c->busy || (c->epoch == 0 &&
				      c->reg.role == EMB_ROLE_SERVER))
			   ? POLL_MS
			   : poll;
		pthread_mutex_unlock(&c->mu);
		if (wait > poll)
			wait = poll;
		if (!agent_nap(c, last + wait, last + POKE_MIN_MS))
			break;
	}
	return NULL;
}

void emb_coord_poll_now(struct emb_coord *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	if (!c->poke) {
		c->poke = true;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
}

/* ---- create / destroy ---------------------------------------------- */

static int etcd_open(const char *endpoints, uint32_t timeout_ms,
		     struct emb_etcd **out)
{
	struct emb_etcd_opts eo = {.endpoints = endpoints,
				   .timeout_ms = timeout_ms};

	if (!emb_coord_is_etcd(endpoints))
		return -EINVAL;
	return emb_etcd_create(&eo, out);
}

/* What create allocated, and c itself (the thread and etcd are gone). */
static void coord_free(struct emb_coord *c)
{
	free(c->dead_srv);
	free(c->dead_wrk);
	free(c->srv_live);
	free(c->gone_since);
	free(c->dead);
	free(c->bar_names);
	free(c->bar_gens);
	free(c->map);
	job_view_free(c->moves_view);
	pthread_mutex_destroy(&c->moves_mu);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

int emb_coord_create(const struct emb_coord_opts *opts, struct emb_coord **out)
{
	const char *job;
	struct emb_coord *c;
	int64_t deadline, ttl_s;
	uint32_t ttl_ms;
	int rc;

	if (!opts || !out ||
	    (opts->role != EMB_ROLE_SERVER && opts->role != EMB_ROLE_WORKER) ||
	    (opts->role == EMB_ROLE_SERVER && !opts->port) ||
	    opts->server_num > EMB_WIRE_SERVERS_MAX ||
	    opts->server_max > EMB_WIRE_SERVERS_MAX ||
	    (opts->server_max && opts->server_max < opts->server_num) ||
	    (opts->server_max > opts->server_num &&
	     opts->replicas >= EMB_CMAP_REPLICAS_MAX) ||
	    opts->worker_num > EMB_WIRE_WORKERS_MAX ||
	    opts->replicas > EMB_CMAP_REPLICAS_MAX ||
	    (opts->server_num && opts->replicas > opts->server_num))
		return -EINVAL;
	job = opts->job && *opts->job ? opts->job : EMB_COORD_JOB_DEFAULT;
	if (!job_ok(job)) {
		emb_log(EMB_LOG_ERROR,
			"job name '%s': want 1..%u of [A-Za-z0-9._-]", job,
			EMB_COORD_JOB_MAX);
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->moves_mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	snprintf(c->prefix, sizeof(c->prefix), "/embstore/%s/", job);
	c->on_end = opts->on_end;
	c->end_arg = opts->arg;
	c->cancel = opts->cancel;
	c->hook = opts->hook;
	c->hook_arg = opts->hook_arg;
	c->join_timeout_ms =
	    opts->join_timeout_ms ? opts->join_timeout_ms : JOIN_DEFAULT_MS;
	c->watch_rank = UINT32_MAX; /* no chunk watched (recover()) */
	deadline = (int64_t)emb_clock_ms() + c->join_timeout_ms;
	ttl_ms = opts->ttl_ms ? opts->ttl_ms : TTL_DEFAULT_MS;
	/* Requests wait at most a third of the TTL per endpoint, so one
	 * dead member costs a renewal, never the lease. */
	c->timeout_ms = ttl_ms / 3 < 500 ? 500 : ttl_ms / 3;
	rc = etcd_open(opts->endpoints, c->timeout_ms, &c->etcd);
	if (rc)
		goto err_free;
	rc = etcd_open(opts->endpoints, c->timeout_ms, &c->lease_etcd);
	if (rc)
		goto err_etcd;
	rc = config_join(c, opts, deadline);
	if (rc)
		goto err_etcd;
	/* The job's TTL, in whole seconds, at least 1; etcd may raise it
	 * to its own minimum, and the lease thread renews every TTL / 3. */
	ttl_s = ((int64_t)c->reg.hb_timeout_ms + 999) / 1000;
	/* The lease thread starts once the rank is ours, so a lease can
	 * end before the claim that puts our rank key on it: an etcd slow
	 * to answer on a loaded machine takes the claim past the TTL, and
	 * etcd refuses it (EMB_ENOLEASE). That is no reason to give up the
	 * join: a new lease and a new claim, within the join's deadline.
	 * Nothing is on the old lease (a claim applied on it went with
	 * it). */
	for (;;) {
		/* A grant whose answer is lost leaves a lease that
		 * expires on its own. */
		do
			rc = emb_etcd_lease_grant(c->lease_etcd, ttl_s,
						  &c->lease);
		while (again_until(c, rc, deadline));
		if (rc)
			goto err_etcd;
		c->lease_at = (int64_t)emb_clock_ms();
		if (c->hook)
			c->hook(c->hook_arg, EMB_COORD_GRANTED);
		rc = claim_rank(c, opts, deadline);
		if (rc != EMB_ENOLEASE ||
		    (int64_t)emb_clock_ms() + POLL_MS > deadline)
			break;
		emb_log(EMB_LOG_WARN,
			"job %s: our lease (%lld s) ended before our rank was "
			"claimed on it (etcd slow to answer): claiming on a "
			"new lease",
			c->prefix, (long long)ttl_s);
	}
	if (rc)
		goto err_lease;
	if (c->hook)
		c->hook(c->hook_arg, EMB_COORD_CLAIMED);
	c->dead_srv = calloc(c->reg.server_num, 1);
	c->dead_wrk = calloc(c->reg.worker_num, 1);
	c->srv_live = calloc(c->reg.server_num, 1);
	c->gone_since = calloc((size_t)c->reg.server_num + c->reg.worker_num,
			       sizeof(*c->gone_since));
	c->dead_cap = c->reg.server_num + c->reg.worker_num;
	c->dead = calloc(c->dead_cap, sizeof(*c->dead));
	c->bar_names = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_names));
	c->bar_gens = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_gens));
	c->map = calloc(1, sizeof(*c->map));
	if (!c->dead_srv || !c->dead_wrk || !c->srv_live || !c->gone_since ||
	    !c->dead ||
	    !c->bar_names ||
	    !c->bar_gens || !c->map) {
		rc = -ENOMEM;
		goto err_lease;
	}
	emb_log(EMB_LOG_INFO, "joined job %s through etcd %s as %s %u of %u",
		c->prefix, emb_etcd_endpoint(c->etcd),
		emb_role_name(c->reg.role), c->reg.rank,
		c->reg.role == EMB_ROLE_SERVER ? c->reg.server_num
					       : c->reg.worker_num);
	rc = emb_thread_start(&c->lease_thread, NULL, lease_main, c,
			      "emb-lease");
	if (rc == 0) {
		rc = emb_thread_start(&c->thread, NULL, agent_main, c,
				      "emb-coord");
		if (rc) {
			pthread_mutex_lock(&c->mu);
			c->stop = true;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
			pthread_join(c->lease_thread, NULL);
		}
	}
	if (rc)
		goto err_lease;
	c->running = true;
	*out = c;
	return 0;

err_lease:
	/* The rank key goes with the lease. */
	emb_etcd_lease_revoke(c->lease_etcd, c->lease);
err_etcd:
	emb_etcd_destroy(c->lease_etcd);
	emb_etcd_destroy(c->etcd);
err_free:
	/* Several steps fail quietly (an etcd that stays unreachable past
	 * the join timeout, a refused request): say which join failed and
	 * why, once, here. */
	if (rc != -ECANCELED)
		emb_log(EMB_LOG_ERROR, "%s: cannot join job %s through etcd: %s",
			emb_role_name(opts->role), opts->job ? opts->job : "",
			emb_strerror(rc));
	coord_free(c);
	return rc;
}

void emb_coord_destroy(struct emb_coord *c)
{
	if (!c)
		return;
	if (c->running) {
		pthread_mutex_lock(&c->mu);
		c->stop = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->thread, NULL);
		pthread_join(c->lease_thread, NULL);
	}
	/* Best effort, with the usual wait (a renewal may have left a
	 * longer one): if etcd is gone, the lease expires on its own. */
	emb_etcd_set_timeout(c->lease_etcd, c->timeout_ms);
	emb_etcd_lease_revoke(c->lease_etcd, c->lease);
	emb_etcd_destroy(c->lease_etcd);
	emb_etcd_destroy(c->etcd);
	coord_free(c);
}

const struct emb_wire_register_resp *emb_coord_reg(const struct emb_coord *c)
{
	return &c->reg;
}

uint64_t emb_coord_epoch(struct emb_coord *c)
{
	uint64_t e;

	pthread_mutex_lock(&c->mu);
	e = c->epoch;
	pthread_mutex_unlock(&c->mu);
	return e;
}

int emb_coord_map(struct emb_coord *c, struct emb_cmap *out)
{
	int rc = EMB_ECLUSTER;

	pthread_mutex_lock(&c->mu);
	if (c->epoch) {
		*out = *c->map;
		rc = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void emb_coord_watch_map(struct emb_coord *c, emb_coord_map_fn fn, void *arg)
{
	struct emb_cmap *m = fn ? malloc(sizeof(*m)) : NULL;

	pthread_mutex_lock(&c->mu);
	c->map_fn = fn;
	c->map_arg = arg;
	if (m && c->epoch)
		*m = *c->map;
	else if (m)
		m->epoch = 0;
	pthread_mutex_unlock(&c->mu);
	if (m && m->epoch)
		fn(arg, m);
	free(m);
}

/* ---- the map -------------------------------------------------------- */

/*
 * Takes an encoded map (emb_cmap_encode()) as the job's current one when
 * its epoch is newer than ours; *newer says whether it was. EMB_EBADFRAME
 * for a value that does not decode or does not fit the job.
 */
static int map_take(struct emb_coord *c, const struct emb_etcd_kv *kv,
		    bool *newer)
{
	struct emb_cmap *m = malloc(sizeof(*m));
	int rc;

	*newer = false;
	if (!m)
		return -ENOMEM;
	rc = kv->value ? emb_cmap_decode(kv->value, kv->value_len, m)
		       : EMB_EBADFRAME;
	if (!rc && (m->nservers != c->reg.server_num ||
		    m->replicas != c->replicas))
		rc = EMB_EBADFRAME;
	pthread_mutex_lock(&c->mu);
	if (!rc && (!c->epoch || m->epoch > c->epoch)) {
		struct emb_cmap *old = c->map;

		c->map = m;
		m = old;
		c->epoch = c->map->epoch;
		c->map_rev = kv->mod_revision;
		*newer = true;
	} else if (!rc && m->epoch == c->epoch &&
		   kv->mod_revision > c->map_rev) {
		/* The same epoch written again, with keys of a step that
		 * changed no holder (a fill that found nothing to fill): no
		 * news for the watcher, but the leader's next CAS compares
		 * with this revision. */
		c->map_rev = kv->mod_revision;
	}
	pthread_mutex_unlock(&c->mu);
	free(m);
	if (rc)
		emb_log(EMB_LOG_ERROR, "job %s: bad map in etcd: %s",
			c->prefix, emb_strerror(rc));
	return rc;
}

/* Reads the map key and takes it (map_take()). */
static int map_read(struct emb_coord *c, bool *newer)
{
	char key[KEY_MAX];
	struct emb_etcd_range r;
	int rc;

	*newer = false;
	key_of(c, key, "map");
	rc = emb_etcd_get(c->etcd, key, false, false, &r);
	if (rc)
		return rc;
	rc = r.n ? map_take(c, &r.kvs[0], newer) : EMB_ECLUSTER;
	emb_etcd_range_free(&r);
	return rc;
}

/* The servers key ("h:p,[h6]:p,..." by rank) into a new *servers. */
static int servers_read(struct emb_coord *c,
			struct emb_wire_node_addr **servers)
{
	const uint32_t S = c->reg.server_num;
	struct emb_addr *a = calloc(S, sizeof(*a));
	struct emb_wire_node_addr *srv = calloc(S, sizeof(*srv));
	struct emb_etcd_range r = {0};
	char key[KEY_MAX];
	int n, rc = -ENOMEM;

	if (!a || !srv)
		goto out;
	key_of(c, key, "servers");
	rc = emb_etcd_get(c->etcd, key, false, false, &r);
	if (rc)
		goto out;
	n = r.n && r.kvs[0].value
		? emb_addr_list_parse((const char *)r.kvs[0].value, a, S)
		: -EINVAL;
	if (n != (int)S) {
		emb_log(EMB_LOG_ERROR, "job %s: bad server list in etcd",
			c->prefix);
		rc = EMB_EBADFRAME;
		goto out;
	}
	for (uint32_t i = 0; i < S; i++) {
		snprintf(srv[i].host, sizeof(srv[i].host), "%s", a[i].host);
		srv[i].port = a[i].port;
		if (!srv[i].port) {
			rc = EMB_EBADFRAME;
			goto out;
		}
	}
	*servers = srv;
	srv = NULL;
out:
	emb_etcd_range_free(&r);
	free(srv);
	free(a);
	return rc;
}

int emb_coord_servers(struct emb_coord *c, struct emb_wire_node_addr **servers)
{
	int rc;

	do
		rc = servers_read(c, servers);
	while (again(c, &rc));
	return rc;
}

/*
 * Every rank is taken: writes map epoch 1 and the server list in one
 * transaction, unless someone did. The servers by rank from their keys;
 * the map is emb_cmap_init()'s: home ranges, backups on the successors.
 */
static int map_write(struct emb_coord *c, const struct emb_etcd_range *srvr)
{
	const uint32_t S = c->reg.server_num, S0 = c->start;
	size_t plen = strlen(c->prefix), cap = (size_t)S * (EMB_HOST_MAX + 9);
	const char **by_rank = calloc(S, sizeof(*by_rank));
	struct emb_cmap *m = malloc(sizeof(*m));
	size_t mlen = emb_cmap_encoded_size(c->replicas), at = 0;
	uint8_t *buf = malloc(mlen);
	char *list = malloc(cap);
	char kmap[KEY_MAX], ksrv[KEY_MAX];
	int rc = -ENOMEM;
	bool ok;

	if (!by_rank || !m || !buf || !list)
		goto out;
	for (uint32_t i = 0; i < srvr->n; i++) {
		int64_t r = rank_in(srvr->kvs[i].key + plen, "server", S0);

		if (r >= 0)
			by_rank[r] = (const char *)srvr->kvs[i].value;
	}
	/* Ranks to spare: a placeholder no one dials (the map lists no
	 * slot there) until a server that joins puts its own. */
	for (uint32_t i = S0; i < S; i++)
		by_rank[i] = "0.0.0.0:9";
	for (uint32_t i = 0; i < S; i++) {
		int n;

		if (!by_rank[i] || strlen(by_rank[i]) > EMB_HOST_MAX + 8) {
			rc = EMB_EBADFRAME;
			goto out;
		}
		n = snprintf(list + at, cap - at, "%s%s", i ? "," : "",
			     by_rank[i]);
		at += (size_t)n;
	}
	rc = emb_cmap_init(m, S0, c->replicas);
	if (rc)
		goto out;
	/* Free ranks hold nothing until a server joins there. */
	m->nservers = S;
	if (emb_cmap_encode(m, buf, mlen) != (int64_t)mlen) {
		rc = EMB_EINTERNAL;
		goto out;
	}
	key_of(c, kmap, "map");
	key_of(c, ksrv, "servers");
	{
		struct emb_etcd_cmp cmp = {.key = kmap,
					   .target = EMB_ETCD_CREATE};
		struct emb_etcd_op ops[2] = {
		    {.key = kmap, .value = buf, .value_len = mlen},
		    {.key = ksrv, .value = list, .value_len = at},
		};

		rc = emb_etcd_txn(c->etcd, &cmp, 1, ops, 2, &ok);
	}
	if (!rc && ok)
		emb_log(EMB_LOG_INFO,
			"job %s ready: %u servers, %u workers, %u cop%s of each "
			"slot (map epoch 1)%s",
			c->prefix, S0, c->reg.worker_num, c->replicas,
			c->replicas == 1 ? "y" : "ies",
			S > S0 ? "; ranks to spare for servers to join" : "");
out:
	free(list);
	free(buf);
	free(m);
	free(by_rank);
	return rc;
}

int emb_coord_wait_map(struct emb_coord *c, uint16_t *slot_map,
		       struct emb_wire_node_addr **servers)
{
	int64_t deadline = (int64_t)emb_clock_ms() + c->join_timeout_ms;
	char key[KEY_MAX];
	int rc;

	for (;;) {
		struct emb_etcd_range r, srv, wrk;
		int lost;

		pthread_mutex_lock(&c->mu);
		lost = c->lost;
		pthread_mutex_unlock(&c->mu);
		if (lost)
			return lost;
		key_of(c, key, "map");
		rc = emb_etcd_get(c->etcd, key, false, false, &r);
		if (again(c, &rc))
			continue;
		if (rc)
			return rc;
		if (r.n) {
			bool newer;

			rc = map_take(c, &r.kvs[0], &newer);
			emb_etcd_range_free(&r);
			if (rc)
				return rc;
			do
				rc = servers_read(c, servers);
			while (again(c, &rc));
			if (rc)
				return rc;
			/* Clients route by primaries; backups are the
			 * replication's business. */
			pthread_mutex_lock(&c->mu);
			for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
				slot_map[sl] = emb_cmap_primary(c->map, sl);
			pthread_mutex_unlock(&c->mu);
			return 0;
		}
		emb_etcd_range_free(&r);
		key_of(c, key, "server/");
		rc = emb_etcd_get(c->etcd, key, true, false, &srv);
		if (again(c, &rc))
			continue;
		if (rc)
			return rc;
		key_of(c, key, "worker/");
		rc = emb_etcd_get(c->etcd, key, true, true, &wrk);
		if (rc) {
			emb_etcd_range_free(&srv);
			if (again(c, &rc))
				continue;
			return rc;
		}
		/* Written once: a retry whose first try was applied finds
		 * the map there, and the next turn reads it. */
		if (srv.n == c->start && wrk.n == c->reg.worker_num)
			rc = map_write(c, &srv);
		emb_etcd_range_free(&srv);
		emb_etcd_range_free(&wrk);
		if (again(c, &rc))
			continue;
		if (rc)
			return rc;
		if ((int64_t)emb_clock_ms() + POLL_MS > deadline) {
			emb_log(EMB_LOG_ERROR,
				"%s %u: job %s not ready after %u ms",
				emb_role_name(c->reg.role), c->reg.rank,
				c->prefix, c->join_timeout_ms);
			return -ETIMEDOUT;
		}
		if (!nap(c, POLL_MS))
			return -ECANCELED;
	}
}

void emb_coord_watch(struct emb_coord *c, emb_coord_dead_fn fn, void *arg)
{
	uint32_t seen = 0;

	for (;;) {
		struct emb_wire_node_ref d;

		pthread_mutex_lock(&c->mu);
		if (seen == 0) {
			c->watch_fn = fn;
			c->watch_arg = arg;
		}
		if (!fn || seen >= c->ndead) {
			pthread_mutex_unlock(&c->mu);
			return;
		}
		d = c->dead[seen++];
		pthread_mutex_unlock(&c->mu);
		fn(arg, d.role, d.rank);
	}
}

/* ---- barriers and finish -------------------------------------------- */

/* This worker's entries of name so far, counting this one. */
static int barrier_gen(struct emb_coord *c, const char *name, uint64_t *gen)
{
	uint32_t i;
	int rc = 0;

	pthread_mutex_lock(&c->mu);
	for (i = 0; i < c->nbar; i++)
		if (!strcmp(c->bar_names[i], name))
			break;
	if (i == c->nbar && i == BARRIER_NAMES_MAX) {
		rc = -ENOMEM;
	} else {
		if (i == c->nbar)
			snprintf(c->bar_names[c->nbar++],
				 sizeof(c->bar_names[0]), "%s", name);
		*gen = ++c->bar_gens[i];
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int emb_coord_barrier(struct emb_coord *c, const char *name)
{
	char key[KEY_MAX], dir[KEY_MAX];
	uint32_t wait_ms = 2;
	uint64_t gen;
	int rc;

	if (c->reg.role != EMB_ROLE_WORKER)
		return EMB_ECLUSTER;
	if (!name || !*name || strlen(name) > EMB_WIRE_BARRIER_NAME_MAX)
		return -EINVAL;
	for (const char *p = name; *p; p++)
		if (*p == '/' || (uint8_t)*p <= ' ' || (uint8_t)*p > '~')
			return -EINVAL;
	rc = barrier_gen(c, name, &gen);
	if (rc)
		return rc;
	/* Everyone who enters gen passed gen - 1, so everyone entered it
	 * and nobody reads gen - 2 any more: ours can go. */
	if (gen > 2) {
		key_of(c, key, "barrier/%s/%" PRIu64 "/%u", name, gen - 2,
		       c->reg.rank);
		do
			rc = emb_etcd_delete(c->etcd, key, false, NULL);
		while (again(c, &rc));
		if (rc)
			return rc;
	}
	key_of(c, key, "barrier/%s/%" PRIu64 "/%u", name, gen, c->reg.rank);
	key_of(c, dir, "barrier/%s/%" PRIu64 "/", name, gen);
	/* Not on our lease: a worker that passes and leaves at once (its
	 * lease revoked) must not take its key from those still counting. */
	do
		rc = emb_etcd_put(c->etcd, key, "", 0, 0);
	while (again(c, &rc));
	while (!rc) {
		struct emb_etcd_range r;
		uint32_t n;
		int lost, ndead;

		pthread_mutex_lock(&c->mu);
		lost = c->lost;
		ndead = (int)c->ndead;
		pthread_mutex_unlock(&c->mu);
		/* A barrier that lost a member can never complete. */
		if (lost || ndead)
			return lost ? lost : EMB_ENODEAD;
		rc = emb_etcd_get(c->etcd, dir, true, true, &r);
		if (again(c, &rc)) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		n = r.n;
		emb_etcd_range_free(&r);
		if (n >= c->reg.worker_num)
			return 0;
		if (!nap(c, wait_ms))
			return -ECANCELED;
		if (wait_ms < 50)
			wait_ms *= 2;
	}
	return rc;
}

int emb_coord_finish(struct emb_coord *c)
{
	char key[KEY_MAX];
	int rc;

	if (c->reg.role != EMB_ROLE_WORKER)
		return EMB_ECLUSTER;
	key_of(c, key, "finish/worker/%u", c->reg.rank);
	do
		rc = emb_etcd_put(c->etcd, key, "", 0, 0);
	while (again(c, &rc));
	if (rc)
		return rc;
	pthread_mutex_lock(&c->mu);
	c->ended = true;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* ---- observers ------------------------------------------------------ */

/* A client and the key prefix for a job, without joining it. */
static int observe(const char *endpoints, const char *job,
		   struct emb_etcd **e, char *prefix, size_t cap)
{
	job = job && *job ? job : EMB_COORD_JOB_DEFAULT;
	if (!job_ok(job))
		return -EINVAL;
	snprintf(prefix, cap, "/embstore/%s/", job);
	return etcd_open(endpoints, 2000, e);
}

int emb_coord_job_formed(const char *endpoints, const char *job)
{
	char key[KEY_MAX];
	struct emb_etcd_range r;
	struct emb_etcd *e;
	int rc;

	rc = observe(endpoints, job, &e, key, sizeof(key));
	if (rc)
		return rc;
	strcat(key, "map");
	rc = emb_etcd_get(e, key, false, true, &r);
	if (!rc) {
		rc = r.n ? 1 : 0;
		emb_etcd_range_free(&r);
	}
	emb_etcd_destroy(e);
	return rc;
}

int emb_coord_job_drain(const char *endpoints, const char *job, uint32_t rank,
			char *why, size_t cap)
{
	char prefix[32 + EMB_COORD_JOB_MAX];
	struct emb_etcd *e;
	int rc;

	rc = observe(endpoints, job, &e, prefix, sizeof(prefix));
	if (rc)
		return rc;
	rc = drain_ask(e, prefix, rank, why, cap);
	emb_etcd_destroy(e);
	return rc;
}

/* A job's keys as an observer reads them (job_read()). */
struct job_view {
	uint32_t M;			     /* server ranks (servers_max) */
	uint8_t live[EMB_WIRE_SERVERS_MAX];  /* server/<r> there */
	uint8_t drain[EMB_WIRE_SERVERS_MAX]; /* drain/<r> there */
	uint8_t join[EMB_WIRE_SERVERS_MAX];  /* joining/<r> there */
	struct emb_cmap map;		     /* the map key */
	char *servers;			     /* the servers key, malloc'd */
	char move[96];			     /* the move key, "" if none */
	char fill[96];			     /* the fill key, "" if none */
};

/* Copies kv's value into buf[0..cap) as a string; false if it is longer. */
static bool val_copy(const struct emb_etcd_kv *kv, char *buf, size_t cap)
{
	if (!kv->value || kv->value_len >= cap)
		return false;
	memcpy(buf, kv->value, kv->value_len);
	buf[kv->value_len] = '\0';
	return true;
}

static int job_read_on(struct emb_etcd *e, const char *prefix,
		       struct job_view **out);

/*
 * Reads job's keys from etcd at endpoints into *out (malloc'd; free
 * (*out)->servers and *out): 0, EMB_ECLUSTER (no such job, or not formed
 * yet: no map), EMB_EBADFRAME (a map that does not decode), or an etcd
 * error.
 */
static int job_read(const char *endpoints, const char *job,
		    struct job_view **out)
{
	char prefix[32 + EMB_COORD_JOB_MAX];
	struct emb_etcd *e;
	int rc;

	*out = NULL;
	rc = observe(endpoints, job, &e, prefix, sizeof(prefix));
	if (rc)
		return rc;
	rc = job_read_on(e, prefix, out);
	emb_etcd_destroy(e);
	return rc;
}

/* job_read() over an open etcd handle, of the job whose keys are under
 * prefix ("/embstore/<job>/"). */
static int job_read_on(struct emb_etcd *e, const char *prefix,
		       struct job_view **out)
{
	char key[KEY_MAX];
	struct emb_etcd_range r = {0}, cr = {0};
	struct job_view *v = calloc(1, sizeof(*v));
	uint32_t s, w, t, rp;
	bool have_map = false;
	int rc = 0;

	*out = NULL;
	if (!v)
		return -ENOMEM;
	snprintf(key, sizeof(key), "%sconfig", prefix);
	rc = emb_etcd_get(e, key, false, false, &cr);
	if (!rc && (!cr.n || config_parse(&cr.kvs[0], &s, &w, &t, &rp, &v->M)))
		rc = EMB_ECLUSTER;
	if (!rc)
		rc = emb_etcd_get(e, prefix, true, false, &r);
	for (uint32_t i = 0; !rc && i < r.n; i++) {
		const struct emb_etcd_kv *kv = &r.kvs[i];
		const char *k = kv->key + strlen(prefix);
		int64_t x;

		if ((x = rank_in(k, "server", v->M)) >= 0)
			v->live[x] = 1;
		else if ((x = rank_in(k, "drain", v->M)) >= 0)
			v->drain[x] = 1;
		else if ((x = rank_in(k, "joining", v->M)) >= 0)
			v->join[x] = 1;
		else if (!strcmp(k, "move"))
			(void)val_copy(kv, v->move, sizeof(v->move));
		else if (!strcmp(k, "fill"))
			(void)val_copy(kv, v->fill, sizeof(v->fill));
		else if (!strcmp(k, "servers") && kv->value) {
			free(v->servers);
			v->servers = strndup((const char *)kv->value,
					     kv->value_len);
			if (!v->servers)
				rc = -ENOMEM;
		} else if (!strcmp(k, "map") && kv->value) {
			if (emb_cmap_decode(kv->value, kv->value_len, &v->map))
				rc = EMB_EBADFRAME;
			have_map = true;
		}
	}
	if (!rc && (!have_map || !v->servers || v->map.nservers > v->M))
		rc = EMB_ECLUSTER;
	emb_etcd_range_free(&r);
	emb_etcd_range_free(&cr);
	if (rc) {
		free(v->servers);
		free(v);
		return rc;
	}
	*out = v;
	return 0;
}

static void job_view_free(struct job_view *v)
{
	if (v)
		free(v->servers);
	free(v);
}

int emb_coord_job_free_ranks(const char *endpoints, const char *job,
			     uint32_t *ranks, uint32_t *free_ranks)
{
	struct job_view *v;
	int rc = job_read(endpoints, job, &v);

	if (rc)
		return rc;
	*ranks = v->M;
	*free_ranks = 0;
	for (uint32_t i = 0; i < v->M && i < v->map.nservers; i++)
		*free_ranks += !v->live[i] && !emb_cmap_in_map(&v->map, i);
	job_view_free(v);
	return 0;
}

int emb_coord_job_observe(const char *endpoints, const char *job,
			  char **servers, bool **removed, struct emb_cmap *m)
{
	struct job_view *v;
	int rc = job_read(endpoints, job, &v);

	*servers = NULL;
	*removed = NULL;
	if (rc)
		return rc;
	/* One address a rank: the client indexes removed[] by the list's
	 * entries, and etcd's keys are anybody's to write. */
	{
		uint32_t n = 1;

		for (const char *p = v->servers; *p; p++)
			n += *p == ',';
		if (n != v->M || v->map.nservers != v->M) {
			job_view_free(v);
			return EMB_EBADFRAME;
		}
	}
	*removed = calloc(v->M, sizeof(**removed));
	if (!*removed) {
		job_view_free(v);
		return -ENOMEM;
	}
	/* Not dialled: a rank with no server (dead, drained, or to spare
	 * with its placeholder address), or one the map no longer lists. */
	for (uint32_t i = 0; i < v->M; i++)
		(*removed)[i] = !v->live[i] || !emb_cmap_in_map(&v->map, i);
	*m = v->map;
	*servers = v->servers;
	v->servers = NULL;
	job_view_free(v);
	return 0;
}

/* The moves under way as the job's keys in v say them
 * (emb_coord_job_moves()). */
static void moves_of(const struct job_view *v, struct emb_wire_moves *out)
{
	struct emb_wire_moves mv = {.from = UINT32_MAX, .to = UINT32_MAX,
				    .eta_ms = -1};
	struct step st;
	uint32_t waiting = 0, rank = 0, slots0 = 0;
	unsigned long long t0 = 0, rows = 0, bytes = 0;
	char kind[16] = "";
	int k;

	/* The drains and joins asked for, as the leader counts them. */
	for (uint32_t r = 0; r < v->M; r++)
		waiting += v->live[r] && ((v->drain[r] &&
					   emb_cmap_in_map(&v->map, r)) ||
					  (v->join[r] && !v->drain[r]));
	mv.queued = waiting ? waiting - 1 : 0;
	if (v->move[0] &&
	    ((k = sscanf(v->move, "%15s %u %llu %u %llu %llu", kind, &rank,
			 &t0, &slots0, &rows, &bytes)) == 4 ||
	     k == 6) &&
	    rank < v->M) {
		if (!strcmp(kind, "join"))
			mv.kind = EMB_WIRE_MOVE_JOIN;
		else if (!strcmp(kind, "drain"))
			mv.kind = EMB_WIRE_MOVE_DRAIN;
		else if (!strcmp(kind, "recovery"))
			mv.kind = EMB_WIRE_MOVE_RECOVERY;
	}
	if (mv.kind != EMB_WIRE_MOVE_NONE) {
		mv.rank = rank;
		mv.rows = rows;
		mv.bytes = bytes;
	} else {
		t0 = 0; /* a move key this observer does not know */
	}
	if (v->fill[0] && step_parse(v->fill, &st) && st.n &&
	    st.first + st.n <= EMB_NSLOTS) {
		mv.phase = st.kind == 'w' ? 1 : 2;
		mv.first = st.first;
		mv.n = st.n;
		mv.to = st.rank;
		mv.from = st.kind == 'f' ? UINT32_MAX : st.from;
		/* A fill written before the move key was. */
		if (st.kind == 'f' && mv.kind != EMB_WIRE_MOVE_RECOVERY) {
			mv.kind = EMB_WIRE_MOVE_RECOVERY;
			mv.rank = st.rank;
			t0 = 0;
			mv.rows = mv.bytes = 0;
		}
	}
	if (mv.kind != EMB_WIRE_MOVE_NONE && t0) {
		uint64_t now = wall_ms();

		mv.elapsed_ms = now > t0 ? now - t0 : 0;
	}
	if (mv.kind == EMB_WIRE_MOVE_RECOVERY) {
		mv.queued = waiting;
	} else if (mv.kind != EMB_WIRE_MOVE_NONE) {
		mv.left = move_left(&v->map,
				    mv.kind == EMB_WIRE_MOVE_DRAIN ? rank
								   : UINT32_MAX,
				    mv.kind == EMB_WIRE_MOVE_JOIN ? rank
								  : UINT32_MAX);
		mv.moved = slots0 > mv.left ? slots0 - mv.left : 0;
		if (mv.moved && mv.left)
			mv.eta_ms = (int64_t)((double)mv.elapsed_ms *
					      mv.left / mv.moved);
	}
	*out = mv;
}

int emb_coord_job_moves(const char *endpoints, const char *job,
			struct emb_wire_moves *out)
{
	struct job_view *v;
	int rc = job_read(endpoints, job, &v);

	if (rc)
		return rc;
	moves_of(v, out);
	job_view_free(v);
	return 0;
}

int emb_coord_moves(struct emb_coord *c, struct emb_wire_moves *out)
{
	struct job_view *v;
	uint64_t polls;
	bool leads;
	int rc;

	pthread_mutex_lock(&c->mu);
	leads = c->leads && !c->ended && !c->lost;
	polls = c->polls;
	pthread_mutex_unlock(&c->mu);
	if (!leads)
		return 0;
	pthread_mutex_lock(&c->moves_mu);
	if ((!c->moves_view && !c->moves_rc) || c->moves_polls != polls) {
		/* The agent's handle: it serializes this read with the
		 * agent's requests, and no connection is made per scrape.
		 * A poll that ends during the read makes the next scrape
		 * read again (polls is from before it). */
		job_view_free(c->moves_view);
		c->moves_view = NULL;
		c->moves_rc = job_read_on(c->etcd, c->prefix, &v);
		if (!c->moves_rc)
			c->moves_view = v;
		c->moves_polls = polls;
	}
	rc = c->moves_rc;
	/* Elapsed time and the ETA are of now, whichever read. */
	if (!rc)
		moves_of(c->moves_view, out);
	pthread_mutex_unlock(&c->moves_mu);
	return rc ? rc : 1;
}

int emb_coord_job_delete(const char *endpoints, const char *job)
{
	char key[KEY_MAX];
	struct emb_etcd *e;
	int rc;

	rc = observe(endpoints, job, &e, key, sizeof(key));
	if (rc)
		return rc;
	rc = emb_etcd_delete(e, key, true, NULL);
	emb_etcd_destroy(e);
	return rc;
}
