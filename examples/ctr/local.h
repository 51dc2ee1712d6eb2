/*
 * examples/ctr/local.h - a table in this process, for the trainer's --local
 * baseline: the same rows as an embstore table of the same spec, with no
 * servers. Initial values and optimizer steps come from libembstore's
 * public functions (emb_init_row(), emb_optim_apply()), so a local run and
 * a distributed one compute the same numbers. Admission (count:N, and
 * bloom:N counted exactly) as the servers apply it; no eviction. One
 * thread per table.
 */
#ifndef EMB_EXAMPLES_CTR_LOCAL_H
#define EMB_EXAMPLES_CTR_LOCAL_H

#include <stdbool.h>
#include <stdint.h>

#include <embstore.h>

struct ctr_local;

/* 0 and *out, or EMB_EBADDIM, EMB_EBADOPTIM, EMB_EBADINIT, -ENOMEM. The
 * spec is copied; its name is not used. */
int ctr_local_create(const struct emb_table_spec *spec,
		     struct ctr_local **out);
void ctr_local_destroy(struct ctr_local *t); /* NULL is a no-op */

/*
 * The weights of ids[0..n) into out[i * dim ...]. An absent id gets a new
 * row when create is set (once admitted; until then its initial values,
 * not kept), else zeros; found[i] (found may be NULL) says whether the row
 * existed or was made. 0 or -ENOMEM.
 */
int ctr_local_pull(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		   float *out, bool create, uint8_t *found);

/*
 * One optimizer step per distinct id of ids[0..n) with its gradients
 * grads[i * dim ...] summed. An absent id gets a new row first, or, under
 * admission, its gradient is dropped. 0 or -ENOMEM.
 */
int ctr_local_push(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		   const float *grads);

/* Sets the weights of ids[0..n) (rows[i * dim ...]), making absent rows. */
int ctr_local_assign(struct ctr_local *t, const uint64_t *ids, uint32_t n,
		     const float *rows);

#endif
