/*
 * src/server/role.h - the server role of embstore-server: a server with
 * its /metrics and /healthz, its checkpoints, its place in a cluster and,
 * in a replicated job, its replication control, started in that order and
 * stopped in the reverse. The daemon parses flags into the options, calls
 * start and join, waits for a signal or the job's end, and calls stop; the
 * functions log what they do and why they fail (docs/operations.md).
 *
 * Every call here is for one controlling thread.
 */
#ifndef EMB_SERVER_ROLE_H
#define EMB_SERVER_ROLE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/node.h"
#include "server/checkpoint.h"
#include "server/server.h"

struct emb_server_role;

struct emb_server_role_opts {
	struct emb_server_opts server;	   /* as for emb_server_create(); the
					      role sets on_start to load
					      ckpt.dir */
	const char *metrics_addr;	   /* serve /metrics and /healthz there,
					      or NULL */
	struct emb_ckpt_opts ckpt;	   /* ckpt.dir NULL: no checkpoints */
	bool ckpt_start_empty;		   /* start empty when every
					      checkpoint is damaged
					      (emb_ckpt_load()) */
	const struct emb_cluster_env *env; /* the cluster (sched_host or
					      coordinator set: join it);
					      borrowed until stop */
	emb_node_end_fn on_end;		   /* the job ended (node agent
					      thread) */
	volatile sig_atomic_t *cancel;	   /* non-zero: a signal came; joining
					      gives up, /healthz says stopping */
};

/*
 * Creates the server (loading the newest checkpoint before it listens),
 * serves /metrics and starts the checkpoint thread. 0 and *out, or a
 * negative code after logging why; nothing is left running then.
 */
int emb_server_role_start(const struct emb_server_role_opts *o,
			  struct emb_server_role **out);

/*
 * In a cluster (o->env names a scheduler or a coordinator): registers
 * with it (blocks until the cluster forms, o->cancel or the join timeout)
 * and, in a replicated job with a scheduler, follows its map. 0 (also
 * outside a cluster, and when *o->cancel cut the join short), or a
 * negative code: the daemon should stop at once (emb_server_role_stop()
 * then still stops cleanly).
 */
int emb_server_role_join(struct emb_server_role *r);

/*
 * Stops serving (requests in flight get up to 10 s), writes the final
 * checkpoint, and frees everything. 0, or the final checkpoint's error
 * (logged: the updates since the last checkpoint are lost). NULL: 0.
 */
int emb_server_role_stop(struct emb_server_role *r);

/*
 * Asks the scheduler to drain this server (docs/replication.md, "Moving
 * slots"): what SIGTERM does to a server of a running replicated job with
 * servers to spare. 0 once queued: the node agent's end callback runs
 * when it holds no slot. -ENOTSUP outside a scheduler's job; else the
 * scheduler's refusal, its reason logged.
 */
int emb_server_role_drain(struct emb_server_role *r);

/* Frees everything at once, without the final checkpoint: after a failed
 * join. NULL is a no-op. */
void emb_server_role_destroy(struct emb_server_role *r);

/*
 * The default of emb_server_opts.mem_limit for a daemon: 5/8 of physical
 * memory, or of the cgroup's limit when that is lower, so that tables,
 * connection buffers (a quarter of it) and the process itself fit. 0 when
 * neither can be read.
 */
uint64_t emb_server_default_mem_limit(void);

#endif
