/* Multi-turn episodes of the job runner (core/rl/runner_episode.c) with the example tools of
 * clients/tools/example_tools.py and the stand-in environment tests/rl/env_server.py, started
 * here on free loopback ports (Debian's /usr/bin/python3; skipped with 77 when it is missing):
 * - every rollouts line is an episode whose token_ids and loss_mask line up: the mask is 1 on
 *   the assistant turns' tokens (their logprobs one each) and 0 on the tool turns' (each the
 *   tokenization of its content), the trained tokens are response_token_ids, finish reasons
 *   and tool calls as the turns say;
 * - two runs give the same rollouts and weights bit for bit (the tools answer at their own
 *   pace), and a run paused after step 2 and resumed reaches the straight run's step 4;
 * - `episode` with one turn and no tools trains exactly as a job without it;
 * - an environment's episodes: /reset's observation after the prompt, each turn a /step whose
 *   observation follows it, the episode ended by `done` or its limits and closed; rewards as the
 *   environment gave them (`environment` and `sum`); the same rollouts and weights twice, when
 *   resumed, and when every call needs a retry; failures under on_env_error fail and drop;
 * - the body's `episode` refused field by field;
 * - a line's `tools` bind to the job's tools of their names: a turn on a line may call only the
 *   tools the line lists (another of the job's is an unknown tool, answered and counted), a bare
 *   '@' calls the line's one tool, and a line that names a tool the job lacks is refused at
 *   submission and when the job starts; a single-turn job's response calls its line's tools for
 *   the graders (sample.output_tools), nothing runs. */
#include <ctype.h>
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
#ifndef DAPO_ENV_SERVER_SCRIPT
#define DAPO_ENV_SERVER_SCRIPT "env_server.py"
#endif
#define PYTHON "/usr/bin/python3"

static char tmpdir[] = "/tmp/dapo-episodes-XXXXXX";
static struct child tools, env;
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

/* An environment episode on env_server.py's game at base ("/guess", "/flaky", ...). */
static json_t *env_episode(const char *base, const char *reward, const char *on_error, int retries,
                           int concurrency) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", env.port, base);
  json_t *e = json_pack("{s:i, s:i, s:{s:s, s:s, s:i, s:i}, s:s}", "max_turns", 3,
                        "max_new_tokens_per_turn", 2, "environment", "type", "http", "url", url,
                        "max_retries", retries, "concurrency", concurrency, "reward", reward);
  if (on_error) json_object_set_new(e, "on_env_error", json_string(on_error));
  return e;
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

/* body (what) runs again into b, and into c paused after step pause_at then resumed: both reach
 * the same rollouts and weights at `steps` as the straight run in a. */
static void check_repeatable(json_t *body, const char *a, const char *b, const char *c, int steps,
                             int pause_at, const char *what) {
  struct runner_result rb, rc;
  watchdog_section("run b");
  CHECK(run(body, b, 0, &rb) == RUNNER_SUCCEEDED);
  CHECK_MSG(same_run(a, b, steps), "%s: two runs differ", what);
  watchdog_section("run c, paused and resumed");
  CHECK(run(body, c, pause_at, &rc) == RUNNER_PAUSED && rc.step == pause_at);
  CHECK(run(body, c, 0, &rc) == RUNNER_SUCCEEDED && rc.step == steps &&
        rc.resumed_from == pause_at);
  CHECK_MSG(same_run(a, c, steps), "%s: paused and resumed, it differs from a straight run", what);
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

/* An environment's episodes of one rollouts file, checked line by line against the game of
 * env_server.py; sum: the reward is the judge's plus the environment's. Returns the episodes
 * the environment ended (done); *lines gets the episodes. */
static int check_env_rollouts(const char *out, int step, int sum, int *lines) {
  char p[512];
  snprintf(p, sizeof p, "%s/rollouts/step-%d.jsonl", out, step);
  FILE *f = fopen(p, "r");
  CHECK_MSG(f != NULL, "no %s", p);
  if (!f) return 0;
  char line[1 << 16];
  int done = 0;
  *lines = 0;
  while (fgets(line, sizeof line, f)) {
    json_t *r = json_loads(line, 0, NULL);
    const json_t *ids = json_object_get(r, "token_ids"), *mask = json_object_get(r, "loss_mask"),
                 *turns = json_object_get(r, "turns"), *rewards = json_object_get(r, "env_rewards");
    size_t at = 0;
    int bad = 0;
    double total = 0;
    int any = 0;
    for (size_t k = 0; k < json_array_size(turns); k++) {
      const json_t *t = json_array_get(turns, k), *tid = json_object_get(t, "token_ids");
      const char *role = json_string_value(json_object_get(t, "role"));
      int assistant = !strcmp(role, "assistant");
      /* the world first, then the model and the world by turns */
      bad |= assistant != (int)(k % 2) || (!assistant && strcmp(role, "environment"));
      if (k == 0)
        bad |= strcmp(json_string_value(json_object_get(t, "content")), ">digits\n>guess") != 0;
      if (!assistant) {
        const json_t *rw = json_object_get(t, "reward");
        bad |= !json_equal((json_t *)rw, json_array_get(rewards, k / 2));
        if (json_is_number(rw)) total += json_number_value(rw), any = 1;
      }
      for (size_t q = 0; q < json_array_size(tid); q++, at++) {
        bad |= json_integer_value(json_array_get(tid, q)) !=
               json_integer_value(json_array_get(ids, at));
        bad |= json_integer_value(json_array_get(mask, at)) != assistant;
      }
    }
    const char *fin = json_string_value(json_object_get(r, "finish_reason"));
    const json_t *last = json_array_get(turns, json_array_size(turns) - 1);
    bad |=
        at != json_array_size(ids) || json_array_size(rewards) != (json_array_size(turns) + 1) / 2;
    bad |= !fin || (strcmp(fin, "done") && strcmp(fin, "max_turns") && strcmp(fin, "length") &&
                    strcmp(fin, "truncated"));
    if (fin && !strcmp(fin, "done")) {
      done++;
      bad |= !json_is_true(json_object_get(last, "done")) ||
             json_real_value(json_object_get(last, "reward")) != 1.0 ||
             json_array_size(json_object_get(last, "token_ids")) != 0;
    }
    const json_t *er = json_object_get(r, "env_reward");
    bad |= any ? fabs(json_number_value(er) - total) > 1e-9 : !json_is_null(er);
    double raw = json_number_value(json_object_get(r, "reward_raw"));
    if (sum)
      bad |= fabs(fabs(raw - total) - 1) > 1e-9; /* the exact judge's -1 or 1 */
    else
      bad |= fabs(raw - total) > 1e-9;
    CHECK_MSG(!bad, "%s line %d: the episode disagrees with the environment's game: %.300s", p,
              *lines + 1, line);
    json_decref(r);
    ++*lines;
  }
  fclose(f);
  return done;
}

/* The environment's log: every episode of the job reset once, stepped turn by turn from 0,
 * closed once; a group's episodes share their seed, and groups differ. */
static char env_log[300];
static void check_env_log(const char *base) {
  size_t len;
  char *text = slurp(env_log, &len), *save = NULL;
  CHECK_MSG(text != NULL, "no log from the environment");
  json_t *log = json_array();
  for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
    json_array_append_new(log, json_loads(l, 0, NULL));
  free(text);
  json_t *eps = json_object();
  size_t i;
  json_t *e;
  int bad = 0, groups_differ = 0;
  json_array_foreach(log, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "base")), base)) continue;
    const json_t *b = json_object_get(e, "body");
    const char *id = json_string_value(json_object_get(b, "episode_id")),
               *route = json_string_value(json_object_get(e, "route"));
    json_t *st = json_object_get(eps, id);
    if (!st)
      json_object_set_new(eps, id,
                          st = json_pack("{s:i, s:i, s:i}", "resets", 0, "steps", 0, "closes", 0));
    if (!strcmp(route, "reset")) {
      json_object_set_new(st, "resets",
                          json_integer(json_integer_value(json_object_get(st, "resets")) + 1));
      json_object_set(st, "seed", json_object_get(b, "seed"));
    } else if (!strcmp(route, "step")) {
      long k = json_integer_value(json_object_get(st, "steps"));
      bad |= json_integer_value(json_object_get(b, "turn")) != k;
      json_object_set_new(st, "steps", json_integer(k + 1));
    } else {
      json_object_set_new(st, "closes",
                          json_integer(json_integer_value(json_object_get(st, "closes")) + 1));
    }
  }
  const char *id;
  json_t *st;
  json_object_foreach(eps, id, st) {
    bad |= json_integer_value(json_object_get(st, "resets")) != 1 ||
           json_integer_value(json_object_get(st, "closes")) != 1;
    /* "s1-r0-g3-7": its group's first episode "s1-r0-g3-0" has its seed */
    char first[96];
    snprintf(first, sizeof first, "%s", id);
    char *dash = strrchr(first, '-');
    if (dash) strcpy(dash + 1, "0");
    const json_t *f0 = json_object_get(eps, first);
    bad |= !f0 || !json_equal(json_object_get(f0, "seed"), json_object_get(st, "seed"));
    groups_differ |= !strstr(id, "-g0-") &&
                     !json_equal(json_object_get(st, "seed"),
                                 json_object_get(json_object_get(eps, "s1-r0-g0-0"), "seed"));
  }
  CHECK_MSG(json_object_size(eps) >= 256 && !bad && groups_differ,
            "%s: %zu episodes; each reset, stepped from turn 0 and closed once, a group's seed "
            "shared: %s",
            base, json_object_size(eps), bad ? "no" : "yes");
  json_decref(eps);
  json_decref(log);
}

/* An environment job of `steps` steps; two generation rounds at most (a random model's groups
 * are often all wrong: ten rounds of 256 episodes would only make the test slow). */
static json_t *env_job(int steps, json_t *episode) {
  json_t *b = job(steps, episode);
  json_object_set_new(json_object_get(b, "hyperparameters"), "max_gen_batches", json_integer(2));
  return b;
}

static void test_environment(void) {
  char a[300], b[300], c[300], d[300];
  snprintf(a, sizeof a, "%s/env-a", tmpdir);
  snprintf(b, sizeof b, "%s/env-b", tmpdir);
  snprintf(c, sizeof c, "%s/env-c", tmpdir);
  snprintf(d, sizeof d, "%s/env-d", tmpdir);
  json_t *body = env_job(2, env_episode("/guess", "environment", NULL, 2, 8));
  struct runner_result ra, rb;
  CHECK(run(body, a, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 2);
  int done = 0, lines = 0, n;
  for (int s = 1; s <= 2; s++) done += check_env_rollouts(a, s, 0, &n), lines += n;
  CHECK_MSG(lines >= 2 * 256 && done > 0, "%d episodes, %d of them done", lines, done);
  check_env_log("/guess");
  check_repeatable(body, a, b, c, 2, 1, "an environment job");
  json_decref(body);
  fprintf(stderr,
          "environment: %d episodes in 2 steps, %d ended by the environment; two runs "
          "and a resumed run agree\n",
          lines, done);

  /* every call failing once: the retries leave no trace in the rollouts */
  watchdog_section("environment: flaky");
  body = env_job(1, env_episode("/flaky", "environment", NULL, 2, 64));
  CHECK(run(body, d, 0, &rb) == RUNNER_SUCCEEDED);
  char pa[512], pd[512];
  snprintf(pa, sizeof pa, "%s/rollouts/step-1.jsonl", a);
  snprintf(pd, sizeof pd, "%s/rollouts/step-1.jsonl", d);
  CHECK_MSG(same_file(pa, pd), "retried calls changed the episodes");
  json_decref(body);

  /* the judge's reward and the environment's added */
  watchdog_section("environment: sum");
  snprintf(d, sizeof d, "%s/env-sum", tmpdir);
  body = env_job(1, env_episode("/guess", "sum", NULL, 2, 16));
  CHECK(run(body, d, 0, &rb) == RUNNER_SUCCEEDED);
  check_env_rollouts(d, 1, 1, &n);
  json_decref(body);

  /* done at /reset: episodes without a turn, the reset's reward theirs */
  snprintf(d, sizeof d, "%s/env-done", tmpdir);
  body = env_job(1, env_episode("/done", "environment", NULL, 2, 8));
  CHECK(run(body, d, 0, &rb) == RUNNER_SUCCEEDED);
  snprintf(pd, sizeof pd, "%s/rollouts/step-1.jsonl", d);
  size_t len;
  char *text = slurp(pd, &len);
  CHECK_MSG(text && strstr(text, "\"finish_reason\":\"done\"") && !strstr(text, "\"assistant\"") &&
                strstr(text, "\"env_reward\":0.5"),
            "episodes done at /reset: %.300s", text ? text : "(none)");
  free(text);
  json_decref(body);

  /* failures: the job fails quoting them, or the episodes leave the step */
  watchdog_section("environment: failures");
  static const struct {
    const char *base, *why;
  } FAILS[] = {{"/down", "/reset failed (HTTP 500 after 1 attempt)"},
               {"/garbage", "/step failed (malformed reply: the reply is not a JSON object"},
               {"/badobs", "observation: expected a string"}};
  for (size_t i = 0; i < sizeof FAILS / sizeof FAILS[0]; i++) {
    snprintf(d, sizeof d, "%s/env-fail-%zu", tmpdir, i);
    body = env_job(1, env_episode(FAILS[i].base, "environment", "fail", 0, 4));
    CHECK(run(body, d, 0, &rb) == RUNNER_FAILED && rb.failure == FAIL_ENVIRONMENT_ERROR &&
          !strcmp(rb.param, "episode.environment"));
    CHECK_MSG(strstr(rb.message, FAILS[i].why), "%s: '%s' without '%s'", FAILS[i].base, rb.message,
              FAILS[i].why);
    json_decref(body);
  }
  snprintf(d, sizeof d, "%s/env-drop", tmpdir);
  body = env_job(1, env_episode("/down", "environment", "drop", 0, 8));
  CHECK(run(body, d, 0, &rb) == RUNNER_SUCCEEDED);
  snprintf(pd, sizeof pd, "%s/rollouts/step-1.jsonl", d);
  text = slurp(pd, &len);
  CHECK_MSG(text && strstr(text, "\"finish_reason\":\"error\"") &&
                !strstr(text, "\"finish_reason\":\"done\"") && strstr(text, "HTTP 500"),
            "dropped episodes: %.300s", text ? text : "(none)");
  free(text);
  json_decref(body);
}

static void test_episodes(void) {
  char a[300], b[300], c[300];
  snprintf(a, sizeof a, "%s/ep-a", tmpdir);
  snprintf(b, sizeof b, "%s/ep-b", tmpdir);
  snprintf(c, sizeof c, "%s/ep-c", tmpdir);
  json_t *body = job(4, lookup_episode());
  struct runner_result ra;
  watchdog_section("episodes: run a");
  CHECK(run(body, a, 0, &ra) == RUNNER_SUCCEEDED && ra.step == 4);
  int calls = 0;
  for (int s = 1; s <= 4; s++) calls += check_rollouts(a, s);
  /* a random model writes '@' first about once in 98 episodes: over a thousand episodes, some
   * called the tool (none: less likely than 1 in 10,000) */
  CHECK_MSG(calls > 0, "no tool call in 4 steps of 256 episodes or more");
  check_repeatable(body, a, b, c, 4, 2, "an episode job with tools");
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

/* The job's 52 tools "a".."z", "A".."Z" (every one the lookup) that a random model's "@X" turn
 * calls; a line lists the lower-case ones, the upper-case ones, one ("k") or none. */
static json_t *letters_episode(void) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/lookup", tools.port);
  json_t *ts = json_array();
  for (int i = 0; i < 52; i++) {
    char name[2] = {(char)(i < 26 ? 'a' + i : 'A' + i - 26), 0};
    json_array_append_new(ts, json_pack("{s:s, s:{s:s}, s:s, s:i}", "type", "function", "function",
                                        "name", name, "url", url, "concurrency", 4));
  }
  return json_pack("{s:i, s:i, s:o}", "max_turns", 3, "max_new_tokens_per_turn", 2, "tools", ts);
}

/* A line's tools: "kind" (lower, upper, k, any) and the list as JSON text. */
static const char *line_tools(int k, const char **kind) {
  static char list[4096];
  static const char *const kinds[] = {"lower", "upper", "k", "any"};
  *kind = kinds[k % 4];
  int w = snprintf(list, sizeof list, "[");
  for (int i = 0; i < 26 && k % 4 < 2; i++)
    w += snprintf(list + w, sizeof list - (size_t)w,
                  "%s{\"type\": \"function\", \"function\": {\"name\": \"%c\"}}", i ? ", " : "",
                  (k % 4 ? 'A' : 'a') + i);
  if (k % 4 == 2)
    w += snprintf(list + w, sizeof list - (size_t)w,
                  "{\"type\": \"function\", \"function\": {\"name\": \"k\"}}");
  snprintf(list + w, sizeof list - (size_t)w, "]");
  return k % 4 == 3 ? "null" : list;
}

/* Whether the one-letter tool name may be called on a line of kind. */
static int listed(const char *kind, const char *name) {
  if (!strcmp(kind, "any")) return 1;
  if (!strcmp(kind, "k")) return !strcmp(name, "k");
  return strlen(name) == 1 && (!strcmp(kind, "lower") ? islower(name[0]) : isupper(name[0]));
}

/* An episode job over the lines of path, rendered by the OpenAI route's template for presets. */
static json_t *lines_job(int steps, const char *path) {
  json_t *body = job(steps, letters_episode());
  json_object_set_new(body, "training_file", json_string(path));
  json_object_set_new(body, "chat_template",
                      json_pack("{s:s, s:s, s:s}", "system", "{content}\n", "user", "{content}",
                                "assistant", "{content}\n"));
  return body;
}

/* Writes n lines "code K?" to tmpdir/name.jsonl (path), line K with the tools of
 * line_tools(kinds[K % n_kinds]) and the id "<kind>-K", the answer when with_answer (else the RFT
 * form); out: the folder tmpdir/name. */
static void write_tool_lines(const char *name, int n, const int *kinds, int n_kinds,
                             int with_answer, char *path, char *out) {
  snprintf(path, 300, "%s/%s.jsonl", tmpdir, name);
  snprintf(out, 300, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  for (int k = 0; f && k < n; k++) {
    const char *kind, *list = line_tools(kinds[k % n_kinds], &kind);
    char answer[32] = "";
    if (with_answer) snprintf(answer, sizeof answer, "\"answer\": \"%d\", ", (k * 7 + 3) % 10);
    fprintf(f,
            "{\"id\": \"%s-%d\", \"messages\": [{\"role\": \"user\", \"content\": \"code %d?\"}], "
            "%s\"tools\": %s}\n",
            kind, k, k, answer, list);
  }
  if (f) fclose(f);
}

/* Every line of out's rollouts files of steps 1..steps, parsed, in order. */
static json_t *all_rollouts(const char *out, int steps) {
  json_t *all = json_array();
  for (int s = 1; s <= steps; s++) {
    char p[512], line[1 << 16];
    snprintf(p, sizeof p, "%s/rollouts/step-%d.jsonl", out, s);
    FILE *r = fopen(p, "r");
    CHECK_MSG(r != NULL, "no %s", p);
    while (r && fgets(line, sizeof line, r)) json_array_append_new(all, json_loads(line, 0, NULL));
    if (r) fclose(r);
  }
  return all;
}

static void test_line_tools(void) {
  char path[300], out[300];
  static const int kinds[] = {0, 1, 2, 3};
  write_tool_lines("lines", 40, kinds, 4, 1, path, out);
  json_t *body = lines_job(6, path);
  struct runner_result res;
  CHECK(run(body, out, 0, &res) == RUNNER_SUCCEEDED);
  int calls = 0, unknown = 0, bare = 0, several = 0;
  json_t *ros = all_rollouts(out, 6), *ro;
  size_t ri;
  json_array_foreach(ros, ri, ro) {
    const json_t *turns = json_object_get(ro, "turns");
    const char *id = json_string_value(json_object_get(ro, "id"));
    char kind[8] = "";
    sscanf(id ? id : "", "%7[a-z]-", kind);
    for (size_t k = 0; k < json_array_size(turns); k++) {
      const json_t *t = json_array_get(turns, k), *tc = json_object_get(t, "tool_calls");
      const char *text = json_string_value(json_object_get(t, "content"));
      const char *why = json_string_value(json_object_get(t, "malformed"));
      for (size_t c = 0; c < json_array_size(tc); c++) {
        const char *name = json_string_value(json_object_get(json_array_get(tc, c), "name"));
        CHECK_MSG(name && listed(kind, name), "rollout %zu: a call of '%s' on a line of %s tools",
                  ri, name ? name : "?", kind);
        calls++;
        bare += text && !strcmp(kind, "k") && !strncmp(text, "@", 1) && !isalpha(text[1]);
      }
      char name[8] = "";
      if (why && sscanf(why, "there is no tool '%7[^']'", name) == 1 && isalpha(name[0]) &&
          !name[1]) {
        /* a job's tool the line does not list: unknown there */
        CHECK_MSG(!listed(kind, name), "rollout %zu: '%s' is listed on a %s line: %s", ri, name,
                  kind, why);
        unknown++;
        const json_t *ans = json_object_get(json_array_get(turns, k + 1), "answers");
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(ans, 0), "status")) ?: "",
                      "unknown_tool") ||
              k + 1 == json_array_size(turns));
      }
      several += why && !strcmp(kind, "any") && strstr(why, "this job has 52 tools");
    }
  }
  json_decref(ros);
  fprintf(stderr,
          "line tools: %d calls (%d bare on one-tool lines), %d unknown, %d bare '@' "
          "with 52 tools\n",
          calls, bare, unknown, several);
  CHECK_MSG(calls > 0 && unknown > 0 && bare > 0,
            "too few calls to tell: %d calls (%d bare), %d unknown", calls, bare, unknown);
  json_decref(body);

  /* a line naming a tool the job lacks: refused at submission and when the job starts */
  FILE *f = fopen(path, "a");
  fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"answer\": \"1\", "
             "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": "
             "\"function\", \"function\": {\"name\": \"zz\"}}]}\n");
  fclose(f);
  body = lines_job(1, path);
  json_t *errs = json_array();
  struct job_spec spec;
  CHECK(jobspec_parse(body, NULL, &spec, errs) == 0);
  struct mem_plan plan;
  CHECK(runner_check_job(&spec, &plan, errs) >= 1);
  char *d = json_dumps(errs, 0);
  const char *want = "line 41: field 'tools[1].function.name': the job has no tool named 'zz'";
  CHECK_MSG(d && strstr(d, want) && strstr(d, "\"training_file\""), "submission: %s", d);
  free(d);
  jobspec_deinit(&spec);
  snprintf(out, sizeof out, "%s/lines-bad", tmpdir);
  CHECK(run(body, out, 0, &res) == RUNNER_FAILED && strstr(res.message, want));
  json_decref(errs);
  json_decref(body);
}

/* A single-turn job (no `episode`) on RFT lines with tools: each response ("@x", two tokens) is
 * read for calls of its line's tools (dapod's format here: a custom template) and the graders see
 * them as sample.output_tools; nothing is called. A line without tools has none, and a response
 * naming a tool its line does not list ("@X" on a lower-case line) calls none. */
static void test_single_turn_tools(void) {
  char path[300], out[300];
  static const int kinds[] = {0, 3};
  write_tool_lines("single", 16, kinds, 2, 0, path, out);
  json_t *body = lines_job(2, path);
  json_object_del(body, "episode");
  json_object_set_new(json_object_get(body, "hyperparameters"), "max_new_tokens", json_integer(2));
  json_object_set_new(body, "judge",
                      json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:s}}", "type", "grader", "grader",
                                "type", "string_check", "name", "called", "operation", "ne",
                                "input", "{{sample.output_tools[0].function.name}}", "reference",
                                ""));
  struct runner_result res;
  CHECK(run(body, out, 0, &res) == RUNNER_SUCCEEDED);
  int called = 0, upper = 0;
  json_t *ros = all_rollouts(out, 2), *ro;
  size_t ri;
  json_array_foreach(ros, ri, ro) {
    const char *id = json_string_value(json_object_get(ro, "id")),
               *text = json_string_value(json_object_get(ro, "response"));
    double reward = json_number_value(json_object_get(ro, "reward_raw"));
    int lower = id && !strncmp(id, "lower-", 6), at = text && text[0] == '@';
    int call = lower && at && islower(text[1]) && !text[2];
    CHECK_MSG(reward == call, "rollout %zu: reward %g for '%s' on %s", ri, reward, text ? text : "",
              id ? id : "?");
    called += call;
    upper += at && isupper(text[1]) && !text[2];
  }
  size_t lines = json_array_size(ros);
  json_decref(ros);
  fprintf(stderr, "single turn: %d of %zu responses called their line's tool (%d \"@X\": none)\n",
          called, lines, upper);
  CHECK_MSG(called > 0, "no response called in %zu", lines);
  json_decref(body);
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
      {"{\"environment\": {\"type\": \"http\"}}", "episode.environment.url", "required"},
      {"{\"environment\": {\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", "
       "\"actionfield\": \"message\"}}",
       "episode.environment.actionfield", "unknown field"},
      {"{\"environment\": {\"type\": \"http\", \"url\": \"http://127.0.0.1/?x=1\"}}",
       "episode.environment.url", "no query"},
      {"{\"environment\": {\"type\": \"http\", \"url\": \"http://10.0.0.8/\"}}",
       "episode.environment.url", "is not in the judge host allowlist"},
      {"{\"environment\": {\"type\": \"http\", \"url\": \"http://127.0.0.1/\", \"concurrency\": "
       "0}}",
       "episode.environment.concurrency", "expected an integer"},
      {"{\"environment\": {\"type\": \"http\", \"url\": \"http://127.0.0.1/\"}, \"tools\": "
       "[{\"type\": \"python\"}]}",
       "episode.environment", "not both"},
      {"{\"on_env_error\": \"retry\"}", "episode.on_env_error", "expected \"fail\" or \"drop\""},
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
  snprintf(env_log, sizeof env_log, "%s/env.log", tmpdir);
  const char *env_argv[] = {PYTHON, DAPO_ENV_SERVER_SCRIPT, env_log, NULL};
  CHECK(child_start(&tools, argv) == 0);
  CHECK(child_start(&env, env_argv) == 0);
  if (tools.pid > 0) {
    test_episodes();
    watchdog_section("refusals");
    test_refusals();
    watchdog_section("a line's tools");
    test_line_tools();
    watchdog_section("a line's tools, single turn");
    test_single_turn_tools();
  }
  if (env.pid > 0) {
    watchdog_section("environment: run a");
    test_environment();
  }
  watchdog_section("one turn");
  test_one_turn();
  watchdog_section("stopping the tools");
  child_stop(&tools);
  child_stop(&env);
  watchdog_section("cleaning up");
  pool_free(g_pool);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_episodes");
}
