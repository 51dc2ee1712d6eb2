/*
 * src/worker/batch.c - a data call's batch made ready to send: ids
 * deduplicated, ordered by server (or by replica group), and cut into
 * parts no larger than each server takes, all in the op's scratch.
 *
 * Threads: the caller's, on its own op.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <string.h>

#include "cache/dedup.h"
#include "common/hash.h"
#include "proto/wire.h"
#include "worker/client_int.h"

/* Largest ids per request to server s for rows of stride floats. */
static uint32_t part_max(const struct emb_client *c, uint32_t s,
			 uint32_t stride)
{
	const struct emb_wire_limits *lim = &c->srv[s].lim;
	/* An id, its row, and a pull's found bit or a push's birth. */
	uint64_t per_id = 8 + 4 + 4ull * stride;
	uint64_t room = lim->max_frame_bytes - 2 * EMB_WIRE_HDR_SIZE;
	uint64_t m = room / per_id;

	if (m > lim->max_ids)
		m = lim->max_ids;
	/* Smaller parts pipeline: the server computes one while the previous
	 * one crosses the network and this side scatters the one before. */
	if (m > c->part_ids)
		m = c->part_ids;
	return m ? (uint32_t)m : 1;
}

/*
 * Deduplicates ids and orders the distinct ones by key[slot] (a server,
 * or a replica group), < nkeys. Fills op->pu, op->first, op->next (in
 * op->mem), the partitioned ids in *pids, the distinct index ->
 * partitioned index map in *ppos, the id -> distinct index map in *pinv,
 * and per-key counts in cnt[nkeys].
 * Returns the number of distinct ids, or a negative code.
 */
int64_t emb__batch_prepare(struct emb_async *op, const uint64_t *ids,
			   uint32_t n, const uint16_t *key, uint32_t nkeys,
			   size_t extra, uint64_t **pids, uint32_t **ppos,
			   uint32_t **pinv, uint32_t *cnt, void **extra_out)
{
	struct emb_client *c = op->c;
	uint64_t *uniq;
	uint32_t *inv, *srv_of, *start;
	size_t bytes;
	int64_t nu;
	char *m;
	int rc;

	bytes = (size_t)n * (8 + 8 + 4 + 4 + 4 + 4 + 4 + 4) +
		(size_t)(nkeys + 1) * 4 + extra + 64;
	if (emb__op_mem(op, bytes))
		return -ENOMEM;
	m = op->mem;
	uniq = (uint64_t *)(void *)m;
	*pids = uniq + n;
	inv = (uint32_t *)(void *)(*pids + n);
	*pinv = inv;
	*ppos = inv + n;
	srv_of = *ppos + n;
	op->pu = srv_of + n;
	op->first = op->pu + n;
	op->next = op->first + n;
	start = op->next + n;
	*extra_out =
	    (void *)(((uintptr_t)(start + nkeys + 1) + 63) & ~(uintptr_t)63);

	if (n > op->dedup_max) {
		/* Sized for this batch and then some, like emb__op_grow(). */
		uint32_t max = n > (1u << 29) ? n : n + n / 2;

		emb_dedup_destroy(op->dedup);
		op->dedup = NULL;
		op->dedup_max = 0;
		rc = emb_dedup_create(max, &op->dedup);
		if (rc)
			return rc;
		op->dedup_max = max;
	}
	nu = emb_dedup_run(op->dedup, ids, n, uniq, inv);
	if (nu < 0)
		return nu;

	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		srv_of[u] = key[emb_id_slot(uniq[u])];
		cnt[srv_of[u]]++;
	}
	start[0] = 0;
	for (uint32_t s = 0; s < nkeys; s++)
		start[s + 1] = start[s] + cnt[s];
	for (uint32_t u = 0; u < (uint32_t)nu; u++) {
		uint32_t pos = start[srv_of[u]]++;

		(*pids)[pos] = uniq[u];
		op->pu[pos] = u;
		(*ppos)[u] = pos;
		op->first[u] = NONE;
	}
	for (uint32_t i = n; i-- > 0;) {
		op->next[i] = op->first[inv[i]];
		op->first[inv[i]] = i;
	}
	/* The ask before a replicated push is no pull or push of its own:
	 * the push counts its ids. */
	if (op->kind != OP_BIRTHS) {
		add(&c->ids_in, n);
		add(&c->ids_sent, (uint64_t)nu);
	}
	return nu;
}

/*
 * Assign and erase: ids in key order as given (last write wins in batch
 * order per server), with their rows when there are any.
 */
int emb__batch_order(struct emb_async *op, const uint64_t *ids, uint32_t n,
		     const float *rows, uint32_t stride,
		     const uint32_t *births, const uint16_t *key,
		     uint32_t nkeys, uint32_t most, uint64_t **pids_out,
		     float **prows_out, uint32_t **pbirths_out)
{
	uint32_t *cnt = op->cnt, *start = cnt + most, *pbirths = NULL;
	float *prows = NULL;
	uint64_t *pids;

	if (emb__op_mem(op, (size_t)n * (8 + (rows ? 4ull * stride : 0) +
					 (births ? 4 : 0)) +
				8))
		return -ENOMEM;
	pids = op->mem;
	if (rows)
		prows = (float *)(void *)(pids + n);
	if (births)
		pbirths = (uint32_t *)(void *)((char *)(pids + n) +
					       (rows ? (size_t)n * stride * 4
						     : 0));
	for (uint32_t i = 0; i < n; i++)
		cnt[key[emb_id_slot(ids[i])]]++;
	for (uint32_t s = 0; s < nkeys; s++)
		start[s + 1] = start[s] + cnt[s];
	for (uint32_t i = 0; i < n; i++) {
		uint32_t pos = start[key[emb_id_slot(ids[i])]]++;

		pids[pos] = ids[i];
		if (rows)
			memcpy(prows + (size_t)pos * stride,
			       rows + (size_t)i * stride,
			       (size_t)stride * sizeof(float));
		if (births)
			pbirths[pos] = births[i];
	}
	*pids_out = pids;
	*prows_out = prows;
	*pbirths_out = pbirths;
	return 0;
}

/*
 * Splits cnt[s] ids per server into parts of at most part_max() ids, all
 * with opcode op and the table's id on each server. A synchronous table's
 * push gives every server at least one part (empty if it has no ids) and
 * flags each server's last part STEP_END. Returns 0 or -ENOMEM.
 */
int emb__batch_parts(struct emb_async *op, const struct emb_client_table *t,
		      const uint32_t *cnt, uint8_t opcode, uint32_t stride)
{
	const bool sync = opcode == EMB_OP_PUSH && t->mode == EMB_MODE_SYNC;
	struct emb_client *c = op->c;
	uint32_t total = 0, k = 0, off = 0;

	for (uint32_t s = 0; s < c->nsrv; s++) {
		uint32_t m = part_max(c, s, stride);

		total += (cnt[s] + m - 1) / m;
		if (sync && cnt[s] == 0)
			total++;
	}
	if (emb__op_parts(op, total))
		return -ENOMEM;
	for (uint32_t s = 0; s < c->nsrv; s++) {
		uint32_t m = part_max(c, s, stride);
		uint32_t done = 0;

		do {
			struct part *p;

			if (done >= cnt[s] && !(sync && cnt[s] == 0))
				break;
			p = &op->parts[k++];
			p->op = op;
			p->req.server = s;
			p->req.first = off + done;
			p->req.n = cnt[s] - done < m ? cnt[s] - done : m;
			p->req.hdr.opcode = opcode;
			p->req.hdr.table_id = t->ids[s];
			p->req.hdr.count = p->req.n;
			p->req.once = sync;
			/* Read under c->map_mu with the map: the
			 * incarnation this map routes to. */
			if (c->cmap)
				p->req.gen = __atomic_load_n(&c->srv[s].gen,
							     __ATOMIC_RELAXED);
			done += m;
			if (sync && done >= cnt[s])
				p->req.hdr.flags = EMB_F_STEP_END;
		} while (done < cnt[s]);
		off += cnt[s];
	}
	op->nparts = total;
	return 0;
}

/* The holders of replica group h (*nh of them) and the most ids a part
 * may carry to every one of them. */
static uint32_t group_part_max(const struct emb_client *c, const uint16_t *h,
			       uint32_t stride, uint32_t *nh)
{
	uint32_t m = UINT32_MAX, n = 0;

	/* A group is a slot's writers: its holders, and during a move
	 * (docs/replication.md, "Moving slots") one more, the server being
	 * filled in a holder's place. */
	for (; n < EMB_CMAP_REPLICAS_MAX && h[n] != EMB_CMAP_NONE; n++)
		if (part_max(c, h[n], stride) < m)
			m = part_max(c, h[n], stride);
	*nh = n;
	return m;
}

/*
 * Replicated writes: cnt[g] ids per replica group g, split into parts of
 * at most part_max() ids for every holder, and each part made once per
 * holder, copies side by side (lead, nrep). Under c->map_mu. 0, -ENOMEM,
 * or -EOPNOTSUPP for a synchronous table's push (its per-server step
 * ends are not replicated).
 */
int emb__batch_parts_rep(struct emb_async *op,
			  const struct emb_client_table *t,
			  const uint32_t *cnt, uint8_t opcode, uint32_t stride)
{
	struct emb_client *c = op->c;
	uint32_t total = 0, k = 0, off = 0;

	if (opcode == EMB_OP_PUSH && t->mode == EMB_MODE_SYNC)
		return -EOPNOTSUPP;
	for (uint32_t g = 0; g < c->ngroups; g++) {
		uint32_t nh, m = group_part_max(c, c->groups[g], stride, &nh);

		total += (cnt[g] + m - 1) / m * nh;
	}
	if (emb__op_parts(op, total))
		return -ENOMEM;
	op->tids = t->ids;
	op->stride = stride;
	for (uint32_t g = 0; g < c->ngroups; g++) {
		const uint16_t *h = c->groups[g];
		uint32_t nh, m = group_part_max(c, h, stride, &nh);

		for (uint32_t done = 0; done < cnt[g]; done += m) {
			uint32_t lead = k;

			for (uint32_t j = 0; j < nh; j++) {
				struct part *p = &op->parts[k++];

				p->op = op;
				p->req.server = h[j];
				p->req.first = off + done;
				p->req.n =
				    cnt[g] - done < m ? cnt[g] - done : m;
				p->req.hdr.opcode = opcode;
				p->req.hdr.table_id = t->ids[h[j]];
				p->req.hdr.count = p->req.n;
				p->req.gen = __atomic_load_n(&c->srv[h[j]].gen,
							     __ATOMIC_RELAXED);
				p->rep.lead = lead;
				p->rep.nrep = nh;
				p->rep.epoch = c->map_epoch;
				p->rep.routed = c->map_epoch;
				p->rep.fixed = c->map_epoch;
			}
		}
		off += cnt[g];
	}
	op->nparts = total;
	return 0;
}

