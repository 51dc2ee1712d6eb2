/*
 * src/server/lat.h - request latency per op, recorded by the server's loop
 * threads and read by the metrics collector.
 *
 * Each loop thread owns one emb_hist per op and is its only writer, so the
 * data path takes no lock and no locked instruction: a record is a relaxed
 * atomic load and store of each counter. A scrape (any thread) sums the
 * threads' histograms with relaxed atomic loads; it may see a record half
 * made, which costs one value in one scrape and never a torn counter.
 * min and max are not kept (Prometheus has no use for them).
 */
#ifndef EMB_SERVER_LAT_H
#define EMB_SERVER_LAT_H

#include <stdint.h>
#include <string.h>

#include "common/hist.h"
#include "proto/wire.h"

/* The ops whose latency is kept; the rest count as OTHER. */
enum emb_lat_op {
	EMB_LAT_PULL,
	EMB_LAT_PUSH,
	EMB_LAT_ASSIGN,
	EMB_LAT_ERASE,
	EMB_LAT_STATS,
	EMB_LAT_LIST_TABLES,
	EMB_LAT_CREATE_TABLE,
	EMB_LAT_DROP_TABLE,
	EMB_LAT_SET_MODE,
	EMB_LAT_HELLO,
	EMB_LAT_PING,
	EMB_LAT_DUMP,
	EMB_LAT_OTHER,
	EMB_LAT_NOPS,
};

/* The op label ("pull", "push", ...) of i < EMB_LAT_NOPS. */
static inline const char *emb_lat_op_name(uint32_t i)
{
	static const char *const names[EMB_LAT_NOPS] = {
	    "pull",	   "push",	   "assign",	 "erase",    "stats",
	    "list_tables", "create_table", "drop_table", "set_mode", "hello",
	    "ping",	   "dump",	   "other",
	};

	return i < EMB_LAT_NOPS ? names[i] : "other";
}

static inline uint32_t emb_lat_op_of(uint8_t opcode)
{
	switch (opcode) {
	case EMB_OP_PULL:
	case EMB_OP_PULL_MANY:
		return EMB_LAT_PULL;
	case EMB_OP_PUSH:
	case EMB_OP_PUSH_MANY:
		return EMB_LAT_PUSH;
	case EMB_OP_ASSIGN:
		return EMB_LAT_ASSIGN;
	case EMB_OP_ERASE:
		return EMB_LAT_ERASE;
	case EMB_OP_STATS:
		return EMB_LAT_STATS;
	case EMB_OP_LIST_TABLES:
		return EMB_LAT_LIST_TABLES;
	case EMB_OP_CREATE_TABLE:
		return EMB_LAT_CREATE_TABLE;
	case EMB_OP_DROP_TABLE:
		return EMB_LAT_DROP_TABLE;
	case EMB_OP_SET_MODE:
		return EMB_LAT_SET_MODE;
	case EMB_OP_HELLO:
		return EMB_LAT_HELLO;
	case EMB_OP_PING:
		return EMB_LAT_PING;
	case EMB_OP_DUMP_BEGIN:
	case EMB_OP_DUMP_CHUNK:
	case EMB_OP_DUMP_END:
		return EMB_LAT_DUMP;
	default:
		return EMB_LAT_OTHER;
	}
}

static inline void emb__lat_bump(uint64_t *c, uint64_t n)
{
	__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELAXED);
}

/* Adds one value (ns) to h. The owner thread only. */
static inline void emb_lat_record(struct emb_hist *h, uint64_t ns)
{
	if (ns > EMB_HIST_MAX)
		ns = EMB_HIST_MAX;
	emb__lat_bump(&h->buckets[emb_hist_index(ns)], 1);
	emb__lat_bump(&h->sum, ns);
	emb__lat_bump(&h->count, 1);
}

/*
 * Adds what src holds now into dst (the caller's, started with
 * emb_hist_reset()), while src's owner may still record. dst->count is the
 * sum of the buckets read, so the +Inf bucket equals _count. Any thread.
 */
static inline void emb_lat_merge(struct emb_hist *dst,
				 const struct emb_hist *src)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < EMB_HIST_BUCKETS; i++) {
		uint64_t b =
		    __atomic_load_n(&src->buckets[i], __ATOMIC_RELAXED);

		dst->buckets[i] += b;
		n += b;
	}
	dst->count += n;
	dst->sum += __atomic_load_n(&src->sum, __ATOMIC_RELAXED);
}

#endif
