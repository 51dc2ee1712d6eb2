/*
 * src/common/optim.h - optimizers shared by the store (server-side apply) and
 * the worker cache (write-back mode applies locally with the same code).
 *
 * A row is dim float weights followed by the optimizer's state floats:
 *
 *   optimizer        state floats  layout after w[0..dim)
 *   sgd              0             -
 *   adagrad          dim           acc[dim] (starts at initial_accumulator)
 *   adam             2*dim + 1     m[dim], v[dim], t (uint32 bits in a float)
 *   ftrl             2*dim         z[dim], n[dim]
 *   rowwise_adagrad  1             acc (starts at initial_accumulator)
 *
 * The state is fp32 whatever the format the weights are kept in.
 * rowwise_adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) keeps one accumulator
 * for the whole row: acc += mean over the row of g'^2, then every weight
 * moves by lr * g' / (sqrt(acc) + eps). A row of dim 64 then carries 65
 * floats where Adagrad's carries 128.
 *
 * Weight decay (L2) adds weight_decay * w to the gradient before the update.
 * Functions are pure over their arguments and thread-safe; callers serialise
 * updates to one row. Installed: embstore.h inlines the body, less the part
 * marked private.
 */
#ifndef EMB_COMMON_OPTIM_H
#define EMB_COMMON_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum emb_optim_kind {
	EMB_OPTIM_SGD = 1,
	EMB_OPTIM_ADAGRAD = 2,
	EMB_OPTIM_ADAM = 3,
	EMB_OPTIM_FTRL = 4,
	EMB_OPTIM_ROWWISE_ADAGRAD = 5,
};

struct emb_optim_cfg {
	uint32_t kind;		   /* enum emb_optim_kind */
	float lr;		   /* learning rate; FTRL's alpha */
	float weight_decay;	   /* L2 coefficient added to the gradient */
	float initial_accumulator; /* (rowwise) Adagrad: start of acc */
	float beta1;		   /* Adam: first-moment decay, [0, 1) */
	float beta2;		   /* Adam: second-moment decay, [0, 1) */
	float eps;		   /* Adam, (rowwise) Adagrad: guard, > 0 */
	float ftrl_beta;	   /* FTRL: beta in (beta + sqrt(n)) / alpha */
	float l1;		   /* FTRL: L1 strength, >= 0 */
	float l2;		   /* FTRL: L2 strength, >= 0 */
};

#define EMB_OPTIM_CFG_DEFAULT                                                  \
	((struct emb_optim_cfg){.kind = EMB_OPTIM_SGD,                         \
				.lr = 0.01f,                                   \
				.weight_decay = 0.0f,                          \
				.initial_accumulator = 0.1f,                   \
				.beta1 = 0.9f,                                 \
				.beta2 = 0.999f,                               \
				.eps = 1e-8f,                                  \
				.ftrl_beta = 1.0f,                             \
				.l1 = 0.0f,                                    \
				.l2 = 0.0f})

/*
 * Largest hyper-parameter emb_optim_validate() accepts (lr, weight decay,
 * Adagrad's initial accumulator, FTRL's beta, l1, l2). Beyond it one update
 * overflows a float: such a table could only ever hold Inf and NaN.
 */
#define EMB_OPTIM_PARAM_MAX 1e6f

/*
 * 0, or EMB_EBADOPTIM for an unknown kind or an out-of-range parameter: not
 * finite, negative (lr: not positive), over EMB_OPTIM_PARAM_MAX, eps not in
 * (0, 1], betas not in [0, 1).
 */
int emb_optim_validate(const struct emb_optim_cfg *cfg);

/* private: not in the installed embstore.h */
/*
 * True when every float of v[0..n) is finite. A push or assign of NaN or
 * Inf would poison its rows (and their optimizer state) for good, so the
 * store refuses such batches whole.
 */
bool emb_floats_finite(const float *v, size_t n);

/*
 * dst[0..n) += src[0..n), each element one addition, so the result is the
 * same bits in every vector copy: how the store and the client sum a
 * batch's repeated ids' gradients. dst and src do not overlap.
 */
void emb_floats_add(float *restrict dst, const float *restrict src,
		    size_t n);

/*
 * emb_optim_apply() over a row as the store keeps it, w[0..dim) followed
 * by its state, and true when every float of the result (weights and
 * state; Adam's step count aside) is finite. Finite gradients can still
 * overflow a row, so the store checks each result before it keeps it. The
 * check is folded into SGD's loop; the others check the row after it.
 */
bool emb_optim_apply_row(const struct emb_optim_cfg *cfg, float *w,
			 const float *g, uint32_t dim);
/* end private */

/* State floats per row (see the table above); 0 for an unknown kind. */
uint32_t emb_optim_state_floats(uint32_t kind, uint32_t dim);

/*
 * Sets the state of a new row: (rowwise) Adagrad's accumulator, zeros
 * otherwise.
 */
void emb_optim_state_init(const struct emb_optim_cfg *cfg, float *state,
			  uint32_t dim);

/*
 * Applies gradient g[0..dim) to weights w[0..dim) and their state. The config
 * must have passed emb_optim_validate(). Borrows every pointer for the call.
 */
void emb_optim_apply(const struct emb_optim_cfg *cfg, float *w, float *state,
		     const float *g, uint32_t dim);

/*
 * "sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"; "?" for an unknown
 * kind.
 */
const char *emb_optim_name(uint32_t kind);

/*
 * Parses "NAME[:key=value,...]" (keys: lr, wd, acc, beta1, beta2, eps, beta,
 * l1, l2) on top of EMB_OPTIM_CFG_DEFAULT. 0, or EMB_EBADOPTIM.
 */
int emb_optim_parse(const char *s, struct emb_optim_cfg *out);

#endif
