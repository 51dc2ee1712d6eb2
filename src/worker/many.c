/*
 * src/worker/many.c - one call for the pulls (or pushes) of several tables:
 * what a model with many sparse features does every step.
 *
 * Each table's part is started as its own asynchronous op before any is
 * waited for, so the requests of every table leave in one burst (one per
 * table and server, on the same connections) and the step waits about one
 * round trip instead of one per table.
 * Every op is an ordinary pull or push (op.c): deduplication, routing by
 * server or replica group, reroute on a dead server, EMOVING retries, the
 * deadline, one-sided pulls, and a push's exactly-once session sequence
 * all hold per table exactly as for the single calls.
 *
 * Threads: the caller's; the ops run on the client's loop.
 */
#include "worker/embstore.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "worker/abi.h"
#include "worker/client_int.h"

/* Ops held on the stack; a longer list allocates its handle array. */
#define MANY_STACK 64

/*
 * Element i of the caller's array: its stride is b[0].struct_size (a
 * program built against another embstore.h has another sizeof), and every
 * element must say the same. Copied into *e by the struct_size rule.
 */
static int entry_get(const struct emb_table_batch *b, size_t i,
		     struct emb_table_batch *e)
{
	const char *p = (const char *)b + i * b->struct_size;
	const struct emb_table_batch *src = (const void *)p;
	int rc;

	if (src->struct_size != b->struct_size) {
		emb__err_set(EMB_EBADARG,
			     "batch %zu: struct_size %u differs from "
			     "batch 0's %u",
			     i, src->struct_size, b->struct_size);
		return EMB_EBADARG;
	}
	rc = emb__opts_copy(e, sizeof(*e), src, "emb_table_batch");
	return rc;
}

static int end(struct emb_async **ops, struct emb_async **stack_ops, int rc)
{
	if (ops != stack_ops)
		free(ops);
	return rc;
}

/*
 * Starts every entry's op, then waits for all of them: also after a start
 * failed (the ops started own borrowed buffers until waited for). Returns
 * 0 or the first error in entry order; its message is the thread's last
 * error, as the failing single call would have left it.
 */
static int many_run(struct emb_client *c, const struct emb_table_batch *b,
		    size_t nb, bool push, uint32_t flags, uint64_t step,
		    uint32_t rank)
{
	struct emb_async *stack_ops[MANY_STACK], **ops = stack_ops;
	size_t started = 0, bad = nb;
	char msg[512];
	int rc = 0;

	if (!c || (nb && !b)) {
		emb__err_set(EMB_EBADARG, "%s", !c ? "client is NULL"
						   : "batch array is NULL");
		return EMB_EBADARG;
	}
	if (nb > EMB_CLIENT_MANY_MAX) {
		emb__err_set(EMB_EBADARG, "%zu tables in one call, at most %u",
			     nb, EMB_CLIENT_MANY_MAX);
		return EMB_EBADARG;
	}
	if (!push && (flags & ~(EMB_CLIENT_NOCREATE | EMB_CLIENT_WITH_STATE))) {
		emb__err_set(EMB_EBADARG, "unknown pull flags 0x%x", flags);
		return EMB_EBADARG;
	}
	if (nb > MANY_STACK) {
		ops = calloc(nb, sizeof(*ops));
		if (!ops) {
			emb__err_set(-ENOMEM, "%zu tables: no memory for their "
				     "ops", nb);
			return -ENOMEM;
		}
	}
	for (; started < nb; started++) {
		struct emb_table_batch e;

		rc = entry_get(b, started, &e);
		if (rc)
			break;
		if (!e.table || e.table->c != c) {
			rc = EMB_EBADARG;
			emb__err_set(rc, "batch %zu: %s", started,
				     e.table ? "the table belongs to another "
					       "client"
					     : "table is NULL");
			break;
		}
		if (push)
			rc = emb_client_table_push_async(e.table, e.ids, e.n,
							 e.rows, step, rank,
							 &ops[started]);
		else
			rc = emb_client_table_pull_async(e.table, e.ids, e.n,
							 e.rows, flags, e.found,
							 &ops[started]);
		if (rc)
			break;
	}
	if (rc)
		/* The start error is the call's: keep its message while the
		 * started ops, which borrow the caller's buffers, finish. */
		emb_last_error(msg, sizeof(msg));
	for (size_t i = 0; i < started; i++) {
		emb__op_wait_done(ops[i]);
		if (!rc && bad == nb && ops[i]->status < 0)
			bad = i;
	}
	/* The first failing op is given back last, so that its message (the
	 * server's text, or which server timed out) is the one kept. */
	for (size_t i = 0; i < started; i++)
		if (i != bad)
			emb_async_wait(ops[i]);
	if (bad < nb) {
		struct emb_table_batch e;

		rc = emb_async_wait(ops[bad]);
		emb_last_error(msg, sizeof(msg));
		/* Which of the step's tables failed, unless the message says
		 * so already (a server's EMB_ENOTABLE knows only an id). */
		if (!entry_get(b, bad, &e) && !strstr(msg, e.table->name)) {
			emb__err_set(rc, "table %s: %s", e.table->name, msg);
			return end(ops, stack_ops, rc);
		}
	}
	if (rc)
		emb__err_set(rc, "%s", msg);
	return end(ops, stack_ops, rc);
}

int emb_client_pull_many(struct emb_client *c,
			 const struct emb_table_batch *b, size_t nb,
			 uint32_t flags)
{
	return emb__err(many_run(c, b, nb, false, flags, 0, 0));
}

int emb_client_push_many(struct emb_client *c,
			 const struct emb_table_batch *b, size_t nb,
			 uint64_t step, uint32_t rank)
{
	return emb__err(many_run(c, b, nb, true, 0, step, rank));
}
