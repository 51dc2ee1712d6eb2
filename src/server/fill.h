/*
 * src/server/fill.h - recovery's stream: a source server copies every row
 * of a chunk of slots, with optimizer state, to the server being filled
 * with them (docs/replication.md, "Recovery"). One fill at a time, on a
 * thread of its own with its own connection, so the loops keep serving.
 */
#ifndef EMB_SERVER_FILL_H
#define EMB_SERVER_FILL_H

#include <stdint.h>

#include "server/server.h"

struct emb__fill;

struct emb__fill_req {
	const char *host;	/* the server being filled; copied */
	uint16_t port;
	uint32_t first, n;	/* the chunk's slots */
	uint64_t epoch;		/* map epoch its rows carry */
	enum emb_server_fill_mode mode;
	uint64_t rate;		/* bytes/s at most; 0 = unpaced */
	uint32_t bound_milli;	/* --move-bound x 1000, 0 = off: a copy
				   ahead paced by the workers' reports */
	const uint8_t *token;	/* HELLO token, or NULL; copied */
	uint32_t token_len;
	emb_server_fill_fn done; /* from the fill's thread */
	void *arg;
};

int emb__fill_create(struct emb__fill **out);
/* After emb__fill_stop(); NULL is a no-op. */
void emb__fill_destroy(struct emb__fill *f);
/* 0, -EBUSY (a fill runs), -ENOMEM, -EINVAL. */
int emb__fill_start(struct emb__fill *f, struct emb_server *s,
		    const struct emb__fill_req *r);
/* Every table of s stops tracking writes for a move. */
void emb__fill_untrack(struct emb_server *s);
/* Any thread: a worker's PACE (pacer.h). */
void emb__fill_pace_report(struct emb__fill *f, uint32_t p99_us,
			   uint32_t base_us);
/* PACE reports taken, the ticks that cut the rate, and the rate of the
 * last paced copy ahead (bytes/s, 0 = none yet). */
void emb__fill_pace_counts(struct emb__fill *f, uint64_t out[3]);
/* Ends a fill under way (its done() reports -ECANCELED), waits for its
 * thread, and starts no more. */
void emb__fill_stop(struct emb__fill *f);

#endif
