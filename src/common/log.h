/*
 * src/common/log.h - leveled logging with a replaceable sink.
 *
 * The worker library runs inside someone else's job, so nothing here writes
 * to stdout: the default sink writes one line per event to stderr, and a host
 * program installs its own with emb_log_set_sink(). Thread-safe; the level and
 * sink are process-wide and meant to be set once at start-up. Installed:
 * embstore.h inlines the body, less the part marked private (the macros
 * the library logs with).
 */
#ifndef EMB_COMMON_LOG_H
#define EMB_COMMON_LOG_H

#include <stdbool.h>

enum emb_log_level {
	EMB_LOG_ERROR = 0,
	EMB_LOG_WARN = 1,
	EMB_LOG_INFO = 2,
	EMB_LOG_DEBUG = 3,
};

/* Receives one formatted line without a trailing newline. */
typedef void (*emb_log_sink_fn)(enum emb_log_level level, const char *line,
				void *arg);

/* Installs a sink (NULL restores stderr); arg is passed back unchanged. */
void emb_log_set_sink(emb_log_sink_fn fn, void *arg);
void emb_log_set_level(enum emb_log_level level);
/* Parses "error|warn|info|debug" into *out; -EINVAL for anything else. */
int emb_log_parse_level(const char *s, enum emb_log_level *out);
const char *emb_log_level_name(enum emb_log_level level);

/* private: not in the installed embstore.h */
extern int emb__log_level;

void emb__log_write(enum emb_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Arguments are evaluated only when the level is enabled. */
#define emb_log_enabled(lvl) ((int)(lvl) <= emb__log_level)
#ifdef EMB_DEBUG_LOG
#define emb__debug_on 1
#else
#define emb__debug_on 0
#endif
#define emb_log(lvl, ...)                                                      \
	do {                                                                   \
		if (((lvl) != EMB_LOG_DEBUG || emb__debug_on) &&               \
		    emb_log_enabled(lvl))                                      \
			emb__log_write((lvl), __VA_ARGS__);                    \
	} while (0)
/* end private */

#endif
