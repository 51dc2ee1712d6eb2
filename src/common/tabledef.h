/*
 * src/common/tabledef.h - what a table is, as every module and the public API
 * see it: the limits on names and dims, and the training modes.
 *
 * Installed (embstore/common/tabledef.h): includes nothing of embstore's.
 */
#ifndef EMB_COMMON_TABLEDEF_H
#define EMB_COMMON_TABLEDEF_H

#define EMB_DIM_MAX  4096u /* floats per row, at most */
#define EMB_NAME_MAX 63u   /* bytes of a table name, without the NUL */

/* Training modes of a table (SET_MODE). */
enum emb_mode {
	EMB_MODE_ASYNC = 0, /* each push is applied on arrival */
	EMB_MODE_SYNC = 1,  /* a step's pushes are averaged and applied once
			       every worker has sent its part */
	EMB_MODE_STALE = 2, /* pushes more than K steps behind the newest are
			       discarded (bounded staleness) */
};

#endif
