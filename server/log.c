/* Logging (log.h): level check in the macro, formatting and escaping into one stack buffer, one
 * write(2) per line. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

atomic_int log_threshold_ = LOG_LEVEL_INFO;
static atomic_int log_fd = 2;

static const char *const NAMES[] = {"debug", "info", "warn", "error"};
static const char *const TAGS[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_set_level(enum log_level l) {
  atomic_store(&log_threshold_, (int)l);
}

enum log_level log_get_level(void) {
  return (enum log_level)atomic_load(&log_threshold_);
}

int log_level_parse(const char *s, enum log_level *out) {
  for (int i = 0; s && i < 4; i++)
    if (!strcmp(s, NAMES[i])) {
      *out = (enum log_level)i;
      return 0;
    }
  return DAPO_EINVAL;
}

const char *log_level_name(enum log_level l) {
  return (int)l >= 0 && (int)l < 4 ? NAMES[l] : "?";
}

int log_set_fd(int fd) {
  return atomic_exchange(&log_fd, fd);
}

/* Appends c to buf[*n] (capacity cap), escaped when it is a control character; returns 0 when it
 * did not fit. */
static int put_escaped(char *buf, size_t *n, size_t cap, unsigned char c) {
  char tmp[5];
  size_t k;
  if (c == '\n')
    k = (size_t)snprintf(tmp, sizeof tmp, "\\n");
  else if (c == '\r')
    k = (size_t)snprintf(tmp, sizeof tmp, "\\r");
  else if (c == '\t')
    tmp[0] = '\t', k = 1;
  else if (c < 0x20 || c == 0x7f)
    k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
  else
    tmp[0] = (char)c, k = 1;
  if (*n + k > cap) return 0;
  memcpy(buf + *n, tmp, k);
  *n += k;
  return 1;
}

static void write_line(const char *buf, size_t n) {
  int fd = atomic_load(&log_fd);
  while (n > 0) {
    ssize_t w = write(fd, buf, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* nowhere to report a failing log */
    buf += w;
    n -= (size_t)w;
  }
}

static void emit_v(enum log_level l, const char *fmt, va_list ap) {
  char msg[LOG_LINE_MAX], line[LOG_LINE_MAX];
  vsnprintf(msg, sizeof msg, fmt, ap);

  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int p = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000, (int)l >= 0 && (int)l < 4 ? TAGS[l] : "?");
  size_t n = p > 0 ? (size_t)p : 0;
  const size_t cap = sizeof line - 4; /* room for "...\n" */
  int cut = 0;
  for (const unsigned char *s = (const unsigned char *)msg; *s; s++)
    if (!put_escaped(line, &n, cap, *s)) {
      cut = 1;
      break;
    }
  if (!cut && strlen(msg) == sizeof msg - 1) cut = 1; /* vsnprintf truncated the message */
  if (cut) {
    memcpy(line + n, "...", 3);
    n += 3;
  }
  line[n++] = '\n';
  write_line(line, n);
}

void log_emit(enum log_level l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit_v(l, fmt, ap);
  va_end(ap);
}

void log_access(const char *method, const char *path, int status, double ms) {
  LOG(INFO, "access %.16s %.1024s %d %.1fms", method ? method : "-", path ? path : "-", status, ms);
}
