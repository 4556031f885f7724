/* Supervised fine-tuning lines (sft.h): the checks OpenAI states for its supervised files (an
 * assistant message to train, `weight` only on assistant messages, roles it knows), each
 * problem named by line and field. */
#include "sft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "chat.h"
#include "dataset.h"
#include "lm.h"
#include "tokenizer.h"

const char *sft_kind_of(const json_t *v) {
  static const char *const KINDS[] = {"an object", "an array",  "a string",  "an integer",
                                      "a number",  "a boolean", "a boolean", "null"};
  int k = (int)json_typeof(v);
  return k >= 0 && k < (int)(sizeof KINDS / sizeof KINDS[0]) ? KINDS[k] : "something else";
}

int sft_check_message(const json_t *m, const char *field, size_t i, int lineno, int *trained,
                      struct dapo_err *e) {
  static const char *const ROLES[] = {"system", "user", "assistant", "tool"};
  if (!json_is_object(m))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[%zu]': expected an object, got %s",
                     lineno, field, i, sft_kind_of(m));
  const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
  const char *r = json_string_value(role);
  int known = 0;
  for (size_t k = 0; r && k < sizeof ROLES / sizeof ROLES[0]; k++) known |= !strcmp(r, ROLES[k]);
  if (!known)
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[%zu].role': expected one of %s", lineno,
                     field, i, SFT_ROLES);
  int assistant = !strcmp(r, "assistant");
  int calls = assistant && json_is_array(json_object_get(m, "tool_calls"));
  if (!json_is_string(content) && !(calls && json_is_null(content)))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[%zu].content': expected a string%s",
                     lineno, field, i, calls ? " or null" : "");
  const json_t *w = json_object_get(m, "weight");
  if (w && !assistant)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field '%s[%zu].weight': only assistant messages carry a "
                     "weight (this is a %s message)",
                     lineno, field, i, r);
  if (w && !(json_is_integer(w) && (json_integer_value(w) == 0 || json_integer_value(w) == 1)))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[%zu].weight': expected 0 or 1", lineno,
                     field, i);
  *trained |= assistant && (!w || json_integer_value(w) == 1);
  return 0;
}

int sft_check_line(const json_t *line, int lineno, struct dapo_err *e) {
  static const char *const KNOWN[] = {"prompt", "completion", "messages",
                                      "tools",  "id",         "metadata"};
  if (!json_is_object(line))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: expected a JSON object, got %s", lineno,
                     sft_kind_of(line));
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)line, key, v) {
    int ok = 0;
    for (size_t k = 0; k < sizeof KNOWN / sizeof KNOWN[0]; k++) ok |= !strcmp(key, KNOWN[k]);
    if (!ok)
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field '%.60s': unknown (a supervised line has prompt and "
                       "completion, or messages)",
                       lineno, key);
  }
  const json_t *p = json_object_get(line, "prompt"), *c = json_object_get(line, "completion");
  const json_t *ms = json_object_get(line, "messages");
  if (!p == !ms)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: exactly one of 'prompt' (with 'completion') or 'messages' is "
                     "required",
                     lineno);
  if (p) {
    if (!json_is_string(p))
      return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'prompt': expected a string, got %s",
                       lineno, sft_kind_of(p));
    if (!c) return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'completion': required", lineno);
    if (!json_is_string(c) || !json_string_length(c))
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field 'completion': expected a non-empty string, got %s", lineno,
                       json_is_string(c) ? "an empty one" : sft_kind_of(c));
    return 0;
  }
  if (c)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'completion': goes with 'prompt' (in 'messages' the "
                     "assistant messages are the completions)",
                     lineno);
  if (!json_is_array(ms) || !json_array_size(ms))
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'messages': expected a non-empty array, got %s", lineno,
                     json_is_array(ms) ? "an empty one" : sft_kind_of(ms));
  int trained = 0;
  for (size_t i = 0; i < json_array_size(ms); i++) {
    int rc = sft_check_message(json_array_get(ms, i), "messages", i, lineno, &trained, e);
    if (rc) return rc;
  }
  if (!trained)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'messages': no assistant message with weight 1 (nothing to "
                     "train on)",
                     lineno);
  return 0;
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* A growing example (cap grows by doubling; the caller's max_tokens bounds what is kept). */
static int push(struct sft_example *x, int *cap, const int *ids, int n, int trained) {
  if (x->n + n > *cap) {
    int c = *cap ? *cap : 64;
    while (c < x->n + n) c *= 2;
    int *t = realloc(x->tokens, (size_t)c * sizeof *t);
    if (!t) return DAPO_ENOMEM;
    x->tokens = t;
    unsigned char *m = realloc(x->trained, (size_t)c);
    if (!m) return DAPO_ENOMEM;
    x->trained = m;
    *cap = c;
  }
  memcpy(x->tokens + x->n, ids, (size_t)n * sizeof *ids);
  memset(x->trained + x->n, trained ? 1 : 0, (size_t)n);
  x->n += n;
  if (trained) x->n_trained += n;
  return 0;
}

/* text's own tokens (no special tokens added) appended to x. */
static int push_text(const struct lm *lm, struct sft_example *x, int *cap, const char *text,
                     size_t len, int trained, int lineno, const char *field, struct dapo_err *e) {
  int n = 0;
  if (!len) return 0;
  int rc = tok_encode(lm->tok, text, len, NULL, 0, &n, e);
  if (rc && rc != DAPO_ERANGE) return dapo_err_prefix(e, "line %d: field '%s': ", lineno, field);
  int *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  if (!ids) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  rc = tok_encode(lm->tok, text, len, ids, n, &n, e);
  if (!rc) rc = push(x, cap, ids, n, trained);
  free(ids);
  if (rc == DAPO_ENOMEM) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  return rc ? dapo_err_prefix(e, "line %d: field '%s': ", lineno, field) : 0;
}

/* messages[0 .. end) rendered with the generation prompt into *out (owned); with answered, an
 * empty tool answer after them and no generation prompt (what an assistant turn with tool calls
 * renders as, the conversation going on). */
static int render_upto(const struct chat_template *chat, const json_t *ms, const json_t *tools,
                       size_t end, int answered, char **out, int lineno, struct dapo_err *e) {
  json_t *part = json_array();
  if (!part) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  for (size_t i = 0; i < end; i++) json_array_append(part, json_array_get(ms, i));
  if (answered) json_array_append_new(part, json_pack("{s:s,s:s}", "role", "tool", "content", ""));
  int rc = json_array_size(part) != end + (answered ? 1 : 0)
               ? dapo_errf(e, DAPO_ENOMEM, "out of memory")
               : chat_render_tools(chat, part, tools, !answered, out, e);
  json_decref(part);
  if (rc && rc != DAPO_ENOMEM)
    return dapo_err_prefix(e, "line %d: field 'messages[%zu]': ", lineno, end);
  return rc;
}

/* The text of assistant message a with tool calls between its generation prompt (text, the
 * conversation before it rendered with one) and its end of turn (stop): the rendering of the
 * conversation through it (an empty tool answer after it) must begin with text, and the turn
 * ends at the first stop after. A new string in *out. */
static int render_turn(const struct chat_template *chat, const json_t *ms, const json_t *tools,
                       size_t a, const char *text, const char *stop, char **out, int lineno,
                       struct dapo_err *e) {
  char *full = NULL;
  size_t len = strlen(text);
  int rc = render_upto(chat, ms, tools, a + 1, 1, &full, lineno, e);
  const char *end = rc || strncmp(full, text, len) ? NULL : strstr(full + len, stop);
  if (!rc && !end)
    rc = dapo_errf(e, DAPO_EINVAL,
                   "line %d: field 'messages[%zu].tool_calls': the chat template renders the turn "
                   "otherwise once it is followed, so its tokens cannot be taken piecewise",
                   lineno, a);
  if (!rc && !(*out = strndup(full + len, (size_t)(end - full) - len)))
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
  free(full);
  return rc;
}

static int encode_messages(const struct lm *lm, const struct chat_template *chat,
                           const json_t *line, int lineno, struct sft_example *x, int *cap,
                           struct dapo_err *e) {
  const json_t *ms = json_object_get(line, "messages"), *tools = json_object_get(line, "tools");
  if (!chat)
    return dapo_errf(e, DAPO_EINVAL,
                     "line %d: field 'messages': the model has no chat template (give the job "
                     "a chat_template, or write prompt/completion lines)",
                     lineno);
  const char *stop = chat_stop_text(chat);
  int stop_id = -1, k = 0;
  if (!stop || tok_encode(lm->tok, stop, strlen(stop), &stop_id, 1, &k, e) || k != 1)
    return dapo_errf(e, DAPO_EINVAL,
                     "line %d: field 'messages': the chat template's end of turn is not one token "
                     "of this model's tokenizer",
                     lineno);
  char *done = NULL; /* the conversation's text encoded so far */
  size_t done_len = 0;
  int rc = 0;
  for (size_t a = 0; a < json_array_size(ms) && !rc; a++) {
    const json_t *m = json_array_get(ms, a);
    if (strcmp(json_string_value(json_object_get(m, "role")), "assistant")) continue;
    const json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !chat_renders_tools(chat)) {
      rc = dapo_errf(e, DAPO_EUNSUPPORTED,
                     "line %d: field 'messages[%zu].tool_calls': the chat template (%s) renders "
                     "no tool calls (chatml, qwen3 and llama3.2 do)",
                     lineno, a, chat_family(chat));
      break;
    }
    char *text = NULL;
    if ((rc = render_upto(chat, ms, tools, a, 0, &text, lineno, e))) break;
    size_t len = strlen(text);
    if (!done) { /* the first context: the template's own special tokens, nothing added */
      int *ids = NULL, n = 0;
      rc = lm_encode_prompt(lm, text, len, LM_PROMPT_CHAT, 0, &ids, &n, e);
      if (!rc) rc = push(x, cap, ids, n, 0);
      free(ids);
      if (rc && rc != DAPO_ENOMEM) dapo_err_prefix(e, "line %d: field 'messages': ", lineno);
    } else if (len < done_len || memcmp(text, done, done_len)) {
      rc = dapo_errf(e, DAPO_EINVAL,
                     "line %d: field 'messages[%zu]': the chat template renders the turns "
                     "before it otherwise once it follows them, so its tokens cannot be taken "
                     "piecewise",
                     lineno, a);
    } else {
      rc = push_text(lm, x, cap, text + done_len, len - done_len, 0, lineno, "messages", e);
    }
    const json_t *w = json_object_get(m, "weight");
    int trained = !w || json_integer_value(w) == 1;
    const char *content = json_string_value(json_object_get(m, "content"));
    char field[48], *turn = NULL; /* with tool calls: the turn as the template renders it */
    snprintf(field, sizeof field, "messages[%zu].%s", a, calls ? "tool_calls" : "content");
    if (!rc && calls) rc = render_turn(chat, ms, tools, a, text, stop, &turn, lineno, e);
    if (turn) content = turn;
    if (!rc) rc = push_text(lm, x, cap, content, strlen(content), trained, lineno, field, e);
    if (!rc && push(x, cap, &stop_id, 1, trained)) rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    /* what this turn adds to the text: its content and the end of turn */
    size_t cl = content ? strlen(content) : 0, sl = strlen(stop);
    char *next = rc ? NULL : malloc(len + cl + sl + 1);
    if (!rc && !next) rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    if (next) {
      memcpy(next, text, len);
      memcpy(next + len, content, cl);
      memcpy(next + len + cl, stop, sl + 1);
      free(done);
      done = next;
      done_len = len + cl + sl;
    }
    free(text);
    free(turn);
  }
  free(done);
  return rc;
}

int sft_encode(const struct lm *lm, const struct chat_template *chat, int end_id,
               const json_t *line, int lineno, int max_tokens, int truncate,
               struct sft_example *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  int cap = 0, rc = 0;
  const char *prompt = json_string_value(json_object_get(line, "prompt"));
  if (prompt) {
    int *ids = NULL, n = 0;
    rc = lm_encode_prompt(lm, prompt, strlen(prompt), LM_PROMPT_TEXT, 0, &ids, &n, e);
    if (!rc) rc = push(out, &cap, ids, n, 0);
    free(ids);
    if (rc && rc != DAPO_ENOMEM) dapo_err_prefix(e, "line %d: field 'prompt': ", lineno);
    const json_t *c = json_object_get(line, "completion");
    if (!rc)
      rc = push_text(lm, out, &cap, json_string_value(c), json_string_length(c), 1, lineno,
                     "completion", e);
    if (!rc && end_id < 0)
      rc = dapo_errf(e, DAPO_EINVAL, "line %d: the model has no end-of-sequence token", lineno);
    if (!rc && push(out, &cap, &end_id, 1, 1)) rc = DAPO_ENOMEM;
  } else {
    rc = encode_messages(lm, chat, line, lineno, out, &cap, e);
  }
  if (rc == DAPO_ENOMEM) dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (!rc && out->n > max_tokens && !truncate)
    rc = dapo_errf(e, DAPO_ERANGE,
                   "line %d: %d tokens exceed max_sequence_tokens (%d; or set truncate: true)",
                   lineno, out->n, max_tokens);
  if (!rc && out->n > max_tokens) {
    for (int i = max_tokens; i < out->n; i++) out->n_trained -= out->trained[i];
    out->cut = out->n - max_tokens;
    out->n = max_tokens;
    if (!out->n_trained)
      rc = dapo_errf(e, DAPO_ERANGE,
                     "line %d: nothing to train within max_sequence_tokens (%d) once cut", lineno,
                     max_tokens);
  }
  if (rc) sft_example_deinit(out);
  return rc;
}

void sft_example_deinit(struct sft_example *x) {
  if (!x) return;
  free(x->tokens);
  free(x->trained);
  memset(x, 0, sizeof *x);
}

/* ---- files ------------------------------------------------------------------------------- */

void sft_examples_free(struct sft_example *x, int n) {
  for (int i = 0; x && i < n; i++) sft_example_deinit(&x[i]);
  free(x);
}

int sft_each_line(const char *path,
                  int (*fn)(void *ctx, const json_t *line, int lineno, struct dapo_err *e),
                  void *ctx, struct dapo_err *e) {
  FILE *f = fopen(path, "rb");
  if (!f) return dapo_errf(e, DAPO_EIO, "cannot open %s: %s", path, strerror(errno));
  char *buf = NULL;
  size_t bcap = 0;
  int lineno = 0, rc = 0;
  ssize_t len;
  while (!rc && (len = getline(&buf, &bcap, f)) >= 0) {
    lineno++;
    if ((size_t)len > DS_DEFAULT_MAX_LINE_BYTES) {
      rc = dapo_errf(e, DAPO_EFORMAT, "line %d: longer than %zu bytes", lineno,
                     DS_DEFAULT_MAX_LINE_BYTES);
      break;
    }
    size_t i = 0;
    while (i < (size_t)len && strchr(" \t\r\n", buf[i])) i++;
    if (i == (size_t)len) continue; /* a blank line */
    json_error_t je;
    json_t *j = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
      rc = dapo_errf(e, DAPO_EFORMAT, "line %d: not valid JSON: %s", lineno, je.text);
      break;
    }
    rc = fn(ctx, j, lineno, e);
    json_decref(j);
  }
  if (!rc && ferror(f)) rc = dapo_errf(e, DAPO_EIO, "reading %s failed", path);
  free(buf);
  fclose(f);
  return rc;
}

/* sft_load_items' state: the items so far and how to make the next. */
struct loader {
  size_t size;
  int (*one)(void *ctx, const json_t *line, int lineno, void *item, struct dapo_err *e);
  void *ctx;
  const char *what;
  char *items;
  int n, cap;
};

static int load_line(void *ctx, const json_t *j, int lineno, struct dapo_err *e) {
  struct loader *L = ctx;
  if (L->n == DS_DEFAULT_MAX_ITEMS)
    return dapo_errf(e, DAPO_EFORMAT, "line %d: more than %d %s", lineno, DS_DEFAULT_MAX_ITEMS,
                     L->what);
  if (L->n == L->cap) {
    int c = L->cap ? L->cap * 2 : 64;
    char *x = realloc(L->items, (size_t)c * L->size);
    if (!x) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    L->items = x, L->cap = c;
  }
  int rc = L->one(L->ctx, j, lineno, L->items + (size_t)L->n * L->size, e);
  if (!rc) L->n++;
  return rc;
}

int sft_load_items(const char *path, size_t size,
                   int (*one)(void *ctx, const json_t *line, int lineno, void *item,
                              struct dapo_err *e),
                   void (*deinit)(void *item), void *ctx, const char *what, void **out, int *n,
                   struct dapo_err *e) {
  struct loader L = {size, one, ctx, what, NULL, 0, 0};
  int rc = sft_each_line(path, load_line, &L, e);
  if (!rc && L.n == 0) rc = dapo_errf(e, DAPO_EFORMAT, "no %s (every line is blank)", what);
  if (rc) {
    for (int i = 0; i < L.n; i++) deinit(L.items + (size_t)i * size);
    free(L.items);
    L.items = NULL, L.n = 0;
  }
  *out = L.items;
  *n = L.n;
  return rc;
}

/* How sft_load_file encodes a line. */
struct sft_how {
  const struct lm *lm;
  const struct chat_template *chat;
  int end_id, max_tokens, truncate;
};

static int load_example(void *ctx, const json_t *j, int lineno, void *item, struct dapo_err *e) {
  const struct sft_how *h = ctx;
  int rc = sft_check_line(j, lineno, e);
  return rc ? rc
            : sft_encode(h->lm, h->chat, h->end_id, j, lineno, h->max_tokens, h->truncate, item, e);
}

static void deinit_example(void *item) {
  sft_example_deinit(item);
}

int sft_load_file(const char *path, const struct lm *lm, const struct chat_template *chat,
                  int end_id, int max_tokens, int truncate, struct sft_example **out, int *n,
                  struct dapo_err *e) {
  struct sft_how h = {lm, chat, end_id, max_tokens, truncate};
  void *items = NULL;
  int rc = sft_load_items(path, sizeof **out, load_example, deinit_example, &h, "examples", &items,
                          n, e);
  *out = items;
  return rc;
}
