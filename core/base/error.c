/* Error struct helpers (see error.h). */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dapo_errf(struct dapo_err *e, int code, const char *fmt, ...) {
  if (!e) return code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->code = code;
  return code;
}

int dapo_err_prefix(struct dapo_err *e, const char *fmt, ...) {
  if (!e) return DAPO_EINVAL;
  char pre[256], old[sizeof e->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  memcpy(old, e->msg, sizeof old);
  size_t n = strnlen(pre, sizeof pre - 1);
  memcpy(e->msg, pre, n);
  size_t rest = sizeof e->msg - 1 - n;
  size_t m = strnlen(old, rest);
  memcpy(e->msg + n, old, m);
  e->msg[n + m] = '\0';
  return e->code;
}

void dapo_err_clear(struct dapo_err *e) {
  if (!e) return;
  e->code = 0;
  e->msg[0] = '\0';
}

const char *dapo_strerror(int code) {
  switch (code) {
  case DAPO_OK: return "ok";
  case DAPO_EINVAL: return "invalid";
  case DAPO_ENOMEM: return "no_memory";
  case DAPO_EIO: return "io_error";
  case DAPO_EFORMAT: return "bad_format";
  case DAPO_EUNSUPPORTED: return "unsupported";
  case DAPO_ERANGE: return "out_of_range";
  case DAPO_ECANCELLED: return "cancelled";
  }
  return "unknown";
}

json_t *dapo_json_text(const char *s) {
  json_t *j = json_string(s);
  if (j) return j;
  char *c = strdup(s);
  if (!c) return NULL;
  for (char *p = c; *p; p++)
    if ((unsigned char)*p >= 0x80) *p = '?';
  j = json_string(c);
  free(c);
  return j;
}

int dapo_errors_add(json_t *errors, const char *field, const char *msg) {
  json_t *x =
      json_pack("{s:o, s:o}", "field", dapo_json_text(field), "message", dapo_json_text(msg));
  return json_array_append_new(errors, x) ? DAPO_ENOMEM : 0;
}
