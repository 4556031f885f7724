/* Strict number parsing for text from outside (flags, config, query strings): the whole string
 * must be the number, with no junk, no overflow and within [min, max]. Returns 0 or DAPO_EINVAL
 * with a message naming `what`. */
#ifndef DAPO_PARSE_H
#define DAPO_PARSE_H

#include <stdint.h>

#include "error.h"

int parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, const char *what,
              struct dapo_err *e);
int parse_int(const char *s, int min, int max, int *out, const char *what, struct dapo_err *e);
int parse_u64(const char *s, uint64_t *out, const char *what, struct dapo_err *e);
/* Finite doubles only. */
int parse_double(const char *s, double min, double max, double *out, const char *what,
                 struct dapo_err *e);

#endif
