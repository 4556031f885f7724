/* Handler: POST /v1/completions — sample from a base model (preset or folder) or a fine-tuned
 * checkpoint ("{job_id}:step-{n}"): {model, prompt, max_tokens, temperature, top_p, n, seed,
 * logprobs, stop, stream, stream_options} -> {object: "text_completion", model, choices: [{index,
 * text, finish_reason, logprobs?: {tokens, token_ids, token_logprobs, prompt_token_ids,
 * top_logprobs?}}], usage} (logprobs true, or OpenAI's integer 0..5: with 1..5, top_logprobs
 * lists per token a {token: logprob} object of that many alternatives);
 * with stream: true, one text_completion chunk per token as it is sampled (server-sent events,
 * then `data: [DONE]`; the stream engine below is chat's too).
 *
 * The body is validated and the model id resolved here; the completion service
 * (server/completions.h) samples it on its own threads within the memory limit, with the work
 * bounded (max_tokens <= 512, n <= 16, prompt <= 16 KiB). The request is suspended meanwhile (no
 * HTTP thread waits) and answered when the service publishes the completion's end on the bus; a
 * full queue, or a wait for a thread or memory past completion_wait_s, is answered 503 with
 * Retry-After. A preset's weights are the ones its seed 0 gives (as `dapod save-preset` writes
 * them); `seed` seeds the sampling streams, one per choice, so a request is reproducible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "completions.h"
#include "handlers.h"
#include "http.h"
#include "jsongrammar.h"
#include "outbuf.h"
#include "registry.h"
#include "sampler.h"
#include "server.h"

#define MAX_TOKENS_MAX 512
#define N_MAX 16
#define PROMPT_MAX_BYTES (16 * 1024)
#define LOGPROBS_MAX 5 /* OpenAI's bound on the legacy route's integer logprobs */
/* Once sampling started, the longest the request waits for it (as the longest long-poll). */
#define RUN_WAIT_MAX_S 600
/* The most framed bytes a stream holds at once: all the chunks of a whole completion (N_MAX
 * choices of MAX_TOKENS_MAX tokens, each well under 1 KiB framed) need under 8 MiB. */
#define CSTREAM_BUF_MAX (64 << 20)

struct creq {
  const char *model, *prompt;
  const char *stop[COMPLETION_STOP_MAX];
  int n_stop, stream, include_usage;
  int max_tokens, n, logprobs, top_logprobs;
  double temperature, top_p;
  uint64_t seed;
  const json_t *response_format; /* borrowed from the body; NULL: free text */
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
  static const char *const KNOWN[] = {"model", "prompt", "max_tokens",     "temperature",
                                      "top_p", "n",      "seed",           "logprobs",
                                      "stop",  "stream", "stream_options", "response_format"};
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
  /* dapod's boolean, or OpenAI's integer: how many alternatives each token lists */
  json_t *lp = json_object_get(b, "logprobs");
  q->logprobs = q->top_logprobs = 0;
  if (json_is_boolean(lp)) {
    q->logprobs = json_is_true(lp);
  } else if (json_is_integer(lp) && json_integer_value(lp) >= 0 &&
             json_integer_value(lp) <= LOGPROBS_MAX) {
    q->logprobs = 1;
    q->top_logprobs = (int)json_integer_value(lp);
  } else if (lp && !json_is_null(lp)) {
    add_err(errors, "logprobs", "expected true, false or an integer in [0, 5]");
  }
  char rf_field[256], rf_msg[512];
  if (api_response_format(b, &q->response_format, rf_field, sizeof rf_field, rf_msg, sizeof rf_msg))
    add_err(errors, rf_field, rf_msg);
  const json_t *stop = json_object_get(b, "stop");
  q->n_stop = 0;
  if (json_is_string(stop) && json_string_length(stop)) {
    q->stop[q->n_stop++] = json_string_value(stop);
  } else if (json_is_array(stop) && json_array_size(stop) <= COMPLETION_STOP_MAX) {
    size_t i;
    const json_t *v1;
    json_array_foreach(stop, i, v1) {
      if (!json_is_string(v1) || !json_string_length(v1)) break;
      q->stop[q->n_stop++] = json_string_value(v1);
    }
    if ((size_t)q->n_stop != json_array_size(stop))
      add_err(errors, "stop", "expected a non-empty string or an array of up to 4 of them");
  } else if (stop && !json_is_null(stop)) {
    add_err(errors, "stop", "expected a non-empty string or an array of up to 4 of them");
  }
  const json_t *st = json_object_get(b, "stream"), *so = json_object_get(b, "stream_options");
  if (st && !json_is_null(st) && !json_is_boolean(st))
    add_err(errors, "stream", "expected true or false");
  q->stream = json_is_true(st);
  const json_t *iu = json_object_get(so, "include_usage");
  if ((so && !json_is_null(so) && !json_is_object(so)) || (iu && !json_is_boolean(iu)))
    add_err(errors, "stream_options", "expected {\"include_usage\": true or false}");
  q->include_usage = json_is_true(iu);
}

static int reply_invalid(struct api_req *r, json_t *errors) {
  size_t n = json_array_size(errors);
  char detail[64];
  snprintf(detail, sizeof detail, "%zu problem%s in the request", n, n > 1 ? "s" : "");
  return api_reply_error(r, API_ERR_VALIDATION_FAILED, detail, errors);
}

json_t *api_completion_usage(const struct completion_result *res) {
  long long completion = 0;
  for (int i = 0; i < res->samples.n; i++) completion += res->samples.len[i];
  return json_pack("{s:i, s:I, s:I}", "prompt_tokens", res->n_prompt, "completion_tokens",
                   (json_int_t)completion, "total_tokens",
                   (json_int_t)(completion + res->n_prompt));
}

/* OpenAI's legacy top_logprobs entry of one token: {token: logprob} of its n alternatives (the
 * likelier first; a text two of them decode to keeps the likelier's). */
static json_t *top_dict(int n, const float *logp, const struct completion_piece *top) {
  json_t *d = json_object();
  for (int j = 0; d && j < n; j++) {
    const char *key = top[j].text ? top[j].text : "";
    if (!isfinite(logp[j])) break; /* masked out (response_format): not an alternative */
    if (!json_object_get(d, key)) json_object_set_new(d, key, json_real(logp[j]));
  }
  return d;
}

static json_t *piece_text(const struct completion_piece *p) {
  return p && p->text ? dapo_json_text(p->text) : json_string("");
}

/* The choices and usage of a finished generation. */
static json_t *choices_json(const char *model, int logprobs, const struct completion_result *res) {
  const struct lm_samples *go = &res->samples;
  json_t *choices = json_array();
  for (int i = 0; choices && i < go->n; i++) {
    const int *toks = go->tokens + (size_t)i * go->max_new;
    const float *lp = go->logp + (size_t)i * go->max_new;
    json_t *c = json_pack("{s:i, s:o, s:s}", "index", i, "text", dapo_json_text(res->text[i]),
                          "finish_reason", go->finish[i] == FINISH_STOP ? "stop" : "length");
    if (c && logprobs) {
      json_t *tokens = json_array(), *ids = json_array(), *lps = json_array();
      json_t *tops = go->top_k ? json_array() : NULL;
      for (int t = 0; t < go->len[i]; t++) {
        size_t at = (size_t)i * go->max_new + t, aj = at * (size_t)go->top_k;
        json_array_append_new(tokens, piece_text(&res->pieces[at]));
        json_array_append_new(ids, json_integer(toks[t]));
        json_array_append_new(lps, json_real(lp[t]));
        if (tops)
          json_array_append_new(tops, top_dict(go->top_k, go->top_logp + aj, res->top_pieces + aj));
      }
      json_t *pids = json_array();
      for (int t = 0; t < res->n_prompt; t++)
        json_array_append_new(pids, json_integer(res->prompt_ids[t]));
      json_object_set_new(c, "logprobs",
                          json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_ids", ids,
                                    "token_logprobs", lps, "prompt_token_ids", pids));
      if (tops) json_object_set_new(json_object_get(c, "logprobs"), "top_logprobs", tops);
    } else if (c) {
      json_object_set_new(c, "logprobs", json_null());
    }
    if (!c || json_array_append_new(choices, c)) {
      json_decref(choices);
      return NULL;
    }
  }
  return json_pack("{s:s, s:s, s:o, s:o}", "object", "text_completion", "model", model, "choices",
                   choices, "usage", api_completion_usage(res));
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
  int logprobs, n;
  api_completion_render render; /* NULL: the text_completion object */
  void *arg;                    /* render's (owned through arg_free) */
  void (*arg_free)(void *arg);
  const struct api_completion_stream *stream; /* NULL: answered whole */
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

/* ---- the streamed reply ---- */

struct cstream {
  struct api_hub *hub;
  struct MHD_Connection *conn;
  struct completion *t; /* owned (taken from the request's wait) */
  const struct api_completion_stream *fmt;
  void *arg; /* fmt's (owned through arg_free) */
  void (*arg_free)(void *arg);
  int n, n_over;
  unsigned char *over; /* [n]: the choice's last token was sent */
  int k, i;            /* the next token to send: round k, choice i */
  int opened, ended;
  int64_t deadline_ms;
  struct api_outbuf out; /* framed bytes not yet handed to libmicrohttpd */
};

static void cstream_free(void *cls) {
  struct cstream *s = cls;
  if (!s) return;
  completion_release(s->t);
  if (s->arg_free) s->arg_free(s->arg);
  free(s->over);
  api_outbuf_deinit(&s->out);
  free(s);
}

/* Frames each chunk of frames (stolen) as `data: {json}`. */
static int cstream_frames(struct cstream *s, json_t *frames) {
  size_t i;
  json_t *f;
  int rc = frames ? 0 : -1;
  json_array_foreach(frames, i, f) {
    char *d = json_dumps(f, JSON_COMPACT);
    rc |= !d || api_outbuf_add(&s->out, "data: ", 6) || api_outbuf_add(&s->out, d, strlen(d)) ||
          api_outbuf_add(&s->out, "\n\n", 2);
    free(d);
  }
  json_decref(frames);
  return rc ? -1 : 0;
}

/* The tokens out since the last call, round by round, choice by choice: 0, or -1. */
static int cstream_tokens(struct cstream *s, json_t *frames) {
  while (s->n_over < s->n) {
    for (; s->i < s->n; s->i++) {
      if (s->over[s->i]) continue;
      struct completion_token tk;
      int rc = completion_token(s->t, s->i, s->k, &tk);
      if (rc == 0) return 0; /* not out yet */
      if (rc < 0 && rc != -1) return -1;
      if (rc == 1 && s->fmt->token(s->arg, s->i, s->k, &tk, s->t, frames)) rc = -2;
      free(tk.text);
      if (rc == -2) return -1;
      if (rc == -1 || tk.finish >= 0) s->over[s->i] = 1, s->n_over++;
    }
    s->i = 0;
    s->k++;
  }
  return 0;
}

static void cstream_error(struct cstream *s, const char *msg) {
  json_t *f = json_pack("[{s:{s:s, s:s, s:n, s:n}}]", "error", "message", msg, "type",
                        "server_error", "param", "code");
  cstream_frames(s, f);
  s->ended = 1;
}

static ssize_t cstream_read(void *cls, uint64_t pos, char *out, size_t max) {
  struct cstream *s = cls;
  (void)pos;
  for (;;) {
    size_t taken = api_outbuf_take(&s->out, out, max);
    if (taken) return (ssize_t)taken;
    if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    if (api_hub_closing(s->hub)) {
      cstream_error(s, "the daemon is stopping");
      continue;
    }
    /* the version first: whatever comes after what is read below is published above it */
    int64_t v = completion_version(s->t);
    const struct completion_result *res = NULL;
    enum completion_state st = completion_poll(s->t, &res);
    json_t *frames = json_array();
    int rc = frames ? 0 : -1;
    if (!rc && !s->opened) {
      s->opened = 1;
      rc = s->fmt->open ? s->fmt->open(s->arg, s->n, frames) : 0;
    }
    if (!rc) rc = cstream_tokens(s, frames);
    int end = !rc && st == COMPLETION_DONE && res->outcome == COMPLETION_OK;
    if (end) rc = s->fmt->close ? s->fmt->close(s->arg, res, frames) : 0;
    if (rc || cstream_frames(s, frames)) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (end) {
      if (api_outbuf_add(&s->out, "data: [DONE]\n\n", 14)) return MHD_CONTENT_READER_END_WITH_ERROR;
      s->ended = 1;
      continue;
    }
    if (st == COMPLETION_DONE) {
      char msg[600];
      snprintf(msg, sizeof msg, "sampling failed: %s", res->message);
      cstream_error(s, msg);
      continue;
    }
    if (api_outbuf_pending(&s->out)) continue;
    if (api_now_ms() >= s->deadline_ms) {
      char msg[96];
      snprintf(msg, sizeof msg, "the completion did not finish within %d s", RUN_WAIT_MAX_S);
      cstream_error(s, msg);
      continue;
    }
    rc = api_hub_suspend(s->hub, s->conn, completion_key(s->t), v, s->deadline_ms);
    if (rc == 0) return 0; /* called again after the resume */
    if (rc < 0) cstream_error(s, "the daemon is stopping");
  }
}

/* Replies with the stream of w's completion (running, or done): it takes the completion and the
 * formatter's argument from w. */
static int reply_stream(struct api_req *r, struct wait *w) {
  struct cstream *s = calloc(1, sizeof *s);
  if (!s || !(s->over = calloc((size_t)w->n, 1))) {
    free(s);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  s->hub = r->hub;
  s->conn = r->conn;
  s->fmt = w->stream;
  s->t = w->t, w->t = NULL;
  s->arg = w->arg, w->arg = NULL;
  s->arg_free = w->arg_free, w->arg_free = NULL;
  s->n = w->n;
  s->deadline_ms = api_now_ms() + (int64_t)RUN_WAIT_MAX_S * 1000;
  api_outbuf_init(&s->out, CSTREAM_BUF_MAX);
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, cstream_read, s, cstream_free);
  if (!resp) {
    cstream_free(s);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  return api_reply_response(r, 200, resp);
}

/* Answers when the completion is done, or suspends the request until it is (or its deadline). */
static int await(struct api_req *r, struct wait *w) {
  for (int round = 0; round < 8; round++) {
    const struct completion_result *res = NULL;
    enum completion_state st = completion_poll(w->t, &res);
    if (w->stream &&
        (st == COMPLETION_RUNNING || (st == COMPLETION_DONE && res->outcome == COMPLETION_OK)))
      return reply_stream(r, w);
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

/* The streamed text_completion: one chunk per token, {object, model, choices: [{index, text,
 * logprobs, finish_reason}]} (the first of a choice's logprobs with prompt_token_ids), then the
 * usage chunk with stream_options.include_usage. */
struct native_stream {
  char *model;
  int logprobs, include_usage;
};

static void native_stream_free(void *p) {
  struct native_stream *ns = p;
  if (ns) free(ns->model);
  free(ns);
}

static int native_token(void *arg, int i, int k, const struct completion_token *tk,
                        struct completion *t, json_t *frames) {
  const struct native_stream *ns = arg;
  json_t *lp = json_null();
  if (ns->logprobs) {
    lp = json_pack("{s:[o], s:[i], s:[f]}", "tokens", piece_text(tk->piece), "token_ids", tk->id,
                   "token_logprobs", (double)tk->logp);
    if (lp && tk->n_top)
      json_object_set_new(lp, "top_logprobs",
                          json_pack("[o]", top_dict(tk->n_top, tk->top_logp, tk->top)));
    if (lp && k == 0) {
      int np = 0;
      const int *ids = completion_prompt_ids(t, &np);
      json_t *pids = json_array();
      for (int p = 0; p < np; p++) json_array_append_new(pids, json_integer(ids[p]));
      json_object_set_new(lp, "prompt_token_ids", pids);
    }
  }
  json_t *text = dapo_json_text(tk->text);
  json_t *c =
      json_pack("{s:s, s:s, s:[{s:i, s:o, s:o, s:o}]}", "object", "text_completion", "model",
                ns->model, "choices", "index", i, "text", text, "logprobs", lp, "finish_reason",
                tk->finish < 0              ? json_null()
                : tk->finish == FINISH_STOP ? json_string("stop")
                                            : json_string("length"));
  if (c && ns->include_usage) json_object_set_new(c, "usage", json_null());
  return c ? json_array_append_new(frames, c) : -1;
}

static int native_close(void *arg, const struct completion_result *res, json_t *frames) {
  const struct native_stream *ns = arg;
  if (!ns->include_usage) return 0;
  json_t *c = json_pack("{s:s, s:s, s:[], s:o}", "object", "text_completion", "model", ns->model,
                        "choices", "usage", api_completion_usage(res));
  return c ? json_array_append_new(frames, c) : -1;
}

static const struct api_completion_stream NATIVE_STREAM = {NULL, native_token, native_close};

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
                               .top_logprobs = q.top_logprobs,
                               .temperature = (float)q.temperature,
                               .top_p = (float)q.top_p,
                               .seed = q.seed,
                               .stop = q.stop,
                               .n_stop = q.n_stop,
                               .stream = q.stream,
                               .response_format = q.response_format};
  struct native_stream *ns = NULL;
  if (q.stream && (!(ns = calloc(1, sizeof *ns)) || !(ns->model = strdup(q.model)))) {
    native_stream_free(ns);
    free(spec);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  if (ns) ns->logprobs = q.logprobs, ns->include_usage = q.include_usage;
  int rc = api_completion_submit(r, &req, NULL, ns, native_stream_free, ns ? &NATIVE_STREAM : NULL);
  free(spec);
  return rc;
}

int api_response_format(const json_t *body, const json_t **out, char *field, size_t field_cap,
                        char *msg, size_t msg_cap) {
  const json_t *rf = json_object_get(body, "response_format");
  const char *type = json_string_value(json_object_get(rf, "type"));
  *out = NULL;
  if (!rf || json_is_null(rf) || (json_is_object(rf) && type && !strcmp(type, "text"))) return 0;
  struct dapo_err e = {0};
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  if (g) {
    jgrammar_free(g);
    *out = rf;
    return 0;
  }
  /* e.msg is "member.path: why" */
  const char *colon = strstr(e.msg, ": ");
  size_t fl = colon ? (size_t)(colon - e.msg) : strlen("response_format");
  snprintf(field, field_cap, "%.*s", (int)fl, colon ? e.msg : "response_format");
  snprintf(msg, msg_cap, "%s", colon ? colon + 2 : e.msg);
  return 1;
}

int api_completion_submit(struct api_req *r, const struct completion_req *req,
                          api_completion_render render, void *arg, void (*arg_free)(void *),
                          const struct api_completion_stream *stream) {
  struct wait *w = calloc(1, sizeof *w);
  struct dapo_err e = {0};
  int rc = w && (w->model = strdup(req->model))
               ? completions_submit(r->srv->completions, req, &w->t, &e)
               : DAPO_ENOMEM;
  if (w)
    w->render = render, w->arg = arg, w->arg_free = arg_free, w->stream = stream, w->n = req->n;
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
