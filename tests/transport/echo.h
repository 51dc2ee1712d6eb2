/*
 * tests/transport/echo.h - a small server on the transport API for tests and
 * the loopback benchmark. Runs nloops loops, each in its own thread, behind
 * one listener on 127.0.0.1 with an ephemeral port. What it does with a
 * request depends on the request's opcode (ECHO_OP_*).
 */
#ifndef EMB_TESTS_TRANSPORT_ECHO_H
#define EMB_TESTS_TRANSPORT_ECHO_H

#include <stdint.h>

#include "proto/wire.h"
#include "transport/transport.h"

#define ECHO_OP_ECHO 1 /* reply with the request's payload, zero copy */
#define ECHO_OP_SINK 2 /* never reply; released when the conn closes */
#define ECHO_OP_BIG  3 /* reply with hdr.count bytes of echo_pattern() */
#define ECHO_OP_REV  4 /* hold until hdr.table_id are held, reply in reverse */
#define ECHO_OP_ROWS                                                           \
	5 /* payload: uint64 ids; reply: one row per id, each                  \
	     an iov straight into a row table */
#define ECHO_OP_LATE                                                           \
	6 /* hold; reply only once the conn has closed (the                    \
	     reply's result is kept: echo_late_rc) */

#define ECHO_ROW_FLOATS 64u    /* floats sent per row */
#define ECHO_ROW_STRIDE 128u   /* floats per row record (weights + state) */
#define ECHO_NROWS	65536u /* rows in the table; id % ECHO_NROWS */
#define ECHO_BIG_MAX	(8u << 20)

struct echo_server;

/* Starts a server; opts may be NULL. 0 or a negative code. */
int echo_start(const char *transport, unsigned nloops,
	       const struct emb_transport_opts *opts, struct echo_server **out);
uint16_t echo_port(const struct echo_server *s);
/* Sum of the loops' transport stats. Any thread. */
void echo_stats(const struct echo_server *s, struct emb_transport_stats *out);
/* Stats of loop i alone. Any thread. */
void echo_loop_stats(const struct echo_server *s, unsigned i,
		     struct emb_transport_stats *out);
/* What the last LATE reply returned; 1 before any. Any thread. */
int echo_late_rc(const struct echo_server *s);
/* Stops the loops, releases held requests, destroys everything. */
void echo_stop(struct echo_server *s);

/* Byte i of a BIG reply. */
static inline uint8_t echo_pattern(size_t i)
{
	return (uint8_t)(i * 7u + 1u);
}

/* Value of float j of row id in the server's table. */
static inline float echo_row_value(uint64_t id, unsigned j)
{
	return (float)(id % ECHO_NROWS) + (float)j / 128.0f;
}

#endif
