/*
 * src/cluster/hello.c - the HELLO handshake (hello.h). Threads as
 * emb_conn_call_sync().
 */
#include "cluster/hello.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

int emb_hello(struct emb_conn *conn, const uint8_t *token, uint32_t token_len,
	      const char *name, struct emb_wire_limits *lim, char *errmsg,
	      size_t errcap)
{
	return emb_hello_flags(conn, 0, token, token_len, name, lim, errmsg,
			       errcap);
}

int emb_hello_encode(void *buf, size_t cap, uint16_t flags,
		     const uint8_t *token, uint32_t token_len,
		     const char *name)
{
	int len = emb_wire_hello_req_encode_flags(buf, cap, 0, EMB_WIRE_VERSION,
						  flags,
						  token_len ? token : NULL,
						  token_len, name);

	return len == EMB_EBADARG ? -EINVAL : len;
}

int emb_hello_decode(const struct emb_frame_hdr *rhdr, const void *payload,
		     struct emb_wire_hello_resp *out, char *errmsg,
		     size_t errcap)
{
	struct emb_wire_limits dlim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f = {.hdr = *rhdr, .payload = payload,
				   .lim = &dlim};

	if (errmsg && errcap)
		errmsg[0] = '\0';
	if (rhdr->status < 0) {
		struct emb_wire_error e;

		if (errmsg && errcap && emb_wire_error_decode(&f, &e) == 0)
			snprintf(errmsg, errcap, "%.*s", (int)e.msg_len, e.msg);
		return rhdr->status;
	}
	return emb_wire_hello_resp_decode(&f, out);
}

int emb_hello_flags(struct emb_conn *conn, uint16_t flags,
		    const uint8_t *token, uint32_t token_len, const char *name,
		    struct emb_wire_limits *lim, char *errmsg, size_t errcap)
{
	_Alignas(8) uint8_t req[EMB_HELLO_REQ_MAX];
	_Alignas(8) uint8_t resp[EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX];
	struct emb_wire_hello_resp hr;
	struct emb_frame_hdr hdr, rhdr;
	struct iovec iov;
	int len, rc;

	if (errmsg && errcap)
		errmsg[0] = '\0';
	len = emb_hello_encode(req, sizeof(req), flags, token, token_len, name);
	if (len < 0)
		return len;
	memcpy(&hdr, req, sizeof(hdr));
	iov = (struct iovec){req + EMB_WIRE_HDR_SIZE,
			     (size_t)len - EMB_WIRE_HDR_SIZE};
	rc = emb_conn_call_sync(conn, &hdr, &iov, 1, resp, sizeof(resp), &rhdr);
	if (rc)
		return rc;
	rc = emb_hello_decode(&rhdr, resp, &hr, errmsg, errcap);
	if (rc)
		return rc;
	*lim = hr.limits;
	return 0;
}
