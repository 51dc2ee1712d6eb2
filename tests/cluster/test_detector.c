/*
 * tests/cluster/test_detector.c - the accrual failure detector on
 * synthetic arrival times: T until the history counts, T for steady
 * heartbeats, more for jittery ones (a late heartbeat that a fixed T
 * would call a death is not suspect), never more than the cap, the
 * history forgotten as the window moves, and signs of life that end a
 * silence without being learnt. Single-threaded.
 */
#include <math.h>
#include <stdlib.h>

#include "cluster/detector.h"
#include "harness.h"

#define T 1000u

/* n heartbeats every iv ms from *now on. */
static void beat(struct emb_detector *d, int64_t *now, uint32_t n,
		 uint32_t iv)
{
	for (uint32_t i = 0; i < n; i++) {
		*now += iv;
		emb_detector_heard(d, *now);
	}
}

static void test_warmup(void)
{
	struct emb_detector d;
	int64_t now = 5000;

	emb_detector_init(&d, T, now);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d), T);
	/* Before the warm-up even wild intervals leave it at T. */
	beat(&d, &now, EMB_DETECTOR_WARMUP - 1, 2900);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d), T);
	CU_ASSERT(!emb_detector_suspect(&d, now + T));
	CU_ASSERT(emb_detector_suspect(&d, now + T + 1));
	CU_ASSERT(fabs(emb_detector_phi(&d, now + T) - EMB_DETECTOR_PHI) <
		  1e-9);
	CU_ASSERT_EQUAL(emb_detector_phi(&d, now), 0.0);
}

static void test_steady(void)
{
	struct emb_detector d;
	int64_t now = 0;

	emb_detector_init(&d, T, now);
	/* T / 5 apart, a few ms of jitter: nothing to learn beyond T. */
	for (int i = 0; i < 100; i++) {
		now += 200 + (i % 3) * 4;
		emb_detector_heard(&d, now);
	}
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d), T);
	CU_ASSERT(emb_detector_suspect(&d, now + T + 1));
	/* phi grows with the silence, and is huge by then. */
	CU_ASSERT(emb_detector_phi(&d, now + 100) <
		  emb_detector_phi(&d, now + 300));
	CU_ASSERT(emb_detector_phi(&d, now + 300) <
		  emb_detector_phi(&d, now + 600));
	CU_ASSERT(emb_detector_phi(&d, now + T) > EMB_DETECTOR_PHI);
	CU_ASSERT(isfinite(emb_detector_phi(&d, now + 100000)));
}

static void test_jitter(void)
{
	struct emb_detector d;
	double mean, sd;
	int64_t now = 0;

	emb_detector_init(&d, T, now);
	/* A loaded machine: mostly 200 ms, every fourth heartbeat 900 ms
	 * late, as when the sender waits for a CPU. */
	for (int i = 0; i < 64; i++)
		beat(&d, &now, 1, i % 4 == 3 ? 1100 : 200);
	emb_detector_moments(&d, &mean, &sd);
	CU_ASSERT(mean > 400 && mean < 500);
	CU_ASSERT(emb_detector_suspect_ms(&d) > T);
	CU_ASSERT(emb_detector_suspect_ms(&d) <= EMB_DETECTOR_MAX_FACTOR * T);
	/* A 1.3 s silence: a fixed T would call it a death; this history
	 * says it is nothing unusual. */
	CU_ASSERT(!emb_detector_suspect(&d, now + 1300));
	CU_ASSERT(emb_detector_suspect(&d, now + EMB_DETECTOR_MAX_FACTOR * T +
					       1));
}

static void test_cap(void)
{
	struct emb_detector d;
	int64_t now = 0;

	emb_detector_init(&d, T, now);
	for (int i = 0; i < 64; i++)
		beat(&d, &now, 1, i % 2 ? 5000 : 10);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d),
			EMB_DETECTOR_MAX_FACTOR * T);
	/* Intervals past 65 s are held as 65.5 s, not wrapped. */
	beat(&d, &now, 1, 200000);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d),
			EMB_DETECTOR_MAX_FACTOR * T);
}

static void test_forgets(void)
{
	struct emb_detector d;
	int64_t now = 0;

	emb_detector_init(&d, T, now);
	for (int i = 0; i < 64; i++)
		beat(&d, &now, 1, i % 4 == 3 ? 1100 : 200);
	CU_ASSERT(emb_detector_suspect_ms(&d) > T);
	/* The load went away: a window of steady heartbeats later, T. */
	beat(&d, &now, EMB_DETECTOR_WINDOW, 200);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d), T);
	/* And init forgets at once. */
	for (int i = 0; i < 64; i++)
		beat(&d, &now, 1, i % 4 == 3 ? 1100 : 200);
	emb_detector_init(&d, T, now);
	CU_ASSERT_EQUAL(emb_detector_suspect_ms(&d), T);
	CU_ASSERT_EQUAL(d.n, 0);
}

static void test_touch(void)
{
	struct emb_detector d;
	int64_t now = 0;

	emb_detector_init(&d, T, now);
	beat(&d, &now, 20, 200);
	CU_ASSERT_EQUAL(emb_detector_silence_ms(&d, now + 900), 900);
	/* A probe answered 900 ms into the silence: it starts again, and
	 * the 900 ms are no heartbeat interval. */
	emb_detector_touch(&d, now + 900);
	CU_ASSERT_EQUAL(d.n, 20);
	CU_ASSERT_EQUAL(emb_detector_silence_ms(&d, now + 900), 0);
	CU_ASSERT(!emb_detector_suspect(&d, now + 900 + T));
	CU_ASSERT(emb_detector_suspect(&d, now + 900 + T + 1));
	/* The next heartbeat's interval runs from the last heartbeat. */
	emb_detector_heard(&d, now + 1000);
	CU_ASSERT_EQUAL(d.iv[(d.next + EMB_DETECTOR_WINDOW - 1) %
			     EMB_DETECTOR_WINDOW],
			1000);
	/* An older time never moves it back. */
	emb_detector_touch(&d, now);
	CU_ASSERT_EQUAL(emb_detector_silence_ms(&d, now + 1000), 0);
	CU_ASSERT_EQUAL(emb_detector_silence_ms(&d, now), 0);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"suspect at T until the history counts", test_warmup},
	    {"steady heartbeats keep T", test_steady},
	    {"jittery heartbeats wait longer, within the cap", test_jitter},
	    {"the suspect time never passes the cap", test_cap},
	    {"the window forgets old jitter", test_forgets},
	    {"a sign of life ends a silence without being learnt",
	     test_touch},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "detector", cases);
}
