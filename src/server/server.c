/*
 * src/server/server.c - the server's life: create (the tables' registry,
 * the loops, the listener, the reaper and sweeper threads), a graceful
 * stop, destroy, and the public calls that read its counters or hand
 * replication work to slots.c and fill.c. The request path is in conn.c,
 * handlers.c and reply.c, the table registry in tables.c (server_int.h
 * says who calls whom). create/stop/destroy run on one controlling
 * thread; the rest says which threads may call it.
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/thread.h"

#include "server/fill.h"
#include "server/lat.h"
#include "server/replybuf.h"
#include "server/session.h"
#include "server/slots.h"

static uint64_t random_id(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
	       ((uint64_t)getpid() << 40);
}

int emb_server_create(const struct emb_server_opts *opts,
		      struct emb_server **out)
{
	struct emb_transport_opts topts = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_listen_opts lopts = EMB_LISTEN_OPTS_DEFAULT;
	struct emb_server *s;
	pthread_condattr_t ca;
	char tname[16];
	uint32_t i;
	int rc;

	if (!opts || !out || !opts->host || !opts->transport ||
	    opts->threads == 0 || opts->threads > 256 ||
	    opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token) ||
	    opts->admin_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->admin_token_len && !opts->admin_token) ||
	    emb_wire_limits_validate(&opts->limits))
		return -EINVAL;
	/* A tier needs a bound to keep DRAM under (docs/store.md). Remote
	 * reads go with it: LOCATE finds only rows in DRAM, the client
	 * pulls cold ones two-sided, and a record a row left for the device
	 * fails the seal check as an erased row's does. */
	if (opts->tier_dir && !opts->mem_limit) {
		emb_log(EMB_LOG_ERROR, "a device tier needs a memory limit");
		return -EINVAL;
	}
	if (opts->tier_dir) {
		rc = emb__tier_dir_sweep(opts->tier_dir);
		if (rc)
			return rc;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->opts = *opts;
	/* Upward calls of tables.c and handlers.c (server_int.h). */
	s->sync_ack = emb__reply_sync_ack;
	s->conn_drain = emb__conn_drain;
	s->host = strdup(opts->host);
	s->transport = strdup(opts->transport);
	s->tier_dir = opts->tier_dir ? strdup(opts->tier_dir) : NULL;
	s->opts.tier_dir = s->tier_dir;
	s->tables = calloc(opts->limits.max_tables, sizeof(*s->tables));
	s->loops = calloc(opts->threads, sizeof(*s->loops));
	s->threads = calloc(opts->threads, sizeof(*s->threads));
	s->lat = calloc((size_t)opts->threads * EMB_LAT_NOPS, sizeof(*s->lat));
	s->loop_conns = calloc(opts->threads, sizeof(*s->loop_conns));
	s->rpools = calloc(opts->threads, sizeof(*s->rpools));
	s->lstate = aligned_alloc(64, opts->threads * sizeof(*s->lstate));
	if (s->lstate) {
		memset(s->lstate, 0, opts->threads * sizeof(*s->lstate));
		for (i = 0; i < opts->threads; i++) {
			struct srv_loop *l = &s->lstate[i];

			l->s = s;
			l->index = i;
			l->sweep.fn = emb__sweep_run;
			l->sweep.arg = l;
			l->tabs =
			    calloc(opts->limits.max_tables, sizeof(*l->tabs));
			l->pins =
			    calloc(opts->limits.max_tables, sizeof(*l->pins));
			l->gone =
			    calloc(opts->limits.max_tables, sizeof(*l->gone));
			if (!l->tabs || !l->pins || !l->gone) {
				rc = -ENOMEM;
				goto err_free;
			}
		}
	}
	if (!s->host || !s->transport || (opts->tier_dir && !s->tier_dir) ||
	    !s->tables || !s->loops ||
	    !s->threads || !s->lat || !s->loop_conns || !s->rpools ||
	    !s->lstate || emb__sessions_create(&s->sessions) ||
	    emb__slots_create(&s->slots) || emb__fill_create(&s->fill) ||
	    emb_authlimit_create(&s->authlimit)) {
		rc = -ENOMEM;
		goto err_free;
	}
	s->opts.host = s->host;
	s->opts.transport = s->transport;
	s->opts.auth_token = s->token;
	if (opts->auth_token_len)
		memcpy(s->token, opts->auth_token, opts->auth_token_len);
	s->opts.admin_token = s->admin_token;
	if (opts->admin_token_len)
		memcpy(s->admin_token, opts->admin_token,
		       opts->admin_token_len);
	s->budget.limit = opts->mem_limit;
	s->rx_budget.limit = opts->conn_mem_limit;
	if (!s->rx_budget.limit && !opts->mem_limit)
		s->rx_budget.limit = 1ull << 30;
	else if (!s->rx_budget.limit)
		s->rx_budget.limit = opts->mem_limit / 4 < (64u << 20)
					 ? 64u << 20
					 : opts->mem_limit / 4;
	s->server_id = random_id();
	pthread_rwlock_init(&s->tables_lock, NULL);
	pthread_mutex_init(&s->reap_mu, NULL);
	pthread_cond_init(&s->reap_cv, NULL);
	/* The sweeper's waits must not jump with the wall clock. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->sweep_cv, &ca);
	pthread_condattr_destroy(&ca);
	s->rdma = strstr(opts->transport, "rdma") != NULL;
	s->dual = s->rdma && strstr(opts->transport, "tcp") != NULL;
	/* Before the listener exists, so no client sees a partial state. */
	if (opts->on_start) {
		rc = opts->on_start(s, opts->start_arg);
		if (rc)
			goto err_loops;
	}

	topts.max_frame_bytes = opts->limits.max_frame_bytes;
	if (EMB_SERVER_LOGIN_FRAME < topts.max_frame_bytes)
		topts.login_frame_bytes = EMB_SERVER_LOGIN_FRAME;
	topts.rx_budget = &s->rx_budget;
	topts.reject_encode = emb_wire_reject_encode;
	topts.frame_timeout_ms = opts->frame_timeout_ms;
	for (i = 0; i < opts->threads; i++) {
		rc =
		    emb_transport_create(opts->transport, &topts, &s->loops[i]);
		if (rc)
			goto err_loops;
	}
	lopts.host = s->host;
	lopts.port = opts->port;
	lopts.loops = s->loops;
	lopts.nloops = opts->threads;
	lopts.on_request = emb__conn_on_request;
	lopts.on_open = emb__conn_on_open;
	lopts.on_close = emb__conn_on_close;
	/* Every worker of a job connects at once when it forms: the kernel
	 * caps this at net.core.somaxconn; 128 drops SYNs under a few
	 * hundred workers, and a dropped SYN costs a 1 s retransmit. */
	lopts.backlog = 4096;
	lopts.arg = s;
	rc = emb_listener_create(s->loops[0], &lopts, &s->listener);
	if (rc)
		goto err_loops;
	s->port = emb_listener_port(s->listener);
	for (i = 0; i < opts->threads; i++) {
		snprintf(tname, sizeof(tname), "emb-loop%u",
			 (unsigned)(uint8_t)i); /* threads <= 256 */
		rc = emb_thread_start(&s->threads[i], NULL, emb__loop_main,
				      &s->lstate[i], tname);
		if (rc)
			goto err_threads;
		s->nstarted++;
	}
	if (s->rdma) {
		rc = emb__tables_reaper_start(s);
		if (rc)
			goto err_threads;
	}
	if (opts->handshake_timeout_ms || opts->idle_timeout_ms) {
		rc = emb__sweeper_start(s);
		if (rc)
			goto err_reaper;
	}
	*out = s;
	return 0;

err_reaper:
	emb__tables_reaper_stop(s);
err_threads:
	for (i = 0; i < s->nstarted; i++) {
		emb__loop_stop(s, i);
		pthread_join(s->threads[i], NULL);
	}
	emb_listener_destroy(s->listener);
err_loops:
	for (i = 0; i < opts->threads; i++)
		emb_transport_destroy(s->loops[i]);
	emb__tables_fini(s);
	pthread_rwlock_destroy(&s->tables_lock);
err_free:
	for (i = 0; s->lstate && i < opts->threads; i++)
		emb__tables_loop_fini(&s->lstate[i]);
	free(s->lstate);
	for (i = 0; s->rpools && i < opts->threads; i++)
		emb__rbuf_pool_fini(&s->rpools[i]);
	free(s->rpools);
	free(s->loop_conns);
	emb_authlimit_destroy(s->authlimit);
	emb__sessions_destroy(s->sessions);
	emb__slots_destroy(s->slots);
	emb__fill_destroy(s->fill);
	free(s->lat);
	free(s->threads);
	free(s->loops);
	free(s->tables);
	free(s->transport);
	free(s->tier_dir);
	free(s->host);
	free(s);
	return rc;
}

uint16_t emb_server_port(const struct emb_server *s)
{
	return s->port;
}

static void destroy_listener_task(void *arg)
{
	struct emb_server *s = arg;

	emb_listener_destroy(s->listener);
	/* emb_server_stop() polls this from the controlling thread. */
	__atomic_store_n(&s->listener, NULL, __ATOMIC_RELEASE);
}

void emb_server_stop(struct emb_server *s, uint32_t grace_ms)
{
	struct timespec ts = {0, 5 * 1000 * 1000};

	if (!s || s->stopped)
		return;
	s->stopped = true;
	emb__sweeper_stop(s);
	/* A fill reads tables: it ends before they can go. */
	emb__fill_stop(s->fill);
	/* The listener belongs to loop 0's thread. */
	if (emb_transport_exec(s->loops[0], destroy_listener_task, s) == 0) {
		for (uint32_t waited = 0; waited < 2000; waited += 5) {
			if (!__atomic_load_n(&s->listener, __ATOMIC_ACQUIRE))
				break;
			nanosleep(&ts, NULL);
		}
	}
	for (uint32_t waited = 0; waited < grace_ms; waited += 5) {
		if (emb__inflight(s) <= 0)
			break;
		nanosleep(&ts, NULL);
	}
	/* One more round so replies just posted reach the socket. */
	nanosleep(&ts, NULL);
	/* The reaper waits on the loops: it finishes while they still run. */
	emb__tables_reaper_stop(s);
	for (uint32_t i = 0; i < s->nstarted; i++)
		emb__loop_stop(s, i);
	for (uint32_t i = 0; i < s->nstarted; i++)
		pthread_join(s->threads[i], NULL);
	s->nstarted = 0;
	__atomic_store_n(&s->loops_stopped, true, __ATOMIC_RELEASE);
}

void emb_server_destroy(struct emb_server *s)
{
	if (!s)
		return;
	emb_server_stop(s, 1000);
	if (s->listener)
		emb_listener_destroy(s->listener);
	emb__tables_quiesce(s);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb_transport_destroy(s->loops[i]);
	/* Every reply has completed now, its buffer back in its pool, and
	 * its table use ended. */
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb__rbuf_pool_fini(&s->rpools[i]);
	free(s->rpools);
	emb__tables_fini(s);
	free(s->lstate);
	pthread_rwlock_destroy(&s->tables_lock);
	pthread_cond_destroy(&s->reap_cv);
	pthread_cond_destroy(&s->sweep_cv);
	pthread_mutex_destroy(&s->reap_mu);
	free(s->loop_conns);
	emb__sessions_destroy(s->sessions);
	emb__slots_destroy(s->slots);
	emb__fill_destroy(s->fill);
	emb_authlimit_destroy(s->authlimit);
	free(s->lat);
	free(s->threads);
	free(s->loops);
	free(s->tables);
	free(s->transport);
	free(s->tier_dir);
	free(s->host);
	free(s);
}

void emb_server_stats(struct emb_server *s, struct emb_server_stats *out)
{
	uint64_t n = emb__tables_count(s);

	out->conns_open = __atomic_load_n(&s->conns_open, __ATOMIC_RELAXED);
	out->conns_total = __atomic_load_n(&s->conns_total, __ATOMIC_RELAXED);
	out->requests = __atomic_load_n(&s->requests, __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		out->requests += (uint64_t)__atomic_load_n(
		    &s->lstate[i].requests, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&s->errors, __ATOMIC_RELAXED);
	out->tables = n;
	out->mem_used = __atomic_load_n(&s->budget.used, __ATOMIC_RELAXED);
	out->mem_limit = s->budget.limit;
	out->conn_bytes = __atomic_load_n(&s->rx_budget.used, __ATOMIC_RELAXED);
	out->conns_refused =
	    __atomic_load_n(&s->conns_refused, __ATOMIC_RELAXED) +
	    __atomic_load_n(&s->rx_budget.refused, __ATOMIC_RELAXED);
	out->conns_timed_out =
	    __atomic_load_n(&s->conns_timed_out, __ATOMIC_RELAXED);
	out->nonfinite = __atomic_load_n(&s->nonfinite, __ATOMIC_RELAXED);
	out->not_admin = __atomic_load_n(&s->not_admin, __ATOMIC_RELAXED);
	out->birth_checks = __atomic_load_n(&s->birth_checks, __ATOMIC_RELAXED);
	out->births_pruned =
	    __atomic_load_n(&s->births_pruned, __ATOMIC_RELAXED);
	{
		uint64_t pc[3];

		emb__fill_pace_counts(s->fill, pc);
		out->pace_reports = pc[0];
		out->pace_cuts = pc[1];
		out->pace_rate = pc[2];
	}
}

uint32_t emb_server_nloops(const struct emb_server *s)
{
	return s->opts.threads;
}

void emb_server_loop_stats(struct emb_server *s, uint32_t i,
			   struct emb_transport_stats *out)
{
	emb_transport_stats(s->loops[i], out);
}

void emb_server_latency(struct emb_server *s, uint32_t op, struct emb_hist *out)
{
	emb_hist_reset(out);
	for (uint32_t i = 0; i < s->opts.threads; i++)
		emb_lat_merge(out, &s->lat[(size_t)i * EMB_LAT_NOPS + op]);
}

int emb_server_set_map(struct emb_server *s, const struct emb_server_map *m)
{
	return emb__slots_set(s->slots, m);
}

/* Rows read per step of a sweep, and erased per batch. */
#define SWEEP_SCAN 4096u

/*
 * Table id's rows in slots this server does not hold. Only those slots'
 * rows are walked (by the store's record slots), and only their ids are
 * read: with a third of a table's slots given away, the sweep reads a
 * third of its records, not every row whole.
 */
static int64_t sweep_table(struct emb_server *s, uint32_t id,
			   const uint64_t *unheld)
{
	struct emb_server_table st;
	struct emb_table_iter *it = NULL;
	uint64_t *drop = NULL, ndrop = 0, cap = 0;
	int64_t freed = 0;
	int got = 1, rc;

	if (emb_server_table_acquire(s, id, &st))
		return 0; /* dropped meanwhile */
	rc = emb_table_iter_create(st.t, &it);
	if (!rc)
		rc = emb_table_iter_slot_set(it, unheld);
	/* The ids first, erased after: the iterator reads shard by shard
	 * and an erase under it could skip rows. Read straight into the
	 * list, with room for a whole step. */
	while (!rc && got > 0) {
		if (cap - ndrop < SWEEP_SCAN) {
			uint64_t *d;

			cap = cap ? 2 * cap : 2 * SWEEP_SCAN;
			d = realloc(drop, cap * sizeof(*d));
			if (!d) {
				rc = -ENOMEM;
				break;
			}
			drop = d;
		}
		got = emb_table_iter_next(it, drop + ndrop, NULL, NULL,
					  SWEEP_SCAN);
		if (got > 0)
			ndrop += (uint64_t)got;
	}
	emb_table_iter_destroy(it);
	/* emb__slots_drop() checks each id against the view again: a slot
	 * given back to this server meanwhile keeps its rows. */
	for (uint64_t i = 0; !rc && i < ndrop; i += SWEEP_SCAN) {
		uint32_t k = ndrop - i < SWEEP_SCAN ? (uint32_t)(ndrop - i)
						    : SWEEP_SCAN;
		int64_t n = emb__slots_drop(s->slots, st.t, drop + i, k);

		if (n < 0)
			rc = (int)n;
		else
			freed += n;
	}
	free(drop);
	emb_server_table_release(&st);
	return rc ? rc : freed;
}

int64_t emb_server_sweep_unheld(struct emb_server *s, const uint64_t *only)
{
	uint32_t nt = emb_server_table_ids(s, NULL, 0), *tids;
	uint64_t unheld[EMB_NSLOTS / 64];
	int64_t freed = 0;

	tids = calloc(nt ? nt : 1, sizeof(*tids));
	if (!tids)
		return -ENOMEM;
	nt = emb_server_table_ids(s, tids, nt);
	/* Nothing given away (or no view yet): nothing to walk. */
	if (!emb__slots_unheld(s->slots, unheld))
		nt = 0;
	if (only) {
		uint64_t any = 0;

		for (uint32_t w = 0; w < EMB_NSLOTS / 64; w++)
			any |= unheld[w] &= only[w];
		if (!any)
			nt = 0;
	}
	for (uint32_t i = 0; i < nt; i++) {
		int64_t n = sweep_table(s, tids[i], unheld);

		if (n < 0) {
			freed = n;
			break;
		}
		freed += n;
	}
	free(tids);
	return freed;
}

void emb_server_on_newer_map(struct emb_server *s,
			     void (*fn)(void *arg, uint64_t epoch), void *arg)
{
	emb__slots_hook(s->slots, fn, arg);
}

int emb_server_fill(struct emb_server *s, const char *host, uint16_t port,
		    uint32_t first, uint32_t n, uint64_t epoch,
		    enum emb_server_fill_mode mode, emb_server_fill_fn done,
		    void *arg)
{
	struct emb__fill_req r = {
	    .host = host,
	    .port = port,
	    .first = first,
	    .n = n,
	    .epoch = epoch,
	    .mode = mode,
	    .rate = mode == EMB_SERVER_FILL_WARM ? s->opts.move_rate : 0,
	    .bound_milli = mode == EMB_SERVER_FILL_WARM
			       ? (uint32_t)(s->opts.move_bound * 1000.0 + 0.5)
			       : 0,
	    .token = s->opts.auth_token_len ? s->token : NULL,
	    .token_len = s->opts.auth_token_len,
	    .done = done,
	    .arg = arg,
	};

	if (s->stopped)
		return -ECANCELED;
	return emb__fill_start(s->fill, s, &r);
}

void emb_server_untrack(struct emb_server *s)
{
	emb__fill_untrack(s);
}

void emb_server_map_counts(struct emb_server *s, uint64_t out[2])
{
	emb__slots_counts(s->slots, out);
}
