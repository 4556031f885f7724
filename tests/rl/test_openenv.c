/* `openenv` environments (core/reward/openenv.c through the job runner): episodes against the
 * stand-in OpenEnv server tests/rl/openenv_server.py (WebSocket by hand, env_server.py's
 * digit-guessing game), started here on a free loopback port (Debian's /usr/bin/python3; skipped
 * with 77 when it is missing):
 * - an openenv job trains: each episode one socket (Host the URL's, the spec's headers sent),
 *   reset with the /reset body, a step a turn with the turn's text under action_field, closed
 *   once; the observation's observation_field (or the whole observation as JSON) the user
 *   message; rewards and done as the server gave them; fragmented replies assembled, pings
 *   answered;
 * - the same job twice gives the same rollouts and weights;
 * - failures classified and counted (env/errors/env_timeout, env_http_error, env_parse_error):
 *   a reply that is not JSON, an error reply (quoted), a socket closed mid-episode, a step past
 *   timeout_ms, a reply over max_answer_bytes, a refused handshake, nothing listening; a reset
 *   whose first socket dies is retried on a fresh one and leaves no trace; `on_env_error` fail
 *   and drop;
 * - the spec refused field by field (the host policy naming episode.environment.url). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "files.h"
#include "pool.h"
#include "runner.h"
#include "tools.h"
#include "watchdog.h"

#ifndef DAPO_OPENENV_SERVER_SCRIPT
#define DAPO_OPENENV_SERVER_SCRIPT "openenv_server.py"
#endif
#ifndef DAPO_OPENENV_UVICORN_SCRIPT
#define DAPO_OPENENV_UVICORN_SCRIPT "openenv_uvicorn.py"
#endif
#define PYTHON "/usr/bin/python3"

static char tmpdir[] = "/tmp/dapo-openenv-XXXXXX";
static char train[300], server_log[300];
static struct child server;
static struct pool *g_pool;

/* The environment at path of the stand-in server, with the spec's extra fields (a JSON text). */
static json_t *environment(const char *path, const char *extra) {
  char url[128];
  snprintf(url, sizeof url, "ws://127.0.0.1:%d%s", server.port, path);
  json_t *env = json_loads(extra ? extra : "{}", 0, NULL);
  json_object_set_new(env, "type", json_string("openenv"));
  json_object_set_new(env, "url", json_string(url));
  return env;
}

/* A job of `steps` steps on the tiny preset, G episodes for each of `prompts` code lines, against
 * env; on_error "fail" or "drop". */
static json_t *openenv_job(int steps, int prompts, int g, json_t *env, const char *on_error) {
  return json_pack("{s:s, s:s, s:{s:s}, s:i, s:{s:i, s:i, s:i, s:i, s:f, s:i, s:i, s:i, s:i}, "
                   "s:{s:i, s:i, s:o, s:s, s:s}}",
                   "model", "tiny", "training_file", train, "judge", "type", "exact", "seed", 3,
                   "hyperparameters", "total_steps", steps, "group_size", g, "prompt_batch_size",
                   prompts, "max_new_tokens", 4, "learning_rate", 3e-3, "checkpoint_every", 1,
                   "minibatch_size", g * prompts, "micro_batch_tokens", 512, "max_gen_batches", 2,
                   "episode", "max_turns", 3, "max_new_tokens_per_turn", 2, "environment", env,
                   "reward", "environment", "on_env_error", on_error);
}

/* The env/errors/<kind> counts of the job's metrics, summed over its steps. */
struct counts {
  double timeout, http, parse;
};

static int on_metrics(void *ctx, const struct runner_metrics *m) {
  struct counts *c = ctx;
  c->timeout += json_number_value(json_object_get(m->data, "env/errors/env_timeout"));
  c->http += json_number_value(json_object_get(m->data, "env/errors/env_http_error"));
  c->parse += json_number_value(json_object_get(m->data, "env/errors/env_parse_error"));
  return 0;
}

/* Runs body into out (its spec must be accepted), counting errors into *c (may be NULL). */
static int run_job(json_t *body, const char *out, struct counts *c, struct runner_result *res) {
  json_t *errs = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errs);
  char *d = json_dumps(errs, 0);
  CHECK_MSG(n == 0, "spec errors: %s", d);
  free(d);
  struct counts ignored = {0};
  struct runner_hooks h = {.ctx = c ? c : &ignored, .metrics = on_metrics};
  struct runner_opts o = {.pool = g_pool};
  runner_run(&s, out, &h, &o, res);
  jobspec_deinit(&s);
  json_decref(errs);
  json_decref(body);
  return res->status;
}

/* The rollouts of out's step, as text (owned). */
static char *rollouts(const char *out, int step) {
  char p[512];
  size_t len;
  snprintf(p, sizeof p, "%s/rollouts/step-%d.jsonl", out, step);
  return slurp(p, &len);
}

/* Every episode of a rollouts file plays the game: the first observation the user message
 * `first`, turns in order, rewards as the game gives them, the environment's sum the
 * reward. Returns the episodes ended by the environment; *lines the episodes. */
static int check_game(const char *out, int step, const char *first, int *lines) {
  char *text = rollouts(out, step), *save = NULL;
  CHECK_MSG(text != NULL, "no rollouts at step %d in %s", step, out);
  int done = 0;
  *lines = 0;
  for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
    json_t *r = json_loads(l, 0, NULL);
    const json_t *turns = json_object_get(r, "turns");
    const char *fin = json_string_value(json_object_get(r, "finish_reason"));
    int bad = !fin || json_array_size(turns) < 1;
    double total = 0;
    for (size_t k = 0; k < json_array_size(turns); k++) {
      const json_t *t = json_array_get(turns, k), *rw = json_object_get(t, "reward");
      const char *role = json_string_value(json_object_get(t, "role")),
                 *content = json_string_value(json_object_get(t, "content"));
      bad |= !role || !content || strcmp(role, k % 2 ? "assistant" : "environment");
      if (k % 2 || !content) continue;
      if (k == 0) { /* one user message */
        const json_t *ms = json_object_get(t, "messages"), *m0 = json_array_get(ms, 0);
        const char *said = json_string_value(json_object_get(m0, "content")),
                   *who = json_string_value(json_object_get(m0, "role"));
        bad |= json_array_size(ms) != 1 || !said || strcmp(said, first) || !who ||
               strcmp(who, "user") || !json_is_null(rw);
        continue;
      }
      /* the action before decides: the answer "right" (1), a digit "higher"/"lower" (0.25) */
      const char *act = json_string_value(json_object_get(json_array_get(turns, k - 1), "content"));
      const char *answer = json_string_value(json_object_get(r, "answer"));
      int digit = act && act[0] >= '0' && act[0] <= '9';
      if (act && answer && act[0] == answer[0])
        bad |= json_real_value(rw) != 1.0 || !json_is_true(json_object_get(t, "done"));
      else
        bad |= digit ? json_real_value(rw) != 0.25 : !json_is_null(rw);
      total += json_number_value(rw);
    }
    if (fin && !strcmp(fin, "done")) done++;
    bad |= fin && strcmp(fin, "done") && strcmp(fin, "max_turns") && strcmp(fin, "length") &&
           strcmp(fin, "truncated");
    bad |= fabs(json_number_value(json_object_get(r, "reward_raw")) - total) > 1e-9;
    CHECK_MSG(!bad, "%s step %d line %d: the episode disagrees with the game: %.400s", out, step,
              *lines + 1, l);
    json_decref(r);
    ++*lines;
  }
  free(text);
  return done;
}

/* The server's log for base: every episode's session opened, reset once, stepped and closed
 * once, on one connection each (Host the URL's, the token header sent); pings answered. */
static void check_log(const char *base) {
  size_t len;
  char *text = slurp(server_log, &len), *save = NULL, host[64];
  CHECK_MSG(text != NULL, "no log from the server");
  snprintf(host, sizeof host, "127.0.0.1:%d", server.port);
  json_t *eps = json_object(), *conns = json_object();
  int bad = 0, pongs = 0;
  for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
    json_t *e = json_loads(l, 0, NULL);
    const char *type = json_string_value(json_object_get(e, "type"));
    char conn[32];
    snprintf(conn, sizeof conn, "%lld", (long long)json_integer_value(json_object_get(e, "conn")));
    const char *at = json_string_value(json_object_get(e, "base"));
    if (!type || !at || strcmp(at, base)) {
      json_decref(e);
      continue;
    }
    if (!strcmp(type, "connect")) {
      const char *h = json_string_value(json_object_get(e, "host")),
                 *token = json_string_value(json_object_get(e, "token")),
                 *path = json_string_value(json_object_get(e, "path"));
      bad |=
          !h || strcmp(h, host) || !token || strcmp(token, "t0k3n") || !path || strcmp(path, "/ws");
    } else if (!strcmp(type, "pong")) {
      pongs++;
    } else if (!strcmp(type, "reset")) {
      const char *id = json_string_value(json_object_get(json_object_get(e, "data"), "episode_id"));
      bad |= !id || json_object_get(eps, id) != NULL;
      if (id)
        json_object_set_new(eps, id,
                            json_pack("{s:s, s:i, s:i}", "conn", conn, "steps", 0, "closes", 0));
      json_object_set_new(conns, conn, json_string(id ? id : ""));
    } else if (!strcmp(type, "step") || !strcmp(type, "close")) {
      json_t *st = json_object_get(eps, json_string_value(json_object_get(conns, conn)));
      const char *key = !strcmp(type, "step") ? "steps" : "closes";
      bad |= !st || (!strcmp(type, "step") &&
                     !json_is_string(json_object_get(json_object_get(e, "data"), "message")));
      if (st)
        json_object_set_new(st, key,
                            json_integer(json_integer_value(json_object_get(st, key)) + 1));
    }
    json_decref(e);
  }
  const char *id;
  json_t *st;
  json_object_foreach(eps, id, st) {
    bad |= json_integer_value(json_object_get(st, "closes")) != 1 ||
           json_integer_value(json_object_get(st, "steps")) < 1 ||
           json_integer_value(json_object_get(st, "steps")) > 3;
  }
  CHECK_MSG(json_object_size(eps) >= 64 && !bad && pongs > 0,
            "%s: %zu episodes, each reset, stepped and closed once on its own socket: %s; %d pongs",
            base, json_object_size(eps), bad ? "no" : "yes", pongs);
  json_decref(eps);
  json_decref(conns);
  free(text);
}

static void test_train(void) {
  char a[300], b[300], pa[512], pb[512];
  snprintf(a, sizeof a, "%s/oe-a", tmpdir);
  snprintf(b, sizeof b, "%s/oe-b", tmpdir);
  static const char EXTRA[] = "{\"observation_field\": \"text\", \"headers\": {\"X-Token\": "
                              "\"t0k3n\"}, \"concurrency\": 8}";
  /* the same, on more threads: every episode's reset waits for one backoff */
  static const char FLAKY[] = "{\"observation_field\": \"text\", \"concurrency\": 32}";
  struct runner_result ra, rb;
  struct counts c = {0};
  watchdog_section("openenv: run a");
  CHECK(run_job(openenv_job(2, 8, 8, environment("", EXTRA), "fail"), a, &c, &ra) ==
            RUNNER_SUCCEEDED &&
        ra.step == 2);
  int done = 0, lines = 0, n;
  for (int s = 1; s <= 2; s++) done += check_game(a, s, "guess", &n), lines += n;
  CHECK_MSG(lines >= 2 * 64 && done > 0, "%d episodes, %d of them done", lines, done);
  CHECK(c.timeout + c.http + c.parse == 0);
  check_log("");
  watchdog_section("openenv: run b");
  CHECK(run_job(openenv_job(2, 8, 8, environment("/ws", EXTRA), "fail"), b, NULL, &rb) ==
        RUNNER_SUCCEEDED);
  for (int s = 1; s <= 2; s++) {
    snprintf(pa, sizeof pa, "%s/rollouts/step-%d.jsonl", a, s);
    snprintf(pb, sizeof pb, "%s/rollouts/step-%d.jsonl", b, s);
    CHECK_MSG(same_file(pa, pb), "two runs differ at step %d's rollouts", s);
  }
  snprintf(pa, sizeof pa, "%s/checkpoints/step-2/model.safetensors", a);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-2/model.safetensors", b);
  CHECK_MSG(same_file(pa, pb), "two runs differ in their weights");
  fprintf(stderr, "openenv: %d episodes in 2 steps, %d ended by the environment; two runs agree\n",
          lines, done);

  /* a reset whose first socket dies: retried on a fresh one, no trace in the rollouts */
  watchdog_section("openenv: flaky");
  snprintf(b, sizeof b, "%s/oe-flaky", tmpdir);
  CHECK(run_job(openenv_job(1, 8, 8, environment("/flaky/ws", FLAKY), "fail"), b, &c, &rb) ==
        RUNNER_SUCCEEDED);
  snprintf(pa, sizeof pa, "%s/rollouts/step-1.jsonl", a);
  snprintf(pb, sizeof pb, "%s/rollouts/step-1.jsonl", b);
  CHECK_MSG(same_file(pa, pb), "retried resets changed the episodes");

  /* no observation_field: the whole observation as JSON */
  watchdog_section("openenv: whole observations");
  snprintf(b, sizeof b, "%s/oe-whole", tmpdir);
  CHECK(run_job(openenv_job(1, 4, 4, environment("/ws", "{\"action_field\": \"message\"}"), "fail"),
                b, NULL, &rb) == RUNNER_SUCCEEDED);
  check_game(b, 1, "{\"text\":\"guess\",\"turn\":0}", &n);
  CHECK(n >= 16);
}

static void test_failures(void) {
  static const struct {
    const char *path, *extra, *why;
    int timeout, http, parse;
  } FAILS[] = {
      {"/garbage/ws", NULL, "step failed (malformed reply: the reply is not a JSON object", 0, 0,
       1},
      {"/error/ws", NULL,
       "step failed (the environment answered an error: the action has no move (EXECUTION_ERROR) "
       "after 1 attempt)",
       0, 1, 0},
      {"/drop/ws", NULL, "step failed (the environment closed the socket after 1 attempt)", 0, 1,
       0},
      {"/slow/ws", "{\"timeout_ms\": 300, \"concurrency\": 16}",
       "step failed (timed out (timeout_ms 300) after 1", 1, 0, 0},
      {"/huge/ws", NULL, "step failed (malformed reply (larger than max_answer_bytes 8192)", 0, 0,
       1},
      {"/refuse/ws", "{\"max_retries\": 1, \"concurrency\": 16}",
       "reset failed (could not open the session", 0, 1, 0},
  };
  char d[300];
  for (size_t i = 0; i < sizeof FAILS / sizeof FAILS[0]; i++) {
    watchdog_section(FAILS[i].path);
    struct runner_result r;
    struct counts c = {0};
    /* drop: the episodes end `error`, the step goes on and counts them */
    snprintf(d, sizeof d, "%s/oe-drop-%zu", tmpdir, i);
    CHECK(run_job(openenv_job(1, 4, 4, environment(FAILS[i].path, FAILS[i].extra), "drop"), d, &c,
                  &r) == RUNNER_SUCCEEDED);
    char *text = rollouts(d, 1);
    CHECK_MSG(text && strstr(text, "\"finish_reason\":\"error\"") && strstr(text, FAILS[i].why),
              "%s: dropped episodes without '%s': %.300s", FAILS[i].path, FAILS[i].why,
              text ? text : "(none)");
    free(text);
    CHECK_MSG((c.timeout > 0) == FAILS[i].timeout && (c.http > 0) == FAILS[i].http &&
                  (c.parse > 0) == FAILS[i].parse,
              "%s: counted %g timeouts, %g http errors, %g parse errors", FAILS[i].path, c.timeout,
              c.http, c.parse);
    /* fail: the job fails quoting it */
    snprintf(d, sizeof d, "%s/oe-fail-%zu", tmpdir, i);
    CHECK(run_job(openenv_job(1, 4, 4, environment(FAILS[i].path, FAILS[i].extra), "fail"), d, NULL,
                  &r) == RUNNER_FAILED &&
          r.failure == FAIL_ENVIRONMENT_ERROR && !strcmp(r.param, "episode.environment"));
    CHECK_MSG(strstr(r.message, FAILS[i].why), "%s: '%s' without '%s'", FAILS[i].path, r.message,
              FAILS[i].why);
  }
  /* nothing listening: the reset's retries spent, a refused connection */
  watchdog_section("nothing listening");
  struct runner_result r;
  snprintf(d, sizeof d, "%s/oe-closed", tmpdir);
  json_t *env = json_pack("{s:s, s:s, s:i}", "type", "openenv", "url", "ws://127.0.0.1:1/ws",
                          "max_retries", 1);
  CHECK(run_job(openenv_job(1, 4, 4, env, "fail"), d, NULL, &r) == RUNNER_FAILED &&
        r.failure == FAIL_ENVIRONMENT_ERROR);
  CHECK_MSG(strstr(r.message, "reset failed (could not open the session") &&
                strstr(r.message, "after 2 attempts"),
            "nothing listening: %s", r.message);
}

/* The host policy at connect time, through the toolbox: a name the policy allows that resolves
 * to a private address is refused before any socket opens; one that resolves to an allowed
 * address is connected to by that address, with the URL's Host header. */
static void test_connect_policy(void) {
  char evil[64], good[64];
  snprintf(evil, sizeof evil, "evil.test:%d:10.0.0.1", server.port);
  snprintf(good, sizeof good, "good.test:%d:127.0.0.1", server.port);
  const char *allowed[] = {"evil.test", "good.test", "127.0.0.1"}, *resolve[] = {evil, good};
  struct judge_policy pol = {
      .allowed_hosts = allowed, .n_allowed = 3, .resolve = resolve, .n_resolve = 2};
  static const char *const HOSTS[2] = {"evil.test", "good.test"};
  for (int k = 0; k < 2; k++) {
    char url[128];
    snprintf(url, sizeof url, "ws://%s:%d/ws", HOSTS[k], server.port);
    json_t *spec = json_pack("{s:s, s:s, s:s, s:i}", "type", "openenv", "url", url,
                             "observation_field", "text", "max_retries", 0);
    struct dapo_err e = {0};
    struct toolbox *tb = toolbox_new_env(spec, &pol, "episode.environment", &e);
    json_decref(spec);
    CHECK_MSG(tb != NULL, "%s: %s", HOSTS[k], e.msg);
    if (!tb) continue;
    toolbox_submit_env(tb, 1, ENV_RESET,
                       json_pack("{s:s, s:{s:s}}", "episode_id", HOSTS[k], "item", "answer", "3"));
    struct tool_answer a = {0};
    CHECK(toolbox_take(tb, &a, 1, 10000, NULL) == 1);
    if (k == 0) {
      CHECK_MSG(a.err == TOOL_HTTP_ERROR && a.content &&
                    strstr(a.content, "refused to connect to 10.0.0.1: 'evil.test' resolved to a "
                                      "private address"),
                "evil.test: %s", a.content ? a.content : "(answered)");
    } else {
      const json_t *m = json_array_get(a.env.messages, 0);
      CHECK_MSG(a.err == TOOL_OK &&
                    !strcmp(json_string_value(json_object_get(m, "content")), "guess"),
                "good.test: %s", a.content ? a.content : "(no message)");
      toolbox_submit_env(tb, -1, ENV_CLOSE, json_pack("{s:s}", "episode_id", HOSTS[k]));
    }
    tool_answer_clear(&a);
    toolbox_free(tb);
  }
  size_t len;
  char *log = slurp(server_log, &len), host[64];
  snprintf(host, sizeof host, "\"host\": \"good.test:%d\"", server.port);
  CHECK_MSG(log && strstr(log, host) && !strstr(log, "evil.test"),
            "the server saw no handshake with %s, or one from evil.test", host);
  free(log);
}

/* One reset, a step, 3 s of nothing, a step and a close on a session of OpenEnv's own server
 * stack (openenv_uvicorn.py: FastAPI on uvicorn, pinging every 0.5 s and dropping a client
 * that does not answer within 0.5 s): the session outlives the idle time, the whole observation
 * is read as JSON, the Host header is the URL's ("localhost", resolved and connected by
 * address). Skipped when Debian's python3-fastapi or python3-uvicorn is missing. */
static void test_uvicorn(void) {
  if (system(PYTHON " -c 'import fastapi, uvicorn' 2>/dev/null")) {
    fprintf(stderr, "test_openenv: uvicorn part skipped (no python3-fastapi, python3-uvicorn)\n");
    return;
  }
  struct child uv;
  const char *argv[] = {PYTHON, DAPO_OPENENV_UVICORN_SCRIPT, NULL};
  CHECK(child_start(&uv, argv) == 0);
  if (uv.pid <= 0) return;
  char url[96], host[64];
  snprintf(url, sizeof url, "ws://localhost:%d", uv.port);
  snprintf(host, sizeof host, "\"host\":\"localhost:%d\"", uv.port);
  json_t *spec = json_pack("{s:s, s:s, s:i}", "type", "openenv", "url", url, "timeout_ms", 5000);
  struct dapo_err e = {0};
  struct toolbox *tb = toolbox_new_env(spec, NULL, "episode.environment", &e);
  json_decref(spec);
  CHECK_MSG(tb != NULL, "%s", e.msg);
  static const char *const ACTS[3] = {NULL, "7", "3"}, *const SAYS[3] = {NULL, "\"no\"", "right"};
  for (int k = 0; tb && k < 3; k++) {
    if (k == 2) child_nap_ms(3000); /* six pings */
    json_t *body = k == 0 ? json_pack("{s:s, s:{s:s}}", "episode_id", "uv-0", "item", "answer", "3")
                          : json_pack("{s:s, s:{s:s, s:s}}", "episode_id", "uv-0", "action", "role",
                                      "assistant", "content", ACTS[k]);
    toolbox_submit_env(tb, 1, k == 0 ? ENV_RESET : ENV_STEP, body);
    struct tool_answer a = {0};
    CHECK(toolbox_take(tb, &a, 1, 10000, NULL) == 1);
    const char *said =
        json_string_value(json_object_get(json_array_get(a.env.messages, 0), "content"));
    CHECK_MSG(a.err == TOOL_OK && said && strstr(said, k == 0 ? host : SAYS[k]) &&
                  a.env.done == (k == 2),
              "uvicorn, call %d: %s", k,
              a.content ? a.content
              : said    ? said
                        : "(no message)");
    tool_answer_clear(&a);
  }
  if (tb) toolbox_submit_env(tb, -1, ENV_CLOSE, json_pack("{s:s}", "episode_id", "uv-0"));
  toolbox_free(tb);
  child_stop(&uv);
}

static void test_refusals(void) {
  static const struct {
    const char *env, *field, *why;
  } BAD[] = {
      {"{\"type\": \"openenv\"}", "episode.environment.url", "required, a ws:// URL"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", \"actionfield\": \"x\"}",
       "episode.environment.actionfield", "unknown field"},
      {"{\"type\": \"openenv\", \"url\": \"http://127.0.0.1/ws\"}", "episode.environment.url",
       "scheme 'http' is not ws"},
      {"{\"type\": \"openenv\", \"url\": \"wss://127.0.0.1/ws\"}", "episode.environment.url",
       "wss:// is not supported yet"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws?x=1\"}", "episode.environment.url",
       "no query or fragment"},
      {"{\"type\": \"openenv\", \"url\": \"ws://10.0.0.8/ws\"}", "episode.environment.url",
       "is not in the judge host allowlist"},
      {"{\"type\": \"openenv\", \"url\": \"ws://example.com/ws\"}", "episode.environment.url",
       "is not in the judge host allowlist"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", \"action_field\": \"a b\"}",
       "episode.environment.action_field", "expected 1 to 64 of"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", \"observation_field\": 3}",
       "episode.environment.observation_field", "expected 1 to 64 of"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", \"timeout_ms\": 5}",
       "episode.environment.timeout_ms", "expected an integer"},
      {"{\"type\": \"openenv\", \"url\": \"ws://127.0.0.1/ws\", \"headers\": {\"Upgrade\": "
       "\"h2\"}}",
       "episode.environment.headers.Upgrade", "set by the daemon"},
      {"{\"type\": \"gym\", \"url\": \"ws://127.0.0.1/ws\"}", "episode.environment.type",
       "expected \"http\" or \"openenv\""},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    json_t *body = openenv_job(1, 4, 4, json_loads(BAD[i].env, 0, NULL), "fail"),
           *errs = json_array();
    struct job_spec s;
    jobspec_parse(body, NULL, &s, errs);
    int found = 0;
    size_t k;
    json_t *x;
    json_array_foreach(errs, k, x) {
      const char *msg = json_string_value(json_object_get(x, "message"));
      found |= !strcmp(json_string_value(json_object_get(x, "field")), "episode.environment") &&
               msg && !strncmp(msg, BAD[i].field, strlen(BAD[i].field)) && strstr(msg, BAD[i].why);
      found |= !strcmp(json_string_value(json_object_get(x, "field")), BAD[i].field) && msg &&
               strstr(msg, BAD[i].why);
    }
    char *d = json_dumps(errs, 0);
    CHECK_MSG(found, "%s: no %s error '%s' in %s", BAD[i].env, BAD[i].field, BAD[i].why, d);
    free(d);
    jobspec_deinit(&s);
    json_decref(body);
    json_decref(errs);
  }
}

int main(void) {
  if (access(PYTHON, X_OK)) {
    fprintf(stderr, "test_openenv: skipped (%s is missing)\n", PYTHON);
    return 77;
  }
  watchdog_start(540);
  g_pool = pool_new(2);
  if (!mkdtemp(tmpdir)) return 1;
  snprintf(train, sizeof train, "%s/sums.jsonl", tmpdir);
  write_dataset(train, 40); /* "a+b=", the answer a digit: the game's */
  snprintf(server_log, sizeof server_log, "%s/server.log", tmpdir);
  const char *argv[] = {PYTHON, DAPO_OPENENV_SERVER_SCRIPT, server_log, NULL};
  CHECK(child_start(&server, argv) == 0);
  watchdog_section("refusals");
  test_refusals();
  if (server.pid > 0) {
    test_train();
    watchdog_section("the host policy at connect time");
    test_connect_policy();
    test_failures();
  }
  watchdog_section("OpenEnv's server stack");
  test_uvicorn();
  watchdog_section("stopping the server");
  child_stop(&server);
  pool_free(g_pool);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_openenv");
}
