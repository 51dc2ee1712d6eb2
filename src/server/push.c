/*
 * src/server/push.c - one PUSH applied, for a PUSH request (handlers.c)
 * and each sub-request of a PUSH_MANY (many.c): the slot fence, the
 * exactly-once claim of its session sequence number, the synchronous-step
 * hold, and the non-finite refusal. It returns a status and a message
 * instead of replying, so both callers answer it their own way; kept apart
 * from both so that neither calls into the other.
 */
#include "server/server_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/rowfmt.h"
#include "server/session.h"
#include "server/slots.h"
#include "server/sync.h"

int emb__push_one(struct emb_server *s, struct emb_req *req,
		  const struct emb_wire_frame *f, char *msg, size_t msg_len)
{
	struct emb_wire_push_req p;
	struct srv_table *st;
	float *wide = NULL;
	bool claimed = false;
	const char *why = NULL;
	int rc, held = 0;

	msg[0] = '\0';
	st = emb__tables_pin(s, f->hdr.table_id);
	if (!st)
		return EMB_ENOTABLE;
	rc = emb_wire_push_req_decode(f, st->spec.dim, &p);
	/* Half-precision gradients, widened to f32 exactly (every fp16 and
	 * bf16 value is an f32 one). */
	if (!rc && p.half) {
		wide = malloc((size_t)p.n * st->spec.dim * sizeof(float) + 1);
		if (!wide) {
			rc = -ENOMEM;
		} else {
			for (uint32_t i = 0; i < p.n; i++)
				emb_rowfmt_decode(
				    p.half,
				    (const uint16_t *)p.half_grads +
					(size_t)i * st->spec.dim,
				    wide + (size_t)i * st->spec.dim,
				    st->spec.dim);
			p.grads = wide;
		}
	}
	/* A replicated push (it carries its map epoch) reaches a backup
	 * that saw none of the primary's pulls: under admission only the
	 * primary knows which ids are rows, so the client must have asked
	 * it (EMB_F_ADMITTED, docs/replication.md). Refused by every holder
	 * alike, before anything is applied. */
	if (!rc && (f->hdr.flags & EMB_F_EPOCH) && !p.admitted &&
	    emb_table_admits(st->t)) {
		rc = EMB_EADMITASK;
		snprintf(msg, msg_len,
			 "table %s has an admission policy: a replicated "
			 "push must first ask the primary which ids are rows "
			 "(a client before replicated admission, or one that "
			 "did not know the policy: it pushes again)",
			 st->spec.name);
		goto out;
	}
	/* The same for a table that numbers its rows (one with eviction):
	 * a replicated push must name the births its primary gave, or a
	 * backup would make rows of births of its own. */
	if (!rc && (f->hdr.flags & EMB_F_EPOCH) && !p.births && p.n &&
	    emb_table_has_births(st->t)) {
		rc = EMB_EADMITASK;
		snprintf(msg, msg_len,
			 "table %s has an eviction policy: a replicated push "
			 "must name each row's birth, asked of the primary "
			 "first (a client before replicated eviction, or one "
			 "that did not know the policy: it pushes again)",
			 st->spec.name);
		goto out;
	}
	/* Births name rows of a table that numbers them (a replicated table
	 * with eviction: docs/replication.md); on another they mean nothing
	 * and the push is refused whole, before anything is applied. */
	if (!rc && p.births && !emb_table_has_births(st->t)) {
		rc = EMB_EBADARG;
		snprintf(msg, msg_len,
			 "table %s does not number its rows: a push naming "
			 "births is for a replicated table with eviction",
			 st->spec.name);
		goto out;
	}
	/* 0xffffffff is no birth (a BIRTHS answer's "no row"): a row given
	 * it would read as absent. */
	for (uint32_t i = 0; !rc && p.births && i < p.n; i++)
		if (p.births[i] == EMB_BIRTH_NONE) {
			rc = EMB_EBADFRAME;
			snprintf(msg, msg_len,
				 "table %s: id %llu is named birth 0xffffffff, "
				 "which is no row's",
				 st->spec.name,
				 (unsigned long long)p.ids[i]);
			goto out;
		}
	/* Checked against the map before its sequence number is claimed:
	 * a refused push is sent again as it was. */
	if (!rc) {
		held = emb__slots_begin(s->slots, &f->hdr, p.ids, p.n, &why);
		if (held < 0) {
			rc = held;
			held = 0;
			/* Unless it was applied here already: a copy sent
			 * again after its connection broke, whose slot this
			 * server has fenced or streamed away since. Applied
			 * before the fence, it went with the stream, and a
			 * refusal would have the client send the slot's new
			 * writer a copy too, applied twice there
			 * (docs/replication.md, "Failures during a move"). */
			if ((rc == EMB_ESTALEMAP || rc == EMB_EMOVING) &&
			    p.session && !p.step_end &&
			    emb__sessions_seen(s->sessions, p.session, p.seq)) {
				rc = 0;
				goto out;
			}
			if (why)
				snprintf(msg, msg_len, "%s", why);
			goto out;
		}
	}
	/* A retried push is applied at most once. A synchronous STEP_END
	 * part is held, not applied, so it is not claimed. */
	if (!rc && p.session && !p.step_end) {
		rc = emb__sessions_claim(s->sessions, p.session, p.seq);
		if (rc == 1) {
			emb__slots_end(s->slots, held);
			rc = 0;
			goto out;
		}
		claimed = rc == 0;
	}
	if (!rc)
		rc = emb__sync_push(st->sync, st->t, &p, req);
	/* Settled before the view is released: a copy sent again meanwhile
	 * waits for this (session.c). Failed, or held for a synchronous step
	 * (and dropped if its connection goes): either way not applied yet,
	 * so the claim is released; once a new view fences or moves the
	 * slot, a copy sent again must not find it and be acknowledged
	 * (above). */
	if (claimed && rc == 0)
		emb__sessions_done(s->sessions, p.session, p.seq);
	else if (claimed)
		emb__sessions_undo(s->sessions, p.session, p.seq);
	emb__slots_end(s->slots, held);
	/* Refused whole, by the store or before a synchronous step. */
	if (rc == EMB_EBADFORMAT && p.half)
		snprintf(msg, msg_len,
			 "table %s is synchronous: send its gradients in f32 "
			 "(half-precision ones are for async and stale:K "
			 "tables)",
			 st->spec.name);
	else if (rc == EMB_EBADFORMAT && p.births)
		snprintf(msg, msg_len,
			 "table %s is synchronous: its pushes name no births "
			 "(a replicated table with eviction is async)",
			 st->spec.name);
	if (rc == EMB_ENONFINITE) {
		emb__count(&s->nonfinite, 1);
		snprintf(msg, msg_len,
			 "table %s: the gradient of id %llu is NaN or "
			 "infinite, or would make its row so; no row was "
			 "changed",
			 st->spec.name,
			 (unsigned long long)emb_table_nonfinite_id());
	}
out:
	free(wide);
	emb__tables_unpin(st);
	return rc;
}
