/* Multi-turn episodes of the job runner (core/rl/runner_episode.c) with the example tools of
 * clients/tools/example_tools.py, started here on a free loopback port (Debian's
 * /usr/bin/python3; skipped with 77 when it is missing):
 * - every rollouts line is an episode whose token_ids and loss_mask line up: the mask is 1 on
 *   the assistant turns' tokens (their logprobs one each) and 0 on the tool turns' (each the
 *   tokenization of its content), the trained tokens are response_token_ids, finish reasons
 *   and tool calls as the turns say;
 * - two runs give the same rollouts and weights bit for bit (the tools answer at their own
 *   pace), and a run paused after step 2 and resumed reaches the straight run's step 4;
 * - `episode` with one turn and no tools trains exactly as a job without it;
 * - the body's `episode` refused field by field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "files.h"
#include "pool.h"
#include "runner.h"
#include "watchdog.h"

#ifndef DAPO_EXAMPLE_TOOLS_SCRIPT
#define DAPO_EXAMPLE_TOOLS_SCRIPT "example_tools.py"
#endif
#define PYTHON "/usr/bin/python3"

static char tmpdir[] = "/tmp/dapo-episodes-XXXXXX";
static struct child tools;
static char train[300];
/* the daemon's way: a pool of compute threads, OpenBLAS one thread inside each of its tasks
 * (without one the runner is serial and OpenBLAS runs threads of its own) */
static struct pool *g_pool;

/* An episode job on the tiny preset: lookups of a code only the tool knows. */
static json_t *job(int steps, json_t *episode) {
  json_t *b = json_pack("{s:s, s:s, s:{s:s}, s:i, s:{s:i, s:i, s:i, s:i, s:f, s:i, s:i, s:i}}",
                        "model", "tiny", "training_file", train, "judge", "type", "exact", "seed",
                        3, "hyperparameters", "total_steps", steps, "group_size", 16,
                        "prompt_batch_size", 16, "max_new_tokens", 4, "learning_rate", 3e-3,
                        "checkpoint_every", 2, "minibatch_size", 64, "micro_batch_tokens", 512);
  if (episode) json_object_set_new(b, "episode", episode);
  return b;
}

static json_t *lookup_episode(void) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/lookup", tools.port);
  return json_pack("{s:i, s:i, s:[{s:s, s:{s:s, s:{s:s}}, s:s, s:i}]}", "max_turns", 3,
                   "max_new_tokens_per_turn", 2, "tools", "type", "function", "function", "name",
                   "lookup", "parameters", "type", "object", "url", url, "concurrency", 3);
}

static int run(json_t *body, const char *out, int stop_after, struct runner_result *res) {
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  if (n) {
    char *d = json_dumps(errs, 0);
    fprintf(stderr, "spec errors: %s\n", d);
    free(d);
  }
  CHECK(n == 0);
  struct runner_opts o = {.stop_after_step = stop_after, .pool = g_pool};
  runner_run(&s, out, NULL, &o, res);
  if (res->status == RUNNER_FAILED)
    fprintf(stderr, "run failed: %s: %s\n", failure_info(res->failure)->name, res->message);
  jobspec_deinit(&s);
  json_decref(errs);
  return res->status;
}

static int same_run(const char *a, const char *b, int step) {
  char pa[512], pb[512];
  int same = 1;
  snprintf(pa, sizeof pa, "%s/checkpoints/step-%d/model.safetensors", a, step);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-%d/model.safetensors", b, step);
  same &= same_file(pa, pb);
  for (int s = 1; s <= step; s++) {
    snprintf(pa, sizeof pa, "%s/rollouts/step-%d.jsonl", a, s);
    snprintf(pb, sizeof pb, "%s/rollouts/step-%d.jsonl", b, s);
    same &= same_file(pa, pb);
  }
  return same;
}

/* The episodes of one rollouts file, checked line by line; returns the tool calls seen. */
static int check_rollouts(const char *out, int step) {
  char p[512];
  snprintf(p, sizeof p, "%s/rollouts/step-%d.jsonl", out, step);
  FILE *f = fopen(p, "r");
  CHECK_MSG(f != NULL, "no %s", p);
  if (!f) return 0;
  char line[1 << 16];
  int calls = 0, lines = 0;
  while (fgets(line, sizeof line, f)) {
    json_t *r = json_loads(line, 0, NULL);
    const json_t *ids = json_object_get(r, "token_ids"), *mask = json_object_get(r, "loss_mask"),
                 *turns = json_object_get(r, "turns"),
                 *model = json_object_get(r, "response_token_ids");
    CHECK(json_array_size(ids) == json_array_size(mask) && json_array_size(turns) >= 1);
    size_t at = 0, trained = 0;
    int bad = 0;
    for (size_t k = 0; k < json_array_size(turns); k++) {
      const json_t *t = json_array_get(turns, k), *tid = json_object_get(t, "token_ids");
      int assistant = !strcmp(json_string_value(json_object_get(t, "role")), "assistant");
      if (assistant) {
        bad |= json_array_size(json_object_get(t, "logprobs")) != json_array_size(tid);
        calls += (int)json_array_size(json_object_get(t, "tool_calls"));
      } else {
        bad |= strcmp(json_string_value(json_object_get(t, "role")), "tool") != 0;
      }
      for (size_t q = 0; q < json_array_size(tid); q++, at++) {
        bad |= json_integer_value(json_array_get(tid, q)) !=
               json_integer_value(json_array_get(ids, at));
        bad |= json_integer_value(json_array_get(mask, at)) != assistant;
        if (assistant)
          bad |= json_integer_value(json_array_get(model, trained++)) !=
                 json_integer_value(json_array_get(tid, q));
      }
    }
    CHECK_MSG(!bad && at == json_array_size(ids) && trained == json_array_size(model),
              "%s line %d: turns, token_ids and loss_mask disagree", p, lines + 1);
    const char *fin = json_string_value(json_object_get(r, "finish_reason"));
    CHECK(fin && (!strcmp(fin, "stop") || !strcmp(fin, "length") || !strcmp(fin, "max_turns") ||
                  !strcmp(fin, "truncated")));
    CHECK(json_integer_value(json_object_get(r, "length")) == (json_int_t)trained);
    json_decref(r);
    lines++;
  }
  fclose(f);
  CHECK(lines >= 16 * 16 && lines % 16 == 0); /* groups of 16, dynamic sampling's rounds */
  return calls;
}

static void test_episodes(void) {
  char a[300], b[300], c[300];
  snprintf(a, sizeof a, "%s/ep-a", tmpdir);
  snprintf(b, sizeof b, "%s/ep-b", tmpdir);
  snprintf(c, sizeof c, "%s/ep-c", tmpdir);
  json_t *body = job(4, lookup_episode());
  struct runner_result ra, rb, rc;
  watchdog_section("episodes: run a");
  CHECK(run(body, a, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 4);
  int calls = 0;
  for (int s = 1; s <= 4; s++) calls += check_rollouts(a, s);
  /* a random model writes '@' first about once in 98 episodes: over a thousand episodes, some
   * called the tool (none: less likely than 1 in 10,000) */
  CHECK_MSG(calls > 0, "no tool call in 4 steps of 256 episodes or more");
  watchdog_section("episodes: run b");
  CHECK(run(body, b, 0, &rb) == RUNNER_SUCCEEDED);
  CHECK_MSG(same_run(a, b, 4), "two runs of the same episode job differ");
  watchdog_section("episodes: run c, paused and resumed");
  CHECK(run(body, c, 2, &rc) == RUNNER_PAUSED && rc.step == 2);
  CHECK(run(body, c, 0, &rc) == RUNNER_SUCCEEDED && rc.step == 4 && rc.resumed_from == 2);
  CHECK_MSG(same_run(a, c, 4), "an episode job paused and resumed differs from a straight run");
  fprintf(stderr, "episodes: %d tool calls in 4 steps; two runs and a resumed run agree\n", calls);
  json_decref(body);
}

/* `episode` with one turn and no tools is the single-turn job: the same rollouts and weights. */
static void test_one_turn(void) {
  char a[300], b[300];
  snprintf(a, sizeof a, "%s/one-a", tmpdir);
  snprintf(b, sizeof b, "%s/one-b", tmpdir);
  json_t *plain = job(2, NULL), *one = job(2, json_pack("{s:i}", "max_turns", 1));
  struct runner_result ra, rb;
  CHECK(run(plain, a, 0, &ra) == RUNNER_SUCCEEDED && run(one, b, 0, &rb) == RUNNER_SUCCEEDED);
  CHECK_MSG(same_run(a, b, 2), "one turn without tools differs from a job without `episode`");
  json_decref(plain);
  json_decref(one);
}

static void test_refusals(void) {
  static const struct {
    const char *episode, *field, *why;
  } BAD[] = {
      {"[]", "episode", "expected an object"},
      {"{\"turns\": 2}", "episode.turns", "unknown field"},
      {"{\"max_turns\": 0}", "episode.max_turns", "expected an integer from 1 to 64"},
      {"{\"max_turns\": 2}", "episode.max_turns", "more than one turn needs someone"},
      {"{\"max_new_tokens_per_turn\": 5}", "episode.max_new_tokens_per_turn",
       "expected an integer from 1 to 4"},
      {"{\"reward\": \"sum\"}", "episode.reward", "need an episode.environment"},
      {"{\"reward\": \"best\"}", "episode.reward", "expected \"judge\""},
      {"{\"environment\": {\"type\": \"http\"}}", "episode.environment", "not supported yet"},
      {"{\"tool_format\": \"xml\"}", "episode.tool_format", "expected \"auto\" or \"dapod\""},
      {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": "
       "\"http://example.com/\"}]}",
       "episode.tools[0].url", "is not in the judge host allowlist"},
      {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
       "{\"type\": \"object\", \"not\": {}}}, \"url\": \"http://127.0.0.1/\"}]}",
       "episode.tools[0].function.parameters.not", "not supported"},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    json_t *ep = json_loads(BAD[i].episode, JSON_DECODE_ANY, NULL);
    json_t *body = job(1, ep), *errs = json_array();
    struct job_spec s;
    jobspec_parse(body, NULL, &s, errs);
    int found = 0;
    size_t k;
    json_t *x;
    json_array_foreach(errs, k, x) {
      found |= !strcmp(json_string_value(json_object_get(x, "field")), BAD[i].field) &&
               strstr(json_string_value(json_object_get(x, "message")), BAD[i].why);
    }
    char *d = json_dumps(errs, 0);
    CHECK_MSG(found, "%s: no %s error '%s' in %s", BAD[i].episode, BAD[i].field, BAD[i].why, d);
    free(d);
    jobspec_deinit(&s);
    json_decref(body);
    json_decref(errs);
  }
  /* the resolved episode in the job's spec */
  json_t *body = job(1, lookup_episode()), *errs = json_array();
  struct job_spec s;
  CHECK(jobspec_parse(body, NULL, &s, errs) == 0);
  json_t *js = jobspec_to_json(&s), *ep = json_object_get(js, "episode");
  CHECK(json_integer_value(json_object_get(ep, "max_turns")) == 3 &&
        json_integer_value(json_object_get(ep, "max_new_tokens_per_turn")) == 2 &&
        json_integer_value(json_object_get(ep, "max_episode_tokens")) == 4 + 2 * 64 &&
        !strcmp(json_string_value(json_object_get(ep, "reward")), "judge") &&
        !strcmp(json_string_value(json_object_get(ep, "tool_format")), "auto"));
  json_decref(js);
  jobspec_deinit(&s);
  json_decref(body);
  json_decref(errs);
}

int main(void) {
  if (access(PYTHON, X_OK)) {
    fprintf(stderr, "test_episodes: skipped (%s is missing)\n", PYTHON);
    return 77;
  }
  /* ctest stops it at 600 s; a hang says where before that (once seen under ThreadSanitizer on
   * CI's machine, after the first part) */
  watchdog_start(540);
  g_pool = pool_new(2);
  if (!mkdtemp(tmpdir)) return 1;
  snprintf(train, sizeof train, "%s/codes.jsonl", tmpdir);
  FILE *f = fopen(train, "w");
  for (int k = 0; k < 40; k++)
    fprintf(f, "{\"prompt\": \"code %d?\", \"answer\": \"%d\"}\n", k, (k * 7 + 3) % 10);
  fclose(f);
  const char *argv[] = {PYTHON, DAPO_EXAMPLE_TOOLS_SCRIPT, NULL};
  CHECK(child_start(&tools, argv) == 0);
  if (tools.pid > 0) {
    test_episodes();
    watchdog_section("refusals");
    test_refusals();
  }
  watchdog_section("one turn");
  test_one_turn();
  watchdog_section("stopping the tools");
  child_stop(&tools);
  watchdog_section("cleaning up");
  pool_free(g_pool);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_episodes");
}
