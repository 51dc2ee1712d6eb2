/*
 * src/common/seconds.h - the one parser of durations in seconds as
 * embstore's flags and environment variables spell them: a decimal number
 * of seconds, fractions allowed ("30", "1.5", "0.25", "2e-3"). Every flag
 * and variable that takes seconds goes through it, so they all take the
 * same forms and refuse the same junk.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_COMMON_SECONDS_H
#define EMB_COMMON_SECONDS_H

#include <stdint.h>

/*
 * Parses s into whole milliseconds, rounded to the nearest, into *ms; a
 * value above 0 but under half a millisecond becomes 1 ms, so that a small
 * timeout never turns into 0 ("none"). The result must lie in [min_ms,
 * max_ms]. Leading and trailing blanks are refused with the rest of the
 * junk. 0, or -EINVAL (NULL or empty, not a number, junk after it, NaN or
 * infinite, hex), -ERANGE (negative, beyond max_ms or under min_ms).
 * *ms is set only on success.
 */
int emb_seconds_parse(const char *s, uint64_t min_ms, uint64_t max_ms,
		      uint64_t *ms);

/*
 * Why emb_seconds_parse() returned rc, for a message such as
 * "bad --frame-timeout '1.5x': <this>": a static string.
 */
const char *emb_seconds_strerror(int rc);

#endif
