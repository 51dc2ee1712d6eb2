/*
 * src/common/hist.c - percentiles and merging for the log-linear histogram.
 * Plain functions over caller-owned structs; callers keep one writer per
 * histogram and merge only once writers have stopped.
 */
#include "common/hist.h"

#include <string.h>

void emb_hist_reset(struct emb_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

uint64_t emb_hist_bucket_low(uint32_t idx)
{
	uint32_t shift;
	uint64_t mant;

	if (idx < (2u << EMB_HIST_SUB_BITS))
		return idx;
	shift = (idx >> EMB_HIST_SUB_BITS) - 1;
	mant = idx - ((uint64_t)shift << EMB_HIST_SUB_BITS);
	return mant << shift;
}

uint64_t emb_hist_bucket_high(uint32_t idx)
{
	if (idx + 1 >= EMB_HIST_BUCKETS)
		return EMB_HIST_MAX;
	return emb_hist_bucket_low(idx + 1) - 1;
}

void emb_hist_merge(struct emb_hist *dst, const struct emb_hist *src)
{
	if (!src->count)
		return;
	for (uint32_t i = 0; i < EMB_HIST_BUCKETS; i++)
		dst->buckets[i] += src->buckets[i];
	dst->count += src->count;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
}

uint64_t emb_hist_percentile(const struct emb_hist *h, double p)
{
	uint64_t rank, seen = 0, v;
	uint32_t i;

	if (!h->count)
		return 0;
	if (p <= 0.0)
		return h->min;
	if (p >= 100.0)
		return h->max;
	/* The value of 1-based rank ceil(p% of count), as nearest-rank does. */
	rank = (uint64_t)(p / 100.0 * (double)h->count + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > h->count)
		rank = h->count;
	for (i = 0; i < EMB_HIST_BUCKETS; i++) {
		seen += h->buckets[i];
		if (seen >= rank)
			break;
	}
	if (i == EMB_HIST_BUCKETS)
		i = EMB_HIST_BUCKETS - 1;
	v = emb_hist_bucket_high(i);
	if (v > h->max)
		v = h->max;
	if (v < h->min)
		v = h->min;
	return v;
}

double emb_hist_mean(const struct emb_hist *h)
{
	return h->count ? (double)h->sum / (double)h->count : 0.0;
}

uint64_t emb_hist_count_le(const struct emb_hist *h, uint64_t v)
{
	uint64_t n = 0;

	/* Only whole buckets count: a bucket straddling v may hold larger values. */
	for (uint32_t i = 0; i < EMB_HIST_BUCKETS; i++) {
		if (emb_hist_bucket_high(i) > v)
			break;
		n += h->buckets[i];
	}
	return n;
}
