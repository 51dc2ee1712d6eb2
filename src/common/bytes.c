/*
 * src/common/bytes.c - sizes in bytes (bytes.h).
 */
#include "common/bytes.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int emb_bytes_parse(const char *s, uint64_t *out)
{
	static const char units[] = "kmgt"; /* 2^10, 2^20, 2^30, 2^40 */
	const char *u;
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	u = *end ? strchr(units, tolower((unsigned char)*end)) : NULL;
	if (u) {
		mul = 1ull << (10 * (u - units + 1));
		end++;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (v && mul > UINT64_MAX / v))
		return -EINVAL;
	*out = v * mul;
	return 0;
}
