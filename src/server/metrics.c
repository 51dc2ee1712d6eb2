/*
 * src/server/metrics.c - the server's collector: build info, per
 * table counters (label table), transport counters summed over the event
 * loops, request latency per op (label op) and the process.
 *
 * Every value is read from counters the data path keeps anyway (atomics,
 * the store's stats, per-loop histograms merged here), so a scrape costs
 * the loops nothing but a read-lock of the table registry per table. Runs
 * on the metrics endpoint's thread, one scrape at a time. Each metric is
 * named once, in a table with its type, help and the stats field it reads
 * (table_metrics, server_metrics), and emitted in the table's order.
 */
#include "server/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/addr.h"
#include "common/err.h"
#include "common/hist.h"
#include "common/log.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

#include "metrics/metrics.h"
#include "server/server.h"
#include "server/tables.h"
#include "server/lat.h"

/* The u64 counter at byte off of a stats struct. */
static uint64_t get(const void *stats, size_t off)
{
	return *(const uint64_t *)(const void *)((const char *)stats + off);
}

static uint64_t *at(void *stats, size_t off)
{
	return (uint64_t *)(void *)((char *)stats + off);
}

/* A per-table counter: its name, help, and where it sits in the stats. */
struct table_metric {
	const char *name; /* full metric name */
	const char *type; /* "counter" or "gauge" */
	const char *help; /* HELP text */
	size_t off;	  /* offsetof(struct emb_wire_stats, field) */
};

#define TM(n, t, f, h)                                                         \
	{                                                                      \
		n, t, h, offsetof(struct emb_wire_stats, f)                    \
	}

static const struct table_metric table_metrics[] = {
    TM("embstore_table_rows", "gauge", rows, "Live rows of the table."),
    TM("embstore_table_memory_bytes", "gauge", bytes,
       "Bytes the table holds: slabs, index and fixed parts."),
    TM("embstore_table_pulls_total", "counter", pulls, "Pull requests served."),
    TM("embstore_table_pushes_total", "counter", pushes,
       "Push requests applied."),
    TM("embstore_table_rows_pulled_total", "counter", rows_pulled,
       "Ids served by pull, duplicates counted."),
    TM("embstore_table_rows_pushed_total", "counter", rows_pushed,
       "Distinct ids updated by push."),
    TM("embstore_table_rows_created_total", "counter", rows_created,
       "Rows made by the initializer."),
    TM("embstore_table_rows_erased_total", "counter", rows_erased,
       "Rows removed by erase."),
    TM("embstore_table_rows_evicted_total", "counter", rows_evicted,
       "Rows removed by eviction."),
    TM("embstore_table_rows_evicted_ttl_total", "counter", rows_evicted_ttl,
       "Rows evicted as not read or written for ttl table steps."),
    TM("embstore_table_rows_evicted_l2_total", "counter", rows_evicted_l2,
       "Rows evicted for weights of an L2 norm under min_l2."),
    TM("embstore_table_rows_evicted_max_rows_total", "counter",
       rows_evicted_cap, "Rows evicted to keep the table under max_rows."),
    TM("embstore_table_admission_pending_pulls_total", "counter",
       pulls_unadmitted,
       "Pulled ids not admitted yet, answered with initial values."),
    TM("embstore_table_admission_dropped_pushes_total", "counter",
       pushes_unadmitted, "Pushed ids not admitted yet, not applied."),
    TM("embstore_table_admission_filter_bytes", "gauge", admit_filter_bytes,
       "Bytes of the admission filter (counters or Bloom filter)."),
    TM("embstore_table_misses_total", "counter", misses,
       "No-create pulls of an absent id."),
    TM("embstore_table_grads_discarded_total", "counter", grads_discarded,
       "Pushed rows dropped as too stale (bounded staleness)."),
    TM("embstore_table_rows_nonfinite_total", "counter", rows_nonfinite,
       "Rows with a NaN or infinite value set aside when loaded."),
    TM("embstore_table_step", "gauge", step,
       "The table clock: push batches applied."),
    TM("embstore_table_rows_cold", "gauge", rows_cold,
       "Rows on the device tier (--tier-dir)."),
    TM("embstore_table_tier_file_bytes", "gauge", tier_bytes,
       "Bytes of the device tier's file."),
    TM("embstore_table_tier_reads_total", "counter", tier_reads,
       "4 KiB blocks the device tier read."),
    TM("embstore_table_tier_writes_total", "counter", tier_writes,
       "4 KiB blocks the device tier wrote."),
    TM("embstore_table_tier_read_wait_microseconds_total", "counter",
       tier_read_us, "Time spent waiting on device tier reads."),
};

#define NTABLE_METRICS (sizeof(table_metrics) / sizeof(table_metrics[0]))

/* A table's id, name and counters, taken once per scrape. */
struct table_row {
	char label[96];		 /* table="name" */
	struct emb_wire_stats w; /* its counters */
};

/* `table="name"` with the text format's escapes (\\, \", \n). */
static void table_label(char *buf, size_t cap, const char *name)
{
	size_t n = 0;

	n += (size_t)snprintf(buf, cap, "table=\"");
	for (const char *p = name; *p && n + 3 < cap; p++) {
		if (*p == '\\' || *p == '"' || *p == '\n') {
			buf[n++] = '\\';
			buf[n++] = *p == '\n' ? 'n' : *p;
		} else {
			buf[n++] = *p;
		}
	}
	if (n + 2 > cap)
		n = cap - 2;
	buf[n++] = '"';
	buf[n] = '\0';
}

static void collect_tables(struct emb_server *s, struct emb_metrics_out *o)
{
	struct table_row *rows = NULL;
	uint32_t *ids = NULL;
	uint32_t n, cap, got = 0;

	n = emb_server_table_ids(s, NULL, 0);
	/* Room for a few created meanwhile; later ones wait a scrape. */
	cap = n + 8;
	ids = malloc(cap * sizeof(*ids));
	rows = malloc(cap * sizeof(*rows));
	/* Out of memory: the families go out empty, the scrape still works. */
	n = ids && rows ? emb_server_table_ids(s, ids, cap) : 0;
	if (n > cap)
		n = cap;
	for (uint32_t i = 0; i < n; i++) {
		struct emb_server_table st;

		/* A table dropped since the id list is skipped. */
		if (emb_server_table_acquire(s, ids[i], &st))
			continue;
		table_label(rows[got].label, sizeof(rows[got].label),
			    st.spec.name);
		emb_server_table_release(&st);
		if (emb_server_table_stats(s, ids[i], &rows[got].w) == 0)
			got++;
	}
	for (size_t m = 0; m < NTABLE_METRICS; m++) {
		const struct table_metric *tm = &table_metrics[m];

		emb_metrics_family(o, tm->name, tm->type, tm->help);
		for (uint32_t i = 0; i < got; i++)
			emb_metrics_u64(o, tm->name, rows[i].label,
					get(&rows[i].w, tm->off));
	}
	free(rows);
	free(ids);
}

/* Transport error counters and their kind label. */
struct err_kind {
	const char *kind; /* label value */
	size_t off;	  /* offsetof(struct emb_transport_stats, ...) */
};

#define EK(k, f)                                                               \
	{                                                                      \
		k, offsetof(struct emb_transport_stats, f)                     \
	}

static const struct err_kind err_kinds[] = {
    EK("bad_magic", err_bad_magic),
    EK("bad_version", err_bad_version),
    EK("frame_too_big", err_too_big),
    EK("peer_closed", err_peer_closed),
    EK("io", err_io),
    EK("response_too_big", resp_too_big),
    EK("response_unmatched", resp_unmatched),
    EK("timed_out", calls_timed_out),
    EK("no_memory", err_no_memory),
};

#define NERR_KINDS (sizeof(err_kinds) / sizeof(err_kinds[0]))

/* Where a server-wide metric's value is read. */
enum from {
	FROM_SERVER,	/* struct emb_server_stats, at off */
	FROM_TRANSPORT, /* struct emb_transport_stats summed over the loops,
			   at off; a gauge (a peak) is the loops' largest */
	FROM_ERRORS,	/* the err_kinds of that sum, one series each */
};

/* A server-wide metric: named once, emitted in this order. */
struct server_metric {
	const char *name; /* full metric name */
	const char *type; /* "counter" or "gauge" */
	const char *help; /* HELP text */
	enum from from;	  /* which stats */
	size_t off;	  /* offsetof() its field there */
};

#define SM(n, t, f, h)                                                         \
	{                                                                      \
		n, t, h, FROM_SERVER, offsetof(struct emb_server_stats, f)     \
	}
#define TR(n, t, f, h)                                                         \
	{                                                                      \
		n, t, h, FROM_TRANSPORT,                                       \
		    offsetof(struct emb_transport_stats, f)                    \
	}

static const struct server_metric server_metrics[] = {
    SM("embstore_server_tables", "gauge", tables, "Tables the server holds."),
    SM("embstore_server_memory_used_bytes", "gauge", mem_used,
       "Bytes charged by all tables against the limit."),
    SM("embstore_server_memory_limit_bytes", "gauge", mem_limit,
       "The limit of memory_used_bytes; 0 = none."),
    SM("embstore_server_nonfinite_refused_total", "counter", nonfinite,
       "PUSH and ASSIGN requests refused for NaN or Inf."),
    SM("embstore_server_admin_refused_total", "counter", not_admin,
       "SET_MODE, SET_LIFECYCLE and DROP_TABLE refused: no admin token."),
    SM("embstore_server_birth_checks_total", "counter", birth_checks,
       "Rounds of the backup's check of its slots against their primaries."),
    SM("embstore_server_births_pruned_total", "counter", births_pruned,
       "Rows the backup's check removed: its primaries' evictions."),
    SM("embstore_move_pace_reports_total", "counter", pace_reports,
       "Workers' reports of their calls' latency during moves (PACE)."),
    SM("embstore_move_pace_cuts_total", "counter", pace_cuts,
       "Times --move-bound halved the pace of a copy ahead."),
    SM("embstore_move_pace_bytes_per_second", "gauge", pace_rate,
       "The pace of this server's copy ahead under --move-bound, as last "
       "set; 0 = none yet."),
    SM("embstore_server_requests_total", "counter", requests,
       "Requests handled."),
    SM("embstore_server_error_replies_total", "counter", errors,
       "Requests answered with an error."),
    SM("embstore_connections_open", "gauge", conns_open,
       "Client connections open now."),
    SM("embstore_connections_total", "counter", conns_total,
       "Client connections accepted."),
    SM("embstore_connections_refused_total", "counter", conns_refused,
       "Connections refused: max-conns or receive memory."),
    SM("embstore_connections_timed_out_total", "counter", conns_timed_out,
       "Connections closed by handshake or idle timeout."),
    SM("embstore_connection_buffer_bytes", "gauge", conn_bytes,
       "Receive buffer bytes all connections hold."),
    TR("embstore_transport_receive_bytes_total", "counter", bytes_in,
       "Bytes read from connections."),
    TR("embstore_transport_transmit_bytes_total", "counter", bytes_out,
       "Bytes written to connections."),
    TR("embstore_transport_receive_frames_total", "counter", frames_in,
       "Whole frames received."),
    TR("embstore_transport_transmit_frames_total", "counter", frames_out,
       "Whole frames sent."),
    TR("embstore_transport_peer_closes_total", "counter", peer_closes,
       "Connections the peer closed cleanly between frames (a client that "
       "finished); no error."),
    {"embstore_transport_errors_total", "counter",
     "Connections closed or calls failed, by kind.", FROM_ERRORS, 0},
    TR("embstore_transport_rx_pauses_total", "counter", rx_pauses,
       "Times a connection stopped being read (backpressure)."),
    TR("embstore_transport_out_queue_peak_bytes", "gauge", out_queue_peak,
       "Most bytes ever queued for sending on one connection."),
};

#define NSERVER_METRICS (sizeof(server_metrics) / sizeof(server_metrics[0]))

/* The loops' transport counters, summed (gauges: the largest). */
static void transport_sum(struct emb_server *s, struct emb_transport_stats *sum)
{
	struct emb_transport_stats t;

	for (uint32_t i = 0; i < emb_server_nloops(s); i++) {
		emb_server_loop_stats(s, i, &t);
		for (size_t m = 0; m < NSERVER_METRICS; m++) {
			const struct server_metric *sm = &server_metrics[m];
			uint64_t *to = at(sum, sm->off), v;

			if (sm->from != FROM_TRANSPORT)
				continue;
			v = get(&t, sm->off);
			if (sm->type[0] == 'g')
				*to = v > *to ? v : *to;
			else
				*to += v;
		}
		for (size_t k = 0; k < NERR_KINDS; k++)
			*at(sum, err_kinds[k].off) += get(&t, err_kinds[k].off);
	}
}

static void collect_server(struct emb_server *s, struct emb_metrics_out *o)
{
	struct emb_transport_stats sum = {0};
	struct emb_server_stats ss;
	char label[64];

	transport_sum(s, &sum);
	emb_server_stats(s, &ss);
	for (size_t m = 0; m < NSERVER_METRICS; m++) {
		const struct server_metric *sm = &server_metrics[m];

		emb_metrics_family(o, sm->name, sm->type, sm->help);
		if (sm->from == FROM_SERVER)
			emb_metrics_u64(o, sm->name, NULL, get(&ss, sm->off));
		else if (sm->from == FROM_TRANSPORT)
			emb_metrics_u64(o, sm->name, NULL, get(&sum, sm->off));
		else
			for (size_t k = 0; k < NERR_KINDS; k++) {
				snprintf(label, sizeof(label), "kind=\"%s\"",
					 err_kinds[k].kind);
				emb_metrics_u64(o, sm->name, label,
						get(&sum, err_kinds[k].off));
			}
	}
}

static void collect_latency(struct emb_server *s, struct emb_metrics_out *o)
{
	struct emb_hist *h = malloc(sizeof(*h));
	char label[48];

	if (!h)
		return;
	emb_metrics_family(o, "embstore_request_duration_seconds", "histogram",
			   "Time from a request's arrival to its reply being "
			   "posted, by op.");
	for (uint32_t op = 0; op < EMB_LAT_NOPS; op++) {
		emb_server_latency(s, op, h);
		/* pull and push always, so dashboards have a series to
		 * show; the rest once they happened. */
		if (!h->count && op != EMB_LAT_PULL && op != EMB_LAT_PUSH)
			continue;
		snprintf(label, sizeof(label), "op=\"%s\"",
			 emb_lat_op_name(op));
		emb_metrics_hist(o, "embstore_request_duration_seconds", label,
				 h);
	}
	free(h);
}

void emb_server_metrics_collect(void *arg, struct emb_metrics_out *o)
{
	struct emb_server *s = arg;

	emb_metrics_build_info(o, "server");
	collect_tables(s, o);
	collect_server(s, o);
	collect_latency(s, o);
	emb_metrics_process(o);
}

/* Where metrics are served, with the bound port (--metrics-listen H:0). */
static void log_metrics_addr(const char *addr, uint16_t port)
{
	struct emb_addr a;
	char buf[EMB_HOST_MAX + 16];

	if (emb_addr_parse(addr, strlen(addr), -1, &a) == 0) {
		a.port = port;
		if (emb_addr_format(&a, buf, sizeof(buf)) > 0)
			addr = buf;
	}
	emb_log(EMB_LOG_INFO,
		"metrics on http://%s/metrics, health on /healthz", addr);
}

int emb_server_metrics_serve(const char *addr, emb_metrics_collect_fn fn,
			     void *arg, struct emb_metrics **out)
{
	int rc = emb_metrics_create(addr, fn, arg, out);

	if (rc)
		emb_log(EMB_LOG_ERROR, "cannot serve metrics on %s: %s", addr,
			emb_strerror(rc));
	else
		log_metrics_addr(addr, emb_metrics_port(*out));
	return rc;
}
