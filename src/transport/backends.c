/*
 * src/transport/backends.c - the transports built into this binary, by
 * name: emb_transport_create(), _available() and _usable(). The one file
 * that names every back-end's vtable, so that the rest of the module
 * reaches a back-end only through the vtable of a transport it holds.
 * Any thread; each call opens its own transport.
 */
#include "transport/transport_int.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const struct emb_transport_ops *find_ops(const char *name)
{
	if (strcmp(name, "tcp") == 0)
		return &emb__tcp_ops;
#ifdef EMB_HAVE_RDMA
	if (strcmp(name, "rdma") == 0)
		return &emb__rdma_ops;
	if (strcmp(name, "tcp,rdma") == 0)
		return &emb__dual_tcp_ops;
	if (strcmp(name, "rdma,tcp") == 0)
		return &emb__dual_rdma_ops;
#endif
	return NULL;
}

static bool names_rdma(const char *name)
{
	return strcmp(name, "rdma") == 0 || strcmp(name, "tcp,rdma") == 0 ||
	       strcmp(name, "rdma,tcp") == 0;
}

bool emb_transport_available(const char *name)
{
	return name && find_ops(name) != NULL;
}

bool emb_transport_usable(const char *name)
{
	struct emb_transport *tr;

	if (!emb_transport_available(name) ||
	    emb_transport_create(name, NULL, &tr))
		return false;
	emb_transport_destroy(tr);
	return true;
}

int emb_transport_create(const char *name,
			 const struct emb_transport_opts *opts,
			 struct emb_transport **out)
{
	const struct emb_transport_ops *ops;
	struct emb_transport_opts o = EMB_TRANSPORT_OPTS_DEFAULT;

	if (!name || !out)
		return -EINVAL;
	ops = find_ops(name);
	if (!ops)
		return names_rdma(name) ? -ENODEV : -EINVAL;
	if (opts)
		o = *opts;
	return ops->create(&o, out);
}
