/* Handler: POST /v1/completions — sample from a base model (preset or folder) or a fine-tuned
 * checkpoint ("{job_id}:step-{n}"): {model, prompt, max_tokens, temperature, top_p, n, seed,
 * logprobs} -> {object: "text_completion", model, choices: [{index, text, finish_reason,
 * logprobs?: {tokens, token_ids, token_logprobs, prompt_token_ids}}], usage}.
 *
 * Kept simple: the model is opened per request and sampled on the HTTP thread, with the work
 * bounded (max_tokens <= 512, n <= 16, prompt <= 16 KiB). A preset's weights are the ones its
 * seed 0 gives (as `dapod save-preset` writes them); `seed` seeds the sampling streams, one per
 * choice, so a request is reproducible. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "http.h"
#include "lm.h"
#include "registry.h"
#include "rng.h"
#include "sampler.h"
#include "server.h"

#define MAX_TOKENS_MAX 512
#define N_MAX 16
#define PROMPT_MAX_BYTES (16 * 1024)

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
      json_t *f = api_json_text(key);
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
static json_t *choices_json(const struct lm *lm, const struct creq *q, const struct lm_samples *go,
                            const int *prompt_ids, int n_prompt, struct dapo_err *e) {
  json_t *choices = json_array();
  long long completion = 0;
  for (int i = 0; choices && i < go->n; i++) {
    const int *toks = go->tokens + (size_t)i * go->max_new;
    const float *lp = go->logp + (size_t)i * go->max_new;
    char *text = tok_decode_alloc(lm->tok, toks, go->len[i], 1, e);
    if (!text) {
      json_decref(choices);
      return NULL;
    }
    json_t *c = json_pack("{s:i, s:o, s:s}", "index", i, "text", api_json_text(text),
                          "finish_reason", go->finish[i] == FINISH_STOP ? "stop" : "length");
    free(text);
    completion += go->len[i];
    if (c && q->logprobs) {
      json_t *tokens = json_array(), *ids = json_array(), *lps = json_array();
      for (int t = 0; t < go->len[i]; t++) {
        char *piece = tok_decode_alloc(lm->tok, toks + t, 1, 0, e);
        json_array_append_new(tokens, piece ? api_json_text(piece) : json_string(""));
        free(piece);
        json_array_append_new(ids, json_integer(toks[t]));
        json_array_append_new(lps, json_real(lp[t]));
      }
      json_t *pids = json_array();
      for (int t = 0; t < n_prompt; t++) json_array_append_new(pids, json_integer(prompt_ids[t]));
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
  json_t *o = json_pack("{s:s, s:s, s:o, s:{s:i, s:I, s:I}}", "object", "text_completion", "model",
                        q->model, "choices", choices, "usage", "prompt_tokens", n_prompt,
                        "completion_tokens", (json_int_t)completion, "total_tokens",
                        (json_int_t)(completion + n_prompt));
  return o;
}

int api_completions_create(struct api_req *r) {
  if (!json_is_object(r->json))
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, "the body must be a JSON object",
                           json_pack("[{s:s, s:s}]", "field", "", "message",
                                     "expected a JSON object with at least model and prompt"));
  json_t *errors = json_array();
  if (!errors) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  struct creq q;
  parse_body(r->json, &q, errors);
  char *spec = NULL, msg[512];
  if (q.model && *q.model) {
    int m = registry_resolve(r->srv, q.model, r->owner, &spec, NULL, msg, sizeof msg);
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
  struct lm lm = {0};
  struct dapo_err e = {0};
  int rc = lm_open(spec, 0, &lm, &e);
  free(spec);
  if (rc) {
    add_err(errors, "model", e.msg);
    return reply_invalid(r, errors);
  }
  int n_ids = 0;
  int *ids = NULL;
  struct lm_samples smp = {0};
  json_t *out = NULL;
  if ((rc = lm_encode_prompt(&lm, q.prompt, strlen(q.prompt), LM_PROMPT_TEXT, q.max_tokens, &ids,
                             &n_ids, &e))) {
    if (rc == DAPO_ENOMEM) goto oom;
    add_err(errors, rc == DAPO_ERANGE ? "max_tokens" : "prompt", e.msg);
    goto invalid;
  }
  struct sampler_opts so = {
      .temperature = (float)q.temperature, .top_p = (float)q.top_p, .max_new_tokens = q.max_tokens};
  if (lm_sample(&lm, ids, n_ids, q.n, &so, q.seed, &smp, &e)) goto fail;
  if (!(out = choices_json(&lm, &q, &smp, ids, n_ids, &e))) goto fail;
  json_decref(errors);
  rc = api_reply_json_steal(r, 200, out);
  goto done;
invalid:
  rc = reply_invalid(r, errors);
  goto done;
oom:
  json_decref(errors);
  rc = api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  goto done;
fail:
  json_decref(errors);
  rc = e.code == DAPO_ENOMEM ? api_reply_error(r, API_ERR_UNAVAILABLE, e.msg, NULL)
                             : api_reply_errorf(r, API_ERR_INTERNAL, "sampling failed: %s", e.msg);
done:
  free(ids);
  lm_samples_free(&smp);
  lm_close(&lm);
  return rc;
}
