/* Judge models dapod serves itself: a grader's chat completion request answered in-process by the
 * completion service (judge_serve.h). */
#include "judge_serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bus.h"
#include "chat.h"
#include "completions.h"
#include "jsongrammar.h"
#include "registry.h"
#include "server.h"

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* OpenAI's error body with *status = code. */
static json_t *failure(int *status, int code, const char *type, const char *msg) {
  *status = code;
  return json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type", type, "param",
                   "code");
}

/* The messages as chat_render takes them: role (developer as system) and content text (a string,
 * or text parts joined). NULL when one is neither (bad names it). */
static json_t *flat_messages(const json_t *msgs, char *bad, size_t cap) {
  json_t *out = json_array();
  size_t i;
  const json_t *m;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *c = json_object_get(m, "content");
    json_t *text = NULL;
    if (json_is_string(c)) {
      text = json_incref((json_t *)c);
    } else if (json_is_array(c)) {
      char *acc = strdup("");
      size_t k;
      const json_t *part;
      json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        char *n = acc && t ? realloc(acc, strlen(acc) + strlen(t) + 1) : NULL;
        if (n) acc = strcat(n, t);
      }
      text = acc ? json_string(acc) : NULL;
      free(acc);
    }
    if (!role || !text || !out) {
      snprintf(bad, cap, "messages[%zu]", i);
      json_decref(text);
      json_decref(out);
      return NULL;
    }
    if (!strcmp(role, "developer")) role = "system";
    json_array_append_new(out, json_pack("{s:s, s:o}", "role", role, "content", text));
  }
  return out;
}

/* A number member of body in [lo, hi], else def. */
static double number(const json_t *body, const char *key, double lo, double hi, double def) {
  const json_t *v = json_object_get(body, key);
  double x = json_is_number(v) ? json_number_value(v) : def;
  return x < lo ? lo : x > hi ? hi : x;
}

int judge_serve_check(void *ctx, const char *serve, char *why, size_t cap) {
  const struct server *srv = ctx;
  struct registry_entry ent;
  int rc = registry_find(srv, serve, NULL, &ent);
  if (rc > 0) {
    snprintf(why, cap,
             "no such model: '%.128s' is neither a preset, a folder of the models directory nor a "
             "checkpoint",
             serve);
    return 1;
  }
  if (rc < 0) {
    snprintf(why, cap, "out of memory");
    return 1;
  }
  if (!ent.ready) {
    snprintf(why, cap, "model '%.128s' is not usable: %.300s", serve, ent.error);
    return 1;
  }
  return 0;
}

/* The reply of a finished completion: chat.completion's shape, or its failure's. */
static json_t *reply_of(const char *serve, const struct completion_result *res, int *status) {
  switch (res->outcome) {
  case COMPLETION_OK: break;
  case COMPLETION_INVALID:
  case COMPLETION_TOO_LARGE: {
    const json_t *er = json_array_get(res->errors, 0);
    char msg[600];
    snprintf(msg, sizeof msg, "%s: %s", json_string_value(json_object_get(er, "field")),
             json_string_value(json_object_get(er, "message")));
    return failure(status, 400, "invalid_request_error", msg);
  }
  case COMPLETION_STOPPING: return failure(status, 503, "server_error", "the daemon is stopping");
  default: return failure(status, 500, "server_error", res->message);
  }
  const struct lm_samples *go = &res->samples;
  json_t *content = json_string(res->text[0]);
  if (!content) content = json_string("\xEF\xBF\xBD"); /* not UTF-8: no JSON either */
  *status = 200;
  return json_pack("{s:s, s:s, s:s, s:[{s:i, s:{s:s, s:o, s:n}, s:s}], s:{s:i, s:i, s:i}}", "id",
                   "chatcmpl-judge", "object", "chat.completion", "model", serve, "choices",
                   "index", 0, "message", "role", "assistant", "content", content, "refusal",
                   "finish_reason", go->finish[0] == FINISH_LENGTH ? "length" : "stop", "usage",
                   "prompt_tokens", res->n_prompt, "completion_tokens", go->len[0], "total_tokens",
                   res->n_prompt + go->len[0]);
}

json_t *judge_serve_chat(void *ctx, const char *serve, const json_t *body, int timeout_ms,
                         int *status, char *why, size_t cap) {
  struct server *srv = ctx;
  char msg[600] = "", bad[64] = "";
  char *spec = NULL, *prompt = NULL;
  struct registry_entry ent;
  *status = 0;
  int rr = registry_resolve(srv, serve, NULL, &spec, &ent, msg, sizeof msg);
  if (rr < 0) return snprintf(why, cap, "out of memory"), NULL;
  if (rr) return failure(status, 404, "invalid_request_error", msg);
  json_t *flat = flat_messages(json_object_get(body, "messages"), bad, sizeof bad);
  struct chat_template *t =
      flat ? registry_chat_template(srv, ent.kind == REGISTRY_CHECKPOINT ? ent.job_id : NULL, spec,
                                    NULL, msg, sizeof msg)
           : NULL;
  struct dapo_err e = {0};
  json_t *out = NULL;
  if (!flat) {
    snprintf(msg, sizeof msg, "%s: expected {\"role\", \"content\": text}", bad);
    out = failure(status, 400, "invalid_request_error", msg);
  } else if (!t) {
    out = failure(status, 400, "invalid_request_error", msg);
  } else if (chat_render(t, flat, &prompt, &e)) {
    out = failure(status, 400, "invalid_request_error", e.msg);
  }
  /* the response_format as the chat route takes it: compiled once to check it */
  const json_t *rf = json_object_get(body, "response_format");
  const char *rft = json_string_value(json_object_get(rf, "type"));
  if (rf && (json_is_null(rf) || (rft && !strcmp(rft, "text")))) rf = NULL;
  if (!out && rf) {
    struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
    if (!g) out = failure(status, 400, "invalid_request_error", e.msg);
    jgrammar_free(g);
  }
  /* the template's end of turn ends the reply, as on the chat route */
  const char *eot = t ? chat_stop_text(t) : NULL;
  const char *stop[1] = {eot};
  const json_t *seed = json_object_get(body, "seed");
  struct completion_req req = {
      .model = serve,
      .spec = spec,
      .cfg = &ent.cfg,
      .prompt = prompt,
      .prompt_len = prompt ? strlen(prompt) : 0,
      .max_tokens = (int)number(body, "max_completion_tokens", 1, JUDGE_SERVE_MAX_TOKENS,
                                JUDGE_SERVE_MAX_TOKENS),
      .n = 1,
      .temperature = (float)number(body, "temperature", 0, 2, 1),
      .top_p = (float)number(body, "top_p", 0, 1, 1),
      .seed = json_is_integer(seed) ? (uint64_t)json_integer_value(seed) : 0,
      .stop = stop,
      .n_stop = eot && *eot ? 1 : 0,
      .response_format = rf};
  struct completion *c = NULL;
  int rc = out ? 0 : completions_submit(srv->completions, &req, &c, &e);
  if (rc == COMPLETIONS_EFULL)
    out = failure(status, 429, "rate_limit_error", e.msg);
  else if (rc)
    snprintf(why, cap, "%s", rc == DAPO_ENOMEM ? "out of memory" : e.msg);
  /* wait for it on the bus, at most timeout_ms */
  int64_t deadline = now_ms() + timeout_ms, seen = 0;
  const struct completion_result *res = NULL;
  while (c && completion_poll(c, &res) != COMPLETION_DONE) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      completion_cancel(c);
      snprintf(msg, sizeof msg, "no answer within timeout_ms (%d)", timeout_ms);
      out = failure(status, 504, "server_error", msg);
      break;
    }
    if (bus_wait(srv->bus, completion_key(c), seen, left < 200 ? (int)left : 200) < 0) {
      snprintf(why, cap, "the daemon is stopping");
      break;
    }
    seen = bus_last_id(srv->bus, completion_key(c));
  }
  if (c && res && !out && !*why && completion_poll(c, &res) == COMPLETION_DONE)
    out = reply_of(serve, res, status);
  if (c && !out && !*why) snprintf(why, cap, "out of memory");
  completion_release(c);
  chat_free(t);
  json_decref(flat);
  free(prompt);
  free(spec);
  return out;
}
