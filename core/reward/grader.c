/* Graders (grader.h): spec validation, templates, string_check, text_similarity, multi with its
 * formula, and the batch that hands python graders to the sandbox (grader_python.c). */
#include "grader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "formula.h"
#include "judge_impl.h"
#include "similarity.h"

#define GRADER_MAX_SUB 32          /* sub-graders of one multi grader */
#define GRADER_MAX_TEMPLATE 65536  /* bytes of one input/reference template */
#define GRADER_MAX_RENDERED 262144 /* bytes a rendered template may reach */

enum gkind { G_STRING_CHECK, G_TEXT_SIMILARITY, G_PYTHON, G_MULTI, G_MODEL };
enum sop { OP_EQ, OP_NE, OP_LIKE, OP_ILIKE };

struct grader {
  enum gkind kind;
  char *type, *name;
  char *input, *reference; /* string_check, text_similarity */
  enum sop op;
  int metric;
  char *source; /* python */
  int n_sub;    /* multi */
  char **keys;
  struct grader **sub;
  struct formula *formula;
  struct gmodel *model; /* score_model, label_model */
};

const char *grader_err_name(enum grader_err k) {
  static const char *const names[GE_COUNT] = {
      "formula_parse_error",         "sample_parse_error",         "invalid_variable_error",
      "python_grader_runtime_error", "python_grader_server_error", "model_grader_server_error",
      "model_grader_parse_error",    "model_grader_refusal_error", "other_error"};
  return (int)k >= 0 && k < GE_COUNT ? names[k] : "unknown";
}

int grader_models(const struct grader *g, const char **names, int n, int cap) {
  if (g->kind == G_MODEL) {
    const char *m = gmodel_model(g->model);
    for (int i = 0; i < n; i++)
      if (!strcmp(names[i], m)) return n;
    if (n < cap) names[n++] = m;
  }
  for (int k = 0; k < g->n_sub; k++) n = grader_models(g->sub[k], names, n, cap);
  return n;
}

const char *grader_type(const struct grader *g) {
  return g->type;
}
const char *grader_name(const struct grader *g) {
  return g->name;
}

void grader_free(struct grader *g) {
  if (!g) return;
  free(g->type);
  free(g->name);
  free(g->input);
  free(g->reference);
  free(g->source);
  for (int i = 0; i < g->n_sub; i++) {
    free(g->keys[i]);
    grader_free(g->sub[i]);
  }
  free(g->keys);
  free(g->sub);
  formula_free(g->formula);
  gmodel_free(g->model);
  free(g);
}

/* ---- spec ---- */

static int check_fields(const json_t *spec, const char *field, const char *const *allowed,
                        struct dapo_err *e) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)spec, key, v) {
    int ok = 0;
    for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, key);
    if (!ok) return dapo_errf(e, DAPO_EINVAL, "%s.%.64s: unknown field", field, key);
  }
  return 0;
}

/* A required (or optional: *out NULL when absent or null) string member, at most max bytes. */
static int take_string(const json_t *spec, const char *field, const char *key, int required,
                       size_t max, char **out, struct dapo_err *e) {
  const json_t *v = json_object_get(spec, key);
  *out = NULL;
  if (!v || json_is_null(v)) {
    if (required) return dapo_errf(e, DAPO_EINVAL, "%s.%s: required, a string", field, key);
    return 0;
  }
  if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected a string", field, key);
  if (json_string_length(v) > max)
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: longer than %zu bytes", field, key, max);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: contains a NUL character", field, key);
  if (!(*out = strdup(json_string_value(v))))
    return dapo_errf(e, DAPO_ENOMEM, "%s.%s: out of memory", field, key);
  return 0;
}

/* Checks that a template's {{ }} are balanced and name item.* or sample.* paths. */
int grader_check_template(const char *t, const char *field, const char *key, struct dapo_err *e) {
  for (const char *p = strstr(t, "{{"); p; p = strstr(p, "{{")) {
    const char *q = strstr(p + 2, "}}");
    if (!q) return dapo_errf(e, DAPO_EINVAL, "%s.%s: '{{' without '}}'", field, key);
    const char *s = p + 2;
    while (*s == ' ' || *s == '\t') s++;
    if (strncmp(s, "item", 4) && strncmp(s, "sample", 6))
      return dapo_errf(e, DAPO_EINVAL,
                       "%s.%s: variables start with item. or sample. (\"{{item.answer}}\", "
                       "\"{{sample.output_text}}\")",
                       field, key);
    p = q + 2;
  }
  return 0;
}

static int parse_one(struct grader *g, const json_t *spec, const char *field, int nested,
                     const struct judge_policy *pol, struct dapo_err *e);

static int parse_multi(struct grader *g, const json_t *spec, const char *field,
                       const struct judge_policy *pol, struct dapo_err *e) {
  static const char *const fields[] = {"type", "name", "graders", "calculate_output", NULL};
  if (check_fields(spec, field, fields, e)) return DAPO_EINVAL;
  const json_t *gs = json_object_get(spec, "graders");
  size_t n = json_is_object(gs)  ? json_object_size(gs)
             : json_is_array(gs) ? json_array_size(gs)
                                 : 0;
  if (!json_is_object(gs) && !json_is_array(gs))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.graders: required, an object of named graders ({\"a\": {...}, ...})",
                     field);
  if (n == 0 || n > GRADER_MAX_SUB)
    return dapo_errf(e, DAPO_EINVAL, "%s.graders: %zu graders, not in [1, %d]", field, n,
                     GRADER_MAX_SUB);
  g->keys = calloc(n, sizeof *g->keys);
  g->sub = calloc(n, sizeof *g->sub);
  if (!g->keys || !g->sub) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  char sub_field[192];
  if (json_is_object(gs)) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)gs, key, v) {
      snprintf(sub_field, sizeof sub_field, "%s.graders.%.64s", field, key);
      int i = g->n_sub;
      if (!(g->keys[i] = strdup(key))) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
      g->n_sub++;
      if (!(g->sub[i] = calloc(1, sizeof *g->sub[i])))
        return dapo_errf(e, DAPO_ENOMEM, "out of memory");
      int rc = parse_one(g->sub[i], v, sub_field, 1, pol, e);
      if (rc) return rc;
    }
  } else {
    /* The API reference's array form: each grader is named by its name, else its type. */
    for (size_t k = 0; k < n; k++) {
      json_t *v = json_array_get(gs, k);
      snprintf(sub_field, sizeof sub_field, "%s.graders[%zu]", field, k);
      int i = g->n_sub++;
      if (!(g->sub[i] = calloc(1, sizeof *g->sub[i])))
        return dapo_errf(e, DAPO_ENOMEM, "out of memory");
      int rc = parse_one(g->sub[i], v, sub_field, 1, pol, e);
      if (rc) return rc;
      const char *key = *g->sub[i]->name ? g->sub[i]->name : g->sub[i]->type;
      for (int j = 0; j < i; j++)
        if (!strcmp(g->keys[j], key))
          return dapo_errf(e, DAPO_EINVAL,
                           "%s.name: '%.64s' names two graders; give each a distinct name",
                           sub_field, key);
      if (!(g->keys[i] = strdup(key))) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    }
  }
  const json_t *co = json_object_get(spec, "calculate_output");
  if (!json_is_string(co))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.calculate_output: required, a formula over the graders' keys (\"0.5 * a "
                     "+ 0.5 * b\")",
                     field);
  g->formula = formula_new(json_string_value(co), json_string_length(co),
                           (const char *const *)g->keys, g->n_sub, e);
  if (!g->formula) return dapo_err_prefix(e, "%s.", field);
  return 0;
}

static int parse_one(struct grader *g, const json_t *spec, const char *field, int nested,
                     const struct judge_policy *pol, struct dapo_err *e) {
  if (!json_is_object(spec))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected a grader object such as {\"type\": \"string_check\", ...}",
                     field);
  const json_t *jt = json_object_get(spec, "type");
  const char *type = json_string_value(jt);
  if (!type)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.type: required, one of string_check, text_similarity, python, "
                     "score_model, label_model, multi",
                     field);
  if (!(g->type = strdup(type))) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  const json_t *jn = json_object_get(spec, "name");
  if (jn && !json_is_null(jn) && !json_is_string(jn))
    return dapo_errf(e, DAPO_EINVAL, "%s.name: expected a string", field);
  if (!(g->name = strdup(json_is_string(jn) ? json_string_value(jn) : "")))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (!strcmp(type, "string_check")) {
    static const char *const fields[] = {"type", "name", "input", "reference", "operation", NULL};
    g->kind = G_STRING_CHECK;
    if (check_fields(spec, field, fields, e) ||
        take_string(spec, field, "input", 1, GRADER_MAX_TEMPLATE, &g->input, e) ||
        take_string(spec, field, "reference", 1, GRADER_MAX_TEMPLATE, &g->reference, e) ||
        grader_check_template(g->input, field, "input", e) ||
        grader_check_template(g->reference, field, "reference", e))
      return e ? e->code : DAPO_EINVAL;
    const char *op = json_string_value(json_object_get(spec, "operation"));
    static const char *const ops[] = {"eq", "ne", "like", "ilike"};
    int k = -1;
    for (int i = 0; op && i < 4; i++)
      if (!strcmp(op, ops[i])) k = i;
    if (k < 0)
      return dapo_errf(e, DAPO_EINVAL, "%s.operation: %s%.32s%s is not one of eq, ne, like, ilike",
                       field, op ? "'" : "", op ? op : "missing", op ? "'" : "");
    g->op = (enum sop)k;
    return 0;
  }
  if (!strcmp(type, "text_similarity")) {
    static const char *const fields[] = {
        "type", "name", "input", "reference", "evaluation_metric", "pass_threshold", NULL};
    g->kind = G_TEXT_SIMILARITY;
    if (check_fields(spec, field, fields, e) ||
        take_string(spec, field, "input", 1, GRADER_MAX_TEMPLATE, &g->input, e) ||
        take_string(spec, field, "reference", 1, GRADER_MAX_TEMPLATE, &g->reference, e) ||
        grader_check_template(g->input, field, "input", e) ||
        grader_check_template(g->reference, field, "reference", e))
      return e ? e->code : DAPO_EINVAL;
    const json_t *pt = json_object_get(spec, "pass_threshold");
    if (pt && !json_is_null(pt) && !json_is_number(pt))
      return dapo_errf(e, DAPO_EINVAL, "%s.pass_threshold: expected a number", field);
    const char *m = json_string_value(json_object_get(spec, "evaluation_metric"));
    if (m && !strcmp(m, "cosine"))
      return dapo_errf(e, DAPO_EUNSUPPORTED,
                       "%s.evaluation_metric: cosine needs an embeddings model, which dapod does "
                       "not have; use fuzzy_match, bleu, gleu, meteor, rouge_1..rouge_5 or "
                       "rouge_l, or a python grader",
                       field);
    if ((g->metric = sim_metric_find(m)) < 0)
      return dapo_errf(e, DAPO_EINVAL,
                       "%s.evaluation_metric: %s%.32s%s is not one of fuzzy_match, bleu, gleu, "
                       "meteor, rouge_1, rouge_2, rouge_3, rouge_4, rouge_5, rouge_l",
                       field, m ? "'" : "", m ? m : "missing", m ? "'" : "");
    return 0;
  }
  if (!strcmp(type, "python")) {
    static const char *const fields[] = {"type", "name", "source", "image_tag", NULL};
    g->kind = G_PYTHON;
    if (check_fields(spec, field, fields, e) ||
        take_string(spec, field, "source", 1, GRADER_PY_SOURCE_BYTES, &g->source, e))
      return e ? e->code : DAPO_EINVAL;
    const json_t *it = json_object_get(spec, "image_tag");
    if (it && !json_is_null(it) && !json_is_string(it))
      return dapo_errf(e, DAPO_EINVAL, "%s.image_tag: expected a string", field);
    if (!strstr(g->source, "def grade"))
      return dapo_errf(e, DAPO_EINVAL,
                       "%s.source: must define grade(sample, item) returning a number", field);
    char why[200];
    if (!grader_python_available(why, sizeof why))
      return dapo_errf(e, DAPO_EUNSUPPORTED, "%s.type: python graders cannot run here: %s", field,
                       why);
    return 0;
  }
  if (!strcmp(type, "multi")) {
    if (nested)
      return dapo_errf(e, DAPO_EINVAL, "%s.type: a multi grader cannot hold another multi grader",
                       field);
    g->kind = G_MULTI;
    return parse_multi(g, spec, field, pol, e);
  }
  if (!strcmp(type, "score_model") || !strcmp(type, "label_model")) {
    g->kind = G_MODEL;
    g->model = gmodel_new(spec, field, !strcmp(type, "label_model") ? GM_LABEL : GM_SCORE, pol, e);
    return g->model ? 0 : e ? e->code : DAPO_EINVAL;
  }
  return dapo_errf(e, DAPO_EINVAL,
                   "%s.type: '%.40s' is not one of string_check, text_similarity, python, "
                   "score_model, label_model, multi",
                   field, type);
}

struct grader *grader_new(const json_t *spec, const char *field, const struct judge_policy *pol,
                          struct dapo_err *e) {
  struct grader *g = calloc(1, sizeof *g);
  if (!g) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    return NULL;
  }
  if (parse_one(g, spec, field, 0, pol, e)) {
    grader_free(g);
    return NULL;
  }
  return g;
}

/* ---- templates ---- */

/* The value at path (e.g. "item.answer", "sample.output_json.a[0].b") under root, or NULL. */
static const json_t *resolve(const json_t *root, const char *p, size_t n) {
  const json_t *cur = root;
  size_t i = 0;
  while (i < n && cur) {
    if (p[i] == '[') {
      size_t j = i + 1;
      size_t idx = 0;
      if (j >= n || p[j] < '0' || p[j] > '9') return NULL;
      while (j < n && p[j] >= '0' && p[j] <= '9') {
        if (idx > 100000000) return NULL;
        idx = idx * 10 + (size_t)(p[j++] - '0');
      }
      if (j >= n || p[j] != ']') return NULL;
      cur = json_is_array(cur) ? json_array_get(cur, idx) : NULL;
      i = j + 1;
      if (i < n && p[i] == '.') i++;
      continue;
    }
    size_t j = i;
    while (j < n && p[j] != '.' && p[j] != '[') j++;
    if (j == i) return NULL;
    char key[256];
    if (j - i >= sizeof key) return NULL;
    memcpy(key, p + i, j - i);
    key[j - i] = '\0';
    cur = json_is_object(cur) ? json_object_get(cur, key) : NULL;
    i = j;
    if (i < n && p[i] == '.') i++;
  }
  return cur;
}

struct buf {
  char *p;
  size_t n, cap;
};

static int buf_add(struct buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > GRADER_MAX_RENDERED) return DAPO_ERANGE;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return DAPO_ENOMEM;
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
  return 0;
}

int grader_render(const char *tmpl, const json_t *root, char **out, char *bad, size_t cap) {
  struct buf b = {0};
  *out = NULL;
  if (bad && cap) *bad = '\0';
  int rc = buf_add(&b, "", 0);
  const char *p = tmpl;
  while (!rc) {
    const char *open = strstr(p, "{{");
    if (!open) {
      rc = buf_add(&b, p, strlen(p));
      break;
    }
    const char *close = strstr(open + 2, "}}");
    if (!close) {
      rc = buf_add(&b, p, strlen(p));
      break;
    }
    if ((rc = buf_add(&b, p, (size_t)(open - p)))) break;
    const char *s = open + 2, *t = close;
    while (s < t && (*s == ' ' || *s == '\t')) s++;
    while (t > s && (t[-1] == ' ' || t[-1] == '\t')) t--;
    const json_t *v = resolve(root, s, (size_t)(t - s));
    if (!v || json_is_null(v)) {
      if (bad && cap) snprintf(bad, cap, "%.*s", (int)(t - s), s);
      free(b.p);
      return 1;
    }
    if (json_is_string(v)) {
      rc = buf_add(&b, json_string_value(v), json_string_length(v));
    } else {
      char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      rc = d ? buf_add(&b, d, strlen(d)) : DAPO_ENOMEM;
      free(d);
    }
    p = close + 2;
  }
  if (rc == DAPO_ERANGE) { /* too long to grade: an invalid variable, as its value is unusable */
    if (bad && cap) snprintf(bad, cap, "(rendered text over %d bytes)", GRADER_MAX_RENDERED);
    free(b.p);
    return 1;
  }
  if (rc) {
    free(b.p);
    return rc;
  }
  *out = b.p;
  return 0;
}

/* ---- grading ---- */

static char *casefold(const char *s) {
  utf8proc_uint8_t *o = NULL;
  utf8proc_ssize_t r =
      utf8proc_map((const utf8proc_uint8_t *)s, 0, &o,
                   UTF8PROC_NULLTERM | UTF8PROC_CASEFOLD | UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (r < 0) return strdup(s); /* invalid UTF-8: compare the bytes as they are */
  return (char *)o;
}

/* The score of a string_check / text_similarity grader on one sample; -1 out of memory. */
static double grade_text(const struct grader *g, const json_t *root, struct grader_errs *er) {
  char *in = NULL, *ref = NULL, bad[128];
  int rc = grader_render(g->input, root, &in, bad, sizeof bad);
  if (!rc) rc = grader_render(g->reference, root, &ref, bad, sizeof bad);
  double score = 0;
  if (rc == 1) {
    er->n[GE_INVALID_VARIABLE]++;
    goto out;
  }
  if (rc) {
    score = -1;
    goto out;
  }
  if (g->kind == G_TEXT_SIMILARITY) {
    score = sim_score((enum sim_metric)g->metric, in, ref);
    goto out;
  }
  switch (g->op) {
  case OP_EQ: score = !strcmp(in, ref); break;
  case OP_NE: score = !!strcmp(in, ref); break;
  case OP_LIKE: score = strstr(in, ref) != NULL; break;
  case OP_ILIKE: {
    char *a = casefold(in), *b = casefold(ref);
    score = a && b ? strstr(a, b) != NULL : -1;
    free(a);
    free(b);
    break;
  }
  }
out:
  free(in);
  free(ref);
  return score;
}

/* The python graders' batch: one sandbox run for the n samples. */
static int grade_python(const struct grader *g, json_t *const *roots, int n, double *scores,
                        struct grader_errs *errs) {
  json_t *rows = json_array();
  int *kinds = calloc((size_t)n, sizeof *kinds);
  int rc = rows && kinds ? 0 : DAPO_ENOMEM;
  for (int i = 0; !rc && i < n; i++) {
    json_t *row = json_pack("{s:O, s:O}", "sample", json_object_get(roots[i], "sample"), "item",
                            json_object_get(roots[i], "item"));
    if (!row || json_array_append_new(rows, row)) rc = DAPO_ENOMEM;
  }
  char detail[256] = "";
  if (!rc) rc = grader_python_run(g->source, rows, scores, kinds, detail, sizeof detail);
  for (int i = 0; !rc && i < n; i++) {
    if (kinds[i] == GE_COUNT) continue;
    scores[i] = 0;
    errs[i].n[kinds[i]]++;
    if (!errs[i].detail[0]) snprintf(errs[i].detail, sizeof errs[i].detail, "%s", detail);
  }
  json_decref(rows);
  free(kinds);
  return rc;
}

/* Scores of one non-multi grader over the batch. */
static int grade_leaf(const struct grader *g, json_t *const *roots, int n, double *scores,
                      struct grader_errs *errs) {
  if (g->kind == G_PYTHON) return grade_python(g, roots, n, scores, errs);
  if (g->kind == G_MODEL) return gmodel_grade(g->model, roots, n, scores, errs);
  for (int i = 0; i < n; i++) {
    scores[i] = grade_text(g, roots[i], &errs[i]);
    if (scores[i] < 0) return DAPO_ENOMEM;
  }
  return 0;
}

int grader_grade(const struct grader *g, const struct grader_sample *s, int n, double *scores,
                 json_t **sub, struct grader_errs *errs) {
  if (n <= 0) return 0;
  json_t **roots = calloc((size_t)n, sizeof *roots);
  struct grader_errs *er = calloc((size_t)n, sizeof *er);
  double *vals = NULL;
  int rc = roots && er ? 0 : DAPO_ENOMEM;
  for (int i = 0; i < n; i++) scores[i] = 0;
  if (sub)
    for (int i = 0; i < n; i++) sub[i] = NULL;
  /* root = {"item": ..., "sample": {output_text, output_json, output_tools, choices}} */
  for (int i = 0; !rc && i < n; i++) {
    const char *text = s[i].output_text ? s[i].output_text : "";
    json_t *t = judge_json_string(text); /* invalid UTF-8 bytes read as U+FFFD */
    const json_t *calls = json_array_size(s[i].output_tools) ? s[i].output_tools : NULL;
    json_t *sample = json_pack("{s:o, s:O, s:o, s:[{s:i, s:{s:s, s:O, s:O*}, s:s}]}", "output_text",
                               t, "output_json", s[i].output_json ? s[i].output_json : json_null(),
                               "output_tools", calls ? json_incref((json_t *)calls) : json_array(),
                               "choices", "index", 0, "message", "role", "assistant", "content", t,
                               "tool_calls", calls, "finish_reason", calls ? "tool_calls" : "stop");
    /* item: a reference of ours either way (a borrowed row, or a new empty object) */
    json_t *item = s[i].item ? json_incref((json_t *)s[i].item) : json_object();
    roots[i] = sample && item ? json_pack("{s:o, s:o}", "item", item, "sample", sample) : NULL;
    if (!roots[i] && (!sample || !item)) json_decref(sample ? sample : item);
    if (!roots[i]) rc = DAPO_ENOMEM;
  }
  if (!rc && g->kind != G_MULTI) rc = grade_leaf(g, roots, n, scores, er);
  if (!rc && g->kind == G_MULTI) {
    vals = calloc((size_t)n * (size_t)g->n_sub, sizeof *vals);
    double *col = calloc((size_t)n, sizeof *col);
    rc = vals && col ? 0 : DAPO_ENOMEM;
    for (int k = 0; !rc && k < g->n_sub; k++) {
      if (!formula_uses(g->formula, k) && !sub) continue;
      rc = grade_leaf(g->sub[k], roots, n, col, er);
      for (int i = 0; i < n; i++) vals[(size_t)i * g->n_sub + k] = col[i];
    }
    free(col);
    for (int i = 0; !rc && i < n; i++) {
      double v = formula_eval(g->formula, vals + (size_t)i * g->n_sub);
      if (!isfinite(v)) {
        er[i].n[GE_FORMULA_PARSE]++;
        v = 0;
      }
      scores[i] = v;
      if (sub && !(sub[i] = json_object())) rc = DAPO_ENOMEM;
      for (int k = 0; !rc && sub && k < g->n_sub; k++)
        if (json_object_set_new(sub[i], g->keys[k], json_real(vals[(size_t)i * g->n_sub + k])))
          rc = DAPO_ENOMEM;
    }
  }
  if (!rc && sub && g->kind != G_MULTI)
    for (int i = 0; !rc && i < n; i++)
      if (!(sub[i] = json_object())) rc = DAPO_ENOMEM;
  if (rc) {
    for (int i = 0; i < n; i++) scores[i] = 0;
    if (sub)
      for (int i = 0; i < n; i++) json_decref(sub[i]), sub[i] = NULL;
  }
  if (errs && er) memcpy(errs, er, (size_t)n * sizeof *errs);
  for (int i = 0; roots && i < n; i++) json_decref(roots[i]);
  free(roots);
  free(er);
  free(vals);
  return rc;
}
