/*
 * src/server/bcheck.c - a backup's birth check (bcheck.h). With replicas a
 * slot's primary evicts alone (emb_cmap_evict_hold_rank()); its backups
 * carry its evictions out here. Each round lists, for every slot this
 * server backs, the primary's rows with their births and the slot's
 * counter read before them (LIST_BIRTHS), and removes the rows here of a
 * birth at or under that counter that the primary does not have
 * (emb_table_births_prune()). A row made after the primary's list began
 * is newer than the counter and stays, so a round needs no order with
 * the workers' pushes, and each round stands alone.
 *
 * The map decides who the primary is: a removal is made only while the
 * map the round began with is still the last one given, checked under
 * b->mu with the removal done before the lock is let go, so a new map
 * (a promotion) waits for at most one chunk's removal.
 *
 * Threads: emb__bcheck_set_map() runs on the node agent's thread (from
 * replica.c, under its mutex), emb__bcheck_start()/stop() on the
 * replica's creator's; check_main on its own thread runs the rounds.
 * b->mu guards stop, have_map, map, addrs and naddrs; snap and
 * everything a round allocates belong to the check thread alone (or to
 * the caller of emb__bcheck_round()). The server's counters are atomics.
 */
#include "server/bcheck.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/thread.h"
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

#include "server/server_int.h"
#include "server/tables.h"

#define CHUNK_SLOTS 64u		 /* slots a LIST_BIRTHS asks at most */
#define CALL_MS	    3000u	 /* one request to a primary */
#define RESP_FIRST  (1u << 20)	 /* response buffer, grown as needed */
#define RESP_MAX    (256u << 20) /* ...up to this */

struct emb__bcheck {
	pthread_mutex_t mu;   /* guards the fields below up to snap */
	pthread_cond_t cv;    /* signals stop; monotonic clock */
	bool stop;	      /* stop(): the thread exits */
	bool have_map;	      /* map holds one */
	struct emb_cmap *map; /* the last map set_map() gave */
	struct emb_wire_node_addr *addrs; /* its servers by rank; owned */
	uint32_t naddrs;		  /* entries of addrs */
	struct emb_cmap *snap; /* the check thread's copy for a round */
	struct emb_server *s;  /* borrowed */
	uint32_t rank;	       /* this server's */
	uint64_t period_ms;    /* between rounds; 0 = none */
	pthread_t th;	       /* check_main */
	bool th_on;	       /* th started */
};

/* A local table that numbers its rows, and its id on the primary. */
struct tab {
	uint32_t id;		       /* here */
	uint32_t remote;	       /* on the primary asked; 0 = none */
	char name[EMB_WIRE_NAME_SIZE]; /* what the two ids share */
};

/* One round's state: one primary's connection at a time. */
struct round {
	struct emb_server *s;
	struct emb__bcheck *b; /* NULL: no map to check again */
	const struct emb_cmap *m;
	uint32_t rank;
	bool mine[EMB_NSLOTS]; /* slots this rank backs and checks */
	struct tab *tabs;
	uint32_t ntabs;
	struct emb_wire_limits lim; /* responses are decoded against */
	struct emb_transport *tr;   /* this primary's, or NULL */
	struct emb_conn *conn;
	uint8_t *buf; /* response frame, header first */
	size_t cap;   /* bytes of buf */
	uint64_t req_id;
	uint64_t removed; /* rows removed so far */
	uint32_t checked; /* slot chunks listed and pruned */
	int err;	  /* the first error, logged */
	bool stale;	  /* the map changed: the round stops */
};

/* Remembers the round's first error and logs it, once a round: a dead
 * primary would otherwise fill the log every period. */
static void fail(struct round *rd, int rc, const char *what)
{
	if (rd->err)
		return;
	rd->err = rc;
	emb_log(EMB_LOG_WARN, "birth check: %s: %s; the next round tries again",
		what, emb_strerror(rc));
}

/*
 * The request frame req[0..len) to the primary, its response decoded into
 * *f (a view of rd->buf, valid until the next call). A response larger
 * than the buffer is asked again into a larger one. 0, the server's
 * status, or the transport's and decoder's errors.
 */
static int call(struct round *rd, const uint8_t *req, int len,
		struct emb_wire_frame *f)
{
	struct emb_frame_hdr hdr, rhdr;
	struct iovec iov;
	int rc;

	rc = emb_wire_hdr_decode(req, EMB_WIRE_HDR_SIZE, &rd->lim, &hdr);
	if (rc)
		return rc;
	iov = (struct iovec){(void *)(req + EMB_WIRE_HDR_SIZE),
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	for (;;) {
		rc = emb_conn_call_sync(rd->conn, &hdr, &iov,
					iov.iov_len ? 1 : 0,
					rd->buf + EMB_WIRE_HDR_SIZE,
					rd->cap - EMB_WIRE_HDR_SIZE, &rhdr);
		if (rc != EMB_ERESPTOOBIG || rd->cap >= RESP_MAX)
			break;
		free(rd->buf);
		rd->cap *= 2;
		rd->buf = aligned_alloc(64, rd->cap);
		if (!rd->buf)
			return -ENOMEM;
	}
	if (rc)
		return rc;
	if (rhdr.status < 0)
		return rhdr.status;
	emb_wire_hdr_encode(rd->buf, &rhdr);
	return emb_wire_frame_decode(
	    rd->buf, EMB_WIRE_HDR_SIZE + rhdr.payload_len, &rd->lim, f);
}

/* Closes the connection to the last primary, if any. */
static void disconnect(struct round *rd)
{
	emb_conn_destroy(rd->conn);
	rd->conn = NULL;
	emb_transport_destroy(rd->tr);
	rd->tr = NULL;
}

/* A connection to the primary at a, with this server's token (the one its
 * fills present): 0, or the connect's, HELLO's error, or -EOPNOTSUPP for
 * a primary that does not answer LIST_BIRTHS. */
static int connect_to(struct round *rd, const struct emb_wire_node_addr *a)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	_Alignas(8) uint8_t hello[EMB_WIRE_HDR_SIZE + 64 + EMB_WIRE_TOKEN_MAX];
	struct emb_wire_hello_resp hr;
	struct emb_wire_frame f;
	uint32_t tl = rd->s->opts.auth_token_len;
	int rc, len;

	to.call_timeout_ms = CALL_MS;
	to.connect_timeout_ms = CALL_MS;
	to.max_frame_bytes = RESP_MAX;
	co.host = a->host;
	co.port = a->port;
	len = emb_wire_hello_req_encode(
	    hello, sizeof(hello), ++rd->req_id, EMB_WIRE_VERSION,
	    tl ? rd->s->token : NULL, tl, "embstore-bcheck");
	if (len < 0)
		return len;
	rc = emb_transport_create("tcp", &to, &rd->tr);
	if (!rc)
		rc = emb_conn_create(rd->tr, &co, &rd->conn);
	if (!rc)
		rc = call(rd, hello, len, &f);
	if (!rc)
		rc = emb_wire_hello_resp_decode(&f, &hr);
	if (!rc && !(hr.features & EMB_WIRE_FEAT_BIRTHS))
		rc = -EOPNOTSUPP;
	if (rc)
		disconnect(rd);
	return rc;
}

/* Each local table's id on the connected primary, by name (LIST_TABLES);
 * 0 where it has none. */
static int remote_ids(struct round *rd)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE + 8];
	struct emb_wire_list_resp lr = {0};
	struct emb_wire_frame f;
	int rc, len;

	len = emb_wire_empty_req_encode(req, sizeof(req), EMB_OP_LIST_TABLES,
					++rd->req_id, 0);
	if (len < 0)
		return len;
	rc = call(rd, req, len, &f);
	if (!rc)
		rc = emb_wire_list_resp_decode(&f, &lr);
	for (uint32_t j = 0; j < rd->ntabs; j++) {
		rd->tabs[j].remote = 0;
		for (uint32_t i = 0; !rc && i < lr.n; i++) {
			struct emb_wire_table_info ti;

			emb_wire_list_entry(&lr, i, &ti);
			if (!strcmp(ti.spec.name, rd->tabs[j].name)) {
				rd->tabs[j].remote = ti.table_id;
				break;
			}
		}
	}
	return rc;
}

/* With the map the round began with still the last one (and no stop),
 * true and b->mu held until map_release(); else false. */
static bool map_hold(struct round *rd)
{
	struct emb__bcheck *b = rd->b;

	if (!b)
		return true;
	pthread_mutex_lock(&b->mu);
	if (!b->stop && b->have_map && b->map->epoch == rd->m->epoch)
		return true;
	pthread_mutex_unlock(&b->mu);
	rd->stale = true;
	return false;
}

static void map_release(struct round *rd)
{
	if (rd->b)
		pthread_mutex_unlock(&rd->b->mu);
}

/* Whether the round should end before its next primary: a stop, or a new
 * map (each connect may wait CALL_MS for a dead one). */
static bool cut_short(struct round *rd)
{
	if (!map_hold(rd))
		return true;
	map_release(rd);
	return false;
}

/*
 * Slots [first, first + n) of table t (remote on the primary p): listed
 * there in chunks, pruned here. Adds the rows removed to *removed. 0, or
 * the first error (the rest of the run is skipped).
 */
static int check_run(struct round *rd, struct emb_table *t,
		     const struct tab *tb, uint32_t first, uint32_t n,
		     uint64_t *removed)
{
	_Alignas(8) uint8_t req[64];
	uint32_t chunk = CHUNK_SLOTS;

	for (uint32_t sl = first; sl < first + n;) {
		uint32_t k = first + n - sl < chunk ? first + n - sl : chunk;
		struct emb_wire_list_births lb;
		struct emb_wire_frame f;
		int rc, len, got;

		len = emb_wire_list_births_req_encode(
		    req, sizeof(req), ++rd->req_id, tb->remote, sl, k);
		if (len < 0)
			return len;
		rc = call(rd, req, len, &f);
		/* More rows than a frame holds: fewer slots at a time. */
		if (rc == EMB_ETOOBIG && chunk > 1) {
			chunk /= 2;
			continue;
		}
		if (!rc)
			rc = emb_wire_list_births_resp_decode(&f, &lb);
		if (!rc && lb.n != k)
			rc = EMB_EBADFRAME;
		if (rc)
			return rc;
		if (!map_hold(rd))
			return 0;
		got = emb_table_births_prune(t, sl, k, lb.marks, lb.ids,
					     lb.births, lb.m);
		map_release(rd);
		if (got < 0)
			return got;
		*removed += (uint64_t)got;
		rd->checked++;
		sl += k;
	}
	return 0;
}

/* Every run of slots that primary p holds and this rank checks, in table
 * tb. Errors are the round's (fail()); the next run goes on. */
static void check_table(struct round *rd, uint32_t p, const struct tab *tb)
{
	struct emb_server_table st;
	char what[EMB_WIRE_NAME_SIZE + 96];

	if (!tb->remote) {
		snprintf(what, sizeof(what), "table %s: primary %u has none",
			 tb->name, p);
		fail(rd, EMB_ENOTABLE, what);
		return;
	}
	if (emb_server_table_acquire(rd->s, tb->id, &st))
		return; /* dropped meanwhile */
	for (uint32_t sl = 0; sl < EMB_NSLOTS && !rd->stale;) {
		uint64_t removed = 0;
		uint32_t a = sl;
		int rc;

		if (!rd->mine[sl] || emb_cmap_primary(rd->m, sl) != p) {
			sl++;
			continue;
		}
		while (sl < EMB_NSLOTS && rd->mine[sl] &&
		       emb_cmap_primary(rd->m, sl) == p)
			sl++;
		rc = check_run(rd, st.t, tb, a, sl - a, &removed);
		if (rc) {
			snprintf(what, sizeof(what),
				 "table %s, slots %u-%u of primary %u",
				 tb->name, a, sl - 1, p);
			fail(rd, rc, what);
		}
		rd->removed += removed;
		if (removed)
			emb_log(EMB_LOG_INFO,
				"birth check: removed %llu rows of table %s "
				"in slots %u-%u that primary %u no longer has",
				(unsigned long long)removed, tb->name, a,
				sl - 1, p);
	}
	emb_server_table_release(&st);
}

/* The tables of rd->s that number their rows, into rd->tabs. */
static int local_tables(struct round *rd)
{
	uint32_t n = emb_server_table_ids(rd->s, NULL, 0);
	uint32_t *ids = calloc(n ? n : 1, sizeof(*ids));

	rd->tabs = calloc(n ? n : 1, sizeof(*rd->tabs));
	if (!ids || !rd->tabs) {
		free(ids);
		return -ENOMEM;
	}
	n = emb_server_table_ids(rd->s, ids, n);
	for (uint32_t i = 0; i < n; i++) {
		struct emb_server_table st;

		if (emb_server_table_acquire(rd->s, ids[i], &st))
			continue;
		if (emb_table_has_births(st.t)) {
			struct tab *tb = &rd->tabs[rd->ntabs++];

			tb->id = ids[i];
			snprintf(tb->name, sizeof(tb->name), "%s",
				 st.spec.name);
		}
		emb_server_table_release(&st);
	}
	free(ids);
	return 0;
}

/* One round (emb__bcheck_round()), with b to check the map against. */
static int round_run(struct emb_server *s, struct emb__bcheck *b,
		     const struct emb_cmap *m, uint32_t rank,
		     const struct emb_wire_node_addr *addrs, uint32_t naddrs,
		     uint64_t *removed)
{
	struct round *rd = calloc(1, sizeof(*rd));
	uint64_t t0 = emb_clock_ms();
	uint32_t nprim = 0, nslots = 0;
	bool any = false;
	int rc;

	if (!rd)
		return -ENOMEM;
	rd->s = s;
	rd->b = b;
	rd->m = m;
	rd->rank = rank;
	rd->lim = EMB_WIRE_LIMITS_DEFAULT;
	rd->lim.max_frame_bytes = RESP_MAX;
	rd->lim.max_tables = 1u << 20;
	rd->lim.max_dim = EMB_WIRE_DIM_MAX;
	/* The slots backed here whose copy is the primary's: not those this
	 * server is being filled with (the fill brings them) nor those
	 * copied ahead of a move. */
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		uint16_t p = emb_cmap_primary(m, sl);

		rd->mine[sl] = p != EMB_CMAP_NONE && p != rank && p < naddrs &&
			       emb_cmap_holds(m, sl, rank) &&
			       m->fill[sl] != rank &&
			       m->warm[sl] == EMB_CMAP_NONE;
		nslots += rd->mine[sl];
	}
	rc = nslots ? local_tables(rd) : 0;
	if (rc || !rd->ntabs)
		goto out;
	rd->cap = RESP_FIRST;
	rd->buf = aligned_alloc(64, rd->cap);
	if (!rd->buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t p = 0; p < naddrs && !rd->stale; p++) {
		char what[EMB_WIRE_HOST_MAX + 64];

		any = false;
		for (uint32_t sl = 0; sl < EMB_NSLOTS && !any; sl++)
			any = rd->mine[sl] && emb_cmap_primary(m, sl) == p;
		if (!any)
			continue;
		if (cut_short(rd))
			break;
		nprim++;
		rc = connect_to(rd, &addrs[p]);
		if (!rc)
			rc = remote_ids(rd);
		if (rc) {
			snprintf(what, sizeof(what), "primary %u (%s:%u)", p,
				 addrs[p].host, addrs[p].port);
			fail(rd, rc, what);
			disconnect(rd);
			continue;
		}
		for (uint32_t j = 0; j < rd->ntabs && !rd->stale; j++)
			check_table(rd, p, &rd->tabs[j]);
		disconnect(rd);
	}
	rc = rd->err;
	if (rd->stale)
		emb_log(EMB_LOG_DEBUG,
			"birth check: a new map came during the round (epoch "
			"%llu): the rest waits for the next",
			(unsigned long long)m->epoch);
	else if (!rd->removed)
		emb_log(EMB_LOG_DEBUG,
			"birth check: %u slots of %u tables against %u "
			"primaries, %u chunks, nothing removed (%llu ms)",
			nslots, rd->ntabs, nprim, rd->checked,
			(unsigned long long)(emb_clock_ms() - t0));
out:
	emb__count(&s->birth_checks, 1);
	emb__count(&s->births_pruned, (int64_t)rd->removed);
	if (removed)
		*removed += rd->removed;
	disconnect(rd);
	free(rd->buf);
	free(rd->tabs);
	free(rd);
	return rc;
}

int emb__bcheck_round(struct emb_server *s, const struct emb_cmap *m,
		      uint32_t rank, const struct emb_wire_node_addr *addrs,
		      uint32_t n, uint64_t *removed)
{
	return round_run(s, NULL, m, rank, addrs, n, removed);
}

/* The check thread: a round each period, against the last map given. */
static void *check_main(void *arg)
{
	struct emb__bcheck *b = arg;

	pthread_mutex_lock(&b->mu);
	for (;;) {
		struct emb_wire_node_addr *addrs;
		struct timespec dl;
		uint32_t n;

		clock_gettime(CLOCK_MONOTONIC, &dl);
		dl.tv_sec += (time_t)(b->period_ms / 1000);
		dl.tv_nsec += (long)(b->period_ms % 1000) * 1000000;
		dl.tv_sec += dl.tv_nsec / 1000000000;
		dl.tv_nsec %= 1000000000;
		while (!b->stop &&
		       pthread_cond_timedwait(&b->cv, &b->mu, &dl) != ETIMEDOUT)
			;
		if (b->stop)
			break;
		/* One copy of each slot: no backup, nothing to check. */
		if (!b->have_map || b->map->replicas < 2)
			continue;
		n = b->naddrs;
		addrs = malloc((n ? n : 1) * sizeof(*addrs));
		if (!addrs)
			continue;
		memcpy(addrs, b->addrs, n * sizeof(*addrs));
		*b->snap = *b->map;
		pthread_mutex_unlock(&b->mu);
		round_run(b->s, b, b->snap, b->rank, addrs, n, NULL);
		free(addrs);
		pthread_mutex_lock(&b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* EMB_BIRTH_CHECK_MS, or the default when unset or not a number. */
static uint64_t period_ms(void)
{
	const char *v = getenv("EMB_BIRTH_CHECK_MS");
	unsigned long long ms;
	char *end;

	if (!v || !*v)
		return EMB_BCHECK_PERIOD_MS;
	errno = 0;
	ms = strtoull(v, &end, 10);
	if (errno || *end || *v == '-' || ms > 86400000ull) {
		emb_log(
		    EMB_LOG_WARN,
		    "EMB_BIRTH_CHECK_MS=%s is no period in ms (0..86400000): "
		    "%u it is",
		    v, EMB_BCHECK_PERIOD_MS);
		return EMB_BCHECK_PERIOD_MS;
	}
	return ms;
}

int emb__bcheck_start(struct emb_server *s, uint32_t rank,
		      struct emb__bcheck **out)
{
	struct emb__bcheck *b = calloc(1, sizeof(*b));
	pthread_condattr_t ca;
	int rc;

	if (!b)
		return -ENOMEM;
	b->map = malloc(sizeof(*b->map));
	b->snap = malloc(sizeof(*b->snap));
	if (!b->map || !b->snap) {
		rc = -ENOMEM;
		goto err_free;
	}
	b->s = s;
	b->rank = rank;
	b->period_ms = period_ms();
	pthread_mutex_init(&b->mu, NULL);
	/* The waits must not jump with the wall clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (b->period_ms) {
		rc = emb_thread_start(&b->th, NULL, check_main, b,
				      "emb-bcheck");
		if (rc)
			goto err_destroy;
		b->th_on = true;
	}
	*out = b;
	return 0;

err_destroy:
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
err_free:
	free(b->snap);
	free(b->map);
	free(b);
	return rc;
}

int emb__bcheck_set_map(struct emb__bcheck *b, const struct emb_cmap *m,
			const struct emb_wire_node_addr *addrs, uint32_t n)
{
	struct emb_wire_node_addr *a = malloc((n ? n : 1) * sizeof(*a));

	if (!a)
		return -ENOMEM;
	memcpy(a, addrs, n * sizeof(*a));
	pthread_mutex_lock(&b->mu);
	*b->map = *m;
	b->have_map = true;
	free(b->addrs);
	b->addrs = a;
	b->naddrs = n;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

void emb__bcheck_stop(struct emb__bcheck *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	b->stop = true;
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	if (b->th_on)
		pthread_join(b->th, NULL);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b->addrs);
	free(b->snap);
	free(b->map);
	free(b);
}
