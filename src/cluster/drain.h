/*
 * src/cluster/drain.h - asking a scheduler to drain a server
 * (docs/replication.md, "Moving slots"): the one place that sends DRAIN,
 * for `embstore scale --remove` (through emb_cluster_drain()) and for a
 * server that drains itself on SIGTERM. Not installed.
 */
#ifndef EMB_CLUSTER_DRAIN_H
#define EMB_CLUSTER_DRAIN_H

#include <stddef.h>
#include <stdint.h>

/*
 * Connects to the scheduler at host:port (HELLO with token[0..token_len)
 * first when token_len > 0), asks it to drain server rank, and waits at
 * most timeout_ms for each step. 0 once the drain is queued (asked before
 * is no error); else the scheduler's status (EMB_EBADARG, EMB_ENODEAD,
 * EMB_ECLUSTER, EMB_EAUTH...) with its reason in why[0..why_cap) when why
 * is not NULL, or a connection error, or -EINVAL (a rank too large).
 * Blocks the calling thread: its own transport, not shared.
 */
int emb_sched_drain(const char *host, uint16_t port, const uint8_t *token,
		    uint32_t token_len, uint32_t rank, uint32_t timeout_ms,
		    char *why, size_t why_cap);

/*
 * As emb_sched_drain(), but asks for the drain, join or recovery under way
 * (MOVES): 0 and *out, the scheduler's status (-EOPNOTSUPP from a
 * scheduler before MOVES), or a connection error.
 */
struct emb_wire_moves;
int emb_sched_moves(const char *host, uint16_t port, const uint8_t *token,
		    uint32_t token_len, uint32_t timeout_ms,
		    struct emb_wire_moves *out, char *why, size_t why_cap);

#endif
