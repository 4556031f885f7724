/* Tool-call formats (toolcall.h): reading a model's turn, writing the answers back. */
#include "toolcall.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const NAMES[TC_COUNT] = {"dapod", "qwen", "llama3_json"};

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

static int is_name_char(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int tc_valid_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  for (size_t i = 0; i < n; i++)
    if (!is_name_char((unsigned char)s[i])) return 0;
  return n >= 1 && n <= TC_NAME_MAX;
}

/* dapod: "@" [name] [spaces JSON-object] [spaces], the whole turn. */
static int read_dapod(const char *s, size_t n, const char *const *tools, int n_tools,
                      struct tc_turn *t) {
  size_t i = 0;
  while (i < n && isspace((unsigned char)s[i])) i++;
  if (i == n || s[i] != '@') return 0; /* a final answer */
  i++;
  size_t name0 = i;
  while (i < n && is_name_char((unsigned char)s[i])) i++;
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

/* A call's JSON object {"name": one of tools, args_key: object (absent: {}; the JSON text of
 * an object is read)} into call k of t. 0; DAPO_ENOMEM; 1 when malformed (t says why). */
static int read_call_object(const char *s, size_t n, const char *args_key, const char *const *tools,
                            int n_tools, struct tc_turn *t) {
  json_error_t je;
  json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(o)) {
    json_decref(o);
    return malformed(t, "the call is not a JSON object: %s", o ? "another value" : je.text), 1;
  }
  const char *name = json_string_value(json_object_get(o, "name"));
  json_t *args = json_object_get(o, args_key);
  int known = 0;
  for (int k = 0; name && k < n_tools && !known; k++) known = !strcmp(tools[k], name);
  int rc = 0;
  if (!name)
    rc = malformed(t, "the call has no \"name\"") + 1;
  else if (!known)
    rc = malformed(t, "there is no tool '%.64s'", name) + 1;
  else if (t->n_calls == TC_MAX_CALLS)
    rc = malformed(t, "more than %d calls in one turn", TC_MAX_CALLS) + 1;
  if (rc) {
    json_decref(o);
    return rc;
  }
  json_t *a = NULL;
  if (!args || json_is_null(args))
    a = json_object();
  else if (json_is_object(args))
    a = json_incref(args);
  else if (json_is_string(args))
    a = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, NULL);
  if (!json_is_object(a)) {
    json_decref(a);
    json_decref(o);
    return malformed(t, "the arguments must be a JSON object"), 1;
  }
  struct tc_call *c = &t->calls[t->n_calls++];
  snprintf(c->name, sizeof c->name, "%s", name); /* name lives in o */
  c->arguments = a;
  json_decref(o);
  return 0;
}

/* qwen: text, then "<tool_call>" JSON "</tool_call>" blocks (whitespace around and between). */
static int read_qwen(const char *s, size_t n, const char *const *tools, int n_tools,
                     struct tc_turn *t) {
  static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
  const char *end = s + n, *p = memmem(s, n, OPEN, sizeof OPEN - 1);
  while (p) {
    const char *body = p + sizeof OPEN - 1;
    const char *close = memmem(body, (size_t)(end - body), CLOSE, sizeof CLOSE - 1);
    if (!close) return malformed(t, "a <tool_call> without its </tool_call>");
    int rc = read_call_object(body, (size_t)(close - body), "arguments", tools, n_tools, t);
    if (rc) return rc == DAPO_ENOMEM ? rc : 0;
    p = close + sizeof CLOSE - 1;
    while (p < end && isspace((unsigned char)*p)) p++;
    if (p == end) break;
    if ((size_t)(end - p) < sizeof OPEN - 1 || memcmp(p, OPEN, sizeof OPEN - 1))
      return malformed(t, "text after a </tool_call> (calls end the turn)");
  }
  return 0;
}

/* llama3_json: the whole turn (trimmed) a JSON object that starts with its "name". */
static int read_llama3_json(const char *s, size_t n, const char *const *tools, int n_tools,
                            struct tc_turn *t) {
  size_t i = 0;
  while (i < n && isspace((unsigned char)s[i])) i++;
  size_t j = i + 1;
  while (j < n && isspace((unsigned char)s[j])) j++;
  if (i == n || s[i] != '{' || n - j < 6 || memcmp(s + j, "\"name\"", 6)) return 0; /* an answer */
  int rc = read_call_object(s + i, n - i, "parameters", tools, n_tools, t);
  return rc == DAPO_ENOMEM ? rc : 0;
}

int tc_read_turn(enum tc_format f, const char *text, size_t len, const char *const *tools,
                 int n_tools, struct tc_turn *out) {
  memset(out, 0, sizeof *out);
  switch (f) {
  case TC_DAPOD: return read_dapod(text, len, tools, n_tools, out);
  case TC_QWEN: return read_qwen(text, len, tools, n_tools, out);
  case TC_LLAMA3_JSON: return read_llama3_json(text, len, tools, n_tools, out);
  default: return malformed(out, "unknown tool-call format");
  }
}

int tc_render_answers(enum tc_format f, const struct tc_answer *a, int n, char **out) {
  size_t need = 1;
  for (int i = 0; i < n; i++) need += strlen(a[i].content) + 2;
  char *buf = malloc(need), *p = buf;
  *out = buf;
  if (!buf) return DAPO_ENOMEM;
  (void)f; /* TC_DAPOD: "=" content per answer, ">" content per observation, "\n" between */
  for (int i = 0; i < n; i++) {
    size_t k = strlen(a[i].content);
    if (i) *p++ = '\n';
    *p++ = !a[i].role || !strcmp(a[i].role, "tool") ? '=' : '>';
    memcpy(p, a[i].content, k);
    p += k;
  }
  *p = '\0';
  return 0;
}
