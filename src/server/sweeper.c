/*
 * src/server/sweeper.c - handshake and idle timeouts. Before its HELLO
 * succeeds a connection has handshake_timeout_ms to log in; after it,
 * idle_timeout_ms without a request closes it. A sweeper thread posts a
 * check to every loop a few times per timeout; each loop walks its own
 * connections, so no lock guards them. emb__sweeper_start/stop are for the
 * server's controlling thread; emb__sweep_run runs on a loop thread.
 */
#include "server/server_int.h"

#include <errno.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"

void emb__sweep_run(void *arg)
{
	struct srv_loop *l = arg;
	struct emb_server *s = l->s;
	const uint64_t hs_ns = (uint64_t)s->opts.handshake_timeout_ms * 1000000;
	const uint64_t idle_ns = (uint64_t)s->opts.idle_timeout_ms * 1000000;
	uint64_t now = emb_clock_ns();
	struct srv_conn *sc, *next;
	uint32_t loop = l->index;

	/* From here the sweeper may post the task again. */
	__atomic_store_n(&l->sweep_queued, false, __ATOMIC_RELEASE);
	/* Tasks left at destroy run while the conns are being torn down. */
	if (__atomic_load_n(&s->loops_stopped, __ATOMIC_ACQUIRE))
		return;
	for (sc = s->loop_conns[loop]; sc; sc = next) {
		struct emb_conn_stats cs;
		const char *why = NULL;

		next = sc->next; /* closing sc may free it */
		if (!sc->c || sc->closing)
			continue;
		if (!sc->hello) {
			if (hs_ns && now - sc->opened_ns > hs_ns)
				why = "no HELLO within the handshake timeout";
		} else if (idle_ns && now - sc->last_ns > idle_ns &&
			   !sc->held && !sc->zc_replies) {
			/* A request still held (a synchronous step) or a
			 * reply still queued is not idleness. */
			emb_conn_stats(sc->c, &cs);
			if (cs.inflight == 0 && cs.out_queued == 0)
				why = "idle timeout";
		}
		if (!why)
			continue;
		emb__count(&s->conns_timed_out, 1);
		emb_log(EMB_LOG_WARN, "%s: closing: %s", emb_conn_peer(sc->c),
			why);
		/* A login still arriving is answered why (the transport
		 * refuses the frame being read, or the next header within a
		 * second); an idle conn has nothing to answer. */
		if (!sc->hello &&
		    emb_conn_refuse(sc->c, -ETIMEDOUT, why) == 0) {
			sc->closing = true;
			continue;
		}
		emb_conn_close(sc->c, -ETIMEDOUT);
	}
}

/* Posts emb__sweep_run to every loop a few times per timeout until stopped. */
static void *sweeper_main(void *arg)
{
	struct emb_server *s = arg;
	uint32_t t = s->opts.handshake_timeout_ms;
	uint64_t period_ms;
	struct timespec dl;

	if (!t || (s->opts.idle_timeout_ms && s->opts.idle_timeout_ms < t))
		t = s->opts.idle_timeout_ms;
	period_ms = t / 4;
	if (period_ms < 10)
		period_ms = 10;
	if (period_ms > 1000)
		period_ms = 1000;
	pthread_mutex_lock(&s->reap_mu);
	while (!s->sweep_stop) {
		clock_gettime(CLOCK_MONOTONIC, &dl);
		dl.tv_nsec += (long)(period_ms % 1000) * 1000000;
		dl.tv_sec +=
		    (time_t)(period_ms / 1000) + dl.tv_nsec / 1000000000;
		dl.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&s->sweep_cv, &s->reap_mu, &dl);
		if (s->sweep_stop)
			break;
		pthread_mutex_unlock(&s->reap_mu);
		/* Each loop's own task, not a malloc'd one: a server
		 * serving requests allocates nothing on a timer either. A
		 * loop too busy to have run the last one is not sent
		 * another. */
		for (uint32_t i = 0; i < s->opts.threads; i++) {
			struct srv_loop *l = &s->lstate[i];

			if (!__atomic_exchange_n(&l->sweep_queued, true,
						 __ATOMIC_ACQ_REL))
				(void)emb_transport_post(s->loops[i],
							 &l->sweep);
		}
		pthread_mutex_lock(&s->reap_mu);
	}
	pthread_mutex_unlock(&s->reap_mu);
	return NULL;
}

void emb__sweeper_stop(struct emb_server *s)
{
	if (!s->sweeper_running)
		return;
	pthread_mutex_lock(&s->reap_mu);
	s->sweep_stop = true;
	pthread_cond_signal(&s->sweep_cv);
	pthread_mutex_unlock(&s->reap_mu);
	pthread_join(s->sweeper, NULL);
	s->sweeper_running = false;
}

int emb__sweeper_start(struct emb_server *s)
{
	int rc = emb_thread_start(&s->sweeper, NULL, sweeper_main, s,
				  "emb-sweep");

	if (!rc)
		s->sweeper_running = true;
	return rc;
}
