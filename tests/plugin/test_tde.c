/*
 * tests/plugin/test_tde.c - libembstore_tde loaded as TorchRec's dynamic
 * embedding loads an IO plugin: dlopen() of the file, dlsym() of IO_type,
 * IO_Initialize, IO_Finalize, IO_Pull and IO_Push, then pushes and pulls of
 * blobs (weights and optimizer states of several columns) through real
 * servers, compared byte for byte.
 */
#include "plugin/tde_io.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

/* The plugin's entry points, as TDE's registry resolves them. */
struct plugin {
	void *dl;
	const char *type;
	void *(*init)(const char *);
	void (*fini)(void *);
	void (*pull)(void *, struct tde_io_pull_param);
	void (*push)(void *, struct tde_io_push_param);
};

static struct plugin load(void)
{
	const char *path = getenv("EMB_TDE_PLUGIN");
	struct plugin p = {0};
	const char **type;

	CU_ASSERT_PTR_NOT_NULL_FATAL(path);
	p.dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!p.dl)
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
	CU_ASSERT_PTR_NOT_NULL_FATAL(p.dl);
	type = dlsym(p.dl, "IO_type");
	CU_ASSERT_PTR_NOT_NULL_FATAL(type);
	p.type = *type;
	*(void **)&p.init = dlsym(p.dl, "IO_Initialize");
	*(void **)&p.fini = dlsym(p.dl, "IO_Finalize");
	*(void **)&p.pull = dlsym(p.dl, "IO_Pull");
	*(void **)&p.push = dlsym(p.dl, "IO_Push");
	CU_ASSERT_FATAL(p.init && p.fini && p.pull && p.push);
	return p;
}

/* What a pull delivered: per (offset, state), a copy of the bytes. */
struct got {
	uint32_t nslots, nstates;
	uint8_t **data;
	uint32_t *len;
	int *calls;
	int all;
};

static void on_fetched(void *ctx, uint32_t off, uint32_t state, void *data,
		       uint32_t len)
{
	struct got *g = ctx;
	size_t k = (size_t)off * g->nstates + state;

	CU_ASSERT_FATAL(off < g->nslots && state < g->nstates);
	g->calls[k]++;
	g->len[k] = len;
	free(g->data[k]);
	g->data[k] = NULL;
	if (data) {
		g->data[k] = malloc(len);
		memcpy(g->data[k], data, len);
	}
}

static void on_all(void *ctx)
{
	((struct got *)ctx)->all++;
}

static void on_pushed(void *ctx)
{
	(*(int *)ctx)++;
}

static struct got got_new(uint32_t nslots, uint32_t nstates)
{
	struct got g = {.nslots = nslots, .nstates = nstates};
	size_t n = (size_t)nslots * nstates;

	g.data = calloc(n, sizeof(*g.data));
	g.len = calloc(n, sizeof(*g.len));
	g.calls = calloc(n, sizeof(*g.calls));
	return g;
}

static void got_free(struct got *g)
{
	for (size_t k = 0; k < (size_t)g->nslots * g->nstates; k++)
		free(g->data[k]);
	free(g->data);
	free(g->len);
	free(g->calls);
}

/* The value stored for (id, column, state): distinct, exact floats. */
static float val(int64_t id, int64_t col, uint32_t st, uint32_t e)
{
	return (float)(id % 1000) + (float)col * 0.25f + (float)st * 0.0625f +
	       (float)e * 1024.0f;
}

enum { NIDS = 50 };
static const int64_t cols[2] = {0, 3};
static const uint32_t dims[2] = {16, 8}; /* floats per blob, per column */

static void test_round_trip(void)
{
	struct plugin pl = load();
	struct nt_child ch[2];
	char cfg[256], addr[128];
	int64_t ids[NIDS], ask[NIDS + 5];
	uint32_t states[2] = {0, 1};
	uint64_t *offs;
	float *data;
	size_t nf = 0, nb = 0;
	int pushed = 0;
	void *io;

	CU_ASSERT_STRING_EQUAL(pl.type, "embstore");
	nt_child_start(&ch[0], NULL);
	nt_child_start(&ch[1], NULL);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u,127.0.0.1:%u", ch[0].port,
		 ch[1].port);
	snprintf(cfg, sizeof(cfg), "%s/?prefix=t.&timeout_ms=5000", addr);
	io = pl.init(cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(io);

	/* Blobs in TDE's order: id, then column, then state. */
	for (int i = 0; i < NIDS; i++)
		ids[i] = (i % 2 ? -1 : 1) * (int64_t)(i * 7919 + 3);
	offs = calloc((size_t)NIDS * 2 * 2 + 1, sizeof(*offs));
	data = calloc((size_t)NIDS * 2 * 2 * 16, sizeof(*data));
	for (int i = 0; i < NIDS; i++)
		for (int j = 0; j < 2; j++)
			for (int s = 0; s < 2; s++) {
				offs[nb++] = nf * sizeof(float);
				for (uint32_t e = 0; e < dims[j]; e++)
					data[nf++] = val(ids[i], cols[j], states[s], e);
			}
	offs[nb] = nf * sizeof(float);
	pl.push(io, (struct tde_io_push_param){
			.table_name = "emb",
			.num_cols = 2,
			.num_global_ids = NIDS,
			.col_ids = cols,
			.global_ids = ids,
			.num_optimizer_states = 2,
			.state_ids = states,
			.num_offsets = (uint32_t)nb + 1,
			.offsets = offs,
			.data = data,
			.ctx = &pushed,
			.on_push_complete = on_pushed,
		    });
	CU_ASSERT_EQUAL(pushed, 1);

	/* Back, with 5 ids never pushed and a state (2) never pushed. */
	memcpy(ask, ids, sizeof(ids));
	for (int i = 0; i < 5; i++)
		ask[NIDS + i] = 1000000 + i;
	{
		struct got g = got_new((NIDS + 5) * 2, 3);

		pl.pull(io, (struct tde_io_pull_param){
				.table_name = "emb",
				.num_cols = 2,
				.num_global_ids = NIDS + 5,
				.col_ids = cols,
				.global_ids = ask,
				.num_optimizer_states = 3,
				.ctx = &g,
				.on_fetched = on_fetched,
				.on_all_fetched = on_all,
			    });
		CU_ASSERT_EQUAL(g.all, 1);
		for (int i = 0; i < NIDS + 5; i++)
			for (int j = 0; j < 2; j++)
				for (uint32_t s = 0; s < 3; s++) {
					size_t k = ((size_t)i * 2 + (size_t)j) * 3 + s;
					float want[16];

					CU_ASSERT_EQUAL(g.calls[k], 1);
					if (i >= NIDS || s == 2) {
						CU_ASSERT_PTR_NULL(g.data[k]);
						CU_ASSERT_EQUAL(g.len[k], 0);
						continue;
					}
					for (uint32_t e = 0; e < dims[j]; e++)
						want[e] = val(ask[i], cols[j], s, e);
					CU_ASSERT_EQUAL_FATAL(g.len[k],
							      dims[j] * sizeof(float));
					CU_ASSERT(memcmp(g.data[k], want,
							 g.len[k]) == 0);
				}
		got_free(&g);
	}
	pl.fini(io);
	/* Stored on the servers: a new instance reads them back. */
	io = pl.init(cfg);
	CU_ASSERT_PTR_NOT_NULL_FATAL(io);
	{
		struct got g = got_new(2, 1);
		int64_t one = ids[7], col3 = 3;
		float want[8];

		pl.pull(io, (struct tde_io_pull_param){
				.table_name = "emb",
				.num_cols = 1,
				.num_global_ids = 1,
				.col_ids = &col3,
				.global_ids = &one,
				.num_optimizer_states = 1,
				.ctx = &g,
				.on_fetched = on_fetched,
				.on_all_fetched = on_all,
			    });
		for (uint32_t e = 0; e < 8; e++)
			want[e] = val(one, 3, 0, e);
		CU_ASSERT_EQUAL_FATAL(g.len[0], sizeof(want));
		CU_ASSERT(memcmp(g.data[0], want, sizeof(want)) == 0);
		got_free(&g);
	}
	pl.fini(io);
	free(offs);
	free(data);
	nt_child_reap(&ch[0], SIGTERM);
	nt_child_reap(&ch[1], SIGTERM);
	dlclose(pl.dl);
}

static uint16_t closed_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_FATAL(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CU_ASSERT_FATAL(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	close(fd); /* nobody listens there now */
	return ntohs(a.sin_port);
}

static void test_bad_config_and_down_server(void)
{
	struct plugin pl = load();
	char cfg[128];
	struct nt_child ch;

	nt_child_start(&ch, NULL);
	CU_ASSERT_PTR_NULL(pl.init(""));
	CU_ASSERT_PTR_NULL(pl.init("127.0.0.1:70000"));
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u/?bogus=1", ch.port);
	CU_ASSERT_PTR_NULL(pl.init(cfg));
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u/?timeout_ms=x", ch.port);
	CU_ASSERT_PTR_NULL(pl.init(cfg));
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u/?prefix", ch.port);
	CU_ASSERT_PTR_NULL(pl.init(cfg));
	/* A server that is down: refused at once, no hang. */
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u", closed_port());
	CU_ASSERT_PTR_NULL(pl.init(cfg));
	/* And a good one still works. */
	snprintf(cfg, sizeof(cfg), "127.0.0.1:%u/", ch.port);
	{
		void *io = pl.init(cfg);

		CU_ASSERT_PTR_NOT_NULL(io);
		pl.fini(io);
	}
	nt_child_reap(&ch, SIGTERM);
	dlclose(pl.dl);
}

/*
 * The servers die after IO_Initialize: a push can be neither stored nor
 * reported, so once retry_ms has passed the process stops (SIGABRT)
 * without calling on_push_complete, rather than drop rows TDE let go.
 */
static void test_dead_cluster_stops_the_push(void)
{
	struct plugin pl = load();
	struct nt_child ch;
	int to_child[2], to_parent[2], st = 0;
	char cfg[128], c = 0;
	pid_t pid;

	nt_child_start(&ch, NULL);
	snprintf(cfg, sizeof(cfg),
		 "127.0.0.1:%u/?timeout_ms=300&retry_ms=600", ch.port);
	CU_ASSERT_FATAL(pipe(to_child) == 0 && pipe(to_parent) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		int64_t id = 5, col = 0;
		uint32_t state = 0;
		uint64_t offs[2] = {0, 4 * sizeof(float)};
		float row[4] = {1, 2, 3, 4};
		int pushed = 0;
		struct rlimit nocore = {0, 0};
		void *io;

		setrlimit(RLIMIT_CORE, &nocore); /* the abort is expected */
		io = pl.init(cfg);

		if (!io || write(to_parent[1], "r", 1) != 1 ||
		    read(to_child[0], &c, 1) != 1)
			_exit(3);
		pl.push(io, (struct tde_io_push_param){
				.table_name = "dead",
				.num_cols = 1,
				.num_global_ids = 1,
				.col_ids = &col,
				.global_ids = &id,
				.num_optimizer_states = 1,
				.state_ids = &state,
				.num_offsets = 2,
				.offsets = offs,
				.data = row,
				.ctx = &pushed,
				.on_push_complete = on_pushed,
			    });
		_exit(pushed ? 4 : 5); /* reported, or returned without */
	}
	CU_ASSERT_EQUAL(read(to_parent[0], &c, 1), 1);
	nt_child_reap(&ch, SIGKILL);
	CU_ASSERT_EQUAL(write(to_child[1], "k", 1), 1);
	CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
	CU_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
	close(to_child[0]);
	close(to_child[1]);
	close(to_parent[0]);
	close(to_parent[1]);
	dlclose(pl.dl);
}

static const struct emb_test_case cases[] = {
	{"a push the cluster cannot store stops the process after retry_ms, "
	 "never reported complete",
	 test_dead_cluster_stops_the_push},
	{"blobs of two columns and two states round-trip byte for byte; ids "
	 "and states never pushed are reported missing",
	 test_round_trip},
	{"a bad config or a down server fails IO_Initialize, and a good one "
	 "works",
	 test_bad_config_and_down_server},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	return emb_test_main(argc, argv, "plugin", cases);
}
