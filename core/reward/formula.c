/* calculate_output formulas (formula.h): a recursive-descent parser into a postfix program, and a
 * stack machine that evaluates it. The grammar, loosest first:
 *   sum   = prod (('+' | '-') prod)*
 *   prod  = unary (('*' | '/') unary)*
 *   unary = '-' unary | '+' unary | power
 *   power = atom ('^' unary)?          (2^-1, 2^3^2 = 2^9)
 *   atom  = number | name | name '(' sum (',' sum)* ')' | '(' sum ')' */
#include "formula.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum op { OP_NUM, OP_VAR, OP_NEG, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_FN };
enum fn { FN_MIN, FN_MAX, FN_ABS, FN_FLOOR, FN_CEIL, FN_EXP, FN_SQRT, FN_LOG };

static const char *const FN_NAMES[] = {"min", "max", "abs", "floor", "ceil", "exp", "sqrt", "log"};
#define N_FN ((int)(sizeof FN_NAMES / sizeof FN_NAMES[0]))

struct node {
  enum op op;
  int arg;    /* OP_VAR: name index; OP_FN: function; */
  int nargs;  /* OP_FN: arguments on the stack */
  double num; /* OP_NUM */
};

struct formula {
  int n, stack_max, n_names;
  unsigned char *uses; /* [n_names] */
  struct node prog[];
};

struct parser {
  const char *s;
  size_t len, pos;
  const char *const *names;
  int n_names;
  struct node *prog;
  int n, depth, sp, sp_max;
  struct dapo_err *e;
  int rc;
};

static int fail(struct parser *p, const char *what) {
  if (!p->rc) {
    if (p->pos >= p->len)
      p->rc = dapo_errf(p->e, DAPO_EINVAL, "calculate_output: %s at the end", what);
    else
      p->rc = dapo_errf(p->e, DAPO_EINVAL, "calculate_output: %s at column %zu", what, p->pos + 1);
  }
  return p->rc;
}

static void skip_space(struct parser *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r'))
    p->pos++;
}

static int peek(struct parser *p) {
  skip_space(p);
  return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

/* Appends a node; pushes/pops track the stack depth the program needs. */
static int emit(struct parser *p, struct node nd, int pops, int pushes) {
  if (p->rc) return p->rc;
  if (p->n >= FORMULA_MAX_NODES) return fail(p, "formula too long (more than 1024 terms)");
  p->prog[p->n++] = nd;
  p->sp += pushes - pops;
  if (p->sp > p->sp_max) p->sp_max = p->sp;
  return 0;
}

static int is_name_start(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_name_char(int c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
static int is_digit(int c) {
  return c >= '0' && c <= '9';
}

static int parse_sum(struct parser *p);
static int parse_unary(struct parser *p);

static int parse_number(struct parser *p) {
  size_t start = p->pos;
  while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
  if (p->pos < p->len && p->s[p->pos] == '.') {
    p->pos++;
    while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    size_t q = p->pos + 1;
    if (q < p->len && (p->s[q] == '+' || p->s[q] == '-')) q++;
    if (q < p->len && is_digit(p->s[q])) {
      p->pos = q;
      while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
    }
  }
  char buf[64];
  size_t n = p->pos - start;
  if (n == 1 && p->s[start] == '.') {
    p->pos = start;
    return fail(p, "expected a number");
  }
  if (n >= sizeof buf) {
    p->pos = start;
    return fail(p, "number too long");
  }
  memcpy(buf, p->s + start, n);
  buf[n] = '\0';
  double v = strtod(buf, NULL);
  if (!isfinite(v)) {
    p->pos = start;
    return fail(p, "number out of range");
  }
  return emit(p, (struct node){.op = OP_NUM, .num = v}, 0, 1);
}

/* A name ([A-Za-z_][A-Za-z0-9_]*): a function call when '(' follows, else a sub-grader's key. */
static int parse_name(struct parser *p) {
  size_t start = p->pos;
  p->pos++;
  while (p->pos < p->len && is_name_char((unsigned char)p->s[p->pos])) p->pos++;
  size_t n = p->pos - start;
  const char *name = p->s + start;
  if (peek(p) == '(') {
    int fn = -1;
    for (int i = 0; i < N_FN; i++)
      if (strlen(FN_NAMES[i]) == n && !memcmp(FN_NAMES[i], name, n)) fn = i;
    if (fn < 0) {
      p->pos = start;
      return fail(p, "unknown function (min, max, abs, floor, ceil, exp, sqrt, log)");
    }
    p->pos++;
    int nargs = 0;
    for (;;) {
      if (parse_sum(p)) return p->rc;
      nargs++;
      int c = peek(p);
      if (c == ',') {
        p->pos++;
        continue;
      }
      if (c != ')') return fail(p, "expected ',' or ')'");
      p->pos++;
      break;
    }
    int variadic = fn == FN_MIN || fn == FN_MAX;
    if (!variadic && nargs != 1) {
      p->pos = start;
      return fail(p, "this function takes one argument");
    }
    return emit(p, (struct node){.op = OP_FN, .arg = fn, .nargs = nargs}, nargs, 1);
  }
  for (int i = 0; i < p->n_names; i++) {
    if (strlen(p->names[i]) == n && !memcmp(p->names[i], name, n))
      return emit(p, (struct node){.op = OP_VAR, .arg = i}, 0, 1);
  }
  p->pos = start;
  return fail(p, "unknown name (not a key of graders)");
}

static int parse_atom(struct parser *p) {
  int c = peek(p);
  if (c < 0) return fail(p, "expected a number, a name or '('");
  if (is_digit(c) || c == '.') return parse_number(p);
  if (is_name_start(c)) return parse_name(p);
  if (c == '(') {
    p->pos++;
    if (parse_sum(p)) return p->rc;
    if (peek(p) != ')') return fail(p, "expected ')'");
    p->pos++;
    return 0;
  }
  return fail(p, "expected a number, a name or '('");
}

static int parse_power(struct parser *p) {
  if (parse_atom(p)) return p->rc;
  if (peek(p) == '^') {
    p->pos++;
    if (parse_unary(p)) return p->rc;
    return emit(p, (struct node){.op = OP_POW}, 2, 1);
  }
  return 0;
}

static int parse_unary(struct parser *p) {
  if (++p->depth > FORMULA_MAX_DEPTH) return fail(p, "nested deeper than 64");
  int c = peek(p), rc;
  if (c == '-' || c == '+') {
    p->pos++;
    rc = parse_unary(p);
    if (!rc && c == '-') rc = emit(p, (struct node){.op = OP_NEG}, 1, 1);
  } else {
    rc = parse_power(p);
  }
  p->depth--;
  return rc;
}

static int parse_prod(struct parser *p) {
  if (parse_unary(p)) return p->rc;
  for (;;) {
    int c = peek(p);
    if (c != '*' && c != '/') return 0;
    p->pos++;
    if (parse_unary(p)) return p->rc;
    if (emit(p, (struct node){.op = c == '*' ? OP_MUL : OP_DIV}, 2, 1)) return p->rc;
  }
}

static int parse_sum(struct parser *p) {
  if (++p->depth > FORMULA_MAX_DEPTH) return fail(p, "nested deeper than 64");
  if (parse_prod(p)) return p->rc;
  for (;;) {
    int c = peek(p);
    if (c != '+' && c != '-') break;
    p->pos++;
    if (parse_prod(p)) return p->rc;
    if (emit(p, (struct node){.op = c == '+' ? OP_ADD : OP_SUB}, 2, 1)) return p->rc;
  }
  p->depth--;
  return 0;
}

struct formula *formula_new(const char *src, size_t len, const char *const *names, int n_names,
                            struct dapo_err *e) {
  if (!src || len == 0) {
    dapo_errf(e, DAPO_EINVAL, "calculate_output: must not be empty");
    return NULL;
  }
  if (len > FORMULA_MAX_BYTES) {
    dapo_errf(e, DAPO_EINVAL, "calculate_output: longer than %d bytes", FORMULA_MAX_BYTES);
    return NULL;
  }
  if (memchr(src, '\0', len)) {
    dapo_errf(e, DAPO_EINVAL, "calculate_output: contains a NUL character");
    return NULL;
  }
  struct node *prog = malloc(FORMULA_MAX_NODES * sizeof *prog);
  if (!prog) {
    dapo_errf(e, DAPO_ENOMEM, "calculate_output: out of memory");
    return NULL;
  }
  struct parser p = {
      .s = src, .len = len, .names = names, .n_names = n_names, .prog = prog, .e = e};
  if (!parse_sum(&p) && peek(&p) >= 0) fail(&p, "unexpected character");
  struct formula *f = NULL;
  if (!p.rc) {
    f = malloc(sizeof *f + (size_t)p.n * sizeof *prog);
    unsigned char *uses = calloc((size_t)(n_names > 0 ? n_names : 1), 1);
    if (!f || !uses) {
      free(f);
      free(uses);
      dapo_errf(e, DAPO_ENOMEM, "calculate_output: out of memory");
      f = NULL;
    } else {
      f->n = p.n;
      f->stack_max = p.sp_max;
      f->n_names = n_names;
      f->uses = uses;
      memcpy(f->prog, prog, (size_t)p.n * sizeof *prog);
      for (int i = 0; i < p.n; i++)
        if (prog[i].op == OP_VAR) uses[prog[i].arg] = 1;
    }
  }
  free(prog);
  return f;
}

void formula_free(struct formula *f) {
  if (!f) return;
  free(f->uses);
  free(f);
}

int formula_uses(const struct formula *f, int i) {
  return f && i >= 0 && i < f->n_names && f->uses[i];
}

static double apply_fn(int fn, const double *a, int n) {
  double r = a[0];
  switch (fn) {
  case FN_MIN:
    for (int i = 1; i < n; i++) r = a[i] < r || isnan(a[i]) ? a[i] : r;
    return r;
  case FN_MAX:
    for (int i = 1; i < n; i++) r = a[i] > r || isnan(a[i]) ? a[i] : r;
    return r;
  case FN_ABS: return fabs(r);
  case FN_FLOOR: return floor(r);
  case FN_CEIL: return ceil(r);
  case FN_EXP: return exp(r);
  case FN_SQRT: return sqrt(r);
  case FN_LOG: return log(r);
  }
  return NAN;
}

double formula_eval(const struct formula *f, const double *vals) {
  if (!f || f->n == 0) return NAN;
  double stack_small[64] = {0};
  double *st = f->stack_max <= 64 ? stack_small : calloc((size_t)f->stack_max, sizeof *st);
  if (!st) return NAN;
  int sp = 0;
  for (int i = 0; i < f->n; i++) {
    const struct node *nd = &f->prog[i];
    switch (nd->op) {
    case OP_NUM: st[sp++] = nd->num; break;
    case OP_VAR: st[sp++] = vals[nd->arg]; break;
    case OP_NEG: st[sp - 1] = -st[sp - 1]; break;
    case OP_ADD: sp--, st[sp - 1] += st[sp]; break;
    case OP_SUB: sp--, st[sp - 1] -= st[sp]; break;
    case OP_MUL: sp--, st[sp - 1] *= st[sp]; break;
    case OP_DIV: sp--, st[sp - 1] /= st[sp]; break;
    case OP_POW: sp--, st[sp - 1] = pow(st[sp - 1], st[sp]); break;
    case OP_FN:
      sp -= nd->nargs;
      st[sp] = apply_fn(nd->arg, st + sp, nd->nargs);
      sp++;
      break;
    }
  }
  double r = st[0];
  if (st != stack_small) free(st);
  return r;
}
