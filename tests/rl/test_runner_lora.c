/* LoRA jobs in the runner: the checkpoints are PEFT adapter folders (adapter_config.json,
 * adapter_model.safetensors, base_model.json; no config.json or model.safetensors, the base is
 * not copied); the adapter learns while the base stays bit-identical; a job paused after step 3
 * and resumed reaches exactly the step-6 adapter, optimizer state, rollouts and metrics of one
 * that never stopped, also with kl_coef > 0 (whose reference is the base with the adapter
 * switched off); the memory plan counts the adapter's gradients and moments only; an adapter
 * checkpoint opens with lm_open and merges. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "lm.h"
#include "lora.h"
#include "runner.h"
#include "train.h"

static char tmpdir[] = "/tmp/dapo-runner-lora-XXXXXX";

static int exists(const char *out, int step, const char *name) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/checkpoints/step-%d/%s", out, step, name);
  return stat(p, &st) == 0;
}

static int on_metrics(void *ctx, const struct runner_metrics *rm) {
  json_t *arr = ctx;
  if (!arr || rm->eval) return 0;
  json_t *m = json_deep_copy(rm->data);
  const char *k;
  json_t *v;
  void *tmp;
  json_object_foreach_safe(m, tmp, k, v) {
    if (!strncmp(k, "time/", 5) || !strncmp(k, "throughput/", 11) || !strcmp(k, "judge/seconds"))
      json_object_del(m, k);
  }
  json_array_append_new(arr, m);
  return 0;
}

static json_t *job(const char *train, double kl) {
  return json_pack("{s:s, s:s, s:{s:s}, s:i, s:{s:s, s:i, s:f, s:s}, s:{s:i, s:i, s:i, s:i, s:f, "
                   "s:b, s:i, s:i, s:i, s:i, s:f}}",
                   "model", "tiny", "training_file", train, "judge", "type", "math", "seed", 5,
                   "adapter", "type", "lora", "r", 4, "alpha", 8.0, "target_modules", "all-linear",
                   "hyperparameters", "total_steps", 6, "group_size", 4, "prompt_batch_size", 3,
                   "max_new_tokens", 3, "learning_rate", 2e-2, "dynamic_sampling", 1,
                   "checkpoint_every", 3, "minibatch_size", 4, "epochs", 2, "micro_batch_tokens",
                   32, "kl_coef", kl);
}

static int run(json_t *body, const char *out, json_t *metrics, int stop_after,
               struct runner_result *res) {
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  CHECK_MSG(n == 0, "spec errors: %s",
            json_string_value(json_object_get(json_array_get(errs, 0), "message")));
  struct runner_hooks h = {.ctx = metrics, .metrics = on_metrics};
  struct runner_opts o = {.stop_after_step = stop_after};
  runner_run(&s, out, &h, &o, res);
  if (res->status == RUNNER_FAILED)
    fprintf(stderr, "run failed: %s: %s\n", failure_info(res->failure)->name, res->message);
  jobspec_deinit(&s);
  json_decref(errs);
  return res->status;
}

static void test_resume(const char *train, double kl, const char *tag) {
  char a[256], b[256], pa[512], pb[512];
  snprintf(a, sizeof a, "%s/%s-a", tmpdir, tag);
  snprintf(b, sizeof b, "%s/%s-b", tmpdir, tag);
  struct runner_result ra, rb;
  json_t *ma = json_array(), *mb = json_array(), *body = job(train, kl);
  CHECK(run(body, a, ma, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 6);
  CHECK(run(body, b, mb, 3, &rb) == RUNNER_PAUSED && rb.step == 3);
  CHECK(run(body, b, mb, 0, &rb) == RUNNER_SUCCEEDED && rb.step == 6 && rb.resumed_from == 3);
  /* PEFT's layout, without the base's weights */
  for (int step = 0; step <= 6; step += 3) {
    CHECK(exists(a, step, "adapter_config.json") && exists(a, step, "adapter_model.safetensors") &&
          exists(a, step, LORA_BASE_FILE) && exists(a, step, "tokenizer.json") &&
          exists(a, step, "trainer_state.json"));
    CHECK(!exists(a, step, "model.safetensors") && !exists(a, step, "config.json"));
    CHECK(exists(a, step, "optimizer.safetensors") == (step > 0));
  }
  const char *files[] = {"adapter_model.safetensors", "optimizer.safetensors"};
  for (int i = 0; i < 2; i++) {
    snprintf(pa, sizeof pa, "%s/checkpoints/step-6/%s", a, files[i]);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-6/%s", b, files[i]);
    CHECK_MSG(same_file(pa, pb), "%s: %s of step 6 differs after resume", tag, files[i]);
  }
  for (int s = 1; s <= 6; s++) {
    snprintf(pa, sizeof pa, "%s/rollouts/step-%d.jsonl", a, s);
    snprintf(pb, sizeof pb, "%s/rollouts/step-%d.jsonl", b, s);
    CHECK_MSG(same_file(pa, pb), "%s: rollouts of step %d differ after resume", tag, s);
  }
  CHECK_MSG(json_equal(ma, mb), "%s: step metrics differ after resume", tag);
  if (kl > 0) {
    json_t *last = json_array_get(ma, json_array_size(ma) - 1);
    CHECK_MSG(json_is_number(json_object_get(last, "policy/kl_ref")), "%s: no policy/kl_ref metric",
              tag);
  }

  /* the adapter learned, the base did not move; the checkpoint opens and merges */
  struct lm l0, l6, base;
  struct dapo_err e = {0};
  snprintf(pa, sizeof pa, "%s/checkpoints/step-0", a);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-6", a);
  CHECK_MSG(lm_open(pa, 0, &l0, &e) == 0, "%s", e.msg);
  CHECK_MSG(lm_open(pb, 0, &l6, &e) == 0, "%s", e.msg);
  CHECK(lm_open("tiny", 5, &base, &e) == 0);
  CHECK(l0.lora && l6.lora && l6.model->lora == l6.lora && !strcmp(l6.base, "tiny") &&
        l6.base_seed == 5);
  CHECK(!memcmp(l6.model->params, base.model->params, base.model->n_params * sizeof(float)));
  float moved = 0;
  for (size_t k = 0; k < l6.lora->n_params; k++)
    moved = fmaxf(moved, fabsf(l6.lora->params[k] - l0.lora->params[k]));
  CHECK_MSG(moved > 1e-3f, "%s: the adapter did not move (%g)", tag, (double)moved);
  char merged[600];
  snprintf(merged, sizeof merged, "%s/merged-%s", tmpdir, tag);
  CHECK_MSG(lm_save(&l6, merged, 0, &e) == 0, "%s", e.msg);
  lm_close(&l0);
  lm_close(&l6);
  lm_close(&base);
  json_decref(body);
  json_decref(ma);
  json_decref(mb);
}

/* The plan: the base's weights, the adapter's parameters, gradients and two moments, no
 * reference copy; activations with the adapter's buffers. */
static void test_memory_plan(void) {
  struct lm lm;
  struct dapo_err e = {0};
  CHECK(lm_open_meta("tiny", &lm, &e) == 0);
  struct hparams hp;
  json_t *errs = json_array(), *h = json_pack("{s:f}", "kl_coef", 0.1);
  CHECK(hparams_parse(&hp, h, errs) == 0);
  struct lora_config c = {.r = 8, .alpha = 16, .targets = (1u << LT_COUNT) - 1};
  struct mem_plan full, ad;
  runner_memory_plan(&lm.cfg, NULL, &hp, NULL, 20, 0, 0, &full);
  runner_memory_plan(&lm.cfg, &c, &hp, NULL, 20, 0, 0, &ad);
  uint64_t n = (uint64_t)model_param_count(&lm.cfg), a = (uint64_t)lora_param_count(&c, &lm.cfg);
  CHECK(full.reference == 4 * n && ad.reference == 0);
  CHECK(ad.trainable == a && full.trainable == n);
  CHECK(ad.weights == 4 * (n + a) && ad.gradients == 4 * a && ad.optimizer == 8 * a);
  CHECK(ad.activations > full.activations); /* s x A^T kept per targeted layer */
  CHECK(ad.total < full.total);
  fprintf(stderr, "tiny, r 8 on every layer: plan %.1f MiB with the adapter, %.1f MiB full\n",
          ad.total / 1048576.0, full.total / 1048576.0);
  json_decref(h);
  json_decref(errs);
  lm_close(&lm);
}

int main(void) {
  CHECK(mkdtemp(tmpdir) != NULL);
  char train[300];
  snprintf(train, sizeof train, "%s/train.jsonl", tmpdir);
  write_dataset(train, 40);
  test_resume(train, 0.0, "lora");
  test_resume(train, 0.05, "lora-kl");
  test_memory_plan();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  CHECK(system(cmd) == 0);
  return check_done("test_runner_lora");
}
