/* Structured outputs (jsongrammar.h): a schema compiled into nodes, a matcher that is a small set
 * of stacks advanced a byte at a time, and the vocabulary walked with it for a token mask. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "jsongrammar.h"

#include <math.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonschema.h"
#include "tokenizer.h"

#define MD_INF 1000000 /* no finite value */
#define JM_THREADS                                                                                 \
  16                  /* readings of the bytes so far kept at once (more are dropped: fewer        \
                         choices, never a dead end) */
#define INT_DIGITS 15 /* an integer's digits */
#define NUM_DIGITS 12 /* a number's integer digits */
#define NUM_FRAC 6    /* a number's fraction digits */

enum nkind { N_ALT, N_LIT, N_OBJ, N_ARR, N_STR, N_NUM };

struct prop {
  char *key; /* "\"name\":" */
  int key_len, child, required;
};

struct node {
  int kind, md;
  int *kids, n_kids; /* ALT */
  char **lits;       /* LIT: compact JSON texts */
  int *lit_len, n_lits;
  struct prop *props;            /* OBJ */
  int n_props, free_obj, addl;   /* free_obj: any keys, values addl (-1: none, so only {}) */
  int items;                     /* ARR */
  int64_t min_items, max_items;  /* max -1: none */
  int64_t min_len, max_len, cap; /* STR (code points; max -1: none; cap: where counting stops) */
  const pcre2_code *re[2];
  int n_re, anchored[2];  /* a pattern not anchored at its start: any prefix can still lead to a
                             match (one appended), and PCRE2 reports no partial match there */
  int is_int, imax, fmax; /* NUM */
  int64_t scale, lo, hi;  /* bounds in units of 1/scale */
  int64_t mult;           /* multipleOf in units (an integer multipleOf), 0: none */
};

struct jgrammar {
  struct node *nodes;
  int n, cap, root, any, keystr;
  struct jschema *js;
  pcre2_code *own[64]; /* format patterns */
  int n_own;
};

enum fkind { F_OBJ = 1, F_ARR, F_STR, F_NUM, F_LIT, F_KEY, F_ROOT };
enum { PH_OPEN, PH_AFTER, PH_COMMA, PH_VALNEXT, PH_INKEY, PH_COLON, PH_INVAL };

struct frame {
  uint8_t kind, ph;
  uint16_t pos; /* LIT/KEY: bytes matched; STR: escape and UTF-8 state */
  int32_t node;
  int32_t a; /* OBJ: next property; ARR: items so far; STR: code points (to cap); LIT/KEY: window */
  int32_t b; /* OBJ: the value's node when PH_VALNEXT */
  uint64_t bits; /* LIT/KEY: candidates in the window */
};

struct thr {
  uint8_t depth, leaflen;
  struct frame f[JG_DEPTH];
  char leaf[JG_PATTERN_BYTES]; /* a number's text, or a patterned string's content */
};

struct jst {
  int n;
  struct thr t[JM_THREADS];
};

struct jmatch {
  const struct jgrammar *g;
  pcre2_match_data *md;
  struct jst st, tmp;
  /* jmasker's scratch (a matcher belongs to one thread at a time) */
  char key[sizeof(struct jst)];
  uint64_t *bits;
  int n_words;
};

struct wk {
  const struct jgrammar *g;
  pcre2_match_data *md;
};

static const int64_t P10[19] = {1LL,
                                10LL,
                                100LL,
                                1000LL,
                                10000LL,
                                100000LL,
                                1000000LL,
                                10000000LL,
                                100000000LL,
                                1000000000LL,
                                10000000000LL,
                                100000000000LL,
                                1000000000000LL,
                                10000000000000LL,
                                100000000000000LL,
                                1000000000000000LL,
                                10000000000000000LL,
                                100000000000000000LL,
                                1000000000000000000LL};

/* ---- numbers ---- */

struct num {
  int neg, nint, dot, nf, ok;
  int64_t I, F;
};

/* Reads a prefix of '-'? digits ('.' digits)?, within n's digit limits; ok 0 if it is no such
 * prefix. */
static struct num num_parse(const struct node *n, const char *t, int len) {
  struct num r = {0};
  int i = 0;
  if (i < len && t[i] == '-') r.neg = 1, i++;
  for (; i < len && t[i] >= '0' && t[i] <= '9'; i++) {
    if (r.nint == 1 && r.I == 0) return r; /* no leading zeros */
    if (++r.nint > n->imax) return r;
    r.I = r.I * 10 + (t[i] - '0');
  }
  if (i < len && t[i] == '.') {
    if (n->is_int || r.nint == 0) return r;
    r.dot = 1, i++;
    for (; i < len && t[i] >= '0' && t[i] <= '9'; i++) {
      if (++r.nf > n->fmax) return r;
      r.F = r.F * 10 + (t[i] - '0');
    }
  }
  r.ok = i == len;
  return r;
}

/* Whether a value of magnitude in [a, b] (units), with this sign, meets n's bounds (a negative
 * one is never zero). */
static int hits(const struct node *n, int64_t a, int64_t b, int neg) {
  if (neg && a == 0) a = 1; /* no "-0": a zero is written 0 */
  int64_t lo = neg ? -b : a, hi = neg ? -a : b;
  if (lo < n->lo) lo = n->lo;
  if (hi > n->hi) hi = n->hi;
  if (lo > hi) return 0;
  if (!n->mult) return 1;
  /* a multiple of mult in [lo, hi]: the largest one at most hi (floor division) */
  int64_t q = hi / n->mult - (hi % n->mult < 0);
  return q * n->mult >= lo;
}

/* Whether some number within n's limits and bounds begins with t. */
static int num_feasible(const struct node *n, const char *t, int len) {
  struct num r = num_parse(n, t, len);
  if (!r.ok) return 0;
  int64_t S = n->scale, top = P10[n->imax] * S - 1;
  if (r.nint == 0) return hits(n, 0, top, 1) || (len == 0 && hits(n, 0, top, 0));
  if (r.dot) {
    int64_t w = P10[n->fmax - r.nf], base = r.I * S + r.F * w;
    return hits(n, base, base + w - 1, r.neg);
  }
  int kmax = r.I == 0 ? 0 : n->imax - r.nint;
  for (int k = 0; k <= kmax; k++)
    if (hits(n, r.I * P10[k] * S, (r.I + 1) * P10[k] * S - 1, r.neg)) return 1;
  return 0;
}

static int num_complete(const struct node *n, const char *t, int len) {
  struct num r = num_parse(n, t, len);
  if (!r.ok || r.nint == 0 || (r.dot && r.nf == 0)) return 0;
  int64_t v = r.I * n->scale + r.F * P10[n->fmax - r.nf];
  return hits(n, v, v, r.neg);
}

static int64_t bound_units(double x, int64_t S, int64_t lim, int lower, int strict) {
  double y = x * (double)S;
  if (y > (double)lim) return lower ? lim + 1 : lim;
  if (y < -(double)lim) return lower ? -lim : -lim - 1;
  double r = nearbyint(y);
  int exact = fabs(y - r) <= 4 * 2.220446049250313e-16 * fmax(1.0, fabs(y));
  if (lower) return exact ? (int64_t)r + (strict ? 1 : 0) : (int64_t)ceil(y);
  return exact ? (int64_t)r - (strict ? 1 : 0) : (int64_t)floor(y);
}

/* ---- compiling ---- */

struct memo {
  const json_t *s;
  int node;
};

struct gb {
  struct jgrammar *g;
  struct memo *memo;
  int n_memo, cap_memo;
  struct dapo_err *e;
};

static int new_node(struct gb *b, int kind) {
  struct jgrammar *g = b->g;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 16;
    struct node *p = realloc(g->nodes, sizeof *p * (size_t)cap);
    if (!p) return dapo_errf(b->e, DAPO_ENOMEM, "structured outputs: out of memory"), -1;
    g->nodes = p, g->cap = cap;
  }
  struct node *n = &g->nodes[g->n];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->md = MD_INF;
  n->addl = n->items = -1;
  n->max_items = n->max_len = -1;
  return g->n++;
}

static int add_kid(struct gb *b, int id, int kid) {
  struct node *n = &b->g->nodes[id];
  int *k = realloc(n->kids, sizeof *k * (size_t)(n->n_kids + 1));
  if (!k) return dapo_errf(b->e, DAPO_ENOMEM, "structured outputs: out of memory");
  n->kids = k;
  k[n->n_kids++] = kid;
  return 0;
}

static int add_lit(struct gb *b, int id, const json_t *v) {
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  struct node *n = &b->g->nodes[id];
  char **l = s ? realloc(n->lits, sizeof *l * (size_t)(n->n_lits + 1)) : NULL;
  if (l) n->lits = l;
  int *ll = l ? realloc(n->lit_len, sizeof *ll * (size_t)(n->n_lits + 1)) : NULL;
  if (!ll) {
    free(s);
    return dapo_errf(b->e, DAPO_ENOMEM, "structured outputs: out of memory");
  }
  n->lit_len = ll;
  n->lits[n->n_lits] = s;
  n->lit_len[n->n_lits++] = (int)strlen(s);
  return 0;
}

static int lit_node(struct gb *b, const char *const *texts) {
  int id = new_node(b, N_LIT);
  for (; id >= 0 && *texts; texts++) {
    json_t *v = json_loads(*texts, JSON_DECODE_ANY, NULL);
    int rc = v ? add_lit(b, id, v) : dapo_errf(b->e, DAPO_ENOMEM, "out of memory");
    json_decref(v);
    if (rc) return -1;
  }
  return id;
}

static int num_node(struct gb *b, int is_int) {
  int id = new_node(b, N_NUM);
  if (id < 0) return -1;
  struct node *n = &b->g->nodes[id];
  n->is_int = is_int;
  n->imax = is_int ? INT_DIGITS : NUM_DIGITS;
  n->fmax = is_int ? 0 : NUM_FRAC;
  n->scale = P10[n->fmax];
  n->hi = P10[n->imax] * n->scale - 1;
  n->lo = -n->hi;
  return id;
}

/* any JSON value: an object of any keys, an array, a string, a number, true, false, null */
static int any_node(struct gb *b) {
  if (b->g->any >= 0) return b->g->any;
  int id = new_node(b, N_ALT), o, a, s, x, l;
  if (id < 0) return -1;
  b->g->any = id;
  static const char *const lits[] = {"true", "false", "null", NULL};
  if ((o = new_node(b, N_OBJ)) < 0 || (a = new_node(b, N_ARR)) < 0 ||
      (s = new_node(b, N_STR)) < 0 || (x = num_node(b, 0)) < 0 || (l = lit_node(b, lits)) < 0)
    return -1;
  b->g->nodes[o].free_obj = 1, b->g->nodes[o].addl = id;
  b->g->nodes[a].items = id;
  if (add_kid(b, id, o) || add_kid(b, id, a) || add_kid(b, id, s) || add_kid(b, id, x) ||
      add_kid(b, id, l))
    return -1;
  return id;
}

static const struct {
  const char *name, *re;
} FORMATS[] = {
    {"date-time",
     "^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:"
     "[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date", "^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):"
             "[0-5][0-9])$"},
    {"duration", "^P([0-9]{1,4}D|[0-9]{1,4}DT[0-9]{1,4}[HMS]|T[0-9]{1,4}[HMS])$"},
    {"email", "^[a-z0-9._+-]{1,32}@[a-z0-9-]{1,20}(\\.[a-z0-9-]{1,10}){1,3}$"},
    {"hostname", "^[a-z0-9]{1,20}(\\.[a-z0-9]{1,20}){0,3}$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
             "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    {"ipv6", "^([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}$"},
    {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
};

static int compile(struct gb *b, const json_t *s, const char *at);

static int typed(struct gb *b, int id, const json_t *s, const char *t, const char *at) {
  char sub[600];
  struct jgrammar *g = b->g;
  const json_t *v;
  if (!strcmp(t, "object")) {
    g->nodes[id].kind = N_OBJ;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *extra = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *x;
    json_array_foreach(req, i, x) {
      if (!json_object_get(props, json_string_value(x)))
        return dapo_errf(b->e, DAPO_EINVAL,
                         "%s.required[%zu]: '%.64s' is not one of its properties", at, i,
                         json_string_value(x));
    }
    if (json_object_size(props) == 0) {
      g->nodes[id].free_obj = 1;
      int addl = json_is_false(extra) ? -1 : -2;
      if (addl == -2) {
        snprintf(sub, sizeof sub, "%s.additionalProperties", at);
        addl = extra ? compile(b, extra, sub) : any_node(b);
        if (addl < 0) return -1;
      }
      g->nodes[id].addl = addl;
      return 0;
    }
    const char *k;
    json_t *pv;
    json_object_foreach((json_t *)props, k, pv) {
      snprintf(sub, sizeof sub, "%s.properties.%.64s", at, k);
      int child = compile(b, pv, sub);
      if (child < 0) return -1;
      json_t *ks = json_string(k);
      char *q = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
      json_decref(ks);
      struct node *n = &g->nodes[id];
      struct prop *p = q ? realloc(n->props, sizeof *p * (size_t)(n->n_props + 1)) : NULL;
      char *key = p ? malloc(strlen(q) + 2) : NULL;
      if (p) n->props = p;
      if (!key) {
        free(q);
        return dapo_errf(b->e, DAPO_ENOMEM, "structured outputs: out of memory");
      }
      sprintf(key, "%s:", q);
      free(q);
      int required = 0;
      json_array_foreach(req, i, x) required |= !strcmp(json_string_value(x), k);
      n->props[n->n_props++] = (struct prop){key, (int)strlen(key), child, required};
    }
    return 0;
  }
  if (!strcmp(t, "array")) {
    const json_t *items = json_object_get(s, "items");
    snprintf(sub, sizeof sub, "%s.items", at);
    int it = items ? compile(b, items, sub) : any_node(b);
    if (it < 0) return -1;
    struct node *n = &g->nodes[id];
    n->kind = N_ARR, n->items = it;
    if ((v = json_object_get(s, "minItems"))) n->min_items = json_integer_value(v);
    if ((v = json_object_get(s, "maxItems"))) n->max_items = json_integer_value(v);
    return 0;
  }
  if (!strcmp(t, "string")) {
    struct node *n = &g->nodes[id];
    n->kind = N_STR;
    if ((v = json_object_get(s, "minLength"))) n->min_len = json_integer_value(v);
    if ((v = json_object_get(s, "maxLength"))) n->max_len = json_integer_value(v);
    n->cap = n->min_len > n->max_len ? n->min_len : n->max_len;
    if ((v = json_object_get(s, "pattern"))) n->re[n->n_re++] = jschema_pattern(g->js, v);
    if ((v = json_object_get(s, "format"))) {
      const char *f = json_string_value(v);
      size_t i = 0;
      while (f && i < sizeof FORMATS / sizeof *FORMATS && strcmp(FORMATS[i].name, f)) i++;
      if (!f || i == sizeof FORMATS / sizeof *FORMATS)
        return dapo_errf(
            b->e, DAPO_EINVAL,
            "%s.format: '%.40s' is not a format structured outputs support (date-time, "
            "date, time, duration, email, hostname, ipv4, ipv6, uuid)",
            at, f ? f : "?");
      int err;
      PCRE2_SIZE off;
      pcre2_code *re = g->n_own < 64
                           ? pcre2_compile((PCRE2_SPTR)FORMATS[i].re, PCRE2_ZERO_TERMINATED,
                                           PCRE2_DOLLAR_ENDONLY, &err, &off, NULL)
                           : NULL;
      if (!re) return dapo_errf(b->e, DAPO_EINVAL, "%s.format: too many formats", at);
      g->own[g->n_own++] = re;
      n->re[n->n_re++] = re;
    }
    for (int r = 0; r < n->n_re; r++) {
      uint32_t opts = 0;
      pcre2_pattern_info(n->re[r], PCRE2_INFO_ALLOPTIONS, &opts);
      n->anchored[r] = (opts & PCRE2_ANCHORED) != 0;
    }
    return 0;
  }
  if (!strcmp(t, "number") || !strcmp(t, "integer")) {
    const json_t *mo = json_object_get(s, "multipleOf");
    if (mo && (!json_is_integer(mo) || json_integer_value(mo) > 1000000000LL))
      return dapo_errf(b->e, DAPO_EINVAL,
                       "%s.multipleOf: structured outputs take an integer multipleOf (at most 1e9) "
                       "only: a fraction's multiples have no exact decimal test",
                       at);
    int x = num_node(b, !strcmp(t, "integer"));
    if (x < 0) return -1;
    struct node *n = &g->nodes[x];
    int64_t lim = n->hi;
    if (mo) n->mult = json_integer_value(mo) * n->scale;
    if ((v = json_object_get(s, "minimum")))
      n->lo = bound_units(json_number_value(v), n->scale, lim, 1, 0);
    if ((v = json_object_get(s, "exclusiveMinimum"))) {
      int64_t l = bound_units(json_number_value(v), n->scale, lim, 1, 1);
      if (l > n->lo) n->lo = l;
    }
    if ((v = json_object_get(s, "maximum")))
      n->hi = bound_units(json_number_value(v), n->scale, lim, 0, 0);
    if ((v = json_object_get(s, "exclusiveMaximum"))) {
      int64_t h = bound_units(json_number_value(v), n->scale, lim, 0, 1);
      if (h < n->hi) n->hi = h;
    }
    return add_kid(b, id, x);
  }
  static const char *const bools[] = {"true", "false", NULL}, *const nul[] = {"null", NULL};
  int x = lit_node(b, !strcmp(t, "boolean") ? bools : nul);
  return x < 0 ? -1 : add_kid(b, id, x);
}

static int compile(struct gb *b, const json_t *s, const char *at) {
  if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) return any_node(b);
  for (int i = 0; i < b->n_memo; i++)
    if (b->memo[i].s == s) return b->memo[i].node;
  int id = new_node(b, N_ALT);
  if (id < 0) return -1;
  if (b->n_memo == b->cap_memo) {
    int cap = b->cap_memo ? 2 * b->cap_memo : 16;
    struct memo *m = realloc(b->memo, sizeof *m * (size_t)cap);
    if (!m) return dapo_errf(b->e, DAPO_ENOMEM, "structured outputs: out of memory"), -1;
    b->memo = m, b->cap_memo = cap;
  }
  b->memo[b->n_memo++] = (struct memo){s, id};
  if (json_is_false(s)) return id; /* no value: a choice of nothing */
  char sub[600];
  const json_t *v;
  int rc = 0;
  const char *alone = json_object_get(s, "$ref")    ? "$ref"
                      : json_object_get(s, "anyOf") ? "anyOf"
                                                    : NULL;
  const char *key;
  json_t *kv;
  json_object_foreach((json_t *)s, key, kv) { /* what would narrow $ref's or anyOf's values */
    static const char *const free_keys[] = {"$ref",     "anyOf",       "$defs",    "definitions",
                                            "title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   NULL};
    int ok = !alone;
    for (int i = 0; !ok && free_keys[i]; i++) ok = !strcmp(key, free_keys[i]);
    if (!ok)
      return dapo_errf(b->e, DAPO_EINVAL,
                       "%s.%.64s: not supported beside %s in structured outputs (put it inside)",
                       at, key, alone),
             -1;
  }
  if ((v = json_object_get(s, "$ref"))) {
    snprintf(sub, sizeof sub, "%s.$ref", at);
    int k = compile(b, jschema_ref(b->g->js, json_string_value(v)), sub);
    rc = k < 0 ? -1 : add_kid(b, id, k);
  } else if ((v = json_object_get(s, "anyOf"))) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      snprintf(sub, sizeof sub, "%s.anyOf[%zu]", at, i);
      int k = compile(b, x, sub);
      if (k < 0 || add_kid(b, id, k)) return -1;
    }
  } else if ((v = json_object_get(s, "enum")) || (v = json_object_get(s, "const"))) {
    /* the values the whole schema allows (type and bounds beside them), as compact JSON */
    b->g->nodes[id].kind = N_LIT;
    if (json_is_array(v) && json_object_get(s, "enum")) {
      size_t i;
      json_t *x;
      json_array_foreach(v, i, x) {
        if (!jschema_check_at(b->g->js, s, x) && add_lit(b, id, x)) return -1;
      }
    } else if (!jschema_check_at(b->g->js, s, v)) {
      rc = add_lit(b, id, v);
    }
  } else if ((v = json_object_get(s, "type"))) {
    if (json_is_string(v)) return typed(b, id, s, json_string_value(v), at) ? -1 : id;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      int k = new_node(b, N_ALT);
      if (k < 0 || typed(b, k, s, json_string_value(x), at) || add_kid(b, id, k)) return -1;
    }
  } else if (json_object_get(s, "properties")) {
    rc = typed(b, id, s, "object", at);
  } else if (json_object_get(s, "items")) {
    rc = typed(b, id, s, "array", at);
  } else {
    int k = any_node(b);
    rc = k < 0 ? -1 : add_kid(b, id, k);
  }
  return rc ? -1 : id;
}

/* The fewest frames a node's shallowest value needs; MD_INF when it has none. */
static void min_depths(struct jgrammar *g, pcre2_match_data *md) {
  for (int i = 0; i < g->n; i++) {
    struct node *n = &g->nodes[i];
    if (n->kind == N_LIT) n->md = n->n_lits ? 1 : MD_INF;
    if (n->kind == N_NUM) n->md = num_feasible(n, "", 0) ? 1 : MD_INF;
    if (n->kind == N_STR) {
      int ok = n->max_len < 0 || n->min_len <= n->max_len;
      (void)md; /* PCRE2 reports no partial match of an empty subject: "" counts as a start */
      n->md = ok ? 1 : MD_INF;
    }
  }
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < g->n; i++) {
      struct node *n = &g->nodes[i];
      int d = n->md;
      if (n->kind == N_ALT) {
        d = MD_INF;
        for (int k = 0; k < n->n_kids; k++)
          if (g->nodes[n->kids[k]].md < d) d = g->nodes[n->kids[k]].md;
      } else if (n->kind == N_ARR) {
        int c = n->min_items > 0 ? g->nodes[n->items].md : 0;
        d = (n->max_items >= 0 && n->max_items < n->min_items) || c >= MD_INF ? MD_INF : 1 + c;
      } else if (n->kind == N_OBJ) {
        int c = 1;
        for (int p = 0; p < n->n_props; p++)
          if (n->props[p].required && g->nodes[n->props[p].child].md > c)
            c = g->nodes[n->props[p].child].md;
        d = c >= MD_INF ? MD_INF : 1 + c;
      }
      if (d < n->md) n->md = d, changed = 1;
    }
  }
}

void jgrammar_free(struct jgrammar *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) {
    struct node *n = &g->nodes[i];
    free(n->kids);
    for (int k = 0; k < n->n_lits; k++) free(n->lits[k]);
    free(n->lits);
    free(n->lit_len);
    for (int k = 0; k < n->n_props; k++) free(n->props[k].key);
    free(n->props);
  }
  for (int i = 0; i < g->n_own; i++) pcre2_code_free(g->own[i]);
  free(g->nodes);
  jschema_free(g->js);
  free(g);
}

struct jgrammar *jgrammar_from_schema(const json_t *schema, const char *field, struct dapo_err *e) {
  struct jgrammar *g = calloc(1, sizeof *g);
  json_t *obj = schema ? NULL : json_pack("{s:s}", "type", "object");
  if (!g || (!schema && !obj)) {
    free(g);
    json_decref(obj);
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  g->any = g->keystr = -1;
  g->js = jschema_new(schema ? schema : obj, field, e);
  json_decref(obj);
  if (!g->js) {
    free(g);
    return NULL;
  }
  struct gb b = {.g = g, .e = e};
  const json_t *root = jschema_root(g->js);
  g->root = compile(&b, root, field);
  if (g->root >= 0) g->keystr = new_node(&b, N_STR);
  free(b.memo);
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (g->root >= 0 && g->keystr >= 0 && md) {
    min_depths(g, md);
    if (g->nodes[g->root].md > JG_DEPTH)
      dapo_errf(e, DAPO_EINVAL,
                "%s: no value of at most %d levels satisfies this schema (a recursion that never "
                "ends, or bounds no value meets)",
                field, JG_DEPTH - 1);
  } else if (!md) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  }
  pcre2_match_data_free(md);
  if (g->root < 0 || g->keystr < 0 || !md || g->nodes[g->root].md > JG_DEPTH) {
    jgrammar_free(g);
    return NULL;
  }
  return g;
}

struct jgrammar *jgrammar_new(const json_t *rf, const char *field, struct dapo_err *e) {
  const char *type = json_string_value(json_object_get(rf, "type"));
  if (!json_is_object(rf)) {
    dapo_errf(e, DAPO_EINVAL, "%s: expected an object", field);
    return NULL;
  }
  if (type && !strcmp(type, "json_object")) return jgrammar_from_schema(NULL, field, e);
  if (!type || strcmp(type, "json_schema")) {
    dapo_errf(e, DAPO_EINVAL, "%s.type: expected 'text', 'json_object' or 'json_schema'", field);
    return NULL;
  }
  const json_t *js = json_object_get(rf, "json_schema"), *name = json_object_get(js, "name"),
               *strict = json_object_get(js, "strict"), *schema = json_object_get(js, "schema");
  const char *nm = json_string_value(name);
  size_t nl = nm ? strlen(nm) : 0, ok = nl >= 1 && nl <= 64;
  for (size_t i = 0; ok && i < nl; i++)
    ok = (nm[i] >= 'a' && nm[i] <= 'z') || (nm[i] >= 'A' && nm[i] <= 'Z') ||
         (nm[i] >= '0' && nm[i] <= '9') || nm[i] == '_' || nm[i] == '-';
  if (!json_is_object(js)) {
    dapo_errf(e, DAPO_EINVAL, "%s.json_schema: expected an object", field);
  } else if (!ok) {
    dapo_errf(e, DAPO_EINVAL, "%s.json_schema.name: expected 1-64 of a-z, A-Z, 0-9, _ and -",
              field);
  } else if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
    dapo_errf(e, DAPO_EINVAL, "%s.json_schema.strict: expected a boolean", field);
  } else if (schema && !json_is_object(schema)) {
    dapo_errf(e, DAPO_EINVAL, "%s.json_schema.schema: expected an object", field);
  } else {
    char sub[256];
    snprintf(sub, sizeof sub, "%s.json_schema.schema", field);
    return jgrammar_from_schema(schema, sub, e);
  }
  return NULL;
}

/* ---- matching ---- */

static void thr_copy(struct thr *d, const struct thr *s) {
  d->depth = s->depth, d->leaflen = s->leaflen;
  memcpy(d->f, s->f, sizeof *s->f * s->depth);
  memcpy(d->leaf, s->leaf, s->leaflen);
}

static int thr_eq(const struct thr *a, const struct thr *b) {
  return a->depth == b->depth && a->leaflen == b->leaflen &&
         !memcmp(a->f, b->f, sizeof *a->f * a->depth) && !memcmp(a->leaf, b->leaf, a->leaflen);
}

static void emit(struct jst *out, const struct thr *t) {
  for (int i = 0; i < out->n; i++)
    if (thr_eq(&out->t[i], t)) return;
  if (out->n < JM_THREADS) thr_copy(&out->t[out->n++], t);
}

static struct frame *push(struct thr *t, int kind, int node) {
  struct frame *f = &t->f[t->depth++];
  memset(f, 0, sizeof *f);
  f->kind = (uint8_t)kind, f->node = node;
  return f;
}

/* The top frame's value is complete: pop it and tell its parent. */
static void complete(struct thr *t) {
  t->depth--;
  t->leaflen = 0;
  struct frame *p = &t->f[t->depth - 1];
  if (p->kind == F_ROOT) {
    p->ph = PH_AFTER;
  } else if (p->kind == F_OBJ) {
    p->ph = p->ph == PH_INKEY ? PH_COLON : PH_AFTER;
  } else if (p->kind == F_ARR) {
    p->a++;
    p->ph = PH_AFTER;
  }
}

static int fits(const struct jgrammar *g, const struct thr *t, int node) {
  return node >= 0 && t->depth + g->nodes[node].md <= JG_DEPTH;
}

/* Literal candidates (texts[i] for bit i of window w) after byte c at pos: those that go on
 * stay in the frame, one that ends here completes. */
static void lit_step(struct thr *t, char *const *texts, const int *lens, int n, unsigned char c,
                     struct jst *out) {
  struct frame *f = &t->f[t->depth - 1];
  uint64_t keep = 0;
  int done = -1;
  for (int i = 0; i < 64 && f->a + i < n; i++) {
    if (!(f->bits >> i & 1)) continue;
    int k = f->a + i;
    if (lens[k] <= f->pos || (unsigned char)texts[k][f->pos] != c) continue;
    if (lens[k] == f->pos + 1)
      done = k;
    else
      keep |= 1ULL << i;
  }
  if (done < 0 && !keep) return;
  f->pos++;
  if (keep) {
    uint64_t bits = f->bits;
    f->bits = keep;
    emit(out, t);
    f->bits = bits;
  }
  if (done >= 0) {
    if (f->kind == F_KEY) { /* the key and its ':' matched: its value comes next */
      t->depth--;
      struct frame *p = &t->f[t->depth - 1];
      p->a = done + 1;
      p->ph = PH_VALNEXT;
      p->b = done; /* the caller makes it the property's node */
      emit(out, t);
    } else {
      complete(t);
      emit(out, t);
    }
  }
}

static int pat_ok(const struct wk *w, const struct node *n, const char *s, int len, int full) {
  for (int r = 0; r < n->n_re; r++) {
    if (!full && !n->anchored[r]) continue;
    int rc = pcre2_match(n->re[r], (PCRE2_SPTR)s, (PCRE2_SIZE)len, 0, full ? 0 : PCRE2_PARTIAL_HARD,
                         w->md, NULL);
    if (!(rc >= 0 || (!full && rc == PCRE2_ERROR_PARTIAL))) return 0;
  }
  return 1;
}

static void start_value(const struct wk *w, struct thr *t, int node, unsigned char c,
                        struct jst *out);
static void step_thr(const struct wk *w, struct thr *t, unsigned char c, struct jst *out);

/* A string's byte. pos: bits 0-2 escape (0 none, 1 after '\', 2-5 \u's hex digits), bit 3 a
 * \u that began with d (no surrogates), bits 4-5 UTF-8 bytes still to come, bits 6-8 the range
 * of the next one, bit 9 a \u whose digits so far are 0 (no \u0000). */
static void str_step(const struct wk *w, struct thr *t, unsigned char c, struct jst *out) {
  struct frame *f = &t->f[t->depth - 1];
  const struct node *n = &w->g->nodes[f->node];
  int esc = f->pos & 7, ud = f->pos >> 3 & 1, more = f->pos >> 4 & 3, rng = f->pos >> 6 & 7;
  int room = n->max_len < 0 || f->a < n->max_len;
  char add = 0; /* a patterned string's next character */
  if (more) {
    static const unsigned char lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80},
                               hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    if (c < lo[rng] || c > hi[rng]) return;
    f->pos = (uint16_t)((more - 1) << 4);
    emit(out, t);
    return;
  }
  if (esc == 1) {
    const char *simple = "\"\\/bfnrt", *q = c ? strchr(simple, c) : NULL;
    if (c == 'u' && !n->n_re) {
      f->pos = 2;
      emit(out, t);
      return;
    }
    if (!q) return;
    static const char dec[] = "\"\\/\b\f\n\r\t";
    add = dec[q - simple];
  } else if (esc >= 2) {
    int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    int zero = esc == 2 || (f->pos >> 9 & 1); /* the digits so far are all 0 */
    if (!hex || (esc == 3 && ud && !(c >= '0' && c <= '7'))) return;
    if (esc == 5 && zero && c == '0') return; /* no \u0000: NUL is in no JSON parser's strings */
    if (esc < 5) {
      f->pos = (uint16_t)((esc + 1) | (esc == 2 ? (c == 'd' || c == 'D') << 3 : ud << 3) |
                          (zero && c == '0') << 9);
      emit(out, t);
      return;
    }
  } else if (c == '"') {
    if (f->a < n->min_len || (n->n_re && !pat_ok(w, n, t->leaf, t->leaflen, 1))) return;
    complete(t);
    emit(out, t);
    return;
  } else if (c == '\\') {
    if (!room) return;
    if (n->n_re) { /* only if some escape's character can follow */
      static const char dec[] = "\"\\/\b\f\n\r\t";
      int any = 0;
      for (int i = 0; !any && dec[i] && t->leaflen + 1 < JG_PATTERN_BYTES; i++) {
        t->leaf[t->leaflen] = dec[i];
        any = pat_ok(w, n, t->leaf, t->leaflen + 1, 0);
      }
      if (!any) return;
    }
    f->pos = 1;
    emit(out, t);
    return;
  } else if (c < 0x20) {
    return;
  } else if (c >= 0x80) {
    if (n->n_re || !room || c < 0xC2 || c > 0xF4) return;
    int m = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    int r = c == 0xE0 ? 1 : c == 0xED ? 2 : c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
    f->pos = (uint16_t)(m << 4 | r << 6);
    if (f->a < n->cap) f->a++;
    emit(out, t);
    return;
  } else {
    add = (char)c;
  }
  /* a whole character: an escape's end, or a printable ASCII byte */
  if (!room && esc == 0) return;
  f->pos = 0;
  if (n->n_re) {
    if (t->leaflen >= JG_PATTERN_BYTES) return;
    t->leaf[t->leaflen++] = add;
    int full = t->leaflen == JG_PATTERN_BYTES; /* the last byte there is must close a match */
    if (!pat_ok(w, n, t->leaf, t->leaflen, full)) return;
  }
  if (f->a < n->cap) f->a++;
  emit(out, t);
}

static void num_step(const struct wk *w, struct thr *t, unsigned char c, struct jst *out) {
  const struct node *n = &w->g->nodes[t->f[t->depth - 1].node];
  if ((c >= '0' && c <= '9') || c == '-' || c == '.') {
    if (t->leaflen >= JG_PATTERN_BYTES) return;
    t->leaf[t->leaflen] = (char)c;
    if (!num_feasible(n, t->leaf, t->leaflen + 1)) return;
    t->leaflen++;
    emit(out, t);
    return;
  }
  if (!num_complete(n, t->leaf, t->leaflen)) return;
  complete(t);
  step_thr(w, t, c, out); /* the byte is the parent's (a root takes none) */
}

static void start_value(const struct wk *w, struct thr *t, int node, unsigned char c,
                        struct jst *out) {
  const struct jgrammar *g = w->g;
  const struct node *n = &g->nodes[node];
  if (!fits(g, t, node)) return;
  struct thr save;
  switch (n->kind) {
  case N_ALT:
    for (int k = 0; k < n->n_kids; k++) {
      thr_copy(&save, t);
      start_value(w, &save, n->kids[k], c, out);
    }
    return;
  case N_LIT:
    for (int base = 0; base < n->n_lits; base += 64) {
      thr_copy(&save, t);
      struct frame *f = push(&save, F_LIT, node);
      f->a = base;
      for (int i = 0; i < 64 && base + i < n->n_lits; i++) f->bits |= 1ULL << i;
      lit_step(&save, n->lits, n->lit_len, n->n_lits, c, out);
    }
    return;
  case N_OBJ:
    if (c != '{') return;
    push(t, F_OBJ, node);
    emit(out, t);
    return;
  case N_ARR:
    if (c != '[') return;
    push(t, F_ARR, node);
    emit(out, t);
    return;
  case N_STR:
    if (c != '"') return;
    push(t, F_STR, node);
    t->leaflen = 0;
    emit(out, t);
    return;
  case N_NUM:
    push(t, F_NUM, node);
    t->leaflen = 0;
    num_step(w, t, c, out);
    return;
  }
}

/* Byte c after thread t (changed): every reading that follows, into out. */
static void step_thr(const struct wk *w, struct thr *t, unsigned char c, struct jst *out) {
  const struct jgrammar *g = w->g;
  struct frame *f = &t->f[t->depth - 1];
  const struct node *n = &g->nodes[f->node];
  switch (f->kind) {
  case F_STR: str_step(w, t, c, out); return;
  case F_NUM: num_step(w, t, c, out); return;
  case F_LIT: lit_step(t, n->lits, n->lit_len, n->n_lits, c, out); return;
  case F_ROOT:
    if (f->ph == PH_OPEN) {
      f->ph = PH_INVAL;
      start_value(w, t, g->root, c, out);
    }
    return; /* after the value: nothing */
  case F_KEY: {
    /* keys of n's properties: gather them as the literal step wants them */
    char *keys[64];
    int lens[64];
    int cnt = n->n_props - f->a < 64 ? n->n_props - f->a : 64;
    for (int i = 0; i < cnt; i++)
      keys[i] = n->props[f->a + i].key, lens[i] = n->props[f->a + i].key_len;
    int base = f->a;
    f->a = 0; /* lit_step indexes from the window's base */
    struct jst tmp;
    tmp.n = 0;
    lit_step(t, keys, lens, cnt, c, &tmp);
    for (int i = 0; i < tmp.n; i++) {
      struct thr *x = &tmp.t[i];
      struct frame *top = &x->f[x->depth - 1];
      if (top->kind == F_KEY) {
        top->a = base;
      } else { /* the object: a and b are relative to the window */
        top->a += base;
        top->b = n->props[top->b + base].child;
      }
      emit(out, x);
    }
    return;
  }
  case F_ARR: {
    int ok_item = n->max_items != 0 && fits(g, t, n->items);
    if (f->ph == PH_OPEN || f->ph == PH_COMMA) {
      if (f->ph == PH_OPEN && c == ']' && n->min_items == 0) {
        complete(t);
        emit(out, t);
        return;
      }
      if (!ok_item) return;
      f->ph = PH_INVAL;
      start_value(w, t, n->items, c, out);
    } else if (f->ph == PH_AFTER) {
      if (c == ',' && ok_item && (n->max_items < 0 || f->a < n->max_items)) {
        f->ph = PH_COMMA;
        emit(out, t);
      } else if (c == ']' && f->a >= n->min_items) {
        complete(t);
        emit(out, t);
      }
    }
    return;
  }
  case F_OBJ: break;
  }
  /* objects */
  if (f->ph == PH_VALNEXT) {
    f->ph = PH_INVAL;
    start_value(w, t, f->b, c, out);
    return;
  }
  if (n->free_obj) {
    int key_ok = n->addl >= 0 &&
                 t->depth + (g->nodes[n->addl].md > 1 ? g->nodes[n->addl].md : 1) <= JG_DEPTH;
    if ((f->ph == PH_OPEN || f->ph == PH_COMMA) && c == '"' && key_ok) {
      f->ph = PH_INKEY;
      push(t, F_STR, g->keystr);
      t->leaflen = 0;
      emit(out, t);
    } else if ((f->ph == PH_OPEN || f->ph == PH_AFTER) && c == '}') {
      complete(t);
      emit(out, t);
    } else if (f->ph == PH_AFTER && c == ',' && key_ok) {
      f->ph = PH_COMMA;
      emit(out, t);
    } else if (f->ph == PH_COLON && c == ':') {
      f->ph = PH_VALNEXT;
      f->b = n->addl;
      emit(out, t);
    }
    return;
  }
  /* the properties from a on that may come next: up to the first required one */
  uint64_t cand = 0;
  int req_left = 0;
  for (int i = 0; i < 64 && f->a + i < n->n_props; i++) {
    const struct prop *p = &n->props[f->a + i];
    if (fits(g, t, p->child)) cand |= 1ULL << i;
    if (p->required) {
      req_left = 1;
      break;
    }
  }
  for (int j = f->a; !req_left && j < n->n_props; j++) req_left = n->props[j].required;
  if ((f->ph == PH_OPEN || f->ph == PH_COMMA) && c == '"' && cand) {
    int a = f->a;
    struct frame *k = push(t, F_KEY, f->node);
    k->a = a, k->bits = cand, k->pos = 1;
    emit(out, t);
  } else if ((f->ph == PH_OPEN || f->ph == PH_AFTER) && c == '}' && !req_left) {
    complete(t);
    emit(out, t);
  } else if (f->ph == PH_AFTER && c == ',' && cand) {
    f->ph = PH_COMMA;
    emit(out, t);
  }
}

static void advance(const struct wk *w, const struct jst *in, unsigned char c, struct jst *out) {
  struct thr t;
  out->n = 0;
  for (int i = 0; i < in->n; i++) {
    thr_copy(&t, &in->t[i]);
    step_thr(w, &t, c, out);
  }
}

static void st_init(struct jst *s) {
  s->n = 1;
  s->t[0].depth = 0;
  s->t[0].leaflen = 0;
  push(&s->t[0], F_ROOT, -1);
}

static int thr_done(const struct thr *t) {
  if (t->depth == 1) return t->f[0].ph == PH_AFTER;
  return 0;
}

static int st_done(const struct jgrammar *g, const struct jst *s) {
  for (int i = 0; i < s->n; i++) {
    const struct thr *t = &s->t[i];
    if (thr_done(t)) return 1;
    if (t->depth == 2 && t->f[1].kind == F_NUM &&
        num_complete(&g->nodes[t->f[1].node], t->leaf, t->leaflen))
      return 1;
  }
  return 0;
}

struct jmatch *jmatch_new(const struct jgrammar *g) {
  struct jmatch *m = malloc(sizeof *m);
  if (!m) return NULL;
  m->g = g;
  m->bits = NULL;
  m->n_words = 0;
  if (!(m->md = pcre2_match_data_create(1, NULL))) {
    free(m);
    return NULL;
  }
  st_init(&m->st);
  return m;
}

struct jmatch *jmatch_clone(const struct jmatch *m) {
  struct jmatch *c = jmatch_new(m->g);
  if (c) memcpy(&c->st, &m->st, sizeof c->st);
  return c;
}

void jmatch_free(struct jmatch *m) {
  if (!m) return;
  free(m->bits);
  pcre2_match_data_free(m->md);
  free(m);
}

void jmatch_reset(struct jmatch *m) {
  st_init(&m->st);
}

int jmatch_feed(struct jmatch *m, const char *bytes, size_t n) {
  struct wk w = {m->g, m->md};
  const struct jst *a = &m->st;
  struct jst *b = &m->tmp, *work = n > 1 ? malloc(sizeof *work) : NULL;
  if (n > 1 && !work) return -1;
  for (size_t i = 0; i < n; i++) {
    struct jst *into = i % 2 ? work : b; /* never st: it stays as it was until the end */
    advance(&w, a, (unsigned char)bytes[i], into);
    if (!into->n) {
      free(work);
      return -1;
    }
    a = into;
  }
  if (n) memcpy(&m->st, a, sizeof m->st);
  free(work);
  return 0;
}

int jmatch_done(const struct jmatch *m) {
  return st_done(m->g, &m->st);
}

int jmatch_can_continue(const struct jmatch *m) {
  struct wk w = {m->g, m->md};
  struct jst *out = malloc(sizeof *out);
  int ok = 0;
  for (int c = 0; out && c < 256 && !ok; c++) {
    advance(&w, &m->st, (unsigned char)c, out);
    ok = out->n > 0;
  }
  free(out);
  return ok;
}

/* ---- the vocabulary and the mask ---- */

struct jvocab {
  int V, n;    /* ids, and how many the walk visits (not special, not empty) */
  int *order;  /* [n] ids by their bytes */
  int *lcp;    /* [n] bytes shared with the previous one in order */
  size_t *off; /* [V + 1] into bytes */
  char *bytes;
  char *special; /* [V] never allowed (special, no token) */
  char *plain;   /* [V] whole UTF-8 characters, none a quote, backslash or control: a free
                    string's content that leaves its state as it was */
  int max_len;
};

void jvocab_free(struct jvocab *v) {
  if (!v) return;
  free(v->order);
  free(v->lcp);
  free(v->off);
  free(v->bytes);
  free(v->special);
  free(v->plain);
  free(v);
}

int jvocab_size(const struct jvocab *v) {
  return v->V;
}

static int cmp_tok(const void *a, const void *b, void *ctx) {
  const struct jvocab *v = ctx;
  int i = *(const int *)a, j = *(const int *)b;
  size_t li = v->off[i + 1] - v->off[i], lj = v->off[j + 1] - v->off[j];
  int c = memcmp(v->bytes + v->off[i], v->bytes + v->off[j], li < lj ? li : lj);
  if (c) return c;
  if (li != lj) return li < lj ? -1 : 1;
  return i - j;
}

/* Whether s[n] is whole UTF-8 characters (as str_step takes them) with no quote, backslash or
 * control character. */
static int plain_text(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i++];
    if (c < 0x20 || c == '"' || c == '\\') return 0;
    if (c < 0x80) continue;
    if (c < 0xC2 || c > 0xF4) return 0;
    int more = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    unsigned char lo = c == 0xE0   ? 0xA0
                       : c == 0xF0 ? 0x90
                                   : 0x80,
                  hi = c == 0xED   ? 0x9F
                       : c == 0xF4 ? 0x8F
                                   : 0xBF;
    for (int k = 0; k < more; k++, lo = 0x80, hi = 0xBF)
      if (i >= n || s[i] < lo || s[i++] > hi) return 0;
  }
  return 1;
}

struct jvocab *jvocab_from_bytes(const char *const *toks, const size_t *lens, const char *special,
                                 int V, struct dapo_err *e) {
  struct jvocab *v = calloc(1, sizeof *v);
  size_t total = 0;
  for (int i = 0; i < V; i++) total += toks[i] ? lens[i] : 0;
  if (!v || !(v->order = malloc(sizeof *v->order * (size_t)(V + 1))) ||
      !(v->lcp = malloc(sizeof *v->lcp * (size_t)(V + 1))) ||
      !(v->off = malloc(sizeof *v->off * (size_t)(V + 1))) || !(v->bytes = malloc(total + 1)) ||
      !(v->special = calloc((size_t)V + 1, 1)) || !(v->plain = calloc((size_t)V + 1, 1))) {
    jvocab_free(v);
    dapo_errf(e, DAPO_ENOMEM, "structured outputs: out of memory for the vocabulary");
    return NULL;
  }
  v->V = V;
  size_t o = 0;
  for (int i = 0; i < V; i++) {
    v->off[i] = o;
    size_t l = toks[i] ? lens[i] : 0;
    if (l) memcpy(v->bytes + o, toks[i], l);
    o += l;
    v->special[i] = !toks[i] || !l || (special && special[i]);
    v->plain[i] = !v->special[i] && plain_text((const unsigned char *)toks[i], l);
    if (!v->special[i]) {
      v->order[v->n++] = i;
      if ((int)l > v->max_len) v->max_len = (int)l;
    }
  }
  v->off[V] = o;
  qsort_r(v->order, (size_t)v->n, sizeof *v->order, cmp_tok, v);
  for (int k = 0; k < v->n; k++) {
    if (!k) {
      v->lcp[k] = 0;
      continue;
    }
    int i = v->order[k - 1], j = v->order[k];
    size_t li = v->off[i + 1] - v->off[i], lj = v->off[j + 1] - v->off[j], l = 0;
    while (l < li && l < lj && v->bytes[v->off[i] + l] == v->bytes[v->off[j] + l]) l++;
    v->lcp[k] = (int)l;
  }
  return v;
}

struct jvocab *jvocab_new(const struct tokenizer *t, int V, struct dapo_err *e) {
  int tv = tok_vocab_size(t);
  char **toks = calloc((size_t)V + 1, sizeof *toks);
  size_t *lens = calloc((size_t)V + 1, sizeof *lens);
  char *special = calloc((size_t)V + 1, 1);
  struct jvocab *v = NULL;
  if (!toks || !lens || !special) {
    dapo_errf(e, DAPO_ENOMEM, "structured outputs: out of memory for the vocabulary");
    goto done;
  }
  for (int i = 0; i < V && i < tv; i++) {
    struct dapo_err ignore;
    special[i] = (char)tok_is_special(t, i);
    if (tok_token_bytes(t, i, &toks[i], &lens[i], &ignore)) toks[i] = NULL, lens[i] = 0;
  }
  v = jvocab_from_bytes((const char *const *)toks, lens, special, V, e);
done:
  for (int i = 0; toks && i < V; i++) free(toks[i]);
  free(toks);
  free(lens);
  free(special);
  return v;
}

#define CACHE_MAX 256 /* masks kept per masker (Qwen's: 19 KB each) */

struct centry {
  uint64_t hash;
  size_t key_len;
  char *key;
  uint64_t *bits;
  int count;
};

struct jmasker {
  const struct jgrammar *g;
  const struct jvocab *v;
  int stop[8], n_stop;
  pthread_mutex_t mu;
  struct centry cache[CACHE_MAX];
  int n_cache, next;
  int64_t hits, walks;
};

struct jmasker *jmasker_new(const struct jgrammar *g, const struct jvocab *v, const int *stop,
                            int n_stop, struct dapo_err *e) {
  struct jmasker *k = calloc(1, sizeof *k);
  if (!k) {
    dapo_errf(e, DAPO_ENOMEM, "structured outputs: out of memory");
    return NULL;
  }
  k->g = g, k->v = v;
  for (int i = 0; i < n_stop && k->n_stop < 8; i++)
    if (stop[i] >= 0 && stop[i] < v->V) k->stop[k->n_stop++] = stop[i];
  pthread_mutex_init(&k->mu, NULL);
  return k;
}

void jmasker_free(struct jmasker *k) {
  if (!k) return;
  for (int i = 0; i < k->n_cache; i++) free(k->cache[i].key), free(k->cache[i].bits);
  pthread_mutex_destroy(&k->mu);
  free(k);
}

void jmasker_stats(struct jmasker *k, int64_t *hits, int64_t *walks) {
  pthread_mutex_lock(&k->mu);
  *hits = k->hits, *walks = k->walks;
  pthread_mutex_unlock(&k->mu);
}

/* The state as bytes: equal states, equal keys. */
static size_t st_key(const struct jst *s, char *buf) {
  size_t o = 0;
  for (int i = 0; i < s->n; i++) {
    const struct thr *t = &s->t[i];
    buf[o++] = (char)t->depth, buf[o++] = (char)t->leaflen;
    memcpy(buf + o, t->f, sizeof *t->f * t->depth);
    o += sizeof *t->f * t->depth;
    memcpy(buf + o, t->leaf, t->leaflen);
    o += t->leaflen;
  }
  return o;
}

static uint64_t fnv(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
  return h;
}

/* 1 when every reading of s is inside a string without pattern or format, its length bound
 * reached or absent, between characters: plain characters then change nothing. */
static int idle_string(const struct jgrammar *g, const struct jst *s) {
  for (int i = 0; i < s->n; i++) {
    const struct thr *t = &s->t[i];
    const struct frame *f = t->depth ? &t->f[t->depth - 1] : NULL;
    const struct node *n = f ? &g->nodes[f->node] : NULL;
    if (!f || f->kind != F_STR || f->pos || n->n_re || n->max_len >= 0 || f->a < n->cap) return 0;
  }
  return s->n > 0;
}

/* The allowed ids of m's state: the vocabulary in byte order, each id stepped from the longest
 * prefix it shares with the last one stepped (st[d]: the state after d bytes). */
static int walk(const struct jmasker *k, const struct jmatch *m, uint64_t *bits) {
  const struct jvocab *v = k->v;
  const struct jgrammar *g = k->g;
  int words = (v->V + 63) / 64, count = 0;
  memset(bits, 0, sizeof *bits * (size_t)words);
  struct jst *st = malloc(sizeof *st * (size_t)(v->max_len + 1));
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (!st || !md) {
    free(st);
    pcre2_match_data_free(md);
    return -1;
  }
  struct wk w = {g, md};
  memcpy(&st[0], &m->st, sizeof st[0]);
  int dead_at = 1 << 30, idle = idle_string(g, &m->st), l_run = 1 << 30;
  for (int idx = 0; idx < v->n; idx++) {
    int id = v->order[idx];
    if (v->lcp[idx] < l_run) l_run = v->lcp[idx];
    if (idle && v->plain[id]) { /* leaves the state as it was: allowed, nothing stepped */
      bits[id / 64] |= 1ULL << (id % 64);
      count++;
      continue;
    }
    int l = l_run; /* shared with the last token stepped (the minimum over those between) */
    l_run = 1 << 30;
    if (l >= dead_at) continue; /* its prefix died */
    dead_at = 1 << 30;
    const char *b = v->bytes + v->off[id];
    int len = (int)(v->off[id + 1] - v->off[id]);
    int d = l;
    for (; d < len; d++) {
      advance(&w, &st[d], (unsigned char)b[d], &st[d + 1]);
      if (!st[d + 1].n) break;
    }
    if (d < len) {
      dead_at = d + 1;
      continue;
    }
    bits[id / 64] |= 1ULL << (id % 64);
    count++;
  }
  if (st_done(g, &m->st))
    for (int i = 0; i < k->n_stop; i++) {
      int id = k->stop[i];
      if (!(bits[id / 64] >> (id % 64) & 1)) count++;
      bits[id / 64] |= 1ULL << (id % 64);
    }
  free(st);
  pcre2_match_data_free(md);
  return count;
}

int jmasker_mask(struct jmasker *k, const struct jmatch *m, uint64_t *bits) {
  size_t words = (size_t)(k->v->V + 63) / 64;
  char *key = ((struct jmatch *)m)->key; /* its scratch (the caller's thread) */
  size_t kl = st_key(&m->st, key);
  uint64_t h = fnv(key, kl);
  pthread_mutex_lock(&k->mu);
  for (int i = 0; i < k->n_cache; i++) {
    struct centry *c = &k->cache[i];
    if (c->hash == h && c->key_len == kl && !memcmp(c->key, key, kl)) {
      memcpy(bits, c->bits, sizeof *bits * words);
      int count = c->count;
      k->hits++;
      pthread_mutex_unlock(&k->mu);
      return count;
    }
  }
  k->walks++;
  pthread_mutex_unlock(&k->mu);
  int count = walk(k, m, bits);
  uint64_t *copy = count >= 0 ? malloc(sizeof *copy * words) : NULL;
  char *kept = copy ? malloc(kl ? kl : 1) : NULL;
  if (!kept) {
    free(copy);
    return count;
  }
  memcpy(kept, key, kl);
  memcpy(copy, bits, sizeof *copy * words);
  pthread_mutex_lock(&k->mu);
  struct centry *c;
  if (k->n_cache < CACHE_MAX) {
    c = &k->cache[k->n_cache++];
  } else { /* full: replace in turn */
    c = &k->cache[k->next];
    k->next = (k->next + 1) % CACHE_MAX;
    free(c->key), free(c->bits);
  }
  *c = (struct centry){h, kl, kept, copy, count};
  pthread_mutex_unlock(&k->mu);
  return count;
}

int jmasker_apply(struct jmasker *k, struct jmatch *m, float *logits, int V) {
  int words = (k->v->V + 63) / 64;
  if (m->n_words < words) {
    uint64_t *b = realloc(m->bits, sizeof *b * (size_t)words);
    if (!b) return -1;
    m->bits = b, m->n_words = words;
  }
  uint64_t *bits = m->bits;
  int count = jmasker_mask(k, m, bits);
  if (count < 0) return count;
  for (int w = 0; w * 64 < V; w++) { /* a word at a time: most are all one way */
    uint64_t x = w < words ? bits[w] : 0;
    int lo = w * 64, hi = lo + 64 < V ? lo + 64 : V;
    if (x == ~0ULL && hi - lo == 64) continue;
    for (int i = lo; i < hi; i++)
      if (!(x >> (i - lo) & 1)) logits[i] = -INFINITY;
  }
  return count;
}

int jmasker_feed(const struct jmasker *k, struct jmatch *m, int id) {
  for (int i = 0; i < k->n_stop; i++)
    if (k->stop[i] == id) return jmatch_done(m) ? 0 : -1;
  if (id < 0 || id >= k->v->V || k->v->special[id]) return -1;
  return jmatch_feed(m, k->v->bytes + k->v->off[id], k->v->off[id + 1] - k->v->off[id]);
}
