/*
 * src/cluster/coord.h - the coordinator on etcd: what the scheduler does
 * for a cluster (ranks, the cluster map, deaths, barriers, the end of the
 * job), kept in etcd instead, so that no process of the job is a single
 * point of failure (docs/coordinator.md has the keys and the reasons).
 * The node agent (node.h) runs one of these when given a coordinator
 * address; callers keep using the emb_node_* calls.
 *
 * Every key of a job lives under /embstore/<job>/. Each node holds one
 * lease, renewed by its agent thread every TTL / 3; its rank key is
 * attached to it, so a node whose lease expires (a crash, a freeze, a
 * partition longer than the TTL) is dead to every other node. The agent
 * also polls the job's keys every TTL / 5 for deaths, the map's epoch
 * and the end of the job. When a server's lease expires, the live server
 * of lowest rank computes the failover map (emb_cmap_remove(), map.h) and
 * writes it by compare-and-swap on the map key; every node reads each
 * new epoch.
 *
 * Functions may be called from any thread, except emb_coord_destroy(),
 * which needs every other call finished.
 */
#ifndef EMB_CLUSTER_COORD_H
#define EMB_CLUSTER_COORD_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/hash.h"
#include "proto/wire_cluster.h"

#define EMB_COORD_JOB_MAX     64u /* bytes of a job name */
#define EMB_COORD_JOB_DEFAULT "embstore"

struct emb_coord;

struct emb_cmap;

/* As emb_node_dead_fn and emb_node_end_fn (node.h). */
typedef void (*emb_coord_dead_fn)(void *arg, uint32_t role, uint32_t rank);
typedef void (*emb_coord_end_fn)(void *arg, int status);
/* A new map epoch; m is valid for the call only. */
typedef void (*emb_coord_map_fn)(void *arg, const struct emb_cmap *m);

/* Where emb_coord_opts.hook is called. */
enum emb_coord_hook {
	EMB_COORD_GRANTED, /* a lease granted, nothing on it yet */
	EMB_COORD_CLAIMED, /* joining: the rank claimed, the lease not yet
			      renewed (its thread not started) */
};

struct emb_coord_opts {
	const char *endpoints;	  /* "etcd://h:p[,h:p...]"; copied */
	const char *job;	  /* job name: [A-Za-z0-9._-], 1..64 bytes;
				     NULL = "embstore" */
	uint32_t role;		  /* EMB_ROLE_SERVER or EMB_ROLE_WORKER */
	const char *host;	  /* server: address to advertise; NULL, ""
				     or a wildcard = the one etcd sees */
	uint16_t port;		  /* server: its bound listen port */
	uint32_t server_num;	  /* servers of the job; 0 = the job's */
	uint32_t server_max;	  /* ranks servers may hold (> server_num:
				     servers join and drain while the job
				     runs); 0 = the job's (server_num if
				     first) */
	uint32_t worker_num;	  /* workers of the job; 0 = the job's */
	uint32_t replicas;	  /* copies of each slot, 1..8 and <= the
				     servers; 0 = the job's (1 if first) */
	uint32_t ttl_ms;	  /* lease TTL (rounded up to seconds); the
				     job's first node sets it; 0 = 10 s */
	uint32_t join_timeout_ms; /* waits for the job's config and its
				     members; 0 = 300 s */
	emb_coord_end_fn on_end;  /* optional: job over for this node */
	void *arg;		  /* passed to on_end */
	const volatile sig_atomic_t *cancel; /* optional: stops the waits */
	/* Tests: called at each point of enum emb_coord_hook, on the
	 * thread that reaches it (a test stalls the node there, past its
	 * lease, as a starved process would). NULL in a real node. */
	void (*hook)(void *arg, enum emb_coord_hook where);
	void *hook_arg;
};

/*
 * Joins the job: checks or writes the job's config (counts, TTL, copies;
 * waiting for etcd to answer within join_timeout_ms), takes a lease,
 * claims the lowest free rank of its role by a transaction, and starts
 * the agent thread. 0 and *out, or -EINVAL (bad opts or job name),
 * -ETIMEDOUT (no counts given and none in etcd in time), -ECANCELED,
 * EMB_ECLUSTER (counts differ from the job's, every rank taken, or the job
 * formed already), EMB_ENOETCD (no etcd within the join timeout),
 * EMB_EETCD, -ENOMEM.
 */
int emb_coord_create(const struct emb_coord_opts *opts, struct emb_coord **out);

/*
 * Stops the agent and revokes the lease, which removes this node's rank
 * key: a worker that finished first leaves as finished, any other node
 * as dead. NULL is a no-op.
 */
void emb_coord_destroy(struct emb_coord *c);

/* The node's place: role, rank, counts, TTL (reg.node_id is rank + 1). */
const struct emb_wire_register_resp *emb_coord_reg(const struct emb_coord *c);

/*
 * Waits until every rank of the job is taken, then reads the map (the
 * first node to see the job complete writes epoch 1 with a transaction).
 * Fills slot_map (EMB_NSLOTS) and *servers (by rank; the caller frees).
 * 0, or -ETIMEDOUT, -ECANCELED, EMB_ENODEAD (a member died first),
 * EMB_ENOETCD (etcd lost: a request etcd does not answer in time is tried
 * again until the lease thread gives up on it), EMB_EETCD, EMB_EBADFRAME
 * (a map that does not decode), -ENOMEM.
 */
int emb_coord_wait_map(struct emb_coord *c, uint16_t *slot_map,
		       struct emb_wire_node_addr **servers);

/* The epoch of the newest map read; 0 before. */
uint64_t emb_coord_epoch(struct emb_coord *c);

/*
 * Copies the newest map into *out: 0, or EMB_ECLUSTER before the first.
 * Any thread.
 */
int emb_coord_map(struct emb_coord *c, struct emb_cmap *out);

/*
 * Calls fn(arg, map) with the newest map, if there is one, on this thread,
 * then on the agent thread for each newer epoch. One watcher; fn NULL
 * removes it (a callback already running may still finish).
 */
void emb_coord_watch_map(struct emb_coord *c, emb_coord_map_fn fn, void *arg);

/*
 * The servers' addresses by rank, as written with the first map and
 * changed by each newcomer that took a dead rank (the caller frees
 * *servers). A request etcd does not answer in time is tried
 * again, as for emb_coord_wait_map(). 0, or EMB_ENOETCD, EMB_EETCD,
 * EMB_EBADFRAME (no list, or one that does not parse), -ECANCELED,
 * -ENOMEM.
 */
int emb_coord_servers(struct emb_coord *c, struct emb_wire_node_addr **servers);

/*
 * Asks the agent to poll the job now rather than at its next turn (a
 * server said a write's epoch is not the one it knows): a newer map
 * reaches the watcher within milliseconds. Polls asked for come at most
 * every 20 ms. Any thread, no wait; NULL is a no-op.
 */
void emb_coord_poll_now(struct emb_coord *c);

/*
 * A server of a job with copies streamed slots [first, first + n), the
 * chunk the map of epoch asked it for, to the server being filled (status
 * 0, with the rows it sent and their bytes) or failed to (an error): puts
 * the job's fill_done key, which the
 * leader's next poll turns into the next map (docs/coordinator.md). 0, or
 * EMB_ECLUSTER (not a server, one copy), EMB_ENOETCD, EMB_EETCD, -ENOMEM.
 */
int emb_coord_fill_done(struct emb_coord *c, uint32_t first, uint32_t n,
			uint64_t epoch, int status, uint64_t rows,
			uint64_t bytes);

/*
 * Whether the job's nodes follow its whole map (emb_coord_watch_map()):
 * with copies, or with ranks to spare (servers_max), whose joins and
 * drains move slots. Any thread.
 */
bool emb_coord_mapped(const struct emb_coord *c);

/*
 * Whether server rank's key was there at the agent's last poll (a server
 * drained out of the map stays a TTL, answering; one never seen yet, or
 * before the first poll, is not live). Any thread.
 */
bool emb_coord_server_live(struct emb_coord *c, uint32_t rank);

/*
 * A server asks to leave (SIGTERM, docs/coordinator.md "Joins and
 * drains"): puts drain/<rank>, which the leader turns into moves of its
 * slots to the others; once it holds none it stays one TTL, then its job
 * ends (status 0, on_end) and its rank is recorded as left, not dead. 0
 * (asked, or asked before), or EMB_ECLUSTER with why (cap bytes) filled:
 * not a server, the job not formed, not mapped, or too few servers would
 * stay for the copies; EMB_ENOETCD, EMB_EETCD.
 */
int emb_coord_drain(struct emb_coord *c, char *why, size_t cap);

/* As emb_node_watch(). */
void emb_coord_watch(struct emb_coord *c, emb_coord_dead_fn fn, void *arg);

/*
 * Workers: waits until every worker entered barrier name as often as this
 * one. 0, or -EINVAL (name empty or over 63 bytes), EMB_ENODEAD (a node
 * died), EMB_ENOETCD (etcd lost, as for emb_coord_wait_map()),
 * EMB_ECLUSTER (not a worker), -ECANCELED, -ENOMEM.
 */
int emb_coord_barrier(struct emb_coord *c, const char *name);

/*
 * Workers: records that this worker is done; once every worker finished
 * or died, the servers end (status 0). 0, or EMB_ENOETCD (etcd lost, as
 * for emb_coord_wait_map()), EMB_EETCD, EMB_ECLUSTER (not a worker),
 * -ECANCELED.
 */
int emb_coord_finish(struct emb_coord *c);

/*
 * For launchers and observers, without joining: whether the job's map
 * exists (1) or not (0), and deleting every key of the job. Negative on
 * errors as above.
 */
int emb_coord_job_formed(const char *endpoints, const char *job);
int emb_coord_job_delete(const char *endpoints, const char *job);

/*
 * For `embstore scale --coordinator`: server rank of the job drains, as
 * emb_coord_drain() asks it; the same refusals with why filled, and
 * EMB_EBADARG for a rank the job has no live server at.
 */
int emb_coord_job_drain(const char *endpoints, const char *job, uint32_t rank,
			char *why, size_t cap);

/*
 * For `embstore scale --coordinator --add`: the job's server ranks (its
 * servers_max) and the ones free for a newcomer (*free: no live server,
 * nothing held). 0, EMB_ECLUSTER (not formed), or an etcd error.
 */
int emb_coord_job_free_ranks(const char *endpoints, const char *job,
			     uint32_t *ranks, uint32_t *free);

/*
 * For observers (`embstore stat --coordinator`), without joining: the
 * job's server list (*servers, malloc'd, by rank as the servers key has
 * it), which ranks not to dial (*removed, malloc'd, one per rank: no live
 * server, or out of the map) and its map *m. 0, EMB_ECLUSTER (no such
 * job, or not formed), EMB_EBADFRAME (a map that does not decode, or a
 * server list or map of another size than the job's ranks), or an etcd
 * error.
 */
int emb_coord_job_observe(const char *endpoints, const char *job,
			  char **servers, bool **removed, struct emb_cmap *m);

/*
 * For observers: the drain, join or recovery under way in the job, as a
 * scheduler's MOVES answers it (proto/wire_cluster.h), from the keys the
 * leader keeps: the move key (what, since when, how many slots it had
 * to move), the fill key (the chunk and its phase) and the map (what is
 * left). elapsed_ms is counted with the leader's and the caller's wall
 * clocks. 0 and *out, or errors as emb_coord_job_observe().
 */
int emb_coord_job_moves(const char *endpoints, const char *job,
			struct emb_wire_moves *out);

/*
 * The same, asked by a server of its own job over its own etcd handle,
 * for its /metrics: 1 and *out when this server leads the job (the live
 * server of lowest rank at the agent's last poll, which steps the moves),
 * so that one node of the job answers for its moves; 0 when it does not
 * lead (*out untouched); or an error as emb_coord_job_moves(). Any thread.
 * Reads the job's keys at most once between two of the agent's polls
 * (later calls reuse that read, with the elapsed time and ETA of now, or
 * return its error): a scraper in a loop cannot keep the agent's handle
 * busy, even while etcd does not answer.
 */
int emb_coord_moves(struct emb_coord *c, struct emb_wire_moves *out);

/* True if s is "etcd://..." (the only coordinator besides a scheduler). */
bool emb_coord_is_etcd(const char *s);

#endif
