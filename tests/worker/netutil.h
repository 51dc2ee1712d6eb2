/*
 * tests/worker/netutil.h - what the worker suites share: real servers on
 * ephemeral loopback ports (in this process, or embstore-server as a child),
 * clients with short timeouts, and a raw TCP peer that writes frames byte
 * for byte so a test can send what no well-behaved client would.
 *
 * Every function is for the test's main thread unless it says otherwise,
 * and fails the running CUnit case (fatally) when setup goes wrong, so the
 * cases read as the behaviour they check.
 */
#ifndef EMB_TESTS_WORKER_NETUTIL_H
#define EMB_TESTS_WORKER_NETUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/wire.h"
#include "server/server.h"
#include "store/store.h"
#include "worker/embstore.h"

/* Options for an in-process server on 127.0.0.1, port 0, two loops. */
struct emb_server_opts nt_server_opts(void);

/* Starts a server with o; the caller destroys it. */
struct emb_server *nt_server_start(const struct emb_server_opts *o);

/* Writes "127.0.0.1:P1,127.0.0.1:P2,..." for ports[0..n) into buf. */
void nt_addr_list(char *buf, size_t cap, const uint16_t *ports, uint32_t n);

/* A client of servers with timeout_ms (0 = 5 s); the caller destroys it. */
struct emb_client *nt_client(const char *servers, uint32_t timeout_ms);

/* A table spec with every field set: SGD, uniform init unless changed. */
struct emb_table_spec nt_spec(const char *name, uint32_t dim, uint64_t seed);

/* k/64 for a random k in [-64, 64]: sums of a few such values are exact in
 * any order, so rows pushed through servers compare bit for bit with a
 * reference. */
float nt_dyadic(uint64_t *rng);

/* An in-process table (4 shards) with sp's name, dim, optimizer,
 * initializer and seed: the reference a test replays its calls on. */
struct emb_table *nt_ref_table(const struct emb_table_spec *sp);

/*
 * Polls emb_server_stats() for up to 5 s until conns_open == want; returns
 * the last value seen. The server notices a vanished peer asynchronously.
 */
uint64_t nt_server_wait_conns(struct emb_server *s, uint64_t want);

/* ---- raw peer ---- */

/* A blocking socket connected to 127.0.0.1:port, 5 s receive timeout. */
int nt_raw_connect(uint16_t port);

/* Writes all of buf[0..len); 0 or -errno. */
int nt_raw_send(int fd, const void *buf, size_t len);

/*
 * Reads one frame: its header to *hdr and up to cap payload bytes into
 * payload (the rest is discarded). 0, EMB_EPEERDEAD when the server closed
 * the connection (EOF or reset), or -ETIMEDOUT after 5 s of silence.
 */
int nt_raw_recv(int fd, struct emb_frame_hdr *hdr, void *payload,
		size_t cap);

/*
 * Sends HELLO with token[0..token_len) and returns the response's status
 * (0 on success) or an nt_raw_recv() error.
 */
int nt_raw_hello(int fd, const void *token, uint32_t token_len);
/* The same with HELLO flags (EMB_F_ADMIN: token is the admin token). */
int nt_raw_hello_flags(int fd, uint16_t flags, const void *token,
		       uint32_t token_len);

/* True when nothing arrives on fd for ms milliseconds. */
bool nt_raw_quiet(int fd, int ms);

/*
 * Reads and drops frames until the server closes the connection: true, or
 * false after 5 s of silence.
 */
bool nt_raw_wait_closed(int fd);

/* A 32-byte request header with magic and version set. */
struct emb_frame_hdr nt_hdr(uint8_t op, uint64_t req_id, uint32_t table_id,
			    uint32_t count, uint32_t payload_len);

/* ---- embstore-server as a child process ---- */

struct nt_child {
	pid_t pid;	   /* the server process */
	uint16_t port;	   /* where it listens */
	char log[256];	   /* its stderr, a temp file removed on reap */
};

/*
 * Runs $EMB_SERVER_BIN --listen 127.0.0.1:0 plus args[] (NULL-terminated)
 * and waits up to 10 s for it to log its port. meson.build sets
 * EMB_SERVER_BIN; without it the case fails.
 */
void nt_child_start(struct nt_child *ch, const char *const *args);

/* Sends sig (if not 0), waits for the process and removes its log. */
void nt_child_reap(struct nt_child *ch, int sig);

/*
 * Waits up to timeout_ms for the process to exit by itself: its exit
 * status (128 + the signal if one ended it), or -1 when it did not exit in
 * time, when it is killed. Anything but 0 prints its log to stderr, so a
 * failed case shows why. The pid is reaped; nt_child_reap() still
 * removes the log.
 */
int nt_child_exit(struct nt_child *ch, int timeout_ms);

/* Copies the file at path to stderr, each line after prefix. */
void nt_print_file(const char *path, const char *prefix);

#endif
