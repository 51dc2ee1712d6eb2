/*
 * src/server/metrics.h - what embstore-server shows at
 * /metrics (docs/operations.md, "Metrics"). Collectors for
 * emb_metrics_create(); they run on the metrics endpoint's thread and read
 * only what the server lets any thread read.
 */
#ifndef EMB_SERVER_METRICS_H
#define EMB_SERVER_METRICS_H

struct emb_metrics_out;

/* arg is the struct emb_server *, which must outlive the endpoint. */
void emb_server_metrics_collect(void *arg, struct emb_metrics_out *o);

#endif
