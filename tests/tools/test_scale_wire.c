/*
 * tests/tools/test_scale_wire.c - the control plane's sizes that
 * docs/scale.md projects from: a HEARTBEAT request and response (with and
 * without dead nodes), a whole CLUSTER_MAP response for 100 and 1000
 * servers at R = 1..3 (the replicated map's tail included, and its
 * version 2 with a fill under way), and how evenly the 4096 slots spread
 * over 100 and 1000 servers, before and after a death. Each size is the
 * real encoder's output, checked against the formula the page states, and
 * printed ("scale-wire: ...") for the page's tables. Single-threaded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/map.h"
#include "proto/wire_cluster.h"
#include "harness.h"

/* Room for the largest frame here: 1000 servers with R = 3 and a fill. */
#define BUF_BYTES (1u << 20)

static _Alignas(8) uint8_t buf[BUF_BYTES];

/* The CLUSTER_MAP response's bytes as docs/scale.md states them: header,
 * worker count and replicas, the slot map, one 264-byte entry a server,
 * and with R > 1 the replicated map (24 + 2 R 4096). With n slots being
 * filled, version 7 lists them: three counts (6 bytes), 4 bytes a slot in
 * the fill table and 10 in the fill starts' (cluster/map.c). */
static uint64_t map_formula(uint32_t S, uint32_t R, uint32_t n)
{
	uint64_t b = 32 + 8 + 2 * 4096 + 264ull * S;

	if (R > 1)
		b += 24 + 2ull * R * 4096 + (n ? 6 + 14ull * n : 0);
	return b;
}

/* Encodes the map the scheduler sends for S servers with R copies (every
 * host as long as "10.0.100.200", which the entry pads anyway); returns
 * the frame's bytes. With filling, one chunk of slots is being filled, as
 * during a recovery; *nfill (may be NULL) gets its slots. */
static int encode_map(uint32_t S, uint32_t R, bool filling, uint32_t *nfill)
{
	struct emb_cmap *m = malloc(sizeof(*m));
	struct emb_wire_node_addr *addrs = calloc(S, sizeof(*addrs));
	static uint16_t slots[EMB_NSLOTS];
	uint8_t *cm = NULL;
	int64_t cml = 0;
	int len = -ENOMEM;

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	CU_ASSERT_PTR_NOT_NULL_FATAL(addrs);
	CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, S, R), 0);
	if (filling) {
		uint32_t first = 0;
		int n;

		/* A dead server 0 replaced: the newcomer takes its rank and
		 * is filled with its first chunk. */
		CU_ASSERT_FATAL(emb_cmap_remove(m, 0, m) == 0);
		n = emb_cmap_fill_next(m, 0, 256, &first);
		CU_ASSERT_FATAL(n > 0);
		CU_ASSERT_EQUAL_FATAL(
		    emb_cmap_fill_begin(m, 0, first, (uint32_t)n, m), n);
		if (nfill)
			*nfill = (uint32_t)n;
	}
	for (uint32_t i = 0; i < S; i++) {
		snprintf(addrs[i].host, sizeof(addrs[i].host), "10.0.%u.%u",
			 100 + i / 250, 1 + i % 250);
		addrs[i].port = 7164;
	}
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++)
		slots[sl] = emb_cmap_primary(m, sl);
	if (R > 1) {
		cm = malloc(emb_cmap_size(m));
		CU_ASSERT_PTR_NOT_NULL_FATAL(cm);
		cml = emb_cmap_encode(m, cm, emb_cmap_size(m));
		CU_ASSERT_FATAL(cml > 0);
	}
	len = emb_wire_cluster_map_encode(buf, sizeof(buf), 7, 1000, R, slots,
					  addrs, S, cm, (uint32_t)cml);
	free(cm);
	free(addrs);
	free(m);
	return len;
}

static void map_sizes(void)
{
	static const uint32_t servers[] = {100, 1000};

	for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++) {
		for (uint32_t R = 1; R <= 3; R++) {
			uint32_t S = servers[i], n = 0;
			int len = encode_map(S, R, false, NULL);

			CU_ASSERT_EQUAL(len, (int)map_formula(S, R, 0));
			printf("scale-wire: map S=%u R=%u bytes=%d\n", S, R,
			       len);
			if (R == 1)
				continue;
			len = encode_map(S, R, true, &n);
			CU_ASSERT_EQUAL(len, (int)map_formula(S, R, n));
			printf("scale-wire: map S=%u R=%u filling slots=%u "
			       "bytes=%d\n",
			       S, R, n, len);
		}
	}
}

static void heartbeat_sizes(void)
{
	struct emb_wire_node_ref dead[16];
	int len;

	len = emb_wire_heartbeat_req_encode(buf, sizeof(buf), 1, 5, 1);
	CU_ASSERT_EQUAL(len, 32 + 16);
	printf("scale-wire: heartbeat request bytes=%d\n", len);
	for (uint32_t i = 0; i < 16; i++)
		dead[i] = (struct emb_wire_node_ref){EMB_ROLE_SERVER, i};
	/* The response lists every node dead so far, 8 bytes each. */
	for (uint32_t n = 0; n <= 16; n += 16) {
		len = emb_wire_heartbeat_resp_encode(
		    buf, sizeof(buf), 1, EMB_CLUSTER_READY, 2, dead, n);
		CU_ASSERT_EQUAL(len, (int)(32 + 8 + 8 * n));
		printf("scale-wire: heartbeat response dead=%u bytes=%d\n", n,
		       len);
	}
}

/* Primary slots of the emptiest and the fullest server of m. */
static void spread(const struct emb_cmap *m, uint32_t *lo, uint32_t *hi)
{
	*lo = EMB_NSLOTS;
	*hi = 0;
	for (uint32_t r = 0; r < m->nservers; r++) {
		uint32_t n = emb_cmap_primary_slots(m, r);

		if (n < *lo)
			*lo = n;
		if (n > *hi)
			*hi = n;
	}
}

/* 4096 slots over S servers: 40-41 each at 100, 4-5 at 1000; after a
 * death at R = 2 its successor serves its own and the dead one's. */
static void slot_spread(void)
{
	static const uint32_t servers[] = {100, 1000};
	struct emb_cmap *m = malloc(sizeof(*m));

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++) {
		uint32_t S = servers[i], lo, hi, next;

		CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, S, 2), 0);
		spread(m, &lo, &hi);
		CU_ASSERT_EQUAL(lo, EMB_NSLOTS / S);
		CU_ASSERT_EQUAL(hi, (EMB_NSLOTS + S - 1) / S);
		printf("scale-wire: slots S=%u primary min=%u max=%u\n", S, lo,
		       hi);
		CU_ASSERT_EQUAL_FATAL(emb_cmap_remove(m, 0, m), 0);
		next = emb_cmap_primary_slots(m, 1);
		CU_ASSERT(next >= 2 * lo && next <= 2 * hi);
		printf(
		    "scale-wire: slots S=%u R=2 after a death successor=%u\n",
		    S, next);
	}
	free(m);
}

/* A replacement for a dead server at R = 2, filled chunk by chunk of at
 * most 256 slots as the scheduler does (docs/replication.md): the chunks
 * and the map epochs the recovery publishes, each of which every node
 * fetches whole. */
static void recovery_epochs(void)
{
	static const uint32_t servers[] = {3, 100, 1000};
	struct emb_cmap *m = malloc(sizeof(*m));

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (size_t i = 0; i < sizeof(servers) / sizeof(servers[0]); i++) {
		uint32_t S = servers[i], first = 0, chunks = 0, slots = 0;
		uint64_t e0;
		int n;

		CU_ASSERT_EQUAL_FATAL(emb_cmap_init(m, S, 2), 0);
		CU_ASSERT_EQUAL_FATAL(emb_cmap_remove(m, 0, m), 0);
		e0 = m->epoch;
		while ((n = emb_cmap_fill_next(m, 0, 256, &first)) > 0) {
			CU_ASSERT_EQUAL_FATAL(
			    emb_cmap_fill_begin(m, 0, first, (uint32_t)n, m),
			    n);
			CU_ASSERT_EQUAL_FATAL(
			    emb_cmap_fill_done(m, 0, first, (uint32_t)n, m), n);
			chunks++;
			slots += (uint32_t)n;
		}
		CU_ASSERT_EQUAL(n, 0);
		/* It was primary of S's share and backup of its
		 * predecessor's: R shares in all. */
		CU_ASSERT(slots >= 2 * (EMB_NSLOTS / S) &&
			  slots <= 2 * ((EMB_NSLOTS + S - 1) / S));
		/* The map from then on keeps each refilled slot's fill
		 * start and its source: 10 bytes a slot, with the three
		 * counts. */
		CU_ASSERT_EQUAL(emb_cmap_size(m), emb_cmap_encoded_size(2) +
						      6 + 10 * (size_t)slots);
		printf("scale-wire: recovery S=%u R=2 slots=%u chunks=%u "
		       "epochs=%llu map_after=%zu\n",
		       S, slots, chunks, (unsigned long long)(m->epoch - e0),
		       emb_cmap_size(m));
	}
	free(m);
}

static const struct emb_test_case cases[] = {
    {"CLUSTER_MAP frames are the stated size", map_sizes},
    {"HEARTBEAT frames are the stated size", heartbeat_sizes},
    {"4096 slots over 100 and 1000 servers", slot_spread},
    {"a recovery's chunks and epochs", recovery_epochs},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	return emb_test_main(argc, argv, "scale_wire", cases);
}
