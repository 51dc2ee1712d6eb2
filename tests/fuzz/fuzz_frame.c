/*
 * tests/fuzz/fuzz_frame.c - libFuzzer target for the frame decoder.
 *
 * Each input is one frame as it would arrive off the wire. It goes through
 * the header check and then through every payload decoder under several
 * limit settings and table dims. Whatever a decoder accepts is read in full
 * (so ASan sees any view that reaches past the frame) and, where the codec
 * is canonical, encoded again and compared byte for byte with the input: a
 * decoder must never accept what the encoders could not have written.
 * Single-threaded, as libFuzzer runs it.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/map.h"
#include "common/endian.h"
#include "common/err.h"
#include "proto/wire.h"
#include "proto/wire_cluster.h"
#include "proto/wire_dump.h"
#include "proto/wire_many.h"
#include "proto/wire_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Re-encoded frames land here; big enough for any input we accept. */
static _Alignas(8) uint8_t out[1u << 20];
/* Scratch for PULL responses rebuilt from row pointers. */
static struct iovec iov[1u << 12];
/* Scratch for found bitmaps unpacked to bytes and packed again. */
static uint8_t found[1u << 12];
static uint8_t bits[1u << 9];
static const float *rowp[1u << 12];
/* Zeros for a whole row with state: Adam's 3 * dim + 1 floats at most. */
static const float zero_row[3 * EMB_WIRE_DIM_MAX + 1];

static const struct emb_wire_limits limits[] = {
    {.max_frame_bytes = 64u << 20,
     .max_ids = 1u << 20,
     .max_tables = 1024,
     .max_dim = EMB_WIRE_DIM_MAX},
    {.max_frame_bytes = 64, .max_ids = 1, .max_tables = 1, .max_dim = 1},
    {.max_frame_bytes = 4096, .max_ids = 16, .max_tables = 4, .max_dim = 8},
};

static const uint32_t dims[] = {1, 3, 8, EMB_WIRE_DIM_MAX};

/* Folds bytes into a value the compiler cannot drop. */
static volatile uint64_t sink;

static void touch(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint64_t acc = 0;
	size_t i;

	for (i = 0; i < len; i++)
		acc = acc * 31 + b[i];
	sink += acc;
}

static void must(bool ok, const char *what)
{
	if (ok)
		return;
	fprintf(stderr, "fuzz_frame: %s\n", what);
	abort();
}

/* The decoded frame must encode back to exactly the input's bytes. */
static void same(const struct emb_wire_frame *f, const void *enc, int len,
		 const char *what)
{
	must(len >= 0, what);
	must((uint32_t)len == EMB_WIRE_HDR_SIZE + f->hdr.payload_len, what);
	must(memcmp(enc, f->payload - EMB_WIRE_HDR_SIZE, (size_t)len) == 0,
	     what);
}

/*
 * same(), or, for a frame as a peer older than its tail sends it
 * (payload_len v1_len), the same payload up to there: the tail, read as
 * zeros, is encoded as zeros.
 */
static void same_or_older(const struct emb_wire_frame *f, const void *enc,
			  int len, uint32_t v1_len, const char *what)
{
	const uint8_t *e = enc;

	if (f->hdr.payload_len != v1_len) {
		same(f, enc, len, what);
		return;
	}
	must(len >= (int)(EMB_WIRE_HDR_SIZE + v1_len), what);
	must(memcmp(e + EMB_WIRE_HDR_SIZE, f->payload, v1_len) == 0, what);
	for (int i = (int)(EMB_WIRE_HDR_SIZE + v1_len); i < len; i++)
		must(e[i] == 0, what);
}

static void same_iovs(const struct emb_wire_frame *f,
		      const struct emb_wire_iovs *v, int rc, const char *what)
{
	const uint16_t ride = EMB_F_EPOCH | EMB_F_FILL | EMB_F_WARM;
	int len;

	must(rc == 0, what);
	len = emb_wire_iovs_flatten(v, out, sizeof(out));
	/* A write's map epoch and fill flags ride in its header, put there
	 * by the sender (emb_wire_hdr_set_epoch()), not by the encoders. */
	if (len >= (int)EMB_WIRE_HDR_SIZE && (f->hdr.flags & ride)) {
		uint16_t fl = (uint16_t)(emb_le16_load(out + 6) |
					 (f->hdr.flags & ride));

		emb_le16_store(out + 6, fl);
		emb_le32_store(out + 28, (uint32_t)f->hdr.status);
	}
	same(f, out, len, what);
}

static void check_hello(const struct emb_wire_frame *f)
{
	struct emb_wire_hello_resp hr;
	struct emb_wire_hello_req hq;
	char name[EMB_WIRE_CLIENT_NAME_MAX + 1];

	if (emb_wire_hello_req_decode(f, &hq) == 0) {
		touch(hq.token, hq.token_len);
		touch(hq.name, hq.name_len);
		/* Only a name without NUL bytes can be re-encoded. */
		memcpy(name, hq.name, hq.name_len);
		name[hq.name_len] = '\0';
		if (strlen(name) == hq.name_len)
			same(f, out,
			     emb_wire_hello_req_encode_flags(
				 out, sizeof(out), f->hdr.req_id,
				 hq.client_version,
				 hq.admin ? EMB_F_ADMIN : 0, hq.token,
				 hq.token_len, name),
			     "hello request");
	}
	if (emb_wire_hello_resp_decode(f, &hr) == 0)
		same(f, out,
		     emb_wire_hello_resp_encode(out, sizeof(out), f->hdr.req_id,
						&hr),
		     "hello response");
}

static void check_tables(const struct emb_wire_frame *f)
{
	static struct emb_wire_table_info info[1024];
	struct emb_wire_list_resp lr;
	struct emb_wire_spec spec;
	uint32_t i;

	if (emb_wire_create_req_decode(f, &spec) == 0) {
		must(strlen(spec.name) < EMB_WIRE_NAME_SIZE, "create name");
		same(f, out,
		     emb_wire_create_req_encode(out, sizeof(out), f->hdr.req_id,
						&spec),
		     "create request");
	}
	if (emb_wire_list_resp_decode(f, &lr) == 0) {
		must(lr.n <= f->lim->max_tables && lr.n <= 1024, "list count");
		for (i = 0; i < lr.n; i++)
			emb_wire_list_entry(&lr, i, &info[i]);
		same(f, out,
		     emb_wire_list_resp_encode(out, sizeof(out), f->hdr.req_id,
					       info, lr.n),
		     "list response");
	}
}

static void check_simple(const struct emb_wire_frame *f)
{
	static const uint8_t empty_ops[] = {EMB_OP_DROP_TABLE,
					    EMB_OP_LIST_TABLES, EMB_OP_STATS};
	static const uint8_t ack_ops[] = {
	    EMB_OP_CREATE_TABLE, EMB_OP_DROP_TABLE, EMB_OP_PUSH,
	    EMB_OP_ASSIGN,	 EMB_OP_ERASE,	    EMB_OP_SET_LIFECYCLE};
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	struct emb_wire_error err;
	struct emb_wire_blob blob;
	struct emb_wire_iovs v;
	size_t i;
	int rc;

	for (i = 0; i < sizeof(empty_ops); i++)
		if (emb_wire_empty_req_decode(f, empty_ops[i]) == 0)
			same(f, out,
			     emb_wire_empty_req_encode(
				 out, sizeof(out), empty_ops[i], f->hdr.req_id,
				 f->hdr.table_id),
			     "empty request");
	for (i = 0; i < sizeof(ack_ops); i++)
		if (emb_wire_ack_decode(f, ack_ops[i]) == 0)
			same(f, out,
			     emb_wire_ack_encode(out, sizeof(out), ack_ops[i],
						 f->hdr.req_id, f->hdr.table_id,
						 f->hdr.count),
			     "ack");
	if (emb_wire_error_decode(f, &err) == 0) {
		must(err.status < 0, "error status");
		touch(err.msg, err.msg_len);
		/* Only a message without NUL bytes can be re-encoded. */
		memcpy(msg, err.msg, err.msg_len);
		msg[err.msg_len] = '\0';
		if (strlen(msg) == err.msg_len)
			same(f, out,
			     emb_wire_error_encode(
				 out, sizeof(out),
				 f->hdr.opcode & ~EMB_OP_RESPONSE_BIT,
				 f->hdr.req_id, f->hdr.table_id, err.status,
				 msg),
			     "error response");
	}
	for (i = 0; i < 2; i++) {
		if (emb_wire_ping_decode(f, i, &blob) != 0)
			continue;
		touch(blob.data, blob.len);
		rc = emb_wire_ping_encode(&v, f->hdr.req_id, i, blob.data,
					  blob.len);
		if (blob.len <= sizeof(out) - EMB_WIRE_HDR_SIZE)
			same_iovs(f, &v, rc, "ping");
	}
}

static void check_stats(const struct emb_wire_frame *f)
{
	static struct emb_wire_stats st[1024];
	struct emb_wire_stats_resp sr;
	uint32_t i;

	if (emb_wire_stats_resp_decode(f, &sr) != 0)
		return;
	must(sr.n <= f->lim->max_tables && sr.n <= 1024, "stats count");
	for (i = 0; i < sr.n; i++)
		emb_wire_stats_entry(&sr, i, &st[i]);
	touch(sr.entries, (size_t)sr.n * (8 + 8 * (size_t)sr.nfields));
	/* Another counter set does not re-encode to the same bytes. */
	if (sr.nfields == EMB_WIRE_STATS_FIELDS)
		same(f, out,
		     emb_wire_stats_resp_encode(out, sizeof(out), f->hdr.req_id,
						f->hdr.table_id, st, sr.n),
		     "stats response");
}

/* LOCATE request (ids) and response (layout + n entries). */
static void check_locate(const struct emb_wire_frame *f)
{
	struct emb_wire_locate_resp lr;
	struct emb_wire_ids_req q;
	struct emb_wire_iovs v;

	if (emb_wire_locate_req_decode(f, &q) == 0) {
		touch(q.ids, 8 * (size_t)q.n);
		same_iovs(f, &v,
			  emb_wire_locate_req_encode(&v, f->hdr.req_id,
						     q.table_id, q.ids, q.n),
			  "locate request");
	}
	if (emb_wire_locate_resp_decode(f, &lr) == 0) {
		uint64_t addr;
		uint32_t rkey;

		must(lr.n == f->hdr.count, "locate count");
		for (uint32_t i = 0; i < lr.n; i++)
			emb_wire_locate_entry_get(&lr, i, &addr, &rkey);
		/* The reserved words are not checked: re-encoding zeroes
		 * them, so compare only when the frame has them zero. */
		if (f->hdr.table_id &&
		    emb_wire_locate_resp_bytes(lr.n) <= sizeof(out)) {
			bool zero = true;

			for (uint32_t i = 0; i < lr.n && zero; i++)
				zero = emb_le32_load((const uint8_t *)
							 lr.entries +
						     16 * (size_t)i + 12) == 0;
			if (zero)
				same(f, out,
				     emb_wire_locate_resp_encode(
					 out, sizeof(out), f->hdr.req_id,
					 f->hdr.table_id, &lr),
				     "locate response");
		}
	}
}

/* BIRTHS request (ids) and response (n births, padded to 8). */
static void check_births(const struct emb_wire_frame *f)
{
	struct emb_wire_ids_req q;
	struct emb_wire_iovs v;
	const uint32_t *b;
	uint32_t n;

	if (emb_wire_births_req_decode(f, &q) == 0) {
		int rc = emb_wire_births_req_encode(&v, f->hdr.req_id,
						    q.table_id, q.ids, q.n);

		touch(q.ids, 8 * (size_t)q.n);
		/* EMB_F_MAKE and EMB_F_ADMITTED are the asker's, set in the
		 * header as the client's parts set them. */
		if (rc == 0)
			emb_le16_store(v.head + 6, f->hdr.flags);
		same_iovs(f, &v, rc, "births request");
	}
	{
		struct emb_wire_list_births lb;
		uint32_t first, ns;

		if (emb_wire_list_births_req_decode(f, &first, &ns) == 0)
			same(f, out,
			     emb_wire_list_births_req_encode(
				 out, sizeof(out), f->hdr.req_id,
				 f->hdr.table_id, first, ns),
			     "list_births request");
		if (emb_wire_list_births_resp_decode(f, &lb) == 0) {
			must(lb.m == f->hdr.count && lb.n >= 1 &&
				 lb.n <= EMB_NSLOTS,
			     "list_births counts");
			must(((uintptr_t)lb.ids & 7) == 0 &&
				 ((uintptr_t)lb.births & 3) == 0 &&
				 ((uintptr_t)lb.marks & 3) == 0,
			     "list_births aligned");
			touch(lb.marks, 4 * (size_t)lb.n);
			touch(lb.ids, 8 * (size_t)lb.m);
			touch(lb.births, 4 * (size_t)lb.m);
			if (f->hdr.table_id &&
			    emb_wire_list_births_resp_bytes(lb.n, lb.m) <=
				sizeof(out))
				same(f, out,
				     emb_wire_list_births_resp_encode(
					 out, sizeof(out), f->hdr.req_id,
					 f->hdr.table_id, &lb),
				     "list_births response");
		}
	}
	if (emb_wire_births_resp_decode(f, &n, &b) == 0) {
		must(n == f->hdr.count, "births count");
		must(((uintptr_t)b & 3) == 0, "births aligned");
		touch(b, 4 * (size_t)n);
		if (f->hdr.table_id &&
		    emb_wire_births_resp_bytes(n) <= sizeof(out))
			same(f, out,
			     emb_wire_births_resp_encode(out, sizeof(out),
							 f->hdr.req_id,
							 f->hdr.table_id, b,
							 n),
			     "births response");
	}
}

static void check_ids(const struct emb_wire_frame *f)
{
	struct emb_wire_pull_req pr;
	struct emb_wire_set_mode_req sm;
	struct emb_wire_set_lifecycle_req sl;
	struct emb_wire_pace_req pc;
	struct emb_wire_ids_req er;
	struct emb_wire_iovs v;

	if (emb_wire_pull_req_decode(f, &pr) == 0) {
		must(pr.n <= f->lim->max_ids, "pull count");
		must(((uintptr_t)pr.ids & 7) == 0, "pull ids aligned");
		touch(pr.ids, 8 * (size_t)pr.n);
		same_iovs(f, &v,
			  emb_wire_pull_req_encode(&v, f->hdr.req_id,
						   pr.table_id, f->hdr.flags,
						   pr.ids, pr.n),
			  "pull request");
	}
	if (emb_wire_set_mode_req_decode(f, &sm) == 0)
		same(f, out,
		     emb_wire_set_mode_req_encode(out, sizeof(out),
						  f->hdr.req_id, &sm),
		     "set_mode request");
	if (emb_wire_pace_req_decode(f, &pc) == 0) {
		must(pc.p99_us && pc.base_us && pc.calls, "pace fields");
		same(f, out,
		     emb_wire_pace_req_encode(out, sizeof(out), f->hdr.req_id,
					      &pc),
		     "pace request");
	}
	if (emb_wire_set_lifecycle_req_decode(f, &sl) == 0)
		same(f, out,
		     emb_wire_set_lifecycle_req_encode(out, sizeof(out),
						       f->hdr.req_id, &sl),
		     "set_lifecycle request");
	if (emb_wire_erase_req_decode(f, &er) == 0) {
		touch(er.ids, 8 * (size_t)er.n);
		same_iovs(f, &v,
			  emb_wire_erase_req_encode(&v, f->hdr.req_id,
						    er.table_id, er.ids, er.n),
			  "erase request");
	}
}

static void check_pull_resp(const struct emb_wire_frame *f, uint32_t wdim,
			    uint32_t state)
{
	struct emb_wire_pull_resp pr;
	_Alignas(8) uint8_t head[EMB_WIRE_HDR_SIZE];
	struct emb_wire_iovs v;
	size_t off = 0;
	uint32_t i, dim;
	int cnt;

	if (emb_wire_pull_resp_decode(f, wdim, state, &pr) != 0)
		return;
	/* From here on dim is the row stride the frame carries. */
	dim = pr.stride;
	must(pr.dim == wdim, "pull response dim");
	must(pr.with_state == !!(f->hdr.flags & EMB_F_WITH_STATE),
	     "pull response state flag");
	must(dim == wdim + (pr.with_state ? state : 0), "pull response stride");
	must(pr.n <= f->lim->max_ids, "pull response count");
	must(((uintptr_t)pr.rows & 7) == 0, "pull rows aligned");
	must((uint64_t)((const uint8_t *)pr.rows - f->payload) +
		     EMB_WIRE_HDR_SIZE ==
		 emb_wire_pull_rows_offset(pr.n, f->hdr.flags),
	     "pull rows offset");
	if (pr.found && pr.n <= sizeof(found)) {
		/* Unpacked and packed again, the bitmap is unchanged. */
		for (i = 0; i < pr.n; i++)
			found[i] = emb_wire_bit_test(pr.found, i);
		emb_wire_found_pack(found, pr.n, bits);
		must(memcmp(bits, pr.found, emb_wire_bitmap_bytes(pr.n)) == 0,
		     "found bitmap");
	}
	touch(pr.rows, 4 * (size_t)pr.n * dim);
	same_iovs(f, &v,
		  emb_wire_pull_resp_encode(&v, f->hdr.req_id, f->hdr.table_id,
					    f->hdr.flags, pr.n, dim, pr.found,
					    pr.rows),
		  "pull response");

	/* The gather encoder must produce the same bytes. */
	if (pr.n > sizeof(rowp) / sizeof(rowp[0]) - 2)
		return;
	for (i = 0; i < pr.n; i++)
		rowp[i] = pr.found && !emb_wire_bit_test(pr.found, i)
			      ? NULL
			      : pr.rows + (size_t)i * dim;
	cnt = emb_wire_pull_resp_encode_ptrs(
	    head, iov, pr.n + 2, f->hdr.req_id, f->hdr.table_id, f->hdr.flags,
	    pr.n, dim, pr.found, rowp, zero_row);
	must(cnt > 0, "pull gather");
	for (i = 0; i < (uint32_t)cnt; i++) {
		memcpy(out + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	must(off == EMB_WIRE_HDR_SIZE + f->hdr.payload_len, "pull gather len");
	/* Missing rows went out as zeros: compare the rest. */
	off = emb_wire_pull_rows_offset(pr.n, f->hdr.flags);
	must(memcmp(out, f->payload - EMB_WIRE_HDR_SIZE, off) == 0,
	     "pull gather head");
	for (i = 0; i < pr.n; i++) {
		size_t at = off + 4 * (size_t)i * dim;

		if (rowp[i])
			must(memcmp(out + at, pr.rows + (size_t)i * dim,
				    4 * (size_t)dim) == 0,
			     "pull gather row");
		else
			must(memcmp(out + at, zero_row, 4 * (size_t)dim) == 0,
			     "pull gather zero row");
	}
}

static void check_rows(const struct emb_wire_frame *f, uint32_t dim)
{
	const uint32_t states[] = {0, dim, 2 * dim + 1};
	struct emb_wire_assign_req ar;
	struct emb_wire_push_req pu;
	struct emb_wire_iovs v;
	size_t i;
	int rc;

	if (emb_wire_push_req_decode(f, dim, &pu) == 0) {
		must(((uintptr_t)pu.ids & 7) == 0, "push ids aligned");
		must(((uintptr_t)pu.grads & 3) == 0, "push grads aligned");
		must(((uintptr_t)pu.half_grads & 1) == 0,
		     "push half grads aligned");
		must(!pu.half == !pu.half_grads && !pu.half == !!pu.grads,
		     "push grads in one format");
		must(((uintptr_t)pu.births & 3) == 0, "push births aligned");
		touch(pu.ids, 8 * (size_t)pu.n);
		if (pu.births)
			touch(pu.births, 4 * (size_t)pu.n);
		if (pu.half) {
			touch(pu.half_grads, 2 * (size_t)pu.n * dim);
			rc = emb_wire_push_req_encode_births(
			    &v, f->hdr.req_id, pu.table_id, pu.step, pu.rank,
			    pu.session, pu.seq, pu.ids, pu.n, dim, pu.half,
			    pu.half_grads, pu.births);
		} else {
			touch(pu.grads, 4 * (size_t)pu.n * dim);
			rc = emb_wire_push_req_encode_births(
			    &v, f->hdr.req_id, pu.table_id, pu.step, pu.rank,
			    pu.session, pu.seq, pu.ids, pu.n, dim, 0, pu.grads,
			    pu.births);
		}
		/* The encoder leaves STEP_END and ADMITTED to the
		 * caller's header. */
		if (rc == 0 && pu.step_end)
			emb_le16_store(v.head + 6,
				       emb_le16_load(v.head + 6) |
					   EMB_F_STEP_END);
		if (rc == 0 && pu.admitted)
			emb_le16_store(v.head + 6,
				       emb_le16_load(v.head + 6) |
					   EMB_F_ADMITTED);
		same_iovs(f, &v, rc, "push request");
	}
	for (i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		if (emb_wire_assign_req_decode(f, dim, states[i], &ar) != 0)
			continue;
		touch(ar.ids, 8 * (size_t)ar.n);
		touch(ar.rows, 4 * (size_t)ar.n * ar.stride);
		if (ar.meta)
			touch(ar.meta, 8 * (size_t)ar.n);
		must(((uintptr_t)ar.births & 3) == 0, "assign births aligned");
		if (ar.births)
			touch(ar.births, 4 * (size_t)ar.n);
		same_iovs(f, &v,
			  emb_wire_assign_req_encode_births(
			      &v, f->hdr.req_id, ar.table_id,
			      f->hdr.flags & ~(EMB_F_EPOCH | EMB_F_FILL |
					       EMB_F_WARM | EMB_F_META |
					       EMB_F_BIRTHS),
			      ar.ids, ar.n, ar.stride, ar.rows, ar.meta,
			      ar.births),
			  "assign request");
	}
	for (i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		check_pull_resp(f, dim, states[i]);
}

/* Cluster messages (src/proto/wire_cluster.h); every codec there is canonical. */
static void check_cluster(const struct emb_wire_frame *f)
{
	static struct emb_wire_node_addr addrs[EMB_WIRE_SERVERS_MAX];
	static struct emb_wire_node_ref refs[EMB_WIRE_NODES_MAX];
	static uint16_t slot_map[EMB_NSLOTS];
	static const uint8_t node_ops[] = {EMB_OP_CLUSTER_MAP, EMB_OP_FINISH};
	static const uint8_t ack_ops[] = {EMB_OP_BARRIER, EMB_OP_FINISH,
					  EMB_OP_FILL_DONE, EMB_OP_DRAIN};
	struct emb_wire_fill_done_req fd;
	struct emb_wire_register_req rq;
	struct emb_wire_register_resp rr;
	struct emb_wire_cluster_map m;
	struct emb_wire_heartbeat_resp hb;
	struct emb_wire_barrier_req b;
	char text[EMB_WIRE_HOST_MAX + 1];
	uint64_t seq;
	uint32_t id, count, i, newer;
	bool hold;

	if (emb_wire_register_req_decode(f, &rq) == 0) {
		must(rq.host_len <= EMB_WIRE_HOST_MAX, "register host");
		memcpy(text, rq.host ? rq.host : "", rq.host_len);
		text[rq.host_len] = '\0';
		same(f, out,
		     rq.rejoin ? emb_wire_rejoin_req_encode(
				     out, sizeof(out), f->hdr.req_id, &rq)
			       : emb_wire_register_req_encode(
				     out, sizeof(out), f->hdr.req_id, rq.role,
				     rq.port, rq.pid, text),
		     "register request");
	}
	if (emb_wire_register_resp_decode(f, &rr) == 0)
		same(f, out,
		     emb_wire_register_resp_encode(out, sizeof(out),
						   f->hdr.req_id, &rr),
		     "register response");
	if (emb_wire_map_req_decode(f, &id, &newer) == 0)
		same(f, out,
		     emb_wire_map_req_encode(out, sizeof(out), f->hdr.req_id,
					     id, newer),
		     "map request");
	if (emb_wire_finish_req_decode(f, &id, &hold) == 0)
		same(f, out,
		     emb_wire_finish_req_encode(out, sizeof(out),
						f->hdr.req_id, id, hold),
		     "finish request");
	for (i = 0; i < sizeof(node_ops); i++)
		if (emb_wire_node_req_decode(f, node_ops[i], &id) == 0)
			same(f, out,
			     emb_wire_node_req_encode(out, sizeof(out),
						      node_ops[i],
						      f->hdr.req_id, id),
			     "node request");
	for (i = 0; i < sizeof(ack_ops); i++)
		if (emb_wire_cluster_ack_decode(f, ack_ops[i], &count) == 0)
			same(f, out,
			     emb_wire_cluster_ack_encode(out, sizeof(out),
							 ack_ops[i],
							 f->hdr.req_id, count),
			     "cluster ack");
	if (emb_wire_cluster_map_decode(f, &m) == 0) {
		for (i = 0; i < EMB_NSLOTS; i++) {
			slot_map[i] = emb_wire_cluster_map_slot(&m, i);
			must(slot_map[i] < m.nservers, "map slot");
		}
		for (i = 0; i < m.nservers; i++)
			emb_wire_cluster_map_server(&m, i, &addrs[i]);
		same(f, out,
		     emb_wire_cluster_map_encode(out, sizeof(out),
						 f->hdr.req_id, m.nworkers,
						 m.replicas, slot_map, addrs,
						 m.nservers, m.cmap, m.cmap_len),
		     "cluster map");
		/* The replicated map a client takes from it, any version:
		 * what decodes encodes (in the oldest version that holds it)
		 * and decodes again to the same map. */
		if (m.cmap_len) {
			static struct emb_cmap cm, cm2;
			/* The frame takes no larger map, and the encoder
			 * writes no larger one than it read. */
			static uint8_t back[EMB_WIRE_MAP_CMAP_MAX];
			int64_t bl;

			if (emb_cmap_decode(m.cmap, m.cmap_len, &cm) == 0) {
				bl = emb_cmap_encode(&cm, back, sizeof(back));
				must(bl > 0 && (size_t)bl <= m.cmap_len,
				     "cluster map: encode");
				must(emb_cmap_decode(back, (size_t)bl, &cm2) ==
					     0 &&
					 !memcmp(&cm, &cm2, sizeof(cm)),
				     "cluster map: round trip");
			}
		}
	}
	if (emb_wire_fill_done_req_decode(f, &fd) == 0)
		same_or_older(f, out,
			      emb_wire_fill_done_req_encode(
				  out, sizeof(out), f->hdr.req_id, &fd),
			      EMB_WIRE_FILL_DONE_REQ_SIZE_V1,
			      "fill done request");
	if (emb_wire_moves_req_decode(f) == 0)
		same(f, out,
		     emb_wire_moves_req_encode(out, sizeof(out), f->hdr.req_id),
		     "moves request");
	{
		struct emb_wire_moves mv;

		if (emb_wire_moves_resp_decode(f, &mv) == 0)
			same_or_older(f, out,
				      emb_wire_moves_resp_encode(
					  out, sizeof(out), f->hdr.req_id, &mv),
				      EMB_WIRE_MOVES_RESP_SIZE_V1,
				      "moves response");
	}
	if (emb_wire_drain_req_decode(f, &id) == 0)
		same(f, out,
		     emb_wire_drain_req_encode(out, sizeof(out), f->hdr.req_id,
					       id),
		     "drain request");
	if (emb_wire_heartbeat_req_decode(f, &id, &seq) == 0)
		same(f, out,
		     emb_wire_heartbeat_req_encode(out, sizeof(out),
						   f->hdr.req_id, id, seq),
		     "heartbeat request");
	if (emb_wire_heartbeat_resp_decode(f, &hb) == 0) {
		for (i = 0; i < hb.ndead; i++)
			emb_wire_heartbeat_dead(&hb, i, &refs[i]);
		same(f, out,
		     emb_wire_heartbeat_resp_encode(out, sizeof(out),
						    f->hdr.req_id, hb.state,
						    hb.map_epoch, refs, hb.ndead),
		     "heartbeat response");
	}
	if (emb_wire_barrier_req_decode(f, &b) == 0) {
		must(b.name_len >= 1 && b.name_len <= EMB_WIRE_BARRIER_NAME_MAX,
		     "barrier name");
		memcpy(text, b.name, b.name_len);
		text[b.name_len] = '\0';
		same(f, out,
		     emb_wire_barrier_req_encode(out, sizeof(out),
						 f->hdr.req_id, b.node_id,
						 text),
		     "barrier request");
	}
}

/* DUMP_BEGIN / DUMP_CHUNK / DUMP_END (proto/wire_dump.h). */
static void check_dump(const struct emb_wire_frame *f)
{
	static const uint8_t ops[] = {EMB_OP_DUMP_BEGIN, EMB_OP_DUMP_CHUNK,
				      EMB_OP_DUMP_END};
	static const uint32_t rfs[] = {1, 4, 9, 3 * EMB_WIRE_DIM_MAX + 1};
	struct emb_wire_dump_info info;
	struct emb_wire_dump_chunk ch;
	uint32_t i;

	for (i = 0; i < sizeof(ops); i++)
		if (emb_wire_dump_req_decode(f, ops[i]) == 0)
			must(f->hdr.payload_len == 0 &&
				 (f->hdr.flags & ~EMB_F_CONSISTENT) == 0,
			     "dump request");
	if (emb_wire_dump_info_decode(f, &info) == 0) {
		must((info.flags & ~EMB_WIRE_DUMP_CONSISTENT) == 0,
		     "dump info flags");
		same(f, out,
		     emb_wire_dump_info_encode(out, sizeof(out), f->hdr.req_id,
					       f->hdr.table_id, &info),
		     "dump info");
	}
	for (i = 0; i < sizeof(rfs) / sizeof(rfs[0]); i++) {
		if (emb_wire_dump_chunk_decode(f, rfs[i], &ch) != 0)
			continue;
		must((uint64_t)ch.n * emb_wire_dump_row_bytes(rfs[i]) ==
			 f->hdr.payload_len,
		     "dump chunk size");
		touch(ch.ids, 8ull * ch.n);
		touch(ch.meta, 8ull * ch.n);
		touch(ch.rows, 4ull * ch.n * rfs[i]);
	}
}


/*
 * PULL_MANY and PUSH_MANY: every sub-frame lies inside the payload and is
 * itself a frame the single-frame checks accept or refuse (a PUSH's rows
 * at every dim); the sub-frames written again give the payload back byte
 * for byte.
 */
static void check_many(const struct emb_wire_frame *f)
{
	static struct emb_wire_frame subs[EMB_WIRE_MANY_MAX];
	uint64_t off = 0;
	int n = emb_wire_many_decode(f, subs, EMB_WIRE_MANY_MAX);

	if (n <= 0)
		return;
	must(n == (int)f->hdr.count, "many count");
	for (int i = 0; i < n; i++) {
		const struct emb_wire_frame *s = &subs[i];

		must(s->payload >= f->payload + EMB_WIRE_HDR_SIZE &&
			 s->payload + s->hdr.payload_len <=
			     f->payload + f->hdr.payload_len,
		     "sub-frame inside");
		must(((uintptr_t)s->payload & 7) == 0, "sub-frame aligned");
		touch(s->payload, s->hdr.payload_len);
		check_ids(s);
		check_simple(s);
		for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
			check_rows(s, dims[d]);
	}
	/* After the checks above, which re-encode into out too. */
	for (int i = 0; i < n; i++) {
		const struct emb_wire_frame *s = &subs[i];
		struct iovec v = {(void *)s->payload, s->hdr.payload_len};
		int64_t len;

		len = emb_wire_many_sub_put(out + off, &s->hdr, &v, 1);
		must(len > 0, "sub-frame re-encoded");
		off += (uint64_t)len;
	}
	must(off == f->hdr.payload_len &&
		 memcmp(out, f->payload, off) == 0,
	     "many re-encoded");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct emb_wire_frame f;
	struct emb_frame_hdr h;
	size_t l, d;

	/* Larger inputs would not fit the re-encode buffer; libFuzzer's
	 * default -max_len of 4096 stays far below it. */
	if (size > sizeof(out))
		return 0;
	for (l = 0; l < sizeof(limits) / sizeof(limits[0]); l++) {
		/* The header check alone, as a stream transport calls it. */
		if (emb_wire_hdr_decode(data, size, &limits[l], &h) == 0)
			must(h.payload_len <=
				 limits[l].max_frame_bytes - EMB_WIRE_HDR_SIZE,
			     "header length");
		if (emb_wire_frame_decode(data, size, &limits[l], &f) != 0)
			continue;
		must(f.hdr.payload_len <= size - EMB_WIRE_HDR_SIZE,
		     "payload inside input");
		check_hello(&f);
		check_tables(&f);
		check_simple(&f);
		check_stats(&f);
		check_locate(&f);
		check_births(&f);
		check_ids(&f);
		check_many(&f);
		check_cluster(&f);
		check_dump(&f);
		for (d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
			check_rows(&f, dims[d]);
	}
	return 0;
}
