/*
 * src/common/wire.h - the frame header every embstore message starts with.
 *
 * Frames are little-endian. A frame is this fixed 32-byte header followed by
 * payload_len bytes whose layout depends on the opcode (see wire_msg.h and
 * docs/protocol.md). Transports only need the header to delimit frames.
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
 */
#ifndef EMB_COMMON_WIRE_H
#define EMB_COMMON_WIRE_H

#include <stdint.h>

#define EMB_WIRE_MAGIC 0x31424d45u
#define EMB_WIRE_VERSION 1u
#define EMB_WIRE_HDR_SIZE 32u

#define EMB_OP_RESPONSE_BIT 0x80u

struct emb_frame_hdr {
	uint32_t magic;	      /* EMB_WIRE_MAGIC */
	uint8_t version;      /* EMB_WIRE_VERSION */
	uint8_t opcode;	      /* enum emb_op, | EMB_OP_RESPONSE_BIT */
	uint16_t flags;	      /* EMB_F_* */
	uint64_t req_id;      /* echoed in the response */
	uint32_t table_id;    /* server-assigned table id */
	uint32_t count;	      /* ids or rows in the payload */
	uint32_t payload_len; /* bytes after the header */
	int32_t status;	      /* response status, 0 or negative */
};

_Static_assert(sizeof(struct emb_frame_hdr) == EMB_WIRE_HDR_SIZE,
	       "frame header is 32 bytes on the wire");

#endif
