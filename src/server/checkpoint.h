/*
 * src/server/checkpoint.h - periodic checkpoints of every table of a
 * server, in the snapshot format (store/snapshot.h), and loading the newest
 * valid one at start.
 *
 * Layout: DIR/ckpt-<16-digit ms since the epoch>/ holds one TABLE.embs per
 * table and a MANIFEST; it is written as DIR/.tmp-ckpt-.../ and renamed
 * whole, so a checkpoint directory either is complete or does not exist.
 * The newest `keep` checkpoints are kept, and never fewer than the last
 * valid one: a new checkpoint is named after every existing one, and
 * rotation never removes the one just written.
 */
#ifndef EMB_SERVER_CHECKPOINT_H
#define EMB_SERVER_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "server/server.h"

struct emb_ckpt;

#define EMB_CKPT_FULL_EVERY_MAX 1000000u

struct emb_ckpt_opts {
	const char *dir;     /* checkpoint directory; created if missing */
	uint32_t interval_s; /* seconds between checkpoints, >= 1 */
	uint32_t keep;	     /* full checkpoints kept (with their deltas) */
	uint32_t full_every; /* a full checkpoint every this many, deltas
				between; 0 or 1: every one is full */
};

/*
 * Creates dir if missing and checks that a file can be written and synced
 * there. 0, or the negative errno that stops it.
 */
int emb_ckpt_check_dir(const char *dir);

/*
 * Checks dir as emb_ckpt_check_dir(), then loads the newest checkpoint
 * under it whose every file verifies into s (creating its tables),
 * skipping damaged ones with an ERROR log line that names the file and the
 * reason. Refused checkpoints newer than the one loaded are renamed
 * refused-ckpt-... : kept for inspection, out of rotation. For
 * emb_server_opts.on_start. 0 (also when dir holds no checkpoint), or the
 * directory's error, or EMB_ENOCKPT (checkpoints there, none valid, and
 * not start_empty; with start_empty they are set aside and the server
 * starts empty), or the error of creating or filling a table (the server
 * then refuses to start rather than run half-loaded).
 */
int emb_ckpt_load(struct emb_server *s, const char *dir, bool start_empty);

/*
 * Writes one checkpoint of every table now and prunes to keep. 0, or the
 * negative errno / snapshot error of the first failure (nothing partial is
 * left under a ckpt- name). Any thread; not concurrently with itself.
 */
int emb_ckpt_write(struct emb_server *s, const char *dir, uint32_t keep);

/*
 * Starts a thread that calls emb_ckpt_write() every interval_s. 0 and
 * *out, or -EINVAL / -ENOMEM / pthread's error. Borrows s until stop.
 */
int emb_ckpt_start(struct emb_server *s, const struct emb_ckpt_opts *o,
		   struct emb_ckpt **out);

/*
 * Stops the thread (a checkpoint in progress finishes) and writes one
 * more checkpoint, the next link of the chain: at shutdown, once requests
 * have stopped. 0, or as for emb_ckpt_write().
 */
int emb_ckpt_write_final(struct emb_ckpt *c);

/* Stops and joins the thread (a checkpoint in progress finishes). */
void emb_ckpt_stop(struct emb_ckpt *c); /* NULL is a no-op */

#endif
