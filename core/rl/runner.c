/* The job runner (runner.h), its set-up and its loop: a job spec becomes a model, datasets, a
 * judge and the buffers of one plan; runner_run then takes steps (runner_step.c), evaluates,
 * checkpoints (runner_out.c) and stops at the end, a pause or a cancel. runner_impl.h says which
 * file does what.
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

#include "checkpoint.h"
#include "kernels.h"
#include "parse.h"
#include "pool.h"
#include "runner_impl.h"

/* ---- failures and what the hooks are told --------------------------------------------------- */

/* Records a failure in res; returns 1 (the "stop" signal of the step functions). */
int trainer_fail(struct trainer *t, enum failure code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int trainer_fail(struct trainer *t, enum failure code, const char *param, const char *fmt, ...) {
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
int trainer_fail_err(struct trainer *t, enum failure code, const char *param,
                     const struct dapo_err *e) {
  if (e->code == DAPO_ENOMEM) code = FAIL_OUT_OF_MEMORY;
  if (e->code == DAPO_EIO) code = FAIL_IO_ERROR;
  return trainer_fail(t, code, param, "%s", e->msg);
}

int trainer_oom(struct trainer *t) {
  return trainer_fail(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory");
}

/* A hook's refusal: the daemon could not record what it was told. */
int trainer_hook_failed(struct trainer *t, const char *what) {
  return trainer_fail(t, FAIL_EVENT_STORE_FAILED, NULL, "could not record a %s event", what);
}

/* Tells the metrics of step t->step (m stolen; eval: an evaluation's). */
int trainer_emit_metrics(struct trainer *t, json_t *m, int eval, int64_t gen_tokens,
                         int64_t train_tokens) {
  struct runner_metrics rm = {.step = t->step,
                              .eval = eval,
                              .tokens_generated = gen_tokens,
                              .tokens_trained = train_tokens,
                              .data = m};
  int rc = t->h && t->h->metrics ? t->h->metrics(t->h->ctx, &rm) : 0;
  json_decref(m);
  return rc ? trainer_hook_failed(t, "metrics") : 0;
}

int trainer_log(struct trainer *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int trainer_log(struct trainer *t, const char *level, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int rc = t->h && t->h->log ? t->h->log(t->h->ctx, level, t->step, msg) : 0;
  return rc ? trainer_hook_failed(t, "log") : 0;
}

/* ---- ranks of a data-parallel job ----------------------------------------------------------- */

int trainer_agree(struct trainer *t, int stop) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return stop;
  /* the lowest rank that stopped, as a maximum of negatives */
  int first = -dist_max(d, -(stop ? d->rank : d->size));
  if (first == d->size) return 0;
  struct {
    int failure;
    char param[sizeof t->res->param];
    char message[sizeof t->res->message];
  } f;
  memset(&f, 0, sizeof f);
  if (d->rank == first) {
    f.failure = (int)t->res->failure;
    memcpy(f.param, t->res->param, sizeof f.param);
    memcpy(f.message, t->res->message, sizeof f.message);
  }
  dist_bcast(d, &f, sizeof f, first);
  t->res->failure = (enum failure)f.failure;
  memcpy(t->res->param, f.param, sizeof f.param);
  memcpy(t->res->message, f.message, sizeof f.message);
  return 1;
}

int trainer_requests(struct trainer *t) {
  int mine = (trainer_cancelled(t) ? TRAINER_CANCEL : 0) |
             (trainer_pause_requested(t) ? TRAINER_PAUSE : 0);
  return dist_or(trainer_dist(t), mine);
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

/* Capacities of a job: longest sequence, tokens of a micro-batch and response tokens in it,
 * sequences generated at once. A micro-batch never spans minibatches, so it holds at most
 * minibatch_size sequences: micro_batch_tokens beyond minibatch_size longest sequences could
 * never be used (at Qwen2.5-0.5B's shape, 64 responses of 128 tokens: 4,096-token activations
 * of 10.7 GB where 2,192 tokens are the most a minibatch of 16 holds), nor response tokens beyond
 * minibatch_size * max_new_tokens (the logits' rows over the vocabulary). Packing is unchanged:
 * a whole minibatch fits either way. */
static void caps(const struct hparams *hp, const struct episode_spec *ep, int max_prompt,
                 int with_val, int *cap_t, int *cap_tokens, int *cap_resp, int *gen_cap) {
  if (hp->method != METHOD_DAPO) { /* max_prompt: the longest example (a DPO job: pair); nothing
                                      generated */
    *cap_t = max_prompt;
    *cap_tokens = *cap_resp =
        hp->micro_batch_tokens > max_prompt ? hp->micro_batch_tokens : max_prompt;
    *gen_cap = 0;
    return;
  }
  *cap_t = max_prompt + episode_after_prompt(ep, hp);
  int64_t most = (int64_t)hp->minibatch_size * *cap_t;
  *cap_tokens = hp->micro_batch_tokens < most ? hp->micro_batch_tokens : (int)most;
  if (*cap_tokens < *cap_t) *cap_tokens = *cap_t;
  int64_t most_resp = (int64_t)hp->minibatch_size * hp->max_new_tokens;
  *cap_resp = most_resp < *cap_tokens ? (int)most_resp : *cap_tokens;
  int groups = hp->gen_batch_size / hp->group_size;
  *gen_cap = (groups > 0 ? groups : 1) * hp->group_size;
  if (with_val && hp->eval_samples > *gen_cap) *gen_cap = hp->eval_samples;
}

/* The one layout of the runner's batch arrays, which both sizes them (the memory plan) and carves
 * them out of one allocation (set-up), so that the plan counts exactly what is allocated.
 * N: tokens of a micro-batch (cap_tokens), S: sequences generated at once (gen_cap), R: tokens
 * per sequence after its prompt (episode_after_prompt), M: entries of the loss mask (N for a
 * multi-turn job, else 0), A: words of the update's allowed ids (a job with a response_format:
 * (V + 63) / 64 a response token of a micro-batch, else 0). Returns the bytes; with t, points
 * t's arrays into base (that many bytes, 64-byte aligned). */
static size_t scratch_layout(struct trainer *t, char *base, size_t N, size_t S, size_t R, size_t M,
                             size_t A) {
  size_t off = 0;
#define CARVE(field, count)                                                                        \
  do {                                                                                             \
    off = (off + 63) & ~(size_t)63;                                                                \
    if (t) t->field = (void *)(base + off);                                                        \
    off += sizeof *((struct trainer *)0)->field * (count);                                         \
  } while (0)
  CARVE(b_tok, N);      /* the packed micro-batch: token ids */
  CARVE(b_off, N + 1);  /* sequence offsets */
  CARVE(b_plen, N);     /* prompt lengths */
  CARVE(b_logp, N);     /* log-probs of the current policy */
  CARVE(b_ent, N);      /* entropies */
  CARVE(b_w, N);        /* per-token loss weights */
  CARVE(b_old, N);      /* log-probs before the update */
  CARVE(b_ref, N);      /* log-probs of the reference model */
  CARVE(mb_len, N);     /* response lengths of the minibatch */
  CARVE(mb_adv, N);     /* advantages of the minibatch */
  CARVE(b_ro, N);       /* the responses of the micro-batch */
  CARVE(b_trained, M);  /* its loss mask (multi-turn episodes) */
  CARVE(b_allow, A);    /* its allowed ids (response_format) */
  CARVE(g_tok, S * R);  /* generated tokens */
  CARVE(g_logp, S * R); /* their sampling log-probs */
  CARVE(g_len, S);
  CARVE(g_fin, S);
  CARVE(g_plen, S);
  CARVE(g_rng, S);
  CARVE(g_prompts, S);
#undef CARVE
  return (off + 63) & ~(size_t)63;
}

json_t *mem_plan_to_json(const struct mem_plan *p) {
  return json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:i, s:i, s:i}}", "parameters",
      (json_int_t)p->parameters, "trainable_parameters", (json_int_t)p->trainable, "weights_bytes",
      (json_int_t)p->weights, "gradients_bytes", (json_int_t)p->gradients, "optimizer_bytes",
      (json_int_t)p->optimizer, "reference_model_bytes", (json_int_t)p->reference,
      "activations_bytes", (json_int_t)p->activations, "generation_bytes",
      (json_int_t)p->generation, "buffers_bytes", (json_int_t)p->buffers, "total_bytes",
      (json_int_t)p->total, "for", "max_sequence_tokens", p->cap_seq_len, "micro_batch_tokens",
      p->cap_tokens, "generation_batch", p->gen_batch);
}

/* Words of the update's allowed ids (trainer.b_allow) for cap_resp response tokens. */
static size_t allow_words(const struct model_config *c, int constrained, int cap_resp) {
  return constrained ? ((size_t)model_vocab_used(c) + 63) / 64 * (size_t)cap_resp : 0;
}

void runner_memory_plan(const struct model_config *c, const struct lora_config *adapter,
                        const struct hparams *hp, const struct episode_spec *ep,
                        int max_prompt_tokens, int with_validation, int constrained,
                        struct mem_plan *p) {
  memset(p, 0, sizeof *p);
  struct model_config cc = *c;
  int cap_t, cap_tokens, cap_resp, gen_cap;
  caps(hp, ep, max_prompt_tokens, with_validation, &cap_t, &cap_tokens, &cap_resp, &gen_cap);
  if (cap_t > cc.max_position_embeddings) cc.max_position_embeddings = cap_t; /* a bound only */
  int64_t n = model_param_count(&cc);
  int64_t trained = adapter ? lora_param_count(adapter, &cc) : n;
  p->parameters = n;
  p->trainable = (uint64_t)trained;
  p->weights = (uint64_t)(n + (adapter ? trained : 0)) * sizeof(float);
  size_t tile = 0;
  if (adapter && cc.bf16_weights) /* the frozen matrices in BF16 (model_freeze_bf16); the
                                      products over many rows convert a tile of one at a time:
                                      one thread's largest (each further compute thread holds
                                      one more while it works) */
    p->weights -= (uint64_t)n * sizeof(float) - model_frozen_bf16_bytes(&cc, &tile);
  p->gradients = (uint64_t)trained * sizeof(float);
  p->optimizer = 2 * p->gradients;
  p->reference = hp->kl_coef > 0 && !adapter ? (uint64_t)n * sizeof(float) : 0;
  p->activations = train_state_bytes(&cc, adapter, cap_tokens, cap_resp, cap_t);
  p->generation = gen_state_bytes(&cc, adapter, gen_cap, cap_t);
  p->buffers = scratch_layout(NULL, NULL, (size_t)cap_tokens, (size_t)gen_cap,
                              (size_t)episode_after_prompt(ep, hp),
                              episode_multi(ep) ? (size_t)cap_tokens : 0,
                              allow_words(&cc, constrained, cap_resp)) +
               tile;
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
                         const struct prompt_form *pf, const struct ds_item *it, int max_new,
                         int **ids, int *n, char **text_out, struct dapo_err *e);
static int episode_prompts(const struct job_spec *s, const struct lm *lm,
                           struct chat_template **chat, int *stop_id, struct prompt_form *pf,
                           struct dapo_err *e);
static int check_line_tools(const struct episode_spec *ep, const json_t *fns,
                            const struct ds_item *it, struct dapo_err *e);

/* The longest prompt of the file at path (added to errors under field which on failure). */
static int check_file(const struct job_spec *s, const struct lm *lm, struct chat_template **chat,
                      const struct prompt_form *pf, const char *path, const char *which,
                      int *max_prompt, json_t *errors) {
  struct dapo_err e = {0};
  struct dataset *d = NULL;
  struct ds_limits lim = {DS_DEFAULT_MAX_LINE_BYTES, DS_DEFAULT_MAX_ITEMS, DS_DEFAULT_MAX_ERRORS};
  if (ds_load(path, &lim, &d, NULL, &e)) {
    dapo_errors_add(errors, which, e.msg);
    return 1;
  }
  int bad = 0;
  json_t *fns = s->episode.tools ? tools_prompt_functions(s->episode.tools) : NULL;
  for (int i = 0; i < ds_count(d) && !bad; i++) {
    const struct ds_item *it = ds_get(d, i);
    if (check_line_tools(&s->episode, fns, it, &e)) {
      dapo_errors_add(errors, which, e.msg);
      bad = 1;
      break;
    }
    if (!it->prompt && !*chat) {
      int id;
      if (build_chat(s, lm, chat, &id, &e)) {
        dapo_errors_add(errors, "chat_template", e.msg);
        bad = 1;
        break;
      }
    }
    int *ids = NULL, k = 0;
    if (encode_prompt(lm, *chat, pf, it, episode_after_prompt(&s->episode, &s->hp), &ids, &k, NULL,
                      &e)) {
      char msg[sizeof e.msg + 8];
      snprintf(msg, sizeof msg, "%s", e.msg);
      dapo_errors_add(errors, which, msg);
      bad = 1;
    }
    free(ids);
    if (k > *max_prompt) *max_prompt = k;
  }
  json_decref(fns);
  ds_free(d);
  return bad;
}

int trainer_open_meta(const struct job_spec *s, struct runner_data_facts *f, struct lm *lm,
                      json_t *errors) {
  struct dapo_err e = {0};
  if (lm_open_meta(s->model, lm, &e)) {
    dapo_errors_add(errors, "model", e.msg);
    return 1;
  }
  f->model_ok = 1;
  f->cfg = lm->cfg;
  if (lm->lora) f->model_adapter = 1, f->adapter_cfg = lm->lora->cfg;
  return 0;
}

int runner_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors) {
  size_t before = json_array_size(errors);
  memset(f, 0, sizeof *f);
  if (s->hp.method == METHOD_SUPERVISED) return sft_check_data(s, f, errors);
  if (s->hp.method == METHOD_DPO) return dpo_check_data(s, f, errors);
  struct lm lm;
  struct dapo_err e = {0};
  if (trainer_open_meta(s, f, &lm, errors)) return (int)(json_array_size(errors) - before);
  struct chat_template *chat = NULL;
  struct prompt_form pf = {TC_DAPOD, NULL, 1, 0};
  int id, max_prompt = 0;
  if (s->chat_template && build_chat(s, &lm, &chat, &id, &e))
    dapo_errors_add(errors, "chat_template", e.msg);
  else if (episode_prompts(s, &lm, &chat, &id, &pf, &e))
    dapo_errors_add(errors, "episode", e.msg);
  else if (!check_file(s, &lm, &chat, &pf, s->training_file, "training_file", &max_prompt,
                       errors) &&
           s->validation_file)
    check_file(s, &lm, &chat, &pf, s->validation_file, "validation_file", &max_prompt, errors);
  f->max_prompt_tokens = max_prompt;
  json_decref(pf.tools);
  chat_free(chat);
  lm_close(&lm);
  return (int)(json_array_size(errors) - before);
}

int runner_plan_job(const struct model_config *c, const struct lora_config *adapter,
                    const struct hparams *hp, const struct episode_spec *ep, int max_prompt_tokens,
                    int with_validation, int constrained, struct mem_plan *plan, json_t *errors) {
  int n = adapter ? lora_config_check(adapter, c, errors) : 0;
  runner_memory_plan(c, adapter, hp, ep, max_prompt_tokens, with_validation, constrained, plan);
  return n;
}

int runner_plan_model(const char *model, const struct lora_config *adapter,
                      const struct hparams *hp, int max_prompt_tokens, struct mem_plan *plan,
                      json_t *errors, struct dapo_err *e) {
  memset(plan, 0, sizeof *plan);
  struct lm lm;
  int rc = lm_open_meta(model, &lm, e);
  if (rc) return rc < 0 ? rc : DAPO_EINVAL;
  /* an adapter checkpoint is planned with its own adapter unless asked about another */
  rc = runner_plan_job(&lm.cfg,
                       adapter   ? adapter
                       : lm.lora ? &lm.lora->cfg
                                 : NULL,
                       hp, NULL, max_prompt_tokens, 0, 0, plan, errors);
  lm_close(&lm);
  return rc;
}

const struct lora_config *runner_job_adapter(const struct job_spec *s,
                                             const struct runner_data_facts *f, json_t *errors) {
  if (!f->model_adapter) return s->has_adapter ? &s->adapter : NULL;
  if (s->has_adapter && !lora_config_same(&s->adapter, &f->adapter_cfg)) {
    json_t *has = lora_config_to_json(&f->adapter_cfg);
    char *want = has ? json_dumps(has, JSON_COMPACT) : NULL, msg[1024];
    snprintf(msg, sizeof msg,
             "the model is an adapter checkpoint, whose adapter %s this job would continue; "
             "leave `adapter` out or give that one (a new adapter needs a full model: merge this "
             "one first with `dapod merge`)",
             want ? want : "");
    dapo_errors_add(errors, "adapter", msg);
    free(want);
    json_decref(has);
  }
  return &f->adapter_cfg;
}

int runner_check_job(const struct job_spec *s, struct mem_plan *plan, json_t *errors) {
  struct runner_data_facts f;
  int n = runner_check_data(s, &f, errors);
  memset(plan, 0, sizeof *plan);
  if (f.model_ok) {
    size_t before = json_array_size(errors);
    const struct lora_config *ad = runner_job_adapter(s, &f, errors);
    n += (int)(json_array_size(errors) - before);
    n += runner_plan_job(&f.cfg, ad, &s->hp, &s->episode, f.max_prompt_tokens,
                         s->validation_file != NULL, s->response_format != NULL, plan, errors);
  }
  return n;
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

/* A multi-turn job's call format and the form of its prompts (*pf; pf->tools owned by the
 * caller), and the chat template that decides them: episode.tool_format, or `auto`: the family's
 * of the chat template (the job's, else the model's own, built here into *chat with its
 * end-of-turn token *stop_id when the model has one) when it renders tools (chatml and qwen3:
 * qwen; llama3.2: llama3_json), else dapod. In a family's format the prompts show the tools, and
 * an environment's prompts end before the generation prompt (its first observation comes
 * first). Errors are the chat template's the job names (already reported) or out of memory. */
static int episode_prompts(const struct job_spec *s, const struct lm *lm,
                           struct chat_template **chat, int *stop_id, struct prompt_form *pf,
                           struct dapo_err *e) {
  const struct episode_spec *ep = &s->episode;
  *pf = (struct prompt_form){TC_DAPOD, NULL, 1, ep->tool_format < 0};
  if (!episode_multi(ep)) return 0;
  pf->line_tools = 0;
  if (!*chat && !s->chat_template && lm->tok_config) {
    struct dapo_err ignored = {0}; /* a model without a usable template takes the dapod format */
    if (build_chat(s, lm, chat, stop_id, &ignored)) {
      chat_free(*chat);
      *chat = NULL;
    }
  }
  if (ep->tool_format >= 0 || !*chat || !chat_renders_tools(*chat)) return 0;
  pf->format = trainer_family_format(*chat);
  pf->line_tools = 1;
  pf->gen = !ep->environment;
  if (ep->tools && !(pf->tools = tools_prompt_functions(ep->tools)))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  return 0;
}

enum tc_format trainer_family_format(const struct chat_template *chat) {
  if (!chat || !chat_renders_tools(chat)) return TC_DAPOD;
  return !strcmp(chat_family(chat), "llama3.2") ? TC_LLAMA3_JSON : TC_QWEN;
}

/* A line's tools in a multi-turn job name the job's tools its model may call there (fns: their
 * function shapes, tools_prompt_functions; an environment's job has none). 0, or DAPO_EINVAL
 * naming the line and the field. A single-turn job runs no call: any tool goes. */
static int check_line_tools(const struct episode_spec *ep, const json_t *fns,
                            const struct ds_item *it, struct dapo_err *e) {
  if (!it->tools || !episode_multi(ep)) return 0;
  if (ep->environment)
    return dapo_errf(e, DAPO_EINVAL,
                     "line %d: field 'tools': a job with an episode.environment calls no tools",
                     it->line);
  const char *names[TOOLS_MAX];
  int n = ds_item_tool_names(it, names, TOOLS_MAX);
  for (int i = 0; i < n; i++) {
    int found = 0;
    for (size_t k = 0; k < json_array_size(fns) && !found; k++) {
      const json_t *fn = json_object_get(json_array_get(fns, k), "function");
      found = !strcmp(names[i], json_string_value(json_object_get(fn, "name")));
    }
    if (!found)
      return dapo_errf(e, DAPO_EINVAL,
                       "line %d: field 'tools[%d].function.name': the job has no tool named "
                       "'%.64s' (a line's tools are called at episode.tools of the same name, "
                       "with their URLs)",
                       it->line, i, names[i]);
  }
  return 0;
}

/* A dataset item's prompt as token ids (*ids, owned; *n ids), by lm_encode_prompt: `messages`
 * rendered with chat in the form pf (NULL: the generation prompt, no tools; the rendered text in
 * *text_out when asked, owned), or the prompt text. Errors name the line (DAPO_ERANGE: prompt +
 * max_new exceed the context). */
static int encode_prompt(const struct lm *lm, const struct chat_template *chat,
                         const struct prompt_form *pf, const struct ds_item *it, int max_new,
                         int **ids, int *n, char **text_out, struct dapo_err *e) {
  *ids = NULL;
  *n = 0;
  if (text_out) *text_out = NULL;
  char *rendered = NULL;
  if (!it->prompt) {
    if (!chat)
      return dapo_errf(e, DAPO_EINVAL, "line %d: 'messages' need a chat template", it->line);
    const json_t *tools = pf ? pf->tools : NULL;
    if (pf && pf->line_tools && it->tools && chat_renders_tools(chat)) tools = it->tools;
    if (chat_render_tools(chat, it->messages, tools, pf ? pf->gen : 1, &rendered, e))
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
    return trainer_fail(t, FAIL_INVALID_CHAT_TEMPLATE, "chat_template", "%s", e.msg);
  if (id >= 0) t->chat_stop[t->n_chat_stop++] = id;
  return 0;
}

/* Item it of tokenize_items: its line's tools checked against the job's (fns), its prompt
 * tokenized into *ids (*len ids; *text the rendered `messages`). 0, or 1 with res set. */
static int tokenize_item(struct trainer *t, const struct ds_item *it, const json_t *fns,
                         const char *which, int **ids, int *len, char **text, int *max_len) {
  struct dapo_err e = {0};
  if (check_line_tools(&t->spec->episode, fns, it, &e))
    return trainer_fail(t, FAIL_INVALID_DATASET, which, "%s %s", which, e.msg);
  if (!it->prompt && need_chat(t)) return 1;
  int rc = encode_prompt(&t->lm, t->chat, &t->prompt_form, it, t->after_prompt, ids, len, text, &e);
  if (rc == DAPO_ENOMEM) return trainer_fail(t, FAIL_OUT_OF_MEMORY, which, "out of memory");
  if (rc)
    return trainer_fail(t, rc == DAPO_ERANGE ? FAIL_PROMPT_TOO_LONG : FAIL_INVALID_DATASET, which,
                        "%s %s", which, e.msg);
  if (*len > *max_len) *max_len = *len;
  return 0;
}

/* Tokenizes every prompt of d once (`messages` rendered with the job's chat template, a line's
 * tools checked against the job's); checks the prompt and what may follow it
 * (episode_after_prompt) fit the context. */
static int tokenize_items(struct trainer *t, const struct dataset *d, const char *which, int ***ids,
                          int **lens, char ***texts, int *max_len) {
  int n = ds_count(d);
  *ids = calloc((size_t)n, sizeof **ids);
  *lens = calloc((size_t)n, sizeof **lens);
  *texts = calloc((size_t)n, sizeof **texts);
  const json_t *job_tools = t->spec->episode.tools;
  json_t *fns = job_tools ? tools_prompt_functions(job_tools) : NULL;
  int rc = !*ids || !*lens || !*texts || (job_tools && !fns)
               ? trainer_fail(t, FAIL_OUT_OF_MEMORY, which, "out of memory")
               : 0;
  for (int i = 0; i < n && !rc; i++)
    rc = tokenize_item(t, ds_get(d, i), fns, which, &(*ids)[i], &(*lens)[i], &(*texts)[i], max_len);
  json_decref(fns);
  return rc;
}

static int load_dataset(struct trainer *t, const char *path, const char *which,
                        struct dataset **out) {
  struct dapo_err e = {0};
  struct ds_limits lim = {DS_DEFAULT_MAX_LINE_BYTES, DS_DEFAULT_MAX_ITEMS, DS_DEFAULT_MAX_ERRORS};
  if (ds_load(path, &lim, out, NULL, &e))
    return trainer_fail_err(t, FAIL_INVALID_DATASET, which, &e);
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

void trainer_ckpt_path(const struct trainer *t, int64_t step, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/checkpoints/step-%" PRId64, t->out, step);
}

/* The dtype of the job's checkpoints into t->ckpt_bf16: checkpoint_dtype, or with "auto" the
 * source's (config.json's torch_dtype, or dtype as newer transformers write it, of a model
 * folder; presets are float32). F16 folders get float32 checkpoints: exact, and what every
 * reader loads. */
static int resolve_ckpt_dtype(struct trainer *t) {
  t->ckpt_bf16 = t->spec->checkpoint_dtype == CKPT_DTYPE_BFLOAT16;
  if (t->spec->checkpoint_dtype != CKPT_DTYPE_AUTO) return 0;
  struct stat st;
  if (stat(t->spec->model, &st) || !S_ISDIR(st.st_mode)) return 0; /* a preset */
  json_t *cfg = NULL;
  struct dapo_err e = {0};
  if (lm_read_json(t->spec->model, "config.json", &cfg, &e))
    return trainer_fail_err(t, FAIL_INVALID_MODEL, "model", &e);
  const char *dt = json_string_value(json_object_get(cfg, "torch_dtype"));
  if (!dt) dt = json_string_value(json_object_get(cfg, "dtype"));
  t->ckpt_bf16 = dt && !strcmp(dt, "bfloat16");
  json_decref(cfg);
  return 0;
}

/* A multi-turn job's tools (episode.tools) or environment (episode.environment) under the
 * daemon's policy, and the format its model calls them in. 0, or 1 with res set. */
static int setup_tools(struct trainer *t) {
  const struct episode_spec *ep = &t->spec->episode;
  if (!episode_multi(ep)) return 0;
  t->tool_format = t->prompt_form.format; /* episode_prompts decided it */
  if (!ep->tools && !ep->environment) return 0;
  if (trainer_log(t, "info", "the model calls tools in the %s format%s",
                  tc_format_name(t->tool_format),
                  t->tool_format == TC_DAPOD ? "" : ", its chat template's"))
    return 1;
  struct dapo_err e = {0};
  const struct judge_policy *pol = t->o ? t->o->judge_policy : NULL;
  if (ep->environment) {
    if (!(t->tools = toolbox_new_env(ep->environment, pol, "episode.environment", &e)))
      return trainer_fail_err(t, FAIL_INVALID_SPEC, "episode.environment", &e);
  } else if (!(t->tools = toolbox_new(ep->tools, pol, "episode.tools", &e))) {
    return trainer_fail_err(t, FAIL_INVALID_SPEC, "episode.tools", &e);
  }
  int n = toolbox_count(t->tools);
  if (!(t->tool_names = calloc((size_t)n, sizeof *t->tool_names)) ||
      !(t->item_json = calloc((size_t)ds_count(t->train), sizeof *t->item_json)) ||
      (t->val && !(t->vitem_json = calloc((size_t)ds_count(t->val), sizeof *t->vitem_json))))
    return trainer_oom(t);
  for (int i = 0; i < n; i++) t->tool_names[i] = toolbox_name(t->tools, i);
  return 0;
}

/* Steps 1-3 of setup (below), shared with supervised jobs (runner_impl.h). */
int trainer_setup_model(struct trainer *t, int64_t from) {
  const struct hparams *hp = t->hp;
  struct dapo_err e = {0};
  trainer_phase(t, "loading");
  char sub[PATH_MAX];
  if (trainer_rank(t) != 0) goto folders_made; /* rank 0 alone writes in the out folder */
  snprintf(sub, sizeof sub, "%s/checkpoints", t->out);
  if (mkdir_p(sub))
    return trainer_fail(t, FAIL_IO_ERROR, NULL, "cannot create %s: %s", sub, strerror(errno));
  snprintf(sub, sizeof sub, "%s/rollouts", t->out);
  if (mkdir_p(sub))
    return trainer_fail(t, FAIL_IO_ERROR, NULL, "cannot create %s: %s", sub, strerror(errno));
  /* A process killed while writing a checkpoint or a rollouts file left temporaries behind:
   * never read, but they hold disk space until the job is deleted. */
  ckpt_remove_temporaries(sub);
  snprintf(sub, sizeof sub, "%s/checkpoints", t->out);
  ckpt_remove_temporaries(sub);

folders_made:
  t->res->resumed_from = from;
  json_t *state = NULL;
  int with_opt = 0, exact_file = 0;
  if (resolve_ckpt_dtype(t)) return 1;
  /* the job trains an adapter when it asks for one or its model is an adapter checkpoint; its
   * base is then only read, and a BF16 base is loaded straight into BF16 */
  int trains_adapter = t->spec->has_adapter || lm_is_adapter_folder(t->spec->model);
  int (*open_model)(const char *, uint64_t, struct lm *, struct dapo_err *) =
      trains_adapter ? lm_open_frozen : lm_open;
  if (from >= 0) {
    char dir[PATH_MAX];
    trainer_ckpt_path(t, from, dir, sizeof dir);
    if (open_model(dir, 0, &t->lm, &e))
      return trainer_fail_err(t, FAIL_INVALID_CHECKPOINT, "model", &e);
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    json_error_t je;
    state = json_load_file(p, 0, &je);
    json_t *spec_now = jobspec_to_json(t->spec);
    int same = state && json_equal(json_object_get(state, "spec"), spec_now);
    json_decref(spec_now);
    if (!same) {
      json_decref(state);
      return trainer_fail(t, FAIL_CHECKPOINT_MISMATCH, NULL,
                          "%s was written by a different job spec (or is unreadable); refusing to "
                          "resume from it",
                          p);
    }
    json_t *cur = json_object_get(state, "cursor");
    /* checkpoints written before these keys always hold optimizer.safetensors */
    json_t *os = json_object_get(state, "optimizer_state");
    with_opt = !os || json_is_true(os);
    exact_file = json_is_true(json_object_get(state, "exact_weights_file"));
    t->step = json_integer_value(json_object_get(state, "step"));
    t->cursor.seed = (uint64_t)json_integer_value(json_object_get(cur, "seed"));
    t->cursor.epoch = json_integer_value(json_object_get(cur, "epoch"));
    t->cursor.pos = json_integer_value(json_object_get(cur, "pos"));
    json_decref(state);
  } else {
    if (open_model(t->spec->model, t->spec->seed, &t->lm, &e))
      return trainer_fail_err(t, FAIL_INVALID_MODEL, "model", &e);
    t->step = 0;
    t->cursor.seed = t->spec->seed;
    if (t->lm.lora) { /* an adapter checkpoint: the job continues its adapter */
      if (t->spec->has_adapter && !lora_config_same(&t->spec->adapter, &t->lm.lora->cfg))
        return trainer_fail(t, FAIL_INVALID_MODEL, "adapter",
                            "the model is an adapter checkpoint whose adapter differs from the "
                            "job's `adapter` (a new adapter needs a full model: `dapod merge`)");
    } else if (t->spec->has_adapter) { /* a fresh adapter: PEFT's initialisation */
      json_t *errs = json_array();
      int bad = lora_config_check(&t->spec->adapter, &t->lm.cfg, errs);
      const char *msg = json_string_value(json_object_get(json_array_get(errs, 0), "message"));
      if (bad) dapo_errf(&e, DAPO_EINVAL, "%s", msg ? msg : "invalid adapter");
      json_decref(errs);
      if (bad) return trainer_fail_err(t, FAIL_INVALID_MODEL, "adapter", &e);
      if (!(t->lm.lora = lora_new(&t->spec->adapter, &t->lm.cfg, &e)))
        return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
      lora_init(t->lm.lora, t->spec->seed);
      t->lm.model->lora = t->lm.lora;
      snprintf(t->lm.base, sizeof t->lm.base, "%s", t->spec->model);
      t->lm.base_seed = t->spec->seed;
    }
  }
  if (!trains_adapter != !t->lm.lora)
    return trainer_fail(t, FAIL_CHECKPOINT_MISMATCH, NULL,
                        "the checkpoint %s an adapter but the job %s one",
                        t->lm.lora ? "holds" : "lacks", trains_adapter ? "trains" : "has no");
  /* a frozen base whose weights BF16 holds exactly (a BF16 folder's, already so from
   * lm_open_frozen) is held in BF16: half the memory, the same function */
  if (t->lm.lora && model_freeze_bf16(t->lm.model, &e) > 1)
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  /* with an adapter the KL reference is the base itself, the adapter switched off */
  t->ref_base = t->lm.lora && hp->kl_coef > 0;
  if (hp->kl_coef > 0 && !t->lm.lora) {
    struct lm base;
    if (lm_open(t->spec->model, t->spec->seed, &base, &e))
      return trainer_fail_err(t, FAIL_INVALID_MODEL, "model", &e);
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
  if (adamw_init(&t->opt, t->lm.model, &ac, &e))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  t->have_opt = 1;
  if (t->lm.lora ? lora_alloc_grads(t->lm.lora, &e) : model_alloc_grads(t->lm.model, &e))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  if (from >= 0) { /* without optimizer state (step 0), AdamW starts afresh: zero moments */
    char dir[PATH_MAX], p[PATH_MAX + 32];
    trainer_ckpt_path(t, from, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (with_opt && adamw_load(&t->opt, t->lm.model, p, &e))
      return trainer_fail_err(t, FAIL_INVALID_CHECKPOINT, NULL, &e);
    const char *prefix[1] = {""};
    float *buf[1] = {t->lm.model->params};
    snprintf(p, sizeof p, "%s/trainer_weights.safetensors", dir);
    if (exact_file && ckpt_load_tensors(p, t->lm.model, 1, prefix, buf, NULL, &e))
      return trainer_fail_err(t, FAIL_INVALID_CHECKPOINT, NULL, &e);
    model_weights_changed(t->lm.model);
  }
  return 0;
}

/* Brings a DAPO job's t from a spec to the state before its next step, in this order:
 *   1-3: trainer_setup_model:
 *   1. the output folder (checkpoints/, rollouts/) exists and holds no temporaries of a crash;
 *   2. the model: from the newest complete checkpoint (whose trainer_state.json must record this
 *      very spec: else FAIL_CHECKPOINT_MISMATCH), with the step and the dataset cursor it
 *      recorded, or fresh from spec->model at step 0; the frozen reference when kl_coef > 0;
 *   3. AdamW (its moments from the checkpoint when resuming) and the gradients;
 *   4. the datasets, every prompt rendered and tokenized once (prompt + max_new_tokens must fit);
 *   5. the judge and the tools (under the daemon's policy);
 *   6. the buffers, by the one plan the memory plan counts with (caps, scratch_layout);
 *   7. the sampler's options and stop tokens (model, generation config, chat template).
 * Resumes from the checkpoint of step `from` (-1: a fresh run). Returns 0, or 1 with res saying
 * why (the failing part's code and field). Allocates everything the run needs: a step allocates
 * only its rollouts. teardown frees it all, after a failure too. */
static int setup(struct trainer *t, int64_t from) {
  const struct hparams *hp = t->hp;
  struct dapo_err e = {0};
  if (trainer_setup_model(t, from)) return 1;
  if (load_dataset(t, t->spec->training_file, "training_file", &t->train)) return 1;
  if (t->spec->validation_file &&
      load_dataset(t, t->spec->validation_file, "validation_file", &t->val))
    return 1;
  int max_prompt = 0;
  t->after_prompt = episode_after_prompt(&t->spec->episode, hp);
  if (t->spec->chat_template && need_chat(t)) return 1;
  {
    int id = -1;
    if (episode_prompts(t->spec, &t->lm, &t->chat, &id, &t->prompt_form, &e))
      return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
    if (id >= 0) t->chat_stop[t->n_chat_stop++] = id;
  }
  if (tokenize_items(t, t->train, "training_file", &t->ids, &t->ids_len, &t->texts, &max_prompt))
    return 1;
  if (t->val &&
      tokenize_items(t, t->val, "validation_file", &t->vids, &t->vids_len, &t->vtexts, &max_prompt))
    return 1;

  if (!(t->judge = judge_new(t->spec->judge, t->o ? t->o->judge_policy : NULL, &e)))
    return trainer_fail_err(t, FAIL_INVALID_JUDGE, "judge", &e);
  if (setup_tools(t)) return 1;

  /* capacities (as runner_memory_plan counts them) */
  int cap_resp;
  caps(hp, &t->spec->episode, max_prompt, t->val != NULL, &t->cap_t, &t->cap_tokens, &cap_resp,
       &t->gen_cap);
  if (!(t->ts = train_state_new(t->lm.model, t->cap_tokens, cap_resp, t->cap_t, &e)) ||
      !(t->gs = gen_state_new(t->lm.model, t->gen_cap, t->cap_t, &e)))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  if (t->o && t->o->pool &&
      (train_state_set_pool(t->ts, t->o->pool, &e) || gen_state_set_pool(t->gs, t->o->pool, &e) ||
       gen_state_tune(t->gs, t->lm.model, t->gen_cap, &e)))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  if (t->o && t->o->pool && pool_threads(t->o->pool) > 1) {
    char split[256];
    if (trainer_log(t, "info", "decoding split: %s",
                    gen_state_describe_split(t->gs, split, sizeof split)))
      return 1;
  }
  size_t mask = episode_multi(&t->spec->episode) ? (size_t)t->cap_tokens : 0;
  size_t allow = allow_words(&t->lm.model->cfg, t->spec->response_format != NULL, cap_resp);
  size_t bytes = scratch_layout(NULL, NULL, (size_t)t->cap_tokens, (size_t)t->gen_cap,
                                (size_t)t->after_prompt, mask, allow);
  if (!(t->scratch = aligned_alloc(64, bytes)))
    return trainer_fail(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for batch buffers (%zu bytes)",
                        bytes);
  scratch_layout(t, t->scratch, (size_t)t->cap_tokens, (size_t)t->gen_cap, (size_t)t->after_prompt,
                 mask, allow);

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
  if (trainer_json_setup(t)) return 1; /* (with the stop ids) */
  if (from >= 0)
    return trainer_log(t, "info", "resumed from the checkpoint of step %" PRId64, from);
  return 0;
}

static void teardown(struct trainer *t) {
  trainer_json_teardown(t);
  trainer_clear_rollouts(t);
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
  free(t->scratch);
  train_state_free(t->ts);
  gen_state_free(t->gs);
  judge_free(t->judge);
  toolbox_free(t->tools);
  free(t->tool_names);
  if (t->item_json)
    for (int i = 0; i < ds_count(t->train); i++) json_decref(t->item_json[i]);
  if (t->vitem_json)
    for (int i = 0; i < ds_count(t->val); i++) json_decref(t->vitem_json[i]);
  free(t->item_json), free(t->vitem_json);
  ds_free(t->train);
  ds_free(t->val);
  if (t->have_opt) adamw_deinit(&t->opt);
  model_free(t->ref);
  lm_close(&t->lm);
  chat_free(t->chat);
  json_decref(t->prompt_form.tools);
}

/* ---- the run --------------------------------------------------------------------------------- */

/* The run: set-up, then (fresh runs) the baseline evaluation and checkpoint of step 0, then per
 * step: a cancel or pause is honoured before it starts; the step; its rollouts file; its
 * checkpoint (every checkpoint_every, at the last step, and when pausing), which records the
 * step's metrics too, so that recovery can tell them again if the process dies before they are;
 * its metrics; its evaluation (every eval_every and at the end). A pause always stops on a
 * checkpoint of the last completed step. */
/* A data-parallel job's ranks must hold the same weights after each update (they sum the same
 * gradients and take the same AdamW step): checked, so that a library whose sum gave different
 * bits on different ranks fails the job instead of training diverging copies. 0, or 1 (every
 * rank) with res set. */
static int weights_differ(struct trainer *t) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return 0;
  const struct lora *l = t->lm.model->lora;
  int same = l ? dist_same(d, l->params, l->n_params * sizeof(float))
               : dist_same(d, t->lm.model->params, t->lm.model->n_params * sizeof(float));
  if (same) return 0;
  return trainer_fail(t, FAIL_INTERNAL, NULL,
                      "step %" PRId64 ": the ranks' weights differ after the update (the MPI "
                      "library's sum gave different bits on different ranks)",
                      t->step);
}

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

  /* rank 0 alone tells (hooks) and writes; every rank resumes from the checkpoint it found */
  if (trainer_rank(t) != 0) t->h = NULL;
  int64_t from = trainer_rank(t) == 0 ? runner_latest_checkpoint(t->out) : 0;
  dist_bcast(trainer_dist(t), &from, sizeof from, 0);
  /* a supervised or DPO job: its own set-up, step, evaluation and teardown (runner_sft.c,
   * runner_dpo.c) */
  int sft = spec->hp.method == METHOD_SUPERVISED, dpo = spec->hp.method == METHOD_DPO;
  int (*evaluate)(struct trainer *) = dpo   ? trainer_dpo_evaluate
                                      : sft ? trainer_sft_evaluate
                                            : trainer_evaluate;
  int stop = trainer_agree(t, dpo   ? trainer_dpo_setup(t, from)
                              : sft ? trainer_sft_setup(t, from)
                                    : setup(t, from));
  int64_t total = sft || dpo ? t->sft_total_steps : t->hp->total_steps;
  if (!stop && t->step == 0) {
    /* step 0: the starting weights, and a baseline evaluation */
    if (t->hp->eval_every > 0) stop = evaluate(t);
    if (!stop) stop = trainer_agree(t, trainer_checkpoint(t, NULL));
  }
  while (!stop && t->step < total) {
    int req = trainer_requests(t);
    if (req & TRAINER_CANCEL) {
      stop = trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
      break;
    }
    if (req & TRAINER_PAUSE) {
      res->status = RUNNER_PAUSED;
      break;
    }
    t->step++;
    json_t *m = NULL;
    int64_t gen_tokens = 0, train_tokens = 0;
    int rc = dpo   ? trainer_dpo_step(t, &m, &train_tokens)
             : sft ? trainer_sft_step(t, &m, &train_tokens)
                   : trainer_step(t, &m, &gen_tokens, &train_tokens);
    if (rc == STEP_PAUSED) {
      t->step--;
      res->status = RUNNER_PAUSED;
      break;
    }
    if (rc) {
      stop = 1;
      break;
    }
    if ((stop = weights_differ(t))) {
      json_decref(m);
      break;
    }
    int last = t->step == total;
    int paused_now = t->o && t->o->stop_after_step > 0 && t->step == t->o->stop_after_step;
    int pausing = trainer_requests(t) & TRAINER_PAUSE;
    stop = sft || dpo ? 0 : trainer_write_rollouts(t); /* neither samples anything */
    if (!stop && (last || (t->hp->checkpoint_every > 0 && t->step % t->hp->checkpoint_every == 0) ||
                  paused_now || pausing))
      stop = trainer_checkpoint(t, m);
    if (!stop) stop = trainer_emit_metrics(t, json_incref(m), 0, gen_tokens, train_tokens);
    json_decref(m);
    stop = trainer_agree(t, stop);
    /* a supervised or DPO job's epoch ends: its validation also as full_valid/ (runner_sft.c) */
    t->eval_epoch_end = (sft || dpo) && (last || t->step % trainer_sft_epoch_steps(t) == 0);
    if (!stop && t->hp->eval_every > 0 &&
        (t->step % t->hp->eval_every == 0 || last || t->eval_epoch_end))
      stop = evaluate(t);
    t->eval_epoch_end = 0;
    if (!stop && paused_now && !last) {
      res->status = RUNNER_PAUSED;
      break;
    }
  }
  if (res->status == RUNNER_PAUSED && !stop) {
    /* make sure the state we stop in is resumable */
    char probe[PATH_MAX];
    trainer_ckpt_path(t, t->step, probe, sizeof probe);
    struct stat st;
    if (trainer_rank(t) == 0 && stat(probe, &st) != 0) stop = trainer_checkpoint(t, NULL);
    stop = trainer_agree(t, stop);
  }
  res->step = t->step;
  if (stop) {
    if (res->failure == FAIL_CANCELLED)
      res->status = RUNNER_CANCELLED;
    else
      res->status = RUNNER_FAILED;
  } else if (res->status != RUNNER_PAUSED)
    res->status = RUNNER_SUCCEEDED;
  if (dpo)
    trainer_dpo_teardown(t);
  else if (sft)
    trainer_sft_teardown(t);
  else
    teardown(t);
  free(t);
  return 0;
}
