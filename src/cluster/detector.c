/*
 * src/cluster/detector.c - the accrual failure detector (detector.h).
 * One thread at a time per detector.
 *
 * The intervals are taken as normally distributed, and the normal tail
 * is the logistic approximation Akka uses, which needs no erfc and does
 * not underflow: for y = (t - mean) / stddev,
 *
 *   P(X > t) ~= e / (1 + e),  e = exp(-y (1.5976 + 0.070566 y^2))
 *
 * so phi = -log10 of it. The standard deviation has a floor (a tenth of
 * the mean): a history of identical intervals does not make a node that
 * is one millisecond late suspect, and T bounds the result from below
 * anyway.
 */
#include "cluster/detector.h"

#include <math.h>
#include <string.h>

#define LOGI_A 1.5976
#define LOGI_B 0.070566

void emb_detector_init(struct emb_detector *d, uint32_t min_ms, int64_t now_ms)
{
	memset(d, 0, sizeof(*d));
	d->min_ms = min_ms ? min_ms : 1;
	d->suspect_ms = d->min_ms;
	d->last_hb_ms = now_ms;
	d->last_ms = now_ms;
}

void emb_detector_moments(const struct emb_detector *d, double *mean,
			  double *stddev)
{
	double m, var;

	if (!d->n) {
		*mean = *stddev = 0.0;
		return;
	}
	m = (double)d->sum / d->n;
	var = (double)d->sumsq / d->n - m * m;
	*mean = m;
	*stddev = var > 0.0 ? sqrt(var) : 0.0;
}

/* The floor keeps a steady history from making every delay suspect. */
static double sigma(double mean, double sd)
{
	double floor = mean / 10.0 + 1.0;

	return sd > floor ? sd : floor;
}

/* phi of a silence y standard deviations past the mean (y may be < 0). */
static double phi_of(double y)
{
	double k = y * (LOGI_A + LOGI_B * y * y);

	/* -log10(e / (1 + e)) with e = exp(-k) is log10(1 + exp(k)),
	 * written so that neither exp() overflows. */
	if (k > 0.0)
		return k / M_LN10 + log10(1.0 + exp(-k));
	return log10(1.0 + exp(k));
}

/* The y at which phi reaches EMB_DETECTOR_PHI (phi_of grows with y). */
static double y_at_threshold(void)
{
	double lo = 0.0, hi = 64.0;

	for (int i = 0; i < 60; i++) {
		double mid = (lo + hi) / 2.0;

		if (phi_of(mid) < EMB_DETECTOR_PHI)
			lo = mid;
		else
			hi = mid;
	}
	return hi;
}

static void update_suspect(struct emb_detector *d)
{
	uint64_t max = (uint64_t)d->min_ms * EMB_DETECTOR_MAX_FACTOR;
	double mean, sd, t;

	if (d->n < EMB_DETECTOR_WARMUP) {
		d->suspect_ms = d->min_ms;
		return;
	}
	emb_detector_moments(d, &mean, &sd);
	t = ceil(mean + y_at_threshold() * sigma(mean, sd));
	if (t < d->min_ms)
		d->suspect_ms = d->min_ms;
	else if (t > (double)max)
		d->suspect_ms = (uint32_t)(max < UINT32_MAX ? max : UINT32_MAX);
	else
		d->suspect_ms = (uint32_t)t;
}

void emb_detector_heard(struct emb_detector *d, int64_t now_ms)
{
	int64_t iv = now_ms - d->last_hb_ms;
	uint16_t v;

	if (iv < 0)
		iv = 0;
	v = iv > UINT16_MAX ? UINT16_MAX : (uint16_t)iv;
	if (d->n == EMB_DETECTOR_WINDOW) {
		uint16_t old = d->iv[d->next];

		d->sum -= old;
		d->sumsq -= (uint64_t)old * old;
	} else {
		d->n++;
	}
	d->iv[d->next] = v;
	d->next = (d->next + 1) % EMB_DETECTOR_WINDOW;
	d->sum += v;
	d->sumsq += (uint64_t)v * v;
	d->last_hb_ms = now_ms;
	if (now_ms > d->last_ms)
		d->last_ms = now_ms;
	update_suspect(d);
}

void emb_detector_touch(struct emb_detector *d, int64_t now_ms)
{
	if (now_ms > d->last_ms)
		d->last_ms = now_ms;
}

int64_t emb_detector_silence_ms(const struct emb_detector *d, int64_t now_ms)
{
	return now_ms > d->last_ms ? now_ms - d->last_ms : 0;
}

double emb_detector_phi(const struct emb_detector *d, int64_t now_ms)
{
	double t = (double)emb_detector_silence_ms(d, now_ms), mean, sd;

	if (t <= 0.0)
		return 0.0;
	if (d->n < EMB_DETECTOR_WARMUP)
		return EMB_DETECTOR_PHI * t / d->min_ms;
	emb_detector_moments(d, &mean, &sd);
	return phi_of((t - mean) / sigma(mean, sd));
}
