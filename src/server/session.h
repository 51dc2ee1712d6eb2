/*
 * src/server/session.h - at-most-once pushes: every client session's recent
 * PUSH sequence numbers, so that a push the client retried after losing its
 * connection is acknowledged without being applied a second time.
 *
 * A session remembers the last EMB_SESSION_WINDOW sequence numbers below its
 * highest one; the server remembers EMB_SESSIONS_MAX sessions and forgets
 * the one that pushed least recently to make room (within its stripe: the
 * sessions are spread over 16 stripes of EMB_SESSIONS_MAX / 16 by their
 * id's hash). Nothing is kept across a restart. Thread-safe: pushes arrive
 * on every loop thread; one mutex per stripe.
 */
#ifndef EMB_SERVER_SESSION_H
#define EMB_SERVER_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#define EMB_SESSION_WINDOW 4096u /* sequence numbers per session */
#define EMB_SESSIONS_MAX   4096u /* sessions remembered */

struct emb_sessions;

/* 0 and *out, or -ENOMEM. */
int emb__sessions_create(struct emb_sessions **out);
void emb__sessions_destroy(struct emb_sessions *ss); /* NULL is a no-op */

/*
 * Claims (session, seq) before its push is applied: 0 (first time: apply
 * it, then emb__sessions_done() or, if that failed, emb__sessions_undo()),
 * 1 (applied before: acknowledge without applying), or EMB_ERETRYLATE
 * (older than the window: whether it was applied is unknown, so it is
 * not). A claim still pending (its push being applied by another thread)
 * is waited for first; the caller must not hold a claim of its own that
 * is pending.
 */
int emb__sessions_claim(struct emb_sessions *ss, uint64_t session,
			uint64_t seq);

/*
 * Whether (session, seq) was applied within the window (waiting, as
 * claim does, for a pending claim to settle); counted as a duplicate when
 * it was. For a push whose route the server's map now refuses: sent again
 * after its connection broke, it may have been applied before the map
 * changed.
 */
bool emb__sessions_seen(struct emb_sessions *ss, uint64_t session,
			uint64_t seq);

/* Settles a claim: its push was applied. */
void emb__sessions_done(struct emb_sessions *ss, uint64_t session,
			uint64_t seq);

/* Settles a claim whose push failed: released, so that a retry is applied. */
void emb__sessions_undo(struct emb_sessions *ss, uint64_t session,
			uint64_t seq);

/* Retried pushes acknowledged without being applied, since create. */
uint64_t emb__sessions_dups(struct emb_sessions *ss);

#endif
