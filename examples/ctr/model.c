/*
 * examples/ctr/model.c - Criteo parsing, the wide & deep model's forward and
 * backward passes, and AUC. Plain loops: the point is to show the parameter
 * server path, not to be a fast MLP library. One caller thread per model.
 */
#include "ctr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


int ctr_parse(const char *line, struct ctr_example *ex)
{
	const char *p = line;
	char *end;
	long v;

	if (*p != '0' && *p != '1')
		return -1;
	ex->label = (float)(*p - '0');
	p++;
	for (int k = 0; k < CTR_NINT; k++) {
		if (*p != '\t')
			return -1;
		p++;
		if (*p == '\t' || *p == '\n' || *p == '\0' || *p == '\r') {
			ex->ints[k] = 0.0f;
			continue;
		}
		v = strtol(p, &end, 10);
		if (end == p)
			return -1;
		p = end;
		/* Criteo's counts span orders of magnitude; negatives occur. */
		ex->ints[k] = v > 0 ? (float)log1p((double)v) / 4.0f : 0.0f;
	}
	for (int k = 0; k < CTR_NCAT; k++) {
		uint64_t h = 0;
		int nd = 0;

		if (*p != '\t')
			return -1;
		p++;
		while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
		       (*p >= 'A' && *p <= 'F')) {
			int d = *p <= '9' ? *p - '0' : (*p | 0x20) - 'a' + 10;

			h = h * 16 + (uint64_t)d;
			p++;
			nd++;
		}
		if (nd > 16)
			return -1;
		/* Field in the top byte; nd == 0 (empty) is its own value. */
		ex->ids[k] = ctr_hash(((uint64_t)(k + 1) << 56) ^
					 (nd ? h : 0xffffffffffull));
	}
	return (*p == '\n' || *p == '\0' || *p == '\r') ? 0 : -1;
}

uint32_t ctr_read_batch(FILE *f, struct ctr_example *ex, uint32_t max,
			uint32_t shard, uint32_t nshards, uint64_t *lineno,
			uint64_t *bad)
{
	char line[4096];
	uint32_t n = 0;

	while (n < max && fgets(line, sizeof(line), f)) {
		uint64_t ln = (*lineno)++;

		if (ln % nshards != shard)
			continue;
		if (ctr_parse(line, &ex[n]) == 0)
			n++;
		else
			(*bad)++;
	}
	return n;
}

void ctr_dense_init(float *dense, uint64_t seed)
{
	uint64_t st = ctr_hash(seed ^ 0xde45eull);
	float l1 = sqrtf(6.0f / CTR_IN), l2 = sqrtf(6.0f / CTR_H1),
	      l3 = sqrtf(6.0f / CTR_H2);

	memset(dense, 0, CTR_NDENSE * sizeof(float));
	for (int i = 0; i < CTR_H1 * CTR_IN; i++)
		dense[CTR_OFF_W1 + i] =
		    l1 *
		    (2.0f * (float)(ctr_splitmix64(&st) >> 40) / 16777216.0f -
		     1.0f);
	for (int i = 0; i < CTR_H2 * CTR_H1; i++)
		dense[CTR_OFF_W2 + i] =
		    l2 *
		    (2.0f * (float)(ctr_splitmix64(&st) >> 40) / 16777216.0f -
		     1.0f);
	for (int i = 0; i < CTR_H2; i++)
		dense[CTR_OFF_W3 + i] =
		    l3 *
		    (2.0f * (float)(ctr_splitmix64(&st) >> 40) / 16777216.0f -
		     1.0f);
}

double ctr_forward_backward(const struct ctr_example *ex, uint32_t n,
			    const float *emb, const float *wide,
			    const float *dense, float *g_emb, float *g_wide,
			    float *g_dense, double *p_out)
{
	const float *W1 = dense + CTR_OFF_W1, *b1 = dense + CTR_OFF_B1;
	const float *W2 = dense + CTR_OFF_W2, *b2 = dense + CTR_OFF_B2;
	const float *W3 = dense + CTR_OFF_W3, *b3 = dense + CTR_OFF_B3;
	const bool grad = g_emb && g_wide && g_dense;
	float x[CTR_IN], h1[CTR_H1], h2[CTR_H2], d1[CTR_H1], d2[CTR_H2];
	double loss = 0.0;

	if (grad)
		memset(g_dense, 0, CTR_NDENSE * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		const float *e = emb + (size_t)i * CTR_NCAT * CTR_EMB_DIM;
		const float *w = wide + (size_t)i * CTR_NCAT;
		float z, p, dz;

		memcpy(x, e, CTR_NCAT * CTR_EMB_DIM * sizeof(float));
		memcpy(x + CTR_NCAT * CTR_EMB_DIM, ex[i].ints,
		       CTR_NINT * sizeof(float));
		for (int j = 0; j < CTR_H1; j++) {
			const float *row = W1 + (size_t)j * CTR_IN;
			float a = b1[j];

			for (int k = 0; k < CTR_IN; k++)
				a += row[k] * x[k];
			h1[j] = a > 0.0f ? a : 0.0f;
		}
		for (int j = 0; j < CTR_H2; j++) {
			const float *row = W2 + (size_t)j * CTR_H1;
			float a = b2[j];

			for (int k = 0; k < CTR_H1; k++)
				a += row[k] * h1[k];
			h2[j] = a > 0.0f ? a : 0.0f;
		}
		z = b3[0] + dense[CTR_OFF_BIAS];
		for (int k = 0; k < CTR_H2; k++)
			z += W3[k] * h2[k];
		for (int f = 0; f < CTR_NCAT; f++)
			z += w[f];
		/* Numerically stable logloss: log(1 + e^-|z|) + max(z, 0) - y z
		 */
		loss += log1p(exp(-fabs((double)z))) + (z > 0 ? z : 0) -
			ex[i].label * z;
		p = 1.0f / (1.0f + expf(-z));
		if (p_out)
			p_out[i] = p;
		if (!grad)
			continue;

		dz = (p - ex[i].label) / (float)n;
		g_dense[CTR_OFF_B3] += dz;
		g_dense[CTR_OFF_BIAS] += dz;
		for (int f = 0; f < CTR_NCAT; f++)
			g_wide[(size_t)i * CTR_NCAT + f] = dz;
		for (int k = 0; k < CTR_H2; k++) {
			g_dense[CTR_OFF_W3 + k] += dz * h2[k];
			d2[k] = h2[k] > 0.0f ? dz * W3[k] : 0.0f;
		}
		memset(d1, 0, sizeof(d1));
		for (int j = 0; j < CTR_H2; j++) {
			float *gw = g_dense + CTR_OFF_W2 + (size_t)j * CTR_H1;
			const float *row = W2 + (size_t)j * CTR_H1;

			if (d2[j] == 0.0f)
				continue;
			g_dense[CTR_OFF_B2 + j] += d2[j];
			for (int k = 0; k < CTR_H1; k++) {
				gw[k] += d2[j] * h1[k];
				d1[k] += d2[j] * row[k];
			}
		}
		{
			float *ge = g_emb + (size_t)i * CTR_NCAT * CTR_EMB_DIM;
			float gx[CTR_IN];

			memset(gx, 0, sizeof(gx));
			for (int j = 0; j < CTR_H1; j++) {
				float *gw =
				    g_dense + CTR_OFF_W1 + (size_t)j * CTR_IN;
				const float *row = W1 + (size_t)j * CTR_IN;
				float dj = h1[j] > 0.0f ? d1[j] : 0.0f;

				if (dj == 0.0f)
					continue;
				g_dense[CTR_OFF_B1 + j] += dj;
				for (int k = 0; k < CTR_IN; k++) {
					gw[k] += dj * x[k];
					gx[k] += dj * row[k];
				}
			}
			memcpy(ge, gx, CTR_NCAT * CTR_EMB_DIM * sizeof(float));
		}
	}
	return n ? loss / n : 0.0;
}

struct scored {
	double s;  /* score */
	uint8_t y; /* label */
};

static int cmp_scored(const void *a, const void *b)
{
	double x = ((const struct scored *)a)->s;
	double y = ((const struct scored *)b)->s;

	return (x > y) - (x < y);
}

double ctr_auc(const double *scores, const uint8_t *labels, uint64_t n)
{
	struct scored *v = malloc(n * sizeof(*v));
	double rank_sum = 0.0, npos = 0.0, nneg;
	uint64_t i = 0;

	if (!v || n == 0) {
		free(v);
		return 0.5;
	}
	for (uint64_t k = 0; k < n; k++) {
		v[k].s = scores[k];
		v[k].y = labels[k];
		npos += labels[k];
	}
	qsort(v, n, sizeof(*v), cmp_scored);
	/* Mann-Whitney U with tied scores sharing their mean rank. */
	while (i < n) {
		uint64_t j = i;
		double pos_in_tie = 0.0, mean_rank;

		while (j < n && v[j].s == v[i].s)
			pos_in_tie += v[j++].y;
		mean_rank = (double)(i + 1 + j) / 2.0;
		rank_sum += pos_in_tie * mean_rank;
		i = j;
	}
	free(v);
	nneg = (double)n - npos;
	if (npos == 0.0 || nneg == 0.0)
		return 0.5;
	return (rank_sum - npos * (npos + 1.0) / 2.0) / (npos * nneg);
}
