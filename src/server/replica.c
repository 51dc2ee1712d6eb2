/*
 * src/server/replica.c - a replicated server's side of recovery
 * (replica.h): the node agent's maps become the server's view
 * (emb_server_set_map), and the chunk this server is the source of is
 * streamed to the server being filled with it (emb_server_fill); when the
 * chunk is done the scheduler is told, and its next map lifts the fence.
 *
 * When a map takes slots away from this server (a move put them on
 * another), the sweeper thread frees their rows (emb_server_sweep_unheld()):
 * the view already refuses every read and write of them. It waits until
 * maps have taken nothing away for SWEEP_QUIET_MS (at most SWEEP_DEFER_MS
 * after the first): a join or a drain moves chunk after chunk, and a sweep
 * between them took a quarter of the machine's CPU from the moves and from
 * training (docs/benchmarks.md, "Moving slots"). A slot given back to this
 * server before its rows went (a drain right after a join can) has them
 * freed at once, before the map that gives it back takes effect: the copy
 * it is given overwrites the rows it carries and no other, so a row removed
 * meanwhile on the server that held it would come back (sweep_back()).
 *
 * With replicas only a slot's primary evicts (evict_hold()); the birth
 * check (bcheck.c), on a thread of its own, removes here the rows the
 * primaries of the slots this server backs evicted. Each map goes to it.
 *
 * Threads: on_map runs on the agent's thread, on_fill_done on the fill's,
 * on_newer_map on a loop's, sweep_main on its own; the mutex orders them.
 */
#include "server/replica.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cluster/map.h"
#include "cluster/node.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "server/bcheck.h"
#include "server/server.h"

struct emb_replica {
	pthread_mutex_t mu;	/* the agent's and the fill's threads */
	struct emb_server *srv; /* borrowed */
	struct emb_node *node;	/* borrowed */
	uint32_t rank;		/* this server's */
	bool have_prev;		/* prev holds a map */
	struct emb_cmap prev;	/* the last map taken */
	struct emb_wire_node_addr *addrs; /* its servers by rank; owned */
	uint32_t naddrs;		  /* entries of addrs */
	struct emb_server_map view;	  /* prev as this server sees it */
	uint32_t fill_first; /* first slot of the fill started last */
	uint32_t fill_n;     /* its slots */
	uint32_t fill_to;    /* rank it streams to */
	uint32_t fill_grew;  /* its slots' grew epoch: a new fill of the
				same chunk has another */
	uint64_t fence_ms;   /* when its fence went up, emb_clock_ms()
				(0: none held) */
	/* A move's copy ahead this server streams or streamed: its chunk,
	 * target and the epoch of the map that asked for it. The fenced
	 * stream of that chunk to that target sends only the rows written
	 * since when its map is the very next one (no death, no other
	 * change in between: the target still has the copy). */
	bool warm_on;	     /* started, its fenced stream not yet */
	bool warm_ok;	     /* and it finished */
	uint32_t warm_first, warm_n, warm_to;
	uint64_t warm_epoch;
	enum emb_server_fill_mode mode; /* of the fill started last */
	/* The last fill that failed and was reported: the map of that epoch
	 * asks for it still, but the coordinator aborts it in its next map
	 * and asks again later (after a wait, with a newer epoch); begun
	 * again meanwhile, a fill to a dead target would fail and be
	 * reported hundreds of times a second. */
	uint64_t failed_epoch; /* 0: none */
	uint32_t failed_first, failed_n, failed_to;
	pthread_t sweeper;   /* frees rows of slots given away */
	pthread_cond_t sweep_cv; /* signals sweep_due or stop, with mu;
				    waits on CLOCK_MONOTONIC */
	bool sweep_due;		 /* a map took slots away since the last */
	/* Slots maps took away whose rows may be here still: since the
	 * last sweep began (left), in the sweep under way (sweeping). */
	uint64_t left[EMB_NSLOTS / 64];
	uint64_t sweeping[EMB_NSLOTS / 64];
	uint64_t took_ms;  /* the last map that took slots away */
	uint64_t first_ms; /* the first since the last sweep began */
	uint64_t quiet_ms, defer_ms; /* SWEEP_QUIET_MS, SWEEP_DEFER_MS */
	bool sweeper_on;	 /* sweeper started */
	bool stop;		 /* destroy: the sweeper exits */
	struct emb__bcheck *bcheck; /* the backup's birth check, or NULL
				       (could not start) */
};

static void on_fill_done(void *arg, uint32_t first, uint32_t n, uint64_t epoch,
			 int status, uint64_t rows, uint64_t bytes);

/* Under r->mu: the copy ahead of a move this server is the source of in
 * the last map, unless it started it already. */
static void warm_check(struct emb_replica *r)
{
	uint32_t first, to, len;
	int rc;

	len = emb_cmap_warm_source(&r->prev, r->rank, &first, &to);
	if (!len || to >= r->naddrs) {
		/* A copy ahead whose move was given up or moved on: its
		 * tracking goes (the next copy ahead begins its own). */
		if (!len && r->warm_on) {
			r->warm_on = false;
			emb_server_untrack(r->srv);
		}
		return;
	}
	if (r->warm_on && first == r->warm_first && len == r->warm_n &&
	    to == r->warm_to)
		return; /* this copy: started already (or done) */
	rc = emb_server_fill(r->srv, r->addrs[to].host, r->addrs[to].port,
			     first, len, r->prev.epoch, EMB_SERVER_FILL_WARM,
			     on_fill_done, r);
	if (rc) {
		if (rc != -EBUSY)
			emb_log(EMB_LOG_WARN,
				"cannot copy slots %u-%u ahead: %s", first,
				first + len - 1, emb_strerror(rc));
		return;
	}
	r->mode = EMB_SERVER_FILL_WARM;
	r->warm_on = true;
	r->warm_ok = false;
	r->warm_first = first;
	r->warm_n = len;
	r->warm_to = to;
	r->warm_epoch = r->prev.epoch;
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: copying slots %u-%u ahead to server %u "
		"(%s:%u)",
		(unsigned long long)r->prev.epoch, first, first + len - 1, to,
		r->addrs[to].host, r->addrs[to].port);
}

/* Under r->mu: starts the fill this server is the source of in the last
 * map, unless it started it already; else a copy ahead. */
static void fill_check(struct emb_replica *r)
{
	enum emb_server_fill_mode mode = EMB_SERVER_FILL_FULL;
	uint32_t first, to, len;
	int rc;

	if (!r->have_prev)
		return;
	len = emb_cmap_fill_source(&r->prev, r->rank, &first, &to);
	if (!len) {
		warm_check(r);
		return;
	}
	if (to >= r->naddrs ||
	    (first == r->fill_first && len == r->fill_n && to == r->fill_to &&
	     r->view.grew[first] == r->fill_grew))
		return;
	if (r->prev.epoch == r->failed_epoch && first == r->failed_first &&
	    len == r->failed_n && to == r->failed_to)
		return; /* failed and told: the coordinator asks again */
	if (r->warm_on && r->warm_ok && first == r->warm_first &&
	    len == r->warm_n && to == r->warm_to &&
	    r->prev.epoch == r->warm_epoch + 1)
		mode = EMB_SERVER_FILL_DELTA;
	rc = emb_server_fill(r->srv, r->addrs[to].host, r->addrs[to].port,
			     first, len, r->prev.epoch, mode, on_fill_done, r);
	if (rc) {
		/* -EBUSY: the last fill is ending; its end looks again. */
		if (rc != -EBUSY)
			emb_log(EMB_LOG_WARN, "cannot stream slots %u-%u: %s",
				first, first + len - 1, emb_strerror(rc));
		return;
	}
	r->mode = mode;
	r->warm_on = false;
	r->fill_first = first;
	r->fill_n = len;
	r->fill_to = to;
	r->fill_grew = r->view.grew[first];
	r->fence_ms = emb_clock_ms();
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: streaming slots %u-%u to server "
		"%u (%s:%u)%s",
		(unsigned long long)r->prev.epoch, first, first + len - 1, to,
		r->addrs[to].host, r->addrs[to].port,
		mode == EMB_SERVER_FILL_DELTA
		    ? ": the rows written since the copy ahead"
		    : "");
}

/* The fill's thread: the chunk is done (or not); the scheduler moves on. */
static void on_fill_done(void *arg, uint32_t first, uint32_t n, uint64_t epoch,
			 int status, uint64_t rows, uint64_t bytes)
{
	struct emb_replica *r = arg;
	enum emb_server_fill_mode mode;
	int rc;

	pthread_mutex_lock(&r->mu);
	mode = r->mode;
	if (mode == EMB_SERVER_FILL_WARM && r->warm_on &&
	    first == r->warm_first && n == r->warm_n &&
	    epoch == r->warm_epoch)
		r->warm_ok = status == 0;
	pthread_mutex_unlock(&r->mu);
	rc = emb_node_fill_done(r->node, first, n, epoch, status,
				status ? 0 : rows, status ? 0 : bytes);
	/* The scheduler published the next step as it answered: take it
	 * now, not at the next heartbeat, so the fence comes down (or, after
	 * a copy ahead, goes up). Refused (a restarted scheduler moving the
	 * chunk again), or failed: this fill is not the one it waits for, so
	 * it is forgotten, and the map's next request of the same chunk
	 * starts afresh instead of counting as started already (its writers
	 * need not grow in between: a map that gave the chunk up may never
	 * reach this server). A failed copy ahead keeps its mark (warm_ok
	 * false): the fenced stream that follows sends the whole chunk. */
	if (rc == EMB_ECLUSTER ||
	    (status && mode != EMB_SERVER_FILL_WARM)) {
		pthread_mutex_lock(&r->mu);
		if (r->warm_on) {
			r->warm_on = false;
			emb_server_untrack(r->srv);
		}
		/* Failed, and the coordinator told: not begun again from the
		 * map that asked for it. A report that did not arrive (or was
		 * refused) leaves the map's request to this fill open, and
		 * it is begun again at once, as before. */
		if (status && !rc) {
			r->failed_epoch = epoch;
			r->failed_first = first;
			r->failed_n = n;
			/* fill_to is this fill's unless another began. */
			r->failed_to = first == r->fill_first &&
					       n == r->fill_n
					   ? r->fill_to
					   : UINT32_MAX;
		}
		r->fill_n = 0;
		pthread_mutex_unlock(&r->mu);
	}
	if (!rc || rc == EMB_ECLUSTER)
		emb_node_map_refresh(r->node);
	emb_log(rc ? EMB_LOG_WARN : EMB_LOG_INFO,
		"slots %u-%u %s (%llu rows%s%s%s): %s %s", first,
		first + n - 1,
		mode == EMB_SERVER_FILL_WARM ? "copied ahead" : "streamed",
		(unsigned long long)rows,
		mode == EMB_SERVER_FILL_DELTA ? " written since the copy ahead"
					      : "",
		status ? ", " : "", status ? emb_strerror(status) : "",
		emb_node_coord(r->node) ? "coordinator" : "scheduler",
		rc ? emb_strerror(rc) : "told");
	pthread_mutex_lock(&r->mu);
	fill_check(r);
	pthread_mutex_unlock(&r->mu);
}

/*
 * Under r->mu: the slots this server may not evict in
 * (emb_cmap_evict_hold_rank()). With replicas, those it is not the
 * primary of and those being copied ahead: a primary evicts alone, by the
 * pulls only it sees, and its backups carry its evictions out by their
 * birth check (bcheck.c). With one copy of each slot, those another
 * server writes too or that are being copied ahead; with no move, none,
 * and eviction works as on a lone server. Set before any fill of m
 * starts.
 */
static void evict_hold(struct emb_replica *r, const struct emb_cmap *m)
{
	uint64_t set[EMB_NSLOTS / 64];

	emb_cmap_evict_hold_rank(m, r->rank, set);
	emb_server_evict_hold(r->srv, set);
}

/*
 * Under r->mu, before m takes effect: the slots m gives this server
 * (held, filled or copied ahead to it) that an earlier map took away and
 * whose rows no sweep has freed yet. Their rows go now, under the view
 * that does not keep them: the copy the move brings overwrites the rows
 * it carries only, and a row removed on the other server while this one
 * did not hold the slot would come back.
 */
static void sweep_back(struct emb_replica *r, const struct emb_cmap *m)
{
	uint64_t back[EMB_NSLOTS / 64] = {0}, any = 0, t0;
	int64_t n;

	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		uint64_t bit = 1ull << (sl % 64);

		if (!((r->left[sl / 64] | r->sweeping[sl / 64]) & bit))
			continue;
		if (m->fill[sl] == r->rank || m->warm[sl] == r->rank ||
		    emb_cmap_holds(m, sl, r->rank)) {
			back[sl / 64] |= bit;
			any = 1;
		}
	}
	if (!any)
		return;
	t0 = emb_clock_ms();
	n = emb_server_sweep_unheld(r->srv, back);
	if (n < 0) {
		emb_log(EMB_LOG_WARN,
			"map epoch %llu: cannot free the rows of slots given "
			"back: %s",
			(unsigned long long)m->epoch, emb_strerror((int)n));
		/* Out of memory only. The rows stay: the view this map
		 * sets keeps the slot, so no later sweep frees them either,
		 * as before this check existed. */
		return;
	}
	for (uint32_t w = 0; w < EMB_NSLOTS / 64; w++) {
		r->left[w] &= ~back[w];
		r->sweeping[w] &= ~back[w];
	}
	emb_log(EMB_LOG_INFO,
		"map epoch %llu: freed %lld rows of slots given back before "
		"their copy (%llu ms)",
		(unsigned long long)m->epoch, (long long)n,
		(unsigned long long)(emb_clock_ms() - t0));
}

/* Agent thread: a newer map. */
static void on_map(void *arg, const struct emb_cmap *m,
		   const struct emb_wire_node_addr *srv, uint32_t n)
{
	struct emb_replica *r = arg;
	struct emb_wire_node_addr *a = calloc(n, sizeof(*a));
	bool took = false;

	if (!a)
		return;
	memcpy(a, srv, n * sizeof(*a));
	pthread_mutex_lock(&r->mu);
	/* A server left the map (a failover, a drain's end): one line, the
	 * view this server checks writes against changed with it. */
	for (uint32_t i = 0; r->have_prev && i < n && i < r->prev.nservers;
	     i++) {
		if (!emb_cmap_in_map(&r->prev, i) || emb_cmap_in_map(m, i))
			continue;
		emb_log(EMB_LOG_INFO,
			"map epoch %llu: server %u left the map; this server "
			"checks writes against it",
			(unsigned long long)m->epoch, i);
		break;
	}
	/* Slots this server held, or was copied ahead, and holds no
	 * longer: their rows go, in the background once the maps settle. */
	for (uint32_t sl = 0; r->have_prev && sl < EMB_NSLOTS; sl++)
		if ((r->view.slot[sl] &
		     (EMB_CMAP_VIEW_MINE | EMB_CMAP_VIEW_WARMING)) &&
		    m->fill[sl] != r->rank && m->warm[sl] != r->rank &&
		    !emb_cmap_holds(m, sl, r->rank)) {
			r->left[sl / 64] |= 1ull << (sl % 64);
			took = true;
		}
	if (took) {
		r->took_ms = emb_clock_ms();
		if (!r->sweep_due)
			r->first_ms = r->took_ms;
		r->sweep_due = true;
		pthread_cond_signal(&r->sweep_cv);
	}
	sweep_back(r, m);
	emb_cmap_view(m, r->have_prev ? &r->prev : NULL, r->view.grew, r->rank,
		      r->view.slot, r->view.grew);
	r->view.epoch = m->epoch;
	r->view.share = emb_cmap_share(m);
	/* The last fill's fence is down once its chunk has no fill: how
	 * long writes to it waited here (docs/replication.md, Figures). */
	if (r->fence_ms && m->fill[r->fill_first] != r->fill_to) {
		emb_log(EMB_LOG_INFO,
			"fence on slots %u-%u lifted after %llu ms",
			r->fill_first, r->fill_first + r->fill_n - 1,
			(unsigned long long)(emb_clock_ms() - r->fence_ms));
		r->fence_ms = 0;
	}
	/* Promoted where it was a backup: births there go past any its old
	 * primary may have given, before the map takes writes. */
	if (r->have_prev) {
		uint64_t set[EMB_NSLOTS / 64];
		uint32_t np = emb_cmap_promoted(&r->prev, m, r->rank, set);

		if (np && emb_server_births_raise(r->srv, set))
			emb_log(EMB_LOG_INFO,
				"map epoch %llu: primary of %u slots it was a "
				"backup of: their births go on past its old "
				"primary's",
				(unsigned long long)m->epoch, np);
	}
	/* Where it is the primary, a push naming the birth of a row it
	 * evicted since is dropped (its backups' copies go at their next
	 * check), before the map takes writes. */
	{
		uint64_t set[EMB_NSLOTS / 64] = {0};

		for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
			if (emb_cmap_primary(m, sl) == r->rank)
				set[sl / 64] |= 1ull << (sl % 64);
		emb_server_lead(r->srv, set);
	}
	r->prev = *m;
	r->have_prev = true;
	free(r->addrs);
	r->addrs = a;
	r->naddrs = n;
	/* Fences first: when this returns, no write to a fenced chunk is
	 * still being applied, so the fill reads final rows. */
	emb_server_set_map(r->srv, &r->view);
	evict_hold(r, m);
	if (r->bcheck && emb__bcheck_set_map(r->bcheck, m, a, n))
		emb_log(EMB_LOG_WARN,
			"map epoch %llu: the birth check keeps the last map: "
			"out of memory",
			(unsigned long long)m->epoch);
	fill_check(r);
	pthread_mutex_unlock(&r->mu);
}

/* A loop thread: a write carried a newer epoch than the view's. */
static void on_newer_map(void *arg, uint64_t epoch)
{
	struct emb_replica *r = arg;

	(void)epoch;
	emb_node_map_refresh(r->node);
}

/*
 * The sweeper: frees the rows of slots maps took away, once they have
 * taken nothing for SWEEP_QUIET_MS, or SWEEP_DEFER_MS after the first
 * such map, whichever comes first: once per join or drain, not once per
 * chunk, and never long after. Rows are freed that much later; a server
 * under --mem-limit makes new rows in their place only after.
 * EMB_SWEEP_QUIET_MS sets the first (the second is then at least as
 * long): tests/cluster/give_back.sh keeps every sweep back with it.
 */
#define SWEEP_QUIET_MS 2000u
#define SWEEP_DEFER_MS 20000u
/*
 * The sweeper runs at the lowest priority (nice 19, its thread alone):
 * nothing waits for its rows to go, and at nice 0 it took a core from
 * training for a second after each join at 10M rows, the steps' p99
 * 1.9 to 3.3x its value before the moves; at 19, 1.5 to 1.7x in three
 * runs of four, the sweeps 1.3 to 3.1x as long (docs/replication.md,
 * "Why the sweep waits"). It keeps a shard for at most 256 rows, so a
 * step that meets it preempted waits for a short hold only. It holds the
 * view's read lock over an erase of up to 4,096 ids (server.c), which a
 * new map's write lock then waits for; cut to 256, the erase no longer
 * let the waiting batches in between its holds and the sweep ran as if
 * at nice 0 (steps' p99 13 and 15 ms in two runs, sweeps of 1.3 s,
 * against 6.7 ms and 2.6 s in one run at 4,096).
 */
#define SWEEP_NICE 19
static void *sweep_main(void *arg)
{
	struct emb_replica *r = arg;

	/* Per thread on Linux: this thread's nice value alone. */
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), SWEEP_NICE))
		emb_log(EMB_LOG_DEBUG, "sweeper: nice %d: %s", SWEEP_NICE,
			strerror(errno));
	pthread_mutex_lock(&r->mu);
	for (;;) {
		uint64_t t0, at;
		int64_t n;

		while (!r->sweep_due && !r->stop)
			pthread_cond_wait(&r->sweep_cv, &r->mu);
		if (r->stop)
			break;
		at = r->took_ms + r->quiet_ms;
		if (at > r->first_ms + r->defer_ms)
			at = r->first_ms + r->defer_ms;
		t0 = emb_clock_ms();
		if (t0 < at) {
			struct timespec dl;

			clock_gettime(CLOCK_MONOTONIC, &dl);
			dl.tv_sec += (time_t)((at - t0) / 1000);
			dl.tv_nsec += (long)((at - t0) % 1000) * 1000000;
			if (dl.tv_nsec >= 1000000000) {
				dl.tv_sec++;
				dl.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&r->sweep_cv, &r->mu, &dl);
			continue;
		}
		r->sweep_due = false;
		memcpy(r->sweeping, r->left, sizeof(r->left));
		memset(r->left, 0, sizeof(r->left));
		pthread_mutex_unlock(&r->mu);
		t0 = emb_clock_ms();
		n = emb_server_sweep_unheld(r->srv, NULL);
		if (n < 0)
			emb_log(EMB_LOG_WARN,
				"cannot free the rows of slots moved away: %s",
				emb_strerror((int)n));
		else if (n > 0)
			emb_log(EMB_LOG_INFO,
				"freed %lld rows of slots moved to other "
				"servers (%llu ms)",
				(long long)n,
				(unsigned long long)(emb_clock_ms() - t0));
		pthread_mutex_lock(&r->mu);
		memset(r->sweeping, 0, sizeof(r->sweeping));
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int emb_replica_create(struct emb_server *s, struct emb_node *n,
		       struct emb_replica **out)
{
	struct emb_replica *r = calloc(1, sizeof(*r));
	int rc;

	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->mu, NULL);
	r->quiet_ms = SWEEP_QUIET_MS;
	{
		const char *q = getenv("EMB_SWEEP_QUIET_MS");
		char *end;
		unsigned long long v;

		if (q && *q) {
			errno = 0;
			v = strtoull(q, &end, 10);
			if (!errno && !*end && v <= 86400000ull)
				r->quiet_ms = v;
			else
				emb_log(EMB_LOG_WARN,
					"EMB_SWEEP_QUIET_MS=%s: not a number "
					"of ms up to a day; %u used",
					q, SWEEP_QUIET_MS);
		}
	}
	r->defer_ms = r->quiet_ms > SWEEP_DEFER_MS ? r->quiet_ms
						   : SWEEP_DEFER_MS;
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&r->sweep_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	r->sweeper_on = emb_thread_start(&r->sweeper, NULL, sweep_main, r,
					 "emb-rsweep") == 0;
	r->srv = s;
	r->node = n;
	r->rank = emb_node_rank(n);
	/* Without it backups keep the rows their primaries evicted, and
	 * training goes on: it costs memory, never a wrong row. */
	rc = emb__bcheck_start(s, r->rank, &r->bcheck);
	if (rc)
		emb_log(EMB_LOG_WARN,
			"birth check not started: %s; backups keep the rows "
			"their primaries evict",
			emb_strerror(rc));
	emb_server_on_newer_map(s, on_newer_map, r);
	emb_node_watch_map(n, on_map, r);
	*out = r;
	return 0;
}

void emb_replica_destroy(struct emb_replica *r)
{
	if (!r)
		return;
	/* The agent first: its map callbacks use the server. */
	emb_node_watch_map(r->node, NULL, NULL);
	emb_server_on_newer_map(r->srv, NULL, NULL);
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_signal(&r->sweep_cv);
	pthread_mutex_unlock(&r->mu);
	if (r->sweeper_on)
		pthread_join(r->sweeper, NULL);
	/* After the agent: no map reaches it any more. */
	emb__bcheck_stop(r->bcheck);
	pthread_cond_destroy(&r->sweep_cv);
	pthread_mutex_destroy(&r->mu);
	free(r->addrs);
	free(r);
}
