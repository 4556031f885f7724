/* A DPO job's knobs (issue 27): "method": "dpo" with beta (0, 2], default 0.1, loss_type
 * "sigmoid" alone, label_smoothing [0, 0.5), default 0, and the knobs it shares with supervised
 * jobs (epochs, batch_size, lr_schedule, max_sequence_tokens, truncate); the resolved job shows
 * every value in force and parses to itself; each bad value, a DAPO knob, a judge or an episode
 * refused naming its field; the DPO knobs refused on DAPO and supervised jobs. */
#include <string.h>

#include "check.h"
#include "hparams.h"
#include "jobspec.h"

static int has_err(const json_t *errors, const char *field, const char *part) {
  for (size_t i = 0; i < json_array_size(errors); i++) {
    const json_t *e = json_array_get(errors, i);
    const char *f = json_string_value(json_object_get(e, "field"));
    const char *m = json_string_value(json_object_get(e, "message"));
    if (f && m && !strcmp(f, field) && strstr(m, part)) return 1;
  }
  return 0;
}

/* Parses body (stolen) into s; returns the problem count, errors in *errs (new array). */
static int parse(json_t *body, struct job_spec *s, json_t **errs) {
  *errs = json_array();
  int n = jobspec_parse(body, NULL, s, *errs);
  json_decref(body);
  return n;
}

static void test_defaults(void) {
  struct job_spec s;
  json_t *errs;
  CHECK(parse(json_pack("{s:s,s:s,s:s}", "method", "dpo", "model", "tiny", "training_file", "t"),
              &s, &errs) == 0);
  CHECK(s.hp.method == METHOD_DPO);
  CHECK(s.hp.beta == 0.1 && s.hp.loss_type == DPO_LOSS_SIGMOID && s.hp.label_smoothing == 0);
  CHECK(s.hp.epochs == 1 && s.hp.batch_size == 8 && s.hp.lr_schedule == LR_LINEAR);
  CHECK(s.hp.max_sequence_tokens == 2048 && !s.hp.truncate);
  json_t *js = jobspec_to_json(&s), *hp = json_object_get(js, "hyperparameters");
  CHECK(!strcmp(json_string_value(json_object_get(js, "method")), "dpo"));
  CHECK(!json_object_get(js, "judge") && !json_object_get(js, "episode"));
  CHECK(json_real_value(json_object_get(hp, "beta")) == 0.1);
  CHECK(!strcmp(json_string_value(json_object_get(hp, "loss_type")), "sigmoid"));
  CHECK(json_real_value(json_object_get(hp, "label_smoothing")) == 0);
  CHECK(json_integer_value(json_object_get(hp, "batch_size")) == 8);
  CHECK(json_object_get(hp, "learning_rate") && json_object_get(hp, "truncate"));
  CHECK(!json_object_get(hp, "group_size") && !json_object_get(hp, "total_steps"));
  struct job_spec s2;
  json_t *errs2;
  CHECK(parse(json_incref(js), &s2, &errs2) == 0);
  json_t *js2 = jobspec_to_json(&s2);
  CHECK(json_equal(js, js2));
  json_decref(js2);
  jobspec_deinit(&s2);
  json_decref(errs2);
  json_decref(js);
  jobspec_deinit(&s);
  json_decref(errs);
  /* every DPO knob given; the edges of the ranges that are in them */
  json_t *h = json_pack("{s:f,s:s,s:f,s:i,s:i,s:s,s:i,s:b}", "beta", 2.0, "loss_type", "sigmoid",
                        "label_smoothing", 0.49, "epochs", 2, "batch_size", 3, "lr_schedule",
                        "cosine", "max_sequence_tokens", 64, "truncate", 1);
  CHECK(parse(json_pack("{s:s,s:s,s:s,s:o}", "method", "dpo", "model", "tiny", "training_file", "t",
                        "hyperparameters", h),
              &s, &errs) == 0);
  CHECK(s.hp.beta == 2.0 && s.hp.label_smoothing == 0.49 && s.hp.epochs == 2 &&
        s.hp.batch_size == 3 && s.hp.lr_schedule == LR_COSINE && s.hp.max_sequence_tokens == 64 &&
        s.hp.truncate);
  CHECK(hparams_sft_total_steps(&s.hp, 10) == 8); /* ceil(10 / 3) * 2 pairs' batches */
  jobspec_deinit(&s);
  json_decref(errs);
}

static void test_refusals(void) {
  struct job_spec s;
  json_t *errs;
  json_t *h = json_pack("{s:f,s:s,s:f,s:i,s:i}", "beta", 0.0, "loss_type", "kto", "label_smoothing",
                        0.5, "group_size", 4, "batch_size", 0);
  int n = parse(json_pack("{s:s,s:s,s:s,s:o,s:{s:s},s:{s:i}}", "method", "dpo", "model", "tiny",
                          "training_file", "t", "hyperparameters", h, "judge", "type", "math",
                          "episode", "max_turns", 2),
                &s, &errs);
  CHECK_MSG(n == 7, "%d problems", n);
  CHECK(has_err(errs, "hyperparameters.beta", "0 not in (0, 2]"));
  CHECK(has_err(errs, "hyperparameters.loss_type", "expected one of: sigmoid, hinge, ipo, robust"));
  CHECK(has_err(errs, "hyperparameters.label_smoothing", "0.5 not in [0, 0.5)"));
  CHECK(has_err(errs, "hyperparameters.group_size", "not a hyperparameter of method dpo"));
  CHECK(has_err(errs, "hyperparameters.batch_size", "0 not in [1, 65536]"));
  CHECK(has_err(errs, "judge", "a dpo job has no judge"));
  CHECK(has_err(errs, "episode", "a dpo job runs no episodes"));
  jobspec_deinit(&s);
  json_decref(errs);
  h = json_pack("{s:f,s:f}", "beta", 3.0, "label_smoothing", -0.1);
  CHECK(parse(json_pack("{s:s,s:s,s:s,s:o}", "method", "dpo", "model", "tiny", "training_file", "t",
                        "hyperparameters", h),
              &s, &errs) == 2);
  CHECK(has_err(errs, "hyperparameters.beta", "3 not in (0, 2]"));
  CHECK(has_err(errs, "hyperparameters.label_smoothing", "-0.1 not in [0, 0.5)"));
  jobspec_deinit(&s);
  json_decref(errs);
  /* hinge and ipo have no label smoothing; robust and sigmoid have */
  const char *types[] = {"hinge", "ipo", "robust", "sigmoid"};
  for (int k = 0; k < 4; k++) {
    h = json_pack("{s:s,s:f}", "loss_type", types[k], "label_smoothing", 0.2);
    n = parse(json_pack("{s:s,s:s,s:s,s:o}", "method", "dpo", "model", "tiny", "training_file", "t",
                        "hyperparameters", h),
              &s, &errs);
    CHECK_MSG(n == (k < 2), "%s: %d problems", types[k], n);
    CHECK(k >= 2 ||
          has_err(errs, "hyperparameters.label_smoothing", "loss has no label smoothing"));
    CHECK(k < 2 || s.hp.loss_type == (k == 2 ? DPO_LOSS_ROBUST : DPO_LOSS_SIGMOID));
    jobspec_deinit(&s);
    json_decref(errs);
  }
  /* the DPO knobs on the other methods */
  for (int sup = 0; sup < 2; sup++) {
    h = json_pack("{s:f,s:s,s:f}", "beta", 0.5, "loss_type", "sigmoid", "label_smoothing", 0.1);
    json_t *body =
        json_pack("{s:s,s:s,s:o}", "model", "tiny", "training_file", "t", "hyperparameters", h);
    if (sup) json_object_set_new(body, "method", json_string("supervised"));
    n = parse(body, &s, &errs);
    CHECK_MSG(n == 3, "%d problems", n);
    const char *m = sup ? "not a hyperparameter of method supervised (it is one of dpo jobs)"
                        : "not a hyperparameter of method dapo (it is one of dpo jobs)";
    CHECK(has_err(errs, "hyperparameters.beta", m));
    CHECK(has_err(errs, "hyperparameters.loss_type", m));
    CHECK(has_err(errs, "hyperparameters.label_smoothing", m));
    jobspec_deinit(&s);
    json_decref(errs);
  }
  /* a shared knob on a DAPO job names both methods it belongs to */
  h = json_pack("{s:i}", "batch_size", 4);
  CHECK(
      parse(json_pack("{s:s,s:s,s:o}", "model", "tiny", "training_file", "t", "hyperparameters", h),
            &s, &errs) == 1);
  CHECK(has_err(errs, "hyperparameters.batch_size", "it is one of supervised and dpo jobs"));
  jobspec_deinit(&s);
  json_decref(errs);
}

/* The dashboard's table marks beta's and label_smoothing's open bounds, and lists them under dpo.
 */
static void test_describe(void) {
  json_t *d = hparams_describe();
  int seen = 0;
  for (size_t i = 0; i < json_array_size(d); i++) {
    const json_t *k = json_array_get(d, i);
    const char *name = json_string_value(json_object_get(k, "name"));
    const json_t *ms = json_object_get(k, "methods");
    int beta = !strcmp(name, "beta"), ls = !strcmp(name, "label_smoothing");
    if (!beta && !ls) continue;
    seen++;
    CHECK(json_array_size(ms) == 1 && !strcmp(json_string_value(json_array_get(ms, 0)), "dpo"));
    CHECK(json_is_true(json_object_get(k, beta ? "exclusive_minimum" : "exclusive_maximum")));
    CHECK(!json_object_get(k, beta ? "exclusive_maximum" : "exclusive_minimum"));
  }
  CHECK(seen == 2);
  json_decref(d);
}

int main(void) {
  test_describe();
  test_defaults();
  test_refusals();
  return check_done("test_dpo_spec");
}
