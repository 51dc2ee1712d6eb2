/*
 * tests/worker/consumer.c - a program outside the tree that uses embstore
 * as a user would: built by install.sh with nothing but
 * `pkg-config --cflags --libs embstore` against an installed copy.
 *
 *   consumer HOST:PORT       connects, creates a table, pulls, pushes and
 *                            checks the rows moved as SGD says; exit 0
 *   consumer --dlopen LIB    loads LIB with dlopen() as an interpreter
 *                            would, and resolves the API; exit 0
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <embstore.h>

static int fail(const char *what, int rc)
{
	fprintf(stderr, "consumer: %s: %s\n", what, emb_strerror(rc));
	return 1;
}

static int use_dlopen(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	const char *(*strerr)(int);

	if (!h) {
		fprintf(stderr, "consumer: dlopen: %s\n", dlerror());
		return 1;
	}
	*(void **)&strerr = dlsym(h, "emb_strerror");
	if (!strerr || !dlsym(h, "emb_client_create") ||
	    !dlsym(h, "emb_version") || !dlsym(h, "emb_err_name") ||
	    !dlsym(h, "emb_last_error") || !dlsym(h, "emb_struct_size") ||
	    !dlsym(h, "emb_cached_table_lookup")) {
		fprintf(stderr, "consumer: dlsym: API symbols missing\n");
		return 1;
	}
	/* Internal symbols stay inside the library. */
	if (dlsym(h, "emb_dedup_create") || dlsym(h, "emb_wire_hdr_encode")) {
		fprintf(stderr, "consumer: internal symbols exported\n");
		return 1;
	}
	printf("dlopen ok: %s\n", strerr(EMB_ENOTABLE));
	dlclose(h);
	return 0;
}

int main(int argc, char **argv)
{
	struct emb_client_opts o = EMB_CLIENT_OPTS_DEFAULT;
	struct emb_table_spec spec = EMB_TABLE_SPEC_DEFAULT;
	struct emb_client *c;
	struct emb_client_table *t;
	uint64_t ids[3] = {7, 1u << 20, 7};
	float before[3 * 4], after[3 * 4], grads[3 * 4];
	int rc;

	if (argc == 3 && !strcmp(argv[1], "--dlopen"))
		return use_dlopen(argv[2]);
	if (argc != 2) {
		fprintf(stderr, "usage: consumer HOST:PORT | --dlopen LIB\n");
		return 2;
	}
	/* The header this was built with is the library it runs with. */
	if (emb_version_number() != EMBSTORE_VERSION_NUMBER ||
	    strcmp(emb_version(), EMBSTORE_VERSION_STRING)) {
		fprintf(stderr, "consumer: header %s, library %s\n",
			EMBSTORE_VERSION_STRING, emb_version());
		return 1;
	}
	spec.name = "consumer";
	spec.dim = 4;
	o.servers = argv[1];
	rc = emb_optim_parse("sgd:lr=0.5", &spec.optim);
	if (!rc)
		rc = emb_init_parse("uniform:-0.1,0.1", &spec.init);
	if (rc)
		return fail("optimizer/initializer", rc);
	rc = emb_client_create(&o, &c);
	if (rc)
		return fail("connect", rc);
	rc = emb_client_table_create(c, &spec, &t);
	if (rc)
		return fail("create", rc);
	rc = emb_client_table_pull(t, ids, 3, before, 0, NULL);
	if (rc)
		return fail("pull", rc);
	for (int i = 0; i < 3 * 4; i++)
		grads[i] = 1.0f;
	rc = emb_client_table_push(t, ids, 3, grads, 0, 0);
	if (!rc)
		rc = emb_client_table_pull(t, ids, 3, after, 0, NULL);
	if (rc)
		return fail("push/pull", rc);
	/* id 7 appears twice: its gradients add up (2 * 0.5). */
	for (int j = 0; j < 4; j++) {
		if (fabsf(after[j] - (before[j] - 1.0f)) > 1e-6f ||
		    fabsf(after[4 + j] - (before[4 + j] - 0.5f)) > 1e-6f ||
		    after[8 + j] != after[j]) {
			fprintf(stderr, "consumer: rows did not move as SGD\n");
			return 1;
		}
	}
	emb_client_table_close(t);
	emb_client_destroy(c);
	printf("consumer ok\n");
	return 0;
}
