/*
 * tests/common/test_addr.c - the one address parser (host:port, [v6]:port,
 * names, lists) and the one token-file reader. Single-threaded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "common/addr.h"
#include "common/token.h"

static int parse(const char *s, int dflt, struct emb_addr *a)
{
	return emb_addr_parse(s, strlen(s), dflt, a);
}

static void test_forms(void)
{
	struct emb_addr a;

	CU_ASSERT_EQUAL(parse("10.0.0.2:7164", -1, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "10.0.0.2");
	CU_ASSERT_EQUAL(a.port, 7164);
	CU_ASSERT_EQUAL(parse("db-3.example:65535", -1, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "db-3.example");
	CU_ASSERT_EQUAL(a.port, 65535);
	CU_ASSERT_EQUAL(parse("[::1]:7164", -1, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "::1");
	CU_ASSERT_EQUAL(a.port, 7164);
	CU_ASSERT_EQUAL(parse("[fe80::1%eth0]:0", -1, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "fe80::1%eth0");
	CU_ASSERT_EQUAL(a.port, 0);
	CU_ASSERT_EQUAL(parse("localhost", 7164, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "localhost");
	CU_ASSERT_EQUAL(a.port, 7164);
	CU_ASSERT_EQUAL(parse("[::]", 9000, &a), 0);
	CU_ASSERT_STRING_EQUAL(a.host, "::");
	CU_ASSERT_EQUAL(a.port, 9000);
}

static void test_refusals(void)
{
	static const char *bad[] = {
	    "",		  ":7164",	 "host:",	  "host:x",
	    "host:65536", "host:-1",	 "host:7164x",	  "::1:7164",
	    "[::1",	  "[::1]7164",	 "[]:7164",	  "host:123456",
	    "a,b:1",
	};
	struct emb_addr a;
	char longhost[EMB_HOST_MAX + 8];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_EQUAL_FATAL(parse(bad[i], -1, &a), -EINVAL);
	/* No port and no default. */
	CU_ASSERT_EQUAL(parse("host", -1, &a), -EINVAL);
	memset(longhost, 'h', EMB_HOST_MAX);
	strcpy(longhost + EMB_HOST_MAX, ":1");
	CU_ASSERT_EQUAL(parse(longhost, -1, &a), -EINVAL);
}

static void test_lists_and_format(void)
{
	struct emb_addr a[4];
	char buf[64];

	CU_ASSERT_EQUAL(emb_addr_list_parse("h1:1,[::1]:2,h3:3", a, 4), 3);
	CU_ASSERT_STRING_EQUAL(a[1].host, "::1");
	CU_ASSERT_EQUAL(a[2].port, 3);
	CU_ASSERT_EQUAL(emb_addr_list_parse("h1:1,h2:2", a, 1), -E2BIG);
	CU_ASSERT_EQUAL(emb_addr_list_parse("h1:1,,h2:2", a, 4), -EINVAL);
	CU_ASSERT_EQUAL(emb_addr_list_parse("h1:1,", a, 4), -EINVAL);
	CU_ASSERT_EQUAL(emb_addr_list_parse("h1:0", a, 4), -EINVAL);
	CU_ASSERT_EQUAL(emb_addr_list_parse("", a, 4), -EINVAL);
	CU_ASSERT_EQUAL(emb_addr_format(&a[1], buf, sizeof(buf)), 7);
	CU_ASSERT_STRING_EQUAL(buf, "[::1]:2");
	CU_ASSERT_EQUAL(emb_addr_format(&a[0], buf, sizeof(buf)), 4);
	CU_ASSERT_STRING_EQUAL(buf, "h1:1");
	CU_ASSERT_EQUAL(emb_addr_format(&a[1], buf, 5), -ENOSPC);
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(fwrite(data, 1, n, f), n);
	fclose(f);
}

static void test_token_file(void)
{
	char *dir = emb_test_tmpdir();
	char path[512];
	uint8_t buf[EMB_TOKEN_MAX], big[EMB_TOKEN_MAX + 1];
	uint32_t len = 0;

	snprintf(path, sizeof(path), "%s/token", dir);
	write_file(path, "s3cret\r\n", 8);
	CU_ASSERT_EQUAL(emb_token_read_file(path, buf, &len), 0);
	CU_ASSERT_EQUAL(len, 6);
	CU_ASSERT_EQUAL(memcmp(buf, "s3cret", 6), 0);
	memset(big, 'x', sizeof(big));
	write_file(path, big, EMB_TOKEN_MAX);
	CU_ASSERT_EQUAL(emb_token_read_file(path, buf, &len), 0);
	CU_ASSERT_EQUAL(len, EMB_TOKEN_MAX);
	write_file(path, big, sizeof(big));
	CU_ASSERT_EQUAL(emb_token_read_file(path, buf, &len), -EINVAL);
	write_file(path, "\n", 1);
	CU_ASSERT_EQUAL(emb_token_read_file(path, buf, &len), -EINVAL);
	snprintf(path, sizeof(path), "%s/missing", dir);
	CU_ASSERT_EQUAL(emb_token_read_file(path, buf, &len), -ENOENT);
	emb_test_rmtree(dir);
	free(dir);
}

/* What a user reads about a server list that does not parse. */
static void test_list_explain(void)
{
	static const struct {
		const char *list, *want;
	} cases[] = {
	    {"127.0.0.1", "entry 1 \"127.0.0.1\": no port (want host:port)"},
	    {"h:1,h:70000", "entry 2 \"h:70000\": the port is not a number "
			    "in 1..65535"},
	    {"h:1,,h:2", "entry 2 \"\": empty entry"},
	    {"", "entry 1 \"\": empty entry"},
	    {"h:0", "entry 1 \"h:0\": port 0"},
	    {"fe80::1:7000", "an IPv6 address needs brackets"},
	    {":7000", "entry 1 \":7000\": no host"},
	    {"[::1]:x", "the port is not a number"},
	    {"[::1]", "no port"},
	    {"h:", "no port"},
	};
	char buf[160];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct emb_addr a[4];

		CU_ASSERT(emb_addr_list_parse(cases[i].list, a, 4) < 0);
		CU_ASSERT(emb_addr_list_explain(cases[i].list, buf,
						sizeof(buf)) > 0);
		if (!strstr(buf, cases[i].want))
			fprintf(stderr, "%s: %s\n", cases[i].list, buf);
		CU_ASSERT_PTR_NOT_NULL(strstr(buf, cases[i].want));
	}
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"parses host:port, [v6]:port, names and default ports",
	     test_forms},
	    {"refuses malformed addresses and unbracketed IPv6",
	     test_refusals},
	    {"parses lists and formats IPv6 with brackets",
	     test_lists_and_format},
	    {"reads token files, trimming newlines, refusing empty and long",
	     test_token_file},
	    {"a refused list names its first bad entry and the fault",
	     test_list_explain},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "common/addr", cases);
}
