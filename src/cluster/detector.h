/*
 * src/cluster/detector.h - an accrual failure detector for one node's
 * heartbeats (Hayashibara et al., "The phi accrual failure detector",
 * as Cassandra and Akka use it). It keeps the node's last inter-arrival
 * intervals and says how suspicious its current silence is: phi is
 * -log10 of the chance that a live node with that history stays silent
 * this long, so phi 8 means "one in 10^8". The silence at which phi
 * reaches EMB_DETECTOR_PHI is the node's suspect time, bounded below by
 * the configured heartbeat timeout T (never suspect sooner than before)
 * and above by EMB_DETECTOR_MAX_FACTOR * T (a dead node is still found
 * in bounded time, however jittery its history).
 *
 * The detector takes times from its caller and reads no clock, so a
 * caller may run it on a clock of its own (the scheduler's leaves out
 * the time its own loop was not running) and tests feed it synthetic
 * arrivals. A plain struct, embedded in its owner; not thread-safe: one
 * thread at a time.
 */
#ifndef EMB_CLUSTER_DETECTOR_H
#define EMB_CLUSTER_DETECTOR_H

#include <stdbool.h>
#include <stdint.h>

/* Intervals remembered: the last 32 heartbeats, a few seconds' worth. */
#define EMB_DETECTOR_WINDOW 32u
/* Intervals before the history counts; until then the suspect time is T. */
#define EMB_DETECTOR_WARMUP 8u
/* The phi at which a node becomes suspect: one chance in 10^8. */
#define EMB_DETECTOR_PHI 8.0
/* The suspect time never passes this many times T. */
#define EMB_DETECTOR_MAX_FACTOR 3u

struct emb_detector {
	uint16_t iv[EMB_DETECTOR_WINDOW]; /* intervals, ms, ring */
	uint32_t n;			  /* intervals held, <= WINDOW */
	uint32_t next;			  /* ring slot the next one takes */
	uint64_t sum;			  /* of the held intervals, ms */
	uint64_t sumsq;			  /* of their squares, ms^2 */
	uint32_t min_ms;		  /* T: the least suspect time */
	uint32_t suspect_ms;		  /* silence that makes it suspect,
					     recomputed at each arrival */
	int64_t last_hb_ms;		  /* last heartbeat, caller's clock */
	int64_t last_ms;		  /* last sign of life of any kind */
};

/*
 * Starts d for a node first heard at now_ms, with the configured timeout
 * min_ms (>= 1) as the least suspect time. Forgets any history.
 */
void emb_detector_init(struct emb_detector *d, uint32_t min_ms,
		       int64_t now_ms);

/* A heartbeat arrived at now_ms: one more interval, and silence ends. */
void emb_detector_heard(struct emb_detector *d, int64_t now_ms);

/*
 * Another sign of life at now_ms (a request other than a heartbeat, the
 * answer to a probe): silence ends, but the interval is no heartbeat
 * interval and is not learnt.
 */
void emb_detector_touch(struct emb_detector *d, int64_t now_ms);

/* Milliseconds since the last sign of life (0 if now_ms is earlier). */
int64_t emb_detector_silence_ms(const struct emb_detector *d, int64_t now_ms);

/*
 * phi of the silence at now_ms: 0 for none, growing with the silence;
 * larger the steadier the history. Before the warm-up it compares the
 * silence with T alone (phi reaches EMB_DETECTOR_PHI at T).
 */
double emb_detector_phi(const struct emb_detector *d, int64_t now_ms);

/*
 * The silence after which the node is suspect: where phi reaches
 * EMB_DETECTOR_PHI, within [T, EMB_DETECTOR_MAX_FACTOR * T].
 */
static inline uint32_t emb_detector_suspect_ms(const struct emb_detector *d)
{
	return d->suspect_ms;
}

/* True if the silence at now_ms passed the suspect time. */
static inline bool emb_detector_suspect(const struct emb_detector *d,
					int64_t now_ms)
{
	return now_ms - d->last_ms > (int64_t)d->suspect_ms;
}

/* Mean and standard deviation of the held intervals, ms (0 when none). */
void emb_detector_moments(const struct emb_detector *d, double *mean,
			  double *stddev);

#endif
