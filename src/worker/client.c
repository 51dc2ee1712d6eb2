/*
 * src/worker/client.c - emb_client: made from options (servers parsed,
 * HELLO encoded, conns made, loop thread started) and destroyed (loop
 * stopped, conns closed, calls still waiting failed), and its counters.
 * The calls themselves live in op.c (pull, push, assign, erase),
 * table_admin.c and admin.c; client_int.h maps the files.
 *
 * The client owns one transport and one network thread running its loop
 * (conn.c). A call builds an op in the caller's thread, hands it to the
 * loop, and the loop thread sends its parts and completes them.
 *
 * Threads: create and destroy on one thread each; the rest any.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/addr.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/token.h"
#include "proto/wire.h"
#include "transport/transport.h"
#include "worker/abi.h"
#include "worker/client_int.h"
#include "worker/respbuf.h"
#include "cluster/node.h"

#define LOC_ROWS_DEFAULT (1u << 20) /* one-sided: cached locations */

static int client_create(const struct emb_client_opts *opts,
			 const bool *removed, bool observer,
			 struct emb_client **out);

static int parse_servers(struct emb_client *c, const char *list)
{
	uint32_t n = 1;
	struct emb_addr *a;
	int rc;

	for (const char *q = list; *q; q++)
		n += *q == ',';
	c->srv = calloc(n, sizeof(*c->srv));
	a = calloc(n, sizeof(*a));
	if (!c->srv || !a) {
		free(a);
		return -ENOMEM;
	}
	rc = emb_addr_list_parse(list, a, n);
	for (int i = 0; i < rc; i++) {
		memcpy(c->srv[i].host, a[i].host, sizeof(c->srv[i].host));
		c->srv[i].port = a[i].port;
	}
	free(a);
	if (rc < 0) {
		char why[160];

		emb_addr_list_explain(list, why, sizeof(why));
		emb__err_set(-EINVAL, "servers \"%.200s\": %s", list, why);
		return -EINVAL;
	}
	c->nsrv = n;
	/* Slots go to servers in contiguous ranges, so a dump grouped by slot
	 * splits cleanly when restored onto another number of servers. */
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		c->slot_map[sl] = (uint16_t)((uint64_t)sl * n / EMB_NSLOTS);
	return 0;
}

void emb__client_env_log_level(void)
{
	const char *v = getenv("EMB_LOG_LEVEL");
	enum emb_log_level lvl;

	/* A trainer has no flag for it: the library honours the variable the
	 * servers and tools read. */
	if (v && emb_log_parse_level(v, &lvl) == 0)
		emb_log_set_level(lvl);
}

/*
 * EMB_ADMIN_TOKEN_FILE names the admin token the client presents in HELLO
 * (EMB_F_ADMIN), as the servers and tools read it: a trainer that sets
 * modes, or the CLI, gets admin rights from its environment, and the
 * options struct (mirrored by the Python binding) keeps its layout.
 */
static int env_admin_token(struct emb_client *c)
{
	const char *path = getenv("EMB_ADMIN_TOKEN_FILE");
	int rc;

	if (!path || !*path)
		return 0;
	rc = emb_token_read_file(path, c->admin, &c->admin_len);
	if (rc)
		emb_log(EMB_LOG_ERROR, "admin token file %s: %s", path,
			rc == -EINVAL ? "empty or longer than 256 bytes"
				      : emb_strerror(rc));
	return rc;
}

int emb_client_create(const struct emb_client_opts *opts,
		      struct emb_client **out)
{
	struct emb_client_opts o;
	int rc = emb__opts_copy(&o, sizeof(o), opts, "emb_client_opts");

	return emb__client_err(NULL,
			       rc ? rc : client_create(&o, NULL, false, out));
}

int emb__client_create_live(const struct emb_client_opts *opts,
			    const bool *removed, struct emb_client **out)
{
	return client_create(opts, removed, false, out);
}

int emb__client_create_observer(const struct emb_client_opts *opts,
				const bool *removed, struct emb_client **out)
{
	return client_create(opts, removed, true, out);
}

static int client_create(const struct emb_client_opts *opts,
			 const bool *removed, bool observer,
			 struct emb_client **out)
{
	const char *tp;
	struct emb_client *c;
	int rc;

	if (!opts || !out)
		return -EINVAL;
	if (!opts->servers || !*opts->servers) {
		emb__err_set(-EINVAL, "no servers: the options name none "
				      "(want host:port,host:port...)");
		return -EINVAL;
	}
	if (opts->auth_token_len > EMB_WIRE_TOKEN_MAX ||
	    (opts->auth_token_len && !opts->auth_token)) {
		emb__err_set(-EINVAL, "auth token of %u bytes: want 1..%u",
			     opts->auth_token_len, EMB_WIRE_TOKEN_MAX);
		return -EINVAL;
	}
	emb__client_env_log_level();
	tp = opts->transport ? opts->transport : "tcp";
	/* Both named, as a server's EMB_TRANSPORT may be: that is "auto". */
	if (strcmp(tp, "tcp,rdma") == 0 || strcmp(tp, "rdma,tcp") == 0)
		tp = "auto";
	if (strcmp(tp, "tcp") && strcmp(tp, "rdma") && strcmp(tp, "auto")) {
		emb__err_set(-EINVAL, "transport \"%.32s\": want tcp, rdma or "
				      "auto", tp);
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fns = &emb__op_part_fns;
	c->ops = calloc(1, sizeof(*c->ops));
	if (!c->ops) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->ops->mu, NULL);
	pthread_mutex_init(&c->err_lock, NULL);
	pthread_mutex_init(&c->map_mu, NULL);
	pthread_mutex_init(&c->tab_mu, NULL);
	c->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 30000;
	c->part_ids = opts->part_ids ? opts->part_ids : 1024;
	if (opts->pull_mode > EMB_PULL_ONESIDED ||
	    opts->loc_cache_rows > (1u << 30)) {
		rc = -EINVAL;
		goto err_free;
	}
	c->onesided = opts->pull_mode == EMB_PULL_ONESIDED;
	c->observer = observer;
	c->loc_rows = LOC_ROWS_DEFAULT;
	if (opts->loc_cache_rows) {
		/* A power of two, so a bucket is a mask of the id hash. */
		c->loc_rows = LOC_WAYS;
		while (c->loc_rows < opts->loc_cache_rows)
			c->loc_rows <<= 1;
	}
	rc = env_admin_token(c);
	if (rc)
		goto err_free;
	rc = emb__pace_create(c);
	if (rc)
		goto err_free;
	while (c->session == 0)
		if (getrandom(&c->session, sizeof(c->session), 0) !=
		    (ssize_t)sizeof(c->session))
			c->session = emb_clock_ms() ^ ((uint64_t)getpid() << 32);
	rc = parse_servers(c, opts->servers);
	if (rc)
		goto err_free;
	for (uint32_t i = 0; i < c->nsrv; i++) {
		c->srv[i].c = c;
		c->srv[i].gen = 1;
		c->srv[i].dead = removed && removed[i];
	}
	if (strcmp(tp, "auto") == 0) {
		/* Both where this host has a device; each server's HELLO
		 * then says whether RDMA is there too (move_to_rdma). */
		rc = emb__conn_connect_all(c,
				 emb_transport_usable("rdma") ? "tcp,rdma"
							      : "tcp",
				 opts);
	} else {
		rc = emb__conn_connect_all(c, tp, opts);
	}
	if (rc)
		goto err_free;
	emb_log(EMB_LOG_INFO, "connected to %u server%s over %s", c->nsrv,
		c->nsrv == 1 ? "" : "s", emb_client_transport(c));
	rc = emb_thread_start(&c->thread, NULL, emb__conn_loop, c,
			      "emb-client");
	if (rc)
		goto err_conns;
	c->running = true;
	*out = c;
	return 0;

err_conns:
	for (uint32_t i = 0; i < c->nsrv; i++) {
		emb_conn_destroy(c->srv[i].conn);
		emb__rconn_lost(&c->srv[i], EMB_ECLOSED);
	}
	emb__respbufs_destroy(c->bufs);
	emb_transport_destroy(c->tr);
err_free:
	free(c->srv);
	emb__pace_destroy(c);
	emb__op_pool_close(c->ops);
	pthread_mutex_destroy(&c->tab_mu);
	pthread_mutex_destroy(&c->map_mu);
	pthread_mutex_destroy(&c->err_lock);
	free(c);
	return rc;
}

void emb_client_destroy(struct emb_client *c)
{
	if (!c)
		return;
	/* First: the node's agent posts to this client's loop. */
	emb_node_destroy(c->node);
	__atomic_store_n(&c->stopping, true, __ATOMIC_RELEASE);
	if (c->running) {
		emb_transport_wake(c->tr);
		pthread_join(c->thread, NULL);
	}
	/* The loop thread is gone: this thread may now own the conns. A
	 * call still on one (a reconnect's HELLO) comes back during the
	 * destroy and must find the server without it. */
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct emb_conn *conn = c->srv[i].conn;

		/* READ batches still out fall back to the main conn: end
		 * them first, so that what falls back fails with it below. */
		emb__rconn_lost(&c->srv[i], EMB_ECLOSED);
		c->srv[i].conn = NULL;
		c->srv[i].state = SRV_DOWN;
		emb_conn_destroy(conn);
		emb__conn_fail_waiting(&c->srv[i], EMB_ECLOSED);
	}
	while (c->delayed) {
		struct part *p = c->delayed;

		c->delayed = p->retry.dnext;
		c->fns->end(p, EMB_ECLOSED, NULL);
	}
	/* Buffers given back late are released by loop tasks: run them,
	 * then the pool goes before the transport that registered it. */
	emb_transport_poll(c->tr, 0);
	emb__respbufs_destroy(c->bufs);
	emb_transport_destroy(c->tr);
	for (uint32_t i = 0; i < c->nsrv; i++)
		free(c->srv[i].tab_specs);
	free(c->srv);
	free(c->cmap);
	free(c->grp);
	free(c->groups);
	emb__pace_destroy(c);
	emb__op_pool_close(c->ops);
	pthread_mutex_destroy(&c->tab_mu);
	pthread_mutex_destroy(&c->map_mu);
	pthread_mutex_destroy(&c->err_lock);
	free(c);
}

uint32_t emb_client_nservers(const struct emb_client *c)
{
	return c->nsrv;
}

const char *emb_client_transport(const struct emb_client *c)
{
	uint32_t n = 0;

	if (!c->dual)
		return emb_transport_name(c->tr);
	for (uint32_t i = 0; i < c->nsrv; i++)
		n += __atomic_load_n(&c->srv[i].on_rdma, __ATOMIC_RELAXED);
	return n == c->nsrv ? "rdma" : n ? "tcp,rdma" : "tcp";
}

static int client_servers(const struct emb_client *c, char *buf, size_t cap)
{
	size_t at = 0;

	if (!c || !buf || !cap)
		return EMB_EBADARG;
	buf[0] = '\0';
	for (uint32_t i = 0; i < c->nsrv; i++) {
		struct emb_addr a = {.port = c->srv[i].port};
		int n;

		memcpy(a.host, c->srv[i].host, sizeof(a.host));
		if (i) {
			if (cap - at < 2)
				return -ENOSPC;
			buf[at++] = ',';
		}
		n = emb_addr_format(&a, buf + at, cap - at);
		if (n < 0)
			return -ENOSPC;
		at += (size_t)n;
	}
	return 0;
}

int emb_client_servers(const struct emb_client *c, char *buf, size_t cap)
{
	return emb__client_err(NULL, client_servers(c, buf, cap));
}

int emb_client_stats(struct emb_client *c, struct emb_client_stats *dst)
{
	struct emb_client_stats st = {0}, *out = &st;
	struct emb_transport_stats ts;

	emb_transport_stats(c->tr, &ts);
	out->requests = __atomic_load_n(&c->requests, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&c->errors, __ATOMIC_RELAXED);
	out->ids_in = __atomic_load_n(&c->ids_in, __ATOMIC_RELAXED);
	out->ids_sent = __atomic_load_n(&c->ids_sent, __ATOMIC_RELAXED);
	out->bytes_out = ts.bytes_out;
	out->bytes_in = ts.bytes_in;
	out->retries = __atomic_load_n(&c->retries, __ATOMIC_RELAXED);
	out->reconnects = __atomic_load_n(&c->reconnects, __ATOMIC_RELAXED);
	out->resp_copied = ts.resp_bounced;
	out->rows_read = __atomic_load_n(&c->rows_read, __ATOMIC_RELAXED);
	out->rows_fallback =
	    __atomic_load_n(&c->rows_fallback, __ATOMIC_RELAXED);
	out->seal_failures =
	    __atomic_load_n(&c->seal_failures, __ATOMIC_RELAXED);
	out->read_conn_losses =
	    __atomic_load_n(&c->rconn_losses, __ATOMIC_RELAXED);
	return emb__err(
	    emb__stats_copy(dst, &st, sizeof(st), "emb_client_stats"));
}

int emb_client_last_error(struct emb_client *c, char *buf, size_t cap)
{
	(void)c;
	return emb_last_error(buf, cap);
}

struct emb_node *emb__client_node(const struct emb_client *c)
{
	return c->node;
}

