/*
 * src/cluster/etcd.h - a small etcd v3 client over etcd's JSON gateway
 * (HTTP/1.1 POST to /v3/kv/range, /v3/kv/put, /v3/kv/deleterange,
 * /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke;
 * keys and values travel base64-encoded). Enough for a coordinator:
 * leases, put, get by key or prefix, delete, and transactions whose
 * compares all say "equal". Docs: docs/coordinator.md.
 *
 * A client knows several endpoints ("h1:p1,h2:p2") and sticks to the one
 * that answered last; a request that cannot reach it (refused, timed out,
 * a 503 from a member without a leader) goes to the next, and fails with
 * EMB_ENOETCD once every endpoint failed in one round. A request retried
 * on another member may have been applied by the first: every request the
 * coordinator sends is either idempotent or a compare-and-swap whose
 * second attempt fails harmlessly.
 *
 * One handle serves any thread: requests are serialized by a mutex, each
 * bounded by the timeout.
 */
#ifndef EMB_CLUSTER_ETCD_H
#define EMB_CLUSTER_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMB_ETCD_ENDPOINTS_MAX 16    /* endpoints one client tries */
#define EMB_ETCD_KEY_MAX       512   /* key bytes */
#define EMB_ETCD_VALUE_MAX     (4u << 20) /* value bytes */
#define EMB_ETCD_RESP_MAX      (64u << 20) /* HTTP body bytes accepted */

struct emb_etcd;

struct emb_etcd_opts {
	const char *endpoints; /* "host:port[,host:port...]", an optional
				  "etcd://" in front; copied */
	uint32_t timeout_ms;   /* per request and endpoint; 0 = 2000 */
};

/* One key as a range returns it; strings are NUL-terminated copies. */
struct emb_etcd_kv {
	char *key;		  /* the key */
	uint8_t *value;		  /* value_len bytes (+ NUL); NULL keys_only */
	size_t value_len;	  /* bytes */
	int64_t create_revision;  /* revision that created it */
	int64_t mod_revision;	  /* revision of its last change */
	int64_t version;	  /* changes since creation, from 1 */
	int64_t lease;		  /* lease it is attached to, 0 none */
};

struct emb_etcd_range {
	struct emb_etcd_kv *kvs; /* n entries in key order */
	uint32_t n;		 /* entries */
	int64_t revision;	 /* store revision the answer reflects */
};

/* What a transaction compares (always for equality). */
enum emb_etcd_target {
	EMB_ETCD_CREATE, /* create_revision; 0 = the key does not exist */
	EMB_ETCD_MOD,	 /* mod_revision */
	EMB_ETCD_VALUE,	 /* the value's bytes */
};

struct emb_etcd_cmp {
	const char *key;	     /* borrowed */
	enum emb_etcd_target target; /* what to compare */
	int64_t revision;	     /* CREATE, MOD */
	const void *value;	     /* VALUE: bytes, borrowed */
	size_t value_len;	     /* VALUE: bytes */
};

/* A transaction's operation when its compares hold. */
struct emb_etcd_op {
	bool del;	   /* delete the key (or prefix); else put */
	bool prefix;	   /* del: every key that starts with key */
	const char *key;   /* borrowed */
	const void *value; /* put: bytes, borrowed */
	size_t value_len;  /* put: bytes */
	int64_t lease;	   /* put: lease to attach, 0 none */
};

/*
 * 0 and *out, or -EINVAL (no endpoint, one that does not parse, more than
 * EMB_ETCD_ENDPOINTS_MAX), -ENOMEM, EMB_EETCD (libcurl failed to start).
 * Connects to nothing yet.
 */
int emb_etcd_create(const struct emb_etcd_opts *opts, struct emb_etcd **out);
void emb_etcd_destroy(struct emb_etcd *e); /* NULL is a no-op */

/*
 * Every request below returns 0, or EMB_ENOETCD (no endpoint answered
 * within the timeout), EMB_EETCD (etcd refused the request: the reason
 * is logged), -ENOMEM, -EINVAL (a key over EMB_ETCD_KEY_MAX bytes, a
 * value over EMB_ETCD_VALUE_MAX).
 */

/* A lease of ttl_s seconds (>= 1; etcd may raise it to its minimum). */
int emb_etcd_lease_grant(struct emb_etcd *e, int64_t ttl_s, int64_t *id);
/*
 * Renews lease id; *ttl_s (may be NULL) gets its new time to live.
 * EMB_ENOLEASE: the lease expired or was revoked (its keys are gone).
 */
int emb_etcd_lease_keepalive(struct emb_etcd *e, int64_t id, int64_t *ttl_s);
/* Revokes lease id, deleting its keys; a lease already gone is no error. */
int emb_etcd_lease_revoke(struct emb_etcd *e, int64_t id);

/* Puts value (len bytes) at key, attached to lease (0 = none). */
int emb_etcd_put(struct emb_etcd *e, const char *key, const void *value,
		 size_t len, int64_t lease);

/*
 * The key (prefix false) or every key that starts with it, in key order,
 * into *out (free with emb_etcd_range_free()). keys_only leaves the
 * values out. At most EMB_ETCD_RESP_MAX bytes of answer.
 */
int emb_etcd_get(struct emb_etcd *e, const char *key, bool prefix,
		 bool keys_only, struct emb_etcd_range *out);
void emb_etcd_range_free(struct emb_etcd_range *r); /* NULL-safe */

/* Deletes key, or every key under it with prefix; *ndeleted may be NULL. */
int emb_etcd_delete(struct emb_etcd *e, const char *key, bool prefix,
		    int64_t *ndeleted);

/*
 * If every compare holds, applies ops[0..nops) atomically and sets
 * *succeeded; else applies nothing and clears it. 0 either way.
 */
int emb_etcd_txn(struct emb_etcd *e, const struct emb_etcd_cmp *cmps,
		 uint32_t ncmps, const struct emb_etcd_op *ops, uint32_t nops,
		 bool *succeeded);

/* The endpoint the last request went to, "host:port"; for logs. */
const char *emb_etcd_endpoint(const struct emb_etcd *e);

/* How many endpoints the client tries, 1..EMB_ETCD_ENDPOINTS_MAX. */
uint32_t emb_etcd_nendpoints(const struct emb_etcd *e);

/*
 * Sets the wait per request and endpoint (0 = 2000 ms) for the requests
 * that start from now on; one in flight keeps the one it started with.
 */
void emb_etcd_set_timeout(struct emb_etcd *e, uint32_t timeout_ms);

/*
 * Address of this host as the last connection to etcd saw it (the
 * local end), "" before any: the one other machines reach it at in the
 * usual single-interface layout.
 */
void emb_etcd_local_ip(struct emb_etcd *e, char *buf, size_t cap);

#endif
