/*
 * tests/store/test_snap_rowfmt.c - snapshot files of tables kept in fp16,
 * bf16 and int8: every format and optimizer round-trips bit for bit
 * (weights as kept, optimizer state, meta, and the table's format and
 * rounding), checkpoints and deltas carry the format, fp32 files stay
 * version 1, a header naming a format wrongly is refused, a load into a
 * table of another format is refused untouched, and rows converted between
 * formats (what `embstore restore --row-format` does) stay within half a
 * step of the format. Single-threaded; files go to a fresh temp dir.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "store_test.h"

#include "common/rowfmt.h"
#include "store/chain.h"
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

static struct emb_table_opts opts_for(uint32_t fmt, uint32_t kind,
				      uint32_t dim)
{
	struct emb_table_opts o = EMB_TABLE_OPTS_DEFAULT;

	o.name = "fmt.t";
	o.dim = dim;
	o.optim.kind = kind;
	o.optim.lr = 0.05f;
	o.init = (struct emb_init_cfg){
	    .kind = EMB_INIT_NORMAL, .a = 0.0f, .b = 0.3f};
	o.seed = 0xf0f0u + kind;
	o.nshards = 8;
	o.row_format = fmt;
	return o;
}

/* n rows from a wide id range, pushed three times (stochastic rounding
 * leaves low bits that a decode and re-encode would not keep). */
static struct emb_table *table_filled(const struct emb_table_opts *o,
				      uint32_t n, uint64_t seed,
				      uint64_t *ids_out)
{
	struct emb_table *t = table_new(o);
	float *g = xcalloc((size_t)n * o->dim, sizeof(float));
	uint64_t st = seed;

	for (uint32_t i = 0; i < n; i++)
		ids_out[i] = emb_splitmix64(&st) >> (i % 3 ? 20 : 0);
	for (int round = 0; round < 3; round++) {
		for (size_t j = 0; j < (size_t)n * o->dim; j++)
			g[j] = (float)((int64_t)(emb_splitmix64(&st) >> 40) -
				       (1 << 23)) /
			       (float)(1 << 23);
		CU_ASSERT_EQUAL(emb_table_push(t, ids_out, n - round * 7, g),
				0);
	}
	free(g);
	return t;
}

/* ids[0..n) hold the same raw weights (pull_raw) and the same full rows
 * and meta (iterator) in a and b, and b holds no other row. */
static void assert_same(struct emb_table *a, struct emb_table *b,
			const uint64_t *ids, uint32_t n)
{
	uint32_t ww = emb_table_weight_words(a), rf = emb_table_row_floats(a);
	uint32_t *ra = xcalloc((size_t)n * ww, 4), *rb = xcalloc((size_t)n * ww, 4);
	uint8_t *fa = xcalloc(n, 1), *fb = xcalloc(n, 1);
	struct emb_table_iter *it;
	float *row = xcalloc(rf, sizeof(float)), *other = xcalloc(rf, 4);
	struct emb_row_meta m, mo;
	uint64_t id, seen = 0;

	CU_ASSERT_EQUAL_FATAL(emb_table_weight_words(b), ww);
	CU_ASSERT_EQUAL_FATAL(emb_table_row_floats(b), rf);
	CU_ASSERT(emb_table_pull_raw(a, ids, n, ra, EMB_PULL_NOCREATE, fa) >=
		  0);
	CU_ASSERT(emb_table_pull_raw(b, ids, n, rb, EMB_PULL_NOCREATE, fb) >=
		  0);
	CU_ASSERT(memcmp(fa, fb, n) == 0);
	CU_ASSERT(memcmp(ra, rb, (size_t)n * ww * 4) == 0);
	/* Full rows: each of b's rows is a's row of that id, bit for bit. */
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(b, &it), 0);
	while (emb_table_iter_next(it, &id, row, &m, 1) == 1) {
		struct emb_table_iter *jt;
		bool found = false;
		uint64_t aid;

		/* a holds few rows in these tests; scan it. */
		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &jt), 0);
		while (!found &&
		       emb_table_iter_next(jt, &aid, other, &mo, 1) == 1)
			found = aid == id;
		emb_table_iter_destroy(jt);
		CU_ASSERT_FATAL(found);
		CU_ASSERT(memcmp(row, other, (size_t)rf * 4) == 0);
		CU_ASSERT_EQUAL(m.count, mo.count);
		CU_ASSERT_EQUAL(m.last_step, mo.last_step);
		seen++;
	}
	emb_table_iter_destroy(it);
	CU_ASSERT_EQUAL(seen, table_stats(a).rows);
	free(other);
	free(row);
	free(fb);
	free(fa);
	free(rb);
	free(ra);
}

static void round_trip(uint32_t fmt, uint32_t kind, uint32_t rounding,
		       bool shuffle)
{
	struct emb_table_opts o = opts_for(fmt, kind, 13), got;
	struct emb_snap_write_opts wo = EMB_SNAP_WRITE_OPTS_DEFAULT;
	struct emb_snap_meta m;
	struct emb_table *a, *b = NULL;
	uint64_t ids[300];
	const char *p = path_in("rt.embs");

	o.rounding = rounding;
	a = table_filled(&o, 300, fmt * 16 + kind, ids);
	wo.shuffle = shuffle;
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, &wo, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_verify(p, 0, &m, NULL), 0);
	CU_ASSERT_EQUAL(m.row_format, fmt);
	CU_ASSERT_EQUAL(m.rounding, rounding);
	CU_ASSERT_EQUAL(m.row_floats, emb_table_row_floats(a));
	CU_ASSERT_EQUAL(m.state_floats, emb_optim_state_floats(kind, 13));
	CU_ASSERT_EQUAL(m.version, 2);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(p, NULL, &b), 0);
	emb_table_get_opts(b, &got);
	CU_ASSERT_EQUAL(got.row_format, fmt);
	CU_ASSERT_EQUAL(got.rounding, rounding);
	assert_same(a, b, ids, 300);
	emb_table_destroy(b);
	emb_table_destroy(a);
	unlink(p);
}

static void test_round_trip_every_format(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP16, EMB_ROWFMT_BF16,
					EMB_ROWFMT_INT8};
	static const uint32_t kinds[] = {EMB_OPTIM_SGD, EMB_OPTIM_ADAGRAD,
					 EMB_OPTIM_ADAM};

	for (int f = 0; f < 3; f++)
		for (int k = 0; k < 3; k++)
			round_trip(fmts[f], kinds[k],
				   k == 1 ? EMB_ROUND_NEAREST
					  : EMB_ROUND_STOCHASTIC,
				   k == 2);
}

/* Full walk, then a delta after more pushes: replayed into a table made
 * from the full's metadata, the chain gives the live table back. */
static void test_checkpoint_chain_keeps_format(void)
{
	struct emb_table_opts o = opts_for(EMB_ROWFMT_INT8, EMB_OPTIM_ADAM, 9);
	struct emb_table *a, *b = NULL;
	const char *full = path_in("full.embs"), *delta = path_in("d.embs");
	float g[40 * 9];
	struct emb_snap_meta m;
	uint64_t ids[300];

	a = table_filled(&o, 300, 7, ids);
	CU_ASSERT_EQUAL_FATAL(
	    emb_snap_write_ckpt(a, full, false, 0, 0, NULL, NULL), 0);
	for (size_t j = 0; j < 40 * 9; j++)
		g[j] = 0.01f * (float)(j % 17) - 0.08f;
	CU_ASSERT_EQUAL(emb_table_push(a, ids + 100, 40, g), 0);
	CU_ASSERT_EQUAL(emb_table_erase(a, ids + 200, 5), 5);
	CU_ASSERT_EQUAL_FATAL(
	    emb_snap_write_ckpt(a, delta, true, 1, 1, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_verify(delta, 0, &m, NULL), 0);
	CU_ASSERT_EQUAL(m.row_format, EMB_ROWFMT_INT8);
	CU_ASSERT(m.flags & EMB_SNAP_F_DELTA);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(full, NULL, &b), 0);
	CU_ASSERT_EQUAL(emb_snap_load_table(delta, b), 40);
	assert_same(a, b, ids, 300);
	emb_table_destroy(b);
	emb_table_destroy(a);
}

/* A server's checkpoint directory of a bf16 table (a full and a delta),
 * loaded back and compacted: the tables come back bf16, bit for bit. */
static void test_chain_load_and_compact_keep_format(void)
{
	struct emb_table_opts o = opts_for(EMB_ROWFMT_BF16, EMB_OPTIM_ADAGRAD,
					   12);
	struct emb_chain_result full, delta, comp;
	struct emb_chain_table ct;
	struct emb_table *a, **got = NULL;
	char root[600], why[512];
	float g[30 * 12];
	uint64_t ids[300];
	uint32_t n = 0;

	snprintf(root, sizeof(root), "%s/ckpt-root", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(root, 0755), 0);
	o.rounding = EMB_ROUND_NEAREST;
	a = table_filled(&o, 300, 21, ids);
	ct = (struct emb_chain_table){.t = a, .delta = false};
	CU_ASSERT_EQUAL_FATAL(emb_chain_write(root, &ct, 1, 0, 0, &full), 0);
	for (size_t j = 0; j < 30 * 12; j++)
		g[j] = 0.02f * (float)(j % 11) - 0.1f;
	CU_ASSERT_EQUAL(emb_table_push(a, ids + 50, 30, g), 0);
	ct.delta = true;
	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_write(root, &ct, 1, full.id, full.id, &delta), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_load_newest(root, &got, &n, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	CU_ASSERT_EQUAL(emb_table_row_format(got[0]), EMB_ROWFMT_BF16);
	assert_same(a, got[0], ids, 300);
	emb_table_destroy(got[0]);
	free(got);
	/* Compacted into a new full, which loads the same. */
	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_compact(root, NULL, &comp, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL_FATAL(
	    emb_chain_load_newest(root, &got, &n, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL_FATAL(n, 1);
	{
		struct emb_table_opts q;

		emb_table_get_opts(got[0], &q);
		CU_ASSERT_EQUAL(q.row_format, EMB_ROWFMT_BF16);
		CU_ASSERT_EQUAL(q.rounding, EMB_ROUND_NEAREST);
	}
	assert_same(a, got[0], ids, 300);
	emb_table_destroy(got[0]);
	free(got);
	emb_table_destroy(a);
}

static uint8_t *slurp(const char *p, size_t *len)
{
	FILE *f = fopen(p, "rb");
	uint8_t *buf;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = xcalloc(*len, 1);
	CU_ASSERT_EQUAL_FATAL(fread(buf, 1, *len, f), *len);
	fclose(f);
	return buf;
}

/* Rewrites header bytes [at, at+4) of src into dst with a matching header
 * checksum, and returns the verdict of opening dst. */
/*
 * Opens a copy of src whose header has v at byte at (checksum made good);
 * the reader's answer, and its meta in *m when m is not NULL.
 */
static int header_with(const char *src, const char *dst, uint32_t at,
		       uint32_t v, struct emb_snap_meta *m)
{
	size_t len;
	uint8_t *f = slurp(src, &len);
	struct emb_snap_reader *r;
	uint64_t h;
	FILE *out;
	int rc;

	memcpy(f + at, &v, 4);
	h = XXH3_64bits(f, 248);
	memcpy(f + 248, &h, 8);
	out = fopen(dst, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_EQUAL(fwrite(f, 1, len, out), len);
	fclose(out);
	free(f);
	/* The header alone: the file checksum covers it, so a whole read
	 * of an accepted header fails later, as it should. */
	rc = emb_snap_reader_open(dst, 0, &r);
	if (!rc) {
		if (m)
			*m = *emb_snap_reader_meta(r);
		emb_snap_reader_close(r);
	}
	unlink(dst);
	return rc;
}

static int with_header_u32(const char *src, const char *dst, uint32_t at,
			   uint32_t v)
{
	return header_with(src, dst, at, v, NULL);
}

static void test_header_versions(void)
{
	struct emb_table_opts o32 = opts_for(EMB_ROWFMT_FP32, EMB_OPTIM_SGD, 5);
	struct emb_table_opts o16 = opts_for(EMB_ROWFMT_FP16, EMB_OPTIM_SGD, 5);
	const char *p32 = path_in("v1.embs"), *p16 = path_in("v2.embs");
	const char *bad = path_in("bad.embs");
	struct emb_table *a, *b;
	struct emb_snap_meta m;
	uint64_t ids[50];
	uint8_t *f;
	size_t len;

	/* An fp32 table (even one made with nearest rounding) writes what
	 * version 1 wrote: older readers still read it. */
	o32.rounding = EMB_ROUND_NEAREST;
	a = table_filled(&o32, 50, 1, ids);
	b = table_filled(&o16, 50, 2, ids);
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p32, NULL, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(b, p16, NULL, NULL), 0);
	f = slurp(p32, &len);
	CU_ASSERT_EQUAL(f[8], 1);
	for (int i = 240; i < 248; i++)
		CU_ASSERT_EQUAL(f[i], 0);
	free(f);
	CU_ASSERT_EQUAL(emb_snap_verify(p32, 0, &m, NULL), 0);
	CU_ASSERT_EQUAL(m.version, 1);
	CU_ASSERT_EQUAL(m.row_format, EMB_ROWFMT_FP32);
	CU_ASSERT_EQUAL(m.row_floats, 5);
	f = slurp(p16, &len);
	CU_ASSERT_EQUAL(f[8], 2);
	CU_ASSERT_EQUAL(f[240], EMB_ROWFMT_FP16);
	CU_ASSERT_EQUAL(f[241], 0); /* stochastic */
	CU_ASSERT_EQUAL(f[88], 3);  /* 10 bytes of weights: 3 words */
	free(f);
	/* One encoding per table: a version 1 file naming a format, a
	 * version 2 file naming fp32, an unknown format or a flag beyond
	 * bit 8, fp32 marked nearest, version 3. */
	CU_ASSERT_EQUAL(with_header_u32(p32, bad, 240, EMB_ROWFMT_FP16),
			EMB_EDUMPFORMAT);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, 0), EMB_EDUMPFORMAT);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, 4), EMB_EDUMPFORMAT);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, 0x201),
			EMB_EDUMPFORMAT);
	/* Bytes 244..247 are the tier word: a mode past "on" is refused,
	 * "off" with 4 MiB reads back as such. */
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 244, 3), EMB_EDUMPFORMAT);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 244, 1 | 4u << 2), 0);
	CU_ASSERT_EQUAL(header_with(p16, bad, 244, 1 | 4u << 2, &m), 0);
	CU_ASSERT_EQUAL(m.tier_mode, EMB_TIER_OFF);
	CU_ASSERT_EQUAL(m.tier_request, 4u << 20);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 8, 3), EMB_EDUMPFORMAT);
	/* bf16 has fp16's row size: the header alone tells them apart. */
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, EMB_ROWFMT_BF16), 0);
	/* int8 rows of dim 5 are 13 bytes: 4 words, not fp16's 3. */
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, EMB_ROWFMT_INT8),
			EMB_EDUMPFORMAT);
	CU_ASSERT_EQUAL(with_header_u32(p16, bad, 240, 0x101), 0);
	emb_table_destroy(a);
	emb_table_destroy(b);
	unlink(p32);
	unlink(p16);
}

/* A file goes only into a table of its own format: the rows are not
 * reinterpreted, and the table keeps every row it had. */
static void test_other_format_refused_untouched(void)
{
	static const uint32_t fmts[] = {EMB_ROWFMT_FP32, EMB_ROWFMT_FP16,
					EMB_ROWFMT_BF16, EMB_ROWFMT_INT8};
	const char *p = path_in("mis.embs");
	uint64_t ids[60];

	for (int f = 0; f < 4; f++) {
		struct emb_table_opts o =
		    opts_for(fmts[f], EMB_OPTIM_ADAGRAD, 6);
		struct emb_table *a = table_filled(&o, 60, 3, ids);

		CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p, NULL, NULL),
				      0);
		for (int g = 0; g < 4; g++) {
			struct emb_table_opts q =
			    opts_for(fmts[g], EMB_OPTIM_ADAGRAD, 6);
			struct emb_table *b = table_new(&q);
			uint64_t one = 42;
			float w[6] = {1, 2, 3, 4, 5, 6};

			CU_ASSERT_EQUAL(
			    emb_table_assign(b, &one, 1, w, false, NULL), 0);
			CU_ASSERT_EQUAL(emb_snap_load_table(p, b),
					f == g ? 60 : EMB_EBADFORMAT);
			CU_ASSERT_EQUAL(table_stats(b).rows, f == g ? 61 : 1);
			emb_table_destroy(b);
		}
		emb_table_destroy(a);
	}
	unlink(p);
}

/* Rewrites the file at in as format fmt at out, every row converted. */
static void convert_file(const char *in, const char *out, uint32_t fmt)
{
	struct emb_snap_reader *r;
	struct emb_snap_writer *w;
	struct emb_snap_block b;
	struct emb_snap_meta m;
	struct emb_row_meta *meta;
	float *rows;
	int n;

	CU_ASSERT_EQUAL_FATAL(emb_snap_reader_open(in, 0, &r), 0);
	m = *emb_snap_reader_meta(r);
	CU_ASSERT_EQUAL_FATAL(
	    emb_snap_meta_set_format(&m, fmt, EMB_ROUND_STOCHASTIC), 0);
	CU_ASSERT_EQUAL_FATAL(emb_snap_writer_create(out, &m, NULL, &w), 0);
	while ((n = emb_snap_reader_next(r, &b)) > 0) {
		const struct emb_snap_meta *from = emb_snap_reader_meta(r);

		rows = xcalloc((size_t)b.n * m.row_floats, sizeof(float));
		meta = xcalloc(b.n, sizeof(*meta));
		for (uint32_t i = 0; i < b.n; i++) {
			CU_ASSERT(emb_snap_row_convert(
			    from, fmt, b.rows + (size_t)i * from->row_floats,
			    rows + (size_t)i * m.row_floats));
			meta[i] = (struct emb_row_meta){b.last_step[i],
							b.count[i]};
		}
		CU_ASSERT_EQUAL(
		    emb_snap_writer_add(w, b.ids, rows, meta, b.n), 0);
		free(meta);
		free(rows);
	}
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(emb_snap_writer_finish(w, NULL), 0);
	emb_snap_writer_destroy(w);
	emb_snap_reader_close(r);
}

/* Half the gap between x and the next fp16 away from zero. */
static double fp16_half_ulp(float x)
{
	int e;

	frexpf(fabsf(x), &e); /* |x| in [2^(e-1), 2^e) */
	if (e - 1 < -14)
		return ldexp(1.0, -25); /* subnormal spacing 2^-24 */
	return ldexp(1.0, e - 1 - 11);
}

static void test_convert_fp32_compact_and_back(void)
{
	struct emb_table_opts o = opts_for(EMB_ROWFMT_FP32, EMB_OPTIM_ADAM, 11);
	const char *p32 = path_in("c32.embs"), *pc = path_in("c16.embs"),
		   *pb = path_in("cback.embs");
	struct emb_table *a, *h = NULL, *i8 = NULL, *back = NULL;
	uint32_t rf = emb_optim_state_floats(EMB_OPTIM_ADAM, 11) + 11;
	float *ra = xcalloc(rf, 4), *rh = xcalloc(rf, 4), *rb = xcalloc(rf, 4);
	float wh[11], wi[11];
	struct emb_table_iter *it;
	struct emb_snap_meta m;
	uint64_t ids[200], id;
	double worst = 0;

	a = table_filled(&o, 200, 11, ids);
	CU_ASSERT_EQUAL_FATAL(emb_snap_write_table(a, p32, NULL, NULL), 0);
	/* fp32 -> fp16: each weight within half an fp16 ulp, state as is. */
	convert_file(p32, pc, EMB_ROWFMT_FP16);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(pc, NULL, &h), 0);
	CU_ASSERT_EQUAL(emb_table_row_format(h), EMB_ROWFMT_FP16);
	/* ... and back to fp32: exactly the fp16 values. */
	convert_file(pc, pb, EMB_ROWFMT_FP32);
	CU_ASSERT_EQUAL_FATAL(emb_snap_verify(pb, 0, &m, NULL), 0);
	CU_ASSERT_EQUAL(m.version, 1);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(pb, NULL, &back), 0);
	convert_file(p32, pc, EMB_ROWFMT_INT8);
	CU_ASSERT_EQUAL_FATAL(emb_snap_load_new(pc, NULL, &i8), 0);
	CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &it), 0);
	while (emb_table_iter_next(it, &id, ra, NULL, 1) == 1) {
		float lo = ra[0], hi = ra[0], scale;

		CU_ASSERT_EQUAL(emb_table_pull(h, &id, 1, wh, 0, NULL), 0);
		for (int d = 0; d < 11; d++) {
			double err = fabs((double)wh[d] - ra[d]);

			CU_ASSERT(err <= fp16_half_ulp(ra[d]));
			worst = err > worst ? err : worst;
			lo = ra[d] < lo ? ra[d] : lo;
			hi = ra[d] > hi ? ra[d] : hi;
		}
		CU_ASSERT_EQUAL(emb_table_pull(back, &id, 1, rb, 0, NULL), 0);
		CU_ASSERT(memcmp(rb, wh, sizeof(wh)) == 0);
		/* int8: within half a step (scale / 2) and float rounding. */
		scale = (hi - lo) / 255.0f;
		CU_ASSERT_EQUAL(emb_table_pull(i8, &id, 1, wi, 0, NULL), 0);
		for (int d = 0; d < 11; d++)
			CU_ASSERT(fabs((double)wi[d] - ra[d]) <=
				  scale / 2 * 1.0001 + 1e-6);
	}
	emb_table_iter_destroy(it);
	CU_ASSERT(worst > 0); /* the conversion did round something */
	/* The state came across bit for bit. */
	{
		struct emb_table_iter *jt;
		uint32_t ww = emb_rowfmt_words(EMB_ROWFMT_FP16, 11);

		CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(h, &jt), 0);
		while (emb_table_iter_next(jt, &id, rh, NULL, 1) == 1) {
			struct emb_table_iter *kt;
			bool found = false;
			uint64_t aid;

			CU_ASSERT_EQUAL_FATAL(emb_table_iter_create(a, &kt),
					      0);
			while (!found &&
			       emb_table_iter_next(kt, &aid, ra, NULL, 1) == 1)
				found = aid == id;
			emb_table_iter_destroy(kt);
			CU_ASSERT_FATAL(found);
			CU_ASSERT(memcmp(rh + ww, ra + 11, (rf - 11) * 4) == 0);
		}
		emb_table_iter_destroy(jt);
	}
	emb_table_destroy(i8);
	emb_table_destroy(back);
	emb_table_destroy(h);
	emb_table_destroy(a);
	free(rb);
	free(rh);
	free(ra);
	unlink(p32);
	unlink(pc);
	unlink(pb);
}

/* A weight an fp16 row cannot hold is refused, never stored as Inf. */
static void test_convert_out_of_range_refused(void)
{
	struct emb_snap_meta m = {0};
	float src[4 + 4] = {1.0f, 70000.0f, 0.5f, -2.0f, 1, 2, 3, 4};
	float dst[2 + 4];

	m.dim = 4;
	m.state_floats = 4;
	m.optim.kind = EMB_OPTIM_ADAGRAD;
	CU_ASSERT_EQUAL(
	    emb_snap_meta_set_format(&m, EMB_ROWFMT_FP32, EMB_ROUND_NEAREST),
	    0);
	CU_ASSERT_EQUAL(m.row_floats, 8);
	CU_ASSERT_EQUAL(m.rounding, EMB_ROUND_STOCHASTIC); /* fp32: none */
	CU_ASSERT_FALSE(emb_snap_row_convert(&m, EMB_ROWFMT_FP16, src, dst));
	CU_ASSERT_TRUE(emb_snap_row_convert(&m, EMB_ROWFMT_BF16, src, dst));
	CU_ASSERT(memcmp(dst + 2, src + 4, 16) == 0);
	CU_ASSERT_EQUAL(emb_snap_meta_set_format(&m, 4, EMB_ROUND_NEAREST),
			EMB_EBADFORMAT);
	CU_ASSERT_EQUAL(emb_snap_meta_set_format(&m, EMB_ROWFMT_INT8, 2),
			EMB_EBADFORMAT);
}

/*
 * Two processes writing checkpoints into one directory at once (a server,
 * and `embstore compact` beside it) may pick the same id in the same
 * millisecond: neither may remove the other's link in the making, and
 * every link written must be there, whole, under a name of its own.
 */
static void test_two_writers_one_root(void)
{
	enum { LINKS = 40 };
	struct emb_table_opts o = opts_for(EMB_ROWFMT_FP16, EMB_OPTIM_SGD, 4);
	struct emb_chain_link *l = NULL;
	struct emb_chain_table ct;
	struct emb_table *a;
	char root[600];
	uint64_t ids[20];
	uint32_t n = 0;
	int st[2] = {-1, -1};
	pid_t pid[2];

	snprintf(root, sizeof(root), "%s/two-writers", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(root, 0755), 0);
	a = table_filled(&o, 20, 3, ids);
	ct = (struct emb_chain_table){.t = a, .delta = false};
	for (int w = 0; w < 2; w++) {
		pid[w] = fork();
		CU_ASSERT_FATAL(pid[w] >= 0);
		if (pid[w] == 0) {
			struct emb_chain_result r;

			for (int i = 0; i < LINKS; i++)
				if (emb_chain_write(root, &ct, 1, 0, 0, &r))
					_exit(1);
			_exit(0);
		}
	}
	for (int w = 0; w < 2; w++) {
		CU_ASSERT_EQUAL(waitpid(pid[w], &st[w], 0), pid[w]);
		CU_ASSERT(WIFEXITED(st[w]) && WEXITSTATUS(st[w]) == 0);
	}
	CU_ASSERT_EQUAL_FATAL(emb_chain_list(root, &l, &n), 0);
	CU_ASSERT_EQUAL(n, 2 * LINKS);
	for (uint32_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(emb_chain_verify(root, &l[i]), 0);
	emb_chain_free(l, n);
	emb_table_destroy(a);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"fp16, bf16, int8 x sgd, adagrad, adam round-trip bit for bit",
	     test_round_trip_every_format},
	    {"a full and a delta checkpoint keep an int8 table's format",
	     test_checkpoint_chain_keeps_format},
	    {"a checkpoint chain of a bf16 table loads and compacts as bf16",
	     test_chain_load_and_compact_keep_format},
	    {"fp32 files stay version 1; a wrong format word is refused",
	     test_header_versions},
	    {"a load into a table of another format is refused untouched",
	     test_other_format_refused_untouched},
	    {"fp32 -> fp16 within half an ulp, -> fp32 exact, int8 within "
	     "scale/2",
	     test_convert_fp32_compact_and_back},
	    {"a weight out of fp16's range is refused by a conversion",
	     test_convert_out_of_range_refused},
	    {"two processes writing checkpoints into one directory lose no "
	     "link",
	     test_two_writers_one_root},
	    {NULL, NULL},
	};
	int rc;

	dir = emb_test_tmpdir();
	rc = emb_test_main(argc, argv, "store/snap_rowfmt", cases);
	emb_test_rmtree(dir);
	free(dir);
	return rc;
}
