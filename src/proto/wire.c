/*
 * src/proto/wire.c - the frame codec: header checks, payload encoders that
 * write into caller buffers or fill iovecs over caller arrays, and decoders
 * that check every length against payload_len before they touch a byte and
 * hand out views into the frame. Nothing here allocates, logs or locks, so
 * the transports' receive paths can call it; pure and thread-safe.
 */
#include "proto/wire.h"
#include "proto/wire_msg.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/cfgcodec.h"
#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_int.h"

/* Largest payload any frame can carry; keeps byte counts inside an int. */
#define PAYLOAD_MAX (EMB_WIRE_FRAME_MAX - EMB_WIRE_HDR_SIZE)
/* Widest ASSIGN row: Adam keeps 2 * dim + 1 state floats after the weights. */
#define STRIDE_MAX (3 * EMB_WIRE_DIM_MAX + 1)

enum table_rule {
	TBL_NONE = 0, /* table id must be 0 */
	TBL_SET,      /* table id must be >= 1 */
	TBL_ANY,      /* 0 means "all tables" */
};

struct op_rule {
	uint16_t flags; /* flags a request may set (responses echo them) */
	uint8_t table;	/* enum table_rule for the request */
};

static const struct op_rule op_rules[] = {
    [EMB_OP_HELLO] = {EMB_F_ADMIN, TBL_NONE},
    [EMB_OP_PING] = {0, TBL_NONE},
    [EMB_OP_CREATE_TABLE] = {EMB_F_ROWFMT | EMB_F_TIER, TBL_NONE},
    [EMB_OP_DROP_TABLE] = {0, TBL_SET},
    [EMB_OP_LIST_TABLES] = {0, TBL_NONE},
    [EMB_OP_PULL] = {EMB_F_NOCREATE | EMB_F_WITH_STATE | EMB_F_FP32,
		     TBL_SET},
    [EMB_OP_PUSH] = {EMB_F_STEP_END | EMB_F_SESSION | EMB_F_EPOCH |
			 EMB_F_GRAD_FP16 | EMB_F_GRAD_BF16 | EMB_F_ADMITTED |
			 EMB_F_BIRTHS,
		     TBL_SET},
    [EMB_OP_ASSIGN] = {EMB_F_WITH_STATE | EMB_F_EPOCH | EMB_F_FILL |
			   EMB_F_META | EMB_F_WARM | EMB_F_BIRTHS, TBL_SET},
    [EMB_OP_ERASE] = {EMB_F_EPOCH, TBL_SET},
    [EMB_OP_STATS] = {0, TBL_ANY},
    [EMB_OP_SET_MODE] = {0, TBL_SET},
    [EMB_OP_SET_LIFECYCLE] = {0, TBL_SET},
    [EMB_OP_LOCATE] = {0, TBL_SET},
    [EMB_OP_PULL_MANY] = {0, TBL_NONE},
    [EMB_OP_PUSH_MANY] = {0, TBL_NONE},
    [EMB_OP_BIRTHS] = {EMB_F_MAKE | EMB_F_ADMITTED, TBL_SET},
    [EMB_OP_LIST_BIRTHS] = {0, TBL_SET},
    [EMB_OP_PACE] = {0, TBL_NONE},
};

#define NRULES (sizeof(op_rules) / sizeof(op_rules[0]))

/* The order of the STATS counters on the wire. */
#define STAT_OFF(name, what) offsetof(struct emb_wire_stats, name),
static const size_t stats_offs[EMB_WIRE_STATS_FIELDS] = {
    EMB_TABLE_STATS(STAT_OFF)};
#undef STAT_OFF

const char *emb_wire_op_name(uint8_t op)
{
	switch (op) {
	case EMB_OP_HELLO:
		return "hello";
	case EMB_OP_PING:
		return "ping";
	case EMB_OP_CREATE_TABLE:
		return "create_table";
	case EMB_OP_DROP_TABLE:
		return "drop_table";
	case EMB_OP_LIST_TABLES:
		return "list_tables";
	case EMB_OP_PULL:
		return "pull";
	case EMB_OP_PUSH:
		return "push";
	case EMB_OP_ASSIGN:
		return "assign";
	case EMB_OP_ERASE:
		return "erase";
	case EMB_OP_LOCATE:
		return "locate";
	case EMB_OP_PULL_MANY:
		return "pull_many";
	case EMB_OP_PUSH_MANY:
		return "push_many";
	case EMB_OP_BIRTHS:
		return "births";
	case EMB_OP_LIST_BIRTHS:
		return "list_births";
	case EMB_OP_PACE:
		return "pace";
	case EMB_OP_STATS:
		return "stats";
	case EMB_OP_EVICT:
		return "evict";
	case EMB_OP_DUMP_BEGIN:
		return "dump_begin";
	case EMB_OP_DUMP_CHUNK:
		return "dump_chunk";
	case EMB_OP_DUMP_END:
		return "dump_end";
	case EMB_OP_BARRIER:
		return "barrier";
	case EMB_OP_SET_MODE:
		return "set_mode";
	case EMB_OP_SET_LIFECYCLE:
		return "set_lifecycle";
	case EMB_OP_CLUSTER_MAP:
		return "cluster_map";
	case EMB_OP_REGISTER:
		return "register";
	case EMB_OP_HEARTBEAT:
		return "heartbeat";
	case EMB_OP_FINISH:
		return "finish";
	case EMB_OP_FILL_DONE:
		return "fill_done";
	case EMB_OP_DRAIN:
		return "drain";
	case EMB_OP_MOVES:
		return "moves";
	default:
		return "?";
	}
}

bool emb_wire_op_known(uint8_t op)
{
	return emb_wire_op_name(op)[0] != '?';
}

int emb_wire_limits_validate(const struct emb_wire_limits *lim)
{
	if (!lim)
		return EMB_EBADARG;
	if (lim->max_frame_bytes < 64 ||
	    lim->max_frame_bytes > EMB_WIRE_FRAME_MAX)
		return EMB_EBADARG;
	if (lim->max_ids == 0 || lim->max_tables == 0)
		return EMB_EBADARG;
	if (lim->max_dim == 0 || lim->max_dim > EMB_WIRE_DIM_MAX)
		return EMB_EBADARG;
	return 0;
}

void emb_wire_hdr_encode(void *buf, const struct emb_frame_hdr *hdr)
{
	emb_frame_hdr_encode(buf, hdr);
}

int emb_wire_hdr_decode(const void *buf, size_t len,
			const struct emb_wire_limits *lim,
			struct emb_frame_hdr *out)
{
	const uint8_t *p = buf;
	struct emb_frame_hdr h;
	int rc;

	if (!p || !out || emb_wire_limits_validate(lim))
		return EMB_EBADARG;
	if (len < EMB_WIRE_HDR_SIZE)
		return EMB_ETRUNCFRAME;

	emb_frame_hdr_decode(p, &h);
	rc = emb_frame_hdr_check(&h);
	if (rc)
		return rc;
	if (!emb_wire_op_known(h.opcode & ~EMB_OP_RESPONSE_BIT))
		return EMB_EBADOP;
	if (!emb_frame_fits(&h, lim->max_frame_bytes))
		return EMB_ETOOBIG;
	*out = h;
	return 0;
}

int emb_wire_frame_decode(const void *buf, size_t len,
			  const struct emb_wire_limits *lim,
			  struct emb_wire_frame *out)
{
	struct emb_frame_hdr h;
	int rc;

	if (!out || ((uintptr_t)buf & 7))
		return EMB_EBADARG;
	rc = emb_wire_hdr_decode(buf, len, lim, &h);
	if (rc)
		return rc;
	if (len - EMB_WIRE_HDR_SIZE < h.payload_len)
		return EMB_ETRUNCFRAME;
	out->hdr = h;
	out->payload = (const uint8_t *)buf + EMB_WIRE_HDR_SIZE;
	out->lim = lim;
	return 0;
}

/* ---- shared checks -------------------------------------------------- */

static const struct op_rule *rule_of(uint8_t op)
{
	static const struct op_rule none = {0, TBL_ANY};

	if (op < NRULES)
		return &op_rules[op];
	return &none;
}

static bool table_ok(uint8_t rule, uint32_t table_id)
{
	switch (rule) {
	case TBL_NONE:
		return table_id == 0;
	case TBL_SET:
		return table_id != 0;
	default:
		return true;
	}
}

/* The frame is request op with a request's status, flags and table id. */
static int check_req(const struct emb_wire_frame *f, uint8_t op)
{
	const struct op_rule *r = rule_of(op);

	if (!f || f->hdr.opcode != op)
		return EMB_EBADARG;
	if (f->hdr.flags & ~r->flags)
		return EMB_EBADFRAME;
	/* A request's status is 0, or with EMB_F_EPOCH the map epoch. */
	if ((f->hdr.flags & EMB_F_EPOCH) ? f->hdr.status <= 0
					 : f->hdr.status != 0)
		return EMB_EBADFRAME;
	/* Fill rows carry their epoch and their optimizer state. */
	if ((f->hdr.flags & EMB_F_FILL) &&
	    (f->hdr.flags & (EMB_F_EPOCH | EMB_F_WITH_STATE)) !=
		(EMB_F_EPOCH | EMB_F_WITH_STATE))
		return EMB_EBADFRAME;
	if ((f->hdr.flags & EMB_F_WARM) && !(f->hdr.flags & EMB_F_FILL))
		return EMB_EBADFRAME;
	if (!table_ok(r->table, f->hdr.table_id))
		return EMB_EBADFRAME;
	return 0;
}

int emb__wire_check_resp(const struct emb_wire_frame *f, uint8_t op)
{
	if (!f || f->hdr.opcode != (op | EMB_OP_RESPONSE_BIT))
		return EMB_EBADARG;
	if (f->hdr.status < 0)
		return EMB_ESERVER;
	if (f->hdr.status > 0 || (f->hdr.flags & ~rule_of(op)->flags))
		return EMB_EBADFRAME;
	return 0;
}

/*
 * n ids at the payload's offset off must end exactly at payload_len; counts
 * are widened to 64 bits so no product can wrap.
 */
static int ids_check(const struct emb_wire_frame *f, uint64_t off)
{
	uint32_t n = f->hdr.count;

	if (n > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	if (off + 8ull * n != f->hdr.payload_len)
		return EMB_EBADFRAME;
	return 0;
}

/*
 * n rows of stride floats from payload offset off to the end. When the bytes
 * left are a whole number of rows of another width, the sender's table has
 * another dim: say so, rather than "malformed".
 */
static int rows_check(const struct emb_wire_frame *f, uint64_t off,
		      uint32_t stride)
{
	uint32_t n = f->hdr.count;
	uint64_t rest;

	if (n > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	if (off > f->hdr.payload_len)
		return EMB_EBADFRAME;
	rest = f->hdr.payload_len - off;
	if (rest == 4ull * n * stride)
		return 0;
	if (n > 0 && rest > 0 && rest % (4ull * n) == 0)
		return EMB_EBADDIM;
	return EMB_EBADFRAME;
}

bool emb__wire_zeros(const uint8_t *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

void emb__wire_put_hdr(void *buf, uint8_t op, uint16_t flags, uint64_t req_id,
		       uint32_t table_id, uint32_t count, uint32_t payload_len,
		       int32_t status)
{
	struct emb_frame_hdr h = {
	    .magic = EMB_WIRE_MAGIC,
	    .version = EMB_WIRE_VERSION,
	    .opcode = op,
	    .flags = flags,
	    .req_id = req_id,
	    .table_id = table_id,
	    .count = count,
	    .payload_len = payload_len,
	    .status = status,
	};

	emb_wire_hdr_encode(buf, &h);
}

/* ---- table spec ----------------------------------------------------- */

int emb__wire_spec_put(uint8_t *p, const struct emb_wire_spec *s)
{
	size_t len = strnlen(s->name, EMB_WIRE_NAME_SIZE);

	if (len == 0 || len >= EMB_WIRE_NAME_SIZE)
		return EMB_EBADNAME;
	if (s->dim == 0 || s->dim > EMB_WIRE_DIM_MAX)
		return EMB_EBADDIM;
	memset(p, 0, EMB_WIRE_NAME_SIZE);
	memcpy(p, s->name, len);
	emb_le32_store(p + 64, s->dim);
	emb_cfg_optim_encode(p + 68, &s->optim);
	emb_cfg_init_encode(p + 108, &s->init);
	emb_le64_store(p + 120, s->seed);
	return 0;
}

/*
 * A name is canonical: non-empty, NUL within the field, zeros after it, so
 * that two encodings of one spec are byte-identical and nothing hides in
 * the padding.
 */
int emb__wire_spec_check(const uint8_t *p, const struct emb_wire_limits *lim)
{
	const uint8_t *nul = memchr(p, 0, EMB_WIRE_NAME_SIZE);
	uint32_t dim = emb_le32_load(p + 64);

	if (!nul || nul == p)
		return EMB_EBADNAME;
	if (!emb__wire_zeros(nul, (size_t)(p + EMB_WIRE_NAME_SIZE - nul)))
		return EMB_EBADNAME;
	if (dim == 0 || dim > lim->max_dim)
		return EMB_EBADDIM;
	return 0;
}

uint32_t emb__wire_fmt_word(const struct emb_wire_spec *s)
{
	return s->row_format |
	       (s->row_format != EMB_ROWFMT_FP32 &&
			s->rounding == EMB_ROUND_NEAREST
		    ? 0x100u
		    : 0u);
}

int emb__wire_fmt_set(uint32_t w, struct emb_wire_spec *s)
{
	if ((w & ~0x1ffu) || (w & 0xffu) >= EMB_ROWFMT_COUNT ||
	    ((w & 0x100u) && (w & 0xffu) == EMB_ROWFMT_FP32))
		return EMB_EBADFORMAT;
	s->row_format = w & 0xffu;
	s->rounding = (w & 0x100u) ? EMB_ROUND_NEAREST : EMB_ROUND_STOCHASTIC;
	return 0;
}

/* Reads a spec that passed emb__wire_spec_check(). */
void emb__wire_spec_get(const uint8_t *p, struct emb_wire_spec *s)
{
	memcpy(s->name, p, EMB_WIRE_NAME_SIZE);
	s->dim = emb_le32_load(p + 64);
	emb_cfg_optim_decode(p + 68, &s->optim);
	emb_cfg_init_decode(p + 108, &s->init);
	s->seed = emb_le64_load(p + 120);
	/* Only CREATE_TABLE carries a lifecycle, after the spec; the
	 * row format travels beside the spec, in each message's own way. */
	s->life = EMB_LIFECYCLE_CFG_DEFAULT;
	s->row_format = EMB_ROWFMT_FP32;
	s->rounding = EMB_ROUND_STOCHASTIC;
	s->tier = EMB_TIER_AUTO;
	s->tier_pad = 0;
	s->tier_max = 0;
}

/* ---- encoders into a buffer ------------------------------------------ */

int emb_wire_hello_req_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t client_version, const void *token,
			      uint32_t token_len, const char *name)
{
	return emb_wire_hello_req_encode_flags(buf, cap, req_id, client_version,
					       0, token, token_len, name);
}

int emb_wire_hello_req_encode_flags(void *buf, size_t cap, uint64_t req_id,
				    uint32_t client_version, uint16_t flags,
				    const void *token, uint32_t token_len,
				    const char *name)
{
	size_t name_len = name ? strlen(name) : 0;
	uint32_t plen;
	uint8_t *p = buf;

	if (token_len > EMB_WIRE_TOKEN_MAX || (token_len && !token) ||
	    name_len > EMB_WIRE_CLIENT_NAME_MAX || (flags & ~EMB_F_ADMIN))
		return EMB_EBADARG;
	plen = 8 + token_len + (uint32_t)name_len;
	if (!p || cap < EMB_WIRE_HDR_SIZE + plen)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_HELLO, flags, req_id, 0, 0, plen, 0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, client_version);
	emb_le16_store(p + 4, (uint16_t)token_len);
	emb_le16_store(p + 6, (uint16_t)name_len);
	if (token_len)
		memcpy(p + 8, token, token_len);
	if (name_len)
		memcpy(p + 8 + token_len, name, name_len);
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

int emb_wire_hello_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_hello_resp *resp)
{
	uint8_t *p = buf;

	if (!resp || emb_wire_limits_validate(&resp->limits))
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_HELLO | EMB_OP_RESPONSE_BIT, 0, req_id, 0, 0,
		EMB_WIRE_HELLO_RESP_SIZE, 0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p + 0, resp->server_version);
	emb_le32_store(p + 4, resp->limits.max_frame_bytes);
	emb_le32_store(p + 8, resp->limits.max_ids);
	emb_le32_store(p + 12, resp->limits.max_tables);
	emb_le32_store(p + 16, resp->limits.max_dim);
	emb_le32_store(p + 20, resp->features);
	emb_le64_store(p + 24, resp->server_id);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_HELLO_RESP_SIZE);
}

/* Writes a lifecycle block (wire_msg.h) that validate accepted. */
static void life_put(uint8_t *p, const struct emb_lifecycle_cfg *c)
{
	emb_le32_store(p, c->admit);
	emb_le32_store(p + 4, c->admit_n);
	emb_le32_store(p + 8, c->bloom_bytes);
	emb_le32_store(p + 12, c->ttl_steps);
	emb_lef32_store(p + 16, c->min_l2);
	emb_le32_store(p + 20, c->order);
	emb_le64_store(p + 24, c->max_rows);
}

static int life_get(const uint8_t *p, struct emb_lifecycle_cfg *c)
{
	c->admit = emb_le32_load(p);
	c->admit_n = emb_le32_load(p + 4);
	c->bloom_bytes = emb_le32_load(p + 8);
	c->ttl_steps = emb_le32_load(p + 12);
	c->min_l2 = emb_lef32_load(p + 16);
	c->order = emb_le32_load(p + 20);
	c->max_rows = emb_le64_load(p + 24);
	return emb_lifecycle_validate(c) ? EMB_EBADLIFE : 0;
}

int emb_wire_create_req_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_spec *spec)
{
	uint8_t *p = buf;
	uint32_t len = EMB_WIRE_SPEC_SIZE, word, at;
	struct emb_wire_spec chk;
	bool life, tier;
	int rc;

	if (!spec)
		return EMB_EBADARG;
	if (emb_lifecycle_validate(&spec->life))
		return EMB_EBADLIFE;
	word = emb__wire_fmt_word(spec);
	if (spec->rounding > EMB_ROUND_NEAREST ||
	    emb__wire_fmt_set(word, &chk))
		return EMB_EBADFORMAT;
	if (spec->tier >= EMB_TIER_MODE_COUNT)
		return EMB_EBADARG;
	life = !emb_lifecycle_is_off(&spec->life);
	tier = spec->tier != EMB_TIER_AUTO || spec->tier_max;
	if (word)
		len += EMB_WIRE_ROWFMT_SIZE;
	if (tier)
		len += EMB_WIRE_TIER_SIZE;
	if (life)
		len += EMB_WIRE_LIFECYCLE_SIZE;
	if (!p || cap < EMB_WIRE_HDR_SIZE + len)
		return -ENOSPC;
	rc = emb__wire_spec_put(p + EMB_WIRE_HDR_SIZE, spec);
	if (rc)
		return rc;
	at = EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE;
	if (word) {
		emb_le32_store(p + at, word);
		emb_le32_store(p + at + 4, 0);
		at += EMB_WIRE_ROWFMT_SIZE;
	}
	if (tier) {
		emb_le32_store(p + at, spec->tier);
		emb_le32_store(p + at + 4, 0);
		emb_le64_store(p + at + 8, spec->tier_max);
		at += EMB_WIRE_TIER_SIZE;
	}
	if (life)
		life_put(p + at, &spec->life);
	emb__wire_put_hdr(p, EMB_OP_CREATE_TABLE,
			  (uint16_t)((word ? EMB_F_ROWFMT : 0) |
				     (tier ? EMB_F_TIER : 0)),
			  req_id, 0, 0, len, 0);
	return (int)(EMB_WIRE_HDR_SIZE + len);
}

static bool empty_req_op(uint8_t op)
{
	return op == EMB_OP_DROP_TABLE || op == EMB_OP_LIST_TABLES ||
	       op == EMB_OP_STATS;
}

int emb_wire_empty_req_encode(void *buf, size_t cap, uint8_t op,
			      uint64_t req_id, uint32_t table_id)
{
	if (!empty_req_op(op) || !table_ok(rule_of(op)->table, table_id))
		return EMB_EBADARG;
	if (!buf || cap < EMB_WIRE_HDR_SIZE)
		return -ENOSPC;
	emb__wire_put_hdr(buf, op, 0, req_id, table_id, 0, 0, 0);
	return (int)EMB_WIRE_HDR_SIZE;
}

static bool ack_op(uint8_t op)
{
	return op == EMB_OP_CREATE_TABLE || op == EMB_OP_DROP_TABLE ||
	       op == EMB_OP_PUSH || op == EMB_OP_ASSIGN || op == EMB_OP_ERASE ||
	       op == EMB_OP_SET_MODE || op == EMB_OP_SET_LIFECYCLE ||
	       op == EMB_OP_PACE;
}

int emb_wire_ack_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			uint32_t table_id, uint32_t count)
{
	if (!ack_op(op) || (count && op != EMB_OP_ERASE))
		return EMB_EBADARG;
	if (op == EMB_OP_CREATE_TABLE && table_id == 0)
		return EMB_EBADARG;
	if (!buf || cap < EMB_WIRE_HDR_SIZE)
		return -ENOSPC;
	emb__wire_put_hdr(buf, op | EMB_OP_RESPONSE_BIT, 0, req_id, table_id, count, 0,
		0);
	return (int)EMB_WIRE_HDR_SIZE;
}

/* The ERROR payload after a header answering resp_op (response bit set). */
static int error_put(void *buf, size_t cap, uint8_t resp_op, uint64_t req_id,
		     uint32_t table_id, int32_t status, const char *msg)
{
	size_t len = msg ? strlen(msg) : 0;
	uint8_t *p = buf;

	if (len > EMB_WIRE_ERRMSG_MAX) {
		/* Never cut a multi-byte character in half: back off over
		 * continuation bytes (10xxxxxx) to the start of msg[len]'s. */
		len = EMB_WIRE_ERRMSG_MAX;
		while (len > 0 && ((uint8_t)msg[len] & 0xc0) == 0x80)
			len--;
	}
	if (!p || cap < EMB_WIRE_HDR_SIZE + 4 + len)
		return -ENOSPC;
	emb__wire_put_hdr(p, resp_op, 0, req_id, table_id, 0,
		(uint32_t)(4 + len), status);
	emb_le32_store(p + EMB_WIRE_HDR_SIZE, (uint32_t)len);
	if (len)
		memcpy(p + EMB_WIRE_HDR_SIZE + 4, msg, len);
	return (int)(EMB_WIRE_HDR_SIZE + 4 + len);
}

int emb_wire_error_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			  uint32_t table_id, int32_t status, const char *msg)
{
	if (status >= 0 || !emb_wire_op_known(op))
		return EMB_EBADARG;
	return error_put(buf, cap, op | EMB_OP_RESPONSE_BIT, req_id, table_id,
			 status, msg);
}

int emb_wire_error_echo_encode(void *buf, size_t cap,
			       const struct emb_frame_hdr *req,
			       uint32_t table_id, int32_t status,
			       const char *msg)
{
	if (!req || status >= 0)
		return EMB_EBADARG;
	/* Whatever the peer sent, known opcode or not: it is answered. */
	return error_put(buf, cap, (uint8_t)(req->opcode | EMB_OP_RESPONSE_BIT),
			 req->req_id, table_id, status, msg);
}

int emb_wire_reject_encode(void *buf, size_t cap,
			   const struct emb_frame_hdr *req, int status,
			   const char *msg)
{
	/* The transport refuses frames before anything decodes them. */
	return emb_wire_error_echo_encode(buf, cap, req, 0, status, msg);
}

int emb_wire_list_resp_encode(void *buf, size_t cap, uint64_t req_id,
			      const struct emb_wire_table_info *tables,
			      uint32_t n)
{
	uint64_t plen = (uint64_t)n * EMB_WIRE_LIST_ENTRY_SIZE;
	uint8_t *p = buf;
	uint32_t i;
	int rc;

	if (n && !tables)
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOMANYTABLES;
	if (!p || cap < EMB_WIRE_HDR_SIZE + plen)
		return -ENOSPC;
	for (i = 0; i < n; i++) {
		uint8_t *e = p + EMB_WIRE_HDR_SIZE +
			     (size_t)i * EMB_WIRE_LIST_ENTRY_SIZE;

		if (tables[i].table_id == 0)
			return EMB_EBADARG;
		emb_le32_store(e, tables[i].table_id);
		emb_le32_store(e + 4, emb__wire_fmt_word(&tables[i].spec));
		rc = emb__wire_spec_put(e + 8, &tables[i].spec);
		if (rc)
			return rc;
		emb_le64_store(e + 136, tables[i].rows);
	}
	emb__wire_put_hdr(p, EMB_OP_LIST_TABLES | EMB_OP_RESPONSE_BIT, 0, req_id, 0, n,
		(uint32_t)plen, 0);
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

int emb_wire_stats_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       uint32_t table_id,
			       const struct emb_wire_stats *stats, uint32_t n)
{
	const uint64_t esize = 8 + 8 * EMB_WIRE_STATS_FIELDS;
	uint64_t plen = EMB_WIRE_STATS_PREFIX_SIZE + (uint64_t)n * esize;
	uint8_t *p = buf;
	uint32_t i, j;

	if (n && !stats)
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOMANYTABLES;
	if (!p || cap < EMB_WIRE_HDR_SIZE + plen)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_STATS | EMB_OP_RESPONSE_BIT, 0, req_id, table_id, n,
		(uint32_t)plen, 0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, EMB_WIRE_STATS_FIELDS);
	emb_le32_store(p + 4, 0);
	p += EMB_WIRE_STATS_PREFIX_SIZE;
	for (i = 0; i < n; i++, p += esize) {
		const uint8_t *s = (const uint8_t *)&stats[i];

		emb_le32_store(p, stats[i].table_id);
		emb_le32_store(p + 4, 0);
		for (j = 0; j < EMB_WIRE_STATS_FIELDS; j++)
			emb_le64_store(p + 8 + 8 * j,
				       emb_le64_load(s + stats_offs[j]));
	}
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

/* ---- encoders into iovecs -------------------------------------------- */

static void iovs_start(struct emb_wire_iovs *out, size_t head_len)
{
	out->iov[0].iov_base = out->head;
	out->iov[0].iov_len = head_len;
	out->iovcnt = 1;
	out->nbytes = head_len;
}

/* Adds a borrowed array; empty ones get no entry, which writev dislikes. */
static void iovs_add(struct emb_wire_iovs *out, const void *p, size_t len)
{
	if (len == 0)
		return;
	/* writev never writes through iov_base: the cast drops const only. */
	out->iov[out->iovcnt].iov_base = (void *)(uintptr_t)p;
	out->iov[out->iovcnt].iov_len = len;
	out->iovcnt++;
	out->nbytes += len;
}

int emb_wire_pull_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			     uint32_t table_id, uint16_t flags,
			     const uint64_t *ids, uint32_t n)
{
	uint64_t plen = 8ull * n;

	if (!out || table_id == 0 ||
	    (flags & ~(EMB_F_NOCREATE | EMB_F_WITH_STATE | EMB_F_FP32)) ||
	    (flags & (EMB_F_WITH_STATE | EMB_F_FP32)) ==
		(EMB_F_WITH_STATE | EMB_F_FP32) ||
	    (n && !ids))
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	emb__wire_put_hdr(out->head, EMB_OP_PULL, flags, req_id, table_id, n,
		(uint32_t)plen, 0);
	iovs_start(out, EMB_WIRE_HDR_SIZE);
	iovs_add(out, ids, plen);
	return 0;
}

/*
 * Header of a PULL response; returns the payload size or an error. stride is
 * dim, or dim + state floats with EMB_F_WITH_STATE.
 */
static int64_t pull_resp_hdr(uint8_t *head, uint64_t req_id, uint32_t table_id,
			     uint16_t flags, uint32_t n, uint32_t stride,
			     const uint8_t *found)
{
	uint64_t bits = (flags & EMB_F_NOCREATE) ? emb_wire_bitmap_bytes(n) : 0;
	uint64_t plen = bits + 4ull * n * stride;
	uint32_t max = (flags & EMB_F_WITH_STATE) ? STRIDE_MAX
						  : EMB_WIRE_DIM_MAX;

	if (table_id == 0 ||
	    (flags & ~(EMB_F_NOCREATE | EMB_F_WITH_STATE | EMB_F_FP32)) ||
	    stride == 0 || stride > max || (bits && !found))
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	emb__wire_put_hdr(head, EMB_OP_PULL | EMB_OP_RESPONSE_BIT, flags, req_id,
		table_id, n, (uint32_t)plen, 0);
	return (int64_t)plen;
}

int emb_wire_pull_resp_encode(struct emb_wire_iovs *out, uint64_t req_id,
			      uint32_t table_id, uint16_t flags, uint32_t n,
			      uint32_t stride, const uint8_t *found,
			      const float *rows)
{
	int64_t plen;

	if (!out || (n && !rows))
		return EMB_EBADARG;
	plen = pull_resp_hdr(out->head, req_id, table_id, flags, n, stride,
			     found);
	if (plen < 0)
		return (int)plen;
	iovs_start(out, EMB_WIRE_HDR_SIZE);
	if (flags & EMB_F_NOCREATE)
		iovs_add(out, found, emb_wire_bitmap_bytes(n));
	iovs_add(out, rows, 4ull * n * stride);
	return 0;
}

int emb_wire_pull_resp_encode_ptrs(
    uint8_t *head, struct iovec *iov, uint32_t iov_cap, uint64_t req_id,
    uint32_t table_id, uint16_t flags, uint32_t n, uint32_t stride,
    const uint8_t *found, const float *const *rows, const float *zero_row)
{
	size_t row_bytes = 4 * (size_t)stride;
	uint32_t cnt = 1, i;
	int64_t plen;

	if (!head || !iov || iov_cap == 0 || (n && !rows))
		return EMB_EBADARG;
	plen = pull_resp_hdr(head, req_id, table_id, flags, n, stride, found);
	if (plen < 0)
		return (int)plen;
	iov[0].iov_base = head;
	iov[0].iov_len = EMB_WIRE_HDR_SIZE;
	if ((flags & EMB_F_NOCREATE) && n) {
		if (iov_cap < 2)
			return -ENOSPC;
		iov[1].iov_base = (void *)(uintptr_t)found;
		iov[1].iov_len = emb_wire_bitmap_bytes(n);
		cnt = 2;
	}
	for (i = 0; i < n; i++) {
		const float *r = rows[i] ? rows[i] : zero_row;
		struct iovec *last = &iov[cnt - 1];

		if (!r)
			return EMB_EBADARG;
		/* Rows that sit back to back in a slab go out as one entry. */
		if ((const uint8_t *)last->iov_base + last->iov_len ==
		    (const uint8_t *)r) {
			last->iov_len += row_bytes;
			continue;
		}
		if (cnt == iov_cap)
			return -ENOSPC;
		iov[cnt].iov_base = (void *)(uintptr_t)r;
		iov[cnt].iov_len = row_bytes;
		cnt++;
	}
	return (int)cnt;
}

int emb_wire_push_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			     uint32_t table_id, uint64_t step, uint32_t rank,
			     const uint64_t *ids, uint32_t n, uint32_t dim,
			     const float *grads)
{
	return emb_wire_push_req_encode_session(out, req_id, table_id, step,
						rank, 0, 0, ids, n, dim, grads);
}

/*
 * A PUSH frame whose gradients are glen bytes at grads; flags adds the
 * gradients' format, and half-precision ones are padded with zeros to a
 * multiple of 8 (f32 ones never were). Both public encoders below.
 */
static int push_encode(struct emb_wire_iovs *out, uint64_t req_id,
		       uint32_t table_id, uint64_t step, uint32_t rank,
		       uint64_t session, uint64_t seq, const uint64_t *ids,
		       uint32_t n, uint32_t dim, uint16_t flags,
		       const void *grads, uint64_t glen, const uint32_t *births)
{
	static const uint8_t zeros[8];
	const uint64_t pad = flags ? (8 - glen % 8) % 8 : 0;
	const uint64_t blen = births ? 4ull * n : 0, bpad = blen % 8;
	uint32_t pre_len = session ? EMB_WIRE_PUSH_SESSION_PREFIX_SIZE
				   : EMB_WIRE_PUSH_PREFIX_SIZE;
	uint64_t plen = pre_len + 8ull * n + glen + pad + blen + bpad;
	uint8_t *pre = out ? out->head + EMB_WIRE_HDR_SIZE : NULL;

	if (!out || table_id == 0 || dim == 0 || dim > EMB_WIRE_DIM_MAX ||
	    (n && (!ids || !grads)) || (session && seq == 0))
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	emb__wire_put_hdr(out->head, EMB_OP_PUSH,
			  (uint16_t)(flags | (session ? EMB_F_SESSION : 0) |
				     (births ? EMB_F_BIRTHS : 0)),
			  req_id, table_id, n, (uint32_t)plen, 0);
	emb_le64_store(pre, step);
	emb_le32_store(pre + 8, rank);
	emb_le32_store(pre + 12, 0);
	if (session) {
		emb_le64_store(pre + 16, session);
		emb_le64_store(pre + 24, seq);
	}
	iovs_start(out, EMB_WIRE_HDR_SIZE + pre_len);
	iovs_add(out, ids, 8ull * n);
	iovs_add(out, grads, glen);
	iovs_add(out, zeros, pad);
	iovs_add(out, births, blen);
	iovs_add(out, zeros, bpad);
	return 0;
}

int emb_wire_push_req_encode_session(struct emb_wire_iovs *out,
				     uint64_t req_id, uint32_t table_id,
				     uint64_t step, uint32_t rank,
				     uint64_t session, uint64_t seq,
				     const uint64_t *ids, uint32_t n,
				     uint32_t dim, const float *grads)
{
	return push_encode(out, req_id, table_id, step, rank, session, seq,
			   ids, n, dim, 0, grads, 4ull * n * dim, NULL);
}

int emb_wire_push_req_encode_half(struct emb_wire_iovs *out, uint64_t req_id,
				  uint32_t table_id, uint64_t step,
				  uint32_t rank, uint64_t session, uint64_t seq,
				  const uint64_t *ids, uint32_t n, uint32_t dim,
				  uint32_t half, const uint16_t *grads)
{
	if (half != EMB_ROWFMT_FP16 && half != EMB_ROWFMT_BF16)
		return EMB_EBADARG;
	return push_encode(out, req_id, table_id, step, rank, session, seq,
			   ids, n, dim,
			   half == EMB_ROWFMT_FP16 ? EMB_F_GRAD_FP16
						   : EMB_F_GRAD_BF16,
			   grads, 2ull * n * dim, NULL);
}

int emb_wire_push_req_encode_births(struct emb_wire_iovs *out,
				    uint64_t req_id, uint32_t table_id,
				    uint64_t step, uint32_t rank,
				    uint64_t session, uint64_t seq,
				    const uint64_t *ids, uint32_t n,
				    uint32_t dim, uint32_t half,
				    const void *grads, const uint32_t *births)
{
	if (half && half != EMB_ROWFMT_FP16 && half != EMB_ROWFMT_BF16)
		return EMB_EBADARG;
	return push_encode(out, req_id, table_id, step, rank, session, seq,
			   ids, n, dim,
			   half == EMB_ROWFMT_FP16   ? EMB_F_GRAD_FP16
			   : half == EMB_ROWFMT_BF16 ? EMB_F_GRAD_BF16
						     : 0,
			   grads, (half ? 2ull : 4ull) * n * dim, births);
}

int emb_wire_assign_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, uint16_t flags,
			       const uint64_t *ids, uint32_t n, uint32_t stride,
			       const float *rows)
{
	return emb_wire_assign_req_encode_meta(out, req_id, table_id, flags,
					       ids, n, stride, rows, NULL);
}

int emb_wire_assign_req_encode_meta(struct emb_wire_iovs *out,
				    uint64_t req_id, uint32_t table_id,
				    uint16_t flags, const uint64_t *ids,
				    uint32_t n, uint32_t stride,
				    const float *rows, const uint32_t *meta)
{
	return emb_wire_assign_req_encode_births(out, req_id, table_id, flags,
						 ids, n, stride, rows, meta,
						 NULL);
}

int emb_wire_assign_req_encode_births(struct emb_wire_iovs *out,
				      uint64_t req_id, uint32_t table_id,
				      uint16_t flags, const uint64_t *ids,
				      uint32_t n, uint32_t stride,
				      const float *rows, const uint32_t *meta,
				      const uint32_t *births)
{
	static const uint8_t zeros[8];
	const uint64_t blen = births ? 4ull * n : 0;
	uint64_t plen = 8ull * n + 4ull * n * stride + (meta ? 8ull * n : 0) +
			blen + blen % 8;

	if (!out || table_id == 0 || (flags & ~EMB_F_WITH_STATE) ||
	    stride == 0 || stride > STRIDE_MAX ||
	    (n && (!ids || !rows)))
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	if (meta)
		flags |= EMB_F_META;
	if (births)
		flags |= EMB_F_BIRTHS;
	emb__wire_put_hdr(out->head, EMB_OP_ASSIGN, flags, req_id, table_id, n,
		(uint32_t)plen, 0);
	iovs_start(out, EMB_WIRE_HDR_SIZE);
	iovs_add(out, ids, 8ull * n);
	iovs_add(out, rows, 4ull * n * stride);
	if (meta)
		iovs_add(out, meta, 8ull * n);
	iovs_add(out, births, blen);
	iovs_add(out, zeros, blen % 8);
	return 0;
}

/* ERASE and LOCATE: a table id and its ids, nothing else. */
static int ids_req_encode(struct emb_wire_iovs *out, uint8_t op,
			  uint64_t req_id, uint32_t table_id,
			  const uint64_t *ids, uint32_t n)
{
	uint64_t plen = 8ull * n;

	if (!out || table_id == 0 || (n && !ids))
		return EMB_EBADARG;
	if (plen > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	emb__wire_put_hdr(out->head, op, 0, req_id, table_id, n,
			  (uint32_t)plen, 0);
	iovs_start(out, EMB_WIRE_HDR_SIZE);
	iovs_add(out, ids, plen);
	return 0;
}

int emb_wire_erase_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			      uint32_t table_id, const uint64_t *ids,
			      uint32_t n)
{
	return ids_req_encode(out, EMB_OP_ERASE, req_id, table_id, ids, n);
}

int emb_wire_list_births_req_encode(void *buf, size_t cap, uint64_t req_id,
				    uint32_t table_id, uint32_t first,
				    uint32_t n)
{
	uint8_t *p = buf;

	if (table_id == 0 || n == 0 || first >= EMB_NSLOTS ||
	    n > EMB_NSLOTS - first)
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + 8)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_LIST_BIRTHS, 0, req_id, table_id, n, 8, 0);
	emb_le32_store(p + EMB_WIRE_HDR_SIZE, first);
	emb_le32_store(p + EMB_WIRE_HDR_SIZE + 4, 0);
	return EMB_WIRE_HDR_SIZE + 8;
}

/* 4n bytes rounded up to 8. */
static uint64_t words8(uint64_t n)
{
	return (4 * n + 7) / 8 * 8;
}

size_t emb_wire_list_births_resp_bytes(uint32_t n, uint32_t m)
{
	return EMB_WIRE_HDR_SIZE + 8 + words8(n) + 8ull * m + words8(m);
}

int emb_wire_list_births_resp_encode(void *buf, size_t cap, uint64_t req_id,
				     uint32_t table_id,
				     const struct emb_wire_list_births *r)
{
	uint8_t *p = buf, *at;
	size_t need;

	if (!r || table_id == 0 || r->n == 0 || r->n > EMB_NSLOTS ||
	    !r->marks || (r->m && (!r->ids || !r->births)))
		return EMB_EBADARG;
	need = emb_wire_list_births_resp_bytes(r->n, r->m);
	if (need > EMB_WIRE_FRAME_MAX)
		return EMB_ETOOBIG;
	if (!p || cap < need)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_LIST_BIRTHS | EMB_OP_RESPONSE_BIT, 0,
			  req_id, table_id, r->m,
			  (uint32_t)(need - EMB_WIRE_HDR_SIZE), 0);
	at = p + EMB_WIRE_HDR_SIZE;
	emb_le32_store(at, r->n);
	emb_le32_store(at + 4, 0);
	at += 8;
	/* Each array to its place, in order: a later one never overlaps an
	 * earlier one's destination when they are already laid out. */
	memmove(at, r->marks, 4ull * r->n);
	memset(at + 4ull * r->n, 0, words8(r->n) - 4ull * r->n);
	at += words8(r->n);
	if (r->m) {
		memmove(at, r->ids, 8ull * r->m);
		memmove(at + 8ull * r->m, r->births, 4ull * r->m);
	}
	at += 8ull * r->m;
	memset(at + 4ull * r->m, 0, words8(r->m) - 4ull * r->m);
	return (int)need;
}

int emb_wire_births_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, const uint64_t *ids,
			       uint32_t n)
{
	return ids_req_encode(out, EMB_OP_BIRTHS, req_id, table_id, ids, n);
}

size_t emb_wire_births_resp_bytes(uint32_t n)
{
	return EMB_WIRE_HDR_SIZE + (4ull * n + 7) / 8 * 8;
}

int emb_wire_births_resp_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t table_id, const uint32_t *births,
				uint32_t n)
{
	uint8_t *p = buf;
	size_t need;

	if (table_id == 0 || (n && !births))
		return EMB_EBADARG;
	need = emb_wire_births_resp_bytes(n);
	if (need > EMB_WIRE_FRAME_MAX)
		return EMB_ETOOBIG;
	if (!p || cap < need)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_BIRTHS | EMB_OP_RESPONSE_BIT, 0, req_id,
			  table_id, n, (uint32_t)(need - EMB_WIRE_HDR_SIZE),
			  0);
	p += EMB_WIRE_HDR_SIZE;
	if ((const void *)p != (const void *)births)
		memmove(p, births, 4ull * n);
	memset(p + 4ull * n, 0, need - EMB_WIRE_HDR_SIZE - 4ull * n);
	return (int)need;
}

int emb_wire_locate_req_encode(struct emb_wire_iovs *out, uint64_t req_id,
			       uint32_t table_id, const uint64_t *ids,
			       uint32_t n)
{
	return ids_req_encode(out, EMB_OP_LOCATE, req_id, table_id, ids, n);
}

size_t emb_wire_locate_resp_bytes(uint32_t n)
{
	return EMB_WIRE_HDR_SIZE + EMB_WIRE_LOCATE_HEAD_SIZE +
	       (size_t)n * EMB_WIRE_LOCATE_ENTRY_SIZE;
}

int emb_wire_locate_resp_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t table_id,
				const struct emb_wire_locate_resp *r)
{
	uint8_t *p = buf;
	size_t need;

	if (!r || table_id == 0 || (r->n && !r->entries))
		return EMB_EBADARG;
	need = emb_wire_locate_resp_bytes(r->n);
	if (need > EMB_WIRE_FRAME_MAX)
		return EMB_ETOOBIG;
	if (!p || cap < need)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_LOCATE | EMB_OP_RESPONSE_BIT, 0, req_id,
			  table_id, r->n, (uint32_t)(need - EMB_WIRE_HDR_SIZE),
			  0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le64_store(p, r->seed);
	emb_le32_store(p + 8, r->rec_bytes);
	emb_le32_store(p + 12, r->row_floats);
	if (p + EMB_WIRE_LOCATE_HEAD_SIZE != r->entries)
		memmove(p + EMB_WIRE_LOCATE_HEAD_SIZE, r->entries,
			(size_t)r->n * EMB_WIRE_LOCATE_ENTRY_SIZE);
	return (int)need;
}

void emb_wire_locate_entry_put(void *entries, uint32_t i, uint64_t addr,
			       uint32_t rkey)
{
	uint8_t *e = (uint8_t *)entries + (size_t)i * EMB_WIRE_LOCATE_ENTRY_SIZE;

	emb_le64_store(e, addr);
	emb_le32_store(e + 8, rkey);
	emb_le32_store(e + 12, 0);
}

void emb_wire_locate_entry_get(const struct emb_wire_locate_resp *r,
			       uint32_t i, uint64_t *addr, uint32_t *rkey)
{
	const uint8_t *e = (const uint8_t *)r->entries +
			   (size_t)i * EMB_WIRE_LOCATE_ENTRY_SIZE;

	*addr = emb_le64_load(e);
	*rkey = emb_le32_load(e + 8);
}

int emb_wire_ping_encode(struct emb_wire_iovs *out, uint64_t req_id,
			 bool response, const void *data, uint32_t len)
{
	uint8_t op = EMB_OP_PING | (response ? EMB_OP_RESPONSE_BIT : 0);

	if (!out || (len && !data))
		return EMB_EBADARG;
	if (len > PAYLOAD_MAX)
		return EMB_ETOOBIG;
	emb__wire_put_hdr(out->head, op, 0, req_id, 0, 0, len, 0);
	iovs_start(out, EMB_WIRE_HDR_SIZE);
	iovs_add(out, data, len);
	return 0;
}

int emb_wire_iovs_flatten(const struct emb_wire_iovs *iovs, void *buf,
			  size_t cap)
{
	uint8_t *p = buf;
	int i;

	if (!iovs)
		return EMB_EBADARG;
	if (!p || cap < iovs->nbytes)
		return -ENOSPC;
	for (i = 0; i < iovs->iovcnt; i++) {
		memcpy(p, iovs->iov[i].iov_base, iovs->iov[i].iov_len);
		p += iovs->iov[i].iov_len;
	}
	return (int)iovs->nbytes;
}

void emb_wire_found_pack(const uint8_t *found, uint32_t n, uint8_t *bits)
{
	uint32_t i;

	memset(bits, 0, emb_wire_bitmap_bytes(n));
	for (i = 0; i < n; i++)
		if (found[i])
			bits[i / 8] |= (uint8_t)(1u << (i % 8));
}

/* ---- decoders -------------------------------------------------------- */

int emb_wire_hello_req_decode(const struct emb_wire_frame *f,
			      struct emb_wire_hello_req *out)
{
	const uint8_t *p;
	uint32_t tl, nl;
	int rc;

	rc = check_req(f, EMB_OP_HELLO);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len < 8)
		return EMB_EBADFRAME;
	p = f->payload;
	tl = emb_le16_load(p + 4);
	nl = emb_le16_load(p + 6);
	if (tl > EMB_WIRE_TOKEN_MAX || nl > EMB_WIRE_CLIENT_NAME_MAX)
		return EMB_EBADFRAME;
	if (f->hdr.payload_len != 8 + tl + nl)
		return EMB_EBADFRAME;
	out->client_version = emb_le32_load(p);
	out->admin = (f->hdr.flags & EMB_F_ADMIN) != 0;
	out->token = tl ? p + 8 : NULL;
	out->token_len = tl;
	out->name = (const char *)(p + 8 + tl);
	out->name_len = nl;
	return 0;
}

int emb_wire_hello_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_hello_resp *out)
{
	struct emb_wire_hello_resp r;
	const uint8_t *p;
	int rc;

	rc = emb__wire_check_resp(f, EMB_OP_HELLO);
	if (rc)
		return rc;
	/* EMB_F_ADMIN is a request flag; a response carries none. */
	if (f->hdr.flags || f->hdr.table_id != 0 || f->hdr.count != 0 ||
	    f->hdr.payload_len != EMB_WIRE_HELLO_RESP_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	r.server_version = emb_le32_load(p + 0);
	r.limits.max_frame_bytes = emb_le32_load(p + 4);
	r.limits.max_ids = emb_le32_load(p + 8);
	r.limits.max_tables = emb_le32_load(p + 12);
	r.limits.max_dim = emb_le32_load(p + 16);
	r.features = emb_le32_load(p + 20);
	r.server_id = emb_le64_load(p + 24);
	/* Feature bits a client does not know are not errors: it just does
	 * not use them. */
	if (emb_wire_limits_validate(&r.limits))
		return EMB_EBADFRAME;
	*out = r;
	return 0;
}

int emb_wire_create_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_spec *out)
{
	const bool fmt = f && (f->hdr.flags & EMB_F_ROWFMT);
	const bool tier = f && (f->hdr.flags & EMB_F_TIER);
	const uint32_t at = EMB_WIRE_SPEC_SIZE +
			    (fmt ? EMB_WIRE_ROWFMT_SIZE : 0) +
			    (tier ? EMB_WIRE_TIER_SIZE : 0);
	int rc;

	rc = check_req(f, EMB_OP_CREATE_TABLE);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || (f->hdr.payload_len != at &&
				  f->hdr.payload_len != at + EMB_WIRE_LIFECYCLE_SIZE))
		return EMB_EBADFRAME;
	rc = emb__wire_spec_check(f->payload, f->lim);
	if (rc)
		return rc;
	emb__wire_spec_get(f->payload, out);
	if (fmt) {
		uint32_t word = emb_le32_load(f->payload + EMB_WIRE_SPEC_SIZE);

		/* A word of 0 is sent as no block: one encoding. */
		if (word == 0 ||
		    emb_le32_load(f->payload + EMB_WIRE_SPEC_SIZE + 4) != 0)
			return EMB_EBADFRAME;
		rc = emb__wire_fmt_set(word, out);
		if (rc)
			return rc;
	}
	if (tier) {
		const uint8_t *b = f->payload + EMB_WIRE_SPEC_SIZE +
				   (fmt ? EMB_WIRE_ROWFMT_SIZE : 0);

		out->tier = emb_le32_load(b);
		out->tier_max = emb_le64_load(b + 8);
		/* The default is sent as no block: one encoding. */
		if (out->tier >= EMB_TIER_MODE_COUNT ||
		    emb_le32_load(b + 4) != 0 ||
		    (out->tier == EMB_TIER_AUTO && !out->tier_max))
			return EMB_EBADFRAME;
	}
	if (f->hdr.payload_len == at)
		return 0;
	rc = life_get(f->payload + at, &out->life);
	if (rc)
		return rc;
	/* All off is sent as no block: one encoding per request. */
	if (emb_lifecycle_is_off(&out->life))
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_empty_req_decode(const struct emb_wire_frame *f, uint8_t op)
{
	int rc;

	if (!empty_req_op(op))
		return EMB_EBADARG;
	rc = check_req(f, op);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_ack_decode(const struct emb_wire_frame *f, uint8_t op)
{
	int rc;

	if (!ack_op(op))
		return EMB_EBADARG;
	rc = emb__wire_check_resp(f, op);
	if (rc)
		return rc;
	if (f->hdr.payload_len != 0 || f->hdr.flags != 0)
		return EMB_EBADFRAME;
	if (f->hdr.count != 0 && op != EMB_OP_ERASE)
		return EMB_EBADFRAME;
	if (op == EMB_OP_CREATE_TABLE && f->hdr.table_id == 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_error_decode(const struct emb_wire_frame *f,
			  struct emb_wire_error *out)
{
	uint32_t len;

	if (!f || !(f->hdr.opcode & EMB_OP_RESPONSE_BIT) || f->hdr.status >= 0)
		return EMB_EBADARG;
	if (f->hdr.count != 0 || f->hdr.flags != 0 || f->hdr.payload_len < 4)
		return EMB_EBADFRAME;
	len = emb_le32_load(f->payload);
	if (len > EMB_WIRE_ERRMSG_MAX || f->hdr.payload_len != 4 + len)
		return EMB_EBADFRAME;
	out->status = f->hdr.status;
	out->msg = (const char *)f->payload + 4;
	out->msg_len = len;
	return 0;
}

int emb_wire_list_resp_decode(const struct emb_wire_frame *f,
			      struct emb_wire_list_resp *out)
{
	const uint8_t *e;
	uint32_t n, i;
	int rc;

	rc = emb__wire_check_resp(f, EMB_OP_LIST_TABLES);
	if (rc)
		return rc;
	n = f->hdr.count;
	if (n > f->lim->max_tables)
		return EMB_ETOOMANYTABLES;
	if (f->hdr.table_id != 0 ||
	    (uint64_t)n * EMB_WIRE_LIST_ENTRY_SIZE != f->hdr.payload_len)
		return EMB_EBADFRAME;
	/* Check every entry now so that emb_wire_list_entry() cannot fail. */
	for (i = 0, e = f->payload; i < n; i++, e += EMB_WIRE_LIST_ENTRY_SIZE) {
		struct emb_wire_spec fs;

		if (emb_le32_load(e) == 0)
			return EMB_EBADFRAME;
		rc = emb__wire_fmt_set(emb_le32_load(e + 4), &fs);
		if (rc)
			return rc;
		rc = emb__wire_spec_check(e + 8, f->lim);
		if (rc)
			return rc;
	}
	out->n = n;
	out->entries = f->payload;
	return 0;
}

void emb_wire_list_entry(const struct emb_wire_list_resp *resp, uint32_t i,
			 struct emb_wire_table_info *out)
{
	const uint8_t *e = resp->entries + (size_t)i * EMB_WIRE_LIST_ENTRY_SIZE;

	out->table_id = emb_le32_load(e);
	emb__wire_spec_get(e + 8, &out->spec);
	emb__wire_fmt_set(emb_le32_load(e + 4), &out->spec);
	out->rows = emb_le64_load(e + 136);
}

int emb_wire_pull_req_decode(const struct emb_wire_frame *f,
			     struct emb_wire_pull_req *out)
{
	int rc;

	rc = check_req(f, EMB_OP_PULL);
	if (rc)
		return rc;
	rc = ids_check(f, 0);
	if (rc)
		return rc;
	out->table_id = f->hdr.table_id;
	out->n = f->hdr.count;
	out->nocreate = f->hdr.flags & EMB_F_NOCREATE;
	out->with_state = f->hdr.flags & EMB_F_WITH_STATE;
	out->fp32 = f->hdr.flags & EMB_F_FP32;
	/* Whole rows are the table's own: f32 weights are for pulls of
	 * weights only. */
	if (out->with_state && out->fp32)
		return EMB_EBADFRAME;
	out->ids = (const uint64_t *)(const void *)f->payload;
	return 0;
}

int emb_wire_pull_resp_decode(const struct emb_wire_frame *f, uint32_t dim,
			      uint32_t state_floats,
			      struct emb_wire_pull_resp *out)
{
	uint64_t bits, i;
	uint32_t n, stride;
	bool with_state;
	int rc;

	if (dim == 0 || dim > EMB_WIRE_DIM_MAX ||
	    state_floats > STRIDE_MAX - dim)
		return EMB_EBADARG;
	rc = emb__wire_check_resp(f, EMB_OP_PULL);
	if (rc)
		return rc;
	if (f->hdr.table_id == 0)
		return EMB_EBADFRAME;
	n = f->hdr.count;
	with_state = f->hdr.flags & EMB_F_WITH_STATE;
	stride = dim + (with_state ? state_floats : 0);
	bits = (f->hdr.flags & EMB_F_NOCREATE) ? emb_wire_bitmap_bytes(n) : 0;
	rc = rows_check(f, bits, stride);
	if (rc)
		return rc;
	/* Padding bits past n are 0, so a reader may count set bits whole. */
	for (i = n; i < bits * 8; i++)
		if (emb_wire_bit_test(f->payload, (uint32_t)i))
			return EMB_EBADFRAME;
	out->n = n;
	out->dim = dim;
	out->with_state = with_state;
	out->stride = stride;
	out->found = bits ? f->payload : NULL;
	out->rows = (const float *)(const void *)(f->payload + bits);
	return 0;
}

/*
 * PUSH and ASSIGN with EMB_F_BIRTHS: the births end the frame (4n bytes,
 * zeros to a multiple of 8) after at least min bytes. Points *births at
 * them and makes *rest f without them, for the decoder to go on with.
 */
static int births_tail(const struct emb_wire_frame *f, uint64_t min,
		       struct emb_wire_frame *rest, const uint32_t **births)
{
	const uint64_t blen = 4ull * f->hdr.count, tail = blen + blen % 8;
	const uint8_t *at;

	if (f->hdr.count > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	if (f->hdr.payload_len < tail + min)
		return EMB_EBADFRAME;
	at = f->payload + f->hdr.payload_len - tail;
	if (!emb__wire_zeros(at + blen, tail - blen))
		return EMB_EBADFRAME;
	*births = (const uint32_t *)(const void *)at;
	*rest = *f;
	rest->hdr.payload_len -= (uint32_t)tail;
	return 0;
}

int emb_wire_push_req_decode(const struct emb_wire_frame *f, uint32_t dim,
			     struct emb_wire_push_req *out)
{
	const bool session = f && (f->hdr.flags & EMB_F_SESSION);
	const uint32_t pre_len = session ? EMB_WIRE_PUSH_SESSION_PREFIX_SIZE
					 : EMB_WIRE_PUSH_PREFIX_SIZE;
	const uint8_t *p;
	uint64_t rows_off;
	struct emb_wire_frame g;
	uint16_t half;
	int rc;

	if (dim == 0 || dim > EMB_WIRE_DIM_MAX)
		return EMB_EBADARG;
	rc = check_req(f, EMB_OP_PUSH);
	if (rc)
		return rc;
	if (f->hdr.count > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	out->births = NULL;
	if (f->hdr.flags & EMB_F_BIRTHS) {
		rc = births_tail(f, pre_len, &g, &out->births);
		if (rc)
			return rc;
		f = &g;
	}
	if (f->hdr.payload_len < pre_len)
		return EMB_EBADFRAME;
	p = f->payload;
	if (emb_le32_load(p + 12) != 0)
		return EMB_EBADFRAME;
	/* Session 0 means none, and sequence numbers start at 1. */
	if (session &&
	    (emb_le64_load(p + 16) == 0 || emb_le64_load(p + 24) == 0))
		return EMB_EBADFRAME;
	rows_off = pre_len + 8ull * f->hdr.count;
	half = f->hdr.flags & (EMB_F_GRAD_FP16 | EMB_F_GRAD_BF16);
	if (half == (EMB_F_GRAD_FP16 | EMB_F_GRAD_BF16))
		return EMB_EBADFRAME;
	if (half) {
		/* 2-byte values, then zeros to a multiple of 8. */
		uint64_t len = 2ull * f->hdr.count * dim, pad = (8 - len % 8) % 8;

		if (f->hdr.payload_len != rows_off + len + pad)
			return EMB_EBADFRAME;
		if (!emb__wire_zeros(p + rows_off + len, pad))
			return EMB_EBADFRAME;
	} else {
		rc = rows_check(f, rows_off, dim);
		if (rc)
			return rc;
	}
	out->half = half == EMB_F_GRAD_FP16   ? EMB_ROWFMT_FP16
		    : half == EMB_F_GRAD_BF16 ? EMB_ROWFMT_BF16
					      : 0;
	out->half_grads = half ? p + rows_off : NULL;
	out->table_id = f->hdr.table_id;
	out->step = emb_le64_load(p);
	out->rank = emb_le32_load(p + 8);
	out->step_end = f->hdr.flags & EMB_F_STEP_END;
	out->admitted = f->hdr.flags & EMB_F_ADMITTED;
	out->session = session ? emb_le64_load(p + 16) : 0;
	out->seq = session ? emb_le64_load(p + 24) : 0;
	out->n = f->hdr.count;
	out->ids = (const uint64_t *)(const void *)(p + pre_len);
	out->grads = half ? NULL : (const float *)(const void *)(p + rows_off);
	return 0;
}

int emb_wire_assign_req_decode(const struct emb_wire_frame *f, uint32_t dim,
			       uint32_t state_floats,
			       struct emb_wire_assign_req *out)
{
	uint32_t stride;
	uint64_t rows_off;
	struct emb_wire_frame h;
	bool with_state;
	int rc;

	if (dim == 0 || dim > EMB_WIRE_DIM_MAX ||
	    state_floats > STRIDE_MAX - dim)
		return EMB_EBADARG;
	rc = check_req(f, EMB_OP_ASSIGN);
	if (rc)
		return rc;
	out->births = NULL;
	if (f->hdr.flags & EMB_F_BIRTHS) {
		rc = births_tail(f, 0, &h, &out->births);
		if (rc)
			return rc;
		f = &h;
	}
	with_state = f->hdr.flags & EMB_F_WITH_STATE;
	stride = dim + (with_state ? state_floats : 0);
	rows_off = 8ull * f->hdr.count;
	if (f->hdr.flags & EMB_F_META) {
		/* The rows end where the meta begins: as rows_check, on
		 * the payload less the meta's 8n bytes. */
		struct emb_wire_frame g = *f;
		uint64_t meta = 8ull * f->hdr.count;

		if (f->hdr.count > f->lim->max_ids)
			return EMB_ETOOMANYIDS;
		if (meta + rows_off > f->hdr.payload_len)
			return EMB_EBADFRAME;
		g.hdr.payload_len = (uint32_t)(f->hdr.payload_len - meta);
		rc = rows_check(&g, rows_off, stride);
	} else {
		rc = rows_check(f, rows_off, stride);
	}
	if (rc)
		return rc;
	out->table_id = f->hdr.table_id;
	out->n = f->hdr.count;
	out->with_state = with_state;
	out->stride = stride;
	out->ids = (const uint64_t *)(const void *)f->payload;
	out->rows = (const float *)(const void *)(f->payload + rows_off);
	out->meta = (f->hdr.flags & EMB_F_META)
			? (const uint32_t *)(const void *)(f->payload + rows_off +
							   4ull * f->hdr.count *
							       stride)
			: NULL;
	return 0;
}

/* ERASE and LOCATE: a table id and its ids, nothing else. */
static int ids_req_decode(const struct emb_wire_frame *f, uint8_t op,
			  struct emb_wire_ids_req *out)
{
	int rc;

	rc = check_req(f, op);
	if (rc)
		return rc;
	rc = ids_check(f, 0);
	if (rc)
		return rc;
	out->table_id = f->hdr.table_id;
	out->n = f->hdr.count;
	out->ids = (const uint64_t *)(const void *)f->payload;
	return 0;
}

int emb_wire_erase_req_decode(const struct emb_wire_frame *f,
			      struct emb_wire_ids_req *out)
{
	return ids_req_decode(f, EMB_OP_ERASE, out);
}

int emb_wire_locate_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_ids_req *out)
{
	return ids_req_decode(f, EMB_OP_LOCATE, out);
}

int emb_wire_list_births_req_decode(const struct emb_wire_frame *f,
				    uint32_t *first, uint32_t *n)
{
	int rc = check_req(f, EMB_OP_LIST_BIRTHS);
	uint32_t fs;

	if (rc)
		return rc;
	if (!first || !n)
		return EMB_EBADARG;
	if (f->hdr.payload_len != 8 || emb_le32_load(f->payload + 4) != 0)
		return EMB_EBADFRAME;
	fs = emb_le32_load(f->payload);
	if (f->hdr.count == 0 || fs >= EMB_NSLOTS ||
	    f->hdr.count > EMB_NSLOTS - fs)
		return EMB_EBADFRAME;
	*first = fs;
	*n = f->hdr.count;
	return 0;
}

int emb_wire_list_births_resp_decode(const struct emb_wire_frame *f,
				     struct emb_wire_list_births *out)
{
	const uint8_t *p;
	uint64_t n, m, at;
	int rc;

	if (!out)
		return EMB_EBADARG;
	rc = emb__wire_check_resp(f, EMB_OP_LIST_BIRTHS);
	if (rc)
		return rc;
	p = f->payload;
	if (f->hdr.payload_len < 8 || emb_le32_load(p + 4) != 0)
		return EMB_EBADFRAME;
	n = emb_le32_load(p);
	m = f->hdr.count;
	if (n == 0 || n > EMB_NSLOTS ||
	    f->hdr.payload_len != 8 + words8(n) + 8 * m + words8(m))
		return EMB_EBADFRAME;
	at = 8;
	if (!emb__wire_zeros(p + at + 4 * n, words8(n) - 4 * n))
		return EMB_EBADFRAME;
	out->marks = (const uint32_t *)(const void *)(p + at);
	at += words8(n);
	out->ids = (const uint64_t *)(const void *)(p + at);
	at += 8 * m;
	if (!emb__wire_zeros(p + at + 4 * m, words8(m) - 4 * m))
		return EMB_EBADFRAME;
	out->births = (const uint32_t *)(const void *)(p + at);
	out->n = (uint32_t)n;
	out->m = (uint32_t)m;
	return 0;
}

int emb_wire_births_req_decode(const struct emb_wire_frame *f,
			       struct emb_wire_ids_req *out)
{
	return ids_req_decode(f, EMB_OP_BIRTHS, out);
}

int emb_wire_births_resp_decode(const struct emb_wire_frame *f,
				uint32_t *n, const uint32_t **births)
{
	uint64_t len;
	int rc;

	if (!n || !births)
		return EMB_EBADARG;
	rc = emb__wire_check_resp(f, EMB_OP_BIRTHS);
	if (rc)
		return rc;
	/* The request's flags ask how to answer; the answer carries none. */
	if (f->hdr.flags)
		return EMB_EBADFRAME;
	if (f->hdr.count > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	len = 4ull * f->hdr.count;
	if (f->hdr.payload_len != (len + 7) / 8 * 8 ||
	    !emb__wire_zeros(f->payload + len, f->hdr.payload_len - len))
		return EMB_EBADFRAME;
	*n = f->hdr.count;
	*births = (const uint32_t *)(const void *)f->payload;
	return 0;
}

int emb_wire_locate_resp_decode(const struct emb_wire_frame *f,
				struct emb_wire_locate_resp *out)
{
	const uint8_t *p;
	uint32_t n;
	int rc;

	rc = emb__wire_check_resp(f, EMB_OP_LOCATE);
	if (rc)
		return rc;
	n = f->hdr.count;
	if (n > f->lim->max_ids)
		return EMB_ETOOMANYIDS;
	if (f->hdr.payload_len != EMB_WIRE_LOCATE_HEAD_SIZE +
				      (uint64_t)n * EMB_WIRE_LOCATE_ENTRY_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	out->seed = emb_le64_load(p);
	out->rec_bytes = emb_le32_load(p + 8);
	out->row_floats = emb_le32_load(p + 12);
	/* A record holds the 16-byte header, the floats and the seal. */
	if (out->row_floats == 0 ||
	    out->row_floats > 4u * EMB_WIRE_DIM_MAX ||
	    out->rec_bytes < 24 + 4ull * out->row_floats ||
	    out->rec_bytes > 32 + 4ull * out->row_floats ||
	    (out->rec_bytes & 7))
		return EMB_EBADFRAME;
	out->n = n;
	out->entries = (void *)(uintptr_t)(p + EMB_WIRE_LOCATE_HEAD_SIZE);
	return 0;
}

int emb_wire_stats_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_stats_resp *out)
{
	const uint8_t *e;
	uint32_t n, nfields, i;
	uint64_t esize;
	int rc;

	rc = emb__wire_check_resp(f, EMB_OP_STATS);
	if (rc)
		return rc;
	n = f->hdr.count;
	if (n > f->lim->max_tables)
		return EMB_ETOOMANYTABLES;
	if (f->hdr.payload_len < EMB_WIRE_STATS_PREFIX_SIZE)
		return EMB_EBADFRAME;
	nfields = emb_le32_load(f->payload);
	if (nfields == 0 || nfields > EMB_WIRE_STATS_FIELDS_MAX ||
	    emb_le32_load(f->payload + 4) != 0)
		return EMB_EBADFRAME;
	esize = 8 + 8ull * nfields;
	if (EMB_WIRE_STATS_PREFIX_SIZE + n * esize != f->hdr.payload_len)
		return EMB_EBADFRAME;
	e = f->payload + EMB_WIRE_STATS_PREFIX_SIZE;
	for (i = 0; i < n; i++, e += esize)
		if (emb_le32_load(e + 4) != 0)
			return EMB_EBADFRAME;
	out->n = n;
	out->nfields = nfields;
	out->entries = f->payload + EMB_WIRE_STATS_PREFIX_SIZE;
	return 0;
}

void emb_wire_stats_entry(const struct emb_wire_stats_resp *resp, uint32_t i,
			  struct emb_wire_stats *out)
{
	size_t esize = 8 + 8 * (size_t)resp->nfields;
	const uint8_t *e = resp->entries + i * esize;
	uint8_t *o = (uint8_t *)out;
	uint32_t j;

	memset(out, 0, sizeof(*out));
	out->table_id = emb_le32_load(e);
	for (j = 0; j < EMB_WIRE_STATS_FIELDS && j < resp->nfields; j++)
		emb_le64_store(o + stats_offs[j], emb_le64_load(e + 8 + 8 * j));
}

int emb_wire_ping_decode(const struct emb_wire_frame *f, bool response,
			 struct emb_wire_blob *out)
{
	int rc;

	rc = response ? emb__wire_check_resp(f, EMB_OP_PING)
		      : check_req(f, EMB_OP_PING);
	if (rc)
		return rc;
	if (f->hdr.table_id != 0 || f->hdr.count != 0)
		return EMB_EBADFRAME;
	out->data = f->hdr.payload_len ? f->payload : NULL;
	out->len = f->hdr.payload_len;
	return 0;
}

static bool set_mode_valid(const struct emb_wire_set_mode_req *r)
{
	switch (r->mode) {
	case EMB_MODE_ASYNC:
		return r->workers == 0 && r->staleness == 0;
	case EMB_MODE_SYNC:
		/* The server keeps a buffer per worker: bound what one
		 * request can make it allocate. */
		return r->workers >= 1 && r->workers <= EMB_WIRE_SYNC_WORKERS_MAX &&
		       r->staleness == 0;
	case EMB_MODE_STALE:
		return r->workers == 0;
	default:
		return false;
	}
}

int emb_wire_set_mode_req_encode(void *buf, size_t cap, uint64_t req_id,
				 const struct emb_wire_set_mode_req *req)
{
	uint8_t *p = buf;
	const size_t len = EMB_WIRE_HDR_SIZE + EMB_WIRE_SET_MODE_SIZE;

	if (!buf || !req || req->table_id == 0 || !set_mode_valid(req))
		return EMB_EBADARG;
	if (cap < len)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_SET_MODE, 0, req_id, req->table_id, 0,
		EMB_WIRE_SET_MODE_SIZE, 0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, req->mode);
	emb_le32_store(p + 4, req->workers);
	emb_le32_store(p + 8, req->staleness);
	emb_le32_store(p + 12, 0);
	return (int)len;
}

int emb_wire_pace_req_encode(void *buf, size_t cap, uint64_t req_id,
			     const struct emb_wire_pace_req *req)
{
	uint8_t *p = buf;
	const size_t len = EMB_WIRE_HDR_SIZE + EMB_WIRE_PACE_SIZE;

	if (!buf || !req || !req->p99_us || !req->base_us || !req->calls)
		return EMB_EBADARG;
	if (cap < len)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_PACE, 0, req_id, 0, 0, EMB_WIRE_PACE_SIZE,
			  0);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, req->p99_us);
	emb_le32_store(p + 4, req->base_us);
	emb_le32_store(p + 8, req->calls);
	emb_le32_store(p + 12, 0);
	return (int)len;
}

int emb_wire_set_lifecycle_req_encode(
    void *buf, size_t cap, uint64_t req_id,
    const struct emb_wire_set_lifecycle_req *req)
{
	uint8_t *p = buf;
	const size_t len = EMB_WIRE_HDR_SIZE + EMB_WIRE_LIFECYCLE_SIZE;

	if (!buf || !req || req->table_id == 0)
		return EMB_EBADARG;
	if (emb_lifecycle_validate(&req->life))
		return EMB_EBADLIFE;
	if (cap < len)
		return -ENOSPC;
	emb__wire_put_hdr(p, EMB_OP_SET_LIFECYCLE, 0, req_id, req->table_id, 0,
			  EMB_WIRE_LIFECYCLE_SIZE, 0);
	life_put(p + EMB_WIRE_HDR_SIZE, &req->life);
	return (int)len;
}

int emb_wire_set_lifecycle_req_decode(const struct emb_wire_frame *f,
				      struct emb_wire_set_lifecycle_req *out)
{
	int rc;

	rc = check_req(f, EMB_OP_SET_LIFECYCLE);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != EMB_WIRE_LIFECYCLE_SIZE)
		return EMB_EBADFRAME;
	out->table_id = f->hdr.table_id;
	return life_get(f->payload, &out->life);
}

int emb_wire_pace_req_decode(const struct emb_wire_frame *f,
			     struct emb_wire_pace_req *out)
{
	const uint8_t *p;
	int rc;

	rc = check_req(f, EMB_OP_PACE);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != EMB_WIRE_PACE_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	out->p99_us = emb_le32_load(p);
	out->base_us = emb_le32_load(p + 4);
	out->calls = emb_le32_load(p + 8);
	if (!out->p99_us || !out->base_us || !out->calls ||
	    emb_le32_load(p + 12) != 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_set_mode_req_decode(const struct emb_wire_frame *f,
				 struct emb_wire_set_mode_req *out)
{
	const uint8_t *p;
	int rc;

	rc = check_req(f, EMB_OP_SET_MODE);
	if (rc)
		return rc;
	if (f->hdr.count != 0 || f->hdr.payload_len != EMB_WIRE_SET_MODE_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	out->table_id = f->hdr.table_id;
	out->mode = emb_le32_load(p);
	out->workers = emb_le32_load(p + 4);
	out->staleness = emb_le32_load(p + 8);
	if (emb_le32_load(p + 12) != 0 || !set_mode_valid(out))
		return EMB_EBADFRAME;
	return 0;
}
