/*
 * src/common/token.c - auth token files (token.h). Thread-safe.
 */
#include "common/token.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int emb_token_read_file(const char *path, uint8_t *buf, uint32_t *len)
{
	uint8_t tmp[EMB_TOKEN_MAX + 1];
	FILE *f;
	size_t n;
	int err;

	if (!path || !buf || !len)
		return -EINVAL;
	f = fopen(path, "rb");
	if (!f)
		return -errno;
	/* One byte past the limit tells "too long" from "exactly full". */
	n = fread(tmp, 1, sizeof(tmp), f);
	err = ferror(f) ? -EIO : 0;
	fclose(f);
	if (err)
		return err;
	while (n && (tmp[n - 1] == '\n' || tmp[n - 1] == '\r'))
		n--;
	if (n == 0 || n > EMB_TOKEN_MAX)
		return -EINVAL;
	memcpy(buf, tmp, n);
	*len = (uint32_t)n;
	return 0;
}
