/*
 * src/common/addr.c - host:port parsing for every flag, variable and list
 * (addr.h). Pure and thread-safe.
 */
#include "common/addr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int parse_port(const char *p, size_t len, uint16_t *out)
{
	uint32_t v = 0;

	if (len == 0 || len > 5)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (p[i] < '0' || p[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint32_t)(p[i] - '0');
	}
	if (v > 65535)
		return -EINVAL;
	*out = (uint16_t)v;
	return 0;
}

int emb_addr_parse(const char *s, size_t len, int default_port,
		   struct emb_addr *out)
{
	const char *host = s, *port = NULL;
	size_t hlen;

	if (!s || !out || default_port > 65535)
		return -EINVAL;
	if (len && s[0] == '[') {
		const char *rb = memchr(s, ']', len);

		if (!rb)
			return -EINVAL;
		host = s + 1;
		hlen = (size_t)(rb - host);
		if (rb + 1 < s + len) {
			if (rb[1] != ':')
				return -EINVAL;
			port = rb + 2;
		}
	} else {
		const char *colon = memchr(s, ':', len);

		if (colon && memchr(colon + 1, ':', len - (size_t)(colon - s) - 1))
			return -EINVAL; /* an IPv6 address needs brackets */
		hlen = colon ? (size_t)(colon - s) : len;
		if (colon)
			port = colon + 1;
	}
	if (hlen == 0 || hlen >= sizeof(out->host) ||
	    memchr(host, ',', hlen) || memchr(host, '\0', hlen))
		return -EINVAL;
	if (port) {
		if (parse_port(port, (size_t)(s + len - port), &out->port))
			return -EINVAL;
	} else if (default_port >= 0) {
		out->port = (uint16_t)default_port;
	} else {
		return -EINVAL;
	}
	memcpy(out->host, host, hlen);
	out->host[hlen] = '\0';
	return 0;
}

int emb_addr_list_parse(const char *list, struct emb_addr *out, uint32_t max)
{
	const char *p = list;
	uint32_t n = 0;

	if (!list || !*list)
		return -EINVAL;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		struct emb_addr a;

		if (emb_addr_parse(p, len, -1, &a) || a.port == 0)
			return -EINVAL;
		if (n == max)
			return -E2BIG;
		out[n++] = a;
		if (!end)
			return (int)n;
		p = end + 1;
	}
}

/*
 * Why entry [p, p + len) of a list is no host:port with a non-zero port,
 * told apart by what emb_addr_parse() makes of it with and without a
 * default port.
 */
static const char *entry_why(const char *p, size_t len)
{
	struct emb_addr a;
	const char *colon;

	if (len == 0)
		return "empty entry";
	if (emb_addr_parse(p, len, 1, &a) == 0) {
		/* Parses with a default port: the port is missing or 0. */
		return emb_addr_parse(p, len, -1, &a) ? "no port (want host:port)"
						      : "port 0";
	}
	colon = p[0] == '[' ? memchr(p, ']', len) : memchr(p, ':', len);
	if (p[0] != '[' && colon &&
	    memchr(colon + 1, ':', len - (size_t)(colon - p) - 1))
		return "an IPv6 address needs brackets: [addr]:port";
	if (colon == p || (p[0] == '[' && colon == p + 1))
		return "no host";
	if (colon && (p[0] != '[' || (colon[1] == ':'))) {
		const char *port = colon + (p[0] == '[' ? 2 : 1);

		if (port >= p + len)
			return "no port (want host:port)";
		return "the port is not a number in 1..65535";
	}
	return "the host is longer than 255 bytes or malformed";
}

int emb_addr_list_explain(const char *list, char *buf, size_t cap)
{
	const char *p = list ? list : "";

	for (unsigned i = 1;; i++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		struct emb_addr a;

		if (emb_addr_parse(p, len, -1, &a) || a.port == 0)
			return snprintf(buf, cap, "entry %u \"%.*s\": %s", i,
					(int)(len > 64 ? 64 : len), p,
					entry_why(p, len));
		if (!end)
			return snprintf(buf, cap, "no bad entry");
		p = end + 1;
	}
}

int emb_addr_format(const struct emb_addr *a, char *buf, size_t cap)
{
	int n = strchr(a->host, ':') ?
		    snprintf(buf, cap, "[%s]:%u", a->host, a->port) :
		    snprintf(buf, cap, "%s:%u", a->host, a->port);

	return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}
