/*
 * src/worker/pace.c - the worker's side of pacing a move by step time
 * (docs/replication.md, "Pacing by step time"): its data calls' latency,
 * window by window, and PACE to the servers while a move copies rows
 * ahead. What the servers do with it is src/server/pacer.h.
 *
 * Every pull and push is timed from its post to its completion, on the
 * loop thread, into a histogram the loop closes every PACE_WINDOW_MS. A
 * window closed while the client's map shows no move adds its p99 to the
 * baseline (the last PACE_BASE such windows); one closed while a move is
 * under way (the map has a copy ahead or a fill, had one during the
 * window, or had one in the last PACE_AFTER_MS) sends its p99 and the baseline's median to every server
 * the client is connected to. Any of them may be streaming a copy ahead,
 * and one frame a server per window is nothing beside the calls.
 *
 * Why the calls and not the step: the library sees only its calls, and
 * they are the part of a step a move can slow (the copy competes with
 * the servers' loops for CPU, memory bandwidth and the network). A
 * window with fewer than PACE_MIN_CALLS calls says nothing and is
 * dropped, so an idle worker neither reports nor shapes its baseline.
 *
 * Loop thread only: no locks. c->map_moves is the one field shared with
 * the callers (set under map_mu, read here with a relaxed load).
 */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hist.h"
#include "common/log.h"
#include "proto/wire_msg.h"
#include "worker/client_int.h"

#define PACE_WINDOW_MS 250u  /* a window of calls */
#define PACE_MIN_CALLS 4u    /* fewer in a window: not a measure */
#define PACE_AFTER_MS  1000u /* a move's tail: its windows are not a
				baseline */
#define PACE_BASE_MIN  3u    /* windows before a baseline is one */

int emb__pace_create(struct emb_client *c)
{
	c->pace.h = malloc(sizeof(*c->pace.h));
	if (!c->pace.h)
		return -ENOMEM;
	emb_hist_reset(c->pace.h);
	c->pace.win_ms = emb_clock_ms();
	return 0;
}

void emb__pace_destroy(struct emb_client *c)
{
	free(c->pace.h);
	c->pace.h = NULL;
}

void emb__pace_record(struct emb_client *c, struct emb_async *op)
{
	uint64_t t0 = op->t0_ns;

	/* Set again by the op's next post: a use that was not posted
	 * records nothing. */
	op->t0_ns = 0;
	if (!c->pace.h || !t0 || (op->kind != OP_PULL && op->kind != OP_PUSH))
		return;
	emb_hist_record(c->pace.h, emb_clock_ns() - t0);
}

/* The baseline: the median of the windows kept. */
static uint32_t base_us(const struct emb_client *c)
{
	uint32_t v[PACE_BASE], n = c->pace.nbase;

	memcpy(v, c->pace.base, n * sizeof(v[0]));
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
			uint32_t t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

static void pace_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct server *s = ctx;

	/* A server older than PACE answers EOPNOTSUPP: it paces by
	 * --move-rate only, and this client keeps sending one frame a
	 * window, which costs it nothing. */
	(void)status;
	(void)resp;
	s->pace_busy = false;
}

static void report(struct emb_client *c, uint32_t p99, uint32_t base,
		   uint32_t calls)
{
	const struct emb_wire_pace_req r = {
	    .p99_us = p99, .base_us = base, .calls = calls};

	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct server *s = &c->srv[i];
		struct emb_frame_hdr hdr;
		struct iovec iov;
		int len;

		if (s->state != SRV_UP || !s->conn || s->pace_busy)
			continue;
		len = emb_wire_pace_req_encode(s->pace_req,
					       sizeof(s->pace_req), 0, &r);
		if (len < 0)
			return;
		memcpy(&hdr, s->pace_req, sizeof(hdr));
		iov = (struct iovec){s->pace_req + EMB_WIRE_HDR_SIZE,
				     (size_t)len - EMB_WIRE_HDR_SIZE};
		if (emb_conn_call(s->conn, &hdr, &iov, 1, s->pace_resp,
				  sizeof(s->pace_resp), pace_done, s) == 0) {
			s->pace_busy = true;
			add(&c->pace_sent, 1);
		}
	}
}

void emb__pace_tick(struct emb_client *c, uint64_t now)
{
	struct pace_state *ps = &c->pace;
	uint64_t calls;
	uint32_t p99;

	if (!ps->h || now - ps->win_ms < PACE_WINDOW_MS)
		return;
	/* A move under way now, or one that came and went within the
	 * window (a join of a small table takes tens of ms). */
	if (__atomic_load_n(&c->map_moves, __ATOMIC_RELAXED) ||
	    __atomic_load_n(&c->map_moves_ms, __ATOMIC_RELAXED) >= ps->win_ms)
		ps->move_ms = now;
	calls = ps->h->count;
	p99 = (uint32_t)((emb_hist_percentile(ps->h, 99.0) + 999u) / 1000u);
	emb_hist_reset(ps->h);
	ps->win_ms = now;
	if (calls < PACE_MIN_CALLS || !p99)
		return;
	if (ps->move_ms && now - ps->move_ms < PACE_AFTER_MS) {
		uint32_t base;

		if (ps->nbase < PACE_BASE_MIN)
			return;
		base = base_us(c);
		if (!ps->windows)
			emb_log(EMB_LOG_INFO,
				"a move is under way: reporting this worker's "
				"calls' p99 (%u us) against %u us before it",
				p99, base);
		ps->windows++;
		if (p99 > ps->worst)
			ps->worst = p99;
		report(c, p99, base,
		       calls > UINT32_MAX ? UINT32_MAX : (uint32_t)calls);
		return;
	}
	if (ps->windows) {
		emb_log(EMB_LOG_INFO,
			"the move is over: %u windows reported, worst p99 %u "
			"us against %u us before it",
			ps->windows, ps->worst, base_us(c));
		ps->windows = 0;
		ps->worst = 0;
	}
	ps->base[ps->base_at] = p99;
	ps->base_at = (ps->base_at + 1) % PACE_BASE;
	if (ps->nbase < PACE_BASE)
		ps->nbase++;
	if (ps->nbase == PACE_BASE_MIN && !ps->based) {
		ps->based = true;
		emb_log(EMB_LOG_INFO,
			"calls' p99 with no move under way: %u us (what "
			"this worker's reports during moves compare with)",
			base_us(c));
	}
}
