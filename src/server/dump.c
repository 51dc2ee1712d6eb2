/*
 * src/server/dump.c - streams a table's rows to a client that writes a
 * snapshot (DUMP_BEGIN / DUMP_CHUNK / DUMP_END, src/proto/wire_dump.h).
 *
 * A session holds the table (so a DROP_TABLE cannot free it underneath) and
 * a store iterator; each CHUNK copies the next rows straight into the reply
 * buffer in wire layout: the iterator writes ids, then emb_row_meta pairs
 * (u32 last_step, u32 count: the wire's per-row meta) and full rows. Runs on
 * the loop thread that owns the conn; the store's shard locks keep the copy
 * safe against pushes from other loops. A consistent dump (EMB_F_CONSISTENT)
 * reads a point-in-time view of the table instead (store.h): taking it
 * holds the table's writers back for a moment, logged with the dump.
 */
#include "server/dump.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "proto/wire_dump.h"
#include "proto/wire_msg.h"
#include "store/store.h"
#include "transport/transport.h"

_Static_assert(sizeof(struct emb_row_meta) == 8,
	       "DUMP_CHUNK meta is the store's emb_row_meta, 8 bytes");

/*
 * Chunk buffers, kept for the session's next chunks. Why: a chunk is
 * megabytes, so malloc maps fresh pages for each and the loop thread paid
 * a page fault and the kernel's zeroing per 4 KiB, more than the copy of
 * the rows itself. At most DUMP_BUFS_KEPT are kept, and none once the
 * table's end was sent: an idle client holds no more than two chunks
 * (each at most a frame). A reply still on the wire holds a reference,
 * since its send may complete after the session ended; both run on the
 * conn's loop thread, so no lock.
 */
#define DUMP_BUFS_KEPT 2 /* the client keeps two chunks in flight */

struct dump_bufs {
	uint32_t refs;	       /* the session's, and one a reply out */
	uint32_t nfree;	       /* buffers in spare */
	bool ended;	       /* the session is gone: free what returns */
	struct dump_buf *spare[DUMP_BUFS_KEPT];
};

struct dump_buf {
	struct dump_bufs *pool; /* where it returns */
	size_t cap;		/* bytes of data */
	uint64_t data[];	/* the chunk, in wire layout */
};

static void bufs_put(struct dump_bufs *pool, struct dump_buf *b)
{
	if (!pool->ended && pool->nfree < DUMP_BUFS_KEPT)
		pool->spare[pool->nfree++] = b;
	else
		free(b);
}

/* No more chunks worth keeping buffers for: spares go, returns are freed. */
static void bufs_end(struct dump_bufs *pool)
{
	for (uint32_t i = 0; i < pool->nfree; i++)
		free(pool->spare[i]);
	pool->nfree = 0;
	pool->ended = true;
}

static void bufs_unref(struct dump_bufs *pool)
{
	if (--pool->refs)
		return;
	bufs_end(pool);
	free(pool);
}

/* A buffer of at least cap bytes, with a reference on the pool. */
static struct dump_buf *bufs_get(struct dump_bufs *pool, size_t cap)
{
	struct dump_buf *b = NULL;

	while (pool->nfree && !b) {
		b = pool->spare[--pool->nfree];
		if (b->cap < cap) {
			free(b);
			b = NULL;
		}
	}
	if (!b) {
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->pool = pool;
		b->cap = cap;
	}
	pool->refs++;
	return b;
}

/* A chunk's reply left (or its conn closed): the buffer goes back. */
static void buf_done(void *ctx, int status)
{
	struct dump_buf *b = ctx;
	struct dump_bufs *pool = b->pool;

	(void)status;
	bufs_put(pool, b);
	bufs_unref(pool);
}

struct emb_dump_sess {
	struct dump_bufs *bufs;	    /* chunk buffers */
	struct emb_server_table st; /* held until the session ends */
	struct emb_table_iter *it;  /* position in the table, or */
	struct emb_table_view *view; /* in the view (consistent dumps) */
	uint32_t row_floats;	    /* dim + state floats */
	uint64_t rows_sent;	    /* for the log line at the end */
};

void emb__server_dump_free(struct emb_dump_sess *sess)
{
	if (!sess)
		return;
	if (sess->bufs) {
		bufs_end(sess->bufs);
		bufs_unref(sess->bufs);
	}
	emb_table_iter_destroy(sess->it);
	emb_table_view_destroy(sess->view);
	emb_server_table_release(&sess->st);
	free(sess);
}

static void free_done(void *ctx, int status)
{
	(void)status;
	free(ctx);
}

static int reply_error(struct emb_req *req, int status, const char *msg)
{
	size_t cap = EMB_WIRE_HDR_SIZE + 4 + EMB_WIRE_ERRMSG_MAX;
	struct emb_frame_hdr hdr;
	struct iovec iov;
	uint8_t *buf = malloc(cap);
	int len;

	if (!buf) {
		emb_req_release(req);
		return status;
	}
	len = emb_wire_error_encode(buf, cap, req->hdr.opcode, req->hdr.req_id,
				    req->hdr.table_id, status,
				    msg ? msg : emb_strerror(status));
	if (len < 0) {
		free(buf);
		emb_req_release(req);
		return status;
	}
	memcpy(&hdr, buf, sizeof(hdr));
	iov.iov_base = buf + EMB_WIRE_HDR_SIZE;
	iov.iov_len = (size_t)len - EMB_WIRE_HDR_SIZE;
	if (emb_conn_reply(req, &hdr, &iov, 1, free_done, buf))
		free(buf);
	return status;
}

static int on_begin(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f,
		    struct emb_dump_sess **sessp)
{
	struct emb_wire_dump_info info = {0};
	struct emb_table_opts topts;
	struct emb_table_stats ts;
	struct emb_dump_sess *sess;
	struct emb_frame_hdr hdr;
	struct iovec iov;
	uint8_t *buf;
	int rc, len;

	/* A new BEGIN replaces a session the client abandoned. */
	emb__server_dump_free(*sessp);
	*sessp = NULL;
	sess = calloc(1, sizeof(*sess));
	if (sess)
		sess->bufs = calloc(1, sizeof(*sess->bufs));
	if (!sess || !sess->bufs) {
		free(sess);
		return reply_error(req, -ENOMEM, NULL);
	}
	sess->bufs->refs = 1;
	rc = emb_server_table_acquire(s, f->hdr.table_id, &sess->st);
	if (rc) {
		free(sess->bufs);
		free(sess);
		return reply_error(req, rc, NULL);
	}
	if (f->hdr.flags & EMB_F_CONSISTENT)
		rc = emb_table_view_create(sess->st.t, &sess->view);
	else
		rc = emb_table_iter_create(sess->st.t, &sess->it);
	if (rc) {
		emb__server_dump_free(sess);
		return reply_error(req, rc,
				   rc == -EBUSY ? "a consistent dump of this "
						  "table is running"
						: NULL);
	}
	sess->row_floats = emb_table_row_floats(sess->st.t);
	emb_table_stats(sess->st.t, &ts);
	emb_table_get_opts(sess->st.t, &topts);
	info.spec = sess->st.spec;
	/* The rows go as the table keeps them: say how. */
	info.spec.row_format = topts.row_format;
	info.spec.rounding = topts.rounding;
	info.row_floats = sess->row_floats;
	info.state_floats =
	    sess->row_floats - emb_table_weight_words(sess->st.t);
	info.rows = ts.rows;
	info.step = ts.step;
	if (sess->view) {
		uint64_t us = emb_table_view_pause_ns(sess->view) / 1000;

		info.rows = emb_table_view_rows(sess->view);
		info.step = emb_table_view_step(sess->view);
		info.flags = EMB_WIRE_DUMP_CONSISTENT;
		info.pause_us = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
	}
	buf = malloc(EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE);
	if (!buf) {
		emb__server_dump_free(sess);
		return reply_error(req, -ENOMEM, NULL);
	}
	len = emb_wire_dump_info_encode(
	    buf, EMB_WIRE_HDR_SIZE + EMB_WIRE_DUMP_INFO_SIZE, req->hdr.req_id,
	    f->hdr.table_id, &info);
	if (len < 0) {
		free(buf);
		emb__server_dump_free(sess);
		return reply_error(req, len, NULL);
	}
	*sessp = sess;
	if (sess->view)
		emb_log(EMB_LOG_INFO,
			"%s: consistent dump of table %s (%llu rows at step "
			"%llu) begins; writers held back %u us",
			emb_conn_peer(req->conn), sess->st.spec.name,
			(unsigned long long)info.rows,
			(unsigned long long)info.step, info.pause_us);
	else
		emb_log(EMB_LOG_INFO, "%s: dump of table %s (%llu rows) begins",
			emb_conn_peer(req->conn), sess->st.spec.name,
			(unsigned long long)ts.rows);
	memcpy(&hdr, buf, sizeof(hdr));
	iov.iov_base = buf + EMB_WIRE_HDR_SIZE;
	iov.iov_len = EMB_WIRE_DUMP_INFO_SIZE;
	if (emb_conn_reply(req, &hdr, &iov, 1, free_done, buf))
		free(buf);
	return 0;
}

static int on_chunk(struct emb_server *s, struct emb_req *req,
		    const struct emb_wire_frame *f, struct emb_dump_sess *sess)
{
	uint32_t rf, max, want;
	struct emb_frame_hdr hdr = {0};
	struct dump_buf *b;
	struct iovec iov;
	uint8_t *buf;
	uint64_t row_bytes;
	int got;

	(void)s;
	if (!sess || sess->st.id != f->hdr.table_id)
		return reply_error(req, EMB_EBADARG,
				   "no dump session open on this table");
	rf = sess->row_floats;
	row_bytes = emb_wire_dump_row_bytes(rf);
	max = emb_wire_dump_chunk_max_rows(f->lim->max_frame_bytes, rf);
	want = f->hdr.count < max ? f->hdr.count : max;
	if (want > f->lim->max_ids)
		want = f->lim->max_ids;
	if (want == 0)
		return reply_error(req, EMB_ETOOBIG,
				   "one row does not fit in a frame");
	b = bufs_get(sess->bufs, (size_t)(want * row_bytes));
	if (!b)
		return reply_error(req, -ENOMEM, NULL);
	buf = (uint8_t *)b->data;
	if (sess->view)
		got = emb_table_view_next(
		    sess->view, (uint64_t *)(void *)buf,
		    (float *)(void *)(buf + 16ull * want),
		    (struct emb_row_meta *)(void *)(buf + 8ull * want), want);
	else
		got = emb_table_iter_next(
		    sess->it, (uint64_t *)(void *)buf,
		    (float *)(void *)(buf + 16ull * want),
		    (struct emb_row_meta *)(void *)(buf + 8ull * want), want);
	if (got < 0) {
		buf_done(b, 0);
		return reply_error(
		    req, got,
		    got == EMB_EMEMLIMIT
			? "the consistent view's saved rows (rows written "
			  "during the dump) passed the memory limit; dump "
			  "again when fewer pushes run, or without "
			  "--consistent"
			: NULL);
	}
	if ((uint32_t)got < want) {
		/* The last chunk: close the gaps left for the rows that
		 * did not come. */
		memmove(buf + 8ull * got, buf + 8ull * want, 8ull * got);
		memmove(buf + 16ull * got, buf + 16ull * want, 4ull * rf * got);
	}
	sess->rows_sent += (uint64_t)got;
	hdr.opcode = EMB_OP_DUMP_CHUNK | EMB_OP_RESPONSE_BIT;
	hdr.table_id = f->hdr.table_id;
	hdr.count = (uint32_t)got;
	iov.iov_base = buf;
	iov.iov_len = (size_t)((uint64_t)got * row_bytes);
	if (got == 0) {
		buf_done(b, 0);
		bufs_end(sess->bufs);
		emb_conn_reply(req, &hdr, NULL, 0, NULL, NULL);
		return 0;
	}
	if (emb_conn_reply(req, &hdr, &iov, 1, buf_done, b))
		buf_done(b, 0);
	return 0;
}

int emb__server_dump(struct emb_server *s, struct emb_req *req,
		     const struct emb_wire_frame *f,
		     struct emb_dump_sess **sess)
{
	struct emb_frame_hdr hdr = {0};
	int rc = emb_wire_dump_req_decode(f, f->hdr.opcode);

	if (rc)
		return reply_error(req, rc, NULL);
	switch (f->hdr.opcode) {
	case EMB_OP_DUMP_BEGIN:
		return on_begin(s, req, f, sess);
	case EMB_OP_DUMP_CHUNK:
		return on_chunk(s, req, f, *sess);
	default:
		if (*sess)
			emb_log(EMB_LOG_INFO,
				"%s: dump of table %s ends, %llu rows sent",
				emb_conn_peer(req->conn), (*sess)->st.spec.name,
				(unsigned long long)(*sess)->rows_sent);
		emb__server_dump_free(*sess);
		*sess = NULL;
		hdr.opcode = EMB_OP_DUMP_END | EMB_OP_RESPONSE_BIT;
		hdr.table_id = f->hdr.table_id;
		emb_conn_reply(req, &hdr, NULL, 0, NULL, NULL);
		return 0;
	}
}
