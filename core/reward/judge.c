/* Judge specs and the built-in judges: validates {"type": ...} specs, runs `exact`, `math` and
 * `regex` in-process (reward +1 / -1), `grader` (OpenAI's graders, grader.h: reward = the score)
 * and hands `http` to judge_http.c. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "judge.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grader.h"
#include "judge_impl.h"
#include "utf8.h"

#define REGEX_MAX_PATTERN 4096
#define REGEX_MATCH_LIMIT                                                                          \
  1000000 /* backtracking steps per response: bad patterns fail, not hang                          \
           */
#define REGEX_DEPTH_LIMIT 10000
#define REGEX_HEAP_LIMIT_KIB 65536

enum judge_kind { JK_EXACT, JK_MATH, JK_REGEX, JK_HTTP, JK_GRADER };

struct judge {
  enum judge_kind kind;
  pcre2_code *re;            /* regex: compiled pattern (read-only, shared by threads) */
  pcre2_match_context *mctx; /* regex: match limits (read-only) */
  uint32_t n_captures;       /* regex: capture groups in the pattern */
  struct judge_http *http;   /* http */
  struct grader *grader;     /* grader */
  json_t *response_format;   /* grader: {"type": "json_schema", ...} or NULL (owned) */
  double pass_threshold;     /* grader: a score at least this is "correct" */
};

const char *judge_err_name(enum judge_err_kind k) {
  switch (k) {
  case JE_NONE: return "none";
  case JE_TIMEOUT: return "judge_timeout";
  case JE_HTTP: return "judge_http_error";
  case JE_PARSE: return "judge_parse_error";
  case JE_RANGE: return "reward_out_of_range";
  case JE_CONNECT: return "judge_http_error";
  case JE_CANCELLED: return "cancelled";
  }
  return "unknown";
}

const char *judge_type(const struct judge *j) {
  static const char *const names[] = {"exact", "math", "regex", "http", "grader"};
  return j ? names[j->kind] : NULL;
}

/* ---- JSON strings of outside text ---- */

json_t *judge_json_string(const char *s) {
  if (!s) s = "";
  size_t n = strlen(s), i = 0;
  while (i < n) {
    size_t l = utf8_next((const unsigned char *)s + i, n - i, NULL);
    if (!l) break;
    i += l;
  }
  if (i == n) return json_stringn(s, n);
  /* Each invalid byte becomes the 3 bytes of U+FFFD. */
  if (n > (SIZE_MAX - 1) / 3) return NULL;
  char *buf = malloc(3 * n + 1);
  if (!buf) return NULL;
  size_t w = 0;
  for (i = 0; i < n;) {
    size_t l = utf8_next((const unsigned char *)s + i, n - i, NULL);
    if (l) {
      memcpy(buf + w, s + i, l);
      w += l;
      i += l;
    } else {
      memcpy(buf + w, "\xEF\xBF\xBD", 3);
      w += 3;
      i++;
    }
  }
  json_t *j = json_stringn(buf, w);
  free(buf);
  return j;
}

/* ---- Spec ---- */

static int check_fields(const json_t *spec, const char *const *allowed, struct dapo_err *e) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)spec, key, v) {
    int ok = 0;
    for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, key);
    if (!ok) return dapo_errf(e, DAPO_EINVAL, "judge.%.64s: unknown field", key);
  }
  return 0;
}

static int regex_init(struct judge *j, const json_t *spec, struct dapo_err *e) {
  static const char *const fields[] = {"type", "pattern", NULL};
  if (check_fields(spec, fields, e)) return DAPO_EINVAL;
  const json_t *pat = json_object_get(spec, "pattern");
  if (!json_is_string(pat))
    return dapo_errf(e, DAPO_EINVAL, "judge.pattern: required, a string (a PCRE2 pattern)");
  size_t len = json_string_length(pat);
  if (len == 0 || len > REGEX_MAX_PATTERN)
    return dapo_errf(e, DAPO_EINVAL, "judge.pattern: length %zu not in [1, %d]", len,
                     REGEX_MAX_PATTERN);
  int err;
  PCRE2_SIZE off;
  j->re = pcre2_compile((PCRE2_SPTR)json_string_value(pat), len,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
  if (!j->re) {
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(err, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "?");
    return dapo_errf(e, DAPO_EINVAL, "judge.pattern: %s at offset %zu", (const char *)msg,
                     (size_t)off);
  }
  j->mctx = pcre2_match_context_create(NULL);
  if (!j->mctx) return dapo_errf(e, DAPO_ENOMEM, "judge.pattern: out of memory");
  pcre2_set_match_limit(j->mctx, REGEX_MATCH_LIMIT);
  pcre2_set_depth_limit(j->mctx, REGEX_DEPTH_LIMIT);
  pcre2_set_heap_limit(j->mctx, REGEX_HEAP_LIMIT_KIB);
  if (pcre2_pattern_info(j->re, PCRE2_INFO_CAPTURECOUNT, &j->n_captures) != 0) j->n_captures = 0;
  return 0;
}

/* {"type": "grader", "grader": {...}, "response_format"?: {...}, "pass_threshold"?: 0.5} */
static int grader_init(struct judge *j, const json_t *spec, const struct judge_policy *pol,
                       struct dapo_err *e) {
  static const char *const fields[] = {"type", "grader", "response_format", "pass_threshold", NULL};
  if (check_fields(spec, fields, e)) return DAPO_EINVAL;
  const json_t *rf = json_object_get(spec, "response_format");
  if (rf && !json_is_null(rf)) {
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !t ||
        (strcmp(t, "json_schema") && strcmp(t, "json_object") && strcmp(t, "text")))
      return dapo_errf(e, DAPO_EINVAL,
                       "judge.response_format.type: expected json_schema, json_object or text");
    const json_t *js = json_object_get(rf, "json_schema");
    if (!strcmp(t, "json_schema") &&
        (!json_is_object(js) || !json_is_object(json_object_get(js, "schema"))))
      return dapo_errf(e, DAPO_EINVAL,
                       "judge.response_format.json_schema.schema: required, a JSON schema object");
    if (strcmp(t, "text")) j->response_format = json_deep_copy(rf);
  }
  const json_t *pt = json_object_get(spec, "pass_threshold");
  j->pass_threshold = 0.5;
  if (pt && !json_is_null(pt)) {
    if (!json_is_number(pt) || !(json_number_value(pt) >= -1e6 && json_number_value(pt) <= 1e6))
      return dapo_errf(e, DAPO_EINVAL, "judge.pass_threshold: expected a number");
    j->pass_threshold = json_number_value(pt);
  }
  if (!(j->grader = grader_new(json_object_get(spec, "grader"), "judge.grader", pol, e)))
    return e ? e->code : DAPO_EINVAL;
  return 0;
}

struct judge *judge_new(const json_t *spec, const struct judge_policy *pol, struct dapo_err *e) {
  if (!json_is_object(spec)) {
    dapo_errf(e, DAPO_EINVAL, "judge: expected an object such as {\"type\": \"math\"}");
    return NULL;
  }
  const char *type = json_string_value(json_object_get(spec, "type"));
  if (!type) {
    dapo_errf(e, DAPO_EINVAL, "judge.type: required, one of exact, math, regex, http");
    return NULL;
  }
  struct judge *j = calloc(1, sizeof *j);
  if (!j) {
    dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
    return NULL;
  }
  static const char *const only_type[] = {"type", NULL};
  int rc = 0;
  if (!strcmp(type, "exact")) {
    j->kind = JK_EXACT;
    rc = check_fields(spec, only_type, e);
  } else if (!strcmp(type, "math")) {
    j->kind = JK_MATH;
    rc = check_fields(spec, only_type, e);
  } else if (!strcmp(type, "regex")) {
    j->kind = JK_REGEX;
    rc = regex_init(j, spec, e);
  } else if (!strcmp(type, "grader")) {
    j->kind = JK_GRADER;
    rc = grader_init(j, spec, pol, e);
  } else if (!strcmp(type, "http")) {
    j->kind = JK_HTTP;
    j->http = judge_http_new(spec, pol, e);
    if (!j->http) rc = e ? e->code : DAPO_EINVAL;
  } else {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "judge.type: '%.40s' is not one of exact, math, regex, http, grader", type);
  }
  if (rc) {
    judge_free(j);
    return NULL;
  }
  return j;
}

void judge_free(struct judge *j) {
  if (!j) return;
  pcre2_match_context_free(j->mctx);
  pcre2_code_free(j->re);
  judge_http_free(j->http);
  grader_free(j->grader);
  json_decref(j->response_format);
  free(j);
}

void judge_results_release(struct judge_result *res, int n) {
  if (!res) return;
  for (int i = 0; i < n; i++) {
    json_decref(res[i].info);
    res[i].info = NULL;
  }
}

/* ---- Built-ins ---- */

static int is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* s[0..n) without leading and trailing ASCII white space (Unicode spaces are kept). */
static const char *trim_span(const char *s, size_t n, size_t *len) {
  while (n > 0 && is_ascii_space(*s)) s++, n--;
  while (n > 0 && is_ascii_space(s[n - 1])) n--;
  *len = n;
  return s;
}

static int trimmed_equal(const char *a, size_t na, const char *b) {
  size_t la, lb;
  a = trim_span(a, na, &la);
  b = trim_span(b, strlen(b), &lb);
  return la == lb && !memcmp(a, b, la);
}

/* {"extracted": s or null} */
static int extracted_info(const char *s, size_t n, json_t **out) {
  json_t *o = json_object(), *v = NULL;
  if (!o) return DAPO_ENOMEM;
  if (s) {
    char *copy = strndup(s, n);
    v = copy ? judge_json_string(copy) : NULL;
    free(copy);
  } else {
    v = json_null();
  }
  if (!v || json_object_set_new(o, "extracted", v)) {
    json_decref(o);
    return DAPO_ENOMEM;
  }
  *out = o;
  return 0;
}

static int run_regex(const struct judge *j, const char *resp, const char *answer,
                     pcre2_match_data *md, struct judge_result *r) {
  int m = pcre2_match(j->re, (PCRE2_SPTR)resp, strlen(resp), 0, 0, md, j->mctx);
  const char *got = NULL;
  size_t len = 0;
  if (m > 0) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    int g = j->n_captures > 0 ? 1 : 0;
    if (g < m && ov[2 * g] != PCRE2_UNSET) {
      got = resp + ov[2 * g];
      len = ov[2 * g + 1] - ov[2 * g];
    }
  }
  r->correct = got && trimmed_equal(got, len, answer);
  return extracted_info(got, len, &r->info);
}

static int run_builtin(const struct judge *j, const struct judge_item *items, int n,
                       struct judge_result *res, struct dapo_err *e) {
  pcre2_match_data *md = NULL;
  if (j->kind == JK_REGEX) {
    md = pcre2_match_data_create_from_pattern(j->re, NULL);
    if (!md) return dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
  }
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    const char *resp = items[i].response ? items[i].response : "";
    const char *ans = items[i].answer ? items[i].answer : "";
    struct judge_result *r = &res[i];
    if (j->kind == JK_EXACT) {
      r->correct = trimmed_equal(resp, strlen(resp), ans);
    } else if (j->kind == JK_MATH) {
      char *x = judge_math_extract(resp);
      int eq = x ? judge_math_equal(x, ans) : 0;
      rc = eq < 0 ? DAPO_ENOMEM : extracted_info(x, x ? strlen(x) : 0, &r->info);
      r->correct = eq == 1;
      free(x);
    } else {
      rc = run_regex(j, resp, ans, md, r);
    }
    r->reward = r->correct ? 1.0 : -1.0;
  }
  pcre2_match_data_free(md);
  if (rc) return dapo_errf(e, rc, "judge: out of memory");
  return 0;
}

/* ---- Graders ---- */

/* The response as the JSON that response_format asks for: parsed, of the schema's top-level type
 * and with its required properties. NULL when it is not (a sample_parse_error). */
static json_t *output_json(const struct judge *j, const char *resp) {
  json_t *v = json_loads(resp, JSON_DECODE_ANY, NULL);
  if (!v || !j->response_format) return v;
  const json_t *schema =
      json_object_get(json_object_get(j->response_format, "json_schema"), "schema");
  const char *type = json_string_value(json_object_get(schema, "type"));
  int ok = !strcmp(json_string_value(json_object_get(j->response_format, "type")), "json_object")
               ? json_is_object(v)
               : 1;
  if (type && !strcmp(type, "object")) ok = ok && json_is_object(v);
  if (type && !strcmp(type, "array")) ok = ok && json_is_array(v);
  size_t i;
  const json_t *req;
  json_array_foreach(json_object_get(schema, "required"), i, req) {
    if (json_is_string(req) && !json_object_get(v, json_string_value(req))) ok = 0;
  }
  if (!ok) {
    json_decref(v);
    return NULL;
  }
  return v;
}

/* The grader's view of a dataset row: its fields (metadata: an RFT line's own fields), with the
 * native format's answer beside them as item.answer. */
static json_t *grader_item(const struct judge_item *it) {
  json_t *o = json_is_object(it->metadata) ? json_copy((json_t *)it->metadata) : json_object();
  if (o && it->answer && *it->answer && !json_object_get(o, "answer"))
    json_object_set_new(o, "answer", judge_json_string(it->answer));
  return o;
}

static int run_grader(const struct judge *j, const struct judge_item *items, int n,
                      struct judge_result *res, struct judge_stats *st, struct dapo_err *e) {
  struct grader_sample *s = calloc((size_t)n, sizeof *s);
  json_t **own = calloc(2 * (size_t)n, sizeof *own), **sub = calloc((size_t)n, sizeof *sub);
  double *scores = calloc((size_t)n, sizeof *scores);
  struct grader_errs *errs = calloc((size_t)n, sizeof *errs);
  unsigned char *bad = calloc((size_t)n, 1);
  int n_server = 0;
  char server[256] = "";
  int rc = s && own && sub && scores && errs && bad ? 0 : DAPO_ENOMEM;
  for (int i = 0; !rc && i < n; i++) {
    s[i].output_text = items[i].response ? items[i].response : "";
    own[2 * i] = output_json(j, s[i].output_text);
    own[2 * i + 1] = grader_item(&items[i]);
    bad[i] = j->response_format && !own[2 * i];
    s[i].output_json = own[2 * i];
    s[i].item = own[2 * i + 1];
    s[i].output_tools = items[i].tool_calls;
    if (!s[i].item) rc = DAPO_ENOMEM;
  }
  if (!rc) rc = grader_grade(j->grader, s, n, scores, sub, errs);
  for (int i = 0; !rc && i < n; i++) {
    if (bad[i]) { /* the sample is not the JSON asked for: 0, whatever the graders said */
      scores[i] = 0;
      errs[i].n[GE_SAMPLE_PARSE]++;
    }
    json_t *counts = json_object();
    for (int k = 0; counts && k < GE_COUNT; k++)
      if (errs[i].n[k]) json_object_set_new(counts, grader_err_name(k), json_integer(errs[i].n[k]));
    for (int k = 0; st && k < GE_COUNT; k++) st->n_grader[k] += errs[i].n[k] > 0;
    res[i].reward = scores[i];
    res[i].correct = scores[i] >= j->pass_threshold;
    res[i].info = json_pack("{s:f, s:o, s:o*, s:s*}", "score", scores[i], "sub_rewards",
                            sub[i] ? sub[i] : json_object(), "errors", counts, "error_detail",
                            errs[i].detail[0] ? errs[i].detail : NULL);
    sub[i] = NULL;
    if (!res[i].info) rc = DAPO_ENOMEM;
    /* the judge models' tokens for this sample: {"model": {"prompt_tokens", ...}} */
    for (int k = 0; !rc && k < errs[i].n_usage; k++) {
      const struct grader_usage *u = &errs[i].usage[k];
      json_t *tu = json_object_get(res[i].info, "token_usage");
      if (!tu && json_object_set_new(res[i].info, "token_usage", tu = json_object())) tu = NULL;
      if (!tu ||
          json_object_set_new(tu, u->model,
                              json_pack("{s:I, s:I}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                                        "completion_tokens", (json_int_t)u->completion_tokens)))
        rc = DAPO_ENOMEM;
    }
    /* a judge model that could not answer: no verdict, so on_judge_error applies as for the
       http judge (the other model_grader errors score 0 like any grader error) */
    if (errs[i].n[GE_MODEL_SERVER]) {
      res[i].err = JE_HTTP;
      if (!n_server++ && errs[i].model_detail[0])
        snprintf(server, sizeof server, "%s", errs[i].model_detail);
    }
  }
  for (int i = 0; own && i < 2 * n; i++) json_decref(own[i]);
  for (int i = 0; sub && i < n; i++) json_decref(sub[i]);
  free(s);
  free(own);
  free(sub);
  free(scores);
  free(errs);
  free(bad);
  if (rc) return dapo_errf(e, rc, "judge: out of memory");
  if (n_server)
    return dapo_errf(e, DAPO_EIO, "grader: %s (%d of %d samples)",
                     server[0] ? server : "judge model server error", n_server, n);
  return 0;
}

/* ---- Dispatch ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int judge_run(struct judge *j, const char *job_id, int64_t step, const struct judge_item *items,
              int n, struct judge_result *res, struct judge_stats *st, const volatile int *cancel,
              struct dapo_err *e) {
  if (!j || n < 0 || (n > 0 && (!items || !res)))
    return dapo_errf(e, DAPO_EINVAL, "judge_run: bad arguments");
  double t0 = now_s();
  for (int i = 0; i < n; i++)
    res[i] = (struct judge_result){.reward = 0, .correct = -1, .mask = 0, .info = NULL};
  int rc = 0;
  char **ids = NULL, *idbuf = NULL;
  const char **sorted = NULL;
  if (n == 0) goto out;
  if (j->kind != JK_HTTP) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) { /* set by another thread */
      for (int i = 0; i < n; i++) res[i].err = JE_CANCELLED;
      rc = dapo_errf(e, DAPO_ECANCELLED, "judge: cancelled");
      goto out;
    }
    rc = j->kind == JK_GRADER ? run_grader(j, items, n, res, st, e)
                              : run_builtin(j, items, n, res, e);
    goto out;
  }
  /* Item ids: the caller's, or the item index; they must be unique to match replies. */
  ids = calloc((size_t)n, sizeof *ids);
  sorted = calloc((size_t)n, sizeof *sorted);
  idbuf = malloc((size_t)n * 12);
  if (!ids || !sorted || !idbuf) {
    rc = dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (items[i].id) {
      ids[i] = (char *)items[i].id;
    } else {
      ids[i] = idbuf + (size_t)i * 12;
      snprintf(ids[i], 12, "%d", i);
    }
    sorted[i] = ids[i];
  }
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
  for (int i = 1; i < n; i++) {
    if (!strcmp(sorted[i - 1], sorted[i])) {
      rc = dapo_errf(e, DAPO_EINVAL, "judge: duplicate item id '%.64s'", sorted[i]);
      goto out;
    }
  }
  rc =
      judge_http_run(j->http, job_id, step, items, (const char *const *)ids, n, res, st, cancel, e);
out:
  free(ids);
  free(sorted);
  free(idbuf);
  if (st) st->seconds += now_s() - t0;
  return rc;
}
