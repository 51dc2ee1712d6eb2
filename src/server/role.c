/*
 * src/server/role.c - the server role of embstore-server (role.h): the
 * order in which a daemon's server, /metrics, checkpoints, node agent and
 * replication control start and stop, the health its /healthz reports,
 * and the default memory limit. One controlling thread; the health check
 * and the collector run on the metrics endpoint's thread and read only
 * atomics, and the node once joined says it is there.
 */
#include "server/role.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cluster/coord.h"
#include "cluster/drain.h"
#include "cluster/node.h"
#include "cluster/scheduler.h"
#include "common/err.h"
#include "common/log.h"
#include "metrics/metrics.h"
#include "server/metrics.h"
#include "server/replica.h"

struct emb_server_role {
	struct emb_server_role_opts o; /* as given; ckpt.dir borrowed */
	struct emb_server *srv;	       /* owned */
	struct emb_metrics *metrics;   /* owned, or NULL */
	struct emb_ckpt *ckpt;	       /* owned, or NULL */
	struct emb_node *node;	       /* owned, or NULL */
	struct emb_replica *replica;   /* owned, or NULL */
	bool joined; /* ready for /healthz: registered, or no cluster;
			atomic */
};

uint64_t emb_server_default_mem_limit(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys =
	    pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	unsigned long long cg;
	FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");

	if (f) {
		if (fscanf(f, "%llu", &cg) == 1 && cg && (!phys || cg < phys))
			phys = cg;
		fclose(f);
	}
	return phys / 8 * 5;
}

/* True when the role joins a cluster: a scheduler or a coordinator. */
static bool clustered(const struct emb_server_role_opts *o)
{
	return o->env && (o->env->sched_host[0] || o->env->coordinator);
}

/* emb_server_opts.on_start: tables come back before the listener opens. */
static int load_checkpoint(struct emb_server *s, void *arg)
{
	const struct emb_server_role_opts *o = arg;

	return emb_ckpt_load(s, o->ckpt.dir, o->ckpt_start_empty);
}

/*
 * /healthz: ready once the server has loaded its checkpoint (before it
 * listens) and, in a cluster, registered with the scheduler; not ready
 * again once it stops.
 */
static bool health(void *arg, char *why, size_t cap)
{
	struct emb_server_role *r = arg;

	if (r->o.cancel && *r->o.cancel) {
		snprintf(why, cap, "stopping");
		return false;
	}
	if (!__atomic_load_n(&r->joined, __ATOMIC_ACQUIRE)) {
		snprintf(why, cap, "not registered with the scheduler yet");
		return false;
	}
	return true;
}

/*
 * /metrics: the server's own, and, while this server leads a job kept in
 * etcd, the drain or join under way (the gauges a scheduler's /metrics
 * has): a job in etcd has no scheduler to scrape, and its leader is the
 * node that steps the moves. One etcd read a scrape, by the leader only.
 */
static void collect(void *arg, struct emb_metrics_out *o)
{
	struct emb_server_role *r = arg;
	struct emb_wire_moves m;
	struct emb_coord *c;

	emb_server_metrics_collect(r->srv, o);
	/* r->node is written before joined is set, and not again until
	 * the endpoint is gone (role_free()). */
	if (!__atomic_load_n(&r->joined, __ATOMIC_ACQUIRE) || !r->node)
		return;
	c = emb_node_coord(r->node);
	if (!c || emb_coord_moves(c, &m) != 1)
		return;
	/* With no move under way, moves_of() gives 0 left and an ETA of
	 * -1, as the scheduler shows then. */
	emb_cluster_metrics_move(o, m.left, m.eta_ms, m.rows, m.bytes);
}

/* Frees what start and join made, without a final checkpoint. */
static void role_free(struct emb_server_role *r)
{
	emb_ckpt_stop(r->ckpt);
	emb_metrics_destroy(r->metrics);
	/* Replication first: its map callbacks use the server. */
	emb_replica_destroy(r->replica);
	emb_server_destroy(r->srv);
	emb_node_destroy(r->node);
	free(r);
}

int emb_server_role_start(const struct emb_server_role_opts *o,
			  struct emb_server_role **out)
{
	const struct emb_server_opts *so = &o->server;
	struct emb_server_role *r = calloc(1, sizeof(*r));
	struct emb_server_opts sopts = o->server;
	char mem_desc[32];
	int rc;

	if (!r)
		return -ENOMEM;
	r->o = *o;
	if (o->ckpt.dir) {
		sopts.on_start = load_checkpoint;
		sopts.start_arg = &r->o;
	}
	rc = emb_server_create(&sopts, &r->srv);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "cannot serve %s:%u over %s: %s",
			so->host, so->port, so->transport, emb_strerror(rc));
		free(r);
		return rc;
	}
	if (so->mem_limit)
		snprintf(mem_desc, sizeof(mem_desc), "%llu MiB",
			 (unsigned long long)(so->mem_limit >> 20));
	else
		snprintf(mem_desc, sizeof(mem_desc), "none");
	emb_log(EMB_LOG_INFO,
		"listening on %s:%u (%s, %u thread%s%s%s, mem limit %s)",
		so->host, emb_server_port(r->srv), so->transport, so->threads,
		so->threads == 1 ? "" : "s", so->auth_token_len ? ", auth" : "",
		so->admin_token_len ? ", admin token" : "", mem_desc);
	if (o->metrics_addr) {
		rc = emb_server_metrics_serve(o->metrics_addr, collect, r,
					      &r->metrics);
		if (rc)
			goto err;
	}
	/* Checkpoint loaded (emb_server_create ran on_start); a server in
	 * a cluster is ready once it registered. */
	r->joined = !clustered(o);
	if (r->metrics)
		emb_metrics_set_health(r->metrics, health, r);
	if (o->ckpt.dir) {
		rc = emb_ckpt_start(r->srv, &o->ckpt, &r->ckpt);
		if (rc) {
			emb_log(EMB_LOG_ERROR, "cannot start checkpoints: %s",
				emb_strerror(rc));
			goto err;
		}
	}
	*out = r;
	return 0;

err:
	role_free(r);
	return rc;
}

int emb_server_role_join(struct emb_server_role *r)
{
	const struct emb_cluster_env *env = r->o.env;
	struct emb_node_opts no;
	int rc;

	if (!clustered(&r->o))
		return 0;
	no = (struct emb_node_opts){
	    .coordinator = env->coordinator,
	    .job = env->job,
	    .server_num = env->server_num,
	    .worker_num = env->worker_num,
	    .hb_timeout_ms = env->hb_timeout_ms,
	    .replicas = env->replicas,
	    .server_max = env->server_max,
	    .sched_host = env->sched_host,
	    .sched_port = env->sched_port,
	    .role = EMB_ROLE_SERVER,
	    .host = r->o.server.host,
	    .port = emb_server_port(r->srv),
	    .join_timeout_ms = env->join_timeout_ms,
	    .on_end = r->o.on_end,
	    .cancel = r->o.cancel,
	    .auth_token = r->o.server.auth_token,
	    .auth_token_len = r->o.server.auth_token_len,
	};
	rc = emb_node_create(&no, &r->node);
	if (rc) {
		r->node = NULL;
		/* Cut short by a signal: the daemon is stopping anyway. */
		return r->o.cancel && *r->o.cancel ? 0 : rc;
	}
	__atomic_store_n(&r->joined, true, __ATOMIC_RELEASE);
	/* Replicated: writes are checked against the cluster map, the
	 * scheduler's or the one in etcd, and fills stream from here
	 * (docs/replication.md). */
	rc = emb_replica_create(r->srv, r->node, &r->replica);
	if (rc)
		emb_log(EMB_LOG_ERROR, "cannot follow the cluster map: %s",
			emb_strerror(rc));
	return rc;
}

int emb_server_role_stop(struct emb_server_role *r)
{
	int rc = 0;

	if (!r)
		return 0;
	emb_server_stop(r->srv, 10000);
	/* Requests have stopped: the last checkpoint holds every update. */
	if (r->ckpt) {
		rc = emb_ckpt_write_final(r->ckpt);
		if (rc)
			emb_log(EMB_LOG_ERROR,
				"final checkpoint failed: %s; exiting 1, "
				"updates since the last checkpoint are lost",
				emb_strerror(rc));
	}
	role_free(r);
	emb_log(EMB_LOG_INFO, "stopped");
	return rc;
}

int emb_server_role_drain(struct emb_server_role *r)
{
	const struct emb_cluster_env *env = r->o.env;
	char why[EMB_WIRE_ERRMSG_MAX + 1];
	int rc;

	if (r->node && env && env->coordinator) {
		rc = emb_coord_drain(emb_node_coord(r->node), why,
				     sizeof(why));
		if (rc)
			emb_log(EMB_LOG_WARN, "cannot drain: %s%s%s",
				emb_strerror(rc), why[0] ? ": " : "", why);
		return rc;
	}
	if (!r->node || !env || !env->sched_host[0])
		return -ENOTSUP;
	/* A short wait: a scheduler that does not answer soon is no place
	 * to move slots through, and the signal asked for a stop. */
	rc = emb_sched_drain(env->sched_host, env->sched_port,
			     r->o.server.auth_token,
			     r->o.server.auth_token_len,
			     emb_node_rank(r->node), 3000, why, sizeof(why));
	if (rc)
		emb_log(EMB_LOG_WARN, "cannot drain: %s%s%s", emb_strerror(rc),
			why[0] ? ": " : "", why);
	return rc;
}

void emb_server_role_destroy(struct emb_server_role *r)
{
	if (r)
		role_free(r);
}
