/* It learns: the "tiny" preset (98,816 parameters, random initialisation, character tokenizer)
 * trained by DAPO alone with the built-in exact judge on "a+b=" for a, b in 0..4 (25 prompts, the
 * answer one character). Greedy accuracy on the 25 prompts is measured before training and
 * after 150 steps; the test asserts a clear improvement (from <= 0.1 to >= 0.8). The full curve,
 * over several seeds and to >= 0.9, is examples/learn_addition.sh. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runner.h"

struct evals {
  double first, last;
  int n;
};

static int on_metrics(void *ctx, const struct runner_metrics *m) {
  struct evals *ev = ctx;
  const json_t *data = m->data;
  json_t *acc = json_object_get(data, "eval/accuracy");
  if (!m->eval || !acc) return 0;
  if (ev->n++ == 0) ev->first = json_real_value(acc);
  ev->last = json_real_value(acc);
  fprintf(stderr, "step %lld: greedy accuracy %.2f\n",
          (long long)json_integer_value(json_object_get(data, "step")), ev->last);
  return 0;
}

int main(void) {
  char dir[] = "/tmp/dapo-learn-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char data[256], out[256];
  snprintf(data, sizeof data, "%s/add.jsonl", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  FILE *f = fopen(data, "w");
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++)
      fprintf(f, "{\"prompt\":\"%d+%d=\",\"answer\":\"%d\"}\n", a, b, a + b);
  fclose(f);
  json_t *body =
      json_pack("{s:s,s:s,s:s,s:{s:s},s:i,s:{s:i,s:i,s:i,s:i,s:f,s:i,s:i,s:f,s:i,s:i,s:i}}",
                "model", "tiny", "training_file", data, "validation_file", data, "judge", "type",
                "exact", "seed", 3, "hyperparameters", "total_steps", 150, "max_new_tokens", 1,
                "group_size", 16, "prompt_batch_size", 16, "learning_rate", 5e-4, "eval_every", 50,
                "eval_samples", 1, "eval_temperature", 0.0, "gen_batch_multiplier", 2,
                "max_gen_batches", 10, "minibatch_size", 64);
  json_t *errs = json_array();
  struct job_spec spec;
  CHECK(jobspec_parse(body, NULL, &spec, errs) == 0);
  struct evals ev = {0};
  struct runner_hooks h = {.ctx = &ev, .metrics = on_metrics};
  struct runner_result res;
  runner_run(&spec, out, &h, NULL, &res);
  CHECK_MSG(res.status == RUNNER_SUCCEEDED, "%s: %s", failure_info(res.failure)->name, res.message);
  CHECK(ev.n == 4); /* steps 0, 50, 100, 150 */
  CHECK_MSG(ev.first <= 0.1, "accuracy before training %.2f", ev.first);
  CHECK_MSG(ev.last >= 0.8, "accuracy after 150 steps %.2f", ev.last);
  jobspec_deinit(&spec);
  json_decref(errs);
  json_decref(body);
  int rc = check_done("test_learn");
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}
