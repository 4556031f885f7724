/* score_model and label_model graders (grader.h): the rendered input messages go to a judge model
 * of the server's judge_models, an OpenAI-compatible upstream, as POST {url}/chat/completions
 * with a strict json_schema response_format; the reply's result (clamped to range) or label
 * (1 when it passes) is the score. Requests are every outside party's (outside.h: the host
 * policy checked at connect time, bounded replies), retried with backoff, up to the judge
 * model's concurrency at once. Failures score 0 and count as OpenAI's model_grader_* errors. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grader.h"
#include "judge_impl.h"
#include "outside.h"

#define GM_MAX_MESSAGES 64
#define GM_MAX_LABELS 64
#define GM_MAX_LABEL_BYTES 256
#define GM_MAX_KEY_BYTES 4096
#define GM_MAX_TEMPLATE 65536

struct gmodel {
  enum gmodel_kind kind;
  int label; /* kind == GM_LABEL */
  char *judge, *model;
  struct outside *out;               /* an upstream's party; NULL for a served model */
  const struct judge_served *served; /* a model dapod serves (model is its id); NULL: upstream */
  int timeout_ms, concurrency, max_retries;
  int n_msg;
  char **role, **tmpl;
  double lo, hi;
  json_t *extra;  /* sampling fields of the request body (owned) */
  json_t *format; /* the response_format (owned) */
  int n_labels;
  char **labels;
  unsigned char *passing;
};

/* ---- judge_models entries ---- */

struct jm_entry {
  const json_t *url;
  const char *model, *key_file;
  const char *serve; /* a model dapod serves itself (then url, key_file NULL) */
  int timeout_ms, concurrency, max_retries;
};

static int entry_int(const json_t *o, const char *field, const char *key, int def, int min, int max,
                     int *out, struct dapo_err *e) {
  const json_t *v = json_object_get(o, key);
  *out = def;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: expected an integer in [%d, %d]", field, key, min,
                     max);
  *out = (int)json_integer_value(v);
  return 0;
}

static int read_entry(const json_t *o, const char *field, struct jm_entry *en, struct dapo_err *e) {
  if (!json_is_object(o))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected an object {\"url\", \"model\", \"api_key_file\", ...}", field);
  const json_t *sv = json_object_get(o, "serve");
  memset(en, 0, sizeof *en);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    static const char *const ok[] = {"url",        "model",       "api_key_file",
                                     "timeout_ms", "concurrency", "max_retries"};
    static const char *const ok_serve[] = {"serve", "timeout_ms", "concurrency", "max_retries"};
    int found = 0;
    for (size_t i = 0; !sv && i < sizeof ok / sizeof *ok && !found; i++)
      found = !strcmp(ok[i], key);
    for (size_t i = 0; sv && i < sizeof ok_serve / sizeof *ok_serve && !found; i++)
      found = !strcmp(ok_serve[i], key);
    if (!found)
      return dapo_errf(e, DAPO_EINVAL, "%s.%.64s: %s", field, key,
                       sv ? "not a field of a served judge model (serve, timeout_ms, concurrency, "
                            "max_retries)"
                          : "unknown field");
  }
  if (sv) { /* a model dapod serves itself: its id is the request's model */
    if (!json_is_string(sv) || !json_string_length(sv) || json_string_length(sv) > 256)
      return dapo_errf(e, DAPO_EINVAL,
                       "%s.serve: expected a preset, a folder of the models directory or a "
                       "checkpoint id (1 to 256 bytes)",
                       field);
    en->serve = en->model = json_string_value(sv);
    if (entry_int(o, field, "timeout_ms", 120000, 100, 600000, &en->timeout_ms, e) ||
        entry_int(o, field, "concurrency", 2, 1, 256, &en->concurrency, e) ||
        entry_int(o, field, "max_retries", 2, 0, 10, &en->max_retries, e))
      return e ? e->code : DAPO_EINVAL;
    return 0;
  }
  en->url = json_object_get(o, "url");
  if (!json_is_string(en->url))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.url: required, the upstream's base URL (\"http://127.0.0.1:8000/v1\")",
                     field);
  const json_t *m = json_object_get(o, "model");
  if (!json_is_string(m) || !json_string_length(m) || json_string_length(m) > 256)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.model: required, the upstream's model name (1 to 256 bytes)", field);
  en->model = json_string_value(m);
  const json_t *k = json_object_get(o, "api_key_file");
  if (k && !json_is_null(k) && (!json_is_string(k) || !json_string_length(k)))
    return dapo_errf(e, DAPO_EINVAL, "%s.api_key_file: expected a path", field);
  en->key_file = json_string_value(k);
  if (entry_int(o, field, "timeout_ms", 60000, 100, 600000, &en->timeout_ms, e) ||
      entry_int(o, field, "concurrency", 4, 1, 256, &en->concurrency, e) ||
      entry_int(o, field, "max_retries", 2, 0, 10, &en->max_retries, e))
    return e ? e->code : DAPO_EINVAL;
  return 0;
}

/* The key in path (trailing whitespace cut) into key (cap bytes). Errors never quote it. */
static int read_key(const char *path, const char *field, char *key, size_t cap,
                    struct dapo_err *e) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return dapo_errf(e, DAPO_EINVAL, "%s.api_key_file: cannot read '%.200s': %s", field, path,
                     strerror(errno));
  size_t n = fread(key, 1, cap, f);
  int err = ferror(f);
  fclose(f);
  if (err) return dapo_errf(e, DAPO_EINVAL, "%s.api_key_file: cannot read '%.200s'", field, path);
  if (n == cap)
    return dapo_errf(e, DAPO_EINVAL, "%s.api_key_file: '%.200s' is longer than %zu bytes", field,
                     path, cap - 1);
  while (n > 0 && isspace((unsigned char)key[n - 1])) n--;
  key[n] = '\0';
  if (!n || strlen(key) != n || strpbrk(key, "\r\n"))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.api_key_file: '%.200s' must hold one line, the key (not empty, no NUL)",
                     field, path);
  return 0;
}

/* The party for en: {url}/chat/completions with the key as a bearer token. */
static struct outside *entry_party(const struct jm_entry *en, const char *field,
                                   const struct judge_policy *pol, struct dapo_err *e) {
  const char *base = json_string_value(en->url);
  size_t bl = strlen(base);
  while (bl > 0 && base[bl - 1] == '/') bl--;
  char url[2200];
  if (bl > 2048) return dapo_errf(e, DAPO_EINVAL, "%s.url: longer than 2048 bytes", field), NULL;
  snprintf(url, sizeof url, "%.*s/chat/completions", (int)bl, base);
  json_t *ju = json_string(url), *hdr = json_object();
  struct outside *o = NULL;
  if (!ju || !hdr) {
    dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    goto out;
  }
  if (en->key_file) {
    char *key = malloc(GM_MAX_KEY_BYTES + 16), *val = malloc(GM_MAX_KEY_BYTES + 16);
    int rc = key && val ? read_key(en->key_file, field, key, GM_MAX_KEY_BYTES, e)
                        : dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    if (!rc) snprintf(val, GM_MAX_KEY_BYTES + 16, "Bearer %s", key);
    if (!rc && json_object_set_new(hdr, "Authorization", json_string(val)))
      rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
    if (key) memset(key, 0, GM_MAX_KEY_BYTES + 16);
    if (val) memset(val, 0, GM_MAX_KEY_BYTES + 16);
    free(key);
    free(val);
    if (rc) goto out;
  }
  char sub[200];
  snprintf(sub, sizeof sub, "%s", field);
  o = outside_new(sub, "judge", ju, hdr, pol, e);
  if (!o && e) { /* the URL as the config gives it, without the path we added */
    const char *p = strstr(e->msg, "/chat/completions");
    if (p) memmove((char *)p, p + 17, strlen(p + 17) + 1);
  }
out:
  json_decref(ju);
  json_decref(hdr);
  return o;
}

int grader_models_check(const json_t *models, const struct judge_policy *pol, const char *field,
                        struct dapo_err *e) {
  if (!models || json_is_null(models)) return 0;
  if (!json_is_object(models))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected an object of judge models {\"name\": {\"url\", \"model\"}}",
                     field);
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)models, name, v) {
    char sub[160];
    snprintf(sub, sizeof sub, "%s.%.64s", field, name);
    if (!*name || strlen(name) > 64)
      return dapo_errf(e, DAPO_EINVAL, "%s: a judge model's name has 1 to 64 bytes", field);
    struct jm_entry en;
    if (read_entry(v, sub, &en, e)) return e ? e->code : DAPO_EINVAL;
    if (en.serve) { /* the model is checked where the completion service runs (pol->served) */
      char why[300] = "";
      if (pol && pol->served && pol->served->check(pol->served->ctx, en.serve, why, sizeof why))
        return dapo_errf(e, DAPO_EINVAL, "%s.serve: %s", sub, why);
      continue;
    }
    struct outside *o = entry_party(&en, sub, pol, e);
    if (!o) return e ? e->code : DAPO_EINVAL;
    outside_free(o);
  }
  return 0;
}

/* ---- the grader's spec ---- */

void gmodel_free(struct gmodel *m) {
  if (!m) return;
  free(m->judge);
  free(m->model);
  outside_free(m->out);
  for (int i = 0; i < m->n_msg; i++) free(m->role[i]), free(m->tmpl[i]);
  free(m->role);
  free(m->tmpl);
  json_decref(m->extra);
  json_decref(m->format);
  for (int i = 0; i < m->n_labels; i++) free(m->labels[i]);
  free(m->labels);
  free(m->passing);
  free(m);
}

/* A content part's text template: a string, or {"type": "input_text"|"output_text", "text"}. */
static int part_text(const json_t *p, const char *field, const char **out, struct dapo_err *e) {
  if (json_is_string(p)) return *out = json_string_value(p), 0;
  const char *t = json_string_value(json_object_get(p, "type"));
  const json_t *tx = json_object_get(p, "text");
  if (t && (!strcmp(t, "input_image") || !strcmp(t, "input_audio")))
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "%s.type: %s is not supported: the judge models receive text only", field, t);
  if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text")) || !json_is_string(tx))
    return dapo_errf(e, DAPO_EINVAL,
                     "%s: expected a string or {\"type\": \"input_text\", \"text\": \"...\"}",
                     field);
  *out = json_string_value(tx);
  return 0;
}

static int append(char **acc, const char *s) {
  size_t a = *acc ? strlen(*acc) : 0, b = strlen(s);
  char *p = realloc(*acc, a + b + 2);
  if (!p) return DAPO_ENOMEM;
  if (a) p[a++] = '\n';
  memcpy(p + a, s, b + 1);
  *acc = p;
  return 0;
}

static int parse_input(struct gmodel *m, const json_t *in, const char *field, struct dapo_err *e) {
  if (!json_is_array(in) || !json_array_size(in) || json_array_size(in) > GM_MAX_MESSAGES)
    return dapo_errf(e, DAPO_EINVAL,
                     "%s.input: required, 1 to %d messages [{\"role\": \"user\", \"content\": "
                     "\"...{{sample.output_text}}...\"}]",
                     field, GM_MAX_MESSAGES);
  size_t n = json_array_size(in);
  m->role = calloc(n, sizeof *m->role);
  m->tmpl = calloc(n, sizeof *m->tmpl);
  if (!m->role || !m->tmpl) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
  for (size_t i = 0; i < n; i++) {
    const json_t *msg = json_array_get(in, i);
    char f[200];
    snprintf(f, sizeof f, "%s.input[%zu]", field, i);
    if (!json_is_object(msg))
      return dapo_errf(e, DAPO_EINVAL, "%s: expected a message {\"role\", \"content\"}", f);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)msg, key, v) {
      if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "type"))
        return dapo_errf(e, DAPO_EINVAL, "%s.%.64s: unknown field", f, key);
    }
    const char *type = json_string_value(json_object_get(msg, "type"));
    if (json_object_get(msg, "type") && (!type || strcmp(type, "message")))
      return dapo_errf(e, DAPO_EINVAL, "%s.type: expected \"message\"", f);
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                  strcmp(role, "developer")))
      return dapo_errf(e, DAPO_EINVAL, "%s.role: expected user, assistant, system or developer", f);
    m->n_msg++;
    if (!(m->role[i] = strdup(role))) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    const json_t *c = json_object_get(msg, "content");
    char cf[220];
    snprintf(cf, sizeof cf, "%s.content", f);
    size_t np = json_is_array(c) ? json_array_size(c) : 1;
    if (!c || (json_is_array(c) && !np))
      return dapo_errf(e, DAPO_EINVAL, "%s: required, a string or text parts", cf);
    for (size_t k = 0; k < np; k++) {
      const char *t = NULL;
      char pf[240];
      snprintf(pf, sizeof pf, json_is_array(c) ? "%s[%zu]" : "%s", cf, k);
      if (part_text(json_is_array(c) ? json_array_get(c, k) : c, pf, &t, e))
        return e ? e->code : DAPO_EINVAL;
      if (append(&m->tmpl[i], t)) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    }
    if (strlen(m->tmpl[i]) > GM_MAX_TEMPLATE)
      return dapo_errf(e, DAPO_EINVAL, "%s: longer than %d bytes", cf, GM_MAX_TEMPLATE);
    if (grader_check_template(m->tmpl[i], f, "content", e)) return e ? e->code : DAPO_EINVAL;
  }
  return 0;
}

static int parse_sampling(struct gmodel *m, const json_t *sp, const char *field,
                          struct dapo_err *e) {
  if (!(m->extra = json_object())) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if (!sp || json_is_null(sp)) return 0;
  if (!json_is_object(sp))
    return dapo_errf(e, DAPO_EINVAL, "%s.sampling_params: expected an object", field);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)sp, key, v) {
    if (json_is_null(v)) continue;
    const char *to = key;
    int ok = 1;
    if (!strcmp(key, "seed")) {
      ok = json_is_integer(v);
    } else if (!strcmp(key, "top_p")) {
      ok = json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 1;
    } else if (!strcmp(key, "temperature")) {
      ok = json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 2;
    } else if (!strcmp(key, "max_completions_tokens")) { /* sic: OpenAI's spelling */
      ok = json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 1000000;
      to = "max_completion_tokens";
    } else if (!strcmp(key, "reasoning_effort")) {
      static const char *const lv[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      const char *s = json_string_value(v);
      ok = 0;
      for (size_t i = 0; s && i < sizeof lv / sizeof *lv; i++) ok |= !strcmp(s, lv[i]);
    } else {
      return dapo_errf(e, DAPO_EINVAL, "%s.sampling_params.%.64s: unknown field", field, key);
    }
    if (!ok)
      return dapo_errf(e, DAPO_EINVAL, "%s.sampling_params.%s: %s", field, key,
                       !strcmp(key, "seed")          ? "expected an integer"
                       : !strcmp(key, "top_p")       ? "expected a number in [0, 1]"
                       : !strcmp(key, "temperature") ? "expected a number in [0, 2]"
                       : !strcmp(key, "reasoning_effort")
                           ? "expected none, minimal, low, medium, high or xhigh"
                           : "expected an integer in [1, 1000000]");
    if (json_object_set(m->extra, to, v)) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  }
  return 0;
}

static int parse_labels(struct gmodel *m, const json_t *spec, const char *field,
                        struct dapo_err *e) {
  const json_t *ls = json_object_get(spec, "labels"), *pl = json_object_get(spec, "passing_labels");
  size_t n = json_array_size(ls);
  if (!json_is_array(ls) || n < 1 || n > GM_MAX_LABELS)
    return dapo_errf(e, DAPO_EINVAL, "%s.labels: required, 1 to %d strings", field, GM_MAX_LABELS);
  m->labels = calloc(n, sizeof *m->labels);
  m->passing = calloc(n, 1);
  if (!m->labels || !m->passing) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const json_t *l = json_array_get(ls, i);
    if (!json_is_string(l) || !json_string_length(l) ||
        json_string_length(l) > GM_MAX_LABEL_BYTES ||
        strlen(json_string_value(l)) != json_string_length(l))
      return dapo_errf(e, DAPO_EINVAL, "%s.labels[%zu]: expected a string of 1 to %d bytes", field,
                       i, GM_MAX_LABEL_BYTES);
    for (int k = 0; k < m->n_labels; k++)
      if (!strcmp(m->labels[k], json_string_value(l)))
        return dapo_errf(e, DAPO_EINVAL, "%s.labels[%zu]: '%.64s' is listed twice", field, i,
                         m->labels[k]);
    if (!(m->labels[m->n_labels] = strdup(json_string_value(l))))
      return dapo_errf(e, DAPO_ENOMEM, "out of memory");
    m->n_labels++;
  }
  if (!json_is_array(pl) || !json_array_size(pl))
    return dapo_errf(e, DAPO_EINVAL, "%s.passing_labels: required, a non-empty subset of labels",
                     field);
  for (size_t i = 0; i < json_array_size(pl); i++) {
    const char *s = json_string_value(json_array_get(pl, i));
    int k = 0;
    while (s && k < m->n_labels && strcmp(m->labels[k], s)) k++;
    if (!s || k == m->n_labels)
      return dapo_errf(e, DAPO_EINVAL, "%s.passing_labels[%zu]: %s%.64s%s is not one of labels",
                       field, i, s ? "'" : "", s ? s : "not a string", s ? "'" : "");
    m->passing[k] = 1;
  }
  return 0;
}

/* The strict json_schema the judge model answers in. */
static json_t *response_format(const struct gmodel *m) {
  json_t *schema;
  if (m->label) {
    json_t *en = json_array();
    for (int i = 0; en && i < m->n_labels; i++)
      json_array_append_new(en, json_string(m->labels[i]));
    schema = en ? json_pack("{s:s, s:{s:{s:s, s:o}}, s:[s], s:b}", "type", "object", "properties",
                            "label", "type", "string", "enum", en, "required", "label",
                            "additionalProperties", 0)
                : NULL;
  } else {
    schema = json_pack(
        "{s:s, s:{s:{s:s}, s:{s:s, s:{s:s, s:{s:{s:s}, s:{s:s}}, s:[s, s], s:b}}}, s:[s, s], s:b}",
        "type", "object", "properties", "result", "type", "number", "steps", "type", "array",
        "items", "type", "object", "properties", "description", "type", "string", "conclusion",
        "type", "string", "required", "description", "conclusion", "additionalProperties", 0,
        "required", "result", "steps", "additionalProperties", 0);
  }
  return schema ? json_pack("{s:s, s:{s:s, s:b, s:o}}", "type", "json_schema", "json_schema",
                            "name", m->label ? "label_model_result" : "score_model_result",
                            "strict", 1, "schema", schema)
                : NULL;
}

/* The judge_models entry named name (NULL: none given): 0 with *entry, or an error under
 * field.key listing the names there are. */
int gmodel_judge_entry(const char *name, const struct judge_policy *pol, const char *field,
                       const char *key, const json_t **entry, struct dapo_err *e) {
  const json_t *models = pol ? pol->judge_models : NULL;
  *entry = name ? json_object_get(models, name) : NULL;
  if (*entry) return 0;
  char list[300] = "";
  size_t n = 0;
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)models, k, x) {
    if (n < sizeof list) n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", k);
  }
  if (!name)
    return dapo_errf(e, DAPO_EINVAL, "%s.%s: required, one of the server's judge_models (%s)",
                     field, key, n ? list : "none configured");
  return dapo_errf(e, DAPO_EINVAL, "%s.%s: '%.64s' is not one of the server's judge_models (%s)",
                   field, key, name,
                   n ? list : "none configured: the server config's judge_models, docs/OPENAI.md");
}

struct gmodel *gmodel_new(const json_t *spec, const char *field, enum gmodel_kind kind,
                          const struct judge_policy *pol, struct dapo_err *e) {
  int label = kind == GM_LABEL;
  static const char *const score_fields[] = {
      "type", "name", "model", "input", "range", "sampling_params", "pass_threshold", NULL};
  static const char *const label_fields[] = {"type",   "name",           "model", "input",
                                             "labels", "passing_labels", NULL};
  struct gmodel *m = calloc(1, sizeof *m);
  if (!m) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field), NULL;
  m->kind = kind;
  m->label = label;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)spec, key, v) {
    int ok = 0;
    for (const char *const *a = label ? label_fields : score_fields; *a && !ok; a++)
      ok = !strcmp(*a, key);
    if (!ok) {
      dapo_errf(e, DAPO_EINVAL, "%s.%.64s: unknown field", field, key);
      goto fail;
    }
  }
  const char *name = json_string_value(json_object_get(spec, "model"));
  const json_t *entry = NULL;
  if (gmodel_judge_entry(name, pol, field, "model", &entry, e)) goto fail;
  struct jm_entry en;
  char ef[160];
  snprintf(ef, sizeof ef, "judge_models.%.64s", name);
  if (read_entry(entry, ef, &en, e)) goto fail;
  if (en.serve && (!pol || !pol->served)) {
    dapo_errf(e, DAPO_EUNSUPPORTED,
              "%s.serve: no completion service here to serve it (dapod train and the "
              "ranks of a multi-process job reach judge models over HTTP only)",
              ef);
    goto fail;
  }
  if (en.serve)
    m->served = pol->served;
  else if (!(m->out = entry_party(&en, ef, pol, e)))
    goto fail;
  m->timeout_ms = en.timeout_ms, m->concurrency = en.concurrency, m->max_retries = en.max_retries;
  if (!(m->judge = strdup(name)) || !(m->model = strdup(en.model))) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto fail;
  }
  if (parse_input(m, json_object_get(spec, "input"), field, e)) goto fail;
  m->lo = 0, m->hi = 1;
  if (!label) {
    const json_t *r = json_object_get(spec, "range");
    if (r && !json_is_null(r)) {
      if (!json_is_array(r) || json_array_size(r) != 2 || !json_is_number(json_array_get(r, 0)) ||
          !json_is_number(json_array_get(r, 1)) ||
          !(json_number_value(json_array_get(r, 0)) < json_number_value(json_array_get(r, 1))) ||
          !(fabs(json_number_value(json_array_get(r, 0))) <= 1e6) ||
          !(fabs(json_number_value(json_array_get(r, 1))) <= 1e6)) {
        dapo_errf(e, DAPO_EINVAL, "%s.range: expected [min, max], numbers with min < max", field);
        goto fail;
      }
      m->lo = json_number_value(json_array_get(r, 0));
      m->hi = json_number_value(json_array_get(r, 1));
    }
    const json_t *pt = json_object_get(spec, "pass_threshold");
    if (pt && !json_is_null(pt) && !json_is_number(pt)) {
      dapo_errf(e, DAPO_EINVAL, "%s.pass_threshold: expected a number", field);
      goto fail;
    }
    if (parse_sampling(m, json_object_get(spec, "sampling_params"), field, e)) goto fail;
  } else {
    if (!(m->extra = json_object())) goto oom;
    if (parse_labels(m, spec, field, e)) goto fail;
  }
  if (kind != GM_RANK && !(m->format = response_format(m))) goto oom;
  return m;
oom:
  dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", field);
fail:
  gmodel_free(m);
  return NULL;
}

const char *gmodel_model(const struct gmodel *m) {
  return m->model;
}

/* ---- grading ---- */

static void add_usage(struct grader_errs *er, const char *model, long p, long c) {
  int k = 0;
  while (k < er->n_usage && strcmp(er->usage[k].model, model)) k++;
  if (k == er->n_usage) {
    if (k == GRADER_MAX_USAGE) {
      k--;
    } else {
      er->n_usage++;
      snprintf(er->usage[k].model, sizeof er->usage[k].model, "%s", model);
    }
  }
  er->usage[k].prompt_tokens += p;
  er->usage[k].completion_tokens += c;
}

static long usage_of(const json_t *u, const char *key) {
  const json_t *v = json_object_get(u, key);
  return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1L << 40)
             ? (long)json_integer_value(v)
             : 0;
}

/* The answer in a 2xx reply body: its message's content parsed as JSON (new reference), or
 * NULL with *kind the error (a refusal, no chat completion, content that is not JSON). */
static json_t *read_reply(const struct gmodel *m, const char *body, size_t len,
                          struct grader_errs *er, enum grader_err *kind) {
  json_t *root = json_loadb(body, len, 0, NULL), *ans = NULL;
  const json_t *msg =
      json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message");
  if (json_is_object(json_object_get(root, "usage"))) {
    const json_t *u = json_object_get(root, "usage");
    add_usage(er, m->model, usage_of(u, "prompt_tokens"), usage_of(u, "completion_tokens"));
  }
  if (!json_is_object(msg)) {
    *kind = GE_MODEL_SERVER;
    if (!er->model_detail[0])
      snprintf(er->model_detail, sizeof er->model_detail,
               "judge model '%.64s': the reply is not a chat completion", m->judge);
  } else if (json_object_get(msg, "refusal") && !json_is_null(json_object_get(msg, "refusal"))) {
    *kind = GE_MODEL_REFUSAL;
  } else {
    const json_t *content = json_object_get(msg, "content");
    ans = json_is_string(content)
              ? json_loadb(json_string_value(content), json_string_length(content), 0, NULL)
              : NULL;
    *kind = ans ? GE_COUNT : GE_MODEL_PARSE;
  }
  json_decref(root);
  return ans;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* A call of a judge model dapod serves: the completion service's answer to body, retried with
 * backoff while it is busy (429, 503) or fails (5xx); otherwise as ask(). -1 out of memory. */
static int ask_served(const struct gmodel *m, const json_t *body, json_t **ans,
                      struct grader_errs *er) {
  enum grader_err kind = GE_MODEL_SERVER;
  char why[300] = "";
  int attempts = 0;
  for (;;) {
    int status = 0;
    attempts++;
    json_t *reply =
        m->served->chat(m->served->ctx, m->model, body, m->timeout_ms, &status, why, sizeof why);
    if (reply && status >= 200 && status < 300) {
      char *text = json_dumps(reply, JSON_COMPACT);
      json_decref(reply);
      if (!text) return -1;
      *ans = read_reply(m, text, strlen(text), er, &kind);
      free(text);
      break;
    }
    if (reply) {
      const char *msg =
          json_string_value(json_object_get(json_object_get(reply, "error"), "message"));
      snprintf(why, sizeof why, "HTTP %d: %.200s", status, msg ? msg : "");
      json_decref(reply);
    }
    int retry = status == 429 || status >= 500; /* no reply: out of memory or stopping */
    if (!retry || attempts > m->max_retries) break;
    sleep_ms(outside_backoff_ms(attempts));
  }
  if (kind == GE_MODEL_SERVER && !er->model_detail[0])
    snprintf(er->model_detail, sizeof er->model_detail,
             "judge model '%.64s' (served): %.120s after %d attempt%s", m->judge,
             why[0] ? why : "no answer", attempts, attempts == 1 ? "" : "s");
  if (kind != GE_COUNT) er->n[kind]++;
  return 0;
}

/* One call of the judge model: m's messages rendered against root ({"item", "sample"}), the
 * answer in format, retried with backoff. Returns 0 with *ans the answer parsed (NULL when there
 * is none: the error is then counted in er); -1 out of memory. */
static int ask(const struct gmodel *m, const json_t *root, const json_t *format, json_t **ans,
               struct grader_errs *er) {
  *ans = NULL;
  json_t *msgs = json_array();
  if (!msgs) return -1;
  for (int i = 0; i < m->n_msg; i++) {
    char *text = NULL, bad[128];
    int rc = grader_render(m->tmpl[i], root, &text, bad, sizeof bad);
    if (rc == 1) {
      er->n[GE_INVALID_VARIABLE]++;
      json_decref(msgs);
      return 0;
    }
    json_t *t = rc ? NULL : judge_json_string(text);
    free(text);
    if (!t ||
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", m->role[i], "content", t))) {
      json_decref(msgs);
      return -1;
    }
  }
  json_t *body =
      json_pack("{s:s, s:o, s:O}", "model", m->model, "messages", msgs, "response_format", format);
  if (body) json_object_update(body, m->extra);
  if (body && m->served) {
    add_usage(er, m->model, 0, 0);
    int rc = ask_served(m, body, ans, er);
    json_decref(body);
    return rc;
  }
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) return -1;
  add_usage(er, m->model, 0, 0); /* sampled_model_name, even when no reply comes */
  struct outside_xfer x = {0};
  char what[200] = "";
  enum grader_err kind = GE_MODEL_SERVER;
  int attempts = 0, oom = 0;
  for (;;) {
    CURL *c = outside_post(m->out, &x, text, strlen(text), m->timeout_ms, NULL);
    if (!c) {
      oom = 1;
      break;
    }
    attempts++;
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    int retry = 0;
    enum outside_outcome o =
        outside_classify(c, cc, &x, m->timeout_ms, &status, &retry, what, sizeof what);
    curl_easy_cleanup(c);
    if (o == OUT_OK) {
      *ans = read_reply(m, x.reply, x.reply_n, er, &kind);
      break;
    }
    if (!retry || attempts > m->max_retries) break;
    sleep_ms(outside_backoff_ms(attempts));
  }
  if (!oom && kind == GE_MODEL_SERVER && !er->model_detail[0] && what[0])
    snprintf(er->model_detail, sizeof er->model_detail,
             "judge model '%.64s': %.120s after %d attempt%s", m->judge, what, attempts,
             attempts == 1 ? "" : "s");
  if (!oom && kind != GE_COUNT) er->n[kind]++;
  outside_xfer_free(&x);
  free(text);
  return oom ? -1 : 0;
}

static double clamp(const struct gmodel *m, double x) {
  return x < m->lo ? m->lo : x > m->hi ? m->hi : x;
}

/* Grades one sample (root {"item", "sample"}) into *score; -1 out of memory. */
static int grade_one(const struct gmodel *m, const json_t *root, double *score,
                     struct grader_errs *er) {
  json_t *ans = NULL;
  *score = 0;
  if (ask(m, root, m->format, &ans, er)) return -1;
  if (!ans) return 0;
  int ok = 0;
  if (!m->label) {
    const json_t *r = json_object_get(ans, "result");
    if ((ok = json_is_number(r) && isfinite(json_number_value(r))))
      *score = clamp(m, json_number_value(r));
  } else {
    const char *l = json_string_value(json_object_get(ans, "label"));
    for (int k = 0; l && k < m->n_labels && !ok; k++)
      if ((ok = !strcmp(l, m->labels[k]))) *score = m->passing[k];
  }
  if (!ok) er->n[GE_MODEL_PARSE]++;
  json_decref(ans);
  return 0;
}

/* The strict json_schema of a ranking of n responses: {"scores": [n numbers]}. */
static json_t *rank_format(int n) {
  return json_pack("{s:s, s:{s:s, s:b, s:{s:s, s:{s:{s:s, s:{s:s}, s:i, s:i}}, s:[s], s:b}}}",
                   "type", "json_schema", "json_schema", "name", "model_rank_result", "strict", 1,
                   "schema", "type", "object", "properties", "scores", "type", "array", "items",
                   "type", "number", "minItems", n, "maxItems", n, "required", "scores",
                   "additionalProperties", 0);
}

/* Ranks one group (root {"item", "sample": {"responses", "count": n}}) into scores[0..n) and
 * er[0..n) (the call's errors counted for each of the n samples, its tokens with the first);
 * -1 out of memory. */
static int rank_one(const struct gmodel *m, const json_t *root, int n, double *scores,
                    struct grader_errs *er) {
  json_t *format = rank_format(n), *ans = NULL;
  for (int i = 0; i < n; i++) scores[i] = 0;
  if (!format || ask(m, root, format, &ans, &er[0])) {
    json_decref(format);
    return -1;
  }
  json_decref(format);
  const json_t *a = json_object_get(ans, "scores");
  int ok = json_is_array(a) && json_array_size(a) == (size_t)n;
  for (int i = 0; ok && i < n; i++)
    ok = json_is_number(json_array_get(a, i)) && isfinite(json_number_value(json_array_get(a, i)));
  for (int i = 0; ok && i < n; i++) scores[i] = clamp(m, json_number_value(json_array_get(a, i)));
  if (ans && !ok) er[0].n[GE_MODEL_PARSE]++;
  json_decref(ans);
  for (int i = 1; i < n; i++) { /* what the call hit, each sample of the group hit */
    memcpy(er[i].n, er[0].n, sizeof er[i].n);
    memcpy(er[i].model_detail, er[0].model_detail, sizeof er[i].model_detail);
  }
  return 0;
}

/* The calls of a gmodel_grade or gmodel_rank, handed out to up to concurrency threads. */
struct gm_pool {
  const struct gmodel *m;
  json_t *const *roots;
  const int *first, *count; /* rank: group g's samples are first[g] .. first[g] + count[g] */
  double *scores;
  struct grader_errs *errs;
  int n, next, oom;
};

static void *gm_worker(void *arg) {
  struct gm_pool *p = arg;
  for (;;) {
    int i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
    if (i >= p->n) break;
    int rc = p->count ? rank_one(p->m, p->roots[i], p->count[i], p->scores + p->first[i],
                                 p->errs + p->first[i])
                      : grade_one(p->m, p->roots[i], &p->scores[i], &p->errs[i]);
    if (rc) __atomic_store_n(&p->oom, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static int gm_run(struct gm_pool *p) {
  int nt = p->m->concurrency < p->n ? p->m->concurrency : p->n;
  pthread_t th[256];
  int started = 0;
  for (int k = 1; k < nt; k++) {
    if (pthread_create(&th[started], NULL, gm_worker, p)) break;
    started++;
  }
  gm_worker(p);
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  return p->oom ? DAPO_ENOMEM : 0;
}

int gmodel_grade(const struct gmodel *m, json_t *const *roots, int n, double *scores,
                 struct grader_errs *errs) {
  struct gm_pool p = {.m = m, .roots = roots, .scores = scores, .errs = errs, .n = n};
  return gm_run(&p);
}

int gmodel_rank(const struct gmodel *m, json_t *const *roots, const int *first, const int *count,
                int n_groups, double *scores, struct grader_errs *errs) {
  struct gm_pool p = {.m = m,
                      .roots = roots,
                      .first = first,
                      .count = count,
                      .scores = scores,
                      .errs = errs,
                      .n = n_groups};
  return gm_run(&p);
}
