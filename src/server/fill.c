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
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

#include "server/tables.h"

#define FILL_BATCH	  2048u	 /* rows per ASSIGN */
#define FILL_SCAN	  4096u	 /* rows read from the table at a time */
#define FILL_DEADLINE_MS  60000	 /* a fill that has not finished by then
				    fails; the scheduler starts it again */
#define FILL_CALL_MS	  10000u /* one request */

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
		uint64_t epoch, uint16_t extra, struct emb_frame_hdr *rhdr)
{
	const struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	_Alignas(8) uint8_t resp[64 + EMB_WIRE_ERRMSG_MAX];
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
	rc = emb_conn_call_sync(conn, &hdr, iov, niov, resp, sizeof(resp),
				rhdr);
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

/* Sends one batch of rows, again while the target says it is not ready
 * for them (it has not seen the fill's map yet). */
static int send_rows(struct emb__fill *f, struct emb_conn *conn,
		     uint32_t tid, const uint64_t *ids, const float *rows,
		     uint32_t k, uint32_t stride, int64_t deadline)
{
	struct emb_frame_hdr rhdr;
	struct emb_wire_iovs v;
	int rc;

	for (;;) {
		rc = emb_wire_assign_req_encode(&v, 0, tid, EMB_F_WITH_STATE,
						ids, k, stride, rows);
		if (!rc)
			rc = call(conn, &v, f->epoch, EMB_F_FILL, &rhdr);
		if (rc != EMB_EMOVING || stopped(f) ||
		    (int64_t)emb_clock_ms() > deadline)
			return rc;
		nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
	}
}

/* Every row of the chunk in table id of this server to tid there. */
static int fill_table(struct emb__fill *f, struct emb_conn *conn,
		      uint32_t id, uint64_t *rows_out, int64_t deadline)
{
	struct emb_server_table st;
	struct emb_table_iter *it = NULL;
	struct emb_frame_hdr rhdr;
	struct emb_wire_iovs v;
	uint8_t buf[EMB_WIRE_HDR_SIZE + EMB_WIRE_SPEC_SIZE +
		    EMB_WIRE_LIFECYCLE_SIZE];
	uint64_t *ids = NULL, *out_ids = NULL;
	float *rows = NULL, *out_rows = NULL;
	uint32_t rf, k = 0, tid;
	uint64_t aside = 0, aside_ids[8];
	int rc, len, got;

	rc = emb_server_table_acquire(f->s, id, &st);
	if (rc)
		return rc == EMB_ENOTABLE ? 0 : rc; /* dropped meanwhile */
	rf = emb_table_row_floats(st.t);
	len = emb_wire_create_req_encode(buf, sizeof(buf), 0, &st.spec);
	if (len < 0) {
		rc = len;
		goto out;
	}
	as_iovs(&v, buf, len);
	rc = call(conn, &v, 0, 0, &rhdr);
	if (rc)
		goto out;
	tid = rhdr.table_id;
	ids = malloc(FILL_SCAN * sizeof(*ids));
	rows = malloc((size_t)FILL_SCAN * rf * sizeof(*rows));
	out_ids = malloc(FILL_BATCH * sizeof(*out_ids));
	out_rows = malloc((size_t)FILL_BATCH * rf * sizeof(*out_rows));
	rc = ids && rows && out_ids && out_rows
		 ? emb_table_iter_create(st.t, &it)
		 : -ENOMEM;
	/* The whole table is read and the chunk's rows kept: the store
	 * does not index rows by slot. */
	while (!rc && (got = emb_table_iter_next(it, ids, rows, NULL,
						 FILL_SCAN)) > 0) {
		for (int j = 0; j < got && !rc; j++) {
			uint32_t sl = emb_id_slot(ids[j]);

			if (sl < f->first || sl >= f->first + f->n)
				continue;
			/* A row with a NaN or Inf (an older version could
			 * make one) is not sent: the target refuses it, and
			 * with it the whole chunk, at every try. Left out,
			 * it is made afresh there when next used. */
			if (!emb_table_row_finite(st.t,
						  rows + (size_t)j * rf)) {
				if (aside < 8)
					aside_ids[aside] = ids[j];
				aside++;
				continue;
			}
			out_ids[k] = ids[j];
			memcpy(out_rows + (size_t)k * rf,
			       rows + (size_t)j * rf, rf * sizeof(float));
			if (++k == FILL_BATCH) {
				rc = send_rows(f, conn, tid, out_ids, out_rows,
					       k, rf, deadline);
				*rows_out += k;
				k = 0;
			}
		}
		if (!rc && stopped(f))
			rc = -ECANCELED;
		if (!rc && (int64_t)emb_clock_ms() > deadline)
			rc = -ETIMEDOUT;
	}
	if (!rc && k) {
		rc = send_rows(f, conn, tid, out_ids, out_rows, k, rf,
			       deadline);
		*rows_out += k;
	}
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
out:
	emb_table_iter_destroy(it);
	free(ids);
	free(rows);
	free(out_ids);
	free(out_rows);
	emb_server_table_release(&st);
	return rc;
}

static int fill_run(struct emb__fill *f, uint64_t *rows)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	const int64_t deadline = (int64_t)emb_clock_ms() + FILL_DEADLINE_MS;
	_Alignas(8) uint8_t hello[EMB_WIRE_HDR_SIZE + 64 + EMB_WIRE_TOKEN_MAX];
	struct emb_transport *tr = NULL;
	struct emb_conn *conn = NULL;
	struct emb_frame_hdr rhdr;
	struct emb_wire_iovs v;
	uint32_t *tids = NULL, nt;
	int rc, len;

	to.call_timeout_ms = FILL_CALL_MS;
	to.max_frame_bytes = EMB_WIRE_FRAME_MAX;
	co.host = f->host;
	co.port = f->port;
	rc = emb_transport_create("tcp", &to, &tr);
	if (!rc)
		rc = emb_conn_create(tr, &co, &conn);
	if (rc)
		goto out;
	len = emb_wire_hello_req_encode(hello, sizeof(hello), 0,
					EMB_WIRE_VERSION,
					f->token_len ? f->token : NULL,
					f->token_len, "embstore-fill");
	if (len < 0) {
		rc = len;
		goto out;
	}
	as_iovs(&v, hello, len);
	rc = call(conn, &v, 0, 0, &rhdr);
	if (rc)
		goto out;
	nt = emb_server_table_ids(f->s, NULL, 0);
	tids = calloc(nt ? nt : 1, sizeof(*tids));
	if (!tids) {
		rc = -ENOMEM;
		goto out;
	}
	nt = emb_server_table_ids(f->s, tids, nt);
	for (uint32_t i = 0; i < nt && !rc; i++)
		rc = fill_table(f, conn, tids[i], rows, deadline);
out:
	free(tids);
	emb_conn_destroy(conn);
	emb_transport_destroy(tr);
	return rc;
}

static void *fill_main(void *arg)
{
	struct emb__fill *f = arg;
	uint64_t rows = 0, t0 = emb_clock_ms(), epoch = f->epoch;
	int rc = fill_run(f, &rows);
	uint32_t first = f->first, n = f->n;
	emb_server_fill_fn done = f->done;
	void *darg = f->arg;

	if (rc)
		emb_log(EMB_LOG_WARN, "fill of slots %u-%u to %s:%u failed: %s",
			f->first, f->first + f->n - 1, f->host, f->port,
			emb_strerror(rc));
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
		done(darg, first, n, epoch, rc, rows);
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
	f->token_len = r->token_len;
	if (r->token_len)
		memcpy(f->token, r->token, r->token_len);
	f->done = r->done;
	f->arg = r->arg;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&th, &attr, fill_main, f);
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
