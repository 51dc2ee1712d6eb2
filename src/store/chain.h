/*
 * src/store/chain.h - checkpoint chains on disk: a full checkpoint and the
 * delta checkpoints that follow it, listed, verified, loaded, written.
 *
 * Layout under a checkpoint root ROOT:
 *   ROOT/ckpt-<16-digit id>/        a full checkpoint: TABLE.embs + MANIFEST
 *   ROOT/ckpt-<16-digit id>-delta/  a delta: one file per table, each a
 *                                   delta (EMB_SNAP_F_DELTA: base and
 *                                   previous link ids in its header) or,
 *                                   for a table new since the previous
 *                                   link, a full file that starts it over
 * The id is ms since the epoch; names sort by id. A link is written as
 * ROOT/.tmp-ckpt-<id>/ and renamed whole. The policy (when a full, when a
 * delta, pruning) is the server's (server/checkpoint.c); this file holds
 * what the CLI shares with it.
 *
 * Threads: any; a root is written by one writer at a time.
 */
#ifndef EMB_STORE_CHAIN_H
#define EMB_STORE_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/snapshot.h"
#include "store/store.h"

#define EMB_CHAIN_PREFIX  "ckpt-"
#define EMB_CHAIN_DELTA	  "-delta"
#define EMB_CHAIN_TMP	  ".tmp-ckpt-"
#define EMB_CHAIN_MAX	  4096u /* checkpoints looked at under a root */
#define EMB_CHAIN_NAME_MAX 64u

/* One checkpoint directory under a root. */
struct emb_chain_link {
	char name[EMB_CHAIN_NAME_MAX]; /* directory name */
	uint64_t id;		       /* from the name */
	bool delta;		       /* a -delta directory */
	int status;		       /* 0, or why it is refused */
	char bad[EMB_SNAP_PATH_MAX];   /* the file that failed */
	struct emb_snap_entry *e;      /* its MANIFEST's files */
	struct emb_snap_meta *m;       /* their headers (status 0) */
	uint32_t ne;		       /* files */
	uint64_t rows;		       /* rows in its files */
	uint64_t erased;	       /* removed ids in its files */
	uint64_t bytes;		       /* bytes of its files */
};

/*
 * Lists ROOT's checkpoints, oldest first, reading each MANIFEST and file
 * header (status set per link; checksums are not read: see verify).
 * 0, *out (emb_chain_free) and *n; or -ENOMEM / opendir's error.
 */
int emb_chain_list(const char *root, struct emb_chain_link **out, uint32_t *n);
void emb_chain_free(struct emb_chain_link *l, uint32_t n); /* NULL: no-op */

/* Reads every byte of link l's files against their checksums and the
 * MANIFEST; returns and sets l->status (l->bad names the file). */
int emb_chain_verify(const char *root, struct emb_chain_link *l);

/*
 * The chain that starts at the full checkpoint l[full]: how many of the
 * links after it continue it (each a delta whose files name l[full] as
 * base and the link before as previous). Headers only, as listed.
 */
uint32_t emb_chain_span(const struct emb_chain_link *l, uint32_t n,
			uint32_t full);

/* Where emb_chain_load() puts tables. */
struct emb_chain_sink {
	/* Creates the table described by m (the file that starts it):
	 * 0 and *t to load into, or an error that stops the load. */
	int (*open)(void *arg, const struct emb_snap_meta *m,
		    struct emb_table **t);
	/* Done loading t (may be NULL). */
	void (*close)(void *arg, struct emb_table *t);
	void *arg;
};

/*
 * Loads the chain l[first..last] (a full checkpoint and its deltas, each
 * verified by the caller): every table of the last link, from the link
 * where it starts (its newest full file) through every delta after it.
 * 0 and *rows (rows in the loaded tables' files), EMB_ECHAIN (a table
 * missing from a link it should be in), or a sink, reader or assign error
 * (tables may then hold part of the chain).
 */
int emb_chain_load(const char *root, const struct emb_chain_link *l,
		   uint32_t first, uint32_t last,
		   const struct emb_chain_sink *sink, uint64_t *rows);

/* A table to write into a link. */
struct emb_chain_table {
	struct emb_table *t; /* borrowed for the call */
	bool delta;	     /* a delta of the previous link; else whole */
};

/* What a written link holds. */
struct emb_chain_result {
	char name[EMB_CHAIN_NAME_MAX]; /* directory name under root */
	uint64_t id;		       /* its id */
	uint64_t rows;		       /* rows written */
	uint64_t erased;	       /* removed ids written */
	uint64_t bytes;		       /* bytes of its files */
	int32_t fell_back;	       /* tables written whole instead of as
					  a delta (EMB_EDELTALOST) */
};

/*
 * Writes a checkpoint of tables[0..n) under root, named after every
 * checkpoint there: a delta link (base_id, prev_id: the chain's full and
 * the previous link) when any table is a delta, else a full one. Each
 * table is walked (emb_snap_write_ckpt), so its change marks are taken.
 * 0 and *res, or the first error (nothing is left under a ckpt- name, and
 * the changes taken are not on disk: the next link must be full).
 */
int emb_chain_write(const char *root, const struct emb_chain_table *tables,
		    uint32_t n, uint64_t base_id, uint64_t prev_id,
		    struct emb_chain_result *res);

/* Removes directory dir/name and the files in it. */
void emb_chain_rm(const char *dir, const char *name);

/*
 * The CLI's view: loads the newest chain under root (every link must
 * verify: a damaged link is an error naming it in why, never skipped)
 * into new tables. 0, *t (caller destroys each and frees) and *n, or
 * -ENOENT (no checkpoint), EMB_ECHAIN / a reader error. why (may be NULL)
 * gets a line saying which links were used or which one failed.
 */
int emb_chain_load_newest(const char *root, struct emb_table ***t,
			  uint32_t *n, char *why, size_t why_cap);

/*
 * Merges the newest chain under root into one full snapshot per table:
 * as a new full checkpoint under root (out_dir NULL; named after every
 * link, so it is what a server loads next, and older chains are left for
 * the server's pruning), or as a dump directory out_dir (TABLE.embs files
 * and a MANIFEST; it must exist). Needs the tables' memory. 0 and *res
 * (may be NULL), or as for emb_chain_load_newest / emb_chain_write.
 */
int emb_chain_compact(const char *root, const char *out_dir,
		      struct emb_chain_result *res, char *why, size_t why_cap);

/* True when dir looks like a checkpoint root (holds ckpt-* entries). */
bool emb_chain_is_root(const char *dir);

#endif
