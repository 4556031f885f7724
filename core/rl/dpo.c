/* DPO lines (dpo.h): OpenAI's and TRL's shapes checked by line and field, and encoded by the
 * supervised rules (sft.h): each response is the one trained completion of its prompt. */
#include "dpo.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sft.h"

/* The names a line may give its responses: [0] the chosen one, [1] the rejected one; OpenAI's,
 * OpenAI's older ones, TRL's. */
static const char *const RESP_KEYS[2][3] = {
    {"preferred_output", "preferred_completion", "chosen"},
    {"non_preferred_output", "non_preferred_completion", "rejected"}};

/* The field holding response `which` of line (the first name it uses), or NULL. */
static const char *resp_key(const json_t *line, int which) {
  for (int k = 0; k < 3; k++)
    if (json_object_get(line, RESP_KEYS[which][k])) return RESP_KEYS[which][k];
  return NULL;
}

/* Whether key is one of names[0 .. n). */
static int known(const char *key, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(key, names[i])) return 1;
  return 0;
}

/* A response, field f of line lineno: [one assistant message] (msg_ok), or a string (text_ok). */
static int check_response(const json_t *v, const char *f, int lineno, int text_ok, int msg_ok,
                          struct dapo_err *e) {
  if (text_ok && json_is_string(v)) return 0;
  if (!msg_ok)
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s': expected a string (the prompt is text)",
                     lineno, f);
  if (!json_is_array(v) || json_array_size(v) != 1)
    return dapo_errf(
        e, DAPO_EFORMAT, "line %d: field '%s': expected exactly one assistant message%s (got %s%s)",
        lineno, f, text_ok ? " or a string" : "", json_is_array(v) ? "" : sft_kind_of(v),
        json_is_array(v) ? (json_array_size(v) ? "several" : "none") : "");
  const json_t *m = json_array_get(v, 0);
  if (!json_is_object(m))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[0]': expected an object, got %s", lineno,
                     f, sft_kind_of(m));
  const char *role = json_string_value(json_object_get(m, "role"));
  if (!role || strcmp(role, "assistant"))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[0].role': expected \"assistant\"", lineno,
                     f);
  if (json_object_get(m, "tool_calls"))
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field '%s[0].tool_calls': not supported in DPO "
                     "lines yet",
                     lineno, f);
  if (json_object_get(m, "weight"))
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field '%s[0].weight': a response is always trained; leave weight "
                     "out",
                     lineno, f);
  if (!json_is_string(json_object_get(m, "content")))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s[0].content': expected a string", lineno,
                     f);
  return 0;
}

/* A conversation, field f of line lineno: a non-empty array of messages (sft's rules). */
static int check_messages(const json_t *ms, const char *f, int lineno, struct dapo_err *e) {
  if (!json_is_array(ms) || !json_array_size(ms))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s': expected a non-empty array, got %s",
                     lineno, f, json_is_array(ms) ? "an empty one" : sft_kind_of(ms));
  int trained = 0;
  for (size_t i = 0; i < json_array_size(ms); i++) {
    int rc = sft_check_message(json_array_get(ms, i), f, i, lineno, &trained, e);
    if (rc) return rc;
  }
  return 0;
}

static int check_openai(const json_t *line, int lineno, struct dapo_err *e) {
  static const char *const IN[] = {"messages", "tools", "parallel_tool_calls"};
  const json_t *in = json_object_get(line, "input");
  if (!in) return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'input': required", lineno);
  if (!json_is_object(in))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'input': expected an object, got %s", lineno,
                     sft_kind_of(in));
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)in, key, v) {
    if (!known(key, IN, sizeof IN / sizeof IN[0]))
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field 'input.%.60s': unknown (input has messages and tools)",
                       lineno, key);
  }
  const json_t *tools = json_object_get(in, "tools");
  if (tools && !json_is_array(tools))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'input.tools': expected an array, got %s",
                     lineno, sft_kind_of(tools));
  int rc = check_messages(json_object_get(in, "messages"), "input.messages", lineno, e);
  for (int w = 0; w < 2 && !rc; w++) {
    if (json_object_get(line, RESP_KEYS[w][0]) && json_object_get(line, RESP_KEYS[w][1]))
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field '%s': give %s or its older name %s, not both", lineno,
                       RESP_KEYS[w][1], RESP_KEYS[w][0], RESP_KEYS[w][1]);
    const char *k = resp_key(line, w);
    if (!k)
      return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s': required", lineno, RESP_KEYS[w][0]);
    rc = check_response(json_object_get(line, k), k, lineno, 0, 1, e);
  }
  return rc;
}

static int check_trl(const json_t *line, int lineno, struct dapo_err *e) {
  const json_t *p = json_object_get(line, "prompt"), *ms = json_object_get(line, "messages");
  if (!p == !ms)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: exactly one of 'prompt' or 'messages' is required (with 'chosen' "
                     "and 'rejected')",
                     lineno);
  int conv = ms || json_is_array(p), rc = 0;
  if (p && !json_is_string(p) && !json_is_array(p))
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'prompt': expected a string or an array of messages, got %s",
                     lineno, sft_kind_of(p));
  if (conv) rc = check_messages(ms ? ms : p, ms ? "messages" : "prompt", lineno, e);
  for (int w = 0; w < 2 && !rc; w++) {
    const json_t *v = json_object_get(line, RESP_KEYS[w][2]);
    if (!v)
      return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%s': required", lineno, RESP_KEYS[w][2]);
    rc = check_response(v, RESP_KEYS[w][2], lineno, 1, conv, e);
  }
  return rc;
}

int dpo_check_line(const json_t *line, int lineno, struct dapo_err *e) {
  static const char *const OPENAI[] = {"input",
                                       "preferred_output",
                                       "non_preferred_output",
                                       "preferred_completion",
                                       "non_preferred_completion",
                                       "id",
                                       "metadata"};
  static const char *const TRL[] = {"prompt", "messages", "chosen", "rejected", "id", "metadata"};
  if (!json_is_object(line))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: expected a JSON object, got %s", lineno,
                     sft_kind_of(line));
  int openai = json_object_get(line, "input") || resp_key(line, 0) || resp_key(line, 1);
  openai = openai && !json_object_get(line, "chosen") && !json_object_get(line, "rejected");
  int trl = !openai && (json_object_get(line, "chosen") || json_object_get(line, "rejected") ||
                        json_object_get(line, "prompt") || json_object_get(line, "messages"));
  if (!openai && !trl)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: not a preference pair (OpenAI's input, preferred_output and "
                     "non_preferred_output, or TRL's prompt, chosen and rejected)",
                     lineno);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)line, key, v) {
    if (openai ? !known(key, OPENAI, sizeof OPENAI / sizeof OPENAI[0])
               : !known(key, TRL, sizeof TRL / sizeof TRL[0]))
      return dapo_errf(e, DAPO_EFORMAT, "line %d: field '%.60s': unknown (%s)", lineno, key,
                       openai ? "an OpenAI DPO line has input, preferred_output and "
                                "non_preferred_output"
                              : "a TRL line has prompt or messages, chosen and rejected");
  }
  return openai ? check_openai(line, lineno, e) : check_trl(line, lineno, e);
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* The supervised line whose one trained completion is response `which` of line: {"prompt",
 * "completion"} for a text prompt, else {"messages": the prompt's (assistant ones at weight 0)
 * and the response's assistant message, "tools"}. NULL when out of memory. */
static json_t *as_supervised(const json_t *line, int which) {
  const json_t *r = json_object_get(line, resp_key(line, which));
  const json_t *content = json_is_string(r) ? r : json_object_get(json_array_get(r, 0), "content");
  const json_t *in = json_object_get(line, "input");
  const json_t *ms = in ? json_object_get(in, "messages") : json_object_get(line, "messages");
  const json_t *p = json_object_get(line, "prompt");
  if (!ms && json_is_string(p)) return json_pack("{s:O,s:O}", "prompt", p, "completion", content);
  if (!ms) ms = p;
  json_t *conv = json_array();
  for (size_t i = 0; conv && i < json_array_size(ms); i++) {
    json_t *m = json_copy(json_array_get(ms, i));
    if (m && !strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
      json_object_set_new(m, "weight", json_integer(0));
    if (!m || json_array_append_new(conv, m)) {
      json_decref(conv);
      return NULL;
    }
  }
  json_t *out =
      json_pack("{s:o,s:O*}", "messages", conv, "tools", in ? json_object_get(in, "tools") : NULL);
  if (out &&
      json_array_append_new(conv, json_pack("{s:s,s:O}", "role", "assistant", "content", content)))
    json_decref(out), out = NULL;
  return out;
}

void dpo_pair_deinit(struct dpo_pair *p) {
  if (!p) return;
  free(p->prompt);
  free(p->resp[0]);
  free(p->resp[1]);
  memset(p, 0, sizeof *p);
}

int dpo_encode(const struct lm *lm, const struct chat_template *chat, int end_id,
               const json_t *line, int lineno, int max_tokens, int truncate, struct dpo_pair *out,
               struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  for (int w = 0; w < 2 && !rc; w++) {
    json_t *sl = as_supervised(line, w);
    if (!sl) {
      rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
      break;
    }
    struct sft_example x;
    rc = sft_encode(lm, chat, end_id, sl, lineno, INT_MAX, 0, &x, e);
    json_decref(sl);
    if (rc) break;
    /* the context, then the trained response to the end (nothing after it is encoded) */
    int f = 0;
    while (f < x.n && !x.trained[f]) f++;
    const char *field = resp_key(line, w);
    if (!f)
      rc = dapo_errf(e, DAPO_EINVAL,
                     "line %d: field '%s': its prompt encodes to no token (the model has no BOS)",
                     lineno, field);
    else if (x.n_trained != x.n - f)
      rc = dapo_errf(e, DAPO_EINVAL, "line %d: field '%s': the response is not one trained run",
                     lineno, field);
    else if (w && (f != out->n_prompt || memcmp(x.tokens, out->prompt, sizeof(int) * (size_t)f)))
      rc = dapo_errf(e, DAPO_EINVAL,
                     "line %d: field '%s': its prompt encodes otherwise than the other response's",
                     lineno, field);
    else if (x.n > max_tokens && !truncate)
      rc = dapo_errf(e, DAPO_ERANGE,
                     "line %d: field '%s': %d tokens with the prompt exceed max_sequence_tokens "
                     "(%d; or set truncate: true)",
                     lineno, field, x.n, max_tokens);
    else if (f >= max_tokens)
      rc = dapo_errf(e, DAPO_ERANGE,
                     "line %d: field '%s': nothing of the response within max_sequence_tokens "
                     "(%d; the prompt has %d tokens)",
                     lineno, field, max_tokens, f);
    int n = x.n > max_tokens ? max_tokens - f : x.n - f;
    if (!rc && !(out->resp[w] = malloc(sizeof(int) * (size_t)n)))
      rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    if (!rc) {
      memcpy(out->resp[w], x.tokens + f, sizeof(int) * (size_t)n);
      out->n_resp[w] = n;
      out->cut[w] = x.n - f - n;
    }
    if (!rc && !w) { /* the prompt's tokens: the context kept once */
      out->prompt = x.tokens;
      out->n_prompt = f;
      x.tokens = NULL;
    }
    sft_example_deinit(&x);
  }
  if (rc) dpo_pair_deinit(out);
  return rc;
}

/* ---- files ------------------------------------------------------------------------------- */

void dpo_pairs_free(struct dpo_pair *p, int n) {
  for (int i = 0; p && i < n; i++) dpo_pair_deinit(&p[i]);
  free(p);
}

/* How dpo_load_file encodes a line. */
struct dpo_how {
  const struct lm *lm;
  const struct chat_template *chat;
  int end_id, max_tokens, truncate;
};

static int load_pair(void *ctx, const json_t *j, int lineno, void *item, struct dapo_err *e) {
  const struct dpo_how *h = ctx;
  int rc = dpo_check_line(j, lineno, e);
  return rc ? rc
            : dpo_encode(h->lm, h->chat, h->end_id, j, lineno, h->max_tokens, h->truncate, item, e);
}

static void deinit_pair(void *item) {
  dpo_pair_deinit(item);
}

int dpo_load_file(const char *path, const struct lm *lm, const struct chat_template *chat,
                  int end_id, int max_tokens, int truncate, struct dpo_pair **out, int *n,
                  struct dapo_err *e) {
  struct dpo_how h = {lm, chat, end_id, max_tokens, truncate};
  void *items = NULL;
  int rc = sft_load_items(path, sizeof **out, load_pair, deinit_pair, &h, "pairs", &items, n, e);
  *out = items;
  return rc;
}
