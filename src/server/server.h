/*
 * src/server/server.h - the embstore server: tables behind a transport.
 *
 * Used by the daemon (tools/embstore-server.c) and by tests that want a real
 * server in their own process. A server runs one event loop per thread;
 * requests are handled on the loop thread that owns their connection, and
 * the store's per-shard locks make those threads safe against each other.
 * create/stop/destroy are called from one controlling thread.
 */
#ifndef EMB_SERVER_SERVER_H
#define EMB_SERVER_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/map.h"
#include "common/hash.h"
#include "proto/wire.h"
#include "proto/wire_msg.h"
#include "server/tables.h"

struct emb_server;

/*
 * Largest frame a connection may send before its HELLO succeeded: HELLO
 * itself takes at most 32 + 8 + 256 + 128 bytes. Anything larger is
 * answered with EMB_ETOOBIG and closes the connection, so a stranger
 * cannot make the server hold more than this per connection.
 */
#define EMB_SERVER_LOGIN_FRAME 4096u

struct emb_server_opts {
	const char *host;	       /* listen address; copied */
	uint16_t port;		       /* 0 picks a free port */
	const char *transport;	       /* "tcp", "rdma" or "tcp,rdma" (both,
					  one port number); copied */
	uint32_t threads;	       /* event loops, >= 1 */
	const uint8_t *auth_token;     /* required in HELLO, or NULL; copied */
	uint32_t auth_token_len;       /* bytes, <= EMB_WIRE_TOKEN_MAX */
	const uint8_t *admin_token;    /* HELLO with EMB_F_ADMIN and this token
					  gets admin rights (SET_MODE,
					  DROP_TABLE); NULL = every client
					  that logged in has them; copied */
	uint32_t admin_token_len;      /* bytes, <= EMB_WIRE_TOKEN_MAX */
	uint64_t mem_limit;	       /* bytes of all tables and held
					  synchronous pushes; 0 = unlimited */
	uint64_t conn_mem_limit;       /* bytes of receive buffers of all
					  connections; 0 = a quarter of
					  mem_limit, at least 64 MiB (1 GiB
					  when mem_limit is 0) */
	uint32_t max_conns;	       /* client connections open at once;
					  more are refused with
					  EMB_ETOOMANYCONNS; 0 = unlimited */
	uint32_t handshake_timeout_ms; /* a connection whose HELLO has not
					  succeeded by then is closed; 0 =
					  never */
	uint32_t idle_timeout_ms;      /* a logged-in connection with no
					  request for this long and none
					  pending is closed; 0 = never */
	uint32_t frame_timeout_ms;     /* a frame must arrive whole within
					  this long of its first byte, or
					  the connection is closed with
					  -ETIMEDOUT (TCP); 0 = never */
	struct emb_wire_limits limits; /* what requests may carry */
	uint64_t move_rate;	       /* bytes/s of a move's copy ahead that
					  this server streams (its fenced
					  stream is never paced); 0 =
					  unlimited */
	double move_bound;	       /* a copy ahead it streams is paced
					  so that the workers' calls' p99
					  stays under this many times their
					  p99 before the move, as they
					  report it (PACE; src/server/
					  pacer.h), move_rate its cap; 0 =
					  off, else >= 1 (tests: > 0) */
	uint32_t table_shards;	       /* index shards per table */
	bool zero_copy_pulls;	       /* PULL rows straight from table memory
					  (default for rdma) instead of one
					  copied buffer (default for tcp); a
					  "tcp,rdma" server copies for its TCP
					  conns either way */
	const char *tier_dir;	       /* each table it makes keeps the rows
					  mem_limit leaves out in a file
					  here (docs/store.md, "The device
					  tier"); NULL = none; copied */
	uint64_t tier_max;	       /* bytes each such file may grow to;
					  0 = no bound */
	bool remote_read;	       /* tables it makes are remote-readable:
					  8 more bytes a row, and RDMA clients
					  may READ rows without this server's
					  CPU (LOCATE; docs/rdma.md) */
	/* Runs in emb_server_create() before the listener opens (e.g. to
	 * load a checkpoint); non-zero fails the create. NULL = none. */
	int (*on_start)(struct emb_server *s, void *arg);
	void *start_arg; /* passed to on_start */
};

#define EMB_SERVER_OPTS_DEFAULT                                                \
	((struct emb_server_opts){.host = "127.0.0.1",                         \
				  .port = 7164,                                \
				  .transport = "tcp",                          \
				  .threads = 1,                                \
				  .limits = EMB_WIRE_LIMITS_DEFAULT,           \
				  .max_conns = 1024,                           \
				  .handshake_timeout_ms = 10000,               \
				  .idle_timeout_ms = 600000,                   \
				  .frame_timeout_ms = 30000,                   \
				  .table_shards = 64})

/*
 * Creates the server, binds and starts serving in its own threads. 0 and
 * *out, or -EINVAL (bad opts), -EADDRINUSE, -ENODEV (transport missing),
 * -ENOMEM, or another negative errno from the transport.
 */
int emb_server_create(const struct emb_server_opts *opts,
		      struct emb_server **out);

/* The bound port (after port 0). */
uint16_t emb_server_port(const struct emb_server *s);

/*
 * Stops accepting, lets requests already read finish and their replies go
 * out (for at most grace_ms), then stops the loops. Idempotent.
 */
void emb_server_stop(struct emb_server *s, uint32_t grace_ms);

/* Stops if needed and frees everything; NULL is a no-op. */
void emb_server_destroy(struct emb_server *s);

/* Counters for logs and tests. */
struct emb_server_stats {
	uint64_t conns_open;  /* connections open now */
	uint64_t conns_total; /* accepted since start */
	uint64_t requests;    /* requests handled */
	uint64_t errors;      /* error responses sent */
	uint64_t tables;      /* tables now */
	uint64_t mem_used;    /* bytes charged by all tables */
	uint64_t mem_limit;   /* opts.mem_limit; 0 = unlimited */
	uint64_t conn_bytes;  /* receive buffer bytes of all connections */
	uint64_t conns_refused; /* connections refused: max_conns or
				   receive memory full */
	uint64_t conns_timed_out; /* closed by handshake or idle timeout */
	uint64_t nonfinite;	  /* PUSH/ASSIGN refused for NaN or Inf */
	uint64_t not_admin;	  /* admin requests refused: no admin token */
	uint64_t birth_checks;	  /* rounds of a backup's birth check */
	uint64_t births_pruned;	  /* rows they removed: its primaries'
				     evictions, carried out here */
	uint64_t pace_reports;	  /* workers' PACE reports taken */
	uint64_t pace_cuts;	  /* times --move-bound halved the pace
				     of a copy ahead */
	uint64_t pace_rate;	  /* that pace, bytes/s, as last set (0:
				     no copy ahead paced by it yet) */
};

void emb_server_stats(struct emb_server *s, struct emb_server_stats *out);

/* ---- replicated jobs: the cluster map's view (docs/replication.md) ---- */

/* What a server of a replicated job checks writes against. */
struct emb_server_map {
	uint64_t epoch;		    /* of the scheduler's map, >= 1 */
	uint8_t slot[EMB_NSLOTS];   /* enum emb_cmap_view_flag bits
				       (cluster/map.h) for this server */
	uint32_t grew[EMB_NSLOTS];  /* epoch the slot's writers last grew
				       at: writes routed before it are
				       refused with EMB_ESTALEMAP */
	uint32_t share; /* slots this server will hold once the moves end:
			   the copies over the servers holding or being
			   given any (0: not known); what a move's copy
			   sizes its tables' indexes for */
};

/*
 * Any thread: checks every write that carries a map epoch (EMB_F_EPOCH)
 * against m from now on (an older m than the one held is ignored). When
 * it returns, no write checked against the previous view is still being
 * applied. 0, or -EINVAL.
 */
int emb_server_set_map(struct emb_server *s, const struct emb_server_map *m);

/*
 * Frees the rows of slots this server no longer holds in its view (a move
 * put them elsewhere, docs/replication.md "Moving slots"): reads every
 * table, then erases those rows in batches, each under the view as a
 * write is. only, when not NULL, a bitmap of EMB_NSLOTS bits, narrows it
 * to those slots. Any thread; takes as long as a read of the tables'
 * records of those slots. Returns the rows freed (>= 0), or -ENOMEM.
 */
int64_t emb_server_sweep_unheld(struct emb_server *s, const uint64_t *only);

/*
 * fn(arg, epoch) runs on a loop thread when a write carries a newer epoch
 * than the view's: the host fetches the map (it must not block).
 */
void emb_server_on_newer_map(struct emb_server *s,
			     void (*fn)(void *arg, uint64_t epoch), void *arg);

/* Writes refused by the map's view: [0] EMB_EMOVING, [1] EMB_ESTALEMAP. */
void emb_server_map_counts(struct emb_server *s, uint64_t out[2]);

/*
 * Recovery: streams every row of the slots [first, first + n) of every
 * table, with optimizer state, to the server at host:port, which is being
 * filled with them (its tables are created as here, its rows assigned
 * with EMB_F_FILL and epoch). Runs on a thread of its own; done(arg,
 * status, rows, bytes) follows from it: status 0 once every row was
 * installed, or the error; the rows sent and their bytes (ids and
 * floats). One fill at a time per server: -EBUSY while one runs.
 * 0, or -ENOMEM, -EBUSY.
 */
typedef void (*emb_server_fill_fn)(void *arg, uint32_t first, uint32_t n,
				   uint64_t epoch, int status, uint64_t rows,
				   uint64_t bytes);

/*
 * What a fill streams. A move copies its chunk ahead of the fence
 * (WARM: rows flagged EMB_F_WARM, and every table starts tracking what is
 * written from then on, emb_table_track_begin()), then, fenced, sends only
 * the rows written since (DELTA); a table not tracked since the copy, or
 * with rows of the chunk removed meanwhile, is streamed whole. FULL and
 * DELTA end the tracking.
 */
enum emb_server_fill_mode {
	EMB_SERVER_FILL_FULL,
	EMB_SERVER_FILL_WARM,
	EMB_SERVER_FILL_DELTA,
};

int emb_server_fill(struct emb_server *s, const char *host, uint16_t port,
		    uint32_t first, uint32_t n, uint64_t epoch,
		    enum emb_server_fill_mode mode, emb_server_fill_fn done,
		    void *arg);

/* Any thread: every table stops tracking writes for a move (one whose
 * copy ahead was given up). */
void emb_server_untrack(struct emb_server *s);

/*
 * Any thread: no eviction removes rows of the slots in set (a bit per
 * slot, EMB_NSLOTS / 64 words, copied) in any table, present or made
 * later, until the next call: the slots another server writes too
 * (docs/replication.md, "Eviction with one copy").
 */
void emb_server_evict_hold(struct emb_server *s, const uint64_t *set);

/* The slots this server is the primary of in its last map
 * (emb_table_lead() on each table, and on tables made later); any
 * thread. */
void emb_server_lead(struct emb_server *s, const uint64_t *set);

/*
 * Births a promoted backup may not have seen: each table that numbers its
 * rows raises the counters of the slots in set by
 * EMB_SERVER_BIRTH_GAP, so that the rows it makes there from now on are
 * newer than any its old primary made (docs/replication.md, "Eviction
 * with replicas"). Any thread; call it before the map that promotes it
 * takes writes. Returns the tables raised.
 */
#define EMB_SERVER_BIRTH_GAP (1u << 20)
uint32_t emb_server_births_raise(struct emb_server *s, const uint64_t *set);

/* ---- for the metrics collector (src/server/metrics.c) ---- */

struct emb_hist;
struct emb_transport_stats;

/* Event loops, the threads of opts.threads. */
uint32_t emb_server_nloops(const struct emb_server *s);
/* Any thread: the counters of loop i (< emb_server_nloops()). */
void emb_server_loop_stats(struct emb_server *s, uint32_t i,
			   struct emb_transport_stats *out);
/*
 * Any thread: request latency of op (enum emb_lat_op in lat.h),
 * nanoseconds from arrival to reply posted, summed over the loops into
 * the caller's out (reset first).
 */
void emb_server_latency(struct emb_server *s, uint32_t op,
			struct emb_hist *out);

#endif
