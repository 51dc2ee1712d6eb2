/*
 * tests/proto/test_wire.c - the frame codec: every message round-trips, and
 * each kind of malformed frame is rejected with the code the docs promise.
 * Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "common/err.h"
#include "proto/wire.h"
#include "proto/wire_many.h"
#include "proto/wire_msg.h"
#include "harness.h"

#define BUF_BYTES (1u << 16)

/* Frames are decoded in place, so receive buffers are 8-aligned. */
static _Alignas(8) uint8_t buf[BUF_BYTES];
static _Alignas(8) uint8_t buf2[BUF_BYTES];
static struct emb_wire_limits deflim; /* EMB_WIRE_LIMITS_DEFAULT */

static int decode(const void *b, size_t len, struct emb_wire_frame *f)
{
	return emb_wire_frame_decode(b, len, &deflim, f);
}

static int flatten(const struct emb_wire_iovs *v)
{
	return emb_wire_iovs_flatten(v, buf, sizeof(buf));
}

static void put32(size_t off, uint32_t v)
{
	emb_le32_store(buf + off, v);
}

static struct emb_wire_spec spec_make(const char *name, uint32_t dim)
{
	struct emb_wire_spec s;

	memset(&s, 0, sizeof(s));
	snprintf(s.name, sizeof(s.name), "%s", name);
	s.dim = dim;
	s.optim = EMB_OPTIM_CFG_DEFAULT;
	s.optim.kind = EMB_OPTIM_ADAM;
	s.optim.lr = 0.25f;
	s.init = EMB_INIT_CFG_DEFAULT;
	s.seed = 0x0123456789abcdefull;
	return s;
}

static void test_header_layout(void)
{
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_STATS,
					0x1122334455667788ull, 7);
	CU_ASSERT_EQUAL_FATAL(len, 32);
	CU_ASSERT_EQUAL(memcmp(buf, "EMB1", 4), 0);
	CU_ASSERT_EQUAL(buf[4], EMB_WIRE_VERSION);
	CU_ASSERT_EQUAL(buf[5], EMB_OP_STATS);
	CU_ASSERT_EQUAL(buf[8], 0x88); /* request id, low byte first */
	CU_ASSERT_EQUAL(buf[15], 0x11);
	CU_ASSERT_EQUAL(buf[16], 7); /* table id */
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(f.hdr.req_id, 0x1122334455667788ull);
	CU_ASSERT_EQUAL(emb_wire_empty_req_decode(&f, EMB_OP_STATS), 0);
	CU_ASSERT_EQUAL(f.hdr.table_id, 7);
}

static void test_hello(void)
{
	struct emb_wire_hello_resp resp = {0}, rout;
	struct emb_wire_hello_req req;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_hello_req_encode(buf, sizeof(buf), 1, 3, "secret", 6,
					"trainer-3/rdma");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hello_req_decode(&f, &req), 0);
	CU_ASSERT_EQUAL(req.client_version, 3);
	CU_ASSERT_EQUAL(req.token_len, 6);
	CU_ASSERT_EQUAL(memcmp(req.token, "secret", 6), 0);
	CU_ASSERT_EQUAL(req.name_len, 14);
	CU_ASSERT_EQUAL(memcmp(req.name, "trainer-3/rdma", 14), 0);

	len = emb_wire_hello_req_encode(buf, sizeof(buf), 1, 1, NULL, 0, NULL);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hello_req_decode(&f, &req), 0);
	CU_ASSERT_PTR_NULL(req.token);
	CU_ASSERT_EQUAL(req.name_len, 0);
	CU_ASSERT(!req.admin);

	/* EMB_F_ADMIN round-trips; any other flag is refused both ways. */
	len = emb_wire_hello_req_encode_flags(buf, sizeof(buf), 1, 1,
					      EMB_F_ADMIN, "root", 4, "cli");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hello_req_decode(&f, &req), 0);
	CU_ASSERT(req.admin);
	CU_ASSERT_EQUAL(req.token_len, 4);
	emb_le16_store(buf + 6, EMB_F_ADMIN | EMB_F_STEP_END);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_hello_req_decode(&f, &req), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_wire_hello_req_encode_flags(buf, sizeof(buf), 1, 1,
							EMB_F_STEP_END, NULL, 0,
							NULL),
			EMB_EBADARG);

	resp.server_version = 1;
	resp.limits = deflim;
	resp.limits.max_ids = 4096;
	resp.server_id = 0xfeedull;
	resp.features = EMB_WIRE_FEAT_PUSH_SESSION;
	len = emb_wire_hello_resp_encode(buf, sizeof(buf), 1, &resp);
	CU_ASSERT_EQUAL_FATAL(len, 64);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hello_resp_decode(&f, &rout), 0);
	CU_ASSERT_EQUAL(rout.server_version, 1);
	CU_ASSERT_EQUAL(rout.limits.max_ids, 4096);
	CU_ASSERT_EQUAL(rout.limits.max_frame_bytes, deflim.max_frame_bytes);
	CU_ASSERT_EQUAL(rout.limits.max_tables, deflim.max_tables);
	CU_ASSERT_EQUAL(rout.limits.max_dim, deflim.max_dim);
	CU_ASSERT_EQUAL(rout.server_id, 0xfeedull);
	CU_ASSERT_EQUAL(rout.features, EMB_WIRE_FEAT_PUSH_SESSION);
	/* EMB_F_ADMIN belongs to the request: a response with it is
	 * malformed (it could not be encoded back the same). */
	emb_le16_store(buf + 6, EMB_F_ADMIN);
	if (decode(buf, (size_t)len, &f) == 0)
		CU_ASSERT_EQUAL(emb_wire_hello_resp_decode(&f, &rout),
				EMB_EBADFRAME);
}

static void test_tables(void)
{
	struct emb_wire_spec s = spec_make("user_emb", 16), out;
	struct emb_wire_table_info tabs[2], info = {0};
	struct emb_wire_list_resp lr;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_create_req_encode(buf, sizeof(buf), 2, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 128);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(memcmp(&out, &s, sizeof(s)), 0);

	len =
	    emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_CREATE_TABLE, 2, 5, 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_ack_decode(&f, EMB_OP_CREATE_TABLE), 0);
	CU_ASSERT_EQUAL(f.hdr.table_id, 5);

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_DROP_TABLE, 3,
					5);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_empty_req_decode(&f, EMB_OP_DROP_TABLE), 0);
	CU_ASSERT_EQUAL(emb_wire_empty_req_encode(buf, sizeof(buf),
						  EMB_OP_DROP_TABLE, 3, 0),
			EMB_EBADARG);

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 4,
					0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_empty_req_decode(&f, EMB_OP_LIST_TABLES), 0);

	tabs[0].table_id = 5;
	tabs[0].spec = s;
	tabs[0].rows = 1000;
	tabs[1].table_id = 9;
	tabs[1].spec = spec_make("item.emb-v2", 4096);
	tabs[1].rows = 0;
	len = emb_wire_list_resp_encode(buf, sizeof(buf), 4, tabs, 2);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 2 * 144);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_resp_decode(&f, &lr), 0);
	CU_ASSERT_EQUAL_FATAL(lr.n, 2);
	emb_wire_list_entry(&lr, 1, &info);
	CU_ASSERT_EQUAL(info.table_id, 9);
	CU_ASSERT_STRING_EQUAL(info.spec.name, "item.emb-v2");
	CU_ASSERT_EQUAL(info.spec.dim, 4096);
	emb_wire_list_entry(&lr, 0, &info);
	CU_ASSERT_EQUAL(info.rows, 1000);
	CU_ASSERT_EQUAL(memcmp(&info.spec, &s, sizeof(s)), 0);

	/* An empty list is a valid answer. */
	len = emb_wire_list_resp_encode(buf, sizeof(buf), 4, NULL, 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_list_resp_decode(&f, &lr), 0);
	CU_ASSERT_EQUAL(lr.n, 0);
}

/* CREATE_TABLE with a lifecycle block, and SET_LIFECYCLE. */
static void test_lifecycle(void)
{
	struct emb_wire_spec s = spec_make("t", 8), out;
	struct emb_wire_set_lifecycle_req sl = {.table_id = 3}, slo;
	struct emb_wire_frame f;
	int len;

	CU_ASSERT_EQUAL(emb_admit_parse("bloom:4:1m", &s.life), 0);
	CU_ASSERT_EQUAL(emb_evict_parse("ttl:9,min_l2:0.5,max_rows:7:lfu",
					&s.life),
			0);
	len = emb_wire_create_req_encode(buf, sizeof(buf), 2, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 128 + 32);
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, 32 + 128, 2, &s),
			-ENOSPC);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(memcmp(&out, &s, sizeof(s)), 0);
	s.life.admit_n = 300; /* over bloom's 255 */
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, sizeof(buf), 2, &s),
			EMB_EBADLIFE);

	CU_ASSERT_EQUAL(emb_admit_parse("count:2", &sl.life), 0);
	len = emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 4, &sl);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 32);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_set_lifecycle_req_decode(&f, &slo), 0);
	CU_ASSERT_EQUAL(slo.table_id, 3);
	CU_ASSERT_EQUAL(memcmp(&slo.life, &sl.life, sizeof(sl.life)), 0);
	/* A block validate refuses decodes to EMB_EBADLIFE. */
	buf[32 + 4] = 1; /* count:1 */
	CU_ASSERT_EQUAL(emb_wire_set_lifecycle_req_decode(&f, &slo),
			EMB_EBADLIFE);
	sl.table_id = 0;
	CU_ASSERT_EQUAL(
	    emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 4, &sl),
	    EMB_EBADARG);
	/* Off is a valid SET_LIFECYCLE: it turns the policy off. */
	sl.table_id = 3;
	sl.life = EMB_LIFECYCLE_CFG_DEFAULT;
	CU_ASSERT_EQUAL(
	    emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 4, &sl), 64);
	len = emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_SET_LIFECYCLE, 4, 3,
				  0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_ack_decode(&f, EMB_OP_SET_LIFECYCLE), 0);
}

static void test_pull(void)
{
	const uint64_t ids[5] = {1, 2, 3, 0xffffffffffffffffull, 5};
	const uint8_t found[5] = {1, 0, 1, 1, 0};
	float rows[5 * 3];
	struct emb_wire_pull_resp resp;
	struct emb_wire_pull_req req;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	uint8_t bits[8];
	int len, i;

	for (i = 0; i < 15; i++)
		rows[i] = (float)i * 0.5f;
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_req_encode(&v, 9, 4, EMB_F_NOCREATE, ids, 5), 0);
	CU_ASSERT_EQUAL(v.iovcnt, 2);
	CU_ASSERT_EQUAL(v.iov[1].iov_base, (const void *)ids);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 40);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_req_decode(&f, &req), 0);
	CU_ASSERT_EQUAL(req.table_id, 4);
	CU_ASSERT_EQUAL(req.n, 5);
	CU_ASSERT(req.nocreate);
	CU_ASSERT_EQUAL(memcmp(req.ids, ids, sizeof(ids)), 0);
	CU_ASSERT_PTR_EQUAL(req.ids, buf + 32);

	emb_wire_found_pack(found, 5, bits);
	CU_ASSERT_EQUAL(bits[0], 0x0d);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_encode(
				  &v, 9, 4, EMB_F_NOCREATE, 5, 3, bits, rows),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL((uint64_t)len,
			      emb_wire_pull_resp_bytes(5, 3, EMB_F_NOCREATE));
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 3, 0, &resp), 0);
	CU_ASSERT_EQUAL(resp.n, 5);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp.found);
	for (i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(emb_wire_bit_test(resp.found, i), found[i]);
	CU_ASSERT_PTR_EQUAL(resp.rows,
			    buf + emb_wire_pull_rows_offset(5, EMB_F_NOCREATE));
	CU_ASSERT_EQUAL(memcmp(resp.rows, rows, sizeof(rows)), 0);

	/* Without NOCREATE the rows follow the header directly. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_resp_encode(&v, 9, 4, 0, 5, 3, NULL, rows), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 60);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 3, 0, &resp), 0);
	CU_ASSERT_PTR_NULL(resp.found);
	CU_ASSERT_PTR_EQUAL(resp.rows, buf + 32);
	CU_ASSERT_EQUAL(memcmp(resp.rows, rows, sizeof(rows)), 0);
}

static void test_pull_ptrs(void)
{
	const uint8_t found[4] = {1, 1, 0, 1};
	/* static: a slab that happened to follow bits on the stack would
	 * merge with the bitmap's entry and change the count checked below. */
	static float slab[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
	const float zero[2] = {0, 0};
	/* Rows 0 and 1 are adjacent in the slab, row 3 is elsewhere. */
	const float *ptrs[4] = {&slab[0], &slab[2], NULL, &slab[6]};
	const float want[8] = {1, 2, 3, 4, 0, 0, 7, 8};
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	struct emb_wire_pull_resp resp;
	struct emb_wire_frame f;
	struct iovec iov[8];
	uint8_t bits[8];
	size_t off = 0;
	int cnt, i;

	emb_wire_found_pack(found, 4, bits);
	cnt = emb_wire_pull_resp_encode_ptrs(head, iov, 8, 1, 2, EMB_F_NOCREATE,
					     4, 2, bits, ptrs, zero);
	/* head, bitmap, rows 0-1 merged, zero row, row 3 */
	CU_ASSERT_EQUAL_FATAL(cnt, 5);
	CU_ASSERT_EQUAL(iov[2].iov_len, 16);
	for (i = 0; i < cnt; i++) {
		memcpy(buf + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	CU_ASSERT_EQUAL_FATAL(decode(buf, off, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 2, 0, &resp), 0);
	CU_ASSERT_EQUAL(memcmp(resp.rows, want, sizeof(want)), 0);
	CU_ASSERT_FALSE(emb_wire_bit_test(resp.found, 2));
	CU_ASSERT(emb_wire_bit_test(resp.found, 3));

	CU_ASSERT_EQUAL(emb_wire_pull_resp_encode_ptrs(head, iov, 4, 1, 2,
						       EMB_F_NOCREATE, 4, 2,
						       bits, ptrs, zero),
			-ENOSPC);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_encode_ptrs(head, iov, 8, 1, 2,
						       EMB_F_NOCREATE, 4, 2,
						       bits, ptrs, NULL),
			EMB_EBADARG);
}

static void test_pull_state(void)
{
	/* dim 2 with Adagrad's 2 state floats: stride 4. */
	const uint64_t ids[3] = {5, 6, 7};
	const uint8_t found[3] = {1, 0, 1};
	static float slab[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
	const float zero[4] = {0, 0, 0, 0};
	const float *ptrs[3] = {&slab[0], NULL, &slab[8]};
	const float want[12] = {1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12};
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	struct emb_wire_pull_resp resp;
	struct emb_wire_pull_req req;
	struct emb_wire_frame f;
	struct emb_wire_iovs v;
	struct iovec iov[8];
	uint8_t bits[8];
	size_t off = 0;
	int cnt, len, i;

	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_req_encode(&v, 3, 4,
						       EMB_F_WITH_STATE, ids,
						       3),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_req_decode(&f, &req), 0);
	CU_ASSERT(req.with_state);
	CU_ASSERT_FALSE(req.nocreate);

	/* Whole rows gathered from records, a missing one as zeros. */
	emb_wire_found_pack(found, 3, bits);
	cnt = emb_wire_pull_resp_encode_ptrs(
	    head, iov, 8, 3, 4, EMB_F_NOCREATE | EMB_F_WITH_STATE, 3, 4, bits,
	    ptrs, zero);
	CU_ASSERT_EQUAL_FATAL(cnt, 5);
	for (i = 0; i < cnt; i++) {
		memcpy(buf + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	CU_ASSERT_EQUAL(off, emb_wire_pull_resp_bytes(
				 3, 4, EMB_F_NOCREATE | EMB_F_WITH_STATE));
	CU_ASSERT_EQUAL_FATAL(decode(buf, off, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 2, 2, &resp), 0);
	CU_ASSERT(resp.with_state);
	CU_ASSERT_EQUAL(resp.dim, 2);
	CU_ASSERT_EQUAL(resp.stride, 4);
	CU_ASSERT_EQUAL(memcmp(resp.rows, want, sizeof(want)), 0);
	CU_ASSERT_FALSE(emb_wire_bit_test(resp.found, 1));
	/* A reader expecting other state sizes sees a dim mismatch. */
	CU_ASSERT_EQUAL(emb_wire_pull_resp_decode(&f, 2, 1, &resp),
			EMB_EBADDIM);

	/* The flat encoder gives the same frame. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_encode(
				  &v, 3, 4, EMB_F_WITH_STATE, 3, 4, NULL, want),
			      0);
	len = emb_wire_iovs_flatten(&v, buf2, sizeof(buf2));
	CU_ASSERT_EQUAL_FATAL(len, 32 + 48);
	CU_ASSERT_EQUAL_FATAL(decode(buf2, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 2, 2, &resp), 0);
	CU_ASSERT_EQUAL(resp.stride, 4);
	CU_ASSERT_PTR_EQUAL(resp.rows, buf2 + 32);

	/* Without the flag the state floats are not expected. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_pull_resp_encode(&v, 3, 4, 0, 3, 2, NULL, want), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_resp_decode(&f, 2, 2, &resp), 0);
	CU_ASSERT_FALSE(resp.with_state);
	CU_ASSERT_EQUAL(resp.stride, 2);

	/* Only whole rows may be wider than EMB_WIRE_DIM_MAX. */
	CU_ASSERT_EQUAL(emb_wire_pull_resp_encode(&v, 3, 4, 0, 1,
						  EMB_WIRE_DIM_MAX + 1, NULL,
						  want),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_encode(&v, 3, 4, EMB_F_WITH_STATE,
						  0, 3 * EMB_WIRE_DIM_MAX + 1,
						  NULL, NULL),
			0);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_encode(&v, 3, 4, EMB_F_WITH_STATE,
						  0, 3 * EMB_WIRE_DIM_MAX + 2,
						  NULL, NULL),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_decode(&f, 2, 3 * EMB_WIRE_DIM_MAX,
						  &resp),
			EMB_EBADARG);
}

static void test_push(void)
{
	const uint64_t ids[3] = {10, 20, 30};
	const float grads[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
	struct emb_wire_assign_req ar;
	struct emb_wire_push_req req;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_push_req_encode(&v, 5, 2, 777, 3, ids, 3, 4, grads), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 16 + 24 + 48);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&f, 4, &req), 0);
	CU_ASSERT_EQUAL(req.table_id, 2);
	CU_ASSERT_EQUAL(req.step, 777);
	CU_ASSERT_EQUAL(req.rank, 3);
	CU_ASSERT_EQUAL(req.n, 3);
	CU_ASSERT_EQUAL((uintptr_t)req.ids % 8, 0);
	CU_ASSERT_EQUAL((uintptr_t)req.grads % 4, 0);
	CU_ASSERT_EQUAL(memcmp(req.ids, ids, sizeof(ids)), 0);
	CU_ASSERT_EQUAL(memcmp(req.grads, grads, sizeof(grads)), 0);
	CU_ASSERT_EQUAL(req.session, 0);

	/* With a session: 16 more bytes of prefix, ids still 8-aligned. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_session(
				  &v, 5, 2, 777, 3, 0xabcdull, 42, ids, 3, 4,
				  grads),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 32 + 24 + 48);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(f.hdr.flags, EMB_F_SESSION);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&f, 4, &req), 0);
	CU_ASSERT_EQUAL(req.session, 0xabcdull);
	CU_ASSERT_EQUAL(req.seq, 42);
	CU_ASSERT_EQUAL(req.step, 777);
	CU_ASSERT_EQUAL((uintptr_t)req.ids % 8, 0);
	CU_ASSERT_EQUAL(memcmp(req.ids, ids, sizeof(ids)), 0);
	CU_ASSERT_EQUAL(memcmp(req.grads, grads, sizeof(grads)), 0);
	CU_ASSERT_FALSE(req.admitted);
	/* EMB_F_ADMITTED rides in the header, as the client sets it. */
	emb_le16_store(buf + 6, EMB_F_SESSION | EMB_F_ADMITTED);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&f, 4, &req), 0);
	CU_ASSERT_TRUE(req.admitted);
	CU_ASSERT_EQUAL(req.seq, 42);
	/* ... and PUSH alone takes it. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode(&v, 5, 2, 0, ids, 3,
							 4, grads),
			      0);
	len = flatten(&v);
	emb_le16_store(buf + 6, EMB_F_ADMITTED);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_NOT_EQUAL(emb_wire_assign_req_decode(&f, 4, 0, &ar), 0);
	/* Rows with their lifecycle data: (idle, count) after the rows. */
	{
		const uint32_t meta[6] = {5, 9, 0, 1, 70000, 3};

		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode_meta(
					  &v, 5, 2, 0, ids, 3, 4, grads, meta),
				      0);
		len = flatten(&v);
		CU_ASSERT_EQUAL(len, 32 + 3 * 8 + 3 * 16 + 3 * 8);
		CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
		CU_ASSERT_EQUAL(f.hdr.flags, EMB_F_META);
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_decode(&f, 4, 0,
								 &ar),
				      0);
		CU_ASSERT_EQUAL(ar.n, 3);
		CU_ASSERT_PTR_NOT_NULL_FATAL(ar.meta);
		CU_ASSERT_EQUAL(memcmp(ar.meta, meta, sizeof(meta)), 0);
		CU_ASSERT_EQUAL(memcmp(ar.rows, grads, sizeof(grads)), 0);
		/* The flag without the meta's bytes, or with a row short. */
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode(
					  &v, 5, 2, 0, ids, 3, 4, grads),
				      0);
		len = flatten(&v);
		emb_le16_store(buf + 6, EMB_F_META);
		CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
		CU_ASSERT_NOT_EQUAL(emb_wire_assign_req_decode(&f, 4, 0, &ar),
				    0);
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode(
					  &v, 5, 2, 0, ids, 3, 4, grads),
				      0);
		len = flatten(&v);
		emb_le16_store(buf + 6, 0);
		CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_decode(&f, 4, 0,
								 &ar),
				      0);
		CU_ASSERT_PTR_NULL(ar.meta);
	}
	/* A session needs a sequence number from 1. */
	CU_ASSERT_EQUAL(emb_wire_push_req_encode_session(&v, 5, 2, 0, 0, 7, 0,
							 ids, 3, 4, grads),
			EMB_EBADARG);

	len = emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_PUSH, 5, 2, 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_ack_decode(&f, EMB_OP_PUSH), 0);
	CU_ASSERT_EQUAL(f.hdr.req_id, 5);
}

/*
 * PUSH with half-precision gradients: 2 bytes a value, zeros to a
 * multiple of 8; a frame whose length or padding is off, or that says
 * both fp16 and bf16, is refused.
 */
/* A request header with these fields (the rest as every request). */
static void put_hdr(uint8_t op, uint16_t flags, uint32_t table_id,
		    uint32_t count, uint32_t payload_len)
{
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = op,
				  .flags = flags,
				  .req_id = 1,
				  .table_id = table_id,
				  .count = count,
				  .payload_len = payload_len};

	emb_wire_hdr_encode(buf, &h);
}

static void test_push_half(void)
{
	struct emb_wire_push_req req;
	struct emb_wire_frame f;
	const uint32_t n = 3, dim = 3; /* 18 bytes of grads, 6 of padding */
	const size_t plen = 16 + 8 * n + 24;

	memset(buf, 0, sizeof(buf));
	put_hdr(EMB_OP_PUSH, EMB_F_GRAD_FP16, 2, n, (uint32_t)plen);
	for (uint32_t i = 0; i < n; i++)
		emb_le64_store(buf + 32 + 16 + 8 * i, 100 + i);
	for (uint32_t k = 0; k < n * dim; k++)
		emb_le16_store(buf + 32 + 16 + 8 * n + 2 * k,
			       (uint16_t)(0x3c00u + k)); /* 1.0 and up */
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + plen, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&f, dim, &req), 0);
	CU_ASSERT_EQUAL(req.half, EMB_ROWFMT_FP16);
	CU_ASSERT_PTR_NULL(req.grads);
	CU_ASSERT_EQUAL(emb_le16_load((const uint8_t *)req.half_grads + 2),
			0x3c01u);
	/* Another dim does not fit (4 would: 24 bytes with no padding). */
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 5, &req), EMB_EBADFRAME);
	/* A byte of padding that is not zero. */
	buf[32 + plen - 1] = 1;
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, dim, &req),
			EMB_EBADFRAME);
	buf[32 + plen - 1] = 0;
	/* Both half formats at once. */
	put_hdr(EMB_OP_PUSH, EMB_F_GRAD_FP16 | EMB_F_GRAD_BF16, 2, n,
		(uint32_t)plen);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + plen, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, dim, &req),
			EMB_EBADFRAME);
	/* The encoder makes the same frame, padding included. */
	put_hdr(EMB_OP_PUSH, EMB_F_GRAD_FP16, 2, n, (uint32_t)plen);
	{
		struct emb_wire_iovs v;
		uint64_t ids[3] = {100, 101, 102};
		uint16_t g[9];
		size_t at = 0;

		for (uint32_t k = 0; k < 9; k++)
			g[k] = (uint16_t)(0x3c00u + k);
		CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_half(
					  &v, 1, 2, 0, 0, 0, 0, ids, n, dim,
					  EMB_ROWFMT_FP16, g),
				      0);
		CU_ASSERT_EQUAL(v.nbytes, 32 + plen);
		for (int i = 0; i < v.iovcnt; i++) {
			memcpy(buf2 + at, v.iov[i].iov_base, v.iov[i].iov_len);
			at += v.iov[i].iov_len;
		}
		CU_ASSERT(memcmp(buf2, buf, 32 + plen) == 0);
		CU_ASSERT_EQUAL(emb_wire_push_req_encode_half(
				    &v, 1, 2, 0, 0, 0, 0, ids, n, dim,
				    EMB_ROWFMT_INT8, g),
				EMB_EBADARG);
	}
	/* bf16 alone is fine. */
	put_hdr(EMB_OP_PUSH, EMB_F_GRAD_BF16, 2, n, (uint32_t)plen);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + plen, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, dim, &req), 0);
	CU_ASSERT_EQUAL(req.half, EMB_ROWFMT_BF16);
}


/*
 * PUSH with EMB_F_BIRTHS: the births end the frame, after the gradients
 * (and a half push's padding), padded to 8; f32 and half alike, with and
 * without a session. Bad padding, a frame too short for them, and the
 * flag on another op are refused.
 */
static void test_push_births(void)
{
	struct emb_wire_push_req req;
	struct emb_wire_frame f;
	struct emb_wire_iovs v;
	uint64_t ids[3] = {7, 8, 9};
	float g[9];
	uint16_t hg[9];
	uint32_t births[3] = {5, 0, 0xfffffffeu};
	int len;

	for (int k = 0; k < 9; k++) {
		g[k] = (float)k;
		hg[k] = (uint16_t)(0x3c00u + k);
	}
	for (uint32_t half = 0; half <= EMB_ROWFMT_BF16; half++) {
		if (half && half != EMB_ROWFMT_FP16 && half != EMB_ROWFMT_BF16)
			continue;
		for (int sess = 0; sess < 2; sess++) {
			CU_ASSERT_EQUAL_FATAL(
			    emb_wire_push_req_encode_births(
				&v, 1, 2, 4, 1, sess ? 77 : 0, sess ? 3 : 0,
				ids, 3, 3, half, half ? (const void *)hg : g,
				births),
			    0);
			len = flatten(&v);
			CU_ASSERT_FATAL(len > 0);
			CU_ASSERT_EQUAL(len % 4, 0);
			CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
			CU_ASSERT(f.hdr.flags & EMB_F_BIRTHS);
			CU_ASSERT_EQUAL_FATAL(
			    emb_wire_push_req_decode(&f, 3, &req), 0);
			CU_ASSERT_PTR_NOT_NULL_FATAL(req.births);
			CU_ASSERT_EQUAL(req.births[0], 5);
			CU_ASSERT_EQUAL(req.births[1], 0);
			CU_ASSERT_EQUAL(req.births[2], 0xfffffffeu);
			CU_ASSERT_EQUAL(req.n, 3);
			CU_ASSERT_EQUAL(req.ids[2], 9);
			CU_ASSERT_EQUAL(req.session, sess ? 77u : 0u);
			if (half) {
				CU_ASSERT_EQUAL(req.half, half);
				CU_ASSERT_EQUAL(emb_le16_load(
						    (const uint8_t *)
							req.half_grads +
						    16),
						0x3c08u);
			} else {
				CU_ASSERT_EQUAL(req.grads[8], 8.0f);
			}
			/* The births' padding must be zero. */
			buf[len - 1] = 1;
			CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 3, &req),
					EMB_EBADFRAME);
			buf[len - 1] = 0;
			/* Another dim does not fit the rest. */
			CU_ASSERT_NOT_EQUAL(
			    emb_wire_push_req_decode(&f, 5, &req), 0);
		}
	}
	/* Without births the frame is the one it always was. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_births(
				  &v, 1, 2, 4, 1, 0, 0, ids, 3, 3, 0, g, NULL),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL(len, 32 + 16 + 24 + 36);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_FALSE(f.hdr.flags & EMB_F_BIRTHS);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 3, &req), 0);
	CU_ASSERT_PTR_NULL(req.births);
	/* The flag on a frame too short to hold the births. */
	put_hdr(EMB_OP_PUSH, EMB_F_BIRTHS, 2, 3, 20);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + 20, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 3, &req), EMB_EBADFRAME);
	/* Not a flag of PULL (it is DUMP_BEGIN's EMB_F_CONSISTENT). */
	put_hdr(EMB_OP_PULL, EMB_F_BIRTHS, 2, 0, 0);
	{
		struct emb_wire_pull_req q;

		CU_ASSERT_EQUAL_FATAL(decode(buf, 32, &f), 0);
		CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &q),
				EMB_EBADFRAME);
	}
	CU_ASSERT_EQUAL(emb_wire_push_req_encode_births(&v, 1, 2, 0, 0, 0, 0,
							ids, 3, 3,
							EMB_ROWFMT_INT8, g,
							births),
			EMB_EBADARG);
}

/* LIST_BIRTHS: a slot range asked; an answer of marks, ids and births,
 * encoded from arrays laid out in place with room to spare, decoded in
 * place; bad ranges, reserved words and padding are refused. */
static void test_list_births(void)
{
	struct emb_wire_list_births r, got;
	struct emb_wire_frame f;
	uint32_t first, n;
	int len;

	len = emb_wire_list_births_req_encode(buf, sizeof(buf), 3, 2, 4000, 96);
	CU_ASSERT_EQUAL_FATAL(len, 40);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(f.hdr.opcode), "list_births");
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_births_req_decode(&f, &first, &n),
			      0);
	CU_ASSERT_EQUAL(first, 4000);
	CU_ASSERT_EQUAL(n, 96);
	CU_ASSERT_EQUAL(emb_wire_list_births_req_encode(buf, sizeof(buf), 3, 2,
							4000, 97),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_list_births_req_encode(buf, sizeof(buf), 3, 2,
							0, 0),
			EMB_EBADARG);
	/* A range past the slots, and a reserved word set. */
	emb_le32_store(buf + 32, 4090);
	CU_ASSERT_EQUAL(emb_wire_list_births_req_decode(&f, &first, &n),
			EMB_EBADFRAME);
	emb_le32_store(buf + 32, 0);
	emb_le32_store(buf + 36, 1);
	CU_ASSERT_EQUAL(emb_wire_list_births_req_decode(&f, &first, &n),
			EMB_EBADFRAME);
	/* An answer of 3 slots and 5 rows, the arrays laid out as a server
	 * does: births after room for 8 ids, moved into place. */
	{
		uint8_t *p = buf + 32 + 8;
		uint32_t *marks = (uint32_t *)(void *)p;
		uint64_t *ids = (uint64_t *)(void *)(p + 16);
		uint32_t *births = (uint32_t *)(void *)(p + 16 + 8 * 8);

		memset(buf, 0xee, 256);
		for (uint32_t k = 0; k < 3; k++)
			marks[k] = 100 + k;
		for (uint32_t j = 0; j < 5; j++) {
			ids[j] = 1000 + j;
			births[j] = 7 * j;
		}
		r = (struct emb_wire_list_births){.n = 3, .m = 5, .marks = marks,
						  .ids = ids, .births = births};
		CU_ASSERT_EQUAL(emb_wire_list_births_resp_bytes(3, 5),
				32 + 8 + 16 + 40 + 24);
		len = emb_wire_list_births_resp_encode(buf, sizeof(buf), 3, 2,
						       &r);
		CU_ASSERT_EQUAL_FATAL(len, 120);
	}
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_births_resp_decode(&f, &got), 0);
	CU_ASSERT_EQUAL(got.n, 3);
	CU_ASSERT_EQUAL(got.m, 5);
	CU_ASSERT_EQUAL(got.marks[2], 102);
	CU_ASSERT_EQUAL(got.ids[4], 1004);
	CU_ASSERT_EQUAL(got.births[4], 28);
	CU_ASSERT_EQUAL(got.births[0], 0);
	/* Padding after the marks, then after the births, not zero. */
	buf[32 + 8 + 12] = 1;
	CU_ASSERT_EQUAL(emb_wire_list_births_resp_decode(&f, &got),
			EMB_EBADFRAME);
	buf[32 + 8 + 12] = 0;
	buf[len - 1] = 1;
	CU_ASSERT_EQUAL(emb_wire_list_births_resp_decode(&f, &got),
			EMB_EBADFRAME);
	buf[len - 1] = 0;
	/* A count the payload does not hold. */
	put_hdr(EMB_OP_LIST_BIRTHS | EMB_OP_RESPONSE_BIT, 0, 2, 6, 88);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_list_births_resp_decode(&f, &got),
			EMB_EBADFRAME);
}

/* ASSIGN with EMB_F_BIRTHS: each row's birth after the meta (or the rows),
 * padded to 8; without them the frame is as before. */
static void test_assign_births(void)
{
	struct emb_wire_assign_req a;
	struct emb_wire_frame f;
	struct emb_wire_iovs v;
	uint64_t ids[3] = {4, 5, 6};
	float rows[3 * 2] = {1, 2, 3, 4, 5, 6};
	uint32_t meta[6] = {1, 2, 3, 4, 5, 6}, births[3] = {10, 0, 30};
	int len;

	for (int m = 0; m < 2; m++) {
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode_births(
					  &v, 3, 2, 0, ids, 3, 2, rows,
					  m ? meta : NULL, births),
				      0);
		len = flatten(&v);
		CU_ASSERT_EQUAL(len, 32 + 24 + 24 + (m ? 24 : 0) + 16);
		CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
		CU_ASSERT(f.hdr.flags & EMB_F_BIRTHS);
		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_decode(&f, 2, 0, &a),
				      0);
		CU_ASSERT_PTR_NOT_NULL_FATAL(a.births);
		CU_ASSERT_EQUAL(a.births[0], 10);
		CU_ASSERT_EQUAL(a.births[2], 30);
		CU_ASSERT_EQUAL(a.rows[5], 6.0f);
		CU_ASSERT_EQUAL(a.meta != NULL, m);
		if (m)
			CU_ASSERT_EQUAL(a.meta[5], 6);
		buf[len - 1] = 1;
		CU_ASSERT_EQUAL(emb_wire_assign_req_decode(&f, 2, 0, &a),
				EMB_EBADFRAME);
		buf[len - 1] = 0;
	}
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode_births(
				  &v, 3, 2, 0, ids, 3, 2, rows, NULL, NULL),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL(len, 32 + 24 + 24);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_assign_req_decode(&f, 2, 0, &a), 0);
	CU_ASSERT_PTR_NULL(a.births);
}

/* BIRTHS: a request of ids, an answer of births padded to 8, decoded in
 * place; a short or long answer, bad padding and too many are refused. */
static void test_births_op(void)
{
	struct emb_wire_iovs v;
	struct emb_wire_ids_req q;
	struct emb_wire_frame f;
	uint64_t ids[3] = {1, 2, 3};
	uint32_t births[3] = {9, EMB_WIRE_BIRTH_NONE, 0}, n;
	const uint32_t *got;
	int len;

	CU_ASSERT_EQUAL_FATAL(emb_wire_births_req_encode(&v, 5, 4, ids, 3), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(f.hdr.opcode), "births");
	CU_ASSERT_EQUAL_FATAL(emb_wire_births_req_decode(&f, &q), 0);
	CU_ASSERT_EQUAL(q.n, 3);
	CU_ASSERT_EQUAL(q.ids[1], 2);
	CU_ASSERT_EQUAL(q.table_id, 4);
	/* EMB_F_MAKE, with or without EMB_F_ADMITTED, and no other flag. */
	put_hdr(EMB_OP_BIRTHS, EMB_F_MAKE | EMB_F_ADMITTED, 4, 3, 24);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_req_decode(&f, &q), 0);
	put_hdr(EMB_OP_BIRTHS, EMB_F_WITH_STATE, 4, 3, 24);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_req_decode(&f, &q), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_wire_births_req_encode(&v, 5, 0, ids, 3),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_births_resp_bytes(3), 32 + 16);
	CU_ASSERT_EQUAL(emb_wire_births_resp_bytes(2), 32 + 8);
	CU_ASSERT_EQUAL(emb_wire_births_resp_encode(buf, 40, 5, 4, births, 3),
			-ENOSPC);
	len = emb_wire_births_resp_encode(buf, sizeof(buf), 5, 4, births, 3);
	CU_ASSERT_EQUAL_FATAL(len, 48);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_births_resp_decode(&f, &n, &got), 0);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(got[0], 9);
	CU_ASSERT_EQUAL(got[1], EMB_WIRE_BIRTH_NONE);
	CU_ASSERT_EQUAL(got[2], 0);
	/* An answer carries no flags (EMB_F_MAKE is the request's). */
	emb_le16_store(buf + 6, EMB_F_MAKE);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_resp_decode(&f, &n, &got),
			EMB_EBADFRAME);
	emb_le16_store(buf + 6, 0);
	/* The births already in place are left there. */
	emb_le32_store(buf + 32, 11);
	CU_ASSERT_EQUAL(emb_wire_births_resp_encode(
			    buf, sizeof(buf), 5, 4,
			    (const uint32_t *)(const void *)(buf + 32), 3),
			48);
	CU_ASSERT_EQUAL(emb_le32_load(buf + 32), 11);
	/* Padding that is not zero, and a count the payload does not fit. */
	buf[47] = 1;
	CU_ASSERT_EQUAL_FATAL(decode(buf, 48, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_resp_decode(&f, &n, &got),
			EMB_EBADFRAME);
	buf[47] = 0;
	put_hdr(EMB_OP_BIRTHS | EMB_OP_RESPONSE_BIT, 0, 4, 5, 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 48, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_resp_decode(&f, &n, &got),
			EMB_EBADFRAME);
	put_hdr(EMB_OP_BIRTHS | EMB_OP_RESPONSE_BIT, 0, 4,
		deflim.max_ids + 1, 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 48, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_births_resp_decode(&f, &n, &got),
			EMB_ETOOMANYIDS);
}

/*
 * A compact table's CREATE carries its row-format block, a LIST entry its
 * row-format word; fp32 tables send neither, so frames of earlier
 * versions are unchanged; words no table has are refused.
 */
static void test_row_format_spec(void)
{
	struct emb_wire_spec s = spec_make("small", 8), got;
	struct emb_wire_table_info info = {.table_id = 3, .rows = 9}, back;
	struct emb_wire_list_resp lr;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_EQUAL(len, 32 + 128);
	s.row_format = EMB_ROWFMT_INT8;
	s.rounding = EMB_ROUND_NEAREST;
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 136);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(f.hdr.flags, EMB_F_ROWFMT);
	CU_ASSERT_EQUAL(emb_le32_load(buf + 32 + 128), 0x103u);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &got), 0);
	CU_ASSERT_EQUAL(got.row_format, EMB_ROWFMT_INT8);
	CU_ASSERT_EQUAL(got.rounding, EMB_ROUND_NEAREST);
	/* An unknown format, and a block of 0 (sent as no block). */
	put32(32 + 128, 9);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFORMAT);
	put32(32 + 128, 0);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFRAME);
	/* fp32 with rounding to nearest is the word 0x100: no table. */
	put32(32 + 128, 0x100);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFORMAT);
	s.row_format = 7;
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, sizeof(buf), 1, &s),
			EMB_EBADFORMAT);

	s.row_format = EMB_ROWFMT_BF16;
	s.rounding = EMB_ROUND_STOCHASTIC;
	info.spec = s;
	len = emb_wire_list_resp_encode(buf, sizeof(buf), 2, &info, 1);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_le32_load(buf + 32 + 4), EMB_ROWFMT_BF16);
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_resp_decode(&f, &lr), 0);
	emb_wire_list_entry(&lr, 0, &back);
	CU_ASSERT_EQUAL(back.spec.row_format, EMB_ROWFMT_BF16);
	CU_ASSERT_EQUAL(back.spec.rounding, EMB_ROUND_STOCHASTIC);
	put32(32 + 4, 0x200);
	CU_ASSERT_EQUAL(emb_wire_list_resp_decode(&f, &lr), EMB_EBADFORMAT);
}

/*
 * A table's own tier travels as a block after the row format's place, only
 * when it asks for other than the server's own; modes no server knows,
 * a non-zero reserved word and a default block are refused.
 */
static void test_tier_spec(void)
{
	struct emb_wire_spec s = spec_make("big", 8), got;
	struct emb_wire_frame f;
	int len;

	s.tier = EMB_TIER_OFF;
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 128 + 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(f.hdr.flags, EMB_F_TIER);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &got), 0);
	CU_ASSERT_EQUAL(got.tier, EMB_TIER_OFF);
	CU_ASSERT_EQUAL(got.tier_max, 0);

	/* With a row format and a lifecycle: format, tier, lifecycle. */
	s.tier = EMB_TIER_AUTO;
	s.tier_max = 5ull << 30;
	s.row_format = EMB_ROWFMT_BF16;
	emb_evict_parse("ttl:9", &s.life);
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 128 + 8 + 16 + 32);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(f.hdr.flags, EMB_F_ROWFMT | EMB_F_TIER);
	CU_ASSERT_EQUAL(emb_le64_load(buf + 32 + 136 + 8), 5ull << 30);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &got), 0);
	CU_ASSERT_EQUAL(got.tier, EMB_TIER_AUTO);
	CU_ASSERT_EQUAL(got.tier_max, 5ull << 30);
	CU_ASSERT_EQUAL(got.row_format, EMB_ROWFMT_BF16);
	CU_ASSERT_EQUAL(got.life.ttl_steps, 9);

	/* A mode past "on", a reserved word, a default block. */
	put32(32 + 136, 3);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFRAME);
	put32(32 + 136, EMB_TIER_ON);
	put32(32 + 136 + 4, 1);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFRAME);
	put32(32 + 136 + 4, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_create_req_decode(&f, &got), 0);
	CU_ASSERT_EQUAL(got.tier, EMB_TIER_ON);
	put32(32 + 136, EMB_TIER_AUTO);
	put32(32 + 136 + 8, 0);
	put32(32 + 136 + 12, 0);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFRAME);
	/* The block's flag without its bytes: the payload is too short. */
	s.tier_max = 0;
	s.row_format = EMB_ROWFMT_FP32;
	s.life = EMB_LIFECYCLE_CFG_DEFAULT;
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 128);
	buf[6] = (uint8_t)(EMB_F_TIER & 0xff);
	buf[7] = (uint8_t)(EMB_F_TIER >> 8);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &got), EMB_EBADFRAME);
	s.tier = 3;
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, sizeof(buf), 1, &s),
			EMB_EBADARG);
}

static void test_assign_erase(void)
{
	const uint64_t ids[2] = {7, 8};
	const float rows[2 * 5] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	struct emb_wire_assign_req req;
	struct emb_wire_ids_req er;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	/* dim 2 with 3 state floats per row: stride 5 */
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode(
				  &v, 1, 3, EMB_F_WITH_STATE, ids, 2, 5, rows),
			      0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_decode(&f, 2, 3, &req), 0);
	CU_ASSERT(req.with_state);
	CU_ASSERT_EQUAL(req.stride, 5);
	CU_ASSERT_EQUAL(memcmp(req.rows, rows, sizeof(rows)), 0);
	/* The same frame without state rows would be another dim. */
	CU_ASSERT_EQUAL(emb_wire_assign_req_decode(&f, 2, 0, &req),
			EMB_EBADDIM);

	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_assign_req_encode(&v, 1, 3, 0, ids, 2, 2, rows), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_decode(&f, 2, 3, &req), 0);
	CU_ASSERT_FALSE(req.with_state);
	CU_ASSERT_EQUAL(req.stride, 2);
	CU_ASSERT_EQUAL(memcmp(req.rows, rows, 4 * sizeof(float)), 0);

	CU_ASSERT_EQUAL_FATAL(emb_wire_erase_req_encode(&v, 2, 3, ids, 2), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_erase_req_decode(&f, &er), 0);
	CU_ASSERT_EQUAL(er.n, 2);
	CU_ASSERT_EQUAL(er.ids[1], 8);

	len = emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_ERASE, 2, 3, 1);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_ack_decode(&f, EMB_OP_ERASE), 0);
	CU_ASSERT_EQUAL(f.hdr.count, 1);
	CU_ASSERT_EQUAL(
	    emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_PUSH, 2, 3, 1),
	    EMB_EBADARG);
}

static void test_stats(void)
{
	struct emb_wire_stats st[2], out;
	struct emb_wire_stats_resp sr;
	struct emb_wire_frame f;
	int len;

	memset(st, 0, sizeof(st));
	st[0].table_id = 1;
	st[0].rows = 100;
	st[0].extents = 3;
	st[1].table_id = 2;
	st[1].step = 99;
	st[1].misses = 4;
	len = emb_wire_stats_resp_encode(buf, sizeof(buf), 1, 0, st, 2);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 8 + 2 * (8 + 8 * EMB_WIRE_STATS_FIELDS));
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_stats_resp_decode(&f, &sr), 0);
	CU_ASSERT_EQUAL_FATAL(sr.n, 2);
	emb_wire_stats_entry(&sr, 0, &out);
	CU_ASSERT_EQUAL(memcmp(&out, &st[0], sizeof(out)), 0);
	emb_wire_stats_entry(&sr, 1, &out);
	CU_ASSERT_EQUAL(memcmp(&out, &st[1], sizeof(out)), 0);

	/* An older server that sent only two counters: the rest read 0. */
	len = emb_wire_stats_resp_encode(buf, sizeof(buf), 1, 1, st, 1);
	CU_ASSERT_FATAL(len > 0);
	put32(32, 2);
	put32(24, 8 + 8 + 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + 32, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_stats_resp_decode(&f, &sr), 0);
	emb_wire_stats_entry(&sr, 0, &out);
	CU_ASSERT_EQUAL(out.rows, 100);
	CU_ASSERT_EQUAL(out.extents, 0);
}

static void test_set_mode(void)
{
	struct emb_wire_set_mode_req r = {.table_id = 4,
					  .mode = EMB_MODE_SYNC,
					  .workers = 3}, out;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_set_mode_req_encode(buf, sizeof(buf), 9, &r);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_set_mode_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(memcmp(&out, &r, sizeof(r)), 0);
	/* Fields the mode does not use must be 0; sync needs workers. */
	put32(32 + 8, 5);
	CU_ASSERT_EQUAL(emb_wire_set_mode_req_decode(&f, &out), EMB_EBADFRAME);
	r.workers = 0;
	CU_ASSERT_EQUAL(emb_wire_set_mode_req_encode(buf, sizeof(buf), 9, &r),
			EMB_EBADARG);
	r.workers = EMB_WIRE_SYNC_WORKERS_MAX + 1;
	CU_ASSERT_EQUAL(emb_wire_set_mode_req_encode(buf, sizeof(buf), 9, &r),
			EMB_EBADARG);
	r = (struct emb_wire_set_mode_req){.table_id = 4,
					   .mode = EMB_MODE_STALE,
					   .staleness = 2};
	len = emb_wire_set_mode_req_encode(buf, sizeof(buf), 9, &r);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_set_mode_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(out.staleness, 2);
	put32(32, 7);
	CU_ASSERT_EQUAL(emb_wire_set_mode_req_decode(&f, &out), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_SET_MODE,
					    9, 4, 0),
			32);
}

/* PACE: a worker's p99 in its window against before; nothing 0, the
 * reserved word 0, no table, no count. */
static void test_pace(void)
{
	struct emb_wire_pace_req r = {.p99_us = 9100, .base_us = 3200,
				      .calls = 57}, out;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_pace_req_encode(buf, sizeof(buf), 9, &r);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 16);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(f.hdr.opcode), "pace");
	CU_ASSERT_EQUAL_FATAL(emb_wire_pace_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(memcmp(&out, &r, sizeof(r)), 0);
	put32(32 + 12, 1);
	CU_ASSERT_EQUAL(emb_wire_pace_req_decode(&f, &out), EMB_EBADFRAME);
	put32(32 + 12, 0);
	put32(32 + 4, 0);
	CU_ASSERT_EQUAL(emb_wire_pace_req_decode(&f, &out), EMB_EBADFRAME);
	put32(32 + 4, 3200);
	put32(16, 5); /* a table id */
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_NOT_EQUAL(emb_wire_pace_req_decode(&f, &out), 0);
	r.calls = 0;
	CU_ASSERT_EQUAL(emb_wire_pace_req_encode(buf, sizeof(buf), 9, &r),
			EMB_EBADARG);
	r.calls = 1;
	CU_ASSERT_EQUAL(emb_wire_pace_req_encode(buf, 40, 9, &r), -ENOSPC);
}

static void test_ping_error(void)
{
	char big[EMB_WIRE_ERRMSG_MAX + 8];
	struct emb_wire_pull_resp pr;
	struct emb_wire_error err;
	struct emb_wire_blob blob;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	CU_ASSERT_EQUAL_FATAL(emb_wire_ping_encode(&v, 8, false, "abc", 3), 0);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_ping_decode(&f, false, &blob), 0);
	CU_ASSERT_EQUAL(blob.len, 3);
	CU_ASSERT_EQUAL(memcmp(blob.data, "abc", 3), 0);
	CU_ASSERT_EQUAL(emb_wire_ping_decode(&f, true, &blob), EMB_EBADARG);

	len = emb_wire_error_encode(buf, sizeof(buf), EMB_OP_PULL, 8, 4,
				    EMB_ENOTABLE, "no table 4");
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_error_decode(&f, &err), 0);
	CU_ASSERT_EQUAL(err.status, EMB_ENOTABLE);
	CU_ASSERT_EQUAL(err.msg_len, 10);
	CU_ASSERT_EQUAL(memcmp(err.msg, "no table 4", 10), 0);
	/* The op's own decoder points the caller at the error payload. */
	CU_ASSERT_EQUAL(emb_wire_pull_resp_decode(&f, 4, 0, &pr), EMB_ESERVER);

	/* A long message is cut before the 2-byte character that straddles
	 * the limit, never inside it. */
	memset(big, 'x', sizeof(big));
	big[EMB_WIRE_ERRMSG_MAX - 1] = (char)0xc3;
	big[EMB_WIRE_ERRMSG_MAX] = (char)0xa9;
	big[sizeof(big) - 1] = '\0';
	len = emb_wire_error_encode(buf, sizeof(buf), EMB_OP_HELLO, 1, 0,
				    EMB_EAUTH, big);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_error_decode(&f, &err), 0);
	CU_ASSERT_EQUAL(err.msg_len, EMB_WIRE_ERRMSG_MAX - 1);
	CU_ASSERT_EQUAL(emb_wire_error_encode(buf, sizeof(buf), EMB_OP_HELLO, 1,
					      0, 0, "ok"),
			EMB_EBADARG);
}

static void test_bad_magic(void)
{
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 1,
					0);
	buf[3] = '2';
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADMAGIC);
}

static void test_bad_version(void)
{
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 1,
					0);
	buf[4] = EMB_WIRE_VERSION + 1;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADVERSION);
	buf[4] = 0;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADVERSION);
}

static void test_too_big(void)
{
	struct emb_wire_limits lim = deflim;
	struct emb_frame_hdr h;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;

	CU_ASSERT_EQUAL_FATAL(emb_wire_ping_encode(&v, 1, false, buf2, 100), 0);
	flatten(&v);
	lim.max_frame_bytes = 132;
	CU_ASSERT_EQUAL(emb_wire_frame_decode(buf, 132, &lim, &f), 0);
	lim.max_frame_bytes = 131;
	/* The header alone says so: no need to have read the payload. */
	CU_ASSERT_EQUAL(emb_wire_hdr_decode(buf, 32, &lim, &h), EMB_ETOOBIG);
	CU_ASSERT_EQUAL(emb_wire_frame_decode(buf, 132, &lim, &f), EMB_ETOOBIG);
	put32(24, 0xffffffffu);
	CU_ASSERT_EQUAL(decode(buf, 132, &f), EMB_ETOOBIG);
}

static void test_truncated_header(void)
{
	struct emb_frame_hdr h;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 1,
					0);
	CU_ASSERT_EQUAL(decode(buf, (size_t)len - 1, &f), EMB_ETRUNCFRAME);
	CU_ASSERT_EQUAL(decode(buf, 0, &f), EMB_ETRUNCFRAME);
	CU_ASSERT_EQUAL(emb_wire_hdr_decode(buf, 31, &deflim, &h),
			EMB_ETRUNCFRAME);
}

static void test_truncated_payload(void)
{
	const uint64_t ids[4] = {1, 2, 3, 4};
	struct emb_frame_hdr h;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	emb_wire_pull_req_encode(&v, 1, 1, 0, ids, 4);
	len = flatten(&v);
	CU_ASSERT_EQUAL(emb_wire_hdr_decode(buf, 32, &deflim, &h), 0);
	CU_ASSERT_EQUAL(h.payload_len, 32);
	CU_ASSERT_EQUAL(decode(buf, (size_t)len - 1, &f), EMB_ETRUNCFRAME);
	CU_ASSERT_EQUAL(decode(buf, 32, &f), EMB_ETRUNCFRAME);
	/* Bytes past the frame belong to the next one. */
	CU_ASSERT_EQUAL(decode(buf, (size_t)len + 100, &f), 0);
}

static void test_unknown_op(void)
{
	struct emb_wire_frame f;
	int len;

	len = emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_LIST_TABLES, 1,
					0);
	buf[5] = 0;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADOP);
	buf[5] = 99;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADOP);
	buf[5] = 99 | EMB_OP_RESPONSE_BIT;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), EMB_EBADOP);
	/* Reserved ops pass the header check: the server answers them. */
	buf[5] = EMB_OP_BARRIER;
	CU_ASSERT_EQUAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(EMB_OP_FINISH), "finish");
	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(99), "?");
}

static void test_dim_mismatch(void)
{
	const uint64_t ids[3] = {1, 2, 3};
	float rows[3 * 8] = {0};
	struct emb_wire_pull_resp pr;
	struct emb_wire_push_req req;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	emb_wire_push_req_encode(&v, 1, 1, 0, 0, ids, 3, 8, rows);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 4, &req), EMB_EBADDIM);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 16, &req), EMB_EBADDIM);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 8, &req), 0);

	emb_wire_pull_resp_encode(&v, 1, 1, 0, 3, 8, NULL, rows);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_decode(&f, 6, 0, &pr), EMB_EBADDIM);
	CU_ASSERT_EQUAL(emb_wire_pull_resp_decode(&f, 8, 0, &pr), 0);
}

static void test_too_many_ids(void)
{
	struct emb_wire_limits lim = deflim;
	const uint64_t ids[5] = {1, 2, 3, 4, 5};
	float grads[5] = {0};
	struct emb_wire_pull_req pr;
	struct emb_wire_push_req pu;
	struct emb_wire_ids_req er;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	lim.max_ids = 4;
	emb_wire_pull_req_encode(&v, 1, 1, 0, ids, 5);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			      0);
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_ETOOMANYIDS);

	emb_wire_push_req_encode(&v, 1, 1, 0, 0, ids, 5, 1, grads);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			      0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 1, &pu), EMB_ETOOMANYIDS);

	emb_wire_erase_req_encode(&v, 1, 1, ids, 4);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			      0);
	CU_ASSERT_EQUAL(emb_wire_erase_req_decode(&f, &er), 0);
}

static void test_count_mismatch(void)
{
	const uint64_t ids[4] = {1, 2, 3, 4};
	float grads[8] = {0};
	struct emb_wire_pull_req pr;
	struct emb_wire_push_req pu;
	struct emb_wire_list_resp lr;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	emb_wire_pull_req_encode(&v, 1, 1, 0, ids, 4);
	len = flatten(&v);
	put32(20, 3);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADFRAME);
	put32(20, 5);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADFRAME);

	/* A push whose count claims more ids than the payload holds. */
	emb_wire_push_req_encode(&v, 1, 1, 0, 0, ids, 4, 2, grads);
	len = flatten(&v);
	put32(20, 100);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 2, &pu), EMB_EBADFRAME);
	/* A ragged payload (not whole rows) is malformed, not another dim. */
	emb_wire_push_req_encode(&v, 1, 1, 0, 0, ids, 4, 2, grads);
	len = flatten(&v);
	put32(24, 16 + 32 + 28);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_push_req_decode(&f, 2, &pu), EMB_EBADFRAME);

	len = emb_wire_list_resp_encode(buf, sizeof(buf), 1, NULL, 0);
	put32(20, 1);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_list_resp_decode(&f, &lr), EMB_EBADFRAME);
}

static void test_bad_name(void)
{
	struct emb_wire_spec s = spec_make("t", 4), out;
	struct emb_wire_frame f;
	int len;

	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	CU_ASSERT_FATAL(len > 0);
	memset(buf + 32, 'a', 64); /* 64 bytes, no NUL */
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), EMB_EBADNAME);
	memset(buf + 32, 0, 64); /* empty */
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), EMB_EBADNAME);
	memcpy(buf + 32, "t\0x", 3); /* bytes after the NUL */
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), EMB_EBADNAME);
	memset(buf + 32, 'a', 63); /* 63 bytes + NUL: the longest */
	buf[32 + 63] = 0;
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(strlen(out.name), 63);

	memset(s.name, 'b', sizeof(s.name)); /* unterminated */
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, sizeof(buf), 1, &s),
			EMB_EBADNAME);
	s.name[0] = '\0';
	CU_ASSERT_EQUAL(emb_wire_create_req_encode(buf, sizeof(buf), 1, &s),
			EMB_EBADNAME);

	/* The spec's dim must be within the decoder's limit. */
	s = spec_make("t", 4);
	len = emb_wire_create_req_encode(buf, sizeof(buf), 1, &s);
	put32(32 + 64, 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), EMB_EBADDIM);
	put32(32 + 64, EMB_WIRE_DIM_MAX + 1);
	CU_ASSERT_EQUAL(emb_wire_create_req_decode(&f, &out), EMB_EBADDIM);
}

static void test_bad_token(void)
{
	uint8_t token[EMB_WIRE_TOKEN_MAX + 1];
	struct emb_wire_hello_req req;
	struct emb_wire_frame f;
	int len;

	memset(token, 7, sizeof(token));
	CU_ASSERT_EQUAL(emb_wire_hello_req_encode(buf, sizeof(buf), 1, 1, token,
						  sizeof(token), "w"),
			EMB_EBADARG);
	len = emb_wire_hello_req_encode(buf, sizeof(buf), 1, 1, token,
					EMB_WIRE_TOKEN_MAX, "w");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_hello_req_decode(&f, &req), 0);
	/* Claim a 257-byte token and make the lengths add up. */
	emb_le16_store(buf + 32 + 4, EMB_WIRE_TOKEN_MAX + 1);
	emb_le16_store(buf + 32 + 6, 0);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_hello_req_decode(&f, &req), EMB_EBADFRAME);
	/* A token longer than the payload. */
	len =
	    emb_wire_hello_req_encode(buf, sizeof(buf), 1, 1, token, 10, NULL);
	emb_le16_store(buf + 32 + 4, 11);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_hello_req_decode(&f, &req), EMB_EBADFRAME);
}

static void test_bad_fields(void)
{
	const uint64_t ids[1] = {1};
	struct emb_wire_pull_req pr;
	struct emb_wire_iovs v;
	struct emb_wire_frame f;
	int len;

	emb_wire_pull_req_encode(&v, 1, 1, 0, ids, 1);
	len = flatten(&v);
	CU_ASSERT_EQUAL_FATAL(decode(buf, (size_t)len, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), 0);
	f.hdr.flags = EMB_F_STEP_END;
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADFRAME);
	f.hdr.flags = 0;
	f.hdr.table_id = 0;
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADFRAME);
	f.hdr.table_id = 1;
	f.hdr.status = -1;
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADFRAME);
	f.hdr.status = 0;
	f.hdr.opcode = EMB_OP_ERASE;
	CU_ASSERT_EQUAL(emb_wire_pull_req_decode(&f, &pr), EMB_EBADARG);

	/* Frames must sit 8-aligned so the id and row views are aligned. */
	memcpy(buf2 + 1, buf, (size_t)len);
	CU_ASSERT_EQUAL(decode(buf2 + 1, (size_t)len, &f), EMB_EBADARG);
}


/* A PULL_MANY of two PULLs (3 and 1 ids) in buf; its frame length. */
static size_t many_req(uint8_t op_of_second, uint32_t count)
{
	static const uint64_t a[3] = {1, 2, 3}, b[1] = {7};
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = EMB_OP_PULL,
				  .table_id = 4,
				  .count = 3,
				  .payload_len = 24};
	struct iovec v = {(void *)a, 24};
	int64_t off = EMB_WIRE_HDR_SIZE;

	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	h.opcode = op_of_second;
	h.req_id = 1;
	h.table_id = 5;
	h.count = 1;
	h.flags = EMB_F_NOCREATE;
	h.payload_len = 8;
	v = (struct iovec){(void *)b, 8};
	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	h = (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				   .version = EMB_WIRE_VERSION,
				   .opcode = EMB_OP_PULL_MANY,
				   .count = count,
				   .payload_len = (uint32_t)off -
						  EMB_WIRE_HDR_SIZE};
	emb_wire_hdr_encode(buf, &h);
	return (size_t)off;
}

static int many_decode(size_t len, struct emb_wire_frame *subs)
{
	struct emb_wire_frame f;
	int rc = decode(buf, len, &f);

	return rc ? rc : emb_wire_many_decode(&f, subs, EMB_WIRE_MANY_MAX);
}

static void test_pull_many(void)
{
	struct emb_wire_frame subs[EMB_WIRE_MANY_MAX], f;
	struct emb_wire_pull_req r;
	struct iovec v = {buf, 4};
	struct emb_frame_hdr h = {.payload_len = 5};
	size_t len;

	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(EMB_OP_PULL_MANY), "pull_many");
	len = many_req(EMB_OP_PULL, 2);
	/* 32 + (32 + 24) + (32 + 8): every sub-frame 8-aligned. */
	CU_ASSERT_EQUAL_FATAL(len, 128);
	CU_ASSERT_EQUAL_FATAL(many_decode(len, subs), 2);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_req_decode(&subs[0], &r), 0);
	CU_ASSERT_EQUAL(r.table_id, 4);
	CU_ASSERT_EQUAL(r.n, 3);
	CU_ASSERT_EQUAL(r.ids[2], 3);
	CU_ASSERT_EQUAL_FATAL(emb_wire_pull_req_decode(&subs[1], &r), 0);
	CU_ASSERT_EQUAL(r.table_id, 5);
	CU_ASSERT(r.nocreate);
	CU_ASSERT_EQUAL(r.ids[0], 7);

	/* Counts that do not match the sub-frames, or none. */
	CU_ASSERT_EQUAL(many_decode(many_req(EMB_OP_PULL, 1), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(many_decode(many_req(EMB_OP_PULL, 3), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(many_decode(many_req(EMB_OP_PULL, 0), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(many_decode(many_req(EMB_OP_PULL,
					     EMB_WIRE_MANY_MAX + 1),
				    subs),
			EMB_ETOOMANYIDS);
	/* A sub-frame of another opcode. */
	CU_ASSERT_EQUAL(many_decode(many_req(EMB_OP_PUSH, 2), subs),
			EMB_EBADFRAME);
	/* Flags or a table id on the outer frame. */
	len = many_req(EMB_OP_PULL, 2);
	put32(16, 9);
	CU_ASSERT_EQUAL(many_decode(len, subs), EMB_EBADFRAME);
	len = many_req(EMB_OP_PULL, 2);
	buf[6] = 1;
	CU_ASSERT_EQUAL(many_decode(len, subs), EMB_EBADFRAME);
	/* A sub-frame whose payload runs past the frame. */
	len = many_req(EMB_OP_PULL, 2);
	put32(32 + 56 + 24, 16);
	CU_ASSERT_EQUAL(many_decode(len, subs), EMB_EBADFRAME);
	/* Trailing bytes after the last sub-frame. */
	len = many_req(EMB_OP_PULL, 2);
	memset(buf + len, 0, 8);
	put32(24, (uint32_t)len + 8 - 32);
	CU_ASSERT_EQUAL(many_decode(len + 8, subs), EMB_EBADFRAME);
	/* A sub-frame with a bad magic. */
	len = many_req(EMB_OP_PULL, 2);
	buf[32 + 56] ^= 1;
	CU_ASSERT_EQUAL(many_decode(len, subs), EMB_EBADMAGIC);

	/* Non-zero padding after an odd payload; a misnumbered answer. */
	h = (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				   .version = EMB_WIRE_VERSION,
				   .opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT,
				   .table_id = 4,
				   .count = 1,
				   .payload_len = 4};
	memset(buf2, 0, sizeof(buf2));
	v = (struct iovec){buf2, 4};
	CU_ASSERT_EQUAL(emb_wire_many_sub_put(buf + 32, &h, &v, 1), 40);
	h = (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				   .version = EMB_WIRE_VERSION,
				   .opcode = EMB_OP_PULL_MANY |
					     EMB_OP_RESPONSE_BIT,
				   .count = 1,
				   .payload_len = 40};
	emb_wire_hdr_encode(buf, &h);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 72, &f), 0);
	CU_ASSERT_EQUAL(emb_wire_many_decode(&f, subs, 1), 1);
	CU_ASSERT_EQUAL(subs[0].hdr.payload_len, 4);
	buf[32 + 32 + 5] = 1;
	CU_ASSERT_EQUAL(emb_wire_many_decode(&f, subs, 1), EMB_EBADFRAME);
	buf[32 + 32 + 5] = 0;
	put32(32 + 8, 1); /* req_id 1 for the first answer */
	CU_ASSERT_EQUAL(emb_wire_many_decode(&f, subs, 1), EMB_EBADFRAME);
	/* A whole-frame error reply is not split. */
	f.hdr.status = EMB_EBADFRAME;
	CU_ASSERT_EQUAL(emb_wire_many_decode(&f, subs, 1), EMB_EBADARG);
	/* Lengths that do not add up are refused by the encoder. */
	CU_ASSERT_EQUAL(emb_wire_many_sub_put(buf2, &h, &v, 1), EMB_EBADARG);
}

/*
 * A PUSH_MANY of two PUSHes (2 ids of dim 3 to table 4, then 1 id with a
 * session to table 5) in buf, the second sub-frame of opcode second; its
 * frame length.
 */
static size_t push_many_req(uint8_t second, uint32_t count)
{
	static const uint64_t a[2] = {1, 2}, b[1] = {7};
	static const float ga[6] = {1, 2, 3, 4, 5, 6}, gb[3] = {-1, 0, 1};
	const struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_iovs v;
	struct emb_frame_hdr h;
	int64_t off = EMB_WIRE_HDR_SIZE;
	int len;

	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_push_req_encode(&v, 0, 4, 9, 1, a, 2, 3, ga), 0);
	len = emb_wire_iovs_flatten(&v, buf2, sizeof(buf2));
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hdr_decode(buf2, (size_t)len, &lim, &h),
			      0);
	off += emb_wire_many_sub_put(
	    buf + off, &h,
	    &(struct iovec){buf2 + EMB_WIRE_HDR_SIZE, h.payload_len}, 1);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_session(
				  &v, 1, 5, 9, 1, 0xabc, 3, b, 1, 3, gb),
			      0);
	len = emb_wire_iovs_flatten(&v, buf2, sizeof(buf2));
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hdr_decode(buf2, (size_t)len, &lim, &h),
			      0);
	h.opcode = second;
	off += emb_wire_many_sub_put(
	    buf + off, &h,
	    &(struct iovec){buf2 + EMB_WIRE_HDR_SIZE, h.payload_len}, 1);
	h = (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				   .version = EMB_WIRE_VERSION,
				   .opcode = EMB_OP_PUSH_MANY,
				   .count = count,
				   .payload_len =
				       (uint32_t)off - EMB_WIRE_HDR_SIZE};
	emb_wire_hdr_encode(buf, &h);
	return (size_t)off;
}

static void test_push_many(void)
{
	struct emb_wire_frame subs[EMB_WIRE_MANY_MAX], f;
	struct emb_wire_push_req r;
	struct emb_wire_error e;
	struct emb_frame_hdr h;
	size_t len;
	int elen;

	CU_ASSERT_STRING_EQUAL(emb_wire_op_name(EMB_OP_PUSH_MANY), "push_many");
	len = push_many_req(EMB_OP_PUSH, 2);
	CU_ASSERT_EQUAL_FATAL(many_decode(len, subs), 2);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&subs[0], 3, &r), 0);
	CU_ASSERT_EQUAL(r.n, 2);
	CU_ASSERT_EQUAL(r.step, 9);
	CU_ASSERT_EQUAL(r.ids[1], 2);
	CU_ASSERT_EQUAL(r.grads[5], 6.0f);
	CU_ASSERT_EQUAL(r.session, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_decode(&subs[1], 3, &r), 0);
	CU_ASSERT_EQUAL(subs[1].hdr.table_id, 5);
	CU_ASSERT_EQUAL(r.session, 0xabc);
	CU_ASSERT_EQUAL(r.seq, 3);
	CU_ASSERT_EQUAL(r.grads[0], -1.0f);

	/* A PULL inside a PUSH_MANY, a count that lies, none, too many. */
	CU_ASSERT_EQUAL(many_decode(push_many_req(EMB_OP_PULL, 2), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(many_decode(push_many_req(EMB_OP_PUSH, 3), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(many_decode(push_many_req(EMB_OP_PUSH, 0), subs),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(
	    many_decode(push_many_req(EMB_OP_PUSH, EMB_WIRE_MANY_MAX + 1),
			subs),
	    EMB_ETOOMANYIDS);
	/* A table id on the outer frame. */
	len = push_many_req(EMB_OP_PUSH, 2);
	put32(16, 9);
	CU_ASSERT_EQUAL(many_decode(len, subs), EMB_EBADFRAME);

	/* A reply: an acknowledgement and an error, numbered. */
	elen = emb_wire_ack_encode(buf + 32, 64, EMB_OP_PUSH, 0, 4, 0);
	CU_ASSERT_EQUAL_FATAL(elen, 32);
	elen = emb_wire_error_encode(buf + 64, 256, EMB_OP_PUSH, 1, 5,
				     EMB_ENONFINITE, "nan");
	CU_ASSERT_FATAL(elen > 0);
	memset(buf + 64 + elen, 0,
	       emb_wire_many_sub_size((uint32_t)elen - 32) - (size_t)elen);
	h = (struct emb_frame_hdr){
	    .magic = EMB_WIRE_MAGIC,
	    .version = EMB_WIRE_VERSION,
	    .opcode = EMB_OP_PUSH_MANY | EMB_OP_RESPONSE_BIT,
	    .count = 2,
	    .payload_len =
		32 + (uint32_t)emb_wire_many_sub_size((uint32_t)elen - 32)};
	emb_wire_hdr_encode(buf, &h);
	CU_ASSERT_EQUAL_FATAL(decode(buf, 32 + h.payload_len, &f), 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_many_decode(&f, subs, 2), 2);
	CU_ASSERT_EQUAL(subs[0].hdr.status, 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_error_decode(&subs[1], &e), 0);
	CU_ASSERT_EQUAL(e.status, EMB_ENONFINITE);
	/* A PULL answer in a PUSH_MANY reply. */
	buf[32 + 5] = EMB_OP_PULL | EMB_OP_RESPONSE_BIT;
	CU_ASSERT_EQUAL(emb_wire_many_decode(&f, subs, 2), EMB_EBADFRAME);
}

static const struct emb_test_case cases[] = {
    {"header is little-endian and 32 bytes", test_header_layout},
    {"round trips hello", test_hello},
    {"splits PULL_MANY into its PULLs; refuses malformed ones",
     test_pull_many},
    {"splits PUSH_MANY into its PUSHes; refuses malformed ones",
     test_push_many},
    {"round trips create, drop and list tables", test_tables},
    {"round trips lifecycle blocks", test_lifecycle},
    {"round trips pull with and without nocreate", test_pull},
    {"gathers pull rows from table memory", test_pull_ptrs},
    {"round trips pull of whole rows with optimizer state", test_pull_state},
    {"round trips push with aligned views", test_push},
    {"round trips assign and erase", test_assign_erase},
    {"round trips stats across counter versions", test_stats},
    {"round trips ping and errors", test_ping_error},
    {"round trips set_mode and rejects unused fields", test_set_mode},
    {"round trips pace and rejects zero and reserved fields", test_pace},
    {"PUSH with fp16 and bf16 gradients", test_push_half},
    {"PUSH with each row's birth", test_push_births},
    {"BIRTHS asks and answers", test_births_op},
    {"ASSIGN with each row's birth", test_assign_births},
    {"LIST_BIRTHS asks for slots and answers their rows", test_list_births},
    {"row formats in CREATE_TABLE and LIST_TABLES", test_row_format_spec},
    {"a table's own tier in CREATE_TABLE", test_tier_spec},
    {"rejects bad magic", test_bad_magic},
    {"rejects bad version", test_bad_version},
    {"rejects length beyond limit", test_too_big},
    {"rejects truncated header", test_truncated_header},
    {"rejects truncated payload", test_truncated_payload},
    {"rejects unknown opcode", test_unknown_op},
    {"rejects dim mismatch", test_dim_mismatch},
    {"rejects ids beyond limit", test_too_many_ids},
    {"rejects count inconsistent with payload", test_count_mismatch},
    {"rejects unterminated or oversized name", test_bad_name},
    {"rejects oversized token", test_bad_token},
    {"rejects flags, table id and status the op forbids", test_bad_fields},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	deflim = EMB_WIRE_LIMITS_DEFAULT;
	return emb_test_main(argc, argv, "wire", cases);
}
