/* Handler: POST /v1/chat/completions, OpenAI's chat completions on base models and fine-tuned
 * checkpoints (native "{job_id}:step-N" ids or the "ft:...:{job_id}[:ckpt-step-N]" names of the
 * fine-tuning surface): the messages are rendered with the model's chat template (the job's own
 * for its checkpoints, tokenizer_config.json's for a folder, else the default of
 * docs/OPENAI.md), sampled on the completion service (a `stop` string ends its choice there),
 * and answered as a chat.completion object, or with stream: true as chat.completion.chunk
 * server-sent events sent as the tokens are sampled, ending in `data: [DONE]` (the stream engine
 * of api/completions.c).
 *
 * Tools (docs/AGENTS.md "Serving"): `tools`, `tool_choice` and `parallel_tool_calls`. The model
 * calls in its family's format (core/text/toolcall.h: qwen, llama3_json; dapod for the presets
 * and templates that render no tools); a choice whose text holds calls answers with
 * `tool_calls` and finish_reason "tool_calls". `required` and a named function are made to
 * happen by writing the call's opening after the prompt (the model continues from there).
 * Streamed, a choice's text goes out as content until it opens a call; from there it is held
 * and its calls go out whole at its end, one delta.tool_calls entry per call, keyed by index. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "completions.h"
#include "toolcall.h"
#include "handlers.h"
#include "http.h"
#include "openai.h"
#include "registry.h"
#include "sampler.h"
#include "server.h"
#include "store.h"

#define MAX_TOKENS_MAX 512
#define N_MAX 16
#define STOP_MAX COMPLETION_STOP_MAX
#define PROMPT_MAX_BYTES (64 * 1024)
#define TOOLS_MAX 128

/* A streamed choice while tools are on: its text goes out as content (CS_CONTENT, holding back
 * what may open a call), waits for its first characters to say whether it calls (CS_UNDECIDED),
 * or is held whole until its end (CS_CALLS). */
enum choice_mode { CS_CONTENT = 0, CS_UNDECIDED, CS_CALLS };

struct choice_stream {
  enum choice_mode mode;
  char *text;     /* everything the choice released so far (owned) */
  size_t n, sent; /* its bytes; those sent as content */
};

struct chat_req {
  char model[512];
  char id[64];
  long long created;
  int stream, include_usage, logprobs, top_logprobs;
  char *stop[STOP_MAX];
  int n_stop;
  /* tools: their names (borrowed from the request body, kept by the handler), the format the
   * model calls in, the call opening written after the prompt (tool_choice required or a named
   * function; NULL otherwise) */
  int tools_on, parallel, n_tools;
  const char *tool_names[TOOLS_MAX];
  enum tc_format format;
  char *prefix;
  json_t *body; /* the request body (a reference: tool_names point into it) */
  struct choice_stream cs[N_MAX];
};

static void chat_req_free(void *p) {
  struct chat_req *q = p;
  if (!q) return;
  for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
  for (int i = 0; i < N_MAX; i++) free(q->cs[i].text);
  free(q->prefix);
  json_decref(q->body);
  free(q);
}

/* ---- tools ---- */

/* Checks the request's tools, tool_choice and parallel_tool_calls into q; 0, or the error's
 * reply already sent (-1). */
static int read_tools(struct api_req *r, const json_t *b, struct chat_req *q, const char **forced) {
  const json_t *tools = json_object_get(b, "tools"), *choice = json_object_get(b, "tool_choice"),
               *par = json_object_get(b, "parallel_tool_calls");
  *forced = NULL;
  q->parallel = 1;
  if (par && !json_is_null(par)) {
    if (!json_is_boolean(par))
      return api_oai_error(r, 400, NULL, "parallel_tool_calls", "invalid_value",
                           "parallel_tool_calls: expected true or false"),
             -1;
    q->parallel = json_is_true(par);
  }
  if (!tools || json_is_null(tools)) {
    if (choice && !json_is_null(choice))
      return api_oai_error(r, 400, NULL, "tool_choice", "invalid_value",
                           "tool_choice: only allowed when tools are given"),
             -1;
    return 0;
  }
  if (!json_is_array(tools) || json_array_size(tools) > TOOLS_MAX)
    return api_oai_error(r, 400, NULL, "tools", "invalid_value",
                         "tools: expected an array of at most %d tools", TOOLS_MAX),
           -1;
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters"),
                 *desc = json_object_get(fn, "description");
    const char *type = json_string_value(json_object_get(t, "type"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    char field[64];
    if (!type || strcmp(type, "function")) {
      snprintf(field, sizeof field, "tools[%zu].type", i);
      return api_oai_error(r, 400, NULL, field, "invalid_value", "%s: expected \"function\"",
                           field),
             -1;
    }
    if (!tc_valid_name(name)) {
      snprintf(field, sizeof field, "tools[%zu].function.name", i);
      return api_oai_error(r, 400, NULL, field, "invalid_value", "%s: expected " TC_NAME_RULE,
                           field),
             -1;
    }
    if ((params && !json_is_null(params) && !json_is_object(params)) ||
        (desc && !json_is_null(desc) && !json_is_string(desc))) {
      snprintf(field, sizeof field, "tools[%zu].function.%s", i,
               params && !json_is_object(params) ? "parameters" : "description");
      return api_oai_error(r, 400, NULL, field, "invalid_value", "%s: expected %s", field,
                           params && !json_is_object(params) ? "a JSON Schema object" : "a string"),
             -1;
    }
    for (int k = 0; k < q->n_tools; k++)
      if (!strcmp(q->tool_names[k], name)) {
        snprintf(field, sizeof field, "tools[%zu].function.name", i);
        return api_oai_error(r, 400, NULL, field, "invalid_value", "%s: a second tool named '%s'",
                             field, name),
               -1;
      }
    q->tool_names[q->n_tools++] = name;
  }
  q->tools_on = q->n_tools > 0;
  if (!choice || json_is_null(choice)) return 0;
  const char *c = json_string_value(choice);
  if (c && !strcmp(c, "none")) {
    q->tools_on = 0;
  } else if (c && !strcmp(c, "required")) {
    *forced = "";
  } else if (c && !strcmp(c, "auto")) {
  } else if (json_is_object(choice)) {
    const char *name =
        json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    int known = 0;
    for (int k = 0; name && k < q->n_tools; k++) known |= !strcmp(q->tool_names[k], name);
    if (!known)
      return api_oai_error(r, 400, NULL, "tool_choice", "invalid_value",
                           "tool_choice: names no tool of the request"),
             -1;
    *forced = name;
  } else {
    return api_oai_error(r, 400, NULL, "tool_choice", "invalid_value",
                         "tool_choice: expected \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\"}}"),
           -1;
  }
  if (q->tools_on && q->n_tools == 0) q->tools_on = 0;
  return 0;
}

/* The opening that makes the model call (forced: "" any tool, else that tool), in its format. */
static char *call_opening(enum tc_format f, const char *forced) {
  char *s = NULL;
  int rc;
  if (f == TC_QWEN)
    rc = *forced ? asprintf(&s, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", forced)
                 : asprintf(&s, "<tool_call>\n{\"name\": \"");
  else if (f == TC_LLAMA3_JSON)
    rc = *forced ? asprintf(&s, "{\"name\": \"%s\", \"parameters\": ", forced)
                 : asprintf(&s, "{\"name\": \"");
  else
    rc = *forced ? asprintf(&s, "@%s ", forced) : asprintf(&s, "@");
  return rc < 0 ? NULL : s;
}

/* A choice's text (after the forced opening, if any) read for calls: the calls as OpenAI's
 * tool_calls (NULL when it made none; its first only without parallel_tool_calls) and the
 * content before them (NULL: none). *content_out set only with calls. */
static json_t *read_calls(const struct chat_req *q, const char *text, size_t n, json_t **content) {
  *content = NULL;
  if (!q->tools_on) return NULL;
  char *full = NULL;
  if (asprintf(&full, "%s%.*s", q->prefix ? q->prefix : "", (int)n, text) < 0) return NULL;
  struct tc_turn turn;
  json_t *calls = NULL;
  if (!tc_read_turn(q->format, full, strlen(full), q->tool_names, q->n_tools, &turn) &&
      turn.n_calls > 0) {
    calls = json_array();
    for (int k = 0; calls && k < turn.n_calls && (q->parallel || k == 0); k++) {
      char id[STORE_ID_MAX];
      char *args = json_dumps(turn.calls[k].arguments, JSON_COMPACT);
      if (store_new_id("call", id)) snprintf(id, sizeof id, "call-%d", k);
      json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                             "function", "function", "name", turn.calls[k].name,
                                             "arguments", args ? args : "{}"));
      free(args);
    }
    const char *open = q->format == TC_QWEN ? strstr(full, "<tool_call>") : NULL;
    if (open && open > full) *content = json_stringn(full, (size_t)(open - full));
  }
  tc_turn_free(&turn);
  free(full);
  return calls;
}

/* The messages as the chat templates take them: each content's text (a string, or an array of
 * {type: "text", text} parts; null for an assistant that calls tools), an assistant's tool_calls
 * and a tool's answers kept; "developer" is "system". */
static json_t *flatten_messages(const json_t *msgs, char *bad, size_t cap) {
  json_t *out = json_array();
  size_t i;
  const json_t *m;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *c = json_object_get(m, "content");
    if (!role) {
      snprintf(bad, cap, "messages[%zu].role", i);
      json_decref(out);
      return NULL;
    }
    if (!strcmp(role, "developer")) role = "system";
    const json_t *calls = json_object_get(m, "tool_calls");
    json_t *text = NULL;
    if ((!c || json_is_null(c)) && json_is_array(calls) && !strcmp(role, "assistant")) {
      text = json_string("");
    } else if (json_is_string(c)) {
      text = json_incref((json_t *)c);
    } else if (json_is_array(c)) {
      size_t k;
      const json_t *part;
      char *acc = strdup("");
      json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        if (!t || !acc) continue;
        size_t a = strlen(acc), b = strlen(t);
        char *n = realloc(acc, a + b + 1);
        if (!n) continue;
        memcpy(n + a, t, b + 1);
        acc = n;
      }
      text = acc ? json_string(acc) : NULL;
      free(acc);
    }
    if (!text) {
      snprintf(bad, cap, "messages[%zu].content", i);
      json_decref(out);
      return NULL;
    }
    json_t *flat = json_pack("{s:s, s:o}", "role", role, "content", text);
    if (flat && json_is_array(calls) && json_array_size(calls))
      json_object_set(flat, "tool_calls", (json_t *)calls);
    json_array_append_new(out, flat);
  }
  return out;
}

/* For a template that renders no tools (the presets' default, custom templates): an assistant's
 * calls written into its content in the dapod format ("@name {json}"), a tool's answer as a
 * user message "=content", as the model saw them in its episodes. */
static void calls_as_dapod_text(json_t *flat) {
  size_t i;
  json_t *m;
  json_array_foreach(flat, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *calls = json_object_get(m, "tool_calls");
    if (role && !strcmp(role, "tool")) {
      char *s = NULL;
      if (asprintf(&s, "=%s", json_string_value(json_object_get(m, "content"))) >= 0) {
        json_object_set_new(m, "content", json_string(s));
        json_object_set_new(m, "role", json_string("user"));
      }
      free(s);
    } else if (calls) {
      const json_t *fn = json_object_get(json_array_get(calls, 0), "function");
      const json_t *args = json_object_get(fn, "arguments");
      char *a = json_is_string(args) ? strdup(json_string_value(args))
                                     : json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
      char *s = NULL;
      if (asprintf(&s, "%s@%s %s", json_string_value(json_object_get(m, "content")),
                   json_string_value(json_object_get(fn, "name")), a ? a : "{}") >= 0)
        json_object_set_new(m, "content", json_string(s));
      free(s);
      free(a);
      json_object_del(m, "tool_calls");
    }
  }
}

static double now_unix(void) {
  return (double)time(NULL);
}

/* {token, logprob, bytes} of a token shown alone: its text (invalid UTF-8 as U+FFFD) and its
 * raw bytes (a piece of a character keeps its own). */
static json_t *token_json(const struct completion_piece *p, double lp) {
  json_t *bytes = json_array();
  for (size_t i = 0; p && p->bytes && bytes && i < p->n_bytes; i++)
    json_array_append_new(bytes, json_integer((unsigned char)p->bytes[i]));
  return json_pack("{s:o, s:f, s:o}", "token", dapo_json_text(p && p->text ? p->text : ""),
                   "logprob", lp, "bytes", bytes);
}

/* One entry of logprobs.content: the sampled token with its n_top alternatives (most likely
 * first; [] when top_logprobs is 0). */
static json_t *logprob_entry(const struct completion_piece *p, double lp, int n_top,
                             const float *top_logp, const struct completion_piece *top) {
  json_t *e = token_json(p, lp), *alts = json_array();
  for (int j = 0; alts && j < n_top && isfinite(top_logp[j]); j++) /* (masked ones are not) */
    json_array_append_new(alts, token_json(&top[j], top_logp[j]));
  if (e) json_object_set_new(e, "top_logprobs", alts);
  return e;
}

/* Every token of choice i, up to the one that ended it (as usage counts them). */
static json_t *logprobs_json(const struct completion_result *res, int i) {
  const struct lm_samples *go = &res->samples;
  json_t *content = json_array();
  for (int t = 0; t < go->len[i]; t++) {
    size_t at = (size_t)i * go->max_new + t, aj = at * (size_t)go->top_k;
    json_array_append_new(content, logprob_entry(&res->pieces[at], go->logp[at], go->top_k,
                                                 go->top_logp ? go->top_logp + aj : NULL,
                                                 res->top_pieces ? res->top_pieces + aj : NULL));
  }
  return json_pack("{s:o, s:n}", "content", content, "refusal");
}

static const char *finish_name(int finish) {
  return finish == FINISH_STOP ? "stop" : "length";
}

static int render(struct api_req *r, void *arg, const struct completion_result *res) {
  const struct chat_req *q = arg;
  const struct lm_samples *go = &res->samples;
  json_t *choices = json_array();
  for (int i = 0; i < go->n; i++) {
    json_t *content = NULL, *calls = read_calls(q, res->text[i], strlen(res->text[i]), &content);
    char *text = NULL; /* without calls: the text, a forced opening included */
    if (!calls && asprintf(&text, "%s%s", q->prefix ? q->prefix : "", res->text[i]) < 0)
      text = NULL;
    json_t *msg = json_pack("{s:s, s:o, s:n}", "role", "assistant", "content",
                            calls  ? (content ? content : json_null())
                            : text ? dapo_json_text(text)
                                   : dapo_json_text(res->text[i]),
                            "refusal");
    free(text);
    if (calls) json_object_set_new(msg, "tool_calls", calls);
    json_array_append_new(
        choices, json_pack("{s:i, s:o, s:s, s:o}", "index", i, "message", msg, "finish_reason",
                           calls ? "tool_calls" : finish_name(go->finish[i]), "logprobs",
                           q->logprobs ? logprobs_json(res, i) : json_null()));
  }
  return api_reply_json_steal(
      r, 200,
      json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:s}", "id", q->id, "object", "chat.completion",
                "created", (json_int_t)q->created, "model", q->model, "choices", choices, "usage",
                api_completion_usage(res), "system_fingerprint", "dapod"));
}

/* ---- the stream: per choice a role chunk first; then, round by round, each token's content
 * chunk (its text, "" while held back, and its logprobs) and after a choice's last token its
 * finish chunk; the usage chunk with stream_options.include_usage ---- */

static int chunk_add(const struct chat_req *q, json_t *choices, json_t *usage, json_t *frames) {
  json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", q->id, "object", "chat.completion.chunk",
                        "created", (json_int_t)q->created, "model", q->model, "choices", choices);
  if (c && q->include_usage) json_object_set_new(c, "usage", usage ? usage : json_null());
  return c ? json_array_append_new(frames, c) : -1;
}

static int chat_open(void *arg, int n, json_t *frames) {
  const struct chat_req *q = arg;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    rc = chunk_add(q,
                   json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", i, "delta", "role",
                             "assistant", "content", "", "logprobs", "finish_reason"),
                   NULL, frames);
  return rc;
}

/* How much of s[0 .. n) may go out as content when it may still open a call at its end: all but
 * its longest suffix that is a prefix of the format's call opening. */
static size_t safe_content(const struct chat_req *q, const char *s, size_t n) {
  static const char OPEN[] = "<tool_call>";
  if (q->format != TC_QWEN) return n;
  for (size_t k = sizeof OPEN - 2; k > 0; k--)
    if (k <= n && !memcmp(s + n - k, OPEN, k)) return n - k;
  return n;
}

/* Whether a choice's first characters say it calls (1), does not (0), or not yet (-1). */
static int opens_call(const struct chat_req *q, const char *s, size_t n) {
  size_t i = 0;
  while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
  if (q->format == TC_QWEN) return memmem(s, n, "<tool_call>", 11) != NULL;
  const char *open = q->format == TC_DAPOD ? "@" : "{\"name\"";
  size_t k = strlen(open), have = n - i < k ? n - i : k;
  if (have == 0) return -1;
  if (memcmp(s + i, open, have)) return 0;
  return have == k ? 1 : -1;
}

static int chat_token(void *arg, int i, int k, const struct completion_token *tk,
                      struct completion *t, json_t *frames) {
  struct chat_req *q = arg;
  (void)k, (void)t;
  json_t *lp = q->logprobs
                   ? json_pack("{s:[o], s:n}", "content",
                               logprob_entry(tk->piece, tk->logp, tk->n_top, tk->top_logp, tk->top),
                               "refusal")
                   : json_null();
  const char *out = tk->text;
  char *held = NULL;
  if (q->tools_on && i < N_MAX) { /* hold back what may be (or is) a call */
    struct choice_stream *c = &q->cs[i];
    char *grown = realloc(c->text, c->n + tk->len + 1);
    if (!grown) {
      json_decref(lp);
      return -1;
    }
    c->text = grown;
    memcpy(c->text + c->n, tk->text, tk->len);
    c->n += tk->len;
    c->text[c->n] = '\0';
    if (c->mode == CS_UNDECIDED) {
      int o = opens_call(q, c->text, c->n);
      c->mode = o == 1 ? CS_CALLS : o == 0 ? CS_CONTENT : CS_UNDECIDED;
    }
    if (c->mode == CS_CONTENT && q->format == TC_QWEN) {
      const char *open = memmem(c->text + c->sent, c->n - c->sent, "<tool_call>", 11);
      if (open) c->mode = CS_CALLS;
    }
    size_t upto = c->sent;
    if (c->mode == CS_CONTENT)
      upto = tk->finish >= 0 ? c->n : safe_content(q, c->text, c->n);
    else if (c->mode == CS_CALLS && q->format == TC_QWEN) { /* the text before the calls */
      const char *open = memmem(c->text, c->n, "<tool_call>", 11);
      if (open) upto = (size_t)(open - c->text); /* none: a forced opening, in the prompt */
    }
    if (upto < c->sent) upto = c->sent;
    held = strndup(c->text + c->sent, upto - c->sent);
    out = held ? held : "";
    c->sent = upto;
  }
  int rc = chunk_add(q,
                     json_pack("[{s:i, s:{s:o}, s:o, s:n}]", "index", i, "delta", "content",
                               dapo_json_text(out), "logprobs", lp, "finish_reason"),
                     NULL, frames);

  free(held);
  if (rc || tk->finish < 0) return rc;
  json_t *content = NULL, *calls = NULL;
  if (q->tools_on && i < N_MAX && q->cs[i].mode != CS_CONTENT) {
    struct choice_stream *c = &q->cs[i];
    calls = read_calls(q, c->text, c->n, &content);
    json_decref(content);
    char *rest = NULL; /* no call after all: the rest is content (a forced opening included) */
    if (!calls &&
        asprintf(&rest, "%s%.*s", c->sent == 0 && q->prefix ? q->prefix : "", (int)(c->n - c->sent),
                 c->text ? c->text + c->sent : "") >= 0 &&
        *rest)
      rc = chunk_add(q,
                     json_pack("[{s:i, s:{s:o}, s:n, s:n}]", "index", i, "delta", "content",
                               dapo_json_text(rest), "logprobs", "finish_reason"),
                     NULL, frames);
    free(rest);
  }
  if (calls) { /* the calls whole, one entry each, keyed by index */
    size_t n;
    json_t *c;
    json_array_foreach(calls, n, c) json_object_set_new(c, "index", json_integer((json_int_t)n));
    rc = chunk_add(q,
                   json_pack("[{s:i, s:{s:o}, s:n, s:n}]", "index", i, "delta", "tool_calls", calls,
                             "logprobs", "finish_reason"),
                   NULL, frames);
  }
  if (!rc)
    rc = chunk_add(q,
                   json_pack("[{s:i, s:{}, s:n, s:s}]", "index", i, "delta", "logprobs",
                             "finish_reason", calls ? "tool_calls" : finish_name(tk->finish)),
                   NULL, frames);
  return rc;
}

static int chat_close(void *arg, const struct completion_result *res, json_t *frames) {
  const struct chat_req *q = arg;
  return q->include_usage ? chunk_add(q, json_array(), api_completion_usage(res), frames) : 0;
}

static const struct api_completion_stream CHAT_STREAM = {chat_open, chat_token, chat_close};

static int get_int(struct api_req *r, const json_t *b, const char *key, int lo, int hi, int *out) {
  const json_t *v = json_object_get(b, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    api_oai_error(r, 400, NULL, key, "invalid_value", "%s: expected an integer in [%d, %d]", key,
                  lo, hi);
    return -1;
  }
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_num(struct api_req *r, const json_t *b, const char *key, double lo, double hi,
                   double *out) {
  const json_t *v = json_object_get(b, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
    api_oai_error(r, 400, NULL, key, "invalid_value", "%s: expected a number in [%g, %g]", key, lo,
                  hi);
    return -1;
  }
  *out = json_number_value(v);
  return 0;
}

/* The prompt: flat rendered with t (with the request's tools when the family renders them,
 * else their calls and answers written in the dapod format), then the forced call's opening.
 * Decides q's call format and its choices' first stream mode. 0, or an error in e. */
static int tools_prompt(struct chat_req *q, const struct chat_template *t, json_t *flat,
                        const json_t *tools, const char *forced, char **prompt,
                        struct dapo_err *e) {
  int family = chat_renders_tools(t);
  q->format = !family ? TC_DAPOD : !strcmp(chat_family(t), "llama3.2") ? TC_LLAMA3_JSON : TC_QWEN;
  if (!family) calls_as_dapod_text(flat);
  int rc = family && q->tools_on ? chat_render_tools(t, flat, tools, 1, prompt, e)
                                 : chat_render(t, flat, prompt, e);
  if (rc || !q->tools_on) return rc;
  if (forced && !(q->prefix = call_opening(q->format, forced)))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (q->prefix) {
    char *p = NULL;
    if (asprintf(&p, "%s%s", *prompt, q->prefix) < 0)
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    free(*prompt);
    *prompt = p;
  }
  for (int i = 0; i < N_MAX; i++)
    q->cs[i].mode = q->prefix ? CS_CALLS : q->format == TC_QWEN ? CS_CONTENT : CS_UNDECIDED;
  return 0;
}

int api_chat_completions(struct api_req *r) {
  if (r->ctx) return api_completion_resume(r);
  const json_t *b = r->json;
  if (!json_is_object(b))
    return api_oai_error(r, 400, NULL, NULL, "invalid_value", "the body must be a JSON object");
  const char *model = json_string_value(json_object_get(b, "model"));
  if (!model || !*model)
    return api_oai_error(r, 400, NULL, "model", "invalid_value", "model: required");
  const json_t *msgs = json_object_get(b, "messages");
  if (!json_is_array(msgs) || !json_array_size(msgs))
    return api_oai_error(r, 400, NULL, "messages", "invalid_value",
                         "messages: required, a non-empty array");
  int max_tokens = 16, n = 1, top_logprobs = 0;
  double temperature = 1, top_p = 1;
  if (get_int(r, b, "max_tokens", 1, MAX_TOKENS_MAX, &max_tokens) ||
      get_int(r, b, "max_completion_tokens", 1, MAX_TOKENS_MAX, &max_tokens) ||
      get_int(r, b, "n", 1, N_MAX, &n) ||
      get_int(r, b, "top_logprobs", 0, SAMPLER_TOP_MAX, &top_logprobs) ||
      get_num(r, b, "temperature", 0, 2, &temperature) || get_num(r, b, "top_p", 0, 1, &top_p))
    return 0;
  if (top_p == 0) top_p = 1e-6;
  /* OpenAI's rule: top_logprobs only beside logprobs: true */
  const json_t *lpv = json_object_get(b, "logprobs"), *tlv = json_object_get(b, "top_logprobs");
  if (lpv && !json_is_null(lpv) && !json_is_boolean(lpv))
    return api_oai_error(r, 400, NULL, "logprobs", "invalid_value",
                         "logprobs: expected true or false");
  if (tlv && !json_is_null(tlv) && !json_is_true(lpv))
    return api_oai_error(r, 400, NULL, "top_logprobs", "invalid_value",
                         "top_logprobs: only allowed when logprobs is true");
  const json_t *seed = json_object_get(b, "seed");
  if (seed && !json_is_null(seed) && !json_is_integer(seed))
    return api_oai_error(r, 400, NULL, "seed", "invalid_value", "seed: expected an integer");
  struct chat_req *q = calloc(1, sizeof *q);
  if (!q) return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
  q->body = json_incref((json_t *)b);
  const char *forced = NULL;
  if (read_tools(r, b, q, &forced)) {
    chat_req_free(q);
    return 0;
  }
  snprintf(q->model, sizeof q->model, "%s", model);
  q->stream = json_is_true(json_object_get(b, "stream"));
  q->include_usage =
      json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage"));
  q->logprobs = json_is_true(json_object_get(b, "logprobs"));
  q->top_logprobs = top_logprobs;
  const json_t *stop = json_object_get(b, "stop");
  if (json_is_string(stop) && json_string_length(stop)) {
    q->stop[q->n_stop++] = strdup(json_string_value(stop));
  } else if (json_is_array(stop)) {
    size_t i;
    const json_t *s;
    json_array_foreach(stop, i, s) {
      if (!json_is_string(s) || q->n_stop == STOP_MAX || !json_string_length(s)) {
        chat_req_free(q);
        return api_oai_error(r, 400, NULL, "stop", "invalid_value",
                             "stop: up to 4 non-empty strings");
      }
      q->stop[q->n_stop++] = strdup(json_string_value(s));
    }
  } else if (stop && !json_is_null(stop)) {
    chat_req_free(q);
    return api_oai_error(r, 400, NULL, "stop", "invalid_value", "stop: a string or an array");
  }
  /* structured outputs: a JSON object, or one that follows a schema (not beside tools yet) */
  const json_t *rf = NULL;
  char rf_field[256], rf_msg[512];
  if (api_response_format(b, &rf, rf_field, sizeof rf_field, rf_msg, sizeof rf_msg)) {
    chat_req_free(q);
    return api_oai_error(r, 400, NULL, rf_field, "invalid_value", "%s: %s", rf_field, rf_msg);
  }
  if (rf && q->tools_on) {
    chat_req_free(q);
    return api_oai_error(r, 400, NULL, "response_format", "invalid_value",
                         "response_format: not supported together with tools yet (dapod)");
  }
  /* the model: an ft: name maps to the job's checkpoint */
  char job_id[STORE_ID_MAX], native[STORE_ID_MAX + 32], msg[512] = "";
  const char *resolve = model, *job = NULL;
  if (api_oai_model_native(r, model, native, sizeof native, job_id, sizeof job_id)) {
    job = job_id;
    resolve = native;
  } else if (strstr(model, ":step-")) {
    snprintf(job_id, sizeof job_id, "%.*s", (int)(strstr(model, ":step-") - model), model);
    job = job_id;
  }
  char *spec = NULL;
  struct registry_entry entry;
  int m = registry_resolve(r->srv, resolve, r->owner, &spec, &entry, msg, sizeof msg);
  if (m) {
    chat_req_free(q);
    free(spec);
    if (m < 0) return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
    return api_oai_error(r, 404, NULL, "model", "model_not_found", "model: %s", msg);
  }
  char bad[64] = "";
  json_t *flat = flatten_messages(msgs, bad, sizeof bad);
  struct chat_template *t =
      flat ? registry_chat_template(r->srv, job, spec, r->owner, msg, sizeof msg) : NULL;
  char *prompt = NULL;
  struct dapo_err e = {0};
  int rc = 0;
  if (!flat)
    rc = api_oai_error(r, 400, NULL, bad, "invalid_value", "%s: expected a string", bad);
  else if (!t)
    rc = api_oai_error(r, 400, NULL, "model", "invalid_value", "model: %s", msg);
  else if (tools_prompt(q, t, flat, json_object_get(b, "tools"), forced, &prompt, &e))
    rc = api_oai_error(r, 400, NULL, "messages", "invalid_value", "messages: %s", e.msg);
  else if (strlen(prompt) > PROMPT_MAX_BYTES)
    rc = api_oai_error(r, 400, NULL, "messages", "invalid_value",
                       "messages: the rendered prompt is over %d bytes", PROMPT_MAX_BYTES);
  json_decref(flat);
  /* the template's end of an assistant turn ends a choice (a supervised job's "\n", a chat
     family's end-of-turn token): the reply is the turn, not what the model says after it */
  const char *eot = t ? chat_stop_text(t) : NULL;
  int have = 0;
  for (int i = 0; eot && i < q->n_stop; i++) have |= !strcmp(q->stop[i], eot);
  if (!rc && eot && *eot && !have && q->n_stop < STOP_MAX) {
    if ((q->stop[q->n_stop] = strdup(eot)))
      q->n_stop++;
    else
      rc = api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
  }
  chat_free(t);
  if (rc || !prompt) {
    free(prompt);
    free(spec);
    chat_req_free(q);
    return rc;
  }
  struct completion_req req = {.model = model,
                               .spec = spec,
                               .cfg = &entry.cfg,
                               .prompt = prompt,
                               .prompt_len = strlen(prompt),
                               .max_tokens = max_tokens,
                               .n = n,
                               .logprobs = q->logprobs,
                               .top_logprobs = q->top_logprobs,
                               .temperature = (float)temperature,
                               .top_p = (float)top_p,
                               .seed = seed ? (uint64_t)json_integer_value(seed) : 0,
                               .stop = (const char *const *)q->stop,
                               .n_stop = q->n_stop,
                               .stream = q->stream,
                               .response_format = rf};
  snprintf(q->id, sizeof q->id, "chatcmpl-%lld%d", (long long)now_unix(), rand() % 100000);
  q->created = (long long)now_unix();
  rc = api_completion_submit(r, &req, render, q, chat_req_free, q->stream ? &CHAT_STREAM : NULL);
  free(prompt);
  free(spec);
  return rc;
}
