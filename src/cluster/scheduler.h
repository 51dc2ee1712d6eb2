/*
 * src/cluster/scheduler.h - the embstore scheduler: servers and workers register
 * with it, get ranks, wait for the cluster map, ping it, meet at barriers
 * and finish through it (docs/cluster.md). The daemon runs it for
 * `embstore-server --role scheduler`; tests run it in their own process.
 *
 * With a token, every connection must open with HELLO carrying it before
 * any cluster request (REGISTER included): anything else is refused and
 * the connection closed, so a peer without the token takes no rank.
 *
 * A scheduler runs one event loop in a thread of its own; every node's
 * state lives on that thread. create/wait/destroy are called from one
 * controlling thread; emb_sched_port() from any.
 */
#ifndef EMB_CLUSTER_SCHEDULER_H
#define EMB_CLUSTER_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

struct emb_sched;

/*
 * How long a restarted scheduler waits for the nodes of the job it rebuilt
 * to rejoin before it declares the missing ones dead: the longer of this
 * and twice the heartbeat timeout.
 */
#define EMB_SCHED_REJOIN_MS 10000u

struct emb_sched_opts {
	const char *host;	/* listen address; copied */
	uint16_t port;		/* 0 picks a free port */
	uint32_t server_num;	/* servers to wait for, 1..4096 */
	uint32_t worker_num;	/* workers to wait for, 1..65536 */
	/* Silence that makes a node suspect, >= 1 ms: the least; a node
	 * whose heartbeats jitter gets more (cluster/detector.h), and a
	 * suspect server is probed before it is declared dead. */
	uint32_t hb_timeout_ms;
	/* Copies of each slot, 1..8 and <= server_num; 0 is 1. With more
	 * than one, a server death the others cover is no failure: the map
	 * drops the dead server (docs/replication.md) and the job goes on. */
	uint32_t replicas;
	/* Ranks servers may ever hold, server_num..4096; 0 is server_num.
	 * With more (and at most 7 replicas), the job forms with server_num
	 * and a server that registers later takes a free rank and is given
	 * its share of the slots (docs/replication.md, "Moving slots"); the
	 * whole map then goes to every node, even with one copy. */
	uint32_t server_max;
	/* Required in the HELLO every connection starts with, or NULL: then
	 * HELLO is optional. Copied. */
	const uint8_t *auth_token;
	uint32_t auth_token_len; /* bytes, <= 256 */
	/* Runs on the scheduler's thread once the job is over: status 0
	 * when every worker finished, EMB_ENODEAD when a node died on the
	 * way. Optional. */
	void (*on_done)(void *arg, int status);
	void *arg; /* passed to on_done */
	/* The state file (cluster/sched_state.h), or NULL: none. Copied.
	 * Written at each change of the formed job; a scheduler started on
	 * an existing one takes the job up where it was, and its nodes
	 * rejoin (docs/cluster.md, "When the scheduler restarts"). Removed
	 * once the job is over. */
	const char *state_file;
};

#define EMB_SCHED_OPTS_DEFAULT                                                 \
	((struct emb_sched_opts){.host = "127.0.0.1",                          \
				 .port = 7165,                                 \
				 .server_num = 1,                              \
				 .worker_num = 1,                              \
				 .hb_timeout_ms = 10000})

/*
 * Binds and starts serving in its own thread. With a state file that
 * exists, rebuilds the job it holds first: its nodes have a rejoin window
 * (EMB_SCHED_REJOIN_MS) to come back before they are declared dead. 0 and
 * *out, or -EINVAL (bad opts, a token over 256 bytes, a state file whose
 * counts or replicas are not these opts'), EMB_ESCHEDSTATE (a damaged
 * state file), -EADDRINUSE, -ENOMEM, or another negative errno.
 */
int emb_sched_create(const struct emb_sched_opts *opts, struct emb_sched **out);

/* The bound port (after port 0). */
uint16_t emb_sched_port(const struct emb_sched *s);

/*
 * Waits up to timeout_ms (-1 = forever) for the job to end: every worker
 * finished or died, then every server acknowledged the end or died. 0 when
 * every worker finished and no node died, EMB_ENODEAD when one did, or
 * -ETIMEDOUT if the job is still running.
 */
int emb_sched_wait(struct emb_sched *s, int timeout_ms);

/* Stops the loop, closes every connection, frees; NULL is a no-op. */
void emb_sched_destroy(struct emb_sched *s);

/* The cluster as the scheduler sees it; a copy taken by emb_sched_stats(). */
struct emb_sched_stats {
	uint32_t state;		     /* enum emb_cluster_state; 0 once over */
	uint32_t expected[2];	     /* [0] servers, [1] workers to wait for */
	uint32_t alive[2];	     /* registered, not finished, not dead */
	uint32_t finished[2];	     /* finished (servers: acknowledged) */
	uint32_t dead[2];	     /* declared dead */
	uint32_t barrier_waiting;    /* workers held at a barrier now */
	uint64_t barriers_completed; /* barriers every worker passed */
	uint64_t heartbeats;	     /* heartbeats answered */
	uint64_t map_epoch;	     /* 0 until the cluster formed, then 1,
					+1 per server dropped from the map */
	uint32_t replicas;	     /* copies of each slot */
	uint32_t lost_slots;	     /* slots with no live holder */
	uint32_t filling;	     /* rank being filled (recovery), or
					UINT32_MAX */
	uint64_t recoveries;	     /* servers that became full replicas */
	uint32_t moving_from;	     /* a move under way: its source rank
					(filling is its target), or
					UINT32_MAX */
	uint32_t draining;	     /* servers being drained now */
	uint32_t joining;	     /* servers being given their share */
	uint64_t slots_moved;	     /* slots moved, since the start */
	uint32_t move_slots_left;    /* the drain or join under way: slots
					still to move (its chunk included),
					0 when none */
	int64_t move_eta_ms;	     /* its time left at its rate so far,
					or -1 (none, or no chunk done) */
	uint64_t move_rows;	     /* rows streamed for it so far */
	uint64_t move_bytes;	     /* their bytes */
	uint64_t rows_streamed;	     /* rows servers streamed to each
					other (moves and recoveries),
					since the start */
	uint64_t bytes_streamed;     /* their bytes */
	uint64_t drains;	     /* servers drained and gone */
	uint64_t joins;		     /* servers given their share */
	uint64_t probes;	     /* probes of silent servers started */
	uint64_t probes_answered;    /* ... that the server answered: it
					lived, only its heartbeats were late */
	uint64_t blind_ms;	     /* time the scheduler's own loop was
					not running, ms (not counted as any
					node's silence) */
	uint64_t stall_max_ms;	     /* the longest such stall, ms */
	uint64_t self_suspicions;    /* times so many nodes were silent at
					once that it suspected itself */
	bool self_suspect;	     /* it does now: no silence counts */
};

/*
 * Copies the scheduler's latest view into *out. Any thread; the view is
 * refreshed after each turn of the scheduler's loop (at most 200 ms old).
 */
void emb_sched_stats(struct emb_sched *s, struct emb_sched_stats *out);

/*
 * Slots server rank holds in the latest published map: out[0] as primary,
 * out[1] as backup, out[2] being filled with (recovery). False before the
 * map is made or for a rank out of range. Any thread.
 */
bool emb_sched_server_slots(struct emb_sched *s, uint32_t rank,
			    uint32_t out[3]);

struct emb_metrics_out;

/*
 * The scheduler's /metrics collector for emb_metrics_create() (metrics/
 * metrics.h); arg is the struct emb_sched *, which must outlive the
 * endpoint (NULL: build and process metrics only).
 */
void emb_sched_metrics_collect(void *arg, struct emb_metrics_out *o);

/*
 * The gauges of the drain or join under way (docs/operations.md,
 * "Metrics"), as the scheduler's /metrics shows them and, for a job kept
 * in etcd, its leading server's: slots still to move (0 when none), the
 * time that needs at the rate so far (eta_ms, -1 when unknown), and the
 * rows and bytes streamed for it so far.
 */
void emb_cluster_metrics_move(struct emb_metrics_out *o, uint32_t slots_left,
			      int64_t eta_ms, uint64_t rows, uint64_t bytes);

#endif
