/*
 * src/common/hist.h - a fixed-size log-linear histogram of latencies.
 *
 * HdrHistogram's layout: values below 128 get a bucket each, and every
 * power-of-two range above that is split into 64 equal buckets, so a bucket
 * is at most 1/64 (1.6 %) of its values wide. Values are nanoseconds by
 * convention; 2048 buckets reach EMB_HIST_MAX (2^37 - 1 ns, about 137 s) and
 * larger values count in the last bucket. Memory is fixed (16 KiB of counts)
 * and recording is a few instructions, so a hot loop can record every batch.
 *
 * A histogram is a plain struct with no locks: one per thread, merged by one
 * thread once the writers stop. Buckets are exposed so an exporter (e.g.
 * Prometheus "le" buckets) can sum them without knowing the layout.
 */
#ifndef EMB_COMMON_HIST_H
#define EMB_COMMON_HIST_H

#include <stdint.h>

#define EMB_HIST_SUB_BITS 6u				/* 64 buckets per octave */
#define EMB_HIST_BUCKETS 2048u				/* covers 0 .. 2^37 - 1 */
#define EMB_HIST_MAX ((UINT64_C(1) << 37) - 1)		/* ns, about 137 s */

struct emb_hist {
	uint64_t count;				/* values recorded */
	uint64_t sum;				/* sum of values (clamped), ns */
	uint64_t min;				/* smallest value; UINT64_MAX if empty */
	uint64_t max;				/* largest value (clamped), ns */
	uint64_t buckets[EMB_HIST_BUCKETS];	/* values per bucket */
};

/* Empties h; a zeroed struct is not empty (min must start at UINT64_MAX). */
void emb_hist_reset(struct emb_hist *h);

/* Bucket index of value v; values above EMB_HIST_MAX map to the last one. */
static inline uint32_t emb_hist_index(uint64_t v)
{
	uint32_t msb, shift;

	if (v > EMB_HIST_MAX)
		v = EMB_HIST_MAX;
	if (v < (UINT64_C(2) << EMB_HIST_SUB_BITS))
		return (uint32_t)v;
	msb = 63u - (uint32_t)__builtin_clzll(v);
	shift = msb - EMB_HIST_SUB_BITS;
	return (shift << EMB_HIST_SUB_BITS) + (uint32_t)(v >> shift);
}

/* Adds one value (ns). Not thread-safe: the owner thread only. */
static inline void emb_hist_record(struct emb_hist *h, uint64_t v)
{
	if (v > EMB_HIST_MAX)
		v = EMB_HIST_MAX;
	h->buckets[emb_hist_index(v)]++;
	h->count++;
	h->sum += v;
	if (v < h->min)
		h->min = v;
	if (v > h->max)
		h->max = v;
}

/* Smallest and largest value that fall into bucket idx (< EMB_HIST_BUCKETS). */
uint64_t emb_hist_bucket_low(uint32_t idx);
uint64_t emb_hist_bucket_high(uint32_t idx);

/* Adds every value of src into dst. Neither may be written meanwhile. */
void emb_hist_merge(struct emb_hist *dst, const struct emb_hist *src);

/*
 * The value at percentile p (0..100): the upper edge of the bucket that holds
 * the p-th percentile value, clamped to [min, max] so p = 0 and p = 100 give
 * the exact extremes. 0 for an empty histogram.
 */
uint64_t emb_hist_percentile(const struct emb_hist *h, double p);

/* Mean value, 0 for an empty histogram. */
double emb_hist_mean(const struct emb_hist *h);

/* How many recorded values are <= v (exact at bucket edges, else a bound). */
uint64_t emb_hist_count_le(const struct emb_hist *h, uint64_t v);

#endif
