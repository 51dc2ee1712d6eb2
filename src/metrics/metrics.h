/*
 * src/metrics/metrics.h - a Prometheus /metrics endpoint for embstore's daemons.
 *
 * A metrics endpoint is libmicrohttpd listening on one address; each GET of
 * /metrics calls the owner's collector, which writes the text exposition
 * format (version 0.0.4) through the emb_metrics_* writers below. The
 * collector runs on the endpoint's own thread, one scrape at a time, so it
 * must only read state that other threads may read (atomics, locked
 * snapshots). create/destroy are called from one controlling thread.
 */
#ifndef EMB_METRICS_METRICS_H
#define EMB_METRICS_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct emb_hist;
struct emb_metrics;
struct emb_metrics_out;

/* Writes one scrape into o; runs on the endpoint's thread. */
typedef void (*emb_metrics_collect_fn)(void *arg, struct emb_metrics_out *o);

/*
 * /healthz: true when the daemon is ready to serve; otherwise writes why
 * (one line, NUL-terminated, at most cap bytes) into why. Runs on the
 * endpoint's thread.
 */
typedef bool (*emb_metrics_health_fn)(void *arg, char *why, size_t cap);

/*
 * Listens on addr ("host:port" or "[v6]:port", numeric host; port 0 picks
 * a free one) and serves GET /metrics from fn(arg). 0 and *out, or -EINVAL
 * (addr malformed or fn NULL), -EADDRINUSE / -EACCES (cannot bind),
 * -ENOMEM. arg is borrowed until emb_metrics_destroy() returns.
 */
int emb_metrics_create(const char *addr, emb_metrics_collect_fn fn, void *arg,
		       struct emb_metrics **out);

/*
 * Answers GET /healthz from fn(arg) from now on: 200 "ok" when it returns
 * true, else 503 and its reason. Until set (or with fn NULL) /healthz
 * answers 200 "ok" whenever the endpoint serves. arg is borrowed until the
 * next call or emb_metrics_destroy(). Any thread.
 */
void emb_metrics_set_health(struct emb_metrics *m, emb_metrics_health_fn fn,
			    void *arg);

/* Stops serving (a scrape in progress finishes first); NULL is a no-op. */
void emb_metrics_destroy(struct emb_metrics *m);

/* The bound port (after port 0). */
uint16_t emb_metrics_port(const struct emb_metrics *m);

/* ---- writers, for collectors --------------------------------------------
 *
 * name is the full metric name (embstore_..., units and _total included);
 * labels is the inside of the braces, already formatted (`table="a"`), or
 * NULL for none. A writer that runs out of memory marks o failed and the
 * scrape answers 500.
 */

/* "# HELP name help" and "# TYPE name type" (counter, gauge, histogram). */
void emb_metrics_family(struct emb_metrics_out *o, const char *name,
			const char *type, const char *help);
void emb_metrics_u64(struct emb_metrics_out *o, const char *name,
		     const char *labels, uint64_t v);
void emb_metrics_f64(struct emb_metrics_out *o, const char *name,
		     const char *labels, double v);

/*
 * A histogram of h (nanoseconds) in seconds: name_bucket{le=...} for fixed
 * bounds from 10 us to 10 s (1-2.5-5 steps) then +Inf, name_sum and
 * name_count. h is the caller's, read as given: pass a private copy.
 */
void emb_metrics_hist(struct emb_metrics_out *o, const char *name,
		      const char *labels, const struct emb_hist *h);

/*
 * The process, named as Prometheus client libraries name them:
 * process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_start_time_seconds,
 * process_open_fds, process_max_fds and process_threads, from /proc/self
 * and getrusage().
 */
void emb_metrics_process(struct emb_metrics_out *o);

/* embstore_build_info{version="...",role="..."} 1; role as given. */
void emb_metrics_build_info(struct emb_metrics_out *o, const char *role);

/* Appends raw text (tests, or a collector's own lines). */
void emb_metrics_printf(struct emb_metrics_out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
