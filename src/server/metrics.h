/*
 * src/server/metrics.h - what embstore-server shows at
 * /metrics (docs/operations.md, "Metrics"). Collectors for
 * emb_metrics_create(); they run on the metrics endpoint's thread and read
 * only what the server lets any thread read.
 */
#ifndef EMB_SERVER_METRICS_H
#define EMB_SERVER_METRICS_H

#include "metrics/metrics.h"

/* arg is the struct emb_server *, which must outlive the endpoint. */
void emb_server_metrics_collect(void *arg, struct emb_metrics_out *o);

/*
 * A daemon's --metrics-listen: serves /metrics from fn(arg) at addr as
 * emb_metrics_create() does (the server's collector, or the scheduler's),
 * and logs where, with the bound port, or why not. 0 and *out, or its
 * error.
 */
int emb_server_metrics_serve(const char *addr, emb_metrics_collect_fn fn,
			     void *arg, struct emb_metrics **out);

#endif
