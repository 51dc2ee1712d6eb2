/*
 * src/common/frame.c - the frame header's little-endian codec (layout in
 * frame.h). Pure and thread-safe.
 */
#include "common/frame.h"

#include "common/endian.h"

void emb_frame_hdr_encode(void *buf, const struct emb_frame_hdr *h)
{
	uint8_t *p = buf;

	emb_le32_store(p + 0, h->magic);
	p[4] = h->version;
	p[5] = h->opcode;
	emb_le16_store(p + 6, h->flags);
	emb_le64_store(p + 8, h->req_id);
	emb_le32_store(p + 16, h->table_id);
	emb_le32_store(p + 20, h->count);
	emb_le32_store(p + 24, h->payload_len);
	emb_le32_store(p + 28, (uint32_t)h->status);
}

void emb_frame_hdr_decode(const void *buf, struct emb_frame_hdr *h)
{
	const uint8_t *p = buf;

	h->magic = emb_le32_load(p + 0);
	h->version = p[4];
	h->opcode = p[5];
	h->flags = emb_le16_load(p + 6);
	h->req_id = emb_le64_load(p + 8);
	h->table_id = emb_le32_load(p + 16);
	h->count = emb_le32_load(p + 20);
	h->payload_len = emb_le32_load(p + 24);
	h->status = (int32_t)emb_le32_load(p + 28);
}
