/*
 * src/transport/transport_int.h - what transport.c shares with the
 * back-ends (tcp.c, rdma_conn.c, dual.c): the ops tables, the cross-thread
 * task mailbox, and the stats and fault helpers their vtables use. Not seen
 * outside src/transport. Threads as in transport.h.
 */
#ifndef EMB_TRANSPORT_TRANSPORT_INT_H
#define EMB_TRANSPORT_TRANSPORT_INT_H

#include "transport/transport.h"

#include <stddef.h>

extern const struct emb_transport_ops emb__tcp_ops;
#ifdef EMB_HAVE_RDMA
/* rdma_conn.c: create returns -ENODEV when no device is present. */
extern const struct emb_transport_ops emb__rdma_ops;
/* dual.c: one loop over a TCP and an RDMA transport; "tcp,rdma" connects
 * over TCP unless told, "rdma,tcp" over RDMA. */
extern const struct emb_transport_ops emb__dual_tcp_ops;
extern const struct emb_transport_ops emb__dual_rdma_ops;
#endif

/*
 * What the dual transport needs from the two it drives (loop thread).
 * _fd is the epoll fd that becomes readable when the transport has work.
 * _sleep_prep is called after a poll(0) found nothing and before the dual
 * loop sleeps: it returns how many events it handled on the way (> 0: do
 * not sleep), and lowers *wait_ms (-1 = forever) to the transport's next
 * call deadline. The RDMA one spins on the CQ for a moment and arms it.
 */
int emb__tcp_fd(struct emb_transport *tr);
int emb__tcp_sleep_prep(struct emb_transport *tr, int *wait_ms);
#ifdef EMB_HAVE_RDMA
int emb__rdma_fd(struct emb_transport *tr);
int emb__rdma_sleep_prep(struct emb_transport *tr, int *wait_ms);
#endif

#define emb__container_of(ptr, type, member)                                   \
	((type *)((char *)(ptr)-offsetof(type, member)))

/*
 * Single-writer counters: only the loop thread adds, any thread reads with
 * emb_transport_stats(). Relaxed atomic stores keep readers tear-free
 * without a locked instruction per frame.
 */
#define EMB__STAT_ADD(field, n)                                                \
	__atomic_store_n(&(field), (field) + (n), __ATOMIC_RELAXED)

static inline void emb__stat_max(uint64_t *field, uint64_t v)
{
	if (v > *field)
		__atomic_store_n(field, v, __ATOMIC_RELAXED);
}

/*
 * Sets up the common part of tr (copies opts with defaults filled in, makes
 * the wake-up eventfd and the task mailbox). 0, -EINVAL (bad opts), -ENOMEM,
 * or -errno from eventfd. On success *wake_fd is the fd the loop must watch
 * for reading; when it is readable call emb__transport_run_tasks().
 */
int emb__transport_init(struct emb_transport *tr,
			const struct emb_transport_ops *ops,
			const struct emb_transport_opts *opts, int *wake_fd);
/* Runs queued tasks (so none are lost) and frees the common part. */
void emb__transport_fini(struct emb_transport *tr);
/* Loop thread: clears the wake-up fd and runs every queued task. Returns
 * how many ran. */
int emb__transport_run_tasks(struct emb_transport *tr);
/* Loop thread: true once emb_transport_stop() was called. */
bool emb__transport_stopping(struct emb_transport *tr);

/*
 * The stats and fault_set ops of a transport that counts in its own
 * struct emb_transport (TCP, RDMA): a tear-free copy of tr->stats, and
 * arming tr->fault_nth / fault_rc, which the shims' emb__fault_hit() reads.
 */
void emb__transport_stats_read(const struct emb_transport *tr,
			       struct emb_transport_stats *out);
void emb__transport_fault_arm(struct emb_transport *tr,
			      enum emb_fault_point point, uint32_t nth, int rc);

/* Header checks shared by every transport: 0 or EMB_EBADMAGIC,
 * EMB_EBADVERSION, EMB_ETOOBIG; bumps the matching error counter. */
int emb__frame_check(struct emb_transport *tr, const struct emb_frame_hdr *h);

/* CLOCK_MONOTONIC in milliseconds (coarse clock: deadlines only). */
uint64_t emb__now_ms(void);

#endif
