/*
 * src/common/log.c - log sink and level. The sink pointer pair is swapped
 * under a mutex so a line is never written to a half-installed sink.
 */
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int emb__log_level = EMB_LOG_INFO;

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static emb_log_sink_fn sink_fn;
static void *sink_arg;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

const char *emb_log_level_name(enum emb_log_level level)
{
	if ((unsigned)level > EMB_LOG_DEBUG)
		return "?";
	return level_names[level];
}

void emb_log_set_sink(emb_log_sink_fn fn, void *arg)
{
	pthread_mutex_lock(&sink_lock);
	sink_fn = fn;
	sink_arg = arg;
	pthread_mutex_unlock(&sink_lock);
}

void emb_log_set_level(enum emb_log_level level)
{
	if ((unsigned)level > EMB_LOG_DEBUG)
		level = EMB_LOG_DEBUG;
	__atomic_store_n(&emb__log_level, (int)level, __ATOMIC_RELAXED);
}

int emb_log_parse_level(const char *s, enum emb_log_level *out)
{
	for (int i = 0; i <= EMB_LOG_DEBUG; i++) {
		if (s && strcasecmp(s, level_names[i]) == 0) {
			*out = (enum emb_log_level)i;
			return 0;
		}
	}
	if (s && strcasecmp(s, "warning") == 0) {
		*out = EMB_LOG_WARN;
		return 0;
	}
	return -EINVAL;
}

void emb__log_write(enum emb_log_level level, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);

	pthread_mutex_lock(&sink_lock);
	if (sink_fn) {
		sink_fn(level, line, sink_arg);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		n = fprintf(stderr,
			    "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s\n",
			    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			    tm.tm_hour, tm.tm_min, tm.tm_sec,
			    ts.tv_nsec / 1000000, level_names[level], line);
		(void)n;
	}
	pthread_mutex_unlock(&sink_lock);
}
