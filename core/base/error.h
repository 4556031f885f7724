/* Error codes and the error struct that carries a human message naming the field, line or
 * tensor at fault. Every fallible function in libdapo returns 0 or a negative DAPO_E* code and,
 * when given a non-NULL struct dapo_err, fills it in. */
#ifndef DAPO_ERROR_H
#define DAPO_ERROR_H

#include <stddef.h>

#include <jansson.h>

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

/* The one convention for problems found in input from outside (a job body, a dataset, a
 * request): an array of {"field", "message"} objects, "field" naming the JSON path at fault
 * ("hyperparameters.group_size", "" for the whole body). Appends one; a message that is not
 * valid UTF-8 (it may quote the input) has its non-ASCII bytes replaced by '?'. Returns 0 or
 * DAPO_ENOMEM. */
int dapo_errors_add(json_t *errors, const char *field, const char *msg);

/* A JSON string of s (new reference), made valid as dapo_errors_add does; NULL out of memory. */
json_t *dapo_json_text(const char *s);

/* Stable snake_case name of a code ("invalid", "no_memory", ...). Borrowed static string. */
const char *dapo_strerror(int code);

#endif
