/*
 * src/proto/wire_many.c - PULL_MANY's and PUSH_MANY's frame of frames
 * (wire_many.h).
 */
#include "proto/wire_many.h"

#include <string.h>
#include <sys/uio.h>

#include "common/err.h"
#include "proto/wire_int.h"

int64_t emb_wire_many_sub_put(void *buf, const struct emb_frame_hdr *hdr,
			      const struct iovec *iov, int niov)
{
	uint8_t *p = buf;
	uint64_t len = 0, size;

	if (!buf || !hdr || niov < 0 || (niov && !iov))
		return EMB_EBADARG;
	for (int i = 0; i < niov; i++)
		len += iov[i].iov_len;
	if (len != hdr->payload_len)
		return EMB_EBADARG;
	size = emb_wire_many_sub_size(hdr->payload_len);
	emb_wire_hdr_encode(p, hdr);
	p += EMB_WIRE_HDR_SIZE;
	for (int i = 0; i < niov; i++) {
		if (iov[i].iov_len)
			memcpy(p, iov[i].iov_base, iov[i].iov_len);
		p += iov[i].iov_len;
	}
	memset(p, 0, size - EMB_WIRE_HDR_SIZE - len);
	return (int64_t)size;
}

int emb_wire_many_decode(const struct emb_wire_frame *f,
			 struct emb_wire_frame *subs, uint32_t max)
{
	const struct emb_frame_hdr *h = f ? &f->hdr : NULL;
	const uint8_t op = h ? h->opcode & ~EMB_OP_RESPONSE_BIT : 0;
	bool resp;
	uint64_t off = 0, len;
	uint8_t want;
	int rc;

	if (!f || !subs || !max ||
	    (op != EMB_OP_PULL_MANY && op != EMB_OP_PUSH_MANY))
		return EMB_EBADARG;
	resp = h->opcode & EMB_OP_RESPONSE_BIT;
	if (resp && h->status < 0)
		return EMB_EBADARG;
	if (h->status != 0 || h->flags || h->table_id || h->count == 0)
		return EMB_EBADFRAME;
	if (h->count > max || h->count > EMB_WIRE_MANY_MAX)
		return EMB_ETOOMANYIDS;
	want = (op == EMB_OP_PULL_MANY ? EMB_OP_PULL : EMB_OP_PUSH) |
	       (resp ? EMB_OP_RESPONSE_BIT : 0);
	len = h->payload_len;
	for (uint32_t i = 0; i < h->count; i++) {
		struct emb_wire_frame *s = &subs[i];
		uint64_t size;

		if (len - off < EMB_WIRE_HDR_SIZE)
			return EMB_EBADFRAME;
		rc = emb_wire_frame_decode(f->payload + off, len - off, f->lim,
					   s);
		if (rc == EMB_ETRUNCFRAME)
			return EMB_EBADFRAME;
		if (rc)
			return rc;
		if (s->hdr.opcode != want || (resp && s->hdr.req_id != i))
			return EMB_EBADFRAME;
		size = emb_wire_many_sub_size(s->hdr.payload_len);
		if (size > len - off ||
		    !emb__wire_zeros(f->payload + off + EMB_WIRE_HDR_SIZE +
					 s->hdr.payload_len,
				     size - EMB_WIRE_HDR_SIZE -
					 s->hdr.payload_len))
			return EMB_EBADFRAME;
		off += size;
	}
	return off == len ? (int)h->count : EMB_EBADFRAME;
}
