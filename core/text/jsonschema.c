/* JSON Schema checks (jsonschema.h): jschema_new walks the schema once, refusing what it does not
 * understand and compiling every pattern; jschema_check walks the value against the kept copy. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "jsonschema.h"

#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define MAX_DEPTH 64 /* nesting of schemas inside schemas (and of values checked) */
/* schemas applied in one check: anyOf over references back to the schema itself branches at
 * every level (a fuzzed schema took more than 15 s at MAX_DEPTH); past this, refused */
#define MAX_STEPS (1L << 20)

struct pattern {
  const json_t *node; /* the "pattern" string in the kept schema */
  pcre2_code *re;
};

struct jschema {
  json_t *schema; /* owned copy */
  struct pattern *pats;
  int n_pats, cap_pats;
};

static const char *const ANNOTATIONS[] = {"title",      "description", "default",   "examples",
                                          "format",     "$schema",     "$id",       "$comment",
                                          "deprecated", "readOnly",    "writeOnly", NULL};
static const char *const TYPES[] = {"object",  "array",   "string", "number",
                                    "integer", "boolean", "null",   NULL};

static int in_list(const char *const *list, const char *s) {
  for (; *list; list++)
    if (!strcmp(*list, s)) return 1;
  return 0;
}

/* ---- building ---- */

const json_t *jschema_ref(const struct jschema *js, const char *ref) {
  if (ref[0] != '#') return NULL;
  const json_t *at = js->schema;
  const char *p = ref + 1;
  char tok[256];
  while (*p) {
    if (*p != '/' || !json_is_object(at)) return NULL;
    p++;
    size_t n = 0;
    for (; *p && *p != '/'; p++) { /* JSON Pointer's escapes: ~1 is '/', ~0 is '~' */
      char c = *p;
      if (c == '~' && (p[1] == '0' || p[1] == '1')) c = *++p == '0' ? '~' : '/';
      if (n + 1 >= sizeof tok) return NULL;
      tok[n++] = c;
    }
    tok[n] = '\0';
    at = json_object_get(at, tok);
    if (!at) return NULL;
  }
  return at;
}

const json_t *jschema_root(const struct jschema *js) {
  return js->schema;
}

static int build(struct jschema *js, const json_t *s, const char *at, int depth,
                 struct dapo_err *e);

static int need_count(const json_t *v, const char *at, const char *key, struct dapo_err *e) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected a non-negative integer", at, key);
  return 0;
}

static int add_pattern(struct jschema *js, const json_t *v, const char *at, struct dapo_err *e) {
  if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s.pattern: expected a string", at);
  int err;
  PCRE2_SIZE off;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(v), json_string_length(v), PCRE2_UTF,
                                 &err, &off, NULL);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(err, msg, sizeof msg);
    return dapo_errf(e, DAPO_EINVAL, "%s.pattern: %s at offset %zu", at, (const char *)msg,
                     (size_t)off);
  }
  if (js->n_pats == js->cap_pats) {
    int cap = js->cap_pats ? 2 * js->cap_pats : 4;
    struct pattern *p = realloc(js->pats, sizeof *p * (size_t)cap);
    if (!p) {
      pcre2_code_free(re);
      return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", at);
    }
    js->pats = p, js->cap_pats = cap;
  }
  js->pats[js->n_pats++] = (struct pattern){v, re};
  return 0;
}

static int build_type(const json_t *v, const char *at, struct dapo_err *e) {
  if (json_is_string(v)) {
    if (!in_list(TYPES, json_string_value(v)))
      return dapo_errf(e, DAPO_EINVAL, "%s.type: unknown type '%.40s'", at, json_string_value(v));
    return 0;
  }
  if (!json_is_array(v) || json_array_size(v) == 0)
    return dapo_errf(e, DAPO_EINVAL, "%s.type: expected a type name or a list of them", at);
  size_t i;
  json_t *x;
  json_array_foreach(v, i, x) {
    if (!json_is_string(x) || !in_list(TYPES, json_string_value(x)))
      return dapo_errf(e, DAPO_EINVAL, "%s.type[%zu]: expected a type name", at, i);
  }
  return 0;
}

static int build(struct jschema *js, const json_t *s, const char *at, int depth,
                 struct dapo_err *e) {
  if (json_is_boolean(s)) return 0;
  if (!json_is_object(s))
    return dapo_errf(e, DAPO_EINVAL, "%s: expected a schema (an object, or true or false)", at);
  if (depth > MAX_DEPTH) return dapo_errf(e, DAPO_EINVAL, "%s: nested too deeply", at);
  const char *k;
  json_t *v;
  char sub[512];
  json_object_foreach((json_t *)s, k, v) {
    int rc = 0;
    if (in_list(ANNOTATIONS, k)) continue;
    if (!strcmp(k, "type")) {
      rc = build_type(v, at, e);
    } else if (!strcmp(k, "properties")) {
      if (!json_is_object(v))
        return dapo_errf(e, DAPO_EINVAL, "%s.properties: expected an object of schemas", at);
      const char *pk;
      json_t *pv;
      json_object_foreach(v, pk, pv) {
        snprintf(sub, sizeof sub, "%s.properties.%.64s", at, pk);
        if ((rc = build(js, pv, sub, depth + 1, e))) return rc;
      }
    } else if (!strcmp(k, "required")) {
      size_t i;
      json_t *x;
      if (!json_is_array(v))
        return dapo_errf(e, DAPO_EINVAL, "%s.required: expected a list of names", at);
      json_array_foreach(v, i, x) {
        if (!json_is_string(x))
          return dapo_errf(e, DAPO_EINVAL, "%s.required[%zu]: expected a name", at, i);
      }
    } else if (!strcmp(k, "additionalProperties") || !strcmp(k, "items")) {
      snprintf(sub, sizeof sub, "%s.%s", at, k);
      rc = build(js, v, sub, depth + 1, e);
    } else if (!strcmp(k, "anyOf")) {
      size_t i;
      json_t *x;
      if (!json_is_array(v) || json_array_size(v) == 0)
        return dapo_errf(e, DAPO_EINVAL, "%s.anyOf: expected a list of schemas", at);
      json_array_foreach(v, i, x) {
        snprintf(sub, sizeof sub, "%s.anyOf[%zu]", at, i);
        if ((rc = build(js, x, sub, depth + 1, e))) return rc;
      }
    } else if (!strcmp(k, "enum")) {
      if (!json_is_array(v) || json_array_size(v) == 0)
        return dapo_errf(e, DAPO_EINVAL, "%s.enum: expected a list of values", at);
    } else if (!strcmp(k, "const")) {
      /* any value */
    } else if (!strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "exclusiveMinimum") ||
               !strcmp(k, "exclusiveMaximum")) {
      if (!json_is_number(v)) return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected a number", at, k);
    } else if (!strcmp(k, "multipleOf")) {
      if (!json_is_number(v) || !(json_number_value(v) > 0))
        return dapo_errf(e, DAPO_EINVAL, "%s.multipleOf: expected a number above 0", at);
    } else if (!strcmp(k, "minLength") || !strcmp(k, "maxLength") || !strcmp(k, "minItems") ||
               !strcmp(k, "maxItems")) {
      rc = need_count(v, at, k, e);
    } else if (!strcmp(k, "pattern")) {
      rc = add_pattern(js, v, at, e);
    } else if (!strcmp(k, "$defs") || !strcmp(k, "definitions")) {
      if (!json_is_object(v))
        return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected an object of schemas", at, k);
      const char *dk;
      json_t *dv;
      json_object_foreach(v, dk, dv) {
        snprintf(sub, sizeof sub, "%s.%s.%.64s", at, k, dk);
        if ((rc = build(js, dv, sub, depth + 1, e))) return rc;
      }
    } else if (!strcmp(k, "$ref")) {
      if (!json_is_string(v) || !jschema_ref(js, json_string_value(v)))
        return dapo_errf(e, DAPO_EINVAL,
                         "%s.$ref: expected a reference into this schema ('#', '#/$defs/name')",
                         at);
    } else {
      return dapo_errf(e, DAPO_EINVAL, "%s.%.64s: this keyword is not supported", at, k);
    }
    if (rc) return rc;
  }
  return 0;
}

void jschema_free(struct jschema *s) {
  if (!s) return;
  for (int i = 0; i < s->n_pats; i++) pcre2_code_free(s->pats[i].re);
  free(s->pats);
  json_decref(s->schema);
  free(s);
}

struct jschema *jschema_new(const json_t *schema, const char *field, struct dapo_err *e) {
  struct jschema *s = calloc(1, sizeof *s);
  if (!s || !(s->schema = json_deep_copy(schema))) {
    jschema_free(s);
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  if (build(s, s->schema, field, 0, e)) {
    jschema_free(s);
    return NULL;
  }
  return s;
}

/* ---- checking ---- */

static const char *type_of(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "number";
  case JSON_TRUE:
  case JSON_FALSE: return "boolean";
  default: return "null";
  }
}

static int has_type(const json_t *v, const char *t) {
  if (!strcmp(t, "number")) return json_is_number(v);
  if (!strcmp(t, "integer"))
    return json_is_integer(v) || (json_is_real(v) && isfinite(json_real_value(v)) &&
                                  json_real_value(v) == floor(json_real_value(v)));
  return !strcmp(t, type_of(v));
}

/* JSON Schema's equality: numbers by value (1 == 1.0), the rest structurally. */
static int same(const json_t *a, const json_t *b) {
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  return json_equal(a, b);
}

static size_t code_points(const char *s, size_t n) {
  size_t cps = 0;
  for (size_t i = 0; i < n; cps++) {
    size_t l = utf8_next((const unsigned char *)s + i, n - i, NULL);
    i += l ? l : 1;
  }
  return cps;
}

struct ctx {
  const struct jschema *js;
  char *why;
  size_t cap;
  long *steps; /* schemas applied so far in this check, shared with anyOf's quiet tries */
};

static int fail(struct ctx *c, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct ctx *c, const char *at, const char *fmt, ...) {
  if (c->cap) {
    int n = snprintf(c->why, c->cap, "%s: ", at);
    if (n >= 0 && (size_t)n < c->cap) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(c->why + n, c->cap - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return 1;
}

static const pcre2_code *pattern_of(const struct jschema *js, const json_t *node) {
  for (int i = 0; i < js->n_pats; i++)
    if (js->pats[i].node == node) return js->pats[i].re;
  return NULL;
}

const void *jschema_pattern(const struct jschema *js, const json_t *node) {
  return pattern_of(js, node);
}

static int check(struct ctx *c, const json_t *s, const json_t *v, const char *at, int depth);

static int check_number(struct ctx *c, const json_t *s, const json_t *v, const char *at) {
  double x = json_number_value(v);
  const json_t *b;
  if ((b = json_object_get(s, "minimum")) && x < json_number_value(b))
    return fail(c, at, "%g is below the minimum %g", x, json_number_value(b));
  if ((b = json_object_get(s, "maximum")) && x > json_number_value(b))
    return fail(c, at, "%g is above the maximum %g", x, json_number_value(b));
  if ((b = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(b))
    return fail(c, at, "%g is not above %g", x, json_number_value(b));
  if ((b = json_object_get(s, "exclusiveMaximum")) && x >= json_number_value(b))
    return fail(c, at, "%g is not below %g", x, json_number_value(b));
  if ((b = json_object_get(s, "multipleOf"))) {
    double q = x / json_number_value(b);
    if (!isfinite(q) || fabs(q - nearbyint(q)) > 1e-9 * fmax(1.0, fabs(q)))
      return fail(c, at, "%g is not a multiple of %g", x, json_number_value(b));
  }
  return 0;
}

static int check_string(struct ctx *c, const json_t *s, const json_t *v, const char *at) {
  const char *str = json_string_value(v);
  size_t n = json_string_length(v), cps = code_points(str, n);
  const json_t *b;
  if ((b = json_object_get(s, "minLength")) && cps < (size_t)json_integer_value(b))
    return fail(c, at, "%zu characters, fewer than %lld", cps, (long long)json_integer_value(b));
  if ((b = json_object_get(s, "maxLength")) && cps > (size_t)json_integer_value(b))
    return fail(c, at, "%zu characters, more than %lld", cps, (long long)json_integer_value(b));
  const pcre2_code *re = pattern_of(c->js, json_object_get(s, "pattern"));
  if (re) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return fail(c, at, "out of memory");
    int r = pcre2_match(re, (PCRE2_SPTR)str, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    if (r < 0)
      return fail(c, at, "does not match the pattern %.80s",
                  json_string_value(json_object_get(s, "pattern")));
  }
  return 0;
}

static int check_object(struct ctx *c, const json_t *s, const json_t *v, const char *at,
                        int depth) {
  const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
               *extra = json_object_get(s, "additionalProperties");
  char sub[512];
  size_t i;
  json_t *x;
  json_array_foreach(req, i, x) {
    if (!json_object_get(v, json_string_value(x)))
      return fail(c, at, "'%.64s' is required", json_string_value(x));
  }
  const char *k;
  json_t *pv;
  json_object_foreach((json_t *)v, k, pv) {
    snprintf(sub, sizeof sub, "%s.%.64s", at, k);
    const json_t *ps = props ? json_object_get(props, k) : NULL;
    if (ps) {
      if (check(c, ps, pv, sub, depth + 1)) return 1;
    } else if (extra) {
      if (json_is_false(extra)) return fail(c, at, "'%.64s' is not one of its properties", k);
      if (check(c, extra, pv, sub, depth + 1)) return 1;
    }
  }
  return 0;
}

static int check_array(struct ctx *c, const json_t *s, const json_t *v, const char *at, int depth) {
  size_t n = json_array_size(v);
  const json_t *b;
  if ((b = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(b))
    return fail(c, at, "%zu items, fewer than %lld", n, (long long)json_integer_value(b));
  if ((b = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(b))
    return fail(c, at, "%zu items, more than %lld", n, (long long)json_integer_value(b));
  const json_t *items = json_object_get(s, "items");
  char sub[512];
  for (size_t i = 0; items && i < n; i++) {
    snprintf(sub, sizeof sub, "%s[%zu]", at, i);
    if (check(c, items, json_array_get(v, i), sub, depth + 1)) return 1;
  }
  return 0;
}

static int check(struct ctx *c, const json_t *s, const json_t *v, const char *at, int depth) {
  if (json_is_true(s)) return 0;
  if (json_is_false(s)) return fail(c, at, "no value is allowed here");
  if (depth > MAX_DEPTH) return fail(c, at, "nested too deeply");
  if (++*c->steps > MAX_STEPS) return fail(c, at, "the schema takes too many steps to check");
  const json_t *ref = json_object_get(s, "$ref");
  if (ref && check(c, jschema_ref(c->js, json_string_value(ref)), v, at, depth + 1)) return 1;
  const json_t *t = json_object_get(s, "type");
  if (t) {
    int ok = 0;
    if (json_is_string(t)) ok = has_type(v, json_string_value(t));
    for (size_t i = 0; json_is_array(t) && i < json_array_size(t) && !ok; i++)
      ok = has_type(v, json_string_value(json_array_get(t, i)));
    if (!ok) {
      char *want = json_dumps(t, JSON_COMPACT | JSON_ENCODE_ANY);
      int r = fail(c, at, "expected %s, got %s", want ? want : "another type", type_of(v));
      free(want);
      return r;
    }
  }
  const json_t *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
  if (en) {
    int ok = 0;
    for (size_t i = 0; i < json_array_size(en) && !ok; i++) ok = same(json_array_get(en, i), v);
    if (!ok) return fail(c, at, "not one of the allowed values");
  }
  if (co && !same(co, v)) return fail(c, at, "not the one allowed value");
  const json_t *any = json_object_get(s, "anyOf");
  if (any) {
    int ok = 0;
    for (size_t i = 0; i < json_array_size(any) && !ok; i++) {
      struct ctx quiet = {c->js, NULL, 0, c->steps};
      ok = !check(&quiet, json_array_get(any, i), v, at, depth + 1);
    }
    if (!ok) return fail(c, at, "matches none of anyOf's schemas");
  }
  if (json_is_number(v)) return check_number(c, s, v, at);
  if (json_is_string(v)) return check_string(c, s, v, at);
  if (json_is_object(v)) return check_object(c, s, v, at, depth);
  if (json_is_array(v)) return check_array(c, s, v, at, depth);
  return 0;
}

int jschema_check(const struct jschema *s, const json_t *v, const char *root, char *why,
                  size_t cap) {
  long steps = 0;
  struct ctx c = {s, why, cap, &steps};
  if (cap) why[0] = '\0';
  return check(&c, s->schema, v, root, 0);
}

int jschema_check_at(const struct jschema *s, const json_t *node, const json_t *v) {
  long steps = 0;
  struct ctx c = {s, NULL, 0, &steps};
  return check(&c, node, v, "", 0);
}
