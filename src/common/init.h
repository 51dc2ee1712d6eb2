/*
 * src/common/init.h - deterministic row initializers.
 *
 * A row's initial values depend only on (table seed, id, config), so an id
 * starts identical on any server, after any restart or resharding. Elements
 * 2i and 2i + 1 of a row come from one counter-based draw keyed by seed and id
 * (splitmix64's finaliser at counter i + 1), so element j does not depend on
 * dim. Pure and thread-safe. Installed: embstore.h inlines the body.
 */
#ifndef EMB_COMMON_INIT_H
#define EMB_COMMON_INIT_H

#include <stdint.h>

enum emb_init_kind {
	EMB_INIT_ZEROS = 1,
	EMB_INIT_CONSTANT = 2,
	EMB_INIT_UNIFORM = 3, /* uniform in [a, b) */
	EMB_INIT_NORMAL = 4,  /* normal with mean a, std b; |z| <= 5.77 */
};

struct emb_init_cfg {
	uint32_t kind; /* enum emb_init_kind */
	float a;       /* constant value, uniform low, or normal mean */
	float b;       /* uniform high, or normal standard deviation */
};

#define EMB_INIT_CFG_DEFAULT                                                   \
	((struct emb_init_cfg){                                                \
	    .kind = EMB_INIT_UNIFORM, .a = -0.05f, .b = 0.05f})

/*
 * Largest |a| and |b| emb_init_validate() accepts. Embeddings start near 0;
 * a bound far above any real initializer keeps b - a and a + k * b finite
 * in the row generator.
 */
#define EMB_INIT_PARAM_MAX 1e4f

/*
 * 0, or EMB_EBADINIT (unknown kind, a >= b for uniform, b < 0 for normal,
 * |a| or |b| over EMB_INIT_PARAM_MAX or not finite).
 */
int emb_init_validate(const struct emb_init_cfg *cfg);

/*
 * Writes the initial weights of row id to w[0..dim). Uses SIMD where the
 * CPU has it (AVX-512 for uniform rows); the values are the same as
 * emb_init_row_ref()'s on every CPU.
 */
void emb_init_row(const struct emb_init_cfg *cfg, uint64_t seed, uint64_t id,
		  float *w, uint32_t dim);
/* The same values one draw at a time, without SIMD: the reference the
 * tests hold emb_init_row() to. */
void emb_init_row_ref(const struct emb_init_cfg *cfg, uint64_t seed,
		      uint64_t id, float *w, uint32_t dim);

const char *emb_init_name(uint32_t kind);

/* Parses "zeros", "constant:V", "uniform:A,B", "normal:MEAN,STD". */
int emb_init_parse(const char *s, struct emb_init_cfg *out);

#endif
