/*
 * src/proto/wire_msg.h - payload layouts of every embstore message, their
 * encoders and their decoders. The frame header is in wire.h, and
 * docs/protocol.md tells the same story with the reasons behind it.
 *
 * Offsets below are from the start of the payload, which is frame offset 32
 * (8-aligned). All integers and floats are little-endian; "reserved" fields
 * are written as 0 and rejected when not 0, so they can gain a meaning later.
 * Every request gets exactly one response with the request's opcode |
 * EMB_OP_RESPONSE_BIT and request id. A response whose status is negative
 * carries the error payload instead of the op's own one.
 *
 * ERROR (any response with status < 0; count 0, table id echoed)
 *   OFFSET  SIZE     MEANING
 *   0       4        msg_len, 0..EMB_WIRE_ERRMSG_MAX
 *   4       msg_len  UTF-8 message, not NUL-terminated
 *   payload_len = 4 + msg_len
 *
 * HELLO request (table id 0, count 0, flags 0): first frame on a connection
 *   0       4        client_version: highest protocol version the client speaks
 *   4       2        token_len, 0..EMB_WIRE_TOKEN_MAX
 *   6       2        name_len, 0..EMB_WIRE_CLIENT_NAME_MAX
 *   8       tl       auth token, opaque bytes
 *   8+tl    nl       client name and transport, UTF-8 ("trainer-3/rdma")
 *   payload_len = 8 + token_len + name_len
 *
 * HELLO response (table id 0, count 0)
 *   0       4        server_version
 *   4       4        max_frame_bytes  } struct emb_wire_limits: what the
 *   8       4        max_ids          } server's decoder accepts; clients
 *   12      4        max_tables       } split batches to fit
 *   16      4        max_dim          }
 *   20      4        features: EMB_WIRE_FEAT_* bits (PUSH_SESSION = 1,
 *                    RDMA = 2: the server listens on RDMA too, at the
 *                    same port number); a client ignores bits it does
 *                    not know
 *   24      8        server id
 *   payload_len = 32
 *
 * Table spec: CREATE_TABLE's payload and part of each LIST_TABLES entry
 *   0       64       name: 1..63 bytes, NUL-terminated, NUL-padded
 *   64      4        dim, 1..max_dim
 *   68      4        optimizer kind   } struct emb_optim_cfg, field by field
 *   72      4        lr (f32)         } (common/optim.h)
 *   76      4        weight_decay     }
 *   80      4        initial_accum.   }
 *   84      4        beta1            }
 *   88      4        beta2            }
 *   92      4        eps              }
 *   96      4        ftrl_beta        }
 *   100     4        l1               }
 *   104     4        l2               }
 *   108     4        initializer kind } struct emb_init_cfg (common/init.h)
 *   112     4        a (f32)          }
 *   116     4        b (f32)          }
 *   120     8        seed
 *   size 128
 *
 * Lifecycle block: a table's admission and eviction (common/lifecycle.h)
 *   0       4        admission: 0 none, 1 count, 2 bloom
 *   4       4        admit_n: sightings that make a row (0 with none)
 *   8       4        bloom_bytes: Bloom counters, 0 = default (bloom only)
 *   12      4        ttl_steps: evict rows idle this long, 0 = off
 *   16      4        min_l2 (f32): evict rows of a smaller norm, 0 = off
 *   20      4        order of max_rows: 0 LRU, 1 LFU
 *   24      8        max_rows: evict down to this many, 0 = off
 *   size 32; a block emb_lifecycle_validate() refuses is EMB_EBADLIFE
 *
 * Row-format word: how a table keeps its weights (common/rowfmt.h)
 *   bits 0..7   enum emb_row_format: 0 fp32, 1 fp16, 2 bf16, 3 int8
 *   bit 8       1 = pushes round to nearest, 0 = stochastically (default)
 *   bits 9..31  0
 *   0 for an fp32 table as every earlier version made it.
 *
 * Tier block: where a table's rows past the memory limit go
 *   0       4        mode: enum emb_tier_mode (0 auto, 1 off, 2 on)
 *   4       4        reserved, 0
 *   8       8        tier_max: bytes of tier file a server gives the
 *                    table, 0 = the server's --tier-max
 *   size 16; mode 0 with tier_max 0 is sent as no block
 *
 * CREATE_TABLE request (table id 0, count 0): one table spec, 128 bytes;
 * then, when the row-format word is not 0 (flag EMB_F_ROWFMT), 8 bytes:
 * the word and 4 reserved; then a tier block when the table asks for
 * other than the servers' own tier (flag EMB_F_TIER); then a lifecycle
 * block when the table has a policy (payload 128 plus any of 8, 16 and
 * 32; a block with every policy off, a word of 0 or a default tier block
 * sent as a block is refused, so each request has one encoding). A
 * server that does not know EMB_F_ROWFMT or EMB_F_TIER refuses the frame,
 * so a compact table is never made fp32, nor an untiered one tiered, by
 * mistake. A
 * CREATE of an existing table with the same spec returns its id and sets
 * the block's policy only if the table has none (a server that restarted
 * from a checkpoint gets it back from its clients); changing a policy is
 * SET_LIFECYCLE's.
 * CREATE_TABLE response: the new table's id in the header; no payload.
 * DROP_TABLE request (table id set, count 0): no payload. Response: none.
 * LIST_TABLES request (table id 0, count 0): no payload.
 *
 * LIST_TABLES response (count = tables, <= max_tables): count entries of
 *   0       4        table id
 *   4       4        row-format word (0 from servers before row formats)
 *   8       128      table spec
 *   136     8        rows held now
 *   size 144
 *
 * PULL request (table id set, count = n <= max_ids, flags EMB_F_NOCREATE,
 * EMB_F_WITH_STATE, EMB_F_FP32)
 *   0       8n       u64 ids[n]
 *
 * PULL response (count n, flags echo the request's)
 *   0       B        found bitmap, only with EMB_F_NOCREATE (else B = 0):
 *                    bit i % 8 of byte i / 8 set = id i present; B =
 *                    8 * ceil(n / 64), padding bits 0
 *   B       4*n*s    rows[n][s] of s 4-byte words; a missing id's row is
 *                    zeros. Of an fp32 table, or with EMB_F_FP32: s = dim
 *                    f32 weights. Of a compact table: s = the words of its
 *                    weights in its row format (common/rowfmt.h: fp16 and
 *                    bf16 2 bytes a weight, int8 8 + dim bytes; rounded up
 *                    to words, the tail zero), as the table holds them.
 *                    With EMB_F_WITH_STATE (never with EMB_F_FP32): the
 *                    full row, those weight words then the optimizer's f32
 *                    state (common/optim.h), the layout ASSIGN takes back
 *   The rows come last and start 8-aligned at frame offset 32 + B, which the
 *   client knows from n alone: a TCP server writev()s them straight from
 *   table memory and an RDMA server can RDMA-WRITE them into the client's
 *   receive buffer at that offset.
 *
 * PUSH request (table id set, count = n <= max_ids, flags 0)
 *   0       8        worker step    } reserved for synchronous and bounded-
 *   8       4        worker rank    } staleness training; servers ignore
 *   12      4        reserved       } step and rank today
 *   16      8n       u64 ids[n]           (frame offset 48: 8-aligned)
 *   16+8n   4*n*dim  f32 grads[n][dim]    (8-aligned)
 * With EMB_F_GRAD_FP16 or EMB_F_GRAD_BF16 (not both; to a server whose
 * HELLO has ROWFMT) the gradients are 2*n*dim bytes of fp16 or bf16
 * instead, then zeros to a multiple of 8; the server widens them to f32.
 * A synchronous table refuses them (EMB_EBADFORMAT).
 * With EMB_F_SESSION (only to a server whose HELLO has PUSH_SESSION) the
 * prefix is 32 bytes and the ids start at 32:
 *   16      8        client session id, random per client, not 0
 *   24      8        sequence number of this request to this server,
 *                    from 1; a retry sends the same one, and the server
 *                    applies a (session, sequence) at most once
 * With EMB_F_BIRTHS (to a server whose HELLO has BIRTHS) each row's birth,
 * as the slot's primary gave it (docs/replication.md, "Eviction with
 * replicas"), follows the gradients and their padding:
 *   G       4n       u32 births[n], then zeros to a multiple of 8
 * PUSH response: no payload.
 *
 * BIRTHS request (table id set, count = n <= max_ids, flags 0): u64 ids[n].
 * The births of the ids' rows (the table numbers its rows), or just which
 * are rows (it does not: every row's birth is 0). Creates no row and is no
 * sighting: a client asks a slot's primary before a push to every holder.
 * LIST_BIRTHS request (table id set, count = n slots, 1..EMB_NSLOTS, flags 0)
 *   0       4        first slot; first + n <= EMB_NSLOTS
 *   4       4        reserved, 0
 * LIST_BIRTHS response (count = m rows, flags 0): what a backup checks its
 * copy of the slots against (docs/replication.md, "Eviction with replicas")
 *   0       4        n: the request's slots
 *   4       4        reserved, 0
 *   8       4n       u32 marks[n]: each slot's birth counter, read before
 *                    the rows; then zeros to a multiple of 8
 *   B       8m       u64 ids[m]: every row of the slots, in no order
 *   B+8m    4m       u32 births[m]; then zeros to a multiple of 8
 *
 * BIRTHS response (count = n, flags 0)
 *   0       4n       u32 births[n] in request order; 0xffffffff = no row
 *   4n      0 or 4   zeros to a multiple of 8
 *
 * ASSIGN request (table id set, count = n <= max_ids, flags
 * EMB_F_WITH_STATE, EMB_F_META)
 *   0       8n       u64 ids[n]
 *   8n      4*n*s    rows[n][s]; s = dim f32 weights (rounded to nearest
 *                    into a compact table's format), or with
 *                    EMB_F_WITH_STATE full rows in the table's format as
 *                    PULL with EMB_F_WITH_STATE gives them
 *   then, with EMB_F_META, 8n bytes: per row u32 idle (the sender's clock
 *                    now minus the row's last access, in its table's
 *                    steps) and u32 access count; the receiver sets the
 *                    row's last access to its own clock minus idle
 *   then, with EMB_F_BIRTHS (to a server whose HELLO has BIRTHS), 4n bytes:
 *                    each row's birth (a fill's rows keep their
 *                    primary's), then zeros to a multiple of 8
 * ASSIGN response: no payload.
 *
 * ERASE request (table id set, count = n <= max_ids): u64 ids[n].
 * ERASE response: count = how many ids were present; no payload.
 *
 * LOCATE request (table id set, count = n <= max_ids, flags 0): u64 ids[n].
 * Where each id's row lies in the server's table memory, for one-sided RDMA
 * READs on the connection the request came on (docs/rdma.md). Creates no
 * row. A table that is not remote-readable answers EMB_ENOTREMOTE.
 * LOCATE response (count = n, flags 0)
 *   0       8        u64 seal seed of the table (common/seal.h)
 *   8       4        u32 record bytes: 16-byte header, row_floats floats,
 *                    padding to 8, u64 seal last
 *   12      4        u32 row_floats: dim + optimizer state floats
 *   16      16*n     entries, in request order:
 *     0     8          u64 record address; 0 = no row, or its memory is
 *                      not registered on this connection's loop yet
 *     8     4          u32 rkey for a READ of it on this connection
 *     12    4          reserved, 0
 *
 * STATS request (table id, or 0 for every table; count 0): no payload.
 * STATS response (count = entries, <= max_tables)
 *   0       4        nfields: u64 counters per entry, 1..64; 15 today
 *   4       4        reserved
 *   8       E*count  entries, E = 8 + 8 * nfields:
 *     0     4          table id
 *     4     4          reserved
 *     8     8*nfields  u64 counters in the order of struct emb_wire_stats
 *   A newer server may send more counters than a reader knows (it skips
 *   them); counters a reader knows but the server did not send read as 0.
 *
 * SET_MODE request (table id set, count 0, flags 0)
 *   0       4        mode: 0 async, 1 sync, 2 bounded staleness (enum emb_mode)
 *   4       4        workers: sync only, the pushes that make a step,
 *                    1..EMB_WIRE_SYNC_WORKERS_MAX
 *   8       4        staleness: bounded only, K steps a push may lag
 *   12      4        reserved
 * SET_MODE response: no payload. Setting the mode a table has is a no-op.
 *
 * SET_LIFECYCLE request (table id set, count 0, flags 0): a lifecycle block,
 * 32 bytes, replacing the table's policy (all off turns it off). Needs
 * admin rights, like SET_MODE. Response: no payload.
 *
 * PUSH flag EMB_F_STEP_END: under a sync table a worker sends every server
 * one PUSH per step (empty when it has no ids there) and flags its last
 * part; the server acknowledges that part only once the step is applied.
 *
 * PING request and response (table id 0, count 0): opaque payload, echoed.
 *
 * PACE request (table id 0, count 0, flags 0): a worker's calls' latency
 * while a move copies rows ahead (docs/replication.md, "Pacing by step
 * time"); the servers streaming copies slow them while more than a
 * tenth of the workers report a p99 over --move-bound times their p99
 * before the move.
 *   0       4     p99 of the sender's data calls in its last window, us,
 *                 >= 1
 *   4       4     its p99 before the move (the median of its last windows
 *                 with no move), us, >= 1
 *   8       4     calls in the window, >= 1
 *   12      4     reserved
 *   payload_len = 16
 * PACE response: no payload.
 *
 * Decoders take a frame from emb_wire_frame_decode() and return views into
 * it; they never allocate or read outside the frame. Request decoders return
 * EMB_EBADARG if the frame is not that request (the caller picks the decoder
 * by opcode); response decoders return EMB_EBADARG for another opcode and
 * EMB_ESERVER when the status is negative (read it with
 * emb_wire_error_decode()). All functions are pure and thread-safe.
 */
#ifndef EMB_PROTO_WIRE_MSG_H
#define EMB_PROTO_WIRE_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/init.h"
#include "common/lifecycle.h"
#include "common/optim.h"
#include "proto/wire.h"

#define EMB_WIRE_HELLO_RESP_SIZE   32u
#define EMB_WIRE_SPEC_SIZE	   128u
#define EMB_WIRE_LIST_ENTRY_SIZE   144u
#define EMB_WIRE_PUSH_PREFIX_SIZE  16u
#define EMB_WIRE_PUSH_SESSION_PREFIX_SIZE 32u /* with EMB_F_SESSION */
#define EMB_WIRE_STATS_PREFIX_SIZE 8u
#define EMB_WIRE_STATS_FIELDS	   EMB_TABLE_NSTATS /* counters sent */
#define EMB_WIRE_SET_MODE_SIZE 16u
#define EMB_WIRE_PACE_SIZE 16u
#define EMB_WIRE_LIFECYCLE_SIZE	   32u
#define EMB_WIRE_ROWFMT_SIZE	   8u /* CREATE_TABLE's row-format block */
#define EMB_WIRE_TIER_SIZE	   16u /* CREATE_TABLE's tier block */
/* The largest CREATE_TABLE frame: a buffer for any spec's request. */
#define EMB_WIRE_CREATE_REQ_MAX                                                \
	(EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE + EMB_WIRE_ROWFMT_SIZE +       \
	 EMB_WIRE_TIER_SIZE + EMB_WIRE_LIFECYCLE_SIZE)
#define EMB_WIRE_SYNC_WORKERS_MAX 65536u /* workers of a sync table */
#define EMB_WIRE_STATS_FIELDS_MAX  64u /* most a reader accepts */

/* Bytes of PULL's found bitmap for n ids: whole u64 words. */
static inline uint64_t emb_wire_bitmap_bytes(uint32_t n)
{
	return ((uint64_t)n + 63) / 64 * 8;
}

static inline bool emb_wire_bit_test(const uint8_t *bits, uint32_t i)
{
	return (bits[i / 8] >> (i % 8)) & 1;
}

/* Frame offset of a PULL response's rows: where an RDMA server writes. */
static inline uint64_t emb_wire_pull_rows_offset(uint32_t n, uint16_t flags)
{
	return EMB_WIRE_HDR_SIZE +
	       ((flags & EMB_F_NOCREATE) ? emb_wire_bitmap_bytes(n) : 0);
}

/*
 * Whole PULL response frame, for sizing a client's receive buffer; stride is
 * dim, or dim + state floats with EMB_F_WITH_STATE.
 */
static inline uint64_t emb_wire_pull_resp_bytes(uint32_t n, uint32_t stride,
						uint16_t flags)
{
	return emb_wire_pull_rows_offset(n, flags) + 4ull * n * stride;
}

/*
 * A frame ready for writev(): iov[0] is head (header and fixed prefix), later
 * entries borrow the caller's ids and rows, which must stay unchanged until
 * the frame is sent. iov[0] points into the struct itself: do not copy it.
 */
#define EMB_WIRE_HEAD_MAX 64u
#define EMB_WIRE_IOV_MAX  6u

struct emb_wire_iovs {
	struct iovec iov[EMB_WIRE_IOV_MAX]; /* iovcnt entries, none empty */
	int iovcnt;			    /* entries used, 1.. */
	size_t nbytes;			    /* bytes of the whole frame */
	_Alignas(8) uint8_t head[EMB_WIRE_HEAD_MAX]; /* header + prefix */
};

/* Decoded HELLO request; token and name point into the frame. */
struct emb_wire_hello_req {
	uint32_t client_version; /* highest version the client speaks */
	bool admin;		 /* EMB_F_ADMIN: token is the admin token */
	const uint8_t *token;	 /* token_len bytes, NULL if none */
	uint32_t token_len;	 /* 0..EMB_WIRE_TOKEN_MAX */
	const char *name;	 /* name_len bytes, not terminated */
	uint32_t name_len;	 /* 0..EMB_WIRE_CLIENT_NAME_MAX */
};

struct emb_wire_hello_resp {
	uint32_t server_version;       /* highest version the server speaks */
	struct emb_wire_limits limits; /* what the server accepts */
	uint64_t server_id;	       /* stable id of the server process */
	uint32_t features;	       /* EMB_WIRE_FEAT_* it understands */
};

/* A table's configuration as CREATE_TABLE and LIST_TABLES carry it. */
struct emb_wire_spec {
	char name[EMB_WIRE_NAME_SIZE]; /* NUL-terminated, 1..63 bytes */
	uint32_t dim;		       /* floats per row */
	struct emb_optim_cfg optim;    /* optimizer applied by push */
	struct emb_init_cfg init;      /* initializer of new rows */
	uint64_t seed;		       /* with the id, picks initial values */
	struct emb_lifecycle_cfg life; /* CREATE_TABLE only: admission and
					  eviction, all off = no block */
	uint32_t row_format; /* enum emb_row_format (common/tabledef.h) */
	uint32_t rounding;   /* enum emb_round (common/rowfmt.h) */
	uint32_t tier;	     /* CREATE_TABLE only: enum emb_tier_mode */
	uint32_t tier_pad;   /* 0: no implicit padding, so two specs
				compare by their bytes */
	uint64_t tier_max;   /* CREATE_TABLE only: tier file bytes, 0 =
				the server's */
};

struct emb_wire_table_info {
	uint32_t table_id;	   /* server-assigned, >= 1 */
	struct emb_wire_spec spec; /* as created */
	uint64_t rows;		   /* live rows when listed */
};

/* Decoded LIST_TABLES response; read entries with emb_wire_list_entry(). */
struct emb_wire_list_resp {
	uint32_t n;		/* tables */
	const uint8_t *entries; /* n * EMB_WIRE_LIST_ENTRY_SIZE bytes */
};

struct emb_wire_pull_req {
	uint32_t table_id;   /* >= 1 */
	uint32_t n;	     /* ids */
	bool nocreate;	     /* EMB_F_NOCREATE */
	bool with_state;     /* EMB_F_WITH_STATE: rows with optimizer state */
	bool fp32;	     /* EMB_F_FP32: f32 weights of a compact table */
	const uint64_t *ids; /* n ids in the frame */
};

struct emb_wire_pull_resp {
	uint32_t n;	      /* rows */
	uint32_t dim;	      /* weights per row */
	bool with_state;      /* EMB_F_WITH_STATE */
	uint32_t stride;      /* floats per row: dim (+ state) */
	const uint8_t *found; /* bitmap, NULL unless EMB_F_NOCREATE */
	const float *rows;    /* n * stride floats in the frame */
};

struct emb_wire_push_req {
	uint32_t table_id;   /* >= 1 */
	uint64_t step;	     /* worker step (sync, bounded staleness) */
	uint32_t rank;	     /* worker rank (sync) */
	bool step_end;	     /* EMB_F_STEP_END: last part of the step */
	bool admitted;	     /* EMB_F_ADMITTED: create absent rows whatever
				the admission */
	uint64_t session;    /* EMB_F_SESSION: client session; 0 = none */
	uint64_t seq;	     /* EMB_F_SESSION: sequence number, >= 1 */
	uint32_t n;	     /* ids */
	const uint64_t *ids; /* n ids in the frame */
	const float *grads;  /* n * dim floats in the frame; NULL when half */
	uint32_t half;	     /* EMB_ROWFMT_FP16 or _BF16: the gradients are
				n * dim 2-byte values at half_grads; 0 = f32 */
	const void *half_grads; /* in the frame, 2-aligned */
	const uint32_t *births; /* EMB_F_BIRTHS: n births in the frame; else
				   NULL */
};

struct emb_wire_assign_req {
	uint32_t table_id;   /* >= 1 */
	uint32_t n;	     /* ids */
	bool with_state;     /* EMB_F_WITH_STATE */
	uint32_t stride;     /* floats per row: dim (+ state) */
	const uint64_t *ids; /* n ids in the frame */
	const float *rows;   /* n * stride floats in the frame */
	const uint32_t *meta; /* EMB_F_META: 2n words in the frame, (idle,
				 count) per row; else NULL */
	const uint32_t *births; /* EMB_F_BIRTHS: n births in the frame; else
				   NULL */
};

/* ids-only requests: ERASE. */
struct emb_wire_ids_req {
	uint32_t table_id;   /* >= 1 */
	uint32_t n;	     /* ids */
	const uint64_t *ids; /* n ids in the frame */
};

/* A LOCATE response. entries points into the frame (or the buffer being
 * encoded): n entries of EMB_WIRE_LOCATE_ENTRY_SIZE bytes. */
#define EMB_WIRE_LOCATE_HEAD_SIZE 16u
#define EMB_WIRE_LOCATE_ENTRY_SIZE 16u
struct emb_wire_locate_resp {
	uint64_t seed;	     /* the table's seal seed */
	uint32_t rec_bytes;  /* record bytes, seal last */
	uint32_t row_floats; /* floats after the 16-byte header */
	uint32_t n;	     /* entries */
	void *entries;	     /* n entries; read with emb_wire_locate_entry_get */
};

/* One STATS entry: the table's counters in wire order (tabledef.h). */
struct emb_wire_stats {
	uint32_t table_id; /* table these counters describe */
	EMB_TABLE_STATS(EMB_TABLE_STAT_FIELD)
};

struct emb_wire_set_mode_req {
	uint32_t table_id;  /* >= 1 */
	uint32_t mode;	    /* enum emb_mode */
	uint32_t workers;   /* SYNC: workers per step, >= 1; else 0 */
	uint32_t staleness; /* STALE: steps a push may lag; else 0 */
};

struct emb_wire_pace_req {
	uint32_t p99_us;  /* the sender's calls' p99 in its last window */
	uint32_t base_us; /* its p99 before the move */
	uint32_t calls;	  /* calls in the window */
};

struct emb_wire_set_lifecycle_req {
	uint32_t table_id;	       /* >= 1 */
	struct emb_lifecycle_cfg life; /* the new policy */
};

struct emb_wire_stats_resp {
	uint32_t n;		/* entries */
	uint32_t nfields;	/* counters per entry sent */
	const uint8_t *entries; /* n entries of 8 + 8 * nfields bytes */
};

struct emb_wire_error {
	int32_t status;	  /* the response's negative status */
	const char *msg;  /* msg_len bytes of UTF-8, not terminated */
	uint32_t msg_len; /* 0..EMB_WIRE_ERRMSG_MAX */
};

struct emb_wire_blob {
	const uint8_t *data; /* len bytes in the frame; NULL if len is 0 */
	uint32_t len;	     /* bytes */
};

/*
 * Encoders into a caller buffer buf[0..cap): each returns the frame's size
 * in bytes (> 0), or -ENOSPC when cap is too small (buf is then undefined),
 * or the error named with it. They borrow every pointer for the call.
 */

/* EMB_EBADARG: token_len or strlen(name) over its limit. */
int emb_wire_hello_req_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t client_version, const void *token,
			      uint32_t token_len, const char *name);
/* The same with header flags: 0 or EMB_F_ADMIN (EMB_EBADARG otherwise). */
int emb_wire_hello_req_encode_flags(void *buf, size_t cap, uint64_t req_id,
				    uint32_t client_version, uint16_t flags,
				    const void *token, uint32_t token_len,
				    const char *name);
int emb_wire_hello_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_hello_resp *resp);

/* EMB_EBADNAME: name empty or over 63 bytes. EMB_EBADDIM: dim 0 or > 4096.
 * EMB_EBADLIFE: spec->life refused by emb_lifecycle_validate(). -ENOSPC:
 * cap under EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE, + the lifecycle block's
 * 32 when spec->life is not all off. */
int emb_wire_create_req_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_spec *spec);

/*
 * Requests without a payload: DROP_TABLE (table_id >= 1), LIST_TABLES
 * (table_id 0), STATS (table_id, 0 = all). EMB_EBADARG for another op or a
 * table id the op does not allow.
 */
int emb_wire_empty_req_encode(void *buf, size_t cap, uint8_t op,
			      uint64_t req_id, uint32_t table_id);

/*
 * Successful responses without a payload: CREATE_TABLE (table_id = the new
 * table), DROP_TABLE, PUSH, ASSIGN, ERASE (count = ids that were present;
 * count must be 0 for the others). op is the request's opcode. EMB_EBADARG
 * for another op.
 */
int emb_wire_ack_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			uint32_t table_id, uint32_t count);

/*
 * Error response to request op: status < 0 (EMB_EBADARG otherwise) and msg,
 * cut to EMB_WIRE_ERRMSG_MAX bytes at a UTF-8 character boundary.
 */
int emb_wire_error_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			  uint32_t table_id, int32_t status, const char *msg);

/*
 * The error response to a request whose opcode may be any byte (a response
 * opcode, a number that is no opcode): answers req's opcode |
 * EMB_OP_RESPONSE_BIT and req_id with table_id, status < 0 (EMB_EBADARG
 * otherwise) and msg as emb_wire_error_encode() does. Bytes written, or
 * -ENOSPC. A server answers every request it refuses with this.
 */
int emb_wire_error_echo_encode(void *buf, size_t cap,
			       const struct emb_frame_hdr *req,
			       uint32_t table_id, int32_t status,
			       const char *msg);

/*
 * The error response to a frame refused before anything decoded it:
 * emb_wire_error_echo_encode() with table id 0. The transports'
 * emb_reject_fn (transport/transport.h): a server puts it in
 * emb_transport_opts.reject_encode.
 */
int emb_wire_reject_encode(void *buf, size_t cap,
			   const struct emb_frame_hdr *req, int status,
			   const char *msg);

/* EMB_ETOOMANYTABLES: n over what an int-sized frame can hold. */
int emb_wire_list_resp_encode(void *buf, size_t cap, uint64_t req_id,
			      const struct emb_wire_table_info *tables,
			      uint32_t n);
int emb_wire_stats_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       uint32_t table_id,
			       const struct emb_wire_stats *stats, uint32_t n);

/*
 * Encoders into a struct emb_wire_iovs: 0, EMB_EBADARG (a NULL array with
 * n > 0, dim 0 or > EMB_WIRE_DIM_MAX, a table id of 0, unknown flags) or
 * EMB_ETOOBIG (the frame would exceed EMB_WIRE_FRAME_MAX). The arrays are
 * borrowed until the frame is sent, not copied.
 */
int emb_wire_pull_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			     uint32_t table_id, uint16_t flags,
			     const uint64_t *ids, uint32_t n);

/*
 * found is the bitmap (emb_wire_bitmap_bytes(n) bytes, see
 * emb_wire_found_pack()), required with EMB_F_NOCREATE and ignored
 * without; rows holds n * stride floats. stride is dim (<=
 * EMB_WIRE_DIM_MAX), or dim + state floats with EMB_F_WITH_STATE (up to
 * 3 * EMB_WIRE_DIM_MAX + 1, Adam's row).
 */
int emb_wire_pull_resp_encode(struct emb_wire_iovs *out, uint64_t req_id,
			      uint32_t table_id, uint16_t flags, uint32_t n,
			      uint32_t stride, const uint8_t *found,
			      const float *rows);

/*
 * PULL response gathered from table memory: head receives the header
 * (EMB_WIRE_HDR_SIZE bytes), iov[0] points at it, the bitmap follows with
 * EMB_F_NOCREATE, then one entry per run of rows that lie back to back in
 * memory (rows[i] + stride == rows[i + 1]). With EMB_F_WITH_STATE each
 * rows[i] points at a whole record (weights, then optimizer state) and
 * stride is dim + state floats; without it stride is dim. A NULL rows[i]
 * (an id missing under NOCREATE) sends zero_row, stride zero floats.
 * Returns the entries used, or -ENOSPC when iov_cap < that (at most 2 + n
 * suffice), or as above. The count may exceed IOV_MAX: send it in writev()
 * calls of IOV_MAX entries.
 */
int emb_wire_pull_resp_encode_ptrs(
    uint8_t *head, struct iovec *iov, uint32_t iov_cap, uint64_t req_id,
    uint32_t table_id, uint16_t flags, uint32_t n, uint32_t stride,
    const uint8_t *found, const float *const *rows, const float *zero_row);

int emb_wire_push_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			     uint32_t table_id, uint64_t step, uint32_t rank,
			     const uint64_t *ids, uint32_t n, uint32_t dim,
			     const float *grads);
/*
 * PUSH with EMB_F_SESSION when session != 0 (seq then >= 1), else the same
 * frame as emb_wire_push_req_encode(). EMB_EBADARG for seq 0 with a session.
 */
int emb_wire_push_req_encode_session(struct emb_wire_iovs *out,
				     uint64_t req_id, uint32_t table_id,
				     uint64_t step, uint32_t rank,
				     uint64_t session, uint64_t seq,
				     const uint64_t *ids, uint32_t n,
				     uint32_t dim, const float *grads);
/*
 * The same with half-precision gradients: half is EMB_ROWFMT_FP16 or
 * EMB_ROWFMT_BF16 and grads holds n * dim 2-byte values; the frame gets
 * the zeros that pad them to a multiple of 8. EMB_EBADARG for another
 * half.
 */
int emb_wire_push_req_encode_half(struct emb_wire_iovs *out, uint64_t req_id,
				  uint32_t table_id, uint64_t step,
				  uint32_t rank, uint64_t session, uint64_t seq,
				  const uint64_t *ids, uint32_t n, uint32_t dim,
				  uint32_t half, const uint16_t *grads);

/*
 * Any PUSH: half 0 (f32 gradients at grads) or as above, and with births
 * (not NULL) each row's birth, flagged EMB_F_BIRTHS.
 */
int emb_wire_push_req_encode_births(struct emb_wire_iovs *out,
				    uint64_t req_id, uint32_t table_id,
				    uint64_t step, uint32_t rank,
				    uint64_t session, uint64_t seq,
				    const uint64_t *ids, uint32_t n,
				    uint32_t dim, uint32_t half,
				    const void *grads,
				    const uint32_t *births);

/* LIST_BIRTHS: the slots [first, first + n) of table table_id; a 16-byte
 * frame written to buf (cap bytes). Its length, or EMB_EBADARG, -ENOSPC. */
int emb_wire_list_births_req_encode(void *buf, size_t cap, uint64_t req_id,
				    uint32_t table_id, uint32_t first,
				    uint32_t n);
/* Bytes of a LIST_BIRTHS response of n slots and m rows, header included. */
size_t emb_wire_list_births_resp_bytes(uint32_t n, uint32_t m);
/* A LIST_BIRTHS response, decoded (views into the frame). */
struct emb_wire_list_births {
	uint32_t n;		/* slots */
	uint32_t m;		/* rows */
	const uint32_t *marks;	/* n counters */
	const uint64_t *ids;	/* m ids */
	const uint32_t *births; /* m births */
};
/* Writes the response into buf (cap bytes) from r, whose arrays may
 * already be in place there. Its length, or EMB_EBADARG, EMB_ETOOBIG,
 * -ENOSPC. */
int emb_wire_list_births_resp_encode(void *buf, size_t cap, uint64_t req_id,
				     uint32_t table_id,
				     const struct emb_wire_list_births *r);

/* BIRTHS: a table id and its ids. */
int emb_wire_births_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, const uint64_t *ids,
			       uint32_t n);
/* Bytes of a BIRTHS response of n births, header included. */
size_t emb_wire_births_resp_bytes(uint32_t n);
/* Writes the response into buf (cap bytes): the births at births, which
 * may already be in place at buf + EMB_WIRE_HDR_SIZE. Its length, or
 * EMB_EBADARG, -ENOSPC. */
int emb_wire_births_resp_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t table_id, const uint32_t *births,
				uint32_t n);

/* stride: dim, or dim + state floats with EMB_F_WITH_STATE. */
int emb_wire_assign_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, uint16_t flags,
			       const uint64_t *ids, uint32_t n, uint32_t stride,
			       const float *rows);
/* The same with each row's lifecycle data: meta[2i] its idle steps,
 * meta[2i + 1] its access count (EMB_F_META, set here). */
int emb_wire_assign_req_encode_meta(struct emb_wire_iovs *out,
				    uint64_t req_id, uint32_t table_id,
				    uint16_t flags, const uint64_t *ids,
				    uint32_t n, uint32_t stride,
				    const float *rows, const uint32_t *meta);
/* The same with each row's birth (births not NULL: EMB_F_BIRTHS, set
 * here). */
int emb_wire_assign_req_encode_births(struct emb_wire_iovs *out,
				      uint64_t req_id, uint32_t table_id,
				      uint16_t flags, const uint64_t *ids,
				      uint32_t n, uint32_t stride,
				      const float *rows, const uint32_t *meta,
				      const uint32_t *births);

int emb_wire_locate_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, const uint64_t *ids,
			       uint32_t n);
/* Bytes of a whole LOCATE response frame with n entries. */
size_t emb_wire_locate_resp_bytes(uint32_t n);
/*
 * Writes a whole LOCATE response frame into buf (cap bytes): r's head, and
 * r->n entries copied from r->entries (which may already sit at their place
 * in buf, 48 bytes in). Frame bytes, or EMB_EBADARG / EMB_ETOOBIG / -ENOSPC.
 */
int emb_wire_locate_resp_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t table_id,
				const struct emb_wire_locate_resp *r);
/* Entry i of an entries array: put (encoder) and get (decoded response). */
void emb_wire_locate_entry_put(void *entries, uint32_t i, uint64_t addr,
			       uint32_t rkey);
void emb_wire_locate_entry_get(const struct emb_wire_locate_resp *r,
			       uint32_t i, uint64_t *addr, uint32_t *rkey);
int emb_wire_erase_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			      uint32_t table_id, const uint64_t *ids,
			      uint32_t n);

/* EMB_EBADARG: mode unknown, workers 0 for sync, or fields set that the
 * mode does not use. */
int emb_wire_set_mode_req_encode(void *buf, size_t cap, uint64_t req_id,
				 const struct emb_wire_set_mode_req *req);

/* EMB_EBADARG: table id 0; EMB_EBADLIFE: a policy validate refuses. */
int emb_wire_set_lifecycle_req_encode(
    void *buf, size_t cap, uint64_t req_id,
    const struct emb_wire_set_lifecycle_req *req);

/* EMB_EBADARG: a field 0. */
int emb_wire_pace_req_encode(void *buf, size_t cap, uint64_t req_id,
			     const struct emb_wire_pace_req *req);

/* PING request (response false) or its echo (response true). */
int emb_wire_ping_encode(struct emb_wire_iovs *out, uint64_t req_id,
			 bool response, const void *data, uint32_t len);

/*
 * Copies the frame described by iovs to buf[0..cap). Returns the bytes
 * (iovs->nbytes) or -ENOSPC.
 */
int emb_wire_iovs_flatten(const struct emb_wire_iovs *iovs, void *buf,
			  size_t cap);

/* Packs found[0..n) (0 = missing, else present) into bits[0..bitmap). */
void emb_wire_found_pack(const uint8_t *found, uint32_t n, uint8_t *bits);

/*
 * Decoders. Beyond the EMB_EBADARG / EMB_ESERVER rules above, each returns
 * EMB_EBADFRAME when a field breaks the layout (flags, table id, count or
 * reserved fields the op does not allow, a length that disagrees with
 * payload_len, a token or string over its limit), EMB_ETOOMANYIDS for count
 * > lim->max_ids, EMB_ETOOMANYTABLES for entries > lim->max_tables,
 * EMB_EBADNAME for an empty or unterminated table name, and EMB_EBADDIM
 * when rows are sized for another dim than the caller's.
 */
int emb_wire_hello_req_decode(const struct emb_wire_frame *f,
			      struct emb_wire_hello_req *out);
int emb_wire_hello_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_hello_resp *out);
/* EMB_EBADDIM here: spec dim 0 or > lim->max_dim. EMB_EBADLIFE: a lifecycle
 * block validate refuses; spec->life is all off without a block. */
int emb_wire_create_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_spec *out);
/* op: DROP_TABLE, LIST_TABLES or STATS; the table id is f->hdr.table_id. */
int emb_wire_empty_req_decode(const struct emb_wire_frame *f, uint8_t op);
/* op: the request's opcode, as for emb_wire_ack_encode(). */
int emb_wire_ack_decode(const struct emb_wire_frame *f, uint8_t op);
/* Any response with status < 0; EMB_EBADARG for a request or status 0. */
int emb_wire_error_decode(const struct emb_wire_frame *f,
			  struct emb_wire_error *out);
int emb_wire_list_resp_decode(const struct emb_wire_frame *f,
			      struct emb_wire_list_resp *out);
/* Entry i < resp->n of a decoded LIST_TABLES response. */
void emb_wire_list_entry(const struct emb_wire_list_resp *resp, uint32_t i,
			 struct emb_wire_table_info *out);
int emb_wire_pull_req_decode(const struct emb_wire_frame *f,
			     struct emb_wire_pull_req *out);
/*
 * dim and state_floats: the table's, as the client knows them (EMB_EBADARG
 * if dim is 0 or > 4096); the stride is dim + state_floats when the
 * response has EMB_F_WITH_STATE and dim without, so a client that asked for
 * state checks out->with_state. For a compact table's rows (no EMB_F_FP32)
 * dim is the words of its weights (emb_rowfmt_words()).
 */
int emb_wire_pull_resp_decode(const struct emb_wire_frame *f, uint32_t dim,
			      uint32_t state_floats,
			      struct emb_wire_pull_resp *out);
int emb_wire_push_req_decode(const struct emb_wire_frame *f, uint32_t dim,
			     struct emb_wire_push_req *out);
/*
 * dim and state_floats: the table's (emb_optim_state_floats()); the stride
 * is dim + state_floats with EMB_F_WITH_STATE and dim without.
 */
int emb_wire_assign_req_decode(const struct emb_wire_frame *f, uint32_t dim,
			       uint32_t state_floats,
			       struct emb_wire_assign_req *out);
/* LIST_BIRTHS: the slots asked for; EMB_EBADFRAME for a range outside
 * 0..EMB_NSLOTS or a reserved word set. */
int emb_wire_list_births_req_decode(const struct emb_wire_frame *f,
				    uint32_t *first, uint32_t *n);
/* 0 and *out (views into f), EMB_ESERVER (status < 0), EMB_EBADFRAME. */
int emb_wire_list_births_resp_decode(const struct emb_wire_frame *f,
				     struct emb_wire_list_births *out);
/* BIRTHS: the request's ids, as for ERASE. */
int emb_wire_births_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_ids_req *out);
/* The n births of a BIRTHS response, a view into the frame: 0,
 * EMB_ESERVER (status < 0), EMB_EBADFRAME, EMB_ETOOMANYIDS. */
int emb_wire_births_resp_decode(const struct emb_wire_frame *f,
				uint32_t *n, const uint32_t **births);
/* LOCATE: the request's ids, as for ERASE. */
int emb_wire_locate_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_ids_req *out);
/* 0 and *out, EMB_ESERVER (status < 0: decode the error), EMB_EBADFRAME,
 * EMB_ETOOMANYIDS. */
int emb_wire_locate_resp_decode(const struct emb_wire_frame *f,
				struct emb_wire_locate_resp *out);
int emb_wire_erase_req_decode(const struct emb_wire_frame *f,
			      struct emb_wire_ids_req *out);
int emb_wire_stats_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_stats_resp *out);
/* Entry i < resp->n of a decoded STATS response. */
void emb_wire_stats_entry(const struct emb_wire_stats_resp *resp, uint32_t i,
			  struct emb_wire_stats *out);
int emb_wire_set_mode_req_decode(const struct emb_wire_frame *f,
				 struct emb_wire_set_mode_req *out);
int emb_wire_set_lifecycle_req_decode(const struct emb_wire_frame *f,
				      struct emb_wire_set_lifecycle_req *out);
int emb_wire_pace_req_decode(const struct emb_wire_frame *f,
			     struct emb_wire_pace_req *out);
/* PING request (response false) or response (true). */
int emb_wire_ping_decode(const struct emb_wire_frame *f, bool response,
			 struct emb_wire_blob *out);

#endif
