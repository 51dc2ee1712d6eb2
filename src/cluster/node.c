/*
 * src/cluster/node.c - a cluster member's agent: registration, heartbeats,
 * the cluster map, barriers and finish, over one TCP connection to the
 * scheduler (the cluster's control path stays on TCP whatever carries the
 * data). Layouts are in src/proto/wire_cluster.h.
 *
 * The agent thread owns the transport and the connection. Other threads
 * reach it through emb_transport_exec(): a call is a struct waiter that the
 * loop posts and completes, and the caller sleeps on the node's condition
 * variable until it is done. When the scheduler is lost the agent closes
 * the connection with the reason, which completes every waiting call with
 * that reason, so no caller hangs on a dead scheduler.
 *
 * Once the cluster formed, a broken or silent link is not the end: the
 * node goes on with the map it has while the agent reconnects to the same
 * address with backoff and rejoins its rank (docs/cluster.md, "When the
 * scheduler restarts"). Calls that need the scheduler wait for the new
 * link and are sent again on it. Only when the grace (EMB_SCHED_GRACE)
 * runs out, or a scheduler refuses the rejoin, is the scheduler lost.
 */
#include "cluster/node.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/coord.h"
#include "cluster/hello.h"
#include "cluster/map.h"
#include "common/addr.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/seconds.h"
#include "common/thread.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

#define CONNECT_RETRY_MS 200
#define CONNECT_QUIET_MS 3000  /* retries before a warning line */
#define CONNECT_NAG_MS 30000   /* and between such lines */
/* A replacement told another new server is being filled registers again
 * this often (fills take seconds to minutes). */
#define NEWCOMER_RETRY_MS 500
/* Rejoin attempts: the first soon (a restarted scheduler is up again in
 * well under a second), then doubling to a cap that keeps a node inside
 * a restarted scheduler's rejoin window (EMB_SCHED_REJOIN_MS). */
#define REJOIN_FIRST_MS 100
#define REJOIN_MAX_MS	1000
/* A scheduler that accepted but does not answer HELLO or REGISTER (it
 * is stopped, say) gets this long before the attempt is dropped. */
#define REJOIN_CALL_MS 5000
/* Responses other than the map: ERROR payload at most. */
#define SMALL_RESP (4u + EMB_WIRE_ERRMSG_MAX)

struct waiter {
	struct emb_node *n;	      /* owner */
	_Alignas(8) uint8_t req[128]; /* encoded request frame */
	int req_len;		      /* bytes of req */
	void *resp;		      /* response payload lands here */
	size_t resp_cap;	      /* bytes */
	struct emb_frame_hdr rhdr;    /* response header, when status is 0 */
	int status;		      /* transport status */
	bool posted;		      /* handed to the loop */
	bool done;		      /* under n->mu */
	uint64_t gen;		      /* n->link_gen when posted */
};

struct emb_node {
	struct emb_transport *tr;	   /* agent loop */
	struct emb_conn *conn;		   /* to the scheduler; agent thread */
	pthread_t thread;		   /* runs agent_main */
	bool running;			   /* thread started */
	char sched[EMB_WIRE_HOST_MAX + 8]; /* "host:port" for logs */
	uint32_t join_timeout_ms;	   /* map wait */
	emb_node_end_fn on_end;		   /* optional */
	void *end_arg;			   /* for on_end */
	struct emb_wire_register_resp reg; /* our place in the cluster */
	bool newcomer_said; /* creating thread: EMB_ENEWCOMER logged once */

	/* Agent thread only. */
	bool hb_inflight;		 /* a heartbeat is unanswered */
	uint64_t hb_seq;		 /* last sequence number sent */
	int64_t next_hb_ms;		 /* monotonic time of the next ping */
	int64_t last_ok_ms;		 /* last answer from the scheduler */
	bool finish_sent;		 /* server: a FINISH is unanswered */
	bool finish_hold;		 /* ...and it is a hold */
	bool hold_off;			 /* the scheduler took no hold */
	_Alignas(8) uint8_t hb_req[64];	 /* heartbeat request frame */
	uint8_t *hb_resp;		 /* heartbeat response payload */
	size_t hb_resp_cap;		 /* bytes */
	_Alignas(8) uint8_t fin_req[64]; /* server's FINISH frame */
	_Alignas(8) uint8_t fin_resp[SMALL_RESP]; /* its response */

	/* Rejoining, agent thread only (away and link_gen are under mu). */
	char sched_host[EMB_WIRE_HOST_MAX + 1]; /* to reconnect to */
	uint16_t sched_port;
	char my_host[EMB_WIRE_HOST_MAX + 1]; /* as registered; "" = seen */
	uint16_t my_port;		     /* as registered */
	uint8_t token[EMB_WIRE_TOKEN_MAX];   /* for HELLO; a copy */
	uint32_t token_len;		     /* 0: no HELLO */
	uint32_t grace_ms;		     /* rejoin for this long; 0 never */
	int64_t away_ms;		     /* the link broke, monotonic */
	int64_t retry_ms;		     /* next attempt */
	uint32_t backoff_ms;		     /* until the one after */
	int rejoin_step;		     /* 0 idle, 1 HELLO, 2 REGISTER */
	int64_t rejoin_by_ms;		     /* the step's answer due */
	_Alignas(8) uint8_t rj_req[EMB_HELLO_REQ_MAX > 64 + EMB_WIRE_HOST_MAX
					   ? EMB_HELLO_REQ_MAX
					   : 64 + EMB_WIRE_HOST_MAX];
	_Alignas(8) uint8_t rj_resp[SMALL_RESP];

	pthread_mutex_t mu; /* guards the fields below, with cv */
	pthread_cond_t cv;  /* a waiter completed, or the link died */
	bool stop;	    /* destroy asked the agent to exit */
	int lost;	    /* 0, or why the scheduler link is gone for good */
	bool formed;	    /* the cluster formed: a map or a heartbeat
			       said so, and losing the link is no end */
	bool away;	    /* link down, rejoining (not lost yet) */
	uint64_t link_gen;  /* links made since create: a call that failed
			       on one is sent again on the next */
	bool ended;	    /* job over for this node: no more errors */
	struct emb_wire_node_ref *dead;	    /* nodes declared dead, in order */
	uint32_t ndead;			    /* entries in dead */
	emb_node_dead_fn watch_fn;	    /* emb_node_watch() */
	void *watch_arg;		    /* for watch_fn */
	struct waiter mapw;		    /* CLUSTER_MAP call */
	bool have_map;			    /* slot_map and servers are set */
	uint16_t slot_map[EMB_NSLOTS];	    /* slot -> server rank */
	struct emb_wire_node_addr *servers; /* by rank */
	uint32_t replicas;		    /* copies of each slot, >= 1 */
	struct emb_cmap *cmap;		    /* replicated map (the scheduler's
					       or etcd's), or NULL */
	emb_node_map_fn map_fn;		    /* emb_node_watch_map() */
	void *map_arg;			    /* for map_fn */
	/* Agent thread only: a newer map being fetched. */
	bool map_inflight;
	bool map_watching;  /* ...by a watch, held until the map changes */
	bool map_watch_off; /* the scheduler refused a watch: none again */
	_Alignas(8) uint8_t mapr_req[64];
	uint8_t *mapr_resp;
	size_t mapr_cap;

	struct emb_coord *coord; /* the job in etcd, not a scheduler: every
				    call goes there (cluster/coord.h) */

	/* Static nodes (no scheduler): barrier entries per name, under mu. */
	bool is_static; /* emb_node_create_static */
	char (*bar_names)[EMB_WIRE_BARRIER_NAME_MAX + 1]; /* nbar names */
	uint64_t *bar_gens; /* entries of each name */
	uint32_t nbar;	    /* names seen */
};

#define STATIC_BARRIERS_MAX 64 /* barrier names a static node tracks */

/* ---- environment ---------------------------------------------------- */

static const char *env2(const char *name, const char *alias)
{
	const char *v = getenv(name);

	if ((!v || !*v) && alias)
		v = getenv(alias);
	return v && *v ? v : NULL;
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi,
		      uint32_t *out);

/* The first of name, alias and paddle that is set. */
static const char *env3(const char *name, const char *alias, const char *paddle)
{
	const char *v = env2(name, alias);

	return v ? v : env2(paddle, NULL);
}

/* Paddle's POD_IP:PADDLE_PORT into out; -EINVAL if malformed. */
static int paddle_listen(char *out, size_t cap)
{
	const char *ip = env2("POD_IP", NULL);
	const char *port = env2("PADDLE_PORT", NULL);
	uint32_t p;
	int n;

	if (!port)
		return 0;
	if (parse_uint(port, 1, 65535, &p))
		return -EINVAL;
	if (!ip)
		ip = "0.0.0.0";
	n = snprintf(out, cap, strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip, p);
	return n > 0 && (size_t)n < cap ? 0 : -EINVAL;
}

int emb_role_parse(const char *s, uint32_t *role)
{
	static const struct {
		const char *name;
		uint32_t role;
	} names[] = {
	    {"scheduler", EMB_ROLE_SCHEDULER}, {"MS_SCHED", EMB_ROLE_SCHEDULER},
	    {"server", EMB_ROLE_SERVER},       {"MS_PSERVER", EMB_ROLE_SERVER},
	    {"worker", EMB_ROLE_WORKER},       {"MS_WORKER", EMB_ROLE_WORKER},
	    {"PSERVER", EMB_ROLE_SERVER},      {"TRAINER", EMB_ROLE_WORKER},
	};

	for (size_t i = 0; s && i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(s, names[i].name) == 0) {
			*role = names[i].role;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi,
		      uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi || s[0] == '-')
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/* EMB_SCHED_GRACE: seconds (fractions allowed), 0 = none, to ms. */
static int parse_grace(const char *s, uint32_t *ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0) || v * 1000 >= 2147483647.0)
		return -EINVAL;
	*ms = (uint32_t)lround(v * 1000);
	if (v > 0 && *ms == 0)
		*ms = 1;
	return 0;
}

/* Seconds, fractions allowed ("0.5"), to ms in [1, 2^31). */
static int parse_seconds(const char *s, uint32_t *ms)
{
	uint64_t v;
	int rc = emb_seconds_parse(s, 1, INT32_MAX, &v);

	if (rc == 0)
		*ms = (uint32_t)v;
	return rc;
}

int emb_cluster_env_read(struct emb_cluster_env *out, const char **bad)
{
	const char *v, *name = NULL;
	uint32_t port;

	memset(out, 0, sizeof(*out));
	out->sched_port = EMB_SCHED_PORT_DEFAULT;
	out->hb_timeout_ms = EMB_HEARTBEAT_TIMEOUT_DEFAULT;
	out->join_timeout_ms = EMB_JOIN_TIMEOUT_DEFAULT;

	out->rank = -1;
	v = env3("EMB_ROLE", "MS_ROLE", "TRAINING_ROLE");
	if (v && emb_role_parse(v, &out->role)) {
		name = "EMB_ROLE";
		goto err;
	}
	v = env2("EMB_SCHED_HOST", "MS_SCHED_HOST");
	if (v && (strlen(v) > EMB_WIRE_HOST_MAX || strchr(v, ' '))) {
		name = "EMB_SCHED_HOST";
		goto err;
	}
	if (v)
		snprintf(out->sched_host, sizeof(out->sched_host), "%s", v);
	v = env2("EMB_SCHED_PORT", "MS_SCHED_PORT");
	if (v) {
		if (parse_uint(v, 1, 65535, &port)) {
			name = "EMB_SCHED_PORT";
			goto err;
		}
		out->sched_port = (uint16_t)port;
	}
	v = env2("EMB_SERVER_NUM", "MS_SERVER_NUM");
	if (v && parse_uint(v, 1, EMB_WIRE_SERVERS_MAX, &out->server_num)) {
		name = "EMB_SERVER_NUM";
		goto err;
	}
	v = env3("EMB_WORKER_NUM", "MS_WORKER_NUM", "PADDLE_TRAINERS_NUM");
	if (v && parse_uint(v, 1, EMB_WIRE_WORKERS_MAX, &out->worker_num)) {
		name = "EMB_WORKER_NUM";
		goto err;
	}
	v = env2("PADDLE_PSERVERS_IP_PORT_LIST", NULL);
	if (v) {
		struct emb_addr *a = malloc(EMB_WIRE_SERVERS_MAX * sizeof(*a));
		int n = a ? emb_addr_list_parse(v, a, EMB_WIRE_SERVERS_MAX)
			  : -ENOMEM;

		free(a);
		if (n < 0) {
			name = "PADDLE_PSERVERS_IP_PORT_LIST";
			goto err;
		}
		out->servers = v;
		if (!out->server_num)
			out->server_num = (uint32_t)n;
	}
	v = env2("PADDLE_TRAINER_ID", NULL);
	if (v) {
		uint32_t r;

		if (parse_uint(v, 0, EMB_WIRE_WORKERS_MAX - 1, &r)) {
			name = "PADDLE_TRAINER_ID";
			goto err;
		}
		out->rank = r;
	}
	if (paddle_listen(out->listen, sizeof(out->listen))) {
		name = "PADDLE_PORT";
		goto err;
	}
	v = env2("EMB_COORDINATOR", NULL);
	if (v && !emb_coord_is_etcd(v)) {
		name = "EMB_COORDINATOR";
		goto err;
	}
	out->coordinator = v;
	out->job = env2("EMB_JOB", NULL);
	v = env2("EMB_HEARTBEAT_TIMEOUT", NULL);
	if (v && parse_seconds(v, &out->hb_timeout_ms)) {
		name = "EMB_HEARTBEAT_TIMEOUT";
		goto err;
	}
	v = env2("EMB_REPLICAS", NULL);
	if (v && parse_uint(v, 1, EMB_WIRE_REPLICAS_MAX, &out->replicas)) {
		name = "EMB_REPLICAS";
		goto err;
	}
	v = env2("EMB_SERVER_MAX", NULL);
	if (v && parse_uint(v, 1, EMB_WIRE_SERVERS_MAX, &out->server_max)) {
		name = "EMB_SERVER_MAX";
		goto err;
	}
	v = env2("EMB_CLUSTER_TIMEOUT", NULL);
	if (v && parse_seconds(v, &out->join_timeout_ms)) {
		name = "EMB_CLUSTER_TIMEOUT";
		goto err;
	}
	out->sched_state = env2("EMB_SCHED_STATE", NULL);
	out->sched_grace_ms = EMB_SCHED_GRACE_DEFAULT;
	v = env2("EMB_SCHED_GRACE", NULL);
	if (v && parse_grace(v, &out->sched_grace_ms)) {
		name = "EMB_SCHED_GRACE";
		goto err;
	}
	return 0;
err:
	if (bad)
		*bad = name;
	return -EINVAL;
}

/* ---- the link ------------------------------------------------------- */

static void log_error_resp(struct emb_node *n, const struct emb_frame_hdr *h,
			   const void *payload)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.hdr = *h, .payload = payload, .lim = &lim};
	struct emb_wire_error e;

	if (emb_wire_error_decode(&f, &e) == 0)
		emb_log(EMB_LOG_WARN, "scheduler %s: %s %s: %.*s", n->sched,
			emb_wire_op_name(h->opcode & ~EMB_OP_RESPONSE_BIT),
			emb_strerror(e.status), (int)e.msg_len, e.msg);
}

/*
 * Agent thread: the scheduler link is gone for reason. Closing the conn
 * completes every call still waiting with reason. After the job ended for
 * this node, losing the scheduler (which exits then) is expected.
 */
static void lose(struct emb_node *n, int reason, const char *why)
{
	bool ended;

	pthread_mutex_lock(&n->mu);
	if (n->lost) {
		pthread_mutex_unlock(&n->mu);
		return;
	}
	n->lost = reason;
	ended = n->ended;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);

	if (ended)
		emb_log(EMB_LOG_DEBUG, "scheduler %s gone after the job ended",
			n->sched);
	else
		emb_log(EMB_LOG_ERROR, "%s %u: lost scheduler %s: %s",
			emb_role_name(n->reg.role), n->reg.rank, n->sched, why);
	/* Between rejoin attempts there is no conn. */
	if (n->conn)
		emb_conn_close(n->conn, reason);
	if (!ended && n->on_end)
		n->on_end(n->end_arg, reason);
}

/*
 * Agent thread: the link broke or went silent. A node of a formed job
 * that is not over rides it out: it keeps its map (servers serve, workers
 * train) and rejoins (agent_main, try_rejoin()). Before the map, after
 * the end, or without a grace, the scheduler is lost as it always was.
 */
static void link_down(struct emb_node *n, const char *why)
{
	int64_t now = (int64_t)emb_clock_ms();
	uint64_t epoch;
	bool gone, away, ride;

	pthread_mutex_lock(&n->mu);
	gone = n->lost || n->ended || n->stop;
	away = n->away;
	ride = !gone && !away && (n->formed || n->have_map) && n->grace_ms;
	if (ride)
		n->away = true;
	epoch = n->cmap ? n->cmap->epoch : 0;
	pthread_mutex_unlock(&n->mu);
	if (gone || away)
		return;
	if (!ride) {
		lose(n, EMB_ENOSCHED, why);
		return;
	}
	n->away_ms = now;
	n->backoff_ms = REJOIN_FIRST_MS;
	n->retry_ms = now + REJOIN_FIRST_MS;
	n->rejoin_step = 0;
	emb_log(EMB_LOG_WARN,
		"%s %u: scheduler %s lost (%s): going on with map epoch %llu "
		"and rejoining for up to %u s",
		emb_role_name(n->reg.role), n->reg.rank, n->sched, why,
		(unsigned long long)epoch, (n->grace_ms + 999) / 1000);
	/* Completes the calls on it: they wait for the next link. */
	emb_conn_close(n->conn, EMB_ENOSCHED);
}

static void on_conn_close(void *arg, struct emb_conn *conn, int reason)
{
	struct emb_node *n = arg;

	/* A conn that is no longer the link (an attempt given up) says
	 * nothing about the one there is. */
	if (conn != n->conn)
		return;
	link_down(n, emb_strerror(reason));
}

static void waiter_complete(struct waiter *w, int status)
{
	struct emb_node *n = w->n;

	pthread_mutex_lock(&n->mu);
	w->status = status;
	w->done = true;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
}

/*
 * Agent thread: the job is over for this node (its FINISH answered), so
 * its link goes now. The scheduler, once the job is over, waits for its
 * nodes to close before it exits (docs/protocol.md, "The end's last
 * answers"); a node that kept its link until its process or its owner
 * ended (a trainer evaluating after its finish, a test's servers) held
 * that back up to its 2 s limit. The close reports nothing: ended is
 * set, and link_down() ignores an ended node's link.
 */
static void end_link(struct emb_node *n)
{
	if (n->conn)
		emb_conn_close(n->conn, 0); /* 0: a local close, no warning */
}

static void waiter_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct waiter *w = ctx;

	if (status == 0)
		w->rhdr = *resp;
	/* A worker's FINISH answered: its part is over here, on the agent,
	 * before the caller wakes. The scheduler may end the job and close
	 * the link the next moment (it does at once when this worker was
	 * the last: the servers' FINISH holds, protocol.md), and a close
	 * read before the caller marked the end would be taken for a lost
	 * scheduler, warned about and rejoined. */
	if (status == 0 && resp->status == 0 &&
	    resp->opcode == (EMB_OP_FINISH | EMB_OP_RESPONSE_BIT)) {
		pthread_mutex_lock(&w->n->mu);
		w->n->ended = true;
		pthread_mutex_unlock(&w->n->mu);
		/* Before the caller wakes: it may destroy the node next. */
		end_link(w->n);
	}
	waiter_complete(w, status);
}

/* Agent thread: posts a waiter's request. */
static void waiter_post(void *arg)
{
	struct waiter *w = arg;
	struct emb_node *n = w->n;
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int rc, lost;

	pthread_mutex_lock(&n->mu);
	lost = n->lost;
	/* Posted on a link that has gone since: waiter_run() posts it again
	 * once the next one is up. */
	if (!lost && (n->away || n->link_gen != w->gen))
		lost = EMB_ENOSCHED;
	pthread_mutex_unlock(&n->mu);
	if (lost) {
		waiter_complete(w, lost);
		return;
	}
	memcpy(&hdr, w->req, sizeof(hdr));
	iov = (struct iovec){w->req + EMB_WIRE_HDR_SIZE,
			     (size_t)w->req_len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, iov.iov_len ? 1 : 0, w->resp,
			   w->resp_cap, waiter_done, w);
	if (rc) {
		/* A link that cannot take a call is one to make again. */
		waiter_complete(w, rc);
		link_down(n, emb_strerror(rc));
	}
}

/*
 * Under n->mu: one wait on n->cv, until deadline_ms (monotonic, 0 = none).
 * False once the deadline has passed (nothing waited then).
 */
static bool wait_until(struct emb_node *n, int64_t deadline_ms)
{
	struct timespec ts;
	int64_t left;

	if (!deadline_ms) {
		pthread_cond_wait(&n->cv, &n->mu);
		return true;
	}
	left = deadline_ms - (int64_t)emb_clock_ms();
	if (left <= 0)
		return false;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += left / 1000;
	ts.tv_nsec += (left % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&n->cv, &n->mu, &ts);
	return true;
}

/*
 * Under n->mu, after a call failed in the transport: waits for a new link
 * (true: post again) or for the scheduler to be lost for good (false).
 * -ETIMEDOUT in *rc when deadline_ms (0 = none) passes first.
 */
static bool wait_relink(struct emb_node *n, struct waiter *w,
			int64_t deadline_ms, int *rc)
{
	while (!n->lost && !n->stop && (n->away || n->link_gen == w->gen)) {
		/* The agent may not have seen the break yet: it will, from
		 * the close or the silence, within a heartbeat timeout. */
		if (!wait_until(n, deadline_ms)) {
			*rc = -ETIMEDOUT;
			return false;
		}
	}
	return !n->lost && !n->stop;
}

/*
 * Runs w on the agent and waits until it is done or deadline_ms (monotonic,
 * 0 = none) passes: 0 (with w->rhdr set), the call's error, or -ETIMEDOUT
 * (w stays posted: only a waiter the node owns may time out).
 */
static int waiter_run(struct waiter *w, int64_t deadline_ms)
{
	struct emb_node *n = w->n;
	int rc = 0;

	pthread_mutex_lock(&n->mu);
again:
	if (!w->posted) {
		w->done = false;
		w->posted = true;
		w->gen = n->link_gen;
		rc = emb_transport_exec(n->tr, waiter_post, w);
		if (rc) {
			w->posted = false;
			pthread_mutex_unlock(&n->mu);
			return rc;
		}
	}
	while (!w->done) {
		if (!wait_until(n, deadline_ms)) {
			pthread_mutex_unlock(&n->mu);
			return -ETIMEDOUT;
		}
	}
	w->posted = false;
	rc = w->status;
	/* The call failed in the transport: the link to the scheduler is
	 * gone, whether or not the agent has noticed yet. A node riding it
	 * out sends the call again on the next link. */
	if (rc && n->grace_ms && (n->formed || n->have_map) &&
	    wait_relink(n, w, deadline_ms, &rc))
		goto again;
	if (rc && rc != -ETIMEDOUT)
		rc = n->lost ? n->lost : EMB_ENOSCHED;
	pthread_mutex_unlock(&n->mu);
	if (rc == 0 && w->rhdr.status < 0) {
		log_error_resp(n, &w->rhdr, w->resp);
		rc = w->rhdr.status;
	}
	return rc;
}

/* ---- heartbeats ----------------------------------------------------- */

/* Agent thread: every slot moved away (docs/replication.md, "Moving
 * slots"), as a heartbeat or the FINISH hold says: this server's part of
 * the job is over, as at a finish. */
static void drained(struct emb_node *n)
{
	bool was;

	pthread_mutex_lock(&n->mu);
	was = n->ended;
	n->ended = true;
	pthread_mutex_unlock(&n->mu);
	if (was)
		return;
	emb_log(EMB_LOG_INFO,
		"server %u: drained, it holds no slot: leaving the job",
		n->reg.rank);
	if (n->on_end)
		n->on_end(n->end_arg, 0);
}

static void finish_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct emb_node *n = ctx;
	bool was;

	if (status == 0 && resp->status == 0) {
		pthread_mutex_lock(&n->mu);
		was = n->ended;
		n->ended = true;
		pthread_mutex_unlock(&n->mu);
		if (was)
			return; /* drained first */
		emb_log(EMB_LOG_INFO, "server %u: job finished", n->reg.rank);
		end_link(n);
		if (n->on_end)
			n->on_end(n->end_arg, 0);
		return;
	}
	/* The link broke before the answer: the hold is posted again on
	 * the next link, or FINISH goes again once its heartbeats say the
	 * job is finishing. */
	if (status) {
		n->finish_sent = false;
		link_down(n, emb_strerror(status));
		return;
	}
	if (n->finish_hold && resp->status == EMB_EDRAINED) {
		drained(n);
		return;
	}
	if (n->finish_hold) {
		/* A scheduler older than holds refuses one as a bad frame;
		 * one refused otherwise (a node died) leaves the news to the
		 * heartbeats too. */
		n->finish_sent = false;
		n->hold_off = true;
		emb_log(EMB_LOG_DEBUG,
			"server %u: FINISH hold refused (%s): the end of the "
			"job comes with heartbeats",
			n->reg.rank, emb_strerror(resp->status));
		return;
	}
	lose(n, resp->status, "finish refused");
}

/*
 * Agent thread: a server acknowledges that the job is finishing, or, with
 * hold, asks to be told when it is: the scheduler holds that FINISH and
 * answers it (taking it as the acknowledgement) the moment the last
 * worker is done. Heartbeats alone told it up to a heartbeat interval (2 s
 * by default) later, which every job's end waited for (docs/protocol.md,
 * "Finish hold").
 */
static void send_finish(struct emb_node *n, bool hold)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	n->finish_sent = true;
	n->finish_hold = hold;
	len = emb_wire_finish_req_encode(n->fin_req, sizeof(n->fin_req), 0,
					 n->reg.node_id, hold);
	if (len < 0) {
		lose(n, len, "cannot encode FINISH");
		return;
	}
	memcpy(&hdr, n->fin_req, sizeof(hdr));
	iov = (struct iovec){n->fin_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, 1, n->fin_resp,
			   sizeof(n->fin_resp), finish_done, n);
	if (rc) {
		n->finish_sent = false;
		link_down(n, "cannot send FINISH");
	}
}

static void fetch_map(struct emb_node *n);
static void watch_map(struct emb_node *n);

/* Agent thread: new deaths from a heartbeat response. */
static void note_dead(struct emb_node *n,
		      const struct emb_wire_heartbeat_resp *r)
{
	for (;;) {
		struct emb_wire_node_ref d;
		emb_node_dead_fn fn;
		void *arg;
		bool held = true;

		pthread_mutex_lock(&n->mu);
		if (n->ndead >= r->ndead || n->stop) {
			pthread_mutex_unlock(&n->mu);
			return;
		}
		emb_wire_heartbeat_dead(r, n->ndead, &d);
		n->dead[n->ndead++] = d;
		fn = n->watch_fn;
		arg = n->watch_arg;
		/* A server the map no longer counts (a drained one, leaving;
		 * a newcomer gone before it got a slot) costs nothing. */
		if (d.role == EMB_ROLE_SERVER && n->cmap &&
		    d.rank < n->cmap->nservers)
			held = emb_cmap_in_map(n->cmap, d.rank);
		pthread_mutex_unlock(&n->mu);
		/* This node's own rank: the dead server whose place it took
		 * (its own death would end its heartbeats with ENODEAD). A
		 * replaced server: a newcomer lives at its rank, and the map
		 * that says so is what counts. */
		if ((d.role == n->reg.role && d.rank == n->reg.rank) ||
		    (d.role & EMB_WIRE_ROLE_REPLACED))
			continue;
		if (held)
			emb_log(EMB_LOG_WARN,
				"%s %u: scheduler declared %s %u dead",
				emb_role_name(n->reg.role), n->reg.rank,
				emb_role_name(d.role), d.rank);
		else
			emb_log(EMB_LOG_INFO,
				"%s %u: server %u is gone; it held no slot "
				"(drained), nothing fails over",
				emb_role_name(n->reg.role), n->reg.rank,
				d.rank);
		if (fn)
			fn(arg, d.role, d.rank);
	}
}

static void hb_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct emb_node *n = ctx;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	struct emb_wire_heartbeat_resp r;
	int rc;

	n->hb_inflight = false;
	if (status) {
		link_down(n, emb_strerror(status));
		return;
	}
	if (resp->status == EMB_EDRAINED && n->reg.role == EMB_ROLE_SERVER) {
		drained(n);
		return;
	}
	if (resp->status < 0) {
		log_error_resp(n, resp, n->hb_resp);
		lose(n, resp->status, emb_strerror(resp->status));
		return;
	}
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f = (struct emb_wire_frame){
	    .hdr = *resp, .payload = n->hb_resp, .lim = &lim};
	rc = emb_wire_heartbeat_resp_decode(&f, &r);
	if (rc) {
		lose(n, rc, "bad heartbeat response");
		return;
	}
	n->last_ok_ms = (int64_t)emb_clock_ms();
	if (r.state != EMB_CLUSTER_FORMING) {
		pthread_mutex_lock(&n->mu);
		n->formed = true;
		pthread_mutex_unlock(&n->mu);
	}
	note_dead(n, &r);
	/* A replicated map changed: joins, fills and rebalances are not
	 * deaths a node could work out by itself. */
	if (r.map_epoch) {
		uint64_t have;

		pthread_mutex_lock(&n->mu);
		have = n->cmap ? n->cmap->epoch : 0;
		pthread_mutex_unlock(&n->mu);
		if (have < r.map_epoch)
			fetch_map(n);
		else
			watch_map(n);
	}
	if (n->reg.role == EMB_ROLE_SERVER && !n->finish_sent) {
		if (r.state == EMB_CLUSTER_FINISHING)
			send_finish(n, false);
		else if (!n->hold_off)
			send_finish(n, true);
	}
}

static void send_heartbeat(struct emb_node *n)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	len = emb_wire_heartbeat_req_encode(n->hb_req, sizeof(n->hb_req), 0,
					    n->reg.node_id, ++n->hb_seq);
	if (len < 0)
		return;
	memcpy(&hdr, n->hb_req, sizeof(hdr));
	iov = (struct iovec){n->hb_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, 1, n->hb_resp, n->hb_resp_cap,
			   hb_done, n);
	if (rc == 0)
		n->hb_inflight = true;
	else
		link_down(n, emb_strerror(rc));
}

static int rejoin_send(struct emb_node *n);

/* Agent thread: this rejoin attempt failed; the next after a backoff,
 * unless the grace is spent. */
static void rejoin_retry(struct emb_node *n, const char *why)
{
	int64_t now = (int64_t)emb_clock_ms();

	n->rejoin_step = 0;
	emb_log(EMB_LOG_DEBUG, "%s %u: rejoin %s: %s",
		emb_role_name(n->reg.role), n->reg.rank, n->sched, why);
	if (now - n->away_ms >= (int64_t)n->grace_ms) {
		char msg[96];

		snprintf(msg, sizeof(msg),
			 "no scheduler for %u ms (EMB_SCHED_GRACE): %s",
			 n->grace_ms, why);
		lose(n, EMB_ENOSCHED, msg);
		return;
	}
	n->retry_ms = now + n->backoff_ms;
	n->backoff_ms = n->backoff_ms * 2 > REJOIN_MAX_MS ? REJOIN_MAX_MS
							  : n->backoff_ms * 2;
}

/* Agent thread: the scheduler took this node back. */
static void rejoin_ok(struct emb_node *n)
{
	int64_t now = (int64_t)emb_clock_ms();

	n->rejoin_step = 0;
	n->last_ok_ms = now;
	n->next_hb_ms = now;
	n->hb_inflight = false;
	pthread_mutex_lock(&n->mu);
	n->away = false;
	n->link_gen++;
	pthread_cond_broadcast(&n->cv);
	pthread_mutex_unlock(&n->mu);
	emb_log(EMB_LOG_INFO, "%s %u: rejoined scheduler %s after %lld ms",
		emb_role_name(n->reg.role), n->reg.rank, n->sched,
		(long long)(now - n->away_ms));
}

/* Agent thread: the answer to a rejoin's HELLO or REGISTER. */
static void rejoin_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct emb_node *n = ctx;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_register_resp r;
	struct emb_wire_frame f;
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	bool gone;
	int rc;

	pthread_mutex_lock(&n->mu);
	gone = n->lost || n->stop;
	pthread_mutex_unlock(&n->mu);
	if (gone)
		return;
	if (status) {
		rejoin_retry(n, emb_strerror(status));
		return;
	}
	if (n->rejoin_step == 1) {
		struct emb_wire_hello_resp hr;

		rc = emb_hello_decode(resp, n->rj_resp, &hr, msg, sizeof(msg));
		if (rc) {
			emb_log(EMB_LOG_ERROR, "scheduler %s: hello %s: %s",
				n->sched, emb_strerror(rc), msg);
			lose(n, rc, "the scheduler refused this node's HELLO");
			return;
		}
		rc = rejoin_send(n);
		if (rc)
			rejoin_retry(n, emb_strerror(rc));
		return;
	}
	/* A refusal is final: the scheduler is up and does not know this
	 * node's place (no state of the job), or declared it dead. */
	if (resp->status < 0) {
		log_error_resp(n, resp, n->rj_resp);
		lose(n, resp->status, "the scheduler refused the rejoin");
		return;
	}
	f = (struct emb_wire_frame){
	    .hdr = *resp, .payload = n->rj_resp, .lim = &lim};
	rc = emb_wire_register_resp_decode(&f, &r);
	if (!rc && (r.role != n->reg.role || r.rank != n->reg.rank ||
		    r.node_id != n->reg.node_id ||
		    r.server_num != n->reg.server_num ||
		    r.worker_num != n->reg.worker_num))
		rc = EMB_EBADFRAME;
	if (rc) {
		lose(n, rc, "the scheduler gave this node another place");
		return;
	}
	rejoin_ok(n);
}

/* Agent thread: the rejoin's REGISTER (step 2). 0 or a transport error. */
static int rejoin_send(struct emb_node *n)
{
	struct emb_wire_register_req r = {
	    .role = n->reg.role,
	    .port = n->my_port,
	    .pid = (uint32_t)getpid(),
	    .host = n->my_host,
	    .host_len = (uint32_t)strlen(n->my_host),
	    .rank = n->reg.rank,
	    .cluster_id = n->reg.cluster_id,
	};
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	pthread_mutex_lock(&n->mu);
	r.map_epoch = n->cmap ? n->cmap->epoch : 0;
	pthread_mutex_unlock(&n->mu);
	len = emb_wire_rejoin_req_encode(n->rj_req, sizeof(n->rj_req), 0, &r);
	if (len < 0)
		return len;
	memcpy(&hdr, n->rj_req, sizeof(hdr));
	iov = (struct iovec){n->rj_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, 1, n->rj_resp,
			   sizeof(n->rj_resp), rejoin_done, n);
	if (rc == 0) {
		n->rejoin_step = 2;
		n->rejoin_by_ms = (int64_t)emb_clock_ms() + REJOIN_CALL_MS;
	}
	return rc;
}

/*
 * Agent thread: one rejoin attempt. Connecting blocks the agent for at
 * most the transport's connect timeout (nothing else needs it meanwhile);
 * HELLO and REGISTER are answered through rejoin_done().
 */
static void try_rejoin(struct emb_node *n)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	/* The old link's last calls complete here, before the new one. */
	emb_conn_destroy(n->conn);
	n->conn = NULL;
	co.host = n->sched_host;
	co.port = n->sched_port;
	co.on_close = on_conn_close;
	co.arg = n;
	rc = emb_conn_create(n->tr, &co, &n->conn);
	if (rc) {
		n->conn = NULL;
		rejoin_retry(n, emb_strerror(rc));
		return;
	}
	if (!n->token_len) {
		rc = rejoin_send(n);
		if (rc)
			rejoin_retry(n, emb_strerror(rc));
		return;
	}
	len = emb_hello_encode(n->rj_req, sizeof(n->rj_req), 0, n->token,
			       n->token_len,
			       n->reg.role == EMB_ROLE_SERVER ? "embstore-server"
							      : "embstore-worker");
	if (len < 0) {
		lose(n, len, "cannot encode HELLO");
		return;
	}
	memcpy(&hdr, n->rj_req, sizeof(hdr));
	iov = (struct iovec){n->rj_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, 1, n->rj_resp,
			   sizeof(n->rj_resp), rejoin_done, n);
	if (rc) {
		rejoin_retry(n, emb_strerror(rc));
		return;
	}
	n->rejoin_step = 1;
	n->rejoin_by_ms = (int64_t)emb_clock_ms() + REJOIN_CALL_MS;
}

/*
 * Agent thread, while away: the next rejoin attempt when it is due, or
 * the end of one whose answer is overdue (closing its conn completes the
 * call, and rejoin_done() plans the next). How long the loop may wait.
 */
static int64_t ride_out(struct emb_node *n, int64_t now)
{
	int64_t wait;

	if (n->rejoin_step && now >= n->rejoin_by_ms)
		emb_conn_close(n->conn, -ETIMEDOUT);
	else if (!n->rejoin_step && now >= n->retry_ms)
		try_rejoin(n);
	wait = (n->rejoin_step ? n->rejoin_by_ms : n->retry_ms) - now;
	if (wait < 1)
		wait = 1;
	return wait > REJOIN_MAX_MS ? REJOIN_MAX_MS : wait;
}

/*
 * Heartbeat timeouts without an answer before a node takes its scheduler
 * link for down. Not 1: the scheduler gives a silent node up to 3 T before
 * it suspects it and a probe of up to T after, so a node quicker to give
 * up on its scheduler than the scheduler on it would turn a stall of
 * either (a loaded machine) into a closed link. A scheduler that died
 * closes the link, which is noticed at once.
 */
#define LINK_SILENT_FACTOR 4

static void *agent_main(void *arg)
{
	struct emb_node *n = arg;
	const int64_t interval =
	    n->reg.hb_timeout_ms / 5 ? n->reg.hb_timeout_ms / 5 : 1;

	n->last_ok_ms = (int64_t)emb_clock_ms();
	n->next_hb_ms = n->last_ok_ms;
	for (;;) {
		int64_t now = (int64_t)emb_clock_ms(), wait, late;
		int rc;
		bool stop, quiet, away;

		pthread_mutex_lock(&n->mu);
		stop = n->stop;
		quiet = n->lost || n->ended;
		away = n->away;
		pthread_mutex_unlock(&n->mu);
		if (stop)
			break;
		if (!quiet && away) {
			rc = emb_transport_poll(n->tr, (int)ride_out(n, now));
			if (rc < 0 && rc != -EINTR) {
				emb_log(EMB_LOG_ERROR,
					"node agent loop failed: %s",
					emb_strerror(rc));
				break;
			}
			continue;
		}
		if (!quiet && now - n->last_ok_ms > LINK_SILENT_FACTOR *
							(int64_t)n->reg.hb_timeout_ms) {
			char why[64];

			snprintf(why, sizeof(why), "no answer for %lld ms",
				 (long long)(now - n->last_ok_ms));
			link_down(n, why);
		} else if (!quiet && !n->hb_inflight && now >= n->next_hb_ms) {
			n->next_hb_ms = now + interval;
			send_heartbeat(n);
		}
		wait = n->next_hb_ms - now;
		if (wait < 1 || n->hb_inflight)
			wait = interval;
		rc = emb_transport_poll(n->tr, (int)wait);
		/* Time past the wait that this loop did not run (the process
		 * was starved or stopped) is this node's own, not the
		 * scheduler's silence: the answer may be waiting unread. A few
		 * ms are the loop's own work. */
		late = (int64_t)emb_clock_ms() - now - wait;
		if (late > 5)
			n->last_ok_ms += late;
		/* A signal (a child stopping, say) is no reason to stop. */
		if (rc < 0 && rc != -EINTR) {
			emb_log(EMB_LOG_ERROR, "node agent loop failed: %s",
				emb_strerror(rc));
			break;
		}
	}
	return NULL;
}

/* ---- create / destroy ---------------------------------------------- */

static int connect_retry(struct emb_node *n, const struct emb_node_opts *o,
			 int64_t deadline)
{
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	int64_t start = (int64_t)emb_clock_ms();
	int64_t next_log = start + CONNECT_QUIET_MS;
	int rc;

	co.host = o->sched_host;
	co.port = o->sched_port;
	co.on_close = on_conn_close;
	co.arg = n;
	for (;;) {
		rc = emb_conn_create(n->tr, &co, &n->conn);
		if (rc == 0 || rc == -EINVAL || rc == -ENOMEM ||
		    (int64_t)emb_clock_ms() + CONNECT_RETRY_MS > deadline)
			return rc;
		if (o->cancel && *o->cancel)
			return -ECANCELED;
		/* The scheduler coming up after its nodes is normal, so
		 * nothing is said at first; once the wait gets long, a line
		 * at the default level (and then every CONNECT_NAG_MS) says
		 * what this process waits for, rather than a silent hang. */
		emb_log(EMB_LOG_DEBUG, "waiting for scheduler %s: %s", n->sched,
			emb_strerror(rc));
		if ((int64_t)emb_clock_ms() >= next_log) {
			emb_log(EMB_LOG_WARN,
				"waiting for the scheduler at %s "
				"(EMB_SCHED_HOST/EMB_SCHED_PORT) for %lld s: "
				"%s; giving up in %lld s",
				n->sched,
				(long long)((int64_t)emb_clock_ms() - start) /
				    1000,
				emb_strerror(rc),
				(long long)(deadline - (int64_t)emb_clock_ms()) /
				    1000);
			next_log = (int64_t)emb_clock_ms() + CONNECT_NAG_MS;
		}
		usleep(CONNECT_RETRY_MS * 1000);
	}
}

/* Creating thread, before the agent starts: logs in with the token. */
static int hello_sched(struct emb_node *n, const struct emb_node_opts *o)
{
	struct emb_wire_limits lim;
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	int rc;

	rc = emb_hello(n->conn, n->token, n->token_len,
		       o->role == EMB_ROLE_SERVER ? "embstore-server"
						  : "embstore-worker",
		       &lim, msg, sizeof(msg));
	if (rc < 0 && msg[0])
		emb_log(EMB_LOG_WARN, "scheduler %s: hello %s: %s", n->sched,
			emb_strerror(rc), msg);
	return rc;
}

/* Creating thread, before the agent starts. */
static int register_node(struct emb_node *n, const struct emb_node_opts *o)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE + 16 + EMB_WIRE_HOST_MAX + 1];
	_Alignas(8) uint8_t resp[SMALL_RESP];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_frame_hdr hdr, rhdr;
	struct emb_wire_frame f;
	struct iovec iov;
	int len, rc;

	len = emb_wire_register_req_encode(
	    req, sizeof(req), 0, o->role, o->port, (uint32_t)getpid(), o->host);
	if (len < 0)
		return len;
	memcpy(&hdr, req, sizeof(hdr));
	iov = (struct iovec){req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call_sync(n->conn, &hdr, &iov, 1, resp, sizeof(resp),
				&rhdr);
	if (rc)
		return rc;
	if (rhdr.status < 0) {
		/* A wait to join is logged once, by the caller. */
		if (rhdr.status != EMB_ENEWCOMER || !n->newcomer_said) {
			log_error_resp(n, &rhdr, resp);
			n->newcomer_said = rhdr.status == EMB_ENEWCOMER;
		}
		return rhdr.status;
	}
	f = (struct emb_wire_frame){.hdr = rhdr, .payload = resp, .lim = &lim};
	rc = emb_wire_register_resp_decode(&f, &n->reg);
	if (rc)
		return rc;
	if (n->reg.role != o->role)
		return EMB_EBADFRAME;
	return 0;
}

static void map_tell(struct emb_node *n);

/*
 * A job in etcd: takes m, the coordinator's newest map, as the node's:
 * the primaries, the copies per slot, the servers it no longer lists
 * (dropped by a failover) flagged removed, and with R > 1 (or ranks to
 * spare: emb_coord_mapped()) the whole map,
 * followed as a scheduler's is (emb_node_mapped()). *srv, when not NULL,
 * becomes the node's server list: taken whole when it has none yet (*srv
 * is then NULL), else copied over it (a newcomer's address at its rank);
 * *spare, a map buffer, becomes n->cmap when taken (*spare is then the
 * old one, or NULL). Without a server list nothing is taken. True when m
 * was taken.
 */
static bool coord_adopt(struct emb_node *n, const struct emb_cmap *m,
			struct emb_wire_node_addr **srv,
			struct emb_cmap **spare)
{
	const uint32_t S = n->reg.server_num;
	/* With copies, or ranks to spare whose joins and drains move slots
	 * (as a scheduler sends its whole map then). */
	const bool mapped = m->replicas >= 2 || emb_coord_mapped(n->coord);
	bool took = false;

	if (m->nservers != S)
		return false;
	pthread_mutex_lock(&n->mu);
	if (!n->servers && srv && *srv) {
		n->servers = *srv;
		*srv = NULL;
	}
	/* Handed out (emb_node_servers()): entries change in place. Only
	 * with a newer map, whose epoch came after the list was read. */
	if (n->servers && srv && *srv && n->cmap && mapped &&
	    m->epoch > n->cmap->epoch)
		memcpy(n->servers, *srv, S * sizeof(**srv));
	/* Maps only go forward; with one copy only the first is taken, as
	 * before (such a job is not mapped: its clients route by the
	 * primaries alone). */
	if (!n->servers || (n->have_map && (!mapped || !n->cmap ||
					    m->epoch <= n->cmap->epoch)))
		goto out;
	if (mapped && !(spare && *spare))
		goto out;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		uint32_t p = emb_cmap_primary(m, sl);

		/* A slot with no holder keeps its last primary: its calls
		 * fail there as the dead server's. */
		if (p < S || !n->have_map)
			n->slot_map[sl] = p < S ? (uint16_t)p : 0;
	}
	/* Handed out (emb_node_servers()): entries change in place. Out
	 * of the map and gone: a server drained out of it stays a TTL,
	 * answering the writes routed to it by older maps (refused there,
	 * sent again by the newer one), and is not counted dead meanwhile;
	 * a rank to spare nobody took is gone. */
	for (uint32_t i = 0; i < S; i++)
		n->servers[i].removed =
		    !emb_cmap_in_map(m, i) &&
		    !emb_coord_server_live(n->coord, i);
	n->replicas = m->replicas;
	if (mapped) {
		struct emb_cmap *old = n->cmap;

		n->cmap = *spare;
		*n->cmap = *m;
		*spare = old;
	}
	n->have_map = true;
	took = true;
out:
	pthread_mutex_unlock(&n->mu);
	return took;
}

/*
 * The coordinator's agent thread: a new map epoch of the job in etcd. A
 * server waits for no map, so its first server list is read here; with
 * each later map it is read again: a newcomer that took a dead rank
 * wrote its address there before any map could list it.
 */
static void on_coord_map(void *arg, const struct emb_cmap *m)
{
	struct emb_node *n = arg;
	struct emb_cmap *spare = NULL;
	struct emb_wire_node_addr *srv = NULL;
	int rc;

	/* One copy and no rank to spare: the worker's wait takes the
	 * first map, and no later one changes what such a job's nodes do. */
	if (m->replicas < 2 && !emb_coord_mapped(n->coord))
		return;
	rc = emb_coord_servers(n->coord, &srv);
	if (rc) {
		emb_log(EMB_LOG_WARN,
			"%s %u: cannot read the job's servers for map epoch "
			"%llu: %s",
			emb_role_name(n->reg.role), n->reg.rank,
			(unsigned long long)m->epoch, emb_strerror(rc));
		return;
	}
	spare = malloc(sizeof(*spare));
	if (!spare) {
		free(srv);
		return;
	}
	if (coord_adopt(n, m, &srv, &spare))
		map_tell(n);
	free(spare);
	free(srv);
}

/* A node whose job lives in etcd: the coordinator does the work. */
static int create_coord(const struct emb_node_opts *o, struct emb_node **out)
{
	struct emb_coord_opts co = {
	    .endpoints = o->coordinator,
	    .job = o->job,
	    .role = o->role,
	    .host = o->host,
	    .port = o->port,
	    .server_num = o->server_num,
	    .worker_num = o->worker_num,
	    .replicas = o->replicas,
	    .server_max = o->server_max,
	    .ttl_ms = o->hb_timeout_ms,
	    .join_timeout_ms = o->join_timeout_ms,
	    .on_end = o->on_end,
	    .arg = o->arg,
	    .cancel = o->cancel,
	};
	struct emb_node *n = calloc(1, sizeof(*n));
	int rc;

	if (!n)
		return -ENOMEM;
	rc = emb_coord_create(&co, &n->coord);
	if (rc) {
		free(n);
		return rc;
	}
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->cv, NULL);
	n->reg = *emb_coord_reg(n->coord);
	snprintf(n->sched, sizeof(n->sched), "(etcd)");
	/* From here on the coordinator's agent may hand over maps. */
	emb_coord_watch_map(n->coord, on_coord_map, n);
	*out = n;
	return 0;
}

int emb_node_create(const struct emb_node_opts *opts, struct emb_node **out)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_node *n;
	int64_t deadline;
	int rc;

	if (opts && out && opts->coordinator)
		return create_coord(opts, out);
	if (!opts || !out || !opts->sched_host || !*opts->sched_host ||
	    !opts->sched_port ||
	    (opts->role != EMB_ROLE_SERVER && opts->role != EMB_ROLE_WORKER) ||
	    (opts->role == EMB_ROLE_SERVER && !opts->port) ||
	    opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token))
		return -EINVAL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->cv, NULL);
	n->mapw.n = n;
	n->on_end = opts->on_end;
	n->end_arg = opts->arg;
	n->join_timeout_ms = opts->join_timeout_ms ? opts->join_timeout_ms
						   : EMB_JOIN_TIMEOUT_DEFAULT;
	snprintf(n->sched_host, sizeof(n->sched_host), "%s", opts->sched_host);
	n->sched_port = opts->sched_port;
	if (opts->host && strlen(opts->host) > EMB_WIRE_HOST_MAX) {
		rc = -EINVAL;
		goto err_free;
	}
	snprintf(n->my_host, sizeof(n->my_host), "%s",
		 opts->host ? opts->host : "");
	n->my_port = opts->port;
	n->token_len = opts->auth_token_len;
	if (n->token_len)
		memcpy(n->token, opts->auth_token, n->token_len);
	n->grace_ms = opts->sched_grace_ms;
	if (!n->grace_ms) {
		const char *g = getenv("EMB_SCHED_GRACE");

		n->grace_ms = EMB_SCHED_GRACE_DEFAULT;
		if (g && *g && parse_grace(g, &n->grace_ms)) {
			rc = -EINVAL;
			goto err_free;
		}
	}
	snprintf(n->sched, sizeof(n->sched), "%s:%u", opts->sched_host,
		 opts->sched_port);
	deadline = (int64_t)emb_clock_ms() + n->join_timeout_ms;

	n->hb_resp_cap = 8 + 8ull * EMB_WIRE_NODES_MAX;
	n->hb_resp = malloc(n->hb_resp_cap);
	n->dead = calloc(EMB_WIRE_NODES_MAX, sizeof(*n->dead));
	if (!n->hb_resp || !n->dead) {
		rc = -ENOMEM;
		goto err_free;
	}
	/* No call deadline: barriers wait as long as the slowest worker;
	 * heartbeats tell a dead scheduler from a slow barrier. */
	topts.call_timeout_ms = 0;
	topts.connect_timeout_ms = 2000;
	topts.max_frame_bytes = 4u << 20;
	rc = emb_transport_create("tcp", &topts, &n->tr);
	if (rc)
		goto err_free;
	rc = connect_retry(n, opts, deadline);
	if (rc) {
		emb_log(rc == -ECANCELED ? EMB_LOG_INFO : EMB_LOG_ERROR,
			"cannot reach scheduler %s: %s", n->sched,
			emb_strerror(rc));
		goto err_tr;
	}
	rc = opts->auth_token_len ? hello_sched(n, opts) : 0;
	if (!rc)
		rc = register_node(n, opts);
	/* A replacement started while another new server is being filled
	 * waits its turn (one fill at a time, docs/replication.md), on the
	 * same connection, until the join timeout. */
	while (rc == EMB_ENEWCOMER &&
	       (int64_t)emb_clock_ms() + NEWCOMER_RETRY_MS < deadline &&
	       !(opts->cancel && *opts->cancel)) {
		usleep(NEWCOMER_RETRY_MS * 1000);
		rc = register_node(n, opts);
	}
	if (rc) {
		emb_log(EMB_LOG_ERROR, "register with scheduler %s: %s",
			n->sched, emb_strerror(rc));
		goto err_conn;
	}
	emb_log(EMB_LOG_INFO, "registered with scheduler %s as %s %u of %u",
		n->sched, emb_role_name(n->reg.role), n->reg.rank,
		n->reg.role == EMB_ROLE_SERVER ? n->reg.server_num
					       : n->reg.worker_num);
	rc = emb_thread_start(&n->thread, NULL, agent_main, n, "emb-node");
	if (rc)
		goto err_conn;
	n->running = true;
	*out = n;
	return 0;

err_conn:
	emb_conn_destroy(n->conn);
err_tr:
	emb_transport_destroy(n->tr);
err_free:
	free(n->dead);
	free(n->hb_resp);
	pthread_cond_destroy(&n->cv);
	pthread_mutex_destroy(&n->mu);
	free(n);
	return rc;
}

int emb_node_create_static(uint32_t role, uint32_t rank, uint32_t nworkers,
			   const struct emb_wire_node_addr *servers,
			   uint32_t nservers, struct emb_node **out)
{
	struct emb_node *n;

	if (!servers || !nservers || nservers > EMB_WIRE_SERVERS_MAX ||
	    !nworkers || nworkers > EMB_WIRE_WORKERS_MAX ||
	    (role == EMB_ROLE_WORKER && rank >= nworkers) ||
	    (role != EMB_ROLE_WORKER && role != EMB_ROLE_SERVER))
		return -EINVAL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->servers = malloc(nservers * sizeof(*n->servers));
	n->bar_names = calloc(STATIC_BARRIERS_MAX, sizeof(*n->bar_names));
	n->bar_gens = calloc(STATIC_BARRIERS_MAX, sizeof(*n->bar_gens));
	if (!n->servers || !n->bar_names || !n->bar_gens) {
		free(n->servers);
		free(n->bar_names);
		free(n->bar_gens);
		free(n);
		return -ENOMEM;
	}
	memcpy(n->servers, servers, nservers * sizeof(*n->servers));
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->cv, NULL);
	n->is_static = true;
	n->reg.role = role;
	n->reg.rank = rank;
	n->reg.server_num = nservers;
	n->reg.worker_num = nworkers;
	/* The contiguous ranges a client computes from a server list. */
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		n->slot_map[sl] =
		    (uint16_t)((uint64_t)sl * nservers / EMB_NSLOTS);
	n->have_map = true;
	snprintf(n->sched, sizeof(n->sched), "(none)");
	*out = n;
	return 0;
}

struct emb_coord *emb_node_coord(const struct emb_node *n)
{
	return n->coord;
}

bool emb_node_is_static(const struct emb_node *n)
{
	return n->is_static;
}

int emb_node_barrier_gen(struct emb_node *n, const char *name, uint64_t *gen)
{
	uint32_t i;
	int rc = 0;

	if (!name || !*name || strlen(name) > EMB_WIRE_BARRIER_NAME_MAX)
		return -EINVAL;
	pthread_mutex_lock(&n->mu);
	for (i = 0; i < n->nbar; i++)
		if (!strcmp(n->bar_names[i], name))
			break;
	if (i == n->nbar && i == STATIC_BARRIERS_MAX) {
		rc = -ENOMEM;
	} else {
		if (i == n->nbar)
			snprintf(n->bar_names[n->nbar++],
				 sizeof(n->bar_names[0]), "%s", name);
		*gen = ++n->bar_gens[i];
	}
	pthread_mutex_unlock(&n->mu);
	return rc;
}

void emb_node_destroy(struct emb_node *n)
{
	if (!n)
		return;
	if (n->coord) {
		emb_coord_destroy(n->coord);
		free(n->cmap);
		free(n->servers);
		pthread_cond_destroy(&n->cv);
		pthread_mutex_destroy(&n->mu);
		free(n);
		return;
	}
	if (n->is_static) {
		free(n->servers);
		free(n->bar_names);
		free(n->bar_gens);
		pthread_cond_destroy(&n->cv);
		pthread_mutex_destroy(&n->mu);
		free(n);
		return;
	}
	if (n->running) {
		pthread_mutex_lock(&n->mu);
		n->stop = true;
		pthread_mutex_unlock(&n->mu);
		emb_transport_wake(n->tr);
		pthread_join(n->thread, NULL);
	}
	/* The agent is gone: this thread owns the conn now. Quietly: the
	 * close callback must not report a loss nobody can act on. */
	pthread_mutex_lock(&n->mu);
	n->ended = true;
	if (!n->lost)
		n->lost = EMB_ECLOSED;
	pthread_mutex_unlock(&n->mu);
	emb_conn_destroy(n->conn);
	emb_transport_destroy(n->tr);
	free(n->mapw.resp);
	free(n->mapr_resp);
	free(n->cmap);
	free(n->servers);
	free(n->dead);
	free(n->hb_resp);
	pthread_cond_destroy(&n->cv);
	pthread_mutex_destroy(&n->mu);
	free(n);
}

/* ---- calls ---------------------------------------------------------- */

/*
 * Takes a CLUSTER_MAP response (hdr, payload) as the node's map: the first
 * one, or a newer one of a replicated job (*newer then says it was taken).
 * 0, EMB_EBADFRAME, -ENOMEM.
 */
static int map_take_frame(struct emb_node *n, const struct emb_frame_hdr *hdr,
			  const void *payload, bool *newer)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	struct emb_wire_cluster_map m;
	struct emb_wire_node_addr *srv;
	struct emb_cmap *cm = NULL;
	int rc;

	*newer = false;
	lim.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	f = (struct emb_wire_frame){.hdr = *hdr, .payload = payload, .lim = &lim};
	rc = emb_wire_cluster_map_decode(&f, &m);
	if (rc)
		return rc;
	if (m.nservers != n->reg.server_num || m.nworkers != n->reg.worker_num)
		return EMB_EBADFRAME;
	if (m.cmap) {
		cm = malloc(sizeof(*cm));
		if (!cm)
			return -ENOMEM;
		rc = emb_cmap_decode(m.cmap, m.cmap_len, cm);
		if (!rc && (cm->nservers != m.nservers ||
			    cm->replicas != m.replicas))
			rc = EMB_EBADFRAME;
		if (rc) {
			free(cm);
			return rc;
		}
	}
	srv = calloc(m.nservers, sizeof(*srv));
	if (!srv) {
		free(cm);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < m.nservers; i++)
		emb_wire_cluster_map_server(&m, i, &srv[i]);
	pthread_mutex_lock(&n->mu);
	/* Maps only go forward: an answer overtaken by a newer one is
	 * dropped. */
	if (n->have_map && (!cm || !n->cmap || cm->epoch <= n->cmap->epoch)) {
		pthread_mutex_unlock(&n->mu);
		free(srv);
		free(cm);
		return 0;
	}
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		n->slot_map[s] = emb_wire_cluster_map_slot(&m, s);
	/* Once handed out (emb_node_servers()) the array stays: entries
	 * change in place. */
	if (n->servers) {
		memcpy(n->servers, srv, m.nservers * sizeof(*srv));
		free(srv);
	} else {
		n->servers = srv;
	}
	n->replicas = m.replicas;
	*newer = true;
	n->have_map = true;
	free(n->cmap);
	n->cmap = cm;
	pthread_mutex_unlock(&n->mu);
	return 0;
}

static int map_take(struct emb_node *n)
{
	bool newer;

	return map_take_frame(n, &n->mapw.rhdr, n->mapw.resp, &newer);
}

/* Agent thread: tells the map watcher about the map just taken. */
static void map_tell(struct emb_node *n)
{
	struct emb_cmap *m = malloc(sizeof(*m));
	struct emb_wire_node_addr *srv =
	    calloc(n->reg.server_num, sizeof(*srv));
	emb_node_map_fn fn;
	void *arg;

	pthread_mutex_lock(&n->mu);
	fn = n->map_fn;
	arg = n->map_arg;
	if (m && srv && n->cmap) {
		*m = *n->cmap;
		memcpy(srv, n->servers, n->reg.server_num * sizeof(*srv));
	} else {
		fn = NULL;
	}
	pthread_mutex_unlock(&n->mu);
	if (fn)
		fn(arg, m, srv, n->reg.server_num);
	free(srv);
	free(m);
}

static void mapr_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct emb_node *n = ctx;
	bool newer = false, watched = n->map_watching;
	int rc;

	n->map_inflight = n->map_watching = false;
	if (status)
		return; /* the link is gone: lose() says so */
	if (resp->status == EMB_EBADFRAME && watched) {
		/* A scheduler older than watches: heartbeats tell of maps. */
		n->map_watch_off = true;
		emb_log(EMB_LOG_DEBUG,
			"%s %u: the scheduler holds no map watch: new maps "
			"come with heartbeats",
			emb_role_name(n->reg.role), n->reg.rank);
		return;
	}
	if (resp->status < 0) {
		log_error_resp(n, resp, n->mapr_resp);
		return;
	}
	rc = map_take_frame(n, resp, n->mapr_resp, &newer);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "%s %u: bad cluster map: %s",
			emb_role_name(n->reg.role), n->reg.rank,
			emb_strerror(rc));
		return;
	}
	if (newer) {
		emb_log(EMB_LOG_DEBUG, "%s %u: map epoch %llu",
			emb_role_name(n->reg.role), n->reg.rank,
			(unsigned long long)n->cmap->epoch);
		map_tell(n);
	}
	/* The next one, watched for at once. A watch answered with no
	 * newer map waits for the next heartbeat instead: a scheduler
	 * answering every watch at once is not asked in a loop. A plain
	 * fetch's answer arms one even when the map came another way
	 * meanwhile (a join's wait for its first map): its watch, asked
	 * while the fetch was in flight, was never sent, and the server
	 * would have learned the next maps only from its heartbeats. */
	if (newer || !watched)
		watch_map(n);
}

/*
 * Agent thread: asks the scheduler for its map, unless already asking;
 * with watch, for a map newer than the node's, held by the scheduler
 * until it makes one (docs/protocol.md, "Map watch").
 */
static void ask_map(struct emb_node *n, bool watch)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	uint64_t have;
	bool ready;
	int len, rc;

	/* A server takes its first map here too: nothing waits for it. */
	pthread_mutex_lock(&n->mu);
	ready = !n->lost && !n->stop && !n->away;
	have = n->cmap ? n->cmap->epoch : 0;
	pthread_mutex_unlock(&n->mu);
	if (n->map_inflight || !ready || n->coord || n->is_static)
		return;
	if (watch && (!have || have > UINT32_MAX))
		return;
	if (!n->mapr_resp) {
		n->mapr_cap = emb_wire_cluster_map_cap(n->reg.server_num) -
			      EMB_WIRE_HDR_SIZE;
		n->mapr_resp = malloc(n->mapr_cap);
		if (!n->mapr_resp)
			return;
	}
	len = emb_wire_map_req_encode(n->mapr_req, sizeof(n->mapr_req), 0,
				      n->reg.node_id,
				      watch ? (uint32_t)have : 0);
	if (len < 0)
		return;
	memcpy(&hdr, n->mapr_req, sizeof(hdr));
	iov = (struct iovec){n->mapr_req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(n->conn, &hdr, &iov, 1, n->mapr_resp, n->mapr_cap,
			   mapr_done, n);
	n->map_inflight = rc == 0;
	n->map_watching = rc == 0 && watch;
}

static void fetch_map(struct emb_node *n)
{
	ask_map(n, false);
}

/*
 * A server of a replicated job keeps a watch on the map: it takes each
 * new map within a round trip of the scheduler's making it. It has to:
 * a server whose map is older than a write's refuses the write
 * (EMB_EMOVING), and a move's new holder refuses its chunk's writes
 * until it has the map that hands the chunk over. Left to heartbeats
 * (every timeout / 5, 2 s by default) or to such a refused write, each
 * of a move's maps cost the job a step of tens of milliseconds
 * (docs/benchmarks.md, "The hand-over"). Workers do not watch: a write
 * refused with EMB_ESTALEMAP sends them for the map, and S servers'
 * watches cost the scheduler S maps per epoch where W workers' would
 * cost S + W.
 */
static void watch_map(struct emb_node *n)
{
	if (n->reg.role == EMB_ROLE_SERVER && !n->map_watch_off)
		ask_map(n, true);
}

static void fetch_map_task(void *arg)
{
	fetch_map(arg);
}

static void watch_map_task(void *arg)
{
	watch_map(arg);
}

/*
 * A job in etcd: waits for its map (emb_coord_wait_map()) and takes the
 * newest (coord_adopt()), unless the coordinator's agent took one first.
 */
static int coord_wait_map(struct emb_node *n)
{
	struct emb_cmap *m = malloc(sizeof(*m)), *spare = malloc(sizeof(*m));
	uint16_t *slots = malloc(EMB_NSLOTS * sizeof(*slots));
	struct emb_wire_node_addr *srv = NULL;
	int rc = -ENOMEM;

	if (!m || !spare || !slots)
		goto out;
	rc = emb_coord_wait_map(n->coord, slots, &srv);
	if (rc == 0)
		rc = emb_coord_map(n->coord, m);
	if (rc == 0)
		(void)coord_adopt(n, m, &srv, &spare);
out:
	free(srv);
	free(slots);
	free(spare);
	free(m);
	return rc;
}

int emb_node_wait_map(struct emb_node *n)
{
	struct waiter *w = &n->mapw;
	bool have;
	int rc;

	/* Under the lock: the agent may have taken a map meanwhile (a
	 * server's first, when a heartbeat told it of one). */
	pthread_mutex_lock(&n->mu);
	have = n->have_map;
	pthread_mutex_unlock(&n->mu);
	if (have)
		return 0;
	if (n->coord)
		return coord_wait_map(n);
	if (!w->resp) {
		w->resp_cap = emb_wire_cluster_map_cap(n->reg.server_num) -
			      EMB_WIRE_HDR_SIZE;
		w->resp_cap =
		    w->resp_cap < SMALL_RESP ? SMALL_RESP : w->resp_cap;
		w->resp = malloc(w->resp_cap);
		if (!w->resp)
			return -ENOMEM;
		w->req_len = emb_wire_node_req_encode(w->req, sizeof(w->req),
						      EMB_OP_CLUSTER_MAP, 0,
						      n->reg.node_id);
		if (w->req_len < 0)
			return w->req_len;
	}
	rc = waiter_run(w, (int64_t)emb_clock_ms() + n->join_timeout_ms);
	if (rc == -ETIMEDOUT)
		emb_log(EMB_LOG_ERROR, "%s %u: cluster not ready after %u ms",
			emb_role_name(n->reg.role), n->reg.rank,
			n->join_timeout_ms);
	if (rc)
		return rc;
	rc = map_take(n);
	/* The agent watches for the next one from now on, not from its
	 * next heartbeat. */
	if (rc == 0 && n->tr && !n->is_static)
		(void)emb_transport_exec(n->tr, watch_map_task, n);
	return rc;
}

uint32_t emb_node_role(const struct emb_node *n)
{
	return n->reg.role;
}

uint32_t emb_node_rank(const struct emb_node *n)
{
	return n->reg.rank;
}

uint32_t emb_node_nservers(const struct emb_node *n)
{
	return n->reg.server_num;
}

bool emb_node_mapped(struct emb_node *n)
{
	bool m;

	if (n->is_static)
		return false;
	pthread_mutex_lock(&n->mu);
	m = n->cmap != NULL;
	pthread_mutex_unlock(&n->mu);
	return m;
}

uint32_t emb_node_replicas(const struct emb_node *n)
{
	return n->replicas ? n->replicas : 1;
}

uint32_t emb_node_nworkers(const struct emb_node *n)
{
	return n->reg.worker_num;
}

const uint16_t *emb_node_slot_map(const struct emb_node *n)
{
	return n->have_map ? n->slot_map : NULL;
}

const struct emb_wire_node_addr *emb_node_servers(const struct emb_node *n)
{
	return n->have_map ? n->servers : NULL;
}

void emb_node_watch(struct emb_node *n, emb_node_dead_fn fn, void *arg)
{
	uint32_t seen = 0;

	if (n->coord) {
		emb_coord_watch(n->coord, fn, arg);
		return;
	}
	for (;;) {
		struct emb_wire_node_ref d;

		pthread_mutex_lock(&n->mu);
		if (seen == 0) {
			n->watch_fn = fn;
			n->watch_arg = arg;
		}
		if (!fn || seen >= n->ndead) {
			pthread_mutex_unlock(&n->mu);
			return;
		}
		d = n->dead[seen++];
		pthread_mutex_unlock(&n->mu);
		if (!(d.role & EMB_WIRE_ROLE_REPLACED))
			fn(arg, d.role, d.rank);
	}
}

static int simple_call(struct emb_node *n, struct waiter *w, uint8_t op)
{
	uint32_t count;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	_Alignas(8) uint8_t resp[SMALL_RESP];
	int rc;

	w->n = n;
	w->resp = resp;
	w->resp_cap = sizeof(resp);
	rc = waiter_run(w, 0);
	if (rc)
		return rc;
	f = (struct emb_wire_frame){
	    .hdr = w->rhdr, .payload = resp, .lim = &lim};
	return emb_wire_cluster_ack_decode(&f, op, &count);
}

int emb_node_barrier(struct emb_node *n, const char *name)
{
	struct waiter w = {0};

	if (n->reg.role != EMB_ROLE_WORKER)
		return EMB_ECLUSTER;
	if (n->is_static)
		return EMB_ENOSCHED;
	if (n->coord)
		return emb_coord_barrier(n->coord, name);
	w.req_len = emb_wire_barrier_req_encode(w.req, sizeof(w.req), 0,
						n->reg.node_id, name);
	if (w.req_len < 0)
		return -EINVAL;
	return simple_call(n, &w, EMB_OP_BARRIER);
}

int emb_node_finish(struct emb_node *n)
{
	struct waiter w = {0};
	int rc;

	if (n->reg.role != EMB_ROLE_WORKER)
		return EMB_ECLUSTER;
	if (n->is_static)
		return 0; /* nobody to tell: servers stop when told to */
	if (n->coord)
		return emb_coord_finish(n->coord);
	w.req_len = emb_wire_node_req_encode(w.req, sizeof(w.req),
					     EMB_OP_FINISH, 0, n->reg.node_id);
	if (w.req_len < 0)
		return w.req_len;
	rc = simple_call(n, &w, EMB_OP_FINISH);
	if (rc == 0) {
		pthread_mutex_lock(&n->mu);
		n->ended = true;
		pthread_mutex_unlock(&n->mu);
	}
	return rc;
}

void emb_node_watch_map(struct emb_node *n, emb_node_map_fn fn, void *arg)
{
	struct emb_cmap *m = malloc(sizeof(*m));
	struct emb_wire_node_addr *srv =
	    calloc(n->reg.server_num ? n->reg.server_num : 1, sizeof(*srv));
	bool have = false;

	pthread_mutex_lock(&n->mu);
	n->map_fn = fn;
	n->map_arg = arg;
	if (fn && m && srv && n->cmap) {
		*m = *n->cmap;
		memcpy(srv, n->servers, n->reg.server_num * sizeof(*srv));
		have = true;
	}
	pthread_mutex_unlock(&n->mu);
	if (have)
		fn(arg, m, srv, n->reg.server_num);
	free(srv);
	free(m);
}

int emb_node_cmap(struct emb_node *n, struct emb_cmap *out)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&n->mu);
	if (n->cmap) {
		*out = *n->cmap;
		rc = 0;
	}
	pthread_mutex_unlock(&n->mu);
	return rc;
}

void emb_node_map_refresh(struct emb_node *n)
{
	if (n && n->coord)
		emb_coord_poll_now(n->coord);
	else if (n && n->tr && !n->is_static)
		(void)emb_transport_exec(n->tr, fetch_map_task, n);
}

int emb_node_fill_done(struct emb_node *n, uint32_t first, uint32_t nslots,
		       uint64_t epoch, int status, uint64_t rows,
		       uint64_t bytes)
{
	struct emb_wire_fill_done_req d = {
	    .node_id = n->reg.node_id,
	    .status = status,
	    .first = first,
	    .n = nslots,
	    .epoch = epoch,
	    .rows = rows,
	    .bytes = bytes,
	};
	struct waiter w = {0};

	/* In etcd the next step comes from the leader's poll; the caller
	 * asks for the map (emb_node_map_refresh()) as with a scheduler. */
	if (n->coord)
		return emb_coord_fill_done(n->coord, first, nslots, epoch,
					   status, rows, bytes);
	if (n->reg.role != EMB_ROLE_SERVER || n->is_static)
		return EMB_ECLUSTER;
	w.req_len = emb_wire_fill_done_req_encode(w.req, sizeof(w.req), 0, &d);
	if (w.req_len < 0)
		return w.req_len;
	return simple_call(n, &w, EMB_OP_FILL_DONE);
}
