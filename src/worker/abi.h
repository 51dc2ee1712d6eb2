/*
 * src/worker/abi.h - how the library meets callers built against another
 * embstore.h: sized structs (struct_size, the copy rule of embstore.h) and
 * the calling thread's last error. For the worker's own files; the public
 * side of both is in embstore.h. Thread-safe.
 */
#ifndef EMB_WORKER_ABI_H
#define EMB_WORKER_ABI_H

#include <stddef.h>

/*
 * Copies the caller's sized struct src (its first field, struct_size, says
 * how many bytes it has) into the library's dst of dst_size bytes: the
 * bytes both know, zeros where the caller's struct is shorter, and
 * dst->struct_size = dst_size. type names it ("emb_client_opts") in the
 * error. 0, or -EINVAL (src NULL, or struct_size 0 or below the struct's
 * first published size) or -E2BIG (longer than dst and the bytes dst has
 * no room for are not all zero); both set the thread's last error, and dst
 * is then untouched.
 */
int emb__opts_copy(void *dst, size_t dst_size, const void *src,
		   const char *type);

/*
 * Copies the library's filled struct src (src_size bytes) to the caller's
 * dst: min(dst->struct_size, src_size) bytes, the caller's struct_size
 * kept, and zeros in the rest of a longer caller struct. 0, or -EINVAL
 * (dst NULL or its struct_size 0 or below the first published size; sets
 * the thread's last error, dst untouched).
 */
int emb__stats_copy(void *dst, const void *src, size_t src_size,
		    const char *type);

/* 0, or -EINVAL as emb__stats_copy() would return for dst, before filling. */
int emb__stats_check(const void *dst, const char *type);

/*
 * Sets the calling thread's last error to rc and a message (printf-style),
 * which the public function failing now passes through emb__err().
 */
void emb__err_set(int rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * Every public function returns through this: rc < 0 becomes the calling
 * thread's last error, with the message emb__err_set() gave for the same
 * code during this call, else emb_strerror(rc). Returns rc.
 */
int emb__err(int rc);

struct emb_client;

/*
 * emb__err() for a call on client c (NULL: none): when rc is the code of
 * c's latest server error (set by its loop thread, so possibly another
 * call's error of the same code), that server's text becomes the message.
 * Returns rc. Any thread.
 */
int emb__client_err(struct emb_client *c, int rc);

#endif
