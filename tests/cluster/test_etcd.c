/*
 * tests/cluster/test_etcd.c - the etcd client (src/cluster/etcd.c) against
 * a local etcd this test starts: keys, prefixes, transactions, leases,
 * endpoint lists with a dead member, and its errors. Skips (77) without
 * an etcd binary. Single-threaded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/etcd.h"
#include "common/err.h"
#include "etcd_proc.h"
#include "harness.h"

static struct etcd_proc etcd;

static struct emb_etcd *client(const char *endpoints)
{
	struct emb_etcd_opts o = {.endpoints = endpoints, .timeout_ms = 1000};
	struct emb_etcd *e = NULL;

	CU_ASSERT_EQUAL_FATAL(emb_etcd_create(&o, &e), 0);
	return e;
}

static void test_put_get(void)
{
	struct emb_etcd *e = client(etcd.url);
	const uint8_t bin[] = {0, 1, 2, 0xff, 0, 'x'};
	struct emb_etcd_range r;
	int64_t n = 0;

	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/pg/a", "one", 3, 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/pg/b", bin, sizeof(bin), 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/pg/c", "", 0, 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/pgx", "out", 3, 0), 0);

	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/pg/a", false, false, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, 1);
	CU_ASSERT_STRING_EQUAL(r.kvs[0].key, "/t/pg/a");
	CU_ASSERT_EQUAL(r.kvs[0].value_len, 3);
	CU_ASSERT_EQUAL(memcmp(r.kvs[0].value, "one", 3), 0);
	CU_ASSERT_EQUAL(r.kvs[0].version, 1);
	CU_ASSERT(r.kvs[0].create_revision > 0);
	CU_ASSERT(r.revision >= r.kvs[0].mod_revision);
	emb_etcd_range_free(&r);

	/* A prefix: in key order, binary values intact, "/t/pgx" outside. */
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/pg/", true, false, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, 3);
	CU_ASSERT_STRING_EQUAL(r.kvs[1].key, "/t/pg/b");
	CU_ASSERT_EQUAL(r.kvs[1].value_len, sizeof(bin));
	CU_ASSERT_EQUAL(memcmp(r.kvs[1].value, bin, sizeof(bin)), 0);
	CU_ASSERT_EQUAL(r.kvs[2].value_len, 0);
	emb_etcd_range_free(&r);

	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/pg/", true, true, &r), 0);
	CU_ASSERT_EQUAL(r.n, 3);
	CU_ASSERT_PTR_NULL(r.n ? r.kvs[0].value : NULL);
	emb_etcd_range_free(&r);

	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/none", false, false, &r), 0);
	CU_ASSERT_EQUAL(r.n, 0);
	emb_etcd_range_free(&r);

	CU_ASSERT_EQUAL(emb_etcd_delete(e, "/t/pg/", true, &n), 0);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/pg", true, false, &r), 0);
	CU_ASSERT_EQUAL(r.n, 1); /* /t/pgx */
	emb_etcd_range_free(&r);
	emb_etcd_destroy(e);
}

static void test_txn(void)
{
	struct emb_etcd *e = client(etcd.url);
	struct emb_etcd_cmp absent = {.key = "/t/txn/k",
				      .target = EMB_ETCD_CREATE};
	struct emb_etcd_op put1 = {.key = "/t/txn/k", .value = "1",
				   .value_len = 1};
	struct emb_etcd_op put2 = {.key = "/t/txn/k", .value = "2",
				   .value_len = 1};
	struct emb_etcd_op ops[2] = {
	    {.key = "/t/txn/k", .value = "3", .value_len = 1},
	    {.key = "/t/txn/other", .del = true},
	};
	struct emb_etcd_cmp is1 = {.key = "/t/txn/k",
				   .target = EMB_ETCD_VALUE,
				   .value = "1",
				   .value_len = 1};
	struct emb_etcd_cmp mod;
	struct emb_etcd_range r;
	bool ok = false;

	/* Create-if-absent wins once. */
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &absent, 1, &put1, 1, &ok), 0);
	CU_ASSERT(ok);
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &absent, 1, &put2, 1, &ok), 0);
	CU_ASSERT(!ok);

	/* Compare on the value. */
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &is1, 1, &put2, 1, &ok), 0);
	CU_ASSERT(ok);
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &is1, 1, &put1, 1, &ok), 0);
	CU_ASSERT(!ok);

	/* Compare-and-swap on mod_revision: the second writer of the same
	 * revision loses, and nothing of a failed txn is applied. */
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/txn/other", "x", 1, 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/txn/k", false, false, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, 1);
	mod = (struct emb_etcd_cmp){.key = "/t/txn/k",
				    .target = EMB_ETCD_MOD,
				    .revision = r.kvs[0].mod_revision};
	emb_etcd_range_free(&r);
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &mod, 1, ops, 2, &ok), 0);
	CU_ASSERT(ok);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/txn/other", "y", 1, 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_txn(e, &mod, 1, ops, 2, &ok), 0);
	CU_ASSERT(!ok);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/txn/", true, false, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, 2);
	CU_ASSERT_EQUAL(memcmp(r.kvs[0].value, "3", 1), 0);
	CU_ASSERT_STRING_EQUAL(r.kvs[1].key, "/t/txn/other");
	emb_etcd_range_free(&r);
	emb_etcd_destroy(e);
}

static void test_leases(void)
{
	struct emb_etcd *e = client(etcd.url);
	struct emb_etcd_range r;
	int64_t id = 0, ttl = 0;

	CU_ASSERT_EQUAL_FATAL(emb_etcd_lease_grant(e, 30, &id), 0);
	CU_ASSERT(id != 0);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/lease/k", "v", 1, id), 0);
	CU_ASSERT_EQUAL(emb_etcd_lease_keepalive(e, id, &ttl), 0);
	CU_ASSERT(ttl > 0 && ttl <= 30);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/lease/k", false, false, &r), 0);
	CU_ASSERT_EQUAL_FATAL(r.n, 1);
	CU_ASSERT_EQUAL(r.kvs[0].lease, id);
	emb_etcd_range_free(&r);

	/* Revoking removes the lease's keys; the lease is gone for good. */
	CU_ASSERT_EQUAL(emb_etcd_lease_revoke(e, id), 0);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/lease/k", false, false, &r), 0);
	CU_ASSERT_EQUAL(r.n, 0);
	emb_etcd_range_free(&r);
	CU_ASSERT_EQUAL(emb_etcd_lease_keepalive(e, id, &ttl), EMB_ENOLEASE);
	CU_ASSERT_EQUAL(emb_etcd_lease_revoke(e, id), 0);
	/* A put on a lease that does not exist is refused. */
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/lease/k", "v", 1, id),
			EMB_ENOLEASE);
	CU_ASSERT_EQUAL(emb_etcd_lease_grant(e, 0, &id), -EINVAL);
	emb_etcd_destroy(e);
}

/* The first endpoint is dead: requests go on at the next. */
static void test_dead_endpoint(void)
{
	char list[160];
	struct emb_etcd *e;
	struct emb_etcd_range r;

	snprintf(list, sizeof(list), "etcd://127.0.0.1:%u,127.0.0.1:%u",
		 etcd_proc_free_port(), etcd.port);
	e = client(list);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/dead/k", "v", 1, 0), 0);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/dead/k", false, false, &r), 0);
	CU_ASSERT_EQUAL(r.n, 1);
	emb_etcd_range_free(&r);
	snprintf(list, sizeof(list), "127.0.0.1:%u", etcd.port);
	CU_ASSERT_STRING_EQUAL(emb_etcd_endpoint(e), list);
	emb_etcd_destroy(e);

	/* Nobody answers: EMB_ENOETCD, not a hang. */
	snprintf(list, sizeof(list), "etcd://127.0.0.1:%u,127.0.0.1:%u",
		 etcd_proc_free_port(), etcd_proc_free_port());
	e = client(list);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/dead/k", "v", 1, 0), EMB_ENOETCD);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "/t/dead/k", false, false, &r),
			EMB_ENOETCD);
	emb_etcd_destroy(e);
}

static void test_bad_input(void)
{
	struct emb_etcd_opts o = {.endpoints = "etcd://"};
	struct emb_etcd *e = NULL;
	struct emb_etcd_range r;
	char key[EMB_ETCD_KEY_MAX + 2];

	CU_ASSERT_EQUAL(emb_etcd_create(&o, &e), -EINVAL);
	o.endpoints = "etcd://127.0.0.1";
	CU_ASSERT_EQUAL(emb_etcd_create(&o, &e), -EINVAL); /* no port */
	o.endpoints = "etcd://127.0.0.1:99999";
	CU_ASSERT_EQUAL(emb_etcd_create(&o, &e), -EINVAL);
	o.endpoints = NULL;
	CU_ASSERT_EQUAL(emb_etcd_create(&o, &e), -EINVAL);
	CU_ASSERT_PTR_NULL(e);
	emb_etcd_destroy(NULL);

	e = client(etcd.url);
	memset(key, 'k', sizeof(key) - 1);
	key[sizeof(key) - 1] = '\0';
	CU_ASSERT_EQUAL(emb_etcd_put(e, key, "v", 1, 0), -EINVAL);
	CU_ASSERT_EQUAL(emb_etcd_get(e, "", false, false, &r), -EINVAL);
	CU_ASSERT_EQUAL(emb_etcd_put(e, "/t/big", "v",
				     (size_t)EMB_ETCD_VALUE_MAX + 1, 0),
			-EINVAL);
	emb_etcd_destroy(e);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"puts, gets and deletes keys and prefixes", test_put_get},
	    {"transactions compare and swap", test_txn},
	    {"leases keep keys until revoked", test_leases},
	    {"goes on past a dead endpoint", test_dead_endpoint},
	    {"refuses bad endpoints, keys and values", test_bad_input},
	    {NULL, NULL},
	};
	int rc;

	if (!etcd_proc_available()) {
		fprintf(stderr, "no etcd binary: skipped\n");
		return 77;
	}
	if (etcd_proc_start(&etcd))
		return 1;
	rc = emb_test_main(argc, argv, "cluster/etcd", cases);
	etcd_proc_stop(&etcd);
	return rc;
}
