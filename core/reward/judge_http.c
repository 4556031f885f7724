/* The http judge (API.md "Judges"): packs items into requests of at most max_batch without ever
 * splitting a group, keeps `concurrency` requests in flight on one curl multi handle, retries
 * timeouts, connection errors, 429/5xx and malformed replies with exponential backoff, validates
 * every reply, and refuses hosts outside the allowlist and, in CURLOPT_OPENSOCKETFUNCTION before
 * each connect, addresses in special ranges that the policy does not allow (netaddr.h). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "judge_impl.h"
#include "netaddr.h"
#include "utf8.h"

#define HTTP_MAX_REPLY ((size_t)64 << 20) /* bigger replies are parse errors */
#define HTTP_QUOTE_BYTES 200              /* of a reply body, in error messages */
#define BACKOFF_BASE_MS 200               /* retry k waits 200 ms * 2^(k-1), no jitter */
#define BACKOFF_CAP_MS 10000
#define CONNECT_TIMEOUT_CAP_MS 10000
#define POLL_SLICE_MS 50 /* the cancel flag is read at least this often */
#define MAX_HEADERS 64
#define REWARD_LIMIT 1e6

enum wire_format { FMT_DAPOD, FMT_OPENRLHF };

struct judge_http {
  char *url; /* as re-serialised by curl's URL parser: what was checked is what is requested */
  int timeout_ms, max_batch, concurrency, max_retries;
  enum wire_format format;
  struct curl_slist *headers; /* read-only once built: shared by every transfer */
  /* The connect-time address check (judge_policy): */
  char *host;         /* the URL's host as curl parsed it, without brackets */
  int host_localhost; /* host is "localhost": only loopback addresses */
  char **literals;    /* owned: the allowlist's entries that are IP addresses */
  int n_literals;
  int allow_private;
  struct curl_slist *resolve; /* tests: CURLOPT_RESOLVE entries (judge_policy.resolve) */
};

/* ---- libcurl's global state ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static int curl_inited;

static void curl_init_once(void) {
  curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  curl_inited = curl_init_rc == CURLE_OK;
}

void judge_global_cleanup(void) {
  if (curl_inited) curl_global_cleanup();
  curl_inited = 0;
}

/* ---- Spec ---- */

static int get_int(const json_t *spec, const char *key, int def, int min, int max, int *out,
                   struct dapo_err *e) {
  const json_t *v = json_object_get(spec, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(v))
    return dapo_errf(e, DAPO_EINVAL, "judge.%s: expected an integer in [%d, %d]", key, min, max);
  json_int_t x = json_integer_value(v);
  if (x < min || x > max)
    return dapo_errf(e, DAPO_EINVAL, "judge.%s: %lld not in [%d, %d]", key, (long long)x, min, max);
  *out = (int)x;
  return 0;
}

/* RFC 9110 token characters. */
static int is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int build_headers(struct judge_http *h, const json_t *hdrs, struct dapo_err *e) {
  int has_ctype = 0;
  if (hdrs && !json_is_null(hdrs)) {
    if (!json_is_object(hdrs))
      return dapo_errf(e, DAPO_EINVAL, "judge.headers: expected an object of strings");
    if (json_object_size(hdrs) > MAX_HEADERS)
      return dapo_errf(e, DAPO_EINVAL, "judge.headers: more than %d headers", MAX_HEADERS);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)hdrs, name, v) {
      size_t nl = strlen(name);
      if (nl == 0 || nl > 256)
        return dapo_errf(e, DAPO_EINVAL, "judge.headers: a header name must have 1 to 256 bytes");
      for (size_t i = 0; i < nl; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '\r' || c == '\n')
          return dapo_errf(e, DAPO_EINVAL, "judge.headers: header names cannot contain CR or LF");
        if (!is_tchar(c))
          return dapo_errf(e, DAPO_EINVAL, "judge.headers.%.64s: not a valid header name", name);
      }
      if (!json_is_string(v))
        return dapo_errf(e, DAPO_EINVAL, "judge.headers.%.64s: expected a string", name);
      const char *val = json_string_value(v);
      size_t vl = json_string_length(v);
      if (vl > 8192)
        return dapo_errf(e, DAPO_EINVAL, "judge.headers.%.64s: longer than 8192 bytes", name);
      if (strlen(val) != vl || strpbrk(val, "\r\n"))
        return dapo_errf(e, DAPO_EINVAL,
                         "judge.headers.%.64s: header values cannot contain CR, LF or NUL", name);
      if (!strcasecmp(name, "content-length") || !strcasecmp(name, "transfer-encoding") ||
          !strcasecmp(name, "host") || !strcasecmp(name, "connection"))
        return dapo_errf(e, DAPO_EINVAL, "judge.headers.%.64s: set by the daemon, not the spec",
                         name);
      if (!strcasecmp(name, "content-type")) has_ctype = 1;
      size_t len = nl + vl + 3;
      char *line = malloc(len);
      if (!line) return dapo_errf(e, DAPO_ENOMEM, "judge.headers: out of memory");
      /* "Name;" is curl's way to send a header with an empty value. */
      if (vl)
        snprintf(line, len, "%s: %s", name, val);
      else
        snprintf(line, len, "%s;", name);
      struct curl_slist *l = curl_slist_append(h->headers, line);
      free(line);
      if (!l) return dapo_errf(e, DAPO_ENOMEM, "judge.headers: out of memory");
      h->headers = l;
    }
  }
  static const char *const fixed[] = {"Accept: application/json", "Expect:"};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
    struct curl_slist *l = curl_slist_append(h->headers, fixed[i]);
    if (!l) return dapo_errf(e, DAPO_ENOMEM, "judge.headers: out of memory");
    h->headers = l;
  }
  if (!has_ctype) {
    struct curl_slist *l = curl_slist_append(h->headers, "Content-Type: application/json");
    if (!l) return dapo_errf(e, DAPO_ENOMEM, "judge.headers: out of memory");
    h->headers = l;
  }
  return 0;
}

/* host without IPv6 brackets, compared case-insensitively with one allowlist entry. */
static int host_matches(const char *host, const char *allowed) {
  size_t hl = strlen(host), al = strlen(allowed);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') host++, hl -= 2;
  if (al >= 2 && allowed[0] == '[' && allowed[al - 1] == ']') allowed++, al -= 2;
  return hl == al && !strncasecmp(host, allowed, hl);
}

/* 1 when s is an IPv4 or IPv6 address (brackets allowed). */
static int is_ip_literal(const char *s) {
  char t[INET6_ADDRSTRLEN + 2];
  unsigned char buf[sizeof(struct in6_addr)];
  size_t n = strlen(s);
  if (n >= 2 && s[0] == '[' && s[n - 1] == ']') s++, n -= 2;
  if (n >= sizeof t) return 0;
  memcpy(t, s, n);
  t[n] = '\0';
  return inet_pton(AF_INET, t, buf) == 1 || inet_pton(AF_INET6, t, buf) == 1;
}

static int check_url(struct judge_http *h, const char *url, const struct judge_policy *pol,
                     struct dapo_err *e) {
  static const char *const loopback[] = {"127.0.0.1", "localhost", "::1"};
  const char *const *allowed = loopback;
  int n_allowed = 3;
  if (pol && pol->allowed_hosts && pol->n_allowed > 0) {
    allowed = pol->allowed_hosts;
    n_allowed = pol->n_allowed;
  }
  h->allow_private = pol && pol->allow_private;
  if (!(h->literals = calloc((size_t)n_allowed, sizeof *h->literals)))
    return dapo_errf(e, DAPO_ENOMEM, "judge.url: out of memory");
  for (int i = 0; i < n_allowed; i++) {
    if (!allowed[i] || !is_ip_literal(allowed[i])) continue;
    if (!(h->literals[h->n_literals] = strdup(allowed[i])))
      return dapo_errf(e, DAPO_ENOMEM, "judge.url: out of memory");
    h->n_literals++;
  }
  int rc = 0;
  char *scheme = NULL, *host = NULL, *full = NULL;
  CURLU *u = curl_url();
  if (!u) return dapo_errf(e, DAPO_ENOMEM, "judge.url: out of memory");
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (uc) {
    rc = dapo_errf(e, DAPO_EINVAL, "judge.url: '%.200s' is not a valid URL (%s)", url,
                   curl_url_strerror(uc));
    goto out;
  }
  if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) ||
      (strcasecmp(scheme, "http") && strcasecmp(scheme, "https"))) {
    rc = dapo_errf(e, DAPO_EINVAL, "judge.url: scheme '%.20s' is not http or https",
                   scheme ? scheme : "");
    goto out;
  }
  if (curl_url_get(u, CURLUPART_HOST, &host, 0) || !host || !*host) {
    rc = dapo_errf(e, DAPO_EINVAL, "judge.url: '%.200s' names no host", url);
    goto out;
  }
  int ok = 0;
  for (int i = 0; i < n_allowed && !ok; i++) ok = allowed[i] && host_matches(host, allowed[i]);
  if (!ok) {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "judge.url: host '%.100s' is not in the judge host allowlist (server "
                   "configuration; default: 127.0.0.1, localhost, ::1)",
                   host);
    goto out;
  }
  {
    size_t hl = strlen(host);
    const char *hs = host;
    if (hl >= 2 && hs[0] == '[' && hs[hl - 1] == ']') hs++, hl -= 2;
    if (!(h->host = strndup(hs, hl))) {
      rc = dapo_errf(e, DAPO_ENOMEM, "judge.url: out of memory");
      goto out;
    }
    h->host_localhost = !strcasecmp(h->host, "localhost");
  }
  if (curl_url_get(u, CURLUPART_URL, &full, 0)) {
    rc = dapo_errf(e, DAPO_EINVAL, "judge.url: '%.200s' is not a valid URL", url);
    goto out;
  }
  h->url = strdup(full);
  if (!h->url) rc = dapo_errf(e, DAPO_ENOMEM, "judge.url: out of memory");
out:
  curl_free(scheme);
  curl_free(host);
  curl_free(full);
  curl_url_cleanup(u);
  return rc;
}

struct judge_http *judge_http_new(const json_t *spec, const struct judge_policy *pol,
                                  struct dapo_err *e) {
  static const char *const fields[] = {"type",        "url",     "timeout_ms",  "max_batch",
                                       "concurrency", "headers", "max_retries", "format"};
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)spec, key, val) {
    int ok = 0;
    for (size_t i = 0; i < sizeof fields / sizeof *fields && !ok; i++) ok = !strcmp(fields[i], key);
    if (!ok) {
      dapo_errf(e, DAPO_EINVAL, "judge.%.64s: unknown field", key);
      return NULL;
    }
  }
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_rc != CURLE_OK) {
    dapo_errf(e, DAPO_EIO, "judge: libcurl failed to initialise (%s)",
              curl_easy_strerror(curl_init_rc));
    return NULL;
  }
  struct judge_http *h = calloc(1, sizeof *h);
  if (!h) {
    dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
    return NULL;
  }
  int rc = 0;
  const char *url = json_string_value(json_object_get(spec, "url"));
  const char *fmt = NULL;
  const json_t *fj = json_object_get(spec, "format");
  if (!url) rc = dapo_errf(e, DAPO_EINVAL, "judge.url: required, an http:// or https:// URL");
  if (!rc) rc = check_url(h, url, pol, e);
  if (!rc) rc = get_int(spec, "timeout_ms", 30000, 100, 600000, &h->timeout_ms, e);
  if (!rc) rc = get_int(spec, "max_batch", 64, 1, 4096, &h->max_batch, e);
  if (!rc) rc = get_int(spec, "concurrency", 4, 1, 64, &h->concurrency, e);
  if (!rc) rc = get_int(spec, "max_retries", 3, 0, 10, &h->max_retries, e);
  if (!rc && fj && !json_is_null(fj)) {
    fmt = json_string_value(fj);
    if (fmt && !strcmp(fmt, "dapod"))
      h->format = FMT_DAPOD;
    else if (fmt && !strcmp(fmt, "openrlhf"))
      h->format = FMT_OPENRLHF;
    else
      rc = dapo_errf(e, DAPO_EINVAL, "judge.format: expected \"dapod\" or \"openrlhf\"");
  }
  if (!rc) rc = build_headers(h, json_object_get(spec, "headers"), e);
  for (int i = 0; !rc && pol && pol->resolve && i < pol->n_resolve; i++) {
    struct curl_slist *l = curl_slist_append(h->resolve, pol->resolve[i]);
    if (l)
      h->resolve = l;
    else
      rc = dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
  }
  if (rc) {
    judge_http_free(h);
    return NULL;
  }
  return h;
}

void judge_http_free(struct judge_http *h) {
  if (!h) return;
  curl_slist_free_all(h->headers);
  curl_slist_free_all(h->resolve);
  for (int i = 0; i < h->n_literals; i++) free(h->literals[i]);
  free(h->literals);
  free(h->host);
  free(h->url);
  free(h);
}

/* ---- One run ---- */

enum req_state { RS_WAITING, RS_RUNNING, RS_DONE };

/* One item's verdict from one reply, kept until the attempt is judged whole. */
struct verdict {
  int seen;
  double reward;
  int correct, mask;
  json_t *info; /* owned */
  enum judge_err_kind err;
};

struct req {
  int *idx; /* item indices, in request order; a slice of run.order */
  int n;
  char *body;
  size_t body_len;
  enum req_state state;
  int attempts;
  int64_t next_at_ms; /* monotonic time of the next attempt */
  CURL *easy;
  char *reply; /* this attempt's reply body */
  size_t reply_n, reply_cap;
  int reply_too_big;
  int refused; /* the socket callback refused an address */
  char refused_addr[INET6_ADDRSTRLEN];
  char refused_why[256];
  const struct judge_http *h; /* the judge, for the socket callback */
  char errbuf[CURL_ERROR_SIZE];
  struct verdict *v;             /* [n] */
  const char **sorted_ids;       /* [n] ids of this request sorted, for lookups */
  int *sorted_pos;               /* [n] position in idx of sorted_ids[k] */
  enum judge_err_kind final_err; /* JE_NONE once done and fine */
  char what[400];                /* why it failed ("HTTP 500"), for the error message */
  char tail[400];                /* what follows "after N attempts" (": \"<body>\"") */
};

struct run {
  const struct judge_http *h;
  const struct judge_item *items;
  const char *const *ids;
  struct judge_stats *st;
  struct req *reqs;
  int n_reqs;
  int *order; /* item indices grouped: groups in order of first appearance */
};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct gkey {
  int group, first, idx;
};

static int cmp_group_idx(const void *a, const void *b) {
  const struct gkey *x = a, *y = b;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return (x->idx > y->idx) - (x->idx < y->idx);
}

static int cmp_first_idx(const void *a, const void *b) {
  const struct gkey *x = a, *y = b;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Orders items by group (groups in order of first appearance) and cuts the order into requests
 * of whole groups, at most max_batch items unless a single group is larger. */
static int plan_requests(struct run *r, int n) {
  struct gkey *k = malloc((size_t)n * sizeof *k);
  r->order = malloc((size_t)n * sizeof *r->order);
  r->reqs = calloc((size_t)n, sizeof *r->reqs); /* at most one request per item */
  if (!k || !r->order || !r->reqs) {
    free(k);
    return DAPO_ENOMEM;
  }
  for (int i = 0; i < n; i++) k[i] = (struct gkey){r->items[i].group, i, i};
  qsort(k, (size_t)n, sizeof *k, cmp_group_idx);
  for (int i = 1; i < n; i++)
    if (k[i].group == k[i - 1].group) k[i].first = k[i - 1].first;
  qsort(k, (size_t)n, sizeof *k, cmp_first_idx);
  for (int i = 0; i < n; i++) r->order[i] = k[i].idx;
  int start = 0, cur = 0;
  for (int i = 0; i < n;) {
    int g = i;
    while (g < n && k[g].first == k[i].first) g++;
    int size = g - i;
    if (cur > 0 && cur + size > r->h->max_batch) {
      r->reqs[r->n_reqs++] = (struct req){.idx = r->order + start, .n = cur};
      start += cur;
      cur = 0;
    }
    cur += size;
    i = g;
    if (cur >= r->h->max_batch) {
      r->reqs[r->n_reqs++] = (struct req){.idx = r->order + start, .n = cur};
      start += cur;
      cur = 0;
    }
  }
  if (cur > 0) r->reqs[r->n_reqs++] = (struct req){.idx = r->order + start, .n = cur};
  free(k);
  return 0;
}

static const char *str_or_empty(const char *s) {
  return s ? s : "";
}

/* Adds v (stolen) to array a; returns 0 or -1 (v released). */
static int push(json_t *a, json_t *v) {
  return v ? json_array_append_new(a, v) : -1;
}

static int build_body(const struct run *r, struct req *q, const char *job_id, int64_t step) {
  json_t *root = NULL;
  int bad = 0;
  if (r->h->format == FMT_DAPOD) {
    json_t *arr = json_array();
    root = json_object();
    if (!root || !arr) {
      json_decref(arr);
      json_decref(root);
      return DAPO_ENOMEM;
    }
    bad |= json_object_set_new(root, "job_id", job_id ? judge_json_string(job_id) : json_null());
    bad |= json_object_set_new(root, "step", json_integer(step));
    bad |= json_object_set_new(root, "items", arr);
    for (int i = 0; i < q->n && !bad; i++) {
      const struct judge_item *it = &r->items[q->idx[i]];
      json_t *o = json_object();
      if (!o) {
        bad = 1;
        break;
      }
      bad |= json_object_set_new(o, "id", judge_json_string(r->ids[q->idx[i]]));
      bad |= json_object_set_new(o, "group", json_integer(it->group));
      bad |= json_object_set_new(o, "prompt", judge_json_string(str_or_empty(it->prompt)));
      bad |= json_object_set_new(o, "response", judge_json_string(str_or_empty(it->response)));
      bad |= json_object_set_new(o, "answer", judge_json_string(str_or_empty(it->answer)));
      bad |= json_object_set_new(o, "metadata",
                                 it->metadata ? json_deep_copy(it->metadata) : json_null());
      bad |= json_object_set_new(o, "response_tokens", json_integer(it->response_tokens));
      bad |=
          json_object_set_new(o, "finish_reason", json_string(it->truncated ? "length" : "stop"));
      bad |= push(arr, o);
    }
  } else {
    json_t *query = json_array(), *prompts = json_array(), *labels = json_array();
    root = json_object();
    if (!root || !query || !prompts || !labels) {
      json_decref(query);
      json_decref(prompts);
      json_decref(labels);
      json_decref(root);
      return DAPO_ENOMEM;
    }
    bad |= json_object_set_new(root, "query", query);
    bad |= json_object_set_new(root, "prompts", prompts);
    bad |= json_object_set_new(root, "labels", labels);
    for (int i = 0; i < q->n && !bad; i++) {
      const struct judge_item *it = &r->items[q->idx[i]];
      const char *p = str_or_empty(it->prompt), *s = str_or_empty(it->response);
      size_t pl = strlen(p), sl = strlen(s);
      char *both = malloc(pl + sl + 1);
      if (!both) {
        bad = 1;
        break;
      }
      memcpy(both, p, pl);
      memcpy(both + pl, s, sl + 1);
      bad |= push(query, judge_json_string(both));
      free(both);
      bad |= push(prompts, judge_json_string(p));
      bad |= push(labels, judge_json_string(str_or_empty(it->answer)));
    }
  }
  if (!bad) {
    q->body = json_dumps(root, JSON_COMPACT);
    bad = q->body == NULL;
  }
  json_decref(root);
  if (bad) return DAPO_ENOMEM;
  q->body_len = strlen(q->body);
  return 0;
}

static int cmp_sorted_id(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorted ids of q for bsearch, and the verdict slots. */
static int index_request(const struct run *r, struct req *q) {
  q->v = calloc((size_t)q->n, sizeof *q->v);
  q->sorted_ids = malloc((size_t)q->n * sizeof *q->sorted_ids);
  q->sorted_pos = malloc((size_t)q->n * sizeof *q->sorted_pos);
  if (!q->v || !q->sorted_ids || !q->sorted_pos) return DAPO_ENOMEM;
  for (int i = 0; i < q->n; i++) q->sorted_ids[i] = r->ids[q->idx[i]];
  qsort(q->sorted_ids, (size_t)q->n, sizeof *q->sorted_ids, cmp_sorted_id);
  /* positions: ids are unique, so a second bsearch-free pass maps each back */
  for (int i = 0; i < q->n; i++) {
    const char *id = r->ids[q->idx[i]];
    const char **hit =
        bsearch(&id, q->sorted_ids, (size_t)q->n, sizeof *q->sorted_ids, cmp_sorted_id);
    q->sorted_pos[hit - q->sorted_ids] = i;
  }
  return 0;
}

static int find_pos(const struct req *q, const char *id) {
  const char **hit =
      bsearch(&id, q->sorted_ids, (size_t)q->n, sizeof *q->sorted_ids, cmp_sorted_id);
  return hit ? q->sorted_pos[hit - q->sorted_ids] : -1;
}

static void clear_verdicts(struct req *q) {
  for (int i = 0; i < q->n; i++) {
    json_decref(q->v[i].info);
    q->v[i] = (struct verdict){0};
  }
}

/* The first HTTP_QUOTE_BYTES of a reply, quoted: valid UTF-8 kept, other bytes as \xNN. */
static void quote_body(const char *p, size_t n, char *out, size_t cap) {
  size_t w = 0, i = 0;
  int cut = 0;
  if (cap < 8) {
    if (cap) out[0] = '\0';
    return;
  }
  out[w++] = '"';
  while (i < n) {
    if (i >= HTTP_QUOTE_BYTES) {
      cut = 1;
      break;
    }
    unsigned char c = (unsigned char)p[i];
    char tmp[8];
    size_t tl;
    if (c == '"' || c == '\\') {
      tmp[0] = '\\';
      tmp[1] = (char)c;
      tl = 2;
    } else if (c == '\n') {
      memcpy(tmp, "\\n", 2);
      tl = 2;
    } else if (c < 0x20 || c == 0x7F) {
      tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
    } else if (c < 0x80) {
      tmp[0] = (char)c;
      tl = 1;
    } else {
      size_t l = utf8_next((const unsigned char *)p + i, n - i, NULL);
      if (l) {
        if (w + l + 5 > cap) {
          cut = 1;
          break;
        }
        memcpy(out + w, p + i, l);
        w += l;
        i += l;
        continue;
      }
      tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
    }
    if (w + tl + 5 > cap) {
      cut = 1;
      break;
    }
    memcpy(out + w, tmp, tl);
    w += tl;
    i++;
  }
  out[w++] = '"';
  if (cut) {
    memcpy(out + w, "...", 3);
    w += 3;
  }
  out[w] = '\0';
}

/* tail = prefix + ": " + the quoted reply body. */
static void set_body_tail(struct req *q, const char *prefix) {
  int k = snprintf(q->tail, sizeof q->tail, "%s: ", prefix);
  if (k < 0 || (size_t)k >= sizeof q->tail) return;
  quote_body(q->reply, q->reply_n, q->tail + k, sizeof q->tail - (size_t)k);
}

/* What an attempt's reply says. PARSE: the reply as a whole is malformed (everything retried);
 * MISSING: some ids unanswered (retried; on the last attempt the answered items stand);
 * RANGE: some rewards out of range (not retried: the judge said so deliberately). */
enum reply_outcome { RO_OK, RO_PARSE, RO_MISSING, RO_RANGE };

static enum reply_outcome reply_fail(struct req *q, const char *why) {
  snprintf(q->what, sizeof q->what, "malformed reply (%s)", why);
  set_body_tail(q, "");
  clear_verdicts(q);
  return RO_PARSE;
}

/* Validates a reward: finite and within +-REWARD_LIMIT. */
static int reward_ok(double x) {
  return isfinite(x) && fabs(x) <= REWARD_LIMIT;
}

static enum reply_outcome parse_dapod(const struct run *r, struct req *q, json_t *root,
                                      int *n_range) {
  char why[160];
  json_t *results = json_object_get(root, "results");
  if (!json_is_array(results)) return reply_fail(q, "no \"results\" array");
  size_t k;
  json_t *el;
  json_array_foreach(results, k, el) {
    const char *id = json_string_value(json_object_get(el, "id"));
    if (!id) {
      snprintf(why, sizeof why, "results[%zu] has no string \"id\"", k);
      return reply_fail(q, why);
    }
    int pos = find_pos(q, id);
    if (pos < 0) {
      snprintf(why, sizeof why, "unknown id '%.64s'", id);
      return reply_fail(q, why);
    }
    struct verdict *v = &q->v[pos];
    if (v->seen) {
      snprintf(why, sizeof why, "id '%.64s' answered twice", id);
      return reply_fail(q, why);
    }
    v->seen = 1;
    json_t *rw = json_object_get(el, "reward"), *c = json_object_get(el, "correct"),
           *m = json_object_get(el, "mask"), *info = json_object_get(el, "info");
    if (!json_is_number(rw)) {
      snprintf(why, sizeof why, "result '%.64s': \"reward\" is not a number", id);
      return reply_fail(q, why);
    }
    if (c && !json_is_null(c) && !json_is_boolean(c)) {
      snprintf(why, sizeof why, "result '%.64s': \"correct\" is not a boolean", id);
      return reply_fail(q, why);
    }
    if (m && !json_is_null(m) && !json_is_boolean(m)) {
      snprintf(why, sizeof why, "result '%.64s': \"mask\" is not a boolean", id);
      return reply_fail(q, why);
    }
    if (info && !json_is_null(info) && !json_is_object(info)) {
      snprintf(why, sizeof why, "result '%.64s': \"info\" is not an object", id);
      return reply_fail(q, why);
    }
    v->reward = json_number_value(rw);
    v->correct = json_is_boolean(c) ? json_is_true(c) : -1;
    v->mask = json_is_true(m);
    v->info = json_is_object(info) ? json_incref(info) : NULL;
    if (!reward_ok(v->reward)) v->err = JE_RANGE;
  }
  int missing = 0, range = 0;
  const char *first_missing = NULL, *first_range = NULL;
  double bad_reward = 0;
  for (int i = 0; i < q->n; i++) {
    if (!q->v[i].seen) {
      q->v[i].err = JE_PARSE;
      if (!missing++) first_missing = r->ids[q->idx[i]];
    } else if (q->v[i].err == JE_RANGE) {
      if (!range++) {
        first_range = r->ids[q->idx[i]];
        bad_reward = q->v[i].reward;
      }
    }
  }
  *n_range = range;
  if (missing) {
    snprintf(q->what, sizeof q->what, "malformed reply (%d of %d ids unanswered, first '%.64s')",
             missing, q->n, first_missing);
    set_body_tail(q, "");
    return RO_MISSING;
  }
  if (range) {
    snprintf(q->what, sizeof q->what,
             "reward %g for item '%.64s' is outside [-1e6, 1e6] (%d item%s out of range)",
             bad_reward, first_range, range, range == 1 ? "" : "s");
    q->tail[0] = '\0';
    return RO_RANGE;
  }
  return RO_OK;
}

static enum reply_outcome parse_openrlhf(struct req *q, json_t *root, int *n_range) {
  char why[160];
  json_t *rewards = json_is_array(root) ? root : json_object_get(root, "rewards");
  if (!json_is_array(rewards)) return reply_fail(q, "no \"rewards\" array");
  if (json_array_size(rewards) != (size_t)q->n) {
    snprintf(why, sizeof why, "%zu rewards for %d queries", json_array_size(rewards), q->n);
    return reply_fail(q, why);
  }
  int range = 0, first = -1;
  for (int i = 0; i < q->n; i++) {
    json_t *x = json_array_get(rewards, (size_t)i);
    if (!json_is_number(x)) {
      snprintf(why, sizeof why, "rewards[%d] is not a number", i);
      return reply_fail(q, why);
    }
    struct verdict *v = &q->v[i];
    *v = (struct verdict){.seen = 1, .reward = json_number_value(x), .correct = -1};
    if (!reward_ok(v->reward)) {
      v->err = JE_RANGE;
      if (!range++) first = i;
    }
  }
  *n_range = range;
  if (range) {
    snprintf(q->what, sizeof q->what,
             "rewards[%d] = %g is outside [-1e6, 1e6] (%d item%s out of range)", first,
             q->v[first].reward, range, range == 1 ? "" : "s");
    q->tail[0] = '\0';
    return RO_RANGE;
  }
  return RO_OK;
}

static enum reply_outcome parse_reply(const struct run *r, struct req *q, int *n_range) {
  *n_range = 0;
  clear_verdicts(q);
  if (q->reply_too_big) {
    snprintf(q->what, sizeof q->what, "malformed reply (larger than %zu MiB)",
             HTTP_MAX_REPLY >> 20);
    q->tail[0] = '\0';
    return RO_PARSE;
  }
  json_error_t jerr;
  json_t *root = json_loadb(q->reply ? q->reply : "", q->reply_n, 0, &jerr);
  if (!root) {
    char why[200];
    snprintf(why, sizeof why, "not JSON: %.120s", jerr.text);
    return reply_fail(q, why);
  }
  enum reply_outcome o;
  if (r->h->format == FMT_OPENRLHF)
    o = parse_openrlhf(q, root, n_range);
  else if (!json_is_object(root))
    o = reply_fail(q, "not a JSON object");
  else
    o = parse_dapod(r, q, root, n_range);
  json_decref(root);
  return o;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *userp) {
  struct req *q = userp;
  size_t n = size * nmemb;
  if (q->reply_n + n > HTTP_MAX_REPLY) {
    q->reply_too_big = 1;
    return 0; /* CURLE_WRITE_ERROR */
  }
  if (q->reply_n + n + 1 > q->reply_cap) {
    size_t cap = q->reply_cap ? q->reply_cap : 4096;
    while (cap < q->reply_n + n + 1) cap *= 2;
    if (cap > HTTP_MAX_REPLY + 1) cap = HTTP_MAX_REPLY + 1;
    char *p = realloc(q->reply, cap);
    if (!p) return 0;
    q->reply = p;
    q->reply_cap = cap;
  }
  memcpy(q->reply + q->reply_n, data, n);
  q->reply_n += n;
  q->reply[q->reply_n] = '\0';
  return n;
}

/* Why the address curl is about to connect to is refused (into why), or NULL when allowed: the
 * rule of judge_policy.allow_private's comment. */
static const char *address_refusal(const struct judge_http *h, const struct sockaddr *sa, char *why,
                                   size_t cap) {
  enum netaddr_class c = netaddr_classify(sa);
  const char *name = netaddr_class_name(c);
  if (c == NETADDR_UNSPECIFIED || c == NETADDR_MULTICAST || c == NETADDR_RESERVED) {
    snprintf(why, cap, "%s %s address is never a judge", c == NETADDR_UNSPECIFIED ? "an" : "a",
             name);
    return why;
  }
  if (h->host_localhost) {
    if (c == NETADDR_LOOPBACK) return NULL;
    snprintf(why, cap, "'localhost' resolved to a %s address, not a loopback one", name);
    return why;
  }
  if (c == NETADDR_PUBLIC) return NULL;
  if (netaddr_equals_literal(sa, h->host)) return NULL; /* the allowed URL names the address */
  for (int i = 0; i < h->n_literals; i++)
    if (netaddr_equals_literal(sa, h->literals[i])) return NULL;
  if (c == NETADDR_PRIVATE && h->allow_private) return NULL;
  snprintf(why, cap,
           "'%.80s' resolved to a %s address, which needs the address itself in "
           "judge_allowed_hosts%s",
           h->host, name, c == NETADDR_PRIVATE ? " (or judge_allow_private)" : "");
  return why;
}

/* Every address curl is about to connect to passes here first (address_refusal). */
static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *addr) {
  struct req *q = clientp;
  const char *why = NULL;
  if (purpose != CURLSOCKTYPE_IPCXN)
    why = "not an IP connection";
  else
    why = address_refusal(q->h, &addr->addr, q->refused_why, sizeof q->refused_why);
  if (why) {
    q->refused = 1;
    if (why != q->refused_why) snprintf(q->refused_why, sizeof q->refused_why, "%s", why);
    netaddr_format(&addr->addr, q->refused_addr, sizeof q->refused_addr);
    return CURL_SOCKET_BAD;
  }
  return socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
}

static int start_attempt(const struct run *r, CURLM *m, struct req *q) {
  const struct judge_http *h = r->h;
  CURL *c = curl_easy_init();
  if (!c) return DAPO_ENOMEM;
  q->reply_n = 0;
  q->reply_too_big = 0;
  q->refused = 0;
  q->errbuf[0] = '\0';
  int bad = 0;
  bad |= curl_easy_setopt(c, CURLOPT_URL, h->url) != CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: the string form; the bitmask is deprecated */
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK;
#else
  bad |=
      curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) !=
         CURLE_OK;
#endif
  bad |= curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_PROXY, "") != CURLE_OK; /* never http_proxy from env */
  bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POST, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_USERAGENT, "dapod-judge/0.1") != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)h->timeout_ms) != CURLE_OK;
  long ct = h->timeout_ms < CONNECT_TIMEOUT_CAP_MS ? h->timeout_ms : CONNECT_TIMEOUT_CAP_MS;
  bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ct) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)HTTP_MAX_REPLY) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, q) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, q->errbuf) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_PRIVATE, q) != CURLE_OK;
  q->h = h;
  bad |= curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, q) != CURLE_OK;
  if (h->resolve) bad |= curl_easy_setopt(c, CURLOPT_RESOLVE, h->resolve) != CURLE_OK;
  if (bad || curl_multi_add_handle(m, c) != CURLM_OK) {
    curl_easy_cleanup(c);
    return DAPO_ENOMEM;
  }
  q->easy = c;
  q->state = RS_RUNNING;
  q->attempts++;
  if (r->st) r->st->n_requests++;
  return 0;
}

/* Moves q's verdicts into res[] (only those without an error when partial). */
static void commit(const struct run *r, struct req *q, struct judge_result *res,
                   enum judge_err_kind all_err) {
  for (int i = 0; i < q->n; i++) {
    struct judge_result *o = &res[q->idx[i]];
    struct verdict *v = &q->v[i];
    if (all_err != JE_NONE) {
      o->err = all_err;
      continue;
    }
    if (v->err != JE_NONE || !v->seen) {
      o->err = v->err != JE_NONE ? v->err : JE_PARSE;
      continue;
    }
    o->reward = v->reward;
    o->correct = v->correct;
    o->mask = v->mask;
    o->info = v->info;
    o->err = JE_NONE;
    v->info = NULL;
  }
  clear_verdicts(q);
}

static int64_t backoff_ms(int attempts) {
  int64_t d = BACKOFF_BASE_MS;
  for (int k = 1; k < attempts && d < BACKOFF_CAP_MS; k++) d *= 2;
  return d < BACKOFF_CAP_MS ? d : BACKOFF_CAP_MS;
}

/* Handles a finished transfer: success, a scheduled retry, or a final failure. */
static void finish_attempt(const struct run *r, CURLM *m, struct req *q, CURLcode cc,
                           struct judge_result *res) {
  const struct judge_http *h = r->h;
  struct judge_stats *st = r->st;
  long status = 0;
  curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
  curl_multi_remove_handle(m, q->easy);
  curl_easy_cleanup(q->easy);
  q->easy = NULL;

  enum judge_err_kind err = JE_NONE;
  int retry = 0, partial = 0;
  q->tail[0] = '\0';
  if (cc == CURLE_OK && status >= 200 && status < 300) {
    int n_range = 0;
    enum reply_outcome o = parse_reply(r, q, &n_range);
    if (o == RO_OK) {
      commit(r, q, res, JE_NONE);
      q->state = RS_DONE;
      q->final_err = JE_NONE;
      return;
    }
    if (o == RO_RANGE) {
      err = JE_RANGE;
      partial = 1;
      if (st) st->n_out_of_range += n_range;
    } else {
      err = JE_PARSE;
      retry = 1;
      partial = o == RO_MISSING;
    }
  } else if (cc == CURLE_OK) {
    err = JE_HTTP;
    retry = status == 429 || status >= 500;
    snprintf(q->what, sizeof q->what, "HTTP %ld", status);
    set_body_tail(q, retry ? "" : " (not retried)");
  } else if (q->refused) {
    err = JE_CONNECT;
    snprintf(q->what, sizeof q->what, "refused to connect to %s: %s", q->refused_addr,
             q->refused_why);
  } else if (cc == CURLE_OPERATION_TIMEDOUT) {
    err = JE_TIMEOUT;
    retry = 1;
    snprintf(q->what, sizeof q->what, "timed out (timeout_ms %d)", h->timeout_ms);
  } else if ((cc == CURLE_WRITE_ERROR && q->reply_too_big) || cc == CURLE_FILESIZE_EXCEEDED) {
    err = JE_PARSE;
    retry = 1;
    snprintf(q->what, sizeof q->what, "malformed reply (larger than %zu MiB)",
             HTTP_MAX_REPLY >> 20);
  } else {
    err = JE_CONNECT;
    retry = !(cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT ||
              cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
              cc == CURLE_OUT_OF_MEMORY);
    snprintf(q->what, sizeof q->what, "%s (%.180s)", curl_easy_strerror(cc),
             q->errbuf[0] ? q->errbuf : "no detail");
  }
  if (st) {
    if (err == JE_TIMEOUT)
      st->n_timeout++;
    else if (err == JE_HTTP || err == JE_CONNECT)
      st->n_http_error++;
    else if (err == JE_PARSE)
      st->n_parse_error++;
  }
  if (retry && q->attempts <= h->max_retries) {
    clear_verdicts(q);
    q->state = RS_WAITING;
    q->next_at_ms = mono_ms() + backoff_ms(q->attempts);
    if (st) st->n_retries++;
    return;
  }
  commit(r, q, res, partial ? JE_NONE : err);
  q->state = RS_DONE;
  q->final_err = err;
}

static void free_run(struct run *r, CURLM *m) {
  for (int i = 0; i < r->n_reqs; i++) {
    struct req *q = &r->reqs[i];
    if (q->easy) {
      if (m) curl_multi_remove_handle(m, q->easy);
      curl_easy_cleanup(q->easy);
    }
    if (q->v) clear_verdicts(q);
    free(q->v);
    free(q->sorted_ids);
    free(q->sorted_pos);
    free(q->body);
    free(q->reply);
  }
  free(r->reqs);
  free(r->order);
}

int judge_http_run(const struct judge_http *h, const char *job_id, int64_t step,
                   const struct judge_item *items, const char *const *ids, int n,
                   struct judge_result *res, struct judge_stats *st, const volatile int *cancel,
                   struct dapo_err *e) {
  struct run r = {.h = h, .items = items, .ids = ids, .st = st};
  CURLM *m = NULL;
  int rc = plan_requests(&r, n);
  for (int i = 0; i < r.n_reqs && !rc; i++) {
    rc = build_body(&r, &r.reqs[i], job_id, step);
    if (!rc) rc = index_request(&r, &r.reqs[i]);
  }
  if (!rc && !(m = curl_multi_init())) rc = DAPO_ENOMEM;
  if (rc) {
    rc = dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
    goto out;
  }
  curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)h->concurrency);

  int done = 0, running = 0, cancelled = 0;
  while (done < r.n_reqs) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) { /* set by another thread */
      cancelled = 1;
      break;
    }
    int64_t now = mono_ms(), wait = POLL_SLICE_MS;
    for (int i = 0; i < r.n_reqs && running < h->concurrency; i++) {
      struct req *q = &r.reqs[i];
      if (q->state != RS_WAITING || q->next_at_ms > now) continue;
      if (start_attempt(&r, m, q)) {
        rc = dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
        goto out;
      }
      running++;
    }
    int still = 0;
    curl_multi_perform(m, &still);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
      if (msg->msg != CURLMSG_DONE) continue;
      struct req *q = NULL;
      CURL *easy = msg->easy_handle;
      CURLcode cc = msg->data.result;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&q);
      running--;
      finish_attempt(&r, m, q, cc, res);
      if (q->state == RS_DONE) done++;
    }
    if (done == r.n_reqs) break;
    now = mono_ms();
    for (int i = 0; i < r.n_reqs; i++) {
      struct req *q = &r.reqs[i];
      if (q->state != RS_WAITING) continue;
      int64_t d = q->next_at_ms - now;
      if (d < wait) wait = d < 0 ? 0 : d;
    }
    if (running >= h->concurrency && wait < POLL_SLICE_MS) wait = POLL_SLICE_MS;
    curl_multi_poll(m, NULL, 0, (int)wait, NULL);
  }

  /* Outcome: every item either judged or carrying its err. */
  int n_failed = 0;
  struct req *first = NULL;
  for (int i = 0; i < r.n_reqs; i++) {
    struct req *q = &r.reqs[i];
    if (q->state != RS_DONE) {
      for (int k = 0; k < q->n; k++) res[q->idx[k]].err = JE_CANCELLED;
      continue;
    }
    if (q->final_err != JE_NONE) {
      n_failed++;
      if (!first) first = q;
    }
  }
  if (cancelled) {
    rc = dapo_errf(e, DAPO_ECANCELLED, "judge %s: cancelled", h->url);
  } else if (first) {
    rc = first->final_err == JE_RANGE   ? DAPO_ERANGE
         : first->final_err == JE_PARSE ? DAPO_EFORMAT
                                        : DAPO_EIO;
    char more[64] = "";
    if (n_failed > 1)
      snprintf(more, sizeof more, " (%d of %d requests failed)", n_failed, r.n_reqs);
    dapo_errf(e, rc, "judge %s: %s after %d attempt%s%s%s", h->url, first->what, first->attempts,
              first->attempts == 1 ? "" : "s", first->tail, more);
  }
out:
  free_run(&r, m);
  curl_multi_cleanup(m);
  return rc;
}

/* ---- The reply parser on its own (fuzzing, tests) ---- */

int judge_http_parse_reply(const char *body, size_t len, int openrlhf, const char *const *ids,
                           int n, double *rewards, char *what, size_t cap) {
  if (n < 1 || !ids) return DAPO_EINVAL;
  struct judge_http h = {.format = openrlhf ? FMT_OPENRLHF : FMT_DAPOD};
  struct run r = {.h = &h, .ids = ids};
  struct req q = {.n = n, .reply = (char *)body, .reply_n = body ? len : 0};
  int rc = 0;
  q.idx = malloc((size_t)n * sizeof *q.idx);
  if (!q.idx) return DAPO_ENOMEM;
  for (int i = 0; i < n; i++) q.idx[i] = i;
  if (index_request(&r, &q)) {
    rc = DAPO_ENOMEM;
    goto out;
  }
  int n_range;
  enum reply_outcome o = parse_reply(&r, &q, &n_range);
  for (int i = 0; rewards && i < n; i++) rewards[i] = q.v[i].seen ? q.v[i].reward : 0.0;
  if (what && cap) snprintf(what, cap, "%s%s", o == RO_OK ? "" : q.what, o == RO_OK ? "" : q.tail);
  rc = o == RO_OK ? 0 : o == RO_PARSE ? 1 : o == RO_MISSING ? 2 : 3;
out:
  if (q.v) clear_verdicts(&q);
  free(q.v);
  free(q.sorted_ids);
  free(q.sorted_pos);
  free(q.idx);
  return rc;
}
