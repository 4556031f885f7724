/* dapod-c-judge: an example reward server for dapod's http judge, in C (libmicrohttpd +
 * jansson). POST /score (also POST /) takes dapod's judge request and answers one result per
 * item; GET /stats counts what it judged; GET /healthz. The scoring rule is in score() and
 * clients/judges/README.md. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parse.h"

#define MAX_ITEMS 65536

static size_t max_body = (size_t)16 << 20;
static atomic_long n_requests, n_items, n_bad;

/* ---- the rule ---- */

static int is_digit(char c) {
  return c >= '0' && c <= '9';
}

/* The last number in s: -?[0-9]+(\.[0-9]+)?, matched left to right without overlap. Writes
 * its start and length; returns 0 when there is none. */
static int last_number(const char *s, size_t *start, size_t *len) {
  int found = 0;
  size_t i = 0;
  while (s[i]) {
    if (is_digit(s[i]) || (s[i] == '-' && is_digit(s[i + 1]))) {
      size_t b = i;
      if (s[i] == '-') i++;
      while (is_digit(s[i])) i++;
      if (s[i] == '.' && is_digit(s[i + 1])) {
        i++;
        while (is_digit(s[i])) i++;
      }
      *start = b;
      *len = i - b;
      found = 1;
    } else {
      i++;
    }
  }
  return found;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Copies s without leading and trailing ASCII white space into a new string (caller frees). */
static char *trimmed(const char *s) {
  while (is_space(*s)) s++;
  size_t n = strlen(s);
  while (n && is_space(s[n - 1])) n--;
  char *t = malloc(n + 1);
  if (t) memcpy(t, s, n), t[n] = '\0';
  return t;
}

/* Whether the whole string is one number of last_number's form. */
static int whole_number(const char *s) {
  size_t b, n;
  return s[0] && last_number(s, &b, &n) && b == 0 && n == strlen(s);
}

/* Scores one response: the last number in it against a numeric answer (compared as doubles),
 * or the trimmed response against a non-numeric answer (exact string). Reward: 1 when correct;
 * for a numeric answer, -0.5 when the response has a number that is wrong (the format was
 * right) and -1 when it has none; -1 for a wrong non-numeric answer. */
static int score(const char *response, const char *answer, double *reward, int *correct,
                 json_t **extracted) {
  char *a = trimmed(answer);
  if (!a) return -1;
  *extracted = json_null();
  if (whole_number(a)) {
    size_t b, n;
    if (!last_number(response, &b, &n)) {
      *reward = -1;
      *correct = 0;
    } else {
      char num[64];
      if (n >= sizeof num) n = sizeof num - 1;
      memcpy(num, response + b, n);
      num[n] = '\0';
      *extracted = json_string(num);
      *correct = strtod(num, NULL) == strtod(a, NULL);
      *reward = *correct ? 1.0 : -0.5;
    }
  } else {
    char *r = trimmed(response);
    if (!r) {
      free(a);
      return -1;
    }
    *correct = !strcmp(r, a);
    *reward = *correct ? 1.0 : -1.0;
    *extracted = json_string(r);
    free(r);
  }
  free(a);
  return 0;
}

/* ---- HTTP ---- */

struct request {
  char *body;
  size_t len;
  int too_large;
};

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result bad(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result bad(struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
  char m[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  atomic_fetch_add(&n_bad, 1);
  return send_json(c, status, json_pack("{s:s}", "error", m));
}

/* Builds the reply of a parsed request, or answers 400 naming the field at fault. */
static enum MHD_Result judge(struct MHD_Connection *c, const struct request *q) {
  json_error_t je;
  json_t *body = json_loadb(q->body ? q->body : "", q->len, 0, &je);
  if (!json_is_object(body)) {
    json_decref(body);
    return bad(c, 400, "body: not a JSON object (%s)", body ? "wrong type" : je.text);
  }
  json_t *items = json_object_get(body, "items");
  if (!json_is_array(items) || json_array_size(items) > MAX_ITEMS) {
    json_decref(body);
    return bad(c, 400, "items: must be an array of at most %d objects", MAX_ITEMS);
  }
  json_t *results = json_array(), *it;
  size_t i;
  json_array_foreach(items, i, it) {
    json_t *id = json_object_get(it, "id");
    const char *resp = json_string_value(json_object_get(it, "response"));
    json_t *ans = json_object_get(it, "answer");
    if (!json_is_object(it) || !json_is_string(id) || !resp ||
        !(json_is_string(ans) || json_is_null(ans))) {
      json_decref(results);
      json_decref(body);
      return bad(c, 400, "items[%zu]: needs string id and response, and answer string or null", i);
    }
    double reward;
    int correct;
    json_t *extracted;
    if (score(resp, json_is_string(ans) ? json_string_value(ans) : "", &reward, &correct,
              &extracted)) {
      json_decref(results);
      json_decref(body);
      return MHD_NO;
    }
    json_array_append_new(results, json_pack("{s:O,s:f,s:b,s:{s:o}}", "id", id, "reward", reward,
                                             "correct", correct, "info", "extracted", extracted));
  }
  atomic_fetch_add(&n_requests, 1);
  atomic_fetch_add(&n_items, (long)json_array_size(items));
  json_decref(body);
  return send_json(c, 200, json_pack("{s:o}", "results", results));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *size, void **state) {
  struct request *q = *state;
  int post = !strcmp(method, "POST");
  if (!q) {
    q = calloc(1, sizeof *q);
    if (!q) return MHD_NO;
    *state = q;
    return MHD_YES;
  }
  if (post && *size) {
    if (!q->too_large && q->len + *size <= max_body) {
      char *b = realloc(q->body, q->len + *size);
      if (!b) return MHD_NO;
      memcpy(b + q->len, data, *size);
      q->body = b;
      q->len += *size;
    } else {
      q->too_large = 1;
    }
    *size = 0;
    return MHD_YES;
  }
  if (post && (!strcmp(url, "/score") || !strcmp(url, "/"))) {
    if (q->too_large) return bad(c, 413, "body: larger than %zu bytes", max_body);
    return judge(c, q);
  }
  if (!strcmp(method, "GET") && !strcmp(url, "/stats"))
    return send_json(c, 200,
                     json_pack("{s:I,s:I,s:I}", "requests", (json_int_t)atomic_load(&n_requests),
                               "items", (json_int_t)atomic_load(&n_items), "bad_requests",
                               (json_int_t)atomic_load(&n_bad)));
  if (!strcmp(method, "GET") && !strcmp(url, "/healthz"))
    return send_json(c, 200, json_pack("{s:b}", "ok", 1));
  return bad(c, 404, "no route %.16s %.200s", method, url);
}

static void on_done(void *cls, struct MHD_Connection *c, void **state,
                    enum MHD_RequestTerminationCode tc) {
  struct request *q = *state;
  if (q) free(q->body);
  free(q);
  *state = NULL;
}

static void help(FILE *f) {
  fprintf(f, "usage: dapod-c-judge [--host ADDR] [--port N] [--max-body BYTES]\n"
             "Serves dapod's http judge format on POST /score (and /); GET /stats, GET /healthz.\n"
             "Prints the bound port on the first line of stdout (--port 0: a free one).\n");
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1";
  int port = 8090;
  struct dapo_err e = {0};
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--host") && v) {
      host = v, i++;
    } else if (!strcmp(argv[i], "--port") && v) {
      if (parse_int(v, 0, 65535, &port, "--port", &e)) break;
      i++;
    } else if (!strcmp(argv[i], "--max-body") && v) {
      int mb;
      if (parse_int(v, 1024, 1 << 30, &mb, "--max-body", &e)) break;
      max_body = (size_t)mb, i++;
    } else {
      snprintf(e.msg, sizeof e.msg, "unknown or incomplete argument '%s'", argv[i]);
      e.code = -1;
      break;
    }
  }
  if (e.code) {
    fprintf(stderr, "dapod-c-judge: %s\n", e.msg);
    help(stderr);
    return 2;
  }
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
  const struct sockaddr *sa;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
    sa = (const struct sockaddr *)&a4;
  } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
    sa = (const struct sockaddr *)&a6;
    flags |= MHD_USE_IPv6;
  } else {
    fprintf(stderr, "dapod-c-judge: --host: '%s' is not an IPv4 or IPv6 address\n", host);
    return 2;
  }
  /* SIGINT/SIGTERM are blocked here, so libmicrohttpd's threads inherit the mask, and taken
   * with sigwait below. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  struct MHD_Daemon *d =
      MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, sa,
                       MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                       MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "dapod-c-judge: cannot listen on %s port %d: %s\n", host, port,
            strerror(errno));
    return 1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  printf("%u\n", info ? (unsigned)info->port : (unsigned)port);
  fflush(stdout);
  int sig;
  while (sigwait(&set, &sig)) {
  }
  MHD_stop_daemon(d);
  return 0;
}
