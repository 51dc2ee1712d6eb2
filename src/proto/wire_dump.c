/*
 * src/proto/wire_dump.c - encoders and checked decoders for the DUMP_*
 * payloads (layouts in wire_dump.h). Pure and thread-safe.
 */
#include "proto/wire_dump.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "proto/wire_int.h"

/*
 * The row-format word of a spec, as CREATE_TABLE carries it (wire_msg.h):
 * the format, and bit 8 for rounding to nearest. fp32 never rounds: 0.
 */
#define FMT_NEAREST 0x100u

static int fmt_word(const struct emb_wire_spec *s, uint32_t *w)
{
	if (s->row_format >= EMB_ROWFMT_COUNT ||
	    (s->rounding != EMB_ROUND_NEAREST &&
	     s->rounding != EMB_ROUND_STOCHASTIC))
		return EMB_EBADFORMAT;
	*w = s->row_format == EMB_ROWFMT_FP32
		 ? 0
		 : s->row_format |
		       (s->rounding == EMB_ROUND_NEAREST ? FMT_NEAREST : 0);
	return 0;
}

static int fmt_set(uint32_t w, struct emb_wire_spec *s)
{
	if ((w & ~(FMT_NEAREST | 0xffu)) || (w & 0xffu) >= EMB_ROWFMT_COUNT ||
	    ((w & FMT_NEAREST) && (w & 0xffu) == EMB_ROWFMT_FP32))
		return EMB_EBADFRAME;
	s->row_format = w & 0xffu;
	s->rounding =
	    (w & FMT_NEAREST) ? EMB_ROUND_NEAREST : EMB_ROUND_STOCHASTIC;
	return 0;
}

/* Any dim the protocol allows: the table's own limit was checked at create. */
static const struct emb_wire_limits spec_lim = {
	.max_frame_bytes = EMB_WIRE_FRAME_MAX,
	.max_ids = 1,
	.max_tables = 1,
	.max_dim = EMB_WIRE_DIM_MAX,
};

int emb_wire_dump_info_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t table_id,
			      const struct emb_wire_dump_info *info)
{
	struct emb_frame_hdr hdr = {
	    .magic = EMB_WIRE_MAGIC,
	    .version = EMB_WIRE_VERSION,
	    .opcode = EMB_OP_DUMP_BEGIN | EMB_OP_RESPONSE_BIT,
	    .req_id = req_id,
	    .table_id = table_id,
	    .payload_len = EMB_WIRE_DUMP_INFO_SIZE,
	};
	uint8_t *p = (uint8_t *)buf + EMB_WIRE_HDR_SIZE;
	uint32_t word;
	int rc;

	if (cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE)
		return -ENOSPC;
	rc = fmt_word(&info->spec, &word);
	if (rc)
		return rc;
	rc = emb__wire_spec_put(p, &info->spec);
	if (rc)
		return rc;
	emb_le32_store(p + 128, info->state_floats);
	emb_le32_store(p + 132, info->row_floats);
	emb_le64_store(p + 136, info->rows);
	emb_le64_store(p + 144, info->step);
	emb_le32_store(p + 152, (info->flags & EMB_WIRE_DUMP_CONSISTENT) |
				    word << EMB_WIRE_DUMP_FMT_SHIFT);
	emb_le32_store(p + 156, info->pause_us);
	emb_wire_hdr_encode(buf, &hdr);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE);
}

int emb_wire_dump_req_decode(const struct emb_wire_frame *f, uint8_t op)
{
	if (!f || f->hdr.opcode != op ||
	    (op != EMB_OP_DUMP_BEGIN && op != EMB_OP_DUMP_CHUNK &&
	     op != EMB_OP_DUMP_END))
		return EMB_EBADARG;
	if (f->hdr.status != 0 ||
	    (f->hdr.flags & ~(op == EMB_OP_DUMP_BEGIN ? EMB_F_CONSISTENT
						      : 0u)) ||
	    f->hdr.payload_len != 0 || f->hdr.table_id == 0)
		return EMB_EBADFRAME;
	if ((op == EMB_OP_DUMP_CHUNK) != (f->hdr.count != 0))
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_dump_info_decode(const struct emb_wire_frame *f,
			      struct emb_wire_dump_info *out)
{
	const uint8_t *p;
	uint32_t words;
	int rc = emb__wire_check_resp(f, EMB_OP_DUMP_BEGIN);

	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != EMB_WIRE_DUMP_INFO_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	rc = emb__wire_spec_check(p, &spec_lim);
	if (rc)
		return rc;
	emb__wire_spec_get(p, &out->spec);
	out->state_floats = emb_le32_load(p + 128);
	out->row_floats = emb_le32_load(p + 132);
	out->rows = emb_le64_load(p + 136);
	out->step = emb_le64_load(p + 144);
	out->flags = emb_le32_load(p + 152);
	out->pause_us = emb_le32_load(p + 156);
	if ((out->flags &
	     ~(EMB_WIRE_DUMP_CONSISTENT | EMB_WIRE_DUMP_FMT_MASK)) ||
	    fmt_set((out->flags & EMB_WIRE_DUMP_FMT_MASK) >>
			EMB_WIRE_DUMP_FMT_SHIFT,
		    &out->spec))
		return EMB_EBADFRAME;
	out->flags &= EMB_WIRE_DUMP_CONSISTENT;
	words = emb_rowfmt_words(out->spec.row_format, out->spec.dim);
	if (out->state_floats !=
		emb_optim_state_floats(out->spec.optim.kind, out->spec.dim) ||
	    out->row_floats != words + out->state_floats)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_dump_chunk_decode(const struct emb_wire_frame *f,
			       uint32_t row_floats,
			       struct emb_wire_dump_chunk *out)
{
	uint32_t n;
	int rc = emb__wire_check_resp(f, EMB_OP_DUMP_CHUNK);

	if (rc)
		return rc;
	if (row_floats == 0 || row_floats > 3 * EMB_WIRE_DIM_MAX + 1)
		return EMB_EBADARG;
	n = f->hdr.count;
	if ((uint64_t)n * emb_wire_dump_row_bytes(row_floats) !=
	    f->hdr.payload_len)
		return EMB_EBADFRAME;
	out->n = n;
	out->row_floats = row_floats;
	out->ids = (const uint64_t *)(const void *)f->payload;
	out->meta = (const uint32_t *)(const void *)(f->payload + 8ull * n);
	out->rows = (const float *)(const void *)(f->payload + 16ull * n);
	return 0;
}
