/* Minimal test harness: CHECK/CHECK_NEAR record file:line and what was compared, and
 * check_done() makes the program exit non-zero if anything failed. Exit code 77 = skipped. */
#ifndef DAPO_TEST_CHECK_H
#define DAPO_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_failures = 0;
static int check_count = 0;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    check_count++;                                                                                 \
    if (!(cond)) {                                                                                 \
      check_failures++;                                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                     \
    }                                                                                              \
  } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
  do {                                                                                             \
    check_count++;                                                                                 \
    if (!(cond)) {                                                                                 \
      check_failures++;                                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                     \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
    }                                                                                              \
  } while (0)

/* |a - b| <= tol, NaN never passes. */
#define CHECK_NEAR(a, b, tol)                                                                      \
  do {                                                                                             \
    double check_a_ = (double)(a), check_b_ = (double)(b), check_t_ = (double)(tol);               \
    check_count++;                                                                                 \
    if (!(fabs(check_a_ - check_b_) <= check_t_)) {                                                \
      check_failures++;                                                                            \
      fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g vs %s = %.9g (tol %.3g)\n", __FILE__,   \
              __LINE__, #a, check_a_, #b, check_b_, check_t_);                                     \
    }                                                                                              \
  } while (0)

static inline int check_done(const char *name) {
  if (check_count == 0) {
    fprintf(stderr, "%s: no checks ran\n", name);
    return 1;
  }
  fprintf(stderr, "%s: %d checks, %d failed\n", name, check_count, check_failures);
  return check_failures ? 1 : 0;
}

#endif
