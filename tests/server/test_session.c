/*
 * tests/server/test_session.c - the at-most-once window of push sequence
 * numbers (src/server/session.c): a number is applied once; a copy sent
 * again while the first is still being applied (another loop, after the
 * first's connection broke) waits for the first's outcome instead of being
 * acknowledged at once: a duplicate once the first is applied, applied
 * itself when the first failed. Several threads, as on a server's loops.
 */
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "harness.h"

#include "common/err.h"
#include "server/session.h"

#define SESSION 0x5eed5eedull

static struct emb_sessions *ss;

static void setup(void)
{
	ss = NULL;
	CU_ASSERT_EQUAL_FATAL(emb__sessions_create(&ss), 0);
}

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* A second copy of (SESSION, seq), claimed or looked up on its own thread. */
struct copy {
	pthread_t th;
	uint64_t seq;
	bool look;    /* emb__sessions_seen instead of claim */
	int rc;	      /* claim's answer, or seen's as 0/1 */
	int returned; /* atomic: set once the call returned */
};

static void *copy_main(void *arg)
{
	struct copy *c = arg;

	if (c->look)
		c->rc = emb__sessions_seen(ss, SESSION, c->seq) ? 1 : 0;
	else
		c->rc = emb__sessions_claim(ss, SESSION, c->seq);
	__atomic_store_n(&c->returned, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void copy_start(struct copy *c, uint64_t seq, bool look)
{
	c->seq = seq;
	c->look = look;
	c->rc = -1;
	c->returned = 0;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&c->th, NULL, copy_main, c), 0);
	/* Time for it to reach the window and wait there. If it does not
	 * wait, it has returned by now on any machine this runs on; if it
	 * only got there later, the check below passes without proving the
	 * wait, and the cases' final answers still hold. */
	nap_ms(100);
}

/* Checks that c still waits, then settles the first copy of its number
 * (applied or failed) and returns c's answer. */
static int settle_join(struct copy *c, bool applied)
{
	CU_ASSERT_EQUAL(__atomic_load_n(&c->returned, __ATOMIC_ACQUIRE), 0);
	if (applied)
		emb__sessions_done(ss, SESSION, c->seq);
	else
		emb__sessions_undo(ss, SESSION, c->seq);
	CU_ASSERT_EQUAL(pthread_join(c->th, NULL), 0);
	return c->rc;
}

static void applied_once(void)
{
	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 7), 0);
	emb__sessions_done(ss, SESSION, 7);
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 7), 1);
	CU_ASSERT(emb__sessions_seen(ss, SESSION, 7));
	CU_ASSERT(!emb__sessions_seen(ss, SESSION, 6));
	CU_ASSERT(!emb__sessions_seen(ss, SESSION + 1, 7));
	CU_ASSERT_EQUAL(emb__sessions_dups(ss), 2);
	emb__sessions_destroy(ss);
}

static void failed_is_released(void)
{
	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 3), 0);
	emb__sessions_undo(ss, SESSION, 3);
	CU_ASSERT(!emb__sessions_seen(ss, SESSION, 3));
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 3), 0);
	emb__sessions_done(ss, SESSION, 3);
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 3), 1);
	emb__sessions_destroy(ss);
}

static void older_than_window(void)
{
	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 1), 0);
	emb__sessions_done(ss, SESSION, 1);
	CU_ASSERT_EQUAL(
	    emb__sessions_claim(ss, SESSION, 1 + EMB_SESSION_WINDOW), 0);
	emb__sessions_done(ss, SESSION, 1 + EMB_SESSION_WINDOW);
	/* Whether 1 was applied is no longer known: neither applied again
	 * nor acknowledged. */
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 1), EMB_ERETRYLATE);
	CU_ASSERT(!emb__sessions_seen(ss, SESSION, 1));
	emb__sessions_destroy(ss);
}

/* The first copy is applied while the second waits: a duplicate. */
static void pending_then_applied(void)
{
	struct copy c;

	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 11), 0);
	copy_start(&c, 11, false);
	/* Others' pushes go on meanwhile, in this session and the stripe. */
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 12), 0);
	emb__sessions_done(ss, SESSION, 12);
	CU_ASSERT_EQUAL(settle_join(&c, true), 1);
	emb__sessions_destroy(ss);
}

/* The first copy fails while the second waits: the second is applied,
 * and only it. */
static void pending_then_failed(void)
{
	struct copy c, d;

	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 21), 0);
	copy_start(&c, 21, false);
	CU_ASSERT_EQUAL(settle_join(&c, false), 0);
	/* The second's claim is pending now, and a third waits on it. */
	copy_start(&d, 21, false);
	CU_ASSERT_EQUAL(settle_join(&d, true), 1);
	emb__sessions_destroy(ss);
}

/* A copy the map refuses asks whether the first was applied: it waits
 * for the answer too. */
static void seen_waits(void)
{
	struct copy c;

	setup();
	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 31), 0);
	copy_start(&c, 31, true);
	CU_ASSERT_EQUAL(settle_join(&c, false), 0);

	CU_ASSERT_EQUAL(emb__sessions_claim(ss, SESSION, 32), 0);
	copy_start(&c, 32, true);
	CU_ASSERT_EQUAL(settle_join(&c, true), 1);
	emb__sessions_destroy(ss);
}

/* Many threads, one number each time: exactly one applies it. */
struct racer {
	pthread_t th;
	int applied;
	int dups;
};

#define RACERS 4
#define ROUNDS 2000

static void *racer_main(void *arg)
{
	struct racer *r = arg;

	for (uint64_t q = 1; q <= ROUNDS; q++) {
		int rc = emb__sessions_claim(ss, SESSION, q);

		if (rc == 0) {
			r->applied++;
			emb__sessions_done(ss, SESSION, q);
		} else if (rc == 1) {
			r->dups++;
		}
	}
	return NULL;
}

static void racing_copies_apply_once(void)
{
	struct racer r[RACERS] = {0};
	int applied = 0, dups = 0;

	setup();
	for (int i = 0; i < RACERS; i++)
		CU_ASSERT_EQUAL_FATAL(
		    pthread_create(&r[i].th, NULL, racer_main, &r[i]), 0);
	for (int i = 0; i < RACERS; i++) {
		pthread_join(r[i].th, NULL);
		applied += r[i].applied;
		dups += r[i].dups;
	}
	CU_ASSERT_EQUAL(applied, ROUNDS);
	CU_ASSERT_EQUAL(dups, (RACERS - 1) * ROUNDS);
	emb__sessions_destroy(ss);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a number applied once is a duplicate after", applied_once},
	    {"a failed push's number is applied by its retry",
	     failed_is_released},
	    {"a number older than the window is refused, not guessed",
	     older_than_window},
	    {"a copy sent while the first is applied waits: a duplicate",
	     pending_then_applied},
	    {"a copy sent while the first fails waits: applied itself",
	     pending_then_failed},
	    {"a refused copy's look-up waits for the first's outcome",
	     seen_waits},
	    {"copies racing on every loop: each number applied once",
	     racing_copies_apply_once},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "server/session", cases);
}
