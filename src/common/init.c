/*
 * src/common/init.c - initial row values from (seed, id). Thread-safe.
 *
 * The stream for a row starts at splitmix64 state H(seed, id); element j takes
 * the j-th draw (normal takes draws in pairs, Box-Muller). Changing this
 * changes every table's initial values, so the dump format version records it.
 */
#include "common/init.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"

/* Within +-EMB_INIT_PARAM_MAX; false for NaN too. */
static bool bounded(float x)
{
	return x >= -EMB_INIT_PARAM_MAX && x <= EMB_INIT_PARAM_MAX;
}

int emb_init_validate(const struct emb_init_cfg *cfg)
{
	if (!cfg)
		return EMB_EBADARG;
	switch (cfg->kind) {
	case EMB_INIT_ZEROS:
		return 0;
	case EMB_INIT_CONSTANT:
		return bounded(cfg->a) ? 0 : EMB_EBADINIT;
	case EMB_INIT_UNIFORM:
		return bounded(cfg->a) && bounded(cfg->b) && cfg->a < cfg->b
			   ? 0
			   : EMB_EBADINIT;
	case EMB_INIT_NORMAL:
		return bounded(cfg->a) && bounded(cfg->b) && cfg->b >= 0.0f
			   ? 0
			   : EMB_EBADINIT;
	default:
		return EMB_EBADINIT;
	}
}

/* Uniform double in [0, 1) with 53 random bits. */
static double unit(uint64_t *st)
{
	return (double)(emb_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0);
}

void emb_init_row(const struct emb_init_cfg *cfg, uint64_t seed, uint64_t id,
		  float *w, uint32_t dim)
{
	uint64_t st =
	    emb_id_hash(seed ^ emb_id_hash(id + 0x632be59bd9b4e019ull));
	uint32_t i;

	switch (cfg->kind) {
	case EMB_INIT_CONSTANT:
		for (i = 0; i < dim; i++)
			w[i] = cfg->a;
		break;
	case EMB_INIT_UNIFORM:
		for (i = 0; i < dim; i++) {
			w[i] = (float)(cfg->a + (cfg->b - cfg->a) * unit(&st));
			/* Rounding to float can land on b itself. */
			if (w[i] >= cfg->b)
				w[i] = nextafterf(cfg->b, cfg->a);
		}
		break;
	case EMB_INIT_NORMAL:
		for (i = 0; i < dim; i += 2) {
			/* 1 - unit() is in (0, 1], so log() is finite. */
			double r = sqrt(-2.0 * log(1.0 - unit(&st)));
			double th = 2.0 * M_PI * unit(&st);

			w[i] = (float)(cfg->a + cfg->b * r * cos(th));
			if (i + 1 < dim)
				w[i + 1] =
				    (float)(cfg->a + cfg->b * r * sin(th));
		}
		break;
	case EMB_INIT_ZEROS:
	default:
		memset(w, 0, dim * sizeof(*w));
		break;
	}
}

const char *emb_init_name(uint32_t kind)
{
	switch (kind) {
	case EMB_INIT_ZEROS:
		return "zeros";
	case EMB_INIT_CONSTANT:
		return "constant";
	case EMB_INIT_UNIFORM:
		return "uniform";
	case EMB_INIT_NORMAL:
		return "normal";
	default:
		return "?";
	}
}

int emb_init_parse(const char *s, struct emb_init_cfg *out)
{
	struct emb_init_cfg c = {0};
	const char *colon;
	char *end;
	size_t nlen;

	if (!s || !out)
		return EMB_EBADARG;
	colon = strchr(s, ':');
	nlen = colon ? (size_t)(colon - s) : strlen(s);
	for (uint32_t k = EMB_INIT_ZEROS; k <= EMB_INIT_NORMAL; k++) {
		if (strlen(emb_init_name(k)) == nlen &&
		    memcmp(emb_init_name(k), s, nlen) == 0)
			c.kind = k;
	}
	switch (c.kind) {
	case EMB_INIT_ZEROS:
		if (colon)
			return EMB_EBADINIT;
		break;
	case EMB_INIT_CONSTANT:
		if (!colon)
			return EMB_EBADINIT;
		c.a = strtof(colon + 1, &end);
		if (*end || end == colon + 1)
			return EMB_EBADINIT;
		break;
	case EMB_INIT_UNIFORM:
	case EMB_INIT_NORMAL:
		if (!colon)
			return EMB_EBADINIT;
		c.a = strtof(colon + 1, &end);
		if (*end != ',')
			return EMB_EBADINIT;
		c.b = strtof(end + 1, &end);
		if (*end)
			return EMB_EBADINIT;
		break;
	default:
		return EMB_EBADINIT;
	}
	if (emb_init_validate(&c))
		return EMB_EBADINIT;
	*out = c;
	return 0;
}
