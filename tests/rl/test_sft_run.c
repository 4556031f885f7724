/* Supervised jobs run (issue 27): the tiny preset (random weights) learns the sums a+b (a, b in
 * 0..9) from {"prompt": "3+4=", "completion": "7"} lines: the validation loss falls and its
 * greedy answers are right on most prompts; a job paused after step 37 and resumed ends on the
 * same bits (weights, optimizer, metrics) as one that never stopped; the admission check names
 * a bad line's field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "files.h"
#include "lm.h"
#include "pool.h"
#include "runner.h"

static char tmpdir[] = "/tmp/dapo-sft-XXXXXX";

static int on_metrics(void *ctx, const struct runner_metrics *rm) {
  json_array_append_new((json_t *)ctx, json_deep_copy(rm->data));
  return 0;
}

static json_t *sums_job(const char *train) {
  return json_pack("{s:s,s:s,s:s,s:s,s:i,s:{s:i,s:i,s:f,s:s,s:i,s:i,s:i}}", "method", "supervised",
                   "model", "tiny", "training_file", train, "validation_file", train, "seed", 1,
                   "hyperparameters", "batch_size", 20, "epochs", 40, "learning_rate", 0.003,
                   "lr_schedule", "linear", "eval_every", 50, "micro_batch_tokens", 64,
                   "checkpoint_every", 100);
}

static void run(json_t *body, const char *out, json_t *metrics, int stop_after,
                struct runner_result *res) {
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  CHECK_MSG(n == 0, "%d spec errors", n);
  struct runner_hooks h = {.ctx = metrics, .metrics = on_metrics};
  struct runner_opts o = {.stop_after_step = stop_after};
  runner_run(&s, out, &h, &o, res);
  if (res->status == RUNNER_FAILED) fprintf(stderr, "run failed: %s\n", res->message);
  jobspec_deinit(&s);
  json_decref(errs);
}

/* The value of key in the last metrics object of metrics that has it. */
static double last_of(const json_t *metrics, const char *key) {
  double v = -1;
  for (size_t i = 0; i < json_array_size(metrics); i++) {
    json_t *x = json_object_get(json_array_get(metrics, i), key);
    if (x) v = json_number_value(x);
  }
  return v;
}

/* Greedy answers of the checkpoint at dir to the 100 sums: how many are right. */
static int greedy_right(const char *dir) {
  struct lm lm;
  struct dapo_err e = {0};
  CHECK_MSG(lm_open(dir, 0, &lm, &e) == 0, "%s", e.msg);
  int right = 0;
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 10; b++) {
      char q[16], want[16], got[32];
      snprintf(q, sizeof q, "%d+%d=", a, b);
      snprintf(want, sizeof want, "%d", a + b);
      int *ids = NULL, n = 0;
      CHECK(lm_encode_prompt(&lm, q, strlen(q), LM_PROMPT_TEXT, 3, &ids, &n, &e) == 0);
      struct sampler_opts so = {.temperature = 0, .top_p = 1, .max_new_tokens = 3};
      struct lm_samples smp;
      CHECK(lm_sample(&lm, ids, n, 1, &so, 0, &smp, &e) == 0);
      size_t len = 0;
      tok_decode(lm.tok, smp.tokens, smp.len[0], got, sizeof got, &len, 1, &e);
      right += !strcmp(got, want);
      lm_samples_free(&smp);
      free(ids);
    }
  lm_close(&lm);
  return right;
}

int main(void) {
  CHECK(mkdtemp(tmpdir) != NULL);
  char train[256], bad[256], a[256], b[256];
  snprintf(train, sizeof train, "%s/sums.jsonl", tmpdir);
  FILE *f = fopen(train, "w");
  for (int x = 0; x < 10; x++)
    for (int y = 0; y < 10; y++)
      fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", x, y, x + y);
  fclose(f);

  /* learning: a straight run of ceil(100 / 20) * 40 = 200 steps */
  json_t *body = sums_job(train), *ma = json_array(), *mb = json_array();
  struct runner_result res;
  snprintf(a, sizeof a, "%s/a", tmpdir);
  run(body, a, ma, 0, &res);
  CHECK(res.status == RUNNER_SUCCEEDED && res.step == 200);
  double v0 = -1, acc0 = -1;
  for (size_t i = 0; i < json_array_size(ma) && v0 < 0; i++) {
    json_t *m = json_array_get(ma, i);
    if (json_object_get(m, "valid/loss"))
      v0 = json_number_value(json_object_get(m, "valid/loss")),
      acc0 = json_number_value(json_object_get(m, "valid/mean_token_accuracy"));
  }
  double v1 = last_of(ma, "valid/loss"), acc1 = last_of(ma, "valid/mean_token_accuracy");
  fprintf(stderr, "valid/loss %.3f -> %.3f, valid/mean_token_accuracy %.3f -> %.3f\n", v0, v1, acc0,
          acc1);
  CHECK(v0 > 3 && v1 < 0.5 && acc0 < 0.2 && acc1 > 0.8);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/checkpoints/step-200", a);
  int right = greedy_right(dir);
  snprintf(dir, sizeof dir, "%s/checkpoints/step-0", a);
  int right0 = greedy_right(dir);
  fprintf(stderr, "greedy answers right: %d/100 at step 0, %d/100 at step 200\n", right0, right);
  CHECK(right0 <= 10 && right >= 70);

  /* resume: paused after step 37 (mid-epoch), resumed, the same bits as the straight run */
  snprintf(b, sizeof b, "%s/b", tmpdir);
  run(body, b, mb, 37, &res);
  CHECK(res.status == RUNNER_PAUSED && res.step == 37);
  run(body, b, mb, 0, &res);
  CHECK(res.status == RUNNER_SUCCEEDED && res.step == 200 && res.resumed_from == 37);
  static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
  for (int i = 0; i < 2; i++) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-200/%s", a, files[i]);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-200/%s", b, files[i]);
    CHECK_MSG(same_file(pa, pb), "%s differs after resume", files[i]);
  }
  /* the training metrics of every step (the resumed run tells 1..37, then 38..200) */
  json_t *ta = json_array(), *tb = json_array();
  for (size_t i = 0; i < json_array_size(ma); i++)
    if (json_object_get(json_array_get(ma, i), "train/loss"))
      json_array_append(ta, json_array_get(ma, i));
  for (size_t i = 0; i < json_array_size(mb); i++)
    if (json_object_get(json_array_get(mb, i), "train/loss"))
      json_array_append(tb, json_array_get(mb, i));
  CHECK_MSG(json_equal(ta, tb), "training metrics differ after resume (%zu, %zu)",
            json_array_size(ta), json_array_size(tb));
  json_decref(ta), json_decref(tb);

  /* admission names a bad line's field */
  snprintf(bad, sizeof bad, "%s/bad.jsonl", tmpdir);
  f = fopen(bad, "w");
  fprintf(f, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n\n");
  fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
             "\"assistant\", \"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"c\", "
             "\"weight\": 2}]}\n");
  fclose(f);
  json_object_set_new(body, "training_file", json_string(bad));
  json_t *errs = json_array();
  struct job_spec s;
  CHECK(jobspec_parse(body, NULL, &s, errs) == 0);
  struct mem_plan plan;
  CHECK(runner_check_job(&s, &plan, errs) == 1);
  const char *msg = json_string_value(json_object_get(json_array_get(errs, 0), "message"));
  const char *field = json_string_value(json_object_get(json_array_get(errs, 0), "field"));
  CHECK_MSG(field && !strcmp(field, "training_file") && msg &&
                strstr(msg, "line 3: field 'messages[2].weight': expected 0 or 1"),
            "%s: %s", field ? field : "?", msg ? msg : "?");
  jobspec_deinit(&s);
  json_decref(errs);

  json_decref(body), json_decref(ma), json_decref(mb);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_sft_run");
}
