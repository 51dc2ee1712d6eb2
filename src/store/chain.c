/*
 * src/store/chain.c - checkpoint chains: list, verify, load and write the
 * checkpoint directories of a root (layout in chain.h). Any thread.
 */
#include "store/chain.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"

#define PATH_CAP (2 * EMB_SNAP_PATH_MAX + 300)

static int cmp_link(const void *a, const void *b)
{
	const struct emb_chain_link *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* Parses "ckpt-<digits>" or "ckpt-<digits>-delta". */
static bool parse_name(const char *name, uint64_t *id, bool *delta)
{
	const char *p = name + strlen(EMB_CHAIN_PREFIX);
	char *end;
	unsigned long long v;

	if (strncmp(name, EMB_CHAIN_PREFIX, strlen(EMB_CHAIN_PREFIX)) != 0 ||
	    *p < '0' || *p > '9')
		return false;
	errno = 0;
	v = strtoull(p, &end, 10);
	if (errno || end - p != 16)
		return false;
	if (*end == '\0')
		*delta = false;
	else if (strcmp(end, EMB_CHAIN_DELTA) == 0)
		*delta = true;
	else
		return false;
	*id = v;
	return true;
}

/* Reads link l's MANIFEST and headers; sets status. */
static void read_link(const char *root, struct emb_chain_link *l)
{
	char dir[PATH_CAP], p[PATH_CAP + 300];

	snprintf(dir, sizeof(dir), "%s/%s", root, l->name);
	l->status = emb_snap_manifest_read(dir, &l->e, &l->ne, l->bad);
	if (l->status)
		return;
	l->m = calloc(l->ne ? l->ne : 1, sizeof(*l->m));
	if (!l->m) {
		l->status = -ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < l->ne; i++) {
		struct emb_snap_reader *r;
		int rc;

		snprintf(p, sizeof(p), "%s/%s", dir, l->e[i].file);
		rc = emb_snap_reader_open(p, EMB_SNAP_READ_VERIFY_ONLY, &r);
		if (!rc) {
			l->m[i] = *emb_snap_reader_meta(r);
			emb_snap_reader_close(r);
			/* A full link holds no delta file; a delta file
			 * names this chain's ids. */
			if ((l->m[i].flags & EMB_SNAP_F_DELTA) && !l->delta)
				rc = EMB_ECHAIN;
		}
		if (rc) {
			snprintf(l->bad, sizeof(l->bad), "%s", l->e[i].file);
			l->status = rc;
			return;
		}
		l->rows += l->m[i].rows;
		l->erased += l->m[i].erased;
		l->bytes += l->m[i].file_bytes;
	}
}

int emb_chain_list(const char *root, struct emb_chain_link **out, uint32_t *n)
{
	struct emb_chain_link *l;
	struct dirent *de;
	uint32_t cnt = 0;
	DIR *d;

	*out = NULL;
	*n = 0;
	d = opendir(root);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	l = calloc(EMB_CHAIN_MAX, sizeof(*l));
	if (!l) {
		closedir(d);
		return -ENOMEM;
	}
	while ((de = readdir(d)) != NULL && cnt < EMB_CHAIN_MAX) {
		struct emb_chain_link *k = &l[cnt];

		if (strlen(de->d_name) >= sizeof(k->name) ||
		    !parse_name(de->d_name, &k->id, &k->delta))
			continue;
		snprintf(k->name, sizeof(k->name), "%s", de->d_name);
		cnt++;
	}
	closedir(d);
	qsort(l, cnt, sizeof(*l), cmp_link);
	for (uint32_t i = 0; i < cnt; i++)
		read_link(root, &l[i]);
	*out = l;
	*n = cnt;
	return 0;
}

void emb_chain_free(struct emb_chain_link *l, uint32_t n)
{
	if (!l)
		return;
	for (uint32_t i = 0; i < n; i++) {
		free(l[i].e);
		free(l[i].m);
	}
	free(l);
}

int emb_chain_verify(const char *root, struct emb_chain_link *l)
{
	char p[PATH_CAP];
	uint64_t sum;

	if (l->status)
		return l->status;
	for (uint32_t i = 0; i < l->ne; i++) {
		int rc;

		snprintf(p, sizeof(p), "%s/%s/%s", root, l->name,
			 l->e[i].file);
		rc = emb_snap_verify(p, EMB_SNAP_READ_VERIFY_ONLY, NULL, &sum);
		if (!rc && sum != l->e[i].checksum)
			rc = EMB_EMANIFEST;
		if (rc) {
			snprintf(l->bad, sizeof(l->bad), "%s", l->e[i].file);
			l->status = rc;
			return rc;
		}
	}
	return 0;
}

/* Does link k continue a chain whose full is base and previous link prev?
 * Every delta file must say so (a link without tables continues any). */
static bool continues(const struct emb_chain_link *k, uint64_t base,
		      uint64_t prev)
{
	if (!k->delta || k->status)
		return false;
	for (uint32_t i = 0; i < k->ne; i++)
		if ((k->m[i].flags & EMB_SNAP_F_DELTA) &&
		    (k->m[i].base_id != base || k->m[i].prev_id != prev))
			return false;
	return true;
}

uint32_t emb_chain_span(const struct emb_chain_link *l, uint32_t n,
			uint32_t full)
{
	uint32_t k = full + 1;

	if (l[full].delta)
		return 0;
	while (k < n && l[k].delta &&
	       (l[k].status || continues(&l[k], l[full].id, l[k - 1].id)))
		k++;
	/* A refused link ends what can be used; the span still counts it
	 * so that the caller can say which one it was. */
	return k - full - 1;
}

/* Index of table name in link k's files, or -1. */
static int find_file(const struct emb_chain_link *k, const char *name)
{
	for (uint32_t i = 0; i < k->ne; i++)
		if (strcmp(k->m[i].name, name) == 0)
			return (int)i;
	return -1;
}

int emb_chain_load(const char *root, const struct emb_chain_link *l,
		   uint32_t first, uint32_t last,
		   const struct emb_chain_sink *sink, uint64_t *rows)
{
	const struct emb_chain_link *tail = &l[last];
	char p[PATH_CAP];

	*rows = 0;
	for (uint32_t i = 0; i < tail->ne; i++) {
		const char *name = tail->m[i].name;
		struct emb_table *t = NULL;
		uint32_t start = last;
		int f, rc;

		/* The table starts at its newest whole file. */
		for (;;) {
			f = find_file(&l[start], name);
			if (f < 0)
				return EMB_ECHAIN;
			if (!(l[start].m[f].flags & EMB_SNAP_F_DELTA))
				break;
			if (start == first)
				return EMB_ECHAIN;
			start--;
		}
		rc = sink->open(sink->arg, &l[start].m[f], &t);
		if (rc)
			return rc;
		for (uint32_t k = start; k <= last && !rc; k++) {
			int64_t got;

			f = find_file(&l[k], name);
			if (f < 0) {
				rc = EMB_ECHAIN;
				break;
			}
			snprintf(p, sizeof(p), "%s/%s/%s", root, l[k].name,
				 l[k].e[f].file);
			got = emb_snap_load_table(p, t);
			if (got < 0)
				rc = (int)got;
			else
				*rows += (uint64_t)got;
		}
		if (sink->close)
			sink->close(sink->arg, t);
		if (rc)
			return rc;
	}
	return 0;
}

void emb_chain_rm(const char *dir, const char *name)
{
	char path[PATH_CAP], p[PATH_CAP + 300];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	d = opendir(path);
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

/* An id after every checkpoint under root (also after the wall clock
 * stepped back: rotation and chains go by name). */
static uint64_t next_id(const char *root)
{
	struct timespec ts;
	struct dirent *de;
	uint64_t ms, newest = 0;
	DIR *d;

	clock_gettime(CLOCK_REALTIME, &ts);
	ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	d = opendir(root);
	if (d) {
		while ((de = readdir(d)) != NULL) {
			uint64_t id;
			bool delta;

			if (parse_name(de->d_name, &id, &delta) && id > newest)
				newest = id;
		}
		closedir(d);
	}
	return ms > newest ? ms : newest + 1;
}

int emb_chain_write(const char *root, const struct emb_chain_table *tables,
		    uint32_t n, uint64_t base_id, uint64_t prev_id,
		    struct emb_chain_result *res)
{
	char tmp[PATH_CAP], fin[PATH_CAP], p[PATH_CAP + 300];
	struct emb_snap_entry *e;
	bool delta = false;
	uint64_t id;
	int rc;

	memset(res, 0, sizeof(*res));
	for (uint32_t i = 0; i < n; i++)
		delta = delta || tables[i].delta;
	if (mkdir(root, 0755) != 0 && errno != EEXIST)
		return -errno;
	id = next_id(root);
	snprintf(res->name, sizeof(res->name), EMB_CHAIN_PREFIX "%016llu%s",
		 (unsigned long long)id, delta ? EMB_CHAIN_DELTA : "");
	snprintf(fin, sizeof(fin), "%s/%s", root, res->name);
	/* The writer's pid in the name: two processes writing checkpoints
	 * into one root (a server, and `embstore compact` beside it) may
	 * pick the same id in the same millisecond, and must not remove or
	 * fill each other's directory. */
	snprintf(tmp, sizeof(tmp), "%s/" EMB_CHAIN_TMP "%016llu-%ld", root,
		 (unsigned long long)id, (long)getpid());
	emb_chain_rm(root, tmp + strlen(root) + 1);
	if (mkdir(tmp, 0755) != 0)
		return -errno;
	e = calloc(n ? n : 1, sizeof(*e));
	if (!e) {
		rc = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < n; i++) {
		const char *name = emb_table_name(tables[i].t);
		struct emb_snap_result r;

		snprintf(e[i].file, sizeof(e[i].file), "%s.embs", name);
		snprintf(e[i].table, sizeof(e[i].table), "%s", name);
		e[i].nparts = 1;
		snprintf(p, sizeof(p), "%s/%s", tmp, e[i].file);
		rc = emb_snap_write_ckpt(tables[i].t, p, tables[i].delta,
					 base_id, prev_id, NULL, &r);
		if (rc == EMB_EDELTALOST) {
			/* Too many removals to list: this table starts
			 * over in this link, whole. */
			res->fell_back++;
			rc = emb_snap_write_ckpt(tables[i].t, p, false, 0, 0,
						 NULL, &r);
		}
		if (rc)
			goto err;
		e[i].rows = r.rows;
		e[i].bytes = r.file_bytes;
		e[i].checksum = r.checksum;
		res->rows += r.rows;
		res->erased += r.erased;
		res->bytes += r.file_bytes;
	}
	rc = emb_snap_manifest_write(tmp, e, n);
	if (rc)
		goto err;
	/* A name taken meanwhile by the other writer (a directory is not
	 * renamed over one that has files): the next id after it. Nothing
	 * inside names the link's own id, so the link moves as it is. */
	for (int tries = 0; rename(tmp, fin) != 0; tries++) {
		rc = -errno;
		if ((rc != -ENOTEMPTY && rc != -EEXIST) || tries == 8)
			goto err;
		id = next_id(root);
		snprintf(res->name, sizeof(res->name),
			 EMB_CHAIN_PREFIX "%016llu%s", (unsigned long long)id,
			 delta ? EMB_CHAIN_DELTA : "");
		snprintf(fin, sizeof(fin), "%s/%s", root, res->name);
	}
	free(e);
	res->id = id;
	return fsync_dir(root);
err:
	emb_chain_rm(root, tmp + strlen(root) + 1);
	free(e);
	return rc;
}

bool emb_chain_is_root(const char *dir)
{
	struct dirent *de;
	bool yes = false;
	DIR *d = opendir(dir);

	if (!d)
		return false;
	while (!yes && (de = readdir(d)) != NULL) {
		uint64_t id;
		bool delta;

		yes = parse_name(de->d_name, &id, &delta);
	}
	closedir(d);
	return yes;
}

/* The CLI's sink: standalone tables, collected. */
struct collect {
	struct emb_table **t; /* tables made */
	uint32_t n;	      /* in t */
	uint32_t cap;	      /* room in t */
};

static int collect_open(void *arg, const struct emb_snap_meta *m,
			struct emb_table **out)
{
	struct collect *c = arg;
	struct emb_table_opts o;
	int rc;

	if (c->n == c->cap) {
		uint32_t cap = c->cap ? 2 * c->cap : 8;
		struct emb_table **v = realloc(c->t, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		c->t = v;
		c->cap = cap;
	}
	emb_snap_meta_to_opts(m, &o);
	rc = emb_table_create(&o, out);
	if (!rc)
		c->t[c->n++] = *out;
	return rc;
}

int emb_chain_load_newest(const char *root, struct emb_table ***t,
			  uint32_t *n, char *why, size_t why_cap)
{
	struct emb_chain_link *l;
	struct collect c = {0};
	struct emb_chain_sink sink = {.open = collect_open, .arg = &c};
	uint32_t nl, full, span;
	uint64_t rows;
	int rc;
	char dummy[8];

	if (!why) {
		why = dummy;
		why_cap = sizeof(dummy);
	}
	why[0] = '\0';
	rc = emb_chain_list(root, &l, &nl);
	if (rc)
		return rc;
	/* The newest link decides: it and every link back to its full. */
	full = nl;
	for (uint32_t i = nl; i-- > 0;)
		if (!l[i].delta) {
			full = i;
			break;
		}
	if (nl == 0 || full == nl) {
		snprintf(why, why_cap, "%s", nl ? "no full checkpoint"
						: "no checkpoint");
		rc = nl ? EMB_ECHAIN : -ENOENT;
		goto out;
	}
	span = emb_chain_span(l, nl, full);
	if (full + span + 1 != nl) {
		const struct emb_chain_link *b = &l[full + span + 1];

		snprintf(why, why_cap, "%s does not continue the chain of %s",
			 b->name, l[full].name);
		rc = EMB_ECHAIN;
		goto out;
	}
	for (uint32_t k = full; k < nl; k++) {
		rc = emb_chain_verify(root, &l[k]);
		if (rc) {
			snprintf(why, why_cap, "%s/%s: %s", l[k].name,
				 l[k].bad, emb_strerror(rc));
			goto out;
		}
	}
	rc = emb_chain_load(root, l, full, nl - 1, &sink, &rows);
	if (rc) {
		snprintf(why, why_cap, "loading the chain of %s: %s",
			 l[full].name, emb_strerror(rc));
		goto out;
	}
	snprintf(why, why_cap, "%s and %u delta%s, %u table%s, newest %s",
		 l[full].name, span, span == 1 ? "" : "s", c.n,
		 c.n == 1 ? "" : "s", l[nl - 1].name);
	*t = c.t;
	*n = c.n;
	c.t = NULL;
	c.n = 0;
out:
	for (uint32_t i = 0; i < c.n; i++)
		emb_table_destroy(c.t[i]);
	free(c.t);
	emb_chain_free(l, nl);
	return rc;
}

/* The tables as a dump: TABLE.embs each, then the MANIFEST. */
static int write_dump(const char *dir, struct emb_table **t, uint32_t n,
		      struct emb_chain_result *res)
{
	char p[PATH_CAP + 300];
	struct emb_snap_entry *e = calloc(n ? n : 1, sizeof(*e));
	int rc = 0;

	if (!e)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && !rc; i++) {
		struct emb_snap_result r;

		snprintf(e[i].file, sizeof(e[i].file), "%s.embs",
			 emb_table_name(t[i]));
		snprintf(e[i].table, sizeof(e[i].table), "%s",
			 emb_table_name(t[i]));
		e[i].nparts = 1;
		snprintf(p, sizeof(p), "%s/%s", dir, e[i].file);
		rc = emb_snap_write_table(t[i], p, NULL, &r);
		e[i].rows = r.rows;
		e[i].bytes = r.file_bytes;
		e[i].checksum = r.checksum;
		res->rows += r.rows;
		res->bytes += r.file_bytes;
	}
	if (!rc)
		rc = emb_snap_manifest_write(dir, e, n);
	free(e);
	return rc;
}

int emb_chain_compact(const char *root, const char *out_dir,
		      struct emb_chain_result *res, char *why, size_t why_cap)
{
	struct emb_chain_result dummy;
	struct emb_chain_table *ct = NULL;
	struct emb_table **t = NULL;
	uint32_t n = 0;
	int rc;

	if (!res)
		res = &dummy;
	memset(res, 0, sizeof(*res));
	rc = emb_chain_load_newest(root, &t, &n, why, why_cap);
	if (rc)
		return rc;
	if (out_dir) {
		rc = write_dump(out_dir, t, n, res);
	} else {
		ct = calloc(n ? n : 1, sizeof(*ct));
		if (!ct) {
			rc = -ENOMEM;
		} else {
			for (uint32_t i = 0; i < n; i++)
				ct[i].t = t[i];
			rc = emb_chain_write(root, ct, n, 0, 0, res);
		}
	}
	if (rc && why)
		snprintf(why, why_cap, "writing the merged tables: %s",
			 emb_strerror(rc));
	free(ct);
	for (uint32_t i = 0; i < n; i++)
		emb_table_destroy(t[i]);
	free(t);
	return rc;
}
