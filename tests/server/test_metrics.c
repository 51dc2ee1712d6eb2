/*
 * tests/server/test_metrics.c - the Prometheus endpoint
 * (src/metrics/metrics.c), its /healthz, the server's collector
 * (src/server/metrics.c) and the scheduler's (src/cluster/scheduler.c), scraped
 * over a socket from in-process daemons. Every line of a scrape is parsed as
 * the text exposition format: HELP/TYPE before samples, names
 * `^(embstore|process)_[a-z0-9_]+$`, histogram buckets cumulative and
 * ending in +Inf equal to _count.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cluster/node.h"
#include "cluster/scheduler.h"
#include "common/err.h"
#include "common/log.h"
#include "harness.h"
#include "metrics/metrics.h"
#include "server/server.h"
#include "server/metrics.h"
#include "worker/embstore.h"

#define DIM 8

/* ---- a tiny HTTP GET client ---- */

/*
 * GETs path from 127.0.0.1:port with HTTP/1.0 (the server closes when
 * done). Returns the status code and the body in *body (malloc'd), or -1.
 */
static int http_get(uint16_t port, const char *method, const char *path,
		    char **body)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(port)};
	size_t len = 0, cap = 65536;
	char req[256], *buf, *p;
	int fd, code = -1;
	ssize_t n;

	*body = NULL;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	n = snprintf(req, sizeof(req),
		     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	buf = malloc(cap);
	while (buf) {
		if (len + 1 == cap) {
			char *nb = realloc(buf, cap * 2);

			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (!buf)
		return -1;
	buf[len] = '\0';
	if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
		code = -1;
	p = strstr(buf, "\r\n\r\n");
	*body = strdup(p ? p + 4 : "");
	free(buf);
	return code;
}

/* ---- a strict parser of the text format ---- */

#define MAX_FAMILIES 128
#define MAX_SERIES   256

struct family {
	char name[128];	  /* metric family name */
	char type[16];	  /* counter, gauge, histogram */
	bool help;	  /* HELP seen */
	uint32_t samples; /* sample lines */
};

/* One histogram series: family + labels other than le. */
struct hseries {
	char key[256];	/* family{labels without le} */
	double last_le; /* last bound seen; -1 before the first */
	double last_n;	/* cumulative count at last_le */
	bool inf;	/* +Inf bucket seen */
	double count;	/* _count, -1 until seen */
};

struct scrape {
	struct family fam[MAX_FAMILIES];
	uint32_t nfam;
	struct hseries hs[MAX_SERIES];
	uint32_t nhs;
	char err[256]; /* first problem found, "" if none */
};

static bool name_ok(const char *s, size_t n)
{
	size_t k;

	if (n > 9 && strncmp(s, "embstore_", 9) == 0)
		k = 9;
	else if (n > 8 && strncmp(s, "process_", 8) == 0)
		k = 8;
	else
		return false;
	for (size_t i = k; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

static struct family *fam_find(struct scrape *sc, const char *name, size_t n)
{
	for (uint32_t i = 0; i < sc->nfam; i++)
		if (strlen(sc->fam[i].name) == n &&
		    strncmp(sc->fam[i].name, name, n) == 0)
			return &sc->fam[i];
	return NULL;
}

static struct family *fam_add(struct scrape *sc, const char *name, size_t n)
{
	struct family *f = fam_find(sc, name, n);

	if (f || sc->nfam == MAX_FAMILIES || n >= sizeof(f->name))
		return f;
	f = &sc->fam[sc->nfam++];
	memcpy(f->name, name, n);
	f->name[n] = '\0';
	return f;
}

static struct hseries *hs_get(struct scrape *sc, const char *key)
{
	struct hseries *h;

	for (uint32_t i = 0; i < sc->nhs; i++)
		if (strcmp(sc->hs[i].key, key) == 0)
			return &sc->hs[i];
	if (sc->nhs == MAX_SERIES)
		return NULL;
	h = &sc->hs[sc->nhs++];
	snprintf(h->key, sizeof(h->key), "%s", key);
	h->last_le = -1;
	h->count = -1;
	return h;
}

#define FAIL(...)                                                              \
	do {                                                                   \
		if (!sc->err[0])                                               \
			snprintf(sc->err, sizeof(sc->err), __VA_ARGS__);       \
		return;                                                        \
	} while (0)

static bool has_suffix(const char *s, size_t n, const char *suf)
{
	size_t m = strlen(suf);

	return n > m && strncmp(s + n - m, suf, m) == 0;
}

/* A sample line: name, optional {k="v",...}, one space, a value. */
static void parse_sample(struct scrape *sc, const char *line)
{
	const char *p = line, *name = line;
	char other[200] = "", le[32] = "";
	size_t nlen, olen = 0;
	struct family *f;
	const char *suffix = NULL;
	char *end;
	double v;

	while (*p && *p != '{' && *p != ' ')
		p++;
	nlen = (size_t)(p - name);
	if (!name_ok(name, nlen))
		FAIL("bad metric name in '%s'", line);
	if (*p == '{') {
		p++;
		while (*p != '}') {
			const char *k = p, *vs;
			size_t klen;

			while ((*p >= 'a' && *p <= 'z') || *p == '_')
				p++;
			klen = (size_t)(p - k);
			if (!klen || p[0] != '=' || p[1] != '"')
				FAIL("bad label in '%s'", line);
			p += 2;
			vs = p;
			while (*p && *p != '"') {
				if (*p == '\\' && p[1])
					p++;
				p++;
			}
			if (*p != '"')
				FAIL("unterminated label value in '%s'", line);
			if (klen == 2 && strncmp(k, "le", 2) == 0) {
				snprintf(le, sizeof(le), "%.*s", (int)(p - vs),
					 vs);
			} else {
				olen += (size_t)snprintf(
				    other + olen, sizeof(other) - olen,
				    "%.*s=%.*s,", (int)klen, k, (int)(p - vs),
				    vs);
				if (olen >= sizeof(other))
					FAIL("labels too long in '%s'", line);
			}
			p++;
			if (*p == ',')
				p++;
			else if (*p != '}')
				FAIL("bad label list in '%s'", line);
		}
		p++;
	}
	if (*p != ' ' || !p[1])
		FAIL("no value in '%s'", line);
	errno = 0;
	v = strtod(p + 1, &end);
	if (errno || *end || end == p + 1)
		FAIL("bad value in '%s'", line);

	f = fam_find(sc, name, nlen);
	if (!f) {
		static const char *const sufs[] = {"_bucket", "_sum", "_count"};

		for (int i = 0; i < 3 && !f; i++)
			if (has_suffix(name, nlen, sufs[i])) {
				f = fam_find(sc, name, nlen - strlen(sufs[i]));
				suffix = sufs[i];
			}
		if (!f || strcmp(f->type, "histogram") != 0)
			FAIL("sample without its TYPE: '%s'", line);
	} else if (!strcmp(f->type, "histogram")) {
		FAIL("histogram sample without suffix: '%s'", line);
	}
	if (!f->type[0] || !f->help)
		FAIL("sample before HELP/TYPE: '%s'", line);
	f->samples++;
	if (!strcmp(f->type, "counter") && (v < 0 || isnan(v)))
		FAIL("negative counter: '%s'", line);
	if (suffix) {
		char key[256];
		struct hseries *h;

		snprintf(key, sizeof(key), "%s{%s}", f->name, other);
		h = hs_get(sc, key);
		if (!h)
			FAIL("too many histogram series");
		if (!strcmp(suffix, "_bucket")) {
			double b;

			if (!le[0])
				FAIL("bucket without le: '%s'", line);
			if (h->inf)
				FAIL("bucket after +Inf: '%s'", line);
			if (!strcmp(le, "+Inf")) {
				b = INFINITY;
				h->inf = true;
			} else {
				b = strtod(le, &end);
				if (*end)
					FAIL("bad le in '%s'", line);
			}
			if (b <= h->last_le)
				FAIL("le not increasing: '%s'", line);
			if (v < h->last_n)
				FAIL("bucket counts fall: '%s'", line);
			h->last_le = b;
			h->last_n = v;
		} else if (!strcmp(suffix, "_count")) {
			h->count = v;
		}
	}
}

static void parse_comment(struct scrape *sc, const char *line)
{
	const char *p = line + 2, *name;
	struct family *f;
	size_t n;
	bool help;

	if (strncmp(line, "# HELP ", 7) && strncmp(line, "# TYPE ", 7))
		return; /* other comments are allowed */
	help = line[2] == 'H';
	p += 5;
	name = p;
	while (*p && *p != ' ')
		p++;
	n = (size_t)(p - name);
	if (!name_ok(name, n) || *p != ' ' || !p[1])
		FAIL("bad comment '%s'", line);
	f = fam_add(sc, name, n);
	if (!f)
		FAIL("too many families");
	if (f->samples)
		FAIL("HELP/TYPE after samples: '%s'", line);
	if (help) {
		if (f->help)
			FAIL("second HELP: '%s'", line);
		f->help = true;
		return;
	}
	if (f->type[0])
		FAIL("second TYPE: '%s'", line);
	if (strcmp(p + 1, "counter") && strcmp(p + 1, "gauge") &&
	    strcmp(p + 1, "histogram"))
		FAIL("unknown type: '%s'", line);
	snprintf(f->type, sizeof(f->type), "%s", p + 1);
}

/* Parses body; sc->err says what is wrong, "" if nothing. */
static void parse(struct scrape *sc, char *body)
{
	char *save = NULL;
	size_t len = strlen(body);

	memset(sc, 0, sizeof(*sc));
	if (!len || body[len - 1] != '\n') {
		snprintf(sc->err, sizeof(sc->err), "body does not end in \\n");
		return;
	}
	for (char *line = strtok_r(body, "\n", &save); line && !sc->err[0];
	     line = strtok_r(NULL, "\n", &save)) {
		if (line[0] == '#')
			parse_comment(sc, line);
		else
			parse_sample(sc, line);
	}
	for (uint32_t i = 0; i < sc->nhs && !sc->err[0]; i++) {
		struct hseries *h = &sc->hs[i];

		if (!h->inf || h->count < 0 || h->count != h->last_n)
			snprintf(sc->err, sizeof(sc->err),
				 "%s: no +Inf bucket or +Inf != _count",
				 h->key);
	}
}

/* The value of the first sample line that starts with prefix, or -1. */
static double value_of(const char *body, const char *prefix)
{
	size_t n = strlen(prefix);

	for (const char *p = body; p && *p;
	     p = strchr(p, '\n'), p = p ? p + 1 : p)
		if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return -1;
}

/* ---- fixtures ---- */

static struct emb_server *srv;
static struct emb_metrics *met;
static struct emb_client *cli;
static struct emb_client_table *tab;

static void start(void)
{
	struct emb_server_opts o = EMB_SERVER_OPTS_DEFAULT;
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec sp = {
	    .struct_size = sizeof(struct emb_table_spec),
	    .name = "clicks",
	    .dim = DIM,
	    .optim = EMB_OPTIM_CFG_DEFAULT,
	    .init = EMB_INIT_CFG_DEFAULT,
	    .seed = 7,
	};
	char addr[64];

	o.port = 0;
	o.threads = 2;
	CU_ASSERT_EQUAL_FATAL(emb_server_create(&o, &srv), 0);
	CU_ASSERT_EQUAL_FATAL(emb_metrics_create("127.0.0.1:0",
						 emb_server_metrics_collect,
						 srv, &met),
			      0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", emb_server_port(srv));
	co.servers = addr;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &cli), 0);
	CU_ASSERT_EQUAL_FATAL(emb_client_table_create(cli, &sp, &tab), 0);
}

static void stop(void)
{
	emb_client_table_close(tab);
	emb_client_destroy(cli);
	emb_metrics_destroy(met);
	emb_server_destroy(srv);
	tab = NULL;
	cli = NULL;
	met = NULL;
	srv = NULL;
}

/* ---- cases ---- */

static void test_format(void)
{
	static uint64_t ids[100];
	static float rows[100 * DIM], grads[100 * DIM];
	struct emb_client_table_stats ts =
	    EMB_SIZED(struct emb_client_table_stats);
	struct scrape *sc = calloc(1, sizeof(*sc));
	char *body = NULL;

	CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
	start();
	for (uint32_t i = 0; i < 100; i++)
		ids[i] = i * 7919u;
	for (int k = 0; k < 5; k++)
		CU_ASSERT_EQUAL(
		    emb_client_table_pull(tab, ids, 100, rows, 0, NULL), 0);
	for (int k = 0; k < 3; k++)
		CU_ASSERT_EQUAL(
		    emb_client_table_push(tab, ids, 100, grads, 0, 0), 0);
	/* One more request on the same connection, so the loop thread has
	 * recorded the latency of every pull and push before it. */
	CU_ASSERT_EQUAL(emb_client_table_stats(tab, &ts), 0);

	CU_ASSERT_EQUAL_FATAL(
	    http_get(emb_metrics_port(met), "GET", "/metrics", &body), 200);
	CU_ASSERT_EQUAL(value_of(body, "embstore_table_rows{table=\"clicks\"}"),
			100);
	CU_ASSERT_EQUAL(
	    value_of(body, "embstore_table_pulls_total{table=\"clicks\"}"), 5);
	CU_ASSERT_EQUAL(
	    value_of(body,
		     "embstore_table_rows_pulled_total{table=\"clicks\"}"),
	    500);
	CU_ASSERT_EQUAL(
	    value_of(body, "embstore_table_pushes_total{table=\"clicks\"}"), 3);
	CU_ASSERT_EQUAL(
	    value_of(body,
		     "embstore_table_rows_created_total{table=\"clicks\"}"),
	    100);
	CU_ASSERT_EQUAL(
	    value_of(body,
		     "embstore_request_duration_seconds_count{op=\"pull\"}"),
	    5);
	CU_ASSERT_EQUAL(
	    value_of(body,
		     "embstore_request_duration_seconds_count{op=\"push\"}"),
	    3);
	CU_ASSERT_EQUAL(value_of(body, "embstore_connections_open"), 1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_server_tables"), 1);
	CU_ASSERT(value_of(body, "embstore_transport_receive_bytes_total") >
		  100 * 8 * 5);
	CU_ASSERT(value_of(body, "process_resident_memory_bytes") > 0);
	CU_ASSERT(value_of(body, "process_virtual_memory_bytes") > 0);
	CU_ASSERT(value_of(body, "process_cpu_seconds_total") >= 0);
	CU_ASSERT(value_of(body, "process_open_fds") > 2);
	CU_ASSERT(value_of(body, "process_max_fds") > 2);
	CU_ASSERT(value_of(body, "process_threads") > 2);
	/* Started within the last hour of this clock. */
	CU_ASSERT(fabs(value_of(body, "process_start_time_seconds") -
		       (double)time(NULL)) < 3600);
	CU_ASSERT_EQUAL(value_of(body,
				 "embstore_build_info{version=\"" EMB_VERSION
				 "\",role=\"server\"}"),
			1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_process_threads"), -1);
	CU_ASSERT(
	    value_of(body, "embstore_transport_errors_total{kind=\"io\"}") ==
	    0);

	parse(sc, body);
	CU_ASSERT_STRING_EQUAL(sc->err, "");
	if (sc->err[0])
		fprintf(stderr, "scrape: %s\n", sc->err);
	CU_ASSERT(sc->nhs >= 2); /* pull and push at least */
	free(body);
	free(sc);
	stop();
}

static void test_dropped_table(void)
{
	struct scrape *sc = calloc(1, sizeof(*sc));
	char *body = NULL;

	CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
	start();
	CU_ASSERT_EQUAL(emb_client_table_drop(tab), 0);
	CU_ASSERT_EQUAL_FATAL(
	    http_get(emb_metrics_port(met), "GET", "/metrics", &body), 200);
	CU_ASSERT_EQUAL(value_of(body, "embstore_table_rows{table=\"clicks\"}"),
			-1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_server_tables"), 0);
	parse(sc, body);
	CU_ASSERT_STRING_EQUAL(sc->err, "");
	free(body);
	free(sc);
	stop();
}

static void test_paths(void)
{
	char *body = NULL;

	start();
	CU_ASSERT_EQUAL(http_get(emb_metrics_port(met), "GET", "/", &body),
			404);
	free(body);
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "POST", "/metrics", &body), 405);
	free(body);
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "HEAD", "/metrics", &body), 200);
	CU_ASSERT_STRING_EQUAL(body, "");
	free(body);
	stop();
}

/* A client that connects, works and goes is no transport error. */
static void test_clean_close(void)
{
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_client *c2 = NULL;
	char addr[64], *body = NULL;
	double closes = -1, nopen = -1;

	start();
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", emb_server_port(srv));
	co.servers = addr;
	CU_ASSERT_EQUAL_FATAL(emb_client_create(&co, &c2), 0);
	emb_client_destroy(c2);
	/* The loop counts the peer's close when it reads the EOF, and the
	 * connection leaves the open count when it is freed after that: a
	 * scrape in between sees the one and not yet the other. */
	for (int i = 0; i < 100 && (closes < 1 || nopen != 1); i++) {
		free(body);
		CU_ASSERT_EQUAL_FATAL(
		    http_get(emb_metrics_port(met), "GET", "/metrics", &body),
		    200);
		closes = value_of(body, "embstore_transport_peer_closes_total");
		nopen = value_of(body, "embstore_connections_open");
		if (closes < 1 || nopen != 1)
			usleep(20000);
	}
	CU_ASSERT_EQUAL(closes, 1);
	CU_ASSERT_EQUAL(
	    value_of(body,
		     "embstore_transport_errors_total{kind=\"peer_closed\"}"),
	    0);
	CU_ASSERT_EQUAL(nopen, 1);
	free(body);
	stop();
}

static bool health_flag;

static bool health_of_flag(void *arg, char *why, size_t cap)
{
	(void)arg;
	snprintf(why, cap, "checkpoint loading");
	return health_flag;
}

static void test_healthz(void)
{
	char *body = NULL;

	start();
	/* No health function: serving is being ready. */
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "GET", "/healthz", &body), 200);
	CU_ASSERT_STRING_EQUAL(body, "ok\n");
	free(body);
	health_flag = false;
	emb_metrics_set_health(met, health_of_flag, NULL);
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "GET", "/healthz", &body), 503);
	CU_ASSERT_STRING_EQUAL(body, "checkpoint loading\n");
	free(body);
	health_flag = true;
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "GET", "/healthz", &body), 200);
	CU_ASSERT_STRING_EQUAL(body, "ok\n");
	free(body);
	CU_ASSERT_EQUAL(
	    http_get(emb_metrics_port(met), "POST", "/healthz", &body), 405);
	free(body);
	stop();
}

/* Scrapes m until the sample prefix has value want (2 s at most). */
static char *scrape_until(struct emb_metrics *m, const char *prefix,
			  double want)
{
	char *body = NULL;

	for (int i = 0; i < 100; i++) {
		free(body);
		if (http_get(emb_metrics_port(m), "GET", "/metrics", &body) !=
		    200)
			return body;
		if (value_of(body, prefix) == want)
			return body;
		usleep(20000);
	}
	return body;
}

static void test_scheduler(void)
{
	struct emb_sched_opts so = EMB_SCHED_OPTS_DEFAULT;
	struct emb_node_opts no = {0};
	struct scrape *sc = calloc(1, sizeof(*sc));
	struct emb_node *server = NULL, *worker = NULL;
	struct emb_sched *sched = NULL;
	struct emb_metrics *m = NULL;
	char *body;

	CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
	so.port = 0;
	so.server_num = 1;
	so.worker_num = 1;
	CU_ASSERT_EQUAL_FATAL(emb_sched_create(&so, &sched), 0);
	CU_ASSERT_EQUAL_FATAL(emb_metrics_create("127.0.0.1:0",
						 emb_sched_metrics_collect,
						 sched, &m),
			      0);
	body = scrape_until(m, "embstore_cluster_state{state=\"forming\"}", 1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_nodes{role=\"server\","
				       "state=\"missing\"}"),
			1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_map_epoch"), 0);
	CU_ASSERT_EQUAL(value_of(body,
				 "embstore_build_info{version=\"" EMB_VERSION
				 "\",role=\"scheduler\"}"),
			1);
	parse(sc, body);
	CU_ASSERT_STRING_EQUAL(sc->err, "");
	free(body);

	no.sched_host = "127.0.0.1";
	no.sched_port = emb_sched_port(sched);
	no.role = EMB_ROLE_SERVER;
	no.port = 9;
	no.join_timeout_ms = 5000;
	CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &server), 0);
	no.role = EMB_ROLE_WORKER;
	no.port = 0;
	CU_ASSERT_EQUAL_FATAL(emb_node_create(&no, &worker), 0);
	CU_ASSERT_EQUAL(emb_node_wait_map(worker), 0);
	body = scrape_until(m, "embstore_cluster_state{state=\"ready\"}", 1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_nodes{role=\"server\","
				       "state=\"alive\"}"),
			1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_nodes{role=\"worker\","
				       "state=\"alive\"}"),
			1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_nodes{role=\"worker\","
				       "state=\"missing\"}"),
			0);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_map_epoch"), 1);
	parse(sc, body);
	CU_ASSERT_STRING_EQUAL(sc->err, "");
	free(body);

	CU_ASSERT_EQUAL(emb_node_barrier(worker, "b"), 0);
	body = scrape_until(m, "embstore_cluster_barriers_total", 1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_barriers_total"), 1);
	free(body);

	/* The worker goes without finishing: dead. */
	emb_node_destroy(worker);
	body = scrape_until(m,
			    "embstore_cluster_nodes{role=\"worker\","
			    "state=\"dead\"}",
			    1);
	CU_ASSERT_EQUAL(value_of(body, "embstore_cluster_nodes{role=\"worker\","
				       "state=\"dead\"}"),
			1);
	free(body);
	emb_metrics_destroy(m);
	emb_node_destroy(server);
	emb_sched_destroy(sched);
	free(sc);
}

/* The checker itself: each body breaks one rule and must be caught. */
static void test_checker(void)
{
	static const char *const bad[] = {
	    "embstore_x 1\n",
	    "# HELP embstore_x h\n# TYPE embstore_x gauge\nembstore_X 1\n",
	    "# HELP Embstore_x h\n# TYPE Embstore_x gauge\nEmbstore_x 1\n",
	    "# HELP embstore_x h\n# TYPE embstore_x gauge\nembstore_x\n",
	    "# HELP embstore_x h\n# TYPE embstore_x counter\nembstore_x -1\n",
	    "# HELP embstore_h h\n# TYPE embstore_h histogram\n"
	    "embstore_h_bucket{le=\"1\"} 2\nembstore_h_bucket{le=\"2\"} 1\n"
	    "embstore_h_bucket{le=\"+Inf\"} 2\nembstore_h_count 2\n",
	    "# HELP embstore_h h\n# TYPE embstore_h histogram\n"
	    "embstore_h_bucket{le=\"1\"} 2\nembstore_h_count 2\n",
	    "# HELP embstore_h h\n# TYPE embstore_h histogram\n"
	    "embstore_h_bucket{le=\"+Inf\"} 2\nembstore_h_count 3\n",
	    "# HELP embstore_x h\n# TYPE embstore_x gauge\nembstore_x 1",
	};
	struct scrape *sc = calloc(1, sizeof(*sc));
	char buf[512];

	CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(buf, sizeof(buf), "%s", bad[i]);
		parse(sc, buf);
		CU_ASSERT_STRING_NOT_EQUAL(sc->err, "");
	}
	snprintf(
	    buf, sizeof(buf),
	    "# HELP embstore_h h\n# TYPE embstore_h histogram\n"
	    "embstore_h_bucket{op=\"a\",le=\"1\"} 1\n"
	    "embstore_h_bucket{op=\"a\",le=\"+Inf\"} 2\n"
	    "embstore_h_sum{op=\"a\"} 0.5\nembstore_h_count{op=\"a\"} 2\n");
	parse(sc, buf);
	CU_ASSERT_STRING_EQUAL(sc->err, "");
	free(sc);
}

static void collect_nothing(void *arg, struct emb_metrics_out *o)
{
	(void)arg;
	(void)o;
}

static void test_bad_addr(void)
{
	static const char *const bad[] = {
	    "",
	    "9464",
	    "127.0.0.1",
	    "127.0.0.1:",
	    "127.0.0.1:65536",
	    "127.0.0.1:94x",
	    "localhost:9464",
	    "[::1:9464",
	    ":9464",
	};
	struct emb_metrics *m = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_EQUAL(
		    emb_metrics_create(bad[i], collect_nothing, NULL, &m),
		    -EINVAL);
	CU_ASSERT_EQUAL(emb_metrics_create(NULL, collect_nothing, NULL, &m),
			-EINVAL);
	CU_ASSERT_EQUAL(emb_metrics_create("127.0.0.1:0", NULL, NULL, &m),
			-EINVAL);
	CU_ASSERT_PTR_NULL(m);
	emb_metrics_destroy(NULL);
}

static void test_port_busy(void)
{
	struct emb_metrics *a = NULL, *b = NULL;
	char addr[32];

	CU_ASSERT_EQUAL_FATAL(
	    emb_metrics_create("127.0.0.1:0", collect_nothing, NULL, &a), 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", emb_metrics_port(a));
	CU_ASSERT_EQUAL(emb_metrics_create(addr, collect_nothing, NULL, &b),
			-EADDRINUSE);
	CU_ASSERT_PTR_NULL(b);
	emb_metrics_destroy(a);
}

static void test_ipv6(void)
{
	struct emb_metrics *m = NULL;
	int rc = emb_metrics_create("[::1]:0", collect_nothing, NULL, &m);

	/* A host without IPv6 cannot bind ::1; nothing to check then. */
	if (rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT)
		return;
	CU_ASSERT_EQUAL(rc, 0);
	if (!rc)
		CU_ASSERT(emb_metrics_port(m) > 0);
	emb_metrics_destroy(m);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"scrape is valid text format with table, transport, latency "
	     "and process metrics",
	     test_format},
	    {"a dropped table leaves the scrape", test_dropped_table},
	    {"a client that disconnects cleanly is no transport error",
	     test_clean_close},
	    {"/healthz answers 200 when ready and 503 with the reason "
	     "otherwise",
	     test_healthz},
	    {"the scheduler exports nodes by role and state, the cluster "
	     "state, map epoch and barriers",
	     test_scheduler},
	    {"the format checker catches each broken rule", test_checker},
	    {"only GET or HEAD of /metrics answers 200", test_paths},
	    {"rejects malformed listen addresses", test_bad_addr},
	    {"reports a port in use", test_port_busy},
	    {"listens on IPv6 loopback", test_ipv6},
	    {NULL, NULL},
	};

	emb_log_set_level(EMB_LOG_WARN);
	return emb_test_main(argc, argv, "metrics", cases);
}
