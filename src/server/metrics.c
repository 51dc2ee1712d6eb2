/*
 * src/server/metrics.c - the server's collector: build info, per
 * table counters (label table), transport counters summed over the event
 * loops, request latency per op (label op) and the process.
 *
 * Every value is read from counters the data path keeps anyway (atomics,
 * the store's stats, per-loop histograms merged here), so a scrape costs
 * the loops nothing but a read-lock of the table registry per table. Runs
 * on the metrics endpoint's thread, one scrape at a time.
 */
#include "server/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/hist.h"
#include "proto/wire_msg.h"
#include "transport/transport.h"

#include "metrics/metrics.h"
#include "server/server.h"
#include "server/tables.h"
#include "server/lat.h"

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
    TM("embstore_table_step", "gauge", step,
       "The table clock: push batches applied."),
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
			emb_metrics_u64(
			    o, tm->name, rows[i].label,
			    *(const uint64_t
				  *)(const void *)((const char *)&rows[i].w +
						   tm->off));
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

static uint64_t field(const struct emb_transport_stats *t, size_t off)
{
	return *(const uint64_t *)(const void *)((const char *)t + off);
}

static void collect_transport(struct emb_server *s, struct emb_metrics_out *o)
{
	struct emb_transport_stats sum = {0}, t;
	struct emb_server_stats ss;
	char label[64];

	for (uint32_t i = 0; i < emb_server_nloops(s); i++) {
		emb_server_loop_stats(s, i, &t);
		sum.bytes_in += t.bytes_in;
		sum.bytes_out += t.bytes_out;
		sum.frames_in += t.frames_in;
		sum.frames_out += t.frames_out;
		sum.rx_pauses += t.rx_pauses;
		sum.peer_closes += t.peer_closes;
		for (size_t k = 0; k < sizeof(err_kinds) / sizeof(err_kinds[0]);
		     k++)
			*(uint64_t *)(void *)((char *)&sum +
					      err_kinds[k].off) +=
			    field(&t, err_kinds[k].off);
		if (t.out_queue_peak > sum.out_queue_peak)
			sum.out_queue_peak = t.out_queue_peak;
	}
	emb_server_stats(s, &ss);

	emb_metrics_family(o, "embstore_server_tables", "gauge",
			   "Tables the server holds.");
	emb_metrics_u64(o, "embstore_server_tables", NULL, ss.tables);
	emb_metrics_family(o, "embstore_server_memory_used_bytes", "gauge",
			   "Bytes charged by all tables against the limit.");
	emb_metrics_u64(o, "embstore_server_memory_used_bytes", NULL,
			ss.mem_used);
	emb_metrics_family(o, "embstore_server_memory_limit_bytes", "gauge",
			   "The limit of memory_used_bytes; 0 = none.");
	emb_metrics_u64(o, "embstore_server_memory_limit_bytes", NULL,
			ss.mem_limit);
	emb_metrics_family(o, "embstore_server_nonfinite_refused_total",
			   "counter",
			   "PUSH and ASSIGN requests refused for NaN or Inf.");
	emb_metrics_u64(o, "embstore_server_nonfinite_refused_total", NULL,
			ss.nonfinite);
	emb_metrics_family(o, "embstore_server_admin_refused_total", "counter",
			   "SET_MODE, SET_LIFECYCLE and DROP_TABLE refused: no admin token.");
	emb_metrics_u64(o, "embstore_server_admin_refused_total", NULL,
			ss.not_admin);
	emb_metrics_family(o, "embstore_server_requests_total", "counter",
			   "Requests handled.");
	emb_metrics_u64(o, "embstore_server_requests_total", NULL, ss.requests);
	emb_metrics_family(o, "embstore_server_error_replies_total", "counter",
			   "Requests answered with an error.");
	emb_metrics_u64(o, "embstore_server_error_replies_total", NULL,
			ss.errors);
	emb_metrics_family(o, "embstore_connections_open", "gauge",
			   "Client connections open now.");
	emb_metrics_u64(o, "embstore_connections_open", NULL, ss.conns_open);
	emb_metrics_family(o, "embstore_connections_total", "counter",
			   "Client connections accepted.");
	emb_metrics_u64(o, "embstore_connections_total", NULL, ss.conns_total);
	emb_metrics_family(o, "embstore_connections_refused_total", "counter",
			   "Connections refused: max-conns or receive memory.");
	emb_metrics_u64(o, "embstore_connections_refused_total", NULL,
			ss.conns_refused);
	emb_metrics_family(o, "embstore_connections_timed_out_total",
			   "counter",
			   "Connections closed by handshake or idle timeout.");
	emb_metrics_u64(o, "embstore_connections_timed_out_total", NULL,
			ss.conns_timed_out);
	emb_metrics_family(o, "embstore_connection_buffer_bytes", "gauge",
			   "Receive buffer bytes all connections hold.");
	emb_metrics_u64(o, "embstore_connection_buffer_bytes", NULL,
			ss.conn_bytes);
	emb_metrics_family(o, "embstore_transport_receive_bytes_total",
			   "counter", "Bytes read from connections.");
	emb_metrics_u64(o, "embstore_transport_receive_bytes_total", NULL,
			sum.bytes_in);
	emb_metrics_family(o, "embstore_transport_transmit_bytes_total",
			   "counter", "Bytes written to connections.");
	emb_metrics_u64(o, "embstore_transport_transmit_bytes_total", NULL,
			sum.bytes_out);
	emb_metrics_family(o, "embstore_transport_receive_frames_total",
			   "counter", "Whole frames received.");
	emb_metrics_u64(o, "embstore_transport_receive_frames_total", NULL,
			sum.frames_in);
	emb_metrics_family(o, "embstore_transport_transmit_frames_total",
			   "counter", "Whole frames sent.");
	emb_metrics_u64(o, "embstore_transport_transmit_frames_total", NULL,
			sum.frames_out);
	emb_metrics_family(o, "embstore_transport_peer_closes_total", "counter",
			   "Connections the peer closed cleanly between "
			   "frames (a client that finished); no error.");
	emb_metrics_u64(o, "embstore_transport_peer_closes_total", NULL,
			sum.peer_closes);
	emb_metrics_family(o, "embstore_transport_errors_total", "counter",
			   "Connections closed or calls failed, by kind.");
	for (size_t k = 0; k < sizeof(err_kinds) / sizeof(err_kinds[0]); k++) {
		snprintf(label, sizeof(label), "kind=\"%s\"",
			 err_kinds[k].kind);
		emb_metrics_u64(o, "embstore_transport_errors_total", label,
				field(&sum, err_kinds[k].off));
	}
	emb_metrics_family(o, "embstore_transport_rx_pauses_total", "counter",
			   "Times a connection stopped being read "
			   "(backpressure).");
	emb_metrics_u64(o, "embstore_transport_rx_pauses_total", NULL,
			sum.rx_pauses);
	emb_metrics_family(o, "embstore_transport_out_queue_peak_bytes",
			   "gauge",
			   "Most bytes ever queued for sending on one "
			   "connection.");
	emb_metrics_u64(o, "embstore_transport_out_queue_peak_bytes", NULL,
			sum.out_queue_peak);
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
	collect_transport(s, o);
	collect_latency(s, o);
	emb_metrics_process(o);
}
