/*
 * src/server/memreg.c - a table's extents registered on every loop.
 *
 * Each extent gets one memory region per loop. A loop's registration runs
 * as a task on that loop; deregistration is posted to every loop too, and
 * the remover waits for all of them, because the store unmaps the extent as
 * soon as the hook returns and a stale region must never cover new memory.
 * Tasks of one loop run in order, so a deregistration always follows its
 * registration. Any thread may call the hook; the per-extent state is under
 * the map's mutex.
 */
#include "server/memreg.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "transport/transport.h"

enum reg_state {
	REG_PENDING = 0, /* registration task queued */
	REG_DONE,	 /* mr holds the region */
	REG_FAILED,	 /* registration failed; replies copy */
	REG_CANCELLED,	 /* removed before the task ran */
};

struct extent {
	void *addr;	     /* extent start */
	size_t len;	     /* bytes */
	uint32_t left;	     /* dereg tasks not yet run */
	uint32_t regs_left;  /* reg tasks not yet run */
	bool orphan;	     /* removed: the last reg task frees it */
	struct extent *next; /* list */
	uint8_t *state;	     /* enum reg_state per loop */
	struct emb_mr **mr;  /* per loop, when REG_DONE */
};

struct emb_memreg {
	struct emb_transport *const *loops; /* borrowed */
	uint32_t nloops;		    /* entries in loops */
	const bool *stopped;		    /* loops joined; atomic */
	pthread_mutex_t mu;		    /* guards extents and states */
	pthread_cond_t cv;		    /* a dereg task ran */
	struct extent *extents;		    /* registered or pending */
};

struct task {
	struct emb_memreg *m; /* owner */
	struct extent *e;     /* the extent */
	uint32_t loop;	      /* index of the loop it runs on */
};

static _Thread_local struct emb_transport *thread_loop;

void emb__memreg_set_thread_loop(struct emb_transport *tr)
{
	thread_loop = tr;
}

bool emb__memreg_on_loop(void)
{
	return thread_loop != NULL;
}

int emb__memreg_create(struct emb_transport *const *loops, uint32_t nloops,
		       const bool *stopped, struct emb_memreg **out)
{
	struct emb_memreg *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	m->loops = loops;
	m->nloops = nloops;
	m->stopped = stopped;
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	*out = m;
	return 0;
}

void emb__memreg_destroy(struct emb_memreg *m)
{
	if (!m)
		return;
	if (m->extents)
		emb_log(EMB_LOG_ERROR, "memreg destroyed with extents left");
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

static void free_extent(struct extent *e)
{
	free(e->state);
	free(e->mr);
	free(e);
}

static void reg_task(void *arg)
{
	struct task *t = arg;
	struct emb_memreg *m = t->m;
	struct extent *e = t->e;
	struct emb_mr *mr = NULL;
	bool go;
	int rc = 0;

	pthread_mutex_lock(&m->mu);
	go = e->state[t->loop] == REG_PENDING;
	pthread_mutex_unlock(&m->mu);
	if (go)
		rc = emb_transport_reg_mem(m->loops[t->loop], e->addr, e->len,
					   &mr);
	pthread_mutex_lock(&m->mu);
	if (go) {
		if (rc) {
			e->state[t->loop] = REG_FAILED;
			emb_log(EMB_LOG_WARN,
				"registering %zu bytes of table memory: %s "
				"(replies from it are copied)",
				e->len, emb_strerror(rc));
		} else {
			e->state[t->loop] = REG_DONE;
			e->mr[t->loop] = mr;
		}
	}
	e->regs_left--;
	go = e->orphan && e->regs_left == 0;
	pthread_mutex_unlock(&m->mu);
	if (go)
		free_extent(e);
	free(t);
}

/* Loop thread (or any thread once loops stopped): drops this loop's region. */
static void dereg_one(struct emb_memreg *m, struct extent *e, uint32_t j)
{
	struct emb_mr *mr = NULL;

	pthread_mutex_lock(&m->mu);
	if (e->state[j] == REG_DONE)
		mr = e->mr[j];
	e->state[j] = REG_CANCELLED;
	e->mr[j] = NULL;
	pthread_mutex_unlock(&m->mu);
	if (mr)
		emb_transport_dereg_mem(m->loops[j], mr);
}

static void dereg_task(void *arg)
{
	struct task *t = arg;
	struct emb_memreg *m = t->m;

	dereg_one(m, t->e, t->loop);
	pthread_mutex_lock(&m->mu);
	t->e->left--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	free(t);
}

static int added(struct emb_memreg *m, void *addr, size_t len)
{
	struct extent *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->state = calloc(m->nloops, sizeof(*e->state));
	e->mr = calloc(m->nloops, sizeof(*e->mr));
	if (!e->state || !e->mr) {
		free(e->state);
		free(e->mr);
		free(e);
		return -ENOMEM;
	}
	e->addr = addr;
	e->len = len;
	e->regs_left = m->nloops;
	pthread_mutex_lock(&m->mu);
	e->next = m->extents;
	m->extents = e;
	pthread_mutex_unlock(&m->mu);
	for (uint32_t j = 0; j < m->nloops; j++) {
		struct task *t = malloc(sizeof(*t));

		if (t) {
			*t = (struct task){m, e, j};
			if (emb_transport_exec(m->loops[j], reg_task, t) == 0)
				continue;
			free(t);
		}
		pthread_mutex_lock(&m->mu);
		e->state[j] = REG_FAILED;
		e->regs_left--;
		pthread_mutex_unlock(&m->mu);
	}
	return 0;
}

static void removed(struct emb_memreg *m, void *addr)
{
	bool stopped = __atomic_load_n(m->stopped, __ATOMIC_ACQUIRE);
	struct extent **pp, *e = NULL;
	bool orphan;

	pthread_mutex_lock(&m->mu);
	for (pp = &m->extents; *pp; pp = &(*pp)->next) {
		if ((*pp)->addr == addr) {
			e = *pp;
			*pp = e->next;
			break;
		}
	}
	pthread_mutex_unlock(&m->mu);
	if (!e)
		return;
	if (!stopped && emb__memreg_on_loop())
		emb_log(EMB_LOG_ERROR,
			"table memory removed on a loop thread; "
			"its regions are dropped without waiting");
	for (uint32_t j = 0; j < m->nloops; j++) {
		struct task *t;

		/* Stopped loops run no tasks: this thread owns them now. */
		if (stopped || emb__memreg_on_loop()) {
			dereg_one(m, e, j);
			continue;
		}
		t = malloc(sizeof(*t));
		if (t) {
			*t = (struct task){m, e, j};
			pthread_mutex_lock(&m->mu);
			e->left++;
			pthread_mutex_unlock(&m->mu);
			if (emb_transport_exec(m->loops[j], dereg_task, t) == 0)
				continue;
			pthread_mutex_lock(&m->mu);
			e->left--;
			pthread_mutex_unlock(&m->mu);
			free(t);
		}
		dereg_one(m, e, j);
	}
	pthread_mutex_lock(&m->mu);
	while (e->left)
		pthread_cond_wait(&m->cv, &m->mu);
	/* Registrations still queued on stopped loops run at their
	 * transport's destroy; they see REG_CANCELLED and free it. */
	orphan = e->orphan = e->regs_left > 0;
	pthread_mutex_unlock(&m->mu);
	if (!orphan)
		free_extent(e);
}

void emb__memreg_release_all(struct emb_memreg *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	for (struct extent *e = m->extents; e; e = e->next) {
		for (uint32_t j = 0; j < m->nloops; j++) {
			if (e->state[j] == REG_DONE)
				emb_transport_dereg_mem(m->loops[j], e->mr[j]);
			e->state[j] = REG_CANCELLED;
			e->mr[j] = NULL;
		}
	}
	pthread_mutex_unlock(&m->mu);
}

int emb__memreg_hook(void *arg, void *addr, size_t len, bool is_added)
{
	struct emb_memreg *m = arg;

	if (is_added)
		return added(m, addr, len);
	removed(m, addr);
	return 0;
}
