/* src/common/err.c - names and messages of error codes. Thread-safe. */
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

const char *emb_err_name(int rc)
{
	const char *s;

	switch (rc) {
	case 0:
		return "OK";
#define EMB_ERR_NAME(name, value, msg)                                         \
	case value:                                                            \
		return #name;
		EMB_ERR_LIST(EMB_ERR_NAME)
#undef EMB_ERR_NAME
	default:
		break;
	}
	if (rc < 0 && rc > -4096) {
		s = strerrorname_np(-rc);
		if (s)
			return s;
	}
	return "UNKNOWN";
}

int emb_err_codes(int *out, size_t cap)
{
	static const int codes[] = {
#define EMB_ERR_VALUE(name, value, msg) value,
	    EMB_ERR_LIST(EMB_ERR_VALUE)
#undef EMB_ERR_VALUE
	};
	const size_t n = sizeof(codes) / sizeof(codes[0]);

	for (size_t i = 0; i < n && i < cap; i++)
		out[i] = codes[i];
	return (int)n;
}
