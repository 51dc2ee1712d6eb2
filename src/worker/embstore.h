/*
 * src/worker/embstore.h - the embstore client library, for training jobs.
 *
 * A client connects to every server of a cluster and routes each id by a
 * fixed map: id -> one of EMB_NSLOTS virtual slots (common/hash.h) -> server.
 * Batch calls deduplicate ids first, send one request per server in
 * parallel, and put results back in the caller's order.
 *
 * Threads: a client runs its own network thread. Every function here may be
 * called from any thread, concurrently, except emb_client_destroy(), which
 * needs all other calls finished. Blocking calls return an error within the
 * client's timeout when a server dies or hangs, never hang: the timeout is
 * each call's deadline from when it was made, and no retry starts it again
 * (-ETIMEDOUT, or the connection's error if the server refused it; the
 * last error names the server: docs/api.md, Deadlines). A connection
 * that breaks is made again (with backoff) and the requests on it are sent
 * again until the deadline passes, so a server restarted meanwhile is
 * transparent; a push is applied at most once (docs/operations.md,
 * Failure).
 *
 * Errors: every function returning int returns 0 (or a count), or a
 * negative code: a negative errno or an EMB_E* code of the list below
 * (emb_strerror() says what it means, emb_err_name() names it). A call that
 * fails also records the code and a message as the calling thread's last
 * error (emb_last_error()); threads never see each other's.
 *
 * Versions (docs/api.md): EMBSTORE_VERSION_* say which release this header
 * is, emb_version() and emb_version_number() which library runs. A program
 * built against release X.Y.Z runs with any library X.y.z where y.z >= Y.Z.
 *
 * Sized structs: each options struct and each struct the library fills
 * opens with uint32_t struct_size, the bytes of the struct as the caller
 * was compiled with it (its _DEFAULT macro, _init() function or
 * EMB_SIZED() set it). New fields only ever go at the end. The library
 * reads min(struct_size, its own size) bytes of an options struct and
 * takes the rest as 0 (each field's default); it refuses struct_size 0
 * (-EINVAL) and a longer struct whose bytes beyond its own are not all 0
 * (-E2BIG: a newer program asks for something this library cannot do).
 * Into a struct it fills it writes at most struct_size bytes, keeps
 * struct_size, and zeroes what it does not know. No struct has implicit
 * padding: the _pad fields are there to stay 0.
 *
 * The installed embstore.h is this file with the common/ headers named
 * below inlined: it includes libc headers only, and compiles as C11 or
 * C++ (in C++, set defaults with the _init() functions; the _DEFAULT
 * macros are C compound literals).
 */
#ifndef EMBSTORE_H
#define EMBSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "worker/version.h"

#include "common/err.h"
#include "common/init.h"
#include "common/lifecycle.h"
#include "common/optim.h"
#include "common/log.h"
#include "common/tabledef.h"
#include "common/bytes.h" /* emb_bytes_parse(): sizes as flags spell them */

/* ---- versions and the library's own description ---------------------- */

/* The library's release, "MAJOR.MINOR.PATCH" (EMBSTORE_VERSION_STRING of
 * the header it was built with). Static. */
const char *emb_version(void);
/* The library's EMBSTORE_VERSION_NUMBER. */
uint32_t emb_version_number(void);
/*
 * The library's sizeof of a public struct by its bare name
 * ("emb_client_opts"), or 0 for a name it does not know: lets a binding
 * check its mirror of each struct.
 */
size_t emb_struct_size(const char *name);

/*
 * The calling thread's last error: copies its message into buf
 * (NUL-terminated, cut to cap; buf may be NULL) and returns its code, or 0
 * (and "") when no call of this thread has failed yet. Every function of
 * this header that returns a negative code sets it first; a call that
 * succeeds leaves it. The message is the server's text for an error a
 * server reported (e.g. which limit a table creation broke), else a
 * description of what was wrong, else emb_strerror(code).
 */
int emb_last_error(char *buf, size_t cap);

/* A zeroed struct of type T, struct_size set: for the structs the library
 * fills (C only). */
#define EMB_SIZED(T) ((T){.struct_size = sizeof(T)})

struct emb_client;
struct emb_client_table;
struct emb_async;

struct emb_client_opts {
	uint32_t struct_size;	   /* bytes of this struct (sized structs) */
	uint32_t auth_token_len;   /* bytes, <= 256 */
	const char *servers;	   /* "host:port[,host:port...]"; copied */
	const char *transport;	   /* "tcp", "rdma" or "auto": per server,
				      RDMA where both ends have it, else
				      TCP ("tcp,rdma" means auto too) */
	const uint8_t *auth_token; /* sent in HELLO, or NULL; copied */
	const char *name;	   /* shown in server logs; NULL = "embstore" */
	uint32_t timeout_ms;	   /* per call, reconnects included; 0 = 30 s */
	uint32_t part_ids;	   /* most ids per request: a larger batch is
				      split and pipelined; 0 = 1024 */
	uint32_t pull_mode;	   /* enum emb_pull_mode: how pulls reach
				      servers over RDMA; TCP conns always
				      pull two-sided */
	uint32_t loc_cache_rows;   /* onesided: row locations kept per table
				      (24 bytes each); 0 = 2^20 */
};

/*
 * How a pull reaches a server over RDMA (docs/rdma.md). ONESIDED reads rows
 * straight out of the server's table memory with RDMA READs, checks every
 * row by its seal, and pulls two-sided the rows it has no location for or
 * whose read failed the check; it needs a server started with
 * --remote-read (else every row goes two-sided). Pushes are two-sided.
 */
enum emb_pull_mode {
	EMB_PULL_TWOSIDED = 0, /* PULL requests; the server copies the rows */
	EMB_PULL_ONESIDED = 1, /* RDMA READs, two-sided where they fail */
};

#define EMB_CLIENT_OPTS_DEFAULT                                                \
	((struct emb_client_opts){.struct_size =                               \
				      sizeof(struct emb_client_opts),          \
				  .servers = "127.0.0.1:7164",                 \
				  .transport = "tcp",                          \
				  .timeout_ms = 30000,                         \
				  .pull_mode = EMB_PULL_TWOSIDED})
/* Sets *o to EMB_CLIENT_OPTS_DEFAULT. */
void emb_client_opts_init(struct emb_client_opts *o);

/* A table as the cluster knows it. */
struct emb_table_spec {
	uint32_t struct_size;	    /* bytes of this struct (sized structs) */
	uint32_t dim;		    /* floats per row, 1..4096 */
	const char *name;	    /* 1..63 bytes of [A-Za-z0-9_.-] */
	struct emb_optim_cfg optim; /* applied on the servers by push */
	struct emb_init_cfg init;   /* values of rows created by pull */
	uint32_t _pad0;		    /* 0 */
	uint64_t seed;		    /* with the id, decides initial values */
	/* Admission and eviction (common/lifecycle.h, docs/store.md); all
	 * off when zeroed. max_rows is for the whole table: each server
	 * keeps max_rows / servers, rounded up. bloom_bytes is per server. */
	struct emb_lifecycle_cfg life;
	/* Since 0.3: how the servers keep the weights (enum emb_row_format;
	 * 0 = fp32) and round a push's result into them (enum emb_round;
	 * 0 = stochastic). The optimizer computes in fp32 either way. */
	uint32_t row_format;
	uint32_t rounding;
	/* Since 0.3: the servers' device tier (docs/store.md, "The device
	 * tier"): whether each server keeps the rows its memory limit leaves
	 * out on its --tier-dir (enum emb_tier_mode: 0 = as the server was
	 * started, EMB_TIER_OFF = never, EMB_TIER_ON = always, and a server
	 * without one refuses the table with EMB_ENOTIER), and at most how
	 * many bytes of tier file each server gives the table (0 = the
	 * server's --tier-max; the smaller bound holds; rounded up to whole
	 * MiB). The first CREATE decides, as for the row format; checkpoints
	 * keep both. */
	uint32_t tier;
	uint32_t _pad1; /* 0 */
	uint64_t tier_max;
};

/* No name or dim yet; SGD and uniform rows by their defaults; life off. */
#define EMB_TABLE_SPEC_DEFAULT                                                 \
	((struct emb_table_spec){.struct_size = sizeof(struct emb_table_spec), \
				 .optim = EMB_OPTIM_CFG_DEFAULT,               \
				 .init = EMB_INIT_CFG_DEFAULT})
/* Sets *s to EMB_TABLE_SPEC_DEFAULT. */
void emb_table_spec_init(struct emb_table_spec *s);

/*
 * Counters of one table (the list in common/tabledef.h), summed over the
 * servers; row_bytes and step are the largest of any server.
 */
struct emb_client_table_stats {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t servers;     /* servers that answered */
	EMB_TABLE_STATS(EMB_TABLE_STAT_FIELD)
};
/*
 * Under replicas (docs/replication.md) every figure is summed over the
 * live servers, each of which holds copies: rows and bytes count every
 * copy (a pushed row R times, a row only pulled once, on its primary), so
 * they are not the table's distinct rows; pulls count once (they go to
 * primaries), pushes once per copy. servers excludes removed servers.
 */

/* Client-side counters. */
struct emb_client_stats {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t _pad0;	      /* 0 */
	uint64_t requests;    /* requests sent */
	uint64_t bytes_out;   /* bytes sent */
	uint64_t bytes_in;    /* bytes received */
	uint64_t errors;      /* requests that failed */
	uint64_t ids_in;      /* ids given to pull/push */
	uint64_t ids_sent;    /* ids sent after dedup */
	uint64_t retries;     /* requests sent again after a lost connection */
	uint64_t reconnects;  /* connections made again (HELLO included) */
	uint64_t resp_copied; /* RDMA responses that landed in transport
				 memory and were copied (0 when the
				 response buffers are registered) */
	uint64_t rows_read;   /* onesided: rows pulled by RDMA READ whose
				 seal held */
	uint64_t rows_fallback;	   /* onesided: rows pulled two-sided instead
				      (no location yet, seal broken, read
				      failed) */
	uint64_t seal_failures;	   /* onesided: READs whose row failed the
				      check (moved, freed, torn by a push) */
	uint64_t read_conn_losses; /* onesided: read connections lost (a
				      READ of memory the server freed ends
				      its connection) */
};

/*
 * Connects to every server (HELLO included). When the environment has
 * EMB_ADMIN_TOKEN_FILE, the token in that file is presented instead of
 * auth_token, for admin rights (set_mode, drop; docs/operations.md,
 * Security). 0 and *out, or -EINVAL (bad opts or server list, a wrong
 * struct_size, or an admin token file that is empty or over 256 bytes),
 * -E2BIG (opts of a newer header that set a field this library lacks),
 * -errno of reading that file, -ENODEV ("rdma" without a device),
 * EMB_EAUTH, EMB_ETOOMANYCONNS, -ECONNREFUSED, -ETIMEDOUT, -ENOMEM.
 */
int emb_client_create(const struct emb_client_opts *opts,
		      struct emb_client **out);
void emb_client_destroy(struct emb_client *c); /* NULL is a no-op */

uint32_t emb_client_nservers(const struct emb_client *c);
/* "tcp" or "rdma": what the client's connections use; "tcp,rdma" when
 * some use each (transport "auto": per server, RDMA where both ends have
 * it). */
const char *emb_client_transport(const struct emb_client *c);
/*
 * Writes the servers as "host:port,host:port..." (the form emb_client_opts
 * and the embstore tools take) to buf. 0, or -ENOSPC if cap is too small.
 */
int emb_client_servers(const struct emb_client *c, char *buf, size_t cap);
/* The server (0-based, in the order given) that holds id. */
uint32_t emb_client_server_of(const struct emb_client *c, uint64_t id);
/* Fills *out (caller sets out->struct_size). 0, or -EINVAL (struct_size). */
int emb_client_stats(struct emb_client *c, struct emb_client_stats *out);

/*
 * The calling thread's last error, as emb_last_error() (c is not used and
 * may be NULL): kept for programs written when the last error was the
 * client's. Any thread.
 */
int emb_client_last_error(struct emb_client *c, char *buf, size_t cap);

/*
 * Creates the table on every server, or opens it where an identical one
 * exists (so every worker may call this). 0 and a handle in *out, or
 * -EINVAL or -E2BIG (spec->struct_size), EMB_ETABLEEXISTS (same name,
 * other spec), EMB_EBADDIM, EMB_EBADNAME, EMB_EBADOPTIM, EMB_EBADINIT,
 * EMB_EBADLIFE, EMB_ETOOMANYTABLES, -EOPNOTSUPP (an eviction policy under
 * replicas: backups see no pulls; admission is replicated,
 * docs/replication.md), or a transport error. A table that exists keeps its
 * admission and eviction, unless it has none: then it takes spec->life
 * (docs/protocol.md).
 */
int emb_client_table_create(struct emb_client *c,
			    const struct emb_table_spec *spec,
			    struct emb_client_table **out);
/* Opens an existing table by name: 0, or EMB_ENOTABLE if a server lacks it. */
int emb_client_table_open(struct emb_client *c, const char *name,
			  struct emb_client_table **out);
/* Frees the handle (the table stays on the servers). NULL is a no-op. */
void emb_client_table_close(struct emb_client_table *t);
/*
 * Drops the table on every server; the handle stays to be closed. 0,
 * EMB_ENOADMIN (the server has an admin token this client did not
 * present), EMB_ENOTABLE, or a transport error.
 */
int emb_client_table_drop(struct emb_client_table *t);

uint32_t emb_client_table_dim(const struct emb_client_table *t);
/* 4-byte words of a whole row, the row size of pull and assign with
 * state: the weights in the table's row format (dim floats for fp32), then
 * the optimizer's state floats. */
uint32_t emb_client_table_row_floats(const struct emb_client_table *t);
/* 4-byte words of a row's weights in the table's format: the row size of
 * a pull with EMB_CLIENT_RAW (dim for an fp32 table). */
uint32_t emb_client_table_weight_words(const struct emb_client_table *t);
const struct emb_table_spec *
emb_client_table_spec(const struct emb_client_table *t);

#define EMB_CLIENT_NOCREATE 0x1u /* pull: report missing ids, create none */
/* pull: whole rows, weights then optimizer state (row_floats each) */
#define EMB_CLIENT_WITH_STATE 0x2u
/* pull: weights in the table's row format, as the servers keep and send
 * them (emb_client_table_weight_words() words each), not decoded to f32 */
#define EMB_CLIENT_RAW 0x4u

/*
 * Gathers the rows of ids[0..n) into out[i * dim ...] (duplicates allowed;
 * each distinct id crosses the network once). Missing rows are created on
 * the servers, or with EMB_CLIENT_NOCREATE returned as zeros with found[i]
 * = 0 (found may be NULL). A compact table's rows (fp16, bf16, int8) cross
 * the network as the servers keep them and are decoded to f32 here, or
 * with EMB_CLIENT_RAW handed out as they are. With EMB_CLIENT_WITH_STATE
 * each row is emb_client_table_row_floats() words, out[i * row_floats
 * ...]: the weights in the table's format, then the optimizer state
 * (common/optim.h), as assign with state takes them back. 0, or the first
 * error of any server.
 */
int emb_client_table_pull(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, float *out, uint32_t flags,
			  uint8_t *found);

/*
 * Gradients this handle's pushes send: EMB_ROWFMT_FP32 (the default), or
 * EMB_ROWFMT_FP16 or _BF16 (half the bytes on the wire), rounded to
 * nearest on the client after duplicates are summed; the servers widen
 * them back to f32. A gradient out of fp16's range fails the push with
 * EMB_ENONFINITE, nothing sent. Synchronous tables take f32 only (their
 * pushes fail with EMB_EBADFORMAT). 0, or EMB_EBADFORMAT for another
 * format. Set it before pushes are in flight.
 */
int emb_client_table_set_push_format(struct emb_client_table *t,
				     uint32_t fmt);

/*
 * Sends gradients grads[i * dim ...] for ids[0..n); duplicates are summed
 * on the client first. step and rank are carried for synchronous and
 * bounded-staleness training (0 where unused). 0, or the first error.
 * Under replicas, a table with admission that this handle created or set
 * the policy of first asks the slots' primaries which ids are rows and
 * pushes just those (docs/replication.md, "Admission with replicas"; the
 * async and many calls wait for the ask); a handle that did not know of
 * the policy gets EMB_EADMITASK from every holder, nothing applied, and
 * asks from then on (this synchronous call pushes again at once).
 */
int emb_client_table_push(struct emb_client_table *t, const uint64_t *ids,
			  uint32_t n, const float *grads, uint64_t step,
			  uint32_t rank);

/*
 * Overwrites rows: rows[i * stride ...], stride = dim f32 weights (the
 * servers round them to nearest into a compact table's format), or
 * row_floats words with with_state (whole rows in the table's format, as
 * pull with state gives them). 0, or the first error.
 */
int emb_client_table_assign(struct emb_client_table *t, const uint64_t *ids,
			    uint32_t n, const float *rows, bool with_state);

/* Removes ids; *erased (may be NULL) gets how many existed. */
int emb_client_table_erase(struct emb_client_table *t, const uint64_t *ids,
			   uint32_t n, uint64_t *erased);

/*
 * Sets the table's training mode on every server (enum emb_mode in
 * src/proto/wire.h): EMB_MODE_ASYNC applies each push on arrival; EMB_MODE_SYNC
 * averages the pushes of `workers` workers per step and applies them once,
 * acknowledging each worker's push only then (so every worker's next pull
 * sees the step); EMB_MODE_STALE discards pushes whose step is more than
 * `staleness` behind the newest. Every worker calls it with the same values
 * (a repeat is a no-op) before its first push, and passes its step and rank
 * to push. 0, EMB_EBADARG (bad combination), -EBUSY (a synchronous step is
 * half gathered), EMB_ENOADMIN (the server has an admin token and this
 * client did not present it), or a transport error.
 */
int emb_client_table_set_mode(struct emb_client_table *t, uint32_t mode,
			      uint32_t workers, uint32_t staleness);

/*
 * Replaces the table's admission and eviction on every server, online
 * (max_rows split as for create; all off turns them off). 0, EMB_EBADLIFE,
 * -EOPNOTSUPP (an eviction policy under replicas),
 * EMB_ENOADMIN (the server has an admin token this client did not
 * present), EMB_EMEMLIMIT (a Bloom filter does not fit), or a transport
 * error; servers that failed keep their old policy.
 */
int emb_client_table_set_lifecycle(struct emb_client_table *t,
				   const struct emb_lifecycle_cfg *life);

/*
 * The table's counters summed over its servers, into *out (caller sets
 * out->struct_size; -EINVAL if it is wrong) (see struct
 * emb_client_table_stats for what they mean under replicas). Like create,
 * open, drop and set_mode it goes to every server of the map, less those
 * the map has removed while the live ones still hold every slot; when some
 * slot has no live holder left these calls fail with EMB_ENODEAD
 * (emb_last_error() says which server and how many slots).
 */
int emb_client_table_stats(struct emb_client_table *t,
			   struct emb_client_table_stats *out);

/*
 * Asynchronous pull and push: same arguments, but return at once with a
 * handle; every buffer stays borrowed until emb_async_wait() returns. 0 and
 * *op, or an argument error (then no handle).
 */
int emb_client_table_pull_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, float *out, uint32_t flags,
				uint8_t *found, struct emb_async **op);
int emb_client_table_push_async(struct emb_client_table *t, const uint64_t *ids,
				uint32_t n, const float *grads, uint64_t step,
				uint32_t rank, struct emb_async **op);

/*
 * One table's part of a call over several tables (a sized struct: set
 * struct_size, e.g. with EMB_SIZED(struct emb_table_batch)). rows: pull,
 * out[i * stride ...] filled as emb_client_table_pull() fills it; push,
 * the gradients (only read). found: pull with EMB_CLIENT_NOCREATE, as for
 * emb_client_table_pull() (may be NULL); push ignores it.
 */
struct emb_table_batch {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t n;	      /* ids in ids[] */
	struct emb_client_table *table; /* a table of the calling client */
	const uint64_t *ids;
	float *rows;
	uint8_t *found;
};

/* Most entries in one pull_many or push_many call. */
#define EMB_CLIENT_MANY_MAX 4096u

/*
 * The pulls of b[0..nb) (every table of a step), all in flight at once:
 * each entry is pulled exactly as emb_client_table_pull(entry, flags)
 * would, but the entries' parts for one server travel in one PULL_MANY
 * frame (docs/protocol.md) where the server offers it, so a step over many
 * tables costs one request and round trip per server. The stride is
 * b[0].struct_size and every entry must have the same. 0, or the first
 * error in entry order (the last error's message is that entry's; rows of
 * the other entries may be filled); EMB_EBADARG for a NULL or foreign
 * table, nb > EMB_CLIENT_MANY_MAX or an entry's bad arguments (no entry
 * is then waited for beyond those started before it, which are).
 */
int emb_client_pull_many(struct emb_client *c, const struct emb_table_batch *b,
			 size_t nb, uint32_t flags);

/*
 * The pushes of b[0..nb), as emb_client_table_push(entry, step, rank) for
 * each, all in flight at once (one PUSH per entry and server, sent back to
 * back, so the step waits about one round trip): each keeps every
 * guarantee of a single push
 * (applied at most once across retries, forwarded to backups, refused
 * whole if not finite). An entry that fails does not undo the others. 0,
 * or the first error in entry order, as for emb_client_pull_many().
 */
int emb_client_push_many(struct emb_client *c, const struct emb_table_batch *b,
			 size_t nb, uint64_t step, uint32_t rank);

/* Waits for op, frees it, and returns its status. */
int emb_async_wait(struct emb_async *op);
/* True once op has finished (emb_async_wait will not block). */
bool emb_async_done(struct emb_async *op);

/* ---- cluster: joining through a scheduler -------------------------------
 *
 * In a cluster (docs/cluster.md) a scheduler hands out ranks and the slot
 * map, and the environment says where it is: EMB_SCHED_HOST, EMB_SCHED_PORT
 * (MindSpore's MS_SCHED_HOST and MS_SCHED_PORT are accepted too),
 * EMB_HEARTBEAT_TIMEOUT and EMB_CLUSTER_TIMEOUT in seconds. A trainer
 * started by `embstore launch` or the scripts of docs/deploy.md needs
 * nothing else.
 */

/*
 * Joins the cluster as a worker: registers with the scheduler, waits until
 * every server and worker joined (EMB_CLUSTER_TIMEOUT), then connects to
 * the servers of the cluster map. opts may be NULL (defaults, with the
 * transport taken from EMB_TRANSPORT if set); its servers field is
 * ignored. The auth token (opts', or else the file EMB_AUTH_TOKEN_FILE
 * names) goes to the scheduler and to every server. While the client lives, a
 * thread pings the scheduler; when the scheduler declares a server dead, calls
 * to it fail with EMB_ENODEAD instead of waiting. 0 and *out, or -EINVAL
 * (environment incomplete or malformed: the variable is logged), -ETIMEDOUT,
 * -ECONNREFUSED (no scheduler), EMB_ECLUSTER (cluster full), EMB_ENODEAD,
 * EMB_ENOSCHED, or an error of emb_client_create().
 */
int emb_client_from_env(const struct emb_client_opts *opts,
			struct emb_client **out);

/*
 * Asks the scheduler at sched ("host:port") for the servers of its formed
 * cluster without joining it (for tools that observe a cluster) and writes
 * them, by rank, as "host:port,host:port..." to buf. 0, or EMB_ECLUSTER
 * (still forming), -ENOSPC (cap too small), -EINVAL (bad address), or a
 * connection error.
 */
int emb_cluster_servers(const char *sched, char *buf, size_t cap);
/*
 * As emb_cluster_servers(), logging in to a scheduler that requires a
 * token first (token[0..token_len), borrowed; 0 = no HELLO). Adds
 * EMB_EAUTH (wrong token) and EMB_ENOHELLO (a token is required).
 */
int emb_cluster_servers_auth(const char *sched, const uint8_t *token,
			     uint32_t token_len, char *buf, size_t cap);

/*
 * Asks the scheduler at sched ("host:port") to drain server rank of its
 * running replicated job (docs/replication.md, "Moving slots"): the
 * server's slots move to the others while training goes on, then it
 * leaves and exits 0. token as for emb_cluster_servers_auth(). Returns
 * once the drain is queued (asking twice is no error): 0, EMB_EBADARG (no
 * such rank), EMB_ECLUSTER (not running, unreplicated, or too few servers
 * would stay for the copies: the scheduler's reason in why[0..why_cap) if
 * why is not NULL), EMB_ENODEAD (a dead server), or a connection error.
 */
int emb_cluster_drain(const char *sched, const uint8_t *token,
		      uint32_t token_len, uint32_t rank, char *why,
		      size_t why_cap);

/* Kinds of emb_cluster_moves(). */
#define EMB_MOVE_NONE	  0u /* nothing moves */
#define EMB_MOVE_JOIN	  1u /* a server is given its share */
#define EMB_MOVE_DRAIN	  2u /* a server's slots move off it */
#define EMB_MOVE_RECOVERY 3u /* a server is filled with the copies a death
				left short */

/* What a scheduler moves now (sized struct: EMB_SIZED()). */
struct emb_cluster_moves {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t kind;	      /* EMB_MOVE_* */
	uint32_t rank;	      /* the server joining, draining or filled */
	uint32_t phase;	      /* its chunk under way: 0 none, 1 copied
				 ahead (training goes on), 2 fenced */
	uint32_t first;	      /* that chunk's first slot */
	uint32_t n;	      /* its slots; 0 when none is under way */
	uint32_t from;	      /* rank whose place it takes, or UINT32_MAX */
	uint32_t to;	      /* rank it goes to, or UINT32_MAX */
	uint32_t moved;	      /* slots the drain or join moved so far */
	uint32_t left;	      /* slots it has still to move */
	uint32_t queued;      /* drains and joins waiting behind it */
	uint32_t _pad;
	uint64_t elapsed_ms;  /* since it began */
	int64_t eta_ms;	      /* time left at its rate so far, or -1 */
	uint64_t rows;	      /* rows its sources streamed so far (copies
				 ahead and fenced streams: a row written
				 during its copy ahead counts again); 0
				 from a scheduler or servers older than
				 this field */
	uint64_t bytes;	      /* their bytes: ids and floats as sent */
};

/*
 * Asks the scheduler at sched ("host:port") what it moves now: the drain,
 * join or recovery under way, its chunk and progress (embstore stat
 * --sched shows it). token as for emb_cluster_servers_auth(). 0 and *out
 * (caller sets out->struct_size), -EINVAL, -EOPNOTSUPP (a scheduler that
 * does not answer it), or a connection error.
 */
int emb_cluster_moves(const char *sched, const uint8_t *token,
		      uint32_t token_len, struct emb_cluster_moves *out);

/*
 * What a job kept in etcd moves now, as emb_cluster_moves() for a
 * scheduler's: coordinator is "etcd://HOST:PORT[,HOST:PORT...]", job the
 * job's name (NULL: "embstore"). elapsed_ms is counted with the wall
 * clocks of the job's leader and of the caller (embstore stat
 * --coordinator shows it). 0 and *out (caller sets out->struct_size),
 * -EINVAL, EMB_ECLUSTER (no such job, or not formed yet), or an etcd
 * error (EMB_ENOETCD, EMB_EETCD).
 */
int emb_coordinator_moves(const char *coordinator, const char *job,
			  struct emb_cluster_moves *out);

/*
 * A client for observing the cluster of the scheduler at sched
 * ("host:port") without joining it: its map, replicas and removed servers
 * included, connected to the live servers only, so it works after a
 * failover (`embstore stat --sched`). opts as for emb_client_create(), but
 * opts->servers is ignored. The map is the one of the moment; later
 * deaths are not followed. Since 0.3, a server of the map it cannot reach
 * (dead, but kept in the map because its slots lost every copy) does not
 * fail the create: that server's calls fail at once with the connect's
 * error, each after one more try; the create fails when no server can be
 * reached, or when one answers and refuses (a bad token). Errors as
 * emb_cluster_servers_auth() and emb_client_create().
 */
int emb_client_from_sched(const struct emb_client_opts *opts, const char *sched,
			  struct emb_client **out);

/*
 * The same for a job kept in etcd (coordinator and job as for
 * emb_coordinator_moves()): its servers and map from the job's keys,
 * connected to the servers that hold its slots now. Errors as
 * emb_coordinator_moves() and emb_client_create().
 */
int emb_client_from_coordinator(const struct emb_client_opts *opts,
				const char *coordinator, const char *job,
				struct emb_client **out);

/* The client's cluster map (docs/replication.md). */
struct emb_client_map {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t replicas;    /* copies of each slot; 1 = unreplicated */
	uint64_t epoch;	      /* 1, then +1 per server removed */
	uint32_t nservers;    /* servers, removed ones included */
	uint32_t lost_slots;  /* slots with no live copy left */
};
/* Fills *out (caller sets out->struct_size). 0, or -EINVAL (struct_size). */
int emb_client_map(struct emb_client *c, struct emb_client_map *out);
/*
 * The live holders of slot (< EMB_NSLOTS) in out[0..cap), primary first,
 * then the backups in the order they take over. Returns how many there
 * are (0 for a lost slot; may exceed cap), or EMB_EBADARG.
 */
int emb_client_slot_holders(struct emb_client *c, uint32_t slot, uint32_t *out,
			    uint32_t cap);
/*
 * The server being filled with slot during a recovery (docs/replication.md:
 * it takes the slot's writes, is not read from, and becomes its last
 * backup once every row reached it), or -1 (none, or EMB_EBADARG).
 */
int emb_client_slot_filling(struct emb_client *c, uint32_t slot);
/* True when server (< emb_client_nservers()) was removed from the map. */
bool emb_client_server_removed(const struct emb_client *c, uint32_t server);

/* This worker's rank, 0..nworkers-1; 0 for a client made without one. */
uint32_t emb_client_rank(const struct emb_client *c);
/* Workers in the cluster; 1 for a client made without a scheduler. */
uint32_t emb_client_nworkers(const struct emb_client *c);

/*
 * Blocks until every worker of the cluster called emb_client_barrier()
 * with the same name (1..63 bytes); a name may be used again once a
 * barrier completed. 0, or -EINVAL (bad name), EMB_ENODEAD (a node died:
 * the barrier can never complete), EMB_ENOSCHED (scheduler lost or the
 * client has none).
 */
int emb_client_barrier(struct emb_client *c, const char *name);

/*
 * Tells the scheduler this worker is done (Paddle's fleet.stop_worker()).
 * Once every worker has, the servers stop and exit 0, and so does the
 * scheduler. Returns without waiting for the others; destroy the client
 * afterwards. 0, or EMB_ENOSCHED, EMB_ENODEAD.
 */
int emb_client_finish(struct emb_client *c);

/* ---- cached tables: a worker-side vocab cache over a table ---------------
 *
 * A cached table keeps the hot rows of one table on the worker in a pool of
 * capacity rows (MindSpore's vocab_cache_size), fetches the rows of the next
 * prefetch_depth batches while the trainer computes, and sends updates back
 * (docs/cache.md). By default the optimizer runs on the worker and updated
 * rows go back with their optimizer state when evicted or flushed
 * (write-back): exact for rows this worker alone updates, last writer wins
 * for rows several workers update, refused on synchronous tables. Or
 * gradients go to the servers every step (write-through; cached rows may lag
 * by staleness_steps of this table's steps, 0 by default: exact in every
 * training mode, but then every row is fetched again each step).
 *
 * Threads: a cached table belongs to one trainer thread; every call on it
 * comes from that thread. Its fetches run on the client's network thread.
 * Several cached tables (one per trainer thread) may share a client.
 *
 * A step: lookup(batch b), prefetch(batch b + k), forward and backward,
 * push_grads(); prefetch batches 0..k-1 first and flush() at the end.
 */
struct emb_cached_table;

enum emb_cached_mode {
	EMB_CACHED_WRITE_THROUGH = 0, /* push every step, servers optimize */
	EMB_CACHED_WRITE_BACK = 1,    /* optimize here, write rows back */
};

enum emb_cached_policy {
	EMB_CACHED_LRU = 0,	/* evict the least recently used row */
	EMB_CACHED_CLOCK = 1,	/* second chance: less work per hit */
	EMB_CACHED_TINYLFU = 2, /* W-TinyLFU: a new row replaces a cached one
				   only if it was asked for more often
				   lately; the best hit ratio (default) */
};

struct emb_cached_table_opts {
	uint32_t struct_size;	  /* bytes of this struct (sized structs) */
	uint32_t capacity;	  /* rows the cache holds, >= 1 */
	uint32_t max_batch;	  /* most ids per batch, duplicates counted */
	uint32_t prefetch_depth;  /* batches fetched ahead, 0..64 */
	uint32_t staleness_steps; /* write-through: most steps of this table
				     a used row may lag its fetch */
	uint32_t mode;		  /* enum emb_cached_mode; write-back needs a
				     table not in EMB_MODE_SYNC */
	uint32_t policy;	  /* enum emb_cached_policy */
	uint32_t rank;		  /* passed to push (synchronous tables) */
};

#define EMB_CACHED_TABLE_OPTS_DEFAULT                                          \
	((struct emb_cached_table_opts){                                       \
	    .struct_size = sizeof(struct emb_cached_table_opts),               \
	    .capacity = 1u << 16,                                              \
	    .max_batch = 4096,                                                 \
	    .prefetch_depth = 2,                                               \
	    .staleness_steps = 0,                                              \
	    .mode = EMB_CACHED_WRITE_BACK,                                     \
	    .policy = EMB_CACHED_TINYLFU})
/* Sets *o to EMB_CACHED_TABLE_OPTS_DEFAULT. */
void emb_cached_table_opts_init(struct emb_cached_table_opts *o);

/* Counters since create; hits and misses count distinct ids per batch. */
struct emb_cached_table_stats {
	uint32_t struct_size;	/* bytes of this struct (sized structs) */
	uint32_t _pad0;		/* 0 */
	uint64_t lookups;	/* batches looked up */
	uint64_t hits;		/* distinct ids served from the cache */
	uint64_t misses;	/* distinct ids that had to be fetched */
	double hit_ratio;	/* hits / (hits + misses); 0 before any */
	uint64_t refetches;	/* write-through: rows older than allowed */
	uint64_t evictions;	/* rows dropped to make room */
	uint64_t write_backs;	/* rows written back (evictions, flushes) */
	uint64_t pushes;	/* gradient pushes sent */
	uint64_t fetch_calls;	/* pulls sent for misses */
	uint64_t sync_fetches;	/* of those, started by lookup itself */
	uint64_t rows_fetched;	/* rows those pulls asked for */
	uint64_t bytes_fetched; /* row bytes pulled */
	uint64_t bytes_written; /* gradient and written-back row bytes */
	uint64_t stalls;	/* lookups that waited for rows */
	uint64_t wait_ns;	/* ns lookups spent waiting */
	uint32_t rows;		/* rows cached now */
	uint32_t dirty;		/* write-back: rows not yet written back */
};

/*
 * Puts a cache over t, which the cached table borrows (close t after
 * destroying it). Allocates everything here. 0 and *out, or -EINVAL or
 * -E2BIG (opts->struct_size), EMB_EBADARG (a
 * zero size, unknown mode or policy, depth > 64, write-back over a table
 * this client set to EMB_MODE_SYNC), EMB_EBADOPTIM (write-back with an
 * optimizer the worker cannot run) or -ENOMEM.
 */
int emb_cached_table_create(struct emb_client_table *t,
			    const struct emb_cached_table_opts *opts,
			    struct emb_cached_table **out);

/*
 * Waits for fetches in flight and frees the cache. Rows not yet written
 * back are lost: call emb_cached_table_flush() first. NULL is a no-op.
 */
void emb_cached_table_destroy(struct emb_cached_table *ct);

/*
 * Queues ids[0..n) (borrowed for the call) as a coming batch and starts
 * pulling its misses. 0, or -EINVAL (n > max_batch), -EBUSY (depth batches
 * queued), EMB_ECACHEFULL (not queued: lookup will fetch it itself) or
 * EMB_EWRITEBACK. A failed pull surfaces in the batch's lookup.
 */
int emb_cached_table_prefetch(struct emb_cached_table *ct, const uint64_t *ids,
			      uint32_t n);

/*
 * Gives the weights of ids[0..n) in out[i * dim ...] (caller-owned),
 * waiting only for rows still being pulled; the batch becomes the current
 * one for push_grads. A batch equal to the oldest queued one uses its
 * prefetch. 0, or -EINVAL, EMB_ECACHEFULL (more distinct ids than the
 * cache can pin), EMB_EFETCH (a pull failed: a server died, timed out or
 * refused; the cause is logged) or EMB_EWRITEBACK.
 */
int emb_cached_table_lookup(struct emb_cached_table *ct, const uint64_t *ids,
			    uint32_t n, float *out);

/*
 * Applies grads[i * dim ...] for the positions of the last looked-up batch
 * (duplicates are summed): write-through pushes them to the servers and
 * returns once they are applied there; write-back runs the table's
 * optimizer on the cached rows. 0, or -EINVAL (no current batch),
 * EMB_EPUSH (the push failed; logged) or EMB_EBADARG (write-back, and the
 * table was set to EMB_MODE_SYNC since create: nothing applied, as local
 * updates would bypass the step's averaging).
 */
int emb_cached_table_push_grads(struct emb_cached_table *ct,
				const float *grads);

/*
 * Write-back: stores every updated row, with its optimizer state, on the
 * servers. 0 (also in write-through mode, where it does nothing) or
 * EMB_EWRITEBACK. Call it at the end of training and before a dump.
 */
int emb_cached_table_flush(struct emb_cached_table *ct);

/* Drops queued prefetches and the current batch (e.g. at an epoch end). */
void emb_cached_table_cancel(struct emb_cached_table *ct);

/* Fills *out (caller sets out->struct_size). 0, or -EINVAL (struct_size). */
int emb_cached_table_stats(const struct emb_cached_table *ct,
			   struct emb_cached_table_stats *out);

/* ---- administration (worker/admin.c) ------------------------------------ */

/* One table on one server, as emb_client_server_stats() reports it. */
struct emb_client_server_table {
	uint32_t struct_size; /* bytes of this struct (sized structs) */
	uint32_t server;      /* index into the client's server list */
	char name[64];	      /* table name, NUL-terminated */
	uint32_t dim;	      /* weights per row */
	uint32_t row_format;  /* enum emb_row_format (0 from servers before
				 row formats) */
	EMB_TABLE_STATS(EMB_TABLE_STAT_FIELD) /* common/tabledef.h */
};

/*
 * Every table of every server with its counters, per server rather than
 * summed (for monitoring: `embstore stat`). out[0].struct_size is the size
 * of every entry (the array's stride; set it in each, EMB_SIZED()). Writes
 * up to cap entries to out, by server then in each server's order, and returns
 * how many there are (call again with more room if that exceeds cap), or
 * EMB_EBADARG, -EINVAL (struct_size), or a transport or server error. A table
 * created or dropped meanwhile may be missing or show zero counters.
 */
int emb_client_server_stats(struct emb_client *c,
			    struct emb_client_server_table *out, uint32_t cap);

/*
 * Since 0.3: emb_client_server_stats() over the servers that answer, for
 * watching a job in trouble (`embstore stat`): a server that cannot be
 * reached or read gets its error in err[s] and none of its entries in out;
 * err[s] is 0 for the others and for servers the map removed (not asked).
 * err has nerr >= emb_client_nservers(c) entries. Returns as
 * emb_client_server_stats(), failing only when no server answered (with
 * the first one's error). With a client from emb_client_from_sched() or
 * emb_client_from_coordinator(), a server of the map that cannot be
 * reached fails its part at once; with any other, at the call's deadline.
 */
int emb_client_server_stats_each(struct emb_client *c,
				 struct emb_client_server_table *out,
				 uint32_t cap, int *err, uint32_t nerr);

#ifdef __cplusplus
}
#endif

#endif
