/* The job runner: a job stopped after step 3 and resumed reaches exactly the step-6 weights,
 * optimizer state, rollouts and metrics of one that never stopped (also when the stop falls on
 * an epoch boundary of the dataset, from the step-0 checkpoint that holds no optimizer state, and
 * from the BF16 checkpoints of a BF16 folder); pause and cancel flags; the sampling-shortfall
 * policy; job-spec validation messages; progress reports of every pass. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "checkpoint.h"
#include "kernels.h"
#include "lm.h"
#include "pool.h"
#include "runner.h"

static char tmpdir[] = "/tmp/dapo-runner-XXXXXX";

/* Collected metrics events (without wall-clock fields), one JSON object per step. */
struct collect {
  json_t *metrics; /* array */
  int cancel_after;
  volatile int *cancel;
};

static int on_metrics(void *ctx, const struct runner_metrics *rm) {
  struct collect *c = ctx;
  const json_t *data = rm->data;
  if (!c || rm->eval) return 0;
  json_t *m = json_deep_copy(data);
  const char *k;
  json_t *v;
  void *tmp;
  json_object_foreach_safe(m, tmp, k, v) {
    if (!strncmp(k, "time/", 5) || !strncmp(k, "throughput/", 11) || !strcmp(k, "judge/seconds"))
      json_object_del(m, k);
  }
  json_array_append_new(c->metrics, m);
  if (c->cancel && c->cancel_after &&
      json_integer_value(json_object_get(data, "step")) == c->cancel_after)
    *c->cancel = 1;
  return 0;
}

static struct pool *g_pool; /* NULL: serial kernels */
static int g_compute_all;   /* runner_opts.compute_all of run() */

static json_t *job(const char *train, int steps, int dynamic, int extra_ckpt) {
  json_t *b = json_pack(
      "{s:s,s:s,s:{s:s},s:i,s:{s:i,s:i,s:i,s:i,s:f,s:b,s:i,s:i,s:i,s:i,s:f}}", "model", "tiny",
      "training_file", train, "judge", "type", "math", "seed", 5, "hyperparameters", "total_steps",
      steps, "group_size", 4, "prompt_batch_size", 3, "max_new_tokens", 3, "learning_rate", 3e-3,
      "dynamic_sampling", dynamic, "checkpoint_every", extra_ckpt, "minibatch_size", 4, "epochs", 2,
      "micro_batch_tokens", 32, "eps_high", 0.28);
  return b;
}

static int run(json_t *body, const char *out, struct collect *c, int stop_after,
               struct runner_result *res) {
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  if (n) {
    char *d = json_dumps(errs, 0);
    fprintf(stderr, "spec errors: %s\n", d);
    free(d);
  }
  CHECK(n == 0);
  struct runner_hooks h = {.ctx = c, .metrics = on_metrics};
  struct runner_opts o = {.stop_after_step = stop_after,
                          .cancel = c ? c->cancel : NULL,
                          .pool = g_pool,
                          .compute_all = g_compute_all};
  runner_run(&s, out, &h, &o, res);
  if (res->status == RUNNER_FAILED)
    fprintf(stderr, "run failed: %s: %s\n", failure_info(res->failure)->name, res->message);
  jobspec_deinit(&s);
  json_decref(errs);
  return res->status;
}

static void check_kept_groups(const char *out, int steps, int want);

static void compare_runs(const char *a, const char *b, int step) {
  char pa[512], pb[512];
  const char *files[] = {"model.safetensors", "optimizer.safetensors"};
  for (int i = 0; i < 2; i++) {
    snprintf(pa, sizeof pa, "%s/checkpoints/step-%d/%s", a, step, files[i]);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-%d/%s", b, step, files[i]);
    CHECK_MSG(same_file(pa, pb), "%s of step %d differs after resume", files[i], step);
  }
  for (int s = 1; s <= step; s++) {
    snprintf(pa, sizeof pa, "%s/rollouts/step-%d.jsonl", a, s);
    snprintf(pb, sizeof pb, "%s/rollouts/step-%d.jsonl", b, s);
    CHECK_MSG(same_file(pa, pb), "rollouts of step %d differ after resume", s);
  }
}

static void test_resume(const char *train, int dynamic, int stop_at, const char *tag) {
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/%s-a", tmpdir, tag);
  snprintf(b, sizeof b, "%s/%s-b", tmpdir, tag);
  struct runner_result ra, rb;
  struct collect ca = {json_array(), 0, NULL}, cb = {json_array(), 0, NULL};
  json_t *body = job(train, 6, dynamic, 3);
  CHECK(run(body, a, &ca, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 6);
  CHECK(run(body, b, &cb, stop_at, &rb) == RUNNER_PAUSED && rb.step == stop_at);
  CHECK(run(body, b, &cb, 0, &rb) == RUNNER_SUCCEEDED && rb.step == 6);
  CHECK(rb.resumed_from == stop_at);
  compare_runs(a, b, 6);
  if (dynamic) check_kept_groups(a, 6, 3);
  CHECK_MSG(json_equal(ca.metrics, cb.metrics), "%s: step metrics differ after resume", tag);
  CHECK(json_array_size(ca.metrics) == 6 && json_array_size(cb.metrics) == 6);
  /* with dynamic sampling every kept group carries signal, so the weights moved from step 0
   * (without it, a random model's groups are mostly all wrong: zero advantages) */
  if (dynamic) {
    char p0[512], p6[512];
    snprintf(p0, sizeof p0, "%s/checkpoints/step-0/model.safetensors", a);
    snprintf(p6, sizeof p6, "%s/checkpoints/step-6/model.safetensors", a);
    size_t l0, l6;
    char *x = slurp(p0, &l0), *y = slurp(p6, &l6);
    CHECK(x && y && (l0 != l6 || memcmp(x, y, l0) != 0));
    free(x), free(y);
  }
  json_decref(body);
  json_decref(ca.metrics);
  json_decref(cb.metrics);
}

static int file_exists(const char *dir, int step, const char *name) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/checkpoints/step-%d/%s", dir, step, name);
  return stat(p, &st) == 0;
}

static long file_size(const char *dir, int step, const char *name) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/checkpoints/step-%d/%s", dir, step, name);
  return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* Cancels the run at its first sampling phase: after the step-0 checkpoint, before step 1. */
static void cancel_at_sampling(void *ctx, const char *phase) {
  struct collect *c = ctx;
  if (!strcmp(phase, "sampling")) *c->cancel = 1;
}

/* The step-0 checkpoint holds no optimizer state (AdamW's moments are zeros then); a job resumed
 * from it starts with fresh moments and reaches exactly the weights and optimizer state of the
 * run that never stopped. */
static void test_resume_from_step0(const char *train) {
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/s0-a", tmpdir);
  snprintf(b, sizeof b, "%s/s0-b", tmpdir);
  struct runner_result ra, rb;
  json_t *body = job(train, 3, 1, 0);
  CHECK(run(body, a, NULL, 0, &ra) == RUNNER_SUCCEEDED);
  volatile int flag = 0;
  struct collect cb = {json_array(), 0, &flag};
  json_t *errs = json_array();
  struct job_spec s;
  CHECK(jobspec_parse(body, NULL, &s, errs) == 0);
  struct runner_hooks h = {.ctx = &cb, .phase = cancel_at_sampling};
  struct runner_opts o = {.cancel = &flag, .pool = g_pool};
  runner_run(&s, b, &h, &o, &rb);
  CHECK(rb.status == RUNNER_CANCELLED && runner_latest_checkpoint(b) == 0);
  jobspec_deinit(&s);
  json_decref(errs);
  CHECK(file_exists(b, 0, "model.safetensors") && file_exists(b, 0, "trainer_state.json"));
  CHECK_MSG(!file_exists(b, 0, "optimizer.safetensors"), "step 0 wrote optimizer state");
  CHECK(!file_exists(b, 0, "trainer_weights.safetensors"));
  flag = 0;
  CHECK(run(body, b, NULL, 0, &rb) == RUNNER_SUCCEEDED && rb.step == 3 && rb.resumed_from == 0);
  compare_runs(a, b, 3);
  CHECK(file_exists(a, 3, "optimizer.safetensors"));
  json_decref(body);
  json_decref(cb.metrics);
}

/* A BF16 model folder gives BF16 checkpoints ("auto"): step 0 holds the starting weights exactly
 * in half the bytes of float32, with neither optimizer state nor a float32 copy; later steps add
 * trainer_weights.safetensors (the exact float32 weights), so that a job paused at step 3 and
 * resumed reaches bit for bit what the uninterrupted one did. "float32" asks for float32. */
static void test_bf16_checkpoints(const char *train) {
  char folder[256], a[256], b[256], f[256];
  snprintf(folder, sizeof folder, "%s/tiny-bf16", tmpdir);
  snprintf(a, sizeof a, "%s/bf16-a", tmpdir);
  snprintf(b, sizeof b, "%s/bf16-b", tmpdir);
  snprintf(f, sizeof f, "%s/bf16-f32", tmpdir);
  struct lm lm;
  struct dapo_err e = {0};
  CHECK_MSG(!lm_open("tiny", 3, &lm, &e) && !lm_save(&lm, folder, 1, &e), "%s", e.msg);
  lm_close(&lm);
  json_t *body = job(train, 6, 1, 3);
  json_object_set_new(body, "model", json_string(folder));
  struct runner_result ra, rb;
  CHECK(run(body, a, NULL, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 6);
  CHECK(run(body, b, NULL, 3, &rb) == RUNNER_PAUSED && rb.step == 3);
  CHECK(run(body, b, NULL, 0, &rb) == RUNNER_SUCCEEDED && rb.step == 6 && rb.resumed_from == 3);
  compare_runs(a, b, 6);
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/checkpoints/step-6/trainer_weights.safetensors", a);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-6/trainer_weights.safetensors", b);
  CHECK_MSG(same_file(pa, pb), "the exact weights of step 6 differ after resume");
  CHECK(!file_exists(a, 0, "optimizer.safetensors") &&
        !file_exists(a, 0, "trainer_weights.safetensors"));
  CHECK(file_exists(a, 3, "optimizer.safetensors") &&
        file_exists(a, 3, "trainer_weights.safetensors"));
  /* float32 on request: twice the bytes of the BF16 weights, no extra copy */
  json_object_set_new(body, "checkpoint_dtype", json_string("float32"));
  json_object_set_new(json_object_get(body, "hyperparameters"), "total_steps", json_integer(1));
  CHECK(run(body, f, NULL, 0, &ra) == RUNNER_SUCCEEDED);
  long b16 = file_size(a, 0, "model.safetensors"), b32 = file_size(f, 0, "model.safetensors");
  snprintf(pa, sizeof pa, "%s/model.safetensors", folder);
  struct stat st;
  long src = stat(pa, &st) == 0 ? (long)st.st_size : -1;
  printf("step-0 model.safetensors: source %ld bytes, auto %ld, float32 %ld\n", src, b16, b32);
  CHECK(b16 > 0 && b32 > 0 && b16 <= src + 64 && b32 > 2 * b16 - 4096);
  CHECK(!file_exists(f, 1, "trainer_weights.safetensors"));
  char cfg[512];
  snprintf(cfg, sizeof cfg, "%s/checkpoints/step-0/config.json", a);
  json_t *c = json_load_file(cfg, 0, NULL);
  CHECK(c && !strcmp(json_string_value(json_object_get(c, "torch_dtype")), "bfloat16"));
  json_decref(c);
  json_decref(body);
}

static json_t *last_metrics(const struct collect *c) {
  return json_array_get(c->metrics, json_array_size(c->metrics) - 1);
}
static long metric_int(const json_t *m, const char *key) {
  return (long)json_integer_value(json_object_get(m, key));
}

/* The largest |a - b| over the weights of two checkpoint folders' step `step`. */
static double max_weight_diff(const char *a, const char *b, int step) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/checkpoints/step-%d", a, step);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-%d", b, step);
  struct model *ma = NULL, *mb = NULL;
  struct dapo_err e = {0};
  CHECK_MSG(!ckpt_load(pa, &ma, NULL, &e) && !ckpt_load(pb, &mb, NULL, &e), "%s", e.msg);
  double d = 0;
  for (size_t i = 0; ma && mb && i < ma->n_params; i++) {
    double x = fabs((double)ma->params[i] - (double)mb->params[i]);
    d = x > d ? x : d;
  }
  model_free(ma);
  model_free(mb);
  return d;
}

/* With kl_coef 0 a response whose advantage is 0 is not run through the model (its loss weight is
 * 0 at every token), nor is the first minibatch's old-log-prob pass (its weights have not moved):
 * the weights and the optimizer state equal the computation that runs everything, bit for bit
 * when every micro-batch holds one response (the packing is then the same), within 1e-6
 * otherwise. Rewards vary with the response's length (additive overlong shaping from the
 * second token on), so some groups carry signal and some do not. A step whose advantages are all 0
 * runs nothing at all. */
static void test_skip_zero_advantage(void) {
  char data[256], a[256], b[256];
  snprintf(data, sizeof data, "%s/long.jsonl", tmpdir);
  FILE *f = fopen(data, "w");
  for (int i = 0; i < 40; i++) /* prompts longer than micro_batch_tokens 16: one a micro-batch */
    fprintf(f, "{\"prompt\": \"Add these two numbers: %d+%d=\", \"answer\": \"%d\"}\n", i % 10,
            i / 10, (i % 10 + i / 10) % 10);
  fclose(f);
  for (int packed = 0; packed < 2; packed++) {
    json_t *body = job(data, 2, 0, 0);
    json_t *hp = json_object_get(body, "hyperparameters");
    json_object_set_new(hp, "max_new_tokens", json_integer(16));
    json_object_set_new(hp, "overlong_buffer", json_integer(15));
    json_object_set_new(hp, "overlong_mode", json_string("additive"));
    json_object_set_new(hp, "micro_batch_tokens", json_integer(packed ? 4096 : 16));
    snprintf(a, sizeof a, "%s/skip-%d", tmpdir, packed);
    snprintf(b, sizeof b, "%s/all-%d", tmpdir, packed);
    struct collect ca = {json_array(), 0, NULL}, cb = {json_array(), 0, NULL};
    struct runner_result r;
    CHECK(run(body, a, &ca, 0, &r) == RUNNER_SUCCEEDED);
    g_compute_all = 1;
    CHECK(run(body, b, &cb, 0, &r) == RUNNER_SUCCEEDED);
    g_compute_all = 0;
    long skipped = 0, kept_work = 0;
    for (size_t i = 0; i < json_array_size(ca.metrics); i++) {
      const json_t *m = json_array_get(ca.metrics, i), *mb = json_array_get(cb.metrics, i);
      skipped += metric_int(m, "policy/responses_skipped");
      kept_work += metric_int(m, "tokens/trained");
      CHECK(metric_int(mb, "policy/responses_skipped") == 0);
      CHECK(metric_int(m, "tokens/trained") < metric_int(mb, "tokens/trained"));
      CHECK(metric_int(m, "tokens/old_logprob") < metric_int(mb, "tokens/old_logprob"));
    }
    CHECK_MSG(skipped > 0 && kept_work > 0, "skipped %ld responses, trained %ld tokens", skipped,
              kept_work);
    if (!packed) {
      compare_runs(a, b, 2);
    } else {
      /* sums over differently packed micro-batches round differently: 8 float32 ulps at 1.0,
       * under 1/10,000 of what 4 updates at lr 3e-3 can move a weight */
      double d = max_weight_diff(a, b, 2), bound = 1e-6;
      printf("skipping zero advantages, packed micro-batches: max |dw| %.3g (bound %.3g)\n", d,
             bound);
      CHECK(d <= bound);
    }
    json_decref(body);
    json_decref(ca.metrics);
    json_decref(cb.metrics);
  }

  /* every reward the same: every advantage 0, nothing goes through the model */
  snprintf(data, sizeof data, "%s/nothing.jsonl", tmpdir);
  f = fopen(data, "w");
  for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"%d\", \"answer\": \"unreachable\"}\n", i);
  fclose(f);
  json_t *body = job(data, 1, 0, 0);
  snprintf(a, sizeof a, "%s/zero-skip", tmpdir);
  snprintf(b, sizeof b, "%s/zero-all", tmpdir);
  struct collect ca = {json_array(), 0, NULL}, cb = {json_array(), 0, NULL};
  struct runner_result r;
  CHECK(run(body, a, &ca, 0, &r) == RUNNER_SUCCEEDED);
  g_compute_all = 1;
  CHECK(run(body, b, &cb, 0, &r) == RUNNER_SUCCEEDED);
  g_compute_all = 0;
  const json_t *m = last_metrics(&ca);
  CHECK(metric_int(m, "tokens/trained") == 0 && metric_int(m, "tokens/old_logprob") == 0);
  CHECK(metric_int(m, "policy/responses_skipped") == 2 * 12); /* 2 epochs of 3 x 4 responses */
  CHECK(metric_int(last_metrics(&cb), "tokens/trained") > 0);
  CHECK(metric_int(m, "policy/updates") == metric_int(last_metrics(&cb), "policy/updates"));
  compare_runs(a, b, 1);
  json_decref(body);
  json_decref(ca.metrics);
  json_decref(cb.metrics);
}

/* ---- progress ---- */

/* Every progress report of a run, and each step's training metrics. */
struct progress_run {
  struct collect c;
  json_t *reports; /* [{step, pass, round, done, total, tokens}] */
};

static int on_progress_metrics(void *ctx, const struct runner_metrics *rm) {
  return on_metrics(&((struct progress_run *)ctx)->c, rm);
}

static void on_progress(void *ctx, const struct runner_progress *p) {
  struct progress_run *pr = ctx;
  json_array_append_new(pr->reports,
                        json_pack("{s:I,s:s,s:i,s:I,s:I,s:I}", "step", (json_int_t)p->step, "pass",
                                  p->pass, "round", p->round, "done", (json_int_t)p->done, "total",
                                  (json_int_t)p->total, "tokens", (json_int_t)p->tokens));
}

static int run_progress(json_t *body, const char *out, struct progress_run *pr, int64_t min_work) {
  json_t *errs = json_array();
  struct job_spec s;
  CHECK(jobspec_parse(body, NULL, &s, errs) == 0);
  pr->c = (struct collect){json_array(), 0, NULL};
  pr->reports = json_array();
  struct runner_hooks h = {.ctx = pr, .metrics = on_progress_metrics, .progress = on_progress};
  struct runner_opts o = {.progress_min_work = min_work, .pool = g_pool};
  struct runner_result res;
  runner_run(&s, out, &h, &o, &res);
  jobspec_deinit(&s);
  json_decref(errs);
  return res.status;
}

static long rep_int(const json_t *r, const char *k) {
  return (long)json_integer_value(json_object_get(r, k));
}

/* Progress reports: every pass of a step (each generation round, the evaluation, old-log-prob
 * with the reference's forwards, the update's two epochs) starts at 0, never goes back, keeps its
 * total, reports at most 21 times and ends at its total (the micro-batches counted ahead are
 * those that ran), and its final tokens are the step's metrics; the same run with the default
 * threshold reports nothing on the tiny model, and reporting changes no weight or rollout. */
static void test_progress(const char *train, const char *val) {
  json_t *body = job(train, 2, 1, 0);
  json_object_set_new(body, "validation_file", json_string(val));
  json_t *hp = json_object_get(body, "hyperparameters");
  json_object_set_new(hp, "kl_coef", json_real(0.01));
  json_object_set_new(hp, "eval_every", json_integer(1));
  json_object_set_new(hp, "max_new_tokens", json_integer(6));
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/progress-all", tmpdir);
  snprintf(b, sizeof b, "%s/progress-default", tmpdir);
  struct progress_run pa, pb;
  CHECK(run_progress(body, a, &pa, 0) == RUNNER_SUCCEEDED);
  CHECK(run_progress(body, b, &pb, RUNNER_PROGRESS_MIN_WORK) == RUNNER_SUCCEEDED);
  CHECK_MSG(json_array_size(pb.reports) == 0, "the tiny model reported %zu times by default",
            json_array_size(pb.reports));
  compare_runs(a, b, 2);

  size_t n = json_array_size(pa.reports);
  long gen_tokens[3] = {0}, rounds[3] = {0}, old_tokens[3] = {0}, upd_tokens[3] = {0};
  int passes = 0, evals = 0, throttled = 0;
  for (size_t i = 0; i < n;) {
    const json_t *r0 = json_array_get(pa.reports, i);
    const char *pass = json_string_value(json_object_get(r0, "pass"));
    long step = rep_int(r0, "step"), round = rep_int(r0, "round"), total = rep_int(r0, "total");
    CHECK_MSG(rep_int(r0, "done") == 0 && rep_int(r0, "tokens") == 0 && total > 0,
              "report %zu (%s of step %ld) does not start at 0", i, pass, step);
    size_t j = i + 1;
    const json_t *prev = r0;
    for (; j < n; j++) {
      const json_t *r = json_array_get(pa.reports, j);
      if (rep_int(prev, "done") == total) break; /* the pass ended */
      CHECK_MSG(!strcmp(json_string_value(json_object_get(r, "pass")), pass) &&
                    rep_int(r, "step") == step && rep_int(r, "round") == round &&
                    rep_int(r, "total") == total,
                "%s of step %ld: report %zu belongs to another pass before the end", pass, step, j);
      CHECK(rep_int(r, "done") >= rep_int(prev, "done"));
      CHECK(rep_int(r, "tokens") >= rep_int(prev, "tokens"));
      prev = r;
    }
    CHECK_MSG(rep_int(prev, "done") == total, "%s of step %ld round %ld ended at %ld of %ld", pass,
              step, round, rep_int(prev, "done"), total);
    CHECK_MSG(j - i <= 21, "%s of step %ld: %zu reports", pass, step, j - i);
    throttled += total > 20 && j - i < (size_t)total + 1;
    long tok = rep_int(prev, "tokens");
    if (step >= 1 && step <= 2) {
      if (!strcmp(pass, "generation")) {
        CHECK(total == 3 * 3 * 4 && round == rounds[step] + 1); /* 3 x 3 prompts, G 4 */
        gen_tokens[step] += tok;
        rounds[step]++;
      } else if (!strcmp(pass, "old_logprob")) {
        old_tokens[step] = tok;
      } else if (!strcmp(pass, "update")) {
        upd_tokens[step] = tok;
      }
    }
    evals += !strcmp(pass, "evaluation");
    passes++;
    i = j;
  }
  CHECK_MSG(throttled > 0, "no pass of more than 20 units was thinned out");
  CHECK_MSG(evals == 3, "%d evaluation passes (steps 0, 1, 2)", evals);
  for (int s = 1; s <= 2; s++) {
    const json_t *m = json_array_get(pa.c.metrics, (size_t)s - 1);
    CHECK_MSG(gen_tokens[s] == metric_int(m, "tokens/generated") &&
                  rounds[s] == metric_int(m, "gen/rounds") &&
                  old_tokens[s] == metric_int(m, "tokens/old_logprob") &&
                  upd_tokens[s] == metric_int(m, "tokens/trained"),
              "step %d: progress tokens %ld/%ld/%ld in %ld rounds, metrics %ld/%ld/%ld in %ld", s,
              gen_tokens[s], old_tokens[s], upd_tokens[s], rounds[s],
              metric_int(m, "tokens/generated"), metric_int(m, "tokens/old_logprob"),
              metric_int(m, "tokens/trained"), metric_int(m, "gen/rounds"));
  }
  printf("progress: %zu reports over %d passes\n", n, passes);
  json_decref(body);
  json_decref(pa.reports), json_decref(pb.reports);
  json_decref(pa.c.metrics), json_decref(pb.c.metrics);
}

/* Dynamic sampling never trains on a group whose responses are all right or all wrong, and keeps
 * exactly prompt_batch_size groups, the first ones in generation order. */
static void check_kept_groups(const char *out, int steps, int want) {
  for (int s = 1; s <= steps; s++) {
    char p[512];
    snprintf(p, sizeof p, "%s/rollouts/step-%d.jsonl", out, s);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (!f) continue;
    int correct[4096] = {0}, count[4096] = {0}, kept[4096] = {0}, maxg = -1;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
      json_t *o = json_loads(line, 0, NULL);
      int g = (int)json_integer_value(json_object_get(o, "group"));
      if (g >= 0 && g < 4096) {
        count[g]++;
        correct[g] += json_is_true(json_object_get(o, "correct"));
        kept[g] |= json_is_true(json_object_get(o, "kept"));
        maxg = g > maxg ? g : maxg;
      }
      json_decref(o);
    }
    fclose(f);
    int n_kept = 0, last_kept = -1, mixed_unkept_before_last = 0;
    for (int g = 0; g <= maxg; g++) {
      int mixed = correct[g] > 0 && correct[g] < count[g];
      if (kept[g]) {
        CHECK_MSG(mixed, "step %d group %d kept with %d/%d correct", s, g, correct[g], count[g]);
        n_kept++;
        last_kept = g;
      }
    }
    for (int g = 0; g < last_kept; g++)
      mixed_unkept_before_last += !kept[g] && correct[g] > 0 && correct[g] < count[g];
    CHECK_MSG(mixed_unkept_before_last == 0, "step %d skipped an informative group", s);
    CHECK(n_kept <= want);
  }
}

static void test_cancel_and_shortfall(const char *train) {
  char out[256];
  snprintf(out, sizeof out, "%s/cancel", tmpdir);
  volatile int flag = 0;
  struct collect c = {json_array(), 2, &flag};
  struct runner_result r;
  json_t *body = job(train, 6, 0, 0);
  CHECK(run(body, out, &c, 0, &r) == RUNNER_CANCELLED);
  CHECK(r.step == 2 || r.step == 3);
  json_decref(body);
  json_decref(c.metrics);

  /* answers nobody can produce: every group all wrong; with "error" the job fails and says why */
  char bad[256];
  snprintf(bad, sizeof bad, "%s/impossible.jsonl", tmpdir);
  FILE *f = fopen(bad, "w");
  for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"%d\", \"answer\": \"unreachable\"}\n", i);
  fclose(f);
  body = job(bad, 2, 1, 0);
  json_object_set_new(json_object_get(body, "hyperparameters"), "on_sampling_shortfall",
                      json_string("error"));
  json_object_set_new(json_object_get(body, "hyperparameters"), "max_gen_batches", json_integer(2));
  snprintf(out, sizeof out, "%s/shortfall", tmpdir);
  CHECK(run(body, out, NULL, 0, &r) == RUNNER_FAILED);
  CHECK(r.failure == FAIL_SAMPLING_SHORTFALL && !strcmp(failure_info(r.failure)->category, "user"));
  CHECK_MSG(strstr(r.message, "kept 0 of 3 groups after 2 rounds") != NULL, "%s", r.message);
  /* "partial": trains on nothing, warns, goes on */
  json_object_set_new(json_object_get(body, "hyperparameters"), "on_sampling_shortfall",
                      json_string("partial"));
  snprintf(out, sizeof out, "%s/partial", tmpdir);
  CHECK(run(body, out, NULL, 0, &r) == RUNNER_SUCCEEDED);
  json_decref(body);
}

static void test_spec_errors(void) {
  json_t *body = json_pack("{s:s,s:{s:s,s:s},s:{s:i,s:s},s:i,s:s}", "model", "tiny", "judge",
                           "type", "regex", "pattern", "(", "hyperparameters", "group_size", 1,
                           "loss_agg", "x", "seed", -3, "bogus", "1");
  json_object_set_new(body, "checkpoint_dtype", json_string("float16"));
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  const char *want[] = {
      "training_file",   "seed", "bogus", "hyperparameters.group_size", "hyperparameters.loss_agg",
      "checkpoint_dtype"};
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    int found = 0;
    for (size_t i = 0; i < json_array_size(errs); i++)
      found |=
          !strcmp(json_string_value(json_object_get(json_array_get(errs, i), "field")), want[w]);
    CHECK_MSG(found, "no error for field %s", want[w]);
  }
  int judge_err = 0;
  for (size_t i = 0; i < json_array_size(errs); i++)
    judge_err |=
        !strncmp(json_string_value(json_object_get(json_array_get(errs, i), "field")), "judge", 5);
  CHECK_MSG(judge_err, "the bad regex was not reported under judge.*");
  CHECK(n >= 7);
  jobspec_deinit(&s);
  json_decref(errs);
  json_decref(body);
}

int main(void) {
  CHECK(mkdtemp(tmpdir) != NULL);
  char train[256], small[256];
  snprintf(train, sizeof train, "%s/add.jsonl", tmpdir);
  snprintf(small, sizeof small, "%s/small.jsonl", tmpdir);
  write_dataset(train, 100);
  write_dataset(small, 6); /* 3 prompts a step: an epoch every 2 steps */
  test_resume(train, 1, 3, "dyn");
  /* the same on the compute pool's parallel paths (2 threads, every kernel split) */
  g_pool = pool_new(2);
  kernels_set_par_min_work(0);
  test_resume(train, 1, 3, "dyn-pool");
  kernels_set_par_min_work(32768);
  pool_free(g_pool);
  g_pool = NULL;
  test_resume(small, 0, 2, "epoch-boundary");
  test_skip_zero_advantage();
  test_progress(train, small);
  test_resume_from_step0(train);
  test_bf16_checkpoints(train);
  test_cancel_and_shortfall(train);
  test_spec_errors();
  int rc = check_done("test_runner");
  if (!rc) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  return rc;
}
