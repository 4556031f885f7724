/* The job runner (runner.h): job spec parsing, the DAPO step (DAPO.md steps 1-7) wired to the
 * model, sampler, judge and optimizer, checkpoints, rollouts, evaluation and exact resumption.
 *
 * Determinism: every random choice of step s is drawn from an RNG stream derived from
 * (job seed, s, purpose, indices), and the dataset walk is a cursor saved in each checkpoint,
 * so a run resumed from the checkpoint of step k computes exactly what the uninterrupted run
 * computed for steps k+1... (same thread configuration). */
#include "runner.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "adamw.h"
#include "chat.h"
#include "checkpoint.h"
#include "dapo.h"
#include "dataset.h"
#include "lm.h"
#include "parse.h"
#include "rng.h"
#include "sampler.h"
#include "train.h"

/* ---- job spec ------------------------------------------------------------------------------ */

static void spec_err(json_t *errors, const char *field, const char *msg) {
  dapo_errors_add(errors, field, msg);
}

static char *dup_str(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* A message that names its field ("judge.url: ...", "chat_template.user: ...", as judge_new and
 * chat_from_spec write them) split into {field, message}; otherwise field `base`. */
static void spec_err_named(json_t *errors, const char *base, const char *text) {
  const char *colon = strstr(text, ": ");
  char field[96];
  snprintf(field, sizeof field, "%s", base);
  size_t n = strlen(base);
  if (colon && !strncmp(text, base, n) && (text[n] == '.' || text + n == colon) &&
      colon - text < (long)sizeof field) {
    memcpy(field, text, (size_t)(colon - text));
    field[colon - text] = '\0';
    text = colon + 2;
  }
  spec_err(errors, field, text);
}

int jobspec_parse(const json_t *body, const struct judge_policy *pol, struct job_spec *s,
                  json_t *errors) {
  size_t before = json_array_size(errors);
  memset(s, 0, sizeof *s);
  if (!json_is_object(body)) {
    spec_err(errors, "", "the job body must be a JSON object");
    return 1;
  }
  static const char *const known[] = {
      "model", "training_file", "validation_file", "judge",  "hyperparameters",
      "seed",  "metadata",      "suffix",          "job_id", "chat_template"};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)body, key, v) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok) spec_err(errors, key, "unknown field");
  }
  const char *model = json_string_value(json_object_get(body, "model"));
  if (!model || !*model) spec_err(errors, "model", "required: a preset name or a model folder");
  const char *tf = json_string_value(json_object_get(body, "training_file"));
  if (!tf || !*tf) spec_err(errors, "training_file", "required: the training dataset");
  json_t *vf = json_object_get(body, "validation_file");
  if (vf && !json_is_null(vf) && !json_is_string(vf))
    spec_err(errors, "validation_file", "expected a string or null");
  s->model = dup_str(model);
  s->training_file = dup_str(tf);
  s->validation_file = dup_str(json_string_value(vf));
  const char *jid = json_string_value(json_object_get(body, "job_id"));
  s->job_id = dup_str(jid ? jid : "job-local");

  json_t *seed = json_object_get(body, "seed");
  if (!seed || json_is_null(seed))
    s->seed = 0;
  else if (!json_is_integer(seed) || json_integer_value(seed) < 0)
    spec_err(errors, "seed", "expected a non-negative integer");
  else
    s->seed = (uint64_t)json_integer_value(seed);

  json_t *md = json_object_get(body, "metadata");
  if (md && !json_is_null(md)) {
    if (!json_is_object(md))
      spec_err(errors, "metadata", "expected an object of strings");
    else {
      json_object_foreach(md, key, v) if (!json_is_string(v)) {
        char f[160];
        snprintf(f, sizeof f, "metadata.%.100s", key);
        spec_err(errors, f, "expected a string");
      }
    }
  }
  json_t *suffix = json_object_get(body, "suffix");
  if (suffix && !json_is_null(suffix) &&
      (!json_is_string(suffix) || strlen(json_string_value(suffix)) > 64))
    spec_err(errors, "suffix", "expected a string of at most 64 characters");

  json_t *judge = json_object_get(body, "judge");
  if (!judge || json_is_null(judge)) {
    s->judge = json_pack("{s:s}", "type", "exact");
  } else {
    s->judge = json_incref(judge);
    struct dapo_err e = {0};
    struct judge *j = judge_new(judge, pol, &e);
    if (!j) spec_err_named(errors, "judge", e.msg);
    judge_free(j);
  }
  json_t *ct = json_object_get(body, "chat_template");
  if (ct && !json_is_null(ct)) {
    s->chat_template = json_incref(ct);
    /* everything but "auto" can be checked without the model */
    if (!json_is_string(ct) || strcmp(json_string_value(ct), "auto")) {
      struct dapo_err e = {0};
      struct chat_template *c = chat_from_spec(ct, NULL, &e);
      if (!c) spec_err_named(errors, "chat_template", e.msg);
      chat_free(c);
    }
  }
  hparams_parse(&s->hp, json_object_get(body, "hyperparameters"), errors);
  if (!s->model || !s->training_file || !s->job_id || !s->judge) {
    if ((model && !s->model) || (tf && !s->training_file) || !s->job_id || !s->judge)
      spec_err(errors, "", "out of memory");
  }
  return (int)(json_array_size(errors) - before);
}

json_t *jobspec_to_json(const struct job_spec *s) {
  /* chat_template only when given, so that specs (and the checkpoints that record them) of jobs
   * without one stay as they were */
  return json_pack("{s:s?,s:s?,s:s?,s:O?,s:o,s:I,s:O*}", "model", s->model, "training_file",
                   s->training_file, "validation_file", s->validation_file, "judge", s->judge,
                   "hyperparameters", hparams_to_json(&s->hp), "seed", (json_int_t)s->seed,
                   "chat_template", s->chat_template);
}

void jobspec_deinit(struct job_spec *s) {
  free(s->model);
  free(s->training_file);
  free(s->validation_file);
  free(s->job_id);
  json_decref(s->judge);
  json_decref(s->chat_template);
  memset(s, 0, sizeof *s);
}

/* ---- the trainer's state -------------------------------------------------------------------- */

/* One sampled response. */
struct ro {
  int item, round, group, index; /* dataset item; generation round; group number in the step */
  int *toks;                     /* [len] response tokens (owned) */
  float *slogp;                  /* [len] sampler log-probs (owned) */
  float *lp_old, *lp_ref;        /* [len] recomputed log-probs (owned, kept responses) */
  int len, truncated;
  char *text; /* decoded response (owned) */
  double reward_raw, reward, adv;
  int correct, jmask, penalised, judged, kept, in_loss;
  json_t *info;
};

struct trainer {
  const struct job_spec *spec;
  const struct hparams *hp;
  const struct runner_hooks *h;
  const struct runner_opts *o;
  struct runner_result *res;
  char out[PATH_MAX - 64];

  struct lm lm;
  struct chat_template *chat;    /* renders `messages` prompts; NULL until one needs it */
  int chat_stop[2], n_chat_stop; /* the chat template's end-of-turn token */
  struct model *ref;             /* frozen starting weights when kl_coef > 0 */
  struct adamw opt;
  int have_opt;
  struct train_state *ts;
  struct gen_state *gs;
  struct judge *judge;
  struct dataset *train, *val;
  int **ids, *ids_len;    /* prompt token ids per training item */
  int **vids, *vids_len;  /* per validation item */
  char **texts, **vtexts; /* rendered `messages` prompts per item (NULL for `prompt` items) */
  struct ds_cursor cursor;
  int64_t step;
  int cap_t, cap_tokens, gen_cap;
  struct sampler_opts so;

  struct ro *ros;
  int n_ro, cap_ro;

  /* batch scratch, capacity cap_tokens */
  int *b_tok, *b_off, *b_plen;
  float *b_logp, *b_ent, *b_w, *b_old, *b_ref;
  int *mb_len;
  double *mb_adv;
  struct ro **b_ro; /* the responses of the current micro-batch */
  /* generation scratch, capacity gen_cap sequences */
  int *g_tok, *g_len, *g_fin, *g_plen;
  float *g_logp;
  struct rng *g_rng;
  const int **g_prompts;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Records a failure in res; returns 1 (the "stop" signal of the step functions). */
static int failf(struct trainer *t, enum failure code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int failf(struct trainer *t, enum failure code, const char *param, const char *fmt, ...) {
  struct runner_result *r = t->res;
  r->status = RUNNER_FAILED;
  r->failure = code;
  snprintf(r->param, sizeof r->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->message, sizeof r->message, fmt, ap);
  va_end(ap);
  return 1;
}

/* A failure from a libdapo call: out of memory and I/O are the system's, whatever the call. */
static int fail_err(struct trainer *t, enum failure code, const char *param,
                    const struct dapo_err *e) {
  if (e->code == DAPO_ENOMEM) code = FAIL_OUT_OF_MEMORY;
  if (e->code == DAPO_EIO) code = FAIL_IO_ERROR;
  return failf(t, code, param, "%s", e->msg);
}

static int oom(struct trainer *t) {
  return failf(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory");
}

static void phase(struct trainer *t, const char *p) {
  if (t->h && t->h->phase) t->h->phase(t->h->ctx, p);
}

/* A hook's refusal: the daemon could not record what it was told. */
static int hook_failed(struct trainer *t, const char *what) {
  return failf(t, FAIL_EVENT_STORE_FAILED, NULL, "could not record a %s event", what);
}

/* Tells the metrics of step t->step (m stolen; eval: an evaluation's). */
static int emit_metrics(struct trainer *t, json_t *m, int eval, int64_t gen_tokens,
                        int64_t train_tokens) {
  struct runner_metrics rm = {.step = t->step,
                              .eval = eval,
                              .tokens_generated = gen_tokens,
                              .tokens_trained = train_tokens,
                              .data = m};
  int rc = t->h && t->h->metrics ? t->h->metrics(t->h->ctx, &rm) : 0;
  json_decref(m);
  return rc ? hook_failed(t, "metrics") : 0;
}

static int log_event(struct trainer *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int log_event(struct trainer *t, const char *level, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int rc = t->h && t->h->log ? t->h->log(t->h->ctx, level, t->step, msg) : 0;
  return rc ? hook_failed(t, "log") : 0;
}

static int cancelled(const struct trainer *t) {
  /* the flags are set by another thread (the daemon's workers): relaxed atomic loads */
  return t->o && t->o->cancel && __atomic_load_n(t->o->cancel, __ATOMIC_RELAXED);
}
static int pause_requested(const struct trainer *t) {
  return t->o && t->o->pause && __atomic_load_n(t->o->pause, __ATOMIC_RELAXED);
}

/* RNG stream for (purpose, a, b, c): a 64-bit mix so that streams never collide in practice. */
static uint64_t stream_of(uint64_t tag, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = tag;
  uint64_t v[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    x ^= v[i] + 0x9e3779b97f4a7c15ULL + (x << 6) + (x >> 2);
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 31;
  }
  return x;
}
#define TAG_GEN 0x67656e0000000000ULL  /* "gen" */
#define TAG_MB 0x6d62000000000000ULL   /* "mb" */
#define TAG_EVAL 0x6576616c00000000ULL /* "eval" */

static void ro_clear(struct ro *r) {
  free(r->toks);
  free(r->slogp);
  free(r->lp_old);
  free(r->lp_ref);
  free(r->text);
  json_decref(r->info);
  memset(r, 0, sizeof *r);
}

static void clear_rollouts(struct trainer *t) {
  for (int i = 0; i < t->n_ro; i++) ro_clear(&t->ros[i]);
  t->n_ro = 0;
}

static struct ro *new_ro(struct trainer *t) {
  if (t->n_ro == t->cap_ro) {
    int cap = t->cap_ro ? 2 * t->cap_ro : 256;
    struct ro *n = realloc(t->ros, sizeof *n * (size_t)cap);
    if (!n) return NULL;
    t->ros = n;
    t->cap_ro = cap;
  }
  struct ro *r = &t->ros[t->n_ro++];
  memset(r, 0, sizeof *r);
  return r;
}

/* ---- set-up --------------------------------------------------------------------------------- */

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf) return -1;
  memcpy(buf, path, n + 1);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(buf, 0755) && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* Capacities of a job: longest sequence, tokens of a micro-batch, sequences generated at once. */
static void caps(const struct hparams *hp, int max_prompt, int with_val, int *cap_t,
                 int *cap_tokens, int *gen_cap) {
  *cap_t = max_prompt + hp->max_new_tokens;
  *cap_tokens = hp->micro_batch_tokens > *cap_t ? hp->micro_batch_tokens : *cap_t;
  int groups = hp->gen_batch_size / hp->group_size;
  *gen_cap = (groups > 0 ? groups : 1) * hp->group_size;
  if (with_val && hp->eval_samples > *gen_cap) *gen_cap = hp->eval_samples;
}

json_t *mem_plan_to_json(const struct mem_plan *p) {
  return json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:i, s:i, s:i}}", "parameters",
      (json_int_t)p->parameters, "weights_bytes", (json_int_t)p->weights, "gradients_bytes",
      (json_int_t)p->gradients, "optimizer_bytes", (json_int_t)p->optimizer,
      "reference_model_bytes", (json_int_t)p->reference, "activations_bytes",
      (json_int_t)p->activations, "generation_bytes", (json_int_t)p->generation, "buffers_bytes",
      (json_int_t)p->buffers, "total_bytes", (json_int_t)p->total, "for", "max_sequence_tokens",
      p->cap_seq_len, "micro_batch_tokens", p->cap_tokens, "generation_batch", p->gen_batch);
}

void runner_memory_plan(const struct model_config *c, const struct hparams *hp,
                        int max_prompt_tokens, int with_validation, struct mem_plan *p) {
  memset(p, 0, sizeof *p);
  struct model_config cc = *c;
  int cap_t, cap_tokens, gen_cap;
  caps(hp, max_prompt_tokens, with_validation, &cap_t, &cap_tokens, &gen_cap);
  if (cap_t > cc.max_position_embeddings) cc.max_position_embeddings = cap_t; /* a bound only */
  int64_t n = model_param_count(&cc);
  p->parameters = n;
  p->weights = (uint64_t)n * sizeof(float);
  p->gradients = p->weights;
  p->optimizer = 2 * p->weights;
  p->reference = hp->kl_coef > 0 ? p->weights : 0;
  p->activations = train_state_bytes(&cc, cap_tokens, cap_tokens, cap_t);
  p->generation = gen_state_bytes(&cc, gen_cap, cap_t);
  size_t T = (size_t)cap_tokens, G = (size_t)gen_cap, M = (size_t)hp->max_new_tokens;
  p->buffers = T * (3 * sizeof(int) + 4 * sizeof(float) + sizeof(double) + sizeof(void *)) +
               sizeof(int) + G * M * (sizeof(int) + sizeof(float)) +
               G * (3 * sizeof(int) + sizeof(struct rng) + sizeof(int *));
  p->total = p->weights + p->gradients + p->optimizer + p->reference + p->activations +
             p->generation + p->buffers;
  p->cap_seq_len = cap_t;
  p->cap_tokens = cap_tokens;
  p->gen_batch = gen_cap;
}

/* ---- checking a job before it is queued -------------------------------------------------- */

static int build_chat(const struct job_spec *spec, const struct lm *lm, struct chat_template **out,
                      int *stop_id, struct dapo_err *e);
static int encode_prompt(const struct lm *lm, const struct chat_template *chat,
                         const struct ds_item *it, int max_new, int **ids, int *n, char **text_out,
                         struct dapo_err *e);

/* The longest prompt of the file at path (added to errors under field which on failure). */
static int check_file(const struct job_spec *s, const struct lm *lm, struct chat_template **chat,
                      const char *path, const char *which, int *max_prompt, json_t *errors) {
  struct dapo_err e = {0};
  struct dataset *d = NULL;
  struct ds_limits lim = {DS_DEFAULT_MAX_LINE_BYTES, DS_DEFAULT_MAX_ITEMS, DS_DEFAULT_MAX_ERRORS};
  if (ds_load(path, &lim, &d, NULL, &e)) {
    spec_err(errors, which, e.msg);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < ds_count(d) && !bad; i++) {
    const struct ds_item *it = ds_get(d, i);
    if (!it->prompt && !*chat) {
      int id;
      if (build_chat(s, lm, chat, &id, &e)) {
        spec_err(errors, "chat_template", e.msg);
        bad = 1;
        break;
      }
    }
    int *ids = NULL, k = 0;
    if (encode_prompt(lm, *chat, it, s->hp.max_new_tokens, &ids, &k, NULL, &e)) {
      char msg[sizeof e.msg + 8];
      snprintf(msg, sizeof msg, "%s", e.msg);
      spec_err(errors, which, msg);
      bad = 1;
    }
    free(ids);
    if (k > *max_prompt) *max_prompt = k;
  }
  ds_free(d);
  return bad;
}

int runner_check_job(const struct job_spec *s, struct mem_plan *plan, json_t *errors) {
  size_t before = json_array_size(errors);
  memset(plan, 0, sizeof *plan);
  struct lm lm;
  struct dapo_err e = {0};
  if (lm_open_meta(s->model, &lm, &e)) {
    spec_err(errors, "model", e.msg);
    return (int)(json_array_size(errors) - before);
  }
  struct chat_template *chat = NULL;
  int id, max_prompt = 0;
  if (s->chat_template && build_chat(s, &lm, &chat, &id, &e))
    spec_err(errors, "chat_template", e.msg);
  else if (!check_file(s, &lm, &chat, s->training_file, "training_file", &max_prompt, errors) &&
           s->validation_file)
    check_file(s, &lm, &chat, s->validation_file, "validation_file", &max_prompt, errors);
  runner_memory_plan(&lm.cfg, &s->hp, max_prompt, s->validation_file != NULL, plan);
  chat_free(chat);
  lm_close(&lm);
  return (int)(json_array_size(errors) - before);
}

/* The chat template of spec on lm (*out, owned) and its end-of-turn token (*stop_id, -1 when it
 * has none). Errors (message in e) are the user's. */
static int build_chat(const struct job_spec *spec, const struct lm *lm, struct chat_template **out,
                      int *stop_id, struct dapo_err *e) {
  *stop_id = -1;
  if (!(*out = chat_from_spec(spec->chat_template, lm->tok_config, e)))
    return e->code ? e->code : DAPO_EINVAL;
  const char *stop = chat_stop_text(*out);
  if (!stop) return 0;
  int k = 0;
  struct dapo_err ee = {0};
  if (tok_encode(lm->tok, stop, strlen(stop), stop_id, 1, &k, &ee) || k != 1) {
    *stop_id = -1;
    return dapo_errf(e, DAPO_EINVAL,
                     "chat_template: its end-of-turn text '%.40s' is not one token of this "
                     "model's tokenizer (a %s template on a model not tuned for it?)",
                     stop, chat_family(*out));
  }
  return 0;
}

/* A dataset item's prompt as token ids (*ids, owned; *n ids), by lm_encode_prompt: `messages`
 * rendered with chat (the rendered text in *text_out when asked, owned), or the prompt text.
 * Errors name the line (DAPO_ERANGE: prompt + max_new_tokens exceed the context). */
static int encode_prompt(const struct lm *lm, const struct chat_template *chat,
                         const struct ds_item *it, int max_new, int **ids, int *n, char **text_out,
                         struct dapo_err *e) {
  *ids = NULL;
  *n = 0;
  if (text_out) *text_out = NULL;
  char *rendered = NULL;
  if (!it->prompt) {
    if (!chat)
      return dapo_errf(e, DAPO_EINVAL, "line %d: 'messages' need a chat template", it->line);
    if (chat_render(chat, it->messages, &rendered, e))
      return dapo_err_prefix(e, "line %d: ", it->line);
  }
  const char *text = rendered ? rendered : it->prompt;
  int rc = lm_encode_prompt(lm, text, strlen(text), rendered ? LM_PROMPT_CHAT : LM_PROMPT_TEXT,
                            max_new, ids, n, e);
  if (rc) {
    free(rendered);
    return rc == DAPO_ENOMEM ? rc : dapo_err_prefix(e, "line %d: ", it->line);
  }
  if (text_out)
    *text_out = rendered;
  else
    free(rendered);
  return 0;
}

/* The trainer's chat template, built once (when the job gives one or a prompt needs it). */
static int need_chat(struct trainer *t) {
  if (t->chat) return 0;
  struct dapo_err e = {0};
  int id;
  if (build_chat(t->spec, &t->lm, &t->chat, &id, &e))
    return failf(t, FAIL_INVALID_CHAT_TEMPLATE, "chat_template", "%s", e.msg);
  if (id >= 0) t->chat_stop[t->n_chat_stop++] = id;
  return 0;
}

/* Tokenizes every prompt of d once (`messages` rendered with the job's chat template);
 * checks prompt + max_new_tokens fits the context. */
static int tokenize_items(struct trainer *t, const struct dataset *d, const char *which, int ***ids,
                          int **lens, char ***texts, int *max_len) {
  int n = ds_count(d);
  *ids = calloc((size_t)n, sizeof **ids);
  *lens = calloc((size_t)n, sizeof **lens);
  *texts = calloc((size_t)n, sizeof **texts);
  if (!*ids || !*lens || !*texts) return failf(t, FAIL_OUT_OF_MEMORY, which, "out of memory");
  for (int i = 0; i < n; i++) {
    const struct ds_item *it = ds_get(d, i);
    struct dapo_err e = {0};
    if (!it->prompt && need_chat(t)) return 1;
    int k, rc = encode_prompt(&t->lm, t->chat, it, t->hp->max_new_tokens, &(*ids)[i], &k,
                              &(*texts)[i], &e);
    if (rc == DAPO_ENOMEM) return failf(t, FAIL_OUT_OF_MEMORY, which, "out of memory");
    if (rc)
      return failf(t, rc == DAPO_ERANGE ? FAIL_PROMPT_TOO_LONG : FAIL_INVALID_DATASET, which,
                   "%s %s", which, e.msg);
    (*lens)[i] = k;
    if (k > *max_len) *max_len = k;
  }
  return 0;
}

static int load_dataset(struct trainer *t, const char *path, const char *which,
                        struct dataset **out) {
  struct dapo_err e = {0};
  struct ds_limits lim = {DS_DEFAULT_MAX_LINE_BYTES, DS_DEFAULT_MAX_ITEMS, DS_DEFAULT_MAX_ERRORS};
  if (ds_load(path, &lim, out, NULL, &e)) return fail_err(t, FAIL_INVALID_DATASET, which, &e);
  return 0;
}

int64_t runner_latest_checkpoint(const char *out) {
  char dir[PATH_MAX];
  if ((size_t)snprintf(dir, sizeof dir, "%s/checkpoints", out) >= sizeof dir) return -1;
  DIR *d = opendir(dir);
  if (!d) return -1;
  int64_t best = -1;
  struct dirent *de;
  while ((de = readdir(d))) {
    int64_t s;
    if (strncmp(de->d_name, "step-", 5) || parse_i64(de->d_name + 5, 0, INT64_MAX, &s, "", NULL))
      continue;
    char p[PATH_MAX + 320];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/trainer_state.json", dir, de->d_name);
    if (stat(p, &st) == 0 && s > best) best = s;
  }
  closedir(d);
  return best;
}

static void ckpt_path(const struct trainer *t, int64_t step, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/checkpoints/step-%" PRId64, t->out, step);
}

static int setup(struct trainer *t) {
  const struct hparams *hp = t->hp;
  struct dapo_err e = {0};
  phase(t, "loading");
  char sub[PATH_MAX];
  snprintf(sub, sizeof sub, "%s/checkpoints", t->out);
  if (mkdir_p(sub))
    return failf(t, FAIL_IO_ERROR, NULL, "cannot create %s: %s", sub, strerror(errno));
  snprintf(sub, sizeof sub, "%s/rollouts", t->out);
  if (mkdir_p(sub))
    return failf(t, FAIL_IO_ERROR, NULL, "cannot create %s: %s", sub, strerror(errno));
  /* A process killed while writing a checkpoint or a rollouts file left temporaries behind:
   * never read, but they hold disk space until the job is deleted. */
  ckpt_remove_temporaries(sub);
  snprintf(sub, sizeof sub, "%s/checkpoints", t->out);
  ckpt_remove_temporaries(sub);

  int64_t from = runner_latest_checkpoint(t->out);
  t->res->resumed_from = from;
  json_t *state = NULL;
  if (from >= 0) {
    char dir[PATH_MAX];
    ckpt_path(t, from, dir, sizeof dir);
    if (lm_open(dir, 0, &t->lm, &e)) return fail_err(t, FAIL_INVALID_CHECKPOINT, "model", &e);
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    json_error_t je;
    state = json_load_file(p, 0, &je);
    json_t *spec_now = jobspec_to_json(t->spec);
    int same = state && json_equal(json_object_get(state, "spec"), spec_now);
    json_decref(spec_now);
    if (!same) {
      json_decref(state);
      return failf(t, FAIL_CHECKPOINT_MISMATCH, NULL,
                   "%s was written by a different job spec (or is unreadable); refusing to "
                   "resume from it",
                   p);
    }
    json_t *cur = json_object_get(state, "cursor");
    t->step = json_integer_value(json_object_get(state, "step"));
    t->cursor.seed = (uint64_t)json_integer_value(json_object_get(cur, "seed"));
    t->cursor.epoch = json_integer_value(json_object_get(cur, "epoch"));
    t->cursor.pos = json_integer_value(json_object_get(cur, "pos"));
    json_decref(state);
  } else {
    if (lm_open(t->spec->model, t->spec->seed, &t->lm, &e))
      return fail_err(t, FAIL_INVALID_MODEL, "model", &e);
    t->step = 0;
    t->cursor.seed = t->spec->seed;
  }
  if (hp->kl_coef > 0) {
    struct lm base;
    if (lm_open(t->spec->model, t->spec->seed, &base, &e))
      return fail_err(t, FAIL_INVALID_MODEL, "model", &e);
    t->ref = base.model;
    base.model = NULL;
    lm_close(&base);
  }
  struct adamw_cfg ac = {.lr = (float)hp->learning_rate,
                         .beta1 = (float)hp->adam_beta1,
                         .beta2 = (float)hp->adam_beta2,
                         .eps = (float)hp->adam_eps,
                         .weight_decay = (float)hp->weight_decay,
                         .grad_clip = (float)hp->grad_clip,
                         .warmup_steps = hp->lr_warmup_steps};
  if (adamw_init(&t->opt, t->lm.model, &ac, &e)) return fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  t->have_opt = 1;
  if (model_alloc_grads(t->lm.model, &e)) return fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  if (from >= 0) {
    char p[PATH_MAX];
    ckpt_path(t, from, p, sizeof p);
    strncat(p, "/optimizer.safetensors", sizeof p - strlen(p) - 1);
    if (adamw_load(&t->opt, t->lm.model, p, &e))
      return fail_err(t, FAIL_INVALID_CHECKPOINT, NULL, &e);
  }

  if (load_dataset(t, t->spec->training_file, "training_file", &t->train)) return 1;
  if (t->spec->validation_file &&
      load_dataset(t, t->spec->validation_file, "validation_file", &t->val))
    return 1;
  int max_prompt = 0;
  if (t->spec->chat_template && need_chat(t)) return 1;
  if (tokenize_items(t, t->train, "training_file", &t->ids, &t->ids_len, &t->texts, &max_prompt))
    return 1;
  if (t->val &&
      tokenize_items(t, t->val, "validation_file", &t->vids, &t->vids_len, &t->vtexts, &max_prompt))
    return 1;

  if (!(t->judge = judge_new(t->spec->judge, t->o ? t->o->judge_policy : NULL, &e)))
    return fail_err(t, FAIL_INVALID_JUDGE, "judge", &e);

  /* capacities (as runner_memory_plan counts them) */
  caps(hp, max_prompt, t->val != NULL, &t->cap_t, &t->cap_tokens, &t->gen_cap);
  if (!(t->ts = train_state_new(t->lm.model, t->cap_tokens, t->cap_tokens, t->cap_t, &e)) ||
      !(t->gs = gen_state_new(t->lm.model, t->gen_cap, t->cap_t, &e)))
    return fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  if (t->o && t->o->pool &&
      (train_state_set_pool(t->ts, t->o->pool, &e) || gen_state_set_pool(t->gs, t->o->pool, &e)))
    return fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  size_t T = (size_t)t->cap_tokens, G = (size_t)t->gen_cap, M = (size_t)hp->max_new_tokens;
  t->b_tok = malloc(sizeof(int) * T);
  t->b_off = malloc(sizeof(int) * (T + 1));
  t->b_plen = malloc(sizeof(int) * T);
  t->b_logp = malloc(sizeof(float) * T);
  t->b_ent = malloc(sizeof(float) * T);
  t->b_w = malloc(sizeof(float) * T);
  t->b_old = malloc(sizeof(float) * T);
  t->b_ref = malloc(sizeof(float) * T);
  t->mb_len = malloc(sizeof(int) * T);
  t->mb_adv = malloc(sizeof(double) * T);
  t->b_ro = malloc(sizeof(struct ro *) * T);
  t->g_tok = malloc(sizeof(int) * G * M);
  t->g_logp = malloc(sizeof(float) * G * M);
  t->g_len = malloc(sizeof(int) * G);
  t->g_fin = malloc(sizeof(int) * G);
  t->g_plen = malloc(sizeof(int) * G);
  t->g_rng = malloc(sizeof(struct rng) * G);
  t->g_prompts = malloc(sizeof(int *) * G);
  if (!t->b_tok || !t->b_off || !t->b_plen || !t->b_logp || !t->b_ent || !t->b_w || !t->b_ro ||
      !t->b_old || !t->b_ref || !t->mb_len || !t->mb_adv || !t->g_tok || !t->g_logp || !t->g_len ||
      !t->g_fin || !t->g_plen || !t->g_rng || !t->g_prompts)
    return failf(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for batch buffers");

  t->so.top_p = (float)hp->top_p;
  t->so.temperature = (float)hp->temperature;
  t->so.max_new_tokens = hp->max_new_tokens;
  t->so.n_stop = 0;
  for (int i = 0; i < t->lm.n_stop && t->so.n_stop < SAMPLER_MAX_STOP; i++)
    t->so.stop_ids[t->so.n_stop++] = t->lm.stop_ids[i];
  for (int i = 0; i < t->n_chat_stop && t->so.n_stop < SAMPLER_MAX_STOP; i++) {
    int dup = 0;
    for (int j = 0; j < t->so.n_stop; j++) dup |= t->so.stop_ids[j] == t->chat_stop[i];
    if (!dup) t->so.stop_ids[t->so.n_stop++] = t->chat_stop[i];
  }
  if (from >= 0) return log_event(t, "info", "resumed from the checkpoint of step %" PRId64, from);
  return 0;
}

static void teardown(struct trainer *t) {
  clear_rollouts(t);
  free(t->ros);
  if (t->ids)
    for (int i = 0; i < ds_count(t->train); i++) free(t->ids[i]);
  if (t->vids)
    for (int i = 0; i < ds_count(t->val); i++) free(t->vids[i]);
  if (t->texts)
    for (int i = 0; i < ds_count(t->train); i++) free(t->texts[i]);
  if (t->vtexts)
    for (int i = 0; i < ds_count(t->val); i++) free(t->vtexts[i]);
  free(t->texts), free(t->vtexts);
  free(t->ids), free(t->ids_len), free(t->vids), free(t->vids_len);
  free(t->b_tok), free(t->b_off), free(t->b_plen), free(t->b_logp), free(t->b_ent);
  free(t->b_w), free(t->b_ro), free(t->b_old), free(t->b_ref), free(t->mb_len), free(t->mb_adv);
  free(t->g_tok), free(t->g_logp), free(t->g_len), free(t->g_fin), free(t->g_plen);
  free(t->g_rng), free(t->g_prompts);
  train_state_free(t->ts);
  gen_state_free(t->gs);
  judge_free(t->judge);
  ds_free(t->train);
  ds_free(t->val);
  if (t->have_opt) adamw_deinit(&t->opt);
  model_free(t->ref);
  lm_close(&t->lm);
  chat_free(t->chat);
}

/* ---- generation ----------------------------------------------------------------------------- */

/* Generates k responses for each of n prompts (items[i] indexes ids/lens), appending one ro per
 * response with group numbers group0 + i. Streams are derived from (tag, step, a, slot). */
static int generate(struct trainer *t, int n, const int *items, int *const *ids, const int *lens,
                    int k, const struct sampler_opts *so, uint64_t tag, uint64_t a, int group0,
                    int round, int *n_tokens) {
  int per_chunk = t->gen_cap / k;
  if (per_chunk < 1) per_chunk = 1;
  int M = so->max_new_tokens;
  for (int p0 = 0; p0 < n; p0 += per_chunk) {
    if (cancelled(t)) return failf(t, FAIL_CANCELLED, NULL, "cancelled");
    int np = n - p0 < per_chunk ? n - p0 : per_chunk, ns = np * k;
    for (int q = 0; q < np; q++)
      for (int i = 0; i < k; i++) {
        int s = q * k + i, it = items[p0 + q];
        t->g_prompts[s] = ids[it];
        t->g_plen[s] = lens[it];
        rng_seed(&t->g_rng[s], t->spec->seed,
                 stream_of(tag, (uint64_t)t->step, a, (uint64_t)(p0 + q) * 65536u + (uint64_t)i));
      }
    struct gen_out go = {t->g_tok, t->g_logp, t->g_len, t->g_fin};
    struct dapo_err e = {0};
    int rc = gen_run(t->gs, t->lm.model, ns, t->g_prompts, t->g_plen, t->g_rng, so, &go,
                     t->o ? t->o->cancel : NULL, &e);
    if (rc == DAPO_ECANCELLED) return failf(t, FAIL_CANCELLED, NULL, "cancelled");
    if (rc) return fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
    for (int s = 0; s < ns; s++) {
      struct ro *r = new_ro(t);
      if (!r) return failf(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for rollouts");
      r->item = items[p0 + s / k];
      r->group = group0 + p0 + s / k;
      r->index = s % k;
      r->round = round;
      r->len = t->g_len[s];
      r->truncated = t->g_fin[s] == FINISH_LENGTH;
      r->toks = malloc(sizeof(int) * (size_t)(r->len ? r->len : 1));
      r->slogp = malloc(sizeof(float) * (size_t)(r->len ? r->len : 1));
      if (!r->toks || !r->slogp)
        return failf(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for rollouts");
      memcpy(r->toks, t->g_tok + (size_t)s * M, sizeof(int) * (size_t)r->len);
      memcpy(r->slogp, t->g_logp + (size_t)s * M, sizeof(float) * (size_t)r->len);
      r->text = tok_decode_alloc(t->lm.tok, r->toks, r->len, 1, &e);
      if (!r->text) return fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
      *n_tokens += r->len;
    }
  }
  return 0;
}

/* Judges responses ros[first .. first+n). Items that the judge could not judge keep judged = 0.
 * Returns 1 (job failed) when on_judge_error is fail and something failed. */
static int judge_range(struct trainer *t, const struct dataset *d, int first, int n,
                       struct judge_stats *st) {
  if (n == 0) return 0;
  struct judge_item *items = calloc((size_t)n, sizeof *items);
  struct judge_result *res = calloc((size_t)n, sizeof *res);
  char(*idbuf)[48] = calloc((size_t)n, sizeof *idbuf);
  if (!items || !res || !idbuf) {
    free(items), free(res), free(idbuf);
    return failf(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory judging");
  }
  for (int i = 0; i < n; i++) {
    const struct ro *r = &t->ros[first + i];
    const struct ds_item *it = ds_get(d, r->item);
    snprintf(idbuf[i], sizeof idbuf[i], "s%" PRId64 "-r%d-g%d-%d", t->step, r->round, r->group,
             r->index);
    items[i] = (struct judge_item){
        .id = idbuf[i],
        .group = r->group,
        .prompt = it->prompt ? it->prompt : (d == t->train ? t->texts : t->vtexts)[r->item],
        .response = r->text,
        .answer = it->answer,
        .metadata = it->metadata,
        .response_tokens = r->len,
        .truncated = r->truncated};
  }
  struct dapo_err e = {0};
  int rc = judge_run(t->judge, t->spec->job_id, t->step, items, n, res, st,
                     t->o ? t->o->cancel : NULL, &e);
  int stop = 0;
  if (rc && cancelled(t))
    stop = failf(t, FAIL_CANCELLED, NULL, "cancelled");
  else if (rc && t->hp->on_judge_error == JUDGE_ERR_FAIL)
    stop = failf(t, FAIL_JUDGE_ERROR, "judge", "%s", e.msg);
  for (int i = 0; i < n; i++) {
    struct ro *r = &t->ros[first + i];
    if (res[i].err != JE_NONE) continue;
    r->judged = 1;
    r->reward_raw = res[i].reward;
    r->correct = res[i].correct;
    r->jmask = res[i].mask;
    r->info = res[i].info;
    res[i].info = NULL;
  }
  if (rc && !stop)
    stop = log_event(t, "warning", "judge errors; the affected groups are dropped: %s", e.msg);
  judge_results_release(res, n);
  free(items), free(res), free(idbuf);
  return stop;
}

/* Shapes rewards and decides correctness for ros[first .. first+n). */
static void shape_rewards(struct trainer *t, int first, int n) {
  const struct hparams *hp = t->hp;
  for (int i = first; i < first + n; i++) {
    struct ro *r = &t->ros[i];
    if (!r->judged) continue;
    r->reward = dapo_overlong_shape(r->reward_raw, r->len, hp->max_new_tokens, hp->overlong_buffer,
                                    hp->overlong_penalty, hp->overlong_mode, &r->penalised);
    if (r->correct < 0) r->correct = r->reward > 0;
  }
}

/* ---- the update ----------------------------------------------------------------------------- */

/* Packs responses list[from ..] into the batch scratch while they fit cap_tokens; returns how
 * many were packed (>= 1: one response always fits, cap_tokens >= cap_t). */
static int pack(struct trainer *t, struct ro *const *list, int from, int to) {
  int ntok = 0, ns = 0;
  t->b_off[0] = 0;
  for (int i = from; i < to; i++) {
    const struct ro *r = list[i];
    int pl = t->ids_len[r->item], L = pl + r->len;
    if (ns > 0 && ntok + L > t->cap_tokens) break;
    memcpy(t->b_tok + ntok, t->ids[r->item], sizeof(int) * (size_t)pl);
    memcpy(t->b_tok + ntok + pl, r->toks, sizeof(int) * (size_t)r->len);
    t->b_plen[ns] = pl;
    t->b_ro[ns] = list[i];
    ntok += L;
    t->b_off[++ns] = ntok;
  }
  return ns;
}

static int forward(struct trainer *t, struct model *m, int ns, float *ent) {
  struct fwd_batch b = {ns, t->b_tok, t->b_off, t->b_plen};
  struct dapo_err e = {0};
  if (train_forward(t->ts, m, &b, 1.0f / (float)t->hp->temperature, t->b_logp, ent, &e))
    return fail_err(t, FAIL_INTERNAL, NULL, &e);
  return 0;
}

struct upd_stats {
  struct pg_stats pg;
  double ent_sum, gnorm_sum;
  long ent_tokens, n_upd;
  double mismatch_sum; /* |sampler logp - trainer logp_old| summed over tokens */
  long mismatch_n;
  long train_tokens; /* tokens through the model in update passes (prompt + response) */
};

/* Minibatch order of epoch e: a permutation of 0..n-1 from the step's stream. */
static void epoch_order(const struct trainer *t, int *order, int n, int e) {
  for (int i = 0; i < n; i++) order[i] = i;
  struct rng r;
  rng_seed(&r, t->spec->seed, stream_of(TAG_MB, (uint64_t)t->step, (uint64_t)e, 0));
  rng_shuffle_int(&r, order, n);
}

/* logp_old (and the reference's) for every response in epoch 0's minibatch/micro-batch packing,
 * so that the first minibatch's forward is bit-identical and its ratio exactly 1. */
static int old_logprobs(struct trainer *t, struct ro **L, int n, const int *order, double *mismatch,
                        long *mismatch_n) {
  int M = t->hp->minibatch_size;
  struct ro **mb = malloc(sizeof *mb * (size_t)(M < n ? M : n));
  if (!mb) return oom(t);
  for (int j0 = 0; j0 < n; j0 += M) {
    int nm = n - j0 < M ? n - j0 : M;
    for (int i = 0; i < nm; i++) mb[i] = L[order[j0 + i]];
    for (int i = 0; i < nm;) {
      int ns = pack(t, mb, i, nm);
      for (int pass = 0; pass < (t->ref ? 2 : 1); pass++) {
        if (forward(t, pass ? t->ref : t->lm.model, ns, NULL)) {
          free(mb);
          return 1;
        }
        int k = 0;
        for (int s = 0; s < ns; s++) {
          struct ro *r = t->b_ro[s];
          float **dst = pass ? &r->lp_ref : &r->lp_old;
          if (!*dst && !(*dst = malloc(sizeof(float) * (size_t)r->len))) {
            free(mb);
            return oom(t);
          }
          memcpy(*dst, t->b_logp + k, sizeof(float) * (size_t)r->len);
          if (!pass)
            for (int q = 0; q < r->len; q++) {
              *mismatch += fabs((double)r->slogp[q] - (double)t->b_logp[k + q]);
              (*mismatch_n)++;
            }
          k += r->len;
        }
      }
      i += ns;
    }
  }
  free(mb);
  return 0;
}

static int update(struct trainer *t, struct ro **L, int n, struct upd_stats *us, double lr) {
  const struct hparams *hp = t->hp;
  int M = hp->minibatch_size;
  int *order = malloc(sizeof(int) * (size_t)n);
  struct ro **mb = malloc(sizeof *mb * (size_t)(M < n ? M : n));
  if (!order || !mb) {
    free(order), free(mb);
    return oom(t);
  }
  int stop = 0;
  double mismatch = 0;
  long mismatch_n = 0;
  epoch_order(t, order, n, 0);
  if ((stop = old_logprobs(t, L, n, order, &mismatch, &mismatch_n))) goto out;
  for (int ep = 0; ep < hp->epochs && !stop; ep++) {
    if (ep > 0) epoch_order(t, order, n, ep);
    for (int j0 = 0; j0 < n && !stop; j0 += M) {
      if (cancelled(t)) {
        stop = failf(t, FAIL_CANCELLED, NULL, "cancelled");
        break;
      }
      int nm = n - j0 < M ? n - j0 : M;
      long tot = 0;
      for (int i = 0; i < nm; i++) {
        mb[i] = L[order[j0 + i]];
        tot += mb[i]->len;
      }
      model_zero_grads(t->lm.model);
      for (int i = 0; i < nm && !stop;) {
        int ns = pack(t, mb, i, nm);
        if ((stop = forward(t, t->lm.model, ns, ep == 0 ? t->b_ent : NULL))) break;
        /* per-response arrays of this micro-batch, tokens concatenated */
        int k = 0;
        for (int s = 0; s < ns; s++) {
          const struct ro *r = t->b_ro[s];
          t->mb_len[s] = r->len;
          t->mb_adv[s] = r->adv;
          memcpy(t->b_old + k, r->lp_old, sizeof(float) * (size_t)r->len);
          if (t->ref) memcpy(t->b_ref + k, r->lp_ref, sizeof(float) * (size_t)r->len);
          if (ep == 0)
            for (int q = 0; q < r->len; q++) us->ent_sum += t->b_ent[k + q];
          k += r->len;
        }
        if (ep == 0) us->ent_tokens += k;
        dapo_token_weights(hp, ns, t->mb_len, t->mb_adv, t->b_logp, t->b_old,
                           t->ref ? t->b_ref : NULL, nm, tot, t->b_w, &us->pg);
        us->train_tokens += t->b_off[ns];
        struct dapo_err e = {0};
        if (train_backward(t->ts, t->lm.model, t->b_w, &e)) {
          stop = fail_err(t, FAIL_INTERNAL, NULL, &e);
          break;
        }
        i += ns;
      }
      if (stop) break;
      double gn = 0;
      struct dapo_err e = {0};
      if (adamw_step(&t->opt, t->lm.model, (float)lr, &gn, &e)) {
        stop = failf(t, FAIL_NON_FINITE_GRADIENT, NULL, "step %" PRId64 ": %s", t->step, e.msg);
        break;
      }
      us->gnorm_sum += gn;
      us->n_upd++;
    }
  }
  us->mismatch_sum = mismatch;
  us->mismatch_n = mismatch_n;
out:
  free(order), free(mb);
  return stop;
}

/* ---- outputs: rollouts file, checkpoints ----------------------------------------------------- */

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

/* Writes rollouts/step-N.jsonl atomically (temporary file, fsync, rename). */
static int write_rollouts(struct trainer *t) {
  char path[PATH_MAX], tmp[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/rollouts/step-%" PRId64 ".jsonl", t->out, t->step);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return failf(t, FAIL_IO_ERROR, NULL, "cannot write %s: %s", tmp, strerror(errno));
  int bad = 0;
  for (int i = 0; i < t->n_ro && !bad; i++) {
    const struct ro *r = &t->ros[i];
    const struct ds_item *it = ds_get(t->train, r->item);
    json_t *o = json_pack(
        "{s:I,s:i,s:i,s:i,s:s,s:s,s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:i,s:b,s:b,s:b,s:b}", "step",
        (json_int_t)t->step, "round", r->round, "group", r->group, "index", r->index, "id", it->id,
        "prompt", it->prompt ? it->prompt : t->texts[r->item], "response", r->text, "answer",
        it->answer, "prompt_token_ids", int_array(t->ids[r->item], t->ids_len[r->item]),
        "response_token_ids", int_array(r->toks, r->len), "reward_raw",
        r->judged ? json_real(r->reward_raw) : json_null(), "reward",
        r->judged ? json_real(r->reward) : json_null(), "correct",
        r->judged ? json_boolean(r->correct > 0) : json_null(), "advantage",
        r->kept ? json_real(r->adv) : json_null(), "length", r->len, "truncated", r->truncated,
        "kept", r->kept, "in_loss", r->in_loss, "overlong_penalised", r->penalised);
    if (!o) {
      bad = 1;
      break;
    }
    if (it->messages) json_object_set(o, "messages", it->messages); /* prompt: as rendered */
    if (r->info) json_object_set(o, "info", r->info);
    if (!r->judged) json_object_set_new(o, "judge_error", json_true());
    char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!line || fputs(line, f) == EOF || fputc('\n', f) == EOF) bad = 1;
    free(line);
  }
  if (fflush(f) || fsync(fileno(f))) bad = 1;
  if (fclose(f)) bad = 1;
  if (bad || rename(tmp, path)) {
    unlink(tmp);
    return failf(t, FAIL_IO_ERROR, NULL, "cannot write %s: %s", path, strerror(errno));
  }
  return 0;
}

struct ckpt_ctx {
  struct trainer *t;
  const json_t *metrics;
};

static int ckpt_extra(void *ctx, const char *tmp_dir, struct dapo_err *e) {
  struct ckpt_ctx *c = ctx;
  struct trainer *t = c->t;
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp_dir);
  int rc = adamw_save(&t->opt, t->lm.model, p, e);
  if (rc || (rc = lm_write_extra(&t->lm, tmp_dir, e))) return rc;
  json_t *st =
      json_pack("{s:I,s:{s:I,s:I,s:I},s:o,s:O?}", "step", (json_int_t)t->step, "cursor", "seed",
                (json_int_t)t->cursor.seed, "epoch", (json_int_t)t->cursor.epoch, "pos",
                (json_int_t)t->cursor.pos, "spec", jobspec_to_json(t->spec), "metrics", c->metrics);
  if (!st) return dapo_errf(e, DAPO_ENOMEM, "trainer_state.json: out of memory");
  snprintf(p, sizeof p, "%s/trainer_state.json", tmp_dir);
  rc = ckpt_write_json(p, st, e);
  json_decref(st);
  return rc;
}

static void remove_tree_files(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *de;
    char p[PATH_MAX + 320];
    while ((de = readdir(d)))
      if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(dir);
}

/* Deletes the oldest checkpoints beyond keep_checkpoints (never the newest one). */
static void prune(struct trainer *t) {
  int keep = t->hp->keep_checkpoints;
  if (keep <= 0) return;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/checkpoints", t->out);
  for (;;) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t oldest = INT64_MAX;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
      int64_t s;
      if (strncmp(de->d_name, "step-", 5) || parse_i64(de->d_name + 5, 0, INT64_MAX, &s, "", NULL))
        continue;
      count++;
      if (s < oldest) oldest = s;
    }
    closedir(d);
    if (count <= keep || oldest == t->step) return;
    char p[PATH_MAX];
    ckpt_path(t, oldest, p, sizeof p);
    remove_tree_files(p);
  }
}

static int checkpoint(struct trainer *t, const json_t *metrics) {
  phase(t, "checkpointing");
  char dir[PATH_MAX];
  ckpt_path(t, t->step, dir, sizeof dir);
  struct stat st;
  char probe[PATH_MAX + 32];
  snprintf(probe, sizeof probe, "%s/trainer_state.json", dir);
  if (stat(probe, &st) == 0) return 0; /* already there (a resumed run passing it again) */
  if (stat(dir, &st) == 0) remove_tree_files(dir); /* incomplete leftovers cannot exist, but */
  json_t *tj = tok_to_json(t->lm.tok);
  char *text = tj ? json_dumps(tj, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
  json_decref(tj);
  if (!text) return oom(t);
  struct ckpt_ctx c = {t, metrics};
  struct dapo_err e = {0};
  int rc = ckpt_save_with(dir, t->lm.model, text, t->lm.gen_config, 0, ckpt_extra, &c, &e);
  free(text);
  if (rc) return fail_err(t, FAIL_IO_ERROR, NULL, &e);
  prune(t);
  /* the writer reads what it wrote once, while it is cached: the daemon indexes this manifest
   * and serves downloads by it without reading the files again */
  struct ckpt_manifest man;
  if ((rc = ckpt_manifest_read(dir, &man, &e))) return fail_err(t, FAIL_IO_ERROR, NULL, &e);
  struct runner_checkpoint rc_ = {
      .step = t->step, .path = dir, .manifest = &man, .metrics = metrics};
  if (t->h && t->h->checkpoint && t->h->checkpoint(t->h->ctx, &rc_))
    return hook_failed(t, "checkpoint");
  return 0;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

static int evaluate(struct trainer *t) {
  const struct hparams *hp = t->hp;
  if (!t->val) return 0;
  phase(t, "evaluating");
  int n = ds_count(t->val);
  if (hp->eval_max_prompts > 0 && hp->eval_max_prompts < n) n = hp->eval_max_prompts;
  int k = hp->eval_samples;
  int *items = malloc(sizeof(int) * (size_t)n);
  if (!items) return oom(t);
  for (int i = 0; i < n; i++) items[i] = i;
  struct sampler_opts so = t->so;
  so.temperature = (float)hp->eval_temperature;
  so.top_p = (float)hp->eval_top_p;
  int first = t->n_ro, ntok = 0;
  double t0 = now_s();
  /* the validation rollouts borrow the step's array after the training ones */
  int stop = generate(t, n, items, t->vids, t->vids_len, k, &so, TAG_EVAL, 0, 0, -1, &ntok);
  free(items);
  struct judge_stats st = {0};
  if (!stop) stop = judge_range(t, t->val, first, t->n_ro - first, &st);
  if (stop) return stop;
  shape_rewards(t, first, t->n_ro - first);
  double acc = 0, passk = 0, len = 0;
  for (int p = 0; p < n; p++) {
    int c = 0;
    for (int i = 0; i < k; i++) {
      const struct ro *r = &t->ros[first + p * k + i];
      c += r->judged && r->correct > 0;
      len += r->len;
    }
    acc += (double)c / k;
    passk += dapo_pass_at_k(k, c, k);
  }
  char key[64];
  json_t *m =
      json_pack("{s:I,s:f,s:f,s:f,s:i,s:i,s:f}", "step", (json_int_t)t->step, "eval/accuracy",
                acc / n, "eval/pass@1", acc / n, "eval/response_length", len / ((double)n * k),
                "eval/prompts", n, "eval/samples", k, "eval/seconds", now_s() - t0);
  snprintf(key, sizeof key, "eval/pass@%d", k);
  json_object_set_new(m, key, json_real(passk / n));
  /* drop the validation rollouts again */
  for (int i = first; i < t->n_ro; i++) ro_clear(&t->ros[i]);
  t->n_ro = first;
  return emit_metrics(t, m, 1, 0, 0);
}

/* ---- one step -------------------------------------------------------------------------------- */

enum { STEP_OK = 0, STEP_STOP = 1, STEP_PAUSED = 2 };

static int cmp_ro_ptr(const void *a, const void *b) {
  const struct ro *x = *(struct ro *const *)a, *y = *(struct ro *const *)b;
  return x < y ? -1 : x > y;
}

/* One step: sample groups (dynamic sampling: rounds until prompt_batch_size groups with mixed
 * rewards are kept, or max_gen_batches), judge, shape rewards and advantages, then the update's
 * epochs of minibatches. Its metrics into *metrics_out (owned) and its token counts into
 * *gen_tokens and *train_tokens. STEP_OK, STEP_PAUSED (a pause between rounds; nothing trained),
 * or STEP_STOP with res set. */
static int do_step(struct trainer *t, json_t **metrics_out, int64_t *gen_tokens_out,
                   int64_t *train_tokens_out) {
  const struct hparams *hp = t->hp;
  const int G = hp->group_size, want = hp->prompt_batch_size;
  double t_step = now_s(), t_gen = 0, t_judge = 0;
  clear_rollouts(t);
  struct judge_stats js = {0};
  int rounds = 0, kept_groups = 0, sampled_groups = 0, all_correct = 0, all_wrong = 0;
  int gen_tokens = 0;
  struct ds_cursor cur0 = t->cursor;
  int n_prompts = hp->dynamic_sampling ? want * hp->gen_batch_multiplier : want;
  int max_rounds = hp->dynamic_sampling ? hp->max_gen_batches : 1;
  int *items = malloc(sizeof(int) * (size_t)n_prompts);
  if (!items) return oom(t);

  for (int r = 0; r < max_rounds && kept_groups < want; r++) {
    if (cancelled(t)) {
      free(items);
      return failf(t, FAIL_CANCELLED, NULL, "cancelled");
    }
    if (pause_requested(t)) { /* nothing trained yet this step: abandon it */
      free(items);
      t->cursor = cur0;
      return STEP_PAUSED;
    }
    phase(t, "sampling");
    double t0 = now_s();
    for (int i = 0; i < n_prompts; i++) items[i] = ds_next(t->train, &t->cursor);
    int first = t->n_ro;
    if (generate(t, n_prompts, items, t->ids, t->ids_len, G, &t->so, TAG_GEN, (uint64_t)r,
                 sampled_groups, r, &gen_tokens)) {
      free(items);
      return STEP_STOP;
    }
    t_gen += now_s() - t0;
    phase(t, "judging");
    t0 = now_s();
    if (judge_range(t, t->train, first, t->n_ro - first, &js)) {
      free(items);
      return STEP_STOP;
    }
    t_judge += now_s() - t0;
    shape_rewards(t, first, t->n_ro - first);
    for (int g = 0; g < n_prompts; g++) {
      struct ro *grp = &t->ros[first + g * G];
      int judged = 0, correct = 0, incl = 0;
      for (int i = 0; i < G; i++) {
        judged += grp[i].judged;
        if (grp[i].judged && !grp[i].jmask) {
          incl++;
          correct += grp[i].correct > 0;
        }
      }
      sampled_groups++;
      all_correct += incl > 0 && correct == incl;
      all_wrong += correct == 0;
      int keep = judged == G && (!hp->dynamic_sampling || (correct > 0 && correct < incl));
      if (!keep || kept_groups >= want) continue;
      kept_groups++;
      double rw[1024], adv[1024];
      int inc[1024];
      for (int i = 0; i < G; i++) {
        rw[i] = grp[i].reward;
        inc[i] = !grp[i].jmask;
      }
      dapo_group_advantages(rw, inc, G, hp->adv_eps, hp->scale_advantages, adv);
      for (int i = 0; i < G; i++) {
        grp[i].kept = 1;
        grp[i].adv = adv[i];
        grp[i].in_loss =
            !grp[i].jmask && !(hp->mask_truncated && grp[i].truncated) && grp[i].len > 0;
      }
    }
    rounds++;
  }
  free(items);
  if (kept_groups < want) {
    if (hp->on_sampling_shortfall == SHORTFALL_ERROR)
      return failf(t, FAIL_SAMPLING_SHORTFALL, "hyperparameters.max_gen_batches",
                   "step %" PRId64 ": dynamic sampling kept %d of %d groups after %d rounds "
                   "(%d groups sampled); raise gen_batch_multiplier or max_gen_batches, or set "
                   "on_sampling_shortfall to \"partial\"",
                   t->step, kept_groups, want, rounds, sampled_groups);
    if (log_event(t, "warning",
                  "step %" PRId64 ": dynamic sampling kept %d of %d groups after %d rounds (%d "
                  "sampled); training on what was kept",
                  t->step, kept_groups, want, rounds, sampled_groups))
      return STEP_STOP;
  }

  /* the update */
  phase(t, "updating");
  double t0 = now_s();
  int n_loss = 0;
  for (int i = 0; i < t->n_ro; i++) n_loss += t->ros[i].in_loss;
  struct ro **L = malloc(sizeof *L * (size_t)(n_loss ? n_loss : 1));
  if (!L) return oom(t);
  for (int i = 0, k = 0; i < t->n_ro; i++)
    if (t->ros[i].in_loss) L[k++] = &t->ros[i];
  qsort(L, (size_t)n_loss, sizeof *L, cmp_ro_ptr);
  struct upd_stats us = {0};
  double lr = adamw_lr_at(&t->opt.cfg, t->step - 1);
  if (n_loss > 0 && update(t, L, n_loss, &us, lr)) {
    free(L);
    return STEP_STOP;
  }
  free(L);
  double t_train = now_s() - t0;

  /* metrics over every sampled response of the step */
  double rsum = 0, rrsum = 0, psum = 0;
  long lsum = 0, n_j = 0, n_c = 0, n_tr = 0, n_pen = 0, lmin = LONG_MAX, lmax = 0, ptok = 0;
  for (int i = 0; i < t->n_ro; i++) {
    const struct ro *r = &t->ros[i];
    lsum += r->len;
    lmin = r->len < lmin ? r->len : lmin;
    lmax = r->len > lmax ? r->len : lmax;
    n_tr += r->truncated;
    if (r->judged) {
      n_j++;
      rsum += r->reward;
      rrsum += r->reward_raw;
      n_c += r->correct > 0;
      n_pen += r->penalised;
    }
    if (r->lp_old)
      for (int q = 0; q < r->len; q++) psum += exp(r->lp_old[q]), ptok++;
  }
  int n = t->n_ro ? t->n_ro : 1;
  double step_s = now_s() - t_step;
  json_t *m = json_object();
#define PUT_R(k, v) json_object_set_new(m, k, json_real(v))
#define PUT_I(k, v) json_object_set_new(m, k, json_integer((json_int_t)(v)))
  PUT_I("step", t->step);
  PUT_R("reward/mean", n_j ? rsum / n_j : 0);
  PUT_R("reward/raw_mean", n_j ? rrsum / n_j : 0);
  PUT_R("accuracy", n_j ? (double)n_c / n_j : 0);
  PUT_R("entropy", us.ent_tokens ? us.ent_sum / us.ent_tokens : 0);
  PUT_R("response_length/mean", (double)lsum / n);
  PUT_I("response_length/min", t->n_ro ? lmin : 0);
  PUT_I("response_length/max", lmax);
  PUT_R("response/truncated_frac", (double)n_tr / n);
  PUT_R("response/overlong_penalised_frac", n_j ? (double)n_pen / n_j : 0);
  PUT_R("policy/loss", us.n_upd ? us.pg.loss / us.n_upd : 0);
  PUT_R("policy/clip_frac_low", us.pg.tokens ? (double)us.pg.clip_low / us.pg.tokens : 0);
  PUT_R("policy/clip_frac_high", us.pg.tokens ? (double)us.pg.clip_high / us.pg.tokens : 0);
  PUT_R("policy/clip_frac_dual", us.pg.tokens ? (double)us.pg.clip_dual / us.pg.tokens : 0);
  PUT_R("policy/approx_kl", us.pg.tokens ? us.pg.approx_kl_sum / us.pg.tokens : 0);
  if (t->ref) PUT_R("policy/kl_ref", us.pg.tokens ? us.pg.kl_ref_sum / us.pg.tokens : 0);
  PUT_R("policy/grad_norm", us.n_upd ? us.gnorm_sum / us.n_upd : 0);
  PUT_I("policy/updates", us.n_upd);
  PUT_R("policy/lr", lr);
  PUT_R("policy/sampled_token_prob", ptok ? psum / ptok : 0);
  PUT_R("policy/clipped_high_old_prob",
        us.pg.clip_high ? us.pg.p_clip_high_sum / us.pg.clip_high : 0);
  PUT_R("policy/logp_mismatch", us.mismatch_n ? us.mismatch_sum / us.mismatch_n : 0);
  PUT_I("groups/kept", kept_groups);
  PUT_I("groups/sampled", sampled_groups);
  PUT_R("groups/all_correct_frac", sampled_groups ? (double)all_correct / sampled_groups : 0);
  PUT_R("groups/all_wrong_frac", sampled_groups ? (double)all_wrong / sampled_groups : 0);
  PUT_I("gen/rounds", rounds);
  PUT_I("tokens/generated", gen_tokens);
  PUT_I("tokens/trained", us.train_tokens);
  PUT_R("throughput/gen_tokens_per_s", t_gen > 0 ? gen_tokens / t_gen : 0);
  PUT_R("throughput/train_tokens_per_s", t_train > 0 ? us.train_tokens / t_train : 0);
  PUT_R("judge/seconds", t_judge);
  PUT_I("judge/errors/judge_timeout", js.n_timeout);
  PUT_I("judge/errors/judge_http_error", js.n_http_error);
  PUT_I("judge/errors/judge_parse_error", js.n_parse_error);
  PUT_I("judge/errors/reward_out_of_range", js.n_out_of_range);
  PUT_R("time/generation_s", t_gen);
  PUT_R("time/training_s", t_train);
  PUT_R("time/step_s", step_s);
#undef PUT_R
#undef PUT_I
  *metrics_out = m;
  *gen_tokens_out = gen_tokens;
  *train_tokens_out = us.train_tokens;
  return STEP_OK;
}

/* ---- the run --------------------------------------------------------------------------------- */

int runner_run(const struct job_spec *spec, const char *out_dir, const struct runner_hooks *h,
               const struct runner_opts *o, struct runner_result *res) {
  memset(res, 0, sizeof *res);
  res->resumed_from = -1;
  if (!spec || !out_dir || strlen(out_dir) >= sizeof((struct trainer *)0)->out) return DAPO_EINVAL;
  struct trainer *t = calloc(1, sizeof *t);
  if (!t) {
    res->status = RUNNER_FAILED;
    res->failure = FAIL_OUT_OF_MEMORY;
    snprintf(res->message, sizeof res->message, "out of memory");
    return 0;
  }
  t->spec = spec;
  t->hp = &spec->hp;
  t->h = h;
  t->o = o;
  t->res = res;
  snprintf(t->out, sizeof t->out, "%s", out_dir);

  int stop = setup(t);
  if (!stop && t->step == 0) {
    /* step 0: the starting weights, and a baseline evaluation */
    if (t->hp->eval_every > 0) stop = evaluate(t);
    if (!stop) stop = checkpoint(t, NULL);
  }
  while (!stop && t->step < t->hp->total_steps) {
    if (cancelled(t)) {
      stop = failf(t, FAIL_CANCELLED, NULL, "cancelled");
      break;
    }
    if (pause_requested(t)) {
      res->status = RUNNER_PAUSED;
      break;
    }
    t->step++;
    json_t *m = NULL;
    int64_t gen_tokens = 0, train_tokens = 0;
    int rc = do_step(t, &m, &gen_tokens, &train_tokens);
    if (rc == STEP_PAUSED) {
      t->step--;
      res->status = RUNNER_PAUSED;
      break;
    }
    if (rc) {
      stop = 1;
      break;
    }
    if ((stop = write_rollouts(t))) {
      json_decref(m);
      break;
    }
    int last = t->step == t->hp->total_steps;
    int paused_now = t->o && t->o->stop_after_step > 0 && t->step == t->o->stop_after_step;
    if (last || (t->hp->checkpoint_every > 0 && t->step % t->hp->checkpoint_every == 0) ||
        paused_now || pause_requested(t))
      stop = checkpoint(t, m);
    if (!stop) stop = emit_metrics(t, json_incref(m), 0, gen_tokens, train_tokens);
    json_decref(m);
    if (!stop && t->hp->eval_every > 0 && (t->step % t->hp->eval_every == 0 || last))
      stop = evaluate(t);
    if (!stop && paused_now && !last) {
      res->status = RUNNER_PAUSED;
      break;
    }
  }
  if (res->status == RUNNER_PAUSED && !stop) {
    /* make sure the state we stop in is resumable */
    char probe[PATH_MAX];
    ckpt_path(t, t->step, probe, sizeof probe);
    struct stat st;
    if (stat(probe, &st) != 0) stop = checkpoint(t, NULL);
  }
  res->step = t->step;
  if (stop) {
    if (res->failure == FAIL_CANCELLED)
      res->status = RUNNER_CANCELLED;
    else
      res->status = RUNNER_FAILED;
  } else if (res->status != RUNNER_PAUSED)
    res->status = RUNNER_SUCCEEDED;
  teardown(t);
  free(t);
  return 0;
}
