/*
 * src/common/authlimit.h - slows down token guessing: failed HELLOs are
 * counted per peer address (any port), and after a few a peer must wait,
 * twice as long after each further failure, before its next token is even
 * compared. A success from the address forgives it. Used by the server and
 * the scheduler. Thread-safe: one mutex.
 */
#ifndef EMB_COMMON_AUTHLIMIT_H
#define EMB_COMMON_AUTHLIMIT_H

#include <stdint.h>

#define EMB_AUTH_FREE_FAILS 5u	  /* failures before waits start */
#define EMB_AUTH_WAIT_MIN_MS 250u /* the first wait */
#define EMB_AUTH_WAIT_MAX_MS 5000u /* the longest */
#define EMB_AUTH_PEERS 1024u	  /* addresses remembered */

struct emb_authlimit;

/* 0 and *out, or -ENOMEM. */
int emb_authlimit_create(struct emb_authlimit **out);
void emb_authlimit_destroy(struct emb_authlimit *al); /* NULL: no-op */

/*
 * peer is "addr:port" or "[v6]:port" (the port is ignored). Returns 0 when
 * its token may be compared now, or the ms it must still wait.
 */
uint32_t emb_authlimit_wait_ms(struct emb_authlimit *al, const char *peer);

/* A token from peer was wrong / right. */
void emb_authlimit_fail(struct emb_authlimit *al, const char *peer);
void emb_authlimit_ok(struct emb_authlimit *al, const char *peer);

#endif
