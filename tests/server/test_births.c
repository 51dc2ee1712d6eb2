/*
 * tests/server/test_births.c - a server's part of births (docs/
 * replication.md, "Eviction with replicas"): a table with an eviction
 * policy numbers its rows from its creation; BIRTHS answers each id's
 * birth (EMB_WIRE_BIRTH_NONE for no row), and for a table without one
 * which ids are rows; a PUSH naming births applies, makes a row again, or
 * drops (counted in grads_discarded), and a table that numbers no rows
 * refuses it whole with the reason. Through a raw connection to an
 * in-process server; values are read back with a plain client. A
 * backup's check (server/bcheck.c) runs one round at a time, with no
 * thread and no timing.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "proto/wire_msg.h"
#include "server/bcheck.h"

#define DIM 4u

static struct emb_server *srv;
static struct emb_client *cli;
static int fd = -1;
static uint32_t features;

/* The server's id of the client's table named name. */
static uint32_t server_id_of(const char *name)
{
	uint32_t ids[8];
	int n = emb_server_table_ids(srv, ids, 8);

	for (int i = 0; i < n; i++) {
		struct emb_server_table st;
		bool same;

		CU_ASSERT_EQUAL_FATAL(emb_server_table_acquire(srv, ids[i], &st),
				      0);
		same = !strcmp(st.spec.name, name);
		emb_server_table_release(&st);
		if (same)
			return ids[i];
	}
	CU_FAIL_FATAL("no such table on the server");
	return 0;
}

static void setup(void)
{
	struct emb_server_opts o = nt_server_opts();
	_Alignas(8) uint8_t buf[256];
	_Alignas(8) uint8_t resp[256];
	struct emb_wire_hello_resp hr;
	struct emb_wire_frame f;
	struct emb_frame_hdr h;
	char addr[64];
	uint16_t port;
	int len;

	if (srv)
		return;
	o.threads = 1;
	srv = nt_server_start(&o);
	port = emb_server_port(srv);
	nt_addr_list(addr, sizeof(addr), &port, 1);
	cli = nt_client(addr, 0);
	fd = nt_raw_connect(port);
	len = emb_wire_hello_req_encode_flags(buf, sizeof(buf), 1,
					      EMB_WIRE_VERSION, 0, NULL, 0,
					      "raw/births");
	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &h, resp + EMB_WIRE_HDR_SIZE,
					  sizeof(resp) - EMB_WIRE_HDR_SIZE),
			      0);
	emb_wire_hdr_encode(resp, &h);
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_frame_decode(resp, EMB_WIRE_HDR_SIZE + h.payload_len,
				  &o.limits, &f),
	    0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_hello_resp_decode(&f, &hr), 0);
	features = hr.features;
}

/* Sends the request in v; the response's status, its payload in out. */
static int roundtrip(struct emb_wire_iovs *v, void *out, size_t cap,
		     struct emb_frame_hdr *h)
{
	static _Alignas(8) uint8_t buf[1u << 16];
	int len = emb_wire_iovs_flatten(v, buf, sizeof(buf));

	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, buf, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, h, out, cap), 0);
	return h->status;
}

/* BIRTHS of n ids of table tid into births; the response's status. */
static int births_of(uint32_t tid, const uint64_t *ids, uint32_t n,
		     uint32_t *births)
{
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + 512];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_iovs v;
	struct emb_frame_hdr h;
	struct emb_wire_frame f;
	const uint32_t *got;
	uint32_t m;
	int rc;

	CU_ASSERT_EQUAL_FATAL(emb_wire_births_req_encode(&v, 9, tid, ids, n),
			      0);
	rc = roundtrip(&v, resp + EMB_WIRE_HDR_SIZE, 512, &h);
	if (rc)
		return rc;
	emb_wire_hdr_encode(resp, &h);
	/* f keeps lim: it lives as long as f. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_frame_decode(resp, EMB_WIRE_HDR_SIZE + h.payload_len,
				  &lim, &f),
	    0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_births_resp_decode(&f, &m, &got), 0);
	CU_ASSERT_EQUAL_FATAL(m, n);
	memcpy(births, got, 4ull * n);
	return 0;
}

/*
 * LIST_BIRTHS of table tid's slots [first, first + n): each row's birth
 * by id into (ids, births), up to cap, and the marks; the response's
 * status, *m the rows.
 */
static int list_of(uint32_t tid, uint32_t first, uint32_t n, uint32_t *marks,
		   uint64_t *ids, uint32_t *births, uint32_t cap, uint32_t *m)
{
	static _Alignas(8) uint8_t resp[1u << 20];
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_list_births r;
	struct emb_wire_frame f;
	struct emb_frame_hdr h;
	_Alignas(8) uint8_t req[64];
	int len = emb_wire_list_births_req_encode(req, sizeof(req), 11, tid,
						  first, n);

	CU_ASSERT_FATAL(len > 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_send(fd, req, (size_t)len), 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_recv(fd, &h, resp + EMB_WIRE_HDR_SIZE,
					  sizeof(resp) - EMB_WIRE_HDR_SIZE),
			      0);
	if (h.status)
		return h.status;
	emb_wire_hdr_encode(resp, &h);
	CU_ASSERT_EQUAL_FATAL(
	    emb_wire_frame_decode(resp, EMB_WIRE_HDR_SIZE + h.payload_len,
				  &lim, &f),
	    0);
	CU_ASSERT_EQUAL_FATAL(emb_wire_list_births_resp_decode(&f, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, n);
	CU_ASSERT_FATAL(r.m <= cap);
	memcpy(marks, r.marks, 4ull * n);
	memcpy(ids, r.ids, 8ull * r.m);
	memcpy(births, r.births, 4ull * r.m);
	*m = r.m;
	return 0;
}

/* A push of gradient 1 to id naming birth b; the response's status and,
 * on an error, its message in why. */
static int push_birth(uint32_t tid, uint64_t id, uint32_t b, char *why,
		      size_t cap)
{
	const float g[DIM] = {1, 1, 1, 1};
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + EMB_WIRE_ERRMSG_MAX];
	struct emb_wire_iovs v;
	struct emb_frame_hdr h;
	int rc;

	CU_ASSERT_EQUAL_FATAL(emb_wire_push_req_encode_births(
				  &v, 7, tid, 0, 0, 0, 0, &id, 1, DIM, 0, g,
				  &b),
			      0);
	rc = roundtrip(&v, resp + EMB_WIRE_HDR_SIZE, sizeof(resp), &h);
	if (why && cap) {
		why[0] = '\0';
		if (rc && h.payload_len > 8)
			snprintf(why, cap, "%.*s", (int)(h.payload_len - 8),
				 (const char *)resp + EMB_WIRE_HDR_SIZE + 8);
	}
	return rc;
}

static float first(struct emb_client_table *t, uint64_t id)
{
	float row[DIM];

	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, &id, 1, row,
						    EMB_CLIENT_NOCREATE, NULL),
			      0);
	return row[0];
}

/* A table with eviction numbers its rows; BIRTHS tells each row's, a
 * push applies, drops or makes again by them. */
static void test_numbered(void)
{
	struct emb_table_spec sp = nt_spec("evicting", DIM, 7);
	struct emb_client_table *t;
	struct emb_client_table_stats st = {.struct_size = sizeof(st)};
	uint64_t ids[3] = {1001, 0, 1003};
	uint32_t b[3], tid;
	float init, now;

	setup();
	CU_ASSERT(features & EMB_WIRE_FEAT_BIRTHS);
	sp.optim.kind = EMB_OPTIM_SGD;
	sp.optim.lr = 1.0f;
	CU_ASSERT_EQUAL_FATAL(emb_evict_parse("max_rows:1000000", &sp.life),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &t), 0);
	tid = server_id_of("evicting");
	/* Two rows of one slot, made by pulls: births 1 and 2. */
	for (uint64_t j = ids[0] + 1;; j++)
		if (emb_id_slot(j) == emb_id_slot(ids[0])) {
			ids[1] = j;
			break;
		}
	{
		float rows[2 * DIM];

		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull(t, ids, 2, rows, 0, NULL), 0);
		init = rows[0];
	}
	CU_ASSERT_EQUAL_FATAL(births_of(tid, ids, 3, b), 0);
	CU_ASSERT_EQUAL(b[0], 1);
	CU_ASSERT_EQUAL(b[1], 2);
	CU_ASSERT_EQUAL(b[2], EMB_WIRE_BIRTH_NONE);
	/* Its birth: applied. */
	CU_ASSERT_EQUAL(push_birth(tid, ids[0], 1, NULL, 0), 0);
	now = first(t, ids[0]);
	CU_ASSERT_EQUAL(now, init - 1.0f);
	/* An older birth (the row was made again since): dropped. */
	CU_ASSERT_EQUAL(push_birth(tid, ids[0], 0, NULL, 0), 0);
	CU_ASSERT_EQUAL(first(t, ids[0]), now);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_stats(t, &st), 0);
	CU_ASSERT_EQUAL(st.grads_discarded, 1);
	/* A newer one (this holder missed a removal): made again, then
	 * applied, and the birth is the row's from then on. */
	CU_ASSERT_EQUAL(push_birth(tid, ids[0], 9, NULL, 0), 0);
	CU_ASSERT_EQUAL(first(t, ids[0]), init - 1.0f);
	CU_ASSERT_EQUAL_FATAL(births_of(tid, ids, 1, b), 0);
	CU_ASSERT_EQUAL(b[0], 9);
	/* The birth that means "no row" is no birth to name. */
	{
		char why[EMB_WIRE_ERRMSG_MAX];

		CU_ASSERT_EQUAL(push_birth(tid, ids[0], EMB_WIRE_BIRTH_NONE,
					   why, sizeof(why)),
				EMB_EBADFRAME);
		CU_ASSERT_PTR_NOT_NULL(strstr(why, "no row's"));
		CU_ASSERT_EQUAL(first(t, ids[0]), init - 1.0f);
	}
	/* An absent row is made with the birth named. */
	CU_ASSERT_EQUAL(push_birth(tid, ids[2], 4, NULL, 0), 0);
	CU_ASSERT_EQUAL_FATAL(births_of(tid, &ids[2], 1, b), 0);
	CU_ASSERT_EQUAL(b[0], 4);
	/* Promoted to primary of the slot: its counter goes up by the gap,
	 * so the next row there is newer than any its old primary made. */
	{
		uint64_t set[EMB_NSLOTS / 64] = {0}, fresh = ids[1] + 1;
		float row[DIM];

		while (emb_id_slot(fresh) != emb_id_slot(ids[0]))
			fresh++;
		set[emb_id_slot(ids[0]) / 64] |= 1ull
						 << (emb_id_slot(ids[0]) % 64);
		CU_ASSERT_EQUAL(emb_server_births_raise(srv, set), 1);
		CU_ASSERT_EQUAL_FATAL(
		    emb_client_table_pull(t, &fresh, 1, row, 0, NULL), 0);
		CU_ASSERT_EQUAL_FATAL(births_of(tid, &fresh, 1, b), 0);
		CU_ASSERT_EQUAL(b[0], 9 + EMB_SERVER_BIRTH_GAP + 1);
	}
	/* An ASSIGN naming births (a fill's rows) gives the rows those, and
	 * the slot's counter goes up to them. */
	{
		_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + 512];
		uint64_t aid[2] = {5005, 5006};
		const uint32_t ab[2] = {3000000, 7};
		const float rows[2 * DIM] = {0};
		struct emb_wire_iovs v;
		struct emb_frame_hdr h;

		CU_ASSERT_EQUAL_FATAL(emb_wire_assign_req_encode_births(
					  &v, 8, tid, 0, aid, 2, DIM, rows,
					  NULL, ab),
				      0);
		CU_ASSERT_EQUAL(roundtrip(&v, resp, sizeof(resp), &h), 0);
		CU_ASSERT_EQUAL_FATAL(births_of(tid, aid, 2, b), 0);
		CU_ASSERT_EQUAL(b[0], 3000000);
		CU_ASSERT_EQUAL(b[1], 7);
	}
	/* LIST_BIRTHS: the rows of every slot, in chunks, with the births
	 * BIRTHS gives them, each at or under its slot's mark. */
	{
		enum { CAP = 4096 };
		static uint64_t lid[CAP];
		static uint32_t lb[CAP], marks[512], one;
		uint32_t m = 0, total = 0;

		for (uint32_t first = 0; first < EMB_NSLOTS; first += 512) {
			CU_ASSERT_EQUAL_FATAL(list_of(tid, first, 512, marks,
						      lid, lb, CAP, &m),
					      0);
			for (uint32_t j = 0; j < m; j++) {
				uint32_t sl = emb_id_slot(lid[j]);

				CU_ASSERT(sl >= first && sl < first + 512);
				CU_ASSERT(lb[j] <= marks[sl - first]);
				CU_ASSERT_EQUAL_FATAL(
				    births_of(tid, &lid[j], 1, &one), 0);
				CU_ASSERT_EQUAL(one, lb[j]);
			}
			total += m;
		}
		/* 1001 and the other of its slot, 1003, the promotion's row
		 * and the two of the ASSIGN. */
		CU_ASSERT_EQUAL(total, 6);
	}
	/* Unknown tables are refused. */
	CU_ASSERT_EQUAL(births_of(tid + 100, ids, 1, b), EMB_ENOTABLE);
	emb_client_table_close(t);
}

/* A table without eviction: BIRTHS says which ids are rows (birth 0), and
 * a push naming births is refused whole, with the reason. */
static void test_unnumbered(void)
{
	struct emb_table_spec sp = nt_spec("plain", DIM, 7);
	struct emb_client_table *t;
	uint64_t ids[2] = {77, 78};
	uint32_t b[2], tid;
	char why[EMB_WIRE_ERRMSG_MAX];
	float row[DIM], before;

	setup();
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &t), 0);
	tid = server_id_of("plain");
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, 1, row, 0, NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(births_of(tid, ids, 2, b), 0);
	CU_ASSERT_EQUAL(b[0], 0);
	CU_ASSERT_EQUAL(b[1], EMB_WIRE_BIRTH_NONE);
	before = first(t, ids[0]);
	CU_ASSERT_EQUAL(push_birth(tid, ids[0], 0, why, sizeof(why)),
			EMB_EBADARG);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "does not number its rows"));
	CU_ASSERT_EQUAL(first(t, ids[0]), before);
	emb_client_table_close(t);
}

/* emb_server_fill()'s end, for test_fill(). */
struct fill_end {
	int done;
	int status;
	uint64_t rows;
};

static void on_fill_end(void *arg, uint32_t first, uint32_t n,
			uint64_t epoch, int status, uint64_t rows,
			uint64_t bytes)
{
	struct fill_end *e = arg;

	(void)first;
	(void)n;
	(void)epoch;
	(void)bytes;
	e->status = status;
	e->rows = rows;
	__atomic_store_n(&e->done, 1, __ATOMIC_RELEASE);
}

/*
 * A fill carries each row's birth: another server, filled with every slot
 * from this one, holds the table's rows with the births they have here
 * (rows made again after an erase included), and makes its next row of a
 * slot past them.
 */
static void test_fill(void)
{
	enum { N = 64 };
	struct emb_server_opts o = nt_server_opts();
	struct emb_server *dst;
	static struct emb_server_map m;
	struct emb_client_table *t;
	struct fill_end e = {0};
	uint64_t ids[N];
	uint32_t here[N], there[N], tid2 = 0;
	float rows[N * DIM];
	uint16_t port;

	setup();
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(cli, "evicting", &t), 0);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 90000 + 17 * (uint64_t)i;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, N, rows, 0, NULL),
			      0);
	/* Some made again: newer births than their first. */
	{
		uint64_t erased = 0;

		CU_ASSERT_EQUAL(emb_client_table_erase(t, ids, 8, &erased), 0);
		CU_ASSERT_EQUAL(erased, 8);
	}
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, 8, rows, 0, NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(births_of(server_id_of("evicting"), ids, N,
					here),
			      0);
	o.threads = 1;
	dst = nt_server_start(&o);
	port = emb_server_port(dst);
	m.epoch = 5;
	memset(m.slot, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FILLING, EMB_NSLOTS);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		m.grew[i] = 1;
	CU_ASSERT_EQUAL_FATAL(emb_server_set_map(dst, &m), 0);
	CU_ASSERT_EQUAL_FATAL(emb_server_fill(srv, "127.0.0.1", port, 0,
					      EMB_NSLOTS, 5,
					      EMB_SERVER_FILL_FULL,
					      on_fill_end, &e),
			      0);
	for (int i = 0; i < 1000 && !__atomic_load_n(&e.done,
						     __ATOMIC_ACQUIRE);
	     i++)
		usleep(10 * 1000);
	CU_ASSERT_EQUAL_FATAL(__atomic_load_n(&e.done, __ATOMIC_ACQUIRE), 1);
	CU_ASSERT_EQUAL(e.status, 0);
	CU_ASSERT(e.rows >= N);
	/* The other server's births, asked over a raw connection. */
	{
		int keep = fd;
		uint32_t ids2[8];
		int nt = (int)emb_server_table_ids(dst, ids2, 8);

		for (int i = 0; i < nt; i++) {
			struct emb_server_table st;

			CU_ASSERT_EQUAL_FATAL(
			    emb_server_table_acquire(dst, ids2[i], &st), 0);
			if (!strcmp(st.spec.name, "evicting"))
				tid2 = ids2[i];
			emb_server_table_release(&st);
		}
		CU_ASSERT_FATAL(tid2 != 0);
		fd = nt_raw_connect(port);
		CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
		CU_ASSERT_EQUAL_FATAL(births_of(tid2, ids, N, there), 0);
		close(fd);
		fd = keep;
	}
	for (uint32_t i = 0; i < N; i++)
		CU_ASSERT_EQUAL(there[i], here[i]);
	CU_ASSERT(here[0] > 1); /* made again: not its first birth */
	emb_client_table_close(t);
	emb_server_destroy(dst);
}

/* test_check()'s backup, its map and addresses, for test_check_thread(). */
static struct emb_server *bk;
static struct emb_cmap *bk_map;
static struct emb_wire_node_addr bk_addrs[2];

/* Table name of server s, held until emb_server_table_release(). */
static void hold_table(struct emb_server *s, const char *name,
		       struct emb_server_table *out)
{
	uint32_t ids[8];
	uint32_t n = emb_server_table_ids(s, ids, 8);

	for (uint32_t i = 0; i < n && i < 8; i++) {
		CU_ASSERT_EQUAL_FATAL(emb_server_table_acquire(s, ids[i], out),
				      0);
		if (!strcmp(out->spec.name, name))
			return;
		emb_server_table_release(out);
	}
	CU_FAIL_FATAL("no such table on the server");
}

/* Every row of t, (ids, births), up to cap; how many there are. */
static uint32_t all_rows(struct emb_table *t, uint64_t *ids, uint32_t *births,
			 uint32_t cap)
{
	static uint32_t marks[EMB_NSLOTS];
	int m =
	    emb_table_births_list(t, 0, EMB_NSLOTS, marks, ids, births, cap);

	CU_ASSERT_FATAL(m >= 0 && (uint32_t)m <= cap);
	return (uint32_t)m;
}

/* A port nothing listens on: bound by the kernel, then let go. */
static uint16_t dead_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port;

	CU_ASSERT_FATAL(s >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CU_ASSERT_EQUAL_FATAL(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	CU_ASSERT_EQUAL_FATAL(getsockname(s, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(s);
	return port;
}

/*
 * A backup's check removes the rows its primary evicted: a second server,
 * filled from this one (so its rows have the same births), is rank 1 of
 * a map where rank 0, this server, is the primary of every slot. Rows
 * erased here are removed there by one round; a row made again here and
 * pushed there with its new birth stays, and so does one the backup has
 * with a birth past the primary's counter (made there by a push after
 * the primary's list). With the primary unreachable, the round fails and
 * removes nothing.
 */
static void test_check(void)
{
	enum { N = 64, E = 8, CAP = 4096 };
	const float g[DIM] = {0};
	struct emb_table_spec sp = nt_spec("checked", DIM, 11);
	struct emb_server_opts o = nt_server_opts();
	struct emb_server_table pt, bt;
	struct emb_server_stats ss;
	struct emb_client_table *t;
	static struct emb_server_map v;
	static uint64_t pid[CAP], bid[CAP];
	static uint32_t pb[CAP], bb[CAP];
	struct emb_wire_node_addr addrs[2] = {{.port = 0}};
	struct emb_cmap *m = malloc(sizeof(*m));
	struct emb_server *dst;
	struct fill_end e = {0};
	uint64_t ids[N], removed = 0;
	uint32_t x_birth, y_birth, np, nb, before;
	float rows[N * DIM];

	setup();
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_EQUAL_FATAL(emb_evict_parse("max_rows:1000000", &sp.life), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &t), 0);
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 70000 + 13 * (uint64_t)i;
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, N, rows, 0, NULL),
			      0);
	/* The backup: filled with every slot, as a recovery would. */
	o.threads = 1;
	dst = nt_server_start(&o);
	v.epoch = 5;
	memset(v.slot, EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_FILLING, EMB_NSLOTS);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		v.grew[i] = 1;
	CU_ASSERT_EQUAL_FATAL(emb_server_set_map(dst, &v), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_server_fill(srv, "127.0.0.1", emb_server_port(dst), 0,
			    EMB_NSLOTS, 5, EMB_SERVER_FILL_FULL, on_fill_end,
			    &e),
	    0);
	for (int i = 0; i < 1000 && !__atomic_load_n(&e.done, __ATOMIC_ACQUIRE);
	     i++)
		usleep(10 * 1000);
	CU_ASSERT_EQUAL_FATAL(__atomic_load_n(&e.done, __ATOMIC_ACQUIRE), 1);
	CU_ASSERT_EQUAL_FATAL(e.status, 0);
	hold_table(srv, "checked", &pt);
	hold_table(dst, "checked", &bt);
	CU_ASSERT_FATAL(emb_table_has_births(bt.t));
	/* Evicted on the primary alone (an erase removes as eviction
	 * does, and leaves the slots' counters). */
	{
		uint64_t erased = 0;

		CU_ASSERT_EQUAL(emb_client_table_erase(t, ids, E, &erased), 0);
		CU_ASSERT_EQUAL(erased, E);
	}
	/* ids[0] made again there, and its push reached the backup with
	 * its new birth. */
	CU_ASSERT_EQUAL_FATAL(emb_client_table_pull(t, ids, 1, rows, 0, NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_table_births(pt.t, ids, 1, &y_birth), 1);
	CU_ASSERT_EQUAL_FATAL(
	    emb_table_push_births(bt.t, ids, 1, g, &y_birth, 0), 0);
	/* ids[1] made again on the primary after its list: the push that
	 * names its birth reached the backup first. */
	x_birth = emb_table_slot_birth(pt.t, emb_id_slot(ids[1])) + 1;
	CU_ASSERT_EQUAL_FATAL(
	    emb_table_push_births(bt.t, &ids[1], 1, g, &x_birth, 0), 0);
	before = all_rows(bt.t, bid, bb, CAP);
	/* A map of two servers, rank 0 the primary of every slot. */
	CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, 2, 2), 0);
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		m->slot[sl][0] = 0;
		m->slot[sl][1] = 1;
	}
	snprintf(addrs[0].host, sizeof(addrs[0].host), "127.0.0.1");
	snprintf(addrs[1].host, sizeof(addrs[1].host), "127.0.0.1");
	addrs[1].port = emb_server_port(dst);
	/* The primary unreachable: an error, and nothing removed. */
	addrs[0].port = dead_port();
	CU_ASSERT(emb__bcheck_round(dst, m, 1, addrs, 2, &removed) < 0);
	CU_ASSERT_EQUAL(removed, 0);
	CU_ASSERT_EQUAL(all_rows(bt.t, bid, bb, CAP), before);
	/* As rank 0 (the primary of every slot) it has nothing to check. */
	CU_ASSERT_EQUAL(emb__bcheck_round(dst, m, 0, addrs, 2, &removed), 0);
	CU_ASSERT_EQUAL(removed, 0);
	/* Reached: the rows the primary no longer has go, the other six
	 * of those erased there; the two newer ones stay. */
	addrs[0].port = emb_server_port(srv);
	CU_ASSERT_EQUAL(emb__bcheck_round(dst, m, 1, addrs, 2, &removed), 0);
	CU_ASSERT_EQUAL(removed, E - 2);
	emb_server_stats(dst, &ss);
	CU_ASSERT_EQUAL(ss.births_pruned, E - 2);
	CU_ASSERT(ss.birth_checks >= 3);
	np = all_rows(pt.t, pid, pb, CAP);
	nb = all_rows(bt.t, bid, bb, CAP);
	CU_ASSERT_EQUAL(nb, before - (E - 2));
	/* Exactly the primary's rows, with their births, and ids[1]. */
	CU_ASSERT_EQUAL(nb, np + 1);
	for (uint32_t i = 0; i < np; i++) {
		uint32_t b;

		CU_ASSERT_EQUAL(emb_table_births(bt.t, &pid[i], 1, &b), 1);
		CU_ASSERT_EQUAL(b, pb[i]);
	}
	{
		uint32_t b[2];

		CU_ASSERT_EQUAL(emb_table_births(bt.t, ids, 2, b), 2);
		CU_ASSERT_EQUAL(b[0], y_birth);
		CU_ASSERT_EQUAL(b[1], x_birth);
		CU_ASSERT_EQUAL(emb_table_births(pt.t, &ids[1], 1, b), 0);
	}
	/* A second round finds nothing more to remove. */
	removed = 0;
	CU_ASSERT_EQUAL(emb__bcheck_round(dst, m, 1, addrs, 2, &removed), 0);
	CU_ASSERT_EQUAL(removed, 0);
	/* The primary makes ids[1] now: the birth the backup has. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_client_table_pull(t, &ids[1], 1, rows, 0, NULL), 0);
	{
		uint32_t b;

		CU_ASSERT_EQUAL(emb_table_births(pt.t, &ids[1], 1, &b), 1);
		CU_ASSERT_EQUAL(b, x_birth);
	}
	emb_server_table_release(&bt);
	emb_server_table_release(&pt);
	emb_client_table_close(t);
	/* For test_check_thread(). */
	bk = dst;
	bk_map = m;
	memcpy(bk_addrs, addrs, sizeof(addrs));
}

/*
 * The check's thread runs rounds by itself, every EMB_BIRTH_CHECK_MS, once
 * it has a replicated map, and a stop wakes it at once. Waits for the
 * server's counter, with a deadline.
 */
static void test_check_thread(void)
{
	struct emb_client_table *t;
	struct emb_server_stats ss;
	struct emb__bcheck *b;
	uint64_t id = 70000 + 13 * 10, erased = 0, pruned, t0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(bk);
	emb_server_stats(bk, &ss);
	pruned = ss.births_pruned;
	/* No map: no round, however long it waits. */
	CU_ASSERT_EQUAL_FATAL(setenv("EMB_BIRTH_CHECK_MS", "20", 1), 0);
	CU_ASSERT_EQUAL_FATAL(emb__bcheck_start(bk, 1, &b), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_open(cli, "checked", &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_erase(t, &id, 1, &erased), 0);
	CU_ASSERT_EQUAL(erased, 1);
	CU_ASSERT_EQUAL_FATAL(emb__bcheck_set_map(b, bk_map, bk_addrs, 2), 0);
	for (int i = 0; i < 1000; i++) {
		emb_server_stats(bk, &ss);
		if (ss.births_pruned > pruned)
			break;
		usleep(10 * 1000);
	}
	CU_ASSERT_EQUAL(ss.births_pruned, pruned + 1);
	emb__bcheck_stop(b);
	/* A long period: the stop does not wait for it. */
	CU_ASSERT_EQUAL_FATAL(setenv("EMB_BIRTH_CHECK_MS", "600000", 1), 0);
	CU_ASSERT_EQUAL_FATAL(emb__bcheck_start(bk, 1, &b), 0);
	CU_ASSERT_EQUAL_FATAL(emb__bcheck_set_map(b, bk_map, bk_addrs, 2), 0);
	t0 = emb_clock_ms();
	emb__bcheck_stop(b);
	CU_ASSERT(emb_clock_ms() - t0 < 1000);
	unsetenv("EMB_BIRTH_CHECK_MS");
	emb_client_table_close(t);
	emb_server_destroy(bk);
	bk = NULL;
	free(bk_map);
}

static void test_done(void)
{
	close(fd);
	emb_client_destroy(cli);
	emb_server_destroy(srv);
	srv = NULL;
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a table with eviction numbers its rows", test_numbered},
	    {"a table without: rows, and pushes refused", test_unnumbered},
	    {"a fill carries each row's birth", test_fill},
	    {"a backup's check removes the rows its primary evicted",
	     test_check},
	    {"the check's thread runs rounds by itself and stops at once",
	     test_check_thread},
	    {"teardown", test_done},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "server/births", cases);
}
