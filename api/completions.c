/* Handler: POST /v1/completions — sample from a base model (preset or folder) or a fine-tuned
 * checkpoint ("{job_id}:step-{n}"): {model, prompt, max_tokens, temperature, top_p, n, seed,
 * logprobs} -> {object: "text_completion", model, choices: [{index, text, finish_reason,
 * logprobs?: {tokens, token_ids, token_logprobs, prompt_token_ids}}], usage}.
 *
 * The body is validated and the model id resolved here; the completion service
 * (server/completions.h) samples it on its own threads within the memory limit, with the work
 * bounded (max_tokens <= 512, n <= 16, prompt <= 16 KiB). The request is suspended meanwhile (no
 * HTTP thread waits) and answered when the service publishes the completion's end on the bus; a
 * full queue, or a wait for a thread or memory past completion_wait_s, is answered 503 with
 * Retry-After. A preset's weights are the ones its seed 0 gives (as `dapod save-preset` writes
 * them); `seed` seeds the sampling streams, one per choice, so a request is reproducible. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "completions.h"
#include "handlers.h"
#include "http.h"
#include "registry.h"
#include "sampler.h"
#include "server.h"

#define MAX_TOKENS_MAX 512
#define N_MAX 16
#define PROMPT_MAX_BYTES (16 * 1024)
/* Once sampling started, the longest the request waits for it (as the longest long-poll). */
#define RUN_WAIT_MAX_S 600

struct creq {
  const char *model, *prompt;
  int max_tokens, n, logprobs;
  double temperature, top_p;
  uint64_t seed;
};

static void add_err(json_t *errors, const char *field, const char *msg) {
  json_array_append_new(errors, json_pack("{s:s, s:s}", "field", field, "message", msg));
}

/* An integer member in [lo, hi] (default def). */
static void get_int(const json_t *body, const char *key, int lo, int hi, int def, int *out,
                    json_t *errors) {
  json_t *v = json_object_get(body, key);
  *out = def;
  if (!v || json_is_null(v)) return;
  char msg[96];
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    snprintf(msg, sizeof msg, "expected an integer in [%d, %d]", lo, hi);
    add_err(errors, key, msg);
    return;
  }
  *out = (int)json_integer_value(v);
}

static void get_num(const json_t *body, const char *key, double lo, double hi, int lo_open,
                    double def, double *out, json_t *errors) {
  json_t *v = json_object_get(body, key);
  *out = def;
  if (!v || json_is_null(v)) return;
  char msg[96];
  double x = json_number_value(v);
  if (!json_is_number(v) || x > hi || x < lo || (lo_open && x == lo)) {
    snprintf(msg, sizeof msg, "expected a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
    add_err(errors, key, msg);
    return;
  }
  *out = x;
}

static void parse_body(const json_t *b, struct creq *q, json_t *errors) {
  static const char *const KNOWN[] = {"model", "prompt", "max_tokens", "temperature",
                                      "top_p", "n",      "seed",       "logprobs"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)b, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++) ok |= !strcmp(key, KNOWN[i]);
    if (!ok) {
      json_t *f = dapo_json_text(key);
      json_array_append_new(errors,
                            json_pack("{s:o, s:s}", "field", f, "message", "unknown field"));
    }
  }
  q->model = json_string_value(json_object_get(b, "model"));
  if (!q->model || !*q->model)
    add_err(errors, "model", "required: a preset, a model folder or a checkpoint id");
  q->prompt = json_string_value(json_object_get(b, "prompt"));
  if (!q->prompt)
    add_err(errors, "prompt", "required: a string");
  else if (strlen(q->prompt) > PROMPT_MAX_BYTES)
    add_err(errors, "prompt", "longer than 16384 bytes");
  get_int(b, "max_tokens", 1, MAX_TOKENS_MAX, 16, &q->max_tokens, errors);
  get_int(b, "n", 1, N_MAX, 1, &q->n, errors);
  get_num(b, "temperature", 0, 100, 0, 1.0, &q->temperature, errors);
  get_num(b, "top_p", 0, 1, 1, 1.0, &q->top_p, errors);
  json_t *seed = json_object_get(b, "seed");
  q->seed = 0;
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed) || json_integer_value(seed) < 0)
      add_err(errors, "seed", "expected a non-negative integer");
    else
      q->seed = (uint64_t)json_integer_value(seed);
  }
  json_t *lp = json_object_get(b, "logprobs");
  q->logprobs = 0;
  if (lp && !json_is_null(lp)) {
    if (!json_is_boolean(lp))
      add_err(errors, "logprobs", "expected true or false");
    else
      q->logprobs = json_is_true(lp);
  }
}

static int reply_invalid(struct api_req *r, json_t *errors) {
  size_t n = json_array_size(errors);
  char detail[64];
  snprintf(detail, sizeof detail, "%zu problem%s in the request", n, n > 1 ? "s" : "");
  return api_reply_error(r, API_ERR_VALIDATION_FAILED, detail, errors);
}

/* The choices and usage of a finished generation. */
static json_t *choices_json(const char *model, int logprobs, const struct completion_result *res) {
  const struct lm_samples *go = &res->samples;
  json_t *choices = json_array();
  long long completion = 0;
  for (int i = 0; choices && i < go->n; i++) {
    const int *toks = go->tokens + (size_t)i * go->max_new;
    const float *lp = go->logp + (size_t)i * go->max_new;
    json_t *c = json_pack("{s:i, s:o, s:s}", "index", i, "text", dapo_json_text(res->text[i]),
                          "finish_reason", go->finish[i] == FINISH_STOP ? "stop" : "length");
    completion += go->len[i];
    if (c && logprobs) {
      json_t *tokens = json_array(), *ids = json_array(), *lps = json_array();
      for (int t = 0; t < go->len[i]; t++) {
        const char *piece = res->pieces[(size_t)i * go->max_new + t];
        json_array_append_new(tokens, piece ? dapo_json_text(piece) : json_string(""));
        json_array_append_new(ids, json_integer(toks[t]));
        json_array_append_new(lps, json_real(lp[t]));
      }
      json_t *pids = json_array();
      for (int t = 0; t < res->n_prompt; t++)
        json_array_append_new(pids, json_integer(res->prompt_ids[t]));
      json_object_set_new(c, "logprobs",
                          json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_ids", ids,
                                    "token_logprobs", lps, "prompt_token_ids", pids));
    } else if (c) {
      json_object_set_new(c, "logprobs", json_null());
    }
    if (!c || json_array_append_new(choices, c)) {
      json_decref(choices);
      return NULL;
    }
  }
  json_t *o =
      json_pack("{s:s, s:s, s:o, s:{s:i, s:I, s:I}}", "object", "text_completion", "model", model,
                "choices", choices, "usage", "prompt_tokens", res->n_prompt, "completion_tokens",
                (json_int_t)completion, "total_tokens", (json_int_t)(completion + res->n_prompt));
  return o;
}

/* A 503 that tells the client when to come back. */
static int reply_busy(struct api_req *r, const char *detail) {
  char after[16];
  snprintf(after, sizeof after, "%d", completions_retry_after_s(r->srv->completions));
  int rc = api_reply_error(r, API_ERR_UNAVAILABLE, detail, NULL);
  if (!rc) api_reply_header(r, "Retry-After", after);
  return rc;
}

/* The request's state while its completion is queued or sampled (r->ctx). */
struct wait {
  struct completion *t; /* owned: completion_release */
  char *model;          /* the id as asked (owned) */
  int logprobs;
  api_completion_render render; /* NULL: the text_completion object */
  void *arg;                    /* render's (owned through arg_free) */
  void (*arg_free)(void *arg);
  int running;         /* sampling was seen started: deadline_ms is the run's bound */
  int64_t deadline_ms; /* api_now_ms clock */
};

static void wait_free(void *p) {
  struct wait *w = p;
  if (!w) return;
  completion_release(w->t);
  free(w->model);
  if (w->arg_free) w->arg_free(w->arg);
  free(w);
}

static int reply_result(struct api_req *r, const struct wait *w,
                        const struct completion_result *res) {
  switch (res->outcome) {
  case COMPLETION_OK:
    if (w->render) return w->render(r, w->arg, res);
    return api_reply_json_steal(r, 200, choices_json(w->model, w->logprobs, res));
  case COMPLETION_INVALID:
  case COMPLETION_TOO_LARGE: return reply_invalid(r, json_deep_copy(res->errors));
  case COMPLETION_STOPPING:
  case COMPLETION_NO_MEMORY: return api_reply_error(r, API_ERR_UNAVAILABLE, res->message, NULL);
  default: return api_reply_errorf(r, API_ERR_INTERNAL, "sampling failed: %s", res->message);
  }
}

/* Answers when the completion is done, or suspends the request until it is (or its deadline). */
static int await(struct api_req *r, struct wait *w) {
  for (int round = 0; round < 8; round++) {
    const struct completion_result *res = NULL;
    enum completion_state st = completion_poll(w->t, &res);
    if (st == COMPLETION_DONE) return reply_result(r, w, res);
    int64_t now = api_now_ms();
    if (st == COMPLETION_RUNNING && !w->running) {
      w->running = 1;
      w->deadline_ms = now + (int64_t)RUN_WAIT_MAX_S * 1000;
    }
    if (now >= w->deadline_ms) {
      if (w->running)
        return api_reply_errorf(r, API_ERR_UNAVAILABLE, "the completion did not finish within %d s",
                                RUN_WAIT_MAX_S);
      if (completion_cancel(w->t)) {
        char detail[160];
        snprintf(detail, sizeof detail,
                 "the completion waited completion_wait_s (%d s) for a sampling thread or for "
                 "memory; retry later",
                 r->srv->cfg.completion_wait_s);
        return reply_busy(r, detail);
      }
      continue; /* it started meanwhile */
    }
    int rc = api_wait_event(r, completion_key(w->t), 0, w->deadline_ms);
    if (rc == 0) return 0; /* suspended: this handler runs again when it ends or at the deadline */
    if (rc < 0) return api_reply_error(r, API_ERR_UNAVAILABLE, "the daemon is stopping", NULL);
  }
  return api_reply_error(r, API_ERR_UNAVAILABLE, "the completion could not be awaited", NULL);
}

int api_completions_create(struct api_req *r) {
  if (r->ctx) return await(r, r->ctx);
  if (!json_is_object(r->json))
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, "the body must be a JSON object",
                           json_pack("[{s:s, s:s}]", "field", "", "message",
                                     "expected a JSON object with at least model and prompt"));
  json_t *errors = json_array();
  if (!errors) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  struct creq q;
  parse_body(r->json, &q, errors);
  char *spec = NULL, msg[512];
  struct registry_entry entry;
  if (q.model && *q.model) {
    int m = registry_resolve(r->srv, q.model, r->owner, &spec, &entry, msg, sizeof msg);
    if (m < 0) {
      json_decref(errors);
      return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
    }
    if (m > 0) add_err(errors, "model", msg);
  }
  if (json_array_size(errors)) {
    free(spec);
    return reply_invalid(r, errors);
  }
  json_decref(errors);
  struct completion_req req = {.model = q.model,
                               .spec = spec,
                               .cfg = &entry.cfg,
                               .prompt = q.prompt,
                               .prompt_len = strlen(q.prompt),
                               .max_tokens = q.max_tokens,
                               .n = q.n,
                               .logprobs = q.logprobs,
                               .temperature = (float)q.temperature,
                               .top_p = (float)q.top_p,
                               .seed = q.seed};
  int rc = api_completion_submit(r, &req, NULL, NULL, NULL);
  free(spec);
  return rc;
}

int api_completion_submit(struct api_req *r, const struct completion_req *req,
                          api_completion_render render, void *arg, void (*arg_free)(void *)) {
  struct wait *w = calloc(1, sizeof *w);
  struct dapo_err e = {0};
  int rc = w && (w->model = strdup(req->model))
               ? completions_submit(r->srv->completions, req, &w->t, &e)
               : DAPO_ENOMEM;
  if (w)
    w->render = render, w->arg = arg, w->arg_free = arg_free;
  else if (arg_free)
    arg_free(arg);
  if (rc) {
    wait_free(w);
    if (rc == COMPLETIONS_EFULL) return reply_busy(r, e.msg);
    return api_reply_error(r, API_ERR_UNAVAILABLE, rc == DAPO_ENOMEM ? "out of memory" : e.msg,
                           NULL);
  }
  w->logprobs = req->logprobs;
  w->deadline_ms = api_now_ms() + (int64_t)r->srv->cfg.completion_wait_s * 1000;
  r->ctx = w;
  r->ctx_free = wait_free;
  return await(r, w);
}

int api_completion_resume(struct api_req *r) {
  return await(r, r->ctx);
}
