/*
 * src/cluster/scheduler.c - the scheduler role (docs/cluster.md): ranks, the
 * cluster map, liveness, barriers and the end of the job.
 *
 * Everything runs on the scheduler's one loop thread: the request handler,
 * the close callback and the timer that declares silent nodes dead. The
 * transport only lets a scheduler answer requests, so whatever it must
 * tell a node later is held as an unanswered request (CLUSTER_MAP until
 * every node joined, BARRIER until every worker arrived) or rides on the
 * next heartbeat response (deaths, the end of the job, the map's epoch).
 * Nodes are few and messages rare: linear scans keep it plain.
 *
 * Recovery (docs/replication.md): with replicas, a server that registers
 * while some server is dead takes the dead rank and is filled with its
 * slots chunk by chunk. Each step is a new map epoch that nodes learn
 * from their heartbeats; the chunk's source tells when it streamed the
 * chunk (FILL_DONE), and the last step rebalances the primaries.
 *
 * Moves (docs/replication.md, "Moving slots"): a server asked to drain
 * (DRAIN, from `embstore scale`) has its slots moved chunk by chunk to
 * the least loaded others with the same fill, then leaves: its rank is
 * listed with the dead, and a newcomer may take it later and be given a
 * fair share of slots the same way. One fill or move at a time.
 *
 * Restarts (docs/cluster.md, "When the scheduler restarts"): with a state
 * file, each change of the formed job is written to it before any node
 * can learn of it, and a scheduler started on the file takes the job up:
 * its nodes rejoin their ranks, and those that do not within the rejoin
 * window are declared dead like any silent node.
 */
#include "cluster/scheduler.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cluster/sched_state.h"
#include "common/authlimit.h"
#include "common/clock.h"
#include "cluster/detector.h"
#include "cluster/map.h"
#include "cluster/probe.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "proto/wire_cluster.h"
#include "proto/wire_msg.h"
#include "metrics/metrics.h"
#include "transport/transport.h"

#define NO_FILL UINT32_MAX
/* Slots per recovery chunk: writes to a chunk wait while it streams, so
 * it stays small; 4096 / 256 = 16 chunks for a whole server at most. */
#define FILL_CHUNK_SLOTS 256u
/* A chunk whose source says nothing for this long is filled again. */
#define FILL_TIMEOUT_MS 60000
/* Failed streams of a recovery before it is given up. */
#define FILL_TRIES 8u
/* Heartbeat timeouts a connected worker may be silent. A worker serves
 * nothing a probe could ask, and its death ends the job: a late verdict
 * on a frozen one costs time, a false one on a starved one (a loaded
 * machine) costs the job. */
#define WORKER_SILENT_FACTOR 10
/* Probes of suspect servers under way at once; more suspects wait. */
#define PROBES_MAX 16u
/* A turn's overrun below this is the loop's own work, not a stall: left
 * uncounted, so that an idle loop's clock does not drift. */
#define STALL_MIN_MS 5
/*
 * Self-suspicion (docs/cluster.md, "When the scheduler is the slow one"):
 * when at least SELF_MIN nodes, and one in SELF_DIV of those it follows,
 * are overdue at once (silent past half the heartbeat timeout, where a
 * live node is heard every fifth of it), the scheduler takes itself for
 * the slow party: independent failures do not silence a quarter of a job
 * together, while a scheduler starved of CPU, or behind on full socket
 * queues, hears nobody. Meanwhile no silence counts and no verdict or
 * probe starts; after SELF_MAX_FACTOR heartbeat timeouts of it without
 * relief the silence is taken as real (a partition), and the usual rules
 * (a probe for each server) resume.
 */
#define SELF_MIN 3u
#define SELF_DIV 4u
#define SELF_MAX_FACTOR 3
/* After the job's end, the longest the scheduler waits for its nodes to
 * close their conns before it closes them (lingered()). */
#define LINGER_MS 2000

struct node {
	uint32_t role; /* EMB_ROLE_SERVER or _WORKER; 0 = free */
	uint32_t rank; /* within the role */
	uint32_t pid;  /* as registered, for logs */
	struct emb_wire_node_addr addr; /* servers: where workers connect */
	char peer[64];			/* "addr:port" it registered from */
	struct emb_conn *conn;		/* the conn it registered on */
	int64_t last_ms;		/* last request from it, monotonic */
	/* Liveness (docs/replication.md#failure-detection), loop thread:
	 * the detector of the connection it follows, on the look clock. */
	struct emb_detector fd;
	const struct emb_conn *fd_conn; /* conn fd was started for */
	uint32_t fd_gen;		/* +1 per start: stale probes */
	bool probing;			/* a probe of it is under way */
	/* Server of a formed replicated job whose conn closed: look-clock
	 * time of the close (0: none). It is dead once a probe goes
	 * unanswered, or when it has not rejoined in the rejoin window. */
	int64_t closed_ms;
	bool dead;			/* declared dead (or left) */
	bool left;			/* server: drained, then gone */
	bool draining;			/* server: its slots move away */
	int64_t empty_ms;		/* draining server: it first held no
					   slot (monotonic), 0 = not yet */
	bool joining;			/* server: given its share of slots */
	bool finished;		     /* worker: FINISH; server: acknowledged */
	struct emb_req *map_req;     /* CLUSTER_MAP held until ready, or a
					server's watch until the map changes */
	struct emb_req *barrier_req; /* BARRIER held until all arrive */
	struct emb_req *finish_req;  /* server: FINISH held until the job
					finishes (a hold) */
	char barrier[EMB_WIRE_BARRIER_NAME_MAX + 1]; /* its name */
};

struct emb_sched {
	struct emb_transport *tr;	  /* the loop */
	struct emb_listener *lis;	  /* accepts nodes */
	pthread_t thread;		  /* runs the loop */
	bool running;			  /* thread started */
	/* Copy; host points at host. o.server_num is the ranks servers may
	 * hold (server_max when given): start of them form the job, the
	 * others are free for servers that join later. */
	struct emb_sched_opts o;
	uint32_t start;			  /* servers the job forms with */
	char host[EMB_WIRE_HOST_MAX + 1]; /* listen address */
	uint64_t cluster_id;		  /* random per run */
	uint8_t token[EMB_WIRE_TOKEN_MAX]; /* required in HELLO */
	uint32_t token_len;		  /* 0: HELLO optional */
	struct emb_authlimit *authlimit;  /* failed HELLOs per address */

	/* Loop thread only. Node id i + 1 names nodes[i]: servers take
	 * 0..S-1, workers S..S+W-1, so an id says the role and rank. */
	struct node *nodes;		/* server_num + worker_num */
	uint32_t nservers;		/* servers registered */
	uint32_t nworkers;		/* workers registered */
	uint32_t state;			/* enum emb_cluster_state */
	struct emb_wire_node_ref *dead; /* in order of death */
	uint32_t ndead;			/* entries in dead */
	uint32_t dead_cap;		/* room in dead: a replaced rank may
					   die again */
	/* Deaths the job cannot go on without: a worker, or a server whose
	 * slots lost their last holder (every server when unreplicated). */
	uint32_t nfatal;
	struct emb_cmap *cmap;		/* the map, once formed */
	struct map_frame *map;		/* CLUSTER_MAP response, once ready */
	/* Recovery, loop thread: the rank being filled (NO_FILL: none),
	 * its chunk under way and the epoch that began it. */
	uint32_t fill_rank;
	uint32_t fill_first, fill_n;
	uint64_t fill_epoch;
	int64_t fill_chunk_ms; /* the chunk began, monotonic */
	int64_t fill_ms;       /* the recovery began */
	uint64_t fill_rows;    /* rows its sources streamed so far */
	uint64_t fill_bytes;   /* ... and their bytes */
	uint32_t fill_chunks;  /* chunks streamed so far */
	/* A move under way (fill_rank its target): the server whose place
	 * the target takes in the chunk's slots, else NO_FILL (a
	 * recovery's fill, or nothing). */
	uint32_t move_from;
	/* The move under way is in its copy ahead (warm[]): its source's
	 * FILL_DONE fences the chunk for the final stream. */
	bool warming;
	/* ... and began after a restart lifted its chunk's fence: a report
	 * from before (the lifted stream's, which a copy ahead's leniency
	 * would take for this copy's) is refused, and its source copies
	 * again (src/server/replica.c). */
	bool warm_fresh;
	uint32_t move_first;   /* where the next move's search starts */
	uint32_t move_chunks;  /* chunks moved for the drain or join */
	uint32_t move_slots;   /* ... and their slots */
	uint32_t move_left;    /* slots it has still to move, the chunk
				  under way included (move_progress()) */
	int64_t move_ms;       /* the drain or join began, monotonic */
	uint64_t move_rows;    /* rows its sources streamed so far (copies
				  ahead and fenced streams) */
	uint64_t move_bytes;   /* ... and their bytes */
	uint64_t streamed_rows;	 /* rows streamed, moves and recoveries,
				    since the start */
	uint64_t streamed_bytes; /* ... and their bytes */
	uint64_t moved_slots;  /* slots moved, since the start */
	uint64_t drains;       /* servers drained */
	uint64_t joins;	       /* servers given their share */
	uint32_t fill_fails;   /* streams that failed */
	uint64_t recoveries;   /* servers made full replicas */
	uint32_t replies; /* replies not yet handed to the kernel */
	bool over;	  /* job ended: stop once replies are out */
	int64_t over_ms;  /* ... when, monotonic: the linger's start */

	/* The look clock: monotonic time less the time the loop was not
	 * running (its own stall, or the whole machine's), so that time the
	 * scheduler was not looking never counts as others' silence. */
	int64_t look_last_ms; /* monotonic, when the loop last ran */
	int64_t blind_ms;     /* total time not looking */
	int64_t tick_ms;      /* the loop's poll timeout */
	int64_t stall_max_ms; /* longest stall of the loop */
	/* Self-suspicion: monotonic time it began (0: none) and the time
	 * up to which it is counted as not looking. */
	int64_t self_since_ms;
	int64_t self_last_ms;
	int64_t self_blind_ms;	  /* blind_ms at self_last_ms */
	uint64_t self_episodes;   /* times it began */
	bool self_gave_up;	  /* it lasted past SELF_MAX_FACTOR * T */
	int64_t checked_ms;	  /* monotonic: check_silence() last ran */
	uint32_t nprobing;    /* probes under way (done not yet run) */
	uint64_t probes;	   /* probes started */
	uint64_t probes_answered;  /* ... that the server answered */
	char *state_path;  /* state file, or NULL */
	bool state_failed; /* the last write failed (logged once) */

	uint64_t barriers; /* loop thread: barriers completed */
	uint64_t hbs;	   /* loop thread: heartbeats answered */

	pthread_mutex_t mu; /* guards done, status and view, with cv */
	pthread_cond_t cv;  /* signalled when done */
	struct emb_sched_stats view; /* published by the loop each turn */
	/* Per server rank, the slots it holds as [0] primary, [1] backup,
	 * [2] filling, in the map of epoch slots_epoch (0: none yet); with
	 * view. */
	uint32_t (*slots)[3];
	uint64_t slots_epoch;
	bool stop;	    /* destroy asked the loop to exit */
	bool done;	    /* the job ended */
	int status;	    /* 0, or EMB_ENODEAD */
};

/* A reply in flight; freed when the transport is done with it. */
struct reply {
	struct emb_sched *s;	     /* owner */
	struct emb_conn *close;	     /* closed once the reply is out, or NULL */
	int reason;		     /* why, for the close */
	_Alignas(8) uint8_t frame[]; /* the encoded frame */
};

/* A conn's user before REGISTER, once its HELLO passed. */
static char hello_ok;
#define HELLO_OK ((void *)&hello_ok)

/* The job's whole map goes to every node, and moves it: replicated, or
 * with ranks for servers to join (server_max). */
static bool mapped(const struct emb_sched *s)
{
	return s->cmap && (s->cmap->replicas > 1 || s->o.server_num > s->start);
}

/* The node registered on conn, or NULL. */
static struct node *conn_node(const struct emb_conn *conn)
{
	void *u = emb_conn_user(conn);

	return u == HELLO_OK ? NULL : u;
}

static uint32_t nnodes(const struct emb_sched *s)
{
	return s->o.server_num + s->o.worker_num;
}

static const char *node_addr(const struct node *n, char *buf, size_t cap)
{
	if (n->role == EMB_ROLE_SERVER)
		snprintf(buf, cap, "%s:%u", n->addr.host, n->addr.port);
	else
		snprintf(buf, cap, "%s", n->peer);
	return buf;
}

/* ---- replies -------------------------------------------------------- */

static void reply_sent(void *ctx, int status)
{
	struct reply *r = ctx;

	r->s->replies--;
	/* status != 0: the conn closed already and may be gone. */
	if (r->close && status == 0)
		emb_conn_close(r->close, r->reason);
	free(r);
}

/* Sends a copy of the encoded frame frame[0..len) as the reply to req. */
static void send_frame(struct emb_sched *s, struct emb_req *req,
		       const uint8_t *frame, int len)
{
	struct emb_frame_hdr hdr;
	struct iovec iov;
	struct reply *r;

	r = malloc(sizeof(*r) + (size_t)len);
	if (!r) {
		emb_req_release(req);
		return;
	}
	r->s = s;
	r->close = NULL;
	memcpy(r->frame, frame, (size_t)len);
	memcpy(&hdr, r->frame, sizeof(hdr));
	iov = (struct iovec){r->frame + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	s->replies++;
	/* req is consumed whatever happens; done runs only on success. */
	if (emb_conn_reply(req, &hdr, &iov, iov.iov_len ? 1 : 0, reply_sent,
			   r)) {
		s->replies--;
		free(r);
	}
}

static void send_error(struct emb_sched *s, struct emb_req *req, int status,
		       const char *msg)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX];
	int len = emb_wire_error_encode(buf, sizeof(buf), req->hdr.opcode,
					req->hdr.req_id, 0, status, msg);

	if (len < 0) {
		emb_req_release(req);
		return;
	}
	send_frame(s, req, buf, len);
}

/* Answers req with status, then closes its conn: login failures. */
static void refuse_and_close(struct emb_sched *s, struct emb_req *req,
			     int status, const char *msg)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX];
	struct emb_conn *conn = emb_req_conn(req);
	int len = emb_wire_error_encode(buf, sizeof(buf), req->hdr.opcode,
					req->hdr.req_id, 0, status, msg);
	struct emb_frame_hdr hdr;
	struct iovec iov;
	struct reply *r;

	r = len < 0 ? NULL : malloc(sizeof(*r) + (size_t)len);
	if (!r) {
		emb_req_release(req);
		emb_conn_close(conn, status);
		return;
	}
	r->s = s;
	r->close = conn;
	r->reason = status;
	memcpy(r->frame, buf, (size_t)len);
	memcpy(&hdr, r->frame, sizeof(hdr));
	iov = (struct iovec){r->frame + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	s->replies++;
	if (emb_conn_reply(req, &hdr, &iov, 1, reply_sent, r)) {
		s->replies--;
		free(r);
		emb_conn_close(conn, status);
	}
}

static void send_ack(struct emb_sched *s, struct emb_req *req, uint8_t op,
		     uint32_t count)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE];
	int len = emb_wire_cluster_ack_encode(buf, sizeof(buf), op,
					      req->hdr.req_id, count);

	if (len < 0) {
		emb_req_release(req);
		return;
	}
	send_frame(s, req, buf, len);
}

/* ---- the state file ------------------------------------------------- */

/*
 * Loop thread: writes the formed job to the state file, if there is one.
 * Called before the change it records goes out to any node, so a
 * restarted scheduler never knows less than its nodes were told. A write
 * that fails leaves the job running on (logged once until one works): the
 * file only matters if this scheduler dies.
 */
static void state_save(struct emb_sched *s)
{
	struct emb_sched_state st = {0};
	struct emb_sched_state_node *nodes;
	int rc;

	if (!s->state_path || s->state == EMB_CLUSTER_FORMING || s->over)
		return;
	nodes = calloc(nnodes(s), sizeof(*nodes));
	if (!nodes) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < nnodes(s); i++) {
		const struct node *n = &s->nodes[i];

		nodes[i] = (struct emb_sched_state_node){
		    .role = n->role,
		    .dead = n->dead,
		    .finished = n->finished,
		    .draining = n->draining && !n->dead,
		    .joining = n->joining && !n->dead,
		    .left = n->left && n->dead,
		    .pid = n->pid,
		    .addr = n->addr,
		};
	}
	st.state = s->state;
	st.cluster_id = s->cluster_id;
	st.server_num = s->o.server_num;
	st.worker_num = s->o.worker_num;
	st.replicas = s->o.replicas ? s->o.replicas : 1;
	st.nodes = nodes;
	st.dead = s->dead;
	st.ndead = s->ndead;
	st.cmap = st.replicas > 1 ? s->cmap : NULL;
	st.fill_rank = s->fill_rank;
	st.fill_first = s->fill_first;
	st.fill_n = s->fill_n;
	st.fill_fails = s->fill_fails;
	st.fill_epoch = s->fill_epoch;
	st.move = s->move_from != NO_FILL;
	st.move_from = st.move ? s->move_from : 0;
	/* A newcomer whose first chunk is not chosen yet: nothing under
	 * way to start again. */
	if (st.fill_rank != NO_FILL && (!st.fill_n || !st.fill_epoch))
		st.fill_rank = NO_FILL;
	rc = emb_sched_state_save(s->state_path, &st);
	free(nodes);
out:
	if (rc && !s->state_failed)
		emb_log(EMB_LOG_ERROR,
			"cannot write the state file %s: %s (a restart would "
			"not find this job)",
			s->state_path, emb_strerror(rc));
	else if (!rc && s->state_failed)
		emb_log(EMB_LOG_INFO, "state file %s written again",
			s->state_path);
	s->state_failed = rc != 0;
}

/* ---- the job's course ----------------------------------------------- */

/* The loop ends once the last replies are out (loop_main reports it). */
static void finish_job(struct emb_sched *s)
{
	s->over = true;
	s->over_ms = (int64_t)emb_clock_ms();
	emb_log(EMB_LOG_INFO, "job over: %u node%s died", s->ndead,
		s->ndead == 1 ? "" : "s");
	/* A job that is over is no job to take up: the next start on this
	 * file begins a new one. */
	if (s->state_path && unlink(s->state_path) && errno != ENOENT)
		emb_log(EMB_LOG_WARN, "cannot remove the state file %s: %s",
			s->state_path, strerror(errno));
}

/*
 * The job is finishing: each server's FINISH hold is its finish, taken
 * now, where a server without one learns of the end from its next
 * heartbeat, up to a heartbeat interval later (docs/protocol.md,
 * "Finish hold"). Recorded before the acks, as on_finish() does.
 */
static void answer_holds(struct emb_sched *s)
{
	bool any = false;

	for (uint32_t i = 0; i < s->o.server_num; i++) {
		struct node *n = &s->nodes[i];

		if (!n->finish_req || n->dead)
			continue;
		emb_log(EMB_LOG_INFO, "server %u finished", n->rank);
		n->finished = any = true;
	}
	if (any)
		state_save(s);
	for (uint32_t i = 0; i < s->o.server_num; i++) {
		struct node *n = &s->nodes[i];

		if (!n->finish_req)
			continue;
		if (n->dead)
			send_error(s, n->finish_req, EMB_ENODEAD,
				   "declared dead");
		else
			send_ack(s, n->finish_req, EMB_OP_FINISH, 0);
		n->finish_req = NULL;
	}
}

/*
 * Every worker registered and finished or died: servers holding a FINISH
 * are answered at once, the others learn it from their next heartbeat;
 * once each acknowledged or died, the job is over.
 */
static void check_end(struct emb_sched *s)
{
	uint32_t S = s->o.server_num;

	if (s->over)
		return;
	if (s->state != EMB_CLUSTER_FINISHING) {
		for (uint32_t i = S; i < nnodes(s); i++) {
			const struct node *n = &s->nodes[i];

			if (!n->role || !(n->finished || n->dead))
				return;
		}
		s->state = EMB_CLUSTER_FINISHING;
		emb_log(EMB_LOG_INFO, "all workers done: stopping servers");
		answer_holds(s);
	}
	for (uint32_t i = 0; i < S; i++) {
		const struct node *n = &s->nodes[i];

		if (n->role && !n->finished && !n->dead)
			return;
	}
	finish_job(s);
}

/* The barrier every worker has reached, if any: answer them all. */
static void check_barrier(struct emb_sched *s, const char *name)
{
	uint32_t S = s->o.server_num, W = s->o.worker_num;

	for (uint32_t i = S; i < S + W; i++) {
		const struct node *n = &s->nodes[i];

		if (!n->barrier_req || strcmp(n->barrier, name))
			return;
	}
	emb_log(EMB_LOG_DEBUG, "barrier %s: %u worker%s met", name, W,
		W == 1 ? "" : "s");
	s->barriers++;
	for (uint32_t i = S; i < S + W; i++) {
		struct node *n = &s->nodes[i];
		struct emb_req *req = n->barrier_req;

		n->barrier_req = NULL;
		send_ack(s, req, EMB_OP_BARRIER, W);
	}
}

/*
 * One encoded CLUSTER_MAP response. Replies borrow it until their send
 * completes, and a recovery can publish several maps while replies with
 * an older one still wait in a send queue: a reference each, the
 * scheduler's own included.
 */
struct map_frame {
	unsigned refs; /* atomic: the scheduler's + one per queued reply */
	int len;       /* bytes of b */
	uint8_t b[];
};

static void map_frame_put(struct map_frame *m)
{
	if (m && __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(m);
}

static void map_frame_sent(void *ctx, int status)
{
	(void)status;
	map_frame_put(ctx);
}

static void build_map(struct emb_sched *s);
static void fill_next(struct emb_sched *s);
static void move_next(struct emb_sched *s);

/* The drain or join that begins now (or goes on after a restart): its
 * clock, and the chunks, slots, rows and bytes counted for it, from 0. */
static void move_clock(struct emb_sched *s)
{
	s->move_chunks = 0;
	s->move_slots = 0;
	s->move_ms = (int64_t)emb_clock_ms();
	s->move_rows = s->move_bytes = 0;
}

static void send_map(struct emb_sched *s, struct emb_req *req);

/*
 * The map changed: each server's watch (a CLUSTER_MAP held until then)
 * gets it now. Left to their heartbeats (every timeout / 5) or to a
 * write routed by the new map, servers outside a move took it up to
 * seconds later, and refused writes meanwhile: a move's new holder its
 * chunk's writes after the hand-over, every other server the writes a
 * client routed by the new epoch (docs/protocol.md, "Map watch").
 */
static void answer_watches(struct emb_sched *s)
{
	if (s->state == EMB_CLUSTER_FORMING)
		return; /* the held requests wait for the first map */
	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *n = &s->nodes[i];

		if (n->map_req) {
			send_map(s, n->map_req);
			n->map_req = NULL;
		}
	}
}

/* The map changed: nodes asking from now on get the new one; replies
 * still queued with the old one keep it until they are sent. */
static void republish(struct emb_sched *s)
{
	map_frame_put(s->map);
	s->map = NULL;
	state_save(s);
	build_map(s);
	answer_watches(s);
}

/*
 * A server of a replicated cluster died: the map drops it, so its slots'
 * first backups are their primaries now, and observers asking for the
 * map from now on get the new one (workers compute the same from the
 * dead list in heartbeats). True when every slot still has a holder: the
 * job goes on, and barriers with it.
 */
static bool failover(struct emb_sched *s, struct node *n)
{
	uint32_t had = emb_cmap_primary_slots(s->cmap, (uint16_t)n->rank);
	int lost = emb_cmap_remove(s->cmap, n->rank, s->cmap);

	if (lost > 0) {
		emb_log(EMB_LOG_ERROR,
			"map epoch %llu: %d slot%s lost every holder with "
			"server %u: the job cannot go on",
			(unsigned long long)s->cmap->epoch, lost,
			lost == 1 ? "" : "s", n->rank);
		return false;
	}
	republish(s);
	emb_log(EMB_LOG_WARN,
		"map epoch %llu: server %u removed, its %u primary slot%s "
		"moved to their first backups; the job goes on",
		(unsigned long long)s->cmap->epoch, n->rank, had,
		had == 1 ? "" : "s");
	/* A recovery under way: without its newcomer it ends; without its
	 * chunk's source (remove() dropped that fill) the chunk starts
	 * again from the holders left. */
	if (s->move_from != NO_FILL &&
	    (s->fill_rank == n->rank ||
	     (s->warming ? s->cmap->warm[s->fill_first]
			 : s->cmap->fill[s->fill_first]) != s->fill_rank)) {
		/* A move's target or source died (remove() ended the fill):
		 * the chunk is moved again, from or to the servers left. */
		emb_log(EMB_LOG_WARN,
			"the move of slots %u-%u from server %u to server %u "
			"ends with server %u: moving them again",
			s->fill_first, s->fill_first + s->fill_n - 1,
			s->move_from, s->fill_rank, n->rank);
		s->fill_rank = s->move_from = NO_FILL;
		s->warming = false;
		move_next(s);
	} else if (s->fill_rank == n->rank) {
		emb_log(EMB_LOG_WARN,
			"server %u died while being filled: its recovery ends",
			n->rank);
		s->fill_rank = NO_FILL;
		move_next(s);
	} else if (s->move_from == NO_FILL && s->fill_rank != NO_FILL &&
		   s->cmap->fill[s->fill_first] != s->fill_rank) {
		/* A recovery fill only: a move whose ends both live goes on
		 * (while copied ahead its chunk has no fill, which is no
		 * lost source), and move_next() gives its target the slots
		 * this death left short of copies first. Taken for a lost
		 * fill, such a move had its target filled with another
		 * chunk while still marked copying ahead: that fill's end
		 * then fenced that chunk as the move's, its source took the
		 * fence for the stream it had just sent, and the chunk's
		 * writes were refused for good. */
		emb_log(EMB_LOG_WARN,
			"the fill of slots %u-%u into server %u lost its "
			"source: filling them again",
			s->fill_first, s->fill_first + s->fill_n - 1,
			s->fill_rank);
		fill_next(s);
	}
	return true;
}

/* n goes on the list of dead nodes that heartbeats carry. */
static void list_dead(struct emb_sched *s, struct node *n)
{
	n->dead = true;
	if (s->ndead == s->dead_cap) {
		uint32_t cap = 2 * s->dead_cap;
		struct emb_wire_node_ref *d =
		    cap <= EMB_WIRE_NODES_MAX
			? realloc(s->dead, cap * sizeof(*d))
			: NULL;

		/* Without room the death is still acted on; only later
		 * heartbeats do not list it (one more replaced rank). */
		if (d) {
			s->dead = d;
			s->dead_cap = cap;
		}
	}
	if (s->ndead < s->dead_cap)
		s->dead[s->ndead++] =
		    (struct emb_wire_node_ref){n->role, n->rank};
}

static void declare_dead(struct emb_sched *s, struct node *n, const char *why)
{
	char addr[EMB_WIRE_HOST_MAX + 16];
	char msg[128];

	if (n->dead)
		return;
	list_dead(s, n);
	n->draining = n->joining = false;
	if (n->finish_req) {
		send_error(s, n->finish_req, EMB_ENODEAD, "declared dead");
		n->finish_req = NULL;
	}
	emb_log(EMB_LOG_ERROR, "%s %u (%s) declared dead: %s",
		emb_role_name(n->role), n->rank,
		node_addr(n, addr, sizeof(addr)), why);
	if (n->role == EMB_ROLE_SERVER && mapped(s) && failover(s, n)) {
		check_end(s);
		return;
	}
	s->nfatal++;
	snprintf(msg, sizeof(msg), "%s %u died", emb_role_name(n->role),
		 n->rank);
	/* A barrier with a dead member can never complete; a cluster with
	 * a dead member before it formed never will either. */
	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *m = &s->nodes[i];

		if (m->barrier_req) {
			send_error(s, m->barrier_req, EMB_ENODEAD, msg);
			m->barrier_req = NULL;
		}
		if (m->map_req) {
			send_error(s, m->map_req, EMB_ENODEAD, msg);
			m->map_req = NULL;
		}
		if (m->finish_req) {
			send_error(s, m->finish_req, EMB_ENODEAD, msg);
			m->finish_req = NULL;
		}
	}
	check_end(s);
}

/* The CLUSTER_MAP response for the current map, in s->map. */
static void build_map(struct emb_sched *s)
{
	uint32_t S = s->o.server_num;
	struct emb_wire_node_addr *addrs;
	uint16_t slot_map[EMB_NSLOTS];
	size_t cap = emb_wire_cluster_map_cap(S);
	uint8_t *cm = NULL;
	int64_t cml = 0;

	addrs = calloc(S, sizeof(*addrs));
	s->map = malloc(sizeof(*s->map) + cap);
	if (!addrs || !s->map)
		goto err;
	s->map->refs = 1;
	/* Contiguous ranges, as a client given a server list routes: a dump
	 * grouped by slot restores onto either. The first map is that;
	 * failovers only drop servers from it (cluster/map.h). */
	if (!s->cmap) {
		s->cmap = malloc(sizeof(*s->cmap));
		if (!s->cmap ||
		    emb_cmap_init(s->cmap, s->start,
				  s->o.replicas ? s->o.replicas : 1)) {
			free(s->cmap);
			s->cmap = NULL;
			goto err;
		}
		/* Free ranks hold nothing until a server joins there. */
		s->cmap->nservers = S;
	}
	for (uint32_t i = 0; i < S; i++) {
		addrs[i] = s->nodes[i].addr;
		addrs[i].removed = s->nodes[i].dead;
	}
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		slot_map[sl] = emb_cmap_primary(s->cmap, sl);
	/* Replicated: the whole map rides along, since joins, fills and the
	 * rebalance make backups that the successor rule does not give. */
	if (mapped(s)) {
		cm = malloc(emb_cmap_size(s->cmap));
		cml = cm ? emb_cmap_encode(s->cmap, cm, emb_cmap_size(s->cmap))
			 : -ENOMEM;
		if (cml < 0)
			goto err;
	}
	s->map->len = emb_wire_cluster_map_encode(
	    s->map->b, cap, 0, s->o.worker_num, s->cmap->replicas,
	    slot_map, addrs, S, cm, (uint32_t)cml);
	free(addrs);
	addrs = NULL;
	free(cm);
	cm = NULL;
	if (s->map->len > 0)
		return;
err:
	free(cm);
	free(addrs);
	free(s->map);
	s->map = NULL;
	emb_log(EMB_LOG_ERROR, "cannot build the cluster map");
}

static void send_map(struct emb_sched *s, struct emb_req *req)
{
	struct map_frame *m = s->map;
	struct emb_frame_hdr hdr;
	struct iovec iov;

	if (!m) {
		send_error(s, req, -ENOMEM, "no cluster map");
		return;
	}
	memcpy(&hdr, m->b, sizeof(hdr));
	iov = (struct iovec){m->b + EMB_WIRE_HDR_SIZE,
			     (size_t)m->len - EMB_WIRE_HDR_SIZE};
	__atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
	/* On an error the reply never queued and done never fires. */
	if (emb_conn_reply(req, &hdr, &iov, 1, map_frame_sent, m))
		map_frame_put(m);
}

static void check_ready(struct emb_sched *s)
{
	if (s->state != EMB_CLUSTER_FORMING || s->nfatal ||
	    s->nservers < s->start || s->nworkers < s->o.worker_num)
		return;
	s->state = EMB_CLUSTER_READY;
	/* The ranks past the first servers are free: held by no slot,
	 * unreachable (a placeholder address, removed), and taken by the
	 * servers that register from now on. */
	for (uint32_t i = s->start; i < s->o.server_num; i++) {
		struct node *n = &s->nodes[i];

		memset(n, 0, sizeof(*n));
		n->role = EMB_ROLE_SERVER;
		n->rank = i;
		n->dead = n->left = true;
		snprintf(n->addr.host, sizeof(n->addr.host), "0.0.0.0");
		n->addr.port = 9;
	}
	build_map(s);
	state_save(s);
	emb_log(EMB_LOG_INFO, "cluster ready: %u server%s, %u worker%s",
		s->nservers, s->nservers == 1 ? "" : "s", s->nworkers,
		s->nworkers == 1 ? "" : "s");
	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *n = &s->nodes[i];

		if (n->map_req) {
			send_map(s, n->map_req);
			n->map_req = NULL;
		}
	}
}

/* ---- requests ------------------------------------------------------- */

/* The peer's address without port or IPv6 brackets. */
static void peer_host(const struct emb_conn *conn, char *buf, size_t cap)
{
	const char *p = emb_conn_peer(conn);
	const char *end = strrchr(p, ':');
	size_t len = end ? (size_t)(end - p) : strlen(p);

	if (len >= 2 && p[0] == '[' && p[len - 1] == ']') {
		p++;
		len -= 2;
	}
	if (len >= cap)
		len = cap - 1;
	memcpy(buf, p, len);
	buf[len] = '\0';
}

static bool wildcard(const char *h, uint32_t len)
{
	return len == 0 || (len == 7 && !memcmp(h, "0.0.0.0", 7)) ||
	       (len == 2 && !memcmp(h, "::", 2));
}

/*
 * A server of the formed cluster, not dead, whose connection is gone and
 * whose address is r's (as on_register() records it), or NULL.
 */
static struct node *lost_server(struct emb_sched *s, struct emb_conn *conn,
				const struct emb_wire_register_req *r)
{
	char host[EMB_WIRE_HOST_MAX + 1] = "";

	if (wildcard(r->host, r->host_len))
		peer_host(conn, host, sizeof(host));
	else
		memcpy(host, r->host, r->host_len);
	for (uint32_t i = 0; i < s->o.server_num; i++) {
		struct node *n = &s->nodes[i];

		if (n->role == EMB_ROLE_SERVER && !n->dead && !n->conn &&
		    n->addr.port == r->port && strcmp(n->addr.host, host) == 0)
			return n;
	}
	return NULL;
}

/* ---- recovery --------------------------------------------------------- */

/* A fill or move of [first, first + n) began with this map: its chunk. */
static void chunk_begun(struct emb_sched *s, uint32_t first, uint32_t n)
{
	s->fill_first = first;
	s->fill_n = n;
	s->fill_epoch = s->cmap->epoch;
	s->fill_chunk_ms = (int64_t)emb_clock_ms();
	republish(s);
}

/*
 * The next chunk of the server being filled, as a new map epoch; or, when
 * it holds every slot it should, the rebalance that ends the recovery.
 */
static void fill_next(struct emb_sched *s)
{
	uint32_t first = s->fill_first, r = s->fill_rank;
	int n;

	if (r == NO_FILL)
		return;
	n = emb_cmap_fill_next(s->cmap, r, FILL_CHUNK_SLOTS, &first);
	if (n > 0) {
		emb_cmap_fill_begin(s->cmap, r, first, (uint32_t)n, s->cmap);
		chunk_begun(s, first, (uint32_t)n);
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u is being filled with slots "
			"%u-%u from server %u",
			(unsigned long long)s->cmap->epoch, r, first,
			first + (uint32_t)n - 1, emb_cmap_primary(s->cmap, first));
		return;
	}
	/* Full: a pure reordering of holders gives it its primaries. */
	n = emb_cmap_rebalance(s->cmap, s->cmap);
	if (n > 0)
		republish(s);
	s->recoveries++;
	s->fill_rank = NO_FILL;
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: server %u is a full replica (%u chunk%s in "
		"%lld ms); %d primary slot%s rebalanced, it is primary of %u",
		(unsigned long long)s->cmap->epoch, r, s->fill_chunks,
		s->fill_chunks == 1 ? "" : "s",
		(long long)((int64_t)emb_clock_ms() - s->fill_ms), n > 0 ? n : 0,
		n == 1 ? "" : "s", emb_cmap_primary_slots(s->cmap, r));
	/* A rank that was drained, or never held anything, holds little
	 * or nothing now: it is given its share by moves (R + 1 writers, so
	 * not with the most copies a map lists). */
	s->nodes[r].joining = s->cmap->replicas < EMB_CMAP_REPLICAS_MAX;
	move_clock(s);
	move_next(s);
}

/* ---- moves ------------------------------------------------------------ */

/* Slots rank holds, primary or backup. */
static uint32_t held_slots(const struct emb_sched *s, uint32_t rank)
{
	uint32_t k[3];

	emb_cmap_rank_slots(s->cmap, rank, k);
	return k[0] + k[1];
}

/*
 * Server d holds nothing any more. It stays one heartbeat timeout longer,
 * answering: a write a client routed to it by an older map is refused
 * (no copy here) and sent again by the newer one, whose writers it
 * reaches (emb__rep_fixup() in the client); were d gone, that copy would
 * end as a dead holder's and its rows miss the server that took d's
 * place. Meanwhile the primaries spread.
 */
static void drain_empty(struct emb_sched *s, struct node *d)
{
	char addr[EMB_WIRE_HOST_MAX + 16];
	int n = emb_cmap_rebalance(s->cmap, s->cmap);

	d->empty_ms = (int64_t)emb_clock_ms();
	republish(s);
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: server %u (%s) drained (%u chunk%s in %lld "
		"ms; %d primary slot%s rebalanced): it holds no slot and leaves "
		"in %u ms",
		(unsigned long long)s->cmap->epoch, d->rank,
		node_addr(d, addr, sizeof(addr)), s->move_chunks,
		s->move_chunks == 1 ? "" : "s",
		(long long)((int64_t)emb_clock_ms() - s->move_ms), n > 0 ? n : 0,
		n == 1 ? "" : "s", s->o.hb_timeout_ms);
	move_clock(s);
}

/* Loop thread, each turn: a drained server whose stay is over leaves. Its
 * rank is listed with the dead (nodes stop routing to it, a newcomer may
 * take it), its heartbeat is answered EMB_EDRAINED, and it exits. */
static void drain_leave(struct emb_sched *s)
{
	const int64_t now = (int64_t)emb_clock_ms();

	for (uint32_t i = 0; i < s->o.server_num; i++) {
		struct node *d = &s->nodes[i];

		if (!d->draining || d->dead || !d->empty_ms ||
		    now - d->empty_ms < (int64_t)s->o.hb_timeout_ms)
			continue;
		d->draining = false;
		d->empty_ms = 0;
		d->left = true;
		list_dead(s, d);
		s->drains++;
		republish(s);
		emb_log(EMB_LOG_INFO, "server %u left the job", d->rank);
		/* Its hold tells it at once, as its next heartbeat would. */
		if (d->finish_req) {
			send_error(s, d->finish_req, EMB_EDRAINED,
				   "this server was drained: it holds no slot "
				   "and leaves");
			d->finish_req = NULL;
		}
		check_end(s);
	}
}

/* Server j has its share: the primaries spread over everyone. */
static void joined(struct emb_sched *s, struct node *j)
{
	int n = emb_cmap_rebalance(s->cmap, s->cmap);

	j->joining = false;
	s->joins++;
	if (n > 0)
		republish(s);
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: server %u has its share: %u slots (%u "
		"chunk%s moved in %lld ms; %d primary slot%s rebalanced, it is "
		"primary of %u)",
		(unsigned long long)s->cmap->epoch, j->rank,
		held_slots(s, j->rank), s->move_chunks,
		s->move_chunks == 1 ? "" : "s",
		(long long)((int64_t)emb_clock_ms() - s->move_ms), n > 0 ? n : 0,
		n == 1 ? "" : "s", emb_cmap_primary_slots(s->cmap, j->rank));
	move_clock(s);
}

/*
 * Slots the drain of d, or the join of j, has still to move, the chunk
 * about to start included: all d holds; or j's share (the copies over the
 * servers holding any, j included, as emb_cmap_join_next() counts it)
 * less what j holds.
 */
static uint32_t move_left(const struct emb_sched *s, const struct node *d,
			  const struct node *j)
{
	uint32_t total = 0, live = 0, share;

	if (d)
		return held_slots(s, d->rank);
	for (uint32_t r = 0; r < s->cmap->nservers; r++) {
		uint32_t h = held_slots(s, r);

		total += h;
		live += h > 0 || r == j->rank;
	}
	share = live ? total / live : 0;
	return share > held_slots(s, j->rank)
		   ? share - held_slots(s, j->rank)
		   : 0;
}

/* The drain's or join's time left at its rate so far, ms; -1 before its
 * first chunk is done. */
static int64_t move_eta_ms(const struct emb_sched *s)
{
	int64_t spent = (int64_t)emb_clock_ms() - s->move_ms;

	if (!s->move_slots || spent <= 0)
		return -1;
	return (int64_t)((double)s->move_left * (double)spent /
			 (double)s->move_slots);
}

/* True when some slot has fewer copies than the map wants and j could
 * hold one (emb_cmap_fill_next() finds a chunk for it). */
static bool short_of_copies(const struct emb_sched *s, const struct node *j)
{
	uint32_t first = 0;

	return emb_cmap_fill_next(s->cmap, j->rank, FILL_CHUNK_SLOTS,
				  &first) > 0;
}

/*
 * The next move, unless a fill or move is under way: drains first (a
 * server waiting to leave holds its machine), then joins. Each chunk is a
 * new map epoch, moved as a recovery fills (fence, stream, FILL_DONE);
 * on_fill_done() then puts the target in its source's place.
 */
static void move_next(struct emb_sched *s)
{
	const uint32_t S = s->o.server_num;
	char addr[EMB_WIRE_HOST_MAX + 16], left[48];
	int64_t eta;

	while (s->fill_rank == NO_FILL && s->cmap && !s->over && !s->nfatal) {
		struct node *d = NULL, *j = NULL;
		uint32_t first = s->move_first, from = NO_FILL, to = NO_FILL;
		bool *ok;
		int n;

		for (uint32_t i = 0; i < S && !d; i++)
			if (s->nodes[i].draining && !s->nodes[i].dead &&
			    !s->nodes[i].empty_ms)
				d = &s->nodes[i];
		for (uint32_t i = 0; i < S && !d && !j; i++)
			if (s->nodes[i].joining && !s->nodes[i].dead)
				j = &s->nodes[i];
		if (!d && !j)
			return;
		if (!d && short_of_copies(s, j)) {
			/* A server died during the join: the joiner is a live
			 * server with room, so it takes the slots left short
			 * of copies first, as a newcomer at a free rank does
			 * (fill_next() gives it its share afterwards). The
			 * alternative, the join's moves going on while those
			 * slots wait with one copy for a replacement, would
			 * leave them a death away from lost. */
			/* A copy ahead the death ended leaves no mark (a
			 * move's start clears them the same way). */
			emb_cmap_warm_end(s->cmap, s->cmap);
			s->fill_rank = j->rank;
			s->fill_first = 0;
			s->fill_fails = 0;
			s->fill_chunks = 0;
			s->fill_ms = (int64_t)emb_clock_ms();
			s->fill_rows = s->fill_bytes = 0;
			j->joining = false;
			emb_log(EMB_LOG_INFO,
				"server %u, joining, is filled with the slots "
				"short of copies first",
				j->rank);
			fill_next(s);
			return;
		}
		if (d) {
			/* To any live server staying, the least loaded. */
			ok = calloc(S, sizeof(*ok));
			if (!ok)
				return;
			for (uint32_t i = 0; i < S; i++)
				ok[i] = s->nodes[i].role == EMB_ROLE_SERVER &&
					!s->nodes[i].dead &&
					!s->nodes[i].draining;
			from = d->rank;
			n = emb_cmap_drain_next(s->cmap, from, ok,
						FILL_CHUNK_SLOTS, &first, &to);
			free(ok);
		} else {
			to = j->rank;
			n = emb_cmap_join_next(s->cmap, to, FILL_CHUNK_SLOTS,
					       &first, &from);
			/* Never from a server being drained: it is going. */
			if (n > 0 && s->nodes[from].draining)
				n = 0;
		}
		if (n == -ENOSPC) {
			emb_log(EMB_LOG_ERROR,
				"server %u cannot be drained: every server "
				"staying holds a copy of some of its slots "
				"already (%u copies of each slot need %u "
				"servers)",
				d->rank, s->cmap->replicas, s->cmap->replicas);
			d->draining = false;
			continue;
		}
		if (n < 0) {
			emb_log(EMB_LOG_ERROR, "cannot plan a move: %s",
				emb_strerror(n));
			return;
		}
		if (n == 0) {
			if (d)
				drain_empty(s, d);
			else
				joined(s, j);
			continue;
		}
		s->move_left = move_left(s, d, j);
		/* First the copy ahead, unfenced: the fence then waits only
		 * for the rows written meanwhile (fence_move()). */
		emb_cmap_warm_end(s->cmap, s->cmap);
		emb_cmap_warm_begin(s->cmap, from, to, first, (uint32_t)n,
				    s->cmap);
		s->warming = true;
		s->warm_fresh = false;
		s->fill_rank = to;
		s->move_from = from;
		chunk_begun(s, first, (uint32_t)n);
		eta = move_eta_ms(s);
		if (eta >= 0)
			snprintf(left, sizeof(left), ", about %.0f s left",
				 (double)eta / 1e3);
		else
			left[0] = 0;
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: slots %u-%u move from server %u to "
			"server %u (%s), copied ahead by server %u; %s of "
			"server %u: %u slots moved in %.1f s, %u to go%s",
			(unsigned long long)s->cmap->epoch, first,
			first + (uint32_t)n - 1, from, to,
			node_addr(&s->nodes[to], addr, sizeof(addr)),
			emb_cmap_primary(s->cmap, first),
			d ? "drain" : "join", d ? d->rank : j->rank,
			s->move_slots,
			(double)((int64_t)emb_clock_ms() - s->move_ms) / 1e3,
			s->move_left, left);
	}
}

/*
 * The move under way, copied ahead (or not: a failed copy ahead ends the
 * same way, with the whole chunk streamed): its chunk is fenced, and its
 * source streams what changed since the copy began.
 */
static void fence_move(struct emb_sched *s, const char *why)
{
	uint32_t first = s->fill_first, n = s->fill_n;

	s->warming = s->warm_fresh = false;
	emb_cmap_move_begin(s->cmap, s->move_from, s->fill_rank, first, n,
			    s->cmap);
	chunk_begun(s, first, n);
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: slots %u-%u fenced for the last of their "
		"move to server %u%s%s, streamed by server %u",
		(unsigned long long)s->cmap->epoch, first, first + n - 1,
		s->fill_rank, why ? ": " : "", why ? why : "",
		emb_cmap_primary(s->cmap, first));
}

/* A chunk that will not finish: its slots are filled again, or, after
 * FILL_TRIES failures, the recovery is given up. */
static void fill_failed(struct emb_sched *s, const char *why)
{
	if (s->warming) {
		/* A copy ahead is only a head start: the fenced stream
		 * sends the whole chunk instead. */
		emb_log(EMB_LOG_WARN,
			"map epoch %llu: the copy ahead of slots %u-%u to "
			"server %u failed: %s",
			(unsigned long long)s->cmap->epoch, s->fill_first,
			s->fill_first + s->fill_n - 1, s->fill_rank, why);
		fence_move(s, "without a copy ahead");
		return;
	}
	emb_cmap_fill_abort(s->cmap, s->fill_rank, s->fill_first, s->fill_n,
			    s->cmap);
	republish(s);
	emb_log(EMB_LOG_WARN, "map epoch %llu: the fill of slots %u-%u into "
			      "server %u failed: %s",
		(unsigned long long)s->cmap->epoch, s->fill_first,
		s->fill_first + s->fill_n - 1, s->fill_rank, why);
	if (s->move_from != NO_FILL) {
		s->fill_rank = s->move_from = NO_FILL;
		if (++s->fill_fails >= FILL_TRIES) {
			emb_log(EMB_LOG_ERROR,
				"moves given up after %u failed streams: the "
				"drains and joins asked for end where they are",
				s->fill_fails);
			for (uint32_t i = 0; i < s->o.server_num; i++)
				s->nodes[i].draining = s->nodes[i].joining =
				    false;
			s->fill_fails = 0;
			return;
		}
		move_next(s);
		return;
	}
	if (++s->fill_fails >= FILL_TRIES) {
		emb_log(EMB_LOG_ERROR,
			"server %u: recovery given up after %u failed "
			"streams; it keeps the %u slots it got",
			s->fill_rank, s->fill_fails,
			emb_cmap_primary_slots(s->cmap, s->fill_rank));
		s->fill_rank = NO_FILL;
		return;
	}
	fill_next(s);
}

/* A replicated cluster's dead server, whose rank a newcomer may take:
 * the first, or NULL. */
static struct node *dead_server(struct emb_sched *s)
{
	for (uint32_t i = 0; i < s->o.server_num; i++)
		if (s->nodes[i].role == EMB_ROLE_SERVER && s->nodes[i].dead)
			return &s->nodes[i];
	return NULL;
}

/*
 * A node of the formed job comes back to its rank after losing its link
 * (this scheduler restarted, or the link broke). The node slot it names
 * must be one this scheduler knows from the job (its state file, or its
 * own run: the cluster id says which), alive, unfinished, without a link,
 * and a server must come from the address it serves on. The rank's node,
 * or NULL after answering req with the refusal.
 */
static struct node *rejoin(struct emb_sched *s, struct emb_conn *conn,
			   struct emb_req *req,
			   const struct emb_wire_register_req *r)
{
	char host[EMB_WIRE_HOST_MAX + 1] = "", addr[EMB_WIRE_HOST_MAX + 16];
	char msg[2 * EMB_WIRE_HOST_MAX + 64];
	uint32_t count = r->role == EMB_ROLE_SERVER ? s->o.server_num
						     : s->o.worker_num;
	uint64_t have = s->cmap ? s->cmap->epoch : 0;
	struct node *n;
	int status = EMB_ECLUSTER;

	if (s->state == EMB_CLUSTER_FORMING || r->cluster_id != s->cluster_id) {
		snprintf(msg, sizeof(msg),
			 "no job of cluster id %016llx here (this scheduler "
			 "has no state of it)",
			 (unsigned long long)r->cluster_id);
		goto refuse;
	}
	if (r->rank >= count) {
		snprintf(msg, sizeof(msg), "%s rank %u: the job has %u",
			 emb_role_name(r->role), r->rank, count);
		goto refuse;
	}
	n = &s->nodes[r->role == EMB_ROLE_SERVER ? r->rank
						  : s->o.server_num + r->rank];
	if (wildcard(r->host, r->host_len))
		peer_host(conn, host, sizeof(host));
	else
		memcpy(host, r->host, r->host_len);
	if (n->role != r->role) {
		snprintf(msg, sizeof(msg), "%s rank %u never registered",
			 emb_role_name(r->role), r->rank);
	} else if (n->dead) {
		status = EMB_ENODEAD;
		snprintf(msg, sizeof(msg),
			 "%s %u was declared dead while away",
			 emb_role_name(n->role), n->rank);
	} else if (n->finished || n->conn) {
		snprintf(msg, sizeof(msg), "%s %u is %s",
			 emb_role_name(n->role), n->rank,
			 n->finished ? "finished" : "connected already");
	} else if (n->role == EMB_ROLE_SERVER &&
		   (n->addr.port != r->port || strcmp(n->addr.host, host))) {
		snprintf(msg, sizeof(msg),
			 "server %u serves on %s:%u, not on %s:%u", n->rank,
			 n->addr.host, n->addr.port, host, r->port);
	} else {
		n->conn = conn;
		n->pid = r->pid;
		snprintf(n->peer, sizeof(n->peer), "%s", emb_conn_peer(conn));
		n->last_ms = (int64_t)emb_clock_ms();
		emb_conn_set_user(conn, n);
		emb_log(EMB_LOG_INFO, "%s %u (%s, pid %u) rejoined with map "
				      "epoch %llu (ours %llu)",
			emb_role_name(n->role), n->rank,
			node_addr(n, addr, sizeof(addr)), n->pid,
			(unsigned long long)r->map_epoch,
			(unsigned long long)have);
		/* Newer than ours: the state file missed an epoch (a write
		 * failed). Ours is the one the job goes on with; the node
		 * takes it from its next heartbeat. */
		if (r->map_epoch > have && s->cmap && s->cmap->replicas > 1)
			emb_log(EMB_LOG_WARN,
				"%s %u holds map epoch %llu, newer than this "
				"scheduler's %llu",
				emb_role_name(n->role), n->rank,
				(unsigned long long)r->map_epoch,
				(unsigned long long)have);
		return n;
	}
refuse:
	emb_log(EMB_LOG_WARN, "rejoin of %s %u from %s refused: %s",
		emb_role_name(r->role), r->rank, emb_conn_peer(conn), msg);
	send_error(s, req, status, msg);
	return NULL;
}

static void on_register(struct emb_sched *s, struct emb_conn *conn,
			struct emb_req *req, const struct emb_wire_frame *f)
{
	struct emb_wire_register_req r;
	struct emb_wire_register_resp resp;
	_Alignas(8)
	    uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_REGISTER_RESP_SIZE];
	char addr[EMB_WIRE_HOST_MAX + 16], msg[96];
	struct node *n;
	uint32_t idx;
	int len, rc;

	rc = emb_wire_register_req_decode(f, &r);
	if (rc) {
		send_error(s, req, rc, "bad REGISTER");
		return;
	}
	if (r.role == EMB_ROLE_SERVER && r.port == 0) {
		send_error(s, req, EMB_EBADFRAME, "server without a port");
		return;
	}
	if (r.rejoin) {
		n = rejoin(s, conn, req, &r);
		if (!n)
			return;
		idx = (uint32_t)(n - s->nodes);
		goto reply;
	}
	/* A server that was lost comes back to its rank. */
	n = r.role == EMB_ROLE_SERVER && s->state == EMB_CLUSTER_READY
		? lost_server(s, conn, &r)
		: NULL;
	if (n) {
		idx = (uint32_t)(n - s->nodes);
		n->conn = conn;
		n->pid = r.pid;
		snprintf(n->peer, sizeof(n->peer), "%s", emb_conn_peer(conn));
		n->last_ms = (int64_t)emb_clock_ms();
		emb_conn_set_user(conn, n);
		emb_log(EMB_LOG_INFO, "server %u (%s) registered again (pid %u)",
			n->rank, node_addr(n, addr, sizeof(addr)), n->pid);
		goto reply;
	}
	/* Recovery: a server joining a running replicated job takes a dead
	 * rank (never a live one: a stray REGISTER takes nothing from a
	 * server that works) and is filled with that rank's slots. */
	n = r.role == EMB_ROLE_SERVER && s->state == EMB_CLUSTER_READY &&
		    mapped(s) && !s->nfatal
		? dead_server(s)
		: NULL;
	if (n && s->fill_rank != NO_FILL) {
		snprintf(msg, sizeof(msg),
			 "server %u is being filled: one newcomer at a time",
			 s->fill_rank);
		emb_log(EMB_LOG_WARN, "server from %s told to wait: %s",
			emb_conn_peer(conn), msg);
		/* Not ECLUSTER: the node registers again until its join
		 * timeout, as a replacement started beside another should. */
		send_error(s, req, EMB_ENEWCOMER, msg);
		return;
	}
	if (n) {
		bool was_left = n->left;

		/* The deaths of this rank are history now: a node that hears
		 * of one only after it took the newcomer's map must not take
		 * it for the newcomer's (protocol.md, HEARTBEAT response). */
		for (uint32_t i = 0; i < s->ndead; i++)
			if (s->dead[i].role == EMB_ROLE_SERVER &&
			    s->dead[i].rank == n->rank)
				s->dead[i].role |= EMB_WIRE_ROLE_REPLACED;
		idx = (uint32_t)(n - s->nodes);
		n->dead = false;
		n->left = false;
		n->finished = false;
		n->conn = conn;
		n->pid = r.pid;
		snprintf(n->peer, sizeof(n->peer), "%s", emb_conn_peer(conn));
		n->last_ms = (int64_t)emb_clock_ms();
		memset(&n->addr, 0, sizeof(n->addr));
		if (wildcard(r.host, r.host_len))
			peer_host(conn, n->addr.host, sizeof(n->addr.host));
		else
			memcpy(n->addr.host, r.host, r.host_len);
		n->addr.port = r.port;
		emb_conn_set_user(conn, n);
		s->fill_rank = n->rank;
		s->fill_first = 0;
		s->fill_fails = 0;
		s->fill_chunks = 0;
		s->fill_ms = (int64_t)emb_clock_ms();
		s->fill_rows = s->fill_bytes = 0;
		emb_log(EMB_LOG_INFO,
			was_left ? "server %u (%s, pid %u) joins at a free rank: "
				   "it is filled with any slot short of copies, "
				   "then given its share"
				 : "server %u (%s, pid %u) replaces a dead server: "
				   "it joins as it is filled with its slots",
			n->rank, node_addr(n, addr, sizeof(addr)), n->pid);
		/* Its address goes out with the first fill's map. */
		fill_next(s);
		republish(s);
		goto reply;
	}
	if (s->state != EMB_CLUSTER_FORMING ||
	    (r.role == EMB_ROLE_SERVER ? s->nservers == s->start
				       : s->nworkers == s->o.worker_num)) {
		snprintf(msg, sizeof(msg), "cluster full: %u %ss registered",
			 r.role == EMB_ROLE_SERVER ? s->start
						   : s->o.worker_num,
			 emb_role_name(r.role));
		emb_log(EMB_LOG_WARN, "%s from %s refused: %s",
			emb_role_name(r.role), emb_conn_peer(conn), msg);
		send_error(s, req, EMB_ECLUSTER, msg);
		return;
	}
	idx = r.role == EMB_ROLE_SERVER ? s->nservers++
					: s->o.server_num + s->nworkers++;
	n = &s->nodes[idx];
	memset(n, 0, sizeof(*n));
	n->role = r.role;
	n->rank = r.role == EMB_ROLE_SERVER ? idx : idx - s->o.server_num;
	n->pid = r.pid;
	n->conn = conn;
	snprintf(n->peer, sizeof(n->peer), "%s", emb_conn_peer(conn));
	n->last_ms = (int64_t)emb_clock_ms();
	emb_conn_set_user(conn, n);
	if (r.role == EMB_ROLE_SERVER) {
		/* A server bound to every address is reached at the one it
		 * came from. */
		if (wildcard(r.host, r.host_len))
			peer_host(conn, n->addr.host, sizeof(n->addr.host));
		else
			memcpy(n->addr.host, r.host, r.host_len);
		n->addr.port = r.port;
	}
	emb_log(EMB_LOG_INFO, "assigned %s rank %u to %s (pid %u)",
		emb_role_name(n->role), n->rank,
		node_addr(n, addr, sizeof(addr)), n->pid);
reply:

	resp = (struct emb_wire_register_resp){
	    .role = n->role,
	    .rank = n->rank,
	    .node_id = idx + 1,
	    .server_num = s->o.server_num,
	    .worker_num = s->o.worker_num,
	    .hb_timeout_ms = s->o.hb_timeout_ms,
	    .cluster_id = s->cluster_id,
	};
	len = emb_wire_register_resp_encode(buf, sizeof(buf), req->hdr.req_id,
					    &resp);
	if (len < 0)
		send_error(s, req, len, "cannot encode REGISTER response");
	else
		send_frame(s, req, buf, len);
	check_ready(s);
}

/*
 * HELLO: with a token, the one way in (compared in constant time; failures
 * from an address slow its next tries down); without, a courtesy.
 */
static void on_hello(struct emb_sched *s, struct emb_conn *conn,
		     struct emb_req *req, const struct emb_wire_frame *f)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE];
	const struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_hello_resp r = {0};
	struct emb_wire_hello_req h;
	unsigned char diff;
	int len, rc;

	rc = emb_wire_hello_req_decode(f, &h);
	if (rc) {
		refuse_and_close(s, req, rc, "bad HELLO");
		return;
	}
	if (s->token_len) {
		if (emb_authlimit_wait_ms(s->authlimit, emb_conn_peer(conn))) {
			refuse_and_close(s, req, EMB_EAUTH,
					 "too many failed attempts: wait");
			return;
		}
		diff = (unsigned char)(h.token_len != s->token_len);
		for (uint32_t i = 0; i < s->token_len; i++)
			diff |= (unsigned char)(s->token[i] ^
						(i < h.token_len ? h.token[i]
								 : 0));
		if (diff) {
			emb_log(EMB_LOG_WARN, "%s: authentication failed",
				emb_conn_peer(conn));
			emb_authlimit_fail(s->authlimit, emb_conn_peer(conn));
			refuse_and_close(s, req, EMB_EAUTH,
					 "authentication failed");
			return;
		}
		emb_authlimit_ok(s->authlimit, emb_conn_peer(conn));
	}
	if (!emb_conn_user(conn))
		emb_conn_set_user(conn, HELLO_OK);
	r.server_version = EMB_WIRE_VERSION;
	r.limits = lim;
	r.server_id = s->cluster_id;
	len = emb_wire_hello_resp_encode(buf, sizeof(buf), req->hdr.req_id, &r);
	if (len < 0)
		send_error(s, req, len, "cannot encode HELLO response");
	else
		send_frame(s, req, buf, len);
}

/* ---- liveness ------------------------------------------------------- */

/*
 * The look clock now (struct emb_sched). A turn of the loop waits at most
 * tick_ms in poll, so a longer gap since the loop last ran is time it was
 * not looking: the scheduler was starved, stopped or the machine froze,
 * and the heartbeats that came meanwhile wait unread in sockets. It
 * counts as nobody's silence.
 */
static int64_t look_ms(struct emb_sched *s)
{
	int64_t now = (int64_t)emb_clock_ms();
	int64_t blind = now - s->look_last_ms - s->tick_ms;

	if (blind > STALL_MIN_MS) {
		s->blind_ms += blind;
		if (blind > s->stall_max_ms)
			s->stall_max_ms = blind;
		if (blind >= s->o.hb_timeout_ms / 2)
			emb_log(EMB_LOG_WARN,
				"scheduler: its loop did not run for %lld ms; "
				"that time does not count as any node's "
				"silence",
				(long long)blind);
	}
	s->look_last_ms = now;
	return now - s->blind_ms;
}

/* n's detector, started afresh when n registered (again) on a new
 * connection: the history of another process says nothing. */
static struct emb_detector *detector(struct emb_sched *s, struct node *n,
				     int64_t now)
{
	if (n->fd_conn != n->conn && n->conn) {
		emb_detector_init(&n->fd, s->o.hb_timeout_ms, now);
		n->fd_gen++;
		n->probing = false;
		n->closed_ms = 0; /* rejoined */
	}
	n->fd_conn = n->conn;
	return &n->fd;
}

/* Which probe of which node a result belongs to. */
struct probe_ref {
	struct emb_sched *s;
	uint32_t idx; /* in nodes */
	uint32_t gen; /* its fd_gen when the probe began */
};

/* How long a node away from the scheduler has to rejoin: after a restart,
 * or a server whose conn closed while it still answers probes. */
static int64_t rejoin_window_ms(const struct emb_sched *s)
{
	int64_t w = 2 * (int64_t)s->o.hb_timeout_ms;

	return w < EMB_SCHED_REJOIN_MS ? EMB_SCHED_REJOIN_MS : w;
}

static void probe_done(void *arg, int status, uint32_t took_ms)
{
	struct probe_ref *r = arg;
	struct emb_sched *s = r->s;
	struct node *n = &s->nodes[r->idx];
	char addr[EMB_WIRE_HOST_MAX + 16], why[160];
	int64_t now;

	s->nprobing--;
	if (s->over || n->fd_gen != r->gen || n->dead || n->finished)
		goto out;
	n->probing = false;
	now = look_ms(s);
	node_addr(n, addr, sizeof(addr));
	if (status == 0) {
		s->probes_answered++;
		emb_detector_touch(&n->fd, now);
		if (n->closed_ms && !n->conn)
			emb_log(EMB_LOG_WARN,
				"server %u (%s) closed its scheduler "
				"connection but answered a probe in %u ms: "
				"alive, waiting for it to rejoin",
				n->rank, addr, took_ms);
		else
			emb_log(EMB_LOG_WARN,
				"server %u (%s) answered a probe in %u ms: "
				"alive, only its heartbeats are late",
				n->rank, addr, took_ms);
		goto out;
	}
	if (n->closed_ms) {
		snprintf(why, sizeof(why),
			 "its connection closed, and a probe of its serving "
			 "address had no answer in %u ms: %s",
			 took_ms, emb_strerror(status));
		declare_dead(s, n, why);
		goto out;
	}
	/* A heartbeat may have come while the probe ran; and a scheduler
	 * that suspects itself probes again once it does not (a probe that
	 * timed out on a starved machine says as little as the silence). */
	if (!emb_detector_suspect(&n->fd, now) ||
	    (s->self_since_ms && !s->self_gave_up))
		goto out;
	snprintf(why, sizeof(why),
		 "silent for %lld ms, and a probe of its serving address had "
		 "no answer in %u ms: %s",
		 (long long)emb_detector_silence_ms(&n->fd, now), took_ms,
		 emb_strerror(status));
	declare_dead(s, n, why);
out:
	free(r);
}

/*
 * A silent server is only suspect: a probe of the address it serves on
 * settles it. 0 when a probe is under way (or waits for a free one), or
 * the error that keeps one from starting.
 */
static int probe(struct emb_sched *s, struct node *n, int64_t quiet)
{
	struct emb_probe_opts po = {0};
	char addr[EMB_WIRE_HOST_MAX + 16];
	struct probe_ref *r;
	int rc;

	if (s->nprobing >= PROBES_MAX)
		return 0;
	r = malloc(sizeof(*r));
	if (!r)
		return -ENOMEM;
	*r = (struct probe_ref){s, (uint32_t)(n - s->nodes), n->fd_gen};
	po.host = n->addr.host;
	po.port = n->addr.port;
	po.token = s->token_len ? s->token : NULL;
	po.token_len = s->token_len;
	po.timeout_ms = s->o.hb_timeout_ms;
	po.reply_to = s->tr;
	po.done = probe_done;
	po.arg = r;
	rc = emb_probe_start(&po);
	if (rc) {
		free(r);
		return rc;
	}
	n->probing = true;
	s->nprobing++;
	s->probes++;
	if (n->closed_ms)
		emb_log(EMB_LOG_WARN,
			"server %u (%s) closed its scheduler connection: "
			"probing it",
			n->rank, node_addr(n, addr, sizeof(addr)));
	else
		emb_log(EMB_LOG_WARN,
			"server %u (%s) silent for %lld ms, past the %u ms "
			"its heartbeats allow: probing it",
			n->rank, node_addr(n, addr, sizeof(addr)),
			(long long)quiet, emb_detector_suspect_ms(&n->fd));
	return 0;
}

/* The live node named by id, or NULL after answering req with an error. */
static struct node *node_of(struct emb_sched *s, struct emb_req *req,
			    uint32_t id)
{
	struct node *n;

	if (id == 0 || id > nnodes(s) || !s->nodes[id - 1].role) {
		send_error(s, req, EMB_ECLUSTER, "unknown node id");
		return NULL;
	}
	n = &s->nodes[id - 1];
	if (n->left && (!n->conn || n->conn == emb_req_conn(req))) {
		send_error(s, req, EMB_EDRAINED,
			   "this server was drained: it holds no slot and "
			   "leaves");
		return NULL;
	}
	/* A node speaks on the connection it registered on: a server
	 * declared dead whose rank a newcomer took is not that newcomer. */
	if (n->dead || (n->conn && n->conn != emb_req_conn(req))) {
		send_error(s, req, EMB_ENODEAD, "this node was declared dead");
		return NULL;
	}
	n->last_ms = (int64_t)emb_clock_ms();
	if (n->conn) {
		int64_t now = look_ms(s);

		emb_detector_touch(detector(s, n, now), now);
	}
	return n;
}

static void on_heartbeat(struct emb_sched *s, struct emb_req *req,
			 const struct emb_wire_frame *f)
{
	uint8_t *buf;
	size_t cap = EMB_WIRE_HDR_SIZE + 8 + 8ull * s->ndead;
	struct node *n;
	uint64_t seq;
	uint32_t id;
	int len, rc;

	rc = emb_wire_heartbeat_req_decode(f, &id, &seq);
	if (rc) {
		send_error(s, req, rc, "bad HEARTBEAT");
		return;
	}
	n = node_of(s, req, id);
	if (!n)
		return;
	if (n->conn)
		emb_detector_heard(&n->fd, look_ms(s));
	buf = malloc(cap);
	if (!buf) {
		send_error(s, req, -ENOMEM, "out of memory");
		return;
	}
	/* The epoch tells nodes of a replicated job when to fetch the map
	 * again; 0 keeps an unreplicated job's heartbeats as they were. */
	len = emb_wire_heartbeat_resp_encode(
	    buf, cap, req->hdr.req_id, s->state,
	    mapped(s) ? (uint32_t)s->cmap->epoch : 0,
	    s->dead, s->ndead);
	if (len < 0)
		send_error(s, req, len, "cannot encode HEARTBEAT response");
	else
		send_frame(s, req, buf, len);
	s->hbs++;
	free(buf);
}

static void on_map(struct emb_sched *s, struct emb_req *req,
		   const struct emb_wire_frame *f)
{
	struct node *n;
	uint32_t id, newer;
	int rc = emb_wire_map_req_decode(f, &id, &newer);

	if (rc) {
		send_error(s, req, rc, "bad CLUSTER_MAP");
		return;
	}
	if (id == 0) {
		/* An observer that has not joined: the map, if formed. */
		if (s->state == EMB_CLUSTER_FORMING)
			send_error(s, req, EMB_ECLUSTER, "cluster not ready");
		else
			send_map(s, req);
		return;
	}
	n = node_of(s, req, id);
	if (!n)
		return;
	if (s->nfatal) {
		send_error(s, req, EMB_ENODEAD, "a node died");
	} else if (s->state != EMB_CLUSTER_FORMING && newer && s->cmap &&
		   s->cmap->epoch <= newer) {
		/* A watch: held until the map changes (answer_watches()).
		 * A node keeps one; a second answers the first at once. */
		if (n->map_req)
			send_map(s, n->map_req);
		n->map_req = req;
	} else if (s->state != EMB_CLUSTER_FORMING) {
		send_map(s, req);
	} else if (n->map_req) {
		send_error(s, req, EMB_ECLUSTER, "map already requested");
	} else {
		n->map_req = req;
	}
}

/* A source streamed a chunk (or failed to): the fill's next step. */
static void on_fill_done(struct emb_sched *s, struct emb_req *req,
			 const struct emb_wire_frame *f)
{
	struct emb_wire_fill_done_req d;
	struct node *n;
	int rc = emb_wire_fill_done_req_decode(f, &d);

	if (rc) {
		send_error(s, req, rc, "bad FILL_DONE");
		return;
	}
	n = node_of(s, req, d.node_id);
	if (!n)
		return;
	/* Only the fill under way, from its source: a report of a fill
	 * that a death or a timeout ended since changes nothing. A copy
	 * ahead's report counts whatever its epoch: one begun again after
	 * a death is the same copy (its source does not start it again),
	 * and the source streams everything should the epochs show a gap
	 * (docs/replication.md, "Moving slots"). */
	if (s->fill_rank == NO_FILL ||
	    (d.epoch < s->fill_epoch && (!s->warming || s->warm_fresh)) ||
	    d.first != s->fill_first || d.n != s->fill_n ||
	    n->role != EMB_ROLE_SERVER ||
	    emb_cmap_primary(s->cmap, d.first) != n->rank) {
		send_error(s, req, EMB_ECLUSTER, "no such fill under way");
		return;
	}
	send_ack(s, req, EMB_OP_FILL_DONE, 0);
	if (d.status) {
		fill_failed(s, emb_strerror(d.status));
		return;
	}
	s->streamed_rows += d.rows;
	s->streamed_bytes += d.bytes;
	if (s->warming || s->move_from != NO_FILL) {
		s->move_rows += d.rows;
		s->move_bytes += d.bytes;
	} else {
		s->fill_rows += d.rows;
		s->fill_bytes += d.bytes;
	}
	if (s->warming) {
		fence_move(s, NULL);
		return;
	}
	if (s->move_from != NO_FILL) {
		/* The target takes its source's place: the next map drops a
		 * writer, never adds one, so writes in flight lose nothing. */
		emb_cmap_move_done(s->cmap, s->move_from, s->fill_rank,
				   d.first, d.n, s->cmap);
		s->move_chunks++;
		s->move_slots += d.n;
		s->moved_slots += d.n;
		s->fill_fails = 0;
		emb_log(EMB_LOG_DEBUG,
			"map epoch %llu: server %u holds slots %u-%u in server "
			"%u's place (%lld ms)",
			(unsigned long long)s->cmap->epoch, s->fill_rank,
			d.first, d.first + d.n - 1, s->move_from,
			(long long)((int64_t)emb_clock_ms() - s->fill_chunk_ms));
		s->move_first = (d.first + d.n) % EMB_NSLOTS;
		s->fill_rank = s->move_from = NO_FILL;
		republish(s);
		move_next(s);
		return;
	}
	emb_cmap_fill_done(s->cmap, s->fill_rank, d.first, d.n, s->cmap);
	s->fill_chunks++;
	emb_log(EMB_LOG_DEBUG,
		"map epoch %llu: server %u holds slots %u-%u (%lld ms)",
		(unsigned long long)s->cmap->epoch, s->fill_rank, d.first,
		d.first + d.n - 1,
		(long long)((int64_t)emb_clock_ms() - s->fill_chunk_ms));
	s->fill_first = (d.first + d.n) % EMB_NSLOTS;
	/* fill_next() publishes; the done chunk rides in the same map. */
	fill_next(s);
	republish(s);
}

/*
 * DRAIN (embstore scale --remove): the server's slots move to the others,
 * then it leaves. Answered once queued; the moves follow in the map.
 */
static void on_drain(struct emb_sched *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	char msg[160], addr[EMB_WIRE_HOST_MAX + 16];
	uint32_t rank, staying = 0;
	struct node *n;
	int rc = emb_wire_drain_req_decode(f, &rank);

	if (rc) {
		send_error(s, req, rc, "bad DRAIN");
		return;
	}
	if (s->state != EMB_CLUSTER_READY || !s->cmap || s->over) {
		send_error(s, req, EMB_ECLUSTER, "the job is not running");
		return;
	}
	if (s->nfatal) {
		send_error(s, req, EMB_ENODEAD, "a node died");
		return;
	}
	if (rank >= s->o.server_num ||
	    s->nodes[rank].role != EMB_ROLE_SERVER) {
		snprintf(msg, sizeof(msg), "no server rank %u (the job has %u)",
			 rank, s->o.server_num);
		send_error(s, req, EMB_EBADARG, msg);
		return;
	}
	n = &s->nodes[rank];
	if (n->left || n->draining) {
		send_ack(s, req, EMB_OP_DRAIN, 0); /* asked before */
		return;
	}
	if (n->dead) {
		snprintf(msg, sizeof(msg), "server %u is dead", rank);
		send_error(s, req, EMB_ENODEAD, msg);
		return;
	}
	/* Unreplicated, clients route by primaries alone and send writes
	 * no epoch: a move's fence and new writer would go unseen. A move
	 * has R + 1 writers, which a map of the most copies cannot list. */
	if (!mapped(s) || s->cmap->replicas >= EMB_CMAP_REPLICAS_MAX) {
		snprintf(msg, sizeof(msg),
			 "moving slots needs a job with ranks to spare "
			 "(--server_max) or replicas, at most %u copies",
			 EMB_CMAP_REPLICAS_MAX - 1);
		send_error(s, req, EMB_ECLUSTER, msg);
		return;
	}
	for (uint32_t i = 0; i < s->o.server_num; i++)
		staying += i != rank && s->nodes[i].role == EMB_ROLE_SERVER &&
			   !s->nodes[i].dead && !s->nodes[i].draining;
	if (staying < s->cmap->replicas) {
		snprintf(msg, sizeof(msg),
			 "%u server%s would stay for %u copies of each slot",
			 staying, staying == 1 ? "" : "s", s->cmap->replicas);
		send_error(s, req, EMB_ECLUSTER, msg);
		return;
	}
	n->draining = true;
	n->joining = false;
	if (s->fill_rank == NO_FILL)
		move_clock(s);
	emb_log(EMB_LOG_INFO,
		"server %u (%s) drains: its %u slots move to the others",
		rank, node_addr(n, addr, sizeof(addr)), held_slots(s, rank));
	send_ack(s, req, EMB_OP_DRAIN, 0);
	move_next(s);
}

static void on_barrier(struct emb_sched *s, struct emb_req *req,
		       const struct emb_wire_frame *f)
{
	struct emb_wire_barrier_req b;
	struct node *n;
	int rc = emb_wire_barrier_req_decode(f, &b);

	if (rc) {
		send_error(s, req, rc, "bad BARRIER");
		return;
	}
	n = node_of(s, req, b.node_id);
	if (!n)
		return;
	if (n->role != EMB_ROLE_WORKER || n->barrier_req || n->finished) {
		send_error(s, req, EMB_ECLUSTER,
			   "barrier from a server, twice, or after finish");
		return;
	}
	if (s->nfatal) {
		send_error(s, req, EMB_ENODEAD, "a node died");
		return;
	}
	n->barrier_req = req;
	memcpy(n->barrier, b.name, b.name_len);
	n->barrier[b.name_len] = '\0';
	check_barrier(s, n->barrier);
}

static void on_finish(struct emb_sched *s, struct emb_req *req,
		      const struct emb_wire_frame *f)
{
	struct node *n;
	uint32_t id;
	bool hold;
	int rc = emb_wire_finish_req_decode(f, &id, &hold);

	if (rc) {
		send_error(s, req, rc, "bad FINISH");
		return;
	}
	n = node_of(s, req, id);
	if (!n)
		return;
	if (hold && n->role != EMB_ROLE_SERVER) {
		send_error(s, req, EMB_EBADARG, "a FINISH hold is a server's");
		return;
	}
	if (hold && s->nfatal) {
		send_error(s, req, EMB_ENODEAD, "a node died");
		return;
	}
	if (hold && s->state != EMB_CLUSTER_FINISHING) {
		/* Answered by answer_holds(); one per node, as a map watch. */
		if (n->finish_req)
			send_error(s, n->finish_req, EMB_ECLUSTER,
				   "another FINISH hold took its place");
		n->finish_req = req;
		return;
	}
	if (n->role == EMB_ROLE_SERVER && s->state != EMB_CLUSTER_FINISHING) {
		send_error(s, req, EMB_ECLUSTER, "the job is not finishing");
		return;
	}
	if (!n->finished)
		emb_log(EMB_LOG_INFO, "%s %u finished", emb_role_name(n->role),
			n->rank);
	n->finished = true;
	/* Recorded before the ack: a worker told it is done may exit, and
	 * a restarted scheduler must not wait for it to rejoin. */
	state_save(s);
	send_ack(s, req, EMB_OP_FINISH, 0);
	check_end(s);
}

/* MOVES (embstore stat --sched): the drain, join or recovery under way,
 * from the state the loop keeps. */
static void on_moves(struct emb_sched *s, struct emb_req *req,
		     const struct emb_wire_frame *f)
{
	_Alignas(8) uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_MOVES_RESP_SIZE];
	struct emb_wire_moves m = {.from = UINT32_MAX, .to = UINT32_MAX,
				   .eta_ms = -1};
	const int64_t now = (int64_t)emb_clock_ms();
	uint32_t waiting = 0;
	int rc = emb_wire_moves_req_decode(f), len;

	if (rc) {
		send_error(s, req, rc, "bad MOVES");
		return;
	}
	for (uint32_t i = 0; i < s->o.server_num; i++) {
		const struct node *n = &s->nodes[i];

		if (n->dead)
			continue;
		if (n->draining && !n->empty_ms) {
			waiting++;
			if (m.kind != EMB_WIRE_MOVE_DRAIN) {
				m.kind = EMB_WIRE_MOVE_DRAIN;
				m.rank = n->rank;
			}
		} else if (n->joining) {
			waiting++;
			if (m.kind == EMB_WIRE_MOVE_NONE) {
				m.kind = EMB_WIRE_MOVE_JOIN;
				m.rank = n->rank;
			}
		}
	}
	m.queued = waiting ? waiting - 1 : 0;
	if (s->fill_rank != NO_FILL && s->fill_n) {
		m.phase = s->warming ? 1 : 2;
		m.first = s->fill_first;
		m.n = s->fill_n;
		m.to = s->fill_rank;
		m.from = s->move_from == NO_FILL ? UINT32_MAX : s->move_from;
		if (s->move_from == NO_FILL) {
			/* A recovery: it runs before any move. */
			m.kind = EMB_WIRE_MOVE_RECOVERY;
			m.rank = s->fill_rank;
			m.queued = waiting;
		}
	}
	if (m.kind == EMB_WIRE_MOVE_RECOVERY) {
		m.elapsed_ms = (uint64_t)(now - s->fill_ms);
		m.rows = s->fill_rows;
		m.bytes = s->fill_bytes;
	} else if (m.kind != EMB_WIRE_MOVE_NONE) {
		m.rows = s->move_rows;
		m.bytes = s->move_bytes;
		m.moved = s->move_slots;
		m.left = s->move_from != NO_FILL ? s->move_left : 0;
		m.elapsed_ms = (uint64_t)(now - s->move_ms);
		m.eta_ms = m.left ? move_eta_ms(s) : -1;
	}
	len = emb_wire_moves_resp_encode(buf, sizeof(buf), req->hdr.req_id, &m);
	if (len < 0) {
		send_error(s, req, EMB_EINTERNAL, "cannot encode MOVES");
		return;
	}
	send_frame(s, req, buf, len);
}

static void on_request(void *arg, struct emb_conn *conn, struct emb_req *req,
		       const struct emb_frame_hdr *hdr, void *payload)
{
	struct emb_sched *s = arg;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {
	    .hdr = *hdr, .payload = payload, .lim = &lim};

	if (hdr->opcode & EMB_OP_RESPONSE_BIT) {
		send_error(s, req, EMB_EBADOP, "a response sent as a request");
		return;
	}
	if (hdr->opcode == EMB_OP_HELLO) {
		on_hello(s, conn, req, &f);
		return;
	}
	/* With a token nothing counts before HELLO: no rank, no map. */
	if (s->token_len && !emb_conn_user(conn)) {
		emb_log(EMB_LOG_WARN, "%s: %s before HELLO refused",
			emb_conn_peer(conn),
			hdr->opcode == EMB_OP_REGISTER ? "REGISTER" : "request");
		refuse_and_close(s, req, EMB_ENOHELLO,
				 "this scheduler takes HELLO with the "
				 "cluster's token first");
		return;
	}
	switch (hdr->opcode) {
	case EMB_OP_REGISTER:
		if (conn_node(conn))
			send_error(s, req, EMB_ECLUSTER,
				   "connection already registered");
		else
			on_register(s, conn, req, &f);
		break;
	case EMB_OP_HEARTBEAT:
		on_heartbeat(s, req, &f);
		break;
	case EMB_OP_CLUSTER_MAP:
		on_map(s, req, &f);
		break;
	case EMB_OP_BARRIER:
		on_barrier(s, req, &f);
		break;
	case EMB_OP_FINISH:
		on_finish(s, req, &f);
		break;
	case EMB_OP_FILL_DONE:
		on_fill_done(s, req, &f);
		break;
	case EMB_OP_DRAIN:
		on_drain(s, req, &f);
		break;
	case EMB_OP_MOVES:
		on_moves(s, req, &f);
		break;
	default:
		send_error(s, req, -EOPNOTSUPP,
			   "a scheduler serves cluster requests only");
		break;
	}
}

/* A node's connection closed: held requests die with it. */
static void on_close(void *arg, struct emb_conn *conn, int reason)
{
	struct emb_sched *s = arg;
	struct node *n = conn_node(conn);
	struct emb_req **held[3];

	if (!n)
		return;
	/* Requests held on this conn die with it, even where the rank is
	 * another conn's now (a newcomer whose REGISTER was read before
	 * the close of the drained or dead server it replaces): after this
	 * callback the conn is gone, and a request left held on it would
	 * be answered on freed memory. */
	held[0] = &n->map_req;
	held[1] = &n->barrier_req;
	held[2] = &n->finish_req;
	for (int i = 0; i < 3; i++)
		if (*held[i] && emb_req_conn(*held[i]) == conn) {
			emb_req_release(*held[i]);
			*held[i] = NULL;
		}
	/* The conn of an earlier incarnation of the rank (declared dead,
	 * its rank since taken, or rejoined on a new conn) closing says
	 * nothing else of the node holding the rank now. */
	if (n->conn != conn)
		return;
	n->conn = NULL;
	/* The next conn starts the detector afresh, even one the allocator
	 * places where this one was (detector() compares pointers). */
	n->fd_conn = NULL;
	/* A node that is done may go; one that is not has failed; one
	 * declared dead is past judging (no probe of it: its rank may be
	 * taken next). */
	if (n->finished || s->over || n->dead)
		return;
	/* Except a server of a formed cluster: restarted from its
	 * checkpoint on its address, it may register again, and until the
	 * heartbeat timeout passes it is only missing (workers retry). Not
	 * when replicated: its backups have every update since, and its
	 * checkpoint does not, so it fails over at once. */
	if (n->role == EMB_ROLE_SERVER && s->state == EMB_CLUSTER_READY &&
	    s->o.replicas <= 1) {
		char addr[EMB_WIRE_HOST_MAX + 16];

		emb_log(EMB_LOG_WARN,
			"server %u (%s) lost: %s; dead unless it registers "
			"again within %u ms",
			n->rank, node_addr(n, addr, sizeof(addr)),
			reason ? emb_strerror(reason) : "connection closed",
			s->o.hb_timeout_ms);
		return;
	}
	/* Replicated: a killed server refuses the probe at once and fails
	 * over in milliseconds; a live one whose node agent gave up on a
	 * scheduler it heard nothing from (a stall of either) still serves,
	 * answers, and rejoins on a new conn. A closed conn alone is no
	 * verdict: that false verdict ends jobs on loaded machines. */
	if (n->role == EMB_ROLE_SERVER && s->state == EMB_CLUSTER_READY &&
	    s->cmap && s->cmap->replicas > 1) {
		int rc;

		n->closed_ms = look_ms(s);
		if (n->probing)
			return; /* the probe under way decides */
		rc = probe(s, n, 0);
		if (rc == 0)
			return;
		emb_log(EMB_LOG_WARN, "server %u: cannot probe: %s", n->rank,
			emb_strerror(rc));
	}
	declare_dead(s, n,
		     reason ? emb_strerror(reason) : "connection closed");
}

/* ---- loop ----------------------------------------------------------- */

/*
 * True while the scheduler suspects itself (SELF_MIN, SELF_DIV): too many
 * of the nodes it follows are overdue at once. That time is counted as
 * not looking, like a stall of the loop, so their silence stops growing
 * until they are heard again; past SELF_MAX_FACTOR * T of it without
 * relief, false: the silence is real.
 */
static bool self_suspect(struct emb_sched *s, int64_t now)
{
	const int64_t half = s->o.hb_timeout_ms / 2;
	int64_t mono = (int64_t)emb_clock_ms(), gap;
	uint32_t followed = 0, overdue = 0;

	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *n = &s->nodes[i];

		if (!n->role || n->dead || n->finished || !n->conn)
			continue;
		followed++;
		if (emb_detector_silence_ms(detector(s, n, now), now) > half)
			overdue++;
	}
	if (overdue < SELF_MIN || overdue * SELF_DIV < followed) {
		if (s->self_since_ms)
			emb_log(EMB_LOG_WARN,
				"scheduler: %u of %u nodes overdue after %lld "
				"ms of suspecting itself: verdicts resume",
				overdue, followed,
				(long long)(mono - s->self_since_ms));
		s->self_since_ms = 0;
		s->self_gave_up = false;
		return false;
	}
	if (!s->self_since_ms) {
		s->self_since_ms = s->self_last_ms = mono;
		s->self_blind_ms = s->blind_ms;
		s->self_episodes++;
		emb_log(EMB_LOG_WARN,
			"scheduler: %u of the %u nodes it follows are silent "
			"at once: it suspects itself, and their silence does "
			"not count until they are heard again (at most %lld "
			"ms)",
			overdue, followed,
			(long long)SELF_MAX_FACTOR * s->o.hb_timeout_ms);
		return true;
	}
	if (s->self_gave_up)
		return false;
	if (mono - s->self_since_ms >
	    SELF_MAX_FACTOR * (int64_t)s->o.hb_timeout_ms) {
		s->self_gave_up = true;
		emb_log(EMB_LOG_WARN,
			"scheduler: %u of %u nodes still silent after %lld ms "
			"of suspecting itself: taking their silence as real",
			overdue, followed,
			(long long)(mono - s->self_since_ms));
		return false;
	}
	/* Less what look_ms() counted meanwhile (a stall within it). */
	gap = mono - s->self_last_ms - (s->blind_ms - s->self_blind_ms);
	if (gap > 0)
		s->blind_ms += gap;
	s->self_last_ms = mono;
	s->self_blind_ms = s->blind_ms;
	return true;
}

/*
 * Each turn: silence past a node's suspect time (its detector's, never
 * under T) makes a worker dead and a server suspect, and a suspect server
 * is probed before any verdict. A server that lost its connection waits
 * T to register again, as it always did.
 */
static void check_silence(struct emb_sched *s)
{
	int64_t now = look_ms(s), quiet;
	char why[96];

	if (self_suspect(s, now))
		goto fill;
	now = look_ms(s);
	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *n = &s->nodes[i];
		struct emb_detector *d;

		if (!n->role || n->dead || n->finished)
			continue;
		d = detector(s, n, now);
		if (n->closed_ms && !n->conn) {
			/* Closed, and answered its probe: it has the rejoin
			 * window to come back on a new conn. */
			int64_t gone = now - n->closed_ms;

			if (n->probing || gone <= rejoin_window_ms(s))
				continue;
			snprintf(why, sizeof(why),
				 "its connection closed %lld ms ago and it "
				 "did not rejoin",
				 (long long)gone);
			declare_dead(s, n, why);
			continue;
		}
		quiet = emb_detector_silence_ms(d, now);
		if (n->conn ? !emb_detector_suspect(d, now) || n->probing
			    : quiet <= s->o.hb_timeout_ms)
			continue;
		if (n->conn && n->role == EMB_ROLE_WORKER &&
		    quiet <= WORKER_SILENT_FACTOR * (int64_t)s->o.hb_timeout_ms)
			continue;
		if (n->conn && n->role == EMB_ROLE_SERVER) {
			int rc = probe(s, n, quiet);

			if (rc == 0)
				continue;
			emb_log(EMB_LOG_WARN, "server %u: cannot probe: %s",
				n->rank, emb_strerror(rc));
		}
		snprintf(why, sizeof(why), "silent for %lld ms",
			 (long long)quiet);
		declare_dead(s, n, why);
	}
fill:
	if (s->fill_rank != NO_FILL &&
	    (int64_t)emb_clock_ms() - s->fill_chunk_ms > FILL_TIMEOUT_MS)
		fill_failed(s, "its source did not report in time");
	drain_leave(s);
}

/* Loop thread: publishes the counts for emb_sched_stats(). */
static void publish(struct emb_sched *s)
{
	struct emb_sched_stats v = {0};

	v.state = s->over ? 0 : s->state;
	v.expected[0] = s->o.server_num;
	v.expected[1] = s->o.worker_num;
	for (uint32_t i = 0; i < nnodes(s); i++) {
		const struct node *n = &s->nodes[i];
		uint32_t k = n->role == EMB_ROLE_SERVER ? 0 : 1;

		if (!n->role)
			continue;
		if (n->dead)
			v.dead[k]++;
		else if (n->finished)
			v.finished[k]++;
		else
			v.alive[k]++;
		if (n->barrier_req)
			v.barrier_waiting++;
	}
	v.barriers_completed = s->barriers;
	v.heartbeats = s->hbs;
	v.map_epoch = s->cmap ? s->cmap->epoch : 0;
	v.replicas = s->o.replicas ? s->o.replicas : 1;
	v.lost_slots = s->cmap ? emb_cmap_lost_slots(s->cmap) : 0;
	v.filling = s->fill_rank;
	v.recoveries = s->recoveries;
	v.moving_from = s->move_from;
	v.slots_moved = s->moved_slots;
	v.move_slots_left = s->move_from != NO_FILL ? s->move_left : 0;
	v.move_eta_ms = v.move_slots_left ? move_eta_ms(s) : -1;
	v.move_rows = s->move_from != NO_FILL ? s->move_rows : 0;
	v.move_bytes = s->move_from != NO_FILL ? s->move_bytes : 0;
	v.rows_streamed = s->streamed_rows;
	v.bytes_streamed = s->streamed_bytes;
	v.drains = s->drains;
	v.joins = s->joins;
	for (uint32_t i = 0; i < s->o.server_num; i++) {
		v.draining += s->nodes[i].draining;
		v.joining += s->nodes[i].joining;
	}
	v.probes = s->probes;
	v.probes_answered = s->probes_answered;
	v.blind_ms = (uint64_t)s->blind_ms;
	v.stall_max_ms = (uint64_t)s->stall_max_ms;
	v.self_suspicions = s->self_episodes;
	v.self_suspect = s->self_since_ms && !s->self_gave_up;
	pthread_mutex_lock(&s->mu);
	s->view = v;
	/* Counted again only when the map changed: 4096 * R steps. */
	if (s->cmap && s->cmap->epoch != s->slots_epoch) {
		if (!s->slots)
			s->slots = calloc(s->o.server_num, sizeof(*s->slots));
		if (s->slots) {
			memset(s->slots, 0,
			       s->o.server_num * sizeof(*s->slots));
			for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
				for (uint32_t i = 0; i < s->cmap->replicas;
				     i++) {
					uint16_t r = s->cmap->slot[sl][i];

					if (r == EMB_CMAP_NONE)
						break;
					s->slots[r][i > 0]++;
				}
				if (s->cmap->fill[sl] != EMB_CMAP_NONE)
					s->slots[s->cmap->fill[sl]][2]++;
			}
			s->slots_epoch = s->cmap->epoch;
		}
	}
	pthread_mutex_unlock(&s->mu);
}

/* Loop thread, at its end: what the loop cost, for sizing a job. */
static void log_summary(const struct emb_sched *s)
{
	struct rusage ru;
	double cpu = 0;

	if (getrusage(RUSAGE_THREAD, &ru) == 0)
		cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
		      (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
	emb_log(EMB_LOG_INFO,
		"scheduler loop: %llu heartbeats answered, cpu %.2f s, "
		"longest stall %lld ms, %lld ms not looking, suspected "
		"itself %llu time%s",
		(unsigned long long)s->hbs, cpu, (long long)s->stall_max_ms,
		(long long)s->blind_ms, (unsigned long long)s->self_episodes,
		s->self_episodes == 1 ? "" : "s");
}

/*
 * The job is over and its last replies are out: may the loop end? Once
 * every node closed its conn, or LINGER_MS after the end. A process
 * that closes a socket with input unread (a heartbeat that crossed the
 * end) resets it, and a reset drops whatever of the last replies the
 * kernel had not sent yet: the FINISH ack a worker waits for, which it
 * would take for a lost scheduler and wait up to the rejoin grace to
 * find again. Nodes close their conn once answered, so the wait is
 * short; one that does not (a program that goes on after its finish)
 * holds the end back LINGER_MS at most.
 */
static bool lingered(const struct emb_sched *s)
{
	if ((int64_t)emb_clock_ms() - s->over_ms >= LINGER_MS)
		return true;
	for (uint32_t i = 0; i < nnodes(s); i++)
		if (s->nodes[i].conn)
			return false;
	return true;
}

static void *loop_main(void *arg)
{
	struct emb_sched *s = arg;
	int tick = (int)s->tick_ms, rc;
	const int64_t quarter = s->tick_ms / 4;

	for (;;) {
		int64_t now, wait;
		bool stop;

		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		/* The job's last replies go out before the loop ends, and
		 * the nodes close first (lingered()). */
		if (stop || (s->over && s->replies == 0 && lingered(s)))
			break;
		/* Waits no longer than until the next check is due: look_ms()
		 * takes a gap past one tick since it last ran for a stall. */
		wait = tick - ((int64_t)emb_clock_ms() - s->checked_ms);
		rc = emb_transport_poll(s->tr, (int)(wait < 0 ? 0
					     : wait > tick ? tick : wait));
		/* A signal (a child stopping, say) is no reason to stop. */
		if (rc < 0 && rc != -EINTR) {
			emb_log(EMB_LOG_ERROR, "scheduler loop failed: %s",
				emb_strerror(rc));
			break;
		}
		/* Both walk every node: once per quarter tick, not once
		 * per wakeup, or a turn per heartbeat makes the loop's work
		 * grow with the square of the node count. */
		now = (int64_t)emb_clock_ms();
		if (now - s->checked_ms < quarter)
			continue;
		s->checked_ms = now;
		if (!s->over)
			check_silence(s);
		publish(s);
	}
	publish(s);
	log_summary(s);
	if (!s->over)
		return NULL;
	pthread_mutex_lock(&s->mu);
	s->done = true;
	s->status = s->nfatal ? EMB_ENODEAD : 0;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->o.on_done)
		s->o.on_done(s->o.arg, s->status);
	return NULL;
}

/*
 * Creating thread, before the loop starts: takes up the job in the state
 * file, if there is one. Its live nodes get the rejoin window before
 * check_silence() may declare them dead (their last sign of life is set
 * ahead, in last_ms and the detector), and
 * a fill that was under way starts its chunk again: whether the last one
 * streamed died with the old scheduler. 0, or what
 * emb_sched_state_load() returns (-ENOENT aside: a first start), or
 * -EINVAL when the file is another job's shape.
 */
static int state_restore(struct emb_sched *s)
{
	struct emb_sched_state st;
	uint32_t R = s->o.replicas ? s->o.replicas : 1, live = 0;
	int64_t window = rejoin_window_ms(s);
	bool moves = false;
	int rc;

	if (!s->state_path)
		return 0;
	rc = emb_sched_state_load(s->state_path, &st);
	if (rc == -ENOENT)
		return 0;
	if (rc) {
		emb_log(EMB_LOG_ERROR,
			"state file %s: %s: move it away to start a new job",
			s->state_path, emb_strerror(rc));
		return rc;
	}
	if (st.server_num != s->o.server_num ||
	    st.worker_num != s->o.worker_num || st.replicas != R) {
		emb_log(EMB_LOG_ERROR,
			"state file %s holds a job of %u servers, %u workers "
			"and %u copies, not %u, %u and %u",
			s->state_path, st.server_num, st.worker_num,
			st.replicas, s->o.server_num, s->o.worker_num, R);
		rc = -EINVAL;
		goto out;
	}
	if (st.ndead > s->dead_cap) {
		struct emb_wire_node_ref *d =
		    realloc(s->dead, st.ndead * sizeof(*d));

		if (!d) {
			rc = -ENOMEM;
			goto out;
		}
		s->dead = d;
		s->dead_cap = st.ndead;
	}
	s->state = st.state;
	s->cluster_id = st.cluster_id;
	for (uint32_t i = 0; i < nnodes(s); i++) {
		struct node *n = &s->nodes[i];
		const struct emb_sched_state_node *sn = &st.nodes[i];

		if (!sn->role)
			continue;
		n->role = sn->role;
		n->rank = i < s->o.server_num ? i : i - s->o.server_num;
		n->pid = sn->pid;
		n->addr = sn->addr;
		n->dead = sn->dead;
		n->finished = sn->finished;
		n->draining = sn->draining;
		n->joining = sn->joining;
		n->left = sn->left;
		moves |= sn->draining || sn->joining;
		snprintf(n->peer, sizeof(n->peer), "(not rejoined)");
		/* check_silence() counts from here: the window, not one
		 * heartbeat timeout, to come back. */
		n->last_ms = (int64_t)emb_clock_ms() + window -
			     (int64_t)s->o.hb_timeout_ms;
		/* The detector judges silence: start it there too, so the
		 * rejoin window holds; its first connection starts it anew. */
		emb_detector_init(&n->fd, s->o.hb_timeout_ms, n->last_ms);
		if (n->role == EMB_ROLE_SERVER)
			s->nservers++;
		else
			s->nworkers++;
		live += !n->dead && !n->finished;
	}
	memcpy(s->dead, st.dead, st.ndead * sizeof(*s->dead));
	s->ndead = st.ndead;
	s->cmap = st.cmap; /* NULL unreplicated: build_map() makes it */
	st.cmap = NULL;
	/* A move's copy ahead is not taken up: it starts again if asked. */
	if (s->cmap)
		emb_cmap_warm_end(s->cmap, s->cmap);
	emb_log(EMB_LOG_INFO,
		"state file %s: taking up cluster %016llx at map epoch %llu; "
		"%u node%s to rejoin within %lld ms",
		s->state_path, (unsigned long long)s->cluster_id,
		(unsigned long long)(s->cmap ? s->cmap->epoch : 1), live,
		live == 1 ? "" : "s", (long long)window);
	build_map(s);
	if (st.fill_rank != EMB_SCHED_STATE_NO_FILL && st.move && s->cmap) {
		/* A move's chunk: its fence is lifted (the chunk's holders
		 * are as before it); move_next() below moves it again. */
		emb_log(EMB_LOG_INFO,
			"the move of slots %u-%u from server %u to server %u "
			"starts again",
			st.fill_first, st.fill_first + st.fill_n - 1,
			st.move_from, st.fill_rank);
		emb_cmap_fill_abort(s->cmap, st.fill_rank, st.fill_first,
				    st.fill_n, s->cmap);
		republish(s);
	} else if (st.fill_rank != EMB_SCHED_STATE_NO_FILL && s->cmap &&
		   !s->nodes[st.fill_rank].dead) {
		s->fill_rank = st.fill_rank;
		s->fill_first = st.fill_first;
		s->fill_n = st.fill_n;
		s->fill_fails = st.fill_fails;
		s->fill_ms = (int64_t)emb_clock_ms();
		s->fill_rows = s->fill_bytes = 0;
		emb_log(EMB_LOG_INFO,
			"server %u was being filled (slots %u-%u): that "
			"chunk starts again",
			s->fill_rank, s->fill_first,
			s->fill_first + s->fill_n - 1);
		emb_cmap_fill_abort(s->cmap, s->fill_rank, s->fill_first,
				    s->fill_n, s->cmap);
		fill_next(s);
		republish(s);
	} else if (s->cmap) {
		/* A filled server that died: its fill entries went with it
		 * (emb_cmap_remove()), nothing to start again. */
		state_save(s);
	}
	/* Drains and joins asked for go on, after a recovery fill under
	 * way if there is one (move_next() waits for it). */
	if (moves && s->cmap) {
		move_clock(s);
		emb_log(EMB_LOG_INFO, "the drains and joins asked for go on");
		move_next(s);
		s->warm_fresh = s->warming && st.fill_rank !=
						  EMB_SCHED_STATE_NO_FILL &&
				st.move;
		republish(s);
	}
	/* Every worker may have finished just before the restart. */
	check_end(s);
	if (!s->map)
		rc = -ENOMEM;
out:
	emb_sched_state_free(&st);
	return rc;
}

int emb_sched_create(const struct emb_sched_opts *opts, struct emb_sched **out)
{
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_sched *s;
	int rc;

	if (!opts || !out || !opts->host ||
	    strlen(opts->host) > EMB_WIRE_HOST_MAX || opts->server_num == 0 ||
	    opts->server_num > EMB_WIRE_SERVERS_MAX || opts->worker_num == 0 ||
	    opts->worker_num > EMB_WIRE_WORKERS_MAX || !opts->hb_timeout_ms ||
	    opts->replicas > EMB_WIRE_REPLICAS_MAX ||
	    opts->replicas > opts->server_num ||
	    opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token) ||
	    (opts->server_max && (opts->server_max < opts->server_num ||
				  opts->server_max > EMB_WIRE_SERVERS_MAX)) ||
	    /* A move has one writer more than a slot's copies. */
	    (opts->server_max > opts->server_num &&
	     opts->replicas >= EMB_CMAP_REPLICAS_MAX))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->o = *opts;
	s->start = opts->server_num;
	if (opts->server_max)
		s->o.server_num = opts->server_max;
	snprintf(s->host, sizeof(s->host), "%s", opts->host);
	s->o.host = s->host;
	s->token_len = opts->auth_token_len;
	if (opts->auth_token_len)
		memcpy(s->token, opts->auth_token, opts->auth_token_len);
	s->o.auth_token = NULL;
	s->state = EMB_CLUSTER_FORMING;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (getrandom(&s->cluster_id, sizeof(s->cluster_id), 0) !=
	    sizeof(s->cluster_id))
		s->cluster_id = (uint64_t)(int64_t)emb_clock_ms();
	s->nodes = calloc(nnodes(s), sizeof(*s->nodes));
	s->dead_cap = nnodes(s);
	s->dead = calloc(s->dead_cap, sizeof(*s->dead));
	s->fill_rank = NO_FILL;
	s->move_from = NO_FILL;
	s->tick_ms = s->o.hb_timeout_ms / 10;
	if (s->tick_ms < 1)
		s->tick_ms = 1;
	if (s->tick_ms > 200)
		s->tick_ms = 200;
	s->look_last_ms = (int64_t)emb_clock_ms();
	s->state_path = opts->state_file && *opts->state_file
			    ? strdup(opts->state_file)
			    : NULL;
	s->o.state_file = NULL;
	if (!s->nodes || !s->dead || emb_authlimit_create(&s->authlimit) ||
	    (opts->state_file && *opts->state_file && !s->state_path)) {
		rc = -ENOMEM;
		goto err_free;
	}
	rc = state_restore(s);
	if (rc)
		goto err_free;
	topts.call_timeout_ms = 0;
	topts.max_frame_bytes = 1u << 20;
	topts.reject_encode = emb_wire_reject_encode;
	rc = emb_transport_create("tcp", &topts, &s->tr);
	if (rc)
		goto err_free;
	lo.host = s->host;
	lo.port = opts->port;
	lo.on_request = on_request;
	lo.on_close = on_close;
	lo.arg = s;
	/* Every node of a job registers within moments of the others. */
	lo.backlog = 4096;
	rc = emb_listener_create(s->tr, &lo, &s->lis);
	if (rc)
		goto err_tr;
	rc = emb_thread_start(&s->thread, NULL, loop_main, s, "emb-sched");
	if (rc)
		goto err_lis;
	s->running = true;
	emb_log(EMB_LOG_INFO,
		"scheduler listening on %s:%u: waiting for %u server%s and "
		"%u worker%s, heartbeat timeout %u ms",
		s->host, emb_listener_port(s->lis), opts->server_num,
		opts->server_num == 1 ? "" : "s", opts->worker_num,
		opts->worker_num == 1 ? "" : "s", opts->hb_timeout_ms);
	if (opts->replicas > 1)
		emb_log(EMB_LOG_INFO,
			"%u copies of each slot: a server death they cover "
			"does not stop the job",
			opts->replicas);
	*out = s;
	return 0;

err_lis:
	emb_listener_destroy(s->lis);
err_tr:
	emb_transport_destroy(s->tr);
err_free:
	emb_authlimit_destroy(s->authlimit);
	map_frame_put(s->map);
	free(s->state_path);
	free(s->cmap);
	free(s->slots);
	free(s->dead);
	free(s->nodes);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
	return rc;
}

uint16_t emb_sched_port(const struct emb_sched *s)
{
	return emb_listener_port(s->lis);
}

int emb_sched_wait(struct emb_sched *s, int timeout_ms)
{
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (timeout_ms >= 0) {
		ts.tv_sec += timeout_ms / 1000;
		ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&s->mu);
	while (!s->done && rc == 0)
		rc = timeout_ms < 0
			 ? pthread_cond_wait(&s->cv, &s->mu)
			 : pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	rc = s->done ? s->status : -ETIMEDOUT;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void emb_sched_destroy(struct emb_sched *s)
{
	if (!s)
		return;
	if (s->running) {
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_mutex_unlock(&s->mu);
		emb_transport_wake(s->tr);
		pthread_join(s->thread, NULL);
	}
	emb_listener_destroy(s->lis);
	/* Closing the server conns runs on_close: held requests go back. */
	s->over = true;
	/* Probes still under way post their results to this loop. */
	while (s->nprobing)
		emb_transport_poll(s->tr, 50);
	emb_transport_destroy(s->tr);
	map_frame_put(s->map);
	emb_authlimit_destroy(s->authlimit);
	free(s->state_path);
	free(s->cmap);
	free(s->slots);
	free(s->dead);
	free(s->nodes);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

void emb_sched_stats(struct emb_sched *s, struct emb_sched_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->view;
	pthread_mutex_unlock(&s->mu);
}

bool emb_sched_server_slots(struct emb_sched *s, uint32_t rank,
			    uint32_t out[3])
{
	bool ok;

	pthread_mutex_lock(&s->mu);
	ok = s->slots && s->slots_epoch && rank < s->o.server_num;
	if (ok) {
		out[0] = s->slots[rank][0];
		out[1] = s->slots[rank][1];
		out[2] = s->slots[rank][2];
	}
	pthread_mutex_unlock(&s->mu);
	return ok;
}

/* One gauge per role and state: they sum to the expected count. */
static void metrics_nodes(struct emb_metrics_out *o,
			  const struct emb_sched_stats *v)
{
	static const char *const roles[2] = {"server", "worker"};
	char label[64];

	emb_metrics_family(o, "embstore_cluster_nodes", "gauge",
			   "Nodes by role and state: alive, finished, dead, "
			   "or missing (not registered yet).");
	for (int k = 0; k < 2; k++) {
		uint32_t joined = v->alive[k] + v->finished[k] + v->dead[k];
		const struct {
			const char *state;
			uint32_t n;
		} st[] = {
		    {"alive", v->alive[k]},
		    {"finished", v->finished[k]},
		    {"dead", v->dead[k]},
		    {"missing",
		     v->expected[k] > joined ? v->expected[k] - joined : 0},
		};

		for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
			snprintf(label, sizeof(label),
				 "role=\"%s\",state=\"%s\"", roles[k],
				 st[i].state);
			emb_metrics_u64(o, "embstore_cluster_nodes", label,
					st[i].n);
		}
	}
	emb_metrics_family(o, "embstore_cluster_nodes_expected", "gauge",
			   "Nodes the job waits for, by role.");
	for (int k = 0; k < 2; k++) {
		snprintf(label, sizeof(label), "role=\"%s\"", roles[k]);
		emb_metrics_u64(o, "embstore_cluster_nodes_expected", label,
				v->expected[k]);
	}
}

/* Slots each server holds by role, once the map is made (a removed
 * server holds none), and by state, filling included. */
static void metrics_server_slots(struct emb_metrics_out *o,
				 struct emb_sched *s, uint32_t nservers)
{
	static const char *const roles[] = {"primary", "backup", "filling"};
	uint32_t n[3];
	char label[64];

	if (!emb_sched_server_slots(s, 0, n))
		return;
	emb_metrics_family(o, "embstore_cluster_server_slots", "gauge",
			   "Slots a server holds in the cluster map, as "
			   "primary or as backup.");
	for (uint32_t r = 0; r < nservers; r++) {
		if (!emb_sched_server_slots(s, r, n))
			break;
		for (uint32_t k = 0; k < 2; k++) {
			snprintf(label, sizeof(label),
				 "server=\"%u\",role=\"%s\"", r, roles[k]);
			emb_metrics_u64(o, "embstore_cluster_server_slots",
					label, n[k]);
		}
	}
	emb_metrics_family(o, "embstore_cluster_slot_holders", "gauge",
			   "Slots each server holds in the cluster map by "
			   "state: primary, backup, or filling (a server "
			   "being filled with them during a recovery; "
			   "written to, not read from).");
	for (uint32_t r = 0; r < nservers; r++) {
		if (!emb_sched_server_slots(s, r, n))
			break;
		for (uint32_t k = 0; k < 3; k++) {
			snprintf(label, sizeof(label),
				 "server=\"%u\",state=\"%s\"", r, roles[k]);
			emb_metrics_u64(o, "embstore_cluster_slot_holders",
					label, n[k]);
		}
	}
}

void emb_cluster_metrics_move(struct emb_metrics_out *o, uint32_t slots_left,
			      int64_t eta_ms, uint64_t rows, uint64_t bytes)
{
	emb_metrics_family(o, "embstore_cluster_move_slots_left", "gauge",
			   "Slots the drain or join under way has still to "
			   "move, 0 when none.");
	emb_metrics_u64(o, "embstore_cluster_move_slots_left", NULL,
			slots_left);
	emb_metrics_family(o, "embstore_cluster_move_eta_seconds", "gauge",
			   "Time the drain or join under way needs still at "
			   "its rate so far, or -1.");
	emb_metrics_f64(o, "embstore_cluster_move_eta_seconds", NULL,
			eta_ms < 0 ? -1.0 : (double)eta_ms / 1e3);
	emb_metrics_family(o, "embstore_cluster_move_rows_streamed", "gauge",
			   "Rows streamed for the drain or join under way "
			   "so far, 0 when none.");
	emb_metrics_u64(o, "embstore_cluster_move_rows_streamed", NULL, rows);
	emb_metrics_family(o, "embstore_cluster_move_bytes_streamed", "gauge",
			   "Bytes of those rows.");
	emb_metrics_u64(o, "embstore_cluster_move_bytes_streamed", NULL,
			bytes);
}

void emb_sched_metrics_collect(void *arg, struct emb_metrics_out *o)
{
	static const char *const states[] = {"over", "forming", "ready",
					     "finishing"};
	struct emb_sched *s = arg;
	struct emb_sched_stats v;
	char label[32];

	emb_metrics_build_info(o, "scheduler");
	if (s) {
		emb_sched_stats(s, &v);
		metrics_nodes(o, &v);
		emb_metrics_family(o, "embstore_cluster_state", "gauge",
				   "1 for the state the job is in: forming, "
				   "ready, finishing or over.");
		for (uint32_t i = 0; i < 4; i++) {
			snprintf(label, sizeof(label), "state=\"%s\"",
				 states[i]);
			emb_metrics_u64(o, "embstore_cluster_state", label,
					v.state == i);
		}
		emb_metrics_family(o, "embstore_cluster_map_epoch", "gauge",
				   "Version of the cluster map: 0 until the "
				   "cluster formed, then 1, and one more for "
				   "each server failed over.");
		emb_metrics_u64(o, "embstore_cluster_map_epoch", NULL,
				v.map_epoch);
		emb_metrics_family(o, "embstore_cluster_replicas", "gauge",
				   "Copies of each slot the map was made "
				   "with.");
		emb_metrics_u64(o, "embstore_cluster_replicas", NULL,
				v.replicas);
		emb_metrics_family(o, "embstore_cluster_lost_slots", "gauge",
				   "Slots whose every holder died.");
		emb_metrics_u64(o, "embstore_cluster_lost_slots", NULL,
				v.lost_slots);
		emb_metrics_family(o, "embstore_cluster_filling_server",
				   "gauge",
				   "Rank of the server being filled with "
				   "slots (recovery), or -1.");
		emb_metrics_f64(o, "embstore_cluster_filling_server", NULL,
				v.filling == NO_FILL ? -1.0 : (double)v.filling);
		emb_metrics_family(o, "embstore_cluster_recoveries_total",
				   "counter",
				   "Servers that joined a running job and "
				   "became full replicas.");
		emb_metrics_u64(o, "embstore_cluster_recoveries_total", NULL,
				v.recoveries);
		emb_metrics_family(o, "embstore_cluster_moving_from_server",
				   "gauge",
				   "Rank whose place a chunk of slots being "
				   "moved takes (its target is the filling "
				   "server), or -1.");
		emb_metrics_f64(o, "embstore_cluster_moving_from_server", NULL,
				v.moving_from == NO_FILL
				    ? -1.0
				    : (double)v.moving_from);
		emb_metrics_family(o, "embstore_cluster_servers_moving",
				   "gauge",
				   "Servers being drained (their slots move "
				   "away) or joining (given their share).");
		emb_metrics_u64(o, "embstore_cluster_servers_moving",
				"kind=\"draining\"", v.draining);
		emb_metrics_u64(o, "embstore_cluster_servers_moving",
				"kind=\"joining\"", v.joining);
		emb_metrics_family(o, "embstore_cluster_slots_moved_total",
				   "counter",
				   "Slots moved between live servers (joins "
				   "and drains).");
		emb_metrics_u64(o, "embstore_cluster_slots_moved_total", NULL,
				v.slots_moved);
		emb_metrics_family(o, "embstore_cluster_rows_streamed_total",
				   "counter",
				   "Rows servers streamed to each other: "
				   "moves' copies ahead and fenced streams, "
				   "recoveries' fills.");
		emb_metrics_u64(o, "embstore_cluster_rows_streamed_total", NULL,
				v.rows_streamed);
		emb_metrics_family(o, "embstore_cluster_bytes_streamed_total",
				   "counter",
				   "Bytes of those rows (ids and floats).");
		emb_metrics_u64(o, "embstore_cluster_bytes_streamed_total",
				NULL, v.bytes_streamed);
		emb_cluster_metrics_move(o, v.move_slots_left, v.move_eta_ms,
					 v.move_rows, v.move_bytes);
		emb_metrics_family(o, "embstore_cluster_servers_changed_total",
				   "counter",
				   "Servers drained and gone, or given their "
				   "share after joining.");
		emb_metrics_u64(o, "embstore_cluster_servers_changed_total",
				"kind=\"drained\"", v.drains);
		emb_metrics_u64(o, "embstore_cluster_servers_changed_total",
				"kind=\"joined\"", v.joins);
		metrics_server_slots(o, s, v.expected[0]);
		emb_metrics_family(o,
				   "embstore_cluster_barrier_waiting_workers",
				   "gauge", "Workers held at a barrier now.");
		emb_metrics_u64(o, "embstore_cluster_barrier_waiting_workers",
				NULL, v.barrier_waiting);
		emb_metrics_family(o, "embstore_cluster_barriers_total",
				   "counter", "Barriers every worker passed.");
		emb_metrics_u64(o, "embstore_cluster_barriers_total", NULL,
				v.barriers_completed);
		emb_metrics_family(o, "embstore_cluster_heartbeats_total",
				   "counter", "Heartbeats answered.");
		emb_metrics_u64(o, "embstore_cluster_heartbeats_total", NULL,
				v.heartbeats);
		emb_metrics_family(o, "embstore_cluster_probes_total",
				   "counter",
				   "Probes of silent servers' serving "
				   "addresses, by result: answered (the "
				   "server lived) or unanswered (no answer "
				   "within the heartbeat timeout: dead, "
				   "unless a heartbeat came meanwhile).");
		emb_metrics_u64(o, "embstore_cluster_probes_total",
				"result=\"answered\"", v.probes_answered);
		emb_metrics_u64(o, "embstore_cluster_probes_total",
				"result=\"unanswered\"",
				v.probes - v.probes_answered);
		emb_metrics_family(o, "embstore_cluster_scheduler_stall_ms_total",
				   "counter",
				   "Milliseconds the scheduler's loop did not "
				   "run past its poll wait; not counted as "
				   "any node's silence.");
		emb_metrics_u64(o, "embstore_cluster_scheduler_stall_ms_total",
				NULL, v.blind_ms);
		emb_metrics_family(o,
				   "embstore_cluster_scheduler_self_suspicions_total",
				   "counter",
				   "Times so many nodes were silent at once "
				   "that the scheduler took itself for the "
				   "slow party and let no silence count.");
		emb_metrics_u64(o,
				"embstore_cluster_scheduler_self_suspicions_total",
				NULL, v.self_suspicions);
	}
	emb_metrics_process(o);
}
