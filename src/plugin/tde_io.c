/*
 * src/plugin/tde_io.c - libembstore_tde: TorchRec dynamic embedding's IO
 * plugin (tde_io.h) over libembstore, so a TorchRec job keeps the rows TDE
 * evicts from the GPU on embstore servers instead of Redis.
 *
 * Layout on the servers: each (TDE table, column, state) is one embstore
 * table, "<prefix><table>.c<column>.s<state>", whose dim is the blob's size
 * in floats. It is made at the first push that stores such blobs (SGD,
 * zero initializer: the servers only ever assign and read these rows) and
 * hashed over the servers by id like any table, so a pull of a batch is
 * one request per server per (column, state). Reads never create rows:
 * an id never pushed is reported as not stored (NULL, 0), as TDE expects.
 *
 * Failures: the interface has no way to report one (TDE's callbacks only
 * say done), and reporting a failed push as complete would lose rows TDE
 * has already dropped from the GPU. So a call that fails is retried (a
 * replicated cluster recovers from a server's death within seconds) for up
 * to retry_ms, and then the process is stopped with a message saying why
 * (abort()), as TDE's own plugins stop it with an exception. Errors that no
 * retry can mend (a blob that is no whole number of floats, blobs of one
 * column and state of different sizes, a table name embstore cannot hold)
 * stop it at once.
 *
 * Threads: IO_Pull and IO_Push may run concurrently on one instance (the
 * client library is thread-safe); the table handles are kept under mu.
 */
#include "plugin/tde_io.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <embstore.h>

#include "common/token.h"

#define PFX "embstore TDE plugin: "
#define NAME_MAX_LEN 63 /* embstore table names: 1..63 bytes */

/* An embstore table this instance has opened or made. */
struct tab {
	char name[NAME_MAX_LEN + 1];
	struct emb_client_table *t;
};

struct tde_io {
	struct emb_client *c;
	char prefix[32];   /* of every table name */
	uint32_t retry_ms; /* how long a failing call is tried again */
	pthread_mutex_t mu; /* tabs */
	struct tab *tabs;
	size_t ntabs, cap;
};

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(PFX, stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The library's message for the call that just failed on this thread. */
static const char *why(int rc, char *buf, size_t cap)
{
	if (emb_last_error(buf, cap) != rc || !buf[0])
		snprintf(buf, cap, "%s", emb_strerror(rc));
	return buf;
}

/* Whether a later try may succeed: the cluster, not the request, failed. */
static bool retryable(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -ECONNRESET ||
	       rc == -EPIPE || rc == EMB_ECLOSED || rc == EMB_ENODEAD ||
	       rc == EMB_EMOVING || rc == EMB_ECLUSTER;
}

/* ---- configuration -------------------------------------------------- */

/*
 * cfg: "HOST:PORT[,HOST:PORT...][/?KEY=VALUE[&KEY=VALUE...]]", what TDE
 * passes after "embstore://". Keys: prefix (of the table names, default
 * "tde."), timeout_ms (per call, default 30000), retry_ms (default 60000),
 * token_file, transport (tcp, rdma or auto; default auto).
 */
static int parse_cfg(struct tde_io *io, const char *cfg,
		     struct emb_client_opts *o, char **servers,
		     uint8_t *token, char *transport, size_t tcap)
{
	const char *q = strstr(cfg, "/?");
	size_t slen = q ? (size_t)(q - cfg) : strlen(cfg);
	char *rest, *kv, *save = NULL;
	int rc = 0;

	if (slen && cfg[slen - 1] == '/')
		slen--; /* "host:port/" */
	if (!slen) {
		fprintf(stderr, PFX "config \"%s\": no servers (want "
				"HOST:PORT[,HOST:PORT...][/?key=value&...])\n",
			cfg);
		return -EINVAL;
	}
	*servers = strndup(cfg, slen);
	rest = strdup(q ? q + 2 : "");
	if (!*servers || !rest) {
		free(rest);
		return -ENOMEM;
	}
	for (kv = strtok_r(rest, "&", &save); kv && !rc;
	     kv = strtok_r(NULL, "&", &save)) {
		char *eq = strchr(kv, '='), *end;
		unsigned long v;

		if (!eq) {
			fprintf(stderr, PFX "config: \"%s\" is not key=value\n",
				kv);
			rc = -EINVAL;
			break;
		}
		*eq++ = '\0';
		if (strcmp(kv, "prefix") == 0) {
			if (strlen(eq) >= sizeof(io->prefix)) {
				fprintf(stderr, PFX "config: prefix longer "
						"than %zu bytes\n",
					sizeof(io->prefix) - 1);
				rc = -EINVAL;
			} else {
				strcpy(io->prefix, eq);
			}
		} else if (strcmp(kv, "timeout_ms") == 0 ||
			   strcmp(kv, "retry_ms") == 0) {
			errno = 0;
			v = strtoul(eq, &end, 10);
			if (errno || !*eq || *end || v == 0 || v > 86400000) {
				fprintf(stderr, PFX "config: %s=%s: want 1.."
						"86400000 ms\n",
					kv, eq);
				rc = -EINVAL;
			} else if (kv[0] == 't') {
				o->timeout_ms = (uint32_t)v;
			} else {
				io->retry_ms = (uint32_t)v;
			}
		} else if (strcmp(kv, "token_file") == 0) {
			rc = emb_token_read_file(eq, token, &o->auth_token_len);
			if (rc)
				fprintf(stderr, PFX "config: token_file %s: %s\n",
					eq, strerror(-rc));
			o->auth_token = token;
		} else if (strcmp(kv, "transport") == 0) {
			snprintf(transport, tcap, "%s", eq);
			o->transport = transport;
		} else {
			fprintf(stderr, PFX "config: unknown key \"%s\" (keys: "
					"prefix, timeout_ms, retry_ms, "
					"token_file, transport)\n",
				kv);
			rc = -EINVAL;
		}
	}
	free(rest);
	return rc;
}

/* ---- the five symbols ------------------------------------------------ */

const char *IO_type = "embstore";

void *IO_Initialize(const char *cfg)
{
	struct emb_client_opts o;
	uint8_t token[EMB_TOKEN_MAX];
	char transport[16], buf[512];
	char *servers = NULL;
	struct tde_io *io;
	int rc;

	if (!cfg)
		return NULL;
	io = calloc(1, sizeof(*io));
	if (!io)
		return NULL;
	strcpy(io->prefix, "tde.");
	io->retry_ms = 60000;
	pthread_mutex_init(&io->mu, NULL);
	emb_client_opts_init(&o);
	o.name = "embstore-tde";
	o.transport = "auto";
	rc = parse_cfg(io, cfg, &o, &servers, token, transport,
		       sizeof(transport));
	if (!rc) {
		o.servers = servers;
		rc = emb_client_create(&o, &io->c);
		if (rc)
			fprintf(stderr, PFX "cannot connect to %s: %s\n",
				servers, why(rc, buf, sizeof(buf)));
	}
	free(servers);
	if (rc) {
		pthread_mutex_destroy(&io->mu);
		free(io);
		return NULL;
	}
	return io;
}

void IO_Finalize(void *instance)
{
	struct tde_io *io = instance;

	if (!io)
		return;
	for (size_t i = 0; i < io->ntabs; i++)
		emb_client_table_close(io->tabs[i].t);
	free(io->tabs);
	emb_client_destroy(io->c);
	pthread_mutex_destroy(&io->mu);
	free(io);
}

/* "<prefix><table>.c<col>.s<state>", or die: a name embstore cannot hold
 * would fail every call alike. */
static void tab_name(const struct tde_io *io, const char *table, int64_t col,
		     uint32_t state, char *out)
{
	int n = snprintf(out, NAME_MAX_LEN + 1, "%s%s.c%" PRId64 ".s%u",
			 io->prefix, table, col, state);

	if (n < 0 || n > NAME_MAX_LEN)
		die("table name \"%s%s.c%" PRId64 ".s%u\" is longer than %d "
		    "bytes: use a shorter TDE table name or prefix",
		    io->prefix, table, col, state, NAME_MAX_LEN);
}

/*
 * After a call on table name failed with rc: returns to try it again after
 * a pause while the cluster may still recover (until the deadline), or
 * stops the process (the top of this file says why).
 */
static void again_or_die(int rc, int64_t until, const char *what,
			 const char *name)
{
	char buf[512];

	if (!retryable(rc) || now_ms() >= until)
		die("%s %s: %s", what, name, why(rc, buf, sizeof(buf)));
	usleep(100 * 1000);
}

/* The handle of table name if this instance has it, else NULL (mu held). */
static struct emb_client_table *tab_find(const struct tde_io *io,
					 const char *name)
{
	for (size_t i = 0; i < io->ntabs; i++)
		if (strcmp(io->tabs[i].name, name) == 0)
			return io->tabs[i].t;
	return NULL;
}

/*
 * The table named name: dim 0 opens it if it exists (NULL if not), else it
 * is made with dim floats per row if missing. Dies on what no retry mends.
 * The network calls run without mu, so other tables' calls go on; of two
 * threads that opened one table, the first kept its handle.
 */
static struct emb_client_table *tab_get(struct tde_io *io, const char *name,
					uint32_t dim)
{
	int64_t until = now_ms() + io->retry_ms;
	struct emb_client_table *t, *had;
	int rc;

	pthread_mutex_lock(&io->mu);
	t = tab_find(io, name);
	pthread_mutex_unlock(&io->mu);
	while (!t) {
		if (dim) {
			struct emb_table_spec sp;

			emb_table_spec_init(&sp);
			sp.name = name;
			sp.dim = dim;
			sp.init.kind = EMB_INIT_ZEROS;
			rc = emb_client_table_create(io->c, &sp, &t);
		} else {
			rc = emb_client_table_open(io->c, name, &t);
			if (rc == EMB_ENOTABLE)
				return NULL; /* nothing stored yet */
		}
		if (rc) {
			t = NULL;
			again_or_die(rc, until, "table", name);
			continue;
		}
		pthread_mutex_lock(&io->mu);
		had = tab_find(io, name);
		if (had) {
			emb_client_table_close(t);
			t = had;
		} else {
			if (io->ntabs == io->cap) {
				size_t cap = io->cap ? 2 * io->cap : 16;
				struct tab *nt =
				    realloc(io->tabs, cap * sizeof(*nt));

				if (!nt)
					die("out of memory");
				io->tabs = nt;
				io->cap = cap;
			}
			snprintf(io->tabs[io->ntabs].name,
				 sizeof(io->tabs[0].name), "%s", name);
			io->tabs[io->ntabs++].t = t;
		}
		pthread_mutex_unlock(&io->mu);
	}
	if (dim && emb_client_table_dim(t) != dim)
		die("table %s holds rows of %u floats; this push has blobs of "
		    "%u floats",
		    name, emb_client_table_dim(t), dim);
	return t;
}

/* ids as embstore takes them: int64 bit for bit. */
static uint64_t *ids_of(const int64_t *g, uint32_t n)
{
	uint64_t *ids = malloc((size_t)(n ? n : 1) * sizeof(*ids));

	if (!ids)
		die("out of memory for %u ids", n);
	memcpy(ids, g, (size_t)n * sizeof(*ids));
	return ids;
}

void
IO_Pull(void *instance, struct tde_io_pull_param p)
{
	struct tde_io *io = instance;
	uint64_t *ids;
	uint8_t *found;
	float *rows = NULL;
	char name[NAME_MAX_LEN + 1];

	/* TorchRec keeps a failed IO_Initialize's NULL and calls on. */
	if (!io)
		die("pull from %s: IO_Initialize failed (see above)",
		    p.table_name);
	ids = ids_of(p.global_ids, p.num_global_ids);
	found = malloc(p.num_global_ids ? p.num_global_ids : 1);
	if (!found)
		die("out of memory for %u ids", p.num_global_ids);
	for (uint32_t j = 0; j < p.num_cols; j++) {
		for (uint32_t s = 0; s < p.num_optimizer_states; s++) {
			struct emb_client_table *t;
			int64_t until = now_ms() + io->retry_ms;
			uint32_t dim;
			int rc;

			tab_name(io, p.table_name, p.col_ids[j], s, name);
			t = tab_get(io, name, 0);
			if (!t) {
				for (uint32_t i = 0; i < p.num_global_ids; i++)
					p.on_fetched(p.ctx, i * p.num_cols + j,
						     s, NULL, 0);
				continue;
			}
			dim = emb_client_table_dim(t);
			free(rows);
			rows = malloc((size_t)(p.num_global_ids ? p.num_global_ids
							       : 1) *
				      dim * sizeof(float));
			if (!rows)
				die("out of memory for %u rows", p.num_global_ids);
			while ((rc = emb_client_table_pull(
				    t, ids, p.num_global_ids, rows,
				    EMB_CLIENT_NOCREATE, found)) != 0)
				again_or_die(rc, until, "pull from", name);
			for (uint32_t i = 0; i < p.num_global_ids; i++)
				p.on_fetched(p.ctx, i * p.num_cols + j, s,
					     found[i] ? rows + (size_t)i * dim
						      : NULL,
					     found[i] ? dim * (uint32_t)sizeof(float)
						      : 0);
		}
	}
	free(rows);
	free(found);
	free(ids);
	p.on_all_fetched(p.ctx);
}

void
IO_Push(void *instance, struct tde_io_push_param p)
{
	struct tde_io *io = instance;
	const uint64_t nblobs = (uint64_t)p.num_global_ids * p.num_cols *
				p.num_optimizer_states;
	uint64_t *ids;
	float *rows = NULL;
	char name[NAME_MAX_LEN + 1];

	if (!io)
		die("push to %s: IO_Initialize failed (see above)",
		    p.table_name);
	if (p.num_offsets != nblobs + 1)
		die("push to %s: %u offsets for %" PRIu64 " blobs (want %" PRIu64
		    ")",
		    p.table_name, p.num_offsets, nblobs, nblobs + 1);
	ids = ids_of(p.global_ids, p.num_global_ids);
	for (uint32_t j = 0; j < p.num_cols && p.num_global_ids; j++) {
		for (uint32_t k = 0; k < p.num_optimizer_states; k++) {
			const uint32_t state = p.state_ids[k];
			uint64_t b0 = (uint64_t)j * p.num_optimizer_states + k;
			uint64_t len = p.offsets[b0 + 1] - p.offsets[b0];
			uint64_t stride = (uint64_t)p.num_cols *
					  p.num_optimizer_states;
			struct emb_client_table *t;
			int64_t until;
			int rc;

			tab_name(io, p.table_name, p.col_ids[j], state, name);
			if (len == 0 || len % sizeof(float) ||
			    len / sizeof(float) > 4096)
				die("push to %s: a blob of %" PRIu64 " bytes "
				    "(want a whole number of floats, 1..4096)",
				    name, len);
			free(rows);
			rows = malloc((size_t)p.num_global_ids * len);
			if (!rows)
				die("out of memory for %u rows", p.num_global_ids);
			for (uint32_t i = 0; i < p.num_global_ids; i++) {
				uint64_t b = b0 + (uint64_t)i * stride;

				if (p.offsets[b + 1] - p.offsets[b] != len)
					die("push to %s: blobs of %" PRIu64
					    " and %" PRIu64 " bytes (one size "
					    "per column and state)",
					    name, len,
					    p.offsets[b + 1] - p.offsets[b]);
				memcpy((char *)rows + (size_t)i * len,
				       (const char *)p.data + p.offsets[b],
				       len);
			}
			t = tab_get(io, name, (uint32_t)(len / sizeof(float)));
			until = now_ms() + io->retry_ms;
			while ((rc = emb_client_table_assign(
				    t, ids, p.num_global_ids, rows, false)) != 0)
				again_or_die(rc, until, "push to", name);
		}
	}
	free(rows);
	free(ids);
	p.on_push_complete(p.ctx);
}
