/* The `math` judge's rules (judge.h): find the answer a response states (last \boxed{}, "answer
 * is", "####", "=", last number), bring both sides to a canonical string, and compare them as
 * exact rationals, decimals within 1e-9 (relative), element-wise lists or canonical strings.
 * Pure functions over NUL-terminated UTF-8; every buffer is bounded by MATH_MAX_INPUT. */
#include "judge.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Answers longer than this are read only up to here (no real answer comes close). */
#define MATH_MAX_INPUT (64 * 1024)
/* Normalisation grows a string by at most 4 bytes per "\frac12"-style shorthand (< 3x). */
#define MATH_MAX_OUTPUT (4 * MATH_MAX_INPUT + 64)
#define MATH_MAX_DEPTH 8
/* Marks where a \text{} began (units: "5\text{ m}"); removed with the white space. */
#define TEXT_MARK '\x01'

/* ---- A bounded string builder ---- */

struct sb {
  char *p;
  size_t n, cap;
  int bad; /* allocation failed or the cap was hit */
};

static void sb_putn(struct sb *b, const char *s, size_t n) {
  if (b->bad) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    if (cap > MATH_MAX_OUTPUT) {
      b->bad = 1;
      return;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
      b->bad = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static void sb_putc(struct sb *b, char c) {
  sb_putn(b, &c, 1);
}

static void sb_puts(struct sb *b, const char *s) {
  sb_putn(b, s, strlen(s));
}

/* Returns the built string (owned) or NULL after a failure. */
static char *sb_take(struct sb *b) {
  if (b->bad) {
    free(b->p);
    return NULL;
  }
  if (!b->p) return strdup("");
  return b->p;
}

static char *dupn(const char *s, size_t n) {
  if (n > MATH_MAX_INPUT) n = MATH_MAX_INPUT;
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static int is_sp(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int is_digit(int c) {
  return c >= '0' && c <= '9';
}

static int is_alpha(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* ---- Extraction ---- */

/* The matching '}' for the '{' at open (escaped \{ \} do not count), or NULL. */
static const char *match_brace(const char *open) {
  int depth = 0;
  for (const char *p = open; *p; p++) {
    if (*p == '\\' && (p[1] == '{' || p[1] == '}')) {
      p++;
      continue;
    }
    if (*p == '{') depth++;
    if (*p == '}' && --depth == 0) return p;
  }
  return NULL;
}

/* The content of the last closed \boxed{...} / \fbox{...} (or "\boxed 5"): *len bytes at the
 * returned pointer, or NULL. */
static const char *last_boxed(const char *s, size_t *len) {
  const char *best = NULL;
  for (const char *p = strchr(s, '\\'); p; p = strchr(p + 1, '\\')) {
    size_t m = 0;
    if (!strncmp(p, "\\boxed", 6))
      m = 6;
    else if (!strncmp(p, "\\fbox", 5))
      m = 5;
    else
      continue;
    const char *q = p + m;
    if (is_alpha(*q)) continue; /* some other macro, e.g. \boxedtext */
    while (*q == ' ') q++;
    if (*q == '{') {
      const char *close = match_brace(q);
      if (close) {
        best = q + 1;
        *len = (size_t)(close - q - 1);
      }
    } else if (m == 6 && q > p + m) { /* "\boxed 42": one token */
      const char *e = q;
      while (*e && !is_sp((unsigned char)*e) && *e != '$') e++;
      if (e > q) {
        best = q;
        *len = (size_t)(e - q);
      }
    }
  }
  return best;
}

/* End of the sentence or line that starts at s: a newline, or . ! ? followed by white space or
 * the end (so "3.5" does not end a sentence). */
static const char *sentence_end(const char *s) {
  const char *p = s;
  for (; *p; p++) {
    if (*p == '\n') break;
    if ((*p == '.' || *p == '!' || *p == '?') && (p[1] == '\0' || is_sp((unsigned char)p[1])))
      break;
  }
  return p;
}

static int ci_prefix(const char *s, const char *lit) {
  for (; *lit; s++, lit++)
    if (tolower((unsigned char)*s) != *lit) return 0;
  return 1;
}

/* The position right after the last "answer is", "answer:" or "####", or NULL. */
static const char *after_last_phrase(const char *s) {
  static const char *const phrases[] = {"answer is", "answer:", "####"};
  const char *best = NULL;
  for (const char *p = s; *p; p++) {
    for (size_t k = 0; k < sizeof phrases / sizeof *phrases; k++) {
      if (ci_prefix(p, phrases[k])) best = p + strlen(phrases[k]);
    }
  }
  return best;
}

/* The segment after pos (leading spaces, ':' and markdown '*' skipped) up to the end of its
 * sentence; NULL when empty. */
static char *segment_after(const char *pos) {
  while (*pos && (is_sp((unsigned char)*pos) || *pos == ':' || *pos == '*')) pos++;
  const char *end = sentence_end(pos);
  while (end > pos && is_sp((unsigned char)end[-1])) end--;
  if (end == pos) return NULL;
  return dupn(pos, (size_t)(end - pos));
}

/* A number token at p: [-]digits[,ddd...][.digits][/digits]; returns its end or p. */
static const char *number_end(const char *p) {
  const char *q = p;
  if (*q == '-') q++;
  if (!is_digit((unsigned char)*q) && !(*q == '.' && is_digit((unsigned char)q[1]))) return p;
  while (is_digit((unsigned char)*q)) q++;
  while (q[0] == ',' && is_digit((unsigned char)q[1]) && is_digit((unsigned char)q[2]) &&
         is_digit((unsigned char)q[3]) && !is_digit((unsigned char)q[4]))
    q += 4;
  if (*q == '.' && is_digit((unsigned char)q[1])) {
    q++;
    while (is_digit((unsigned char)*q)) q++;
  }
  if (*q == '/' && is_digit((unsigned char)q[1])) {
    q++;
    while (is_digit((unsigned char)*q)) q++;
  }
  return q;
}

static char *last_number(const char *s) {
  const char *best = NULL, *best_end = NULL;
  const char *p = s;
  while (*p) {
    int starts = is_digit((unsigned char)*p) || (*p == '.' && is_digit((unsigned char)p[1])) ||
                 (*p == '-' && (is_digit((unsigned char)p[1]) || p[1] == '.'));
    /* a '-' directly after a letter or digit is an operator, not a sign */
    if (*p == '-' && p > s && (isalnum((unsigned char)p[-1]))) starts = 0;
    if (starts) {
      const char *e = number_end(p);
      if (e > p && !(e == p + 1 && *p == '-')) {
        best = p;
        best_end = e;
        p = e;
        continue;
      }
    }
    p++;
  }
  return best ? dupn(best, (size_t)(best_end - best)) : NULL;
}

char *judge_math_extract(const char *response) {
  if (!response) return NULL;
  size_t len;
  const char *b = last_boxed(response, &len);
  if (b) return dupn(b, len);
  const char *after = after_last_phrase(response);
  if (after) {
    char *seg = segment_after(after);
    if (seg) return seg;
  }
  const char *eq = strrchr(response, '=');
  if (eq) {
    char *seg = segment_after(eq + 1);
    if (seg) return seg;
  }
  return last_number(response);
}

/* ---- Normalisation ---- */

/* Macros whose braces are dropped but whose content is kept. */
static int is_text_macro(const char *name, size_t n) {
  static const char *const names[] = {"text",   "textbf",       "textit", "textrm", "textsf",
                                      "mathrm", "mathbf",       "mathit", "mbox",   "textnormal",
                                      "hbox",   "operatorname", "mathsf"};
  for (size_t k = 0; k < sizeof names / sizeof *names; k++)
    if (strlen(names[k]) == n && !memcmp(names[k], name, n)) return 1;
  return 0;
}

static int name_is(const char *name, size_t n, const char *lit) {
  return strlen(lit) == n && !memcmp(name, lit, n);
}

/* Degree marks at p: "^\circ", "^{\circ}", "^\circ" with spaces; returns the length or 0. */
static size_t degree_len(const char *p) {
  if (*p != '^') return 0;
  const char *q = p + 1;
  while (*q == ' ') q++;
  if (!strncmp(q, "\\circ", 5) && !is_alpha((unsigned char)q[5])) return (size_t)(q + 5 - p);
  if (*q == '{') {
    q++;
    while (*q == ' ') q++;
    if (strncmp(q, "\\circ", 5) || is_alpha((unsigned char)q[5])) return 0;
    q += 5;
    while (*q == ' ') q++;
    if (*q == '}') return (size_t)(q + 1 - p);
  }
  return 0;
}

/* Pass 1: one left-to-right rewrite of delimiters, macros and odd characters. */
static char *rewrite_tokens(const char *s) {
  struct sb b = {0};
  unsigned char unwrap[64]; /* per open brace: 1 when it belongs to a \text-like macro */
  int depth = 0;
  const char *p = s;
  while (*p) {
    unsigned char c = (unsigned char)*p;
    size_t dl;
    if (!strncmp(p, "\xE2\x88\x92", 3)) { /* U+2212 MINUS SIGN */
      sb_putc(&b, '-');
      p += 3;
    } else if (!strncmp(p, "\xC2\xA0", 2)) { /* NBSP */
      sb_putc(&b, ' ');
      p += 2;
    } else if (!strncmp(p, "\xE2\x80\x89", 3) || !strncmp(p, "\xE2\x80\xAF", 3)) {
      sb_putc(&b, ' '); /* thin spaces */
      p += 3;
    } else if (!strncmp(p, "\xC2\xB0", 2)) { /* degree sign */
      p += 2;
    } else if ((dl = degree_len(p)) > 0) {
      p += dl;
    } else if (c == '$' || c == '%') {
      p++;
    } else if (c == '*' && p[1] == '*') { /* markdown bold */
      p += 2;
    } else if (c == '~') {
      sb_putc(&b, ' ');
      p++;
    } else if (c == '{' && p[1] == ',' && p[2] == '}') { /* 1{,}234 */
      sb_putc(&b, ',');
      p += 3;
    } else if (c == '{') {
      if (depth < (int)sizeof unwrap) unwrap[depth] = 0;
      depth++;
      sb_putc(&b, '{');
      p++;
    } else if (c == '}') {
      if (depth > 0) {
        depth--;
        if (depth < (int)sizeof unwrap && unwrap[depth]) {
          sb_putc(&b, ' ');
          p++;
          continue;
        }
      }
      sb_putc(&b, '}');
      p++;
    } else if (c == '\\') {
      char d = p[1];
      if (d == '$' || d == '%' || d == '(' || d == ')' || d == '[' || d == ']') {
        p += 2;
      } else if (d == '!' || d == ',' || d == ';' || d == ':' || d == ' ') {
        sb_putc(&b, ' ');
        p += 2;
      } else if (is_alpha((unsigned char)d)) {
        const char *name = p + 1;
        size_t n = 0;
        while (is_alpha((unsigned char)name[n])) n++;
        const char *after = name + n;
        if (name_is(name, n, "left") || name_is(name, n, "right") || name_is(name, n, "bigl") ||
            name_is(name, n, "bigr") || name_is(name, n, "Bigl") || name_is(name, n, "Bigr") ||
            name_is(name, n, "big") || name_is(name, n, "Big")) {
          p = after;
          if (*p == '.') p++; /* \left. and \right. are invisible */
        } else if (name_is(name, n, "dfrac") || name_is(name, n, "tfrac") ||
                   name_is(name, n, "cfrac")) {
          sb_puts(&b, "\\frac");
          p = after;
        } else if (name_is(name, n, "displaystyle")) {
          p = after;
        } else if (name_is(name, n, "quad") || name_is(name, n, "qquad")) {
          sb_putc(&b, ' ');
          p = after;
        } else if (is_text_macro(name, n)) {
          const char *q = after;
          while (*q == ' ') q++;
          if (*q == '{') {
            if (depth < (int)sizeof unwrap) unwrap[depth] = 1;
            depth++;
            sb_putc(&b, TEXT_MARK);
            p = q + 1;
          } else {
            p = after;
          }
        } else {
          sb_putn(&b, p, (size_t)(after - p));
          p = after;
        }
      } else if (d) {
        sb_putn(&b, p, 2);
        p += 2;
      } else {
        p++;
      }
    } else {
      sb_putc(&b, (char)c);
      p++;
    }
  }
  return sb_take(&b);
}

/* Trims white space (and text marks) and trailing periods ("5." means 5) in place. */
static void trim_inplace(char *s) {
  size_t n = strlen(s), i = 0;
  while (n > 0 && (is_sp((unsigned char)s[n - 1]) || s[n - 1] == '.' || s[n - 1] == TEXT_MARK)) n--;
  s[n] = '\0';
  while (is_sp((unsigned char)s[i]) || s[i] == TEXT_MARK) i++;
  memmove(s, s + i, n - i + 1);
}

/* 1 when s holds a digit that is not an exponent ("cm^2", "m^{3}" hold none). */
static int has_plain_digit(const char *s) {
  for (const char *p = s; *p; p++) {
    if (!is_digit((unsigned char)*p)) continue;
    const char *q = p;
    while (q > s && is_digit((unsigned char)q[-1])) q--;
    if (q > s && q[-1] == '^') continue;
    if (q > s + 1 && q[-1] == '{' && q[-2] == '^') continue;
    return 1;
  }
  return 0;
}

/* Cuts "42 apples", "5 cm^2", "18 dollars per week" to the leading expression: at the first space
 * (outside braces) followed by a word of two or more letters, or a \text{} (units), when what comes
 * before holds a digit and what follows holds none, so a hedge such as "2 or 3" stays whole (and
 * wrong). Plain words ("New York") are left alone. */
static void cut_trailing_words(char *s) {
  int depth = 0, seen_digit = 0;
  for (char *p = s; *p; p++) {
    if (*p == '{')
      depth++;
    else if (*p == '}' && depth > 0)
      depth--;
    else if (is_digit((unsigned char)*p))
      seen_digit = 1;
    else if (depth == 0 && seen_digit &&
             (*p == TEXT_MARK ||
              (*p == ' ' && is_alpha((unsigned char)p[1]) && is_alpha((unsigned char)p[2])))) {
      if (!has_plain_digit(p)) *p = '\0';
      return;
    }
  }
}

/* "1,234,567.5" (the whole string, no spaces) loses its commas; "1,2" and "1, 234" do not. */
static void drop_thousands(char *s) {
  const char *p = s;
  if (*p == '-' || *p == '+') p++;
  const char *d0 = p;
  while (is_digit((unsigned char)*p)) p++;
  if (p == d0 || p - d0 > 3 || *p != ',') return;
  while (*p == ',') {
    if (!(is_digit((unsigned char)p[1]) && is_digit((unsigned char)p[2]) &&
          is_digit((unsigned char)p[3])))
      return;
    p += 4;
  }
  if (*p == '.') {
    p++;
    while (is_digit((unsigned char)*p)) p++;
  }
  if (*p) return;
  char *w = s;
  for (const char *r = s; *r; r++)
    if (*r != ',') *w++ = *r;
  *w = '\0';
}

static void drop_spaces(char *s) {
  char *w = s;
  for (const char *r = s; *r; r++)
    if (!is_sp((unsigned char)*r) && *r != TEXT_MARK) *w++ = *r;
  *w = '\0';
}

/* Length of an identifier at s: \?[A-Za-z]+ with an optional subscript _x / _{xy} and an
 * optional single-letter argument list "(x)"; 0 when there is none. */
static size_t ident_len(const char *s) {
  const char *p = s;
  if (*p == '\\') p++;
  const char *a = p;
  while (is_alpha((unsigned char)*p)) p++;
  if (p == a) return 0;
  if (*p == '_') {
    if (isalnum((unsigned char)p[1]))
      p += 2;
    else if (p[1] == '{') {
      const char *q = p + 2;
      while (isalnum((unsigned char)*q)) q++;
      if (*q != '}' || q == p + 2) return 0;
      p = q + 1;
    } else
      return 0;
  }
  if (p[0] == '(' && is_alpha((unsigned char)p[1]) && p[2] == ')') p += 3;
  return (size_t)(p - s);
}

/* "x=5" -> "5", "y=2x+3" -> "2x+3" (spaces already gone). */
static void drop_assignment(char *s) {
  for (;;) {
    size_t n = ident_len(s);
    if (!n || s[n] != '=' || s[n + 1] == '=' || s[n + 1] == '\0') return;
    memmove(s, s + n + 1, strlen(s + n + 1) + 1);
  }
}

/* One argument of \frac / \sqrt at p: a {group}, a \macro or one character. */
static const char *macro_arg(const char *p, const char **start, size_t *len) {
  if (*p == '{') {
    const char *close = match_brace(p);
    if (!close) return NULL;
    *start = p + 1;
    *len = (size_t)(close - p - 1);
    return close + 1;
  }
  if (*p == '\\' && is_alpha((unsigned char)p[1])) {
    const char *q = p + 1;
    while (is_alpha((unsigned char)*q)) q++;
    *start = p;
    *len = (size_t)(q - p);
    return q;
  }
  if (*p && *p != '}' && *p != '^' && *p != '_') {
    *start = p;
    *len = 1;
    return p + 1;
  }
  return NULL;
}

/* \frac12 -> \frac{1}{2}, \frac1{x} -> \frac{1}{x}, \sqrt2 -> \sqrt{2} (no spaces left). */
static char *brace_macro_args(const char *s, int depth) {
  struct sb b = {0};
  const char *p = s;
  while (*p) {
    int is_frac =
        depth < MATH_MAX_DEPTH && !strncmp(p, "\\frac", 5) && !is_alpha((unsigned char)p[5]);
    int is_sqrt = depth < MATH_MAX_DEPTH && !strncmp(p, "\\sqrt", 5) &&
                  !is_alpha((unsigned char)p[5]) && p[5] != '[';
    if (is_frac || is_sqrt) {
      const char *a, *c = NULL;
      size_t al, cl = 0;
      const char *q = macro_arg(p + 5, &a, &al);
      if (q && is_frac) q = macro_arg(q, &c, &cl);
      if (q) {
        sb_puts(&b, is_frac ? "\\frac{" : "\\sqrt{");
        char *inner = dupn(a, al), *inner_fixed = inner ? brace_macro_args(inner, depth + 1) : NULL;
        if (inner_fixed)
          sb_puts(&b, inner_fixed);
        else
          b.bad = 1;
        free(inner);
        free(inner_fixed);
        sb_putc(&b, '}');
        if (is_frac) {
          inner = dupn(c, cl);
          inner_fixed = inner ? brace_macro_args(inner, depth + 1) : NULL;
          sb_putc(&b, '{');
          if (inner_fixed)
            sb_puts(&b, inner_fixed);
          else
            b.bad = 1;
          free(inner);
          free(inner_fixed);
          sb_putc(&b, '}');
        }
        p = q;
        continue;
      }
    }
    sb_putc(&b, *p++);
  }
  return sb_take(&b);
}

/* "(B)" -> "B": a lone letter in parentheses (multiple-choice answers). */
static void drop_choice_parens(char *s) {
  if (s[0] == '(' && is_alpha((unsigned char)s[1]) && s[2] == ')' && s[3] == '\0') {
    s[0] = s[1];
    s[1] = '\0';
  }
}

/* "\pi/2" -> "\frac{\pi}{2}" when the string is a single top-level quotient of simple terms. */
static char *slash_to_frac(char *s) {
  int depth = 0;
  char *slash = NULL;
  for (char *p = s; *p; p++) {
    if (*p == '{' || *p == '(' || *p == '[')
      depth++;
    else if ((*p == '}' || *p == ')' || *p == ']') && depth > 0)
      depth--;
    else if (depth == 0) {
      if (*p == '/') {
        if (slash) return s;
        slash = p;
      } else if (*p == '+' || *p == ',' || *p == '=' || (*p == '-' && p != s) || *p == '<' ||
                 *p == '>') {
        return s;
      }
    }
  }
  if (!slash || slash == s || slash[1] == '\0') return s;
  const char *num = s;
  int neg = 0;
  if (*num == '-') {
    neg = 1;
    num++;
  }
  if (num == slash) return s;
  struct sb b = {0};
  if (neg) sb_putc(&b, '-');
  sb_puts(&b, "\\frac{");
  sb_putn(&b, num, (size_t)(slash - num));
  sb_puts(&b, "}{");
  sb_puts(&b, slash + 1);
  sb_putc(&b, '}');
  char *out = sb_take(&b);
  if (!out) return NULL;
  free(s);
  return out;
}

/* The content of a \boxed{} in an answer, or what follows "####" (GSM8K's answer lines). */
static char *unwrap_answer(const char *s) {
  size_t len;
  const char *b = last_boxed(s, &len);
  if (b) return dupn(b, len);
  const char *h = NULL;
  for (const char *p = strstr(s, "####"); p; p = strstr(p + 1, "####")) h = p + 4;
  if (h) {
    while (is_sp((unsigned char)*h)) h++;
    const char *e = h;
    while (*e && *e != '\n') e++;
    return dupn(h, (size_t)(e - h));
  }
  return dupn(s, strlen(s));
}

char *judge_math_normalize(const char *in) {
  if (!in) in = "";
  char *s = unwrap_answer(in);
  if (!s) return NULL;
  char *t = rewrite_tokens(s);
  free(s);
  if (!t) return NULL;
  trim_inplace(t);
  cut_trailing_words(t);
  trim_inplace(t);
  drop_thousands(t);
  drop_spaces(t);
  drop_assignment(t);
  trim_inplace(t);
  if (t[0] == '+' && t[1]) memmove(t, t + 1, strlen(t));
  drop_choice_parens(t);
  char *u = brace_macro_args(t, 0);
  free(t);
  if (!u) return NULL;
  return slash_to_frac(u);
}

/* ---- Numbers ---- */

struct num {
  int exact;   /* p/q holds the value exactly (reduced, q > 0) */
  int decimal; /* written with a decimal point or exponent somewhere */
  int64_t p, q;
  double v;
};

static __int128 gcd128(__int128 a, __int128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b) {
    __int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Sets x to p/q (q != 0), reduced; inexact when it does not fit in int64. */
static void num_set(struct num *x, __int128 p, __int128 q, double v) {
  if (q < 0) {
    p = -p;
    q = -q;
  }
  __int128 g = gcd128(p, q);
  if (g > 1) {
    p /= g;
    q /= g;
  }
  x->v = v;
  x->exact = x->exact && p <= INT64_MAX && p >= -INT64_MAX && q <= INT64_MAX;
  if (x->exact) {
    x->p = (int64_t)p;
    x->q = (int64_t)q;
  }
}

/* Unsigned decimal at s: digits[.digits][e[+-]digits] or .digits. Returns its end or NULL. */
static const char *parse_atom(const char *s, struct num *x) {
  memset(x, 0, sizeof *x);
  const char *p = s;
  __int128 m = 0, q = 1;
  int digits = 0, exact = 1, decimal = 0;
  while (is_digit((unsigned char)*p)) {
    if (m < (__int128)1e30)
      m = m * 10 + (*p - '0');
    else
      exact = 0;
    p++;
    digits++;
  }
  if (*p == '.') {
    const char *f = p + 1;
    int fd = 0;
    while (is_digit((unsigned char)*f)) {
      if (m < (__int128)1e30 && q < (__int128)1e30) {
        m = m * 10 + (*f - '0');
        q *= 10;
      } else {
        exact = 0;
      }
      f++;
      fd++;
    }
    if (digits + fd == 0) return NULL;
    if (fd > 0 || digits > 0) {
      p = f;
      decimal = 1;
      digits += fd;
    }
  }
  if (!digits) return NULL;
  if ((*p == 'e' || *p == 'E') &&
      (is_digit((unsigned char)p[1]) ||
       ((p[1] == '-' || p[1] == '+') && is_digit((unsigned char)p[2])))) {
    const char *e = p + 1;
    int sign = 1, ex = 0;
    if (*e == '-' || *e == '+') sign = *e++ == '-' ? -1 : 1;
    while (is_digit((unsigned char)*e)) {
      if (ex < 10000) ex = ex * 10 + (*e - '0');
      e++;
    }
    for (int k = 0; k < ex && exact; k++) {
      if (sign > 0) {
        if (m > (__int128)1e30)
          exact = 0;
        else
          m *= 10;
      } else {
        if (q > (__int128)1e30)
          exact = 0;
        else
          q *= 10;
      }
    }
    p = e;
    decimal = 1;
  }
  char buf[128];
  size_t len = (size_t)(p - s);
  double v = 0;
  if (len < sizeof buf) {
    memcpy(buf, s, len);
    buf[len] = '\0';
    v = strtod(buf, NULL);
  } else {
    v = HUGE_VAL;
    exact = 0;
  }
  x->exact = exact;
  x->decimal = decimal;
  if (exact)
    num_set(x, m, q, v);
  else
    x->v = v;
  return p;
}

static int num_div(struct num *out, const struct num *a, const struct num *b) {
  if (b->v == 0 && (!b->exact || b->p == 0)) return -1;
  out->exact = a->exact && b->exact;
  out->decimal = a->decimal || b->decimal;
  double v = a->v / b->v;
  if (out->exact)
    num_set(out, (__int128)a->p * b->q, (__int128)a->q * b->p, v);
  else
    out->v = v;
  return 0;
}

static const char *parse_value(const char *s, struct num *x, int depth);

/* \frac{a}{b} at s (s points at the backslash). */
static const char *parse_frac(const char *s, struct num *x, int depth) {
  if (strncmp(s, "\\frac{", 6) || depth > MATH_MAX_DEPTH) return NULL;
  struct num a, b;
  const char *p = parse_value(s + 6, &a, depth + 1);
  if (!p || *p != '}' || p[1] != '{') return NULL;
  p = parse_value(p + 2, &b, depth + 1);
  if (!p || *p != '}') return NULL;
  if (num_div(x, &a, &b)) return NULL;
  return p + 1;
}

/* [+-] ( \frac{}{} | atom \frac{}{} (mixed number) | atom / [+-]atom | atom ). Returns the end of
 * what it read, or NULL. */
static const char *parse_value(const char *s, struct num *x, int depth) {
  memset(x, 0, sizeof *x);
  int neg = 0;
  const char *p = s;
  if (*p == '-' || *p == '+') neg = *p++ == '-';
  const char *q;
  if ((q = parse_frac(p, x, depth)) != NULL) {
    p = q;
  } else {
    struct num a;
    q = parse_atom(p, &a);
    if (!q) return NULL;
    p = q;
    struct num f;
    if (!a.decimal && (q = parse_frac(p, &f, depth)) != NULL && f.v >= 0) { /* 2\frac{1}{2} */
      x->exact = a.exact && f.exact;
      x->decimal = f.decimal;
      if (x->exact)
        num_set(x, (__int128)a.p * f.q + f.p, f.q, a.v + f.v);
      else
        x->v = a.v + f.v;
      p = q;
    } else if (*p == '/') {
      struct num b;
      int bneg = 0;
      const char *r = p + 1;
      if (*r == '-' || *r == '+') bneg = *r++ == '-';
      r = parse_atom(r, &b);
      if (!r) return NULL;
      if (bneg) {
        if (b.exact) b.p = -b.p;
        b.v = -b.v;
      }
      if (num_div(x, &a, &b)) return NULL;
      p = r;
    } else {
      *x = a;
    }
  }
  if (neg) {
    if (x->exact) x->p = -x->p;
    x->v = -x->v;
  }
  return p;
}

/* The whole of s as a number; 0 when it is one. */
static int parse_number(const char *s, struct num *x) {
  if (!*s) return -1;
  const char *end = parse_value(s, x, 0);
  return end && *end == '\0' ? 0 : -1;
}

static int num_equal(const struct num *a, const struct num *b, const char *sa, const char *sb_) {
  if (a->exact && b->exact && a->p == b->p && a->q == b->q) return 1;
  if (a->exact && b->exact && !a->decimal && !b->decimal) return 0;
  if (!a->decimal && !b->decimal) return strcmp(sa, sb_) == 0; /* huge integers: digits */
  if (!isfinite(a->v) || !isfinite(b->v)) return 0;
  double d = fabs(a->v - b->v), m = fmax(fabs(a->v), fabs(b->v));
  return d <= 1e-9 * m;
}

/* ---- Comparison of canonical strings ---- */

static int plain_words(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!is_alpha((unsigned char)*s)) return 0;
  return 1;
}

/* Opening and closing delimiters of a bracketed list ("(", "[", "\{", "{"): lengths, 0 if none. */
static void delimiters(const char *s, size_t n, size_t *lo, size_t *lc) {
  *lo = *lc = 0;
  if (n >= 4 && !strncmp(s, "\\{", 2) && !strncmp(s + n - 2, "\\}", 2)) {
    *lo = *lc = 2;
    return;
  }
  if (n >= 2 && strchr("([{", s[0]) && strchr(")]}", s[n - 1])) *lo = *lc = 1;
}

/* Splits s[0..n) at top-level commas into at most cap pieces; returns the count, -1 if more. */
static int split_commas(const char *s, size_t n, const char **start, size_t *len, int cap) {
  int k = 0, depth = 0;
  size_t from = 0;
  for (size_t i = 0; i <= n; i++) {
    char c = i < n ? s[i] : ',';
    if (c == '{' || c == '(' || c == '[')
      depth++;
    else if ((c == '}' || c == ')' || c == ']') && depth > 0)
      depth--;
    else if (c == ',' && depth == 0) {
      if (k == cap) return -1;
      start[k] = s + from;
      len[k] = i - from;
      k++;
      from = i + 1;
    }
  }
  return k;
}

static int equal_norm(const char *a, const char *b, int depth);

static int equal_lists(const char *a, const char *b, int depth) {
  enum { CAP = 64 };
  size_t na = strlen(a), nb = strlen(b), loa, lca, lob, lcb;
  delimiters(a, na, &loa, &lca);
  delimiters(b, nb, &lob, &lcb);
  if (loa != lob || strncmp(a, b, loa) || (lca && strncmp(a + na - lca, b + nb - lcb, lca)))
    return 0;
  const char *sa[CAP], *sbp[CAP];
  size_t la[CAP], lb[CAP];
  int ka = split_commas(a + loa, na - loa - lca, sa, la, CAP);
  int kb = split_commas(b + lob, nb - lob - lcb, sbp, lb, CAP);
  if (ka < 2 || ka != kb) return 0;
  for (int i = 0; i < ka; i++) {
    char *x = dupn(sa[i], la[i]), *y = dupn(sbp[i], lb[i]);
    int eq = x && y ? equal_norm(x, y, depth + 1) : -1;
    free(x);
    free(y);
    if (eq != 1) return eq;
  }
  return 1;
}

static int equal_norm(const char *a, const char *b, int depth) {
  struct num x, y;
  if (parse_number(a, &x) == 0 && parse_number(b, &y) == 0) return num_equal(&x, &y, a, b);
  if (!strcmp(a, b)) return 1;
  if (plain_words(a) && plain_words(b)) return strcasecmp(a, b) == 0;
  if (depth < MATH_MAX_DEPTH && strchr(a, ',') && strchr(b, ',')) return equal_lists(a, b, depth);
  return 0;
}

int judge_math_equal(const char *a, const char *b) {
  char *na = judge_math_normalize(a), *nb = judge_math_normalize(b);
  int eq = na && nb ? equal_norm(na, nb, 0) : -1;
  if (na && nb && !*na && !*nb) eq = 0; /* nothing is never an answer */
  free(na);
  free(nb);
  return eq;
}
