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

#include "common/err.h"
#include "common/log.h"
#include "store/snapshot.h"
#include "store/store.h"

#define PREFIX	       "ckpt-"
#define TMP_PREFIX     ".tmp-ckpt-"
#define REFUSED_PREFIX "refused-ckpt-"
#define MAX_CKPTS      4096

struct emb_ckpt {
	struct emb_server *s; /* borrowed */
	char *dir;	      /* owned copy */
	uint32_t interval_s;  /* between checkpoints */
	uint32_t keep;	      /* kept */
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

static void rm_dir(const char *path)
{
	char p[2 * EMB_SNAP_PATH_MAX + 300];
	struct dirent *de;
	DIR *d = opendir(path);

	if (d) {
		while ((de = readdir(d)) != NULL) {
			if (strcmp(de->d_name, ".") == 0 ||
			    strcmp(de->d_name, "..") == 0)
				continue;
			snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
			unlink(p);
		}
		closedir(d);
	}
	rmdir(path);
}

/* Verifies every file of checkpoint cdir; logs and returns the failure. */
static int verify_ckpt(const char *cdir, struct emb_snap_entry **e, uint32_t *n)
{
	char p[2 * EMB_SNAP_PATH_MAX + 300], bad[EMB_SNAP_PATH_MAX];
	uint64_t sum;
	int rc;

	rc = emb_snap_manifest_read(cdir, e, n, bad);
	if (rc) {
		emb_log(EMB_LOG_ERROR,
			"checkpoint %s refused: %s: %s; trying the previous "
			"one",
			cdir, bad, emb_strerror(rc));
		return rc;
	}
	for (uint32_t i = 0; i < *n; i++) {
		snprintf(p, sizeof(p), "%s/%s", cdir, (*e)[i].file);
		rc = emb_snap_verify(p, EMB_SNAP_READ_VERIFY_ONLY, NULL, &sum);
		if (!rc && sum != (*e)[i].checksum)
			rc = EMB_EMANIFEST;
		if (rc) {
			emb_log(EMB_LOG_ERROR,
				"checkpoint %s refused: %s: %s; trying the "
				"previous one",
				cdir, (*e)[i].file, emb_strerror(rc));
			free(*e);
			*e = NULL;
			return rc;
		}
	}
	return 0;
}

/* Creates each table of a verified checkpoint and loads its rows. */
static int load_ckpt(struct emb_server *s, const char *cdir,
		     const struct emb_snap_entry *e, uint32_t n)
{
	char p[2 * EMB_SNAP_PATH_MAX + 300];
	uint64_t rows = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct emb_snap_reader *r;
		struct emb_wire_spec spec = {0};
		struct emb_server_table st;
		const struct emb_snap_meta *m;
		uint32_t id;
		int64_t got;
		int rc;

		snprintf(p, sizeof(p), "%s/%s", cdir, e[i].file);
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc)
			return rc;
		m = emb_snap_reader_meta(r);
		snprintf(spec.name, sizeof(spec.name), "%s", m->name);
		spec.dim = m->dim;
		spec.optim = m->optim;
		spec.init = m->init;
		spec.seed = m->seed;
		emb_snap_reader_close(r);
		rc = emb_server_table_create(s, &spec, &id);
		if (!rc)
			rc = emb_server_table_acquire(s, id, &st);
		if (rc) {
			emb_log(EMB_LOG_ERROR,
				"checkpoint %s: cannot create table %s: %s",
				cdir, spec.name, emb_strerror(rc));
			return rc;
		}
		got = emb_snap_load_table(p, st.t);
		emb_server_table_release(&st);
		if (got < 0) {
			emb_log(EMB_LOG_ERROR,
				"checkpoint %s: loading %s failed: %s", cdir,
				e[i].file, emb_strerror((int)got));
			return (int)got;
		}
		rows += (uint64_t)got;
	}
	emb_log(EMB_LOG_INFO, "checkpoint %s loaded: %u tables, %llu rows",
		cdir, n, (unsigned long long)rows);
	return 0;
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

int emb_ckpt_load(struct emb_server *s, const char *dir, bool start_empty)
{
	char cdir[EMB_SNAP_PATH_MAX + 300];
	char **names;
	uint32_t n;
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
	for (uint32_t i = 0; i < n; i++) {
		snprintf(cdir, sizeof(cdir), "%s/%s", dir, names[i]);
		rm_dir(cdir);
	}
	free_names(names, n);

	rc = list_prefixed(dir, PREFIX, &names, &n);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++) {
		struct emb_snap_entry *e = NULL;
		uint32_t ne = 0;

		snprintf(cdir, sizeof(cdir), "%s/%s", dir, names[i]);
		if (verify_ckpt(cdir, &e, &ne))
			continue;
		rc = load_ckpt(s, cdir, e, ne);
		free(e);
		/* Newer ones were refused: out of rotation, kept. */
		for (uint32_t j = 0; !rc && j < i; j++)
			set_aside(dir, names[j]);
		free_names(names, n);
		return rc;
	}
	if (n && !start_empty) {
		emb_log(EMB_LOG_ERROR,
			"no valid checkpoint in %s (%u refused): not starting; "
			"move them away or pass --checkpoint-start-empty",
			dir, n);
		free_names(names, n);
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
	for (uint32_t i = 0; i < n; i++)
		set_aside(dir, names[i]);
	free_names(names, n);
	return 0;
}

/*
 * Removes all but the newest keep checkpoints, and never fin, the one just
 * written and verified: whatever else the directory holds, the last valid
 * checkpoint stays.
 */
static void prune(const char *dir, uint32_t keep, const char *fin)
{
	char cdir[EMB_SNAP_PATH_MAX + 300];
	char **names;
	uint32_t n;

	if (list_prefixed(dir, PREFIX, &names, &n))
		return;
	for (uint32_t i = keep; i < n; i++) {
		snprintf(cdir, sizeof(cdir), "%s/%s", dir, names[i]);
		if (strcmp(cdir, fin) != 0)
			rm_dir(cdir);
	}
	free_names(names, n);
}

/* The time in the name of dir's newest checkpoint, or 0. */
static uint64_t newest_ms(const char *dir)
{
	unsigned long long ms = 0;
	char **names;
	uint32_t n;

	if (list_prefixed(dir, PREFIX, &names, &n))
		return 0;
	if (n && sscanf(names[0] + strlen(PREFIX), "%llu", &ms) != 1)
		ms = 0;
	free_names(names, n);
	return ms;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

int emb_ckpt_write(struct emb_server *s, const char *dir, uint32_t keep)
{
	char tmp[EMB_SNAP_PATH_MAX], fin[EMB_SNAP_PATH_MAX];
	char p[2 * EMB_SNAP_PATH_MAX + 300];
	struct emb_snap_entry *e = NULL;
	struct timespec ts;
	uint32_t *ids = NULL, n, ne = 0;
	uint64_t rows = 0, bytes = 0, ms;
	int rc;

	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return -errno;
	clock_gettime(CLOCK_REALTIME, &ts);
	ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	/* The newest name must be the newest checkpoint, also after the
	 * wall clock stepped back: rotation goes by name. */
	if (newest_ms(dir) >= ms)
		ms = newest_ms(dir) + 1;
	/* Names sort by time; a second checkpoint within 1 ms moves on. */
	for (;;) {
		snprintf(fin, sizeof(fin), "%s/" PREFIX "%016llu", dir,
			 (unsigned long long)ms);
		if (access(fin, F_OK) != 0)
			break;
		ms++;
	}
	snprintf(tmp, sizeof(tmp), "%s/" TMP_PREFIX "%016llu", dir,
		 (unsigned long long)ms);
	rm_dir(tmp);
	if (mkdir(tmp, 0755) != 0)
		return -errno;

	n = emb_server_table_ids(s, NULL, 0);
	ids = calloc(n ? n : 1, sizeof(*ids));
	e = calloc(n ? n : 1, sizeof(*e));
	if (!ids || !e) {
		rc = -ENOMEM;
		goto err;
	}
	n = emb_server_table_ids(s, ids, n);
	for (uint32_t i = 0; i < n; i++) {
		struct emb_server_table st;
		struct emb_snap_result res;

		/* Dropped since listed: nothing to keep. */
		if (emb_server_table_acquire(s, ids[i], &st))
			continue;
		snprintf(e[ne].file, sizeof(e[ne].file), "%s.embs",
			 st.spec.name);
		snprintf(e[ne].table, sizeof(e[ne].table), "%s", st.spec.name);
		e[ne].nparts = 1;
		snprintf(p, sizeof(p), "%s/%s", tmp, e[ne].file);
		rc = emb_snap_write_table(st.t, p, NULL, &res);
		emb_server_table_release(&st);
		if (rc) {
			emb_log(EMB_LOG_ERROR, "checkpoint: writing %s: %s", p,
				emb_strerror(rc));
			goto err;
		}
		e[ne].rows = res.rows;
		e[ne].bytes = res.file_bytes;
		e[ne].checksum = res.checksum;
		rows += res.rows;
		bytes += res.file_bytes;
		ne++;
	}
	rc = emb_snap_manifest_write(tmp, e, ne);
	if (rc)
		goto err;
	if (rename(tmp, fin) != 0) {
		rc = -errno;
		goto err;
	}
	rc = fsync_dir(dir);
	if (rc)
		goto err_done;
	emb_log(EMB_LOG_INFO, "checkpoint %s: %u tables, %llu rows, %llu bytes",
		fin, ne, (unsigned long long)rows, (unsigned long long)bytes);
	prune(dir, keep, fin);
err_done:
	free(e);
	free(ids);
	return rc;
err:
	rm_dir(tmp);
	free(e);
	free(ids);
	return rc;
}

static void *ckpt_main(void *arg)
{
	struct emb_ckpt *c = arg;
	struct timespec until;
	int rc;

	pthread_mutex_lock(&c->lock);
	while (!c->stop) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += c->interval_s;
		while (!c->stop && pthread_cond_timedwait(&c->cond, &c->lock,
							  &until) != ETIMEDOUT)
			;
		if (c->stop)
			break;
		pthread_mutex_unlock(&c->lock);
		rc = emb_ckpt_write(c->s, c->dir, c->keep);
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

	if (!s || !o || !o->dir || !o->interval_s || !o->keep || !out)
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
	c->interval_s = o->interval_s;
	c->keep = o->keep;
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = -pthread_create(&c->thread, NULL, ckpt_main, c);
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

void emb_ckpt_stop(struct emb_ckpt *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c->dir);
	free(c);
}
