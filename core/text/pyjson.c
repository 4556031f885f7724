/* Python's json.dumps, written from its documented output rules (pyjson.h). */
#include "pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct out {
  char *p;
  size_t n, cap;
  int oom;
};

static void put(struct out *o, const char *s, size_t n) {
  if (o->oom) return;
  if (o->n + n + 1 > o->cap) {
    size_t cap = o->cap ? o->cap : 128;
    while (cap < o->n + n + 1) cap *= 2;
    char *q = realloc(o->p, cap);
    if (!q) {
      o->oom = 1;
      return;
    }
    o->p = q;
    o->cap = cap;
  }
  memcpy(o->p + o->n, s, n);
  o->n += n;
  o->p[o->n] = '\0';
}

static void puts_(struct out *o, const char *s) {
  put(o, s, strlen(s));
}

static void string(struct out *o, const char *s, size_t n) {
  put(o, "\"", 1);
  size_t run = 0; /* bytes written as themselves, pending */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char u[8];
    switch (c) {
    case '"': esc = "\\\""; break;
    case '\\': esc = "\\\\"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    default:
      if (c < 0x20) {
        snprintf(u, sizeof u, "\\u%04x", c);
        esc = u;
      }
    }
    if (!esc) {
      run++;
      continue;
    }
    put(o, s + i - run, run);
    run = 0;
    puts_(o, esc);
  }
  put(o, s + n - run, run);
  put(o, "\"", 1);
}

/* Python's repr of a finite double: the shortest %.{p}e that reads back as x, laid out as
 * float_repr_style 'short' does (fixed for exponents -4 to 15, else d.ddde+XX). */
static void real(struct out *o, double x) {
  if (isnan(x)) return puts_(o, "NaN");
  if (isinf(x)) return puts_(o, x > 0 ? "Infinity" : "-Infinity");
  char e[40];
  for (int p = 0; p <= 17; p++) {
    snprintf(e, sizeof e, "%.*e", p, x);
    if (strtod(e, NULL) == x) break;
  }
  /* e: [-]d[.ddd]e[+-]XX */
  char digits[32];
  int nd = 0, neg = e[0] == '-';
  const char *q = e + neg;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  int exp = atoi(q + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--; /* %.0e never leaves these; %.pe may */
  char buf[400];
  size_t k = 0;
  if (neg) buf[k++] = '-';
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      buf[k++] = '0', buf[k++] = '.';
      for (int z = 0; z < -exp - 1; z++) buf[k++] = '0';
      for (int i = 0; i < nd; i++) buf[k++] = digits[i];
    } else {
      for (int i = 0; i <= exp; i++) buf[k++] = i < nd ? digits[i] : '0';
      buf[k++] = '.';
      if (nd > exp + 1)
        for (int i = exp + 1; i < nd; i++) buf[k++] = digits[i];
      else
        buf[k++] = '0';
    }
    buf[k] = '\0';
  } else {
    buf[k++] = digits[0];
    if (nd > 1) {
      buf[k++] = '.';
      for (int i = 1; i < nd; i++) buf[k++] = digits[i];
    }
    snprintf(buf + k, sizeof buf - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  }
  puts_(o, buf);
}

static void newline(struct out *o, int indent, int depth) {
  if (indent < 0) return;
  put(o, "\n", 1);
  for (int i = 0; i < indent * depth; i++) put(o, " ", 1);
}

static void value(struct out *o, const json_t *v, int indent, int depth) {
  char buf[32];
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    if (json_object_size(v) == 0) return puts_(o, "{}");
    put(o, "{", 1);
    const char *key;
    json_t *x;
    int first = 1;
    json_object_foreach((json_t *)v, key, x) {
      if (!first) put(o, indent < 0 ? ", " : ",", indent < 0 ? 2 : 1);
      first = 0;
      newline(o, indent, depth + 1);
      string(o, key, strlen(key));
      put(o, ": ", 2);
      value(o, x, indent, depth + 1);
    }
    newline(o, indent, depth);
    put(o, "}", 1);
    return;
  }
  case JSON_ARRAY: {
    if (json_array_size(v) == 0) return puts_(o, "[]");
    put(o, "[", 1);
    for (size_t i = 0; i < json_array_size(v); i++) {
      if (i) put(o, indent < 0 ? ", " : ",", indent < 0 ? 2 : 1);
      newline(o, indent, depth + 1);
      value(o, json_array_get(v, i), indent, depth + 1);
    }
    newline(o, indent, depth);
    put(o, "]", 1);
    return;
  }
  case JSON_STRING: return string(o, json_string_value(v), json_string_length(v));
  case JSON_INTEGER:
    snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    return puts_(o, buf);
  case JSON_REAL: return real(o, json_real_value(v));
  case JSON_TRUE: return puts_(o, "true");
  case JSON_FALSE: return puts_(o, "false");
  case JSON_NULL: return puts_(o, "null");
  }
}

char *pyjson_dumps(const json_t *v, int indent) {
  struct out o = {0};
  value(&o, v, indent, 0);
  if (o.oom || !o.p) {
    free(o.p);
    return NULL;
  }
  return o.p;
}
