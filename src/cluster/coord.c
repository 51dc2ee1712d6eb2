/*
 * src/cluster/coord.c - the coordinator on etcd (coord.h). Keys under
 * P = /embstore/<job>/ (docs/coordinator.md):
 *
 *   P config            "servers=S workers=W ttl_ms=T replicas=R": the
 *                       first node's, which every later node must match
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
 *   P fill              "rank first n epoch": the chunk being filled and
 *                       the epoch of the map that began it (written with
 *                       that map)
 *   P fill_done         "source first n epoch status": the chunk's source
 *                       streamed it (or failed to); deleted by the map
 *                       that takes the next step
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

struct emb_coord {
	struct emb_etcd *etcd;		   /* the client, for all but the lease */
	struct emb_etcd *lease_etcd;	   /* the lease's: grant, renew, revoke */
	uint32_t timeout_ms;		   /* per request and endpoint */
	char prefix[32 + EMB_COORD_JOB_MAX]; /* "/embstore/<job>/" */
	int64_t lease;			   /* this node's */
	uint32_t replicas;		   /* copies of each slot, the job's */
	struct emb_wire_register_resp reg; /* role, rank, counts, TTL */
	char rank_val[EMB_WIRE_HOST_MAX + 16]; /* the rank key's value */
	uint32_t join_timeout_ms;	   /* waits */
	emb_coord_end_fn on_end;	   /* optional */
	void *end_arg;			   /* for on_end */
	const volatile sig_atomic_t *cancel; /* optional */
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
	struct emb_wire_node_ref *dead; /* in order of discovery */
	uint32_t ndead;			/* entries in dead */
	uint32_t dead_cap;		/* room in dead */
	bool busy;	/* a fill under way or a newcomer waiting for one:
			   the agent polls every POLL_MS */
	int64_t relet_at;    /* emb_clock_ms() of this node's last re-let
				(relet()), 0 if none */
	int64_t silent_at;   /* of the lease thread's last renewal that
				etcd did not answer, 0 if none */
	int64_t *gone_since; /* agent: [S + W] when a rank's key was first
				missing in a vanish of many (poll_job()),
				0 if not waited for */
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

/* Sleeps ms unless stopped or cancelled; false if it should give up. */
static bool nap(struct emb_coord *c, uint32_t ms)
{
	struct timespec ts;
	bool stop;

	if (c->cancel && *c->cancel)
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
	return !stop && !(c->cancel && *c->cancel);
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

static int config_parse(const struct emb_etcd_kv *kv, uint32_t *s, uint32_t *w,
			uint32_t *ttl, uint32_t *r)
{
	if (!kv->value ||
	    sscanf((const char *)kv->value,
		   "servers=%u workers=%u ttl_ms=%u replicas=%u", s, w, ttl,
		   r) != 4 ||
	    !*s || *s > EMB_WIRE_SERVERS_MAX || !*w ||
	    *w > EMB_WIRE_WORKERS_MAX || !*ttl || !*r ||
	    *r > EMB_CMAP_REPLICAS_MAX || *r > *s)
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
	snprintf(val, sizeof(val),
		 "servers=%u workers=%u ttl_ms=%u replicas=%u", o->server_num,
		 o->worker_num, ttl, o->replicas ? o->replicas : 1);
	for (;;) {
		struct emb_etcd_range r;
		uint32_t s, w, t, rp;

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
			rc = config_parse(&r.kvs[0], &s, &w, &t, &rp);
			if (rc)
				emb_log(EMB_LOG_ERROR, "job %s: bad config '%s'",
					c->prefix, (char *)r.kvs[0].value);
			emb_etcd_range_free(&r);
			if (rc)
				return rc;
			if ((o->server_num && o->server_num != s) ||
			    (o->worker_num && o->worker_num != w) ||
			    (o->replicas && o->replicas != rp)) {
				emb_log(EMB_LOG_ERROR,
					"job %s has %u servers, %u workers "
					"and %u replicas, not %u, %u and %u "
					"(a stale job? delete its keys or "
					"pick another EMB_JOB)",
					c->prefix, s, w, rp, o->server_num,
					o->worker_num, o->replicas);
				return EMB_ECLUSTER;
			}
			c->replicas = rp;
			c->reg.server_num = s;
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
	uint8_t *taken = calloc(S, 1);
	char kmap[KEY_MAX], ksrv[KEY_MAX], kr[KEY_MAX], kw[KEY_MAX],
	    kf[KEY_MAX], kd[KEY_MAX];
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

		memset(taken, 0, S);
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
				"place to take",
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
			struct emb_etcd_op ops[5] = {
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
			};

			rc = emb_etcd_txn(c->etcd, cmps, 3, ops, 5, &ok);
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
		emb_log(EMB_LOG_INFO,
			"job %s: takes dead server %u's place at %s (map "
			"epoch %llu); the leader fills it with its slots",
			c->prefix, rank, addr, (unsigned long long)m->epoch);
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
	uint32_t count = o->role == EMB_ROLE_SERVER ? c->reg.server_num
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
		 * copies (claim_dead_rank()); nobody else joins late. */
		if (o->role == EMB_ROLE_SERVER && c->replicas >= 2)
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
	struct emb_etcd_op all[5];
	char key[KEY_MAX];
	int rc;

	*ok = false;
	if (!buf || nops > 4) {
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
	    val[96];
	struct emb_etcd_op ops[4];
	uint32_t nops = 0, first = from % EMB_NSLOTS;
	int n = emb_cmap_fill_next(m, rank, FILL_CHUNK_SLOTS, &first);
	int rb = 0, rc;
	bool ok;

	key_of(c, kfill, "fill");
	key_of(c, kdone, "fill_done");
	key_of(c, kwait, "filling/%u", rank);
	key_of(c, kfails, "fill_fails");
	if (n < 0) {
		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
	} else if (n > 0) {
		emb_cmap_fill_begin(m, rank, first, (uint32_t)n, m);
		snprintf(val, sizeof(val), "%u %u %d %llu", rank, first, n,
			 (unsigned long long)m->epoch);
		ops[nops++] = (struct emb_etcd_op){
		    .key = kfill, .value = val, .value_len = strlen(val)};
	} else {
		rb = emb_cmap_rebalance(m, m);
		ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kwait, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
	}
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
	else
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u is a full replica; %d "
			"primary slot%s rebalanced, it is primary of %u",
			(unsigned long long)m->epoch, rank, rb > 0 ? rb : 0,
			rb == 1 ? "" : "s", emb_cmap_primary_slots(m, rank));
	return 0;
}

/*
 * Leader: chunk first..first+n-1 of rank's fill failed (its source said
 * so, or said nothing for FILL_TIMEOUT_MS). Up to FILL_TRIES failed
 * streams a recovery, the chunk is given up in a map of its own (the next
 * poll begins it again) and the count kept in fill_fails ("rank count");
 * then the recovery is given up, as the scheduler gives it up: filling/r
 * goes, and r keeps the slots it got. done_rev as fill_step()'s.
 */
static int fill_fail(struct emb_coord *c, struct emb_cmap *m, int64_t rev,
		     uint32_t rank, uint32_t first, uint32_t n,
		     int64_t done_rev)
{
	char kfill[KEY_MAX], kdone[KEY_MAX], kwait[KEY_MAX], kfails[KEY_MAX],
	    v[64];
	struct emb_etcd_op ops[4];
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
	emb_cmap_fill_abort(m, rank, first, n, m);
	ops[nops++] = (struct emb_etcd_op){.key = kfill, .del = true};
	if (fails >= FILL_TRIES) {
		ops[nops++] = (struct emb_etcd_op){.key = kwait, .del = true};
		ops[nops++] = (struct emb_etcd_op){.key = kfails, .del = true};
	} else {
		snprintf(v, sizeof(v), "%u %u", rank, fails);
		ops[nops++] = (struct emb_etcd_op){
		    .key = kfails, .value = v, .value_len = strlen(v)};
	}
	if (done_rev)
		ops[nops++] = (struct emb_etcd_op){.key = kdone, .del = true};
	rc = map_cas(c, m, rev, ops, nops, &ok);
	if (rc || !ok)
		return rc; /* lost the race: the next poll looks again */
	if (fails >= FILL_TRIES)
		emb_log(EMB_LOG_ERROR,
			"server %u: recovery given up after %u failed "
			"streams; it keeps the %u slots it got",
			rank, fails, emb_cmap_primary_slots(m, rank));
	return 0;
}

/*
 * Agent thread of the leader (the live server of lowest rank), in a job
 * with copies: the next step of a recovery, kept in etcd so that a new
 * leader goes on where the last one stopped (docs/coordinator.md). With
 * a chunk under way: the source's fill_done ends it (or, failed, begins
 * it again) and begins the next; without one, a live newcomer waiting
 * (waiting[r]) gets its first chunk. The steps are the scheduler's map
 * functions; a death in between is failover()'s (emb_cmap_remove()
 * drops a fill whose source or newcomer died).
 */
static int recover(struct emb_coord *c, const uint8_t *live,
		   const uint8_t *waiting, bool have_done)
{
	const uint32_t S = c->reg.server_num;
	struct emb_cmap *m = malloc(sizeof(*m));
	uint32_t t, first, n;
	char v[96];
	int64_t rev, vrev;
	int rc = 0;

	if (!m)
		return -ENOMEM;
	pthread_mutex_lock(&c->mu);
	*m = *c->map;
	rev = c->map_rev;
	pthread_mutex_unlock(&c->mu);
	if (!fill_under_way(m, &t, &first, &n)) {
		for (uint32_t r = 0; r < S; r++)
			if (waiting[r] && live[r]) {
				rc = fill_step(c, m, rev, r, 0, 0);
				break;
			}
		goto out;
	}
	if (t >= S || !live[t])
		goto out; /* failover() drops it */
	{
		uint32_t fr, ff, fn, dr, df, dn;
		unsigned long long fe = 0, de;
		int st;
		int64_t frev;

		/* The epoch the chunk began at: a report of an older stream
		 * of the same chunk (one the leader gave up) is not its. */
		if (small_get(c, "fill", v, sizeof(v), &frev) == 0 &&
		    (sscanf(v, "%u %u %u %llu", &fr, &ff, &fn, &fe) != 4 ||
		     fr != t || ff != first || fn != n))
			fe = 0;
		rc = have_done ? small_get(c, "fill_done", v, sizeof(v), &vrev)
			       : -ENOENT;
		if (rc == -ENOENT) {
			rc = 0;
			/* No word from the source: a chunk stuck past the
			 * timeout begins again (a new leader starts the
			 * clock again). */
			if (c->watch_rank != t || c->watch_first != first ||
			    c->watch_epoch != fe) {
				c->watch_rank = t;
				c->watch_first = first;
				c->watch_epoch = fe;
				c->watch_since = (int64_t)emb_clock_ms();
			} else if ((int64_t)emb_clock_ms() - c->watch_since >
				   FILL_TIMEOUT_MS) {
				emb_log(EMB_LOG_WARN,
					"the fill of slots %u-%u into server "
					"%u had no word from its source in "
					"%d s: filling them again",
					first, first + n - 1, t,
					FILL_TIMEOUT_MS / 1000);
				c->watch_rank = UINT32_MAX;
				rc = fill_fail(c, m, rev, t, first, n, 0);
			}
			goto out;
		}
		if (rc)
			goto out;
		if (sscanf(v, "%u %u %u %llu %d", &dr, &df, &dn, &de, &st) !=
			5 ||
		    dr != emb_cmap_primary(m, first) || df != first ||
		    dn != n || de < fe) {
			/* Not this chunk's: an older stream's report. */
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
		if (st) {
			emb_log(EMB_LOG_WARN,
				"server %u could not stream slots %u-%u to "
				"server %u (%s): filling them again",
				dr, first, first + n - 1, t, emb_strerror(st));
			rc = fill_fail(c, m, rev, t, first, n, vrev);
		} else {
			emb_cmap_fill_done(m, t, first, n, m);
			rc = fill_step(c, m, rev, t, first + n, vrev);
		}
	}
out:
	free(m);
	return rc;
}

int emb_coord_fill_done(struct emb_coord *c, uint32_t first, uint32_t n,
			uint64_t epoch, int status)
{
	char key[KEY_MAX], val[96];
	int rc;

	if (c->reg.role != EMB_ROLE_SERVER || c->replicas < 2)
		return EMB_ECLUSTER;
	key_of(c, key, "fill_done");
	snprintf(val, sizeof(val), "%u %u %u %llu %d", c->reg.rank, first, n,
		 (unsigned long long)epoch, status);
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
		     const uint8_t *fin)
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

		if (srv ? c->dead_srv[rank] : (c->dead_wrk[rank] || fin[rank]))
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

		if (*here || (!srv && fin[rank])) {
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
	uint8_t *live = calloc(2u * S + 2u * W, 1);
	uint8_t *lw = live + S, *fin = lw + W, *waiting = fin + W;
	struct emb_etcd_range r;
	int64_t map_rev = 0, have_rev;
	uint32_t gone = 0, first_live = UINT32_MAX, t, f, nf;
	bool have_done = false, busy;
	int rc;

	if (!live)
		return -ENOMEM;
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
		else if (!strcmp(k, "fill_done"))
			have_done = true;
		else if (!strcmp(k, "map"))
			map_rev = r.kvs[i].mod_revision;
	}
	emb_etcd_range_free(&r);
	pthread_mutex_lock(&c->mu);
	have_rev = c->map_rev;
	pthread_mutex_unlock(&c->mu);
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
	vanished(c, live, lw, fin);
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
		rc = c->replicas >= 2 ? recover(c, live, waiting, have_done)
				      : 0;
		if (rc)
			emb_log(EMB_LOG_WARN, "job %s: recovery step: %s",
				c->prefix, emb_strerror(rc));
	}
	/* While a newcomer waits or is filled, every node polls often: the
	 * leader for the source's word, the source and the newcomer for the
	 * next chunk's map, workers for the map that lifts a fence. */
	pthread_mutex_lock(&c->mu);
	busy = fill_under_way(c->map, &t, &f, &nf);
	for (uint32_t i = 0; i < S && !busy; i++)
		busy = waiting[i] && live[i];
	c->busy = busy;
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
 * puts the key back. The others wait for ranks that vanish many at once
 * (vanished()). 0, or why not: EMB_ENODEAD if the job went on without
 * this node, EMB_ECLUSTER if its keys are gone, or an etcd error (the
 * lease thread tries again).
 */
static int relet(struct emb_coord *c)
{
	const int64_t ttl_s = ((int64_t)c->reg.hb_timeout_ms + 999) / 1000;
	struct emb_cmap *m = malloc(sizeof(*m));
	char kmap[KEY_MAX], krank[KEY_MAX], kdead[KEY_MAX];
	int64_t lease;
	int rc;

	if (!m)
		return -ENOMEM;
	rc = emb_etcd_lease_grant(c->lease_etcd, ttl_s, &lease);
	if (rc) {
		free(m);
		return rc;
	}
	key_of(c, kmap, "map");
	key_of(c, krank, "%s/%u", role_dir(c->reg.role), c->reg.rank);
	key_of(c, kdead, "dead/%s/%u", role_dir(c->reg.role), c->reg.rank);
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
		if (!r.n || !r.kvs[0].value ||
		    emb_cmap_decode(r.kvs[0].value, r.kvs[0].value_len, m)) {
			emb_etcd_range_free(&r);
			rc = EMB_ECLUSTER; /* the job's keys are gone */
			break;
		}
		cmps[2].revision = r.kvs[0].mod_revision;
		emb_etcd_range_free(&r);
		if (c->reg.role == EMB_ROLE_SERVER &&
		    (c->reg.rank >= m->nservers ||
		     !emb_cmap_in_map(m, c->reg.rank))) {
			rc = EMB_ENODEAD;
			break;
		}
		rc = emb_etcd_txn(c->lease_etcd, cmps, 3, &op, 1, &ok);
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
	int64_t last_ok = (int64_t)emb_clock_ms(), next_renew = last_ok;
	/* The lease's life as etcd granted it: at least the job's TTL
	 * rounded up to seconds, more where etcd has a higher minimum. */
	int64_t lease_ms = ((int64_t)ttl + 999) / 1000 * 1000, got_s;
	bool past = false; /* told that etcd is silent past the lease */
	bool silent = false; /* a renewal etcd did not answer since the
				last that it did */

	for (;;) {
		int64_t now = (int64_t)emb_clock_ms(), left, wait;
		bool quiet;
		int rc;

		pthread_mutex_lock(&c->mu);
		quiet = c->lost || c->ended;
		pthread_mutex_unlock(&c->mu);
		if (!quiet && now >= next_renew) {
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
			/* Only after etcd was silent to this node: a node
			 * whose renewals etcd answered, but that did not
			 * send them in time (frozen, starved), is dead to
			 * the others, as before. */
			if (rc == EMB_ENOLEASE && silent) {
				int64_t gap = (int64_t)emb_clock_ms() - last_ok;

				rc = relet(c);
				if (!rc) {
					emb_log(EMB_LOG_WARN,
						"%s %u: its etcd lease ended "
						"while it lived (etcd silent "
						"for %lld ms): took its rank "
						"back on a new lease",
						emb_role_name(c->reg.role),
						c->reg.rank, (long long)gap);
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
			return !(c->cancel && *c->cancel);
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
		if (stop || (c->cancel && *c->cancel))
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

	for (;;) {
		int64_t last = (int64_t)emb_clock_ms();
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
		/* Until the job formed, a server looks for its map every
		 * POLL_MS: without one it refuses the writes of a
		 * replicated job's workers, which have it at once (they
		 * wait for it themselves). So does every node during a
		 * recovery (c->busy): each chunk is a few map steps. */
		pthread_mutex_lock(&c->mu);
		quiet = (c->busy ||
			 (c->epoch == 0 && c->reg.role == EMB_ROLE_SERVER)) &&
			poll > POLL_MS;
		pthread_mutex_unlock(&c->mu);
		if (!agent_nap(c, last + (quiet ? POLL_MS : poll),
			       last + POKE_MIN_MS))
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
	free(c->gone_since);
	free(c->dead);
	free(c->bar_names);
	free(c->bar_gens);
	free(c->map);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

int emb_coord_create(const struct emb_coord_opts *opts, struct emb_coord **out)
{
	const char *job;
	struct emb_coord *c;
	int64_t deadline, ttl_s;
	sigset_t all, old;
	uint32_t ttl_ms;
	int rc;

	if (!opts || !out ||
	    (opts->role != EMB_ROLE_SERVER && opts->role != EMB_ROLE_WORKER) ||
	    (opts->role == EMB_ROLE_SERVER && !opts->port) ||
	    opts->server_num > EMB_WIRE_SERVERS_MAX ||
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
	pthread_cond_init(&c->cv, NULL);
	snprintf(c->prefix, sizeof(c->prefix), "/embstore/%s/", job);
	c->on_end = opts->on_end;
	c->end_arg = opts->arg;
	c->cancel = opts->cancel;
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
	/* A grant whose answer is lost leaves a lease that expires on its
	 * own. */
	do
		rc = emb_etcd_lease_grant(c->lease_etcd, ttl_s, &c->lease);
	while (again_until(c, rc, deadline));
	if (rc)
		goto err_etcd;
	rc = claim_rank(c, opts, deadline);
	if (rc)
		goto err_lease;
	c->dead_srv = calloc(c->reg.server_num, 1);
	c->dead_wrk = calloc(c->reg.worker_num, 1);
	c->gone_since = calloc((size_t)c->reg.server_num + c->reg.worker_num,
			       sizeof(*c->gone_since));
	c->dead_cap = c->reg.server_num + c->reg.worker_num;
	c->dead = calloc(c->dead_cap, sizeof(*c->dead));
	c->bar_names = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_names));
	c->bar_gens = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_gens));
	c->map = calloc(1, sizeof(*c->map));
	if (!c->dead_srv || !c->dead_wrk || !c->gone_since || !c->dead ||
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
	/* Our threads take no signals: they stay with the host's. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = -pthread_create(&c->lease_thread, NULL, lease_main, c);
	if (rc == 0) {
		rc = -pthread_create(&c->thread, NULL, agent_main, c);
		if (rc) {
			pthread_mutex_lock(&c->mu);
			c->stop = true;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
			pthread_join(c->lease_thread, NULL);
		}
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
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
	const uint32_t S = c->reg.server_num;
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
		int64_t r = rank_in(srvr->kvs[i].key + plen, "server", S);

		if (r >= 0)
			by_rank[r] = (const char *)srvr->kvs[i].value;
	}
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
	rc = emb_cmap_init(m, S, c->replicas);
	if (rc)
		goto out;
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
			"slot (map epoch 1)",
			c->prefix, S, c->reg.worker_num, c->replicas,
			c->replicas == 1 ? "y" : "ies");
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
		if (srv.n == c->reg.server_num && wrk.n == c->reg.worker_num)
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
