/*
 * src/store/snapshot.h - snapshot files of embedding tables: write, read,
 * verify, load; and the MANIFEST that lists the files of one dump.
 *
 * A snapshot file holds one table's rows (or one server's share of them):
 * a header with the table's metadata, LZ4-compressed blocks of rows grouped
 * by virtual slot (common/hash.h), each with an XXH3-64 checksum, and a
 * trailer with per-slot row counts and a checksum of the whole file.
 * docs/format.md gives every byte; the OFFSET / SIZE / MEANING tables are
 * repeated here.
 *
 * HEADER (256 bytes at offset 0)
 *   OFFSET  SIZE  MEANING
 *   0       8     magic "EMBSNAP\0"
 *   8       4     format version: 1, or 2 when the row-format word
 *                 is not 0 (EMB_SNAP_VERSION); a version-1 file is fp32
 *   12      4     header size, 256
 *   16      64    table name, NUL-terminated, NUL-padded
 *   80      4     dim
 *   84      4     state floats per row (common/optim.h)
 *   88      4     row words = weight words (emb_rowfmt_words() of
 *                 the row format and dim) + state floats
 *   92      4     virtual slots, EMB_NSLOTS (4096)
 *   96      40    optimizer: kind, lr, weight_decay, initial_accumulator,
 *                 beta1, beta2, eps, ftrl_beta, l1, l2 (u32 then 9 f32)
 *   136     12    initializer: kind (u32), a (f32), b (f32)
 *   148     4     flags, EMB_SNAP_F_* (bit 0: floats byte-shuffled,
 *                 bit 1: a delta of an incremental checkpoint)
 *   152     8     seed
 *   160     8     rows in the file
 *   168     8     blocks in the file
 *   176     8     table step (push batches) when the dump began
 *   184     8     created, ns since the Unix epoch
 *   192     4     part: this file's index among the dump's files
 *   196     4     parts: files in the dump
 *   200     8     file size in bytes, trailer included
 *   208     8     raw bytes: sum of the blocks' uncompressed sizes
 *   216     8     delta: id of the chain's full checkpoint (else 0)
 *   224     8     delta: id of the checkpoint it follows (else 0)
 *   232     8     delta: ids removed, in erased blocks (else 0)
 *   240     4     row-format word (version 2; 0 in version 1):
 *                 bits 0..7 enum emb_row_format, bit 8 pushes round
 *                 to nearest (else stochastically), bits 9..31 0;
 *                 0 = fp32, which always has bit 8 clear
 *   244     4     reserved, 0
 *   248     8     XXH3-64 of bytes 0..248
 *
 * BLOCK (at offset 256, then back to back)
 *   0       4     magic "EMBK"
 *   4       4     rows n, >= 1
 *   8       4     first slot of the block's slot range
 *   12      4     last slot of the range (every row's slot lies within)
 *   16      4     raw size = n * (16 + 4 * row words)
 *   20      4     stored size c: LZ4 block size, or the raw size if stored
 *   24      4     flags: bit 0 payload stored uncompressed,
 *                 bit 1 erased block (delta files, before every row
 *                 block): payload u64 ids[n] removed, slots 0..4095
 *   28      4     reserved, 0
 *   32      8     block sequence number, from 0
 *   40      8     XXH3-64 of the c stored bytes, seeded with the
 *                 XXH3-64 of block bytes 0..40
 *   48      c     payload; once decompressed:
 *                   u64 ids[n], u32 last_step[n], u32 count[n],
 *                   rows[n][row words]: weights in the row format,
 *                   then f32 state (byte planes if shuffled)
 *                 rows sorted by slot
 *
 * TRAILER (16424 bytes, after the last block)
 *   0       4     magic "EMBT"
 *   4       4     reserved, 0
 *   8       8     rows
 *   16      8     blocks
 *   24      8     raw bytes
 *   32      16384 u32 rows per slot, slots 0..4095
 *   16416   8     file checksum: XXH3-64 over bytes 256..size-8 followed
 *                 by the 256 header bytes
 *
 * Threads: a writer or reader is used by one thread at a time. The table
 * functions may run while other threads use the table (rows are copied
 * through the table iterator, each row whole).
 */
#ifndef EMB_STORE_SNAPSHOT_H
#define EMB_STORE_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/init.h"
#include "common/optim.h"
#include "store/store.h"

#define EMB_SNAP_VERSION      2u /* newest; 1 is written for fp32 tables */
#define EMB_SNAP_MANIFEST_VERSION 1u
#define EMB_SNAP_HDR_SIZE     256u
#define EMB_SNAP_BLOCK_HDR    48u
#define EMB_SNAP_TRAILER_SIZE (32u + 4u * 4096u + 8u)
#define EMB_SNAP_GROUP_SLOTS  64u	  /* slots a block may span */
#define EMB_SNAP_BLOCK_MAX    (64u << 20) /* largest raw block */
#define EMB_SNAP_PATH_MAX     4096u

#define EMB_SNAP_F_SHUFFLE   0x1u /* floats stored as 4 byte planes */
#define EMB_SNAP_F_DELTA     0x2u /* changes since the previous link */
#define EMB_SNAP_BF_RAW	     0x1u /* block payload stored uncompressed */
#define EMB_SNAP_BF_ERASED   0x2u /* block of removed ids (deltas) */

/* A snapshot file's metadata: the header, decoded. */
struct emb_snap_meta {
	char name[EMB_NAME_MAX + 1]; /* table name */
	uint32_t version;	     /* of the file read (the writer picks) */
	uint32_t dim;		     /* weights per row */
	uint32_t state_floats;	     /* optimizer state floats per row */
	uint32_t row_floats;	     /* 4-byte words of a row: weight
					words + state_floats */
	uint32_t row_format;	     /* enum emb_row_format */
	uint32_t rounding;	     /* enum emb_round of pushes;
					stochastic for fp32 */
	struct emb_optim_cfg optim;  /* the table's optimizer */
	struct emb_init_cfg init;    /* the table's initializer */
	uint64_t seed;		     /* the table's seed */
	uint32_t flags;		     /* EMB_SNAP_F_* */
	uint64_t rows;		     /* rows in the file */
	uint64_t blocks;	     /* blocks in the file */
	uint64_t step;		     /* table step when the dump began */
	uint64_t created_ns;	     /* wall clock, ns since the epoch */
	uint32_t part;		     /* index among the dump's files */
	uint32_t nparts;	     /* files in the dump, >= 1 */
	uint64_t file_bytes;	     /* whole file */
	uint64_t raw_bytes;	     /* uncompressed block payloads */
	uint64_t base_id;	     /* delta: the chain's full checkpoint */
	uint64_t prev_id;	     /* delta: the checkpoint it follows */
	uint64_t erased;	     /* delta: ids in erased blocks */
	uint32_t tier_mode;	     /* the table's CREATE: enum emb_tier_mode */
	uint64_t tier_request;	     /* and its tier bytes, whole MiB; 0 =
					the server's bound */
};

/* Fills the table part of *m (name .. seed, row format, step) from t;
 * parts = 1. */
void emb_snap_meta_from_table(struct emb_table *t, struct emb_snap_meta *m);

/*
 * Sets m's row format (and the rounding of the table it makes) and the row
 * words that follow from it: what a file of rows converted by
 * emb_snap_row_convert() declares. 0, or EMB_EBADFORMAT (unknown format or
 * rounding).
 */
int emb_snap_meta_set_format(struct emb_snap_meta *m, uint32_t row_format,
			     uint32_t rounding);

/*
 * Converts one full row of a snapshot with metadata from (row_floats words
 * at src) into format to at dst (emb_rowfmt_words(to, dim) + state_floats
 * words): the weights decoded to fp32 and encoded rounding to nearest, the
 * optimizer state copied as it is. src and dst must not overlap. false when
 * a weight is not finite or out of to's range (65504 for fp16): dst is then
 * undefined, and such a row cannot be kept in that format.
 */
bool emb_snap_row_convert(const struct emb_snap_meta *from, uint32_t to,
			  const float *src, float *dst);

/*
 * True when a full row of a snapshot with metadata m holds only finite
 * values: its decoded weights (an int8 row's scale and bias too) and its
 * state floats, Adam's step count aside (as emb_table_row_finite()).
 */
bool emb_snap_row_finite(const struct emb_snap_meta *m, const float *row);

/* Table options matching m (name points into m); other fields default. */
void emb_snap_meta_to_opts(const struct emb_snap_meta *m,
			   struct emb_table_opts *o);

/*
 * 0 if rows of a snapshot with metadata m can be loaded into a table with
 * options o without changing their meaning: EMB_EBADDIM (dim differs),
 * EMB_EBADOPTIM (optimizer kind, hence state layout, differs),
 * EMB_EBADFORMAT (row format differs: rows are loaded as they are kept,
 * never converted on the way; emb_snap_row_convert() does that on request).
 * The rounding may differ: it decides future pushes, not the rows.
 */
int emb_snap_meta_check(const struct emb_snap_meta *m,
			const struct emb_table_opts *o);

/* ---- writer ---- */

struct emb_snap_writer;

struct emb_snap_write_opts {
	uint32_t block_bytes; /* target raw bytes per block, 4K..64M */
	bool shuffle;	      /* byte-plane floats: ~8% smaller, slower */
	int level;	      /* LZ4 acceleration, >= 1; 1 = best ratio */
	bool buffered;	      /* write through the page cache, not O_DIRECT
				 (which file systems without it fall back
				 to by themselves) */
	/* Tests: called before each write(2) of nbytes; non-zero fails it. */
	int (*write_hook)(void *arg, size_t nbytes);
	void *hook_arg;
};

#define EMB_SNAP_WRITE_OPTS_DEFAULT                                            \
	((struct emb_snap_write_opts){                                         \
	    .block_bytes = 1u << 20, .shuffle = false, .level = 1})

/* What a finished file holds. */
struct emb_snap_result {
	uint64_t rows;	     /* rows written */
	uint64_t erased;     /* removed ids written (deltas) */
	uint64_t blocks;     /* blocks written */
	uint64_t raw_bytes;  /* uncompressed payload bytes */
	uint64_t file_bytes; /* bytes of the file */
	uint64_t checksum;   /* file checksum, as in the trailer */
};

/*
 * Starts a snapshot file that will appear at path once finished: it is
 * written under "path.tmp.PID", then fsynced and renamed. meta supplies the
 * table fields and part/nparts (rows, blocks and sizes are counted);
 * opts may be NULL. 0 and *out, or EMB_EBADARG (bad meta or opts), -ENOMEM,
 * or the negative errno of open/write. Borrows meta and opts for the call.
 */
int emb_snap_writer_create(const char *path, const struct emb_snap_meta *meta,
			   const struct emb_snap_write_opts *opts,
			   struct emb_snap_writer **out);

/* Does w write with O_DIRECT (false: through the page cache)? */
bool emb_snap_writer_direct(const struct emb_snap_writer *w);

/*
 * Adds n rows in any order: ids[k], full rows at rows[k * row_floats ...],
 * and meta[k] (NULL: zeros). Rows are grouped by slot range and written in
 * blocks as the groups fill. 0, or -ENOSPC / -EFBIG / -EIO from write, or
 * -ENOMEM; after an error the writer only accepts destroy.
 */
int emb_snap_writer_add(struct emb_snap_writer *w, const uint64_t *ids,
			const float *rows, const struct emb_row_meta *meta,
			uint32_t n);

/*
 * Writes the remaining blocks, the trailer and the final header, fsyncs,
 * renames the file to its path and fsyncs the directory. 0 and *res (may be
 * NULL), or the negative errno of the failing call (the temporary file is
 * then removed by destroy, and nothing exists under path).
 */
int emb_snap_writer_finish(struct emb_snap_writer *w,
			   struct emb_snap_result *res);

/*
 * Records ids[0..n) as removed, in erased blocks. Only for a writer whose
 * meta has EMB_SNAP_F_DELTA, and before the first emb_snap_writer_add():
 * a delta's removals come before its rows. 0, EMB_EBADARG, or as for add.
 */
int emb_snap_writer_erase(struct emb_snap_writer *w, const uint64_t *ids,
			  uint64_t n);

/* Frees the writer; an unfinished file is removed. NULL is a no-op. */
void emb_snap_writer_destroy(struct emb_snap_writer *w);

/* ---- reader ---- */

struct emb_snap_reader;

/* One block of rows; the arrays point into the reader, valid until next. */
struct emb_snap_block {
	uint32_t n;		   /* rows */
	uint32_t slot_first;	   /* slot range of the block */
	uint32_t slot_last;	   /* last slot of the range */
	const uint64_t *ids;	   /* n ids */
	const uint32_t *last_step; /* n values of emb_row_meta.last_step */
	const uint32_t *count;	   /* n values of emb_row_meta.count */
	const float *rows;	   /* n * row_floats words */
	uint64_t stored_bytes;	   /* block bytes in the file */
	bool erased;		   /* n removed ids; no meta, no rows */
};

#define EMB_SNAP_READ_VERIFY_ONLY 0x1u /* checksums only, no decompress */
/* Return a delta's erased blocks too (else they are verified, skipped). */
#define EMB_SNAP_READ_ERASED 0x2u

/*
 * Opens path and checks its header: 0 and *out, or -ENOENT and other
 * open errors, EMB_ETRUNCATED (file shorter than its header says),
 * EMB_EDUMPFORMAT (not a snapshot, another version, impossible fields),
 * EMB_EBADDUMP (header checksum), -ENOMEM.
 */
int emb_snap_reader_open(const char *path, uint32_t flags,
			 struct emb_snap_reader **out);
void emb_snap_reader_close(struct emb_snap_reader *r); /* NULL: no-op */

const struct emb_snap_meta *
emb_snap_reader_meta(const struct emb_snap_reader *r);

/*
 * Reads the next block into *b: returns its row count (> 0), or 0 at the
 * end once the trailer and the whole-file checksum have been verified, or
 * EMB_EBADDUMP (a checksum, or data that disagrees with its checksummed
 * fields), EMB_ETRUNCATED, EMB_EDUMPFORMAT, -EIO. With
 * EMB_SNAP_READ_VERIFY_ONLY, b's arrays are NULL.
 */
int emb_snap_reader_next(struct emb_snap_reader *r, struct emb_snap_block *b);

/* The file checksum from the trailer (valid after next() returned 0). */
uint64_t emb_snap_reader_checksum(const struct emb_snap_reader *r);

/*
 * Reads the whole file checking every checksum (and, unless flags has
 * EMB_SNAP_READ_VERIFY_ONLY, decoding every block): 0, *meta and *checksum
 * (each may be NULL), or a reader error.
 */
int emb_snap_verify(const char *path, uint32_t flags,
		    struct emb_snap_meta *meta, uint64_t *checksum);

/* ---- tables ---- */

/*
 * Writes every row of t (weights, optimizer state, lifecycle meta) to a
 * snapshot at path. part/nparts go in the header. 0 and *res (may be
 * NULL), or as for the writer.
 */
int emb_snap_write_table(struct emb_table *t, const char *path,
			 const struct emb_snap_write_opts *opts,
			 struct emb_snap_result *res);

/*
 * Writes a checkpoint walk of t (emb_table_ckpt_*): every row, or with
 * delta only the rows changed since the last walk plus the removed ids,
 * under flag EMB_SNAP_F_DELTA with base_id and prev_id in the header.
 * 0 and *res, EMB_EDELTALOST (a delta is impossible now: write a full),
 * or as for the writer; after any other error the caller's next walk of
 * t must be full (the changes taken are not on disk).
 */
int emb_snap_write_ckpt(struct emb_table *t, const char *path, bool delta,
			uint64_t base_id, uint64_t prev_id,
			const struct emb_snap_write_opts *opts,
			struct emb_snap_result *res);

/*
 * Loads the snapshot at path into t. The whole file is verified and its
 * metadata checked against t first (EMB_EBADDIM, EMB_EBADOPTIM,
 * EMB_EBADFORMAT): on any
 * such error t is untouched. Rows overwrite rows of the same id; a
 * delta's removed ids are erased first. Returns the rows loaded (>= 0),
 * or a reader error, or an assign error (EMB_EMEMLIMIT, -ENOMEM) after
 * which t holds part of the file.
 */
int64_t emb_snap_load_table(const char *path, struct emb_table *t);

/*
 * Creates a new table from the snapshot's metadata (its row format and
 * rounding too; nshards, mem_limit and budget from base, NULL = defaults)
 * and loads it: the way to restore and then swap. 0 and *out, or as for emb_snap_load_table / emb_table_create.
 */
int emb_snap_load_new(const char *path, const struct emb_table_opts *base,
		      struct emb_table **out);

/* ---- manifest ---- */

/* One file of a dump, as its MANIFEST lists it. */
struct emb_snap_entry {
	char file[256];		      /* name inside the dump directory */
	char table[EMB_NAME_MAX + 1]; /* table name */
	uint32_t part;		      /* index among the table's files */
	uint32_t nparts;	      /* files of the table */
	uint64_t rows;		      /* rows in the file */
	uint64_t bytes;		      /* file size */
	uint64_t checksum;	      /* file checksum (trailer) */
	bool consistent;	      /* rows of one instant (dump
					 --consistent), at step: */
	uint64_t step;		      /* the table's step then */
};

#define EMB_SNAP_MANIFEST "MANIFEST"

/*
 * Writes dir/MANIFEST listing e[0..n) (temp name, fsync, rename, fsync
 * dir). 0, EMB_EBADARG (a name with white space or '/'), or a negative
 * errno.
 */
int emb_snap_manifest_write(const char *dir, const struct emb_snap_entry *e,
			    uint32_t n);

/*
 * Reads dir/MANIFEST: 0, *e (caller frees) and *n; or -ENOENT (no
 * manifest), EMB_EMANIFEST (malformed, or its own checksum fails), -ENOMEM.
 * Then checks the directory against it: every listed file must exist with
 * the listed size (EMB_EMANIFEST naming it in bad_file), and no other
 * snapshot file (*.embs) may lie there (EMB_EMANIFEST too).
 * bad_file (may be NULL, EMB_SNAP_PATH_MAX bytes) gets the offending name.
 */
int emb_snap_manifest_read(const char *dir, struct emb_snap_entry **e,
			   uint32_t *n, char *bad_file);

#endif
