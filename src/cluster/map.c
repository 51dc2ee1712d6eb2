/*
 * src/cluster/map.c - the replicated cluster map's arithmetic: the first
 * map, failover and joins, and its encoding. Pure functions; any thread.
 */
#include "cluster/map.h"

#include <errno.h>
#include <string.h>

#include "common/endian.h"
#include "common/err.h"

#define CMAP_MAGIC   0x4d424d45u /* "EMBM" */
#define CMAP_VERSION 1u

int emb_cmap_init(struct emb_cmap *m, uint32_t nservers, uint32_t replicas)
{
	if (!m || nservers == 0 || nservers > EMB_CMAP_SERVERS_MAX ||
	    replicas == 0 || replicas > EMB_CMAP_REPLICAS_MAX ||
	    replicas > nservers)
		return -EINVAL;
	m->epoch = 1;
	m->nservers = nservers;
	m->replicas = replicas;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t home = (uint32_t)((uint64_t)s * nservers / EMB_NSLOTS);

		for (uint32_t i = 0; i < EMB_CMAP_REPLICAS_MAX; i++)
			m->slot[s][i] = i < replicas
					    ? (uint16_t)((home + i) % nservers)
					    : EMB_CMAP_NONE;
	}
	return 0;
}

uint32_t emb_cmap_holders(const struct emb_cmap *m, uint32_t slot)
{
	uint32_t n = 0;

	while (n < m->replicas && m->slot[slot][n] != EMB_CMAP_NONE)
		n++;
	return n;
}

bool emb_cmap_holds(const struct emb_cmap *m, uint32_t slot, uint32_t rank)
{
	for (uint32_t i = 0; i < m->replicas; i++)
		if (m->slot[slot][i] == rank)
			return true;
	return false;
}

int emb_cmap_remove(const struct emb_cmap *in, uint32_t rank,
		    struct emb_cmap *out)
{
	bool changed = false;

	if (rank >= in->nservers)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint16_t *h = out->slot[s];
		uint32_t k = 0;

		/* Keep the others in order: the first backup left is the
		 * one promoted, as every reader of the map expects. */
		for (uint32_t i = 0; i < out->replicas; i++)
			if (h[i] != rank)
				h[k++] = h[i];
		if (k < out->replicas) {
			changed = true;
			while (k < out->replicas)
				h[k++] = EMB_CMAP_NONE;
		}
	}
	if (changed)
		out->epoch++;
	return (int)emb_cmap_lost_slots(out);
}

int emb_cmap_add(const struct emb_cmap *in, uint32_t rank,
		 struct emb_cmap *out)
{
	int added = 0;

	if (rank >= in->nservers)
		return -EINVAL;
	if (out != in)
		memcpy(out, in, sizeof(*out));
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t n = emb_cmap_holders(out, s);

		/* A slot with no holder has no rows to stream from: it
		 * stays lost rather than coming back empty. */
		if (n == 0 || n >= out->replicas || emb_cmap_holds(out, s, rank))
			continue;
		out->slot[s][n] = (uint16_t)rank;
		added++;
	}
	if (added)
		out->epoch++;
	return added;
}

uint32_t emb_cmap_primary_slots(const struct emb_cmap *m, uint32_t rank)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		n += m->slot[s][0] == rank;
	return n;
}

uint32_t emb_cmap_lost_slots(const struct emb_cmap *m)
{
	return emb_cmap_primary_slots(m, EMB_CMAP_NONE);
}

int64_t emb_cmap_encode(const struct emb_cmap *m, void *buf, size_t cap)
{
	size_t need = emb_cmap_encoded_size(m->replicas);
	uint8_t *p = buf;

	if (cap < need)
		return -ENOSPC;
	emb_le32_store(p, CMAP_MAGIC);
	emb_le32_store(p + 4, CMAP_VERSION);
	emb_le64_store(p + 8, m->epoch);
	emb_le32_store(p + 16, m->nservers);
	emb_le32_store(p + 20, m->replicas);
	p += EMB_CMAP_HDR_SIZE;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		for (uint32_t i = 0; i < m->replicas; i++, p += 2)
			emb_le16_store(p, m->slot[s][i]);
	return (int64_t)need;
}

int emb_cmap_decode(const void *buf, size_t len, struct emb_cmap *out)
{
	const uint8_t *p = buf;
	uint32_t n, r;

	if (!buf || len < EMB_CMAP_HDR_SIZE ||
	    emb_le32_load(p) != CMAP_MAGIC ||
	    emb_le32_load(p + 4) != CMAP_VERSION)
		return EMB_EBADFRAME;
	out->epoch = emb_le64_load(p + 8);
	n = emb_le32_load(p + 16);
	r = emb_le32_load(p + 20);
	if (out->epoch == 0 || n == 0 || n > EMB_CMAP_SERVERS_MAX || r == 0 ||
	    r > EMB_CMAP_REPLICAS_MAX || r > n ||
	    len != emb_cmap_encoded_size(r))
		return EMB_EBADFRAME;
	out->nservers = n;
	out->replicas = r;
	p += EMB_CMAP_HDR_SIZE;
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		bool ended = false;

		for (uint32_t i = 0; i < EMB_CMAP_REPLICAS_MAX; i++) {
			uint16_t v = i < r ? emb_le16_load(p + 2 * i)
					   : EMB_CMAP_NONE;

			out->slot[s][i] = v;
			if (i >= r)
				continue;
			if (v == EMB_CMAP_NONE) {
				ended = true;
				continue;
			}
			if (ended || v >= n)
				return EMB_EBADFRAME;
			for (uint32_t j = 0; j < i; j++)
				if (out->slot[s][j] == v)
					return EMB_EBADFRAME;
		}
		p += 2 * r;
	}
	return 0;
}
