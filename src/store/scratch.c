/*
 * src/store/scratch.c - per-thread scratch buffers for the batch calls.
 *
 * A pull or push batch needs a few arrays sized by its id count (hashes,
 * positions grouped by shard, the dedup map, summed gradients, the
 * admission set). Allocating them per call put several mallocs on every
 * batch; here each thread keeps one buffer per use, grown on demand and
 * reused, so a thread that has served its largest batch allocates nothing
 * more. A buffer holds at most what the thread's largest batch needed (the
 * server's frame limit bounds a request's ids); all of a thread's buffers
 * are freed when the thread exits, through a pthread key destructor. The
 * main thread's buffers stay reachable from thread-local storage until the
 * process ends.
 *
 * Also here: the thread's stripe of the tables' counters (emb__stripe()).
 *
 * Any thread may call; each touches its own buffers only. A batch call
 * must not run another batch call on the same thread while it holds a
 * scratch pointer (none does: the store never calls out during a batch,
 * except the arena's extent hook, which must not call back into tables).
 */
#include "store/store_int.h"

#include <pthread.h>
#include <stdlib.h>

struct scratch {
	void *buf[EMB_SCRATCH_NSLOTS];	/* one buffer per use, or NULL */
	size_t cap[EMB_SCRATCH_NSLOTS]; /* bytes of buf[i] */
};

static _Thread_local struct scratch *mine;
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool key_ok;

static void scratch_free(void *arg)
{
	struct scratch *sc = arg;

	for (unsigned i = 0; i < EMB_SCRATCH_NSLOTS; i++)
		free(sc->buf[i]);
	free(sc);
	mine = NULL;
}

static void key_init(void)
{
	key_ok = pthread_key_create(&key, scratch_free) == 0;
}

void *emb__scratch(unsigned slot, size_t bytes)
{
	struct scratch *sc = mine;
	size_t cap;
	void *p;

	if (!sc) {
		pthread_once(&key_once, key_init);
		sc = calloc(1, sizeof(*sc));
		if (!sc)
			return NULL;
		/* Without the key the buffers cannot follow the thread out:
		 * they are then freed after each call (emb__scratch_done). */
		if (key_ok && pthread_setspecific(key, sc) == 0) {
			mine = sc;
		} else {
			free(sc);
			return malloc(bytes ? bytes : 1);
		}
	}
	if (bytes <= sc->cap[slot])
		return sc->buf[slot];
	/* Grow in powers of two from 4 KiB: a thread's batch sizes vary,
	 * and each growth is a malloc. Contents need not survive. */
	cap = 4096;
	while (cap < bytes)
		cap *= 2;
	p = malloc(cap);
	if (!p)
		return NULL;
	free(sc->buf[slot]);
	sc->buf[slot] = p;
	sc->cap[slot] = cap;
	return p;
}

void emb__scratch_done(void *p)
{
	/* Kept buffers stay with the thread; only a fallback malloc made when
	 * the thread could not keep any is freed here. */
	if (!mine)
		free(p);
}

/*
 * A thread's stripe of the tables' counters (store_int.h): handed out
 * round robin at the thread's first batch and kept, so two threads share
 * one only past EMB_TABLE_STRIPES threads.
 */
unsigned emb__stripe(void)
{
	static unsigned next;
	static _Thread_local unsigned my; /* stripe + 1, 0 until handed out */

	if (!my)
		my = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) %
			 EMB_TABLE_STRIPES +
		     1;
	return my - 1;
}
