/*
 * src/store/snapshot.c - snapshot files: the writer groups rows by slot
 * range and writes LZ4 blocks with XXH3 checksums under a temporary name,
 * the reader streams and verifies them, and the table helpers dump and load
 * whole tables. The layout is in snapshot.h and docs/format.md.
 *
 * A writer or reader belongs to one thread at a time (a writer runs one
 * worker thread of its own); the table helpers only use the table's
 * thread-safe calls.
 */
#include "store/snapshot.h"
#include "store/store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <lz4.h>
#include <xxhash.h>

#include "common/cfgcodec.h"
#include "common/endian.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "common/thread.h"

#define NGROUPS	  (EMB_NSLOTS / EMB_SNAP_GROUP_SLOTS)
#define ITER_ROWS 1024u

static const char file_magic[8] = "EMBSNAP";
#define BLOCK_MAGIC   0x4b424d45u /* "EMBK" */
#define TRAILER_MAGIC 0x54424d45u /* "EMBT" */

/* Bytes of one row in a block's raw payload: id, last_step, count, floats. */
static uint64_t raw_row_bytes(uint32_t row_floats)
{
	return 16 + 4ull * row_floats;
}

/* ---- metadata ---- */

/*
 * The header's row-format word (as CREATE_TABLE's, proto/wire_msg.h): the
 * format in bits 0..7, bit 8 for rounding to nearest. An fp32 table never
 * rounds, so its word is 0 whatever it was created with, and its file is
 * a version-1 file that older readers still read.
 */
#define FMT_NEAREST 0x100u

static uint32_t fmt_word(const struct emb_snap_meta *m)
{
	if (m->row_format == EMB_ROWFMT_FP32)
		return 0;
	return m->row_format |
	       (m->rounding == EMB_ROUND_NEAREST ? FMT_NEAREST : 0);
}

static int fmt_set(uint32_t w, struct emb_snap_meta *m)
{
	if ((w & ~(FMT_NEAREST | 0xffu)) || (w & 0xffu) >= EMB_ROWFMT_COUNT ||
	    ((w & FMT_NEAREST) && (w & 0xffu) == EMB_ROWFMT_FP32))
		return EMB_EDUMPFORMAT;
	m->row_format = w & 0xffu;
	m->rounding = (w & FMT_NEAREST) ? EMB_ROUND_NEAREST
					: EMB_ROUND_STOCHASTIC;
	return 0;
}

/* Words of a full row of m's format, dim and state; 0 if unknown. */
static uint32_t meta_row_words(const struct emb_snap_meta *m)
{
	if (m->row_format >= EMB_ROWFMT_COUNT)
		return 0;
	return emb_rowfmt_words(m->row_format, m->dim) + m->state_floats;
}

int emb_snap_meta_set_format(struct emb_snap_meta *m, uint32_t row_format,
			     uint32_t rounding)
{
	if (row_format >= EMB_ROWFMT_COUNT ||
	    (rounding != EMB_ROUND_NEAREST && rounding != EMB_ROUND_STOCHASTIC))
		return EMB_EBADFORMAT;
	m->row_format = row_format;
	m->rounding = row_format == EMB_ROWFMT_FP32 ? EMB_ROUND_STOCHASTIC
						    : rounding;
	m->row_floats = meta_row_words(m);
	return 0;
}

bool emb_snap_row_convert(const struct emb_snap_meta *from, uint32_t to,
			  const float *src, float *dst)
{
	uint32_t ww = emb_rowfmt_words(from->row_format, from->dim);
	uint32_t tw = emb_rowfmt_words(to, from->dim);
	float w[EMB_DIM_MAX];

	emb_rowfmt_decode(from->row_format, src, w, from->dim);
	if (!emb_rowfmt_encode(to, w, dst, from->dim, EMB_ROUND_NEAREST, 0))
		return false;
	memcpy(dst + tw, src + ww, (size_t)from->state_floats * sizeof(float));
	return true;
}

bool emb_snap_row_finite(const struct emb_snap_meta *m, const float *row)
{
	uint32_t ww = emb_rowfmt_words(m->row_format, m->dim);
	/* Adam's state ends in a uint32 step count, not a float. */
	uint32_t sf = m->state_floats - (m->optim.kind == EMB_OPTIM_ADAM);
	float w[EMB_DIM_MAX];

	if (m->row_format == EMB_ROWFMT_FP32)
		return emb_floats_finite(row, m->dim + sf);
	/* An int8 row's scale and bias decide every weight. */
	if (m->row_format == EMB_ROWFMT_INT8 && !emb_floats_finite(row, 2))
		return false;
	emb_rowfmt_decode(m->row_format, row, w, m->dim);
	return emb_floats_finite(w, m->dim) &&
	       emb_floats_finite(row + ww, sf);
}

void emb_snap_meta_from_table(struct emb_table *t, struct emb_snap_meta *m)
{
	struct emb_table_opts o;
	struct emb_table_stats st;

	emb_table_get_opts(t, &o);
	emb_table_stats(t, &st);
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", o.name);
	m->dim = o.dim;
	m->row_floats = emb_table_row_floats(t);
	m->state_floats = m->row_floats - emb_table_weight_words(t);
	m->row_format = o.row_format;
	m->rounding = o.row_format == EMB_ROWFMT_FP32 ? EMB_ROUND_STOCHASTIC
						     : o.rounding;
	m->optim = o.optim;
	m->init = o.init;
	m->seed = o.seed;
	m->step = st.step;
	m->nparts = 1;
	m->tier_mode = o.tier_mode;
	m->tier_request = o.tier_request;
}

void emb_snap_meta_to_opts(const struct emb_snap_meta *m,
			   struct emb_table_opts *o)
{
	*o = EMB_TABLE_OPTS_DEFAULT;
	o->name = m->name;
	o->dim = m->dim;
	o->optim = m->optim;
	o->init = m->init;
	o->seed = m->seed;
	o->row_format = m->row_format;
	o->rounding = m->rounding;
}

int emb_snap_meta_check(const struct emb_snap_meta *m,
			const struct emb_table_opts *o)
{
	if (m->dim != o->dim)
		return EMB_EBADDIM;
	if (m->optim.kind != o->optim.kind)
		return EMB_EBADOPTIM;
	if (m->row_format != o->row_format)
		return EMB_EBADFORMAT;
	return 0;
}

/*
 * Bytes 244..247: what the table's CREATE asked of its server's tier,
 * bits 0..1 the mode and 2..31 the bytes in whole MiB (rounded up; 1 PiB
 * at most). 0 for a table that asked nothing, as in every file before.
 */
static uint32_t tier_word(const struct emb_snap_meta *m)
{
	uint64_t mib = (m->tier_request + (1u << 20) - 1) >> 20;

	if (mib > (UINT32_MAX >> 2))
		mib = UINT32_MAX >> 2;
	return (m->tier_mode & 3u) | (uint32_t)mib << 2;
}

static void hdr_encode(uint8_t *p, const struct emb_snap_meta *m)
{
	uint32_t word = fmt_word(m);

	memset(p, 0, EMB_SNAP_HDR_SIZE);
	memcpy(p, file_magic, 8);
	/* Version 2 only when it says more than version 1 could. */
	emb_le32_store(p + 8, word ? 2u : 1u);
	emb_le32_store(p + 12, EMB_SNAP_HDR_SIZE);
	memcpy(p + 16, m->name, strnlen(m->name, EMB_NAME_MAX));
	emb_le32_store(p + 80, m->dim);
	emb_le32_store(p + 84, m->state_floats);
	emb_le32_store(p + 88, m->row_floats);
	emb_le32_store(p + 92, EMB_NSLOTS);
	emb_cfg_optim_encode(p + 96, &m->optim);
	emb_cfg_init_encode(p + 136, &m->init);
	emb_le32_store(p + 148, m->flags);
	emb_le64_store(p + 152, m->seed);
	emb_le64_store(p + 160, m->rows);
	emb_le64_store(p + 168, m->blocks);
	emb_le64_store(p + 176, m->step);
	emb_le64_store(p + 184, m->created_ns);
	emb_le32_store(p + 192, m->part);
	emb_le32_store(p + 196, m->nparts);
	emb_le64_store(p + 200, m->file_bytes);
	emb_le64_store(p + 208, m->raw_bytes);
	emb_le64_store(p + 216, m->base_id);
	emb_le64_store(p + 224, m->prev_id);
	emb_le64_store(p + 232, m->erased);
	emb_le32_store(p + 240, word);
	emb_le32_store(p + 244, tier_word(m));
	emb_le64_store(p + 248, XXH3_64bits(p, 248));
}

static int hdr_decode(const uint8_t *p, struct emb_snap_meta *m)
{
	uint32_t version, word;

	memset(m, 0, sizeof(*m));
	if (memcmp(p, file_magic, 8) != 0)
		return EMB_EDUMPFORMAT;
	/* The version comes before the checksum: another version may lay
	 * the header out differently. */
	version = emb_le32_load(p + 8);
	if (version < 1 || version > EMB_SNAP_VERSION ||
	    emb_le32_load(p + 12) != EMB_SNAP_HDR_SIZE)
		return EMB_EDUMPFORMAT;
	if (emb_le64_load(p + 248) != XXH3_64bits(p, 248))
		return EMB_EBADDUMP;
	m->version = version;
	memcpy(m->name, p + 16, EMB_NAME_MAX);
	m->name[EMB_NAME_MAX] = '\0';
	m->dim = emb_le32_load(p + 80);
	m->state_floats = emb_le32_load(p + 84);
	m->row_floats = emb_le32_load(p + 88);
	emb_cfg_optim_decode(p + 96, &m->optim);
	emb_cfg_init_decode(p + 136, &m->init);
	m->flags = emb_le32_load(p + 148);
	m->seed = emb_le64_load(p + 152);
	m->rows = emb_le64_load(p + 160);
	m->blocks = emb_le64_load(p + 168);
	m->step = emb_le64_load(p + 176);
	m->created_ns = emb_le64_load(p + 184);
	m->part = emb_le32_load(p + 192);
	m->nparts = emb_le32_load(p + 196);
	m->file_bytes = emb_le64_load(p + 200);
	m->raw_bytes = emb_le64_load(p + 208);
	m->base_id = emb_le64_load(p + 216);
	m->prev_id = emb_le64_load(p + 224);
	m->erased = emb_le64_load(p + 232);
	/* Version 1 had no row formats: its bytes 240..247 are 0 and its
	 * rows fp32. Each table has one encoding: version 2 iff word != 0. */
	word = emb_le32_load(p + 240);
	if ((version == 1) != (word == 0) || fmt_set(word, m))
		return EMB_EDUMPFORMAT;
	word = emb_le32_load(p + 244);
	m->tier_mode = word & 3u;
	m->tier_request = (uint64_t)(word >> 2) << 20;
	if (m->tier_mode >= EMB_TIER_MODE_COUNT)
		return EMB_EDUMPFORMAT;
	if (!(m->flags & EMB_SNAP_F_DELTA) &&
	    (m->base_id || m->prev_id || m->erased))
		return EMB_EDUMPFORMAT;
	if (p[16 + EMB_NAME_MAX] != 0 || m->name[0] == '\0' ||
	    emb_le32_load(p + 92) != EMB_NSLOTS || m->dim == 0 ||
	    m->dim > EMB_DIM_MAX ||
	    m->state_floats != emb_optim_state_floats(m->optim.kind, m->dim) ||
	    m->row_floats != meta_row_words(m) ||
	    (m->flags & ~(EMB_SNAP_F_SHUFFLE | EMB_SNAP_F_DELTA)) ||
	    m->nparts == 0 ||
	    m->part >= m->nparts ||
	    m->file_bytes < EMB_SNAP_HDR_SIZE + EMB_SNAP_TRAILER_SIZE)
		return EMB_EDUMPFORMAT;
	return 0;
}

/* ---- byte planes ---- */

/*
 * Byte b of float i goes to dst[b * m + i]: exponents end up together. The
 * SSE2 path moves 16 floats per step (a 4 x 16 byte transpose); the scalar
 * loop does the tail and non-x86 hosts.
 */
static void shuffle4(uint8_t *dst, const uint8_t *src, size_t m)
{
	size_t i = 0;

#ifdef __SSE2__
	for (; i + 16 <= m; i += 16) {
		__m128i a[4], b[4];

		for (int k = 0; k < 4; k++) {
			a[k] = _mm_loadu_si128(
			    (const __m128i *)(const void *)(src + 4 * i +
							    16 * k));
			b[k] = _mm_shuffle_epi32(a[k], 0xd8);
			a[k] = _mm_shuffle_epi32(a[k], 0x8d);
			a[k] = _mm_unpacklo_epi8(b[k], a[k]);
			b[k] = _mm_shuffle_epi32(a[k], 0x4e);
			a[k] = _mm_unpacklo_epi16(a[k], b[k]);
		}
		for (int k = 0; k < 2; k++) {
			b[2 * k] = _mm_unpacklo_epi32(a[2 * k], a[2 * k + 1]);
			b[2 * k + 1] =
			    _mm_unpackhi_epi32(a[2 * k], a[2 * k + 1]);
		}
		for (int k = 0; k < 2; k++) {
			a[2 * k] = _mm_unpacklo_epi64(b[k], b[k + 2]);
			a[2 * k + 1] = _mm_unpackhi_epi64(b[k], b[k + 2]);
		}
		for (int k = 0; k < 4; k++)
			_mm_storeu_si128((__m128i *)(void *)(dst + k * m + i),
					 a[k]);
	}
#endif
	for (; i < m; i++) {
		dst[i] = src[4 * i];
		dst[m + i] = src[4 * i + 1];
		dst[2 * m + i] = src[4 * i + 2];
		dst[3 * m + i] = src[4 * i + 3];
	}
}

static void unshuffle4(uint8_t *dst, const uint8_t *src, size_t m)
{
	size_t i = 0;

#ifdef __SSE2__
	for (; i + 16 <= m; i += 16) {
		__m128i a[4], b[4];

		for (int k = 0; k < 4; k++)
			a[k] = _mm_loadu_si128(
			    (const __m128i *)(const void *)(src + k * m + i));
		for (int k = 0; k < 2; k++) {
			b[k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);
			b[2 + k] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);
		}
		for (int k = 0; k < 2; k++) {
			a[k] = _mm_unpacklo_epi16(b[2 * k], b[2 * k + 1]);
			a[2 + k] = _mm_unpackhi_epi16(b[2 * k], b[2 * k + 1]);
		}
		_mm_storeu_si128((__m128i *)(void *)(dst + 4 * i), a[0]);
		_mm_storeu_si128((__m128i *)(void *)(dst + 4 * i + 16), a[2]);
		_mm_storeu_si128((__m128i *)(void *)(dst + 4 * i + 32), a[1]);
		_mm_storeu_si128((__m128i *)(void *)(dst + 4 * i + 48), a[3]);
	}
#endif
	for (; i < m; i++) {
		dst[4 * i] = src[i];
		dst[4 * i + 1] = src[m + i];
		dst[4 * i + 2] = src[2 * m + i];
		dst[4 * i + 3] = src[3 * m + i];
	}
}

/* ---- file helpers ---- */

/* Writes all len bytes at file offset off, or at the file's position
 * when off is negative. */
static int write_at(int fd, const void *buf, size_t len, int64_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t k = off < 0 ? write(fd, p, len)
				    : pwrite(fd, p, len, (off_t)off);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -EIO;
		p += k;
		len -= (size_t)k;
		off = off < 0 ? off : off + k;
	}
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	return write_at(fd, buf, len, -1);
}

/* Reads exactly len bytes; EMB_ETRUNCATED at an early end of file. */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t k = read(fd, p, len);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return EMB_ETRUNCATED;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* fsyncs the directory that holds path, so a rename in it is durable. */
static int fsync_parent(const char *path)
{
	char dir[EMB_SNAP_PATH_MAX];
	const char *slash = strrchr(path, '/');
	int fd, rc = 0;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) != 0 && errno != EINVAL)
		rc = -errno;
	close(fd);
	return rc;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- writer ---- */

#define NJOBS 3 /* blocks in flight between the caller and the worker */

/*
 * Direct writes (O_DIRECT): the worker lays blocks out in an aligned
 * staging buffer and writes it STAGE_FLUSH bytes at a time, whole
 * DIO_ALIGN units at aligned offsets; the tail of a unit waits for the
 * next block. Why: a buffered write(2) copies every byte into page-cache
 * pages the kernel must find and zero first, which cost more than the
 * compression and checksums together (docs/format.md, Performance), and
 * a dump's pages are never read again by this process. There are two
 * stages: a thread of its own writes a full one while the worker lays
 * out blocks in the other, so that compressing and the device overlap.
 * The file's first unit is kept so that the real header can be written
 * over it at the end; the last unit is padded and the file truncated to
 * its size.
 */
#define DIO_ALIGN   4096u
#define STAGE_FLUSH (4u << 20)

/* Rows of one slot range waiting to fill a block. */
struct group {
	uint64_t *ids;		   /* n ids */
	struct emb_row_meta *meta; /* n meta */
	float *rows;		   /* n * row_floats floats */
	uint32_t n;		   /* rows held */
	uint32_t cap;		   /* room, grows to block_rows */
};

/* One sorted, uncompressed block handed to the worker. */
struct job {
	uint8_t *raw;	/* raw payload, raw_cap bytes */
	size_t raw_len; /* bytes used */
	uint32_t n;	/* rows */
	uint32_t first; /* slot range */
	uint32_t last;
	bool erased;	/* raw holds n removed ids */
};

/*
 * The caller's thread groups and sorts rows; a worker thread compresses,
 * checksums and writes the blocks in the order they were queued, so that
 * the two halves overlap. Fields marked (w) belong to the worker until
 * finish() has joined it.
 */
struct emb_snap_writer {
	struct emb_snap_meta meta;	 /* header fields; counts (w) */
	struct emb_snap_write_opts opts; /* as given, defaults filled in */
	char *path;			 /* final name */
	char *tmp;			 /* name while writing */
	int fd;				 /* open on tmp, -1 after close */
	int err;			 /* caller's first error; sticky */
	bool added;			 /* rows were added: no more erase */
	bool created;			 /* tmp exists: remove unless done */
	bool done;			 /* renamed to path */
	uint32_t block_rows;		 /* rows per full block */
	size_t raw_cap;			 /* bytes of one raw block */
	struct group groups[NGROUPS];	 /* one per slot range */
	uint8_t *plane;			 /* caller: floats before shuffling */
	uint8_t *comp;			 /* (w) block header + LZ4 output */
	size_t comp_cap;		 /* bytes of comp */
	bool direct;			 /* fd is O_DIRECT: writes via stage */
	uint8_t *stages[2];		 /* DIO_ALIGN-aligned, stage_cap */
	uint8_t *stage;			 /* (w) the one being laid out */
	size_t stage_cap;		 /* STAGE_FLUSH + comp_cap + DIO_ALIGN */
	size_t stage_len;		 /* (w) bytes laid out, not written */
	uint64_t disk_off;		 /* (w) bytes handed to io */
	uint8_t *page0;			 /* the file's first DIO_ALIGN bytes */

	/* The direct writes' thread; guarded by io_lock. */
	pthread_t io;		 /* writes io_len bytes of io_buf */
	bool io_running;	 /* started, not joined */
	pthread_mutex_t io_lock; /* guards the fields below */
	pthread_cond_t io_cond;	 /* busy or quit changed */
	const uint8_t *io_buf;	 /* the stage being written */
	size_t io_len;		 /* its bytes */
	uint64_t io_off;	 /* at this file offset */
	bool io_busy;		 /* a write is handed over, not done */
	bool io_quit;		 /* no more writes will come */
	int io_err;		 /* first failed write */
	uint32_t *slot_rows;		 /* rows per slot, EMB_NSLOTS */
	XXH3_state_t *xxh;		 /* (w) file checksum, body part */

	pthread_t worker;	/* compresses and writes */
	bool worker_running;	/* started, not joined */
	pthread_mutex_t lock;	/* guards the queue below */
	pthread_cond_t cond;	/* queue changed */
	struct job jobs[NJOBS]; /* ring */
	uint64_t head;		/* jobs taken by the worker */
	uint64_t tail;		/* jobs queued */
	bool quit;		/* no more jobs will come */
	int werr;		/* worker's first error */
};

static void *writer_main(void *arg);

/* The direct writes' thread: one stage at a time, as handed over. */
static void *io_main(void *arg)
{
	struct emb_snap_writer *w = arg;

	pthread_mutex_lock(&w->io_lock);
	for (;;) {
		int rc;

		while (!w->io_busy && !w->io_quit)
			pthread_cond_wait(&w->io_cond, &w->io_lock);
		if (!w->io_busy)
			break;
		pthread_mutex_unlock(&w->io_lock);
		rc = write_at(w->fd, w->io_buf, w->io_len, (int64_t)w->io_off);
		pthread_mutex_lock(&w->io_lock);
		if (rc && !w->io_err)
			w->io_err = rc;
		w->io_busy = false;
		pthread_cond_broadcast(&w->io_cond);
	}
	pthread_mutex_unlock(&w->io_lock);
	return NULL;
}

/* Waits until the io thread is idle; its first error, or 0. */
static int io_wait(struct emb_snap_writer *w)
{
	int rc;

	pthread_mutex_lock(&w->io_lock);
	while (w->io_busy)
		pthread_cond_wait(&w->io_cond, &w->io_lock);
	rc = w->io_err;
	pthread_mutex_unlock(&w->io_lock);
	return rc;
}

static void io_stop(struct emb_snap_writer *w)
{
	if (!w->io_running)
		return;
	pthread_mutex_lock(&w->io_lock);
	w->io_quit = true;
	pthread_cond_broadcast(&w->io_cond);
	pthread_mutex_unlock(&w->io_lock);
	pthread_join(w->io, NULL);
	w->io_running = false;
}

/*
 * Opens w->tmp, with O_DIRECT and a staging buffer unless told not to or
 * the file system refuses it (tmpfs: EINVAL), then buffered.
 */
static int open_out(struct emb_snap_writer *w)
{
	const int fl = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
	void *p;

	if (!w->opts.buffered) {
		w->fd = open(w->tmp, fl | O_DIRECT, 0644);
		if (w->fd >= 0) {
			w->created = true;
			w->stage_cap = STAGE_FLUSH + w->comp_cap + DIO_ALIGN;
			for (int k = 0; k < 2; k++) {
				if (posix_memalign(&p, DIO_ALIGN, w->stage_cap))
					return -ENOMEM;
				w->stages[k] = p;
			}
			w->stage = w->stages[0];
			if (posix_memalign(&p, DIO_ALIGN, DIO_ALIGN))
				return -ENOMEM;
			w->page0 = p;
			w->direct = true;
			if (emb_thread_start(&w->io, NULL, io_main, w,
					     "emb-snapio"))
				return -EAGAIN;
			w->io_running = true;
			return 0;
		}
		if (errno != EINVAL)
			return -errno;
	}
	w->fd = open(w->tmp, fl, 0644);
	return w->fd < 0 ? -errno : 0;
}

/*
 * Direct: hands the stage's whole DIO_ALIGN units to the io thread and
 * goes on in the other stage with the part of a unit left over. The last
 * flush writes all of it, zero-padded to a unit, and waits.
 */
static int stage_flush(struct emb_snap_writer *w, bool last)
{
	size_t len = last ? (w->stage_len + DIO_ALIGN - 1) / DIO_ALIGN *
				DIO_ALIGN
			  : w->stage_len / DIO_ALIGN * DIO_ALIGN;
	uint8_t *next;
	int rc;

	rc = io_wait(w);
	if (rc || len == 0)
		return rc;
	memset(w->stage + w->stage_len, 0,
	       len > w->stage_len ? len - w->stage_len : 0);
	if (w->disk_off == 0)
		memcpy(w->page0, w->stage, DIO_ALIGN);
	if (last) {
		rc = write_at(w->fd, w->stage, len, (int64_t)w->disk_off);
		w->disk_off += len;
		w->stage_len = 0;
		return rc;
	}
	pthread_mutex_lock(&w->io_lock);
	w->io_buf = w->stage;
	w->io_len = len;
	w->io_off = w->disk_off;
	w->io_busy = true;
	pthread_cond_broadcast(&w->io_cond);
	pthread_mutex_unlock(&w->io_lock);
	w->disk_off += len;
	next = w->stage == w->stages[0] ? w->stages[1] : w->stages[0];
	memcpy(next, w->stage + len, w->stage_len - len);
	w->stage_len -= len;
	w->stage = next;
	return 0;
}

/* Where the worker lays out its next block: the stage's end when direct. */
static uint8_t *block_dst(struct emb_snap_writer *w)
{
	return w->direct ? w->stage + w->stage_len : w->comp;
}

int emb_snap_writer_create(const char *path, const struct emb_snap_meta *meta,
			   const struct emb_snap_write_opts *opts,
			   struct emb_snap_writer **out)
{
	uint8_t hdr[EMB_SNAP_HDR_SIZE];
	struct emb_snap_writer *w;
	uint64_t row_bytes;
	size_t plen;
	int rc;

	if (!path || !meta || !out || meta->dim == 0 ||
	    meta->dim > EMB_DIM_MAX || meta->nparts == 0 ||
	    meta->part >= meta->nparts || meta->name[0] == '\0' ||
	    meta->state_floats !=
		emb_optim_state_floats(meta->optim.kind, meta->dim) ||
	    meta->row_floats != meta_row_words(meta) ||
	    (meta->row_format != EMB_ROWFMT_FP32 &&
	     meta->rounding != EMB_ROUND_NEAREST &&
	     meta->rounding != EMB_ROUND_STOCHASTIC))
		return EMB_EBADARG;
	if (opts && (opts->block_bytes < 4096 ||
		     opts->block_bytes > EMB_SNAP_BLOCK_MAX || opts->level < 1))
		return EMB_EBADARG;
	plen = strlen(path);
	if (plen == 0 || plen + 32 > EMB_SNAP_PATH_MAX)
		return EMB_EBADARG;

	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = -1;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	pthread_mutex_init(&w->io_lock, NULL);
	pthread_cond_init(&w->io_cond, NULL);
	w->meta = *meta;
	w->meta.rows = 0;
	w->meta.blocks = 0;
	w->meta.raw_bytes = 0;
	w->meta.file_bytes = 0;
	w->meta.erased = 0;
	w->meta.flags = meta->flags & EMB_SNAP_F_DELTA;
	if (!(w->meta.flags & EMB_SNAP_F_DELTA))
		w->meta.base_id = w->meta.prev_id = 0;
	if (!w->meta.created_ns)
		w->meta.created_ns = now_ns();
	w->opts = opts ? *opts : EMB_SNAP_WRITE_OPTS_DEFAULT;
	if (w->opts.shuffle)
		w->meta.flags |= EMB_SNAP_F_SHUFFLE;
	row_bytes = raw_row_bytes(meta->row_floats);
	w->block_rows = (uint32_t)(w->opts.block_bytes / row_bytes);
	if (w->block_rows == 0)
		w->block_rows = 1;
	/* A single wide row may exceed the target; the limit is the cap. */
	if (w->block_rows * row_bytes > EMB_SNAP_BLOCK_MAX) {
		rc = EMB_EBADARG;
		goto err_free;
	}
	w->raw_cap = (size_t)(w->block_rows * row_bytes);
	w->comp_cap =
	    EMB_SNAP_BLOCK_HDR + (size_t)LZ4_compressBound((int)w->raw_cap);
	/* finish() builds the trailer in this buffer too. */
	if (w->comp_cap < EMB_SNAP_TRAILER_SIZE)
		w->comp_cap = EMB_SNAP_TRAILER_SIZE;
	w->path = strdup(path);
	w->tmp = malloc(plen + 32);
	w->plane = malloc((size_t)w->block_rows * 4 * meta->row_floats);
	w->comp = malloc(w->comp_cap);
	w->slot_rows = calloc(EMB_NSLOTS, sizeof(*w->slot_rows));
	w->xxh = XXH3_createState();
	if (!w->path || !w->tmp || !w->plane || !w->comp || !w->slot_rows ||
	    !w->xxh) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (int k = 0; k < NJOBS; k++) {
		w->jobs[k].raw = malloc(w->raw_cap);
		if (!w->jobs[k].raw) {
			rc = -ENOMEM;
			goto err_free;
		}
	}
	XXH3_64bits_reset(w->xxh);
	snprintf(w->tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
	rc = open_out(w);
	if (rc)
		goto err_free;
	w->created = true;
	/* A placeholder: the real header, with counts, is written last. */
	hdr_encode(hdr, &w->meta);
	if (w->opts.write_hook &&
	    (rc = w->opts.write_hook(w->opts.hook_arg, sizeof(hdr))) != 0)
		goto err_free;
	if (w->direct) {
		memcpy(w->stage, hdr, sizeof(hdr));
		w->stage_len = sizeof(hdr);
	} else {
		rc = write_all(w->fd, hdr, sizeof(hdr));
		if (rc)
			goto err_free;
	}
	w->meta.file_bytes = EMB_SNAP_HDR_SIZE;
	rc = emb_thread_start(&w->worker, NULL, writer_main, w, "emb-snap");
	if (rc)
		goto err_free;
	w->worker_running = true;
	*out = w;
	return 0;

err_free:
	emb_snap_writer_destroy(w);
	return rc;
}

bool emb_snap_writer_direct(const struct emb_snap_writer *w)
{
	return w->direct;
}

/*
 * Worker: appends the n bytes at buf, which block_dst() gave, to the file,
 * hashing and counting them.
 */
static int writer_write(struct emb_snap_writer *w, const uint8_t *buf,
			size_t n)
{
	int rc;

	if (w->opts.write_hook) {
		rc = w->opts.write_hook(w->opts.hook_arg, n);
		if (rc)
			return rc;
	}
	XXH3_64bits_update(w->xxh, buf, n);
	if (w->direct) {
		w->stage_len += n;
		rc = w->stage_len >= STAGE_FLUSH ? stage_flush(w, false) : 0;
	} else {
		rc = write_all(w->fd, buf, n);
	}
	if (rc)
		return rc;
	w->meta.file_bytes += n;
	return 0;
}

/* Worker: compresses one job into a block and writes it. */
static int write_block(struct emb_snap_writer *w, const struct job *j)
{
	uint8_t *h = block_dst(w);
	uint32_t flags = 0;
	int clen;

	clen = LZ4_compress_fast(
	    (const char *)j->raw, (char *)h + EMB_SNAP_BLOCK_HDR,
	    (int)j->raw_len, (int)(w->comp_cap - EMB_SNAP_BLOCK_HDR),
	    w->opts.level);
	if (clen <= 0 || (size_t)clen >= j->raw_len) {
		/* Incompressible: store it, so a block never grows. */
		memcpy(h + EMB_SNAP_BLOCK_HDR, j->raw, j->raw_len);
		clen = (int)j->raw_len;
		flags |= EMB_SNAP_BF_RAW;
	}
	if (j->erased)
		flags |= EMB_SNAP_BF_ERASED;
	emb_le32_store(h, BLOCK_MAGIC);
	emb_le32_store(h + 4, j->n);
	emb_le32_store(h + 8, j->first);
	emb_le32_store(h + 12, j->last);
	emb_le32_store(h + 16, (uint32_t)j->raw_len);
	emb_le32_store(h + 20, (uint32_t)clen);
	emb_le32_store(h + 24, flags);
	emb_le32_store(h + 28, 0);
	emb_le64_store(h + 32, w->meta.blocks);
	emb_le64_store(h + 40,
		       XXH3_64bits_withSeed(h + EMB_SNAP_BLOCK_HDR,
					    (size_t)clen, XXH3_64bits(h, 40)));
	if (j->erased)
		w->meta.erased += j->n;
	else
		w->meta.rows += j->n;
	w->meta.blocks++;
	w->meta.raw_bytes += j->raw_len;
	return writer_write(w, h, EMB_SNAP_BLOCK_HDR + (size_t)clen);
}

static void *writer_main(void *arg)
{
	struct emb_snap_writer *w = arg;
	int rc = 0;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct job *j;

		while (w->head == w->tail && !w->quit)
			pthread_cond_wait(&w->cond, &w->lock);
		if (w->head == w->tail)
			break;
		j = &w->jobs[w->head % NJOBS];
		pthread_mutex_unlock(&w->lock);
		/* After an error the rest is drained unwritten. */
		if (!rc)
			rc = write_block(w, j);
		pthread_mutex_lock(&w->lock);
		if (rc && !w->werr)
			w->werr = rc;
		w->head++;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/*
 * Sorts group g's rows by slot into a free job and queues it. Returns the
 * worker's error if it has failed (the caller stops then).
 */
static int flush_group(struct emb_snap_writer *w, uint32_t g)
{
	struct group *gr = &w->groups[g];
	uint32_t n = gr->n, rf = w->meta.row_floats;
	uint32_t start[EMB_SNAP_GROUP_SLOTS + 1] = {0};
	uint32_t slot_lo = g * EMB_SNAP_GROUP_SLOTS, first = UINT32_MAX,
		 last = 0;
	uint64_t *ids;
	uint32_t *steps, *counts;
	uint8_t *floats;
	float *dst_rows;
	struct job *j;
	int rc;

	if (n == 0)
		return 0;
	pthread_mutex_lock(&w->lock);
	while (w->tail - w->head == NJOBS && !w->werr)
		pthread_cond_wait(&w->cond, &w->lock);
	rc = w->werr;
	j = &w->jobs[w->tail % NJOBS];
	pthread_mutex_unlock(&w->lock);
	if (rc)
		return rc;

	ids = (uint64_t *)(void *)j->raw;
	steps = (uint32_t *)(void *)(j->raw + 8ull * n);
	counts = steps + n;
	floats = j->raw + 16ull * n;
	dst_rows = w->opts.shuffle ? (float *)(void *)w->plane
				   : (float *)(void *)floats;
	/* Counting sort by slot within the group's range. */
	for (uint32_t i = 0; i < n; i++)
		start[emb_id_slot(gr->ids[i]) - slot_lo + 1]++;
	for (uint32_t k = 0; k < EMB_SNAP_GROUP_SLOTS; k++) {
		if (start[k + 1]) {
			first = first == UINT32_MAX ? slot_lo + k : first;
			last = slot_lo + k;
			w->slot_rows[slot_lo + k] += start[k + 1];
		}
		start[k + 1] += start[k];
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = start[emb_id_slot(gr->ids[i]) - slot_lo]++;

		ids[pos] = gr->ids[i];
		steps[pos] = gr->meta[i].last_step;
		counts[pos] = gr->meta[i].count;
		memcpy(dst_rows + (size_t)pos * rf, gr->rows + (size_t)i * rf,
		       (size_t)rf * sizeof(float));
	}
	if (w->opts.shuffle)
		shuffle4(floats, w->plane, (size_t)n * rf);
	j->raw_len = (size_t)(n * raw_row_bytes(rf));
	j->n = n;
	j->first = first;
	j->last = last;
	j->erased = false;
	gr->n = 0;

	pthread_mutex_lock(&w->lock);
	w->tail++;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Waits for the worker to write every queued block and stops it. */
static int writer_join(struct emb_snap_writer *w)
{
	int rc;

	if (!w->worker_running)
		return 0;
	pthread_mutex_lock(&w->lock);
	w->quit = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->worker, NULL);
	w->worker_running = false;
	pthread_mutex_lock(&w->lock);
	rc = w->werr;
	pthread_mutex_unlock(&w->lock);
	return rc;
}

static int group_grow(struct group *gr, uint32_t want, uint32_t rf)
{
	uint32_t cap = gr->cap ? gr->cap : 64;
	void *p;

	while (cap < want)
		cap *= 2;
	p = realloc(gr->ids, (size_t)cap * sizeof(*gr->ids));
	if (!p)
		return -ENOMEM;
	gr->ids = p;
	p = realloc(gr->meta, (size_t)cap * sizeof(*gr->meta));
	if (!p)
		return -ENOMEM;
	gr->meta = p;
	p = realloc(gr->rows, (size_t)cap * rf * sizeof(float));
	if (!p)
		return -ENOMEM;
	gr->rows = p;
	gr->cap = cap;
	return 0;
}

int emb_snap_writer_add(struct emb_snap_writer *w, const uint64_t *ids,
			const float *rows, const struct emb_row_meta *meta,
			uint32_t n)
{
	uint32_t rf = w->meta.row_floats;
	int rc;

	if (w->err)
		return w->err;
	if (w->done || (n && (!ids || !rows)))
		return EMB_EBADARG;
	w->added = w->added || n;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t g = emb_id_slot(ids[i]) / EMB_SNAP_GROUP_SLOTS;
		struct group *gr = &w->groups[g];

		if (gr->n == gr->cap) {
			uint32_t want = gr->cap ? gr->cap * 2 : 64;

			if (want > w->block_rows)
				want = w->block_rows;
			rc = group_grow(gr, want, rf);
			if (rc)
				goto err;
		}
		gr->ids[gr->n] = ids[i];
		gr->meta[gr->n] = meta ? meta[i] : (struct emb_row_meta){0};
		memcpy(gr->rows + (size_t)gr->n * rf, rows + (size_t)i * rf,
		       (size_t)rf * sizeof(float));
		if (++gr->n == w->block_rows) {
			rc = flush_group(w, g);
			if (rc)
				goto err;
		}
	}
	return 0;
err:
	w->err = rc;
	return rc;
}

/* Takes a free job slot, waiting for the worker; its error if it failed. */
static int job_take(struct emb_snap_writer *w, struct job **out)
{
	int rc;

	pthread_mutex_lock(&w->lock);
	while (w->tail - w->head == NJOBS && !w->werr)
		pthread_cond_wait(&w->cond, &w->lock);
	rc = w->werr;
	*out = &w->jobs[w->tail % NJOBS];
	pthread_mutex_unlock(&w->lock);
	return rc;
}

static void job_queue(struct emb_snap_writer *w)
{
	pthread_mutex_lock(&w->lock);
	w->tail++;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int emb_snap_writer_erase(struct emb_snap_writer *w, const uint64_t *ids,
			  uint64_t n)
{
	/* As many ids as a row block has bytes, at least one row's worth. */
	uint64_t per = w->raw_cap / 8;
	int rc;

	if (w->err)
		return w->err;
	if (w->done || w->added || (n && !ids) ||
	    !(w->meta.flags & EMB_SNAP_F_DELTA))
		return EMB_EBADARG;
	for (uint64_t i = 0; i < n; i += per) {
		uint32_t m = (uint32_t)(n - i < per ? n - i : per);
		struct job *j;

		rc = job_take(w, &j);
		if (rc)
			goto err;
		memcpy(j->raw, ids + i, (size_t)m * sizeof(*ids));
		j->raw_len = (size_t)m * sizeof(*ids);
		j->n = m;
		j->first = 0;
		j->last = EMB_NSLOTS - 1;
		j->erased = true;
		job_queue(w);
	}
	return 0;
err:
	w->err = rc;
	return rc;
}

int emb_snap_writer_finish(struct emb_snap_writer *w,
			   struct emb_snap_result *res)
{
	uint8_t *tr, hdr[EMB_SNAP_HDR_SIZE];
	uint64_t sum;
	int rc;

	if (w->err)
		return w->err;
	if (w->done)
		return EMB_EBADARG;
	for (uint32_t g = 0; g < NGROUPS; g++) {
		rc = flush_group(w, g);
		if (rc)
			goto err;
	}
	rc = writer_join(w);
	if (rc)
		goto err;
	/* The worker is gone: its buffer builds the trailer. */
	tr = w->comp;
	memset(tr, 0, EMB_SNAP_TRAILER_SIZE);
	emb_le32_store(tr, TRAILER_MAGIC);
	emb_le64_store(tr + 8, w->meta.rows);
	emb_le64_store(tr + 16, w->meta.blocks);
	emb_le64_store(tr + 24, w->meta.raw_bytes);
	for (uint32_t s = 0; s < EMB_NSLOTS; s++)
		emb_le32_store(tr + 32 + 4 * s, w->slot_rows[s]);
	w->meta.file_bytes += EMB_SNAP_TRAILER_SIZE;
	hdr_encode(hdr, &w->meta);
	XXH3_64bits_update(w->xxh, tr, EMB_SNAP_TRAILER_SIZE - 8);
	XXH3_64bits_update(w->xxh, hdr, sizeof(hdr));
	sum = XXH3_64bits_digest(w->xxh);
	emb_le64_store(tr + EMB_SNAP_TRAILER_SIZE - 8, sum);
	if (w->opts.write_hook &&
	    (rc = w->opts.write_hook(w->opts.hook_arg,
				     EMB_SNAP_TRAILER_SIZE)) != 0)
		goto err;
	if (w->direct) {
		/* The last units, the size, then the header over unit 0. */
		memcpy(w->stage + w->stage_len, tr, EMB_SNAP_TRAILER_SIZE);
		w->stage_len += EMB_SNAP_TRAILER_SIZE;
		rc = stage_flush(w, true);
		if (!rc && ftruncate(w->fd, (off_t)w->meta.file_bytes) != 0)
			rc = -errno;
		memcpy(w->page0, hdr, sizeof(hdr));
		if (!rc)
			rc = write_at(w->fd, w->page0, DIO_ALIGN, 0);
	} else {
		rc = write_all(w->fd, tr, EMB_SNAP_TRAILER_SIZE);
		if (!rc)
			rc = write_at(w->fd, hdr, sizeof(hdr), 0);
	}
	if (rc)
		goto err;
	if (fsync(w->fd) != 0) {
		rc = -errno;
		goto err;
	}
	rc = close(w->fd) ? -errno : 0;
	w->fd = -1;
	if (rc)
		goto err;
	if (rename(w->tmp, w->path) != 0) {
		rc = -errno;
		goto err;
	}
	w->done = true;
	rc = fsync_parent(w->path);
	if (rc)
		goto err;
	if (res) {
		res->rows = w->meta.rows;
		res->erased = w->meta.erased;
		res->blocks = w->meta.blocks;
		res->raw_bytes = w->meta.raw_bytes;
		res->file_bytes = w->meta.file_bytes;
		res->checksum = sum;
	}
	return 0;
err:
	w->err = rc;
	return rc;
}

void emb_snap_writer_destroy(struct emb_snap_writer *w)
{
	if (!w)
		return;
	writer_join(w);
	io_stop(w);
	pthread_cond_destroy(&w->io_cond);
	pthread_mutex_destroy(&w->io_lock);
	if (w->fd >= 0)
		close(w->fd);
	if (w->created && !w->done)
		unlink(w->tmp);
	for (uint32_t g = 0; g < NGROUPS; g++) {
		free(w->groups[g].ids);
		free(w->groups[g].meta);
		free(w->groups[g].rows);
	}
	for (int k = 0; k < NJOBS; k++)
		free(w->jobs[k].raw);
	if (w->xxh)
		XXH3_freeState(w->xxh);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w->slot_rows);
	free(w->comp);
	free(w->stages[0]);
	free(w->stages[1]);
	free(w->page0);
	free(w->plane);
	free(w->tmp);
	free(w->path);
	free(w);
}

/* ---- reader ---- */

struct emb_snap_reader {
	struct emb_snap_meta meta;	/* decoded header */
	uint8_t hdr[EMB_SNAP_HDR_SIZE]; /* raw header, for the file sum */
	int fd;				/* open file */
	uint32_t flags;			/* EMB_SNAP_READ_* */
	uint64_t pos;			/* file offset of the next block */
	uint64_t end;			/* file offset of the trailer */
	uint64_t blocks;		/* blocks read */
	uint64_t rows;			/* rows read */
	uint64_t erased;		/* removed ids read (deltas) */
	uint64_t raw_bytes;		/* raw bytes read */
	uint64_t checksum;		/* the trailer's, once verified */
	bool at_end;			/* trailer verified */
	uint32_t *slot_rows;		/* rows seen per slot */
	uint8_t *stored;		/* one block as stored */
	uint8_t *raw;			/* one block decompressed */
	uint8_t *plane;			/* unshuffled floats */
	size_t stored_cap;		/* bytes of stored */
	size_t raw_cap;			/* bytes of raw */
	size_t plane_cap;		/* bytes of plane */
	XXH3_state_t *xxh;		/* file checksum so far */
};

int emb_snap_reader_open(const char *path, uint32_t flags,
			 struct emb_snap_reader **out)
{
	struct emb_snap_reader *r;
	struct stat st;
	int rc;

	if (!path || !out)
		return EMB_EBADARG;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->flags = flags;
	r->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0) {
		rc = -errno;
		goto err;
	}
	if (fstat(r->fd, &st) != 0) {
		rc = -errno;
		goto err;
	}
	rc = read_all(r->fd, r->hdr, sizeof(r->hdr));
	if (rc)
		goto err;
	rc = hdr_decode(r->hdr, &r->meta);
	if (rc)
		goto err;
	if ((uint64_t)st.st_size < r->meta.file_bytes) {
		rc = EMB_ETRUNCATED;
		goto err;
	}
	if ((uint64_t)st.st_size > r->meta.file_bytes) {
		rc = EMB_EDUMPFORMAT;
		goto err;
	}
	/* Read once, front to back: a larger read-ahead window. (Reading
	 * with O_DIRECT and one read in flight was slower than this on a
	 * virtio disk: the kernel keeps several reads in flight.) */
	(void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	r->pos = EMB_SNAP_HDR_SIZE;
	r->end = r->meta.file_bytes - EMB_SNAP_TRAILER_SIZE;
	r->slot_rows = calloc(EMB_NSLOTS, sizeof(*r->slot_rows));
	r->xxh = XXH3_createState();
	if (!r->slot_rows || !r->xxh) {
		rc = -ENOMEM;
		goto err;
	}
	XXH3_64bits_reset(r->xxh);
	*out = r;
	return 0;
err:
	emb_snap_reader_close(r);
	return rc;
}

void emb_snap_reader_close(struct emb_snap_reader *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	if (r->xxh)
		XXH3_freeState(r->xxh);
	free(r->slot_rows);
	free(r->stored);
	free(r->raw);
	free(r->plane);
	free(r);
}

const struct emb_snap_meta *
emb_snap_reader_meta(const struct emb_snap_reader *r)
{
	return &r->meta;
}

uint64_t emb_snap_reader_checksum(const struct emb_snap_reader *r)
{
	return r->checksum;
}

static int grow(uint8_t **buf, size_t *cap, size_t want)
{
	uint8_t *p;

	if (*cap >= want)
		return 0;
	p = realloc(*buf, want);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = want;
	return 0;
}

static int read_trailer(struct emb_snap_reader *r)
{
	uint8_t *tr;
	uint64_t sum = 0;
	int rc;

	rc = grow(&r->stored, &r->stored_cap, EMB_SNAP_TRAILER_SIZE);
	if (rc)
		return rc;
	tr = r->stored;
	rc = read_all(r->fd, tr, EMB_SNAP_TRAILER_SIZE);
	if (rc)
		return rc;
	XXH3_64bits_update(r->xxh, tr, EMB_SNAP_TRAILER_SIZE - 8);
	XXH3_64bits_update(r->xxh, r->hdr, sizeof(r->hdr));
	if (emb_le64_load(tr + EMB_SNAP_TRAILER_SIZE - 8) !=
	    XXH3_64bits_digest(r->xxh))
		return EMB_EBADDUMP;
	/* Covered by the checksum now, so a mismatch is a writer bug or a
	 * forged file, not bit rot: still refuse it. */
	if (emb_le32_load(tr) != TRAILER_MAGIC ||
	    emb_le64_load(tr + 8) != r->rows ||
	    emb_le64_load(tr + 16) != r->blocks ||
	    emb_le64_load(tr + 24) != r->raw_bytes || r->rows != r->meta.rows ||
	    r->blocks != r->meta.blocks || r->raw_bytes != r->meta.raw_bytes ||
	    r->erased != r->meta.erased)
		return EMB_EBADDUMP;
	/* Per-slot counts need the ids: without decoding, the trailer's
	 * table is only summed (the file checksum covers it anyway). */
	for (uint32_t s = 0; s < EMB_NSLOTS; s++) {
		uint32_t k = emb_le32_load(tr + 32 + 4 * s);

		if (!(r->flags & EMB_SNAP_READ_VERIFY_ONLY) &&
		    k != r->slot_rows[s])
			return EMB_EBADDUMP;
		sum += k;
	}
	if (sum != r->rows)
		return EMB_EBADDUMP;
	r->checksum = emb_le64_load(tr + EMB_SNAP_TRAILER_SIZE - 8);
	r->at_end = true;
	return 0;
}

int emb_snap_reader_next(struct emb_snap_reader *r, struct emb_snap_block *b)
{
	uint8_t h[EMB_SNAP_BLOCK_HDR];
	uint32_t n, first, last, raw_len, clen, bflags, rf = r->meta.row_floats;
	const uint64_t *ids;
	uint8_t *floats;
	bool erased;
	int rc;

again:
	memset(b, 0, sizeof(*b));
	if (r->at_end)
		return 0;
	if (r->pos == r->end)
		return read_trailer(r);
	if (r->end - r->pos < EMB_SNAP_BLOCK_HDR)
		return EMB_EBADDUMP;
	rc = read_all(r->fd, h, sizeof(h));
	if (rc)
		return rc;
	n = emb_le32_load(h + 4);
	first = emb_le32_load(h + 8);
	last = emb_le32_load(h + 12);
	raw_len = emb_le32_load(h + 16);
	clen = emb_le32_load(h + 20);
	bflags = emb_le32_load(h + 24);
	erased = bflags & EMB_SNAP_BF_ERASED;
	/* Sizes are checked before the checksum so that a flipped length
	 * cannot make us allocate or read absurd amounts. */
	if (emb_le32_load(h) != BLOCK_MAGIC || n == 0 ||
	    raw_len > EMB_SNAP_BLOCK_MAX ||
	    (uint64_t)raw_len != n * (erased ? 8 : raw_row_bytes(rf)) ||
	    clen > (uint32_t)LZ4_compressBound((int)raw_len) ||
	    clen > r->end - r->pos - EMB_SNAP_BLOCK_HDR)
		return EMB_EBADDUMP;
	rc = grow(&r->stored, &r->stored_cap, clen);
	if (rc)
		return rc;
	rc = read_all(r->fd, r->stored, clen);
	if (rc)
		return rc;
	if (emb_le64_load(h + 40) !=
	    XXH3_64bits_withSeed(r->stored, clen, XXH3_64bits(h, 40)))
		return EMB_EBADDUMP;
	if ((bflags & ~(EMB_SNAP_BF_RAW | EMB_SNAP_BF_ERASED)) ||
	    emb_le32_load(h + 28) != 0 ||
	    emb_le64_load(h + 32) != r->blocks || first > last ||
	    last >= EMB_NSLOTS ||
	    (!erased &&
	     first / EMB_SNAP_GROUP_SLOTS != last / EMB_SNAP_GROUP_SLOTS) ||
	    ((bflags & EMB_SNAP_BF_RAW) && clen != raw_len))
		return EMB_EBADDUMP;
	/* Removals only in deltas, all before the first row. */
	if (erased && (!(r->meta.flags & EMB_SNAP_F_DELTA) || r->rows ||
		       first != 0 || last != EMB_NSLOTS - 1))
		return EMB_EBADDUMP;
	XXH3_64bits_update(r->xxh, h, sizeof(h));
	XXH3_64bits_update(r->xxh, r->stored, clen);
	r->pos += EMB_SNAP_BLOCK_HDR + (uint64_t)clen;
	r->blocks++;
	if (erased)
		r->erased += n;
	else
		r->rows += n;
	r->raw_bytes += raw_len;
	b->n = n;
	b->erased = erased;
	b->slot_first = first;
	b->slot_last = last;
	b->stored_bytes = EMB_SNAP_BLOCK_HDR + (uint64_t)clen;
	if (erased && !(r->flags & EMB_SNAP_READ_ERASED))
		goto again;
	if (r->flags & EMB_SNAP_READ_VERIFY_ONLY)
		return (int)n;

	rc = grow(&r->raw, &r->raw_cap, raw_len);
	if (!rc && (r->meta.flags & EMB_SNAP_F_SHUFFLE))
		rc = grow(&r->plane, &r->plane_cap, raw_len);
	if (rc)
		return rc;
	if (bflags & EMB_SNAP_BF_RAW) {
		/* Stored as is: decode in place, one copy fewer. */
		uint8_t *t = r->raw;
		size_t tc = r->raw_cap;

		r->raw = r->stored;
		r->raw_cap = r->stored_cap;
		r->stored = t;
		r->stored_cap = tc;
	} else if (LZ4_decompress_safe((const char *)r->stored, (char *)r->raw,
				       (int)clen,
				       (int)raw_len) != (int)raw_len) {
		return EMB_EBADDUMP;
	}
	ids = (const uint64_t *)(void *)r->raw;
	if (erased) {
		b->ids = ids;
		return (int)n;
	}
	floats = r->raw + 16ull * n;
	if (r->meta.flags & EMB_SNAP_F_SHUFFLE) {
		unshuffle4(r->plane, floats, (size_t)n * rf);
		memcpy(floats, r->plane, 4ull * n * rf);
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = emb_id_slot(ids[i]);

		if (s < first || s > last || (i && s < emb_id_slot(ids[i - 1])))
			return EMB_EBADDUMP;
		r->slot_rows[s]++;
	}
	b->ids = ids;
	b->last_step = (const uint32_t *)(void *)(r->raw + 8ull * n);
	b->count = b->last_step + n;
	b->rows = (const float *)(void *)floats;
	return (int)n;
}

static int verify(const char *path, uint32_t flags, struct emb_snap_meta *meta,
		  uint64_t *checksum)
{
	struct emb_snap_reader *r;
	struct emb_snap_block b;
	int rc;

	rc = emb_snap_reader_open(path, flags, &r);
	if (rc)
		return rc;
	while ((rc = emb_snap_reader_next(r, &b)) > 0)
		;
	if (!rc && meta)
		*meta = r->meta;
	if (!rc && checksum)
		*checksum = r->checksum;
	emb_snap_reader_close(r);
	return rc;
}

int emb_snap_verify(const char *path, uint32_t flags,
		    struct emb_snap_meta *meta, uint64_t *checksum)
{
	return verify(path, flags, meta, checksum);
}

/* ---- tables ---- */

int emb_snap_write_table(struct emb_table *t, const char *path,
			 const struct emb_snap_write_opts *opts,
			 struct emb_snap_result *res)
{
	struct emb_snap_writer *w = NULL;
	struct emb_table_iter *it = NULL;
	struct emb_snap_meta m;
	struct emb_row_meta *meta = NULL;
	uint64_t *ids = NULL;
	float *rows = NULL;
	int rc, got;

	emb_snap_meta_from_table(t, &m);
	ids = malloc(ITER_ROWS * sizeof(*ids));
	meta = malloc(ITER_ROWS * sizeof(*meta));
	rows = malloc((size_t)ITER_ROWS * m.row_floats * sizeof(float));
	if (!ids || !meta || !rows) {
		rc = -ENOMEM;
		goto out;
	}
	rc = emb_table_iter_create(t, &it);
	if (rc)
		goto out;
	rc = emb_snap_writer_create(path, &m, opts, &w);
	if (rc)
		goto out;
	while ((got = emb_table_iter_next(it, ids, rows, meta, ITER_ROWS)) >
	       0) {
		rc = emb_snap_writer_add(w, ids, rows, meta, (uint32_t)got);
		if (rc)
			goto out;
	}
	rc = got < 0 ? got : emb_snap_writer_finish(w, res);
out:
	emb_snap_writer_destroy(w);
	emb_table_iter_destroy(it);
	free(rows);
	free(meta);
	free(ids);
	return rc;
}

int emb_snap_write_ckpt(struct emb_table *t, const char *path, bool delta,
			uint64_t base_id, uint64_t prev_id,
			const struct emb_snap_write_opts *opts,
			struct emb_snap_result *res)
{
	struct emb_snap_writer *w = NULL;
	struct emb_table_ckpt *c = NULL;
	struct emb_snap_meta m;
	struct emb_row_meta *meta = NULL;
	const uint64_t *gone;
	uint64_t *ids = NULL, ngone;
	float *rows = NULL;
	int rc, got;

	emb_snap_meta_from_table(t, &m);
	if (delta) {
		m.flags = EMB_SNAP_F_DELTA;
		m.base_id = base_id;
		m.prev_id = prev_id;
	}
	ids = malloc(ITER_ROWS * sizeof(*ids));
	meta = malloc(ITER_ROWS * sizeof(*meta));
	rows = malloc((size_t)ITER_ROWS * m.row_floats * sizeof(float));
	if (!ids || !meta || !rows) {
		rc = -ENOMEM;
		goto out;
	}
	/* The file first: a walk begun takes the table's changes. */
	rc = emb_snap_writer_create(path, &m, opts, &w);
	if (rc)
		goto out;
	rc = emb_table_ckpt_begin(t, delta, &c);
	if (rc)
		goto out;
	ngone = emb_table_ckpt_erased(c, &gone);
	if (delta) {
		rc = emb_snap_writer_erase(w, gone, ngone);
		if (rc)
			goto out;
	}
	while ((got = emb_table_ckpt_next(c, ids, rows, meta, ITER_ROWS)) >
	       0) {
		rc = emb_snap_writer_add(w, ids, rows, meta, (uint32_t)got);
		if (rc)
			goto out;
	}
	rc = got < 0 ? got : emb_snap_writer_finish(w, res);
out:
	emb_table_ckpt_end(c);
	emb_snap_writer_destroy(w);
	free(rows);
	free(meta);
	free(ids);
	return rc;
}

/* Rows a load set aside as not finite: how many, and the first ids. */
struct set_aside {
	uint64_t n;	  /* rows */
	uint64_t ids[8];  /* the first min(n, 8) of them */
};

/*
 * Assigns the rows of block b (meta filled) to t, less any row with a
 * float (weights or optimizer state) that is NaN or infinite: an older
 * version could write those, and refusing the block would refuse the
 * whole table (and the server's restart) for one row. Such a row is left
 * out, and the id removed (a delta's row replaces the older links' one),
 * so it is absent and made afresh from the initializer when next used;
 * counted in sa. 0 or as emb_table_assign() / emb_table_erase().
 */
static int assign_finite(struct emb_table *t, const struct emb_snap_block *b,
			 const struct emb_row_meta *meta, struct set_aside *sa)
{
	struct emb_table_opts o;
	uint32_t rf = emb_table_row_floats(t), from = 0;
	int rc = 0;

	emb_table_get_opts(t, &o);
	/* Adam's step count is a uint32 in a float's bits, and a compact
	 * row's weights are not floats: both are checked row by row. */
	if (o.row_format == EMB_ROWFMT_FP32 &&
	    o.optim.kind != EMB_OPTIM_ADAM &&
	    emb_floats_finite(b->rows, (size_t)b->n * rf))
		return emb_table_assign(t, b->ids, b->n, b->rows, true, meta);
	for (uint32_t i = 0; i <= b->n && !rc; i++) {
		if (i < b->n &&
		    emb_table_row_finite(t, b->rows + (size_t)i * rf))
			continue;
		/* Rows from..i are finite: assign them as one run. */
		if (i > from)
			rc = emb_table_assign(t, b->ids + from, i - from,
					      b->rows + (size_t)from * rf, true,
					      meta + from);
		if (i < b->n && !rc) {
			int e = emb_table_erase(t, &b->ids[i], 1);

			rc = e < 0 ? e : 0;
			if (sa->n < 8)
				sa->ids[sa->n] = b->ids[i];
			sa->n++;
		}
		from = i + 1;
	}
	return rc;
}

/* Loads every block of an opened reader into t (a delta's removals are
 * its first blocks, so they go before its rows). */
static int64_t load_rows(struct emb_snap_reader *r, struct emb_table *t)
{
	struct emb_row_meta *meta = NULL;
	struct set_aside sa = {0};
	struct emb_snap_block b;
	uint32_t cap = 0;
	int64_t total = 0;
	int rc;

	while ((rc = emb_snap_reader_next(r, &b)) > 0) {
		uint64_t aside = sa.n;

		if (b.erased) {
			rc = emb_table_erase(t, b.ids, b.n);
			if (rc < 0)
				break;
			continue;
		}
		if (b.n > cap) {
			struct emb_row_meta *p =
			    realloc(meta, (size_t)b.n * sizeof(*meta));

			if (!p) {
				rc = -ENOMEM;
				break;
			}
			meta = p;
			cap = b.n;
		}
		for (uint32_t i = 0; i < b.n; i++) {
			meta[i].last_step = b.last_step[i];
			meta[i].count = b.count[i];
		}
		rc = assign_finite(t, &b, meta, &sa);
		if (rc)
			break;
		total += b.n - (int64_t)(sa.n - aside);
	}
	free(meta);
	if (sa.n) {
		char list[8 * 21 + 1];
		size_t at = 0;

		for (uint64_t i = 0; i < sa.n && i < 8; i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at,
					       "%s%llu", i ? "," : "",
					       (unsigned long long)sa.ids[i]);
		emb_log(EMB_LOG_WARN,
			"table %s: %llu rows with a NaN or infinite value set "
			"aside on load (made afresh when next used); ids %s%s",
			emb_table_name(t), (unsigned long long)sa.n, list,
			sa.n > 8 ? ",..." : "");
		emb__table_count_nonfinite(t, sa.n);
	}
	return rc < 0 ? rc : total;
}

int64_t emb_snap_load_table(const char *path, struct emb_table *t)
{
	struct emb_snap_reader *r;
	struct emb_snap_meta m;
	struct emb_table_opts o;
	int64_t rc;

	/* Verify everything before the first row changes. */
	rc = verify(path, EMB_SNAP_READ_VERIFY_ONLY, &m, NULL);
	if (rc)
		return rc;
	emb_table_get_opts(t, &o);
	rc = emb_snap_meta_check(&m, &o);
	if (rc)
		return rc;
	rc = emb_snap_reader_open(path, EMB_SNAP_READ_ERASED, &r);
	if (rc)
		return rc;
	rc = load_rows(r, t);
	emb_snap_reader_close(r);
	return rc;
}

int emb_snap_load_new(const char *path, const struct emb_table_opts *base,
		      struct emb_table **out)
{
	struct emb_snap_reader *r;
	struct emb_table_opts o;
	struct emb_table *t = NULL;
	int64_t n;
	int rc;

	rc = emb_snap_reader_open(path, 0, &r);
	if (rc)
		return rc;
	emb_snap_meta_to_opts(&r->meta, &o);
	if (base) {
		o.nshards = base->nshards;
		o.mem_limit = base->mem_limit;
		o.budget = base->budget;
	}
	rc = emb_table_create(&o, &t);
	if (rc)
		goto out;
	n = load_rows(r, t);
	if (n < 0) {
		rc = (int)n;
		emb_table_destroy(t);
		goto out;
	}
	*out = t;
out:
	emb_snap_reader_close(r);
	return rc;
}

/* ---- manifest ---- */

static bool name_ok(const char *s)
{
	if (!*s || strchr(s, '/'))
		return false;
	for (; *s; s++)
		if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
			return false;
	return true;
}

int emb_snap_manifest_write(const char *dir, const struct emb_snap_entry *e,
			    uint32_t n)
{
	char path[EMB_SNAP_PATH_MAX], tmp[EMB_SNAP_PATH_MAX];
	char *text = NULL, line[512];
	size_t len = 0, cap = 64 + (size_t)n * 512;
	int fd = -1, rc;

	for (uint32_t i = 0; i < n; i++)
		if (!name_ok(e[i].file) || !name_ok(e[i].table))
			return EMB_EBADARG;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
			     EMB_SNAP_MANIFEST) >= sizeof(path) ||
	    (size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path,
			     (long)getpid()) >= sizeof(tmp))
		return EMB_EBADARG;
	text = malloc(cap);
	if (!text)
		return -ENOMEM;
	len = (size_t)snprintf(text, cap, "embstore-manifest %u\nfiles %u\n",
			       EMB_SNAP_MANIFEST_VERSION, n);
	for (uint32_t i = 0; i < n; i++) {
		int k = snprintf(line, sizeof(line),
				 "file %s %s %u %u %llu %llu %016llx",
				 e[i].file, e[i].table, e[i].part, e[i].nparts,
				 (unsigned long long)e[i].rows,
				 (unsigned long long)e[i].bytes,
				 (unsigned long long)e[i].checksum);

		/* Only consistent dumps carry the field: other manifests
		 * stay readable by older readers. */
		if (e[i].consistent)
			k += snprintf(line + k, sizeof(line) - (size_t)k,
				      " consistent-at-step=%llu",
				      (unsigned long long)e[i].step);
		line[k++] = '\n';

		memcpy(text + len, line, (size_t)k);
		len += (size_t)k;
	}
	len += (size_t)snprintf(text + len, cap - len, "end %016llx\n",
				(unsigned long long)XXH3_64bits(text, len));
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	rc = write_all(fd, text, len);
	if (!rc && fsync(fd) != 0)
		rc = -errno;
	if (close(fd) != 0 && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path) != 0)
		rc = -errno;
	if (rc)
		unlink(tmp);
	else
		rc = fsync_parent(path);
out:
	free(text);
	return rc;
}

static bool has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && strcmp(s + a - b, suf) == 0;
}

static int manifest_parse(char *text, size_t len, struct emb_snap_entry **out,
			  uint32_t *nout)
{
	struct emb_snap_entry *e = NULL;
	unsigned long long sum;
	unsigned ver, n;
	char *p, *end_line;
	int used;

	end_line = NULL;
	/* The last line is "end HEX", the checksum of everything before. */
	if (len < 2 || text[len - 1] != '\n')
		return EMB_EMANIFEST;
	text[len - 1] = '\0';
	end_line = strrchr(text, '\n');
	if (!end_line)
		return EMB_EMANIFEST;
	end_line++;
	if (sscanf(end_line, "end %16llx%n", &sum, &used) != 1 ||
	    end_line[used] != '\0' ||
	    sum != XXH3_64bits(text, (size_t)(end_line - text)))
		return EMB_EMANIFEST;
	end_line[-1] = '\0';
	if (sscanf(text, "embstore-manifest %u\nfiles %u\n%n", &ver, &n,
		   &used) != 2 ||
	    ver != EMB_SNAP_MANIFEST_VERSION || n > 1u << 20)
		return EMB_EMANIFEST;
	e = calloc(n ? n : 1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	p = text + used;
	for (unsigned i = 0; i < n; i++) {
		unsigned long long rows, bytes, ck;
		char file[256], table[EMB_NAME_MAX + 1];

		unsigned long long step;
		int more = 0;

		if (sscanf(p, "file %255s %63s %u %u %llu %llu %16llx%n", file,
			   table, &e[i].part, &e[i].nparts, &rows, &bytes, &ck,
			   &used) == 7 &&
		    p[used] == ' ' &&
		    sscanf(p + used, " consistent-at-step=%llu%n", &step,
			   &more) == 1 &&
		    more > 0) {
			e[i].consistent = true;
			e[i].step = step;
			used += more;
		}
		if (sscanf(p, "file %255s %63s %u %u %llu %llu %16llx", file,
			   table, &e[i].part, &e[i].nparts, &rows, &bytes,
			   &ck) != 7 ||
		    (p[used] != '\n' && p[used] != '\0') || e[i].nparts == 0 ||
		    e[i].part >= e[i].nparts || !name_ok(file) ||
		    strcmp(file, EMB_SNAP_MANIFEST) == 0) {
			free(e);
			return EMB_EMANIFEST;
		}
		snprintf(e[i].file, sizeof(e[i].file), "%s", file);
		snprintf(e[i].table, sizeof(e[i].table), "%s", table);
		e[i].rows = rows;
		e[i].bytes = bytes;
		e[i].checksum = ck;
		p += used + (p[used] == '\n');
	}
	if (*p != '\0') {
		free(e);
		return EMB_EMANIFEST;
	}
	*out = e;
	*nout = n;
	return 0;
}

int emb_snap_manifest_read(const char *dir, struct emb_snap_entry **out,
			   uint32_t *nout, char *bad_file)
{
	char path[EMB_SNAP_PATH_MAX];
	struct emb_snap_entry *e = NULL;
	struct dirent *de;
	struct stat st;
	char *text = NULL;
	uint32_t n = 0;
	DIR *d = NULL;
	int fd, rc;

	if (bad_file)
		snprintf(bad_file, EMB_SNAP_PATH_MAX, "%s", EMB_SNAP_MANIFEST);
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
			     EMB_SNAP_MANIFEST) >= sizeof(path))
		return EMB_EBADARG;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) != 0 || st.st_size > (64 << 20)) {
		close(fd);
		return EMB_EMANIFEST;
	}
	text = malloc((size_t)st.st_size + 1);
	if (!text) {
		close(fd);
		return -ENOMEM;
	}
	rc = read_all(fd, text, (size_t)st.st_size);
	close(fd);
	if (rc)
		goto err;
	text[st.st_size] = '\0';
	rc = manifest_parse(text, (size_t)st.st_size, &e, &n);
	if (rc)
		goto err;
	for (uint32_t i = 0; i < n; i++) {
		if (bad_file)
			snprintf(bad_file, EMB_SNAP_PATH_MAX, "%s", e[i].file);
		snprintf(path, sizeof(path), "%s/%s", dir, e[i].file);
		if (stat(path, &st) != 0) {
			rc = errno == ENOENT ? EMB_EMANIFEST : -errno;
			goto err;
		}
		if ((uint64_t)st.st_size != e[i].bytes) {
			rc = (uint64_t)st.st_size < e[i].bytes ? EMB_ETRUNCATED
							       : EMB_EMANIFEST;
			goto err;
		}
	}
	d = opendir(dir);
	if (!d) {
		rc = -errno;
		goto err;
	}
	while ((de = readdir(d)) != NULL) {
		bool listed = false;

		if (!has_suffix(de->d_name, ".embs"))
			continue;
		for (uint32_t i = 0; i < n && !listed; i++)
			listed = strcmp(e[i].file, de->d_name) == 0;
		if (!listed) {
			if (bad_file)
				snprintf(bad_file, EMB_SNAP_PATH_MAX, "%s",
					 de->d_name);
			rc = EMB_EMANIFEST;
			goto err;
		}
	}
	closedir(d);
	free(text);
	*out = e;
	*nout = n;
	return 0;
err:
	if (d)
		closedir(d);
	free(e);
	free(text);
	return rc;
}
