/*
 * src/common/bytes.h - the one parser of sizes in bytes as embstore's
 * flags spell them ("123", "64K", "8M", "2G", "1T", with an optional "B";
 * powers of two), so that every size flag takes the same forms.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_COMMON_BYTES_H
#define EMB_COMMON_BYTES_H

#include <stdint.h>

/* Parses s into *out; 0, or -EINVAL when malformed or past 2^64. */
int emb_bytes_parse(const char *s, uint64_t *out);

#endif
