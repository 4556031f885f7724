/* Error codes and the error struct that carries a human message naming the field, line or
 * tensor at fault. Every fallible function in libdapo returns 0 or a negative DAPO_E* code and,
 * when given a non-NULL struct dapo_err, fills it in. */
#ifndef DAPO_ERROR_H
#define DAPO_ERROR_H

#include <stddef.h>

enum {
  DAPO_OK = 0,
  DAPO_EINVAL = -1,       /* bad argument or bad input value */
  DAPO_ENOMEM = -2,       /* allocation failed */
  DAPO_EIO = -3,          /* read/write/open failed (errno text in the message) */
  DAPO_EFORMAT = -4,      /* malformed file contents (JSON, safetensors, ...) */
  DAPO_EUNSUPPORTED = -5, /* well-formed but not something we implement */
  DAPO_ERANGE = -6,       /* a size or value outside its bounds (capacity, limits) */
  DAPO_ECANCELLED = -7,   /* stopped by a cancel flag */
};

struct dapo_err {
  int code;
  char msg[512];
};

/* Sets e (may be NULL) to code and a printf-formatted message; returns code, so that
 * `return dapo_errf(e, DAPO_EINVAL, "...")` reads naturally. */
int dapo_errf(struct dapo_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with context ("loading x: " + old); returns e->code. */
int dapo_err_prefix(struct dapo_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears e (may be NULL). */
void dapo_err_clear(struct dapo_err *e);

/* Stable snake_case name of a code ("invalid", "no_memory", ...). Borrowed static string. */
const char *dapo_strerror(int code);

#endif
