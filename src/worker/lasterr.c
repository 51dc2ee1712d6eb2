/*
 * src/worker/lasterr.c - the calling thread's last error: the code and
 * message of the last public call of this thread that failed
 * (emb_last_error()). Each thread has its own, so threads sharing a client
 * never read each other's. Any thread; no locks but a client's err_lock
 * while its latest server error is read (emb__client_err()).
 */
#include "worker/abi.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#include "worker/client_int.h"
#include "worker/embstore.h"

static _Thread_local struct {
	int rc;	       /* code of the last failed call; 0 = none yet */
	bool fresh;    /* msg was set by emb__err_set() in the current call */
	char msg[512]; /* its message, NUL-terminated */
} last;

void emb__err_set(int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last.msg, sizeof(last.msg), fmt, ap);
	va_end(ap);
	last.rc = rc;
	last.fresh = true;
}

int emb__err(int rc)
{
	if (rc < 0 && !(last.fresh && last.rc == rc)) {
		last.rc = rc;
		snprintf(last.msg, sizeof(last.msg), "%s", emb_strerror(rc));
	}
	last.fresh = false;
	return rc;
}

int emb_last_error(char *buf, size_t cap)
{
	if (buf && cap)
		snprintf(buf, cap, "%s", last.msg);
	return last.rc;
}

int emb__client_err(struct emb_client *c, int rc)
{
	if (rc < 0 && c) {
		pthread_mutex_lock(&c->err_lock);
		if (c->last_status == rc && c->last_msg[0])
			emb__err_set(rc, "%s", c->last_msg);
		pthread_mutex_unlock(&c->err_lock);
	}
	return emb__err(rc);
}
