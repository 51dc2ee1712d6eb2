/*
 * src/common/frame.h - the 32-byte header every embstore frame starts with:
 * its layout, magic, version and size limits, and its little-endian codec.
 * The transports read it to delimit frames and match responses to calls;
 * the protocol (src/proto) gives the opcode, flags, count and status their
 * meaning. Nothing here knows an opcode.
 *
 *   OFFSET  SIZE  MEANING
 *   0       4     magic, "EMB1" = 0x31424d45 as a little-endian u32
 *   4       1     version, EMB_FRAME_VERSION
 *   5       1     opcode (the protocol's)
 *   6       2     flags (the protocol's, per opcode)
 *   8       8     request id, chosen by the client, echoed in the response
 *   16      4     table id (0 where the op names no table)
 *   20      4     count: ids or rows in the payload (per opcode)
 *   24      4     payload_len: bytes after the header
 *   28      4     status: 0 in requests; 0 or a negative code in responses
 *
 * A frame is the header and payload_len bytes. The header is a multiple of
 * 8 bytes, so a payload that starts 8-aligned in the frame starts 8-aligned
 * in any 8-aligned receive buffer.
 *
 * struct emb_frame_hdr has the wire layout on a little-endian host (the
 * asserts below), so a transport may copy the 32 bytes in and out whole;
 * the codec below is for byte buffers of any alignment.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_COMMON_FRAME_H
#define EMB_COMMON_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define EMB_FRAME_MAGIC	   0x31424d45u
#define EMB_FRAME_VERSION  1u
#define EMB_FRAME_HDR_SIZE 32u
#define EMB_FRAME_MAX	   (1u << 30) /* largest max_frame_bytes, bytes */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "embstore's frames are copied as host structs: little-endian "
	       "hosts only");

struct emb_frame_hdr {
	uint32_t magic;	      /* EMB_FRAME_MAGIC */
	uint8_t version;      /* EMB_FRAME_VERSION */
	uint8_t opcode;	      /* the protocol's opcode */
	uint16_t flags;	      /* the protocol's flags */
	uint64_t req_id;      /* echoed in the response */
	uint32_t table_id;    /* server-assigned table id */
	uint32_t count;	      /* ids or rows in the payload */
	uint32_t payload_len; /* bytes after the header */
	int32_t status;	      /* response status, 0 or negative */
};

_Static_assert(sizeof(struct emb_frame_hdr) == EMB_FRAME_HDR_SIZE,
	       "frame header is 32 bytes on the wire");
_Static_assert(offsetof(struct emb_frame_hdr, req_id) == 8 &&
		   offsetof(struct emb_frame_hdr, table_id) == 16 &&
		   offsetof(struct emb_frame_hdr, payload_len) == 24 &&
		   offsetof(struct emb_frame_hdr, status) == 28,
	       "struct emb_frame_hdr has the wire layout");

/* Writes h to buf[0..EMB_FRAME_HDR_SIZE) in wire order. */
void emb_frame_hdr_encode(void *buf, const struct emb_frame_hdr *h);

/* Reads the header at buf[0..EMB_FRAME_HDR_SIZE) into *h; checks nothing. */
void emb_frame_hdr_decode(const void *buf, struct emb_frame_hdr *h);

/*
 * Whether h starts a frame of this protocol at all: 0, or EMB_EBADMAGIC
 * (magic is not EMB_FRAME_MAGIC) or EMB_EBADVERSION (version is not
 * EMB_FRAME_VERSION), in that order.
 */
static inline int emb_frame_hdr_check(const struct emb_frame_hdr *h)
{
	if (h->magic != EMB_FRAME_MAGIC)
		return EMB_EBADMAGIC;
	if (h->version != EMB_FRAME_VERSION)
		return EMB_EBADVERSION;
	return 0;
}

/*
 * True if the frame h starts (header and payload) is at most
 * max_frame_bytes long; max_frame_bytes >= EMB_FRAME_HDR_SIZE.
 */
static inline bool emb_frame_fits(const struct emb_frame_hdr *h,
				  uint32_t max_frame_bytes)
{
	return h->payload_len <= max_frame_bytes - EMB_FRAME_HDR_SIZE;
}

#endif
