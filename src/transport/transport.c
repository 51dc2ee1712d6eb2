/*
 * src/transport/transport.c - what every transport shares: the
 * cross-thread task mailbox and wake-up eventfd, header checks, the stats
 * and fault hooks the back-ends put in their vtables, and the non-inline
 * shims. It calls the back-ends only through their vtables (opening one by
 * name is backends.c's). emb_transport_exec(), _wake(), _stop() and
 * _stats() may be called from any thread; the rest from the loop's thread,
 * as transport.h says.
 */
#include "transport/transport_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

struct emb__transport_common {
	pthread_mutex_t lock;  /* guards head/tail */
	struct emb_task *head; /* oldest queued task: _exec()'s are
				  malloc'd (heap), _post()'s the caller's */
	struct emb_task *tail; /* newest queued task */
	int wake_fd;	       /* eventfd the loop watches */
	int stop;	       /* set by emb_transport_stop (atomic) */
};

void emb_transport_destroy(struct emb_transport *tr)
{
	if (tr)
		tr->ops->destroy(tr);
}

int emb__transport_init(struct emb_transport *tr,
			const struct emb_transport_ops *ops,
			const struct emb_transport_opts *opts, int *wake_fd)
{
	const struct emb_transport_opts def = EMB_TRANSPORT_OPTS_DEFAULT;
	struct emb__transport_common *cm;
	int rc;

	memset(tr, 0, sizeof(*tr));
	tr->ops = ops;
	tr->opts = *opts;
	if (!tr->opts.max_frame_bytes)
		tr->opts.max_frame_bytes = def.max_frame_bytes;
	if (!tr->opts.out_queue_max)
		tr->opts.out_queue_max = def.out_queue_max;
	if (!tr->opts.max_inflight)
		tr->opts.max_inflight = def.max_inflight;
	if (!tr->opts.connect_timeout_ms)
		tr->opts.connect_timeout_ms = def.connect_timeout_ms;
	/* call_timeout_ms 0 stays 0: "no deadline" is a valid choice. */
	if (tr->opts.max_frame_bytes < EMB_FRAME_HDR_SIZE ||
	    tr->opts.max_inflight > (1u << 20) ||
	    tr->opts.copy_max_bytes > (64u << 10) ||
	    (tr->opts.login_frame_bytes &&
	     tr->opts.login_frame_bytes < EMB_FRAME_HDR_SIZE))
		return -EINVAL;

	cm = calloc(1, sizeof(*cm));
	if (!cm)
		return -ENOMEM;
	rc = pthread_mutex_init(&cm->lock, NULL);
	if (rc) {
		rc = -rc;
		goto err_free_cm;
	}
	cm->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cm->wake_fd < 0) {
		rc = -errno;
		goto err_destroy_lock;
	}
	tr->common = cm;
	*wake_fd = cm->wake_fd;
	return 0;

err_destroy_lock:
	pthread_mutex_destroy(&cm->lock);
err_free_cm:
	free(cm);
	return rc;
}

void emb__transport_fini(struct emb_transport *tr)
{
	struct emb__transport_common *cm = tr->common;

	if (!cm)
		return;
	emb__transport_run_tasks(tr);
	close(cm->wake_fd);
	pthread_mutex_destroy(&cm->lock);
	free(cm);
	tr->common = NULL;
}

int emb__transport_run_tasks(struct emb_transport *tr)
{
	struct emb__transport_common *cm = tr->common;
	struct emb_task *t, *next;
	uint64_t v;
	int n = 0;

	/* Clear first: a task posted after this read wakes the next poll. */
	if (read(cm->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		emb_log(EMB_LOG_WARN, "transport: wake fd read: %s",
			emb_strerror(-errno));
	/* Tasks may post tasks; loop until the queue stays empty. */
	for (;;) {
		pthread_mutex_lock(&cm->lock);
		t = cm->head;
		cm->head = cm->tail = NULL;
		pthread_mutex_unlock(&cm->lock);
		if (!t)
			break;
		for (; t; t = next) {
			/* A caller's task may be reused or freed by fn: read
			 * everything first. */
			bool ours = t->heap;

			next = t->next;
			t->fn(t->arg);
			if (ours)
				free(t);
			n++;
		}
	}
	return n;
}

bool emb__transport_stopping(struct emb_transport *tr)
{
	return __atomic_load_n(&tr->common->stop, __ATOMIC_ACQUIRE) != 0;
}

static void post(struct emb__transport_common *cm, struct emb_task *t)
{
	t->next = NULL;
	pthread_mutex_lock(&cm->lock);
	if (cm->tail)
		cm->tail->next = t;
	else
		cm->head = t;
	cm->tail = t;
	pthread_mutex_unlock(&cm->lock);
}

int emb_transport_exec(struct emb_transport *tr, emb_task_fn fn, void *arg)
{
	struct emb__transport_common *cm = tr->common;
	struct emb_task *t;

	if (!fn)
		return -EINVAL;
	t = malloc(sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->fn = fn;
	t->arg = arg;
	t->heap = true;
	post(cm, t);
	emb_transport_wake(tr);
	return 0;
}

int emb_transport_post(struct emb_transport *tr, struct emb_task *t)
{
	if (!t || !t->fn)
		return -EINVAL;
	t->heap = false;
	post(tr->common, t);
	emb_transport_wake(tr);
	return 0;
}

void emb_transport_wake(struct emb_transport *tr)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: a wake is pending. */
	if (write(tr->common->wake_fd, &one, sizeof(one)) < 0 &&
	    errno != EAGAIN)
		emb_log(EMB_LOG_WARN, "transport: wake fd write: %s",
			emb_strerror(-errno));
}

void emb_transport_stop(struct emb_transport *tr)
{
	__atomic_store_n(&tr->common->stop, 1, __ATOMIC_RELEASE);
	emb_transport_wake(tr);
}

int emb_transport_run(struct emb_transport *tr)
{
	int rc;

	/*
	 * The flag is cleared on the way out, not on the way in, so a stop
	 * that lands before the thread reaches run() is not lost.
	 */
	while (!emb__transport_stopping(tr)) {
		rc = tr->ops->poll(tr, -1);
		if (rc < 0 && rc != -EINTR)
			goto out;
	}
	rc = 0;
out:
	__atomic_store_n(&tr->common->stop, 0, __ATOMIC_RELEASE);
	return rc;
}

void emb_transport_stats(const struct emb_transport *tr,
			 struct emb_transport_stats *out)
{
	tr->ops->stats(tr, out);
}

void emb__transport_stats_read(const struct emb_transport *tr,
			       struct emb_transport_stats *out)
{
	const uint64_t *src = (const uint64_t *)&tr->stats;
	uint64_t *dst = (uint64_t *)out;

	/* All fields are uint64_t; load each one tear-free. */
	_Static_assert(sizeof(*out) % sizeof(uint64_t) == 0,
		       "stats are all uint64_t");
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

void emb_transport_fault_set(struct emb_transport *tr,
			     enum emb_fault_point point, uint32_t nth, int rc)
{
	if ((unsigned)point >= EMB_FAULT_NPOINTS)
		return;
	tr->ops->fault_set(tr, point, nth, rc);
}

void emb__transport_fault_arm(struct emb_transport *tr,
			      enum emb_fault_point point, uint32_t nth, int rc)
{
	tr->fault_rc[point] = rc;
	__atomic_store_n(&tr->fault_nth[point], nth, __ATOMIC_RELAXED);
}

int emb__frame_check(struct emb_transport *tr, const struct emb_frame_hdr *h)
{
	int rc = emb_frame_hdr_check(h);

	if (__builtin_expect(rc == 0, 1)) {
		if (emb_frame_fits(h, tr->opts.max_frame_bytes))
			return 0;
		EMB__STAT_ADD(tr->stats.err_too_big, 1);
		return EMB_ETOOBIG;
	}
	if (rc == EMB_EBADMAGIC)
		EMB__STAT_ADD(tr->stats.err_bad_magic, 1);
	else
		EMB__STAT_ADD(tr->stats.err_bad_version, 1);
	return rc;
}

uint64_t emb__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- non-inline shims ---------------------------------------------------- */

void emb_listener_destroy(struct emb_listener *l)
{
	if (l)
		l->tr->ops->listener_destroy(l);
}

void emb_conn_destroy(struct emb_conn *c)
{
	if (c)
		c->tr->ops->conn_destroy(c);
}

void emb_conn_close(struct emb_conn *c, int reason)
{
	if (c)
		c->tr->ops->conn_close(c, reason);
}

struct sync_call {
	bool done;		    /* the callback ran */
	int status;		    /* its status */
	struct emb_frame_hdr *resp; /* where to copy the header, or NULL */
};

static void sync_done(void *ctx, int status, const struct emb_frame_hdr *resp)
{
	struct sync_call *s = ctx;

	s->status = status;
	if (status == 0 && s->resp)
		*s->resp = *resp;
	s->done = true;
}

int emb_conn_call_sync(struct emb_conn *c, const struct emb_frame_hdr *hdr,
		       const struct iovec *iov, int niov, void *resp_buf,
		       size_t resp_cap, struct emb_frame_hdr *resp)
{
	struct sync_call s = {.done = false, .status = 0, .resp = resp};
	int rc;

	rc =
	    emb_conn_call(c, hdr, iov, niov, resp_buf, resp_cap, sync_done, &s);
	if (rc)
		return rc;
	/* The call's deadline (or the conn closing) bounds this loop. */
	while (!s.done)
		emb_transport_poll(c->tr, 100);
	return s.status;
}

int emb_transport_buf_alloc(struct emb_transport *tr, size_t len, void **addr,
			    struct emb_mr **mr)
{
	size_t page = 4096, n;
	void *p;
	int rc;

	if (!len || !addr || !mr)
		return -EINVAL;
	n = (len + page - 1) & ~(page - 1);
	p = aligned_alloc(page, n);
	if (!p)
		return -ENOMEM;
	rc = emb_transport_reg_mem(tr, p, n, mr);
	if (rc)
		goto err_free;
	*addr = p;
	return 0;

err_free:
	free(p);
	return rc;
}

void emb_transport_buf_free(struct emb_transport *tr, void *addr,
			    struct emb_mr *mr)
{
	emb_transport_dereg_mem(tr, mr);
	free(addr);
}
