/*
 * src/proto/wire_many.h - PULL_MANY and PUSH_MANY: the PULLs (PUSHes) of
 * several tables to one server in one frame, and their answers in one
 * reply (docs/protocol.md, "PULL_MANY", "PUSH_MANY").
 *
 * The payload is a sequence of whole frames, each a PULL (PUSH) request (in
 * a request) or a PULL (PUSH) response, success or error (in a reply), each
 * starting 8-aligned: a sub-frame is its 32-byte header and payload, then
 * zero bytes up to the next multiple of 8. The outer header's count is the
 * number of sub-frames; its table id and flags are 0. A sub-request's
 * req_id is its index, which its answer echoes. So every sub-frame is
 * checked by the PULL (PUSH) codecs as it would be alone, and their rules
 * (flags, limits, NOCREATE's bitmap, a PUSH's session) hold unchanged
 * inside.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_PROTO_WIRE_MANY_H
#define EMB_PROTO_WIRE_MANY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "proto/wire.h"

/* Most sub-frames in one bundle (a model's sparse features, and room). */
#define EMB_WIRE_MANY_MAX 256u
/*
 * Most bytes a sub-request's error answer takes in a reply (its message is
 * cut to fit), whatever its rows would: a client sizes its reply buffer
 * with max(this, the rows' sub-frame) per sub-request.
 */
#define EMB_WIRE_MANY_ERR_SIZE 256u

/* Bytes a sub-frame of payload_len payload bytes takes in a payload. */
static inline uint64_t emb_wire_many_sub_size(uint32_t payload_len)
{
	return EMB_WIRE_HDR_SIZE + (((uint64_t)payload_len + 7) & ~7ull);
}

/*
 * Writes the sub-frame hdr + payload[0..hdr->payload_len) at buf (room for
 * emb_wire_many_sub_size() bytes), padding included. The payload may come
 * in pieces: iov[0..niov), whose lengths sum to hdr->payload_len. Returns
 * the bytes written, or EMB_EBADARG (lengths that do not add up).
 */
int64_t emb_wire_many_sub_put(void *buf, const struct emb_frame_hdr *hdr,
			      const struct iovec *iov, int niov);

/*
 * Splits the PULL_MANY or PUSH_MANY request or reply f (a frame that
 * passed emb_wire_frame_decode()) into views of its sub-frames,
 * subs[0..count), each decoded by emb_wire_frame_decode() under f->lim: its
 * header is valid, and its payload is inside f's. A request's sub-frames
 * are PULL (PUSH) requests; a reply's are PULL (PUSH) responses (status 0
 * or < 0) whose req_id is their index. Returns count, or:
 *   EMB_EBADARG    f is neither such a request nor its successful reply
 *                  (a reply with status < 0 is a plain error: decode it
 *                  with emb_wire_error_decode()), or max is 0
 *   EMB_EBADFRAME  flags or table id not 0, count 0, a sub-frame that is
 *                  cut short, of another opcode, misnumbered, padded with
 *                  non-zero bytes, or bytes after the last one
 *   EMB_ETOOMANYIDS count over max or EMB_WIRE_MANY_MAX
 *   and the errors of emb_wire_frame_decode() for a bad sub-frame header.
 */
int emb_wire_many_decode(const struct emb_wire_frame *f,
			 struct emb_wire_frame *subs, uint32_t max);

#endif
