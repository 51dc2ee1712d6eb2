/*
 * src/cluster/probe.c - the scheduler's probe of a suspect server
 * (probe.h). The probe's thread owns its transport and connection; the
 * only thing it shares is the task it posts to the asking loop, after
 * which it touches nothing of its own but its exit.
 */
#include "cluster/probe.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/thread.h"
#include "proto/wire_cluster.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

/* Room for a HELLO response or an error frame's payload. */
#define RESP_CAP (256u + EMB_WIRE_ERRMSG_MAX)

struct call {
	bool done;   /* its callback ran */
	int status;  /* transport status: 0 = a response came */
	_Alignas(8) uint8_t resp[RESP_CAP];
};

struct probe {
	struct emb_probe_opts o;	   /* host and token point below */
	char host[EMB_WIRE_HOST_MAX + 1];  /* copy */
	uint8_t token[EMB_WIRE_TOKEN_MAX]; /* copy */
	pthread_t thread;		   /* runs probe_main */
	struct emb_task task;		   /* posted to o.reply_to */
	int status;			   /* the verdict */
	uint32_t took_ms;		   /* start to verdict */
	struct call hello, ping;	   /* the two calls */
};

static void call_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct call *c = ctx;

	(void)resp;
	c->done = true;
	/* A response too big for the buffer is still an answer. */
	c->status = status == EMB_ERESPTOOBIG ? 0 : status;
}

/* HELLO then PING on conn; waits for an answer until deadline_ms. */
static int ask(struct probe *p, struct emb_conn *conn, int64_t deadline_ms)
{
	_Alignas(8) uint8_t hello[EMB_WIRE_HDR_SIZE + 8 + EMB_WIRE_TOKEN_MAX +
				  EMB_WIRE_CLIENT_NAME_MAX];
	_Alignas(8) uint8_t ping[EMB_WIRE_HDR_SIZE + 16];
	struct emb_wire_iovs iovs;
	struct emb_frame_hdr hdr;
	struct iovec iov;
	int len, rc;

	len = emb_wire_hello_req_encode(hello, sizeof(hello), 0,
					EMB_WIRE_VERSION,
					p->o.token_len ? p->o.token : NULL,
					p->o.token_len, "scheduler-probe");
	if (len < 0)
		return len;
	memcpy(&hdr, hello, sizeof(hdr));
	iov = (struct iovec){hello + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call(conn, &hdr, &iov, 1, p->hello.resp, RESP_CAP,
			   call_done, &p->hello);
	if (rc)
		return rc;
	/* Sent behind HELLO without waiting: a server that refused the
	 * token closes, and that HELLO's answer is the one that counts. */
	rc = emb_wire_ping_encode(&iovs, 0, false, "probe", 5);
	if (rc >= 0)
		rc = emb_wire_iovs_flatten(&iovs, ping, sizeof(ping));
	if (rc >= 0) {
		memcpy(&hdr, ping, sizeof(hdr));
		iov = (struct iovec){ping + EMB_WIRE_HDR_SIZE,
				     (size_t)rc - EMB_WIRE_HDR_SIZE};
		rc = emb_conn_call(conn, &hdr, &iov, 1, p->ping.resp,
				   RESP_CAP, call_done, &p->ping);
	}
	if (rc < 0)
		p->ping = (struct call){.done = true, .status = rc};
	for (;;) {
		int64_t left = deadline_ms - (int64_t)emb_clock_ms();

		if ((p->hello.done && p->hello.status == 0) ||
		    (p->ping.done && p->ping.status == 0))
			return 0;
		if (p->hello.done && p->ping.done)
			return p->hello.status;
		if (left <= 0)
			return -ETIMEDOUT;
		emb_transport_poll(emb_conn_loop(conn),
				   left < 50 ? (int)left : 50);
	}
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	int64_t start = (int64_t)emb_clock_ms();
	struct emb_transport *tr;
	struct emb_conn *conn;
	int rc;

	/* Named here: once it posts its task, p may be freed by the loop. */
	pthread_setname_np(pthread_self(), "emb-probe");

	to.connect_timeout_ms = p->o.timeout_ms;
	to.call_timeout_ms = p->o.timeout_ms;
	to.max_frame_bytes = EMB_WIRE_HDR_SIZE + RESP_CAP;
	to.max_inflight = 4;
	rc = emb_transport_create("tcp", &to, &tr);
	if (rc)
		goto out;
	co.host = p->host;
	co.port = p->o.port;
	rc = emb_conn_create(tr, &co, &conn);
	if (rc)
		goto out_tr;
	rc = ask(p, conn, start + p->o.timeout_ms);
	emb_conn_destroy(conn);
out_tr:
	emb_transport_destroy(tr);
out:
	p->status = rc;
	p->took_ms = (uint32_t)((int64_t)emb_clock_ms() - start);
	/* From here on p belongs to the asking loop. */
	emb_transport_post(p->o.reply_to, &p->task);
	return NULL;
}

/* On the asking loop: the thread is done with p but for its exit. */
static void deliver(void *arg)
{
	struct probe *p = arg;

	pthread_join(p->thread, NULL);
	p->o.done(p->o.arg, p->status, p->took_ms);
	free(p);
}

int emb_probe_start(const struct emb_probe_opts *opts)
{
	struct probe *p;
	int rc;

	if (!opts || !opts->host || !opts->done || !opts->reply_to ||
	    !opts->timeout_ms || strlen(opts->host) > EMB_WIRE_HOST_MAX ||
	    opts->token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->token_len && !opts->token))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->o = *opts;
	snprintf(p->host, sizeof(p->host), "%s", opts->host);
	p->o.host = p->host;
	if (opts->token_len)
		memcpy(p->token, opts->token, opts->token_len);
	p->o.token = p->token;
	p->task.fn = deliver;
	p->task.arg = p;
	/* Named by itself: it may have ended before this returns. */
	rc = emb_thread_start(&p->thread, NULL, probe_main, p, NULL);
	if (rc)
		free(p);
	return rc;
}
