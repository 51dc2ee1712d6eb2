/*
 * src/cluster/coord.c - the coordinator on etcd (coord.h). Keys under
 * P = /embstore/<job>/ (docs/coordinator.md):
 *
 *   P config            "servers=S workers=W ttl_ms=T": the first node's
 *                       counts, which every later node must match
 *   P server/<rank>     "host:port", on the server's lease: its rank, and
 *                       that it is alive
 *   P worker/<rank>     "pid N", on the worker's lease
 *   P map               u64 epoch (LE), then a CLUSTER_MAP response frame
 *                       (wire_cluster.h): written once by CAS when every
 *                       rank is taken; later epochs by CAS on it
 *   P finish/worker/<r> a worker finished (no lease: it outlives it)
 *   P barrier/<name>/<gen>/<rank>  a worker entered a barrier
 *
 * Threads: the agent thread renews the lease and polls the keys; callers'
 * threads wait for the map and at barriers by polling too. Shared state is
 * under c->mu; the etcd handle serializes its own requests.
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
#include "common/clock.h"
#include "common/endian.h"
#include "common/err.h"
#include "common/log.h"
#include "proto/wire.h"

#define TTL_DEFAULT_MS	 10000u
#define JOIN_DEFAULT_MS	 300000u
#define POLL_MS		 100 /* waits for config and members */
#define KEY_MAX		 (EMB_ETCD_KEY_MAX + 1)
#define BARRIER_NAMES_MAX 64 /* barrier names a worker tracks */

struct emb_coord {
	struct emb_etcd *etcd;		   /* the client */
	char prefix[32 + EMB_COORD_JOB_MAX]; /* "/embstore/<job>/" */
	int64_t lease;			   /* this node's */
	struct emb_wire_register_resp reg; /* role, rank, counts, TTL */
	uint32_t join_timeout_ms;	   /* waits */
	emb_coord_end_fn on_end;	   /* optional */
	void *end_arg;			   /* for on_end */
	const volatile sig_atomic_t *cancel; /* optional */
	pthread_t thread;		   /* runs agent_main */
	bool running;			   /* thread started */

	pthread_mutex_t mu;  /* guards the fields below */
	pthread_cond_t cv;   /* stop, for the agent's sleeps */
	bool stop;	     /* destroy asked the agent to exit */
	int lost;	     /* 0, or why this node is out of the job */
	bool ended;	     /* job over for this node: no more reports */
	bool formed;	     /* the job's map exists */
	uint64_t epoch;	     /* of the map read last */
	int64_t map_rev;     /* mod_revision of the map key then */
	uint8_t *dead_srv;   /* [server_num]: declared dead */
	uint8_t *dead_wrk;   /* [worker_num]: declared dead */
	struct emb_wire_node_ref *dead; /* in order of discovery */
	uint32_t ndead;			/* entries in dead */
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

/* ---- config --------------------------------------------------------- */

static int config_parse(const struct emb_etcd_kv *kv, uint32_t *s, uint32_t *w,
			uint32_t *ttl)
{
	if (!kv->value ||
	    sscanf((const char *)kv->value, "servers=%u workers=%u ttl_ms=%u",
		   s, w, ttl) != 3 ||
	    !*s || *s > EMB_WIRE_SERVERS_MAX || !*w ||
	    *w > EMB_WIRE_WORKERS_MAX || !*ttl)
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
	char key[KEY_MAX], val[96];
	uint32_t ttl = o->ttl_ms ? o->ttl_ms : TTL_DEFAULT_MS;
	bool logged = false;
	int rc;

	key_of(c, key, "config");
	snprintf(val, sizeof(val), "servers=%u workers=%u ttl_ms=%u",
		 o->server_num, o->worker_num, ttl);
	for (;;) {
		struct emb_etcd_range r;
		uint32_t s, w, t;

		if (o->server_num && o->worker_num) {
			struct emb_etcd_cmp cmp = {.key = key,
						   .target = EMB_ETCD_CREATE};
			struct emb_etcd_op op = {.key = key,
						 .value = val,
						 .value_len = strlen(val)};
			bool ok;

			rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
			if (rc)
				return rc;
			if (ok)
				emb_log(EMB_LOG_INFO, "job %s: %s", c->prefix,
					val);
		}
		rc = emb_etcd_get(c->etcd, key, false, false, &r);
		if (rc)
			return rc;
		if (r.n) {
			rc = config_parse(&r.kvs[0], &s, &w, &t);
			if (rc)
				emb_log(EMB_LOG_ERROR, "job %s: bad config '%s'",
					c->prefix, (char *)r.kvs[0].value);
			emb_etcd_range_free(&r);
			if (rc)
				return rc;
			if ((o->server_num && o->server_num != s) ||
			    (o->worker_num && o->worker_num != w)) {
				emb_log(EMB_LOG_ERROR,
					"job %s has %u servers and %u workers, "
					"not %u and %u (a stale job? delete "
					"its keys or pick another EMB_JOB)",
					c->prefix, s, w, o->server_num,
					o->worker_num);
				return EMB_ECLUSTER;
			}
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
	}
}

/* ---- ranks ---------------------------------------------------------- */

/* Claims the lowest free rank of our role, on our lease. */
static int claim_rank(struct emb_coord *c, const struct emb_coord_opts *o)
{
	uint32_t count = o->role == EMB_ROLE_SERVER ? c->reg.server_num
						    : c->reg.worker_num;
	char key[KEY_MAX], val[EMB_WIRE_HOST_MAX + 16];
	struct emb_etcd_range r;
	int rc;

	key_of(c, key, "map");
	rc = emb_etcd_get(c->etcd, key, false, true, &r);
	if (rc)
		return rc;
	if (r.n) {
		emb_etcd_range_free(&r);
		emb_log(EMB_LOG_ERROR,
			"job %s formed already: a node cannot join it (a "
			"stale job? delete its keys or pick another EMB_JOB)",
			c->prefix);
		return EMB_ECLUSTER;
	}
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
	for (uint32_t rank = 0; rank < count; rank++) {
		struct emb_etcd_cmp cmp = {.key = key,
					   .target = EMB_ETCD_CREATE};
		struct emb_etcd_op op = {.key = key,
					 .value = val,
					 .value_len = strlen(val),
					 .lease = c->lease};
		bool ok;

		key_of(c, key, "%s/%u", role_dir(o->role), rank);
		rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
		if (rc)
			return rc;
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
 * Agent thread: which ranks are alive and which workers finished, from one
 * keys-only read of the job. Dead: a rank key gone (its lease expired or
 * was revoked) without a finish record, once the job formed (its map
 * exists: servers never wait for it, so the agent looks).
 */
static int poll_job(struct emb_coord *c)
{
	const uint32_t S = c->reg.server_num, W = c->reg.worker_num;
	size_t plen = strlen(c->prefix);
	uint8_t *live = calloc((size_t)S + 2u * W, 1);
	uint8_t *lw = live + S, *fin = lw + W;
	struct emb_etcd_range r;
	uint32_t gone = 0;
	bool formed = false;
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
		else if (!strcmp(k, "map"))
			formed = true;
	}
	emb_etcd_range_free(&r);
	pthread_mutex_lock(&c->mu);
	c->formed = c->formed || formed;
	formed = c->formed;
	pthread_mutex_unlock(&c->mu);
	if (!formed) {
		free(live);
		return 0;
	}
	for (uint32_t i = 0; i < S + W; i++) {
		bool srv = i < S;
		uint32_t rank = srv ? i : i - S;
		bool dead;

		if (srv ? live[rank] : lw[rank] || fin[rank])
			continue;
		pthread_mutex_lock(&c->mu);
		dead = srv ? c->dead_srv[rank] : c->dead_wrk[rank];
		if (!dead && !c->ended) {
			if (srv)
				c->dead_srv[rank] = 1;
			else
				c->dead_wrk[rank] = 1;
		}
		pthread_mutex_unlock(&c->mu);
		if (!dead && !c->ended)
			declare_dead(c, srv ? EMB_ROLE_SERVER : EMB_ROLE_WORKER,
				     rank);
	}
	/* The job is over once every worker finished or died. */
	for (uint32_t w = 0; w < W; w++)
		gone += fin[w] || !lw[w];
	free(live);
	if (gone == W && c->reg.role == EMB_ROLE_SERVER)
		end_job(c, 0, NULL);
	return 0;
}

static void *agent_main(void *arg)
{
	struct emb_coord *c = arg;
	const uint32_t ttl = c->reg.hb_timeout_ms;
	const uint32_t renew = ttl / 3 ? ttl / 3 : 1;
	const uint32_t poll = ttl / 5 ? ttl / 5 : 1;
	int64_t last_ok = (int64_t)emb_clock_ms(), next_renew = last_ok;
	int64_t next_poll = last_ok;

	for (;;) {
		int64_t now = (int64_t)emb_clock_ms();
		bool quiet;
		int rc;

		pthread_mutex_lock(&c->mu);
		quiet = c->lost || c->ended;
		pthread_mutex_unlock(&c->mu);
		if (!quiet && now >= next_renew) {
			next_renew = now + renew;
			rc = emb_etcd_lease_keepalive(c->etcd, c->lease, NULL);
			if (rc == 0) {
				last_ok = (int64_t)emb_clock_ms();
			} else if (rc == EMB_ENOLEASE) {
				end_job(c, EMB_ENODEAD,
					"its etcd lease expired: the others "
					"count it dead");
			} else if (now - last_ok > ttl) {
				char why[96];

				snprintf(why, sizeof(why),
					 "etcd unreachable for %u ms: %s", ttl,
					 emb_strerror(rc));
				end_job(c, EMB_ENOETCD, why);
			}
		}
		if (!quiet && now >= next_poll) {
			next_poll = now + poll;
			rc = poll_job(c);
			if (rc)
				emb_log(EMB_LOG_DEBUG, "job %s: poll: %s",
					c->prefix, emb_strerror(rc));
		}
		now = (int64_t)emb_clock_ms();
		if (!nap(c, (uint32_t)(now < next_poll && next_poll < next_renew
					   ? next_poll - now
				       : now < next_renew ? next_renew - now
							  : 1)))
			break;
	}
	return NULL;
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
	    opts->worker_num > EMB_WIRE_WORKERS_MAX)
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
	deadline = (int64_t)emb_clock_ms() + c->join_timeout_ms;
	ttl_ms = opts->ttl_ms ? opts->ttl_ms : TTL_DEFAULT_MS;
	/* Requests wait at most a third of the TTL per endpoint, so one
	 * dead member costs a renewal, never the lease. */
	rc = etcd_open(opts->endpoints, ttl_ms / 3 < 500 ? 500 : ttl_ms / 3,
		       &c->etcd);
	if (rc)
		goto err_free;
	rc = config_join(c, opts, deadline);
	if (rc)
		goto err_etcd;
	/* The job's TTL, in whole seconds, at least 1; etcd may raise it
	 * to its own minimum, and the agent renews every TTL / 3. */
	ttl_s = ((int64_t)c->reg.hb_timeout_ms + 999) / 1000;
	rc = emb_etcd_lease_grant(c->etcd, ttl_s, &c->lease);
	if (rc)
		goto err_etcd;
	rc = claim_rank(c, opts);
	if (rc)
		goto err_lease;
	c->dead_srv = calloc(c->reg.server_num, 1);
	c->dead_wrk = calloc(c->reg.worker_num, 1);
	c->dead = calloc((size_t)c->reg.server_num + c->reg.worker_num,
			 sizeof(*c->dead));
	c->bar_names = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_names));
	c->bar_gens = calloc(BARRIER_NAMES_MAX, sizeof(*c->bar_gens));
	if (!c->dead_srv || !c->dead_wrk || !c->dead || !c->bar_names ||
	    !c->bar_gens) {
		rc = -ENOMEM;
		goto err_lease;
	}
	emb_log(EMB_LOG_INFO, "joined job %s through etcd %s as %s %u of %u",
		c->prefix, emb_etcd_endpoint(c->etcd),
		emb_role_name(c->reg.role), c->reg.rank,
		c->reg.role == EMB_ROLE_SERVER ? c->reg.server_num
					       : c->reg.worker_num);
	/* The agent takes no signals: they stay with the host's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = -pthread_create(&c->thread, NULL, agent_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		goto err_lease;
	c->running = true;
	*out = c;
	return 0;

err_lease:
	/* The rank key goes with the lease. */
	emb_etcd_lease_revoke(c->etcd, c->lease);
err_etcd:
	emb_etcd_destroy(c->etcd);
err_free:
	free(c->dead_srv);
	free(c->dead_wrk);
	free(c->dead);
	free(c->bar_names);
	free(c->bar_gens);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
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
	}
	/* Best effort: if etcd is gone, the lease expires on its own. */
	emb_etcd_lease_revoke(c->etcd, c->lease);
	emb_etcd_destroy(c->etcd);
	free(c->dead_srv);
	free(c->dead_wrk);
	free(c->dead);
	free(c->bar_names);
	free(c->bar_gens);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

const struct emb_wire_register_resp *emb_coord_reg(const struct emb_coord *c)
{
	return &c->reg;
}

uint64_t emb_coord_epoch(const struct emb_coord *c)
{
	return c->epoch;
}

/* ---- the map -------------------------------------------------------- */

/* Decodes a map value into slot_map and a new *servers. */
static int map_decode(struct emb_coord *c, const struct emb_etcd_kv *kv,
		      uint16_t *slot_map, struct emb_wire_node_addr **servers)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_cluster_map m;
	struct emb_wire_frame f;
	struct emb_wire_node_addr *srv;
	int rc;

	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	if (!kv->value || kv->value_len < 8 + EMB_WIRE_HDR_SIZE)
		return EMB_EBADFRAME;
	rc = emb_wire_frame_decode(kv->value + 8, kv->value_len - 8, &lim, &f);
	if (!rc)
		rc = emb_wire_cluster_map_decode(&f, &m);
	if (rc)
		return rc;
	if (m.nservers != c->reg.server_num || m.nworkers != c->reg.worker_num)
		return EMB_EBADFRAME;
	srv = calloc(m.nservers, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	for (uint32_t i = 0; i < m.nservers; i++)
		emb_wire_cluster_map_server(&m, i, &srv[i]);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		slot_map[s] = emb_wire_cluster_map_slot(&m, s);
	*servers = srv;
	pthread_mutex_lock(&c->mu);
	c->epoch = emb_le64_load(kv->value);
	c->map_rev = kv->mod_revision;
	c->formed = true;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* A server's "host:port" (brackets around IPv6) into a. */
static int addr_take(const struct emb_etcd_kv *kv,
		     struct emb_wire_node_addr *a)
{
	const char *v = (const char *)kv->value;
	const char *colon = v ? strrchr(v, ':') : NULL;
	size_t hl;
	char *end;
	unsigned long port;

	if (!colon)
		return EMB_EETCD;
	hl = (size_t)(colon - v);
	if (hl >= 2 && v[0] == '[' && v[hl - 1] == ']') {
		v++;
		hl -= 2;
	}
	port = strtoul(colon + 1, &end, 10);
	if (!hl || hl > EMB_WIRE_HOST_MAX || *end || !port || port > 65535)
		return EMB_EETCD;
	memcpy(a->host, v, hl);
	a->host[hl] = '\0';
	a->port = (uint16_t)port;
	return 0;
}

/*
 * Every rank is taken: writes map epoch 1 unless someone did. The servers
 * by rank from their keys, the slots in the contiguous ranges a client
 * computes from a server list.
 */
static int map_write(struct emb_coord *c, const struct emb_etcd_range *srvr)
{
	const uint32_t S = c->reg.server_num;
	struct emb_wire_node_addr *srv = calloc(S, sizeof(*srv));
	uint16_t *slots = malloc(EMB_NSLOTS * sizeof(*slots));
	size_t cap = 8 + emb_wire_cluster_map_bytes(S);
	uint8_t *buf = malloc(cap);
	size_t plen = strlen(c->prefix);
	char key[KEY_MAX];
	int len, rc = -ENOMEM;
	bool ok;

	if (!srv || !slots || !buf)
		goto out;
	for (uint32_t i = 0; i < srvr->n; i++) {
		int64_t r = rank_in(srvr->kvs[i].key + plen, "server", S);

		if (r < 0)
			continue;
		rc = addr_take(&srvr->kvs[i], &srv[r]);
		if (rc) {
			emb_log(EMB_LOG_ERROR, "job %s: bad server key %s",
				c->prefix, srvr->kvs[i].key);
			goto out;
		}
	}
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		slots[s] = (uint16_t)((uint64_t)s * S / EMB_NSLOTS);
	emb_le64_store(buf, 1);
	len = emb_wire_cluster_map_encode(buf + 8, cap - 8, 0,
					  c->reg.worker_num, slots, srv, S);
	if (len < 0) {
		rc = len;
		goto out;
	}
	key_of(c, key, "map");
	{
		struct emb_etcd_cmp cmp = {.key = key,
					   .target = EMB_ETCD_CREATE};
		struct emb_etcd_op op = {
		    .key = key, .value = buf, .value_len = 8 + (size_t)len};

		rc = emb_etcd_txn(c->etcd, &cmp, 1, &op, 1, &ok);
	}
	if (!rc && ok)
		emb_log(EMB_LOG_INFO,
			"job %s ready: %u servers, %u workers (map epoch 1)",
			c->prefix, S, c->reg.worker_num);
out:
	free(buf);
	free(slots);
	free(srv);
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
		if (rc)
			return rc;
		if (r.n) {
			rc = map_decode(c, &r.kvs[0], slot_map, servers);
			emb_etcd_range_free(&r);
			if (rc)
				emb_log(EMB_LOG_ERROR, "job %s: bad map: %s",
					c->prefix, emb_strerror(rc));
			return rc;
		}
		emb_etcd_range_free(&r);
		key_of(c, key, "server/");
		rc = emb_etcd_get(c->etcd, key, true, false, &srv);
		if (rc)
			return rc;
		key_of(c, key, "worker/");
		rc = emb_etcd_get(c->etcd, key, true, true, &wrk);
		if (rc) {
			emb_etcd_range_free(&srv);
			return rc;
		}
		if (srv.n == c->reg.server_num && wrk.n == c->reg.worker_num)
			rc = map_write(c, &srv);
		emb_etcd_range_free(&srv);
		emb_etcd_range_free(&wrk);
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
		rc = emb_etcd_delete(c->etcd, key, false, NULL);
		if (rc)
			return rc;
	}
	key_of(c, key, "barrier/%s/%" PRIu64 "/%u", name, gen, c->reg.rank);
	key_of(c, dir, "barrier/%s/%" PRIu64 "/", name, gen);
	rc = emb_etcd_put(c->etcd, key, "", 0, c->lease);
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
	rc = emb_etcd_put(c->etcd, key, "", 0, 0);
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

int emb_coord_job_servers(const char *endpoints, const char *job, char *buf,
			  size_t cap)
{
	struct emb_coord c = {0};
	struct emb_wire_node_addr *srv = NULL;
	uint16_t *slots = malloc(EMB_NSLOTS * sizeof(*slots));
	struct emb_etcd_range r = {0};
	char key[KEY_MAX];
	size_t at = 0;
	int rc;

	if (!buf || !cap) {
		free(slots);
		return -EINVAL;
	}
	if (!slots)
		return -ENOMEM;
	rc = observe(endpoints, job, &c.etcd, c.prefix, sizeof(c.prefix));
	if (rc) {
		free(slots);
		return rc;
	}
	pthread_mutex_init(&c.mu, NULL);
	key_of(&c, key, "config");
	rc = emb_etcd_get(c.etcd, key, false, false, &r);
	if (!rc && (!r.n || config_parse(&r.kvs[0], &c.reg.server_num,
					  &c.reg.worker_num,
					  &c.reg.hb_timeout_ms)))
		rc = EMB_ECLUSTER;
	emb_etcd_range_free(&r);
	key_of(&c, key, "map");
	if (!rc)
		rc = emb_etcd_get(c.etcd, key, false, false, &r);
	if (!rc && !r.n)
		rc = EMB_ECLUSTER;
	if (!rc)
		rc = map_decode(&c, &r.kvs[0], slots, &srv);
	emb_etcd_range_free(&r);
	if (!rc)
		buf[0] = '\0';
	for (uint32_t i = 0; !rc && i < c.reg.server_num; i++) {
		int n = snprintf(buf + at, cap - at,
				 strchr(srv[i].host, ':') ? "%s[%s]:%u"
							  : "%s%s:%u",
				 i ? "," : "", srv[i].host, srv[i].port);

		if (n < 0 || (size_t)n >= cap - at)
			rc = -ENOSPC;
		else
			at += (size_t)n;
	}
	free(srv);
	free(slots);
	pthread_mutex_destroy(&c.mu);
	emb_etcd_destroy(c.etcd);
	return rc;
}
