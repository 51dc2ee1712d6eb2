/*
 * tests/server/test_fence.c - a replicated server's checks of writes
 * against its view of the cluster map (src/server/slots.c; the rules are
 * docs/replication.md's "Recovery"): a push to a fenced slot is refused
 * with EMB_EMOVING and not applied, and the same push (same session and
 * sequence number) sent again once the fence is lifted is applied exactly
 * once; a push routed by a map older than the slot's last writer change is
 * refused with EMB_ESTALEMAP; one routed by a newer map than the server's
 * waits (EMB_EMOVING) and asks the host for the map; fill rows land only
 * in slots the server is being filled with; a push applied, then sent
 * again once its slot is fenced or gone, is acknowledged as a duplicate.
 * Through a raw connection to an in-process server; values are read back
 * with a plain client.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_msg.h"

#define DIM 4u

static struct emb_server *srv;
static struct emb_client *cli;
static struct emb_client_table *tab;
static uint32_t tid;
static int fd = -1;
static uint64_t hinted; /* the hook's last epoch */

static void on_newer(void *arg, uint64_t epoch)
{
	(void)arg;
	__atomic_store_n(&hinted, epoch, __ATOMIC_RELAXED);
}

static void setup(void)
{
	struct emb_server_opts o = nt_server_opts();
	struct emb_table_spec sp = nt_spec("fenced", DIM, 7);
	char addr[64];
	uint16_t port;

	if (srv)
		return;
	o.threads = 1;
	srv = nt_server_start(&o);
	port = emb_server_port(srv);
	emb_server_on_newer_map(srv, on_newer, NULL);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	cli = nt_client(addr, 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &tab), 0);
	fd = nt_raw_connect(port);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	/* One server: the client's id is the server's. */
	{
		struct emb_server_table st;
		uint32_t ids[4];

		CU_ASSERT_EQUAL_FATAL(emb_server_table_ids(srv, ids, 4), 1);
		CU_ASSERT_EQUAL_FATAL(emb_server_table_acquire(srv, ids[0], &st),
				      0);
		tid = st.id;
		emb_server_table_release(&st);
	}
}

/* Sends a frame from v stamped with epoch (0: none) and extra flags;
 * returns the response status. */
static int send_frame(struct emb_wire_iovs *v, uint64_t epoch, uint16_t extra)
{
	static _Alignas(8) uint8_t buf[1u << 16];
	uint8_t resp[512];
	struct emb_frame_hdr h;
	int len = emb_wire_iovs_flatten(v, buf, sizeof(buf));

	CU_ASSERT_FATAL(len > 0);
	if (epoch)
		emb_wire_stamp_epoch(buf, epoch, extra);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &h, resp, sizeof(resp)), 0);
	return h.status;
}

/* A push of gradient 1 to id with session 42 and seq, map epoch e. */
static int push(uint64_t id, uint64_t seq, uint64_t e)
{
	const float g[DIM] = {1, 1, 1, 1};
	struct emb_wire_iovs v;

	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_session(
				  &v, seq, tid, 0, 0, 42, seq, &id, 1, DIM, g),
			      0);
	return send_frame(&v, e, 0);
}

static float value(uint64_t id)
{
	float row[DIM];

	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(tab, &id, 1, row, 0, NULL),
			      0);
	return row[0];
}

/* A view at epoch e: every slot held, grew at 1; slot s gets flags f. */
static void view(uint64_t e, uint32_t s, uint8_t f, uint32_t grew)
{
	static struct emb_server_map m;

	m.epoch = e;
	for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
		m.slot[i] = EMB_CMAP_VIEW_MINE;
		m.grew[i] = 1;
	}
	m.slot[s] = f;
	m.grew[s] = grew;
	CU_ASSERT_EQUAL_FATAL(emb_server_set_map(srv, &m), 0);
}

static void test_fence(void)
{
	const uint64_t id = 1001;
	const uint32_t s = emb_id_slot(id);
	uint64_t counts[2], other;
	float v0, v1;

	setup();
	v0 = value(id);
	/* A replicated write before the server has any map: not yet. */
	CU_ASSERT_EQUAL(push(id, 1, 3), EMB_EMOVING);
	CU_ASSERT_EQUAL(value(id), v0);
	/* Fenced: refused, nothing applied, the sequence number not taken. */
	view(3, s, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FENCED, 3);
	CU_ASSERT_EQUAL(push(id, 1, 3), EMB_EMOVING);
	CU_ASSERT_EQUAL(value(id), v0);
	/* A write without an epoch (no map behind it) waits as well. */
	CU_ASSERT_EQUAL(push(id, 2, 0), EMB_EMOVING);
	/* The fence lifted: the same push is applied, once. */
	view(4, s, EMB_CMAP_VIEW_MINE, 3);
	CU_ASSERT_EQUAL(push(id, 1, 3), 0);
	v1 = value(id);
	CU_ASSERT(v1 < v0);
	CU_ASSERT_EQUAL(push(id, 1, 3), 0);
	CU_ASSERT_EQUAL(value(id), v1);
	/* Other slots were never fenced. */
	other = 7;
	while (emb_id_slot(other) == s)
		other++;
	CU_ASSERT_EQUAL(push(other, 3, 3), 0);
	emb_server_map_counts(srv, counts);
	CU_ASSERT(counts[0] >= 3);
}

static void test_stale(void)
{
	const uint64_t id = 2002;
	const uint32_t s = emb_id_slot(id);
	float v0;

	setup();
	v0 = value(id);
	/* The slot's writers grew at epoch 6: a push routed by 5 missed
	 * one of them. */
	view(7, s, EMB_CMAP_VIEW_MINE, 6);
	CU_ASSERT_EQUAL(push(id, 10, 5), EMB_ESTALEMAP);
	CU_ASSERT_EQUAL(value(id), v0);
	CU_ASSERT_EQUAL(push(id, 10, 6), 0);
	CU_ASSERT(value(id) < v0);
	/* A slot this server holds no copy of, by a map it knows. */
	view(8, s, 0, 6);
	CU_ASSERT_EQUAL(push(id, 11, 8), EMB_ESTALEMAP);
	/* Routed by a map the server has not seen: it waits, and the host
	 * is asked to fetch the map. */
	CU_ASSERT_EQUAL(push(id, 12, 9), EMB_EMOVING);
	CU_ASSERT_EQUAL(__atomic_load_n(&hinted, __ATOMIC_RELAXED), 9);
	/* An older view than the one held changes nothing. */
	view(2, s, EMB_CMAP_VIEW_MINE, 1);
	CU_ASSERT_EQUAL(push(id, 11, 8), EMB_ESTALEMAP);
}

static void test_fill_rows(void)
{
	const uint64_t id = 3003;
	const uint32_t s = emb_id_slot(id);
	const float row[DIM] = {5, 6, 7, 8};
	struct emb_wire_iovs v;
	float got[DIM];

	setup();
	view(20, s, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FENCED | EMB_CMAP_VIEW_FILLING, 20);
	/* SGD has no state: a row with state is the row. Fill rows land in
	 * the fenced slot being filled; a client's assign does not. */
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode(&v, 1, tid,
							 EMB_F_WITH_STATE, &id,
							 1, DIM, row),
			      0);
	CU_ASSERT_EQUAL(send_frame(&v, 20, 0), EMB_EMOVING);
	CU_ASSERT_EQUAL(send_frame(&v, 20, EMB_F_FILL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(tab, &id, 1, got, 0, NULL),
			      0);
	CU_ASSERT_EQUAL(memcmp(got, row, sizeof(row)), 0);
	/* No fill of this slot here (any more): refused. */
	view(21, s, EMB_CMAP_VIEW_MINE, 20);
	CU_ASSERT_EQUAL(send_frame(&v, 21, EMB_F_FILL), EMB_ESTALEMAP);
}

/*
 * A fill's rows keep their lifecycle data (EMB_F_META): the idle time
 * sent becomes a last access on this table's clock, the count stays.
 */
static void test_fill_meta(void)
{
	const uint64_t id = 4004;
	const uint32_t s = emb_id_slot(id), meta[2] = {5, 9};
	const float row[DIM] = {1, 2, 3, 4};
	struct emb_server_table st;
	struct emb_table_iter *it;
	struct emb_row_meta rm[8];
	uint64_t ids[8];
	float rows[8 * DIM];
	struct emb_wire_iovs v;
	uint32_t now;
	int got;

	setup();
	view(30, s, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FENCED | EMB_CMAP_VIEW_FILLING, 30);
	CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode_meta(
				  &v, 1, tid, EMB_F_WITH_STATE, &id, 1, DIM,
				  row, meta),
			      0);
	CU_ASSERT_EQUAL(send_frame(&v, 30, EMB_F_FILL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_server_table_acquire(srv, tid, &st), 0);
	now = emb_table_now(st.t);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(st.t, &it), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_slots(it, s, 1), 0);
	got = emb_table_iter_next(it, ids, rows, rm, 8);
	CU_ASSERT_FATAL(got >= 1);
	for (int i = 0; i < got; i++) {
		if (ids[i] != id)
			continue;
		CU_ASSERT_EQUAL(rm[i].last_step, now - 5);
		CU_ASSERT_EQUAL(rm[i].count, 9);
		CU_ASSERT_EQUAL(memcmp(rows + (size_t)i * DIM, row,
				       sizeof(row)),
				0);
		got = -1;
		break;
	}
	CU_ASSERT_EQUAL(got, -1);
	emb_table_iter_destroy(it);
	emb_server_table_release(&st);
	view(31, s, EMB_CMAP_VIEW_MINE, 30);
}

/*
 * A push applied here, then sent again with its old epoch (its connection
 * broke before the answer) once the slot is fenced, then streamed away:
 * acknowledged as the duplicate it is, not refused. Applied before the
 * fence, it went with the stream; a refusal would have the client send the
 * slot's new writer a copy as well, applied twice there. A push this
 * server never applied is still refused.
 */
static void test_applied_then_moved(void)
{
	const uint64_t id = 5005;
	const uint32_t s = emb_id_slot(id);
	float v0, v1;

	setup();
	view(40, s, EMB_CMAP_VIEW_MINE, 40);
	v0 = value(id);
	CU_ASSERT_EQUAL(push(id, 20, 40), 0);
	v1 = value(id);
	CU_ASSERT(v1 < v0);
	/* Fenced for a move: the applied push is acknowledged, a new one
	 * waits. */
	view(41, s, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FENCED, 40);
	CU_ASSERT_EQUAL(push(id, 20, 40), 0);
	CU_ASSERT_EQUAL(push(id, 21, 40), EMB_EMOVING);
	/* Streamed away: the same, and a new one is routed stale. */
	view(42, s, 0, 42);
	CU_ASSERT_EQUAL(push(id, 20, 40), 0);
	CU_ASSERT_EQUAL(push(id, 21, 40), EMB_ESTALEMAP);
	/* Nothing was applied again (the slot back, to read it). */
	view(43, s, EMB_CMAP_VIEW_MINE, 43);
	CU_ASSERT_EQUAL(value(id), v1);
}

static void test_done(void)
{
	emb_client_table_close(tab);
	emb_client_destroy(cli);
	close(fd);
	emb_server_destroy(srv);
	srv = NULL;
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a fenced write is refused unapplied, then applied once",
	     test_fence},
	    {"writes routed by an older or a newer map", test_stale},
	    {"fill rows land only where the server is filled", test_fill_rows},
	    {"a fill's rows keep their idle time and count", test_fill_meta},
	    {"a push applied, then sent again once its slot moved, is "
	     "acknowledged, not refused",
	     test_applied_then_moved},
	    {"teardown", test_done},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "fence", cases);
}
