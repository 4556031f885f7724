/* A job's tools (tools.h): the specs checked once; each tool's calls run on `concurrency` threads
 * of its own, HTTP calls through the outside-party transfer (outside.h) with retries, python
 * calls in the sandbox (sandbox.h). An environment is one more kind of tool: an http one's
 * reset, step and close calls go the HTTP tools' way, to three routes under its URL; an openenv
 * one's go over the episode's WebSocket session (openenv.h). One mutex guards the queue of calls
 * and the list of answers. */
#include "tools.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsonschema.h"
#include "openenv.h"
#include "outside.h"
#include "sandbox.h"
#include "toolcall.h"
#include "utf8.h"

#define TOOL_THREADS_MAX 256 /* all tools' concurrency together */
#define NAME_MAX_LEN TC_NAME_MAX

enum tool_kind { TK_HTTP, TK_PYTHON, TK_ENV };

static const char *const ENV_ROUTES[3] = {"reset", "step", "close"}; /* by enum env_op */

struct tool {
  char name[NAME_MAX_LEN + 1];
  enum tool_kind kind;
  json_t *function;       /* owned: {"type": "function", "function": {...}} */
  struct jschema *params; /* NULL: any arguments */
  struct outside *out;    /* HTTP tools */
  struct outside *env[3]; /* an http environment's routes, by enum env_op */
  struct openenv *oe;     /* an openenv environment's sessions */
  char action_field[NAME_MAX_LEN + 1], observation_field[NAME_MAX_LEN + 1]; /* its fields */
  int timeout_ms, concurrency, max_retries;
  size_t max_answer_bytes;
};

/* A call, from its submission until its answer is taken: queued, running, then answered. */
struct call {
  struct call *next;
  int tag, tool;
  int op;       /* an environment's call: enum env_op; a tool's: -1 */
  json_t *args; /* owned: a tool's arguments, or an environment call's whole body */
  const json_t *item;
  char job_id[96], episode_id[96];
  int64_t t0;
  struct tool_answer a; /* once answered */
};

struct worker {
  struct toolbox *tb;
  int tool;
  pthread_t th;
  int started;
};

struct toolbox {
  struct tool tools[TOOLS_MAX];
  int n;
  struct worker *workers;
  int n_workers;
  pthread_mutex_t mu;
  pthread_cond_t work, answered;
  struct call *head, *tail;           /* calls waiting for a thread */
  struct call *done_head, *done_tail; /* answered, not yet taken */
  int pending;                        /* submitted, not yet taken (closes are not counted) */
  int closing;                        /* an environment's closes queued or running */
  int stop;
};

static const char *const ERR_NAMES[TOOL_ERR_COUNT] = {
    "ok",      "malformed",  "unknown_tool", "bad_arguments", "tool_error",
    "timeout", "http_error", "parse_error",  "truncated"};

const char *tool_err_name(enum tool_err e) {
  return e >= 0 && e < TOOL_ERR_COUNT ? ERR_NAMES[e] : "unknown";
}

/* ---- the specs ---- */

static int get_int(const json_t *spec, const char *field, const char *key, int def, int min,
                   int max, int *out, struct dapo_err *e) {
  const json_t *v = json_object_get(spec, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected an integer in [%d, %d]", field, key, min,
                     max);
  *out = (int)json_integer_value(v);
  return 0;
}

static int check_fields(const json_t *o, const char *field, const char *const *allowed,
                        struct dapo_err *e) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    int ok = 0;
    for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, k);
    if (!ok) return dapo_errf(e, DAPO_EINVAL, "%s.%.64s: unknown field", field, k);
  }
  return 0;
}

static const char PYTHON_DESCRIPTION[] =
    "Runs Python 3 code in a sandbox (no network, no files kept, a time limit) and returns what "
    "it prints, errors included.";

/* The function shape a tool's spec shows a model (OpenAI's, without dapod's own fields): a
 * function tool's own, the python tool's built in. NULL when the spec is neither (or out of
 * memory). */
static json_t *function_of(const json_t *spec) {
  const char *type = json_string_value(json_object_get(spec, "type"));
  if (type && !strcmp(type, "function") && json_is_object(json_object_get(spec, "function")))
    return json_pack("{s:s, s:O}", "type", "function", "function",
                     json_object_get(spec, "function"));
  if (!type || strcmp(type, "python")) return NULL;
  const char *name = json_string_value(json_object_get(spec, "name"));
  return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s, s:s}}, s:[s]}}}", "type", "function",
                   "function", "name", name ? name : "python", "description", PYTHON_DESCRIPTION,
                   "parameters", "type", "object", "properties", "code", "type", "string",
                   "description", "the Python 3 program to run", "required", "code");
}

json_t *tools_prompt_functions(const json_t *spec) {
  json_t *out = json_array();
  size_t i;
  json_t *ts;
  json_array_foreach(spec, i, ts) {
    json_t *f = function_of(ts);
    if (!out || !f || json_array_append_new(out, f)) {
      json_decref(out);
      return NULL;
    }
  }
  return out;
}

static int build_python(struct tool *t, const json_t *spec, const char *field, struct dapo_err *e) {
  static const char *const fields[] = {
      "type", "name", "timeout_ms", "concurrency", "max_answer_bytes", NULL};
  int rc = check_fields(spec, field, fields, e), mab = 0;
  const json_t *nm = json_object_get(spec, "name");
  if (!rc && nm && (!json_is_string(nm) || !tc_valid_name(json_string_value(nm))))
    rc = dapo_errf(e, DAPO_EINVAL, "%s.name: expected " TC_NAME_RULE, field);
  if (!rc) snprintf(t->name, sizeof t->name, "%s", nm ? json_string_value(nm) : "python");
  if (!rc) rc = get_int(spec, field, "timeout_ms", 10000, 100, 60000, &t->timeout_ms, e);
  if (!rc) rc = get_int(spec, field, "concurrency", 2, 1, 16, &t->concurrency, e);
  if (!rc)
    rc = get_int(spec, field, "max_answer_bytes", TOOL_ANSWER_BYTES_DEFAULT, 64, 1 << 20, &mab, e);
  if (rc) return rc;
  t->max_answer_bytes = (size_t)mab;
  char why[320];
  if (!sandbox_available(why, sizeof why))
    return dapo_errf(e, DAPO_EUNSUPPORTED, "%s: the python tool needs the sandbox: %s", field, why);
  t->kind = TK_PYTHON;
  t->function = function_of(spec);
  if (!t->function) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  char sub[300];
  snprintf(sub, sizeof sub, "%s.parameters", field);
  const json_t *params = json_object_get(json_object_get(t->function, "function"), "parameters");
  return (t->params = jschema_new(params, sub, e)) ? 0 : e->code;
}

/* The limits an HTTP party's spec may set (a function tool's, an environment's), or their
 * defaults. */
static int get_http_limits(struct tool *t, const json_t *spec, const char *field,
                           struct dapo_err *e) {
  int rc, mab = 0;
  if ((rc = get_int(spec, field, "timeout_ms", 30000, 100, 600000, &t->timeout_ms, e))) return rc;
  if ((rc = get_int(spec, field, "concurrency", 4, 1, 64, &t->concurrency, e))) return rc;
  if ((rc = get_int(spec, field, "max_retries", 2, 0, 10, &t->max_retries, e))) return rc;
  if ((rc = get_int(spec, field, "max_answer_bytes", TOOL_ANSWER_BYTES_DEFAULT, 64, 1 << 20, &mab,
                    e)))
    return rc;
  t->max_answer_bytes = (size_t)mab;
  return 0;
}

static int build_http(struct tool *t, const json_t *spec, const char *field,
                      const struct judge_policy *pol, struct dapo_err *e) {
  static const char *const fields[] = {"type",        "function",         "url",
                                       "headers",     "timeout_ms",       "concurrency",
                                       "max_retries", "max_answer_bytes", NULL};
  static const char *const fn_fields[] = {"name", "description", "parameters", "strict", NULL};
  char sub[300];
  int rc = check_fields(spec, field, fields, e);
  if (rc) return rc;
  const json_t *fn = json_object_get(spec, "function");
  snprintf(sub, sizeof sub, "%s.function", field);
  if (!json_is_object(fn))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: required, an object {\"name\", \"description\", "
                     "\"parameters\"}",
                     sub);
  if ((rc = check_fields(fn, sub, fn_fields, e))) return rc;
  const json_t *nm = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
               *params = json_object_get(fn, "parameters");
  if (!json_is_string(nm) || !tc_valid_name(json_string_value(nm)))
    return dapo_errf(e, DAPO_EINVAL, "%s.name: expected " TC_NAME_RULE, sub);
  if (desc && !json_is_string(desc))
    return dapo_errf(e, DAPO_EINVAL, "%s.description: expected a string", sub);
  snprintf(t->name, sizeof t->name, "%s", json_string_value(nm));
  if (params) {
    char psub[320];
    snprintf(psub, sizeof psub, "%s.parameters", sub);
    if (!json_is_object(params))
      return dapo_errf(e, DAPO_EINVAL, "%s: expected a JSON Schema object", psub);
    if (!(t->params = jschema_new(params, psub, e))) return e->code;
  }
  if ((rc = get_http_limits(t, spec, field, e))) return rc;
  if (!(t->out = outside_new(field, "tool", json_object_get(spec, "url"),
                             json_object_get(spec, "headers"), pol, e)))
    return e->code;
  t->kind = TK_HTTP;
  t->function = function_of(spec); /* the shape the prompt shows */
  return t->function ? 0 : dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
}

/* ---- running calls ---- */

/* Whether the toolbox is stopping: read without the mutex (curl asks it many times a second). */
static int stopping(struct toolbox *tb) {
  return __atomic_load_n(&tb->stop, __ATOMIC_RELAXED);
}

/* curl's progress callback: a non-zero return aborts the transfer (the toolbox is stopping). */
static int on_progress(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)a, (void)b, (void)c, (void)d;
  return stopping(p);
}

/* Sleeps ms, in slices, unless the toolbox stops. */
static void pause_ms(struct toolbox *tb, int64_t ms) {
  while (ms > 0 && !stopping(tb)) {
    int64_t d = ms < 50 ? ms : 50;
    struct timespec ts = {0, (long)d * 1000000L};
    nanosleep(&ts, NULL);
    ms -= d;
  }
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

/* Reads a 2xx reply of an attempt into a: 0 when it is an answer (a->err and a->content set), 1
 * when it is malformed, with what (cap bytes) saying how. */
typedef int (*read_reply_fn)(const struct call *c, const struct outside_xfer *x,
                             struct tool_answer *a, char *what, size_t cap);

/* POSTs body to route with the retries of tool t (timeouts, refused connections, 429 and 5xx,
 * malformed replies; the judge's backoff), each attempt on a connection of its own: kept
 * connections made 512 calls to a Python http.server tool take 5.6 s instead of 0.22 s (its
 * replies wait on Nagle's algorithm and the delayed ACK, 40 ms each). The answer, or how the
 * last attempt failed, into a and what (cap bytes). */
static void post_with_retries(struct toolbox *tb, const struct tool *t, const struct outside *route,
                              const char *body, const struct call *c, read_reply_fn read,
                              struct tool_answer *a, char *what, size_t cap) {
  struct outside_xfer x = {0};
  for (a->attempts = 1;; a->attempts++) {
    CURL *h = outside_post(route, &x, body, strlen(body), t->timeout_ms, NULL);
    if (!h) {
      a->err = TOOL_ERROR;
      snprintf(what, cap, "out of memory");
      break;
    }
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, tb);
    CURLcode cc = curl_easy_perform(h);
    long status;
    int retry;
    enum outside_outcome o = outside_classify(h, cc, &x, t->timeout_ms, &status, &retry, what, cap);
    curl_easy_cleanup(h);
    if (o == OUT_OK) {
      if (!read(c, &x, a, what, cap)) break;
      a->err = TOOL_PARSE_ERROR;
      retry = 1;
    } else {
      a->err = o == OUT_TIMEOUT     ? TOOL_TIMEOUT
               : o == OUT_TOO_LARGE ? TOOL_PARSE_ERROR
                                    : TOOL_HTTP_ERROR;
    }
    if (!retry || a->attempts > t->max_retries || stopping(tb)) break;
    pause_ms(tb, outside_backoff_ms(a->attempts));
  }
  outside_xfer_free(&x);
}

/* A function tool's reply: {"content": string} or {"error": string}. */
static int read_tool_reply(const struct call *c, const struct outside_xfer *x,
                           struct tool_answer *a, char *what, size_t cap) {
  (void)c;
  json_t *root = json_loadb(x->reply ? x->reply : "", x->reply_n, 0, NULL);
  const json_t *ct = json_object_get(root, "content"), *er = json_object_get(root, "error");
  int rc = 0;
  if (json_is_object(root) && json_is_string(ct) && !er) {
    a->err = TOOL_OK;
    a->content = strdup(json_string_value(ct));
  } else if (json_is_object(root) && json_is_string(er) && !ct) {
    a->err = TOOL_ERROR;
    a->content = dup_printf("error: %s", json_string_value(er));
  } else {
    char q[256];
    outside_quote_reply(x, q, sizeof q);
    snprintf(what, cap, "malformed reply (not {\"content\": string} or {\"error\": string}): %s",
             q);
    rc = 1;
  }
  json_decref(root);
  return rc;
}

/* One function tool's call: {"job_id", "episode_id", "name", "arguments", "item"} POSTed to its
 * URL; the content and how it went into a. */
static void run_http(struct toolbox *tb, const struct tool *t, const struct call *c,
                     struct tool_answer *a) {
  json_t *body =
      json_pack("{s:s, s:s, s:s, s:O, s:O}", "job_id", c->job_id, "episode_id", c->episode_id,
                "name", t->name, "arguments", c->args, "item", c->item ? c->item : json_null());
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) {
    a->err = TOOL_ERROR;
    a->content = strdup("error: out of memory calling the tool");
    return;
  }
  char what[400] = "";
  post_with_retries(tb, t, t->out, text, c, read_tool_reply, a, what, sizeof what);
  if (!a->content)
    a->content = dup_printf("error: the tool %s failed (%s after %d attempt%s)", t->name, what,
                            a->attempts, a->attempts == 1 ? "" : "s");
  free(text);
}

/* An environment's reply (env.h); a close's is not read. */
static int read_env_reply(const struct call *c, const struct outside_xfer *x, struct tool_answer *a,
                          char *what, size_t cap) {
  char why[300];
  if (c->op != ENV_CLOSE && env_reply_parse(x->reply, x->reply_n, &a->env, why, sizeof why)) {
    char q[256];
    outside_quote_reply(x, q, sizeof q);
    snprintf(what, cap, "malformed reply: %.160s: %.200s", why, q);
    return 1;
  }
  a->err = TOOL_OK;
  return 0;
}

static const char *const OPENENV_TYPES[3] = {"reset", "step", "close"}; /* by enum env_op */

/* The message an openenv call sends (docs/AGENTS.md): /reset's body as reset's data, the
 * action's text under action_field as step's, a close bare. Owned text; NULL out of memory. */
static char *openenv_message(const struct tool *t, const struct call *c) {
  json_t *m = json_pack("{s:s}", "type", OPENENV_TYPES[c->op]);
  if (m && c->op == ENV_RESET) {
    json_object_set(m, "data", c->args);
  } else if (m && c->op == ENV_STEP) {
    const char *text =
        json_string_value(json_object_get(json_object_get(c->args, "action"), "content"));
    json_object_set_new(m, "data", json_pack("{s:s}", t->action_field, text ? text : ""));
  }
  char *out = m ? json_dumps(m, JSON_COMPACT) : NULL;
  json_decref(m);
  return out;
}

/* One openenv call on the episode's WebSocket session: a reset opens a fresh socket, retried
 * (each time on a new one) as an http environment's calls are; a step is not retried (the
 * session's state would be lost or doubled); a close is best effort. The reply read into
 * a->env, or why it failed in a->content. */
static void run_openenv(struct toolbox *tb, const struct tool *t, const struct call *c,
                        struct tool_answer *a) {
  const char *id = json_string_value(json_object_get(c->args, "episode_id"));
  char *text = openenv_message(t, c), what[400] = "";
  a->attempts = 0;
  if (!text || !id) {
    a->err = TOOL_ERROR;
    a->content = strdup("out of memory calling the environment");
    free(text);
    return;
  }
  enum openenv_op op = c->op == ENV_RESET  ? OPENENV_OPEN
                       : c->op == ENV_STEP ? OPENENV_SEND
                                           : OPENENV_CLOSE;
  for (a->attempts = 1;; a->attempts++) {
    char *reply = NULL, why[300];
    size_t n = 0;
    enum outside_outcome o = openenv_call(t->oe, id, op, text, strlen(text), t->timeout_ms,
                                          t->max_answer_bytes, &reply, &n, what, sizeof what);
    int retry = o != OUT_REFUSED;
    if (o == OUT_OK && op == OPENENV_CLOSE) {
      a->err = TOOL_OK;
    } else if (o == OUT_OK) {
      int r =
          env_openenv_reply_parse(reply, n, t->observation_field[0] ? t->observation_field : NULL,
                                  &a->env, why, sizeof why);
      if (r == 0) {
        a->err = TOOL_OK;
      } else if (r > 0) {
        a->err = TOOL_HTTP_ERROR;
        snprintf(what, sizeof what, "%s", why);
      } else {
        struct outside_xfer x = {.reply = reply, .reply_n = n};
        char q[256];
        outside_quote_reply(&x, q, sizeof q);
        a->err = TOOL_PARSE_ERROR;
        snprintf(what, sizeof what, "malformed reply: %.160s: %.200s", why, q);
      }
    } else {
      a->err = o == OUT_TIMEOUT     ? TOOL_TIMEOUT
               : o == OUT_TOO_LARGE ? TOOL_PARSE_ERROR
                                    : TOOL_HTTP_ERROR;
    }
    free(reply);
    if (a->err == TOOL_OK || op != OPENENV_OPEN || !retry || a->attempts > t->max_retries ||
        stopping(tb))
      break;
    pause_ms(tb, outside_backoff_ms(a->attempts));
  }
  if (a->err != TOOL_OK)
    a->content = dup_printf("the environment's %s failed (%s after %d attempt%s)",
                            OPENENV_TYPES[c->op], what, a->attempts, a->attempts == 1 ? "" : "s");
  free(text);
}

/* One environment call (its body is the call's), with its retries: the reply read into a->env,
 * or why it failed in a->content. A /step is retried as a judge's call is; the body carries the
 * turn so that an environment can recognise a step it has already taken (docs/AGENTS.md). */
static void run_env(struct toolbox *tb, const struct tool *t, const struct call *c,
                    struct tool_answer *a) {
  if (t->oe) {
    run_openenv(tb, t, c, a);
    return;
  }
  char *text = json_dumps(c->args, JSON_COMPACT);
  if (!text) {
    a->err = TOOL_ERROR;
    a->content = strdup("out of memory calling the environment");
    return;
  }
  char what[400] = "";
  post_with_retries(tb, t, t->env[c->op], text, c, read_env_reply, a, what, sizeof what);
  if (a->err != TOOL_OK)
    a->content = dup_printf("the environment's /%s failed (%s after %d attempt%s)",
                            ENV_ROUTES[c->op], what, a->attempts, a->attempts == 1 ? "" : "s");
  free(text);
}

/* The python tool's program: the code from stdin run as __main__, its prints and errors (a
 * traceback) captured together and written back. */
static const char PY_RUNNER[] =
    "import contextlib, io, sys, traceback\n"
    "code = sys.stdin.read()\n"
    "buf = io.StringIO()\n"
    "with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
    "    try:\n"
    "        exec(compile(code, '<tool>', 'exec'), {'__name__': '__main__'})\n"
    "    except SystemExit:\n"
    "        pass\n"
    "    except BaseException:\n"
    "        traceback.print_exc(limit=-4)\n"
    "sys.__stdout__.write(buf.getvalue())\n";

static void run_python(const struct tool *t, const struct call *c, struct tool_answer *a) {
  a->attempts = 1;
  const char *code = json_string_value(json_object_get(c->args, "code"));
  if (!code) {
    a->err = TOOL_BAD_ARGUMENTS;
    a->content = strdup("error: arguments.code: expected a string");
    return;
  }
  struct sandbox_limits lim = {.wall_ms = t->timeout_ms,
                               .wall_s = (t->timeout_ms + 999) / 1000,
                               .memory = (long)512 << 20,
                               .output_bytes = t->max_answer_bytes * 4 + 4096};
  char *out = NULL, why[256] = "";
  int r = sandbox_run(PY_RUNNER, code, strlen(code), &lim, &out, why, sizeof why);
  if (r < 0) {
    a->err = TOOL_ERROR;
    a->content = dup_printf("error: the python sandbox could not start: %s", why);
  } else if (r == 1) {
    a->err = TOOL_TIMEOUT;
    a->content = dup_printf("%s\nerror: the code was stopped at its limits (timeout_ms %d, "
                            "512 MiB, output)",
                            out ? out : "", t->timeout_ms);
  } else {
    a->err = TOOL_OK;
    a->content = out;
    out = NULL;
  }
  free(out);
}

/* s cut at max bytes on a character boundary, the cut marked: a new string; NULL when s fits
 * (or out of memory). */
static char *cut(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n <= max) return NULL;
  size_t keep = 0;
  while (keep < max) {
    size_t l = utf8_next((const unsigned char *)s + keep, n - keep, NULL);
    if (!l || keep + l > max) break;
    keep += l;
  }
  static const char MARK[] = "\n[truncated]";
  char *o = malloc(keep + sizeof MARK);
  if (!o) return NULL;
  memcpy(o, s, keep);
  memcpy(o + keep, MARK, sizeof MARK);
  return o;
}

/* Cuts a tool's answer to max bytes (the call counts as truncated). */
static void bound_answer(struct tool_answer *a, size_t max) {
  char *c = a->content ? cut(a->content, max) : NULL;
  if (!c) return;
  free(a->content);
  a->content = c;
  if (a->err == TOOL_OK) a->err = TOOL_TRUNCATED;
}

/* Cuts each message of an environment's observation to max bytes, as a tool's answer is cut. */
static void bound_observation(struct tool_answer *a, size_t max) {
  size_t i;
  json_t *m;
  json_array_foreach(a->env.messages, i, m) {
    char *c = cut(json_string_value(json_object_get(m, "content")), max);
    if (c) json_object_set_new(m, "content", json_string(c));
    free(c);
  }
}

static void *worker_main(void *p) {
  struct worker *w = p;
  struct toolbox *tb = w->tb;
  const struct tool *t = &tb->tools[w->tool];
  pthread_mutex_lock(&tb->mu);
  for (;;) {
    struct call *c = NULL, **at = &tb->head, *prev = NULL;
    while (!tb->stop) {
      for (at = &tb->head, prev = NULL; *at && (*at)->tool != w->tool;
           prev = *at, at = &(*at)->next) {
      }
      if (*at) break;
      pthread_cond_wait(&tb->work, &tb->mu);
    }
    if (tb->stop) break;
    c = *at;
    *at = c->next;
    if (tb->tail == c) tb->tail = prev;
    pthread_mutex_unlock(&tb->mu);

    struct tool_answer *a = &c->a;
    a->tag = c->tag;
    if (t->kind == TK_ENV) {
      run_env(tb, t, c, a);
      bound_observation(a, t->max_answer_bytes);
    } else {
      if (t->kind == TK_HTTP)
        run_http(tb, t, c, a);
      else
        run_python(t, c, a);
      if (!a->content) a->content = strdup(""); /* out of memory: NULL when taken */
      bound_answer(a, t->max_answer_bytes);
    }
    a->ms = (double)(outside_now_ms() - c->t0);

    pthread_mutex_lock(&tb->mu);
    if (c->tag < 0) { /* a close: nobody takes its answer */
      tool_answer_clear(a);
      json_decref(c->args);
      free(c);
      tb->closing--;
      pthread_cond_broadcast(&tb->answered);
      continue;
    }
    c->next = NULL;
    if (tb->done_tail)
      tb->done_tail->next = c;
    else
      tb->done_head = c;
    tb->done_tail = c;
    pthread_cond_broadcast(&tb->answered);
  }
  pthread_mutex_unlock(&tb->mu);
  return NULL;
}

/* ---- the toolbox ---- */

/* Waits (the mutex held) until an answer comes or ms pass. */
static void wait_answered(struct toolbox *tb, int64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&tb->answered, &tb->mu, &ts);
}

/* How long toolbox_free waits for an environment's closes to go out. */
#define CLOSE_DRAIN_MS 5000

void toolbox_free(struct toolbox *tb) {
  if (!tb) return;
  pthread_mutex_lock(&tb->mu);
  /* calls nobody will take are dropped; an environment's closes are given CLOSE_DRAIN_MS to go
   * out, so that it can free its episodes (best effort) */
  for (struct call **at = &tb->head; *at;) {
    struct call *c = *at;
    if (c->tag < 0) {
      at = &c->next;
      continue;
    }
    *at = c->next;
    json_decref(c->args);
    free(c);
  }
  tb->tail = NULL;
  for (struct call *c = tb->head; c; c = c->next) tb->tail = c;
  int64_t until = outside_now_ms() + CLOSE_DRAIN_MS;
  while (tb->closing > 0 && outside_now_ms() < until) {
    wait_answered(tb, 50);
  }
  __atomic_store_n(&tb->stop, 1, __ATOMIC_RELAXED);
  pthread_cond_broadcast(&tb->work);
  pthread_mutex_unlock(&tb->mu);
  for (int i = 0; i < tb->n; i++) openenv_abort(tb->tools[i].oe);
  for (int i = 0; i < tb->n_workers; i++)
    if (tb->workers[i].started) pthread_join(tb->workers[i].th, NULL);
  free(tb->workers);
  for (struct call *c = tb->head, *n; c; c = n) {
    n = c->next;
    json_decref(c->args);
    free(c);
  }
  for (struct call *c = tb->done_head, *n; c; c = n) {
    n = c->next;
    tool_answer_clear(&c->a);
    json_decref(c->args);
    free(c);
  }
  for (int i = 0; i < tb->n; i++) {
    json_decref(tb->tools[i].function);
    jschema_free(tb->tools[i].params);
    outside_free(tb->tools[i].out);
    for (int k = 0; k < 3; k++) outside_free(tb->tools[i].env[k]);
    openenv_free(tb->tools[i].oe);
  }
  pthread_mutex_destroy(&tb->mu);
  pthread_cond_destroy(&tb->work);
  pthread_cond_destroy(&tb->answered);
  free(tb);
}

static struct toolbox *toolbox_alloc(const char *field, struct dapo_err *e) {
  struct toolbox *tb = calloc(1, sizeof *tb);
  if (!tb) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  pthread_mutex_init(&tb->mu, NULL);
  pthread_cond_init(&tb->work, NULL);
  pthread_cond_init(&tb->answered, NULL);
  return tb;
}

/* Starts each tool's `concurrency` threads (rc: the building's outcome so far), or frees tb. */
static struct toolbox *toolbox_start(struct toolbox *tb, int rc, const char *field,
                                     struct dapo_err *e) {
  int threads = 0;
  for (int i = 0; i < tb->n; i++) threads += tb->tools[i].concurrency;
  if (!rc && threads > TOOL_THREADS_MAX)
    rc = dapo_errf(e, DAPO_EINVAL, "%s: the tools' concurrency adds up to %d (at most %d)", field,
                   threads, TOOL_THREADS_MAX);
  if (!rc && !(tb->workers = calloc((size_t)threads, sizeof *tb->workers)))
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  for (int i = 0; !rc && i < tb->n; i++)
    for (int k = 0; !rc && k < tb->tools[i].concurrency; k++) {
      struct worker *w = &tb->workers[tb->n_workers++];
      w->tb = tb;
      w->tool = i;
      if (pthread_create(&w->th, NULL, worker_main, w))
        rc = dapo_errf(e, DAPO_EIO, "%s: cannot start a tool thread", field);
      else
        w->started = 1;
    }
  if (rc) {
    toolbox_free(tb);
    return NULL;
  }
  return tb;
}

struct toolbox *toolbox_new(const json_t *spec, const struct judge_policy *pol, const char *field,
                            struct dapo_err *e) {
  if (!json_is_array(spec) || json_array_size(spec) == 0 || json_array_size(spec) > TOOLS_MAX) {
    dapo_errf(e, DAPO_EINVAL, "%s: expected a list of 1 to %d tools", field, TOOLS_MAX);
    return NULL;
  }
  struct toolbox *tb = toolbox_alloc(field, e);
  if (!tb) return NULL;
  int rc = 0;
  for (size_t i = 0; i < json_array_size(spec) && !rc; i++) {
    const json_t *ts = json_array_get(spec, i);
    char sub[256];
    snprintf(sub, sizeof sub, "%s[%zu]", field, i);
    struct tool *t = &tb->tools[tb->n++];
    const char *type = json_string_value(json_object_get(ts, "type"));
    if (!json_is_object(ts))
      rc = dapo_errf(e, DAPO_EINVAL, "%s: expected a tool object", sub);
    else if (type && !strcmp(type, "function"))
      rc = build_http(t, ts, sub, pol, e);
    else if (type && !strcmp(type, "python"))
      rc = build_python(t, ts, sub, e);
    else
      rc = dapo_errf(e, DAPO_EINVAL, "%s.type: expected \"function\" or \"python\"", sub);
    for (int k = 0; !rc && k < tb->n - 1; k++)
      if (!strcmp(tb->tools[k].name, t->name))
        rc = dapo_errf(e, DAPO_EINVAL, "%s: a second tool named '%s'", sub, t->name);
  }
  return toolbox_start(tb, rc, field, e);
}

/* An openenv environment's own fields (action_field, observation_field: names) into t, and
 * its client. */
static int build_openenv(struct tool *t, const json_t *spec, const char *field,
                         const struct judge_policy *pol, struct dapo_err *e) {
  static const char *const names[2] = {"action_field", "observation_field"};
  char *const into[2] = {t->action_field, t->observation_field};
  for (int k = 0; k < 2; k++) {
    const json_t *v = json_object_get(spec, names[k]);
    if (v && !json_is_null(v) && (!json_is_string(v) || !tc_valid_name(json_string_value(v))))
      return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected " TC_NAME_RULE, field, names[k]);
    snprintf(into[k], NAME_MAX_LEN + 1, "%s",
             json_is_string(v) ? json_string_value(v)
             : k == 0          ? "message"
                               : "");
  }
  t->oe =
      openenv_new(field, json_object_get(spec, "url"), json_object_get(spec, "headers"), pol, e);
  return t->oe ? 0 : e->code;
}

/* An environment's spec into t: an http environment's three routes under the URL, each an
 * outside party, or an openenv environment's WebSocket client. */
static int build_env(struct tool *t, const json_t *spec, const char *field,
                     const struct judge_policy *pol, struct dapo_err *e) {
  static const char *const http_fields[] = {
      "type",        "url",         "headers",          "timeout_ms",
      "concurrency", "max_retries", "max_answer_bytes", NULL};
  static const char *const openenv_fields[] = {
      "type",       "url",         "action_field", "observation_field", "headers",
      "timeout_ms", "concurrency", "max_retries",  "max_answer_bytes",  NULL};
  if (!json_is_object(spec))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected an object such as {\"type\": \"http\", \"url\": "
                     "\"http://127.0.0.1:8000\"}",
                     field);
  const char *type = json_string_value(json_object_get(spec, "type"));
  int openenv = type && !strcmp(type, "openenv");
  if (!openenv && (!type || strcmp(type, "http")))
    return dapo_errf(e, DAPO_EINVAL, "%s.type: expected \"http\" or \"openenv\"", field);
  int rc = check_fields(spec, field, openenv ? openenv_fields : http_fields, e);
  if (!rc) rc = get_http_limits(t, spec, field, e);
  if (rc) return rc;
  snprintf(t->name, sizeof t->name, "%s", "environment");
  t->kind = TK_ENV;
  if (openenv) return build_openenv(t, spec, field, pol, e);
  const char *url = json_string_value(json_object_get(spec, "url"));
  if (!url) return dapo_errf(e, DAPO_EINVAL, "%s.url: required, an http:// or https:// URL", field);
  if (strpbrk(url, "?#"))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.url: no query or fragment (dapod POSTs to the URL's /reset, /step and "
                     "/close)",
                     field);
  size_t n = strlen(url);
  while (n > 0 && url[n - 1] == '/') n--;
  for (int k = 0; k < 3 && !rc; k++) {
    char *route = dup_printf("%.*s/%s", (int)n, url, ENV_ROUTES[k]);
    json_t *u = route ? json_string(route) : NULL;
    free(route);
    if (!u) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    t->env[k] = outside_new(field, "environment", u, json_object_get(spec, "headers"), pol, e);
    json_decref(u);
    if (!t->env[k]) rc = e->code;
  }
  return rc;
}

struct toolbox *toolbox_new_env(const json_t *spec, const struct judge_policy *pol,
                                const char *field, struct dapo_err *e) {
  struct toolbox *tb = toolbox_alloc(field, e);
  if (!tb) return NULL;
  tb->n = 1;
  return toolbox_start(tb, build_env(&tb->tools[0], spec, field, pol, e), field, e);
}

int toolbox_is_env(const struct toolbox *tb) {
  return tb && tb->n == 1 && tb->tools[0].kind == TK_ENV;
}

int toolbox_count(const struct toolbox *tb) {
  return tb ? tb->n : 0;
}

const char *toolbox_name(const struct toolbox *tb, int i) {
  return tb->tools[i].name;
}

const json_t *toolbox_function(const struct toolbox *tb, int i) {
  return tb->tools[i].function;
}

int toolbox_find(const struct toolbox *tb, const char *name) {
  for (int i = 0; tb && i < tb->n; i++)
    if (!strcmp(tb->tools[i].name, name)) return i;
  return -1;
}

int toolbox_check_args(const struct toolbox *tb, int i, const json_t *args, char *why, size_t cap) {
  const struct tool *t = &tb->tools[i];
  return t->params ? jschema_check(t->params, args, "arguments", why, cap) : 0;
}

/* Queues c for its tool's threads. */
static void enqueue(struct toolbox *tb, struct call *c) {
  c->t0 = outside_now_ms();
  pthread_mutex_lock(&tb->mu);
  if (tb->tail)
    tb->tail->next = c;
  else
    tb->head = c;
  tb->tail = c;
  if (c->tag >= 0)
    tb->pending++;
  else
    tb->closing++;
  pthread_cond_broadcast(&tb->work);
  pthread_mutex_unlock(&tb->mu);
}

int toolbox_submit(struct toolbox *tb, int tag, int i, json_t *arguments, const json_t *item,
                   const char *job_id, const char *episode_id) {
  struct call *c = calloc(1, sizeof *c);
  if (!c) {
    json_decref(arguments);
    return DAPO_ENOMEM;
  }
  c->tag = tag;
  c->tool = i;
  c->op = -1;
  c->args = arguments;
  c->item = item;
  snprintf(c->job_id, sizeof c->job_id, "%s", job_id ? job_id : "");
  snprintf(c->episode_id, sizeof c->episode_id, "%s", episode_id ? episode_id : "");
  enqueue(tb, c);
  return 0;
}

int toolbox_submit_env(struct toolbox *tb, int tag, enum env_op op, json_t *body) {
  struct call *c = calloc(1, sizeof *c);
  if (!c) {
    json_decref(body);
    return DAPO_ENOMEM;
  }
  c->tag = op == ENV_CLOSE ? -1 : tag;
  c->op = (int)op;
  c->args = body;
  enqueue(tb, c);
  return 0;
}

void tool_answer_clear(struct tool_answer *a) {
  free(a->content);
  a->content = NULL;
  env_reply_clear(&a->env);
}

int toolbox_pending(const struct toolbox *tb) {
  struct toolbox *m = (struct toolbox *)tb; /* the mutex is not part of its state */
  pthread_mutex_lock(&m->mu);
  int n = m->pending;
  pthread_mutex_unlock(&m->mu);
  return n;
}

int toolbox_take(struct toolbox *tb, struct tool_answer *out, int cap, int wait_ms,
                 const volatile int *cancel) {
  int n = 0;
  pthread_mutex_lock(&tb->mu);
  int64_t until = wait_ms > 0 ? outside_now_ms() + wait_ms : 0;
  while (!tb->done_head && wait_ms != 0 && tb->pending > 0) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) break;
    int64_t now = outside_now_ms();
    if (wait_ms > 0 && now >= until) break;
    wait_answered(tb, wait_ms > 0 && until - now < 50 ? until - now : 50);
  }
  while (tb->done_head && n < cap) {
    struct call *c = tb->done_head;
    tb->done_head = c->next;
    if (!tb->done_head) tb->done_tail = NULL;
    out[n++] = c->a;
    json_decref(c->args);
    free(c);
    tb->pending--;
  }
  pthread_mutex_unlock(&tb->mu);
  return n;
}
