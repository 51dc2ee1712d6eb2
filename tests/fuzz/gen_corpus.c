/*
 * tests/fuzz/gen_corpus.c - writes one valid frame per message kind into a
 * directory: the seed corpus of fuzz_frame (checked in as tests/fuzz/corpus).
 * Run it again after a layout change: gen_corpus tests/fuzz/corpus
 * Dims are 3 and 8 and counts small, so the seeds fit every limit setting
 * the fuzz target tries but the tiniest.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/endian.h"
#include "common/err.h"
#include "proto/wire.h"
#include "proto/wire_cluster.h"
#include "proto/wire_dump.h"
#include "proto/wire_many.h"
#include "proto/wire_msg.h"

static _Alignas(8) uint8_t buf[1u << 17];
static const char *dir;
static int failed;

static void save(const char *name, int len)
{
	char path[4096];
	FILE *fp;

	if (len < 0) {
		fprintf(stderr, "gen_corpus: %s: %s\n", name,
			emb_strerror(len));
		failed = 1;
		return;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fp = fopen(path, "wb");
	if (!fp || fwrite(buf, 1, (size_t)len, fp) != (size_t)len) {
		fprintf(stderr, "gen_corpus: %s: %s\n", path, strerror(errno));
		failed = 1;
	}
	if (fp)
		fclose(fp);
}

/* A cluster map's header (cluster/map.h): magic, version, epoch, S, R. */
static void cmap_header(uint8_t *cm, uint32_t ver, uint64_t epoch, uint32_t n,
			uint32_t r)
{
	emb_le32_store(cm, 0x4d424d45u);
	emb_le32_store(cm + 4, ver);
	emb_le64_store(cm + 8, epoch);
	emb_le32_store(cm + 16, n);
	emb_le32_store(cm + 20, r);
}

/* Saves the frame encoded in buf (len bytes, or an error) as a peer
 * older than its tail sends it: payload_len bytes of the payload, the
 * header saying so. */
static void save_older(const char *name, int len, uint32_t payload_len)
{
	struct emb_frame_hdr h;

	if (len > 0) {
		emb_frame_hdr_decode(buf, &h);
		h.payload_len = payload_len;
		emb_frame_hdr_encode(buf, &h);
		len = (int)(EMB_WIRE_HDR_SIZE + payload_len);
	}
	save(name, len);
}

/*
 * Saves gen_corpus's map of a fill begun in version ver (4 to 7,
 * cluster/map.h) as a CLUSTER_MAP answer: one copy, 2 servers, slots
 * 0-15 moving from 0 to 1 since epoch 6, slots 16-31 moved to 1 by a fill
 * begun at epoch 4, each start's source server 0 from version 6 on; the
 * dense tables (4, 6) or the lists of the slots with an entry (5, 7).
 */
static void save_began(const char *name, uint32_t ver,
		       const struct emb_wire_node_addr *addrs)
{
	static uint16_t primaries[EMB_NSLOTS];
	static uint8_t cm[24 + 14 * EMB_NSLOTS];
	const bool sparse = ver == 5 || ver == 7, from = ver >= 6;
	const uint32_t eb = (sparse ? 8 : 6) + 2 * from;
	uint8_t *p = cm + 24 + 2 * EMB_NSLOTS;

	cmap_header(cm, ver, 7, 2, 1);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
		primaries[i] = i >= 16 && (i < 32 || i >= EMB_NSLOTS / 2);
		emb_le16_store(cm + 24 + 2 * i, primaries[i]);
	}
	if (!sparse) {
		uint8_t *warm = p + 2 * EMB_NSLOTS;
		uint8_t *began = warm + 2 * EMB_NSLOTS;

		for (uint32_t i = 0; i < EMB_NSLOTS; i++, began += eb) {
			emb_le16_store(p + 2 * i, i < 16 ? 1 : 0xffff);
			emb_le16_store(warm + 2 * i, 0xffff);
			emb_le32_store(began, i < 16 ? 6 : i < 32 ? 4 : 0);
			emb_le16_store(began + 4, i < 32 ? 1 : 0xffff);
			if (from)
				emb_le16_store(began + 6, i < 32 ? 0 : 0xffff);
		}
		p = began;
	} else {
		emb_le16_store(p, 16);
		p += 2;
		for (uint32_t i = 0; i < 16; i++, p += 4) {
			emb_le16_store(p, (uint16_t)i);
			emb_le16_store(p + 2, 1);
		}
		emb_le16_store(p, 0);
		emb_le16_store(p + 2, 32);
		p += 4;
		for (uint32_t i = 0; i < 32; i++, p += eb) {
			emb_le16_store(p, (uint16_t)i);
			emb_le16_store(p + 2, 1);
			if (from)
				emb_le16_store(p + 4, 0);
			emb_le32_store(p + eb - 4, i < 16 ? 6 : 4);
		}
	}
	save(name, emb_wire_cluster_map_encode(buf, sizeof(buf), 2, 2, 1,
					       primaries, addrs, 2, cm,
					       (uint32_t)(p - cm)));
}

static void save_iovs(const char *name, const struct emb_wire_iovs *v, int rc)
{
	save(name, rc ? rc : emb_wire_iovs_flatten(v, buf, sizeof(buf)));
}

static struct emb_wire_spec spec_make(const char *name, uint32_t dim)
{
	struct emb_wire_spec s;

	memset(&s, 0, sizeof(s));
	snprintf(s.name, sizeof(s.name), "%s", name);
	s.dim = dim;
	s.optim = EMB_OPTIM_CFG_DEFAULT;
	s.init = EMB_INIT_CFG_DEFAULT;
	s.seed = 42;
	return s;
}


/*
 * PULL_MANY (proto/wire_many.h): a request of two PULLs (NOCREATE on the
 * second), and its reply: dim-3 rows, then the second's error.
 */
static void save_many(void)
{
	static const uint64_t ids[3] = {1, 2, 3};
	static const float rows[2 * 3] = {1, 2, 3, 4, 5, 6};
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = EMB_OP_PULL,
				  .table_id = 1,
				  .count = 2,
				  .payload_len = 16};
	struct iovec v = {(void *)ids, 16};
	_Alignas(8) uint8_t err[64];
	int64_t off = EMB_WIRE_HDR_SIZE;
	int len;

	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	h.req_id = 1;
	h.table_id = 2;
	h.count = 1;
	h.flags = EMB_F_NOCREATE;
	h.payload_len = 8;
	v = (struct iovec){(void *)(ids + 2), 8};
	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	emb_wire_hdr_encode(buf, &(struct emb_frame_hdr){
				     .magic = EMB_WIRE_MAGIC,
				     .version = EMB_WIRE_VERSION,
				     .opcode = EMB_OP_PULL_MANY,
				     .req_id = 12,
				     .count = 2,
				     .payload_len = (uint32_t)off -
						    EMB_WIRE_HDR_SIZE});
	save("pull_many_req", (int)off);

	off = EMB_WIRE_HDR_SIZE;
	h = (struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
				   .version = EMB_WIRE_VERSION,
				   .opcode = EMB_OP_PULL | EMB_OP_RESPONSE_BIT,
				   .table_id = 1,
				   .count = 2,
				   .payload_len = sizeof(rows)};
	v = (struct iovec){(void *)rows, sizeof(rows)};
	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	len = emb_wire_error_encode(err, sizeof(err), EMB_OP_PULL, 1, 2,
				    EMB_ENOTABLE, "no table 2");
	memcpy(&h, &(struct emb_frame_hdr){0}, sizeof(h));
	if (len < 0 || emb_wire_hdr_decode(err, (size_t)len,
					   &EMB_WIRE_LIMITS_DEFAULT, &h)) {
		save("pull_many_resp", len < 0 ? len : EMB_EBADFRAME);
		return;
	}
	v = (struct iovec){err + EMB_WIRE_HDR_SIZE, h.payload_len};
	off += emb_wire_many_sub_put(buf + off, &h, &v, 1);
	emb_wire_hdr_encode(buf, &(struct emb_frame_hdr){
				     .magic = EMB_WIRE_MAGIC,
				     .version = EMB_WIRE_VERSION,
				     .opcode = EMB_OP_PULL_MANY |
					       EMB_OP_RESPONSE_BIT,
				     .req_id = 12,
				     .count = 2,
				     .payload_len = (uint32_t)off -
						    EMB_WIRE_HDR_SIZE});
	save("pull_many_resp", (int)off);
}

/*
 * PUSH_MANY (proto/wire_many.h): a request of two PUSHes of dim 3 (the
 * second with a session), and its reply: an acknowledgement, then the
 * second's error.
 */
static void save_push_many(void)
{
	static const uint64_t ids[2] = {1, 2};
	static const float grads[2 * 3] = {1, 2, 3, 4, 5, 6};
	_Alignas(8) uint8_t sub[256];
	struct emb_wire_iovs v;
	struct emb_frame_hdr h;
	struct iovec iov;
	int64_t off = EMB_WIRE_HDR_SIZE;
	int len;

	for (uint32_t i = 0; i < 2; i++) {
		int rc =
		    i ? emb_wire_push_req_encode_session(
			    &v, i, 2, 5, 0, 0x5e55, 9, ids + 1, 1, 3, grads + 3)
		      : emb_wire_push_req_encode(&v, i, 1, 5, 0, ids, 1, 3,
						 grads);

		len = rc ? rc : emb_wire_iovs_flatten(&v, sub, sizeof(sub));
		if (len < 0 ||
		    emb_wire_hdr_decode(sub, (size_t)len,
					&EMB_WIRE_LIMITS_DEFAULT, &h)) {
			save("push_many_req", len < 0 ? len : EMB_EBADFRAME);
			return;
		}
		iov = (struct iovec){sub + EMB_WIRE_HDR_SIZE, h.payload_len};
		off += emb_wire_many_sub_put(buf + off, &h, &iov, 1);
	}
	emb_wire_hdr_encode(
	    buf, &(struct emb_frame_hdr){.magic = EMB_WIRE_MAGIC,
					 .version = EMB_WIRE_VERSION,
					 .opcode = EMB_OP_PUSH_MANY,
					 .req_id = 13,
					 .count = 2,
					 .payload_len = (uint32_t)off -
							EMB_WIRE_HDR_SIZE});
	save("push_many_req", (int)off);

	off = EMB_WIRE_HDR_SIZE;
	off += emb_wire_ack_encode(buf + off, 64, EMB_OP_PUSH, 0, 1, 0);
	len = emb_wire_error_encode(sub, sizeof(sub), EMB_OP_PUSH, 1, 2,
				    EMB_ENONFINITE, "gradient of id 2 is NaN");
	if (len < 0 || emb_wire_hdr_decode(sub, (size_t)len,
					   &EMB_WIRE_LIMITS_DEFAULT, &h)) {
		save("push_many_resp", len < 0 ? len : EMB_EBADFRAME);
		return;
	}
	iov = (struct iovec){sub + EMB_WIRE_HDR_SIZE, h.payload_len};
	off += emb_wire_many_sub_put(buf + off, &h, &iov, 1);
	emb_wire_hdr_encode(
	    buf, &(struct emb_frame_hdr){
		     .magic = EMB_WIRE_MAGIC,
		     .version = EMB_WIRE_VERSION,
		     .opcode = EMB_OP_PUSH_MANY | EMB_OP_RESPONSE_BIT,
		     .req_id = 13,
		     .count = 2,
		     .payload_len = (uint32_t)off - EMB_WIRE_HDR_SIZE});
	save("push_many_resp", (int)off);
}

/* One seed per cluster message (common/wire_cluster.h). */
static void save_cluster(void)
{
	static uint16_t slot_map[EMB_NSLOTS];
	struct emb_wire_node_addr addrs[2] = {{"10.0.0.2", 7164, false},
					      {"node-b.example", 7165, false}};
	struct emb_wire_node_ref dead[2] = {{EMB_ROLE_SERVER, 1},
					    {EMB_ROLE_WORKER, 0}};
	struct emb_wire_register_resp rr = {
	    .role = EMB_ROLE_WORKER,
	    .rank = 1,
	    .node_id = 4,
	    .server_num = 2,
	    .worker_num = 2,
	    .hb_timeout_ms = 10000,
	    .cluster_id = 0x1234,
	};
	const struct emb_wire_register_req rejoin = {
	    .role = EMB_ROLE_SERVER,
	    .port = 7164,
	    .pid = 42,
	    .host = "10.0.0.2",
	    .host_len = 8,
	    .rank = 1,
	    .cluster_id = 0x1234,
	    .map_epoch = 3,
	};

	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		slot_map[i] = (uint16_t)(i * 2 / EMB_NSLOTS);
	save("register_req_server",
	     emb_wire_register_req_encode(buf, sizeof(buf), 1,
					  EMB_ROLE_SERVER, 7164, 42,
					  "10.0.0.2"));
	save("register_req_worker",
	     emb_wire_register_req_encode(buf, sizeof(buf), 1,
					  EMB_ROLE_WORKER, 0, 43, NULL));
	save("register_req_rejoin",
	     emb_wire_rejoin_req_encode(buf, sizeof(buf), 1, &rejoin));
	save("register_resp",
	     emb_wire_register_resp_encode(buf, sizeof(buf), 1, &rr));
	save("cluster_map_req",
	     emb_wire_node_req_encode(buf, sizeof(buf), EMB_OP_CLUSTER_MAP, 2,
				      4));
	save("cluster_map_watch",
	     emb_wire_map_req_encode(buf, sizeof(buf), 2, 4, 17));
	save("cluster_map_resp",
	     emb_wire_cluster_map_encode(buf, sizeof(buf), 2, 2, 0, slot_map,
					 addrs, 2, NULL, 0));
	/* After a failover: two copies, server 1 removed, 0 holds all. */
	{
		static uint16_t primaries[EMB_NSLOTS];
		/* The replicated map's tail (cluster/map.h, version 1):
		 * epoch 2, 2 servers, R = 2, every slot on 0 alone. */
		static uint8_t cm[24 + 4 * EMB_NSLOTS];

		cmap_header(cm, 1, 2, 2, 2);
		for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
			emb_le16_store(cm + 24 + 4 * i, 0);
			emb_le16_store(cm + 26 + 4 * i, 0xffff);
		}
		struct emb_wire_node_addr after[2] = {{"10.0.0.2", 7164, false},
						      {"10.0.0.3", 7164, true}};

		save("cluster_map_resp_replicas",
		     emb_wire_cluster_map_encode(buf, sizeof(buf), 2, 2, 2,
						 primaries, after, 2, cm,
						 sizeof(cm)));
	}
	/* A move's copy ahead under way (cluster/map.h, version 3): one
	 * copy, 2 servers, slots 0-15 copied ahead from 0 to 1. */
	{
		static uint16_t primaries[EMB_NSLOTS];
		static uint8_t cm[24 + 6 * EMB_NSLOTS];
		uint8_t *fill = cm + 24 + 2 * EMB_NSLOTS;
		uint8_t *warm = fill + 2 * EMB_NSLOTS;

		cmap_header(cm, 3, 5, 2, 1);
		for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
			primaries[i] = i >= EMB_NSLOTS / 2;
			emb_le16_store(cm + 24 + 2 * i, primaries[i]);
			emb_le16_store(fill + 2 * i, 0xffff);
			emb_le16_store(warm + 2 * i, i < 16 ? 1 : 0xffff);
		}
		save("cluster_map_resp_warm",
		     emb_wire_cluster_map_encode(buf, sizeof(buf), 2, 2, 1,
						 primaries, addrs, 2, cm,
						 sizeof(cm)));
	}
	/* A fill begun (cluster/map.h, versions 4 to 7): one copy, 2
	 * servers, slots 0-15 moving from 0 to 1 since epoch 6, slots 16-31
	 * moved to 1 by a fill begun at epoch 4; from version 6 on each fill
	 * start names its source, server 0. */
	save_began("cluster_map_resp_began", 4, addrs);
	save_began("cluster_map_resp_sparse", 5, addrs);
	save_began("cluster_map_resp_from", 6, addrs);
	save_began("cluster_map_resp_from_sparse", 7, addrs);
	save("moves_req", emb_wire_moves_req_encode(buf, sizeof(buf), 9));
	{
		struct emb_wire_moves mv = {
		    .kind = EMB_WIRE_MOVE_JOIN, .rank = 2, .phase = 2,
		    .first = 256, .n = 256, .from = 1, .to = 2, .moved = 256,
		    .left = 1109, .elapsed_ms = 900, .eta_ms = 3899,
		    .rows = 163840, .bytes = 43253760};

		save("moves_resp",
		     emb_wire_moves_resp_encode(buf, sizeof(buf), 9, &mv));
		/* As a scheduler older than rows and bytes sent it. */
		save_older("moves_resp_v1",
			   emb_wire_moves_resp_encode(buf, sizeof(buf), 9, &mv),
			   EMB_WIRE_MOVES_RESP_SIZE_V1);
	}
	save("heartbeat_req",
	     emb_wire_heartbeat_req_encode(buf, sizeof(buf), 3, 4, 17));
	save("heartbeat_resp_dead",
	     emb_wire_heartbeat_resp_encode(buf, sizeof(buf), 3,
					    EMB_CLUSTER_READY, 0, dead, 2));
	save("heartbeat_resp_epoch",
	     emb_wire_heartbeat_resp_encode(buf, sizeof(buf), 3,
					    EMB_CLUSTER_READY, 4, dead, 1));
	{
		struct emb_wire_fill_done_req fd = {4, 0, 1024, 256, 3, 20480,
						    5406720};

		save("fill_done_req",
		     emb_wire_fill_done_req_encode(buf, sizeof(buf), 7, &fd));
		/* As a server older than rows and bytes sent it. */
		save_older("fill_done_req_v1",
			   emb_wire_fill_done_req_encode(buf, sizeof(buf), 7,
							 &fd),
			   EMB_WIRE_FILL_DONE_REQ_SIZE_V1);
		fd.rows = fd.bytes = 0;
		fd.status = EMB_EMOVING;
		save("fill_done_req_failed",
		     emb_wire_fill_done_req_encode(buf, sizeof(buf), 7, &fd));
		save("fill_done_resp",
		     emb_wire_cluster_ack_encode(buf, sizeof(buf),
						 EMB_OP_FILL_DONE, 7, 0));
	}
	save("drain_req", emb_wire_drain_req_encode(buf, sizeof(buf), 8, 2));
	save("drain_resp",
	     emb_wire_cluster_ack_encode(buf, sizeof(buf), EMB_OP_DRAIN, 8, 0));
	save("barrier_req",
	     emb_wire_barrier_req_encode(buf, sizeof(buf), 5, 4, "epoch-1"));
	save("barrier_resp",
	     emb_wire_cluster_ack_encode(buf, sizeof(buf), EMB_OP_BARRIER, 5,
					 2));
	save("finish_req",
	     emb_wire_node_req_encode(buf, sizeof(buf), EMB_OP_FINISH, 6, 4));
	save("finish_hold_req",
	     emb_wire_finish_req_encode(buf, sizeof(buf), 7, 4, true));
	save("finish_resp",
	     emb_wire_cluster_ack_encode(buf, sizeof(buf), EMB_OP_FINISH, 6,
					 0));
}

/* A header-only frame (DUMP_* requests, DUMP_CHUNK's empty end). */
static int bare(uint8_t op, uint16_t flags, uint32_t table_id, uint32_t count)
{
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = op,
				  .flags = flags,
				  .req_id = 12,
				  .table_id = table_id,
				  .count = count};

	emb_wire_hdr_encode(buf, &h);
	return EMB_WIRE_HDR_SIZE;
}

/* One seed per dump message (proto/wire_dump.h). */
static void save_dump(void)
{
	struct emb_wire_dump_info info = {0};
	struct emb_frame_hdr h = {.magic = EMB_WIRE_MAGIC,
				  .version = EMB_WIRE_VERSION,
				  .opcode = EMB_OP_DUMP_CHUNK |
					    EMB_OP_RESPONSE_BIT,
				  .req_id = 12,
				  .table_id = 1,
				  .count = 2,
				  .payload_len = 2 * (16 + 4 * 4)};
	uint8_t *p = buf + EMB_WIRE_HDR_SIZE;

	info.spec = spec_make("emb", 3);
	info.state_floats = 0;
	info.row_floats = 3;
	info.rows = 1000;
	info.step = 77;
	save("dump_begin_req", bare(EMB_OP_DUMP_BEGIN, 0, 1, 0));
	save("dump_begin_req_consistent",
	     bare(EMB_OP_DUMP_BEGIN, EMB_F_CONSISTENT, 1, 0));
	save("dump_begin_resp",
	     emb_wire_dump_info_encode(buf, sizeof(buf), 12, 1, &info));
	info.flags = EMB_WIRE_DUMP_CONSISTENT;
	info.pause_us = 120;
	save("dump_begin_resp_consistent",
	     emb_wire_dump_info_encode(buf, sizeof(buf), 12, 1, &info));
	save("dump_chunk_req", bare(EMB_OP_DUMP_CHUNK, 0, 1, 64));
	/* Two rows of 4 floats: ids, meta pairs, rows. */
	emb_wire_hdr_encode(buf, &h);
	memset(p, 0, h.payload_len);
	p[0] = 1;
	p[8] = 2;
	p[16] = 5;
	p[20] = 1;
	save("dump_chunk_resp_rf4", (int)(EMB_WIRE_HDR_SIZE + h.payload_len));
	save("dump_chunk_resp_end",
	     bare(EMB_OP_DUMP_CHUNK | EMB_OP_RESPONSE_BIT, 0, 1, 0));
	save("dump_end_req", bare(EMB_OP_DUMP_END, 0, 1, 0));
	save("dump_end_resp",
	     bare(EMB_OP_DUMP_END | EMB_OP_RESPONSE_BIT, 0, 1, 0));
}

int main(int argc, char **argv)
{
	const uint64_t ids[4] = {1, 0x8000000000000000ull, 77, 1};
	const uint8_t found[4] = {1, 0, 1, 1};
	float rows[4 * 8 * 3];
	struct emb_wire_hello_resp hr = {0};
	struct emb_wire_table_info tabs[2];
	struct emb_wire_stats st[2];
	struct emb_wire_spec spec;
	struct emb_wire_iovs v;
	uint8_t bits[8];
	int rc, len = 0;
	size_t i;

	if (argc != 2) {
		fprintf(stderr, "usage: gen_corpus DIR\n");
		return 2;
	}
	dir = argv[1];
	for (i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		rows[i] = (float)i * 0.125f - 1.0f;
	save_cluster();
	save_dump();
	save_many();
	save_push_many();

	save("hello_req", emb_wire_hello_req_encode(buf, sizeof(buf), 1, 1,
						    "tok", 3, "fuzz/tcp"));
	save("hello_admin_req",
	     emb_wire_hello_req_encode_flags(buf, sizeof(buf), 1, 1,
					     EMB_F_ADMIN, "admin-tok", 9,
					     "embstore/tcp"));
	hr.server_version = 1;
	hr.limits = EMB_WIRE_LIMITS_DEFAULT;
	hr.server_id = 7;
	save("hello_resp",
	     emb_wire_hello_resp_encode(buf, sizeof(buf), 1, &hr));

	spec = spec_make("user_emb", 8);
	save("create_req",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	/* The same spec with a lifecycle block: admission and eviction. */
	emb_admit_parse("bloom:3:1m", &spec.life);
	emb_evict_parse("ttl:1000,min_l2:0.01,max_rows:5000:lfu", &spec.life);
	save("create_req_lifecycle",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	{
		struct emb_wire_set_lifecycle_req sl = {.table_id = 1};

		emb_admit_parse("count:2", &sl.life);
		emb_evict_parse("ttl:50", &sl.life);
		save("set_lifecycle_req",
		     emb_wire_set_lifecycle_req_encode(buf, sizeof(buf), 9,
						       &sl));
		save("set_lifecycle_resp",
		     emb_wire_ack_encode(buf, sizeof(buf),
					 EMB_OP_SET_LIFECYCLE, 9, 1, 0));
	}
	{
		struct emb_wire_pace_req pc = {
		    .p99_us = 9100, .base_us = 3200, .calls = 57};

		save("pace_req",
		     emb_wire_pace_req_encode(buf, sizeof(buf), 10, &pc));
		save("pace_resp", emb_wire_ack_encode(buf, sizeof(buf),
						      EMB_OP_PACE, 10, 0, 0));
	}
	/* A compact table: the row-format block, then the lifecycle. */
	spec.row_format = EMB_ROWFMT_INT8;
	spec.rounding = EMB_ROUND_NEAREST;
	save("create_req_rowfmt_lifecycle",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	spec.life = EMB_LIFECYCLE_CFG_DEFAULT;
	spec.row_format = EMB_ROWFMT_FP16;
	spec.rounding = EMB_ROUND_STOCHASTIC;
	save("create_req_rowfmt",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	/* A table's own tier: the tier block after the row format's. */
	spec.tier = EMB_TIER_ON;
	spec.tier_max = 64ull << 30;
	save("create_req_rowfmt_tier",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	spec.row_format = EMB_ROWFMT_FP32;
	spec.tier = EMB_TIER_OFF;
	spec.tier_max = 0;
	save("create_req_tier",
	     emb_wire_create_req_encode(buf, sizeof(buf), 2, &spec));
	spec.tier = EMB_TIER_AUTO;
	save("create_resp", emb_wire_ack_encode(buf, sizeof(buf),
						EMB_OP_CREATE_TABLE, 2, 1, 0));
	save("drop_req", emb_wire_empty_req_encode(buf, sizeof(buf),
						   EMB_OP_DROP_TABLE, 3, 1));
	save("drop_resp",
	     emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_DROP_TABLE, 3, 1, 0));
	save("list_req", emb_wire_empty_req_encode(buf, sizeof(buf),
						   EMB_OP_LIST_TABLES, 4, 0));
	tabs[0].table_id = 1;
	tabs[0].spec = spec;
	tabs[0].rows = 10;
	tabs[1].table_id = 2;
	tabs[1].spec = spec_make("item", 3);
	tabs[1].rows = 0;
	save("list_resp",
	     emb_wire_list_resp_encode(buf, sizeof(buf), 4, tabs, 2));

	save_iovs("pull_req", &v,
		  emb_wire_pull_req_encode(&v, 5, 1, 0, ids, 4));
	save_iovs("pull_req_nocreate", &v,
		  emb_wire_pull_req_encode(&v, 5, 1, EMB_F_NOCREATE, ids, 4));
	save_iovs("pull_resp_dim8", &v,
		  emb_wire_pull_resp_encode(&v, 5, 1, 0, 4, 8, NULL, rows));
	emb_wire_found_pack(found, 4, bits);
	save_iovs("pull_resp_nocreate_dim3", &v,
		  emb_wire_pull_resp_encode(&v, 5, 1, EMB_F_NOCREATE, 4, 3,
					    bits, rows));
	save_iovs("pull_req_fp32", &v,
		  emb_wire_pull_req_encode(&v, 5, 1, EMB_F_FP32, ids, 4));
	/* fp16 rows of dim 8: 4 words each */
	save_iovs("pull_resp_fp16_dim8", &v,
		  emb_wire_pull_resp_encode(&v, 5, 1, 0, 4, 4, NULL, rows));
	save_iovs("pull_req_state", &v,
		  emb_wire_pull_req_encode(&v, 5, 1, EMB_F_WITH_STATE, ids, 4));
	/* dim 3 with Adam's 2 * 3 + 1 state floats: stride 10 */
	save_iovs("pull_resp_state_dim3", &v,
		  emb_wire_pull_resp_encode(&v, 5, 1, EMB_F_WITH_STATE, 4, 10,
					    NULL, rows));
	save_iovs("pull_resp_nocreate_state_dim3", &v,
		  emb_wire_pull_resp_encode(&v, 5, 1,
					    EMB_F_NOCREATE | EMB_F_WITH_STATE,
					    4, 10, bits, rows));
	save_iovs("push_req_dim3", &v,
		  emb_wire_push_req_encode(&v, 6, 1, 1000, 2, ids, 4, 3, rows));
	save_iovs("push_req_dim8", &v,
		  emb_wire_push_req_encode(&v, 6, 1, 1000, 2, ids, 2, 8, rows));
	save_iovs("push_req_session", &v,
		  emb_wire_push_req_encode_session(&v, 6, 1, 1000, 2, 0x5e55ull,
						   3, ids, 4, 3, rows));
	/* Replicated writes carry the map epoch in the header. */
	rc = emb_wire_push_req_encode_session(&v, 6, 1, 1000, 2, 0x5e55ull, 4,
					      ids, 4, 3, rows);
	if (!rc && (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0)
		emb_wire_stamp_epoch(buf, 5, 0);
	save("push_req_epoch", rc ? rc : len);
	/* Replicated admission: the ids were rows on their primary. */
	rc = emb_wire_push_req_encode_session(&v, 6, 1, 1000, 2, 0x5e55ull, 5,
					      ids, 4, 3, rows);
	if (!rc && (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0) {
		emb_le16_store(buf + 6,
			       (uint16_t)(emb_le16_load(buf + 6) |
					  EMB_F_ADMITTED));
		emb_wire_stamp_epoch(buf, 5, 0);
	}
	save("push_req_admitted", rc ? rc : len);
	/* Eviction with replicas: each row's birth after the gradients. */
	{
		const uint32_t births[4] = {1, 2, 0, 9};
		uint16_t half[12];

		for (int k = 0; k < 12; k++)
			half[k] = (uint16_t)(0x3c00u + k);
		save_iovs("push_req_births", &v,
			  emb_wire_push_req_encode_births(
			      &v, 6, 1, 1000, 2, 0x5e55ull, 6, ids, 3, 3, 0,
			      rows, births));
		save_iovs("push_req_births_half", &v,
			  emb_wire_push_req_encode_births(
			      &v, 6, 1, 1000, 2, 0, 0, ids, 4, 3,
			      EMB_ROWFMT_BF16, half, births));
	}
	rc = emb_wire_assign_req_encode(&v, 7, 1, EMB_F_WITH_STATE, ids, 2, 10,
					rows);
	if (!rc && (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0)
		emb_wire_stamp_epoch(buf, 5, EMB_F_FILL);
	save("assign_req_fill", rc ? rc : len);
	/* A move's copy ahead: the fill flag and the warm one. */
	rc = emb_wire_assign_req_encode(&v, 7, 1, EMB_F_WITH_STATE, ids, 2, 10,
					rows);
	if (!rc && (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0)
		emb_wire_stamp_epoch(buf, 6, EMB_F_FILL | EMB_F_WARM);
	save("assign_req_warm", rc ? rc : len);
	/* A fill's rows with their lifecycle data (idle, count). */
	{
		const uint32_t meta[4] = {5, 9, 0, 1};

		rc = emb_wire_assign_req_encode_meta(&v, 7, 1,
						     EMB_F_WITH_STATE, ids, 2,
						     10, rows, meta);
		if (!rc &&
		    (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0)
			emb_wire_stamp_epoch(buf, 6, EMB_F_FILL);
		save("assign_req_fill_meta", rc ? rc : len);
	}
	/* And with their births (a table that numbers its rows). */
	{
		const uint32_t meta[6] = {5, 9, 0, 1, 2, 3};
		const uint32_t births[3] = {4, 1, 77};

		rc = emb_wire_assign_req_encode_births(
		    &v, 7, 1, EMB_F_WITH_STATE, ids, 3, 10, rows, meta,
		    births);
		if (!rc &&
		    (len = emb_wire_iovs_flatten(&v, buf, sizeof(buf))) > 0)
			emb_wire_stamp_epoch(buf, 6, EMB_F_FILL);
		save("assign_req_fill_births", rc ? rc : len);
	}
	save("push_resp",
	     emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_PUSH, 6, 1, 0));
	save_iovs("assign_req_dim3", &v,
		  emb_wire_assign_req_encode(&v, 7, 1, 0, ids, 4, 3, rows));
	/* dim 3 with Adam's 2 * 3 + 1 state floats */
	save_iovs("assign_req_state_dim3", &v,
		  emb_wire_assign_req_encode(&v, 7, 1, EMB_F_WITH_STATE, ids, 2,
					     10, rows));
	save("assign_resp",
	     emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_ASSIGN, 7, 1, 0));
	save_iovs("erase_req", &v, emb_wire_erase_req_encode(&v, 8, 1, ids, 3));
	save("erase_resp",
	     emb_wire_ack_encode(buf, sizeof(buf), EMB_OP_ERASE, 8, 1, 2));
	save("list_births_req",
	     emb_wire_list_births_req_encode(buf, sizeof(buf), 8, 1, 100, 3));
	{
		const uint32_t marks[3] = {5, 0, 9};
		const uint64_t lids[2] = {11, 12};
		const uint32_t lbirths[2] = {5, 9};
		const struct emb_wire_list_births lb = {
		    .n = 3, .m = 2, .marks = marks, .ids = lids,
		    .births = lbirths};

		save("list_births_resp",
		     emb_wire_list_births_resp_encode(buf, sizeof(buf), 8, 1,
						      &lb));
	}
	save_iovs("births_req", &v,
		  emb_wire_births_req_encode(&v, 8, 1, ids, 3));
	/* The ask before a push (EMB_F_MAKE) and before an assign (with
	 * EMB_F_ADMITTED) to a replicated table with eviction. */
	if (emb_wire_births_req_encode(&v, 8, 1, ids, 3) == 0) {
		emb_le16_store(v.head + 6, EMB_F_MAKE);
		save_iovs("births_req_make", &v, 0);
		emb_le16_store(v.head + 6, EMB_F_MAKE | EMB_F_ADMITTED);
		save_iovs("births_req_make_all", &v, 0);
	}
	{
		const uint32_t births[3] = {1, EMB_WIRE_BIRTH_NONE, 7};

		save("births_resp",
		     emb_wire_births_resp_encode(buf, sizeof(buf), 8, 1,
						 births, 3));
	}
	save_iovs("locate_req", &v,
		  emb_wire_locate_req_encode(&v, 8, 1, ids, 3));
	{
		struct emb_wire_locate_resp lr = {.seed = 0x5eed,
						  .rec_bytes = 48,
						  .row_floats = 6,
						  .n = 3};
		uint8_t ent[3 * EMB_WIRE_LOCATE_ENTRY_SIZE];

		for (uint32_t e = 0; e < 3; e++)
			emb_wire_locate_entry_put(ent, e,
						  e ? 0x7f0000001000ull * e : 0,
						  0x1234 + e);
		lr.entries = ent;
		save("locate_resp",
		     emb_wire_locate_resp_encode(buf, sizeof(buf), 8, 1, &lr));
	}
	save("stats_req",
	     emb_wire_empty_req_encode(buf, sizeof(buf), EMB_OP_STATS, 9, 0));
	memset(st, 0, sizeof(st));
	st[0].table_id = 1;
	st[0].rows = 10;
	st[0].step = 3;
	st[1].table_id = 2;
	save("stats_resp",
	     emb_wire_stats_resp_encode(buf, sizeof(buf), 9, 0, st, 2));
	save_iovs("ping_req", &v,
		  emb_wire_ping_encode(&v, 10, false, "12345678", 8));
	save_iovs("ping_resp", &v,
		  emb_wire_ping_encode(&v, 10, true, "12345678", 8));
	save("error_resp",
	     emb_wire_error_encode(buf, sizeof(buf), EMB_OP_PULL, 11, 1,
				   EMB_ENOTABLE, "no table 1"));
	return failed;
}
