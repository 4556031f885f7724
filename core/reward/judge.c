/* Judge specs and the built-in judges: validates {"type": ...} specs, runs `exact`, `math` and
 * `regex` in-process (reward +1 / -1), `grader` (OpenAI's graders, grader.h: reward = the score)
 * and hands `http` to judge_http.c. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "judge.h"

#include <math.h>
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

enum judge_kind { JK_EXACT, JK_MATH, JK_REGEX, JK_HTTP, JK_GRADER, JK_MODEL, JK_RANK };

struct judge {
  enum judge_kind kind;
  pcre2_code *re;            /* regex: compiled pattern (read-only, shared by threads) */
  pcre2_match_context *mctx; /* regex: match limits (read-only) */
  uint32_t n_captures;       /* regex: capture groups in the pattern */
  struct judge_http *http;   /* http */
  struct grader *grader;     /* grader, model (a score_model grader) */
  struct gmodel *rank;       /* model_rank */
  json_t *response_format;   /* grader: {"type": "json_schema", ...} or NULL (owned) */
  double pass_threshold;     /* grader, model, model_rank: a score at least this is "correct" */
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

int judge_models_used(const struct judge *j, const char **names) {
  if (j->rank) return names[0] = gmodel_model(j->rank), 1;
  return j->grader ? grader_models(j->grader, names, 0, GRADER_MAX_USAGE) : 0;
}

int judge_grades(const struct judge *j) {
  return j->kind == JK_GRADER || j->kind == JK_MODEL || j->kind == JK_RANK;
}

const char *judge_type(const struct judge *j) {
  static const char *const names[] = {"exact",  "math",  "regex",     "http",
                                      "grader", "model", "model_rank"};
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

/* A template field of a model judge: a string within bounds whose {{ }} name item.* or sample.*;
 * required or not. */
static int model_template(const json_t *spec, const char *key, int required, const char **out,
                          struct dapo_err *e) {
  const json_t *v = json_object_get(spec, key);
  *out = NULL;
  if (!v && !required) return 0;
  if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > 65536)
    return dapo_errf(e, DAPO_EINVAL,
                     "judge.%s: %sa template of 1 to 65536 bytes (docs/TRAINING.md, model judges)",
                     key, required ? "required, " : "expected ");
  *out = json_string_value(v);
  return grader_check_template(*out, "judge", key, e);
}

/* {"type": "model" | "model_rank", "judge_model", "prompt", "system"?, "scale"?: [lo, hi],
 * "pass_threshold"?, "sampling_params"?}: a score_model grader on the judge model (model), or one
 * call per group asking a score for each of its responses (model_rank). */
static int model_init(struct judge *j, const json_t *spec, int rank, const struct judge_policy *pol,
                      struct dapo_err *e) {
  static const char *const fields[] = {"type",  "judge_model",    "prompt",          "system",
                                       "scale", "pass_threshold", "sampling_params", NULL};
  if (check_fields(spec, fields, e)) return DAPO_EINVAL;
  const json_t *entry;
  if (gmodel_judge_entry(json_string_value(json_object_get(spec, "judge_model")), pol, "judge",
                         "judge_model", &entry, e))
    return DAPO_EINVAL;
  const char *prompt, *system;
  if (model_template(spec, "prompt", 1, &prompt, e) ||
      model_template(spec, "system", 0, &system, e))
    return DAPO_EINVAL;
  for (int k = 0; k < 2; k++) {
    const char *t = k ? system : prompt, *what = k ? "system" : "prompt";
    if (t && rank && strstr(t, "sample.output_"))
      return dapo_errf(e, DAPO_EINVAL,
                       "judge.%s: a model_rank judge sees its group's responses together, as "
                       "{{sample.responses}}, not {{sample.output_*}}",
                       what);
    if (t && !rank && strstr(t, "sample.responses"))
      return dapo_errf(e, DAPO_EINVAL,
                       "judge.%s: {{sample.responses}} is a model_rank judge's; a model judge "
                       "sees one response, {{sample.output_text}}",
                       what);
  }
  if (rank && !strstr(prompt, "sample.responses") &&
      !(system && strstr(system, "sample.responses")))
    return dapo_errf(e, DAPO_EINVAL,
                     "judge.prompt: a model_rank judge's prompt places the group's responses "
                     "with {{sample.responses}}");
  const json_t *sc = json_object_get(spec, "scale");
  double lo = 0, hi = 1;
  if (sc) {
    if (!json_is_array(sc) || json_array_size(sc) != 2 || !json_is_number(json_array_get(sc, 0)) ||
        !json_is_number(json_array_get(sc, 1)) ||
        !(json_number_value(json_array_get(sc, 0)) < json_number_value(json_array_get(sc, 1))) ||
        !(fabs(json_number_value(json_array_get(sc, 0))) <= 1e6) ||
        !(fabs(json_number_value(json_array_get(sc, 1))) <= 1e6))
      return dapo_errf(e, DAPO_EINVAL,
                       "judge.scale: expected [min, max], numbers with min < max within 1e6");
    lo = json_number_value(json_array_get(sc, 0)), hi = json_number_value(json_array_get(sc, 1));
  }
  const json_t *pt = json_object_get(spec, "pass_threshold");
  j->pass_threshold = (lo + hi) / 2;
  if (pt) {
    if (!json_is_number(pt) || !(fabs(json_number_value(pt)) <= 1e6))
      return dapo_errf(e, DAPO_EINVAL, "judge.pass_threshold: expected a number");
    j->pass_threshold = json_number_value(pt);
  }
  json_t *input = json_array(), *g = NULL;
  if (input && system)
    json_array_append_new(input, json_pack("{s:s, s:s}", "role", "system", "content", system));
  if (input)
    json_array_append_new(input, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
  if (input)
    g = json_pack("{s:s, s:s, s:s, s:o, s:[f, f]}", "type", "score_model", "name", "model", "model",
                  json_string_value(json_object_get(spec, "judge_model")), "input", input, "range",
                  lo, hi);
  const json_t *sp = json_object_get(spec, "sampling_params");
  if (g && sp && json_object_set(g, "sampling_params", (json_t *)sp)) json_decref(g), g = NULL;
  if (!g) return dapo_errf(e, DAPO_ENOMEM, "judge: out of memory");
  if (rank)
    j->rank = gmodel_new(g, "judge", GM_RANK, pol, e);
  else
    j->grader = grader_new(g, "judge", pol, e);
  json_decref(g);
  return j->rank || j->grader ? 0 : e ? e->code : DAPO_EINVAL;
}

struct judge *judge_new(const json_t *spec, const struct judge_policy *pol, struct dapo_err *e) {
  if (!json_is_object(spec)) {
    dapo_errf(e, DAPO_EINVAL, "judge: expected an object such as {\"type\": \"math\"}");
    return NULL;
  }
  const char *type = json_string_value(json_object_get(spec, "type"));
  if (!type) {
    dapo_errf(e, DAPO_EINVAL,
              "judge.type: required, one of exact, math, regex, http, grader, model, model_rank");
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
  } else if (!strcmp(type, "model") || !strcmp(type, "model_rank")) {
    j->kind = strcmp(type, "model") ? JK_RANK : JK_MODEL;
    rc = model_init(j, spec, j->kind == JK_RANK, pol, e);
  } else if (!strcmp(type, "http")) {
    j->kind = JK_HTTP;
    j->http = judge_http_new(spec, pol, e);
    if (!j->http) rc = e ? e->code : DAPO_EINVAL;
  } else {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "judge.type: '%.40s' is not one of exact, math, regex, http, grader, model, "
                   "model_rank",
                   type);
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
  gmodel_free(j->rank);
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
 * native format's answer beside them as item.answer (and, for a model judge, its prompt as
 * item.prompt). */
static json_t *grader_item(const struct judge *j, const struct judge_item *it) {
  json_t *o = json_is_object(it->metadata) ? json_copy((json_t *)it->metadata) : json_object();
  if (o && it->answer && *it->answer && !json_object_get(o, "answer"))
    json_object_set_new(o, "answer", judge_json_string(it->answer));
  /* a native model judge reads the prompt too: item.prompt */
  if (o && j->kind != JK_GRADER && !json_object_get(o, "prompt"))
    json_object_set_new(o, "prompt", judge_json_string(it->prompt));
  return o;
}

/* Sample r's verdict from a grader's score: the reward, correct at pass_threshold, its info
 * {"score", "sub_rewards", "errors", "error_detail"?, "token_usage"?} (sub: owned, may be NULL),
 * and JE_HTTP when the judge model could not answer (then on_judge_error applies as for the
 * http judge; the other model_grader errors score 0 like any grader error). Returns 0 or
 * DAPO_ENOMEM. */
static int grader_result(const struct judge *j, double score, json_t *sub,
                         const struct grader_errs *er, struct judge_result *r,
                         struct judge_stats *st) {
  json_t *counts = json_object();
  for (int k = 0; counts && k < GE_COUNT; k++)
    if (er->n[k]) json_object_set_new(counts, grader_err_name(k), json_integer(er->n[k]));
  for (int k = 0; st && k < GE_COUNT; k++) st->n_grader[k] += er->n[k] > 0;
  r->reward = score;
  r->correct = score >= j->pass_threshold;
  r->info =
      json_pack("{s:f, s:o, s:o*, s:s*}", "score", score, "sub_rewards", sub ? sub : json_object(),
                "errors", counts, "error_detail", er->detail[0] ? er->detail : NULL);
  if (!r->info) return DAPO_ENOMEM;
  /* the judge models' tokens for this sample: {"model": {"prompt_tokens", ...}} */
  for (int k = 0; k < er->n_usage; k++) {
    const struct grader_usage *u = &er->usage[k];
    json_t *tu = json_object_get(r->info, "token_usage");
    if (!tu && json_object_set_new(r->info, "token_usage", tu = json_object())) tu = NULL;
    if (!tu ||
        json_object_set_new(tu, u->model,
                            json_pack("{s:I, s:I}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                                      "completion_tokens", (json_int_t)u->completion_tokens)))
      return DAPO_ENOMEM;
  }
  if (er->n[GE_MODEL_SERVER]) r->err = JE_HTTP;
  if (st) { /* the step's tokens per judge model */
    const char *names[GRADER_MAX_USAGE];
    int nm = judge_models_used(j, names);
    for (int k = 0; k < er->n_usage; k++)
      for (int m = 0; m < nm; m++)
        if (!strcmp(names[m], er->usage[k].model)) {
          st->model_tokens[m][0] += er->usage[k].prompt_tokens;
          st->model_tokens[m][1] += er->usage[k].completion_tokens;
        }
  }
  return 0;
}

/* The end of a grader judge's run: DAPO_ENOMEM, or DAPO_EIO quoting the first judge model
 * server error when some samples have none (n_server of n), else 0. */
static int grader_outcome(int rc, const struct grader_errs *errs, int n, struct dapo_err *e) {
  if (rc) return dapo_errf(e, rc, "judge: out of memory");
  int n_server = 0;
  const char *server = NULL;
  for (int i = 0; i < n; i++)
    if (errs[i].n[GE_MODEL_SERVER] && !n_server++ && errs[i].model_detail[0])
      server = errs[i].model_detail;
  if (n_server)
    return dapo_errf(e, DAPO_EIO, "grader: %s (%d of %d samples)",
                     server ? server : "judge model server error", n_server, n);
  return 0;
}

static int run_grader(const struct judge *j, const struct judge_item *items, int n,
                      struct judge_result *res, struct judge_stats *st, struct dapo_err *e) {
  struct grader_sample *s = calloc((size_t)n, sizeof *s);
  json_t **own = calloc(2 * (size_t)n, sizeof *own), **sub = calloc((size_t)n, sizeof *sub);
  double *scores = calloc((size_t)n, sizeof *scores);
  struct grader_errs *errs = calloc((size_t)n, sizeof *errs);
  unsigned char *bad = calloc((size_t)n, 1);
  int rc = s && own && sub && scores && errs && bad ? 0 : DAPO_ENOMEM;
  for (int i = 0; !rc && i < n; i++) {
    s[i].output_text = items[i].response ? items[i].response : "";
    own[2 * i] = output_json(j, s[i].output_text);
    own[2 * i + 1] = grader_item(j, &items[i]);
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
    rc = grader_result(j, scores[i], sub[i], &errs[i], &res[i], st);
    sub[i] = NULL;
  }
  for (int i = 0; own && i < 2 * n; i++) json_decref(own[i]);
  for (int i = 0; sub && i < n; i++) json_decref(sub[i]);
  rc = grader_outcome(rc, errs, errs ? n : 0, e);
  free(s);
  free(own);
  free(sub);
  free(scores);
  free(errs);
  free(bad);
  return rc;
}

/* Items by prompt group, then by their order in the call (a total order: qsort is stable so). */
static int cmp_group(const void *a, const void *b, void *ctx) {
  const struct judge_item *items = ctx;
  int i = *(const int *)a, k = *(const int *)b;
  if (items[i].group != items[k].group) return items[i].group < items[k].group ? -1 : 1;
  return (i > k) - (i < k);
}

/* The responses of a group as a model_rank judge reads them: "Response 1:\n...\n\nResponse 2:\n..."
 * (new string; NULL on OOM). */
static json_t *group_responses(const struct judge_item *items, const int *idx, int n) {
  size_t len = 1;
  for (int k = 0; k < n; k++)
    len += 32 + strlen(items[idx[k]].response ? items[idx[k]].response : "");
  char *buf = malloc(len);
  if (!buf) return NULL;
  size_t w = 0;
  for (int k = 0; k < n; k++)
    w += (size_t)snprintf(buf + w, len - w, "%sResponse %d:\n%s", k ? "\n\n" : "", k + 1,
                          items[idx[k]].response ? items[idx[k]].response : "");
  json_t *v = judge_json_string(buf);
  free(buf);
  return v;
}

/* model_rank: one call per prompt group with every response of it; each sample's reward is the
 * score the judge model gave it. */
static int run_rank(const struct judge *j, const struct judge_item *items, int n,
                    struct judge_result *res, struct judge_stats *st, struct dapo_err *e) {
  int *order = malloc(sizeof(int) * (size_t)n), *first = malloc(sizeof(int) * (size_t)n),
      *count = malloc(sizeof(int) * (size_t)n), ng = 0;
  json_t **roots = calloc((size_t)n, sizeof *roots);
  double *scores = calloc((size_t)n, sizeof *scores);
  struct grader_errs *errs = calloc((size_t)n, sizeof *errs);
  int rc = order && first && count && roots && scores && errs ? 0 : DAPO_ENOMEM;
  for (int i = 0; !rc && i < n; i++) order[i] = i;
  if (!rc) qsort_r(order, (size_t)n, sizeof *order, cmp_group, (void *)items);
  for (int p = 0; !rc && p < n; p++) {
    if (p && items[order[p]].group == items[order[p - 1]].group) {
      count[ng - 1]++;
      continue;
    }
    first[ng] = p, count[ng] = 1;
    ng++;
  }
  for (int g = 0; !rc && g < ng; g++) {
    json_t *resp = group_responses(items, order + first[g], count[g]);
    json_t *item = grader_item(j, &items[order[first[g]]]);
    roots[g] = resp && item ? json_pack("{s:o, s:{s:o, s:i}}", "item", item, "sample", "responses",
                                        resp, "count", count[g])
                            : NULL;
    if (!roots[g]) {
      json_decref(resp), json_decref(item);
      rc = DAPO_ENOMEM;
    }
  }
  if (!rc) rc = gmodel_rank(j->rank, roots, first, count, ng, scores, errs);
  for (int p = 0; !rc && p < n; p++) {
    struct judge_result *r = &res[order[p]];
    rc = grader_result(j, scores[p], NULL, &errs[p], r, st);
  }
  for (int g = 0; roots && g < ng; g++) json_decref(roots[g]);
  rc = grader_outcome(rc, errs, errs ? n : 0, e);
  free(order), free(first), free(count), free(roots), free(scores), free(errs);
  return rc;
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
    rc = j->kind == JK_GRADER || j->kind == JK_MODEL ? run_grader(j, items, n, res, st, e)
         : j->kind == JK_RANK                        ? run_rank(j, items, n, res, st, e)
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
