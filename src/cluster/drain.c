/*
 * src/cluster/drain.c - DRAIN to a scheduler (drain.h).
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

int emb_sched_drain(const char *host, uint16_t port, const uint8_t *token,
		    uint32_t token_len, uint32_t rank, uint32_t timeout_ms,
		    char *why, size_t why_cap)
{
	_Alignas(8) uint8_t req[EMB_WIRE_HDR_SIZE + EMB_WIRE_DRAIN_REQ_SIZE];
	_Alignas(8) uint8_t resp[EMB_WIRE_ERRMSG_MAX + 64];
	struct emb_transport_opts to = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb_connect_opts co = EMB_CONNECT_OPTS_DEFAULT;
	struct emb_transport *tr = NULL;
	struct emb_conn *conn = NULL;
	struct emb_frame_hdr hdr, rhdr;
	struct emb_wire_limits lim;
	struct iovec iov;
	int rc, len;

	if (why && why_cap)
		why[0] = '\0';
	if (!host || !port)
		return -EINVAL;
	len = emb_wire_drain_req_encode(req, sizeof(req), 0, rank);
	if (len < 0)
		return len == EMB_EBADARG ? -EINVAL : len;
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
		iov = (struct iovec){req + EMB_WIRE_HDR_SIZE,
				     (size_t)len - EMB_WIRE_HDR_SIZE};
		rc = emb_conn_call_sync(conn, &hdr, &iov, 1, resp,
					sizeof(resp), &rhdr);
	}
	if (!rc && rhdr.status < 0) {
		struct emb_wire_limits dl = EMB_WIRE_LIMITS_DEFAULT;
		struct emb_wire_frame f = {
		    .hdr = rhdr, .payload = resp, .lim = &dl};
		struct emb_wire_error e;

		rc = rhdr.status;
		/* The scheduler's reason, as its error frame carries it. */
		if (why && why_cap && emb_wire_error_decode(&f, &e) == 0)
			snprintf(why, why_cap, "%.*s", (int)e.msg_len, e.msg);
	}
	emb_conn_destroy(conn);
	emb_transport_destroy(tr);
	return rc;
}
