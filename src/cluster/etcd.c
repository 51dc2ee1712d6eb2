/*
 * src/cluster/etcd.c - etcd v3 over its JSON gateway, with libcurl for
 * HTTP and cJSON for the bodies (docs/coordinator.md says why these).
 * Any thread: one mutex serializes the handle's requests, and each waits
 * at most the timeout per endpoint tried.
 *
 * etcd 3.4 serves the gateway under /v3/ (and the older /v3beta/); int64
 * fields travel as JSON strings, and fields at their zero value are left
 * out of answers (a failed txn has no "succeeded", an empty range no
 * "kvs").
 */
#include "cluster/etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/addr.h"
#include "common/err.h"
#include "common/log.h"

#define TIMEOUT_DEFAULT_MS 2000
#define GRPC_NOT_FOUND	   5  /* gRPC status: the lease is gone */
#define GRPC_UNAVAILABLE   14 /* gRPC status: no leader, member stopping */

struct body {
	char *buf;  /* NUL-terminated once complete */
	size_t len; /* bytes */
	size_t cap; /* bytes allocated */
	bool over;  /* the answer passed EMB_ETCD_RESP_MAX */
};

struct emb_etcd {
	pthread_mutex_t mu;  /* serializes requests */
	CURL *curl;	     /* one handle: keeps the connection */
	char (*ep)[EMB_HOST_MAX + 16]; /* "host:port", URL form for IPv6 */
	uint32_t nep;	     /* endpoints */
	uint32_t cur;	     /* the one that answered last */
	uint32_t timeout_ms; /* per request and endpoint */
	char local_ip[64];   /* our end of the last connection */
};

/* curl_global_init is not thread-safe: once, before any handle. */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- base64 --------------------------------------------------------- */

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *data, size_t len)
{
	const uint8_t *p = data;
	char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;

	if (!out)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;

		if (i + 1 < len)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < len)
			v |= p[i + 2];
		*o++ = b64[v >> 18 & 63];
		*o++ = b64[v >> 12 & 63];
		*o++ = i + 1 < len ? b64[v >> 6 & 63] : '=';
		*o++ = i + 2 < len ? b64[v & 63] : '=';
	}
	*o = '\0';
	return out;
}

static int b64_val(char c)
{
	const char *p = c ? strchr(b64, c) : NULL;

	return p ? (int)(p - b64) : -1;
}

/* Decodes s into a new NUL-terminated buffer; -EINVAL if not base64. */
static int b64_decode(const char *s, uint8_t **out, size_t *len)
{
	size_t n = strlen(s), o = 0;
	uint8_t *buf;

	if (n % 4)
		return -EINVAL;
	buf = malloc(n / 4 * 3 + 1);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];

		for (int k = 0; k < 4; k++) {
			v[k] = s[i + k] == '=' && i + 4 == n && k >= 2
				   ? 0
				   : b64_val(s[i + k]);
			if (v[k] < 0 || (k == 3 && s[i + 2] == '=' &&
					 s[i + 3] != '=')) {
				free(buf);
				return -EINVAL;
			}
		}
		buf[o++] = (uint8_t)(v[0] << 2 | v[1] >> 4);
		if (s[i + 2] != '=')
			buf[o++] = (uint8_t)(v[1] << 4 | v[2] >> 2);
		if (s[i + 3] != '=')
			buf[o++] = (uint8_t)(v[2] << 6 | v[3]);
	}
	buf[o] = '\0';
	*out = buf;
	*len = o;
	return 0;
}

/* ---- create / destroy ---------------------------------------------- */

int emb_etcd_create(const struct emb_etcd_opts *opts, struct emb_etcd **out)
{
	struct emb_addr *a;
	const char *list;
	struct emb_etcd *e;
	int n, rc;

	if (!opts || !opts->endpoints || !out)
		return -EINVAL;
	list = opts->endpoints;
	if (!strncmp(list, "etcd://", 7))
		list += 7;
	a = calloc(EMB_ETCD_ENDPOINTS_MAX, sizeof(*a));
	if (!a)
		return -ENOMEM;
	n = emb_addr_list_parse(list, a, EMB_ETCD_ENDPOINTS_MAX);
	if (n <= 0) {
		free(a);
		return n == -ENOMEM ? -ENOMEM : -EINVAL;
	}
	for (int i = 0; i < n; i++) {
		if (!a[i].port) {
			free(a);
			return -EINVAL;
		}
	}
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK) {
		free(a);
		return EMB_EETCD;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		free(a);
		return -ENOMEM;
	}
	e->ep = calloc((size_t)n, sizeof(*e->ep));
	e->curl = curl_easy_init();
	if (!e->ep || !e->curl) {
		rc = e->ep ? EMB_EETCD : -ENOMEM;
		goto err;
	}
	for (int i = 0; i < n; i++)
		snprintf(e->ep[i], sizeof(e->ep[i]),
			 strchr(a[i].host, ':') ? "[%s]:%u" : "%s:%u",
			 a[i].host, a[i].port);
	e->nep = (uint32_t)n;
	e->timeout_ms = opts->timeout_ms ? opts->timeout_ms
					 : TIMEOUT_DEFAULT_MS;
	pthread_mutex_init(&e->mu, NULL);
	free(a);
	*out = e;
	return 0;

err:
	curl_easy_cleanup(e->curl);
	free(e->ep);
	free(e);
	free(a);
	return rc;
}

void emb_etcd_destroy(struct emb_etcd *e)
{
	if (!e)
		return;
	curl_easy_cleanup(e->curl);
	pthread_mutex_destroy(&e->mu);
	free(e->ep);
	free(e);
}

const char *emb_etcd_endpoint(const struct emb_etcd *e)
{
	return e->ep[e->cur];
}

uint32_t emb_etcd_nendpoints(const struct emb_etcd *e)
{
	return e->nep;
}

void emb_etcd_set_timeout(struct emb_etcd *e, uint32_t timeout_ms)
{
	pthread_mutex_lock(&e->mu);
	e->timeout_ms = timeout_ms ? timeout_ms : TIMEOUT_DEFAULT_MS;
	pthread_mutex_unlock(&e->mu);
}

void emb_etcd_local_ip(struct emb_etcd *e, char *buf, size_t cap)
{
	pthread_mutex_lock(&e->mu);
	snprintf(buf, cap, "%s", e->local_ip);
	pthread_mutex_unlock(&e->mu);
}

/* ---- one request ---------------------------------------------------- */

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
	struct body *b = arg;
	size_t n = size * nmemb;

	if (b->len + n > EMB_ETCD_RESP_MAX) {
		b->over = true;
		return 0; /* curl stops with CURLE_WRITE_ERROR */
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *nb;

		while (cap < b->len + n + 1)
			cap *= 2;
		nb = realloc(b->buf, cap);
		if (!nb)
			return 0;
		b->buf = nb;
		b->cap = cap;
	}
	memcpy(b->buf + b->len, p, n);
	b->len += n;
	b->buf[b->len] = '\0';
	return n;
}

/* The error an answer with HTTP status >= 400 stands for; logs it. */
static int http_error(struct emb_etcd *e, const char *path, long status,
		      const char *text)
{
	cJSON *j = text ? cJSON_Parse(text) : NULL;
	cJSON *code = cJSON_GetObjectItemCaseSensitive(j, "code");
	cJSON *msg = cJSON_GetObjectItemCaseSensitive(j, "error");
	int grpc = cJSON_IsNumber(code) ? code->valueint : -1;
	int rc = EMB_EETCD;

	if (grpc == GRPC_NOT_FOUND && cJSON_IsString(msg) &&
	    strstr(msg->valuestring, "lease not found"))
		rc = EMB_ENOLEASE;
	else
		emb_log(EMB_LOG_WARN, "etcd %s %s: HTTP %ld: %s", e->ep[e->cur],
			path, status,
			cJSON_IsString(msg) ? msg->valuestring : "no reason");
	cJSON_Delete(j);
	return rc;
}

/* True if the answer came from an endpoint that cannot serve now. */
static bool unavailable(long status, const char *text)
{
	cJSON *j, *code;
	bool r;

	if (status == 503)
		return true;
	if (status < 500 || !text)
		return false;
	j = cJSON_Parse(text);
	code = cJSON_GetObjectItemCaseSensitive(j, "code");
	r = cJSON_IsNumber(code) && code->valueint == GRPC_UNAVAILABLE;
	cJSON_Delete(j);
	return r;
}

/*
 * POSTs req (a JSON document; consumed) to path at the current endpoint,
 * then at the others in turn, and parses the answer into *resp. Called
 * with e->mu held.
 */
static int post_locked(struct emb_etcd *e, const char *path, cJSON *req,
		       cJSON **resp)
{
	char *text = cJSON_PrintUnformatted(req);
	struct curl_slist *hdrs = NULL;
	int rc = EMB_ENOETCD;

	cJSON_Delete(req);
	if (!text)
		return -ENOMEM;
	hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	if (!hdrs) {
		free(text);
		return -ENOMEM;
	}
	for (uint32_t tried = 0; tried < e->nep; tried++) {
		struct body b = {0};
		char url[EMB_HOST_MAX + 64];
		char *ip = NULL;
		long status = 0;
		CURLcode cc;

		snprintf(url, sizeof(url), "http://%s%s", e->ep[e->cur], path);
		curl_easy_reset(e->curl);
		curl_easy_setopt(e->curl, CURLOPT_URL, url);
		curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
		curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, hdrs);
		curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS,
				 (long)e->timeout_ms);
		curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS,
				 (long)e->timeout_ms);
		/* No signals from libcurl: this runs in someone's job. */
		curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, &b);
		cc = curl_easy_perform(e->curl);
		if (cc == CURLE_OK) {
			curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE,
					  &status);
			if (curl_easy_getinfo(e->curl, CURLINFO_LOCAL_IP,
					      &ip) == CURLE_OK &&
			    ip)
				snprintf(e->local_ip, sizeof(e->local_ip), "%s",
					 ip);
		}
		if (b.over) {
			emb_log(EMB_LOG_WARN,
				"etcd %s %s: answer over %u bytes refused",
				e->ep[e->cur], path, EMB_ETCD_RESP_MAX);
			free(b.buf);
			rc = EMB_EETCD;
			break;
		}
		if (cc != CURLE_OK || unavailable(status, b.buf)) {
			emb_log(EMB_LOG_DEBUG, "etcd %s %s: %s", e->ep[e->cur],
				path,
				cc != CURLE_OK ? curl_easy_strerror(cc)
					       : "unavailable");
			free(b.buf);
			if (cc == CURLE_OUT_OF_MEMORY) {
				rc = -ENOMEM;
				break;
			}
			e->cur = (e->cur + 1) % e->nep;
			continue;
		}
		if (status >= 400) {
			rc = http_error(e, path, status, b.buf);
			free(b.buf);
			break;
		}
		*resp = b.buf ? cJSON_Parse(b.buf) : NULL;
		free(b.buf);
		rc = *resp ? 0 : EMB_EETCD;
		if (rc)
			emb_log(EMB_LOG_WARN, "etcd %s %s: answer is not JSON",
				e->ep[e->cur], path);
		break;
	}
	curl_slist_free_all(hdrs);
	free(text);
	return rc;
}

static int post(struct emb_etcd *e, const char *path, cJSON *req, cJSON **resp)
{
	int rc;

	if (!req)
		return -ENOMEM;
	pthread_mutex_lock(&e->mu);
	rc = post_locked(e, path, req, resp);
	pthread_mutex_unlock(&e->mu);
	return rc;
}

/* ---- JSON helpers --------------------------------------------------- */

/* Adds name: base64(data); false on ENOMEM. */
static bool add_b64(cJSON *o, const char *name, const void *data, size_t len)
{
	char *s = b64_encode(data, len);
	bool ok = s && cJSON_AddStringToObject(o, name, s);

	free(s);
	return ok;
}

/* Adds name: "v" (etcd's int64s are strings); false on ENOMEM. */
static bool add_i64(cJSON *o, const char *name, int64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRId64, v);
	return cJSON_AddStringToObject(o, name, s) != NULL;
}

/* An int64 field: a string or a number; absent = 0. */
static int64_t get_i64(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	if (cJSON_IsString(v))
		return strtoll(v->valuestring, NULL, 10);
	if (cJSON_IsNumber(v))
		return (int64_t)v->valuedouble;
	return 0;
}

/* The range end that makes key a prefix: key with its last byte + 1. */
static int prefix_end(const char *key, char *end, size_t cap)
{
	size_t n = strlen(key);

	if (n == 0 || n + 1 > cap)
		return -EINVAL;
	memcpy(end, key, n + 1);
	while (n && (uint8_t)end[n - 1] == 0xff)
		end[--n] = '\0';
	if (!n) {
		end[0] = '\0'; /* "\0": every key */
		return 1;
	}
	end[n - 1] = (char)((uint8_t)end[n - 1] + 1);
	return (int)n;
}

/* key, and range_end when prefix, into o. */
static int add_key(cJSON *o, const char *key, bool prefix)
{
	char end[EMB_ETCD_KEY_MAX + 1];
	int n;

	if (!key || !*key || strlen(key) > EMB_ETCD_KEY_MAX)
		return -EINVAL;
	if (!add_b64(o, "key", key, strlen(key)))
		return -ENOMEM;
	if (!prefix)
		return 0;
	n = prefix_end(key, end, sizeof(end));
	if (n < 0)
		return n;
	return add_b64(o, "range_end", end, (size_t)n) ? 0 : -ENOMEM;
}

/* ---- leases --------------------------------------------------------- */

int emb_etcd_lease_grant(struct emb_etcd *e, int64_t ttl_s, int64_t *id)
{
	cJSON *req, *resp = NULL;
	int rc;

	if (ttl_s < 1 || !id)
		return -EINVAL;
	req = cJSON_CreateObject();
	if (req && !add_i64(req, "TTL", ttl_s)) {
		cJSON_Delete(req);
		return -ENOMEM;
	}
	rc = post(e, "/v3/lease/grant", req, &resp);
	if (rc)
		return rc;
	*id = get_i64(resp, "ID");
	if (*id == 0 || get_i64(resp, "TTL") <= 0) {
		emb_log(EMB_LOG_WARN, "etcd %s: lease grant answered no lease",
			e->ep[e->cur]);
		rc = EMB_EETCD;
	}
	cJSON_Delete(resp);
	return rc;
}

int emb_etcd_lease_keepalive(struct emb_etcd *e, int64_t id, int64_t *ttl_s)
{
	cJSON *req, *resp = NULL, *res;
	int64_t ttl;
	int rc;

	req = cJSON_CreateObject();
	if (req && !add_i64(req, "ID", id)) {
		cJSON_Delete(req);
		return -ENOMEM;
	}
	/* A stream in gRPC; the gateway answers one request with one
	 * {"result": ...} and ends. */
	rc = post(e, "/v3/lease/keepalive", req, &resp);
	if (rc)
		return rc;
	res = cJSON_GetObjectItemCaseSensitive(resp, "result");
	if (!cJSON_IsObject(res)) {
		emb_log(EMB_LOG_WARN, "etcd %s: keepalive answered no result",
			e->ep[e->cur]);
		cJSON_Delete(resp);
		return EMB_EETCD;
	}
	/* An expired lease answers with no TTL (0). */
	ttl = get_i64(res, "TTL");
	cJSON_Delete(resp);
	if (ttl <= 0)
		return EMB_ENOLEASE;
	if (ttl_s)
		*ttl_s = ttl;
	return 0;
}

int emb_etcd_lease_revoke(struct emb_etcd *e, int64_t id)
{
	cJSON *req, *resp = NULL;
	int rc;

	req = cJSON_CreateObject();
	if (req && !add_i64(req, "ID", id)) {
		cJSON_Delete(req);
		return -ENOMEM;
	}
	rc = post(e, "/v3/lease/revoke", req, &resp);
	cJSON_Delete(resp);
	return rc == EMB_ENOLEASE ? 0 : rc;
}

/* ---- keys ----------------------------------------------------------- */

static cJSON *put_obj(const char *key, const void *value, size_t len,
		      int64_t lease, int *rc)
{
	cJSON *o = cJSON_CreateObject();

	*rc = -ENOMEM;
	if (!o)
		return NULL;
	if (len > EMB_ETCD_VALUE_MAX) {
		*rc = -EINVAL;
		goto err;
	}
	*rc = add_key(o, key, false);
	if (*rc)
		goto err;
	*rc = -ENOMEM;
	if (!add_b64(o, "value", value ? value : "", len) ||
	    (lease && !add_i64(o, "lease", lease)))
		goto err;
	*rc = 0;
	return o;
err:
	cJSON_Delete(o);
	return NULL;
}

int emb_etcd_put(struct emb_etcd *e, const char *key, const void *value,
		 size_t len, int64_t lease)
{
	cJSON *req, *resp = NULL;
	int rc;

	req = put_obj(key, value, len, lease, &rc);
	if (!req)
		return rc;
	rc = post(e, "/v3/kv/put", req, &resp);
	cJSON_Delete(resp);
	return rc;
}

void emb_etcd_range_free(struct emb_etcd_range *r)
{
	if (!r)
		return;
	for (uint32_t i = 0; i < r->n; i++) {
		free(r->kvs[i].key);
		free(r->kvs[i].value);
	}
	free(r->kvs);
	memset(r, 0, sizeof(*r));
}

/* One entry of "kvs" into *kv; -EINVAL if the key or value is no base64. */
static int take_kv(const cJSON *j, struct emb_etcd_kv *kv)
{
	const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "key");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "value");
	size_t klen;
	int rc;

	if (!cJSON_IsString(k))
		return -EINVAL;
	rc = b64_decode(k->valuestring, (uint8_t **)&kv->key, &klen);
	if (rc)
		return rc;
	if (strlen(kv->key) != klen)
		return -EINVAL; /* a NUL inside: not one of our keys */
	if (cJSON_IsString(v)) {
		rc = b64_decode(v->valuestring, &kv->value, &kv->value_len);
		if (rc)
			return rc;
	}
	kv->create_revision = get_i64(j, "create_revision");
	kv->mod_revision = get_i64(j, "mod_revision");
	kv->version = get_i64(j, "version");
	kv->lease = get_i64(j, "lease");
	return 0;
}

/* A range answer (the document or a txn's response_range) into *out. */
static int take_range(struct emb_etcd *e, const cJSON *resp,
		      struct emb_etcd_range *out)
{
	const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(resp, "kvs");
	const cJSON *hdr = cJSON_GetObjectItemCaseSensitive(resp, "header");
	int n = cJSON_IsArray(kvs) ? cJSON_GetArraySize(kvs) : 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->revision = get_i64(hdr, "revision");
	if (n == 0)
		return 0;
	out->kvs = calloc((size_t)n, sizeof(*out->kvs));
	if (!out->kvs)
		return -ENOMEM;
	for (const cJSON *j = kvs->child; j && !rc; j = j->next) {
		rc = take_kv(j, &out->kvs[out->n]);
		out->n++;
	}
	if (rc) {
		emb_etcd_range_free(out);
		if (rc == -EINVAL) {
			emb_log(EMB_LOG_WARN, "etcd %s: bad key or value",
				e->ep[e->cur]);
			rc = EMB_EETCD;
		}
	}
	return rc;
}

int emb_etcd_get(struct emb_etcd *e, const char *key, bool prefix,
		 bool keys_only, struct emb_etcd_range *out)
{
	cJSON *req = cJSON_CreateObject(), *resp = NULL;
	int rc;

	if (!req)
		return -ENOMEM;
	rc = add_key(req, key, prefix);
	if (!rc && keys_only && !cJSON_AddTrueToObject(req, "keys_only"))
		rc = -ENOMEM;
	if (rc) {
		cJSON_Delete(req);
		return rc;
	}
	rc = post(e, "/v3/kv/range", req, &resp);
	if (rc)
		return rc;
	rc = take_range(e, resp, out);
	cJSON_Delete(resp);
	return rc;
}

int emb_etcd_delete(struct emb_etcd *e, const char *key, bool prefix,
		    int64_t *ndeleted)
{
	cJSON *req = cJSON_CreateObject(), *resp = NULL;
	int rc;

	if (!req)
		return -ENOMEM;
	rc = add_key(req, key, prefix);
	if (rc) {
		cJSON_Delete(req);
		return rc;
	}
	rc = post(e, "/v3/kv/deleterange", req, &resp);
	if (!rc && ndeleted)
		*ndeleted = get_i64(resp, "deleted");
	cJSON_Delete(resp);
	return rc;
}

/* ---- transactions --------------------------------------------------- */

static int add_cmp(cJSON *arr, const struct emb_etcd_cmp *c)
{
	static const char *const target[] = {"CREATE", "MOD", "VALUE"};
	static const char *const field[] = {"create_revision", "mod_revision",
					    NULL};
	cJSON *o = cJSON_CreateObject();
	int rc;

	if (!o || !cJSON_AddItemToArray(arr, o)) {
		cJSON_Delete(o);
		return -ENOMEM;
	}
	if ((unsigned)c->target > EMB_ETCD_VALUE ||
	    (c->target == EMB_ETCD_VALUE && c->value_len > EMB_ETCD_VALUE_MAX))
		return -EINVAL;
	rc = add_key(o, c->key, false);
	if (rc)
		return rc;
	if (!cJSON_AddStringToObject(o, "target", target[c->target]) ||
	    !cJSON_AddStringToObject(o, "result", "EQUAL"))
		return -ENOMEM;
	if (c->target == EMB_ETCD_VALUE)
		return add_b64(o, "value", c->value ? c->value : "",
			       c->value_len)
			   ? 0
			   : -ENOMEM;
	return add_i64(o, field[c->target], c->revision) ? 0 : -ENOMEM;
}

static int add_op(cJSON *arr, const struct emb_etcd_op *op)
{
	cJSON *o = cJSON_CreateObject(), *inner;
	int rc;

	if (!o || !cJSON_AddItemToArray(arr, o)) {
		cJSON_Delete(o);
		return -ENOMEM;
	}
	if (op->del) {
		inner = cJSON_AddObjectToObject(o, "request_delete_range");
		if (!inner)
			return -ENOMEM;
		return add_key(inner, op->key, op->prefix);
	}
	inner = put_obj(op->key, op->value, op->value_len, op->lease, &rc);
	if (!inner)
		return rc;
	if (!cJSON_AddItemToObject(o, "request_put", inner)) {
		cJSON_Delete(inner);
		return -ENOMEM;
	}
	return 0;
}

int emb_etcd_txn(struct emb_etcd *e, const struct emb_etcd_cmp *cmps,
		 uint32_t ncmps, const struct emb_etcd_op *ops, uint32_t nops,
		 bool *succeeded)
{
	cJSON *req = cJSON_CreateObject(), *resp = NULL, *c, *s;
	const cJSON *ok;
	int rc = 0;

	if (!req)
		return -ENOMEM;
	c = cJSON_AddArrayToObject(req, "compare");
	s = cJSON_AddArrayToObject(req, "success");
	if (!c || !s)
		rc = -ENOMEM;
	for (uint32_t i = 0; !rc && i < ncmps; i++)
		rc = add_cmp(c, &cmps[i]);
	for (uint32_t i = 0; !rc && i < nops; i++)
		rc = add_op(s, &ops[i]);
	if (rc) {
		cJSON_Delete(req);
		return rc;
	}
	rc = post(e, "/v3/kv/txn", req, &resp);
	if (rc)
		return rc;
	ok = cJSON_GetObjectItemCaseSensitive(resp, "succeeded");
	*succeeded = cJSON_IsTrue(ok);
	cJSON_Delete(resp);
	return 0;
}
