/*
 * src/cluster/probe.h - a direct probe of a server the scheduler suspects
 * (docs/replication.md#failure-detection): connect to the address the
 * server serves on, send HELLO with the job's token and a PING, and say
 * whether anything answered before the deadline. Any answer, an error
 * frame included, shows that the server's loops run; no answer (frozen,
 * cut off, gone) corroborates its silence.
 *
 * Each probe runs in a thread of its own with a transport of its own, so
 * a blocking connect or a peer that never answers never holds up the
 * loop that asked. The result comes back as a task on that loop.
 */
#ifndef EMB_CLUSTER_PROBE_H
#define EMB_CLUSTER_PROBE_H

#include <stdint.h>

#include "proto/wire.h"

struct emb_transport;

/*
 * A probe ended, on the reply_to loop's thread: status 0 when the server
 * answered (took_ms after the start), else why not (-ETIMEDOUT,
 * -ECONNREFUSED, EMB_EPEERDEAD, ...).
 */
typedef void (*emb_probe_fn)(void *arg, int status, uint32_t took_ms);

struct emb_probe_opts {
	const char *host;	     /* serving address; copied */
	uint16_t port;		     /* serving port */
	const uint8_t *token;	     /* HELLO token, or NULL; copied */
	uint32_t token_len;	     /* bytes, <= EMB_WIRE_TOKEN_MAX */
	uint32_t timeout_ms;	     /* for the whole probe, >= 1 */
	struct emb_transport *reply_to; /* done runs as a task on this loop;
					   borrowed until done has run */
	emb_probe_fn done;	     /* required */
	void *arg;		     /* for done */
};

/*
 * Starts a probe. 0: done will run exactly once on reply_to's loop (the
 * caller keeps that loop polled until then, even while shutting down).
 * Or -EINVAL (no host, done or reply_to; timeout 0; token too long),
 * -ENOMEM, or the negative errno of pthread_create: done never runs.
 */
int emb_probe_start(const struct emb_probe_opts *opts);

#endif
