/*
 * src/common/err.h - embstore's own error codes and emb_strerror().
 *
 * Functions return 0 or a negative code: a negative errno where one fits, or
 * one of the EMB_E* codes below -1000. Each module owns one block of codes.
 * Thread-safe: every function here returns static strings. Installed: the
 * body is inlined into embstore.h (includes nothing).
 */
#ifndef EMB_COMMON_ERR_H
#define EMB_COMMON_ERR_H

#include <stddef.h>

/* X(name, value, message): one block per module, never renumber a code. */
#define EMB_ERR_LIST(X)                                                        \
	/* common: -1000.. */                                                  \
	X(EMB_EINTERNAL, -1001, "internal error")                              \
	X(EMB_EBADARG, -1002, "invalid argument")                              \
	/* wire protocol: -1100.. */                                           \
	X(EMB_EBADMAGIC, -1101, "bad frame magic")                             \
	X(EMB_EBADVERSION, -1102, "unsupported protocol version")              \
	X(EMB_EBADFRAME, -1103, "malformed frame")                             \
	X(EMB_ETOOBIG, -1104, "frame exceeds size limit")                      \
	X(EMB_EBADOP, -1105, "unknown opcode")                                 \
	X(EMB_ETOOMANYIDS, -1106, "too many ids in one request")               \
	X(EMB_EAUTH, -1107, "authentication failed")                           \
	X(EMB_ENOHELLO, -1108, "request before HELLO")                         \
	X(EMB_ESERVER, -1109, "server reported an error")                      \
	X(EMB_ETRUNCFRAME, -1110, "frame truncated")                           \
	X(EMB_ENOADMIN, -1111, "operation needs the admin token")              \
	X(EMB_ETOOMANYCONNS, -1112, "server has too many connections")         \
	X(EMB_ERETRYLATE, -1115,                                               \
	  "push retried too late to know if it was applied; not applied")      \
	/* store: -1200.. */                                                   \
	X(EMB_EBADDUMP, -1201, "dump checksum mismatch")                       \
	X(EMB_ENOTABLE, -1202, "unknown table")                                \
	X(EMB_ETABLEEXISTS, -1203, "table already exists")                     \
	X(EMB_EBADDIM, -1204, "dim out of range (1..4096) or mismatched")      \
	X(EMB_EBADOPTIM, -1205, "unknown optimizer or bad hyper-parameter")    \
	X(EMB_EBADINIT, -1206, "unknown initializer or bad parameter")         \
	X(EMB_EMEMLIMIT, -1207, "memory limit reached")                        \
	X(EMB_ETOOMANYTABLES, -1208, "too many tables")                        \
	X(EMB_EBADNAME, -1209, "bad table name")                               \
	X(EMB_EARENA, -1210, "jemalloc arena operation failed")                \
	X(EMB_ENOTFOUND, -1211, "row not found")                               \
	X(EMB_EDUMPFORMAT, -1212, "bad dump format or version")                \
	X(EMB_ETRUNCATED, -1213, "dump file truncated")                        \
	X(EMB_EMANIFEST, -1214, "bad or missing dump manifest")                \
	X(EMB_ENONFINITE, -1215, "NaN or infinite value refused")              \
	X(EMB_ENOCKPT, -1220, "checkpoints present but none valid")            \
	X(EMB_EDELTALOST, -1221, "changes not tracked: full checkpoint needed") \
	X(EMB_ECHAIN, -1222, "checkpoint chain broken")                        \
	X(EMB_EBADLIFE, -1230, "bad admission or eviction policy")             \
	X(EMB_EBADFORMAT, -1232,                                               \
	  "unknown row format, or one the table does not have")             \
	X(EMB_ENOTREMOTE, -1231,                                               \
	  "table not remote-readable (server without --remote-read)")           \
	X(EMB_ETIERFULL, -1233, "table's device tier is full (tier_max)")     \
	X(EMB_ENOTIER, -1234,                                                  \
	  "table asks for a device tier; server has none (--tier-dir)")       \
	/* transport: -1300.. */                                               \
	X(EMB_ECLOSED, -1301, "connection closed")                             \
	X(EMB_EPEERDEAD, -1302, "peer disconnected")                           \
	X(EMB_EQPERR, -1303, "RDMA queue pair in error state")                 \
	X(EMB_ENOCREDIT, -1304, "no send credit")                              \
	X(EMB_ENODEVICE, -1305, "no RDMA device for address")                  \
	X(EMB_ERESPTOOBIG, -1306, "response larger than the receive buffer")   \
	/* cache: -1400.. */                                                   \
	X(EMB_ECACHEFULL, -1401, "batch has more distinct ids than the cache") \
	X(EMB_EFETCH, -1402, "cache fetch failed")                             \
	X(EMB_EWRITEBACK, -1403, "cache write-back failed")                    \
	X(EMB_EPUSH, -1404, "cache push failed")                               \
	/* worker / cluster: -1500.. */                                        \
	X(EMB_ENOSERVER, -1501, "no server for slot")                          \
	X(EMB_ENODEAD, -1502, "node declared dead")                            \
	X(EMB_ENOSCHED, -1503, "scheduler unreachable")                        \
	X(EMB_ECLUSTER, -1504, "cluster not ready")                            \
	X(EMB_ESTALEMAP, -1505, "cluster map out of date: fetch it, retry")    \
	X(EMB_EMOVING, -1506, "slot being copied to a new replica: retry")     \
	X(EMB_ENOBUNDLE, -1507,                                                \
	  "synchronous-mode push cannot go in PUSH_MANY: send it alone")       \
	X(EMB_EDRAINED, -1508, "server drained: it holds no slot and leaves")  \
	X(EMB_EADMITASK, -1509,                                                \
	  "replicated push to a table with admission, not asked of the "       \
	  "primary first")                                                     \
	X(EMB_ENEWCOMER, -1510,                                                \
	  "another new server is being filled: register again later")          \
	X(EMB_ESCHEDSTATE, -1519, "bad scheduler state file")                  \
	/* cluster coordinator on etcd: -1530.. */                             \
	X(EMB_ENOETCD, -1530, "etcd unreachable")                              \
	X(EMB_EETCD, -1531, "etcd refused the request")                        \
	X(EMB_ENOLEASE, -1532, "etcd lease expired")

enum emb_err {
#define EMB_ERR_ENUM(name, value, msg) name = value,
	EMB_ERR_LIST(EMB_ERR_ENUM)
#undef EMB_ERR_ENUM
};

/*
 * Names any return code: 0, a negative errno, or an EMB_E* code. Never NULL;
 * the string is static (negative errno goes through strerrordesc_np()).
 */
const char *emb_strerror(int rc);

/*
 * The name of a return code: "EMB_EBADDUMP" for ours, "EINVAL" for a
 * negative errno, "OK" for 0, "UNKNOWN" for anything else. Static, never
 * NULL.
 */
const char *emb_err_name(int rc);

/*
 * Writes up to cap of embstore's own codes (the EMB_E* list above, in its
 * order) to out (may be NULL when cap is 0) and returns how many there are,
 * so bindings take the list from the library instead of copying it.
 */
int emb_err_codes(int *out, size_t cap);

#endif
