/*
 * src/cluster/hello.h - the HELLO handshake, once for everything that logs
 * in: the node agent (to the scheduler), the client library and the
 * embstore CLI's raw connections (to servers). Not installed.
 *
 * Threads: as emb_conn_call_sync() (transport.h): on a conn whose loop no
 * other thread is running.
 */
#ifndef EMB_CLUSTER_HELLO_H
#define EMB_CLUSTER_HELLO_H

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

struct emb_conn;

/*
 * Sends HELLO (protocol version, token[0..token_len) or none when
 * token_len is 0, and name as the client's name) on conn and waits for the
 * answer. 0 and the server's limits in *lim, or a transport error
 * (-ETIMEDOUT, -ECONNRESET, ...), or the server's status (EMB_EAUTH,
 * EMB_EVERSION, ...) with its message copied to errmsg (NUL-terminated,
 * cut to errcap; errmsg may be NULL), or -EINVAL (token or name too long).
 */
int emb_hello(struct emb_conn *conn, const uint8_t *token, uint32_t token_len,
	      const char *name, struct emb_wire_limits *lim, char *errmsg,
	      size_t errcap);

/*
 * The same with HELLO flags: EMB_F_ADMIN says token is the admin token and
 * asks for admin rights (docs/protocol.md). -EINVAL for other flags.
 */
int emb_hello_flags(struct emb_conn *conn, uint16_t flags,
		    const uint8_t *token, uint32_t token_len, const char *name,
		    struct emb_wire_limits *lim, char *errmsg, size_t errcap);

/*
 * The two halves of emb_hello_flags(), for a caller that sends HELLO
 * itself (the client library's reconnects, on its loop thread). Room for a
 * request: EMB_HELLO_REQ_MAX bytes, header included.
 */
#define EMB_HELLO_REQ_MAX                                                      \
	(EMB_WIRE_HDR_SIZE + 8 + EMB_WIRE_TOKEN_MAX + EMB_WIRE_CLIENT_NAME_MAX)

/* Writes the HELLO frame to buf; its length, or -EINVAL / -ENOSPC. */
int emb_hello_encode(void *buf, size_t cap, uint16_t flags,
		     const uint8_t *token, uint32_t token_len,
		     const char *name);

/*
 * Reads a HELLO response (rhdr and its payload, 8-aligned) into *out. 0,
 * or the server's status with its message in errmsg (as emb_hello()), or
 * EMB_EBADFRAME.
 */
struct emb_wire_hello_resp;
int emb_hello_decode(const struct emb_frame_hdr *rhdr, const void *payload,
		     struct emb_wire_hello_resp *out, char *errmsg,
		     size_t errcap);

#endif
