/* Handler: POST /v1/judges/test — runs a judge spec (API.md "Judges") on sample items and
 * returns each item's reward, the latency and any error, before a job is launched with it.
 * Body: {"judge": {...}, "items": [{"response", "answer", "prompt"?, "id"?, "group"?,
 * "metadata"?, "response_tokens"?, "truncated"?}]} with 1..JUDGE_TEST_MAX_ITEMS items. An http
 * judge is called from the HTTP thread, bounded by the spec's own timeout_ms and retries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "handlers.h"
#include "http.h"
#include "judge.h"
#include "server.h"
#include "workers.h"

#define JUDGE_TEST_MAX_ITEMS 256

/* judge_new's message "judge.url: host ... " -> field "judge.url", message the rest. */
static void add_judge_err(json_t *errors, const char *msg) {
  const char *colon = strstr(msg, ": ");
  if (!strncmp(msg, "judge", 5) && colon && colon - msg < 64 && !memchr(msg, ' ', colon - msg)) {
    char field[64];
    snprintf(field, sizeof field, "%.*s", (int)(colon - msg), msg);
    dapo_errors_add(errors, field, colon + 2);
  } else {
    dapo_errors_add(errors, "judge", msg);
  }
}

/* Checks items and fills it[0..n); messages go to errors. */
static void read_items(const json_t *arr, struct judge_item *it, json_t *errors) {
  size_t i;
  json_t *x;
  char f[64];
  json_array_foreach(arr, i, x) {
    struct judge_item *t = &it[i];
    if (!json_is_object(x)) {
      snprintf(f, sizeof f, "items[%zu]", i);
      dapo_errors_add(errors, f, "must be an object");
      continue;
    }
    const char *key;
    json_t *v;
    json_object_foreach(x, key, v) {
      snprintf(f, sizeof f, "items[%zu].%.32s", i, key);
      if (!strcmp(key, "response") || !strcmp(key, "answer") || !strcmp(key, "prompt") ||
          !strcmp(key, "id")) {
        if (!json_is_string(v)) {
          dapo_errors_add(errors, f, "must be a string");
          continue;
        }
        const char *s = json_string_value(v);
        if (key[0] == 'r') t->response = s;
        if (key[0] == 'a') t->answer = s;
        if (key[0] == 'p') t->prompt = s;
        if (key[0] == 'i') t->id = s;
      } else if (!strcmp(key, "group") || !strcmp(key, "response_tokens")) {
        json_int_t n = json_integer_value(v);
        if (!json_is_integer(v) || n < 0 || n > 1000000) {
          dapo_errors_add(errors, f, "must be an integer in [0, 1000000]");
          continue;
        }
        if (key[0] == 'g')
          t->group = (int)n;
        else
          t->response_tokens = (int)n;
      } else if (!strcmp(key, "metadata")) {
        if (!json_is_object(v) && !json_is_null(v))
          dapo_errors_add(errors, f, "must be an object");
        else
          t->metadata = json_is_object(v) ? v : NULL;
      } else if (!strcmp(key, "truncated")) {
        if (!json_is_boolean(v))
          dapo_errors_add(errors, f, "must be a boolean");
        else
          t->truncated = json_is_true(v);
      } else {
        dapo_errors_add(errors, f, "unknown field");
      }
    }
    snprintf(f, sizeof f, "items[%zu].response", i);
    if (!t->response && !json_object_get(x, "response")) dapo_errors_add(errors, f, "required");
    snprintf(f, sizeof f, "items[%zu].answer", i);
    if (!t->answer && !json_object_get(x, "answer")) dapo_errors_add(errors, f, "required");
  }
}

int api_judges_test(struct api_req *r) {
  const json_t *b = r->json;
  if (!json_is_object(b))
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, "the body must be a JSON object",
                           json_pack("[{s:s, s:s}]", "field", "(body)", "message",
                                     "expected {\"judge\": {...}, \"items\": [...]}"));
  json_t *errors = json_array();
  if (!errors) return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)b, key, v) {
    if (strcmp(key, "judge") && strcmp(key, "items")) {
      char f[80];
      snprintf(f, sizeof f, "%.64s", key);
      dapo_errors_add(errors, f, "unknown field (expected judge, items)");
    }
  }
  const json_t *spec = json_object_get(b, "judge"), *items = json_object_get(b, "items");
  size_t n = json_array_size(items);
  if (!json_is_object(spec))
    dapo_errors_add(errors, "judge", "required: an object with a \"type\"");
  if (!json_is_array(items) || n < 1 || n > JUDGE_TEST_MAX_ITEMS) {
    char m[96];
    snprintf(m, sizeof m, "required: an array of 1..%d items", JUDGE_TEST_MAX_ITEMS);
    dapo_errors_add(errors, "items", m);
    n = 0;
  }
  struct judge_item *it = n ? calloc(n, sizeof *it) : NULL;
  struct judge_result *res = n ? calloc(n, sizeof *res) : NULL;
  if (n && (!it || !res)) {
    free(it), free(res), json_decref(errors);
    return api_reply_error(r, API_ERR_UNAVAILABLE, "out of memory", NULL);
  }
  for (size_t i = 0; i < n; i++) it[i].group = (int)i;
  if (n) read_items(items, it, errors);
  struct judge *j = NULL;
  if (json_is_object(spec)) {
    struct judge_policy pol;
    server_judge_policy(r->srv, &pol);
    struct dapo_err e = {0};
    if (!(j = judge_new(spec, &pol, &e))) add_judge_err(errors, e.msg);
  }
  if (json_array_size(errors)) {
    judge_free(j);
    free(it), free(res);
    char detail[64];
    snprintf(detail, sizeof detail, "%zu problem%s in the request", json_array_size(errors),
             json_array_size(errors) > 1 ? "s" : "");
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, detail, errors);
  }
  json_decref(errors);
  struct judge_stats st = {0};
  struct dapo_err e = {0};
  int rc = judge_run(j, NULL, 0, it, (int)n, res, &st, NULL, &e);
  if (rc == DAPO_EINVAL) { /* the items themselves (duplicate ids) */
    judge_results_release(res, (int)n);
    judge_free(j);
    free(it), free(res);
    return api_reply_error(r, API_ERR_VALIDATION_FAILED, e.msg,
                           json_pack("[{s:s, s:s}]", "field", "items", "message", e.msg));
  }
  json_t *out = json_array();
  for (size_t i = 0; out && i < n; i++) {
    json_t *o = json_object();
    char idx[24];
    snprintf(idx, sizeof idx, "%zu", i);
    json_object_set_new(o, "id", json_string(it[i].id ? it[i].id : idx));
    if (res[i].err == JE_NONE) {
      json_object_set_new(o, "reward", json_real(res[i].reward));
      json_object_set_new(o, "correct",
                          res[i].correct < 0 ? json_null() : json_boolean(res[i].correct));
      json_object_set_new(o, "mask", json_boolean(res[i].mask));
      json_object_set(o, "info", res[i].info ? res[i].info : json_null());
      json_object_set_new(o, "error", json_null());
    } else {
      json_object_set_new(o, "reward", json_null());
      json_object_set_new(o, "error", json_string(judge_err_name(res[i].err)));
    }
    json_array_append_new(out, o);
  }
  json_t *reply =
      json_pack("{s:s, s:s, s:o*, s:f, s:{s:i, s:i, s:i, s:i, s:i, s:i}}", "object", "judge.test",
                "type", judge_type(j), "results", out, "latency_ms", st.seconds * 1e3, "stats",
                "requests", st.n_requests, "retries", st.n_retries, "judge_timeout", st.n_timeout,
                "judge_http_error", st.n_http_error, "judge_parse_error", st.n_parse_error,
                "reward_out_of_range", st.n_out_of_range);
  if (reply) json_object_set_new(reply, "error", rc ? dapo_json_text(e.msg) : json_null());
  judge_results_release(res, (int)n);
  judge_free(j);
  free(it), free(res);
  return api_reply_json_steal(r, 200, reply);
}
