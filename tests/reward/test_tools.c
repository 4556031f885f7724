/* Tools (core/reward/tools.h) against the stand-in tool server tool_server.py, started here on a
 * free loopback port (Debian's /usr/bin/python3; skipped with 77 when it is missing): the call's
 * fields reach the tool, answers and {"error"} answers come back, 500s are retried until they
 * pass or the retries are spent, 404 is not retried, timeouts, garbage and huge replies, the
 * concurrency bound (the server holds calls until N are in flight), stopping with calls in
 * flight; the specs' refusals by field, the host policy; and the sandboxed python tool (prints,
 * tracebacks, no network, a read-only file system, its time limit). Every wait has a deadline. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "child.h"
#include "tools.h"

#ifndef DAPO_TOOL_SERVER_SCRIPT
#define DAPO_TOOL_SERVER_SCRIPT "tool_server.py"
#endif
#define PYTHON "/usr/bin/python3"

static struct child server;

/* A toolbox of one HTTP tool at path (printf'd with the port) with the given extra fields. */
static struct toolbox *http_tool(const char *path, const char *extra, struct dapo_err *e) {
  char text[1024];
  snprintf(text, sizeof text,
           "[{\"type\": \"function\", \"function\": {\"name\": \"t\", \"parameters\": {\"type\": "
           "\"object\"}}, \"url\": \"http://127.0.0.1:%d%s\"%s%s}]",
           server.port, path, extra ? ", " : "", extra ? extra : "");
  json_t *spec = json_loads(text, 0, NULL);
  struct toolbox *tb = toolbox_new(spec, NULL, "episode.tools", e);
  json_decref(spec);
  return tb;
}

/* Submits one call of tool 0 and waits (10 s at most) for its answer. */
static int call_once(struct toolbox *tb, const char *args, const char *episode,
                     struct tool_answer *a) {
  static const char ITEM[] = "{\"prompt\": \"p\", \"answer\": \"42\"}";
  static json_t *item;
  if (!item) item = json_loads(ITEM, 0, NULL);
  CHECK(toolbox_submit(tb, 7, 0, json_loads(args, 0, NULL), item, "job-1", episode) == 0);
  int n = toolbox_take(tb, a, 1, 10000, NULL);
  CHECK_MSG(n == 1 && a->tag == 7 && a->content, "no answer for %s", episode);
  return n;
}

static void test_answers(void) {
  struct dapo_err e = {0};
  struct tool_answer a;
  struct toolbox *tb = http_tool("/echo", NULL, &e);
  CHECK_MSG(tb != NULL, "%s", e.msg);
  if (!tb) return;
  CHECK(toolbox_count(tb) == 1 && !strcmp(toolbox_name(tb, 0), "t") && toolbox_find(tb, "t") == 0);
  CHECK(json_is_object(json_object_get(toolbox_function(tb, 0), "function")) &&
        !json_object_get(toolbox_function(tb, 0), "url"));
  if (call_once(tb, "{\"x\": 1}", "ep-1", &a)) {
    json_t *got = json_loads(a.content, 0, NULL);
    CHECK(a.err == TOOL_OK && a.attempts == 1 && a.ms >= 0);
    CHECK(
        !strcmp(json_string_value(json_object_get(got, "episode_id")), "ep-1") &&
        !strcmp(json_string_value(json_object_get(got, "job_id")), "job-1") &&
        !strcmp(json_string_value(json_object_get(got, "name")), "t") &&
        json_integer_value(json_object_get(json_object_get(got, "arguments"), "x")) == 1 &&
        !strcmp(json_string_value(json_object_get(json_object_get(got, "item"), "answer")), "42"));
    json_decref(got);
    free(a.content);
  }
  toolbox_free(tb);

  tb = http_tool("/error", NULL, &e);
  if (call_once(tb, "{}", "ep-2", &a)) {
    CHECK(a.err == TOOL_ERROR && !strcmp(a.content, "error: nope"));
    free(a.content);
  }
  toolbox_free(tb);

  /* two 500s, then fine: within max_retries 2; spent with max_retries 1 */
  tb = http_tool("/fail?n=2", "\"max_retries\": 2", &e);
  if (call_once(tb, "{}", "ep-3", &a)) {
    CHECK_MSG(a.err == TOOL_OK && a.attempts == 3, "err %s, %d attempts", tool_err_name(a.err),
              a.attempts);
    free(a.content);
  }
  toolbox_free(tb);
  tb = http_tool("/fail?n=2", "\"max_retries\": 1", &e);
  if (call_once(tb, "{}", "ep-4", &a)) {
    CHECK_MSG(a.err == TOOL_HTTP_ERROR && a.attempts == 2 &&
                  strstr(a.content, "error: the tool t failed (HTTP 500 after 2 attempts)"),
              "%s", a.content);
    free(a.content);
  }
  toolbox_free(tb);
  /* 404 is not retried */
  tb = http_tool("/status?code=404", "\"max_retries\": 3", &e);
  if (call_once(tb, "{}", "ep-5", &a)) {
    CHECK(a.err == TOOL_HTTP_ERROR && a.attempts == 1 && strstr(a.content, "HTTP 404"));
    free(a.content);
  }
  toolbox_free(tb);
  /* a timeout, retried once */
  tb = http_tool("/slow?ms=3000", "\"timeout_ms\": 200, \"max_retries\": 1", &e);
  if (call_once(tb, "{}", "ep-6", &a)) {
    CHECK_MSG(a.err == TOOL_TIMEOUT && a.attempts == 2 && strstr(a.content, "timed out"), "%s",
              a.content);
    free(a.content);
  }
  toolbox_free(tb);
  /* garbage: a parse error, retried */
  tb = http_tool("/garbage", "\"max_retries\": 1", &e);
  if (call_once(tb, "{}", "ep-7", &a)) {
    CHECK_MSG(a.err == TOOL_PARSE_ERROR && a.attempts == 2 &&
                  strstr(a.content, "malformed reply") && strstr(a.content, "this is not json"),
              "%s", a.content);
    free(a.content);
  }
  toolbox_free(tb);
  /* a huge answer is cut at max_answer_bytes, and says so */
  tb = http_tool("/huge?kb=256", "\"max_answer_bytes\": 1000", &e);
  if (call_once(tb, "{}", "ep-8", &a)) {
    CHECK(a.err == TOOL_TRUNCATED && strlen(a.content) <= 1000 + 16 &&
          strstr(a.content, "\n[truncated]"));
    free(a.content);
  }
  toolbox_free(tb);
}

/* The most calls in flight together that the server logged for paths starting with prefix. */
static int max_in_flight(const char *prefix) {
  char cmd[300];
  snprintf(cmd, sizeof cmd,
           "%s -c \"import urllib.request,sys; "
           "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:%d/log')"
           ".read().decode())\"",
           PYTHON, server.port);
  FILE *p = popen(cmd, "r");
  char buf[1 << 16];
  size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
  if (p) pclose(p);
  buf[n] = '\0';
  json_t *log = json_loads(buf, 0, NULL);
  int most = 0;
  size_t i;
  json_t *x;
  json_array_foreach(log, i, x) {
    if (strncmp(json_string_value(json_object_get(x, "episode_id")), prefix, strlen(prefix)))
      continue;
    int f = (int)json_integer_value(json_object_get(x, "in_flight"));
    most = f > most ? f : most;
  }
  json_decref(log);
  return most;
}

static void test_concurrency(void) {
  struct dapo_err e = {0};
  /* concurrency 3: the server holds each call until 3 are in flight, so 3 must be reached; the
   * toolbox never has a 4th going */
  struct toolbox *tb = http_tool("/gate?n=3&ms=10000", "\"concurrency\": 3", &e);
  CHECK_MSG(tb != NULL, "%s", e.msg);
  if (!tb) return;
  for (int i = 0; i < 9; i++) {
    char ep[32];
    snprintf(ep, sizeof ep, "c3-%d", i);
    CHECK(toolbox_submit(tb, i, 0, json_object(), NULL, "job", ep) == 0);
  }
  struct tool_answer a[9];
  int got = 0, seen = 0;
  double deadline = child_now_s() + 30;
  while (got < 9 && child_now_s() < deadline) got += toolbox_take(tb, a + got, 9 - got, 1000, NULL);
  CHECK(got == 9 && toolbox_pending(tb) == 0);
  for (int i = 0; i < got; i++) seen |= 1 << a[i].tag, free(a[i].content);
  CHECK(seen == (1 << 9) - 1);
  toolbox_free(tb);
  CHECK_MSG(max_in_flight("c3-") == 3, "in flight at most %d", max_in_flight("c3-"));
  /* concurrency 1: never two (each call gives up waiting for a second after 200 ms) */
  tb = http_tool("/gate?n=2&ms=200", "\"concurrency\": 1", &e);
  for (int i = 0; i < 3; i++) {
    char ep[32];
    snprintf(ep, sizeof ep, "c1-%d", i);
    CHECK(toolbox_submit(tb, i, 0, json_object(), NULL, "job", ep) == 0);
  }
  got = 0;
  deadline = child_now_s() + 30;
  while (got < 3 && child_now_s() < deadline) got += toolbox_take(tb, a + got, 3 - got, 1000, NULL);
  CHECK(got == 3);
  for (int i = 0; i < got; i++) free(a[i].content);
  toolbox_free(tb);
  CHECK(max_in_flight("c1-") == 1);
  /* stopping with calls in flight and queued: the transfers are abandoned at once */
  tb = http_tool("/slow?ms=20000", "\"concurrency\": 2", &e);
  for (int i = 0; i < 4; i++) CHECK(toolbox_submit(tb, i, 0, json_object(), NULL, "job", "s") == 0);
  CHECK(toolbox_take(tb, a, 4, 300, NULL) == 0 && toolbox_pending(tb) == 4);
  double t0 = child_now_s();
  toolbox_free(tb);
  CHECK_MSG(child_now_s() - t0 < 5, "stopping took %.1f s", child_now_s() - t0);
  /* a take that would wait for ever returns when *cancel is set */
  tb = http_tool("/slow?ms=20000", NULL, &e);
  CHECK(toolbox_submit(tb, 0, 0, json_object(), NULL, "job", "s2") == 0);
  volatile int cancel = 1;
  CHECK(toolbox_take(tb, a, 1, -1, &cancel) == 0);
  toolbox_free(tb);
}

static void test_refusals(void) {
  static const struct {
    const char *spec, *why;
  } BAD[] = {
      {"[]", "episode.tools: expected a list of 1 to 64 tools"},
      {"[3]", "episode.tools[0]: expected a tool object"},
      {"[{\"type\": \"retrieval\"}]", "episode.tools[0].type: expected \"function\" or \"python\""},
      {"[{\"type\": \"function\", \"url\": \"http://127.0.0.1:1/\"}]",
       "episode.tools[0].function: required"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}, \"url\": "
       "\"http://127.0.0.1:1/\"}]",
       "episode.tools[0].function.name: expected 1 to 64 of"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": "
       "\"object\", \"oneOf\": []}}, \"url\": \"http://127.0.0.1:1/\"}]",
       "episode.tools[0].function.parameters.oneOf: this keyword is not supported"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}]",
       "episode.tools[0].url: required"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": "
       "\"http://example.com/t\"}]",
       "episode.tools[0].url: host 'example.com' is not in the judge host allowlist"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": \"ftp://127.0.0.1/\"}]",
       "episode.tools[0].url: scheme 'ftp' is not http or https"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": \"http://127.0.0.1/\","
       " \"timeout_ms\": 5}]",
       "episode.tools[0].timeout_ms: expected an integer in [100, 600000]"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": \"http://127.0.0.1/\","
       " \"color\": 1}]",
       "episode.tools[0].color: unknown field"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": "
       "\"http://127.0.0.1/\"}, "
       "{\"type\": \"function\", \"function\": {\"name\": \"a\"}, \"url\": \"http://127.0.0.1/\"}]",
       "episode.tools[1]: a second tool named 'a'"},
      {"[{\"type\": \"python\", \"timeout_ms\": 1000000}]",
       "episode.tools[0].timeout_ms: expected an integer in [100, 60000]"},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    json_t *spec = json_loads(BAD[i].spec, 0, NULL);
    struct dapo_err e = {0};
    struct toolbox *tb = toolbox_new(spec, NULL, "episode.tools", &e);
    CHECK_MSG(!tb && strstr(e.msg, BAD[i].why), "%s: %s", BAD[i].spec, tb ? "built" : e.msg);
    toolbox_free(tb);
    json_decref(spec);
  }
  /* arguments against the parameters */
  json_t *spec = json_loads(
      "[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": "
      "\"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"]}}, "
      "\"url\": \"http://127.0.0.1:1/\"}]",
      0, NULL);
  struct dapo_err e = {0};
  struct toolbox *tb = toolbox_new(spec, NULL, "episode.tools", &e);
  char why[200];
  json_t *good = json_loads("{\"n\": 3}", 0, NULL), *bad = json_loads("{\"n\": \"3\"}", 0, NULL);
  CHECK(tb && toolbox_check_args(tb, 0, good, why, sizeof why) == 0);
  CHECK(tb && toolbox_check_args(tb, 0, bad, why, sizeof why) == 1 &&
        !strcmp(why, "arguments.n: expected \"integer\", got string"));
  json_decref(good), json_decref(bad), json_decref(spec);
  toolbox_free(tb);
}

static void test_python(void) {
  json_t *spec = json_loads("[{\"type\": \"python\", \"timeout_ms\": 3000}]", 0, NULL);
  struct dapo_err e = {0};
  struct toolbox *tb = toolbox_new(spec, NULL, "episode.tools", &e);
  json_decref(spec);
  if (!tb && e.code == DAPO_EUNSUPPORTED) {
    fprintf(stderr, "python tool: skipped (%s)\n", e.msg);
    return;
  }
  CHECK_MSG(tb != NULL, "%s", e.msg);
  if (!tb) return;
  CHECK(!strcmp(toolbox_name(tb, 0), "python"));
  static const struct {
    const char *code, *want;
    enum tool_err err;
  } V[] = {
      {"print(6 * 7)", "42\n", TOOL_OK},
      {"import sys\nprint('out')\nprint('err', file=sys.stderr)", "out\nerr\n", TOOL_OK},
      {"1 / 0", "ZeroDivisionError: division by zero", TOOL_OK},
      /* no network: the socket cannot reach anything */
      {"import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    "
       "print('reached')\nexcept OSError as e:\n    print('no network')",
       "no network", TOOL_OK},
      /* a read-only system, and nothing of the host's own files */
      {"try:\n    open('/usr/x', 'w')\n    print('wrote')\nexcept OSError:\n    print('read-only')",
       "read-only", TOOL_OK},
      {"import os\nprint(os.path.exists('/etc/passwd'), os.path.exists('/home'))", "False False",
       TOOL_OK},
      {"while True:\n    pass", "stopped at its limits", TOOL_TIMEOUT},
  };
  for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
    json_t *args = json_pack("{s:s}", "code", V[i].code);
    char *text = json_dumps(args, 0);
    struct tool_answer a;
    if (call_once(tb, text, "py", &a)) {
      CHECK_MSG(a.err == V[i].err && strstr(a.content, V[i].want), "case %zu: %s: %s", i,
                tool_err_name(a.err), a.content);
      free(a.content);
    }
    free(text);
    json_decref(args);
  }
  toolbox_free(tb);
}

int main(void) {
  if (access(PYTHON, X_OK)) {
    fprintf(stderr, "test_tools: skipped (%s is missing)\n", PYTHON);
    return 77;
  }
  const char *argv[] = {PYTHON, DAPO_TOOL_SERVER_SCRIPT, NULL};
  CHECK(child_start(&server, argv) == 0);
  if (server.pid > 0) {
    test_answers();
    test_concurrency();
  }
  test_refusals();
  test_python();
  child_stop(&server);
  return check_done("test_tools");
}
