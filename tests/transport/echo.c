/*
 * tests/transport/echo.c - the test server of echo.h. Every callback runs on
 * the loop thread that owns the conn; held requests are kept per loop.
 */
#include "echo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct held {
	struct emb_req *req;   /* request not yet answered */
	struct emb_conn *conn; /* its conn */
	uint8_t op;	       /* ECHO_OP_SINK, _REV or _LATE */
};

struct echo_loop {
	struct emb_transport *tr;
	pthread_t thread;
	struct held *held; /* requests held by this loop */
	size_t nheld;
	size_t cap;
	struct iovec *iov; /* ROWS reply scratch; the transport copies it */
	size_t iov_cap;
};

struct echo_server {
	struct echo_loop *loops;
	struct emb_transport **trs;
	unsigned nloops;
	struct emb_listener *l;
	float *table; /* ECHO_NROWS x ECHO_ROW_STRIDE */
	int late_rc;  /* last LATE reply's return (atomic) */
	uint8_t *big; /* ECHO_BIG_MAX bytes of echo_pattern() */
};

static struct echo_loop *loop_of(struct echo_server *s, struct emb_conn *c)
{
	for (unsigned i = 0; i < s->nloops; i++)
		if (s->loops[i].tr == emb_conn_loop(c))
			return &s->loops[i];
	abort();
}

static void hold(struct echo_loop *lp, struct emb_conn *c, struct emb_req *r,
		 uint8_t op)
{
	if (lp->nheld == lp->cap) {
		lp->cap = lp->cap ? lp->cap * 2 : 64;
		lp->held = realloc(lp->held, lp->cap * sizeof(*lp->held));
		if (!lp->held)
			abort();
	}
	lp->held[lp->nheld++] = (struct held){.req = r, .conn = c, .op = op};
}

static void reply_rows(struct echo_server *s, struct echo_loop *lp,
		       struct emb_req *r, const struct emb_frame_hdr *h,
		       void *payload)
{
	uint32_t n = h->payload_len / sizeof(uint64_t);
	struct emb_frame_hdr rh = {.opcode = h->opcode | EMB_OP_RESPONSE_BIT,
				   .count = n};
	const uint64_t *ids = payload;
	struct iovec *iov;

	if (n > lp->iov_cap) {
		lp->iov = realloc(lp->iov, n * sizeof(*lp->iov));
		if (!lp->iov)
			abort();
		lp->iov_cap = n;
	}
	iov = lp->iov;
	for (uint32_t i = 0; i < n; i++) {
		iov[i].iov_base =
		    s->table + (ids[i] % ECHO_NROWS) * ECHO_ROW_STRIDE;
		iov[i].iov_len = ECHO_ROW_FLOATS * sizeof(float);
	}
	emb_conn_reply(r, &rh, iov, (int)n, NULL, NULL);
}

static void on_request(void *arg, struct emb_conn *c, struct emb_req *r,
		       const struct emb_frame_hdr *h, void *payload)
{
	struct echo_server *s = arg;
	struct echo_loop *lp;
	struct emb_frame_hdr rh = {.opcode = h->opcode | EMB_OP_RESPONSE_BIT,
				   .flags = h->flags,
				   .table_id = h->table_id,
				   .count = h->count};
	struct iovec iov;

	switch (h->opcode) {
	case ECHO_OP_ECHO:
		iov.iov_base = payload;
		iov.iov_len = h->payload_len;
		emb_conn_reply(r, &rh, &iov, 1, NULL, NULL);
		break;
	case ECHO_OP_BIG:
		iov.iov_base = s->big;
		iov.iov_len = h->count < ECHO_BIG_MAX ? h->count : ECHO_BIG_MAX;
		emb_conn_reply(r, &rh, &iov, 1, NULL, NULL);
		break;
	case ECHO_OP_ROWS:
		reply_rows(s, loop_of(s, c), r, h, payload);
		break;
	case ECHO_OP_SINK:
	case ECHO_OP_LATE:
		hold(loop_of(s, c), c, r, h->opcode);
		break;
	case ECHO_OP_REV: {
		size_t n = 0;

		lp = loop_of(s, c);
		hold(lp, c, r, ECHO_OP_REV);
		for (size_t i = 0; i < lp->nheld; i++)
			n += lp->held[i].op == ECHO_OP_REV &&
			     lp->held[i].conn == c;
		if (n < h->table_id)
			break;
		/* Reply newest first, then drop them from the list. */
		for (size_t i = lp->nheld; i-- > 0;) {
			struct held *hd = &lp->held[i];

			if (hd->op != ECHO_OP_REV || hd->conn != c)
				continue;
			rh.table_id = hd->req->hdr.table_id;
			rh.count = hd->req->hdr.count;
			iov.iov_base = hd->req->payload;
			iov.iov_len = hd->req->hdr.payload_len;
			emb_conn_reply(hd->req, &rh, &iov, 1, NULL, NULL);
			*hd = lp->held[--lp->nheld];
		}
		break;
	}
	default:
		rh.status = EMB_EBADOP;
		emb_conn_reply(r, &rh, NULL, 0, NULL, NULL);
		break;
	}
}

static void on_close(void *arg, struct emb_conn *c, int reason)
{
	struct echo_server *s = arg;
	struct echo_loop *lp = loop_of(s, c);
	struct emb_frame_hdr rh = {.opcode =
				       ECHO_OP_LATE | EMB_OP_RESPONSE_BIT};
	int rc;

	(void)reason;
	for (size_t i = lp->nheld; i-- > 0;) {
		if (lp->held[i].conn != c)
			continue;
		if (lp->held[i].op == ECHO_OP_LATE) {
			/* The conn is closed: this must fail and consume. */
			rc = emb_conn_reply(lp->held[i].req, &rh, NULL, 0, NULL,
					    NULL);
			__atomic_store_n(&s->late_rc, rc, __ATOMIC_RELEASE);
		} else {
			emb_req_release(lp->held[i].req);
		}
		lp->held[i] = lp->held[--lp->nheld];
	}
}

static void *loop_main(void *arg)
{
	struct echo_loop *lp = arg;

	emb_transport_run(lp->tr);
	return NULL;
}

int echo_start(const char *transport, unsigned nloops,
	       const struct emb_transport_opts *opts, struct echo_server **out)
{
	struct emb_listen_opts lo = EMB_LISTEN_OPTS_DEFAULT;
	struct echo_server *s;
	unsigned i;
	int rc;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->nloops = nloops;
	s->late_rc = 1;
	s->loops = calloc(nloops, sizeof(*s->loops));
	s->trs = calloc(nloops, sizeof(*s->trs));
	s->table = malloc((size_t)ECHO_NROWS * ECHO_ROW_STRIDE * sizeof(float));
	s->big = malloc(ECHO_BIG_MAX);
	if (!s->loops || !s->trs || !s->table || !s->big)
		abort();
	for (size_t r = 0; r < ECHO_NROWS; r++)
		for (unsigned j = 0; j < ECHO_ROW_STRIDE; j++)
			s->table[r * ECHO_ROW_STRIDE + j] =
			    j < ECHO_ROW_FLOATS ? echo_row_value(r, j) : -1;
	for (size_t b = 0; b < ECHO_BIG_MAX; b++)
		s->big[b] = echo_pattern(b);
	for (i = 0; i < nloops; i++) {
		rc = emb_transport_create(transport, opts, &s->loops[i].tr);
		if (rc)
			goto err;
		s->trs[i] = s->loops[i].tr;
	}
	lo.loops = s->trs;
	lo.nloops = nloops;
	lo.on_request = on_request;
	lo.on_close = on_close;
	lo.arg = s;
	rc = emb_listener_create(s->trs[0], &lo, &s->l);
	if (rc)
		goto err;
	for (i = 0; i < nloops; i++)
		if (pthread_create(&s->loops[i].thread, NULL, loop_main,
				   &s->loops[i]))
			abort();
	*out = s;
	return 0;
err:
	for (i = 0; i < nloops; i++)
		emb_transport_destroy(s->loops[i].tr);
	free(s->loops);
	free(s->trs);
	free(s->table);
	free(s->big);
	free(s);
	return rc;
}

int echo_late_rc(const struct echo_server *s)
{
	return __atomic_load_n(&s->late_rc, __ATOMIC_ACQUIRE);
}

uint16_t echo_port(const struct echo_server *s)
{
	return emb_listener_port(s->l);
}

void echo_stats(const struct echo_server *s, struct emb_transport_stats *out)
{
	struct emb_transport_stats one;
	uint64_t *dst = (uint64_t *)out;
	const uint64_t *src = (const uint64_t *)&one;

	uint64_t peak = 0;

	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < s->nloops; i++) {
		emb_transport_stats(s->loops[i].tr, &one);
		for (size_t k = 0; k < sizeof(one) / sizeof(uint64_t); k++)
			dst[k] += src[k];
		if (one.out_queue_peak > peak)
			peak = one.out_queue_peak;
	}
	out->out_queue_peak = peak; /* a peak does not add up */
}

void echo_loop_stats(const struct echo_server *s, unsigned i,
		     struct emb_transport_stats *out)
{
	emb_transport_stats(s->loops[i].tr, out);
}

void echo_stop(struct echo_server *s)
{
	unsigned i;

	for (i = 0; i < s->nloops; i++)
		emb_transport_stop(s->loops[i].tr);
	for (i = 0; i < s->nloops; i++)
		pthread_join(s->loops[i].thread, NULL);
	/* The threads are gone: this thread owns the loops now. */
	emb_listener_destroy(s->l);
	for (i = 0; i < s->nloops; i++) {
		struct echo_loop *lp = &s->loops[i];

		while (lp->nheld)
			emb_req_release(lp->held[--lp->nheld].req);
		emb_transport_destroy(lp->tr);
		free(lp->held);
		free(lp->iov);
	}
	free(s->loops);
	free(s->trs);
	free(s->table);
	free(s->big);
	free(s);
}
