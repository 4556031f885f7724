/* The http judge (API.md "Judges"): packs items into requests of at most max_batch without ever
 * splitting a group, keeps `concurrency` requests in flight on one curl multi handle, retries
 * timeouts, connection errors, 429/5xx and malformed replies with exponential backoff, and
 * validates every reply. The URL, the headers, the transfer and the host policy checked at
 * connect time are every outside party's (outside.h). */
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
#include "outside.h"

#define POLL_SLICE_MS 50 /* the cancel flag is read at least this often */
#define REWARD_LIMIT 1e6

enum wire_format { FMT_DAPOD, FMT_OPENRLHF };

struct judge_http {
  struct outside *out; /* the URL (checked against the host policy), headers, connect check */
  const char *url;     /* outside_url(out) */
  int timeout_ms, max_batch, concurrency, max_retries;
  enum wire_format format;
};

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
  struct judge_http *h = calloc(1, sizeof *h);
  if (!h) {
    dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
    return NULL;
  }
  int rc = 0;
  const char *fmt = NULL;
  const json_t *fj = json_object_get(spec, "format");
  h->out = outside_new("judge", "judge", json_object_get(spec, "url"),
                       json_object_get(spec, "headers"), pol, e);
  if (!h->out)
    rc = e ? e->code : DAPO_EINVAL;
  else
    h->url = outside_url(h->out);
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
  if (rc) {
    judge_http_free(h);
    return NULL;
  }
  return h;
}

void judge_http_free(struct judge_http *h) {
  if (!h) return;
  outside_free(h->out);
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
  struct outside_xfer x;         /* this attempt's reply and connect-time refusal */
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

/* tail = prefix + ": " + the quoted reply body. */
static void set_body_tail(struct req *q, const char *prefix) {
  int k = snprintf(q->tail, sizeof q->tail, "%s: ", prefix);
  if (k < 0 || (size_t)k >= sizeof q->tail) return;
  outside_quote_reply(&q->x, q->tail + k, sizeof q->tail - (size_t)k);
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
  if (q->x.reply_too_big) {
    snprintf(q->what, sizeof q->what, "malformed reply (larger than %zu MiB)",
             OUTSIDE_MAX_REPLY >> 20);
    q->tail[0] = '\0';
    return RO_PARSE;
  }
  json_error_t jerr;
  json_t *root = json_loadb(q->x.reply ? q->x.reply : "", q->x.reply_n, 0, &jerr);
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

static int start_attempt(const struct run *r, CURLM *m, struct req *q) {
  const struct judge_http *h = r->h;
  CURL *c = outside_post(h->out, &q->x, q->body, q->body_len, h->timeout_ms, q);
  if (!c) return DAPO_ENOMEM;
  if (curl_multi_add_handle(m, c) != CURLM_OK) {
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

/* Handles a finished transfer: success, a scheduled retry, or a final failure. */
static void finish_attempt(const struct run *r, CURLM *m, struct req *q, CURLcode cc,
                           struct judge_result *res) {
  const struct judge_http *h = r->h;
  struct judge_stats *st = r->st;
  long status = 0;
  int retry = 0, partial = 0;
  enum outside_outcome out =
      outside_classify(q->easy, cc, &q->x, h->timeout_ms, &status, &retry, q->what, sizeof q->what);
  curl_multi_remove_handle(m, q->easy);
  curl_easy_cleanup(q->easy);
  q->easy = NULL;

  enum judge_err_kind err = JE_NONE;
  q->tail[0] = '\0';
  if (out == OUT_OK) {
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
  } else if (out == OUT_HTTP) {
    err = JE_HTTP;
    set_body_tail(q, retry ? "" : " (not retried)");
  } else {
    err = out == OUT_TIMEOUT ? JE_TIMEOUT : out == OUT_TOO_LARGE ? JE_PARSE : JE_CONNECT;
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
    q->next_at_ms = outside_now_ms() + outside_backoff_ms(q->attempts);
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
    outside_xfer_free(&q->x);
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
    int64_t now = outside_now_ms(), wait = POLL_SLICE_MS;
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
    now = outside_now_ms();
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
  struct req q = {.n = n, .x = {.reply = (char *)body, .reply_n = body ? len : 0}};
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
