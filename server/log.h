/* Logging: one macro, one line per event on stderr (journald keeps it), and the access-log line
 * per request. A line reads `2025-01-02T03:04:05.678Z INFO message`; control characters in the
 * message are escaped (\n, \r, \xHH) so that an event never spans two lines. */
#ifndef DAPOD_LOG_H
#define DAPOD_LOG_H

#include <stdatomic.h>

/* Levels in increasing severity; their names are "debug", "info", "warn", "error" (the config's
 * log_level values). Prefixed LOG_LEVEL_ so as not to collide with <syslog.h>'s LOG_INFO. */
enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* LOG(INFO, "listening on %s", addr): level is DEBUG, INFO, WARN or ERROR. The arguments are not
 * evaluated, and nothing is formatted, when the level is below the threshold. Thread-safe: each
 * line is written with a single write(2) of at most LOG_LINE_MAX bytes (longer messages are cut
 * and end in "..."), so concurrent lines never interleave. */
#define LOG(level, ...)                                                                            \
  do {                                                                                             \
    if (log_enabled(LOG_LEVEL_##level)) log_emit(LOG_LEVEL_##level, __VA_ARGS__);                  \
  } while (0)

#define LOG_LINE_MAX 4096

/* The threshold; written by log_set_level, read by every LOG. Use the functions, not this. */
extern atomic_int log_threshold_;

/* 1 when lines at level l are written. Thread-safe. */
static inline int log_enabled(enum log_level l) {
  return (int)l >= atomic_load_explicit(&log_threshold_, memory_order_relaxed);
}

/* Writes one line at level l unconditionally (LOG checks the level first; call this directly
 * only with a level chosen at run time, after log_enabled). Thread-safe. */
void log_emit(enum log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets the threshold (default LOG_LEVEL_INFO). Thread-safe; takes effect for the next LOG. */
void log_set_level(enum log_level l);
enum log_level log_get_level(void);

/* "debug", "info", "warn", "error" -> level; 0, or DAPO_EINVAL for anything else (the level is
 * left alone). */
int log_level_parse(const char *s, enum log_level *out);

/* The name of a level ("info"); borrowed static string, "?" for an unknown value. */
const char *log_level_name(enum log_level l);

/* Redirects the lines to fd (default 2, stderr); returns the previous fd. The fd is borrowed.
 * For tests; not meant to change while other threads log. */
int log_set_fd(int fd);

/* The access-log line of one request, at INFO: `access GET /v1/jobs 200 3.2ms`. method and path
 * are borrowed (path is cut at 1024 bytes; may be NULL: "-"). Thread-safe. */
void log_access(const char *method, const char *path, int status, double ms);

#endif
