/*
 * tests/proto/test_wire_cluster.c - the cluster messages' codecs: every
 * message round-trips, and the decoders refuse what breaks a layout
 * (lengths, roles, reserved fields, hosts, slot ranks) without reading
 * past the frame. Single-threaded.
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "proto/wire_cluster.h"
#include "proto/wire_msg.h"
#include "harness.h"

static _Alignas(8) uint8_t buf[1u << 21];
static const struct emb_wire_limits lim = {
    .max_frame_bytes = 1u << 30,
    .max_ids = 1u << 20,
    .max_tables = 1024,
    .max_dim = EMB_WIRE_DIM_MAX,
};

/* Decodes buf[0..len) as a frame; fails the case if the header is bad. */
static struct emb_wire_frame frame(int len)
{
	struct emb_wire_frame f;

	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			      0);
	return f;
}

/* Sets the payload length to plen (bytes beyond stay as they are). */
static void set_plen(uint32_t plen)
{
	emb_le32_store(buf + 24, plen);
}

static void test_register(void)
{
	struct emb_wire_register_req rq;
	struct emb_wire_register_resp rr, in = {
					      .role = EMB_ROLE_SERVER,
					      .rank = 1,
					      .node_id = 2,
					      .server_num = 2,
					      .worker_num = 3,
					      .hb_timeout_ms = 1000,
					      .cluster_id = 99,
					  };
	struct emb_wire_frame f;
	int len;

	len = emb_wire_register_req_encode(buf, sizeof(buf), 7, EMB_ROLE_SERVER,
					   7164, 42, "10.0.0.2");
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), 0);
	CU_ASSERT_EQUAL(rq.role, EMB_ROLE_SERVER);
	CU_ASSERT_EQUAL(rq.port, 7164);
	CU_ASSERT_EQUAL(rq.pid, 42);
	CU_ASSERT_EQUAL(rq.host_len, 8);
	CU_ASSERT_EQUAL(memcmp(rq.host, "10.0.0.2", 8), 0);
	/* A host_len that runs past the payload. */
	emb_le16_store(buf + 32 + 6, 9);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	emb_le16_store(buf + 32 + 6, 8);
	/* Reserved, role and host bytes. */
	buf[32 + 12] = 1;
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	buf[32 + 12] = 0;
	emb_le32_store(buf + 32, EMB_ROLE_SCHEDULER);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	emb_le32_store(buf + 32, EMB_ROLE_SERVER);
	buf[32 + 16] = ' ';
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	/* Encoders refuse what decoders would. */
	CU_ASSERT_EQUAL(
	    emb_wire_register_req_encode(buf, sizeof(buf), 1, 9, 0, 0, NULL),
	    EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_register_req_encode(
			    buf, sizeof(buf), 1, EMB_ROLE_WORKER, 0, 0, "a b"),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_register_req_encode(
			    buf, 40, 1, EMB_ROLE_WORKER, 0, 0, "host"),
			-ENOSPC);

	len = emb_wire_register_resp_encode(buf, sizeof(buf), 7, &in);
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_register_resp_decode(&f, &rr), 0);
	CU_ASSERT_EQUAL(memcmp(&rr, &in, sizeof(rr)), 0);
	/* A rank outside its role's count. */
	emb_le32_store(buf + 32 + 4, 2);
	CU_ASSERT_EQUAL(emb_wire_register_resp_decode(&f, &rr), EMB_EBADFRAME);
	in.hb_timeout_ms = 0;
	CU_ASSERT_EQUAL(emb_wire_register_resp_encode(buf, sizeof(buf), 7, &in),
			EMB_EBADARG);
}

static void test_map(void)
{
	static uint16_t slots[EMB_NSLOTS];
	struct emb_wire_node_addr addrs[3] = {
	    {"10.0.0.1", 1, false},
	    {"server-b", 2, false},
	    {"fe80::1", 65535, false}};
	struct emb_wire_node_addr a;
	struct emb_wire_cluster_map m;
	struct emb_wire_frame f;
	int len;

	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		slots[i] = (uint16_t)(i % 3);
	len = emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 0, slots,
					  addrs, 3, NULL, 0);
	CU_ASSERT_EQUAL(len, (int)emb_wire_cluster_map_bytes(3));
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), 0);
	CU_ASSERT_EQUAL(m.nservers, 3);
	CU_ASSERT_EQUAL(m.nworkers, 5);
	CU_ASSERT_EQUAL(m.replicas, 1);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		CU_ASSERT_EQUAL(emb_wire_cluster_map_slot(&m, i), i % 3);
	for (uint32_t i = 0; i < 3; i++) {
		emb_wire_cluster_map_server(&m, i, &a);
		CU_ASSERT_STRING_EQUAL(a.host, addrs[i].host);
		CU_ASSERT_EQUAL(a.port, addrs[i].port);
	}
	/* A slot naming a server that is not there. */
	emb_le16_store(buf + 32 + 8 + 2 * 100, 3);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	emb_le16_store(buf + 32 + 8 + 2 * 100, 1);
	/* Garbage in an entry's padding. */
	buf[32 + EMB_WIRE_MAP_PREFIX_SIZE + 8 + 200] = 'x';
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	buf[32 + EMB_WIRE_MAP_PREFIX_SIZE + 8 + 200] = 0;
	/* A count the payload does not hold. */
	f.hdr.count = 4;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	/* Encoders: a rank out of range, no servers, port 0. */
	slots[7] = 3;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 0,
						    slots, addrs, 3, NULL, 0),
			EMB_EBADARG);
	slots[7] = 0;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 0,
						    slots, addrs, 0, NULL, 0),
			EMB_EBADARG);
	addrs[1].port = 0;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 0,
						    slots, addrs, 3, NULL, 0),
			EMB_EBADARG);
	addrs[1].port = 2;
	CU_ASSERT_EQUAL(
	    emb_wire_cluster_map_encode(buf, 1000, 3, 5, 0, slots, addrs, 3, NULL, 0),
	    -ENOSPC);
}

/* Replicas and removed servers: what failover changes in the map. */
static void test_map_replicas(void)
{
	static uint16_t slots[EMB_NSLOTS];
	static const uint8_t tail[40] = {'E', 'M', 'B', 'M'};
	struct emb_wire_node_addr addrs[3] = {
	    {"10.0.0.1", 1, false}, {"10.0.0.2", 2, true}, {"10.0.0.3", 3, false}};
	struct emb_wire_node_addr a;
	struct emb_wire_cluster_map m;
	struct emb_wire_frame f;
	int len;

	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		slots[i] = (uint16_t)(i % 2 ? 2 : 0);
	len = emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 2, slots,
					  addrs, 3, tail, sizeof(tail));
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), 0);
	CU_ASSERT_EQUAL(m.replicas, 2);
	/* The replicated map rides after the entries, as it was given. */
	CU_ASSERT_EQUAL(m.cmap_len, sizeof(tail));
	CU_ASSERT_EQUAL(memcmp(m.cmap, tail, sizeof(tail)), 0);
	for (uint32_t i = 0; i < 3; i++) {
		emb_wire_cluster_map_server(&m, i, &a);
		CU_ASSERT_EQUAL(a.removed, i == 1);
	}
	/* A slot whose primary is a removed server. */
	emb_le16_store(buf + 32 + 8 + 2 * 9, 1);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	emb_le16_store(buf + 32 + 8 + 2 * 9, 2);
	/* 1 with the map's tail: one copy, moved slots (a job servers may
	 * join); not more copies than servers, nor a flag that means
	 * nothing. */
	emb_le32_store(buf + 32 + 4, 1);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), 0);
	CU_ASSERT_EQUAL(m.replicas, 1);
	CU_ASSERT_PTR_NOT_NULL(m.cmap);
	emb_le32_store(buf + 32 + 4, 4);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 4, 0); /* a tail without replicas */
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 4, 2);
	buf[32 + EMB_WIRE_MAP_PREFIX_SIZE + 4] = 2;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	buf[32 + EMB_WIRE_MAP_PREFIX_SIZE + 4] = 0;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), 0);
	/* Replicas without their map's tail. */
	f.hdr.payload_len -= sizeof(tail);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_decode(&f, &m), EMB_EBADFRAME);
	f.hdr.payload_len += sizeof(tail);
	/* Encoders: replicas over the servers or the maximum, a slot on a
	 * removed server, replicas without a tail; replicas 1 is written
	 * as 0 without a tail, as 1 with one. */
	f = frame(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 0, slots,
					      addrs, 3, tail, sizeof(tail)));
	CU_ASSERT_EQUAL(emb_le32_load(buf + 32 + 4), 1);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 2,
						    slots, addrs, 3, NULL, 0),
			EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 4,
						    slots, addrs, 3, tail, sizeof(tail)),
			EMB_EBADARG);
	slots[5] = 1;
	CU_ASSERT_EQUAL(emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 2,
						    slots, addrs, 3, tail, sizeof(tail)),
			EMB_EBADARG);
	slots[5] = 0;
	addrs[1].removed = false;
	len = emb_wire_cluster_map_encode(buf, sizeof(buf), 3, 5, 1, slots,
					  addrs, 3, NULL, 0);
	CU_ASSERT_EQUAL(emb_le32_load(buf + 32 + 4), 0);
}

static void test_heartbeat(void)
{
	struct emb_wire_node_ref dead[2] = {{EMB_ROLE_WORKER, 3},
					    {EMB_ROLE_SERVER, 0}};
	struct emb_wire_node_ref d;
	struct emb_wire_heartbeat_resp r;
	struct emb_wire_frame f;
	uint64_t seq;
	uint32_t id;
	int len;

	f = frame(emb_wire_heartbeat_req_encode(buf, sizeof(buf), 1, 5, 77));
	CU_ASSERT_EQUAL(emb_wire_heartbeat_req_decode(&f, &id, &seq), 0);
	CU_ASSERT_EQUAL(id, 5);
	CU_ASSERT_EQUAL(seq, 77);
	/* Not the message asked for. */
	CU_ASSERT_EQUAL(
	    emb_wire_barrier_req_decode(&f, &(struct emb_wire_barrier_req){0}),
	    EMB_EBADARG);

	len = emb_wire_heartbeat_resp_encode(buf, sizeof(buf), 1,
					     EMB_CLUSTER_READY, 7, dead, 2);
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), 0);
	CU_ASSERT_EQUAL(r.state, EMB_CLUSTER_READY);
	CU_ASSERT_EQUAL(r.map_epoch, 7);
	CU_ASSERT_EQUAL(r.ndead, 2);
	emb_wire_heartbeat_dead(&r, 1, &d);
	CU_ASSERT_EQUAL(d.role, EMB_ROLE_SERVER);
	CU_ASSERT_EQUAL(d.rank, 0);
	/* Unknown state; a dead entry without a role. */
	emb_le32_store(buf + 32, 9);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), EMB_EBADFRAME);
	emb_le32_store(buf + 32, EMB_CLUSTER_READY);
	emb_le32_store(buf + 32 + 8, 0);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), EMB_EBADFRAME);
	/* A replaced server's entry travels with its flag; a worker's or a
	 * role's unknown bit does not. */
	emb_le32_store(buf + 32 + 8, EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), 0);
	emb_wire_heartbeat_dead(&r, 0, &d);
	CU_ASSERT_EQUAL(d.role, EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED);
	emb_le32_store(buf + 32 + 8, EMB_ROLE_WORKER | EMB_WIRE_ROLE_REPLACED);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 8, EMB_ROLE_SERVER | 0x100);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), EMB_EBADFRAME);
	dead[0].role = EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED;
	CU_ASSERT(emb_wire_heartbeat_resp_encode(buf, sizeof(buf), 1,
						 EMB_CLUSTER_READY, 7, dead,
						 2) > 0);
	dead[0].role = EMB_ROLE_WORKER | EMB_WIRE_ROLE_REPLACED;
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_encode(buf, sizeof(buf), 1,
						       EMB_CLUSTER_READY, 7,
						       dead, 2),
			EMB_EBADARG);
	/* An error response is ESERVER, its payload read by error_decode. */
	len = emb_wire_error_encode(buf, sizeof(buf), EMB_OP_HEARTBEAT, 1, 0,
				    EMB_ENODEAD, "declared dead");
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_heartbeat_resp_decode(&f, &r), EMB_ESERVER);
}

static void test_fill_done(void)
{
	struct emb_wire_fill_done_req in = {4, EMB_EMOVING, 4000, 96, 9,
					    12345, 3950760},
				      out;
	struct emb_wire_frame f;

	f = frame(emb_wire_fill_done_req_encode(buf, sizeof(buf), 3, &in));
	CU_ASSERT_EQUAL(f.hdr.payload_len, EMB_WIRE_FILL_DONE_REQ_SIZE);
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(memcmp(&in, &out, sizeof(in)), 0);
	/* From a server older than rows and bytes: 24 bytes, read as 0. */
	f.hdr.payload_len = EMB_WIRE_FILL_DONE_REQ_SIZE_V1;
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_decode(&f, &out), 0);
	CU_ASSERT_EQUAL(out.epoch, 9);
	CU_ASSERT_EQUAL(out.rows, 0);
	CU_ASSERT_EQUAL(out.bytes, 0);
	f.hdr.payload_len = EMB_WIRE_FILL_DONE_REQ_SIZE - 8;
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_decode(&f, &out), EMB_EBADFRAME);
	f.hdr.payload_len = EMB_WIRE_FILL_DONE_REQ_SIZE;
	/* A chunk past the last slot, epoch 0, a positive status. */
	emb_le32_store(buf + 32 + 12, 97);
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_decode(&f, &out), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 12, 96);
	emb_le64_store(buf + 32 + 16, 0);
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_decode(&f, &out), EMB_EBADFRAME);
	in.status = 1;
	CU_ASSERT_EQUAL(emb_wire_fill_done_req_encode(buf, sizeof(buf), 3, &in),
			EMB_EBADARG);
	f = frame(emb_wire_cluster_ack_encode(buf, sizeof(buf),
					      EMB_OP_FILL_DONE, 3, 0));
	CU_ASSERT_EQUAL(emb_wire_cluster_ack_decode(&f, EMB_OP_FILL_DONE, NULL),
			0);
}

static void test_drain(void)
{
	struct emb_wire_frame f;
	uint32_t rank = 0;

	f = frame(emb_wire_drain_req_encode(buf, sizeof(buf), 4, 3));
	CU_ASSERT_EQUAL(f.hdr.opcode, EMB_OP_DRAIN);
	CU_ASSERT_EQUAL(emb_wire_drain_req_decode(&f, &rank), 0);
	CU_ASSERT_EQUAL(rank, 3);
	/* Flags are reserved; a rank past the largest cluster is refused. */
	emb_le32_store(buf + 32 + 4, 1);
	CU_ASSERT_EQUAL(emb_wire_drain_req_decode(&f, &rank), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 4, 0);
	emb_le32_store(buf + 32, EMB_WIRE_SERVERS_MAX);
	CU_ASSERT_EQUAL(emb_wire_drain_req_decode(&f, &rank), EMB_EBADFRAME);
	CU_ASSERT_EQUAL(emb_wire_drain_req_encode(buf, sizeof(buf), 4,
						  EMB_WIRE_SERVERS_MAX),
			EMB_EBADARG);
	f = frame(emb_wire_cluster_ack_encode(buf, sizeof(buf), EMB_OP_DRAIN,
					      4, 0));
	CU_ASSERT_EQUAL(emb_wire_cluster_ack_decode(&f, EMB_OP_DRAIN, NULL), 0);
}

static void test_moves(void)
{
	struct emb_wire_moves m = {.kind = EMB_WIRE_MOVE_DRAIN, .rank = 2,
				   .phase = 1, .first = 3840, .n = 256,
				   .from = 2, .to = 0, .moved = 512,
				   .left = 1218, .queued = 1,
				   .elapsed_ms = 1800, .eta_ms = 4281,
				   .rows = 880000, .bytes = 232320000};
	struct emb_wire_moves back;
	struct emb_wire_frame f;

	f = frame(emb_wire_moves_req_encode(buf, sizeof(buf), 6));
	CU_ASSERT_EQUAL(f.hdr.opcode, EMB_OP_MOVES);
	CU_ASSERT_EQUAL(emb_wire_moves_req_decode(&f), 0);
	f = frame(emb_wire_moves_resp_encode(buf, sizeof(buf), 6, &m));
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), 0);
	CU_ASSERT_EQUAL(memcmp(&m, &back, sizeof(m)), 0);
	/* From a scheduler older than rows and bytes: 56 bytes. */
	f.hdr.payload_len = EMB_WIRE_MOVES_RESP_SIZE_V1;
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), 0);
	CU_ASSERT_EQUAL(back.eta_ms, 4281);
	CU_ASSERT_EQUAL(back.rows, 0);
	CU_ASSERT_EQUAL(back.bytes, 0);
	f.hdr.payload_len = EMB_WIRE_MOVES_RESP_SIZE + 8;
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), EMB_EBADFRAME);
	f.hdr.payload_len = EMB_WIRE_MOVES_RESP_SIZE;
	/* A chunk past the last slot, a kind or phase unknown, an eta
	 * below -1, a chunk without a phase: refused both ways. */
	emb_le32_store(buf + 32 + 16, 257);
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 16, 256);
	emb_le32_store(buf + 32, 4);
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), EMB_EBADFRAME);
	emb_le32_store(buf + 32, EMB_WIRE_MOVE_DRAIN);
	emb_le64_store(buf + 32 + 48, (uint64_t)-2);
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), EMB_EBADFRAME);
	m.eta_ms = -2;
	CU_ASSERT_EQUAL(emb_wire_moves_resp_encode(buf, sizeof(buf), 6, &m),
			EMB_EBADARG);
	m.eta_ms = -1;
	m.phase = 0;
	CU_ASSERT_EQUAL(emb_wire_moves_resp_encode(buf, sizeof(buf), 6, &m),
			EMB_EBADARG);
	m.n = m.first = 0;
	f = frame(emb_wire_moves_resp_encode(buf, sizeof(buf), 6, &m));
	CU_ASSERT_EQUAL(emb_wire_moves_resp_decode(&f, &back), 0);
	CU_ASSERT_EQUAL(back.eta_ms, -1);
	/* The request carries nothing. */
	f = frame(emb_wire_moves_req_encode(buf, sizeof(buf), 6));
	f.hdr.count = 1;
	CU_ASSERT_EQUAL(emb_wire_moves_req_decode(&f), EMB_EBADFRAME);
}

static void test_barrier_finish(void)
{
	struct emb_wire_barrier_req b;
	struct emb_wire_frame f;
	char name[80];
	uint32_t id, count, newer;

	f = frame(emb_wire_barrier_req_encode(buf, sizeof(buf), 1, 9, "step"));
	CU_ASSERT_EQUAL(emb_wire_barrier_req_decode(&f, &b), 0);
	CU_ASSERT_EQUAL(b.node_id, 9);
	CU_ASSERT_EQUAL(b.name_len, 4);
	CU_ASSERT_EQUAL(memcmp(b.name, "step", 4), 0);
	buf[32 + 8 + 1] = '\0';
	CU_ASSERT_EQUAL(emb_wire_barrier_req_decode(&f, &b), EMB_EBADFRAME);
	memset(name, 'n', sizeof(name));
	name[64] = '\0';
	CU_ASSERT_EQUAL(
	    emb_wire_barrier_req_encode(buf, sizeof(buf), 1, 9, name),
	    EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_barrier_req_encode(buf, sizeof(buf), 1, 9, ""),
			EMB_EBADARG);

	f = frame(emb_wire_cluster_ack_encode(buf, sizeof(buf), EMB_OP_BARRIER,
					      1, 4));
	CU_ASSERT_EQUAL(emb_wire_cluster_ack_decode(&f, EMB_OP_BARRIER, &count),
			0);
	CU_ASSERT_EQUAL(count, 4);
	CU_ASSERT_EQUAL(emb_wire_cluster_ack_decode(&f, EMB_OP_FINISH, &count),
			EMB_EBADARG);

	/* A map watch: the epoch held, which the plain decoder refuses. */
	f = frame(emb_wire_map_req_encode(buf, sizeof(buf), 1, 12, 41));
	CU_ASSERT_EQUAL(emb_wire_map_req_decode(&f, &id, &newer), 0);
	CU_ASSERT_EQUAL(id, 12);
	CU_ASSERT_EQUAL(newer, 41);
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_CLUSTER_MAP, &id),
			EMB_EBADFRAME);
	f = frame(emb_wire_map_req_encode(buf, sizeof(buf), 1, 12, 0));
	CU_ASSERT_EQUAL(emb_wire_map_req_decode(&f, &id, &newer), 0);
	CU_ASSERT_EQUAL(newer, 0);
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_CLUSTER_MAP, &id),
			0);
	f.hdr.flags = 1;
	CU_ASSERT_EQUAL(emb_wire_map_req_decode(&f, &id, &newer),
			EMB_EBADFRAME);
	f = frame(
	    emb_wire_node_req_encode(buf, sizeof(buf), EMB_OP_FINISH, 1, 12));
	CU_ASSERT_EQUAL(emb_wire_map_req_decode(&f, &id, &newer), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_FINISH, &id), 0);
	CU_ASSERT_EQUAL(id, 12);
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_CLUSTER_MAP, &id),
			EMB_EBADARG);
	{
		bool hold = true;

		CU_ASSERT_EQUAL(emb_wire_finish_req_decode(&f, &id, &hold), 0);
		CU_ASSERT_FALSE(hold);
		/* A FINISH hold: the plain decoder refuses it, as a
		 * scheduler older than holds does. */
		f = frame(emb_wire_finish_req_encode(buf, sizeof(buf), 3, 12,
						     true));
		CU_ASSERT_EQUAL(emb_wire_finish_req_decode(&f, &id, &hold), 0);
		CU_ASSERT_EQUAL(id, 12);
		CU_ASSERT_TRUE(hold);
		CU_ASSERT_EQUAL(
		    emb_wire_node_req_decode(&f, EMB_OP_FINISH, &id),
		    EMB_EBADFRAME);
		CU_ASSERT_EQUAL(emb_wire_map_req_decode(&f, &id, &newer),
				EMB_EBADARG);
		/* Only 0 and 1 mean anything. */
		emb_le32_store(buf + EMB_WIRE_HDR_SIZE + 4, 2);
		CU_ASSERT_EQUAL(emb_wire_finish_req_decode(&f, &id, &hold),
				EMB_EBADFRAME);
		f = frame(emb_wire_finish_req_encode(buf, sizeof(buf), 3, 12,
						     false));
		CU_ASSERT_EQUAL(
		    emb_wire_node_req_decode(&f, EMB_OP_FINISH, &id), 0);
		f.hdr.flags = 1;
		CU_ASSERT_EQUAL(emb_wire_finish_req_decode(&f, &id, &hold),
				EMB_EBADFRAME);
		f.hdr.flags = 0;
	}
	/* Flags or a table id on a cluster request. */
	f.hdr.flags = 1;
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_FINISH, &id),
			EMB_EBADFRAME);
	f.hdr.flags = 0;
	f.hdr.table_id = 1;
	CU_ASSERT_EQUAL(emb_wire_node_req_decode(&f, EMB_OP_FINISH, &id),
			EMB_EBADFRAME);
	CU_ASSERT_EQUAL(
	    emb_wire_node_req_encode(buf, sizeof(buf), EMB_OP_BARRIER, 1, 1),
	    EMB_EBADARG);
}

static void test_truncated(void)
{
	struct emb_wire_register_req rq;
	struct emb_wire_frame f;
	int len;

	/* Every shorter payload_len is refused, never read past. */
	len = emb_wire_register_req_encode(buf, sizeof(buf), 1, EMB_ROLE_WORKER,
					   0, 1, "worker-host");
	for (int plen = 0; plen < len - 32; plen++) {
		set_plen((uint32_t)plen);
		f = frame(32 + plen);
		CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq),
				EMB_EBADFRAME);
	}
	CU_ASSERT_STRING_EQUAL(emb_role_name(EMB_ROLE_WORKER), "worker");
	CU_ASSERT_STRING_EQUAL(emb_role_name(77), "?");
}

/* A rejoin: the REGISTER flag and its tail; what a join is not. */
static void test_rejoin(void)
{
	struct emb_wire_register_req rq, in = {
					     .role = EMB_ROLE_SERVER,
					     .port = 7164,
					     .pid = 42,
					     .host = "10.0.0.2",
					     .host_len = 8,
					     .rank = 2,
					     .cluster_id = 0x1234567890abcdefull,
					     .map_epoch = 17,
					 };
	struct emb_wire_frame f;
	int len;

	len = emb_wire_rejoin_req_encode(buf, sizeof(buf), 7, &in);
	CU_ASSERT_EQUAL_FATAL(len, 32 + 16 + 8 + 24);
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), 0);
	CU_ASSERT(rq.rejoin);
	CU_ASSERT_EQUAL(rq.role, EMB_ROLE_SERVER);
	CU_ASSERT_EQUAL(rq.port, 7164);
	CU_ASSERT_EQUAL(rq.host_len, 8);
	CU_ASSERT_EQUAL(memcmp(rq.host, "10.0.0.2", 8), 0);
	CU_ASSERT_EQUAL(rq.rank, 2);
	CU_ASSERT_EQUAL(rq.cluster_id, 0x1234567890abcdefull);
	CU_ASSERT_EQUAL(rq.map_epoch, 17);
	/* Reserved, cluster id 0, a rank past the role's maximum. */
	buf[32 + 16 + 8 + 4] = 1;
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	buf[32 + 16 + 8 + 4] = 0;
	memset(buf + 32 + 16 + 8 + 8, 0, 8);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	emb_le64_store(buf + 32 + 16 + 8 + 8, 5);
	emb_le32_store(buf + 32 + 16 + 8, EMB_WIRE_SERVERS_MAX);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	emb_le32_store(buf + 32 + 16 + 8, 2);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), 0);
	/* Flags this version does not know. */
	emb_le32_store(buf + 32 + 12, 3);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), EMB_EBADFRAME);
	/* A plain join decodes with rejoin false. */
	len = emb_wire_register_req_encode(buf, sizeof(buf), 7,
					   EMB_ROLE_WORKER, 0, 1, NULL);
	f = frame(len);
	CU_ASSERT_EQUAL(emb_wire_register_req_decode(&f, &rq), 0);
	CU_ASSERT(!rq.rejoin);
	/* The encoder refuses what the decoder would. */
	in.cluster_id = 0;
	CU_ASSERT_EQUAL(emb_wire_rejoin_req_encode(buf, sizeof(buf), 1, &in),
			EMB_EBADARG);
	in.cluster_id = 1;
	in.rank = EMB_WIRE_SERVERS_MAX;
	CU_ASSERT_EQUAL(emb_wire_rejoin_req_encode(buf, sizeof(buf), 1, &in),
			EMB_EBADARG);
	in.rank = 0;
	CU_ASSERT_EQUAL(emb_wire_rejoin_req_encode(buf, 60, 1, &in), -ENOSPC);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"register round-trips and refuses bad fields", test_register},
	    {"a rejoin carries rank, cluster id and map epoch",
	     test_rejoin},
	    {"cluster map round-trips and refuses bad ranks", test_map},
	    {"cluster map carries replicas and removed servers",
	     test_map_replicas},
	    {"heartbeat carries state and dead nodes", test_heartbeat},
	    {"barrier and finish round-trip", test_barrier_finish},
	    {"fill done round-trips and refuses bad chunks", test_fill_done},
	    {"drain round-trips and refuses reserved flags", test_drain},
	    {"moves round-trip and refuse what no scheduler moves", test_moves},
	    {"truncated payloads are refused", test_truncated},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "wire_cluster", cases);
}
