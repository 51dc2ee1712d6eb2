/*
 * src/cache/dedup.c - per-batch id dedup for the worker cache. Open addressing
 * over a power-of-two table twice the largest batch. Not thread-safe: one per
 * thread.
 */
#include "cache/dedup.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

/*
 * A slot holds its id, the id's index into uniq and the batch that wrote
 * it: a slot whose stamp is not the current batch's is empty, so a batch
 * starts on a table that needs no clearing (a 64 KB memset a batch before,
 * and a probe's id and index were two lines apart; a client's pull spent
 * about a tenth of its time here). The stamp wraps after 2^32 batches,
 * and then the table is cleared once.
 */
struct slot {
	uint64_t key;  /* id */
	uint32_t pos;  /* index into uniq */
	uint32_t gen;  /* batch that wrote it; 0 = never */
};

struct emb_dedup {
	struct slot *slots;
	uint32_t mask;	    /* slot count - 1; count is a power of two */
	uint32_t max_batch; /* largest n that emb_dedup_run() accepts */
	uint32_t gen;	    /* the running batch's stamp, never 0 */
};

int emb_dedup_create(uint32_t max_batch, struct emb_dedup **out)
{
	struct emb_dedup *d;
	uint32_t size = 2;

	if (max_batch == 0 || max_batch > (1u << 30))
		return -EINVAL;
	while (size < 2 * max_batch)
		size <<= 1;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	/* Zeroed: every stamp 0, which no batch uses. */
	d->slots = calloc(size, sizeof(*d->slots));
	if (!d->slots) {
		free(d);
		return -ENOMEM;
	}
	d->mask = size - 1;
	d->max_batch = max_batch;
	*out = d;
	return 0;
}

void emb_dedup_destroy(struct emb_dedup *d)
{
	if (!d)
		return;
	free(d->slots);
	free(d);
}

/* Ids whose home slot is prefetched ahead of the probe: a batch's table
 * (256 KB at 4096 ids) leaves L2 between batches, while the rows a pull
 * scatters stream through it. */
#define AHEAD 8u

int emb_dedup_run(struct emb_dedup *d, const uint64_t *ids, uint32_t n,
		  uint64_t *uniq, uint32_t *inv)
{
	struct slot *const slots = d->slots;
	const uint32_t mask = d->mask;
	uint32_t home[AHEAD];
	uint32_t nuniq = 0, gen;

	if (n > d->max_batch)
		return -EINVAL;
	if (++d->gen == 0) {
		memset(slots, 0, ((size_t)mask + 1) * sizeof(*slots));
		d->gen = 1;
	}
	gen = d->gen;

	for (uint32_t i = 0; i < n && i < AHEAD; i++) {
		home[i] = (uint32_t)emb_id_hash(ids[i]) & mask;
		__builtin_prefetch(&slots[home[i]], 1);
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint64_t id = ids[i];
		uint32_t s = home[i % AHEAD];

		if (i + AHEAD < n) {
			uint32_t h = (uint32_t)emb_id_hash(ids[i + AHEAD]) &
				     mask;

			home[i % AHEAD] = h;
			__builtin_prefetch(&slots[h], 1);
		}
		while (slots[s].gen == gen && slots[s].key != id)
			s = (s + 1) & mask;
		if (slots[s].gen != gen) {
			slots[s].key = id;
			slots[s].pos = nuniq;
			slots[s].gen = gen;
			uniq[nuniq++] = id;
		}
		inv[i] = slots[s].pos;
	}
	return (int)nuniq;
}
