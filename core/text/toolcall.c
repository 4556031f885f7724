/* Tool-call formats (toolcall.h): reading a model's turn, writing the answers back. */
#include "toolcall.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const NAMES[TC_COUNT] = {"dapod"};

int tc_format_find(const char *name) {
  for (int i = 0; name && i < TC_COUNT; i++)
    if (!strcmp(NAMES[i], name)) return i;
  return -1;
}

const char *tc_format_name(enum tc_format f) {
  return f >= 0 && f < TC_COUNT ? NAMES[f] : "unknown";
}

void tc_turn_free(struct tc_turn *t) {
  for (int i = 0; i < t->n_calls; i++) json_decref(t->calls[i].arguments);
  t->n_calls = 0;
}

static int malformed(struct tc_turn *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int malformed(struct tc_turn *t, const char *fmt, ...) {
  tc_turn_free(t);
  t->malformed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->why, sizeof t->why, fmt, ap);
  va_end(ap);
  return 0;
}

static int is_name_char(int c, int first) {
  return isalpha(c) || c == '_' || (!first && (isdigit(c) || c == '-' || c == '.'));
}

/* dapod: "@" [name] [spaces JSON-object] [spaces], the whole turn. */
static int read_dapod(const char *s, size_t n, const char *const *tools, int n_tools,
                      struct tc_turn *t) {
  size_t i = 0;
  while (i < n && isspace((unsigned char)s[i])) i++;
  if (i == n || s[i] != '@') return 0; /* a final answer */
  i++;
  size_t name0 = i;
  while (i < n && is_name_char((unsigned char)s[i], i == name0)) i++;
  size_t name_len = i - name0;
  if (name_len > TC_NAME_MAX)
    return malformed(t, "the tool's name is longer than %d bytes", TC_NAME_MAX);
  struct tc_call *c = &t->calls[0];
  if (name_len == 0) {
    if (n_tools != 1)
      return malformed(t, "name the tool after '@' (this job has %d tools)", n_tools);
    snprintf(c->name, sizeof c->name, "%s", tools[0]);
  } else {
    memcpy(c->name, s + name0, name_len);
    c->name[name_len] = '\0';
  }
  int known = 0;
  for (int k = 0; k < n_tools && !known; k++) known = !strcmp(tools[k], c->name);
  if (!known) return malformed(t, "there is no tool '%s'", c->name);
  while (i < n && isspace((unsigned char)s[i])) i++;
  size_t end = n;
  while (end > i && isspace((unsigned char)s[end - 1])) end--;
  if (i == end) {
    if (!(c->arguments = json_object())) return DAPO_ENOMEM;
  } else {
    json_error_t je;
    c->arguments = json_loadb(s + i, end - i, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!c->arguments) return malformed(t, "the arguments are not JSON: %s", je.text);
    if (!json_is_object(c->arguments)) {
      json_decref(c->arguments);
      c->arguments = NULL;
      return malformed(t, "the arguments must be a JSON object");
    }
  }
  t->n_calls = 1;
  return 0;
}

int tc_read_turn(enum tc_format f, const char *text, size_t len, const char *const *tools,
                 int n_tools, struct tc_turn *out) {
  memset(out, 0, sizeof *out);
  switch (f) {
  case TC_DAPOD: return read_dapod(text, len, tools, n_tools, out);
  default: return malformed(out, "unknown tool-call format");
  }
}

int tc_render_answers(enum tc_format f, const struct tc_answer *a, int n, char **out) {
  size_t need = 1;
  for (int i = 0; i < n; i++) need += strlen(a[i].content) + 2;
  char *buf = malloc(need), *p = buf;
  *out = buf;
  if (!buf) return DAPO_ENOMEM;
  (void)f; /* TC_DAPOD: "=" content "\n" per answer, ">" content "\n" per observation */
  for (int i = 0; i < n; i++) {
    size_t k = strlen(a[i].content);
    *p++ = !a[i].role || !strcmp(a[i].role, "tool") ? '=' : '>';
    memcpy(p, a[i].content, k);
    p += k;
    *p++ = '\n';
  }
  *p = '\0';
  return 0;
}
