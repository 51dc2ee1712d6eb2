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

struct emb_dedup {
	uint64_t *keys;	    /* id held by each slot */
	uint32_t *pos;	    /* index into uniq; UINT32_MAX = empty */
	uint32_t mask;	    /* slot count - 1; count is a power of two */
	uint32_t max_batch; /* largest n that emb_dedup_run() accepts */
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
	d->keys = malloc(size * sizeof(*d->keys));
	if (!d->keys)
		goto err_free_d;
	d->pos = malloc(size * sizeof(*d->pos));
	if (!d->pos)
		goto err_free_keys;
	memset(d->pos, 0xff, size * sizeof(*d->pos));

	d->mask = size - 1;
	d->max_batch = max_batch;
	*out = d;
	return 0;

err_free_keys:
	free(d->keys);
err_free_d:
	free(d);
	return -ENOMEM;
}

void emb_dedup_destroy(struct emb_dedup *d)
{
	if (!d)
		return;
	free(d->pos);
	free(d->keys);
	free(d);
}

static uint32_t home(const struct emb_dedup *d, uint64_t id)
{
	return (uint32_t)emb_id_hash(id) & d->mask;
}

int emb_dedup_run(struct emb_dedup *d, const uint64_t *ids, uint32_t n,
		  uint64_t *uniq, uint32_t *inv)
{
	uint32_t nuniq = 0;

	if (n > d->max_batch)
		return -EINVAL;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t id = ids[i];
		uint32_t s = home(d, id);

		while (d->pos[s] != UINT32_MAX && d->keys[s] != id)
			s = (s + 1) & d->mask;
		if (d->pos[s] == UINT32_MAX) {
			d->keys[s] = id;
			d->pos[s] = nuniq;
			uniq[nuniq++] = id;
		}
		inv[i] = d->pos[s];
	}

	/*
	 * Empty the table for the next batch. A big batch clears it whole
	 * (a memset is cheaper than a probe per id); a small one removes its
	 * keys in reverse insertion order, which keeps every remaining key
	 * reachable: a key's probe run holds only keys inserted before it.
	 */
	if (nuniq > (d->mask + 1) / 64) {
		memset(d->pos, 0xff, ((size_t)d->mask + 1) * sizeof(*d->pos));
		return (int)nuniq;
	}
	for (uint32_t u = nuniq; u-- > 0;) {
		uint32_t s = home(d, uniq[u]);

		while (d->keys[s] != uniq[u] || d->pos[s] == UINT32_MAX)
			s = (s + 1) & d->mask;
		d->pos[s] = UINT32_MAX;
	}
	return (int)nuniq;
}
