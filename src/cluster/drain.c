/*
 * src/cluster/drain.c - DRAIN and MOVES to a scheduler (drain.h).
 */
#include "cluster/drain.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cluster/hello.h"
#include "common/err.h"
#include "proto/wire_cluster.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

/*
 * One request req[0..len) to the scheduler at host:port on a connection
 * of its own (HELLO first with a token), its response in resp[0..cap)
 * and *rhdr: 0, the scheduler's status with its reason in why, or a
 * connection error.
 */
static int sched_call(const char *host, uint16_t port, const uint8_t *token,
		      uint32_t token_len, const uint8_t *req, int len,
		      uint32_t timeout_ms, void *resp, size_t cap,
		      struct emb_frame_hdr *rhdr, char *why, size_t why_cap)
{
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_transport *tr = NULL;
	struct emb_conn *conn = NULL;
	struct emb_frame_hdr hdr;
	struct emb_wire_limits lim;
	struct iovec iov;
	int rc;

	if (why && why_cap)
		why[0] = '\0';
	if (!host || !port)
		return -EINVAL;
	co.host = host;
	co.port = port;
	to.call_timeout_ms = timeout_ms ? timeout_ms : 10000;
	rc = emb_transport_create("tcp", &to, &tr);
	if (!rc)
		rc = emb_conn_create(tr, &co, &conn);
	if (!rc && token_len)
		rc = emb_hello(conn, token, token_len, "embstore-scale", &lim,
			       why, why_cap);
	if (!rc) {
		memcpy(&hdr, req, sizeof(hdr));
		iov = (struct iovec){(uint8_t *)req + EMB_WIRE_HDR_SIZE,
				     (size_t)len - EMB_WIRE_HDR_SIZE};
		rc = emb_conn_call_sync(conn, &hdr, &iov, iov.iov_len ? 1 : 0,
					resp, cap, rhdr);
	}
	if (!rc && rhdr->status < 0) {
		struct emb_wire_limits dl = EMB_WIRE_LIMITS_DEFAULT;
		struct emb_wire_frame f = {
		    .hdr = *rhdr, .payload = resp, .lim = &dl};
		struct emb_wire_error e;

		rc = rhdr->status;
		/* The scheduler's reason, as its error frame carries it. */
		if (why && why_cap && emb_wire_error_decode(&f, &e) == 0)
			snprintf(why, why_cap, "%.*s", (int)e.msg_len, e.msg);
	}
	emb_conn_destroy(conn);
	emb_transport_destroy(tr);
	return rc;
}

int emb_sched_drain(const char *host, uint16_t port, const uint8_t *token,
		    uint32_t token_len, uint32_t rank, uint32_t timeout_ms,
		    char *why, size_t why_cap)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE + EMB_WIRE_DRAIN_REQ_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX + 64];
	struct emb_frame_hdr rhdr;
	int len;

	if (why && why_cap)
		why[0] = '\0';
	len = emb_wire_drain_req_encode(req, sizeof(req), 0, rank);
	if (len < 0)
		return len == EMB_EBADARG ? -EINVAL : len;
	return sched_call(host, port, token, token_len, req, len, timeout_ms,
			  resp, sizeof(resp), &rhdr, why, why_cap);
}

int emb_sched_moves(const char *host, uint16_t port, const uint8_t *token,
		    uint32_t token_len, uint32_t timeout_ms,
		    struct emb_wire_moves *out, char *why, size_t why_cap)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX + 64];
	struct emb_wire_limits dl = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_frame_hdr rhdr;
	struct emb_wire_frame f;
	int len, rc;

	len = emb_wire_moves_req_encode(req, sizeof(req), 0);
	if (len < 0)
		return len;
	rc = sched_call(host, port, token, token_len, req, len, timeout_ms,
			resp, sizeof(resp), &rhdr, why, why_cap);
	if (rc)
		return rc;
	f = (struct emb_wire_frame){.hdr = rhdr, .payload = resp, .lim = &dl};
	return emb_wire_moves_resp_decode(&f, out);
}
