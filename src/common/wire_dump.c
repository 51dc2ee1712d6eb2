/*
 * src/common/wire_dump.c - encoders and checked decoders for the DUMP_*
 * payloads (layouts in wire_dump.h). Pure and thread-safe.
 */
#include "common/wire_dump.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/optim.h"

static bool zeros(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

/* The CREATE_TABLE spec layout (wire_msg.h), kept byte for byte. */
static int spec_put(uint8_t *p, const struct emb_wire_spec *s)
{
	size_t len = strnlen(s->name, EMB_WIRE_NAME_SIZE);

	if (len == 0 || len >= EMB_WIRE_NAME_SIZE)
		return EMB_EBADNAME;
	if (s->dim == 0 || s->dim > EMB_WIRE_DIM_MAX)
		return EMB_EBADDIM;
	memset(p, 0, EMB_WIRE_NAME_SIZE);
	memcpy(p, s->name, len);
	emb_le32_store(p + 64, s->dim);
	emb_le32_store(p + 68, s->optim.kind);
	emb_lef32_store(p + 72, s->optim.lr);
	emb_lef32_store(p + 76, s->optim.weight_decay);
	emb_lef32_store(p + 80, s->optim.initial_accumulator);
	emb_lef32_store(p + 84, s->optim.beta1);
	emb_lef32_store(p + 88, s->optim.beta2);
	emb_lef32_store(p + 92, s->optim.eps);
	emb_lef32_store(p + 96, s->optim.ftrl_beta);
	emb_lef32_store(p + 100, s->optim.l1);
	emb_lef32_store(p + 104, s->optim.l2);
	emb_le32_store(p + 108, s->init.kind);
	emb_lef32_store(p + 112, s->init.a);
	emb_lef32_store(p + 116, s->init.b);
	emb_le64_store(p + 120, s->seed);
	return 0;
}

static int spec_get(const uint8_t *p, struct emb_wire_spec *s)
{
	const uint8_t *nul = memchr(p, 0, EMB_WIRE_NAME_SIZE);

	if (!nul || nul == p ||
	    !zeros(nul, (size_t)(p + EMB_WIRE_NAME_SIZE - nul)))
		return EMB_EBADNAME;
	memcpy(s->name, p, EMB_WIRE_NAME_SIZE);
	s->dim = emb_le32_load(p + 64);
	if (s->dim == 0 || s->dim > EMB_WIRE_DIM_MAX)
		return EMB_EBADDIM;
	s->optim.kind = emb_le32_load(p + 68);
	s->optim.lr = emb_lef32_load(p + 72);
	s->optim.weight_decay = emb_lef32_load(p + 76);
	s->optim.initial_accumulator = emb_lef32_load(p + 80);
	s->optim.beta1 = emb_lef32_load(p + 84);
	s->optim.beta2 = emb_lef32_load(p + 88);
	s->optim.eps = emb_lef32_load(p + 92);
	s->optim.ftrl_beta = emb_lef32_load(p + 96);
	s->optim.l1 = emb_lef32_load(p + 100);
	s->optim.l2 = emb_lef32_load(p + 104);
	s->init.kind = emb_le32_load(p + 108);
	s->init.a = emb_lef32_load(p + 112);
	s->init.b = emb_lef32_load(p + 116);
	s->seed = emb_le64_load(p + 120);
	return 0;
}

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
	int rc;

	if (cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE)
		return -ENOSPC;
	rc = spec_put(p, &info->spec);
	if (rc)
		return rc;
	emb_le32_store(p + 128, info->state_floats);
	emb_le32_store(p + 132, info->row_floats);
	emb_le64_store(p + 136, info->rows);
	emb_le64_store(p + 144, info->step);
	emb_le64_store(p + 152, 0);
	emb_wire_hdr_encode(buf, &hdr);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE);
}

int emb_wire_dump_req_decode(const struct emb_wire_frame *f, uint8_t op)
{
	if (!f || f->hdr.opcode != op ||
	    (op != EMB_OP_DUMP_BEGIN && op != EMB_OP_DUMP_CHUNK &&
	     op != EMB_OP_DUMP_END))
		return EMB_EBADARG;
	if (f->hdr.status != 0 || f->hdr.flags != 0 ||
	    f->hdr.payload_len != 0 || f->hdr.table_id == 0)
		return EMB_EBADFRAME;
	if ((op == EMB_OP_DUMP_CHUNK) != (f->hdr.count != 0))
		return EMB_EBADFRAME;
	return 0;
}

static int check_resp(const struct emb_wire_frame *f, uint8_t op)
{
	if (!f || f->hdr.opcode != (op | EMB_OP_RESPONSE_BIT))
		return EMB_EBADARG;
	if (f->hdr.status < 0)
		return EMB_ESERVER;
	if (f->hdr.status > 0 || f->hdr.flags != 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_dump_info_decode(const struct emb_wire_frame *f,
			      struct emb_wire_dump_info *out)
{
	const uint8_t *p;
	int rc = check_resp(f, EMB_OP_DUMP_BEGIN);

	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != EMB_WIRE_DUMP_INFO_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	rc = spec_get(p, &out->spec);
	if (rc)
		return rc;
	out->state_floats = emb_le32_load(p + 128);
	out->row_floats = emb_le32_load(p + 132);
	out->rows = emb_le64_load(p + 136);
	out->step = emb_le64_load(p + 144);
	if (out->state_floats !=
		emb_optim_state_floats(out->spec.optim.kind, out->spec.dim) ||
	    out->row_floats != out->spec.dim + out->state_floats ||
	    emb_le64_load(p + 152) != 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_dump_chunk_decode(const struct emb_wire_frame *f,
			       uint32_t row_floats,
			       struct emb_wire_dump_chunk *out)
{
	uint32_t n;
	int rc = check_resp(f, EMB_OP_DUMP_CHUNK);

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
