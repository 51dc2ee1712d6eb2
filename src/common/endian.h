/*
 * src/common/endian.h - little-endian loads and stores at any alignment, for
 * the wire codecs and the snapshot files (both little-endian).
 *
 * Pure and thread-safe.
 */
#ifndef EMB_COMMON_ENDIAN_H
#define EMB_COMMON_ENDIAN_H

#include <stdint.h>
#include <string.h>

/*
 * Little-endian loads and stores at any alignment. memcpy keeps them free of
 * aliasing and alignment UB; on a little-endian host each compiles to one
 * move. Fixed fields go through these; bulk arrays are used in place.
 */
static inline uint16_t emb_le16_load(const void *p)
{
	uint16_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint32_t emb_le32_load(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint64_t emb_le64_load(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline float emb_lef32_load(const void *p)
{
	float v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void emb_le16_store(void *p, uint16_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline void emb_le32_store(void *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline void emb_le64_store(void *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline void emb_lef32_store(void *p, float v)
{
	memcpy(p, &v, sizeof(v));
}

#endif
