/*
 * tools/server_metrics.h - what embstore-server and the scheduler show at
 * /metrics (docs/operations.md, "Metrics"). Collectors for
 * emb_metrics_create(); they run on the metrics endpoint's thread and read
 * only what the server lets any thread read.
 */
#ifndef EMB_TOOLS_SERVER_METRICS_H
#define EMB_TOOLS_SERVER_METRICS_H

struct emb_metrics_out;

/* arg is the struct emb_server *, which must outlive the endpoint. */
void emb_server_metrics_collect(void *arg, struct emb_metrics_out *o);

/* arg is unused (NULL): the scheduler's process. */
void emb_sched_metrics_collect(void *arg, struct emb_metrics_out *o);

#endif
