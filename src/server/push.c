/*
 * src/server/push.c - one PUSH applied, for a PUSH request (handlers.c)
 * and each sub-request of a PUSH_MANY (many.c): the slot fence, the
 * exactly-once claim of its session sequence number, the synchronous-step
 * hold, and the non-finite refusal. It returns a status and a message
 * instead of replying, so both callers answer it their own way; kept apart
 * from both so that neither calls into the other.
 */
#include "server/server_int.h"

#include <stdbool.h>
#include <stdio.h>

#include "common/err.h"
#include "server/session.h"
#include "server/slots.h"
#include "server/sync.h"

int emb__push_one(struct emb_server *s, struct emb_req *req,
		  const struct emb_wire_frame *f, char *msg, size_t msg_len)
{
	struct emb_wire_push_req p;
	struct srv_table *st;
	bool claimed = false;
	const char *why = NULL;
	int rc, held = 0;

	msg[0] = '\0';
	st = emb__tables_pin(s, f->hdr.table_id);
	if (!st)
		return EMB_ENOTABLE;
	rc = emb_wire_push_req_decode(f, st->spec.dim, &p);
	/* Checked against the map before its sequence number is claimed:
	 * a refused push is sent again as it was. */
	if (!rc) {
		held = emb__slots_begin(s->slots, &f->hdr, p.ids, p.n, &why);
		if (held < 0) {
			rc = held;
			held = 0;
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
	emb__slots_end(s->slots, held);
	/* Failed, or held for a synchronous step (and dropped if its
	 * connection goes): either way not applied yet. */
	if (rc != 0 && claimed)
		emb__sessions_undo(s->sessions, p.session, p.seq);
	/* Refused whole, by the store or before a synchronous step. */
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
	emb__tables_unpin(st);
	return rc;
}
