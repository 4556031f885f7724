/* DPO jobs run (issue 27): on the tiny preset (random weights), pairs {"prompt": "37", "chosen":
 * "8", "rejected": "6"} (follow the prompt's last digit by the next one rather than the one before,
 * mod 10), 60 of the 90
 * ordered digit pairs trained on and the other 30 held out: the starting model prefers the
 * chosen response on about half the held-out pairs (read from the reference's log-probs the job
 * keeps); the held-out rewards/accuracy, 0 at step 0 (the policy is its reference), ends well
 * above 0.5 and the held-out loss falls well below log 2;
 * a job paused mid-way (full fine-tune, and LoRA) and resumed ends on the same bits (weights,
 * optimizer, every metric) as one that never stopped; the admission check names a bad line's
 * field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "files.h"
#include "runner.h"

static char tmpdir[] = "/tmp/dapo-dpo-XXXXXX";

static int on_metrics(void *ctx, const struct runner_metrics *rm) {
  json_array_append_new((json_t *)ctx, json_deep_copy(rm->data));
  return 0;
}

static json_t *pairs_job(const char *train, const char *valid) {
  return json_pack("{s:s,s:s,s:s,s:s,s:i,s:{s:i,s:i,s:f,s:s,s:f,s:i,s:i,s:i}}", "method", "dpo",
                   "model", "tiny", "training_file", train, "validation_file", valid, "seed", 2,
                   "hyperparameters", "batch_size", 10, "epochs", 10, "learning_rate", 0.0005,
                   "lr_schedule", "constant", "beta", 0.5, "eval_every", 10, "micro_batch_tokens",
                   64, "checkpoint_every", 30);
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

/* The metrics objects of ms that carry key, in order. */
static json_t *having(const json_t *ms, const char *key) {
  json_t *a = json_array();
  for (size_t i = 0; i < json_array_size(ms); i++)
    if (json_object_get(json_array_get(ms, i), key)) json_array_append(a, json_array_get(ms, i));
  return a;
}

static double num(const json_t *m, const char *key) {
  return json_number_value(json_object_get(m, key));
}

/* The fraction of the n held-out pairs (after n_train training pairs) that the starting model
 * prefers the chosen response of: from the reference's log-probs in out/dpo_reference.bin
 * (magic, the two counts, then chosen and rejected per pair, training pairs first). */
static double start_preference(const char *out, int n_train, int n) {
  char p[400];
  snprintf(p, sizeof p, "%s/dpo_reference.bin", out);
  FILE *f = fopen(p, "rb");
  CHECK_MSG(f != NULL, "no %s", p);
  if (!f) return -1;
  char magic[8];
  long long counts[2];
  double lp[2 * 256];
  CHECK(n_train + n <= 256);
  CHECK(fread(magic, 8, 1, f) == 1 && fread(counts, sizeof counts, 1, f) == 1);
  CHECK(counts[0] == n_train && counts[1] == n);
  CHECK(fread(lp, sizeof(double), 2 * (size_t)(n_train + n), f) == 2 * (size_t)(n_train + n));
  fclose(f);
  int prefer = 0;
  for (int i = n_train; i < n_train + n; i++) prefer += lp[2 * i] > lp[2 * i + 1];
  return (double)prefer / n;
}

/* A straight run and a run paused after step `pause` and resumed end on the same bits. */
static void resume_same(json_t *body, const char *name, int pause, int total, const char *wfile) {
  char a[300], b[300];
  snprintf(a, sizeof a, "%s/%s-a", tmpdir, name);
  snprintf(b, sizeof b, "%s/%s-b", tmpdir, name);
  json_t *ma = json_array(), *mb = json_array();
  struct runner_result res;
  run(body, a, ma, 0, &res);
  CHECK(res.status == RUNNER_SUCCEEDED && res.step == total);
  run(body, b, mb, pause, &res);
  CHECK(res.status == RUNNER_PAUSED && res.step == pause);
  run(body, b, mb, 0, &res);
  CHECK(res.status == RUNNER_SUCCEEDED && res.step == total && res.resumed_from == pause);
  const char *files[] = {wfile, "optimizer.safetensors"};
  for (int i = 0; i < 2; i++) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-%d/%s", a, total, files[i]);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-%d/%s", b, total, files[i]);
    CHECK_MSG(same_file(pa, pb), "%s: %s differs after resume", name, files[i]);
  }
  /* every step's metrics and the evaluations after the pause (the resumed run tells 1..pause,
   * then the rest; its step-0 evaluation once) */
  for (int k = 0; k < 2; k++) {
    const char *key = k ? "valid/loss" : "train/loss";
    json_t *ta = having(ma, key), *tb = having(mb, key);
    CHECK_MSG(json_equal(ta, tb), "%s: %s metrics differ after resume (%zu, %zu)", name, key,
              json_array_size(ta), json_array_size(tb));
    json_decref(ta), json_decref(tb);
  }
  json_decref(ma), json_decref(mb);
}

int main(void) {
  CHECK(mkdtemp(tmpdir) != NULL);
  char train[256], valid[256], bad[256], out[300];
  snprintf(train, sizeof train, "%s/train.jsonl", tmpdir);
  snprintf(valid, sizeof valid, "%s/valid.jsonl", tmpdir);
  FILE *ft = fopen(train, "w"), *fv = fopen(valid, "w");
  int nt = 0, nv = 0;
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 10; b++) {
      if (a == b) continue;
      int held = (a * 10 + b) % 3 == 0; /* 30 of the 90 */
      fprintf(held ? fv : ft, "{\"prompt\": \"%d%d\", \"chosen\": \"%d\", \"rejected\": \"%d\"}\n",
              a, b, (b + 1) % 10, (b + 9) % 10);
      held ? nv++ : nt++;
    }
  fclose(ft), fclose(fv);
  CHECK(nt == 60 && nv == 30);

  /* learning: ceil(60 / 10) * 10 = 60 steps */
  json_t *body = pairs_job(train, valid), *ms = json_array();
  struct runner_result res;
  snprintf(out, sizeof out, "%s/learn", tmpdir);
  run(body, out, ms, 0, &res);
  CHECK(res.status == RUNNER_SUCCEEDED && res.step == 60);
  json_t *ev = having(ms, "valid/loss"), *tr = having(ms, "train/loss");
  /* evaluations at step 0, every 10 steps and each epoch's end (6 steps an epoch): 15; the 10
   * at an epoch's end also under full_valid/ names, the same pass */
  json_t *full = having(ms, "full_valid/loss");
  CHECK(json_array_size(ev) == 15 && json_array_size(tr) == 60 && json_array_size(full) == 10);
  for (size_t i = 0; i < json_array_size(full); i++) {
    const json_t *f = json_array_get(full, i);
    CHECK(json_integer_value(json_object_get(f, "step")) == 6 * ((int)i + 1) &&
          num(f, "full_valid/loss") == num(f, "valid/loss") &&
          num(f, "full_valid/rewards/accuracy") == num(f, "valid/rewards/accuracy"));
  }
  json_decref(full);
  const json_t *v0 = json_array_get(ev, 0), *v1 = json_array_get(ev, json_array_size(ev) - 1);
  const json_t *t1 = json_array_get(tr, 0);
  fprintf(stderr,
          "held-out (30 pairs): loss %.4f -> %.4f, rewards/accuracy %.3f -> %.3f, margin %.3f -> "
          "%.3f; logps chosen/rejected at step 0 %.3f / %.3f, at step 60 %.3f / %.3f\n",
          num(v0, "valid/loss"), num(v1, "valid/loss"), num(v0, "valid/rewards/accuracy"),
          num(v1, "valid/rewards/accuracy"), num(v0, "valid/rewards/margin"),
          num(v1, "valid/rewards/margin"), num(v0, "valid/logps/chosen"),
          num(v0, "valid/logps/rejected"), num(v1, "valid/logps/chosen"),
          num(v1, "valid/logps/rejected"));
  double pref0 = start_preference(out, 60, 30);
  fprintf(stderr, "the starting model prefers the chosen response on %.3f of the held-out pairs\n",
          pref0);
  CHECK(pref0 > 0.2 && pref0 < 0.8);
  fprintf(stderr, "held-out rewards/accuracy at steps 0, 6, 10, 12, 18, 20, ... 60:");
  for (size_t i = 0; i < json_array_size(ev); i++)
    fprintf(stderr, " %.3f", num(json_array_get(ev, i), "valid/rewards/accuracy"));
  fprintf(stderr, "\n");
  /* step 0: the policy is its reference, to the bit (the reference's log-probs are the starting
   * weights' own, the validation's micro-batches the reference pass's). Step 1's micro-batches
   * hold other pairs, and OpenBLAS's Haswell/Zen SGEMM kernel gives a row other bits in another
   * batch (its Sandybridge and SkylakeX kernels do not): there the same to float32's rounding
   * (7.2e-8 of margin on a Zen 3; a wrong reference is off by more than 1e-2). */
  CHECK(fabs(num(v0, "valid/loss") - log(2.0)) < 1e-12 && num(v0, "valid/rewards/accuracy") == 0 &&
        num(v0, "valid/rewards/margin") == 0);
  CHECK_MSG(fabs(num(t1, "train/loss") - log(2.0)) < 1e-6 && fabs(num(t1, "rewards/margin")) < 1e-6,
            "step 1: loss log 2 %+.3g, margin %.3g", num(t1, "train/loss") - log(2.0),
            num(t1, "rewards/margin"));
  CHECK(num(v1, "valid/rewards/accuracy") >= 0.8 && num(v1, "valid/loss") < 0.4 &&
        num(v1, "valid/rewards/margin") > 0);
  json_decref(ev), json_decref(tr), json_decref(ms);

  /* resume: paused after step 23 (mid-epoch), a full fine-tune and a LoRA job */
  resume_same(body, "full", 23, 60, "model.safetensors");
  json_object_set_new(body, "adapter",
                      json_pack("{s:s,s:i,s:i,s:[s,s]}", "type", "lora", "r", 4, "alpha", 8,
                                "target_modules", "q_proj", "v_proj"));
  json_object_set_new(json_object_get(body, "hyperparameters"), "learning_rate", json_real(0.01));
  resume_same(body, "lora", 17, 60, "adapter_model.safetensors");
  json_object_del(body, "adapter");

  /* admission names a bad line's field */
  snprintf(bad, sizeof bad, "%s/bad.jsonl", tmpdir);
  FILE *f = fopen(bad, "w");
  fprintf(f, "{\"prompt\": \"12:\", \"chosen\": \"1\", \"rejected\": \"2\"}\n\n");
  fprintf(f, "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}, "
             "\"preferred_output\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": "
             "\"assistant\", \"content\": \"b\"}], \"non_preferred_output\": [{\"role\": "
             "\"assistant\", \"content\": \"c\"}]}\n");
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
                strstr(msg, "line 3: field 'preferred_output': expected exactly one assistant "
                            "message"),
            "%s: %s", field ? field : "?", msg ? msg : "?");
  jobspec_deinit(&s);
  json_decref(errs);

  json_decref(body);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_dpo_run");
}
