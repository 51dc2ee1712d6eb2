/*
 * src/store/mem.c - a table's memory charges: every allocation the table
 * keeps (index, slabs, admission counters, a view's saved rows, the fixed
 * part at create) is charged against its own limit and the budget it
 * shares with other tables before it is made, and released when freed.
 *
 * A leaf: it calls no other file of the store, so the shard, the
 * lifecycle and the views may all charge without calling one another.
 * Threads: any; the counters are relaxed atomics.
 */
#include "store/store_int.h"

#include "common/err.h"

int emb__mem_charge(struct emb_table *t, int64_t n)
{
	struct emb_mem_budget *b = t->opts.budget;
	uint64_t used;

	if (n <= 0) {
		__atomic_fetch_sub(&t->mem_used, (uint64_t)-n,
				   __ATOMIC_RELAXED);
		if (b)
			__atomic_fetch_sub(&b->used, (uint64_t)-n,
					   __ATOMIC_RELAXED);
		return 0;
	}
	used = __atomic_add_fetch(&t->mem_used, (uint64_t)n, __ATOMIC_RELAXED);
	if (t->opts.mem_limit && used > t->opts.mem_limit)
		goto err_table;
	if (b) {
		used =
		    __atomic_add_fetch(&b->used, (uint64_t)n, __ATOMIC_RELAXED);
		if (b->limit && used > b->limit) {
			__atomic_fetch_sub(&b->used, (uint64_t)n,
					   __ATOMIC_RELAXED);
			goto err_table;
		}
	}
	return 0;

err_table:
	__atomic_fetch_sub(&t->mem_used, (uint64_t)n, __ATOMIC_RELAXED);
	return EMB_EMEMLIMIT;
}

void emb__mem_charge_force(struct emb_table *t, uint64_t n)
{
	struct emb_mem_budget *b = t->opts.budget;

	__atomic_fetch_add(&t->mem_used, n, __ATOMIC_RELAXED);
	if (b)
		__atomic_fetch_add(&b->used, n, __ATOMIC_RELAXED);
}
