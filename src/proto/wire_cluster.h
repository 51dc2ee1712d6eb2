/*
 * src/proto/wire_cluster.h - payloads of the cluster messages a scheduler
 * exchanges with servers and workers: REGISTER, CLUSTER_MAP, HEARTBEAT,
 * BARRIER and FINISH, with their encoders and checked decoders. The frame
 * header is in wire.h; docs/protocol.md ("Cluster") and docs/cluster.md
 * tell the same story with the reasons behind it.
 *
 * The transport only carries requests and their responses, so everything a
 * scheduler tells a node is the answer to a request the node sent: the
 * cluster map answers a CLUSTER_MAP request held until every node joined,
 * a barrier answers the BARRIER requests held until every worker arrived,
 * and deaths and the end of the job ride on heartbeat responses.
 *
 * All these requests have table id 0 and flags 0, and so do their
 * responses. Offsets are from the start of the payload (frame offset 32);
 * integers are little-endian; reserved fields are written as 0 and rejected
 * when not 0. A response with a negative status carries the ERROR payload
 * of wire_msg.h instead (EMB_ECLUSTER: cluster full or unknown node id,
 * EMB_ENODEAD: a node died, or this node was declared dead).
 *
 * Roles on the wire: 2 = server, 3 = worker (enum emb_role).
 *
 * REGISTER request (count 0): a node joins
 *   OFFSET  SIZE  MEANING
 *   0       4     role: 2 server, 3 worker
 *   4       2     port: a server's listen port (bound port after port 0);
 *                 0 for workers
 *   6       2     host_len, 0..EMB_WIRE_HOST_MAX
 *   8       4     pid of the node, for logs
 *   12      4     flags: bit 0 = rejoin (the tail below follows the
 *                 host); other bits 0. Before rejoins this field was
 *                 reserved: a scheduler that predates them refuses a
 *                 rejoin as a bad frame, never mistakes it for a join
 *   16      hl    host the node serves on: printable ASCII, no spaces;
 *                 empty = the address the scheduler sees it connect from
 *   payload_len = 16 + host_len, or 16 + host_len + 24 with the rejoin
 *   tail (docs/cluster.md, "When the scheduler restarts"):
 *   16+hl   4     rank the node holds: < EMB_WIRE_SERVERS_MAX (servers)
 *                 or EMB_WIRE_WORKERS_MAX (workers)
 *   20+hl   4     reserved
 *   24+hl   8     cluster id of the scheduler run it registered with,
 *                 not 0
 *   32+hl   8     epoch of the replicated map it holds (0: none)
 *
 * REGISTER response (count 0): the node's place in the cluster
 *   0       4     role, as registered
 *   4       4     rank: servers 0..server_num-1, workers 0..worker_num-1
 *   8       4     node id: names the node in later requests
 *   12      4     server_num, 1..EMB_WIRE_SERVERS_MAX
 *   16      4     worker_num, 1..EMB_WIRE_WORKERS_MAX
 *   20      4     heartbeat timeout, ms, >= 1: silent this long = dead;
 *                 nodes ping every timeout / 5
 *   24      8     cluster id: random per scheduler run
 *   payload_len = 32
 *
 * CLUSTER_MAP, FINISH requests (count 0)
 *   0       4     node id
 *   4       4     FINISH: 0 to be answered at once, or 1 from a server:
 *                 a hold, answered (and the server's finish taken) once
 *                 the job finishes (one per node: a second answers the
 *                 first at once; docs/protocol.md, "Finish hold"); other
 *                 values are refused. CLUSTER_MAP: 0 to be answered at
 *                 once, or the epoch of the map the node holds,
 *                 1..UINT32_MAX: a watch, answered once the scheduler's
 *                 map is newer (held until then, one per node: a second
 *                 answers the first at once; docs/protocol.md, "Map
 *                 watch")
 *   payload_len = 8
 * A CLUSTER_MAP with node id 0 comes from an observer (embstore stat, dump,
 * restore, bench --sched) that has not joined: it is answered at once with
 * the map of a formed cluster, or EMB_ECLUSTER while it is still forming.
 *
 * CLUSTER_MAP response (count = server_num): answered once every node
 * has joined
 *   0       4     worker_num
 *   4       4     replicas: copies of each slot (docs/replication.md),
 *                 0..EMB_WIRE_REPLICAS_MAX and <= server_num; 0 means
 *                 one and no map follows, else the map follows
 *   8       8192  slot map: u16 server rank of each of EMB_NSLOTS slots'
 *                 primary, each < server_num and not removed
 *   8200    264*n server entries, by rank:
 *     0     2       port
 *     2     2       host_len, 1..EMB_WIRE_HOST_MAX
 *     4     4       flags: bit 0 = removed from the map (declared dead);
 *                   other bits 0
 *     8     256     host, host_len bytes then NUL padding
 *   8200+264*n  cl  the cluster map (replicas written, not 0): the whole map
 *                 as emb_cmap_encode() writes it (cluster/map.h: every
 *                 slot's holders, the epoch, fills under way), which a
 *                 reader checks with emb_cmap_decode()
 *   payload_len = 8200 + 264 * server_num + cl
 * A replicated map (R > 1), or that of a job whose servers may join and
 * leave (then R may be 1), thus carries each slot's backups and the
 * servers being filled (docs/replication.md, "Recovery", "Moving slots");
 * the slot map holds the same primaries. Any other map has no tail, and
 * replicas 0.
 *
 * FINISH response (count 0, no payload). A worker's FINISH says it is
 * done; once every worker has finished, heartbeat responses say
 * FINISHING, and a server's FINISH acknowledges that it is stopping.
 *
 * HEARTBEAT request (count 0)
 *   0       4     node id
 *   4       4     reserved
 *   8       8     sequence number, from 1, for logs
 *   payload_len = 16
 *
 * HEARTBEAT response (count = ndead, <= EMB_WIRE_NODES_MAX)
 *   0       4     state: 1 forming, 2 ready, 3 finishing
 *   4       4     map epoch of a replicated cluster, 0 otherwise: a node
 *                 whose map is older asks for the new one (CLUSTER_MAP)
 *   8       8*n   nodes declared dead so far, in order of death:
 *     0     4       role
 *     4     4       rank
 *   payload_len = 8 + 8 * ndead
 *
 * BARRIER request (count 0): a worker reached the barrier called name
 *   0       4     node id
 *   4       2     name_len, 1..EMB_WIRE_BARRIER_NAME_MAX
 *   6       2     reserved
 *   8       nl    name, bytes other than NUL
 *   payload_len = 8 + name_len
 *
 * FILL_DONE request (count 0): a server streamed a chunk of slots to the
 * server being filled with them (docs/replication.md, "Recovery")
 *   0       4     node id of the source server
 *   4       4     status: 0 every row of the chunk was installed, or the
 *                 negative code the stream failed with
 *   8       4     first slot of the chunk, < EMB_NSLOTS
 *   12      4     slots in the chunk, 1..EMB_NSLOTS - first
 *   16      8     map epoch the chunk's fill began with, >= 1
 *   24      8     rows the stream sent (0 when it failed)
 *   32      8     their bytes: ids and floats as sent
 *   payload_len = 40 (24, without rows and bytes, from a server older
 *   than them: read as 0 and 0)
 * FILL_DONE response (count 0, no payload).
 *
 * DRAIN request (count 0): move every slot off a server, which then
 * leaves (docs/replication.md, "Moving slots"); from a node or an
 * observer (embstore scale), after HELLO where the cluster has a token
 *   0       4     server rank
 *   4       4     flags, 0
 *   payload_len = 8
 * DRAIN response (count 0, no payload): the drain is queued.
 *
 * MOVES request (count 0, no payload): the drain, join or recovery under
 * way (embstore stat --sched); from a node or an observer, after HELLO
 * where the cluster has a token.
 * MOVES response (count 0):
 *   0       4     kind: 0 none, 1 join, 2 drain, 3 recovery (a server
 *                 filled with the copies a death left short)
 *   4       4     the server joining, draining or filled (kind > 0)
 *   8       4     phase of its chunk under way: 0 none, 1 copy ahead,
 *                 2 fenced
 *   12      4     first slot of that chunk (0 when none)
 *   16      4     its slots, first + slots <= EMB_NSLOTS (0: none)
 *   20      4     the rank whose place the chunk takes (a move), or
 *                 0xffffffff
 *   24      4     the rank it goes to, or 0xffffffff
 *   28      4     slots moved so far by the drain or join
 *   32      4     slots it has still to move, its chunk under way included
 *   36      4     servers whose drain or join waits for this one's end
 *   40      8     ms since it began
 *   48      8     ms it needs still at its rate so far, as int64; -1 when
 *                 not known (none, a recovery, no chunk done yet)
 *   56      8     rows its sources streamed so far (copies ahead and
 *                 fenced streams: a row written during its copy ahead
 *                 counts again)
 *   64      8     their bytes
 *   payload_len = 72 (56 from a scheduler older than rows and bytes:
 *   read as 0 and 0)
 *
 * BARRIER response (count = workers that met, no payload): sent to every
 * worker once all worker_num workers reached the barrier; a barrier of the
 * same name may then be entered again.
 *
 * Encoders write into buf[0..cap) and return the frame's size (> 0),
 * -ENOSPC when cap is too small, or EMB_EBADARG for a field out of range.
 * Decoders take a frame from emb_wire_frame_decode(), return views into
 * it, never read outside it, and return EMB_EBADARG when the frame is not
 * that message, EMB_ESERVER for a response with a negative status, and
 * EMB_EBADFRAME when a field breaks the layout. All functions are pure and
 * thread-safe.
 */
#ifndef EMB_PROTO_WIRE_CLUSTER_H
#define EMB_PROTO_WIRE_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hash.h"
#include "proto/wire.h"

#define EMB_WIRE_HOST_MAX	    255u  /* host name or address bytes */
#define EMB_WIRE_SERVERS_MAX	    4096u /* one server per slot at most */
#define EMB_WIRE_WORKERS_MAX	    65536u
#define EMB_WIRE_NODES_MAX	    (EMB_WIRE_SERVERS_MAX + EMB_WIRE_WORKERS_MAX)
#define EMB_WIRE_BARRIER_NAME_MAX   63u
#define EMB_WIRE_REPLICAS_MAX	    8u /* copies of a slot in the map */
#define EMB_WIRE_SERVER_REMOVED	    0x1u /* map entry flag: declared dead */
#define EMB_WIRE_REGISTER_RESP_SIZE 32u
#define EMB_WIRE_REGISTER_REJOIN    0x1u /* REGISTER flag: a rejoin */
#define EMB_WIRE_REJOIN_SIZE	    24u  /* the rejoin tail's bytes */
#define EMB_WIRE_NODE_REQ_SIZE	    8u
#define EMB_WIRE_HEARTBEAT_REQ_SIZE 16u
#define EMB_WIRE_FILL_DONE_REQ_SIZE 40u
#define EMB_WIRE_FILL_DONE_REQ_SIZE_V1 24u /* before rows and bytes */
#define EMB_WIRE_DRAIN_REQ_SIZE 8u
#define EMB_WIRE_MOVES_RESP_SIZE 72u
#define EMB_WIRE_MOVES_RESP_SIZE_V1 56u /* before rows and bytes */
#define EMB_WIRE_MAP_PREFIX_SIZE    (8u + 2u * EMB_NSLOTS)
#define EMB_WIRE_MAP_ENTRY_SIZE	    264u
/* Largest replicated map tail: cluster/map.h's version 6 with R = 8 (the
 * fill and copy-ahead tables, 2 bytes a slot each, and each slot's latest
 * fill start with its source, 8); the listed versions are written only
 * where they are smaller. */
#define EMB_WIRE_MAP_CMAP_MAX                                                  \
	(24u + 2u * EMB_WIRE_REPLICAS_MAX * EMB_NSLOTS + 12u * EMB_NSLOTS)

/* Whole CLUSTER_MAP response frame for n servers, without the
 * replicated map's tail. */
static inline uint64_t emb_wire_cluster_map_bytes(uint32_t n)
{
	return EMB_WIRE_HDR_SIZE + EMB_WIRE_MAP_PREFIX_SIZE +
	       (uint64_t)EMB_WIRE_MAP_ENTRY_SIZE * n;
}

/* Room for a CLUSTER_MAP response of n servers with any replicated map
 * (cluster/map.h: at most 24 + 2 * 8 * 4096 + 12 * 4096 bytes). */
static inline uint64_t emb_wire_cluster_map_cap(uint32_t n)
{
	return emb_wire_cluster_map_bytes(n) + EMB_WIRE_MAP_CMAP_MAX;
}

/* Node roles; the numbers of server and worker are on the wire. */
enum emb_role {
	EMB_ROLE_NONE = 0,
	EMB_ROLE_SCHEDULER = 1,
	EMB_ROLE_SERVER = 2,
	EMB_ROLE_WORKER = 3,
};

/* What heartbeat responses say about the job. */
enum emb_cluster_state {
	EMB_CLUSTER_FORMING = 1,   /* nodes still joining */
	EMB_CLUSTER_READY = 2,	   /* every node joined: map sent */
	EMB_CLUSTER_FINISHING = 3, /* every worker finished: servers stop */
};

/* "scheduler", "server", "worker", or "?" */
const char *emb_role_name(uint32_t role);

struct emb_wire_register_req {
	uint32_t role;	   /* EMB_ROLE_SERVER or EMB_ROLE_WORKER */
	uint16_t port;	   /* server's listen port; 0 for workers */
	uint32_t pid;	   /* node's process id, for logs */
	const char *host;  /* host_len bytes, not terminated; NULL if 0 */
	uint32_t host_len; /* 0..EMB_WIRE_HOST_MAX */
	/* A rejoin: a node of a formed cluster whose scheduler restarted
	 * comes back to the place it holds. */
	bool rejoin;	     /* the fields below are set */
	uint32_t rank;	     /* within the role */
	uint64_t cluster_id; /* of the run it first registered with */
	uint64_t map_epoch;  /* of the replicated map it holds, 0: none */
};

struct emb_wire_register_resp {
	uint32_t role;		/* as registered */
	uint32_t rank;		/* within the role */
	uint32_t node_id;	/* names the node in later requests */
	uint32_t server_num;	/* servers in the cluster */
	uint32_t worker_num;	/* workers in the cluster */
	uint32_t hb_timeout_ms; /* silence that makes a node dead */
	uint64_t cluster_id;	/* random per scheduler run */
};

/* A server's address as the cluster map carries it. */
struct emb_wire_node_addr {
	char host[EMB_WIRE_HOST_MAX + 1]; /* NUL-terminated, 1..255 bytes */
	uint16_t port;			  /* listen port, >= 1 */
	bool removed; /* cluster map: declared dead, its slots moved on */
};

/* Decoded CLUSTER_MAP response; read it with the accessors below. */
struct emb_wire_cluster_map {
	uint32_t nservers;	/* server entries */
	uint32_t nworkers;	/* workers in the cluster */
	uint32_t replicas;	/* copies of each slot, >= 1 */
	const uint8_t *slots;	/* EMB_NSLOTS u16 server ranks */
	const uint8_t *entries; /* nservers * EMB_WIRE_MAP_ENTRY_SIZE bytes */
	const uint8_t *cmap;	/* replicated map, emb_cmap_encode(); NULL
				   when replicas is 1 */
	uint32_t cmap_len;	/* its bytes */
};

/* A dead list entry's role with this bit: a dead server whose rank a
 * newcomer has taken since. Nothing to act on: a node that hears of the
 * death only now would otherwise take it for the newcomer's, whose map
 * it may hold already (docs/protocol.md, HEARTBEAT response). */
#define EMB_WIRE_ROLE_REPLACED 0x80000000u

/* One dead node in a heartbeat response. */
struct emb_wire_node_ref {
	uint32_t role; /* EMB_ROLE_SERVER or EMB_ROLE_WORKER, the server's
			  with EMB_WIRE_ROLE_REPLACED maybe */
	uint32_t rank; /* within the role */
};

struct emb_wire_heartbeat_resp {
	uint32_t state;	     /* enum emb_cluster_state */
	uint32_t map_epoch;  /* replicated map's epoch, 0 if none */
	uint32_t ndead;	     /* dead nodes listed */
	const uint8_t *dead; /* ndead entries of 8 bytes */
};

struct emb_wire_fill_done_req {
	uint32_t node_id; /* the source server */
	int32_t status;	  /* 0, or why the stream failed */
	uint32_t first;	  /* first slot of the chunk */
	uint32_t n;	  /* slots */
	uint64_t epoch;	  /* the map epoch the fill began with */
	uint64_t rows;	  /* rows the stream sent */
	uint64_t bytes;	  /* their bytes */
};

enum emb_wire_move_kind {
	EMB_WIRE_MOVE_NONE = 0,
	EMB_WIRE_MOVE_JOIN = 1,
	EMB_WIRE_MOVE_DRAIN = 2,
	EMB_WIRE_MOVE_RECOVERY = 3,
};

/* MOVES response (see above). */
struct emb_wire_moves {
	uint32_t kind;	     /* enum emb_wire_move_kind */
	uint32_t rank;	     /* the server joining, draining or filled */
	uint32_t phase;	     /* 0 none, 1 copy ahead, 2 fenced */
	uint32_t first, n;   /* the chunk under way */
	uint32_t from, to;   /* its ranks, UINT32_MAX when none */
	uint32_t moved;	     /* slots moved by the drain or join */
	uint32_t left;	     /* slots it has still to move */
	uint32_t queued;     /* drains and joins waiting behind it */
	uint64_t elapsed_ms; /* since it began */
	int64_t eta_ms;	     /* time left at its rate, or -1 */
	uint64_t rows;	     /* rows streamed for it so far */
	uint64_t bytes;	     /* their bytes */
};

struct emb_wire_barrier_req {
	uint32_t node_id;  /* the worker that arrived */
	const char *name;  /* name_len bytes, not terminated */
	uint32_t name_len; /* 1..EMB_WIRE_BARRIER_NAME_MAX */
};

/* EMB_EBADARG: a role other than server/worker, host over 255 bytes or
 * with a byte that is not printable ASCII. host may be NULL (empty). */
int emb_wire_register_req_encode(void *buf, size_t cap, uint64_t req_id,
				 uint32_t role, uint16_t port, uint32_t pid,
				 const char *host);
/*
 * A REGISTER with the rejoin tail from r (r->rejoin is not read).
 * EMB_EBADARG as above, or a rank out of range, cluster id 0.
 */
int emb_wire_rejoin_req_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_register_req *r);
/* EMB_EBADARG: counts out of range, timeout 0, rank >= its role's count. */
int emb_wire_register_resp_encode(void *buf, size_t cap, uint64_t req_id,
				  const struct emb_wire_register_resp *r);
/* op: EMB_OP_CLUSTER_MAP or EMB_OP_FINISH (EMB_EBADARG otherwise). */
int emb_wire_node_req_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			     uint32_t node_id);
/* CLUSTER_MAP: a watch for a map newer than newer_than, or 0 for the map
 * at once (as emb_wire_node_req_encode()). */
int emb_wire_map_req_encode(void *buf, size_t cap, uint64_t req_id,
			    uint32_t node_id, uint32_t newer_than);
/* FINISH: hold (a server's, answered when the job finishes) or not (as
 * emb_wire_node_req_encode()). */
int emb_wire_finish_req_encode(void *buf, size_t cap, uint64_t req_id,
			       uint32_t node_id, bool hold);
/*
 * slot_map: EMB_NSLOTS primaries' ranks; servers[0..n): by rank, with
 * their removed flags; replicas 0 or 1 for an unreplicated cluster (both
 * are written as 0 without a cmap, as they are with one);
 * cmap[0..cmap_len): the encoded cluster map, required with replicas > 1.
 * EMB_EBADARG: n 0 or over
 * EMB_WIRE_SERVERS_MAX, nworkers 0 or over the maximum, replicas over
 * EMB_WIRE_REPLICAS_MAX or n, a rank >= n or removed in the map, an empty
 * or bad host, port 0, a cmap where there should be none or none where
 * there should be one.
 */
int emb_wire_cluster_map_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t nworkers, uint32_t replicas,
				const uint16_t *slot_map,
				const struct emb_wire_node_addr *servers,
				uint32_t n, const void *cmap,
				uint32_t cmap_len);
int emb_wire_heartbeat_req_encode(void *buf, size_t cap, uint64_t req_id,
				  uint32_t node_id, uint64_t seq);
/* EMB_EBADARG: state unknown, n over EMB_WIRE_NODES_MAX, a bad role. */
int emb_wire_heartbeat_resp_encode(void *buf, size_t cap, uint64_t req_id,
				   uint32_t state, uint32_t map_epoch,
				   const struct emb_wire_node_ref *dead,
				   uint32_t n);
/* EMB_EBADARG: node id 0, a status > 0, a chunk out of range, epoch 0. */
int emb_wire_fill_done_req_encode(void *buf, size_t cap, uint64_t req_id,
				  const struct emb_wire_fill_done_req *r);
/* EMB_EBADARG: rank over EMB_WIRE_SERVERS_MAX. */
int emb_wire_drain_req_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t rank);
/* EMB_EBADARG: name empty, over 63 bytes. */
int emb_wire_barrier_req_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t node_id, const char *name);
/* Successful BARRIER (count = workers that met), FINISH, FILL_DONE or
 * DRAIN (count 0). */
int emb_wire_cluster_ack_encode(void *buf, size_t cap, uint8_t op,
				uint64_t req_id, uint32_t count);

int emb_wire_register_req_decode(const struct emb_wire_frame *f,
				 struct emb_wire_register_req *out);
int emb_wire_register_resp_decode(const struct emb_wire_frame *f,
				  struct emb_wire_register_resp *out);
/* op: EMB_OP_CLUSTER_MAP or EMB_OP_FINISH; a CLUSTER_MAP watch or a
 * FINISH hold is EMB_EBADFRAME here (emb_wire_map_req_decode() and
 * emb_wire_finish_req_decode() take them). */
int emb_wire_node_req_decode(const struct emb_wire_frame *f, uint8_t op,
			     uint32_t *node_id);
/* CLUSTER_MAP, a watch or not: *newer_than 0 for the map at once. */
int emb_wire_map_req_decode(const struct emb_wire_frame *f, uint32_t *node_id,
			    uint32_t *newer_than);
/* FINISH, held or not; the word after the node id other than 0 or 1 is
 * EMB_EBADFRAME. */
int emb_wire_finish_req_decode(const struct emb_wire_frame *f,
			       uint32_t *node_id, bool *hold);
int emb_wire_cluster_map_decode(const struct emb_wire_frame *f,
				struct emb_wire_cluster_map *out);
/* Server rank of slot (< EMB_NSLOTS) in a decoded map. */
uint16_t emb_wire_cluster_map_slot(const struct emb_wire_cluster_map *m,
				   uint32_t slot);
/* Address of server rank i < m->nservers in a decoded map. */
void emb_wire_cluster_map_server(const struct emb_wire_cluster_map *m,
				 uint32_t i, struct emb_wire_node_addr *out);
int emb_wire_heartbeat_req_decode(const struct emb_wire_frame *f,
				  uint32_t *node_id, uint64_t *seq);
int emb_wire_heartbeat_resp_decode(const struct emb_wire_frame *f,
				   struct emb_wire_heartbeat_resp *out);
/* Entry i < r->ndead of a decoded heartbeat response. */
void emb_wire_heartbeat_dead(const struct emb_wire_heartbeat_resp *r,
			     uint32_t i, struct emb_wire_node_ref *out);
int emb_wire_barrier_req_decode(const struct emb_wire_frame *f,
				struct emb_wire_barrier_req *out);
int emb_wire_fill_done_req_decode(const struct emb_wire_frame *f,
				  struct emb_wire_fill_done_req *out);
int emb_wire_drain_req_decode(const struct emb_wire_frame *f,
			      uint32_t *rank);
/* MOVES: the request (no payload) and the response; EMB_EBADARG from the
 * encoder for a kind, phase or chunk out of range, or an eta below -1. */
int emb_wire_moves_req_encode(void *buf, size_t cap, uint64_t req_id);
int emb_wire_moves_req_decode(const struct emb_wire_frame *f);
int emb_wire_moves_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_moves *m);
int emb_wire_moves_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_moves *out);
/* op: EMB_OP_BARRIER, EMB_OP_FINISH, EMB_OP_FILL_DONE or EMB_OP_DRAIN; *count (may be
 * NULL) from count. */
int emb_wire_cluster_ack_decode(const struct emb_wire_frame *f, uint8_t op,
				uint32_t *count);

#endif
