/* The http judge against clients/judges/math_judge.py, started here on free loopback ports
 * (Debian's /usr/bin/python3; skipped with 77 when it is missing): rewards for a batch of 40 in 8
 * groups with groups never split (the server logs the groups of each request), overlapping
 * requests with concurrency > 1 and none with 1, retries after 500s, timeouts, garbage replies,
 * missing ids, out-of-range rewards, 404 not retried, refused connections and addresses, cancel,
 * and the OpenRLHF format. Every wait has a deadline. */
#include "check.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "judge.h"
#include "parse.h"

#ifndef DAPO_MATH_JUDGE_SCRIPT
#define DAPO_MATH_JUDGE_SCRIPT "../clients/judges/math_judge.py"
#endif
#define PYTHON "/usr/bin/python3"

static const char *str_or(const json_t *v) {
  const char *s = json_string_value(v);
  return s ? s : "";
}

/* Starts math_judge.py with extra flags (NULL-terminated) and reads its port (tests/child.h). */
static int server_start(struct child *s, const char *const *flags) {
  const char *argv[16] = {PYTHON, DAPO_MATH_JUDGE_SCRIPT, "--host", "127.0.0.1", "--port", "0"};
  int argc = 6;
  for (int i = 0; flags && flags[i] && argc < 15; i++) argv[argc++] = flags[i];
  argv[argc] = NULL;
  return child_start(s, argv);
}

struct buf {
  char *p;
  size_t n;
};

static size_t on_body(char *d, size_t size, size_t nmemb, void *u) {
  struct buf *b = u;
  size_t k = size * nmemb;
  if (b->n + k > (1u << 24)) return 0;
  char *p = realloc(b->p, b->n + k + 1);
  if (!p) return 0;
  memcpy(p + b->n, d, k);
  b->p = p;
  b->n += k;
  b->p[b->n] = '\0';
  return k;
}

/* GET /log: the server's record of every judged request. */
static json_t *server_log(const struct child *s) {
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/log", s->port);
  struct buf b = {0};
  CURL *c = curl_easy_init();
  if (!c) return NULL;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  CURLcode cc = curl_easy_perform(c);
  curl_easy_cleanup(c);
  json_t *j = cc == CURLE_OK && b.p ? json_loads(b.p, 0, NULL) : NULL;
  free(b.p);
  json_t *reqs = json_incref(json_object_get(j, "requests"));
  json_decref(j);
  CHECK_MSG(json_is_array(reqs), "GET /log failed (curl %d)", (int)cc);
  return reqs;
}

static struct judge *make_judge(const char *fmt_spec, const struct child *s,
                                const struct judge_policy *pol, const char *path) {
  char text[1024];
  snprintf(text, sizeof text, fmt_spec, s ? s->port : 1, path ? path : "/score");
  json_error_t jerr;
  json_t *spec = json_loads(text, 0, &jerr);
  CHECK_MSG(spec != NULL, "bad spec %s: %s", text, jerr.text);
  struct dapo_err e = {0};
  struct judge *j = judge_new(spec, pol, &e);
  CHECK_MSG(j != NULL, "judge_new(%s): %s", text, e.msg);
  json_decref(spec);
  return j;
}

/* n items in n_groups interleaved groups; item i is right when i % 3 != 0. */
struct batch {
  struct judge_item items[64];
  struct judge_result res[64];
  char ids[64][16], resp[64][48], ans[64][16];
  json_t *meta;
  int n;
};

static void batch_fill(struct batch *b, int n, int n_groups) {
  memset(b->items, 0, sizeof b->items);
  b->n = n;
  b->meta = json_pack("{ss}", "source", "gsm8k");
  for (int i = 0; i < n; i++) {
    snprintf(b->ids[i], sizeof b->ids[i], "s-%d", i);
    snprintf(b->ans[i], sizeof b->ans[i], "%d", 10 + i);
    if (i % 3)
      snprintf(b->resp[i], sizeof b->resp[i], "so \\boxed{%d}.", 10 + i);
    else
      snprintf(b->resp[i], sizeof b->resp[i], "#### %d", 1000 + i);
    b->items[i] = (struct judge_item){.id = b->ids[i],
                                      .group = i % n_groups,
                                      .prompt = "Q: ",
                                      .response = b->resp[i],
                                      .answer = b->ans[i],
                                      .metadata = b->meta,
                                      .response_tokens = 5 + i,
                                      .truncated = i == 1};
  }
}

static void batch_done(struct batch *b) {
  judge_results_release(b->res, b->n);
  json_decref(b->meta);
  b->meta = NULL;
}

static int batch_all_right(const struct batch *b, int with_correct) {
  int ok = 0;
  for (int i = 0; i < b->n; i++) {
    int right = i % 3 != 0;
    ok += b->res[i].err == JE_NONE && b->res[i].reward == (right ? 1.0 : -1.0) &&
          b->res[i].correct == (with_correct ? right : -1) && b->res[i].mask == 0;
  }
  return ok == b->n;
}

/* Requests logged from index from on: does any pair overlap in time? */
static int any_overlap(json_t *log, size_t from) {
  size_t n = json_array_size(log);
  for (size_t a = from; a < n; a++)
    for (size_t b = a + 1; b < n; b++) {
      double s1 = json_number_value(json_object_get(json_array_get(log, a), "start"));
      double e1 = json_number_value(json_object_get(json_array_get(log, a), "end"));
      double s2 = json_number_value(json_object_get(json_array_get(log, b), "start"));
      double e2 = json_number_value(json_object_get(json_array_get(log, b), "end"));
      if (s1 < e2 && s2 < e1) return 1;
    }
  return 0;
}

static const char *HTTP_SPEC = "{\"type\": \"http\", \"url\": \"http://127.0.0.1:%d%s\", "
                               "\"max_batch\": 10, \"concurrency\": 4, \"timeout_ms\": 5000, "
                               "\"headers\": {\"Authorization\": \"Bearer t0k\"}}";

static void test_batch(const struct child *s) {
  struct batch b;
  batch_fill(&b, 40, 8);
  struct judge *j = make_judge(HTTP_SPEC, s, NULL, NULL);
  struct judge_stats st = {0};
  struct dapo_err e = {0};
  double t0 = child_now_s();
  int rc = j ? judge_run(j, "job-1", 7, b.items, b.n, b.res, &st, NULL, &e) : -1;
  double dt = child_now_s() - t0;
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 1));
  const char *x = json_string_value(json_object_get(b.res[2].info, "extracted"));
  CHECK_MSG(x && !strcmp(x, "12"), "info.extracted '%s'", x);
  CHECK_MSG(st.n_requests == 4 && st.n_retries == 0 && st.n_http_error == 0, "requests %d",
            st.n_requests);
  CHECK(st.seconds > 0 && st.seconds <= dt + 0.01);
  fprintf(stderr, "batch of 40 in 4 requests, concurrency 4, server delay 150 ms: %.3f s\n", dt);

  json_t *log = server_log(s);
  CHECK_MSG(json_array_size(log) == 4, "%zu requests logged", json_array_size(log));
  int seen[8] = {0}, sizes_ok = 1;
  size_t k;
  json_t *r;
  json_array_foreach(log, k, r) {
    json_t *groups = json_object_get(r, "groups");
    sizes_ok &= json_integer_value(json_object_get(r, "n")) == 10 && json_array_size(groups) == 2;
    size_t g;
    json_t *gv;
    json_array_foreach(groups, g, gv) {
      json_int_t id = json_integer_value(gv);
      if (id >= 0 && id < 8) seen[id]++;
    }
    CHECK(!strcmp(str_or(json_object_get(r, "authorization")), "Bearer t0k"));
    CHECK(!strcmp(str_or(json_object_get(r, "content_type")), "application/json"));
    CHECK(!strcmp(str_or(json_object_get(r, "job_id")), "job-1"));
    CHECK(json_integer_value(json_object_get(r, "step")) == 7);
  }
  CHECK_MSG(sizes_ok, "each request should carry 10 items of 2 whole groups");
  for (int g = 0; g < 8; g++) CHECK_MSG(seen[g] == 1, "group %d in %d requests", g, seen[g]);
  /* item 1 (group 1) is truncated: finish_reason "length"; metadata travels */
  int lengths = 0, meta_ok = 1;
  json_array_foreach(log, k, r) {
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(r, "finish_reasons"), i, f) lengths +=
        !strcmp(str_or(f), "length");
    json_array_foreach(json_object_get(r, "metadata"), i, f) meta_ok &=
        !strcmp(str_or(json_object_get(f, "source")), "gsm8k");
  }
  CHECK(lengths == 1 && meta_ok);
  CHECK_MSG(any_overlap(log, 0), "concurrency 4: no two requests overlapped on the server");
  json_decref(log);
  judge_results_release(b.res, b.n);
  judge_free(j);

  /* concurrency 1: strictly one request at a time */
  j = make_judge("{\"type\": \"http\", \"url\": \"http://127.0.0.1:%d%s\", \"max_batch\": 10, "
                 "\"concurrency\": 1}",
                 s, NULL, NULL);
  rc = j ? judge_run(j, "job-1", 8, b.items, b.n, b.res, NULL, NULL, &e) : -1;
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 1));
  log = server_log(s);
  CHECK(json_array_size(log) == 8);
  CHECK_MSG(!any_overlap(log, 4), "concurrency 1: requests overlapped");
  json_decref(log);
  judge_results_release(b.res, b.n);
  judge_free(j);
  batch_done(&b);

  /* a group larger than max_batch travels alone and whole: 12 of group 0, then 3 of group 1 */
  batch_fill(&b, 15, 2);
  for (int i = 0; i < 15; i++) b.items[i].group = i < 12 ? 0 : 1;
  j = make_judge(HTTP_SPEC, s, NULL, NULL);
  rc = j ? judge_run(j, NULL, 9, b.items, b.n, b.res, NULL, NULL, &e) : -1;
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 1));
  log = server_log(s);
  CHECK(json_array_size(log) == 10);
  int n12 = 0, n3 = 0;
  for (size_t i = 8; i < json_array_size(log); i++) {
    json_t *q = json_array_get(log, i);
    json_int_t n = json_integer_value(json_object_get(q, "n"));
    size_t ng = json_array_size(json_object_get(q, "groups"));
    n12 += n == 12 && ng == 1;
    n3 += n == 3 && ng == 1;
  }
  CHECK_MSG(n12 == 1 && n3 == 1, "big group: %d requests of 12, %d of 3", n12, n3);
  json_decref(log);
  judge_results_release(b.res, b.n);
  judge_free(j);
  batch_done(&b);
}

static void test_openrlhf(const struct child *s) {
  struct batch b;
  batch_fill(&b, 6, 2);
  struct judge *j = make_judge("{\"type\": \"http\", \"url\": \"http://127.0.0.1:%d%s\", "
                               "\"format\": \"openrlhf\", \"max_batch\": 4}",
                               s, NULL, "/openrlhf");
  struct dapo_err e = {0};
  struct judge_stats st = {0};
  int rc = j ? judge_run(j, NULL, 1, b.items, b.n, b.res, &st, NULL, &e) : -1;
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 0)); /* OpenRLHF replies carry no verdict: correct -1 */
  CHECK(st.n_requests == 2);     /* 2 groups of 3, max_batch 4 */
  judge_results_release(b.res, b.n);
  judge_free(j);
  batch_done(&b);
}

static const char *FAST_SPEC = "{\"type\": \"http\", \"url\": \"http://127.0.0.1:%d%s\", "
                               "\"timeout_ms\": 300, \"max_retries\": %d}";

/* Runs a 4-item batch in 2 groups with FAST_SPEC and max_retries; returns judge_run's code. */
static int run_small(const struct child *s, const char *path, int max_retries,
                     const struct judge_policy *pol, struct batch *b, struct judge_stats *st,
                     struct dapo_err *e, double *seconds, const volatile int *cancel) {
  char spec[512];
  snprintf(spec, sizeof spec, FAST_SPEC, s->port, path ? path : "/score", max_retries);
  json_t *js = json_loads(spec, 0, NULL);
  struct judge *j = judge_new(js, pol, e);
  json_decref(js);
  CHECK_MSG(j != NULL, "%s", e->msg);
  if (!j) return -100;
  batch_fill(b, 4, 2);
  memset(st, 0, sizeof *st);
  double t0 = child_now_s();
  int rc = judge_run(j, "job-2", 1, b->items, b->n, b->res, st, cancel, e);
  *seconds = child_now_s() - t0;
  judge_free(j);
  return rc;
}

static int all_err(const struct batch *b, enum judge_err_kind k) {
  int n = 0;
  for (int i = 0; i < b->n; i++) n += b->res[i].err == k;
  return n == b->n;
}

static void test_not_found(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, "/nope", 3, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EIO, "rc %d", rc);
  CHECK(all_err(&b, JE_HTTP));
  CHECK_MSG(st.n_requests == 1 && st.n_retries == 0 && st.n_http_error == 1,
            "404 must not be retried: %d requests", st.n_requests);
  CHECK_MSG(strstr(e.msg, "HTTP 404 after 1 attempt (not retried): \"{\\\"error\\\": \\\"not "
                          "found: /nope\\\"}\""),
            "%s", e.msg);
  fprintf(stderr, "404: %s\n", e.msg);
  batch_done(&b);
}

static void test_fail_twice(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, NULL, 3, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 1));
  CHECK_MSG(st.n_http_error == 2 && st.n_retries == 2 && st.n_requests == 3,
            "http errors %d retries %d requests %d", st.n_http_error, st.n_retries, st.n_requests);
  CHECK_MSG(dt >= 0.55 && dt < 5, "two backoffs (200 + 400 ms) took %.3f s", dt);
  fprintf(stderr, "500, 500, then 200: %.3f s (backoff 200 + 400 ms)\n", dt);
  batch_done(&b);
}

static void test_fail_spent(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, NULL, 1, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EIO, "rc %d", rc);
  CHECK(all_err(&b, JE_HTTP));
  CHECK(st.n_http_error == 2 && st.n_retries == 1);
  char want[128];
  snprintf(want, sizeof want,
           "judge http://127.0.0.1:%d/score: HTTP 500 after 2 attempts: \"Internal error: "
           "injected failure 2",
           s->port);
  CHECK_MSG(strstr(e.msg, want), "'%s' lacks '%s'", e.msg, want);
  fprintf(stderr, "retries spent: %s\n", e.msg);
  batch_done(&b);
}

static void test_timeouts(const struct child *hang1, const struct child *hang_all) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  /* first attempt hangs past timeout_ms 300, the retry answers */
  int rc = run_small(hang1, NULL, 2, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == 0, "%s", e.msg);
  CHECK(batch_all_right(&b, 1));
  CHECK_MSG(st.n_timeout == 1 && st.n_retries == 1, "timeouts %d retries %d", st.n_timeout,
            st.n_retries);
  CHECK_MSG(dt >= 0.45 && dt < 3, "timeout + backoff took %.3f s", dt);
  fprintf(stderr, "timeout (300 ms) then answer: %.3f s\n", dt);
  batch_done(&b);
  /* every attempt hangs: judge_timeout, bounded by 2 x 300 ms + 200 ms backoff */
  rc = run_small(hang_all, NULL, 1, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EIO, "rc %d", rc);
  CHECK(all_err(&b, JE_TIMEOUT));
  CHECK(st.n_timeout == 2 && st.n_retries == 1);
  CHECK_MSG(dt >= 0.75 && dt < 3, "two timeouts took %.3f s", dt);
  CHECK_MSG(strstr(e.msg, "timed out (timeout_ms 300) after 2 attempts"), "%s", e.msg);
  fprintf(stderr, "two timeouts: %.3f s: %s\n", dt, e.msg);
  batch_done(&b);
}

struct canceller {
  volatile int *flag;
  int after_ms;
};

static void *cancel_later(void *arg) {
  struct canceller *c = arg;
  child_nap_ms(c->after_ms);
  *c->flag = 1;
  return NULL;
}

static void test_cancel(const struct child *hang_all) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  volatile int flag = 0;
  struct canceller c = {&flag, 200};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, cancel_later, &c) == 0);
  /* timeout 300 and 10 retries would take seconds; the flag stops it at ~200 ms */
  int rc = run_small(hang_all, NULL, 10, NULL, &b, &st, &e, &dt, &flag);
  pthread_join(t, NULL);
  CHECK_MSG(rc == DAPO_ECANCELLED, "rc %d: %s", rc, e.msg);
  CHECK(all_err(&b, JE_CANCELLED));
  CHECK_MSG(dt < 1.0, "cancel took %.3f s", dt);
  fprintf(stderr, "cancelled after 200 ms: returned at %.3f s\n", dt);
  batch_done(&b);
}

static void test_garbage(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, NULL, 1, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EFORMAT, "rc %d", rc);
  CHECK(all_err(&b, JE_PARSE));
  CHECK(st.n_parse_error == 2 && st.n_retries == 1);
  CHECK_MSG(strstr(e.msg, "malformed reply (not JSON") &&
                strstr(e.msg, "after 2 attempts: \"this is not JSON {\\\"results\\\": [\""),
            "%s", e.msg);
  fprintf(stderr, "garbage: %s\n", e.msg);
  batch_done(&b);
}

static void test_missing(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, NULL, 1, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EFORMAT, "rc %d", rc);
  CHECK(st.n_parse_error == 2 && st.n_retries == 1);
  /* one request (4 items, 2 groups); the server drops its last result: item 3 (group 1) */
  int judged = 0;
  for (int i = 0; i < 4; i++) judged += b.res[i].err == JE_NONE;
  CHECK_MSG(judged == 3 && b.res[3].err == JE_PARSE, "judged %d, item 3 err %d", judged,
            b.res[3].err);
  CHECK(b.res[0].reward == -1.0 && b.res[1].reward == 1.0 && b.res[2].reward == 1.0);
  CHECK_MSG(strstr(e.msg, "1 of 4 ids unanswered, first 's-3'"), "%s", e.msg);
  fprintf(stderr, "missing id: %s\n", e.msg);
  batch_done(&b);
}

static void test_range(const struct child *s) {
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(s, NULL, 3, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_ERANGE, "rc %d", rc);
  CHECK(all_err(&b, JE_RANGE));
  CHECK_MSG(st.n_out_of_range == 4 && st.n_requests == 1 && st.n_retries == 0,
            "out of range %d, requests %d", st.n_out_of_range, st.n_requests);
  CHECK_MSG(strstr(e.msg, "is outside [-1e6, 1e6] (4 items out of range) after 1 attempt"), "%s",
            e.msg);
  fprintf(stderr, "range: %s\n", e.msg);
  batch_done(&b);
}

static void test_refused(const struct child *s) {
  /* a port nobody listens on: bind one, note it, close it */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0);
  struct child closed = {.pid = -1, .port = ntohs(a.sin_port)};
  close(fd);
  struct batch b;
  struct judge_stats st;
  struct dapo_err e = {0};
  double dt;
  int rc = run_small(&closed, NULL, 1, NULL, &b, &st, &e, &dt, NULL);
  CHECK_MSG(rc == DAPO_EIO, "rc %d", rc);
  CHECK(all_err(&b, JE_CONNECT));
  CHECK(st.n_http_error == 2 && st.n_retries == 1);
  CHECK_MSG(strstr(e.msg, "Couldn't connect") || strstr(e.msg, "connect"), "%s", e.msg);
  fprintf(stderr, "refused: %.3f s: %s\n", dt, e.msg);
  batch_done(&b);

  /* 0.0.0.0 would reach this host's listener: refused before connecting, even when the
   * allowlist names it (tests/security/test_judge_ssrf.c covers the other ranges) */
  const char *hosts[] = {"0.0.0.0"};
  struct judge_policy pol = {.allowed_hosts = hosts, .n_allowed = 1, .allow_private = 1};
  char spec[256];
  snprintf(spec, sizeof spec,
           "{\"type\": \"http\", \"url\": \"http://0.0.0.0:%d/score\", \"max_retries\": 3}",
           s->port);
  json_t *js = json_loads(spec, 0, NULL);
  struct judge *j = judge_new(js, &pol, &e);
  CHECK_MSG(j != NULL, "%s", e.msg);
  batch_fill(&b, 4, 2);
  memset(&st, 0, sizeof st);
  rc = j ? judge_run(j, NULL, 1, b.items, b.n, b.res, &st, NULL, &e) : -1;
  CHECK_MSG(rc == DAPO_EIO && all_err(&b, JE_CONNECT), "rc %d", rc);
  CHECK_MSG(strstr(e.msg, "refused to connect to 0.0.0.0: an unspecified address is never a judge"),
            "%s", e.msg);
  CHECK_MSG(st.n_requests == 1, "a refused address is not retried (%d requests)", st.n_requests);
  fprintf(stderr, "address check: %s\n", e.msg);
  judge_free(j);
  batch_done(&b);
  json_decref(js);
}

static void test_duplicate_ids(const struct child *s) {
  struct judge *j = make_judge(HTTP_SPEC, s, NULL, NULL);
  struct judge_item it[2] = {{.id = "same", .response = "1"}, {.id = "same", .response = "2"}};
  struct judge_result r[2];
  struct dapo_err e = {0};
  int rc = j ? judge_run(j, NULL, 0, it, 2, r, NULL, NULL, &e) : -1;
  CHECK_MSG(rc == DAPO_EINVAL && strstr(e.msg, "duplicate item id 'same'"), "%s", e.msg);
  judge_free(j);
}

int main(void) {
  if (access(PYTHON, X_OK) != 0 || access(DAPO_MATH_JUDGE_SCRIPT, R_OK) != 0) {
    fprintf(stderr, "test_judge_http: %s or %s missing; skipping\n", PYTHON,
            DAPO_MATH_JUDGE_SCRIPT);
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  double t0 = child_now_s();
  static const char *const f_delay[] = {"--delay-ms", "150", NULL};
  static const char *const f_fail2[] = {"--fail-first", "2", NULL};
  static const char *const f_fail9[] = {"--fail-first", "99", NULL};
  static const char *const f_hang1[] = {"--hang-first", "1", NULL};
  static const char *const f_hang9[] = {"--hang-first", "99", "--hang-ms", "60000", NULL};
  static const char *const f_garb[] = {"--garbage", NULL};
  static const char *const f_omit[] = {"--omit-result", NULL};
  static const char *const f_range[] = {"--reward-override", "1e7", NULL};
  const char *const *flags[] = {f_delay, f_fail2, f_fail9, f_hang1, f_hang9,
                                f_garb,  f_omit,  f_range, NULL};
  enum { N_SERVERS = 8 };
  struct child sv[N_SERVERS];
  int ok = 1;
  for (int i = 0; i < N_SERVERS; i++) {
    int rc = server_start(&sv[i], flags[i]);
    CHECK_MSG(rc == 0, "starting math_judge.py %s failed", flags[i][0]);
    ok &= rc == 0;
  }
  fprintf(stderr, "8 judge servers up in %.2f s\n", child_now_s() - t0);
  if (ok) {
    test_batch(&sv[0]);
    test_openrlhf(&sv[0]);
    test_not_found(&sv[0]);
    test_duplicate_ids(&sv[0]);
    test_fail_twice(&sv[1]);
    test_fail_spent(&sv[2]);
    test_timeouts(&sv[3], &sv[4]);
    test_cancel(&sv[4]);
    test_garbage(&sv[5]);
    test_missing(&sv[6]);
    test_range(&sv[7]);
    test_refused(&sv[0]);
  }
  for (int i = 0; i < N_SERVERS; i++) child_stop(&sv[i]);
  judge_global_cleanup();
  curl_global_cleanup();
  fprintf(stderr, "test_judge_http: %.2f s\n", child_now_s() - t0);
  return check_done("test_judge_http");
}
