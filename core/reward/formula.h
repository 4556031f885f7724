/* The arithmetic of a multi grader's `calculate_output` (OpenAI's graders): numbers, names,
 * + - * / ^ (right-associative power), unary minus, parentheses and the functions min, max (one
 * or more arguments), abs, floor, ceil, exp, sqrt, log (one each). Names are the keys of the
 * grader's sub-graders, bound to indices when the formula is compiled. A formula never changes
 * after formula_new: formula_eval is thread-safe. */
#ifndef DAPO_FORMULA_H
#define DAPO_FORMULA_H

#include <stddef.h>

#include "error.h"

#define FORMULA_MAX_BYTES 4096 /* longest source accepted */
#define FORMULA_MAX_NODES 1024 /* numbers, names, operators and calls after parsing */
#define FORMULA_MAX_DEPTH 64   /* nesting of parentheses, calls and unary minus */

struct formula;

/* Compiles src[0..len) (need not be NUL-terminated; len <= FORMULA_MAX_BYTES) against the n_names
 * names (borrowed). NULL with e set (DAPO_EINVAL: "unknown name 'x' at column 5", "expected ')'
 * at column 9", ...; columns are 1-based bytes; DAPO_ENOMEM). Owned: formula_free. */
struct formula *formula_new(const char *src, size_t len, const char *const *names, int n_names,
                            struct dapo_err *e);
void formula_free(struct formula *f);

/* Evaluates f with name i bound to vals[i]. IEEE arithmetic: a division by zero or log(-1) gives
 * an infinity or NaN, which the caller judges. */
double formula_eval(const struct formula *f, const double *vals);

/* 1 when name i is used by f. */
int formula_uses(const struct formula *f, int i);

#endif
