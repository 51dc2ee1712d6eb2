/*
 * tools/bench_rocks.c - embstore-bench-rocks's backend: the in-process
 * workload of embstore-bench, served by a RocksDB database instead of a
 * tiered store table. It is the baseline the device tier is measured
 * against (docs/store.md, "The device tier"; docs/benchmarks.md): the key
 * -value store that Paddle's SSD table and FBGEMM's SSD embeddings put
 * under their rows, configured as a tier with the same DRAM budget.
 *
 * A row is one key (its 8-byte id, big-endian) and one value: the weights
 * and the optimizer's state as floats, dim * 4 bytes with SGD, where the
 * store's record adds 16 bytes of id and access meta (272 against 256 at
 * dim 64). A pull MultiGets the batch's distinct ids; a push MultiGets
 * them, applies the optimizer (emb_optim_apply, the store's code) to the
 * summed gradients of each and writes them back in one WriteBatch. A row
 * not found is made as the store makes it (emb_init_row with the table's
 * seed) and Put, so that both tables hold the same values.
 *
 * The budget, --mem-limit, is the block cache and the memtables together:
 * two memtables of limit / 16 (1 to 64 MiB) and the rest block cache, with
 * index and filter blocks charged to it (cache_index_and_filter_blocks),
 * so that the budget bounds them as the store's limit bounds its indexes.
 * Reads bypass the page cache (use_direct_reads), and so do flushes and
 * compactions, as the store's O_DIRECT tier does; no compression (float
 * rows do not compress, and the tier does not compress); bloom filters of
 * 10 bits a key; 4 KiB data blocks, the tier's block. Writes skip the WAL:
 * the database is scratch, made empty at open and destroyed at close, as
 * the tier's file is (rows outlive a process through checkpoints).
 *
 * After the preload the database is flushed and compacted whole (settle),
 * so the timed phase starts from RocksDB's best shape for reads: one
 * sorted run, no L0 files to look through; and read once in key order,
 * which fills the block cache (see rocks_settle).
 *
 * Threads: open, close, settle and mem on the main thread; each worker has
 * its own context. RocksDB is thread-safe, but a push is a read-modify-
 * write, so pushes take one mutex: two threads' pushes of a row would
 * otherwise lose one of them (the store locks per shard).
 */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/init.h"
#include "common/optim.h"

struct rocks_be {
	rocksdb_t *db;
	rocksdb_options_t *opts;
	rocksdb_block_based_table_options_t *topts;
	rocksdb_cache_t *cache;
	rocksdb_filterpolicy_t *filter; /* owned by topts once set */
	rocksdb_column_family_handle_t *cf;
	rocksdb_readoptions_t *ropts;
	rocksdb_writeoptions_t *wopts;
	pthread_mutex_t push_lock; /* pushes are read-modify-write */
	struct emb_optim_cfg optim;
	struct emb_init_cfg init;
	uint64_t seed;	       /* the initializer's, as the table's */
	uint32_t dim;	       /* floats of weights */
	uint32_t vfloats;      /* weights and state */
	uint32_t batch;	       /* largest n a call passes */
	_Atomic uint64_t rows; /* rows made: preload and misses */
	char path[4096];       /* the database's directory */
};

struct rocks_ctx {
	struct rocks_be *be;
	uint64_t *uniq;	       /* the batch's distinct ids */
	uint32_t *pos;	       /* ids[i] is uniq[pos[i]] */
	uint64_t *set;	       /* open addressing: id + 1, 0 = empty */
	uint32_t *set_idx;     /* the slot's index into uniq */
	uint32_t set_mask;     /* slots - 1 */
	unsigned char *keys;   /* 8 bytes a distinct id */
	const char **key_ptrs; /* into keys */
	size_t *key_lens;      /* all 8 */
	rocksdb_pinnableslice_t **vals;
	char **errs;
	float *rowbuf; /* uniq * vfloats: the rows read */
	float *gsum;   /* uniq * dim: summed gradients */
	rocksdb_writebatch_t *wb;
};

static void key_put(unsigned char *k, uint64_t id)
{
	for (int i = 7; i >= 0; i--) {
		k[i] = (unsigned char)id;
		id >>= 8;
	}
}

/* A new row's value, as the store makes it: initial weights, fresh state. */
static void row_new(const struct rocks_be *s, uint64_t id, float *v)
{
	emb_init_row(&s->init, s->seed, id, v, s->dim);
	if (s->vfloats > s->dim)
		emb_optim_state_init(&s->optim, v + s->dim, s->dim);
}

static int rocks_open(const struct emb_bench_cfg *cfg, void **out)
{
	const char *cf_name = "default";
	const rocksdb_options_t *cf_opts;
	struct rocks_be *s;
	uint64_t wbs, cache_bytes;
	char *err = NULL;
	int rc = -ENOMEM;

	if (!cfg->tier_dir || !cfg->mem_limit)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	if (snprintf(s->path, sizeof(s->path), "%s/%s.rocksdb", cfg->tier_dir,
		     cfg->table) >= (int)sizeof(s->path)) {
		free(s);
		return -ENAMETOOLONG;
	}
	pthread_mutex_init(&s->push_lock, NULL);
	s->optim = cfg->optim;
	s->init = cfg->init;
	s->seed = cfg->seed;
	s->dim = cfg->dim;
	s->vfloats =
	    cfg->dim + emb_optim_state_floats(cfg->optim.kind, cfg->dim);
	s->batch = cfg->batch;

	/* Two memtables and the block cache share the budget. */
	wbs = cfg->mem_limit / 16;
	if (wbs < (1u << 20))
		wbs = 1u << 20;
	if (wbs > (64u << 20))
		wbs = 64u << 20;
	if (cfg->mem_limit <= 4 * wbs) {
		fprintf(stderr,
			"embstore-bench: --mem-limit %" PRIu64
			" is too small for RocksDB's memtables and"
			" block cache (at least 4 MiB)\n",
			cfg->mem_limit);
		rc = -EINVAL;
		goto err_free;
	}
	cache_bytes = cfg->mem_limit - 2 * wbs;

	s->opts = rocksdb_options_create();
	s->topts = rocksdb_block_based_options_create();
	s->cache = rocksdb_cache_create_lru(cache_bytes);
	s->filter = rocksdb_filterpolicy_create_bloom_full(10);
	s->ropts = rocksdb_readoptions_create();
	s->wopts = rocksdb_writeoptions_create();
	if (!s->opts || !s->topts || !s->cache || !s->filter || !s->ropts ||
	    !s->wopts)
		goto err_free;
	rocksdb_block_based_options_set_block_size(s->topts, 4096);
	rocksdb_block_based_options_set_block_cache(s->topts, s->cache);
	rocksdb_block_based_options_set_filter_policy(s->topts, s->filter);
	s->filter = NULL; /* the table options own it now */
	rocksdb_block_based_options_set_cache_index_and_filter_blocks(s->topts,
								      1);
	rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(
	    s->topts, 1);
	rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(
	    s->topts, 1);
	rocksdb_options_set_block_based_table_factory(s->opts, s->topts);
	rocksdb_options_set_create_if_missing(s->opts, 1);
	rocksdb_options_set_compression(s->opts, rocksdb_no_compression);
	rocksdb_options_set_write_buffer_size(s->opts, wbs);
	rocksdb_options_set_max_write_buffer_number(s->opts, 2);
	rocksdb_options_set_level_compaction_dynamic_level_bytes(s->opts, 1);
	rocksdb_options_set_max_background_jobs(s->opts, 2);
	rocksdb_options_set_use_direct_reads(s->opts, 1);
	rocksdb_options_set_use_direct_io_for_flush_and_compaction(s->opts, 1);
	rocksdb_options_enable_statistics(s->opts);
	rocksdb_writeoptions_disable_WAL(s->wopts, 1);

	/* Scratch, as the tier's file: whatever was there goes. */
	rocksdb_destroy_db(s->opts, s->path, &err);
	if (err) {
		fprintf(stderr, "embstore-bench: rocksdb %s: %s\n", s->path,
			err);
		rocksdb_free(err);
		rc = -EIO;
		goto err_free;
	}
	cf_opts = s->opts;
	s->db = rocksdb_open_column_families(s->opts, s->path, 1, &cf_name,
					     &cf_opts, &s->cf, &err);
	if (err) {
		fprintf(stderr, "embstore-bench: rocksdb %s: %s\n", s->path,
			err);
		rocksdb_free(err);
		s->db = NULL;
		rc = -EIO;
		goto err_free;
	}
	*out = s;
	return 0;

err_free:
	if (s->wopts)
		rocksdb_writeoptions_destroy(s->wopts);
	if (s->ropts)
		rocksdb_readoptions_destroy(s->ropts);
	if (s->filter)
		rocksdb_filterpolicy_destroy(s->filter);
	if (s->topts)
		rocksdb_block_based_options_destroy(s->topts);
	if (s->cache)
		rocksdb_cache_destroy(s->cache);
	if (s->opts)
		rocksdb_options_destroy(s->opts);
	pthread_mutex_destroy(&s->push_lock);
	free(s);
	return rc;
}

static void rocks_close(void *be)
{
	struct rocks_be *s = be;
	char *err = NULL;

	if (!s)
		return;
	rocksdb_column_family_handle_destroy(s->cf);
	rocksdb_close(s->db);
	rocksdb_destroy_db(s->opts, s->path, &err);
	if (err)
		fprintf(stderr, "embstore-bench: rocksdb %s not removed: %s\n",
			s->path, err);
	/* free(), as rocksdb_free() is: GCC's -Wdangling-pointer cannot
	 * see through the library's call and warns at -O3. */
	free(err);
	rocksdb_writeoptions_destroy(s->wopts);
	rocksdb_readoptions_destroy(s->ropts);
	rocksdb_block_based_options_destroy(s->topts);
	rocksdb_cache_destroy(s->cache);
	rocksdb_options_destroy(s->opts);
	pthread_mutex_destroy(&s->push_lock);
	free(s);
}

static void rocks_thread_close(void *ctx)
{
	struct rocks_ctx *c = ctx;

	if (!c)
		return;
	if (c->wb)
		rocksdb_writebatch_destroy(c->wb);
	free(c->uniq);
	free(c->pos);
	free(c->set);
	free(c->set_idx);
	free(c->keys);
	free(c->key_ptrs);
	free(c->key_lens);
	free(c->vals);
	free(c->errs);
	free(c->rowbuf);
	free(c->gsum);
	free(c);
}

static int rocks_thread_open(void *be, uint32_t thread, void **out)
{
	struct rocks_be *s = be;
	struct rocks_ctx *c;
	uint32_t slots = 2, n = s->batch;

	(void)thread;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->be = s;
	while (slots < 2 * n)
		slots <<= 1;
	c->set_mask = slots - 1;
	c->uniq = malloc((size_t)n * sizeof(*c->uniq));
	c->pos = malloc((size_t)n * sizeof(*c->pos));
	c->set = malloc((size_t)slots * sizeof(*c->set));
	c->set_idx = malloc((size_t)slots * sizeof(*c->set_idx));
	c->keys = malloc((size_t)n * 8);
	c->key_ptrs = malloc((size_t)n * sizeof(*c->key_ptrs));
	c->key_lens = malloc((size_t)n * sizeof(*c->key_lens));
	c->vals = calloc(n, sizeof(*c->vals));
	c->errs = calloc(n, sizeof(*c->errs));
	c->rowbuf = malloc((size_t)n * s->vfloats * sizeof(float));
	c->gsum = malloc((size_t)n * s->dim * sizeof(float));
	c->wb = rocksdb_writebatch_create();
	if (!c->uniq || !c->pos || !c->set || !c->set_idx || !c->keys ||
	    !c->key_ptrs || !c->key_lens || !c->vals || !c->errs ||
	    !c->rowbuf || !c->gsum || !c->wb) {
		rocks_thread_close(c);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		c->key_ptrs[i] = (const char *)c->keys + (size_t)i * 8;
		c->key_lens[i] = 8;
	}
	*out = c;
	return 0;
}

/* Fills uniq and pos from ids[0..n); returns the count of distinct ids. */
static uint32_t dedup(struct rocks_ctx *c, const uint64_t *ids, uint32_t n)
{
	uint32_t u = 0;

	memset(c->set, 0, ((size_t)c->set_mask + 1) * sizeof(*c->set));
	for (uint32_t i = 0; i < n; i++) {
		uint64_t key = ids[i] + 1;
		uint32_t h = (uint32_t)emb_id_hash(ids[i]) & c->set_mask;

		while (c->set[h] && c->set[h] != key)
			h = (h + 1) & c->set_mask;
		if (!c->set[h]) {
			c->set[h] = key;
			c->set_idx[h] = u;
			c->uniq[u] = ids[i];
			key_put(c->keys + (size_t)u * 8, ids[i]);
			u++;
		}
		c->pos[i] = c->set_idx[h];
	}
	return u;
}

static int rocks_write(struct rocks_ctx *c)
{
	char *err = NULL;

	rocksdb_write(c->be->db, c->be->wopts, c->wb, &err);
	rocksdb_writebatch_clear(c->wb);
	if (err) {
		fprintf(stderr, "embstore-bench: rocksdb write: %s\n", err);
		rocksdb_free(err);
		return -EIO;
	}
	return 0;
}

/*
 * Reads the u distinct ids' rows into rowbuf; a row not there is made and
 * Put into the context's write batch (written by the caller). 0, or -EIO.
 */
static int rows_get(struct rocks_ctx *c, uint32_t u, uint32_t *made)
{
	struct rocks_be *s = c->be;
	size_t vbytes = (size_t)s->vfloats * sizeof(float);
	int rc = 0;

	*made = 0;
	rocksdb_batched_multi_get_cf(s->db, s->ropts, s->cf, u, c->key_ptrs,
				     c->key_lens, c->vals, c->errs, false);
	for (uint32_t j = 0; j < u; j++) {
		float *v = c->rowbuf + (size_t)j * s->vfloats;
		size_t len = 0;
		const char *p;

		if (c->errs[j]) {
			if (!rc)
				fprintf(stderr,
					"embstore-bench: rocksdb"
					" multiget: %s\n",
					c->errs[j]);
			rocksdb_free(c->errs[j]);
			c->errs[j] = NULL;
			rc = -EIO;
		}
		p = c->vals[j] ? rocksdb_pinnableslice_value(c->vals[j], &len)
			       : NULL;
		if (p && len == vbytes) {
			memcpy(v, p, vbytes);
		} else if (!p && !rc) {
			row_new(s, c->uniq[j], v);
			rocksdb_writebatch_put(c->wb, c->key_ptrs[j], 8,
					       (const char *)v, vbytes);
			(*made)++;
		} else if (p) {
			rc = -EIO; /* a value of another size: not ours */
		}
		if (c->vals[j]) {
			rocksdb_pinnableslice_destroy(c->vals[j]);
			c->vals[j] = NULL;
		}
	}
	return rc;
}

static int rocks_preload(void *ctx, const uint64_t *ids, uint32_t n)
{
	struct rocks_ctx *c = ctx;
	struct rocks_be *s = c->be;
	size_t vbytes = (size_t)s->vfloats * sizeof(float);
	unsigned char k[8];
	int rc;

	if (n > s->batch)
		return -EINVAL;
	/* The preload's ids are new: Put without reading first. */
	for (uint32_t i = 0; i < n; i++) {
		row_new(s, ids[i], c->rowbuf);
		key_put(k, ids[i]);
		rocksdb_writebatch_put(c->wb, (const char *)k, 8,
				       (const char *)c->rowbuf, vbytes);
	}
	rc = rocks_write(c);
	if (!rc)
		atomic_fetch_add(&s->rows, n);
	return rc;
}

static int rocks_pull(void *ctx, const uint64_t *ids, uint32_t n, float *out)
{
	struct rocks_ctx *c = ctx;
	struct rocks_be *s = c->be;
	uint32_t u, made;
	int rc;

	if (n > s->batch)
		return -EINVAL;
	u = dedup(c, ids, n);
	rc = rows_get(c, u, &made);
	if (!rc && made) {
		rc = rocks_write(c);
		if (!rc)
			atomic_fetch_add(&s->rows, made);
	}
	rocksdb_writebatch_clear(c->wb);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++)
		memcpy(out + (size_t)i * s->dim,
		       c->rowbuf + (size_t)c->pos[i] * s->vfloats,
		       (size_t)s->dim * sizeof(float));
	return 0;
}

static int rocks_push(void *ctx, const uint64_t *ids, uint32_t n,
		      const float *grads)
{
	struct rocks_ctx *c = ctx;
	struct rocks_be *s = c->be;
	size_t vbytes = (size_t)s->vfloats * sizeof(float);
	size_t gbytes = (size_t)s->dim * sizeof(float);
	uint32_t u, made;
	int rc;

	if (n > s->batch)
		return -EINVAL;
	u = dedup(c, ids, n);
	/* A repeated id's gradients are summed and applied once, in the
	 * order they came, as the store does. */
	for (uint32_t j = 0; j < u; j++)
		c->set_idx[j] = 0; /* reused: gradient seen yet */
	for (uint32_t i = 0; i < n; i++) {
		float *g = c->gsum + (size_t)c->pos[i] * s->dim;

		if (!c->set_idx[c->pos[i]]) {
			memcpy(g, grads + (size_t)i * s->dim, gbytes);
			c->set_idx[c->pos[i]] = 1;
		} else {
			emb_floats_add(g, grads + (size_t)i * s->dim, s->dim);
		}
	}
	pthread_mutex_lock(&s->push_lock);
	rc = rows_get(c, u, &made);
	if (!rc) {
		/* A made row was Put by rows_get; its Put below replaces it
		 * in the same batch. */
		rocksdb_writebatch_clear(c->wb);
		for (uint32_t j = 0; j < u; j++) {
			float *v = c->rowbuf + (size_t)j * s->vfloats;

			emb_optim_apply(&s->optim, v, v + s->dim,
					c->gsum + (size_t)j * s->dim, s->dim);
			rocksdb_writebatch_put(c->wb, c->key_ptrs[j], 8,
					       (const char *)v, vbytes);
		}
		rc = rocks_write(c);
		if (!rc)
			atomic_fetch_add(&s->rows, made);
	}
	rocksdb_writebatch_clear(c->wb);
	pthread_mutex_unlock(&s->push_lock);
	return rc;
}

/*
 * After the preload: everything flushed and compacted into one run, then
 * read once in key order through the block cache. The compaction leaves
 * the cache empty; the scan leaves in it the last blocks it read, as many
 * as the budget holds: an arbitrary share of the rows, as the store's
 * preload leaves the share it made last in DRAM, and all of them where
 * the budget holds the table (share 100). Without it, a warmup of 20 s at
 * the few thousand reads a second RocksDB makes here would leave the
 * cache far from full. The scan also counts the rows: all must be there.
 */
static int rocks_settle(void *be)
{
	struct rocks_be *s = be;
	rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
	rocksdb_readoptions_t *scan;
	rocksdb_iterator_t *it;
	uint64_t n = 0, want = atomic_load(&s->rows);
	char *err = NULL;

	if (!fo)
		return -ENOMEM;
	rocksdb_flushoptions_set_wait(fo, 1);
	rocksdb_flush(s->db, fo, &err);
	rocksdb_flushoptions_destroy(fo);
	if (err) {
		fprintf(stderr, "embstore-bench: rocksdb flush: %s\n", err);
		rocksdb_free(err);
		return -EIO;
	}
	rocksdb_compact_range(s->db, NULL, 0, NULL, 0);

	scan = rocksdb_readoptions_create();
	if (!scan)
		return -ENOMEM;
	rocksdb_readoptions_set_readahead_size(scan, 2u << 20);
	it = rocksdb_create_iterator_cf(s->db, scan, s->cf);
	for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it))
		n++;
	rocksdb_iter_get_error(it, &err);
	rocksdb_iter_destroy(it);
	rocksdb_readoptions_destroy(scan);
	if (err) {
		fprintf(stderr, "embstore-bench: rocksdb scan: %s\n", err);
		rocksdb_free(err);
		return -EIO;
	}
	if (n != want) {
		fprintf(stderr,
			"embstore-bench: rocksdb holds %" PRIu64
			" rows after the preload, not %" PRIu64 "\n",
			n, want);
		return -EIO;
	}
	return 0;
}

/*
 * A ticker or a histogram's field from the statistics text, whose lines
 * read "rocksdb.block.cache.miss COUNT : 12" and
 * "rocksdb.sst.read.micros P50 : ... COUNT : 9 SUM : 120"; 0 if absent.
 */
static uint64_t stat_get(const char *text, const char *name, const char *field)
{
	size_t n = strlen(name);
	const char *p = text;

	while (p && (p = strstr(p, name))) {
		if ((p == text || p[-1] == '\n') && p[n] == ' ') {
			const char *eol = strchr(p, '\n');
			const char *f = strstr(p + n, field);

			if (f && (!eol || f < eol))
				return strtoull(f + strlen(field), NULL, 10);
			return 0;
		}
		p += n;
	}
	return 0;
}

static uint64_t prop_int(struct rocks_be *s, const char *name)
{
	uint64_t v = 0;

	return rocksdb_property_int(s->db, name, &v) == 0 ? v : 0;
}

static int rocks_mem(void *be, struct emb_bench_mem *out)
{
	struct rocks_be *s = be;
	char *st = rocksdb_options_statistics_get_string(s->opts);
	uint64_t written;

	out->rows = atomic_load(&s->rows);
	out->bytes = rocksdb_cache_get_usage(s->cache) +
		     prop_int(s, "rocksdb.cur-size-all-mem-tables");
	/* Table readers outside the cache; 0 with index and filter blocks
	 * in it. */
	out->index_bytes = prop_int(s, "rocksdb.estimate-table-readers-mem");
	out->record_bytes = 8 + (uint64_t)s->vfloats * sizeof(float);
	/* Every row lives in the files; the cache holds copies of blocks. */
	out->rows_cold = out->rows;
	out->tier_file_bytes = prop_int(s, "rocksdb.total-sst-files-size");
	if (!st)
		return 0;
	/* A read that missed the block cache (data, index or filter
	 * block) went to the device: one block read. */
	out->tier_reads = stat_get(st, "rocksdb.block.cache.miss", "COUNT : ");
	/* Flush and compaction writes, in 4 KiB blocks' worth. */
	written = stat_get(st, "rocksdb.flush.write.bytes", "COUNT : ") +
		  stat_get(st, "rocksdb.compact.write.bytes", "COUNT : ");
	out->tier_writes = written / 4096;
	out->tier_read_ns =
	    stat_get(st, "rocksdb.sst.read.micros", "SUM : ") * 1000;
	rocksdb_free(st);
	return 0;
}

const struct emb_bench_backend emb_bench_rocks_backend = {
    .name = "rocksdb",
    .dense_ids = false,
    .open = rocks_open,
    .close = rocks_close,
    .thread_open = rocks_thread_open,
    .thread_close = rocks_thread_close,
    .preload = rocks_preload,
    .pull = rocks_pull,
    .push = rocks_push,
    .mem = rocks_mem,
    .settle = rocks_settle,
};
