/*
 * src/server/checkpoint.c - server checkpoints: every table to one
 * snapshot file, a MANIFEST, fsync, rename of the whole directory; and at
 * start, the newest checkpoint that verifies completely is loaded.
 *
 * Called from the daemon's main thread (load, final write) and from the
 * checkpoint thread; the store's iterator makes the copy safe while
 * requests go on. Each table's file is consistent row by row; tables are
 * written one after another.
 */
#include "server/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "store/chain.h"
#include "store/snapshot.h"
#include "store/store.h"

#include "server/tables.h"

#define PREFIX	       "ckpt-"
#define TMP_PREFIX     ".tmp-ckpt-"
#define REFUSED_PREFIX "refused-ckpt-"
#define MAX_CKPTS      4096

struct emb_ckpt {
	struct emb_server *s; /* borrowed */
	char *dir;	      /* owned copy */
	uint32_t interval_ms; /* between checkpoints */
	uint32_t keep;	      /* full checkpoints kept, with their chains */
	uint32_t full_every;  /* a full every this many checkpoints */
	/* The chain being written; touched by the writer thread, or by
	 * emb_ckpt_write_final() once that thread is joined. */
	uint64_t base_id;     /* its full; 0: the next link is full */
	uint64_t prev_id;     /* the newest link */
	char prev_name[EMB_CHAIN_NAME_MAX]; /* its directory name */
	uint32_t links;	      /* deltas since the full */
	uint32_t *tids;	      /* server table ids in the newest link */
	uint32_t ntids;	      /* entries in tids */
	bool joined;	      /* the thread is gone */
	pthread_t thread;     /* the writer */
	pthread_mutex_t lock; /* guards stop */
	pthread_cond_t cond;  /* signalled by stop */
	bool stop;	      /* emb_ckpt_stop() called */
};

static int cmp_desc(const void *a, const void *b)
{
	return strcmp(*(char *const *)b, *(char *const *)a);
}

/* Names of DIR's entries starting with prefix, newest (largest) first. */
static int list_prefixed(const char *dir, const char *prefix, char ***out,
			 uint32_t *n)
{
	char **names = NULL;
	struct dirent *de;
	uint32_t cnt = 0;
	DIR *d = opendir(dir);

	*out = NULL;
	*n = 0;
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	names = calloc(MAX_CKPTS, sizeof(*names));
	if (!names) {
		closedir(d);
		return -ENOMEM;
	}
	while ((de = readdir(d)) != NULL && cnt < MAX_CKPTS) {
		if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
			continue;
		names[cnt] = strdup(de->d_name);
		if (!names[cnt])
			break;
		cnt++;
	}
	closedir(d);
	qsort(names, cnt, sizeof(*names), cmp_desc);
	*out = names;
	*n = cnt;
	return 0;
}

static void free_names(char **names, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Loading into the server: one table at a time, held while loaded. */
struct server_sink {
	struct emb_server *s;	   /* borrowed */
	struct emb_server_table st; /* the table being loaded */
};

static int sink_open(void *arg, const struct emb_snap_meta *m,
		     struct emb_table **t)
{
	struct server_sink *k = arg;
	struct emb_wire_spec spec = {0};
	uint32_t id;
	int rc;

	snprintf(spec.name, sizeof(spec.name), "%s", m->name);
	spec.dim = m->dim;
	spec.optim = m->optim;
	spec.init = m->init;
	spec.seed = m->seed;
	spec.row_format = m->row_format;
	spec.rounding = m->rounding;
	spec.tier = m->tier_mode;
	spec.tier_max = m->tier_request;
	/* A table made with "tier on" by a server started with --tier-dir,
	 * loaded by one started without: its rows are loaded into DRAM (or
	 * fail the memory limit, which says so) rather than the server
	 * refusing to start. */
	rc = emb_server_table_create(k->s, &spec, &id);
	if (rc == EMB_ENOTIER) {
		emb_log(EMB_LOG_WARN,
			"checkpoint: table %s was made with a device tier and "
			"this server has no --tier-dir: its rows go to DRAM",
			spec.name);
		spec.tier = EMB_TIER_AUTO;
		rc = emb_server_table_create(k->s, &spec, &id);
	}
	if (!rc)
		rc = emb_server_table_acquire(k->s, id, &k->st);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "checkpoint: cannot create table %s: %s",
			spec.name, emb_strerror(rc));
		return rc;
	}
	*t = k->st.t;
	return 0;
}

static void sink_close(void *arg, struct emb_table *t)
{
	struct server_sink *k = arg;

	(void)t;
	emb_server_table_release(&k->st);
}

/* Moves a refused checkpoint out of rotation, keeping it for inspection. */
static void set_aside(const char *dir, const char *name)
{
	char from[EMB_SNAP_PATH_MAX + 300], to[EMB_SNAP_PATH_MAX + 320];

	snprintf(from, sizeof(from), "%s/%s", dir, name);
	snprintf(to, sizeof(to), "%s/refused-%s", dir, name);
	if (rename(from, to) == 0)
		emb_log(EMB_LOG_WARN, "checkpoint %s set aside as %s", from,
			to);
	else
		emb_log(EMB_LOG_ERROR, "checkpoint %s: cannot set aside: %s",
			from, emb_strerror(-errno));
}

int emb_ckpt_check_dir(const char *dir)
{
	char probe[EMB_SNAP_PATH_MAX + 64];
	int fd, rc = 0;

	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return -errno;
	snprintf(probe, sizeof(probe), "%s/.probe-%ld", dir, (long)getpid());
	fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, "x", 1) != 1 || fsync(fd) != 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	unlink(probe);
	return rc;
}

/* Loads the chain l[f..] into s: the full, then each delta in order up to
 * the first refused one. 0, or the error that stops the start. */
static int load_chain(struct emb_server *s, const char *dir,
		      struct emb_chain_link *l, uint32_t nl, uint32_t f,
		      uint32_t *last_out)
{
	struct server_sink k = {.s = s};
	struct emb_chain_sink sink = {
	    .open = sink_open, .close = sink_close, .arg = &k};
	uint32_t span = emb_chain_span(l, nl, f), last = f;
	double t0 = emb_clock_s();
	uint64_t rows;
	int rc;

	for (uint32_t j = f + 1; j <= f + span; j++) {
		rc = emb_chain_verify(dir, &l[j]);
		if (rc) {
			emb_log(EMB_LOG_ERROR,
				"checkpoint %s/%s refused: %s: %s; loading %s "
				"and the %u delta%s before it (up to %s); the "
				"%u later link%s of the chain are not loaded",
				dir, l[j].name, l[j].bad, emb_strerror(rc),
				l[f].name, last - f, last - f == 1 ? "" : "s",
				l[last].name, f + span - j,
				f + span - j == 1 ? "" : "s");
			break;
		}
		last = j;
	}
	if (last == f + span && last + 1 < nl && l[last + 1].delta)
		emb_log(EMB_LOG_ERROR,
			"checkpoint %s/%s refused: it does not continue the "
			"chain of %s (base or previous link differs); "
			"loading up to %s",
			dir, l[last + 1].name, l[f].name, l[last].name);
	rc = emb_chain_load(dir, l, f, last, &sink, &rows);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "checkpoint %s/%s: loading failed: %s",
			dir, l[last].name, emb_strerror(rc));
		return rc;
	}
	emb_log(EMB_LOG_INFO,
		"checkpoint %s/%s loaded: %u tables, %llu rows read (full "
		"%s and %u delta%s) in %.2f s",
		dir, l[last].name, l[last].ne, (unsigned long long)rows,
		l[f].name, last - f, last - f == 1 ? "" : "s",
		emb_clock_s() - t0);
	*last_out = last;
	return 0;
}

int emb_ckpt_load(struct emb_server *s, const char *dir, bool start_empty)
{
	struct emb_chain_link *l;
	char **names;
	uint32_t n, nl, last;
	int rc;

	rc = emb_ckpt_check_dir(dir);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "checkpoint directory %s: %s", dir,
			emb_strerror(rc));
		return rc;
	}
	/* Leftovers of a checkpoint interrupted by a crash. */
	rc = list_prefixed(dir, TMP_PREFIX, &names, &n);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++)
		emb_chain_rm(dir, names[i]);
	free_names(names, n);

	rc = emb_chain_list(dir, &l, &nl);
	if (rc)
		return rc;
	/* Newest full first; each with the deltas that follow it. */
	for (uint32_t f = nl; f-- > 0;) {
		if (l[f].delta)
			continue;
		if (emb_chain_verify(dir, &l[f])) {
			emb_log(EMB_LOG_ERROR,
				"checkpoint %s/%s refused: %s: %s; trying the "
				"previous one",
				dir, l[f].name, l[f].bad,
				emb_strerror(l[f].status));
			continue;
		}
		rc = load_chain(s, dir, l, nl, f, &last);
		/* Newer links were refused: out of rotation, kept. */
		for (uint32_t j = last + 1; !rc && j < nl; j++)
			set_aside(dir, l[j].name);
		emb_chain_free(l, nl);
		return rc;
	}
	n = nl;
	if (n && !start_empty) {
		emb_log(EMB_LOG_ERROR,
			"no valid checkpoint in %s (%u refused): not starting; "
			"move them away or pass --checkpoint-start-empty",
			dir, n);
		emb_chain_free(l, nl);
		return EMB_ENOCKPT;
	}
	if (n)
		emb_log(EMB_LOG_WARN,
			"no valid checkpoint in %s (%u refused): starting "
			"empty as told",
			dir, n);
	else
		emb_log(EMB_LOG_INFO, "no checkpoint in %s: starting empty",
			dir);
	for (uint32_t i = 0; i < nl; i++)
		set_aside(dir, l[i].name);
	emb_chain_free(l, nl);
	return 0;
}

/*
 * After a full checkpoint fin is durable: removes every link older than
 * the keep-th newest full (whole chains go), never fin itself.
 */
static void prune(const char *dir, uint32_t keep, const char *fin)
{
	char **names;
	uint32_t n, fulls = 0;

	if (list_prefixed(dir, PREFIX, &names, &n))
		return;
	for (uint32_t i = 0; i < n; i++) {
		if (fulls >= keep && strcmp(names[i], fin) != 0)
			emb_chain_rm(dir, names[i]);
		if (!strstr(names[i], EMB_CHAIN_DELTA))
			fulls++;
	}
	free_names(names, n);
}

/* The tables of s, held for a checkpoint. */
struct held {
	struct emb_server_table *st; /* acquired */
	struct emb_chain_table *ct;  /* the same tables, for the writer */
	uint32_t n;		     /* held */
};

static int hold_tables(struct emb_server *s, struct held *h)
{
	uint32_t *ids, n = emb_server_table_ids(s, NULL, 0);

	memset(h, 0, sizeof(*h));
	ids = calloc(n ? n : 1, sizeof(*ids));
	h->st = calloc(n ? n : 1, sizeof(*h->st));
	h->ct = calloc(n ? n : 1, sizeof(*h->ct));
	if (!ids || !h->st || !h->ct) {
		free(ids);
		free(h->st);
		free(h->ct);
		return -ENOMEM;
	}
	n = emb_server_table_ids(s, ids, n);
	for (uint32_t i = 0; i < n; i++) {
		/* Dropped since listed: nothing to keep. */
		if (emb_server_table_acquire(s, ids[i], &h->st[h->n]))
			continue;
		h->ct[h->n].t = h->st[h->n].t;
		h->n++;
	}
	free(ids);
	return 0;
}

static void release_tables(struct held *h)
{
	for (uint32_t i = 0; i < h->n; i++)
		emb_server_table_release(&h->st[i]);
	free(h->st);
	free(h->ct);
}

int emb_ckpt_write(struct emb_server *s, const char *dir, uint32_t keep)
{
	struct emb_chain_result res;
	char fin[EMB_SNAP_PATH_MAX];
	double t0 = emb_clock_s(), dt;
	struct held h;
	int rc;

	rc = hold_tables(s, &h);
	if (rc)
		return rc;
	rc = emb_chain_write(dir, h.ct, h.n, 0, 0, &res);
	release_tables(&h);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "checkpoint in %s: %s", dir,
			emb_strerror(rc));
		return rc;
	}
	dt = emb_clock_s() - t0;
	emb_log(EMB_LOG_INFO, "checkpoint %s/%s: %u tables, %llu rows, %llu "
		"bytes in %.2f s (%.0f MB/s)", dir, res.name, h.n,
		(unsigned long long)res.rows, (unsigned long long)res.bytes,
		dt, (double)res.bytes / 1e6 / (dt > 0 ? dt : 1e-9));
	snprintf(fin, sizeof(fin), "%s", res.name);
	prune(dir, keep, fin);
	return 0;
}

/* Was table id in the previous link? */
static bool had_table(const struct emb_ckpt *c, uint32_t id)
{
	for (uint32_t i = 0; i < c->ntids; i++)
		if (c->tids[i] == id)
			return true;
	return false;
}

/* Is c's previous link still the newest checkpoint in its directory? A
 * full written by someone else (embstore compact) starts a new chain. */
static bool prev_is_newest(const struct emb_ckpt *c)
{
	char **names;
	uint32_t n;
	bool yes;

	if (list_prefixed(c->dir, PREFIX, &names, &n))
		return false;
	yes = n && strcmp(names[0], c->prev_name) == 0;
	free_names(names, n);
	return yes;
}

/*
 * Writes the next link: a delta while the chain is shorter than
 * full_every and intact, else a full (then older chains are pruned).
 */
static int write_next(struct emb_ckpt *c)
{
	struct emb_chain_result res;
	bool delta = c->base_id && c->links + 1 < c->full_every &&
		     prev_is_newest(c);
	bool any_delta = false;
	double t0 = emb_clock_s(), dt;
	uint32_t *tids;
	struct held h;
	int rc;

	rc = hold_tables(c->s, &h);
	if (rc)
		return rc;
	tids = calloc(h.n ? h.n : 1, sizeof(*tids));
	if (!tids) {
		release_tables(&h);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < h.n; i++) {
		tids[i] = h.st[i].id;
		/* A table new since the previous link starts over whole. */
		h.ct[i].delta = delta && had_table(c, h.st[i].id);
		any_delta = any_delta || h.ct[i].delta;
	}
	rc = emb_chain_write(c->dir, h.ct, h.n, c->base_id, c->prev_id, &res);
	release_tables(&h);
	if (rc) {
		/* The changes taken are not on disk: start over whole. */
		c->base_id = 0;
		free(tids);
		return rc;
	}
	dt = emb_clock_s() - t0;
	emb_log(EMB_LOG_INFO,
		"checkpoint %s/%s: %u tables, %llu rows, %llu removed, %llu "
		"bytes in %.2f s (%.0f MB/s)%s",
		c->dir, res.name, h.n, (unsigned long long)res.rows,
		(unsigned long long)res.erased, (unsigned long long)res.bytes,
		dt, (double)res.bytes / 1e6 / (dt > 0 ? dt : 1e-9),
		res.fell_back ? " (some tables whole: too many removals)" : "");
	free(c->tids);
	c->tids = tids;
	c->ntids = h.n;
	c->prev_id = res.id;
	snprintf(c->prev_name, sizeof(c->prev_name), "%s", res.name);
	if (any_delta) {
		c->links++;
	} else {
		c->base_id = res.id;
		c->links = 0;
		prune(c->dir, c->keep, res.name);
	}
	return 0;
}

static void *ckpt_main(void *arg)
{
	struct emb_ckpt *c = arg;
	struct timespec until;
	int rc;

	pthread_mutex_lock(&c->lock);
	while (!c->stop) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += c->interval_ms / 1000;
		until.tv_nsec += (long)(c->interval_ms % 1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		while (!c->stop && pthread_cond_timedwait(&c->cond, &c->lock,
							  &until) != ETIMEDOUT)
			;
		if (c->stop)
			break;
		pthread_mutex_unlock(&c->lock);
		rc = write_next(c);
		if (rc)
			emb_log(EMB_LOG_ERROR, "checkpoint in %s failed: %s",
				c->dir, emb_strerror(rc));
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int emb_ckpt_start(struct emb_server *s, const struct emb_ckpt_opts *o,
		   struct emb_ckpt **out)
{
	pthread_condattr_t ca;
	struct emb_ckpt *c;
	int rc;

	if (!s || !o || !o->dir || !o->interval_ms || !o->keep || !out ||
	    o->full_every > EMB_CKPT_FULL_EVERY_MAX)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->dir = strdup(o->dir);
	if (!c->dir) {
		free(c);
		return -ENOMEM;
	}
	c->s = s;
	c->interval_ms = o->interval_ms;
	c->keep = o->keep;
	c->full_every = o->full_every ? o->full_every : 1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = emb_thread_start(&c->thread, NULL, ckpt_main, c, "emb-ckpt");
	if (rc) {
		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->lock);
		free(c->dir);
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

static void join(struct emb_ckpt *c)
{
	if (c->joined)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	c->joined = true;
}

int emb_ckpt_write_final(struct emb_ckpt *c)
{
	join(c);
	return write_next(c);
}

void emb_ckpt_stop(struct emb_ckpt *c)
{
	if (!c)
		return;
	join(c);
	free(c->tids);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c->dir);
	free(c);
}
