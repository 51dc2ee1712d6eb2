/*
 * src/store/arena.c - a jemalloc arena per table, over extents we map.
 *
 * The arena's extent hooks mmap every extent themselves, so the store knows
 * each mapped range and can report it to its owner (the daemon hands these
 * to the RDMA transport, which registers whole extents as memory regions).
 * Hooks refuse to merge extents and to unmap them: an allocation therefore
 * never straddles two registered regions, and a region stays mapped (and
 * registered) until the table is destroyed. jemalloc calls the hooks from any
 * thread that allocates from the arena; the region list has its own lock.
 *
 * The spare: a table that grows asks for extent after extent of
 * GROW_LIMIT, each from inside a shard's lock (a slab for a new row), and
 * its first writes there faulted fresh pages in, zeroing each 2 MiB page
 * with that shard's lock held (2 to 4 ms a page where fresh memory is
 * written at 0.5 to 1 GB/s, as on the virtual machines measured),
 * stalling every pull and push of the shard: a joining server's copy,
 * 10M rows, held shard locks over 2 ms 883 times in 30 s without the
 * spare, 201 with it. Once an extent of GROW_LIMIT is handed out, the
 * next one is mapped and its pages written ahead; the next request of that
 * size takes it. A growing table keeps one spare: at most GROW_LIMIT
 * resident bytes more than its rows need.
 *
 * Who makes it: the arena's helper thread, woken by the next batch that
 * made rows once it let go of every lock (emb__arena_prepare()). Made by
 * that batch itself, on its own thread, the kernel's zeroing of two fresh
 * 2 MiB pages (4 to 12 ms here) stalled what else that thread serves: in
 * a server, a loop thread and all its connections; 216 batches of a drain
 * took 10 ms more each that way (docs/benchmarks.md, "Moving slots"). The
 * helper is started by the first such request, so a table that never grows
 * by whole steps has none. A process forked from one that started it has
 * no helper (threads do not survive fork): there the batch makes the spare
 * itself, as before, and destroy joins nothing.
 *
 * The pretouched pool (emb_store_pretouch()): one mapping, written once
 * when the process starts, that every arena's extents are cut from, in
 * order, before any fresh memory is mapped. A server that joins a job
 * takes a third of its rows in seconds; on the virtual machines measured
 * the kernel zeroed each fresh page at 0.5 to 2.5 GB/s, a third of the
 * CPU of a move with training paused (docs/benchmarks.md, "Moving
 * slots"). A piece never goes back to the pool: a table's destroy unmaps
 * it as any region, and the rest of the pool stays for the next.
 */
#include "store/store_int.h"

#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define GROW_LIMIT ((size_t)4 << 20) /* largest extent growth step */

struct region {
	void *addr; /* page aligned */
	size_t len; /* bytes */
};

struct emb_arena {
	extent_hooks_t hooks;	/* first: jemalloc hands its address back */
	unsigned ind;		/* jemalloc arena index */
	bool created;		/* ind is valid */
	pthread_mutex_t lock;	/* guards regions, fn, arg */
	struct region *regions; /* every extent mapped, in map order */
	size_t nregions;	/* live entries in regions */
	size_t cap;		/* room in regions */
	uint64_t bytes;		/* sum of region lengths */
	emb_extent_fn fn;	/* owner's hook, or NULL */
	void *arg;		/* passed back to fn */
	void *spare;		/* under lock: GROW_LIMIT bytes mapped and
				   written, 2 MiB aligned, or NULL */
	bool preparing;		/* under lock: a caller maps the spare */
	bool want_spare;	/* atomic: an extent of GROW_LIMIT went out
				   and no spare is ready */
	/* The helper that makes the spare, all under lock. */
	pthread_cond_t wake;	/* the helper waits for asked or stop */
	pthread_cond_t idle;	/* emb__arena_settle() waits for it */
	pthread_t helper;
	bool helper_on;		/* started, by helper_pid */
	pid_t helper_pid;
	bool asked;		/* a batch asked for a spare */
	bool stop;		/* destroy: the helper returns */
};

static bool huge_pages = true; /* emb_store_set_huge_pages() */

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static char *pool_next;	 /* under pool_mu: the pool's unused part */
static size_t pool_left; /* under pool_mu: its bytes */
static bool pool_made;	 /* under pool_mu: emb_store_pretouch() ran */

void emb_store_set_huge_pages(bool on)
{
	__atomic_store_n(&huge_pages, on, __ATOMIC_RELAXED);
}

static struct emb_arena *arena_of(extent_hooks_t *h)
{
	return (struct emb_arena *)(void *)h;
}

/* size bytes of the pool at alignment (a power of two, at least a page),
 * or NULL when what is left is too small. The gap an alignment skips is
 * unmapped: the pool's pages are resident. */
static char *pool_take(size_t size, size_t alignment)
{
	char *p = NULL;

	pthread_mutex_lock(&pool_mu);
	if (pool_next) {
		uintptr_t at = ((uintptr_t)pool_next + alignment - 1) &
			       ~(uintptr_t)(alignment - 1);
		size_t skip = (size_t)(at - (uintptr_t)pool_next);

		if (skip <= pool_left && size <= pool_left - skip) {
			if (skip)
				munmap(pool_next, skip);
			p = (char *)at;
			pool_next = p + size;
			pool_left -= skip + size;
			if (!pool_left)
				pool_next = NULL;
		}
	}
	pthread_mutex_unlock(&pool_mu);
	return p;
}

int emb_store_pretouch(uint64_t bytes)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t len, map_len;
	char *raw, *p;

	if (!bytes || bytes > SIZE_MAX / 2)
		return -EINVAL;
	len = ((size_t)bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	pthread_mutex_lock(&pool_mu);
	if (pool_made) {
		pthread_mutex_unlock(&pool_mu);
		return -EALREADY;
	}
	pool_made = true;
	pthread_mutex_unlock(&pool_mu);
	map_len = len + HUGE_PAGE;
	raw = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return -ENOMEM;
	p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) &
		     ~(uintptr_t)(HUGE_PAGE - 1));
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	if (raw + map_len > p + len)
		munmap(p + len, (size_t)(raw + map_len - (p + len)));
	if (__atomic_load_n(&huge_pages, __ATOMIC_RELAXED))
		madvise(p, len, MADV_HUGEPAGE);
	/* A zero into each page faults it in, zeroed, as make_spare()
	 * does: extents cut from it are zero, as jemalloc is told. */
	for (size_t off = 0; off < len; off += page)
		((volatile char *)p)[off] = 0;
	pthread_mutex_lock(&pool_mu);
	pool_next = p;
	pool_left = len;
	pthread_mutex_unlock(&pool_mu);
	return 0;
}

uint64_t emb_store_pretouch_left(void)
{
	uint64_t left;

	pthread_mutex_lock(&pool_mu);
	left = pool_left;
	pthread_mutex_unlock(&pool_mu);
	return left;
}

/* size bytes of fresh zero memory at an alignment (at least a page), on
 * 2 MiB pages from HUGE_PAGE up: from the pool while it has room, else
 * mapped now; NULL when the system has none. */
static char *map_aligned(size_t size, size_t alignment)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t map_len, lead, trail;
	char *raw, *p;

	if (alignment < page)
		alignment = page;
	/* Rows are read at random: 2 MiB pages keep their translations in
	 * the TLB (THP is often "madvise" only, so ask for it). */
	if (size >= HUGE_PAGE && alignment < HUGE_PAGE)
		alignment = HUGE_PAGE;
	if ((p = pool_take(size, alignment)))
		return p;
	map_len = size + alignment - page;
	if (map_len < size)
		return NULL;
	raw = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	p = (char *)(((uintptr_t)raw + alignment - 1) &
		     ~(uintptr_t)(alignment - 1));
	lead = (size_t)(p - raw);
	trail = map_len - lead - size;
	if (lead)
		munmap(raw, lead);
	if (trail)
		munmap(p + size, trail);
	if (size >= HUGE_PAGE && __atomic_load_n(&huge_pages, __ATOMIC_RELAXED))
		madvise(p, size, MADV_HUGEPAGE);
	return p;
}

/* The spare, when it fits a request of size at alignment; else NULL. */
static char *take_spare(struct emb_arena *a, size_t size, size_t alignment)
{
	char *p = NULL;

	if (size != GROW_LIMIT || alignment > HUGE_PAGE)
		return NULL;
	pthread_mutex_lock(&a->lock);
	if (a->spare) {
		p = a->spare;
		a->spare = NULL;
	}
	pthread_mutex_unlock(&a->lock);
	return p;
}

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size,
			size_t alignment, bool *zero, bool *commit,
			unsigned arena_ind)
{
	struct emb_arena *a = arena_of(h);
	emb_extent_fn fn;
	void *arg;
	char *p;

	(void)arena_ind;
	/* jemalloc asks for a fixed address only to grow in place; we never
	 * promise adjacency, so decline and let it allocate elsewhere. */
	if (new_addr)
		return NULL;
	p = take_spare(a, size, alignment);
	if (!p && !(p = map_aligned(size, alignment)))
		return NULL;
	/* Growing by whole steps: the next step is worth preparing. */
	if (size == GROW_LIMIT)
		__atomic_store_n(&a->want_spare, true, __ATOMIC_RELAXED);

	/* The owner's hook runs with no lock of ours held, so it may call
	 * back into the table (stats, say) without deadlocking. */
	pthread_mutex_lock(&a->lock);
	fn = a->fn;
	arg = a->arg;
	pthread_mutex_unlock(&a->lock);
	if (fn && fn(arg, p, size, true) != 0) {
		munmap(p, size);
		return NULL;
	}
	pthread_mutex_lock(&a->lock);
	if (a->nregions == a->cap) {
		size_t ncap = a->cap ? 2 * a->cap : 16;
		struct region *r = realloc(a->regions, ncap * sizeof(*r));

		if (!r)
			goto err_unlock;
		a->regions = r;
		a->cap = ncap;
	}
	a->regions[a->nregions++] = (struct region){p, size};
	a->bytes += size;
	pthread_mutex_unlock(&a->lock);

	*zero = true;
	*commit = true;
	return p;

err_unlock:
	pthread_mutex_unlock(&a->lock);
	if (fn)
		fn(arg, p, size, false);
	munmap(p, size);
	return NULL;
}

/* true = "not done": jemalloc keeps the extent mapped and reuses it. */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size,
			bool committed, unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
	return true;
}

/* Called for retained extents when the arena is destroyed; the regions are
 * unmapped as a whole by emb__arena_destroy(). */
static void hook_destroy(extent_hooks_t *h, void *addr, size_t size,
			 bool committed, unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size,
			size_t offset, size_t length, unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)offset, (void)length;
	(void)arena_ind;
	return false; /* always committed */
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size,
		       size_t size_a, size_t size_b, bool committed,
		       unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)size_a, (void)size_b;
	(void)committed, (void)arena_ind;
	return false; /* pieces stay inside one region: fine */
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a,
		       void *addr_b, size_t size_b, bool committed,
		       unsigned arena_ind)
{
	(void)h, (void)addr_a, (void)size_a, (void)addr_b, (void)size_b;
	(void)committed, (void)arena_ind;
	return true; /* never: a merged extent could span two regions */
}

int emb__arena_create(struct emb_arena **out)
{
	size_t grow_limit = GROW_LIMIT;
	char cmd[64];
	struct emb_arena *a;
	extent_hooks_t *hp;
	size_t sz = sizeof(unsigned);
	int rc;

	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->hooks = (extent_hooks_t){
	    .alloc = hook_alloc,
	    .dalloc = hook_dalloc,
	    .destroy = hook_destroy,
	    .commit = hook_commit,
	    .decommit = NULL,
	    .purge_lazy = NULL,
	    .purge_forced = NULL,
	    .split = hook_split,
	    .merge = hook_merge,
	};
	pthread_mutex_init(&a->lock, NULL);
	pthread_cond_init(&a->wake, NULL);
	pthread_cond_init(&a->idle, NULL);
	hp = &a->hooks;
	rc = mallctl("arenas.create", &a->ind, &sz, &hp, sizeof(hp));
	if (rc) {
		emb_log(EMB_LOG_ERROR, "jemalloc arenas.create failed: %s",
			emb_strerror(-rc));
		goto err_free;
	}
	a->created = true;
	/* jemalloc grows an arena's extents geometrically; the unused tail of
	 * the last one is mapped (and, with huge pages, often resident)
	 * memory the table pays for. Small steps keep that tail small. */
	snprintf(cmd, sizeof(cmd), "arena.%u.retain_grow_limit", a->ind);
	rc = mallctl(cmd, NULL, NULL, &grow_limit, sizeof(grow_limit));
	if (rc)
		emb_log(EMB_LOG_DEBUG, "jemalloc %s: %s", cmd,
			emb_strerror(-rc));
	*out = a;
	return 0;

err_free:
	pthread_cond_destroy(&a->wake);
	pthread_cond_destroy(&a->idle);
	pthread_mutex_destroy(&a->lock);
	free(a);
	return EMB_EARENA;
}

void (*emb__arena_while_preparing)(struct emb_arena *a);

/* Maps the spare and faults its pages in. Called and returns with the
 * arena's lock held, a spare not ready and none being made; lets the lock
 * go meanwhile. */
static void make_spare(struct emb_arena *a)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	char *p;

	a->preparing = true;
	__atomic_store_n(&a->want_spare, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&a->lock);
	if (emb__arena_while_preparing)
		emb__arena_while_preparing(a);
	p = map_aligned(GROW_LIMIT, HUGE_PAGE);
	/* A zero into each page faults it in, zeroed, now: the extent's
	 * contents stay what jemalloc is told they are (*zero). */
	for (size_t off = 0; p && off < GROW_LIMIT; off += page)
		((volatile char *)p)[off] = 0;
	pthread_mutex_lock(&a->lock);
	a->preparing = false;
	a->spare = p;
	/* Ready now, whatever went out while it was made: an extent taken
	 * meanwhile was mapped fresh and set the flag again, and left set
	 * it would send every batch that makes rows here for the arena's
	 * lock until the spare is used. */
	if (p)
		__atomic_store_n(&a->want_spare, false, __ATOMIC_RELAXED);
}

static void *helper_main(void *arg)
{
	struct emb_arena *a = arg;

	pthread_mutex_lock(&a->lock);
	while (!a->stop) {
		if (!a->asked) {
			pthread_cond_wait(&a->wake, &a->lock);
			continue;
		}
		a->asked = false;
		if (!a->spare && !a->preparing)
			make_spare(a);
		pthread_cond_broadcast(&a->idle);
	}
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

/* Under lock: the helper, started if this process has none yet; false
 * when there is none to ask (this process was forked from the one that
 * started it, or the thread could not be made). */
static bool helper_ready(struct emb_arena *a)
{
	int rc;

	if (a->helper_on)
		return a->helper_pid == getpid();
	rc = emb_thread_start(&a->helper, NULL, helper_main, a, "emb-spare");
	if (rc) {
		emb_log(EMB_LOG_DEBUG, "arena %u: no spare thread: %s", a->ind,
			emb_strerror(-rc));
		return false;
	}
	a->helper_on = true;
	a->helper_pid = getpid();
	return true;
}

void emb__arena_prepare(struct emb_arena *a)
{
	if (!a || !__atomic_load_n(&a->want_spare, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&a->lock);
	if (a->spare || a->preparing) {
		/* A spare is ready: nothing is wanted (see make_spare()). */
		if (a->spare)
			__atomic_store_n(&a->want_spare, false,
					 __ATOMIC_RELAXED);
	} else if (helper_ready(a)) {
		a->asked = true;
		pthread_cond_signal(&a->wake);
	} else {
		make_spare(a);
	}
	pthread_mutex_unlock(&a->lock);
}

void emb__arena_settle(struct emb_arena *a)
{
	pthread_mutex_lock(&a->lock);
	while (a->asked || a->preparing)
		pthread_cond_wait(&a->idle, &a->lock);
	pthread_mutex_unlock(&a->lock);
}

bool emb__arena_wants_spare(struct emb_arena *a)
{
	return __atomic_load_n(&a->want_spare, __ATOMIC_RELAXED);
}

bool emb__arena_spare(struct emb_arena *a, void **addr, size_t *len)
{
	bool have;

	pthread_mutex_lock(&a->lock);
	have = a->spare != NULL;
	*addr = a->spare;
	*len = have ? GROW_LIMIT : 0;
	pthread_mutex_unlock(&a->lock);
	return have;
}

void emb__arena_destroy(struct emb_arena *a)
{
	char cmd[64];
	int rc;

	if (!a)
		return;
	pthread_mutex_lock(&a->lock);
	a->stop = true;
	pthread_cond_signal(&a->wake);
	pthread_mutex_unlock(&a->lock);
	if (a->helper_on && a->helper_pid == getpid())
		pthread_join(a->helper, NULL);
	if (a->created) {
		snprintf(cmd, sizeof(cmd), "arena.%u.destroy", a->ind);
		rc = mallctl(cmd, NULL, NULL, NULL, 0);
		if (rc)
			emb_log(EMB_LOG_WARN, "jemalloc %s failed: %s", cmd,
				emb_strerror(-rc));
	}
	/* Report before unmapping: a registered region must be deregistered
	 * while its pages still exist. */
	for (size_t i = a->nregions; i-- > 0;) {
		if (a->fn)
			a->fn(a->arg, a->regions[i].addr, a->regions[i].len,
			      false);
		munmap(a->regions[i].addr, a->regions[i].len);
	}
	free(a->regions);
	if (a->spare)
		munmap(a->spare, GROW_LIMIT);
	/* In a forked child the helper of the parent still counts as a
	 * waiter of wake (glibc's destroy would wait for it forever): the
	 * condition variables go with the memory, undestroyed. */
	if (!a->helper_on || a->helper_pid == getpid()) {
		pthread_cond_destroy(&a->wake);
		pthread_cond_destroy(&a->idle);
	}
	pthread_mutex_destroy(&a->lock);
	free(a);
}

void *emb__arena_alloc(struct emb_arena *a, size_t n)
{
	return mallocx(n, MALLOCX_ARENA(a->ind) | MALLOCX_TCACHE_NONE);
}

void emb__arena_free(struct emb_arena *a, void *p)
{
	if (p)
		dallocx(p, MALLOCX_ARENA(a->ind) | MALLOCX_TCACHE_NONE);
}

size_t emb__arena_size_class(size_t n)
{
	size_t r = nallocx(n, MALLOCX_TCACHE_NONE);

	return r ? r : n;
}

int emb__arena_set_hook(struct emb_arena *a, emb_extent_fn fn, void *arg)
{
	struct region *copy = NULL;
	size_t i, n;
	int rc = 0;

	/* Replay from a copy, with no lock held, so the hook may call back
	 * into the table (the table is not shared yet, see store.h). */
	pthread_mutex_lock(&a->lock);
	n = fn ? a->nregions : 0;
	if (n) {
		copy = malloc(n * sizeof(*copy));
		if (!copy) {
			pthread_mutex_unlock(&a->lock);
			return -ENOMEM;
		}
		memcpy(copy, a->regions, n * sizeof(*copy));
	}
	pthread_mutex_unlock(&a->lock);
	for (i = 0; i < n; i++) {
		rc = fn(arg, copy[i].addr, copy[i].len, true);
		if (rc)
			break;
	}
	if (rc) {
		while (i-- > 0)
			fn(arg, copy[i].addr, copy[i].len, false);
		fn = NULL;
		arg = NULL;
	}
	free(copy);
	pthread_mutex_lock(&a->lock);
	a->fn = fn;
	a->arg = arg;
	pthread_mutex_unlock(&a->lock);
	return rc < 0 ? rc : (rc ? EMB_EARENA : 0);
}

void emb__arena_usage(struct emb_arena *a, uint64_t *extents, uint64_t *bytes)
{
	pthread_mutex_lock(&a->lock);
	*extents = a->nregions;
	*bytes = a->bytes;
	pthread_mutex_unlock(&a->lock);
}
