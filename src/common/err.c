/* src/common/err.c - messages for error codes. Thread-safe. */
#include "common/err.h"

#include <string.h>

const char *emb_strerror(int rc)
{
	const char *s;

	switch (rc) {
	case 0:
		return "success";
#define EMB_ERR_CASE(name, value, msg)                                         \
	case value:                                                            \
		return msg;
		EMB_ERR_LIST(EMB_ERR_CASE)
#undef EMB_ERR_CASE
	default:
		break;
	}
	if (rc < 0 && rc > -4096) {
		/* strerrordesc_np is thread-safe, unlike strerror. */
		s = strerrordesc_np(-rc);
		if (s)
			return s;
	}
	return "unknown error";
}
