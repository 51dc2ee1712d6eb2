/*
 * src/common/cfgcodec.h - the little-endian form of a table's optimizer and
 * initializer configs, one codec for every format that stores them: the
 * wire's table spec (proto/wire_msg.h, at spec offset 68) and the snapshot
 * file header (store/snapshot.h, at offset 96), both the optimizer block
 * directly followed by the initializer block.
 *
 * Optimizer block (struct emb_optim_cfg, common/optim.h)
 *   OFFSET  SIZE  MEANING
 *   0       4     kind (enum emb_optim_kind)
 *   4       4     lr (f32)
 *   8       4     weight_decay (f32)
 *   12      4     initial_accumulator (f32)
 *   16      4     beta1 (f32)
 *   20      4     beta2 (f32)
 *   24      4     eps (f32)
 *   28      4     ftrl_beta (f32)
 *   32      4     l1 (f32)
 *   36      4     l2 (f32)
 *   size 40
 *
 * Initializer block (struct emb_init_cfg, common/init.h)
 *   0       4     kind (enum emb_init_kind)
 *   4       4     a (f32)
 *   8       4     b (f32)
 *   size 12
 *
 * Decoders check nothing: callers validate the configs they read. Pure and
 * thread-safe; p may have any alignment. Named emb_cfg_* so that
 * libembstore's export list (emb_optim_*, emb_init_*) leaves them inside.
 */
#ifndef EMB_COMMON_CFGCODEC_H
#define EMB_COMMON_CFGCODEC_H

#include <stdint.h>

#include "common/init.h"
#include "common/optim.h"

#define EMB_CFG_OPTIM_BYTES 40u
#define EMB_CFG_INIT_BYTES  12u

/* Writes c to p[0..EMB_CFG_OPTIM_BYTES). */
void emb_cfg_optim_encode(uint8_t *p, const struct emb_optim_cfg *c);
/* Reads p[0..EMB_CFG_OPTIM_BYTES) into *c. */
void emb_cfg_optim_decode(const uint8_t *p, struct emb_optim_cfg *c);

/* Writes c to p[0..EMB_CFG_INIT_BYTES). */
void emb_cfg_init_encode(uint8_t *p, const struct emb_init_cfg *c);
/* Reads p[0..EMB_CFG_INIT_BYTES) into *c. */
void emb_cfg_init_decode(const uint8_t *p, struct emb_init_cfg *c);

#endif
