/* JSON Lines datasets (see dataset.h): line validation with jansson, a push-style line splitter
 * with a bounded line buffer under ds_load/ds_validate_file, and the epoch-shuffled cursor. */
#include "dataset.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "toolcall.h"
#include "tools.h"
#include "utf8.h"

#define READ_CHUNK (64 * 1024)

struct ds_perm {
  int valid;
  uint64_t seed;
  int64_t epoch;
  int *order; /* n entries: the permutation of (seed, epoch) */
};

struct dataset {
  struct ds_item *items; /* n, in file order */
  int n;
  struct ds_perm *perm; /* separate allocation: ds_next updates it through a const handle */
};

struct ds_stream {
  struct ds_limits lim; /* defaults resolved */
  int keep;             /* keep the items for a dataset */
  char *line;           /* the line being assembled, at most max_line_bytes + 2 bytes */
  size_t len, cap;
  int overlong;    /* the current line passed the cap: its bytes are skipped up to "\n" */
  int64_t lineno;  /* lines completed */
  int failed;      /* sticky fatal code (ENOMEM, ERANGE, EIO) */
  int finished;    /* ds_stream_finish ran */
  char fatal[512]; /* message of the fatal error */
  struct ds_report rep;
  int cap_errors; /* allocated entries of rep.errors */
  struct ds_item *items;
  int n_items, cap_items;
};

/* ---- messages ---------------------------------------------------------------------------- */

/* Replaces every byte that is not part of a valid UTF-8 sequence with '?', so that a message
 * (which may quote input bytes, or be cut inside a character) is always a valid JSON string. */
static void utf8_sanitize(char *s) {
  unsigned char *p = (unsigned char *)s;
  for (size_t left = strlen(s); left;) {
    size_t n = utf8_next(p, left, NULL);
    if (!n) *p = '?', n = 1;
    p += n, left -= n;
  }
}

static int msgf(char *msg, size_t cap, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int msgf(char *msg, size_t cap, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
  utf8_sanitize(msg);
  return code;
}

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "something else";
}

/* ---- one line ---------------------------------------------------------------------------- */

/* 1 when the container v, at nesting level depth, or anything inside it is deeper than max.
 * The recursion stops one level past max. */
static int too_deep(const json_t *v, int depth, int max) {
  if (!json_is_object(v) && !json_is_array(v)) return 0;
  if (depth > max) return 1;
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      if (too_deep(json_array_get(v, i), depth + 1, max)) return 1;
    return 0;
  }
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)v, k, x) {
    if (too_deep(x, depth + 1, max)) return 1;
  }
  return 0;
}

static char *dup_json_string(const json_t *s) {
  size_t n = json_string_length(s);
  char *p = malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, json_string_value(s), n);
  p[n] = '\0';
  return p;
}

static int check_messages(const json_t *jm, char *msg, size_t cap) {
  static const char *const roles[] = {"system", "user", "assistant", "tool"};
  if (!json_is_array(jm))
    return msgf(msg, cap, DAPO_EFORMAT, "field 'messages': expected an array, got %s",
                json_kind(jm));
  if (json_array_size(jm) == 0)
    return msgf(msg, cap, DAPO_EFORMAT, "field 'messages': must not be empty");
  for (size_t i = 0; i < json_array_size(jm); i++) {
    const json_t *m = json_array_get(jm, i);
    if (!json_is_object(m))
      return msgf(msg, cap, DAPO_EFORMAT, "field 'messages[%zu]': expected an object, got %s", i,
                  json_kind(m));
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!role) return msgf(msg, cap, DAPO_EFORMAT, "field 'messages[%zu].role': required", i);
    if (!json_is_string(role))
      return msgf(msg, cap, DAPO_EFORMAT, "field 'messages[%zu].role': expected a string, got %s",
                  i, json_kind(role));
    int known = 0;
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
      if (strcmp(json_string_value(role), roles[r]) == 0) known = 1;
    if (!known)
      return msgf(msg, cap, DAPO_EFORMAT,
                  "field 'messages[%zu].role': expected one of system, user, assistant, tool, "
                  "got '%.40s'",
                  i, json_string_value(role));
    if (!content) return msgf(msg, cap, DAPO_EFORMAT, "field 'messages[%zu].content': required", i);
    if (!json_is_string(content))
      return msgf(msg, cap, DAPO_EFORMAT,
                  "field 'messages[%zu].content': expected a string, got %s", i,
                  json_kind(content));
  }
  return 0;
}

/* A line's `tools` (not null): OpenAI's function tools, [{"type": "function", "function":
 * {"name", "description"?, "parameters"?, "strict"?}}], at most TOOLS_MAX of them, their names
 * unique and of the toolbox's rule (1 to TC_NAME_MAX of a-z, A-Z, 0-9, _ and -). */
static int check_tools(const json_t *jt, char *msg, size_t cap) {
  if (!json_is_array(jt))
    return msgf(msg, cap, DAPO_EFORMAT, "field 'tools': expected an array, got %s", json_kind(jt));
  if (json_array_size(jt) > TOOLS_MAX)
    return msgf(msg, cap, DAPO_EFORMAT, "field 'tools': at most %d tools, got %zu", TOOLS_MAX,
                json_array_size(jt));
  for (size_t i = 0; i < json_array_size(jt); i++) {
    const json_t *t = json_array_get(jt, i), *fn = json_object_get(t, "function");
    if (!json_is_object(t))
      return msgf(msg, cap, DAPO_EFORMAT, "field 'tools[%zu]': expected an object, got %s", i,
                  json_kind(t));
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || strcmp(type, "function"))
      return msgf(msg, cap, DAPO_EFORMAT, "field 'tools[%zu].type': expected \"function\"", i);
    if (!json_is_object(fn))
      return msgf(msg, cap, DAPO_EFORMAT,
                  "field 'tools[%zu].function': expected an object {\"name\", \"description\", "
                  "\"parameters\"}",
                  i);
    const json_t *nm = json_object_get(fn, "name");
    const char *name = json_string_value(nm);
    if (!tc_valid_name(name) || strlen(name) != json_string_length(nm))
      return msgf(msg, cap, DAPO_EFORMAT,
                  "field 'tools[%zu].function.name': expected " TC_NAME_RULE, i);
    static const struct {
      const char *key;
      json_type type; /* JSON_TRUE: a boolean */
      const char *want;
    } OPT[] = {{"description", JSON_STRING, "a string"},
               {"parameters", JSON_OBJECT, "a JSON Schema object"},
               {"strict", JSON_TRUE, "a boolean"}};
    for (size_t k = 0; k < sizeof OPT / sizeof OPT[0]; k++) {
      const json_t *v = json_object_get(fn, OPT[k].key);
      int ok = !v || json_is_null(v) || json_typeof(v) == OPT[k].type ||
               (OPT[k].type == JSON_TRUE && json_is_boolean(v));
      if (!ok)
        return msgf(msg, cap, DAPO_EFORMAT, "field 'tools[%zu].function.%s': expected %s, got %s",
                    i, OPT[k].key, OPT[k].want, json_kind(v));
    }
    for (size_t j = 0; j < i; j++) {
      const json_t *o = json_object_get(json_object_get(json_array_get(jt, j), "function"), "name");
      if (!strcmp(json_string_value(o), name))
        return msgf(msg, cap, DAPO_EFORMAT,
                    "field 'tools[%zu].function.name': a second tool named '%s' (tools[%zu])", i,
                    name, j);
    }
  }
  if (too_deep(jt, 1, DS_MAX_METADATA_DEPTH))
    return msgf(msg, cap, DAPO_EFORMAT, "field 'tools': nested deeper than %d",
                DS_MAX_METADATA_DEPTH);
  return 0;
}

/* ds_check_line without the "line N: " prefix: the message goes to msg (cap bytes). */
static int check_line(const char *line, size_t len, int lineno, struct ds_item *out, char *msg,
                      size_t cap) {
  const char *p = line;
  size_t n = len;
  int bom = 0;
  msg[0] = '\0';
  if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) {
    if (lineno != 1)
      return msgf(msg, cap, DAPO_EFORMAT,
                  "byte-order mark inside the file (allowed only at the start of line 1)");
    p += 3;
    n -= 3;
    bom = 1;
  }
  if (n > 0 && p[n - 1] == '\n') n--;
  if (n > 0 && p[n - 1] == '\r') n--;
  if (memchr(p, '\n', n))
    return msgf(msg, cap, DAPO_EFORMAT, "contains a line break (one JSON object a line)");
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r')) i++;
  if (i == n) return 1;

  json_error_t jerr;
  json_t *root = json_loadb(p, n, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    enum json_error_code jc = json_error_code(&jerr);
    if (jc == json_error_out_of_memory) return msgf(msg, cap, DAPO_ENOMEM, "out of memory");
    int col = jerr.column > 0 ? jerr.column + bom : (int)jerr.position + 1;
    return msgf(msg, cap, DAPO_EFORMAT, "%s: %s at column %d",
                jc == json_error_invalid_utf8 ? "not valid UTF-8" : "not valid JSON", jerr.text,
                col);
  }
  int rc = 0;
  char *id = NULL, *prompt = NULL, *answer = NULL;
  json_t *rft_item = NULL, *rft_answer = NULL;
  if (!json_is_object(root)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "expected a JSON object, got %s", json_kind(root));
    goto out;
  }
  json_t *jp = json_object_get(root, "prompt"), *jm = json_object_get(root, "messages");
  json_t *ja = json_object_get(root, "answer"), *ji = json_object_get(root, "id");
  json_t *jmeta = json_object_get(root, "metadata");
  if (!jp == !jm) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "exactly one of 'prompt' or 'messages' is required%s",
              jp ? " (got both)" : "");
    goto out;
  }
  if (jp && !json_is_string(jp)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'prompt': expected a string, got %s", json_kind(jp));
    goto out;
  }
  if (jp && json_string_length(jp) == 0) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'prompt': must not be empty");
    goto out;
  }
  if (jm && (rc = check_messages(jm, msg, cap))) goto out;
  /* OpenAI's reinforcement fine-tuning lines: messages and the item's own fields, no answer.
   * Every field but messages and tools becomes the item graders read (metadata). */
  int rft = jm && !ja;
  /* a line's tools: shown in its rendered prompt, so only with messages */
  json_t *jtools = json_object_get(root, "tools");
  if (json_is_null(jtools) || (json_is_array(jtools) && json_array_size(jtools) == 0))
    jtools = NULL;
  if (jtools && (rc = check_tools(jtools, msg, cap))) goto out;
  if (jtools && jp) {
    rc = msgf(msg, cap, DAPO_EFORMAT,
              "field 'tools': needs 'messages' (a 'prompt' text cannot show the tools)");
    goto out;
  }
  if (rft) {
    if (too_deep(root, 0, DS_MAX_METADATA_DEPTH)) {
      rc = msgf(msg, cap, DAPO_EFORMAT, "nested deeper than %d", DS_MAX_METADATA_DEPTH);
      goto out;
    }
    json_t *item = json_copy(root);
    if (!item) {
      rc = msgf(msg, cap, DAPO_ENOMEM, "out of memory");
      goto out;
    }
    json_object_del(item, "messages");
    json_object_del(item, "tools");
    jmeta = item; /* owned here: released at out */
    rft_item = item;
    ja = json_string("");
    rft_answer = ja;
    if (!ja) {
      rc = msgf(msg, cap, DAPO_ENOMEM, "out of memory");
      goto out;
    }
  }
  if (!ja) {
    rc = msgf(msg, cap, DAPO_EFORMAT,
              "field 'answer': required (or give 'messages' with the item's own fields, the "
              "reinforcement fine-tuning format)");
    goto out;
  }
  if (!json_is_string(ja)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'answer': expected a string, got %s", json_kind(ja));
    goto out;
  }
  /* Optional fields: null reads as absent (exporters write it for missing values). */
  if (json_is_null(ji)) ji = NULL;
  if (json_is_null(jmeta)) jmeta = NULL;
  if (rft && ji && !json_is_string(ji) && !json_is_integer(ji)) ji = NULL; /* an item field */
  if (ji && !json_is_string(ji) && !json_is_integer(ji)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'id': expected a string or an integer, got %s",
              json_kind(ji));
    goto out;
  }
  if (ji && json_is_string(ji) && json_string_length(ji) == 0) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'id': must not be empty");
    goto out;
  }
  if (jmeta && !json_is_object(jmeta)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'metadata': expected an object, got %s",
              json_kind(jmeta));
    goto out;
  }
  if (jmeta && too_deep(jmeta, 1, DS_MAX_METADATA_DEPTH)) {
    rc = msgf(msg, cap, DAPO_EFORMAT, "field 'metadata': nested deeper than %d",
              DS_MAX_METADATA_DEPTH);
    goto out;
  }
  if (!out) goto out;

  char buf[32];
  if (!ji)
    snprintf(buf, sizeof buf, "line-%d", lineno);
  else if (json_is_integer(ji))
    snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(ji));
  id = ji && json_is_string(ji) ? dup_json_string(ji) : strdup(buf);
  prompt = jp ? dup_json_string(jp) : NULL;
  answer = dup_json_string(ja);
  if (!id || (jp && !prompt) || !answer) {
    rc = msgf(msg, cap, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  *out = (struct ds_item){.id = id,
                          .prompt = prompt,
                          .messages = jm ? json_incref(jm) : NULL,
                          .answer = answer,
                          .metadata = jmeta ? json_incref(jmeta) : NULL,
                          .tools = jtools ? json_incref(jtools) : NULL,
                          .line = lineno};
  id = prompt = answer = NULL;
out:
  free(id);
  free(prompt);
  free(answer);
  json_decref(rft_item);
  json_decref(rft_answer);
  json_decref(root);
  return rc;
}

int ds_check_line(const char *line, size_t len, int lineno, struct ds_item *out,
                  struct dapo_err *e) {
  char msg[sizeof e->msg];
  if (!line && len) return dapo_errf(e, DAPO_EINVAL, "line %d: no text", lineno);
  int rc = check_line(line ? line : "", len, lineno, out, msg, sizeof msg);
  if (rc < 0 && e) {
    dapo_errf(e, rc, "line %d: %s", lineno, msg);
    utf8_sanitize(e->msg); /* the prefix may have cut the last character */
  }
  return rc;
}

int ds_item_tool_names(const struct ds_item *it, const char **names, int cap) {
  int n = 0;
  for (size_t i = 0; it && i < json_array_size(it->tools) && n < cap; i++)
    names[n++] = json_string_value(
        json_object_get(json_object_get(json_array_get(it->tools, i), "function"), "name"));
  return n;
}

void ds_item_deinit(struct ds_item *it) {
  if (!it) return;
  free(it->id);
  free(it->prompt);
  json_decref(it->messages);
  free(it->answer);
  json_decref(it->metadata);
  json_decref(it->tools);
  memset(it, 0, sizeof *it);
}

/* ---- report ------------------------------------------------------------------------------ */

void ds_report_init(struct ds_report *rep) {
  memset(rep, 0, sizeof *rep);
}

void ds_report_deinit(struct ds_report *rep) {
  if (!rep) return;
  free(rep->errors);
  memset(rep, 0, sizeof *rep);
}

json_t *ds_report_to_json(const struct ds_report *rep) {
  json_t *arr = json_array();
  if (!arr) return NULL;
  for (int i = 0; rep && i < rep->n_reported; i++) {
    json_t *o = json_pack("{s:i, s:s}", "line", (json_int_t)rep->errors[i].line, "message",
                          rep->errors[i].message);
    if (!o || json_array_append_new(arr, o)) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
}

/* ---- stream ------------------------------------------------------------------------------ */

static int stream_fail(struct ds_stream *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int stream_fail(struct ds_stream *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->fatal, sizeof s->fatal, fmt, ap);
  va_end(ap);
  utf8_sanitize(s->fatal);
  s->failed = code;
  return code;
}

struct ds_stream *ds_stream_new(const struct ds_limits *lim, int keep_items) {
  struct ds_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (lim) s->lim = *lim;
  if (s->lim.max_line_bytes == 0) s->lim.max_line_bytes = DS_DEFAULT_MAX_LINE_BYTES;
  if (s->lim.max_line_bytes > SIZE_MAX / 2) s->lim.max_line_bytes = SIZE_MAX / 2;
  if (s->lim.max_items <= 0) s->lim.max_items = DS_DEFAULT_MAX_ITEMS;
  if (s->lim.max_errors_reported <= 0) s->lim.max_errors_reported = DS_DEFAULT_MAX_ERRORS;
  s->keep = keep_items != 0;
  return s;
}

static int record_error(struct ds_stream *s, int line, const char *msg) {
  struct ds_report *r = &s->rep;
  r->n_errors++;
  if (r->n_reported >= s->lim.max_errors_reported) return 0;
  if (r->n_reported == s->cap_errors) {
    int ncap = s->cap_errors == 0 ? 16 : s->cap_errors > INT_MAX / 2 ? INT_MAX : s->cap_errors * 2;
    if (ncap > s->lim.max_errors_reported) ncap = s->lim.max_errors_reported;
    struct ds_line_error *p = realloc(r->errors, (size_t)ncap * sizeof *p);
    if (!p) return stream_fail(s, DAPO_ENOMEM, "out of memory recording line errors");
    r->errors = p;
    s->cap_errors = ncap;
  }
  struct ds_line_error *le = &r->errors[r->n_reported++];
  le->line = line;
  snprintf(le->message, sizeof le->message, "%s", msg);
  utf8_sanitize(le->message);
  return 0;
}

static int push_item(struct ds_stream *s, struct ds_item *it) {
  if (s->n_items == s->cap_items) {
    int ncap = s->cap_items ? (s->cap_items > INT_MAX / 2 ? INT_MAX : s->cap_items * 2) : 256;
    if (ncap > s->lim.max_items) ncap = s->lim.max_items;
    struct ds_item *p = realloc(s->items, (size_t)ncap * sizeof *p);
    if (!p) return stream_fail(s, DAPO_ENOMEM, "out of memory after %d items", s->n_items);
    s->items = p;
    s->cap_items = ncap;
  }
  s->items[s->n_items++] = *it;
  memset(it, 0, sizeof *it);
  return 0;
}

/* The current line is complete (its "\n" seen, or the input ended). */
static int end_line(struct ds_stream *s) {
  int rc = 0;
  if (s->lineno >= INT_MAX) return stream_fail(s, DAPO_ERANGE, "more than %d lines", INT_MAX);
  int line = (int)++s->lineno;
  s->rep.n_lines++;
  size_t n = s->len;
  if (!s->overlong && n > 0 && s->line[n - 1] == '\r') n--;
  if (s->overlong || n > s->lim.max_line_bytes) {
    char m[64];
    snprintf(m, sizeof m, "longer than %zu bytes", s->lim.max_line_bytes);
    rc = record_error(s, line, m);
    goto out;
  }
  struct ds_item it = {0};
  char msg[512];
  int c = check_line(s->line ? s->line : "", n, line, s->keep ? &it : NULL, msg, sizeof msg);
  if (c == 1) goto out;
  if (c == DAPO_EFORMAT) {
    rc = record_error(s, line, msg);
    goto out;
  }
  if (c < 0) {
    rc = stream_fail(s, c, "line %d: %s", line, msg);
    goto out;
  }
  if (s->rep.n_items >= s->lim.max_items) {
    ds_item_deinit(&it);
    rc = stream_fail(s, DAPO_ERANGE, "more than %d items (line %d)", s->lim.max_items, line);
    goto out;
  }
  s->rep.n_items++;
  if (s->keep && (rc = push_item(s, &it))) ds_item_deinit(&it);
out:
  s->len = 0;
  s->overlong = 0;
  return rc;
}

static int append(struct ds_stream *s, const char *p, size_t n) {
  size_t need = s->len + n + 1; /* <= max_line_bytes + 2 */
  if (need > s->cap) {
    size_t ncap = s->cap ? s->cap : 4096;
    while (ncap < need) ncap *= 2;
    if (ncap > s->lim.max_line_bytes + 2) ncap = s->lim.max_line_bytes + 2;
    char *q = realloc(s->line, ncap);
    if (!q) return stream_fail(s, DAPO_ENOMEM, "out of memory for a line of %zu bytes", need);
    s->line = q;
    s->cap = ncap;
  }
  memcpy(s->line + s->len, p, n);
  s->len += n;
  s->line[s->len] = '\0';
  return 0;
}

int ds_stream_feed(struct ds_stream *s, const void *buf, size_t n, struct dapo_err *e) {
  if (!s || (!buf && n)) return dapo_errf(e, DAPO_EINVAL, "ds_stream_feed: bad arguments");
  if (s->finished) return dapo_errf(e, DAPO_EINVAL, "ds_stream_feed: stream already finished");
  if (s->failed) return dapo_errf(e, s->failed, "%s", s->fatal);
  const char *p = buf;
  while (n > 0) {
    const char *nl = memchr(p, '\n', n);
    size_t seg = nl ? (size_t)(nl - p) : n;
    /* Room for max_line_bytes plus a CR that may precede the "\n". */
    if (!s->overlong && seg > s->lim.max_line_bytes + 1 - s->len) {
      s->overlong = 1;
      s->len = 0;
    }
    if (!s->overlong && append(s, p, seg)) break;
    if (!nl) break;
    if (end_line(s)) break;
    p = nl + 1;
    n -= seg + 1;
  }
  if (s->failed) return dapo_errf(e, s->failed, "%s", s->fatal);
  return 0;
}

int ds_stream_finish(struct ds_stream *s, struct dataset **out, struct ds_report *rep,
                     struct dapo_err *e) {
  int rc = 0;
  struct dataset *d = NULL;
  if (out) *out = NULL;
  if (!s || s->finished || (out && !s->keep))
    return dapo_errf(e, DAPO_EINVAL, "ds_stream_finish: bad arguments or finished already");
  s->finished = 1;
  if (!s->failed && (s->len > 0 || s->overlong)) end_line(s);

  if (s->failed) {
    rc = dapo_errf(e, s->failed, "%s", s->fatal);
  } else if (s->rep.n_errors > 0) {
    const struct ds_line_error *first = &s->rep.errors[0];
    rc = dapo_errf(e, DAPO_EFORMAT, "dataset invalid: %" PRId64 " error%s, first: line %d: %s",
                   s->rep.n_errors, s->rep.n_errors == 1 ? "" : "s", first->line, first->message);
    if (e) utf8_sanitize(e->msg);
  } else if (s->rep.n_items == 0) {
    rc = s->rep.n_lines == 0
             ? dapo_errf(e, DAPO_EFORMAT, "dataset has no items: the file is empty")
             : dapo_errf(e, DAPO_EFORMAT, "dataset has no items: %" PRId64 " line%s, all blank",
                         s->rep.n_lines, s->rep.n_lines == 1 ? "" : "s");
  } else if (out) {
    d = calloc(1, sizeof *d);
    if (d) d->perm = calloc(1, sizeof *d->perm);
    if (d && d->perm) d->perm->order = malloc((size_t)s->n_items * sizeof(int));
    if (!d || !d->perm || !d->perm->order) {
      rc = dapo_errf(e, DAPO_ENOMEM, "out of memory for a dataset of %d items", s->n_items);
      ds_free(d);
      d = NULL;
    } else {
      d->items = s->items;
      d->n = s->n_items;
      s->items = NULL;
      s->n_items = s->cap_items = 0;
      *out = d;
    }
  }
  if (rep) {
    ds_report_deinit(rep);
    *rep = s->rep;
    memset(&s->rep, 0, sizeof s->rep);
  }
  return rc;
}

void ds_stream_free(struct ds_stream *s) {
  if (!s) return;
  for (int i = 0; i < s->n_items; i++) ds_item_deinit(&s->items[i]);
  free(s->items);
  free(s->line);
  ds_report_deinit(&s->rep);
  free(s);
}

/* ---- files ------------------------------------------------------------------------------- */

static int read_file(const char *path, const struct ds_limits *lim, struct dataset **out,
                     struct ds_report *rep, struct dapo_err *e) {
  int rc = 0;
  FILE *f = NULL;
  if (out) *out = NULL;
  if (!path) return dapo_errf(e, DAPO_EINVAL, "dataset: no path");
  struct ds_stream *s = ds_stream_new(lim, out != NULL);
  char *chunk = malloc(READ_CHUNK);
  if (!s || !chunk) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory opening a dataset");
    goto out;
  }
  f = fopen(path, "rbe");
  if (!f) {
    stream_fail(s, DAPO_EIO, "opening '%s': %s", path, strerror(errno));
  } else {
    size_t k;
    while ((k = fread(chunk, 1, READ_CHUNK, f)) > 0)
      if (ds_stream_feed(s, chunk, k, NULL)) break;
    if (!s->failed && ferror(f))
      stream_fail(s, DAPO_EIO, "reading '%s': %s", path, strerror(errno));
  }
  rc = ds_stream_finish(s, out, rep, e);
out:
  if (f) fclose(f);
  free(chunk);
  ds_stream_free(s);
  return rc;
}

int ds_load(const char *path, const struct ds_limits *lim, struct dataset **out,
            struct ds_report *rep, struct dapo_err *e) {
  if (!out) return dapo_errf(e, DAPO_EINVAL, "ds_load: no output");
  return read_file(path, lim, out, rep, e);
}

int ds_validate_file(const char *path, const struct ds_limits *lim, struct ds_report *rep,
                     struct dapo_err *e) {
  return read_file(path, lim, NULL, rep, e);
}

/* ---- dataset and cursor ------------------------------------------------------------------ */

void ds_free(struct dataset *d) {
  if (!d) return;
  for (int i = 0; i < d->n; i++) ds_item_deinit(&d->items[i]);
  free(d->items);
  if (d->perm) free(d->perm->order);
  free(d->perm);
  free(d);
}

int ds_count(const struct dataset *d) {
  return d ? d->n : 0;
}

const struct ds_item *ds_get(const struct dataset *d, int i) {
  if (!d || i < 0 || i >= d->n) return NULL;
  return &d->items[i];
}

int ds_next(const struct dataset *d, struct ds_cursor *c) {
  if (!d || !c || d->n <= 0 || c->epoch < 0 || c->pos < 0 || c->pos > d->n) return DAPO_EINVAL;
  int64_t epoch = c->epoch, pos = c->pos;
  if (pos == d->n) {
    if (epoch == INT64_MAX) return DAPO_EINVAL;
    epoch++;
    pos = 0;
  }
  struct ds_perm *pc = d->perm;
  if (!pc->valid || pc->seed != c->seed || pc->epoch != epoch) {
    struct rng r;
    for (int i = 0; i < d->n; i++) pc->order[i] = i;
    rng_seed(&r, c->seed, DS_RNG_STREAM_TAG ^ (uint64_t)epoch);
    rng_shuffle_int(&r, pc->order, d->n);
    pc->seed = c->seed;
    pc->epoch = epoch;
    pc->valid = 1;
  }
  int idx = pc->order[pos];
  c->epoch = epoch;
  c->pos = pos + 1;
  return idx;
}
