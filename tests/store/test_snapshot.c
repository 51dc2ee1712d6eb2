/*
 * tests/store/test_snapshot.c - snapshot files as store/snapshot.h specifies
 * them: bit-exact round trips of every optimizer's rows and lifecycle meta,
 * slot grouping, and refusal of damaged input (truncation, flipped bytes,
 * another version, a dim or optimizer mismatch, a short MANIFEST) with the
 * target table untouched; a full disk leaves nothing under the final name.
 * Single-threaded; files go to a fresh temp dir.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "store_test.h"

#include "store/snapshot.h"

static char *dir;

static char *path_in(const char *name)
{
	static char buf[8][512];
	static int k;
	char *p = buf[k++ % 8];

	snprintf(p, 512, "%s/%s", dir, name);
	return p;
}

static struct emb_table_opts opts_for(uint32_t kind, uint32_t dim)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.name = "snap.t";
	o.dim = dim;
	o.optim.kind = kind;
	o.optim.lr = 0.05f;
	o.init = (struct emb_init_cfg){
	    .kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 0.3f};
	o.seed = 0x5eed0000u + kind;
	o.nshards = 8;
	return o;
}

/* n rows with ids drawn from a wide range, each pushed a few times. */
static struct emb_table *table_filled(const struct emb_table_opts *o,
				      uint32_t n, uint64_t seed)
{
	struct emb_table *t = table_new(o);
	uint64_t *ids = xcalloc(n, sizeof(*ids));
	float *g = xcalloc((size_t)n * o->dim, sizeof(float));
	uint64_t st = seed;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = emb_splitmix64(&st) >> (i % 3 ? 20 : 0);
	for (int round = 0; round < 3; round++) {
		for (size_t j = 0; j < (size_t)n * o->dim; j++)
			g[j] = (float)((int64_t)(emb_splitmix64(&st) >> 40) -
				       (1 << 23)) /
			       (float)(1 << 23);
		CU_ASSERT_EQUAL(
		    emb_table_push(t, ids, n > 30 ? n - round * 7 : n, g), 0);
	}
	free(g);
	free(ids);
	return t;
}

/* Every row of a (weights, state, meta) is in b bit for bit, and no more. */
static void assert_same_rows(struct emb_table *a, struct emb_table *b)
{
	uint32_t rf = emb_table_row_floats(a);
	struct emb_table_iter *it;
	uint64_t ids[64];
	float *ra = xcalloc(64 * (size_t)rf, sizeof(float));
	struct emb_row_meta ma[64];
	uint64_t seen = 0;
	int got;

	CU_ASSERT_EQUAL_FATAL(rf, emb_table_row_floats(b));
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
	while ((got = emb_table_iter_next(it, ids, ra, ma, 64)) > 0) {
		for (int i = 0; i < got; i++) {
			struct emb_table_iter *jt;
			uint64_t id;
			float *rb = xcalloc(rf, sizeof(float));
			struct emb_row_meta mb;
			bool found = false;

			/* b holds few rows in these tests; scan it. */
			CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(b, &jt), 0);
			while (!found &&
			       emb_table_iter_next(jt, &id, rb, &mb, 1) == 1)
				found = id == ids[i];
			emb_table_iter_destroy(jt);
			CU_ASSERT_FATAL(found);
			CU_ASSERT(memcmp(rb, ra + (size_t)i * rf,
					 rf * sizeof(float)) == 0);
			CU_ASSERT_EQUAL(mb.last_step, ma[i].last_step);
			CU_ASSERT_EQUAL(mb.count, ma[i].count);
			free(rb);
			seen++;
		}
	}
	emb_table_iter_destroy(it);
	free(ra);
	CU_ASSERT_EQUAL(seen, table_stats(b).rows);
}

static void round_trip(uint32_t kind, bool shuffle, uint32_t block_bytes)
{
	struct emb_table_opts o = opts_for(kind, 7), got;
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_snap_result res;
	struct emb_snap_meta m;
	struct emb_table *a, *b = NULL;
	uint64_t sum = 0;
	const char *p = path_in("rt.embs");

	a = table_filled(&o, 700, kind);
	wo.shuffle = shuffle;
	wo.block_bytes = block_bytes;
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, &wo, &res), 0);
	CU_ASSERT_EQUAL(res.rows, table_stats(a).rows);
	CU_ASSERT(res.blocks >= 1);
	CU_ASSERT_EQUAL(emb_snap_verify(p, 0, &m, &sum), 0);
	CU_ASSERT_EQUAL(sum, res.checksum);
	CU_ASSERT_STRING_EQUAL(m.name, "snap.t");
	CU_ASSERT_EQUAL(m.dim, 7);
	CU_ASSERT_EQUAL(m.rows, res.rows);
	CU_ASSERT_EQUAL(m.step, table_stats(a).step);
	CU_ASSERT_EQUAL(m.file_bytes, res.file_bytes);
	CU_ASSERT_EQUAL(emb_snap_load_new(p, NULL, &b), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	emb_table_get_opts(b, &got);
	CU_ASSERT_STRING_EQUAL(got.name, "snap.t");
	CU_ASSERT(memcmp(&got.optim, &o.optim, sizeof(o.optim)) == 0);
	CU_ASSERT(memcmp(&got.init, &o.init, sizeof(o.init)) == 0);
	CU_ASSERT_EQUAL(got.seed, o.seed);
	assert_same_rows(a, b);
	emb_table_destroy(b);
	emb_table_destroy(a);
	unlink(p);
}

static void test_round_trip_sgd(void)
{
	round_trip(EMB_OPTIM_SGD, true, 1u << 20);
}

static void test_round_trip_adagrad(void)
{
	round_trip(EMB_OPTIM_ADAGRAD, false, 1u << 20);
}

static void test_round_trip_adam_small_blocks(void)
{
	round_trip(EMB_OPTIM_ADAM, true, 4096);
}

static void test_round_trip_ftrl(void)
{
	round_trip(EMB_OPTIM_FTRL, true, 8192);
}

static void test_round_trip_rowwise_adagrad(void)
{
	round_trip(EMB_OPTIM_ROWWISE_ADAGRAD, true, 4096);
}

/* Writes every row of t to p with the writer; is it direct? */
static bool write_by_writer(struct emb_table *t, const char *p, bool buffered,
			    struct emb_snap_result *res)
{
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	uint32_t rf = emb_table_row_floats(t);
	struct emb_snap_writer *w = NULL;
	struct emb_table_iter *it;
	struct emb_row_meta meta[512];
	struct emb_snap_meta m;
	uint64_t ids[512];
	float *rows = xcalloc(512, rf * sizeof(float));
	bool direct;
	int got;

	emb_snap_meta_from_table(t, &m);
	m.created_ns = 1234567890;
	wo.block_bytes = 64 << 10;
	wo.buffered = buffered;
	CU_ASSERT_EQUAL_FATAL(emb_snap_writer_create(p, &m, &wo, &w), 0);
	direct = emb_snap_writer_direct(w);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(t, &it), 0);
	while ((got = emb_table_iter_next(it, ids, rows, meta, 512)) > 0)
		CU_ASSERT_EQUAL(
		    emb_snap_writer_add(w, ids, rows, meta, (uint32_t)got), 0);
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(emb_snap_writer_finish(w, res), 0);
	emb_snap_writer_destroy(w);
	free(rows);
	return direct;
}

static uint8_t *slurp(const char *p, size_t *len);

/*
 * O_DIRECT writes (aligned stages, a padded last unit cut back, the header
 * written over the first unit) make the same bytes as buffered ones, over
 * many stages and a size that is no multiple of the unit; and where the
 * file system takes O_DIRECT, the writer uses it.
 */
static void test_direct_same_bytes(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAGRAD, 64);
	struct emb_table *a = table_filled(&o, 24000, 11);
	const char *pd = path_in("direct.embs"), *pb = path_in("buf.embs");
	struct emb_snap_result rd, rb;
	size_t nd, nb;
	uint8_t *bd, *bb;
	bool can;
	int fd;

	fd = open(path_in("probe"), O_WRONLY | O_CREAT | O_DIRECT, 0644);
	can = fd >= 0;
	if (fd >= 0)
		close(fd);
	unlink(path_in("probe"));
	CU_ASSERT_EQUAL(write_by_writer(a, pd, false, &rd), can);
	CU_ASSERT_FALSE(write_by_writer(a, pb, true, &rb));
	CU_ASSERT(rd.file_bytes > (8u << 20)); /* two stages and more */
	CU_ASSERT(rd.file_bytes % 4096 != 0);
	bd = slurp(pd, &nd);
	bb = slurp(pb, &nb);
	CU_ASSERT_EQUAL(nd, rd.file_bytes);
	CU_ASSERT_EQUAL_FATAL(nd, nb);
	CU_ASSERT(memcmp(bd, bb, nd) == 0);
	CU_ASSERT_EQUAL(rd.checksum, rb.checksum);
	CU_ASSERT_EQUAL(emb_snap_verify(pd, 0, NULL, NULL), 0);
	free(bb);
	free(bd);
	unlink(pd);
	unlink(pb);
	emb_table_destroy(a);
}

static void test_empty_table(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAM, 3);
	struct emb_table *a = table_new(&o), *b = NULL;
	struct emb_snap_result res;
	const char *p = path_in("empty.embs");

	CU_ASSERT_EQUAL(emb_snap_write_table(a, p, NULL, &res), 0);
	CU_ASSERT_EQUAL(res.rows, 0);
	CU_ASSERT_EQUAL(res.blocks, 0);
	CU_ASSERT_EQUAL(emb_snap_load_new(p, NULL, &b), 0);
	CU_ASSERT_EQUAL(table_stats(b).rows, 0);
	emb_table_destroy(b);
	emb_table_destroy(a);
	unlink(p);
}

/* Blocks cover one slot group each and list rows in slot order. */
static void test_blocks_grouped_by_slot(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_SGD, 4);
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_snap_reader *r;
	struct emb_snap_block blk;
	struct emb_table *a = table_filled(&o, 3000, 99);
	const char *p = path_in("slots.embs");
	uint64_t rows = 0;
	int n;

	wo.block_bytes = 4096;
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, &wo, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_reader_open(p, 0, &r), 0);
	while ((n = emb_snap_reader_next(r, &blk)) > 0) {
		CU_ASSERT_EQUAL(blk.slot_first / EMB_SNAP_GROUP_SLOTS,
				blk.slot_last / EMB_SNAP_GROUP_SLOTS);
		for (uint32_t i = 0; i < blk.n; i++) {
			uint32_t s = emb_id_slot(blk.ids[i]);

			CU_ASSERT(s >= blk.slot_first && s <= blk.slot_last);
			if (i)
				CU_ASSERT(s >= emb_id_slot(blk.ids[i - 1]));
		}
		rows += blk.n;
	}
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(rows, table_stats(a).rows);
	emb_snap_reader_close(r);
	emb_table_destroy(a);
	unlink(p);
}

/* ---- damaged input ---- */

static uint8_t *slurp(const char *p, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	int fd = open(p, O_RDONLY);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(fstat(fd, &st) == 0);
	buf = xcalloc((size_t)st.st_size, 1);
	CU_ASSERT_FATAL(read(fd, buf, (size_t)st.st_size) == st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

static void spit(const char *p, const uint8_t *buf, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(write(fd, buf, len) == (ssize_t)len);
	close(fd);
}

/* A dumped adam table, its file bytes, and a target table with rows. */
struct damage {
	struct emb_table_opts o;
	struct emb_table *src;
	struct emb_table *dst; /* must stay untouched */
	uint8_t *file;
	size_t len;
	char good[512];
	char bad[512];
};

static void damage_setup(struct damage *d)
{
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;

	d->o = opts_for(EMB_OPTIM_ADAM, 5);
	d->src = table_filled(&d->o, 400, 7);
	d->dst = table_filled(&d->o, 50, 8);
	snprintf(d->good, sizeof(d->good), "%s", path_in("good.embs"));
	snprintf(d->bad, sizeof(d->bad), "%s", path_in("bad.embs"));
	wo.block_bytes = 4096;
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(d->src, d->good, &wo, NULL),
			      0);
	d->file = slurp(d->good, &d->len);
}

static void damage_teardown(struct damage *d)
{
	emb_table_destroy(d->src);
	emb_table_destroy(d->dst);
	free(d->file);
	unlink(d->good);
	unlink(d->bad);
}

/* Loading bad into dst fails with want and changes nothing in dst. */
static void expect_refused(struct damage *d, int want)
{
	struct emb_table *copy = NULL;
	int64_t rc;

	CU_ASSERT_EQUAL(emb_snap_verify(d->bad, 0, NULL, NULL), want);
	/* A copy of dst to compare with afterwards. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_snap_write_table(d->dst, path_in("dst.embs"), NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_snap_load_new(path_in("dst.embs"), NULL, &copy), 0);
	rc = emb_snap_load_table(d->bad, d->dst);
	if (rc != want)
		fprintf(stderr, "\n    load: %lld (%s), want %d", (long long)rc,
			emb_strerror((int)rc), want);
	CU_ASSERT_EQUAL(rc, want);
	CU_ASSERT_EQUAL(table_stats(d->dst).rows, table_stats(copy).rows);
	assert_same_rows(copy, d->dst);
	CU_ASSERT_EQUAL(
	    emb_snap_load_new(d->bad, NULL, &(struct emb_table *){NULL}), want);
	emb_table_destroy(copy);
	unlink(path_in("dst.embs"));
}

static void test_truncated_refused(void)
{
	struct damage d;

	damage_setup(&d);
	size_t cuts[] = {0,
			 1,
			 100,
			 EMB_SNAP_HDR_SIZE - 1,
			 EMB_SNAP_HDR_SIZE,
			 EMB_SNAP_HDR_SIZE + 20,
			 d.len / 2,
			 d.len - EMB_SNAP_TRAILER_SIZE,
			 d.len - 8,
			 d.len - 1};

	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		spit(d.bad, d.file, cuts[i]);
		expect_refused(&d, EMB_ETRUNCATED);
	}
	damage_teardown(&d);
}

static void test_flipped_byte_refused(void)
{
	struct damage d;

	damage_setup(&d);
	size_t at[] = {
	    20,				       /* name */
	    81,				       /* dim */
	    160,			       /* rows */
	    250,			       /* header checksum */
	    EMB_SNAP_HDR_SIZE + 2,	       /* block magic */
	    EMB_SNAP_HDR_SIZE + 9,	       /* slot range */
	    EMB_SNAP_HDR_SIZE + 30,	       /* reserved */
	    EMB_SNAP_HDR_SIZE + 44,	       /* block checksum */
	    EMB_SNAP_HDR_SIZE + 100,	       /* payload */
	    d.len / 2,			       /* some later block */
	    d.len - EMB_SNAP_TRAILER_SIZE + 1, /* trailer magic */
	    d.len - 5000,		       /* slot table */
	    d.len - 1,			       /* file checksum */
	};

	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		d.file[at[i]] ^= 0x10;
		spit(d.bad, d.file, d.len);
		d.file[at[i]] ^= 0x10;
		/* Lengths are checked before checksums: a flipped size
		 * may read as truncation or as a bad field. */
		int rc = emb_snap_verify(d.bad, 0, NULL, NULL);

		if (rc != EMB_EBADDUMP)
			fprintf(stderr, "\n    flip at %zu: %d (%s)", at[i], rc,
				emb_strerror(rc));
		CU_ASSERT_EQUAL(rc, EMB_EBADDUMP);
		expect_refused(&d, EMB_EBADDUMP);
	}
	damage_teardown(&d);
}

static void test_wrong_version_refused(void)
{
	struct damage d;

	damage_setup(&d);
	/* A version after the newest, with a header checksum that matches
	 * it. */
	d.file[8] = 3;
	memcpy(d.file + 248, &(uint64_t){XXH3_64bits(d.file, 248)}, 8);
	spit(d.bad, d.file, d.len);
	expect_refused(&d, EMB_EDUMPFORMAT);
	/* Not a snapshot at all. */
	memset(d.file, 'x', 64);
	spit(d.bad, d.file, d.len);
	expect_refused(&d, EMB_EDUMPFORMAT);
	damage_teardown(&d);
}

static void test_dim_mismatch_refused(void)
{
	struct emb_table_opts o7 = opts_for(EMB_OPTIM_ADAM, 7);
	struct emb_table_opts o8 = opts_for(EMB_OPTIM_ADAM, 8);
	struct emb_table_opts s7 = opts_for(EMB_OPTIM_SGD, 7);
	struct emb_table *a = table_filled(&o7, 100, 1);
	struct emb_table *b8 = table_filled(&o8, 10, 2);
	struct emb_table *bs = table_filled(&s7, 10, 3);
	const char *p = path_in("dim.embs");

	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, NULL, NULL), 0);
	CU_ASSERT_EQUAL(emb_snap_load_table(p, b8), EMB_EBADDIM);
	CU_ASSERT_EQUAL(table_stats(b8).rows, 10);
	CU_ASSERT_EQUAL(emb_snap_load_table(p, bs), EMB_EBADOPTIM);
	CU_ASSERT_EQUAL(table_stats(bs).rows, 10);
	/* Same dim and optimizer: rows of the file join the table. */
	CU_ASSERT_EQUAL(emb_snap_load_table(p, a), (int64_t)table_stats(a).rows);
	emb_table_destroy(a);
	emb_table_destroy(b8);
	emb_table_destroy(bs);
	unlink(p);
}

/* ---- full disk ---- */

static int fail_after(void *arg, size_t nbytes)
{
	size_t *budget = arg;

	if (nbytes > *budget)
		return -ENOSPC;
	*budget -= nbytes;
	return 0;
}

static void assert_no_files(const char *p)
{
	char tmp[1024];

	CU_ASSERT(access(p, F_OK) != 0);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", p, (long)getpid());
	CU_ASSERT(access(tmp, F_OK) != 0);
}

static void test_full_disk_hook_leaves_nothing(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAGRAD, 16);
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_table *a = table_filled(&o, 2000, 5);
	const char *p = path_in("full.embs");
	size_t budgets[] = {0, 100, 300, 20000, 60000};

	wo.block_bytes = 4096;
	wo.write_hook = fail_after;
	for (size_t i = 0; i < sizeof(budgets) / sizeof(budgets[0]); i++) {
		size_t budget = budgets[i];

		wo.hook_arg = &budget;
		CU_ASSERT_EQUAL(emb_snap_write_table(a, p, &wo, NULL), -ENOSPC);
		assert_no_files(p);
	}
	emb_table_destroy(a);
}

/*
 * A real short file system: a 64 KiB tmpfs when we may mount one, else a
 * file size limit (SIGXFSZ ignored, so write fails with EFBIG).
 */
static void test_full_disk_real_leaves_nothing(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAM, 32);
	struct emb_table *a = table_filled(&o, 3000, 6);
	struct rlimit old, lim;
	bool mounted;
	char *mnt = path_in("mnt");
	char p[1024];
	int rc;

	CU_ASSERT_FATAL(mkdir(mnt, 0755) == 0);
	mounted = mount("tmpfs", mnt, "tmpfs", 0, "size=64k") == 0;
	snprintf(p, sizeof(p), "%s/full.embs", mnt);
	if (mounted) {
		rc = emb_snap_write_table(a, p, NULL, NULL);
		CU_ASSERT_EQUAL(rc, -ENOSPC);
	} else {
		signal(SIGXFSZ, SIG_IGN);
		getrlimit(RLIMIT_FSIZE, &old);
		lim = old;
		lim.rlim_cur = 64 << 10;
		CU_ASSERT_FATAL(setrlimit(RLIMIT_FSIZE, &lim) == 0);
		rc = emb_snap_write_table(a, p, NULL, NULL);
		setrlimit(RLIMIT_FSIZE, &old);
		CU_ASSERT_EQUAL(rc, -EFBIG);
	}
	assert_no_files(p);
	if (mounted)
		umount(mnt);
	rmdir(mnt);
	emb_table_destroy(a);
}

/* ---- manifest ---- */

static void test_manifest_round_trip_and_refusals(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_SGD, 4);
	struct emb_table *a = table_filled(&o, 100, 11);
	struct emb_snap_entry e[2] = {0}, *got = NULL;
	struct emb_snap_result res;
	char *mdir = path_in("dump");
	char p[1024], bad[EMB_SNAP_PATH_MAX];
	uint32_t n = 0;
	uint8_t *text;
	size_t len;

	CU_ASSERT_FATAL(mkdir(mdir, 0755) == 0);
	for (int i = 0; i < 2; i++) {
		snprintf(e[i].file, sizeof(e[i].file), "part-%05d.embs", i);
		snprintf(e[i].table, sizeof(e[i].table), "snap.t");
		e[i].part = (uint32_t)i;
		e[i].nparts = 2;
		snprintf(p, sizeof(p), "%s/%s", mdir, e[i].file);
		CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, NULL, &res),
				      0);
		e[i].rows = res.rows;
		e[i].bytes = res.file_bytes;
		e[i].checksum = res.checksum;
	}
	CU_ASSERT_EQUAL(emb_snap_manifest_read(mdir, &got, &n, bad), -ENOENT);
	CU_ASSERT_EQUAL_FATAL(emb_snap_manifest_write(mdir, e, 2), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_manifest_read(mdir, &got, &n, bad), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT(memcmp(got, e, sizeof(e)) == 0);
	free(got);

	/* A stray snapshot file that the manifest does not list. */
	snprintf(p, sizeof(p), "%s/stray.embs", mdir);
	spit(p, (const uint8_t *)"x", 1);
	CU_ASSERT_EQUAL(emb_snap_manifest_read(mdir, &got, &n, bad),
			EMB_EMANIFEST);
	CU_ASSERT_STRING_EQUAL(bad, "stray.embs");
	unlink(p);

	/* A listed file that is gone. */
	snprintf(p, sizeof(p), "%s/%s", mdir, e[1].file);
	rename(p, path_in("aside"));
	CU_ASSERT_EQUAL(emb_snap_manifest_read(mdir, &got, &n, bad),
			EMB_EMANIFEST);
	CU_ASSERT_STRING_EQUAL(bad, e[1].file);
	rename(path_in("aside"), p);

	/* The manifest itself edited: its own checksum fails. */
	snprintf(p, sizeof(p), "%s/MANIFEST", mdir);
	text = slurp(p, &len);
	text[len / 2] ^= 1;
	spit(p, text, len);
	CU_ASSERT_EQUAL(emb_snap_manifest_read(mdir, &got, &n, bad),
			EMB_EMANIFEST);
	free(text);
	emb_test_rmtree(mdir);
	emb_table_destroy(a);
}

/* ---- incremental checkpoints ---- */

/* Writes a walk of t to name (delta or full) and returns its metadata. */
static struct emb_snap_meta ckpt_to(struct emb_table *t, const char *name,
				    bool delta, uint64_t base, uint64_t prev)
{
	struct emb_snap_meta m;
	struct emb_snap_result res;

	CU_ASSERT_EQUAL_FATAL(emb_snap_write_ckpt(t, path_in(name), delta,
						  base, prev, NULL, &res),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_verify(path_in(name), 0, &m, NULL), 0);
	CU_ASSERT_EQUAL(m.rows, res.rows);
	return m;
}

static void push_ids(struct emb_table *t, const uint64_t *ids, uint32_t n,
		     float v)
{
	float *g = xcalloc((size_t)n * emb_table_dim(t), sizeof(float));

	for (size_t j = 0; j < (size_t)n * emb_table_dim(t); j++)
		g[j] = v + (float)(j % 7) * 0.01f;
	CU_ASSERT_EQUAL(emb_table_push(t, ids, n, g), 0);
	free(g);
}

static void test_delta_chain_replays_live_table(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAM, 5);
	struct emb_table *a = table_filled(&o, 2000, 7), *b = NULL;
	struct emb_snap_meta m;
	uint64_t st = 99, ids[64];
	char name[32];

	m = ckpt_to(a, "full.embs", false, 0, 0);
	CU_ASSERT_EQUAL(m.rows, table_stats(a).rows);
	CU_ASSERT_EQUAL(m.flags & EMB_SNAP_F_DELTA, 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(path_in("full.embs"), NULL, &b),
			      0);
	/* Nothing changed: an empty delta. */
	m = ckpt_to(a, "d0.embs", true, 1, 1);
	CU_ASSERT_EQUAL(m.rows, 0);
	CU_ASSERT_EQUAL(m.erased, 0);
	for (int round = 1; round <= (int)emb_test_rounds(10); round++) {
		struct emb_table_iter *it;
		uint64_t some[8];
		float *rows = xcalloc(8 * (size_t)emb_table_row_floats(a),
				      sizeof(float));
		int got;

		/* Pushes to old and new ids. */
		for (int k = 0; k < 64; k++)
			ids[k] = emb_splitmix64(&st) >> (k % 2 ? 52 : 20);
		push_ids(a, ids, 64, 0.1f * (float)round);
		/* Erases, one of them re-created, and an assign. */
		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
		got = emb_table_iter_next(it, some, rows, NULL, 8);
		emb_table_iter_destroy(it);
		CU_ASSERT_EQUAL_FATAL(got, 8);
		CU_ASSERT_EQUAL(emb_table_erase(a, some, 6), 6);
		push_ids(a, some, 1, -0.5f);
		CU_ASSERT_EQUAL(emb_table_assign(a, some + 6, 2, rows, true,
						 NULL),
				0);
		free(rows);
		snprintf(name, sizeof(name), "d%d.embs", round);
		m = ckpt_to(a, name, true, 1, (uint64_t)round);
		CU_ASSERT(m.flags & EMB_SNAP_F_DELTA);
		CU_ASSERT_EQUAL(m.base_id, 1);
		CU_ASSERT_EQUAL(m.prev_id, (uint64_t)round);
		CU_ASSERT_EQUAL(m.erased, 6);
		/* At most the pushed, re-created and assigned rows. */
		CU_ASSERT(m.rows >= 3 && m.rows <= 64 + 1 + 2);
		CU_ASSERT(emb_snap_load_table(path_in(name), b) >= 0);
		assert_same_rows(a, b);
	}
	emb_table_destroy(b);
	emb_table_destroy(a);
}

static void test_delta_erased_blocks_on_request(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_SGD, 3);
	struct emb_table *a = table_filled(&o, 300, 3);
	struct emb_snap_reader *r;
	struct emb_snap_block blk;
	uint64_t gone[3], seen_rows = 0, seen_erased = 0;
	struct emb_table_iter *it;
	float rows[3 * 3];
	int n;

	ckpt_to(a, "e-full.embs", false, 0, 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_next(it, gone, rows, NULL, 3), 3);
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(emb_table_erase(a, gone, 3), 3);
	push_ids(a, gone, 1, 1.0f);
	ckpt_to(a, "e-d.embs", true, 5, 6);
	/* Without the flag: rows only. */
	CU_ASSERT_EQUAL_FATAL(emb_snap_reader_open(path_in("e-d.embs"), 0, &r),
			      0);
	while ((n = emb_snap_reader_next(r, &blk)) > 0) {
		CU_ASSERT(!blk.erased);
		seen_rows += (uint64_t)n;
	}
	CU_ASSERT_EQUAL(n, 0);
	emb_snap_reader_close(r);
	CU_ASSERT_EQUAL(seen_rows, 1);
	/* With it: the removals first, then the rows. */
	CU_ASSERT_EQUAL_FATAL(emb_snap_reader_open(path_in("e-d.embs"),
						   EMB_SNAP_READ_ERASED, &r),
			      0);
	seen_rows = 0;
	while ((n = emb_snap_reader_next(r, &blk)) > 0) {
		if (blk.erased) {
			CU_ASSERT_EQUAL(seen_rows, 0);
			seen_erased += (uint64_t)n;
			CU_ASSERT_EQUAL(blk.ids[0], gone[0]);
		} else {
			seen_rows += (uint64_t)n;
			CU_ASSERT_EQUAL(blk.ids[0], gone[0]);
		}
	}
	CU_ASSERT_EQUAL(n, 0);
	emb_snap_reader_close(r);
	CU_ASSERT_EQUAL(seen_erased, 3);
	CU_ASSERT_EQUAL(seen_rows, 1);
	emb_table_destroy(a);
}

static void test_delta_too_many_removals_needs_full(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_SGD, 2);
	struct emb_table *a;
	struct emb_table_ckpt *c = NULL;
	uint64_t *ids = xcalloc(20000, sizeof(*ids));
	struct emb_snap_meta m;

	o.nshards = 1;
	a = table_new(&o);
	for (uint32_t i = 0; i < 20000; i++)
		ids[i] = i + 1;
	push_ids(a, ids, 20000, 0.5f);
	ckpt_to(a, "l-full.embs", false, 0, 0);
	/* Half the rows go: more than the shard keeps a list of. */
	CU_ASSERT_EQUAL(emb_table_erase(a, ids, 10000), 10000);
	CU_ASSERT_EQUAL(emb_table_ckpt_begin(a, true, &c), EMB_EDELTALOST);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(emb_snap_write_ckpt(a, path_in("l-d.embs"), true, 1,
					    1, NULL, NULL),
			EMB_EDELTALOST);
	CU_ASSERT(access(path_in("l-d.embs"), F_OK) != 0);
	/* A full walk works and starts the tracking over. */
	m = ckpt_to(a, "l-full2.embs", false, 0, 0);
	CU_ASSERT_EQUAL(m.rows, 10000);
	m = ckpt_to(a, "l-d2.embs", true, 1, 1);
	CU_ASSERT_EQUAL(m.rows, 0);
	CU_ASSERT_EQUAL(m.erased, 0);
	free(ids);
	emb_table_destroy(a);
}

/*
 * Removals and re-creations while a walk is inside the shard: applying the
 * walk, then the next delta, still gives the live table.
 */
static void test_delta_changes_during_walk(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAGRAD, 4);
	uint32_t rf, n;
	struct emb_table *a, *b = NULL;
	struct emb_table_ckpt *c;
	struct emb_row_meta meta[16];
	const uint64_t *gone;
	uint64_t ids[400], got_ids[16];
	float rows[16 * 8];
	int got, calls = 0;

	o.nshards = 1;
	a = table_new(&o);
	rf = emb_table_row_floats(a);
	for (uint32_t i = 0; i < 400; i++)
		ids[i] = 1000 + i;
	push_ids(a, ids, 400, 0.25f);
	ckpt_to(a, "w-full.embs", false, 0, 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(path_in("w-full.embs"), NULL,
						&b),
			      0);
	push_ids(a, ids, 400, 0.5f); /* every row marked */
	CU_ASSERT_EQUAL_FATAL(emb_table_ckpt_begin(a, true, &c), 0);
	n = (uint32_t)emb_table_ckpt_erased(c, &gone);
	CU_ASSERT_EQUAL(n, 0);
	while ((got = emb_table_ckpt_next(c, got_ids, rows, meta, 16)) > 0) {
		CU_ASSERT(rf <= 8);
		CU_ASSERT_EQUAL(emb_table_assign(b, got_ids, (uint32_t)got,
						 rows, true, meta),
				0);
		if (++calls == 5) {
			/* ids[0] was copied: removed, then made again
			 * (its record is reused, behind the walk). ids[399]
			 * is ahead: removed for good. ids[1] removed and
			 * made again too. */
			CU_ASSERT_EQUAL(emb_table_erase(a, ids, 2), 2);
			CU_ASSERT_EQUAL(emb_table_erase(a, ids + 399, 1), 1);
			push_ids(a, ids, 2, 2.0f);
		}
	}
	emb_table_ckpt_end(c);
	/* The next delta carries what the walk missed. */
	ckpt_to(a, "w-d.embs", true, 1, 1);
	CU_ASSERT(emb_snap_load_table(path_in("w-d.embs"), b) >= 0);
	assert_same_rows(a, b);
	emb_table_destroy(b);
	emb_table_destroy(a);
}

/* ---- point-in-time views ---- */

/* Changes a: pushes to old and new ids, erases, an assign. */
static void churn(struct emb_table *a, uint64_t *st, float v)
{
	struct emb_table_iter *it;
	uint64_t ids[128], some[16];
	float rows[16 * 16];
	int got;

	for (int k = 0; k < 128; k++)
		ids[k] = emb_splitmix64(st) >> (k % 2 ? 52 : 20);
	push_ids(a, ids, 128, v);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
	got = emb_table_iter_next(it, some, rows, NULL, 16);
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL_FATAL(got, 16);
	CU_ASSERT_EQUAL(emb_table_erase(a, some, 10), 10);
	CU_ASSERT_EQUAL(emb_table_assign(a, some + 10, 6, rows, true, NULL),
			0);
	push_ids(a, some, 3, -v); /* erased, made again */
}

static void test_view_is_one_instant(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_ADAM, 3);
	struct emb_table *a = table_filled(&o, 3000, 11), *ref = NULL, *b;
	struct emb_table_view *v = NULL, *v2 = NULL;
	uint32_t rf = emb_table_row_floats(a);
	uint64_t ids[100], st = 5, step;
	struct emb_row_meta meta[100];
	float *rows = xcalloc(100 * (size_t)rf, sizeof(float));
	int got, calls = 0;

	/* The reference: the table at the instant, through a snapshot. */
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, path_in("v.embs"), NULL,
						   NULL),
			      0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(path_in("v.embs"), NULL, &ref),
			      0);
	step = table_stats(a).step;
	CU_ASSERT_EQUAL_FATAL(emb_table_view_create(a, &v), 0);
	CU_ASSERT_EQUAL(emb_table_view_create(a, &v2), -EBUSY);
	CU_ASSERT_EQUAL(emb_table_view_step(v), step);
	CU_ASSERT_EQUAL(emb_table_view_rows(v), table_stats(ref).rows);
	o.name = "view.copy";
	b = table_new(&o);
	churn(a, &st, 0.5f);
	while ((got = emb_table_view_next(v, ids, rows, meta, 100)) > 0) {
		CU_ASSERT_EQUAL(emb_table_assign(b, ids, (uint32_t)got, rows,
						 true, meta),
				0);
		/* Writes go on while the view is read. */
		if (++calls % 5 == 0)
			churn(a, &st, 0.1f * (float)calls);
	}
	CU_ASSERT_EQUAL(got, 0);
	CU_ASSERT(calls > 10);
	emb_table_view_destroy(v);
	assert_same_rows(ref, b);
	CU_ASSERT(table_stats(a).step > step);
	/* Once destroyed, another can be taken. */
	CU_ASSERT_EQUAL(emb_table_view_create(a, &v2), 0);
	emb_table_view_destroy(v2);
	free(rows);
	emb_table_destroy(b);
	emb_table_destroy(ref);
	emb_table_destroy(a);
}

static void test_view_over_memory_limit_breaks(void)
{
	struct emb_table_opts o = opts_for(EMB_OPTIM_SGD, 64);
	struct emb_table *a;
	struct emb_table_view *v;
	uint64_t ids[2000], got_ids[10];
	float rows[10 * 64];
	struct emb_table_stats ts;
	int got;

	a = table_filled(&o, 2000, 13);
	ts = table_stats(a);
	emb_table_destroy(a);
	/* Room for the table and a little more, not for saving it all. */
	o.mem_limit = ts.bytes + 64 * 1024;
	a = table_filled(&o, 2000, 13);
	CU_ASSERT_EQUAL_FATAL(emb_table_view_create(a, &v), 0);
	for (uint32_t i = 0; i < 2000; i++)
		ids[i] = i;
	{
		struct emb_table_iter *it;
		float *r = xcalloc(2000 * 64, sizeof(float));

		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
		got = emb_table_iter_next(it, ids, r, NULL, 2000);
		emb_table_iter_destroy(it);
		free(r);
		CU_ASSERT_EQUAL_FATAL(got, 2000);
	}
	/* Every row written: the saves pass the limit; writes still work. */
	push_ids(a, ids, 2000, 0.25f);
	got = emb_table_view_next(v, got_ids, rows, NULL, 10);
	CU_ASSERT_EQUAL(got, EMB_EMEMLIMIT);
	emb_table_view_destroy(v);
	/* What the view held is given back. */
	CU_ASSERT(table_stats(a).bytes <= ts.bytes + 64 * 1024);
	emb_table_destroy(a);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"round trip sgd, rows and meta bit-exact", test_round_trip_sgd},
	    {"round trip adagrad unshuffled", test_round_trip_adagrad},
	    {"round trip adam in many small blocks",
	     test_round_trip_adam_small_blocks},
	    {"round trip ftrl", test_round_trip_ftrl},
	    {"round trip rowwise_adagrad", test_round_trip_rowwise_adagrad},
	    {"round trip of an empty table", test_empty_table},
	    {"direct writes make the bytes buffered ones make",
	     test_direct_same_bytes},
	    {"blocks grouped and sorted by slot", test_blocks_grouped_by_slot},
	    {"truncated file refused, table untouched", test_truncated_refused},
	    {"flipped byte refused, table untouched",
	     test_flipped_byte_refused},
	    {"wrong format version refused", test_wrong_version_refused},
	    {"dim or optimizer mismatch refused before touching",
	     test_dim_mismatch_refused},
	    {"full disk (hook) leaves no file",
	     test_full_disk_hook_leaves_nothing},
	    {"full disk (tmpfs or fsize limit) leaves no file",
	     test_full_disk_real_leaves_nothing},
	    {"manifest round trip, stray and missing files",
	     test_manifest_round_trip_and_refusals},
	    {"a full and 10 deltas replay the live table bit for bit",
	     test_delta_chain_replays_live_table},
	    {"a delta's removals come first, read only on request",
	     test_delta_erased_blocks_on_request},
	    {"too many removals: no delta until a full walk",
	     test_delta_too_many_removals_needs_full},
	    {"removals and re-creations during a walk reach the next delta",
	     test_delta_changes_during_walk},
	    {"a view reads one instant while writes go on",
	     test_view_is_one_instant},
	    {"a view whose saves pass the memory limit fails, writes do not",
	     test_view_over_memory_limit_breaks},
	    {NULL, NULL},
	};
	int rc;

	dir = emb_test_tmpdir();
	rc = emb_test_main(argc, argv, "store/snapshot", cases);
	emb_test_rmtree(dir);
	free(dir);
	return rc;
}
