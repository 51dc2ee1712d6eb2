/*
 * src/server/checkpoint.h - periodic checkpoints of every table of a
 * server, in the snapshot format (store/snapshot.h), and loading the newest
 * valid chain at start.
 *
 * Layout (store/chain.h): DIR/ckpt-<16-digit ms since the epoch>/ holds a
 * full checkpoint, one TABLE.embs per table and a MANIFEST;
 * DIR/ckpt-<ms>-delta/ a delta: per table the rows changed and the ids
 * removed since the previous checkpoint. With full_every K a full is
 * written every K checkpoints, deltas between; a chain is a full and the
 * deltas after it. Each is written as DIR/.tmp-ckpt-.../ and renamed
 * whole, so a checkpoint directory either is complete or does not exist.
 * After a full is durable, the chains older than the newest `keep` fulls
 * are removed: never the one just written, never a link of a kept chain.
 * A new checkpoint is named after every existing one.
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
	uint32_t interval_ms; /* ms between checkpoints, >= 1 */
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
 * Checks dir as emb_ckpt_check_dir(), then loads into s (creating its
 * tables) the newest full checkpoint whose every file verifies, and the
 * deltas that follow it in order, up to the first that does not verify or
 * does not continue the chain: that one is named in an ERROR line with the
 * file, the reason and what was loaded instead; no later link is loaded.
 * A damaged full is skipped with an ERROR line, and the previous chain
 * tried. Every checkpoint newer than the last link loaded is renamed
 * refused-ckpt-... : kept for inspection, out of rotation. For
 * emb_server_opts.on_start. 0 (also when dir holds no checkpoint), or the
 * directory's error, or EMB_ENOCKPT (checkpoints there, none valid, and
 * not start_empty; with start_empty they are set aside and the server
 * starts empty), or the error of creating or filling a table (the server
 * then refuses to start rather than run half-loaded).
 */
int emb_ckpt_load(struct emb_server *s, const char *dir, bool start_empty);

/*
 * Writes one full checkpoint of every table now and prunes to keep
 * chains. 0, or the negative errno / snapshot error of the first failure
 * (nothing partial is left under a ckpt- name). Any thread; not
 * concurrently with itself or a running emb_ckpt_start() thread (each
 * walk takes the tables' change marks).
 */
int emb_ckpt_write(struct emb_server *s, const char *dir, uint32_t keep);

/*
 * Starts a thread that calls emb_ckpt_write() every interval_ms. 0 and
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
