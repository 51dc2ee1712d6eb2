/*
 * src/common/token.h - the one reader of auth token files, shared by the
 * server, the scheduler, the worker library and every tool.
 *
 * A token file holds 1..EMB_TOKEN_MAX bytes; trailing CR/LF are dropped so
 * `echo secret > F` works. Thread-safe.
 */
#ifndef EMB_COMMON_TOKEN_H
#define EMB_COMMON_TOKEN_H

#include <stdint.h>

#define EMB_TOKEN_MAX 256u /* bytes of an auth token (HELLO's field) */

/*
 * Reads the token in path into buf (room for EMB_TOKEN_MAX bytes) and its
 * length into *len. 0, or -errno of open/read, or -EINVAL (empty, or
 * longer than EMB_TOKEN_MAX).
 */
int emb_token_read_file(const char *path, uint8_t *buf, uint32_t *len);

#endif
