/* Handler: POST /v1/chat/completions, OpenAI's chat completions on base models and fine-tuned
 * checkpoints (native "{job_id}:step-N" ids or the "ft:...:{job_id}[:ckpt-step-N]" names of the
 * fine-tuning surface): the messages are rendered with the model's chat template (the job's own
 * for its checkpoints, tokenizer_config.json's for a folder, else the default of
 * docs/OPENAI.md), sampled on the completion service (a `stop` string ends its choice there),
 * and answered as a chat.completion object, or with stream: true as chat.completion.chunk
 * server-sent events sent as the tokens are sampled, ending in `data: [DONE]` (the stream engine
 * of api/completions.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "completions.h"
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

static const char DEFAULT_TEMPLATE[] =
    "{\"system\": \"{content}\\n\", \"user\": \"{content}\", \"assistant\": \"{content}\\n\"}";

struct chat_req {
  char model[512];
  char id[64];
  long long created;
  int stream, include_usage, logprobs, top_logprobs;
  char *stop[STOP_MAX];
  int n_stop;
};

static void chat_req_free(void *p) {
  struct chat_req *q = p;
  if (!q) return;
  for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
  free(q);
}

/* The text of a message's content: a string, or an array of {type: "text", text} parts. */
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
    json_t *text = NULL;
    if (json_is_string(c)) {
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
    json_array_append_new(out, json_pack("{s:s, s:o}", "role", role, "content", text));
  }
  return out;
}

/* The template to render with, for the resolved model. */
static struct chat_template *template_for(struct api_req *r, const char *job_id, const char *spec,
                                          char *msg, size_t cap) {
  struct dapo_err e = {0};
  json_t *tpl = NULL, *tokcfg = NULL;
  if (job_id) {
    struct store_job job;
    if (!store_job_get(r->srv->store, job_id, r->owner, &job, &e)) {
      tpl = json_incref(json_object_get(job.spec, "chat_template"));
      store_job_deinit(&job);
    }
  }
  if (!tpl && spec && strchr(spec, '/')) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", spec);
    tokcfg = json_load_file(path, 0, NULL);
    if (!json_is_string(json_object_get(tokcfg, "chat_template"))) {
      json_decref(tokcfg);
      tokcfg = NULL;
    }
  }
  if (!tpl && !tokcfg) tpl = json_loads(DEFAULT_TEMPLATE, 0, NULL);
  struct chat_template *t = chat_from_spec(tpl, tokcfg, &e);
  if (!t) snprintf(msg, cap, "%s", e.msg);
  json_decref(tpl);
  json_decref(tokcfg);
  return t;
}

static double now_unix(void) {
  return (double)time(NULL);
}

/* One entry of logprobs.content: the token (decoded alone), its log-prob and bytes. */
static json_t *logprob_entry(const struct chat_req *q, const char *piece, double lp) {
  if (!piece) piece = "";
  json_t *bytes = json_array();
  for (const unsigned char *b = (const unsigned char *)piece; *b; b++)
    json_array_append_new(bytes, json_integer(*b));
  json_t *top = json_array();
  if (q->top_logprobs > 0) /* the sampled token only: the sampler keeps no others */
    json_array_append_new(top, json_pack("{s:o, s:f, s:O}", "token", dapo_json_text(piece),
                                         "logprob", lp, "bytes", bytes));
  return json_pack("{s:o, s:f, s:o, s:o}", "token", dapo_json_text(piece), "logprob", lp, "bytes",
                   bytes, "top_logprobs", top);
}

/* Every token of choice i, up to the one that ended it (as usage counts them). */
static json_t *logprobs_json(const struct chat_req *q, const struct completion_result *res, int i) {
  const struct lm_samples *go = &res->samples;
  json_t *content = json_array();
  for (int t = 0; t < go->len[i]; t++) {
    size_t at = (size_t)i * go->max_new + t;
    json_array_append_new(content, logprob_entry(q, res->pieces[at], go->logp[at]));
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
  for (int i = 0; i < go->n; i++)
    json_array_append_new(
        choices, json_pack("{s:i, s:{s:s, s:o, s:n}, s:s, s:o}", "index", i, "message", "role",
                           "assistant", "content", dapo_json_text(res->text[i]), "refusal",
                           "finish_reason", finish_name(go->finish[i]), "logprobs",
                           q->logprobs ? logprobs_json(q, res, i) : json_null()));
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

static int chat_token(void *arg, int i, int k, const struct completion_token *tk,
                      struct completion *t, json_t *frames) {
  const struct chat_req *q = arg;
  (void)k, (void)t;
  json_t *lp = q->logprobs ? json_pack("{s:[o], s:n}", "content",
                                       logprob_entry(q, tk->piece, tk->logp), "refusal")
                           : json_null();
  int rc = chunk_add(q,
                     json_pack("[{s:i, s:{s:o}, s:o, s:n}]", "index", i, "delta", "content",
                               dapo_json_text(tk->text), "logprobs", lp, "finish_reason"),
                     NULL, frames);
  if (!rc && tk->finish >= 0)
    rc = chunk_add(q,
                   json_pack("[{s:i, s:{}, s:n, s:s}]", "index", i, "delta", "logprobs",
                             "finish_reason", finish_name(tk->finish)),
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
      get_int(r, b, "n", 1, N_MAX, &n) || get_int(r, b, "top_logprobs", 0, 20, &top_logprobs) ||
      get_num(r, b, "temperature", 0, 2, &temperature) || get_num(r, b, "top_p", 0, 1, &top_p))
    return 0;
  if (top_p == 0) top_p = 1e-6;
  const json_t *seed = json_object_get(b, "seed");
  if (seed && !json_is_null(seed) && !json_is_integer(seed))
    return api_oai_error(r, 400, NULL, "seed", "invalid_value", "seed: expected an integer");
  struct chat_req *q = calloc(1, sizeof *q);
  if (!q) return api_oai_error(r, 503, NULL, NULL, NULL, "out of memory");
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
  /* the model: an ft: name maps to the job's checkpoint */
  char job_id[STORE_ID_MAX], native[STORE_ID_MAX + 32], msg[512] = "";
  long long step = -1;
  const char *resolve = model, *job = NULL;
  if (api_oai_model_parse(model, job_id, sizeof job_id, &step)) {
    job = job_id;
    if (step < 0) {
      struct store_job sj;
      struct dapo_err e = {0};
      if (!store_job_get(r->srv->store, job_id, r->owner, &sj, &e)) {
        step = sj.n_ckpt ? sj.ckpt_steps[sj.n_ckpt - 1] : -1;
        store_job_deinit(&sj);
      }
    }
    registry_ckpt_id(job_id, step, native, sizeof native);
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
  struct chat_template *t = flat ? template_for(r, job, spec, msg, sizeof msg) : NULL;
  char *prompt = NULL;
  struct dapo_err e = {0};
  int rc = 0;
  if (!flat)
    rc = api_oai_error(r, 400, NULL, bad, "invalid_value", "%s: expected a string", bad);
  else if (!t)
    rc = api_oai_error(r, 400, NULL, "model", "invalid_value", "model: %s", msg);
  else if (chat_render(t, flat, &prompt, &e))
    rc = api_oai_error(r, 400, NULL, "messages", "invalid_value", "messages: %s", e.msg);
  else if (strlen(prompt) > PROMPT_MAX_BYTES)
    rc = api_oai_error(r, 400, NULL, "messages", "invalid_value",
                       "messages: the rendered prompt is over %d bytes", PROMPT_MAX_BYTES);
  json_decref(flat);
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
                               .temperature = (float)temperature,
                               .top_p = (float)top_p,
                               .seed = seed ? (uint64_t)json_integer_value(seed) : 0,
                               .stop = (const char *const *)q->stop,
                               .n_stop = q->n_stop,
                               .stream = q->stream};
  snprintf(q->id, sizeof q->id, "chatcmpl-%lld%d", (long long)now_unix(), rand() % 100000);
  q->created = (long long)now_unix();
  rc = api_completion_submit(r, &req, render, q, chat_req_free, q->stream ? &CHAT_STREAM : NULL);
  free(prompt);
  free(spec);
  return rc;
}
