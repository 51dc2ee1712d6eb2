/*
 * src/proto/wire_int.h - pieces the wire codecs share (wire.c,
 * wire_dump.c, wire_cluster.c); not for other modules. Pure, thread-safe.
 */
#ifndef EMB_PROTO_WIRE_INT_H
#define EMB_PROTO_WIRE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"
#include "proto/wire_msg.h"

/* True if p[0..len) is all zero bytes (reserved fields, padding). */
bool emb__wire_zeros(const uint8_t *p, size_t len);

/* Writes a frame header with magic and version to buf. */
void emb__wire_put_hdr(void *buf, uint8_t op, uint16_t flags, uint64_t req_id,
		       uint32_t table_id, uint32_t count, uint32_t payload_len,
		       int32_t status);

/*
 * The one check of a response for every decoder (wire.c, wire_dump.c,
 * wire_cluster.c): f is a successful response to op. 0, or EMB_EBADARG
 * (another opcode, or not a response), EMB_ESERVER (status < 0: an ERROR
 * payload), EMB_EBADFRAME (status > 0, or a flag op's requests may not
 * set: dump and cluster responses carry none).
 */
int emb__wire_check_resp(const struct emb_wire_frame *f, uint8_t op);

/*
 * The 128-byte table spec of CREATE_TABLE, LIST_TABLES and DUMP_BEGIN.
 * put: 0, EMB_EBADNAME or EMB_EBADDIM. check: 0, or EMB_EBADNAME for an
 * empty, unterminated or not NUL-padded name, EMB_EBADDIM for dim 0 or over
 * lim->max_dim. get reads a spec that passed check.
 */
int emb__wire_spec_put(uint8_t *p, const struct emb_wire_spec *s);
int emb__wire_spec_check(const uint8_t *p, const struct emb_wire_limits *lim);
void emb__wire_spec_get(const uint8_t *p, struct emb_wire_spec *s);
/* A spec's row-format word (wire_msg.h), and the reverse: 0, or
 * EMB_EBADFORMAT for a word no table has (s untouched). */
uint32_t emb__wire_fmt_word(const struct emb_wire_spec *s);
int emb__wire_fmt_set(uint32_t w, struct emb_wire_spec *s);

#endif
