/*
 * tests/worker/test_abi.c - the rules that let a program and libembstore of
 * different releases work together (embstore.h, "Sized structs" and
 * "Versions"): struct_size on the way in and out, the version, error names
 * and codes, struct sizes by name, and the per-thread last error. Servers
 * run in this process on loopback.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "netutil.h"

#include "server/server.h"

/* A caller's struct built against a newer header: ours plus a tail. */
struct newer_opts {
	struct emb_client_opts o;
	uint64_t added; /* a field this library does not know */
};

static void test_version(void)
{
	char want[32];

	snprintf(want, sizeof(want), "%d.%d.%d", EMBSTORE_VERSION_MAJOR,
		 EMBSTORE_VERSION_MINOR, EMBSTORE_VERSION_PATCH);
	CU_ASSERT_STRING_EQUAL(emb_version(), want);
	CU_ASSERT_STRING_EQUAL(emb_version(), EMBSTORE_VERSION_STRING);
	CU_ASSERT_EQUAL(emb_version_number(), EMBSTORE_VERSION_NUMBER);
	CU_ASSERT_EQUAL(EMBSTORE_VERSION_NUMBER,
			EMBSTORE_VERSION_MAJOR * 10000 +
			    EMBSTORE_VERSION_MINOR * 100 +
			    EMBSTORE_VERSION_PATCH);
}

static void test_err_names(void)
{
	int codes[256], n = emb_err_codes(NULL, 0);

	CU_ASSERT_STRING_EQUAL(emb_err_name(EMB_EBADDUMP), "EMB_EBADDUMP");
	CU_ASSERT_STRING_EQUAL(emb_err_name(-EINVAL), "EINVAL");
	CU_ASSERT_STRING_EQUAL(emb_err_name(-E2BIG), "E2BIG");
	CU_ASSERT_STRING_EQUAL(emb_err_name(0), "OK");
	CU_ASSERT_STRING_EQUAL(emb_err_name(-999999), "UNKNOWN");
	CU_ASSERT_STRING_EQUAL(emb_err_name(5), "UNKNOWN");
	CU_ASSERT_FATAL(n > 10 && n <= 256);
	/* A short buffer gets the first codes and the full count. */
	CU_ASSERT_EQUAL(emb_err_codes(codes, 2), n);
	CU_ASSERT_EQUAL(codes[0], EMB_EINTERNAL);
	CU_ASSERT_EQUAL(emb_err_codes(codes, 256), n);
	for (int i = 0; i < n; i++) {
		CU_ASSERT(codes[i] < -1000);
		CU_ASSERT(strncmp(emb_err_name(codes[i]), "EMB_E", 5) == 0);
		CU_ASSERT(strcmp(emb_strerror(codes[i]), "unknown error") != 0);
	}
}

static void test_struct_sizes(void)
{
	CU_ASSERT_EQUAL(emb_struct_size("emb_client_opts"),
			sizeof(struct emb_client_opts));
	CU_ASSERT_EQUAL(emb_struct_size("emb_table_spec"),
			sizeof(struct emb_table_spec));
	CU_ASSERT_EQUAL(emb_struct_size("emb_cached_table_opts"),
			sizeof(struct emb_cached_table_opts));
	CU_ASSERT_EQUAL(emb_struct_size("emb_client_stats"),
			sizeof(struct emb_client_stats));
	CU_ASSERT_EQUAL(emb_struct_size("emb_client_table_stats"),
			sizeof(struct emb_client_table_stats));
	CU_ASSERT_EQUAL(emb_struct_size("emb_cached_table_stats"),
			sizeof(struct emb_cached_table_stats));
	CU_ASSERT_EQUAL(emb_struct_size("emb_client_map"),
			sizeof(struct emb_client_map));
	CU_ASSERT_EQUAL(emb_struct_size("emb_client_server_table"),
			sizeof(struct emb_client_server_table));
	CU_ASSERT_EQUAL(emb_struct_size("emb_table_batch"),
			sizeof(struct emb_table_batch));
	CU_ASSERT_EQUAL(emb_struct_size("emb_optim_cfg"),
			sizeof(struct emb_optim_cfg));
	CU_ASSERT_EQUAL(emb_struct_size("emb_init_cfg"),
			sizeof(struct emb_init_cfg));
	CU_ASSERT_EQUAL(emb_struct_size("emb_lifecycle_cfg"),
			sizeof(struct emb_lifecycle_cfg));
	CU_ASSERT_EQUAL(emb_struct_size("emb_nothing"), 0);
	CU_ASSERT_EQUAL(emb_struct_size(NULL), 0);
}

static void test_init_functions(void)
{
	struct emb_client_opts o, od = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec s, sd = EMB_TABLE_SPEC_DEFAULT;
	struct emb_cached_table_opts c, cd = EMB_CACHED_TABLE_OPTS_DEFAULT;

	memset(&o, 0xa5, sizeof(o));
	memset(&s, 0xa5, sizeof(s));
	memset(&c, 0xa5, sizeof(c));
	emb_client_opts_init(&o);
	emb_table_spec_init(&s);
	emb_cached_table_opts_init(&c);
	CU_ASSERT_EQUAL(o.struct_size, sizeof(o));
	CU_ASSERT_STRING_EQUAL(o.servers, od.servers);
	CU_ASSERT_EQUAL(o.timeout_ms, od.timeout_ms);
	CU_ASSERT_EQUAL(s.struct_size, sizeof(s));
	CU_ASSERT_EQUAL(memcmp(&s.optim, &sd.optim, sizeof(s.optim)), 0);
	CU_ASSERT_EQUAL(memcmp(&s.init, &sd.init, sizeof(s.init)), 0);
	CU_ASSERT_EQUAL(s._pad0, 0);
	CU_ASSERT_EQUAL(c.struct_size, sizeof(c));
	CU_ASSERT_EQUAL(memcmp(&c, &cd, sizeof(c)), 0);
}

/* Options: size 0 and a set unknown tail are refused, with a reason. */
static void test_opts_in(void)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct newer_opts big = {.o = EMB_CLIENT_OPTS_DEFAULT};
	struct emb_client *c = NULL;
	char msg[512];

	o.struct_size = 0;
	CU_ASSERT_EQUAL(emb_client_create(&o, &c), -EINVAL);
	CU_ASSERT_EQUAL(emb_last_error(msg, sizeof(msg)), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "emb_client_opts"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "struct_size is 0"));
	/* Below the first published size: no version of the struct. */
	o.struct_size = 8;
	CU_ASSERT_EQUAL(emb_client_create(&o, &c), -EINVAL);
	CU_ASSERT_PTR_NULL(c);

	big.o.struct_size = sizeof(big);
	big.added = 1;
	CU_ASSERT_EQUAL(emb_client_create(&big.o, &c), -E2BIG);
	CU_ASSERT_EQUAL(emb_last_error(msg, sizeof(msg)), -E2BIG);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "emb_client_opts"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, EMBSTORE_VERSION_STRING));
	/* The older alias reads the same thread-local error. */
	CU_ASSERT_EQUAL(emb_client_last_error(NULL, NULL, 0), -E2BIG);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(emb_client_create(NULL, &c), -EINVAL);
}

/* A newer caller's zero tail is fine; stats fill at most struct_size and
 * zero a longer caller struct's tail. */
static void test_sized_against_server(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *s = nt_server_start(&so);
	uint16_t port = emb_server_port(s);
	struct newer_opts big = {.o = EMB_CLIENT_OPTS_DEFAULT};
	struct emb_table_spec sp = nt_spec("sized", 4, 1);
	struct emb_client_table *t = NULL;
	struct emb_client *c = NULL;
	char addr[64];
	union {
		struct emb_client_table_stats st;
		unsigned char b[sizeof(struct emb_client_table_stats) + 16];
	} u;
	struct emb_client_stats cs;
	uint64_t id = 3;
	float row[4];

	nt_addr_list(addr, sizeof(addr), &port, 1);
	big.o.servers = addr;
	big.o.struct_size = sizeof(big);
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&big.o, &c), 0);

	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(c, &sp, &t), 0);
	CU_ASSERT_EQUAL(emb_client_table_spec(t)->struct_size,
			sizeof(struct emb_table_spec));
	CU_ASSERT_EQUAL(emb_client_table_pull(t, &id, 1, row, 0, NULL), 0);

	/* A longer stats struct: ours filled, the rest zeroed, size kept. */
	memset(&u, 0xee, sizeof(u));
	u.st.struct_size = sizeof(u);
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &u.st), 0);
	CU_ASSERT_EQUAL(u.st.struct_size, sizeof(u));
	CU_ASSERT_EQUAL(u.st.servers, 1);
	CU_ASSERT_EQUAL(u.st.rows, 1);
	for (size_t i = sizeof(u.st); i < sizeof(u); i++)
		CU_ASSERT_EQUAL(u.b[i], 0);
	/* One shorter than any published version is refused, untouched. */
	memset(&u, 0xee, sizeof(u));
	u.st.struct_size = 16;
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &u.st), -EINVAL);
	CU_ASSERT_EQUAL(u.b[4], 0xee);
	/* Size 0 is refused. */
	u.st.struct_size = 0;
	CU_ASSERT_EQUAL(emb_client_table_stats(t, &u.st), -EINVAL);
	memset(&cs, 0, sizeof(cs));
	CU_ASSERT_EQUAL(emb_client_stats(c, &cs), -EINVAL);
	cs.struct_size = sizeof(cs);
	CU_ASSERT_EQUAL(emb_client_stats(c, &cs), 0);
	CU_ASSERT(cs.requests > 0);

	emb_client_table_close(t);
	emb_client_destroy(c);
	emb_server_destroy(s);
}

/* Each thread reads its own last error. */
struct other {
	int rc;	      /* what the thread's failing call returned */
	int seen;     /* its emb_last_error() after */
	int seen_out; /* its emb_last_error() before failing */
};

static void *fail_in_thread(void *arg)
{
	struct other *o = arg;
	struct emb_client_opts opts = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c;

	o->seen_out = emb_last_error(NULL, 0);
	opts.struct_size = 0;
	o->rc = emb_client_create(&opts, &c);
	o->seen = emb_last_error(NULL, 0);
	return NULL;
}

static void test_last_error_per_thread(void)
{
	struct emb_table_spec sp = nt_spec("x", 4, 1);
	struct emb_client_table *t;
	struct other o = {0};
	pthread_t th;
	char msg[64];

	/* This thread: EMB_EBADARG, from a NULL client. */
	CU_ASSERT_EQUAL(emb_client_table_create(NULL, &sp, &t), EMB_EBADARG);
	CU_ASSERT_EQUAL(emb_last_error(msg, sizeof(msg)), EMB_EBADARG);
	CU_ASSERT_STRING_EQUAL(msg, emb_strerror(EMB_EBADARG));
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, fail_in_thread, &o),
			      0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(o.seen_out, 0);
	CU_ASSERT_EQUAL(o.rc, -EINVAL);
	CU_ASSERT_EQUAL(o.seen, -EINVAL);
	/* The other thread's failure left this one's alone, and so does a
	 * call that succeeds. */
	CU_ASSERT_EQUAL(emb_last_error(NULL, 0), EMB_EBADARG);
	CU_ASSERT_STRING_EQUAL(emb_version(), EMBSTORE_VERSION_STRING);
	CU_ASSERT_EQUAL(emb_last_error(NULL, 0), EMB_EBADARG);
	/* A cut buffer is still terminated. */
	CU_ASSERT_EQUAL(emb_last_error(msg, 4), EMB_EBADARG);
	CU_ASSERT_EQUAL(strlen(msg), 3);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"version macros match the library", test_version},
	    {"error names and the list of codes", test_err_names},
	    {"struct sizes by name", test_struct_sizes},
	    {"init functions set defaults and struct_size",
	     test_init_functions},
	    {"options with size 0 or a set unknown tail are refused",
	     test_opts_in},
	    {"longer and shorter structs against a server",
	     test_sized_against_server},
	    {"the last error is per thread", test_last_error_per_thread},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "worker/abi", cases);
}
