/*
 * src/common/addr.h - the one parser of network addresses as embstore's
 * flags, environment variables and server lists spell them:
 *
 *   host:port      a name or an IPv4 address ("db-3:7164", "10.0.0.2:7164")
 *   [v6]:port      an IPv6 address in brackets ("[::1]:7164")
 *   host, [v6]     without a port, where the caller has a default
 *
 * A host containing ':' must be bracketed: "::1:7164" is ambiguous and
 * refused. Lists separate addresses with commas. Nothing here resolves
 * names; the transports do that when they connect or bind.
 *
 * Pure and thread-safe.
 */
#ifndef EMB_COMMON_ADDR_H
#define EMB_COMMON_ADDR_H

#include <stddef.h>
#include <stdint.h>

#define EMB_HOST_MAX 256u /* bytes of a host, with the NUL */

struct emb_addr {
	char host[EMB_HOST_MAX]; /* without brackets, NUL-terminated */
	uint16_t port;		 /* 0..65535 */
};

/*
 * Parses s[0..len) (len may stop before s's NUL) into *out. default_port
 * >= 0 is used when s has no port; -1 makes the port required. Port 0 is
 * accepted ("pick a free one" for listeners): callers that connect check.
 * 0, or -EINVAL (empty or too long host, bad brackets, port not a number
 * in 0..65535, unbracketed ':' in the host).
 */
int emb_addr_parse(const char *s, size_t len, int default_port,
		   struct emb_addr *out);

/*
 * Parses a comma-separated list of host:port (ports required, non-zero)
 * into out[0..max). Returns how many, or -EINVAL (a malformed entry, an
 * empty list or entry) / -E2BIG (more than max).
 */
int emb_addr_list_parse(const char *list, struct emb_addr *out, uint32_t max);

/*
 * Why emb_addr_list_parse() refuses list: its first bad entry, by position
 * from 1, and what is wrong with it, into buf ('entry 2 "h:x": the port is
 * not a number in 1..65535'). snprintf's return.
 */
int emb_addr_list_explain(const char *list, char *buf, size_t cap);

/*
 * Writes a as "host:port", or "[host]:port" when host contains ':', to
 * buf. Returns the length, or -ENOSPC if cap is too small.
 */
int emb_addr_format(const struct emb_addr *a, char *buf, size_t cap);

#endif
