/* Strict number parsing (parse.h). */
#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

int parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, const char *what,
              struct dapo_err *e) {
  if (!s || !*s || isspace((unsigned char)*s))
    return dapo_errf(e, DAPO_EINVAL, "%s: expected an integer", what);
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end || errno == ERANGE)
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not an integer", what, s);
  if (v < min || v > max)
    return dapo_errf(e, DAPO_EINVAL, "%s: %lld not in [%" PRId64 ", %" PRId64 "]", what, v, min,
                     max);
  *out = v;
  return 0;
}

int parse_int(const char *s, int min, int max, int *out, const char *what, struct dapo_err *e) {
  int64_t v = 0; /* set on success; the initialiser keeps -O3 from warning */
  int rc = parse_i64(s, min, max, &v, what, e);
  if (!rc) *out = (int)v;
  return rc;
}

int parse_u64(const char *s, uint64_t *out, const char *what, struct dapo_err *e) {
  if (!s || !isdigit((unsigned char)*s))
    return dapo_errf(e, DAPO_EINVAL, "%s: expected a non-negative integer", what);
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno == ERANGE)
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not a 64-bit unsigned integer", what, s);
  *out = v;
  return 0;
}

int parse_double(const char *s, double min, double max, double *out, const char *what,
                 struct dapo_err *e) {
  if (!s || !*s || isspace((unsigned char)*s))
    return dapo_errf(e, DAPO_EINVAL, "%s: expected a number", what);
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*end || errno == ERANGE || !isfinite(v))
    return dapo_errf(e, DAPO_EINVAL, "%s: '%.40s' is not a finite number", what, s);
  if (v < min || v > max)
    return dapo_errf(e, DAPO_EINVAL, "%s: %g not in [%g, %g]", what, v, min, max);
  *out = v;
  return 0;
}
