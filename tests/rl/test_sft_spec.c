/* The job body's `method` (issue 27): "dapo" by default with its resolved spec unchanged,
 * "supervised" with its own knobs (epochs, batch_size, lr_schedule, max_sequence_tokens,
 * truncate) and the shared ones, anything else refused naming `method` (dpo: test_dpo_spec); knobs
 * of the other method, a judge or an episode on a supervised job refused naming them; the
 * supervised step count and learning-rate schedule against hand-computed values. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "hparams.h"
#include "jobspec.h"
#include "runner.h"

/* Whether errors holds a problem of field `field` whose message contains `part`. */
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

static void test_dapo_unchanged(void) {
  struct job_spec s;
  json_t *errs;
  CHECK(parse(json_pack("{s:s,s:s}", "model", "tiny", "training_file", "t.jsonl"), &s, &errs) == 0);
  CHECK(s.hp.method == METHOD_DAPO);
  json_t *js = jobspec_to_json(&s), *hp = json_object_get(js, "hyperparameters");
  /* a body without `method` resolves as before: no `method`, no supervised knob */
  CHECK(!json_object_get(js, "method") && json_object_get(js, "judge"));
  CHECK(json_object_get(hp, "group_size") && json_object_get(hp, "total_steps"));
  CHECK(!json_object_get(hp, "batch_size") && !json_object_get(hp, "lr_schedule") &&
        !json_object_get(hp, "max_sequence_tokens") && !json_object_get(hp, "truncate"));
  json_decref(js);
  jobspec_deinit(&s);
  json_decref(errs);
  /* named, it is recorded */
  CHECK(parse(json_pack("{s:s,s:s,s:s}", "model", "tiny", "training_file", "t.jsonl", "method",
                        "dapo"),
              &s, &errs) == 0);
  js = jobspec_to_json(&s);
  CHECK(!strcmp(json_string_value(json_object_get(js, "method")), "dapo"));
  json_decref(js);
  jobspec_deinit(&s);
  json_decref(errs);
  /* the dashboard's table says which methods a knob belongs to: the supervised ones not dapo */
  json_t *d = hparams_describe();
  for (size_t i = 0; i < json_array_size(d); i++) {
    const json_t *k = json_array_get(d, i), *ms = json_object_get(k, "methods");
    const char *name = json_string_value(json_object_get(k, "name"));
    if (strcmp(name, "batch_size") && strcmp(name, "lr_schedule")) continue;
    CHECK_MSG(json_array_size(ms) == 2 &&
                  !strcmp(json_string_value(json_array_get(ms, 0)), "supervised") &&
                  !strcmp(json_string_value(json_array_get(ms, 1)), "dpo"),
              "describe lists %s under other methods", name);
  }
  json_decref(d);
}

static void test_supervised(void) {
  struct job_spec s;
  json_t *errs;
  CHECK(parse(json_pack("{s:s,s:s,s:s,s:s,s:i}", "method", "supervised", "model", "tiny",
                        "training_file", "t.jsonl", "validation_file", "v.jsonl", "seed", 3),
              &s, &errs) == 0);
  CHECK(s.hp.method == METHOD_SUPERVISED);
  /* the defaults docs/TRAINING.md gives */
  CHECK(s.hp.epochs == 1 && s.hp.batch_size == 8 && s.hp.lr_schedule == LR_LINEAR);
  CHECK(s.hp.max_sequence_tokens == 2048 && !s.hp.truncate && s.hp.learning_rate == 1e-5);
  CHECK(s.hp.lr_warmup_steps == 0 && s.hp.grad_clip == 1.0 && s.hp.micro_batch_tokens == 1024);
  json_t *js = jobspec_to_json(&s), *hp = json_object_get(js, "hyperparameters");
  CHECK(!strcmp(json_string_value(json_object_get(js, "method")), "supervised"));
  CHECK(!json_object_get(js, "judge") && !json_object_get(js, "episode"));
  CHECK(!strcmp(json_string_value(json_object_get(hp, "lr_schedule")), "linear"));
  CHECK(json_integer_value(json_object_get(hp, "batch_size")) == 8);
  CHECK(json_is_false(json_object_get(hp, "truncate")));
  CHECK(!json_object_get(hp, "group_size") && !json_object_get(hp, "total_steps") &&
        !json_object_get(hp, "max_new_tokens"));
  /* the resolved form parses to itself */
  struct job_spec s2;
  json_t *errs2;
  CHECK(parse(json_incref(js), &s2, &errs2) == 0);
  json_t *js2 = jobspec_to_json(&s2);
  CHECK(json_equal(js, js2));
  json_decref(js2);
  jobspec_deinit(&s2);
  json_decref(errs2);
  json_decref(js);
  /* checked against its files before queueing (test_sft_run checks a bad line) */
  struct runner_data_facts f;
  json_t *rerrs = json_array();
  CHECK(runner_check_data(&s, &f, rerrs) == 1 && has_err(rerrs, "training_file", "t.jsonl"));
  json_decref(rerrs);
  jobspec_deinit(&s);
  json_decref(errs);

  /* every knob given */
  json_t *h =
      json_pack("{s:i,s:i,s:f,s:s,s:i,s:i,s:b,s:f,s:f,s:i,s:i,s:i}", "epochs", 3, "batch_size", 4,
                "learning_rate", 0.002, "lr_schedule", "cosine", "lr_warmup_steps", 2,
                "max_sequence_tokens", 64, "truncate", 1, "weight_decay", 0.1, "grad_clip", 0.5,
                "micro_batch_tokens", 256, "eval_every", 5, "checkpoint_every", 10);
  CHECK(parse(json_pack("{s:s,s:s,s:s,s:o}", "method", "supervised", "model", "tiny",
                        "training_file", "t.jsonl", "hyperparameters", h),
              &s, &errs) == 0);
  CHECK(s.hp.epochs == 3 && s.hp.batch_size == 4 && s.hp.lr_schedule == LR_COSINE &&
        s.hp.max_sequence_tokens == 64 && s.hp.truncate && s.hp.eval_every == 5);
  jobspec_deinit(&s);
  json_decref(errs);
}

static void test_refusals(void) {
  struct job_spec s;
  json_t *errs;
  /* anything else than dapo, supervised and dpo: not a method */
  CHECK(parse(json_pack("{s:s,s:s,s:s}", "method", "sft", "model", "tiny", "training_file", "t"),
              &s, &errs) == 1);
  CHECK(has_err(errs, "method", "expected \"dapo\""));
  jobspec_deinit(&s);
  json_decref(errs);
  CHECK(parse(json_pack("{s:i,s:s,s:s}", "method", 1, "model", "tiny", "training_file", "t"), &s,
              &errs) == 1);
  CHECK(has_err(errs, "method", "expected \"dapo\""));
  jobspec_deinit(&s);
  json_decref(errs);
  /* a supervised job: DAPO knobs, a judge, an episode, bad values, each by its field */
  json_t *h = json_pack("{s:i,s:i,s:i,s:i,s:s,s:i,s:i}", "group_size", 4, "total_steps", 10,
                        "max_new_tokens", 8, "batch_size", 0, "lr_schedule", "step",
                        "max_sequence_tokens", 1, "epochs", 0);
  int n = parse(json_pack("{s:s,s:s,s:s,s:o,s:{s:s},s:{s:i}}", "method", "supervised", "model",
                          "tiny", "training_file", "t", "hyperparameters", h, "judge", "type",
                          "math", "episode", "max_turns", 2),
                &s, &errs);
  CHECK_MSG(n == 9, "%d problems", n);
  CHECK(has_err(errs, "hyperparameters.group_size", "not a hyperparameter of method supervised"));
  CHECK(has_err(errs, "hyperparameters.total_steps", "not a hyperparameter of method supervised"));
  CHECK(has_err(errs, "hyperparameters.max_new_tokens", "not a hyperparameter"));
  CHECK(has_err(errs, "hyperparameters.batch_size", "0 not in [1, 65536]"));
  CHECK(has_err(errs, "hyperparameters.lr_schedule", "constant, linear, cosine"));
  CHECK(has_err(errs, "hyperparameters.max_sequence_tokens", "not in"));
  CHECK(has_err(errs, "hyperparameters.epochs", "not in"));
  CHECK(has_err(errs, "judge", "no judge"));
  CHECK(has_err(errs, "episode", "no episodes"));
  jobspec_deinit(&s);
  json_decref(errs);
  /* a DAPO job: the supervised knobs */
  h = json_pack("{s:i,s:b}", "batch_size", 4, "truncate", 1);
  n = parse(json_pack("{s:s,s:s,s:o}", "model", "tiny", "training_file", "t", "hyperparameters", h),
            &s, &errs);
  CHECK_MSG(n == 2, "%d problems", n);
  CHECK(has_err(errs, "hyperparameters.batch_size", "not a hyperparameter of method dapo"));
  CHECK(has_err(errs, "hyperparameters.truncate", "it is one of supervised and dpo jobs"));
  jobspec_deinit(&s);
  json_decref(errs);
}

static void test_steps_and_schedule(void) {
  struct hparams h;
  json_t *errs = json_array();
  json_t *j = json_pack("{s:i,s:i}", "batch_size", 4, "epochs", 3);
  CHECK(hparams_parse_method(&h, j, METHOD_SUPERVISED, errs) == 0);
  json_decref(j);
  CHECK(hparams_sft_total_steps(&h, 10) == 9); /* ceil(10 / 4) * 3 */
  CHECK(hparams_sft_total_steps(&h, 12) == 9);
  CHECK(hparams_sft_total_steps(&h, 13) == 12);
  CHECK(hparams_sft_total_steps(&h, 0) == 3);
  /* warm-up over 2 steps to 1.0, then decay over the 8 steps 2..9 to 0 at step 10 */
  h.learning_rate = 1.0;
  h.lr_warmup_steps = 2;
  h.lr_schedule = LR_LINEAR;
  CHECK_NEAR(hparams_lr_at(&h, 0, 10), 0.5, 0);
  CHECK_NEAR(hparams_lr_at(&h, 1, 10), 1.0, 0);
  CHECK_NEAR(hparams_lr_at(&h, 2, 10), 1.0, 0);
  CHECK_NEAR(hparams_lr_at(&h, 6, 10), 0.5, 1e-15);
  CHECK_NEAR(hparams_lr_at(&h, 9, 10), 0.125, 1e-15);
  h.lr_schedule = LR_COSINE;
  CHECK_NEAR(hparams_lr_at(&h, 6, 10), 0.5, 1e-15);
  CHECK_NEAR(hparams_lr_at(&h, 4, 10), 0.5 * (1 + cos(M_PI / 4)), 1e-15);
  CHECK_NEAR(hparams_lr_at(&h, 10, 10), 0, 1e-15);
  h.lr_schedule = LR_CONSTANT;
  CHECK_NEAR(hparams_lr_at(&h, 9, 10), 1.0, 0);
  /* a DAPO job: the warm-up alone, whatever lr_schedule holds */
  h.method = METHOD_DAPO;
  h.lr_schedule = LR_LINEAR;
  CHECK_NEAR(hparams_lr_at(&h, 0, 10), 0.5, 0);
  CHECK_NEAR(hparams_lr_at(&h, 9, 10), 1.0, 0);
  json_decref(errs);
}

int main(void) {
  test_dapo_unchanged();
  test_supervised();
  test_refusals();
  test_steps_and_schedule();
  return check_done("test_sft_spec");
}
