/*
 * src/cluster/sched_state.c - the scheduler's state file: encode, write
 * through a rename, read back with every field checked. Layout in
 * sched_state.h. Pure apart from the file itself; any thread.
 */
#include "cluster/sched_state.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/endian.h"
#include "common/err.h"
#include "common/seal.h"

#define HDR_SIZE  72u
#define NODE_SIZE 272u
#define SEAL_SIZE 8u
/* The largest file: every rank, a dead list as long as the wire allows
 * and the largest map. */
#define FILE_MAX                                                               \
	((uint64_t)HDR_SIZE + (uint64_t)NODE_SIZE * EMB_WIRE_NODES_MAX +       \
	 8ull * EMB_WIRE_NODES_MAX + EMB_WIRE_MAP_CMAP_MAX + 8 + SEAL_SIZE)

static const uint8_t magic[8] = {'E', 'M', 'B', 'S', 'C', 'H', 'D', 0};

static uint64_t seal_of(const uint8_t *b, size_t len)
{
	/* len is a multiple of 8 (the padding sees to it), so of 4 too. */
	return emb_seal(0, len + SEAL_SIZE, b, len);
}

static bool counts_ok(const struct emb_sched_state *st)
{
	return st->server_num && st->server_num <= EMB_WIRE_SERVERS_MAX &&
	       st->worker_num && st->worker_num <= EMB_WIRE_WORKERS_MAX &&
	       st->replicas && st->replicas <= EMB_WIRE_REPLICAS_MAX &&
	       st->replicas <= st->server_num &&
	       st->ndead <= EMB_WIRE_NODES_MAX && st->cluster_id &&
	       (st->state == EMB_CLUSTER_READY ||
		st->state == EMB_CLUSTER_FINISHING);
}

/* The encoded file in a new buffer (*len bytes), or NULL. */
static uint8_t *encode(const struct emb_sched_state *st, size_t *len, int *rc)
{
	uint32_t nn = st->server_num + st->worker_num;
	size_t cl = st->cmap ? emb_cmap_size(st->cmap) : 0;
	size_t body = HDR_SIZE + (size_t)NODE_SIZE * nn + 8u * st->ndead + cl;
	size_t total = (body + 7) / 8 * 8 + SEAL_SIZE;
	uint8_t *b = calloc(1, total), *p;

	*rc = -ENOMEM;
	if (!b)
		return NULL;
	memcpy(b, magic, 8);
	emb_le32_store(b + 8, EMB_SCHED_STATE_VERSION);
	emb_le32_store(b + 12, st->state);
	emb_le64_store(b + 16, st->cluster_id);
	emb_le32_store(b + 24, st->server_num);
	emb_le32_store(b + 28, st->worker_num);
	emb_le32_store(b + 32, st->replicas);
	emb_le32_store(b + 36, st->ndead);
	emb_le32_store(b + 40, st->fill_rank);
	emb_le32_store(b + 44, st->fill_first);
	emb_le32_store(b + 48, st->fill_n);
	emb_le32_store(b + 52, st->fill_fails);
	emb_le64_store(b + 56, st->fill_epoch);
	emb_le32_store(b + 64, (uint32_t)cl);
	emb_le32_store(b + 68, st->fill_rank != EMB_SCHED_STATE_NO_FILL &&
				       st->move
				   ? st->move_from + 1
				   : 0);
	p = b + HDR_SIZE;
	for (uint32_t i = 0; i < nn; i++, p += NODE_SIZE) {
		const struct emb_sched_state_node *n = &st->nodes[i];
		size_t hl = strnlen(n->addr.host, EMB_WIRE_HOST_MAX);

		emb_le32_store(p, n->role);
		emb_le32_store(p + 4, (n->dead ? 1u : 0u) |
					  (n->finished ? 2u : 0u) |
					  (n->draining ? 4u : 0u) |
					  (n->joining ? 8u : 0u) |
					  (n->left ? 16u : 0u));
		emb_le16_store(p + 8, n->addr.port);
		emb_le16_store(p + 10, (uint16_t)hl);
		emb_le32_store(p + 12, n->pid);
		memcpy(p + 16, n->addr.host, hl);
	}
	for (uint32_t i = 0; i < st->ndead; i++, p += 8) {
		emb_le32_store(p, st->dead[i].role);
		emb_le32_store(p + 4, st->dead[i].rank);
	}
	if (cl && emb_cmap_encode(st->cmap, p, cl) != (int64_t)cl) {
		free(b);
		*rc = EMB_EBADARG;
		return NULL;
	}
	emb_le64_store(b + total - SEAL_SIZE, seal_of(b, total - SEAL_SIZE));
	*len = total;
	*rc = 0;
	return b;
}

static int write_all(int fd, const uint8_t *b, size_t len)
{
	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

int emb_sched_state_save(const char *path, const struct emb_sched_state *st)
{
	char tmp[PATH_MAX];
	uint8_t *b;
	size_t len = 0;
	int fd, rc;

	if (!path || !st || !counts_ok(st) || !st->nodes ||
	    (st->ndead && !st->dead) ||
	    (st->move && st->fill_rank != EMB_SCHED_STATE_NO_FILL &&
	     (st->move_from >= st->server_num ||
	      st->move_from == st->fill_rank)))
		return EMB_EBADARG;
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	b = encode(st, &len, &rc);
	if (!b)
		return rc;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out_free;
	}
	rc = write_all(fd, b, len);
	if (close(fd) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
out_free:
	free(b);
	return rc;
}

/* Reads the whole file into a new buffer: 0, or a negative errno. */
static int slurp(const char *path, uint8_t **out, size_t *len)
{
	struct stat sb;
	uint8_t *b;
	size_t at = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb)) {
		rc = -errno;
		goto out_close;
	}
	if (sb.st_size < (off_t)(HDR_SIZE + SEAL_SIZE) ||
	    (uint64_t)sb.st_size > FILE_MAX) {
		rc = EMB_ESCHEDSTATE;
		goto out_close;
	}
	b = malloc((size_t)sb.st_size);
	if (!b) {
		rc = -ENOMEM;
		goto out_close;
	}
	while (at < (size_t)sb.st_size) {
		ssize_t n = read(fd, b + at, (size_t)sb.st_size - at);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : EMB_ESCHEDSTATE;
			free(b);
			goto out_close;
		}
		at += (size_t)n;
	}
	*out = b;
	*len = at;
out_close:
	close(fd);
	return rc;
}

/* Checks one node entry into *n; false when it breaks the layout. */
static bool node_decode(const uint8_t *p, uint32_t want_role,
			uint32_t version, struct emb_sched_state_node *n)
{
	uint32_t flags = emb_le32_load(p + 4);
	uint32_t hl = emb_le16_load(p + 10);
	/* Version 1 knew dead and finished only; the move flags are a
	 * server's. */
	uint32_t known = version == 1 ? 3u
			 : want_role == EMB_ROLE_SERVER ? 31u
							: 3u;

	memset(n, 0, sizeof(*n));
	n->role = emb_le32_load(p);
	if ((n->role && n->role != want_role) || (flags & ~known) ||
	    hl > EMB_WIRE_HOST_MAX)
		return false;
	for (uint32_t i = hl; i < EMB_WIRE_HOST_MAX + 1; i++)
		if (p[16 + i])
			return false;
	memcpy(n->addr.host, p + 16, hl);
	if (strlen(n->addr.host) != hl)
		return false;
	n->addr.port = emb_le16_load(p + 8);
	if (n->role == EMB_ROLE_SERVER && (!hl || !n->addr.port))
		return false;
	n->dead = flags & 1;
	n->finished = flags & 2;
	n->draining = flags & 4;
	n->joining = flags & 8;
	n->left = flags & 16;
	/* Gone means dead; a server is never drained and given slots at
	 * once. */
	if ((n->left && !n->dead) || (n->draining && n->joining))
		return false;
	n->pid = emb_le32_load(p + 12);
	return true;
}

int emb_sched_state_load(const char *path, struct emb_sched_state *st)
{
	uint8_t *b = NULL, *p;
	size_t len = 0, body;
	uint32_t nn, cl, version, from1;
	int rc;

	memset(st, 0, sizeof(*st));
	rc = slurp(path, &b, &len);
	if (rc)
		return rc;
	rc = EMB_ESCHEDSTATE;
	version = emb_le32_load(b + 8);
	from1 = emb_le32_load(b + 68);
	if (memcmp(b, magic, 8) || !version ||
	    version > EMB_SCHED_STATE_VERSION || len % 8 ||
	    emb_le64_load(b + len - SEAL_SIZE) != seal_of(b, len - SEAL_SIZE) ||
	    (version == 1 && from1))
		goto err;
	st->state = emb_le32_load(b + 12);
	st->cluster_id = emb_le64_load(b + 16);
	st->server_num = emb_le32_load(b + 24);
	st->worker_num = emb_le32_load(b + 28);
	st->replicas = emb_le32_load(b + 32);
	st->ndead = emb_le32_load(b + 36);
	st->fill_rank = emb_le32_load(b + 40);
	st->fill_first = emb_le32_load(b + 44);
	st->fill_n = emb_le32_load(b + 48);
	st->fill_fails = emb_le32_load(b + 52);
	st->fill_epoch = emb_le64_load(b + 56);
	st->move = from1 != 0;
	st->move_from = from1 ? from1 - 1 : 0;
	cl = emb_le32_load(b + 64);
	if (!counts_ok(st) || cl > EMB_WIRE_MAP_CMAP_MAX ||
	    (st->replicas > 1) != (cl > 0))
		goto err;
	nn = st->server_num + st->worker_num;
	body = HDR_SIZE + (size_t)NODE_SIZE * nn + 8u * st->ndead + cl;
	if ((body + 7) / 8 * 8 + SEAL_SIZE != len)
		goto err;
	if (st->fill_rank != EMB_SCHED_STATE_NO_FILL &&
	    (st->fill_rank >= st->server_num || !st->fill_n ||
	     st->fill_first >= EMB_NSLOTS ||
	     st->fill_n > EMB_NSLOTS - st->fill_first || !st->fill_epoch))
		goto err;
	/* A move's source: a server of the job, not its target, and only
	 * with a chunk under way. */
	if (from1 && (st->fill_rank == EMB_SCHED_STATE_NO_FILL ||
		      st->move_from >= st->server_num ||
		      st->move_from == st->fill_rank))
		goto err;
	st->nodes = calloc(nn, sizeof(*st->nodes));
	st->dead = calloc(st->ndead ? st->ndead : 1, sizeof(*st->dead));
	st->cmap = cl ? malloc(sizeof(*st->cmap)) : NULL;
	if (!st->nodes || !st->dead || (cl && !st->cmap)) {
		rc = -ENOMEM;
		goto err;
	}
	p = b + HDR_SIZE;
	for (uint32_t i = 0; i < nn; i++, p += NODE_SIZE)
		if (!node_decode(p,
				 i < st->server_num ? EMB_ROLE_SERVER
						    : EMB_ROLE_WORKER,
				 version, &st->nodes[i]))
			goto err;
	for (uint32_t i = 0; i < st->ndead; i++, p += 8) {
		struct emb_wire_node_ref *d = &st->dead[i];

		d->role = emb_le32_load(p);
		d->rank = emb_le32_load(p + 4);
		if (d->role != EMB_ROLE_SERVER && d->role != EMB_ROLE_WORKER &&
		    d->role != (EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED))
			goto err;
		if (d->rank >= (d->role == EMB_ROLE_WORKER ? st->worker_num
							   : st->server_num))
			goto err;
	}
	if (cl && (emb_cmap_decode(p, cl, st->cmap) ||
		   st->cmap->nservers != st->server_num ||
		   st->cmap->replicas != st->replicas))
		goto err;
	for (p += cl; p < b + len - SEAL_SIZE; p++)
		if (*p)
			goto err;
	free(b);
	return 0;
err:
	free(b);
	emb_sched_state_free(st);
	return rc;
}

void emb_sched_state_free(struct emb_sched_state *st)
{
	if (!st)
		return;
	free(st->nodes);
	free(st->dead);
	free(st->cmap);
	st->nodes = NULL;
	st->dead = NULL;
	st->cmap = NULL;
}
