/*
 * src/server/fill.c - a recovery fill: the rows of a chunk of slots, from
 * this server to the one being filled with them (fill.h).
 *
 * The chunk is fenced here and there (slots.h) before the fill starts, so
 * the rows read are final until the fill is done: no write to the chunk is
 * applied on either side meanwhile. Tables are made on the target with the
 * same spec (CREATE finds one made already); rows go as ASSIGN with state,
 * flagged EMB_F_FILL, which the target takes for fenced slots it is being
 * filled with only. A target that has not seen the fill's map yet answers
 * EMB_EMOVING: the batch goes again after a short wait.
 */
#include "server/fill.h"

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
#include "common/optim.h"
#include "common/thread.h"
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

#include "server/pacer.h"
#include "server/tables.h"

#define FILL_BATCH	  2048u	 /* rows per ASSIGN */
#define FILL_DEADLINE_MS  60000	 /* a fill that has not finished by then
				    fails; the scheduler starts it again */
#define FILL_CALL_MS	  10000u /* one request */
#define FILL_DEPTH	  4u	 /* batches in flight */
#define FILL_CONNS	  2u	 /* connections they are spread over */
#define FILL_TAKES	  3u	 /* walks of a copy ahead's own writes */

struct emb__fill {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* alive went down */
	bool stop;	   /* under mu: end now, start no more */
	bool busy;	   /* under mu: a fill is streaming */
	uint32_t alive;	   /* under mu: fill threads not yet returned
			      (detached: done() may start the next) */
	struct emb_server *s;
	char host[256];
	uint16_t port;
	uint32_t first, n;
	uint64_t epoch;
	enum emb_server_fill_mode mode;
	uint64_t rate;
	struct emb__pacer pacer; /* under --move-bound (pacer.h); kept from
				    one fill to the next */
	uint8_t token[EMB_WIRE_TOKEN_MAX];
	uint32_t token_len;
	emb_server_fill_fn done;
	void *arg;
};

int emb__fill_create(struct emb__fill **out)
{
	struct emb__fill *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	*out = f;
	return 0;
}

void emb__fill_pace_report(struct emb__fill *f, uint32_t p99_us,
			   uint32_t base_us)
{
	emb__pacer_report(&f->pacer, p99_us, base_us, emb_clock_ms());
}

void emb__fill_pace_counts(struct emb__fill *f, uint64_t out[3])
{
	out[0] = __atomic_load_n(&f->pacer.reports, __ATOMIC_RELAXED);
	out[1] = __atomic_load_n(&f->pacer.cuts, __ATOMIC_RELAXED);
	out[2] = __atomic_load_n(&f->pacer.rate_now, __ATOMIC_RELAXED);
}

void emb__fill_stop(struct emb__fill *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->stop = true;
	while (f->alive)
		pthread_cond_wait(&f->cv, &f->mu);
	pthread_mutex_unlock(&f->mu);
}

void emb__fill_destroy(struct emb__fill *f)
{
	if (!f)
		return;
	emb__fill_stop(f);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

static bool stopped(struct emb__fill *f)
{
	bool st;

	pthread_mutex_lock(&f->mu);
	st = f->stop;
	pthread_mutex_unlock(&f->mu);
	return st;
}

/* A request frame in v to conn; 0, the server's status, or the call's. */
static int call(struct emb_conn *conn, const struct emb_wire_iovs *v,
		uint64_t epoch, uint16_t extra, struct emb_frame_hdr *rhdr,
		uint8_t resp[64 + EMB_WIRE_ERRMSG_MAX])
{
	const struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct iovec iov[EMB_WIRE_IOV_MAX];
	struct emb_frame_hdr hdr;
	int niov = 0, rc;

	rc = emb_wire_hdr_decode(v->head, EMB_WIRE_HDR_SIZE, &lim, &hdr);
	if (rc)
		return rc;
	if (epoch)
		emb_wire_hdr_set_epoch(&hdr, epoch, extra);
	if (v->iov[0].iov_len > EMB_WIRE_HDR_SIZE)
		iov[niov++] = (struct iovec){
		    (uint8_t *)v->iov[0].iov_base + EMB_WIRE_HDR_SIZE,
		    v->iov[0].iov_len - EMB_WIRE_HDR_SIZE};
	for (int i = 1; i < v->iovcnt; i++)
		iov[niov++] = v->iov[i];
	rc = emb_conn_call_sync(conn, &hdr, iov, niov, resp,
				64 + EMB_WIRE_ERRMSG_MAX, rhdr);
	if (rc)
		return rc;
	return rhdr->status < 0 ? rhdr->status : 0;
}

/* A plain frame buf[0..len) as a one-piece iovs. */
static void as_iovs(struct emb_wire_iovs *v, void *buf, int len)
{
	v->iov[0] = (struct iovec){buf, (size_t)len};
	v->iovcnt = 1;
	v->nbytes = (size_t)len;
	memcpy(v->head, buf, EMB_WIRE_HDR_SIZE);
}

/*
 * The stream's pipeline: FILL_DEPTH batches of rows in flight at once,
 * spread over FILL_CONNS connections, so that reading the table here, the
 * network and the target's inserts overlap, and the target applies on as
 * many of its loop threads (it spreads connections over them). Rows of a
 * chunk appear once in its stream, so batches may land in any order.
 */
struct batch {
	struct pipe *p;
	uint64_t *ids;
	float *rows;
	uint32_t *meta;	    /* p->meta: (idle, count) per row */
	uint32_t *births;   /* p->numbered: each row's birth */
	uint32_t k;	    /* rows in it */
	bool busy;	    /* posted, done not yet fired */
	bool again;	    /* the target was not ready: post again */
	int status;	    /* of the last call */
	uint64_t due_ms;    /* again: not before */
	struct emb_wire_iovs v;
	_Alignas(8) uint8_t resp[64 + EMB_WIRE_ERRMSG_MAX];
};

struct pipe {
	struct emb__fill *f;
	struct emb_transport *tr;
	struct emb_conn *conn[FILL_CONNS];
	uint32_t tid;	     /* the table's id on the target */
	uint32_t stride;     /* floats a row */
	uint32_t nposted;    /* posts so far, to pick a conn */
	uint64_t paced;	     /* bytes posted, for the pace */
	uint64_t pace_t0;    /* the first post, emb_clock_ns() */
	uint32_t tables;     /* streamed */
	uint32_t deltas;     /* of them, only what changed since the copy */
	uint64_t bytes;	     /* of the rows sent: ids and floats */
	bool meta;	     /* the target takes EMB_F_META */
	bool births;	     /* the target takes EMB_F_BIRTHS */
	bool numbered;	     /* and the table being sent numbers its rows */
	struct emb_row_meta *rm; /* FILL_BATCH: a read's lifecycle data */
	int64_t deadline;
	struct batch b[FILL_DEPTH];
};

static void batch_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct batch *b = ctx;

	b->busy = false;
	b->status = status ? status : resp->status < 0 ? resp->status : 0;
	/* A target that has not seen the fill's map yet: again, shortly. */
	b->again = b->status == EMB_EMOVING;
	if (b->again)
		b->due_ms = emb_clock_ms() + 5;
}

/* Posts batch b (encoded again: the header carries the epoch). */
static int batch_post(struct pipe *p, struct batch *b)
{
	const struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct iovec iov[EMB_WIRE_IOV_MAX];
	struct emb_frame_hdr hdr;
	int niov = 0, rc;

	rc = emb_wire_assign_req_encode_births(
	    &b->v, 0, p->tid, EMB_F_WITH_STATE, b->ids, b->k, p->stride,
	    b->rows, p->meta ? b->meta : NULL,
	    p->numbered ? b->births : NULL);
	if (!rc)
		rc = emb_wire_hdr_decode(b->v.head, EMB_WIRE_HDR_SIZE, &lim,
					 &hdr);
	if (rc)
		return rc;
	emb_wire_hdr_set_epoch(&hdr, p->f->epoch,
			       EMB_F_FILL | (p->f->mode == EMB_SERVER_FILL_WARM
						 ? EMB_F_WARM
						 : 0));
	if (b->v.iov[0].iov_len > EMB_WIRE_HDR_SIZE)
		iov[niov++] = (struct iovec){
		    (uint8_t *)b->v.iov[0].iov_base + EMB_WIRE_HDR_SIZE,
		    b->v.iov[0].iov_len - EMB_WIRE_HDR_SIZE};
	for (int i = 1; i < b->v.iovcnt; i++)
		iov[niov++] = b->v.iov[i];
	b->again = false;
	b->status = 0;
	rc = emb_conn_call(p->conn[p->nposted++ % FILL_CONNS], &hdr, iov, niov,
			   b->resp, sizeof(b->resp), batch_done, b);
	if (!rc)
		b->busy = true;
	return rc;
}

/*
 * Runs the loop until a batch is free to fill (all == false) or every
 * batch is (all == true), posting again those the target was not ready
 * for. Returns 0, a batch's error, or -ECANCELED / -ETIMEDOUT; on an
 * error, batches may still be in flight: the caller destroys the conns
 * (their calls end) before freeing the buffers.
 */
static int pipe_wait(struct pipe *p, bool all, struct batch **free_out)
{
	for (;;) {
		uint32_t busy = 0;
		bool pending = false;
		struct batch *fr = NULL;
		int rc;

		for (uint32_t i = 0; i < FILL_DEPTH; i++) {
			struct batch *b = &p->b[i];

			if (b->busy) {
				busy++;
			} else if (b->again) {
				pending = true;
				if (emb_clock_ms() >= b->due_ms) {
					rc = batch_post(p, b);
					if (rc)
						return rc;
					busy++;
				}
			} else if (b->status) {
				return b->status;
			} else if (!fr) {
				fr = b;
			}
		}
		if (!all && fr) {
			*free_out = fr;
			return 0;
		}
		if (all && !busy && !pending)
			return 0;
		if (stopped(p->f))
			return -ECANCELED;
		/* Past the deadline: still refused, as the last try said. */
		if ((int64_t)emb_clock_ms() > p->deadline)
			return pending ? EMB_EMOVING : -ETIMEDOUT;
		rc = emb_transport_poll(p->tr, busy ? 100 : 1);
		if (rc < 0)
			return rc;
	}
}

/* Under --move-bound, time the stream may run ahead of its rate: a
 * batch's worth at 100 MB/s, never a burst the workers would feel. */
#define PACE_SLACK_NS 20000000u

/*
 * A paced stream (a copy ahead under --move-rate or --move-bound): waits,
 * serving the conns meanwhile, until sending bytes more keeps the pace.
 * Under --move-rate alone the stream keeps rate on average since it
 * began, so a stream of B bytes takes at least B / rate. Under
 * --move-bound the rate changes as the workers report (pacer.h): each
 * batch is due bytes / rate after the last, a stream starts with no
 * credit, and one that fell behind banks no more than PACE_SLACK_NS. The fenced stream is not
 * paced: training waits for it.
 */
static int pace(struct pipe *p, size_t bytes)
{
	struct emb__fill *f = p->f;
	uint64_t due;

	if (f->mode != EMB_SERVER_FILL_WARM ||
	    (!f->rate && !f->pacer.bound_milli))
		return 0;
	if (f->pacer.bound_milli) {
		uint64_t now = emb_clock_ns();
		double rate = emb__pacer_tick(&f->pacer, now / 1000000u);

		/* A stream starts with no credit (a chunk's copy of B bytes
		 * takes B / rate at least, as under --move-rate alone); one
		 * that fell behind keeps PACE_SLACK_NS of it. */
		if (!p->pace_t0)
			p->pace_t0 = now;
		else if (p->pace_t0 + PACE_SLACK_NS < now)
			p->pace_t0 = now - PACE_SLACK_NS;
		p->pace_t0 += (uint64_t)((double)bytes / rate * 1e9);
		due = p->pace_t0;
	} else {
		if (!p->pace_t0)
			p->pace_t0 = emb_clock_ns();
		p->paced += bytes;
		due = p->pace_t0 + (uint64_t)((double)p->paced /
					      (double)f->rate * 1e9);
	}
	for (;;) {
		uint64_t now = emb_clock_ns();
		int rc;

		if (now >= due)
			return 0;
		if (stopped(p->f))
			return -ECANCELED;
		rc = emb_transport_poll(
		    p->tr, (int)((due - now) / 1000000u > 50
				     ? 50
				     : (due - now) / 1000000u + 1));
		if (rc < 0)
			return rc;
	}
}

/* Sends batch b of rows of rf floats, at the pace (--move-rate), and
 * counts its rows in *rows_out and their bytes (ids and floats). */
static int batch_send(struct pipe *p, struct batch *b, uint32_t rf,
		      uint64_t *rows_out)
{
	size_t bytes = (size_t)b->k * (8 + rf * 4);
	int rc = pace(p, bytes);

	if (!rc)
		rc = batch_post(p, b);
	*rows_out += b->k;
	p->bytes += bytes;
	return rc;
}

/*
 * Streams what it yields (rows of table st, rf floats each) to p's table,
 * in batches through the pipeline, and waits for all of them; counts them
 * in *rows_out. A row with a NaN or Inf is left out and counted in *aside
 * (its first ids in aside_ids[8]).
 */
static int stream(struct pipe *p, struct emb_server_table *st,
		  struct emb_table_iter *it, uint32_t rf, uint64_t *rows_out,
		  uint64_t *aside, uint64_t *aside_ids)
{
	struct emb__fill *f = p->f;
	struct batch *b = NULL;
	uint32_t now;
	int rc, got;

	rc = pipe_wait(p, false, &b);
	/* A free batch may be one a walk before sent last: done with. */
	if (!rc)
		b->k = 0;
	/* Rows are read straight into the batch being filled. */
	while (!rc && (got = emb_table_iter_next_births(
			   it, b->ids + b->k, b->rows + (size_t)b->k * rf,
			   p->rm, b->births + b->k, FILL_BATCH - b->k)) > 0) {
		uint32_t keep = b->k;

		/* Idle times, not last accesses: the target's clock is
		 * another (EMB_F_META). */
		now = emb_table_now(st->t);
		for (uint32_t j = b->k; j < b->k + (uint32_t)got; j++) {
			float *row = b->rows + (size_t)j * rf;
			const struct emb_row_meta *rm = &p->rm[j - b->k];

			/* A row with a NaN or Inf (an older version could
			 * make one) is not sent: the target refuses it, and
			 * with it the whole chunk, at every try. Left out,
			 * it is made afresh there when next used. */
			if (!emb_table_row_finite(st->t, row)) {
				if (*aside < 8)
					aside_ids[*aside] = b->ids[j];
				(*aside)++;
				continue;
			}
			if (keep != j) {
				b->ids[keep] = b->ids[j];
				b->births[keep] = b->births[j];
				memmove(b->rows + (size_t)keep * rf, row,
					rf * sizeof(float));
			}
			b->meta[2 * keep] = now - rm->last_step;
			b->meta[2 * keep + 1] = rm->count;
			keep++;
		}
		b->k = keep;
		if (b->k == FILL_BATCH) {
			rc = batch_send(p, b, rf, rows_out);
			if (!rc)
				rc = pipe_wait(p, false, &b);
			if (!rc)
				b->k = 0;
		}
		if (!rc && stopped(f))
			rc = -ECANCELED;
		if (!rc && (int64_t)emb_clock_ms() > p->deadline)
			rc = -ETIMEDOUT;
	}
	if (!rc && got < 0)
		rc = got;
	if (!rc && b->k)
		rc = batch_send(p, b, rf, rows_out);
	if (!rc)
		rc = pipe_wait(p, true, NULL);
	return rc;
}

/*
 * A copy ahead's last walks: the rows written while it copied, taking
 * their marks, so that a row written meanwhile is marked again. Each walk
 * is shorter than the last, as is what it leaves: the fenced stream, with
 * training's writes to the chunk held, sends only what the last walk left
 * (docs/replication.md, "Moving slots"). Another walk is taken while the
 * rows marked are at least a batch (fewer go under the fence at once
 * anyway) and at most half of what the last walk sent: a chunk whose rows
 * are all written again and again (a small, hot table) would be sent
 * over and over for nothing, and its fence carries them either way. At
 * most FILL_TAKES walks. A tiered table gets none (its cold rows' marks
 * are its own): its fenced stream sends all it marked.
 */
static int take_walks(struct pipe *p, struct emb_server_table *st,
		      uint32_t rf, uint64_t last, uint64_t *rows_out,
		      uint64_t *aside, uint64_t *aside_ids)
{
	int rc = 0;

	for (uint32_t i = 0; !rc && i < FILL_TAKES; i++) {
		struct emb_table_iter *it = NULL;
		uint64_t sent = 0,
			 marked = emb_table_track_count(st->t, p->f->first,
							p->f->n);

		if (marked < FILL_BATCH || marked > last / 2)
			break;
		rc = emb_table_iter_create(st->t, &it);
		if (!rc)
			rc = emb_table_iter_slots(it, p->f->first, p->f->n);
		if (!rc)
			rc = emb_table_iter_tracked_take(it);
		if (!rc)
			rc = stream(p, st, it, rf, &sent, aside, aside_ids);
		emb_table_iter_destroy(it);
		*rows_out += sent;
		if (rc == -EOPNOTSUPP)
			return 0;
		last = sent;
	}
	return rc;
}

/* Every row of the chunk in table id of this server to tid there. */
static int fill_table(struct pipe *p, uint32_t id, uint64_t *rows_out,
		      bool *delta)
{
	struct emb__fill *f = p->f;
	struct emb_server_table st;
	struct emb_table_iter *it = NULL;
	struct emb_frame_hdr rhdr;
	struct emb_wire_iovs v;
	uint8_t buf[EMB_WIRE_CREATE_REQ_MAX];
	_Alignas(8) uint8_t resp[64 + EMB_WIRE_ERRMSG_MAX];
	uint32_t rf;
	uint64_t aside = 0, aside_ids[8], copied = 0;
	int rc, len;

	rc = emb_server_table_acquire(f->s, id, &st);
	if (rc)
		return rc == EMB_ENOTABLE ? 0 : rc; /* dropped meanwhile */
	rf = emb_table_row_floats(st.t);
	/* The policy as last set, not as created: the target may become a
	 * primary, whose admission decides for the slot's holders. */
	{
		struct emb_table_opts o;

		emb_table_get_opts(st.t, &o);
		st.spec.life = o.life;
	}
	/* Its tier as asked, but a table that asked for one is not kept
	 * from a target without a tier: a fill must not fail for it. */
	if (st.spec.tier == EMB_TIER_ON)
		st.spec.tier = EMB_TIER_AUTO;
	len = emb_wire_create_req_encode(buf, sizeof(buf), 0, &st.spec);
	if (len < 0) {
		rc = len;
		goto out;
	}
	as_iovs(&v, buf, len);
	rc = call(p->conn[0], &v, 0, 0, &rhdr, resp);
	if (rc)
		goto out;
	p->tid = rhdr.table_id;
	p->stride = rf;
	/* Its rows' births go with them (docs/replication.md, "Eviction with
	 * replicas"), to a target that takes them: the CREATE above made
	 * the table there numbering its rows too. */
	p->numbered = p->births && emb_table_has_births(st.t);
	for (uint32_t i = 0; i < FILL_DEPTH; i++) {
		p->b[i] = (struct batch){.p = p};
		p->b[i].ids = malloc(FILL_BATCH * sizeof(uint64_t));
		p->b[i].rows = malloc((size_t)FILL_BATCH * rf * sizeof(float));
		p->b[i].meta = malloc(FILL_BATCH * 2 * sizeof(uint32_t));
		p->b[i].births = malloc(FILL_BATCH * sizeof(uint32_t));
		if (!p->b[i].ids || !p->b[i].rows || !p->b[i].meta ||
		    !p->b[i].births)
			rc = -ENOMEM;
	}
	p->rm = malloc(FILL_BATCH * sizeof(*p->rm));
	if (!p->rm)
		rc = -ENOMEM;
	if (!rc)
		rc = emb_table_iter_create(st.t, &it);
	/* Only the chunk's records are read: the store keeps each record's
	 * slot (made by the table's first such walk). */
	if (!rc)
		rc = emb_table_iter_slots(it, f->first, f->n);
	/* A copy ahead tracks writes from before its first read on, so
	 * every row it reads and that changes later is marked. */
	if (!rc && f->mode == EMB_SERVER_FILL_WARM)
		rc = emb_table_track_begin(st.t, f->first, f->n);
	/* Fenced: the rows written since the copy ahead began are final
	 * now, and are all the target lacks, unless some were removed (the
	 * target would keep them) or the table was not tracked. */
	if (!rc && f->mode == EMB_SERVER_FILL_DELTA &&
	    emb_table_track_removed(st.t) == 0) {
		rc = emb_table_iter_tracked(it);
		*delta = true;
	}
	if (!rc)
		rc = stream(p, &st, it, rf, &copied, &aside, aside_ids);
	*rows_out += copied;
	if (!rc && f->mode == EMB_SERVER_FILL_WARM)
		rc = take_walks(p, &st, rf, copied, rows_out, &aside,
				aside_ids);
	if (aside) {
		char list[8 * 21 + 1];
		size_t at = 0;

		for (uint64_t i = 0; i < aside && i < 8; i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at,
					       "%s%llu", i ? "," : "",
					       (unsigned long long)aside_ids[i]);
		emb_log(EMB_LOG_WARN,
			"fill: table %s: %llu rows with a NaN or infinite "
			"value not sent (made afresh when next used); ids %s%s",
			st.spec.name, (unsigned long long)aside, list,
			aside > 8 ? ",..." : "");
	}
	/* Streamed whole or in part, the target has it all: the tracking
	 * is over (a copy ahead keeps it for its fenced stream). */
	if (f->mode != EMB_SERVER_FILL_WARM)
		emb_table_track_end(st.t);
out:
	if (rc)
		/* Calls still in flight borrow the batches' memory: the
		 * conns go first (their calls end, callbacks fire). */
		for (uint32_t i = 0; i < FILL_CONNS; i++) {
			emb_conn_destroy(p->conn[i]);
			p->conn[i] = NULL;
		}
	for (uint32_t i = 0; i < FILL_DEPTH; i++) {
		free(p->b[i].ids);
		free(p->b[i].rows);
		free(p->b[i].meta);
		free(p->b[i].births);
		p->b[i].births = NULL;
		p->b[i].ids = NULL;
		p->b[i].rows = NULL;
		p->b[i].meta = NULL;
	}
	free(p->rm);
	p->rm = NULL;
	emb_table_iter_destroy(it);
	emb_server_table_release(&st);
	return rc;
}

static int fill_run(struct emb__fill *f, uint64_t *rows, uint64_t *bytes)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	_Alignas(8) uint8_t hello[EMB_WIRE_HDR_SIZE + 64 + EMB_WIRE_TOKEN_MAX];
	_Alignas(8) uint8_t resp[64 + EMB_WIRE_ERRMSG_MAX];
	struct pipe *p = calloc(1, sizeof(*p));
	struct emb_frame_hdr rhdr;
	struct emb_wire_iovs v;
	uint32_t *tids = NULL, nt;
	int rc, len;

	if (!p)
		return -ENOMEM;
	p->f = f;
	p->deadline = (int64_t)emb_clock_ms() + FILL_DEADLINE_MS;
	to.call_timeout_ms = FILL_CALL_MS;
	to.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	co.host = f->host;
	co.port = f->port;
	len = emb_wire_hello_req_encode(hello, sizeof(hello), 0,
					EMB_WIRE_VERSION,
					f->token_len ? f->token : NULL,
					f->token_len, "embstore-fill");
	rc = len < 0 ? len : emb_transport_create("tcp", &to, &p->tr);
	for (uint32_t i = 0; i < FILL_CONNS && !rc; i++) {
		rc = emb_conn_create(p->tr, &co, &p->conn[i]);
		if (!rc) {
			as_iovs(&v, hello, len);
			rc = call(p->conn[i], &v, 0, 0, &rhdr, resp);
		}
	}
	/* A target that takes rows' lifecycle data says so in HELLO: an
	 * older one would refuse the flag, and with it every batch. */
	if (!rc && rhdr.payload_len >= 24) {
		p->meta = emb_le32_load(resp + 20) & EMB_WIRE_FEAT_META;
		p->births = emb_le32_load(resp + 20) & EMB_WIRE_FEAT_BIRTHS;
	}
	if (rc)
		goto out;
	nt = emb_server_table_ids(f->s, NULL, 0);
	tids = calloc(nt ? nt : 1, sizeof(*tids));
	if (!tids) {
		rc = -ENOMEM;
		goto out;
	}
	nt = emb_server_table_ids(f->s, tids, nt);
	for (uint32_t i = 0; i < nt && !rc; i++) {
		bool delta = false;

		rc = fill_table(p, tids[i], rows, &delta);
		p->tables += 1;
		p->deltas += delta;
	}
	if (!rc && f->mode == EMB_SERVER_FILL_DELTA && p->deltas < p->tables)
		emb_log(EMB_LOG_INFO,
			"slots %u-%u: %u of %u tables streamed whole (not "
			"tracked since the copy ahead, or rows removed)",
			f->first, f->first + f->n - 1, p->tables - p->deltas,
			p->tables);
out:
	*bytes = p->bytes;
	free(tids);
	for (uint32_t i = 0; i < FILL_CONNS; i++)
		emb_conn_destroy(p->conn[i]);
	emb_transport_destroy(p->tr);
	free(p);
	return rc;
}

void emb__fill_untrack(struct emb_server *s)
{
	uint32_t nt = emb_server_table_ids(s, NULL, 0);
	uint32_t *tids = calloc(nt ? nt : 1, sizeof(*tids));

	if (!tids)
		return;
	nt = emb_server_table_ids(s, tids, nt);
	for (uint32_t i = 0; i < nt; i++) {
		struct emb_server_table st;

		if (emb_server_table_acquire(s, tids[i], &st))
			continue;
		emb_table_track_end(st.t);
		emb_server_table_release(&st);
	}
	free(tids);
}

static void *fill_main(void *arg)
{
	struct emb__fill *f = arg;
	uint64_t rows = 0, bytes = 0, t0 = emb_clock_ms(), epoch = f->epoch;
	uint32_t first = f->first, n = f->n;
	emb_server_fill_fn done = f->done;
	void *darg = f->arg;
	int rc;

	/* Named here: the thread is detached, its pthread_t may be gone. */
	pthread_setname_np(pthread_self(), "emb-fill");
	rc = fill_run(f, &rows, &bytes);

	if (rc)
		emb_log(EMB_LOG_WARN, "fill of slots %u-%u to %s:%u failed: %s",
			f->first, f->first + f->n - 1, f->host, f->port,
			emb_strerror(rc));
	else if (f->mode == EMB_SERVER_FILL_WARM && f->pacer.bound_milli)
		emb_log(EMB_LOG_INFO,
			"copy ahead of slots %u-%u: %.1f MB in %llu ms, "
			"paced at %.1f MB/s at its end (--move-bound %.2f; %llu "
			"cuts and %llu reports so far)",
			f->first, f->first + f->n - 1, (double)bytes / 1e6,
			(unsigned long long)(emb_clock_ms() - t0),
			f->pacer.rate / 1e6, f->pacer.bound_milli / 1000.0,
			(unsigned long long)__atomic_load_n(&f->pacer.cuts,
							    __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&f->pacer.reports,
							    __ATOMIC_RELAXED));
	else
		emb_log(EMB_LOG_DEBUG,
			"fill of slots %u-%u to %s:%u: %llu rows in %llu ms",
			f->first, f->first + f->n - 1, f->host, f->port,
			(unsigned long long)rows,
			(unsigned long long)(emb_clock_ms() - t0));
	/* Not busy before done(): it may start the next chunk's fill. */
	pthread_mutex_lock(&f->mu);
	f->busy = false;
	pthread_mutex_unlock(&f->mu);
	if (done)
		done(darg, first, n, epoch, rc, rows, bytes);
	pthread_mutex_lock(&f->mu);
	f->alive--;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

int emb__fill_start(struct emb__fill *f, struct emb_server *s,
		    const struct emb__fill_req *r)
{
	pthread_attr_t attr;
	pthread_t th;
	int rc;

	if (!r->host || strlen(r->host) >= sizeof(f->host) || !r->n ||
	    r->token_len > EMB_WIRE_TOKEN_MAX)
		return -EINVAL;
	pthread_mutex_lock(&f->mu);
	if (f->busy || f->stop) {
		rc = f->stop ? -ECANCELED : -EBUSY;
		pthread_mutex_unlock(&f->mu);
		return rc;
	}
	f->busy = true;
	f->alive++;
	pthread_mutex_unlock(&f->mu);
	f->s = s;
	snprintf(f->host, sizeof(f->host), "%s", r->host);
	f->port = r->port;
	f->first = r->first;
	f->n = r->n;
	f->epoch = r->epoch;
	f->mode = r->mode;
	f->rate = r->rate;
	__atomic_store_n(&f->pacer.bound_milli, r->bound_milli,
			 __ATOMIC_RELAXED);
	f->pacer.cap = (double)r->rate;
	f->token_len = r->token_len;
	if (r->token_len)
		memcpy(f->token, r->token, r->token_len);
	f->done = r->done;
	f->arg = r->arg;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = emb_thread_start(&th, &attr, fill_main, f, NULL);
	pthread_attr_destroy(&attr);
	if (rc) {
		pthread_mutex_lock(&f->mu);
		f->busy = false;
		f->alive--;
		pthread_cond_broadcast(&f->cv);
		pthread_mutex_unlock(&f->mu);
	}
	return rc;
}
