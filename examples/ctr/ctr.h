/*
 * examples/ctr/ctr.h - the CTR example's data reader, model and metrics.
 *
 * The model is wide & deep: a wide part (one weight per categorical value,
 * plus a bias) and a deep part (an embedding of CTR_EMB_DIM per categorical
 * field, concatenated with log-normalised integer features, into an MLP with
 * two ReLU hidden layers), summed into one logit; sigmoid output, logloss.
 * Forward and backward are plain C. Not thread-safe: one model per thread.
 */
#ifndef EMB_EXAMPLES_CTR_H
#define EMB_EXAMPLES_CTR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*
 * MurmurHash3's fmix64 and a splitmix64 step: the data's own hashes (ids of
 * categorical values, generated data). The same functions as the servers'
 * id hash, but the example's data does not depend on them.
 */
static inline uint64_t ctr_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static inline uint64_t ctr_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#define CTR_NINT    13 /* integer features per line */
#define CTR_NCAT    26 /* categorical features per line */
#define CTR_EMB_DIM 16 /* embedding floats per categorical field */
#define CTR_H1	    64 /* first hidden layer */
#define CTR_H2	    32 /* second hidden layer */
#define CTR_IN	    (CTR_NCAT * CTR_EMB_DIM + CTR_NINT)

/* Dense parameters, laid out one after another in a flat float array. */
#define CTR_OFF_W1   0
#define CTR_OFF_B1   (CTR_OFF_W1 + CTR_H1 * CTR_IN)
#define CTR_OFF_W2   (CTR_OFF_B1 + CTR_H1)
#define CTR_OFF_B2   (CTR_OFF_W2 + CTR_H2 * CTR_H1)
#define CTR_OFF_W3   (CTR_OFF_B2 + CTR_H2)
#define CTR_OFF_B3   (CTR_OFF_W3 + CTR_H2)
#define CTR_OFF_BIAS (CTR_OFF_B3 + 1) /* the wide part's bias */
#define CTR_NDENSE   (CTR_OFF_BIAS + 1)

/* The dense parameters travel as rows of this many floats (a dense table). */
#define CTR_DENSE_ROW  256
#define CTR_DENSE_ROWS ((CTR_NDENSE + CTR_DENSE_ROW - 1) / CTR_DENSE_ROW)

/* One parsed example. */
struct ctr_example {
	float label;		/* 0 or 1 */
	float ints[CTR_NINT];	/* log-normalised integer features */
	uint64_t ids[CTR_NCAT]; /* feature id of each categorical value */
};

/*
 * Parses one Criteo line (label, 13 ints, 26 hex categoricals; empty fields
 * allowed). Returns 0, or -1 for a malformed line. A categorical id mixes
 * the field number in, so equal hex values of different fields differ; an
 * empty field gets the field's own "missing" id.
 */
int ctr_parse(const char *line, struct ctr_example *ex);

/*
 * Reads up to max examples from f into ex[], keeping only lines whose
 * number modulo nshards is shard (workers split a file this way). *lineno
 * counts lines read so far. Returns how many were stored; 0 at end of file.
 * Malformed lines are skipped and counted in *bad.
 */
uint32_t ctr_read_batch(FILE *f, struct ctr_example *ex, uint32_t max,
			uint32_t shard, uint32_t nshards, uint64_t *lineno,
			uint64_t *bad);

/* Initial dense parameters (He-style uniform, deterministic from seed). */
void ctr_dense_init(float *dense, uint64_t seed);

/*
 * Forward and backward over a batch of n examples.
 *   emb[i * CTR_NCAT * CTR_EMB_DIM ...]  embeddings of example i's fields
 *   wide[i * CTR_NCAT ...]               wide weights of example i's fields
 *   dense[CTR_NDENSE]                    MLP weights and the wide bias
 * Writes the mean logloss and, when the gradient pointers are not NULL, the
 * gradients of the mean loss w.r.t. each input (same layouts; g_dense is
 * overwritten). p_out, if not NULL, receives each example's probability.
 */
double ctr_forward_backward(const struct ctr_example *ex, uint32_t n,
			    const float *emb, const float *wide,
			    const float *dense, float *g_emb, float *g_wide,
			    float *g_dense, double *p_out);

/* Area under the ROC curve of scores against 0/1 labels (ties averaged). */
double ctr_auc(const double *scores, const uint8_t *labels, uint64_t n);

#endif
