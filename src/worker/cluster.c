/*
 * src/worker/cluster.c - a worker joins a cluster from the environment:
 * emb_client_from_env() and the calls that need the scheduler (rank,
 * worker count, barrier, finish). The membership itself (heartbeats, the
 * map) is src/cluster/node.c; the client only learns the map and which servers
 * died. Every function may be called from any thread, as embstore.h says.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/addr.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/token.h"
#include "proto/wire_cluster.h"
#include "transport/transport.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "cluster/coord.h"
#include "cluster/drain.h"
#include "cluster/hello.h"
#include "cluster/map.h"
#include "cluster/node.h"

/* Agent thread: the scheduler declared a node dead. */
static void on_node_dead(void *arg, uint32_t role, uint32_t rank)
{
	struct emb_client *c = arg;
	int rc;

	if (role != EMB_ROLE_SERVER)
		return;
	rc = emb__client_server_dead(c, rank);
	if (rc)
		emb_log(EMB_LOG_WARN, "cannot fail server %u's calls: %s", rank,
			emb_strerror(rc));
}

/* Agent thread: the scheduler published a newer replicated map. */
static void on_node_map(void *arg, const struct emb_cmap *m,
			const struct emb_wire_node_addr *srv, uint32_t n)
{
	int rc = emb__client_adopt_map(arg, m, srv, n);

	if (rc)
		emb_log(EMB_LOG_WARN, "cannot take map epoch %llu: %s",
			(unsigned long long)m->epoch, emb_strerror(rc));
}

/* "h1:p1,h2:p2,..." in rank order; IPv6 hosts need no brackets here. */
static char *server_list(const struct emb_wire_node_addr *srv, uint32_t n)
{
	size_t cap = (size_t)n * (EMB_WIRE_HOST_MAX + 8) + 1, len = 0;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	s[0] = '\0';
	for (uint32_t i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, "%s%s:%u",
					i ? "," : "", srv[i].host, srv[i].port);
	return s;
}

/*
 * Paddle's environment without a scheduler: the servers come from
 * PADDLE_PSERVERS_IP_PORT_LIST, the rank from PADDLE_TRAINER_ID and the
 * worker count from PADDLE_TRAINERS_NUM.
 */
static int static_node(const struct emb_cluster_env *env, struct emb_node **out)
{
	uint32_t nworkers = env->worker_num ? env->worker_num : 1;
	struct emb_wire_node_addr *srv = NULL;
	struct emb_addr *a;
	int n, rc;

	if (env->rank < 0 && nworkers > 1) {
		emb_log(EMB_LOG_ERROR,
			"cluster environment: %u trainers but "
			"PADDLE_TRAINER_ID is not set",
			nworkers);
		return -EINVAL;
	}
	if (env->rank >= (int64_t)nworkers) {
		emb_log(EMB_LOG_ERROR,
			"cluster environment: PADDLE_TRAINER_ID %lld is not "
			"below PADDLE_TRAINERS_NUM %u",
			(long long)env->rank, nworkers);
		return -EINVAL;
	}
	a = calloc(EMB_WIRE_SERVERS_MAX, sizeof(*a));
	if (!a)
		return -ENOMEM;
	n = emb_addr_list_parse(env->servers, a, EMB_WIRE_SERVERS_MAX);
	rc = n < 0 ? n : 0;
	if (!rc)
		srv = calloc((size_t)n, sizeof(*srv));
	if (!rc && !srv)
		rc = -ENOMEM;
	for (int i = 0; !rc && i < n; i++) {
		snprintf(srv[i].host, sizeof(srv[i].host), "%s", a[i].host);
		srv[i].port = a[i].port;
	}
	if (!rc)
		rc = emb_node_create_static(
		    EMB_ROLE_WORKER, env->rank < 0 ? 0 : (uint32_t)env->rank,
		    nworkers, srv, (uint32_t)n, out);
	free(srv);
	free(a);
	return rc;
}

/*
 * True once every server of the node accepts a TCP connection. The
 * transport logs refusals at debug only, so waiting for servers that are
 * still starting stays quiet.
 */
static bool servers_up(struct emb_node *n)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	const struct emb_wire_node_addr *srv = emb_node_servers(n);
	struct emb_transport *tr;
	bool up = true;

	if (emb_transport_create("tcp", &to, &tr))
		return true; /* let the client say why */
	for (uint32_t i = 0; up && i < emb_node_nservers(n); i++) {
		struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
		struct emb_conn *conn;

		co.host = srv[i].host;
		co.port = srv[i].port;
		up = emb_conn_create(tr, &co, &conn) == 0;
		if (up)
			emb_conn_destroy(conn);
	}
	emb_transport_destroy(tr);
	return up;
}

/*
 * Without a scheduler nothing says when the servers are up: wait until
 * they are, for the join timeout, as a node waits for its scheduler.
 * Over TCP the wait is a quiet probe; other transports retry the client.
 */
static int create_retry(struct emb_node *n, const struct emb_client_opts *co,
			uint32_t timeout_ms, struct emb_client **out)
{
	bool tcp = co->transport && !strcmp(co->transport, "tcp");
	uint64_t start = emb_clock_ms();
	bool logged = false;
	int rc;

	for (;;) {
		rc = tcp && !servers_up(n) ? -ECONNREFUSED
					   : emb_client_create(co, out);
		if (rc != -ECONNREFUSED ||
		    emb_clock_ms() - start + 200 > timeout_ms)
			return rc == -ECONNREFUSED && tcp
				   ? emb_client_create(co, out)
				   : rc;
		if (!logged && emb_clock_ms() - start >= 5000) {
			emb_log(EMB_LOG_INFO,
				"still waiting for the servers after 5 s: %s",
				emb_strerror(rc));
			logged = true;
		}
		usleep(200 * 1000);
	}
}

/*
 * A barrier without a scheduler (Paddle's environment): a counter row per
 * barrier name in a table of the servers'. Each worker adds 1 to it (SGD
 * with lr 1 and gradient -1, applied on arrival) and waits until it reads
 * its generation times the worker count. Exact: floats count integers to
 * 2^24 exactly.
 */
#define BARRIER_TABLE "__embstore_barriers"

static int static_barrier(struct emb_client *c, struct emb_node *n,
			  const char *name)
{
	struct emb_table_spec spec = {
	    .struct_size = sizeof(spec),
	    .name = BARRIER_TABLE,
	    .dim = 1,
	    .optim = {.kind = EMB_OPTIM_SGD, .lr = 1.0f},
	    .init = {.kind = EMB_INIT_ZEROS},
	    .seed = 1,
	};
	struct emb_client_table *t = NULL;
	uint64_t gen, id = 14695981039346656037ull; /* FNV-1a */
	float one = -1.0f, v = 0;
	double want;
	useconds_t nap = 1000;
	int rc;

	rc = emb_node_barrier_gen(n, name, &gen);
	if (rc)
		return rc;
	for (const char *p = name; *p; p++)
		id = (id ^ (uint8_t)*p) * 1099511628211ull;
	want = (double)gen * emb_node_nworkers(n);
	rc = emb_client_table_create(c, &spec, &t);
	if (!rc)
		rc =
		    emb_client_table_push(t, &id, 1, &one, 0, emb_node_rank(n));
	while (!rc) {
		rc = emb_client_table_pull(t, &id, 1, &v, 0, NULL);
		if (rc || (double)v >= want)
			break;
		usleep(nap);
		if (nap < 20000)
			nap *= 2;
	}
	emb_client_table_close(t);
	return rc;
}

static int from_env(const struct emb_client_opts *opts, struct emb_client **out)
{
	struct emb_client_opts co = opts ? *opts : EMB_CLIENT_OPTS_DEFAULT;
	struct emb_node_opts no = {0};
	uint8_t token[EMB_TOKEN_MAX];
	const char *tf = getenv("EMB_AUTH_TOKEN_FILE");
	struct emb_cluster_env env;
	struct emb_client *c;
	struct emb_node *node;
	const char *bad = NULL;
	char *list;
	int rc;

	if (!out)
		return -EINVAL;
	emb__client_env_log_level();
	/* Without opts, the transport is the servers' (EMB_TRANSPORT). */
	if (!opts && getenv("EMB_TRANSPORT") && *getenv("EMB_TRANSPORT"))
		co.transport = getenv("EMB_TRANSPORT");
	rc = emb_cluster_env_read(&env, &bad);
	if (rc) {
		emb__err_set(rc, "cluster environment: bad %s", bad);
		emb_log(EMB_LOG_ERROR, "cluster environment: bad %s", bad);
		return rc;
	}
	if (!env.sched_host[0] && !env.servers && !env.coordinator) {
		emb__err_set(-EINVAL,
			     "no servers and no cluster environment: give the "
			     "servers (host:port,...; Python: "
			     "connect(servers=...)), or join a cluster: "
			     "EMB_SCHED_HOST (or MS_SCHED_HOST) with "
			     "EMB_SCHED_PORT, as embstore launch sets them; "
			     "EMB_COORDINATOR; or PADDLE_PSERVERS_IP_PORT_LIST");
		emb_log(EMB_LOG_ERROR,
			"cluster environment: none of EMB_SCHED_HOST, "
			"EMB_COORDINATOR and PADDLE_PSERVERS_IP_PORT_LIST is "
			"set");
		return -EINVAL;
	}
	if (env.role != EMB_ROLE_NONE && env.role != EMB_ROLE_WORKER) {
		emb_log(EMB_LOG_ERROR,
			"cluster environment: role is %s, not "
			"worker",
			emb_role_name(env.role));
		return -EINVAL;
	}
	/* One token for the scheduler and every server: the caller's, or
	 * the file the environment names. */
	if (!co.auth_token_len && tf && *tf) {
		rc = emb_token_read_file(tf, token, &co.auth_token_len);
		if (rc) {
			emb_log(EMB_LOG_ERROR,
				"EMB_AUTH_TOKEN_FILE %s: %s", tf,
				rc == -EINVAL ? "empty or over 256 bytes"
					      : emb_strerror(rc));
			return -EINVAL;
		}
		co.auth_token = token;
	}
	if (env.coordinator) {
		/* The job lives in etcd: no scheduler to log in to. */
		no.coordinator = env.coordinator;
		no.job = env.job;
		no.server_num = env.server_num;
		no.worker_num = env.worker_num;
		no.hb_timeout_ms = env.hb_timeout_ms;
		no.replicas = env.replicas;
		no.server_max = env.server_max;
		no.role = EMB_ROLE_WORKER;
		no.join_timeout_ms = env.join_timeout_ms;
		rc = emb_node_create(&no, &node);
	} else if (env.sched_host[0]) {
		no.auth_token = co.auth_token;
		no.auth_token_len = co.auth_token_len;
		no.sched_host = env.sched_host;
		no.sched_port = env.sched_port;
		no.role = EMB_ROLE_WORKER;
		no.join_timeout_ms = env.join_timeout_ms;
		rc = emb_node_create(&no, &node);
		if (rc && rc != -ECANCELED)
			emb__err_set(rc,
				     "cannot join the cluster through the "
				     "scheduler at %s:%u (EMB_SCHED_HOST/"
				     "EMB_SCHED_PORT): %s",
				     env.sched_host, env.sched_port,
				     emb_strerror(rc));
	} else {
		rc = static_node(&env, &node);
	}
	if (rc)
		return rc;
	rc = emb_node_wait_map(node);
	if (rc)
		goto err_node;
	list = server_list(emb_node_servers(node), emb_node_nservers(node));
	if (!list) {
		rc = -ENOMEM;
		goto err_node;
	}
	co.servers = list;
	if (emb_node_is_static(node)) {
		rc = create_retry(node, &co, env.join_timeout_ms, &c);
	} else {
		/* A worker that joins after a failover does not connect to
		 * the servers removed from the map. */
		const struct emb_wire_node_addr *srv = emb_node_servers(node);
		uint32_t ns = emb_node_nservers(node);
		bool *removed = calloc(ns, sizeof(*removed));

		rc = removed ? 0 : -ENOMEM;
		for (uint32_t i = 0; !rc && i < ns; i++)
			removed[i] = emb_node_mapped(node) && srv[i].removed;
		if (!rc)
			rc = emb__client_create_live(&co, removed, &c);
		free(removed);
	}
	free(list);
	if (rc)
		goto err_node;
	rc = emb__client_set_cluster(c, emb_node_slot_map(node), node);
	if (!rc && emb_node_mapped(node)) {
		struct emb_cmap *m = malloc(sizeof(*m));

		/* The scheduler's own map: backups and fills included. */
		rc = !m ? -ENOMEM : emb_node_cmap(node, m) ? EMB_EBADFRAME
							    : emb__client_set_cmap(c, m);
		free(m);
	}
	if (rc) {
		emb_client_destroy(c);
		goto err_node;
	}
	/* From here the client owns the node; deaths known already replay,
	 * then the map, which says which of those ranks a newcomer took. */
	emb_node_watch(node, on_node_dead, c);
	if (emb_node_mapped(node))
		emb_node_watch_map(node, on_node_map, c);
	emb_log(EMB_LOG_INFO, "worker %u of %u joined: %u server%s%s",
		emb_node_rank(node), emb_node_nworkers(node),
		emb_node_nservers(node),
		emb_node_nservers(node) == 1 ? "" : "s",
		emb_node_is_static(node) ? " (from Paddle's server list)" : "");
	*out = c;
	return 0;

err_node:
	emb_node_destroy(node);
	return rc;
}

int emb_client_from_env(const struct emb_client_opts *opts,
			struct emb_client **out)
{
	struct emb_client_opts o;
	int rc =
	    opts ? emb__opts_copy(&o, sizeof(o), opts, "emb_client_opts") : 0;

	return emb__err(rc ? rc : from_env(opts ? &o : NULL, out));
}

uint32_t emb_client_rank(const struct emb_client *c)
{
	struct emb_node *n = emb__client_node(c);

	return n ? emb_node_rank(n) : 0;
}

uint32_t emb_client_nworkers(const struct emb_client *c)
{
	struct emb_node *n = emb__client_node(c);

	return n ? emb_node_nworkers(n) : 1;
}

static int barrier(struct emb_client *c, const char *name)
{
	struct emb_node *n = emb__client_node(c);

	if (!name || !*name || strlen(name) > EMB_WIRE_BARRIER_NAME_MAX)
		return -EINVAL;
	if (n && emb_node_is_static(n))
		return static_barrier(c, n, name);
	return n ? emb_node_barrier(n, name) : EMB_ENOSCHED;
}

int emb_client_barrier(struct emb_client *c, const char *name)
{
	return emb__err(barrier(c, name));
}

int emb_client_finish(struct emb_client *c)
{
	struct emb_node *n = emb__client_node(c);

	return emb__err(n ? emb_node_finish(n) : EMB_ENOSCHED);
}

int emb_cluster_servers(const char *sched, char *buf, size_t cap)
{
	return emb_cluster_servers_auth(sched, NULL, 0, buf, cap);
}

/* What an observer keeps of the scheduler's CLUSTER_MAP. */
struct sched_map {
	uint32_t replicas;	       /* >= 1 */
	uint32_t nservers;	       /* entries in removed */
	bool removed[EMB_WIRE_SERVERS_MAX];
	uint16_t slot_map[EMB_NSLOTS]; /* primaries */
	bool have_cmap;		       /* cmap came with it (replicas) */
	struct emb_cmap cmap;	       /* the scheduler's replicated map */
};

static int fetch_map(const char *sched, const uint8_t *token,
		     uint32_t token_len, char *buf, size_t cap,
		     struct sched_map *sm);

int emb_cluster_servers_auth(const char *sched, const uint8_t *token,
			     uint32_t token_len, char *buf, size_t cap)
{
	return emb__err(fetch_map(sched, token, token_len, buf, cap, NULL));
}

static int from_sched(const struct emb_client_opts *opts, const char *sched,
		      struct emb_client **out)
{
	struct emb_client_opts co;
	struct sched_map *sm;
	struct emb_client *c = NULL;
	size_t cap = (size_t)EMB_WIRE_SERVERS_MAX * (EMB_WIRE_HOST_MAX + 8);
	char *list;
	int rc;

	if (!opts || !out)
		return -EINVAL;
	co = *opts;
	sm = calloc(1, sizeof(*sm));
	list = malloc(cap);
	rc = sm && list ? 0 : -ENOMEM;
	if (!rc)
		rc = fetch_map(sched, co.auth_token, co.auth_token_len, list,
			       cap, sm);
	if (!rc) {
		co.servers = list;
		rc = emb__client_create_observer(
		    &co, sm->have_cmap ? sm->removed : NULL, &c);
	}
	if (!rc && emb_client_nservers(c) != sm->nservers)
		rc = EMB_EBADFRAME;
	if (!rc && sm->have_cmap)
		rc = emb__client_set_cmap(c, &sm->cmap);
	else if (!rc)
		rc = emb__client_set_map(c, sm->slot_map, sm->replicas,
					 sm->removed);
	if (rc)
		emb_client_destroy(c);
	else
		*out = c;
	free(list);
	free(sm);
	return rc;
}

int emb_client_from_sched(const struct emb_client_opts *opts, const char *sched,
			  struct emb_client **out)
{
	struct emb_client_opts o;
	int rc = opts ? emb__opts_copy(&o, sizeof(o), opts, "emb_client_opts")
		      : -EINVAL;

	return emb__err(rc ? rc : from_sched(&o, sched, out));
}

static int from_coord(const struct emb_client_opts *opts,
		      const char *coordinator, const char *job,
		      struct emb_client **out)
{
	struct emb_client_opts co = *opts;
	struct emb_cmap *m = malloc(sizeof(*m));
	struct emb_client *c = NULL;
	char *list = NULL;
	bool *removed = NULL;
	int rc = m ? 0 : -ENOMEM;

	if (!rc && !emb_coord_is_etcd(coordinator))
		rc = -EINVAL;
	if (!rc)
		rc = emb_coord_job_observe(coordinator, job, &list, &removed,
					   m);
	if (!rc) {
		co.servers = list;
		rc = emb__client_create_observer(&co, removed, &c);
	}
	if (!rc && emb_client_nservers(c) != m->nservers)
		rc = EMB_EBADFRAME;
	if (!rc)
		rc = emb__client_set_cmap(c, m);
	if (rc)
		emb_client_destroy(c);
	else
		*out = c;
	free(list);
	free(removed);
	free(m);
	return rc;
}

int emb_client_from_coordinator(const struct emb_client_opts *opts,
				const char *coordinator, const char *job,
				struct emb_client **out)
{
	struct emb_client_opts o;
	int rc = opts && coordinator && out
		     ? emb__opts_copy(&o, sizeof(o), opts, "emb_client_opts")
		     : -EINVAL;

	return emb__err(rc ? rc : from_coord(&o, coordinator, job, out));
}

/* An observer's connection to the scheduler at sched, after HELLO with
 * the token if there is one. 0, or an error (*tr and *conn then NULL). */
static int sched_connect(const char *sched, const uint8_t *token,
			 uint32_t token_len, struct emb_transport **tr,
			 struct emb_conn **conn)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_addr sa;
	int rc;

	*tr = NULL;
	*conn = NULL;
	if (!sched || emb_addr_parse(sched, strlen(sched), -1, &sa) ||
	    sa.port == 0)
		return -EINVAL;
	co.host = sa.host;
	co.port = sa.port;
	to.call_timeout_ms = 10000;
	rc = emb_transport_create("tcp", &to, tr);
	if (!rc)
		rc = emb_conn_create(*tr, &co, conn);
	if (!rc && token_len) {
		struct emb_wire_limits hl;
		char msg[128];

		rc = emb_hello(*conn, token, token_len, "embstore-observer",
			       &hl, msg, sizeof(msg));
		if (rc && msg[0])
			emb_log(EMB_LOG_ERROR, "scheduler %s refused HELLO: %s",
				sched, msg);
	}
	if (rc) {
		emb_conn_destroy(*conn);
		emb_transport_destroy(*tr);
		*conn = NULL;
		*tr = NULL;
	}
	return rc;
}

int emb_cluster_drain(const char *sched, const uint8_t *token,
		      uint32_t token_len, uint32_t rank, char *why,
		      size_t why_cap)
{
	struct emb_addr sa;

	if (why && why_cap)
		why[0] = '\0';
	if (!sched || emb_addr_parse(sched, strlen(sched), -1, &sa) ||
	    sa.port == 0)
		return emb__err(-EINVAL);
	return emb__err(emb_sched_drain(sa.host, sa.port, token, token_len,
					rank, 10000, why, why_cap));
}

/* dst (the caller's size) from a MOVES answer w. */
static int moves_copy(struct emb_cluster_moves *dst,
		      const struct emb_wire_moves *w)
{
	struct emb_cluster_moves m = {0};

	m.kind = w->kind;
	m.rank = w->rank;
	m.phase = w->phase;
	m.first = w->first;
	m.n = w->n;
	m.from = w->from;
	m.to = w->to;
	m.moved = w->moved;
	m.left = w->left;
	m.queued = w->queued;
	m.elapsed_ms = w->elapsed_ms;
	m.eta_ms = w->eta_ms;
	m.rows = w->rows;
	m.bytes = w->bytes;
	return emb__stats_copy(dst, &m, sizeof(m), "emb_cluster_moves");
}

int emb_cluster_moves(const char *sched, const uint8_t *token,
		      uint32_t token_len, struct emb_cluster_moves *dst)
{
	struct emb_wire_moves w;
	struct emb_addr sa;
	int rc;

	if (!sched || !dst || emb_addr_parse(sched, strlen(sched), -1, &sa) ||
	    sa.port == 0)
		return emb__err(-EINVAL);
	rc = emb_sched_moves(sa.host, sa.port, token, token_len, 10000, &w,
			     NULL, 0);
	return emb__err(rc ? rc : moves_copy(dst, &w));
}

int emb_coordinator_moves(const char *coordinator, const char *job,
			  struct emb_cluster_moves *dst)
{
	struct emb_wire_moves w;
	int rc;

	if (!coordinator || !dst || !emb_coord_is_etcd(coordinator))
		return emb__err(-EINVAL);
	rc = emb_coord_job_moves(coordinator, job, &w);
	return emb__err(rc ? rc : moves_copy(dst, &w));
}

/*
 * The formed cluster's servers from the scheduler at sched, as a list in
 * buf, and with sm (may be NULL) its replicas, removed flags and slots.
 */
static int fetch_map(const char *sched, const uint8_t *token,
		     uint32_t token_len, char *buf, size_t cap,
		     struct sched_map *sm)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE + 8];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_cluster_map map;
	struct emb_frame_hdr hdr, rhdr;
	struct emb_transport *tr = NULL;
	struct emb_conn *conn = NULL;
	struct emb_wire_frame f;
	uint8_t *resp = NULL;
	size_t resp_cap = emb_wire_cluster_map_cap(EMB_WIRE_SERVERS_MAX);
	struct iovec iov;
	size_t at = 0;
	int rc, len;

	if (!sched || !buf || !cap)
		return -EINVAL;
	resp = aligned_alloc(64, (resp_cap + 63) & ~(size_t)63);
	if (!resp)
		return -ENOMEM;
	rc = sched_connect(sched, token, token_len, &tr, &conn);
	if (rc)
		goto out;
	len = emb_wire_node_req_encode(req, sizeof(req), EMB_OP_CLUSTER_MAP, 0,
				       0);
	if (len < 0) {
		rc = len;
		goto out;
	}
	memcpy(&hdr, req, sizeof(hdr));
	iov = (struct iovec){req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call_sync(conn, &hdr, &iov, 1, resp, resp_cap, &rhdr);
	if (rc)
		goto out;
	if (rhdr.status < 0) {
		rc = rhdr.status;
		goto out;
	}
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f = (struct emb_wire_frame){.hdr = rhdr, .payload = resp, .lim = &lim};
	rc = emb_wire_cluster_map_decode(&f, &map);
	if (rc)
		goto out;
	buf[0] = '\0';
	if (sm) {
		sm->replicas = map.replicas ? map.replicas : 1;
		sm->nservers = map.nservers;
		for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
			sm->slot_map[sl] = emb_wire_cluster_map_slot(&map, sl);
		sm->have_cmap = map.cmap &&
				emb_cmap_decode(map.cmap, map.cmap_len,
						&sm->cmap) == 0 &&
				sm->cmap.nservers == map.nservers;
	}
	for (uint32_t i = 0; i < map.nservers && !rc; i++) {
		struct emb_wire_node_addr a;
		int n;

		emb_wire_cluster_map_server(&map, i, &a);
		if (sm)
			sm->removed[i] = a.removed;
		n = snprintf(buf + at, cap - at, "%s%s:%u", i ? "," : "",
			     a.host, a.port);
		if (n < 0 || (size_t)n >= cap - at)
			rc = -ENOSPC;
		else
			at += (size_t)n;
	}
out:
	emb_conn_destroy(conn);
	emb_transport_destroy(tr);
	free(resp);
	return rc;
}
