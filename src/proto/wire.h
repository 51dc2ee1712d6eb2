/*
 * src/proto/wire.h - the protocol's side of the frame header: what its
 * opcode, flags and status mean, the opcodes, and the decoder's limits.
 *
 * Frames are little-endian. A frame is the fixed 32-byte header of
 * common/frame.h followed by payload_len bytes whose layout depends on the
 * opcode (see wire_msg.h and docs/protocol.md). Transports need only the
 * header to delimit frames, and know it from common/frame.h alone:
 *
 *   OFFSET  SIZE  MEANING
 *   0       4     magic, "EMB1" = 0x31424d45 as a little-endian u32
 *   4       1     version, EMB_WIRE_VERSION
 *   5       1     opcode (enum emb_op); responses set EMB_OP_RESPONSE_BIT
 *   6       2     flags (per opcode; EMB_F_* below)
 *   8       8     request id, chosen by the client, echoed in the response
 *   16      4     table id (0 where the op names no table)
 *   20      4     count: ids or rows in the payload (per opcode)
 *   24      4     payload_len: bytes after the header
 *   28      4     status: 0 in requests; 0 or a negative code in responses
 *
 * The header is a multiple of 8 bytes, so a payload that starts 8-aligned in
 * the frame starts 8-aligned in any 8-aligned receive buffer; every payload
 * layout keeps its u64 arrays 8-aligned and its f32 arrays 8-aligned too.
 *
 * Everything here is pure and thread-safe.
 */
#ifndef EMB_PROTO_WIRE_H
#define EMB_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/endian.h"
#include "common/frame.h"
#include "common/tabledef.h"
#include "common/token.h"

/* The frame header's constants, under the protocol's names. */
#define EMB_WIRE_MAGIC	  EMB_FRAME_MAGIC
#define EMB_WIRE_VERSION  EMB_FRAME_VERSION
#define EMB_WIRE_HDR_SIZE EMB_FRAME_HDR_SIZE

#define EMB_OP_RESPONSE_BIT 0x80u

/*
 * Decoded payloads are views into the frame (u64 ids, f32 rows) read in host
 * order, so the host must be little-endian like the wire. Every supported
 * target (x86-64, aarch64 Linux) is; a big-endian port would have to copy.
 */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "embstore's wire views assume a little-endian host");

/*
 * Opcodes. Numbers are fixed forever; reserved ones are named now so that
 * later releases do not collide. A reserved opcode passes the header check
 * (a server answers it with -EOPNOTSUPP instead of dropping the connection)
 * but has no payload decoder yet.
 */
enum emb_op {
	EMB_OP_HELLO = 1,	 /* handshake: versions, auth, limits */
	EMB_OP_PING = 2,	 /* echo an opaque payload */
	EMB_OP_CREATE_TABLE = 3, /* name, dim, optimizer, initializer, seed */
	EMB_OP_DROP_TABLE = 4,	 /* table id in the header */
	EMB_OP_LIST_TABLES = 5,	 /* all tables with their configs */
	EMB_OP_PULL = 6,	 /* ids -> rows */
	EMB_OP_PUSH = 7,	 /* ids + gradients */
	EMB_OP_ASSIGN = 8,	 /* ids + rows (optionally with state) */
	EMB_OP_ERASE = 9,	 /* ids */
	EMB_OP_STATS = 10,	 /* per-table counters */
	EMB_OP_EVICT = 11,	 /* reserved */
	EMB_OP_DUMP_BEGIN = 12,	 /* stream a table (wire_dump.h) */
	EMB_OP_DUMP_CHUNK = 13,	 /* next rows of the stream */
	EMB_OP_DUMP_END = 14,	 /* end of the stream */
	EMB_OP_BARRIER = 15,	 /* worker -> scheduler (wire_cluster.h) */
	EMB_OP_SET_MODE = 16,	 /* a table's training mode */
	EMB_OP_SET_LIFECYCLE = 17, /* a table's admission and eviction */
	EMB_OP_LOCATE = 18,	 /* ids -> where their rows are (RDMA READ) */
	EMB_OP_PULL_MANY = 19,	 /* several PULLs in one frame (wire_many.h) */
	EMB_OP_PUSH_MANY = 20,	 /* several PUSHes in one frame (wire_many.h) */
	EMB_OP_BIRTHS = 21,	 /* ids -> their rows' births (replicas) */
	EMB_OP_LIST_BIRTHS = 22, /* slots -> their rows and births, for a
				    backup's check (replicas) */
	EMB_OP_PACE = 23,	 /* worker -> server: its calls' latency
				    during a move, against before */
	EMB_OP_CLUSTER_MAP = 32, /* node -> scheduler: the map */
	EMB_OP_REGISTER = 33,	 /* node -> scheduler: join */
	EMB_OP_HEARTBEAT = 34,	 /* node -> scheduler: alive */
	EMB_OP_FINISH = 35,	 /* node -> scheduler: done */
	EMB_OP_FILL_DONE = 36,	 /* server -> scheduler: a chunk streamed */
	EMB_OP_DRAIN = 37,	 /* anyone -> scheduler: empty a server */
	EMB_OP_MOVES = 38,	 /* anyone -> scheduler: the moves under way */
};

/* Header flags; each opcode accepts only its own, others must be 0. */
#define EMB_F_NOCREATE	 0x0001u /* PULL: report missing ids, create none */
#define EMB_F_WITH_STATE 0x0002u /* ASSIGN, PULL: rows with optim state */
#define EMB_F_STEP_END 0x0004u	 /* PUSH: the sender's last part of its step
				    for this server (synchronous tables) */
#define EMB_F_ADMIN 0x0008u	 /* HELLO: the token is the admin token; asks
				    for admin rights (docs/protocol.md) */
#define EMB_F_SESSION 0x0010u /* PUSH: a client session id and sequence
				 number follow rank (retried at most once) */
#define EMB_F_CONSISTENT 0x0020u /* DUMP_BEGIN: a point-in-time view */
#define EMB_F_EPOCH 0x0040u /* PUSH, ASSIGN, ERASE: the request's status
			       field holds the cluster map epoch the sender
			       routed it by, 1..INT32_MAX (docs/protocol.md,
			       "Map epochs") */
#define EMB_F_FILL 0x0080u /* ASSIGN (with EMB_F_EPOCH and _WITH_STATE):
			      rows of a recovery fill, for slots the server
			      is being filled with (docs/replication.md) */
#define EMB_F_FP32 0x0100u /* PULL: f32 weights of a compact table */
#define EMB_F_ROWFMT 0x0200u /* CREATE_TABLE: a row-format block follows
				the spec (wire_msg.h) */
#define EMB_F_GRAD_FP16 0x0400u /* PUSH: the gradients are fp16 */
#define EMB_F_GRAD_BF16 0x0800u /* PUSH: the gradients are bf16 */
#define EMB_F_WARM 0x1000u /* ASSIGN (with EMB_F_FILL): rows of a move's copy
			      ahead of its fence, for slots the server is
			      the copy's target of (docs/replication.md) */
#define EMB_F_ADMITTED 0x2000u /* PUSH: the ids were rows on their slots'
				  primary: create absent rows whatever the
				  table's admission (docs/replication.md,
				  "Admission with replicas"); BIRTHS with
				  EMB_F_MAKE: make them whatever it (an
				  assign's rows) */
#define EMB_F_TIER 0x4000u /* CREATE_TABLE: a tier block follows the
			      row-format block's place (wire_msg.h) */
#define EMB_F_META 0x8000u /* ASSIGN: each row's lifecycle data follows
			      the rows (wire_msg.h): a fill's rows keep
			      their idle time and access count */
/* Flags are per opcode, and all 16 bits are taken: this one is
 * DUMP_BEGIN's EMB_F_CONSISTENT, which no PUSH carries. */
#define EMB_F_MAKE 0x0001u /* BIRTHS: make the absent rows first, as a
			      push would (a table without admission), and
			      answer their births (docs/replication.md,
			      "Eviction with replicas") */
#define EMB_F_BIRTHS 0x0020u /* PUSH: each row's birth follows the
				gradients (wire_msg.h; docs/replication.md,
				"Eviction with replicas") */

/* HELLO response features: what this server understands beyond version 1. */
#define EMB_WIRE_FEAT_PUSH_SESSION 0x1u /* PUSH with EMB_F_SESSION */
#define EMB_WIRE_FEAT_RDMA 0x2u	/* also listens on RDMA (rdma_cm), same
				   port number */
#define EMB_WIRE_FEAT_PULL_MANY 0x4u /* PULL_MANY (proto/wire_many.h) */
#define EMB_WIRE_FEAT_PUSH_MANY 0x8u /* PUSH_MANY (proto/wire_many.h) */
#define EMB_WIRE_FEAT_ROWFMT 0x10u /* row formats: CREATE with EMB_F_ROWFMT,
				      compact PULL rows, EMB_F_FP32, and
				      PUSH with half-precision gradients */
#define EMB_WIRE_FEAT_TIER 0x20u /* CREATE with EMB_F_TIER */
#define EMB_WIRE_FEAT_META 0x40u /* ASSIGN with EMB_F_META */
#define EMB_WIRE_FEAT_BIRTHS 0x80u /* BIRTHS, LIST_BIRTHS, and PUSH and
				     ASSIGN with EMB_F_BIRTHS */
/* A BIRTHS answer's birth for an id that is no row (store.h's
 * EMB_BIRTH_NONE). */
#define EMB_WIRE_BIRTH_NONE 0xffffffffu

/* Field limits fixed by the protocol, whatever the configured limits. */
#define EMB_WIRE_FRAME_MAX	 EMB_FRAME_MAX /* largest max_frame_bytes */
#define EMB_WIRE_DIM_MAX	 EMB_DIM_MAX /* largest dim (common/tabledef.h) */
#define EMB_WIRE_NAME_SIZE	 64u   /* table name field, NUL-padded */
#define EMB_WIRE_TOKEN_MAX	 EMB_TOKEN_MAX /* HELLO auth token bytes */
#define EMB_WIRE_CLIENT_NAME_MAX 128u  /* HELLO client/transport string */
#define EMB_WIRE_ERRMSG_MAX	 1024u /* error message bytes */

/*
 * What a decoder accepts. A server fills these from its config and sends
 * them in the HELLO response, so clients split batches to fit.
 */
struct emb_wire_limits {
	uint32_t max_frame_bytes; /* header + payload, 64..EMB_WIRE_FRAME_MAX */
	uint32_t max_ids;	  /* ids (or rows) per request, >= 1 */
	uint32_t max_tables;	  /* entries in LIST/STATS responses, >= 1 */
	uint32_t max_dim;	  /* floats per row, 1..EMB_WIRE_DIM_MAX */
};

#define EMB_WIRE_LIMITS_DEFAULT                                                \
	((struct emb_wire_limits){.max_frame_bytes = 64u << 20,                \
				  .max_ids = 1u << 20,                         \
				  .max_tables = 1024,                          \
				  .max_dim = EMB_WIRE_DIM_MAX})

/*
 * A replicated write routed by map epoch (1..INT32_MAX): EMB_F_EPOCH and
 * the epoch in the request's status field, plus extra (EMB_F_FILL or 0).
 */
static inline void emb_wire_hdr_set_epoch(struct emb_frame_hdr *h,
					  uint64_t epoch, uint16_t extra)
{
	h->flags = (uint16_t)(h->flags | EMB_F_EPOCH | extra);
	h->status = (int32_t)epoch;
}

/* The same on an encoded frame buf (EMB_WIRE_HDR_SIZE bytes at least). */
static inline void emb_wire_stamp_epoch(void *buf, uint64_t epoch,
					uint16_t extra)
{
	uint8_t *p = buf;

	emb_le16_store(p + 6,
		       (uint16_t)(emb_le16_load(p + 6) | EMB_F_EPOCH | extra));
	emb_le32_store(p + 28, (uint32_t)epoch);
}

/* The map epoch a request was routed by, 0 without EMB_F_EPOCH. */
static inline uint32_t emb_wire_req_epoch(const struct emb_frame_hdr *h)
{
	return (h->flags & EMB_F_EPOCH) ? (uint32_t)h->status : 0;
}

/*
 * A frame that passed emb_wire_frame_decode(): the header, and a view of
 * its payload. payload and lim point into memory the caller keeps alive.
 */
struct emb_wire_frame {
	struct emb_frame_hdr hdr; /* decoded header */
	const uint8_t *payload;	  /* hdr.payload_len bytes, 8-aligned */
	const struct emb_wire_limits *lim; /* limits it was checked against */
};

/* "pull", "hello", ...; "?" for a number that is no opcode. */
const char *emb_wire_op_name(uint8_t op);

/* True for every opcode above, reserved ones included (response bit off). */
bool emb_wire_op_known(uint8_t op);

/* 0, or EMB_EBADARG if a field is out of the range given in the struct. */
int emb_wire_limits_validate(const struct emb_wire_limits *lim);

/* Writes hdr to buf[0..EMB_WIRE_HDR_SIZE) in wire order. */
void emb_wire_hdr_encode(void *buf, const struct emb_frame_hdr *hdr);

/*
 * Checks and decodes the header at buf[0..len). Looks at the header only, so
 * a stream transport can call it on the first 32 bytes to learn how much more
 * to read. 0 and *out, or:
 *   EMB_ETRUNCFRAME  len < EMB_WIRE_HDR_SIZE
 *   EMB_EBADMAGIC    magic is not EMB_WIRE_MAGIC
 *   EMB_EBADVERSION  version is not EMB_WIRE_VERSION
 *   EMB_EBADOP       opcode (response bit aside) is not emb_wire_op_known()
 *   EMB_ETOOBIG      header + payload_len > lim->max_frame_bytes
 *   EMB_EBADARG      lim fails emb_wire_limits_validate()
 * Borrows buf and lim for the call.
 */
int emb_wire_hdr_decode(const void *buf, size_t len,
			const struct emb_wire_limits *lim,
			struct emb_frame_hdr *out);

/*
 * Decodes a whole frame at buf[0..len): the header as above, then checks
 * that len holds all payload_len bytes (EMB_ETRUNCFRAME otherwise; bytes
 * beyond the frame are ignored). buf must be 8-aligned (EMB_EBADARG) so that
 * payload views are aligned. On success out->payload points into buf and
 * out->lim is lim: both must outlive any use of *out and of the message
 * views decoded from it.
 */
int emb_wire_frame_decode(const void *buf, size_t len,
			  const struct emb_wire_limits *lim,
			  struct emb_wire_frame *out);

#endif
