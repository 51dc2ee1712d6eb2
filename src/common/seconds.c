/*
 * src/common/seconds.c - durations in seconds, fractions allowed, to
 * milliseconds (seconds.h). Pure and thread-safe.
 */
#include "common/seconds.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

int emb_seconds_parse(const char *s, uint64_t min_ms, uint64_t max_ms,
		      uint64_t *ms)
{
	const char *p;
	double v, r;
	char *end;

	if (!s || !*s || !ms)
		return -EINVAL;
	/* strtod takes blanks, "nan", "inf" and hex: none is a duration we
	 * want to guess at, so only digits, one '.', an exponent and a
	 * leading sign pass. The sign is checked so that "-1" says "out of
	 * range" rather than "not a number". */
	for (p = s; *p; p++)
		if (!isdigit((unsigned char)*p) && *p != '.' && *p != 'e' &&
		    *p != 'E' && *p != '-' && *p != '+')
			return -EINVAL;
	if (s[0] != '-' && s[0] != '+' && s[0] != '.' &&
	    !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || isnan(v))
		return -EINVAL;
	if (errno == ERANGE && fabs(v) > 1) /* overflow; underflow is ~0 */
		return -ERANGE;
	if (v < 0)
		return -ERANGE;
	r = v * 1000;
	/* 2^63 ms is far beyond any max_ms: compare in double first. */
	if (!(r < 9.2e18))
		return -ERANGE;
	r = r > 0 && r < 0.5 ? 1 : floor(r + 0.5);
	if ((uint64_t)r < min_ms || (uint64_t)r > max_ms)
		return -ERANGE;
	*ms = (uint64_t)r;
	return 0;
}

const char *emb_seconds_strerror(int rc)
{
	switch (rc) {
	case 0:
		return "ok";
	case -ERANGE:
		return "out of range";
	default:
		return "not a number of seconds (e.g. 30 or 1.5)";
	}
}
