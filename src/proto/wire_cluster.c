/*
 * src/proto/wire_cluster.c - encoders and checked decoders of the cluster
 * messages (layouts in wire_cluster.h). Pure functions, thread-safe.
 */
#include "proto/wire_cluster.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "proto/wire_int.h"

const char *emb_role_name(uint32_t role)
{
	switch (role) {
	case EMB_ROLE_SCHEDULER:
		return "scheduler";
	case EMB_ROLE_SERVER:
		return "server";
	case EMB_ROLE_WORKER:
		return "worker";
	default:
		return "?";
	}
}

static bool node_role(uint32_t role)
{
	return role == EMB_ROLE_SERVER || role == EMB_ROLE_WORKER;
}

/* A dead list entry's role: a node's, or a replaced server's. */
static bool dead_role(uint32_t role)
{
	return node_role(role) ||
	       role == (EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED);
}

/* Host names and numeric addresses: printable ASCII without spaces. */
static bool host_ok(const char *h, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (h[i] <= ' ' || h[i] > '~')
			return false;
	return true;
}

/* Cluster frames carry no flags, table id or status. */
static void put_hdr(void *buf, uint8_t op, uint64_t req_id, uint32_t count,
		    uint32_t payload_len)
{
	emb__wire_put_hdr(buf, op, 0, req_id, 0, count, payload_len, 0);
}

/* Cluster requests have no flags, no table, no status. */
static int check_req(const struct emb_wire_frame *f, uint8_t op)
{
	if (!f || f->hdr.opcode != op)
		return EMB_EBADARG;
	if (f->hdr.status || f->hdr.flags || f->hdr.table_id)
		return EMB_EBADFRAME;
	return 0;
}

/* A successful cluster response: no flags and no table. */
static int check_cluster_resp(const struct emb_wire_frame *f, uint8_t op)
{
	int rc = emb__wire_check_resp(f, op);

	if (rc == 0 && f->hdr.table_id)
		return EMB_EBADFRAME;
	return rc;
}

/* ---- encoders -------------------------------------------------------- */

int emb_wire_register_req_encode(void *buf, size_t cap, uint64_t req_id,
				 uint32_t role, uint16_t port, uint32_t pid,
				 const char *host)
{
	size_t hl = host ? strlen(host) : 0;
	uint8_t *p = buf;
	uint32_t plen;

	if (!node_role(role) || hl > EMB_WIRE_HOST_MAX || !host_ok(host, hl))
		return EMB_EBADARG;
	plen = 16 + (uint32_t)hl;
	if (!p || cap < EMB_WIRE_HDR_SIZE + plen)
		return -ENOSPC;
	put_hdr(p, EMB_OP_REGISTER, req_id, 0, plen);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, role);
	emb_le16_store(p + 4, port);
	emb_le16_store(p + 6, (uint16_t)hl);
	emb_le32_store(p + 8, pid);
	emb_le32_store(p + 12, 0);
	if (hl)
		memcpy(p + 16, host, hl);
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

int emb_wire_rejoin_req_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_register_req *r)
{
	char host[EMB_WIRE_HOST_MAX + 1];
	uint8_t *p = buf;
	int len;

	if (!r || r->host_len > EMB_WIRE_HOST_MAX || r->cluster_id == 0 ||
	    r->rank >= (r->role == EMB_ROLE_SERVER ? EMB_WIRE_SERVERS_MAX
						   : EMB_WIRE_WORKERS_MAX))
		return EMB_EBADARG;
	memcpy(host, r->host ? r->host : "", r->host_len);
	host[r->host_len] = '\0';
	if (strlen(host) != r->host_len)
		return EMB_EBADARG;
	if (cap < EMB_WIRE_HDR_SIZE + 16 + r->host_len + EMB_WIRE_REJOIN_SIZE)
		return -ENOSPC;
	len = emb_wire_register_req_encode(buf, cap, req_id, r->role, r->port,
					   r->pid, host);
	if (len < 0)
		return len;
	put_hdr(p, EMB_OP_REGISTER, req_id, 0,
		16 + r->host_len + EMB_WIRE_REJOIN_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p + 12, EMB_WIRE_REGISTER_REJOIN);
	p += 16 + r->host_len;
	emb_le32_store(p, r->rank);
	emb_le32_store(p + 4, 0);
	emb_le64_store(p + 8, r->cluster_id);
	emb_le64_store(p + 16, r->map_epoch);
	return len + (int)EMB_WIRE_REJOIN_SIZE;
}

static bool register_resp_ok(const struct emb_wire_register_resp *r)
{
	if (!node_role(r->role) || r->server_num == 0 ||
	    r->server_num > EMB_WIRE_SERVERS_MAX || r->worker_num == 0 ||
	    r->worker_num > EMB_WIRE_WORKERS_MAX || r->hb_timeout_ms == 0)
		return false;
	return r->rank <
	       (r->role == EMB_ROLE_SERVER ? r->server_num : r->worker_num);
}

int emb_wire_register_resp_encode(void *buf, size_t cap, uint64_t req_id,
				  const struct emb_wire_register_resp *r)
{
	uint8_t *p = buf;

	if (!r || !register_resp_ok(r))
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_REGISTER_RESP_SIZE)
		return -ENOSPC;
	put_hdr(p, EMB_OP_REGISTER | EMB_OP_RESPONSE_BIT, req_id, 0,
		EMB_WIRE_REGISTER_RESP_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, r->role);
	emb_le32_store(p + 4, r->rank);
	emb_le32_store(p + 8, r->node_id);
	emb_le32_store(p + 12, r->server_num);
	emb_le32_store(p + 16, r->worker_num);
	emb_le32_store(p + 20, r->hb_timeout_ms);
	emb_le64_store(p + 24, r->cluster_id);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_REGISTER_RESP_SIZE);
}

int emb_wire_node_req_encode(void *buf, size_t cap, uint8_t op, uint64_t req_id,
			     uint32_t node_id)
{
	uint8_t *p = buf;

	if (op != EMB_OP_CLUSTER_MAP && op != EMB_OP_FINISH)
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_NODE_REQ_SIZE)
		return -ENOSPC;
	put_hdr(p, op, req_id, 0, EMB_WIRE_NODE_REQ_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, node_id);
	emb_le32_store(p + 4, 0);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_NODE_REQ_SIZE);
}

int emb_wire_map_req_encode(void *buf, size_t cap, uint64_t req_id,
			    uint32_t node_id, uint32_t newer_than)
{
	int len = emb_wire_node_req_encode(buf, cap, EMB_OP_CLUSTER_MAP,
					   req_id, node_id);

	if (len > 0)
		emb_le32_store((uint8_t *)buf + EMB_WIRE_HDR_SIZE + 4,
			       newer_than);
	return len;
}

int emb_wire_finish_req_encode(void *buf, size_t cap, uint64_t req_id,
			       uint32_t node_id, bool hold)
{
	int len = emb_wire_node_req_encode(buf, cap, EMB_OP_FINISH, req_id,
					   node_id);

	if (len > 0)
		emb_le32_store((uint8_t *)buf + EMB_WIRE_HDR_SIZE + 4, hold);
	return len;
}

int emb_wire_cluster_map_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t nworkers, uint32_t replicas,
				const uint16_t *slot_map,
				const struct emb_wire_node_addr *servers,
				uint32_t n, const void *cmap,
				uint32_t cmap_len)
{
	uint8_t *p = buf;
	uint64_t total;

	if (!slot_map || !servers || n == 0 || n > EMB_WIRE_SERVERS_MAX ||
	    nworkers == 0 || nworkers > EMB_WIRE_WORKERS_MAX ||
	    replicas > EMB_WIRE_REPLICAS_MAX || replicas > n ||
	    (replicas > 1 && !cmap_len) || (cmap_len && !cmap) ||
	    cmap_len > EMB_WIRE_MAP_CMAP_MAX)
		return EMB_EBADARG;
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		if (slot_map[i] >= n || servers[slot_map[i]].removed)
			return EMB_EBADARG;
	for (uint32_t i = 0; i < n; i++) {
		size_t hl = strnlen(servers[i].host, sizeof(servers[i].host));

		if (hl == 0 || hl > EMB_WIRE_HOST_MAX ||
		    !host_ok(servers[i].host, hl) || servers[i].port == 0)
			return EMB_EBADARG;
	}
	total = emb_wire_cluster_map_bytes(n) + cmap_len;
	if (!p || cap < total)
		return -ENOSPC;
	put_hdr(p, EMB_OP_CLUSTER_MAP | EMB_OP_RESPONSE_BIT, req_id, n,
		(uint32_t)(total - EMB_WIRE_HDR_SIZE));
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, nworkers);
	/* 1 as 0 without a map: an unreplicated map is the bytes it always
	 * was. A job that may move slots sends its map with 1 copy too. */
	emb_le32_store(p + 4, cmap_len ? (replicas ? replicas : 1) : 0);
	for (uint32_t i = 0; i < EMB_NSLOTS; i++)
		emb_le16_store(p + 8 + 2 * i, slot_map[i]);
	p += EMB_WIRE_MAP_PREFIX_SIZE;
	for (uint32_t i = 0; i < n; i++, p += EMB_WIRE_MAP_ENTRY_SIZE) {
		size_t hl = strlen(servers[i].host);

		memset(p, 0, EMB_WIRE_MAP_ENTRY_SIZE);
		emb_le16_store(p, servers[i].port);
		emb_le16_store(p + 2, (uint16_t)hl);
		emb_le32_store(p + 4,
			       servers[i].removed ? EMB_WIRE_SERVER_REMOVED : 0);
		memcpy(p + 8, servers[i].host, hl);
	}
	if (cmap_len)
		memcpy(p, cmap, cmap_len);
	return (int)total;
}

int emb_wire_heartbeat_req_encode(void *buf, size_t cap, uint64_t req_id,
				  uint32_t node_id, uint64_t seq)
{
	uint8_t *p = buf;

	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_HEARTBEAT_REQ_SIZE)
		return -ENOSPC;
	put_hdr(p, EMB_OP_HEARTBEAT, req_id, 0, EMB_WIRE_HEARTBEAT_REQ_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, node_id);
	emb_le32_store(p + 4, 0);
	emb_le64_store(p + 8, seq);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_HEARTBEAT_REQ_SIZE);
}

static bool state_ok(uint32_t s)
{
	return s >= EMB_CLUSTER_FORMING && s <= EMB_CLUSTER_FINISHING;
}

int emb_wire_heartbeat_resp_encode(void *buf, size_t cap, uint64_t req_id,
				   uint32_t state, uint32_t map_epoch,
				   const struct emb_wire_node_ref *dead,
				   uint32_t n)
{
	uint8_t *p = buf;
	uint32_t plen;

	if (!state_ok(state) || n > EMB_WIRE_NODES_MAX || (n && !dead))
		return EMB_EBADARG;
	for (uint32_t i = 0; i < n; i++)
		if (!dead_role(dead[i].role))
			return EMB_EBADARG;
	plen = 8 + 8 * n;
	if (!p || cap < EMB_WIRE_HDR_SIZE + (size_t)plen)
		return -ENOSPC;
	put_hdr(p, EMB_OP_HEARTBEAT | EMB_OP_RESPONSE_BIT, req_id, n, plen);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, state);
	emb_le32_store(p + 4, map_epoch);
	for (uint32_t i = 0; i < n; i++) {
		emb_le32_store(p + 8 + 8 * i, dead[i].role);
		emb_le32_store(p + 12 + 8 * i, dead[i].rank);
	}
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

static bool name_ok(const char *name, size_t len)
{
	return len >= 1 && len <= EMB_WIRE_BARRIER_NAME_MAX &&
	       !memchr(name, '\0', len);
}

int emb_wire_barrier_req_encode(void *buf, size_t cap, uint64_t req_id,
				uint32_t node_id, const char *name)
{
	size_t nl = name ? strnlen(name, EMB_WIRE_BARRIER_NAME_MAX + 1) : 0;
	uint8_t *p = buf;
	uint32_t plen;

	if (!name_ok(name, nl))
		return EMB_EBADARG;
	plen = 8 + (uint32_t)nl;
	if (!p || cap < EMB_WIRE_HDR_SIZE + plen)
		return -ENOSPC;
	put_hdr(p, EMB_OP_BARRIER, req_id, 0, plen);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, node_id);
	emb_le16_store(p + 4, (uint16_t)nl);
	emb_le16_store(p + 6, 0);
	memcpy(p + 8, name, nl);
	return (int)(EMB_WIRE_HDR_SIZE + plen);
}

int emb_wire_fill_done_req_encode(void *buf, size_t cap, uint64_t req_id,
				  const struct emb_wire_fill_done_req *r)
{
	uint8_t *p = buf;

	if (!r || r->node_id == 0 || r->status > 0 || r->first >= EMB_NSLOTS ||
	    r->n == 0 || r->n > EMB_NSLOTS - r->first || r->epoch == 0)
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_FILL_DONE_REQ_SIZE)
		return -ENOSPC;
	put_hdr(p, EMB_OP_FILL_DONE, req_id, 0, EMB_WIRE_FILL_DONE_REQ_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, r->node_id);
	emb_le32_store(p + 4, (uint32_t)r->status);
	emb_le32_store(p + 8, r->first);
	emb_le32_store(p + 12, r->n);
	emb_le64_store(p + 16, r->epoch);
	emb_le64_store(p + 24, r->rows);
	emb_le64_store(p + 32, r->bytes);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_FILL_DONE_REQ_SIZE);
}

int emb_wire_drain_req_encode(void *buf, size_t cap, uint64_t req_id,
			      uint32_t rank)
{
	uint8_t *p = buf;

	if (rank >= EMB_WIRE_SERVERS_MAX)
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_DRAIN_REQ_SIZE)
		return -ENOSPC;
	put_hdr(p, EMB_OP_DRAIN, req_id, 0, EMB_WIRE_DRAIN_REQ_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, rank);
	emb_le32_store(p + 4, 0);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_DRAIN_REQ_SIZE);
}

int emb_wire_moves_req_encode(void *buf, size_t cap, uint64_t req_id)
{
	if (!buf || cap < EMB_WIRE_HDR_SIZE)
		return -ENOSPC;
	put_hdr(buf, EMB_OP_MOVES, req_id, 0, 0);
	return (int)EMB_WIRE_HDR_SIZE;
}

static bool moves_ok(const struct emb_wire_moves *m)
{
	return m->kind <= EMB_WIRE_MOVE_RECOVERY && m->phase <= 2 &&
	       m->first < EMB_NSLOTS && m->n <= EMB_NSLOTS - m->first &&
	       (m->phase == 0) == (m->n == 0) && m->eta_ms >= -1;
}

int emb_wire_moves_resp_encode(void *buf, size_t cap, uint64_t req_id,
			       const struct emb_wire_moves *m)
{
	uint8_t *p = buf;

	if (!m || !moves_ok(m))
		return EMB_EBADARG;
	if (!p || cap < EMB_WIRE_HDR_SIZE + EMB_WIRE_MOVES_RESP_SIZE)
		return -ENOSPC;
	put_hdr(p, EMB_OP_MOVES | EMB_OP_RESPONSE_BIT, req_id, 0,
		EMB_WIRE_MOVES_RESP_SIZE);
	p += EMB_WIRE_HDR_SIZE;
	emb_le32_store(p, m->kind);
	emb_le32_store(p + 4, m->rank);
	emb_le32_store(p + 8, m->phase);
	emb_le32_store(p + 12, m->first);
	emb_le32_store(p + 16, m->n);
	emb_le32_store(p + 20, m->from);
	emb_le32_store(p + 24, m->to);
	emb_le32_store(p + 28, m->moved);
	emb_le32_store(p + 32, m->left);
	emb_le32_store(p + 36, m->queued);
	emb_le64_store(p + 40, m->elapsed_ms);
	emb_le64_store(p + 48, (uint64_t)m->eta_ms);
	emb_le64_store(p + 56, m->rows);
	emb_le64_store(p + 64, m->bytes);
	return (int)(EMB_WIRE_HDR_SIZE + EMB_WIRE_MOVES_RESP_SIZE);
}

int emb_wire_cluster_ack_encode(void *buf, size_t cap, uint8_t op,
				uint64_t req_id, uint32_t count)
{
	if ((op != EMB_OP_BARRIER && op != EMB_OP_FINISH &&
	     op != EMB_OP_FILL_DONE && op != EMB_OP_DRAIN) ||
	    (op != EMB_OP_BARRIER && count))
		return EMB_EBADARG;
	if (!buf || cap < EMB_WIRE_HDR_SIZE)
		return -ENOSPC;
	put_hdr(buf, op | EMB_OP_RESPONSE_BIT, req_id, count, 0);
	return (int)EMB_WIRE_HDR_SIZE;
}

/* ---- decoders -------------------------------------------------------- */

int emb_wire_register_req_decode(const struct emb_wire_frame *f,
				 struct emb_wire_register_req *out)
{
	const uint8_t *p;
	uint32_t hl, flags, tail;
	int rc = check_req(f, EMB_OP_REGISTER);

	if (rc)
		return rc;
	p = f->payload;
	if (f->hdr.count || f->hdr.payload_len < 16)
		return EMB_EBADFRAME;
	hl = emb_le16_load(p + 6);
	flags = emb_le32_load(p + 12);
	/* A rejoin carries its place after the host; any other flag is
	 * one this version does not know. */
	tail = flags == EMB_WIRE_REGISTER_REJOIN ? EMB_WIRE_REJOIN_SIZE : 0;
	if (hl > EMB_WIRE_HOST_MAX || f->hdr.payload_len != 16 + hl + tail ||
	    (flags & ~EMB_WIRE_REGISTER_REJOIN) ||
	    !node_role(emb_le32_load(p)) || !host_ok((const char *)p + 16, hl))
		return EMB_EBADFRAME;
	memset(out, 0, sizeof(*out));
	out->role = emb_le32_load(p);
	out->port = emb_le16_load(p + 4);
	out->pid = emb_le32_load(p + 8);
	out->host = hl ? (const char *)p + 16 : NULL;
	out->host_len = hl;
	if (tail) {
		const uint8_t *t = p + 16 + hl;
		uint32_t max = out->role == EMB_ROLE_SERVER
				   ? EMB_WIRE_SERVERS_MAX
				   : EMB_WIRE_WORKERS_MAX;

		out->rejoin = true;
		out->rank = emb_le32_load(t);
		out->cluster_id = emb_le64_load(t + 8);
		out->map_epoch = emb_le64_load(t + 16);
		if (out->rank >= max || emb_le32_load(t + 4) ||
		    out->cluster_id == 0)
			return EMB_EBADFRAME;
	}
	return 0;
}

int emb_wire_register_resp_decode(const struct emb_wire_frame *f,
				  struct emb_wire_register_resp *out)
{
	struct emb_wire_register_resp r;
	const uint8_t *p;
	int rc = check_cluster_resp(f, EMB_OP_REGISTER);

	if (rc)
		return rc;
	if (f->hdr.count || f->hdr.payload_len != EMB_WIRE_REGISTER_RESP_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	r.role = emb_le32_load(p);
	r.rank = emb_le32_load(p + 4);
	r.node_id = emb_le32_load(p + 8);
	r.server_num = emb_le32_load(p + 12);
	r.worker_num = emb_le32_load(p + 16);
	r.hb_timeout_ms = emb_le32_load(p + 20);
	r.cluster_id = emb_le64_load(p + 24);
	if (!register_resp_ok(&r))
		return EMB_EBADFRAME;
	*out = r;
	return 0;
}

/* A CLUSTER_MAP or FINISH request's node id and the word after it. */
static int node_req_words(const struct emb_wire_frame *f, uint8_t op,
			  uint32_t *node_id, uint32_t *word)
{
	int rc = check_req(f, op);

	if (rc)
		return rc;
	if (f->hdr.count || f->hdr.payload_len != EMB_WIRE_NODE_REQ_SIZE)
		return EMB_EBADFRAME;
	*node_id = emb_le32_load(f->payload);
	*word = emb_le32_load(f->payload + 4);
	return 0;
}

int emb_wire_node_req_decode(const struct emb_wire_frame *f, uint8_t op,
			     uint32_t *node_id)
{
	uint32_t id, w;
	int rc;

	if (op != EMB_OP_CLUSTER_MAP && op != EMB_OP_FINISH)
		return EMB_EBADARG;
	rc = node_req_words(f, op, &id, &w);
	if (rc)
		return rc;
	if (w)
		return EMB_EBADFRAME;
	*node_id = id;
	return 0;
}

int emb_wire_map_req_decode(const struct emb_wire_frame *f, uint32_t *node_id,
			    uint32_t *newer_than)
{
	return node_req_words(f, EMB_OP_CLUSTER_MAP, node_id, newer_than);
}

int emb_wire_finish_req_decode(const struct emb_wire_frame *f,
			       uint32_t *node_id, bool *hold)
{
	uint32_t id, w;
	int rc = node_req_words(f, EMB_OP_FINISH, &id, &w);

	if (rc)
		return rc;
	if (w > 1)
		return EMB_EBADFRAME;
	*node_id = id;
	*hold = w == 1;
	return 0;
}

int emb_wire_cluster_map_decode(const struct emb_wire_frame *f,
				struct emb_wire_cluster_map *out)
{
	const uint8_t *p, *e;
	uint32_t n, nw, r, tail;
	int rc = check_cluster_resp(f, EMB_OP_CLUSTER_MAP);

	if (rc)
		return rc;
	n = f->hdr.count;
	if (n == 0 || n > EMB_WIRE_SERVERS_MAX ||
	    f->hdr.payload_len <
		emb_wire_cluster_map_bytes(n) - EMB_WIRE_HDR_SIZE)
		return EMB_EBADFRAME;
	tail = f->hdr.payload_len -
	       (uint32_t)(emb_wire_cluster_map_bytes(n) - EMB_WIRE_HDR_SIZE);
	p = f->payload;
	nw = emb_le32_load(p);
	r = emb_le32_load(p + 4);
	/* 0 is one copy and no map; with a map (replicated, or a job that
	 * moves slots) the count is written as it is. Its contents are the
	 * reader's to check (emb_cmap_decode()). */
	if (nw == 0 || nw > EMB_WIRE_WORKERS_MAX ||
	    r > EMB_WIRE_REPLICAS_MAX || r > n || (r > 0) != (tail > 0) ||
	    tail > EMB_WIRE_MAP_CMAP_MAX)
		return EMB_EBADFRAME;
	e = p + EMB_WIRE_MAP_PREFIX_SIZE;
	for (uint32_t i = 0; i < EMB_NSLOTS; i++) {
		uint32_t rank = emb_le16_load(p + 8 + 2 * i);

		if (rank >= n ||
		    emb_le32_load(e + (size_t)rank * EMB_WIRE_MAP_ENTRY_SIZE +
				  4))
			return EMB_EBADFRAME;
	}
	for (uint32_t i = 0; i < n; i++, e += EMB_WIRE_MAP_ENTRY_SIZE) {
		uint32_t hl = emb_le16_load(e + 2);

		if (emb_le16_load(e) == 0 || hl == 0 ||
		    hl > EMB_WIRE_HOST_MAX ||
		    (emb_le32_load(e + 4) & ~EMB_WIRE_SERVER_REMOVED) ||
		    !host_ok((const char *)e + 8, hl) ||
		    !emb__wire_zeros(e + 8 + hl, EMB_WIRE_MAP_ENTRY_SIZE - 8 - hl))
			return EMB_EBADFRAME;
	}
	out->nservers = n;
	out->nworkers = nw;
	out->replicas = r ? r : 1;
	out->slots = p + 8;
	out->entries = p + EMB_WIRE_MAP_PREFIX_SIZE;
	out->cmap = tail ? e : NULL;
	out->cmap_len = tail;
	return 0;
}

uint16_t emb_wire_cluster_map_slot(const struct emb_wire_cluster_map *m,
				   uint32_t slot)
{
	return emb_le16_load(m->slots + 2 * slot);
}

void emb_wire_cluster_map_server(const struct emb_wire_cluster_map *m,
				 uint32_t i, struct emb_wire_node_addr *out)
{
	const uint8_t *e = m->entries + (size_t)i * EMB_WIRE_MAP_ENTRY_SIZE;
	uint32_t hl = emb_le16_load(e + 2);

	out->port = emb_le16_load(e);
	out->removed = emb_le32_load(e + 4) & EMB_WIRE_SERVER_REMOVED;
	memcpy(out->host, e + 8, hl);
	out->host[hl] = '\0';
}

int emb_wire_heartbeat_req_decode(const struct emb_wire_frame *f,
				  uint32_t *node_id, uint64_t *seq)
{
	int rc = check_req(f, EMB_OP_HEARTBEAT);

	if (rc)
		return rc;
	if (f->hdr.count || f->hdr.payload_len != EMB_WIRE_HEARTBEAT_REQ_SIZE ||
	    emb_le32_load(f->payload + 4))
		return EMB_EBADFRAME;
	*node_id = emb_le32_load(f->payload);
	*seq = emb_le64_load(f->payload + 8);
	return 0;
}

int emb_wire_heartbeat_resp_decode(const struct emb_wire_frame *f,
				   struct emb_wire_heartbeat_resp *out)
{
	const uint8_t *p;
	uint32_t n;
	int rc = check_cluster_resp(f, EMB_OP_HEARTBEAT);

	if (rc)
		return rc;
	n = f->hdr.count;
	if (n > EMB_WIRE_NODES_MAX || f->hdr.payload_len != 8 + 8ull * n)
		return EMB_EBADFRAME;
	p = f->payload;
	if (!state_ok(emb_le32_load(p)))
		return EMB_EBADFRAME;
	for (uint32_t i = 0; i < n; i++)
		if (!dead_role(emb_le32_load(p + 8 + 8 * i)))
			return EMB_EBADFRAME;
	out->state = emb_le32_load(p);
	out->map_epoch = emb_le32_load(p + 4);
	out->ndead = n;
	out->dead = n ? p + 8 : NULL;
	return 0;
}

void emb_wire_heartbeat_dead(const struct emb_wire_heartbeat_resp *r,
			     uint32_t i, struct emb_wire_node_ref *out)
{
	out->role = emb_le32_load(r->dead + 8 * (size_t)i);
	out->rank = emb_le32_load(r->dead + 8 * (size_t)i + 4);
}

int emb_wire_barrier_req_decode(const struct emb_wire_frame *f,
				struct emb_wire_barrier_req *out)
{
	const uint8_t *p;
	uint32_t nl;
	int rc = check_req(f, EMB_OP_BARRIER);

	if (rc)
		return rc;
	if (f->hdr.count || f->hdr.payload_len < 8)
		return EMB_EBADFRAME;
	p = f->payload;
	nl = emb_le16_load(p + 4);
	if (f->hdr.payload_len != 8 + nl || emb_le16_load(p + 6) ||
	    !name_ok((const char *)p + 8, nl))
		return EMB_EBADFRAME;
	out->node_id = emb_le32_load(p);
	out->name = (const char *)p + 8;
	out->name_len = nl;
	return 0;
}

int emb_wire_cluster_ack_decode(const struct emb_wire_frame *f, uint8_t op,
				uint32_t *count)
{
	int rc;

	if (op != EMB_OP_BARRIER && op != EMB_OP_FINISH &&
	    op != EMB_OP_FILL_DONE && op != EMB_OP_DRAIN)
		return EMB_EBADARG;
	rc = check_cluster_resp(f, op);
	if (rc)
		return rc;
	if (f->hdr.payload_len || (op != EMB_OP_BARRIER && f->hdr.count))
		return EMB_EBADFRAME;
	if (count)
		*count = f->hdr.count;
	return 0;
}

int emb_wire_fill_done_req_decode(const struct emb_wire_frame *f,
				  struct emb_wire_fill_done_req *out)
{
	const uint8_t *p;
	int rc = check_req(f, EMB_OP_FILL_DONE);

	if (rc)
		return rc;
	if (f->hdr.count ||
	    (f->hdr.payload_len != EMB_WIRE_FILL_DONE_REQ_SIZE &&
	     f->hdr.payload_len != EMB_WIRE_FILL_DONE_REQ_SIZE_V1))
		return EMB_EBADFRAME;
	p = f->payload;
	out->node_id = emb_le32_load(p);
	out->status = (int32_t)emb_le32_load(p + 4);
	out->first = emb_le32_load(p + 8);
	out->n = emb_le32_load(p + 12);
	out->epoch = emb_le64_load(p + 16);
	out->rows = out->bytes = 0;
	if (f->hdr.payload_len == EMB_WIRE_FILL_DONE_REQ_SIZE) {
		out->rows = emb_le64_load(p + 24);
		out->bytes = emb_le64_load(p + 32);
	}
	if (out->node_id == 0 || out->status > 0 ||
	    out->first >= EMB_NSLOTS || out->n == 0 ||
	    out->n > EMB_NSLOTS - out->first || out->epoch == 0)
		return EMB_EBADFRAME;
	return 0;
}

int emb_wire_moves_req_decode(const struct emb_wire_frame *f)
{
	int rc = check_req(f, EMB_OP_MOVES);

	if (rc)
		return rc;
	return f->hdr.count || f->hdr.payload_len ? EMB_EBADFRAME : 0;
}

int emb_wire_moves_resp_decode(const struct emb_wire_frame *f,
			       struct emb_wire_moves *out)
{
	const uint8_t *p;
	int rc = check_cluster_resp(f, EMB_OP_MOVES);

	if (rc)
		return rc;
	if (f->hdr.count || (f->hdr.payload_len != EMB_WIRE_MOVES_RESP_SIZE &&
			     f->hdr.payload_len != EMB_WIRE_MOVES_RESP_SIZE_V1))
		return EMB_EBADFRAME;
	p = f->payload;
	out->kind = emb_le32_load(p);
	out->rank = emb_le32_load(p + 4);
	out->phase = emb_le32_load(p + 8);
	out->first = emb_le32_load(p + 12);
	out->n = emb_le32_load(p + 16);
	out->from = emb_le32_load(p + 20);
	out->to = emb_le32_load(p + 24);
	out->moved = emb_le32_load(p + 28);
	out->left = emb_le32_load(p + 32);
	out->queued = emb_le32_load(p + 36);
	out->elapsed_ms = emb_le64_load(p + 40);
	out->eta_ms = (int64_t)emb_le64_load(p + 48);
	out->rows = out->bytes = 0;
	if (f->hdr.payload_len == EMB_WIRE_MOVES_RESP_SIZE) {
		out->rows = emb_le64_load(p + 56);
		out->bytes = emb_le64_load(p + 64);
	}
	return moves_ok(out) ? 0 : EMB_EBADFRAME;
}

int emb_wire_drain_req_decode(const struct emb_wire_frame *f, uint32_t *rank)
{
	const uint8_t *p;
	int rc = check_req(f, EMB_OP_DRAIN);

	if (rc)
		return rc;
	if (f->hdr.count || f->hdr.payload_len != EMB_WIRE_DRAIN_REQ_SIZE)
		return EMB_EBADFRAME;
	p = f->payload;
	*rank = emb_le32_load(p);
	/* Flags are for later requests: none is known yet. */
	if (*rank >= EMB_WIRE_SERVERS_MAX || emb_le32_load(p + 4))
		return EMB_EBADFRAME;
	return 0;
}
