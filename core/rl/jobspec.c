/* Job specs (jobspec.h): the body of POST /v1/jobs (or a job file of `dapod train`) parsed and
 * validated into struct job_spec, every problem named by its field; and back to JSON. */
#include "jobspec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "jsongrammar.h"

static char *dup_str(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* A message that names its field ("judge.url: ...", "chat_template.user: ...", as judge_new and
 * chat_from_spec write them) split into {field, message}; otherwise field `base`. */
static void spec_err_named(json_t *errors, const char *base, const char *text) {
  const char *colon = strstr(text, ": ");
  char field[96];
  snprintf(field, sizeof field, "%s", base);
  size_t n = strlen(base);
  if (colon && !strncmp(text, base, n) && (text[n] == '.' || text + n == colon) &&
      colon - text < (long)sizeof field) {
    memcpy(field, text, (size_t)(colon - text));
    field[colon - text] = '\0';
    text = colon + 2;
  }
  dapo_errors_add(errors, field, text);
}

/* The body's response_format: compiled once here, as the completion routes do (errors named
 * under "response_format"), so that a job the runner cannot constrain is refused when it is
 * submitted; a DAPO job's single-turn sampling only. A grader judge without a response_format
 * of its own parses {{sample.output_json}} by this one (s->judge gets a copy holding it); one
 * with its own must give the same. */
static void response_format_parse(const json_t *body, int method, struct job_spec *s,
                                  json_t *errors) {
  const json_t *rf = json_object_get(body, "response_format");
  if (!rf || json_is_null(rf)) return;
  const char *type = json_string_value(json_object_get(rf, "type"));
  if (json_is_object(rf) && type && !strcmp(type, "text")) return;
  if (method != METHOD_DAPO) {
    dapo_errors_add(errors, "response_format",
                    "only a DAPO job's sampling can be constrained (a supervised or DPO job "
                    "samples nothing)");
    return;
  }
  if (s->episode.on && episode_multi(&s->episode)) {
    dapo_errors_add(errors, "response_format",
                    "not supported with multi-turn episodes yet (dapod): the model's turns "
                    "around tool calls are not one JSON value");
    return;
  }
  struct dapo_err e = {0};
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  if (!g) {
    spec_err_named(errors, "response_format", e.msg);
    return;
  }
  jgrammar_free(g);
  s->response_format = json_incref((json_t *)rf);
  const char *jt = json_string_value(json_object_get(s->judge, "type"));
  if (!jt || strcmp(jt, "grader")) return;
  const json_t *own = json_object_get(s->judge, "response_format");
  if (own && !json_is_null(own)) {
    if (!json_equal((json_t *)own, (json_t *)rf))
      dapo_errors_add(errors, "judge.response_format",
                      "differs from the job's response_format (which constrains the sampling "
                      "and is the judge's too): give it once, at the top level");
    return;
  }
  json_t *j = json_deep_copy(s->judge);
  if (!j || json_object_set(j, "response_format", (json_t *)rf)) {
    json_decref(j);
    dapo_errors_add(errors, "", "out of memory");
    return;
  }
  json_decref(s->judge);
  s->judge = j;
}

int jobspec_parse(const json_t *body, const struct judge_policy *pol, struct job_spec *s,
                  json_t *errors) {
  size_t before = json_array_size(errors);
  memset(s, 0, sizeof *s);
  if (!json_is_object(body)) {
    dapo_errors_add(errors, "", "the job body must be a JSON object");
    return 1;
  }
  static const char *const known[] = {
      "model",           "training_file", "validation_file",  "judge",
      "hyperparameters", "seed",          "metadata",         "suffix",
      "job_id",          "chat_template", "checkpoint_dtype", "adapter",
      "resources",       "episode",       "method",           "response_format"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)body, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok) dapo_errors_add(errors, key, "unknown field");
  }
  const char *model = json_string_value(json_object_get(body, "model"));
  if (!model || !*model)
    dapo_errors_add(errors, "model", "required: a preset name or a model folder");
  const char *tf = json_string_value(json_object_get(body, "training_file"));
  if (!tf || !*tf) dapo_errors_add(errors, "training_file", "required: the training dataset");
  json_t *vf = json_object_get(body, "validation_file");
  if (vf && !json_is_null(vf) && !json_is_string(vf))
    dapo_errors_add(errors, "validation_file", "expected a string or null");
  s->model = dup_str(model);
  s->training_file = dup_str(tf);
  s->validation_file = dup_str(json_string_value(vf));
  const char *jid = json_string_value(json_object_get(body, "job_id"));
  s->job_id = dup_str(jid ? jid : "job-local");

  json_t *seed = json_object_get(body, "seed");
  if (!seed || json_is_null(seed))
    s->seed = 0;
  else if (!json_is_integer(seed) || json_integer_value(seed) < 0)
    dapo_errors_add(errors, "seed", "expected a non-negative integer");
  else
    s->seed = (uint64_t)json_integer_value(seed);

  json_t *md = json_object_get(body, "metadata");
  if (md && !json_is_null(md)) {
    if (!json_is_object(md))
      dapo_errors_add(errors, "metadata", "expected an object of strings");
    else {
      json_object_foreach(md, key, v) if (!json_is_string(v)) {
        char f[160];
        snprintf(f, sizeof f, "metadata.%.100s", key);
        dapo_errors_add(errors, f, "expected a string");
      }
    }
  }
  json_t *suffix = json_object_get(body, "suffix");
  if (suffix && !json_is_null(suffix) &&
      (!json_is_string(suffix) || strlen(json_string_value(suffix)) > 64))
    dapo_errors_add(errors, "suffix", "expected a string of at most 64 characters");

  json_t *judge = json_object_get(body, "judge");
  if (!judge || json_is_null(judge)) {
    s->judge = json_pack("{s:s}", "type", "exact");
  } else {
    s->judge = json_incref(judge);
    struct dapo_err e = {0};
    struct judge *j = judge_new(judge, pol, &e);
    if (!j) spec_err_named(errors, "judge", e.msg);
    judge_free(j);
  }
  json_t *ct = json_object_get(body, "chat_template");
  if (ct && !json_is_null(ct)) {
    s->chat_template = json_incref(ct);
    /* everything but "auto" can be checked without the model */
    if (!json_is_string(ct) || strcmp(json_string_value(ct), "auto")) {
      struct dapo_err e = {0};
      struct chat_template *c = chat_from_spec(ct, NULL, &e);
      if (!c) spec_err_named(errors, "chat_template", e.msg);
      chat_free(c);
    }
  }
  json_t *cd = json_object_get(body, "checkpoint_dtype");
  if (cd && !json_is_null(cd)) {
    const char *name = json_string_value(cd);
    int found = 0;
    for (int d = CKPT_DTYPE_AUTO; d <= CKPT_DTYPE_BFLOAT16 && name && !found; d++)
      if (!strcmp(name, jobspec_dtype_name((enum ckpt_dtype)d))) {
        s->checkpoint_dtype = (enum ckpt_dtype)d;
        found = 1;
      }
    if (found)
      s->checkpoint_dtype_given = 1;
    else
      dapo_errors_add(errors, "checkpoint_dtype",
                      "expected \"auto\" (the source's dtype), \"float32\" or \"bfloat16\"");
  }
  json_t *ad = json_object_get(body, "adapter");
  if (ad && !json_is_null(ad)) {
    s->has_adapter = 1;
    lora_config_parse(&s->adapter, ad, errors); /* checked against the model by runner_check */
  }
  s->processes = 1;
  json_t *res = json_object_get(body, "resources");
  if (res && !json_is_null(res)) {
    if (!json_is_object(res))
      dapo_errors_add(errors, "resources", "expected an object such as {\"processes\": 2}");
    else
      json_object_foreach(res, key, v) {
        if (strcmp(key, "processes")) {
          char f[160];
          snprintf(f, sizeof f, "resources.%.100s", key);
          dapo_errors_add(errors, f, "unknown field");
        } else if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                   json_integer_value(v) > JOBSPEC_PROCESSES_MAX)
          dapo_errors_add(errors, "resources.processes",
                          "expected an integer from 1 to 4096: the job's processes (MPI ranks)");
        else
          s->processes = (int)json_integer_value(v);
      }
  }
  int method = METHOD_DAPO;
  json_t *mv = json_object_get(body, "method");
  if (mv && !json_is_null(mv)) {
    const char *m = json_string_value(mv);
    if (m && !strcmp(m, "supervised"))
      method = METHOD_SUPERVISED;
    else if (m && !strcmp(m, "dpo"))
      method = METHOD_DPO;
    else if (!m || strcmp(m, "dapo"))
      dapo_errors_add(errors, "method",
                      "expected \"dapo\" (the default), \"supervised\" or \"dpo\"");
  }
  s->method_given = mv && !json_is_null(mv);
  hparams_parse_method(&s->hp, json_object_get(body, "hyperparameters"), method, errors);
  if (method != METHOD_DAPO) {
    /* a supervised or DPO job learns from the file's completions or preferences: no judge
     * scores it, no episode runs */
    char msg[160];
    const char *name = hparams_method_name(method);
    if (judge && !json_is_null(judge)) {
      snprintf(msg, sizeof msg,
               "a %s job has no judge (it trains on the file's %s); leave `judge` out", name,
               method == METHOD_DPO ? "preference pairs" : "completions");
      dapo_errors_add(errors, "judge", msg);
    }
    json_t *ep = json_object_get(body, "episode");
    if (ep && !json_is_null(ep)) {
      snprintf(msg, sizeof msg, "a %s job runs no episodes; leave `episode` out", name);
      dapo_errors_add(errors, "episode", msg);
    }
  } else {
    episode_parse(json_object_get(body, "episode"), &s->hp, pol, &s->episode, errors);
  }

  response_format_parse(body, method, s, errors);

  if (!s->model || !s->training_file || !s->job_id || !s->judge) {
    if ((model && !s->model) || (tf && !s->training_file) || !s->job_id || !s->judge)
      dapo_errors_add(errors, "", "out of memory");
  }
  return (int)(json_array_size(errors) - before);
}

const char *jobspec_dtype_name(enum ckpt_dtype d) {
  return d == CKPT_DTYPE_FLOAT32 ? "float32" : d == CKPT_DTYPE_BFLOAT16 ? "bfloat16" : "auto";
}

json_t *jobspec_to_json(const struct job_spec *s) {
  /* chat_template, checkpoint_dtype, adapter and episode only when given, so that specs (and the
   * checkpoints that record them) of jobs without them stay as they were; `method` likewise,
   * for supervised and DPO jobs always (their judge is not theirs: left out) */
  if (s->hp.method != METHOD_DAPO)
    return json_pack("{s:s,s:s?,s:s?,s:s?,s:o,s:I,s:O*,s:s*,s:o*}", "method",
                     hparams_method_name(s->hp.method), "model", s->model, "training_file",
                     s->training_file, "validation_file", s->validation_file, "hyperparameters",
                     hparams_to_json(&s->hp), "seed", (json_int_t)s->seed, "chat_template",
                     s->chat_template, "checkpoint_dtype",
                     s->checkpoint_dtype_given ? jobspec_dtype_name(s->checkpoint_dtype) : NULL,
                     "adapter", s->has_adapter ? lora_config_to_json(&s->adapter) : NULL);
  json_t *o =
      json_pack("{s:s?,s:s?,s:s?,s:O?,s:o,s:I,s:O*,s:s*,s:o*,s:o*,s:O*}", "model", s->model,
                "training_file", s->training_file, "validation_file", s->validation_file, "judge",
                s->judge, "hyperparameters", hparams_to_json(&s->hp), "seed", (json_int_t)s->seed,
                "chat_template", s->chat_template, "checkpoint_dtype",
                s->checkpoint_dtype_given ? jobspec_dtype_name(s->checkpoint_dtype) : NULL,
                "adapter", s->has_adapter ? lora_config_to_json(&s->adapter) : NULL, "episode",
                episode_to_json(&s->episode), "response_format", s->response_format);
  if (o && s->method_given) json_object_set_new(o, "method", json_string("dapo"));
  return o;
}

void jobspec_deinit(struct job_spec *s) {
  free(s->model);
  free(s->training_file);
  free(s->validation_file);
  free(s->job_id);
  json_decref(s->judge);
  json_decref(s->chat_template);
  json_decref(s->response_format);
  episode_deinit(&s->episode);
  memset(s, 0, sizeof *s);
}
