/*
 * src/common/cfgcodec.c - the optimizer and initializer blocks of
 * cfgcodec.h, written and read field by field. Pure and thread-safe.
 */
#include "common/cfgcodec.h"

#include "common/endian.h"

void emb_cfg_optim_encode(uint8_t *p, const struct emb_optim_cfg *c)
{
	emb_le32_store(p, c->kind);
	emb_lef32_store(p + 4, c->lr);
	emb_lef32_store(p + 8, c->weight_decay);
	emb_lef32_store(p + 12, c->initial_accumulator);
	emb_lef32_store(p + 16, c->beta1);
	emb_lef32_store(p + 20, c->beta2);
	emb_lef32_store(p + 24, c->eps);
	emb_lef32_store(p + 28, c->ftrl_beta);
	emb_lef32_store(p + 32, c->l1);
	emb_lef32_store(p + 36, c->l2);
}

void emb_cfg_optim_decode(const uint8_t *p, struct emb_optim_cfg *c)
{
	c->kind = emb_le32_load(p);
	c->lr = emb_lef32_load(p + 4);
	c->weight_decay = emb_lef32_load(p + 8);
	c->initial_accumulator = emb_lef32_load(p + 12);
	c->beta1 = emb_lef32_load(p + 16);
	c->beta2 = emb_lef32_load(p + 20);
	c->eps = emb_lef32_load(p + 24);
	c->ftrl_beta = emb_lef32_load(p + 28);
	c->l1 = emb_lef32_load(p + 32);
	c->l2 = emb_lef32_load(p + 36);
}

void emb_cfg_init_encode(uint8_t *p, const struct emb_init_cfg *c)
{
	emb_le32_store(p, c->kind);
	emb_lef32_store(p + 4, c->a);
	emb_lef32_store(p + 8, c->b);
}

void emb_cfg_init_decode(const uint8_t *p, struct emb_init_cfg *c)
{
	c->kind = emb_le32_load(p);
	c->a = emb_lef32_load(p + 4);
	c->b = emb_lef32_load(p + 8);
}
