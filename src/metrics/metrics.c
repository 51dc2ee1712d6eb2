/*
 * src/metrics/metrics.c - the Prometheus endpoint: libmicrohttpd with one internal
 * polling thread, and a growing text buffer the collector writes into.
 *
 * One polling thread serves every scrape in turn, so collectors never run
 * concurrently with themselves and scrapes cost the daemon one idle thread.
 * Each scrape builds its text in a fresh buffer that libmicrohttpd frees
 * once sent. emb_metrics_create/destroy: the controlling thread; the
 * writers: the collector, on the endpoint's thread.
 */
#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/addr.h"
#include "common/hist.h"

struct emb_metrics {
	struct MHD_Daemon *d;	   /* the HTTP server */
	emb_metrics_collect_fn fn; /* the owner's collector */
	void *arg;		   /* passed to fn */
	uint16_t port;		   /* bound port */
	pthread_mutex_t mu;	   /* guards health and health_arg */
	emb_metrics_health_fn health; /* /healthz; NULL = always ok */
	void *health_arg;	      /* passed to health */
};

struct emb_metrics_out {
	char *buf;   /* text so far; malloc'd, handed to libmicrohttpd */
	size_t len;  /* bytes written, NUL excluded */
	size_t cap;  /* bytes allocated */
	bool failed; /* out of memory: the scrape answers 500 */
};

/* Upper bounds of the latency buckets, seconds; +Inf follows. */
static const double le_seconds[] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025,  0.005,    0.01,	0.025,	0.05,	 0.1,	 0.25,
    0.5,     1,	       2.5,	5,	10,
};

/* ---- text ---- */

static void out_vappend(struct emb_metrics_out *o, const char *fmt, va_list ap)
{
	va_list cp;
	int n;

	if (o->failed)
		return;
	va_copy(cp, ap);
	n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, cp);
	va_end(cp);
	if (n < 0) {
		o->failed = true;
		return;
	}
	if ((size_t)n >= o->cap - o->len) {
		size_t cap = o->cap * 2;
		char *nb;

		while (cap - o->len <= (size_t)n)
			cap *= 2;
		nb = realloc(o->buf, cap);
		if (!nb) {
			o->failed = true;
			return;
		}
		o->buf = nb;
		o->cap = cap;
		vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
	}
	o->len += (size_t)n;
}

void emb_metrics_printf(struct emb_metrics_out *o, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	out_vappend(o, fmt, ap);
	va_end(ap);
}

void emb_metrics_family(struct emb_metrics_out *o, const char *name,
			const char *type, const char *help)
{
	emb_metrics_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
			   type);
}

void emb_metrics_u64(struct emb_metrics_out *o, const char *name,
		     const char *labels, uint64_t v)
{
	if (labels && *labels)
		emb_metrics_printf(o, "%s{%s} %llu\n", name, labels,
				   (unsigned long long)v);
	else
		emb_metrics_printf(o, "%s %llu\n", name, (unsigned long long)v);
}

void emb_metrics_f64(struct emb_metrics_out *o, const char *name,
		     const char *labels, double v)
{
	/* 15 significant digits: exact for counters below 2^49 and
	 * readable for seconds (%.17g prints 2.4680299999999997). */
	if (labels && *labels)
		emb_metrics_printf(o, "%s{%s} %.15g\n", name, labels, v);
	else
		emb_metrics_printf(o, "%s %.15g\n", name, v);
}

void emb_metrics_hist(struct emb_metrics_out *o, const char *name,
		      const char *labels, const struct emb_hist *h)
{
	const char *sep = labels && *labels ? "," : "";
	const char *lb = labels ? labels : "";
	uint64_t prev = 0;

	for (size_t i = 0; i < sizeof(le_seconds) / sizeof(le_seconds[0]);
	     i++) {
		uint64_t ns = (uint64_t)(le_seconds[i] * 1e9 + 0.5);
		uint64_t n = emb_hist_count_le(h, ns);

		/* count_le is a bound inside a bucket; cumulative counts
		 * must never fall, whatever the rounding. */
		if (n < prev)
			n = prev;
		if (n > h->count)
			n = h->count;
		prev = n;
		emb_metrics_printf(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name,
				   lb, sep, le_seconds[i],
				   (unsigned long long)n);
	}
	emb_metrics_printf(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lb,
			   sep, (unsigned long long)h->count);
	if (*lb) {
		emb_metrics_printf(o, "%s_sum{%s} %.9f\n", name, lb,
				   (double)h->sum / 1e9);
		emb_metrics_printf(o, "%s_count{%s} %llu\n", name, lb,
				   (unsigned long long)h->count);
	} else {
		emb_metrics_printf(o, "%s_sum %.9f\n", name,
				   (double)h->sum / 1e9);
		emb_metrics_printf(o, "%s_count %llu\n", name,
				   (unsigned long long)h->count);
	}
}

/* ---- process ---- */

/* Field n (1-based, as proc(5) numbers them) of /proc/self/stat. */
static bool proc_stat_field(int n, unsigned long long *v)
{
	char buf[1024], *p;
	size_t len;
	FILE *f = fopen("/proc/self/stat", "r");
	int field = 3;

	if (!f)
		return false;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	/* The command name (field 2) may hold spaces; it ends at the last
	 * ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return false;
	p++;
	while (*p) {
		while (*p == ' ')
			p++;
		if (field == n)
			return sscanf(p, "%llu", v) == 1;
		while (*p && *p != ' ')
			p++;
		field++;
	}
	return false;
}

/* Open file descriptors: the entries of /proc/self/fd but its own. */
static bool open_fds(unsigned long long *n)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	unsigned long long k = 0;

	if (!d)
		return false;
	while ((de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			k++;
	closedir(d);
	*n = k ? k - 1 : 0; /* the directory stream's own fd */
	return true;
}

/* Seconds since the epoch at which the process started. */
static bool start_time(double *t)
{
	unsigned long long ticks;
	long hz = sysconf(_SC_CLK_TCK);
	double btime = 0;
	char line[256];
	FILE *f;

	if (hz <= 0 || !proc_stat_field(22, &ticks))
		return false;
	f = fopen("/proc/stat", "r");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %lf", &btime) == 1)
			break;
	fclose(f);
	if (btime <= 0)
		return false;
	*t = btime + (double)ticks / (double)hz;
	return true;
}

void emb_metrics_process(struct emb_metrics_out *o)
{
	unsigned long long vsize = 0, rss_pages = 0, threads = 0, fds = 0;
	long page = sysconf(_SC_PAGESIZE);
	struct rusage ru;
	struct rlimit rl;
	double t0;
	FILE *f;

	if (page <= 0)
		page = 4096;
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		double cpu = (double)ru.ru_utime.tv_sec +
			     (double)ru.ru_utime.tv_usec / 1e6 +
			     (double)ru.ru_stime.tv_sec +
			     (double)ru.ru_stime.tv_usec / 1e6;

		emb_metrics_family(o, "process_cpu_seconds_total", "counter",
				   "Total user and system CPU time spent in "
				   "seconds.");
		emb_metrics_f64(o, "process_cpu_seconds_total", NULL, cpu);
	}
	f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%llu %llu", &vsize, &rss_pages) != 2)
			vsize = rss_pages = 0;
		fclose(f);
	}
	emb_metrics_family(o, "process_resident_memory_bytes", "gauge",
			   "Resident memory size in bytes.");
	emb_metrics_u64(o, "process_resident_memory_bytes", NULL,
			rss_pages * (unsigned long long)page);
	emb_metrics_family(o, "process_virtual_memory_bytes", "gauge",
			   "Virtual memory size in bytes.");
	emb_metrics_u64(o, "process_virtual_memory_bytes", NULL,
			vsize * (unsigned long long)page);
	if (start_time(&t0)) {
		emb_metrics_family(o, "process_start_time_seconds", "gauge",
				   "Start time of the process since unix "
				   "epoch in seconds.");
		emb_metrics_f64(o, "process_start_time_seconds", NULL, t0);
	}
	if (open_fds(&fds)) {
		emb_metrics_family(o, "process_open_fds", "gauge",
				   "Number of open file descriptors.");
		emb_metrics_u64(o, "process_open_fds", NULL, fds);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
	    rl.rlim_cur != RLIM_INFINITY) {
		emb_metrics_family(o, "process_max_fds", "gauge",
				   "Maximum number of open file descriptors.");
		emb_metrics_u64(o, "process_max_fds", NULL,
				(unsigned long long)rl.rlim_cur);
	}
	if (proc_stat_field(20, &threads)) {
		emb_metrics_family(o, "process_threads", "gauge",
				   "Threads of the process.");
		emb_metrics_u64(o, "process_threads", NULL, threads);
	}
}

void emb_metrics_build_info(struct emb_metrics_out *o, const char *role)
{
	char label[96];

	snprintf(label, sizeof(label), "version=\"%s\",role=\"%s\"",
		 EMB_VERSION, role ? role : "");
	emb_metrics_family(o, "embstore_build_info", "gauge",
			   "Always 1; the labels say the version and the "
			   "role.");
	emb_metrics_u64(o, "embstore_build_info", label, 1);
}

/* ---- HTTP ---- */

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned int code,
			      char *body, size_t len, bool must_free)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(len, body,
					    must_free ? MHD_RESPMEM_MUST_FREE
						      : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (must_free)
			free(body);
		return MHD_NO;
	}
	if (code == MHD_HTTP_OK)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
					"text/plain; version=0.0.4; "
					"charset=utf-8");
	else
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
					"text/plain; charset=utf-8");
	ret = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result answer_health(struct emb_metrics *m,
				     struct MHD_Connection *conn)
{
	static char ok[] = "ok\n";
	char why[256] = "not ready";
	emb_metrics_health_fn fn;
	bool ready = true;
	char *body;
	size_t len;

	pthread_mutex_lock(&m->mu);
	fn = m->health;
	if (fn)
		ready = fn(m->health_arg, why, sizeof(why) - 1);
	pthread_mutex_unlock(&m->mu);
	if (ready)
		return answer(conn, MHD_HTTP_OK, ok, sizeof(ok) - 1, false);
	why[sizeof(why) - 1] = '\0';
	len = strlen(why);
	body = malloc(len + 2);
	if (!body)
		return MHD_NO;
	memcpy(body, why, len);
	body[len++] = '\n';
	body[len] = '\0';
	return answer(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, len, true);
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn,
			       const char *url, const char *method,
			       const char *version, const char *upload_data,
			       size_t *upload_data_size, void **con_cls)
{
	static char not_found[] = "not found: try /metrics or /healthz\n";
	static char not_allowed[] = "method not allowed\n";
	static char no_memory[] = "out of memory\n";
	struct emb_metrics *m = cls;
	struct emb_metrics_out o = {0};

	(void)version;
	(void)upload_data;
	(void)con_cls;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed,
			      sizeof(not_allowed) - 1, false);
	if (*upload_data_size)
		return MHD_NO; /* a GET with a body is no scrape */
	if (strcmp(url, "/healthz") == 0)
		return answer_health(m, conn);
	if (strcmp(url, "/metrics") != 0)
		return answer(conn, MHD_HTTP_NOT_FOUND, not_found,
			      sizeof(not_found) - 1, false);
	o.cap = 16384;
	o.buf = malloc(o.cap);
	if (!o.buf)
		return answer(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory,
			      sizeof(no_memory) - 1, false);
	o.buf[0] = '\0';
	m->fn(m->arg, &o);
	if (o.failed) {
		free(o.buf);
		return answer(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory,
			      sizeof(no_memory) - 1, false);
	}
	return answer(conn, MHD_HTTP_OK, o.buf, o.len, true);
}

/* Splits "host:port" or "[v6]:port" into a numeric socket address. */
static int parse_addr(const char *addr, struct sockaddr_storage *ss,
		      socklen_t *sslen)
{
	struct addrinfo hints = {0}, *ai = NULL;
	struct emb_addr a;
	char port[8];

	if (!addr || emb_addr_parse(addr, strlen(addr), -1, &a))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", a.port);
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(a.host, port, &hints, &ai) != 0 || !ai)
		return -EINVAL;
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*sslen = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

int emb_metrics_create(const char *addr, emb_metrics_collect_fn fn, void *arg,
		       struct emb_metrics **out)
{
	struct sockaddr_storage ss;
	const union MHD_DaemonInfo *info;
	struct emb_metrics *m;
	unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
	socklen_t sslen;
	int rc, fd;

	if (!fn || !out)
		return -EINVAL;
	rc = parse_addr(addr, &ss, &sslen);
	if (rc)
		return rc;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->fn = fn;
	m->arg = arg;
	pthread_mutex_init(&m->mu, NULL);
	/* Bind here, where errno says why it failed, and hand the socket
	 * over; libmicrohttpd closes it in MHD_stop_daemon(). */
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto err_free;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &(int){1}, sizeof(int)) <
		0 ||
	    bind(fd, (struct sockaddr *)&ss, sslen) < 0 || listen(fd, 16) < 0) {
		rc = -errno;
		goto err_close;
	}
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	m->d = MHD_start_daemon(
	    flags, 0, NULL, NULL, on_http, m, MHD_OPTION_LISTEN_SOCKET, fd,
	    MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT,
	    10u, MHD_OPTION_END);
	if (!m->d) {
		rc = -ENOMEM;
		goto err_close;
	}
	info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
	m->port = info ? info->port : 0;
	*out = m;
	return 0;

err_close:
	close(fd);
err_free:
	pthread_mutex_destroy(&m->mu);
	free(m);
	return rc;
}

void emb_metrics_set_health(struct emb_metrics *m, emb_metrics_health_fn fn,
			    void *arg)
{
	pthread_mutex_lock(&m->mu);
	m->health = fn;
	m->health_arg = arg;
	pthread_mutex_unlock(&m->mu);
}

void emb_metrics_destroy(struct emb_metrics *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

uint16_t emb_metrics_port(const struct emb_metrics *m)
{
	return m->port;
}
