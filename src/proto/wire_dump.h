/*
 * src/proto/wire_dump.h - payloads of DUMP_BEGIN, DUMP_CHUNK and DUMP_END:
 * a client streams a table's rows, with optimizer state and lifecycle meta,
 * out of one server to write a snapshot file itself (store/snapshot.h).
 *
 * A conn holds at most one dump session. BEGIN opens it on a table (a new
 * BEGIN replaces an open session), each CHUNK returns the next rows, a CHUNK
 * answered with count 0 means every row was sent, and END (or closing the
 * conn) frees the session. Rows added or removed during the dump may or may
 * not be sent; each row sent is whole (copied under its shard's lock), and
 * an id is sent at most once unless it is erased and created again. With
 * EMB_F_CONSISTENT the session reads a point-in-time view instead
 * (store.h): every row as of one instant between two push batches, each id
 * once; a server that cannot keep the view within its memory limit fails
 * a CHUNK with EMB_EMEMLIMIT.
 *
 * DUMP_BEGIN request (table id set, count 0, flags 0 or EMB_F_CONSISTENT):
 * no payload.
 * DUMP_BEGIN response (table id echoed, count 0)
 *   OFFSET  SIZE  MEANING
 *   0       128   table spec, as in CREATE_TABLE (wire_msg.h)
 *   128     4     state floats per row (common/optim.h)
 *   132     4     row words = weight words (emb_rowfmt_words() of the
 *                 row format and dim) + state floats
 *   136     8     rows held when the dump began
 *   144     8     table step (push batches) when the dump began (with
 *                 EMB_F_CONSISTENT: at the view's instant)
 *   152     4     flags: bit 0 the rows are a point-in-time view;
 *                 bits 8..16 the table's row-format word (wire_msg.h:
 *                 bits 8..15 enum emb_row_format, bit 16 pushes round
 *                 to nearest), 0 for fp32 as earlier servers sent;
 *                 other bits 0
 *   156     4     writers held back taking the view, microseconds
 *   payload_len = 160
 *
 * DUMP_CHUNK request (table id of the session, count = most rows wanted,
 * >= 1, flags 0): no payload. The server sends fewer when a frame could not
 * hold them (see emb_wire_dump_chunk_max_rows()).
 * DUMP_CHUNK response (count = n rows sent, 0 at the end)
 *   0       8n    u64 ids[n]
 *   8n      8n    per row: u32 last_step, u32 count (struct emb_row_meta)
 *   16n     4nr   rows[n][r], r = row words: weights in the table's
 *                 row format (common/rowfmt.h), then f32 state
 *   payload_len = n * (16 + 4 r)
 *
 * DUMP_END request (table id of the session, count 0): no payload.
 * DUMP_END response: no payload.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_PROTO_WIRE_DUMP_H
#define EMB_PROTO_WIRE_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"
#include "proto/wire_msg.h"

#define EMB_WIRE_DUMP_INFO_SIZE 160u

/* What DUMP_BEGIN's response carries. */
struct emb_wire_dump_info {
	struct emb_wire_spec spec; /* the table's configuration */
	uint32_t state_floats;	   /* optimizer state floats per row */
	uint32_t row_floats;	   /* 4-byte words of a row: weight
				      words + state_floats */
	uint64_t rows;		   /* rows when the dump began */
	uint64_t step;		   /* table step when the dump began */
	uint32_t flags;		   /* EMB_WIRE_DUMP_CONSISTENT; the
				      row format is in spec */
	uint32_t pause_us;	   /* view taken: writers held back, us */
};

#define EMB_WIRE_DUMP_CONSISTENT 0x1u /* info.flags: a point-in-time view */
#define EMB_WIRE_DUMP_FMT_SHIFT	 8u   /* info.flags: row-format word here */
#define EMB_WIRE_DUMP_FMT_MASK	 (0x1ffu << EMB_WIRE_DUMP_FMT_SHIFT)

/* A decoded DUMP_CHUNK response; arrays point into the frame. */
struct emb_wire_dump_chunk {
	uint32_t n;	      /* rows */
	uint32_t row_floats;  /* 4-byte words per row */
	const uint64_t *ids;  /* n ids */
	const uint32_t *meta; /* n pairs: last_step, count */
	const float *rows;    /* n * row_floats words */
};

/* Bytes of one row in a DUMP_CHUNK response. */
static inline uint64_t emb_wire_dump_row_bytes(uint32_t row_floats)
{
	return 16 + 4ull * row_floats;
}

/* Most rows a DUMP_CHUNK response can carry in max_frame_bytes (>= 0). */
static inline uint32_t emb_wire_dump_chunk_max_rows(uint32_t max_frame_bytes,
						    uint32_t row_floats)
{
	uint64_t room = max_frame_bytes > EMB_WIRE_HDR_SIZE
			    ? max_frame_bytes - EMB_WIRE_HDR_SIZE
			    : 0;
	uint64_t n = room / emb_wire_dump_row_bytes(row_floats);

	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/*
 * A DUMP_BEGIN response into buf[0..cap): the frame size, -ENOSPC, or
 * EMB_EBADNAME / EMB_EBADDIM for a bad spec, EMB_EBADFORMAT for a bad
 * row format or rounding in it. info->flags holds
 * EMB_WIRE_DUMP_CONSISTENT only; the row format goes from spec.
 */
int emb_wire_dump_info_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t table_id,
			      const struct emb_wire_dump_info *info);

/*
 * Checks a DUMP_* request (op: which one): 0, EMB_EBADARG (another op),
 * EMB_EBADFRAME (flags, status, a payload, table id 0, a count the op does
 * not allow).
 */
int emb_wire_dump_req_decode(const struct emb_wire_frame *f, uint8_t op);

/*
 * Response decoders: EMB_EBADARG (another op), EMB_ESERVER (status < 0),
 * EMB_EBADFRAME (sizes disagree, an unknown flag or row format),
 * EMB_EBADNAME / EMB_EBADDIM (bad spec). The info's spec gets the row
 * format and rounding (fp32 and stochastic from a server that sends none);
 * its flags keep EMB_WIRE_DUMP_CONSISTENT only.
 * row_floats: from DUMP_BEGIN's response.
 */
int emb_wire_dump_info_decode(const struct emb_wire_frame *f,
			      struct emb_wire_dump_info *out);
int emb_wire_dump_chunk_decode(const struct emb_wire_frame *f,
			       uint32_t row_floats,
			       struct emb_wire_dump_chunk *out);

#endif
