/*
 * src/common/lifecycle.c - admission and eviction specs: checks, parsing and
 * formatting. Pure; any thread.
 */
#include "common/lifecycle.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int emb_lifecycle_validate(const struct emb_lifecycle_cfg *c)
{
	if (!c)
		return EMB_EBADARG;
	switch (c->admit) {
	case EMB_ADMIT_NONE:
		if (c->admit_n || c->bloom_bytes)
			return EMB_EBADLIFE;
		break;
	case EMB_ADMIT_COUNT:
		if (c->admit_n < 2 || c->admit_n > EMB_ADMIT_COUNT_MAX ||
		    c->bloom_bytes)
			return EMB_EBADLIFE;
		break;
	case EMB_ADMIT_BLOOM:
		if (c->admit_n < 2 || c->admit_n > EMB_ADMIT_BLOOM_MAX)
			return EMB_EBADLIFE;
		if (c->bloom_bytes && (c->bloom_bytes < EMB_BLOOM_BYTES_MIN ||
				       c->bloom_bytes > EMB_BLOOM_BYTES_MAX))
			return EMB_EBADLIFE;
		break;
	default:
		return EMB_EBADLIFE;
	}
	if (c->order != EMB_EVICT_LRU && c->order != EMB_EVICT_LFU)
		return EMB_EBADLIFE;
	if (!isfinite(c->min_l2) || c->min_l2 < 0.0f)
		return EMB_EBADLIFE;
	return 0;
}

bool emb_lifecycle_evicts(const struct emb_lifecycle_cfg *c)
{
	return c->ttl_steps || c->min_l2 != 0.0f || c->max_rows;
}

bool emb_lifecycle_is_off(const struct emb_lifecycle_cfg *c)
{
	return c->admit == EMB_ADMIT_NONE && !c->ttl_steps &&
	       c->min_l2 == 0.0f && !c->max_rows;
}

/* A decimal integer in [lo, hi] that ends at end_ch; *endp after it. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, char end_ch,
		     const char **endp, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return EMB_EBADLIFE;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || v < lo || v > hi || *end != end_ch)
		return EMB_EBADLIFE;
	*endp = end;
	*out = v;
	return 0;
}

static int parse_bytes(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (*s < '0' || *s > '9')
		return EMB_EBADLIFE;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return EMB_EBADLIFE;
	switch (*end) {
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	default:
		break;
	}
	if (*end || v > (UINT64_MAX >> 34))
		return EMB_EBADLIFE;
	*out = (uint64_t)v << shift;
	return 0;
}

int emb_admit_parse(const char *s, struct emb_lifecycle_cfg *c)
{
	struct emb_lifecycle_cfg n;
	const char *end;
	uint64_t v;

	if (!s || !c)
		return EMB_EBADARG;
	n = *c;
	n.admit = EMB_ADMIT_NONE;
	n.admit_n = 0;
	n.bloom_bytes = 0;
	if (strcmp(s, "none") == 0) {
		/* all set */
	} else if (strncmp(s, "count:", 6) == 0) {
		if (parse_u64(s + 6, 2, EMB_ADMIT_COUNT_MAX, '\0', &end, &v))
			return EMB_EBADLIFE;
		n.admit = EMB_ADMIT_COUNT;
		n.admit_n = (uint32_t)v;
	} else if (strncmp(s, "bloom:", 6) == 0) {
		const char *colon = strchr(s + 6, ':');

		if (parse_u64(s + 6, 2, EMB_ADMIT_BLOOM_MAX, colon ? ':' : '\0',
			      &end, &v))
			return EMB_EBADLIFE;
		n.admit = EMB_ADMIT_BLOOM;
		n.admit_n = (uint32_t)v;
		if (colon) {
			uint64_t bytes;

			if (parse_bytes(colon + 1, &bytes) ||
			    bytes < EMB_BLOOM_BYTES_MIN ||
			    bytes > EMB_BLOOM_BYTES_MAX)
				return EMB_EBADLIFE;
			n.bloom_bytes = (uint32_t)bytes;
		}
	} else {
		return EMB_EBADLIFE;
	}
	if (emb_lifecycle_validate(&n))
		return EMB_EBADLIFE;
	*c = n;
	return 0;
}

/* One eviction term of length len at s, into n; seen guards repeats. */
static int evict_term(const char *s, size_t len, struct emb_lifecycle_cfg *n,
		      unsigned *seen)
{
	char term[64];
	const char *end;
	uint64_t v;

	if (len == 0 || len >= sizeof(term))
		return EMB_EBADLIFE;
	memcpy(term, s, len);
	term[len] = '\0';
	if (strncmp(term, "ttl:", 4) == 0 && !(*seen & 1)) {
		if (parse_u64(term + 4, 1, UINT32_MAX, '\0', &end, &v))
			return EMB_EBADLIFE;
		n->ttl_steps = (uint32_t)v;
		*seen |= 1;
	} else if (strncmp(term, "min_l2:", 7) == 0 && !(*seen & 2)) {
		char *fend;
		float x = strtof(term + 7, &fend);

		if (fend == term + 7 || *fend || !isfinite(x) || x <= 0.0f)
			return EMB_EBADLIFE;
		n->min_l2 = x;
		*seen |= 2;
	} else if (strncmp(term, "max_rows:", 9) == 0 && !(*seen & 4)) {
		const char *colon = strchr(term + 9, ':');

		if (parse_u64(term + 9, 1, UINT64_MAX >> 1, colon ? ':' : '\0',
			      &end, &v))
			return EMB_EBADLIFE;
		n->max_rows = v;
		n->order = EMB_EVICT_LRU;
		if (colon && strcmp(colon + 1, "lfu") == 0)
			n->order = EMB_EVICT_LFU;
		else if (colon && strcmp(colon + 1, "lru") != 0)
			return EMB_EBADLIFE;
		*seen |= 4;
	} else {
		return EMB_EBADLIFE;
	}
	return 0;
}

int emb_evict_parse(const char *s, struct emb_lifecycle_cfg *c)
{
	struct emb_lifecycle_cfg n;
	unsigned seen = 0;

	if (!s || !c)
		return EMB_EBADARG;
	n = *c;
	n.ttl_steps = 0;
	n.min_l2 = 0.0f;
	n.max_rows = 0;
	n.order = EMB_EVICT_LRU;
	if (strcmp(s, "none") != 0) {
		for (;;) {
			const char *comma = strchr(s, ',');
			size_t len = comma ? (size_t)(comma - s) : strlen(s);

			if (evict_term(s, len, &n, &seen))
				return EMB_EBADLIFE;
			if (!comma)
				break;
			s = comma + 1;
		}
	}
	if (emb_lifecycle_validate(&n))
		return EMB_EBADLIFE;
	*c = n;
	return 0;
}

void emb_admit_format(const struct emb_lifecycle_cfg *c, char *buf, size_t cap)
{
	switch (c->admit) {
	case EMB_ADMIT_COUNT:
		snprintf(buf, cap, "count:%u", c->admit_n);
		break;
	case EMB_ADMIT_BLOOM:
		if (c->bloom_bytes)
			snprintf(buf, cap, "bloom:%u:%u", c->admit_n,
				 c->bloom_bytes);
		else
			snprintf(buf, cap, "bloom:%u", c->admit_n);
		break;
	default:
		snprintf(buf, cap, "none");
		break;
	}
}

void emb_evict_format(const struct emb_lifecycle_cfg *c, char *buf, size_t cap)
{
	size_t len = 0;

	if (cap)
		buf[0] = '\0';
#define APPEND(...)                                                            \
	do {                                                                   \
		int w_ = snprintf(buf + len, cap > len ? cap - len : 0,        \
				  __VA_ARGS__);                                \
		if (w_ > 0)                                                    \
			len += (size_t)w_;                                     \
	} while (0)
	if (c->ttl_steps)
		APPEND("ttl:%u", c->ttl_steps);
	if (c->min_l2 > 0.0f)
		APPEND("%smin_l2:%.9g", len ? "," : "", (double)c->min_l2);
	if (c->max_rows)
		APPEND("%smax_rows:%llu:%s", len ? "," : "",
		       (unsigned long long)c->max_rows,
		       c->order == EMB_EVICT_LFU ? "lfu" : "lru");
	if (!len)
		APPEND("none");
#undef APPEND
}
