/*
 * src/cluster/node.h - a cluster member's link to the scheduler: the
 * environment that describes the cluster, registration, the cluster map,
 * heartbeats, barriers and the end of the job. Used by the worker library
 * (cluster.c) and by the server daemon; not installed.
 *
 * A node runs one agent thread with its own TCP loop and one connection to
 * the scheduler. The agent pings every timeout / 5, learns from the answers
 * which nodes died and whether the job is finishing, and declares the
 * scheduler lost when no answer came for a whole timeout. The functions
 * below may be called from any thread, except emb_node_destroy(), which
 * needs every other call finished.
 */
#ifndef EMB_CLUSTER_NODE_H
#define EMB_CLUSTER_NODE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/hash.h"
#include "proto/wire_cluster.h"

#define EMB_SCHED_PORT_DEFAULT	      7165
#define EMB_HEARTBEAT_TIMEOUT_DEFAULT 10000u  /* ms */
#define EMB_JOIN_TIMEOUT_DEFAULT      300000u /* ms */
#define EMB_SCHED_GRACE_DEFAULT	      300000u /* ms */

/*
 * The cluster as the environment describes it. EMB_* names win over their
 * MindSpore aliases (MS_ROLE with MS_SCHED / MS_PSERVER / MS_WORKER,
 * MS_SCHED_HOST, MS_SCHED_PORT, MS_SERVER_NUM, MS_WORKER_NUM), which win
 * over Paddle's: TRAINING_ROLE (PSERVER / TRAINER), PADDLE_TRAINERS_NUM,
 * and, for a cluster without a scheduler, PADDLE_PSERVERS_IP_PORT_LIST (the
 * servers, in rank order), PADDLE_TRAINER_ID (a trainer's rank), and
 * POD_IP with PADDLE_PORT (where a server listens).
 */
struct emb_cluster_env {
	uint32_t role; /* EMB_ROLE: EMB_ROLE_NONE when unset */
	char sched_host[EMB_WIRE_HOST_MAX + 1]; /* EMB_SCHED_HOST; "" unset */
	uint16_t sched_port;	  /* EMB_SCHED_PORT; default 7165 */
	uint32_t server_num;	  /* EMB_SERVER_NUM; 0 when unset */
	uint32_t worker_num;	  /* EMB_WORKER_NUM; 0 when unset */
	uint32_t hb_timeout_ms;	  /* EMB_HEARTBEAT_TIMEOUT, seconds (may be
				     fractional); default 10 s */
	uint32_t replicas;	  /* EMB_REPLICAS: copies of each slot,
				     1..EMB_WIRE_REPLICAS_MAX; 0 when unset
				     (the scheduler's default is 1, a job
				     in etcd keeps its first node's) */
	uint32_t server_max;	  /* EMB_SERVER_MAX: ranks servers may
				     hold (the scheduler's, or a job in
				     etcd's first node's); 0 when unset */
	uint32_t join_timeout_ms; /* EMB_CLUSTER_TIMEOUT, seconds: how long
				     to wait for the scheduler and the other
				     nodes; default 300 s */
	const char *servers;	  /* PADDLE_PSERVERS_IP_PORT_LIST, checked;
				     NULL unset. Points into the
				     environment */
	int64_t rank;		  /* PADDLE_TRAINER_ID; -1 when unset */
	char listen[EMB_WIRE_HOST_MAX + 8]; /* POD_IP:PADDLE_PORT ("0.0.0.0"
					       without POD_IP); "" unset */
	const char *coordinator;  /* EMB_COORDINATOR, "etcd://h:p[,h:p]":
				     the job lives in etcd, no scheduler;
				     NULL unset. Points into the environment */
	const char *job;	  /* EMB_JOB: the job's name in etcd; NULL
				     unset ("embstore") */
	const char *sched_state;  /* EMB_SCHED_STATE: the scheduler's state
				     file; NULL unset. Points into the
				     environment */
	uint32_t sched_grace_ms;  /* EMB_SCHED_GRACE, seconds: how long a
				     node of a formed job rides out its
				     scheduler's absence; default 300 s,
				     0 = not at all */
};

/*
 * Reads the environment into *out. 0, or -EINVAL with the name of the
 * variable that does not parse in *bad (may be NULL). Thread-safe as long
 * as nobody changes the environment meanwhile.
 */
int emb_cluster_env_read(struct emb_cluster_env *out, const char **bad);

/*
 * "scheduler", "server", "worker", MindSpore's "MS_SCHED", "MS_PSERVER",
 * "MS_WORKER" and Paddle's "PSERVER", "TRAINER" to EMB_ROLE_*; 0, or
 * -EINVAL.
 */
int emb_role_parse(const char *s, uint32_t *role);

struct emb_node;

/*
 * Called from the agent thread: another node was declared dead (role and
 * rank), or the job ended for this node (status 0: the cluster finished;
 * EMB_ENOSCHED: scheduler lost; EMB_ENODEAD: the scheduler declared this
 * node dead). A callback must not call emb_node_destroy().
 */
typedef void (*emb_node_dead_fn)(void *arg, uint32_t role, uint32_t rank);
typedef void (*emb_node_end_fn)(void *arg, int status);

struct emb_cmap;

/*
 * Called on the agent thread with each newer replicated map the scheduler
 * publishes (heartbeats carry its epoch; docs/replication.md, "Recovery"),
 * or that a job in etcd stores (the coordinator's agent thread then), and
 * the servers' addresses by rank (a newcomer that took a dead rank has its
 * own). Both are valid for the call only.
 */
typedef void (*emb_node_map_fn)(void *arg, const struct emb_cmap *m,
				const struct emb_wire_node_addr *servers,
				uint32_t nservers);

struct emb_node_opts {
	const char *sched_host;	  /* scheduler address; copied */
	uint16_t sched_port;	  /* scheduler port */
	uint32_t role;		  /* EMB_ROLE_SERVER or EMB_ROLE_WORKER */
	const char *host;	  /* server: address to advertise; NULL or ""
				     = the one the scheduler sees */
	uint16_t port;		  /* server: its bound listen port */
	uint32_t join_timeout_ms; /* connect retries and map wait; 0 = 300 s */
	const uint8_t *auth_token; /* sent in HELLO before REGISTER, or NULL
				      (no HELLO); borrowed for the call */
	uint32_t auth_token_len;   /* bytes, <= 256 */
	emb_node_end_fn on_end;	  /* optional */
	void *arg;		  /* passed to on_end */
	/* Optional: non-zero stops the connect retries (a daemon's signal
	 * flag, so Ctrl-C works while the scheduler is not up yet). */
	const volatile sig_atomic_t *cancel;
	/* Optional: "etcd://h:p[,h:p]": the coordinator is etcd
	 * (cluster/coord.h), not the scheduler; sched_* are then unused and
	 * the fields below count. No HELLO: etcd has no token of ours. */
	const char *coordinator;
	const char *job;	 /* the job's name in etcd; NULL = default */
	uint32_t server_num;	 /* etcd: counts, 0 = the job's (the
				    scheduler's are its own) */
	uint32_t worker_num;
	uint32_t hb_timeout_ms;	 /* etcd: lease TTL; 0 = 10 s */
	uint32_t replicas;	 /* etcd: copies of each slot; 0 = the
				    job's (1 for its first node) */
	uint32_t server_max;	 /* etcd: ranks servers may hold; 0 = the
				    job's (server_num for its first node) */
	/* Scheduler: how long a node of a formed job rides out the
	 * scheduler's absence, rejoining it (docs/cluster.md); 0 = the
	 * environment's EMB_SCHED_GRACE (0 there: not at all), else 300 s. */
	uint32_t sched_grace_ms;
};

/*
 * With opts->coordinator, joins the job in etcd instead (emb_coord_create():
 * its errors, EMB_ENOETCD and EMB_EETCD among them), and every call
 * below goes there; with the scheduler:
 * Connects to the scheduler (retrying while it is not up yet, for at most
 * join_timeout_ms), logs in with HELLO when given a token, registers, and
 * starts heartbeats. The agent thread
 * blocks every signal: they stay with the host's threads. Returns 0 and
 * *out with the rank known, or -EINVAL (bad opts), -ETIMEDOUT /
 * -ECONNREFUSED (no scheduler in time), -ECANCELED (*cancel was set),
 * EMB_EAUTH (wrong token), EMB_ENOHELLO (the scheduler wants a token),
 * EMB_ECLUSTER (scheduler refused: cluster full), -ENOMEM, or another transport
 * error.
 */
int emb_node_create(const struct emb_node_opts *opts, struct emb_node **out);

/*
 * A member of a cluster without a scheduler, as Paddle's environment
 * describes one: the servers are listed (servers[0..nservers), rank
 * order) and each trainer knows its rank. No thread, no connection: the
 * map is the contiguous one a client computes from the list, nobody is
 * ever declared dead, finish has no one to tell (0), and barriers are the
 * caller's (emb_node_barrier() returns EMB_ENOSCHED; see
 * emb_node_barrier_gen()). 0 and *out, or -EINVAL (rank >= nworkers, no
 * servers, a host too long), -ENOMEM.
 */
int emb_node_create_static(uint32_t role, uint32_t rank, uint32_t nworkers,
			   const struct emb_wire_node_addr *servers,
			   uint32_t nservers, struct emb_node **out);

struct emb_coord;

/* The coordinator of a node whose job lives in etcd, else NULL; valid
 * until destroy (its map and map watcher: cluster/coord.h). */
struct emb_coord *emb_node_coord(const struct emb_node *n);

/* True for a node made by emb_node_create_static(). */
bool emb_node_is_static(const struct emb_node *n);

/*
 * Static nodes: the generation of barrier name this node enters now, from
 * 1 on (it counts its own entries per name). 0 and *gen, or -EINVAL (name
 * empty or over 63 bytes), -ENOMEM (more than 64 names).
 */
int emb_node_barrier_gen(struct emb_node *n, const char *name, uint64_t *gen);

/* Stops the agent and closes the link; NULL is a no-op. */
void emb_node_destroy(struct emb_node *n);

/*
 * Waits until every node has joined and the scheduler sent the cluster
 * map. 0, or -ETIMEDOUT (not within join_timeout_ms), EMB_ENOSCHED,
 * EMB_ENODEAD (a node died before the cluster formed), EMB_EBADFRAME.
 */
int emb_node_wait_map(struct emb_node *n);

uint32_t emb_node_role(const struct emb_node *n);
uint32_t emb_node_rank(const struct emb_node *n);
uint32_t emb_node_nservers(const struct emb_node *n);
/* After emb_node_wait_map(): copies of each slot (1 unless replicated;
 * docs/replication.md). */
uint32_t emb_node_replicas(const struct emb_node *n);
/* After emb_node_wait_map(): whether the node follows a whole map
 * (emb_node_cmap()) that the scheduler moves: a replicated job, or one
 * servers may join (docs/replication.md, "Moving slots"); or a replicated
 * job in etcd, whose map its servers write (docs/coordinator.md). */
bool emb_node_mapped(struct emb_node *n);
uint32_t emb_node_nworkers(const struct emb_node *n);

/*
 * After emb_node_wait_map(): the slot -> server rank map (EMB_NSLOTS
 * entries) and the servers' addresses by rank; valid until destroy.
 */
const uint16_t *emb_node_slot_map(const struct emb_node *n);
const struct emb_wire_node_addr *emb_node_servers(const struct emb_node *n);

/*
 * Calls fn(arg, role, rank) for every node already declared dead, on this
 * thread, then for each later death on the agent thread. One watcher per
 * node; fn NULL removes it (a callback already running may still finish).
 */
void emb_node_watch(struct emb_node *n, emb_node_dead_fn fn, void *arg);

/*
 * Replicated jobs, with a scheduler or in etcd: fn(arg, map, servers, n)
 * once now with the latest map (if the node has one, on this thread), then
 * on the agent thread for every newer one. One watcher; fn NULL removes
 * it.
 */
void emb_node_watch_map(struct emb_node *n, emb_node_map_fn fn, void *arg);

/* A copy of the latest replicated map in *out: 0, or -ENOENT (none). */
int emb_node_cmap(struct emb_node *n, struct emb_cmap *out);

/*
 * Asks the scheduler for the map now rather than at the next heartbeat
 * (a server said the caller's map is out of date); in etcd, has the
 * coordinator poll now (emb_coord_poll_now()). Any thread, no wait.
 */
void emb_node_map_refresh(struct emb_node *n);

/*
 * Servers: tells the scheduler that the chunk [first, first + nslots)
 * whose fill began at epoch was streamed (status 0) or not (the error),
 * with the rows it sent and their bytes (what `embstore stat` shows of a
 * move). 0, or the scheduler's refusal (EMB_ECLUSTER: no such fill under
 * way), EMB_ENOSCHED.
 */
int emb_node_fill_done(struct emb_node *n, uint32_t first, uint32_t nslots,
		       uint64_t epoch, int status, uint64_t rows,
		       uint64_t bytes);

/*
 * Workers: blocks until every worker reached the barrier called name. 0,
 * or -EINVAL (name empty or over 63 bytes), EMB_ENODEAD (a node died),
 * EMB_ENOSCHED (scheduler lost), EMB_ECLUSTER (not a worker).
 */
int emb_node_barrier(struct emb_node *n, const char *name);

/*
 * Workers: tells the scheduler this worker is done; once all are, the
 * servers stop and the scheduler exits. Later scheduler loss is no error.
 * 0, or EMB_ENOSCHED, EMB_ENODEAD, EMB_ECLUSTER (not a worker).
 */
int emb_node_finish(struct emb_node *n);

#endif
