/* Chat templates (chat.h): a small fixed set of families rendered from format strings, and the
 * recognition of a model's Jinja chat_template as one of them. */
#include "chat.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

enum role { R_SYSTEM, R_USER, R_ASSISTANT, N_ROLES, R_TOOL = N_ROLES };
static const char *const role_names[N_ROLES + 1] = {"system", "user", "assistant", "tool"};

/* How a family renders tools, calls and their answers: not at all, as Qwen2.5's template
 * (ChatML), as Qwen3's, or as Llama 3.1's and 3.2's (the dated header). */
enum tools_style { TS_NONE = 0, TS_QWEN25, TS_QWEN3, TS_LLAMA };

struct chat_template {
  char family[16];     /* "chatml", "qwen3", "llama3", "llama3.2", "custom" */
  char *prefix;        /* emitted first ("" when none) */
  char *fmt[N_ROLES];  /* per-role format with {role} {content}; NULL: role not allowed */
  char *default_sys;   /* rendered with fmt[R_SYSTEM] when messages[0] is not system; or NULL */
  char *gen_prompt;    /* appended after the last message */
  char *stop;          /* end-of-turn text; NULL: none */
  char *date_string;   /* llama3.2: "Today Date: ..." */
  int trim;            /* content | trim (Python str.strip()) */
  int qwen3_think;     /* assistant turns lose their <think> reasoning (Qwen3) */
  int llama32_header;  /* the dated system header of Llama 3.2 */
  int enable_thinking; /* qwen3: -1 undefined, 0 false (empty think block after the prompt) */
  enum tools_style tools;
};

/* ---- a growable string ---------------------------------------------------------------------- */

struct sb {
  char *p;
  size_t n, cap;
  int oom;
};

static void sb_add(struct sb *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static void sb_str(struct sb *b, const char *s) {
  sb_add(b, s, strlen(s));
}

/* ---- Python's str.strip() and friends -------------------------------------------------------- */

/* Length of the whitespace character at s (as Python's str.isspace() sees it), or 0. */
static size_t space_len(const unsigned char *s, const unsigned char *end) {
  if (s >= end) return 0;
  if ((*s >= 0x09 && *s <= 0x0d) || (*s >= 0x1c && *s <= 0x20)) return 1;
  if (end - s >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
  if (end - s < 3) return 0;
  unsigned cp = ((unsigned)(s[0] & 0x0f) << 12) | ((unsigned)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
  if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
      cp == 0x202f || cp == 0x205f || cp == 0x3000)
    return 3;
  return 0;
}

/* Trims Unicode whitespace on both ends of [*s, *s + *n). */
static void py_strip(const char **s, size_t *n) {
  const unsigned char *b = (const unsigned char *)*s, *e = b + *n;
  for (size_t k; (k = space_len(b, e));) b += k;
  for (;;) { /* the last character: find its start (at most 3 bytes back) */
    const unsigned char *c = e;
    while (c > b && (c[-1] & 0xc0) == 0x80 && e - c < 3) c--;
    if (c > b) c--;
    if (c < e && space_len(c, e) == (size_t)(e - c))
      e = c;
    else
      break;
  }
  *s = (const char *)b;
  *n = (size_t)(e - b);
}

static void strip_nl(const char **s, size_t *n, int left, int right) {
  while (left && *n && **s == '\n') (*s)++, (*n)--;
  while (right && *n && (*s)[*n - 1] == '\n') (*n)--;
}

/* ---- formats ----------------------------------------------------------------------------------
 */

/* Checks a format: only {content}, {role}, {{ and }}. field names it in errors. */
static int check_fmt(const char *f, const char *field, struct dapo_err *e) {
  for (const char *p = f; *p; p++) {
    if (*p == '{') {
      if (p[1] == '{') {
        p++;
        continue;
      }
      if (!strncmp(p, "{content}", 9)) {
        p += 8;
        continue;
      }
      if (!strncmp(p, "{role}", 6)) {
        p += 5;
        continue;
      }
      return dapo_errf(e, DAPO_EINVAL,
                       "%s: unknown placeholder at \"%.20s\" (use {content}, {role}, and {{ }} "
                       "for literal braces)",
                       field, p);
    }
    if (*p == '}') {
      if (p[1] == '}') {
        p++;
        continue;
      }
      return dapo_errf(e, DAPO_EINVAL, "%s: a lone '}' (write }} for a literal brace)", field);
    }
  }
  return 0;
}

static void expand(struct sb *b, const char *f, const char *role, const char *content,
                   size_t content_len) {
  for (const char *p = f; *p; p++) {
    if (*p == '{' && p[1] == '{') {
      sb_add(b, "{", 1);
      p++;
    } else if (*p == '}' && p[1] == '}') {
      sb_add(b, "}", 1);
      p++;
    } else if (!strncmp(p, "{content}", 9)) {
      sb_add(b, content, content_len);
      p += 8;
    } else if (!strncmp(p, "{role}", 6)) {
      sb_str(b, role);
      p += 5;
    } else {
      sb_add(b, p, 1);
    }
  }
}

/* ---- building ----------------------------------------------------------------------------------
 */

void chat_free(struct chat_template *t) {
  if (!t) return;
  free(t->prefix);
  for (int r = 0; r < N_ROLES; r++) free(t->fmt[r]);
  free(t->default_sys);
  free(t->gen_prompt);
  free(t->stop);
  free(t->date_string);
  free(t);
}

/* A family's template; bos is the BOS text for the llama families (NULL: "<|begin_of_text|>"). */
static struct chat_template *family_new(const char *name, const char *bos, struct dapo_err *e) {
  struct chat_template *t = calloc(1, sizeof *t);
  if (!t) return dapo_errf(e, DAPO_ENOMEM, "out of memory"), NULL;
  t->enable_thinking = -1;
  int ok = 1;
  if (!strcmp(name, "chatml") || !strcmp(name, "qwen3")) {
    for (int r = 0; r < N_ROLES; r++)
      ok &= !!(t->fmt[r] = strdup("<|im_start|>{role}\n{content}<|im_end|>\n"));
    ok &= !!(t->prefix = strdup("")) && !!(t->gen_prompt = strdup("<|im_start|>assistant\n")) &&
          !!(t->stop = strdup("<|im_end|>"));
    t->qwen3_think = !strcmp(name, "qwen3");
    t->tools = t->qwen3_think ? TS_QWEN3 : TS_QWEN25;
  } else if (!strcmp(name, "llama3") || !strcmp(name, "llama3.2")) {
    for (int r = 0; r < N_ROLES; r++)
      ok &= !!(t->fmt[r] =
                   strdup("<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"));
    ok &= !!(t->prefix = strdup(bos ? bos : "<|begin_of_text|>")) &&
          !!(t->gen_prompt = strdup("<|start_header_id|>assistant<|end_header_id|>\n\n")) &&
          !!(t->stop = strdup("<|eot_id|>"));
    t->trim = 1;
    if (!strcmp(name, "llama3.2")) {
      t->llama32_header = 1;
      t->tools = TS_LLAMA;
      ok &= !!(t->date_string = strdup("26 Jul 2024"));
    }
  } else {
    free(t);
    return dapo_errf(e, DAPO_EINVAL,
                     "chat_template: unknown family '%.40s' (families: chatml, qwen3, llama3, "
                     "llama3.2; or \"auto\", or a template object)",
                     name),
           NULL;
  }
  snprintf(t->family, sizeof t->family, "%s", name);
  if (!ok) {
    chat_free(t);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory"), NULL;
  }
  return t;
}

/* Undoes the Jinja string-literal escapes of [s, s + n) (\n, \t, \', \", \\). */
static char *unescape_jinja(const char *s, size_t n) {
  char *o = malloc(n + 1), *q = o;
  if (!o) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\\' && i + 1 < n) {
      char c = s[++i];
      *q++ = c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      *q++ = s[i];
    }
  }
  *q = '\0';
  return o;
}

/* The default system message a ChatML template writes as a literal, e.g.
 * '<|im_start|>system\nYou are Qwen, ...<|im_end|>\n' (in the template's source the newline is
 * the two characters \n or a newline). NULL when there is none. *oom set when out of memory. */
static char *chatml_default_system(const char *tpl, int *oom) {
  static const char open[] = "<|im_start|>system";
  for (const char *p = strstr(tpl, open); p; p = strstr(p + 1, open)) {
    const char *s = p + sizeof open - 1, *end;
    if (s[0] == '\\' && s[1] == 'n')
      s += 2;
    else if (s[0] == '\n')
      s++;
    else
      continue;
    if (!(end = strstr(s, "<|im_end|>"))) return NULL;
    if (end == s || strcspn(s, "'\"{}+") < (size_t)(end - s)) continue; /* not a literal */
    char *r = unescape_jinja(s, (size_t)(end - s));
    if (!r) *oom = 1;
    return r;
  }
  return NULL;
}

/* A token's text in tokenizer_config.json: a string or {"content": "..."}. */
static const char *token_text(const json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_string_value(v);
}

static struct chat_template *from_tokenizer_config(const json_t *cfg, struct dapo_err *e) {
  if (!cfg || json_is_null(cfg))
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "chat_template: the model has no tokenizer_config.json, so no chat template; "
                     "name a family (chatml, qwen3, llama3, llama3.2) or give a template object"),
           NULL;
  const json_t *ct = json_object_get(cfg, "chat_template");
  if (json_is_array(ct)) { /* [{"name": "default", "template": "..."}, ...] */
    const json_t *found = NULL;
    size_t i;
    json_t *v;
    json_array_foreach(ct, i, v) if (!strcmp(json_string_value(json_object_get(v, "name"))
                                                 ? json_string_value(json_object_get(v, "name"))
                                                 : "",
                                             "default")) found = json_object_get(v, "template");
    ct = found;
  }
  const char *tpl = json_string_value(ct);
  if (!tpl)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "chat_template: the model's tokenizer_config.json has no chat_template; name "
                     "a family (chatml, qwen3, llama3, llama3.2) or give a template object"),
           NULL;
  const char *fam = NULL;
  if (strstr(tpl, "<|im_start|>") && strstr(tpl, "<|im_end|>") &&
      strstr(tpl, "add_generation_prompt") &&
      (strstr(tpl, "<|im_start|>assistant\\n") || strstr(tpl, "<|im_start|>assistant\n")))
    fam = strstr(tpl, "<think>") && strstr(tpl, "reasoning_content") ? "qwen3" : "chatml";
  else if (strstr(tpl, "<|start_header_id|>") && strstr(tpl, "<|eot_id|>") &&
           strstr(tpl, "<|end_header_id|>") && strstr(tpl, "bos_token"))
    fam = strstr(tpl, "Cutting Knowledge Date") ? "llama3.2" : "llama3";
  if (!fam)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "chat_template: the model's chat_template (tokenizer_config.json) is not one "
                     "of the understood families (ChatML: Qwen2/2.5/3, SmolLM2; Llama 3, 3.1, "
                     "3.2); name a family or give a template object in the job"),
           NULL;
  if (!strcmp(fam, "llama3.2") && !strstr(tpl, "Today Date: "))
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "chat_template: a Llama 3 template with an unfamiliar system header; give "
                     "a template object in the job"),
           NULL;
  struct chat_template *t = family_new(fam, token_text(json_object_get(cfg, "bos_token")), e);
  if (t && !strcmp(fam, "chatml")) {
    int oom = 0;
    t->default_sys = chatml_default_system(tpl, &oom);
    if (oom) {
      chat_free(t);
      return dapo_errf(e, DAPO_ENOMEM, "out of memory"), NULL;
    }
  }
  return t;
}

/* A string member of o into *dst (owned copy); absent or null leaves *dst. Checks formats. */
static int take_str(const json_t *o, const char *key, char **dst, int is_fmt, struct dapo_err *e) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  char field[64];
  snprintf(field, sizeof field, "chat_template.%s", key);
  if (!json_is_string(v)) return dapo_errf(e, DAPO_EINVAL, "%s: expected a string", field);
  const char *s = json_string_value(v);
  if (strlen(s) > 4096) return dapo_errf(e, DAPO_EINVAL, "%s: longer than 4096 bytes", field);
  if (is_fmt && check_fmt(s, field, e)) return e ? e->code : DAPO_EINVAL;
  char *c = strdup(s);
  if (!c) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  free(*dst);
  *dst = c;
  return 0;
}

static struct chat_template *from_object(const json_t *o, const json_t *cfg, struct dapo_err *e) {
  static const char *const known[] = {
      "family",         "system", "user",        "assistant",      "prefix", "generation_prompt",
      "default_system", "stop",   "date_string", "enable_thinking"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok) return dapo_errf(e, DAPO_EINVAL, "chat_template.%.60s: unknown field", key), NULL;
  }
  const json_t *jf = json_object_get(o, "family");
  struct chat_template *t = NULL;
  if (jf && !json_is_null(jf)) {
    if (!json_is_string(jf))
      return dapo_errf(e, DAPO_EINVAL, "chat_template.family: expected a string"), NULL;
    for (size_t i = 1; i < 8; i++)
      if (json_object_get(o, known[i]) && i != 6 && i != 7)
        return dapo_errf(e, DAPO_EINVAL,
                         "chat_template.%s: not with a family (a family takes default_system, "
                         "date_string and enable_thinking)",
                         known[i]),
               NULL;
    t = family_new(json_string_value(jf),
                   token_text(cfg ? json_object_get(cfg, "bos_token") : NULL), e);
    if (!t) return NULL;
    const json_t *ds = json_object_get(o, "date_string");
    if (ds && !t->llama32_header) {
      chat_free(t);
      return dapo_errf(e, DAPO_EINVAL, "chat_template.date_string: only for family llama3.2"), NULL;
    }
    const json_t *th = json_object_get(o, "enable_thinking");
    if (th && !json_is_null(th)) {
      if (!t->qwen3_think || !json_is_boolean(th)) {
        chat_free(t);
        return dapo_errf(e, DAPO_EINVAL,
                         "chat_template.enable_thinking: a boolean, only for family qwen3"),
               NULL;
      }
      t->enable_thinking = json_is_true(th);
    }
    if (json_object_get(o, "default_system") && strcmp(t->family, "chatml") &&
        strcmp(t->family, "qwen3")) {
      chat_free(t);
      return dapo_errf(e, DAPO_EINVAL,
                       "chat_template.default_system: only for the ChatML families or a template "
                       "object"),
             NULL;
    }
    if (take_str(o, "default_system", &t->default_sys, 0, e) ||
        take_str(o, "date_string", &t->date_string, 0, e)) {
      chat_free(t);
      return NULL;
    }
    return t;
  }
  if (json_object_get(o, "date_string") || json_object_get(o, "enable_thinking"))
    return dapo_errf(e, DAPO_EINVAL,
                     "chat_template: date_string and enable_thinking go with a family"),
           NULL;
  if (!(t = calloc(1, sizeof *t))) return dapo_errf(e, DAPO_ENOMEM, "out of memory"), NULL;
  snprintf(t->family, sizeof t->family, "custom");
  t->enable_thinking = -1;
  if (take_str(o, "system", &t->fmt[R_SYSTEM], 1, e) ||
      take_str(o, "user", &t->fmt[R_USER], 1, e) ||
      take_str(o, "assistant", &t->fmt[R_ASSISTANT], 1, e) ||
      take_str(o, "prefix", &t->prefix, 0, e) ||
      take_str(o, "generation_prompt", &t->gen_prompt, 0, e) ||
      take_str(o, "default_system", &t->default_sys, 0, e) || take_str(o, "stop", &t->stop, 0, e)) {
    chat_free(t);
    return NULL;
  }
  if (!t->fmt[R_USER]) {
    chat_free(t);
    return dapo_errf(e, DAPO_EINVAL,
                     "chat_template.user: required (a format with {content}, e.g. "
                     "\"User: {content}\\n\")"),
           NULL;
  }
  if (t->default_sys && !t->fmt[R_SYSTEM]) {
    chat_free(t);
    return dapo_errf(e, DAPO_EINVAL, "chat_template.default_system: needs chat_template.system"),
           NULL;
  }
  if (t->stop && !*t->stop) {
    chat_free(t);
    return dapo_errf(e, DAPO_EINVAL, "chat_template.stop: must not be empty"), NULL;
  }
  if ((!t->prefix && !(t->prefix = strdup(""))) ||
      (!t->gen_prompt && !(t->gen_prompt = strdup("")))) {
    chat_free(t);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory"), NULL;
  }
  return t;
}

struct chat_template *chat_from_spec(const json_t *spec, const json_t *tokenizer_config,
                                     struct dapo_err *e) {
  if (!spec || json_is_null(spec) ||
      (json_is_string(spec) && !strcmp(json_string_value(spec), "auto")))
    return from_tokenizer_config(tokenizer_config, e);
  if (json_is_string(spec))
    return family_new(
        json_string_value(spec),
        token_text(tokenizer_config ? json_object_get(tokenizer_config, "bos_token") : NULL), e);
  if (json_is_object(spec)) return from_object(spec, tokenizer_config, e);
  return dapo_errf(e, DAPO_EINVAL,
                   "chat_template: expected \"auto\", a family name or a template object"),
         NULL;
}

const char *chat_family(const struct chat_template *t) {
  return t->family;
}

const char *chat_stop_text(const struct chat_template *t) {
  return t->stop;
}

static json_t *str_or_null(const char *s) {
  return s ? json_string(s) : json_null();
}

json_t *chat_to_json(const struct chat_template *t) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "family", json_string(t->family));
  if (!strcmp(t->family, "custom")) {
    for (int r = 0; r < N_ROLES; r++) json_object_set_new(o, role_names[r], str_or_null(t->fmt[r]));
    json_object_set_new(o, "prefix", str_or_null(t->prefix));
    json_object_set_new(o, "generation_prompt", str_or_null(t->gen_prompt));
    json_object_set_new(o, "stop", str_or_null(t->stop));
  }
  json_object_set_new(o, "default_system", str_or_null(t->default_sys));
  if (t->llama32_header) json_object_set_new(o, "date_string", str_or_null(t->date_string));
  if (t->qwen3_think && t->enable_thinking >= 0)
    json_object_set_new(o, "enable_thinking", json_boolean(t->enable_thinking));
  return o;
}

/* ---- rendering ----------------------------------------------------------------------------- */

static int role_of(const char *s) {
  for (int r = 0; r <= R_TOOL; r++)
    if (!strcmp(s, role_names[r])) return r;
  return -1;
}

static int starts_with(const char *s, const char *p) {
  return !strncmp(s, p, strlen(p));
}

static int ends_with(const char *s, const char *p) {
  size_t n = strlen(s), k = strlen(p);
  return n >= k && !strcmp(s + n - k, p);
}

/* Qwen3's assistant turn up to its tool calls: reasoning before </think> is dropped (index <=
 * last query) or kept in a <think> block (after it). *after: the content after the reasoning
 * (what the template's `content` holds). */
static void qwen3_assistant(struct sb *b, const char *content, int after_last_query,
                            const char **after) {
  const char *c = content, *reason = "";
  size_t cn = strlen(content), rn = 0;
  const char *close = strstr(content, "</think>");
  if (close) {
    const char *last = close;
    for (const char *p; (p = strstr(last + 1, "</think>"));) last = p;
    c = last + 8;
    cn = strlen(c);
    strip_nl(&c, &cn, 1, 0);
    /* reasoning: content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
    const char *r = content;
    rn = (size_t)(close - content);
    strip_nl(&r, &rn, 0, 1);
    for (const char *p = r; (p = memmem(p, rn - (size_t)(p - r), "<think>", 7)); p++) {
      rn -= (size_t)(p + 7 - r);
      r = p + 7;
      p = r - 1;
    }
    strip_nl(&r, &rn, 1, 0);
    reason = r;
  }
  *after = c;
  sb_str(b, "<|im_start|>assistant\n");
  if (after_last_query && rn) {
    const char *r = reason;
    size_t n = rn;
    strip_nl(&r, &n, 1, 1);
    sb_str(b, "<think>\n");
    sb_add(b, r, n);
    sb_str(b, "\n</think>\n\n");
    strip_nl(&c, &cn, 1, 0);
  }
  sb_add(b, c, cn);
}

/* JSON as the templates' tojson writes it. */
static void sb_json(struct sb *b, const json_t *v, int indent) {
  char *s = pyjson_dumps(v, indent);
  if (!s) {
    b->oom = 1;
    return;
  }
  sb_str(b, s);
  free(s);
}

/* A tool call of an assistant message: OpenAI's {"type": "function", "function": {"name",
 * "arguments"}} or Hugging Face's {"name", "arguments"}; arguments an object, or (OpenAI's)
 * the JSON text of one, read into *parsed (owned; the caller frees it). 0, or -1 with why. */
static int call_of(const json_t *tc, const char **name, const json_t **args, json_t **parsed,
                   const char **why) {
  const json_t *fn = json_object_get(tc, "function");
  if (!json_is_object(fn)) fn = tc;
  *name = json_string_value(json_object_get(fn, "name"));
  *args = json_object_get(fn, "arguments");
  *parsed = NULL;
  if (!json_is_object(tc) || !*name)
    return *why = "expected {\"function\": {\"name\", \"arguments\"}}", -1;
  if (json_is_string(*args)) {
    *parsed = json_loads(json_string_value(*args), JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(*parsed)) {
      json_decref(*parsed);
      *parsed = NULL;
      return *why = "arguments: expected a JSON object, or the JSON text of one", -1;
    }
    *args = *parsed;
  } else if (!*args || json_is_null(*args)) {
    *args = *parsed = json_object();
  } else if (!json_is_object(*args)) {
    return *why = "arguments: expected a JSON object, or the JSON text of one", -1;
  }
  return 0;
}

/* Checks that messages[i] (an assistant's) calls tools in a form t renders; 0, or an error. */
static int check_calls(const struct chat_template *t, const json_t *calls, size_t i,
                       struct dapo_err *e) {
  if (t->tools == TS_NONE)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "messages[%zu].tool_calls: the %s chat template renders no tool calls "
                     "(families that do: chatml, qwen3, llama3.2)",
                     i, t->family);
  if (!json_is_array(calls))
    return dapo_errf(e, DAPO_EINVAL, "messages[%zu].tool_calls: expected an array", i);
  if (t->tools == TS_LLAMA && json_array_size(calls) != 1)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "messages[%zu].tool_calls: Llama 3.1 and 3.2 make one call a turn", i);
  for (size_t k = 0; k < json_array_size(calls); k++) {
    const char *name, *why;
    const json_t *args;
    json_t *parsed;
    int rc = call_of(json_array_get(calls, k), &name, &args, &parsed, &why);
    json_decref(parsed);
    if (rc) return dapo_errf(e, DAPO_EINVAL, "messages[%zu].tool_calls[%zu]: %s", i, k, why);
  }
  return 0;
}

/* An assistant message's calls as the family writes them, after its content. */
static void render_calls(struct sb *b, const struct chat_template *t, const json_t *calls,
                         int content_first) {
  for (size_t k = 0; k < json_array_size(calls); k++) {
    const char *name, *why;
    const json_t *args;
    json_t *parsed;
    if (call_of(json_array_get(calls, k), &name, &args, &parsed, &why)) continue;
    if (t->tools == TS_LLAMA) {
      sb_str(b, "{\"name\": \"");
      sb_str(b, name);
      sb_str(b, "\", \"parameters\": ");
      sb_json(b, args, -1);
      sb_str(b, "}");
    } else {
      /* Qwen2.5 writes "\n" before every call; Qwen3 between calls and after content */
      if (t->tools == TS_QWEN25 || k > 0 || content_first) sb_str(b, "\n");
      sb_str(b, "<tool_call>\n{\"name\": \"");
      sb_str(b, name);
      sb_str(b, "\", \"arguments\": ");
      sb_json(b, args, -1); /* JSON text is written as the object it holds (chat.h) */
      sb_str(b, "}\n</tool_call>");
    }
    json_decref(parsed);
  }
}

static const char QWEN_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char QWEN_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
static const char LLAMA_TOOLS_HEAD[] =
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond "
    "with a JSON for a function call with its proper arguments that best answers the given "
    "prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.Do not use variables.\n\n";

/* A tool's answer: Qwen's <tool_response> (consecutive answers in one user turn), or Llama's
 * ipython turn holding the content as a JSON string. */
static void render_tool(struct sb *b, const struct chat_template *t, const char *content,
                        int first_of_run, int last_of_run) {
  if (t->tools == TS_LLAMA) {
    json_t *s = json_string(content);
    sb_str(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
    if (s)
      sb_json(b, s, -1);
    else
      b->oom = 1;
    json_decref(s);
    sb_str(b, "<|eot_id|>");
    return;
  }
  if (first_of_run) sb_str(b, "<|im_start|>user");
  sb_str(b, "\n<tool_response>\n");
  sb_str(b, content);
  sb_str(b, "\n</tool_response>");
  if (last_of_run) sb_str(b, "<|im_end|>\n");
}

/* A message's tool_calls; null and [] are none. */
static const json_t *calls_of(const json_t *m) {
  const json_t *c = json_object_get(m, "tool_calls");
  return !c || json_is_null(c) || (json_is_array(c) && json_array_size(c) == 0) ? NULL : c;
}

/* b ends where the model's turn starts (the generation prompt, when gen), into *out. */
static int end_prompt(const struct chat_template *t, struct sb *b, int gen, char **out,
                      struct dapo_err *e) {
  if (gen) sb_str(b, t->gen_prompt ? t->gen_prompt : "");
  if (gen && t->qwen3_think && t->enable_thinking == 0) sb_str(b, "<think>\n\n</think>\n\n");
  if (b->oom || !b->p) {
    free(b->p);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory rendering the chat prompt");
  }
  *out = b->p;
  return 0;
}

static const char *role_at(const json_t *messages, size_t i) {
  return json_string_value(json_object_get(json_array_get(messages, i), "role"));
}

int chat_render_tools(const struct chat_template *t, const json_t *messages, const json_t *tools,
                      int add_generation_prompt, char **out, struct dapo_err *e) {
  *out = NULL;
  size_t n = json_array_size(messages);
  if (!json_is_array(messages) || n == 0)
    return dapo_errf(e, DAPO_EINVAL, "messages: expected a non-empty array");
  if (tools && json_is_null(tools)) tools = NULL;
  if (tools && (!json_is_array(tools) || json_array_size(tools) == 0)) tools = NULL;
  if (tools && t->tools == TS_NONE)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "tools: the %s chat template renders no tools (families that do: chatml, "
                     "qwen3, llama3.2; other models take tools in the dapod call format, which "
                     "is not rendered in the prompt)",
                     t->family);
  for (size_t k = 0; tools && k < json_array_size(tools); k++)
    if (!json_is_object(json_array_get(tools, k)))
      return dapo_errf(e, DAPO_EINVAL, "tools[%zu]: expected a tool object", k);
  int last_query = -1;
  for (size_t i = 0; i < n; i++) {
    const json_t *m = json_array_get(messages, i), *calls = calls_of(m);
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *cj = json_object_get(m, "content");
    int r = role ? role_of(role) : -1;
    if (!role || !(json_is_string(cj) || (r == R_ASSISTANT && calls && json_is_null(cj))))
      return dapo_errf(e, DAPO_EINVAL, "messages[%zu]: needs string role and content", i);
    if (r < 0 || (r == R_TOOL ? t->tools == TS_NONE : !t->fmt[r]))
      return dapo_errf(e, DAPO_EUNSUPPORTED,
                       "messages[%zu].role: '%.20s' is not rendered by the %s chat template "
                       "(roles: system, user, assistant%s%s)",
                       i, role, t->family, t->tools != TS_NONE ? ", tool" : "",
                       strcmp(t->family, "custom") ? "" : ", as the template object defines");
    if (calls && r != R_ASSISTANT)
      return dapo_errf(e, DAPO_EINVAL, "messages[%zu].tool_calls: only an assistant's", i);
    if (calls && check_calls(t, calls, i, e)) return e->code;
    const char *content = json_string_value(cj);
    if (r == R_USER &&
        !(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>")))
      last_query = (int)i;
  }
  const char *last_role = role_at(messages, n - 1);
  if (strcmp(last_role, "user") && strcmp(last_role, "tool"))
    return dapo_errf(e, DAPO_EINVAL,
                     "messages[%zu].role: the last message must be the user's or a tool's (the "
                     "model answers it), not '%.20s'",
                     n - 1, last_role);

  struct sb b = {0};
  sb_str(&b, t->prefix ? t->prefix : "");
  size_t first = 0;
  const char *r0 = role_at(messages, 0);
  const char *sys0 =
      !strcmp(r0, "system")
          ? json_string_value(json_object_get(json_array_get(messages, 0), "content"))
          : NULL;
  if (t->llama32_header) {
    const char *sys = sys0 ? sys0 : "";
    size_t sn = strlen(sys);
    py_strip(&sys, &sn);
    first = sys0 ? 1 : 0;
    sb_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools) sb_str(&b, "Environment: ipython\n");
    sb_str(&b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    sb_str(&b, t->date_string);
    sb_str(&b, "\n\n");
    sb_add(&b, sys, sn);
    sb_str(&b, "<|eot_id|>");
    if (tools) { /* the tools go with the first message after the system's */
      if (first >= n) {
        free(b.p);
        return dapo_errf(e, DAPO_EINVAL,
                         "messages: Llama puts the tools in the first user message; there is none");
      }
      const char *u =
          json_string_value(json_object_get(json_array_get(messages, first), "content"));
      size_t un = strlen(u ? u : "");
      py_strip(&u, &un);
      sb_str(&b, LLAMA_TOOLS_HEAD);
      for (size_t k = 0; k < json_array_size(tools); k++) {
        sb_json(&b, json_array_get(tools, k), 4);
        sb_str(&b, "\n\n");
      }
      sb_add(&b, u, un);
      sb_str(&b, "<|eot_id|>");
      first++;
    }
  } else if (tools) { /* Qwen: the tools in the system message */
    sb_str(&b, "<|im_start|>system\n");
    if (t->tools == TS_QWEN25) {
      sb_str(&b, sys0 ? sys0 : t->default_sys ? t->default_sys : "");
      sb_str(&b, "\n\n");
    } else if (sys0) {
      sb_str(&b, sys0);
      sb_str(&b, "\n\n");
    }
    sb_str(&b, QWEN_TOOLS_HEAD);
    for (size_t k = 0; k < json_array_size(tools); k++) {
      sb_str(&b, "\n");
      sb_json(&b, json_array_get(tools, k), -1);
    }
    sb_str(&b, QWEN_TOOLS_TAIL);
    first = sys0 ? 1 : 0;
  } else if (t->default_sys && strcmp(r0, "system")) {
    expand(&b, t->fmt[R_SYSTEM], "system", t->default_sys, strlen(t->default_sys));
  }
  for (size_t i = first; i < n; i++) {
    const json_t *m = json_array_get(messages, i), *calls = calls_of(m);
    const char *role = json_string_value(json_object_get(m, "role"));
    const char *content = json_string_value(json_object_get(m, "content"));
    if (!content) content = "";
    size_t cn = strlen(content);
    int r = role_of(role);
    if (r == R_TOOL) {
      render_tool(&b, t, content, i == 0 || strcmp(role_at(messages, i - 1), "tool"),
                  i + 1 == n || strcmp(role_at(messages, i + 1), "tool"));
      continue;
    }
    if (r == R_ASSISTANT && calls) {
      if (t->tools == TS_QWEN3) {
        const char *after;
        qwen3_assistant(&b, content, (int)i > last_query, &after);
        render_calls(&b, t, calls, *after != '\0');
        sb_str(&b, "<|im_end|>\n");
      } else if (t->tools == TS_QWEN25) {
        sb_str(&b, "<|im_start|>assistant");
        if (*content) {
          sb_str(&b, "\n");
          sb_str(&b, content);
        }
        render_calls(&b, t, calls, 0);
        sb_str(&b, "<|im_end|>\n");
      } else {
        sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        render_calls(&b, t, calls, 0);
        sb_str(&b, "<|eot_id|>");
      }
      continue;
    }
    if (t->qwen3_think && r == R_ASSISTANT) {
      const char *after;
      qwen3_assistant(&b, content, (int)i > last_query, &after);
      sb_str(&b, "<|im_end|>\n");
      continue;
    }
    if (t->trim) py_strip(&content, &cn);
    expand(&b, t->fmt[r], role, content, cn);
  }
  return end_prompt(t, &b, add_generation_prompt, out, e);
}

int chat_render(const struct chat_template *t, const json_t *messages, char **out,
                struct dapo_err *e) {
  return chat_render_tools(t, messages, NULL, 1, out, e);
}

int chat_renders_tools(const struct chat_template *t) {
  return t->tools != TS_NONE;
}

int chat_render_after(const struct chat_template *t, enum chat_after after, const json_t *world,
                      char **out, struct dapo_err *e) {
  *out = NULL;
  if (t->tools == TS_NONE)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "the %s chat template renders no tool answers",
                     t->family);
  size_t n = json_array_size(world);
  for (size_t i = 0; i < n; i++) {
    const char *role = role_at(world, i);
    int r = role ? role_of(role) : -1;
    if ((r != R_TOOL && r != R_USER && r != R_SYSTEM) ||
        !json_is_string(json_object_get(json_array_get(world, i), "content")))
      return dapo_errf(e, DAPO_EINVAL,
                       "world[%zu]: expected {\"role\": \"tool\", \"user\" or \"system\", "
                       "\"content\": string}",
                       i);
  }
  struct sb b = {0};
  if (after == CHAT_AFTER_CUT) sb_str(&b, t->stop); /* the turn's end, as the template writes it */
  if (after != CHAT_AFTER_PROMPT && t->tools != TS_LLAMA)
    sb_str(&b, "\n"); /* ChatML's line after <|im_end|> */
  for (size_t i = 0; i < n; i++) {
    const json_t *m = json_array_get(world, i);
    const char *role = role_at(world, i),
               *content = json_string_value(json_object_get(m, "content"));
    size_t cn = strlen(content);
    int r = role_of(role);
    if (r == R_TOOL) {
      render_tool(&b, t, content, i == 0 || strcmp(role_at(world, i - 1), "tool"),
                  i + 1 == n || strcmp(role_at(world, i + 1), "tool"));
      continue;
    }
    if (t->trim) py_strip(&content, &cn);
    expand(&b, t->fmt[r], role, content, cn);
  }
  return end_prompt(t, &b, 1, out, e);
}
