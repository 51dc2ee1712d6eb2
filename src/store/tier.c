/*
 * src/store/tier.c - a table's second tier: cold rows in a file on a
 * device (docs/store.md, "The device tier").
 *
 * A tiered table (opts.tier_path) keeps its hot rows in slabs as any
 * table does, within its memory limit, and its cold rows in one file
 * opened with O_DIRECT, so that the page cache holds none of them and
 * the limit is the table's real DRAM. Nothing of a row is lost between
 * the tiers: a row is in exactly one of them.
 *
 * The file is a sequence of 4 KiB blocks. A block belongs to one shard
 * and holds up to per_block whole records, byte for byte as they were in
 * the slab (id, access meta, floats); a record never spans blocks.
 *
 * Per shard, under the shard's lock:
 *   - the cold map: open addressing over 64-bit entries, 0 = empty,
 *     otherwise the top 32 bits of the id hash (its home position comes
 *     from them, so a backward-shift delete can find it) and the row's
 *     location + 1 in the low 32: its shard-local block number << 8 |
 *     its slot in the block. 8 bytes a cold row at most 80 % full: the
 *     id itself is only on the device and is checked once the block is
 *     read (two ids share 32 hash bits 1 time in 2^32 per probe; the
 *     lookup then reads on);
 *   - the shard's blocks: file block number, live records, and a
 *     generation that changes whenever the block is written, so a row
 *     read ahead of its promotion (emb__tier_fetch) is used only if its
 *     block still holds what was read.
 * Under the tier's own lock: the file's free blocks and its end.
 *
 * Demotion happens only at the start of a shard's group in a batch
 * (emb__tier_room), never in the middle: the batch loops keep pointers to
 * records they resolved ahead, which a demotion would free. Promotion
 * (emb__tier_take) happens where those loops find an id absent: it
 * inserts the record into a free record that emb__tier_room set aside.
 * Eviction (lifecycle.c's sweep, after a group) drops cold rows by their
 * blocks ("eviction of cold rows" below), and a demotion evicts rather
 * than writes a row the policy condemns.
 *
 * Threads: every function here but open/close/fetch/stats runs under the
 * shard lock of the shard it names; fetch runs with no lock held.
 */
#include "store/store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"

#define TIER_BLOCK	   4096u
#define MAP_MIN		   64u
#define DEMOTE_MIN_BLOCKS  16u	/* a demotion writes at least this many */
#define DEMOTE_SCAN	   4u	/* candidates looked at per row demoted */
#define RING_DEPTH	   64u	/* reads in flight per fetch */
#define BUF_BLOCKS_MAX	   8192u /* a fetch reads at most this many blocks
				    (32 MiB; a batch's ids are fewer) */

struct tier_shard {
	uint64_t *map;	      /* cold map, map_n entries */
	uint32_t map_n;	      /* 0 or a power of two */
	uint32_t map_used;    /* cold rows of this shard */
	uint32_t *blk_file;   /* per shard block: its file block */
	uint16_t *blk_live;   /* per shard block: live records in it */
	uint32_t *blk_gen;    /* per shard block: bumped at each write */
	uint64_t *blk_born;   /* per shard block: the tier's block clock
				 when it was last written (walks) */
	uint32_t *blk_tick;   /* per shard block: the newest access of its
				 rows, in access clock ticks (eviction) */
	uint32_t nblk;	      /* shard blocks ever made */
	uint32_t blk_cap;     /* room in the three arrays */
	uint32_t *blk_spare;  /* shard blocks whose file block went back */
	uint32_t nspare;
	uint32_t spare_cap;
	uint32_t hand;	      /* next record the demotion hand looks at */
	uint32_t *ghost;      /* ghost_n fingerprints of cold ids a pull
				 read once lately, 0 = none */
	uint64_t *blk_mark;   /* per shard block: 2 * mark_words words, a
				 bit per slot, the checkpoint's mark then
				 a move's (walk section) */
	struct emb_tier_walk *walks; /* walks inside this shard */
	uint32_t ev_hand;     /* next block the eviction hand looks at */
	uint32_t l2_at;	      /* the min_l2 pass: next block to check */
	uint32_t l2_end;      /* blocks it checks end here */
	uint64_t l2_born;     /* it checks blocks born at or before this */
} __attribute__((aligned(64)));

/*
 * A pull of a cold row brings it into DRAM only the second time it is
 * read in a while: the first read serves it from the device and leaves a
 * fingerprint here. Most cold reads of a skewed stream are its tail, ids
 * that come once; promoting each would push out a row that comes again
 * (the admission idea of TinyLFU, for the DRAM tier). Direct-mapped, so a
 * fingerprint lasts until another id lands on its slot. Pushes, which
 * write, always promote.
 */
/*
 * The table's fingerprints take 1/256 of its memory limit, at least 1024
 * a shard: a fingerprint must outlive the reads of other cold ids until
 * its id comes again. At 1M rows of dim 64, half on the device, Zipf
 * 1.05, 20 s warm: 1024 a shard kept rows coming every ~160 batches out
 * of DRAM (412 device reads a batch); 16384 a shard (a 1 GiB limit's
 * share), 252 reads and 407k rows/s; promoting at every read, 216 reads
 * but 263k rows/s, its demotions writing all the time.
 */
#define GHOST_MIN 1024u

/* The step history: a level per power of two, HIST_LEN samples each. */
#define HIST_LEVELS 32u
#define HIST_LEN    16u

struct emb_tier {
	int fd;
	char *path;
	uint64_t max_blocks;	/* file blocks allowed; 0 = no bound */
	uint32_t per_block;	/* records in a block */
	uint32_t mark_words;	/* words of one kind of mark a block */
	uint32_t ghost_n;	/* fingerprints a shard (power of two) */
	uint32_t rec;		/* bytes of a record (the table's row_bytes) */
	pthread_mutex_t lock;	/* guards the four fields below */
	uint32_t file_blocks;	/* blocks the file has (its end) */
	uint32_t *free_blocks;	/* file blocks no shard uses */
	uint32_t nfree;
	uint32_t free_cap;
	uint64_t clock;		/* access clock: one tick per batch */
	uint64_t blk_clock;	/* one tick per block written (atomic) */
	bool warned_short;	/* short_of() said so once (atomic) */
	/* Counters, relaxed atomics. */
	uint64_t rows_cold;
	uint64_t demoted;
	uint64_t promoted;
	uint64_t served_cold;	/* pulled rows served without promotion */
	uint64_t blocks_read;
	uint64_t blocks_written;
	uint64_t read_ns;	/* time spent waiting for reads */
	uint64_t map_bytes;	/* cold maps and block arrays, charged */
	struct tier_shard *sh;	/* nshards */
	/* Step history (emb__tier_step): hist[k][j] holds a table step S, a
	 * multiple of 2^k, in its top 32 bits and the access clock read just
	 * before S began in its low 32; atomics. 0 = (step 0, clock 0). */
	uint64_t hist[HIST_LEVELS][HIST_LEN];
};

static void charge(struct emb_table *t, int64_t n);

static const struct emb_tier_view_ops view_ops = {
    .enter = emb__tier_view_enter,
    .rest = emb__tier_walk_rest,
    .done = emb__tier_walk_done,
    .leave = emb__tier_walk_leave,
    .limit = emb__tier_limit,
};

/* ---- per-thread buffers and ring ---- */

/*
 * Each thread that demotes or reads keeps one 4 KiB-aligned buffer and
 * one io_uring, made on first use and freed when the thread exits, as
 * the store's other scratch memory is (scratch.c): the callers are a
 * server's loop threads or a trainer's threads, each running one batch
 * at a time.
 */
struct tier_tls {
	void *buf;	/* a demotion's blocks, or one block read */
	size_t buf_bytes;
	void *pre;	/* a batch's read-ahead */
	size_t pre_bytes;
	struct io_uring ring;
	bool have_ring;
};

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p)
{
	struct tier_tls *x = p;

	if (!x)
		return;
	free(x->buf);
	free(x->pre);
	if (x->have_ring)
		io_uring_queue_exit(&x->ring);
	free(x);
}

static void tls_init(void)
{
	(void)pthread_key_create(&tls_key, tls_free);
}

static struct tier_tls *tls_get(void)
{
	struct tier_tls *x;

	(void)pthread_once(&tls_once, tls_init);
	x = pthread_getspecific(tls_key);
	if (x)
		return x;
	x = calloc(1, sizeof(*x));
	if (x && pthread_setspecific(tls_key, x)) {
		free(x);
		x = NULL;
	}
	return x;
}

/* Grows *buf (4 KiB aligned, *have bytes) to at least bytes; NULL when
 * memory is out. Kept for the thread's next batches, as scratch.c's are:
 * a read-ahead of thousands of blocks would otherwise map and fault in
 * megabytes of fresh pages every batch. */
static void *grow(void **buf, size_t *have, size_t bytes)
{
	void *p;

	if (*have >= bytes)
		return *buf;
	if (posix_memalign(&p, TIER_BLOCK, bytes))
		return NULL;
	free(*buf);
	*buf = p;
	*have = bytes;
	return p;
}

/* The thread's buffer for demotions and single reads. */
static void *tls_buf(size_t bytes)
{
	struct tier_tls *x = tls_get();

	return x ? grow(&x->buf, &x->buf_bytes, bytes) : NULL;
}

/* The thread's buffer for a batch's read-ahead. */
static void *tls_pre(size_t bytes)
{
	struct tier_tls *x = tls_get();

	return x ? grow(&x->pre, &x->pre_bytes, bytes) : NULL;
}

static struct io_uring *tls_ring(void)
{
	struct tier_tls *x = tls_get();

	if (!x)
		return NULL;
	if (!x->have_ring) {
		if (io_uring_queue_init(RING_DEPTH, &x->ring, 0) < 0)
			return NULL;
		x->have_ring = true;
	}
	return &x->ring;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void count(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

/* ---- device I/O ---- */

/* Reads or writes len bytes at file block blk, whole; 0 or -errno. */
static int dev_io(int fd, void *buf, size_t len, uint32_t blk, bool write)
{
	off_t off = (off_t)blk * TIER_BLOCK;
	size_t done = 0;

	while (done < len) {
		ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done,
					   off + (off_t)done)
				  : pread(fd, (char *)buf + done, len - done,
					  off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* read past the end: a lost block */
		done += (size_t)n;
	}
	return 0;
}

/*
 * Reads or writes n whole blocks, buf + i * TIER_BLOCK at file block
 * file[i], all in flight together (up to RING_DEPTH) through the
 * thread's io_uring, or one after another where there is none (a kernel
 * or seccomp profile without it). Waits for all of them; 0 or the first
 * error. *wait_ns gets the time spent.
 */
static int dev_batch(int fd, char *buf, const uint32_t *file, uint32_t n,
		     bool write, uint64_t *wait_ns)
{
	struct io_uring *ring = tls_ring();
	uint32_t sent = 0, done = 0;
	uint64_t t0 = now_ns();
	int rc = 0;

	if (!ring) {
		for (uint32_t i = 0; i < n && !rc; i++)
			rc = dev_io(fd, buf + (size_t)i * TIER_BLOCK,
				    TIER_BLOCK, file[i], write);
		goto out;
	}
	while (done < n && !rc) {
		struct io_uring_cqe *cqe;
		int r;

		while (sent < n && sent - done < RING_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
			char *b = buf + (size_t)sent * TIER_BLOCK;
			uint64_t off = (uint64_t)file[sent] * TIER_BLOCK;

			if (!sqe)
				break;
			if (write)
				io_uring_prep_write(sqe, fd, b, TIER_BLOCK,
						    off);
			else
				io_uring_prep_read(sqe, fd, b, TIER_BLOCK,
						   off);
			sent++;
		}
		r = io_uring_submit_and_wait(ring, 1);
		if (r < 0 && r != -EINTR)
			rc = r;
		while (io_uring_peek_cqe(ring, &cqe) == 0) {
			/* A short transfer of a 4 KiB block at an aligned
			 * offset is an error too: a lost or cut file. */
			if (cqe->res != (int)TIER_BLOCK && !rc)
				rc = cqe->res < 0 ? cqe->res : -EIO;
			io_uring_cqe_seen(ring, cqe);
			done++;
		}
	}
	/* Reap what is still in flight before the buffer can go. */
	while (done < sent) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(ring, &cqe))
			break;
		io_uring_cqe_seen(ring, cqe);
		done++;
	}
out:
	*wait_ns = now_ns() - t0;
	return rc;
}

/* ---- open and close ---- */

int emb__tier_open(struct emb_table *t, const char *path, uint64_t max_bytes)
{
	struct emb_tier *tr;
	int fd, rc;

	if (t->row_bytes > TIER_BLOCK)
		return EMB_EBADARG; /* a record must fit a block */
	tr = calloc(1, sizeof(*tr));
	if (!tr)
		return -ENOMEM;
	tr->path = strdup(path);
	tr->sh = aligned_alloc(64, t->nshards * sizeof(*tr->sh));
	if (!tr->path || !tr->sh) {
		rc = -ENOMEM;
		goto err;
	}
	memset(tr->sh, 0, t->nshards * sizeof(*tr->sh));
	tr->ghost_n = GHOST_MIN;
	while ((uint64_t)tr->ghost_n * 2 * 4 * t->nshards <=
	       emb__tier_limit(t) / 256)
		tr->ghost_n *= 2;
	for (uint32_t i = 0; i < t->nshards; i++) {
		tr->sh[i].ghost = calloc(tr->ghost_n, sizeof(uint32_t));
		if (!tr->sh[i].ghost) {
			rc = -ENOMEM;
			goto err;
		}
	}
	/*
	 * O_DIRECT: cold rows must not sit in the page cache, or the memory
	 * limit would not bound the table's DRAM and the figures would be
	 * the page cache's. A file system that refuses it (tmpfs) gets the
	 * buffered path, with a warning.
	 */
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
	if (fd < 0 && errno == EINVAL) {
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0)
			emb_log(EMB_LOG_WARN, "tier %s: no O_DIRECT on this file "
				     "system; cold rows go through the page "
				     "cache",
				     path);
	}
	if (fd < 0) {
		rc = -errno;
		emb_log(EMB_LOG_ERROR, "tier %s: %s", path, strerror(errno));
		goto err;
	}
	/* Held while the table lives: a file with no lock on it is a dead
	 * process's, which a server may remove (--tier-dir); one locked is
	 * another table's, never truncated under it. */
	if (flock(fd, LOCK_EX | LOCK_NB) || ftruncate(fd, 0)) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		emb_log(EMB_LOG_ERROR, "tier %s: %s", path,
			rc == -EBUSY ? "in use by another table"
				     : strerror(-rc));
		close(fd);
		goto err;
	}
	tr->fd = fd;
	tr->rec = t->row_bytes;
	tr->per_block = TIER_BLOCK / t->row_bytes;
	if (tr->per_block > 256)
		tr->per_block = 256; /* a slot is 8 bits of a location */
	tr->mark_words = (tr->per_block + 63) / 64;
	tr->max_blocks = max_bytes / TIER_BLOCK;
	if (max_bytes && !tr->max_blocks) {
		close(fd);
		unlink(path);
		rc = EMB_EBADARG;
		goto err;
	}
	pthread_mutex_init(&tr->lock, NULL);
	t->tier = tr;
	t->tier_view = &view_ops;
	charge(t, (int64_t)t->nshards * tr->ghost_n * sizeof(uint32_t));
	return 0;

err:
	if (tr->sh)
		for (uint32_t i = 0; i < t->nshards; i++)
			free(tr->sh[i].ghost);
	free(tr->sh);
	free(tr->path);
	free(tr);
	return rc;
}

void emb__tier_close(struct emb_table *t)
{
	struct emb_tier *tr = t->tier;

	if (!tr)
		return;
	for (uint32_t i = 0; i < t->nshards; i++) {
		struct tier_shard *ts = &tr->sh[i];

		free(ts->map);
		free(ts->blk_file);
		free(ts->blk_live);
		free(ts->blk_gen);
		free(ts->blk_spare);
		free(ts->ghost);
		free(ts->blk_mark);
		free(ts->blk_born);
		free(ts->blk_tick);
	}
	emb__mem_charge(t, -(int64_t)tr->map_bytes);
	close(tr->fd);
	/* The tier is scratch: rows outlive a process only through
	 * checkpoints, so nothing may read this file again. */
	unlink(tr->path);
	pthread_mutex_destroy(&tr->lock);
	free(tr->free_blocks);
	free(tr->sh);
	free(tr->path);
	free(tr);
	t->tier = NULL;
}

const char *emb__tier_path(const struct emb_table *t)
{
	return t->tier->path;
}

uint64_t emb__tier_rows_cold(struct emb_table *t)
{
	return __atomic_load_n(&t->tier->rows_cold, __ATOMIC_RELAXED);
}

uint32_t emb__tier_tick(struct emb_table *t)
{
	return (uint32_t)__atomic_add_fetch(&t->tier->clock, 1,
					    __ATOMIC_RELAXED);
}

/*
 * Two clocks: a tiered table's rows keep their last access in the tier's
 * clock, one tick a batch of any kind, because demotion must age rows
 * under pulls alone (a server that only serves); ttl counts table steps
 * (push batches), as on any table. Rather than keep a second stamp per
 * row, the table remembers which tick each step began at: a row last
 * accessed at or before the tick read just before step S began was last
 * accessed before S. Every step is a multiple of 2^k for some levels k;
 * level k keeps the last HIST_LEN such steps, so level k reaches back
 * HIST_LEN * 2^k steps in steps of 2^k, and 32 levels of 16 samples (4
 * KiB a table) answer any ttl to within 2 / HIST_LEN of it, late.
 */
uint32_t emb__tier_step(struct emb_table *t)
{
	struct emb_tier *tr = t->tier;
	/* The tick before the step: any access at or before it happened
	 * while the step was still below S (seq_cst orders the two). */
	uint32_t c0 = (uint32_t)__atomic_load_n(&tr->clock, __ATOMIC_SEQ_CST);
	uint32_t s = (uint32_t)__atomic_add_fetch(&t->step, 1, __ATOMIC_SEQ_CST);

	for (uint32_t k = 0; k < HIST_LEVELS; k++) {
		if (s & ((1u << k) - 1))
			break;
		/* A slower thread of an older step may overwrite a newer
		 * sample: the lookup then misses it and goes coarser, late. */
		__atomic_store_n(&tr->hist[k][(s >> k) % HIST_LEN],
				 (uint64_t)s << 32 | c0, __ATOMIC_RELEASE);
	}
	return s;
}

bool emb__tier_idle_upto(struct emb_table *t, uint32_t idle_steps,
			 uint32_t *upto)
{
	struct emb_tier *tr = t->tier;
	uint32_t now = (uint32_t)__atomic_load_n(&t->step, __ATOMIC_SEQ_CST);
	uint32_t target;

	/* Idle more than idle_steps: last accessed before step now - idle
	 * + 0, i.e. at or before the tick sampled at a step <= target. */
	if (now <= idle_steps)
		return false;
	target = now - idle_steps;
	for (uint32_t k = 0; k < HIST_LEVELS; k++) {
		uint32_t step = target & ~((1u << k) - 1);
		uint64_t v = __atomic_load_n(
		    &tr->hist[k][(step >> k) % HIST_LEN], __ATOMIC_ACQUIRE);

		if ((uint32_t)(v >> 32) == step) {
			*upto = (uint32_t)v;
			return true;
		}
	}
	return false;
}

uint32_t emb__tier_now(const struct emb_table *t)
{
	return (uint32_t)__atomic_load_n(&t->tier->clock, __ATOMIC_RELAXED);
}

/* ---- the cold map ---- */

static inline uint32_t map_fp(uint64_t h)
{
	return (uint32_t)(h >> 32);
}

static inline uint32_t map_home(uint32_t fp, uint32_t n)
{
	/* fp's low bits: the tag and probe start of the hot index use
	 * other bits of the hash (common/hash.h), and n is a power of 2. */
	return (fp * 0x9e3779b1u) >> (32 - __builtin_ctz(n));
}

/* Charges (n > 0) or releases the tier's DRAM: never refused, so that a
 * demotion, which frees slab records, cannot fail on it; docs/store.md
 * says how the limit leaves room for it. */
static void charge(struct emb_table *t, int64_t n)
{
	if (n > 0)
		emb__mem_charge_force(t, (uint64_t)n);
	else if (n < 0)
		emb__mem_charge(t, n);
	__atomic_fetch_add(&t->tier->map_bytes, (uint64_t)n, __ATOMIC_RELAXED);
}

static int map_grow(struct emb_table *t, struct tier_shard *ts)
{
	uint32_t n = ts->map_n ? ts->map_n * 2 : MAP_MIN;
	uint64_t *m = calloc(n, sizeof(*m));

	if (!m)
		return -ENOMEM;
	for (uint32_t i = 0; i < ts->map_n; i++) {
		uint64_t v = ts->map[i];
		uint32_t pos;

		if (!v)
			continue;
		pos = map_home((uint32_t)(v >> 32), n);
		while (m[pos])
			pos = (pos + 1) & (n - 1);
		m[pos] = v;
	}
	charge(t, (int64_t)(n - ts->map_n) * 8);
	free(ts->map);
	ts->map = m;
	ts->map_n = n;
	return 0;
}

/* Position of the first entry at or after probe step *pos whose
 * fingerprint is fp, or -1; *pos is where to go on from. */
static int64_t map_next(const struct tier_shard *ts, uint32_t fp,
			uint32_t *pos)
{
	uint32_t n = ts->map_n;

	if (!n)
		return -1;
	for (;;) {
		uint32_t p = *pos;
		uint64_t v = ts->map[p];

		if (!v)
			return -1;
		*pos = (p + 1) & (n - 1);
		if ((uint32_t)(v >> 32) == fp)
			return p;
	}
}

static void map_delete(struct tier_shard *ts, uint32_t hole)
{
	uint32_t n = ts->map_n, pos = hole;

	for (;;) {
		uint32_t home;
		uint64_t v;

		pos = (pos + 1) & (n - 1);
		v = ts->map[pos];
		if (!v)
			break;
		home = map_home((uint32_t)(v >> 32), n);
		if (hole <= pos ? (home <= hole || home > pos)
				: (home <= hole && home > pos)) {
			ts->map[hole] = v;
			hole = pos;
		}
	}
	ts->map[hole] = 0;
	ts->map_used--;
}

/* ---- blocks ---- */

static int blk_reserve(struct emb_table *t, struct tier_shard *ts)
{
	const uint32_t mw = 2 * t->tier->mark_words;
	uint32_t cap;
	void *a, *b, *c, *d, *e, *f;

	if (ts->nblk < ts->blk_cap)
		return 0;
	if (ts->nblk >= (1u << 24))
		return EMB_ETIERFULL; /* 24 bits of a location */
	cap = ts->blk_cap ? ts->blk_cap * 2 : 16;
	a = realloc(ts->blk_file, cap * sizeof(uint32_t));
	if (a)
		ts->blk_file = a;
	b = realloc(ts->blk_live, cap * sizeof(uint16_t));
	if (b)
		ts->blk_live = b;
	c = realloc(ts->blk_gen, cap * sizeof(uint32_t));
	if (c)
		ts->blk_gen = c;
	d = realloc(ts->blk_mark, (size_t)cap * mw * sizeof(uint64_t));
	if (d)
		ts->blk_mark = d;
	e = realloc(ts->blk_born, (size_t)cap * sizeof(uint64_t));
	if (e)
		ts->blk_born = e;
	f = realloc(ts->blk_tick, (size_t)cap * sizeof(uint32_t));
	if (f)
		ts->blk_tick = f;
	if (!a || !b || !c || !d || !e || !f)
		return -ENOMEM;
	charge(t, (int64_t)(cap - ts->blk_cap) * (22 + 8 * mw));
	ts->blk_cap = cap;
	return 0;
}

/* Puts file block fb on the tier's free list: 0, or -ENOMEM (then the
 * block is lost to the file until the table goes: a few KiB). */
static int file_block_put(struct emb_tier *tr, uint32_t fb)
{
	pthread_mutex_lock(&tr->lock);
	if (tr->nfree == tr->free_cap) {
		uint32_t cap = tr->free_cap ? tr->free_cap * 2 : 64;
		uint32_t *v = realloc(tr->free_blocks, cap * sizeof(*v));

		if (!v) {
			pthread_mutex_unlock(&tr->lock);
			return -ENOMEM;
		}
		tr->free_blocks = v;
		tr->free_cap = cap;
	}
	tr->free_blocks[tr->nfree++] = fb;
	pthread_mutex_unlock(&tr->lock);
	return 0;
}

/* A shard block for a new write: a spare one, or a new one. Takes its
 * file block from the tier's free list or the file's end. */
static int blk_new(struct emb_table *t, struct tier_shard *ts, uint32_t *out)
{
	struct emb_tier *tr = t->tier;
	uint32_t fb, sb;
	int rc;

	pthread_mutex_lock(&tr->lock);
	if (tr->nfree) {
		fb = tr->free_blocks[--tr->nfree];
	} else if (tr->max_blocks && tr->file_blocks >= tr->max_blocks) {
		pthread_mutex_unlock(&tr->lock);
		return EMB_ETIERFULL;
	} else {
		fb = tr->file_blocks++;
	}
	pthread_mutex_unlock(&tr->lock);
	if (ts->nspare) {
		sb = ts->blk_spare[--ts->nspare];
	} else {
		rc = blk_reserve(t, ts);
		if (rc)
			goto err;
		sb = ts->nblk++;
		ts->blk_gen[sb] = 0;
	}
	ts->blk_file[sb] = fb;
	ts->blk_live[sb] = 0;
	ts->blk_gen[sb]++;
	ts->blk_born[sb] =
	    __atomic_add_fetch(&tr->blk_clock, 1, __ATOMIC_RELAXED);
	memset(ts->blk_mark + (size_t)sb * 2 * tr->mark_words, 0,
	       2 * tr->mark_words * sizeof(uint64_t));
	*out = sb;
	return 0;
err:
	file_block_put(tr, fb);
	return rc;
}

/* Gives shard block sb (no live record left) and its file block back. */
static void blk_release(struct emb_table *t, struct tier_shard *ts,
			uint32_t sb)
{
	struct emb_tier *tr = t->tier;

	if (ts->nspare == ts->spare_cap) {
		uint32_t cap = ts->spare_cap ? ts->spare_cap * 2 : 16;
		uint32_t *v = realloc(ts->blk_spare, cap * sizeof(*v));

		if (!v)
			return; /* kept as a used block with no live row */
		charge(t, (int64_t)(cap - ts->spare_cap) * 4);
		ts->blk_spare = v;
		ts->spare_cap = cap;
	}
	if (file_block_put(tr, ts->blk_file[sb]))
		return;
	ts->blk_spare[ts->nspare++] = sb;
	ts->blk_gen[sb]++; /* a row read from it before is stale now */
}

/* ---- marks ---- */

/*
 * A cold row keeps the marks its record had in DRAM: the checkpoint's
 * (dirty.c: written since the last walk, so the next delta carries it)
 * and a move's (emb_table_track_begin). A demotion copies them to its
 * block's bits, a promotion back to the new record's.
 */
enum { MARK_CKPT, MARK_MOVE };

/*
 * The word and the bit of loc's mark of a kind. Two functions, not a word
 * with the bit through a pointer: `*mark_word(.., &bit) & bit` reads bit
 * unsequenced against the call that sets it, which GCC happened to order
 * as meant and clang did not (a delta then missed rows on the device).
 */
static inline uint64_t *mark_word(const struct emb_tier *tr,
				  const struct tier_shard *ts, uint32_t loc,
				  int kind)
{
	uint32_t sb = loc >> 8, slot = loc & 0xff;

	return &ts->blk_mark[((size_t)sb * 2 + (size_t)kind) *
				 tr->mark_words +
			     slot / 64];
}

static inline uint64_t mark_bit(uint32_t loc)
{
	return 1ull << (loc & 63); /* a slot is loc's low 8 bits */
}

static inline bool mark_get(const struct emb_tier *tr,
			    const struct tier_shard *ts, uint32_t loc, int kind)
{
	return *mark_word(tr, ts, loc, kind) & mark_bit(loc);
}

static inline void mark_put(const struct emb_tier *tr,
			    const struct tier_shard *ts, uint32_t loc, int kind,
			    bool on)
{
	uint64_t *w = mark_word(tr, ts, loc, kind);

	if (on)
		*w |= mark_bit(loc);
	else
		*w &= ~mark_bit(loc);
}

static inline bool rec_bit(const uint64_t *w, uint32_t idx)
{
	return w && ((w[idx >> 6] >> (idx & 63)) & 1);
}

static inline void rec_set(uint64_t *w, uint32_t idx, bool on)
{
	if (on)
		w[idx >> 6] |= 1ull << (idx & 63);
	else
		w[idx >> 6] &= ~(1ull << (idx & 63));
}

/* ---- demotion ---- */

struct cand {
	uint32_t score; /* accesses, halved for each DECAY_TICKS idle */
	uint32_t step;
	uint32_t idx;
};

/*
 * Which rows go to the device: the least often used, by the row's access
 * count halved for every DECAY_TICKS batches it has been idle (an LFU
 * that forgets, as the frequency sketches of TinyLFU do by halving), then
 * the least recently used. A plain LRU keeps the tail of a skewed stream
 * that came last and sends rows that come back every few hundred batches
 * away (at 1M rows, half on the device, Zipf 1.05: 421 device reads a
 * batch under LRU where the ideal is about 120).
 */
#define DECAY_TICKS 256u

static uint32_t cand_score(const struct emb_row_hdr *r, uint32_t now)
{
	uint32_t idle = now - r->last_step, halvings = idle / DECAY_TICKS;
	uint32_t c = r->count & ~EMB_ROW_FREE;

	/* A step ahead of now (another thread's batch) is no idle time. */
	if ((int32_t)idle < 0)
		return c;
	return halvings >= 31 ? 0 : c >> halvings;
}

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	int32_t d;

	/* The lowest score first, then the oldest access; ties by record,
	 * for a stable choice. Steps are compared as distances so that the
	 * clock may wrap. */
	if (x->score != y->score)
		return x->score < y->score ? -1 : 1;
	d = (int32_t)(x->step - y->step);

	if (d)
		return d < 0 ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/*
 * Writes the n records at cand[0..n) of shard s to new blocks, all in
 * flight at once, then indexes them in the cold map and frees their
 * records. 0 or an error (then nothing moved).
 */
static int demote(struct emb_table *t, struct emb_shard *s, uint32_t si,
		  const struct cand *cand, uint32_t n)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	const uint32_t per = tr->per_block, rec = tr->rec;
	const uint32_t nb = (n + per - 1) / per;
	uint32_t *sb = calloc((size_t)nb * 2, sizeof(*sb)), *file;
	char *buf = tls_buf((size_t)nb * TIER_BLOCK);
	uint32_t got = 0;
	uint64_t ns = 0;
	int rc = 0;

	if (!sb || !buf) {
		free(sb);
		return -ENOMEM;
	}
	file = sb + nb;
	while ((uint64_t)(ts->map_used + n) * 5 > (uint64_t)ts->map_n * 4)
		if ((rc = map_grow(t, ts)))
			goto out;
	for (; got < nb; got++) {
		char *b = buf + (size_t)got * TIER_BLOCK;
		uint32_t lo = got * per, m = n - lo < per ? n - lo : per;

		if ((rc = blk_new(t, ts, &sb[got])))
			break;
		file[got] = ts->blk_file[sb[got]];
		for (uint32_t k = 0; k < m; k++)
			memcpy(b + (size_t)k * rec,
			       emb__shard_row(t, s, cand[lo + k].idx), rec);
		memset(b + (size_t)m * rec, 0, TIER_BLOCK - (size_t)m * rec);
	}
	/* A tier at its bound takes what it has room for. */
	if (rc == EMB_ETIERFULL && got)
		rc = 0;
	if (!rc)
		rc = dev_batch(tr->fd, buf, file, got, true, &ns);
	if (rc) {
		if (rc != EMB_ETIERFULL)
			emb_log(EMB_LOG_ERROR, "tier %s: write: %s", tr->path,
				strerror(-rc));
		for (uint32_t i = 0; i < got; i++)
			blk_release(t, ts, sb[i]);
		goto out;
	}
	count(&tr->blocks_written, got);
	for (uint32_t i = 0; i < got; i++) {
		uint32_t lo = i * per, m = n - lo < per ? n - lo : per;
		uint32_t newest = cand[lo].step;

		for (uint32_t k = 0; k < m; k++) {
			uint32_t idx = cand[lo + k].idx, loc = sb[i] << 8 | k;
			struct emb_row_hdr *r = emb__shard_row(t, s, idx);
			uint64_t h = emb_id_hash(r->id);
			uint32_t fp = map_fp(h), pos = map_home(fp, ts->map_n);

			/* Ticks compared as distances, as the clock wraps. */
			if ((int32_t)(r->last_step - newest) > 0)
				newest = r->last_step;
			while (ts->map[pos])
				pos = (pos + 1) & (ts->map_n - 1);
			ts->map[pos] = (uint64_t)fp << 32 | (loc + 1);
			ts->map_used++;
			if (rec_bit(s->dirty, idx))
				mark_put(tr, ts, loc, MARK_CKPT, true);
			if (rec_bit(s->track, idx))
				mark_put(tr, ts, loc, MARK_MOVE, true);
			emb__shard_unlink(t, s, idx, h);
		}
		ts->blk_live[sb[i]] = (uint16_t)m;
		ts->blk_tick[sb[i]] = newest;
		count(&tr->rows_cold, m);
		count(&tr->demoted, m);
	}
out:
	free(sb);
	return rc;
}

uint64_t emb__tier_limit(const struct emb_table *t)
{
	const struct emb_mem_budget *b = t->opts.budget;
	uint64_t lim = t->opts.mem_limit;

	if (b && b->limit && (!lim || b->limit < lim))
		lim = b->limit;
	return lim;
}

/* Bytes of slabs the table may still add before it demotes: three
 * quarters of its limit, and of its budget's (a server's tables share
 * one), less what is used; UINT64_MAX with neither. Below, room_recs. */
static uint64_t room_bytes(const struct emb_table *t)
{
	const struct emb_mem_budget *b = t->opts.budget;
	uint64_t left = UINT64_MAX, lim, used;

	if ((lim = t->opts.mem_limit)) {
		used = __atomic_load_n(&t->mem_used, __ATOMIC_RELAXED);
		left = used + lim / 4 < lim ? lim - lim / 4 - used : 0;
	}
	if (b && (lim = b->limit)) {
		used = __atomic_load_n(&b->used, __ATOMIC_RELAXED);
		used = used + lim / 4 < lim ? lim - lim / 4 - used : 0;
		if (used < left)
			left = used;
	}
	return left;
}

/* Records shard s can make without a demotion: its free ones and those
 * of the slabs room_bytes() still allows; UINT64_MAX with no limit. */
static uint64_t room_recs(const struct emb_table *t,
			  const struct emb_shard *s)
{
	uint64_t left = room_bytes(t);

	if (left == UINT64_MAX)
		return UINT64_MAX;
	return (uint64_t)s->nslabs * t->rows_per_slab - s->used +
	       left / t->slab_alloc_bytes * t->rows_per_slab;
}

static uint32_t walks_dram_at(const struct tier_shard *ts);

/*
 * After the demotions: if the group's need still does not fit (the
 * shard had too few rows in DRAM to send away: the group is larger than
 * its share of the limit, or the index of the rows on the device takes
 * what the limit leaves), the shard may add the
 * slabs it lacks past the limit (add_slab), once warned: a load or push
 * must not fail because the device holds many rows. Returns 0.
 */
static int short_of(struct emb_table *t, struct emb_shard *s, uint32_t need)
{
	uint64_t room = room_recs(t, s);

	/* A walk's DRAM part held the demotions back: add_slab goes past
	 * the limit for it anyway, and that is no misconfiguration. */
	if (room >= need || s->tier_pinned)
		return 0;
	s->tier_force_slabs = (uint32_t)((need - room + t->rows_per_slab - 1) /
					 t->rows_per_slab);
	if (!__atomic_exchange_n(&t->tier->warned_short, true,
				 __ATOMIC_RELAXED))
		emb_log(EMB_LOG_WARN,
			"table %s: a batch needs %u rows of one shard in DRAM "
			"and its share of the memory limit holds %llu beside "
			"the index of the %llu rows on the device (8 to 20 "
			"bytes each): rows are made past the limit; raise it "
			"or send smaller batches (docs/store.md, \"The device "
			"tier\")",
			t->name, need, (unsigned long long)room,
			(unsigned long long)__atomic_load_n(
			    &t->tier->rows_cold, __ATOMIC_RELAXED));
	return 0;
}

/*
 * What a demotion evicts instead of writing to the device: rows the
 * eviction policy condemns, idle past ttl or weaker than min_l2, unless
 * the group that the room is made for has them (a batch never loses a
 * row it uses; the hand after it decides). Checking the norm here is
 * what lets min_l2 leave cold rows alone: a cold row's weights do not
 * change, so one written while min_l2 was X is at least X for good.
 */
struct room_ev {
	bool idle;		    /* ttl set and upto known */
	uint32_t upto;		    /* idle past ttl: last access <= upto */
	float min_l2;		    /* 0 = none */
	const uint64_t *h;	    /* the group's ids' hashes */
	const uint32_t *pos;	    /* at these positions */
	uint32_t n;		    /* how many */
	uint64_t *sorted;	    /* h[pos[..]] sorted, made on first need */
	struct emb_evict_counts *out; /* rows evicted, by reason */
};

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Whether the group has the row hashed h (or memory is out: then it is
 * kept, which is never wrong). */
static bool in_group(struct room_ev *e, uint64_t h)
{
	if (!e->sorted) {
		e->sorted = malloc(((size_t)e->n + 1) * sizeof(*e->sorted));
		if (!e->sorted)
			return true;
		for (uint32_t i = 0; i < e->n; i++)
			e->sorted[i] = e->h[e->pos[i]];
		qsort(e->sorted, e->n, sizeof(*e->sorted), u64_cmp);
	}
	return bsearch(&h, e->sorted, e->n, sizeof(h), u64_cmp) != NULL;
}

/* Removes the candidates the policy condemns from cand[0..*n), keeping
 * the others in order; how many it evicted. */
static uint32_t room_evict(struct emb_table *t, struct emb_shard *s,
			   struct room_ev *e, struct cand *cand, uint64_t *n)
{
	uint64_t kept = 0;
	uint32_t gone = 0;

	for (uint64_t i = 0; i < *n; i++) {
		struct emb_row_hdr *r = emb__shard_row(t, s, cand[i].idx);
		bool ttl = e->idle &&
			   (int32_t)(r->last_step - e->upto) <= 0;
		bool weak = !ttl && e->min_l2 > 0.0f &&
			    emb__row_l2(t, r) < e->min_l2;
		uint64_t h;

		if ((ttl || weak) && !emb__evict_held(t, r->id) &&
		    !in_group(e, h = emb_id_hash(r->id))) {
			emb__shard_remove(t, s, cand[i].idx, h);
			if (ttl)
				e->out->ttl++;
			else
				e->out->l2++;
			gone++;
			continue;
		}
		cand[kept++] = cand[i];
	}
	*n = kept;
	return gone;
}

/*
 * One round of making room for need records in shard s, demoting only
 * records before lim: 0 when the room is there, 1 when it demoted or
 * evicted rows (the cold index it grew may have taken some of the room:
 * look again), 2 when it had nothing to demote, or an error.
 */
static int room_round(struct emb_table *t, struct emb_shard *s, uint32_t si,
		      uint32_t need, uint32_t lim, struct room_ev *e)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	uint64_t room = room_recs(t, s), want, ncand, got;
	uint32_t now = (uint32_t)__atomic_load_n(&tr->clock, __ATOMIC_RELAXED);
	struct cand *cand;
	int rc;

	/*
	 * Rows this group may make fit in the free records, or in slabs
	 * the limit still allows; the rest is made room for by demoting
	 * the least recently used rows. A quarter of the limit is kept for
	 * the index and cold maps (docs/store.md).
	 */
	if (room >= need)
		return 0; /* room, or no limit to make room in */
	want = need - room;
	/* Whole blocks, and a few at once: each demotion writes. */
	want = (want + tr->per_block - 1) / tr->per_block * tr->per_block;
	if (want < (uint64_t)DEMOTE_MIN_BLOCKS * tr->per_block)
		want = (uint64_t)DEMOTE_MIN_BLOCKS * tr->per_block;
	if (want > s->used)
		want = s->used;
	if (!want)
		return 2;
	ncand = want * DEMOTE_SCAN;
	if (ncand > s->used)
		ncand = s->used;
	cand = malloc(ncand * sizeof(*cand));
	if (!cand)
		return -ENOMEM;
	/* The hand goes round the records, taking the live ones, and the
	 * oldest of them go: an approximate LRU over the shard. */
	got = 0;
	if (lim > s->next_idx)
		lim = s->next_idx;
	for (uint32_t seen = 0; got < ncand && seen < lim; seen++) {
		struct emb_row_hdr *r;

		if (ts->hand >= lim)
			ts->hand = 0;
		r = emb__shard_row(t, s, ts->hand);
		if (!(r->count & EMB_ROW_FREE))
			cand[got++] = (struct cand){cand_score(r, now),
						    r->last_step, ts->hand};
		ts->hand++;
	}
	ncand = got;
	qsort(cand, ncand, sizeof(*cand), cand_cmp);
	if (e->idle || e->min_l2 > 0.0f) {
		uint32_t gone = room_evict(t, s, e, cand, &ncand);

		/* Each eviction freed a record: that many fewer to write. */
		want = want > gone ? want - gone : 0;
		if (!want && gone) {
			free(cand);
			return 1;
		}
	}
	if (want > ncand)
		want = ncand;
	rc = want ? demote(t, s, si, cand, (uint32_t)want) : 0;
	free(cand);
	return rc ? rc : want ? 1 : 2;
}

int emb__tier_room(struct emb_table *t, struct emb_shard *s, uint32_t si,
		   const uint64_t *h, const uint32_t *pos, uint32_t need,
		   struct emb_evict_counts *ev)
{
	struct emb_life_shard *life =
	    __atomic_load_n(&t->life, __ATOMIC_ACQUIRE);
	struct room_ev e = {.h = h, .pos = pos, .n = need, .out = ev};
	uint32_t lim = UINT32_MAX;
	int rc = 1;

	s->tier_force_slabs = 0; /* a past group's leave */
	if ((uint64_t)s->nslabs * t->rows_per_slab - s->used >= need)
		return 0;
	/* A walk in the shard's DRAM records (walks below): only records
	 * it has passed may leave for the device; rows are made past the
	 * limit if need be (add_slab) rather than refuse a push for a
	 * checkpoint. The shard keeps those records for its rows to come;
	 * docs/store.md. */
	if (s->tier_pinned) {
		lim = walks_dram_at(&t->tier->sh[si]);
		if (!lim)
			return 0;
	}
	/* The policy is read under the shard lock it is set under. */
	if (life) {
		const struct emb_lifecycle_cfg *c = &life[si].cfg;

		e.min_l2 = c->min_l2;
		e.idle = c->ttl_steps &&
			 emb__tier_idle_upto(t, c->ttl_steps, &e.upto);
	}
	for (int round = 0; rc == 1 && round < 4; round++)
		rc = room_round(t, s, si, need, lim, &e);
	free(e.sorted);
	return rc < 0 ? rc : short_of(t, s, need);
}

/* ---- promotion ---- */

/*
 * Where id is cold: its map position and location, or false. Reads the
 * block into buf (TIER_BLOCK aligned bytes) unless the read-ahead pre
 * has it, and checks the id there.
 */
static bool cold_find(struct emb_table *t, uint32_t si, uint64_t id,
		      uint64_t h, const struct emb_tier_pre *pre, char *buf,
		      uint32_t *mpos, const char **rec_out, int *rc)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	uint32_t fp = map_fp(h), pos;
	int64_t at;

	if (!ts->map_n)
		return false;
	pos = map_home(fp, ts->map_n);
	while ((at = map_next(ts, fp, &pos)) >= 0) {
		uint32_t loc = (uint32_t)ts->map[at] - 1;
		uint32_t sb = loc >> 8, slot = loc & 0xff;
		const char *blk = NULL;
		const char *r;

		if (pre)
			blk = emb__tier_pre_block(pre, si, sb,
						  ts->blk_gen[sb]);
		if (!blk) {
			uint64_t t0 = now_ns();

			*rc = dev_io(tr->fd, buf, TIER_BLOCK,
				     ts->blk_file[sb], false);
			count(&tr->read_ns, now_ns() - t0);
			if (*rc) {
				emb_log(EMB_LOG_ERROR, "tier %s: read: %s", tr->path,
					    strerror(-*rc));
				return false;
			}
			count(&tr->blocks_read, 1);
			blk = buf;
		}
		r = blk + (size_t)slot * tr->rec;
		if (((const struct emb_row_hdr *)(const void *)r)->id != id)
			continue; /* 32 hash bits alike: read on */
		*mpos = (uint32_t)at;
		*rec_out = r;
		return true;
	}
	return false;
}

static void walks_drop(struct emb_table *t, uint32_t si, uint32_t loc,
		       uint32_t fp, uint64_t id, bool lives_on, const void *src);

/* Drops id's cold row at map position mpos (its block's live count, its
 * marks); lives_on: it goes to DRAM (promotion, assign), else it is
 * erased. */
static void cold_drop(struct emb_table *t, uint32_t si, uint32_t mpos,
		      uint64_t id, bool lives_on, const void *src)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	uint32_t loc = (uint32_t)ts->map[mpos] - 1, sb = loc >> 8;

	if (ts->walks)
		walks_drop(t, si, loc, (uint32_t)(ts->map[mpos] >> 32), id,
			   lives_on, src);
	mark_put(tr, ts, loc, MARK_CKPT, false);
	mark_put(tr, ts, loc, MARK_MOVE, false);
	map_delete(ts, mpos);
	if (--ts->blk_live[sb] == 0)
		blk_release(t, ts, sb);
	__atomic_fetch_sub(&tr->rows_cold, 1, __ATOMIC_RELAXED);
}

/*
 * A pull read the cold row at map position mpos and left it there: an
 * access its record on the device does not record. Its block's newest
 * access becomes now (the clock's latest tick, at or after the batch's),
 * so that ttl keeps the block's rows (late for the others, never early)
 * and max_rows leaves the block to later batches.
 */
static void read_cold(struct emb_tier *tr, struct tier_shard *ts,
		      uint32_t mpos)
{
	uint32_t sb = ((uint32_t)ts->map[mpos] - 1) >> 8;

	ts->blk_tick[sb] =
	    (uint32_t)__atomic_load_n(&tr->clock, __ATOMIC_RELAXED);
}

struct emb_row_hdr *emb__tier_take(struct emb_table *t, struct emb_shard *s,
				   uint32_t si, uint64_t id, uint64_t h,
				   const struct emb_tier_pre *pre, bool write,
				   bool *in_dram, int *rc)
{
	char *buf = tls_buf(TIER_BLOCK);
	struct tier_shard *ts = &t->tier->sh[si];
	const char *src;
	struct emb_row_hdr *r;
	uint32_t mpos, *g;
	int64_t idx;

	*rc = 0;
	*in_dram = false;
	if (!buf) {
		*rc = -ENOMEM;
		return NULL;
	}
	if (!cold_find(t, si, id, h, pre, buf, &mpos, &src, rc))
		return NULL;
	g = &ts->ghost[(uint32_t)h & (t->tier->ghost_n - 1)];
	if (!write && *g != (map_fp(h) | 1)) {
		/* First read in a while: served from where it was read
		 * (the read-ahead's block, or this thread's buffer), which
		 * the caller only reads from, before its next take. */
		*g = map_fp(h) | 1;
		read_cold(t->tier, ts, mpos);
		count(&t->tier->served_cold, 1);
		return (struct emb_row_hdr *)(uintptr_t)src;
	}
	*g = 0;
	idx = emb__shard_insert(t, s, id, h);
	if (idx < 0 && !write) {
		/* No record for it (the limit, out of memory): a read is
		 * served from the device all the same. */
		read_cold(t->tier, ts, mpos);
		count(&t->tier->served_cold, 1);
		return (struct emb_row_hdr *)(uintptr_t)src;
	}
	if (idx < 0) {
		*rc = (int)idx;
		return NULL;
	}
	r = emb__shard_row(t, s, (uint32_t)idx);
	/* The record as it was: access meta and floats. Not the seal the
	 * device copy holds: sealed afresh after the copy, as after any
	 * write, so a reader never sees a valid seal over floats half
	 * copied, and a table unsealed since (dropped) gets none. */
	memcpy((char *)r + 8, src + 8, 8 + (size_t)t->row_floats * 4);
	emb__row_seal(t, r);
	{
		/* Its marks as they were too: emb__shard_insert marked a
		 * new row, which this one is not. */
		uint32_t loc = (uint32_t)ts->map[mpos] - 1;

		rec_set(s->dirty, (uint32_t)idx,
			mark_get(t->tier, ts, loc, MARK_CKPT));
		if (s->track)
			rec_set(s->track, (uint32_t)idx,
				mark_get(t->tier, ts, loc, MARK_MOVE));
	}
	cold_drop(t, si, mpos, id, true, src);
	count(&t->tier->promoted, 1);
	*in_dram = true;
	return r;
}

bool emb__tier_has(struct emb_table *t, uint32_t si, uint64_t id, uint64_t h)
{
	char *buf = tls_buf(TIER_BLOCK);
	const char *src;
	uint32_t mpos;
	int rc = 0;

	/* A fingerprint alone is not enough: another id may share it. */
	if (!buf)
		return true;
	return cold_find(t, si, id, h, NULL, buf, &mpos, &src, &rc) || rc;
}

bool emb__tier_forget(struct emb_table *t, uint32_t si, uint64_t id,
		      uint64_t h, bool lives_on, int *rc)
{
	char *buf = tls_buf(TIER_BLOCK);
	const char *src;
	uint32_t mpos;

	*rc = 0;
	if (!buf) {
		*rc = -ENOMEM;
		return false;
	}
	if (!cold_find(t, si, id, h, NULL, buf, &mpos, &src, rc))
		return false;
	cold_drop(t, si, mpos, id, lives_on, src);
	return true;
}

/* ---- reading a batch's cold rows ahead ---- */

/*
 * A batch's read-ahead: the distinct blocks its cold ids are in, read
 * together through io_uring before the batch takes its shards' locks,
 * so that n cold rows cost about one device round trip at a queue
 * depth of RING_DEPTH instead of n in a row.
 */
struct pre_blk {
	uint32_t si, sb, gen, file;
};

struct emb_tier_pre {
	struct pre_blk *blk; /* sorted by (si, sb) once read */
	uint32_t n, cap;
	char *buf;	     /* n blocks, 4 KiB aligned: the thread's */
	bool read;	     /* the reads completed */
};

static int pre_cmp(const void *a, const void *b)
{
	const struct pre_blk *x = a, *y = b;

	if (x->si != y->si)
		return x->si < y->si ? -1 : 1;
	return x->sb < y->sb ? -1 : x->sb > y->sb;
}

struct emb_tier_pre *emb__tier_pre_new(void)
{
	return calloc(1, sizeof(struct emb_tier_pre));
}

void emb__tier_pre_free(struct emb_tier_pre *p)
{
	if (!p)
		return;
	free(p->blk);
	free(p);
}

void emb__tier_note(struct emb_table *t, uint32_t si, uint64_t h,
		    struct emb_tier_pre *p)
{
	struct tier_shard *ts = &t->tier->sh[si];
	uint32_t fp = map_fp(h), pos;
	int64_t at;

	if (!ts->map_n || p->n >= BUF_BLOCKS_MAX)
		return;
	pos = map_home(fp, ts->map_n);
	/* Every candidate block: a 32-bit fingerprint alike is rare. */
	while ((at = map_next(ts, fp, &pos)) >= 0) {
		uint32_t sb = ((uint32_t)ts->map[at] - 1) >> 8;

		if (p->n == p->cap) {
			uint32_t cap = p->cap ? p->cap * 2 : 64;
			struct pre_blk *v = realloc(p->blk, cap * sizeof(*v));

			if (!v)
				return; /* its promotion reads it then */
			p->blk = v;
			p->cap = cap;
		}
		p->blk[p->n++] = (struct pre_blk){si, sb, ts->blk_gen[sb],
						  ts->blk_file[sb]};
	}
}

int emb__tier_fetch(struct emb_table *t, struct emb_tier_pre *p)
{
	struct emb_tier *tr = t->tier;
	uint32_t n = 0, *file;
	uint64_t ns;
	int rc;

	if (!p->n)
		return 0;
	qsort(p->blk, p->n, sizeof(*p->blk), pre_cmp);
	for (uint32_t i = 0; i < p->n; i++)
		if (!n || pre_cmp(&p->blk[i], &p->blk[n - 1]))
			p->blk[n++] = p->blk[i];
	p->n = n;
	file = malloc((size_t)n * sizeof(*file));
	p->buf = tls_pre((size_t)n * TIER_BLOCK);
	if (!file || !p->buf) {
		free(file);
		p->n = 0;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		file[i] = p->blk[i].file;
	rc = dev_batch(tr->fd, p->buf, file, n, false, &ns);
	free(file);
	count(&tr->read_ns, ns);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "tier %s: read: %s", tr->path,
			strerror(-rc));
		p->n = 0; /* each promotion reads its own block then */
		return 0;
	}
	count(&tr->blocks_read, n);
	p->read = true;
	return 0;
}

const char *emb__tier_pre_block(const struct emb_tier_pre *p, uint32_t si,
				uint32_t sb, uint32_t gen)
{
	uint32_t lo = 0, hi = p->read ? p->n : 0;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		const struct pre_blk *b = &p->blk[mid];

		if (b->si == si && b->sb == sb)
			return b->gen == gen ? p->buf + (size_t)mid * TIER_BLOCK
					     : NULL;
		if (b->si < si || (b->si == si && b->sb < sb))
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* ---- walks ---- */

/*
 * A walk over a shard (an iterator, a checkpoint, a move's stream: the
 * callers are table.c and ckpt.c) goes in three parts, so that every row
 * of the shard comes out once however rows move between the tiers:
 *
 *   1. DRAM: the caller walks the shard's records as in any table. Until
 *      it is done the shard demotes only records the walk has passed
 *      (emb__tier_walk_dram_at), so no row the walk has not reached can
 *      go to the device. A row that comes back from the device meanwhile
 *      is owed: its id is kept, the caller skips it in DRAM
 *      (emb__tier_walk_owes) and part 3 hands it out.
 *   2. The device: at the end of part 1 (walk_hot_done) the walk lists
 *      the shard's cold rows in blocks written before it began (later
 *      ones hold rows demoted from records it passed), with their
 *      blocks' generations, and the shard demotes freely again. The list goes in location order, in
 *      runs of up to WALK_BLOCKS blocks read together with the shard lock
 *      dropped; a row read is handed out if its block's generation is
 *      still the listed one (the block was not given back and written
 *      again) and the cold map still has it there. A listed row that
 *      leaves the device before the walk got to it is owed too.
 *   3. The owed rows, looked up wherever they are now.
 *
 * A demotion during part 2 or 3 moves rows the walk handed out in part 1
 * (or made since it began, which it need not hand out): they carry their
 * marks to the device, for the next delta or move pass.
 */
#define WALK_BLOCKS 64u

enum { PART_DRAM, PART_COLD, PART_OWED, PART_DONE };

struct emb_tier_walk {
	struct emb_tier_walk *next; /* the shard's walks */
	int kind;		    /* EMB_TIER_WALK_* */
	int part;		    /* PART_* */
	bool by_slot;
	uint64_t slots[EMB_NSLOTS / 64]; /* by_slot: the slots walked */
	uint64_t born;		    /* the block clock at entry */
	bool view;		    /* a view's: saves what leaves, owes not */
	uint32_t dram_at;	    /* part 1: records before it are done */
	uint32_t *loc;		    /* part 2: locations, ascending */
	uint32_t *gen;		    /* and their blocks' generations */
	uint32_t nloc;		    /* in loc */
	uint32_t at;		    /* loc[0..at) are behind the walk */
	uint64_t *owed;		    /* ids owed: open addressing, 0 = empty
				       (id 0: owed_zero), owed_n slots */
	uint32_t owed_n, nowed;	    /* slots; ids in them */
	uint32_t owed_at;	    /* part 3: next slot to hand out, then
				       owed_n for id 0 */
	bool owed_zero;
	char *buf;		    /* WALK_BLOCKS blocks, aligned */
};

int emb__tier_walk_enter(struct emb_table *t, uint32_t si, int kind,
			 const uint64_t *slots, struct emb_tier_walk **out)
{
	struct tier_shard *ts = &t->tier->sh[si];
	struct emb_tier_walk *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->kind = kind;
	w->born = __atomic_load_n(&t->tier->blk_clock, __ATOMIC_RELAXED);
	w->by_slot = slots != NULL;
	if (slots)
		memcpy(w->slots, slots, sizeof(w->slots));
	w->next = ts->walks;
	ts->walks = w;
	t->shards[si].tier_pinned = true;
	*out = w;
	return 0;
}

/* Whether a walk of the shard holds its demotions back (part 1 of a
 * walk that is no view's), after walks came or went. */
static void pin_update(struct emb_table *t, uint32_t si)
{
	const struct emb_tier_walk *o = t->tier->sh[si].walks;

	while (o && (o->part != PART_DRAM || o->view))
		o = o->next;
	t->shards[si].tier_pinned = o != NULL;
}

/* Whether the walk hands out the row at loc (its filter). */
static bool walk_wants(const struct emb_tier *tr, const struct tier_shard *ts,
		       const struct emb_tier_walk *w, uint32_t fp, uint32_t loc)
{
	if (w->by_slot) {
		/* A slot is the top bits of the hash's high word, which the
		 * entry keeps (common/hash.h). */
		uint32_t sl = emb_fastrange32(fp, EMB_NSLOTS);

		if (!((w->slots[sl / 64] >> (sl % 64)) & 1))
			return false;
	}
	if (w->kind == EMB_TIER_WALK_CKPT)
		return mark_get(tr, ts, loc, MARK_CKPT);
	if (w->kind == EMB_TIER_WALK_MOVE)
		return mark_get(tr, ts, loc, MARK_MOVE);
	return true;
}

static int loc_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Part 1 is done: lists the cold rows. 0 or -ENOMEM. */
static int walk_hot_done(struct emb_table *t, uint32_t si,
			 struct emb_tier_walk *w)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];

	if (w->part != PART_DRAM)
		return 0;
	/* 8 bytes a cold row of one shard, for the walk's time in it. */
	w->loc = malloc((ts->map_used ? ts->map_used : 1) * sizeof(*w->loc));
	w->gen = malloc((ts->map_used ? ts->map_used : 1) * sizeof(*w->gen));
	w->buf = aligned_alloc(TIER_BLOCK, (size_t)WALK_BLOCKS * TIER_BLOCK);
	if (!w->loc || !w->gen || !w->buf)
		return -ENOMEM;
	for (uint32_t i = 0; i < ts->map_n; i++) {
		uint64_t v = ts->map[i];
		uint32_t loc = (uint32_t)v - 1;

		/* A block written since entry holds rows demoted from the
		 * records part 1 had passed: done, or not this walk's. */
		if (v && ts->blk_born[loc >> 8] <= w->born &&
		    walk_wants(tr, ts, w, (uint32_t)(v >> 32), loc))
			w->loc[w->nloc++] = loc;
	}
	qsort(w->loc, w->nloc, sizeof(*w->loc), loc_cmp);
	for (uint32_t i = 0; i < w->nloc; i++)
		w->gen[i] = ts->blk_gen[w->loc[i] >> 8];
	w->part = PART_COLD;
	pin_update(t, si);
	return 0;
}

void emb__tier_walk_leave(struct emb_table *t, uint32_t si,
			  struct emb_tier_walk *w)
{
	struct emb_tier_walk **pp;

	if (!w)
		return;
	for (pp = &t->tier->sh[si].walks; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	pin_update(t, si);
	free(w->loc);
	free(w->gen);
	free(w->owed);
	free(w->buf);
	free(w);
}

int emb__tier_view_enter(struct emb_table *t, uint32_t si,
			 struct emb_tier_walk **out)
{
	int rc = emb__tier_walk_enter(t, si, EMB_TIER_WALK_ALL, NULL, out);

	if (rc)
		return rc;
	/* The view keeps the instant's records itself, so it holds no
	 * demotion back; its cold rows are listed when it comes to the
	 * shard (walk_hot_done), those in blocks written before the
	 * instant, and one of them that leaves the device before is saved
	 * (walks_drop): one shard's list at a time, not the table's. */
	(*out)->view = true;
	pin_update(t, si);
	return 0;
}

void emb__tier_walk_dram_at(struct emb_tier_walk *w, uint32_t idx)
{
	w->dram_at = idx;
}

/* The first record a walk in its DRAM part has not passed yet: the
 * shard's demotions take records before it only, 0 = none. */
static uint32_t walks_dram_at(const struct tier_shard *ts)
{
	uint32_t at = UINT32_MAX;

	for (const struct emb_tier_walk *w = ts->walks; w; w = w->next)
		if (w->part == PART_DRAM && !w->view && w->dram_at < at)
			at = w->dram_at;
	return at;
}

bool emb__tier_walk_done(const struct emb_tier_walk *w)
{
	return w->part == PART_DONE;
}

static uint32_t set_home(uint64_t id, uint32_t n)
{
	return (uint32_t)(emb_id_hash(id) & (n - 1));
}

bool emb__tier_walk_owes(const struct emb_tier_walk *w, uint64_t id)
{
	if (!id)
		return w->owed_zero;
	if (!w->nowed)
		return false;
	for (uint32_t p = set_home(id, w->owed_n);; p = (p + 1) &
						      (w->owed_n - 1)) {
		if (w->owed[p] == id)
			return true;
		if (!w->owed[p])
			return false;
	}
}

/* Owes id. Without memory for it the walk cannot keep its promise to
 * hand out every row: it fails (the next call returns -ENOMEM). */
static void owe(struct emb_tier_walk *w, uint64_t id)
{
	uint32_t p;

	if (!id) {
		w->owed_zero = true;
		return;
	}
	if (emb__tier_walk_owes(w, id))
		return;
	if ((w->nowed + 1) * 2 > w->owed_n) {
		uint32_t n = w->owed_n ? w->owed_n * 2 : 128;
		uint64_t *v = calloc(n, sizeof(*v));

		if (!v) {
			w->part = -ENOMEM;
			return;
		}
		for (uint32_t i = 0; i < w->owed_n; i++) {
			if (!w->owed[i])
				continue;
			p = set_home(w->owed[i], n);
			while (v[p])
				p = (p + 1) & (n - 1);
			v[p] = w->owed[i];
		}
		free(w->owed);
		w->owed = v;
		w->owed_n = n;
	}
	p = set_home(id, w->owed_n);
	while (w->owed[p])
		p = (p + 1) & (w->owed_n - 1);
	w->owed[p] = id;
	w->nowed++;
}

/* id's cold row at loc leaves the device; lives_on: for DRAM (promotion,
 * assign), not gone (erase). Each walk that still had to hand it out
 * from the device, or that is in DRAM before it, now owes it. Before the
 * row's marks are cleared: the filter reads them. */
static void walks_drop(struct emb_table *t, uint32_t si, uint32_t loc,
		       uint32_t fp, uint64_t id, bool lives_on, const void *src)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];

	for (struct emb_tier_walk *w = ts->walks; w; w = w->next) {
		/* An erased row is owed to no walk; a view still shows it. */
		if (!lives_on && !w->view)
			continue;
		if (w->part == PART_DRAM) {
			/* Only a row on the device since before the walk:
			 * one demoted since came from records it passed
			 * (a view's, from records it saved or saw). */
			if (ts->blk_born[loc >> 8] > w->born ||
			    !walk_wants(tr, ts, w, fp, loc))
				continue;
			if (w->view)
				emb__view_save_cold(t, &t->shards[si], src);
			else
				owe(w, id);
		} else if (w->part == PART_COLD) {
			uint32_t lo = w->at, hi = w->nloc;

			while (lo < hi) {
				uint32_t mid = lo + (hi - lo) / 2;

				if (w->loc[mid] < loc)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo < w->nloc && w->loc[lo] == loc &&
			    w->gen[lo] == ts->blk_gen[loc >> 8]) {
				if (w->view)
					emb__view_save_cold(t, &t->shards[si],
							    src);
				else
					owe(w, id);
			}
		}
	}
}

/* Whether the cold map holds id at loc: map position, or -1. */
static int64_t cold_at(const struct tier_shard *ts, uint64_t id, uint32_t loc)
{
	uint32_t fp = map_fp(emb_id_hash(id)), pos;
	int64_t at;

	if (!ts->map_n)
		return -1;
	pos = map_home(fp, ts->map_n);
	while ((at = map_next(ts, fp, &pos)) >= 0)
		if ((uint32_t)ts->map[at] - 1 == loc)
			return at;
	return -1;
}

/* Part 2: the next run of listed cold rows. */
static int walk_cold(struct emb_table *t, struct emb_shard *s, uint32_t si,
		     struct emb_tier_walk *w, bool clear_ckpt, uint64_t *ids,
		     float *rows, struct emb_row_meta *meta, uint32_t got,
		     uint32_t max)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	uint32_t sbs[WALK_BLOCKS], file[WALK_BLOCKS], nb = 0, end = w->at;
	uint64_t ns;
	int rc;

	/* The run: as many rows as the caller has room for, in at most
	 * WALK_BLOCKS blocks, each still the listed one. */
	while (end < w->nloc && end - w->at < max - got) {
		uint32_t sb = w->loc[end] >> 8;

		if (!nb || sbs[nb - 1] != sb) {
			if (nb == WALK_BLOCKS)
				break;
			sbs[nb] = sb;
			file[nb++] = ts->blk_file[sb];
		}
		end++;
	}
	if (!nb) {
		w->part = PART_OWED;
		return (int)got;
	}
	/* Others may use the shard meanwhile; what they change is checked
	 * below. */
	pthread_mutex_unlock(&s->lock);
	rc = dev_batch(tr->fd, w->buf, file, nb, false, &ns);
	pthread_mutex_lock(&s->lock);
	count(&tr->read_ns, ns);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "tier %s: read: %s", tr->path,
			strerror(-rc));
		return rc;
	}
	count(&tr->blocks_read, nb);
	for (uint32_t b = 0, i = w->at; i < end; i++) {
		uint32_t loc = w->loc[i];
		const struct emb_row_hdr *r;

		while (sbs[b] != loc >> 8)
			b++;
		/* Given back (and maybe written again) since the list was
		 * taken: what was read is not the listed rows. */
		if (ts->blk_gen[loc >> 8] != w->gen[i])
			continue;
		r = (const struct emb_row_hdr *)(const void *)(w->buf +
			(size_t)b * TIER_BLOCK + (size_t)(loc & 0xff) * tr->rec);
		/* Gone meanwhile: back in DRAM (then owed) or erased. */
		if (cold_at(ts, r->id, loc) < 0)
			continue;
		if (clear_ckpt)
			mark_put(tr, ts, loc, MARK_CKPT, false);
		emb__row_put(t, r, got++, ids, rows, meta);
	}
	w->at = end;
	return (int)got;
}

/* Part 3: the owed rows, wherever they are now (gone: nothing). */
static int walk_owed(struct emb_table *t, struct emb_shard *s, uint32_t si,
		     struct emb_tier_walk *w, bool clear_ckpt, uint64_t *ids,
		     float *rows, struct emb_row_meta *meta, uint32_t got,
		     uint32_t max)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];

	/* The set no longer changes: nothing owes in part 3. */
	while (got < max && w->owed_at <= w->owed_n) {
		uint32_t at = w->owed_at++;
		uint64_t id, h;
		int64_t idx;
		const char *src;
		uint32_t mpos;
		int rc = 0;

		if (at < w->owed_n ? !w->owed[at] : !w->owed_zero)
			continue;
		id = at < w->owed_n ? w->owed[at] : 0;
		h = emb_id_hash(id);
		idx = emb__shard_find(t, s, id, h);

		if (idx >= 0) {
			if (clear_ckpt)
				rec_set(s->dirty, (uint32_t)idx, false);
			emb__row_put(t, emb__shard_row(t, s, (uint32_t)idx),
				     got++, ids, rows, meta);
			continue;
		}
		/* Back on the device since: one read, rare. */
		if (!cold_find(t, si, id, h, NULL, w->buf, &mpos, &src, &rc)) {
			if (rc)
				return rc;
			continue;
		}
		if (clear_ckpt)
			mark_put(tr, ts, (uint32_t)ts->map[mpos] - 1,
				 MARK_CKPT, false);
		emb__row_put(t, (const struct emb_row_hdr *)(const void *)src,
			     got++, ids, rows, meta);
	}
	if (w->owed_at > w->owed_n)
		w->part = PART_DONE;
	return (int)got;
}

static int walk_next(struct emb_table *t, struct emb_shard *s, uint32_t si,
		     struct emb_tier_walk *w, bool clear_ckpt, uint64_t *ids,
		     float *rows, struct emb_row_meta *meta, uint32_t got,
		     uint32_t max)
{
	int rc = (int)got;

	if (w->part < 0)
		return w->part; /* an owed id found no memory */
	if (w->part == PART_COLD)
		rc = walk_cold(t, s, si, w, clear_ckpt, ids, rows, meta, got,
			       max);
	else if (w->part == PART_OWED)
		rc = walk_owed(t, s, si, w, clear_ckpt, ids, rows, meta, got,
			       max);
	if (rc >= 0 && w->part < 0)
		rc = w->part;
	return rc;
}

int emb__tier_walk_rest(struct emb_table *t, struct emb_shard *s, uint32_t si,
			struct emb_tier_walk *w, bool clear_ckpt,
			uint64_t *ids, float *rows, struct emb_row_meta *meta,
			uint32_t *got, uint32_t max)
{
	int rc = walk_hot_done(t, si, w);

	while (!rc && *got < max && w->part != PART_DONE) {
		rc = walk_next(t, s, si, w, clear_ckpt, ids, rows, meta, *got,
			       max);
		if (rc >= 0) {
			*got = (uint32_t)rc;
			rc = 0;
		}
	}
	return rc;
}

void emb__tier_track_reset(struct emb_table *t, uint32_t si)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];

	for (uint32_t sb = 0; sb < ts->nblk; sb++)
		memset(ts->blk_mark + ((size_t)sb * 2 + MARK_MOVE) *
					  tr->mark_words,
		       0, tr->mark_words * sizeof(uint64_t));
}

/* ---- eviction of cold rows ---- */

/*
 * The eviction policy's cold side (lifecycle.c calls it after a group,
 * before its hand over the DRAM records). A cold row is looked at
 * through its block's newest access (blk_tick) until the block must be
 * read: only a block whose rows go, or the min_l2 pass's, is read. A
 * read is needed then for the ids (the checkpoint's delta records each
 * one removed, as an erase does) and for the views that still show the
 * rows. The reads of one call go together, under the shard lock, at
 * most EVICT_READS blocks.
 */
#define EVICT_READS  64u /* blocks one call reads at most (RING_DEPTH) */
#define EVICT_SAMPLE 8u	 /* blocks compared per max_rows victim */
#define EVICT_BASE   16u /* blocks the hand looks at a call, at least */
#define EVICT_MAX    8192u

enum { PICK_ALL, PICK_CAP, PICK_CHECK };

uint32_t emb__tier_cold_of(struct emb_table *t, uint32_t si)
{
	return t->tier->sh[si].map_used;
}

uint32_t emb__tier_stamp(struct emb_table *t, uint32_t si)
{
	struct tier_shard *ts = &t->tier->sh[si];
	uint32_t now =
	    (uint32_t)__atomic_load_n(&t->tier->clock, __ATOMIC_RELAXED);

	for (uint32_t sb = 0; sb < ts->nblk; sb++)
		ts->blk_tick[sb] = now;
	return now;
}

void emb__tier_l2_pass(struct emb_table *t, uint32_t si)
{
	struct tier_shard *ts = &t->tier->sh[si];

	ts->l2_at = 0;
	ts->l2_end = ts->nblk;
	ts->l2_born = __atomic_load_n(&t->tier->blk_clock, __ATOMIC_RELAXED);
}

/* Whether block sb holds rows and none read at or after tick now (a
 * row of the current batch, served from the device). */
static bool blk_evictable(const struct tier_shard *ts, uint32_t sb,
			  uint32_t now)
{
	return ts->blk_live[sb] && (int32_t)(now - ts->blk_tick[sb]) > 0;
}

/*
 * Reads the picked blocks and drops their rows: every live row of a
 * PICK_ALL block, of a PICK_CAP block while *over lasts, and any row
 * the row tests condemn (idle past upto, weaker than min_l2, fewer
 * accesses than min_count). 0 or a read error (nothing dropped then).
 */
static int evict_picked(struct emb_table *t, struct emb_shard *s,
			uint32_t si, const uint32_t *sbs, const uint8_t *why,
			uint32_t n, const struct emb_tier_evict *e,
			uint64_t *over, struct emb_evict_counts *out)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	char *buf = tls_buf((size_t)n * TIER_BLOCK);
	uint32_t file[EVICT_READS];
	uint64_t ns;
	int rc;

	if (!n)
		return 0;
	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		file[i] = ts->blk_file[sbs[i]];
	rc = dev_batch(tr->fd, buf, file, n, false, &ns);
	count(&tr->read_ns, ns);
	if (rc) {
		emb_log(EMB_LOG_ERROR, "tier %s: read: %s", tr->path,
			strerror(-rc));
		return rc;
	}
	count(&tr->blocks_read, n);
	for (uint32_t i = 0; i < n; i++) {
		const char *b = buf + (size_t)i * TIER_BLOCK;

		for (uint32_t k = 0; k < tr->per_block; k++) {
			const struct emb_row_hdr *r =
			    (const void *)(b + (size_t)k * tr->rec);
			uint32_t loc = sbs[i] << 8 | k;
			uint64_t *c = NULL;
			int64_t at;

			/* A slot whose row left (or never was) has no entry
			 * for its location: locations are not reused before
			 * the block is given back. */
			at = cold_at(ts, r->id, loc);
			/* A held slot's rows stay, as in DRAM (a move or a
			 * second writer: docs/replication.md). */
			if (at < 0 || emb__evict_held(t, r->id))
				continue;
			if (why[i] == PICK_ALL)
				c = &out->ttl;
			else if (why[i] == PICK_CAP && *over)
				c = &out->cap;
			else if (e->idle &&
				 (int32_t)(r->last_step - e->upto) <= 0)
				c = &out->ttl;
			else if (e->min_l2 > 0.0f &&
				 emb__row_l2(t, r) < e->min_l2)
				c = &out->l2;
			else if ((r->count & ~EMB_ROW_FREE) < e->min_count)
				c = &out->count;
			if (!c)
				continue;
			if (*over)
				(*over)--; /* any row gone brings the shard under */
			/* As an erase of a cold row: its walks, marks, block
			 * (given back with its last row), and the delta. */
			cold_drop(t, si, (uint32_t)at, r->id, false, r);
			emb__dirty_erased(s, r->id);
			(*c)++;
		}
	}
	return 0;
}

int emb__tier_evict(struct emb_table *t, struct emb_shard *s, uint32_t si,
		    const struct emb_tier_evict *e,
		    struct emb_evict_counts *out)
{
	struct emb_tier *tr = t->tier;
	struct tier_shard *ts = &tr->sh[si];
	uint32_t sbs[EVICT_READS], best = UINT32_MAX, sampled = 0, n = 0;
	uint8_t why[EVICT_READS];
	uint64_t over = e->over, left = e->over, visits = EVICT_BASE, v;
	int rc;

	if (!ts->map_used)
		return 0;
	/* As the DRAM hand's budget (lifecycle.c): every block twice per
	 * ttl steps, and the blocks sampled for the victims over the cap. */
	if (e->ttl_steps) {
		v = 2 * (uint64_t)ts->nblk / e->ttl_steps + EVICT_BASE;
		visits = v > visits ? v : visits;
	}
	if (over) {
		v = 2 * EVICT_SAMPLE * (over / tr->per_block + 1) + EVICT_BASE;
		visits = v > visits ? v : visits;
	}
	if (e->all)
		visits = ts->nblk;
	else if (visits > EVICT_MAX)
		visits = EVICT_MAX;
	if (visits > ts->nblk)
		visits = ts->nblk;
	/* The min_l2 pass first: blocks written before min_l2 was set or
	 * raised, each read once (later ones were checked at demotion). */
	while (e->min_l2 > 0.0f && ts->l2_at < ts->l2_end &&
	       ts->l2_at < ts->nblk && n < EVICT_READS / 2) {
		uint32_t sb = ts->l2_at;

		if (ts->blk_live[sb] && ts->blk_born[sb] <= ts->l2_born) {
			if (!blk_evictable(ts, sb, e->now))
				break; /* read by this batch: the next one */
			sbs[n] = sb;
			why[n++] = PICK_CHECK;
		}
		ts->l2_at++;
	}
	for (;;) {
		uint32_t sb;
		bool picked = false;

		if (n == EVICT_READS) {
			if (!e->all)
				break;
			/* emb_table_evict goes round in such reads. */
			rc = evict_picked(t, s, si, sbs, why, n, e, &left, out);
			if (rc)
				return rc;
			n = 0;
		}
		if (!visits-- || !(e->idle || over || e->all))
			break;
		if (ts->ev_hand >= ts->nblk)
			ts->ev_hand = 0;
		sb = ts->ev_hand++;
		for (uint32_t i = 0; i < n; i++)
			picked |= sbs[i] == sb;
		if (picked || !blk_evictable(ts, sb, e->now))
			continue;
		if (e->idle && (int32_t)(ts->blk_tick[sb] - e->upto) <= 0) {
			/* Its newest row is idle past ttl: all are. */
			sbs[n] = sb;
			why[n++] = PICK_ALL;
			continue;
		}
		if (e->all) {
			/* emb_table_evict's min_count: each row looked at. */
			if (e->min_count) {
				sbs[n] = sb;
				why[n++] = PICK_CHECK;
			}
			continue;
		}
		if (!over)
			continue;
		/* Over the cap: the block of every EVICT_SAMPLE passed whose
		 * newest access is oldest (cold rows are the coldest of the
		 * shard by construction, so they go first). */
		if (best == UINT32_MAX ||
		    (int32_t)(ts->blk_tick[sb] - ts->blk_tick[best]) < 0)
			best = sb;
		if (++sampled == EVICT_SAMPLE || !visits) {
			sbs[n] = best;
			why[n++] = PICK_CAP;
			over = over > ts->blk_live[best]
				   ? over - ts->blk_live[best]
				   : 0;
			best = UINT32_MAX;
			sampled = 0;
		}
	}
	return evict_picked(t, s, si, sbs, why, n, e, &left, out);
}

/* ---- stats ---- */

void emb__tier_stats(struct emb_table *t, struct emb_table_tier_stats *out)
{
	struct emb_tier *tr = t->tier;

	memset(out, 0, sizeof(*out));
	if (!tr)
		return;
	out->rows_cold = __atomic_load_n(&tr->rows_cold, __ATOMIC_RELAXED);
	pthread_mutex_lock(&tr->lock);
	out->file_bytes = (uint64_t)tr->file_blocks * TIER_BLOCK;
	out->free_bytes = (uint64_t)tr->nfree * TIER_BLOCK;
	pthread_mutex_unlock(&tr->lock);
	out->demoted = __atomic_load_n(&tr->demoted, __ATOMIC_RELAXED);
	out->promoted = __atomic_load_n(&tr->promoted, __ATOMIC_RELAXED);
	out->served_cold = __atomic_load_n(&tr->served_cold, __ATOMIC_RELAXED);
	out->blocks_read = __atomic_load_n(&tr->blocks_read, __ATOMIC_RELAXED);
	out->blocks_written =
	    __atomic_load_n(&tr->blocks_written, __ATOMIC_RELAXED);
	out->read_ns = __atomic_load_n(&tr->read_ns, __ATOMIC_RELAXED);
	out->map_bytes = __atomic_load_n(&tr->map_bytes, __ATOMIC_RELAXED);
}
