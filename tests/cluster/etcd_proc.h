/*
 * tests/cluster/etcd_proc.h - a local etcd for tests: one member on free
 * loopback ports with its data in a temp dir, started as a child and
 * stopped (SIGTERM, then SIGKILL) by the test. Single-threaded use.
 */
#ifndef EMB_TESTS_ETCD_PROC_H
#define EMB_TESTS_ETCD_PROC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct etcd_proc {
	pid_t pid;	      /* the etcd child; 0 when stopped */
	char *dir;	      /* its data dir and log, removed at stop */
	uint16_t port;	      /* client port on 127.0.0.1 */
	uint16_t peer_port;   /* peer port on 127.0.0.1 */
	char url[64];	      /* "etcd://127.0.0.1:PORT" */
};

/* True if an etcd binary is on PATH (or EMB_ETCD_BIN names one). */
bool etcd_proc_available(void);

/*
 * Starts etcd and waits (up to 20 s) until it answers a range request.
 * 0, or -1 (the reason is printed, with etcd's log).
 */
int etcd_proc_start(struct etcd_proc *p);

/* Stops it and removes its directory; a stopped proc is a no-op. */
void etcd_proc_stop(struct etcd_proc *p);

/* A loopback port nobody listens on now. */
uint16_t etcd_proc_free_port(void);

/*
 * A relay in front of an etcd that stalls on cue: it passes every byte
 * both ways, and once it has seen a request whose first bytes contain
 * `after` go by, the next request (on any connection) starts a stall of
 * stall_ms during which nothing a client sends is passed on (held, then
 * passed). So a test can stop etcd between two chosen requests of one
 * node, which SIGSTOP, timed from outside, cannot. One thread per
 * connection; stopping the proxy ends them all.
 */
struct etcd_stall_proxy {
	uint16_t port;	     /* where clients connect (127.0.0.1) */
	char url[64];	     /* "etcd://127.0.0.1:PORT" */
	uint16_t etcd_port;  /* where it relays to */
	const char *after;   /* e.g. "/v3/lease/grant" */
	unsigned stall_ms;
	int lfd;
	pthread_t thread;
	int stop, armed, fired, nconn; /* atomics */
	int64_t until_ms;	/* the stall's end, emb_clock_ms() */
};

/* Starts p (its etcd_port, after and stall_ms set); 0 or -1. */
int etcd_stall_proxy_start(struct etcd_stall_proxy *p);

/* Stops it and its relays, waiting for them (each within ~100 ms). */
void etcd_stall_proxy_stop(struct etcd_stall_proxy *p);

#endif
