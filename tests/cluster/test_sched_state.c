/*
 * tests/cluster/test_sched_state.c - the scheduler's state file: a job's
 * ranks, deaths, map and fill survive the round trip; a missing file is a
 * first start; a damaged or foreign file is refused, never half-read.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/sched_state.h"
#include "common/err.h"
#include "harness.h"

static struct emb_sched_state_node nodes[5];
static struct emb_wire_node_ref dead[1] = {{EMB_ROLE_SERVER, 1}};
static struct emb_cmap cmap;

/* 3 servers, 2 workers, R = 2; server 1 died, server 2 being filled. */
static struct emb_sched_state job(void)
{
	struct emb_sched_state st = {
	    .state = EMB_CLUSTER_READY,
	    .cluster_id = 0xfeedf00d,
	    .server_num = 3,
	    .worker_num = 2,
	    .replicas = 2,
	    .nodes = nodes,
	    .dead = dead,
	    .ndead = 1,
	    .cmap = &cmap,
	    .fill_rank = 2,
	    .fill_first = 256,
	    .fill_n = 256,
	    .fill_fails = 1,
	    .fill_epoch = 4,
	};

	memset(nodes, 0, sizeof(nodes));
	for (int i = 0; i < 3; i++) {
		nodes[i].role = EMB_ROLE_SERVER;
		nodes[i].pid = 100 + (uint32_t)i;
		snprintf(nodes[i].addr.host, sizeof(nodes[i].addr.host),
			 "10.0.0.%d", i + 1);
		nodes[i].addr.port = (uint16_t)(7000 + i);
	}
	nodes[1].dead = true;
	nodes[3].role = nodes[4].role = EMB_ROLE_WORKER;
	nodes[4].finished = true;
	CU_ASSERT_EQUAL(emb_cmap_init(&cmap, 3, 2), 0);
	CU_ASSERT(emb_cmap_remove(&cmap, 1, &cmap) >= 0);
	CU_ASSERT(emb_cmap_fill_begin(&cmap, 2, 256, 256, &cmap) >= 0);
	return st;
}

static char *path_in(const char *dir)
{
	static char p[512];

	snprintf(p, sizeof(p), "%s/sched.state", dir);
	return p;
}

static void test_round_trip(void)
{
	char *dir = emb_test_tmpdir(), *p = path_in(dir), tmp[600];
	struct emb_sched_state in = job(), out;

	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), -ENOENT);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	snprintf(tmp, sizeof(tmp), "%s.tmp", p);
	CU_ASSERT_NOT_EQUAL(access(tmp, F_OK), 0);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_load(p, &out), 0);
	CU_ASSERT_EQUAL(out.state, EMB_CLUSTER_READY);
	CU_ASSERT_EQUAL(out.cluster_id, 0xfeedf00d);
	CU_ASSERT_EQUAL(out.server_num, 3);
	CU_ASSERT_EQUAL(out.worker_num, 2);
	CU_ASSERT_EQUAL(out.replicas, 2);
	for (int i = 0; i < 5; i++) {
		CU_ASSERT_EQUAL(out.nodes[i].role, nodes[i].role);
		CU_ASSERT_EQUAL(out.nodes[i].dead, nodes[i].dead);
		CU_ASSERT_EQUAL(out.nodes[i].finished, nodes[i].finished);
		CU_ASSERT_EQUAL(out.nodes[i].pid, nodes[i].pid);
		CU_ASSERT_STRING_EQUAL(out.nodes[i].addr.host,
				       nodes[i].addr.host);
		CU_ASSERT_EQUAL(out.nodes[i].addr.port, nodes[i].addr.port);
	}
	CU_ASSERT_EQUAL(out.ndead, 1);
	CU_ASSERT_EQUAL(out.dead[0].role, EMB_ROLE_SERVER);
	CU_ASSERT_EQUAL(out.dead[0].rank, 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(out.cmap);
	CU_ASSERT_EQUAL(memcmp(out.cmap, &cmap, sizeof(cmap)), 0);
	CU_ASSERT_EQUAL(out.fill_rank, 2);
	CU_ASSERT_EQUAL(out.fill_first, 256);
	CU_ASSERT_EQUAL(out.fill_n, 256);
	CU_ASSERT_EQUAL(out.fill_fails, 1);
	CU_ASSERT_EQUAL(out.fill_epoch, 4);
	emb_sched_state_free(&out);
	/* A replaced server's entry (a newcomer took its rank) keeps its
	 * flag across a restart. */
	dead[0].role = EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_load(p, &out), 0);
	CU_ASSERT_EQUAL(out.dead[0].role,
			EMB_ROLE_SERVER | EMB_WIRE_ROLE_REPLACED);
	CU_ASSERT_EQUAL(out.dead[0].rank, 1);
	emb_sched_state_free(&out);
	dead[0].role = EMB_ROLE_SERVER;

	/* Unreplicated: no map in the file. */
	in.replicas = 1;
	in.cmap = NULL;
	in.fill_rank = EMB_SCHED_STATE_NO_FILL;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_load(p, &out), 0);
	CU_ASSERT_PTR_NULL(out.cmap);
	CU_ASSERT_EQUAL(out.fill_rank, EMB_SCHED_STATE_NO_FILL);
	emb_sched_state_free(&out);
	emb_test_rmtree(dir);
	free(dir);
}

static void test_refuses_damage(void)
{
	char *dir = emb_test_tmpdir(), *p = path_in(dir);
	struct emb_sched_state in = job(), out;
	FILE *f;
	long size;

	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	f = fopen(p, "r+b");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	/* Any flipped byte, anywhere: header, a node, the map, the seal. */
	for (long at = 0; at < size; at += size / 13 + 1) {
		int c;

		fseek(f, at, SEEK_SET);
		c = fgetc(f);
		fseek(f, at, SEEK_SET);
		fputc(c ^ 0x20, f);
		fflush(f);
		CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), EMB_ESCHEDSTATE);
		CU_ASSERT_PTR_NULL(out.nodes);
		fseek(f, at, SEEK_SET);
		fputc(c, f);
		fflush(f);
	}
	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), 0);
	emb_sched_state_free(&out);
	/* Cut short. */
	CU_ASSERT_EQUAL(truncate(p, size - 8), 0);
	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), EMB_ESCHEDSTATE);
	CU_ASSERT_EQUAL(truncate(p, 10), 0);
	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), EMB_ESCHEDSTATE);
	fclose(f);
	/* Nothing to save that a load would refuse. */
	in.cluster_id = 0;
	CU_ASSERT_EQUAL(emb_sched_state_save(p, &in), EMB_EBADARG);
	in.cluster_id = 1;
	in.state = EMB_CLUSTER_FORMING;
	CU_ASSERT_EQUAL(emb_sched_state_save(p, &in), EMB_EBADARG);
	emb_test_rmtree(dir);
	free(dir);
}

/*
 * A drain or join under way survives the file: which servers drain, join
 * or left, and that the chunk being filled is a move's and from where, so
 * a restarted scheduler goes on with them. A file that says more than a
 * job can mean is refused.
 */
static void test_moves(void)
{
	char *dir = emb_test_tmpdir(), *p = path_in(dir);
	struct emb_sched_state in = job(), out;

	nodes[0].draining = true;
	nodes[1].left = true; /* dead already */
	nodes[2].joining = true;
	in.move = true;
	in.move_from = 0;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_load(p, &out), 0);
	CU_ASSERT(out.nodes[0].draining && !out.nodes[0].joining);
	CU_ASSERT(out.nodes[1].left && out.nodes[1].dead);
	CU_ASSERT(out.nodes[2].joining && !out.nodes[2].draining);
	CU_ASSERT(!out.nodes[3].draining && !out.nodes[3].left);
	CU_ASSERT(out.move);
	CU_ASSERT_EQUAL(out.move_from, 0);
	CU_ASSERT_EQUAL(out.fill_rank, 2);
	emb_sched_state_free(&out);
	/* A recovery's fill: no move. */
	in.move = false;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_load(p, &out), 0);
	CU_ASSERT(!out.move);
	emb_sched_state_free(&out);
	/* Refused: a move from its own target or from no server of the
	 * job, a server gone but alive, one drained and joining at once. */
	in.move = true;
	in.move_from = 2;
	CU_ASSERT_EQUAL(emb_sched_state_save(p, &in), EMB_EBADARG);
	in.move_from = 3;
	CU_ASSERT_EQUAL(emb_sched_state_save(p, &in), EMB_EBADARG);
	in.move_from = 0;
	nodes[0].left = true;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), EMB_ESCHEDSTATE);
	nodes[0].left = false;
	nodes[2].draining = true;
	CU_ASSERT_EQUAL_FATAL(emb_sched_state_save(p, &in), 0);
	CU_ASSERT_EQUAL(emb_sched_state_load(p, &out), EMB_ESCHEDSTATE);
	emb_test_rmtree(dir);
	free(dir);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"a job's ranks, deaths, map and fill round-trip", test_round_trip},
	    {"drains, joins and a move's chunk round-trip", test_moves},
	    {"a damaged or truncated file is refused whole",
	     test_refuses_damage},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "sched_state", cases);
}
