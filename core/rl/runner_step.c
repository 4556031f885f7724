/* One DAPO step of the job runner (runner_impl.h): sample G responses for each prompt of the
 * step (as batches, KV cache), judge them, shape rewards (overlong penalty), keep the groups with
 * mixed rewards until prompt_batch_size are kept (dynamic sampling), compute advantages, then
 * the epochs of minibatch updates with the clipped token-mean loss; and evaluation on the
 * validation prompts. DAPO.md steps 1-7. */
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

#include "dapo.h"
#include "runner_impl.h"

/* ---- rollouts of a step ---------------------------------------------------------------------- */

uint64_t trainer_stream(uint64_t tag, uint64_t a, uint64_t b, uint64_t c) {
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
  free(r->trained);
  json_decref(r->info);
  json_decref(r->turns);
  memset(r, 0, sizeof *r);
}

void trainer_clear_rollouts(struct trainer *t) {
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

/* ---- progress of long passes (runner_hooks.progress) --------------------------------------- */

/* Starts a pass of total units whose work is `work` parameter-tokens, reporting done 0 when it
 * reports at all. */
void progress_begin(struct progress *g, struct trainer *t, const char *pass, int round,
                    int64_t total, double work) {
  *g = (struct progress){.t = t,
                         .p = {.step = t->step, .pass = pass, .round = round, .total = total}};
  double min = t->o ? (double)t->o->progress_min_work : 0;
  g->on = t->h && t->h->progress && total > 0 && work >= min;
  if (g->on) t->h->progress(t->h->ctx, &g->p);
}

/* The pass has done `done` units and `tokens` tokens, `parts` twentieths of it (0..20; 20 only
 * when done == total): reported when a new twentieth is reached. */
void progress_at(struct progress *g, int64_t done, int64_t tokens, int64_t parts) {
  if (!g->on || parts <= g->shown) return;
  g->shown = (int)parts;
  g->p.done = done;
  g->p.tokens = tokens;
  g->t->h->progress(g->t->h->ctx, &g->p);
}

/* A micro-batch pass: done of its total micro-batches. */
static void progress_micro(struct progress *g, int64_t done, int64_t tokens) {
  if (g->on) progress_at(g, done, tokens, PROGRESS_PARTS * done / g->p.total);
}

/* Generation across the gen_run calls of a pass: the sequences and tokens of the calls before
 * this one, and the most tokens the pass can sample. */
struct gen_progress {
  struct progress *g;
  int64_t seqs_before, tokens_before, tokens_max;
};

/* gen_run's per-decoding-step report (gen_progress_fn): a twentieth is reached by sequences
 * finished or by tokens sampled of the most the pass can sample, whichever is ahead (responses
 * that all run to max_new_tokens finish only at the end). */
static void on_gen_progress(void *ctx, int64_t tokens, int finished) {
  struct gen_progress *gp = ctx;
  int64_t done = gp->seqs_before + finished, tok = gp->tokens_before + tokens;
  int64_t by_seqs = PROGRESS_PARTS * done / gp->g->p.total,
          by_tokens = PROGRESS_PARTS * tok / gp->tokens_max;
  if (by_tokens >= PROGRESS_PARTS && done < gp->g->p.total) by_tokens = PROGRESS_PARTS - 1;
  progress_at(gp->g, done, tok, by_seqs > by_tokens ? by_seqs : by_tokens);
}

/* ---- generation ----------------------------------------------------------------------------- */

/* Generates k responses for each of n prompts (items[i] indexes ids/lens), appending one ro per
 * response with group numbers group0 + i. Streams are derived from (tag, step, a, key0 + i,
 * sample): key0 + i is the prompt's place in the whole pass, whichever rank generates it, so
 * that a data-parallel job samples the same tokens for any number of ranks. Progress is
 * reported as the pass `pass`. */
static int generate(struct trainer *t, const struct dataset *d, int n, const int *items,
                    int *const *ids, const int *lens, int k, const struct sampler_opts *so,
                    uint64_t tag, uint64_t a, int key0, int group0, int round, const char *pass,
                    int *n_tokens) {
  if (episode_multi(&t->spec->episode))
    return trainer_episodes(t, d, n, items, ids, lens, k, so, tag, a, key0, group0, round, pass,
                            n_tokens);
  int per_chunk = t->gen_cap / k;
  if (per_chunk < 1) per_chunk = 1;
  int R = so->max_new_tokens;
  struct progress g;
  int64_t seqs = (int64_t)n * k;
  progress_begin(&g, t, pass, round + 1, seqs,
                 (double)model_param_count(&t->lm.model->cfg) * (double)seqs * R);
  struct gen_progress gp = {.g = &g, .tokens_max = seqs * R};
  for (int p0 = 0; p0 < n; p0 += per_chunk) {
    if (trainer_cancelled(t)) return trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
    int np = n - p0 < per_chunk ? n - p0 : per_chunk, ns = np * k;
    for (int q = 0; q < np; q++)
      for (int i = 0; i < k; i++) {
        int s = q * k + i, it = items[p0 + q];
        t->g_prompts[s] = ids[it];
        t->g_plen[s] = lens[it];
        rng_seed(&t->g_rng[s], t->spec->seed,
                 trainer_stream(tag, (uint64_t)t->step, a,
                                (uint64_t)(key0 + p0 + q) * 65536u + (uint64_t)i));
      }
    struct gen_out go = {
        .tokens = t->g_tok, .logp = t->g_logp, .len = t->g_len, .finish = t->g_fin};
    struct dapo_err e = {0};
    gen_state_set_progress(t->gs, g.on ? on_gen_progress : NULL, &gp);
    trainer_json_begin(t, ns); /* response_format: constrained, fresh matchers */
    int rc = gen_run(t->gs, t->lm.model, ns, t->g_prompts, t->g_plen, t->g_rng, so, &go,
                     t->o ? t->o->cancel : NULL, &e);
    int json_stop = trainer_json_end(t);
    gen_state_set_progress(t->gs, NULL, NULL);
    gp.seqs_before += ns;
    if (rc == DAPO_ECANCELLED) return trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
    if (rc) return trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
    if (json_stop) return 1;
    for (int s = 0; s < ns; s++) {
      struct ro *r = new_ro(t);
      if (!r) return trainer_fail(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for rollouts");
      r->item = items[p0 + s / k];
      r->group = group0 + p0 + s / k;
      r->index = s % k;
      r->round = round;
      r->len = r->seq_len = t->g_len[s];
      r->truncated = t->g_fin[s] == FINISH_LENGTH;
      r->toks = malloc(sizeof(int) * (size_t)(r->len ? r->len : 1));
      r->slogp = malloc(sizeof(float) * (size_t)(r->len ? r->len : 1));
      if (!r->toks || !r->slogp)
        return trainer_fail(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory for rollouts");
      memcpy(r->toks, t->g_tok + (size_t)s * R, sizeof(int) * (size_t)r->len);
      memcpy(r->slogp, t->g_logp + (size_t)s * R, sizeof(float) * (size_t)r->len);
      /* the text judged is the turn: the chat template's end-of-turn token ends it and is no
         part of it (a supervised template's "\n", as a chat reply is cut before it; a special
         token such as <|im_end|> is left out by decoding anyway) */
      int text_len = r->len;
      for (int c = 0; c < t->n_chat_stop && text_len > 0 && !r->truncated; c++)
        if (r->toks[text_len - 1] == t->chat_stop[c]) text_len--;
      r->text = tok_decode_alloc(t->lm.tok, r->toks, text_len, 1, &e);
      if (!r->text) return trainer_fail_err(t, FAIL_GENERATION_FAILED, NULL, &e);
      *n_tokens += r->len;
      gp.tokens_before += r->len;
    }
  }
  return 0;
}

/* ---- the ranks of a data-parallel job -------------------------------------------------------- */

void trainer_share(const struct trainer *t, int k, int *lo, int *hi) {
  int64_t r = trainer_rank(t), n = dist_size(trainer_dist(t));
  *lo = (int)((int64_t)k * r / n);
  *hi = (int)((int64_t)k * (r + 1) / n);
}

struct wbuf {
  char *p;
  size_t n, cap;
  int oom;
};

static void put(struct wbuf *b, const void *x, size_t n) {
  if (b->oom || !n) return; /* x may be NULL when n is 0 */
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, x, n);
  b->n += n;
}

static void put_str(struct wbuf *b, const char *s) {
  uint64_t n = s ? strlen(s) : 0;
  put(b, &n, sizeof n);
  put(b, s, (size_t)n);
}

static const char *take(const char **p, size_t n) {
  const char *q = *p;
  *p += n;
  return q;
}

/* A judged response as bytes, and back (what exchange sends). */
static void put_json(struct wbuf *b, const json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  if (j && !s) b->oom = 1;
  put_str(b, s);
  free(s);
}

static void put_ro(struct wbuf *b, const struct ro *r) {
  int32_t h[13] = {r->item,      r->round,   r->group,          r->index,     r->len,
                   r->truncated, r->correct, r->jmask,          r->penalised, r->judged,
                   r->seq_len,   r->finish,  r->trained != NULL};
  double v[2] = {r->reward_raw, r->reward};
  put(b, h, sizeof h);
  put(b, v, sizeof v);
  put(b, r->toks, sizeof(int) * (size_t)r->seq_len);
  if (r->trained) put(b, r->trained, (size_t)r->seq_len);
  put(b, r->slogp, sizeof(float) * (size_t)r->len);
  put(b, &r->es, sizeof r->es);
  put_str(b, r->text);
  put_json(b, r->info);
  put_json(b, r->turns);
}

/* A JSON value put by put_json into *out (NULL when none). 0, or 1 out of memory. */
static int take_json(const char **p, json_t **out) {
  uint64_t n;
  memcpy(&n, take(p, sizeof n), sizeof n);
  *out = NULL;
  if (!n) return 0;
  json_error_t je;
  *out = json_loadb(take(p, (size_t)n), (size_t)n, JSON_DECODE_ANY, &je);
  return *out == NULL;
}

static int take_ro(const char **p, struct ro *r) {
  int32_t h[13];
  double v[2];
  uint64_t n;
  memcpy(h, take(p, sizeof h), sizeof h);
  memcpy(v, take(p, sizeof v), sizeof v);
  r->item = h[0], r->round = h[1], r->group = h[2], r->index = h[3], r->len = h[4];
  r->truncated = h[5], r->correct = h[6], r->jmask = h[7], r->penalised = h[8], r->judged = h[9];
  r->seq_len = h[10], r->finish = (enum ep_finish)h[11];
  r->reward_raw = v[0], r->reward = v[1];
  size_t len = (size_t)r->len, sl = (size_t)r->seq_len;
  r->toks = malloc(sizeof(int) * (sl ? sl : 1));
  r->slogp = malloc(sizeof(float) * (len ? len : 1));
  if (!r->toks || !r->slogp || (h[12] && !(r->trained = malloc(sl ? sl : 1)))) return 1;
  memcpy(r->toks, take(p, sizeof(int) * sl), sizeof(int) * sl);
  if (h[12]) memcpy(r->trained, take(p, sl), sl);
  memcpy(r->slogp, take(p, sizeof(float) * len), sizeof(float) * len);
  memcpy(&r->es, take(p, sizeof r->es), sizeof r->es);
  memcpy(&n, take(p, sizeof n), sizeof n);
  if (!(r->text = strndup(take(p, (size_t)n), (size_t)n))) return 1;
  return take_json(p, &r->info) || take_json(p, &r->turns);
}

/* A data-parallel round's exchange (collective): each rank generated, judged and shaped the
 * responses ros[first ..] of its share of the round's prompts; afterwards every rank holds every
 * rank's, in rank order, which is the order of the prompts: the same array as one process
 * builds. stop: this rank's; returns 1 on every rank when any stopped (res set). */
static int exchange(struct trainer *t, int first, int stop) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return stop;
  struct wbuf b = {0};
  for (int i = first; i < t->n_ro && !stop; i++) put_ro(&b, &t->ros[i]);
  if (!stop && b.oom) stop = trainer_oom(t);
  if (trainer_agree(t, stop)) {
    free(b.p);
    return 1;
  }
  void *all = NULL;
  size_t *lens = calloc((size_t)d->size, sizeof *lens);
  struct dapo_err e = {0};
  if (!lens) stop = trainer_oom(t);
  if (trainer_agree(t, stop)) {
    free(b.p), free(lens);
    return 1;
  }
  int rc = dist_allgather(d, b.p, b.n, &all, lens, &e); /* fails on every rank alike */
  free(b.p);
  if (rc) {
    free(lens);
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  }
  size_t total = 0;
  for (int r = 0; r < d->size; r++) total += lens[r];
  free(lens);
  for (int i = first; i < t->n_ro; i++) ro_clear(&t->ros[i]);
  t->n_ro = first;
  const char *p = all, *end = (const char *)all + total;
  while (p < end && !stop) {
    struct ro *r = new_ro(t);
    if (!r || take_ro(&p, r)) stop = trainer_oom(t);
  }
  free(all);
  return trainer_agree(t, stop);
}

/* An environment's episodes, rewarded: by the sum of its rewards (episode.reward "environment",
 * the judge not asked) or by that sum added to the judge's score ("sum"); an episode whose
 * environment failed (on_env_error "drop") stays unjudged, and its group leaves the step. Returns
 * 1 (res set) when the episodes dropped cannot be logged. */
static int env_rewards(struct trainer *t, int first, int n) {
  const struct episode_spec *ep = &t->spec->episode;
  int failed = 0;
  for (int i = first; i < first + n; i++) {
    struct ro *r = &t->ros[i];
    if (r->es.env_failed) {
      r->judged = 0;
      failed++;
      continue;
    }
    if (ep->reward == EP_REWARD_ENVIRONMENT) {
      r->judged = 1, r->reward_raw = r->es.env_reward, r->correct = -1, r->jmask = 0;
    } else if (ep->reward == EP_REWARD_SUM && r->judged) {
      r->reward_raw += r->es.env_reward;
      r->correct = -1;
    }
  }
  if (!failed) return 0;
  return trainer_log(t, "warning",
                     "%d episodes' environment failed (on_env_error \"drop\"); their groups "
                     "leave the step",
                     failed);
}

/* A single-turn response to a line with tools, read for calls of them in the model's format (the
 * chat family's when it renders tools, else dapod): OpenAI's tool_calls [{"id": "call_K", "type":
 * "function", "function": {"name", "arguments": JSON text}}] for the graders (nothing runs), or
 * NULL when it calls none (or does not call well). *oom set when out of memory. */
static json_t *single_turn_calls(const struct trainer *t, const struct ds_item *it,
                                 const char *text, int *oom) {
  if (!it->tools || episode_multi(&t->spec->episode)) return NULL;
  const char *names[TOOLS_MAX];
  int n = ds_item_tool_names(it, names, TOOLS_MAX);
  enum tc_format f = t->prompt_form.line_tools ? trainer_family_format(t->chat) : TC_DAPOD;
  struct tc_turn turn;
  if (tc_read_turn(f, text, strlen(text), names, n, &turn)) return *oom = 1, NULL;
  json_t *calls = turn.n_calls ? json_array() : NULL;
  for (int k = 0; calls && k < turn.n_calls; k++) {
    char id[32], *args = json_dumps(turn.calls[k].arguments, JSON_COMPACT);
    snprintf(id, sizeof id, "call_%d", k);
    json_t *c = args ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
                                 "function", "name", turn.calls[k].name, "arguments", args)
                     : NULL;
    free(args);
    if (!c || json_array_append_new(calls, c)) json_decref(calls), calls = NULL;
  }
  if (turn.n_calls && !calls) *oom = 1;
  tc_turn_free(&turn);
  return calls;
}

/* Judges responses ros[first .. first+n). Items that the judge could not judge keep judged = 0.
 * Returns 1 (job failed) when on_judge_error is fail and something failed. An environment's
 * episodes get its rewards (env_rewards). */
static int judge_range(struct trainer *t, const struct dataset *d, int first, int n,
                       struct judge_stats *st) {
  if (n == 0) return 0;
  if (toolbox_is_env(t->tools) && t->spec->episode.reward == EP_REWARD_ENVIRONMENT)
    return env_rewards(t, first, n);
  struct judge_item *items = calloc((size_t)n, sizeof *items);
  struct judge_result *res = calloc((size_t)n, sizeof *res);
  char(*idbuf)[48] = calloc((size_t)n, sizeof *idbuf);
  json_t **calls = calloc((size_t)n, sizeof *calls);
  int oom = !items || !res || !idbuf || !calls;
  for (int i = 0; !oom && i < n; i++)
    calls[i] =
        single_turn_calls(t, ds_get(d, t->ros[first + i].item), t->ros[first + i].text, &oom);
  if (oom) {
    for (int i = 0; calls && i < n; i++) json_decref(calls[i]);
    free(items), free(res), free(idbuf), free(calls);
    return trainer_fail(t, FAIL_OUT_OF_MEMORY, NULL, "out of memory judging");
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
        .truncated = r->truncated,
        .tool_calls = calls[i]};
  }
  struct dapo_err e = {0};
  int rc = judge_run(t->judge, t->spec->job_id, t->step, items, n, res, st,
                     t->o ? t->o->cancel : NULL, &e);
  int stop = 0;
  if (rc && trainer_cancelled(t))
    stop = trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
  else if (rc && t->hp->on_judge_error == JUDGE_ERR_FAIL)
    stop = trainer_fail(t, FAIL_JUDGE_ERROR, "judge", "%s", e.msg);
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
    stop = trainer_log(t, "warning", "judge errors; the affected groups are dropped: %s", e.msg);
  judge_results_release(res, n);
  for (int i = 0; i < n; i++) json_decref(calls[i]);
  free(items), free(res), free(idbuf), free(calls);
  if (!stop && toolbox_is_env(t->tools)) stop = env_rewards(t, first, n);
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

/* How many of the responses list[from .. to) the micro-batch that starts at from holds: as
 * many as fit cap_tokens (>= 1: one response always fits, cap_tokens >= cap_t); their tokens in
 * *tokens. */
static int pack_size(const struct trainer *t, struct ro *const *list, int from, int to,
                     long *tokens) {
  long ntok = 0;
  int ns = 0;
  for (int i = from; i < to; i++, ns++) {
    int seq_len = t->ids_len[list[i]->item] + list[i]->seq_len;
    if (ns > 0 && ntok + seq_len > t->cap_tokens) break;
    ntok += seq_len;
  }
  *tokens = ntok;
  return ns;
}

/* The micro-batches of the responses list[0 .. k) packed in order, and their tokens (progress
 * totals, counted ahead). */
static int count_micro_batches(const struct trainer *t, struct ro *const *list, int k,
                               long *tokens) {
  int n = 0;
  *tokens = 0;
  for (int i = 0; i < k; n++) {
    long tk;
    i += pack_size(t, list, i, k, &tk);
    *tokens += tk;
  }
  return n;
}

/* Packs the responses list[from ..] that fit (pack_size) into the batch scratch; returns how
 * many were packed. */
static int pack(struct trainer *t, struct ro *const *list, int from, int to) {
  long fit_tokens;
  int fit = pack_size(t, list, from, to, &fit_tokens), ntok = 0, ns = 0;
  t->b_off[0] = 0;
  t->b_masked = 0;
  t->b_allow_ns = 0; /* the allowed ids are the new batch's (trainer_json_allowed) */
  for (int i = from; i < from + fit; i++) t->b_masked |= list[i]->trained != NULL;
  for (int i = from; i < from + fit; i++) {
    const struct ro *r = list[i];
    int pl = t->ids_len[r->item], seq_len = pl + r->seq_len;
    memcpy(t->b_tok + ntok, t->ids[r->item], sizeof(int) * (size_t)pl);
    memcpy(t->b_tok + ntok + pl, r->toks, sizeof(int) * (size_t)r->seq_len);
    if (t->b_masked) { /* only the model's own tokens of an episode are trained */
      memset(t->b_trained + ntok, 0, (size_t)pl);
      if (r->trained)
        memcpy(t->b_trained + ntok + pl, r->trained, (size_t)r->seq_len);
      else
        memset(t->b_trained + ntok + pl, 1, (size_t)r->seq_len);
    }
    t->b_plen[ns] = pl;
    t->b_ro[ns] = list[i];
    ntok += seq_len;
    t->b_off[++ns] = ntok;
  }
  return ns;
}

static int forward(struct trainer *t, struct model *m, int ns, float *ent) {
  int failed;
  struct fwd_batch b = {.n_seq = ns,
                        .tokens = t->b_tok,
                        .seq_off = t->b_off,
                        .prompt_len = t->b_plen,
                        .trained = t->b_masked ? t->b_trained : NULL,
                        .allowed = trainer_json_allowed(t, ns, &failed)};
  if (failed) return 1;
  struct dapo_err e = {0};
  if (train_forward(t->ts, m, &b, 1.0f / (float)t->hp->temperature, t->b_logp, ent, &e))
    return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
  return 0;
}

/* The log-probs of the packed micro-batch alone (b_logp), for a pass no backward follows: the
 * bits forward() gives, without the classifier's softmax pass (train_logprobs). */
static int logprobs(struct trainer *t, struct model *m, int ns) {
  int failed;
  struct fwd_batch b = {.n_seq = ns,
                        .tokens = t->b_tok,
                        .seq_off = t->b_off,
                        .prompt_len = t->b_plen,
                        .trained = t->b_masked ? t->b_trained : NULL,
                        .allowed = trainer_json_allowed(t, ns, &failed)};
  if (failed) return 1;
  struct dapo_err e = {0};
  if (train_logprobs(t->ts, m, &b, 1.0f / (float)t->hp->temperature, t->b_logp, &e))
    return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
  return 0;
}

/* Whether the step computes log-probs under a KL reference (kl_coef > 0). */
static int has_ref(const struct trainer *t) {
  return t->ref || t->ref_base;
}

/* The KL reference's forward: the frozen copy of the starting weights, or for an adapter job the
 * base itself with the adapter switched off (the same weights, no second copy). */
static int ref_forward(struct trainer *t, int ns) {
  if (t->ref) return logprobs(t, t->ref, ns);
  struct model *m = t->lm.model;
  struct lora *l = m->lora;
  m->lora = NULL;
  int rc = logprobs(t, m, ns);
  m->lora = l;
  return rc;
}

struct upd_stats {
  struct pg_stats pg;
  double ent_sum, gnorm_sum;
  long ent_tokens, n_upd;
  double mismatch_sum; /* |sampler logp - trainer logp_old| summed over tokens */
  long mismatch_n;
  long train_tokens;    /* tokens through the model in update passes (prompt + response) */
  long old_tokens;      /* tokens through the model in the old-log-prob and reference passes */
  long skipped;         /* responses of update passes not run through the model */
  double reduce_s;      /* a data-parallel job: time in the gradient sums */
  double wait_s;        /* and waiting for the slowest rank before them (the agreement point) */
  int64_t reduce_bytes; /* and the bytes each rank contributed to them */
};

/* This rank's share [*lo, *hi) of a minibatch's k responses mb: consecutive runs with about
 * equal tokens (prompt and response: what a forward and backward cost), so that no rank waits
 * long for another at the gradient sum. Rank r's share starts at the first response before
 * which at least r / N of the tokens lie. */
static void token_share(const struct trainer *t, struct ro *const *mb, int k, int *lo, int *hi) {
  int64_t r = trainer_rank(t), n = dist_size(trainer_dist(t)), total = 0, seen = 0;
  if (n <= 1) {
    *lo = 0, *hi = k;
    return;
  }
  for (int i = 0; i < k; i++) total += t->ids_len[mb[i]->item] + mb[i]->seq_len;
  *lo = *hi = k;
  for (int i = 0, at = 0; i <= k; i++) {
    /* the shares that start before response i: those whose start mark seen reaches */
    while (at <= n && seen * n >= at * total) {
      if (at == r) *lo = i;
      if (at == r + 1) *hi = i;
      at++;
    }
    if (i < k) seen += t->ids_len[mb[i]->item] + mb[i]->seq_len;
  }
  if (*hi < *lo) *hi = *lo;
}

/* Minibatch order of epoch e: a permutation of 0..n-1 from the step's stream. */
static void epoch_order(const struct trainer *t, int *order, int n, int e) {
  for (int i = 0; i < n; i++) order[i] = i;
  struct rng r;
  rng_seed(&r, t->spec->seed, trainer_stream(TAG_MB, (uint64_t)t->step, (uint64_t)e, 0));
  rng_shuffle_int(&r, order, n);
}

/* Whether the work that cannot change the update is skipped (runner_opts.compute_all: not). */
static int skipping(const struct trainer *t) {
  return !(t->o && t->o->compute_all);
}

/* Whether response r goes through the model in the update: with kl_coef 0, a response whose
 * advantage is 0 has loss weight 0 at every token (its clipped surrogate is 0 whatever the
 * ratio), so its forward and backward add exactly nothing to the gradient. */
static int runs_through_model(const struct trainer *t, const struct ro *r) {
  return !skipping(t) || t->hp->kl_coef > 0 || r->adv != 0.0;
}

/* The minibatch that starts at j0 of the epoch's order: the responses that go through the model
 * into mb (their count returned), and the loss normalisers over all its responses, skipped ones
 * included (*n_resp responses, *n_tok response tokens), so that skipping never changes them. */
static int minibatch(const struct trainer *t, struct ro **loss_ros, int n, const int *order, int j0,
                     struct ro **mb, int *n_resp, long *n_tok) {
  int mb_size = t->hp->minibatch_size, nm = n - j0 < mb_size ? n - j0 : mb_size, k = 0;
  long tot = 0;
  for (int i = 0; i < nm; i++) {
    struct ro *r = loss_ros[order[j0 + i]];
    tot += r->len;
    if (runs_through_model(t, r)) mb[k++] = r;
  }
  *n_resp = nm;
  *n_tok = tot;
  return k;
}

/* Keeps the policy's log-probs of the micro-batch just run forward (b_logp, packed as b_ro) as
 * the responses' logp_old (pass 0) or logp_ref (pass 1); for logp_old, adds |sampler - trainer|
 * to the mismatch sums. 0, or 1 out of memory. */
static int keep_logprobs(struct trainer *t, int ns, int pass, struct upd_stats *us) {
  int k = 0;
  for (int s = 0; s < ns; s++) {
    struct ro *r = t->b_ro[s];
    float **dst = pass ? &r->lp_ref : &r->lp_old;
    if (!*dst && !(*dst = malloc(sizeof(float) * (size_t)r->len))) return trainer_oom(t);
    memcpy(*dst, t->b_logp + k, sizeof(float) * (size_t)r->len);
    if (!pass)
      for (int q = 0; q < r->len; q++) {
        us->mismatch_sum += fabs((double)r->slogp[q] - (double)t->b_logp[k + q]);
        us->mismatch_n++;
      }
    k += r->len;
  }
  return 0;
}

/* logp_old (and the reference's) for every response that goes through the model, in epoch 0's
 * minibatch/micro-batch packing, so that the first minibatch's forward is bit-identical and its
 * ratio exactly 1. That first minibatch's policy pass is skipped: the weights have not moved
 * yet, so the update's own forward gives logp_old (update() keeps it); its reference pass runs. */
static int old_logprobs(struct trainer *t, struct ro **loss_ros, int n, const int *order,
                        struct ro **mb, struct upd_stats *us, struct progress *g) {
  int64_t done = 0;
  int mb_size = t->hp->minibatch_size;
  for (int j0 = 0; j0 < n; j0 += mb_size) {
    int nm;
    long tot;
    int k = minibatch(t, loss_ros, n, order, j0, mb, &nm, &tot), lo, hi;
    token_share(t, mb, k, &lo, &hi); /* the responses this rank's update will run */
    for (int i = lo; i < hi;) {
      int ns = pack(t, mb, i, hi);
      for (int pass = j0 == 0 && skipping(t) ? 1 : 0; pass < (has_ref(t) ? 2 : 1); pass++) {
        if ((pass ? ref_forward(t, ns) : logprobs(t, t->lm.model, ns)) ||
            keep_logprobs(t, ns, pass, us))
          return 1;
        us->old_tokens += t->b_off[ns];
        progress_micro(g, ++done, us->old_tokens);
      }
      i += ns;
    }
  }
  return 0;
}

/* A data-parallel job after its first minibatch (collective): each response's logp_old and
 * logp_ref were computed by the one rank whose share held it; every rank gets them all (a sum
 * where the others add zeros: exact), for the later minibatches and epochs, which other ranks
 * may run, and for the step's metrics. 0, or 1 on every rank with res set. */
static int share_logprobs(struct trainer *t, struct ro **loss_ros, int n) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return 0;
  int passes = has_ref(t) ? 2 : 1;
  size_t tot = 0;
  for (int i = 0; i < n; i++)
    if (runs_through_model(t, loss_ros[i])) tot += (size_t)loss_ros[i]->len;
  float *buf = calloc(tot * (size_t)passes + 1, sizeof *buf);
  if (trainer_agree(t, buf ? 0 : trainer_oom(t))) {
    free(buf);
    return 1;
  }
  for (int pass = 0; pass < passes; pass++) {
    float *q = buf + tot * (size_t)pass;
    for (int i = 0; i < n; i++) {
      struct ro *r = loss_ros[i];
      if (!runs_through_model(t, r)) continue;
      float *src = pass ? r->lp_ref : r->lp_old;
      if (src) memcpy(q, src, sizeof(float) * (size_t)r->len);
      q += r->len;
    }
  }
  dist_sum_f32(d, buf, tot * (size_t)passes);
  int stop = 0;
  for (int pass = 0; pass < passes && !stop; pass++) {
    const float *q = buf + tot * (size_t)pass;
    for (int i = 0; i < n && !stop; i++) {
      struct ro *r = loss_ros[i];
      if (!runs_through_model(t, r)) continue;
      float **dst = pass ? &r->lp_ref : &r->lp_old;
      if (!*dst && !(*dst = malloc(sizeof(float) * (size_t)(r->len ? r->len : 1))))
        stop = trainer_oom(t);
      else
        memcpy(*dst, q, sizeof(float) * (size_t)r->len);
      q += r->len;
    }
  }
  free(buf);
  return trainer_agree(t, stop);
}

int64_t trainer_sum_grads(struct trainer *t) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return 0;
  const struct lora *l = t->lm.model->lora;
  float *g = l ? l->grads : t->lm.model->grads;
  size_t n = l ? l->n_params : t->lm.model->n_params;
  dist_sum_f32(d, g, n);
  return (int64_t)(n * sizeof *g);
}

/* A data-parallel step's statistics, summed over the ranks (collective): the update's (each rank
 * counted its own micro-batches; the per-minibatch counts, policy/updates, the gradient norms
 * and the skipped responses, are every rank's alike) and the judge's error counts. */
static void sum_stats(struct trainer *t, struct upd_stats *us, struct judge_stats *js) {
  const struct dist *d = trainer_dist(t);
  if (dist_size(d) <= 1) return;
  double f[] = {us->pg.loss, us->pg.kl_ref_sum, us->pg.approx_kl_sum, us->pg.p_clip_high_sum,
                us->ent_sum, us->mismatch_sum};
  dist_sum_f64(d, f, sizeof f / sizeof f[0]);
  us->pg.loss = f[0], us->pg.kl_ref_sum = f[1], us->pg.approx_kl_sum = f[2];
  us->pg.p_clip_high_sum = f[3], us->ent_sum = f[4], us->mismatch_sum = f[5];
  int64_t c[12 + GE_COUNT + 2 * GRADER_MAX_USAGE] = {
      us->pg.tokens,  us->pg.clip_low,  us->pg.clip_high, us->pg.clip_dual, us->ent_tokens,
      us->mismatch_n, us->train_tokens, us->old_tokens,   js->n_timeout};
  int k = 9;
  c[k++] = js->n_http_error, c[k++] = js->n_parse_error, c[k++] = js->n_out_of_range;
  for (int g = 0; g < GE_COUNT; g++) c[k++] = js->n_grader[g];
  for (int m = 0; m < GRADER_MAX_USAGE; m++) /* every rank's judge lists the same models */
    c[k++] = js->model_tokens[m][0], c[k++] = js->model_tokens[m][1];
  dist_sum_i64(d, c, (size_t)k);
  us->pg.tokens = c[0], us->pg.clip_low = c[1], us->pg.clip_high = c[2], us->pg.clip_dual = c[3];
  us->ent_tokens = c[4], us->mismatch_n = c[5], us->train_tokens = c[6], us->old_tokens = c[7];
  js->n_timeout = (int)c[8], js->n_http_error = (int)c[9], js->n_parse_error = (int)c[10];
  js->n_out_of_range = (int)c[11];
  for (int g = 0; g < GE_COUNT; g++) js->n_grader[g] = (int)c[12 + g];
  for (int m = 0; m < GRADER_MAX_USAGE; m++) {
    js->model_tokens[m][0] = c[12 + GE_COUNT + 2 * m];
    js->model_tokens[m][1] = c[12 + GE_COUNT + 2 * m + 1];
  }
}

static int update(struct trainer *t, struct ro **loss_ros, int n, struct upd_stats *us, double lr) {
  const struct hparams *hp = t->hp;
  int mb_size = hp->minibatch_size;
  int *order = malloc(sizeof(int) * (size_t)n);
  struct ro **mb = malloc(sizeof *mb * (size_t)(mb_size < n ? mb_size : n));
  if (trainer_agree(t, order && mb ? 0 : trainer_oom(t))) {
    free(order), free(mb);
    return 1;
  }
  int stop = 0;
  /* progress totals: each pass's micro-batches counted ahead, one count per epoch's order (the
   * last counted is epoch 0's, which the old-log-prob pass and the first epoch use) */
  int64_t old_total = 0, upd_total = 0;
  double old_tokens = 0, upd_tokens = 0;
  for (int ep = hp->epochs - 1; ep >= 0; ep--) {
    epoch_order(t, order, n, ep);
    for (int j0 = 0; j0 < n; j0 += mb_size) {
      int nm, lo, hi;
      long tot, tk;
      int k = minibatch(t, loss_ros, n, order, j0, mb, &nm, &tot);
      token_share(t, mb, k, &lo, &hi);
      int c = count_micro_batches(t, mb + lo, hi - lo, &tk);
      upd_total += c, upd_tokens += tk;
      int passes = (has_ref(t) ? 2 : 1) - (j0 == 0 && skipping(t) ? 1 : 0);
      if (ep == 0) old_total += (int64_t)c * passes, old_tokens += (double)tk * passes;
    }
  }
  double params = (double)model_param_count(&t->lm.model->cfg);
  struct progress g_old, g_upd;
  progress_begin(&g_old, t, "old_logprob", 0, old_total, params * old_tokens);
  if ((stop = trainer_agree(t, old_logprobs(t, loss_ros, n, order, mb, us, &g_old)))) goto out;
  progress_begin(&g_upd, t, "update", 0, upd_total, 3 * params * upd_tokens);
  int64_t upd_done = 0;
  for (int ep = 0; ep < hp->epochs && !stop; ep++) {
    if (ep > 0) epoch_order(t, order, n, ep);
    for (int j0 = 0; j0 < n && !stop; j0 += mb_size) {
      if (trainer_cancelled(t)) stop = trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
      int nm, lo, hi;
      long tot;
      int k = minibatch(t, loss_ros, n, order, j0, mb, &nm, &tot);
      us->skipped += nm - k;
      /* a minibatch whose every response is skipped still takes its AdamW step (zero gradient:
       * the moments decay and the weights move as they would have) */
      model_zero_grads(t->lm.model);
      token_share(t, mb, k, &lo, &hi); /* a data-parallel job's rank runs its share */
      for (int i = lo; i < hi && !stop;) {
        int ns = pack(t, mb, i, hi);
        if ((stop = forward(t, t->lm.model, ns, ep == 0 ? t->b_ent : NULL))) break;
        /* the first minibatch of epoch 0: this forward is the old policy's (old_logprobs) */
        if (ep == 0 && j0 == 0 && skipping(t) && (stop = keep_logprobs(t, ns, 0, us))) break;
        /* per-response arrays of this micro-batch, tokens concatenated */
        int q0 = 0;
        for (int s = 0; s < ns; s++) {
          const struct ro *r = t->b_ro[s];
          t->mb_len[s] = r->len;
          t->mb_adv[s] = r->adv;
          memcpy(t->b_old + q0, r->lp_old, sizeof(float) * (size_t)r->len);
          if (has_ref(t)) memcpy(t->b_ref + q0, r->lp_ref, sizeof(float) * (size_t)r->len);
          if (ep == 0)
            for (int q = 0; q < r->len; q++) us->ent_sum += t->b_ent[q0 + q];
          q0 += r->len;
        }
        if (ep == 0) us->ent_tokens += q0;
        dapo_token_weights(hp, ns, t->mb_len, t->mb_adv, t->b_logp, t->b_old,
                           has_ref(t) ? t->b_ref : NULL, nm, tot, t->b_w, &us->pg);
        us->train_tokens += t->b_off[ns];
        struct dapo_err e = {0};
        if (train_backward(t->ts, t->lm.model, t->b_w, &e)) {
          stop = trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
          break;
        }
        progress_micro(&g_upd, ++upd_done, us->train_tokens);
        i += ns;
      }
      /* every rank's gradient summed; every rank then takes the same AdamW step */
      double r0 = now_s();
      if ((stop = trainer_agree(t, stop))) break;
      double r1 = now_s();
      us->reduce_bytes += trainer_sum_grads(t);
      us->wait_s += r1 - r0;
      us->reduce_s += now_s() - r1;
      if (ep == 0 && j0 == 0 && (stop = share_logprobs(t, loss_ros, n))) break;
      double gn = 0;
      struct dapo_err e = {0};
      if (adamw_step(&t->opt, t->lm.model, (float)lr, &gn, &e)) {
        stop =
            trainer_fail(t, FAIL_NON_FINITE_GRADIENT, NULL, "step %" PRId64 ": %s", t->step, e.msg);
        break;
      }
      us->gnorm_sum += gn;
      us->n_upd++;
    }
  }
out:
  free(order), free(mb);
  return stop;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

int trainer_evaluate(struct trainer *t) {
  const struct hparams *hp = t->hp;
  if (!t->val) return 0;
  trainer_phase(t, "evaluating");
  int n = ds_count(t->val);
  if (hp->eval_max_prompts > 0 && hp->eval_max_prompts < n) n = hp->eval_max_prompts;
  int k = hp->eval_samples;
  int *items = malloc(sizeof(int) * (size_t)n);
  if (trainer_agree(t, items ? 0 : trainer_oom(t))) {
    free(items);
    return 1;
  }
  for (int i = 0; i < n; i++) items[i] = i;
  struct sampler_opts so = t->so;
  so.temperature = (float)hp->eval_temperature;
  so.top_p = (float)hp->eval_top_p;
  int first = t->n_ro, ntok = 0, lo, hi;
  double t0 = now_s();
  /* the validation rollouts borrow the step's array after the training ones; a data-parallel
   * job's rank evaluates its share of the prompts */
  trainer_share(t, n, &lo, &hi);
  int stop = generate(t, t->val, hi - lo, items + lo, t->vids, t->vids_len, k, &so, TAG_EVAL, 0, lo,
                      lo, -1, "evaluation", &ntok);
  free(items);
  struct judge_stats st = {0};
  if (!stop) stop = judge_range(t, t->val, first, t->n_ro - first, &st);
  if (trainer_agree(t, stop)) return 1;
  shape_rewards(t, first, t->n_ro - first);
  double acc = 0, passk = 0, len = 0;
  for (int p = 0; p < hi - lo; p++) {
    int c = 0;
    for (int i = 0; i < k; i++) {
      const struct ro *r = &t->ros[first + p * k + i];
      c += r->judged && r->correct > 0;
      len += r->len;
    }
    acc += (double)c / k;
    passk += dapo_pass_at_k(k, c, k);
  }
  double sums[3] = {acc, passk, len};
  dist_sum_f64(trainer_dist(t), sums, 3);
  acc = sums[0], passk = sums[1], len = sums[2];
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
  return trainer_agree(t, trainer_emit_metrics(t, m, 1, 0, 0));
}

/* ---- one step -------------------------------------------------------------------------------- */

/* A multi-turn step's episode metrics (docs/AGENTS.md), over every episode sampled: turns,
 * tool calls or environment steps, the model's and the world's tokens per episode, the tools' or
 * the environment's latency, their errors by kind, the environment's rewards, and how the
 * episodes ended. */
static void put_episode_metrics(const struct trainer *t, json_t *m) {
  long turns = 0, calls = 0, world = 0, model = 0, steps = 0, failed = 0, fin[EPF_COUNT] = {0};
  long errs[TOOL_ERR_COUNT] = {0}, answered = 0;
  double ms = 0, env_reward = 0;
  for (int i = 0; i < t->n_ro; i++) {
    const struct ro *r = &t->ros[i];
    turns += r->es.turns, calls += r->es.tool_calls, world += r->es.world_tokens;
    model += r->len, ms += r->es.tool_ms;
    steps += r->es.env_steps, env_reward += r->es.env_reward, failed += r->es.env_failed;
    fin[r->finish]++;
    for (int k = 0; k < TOOL_ERR_COUNT; k++) errs[k] += r->es.tool_errors[k];
  }
  for (int k = 0; k < TOOL_ERR_COUNT; k++) answered += errs[k];
  double n = t->n_ro ? t->n_ro : 1;
  int env = toolbox_is_env(t->tools);
  json_object_set_new(m, "episode/turns_mean", json_real(turns / n));
  json_object_set_new(m, "episode/model_tokens_mean", json_real(model / n));
  json_object_set_new(m, "episode/world_tokens_mean", json_real(world / n));
  for (int f = EPF_STOP; f < EPF_COUNT; f++) {
    if (!env && f >= EPF_DONE) continue; /* only an environment ends episodes so */
    char key[64];
    snprintf(key, sizeof key, "episode/finish/%s_frac", ep_finish_name((enum ep_finish)f));
    json_object_set_new(m, key, json_real(fin[f] / n));
  }
  /* a tool's errors are "tool/errors/timeout", an environment's "env/errors/env_timeout" (as
   * the judge's are "judge/errors/judge_timeout") */
  const char *who = env ? "env" : "tool";
  if (env) {
    json_object_set_new(m, "env/steps_mean", json_real(steps / n));
    json_object_set_new(m, "env/reward_mean", json_real(env_reward / n));
    json_object_set_new(m, "env/failed_episodes", json_integer(failed));
  } else {
    json_object_set_new(m, "episode/tool_calls_mean", json_real(calls / n));
  }
  char key[64];
  snprintf(key, sizeof key, "%s/latency_ms_mean", who);
  json_object_set_new(m, key, json_real(answered ? ms / answered : 0));
  for (int k = 1; k < TOOL_ERR_COUNT; k++) {
    if (env && k != TOOL_TIMEOUT && k != TOOL_HTTP_ERROR && k != TOOL_PARSE_ERROR) continue;
    snprintf(key, sizeof key, "%s/errors/%s%s", who, env ? "env_" : "",
             tool_err_name((enum tool_err)k));
    json_object_set_new(m, key, json_integer(errs[k]));
  }
}

static int cmp_ro_ptr(const void *a, const void *b) {
  const struct ro *x = *(struct ro *const *)a, *y = *(struct ro *const *)b;
  return x < y ? -1 : x > y;
}

/* One step: sample groups (dynamic sampling: rounds until prompt_batch_size groups with mixed
 * rewards are kept, or max_gen_batches), judge, shape rewards and advantages, then the update's
 * epochs of minibatches. Its metrics into *metrics_out (owned) and its token counts into
 * *gen_tokens and *train_tokens. STEP_OK, STEP_PAUSED (a pause between rounds; nothing trained),
 * or STEP_STOP with res set. */
int trainer_step(struct trainer *t, json_t **metrics_out, int64_t *gen_tokens_out,
                 int64_t *train_tokens_out) {
  const struct hparams *hp = t->hp;
  const int G = hp->group_size, want = hp->prompt_batch_size;
  double t_step = now_s(), t_gen = 0, t_judge = 0;
  trainer_clear_rollouts(t);
  struct judge_stats js = {0};
  int rounds = 0, kept_groups = 0, sampled_groups = 0, all_correct = 0, all_wrong = 0;
  int gen_tokens = 0;
  struct ds_cursor cur0 = t->cursor;
  int n_prompts = hp->dynamic_sampling ? want * hp->gen_batch_multiplier : want;
  int max_rounds = hp->dynamic_sampling ? hp->max_gen_batches : 1;
  int *items = malloc(sizeof(int) * (size_t)n_prompts);
  /* a rank that fails alone tells the others at the next collective: here, before any */
  if (trainer_agree(t, items ? 0 : trainer_oom(t))) {
    free(items);
    return STEP_STOP;
  }

  for (int r = 0; r < max_rounds && kept_groups < want; r++) {
    int req = trainer_requests(t);
    if (req & TRAINER_CANCEL) {
      free(items);
      return trainer_fail(t, FAIL_CANCELLED, NULL, "cancelled");
    }
    if (req & TRAINER_PAUSE) { /* nothing trained yet this step: abandon it */
      free(items);
      t->cursor = cur0;
      return STEP_PAUSED;
    }
    trainer_phase(t, "sampling");
    double t0 = now_s();
    for (int i = 0; i < n_prompts; i++) items[i] = ds_next(t->train, &t->cursor);
    int first = t->n_ro, lo, hi, unused = 0;
    /* a data-parallel job's rank samples, judges and shapes its share of the round's groups */
    trainer_share(t, n_prompts, &lo, &hi);
    int stop = generate(t, t->train, hi - lo, items + lo, t->ids, t->ids_len, G, &t->so, TAG_GEN,
                        (uint64_t)r, lo, sampled_groups + lo, r, "generation", &unused);
    t_gen += now_s() - t0;
    trainer_phase(t, "judging");
    t0 = now_s();
    if (!stop) stop = judge_range(t, t->train, first, t->n_ro - first, &js);
    t_judge += now_s() - t0;
    if (!stop) shape_rewards(t, first, t->n_ro - first);
    if (exchange(t, first, stop)) {
      free(items);
      return STEP_STOP;
    }
    for (int i = first; i < t->n_ro; i++) gen_tokens += t->ros[i].len;
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
      double rw[HPARAMS_GROUP_SIZE_MAX], adv[HPARAMS_GROUP_SIZE_MAX];
      int inc[HPARAMS_GROUP_SIZE_MAX]; /* G <= HPARAMS_GROUP_SIZE_MAX: hparams_parse's bound */
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
  int stop = 0;
  if (kept_groups < want) {
    if (hp->on_sampling_shortfall == SHORTFALL_ERROR)
      stop =
          trainer_fail(t, FAIL_SAMPLING_SHORTFALL, "hyperparameters.max_gen_batches",
                       "step %" PRId64 ": dynamic sampling kept %d of %d groups after %d rounds "
                       "(%d groups sampled); raise gen_batch_multiplier or max_gen_batches, or set "
                       "on_sampling_shortfall to \"partial\"",
                       t->step, kept_groups, want, rounds, sampled_groups);
    else
      stop = trainer_log(t, "warning",
                         "step %" PRId64 ": dynamic sampling kept %d of %d groups after %d rounds "
                         "(%d sampled); training on what was kept",
                         t->step, kept_groups, want, rounds, sampled_groups);
  }
  if (trainer_agree(t, stop)) return STEP_STOP;

  /* the update */
  trainer_phase(t, "updating");
  double t0 = now_s();
  int n_loss = 0;
  for (int i = 0; i < t->n_ro; i++) n_loss += t->ros[i].in_loss;
  struct ro **loss_ros = malloc(sizeof *loss_ros * (size_t)(n_loss ? n_loss : 1));
  if (trainer_agree(t, loss_ros ? 0 : trainer_oom(t))) {
    free(loss_ros);
    return STEP_STOP;
  }
  for (int i = 0, k = 0; i < t->n_ro; i++)
    if (t->ros[i].in_loss) loss_ros[k++] = &t->ros[i];
  qsort(loss_ros, (size_t)n_loss, sizeof *loss_ros, cmp_ro_ptr);
  struct upd_stats us = {0};
  double lr = adamw_lr_at(&t->opt.cfg, t->step - 1);
  if (n_loss > 0 && update(t, loss_ros, n_loss, &us, lr)) {
    free(loss_ros);
    return STEP_STOP;
  }
  free(loss_ros);
  double t_train = now_s() - t0;
  sum_stats(t, &us, &js);

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
  if (has_ref(t)) PUT_R("policy/kl_ref", us.pg.tokens ? us.pg.kl_ref_sum / us.pg.tokens : 0);
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
  PUT_I("tokens/old_logprob", us.old_tokens);
  PUT_I("policy/responses_skipped", us.skipped);
  PUT_R("throughput/gen_tokens_per_s", t_gen > 0 ? gen_tokens / t_gen : 0);
  PUT_R("throughput/train_tokens_per_s", t_train > 0 ? us.train_tokens / t_train : 0);
  PUT_R("judge/seconds", t_judge);
  PUT_I("judge/errors/judge_timeout", js.n_timeout);
  PUT_I("judge/errors/judge_http_error", js.n_http_error);
  PUT_I("judge/errors/judge_parse_error", js.n_parse_error);
  PUT_I("judge/errors/reward_out_of_range", js.n_out_of_range);
  if (judge_grades(t->judge)) /* OpenAI's grader error taxonomy: samples that hit each */
    for (int k = 0; k < GE_COUNT; k++) {
      char key[64];
      snprintf(key, sizeof key, "judge/errors/%s", grader_err_name(k));
      PUT_I(key, js.n_grader[k]);
    }
  { /* the judge models' tokens: judge/tokens/<model>/prompt, .../completion */
    const char *names[GRADER_MAX_USAGE];
    int nm = judge_models_used(t->judge, names);
    for (int k = 0; k < nm; k++)
      for (int w = 0; w < 2; w++) {
        char key[160];
        snprintf(key, sizeof key, "judge/tokens/%.96s/%s", names[k], w ? "completion" : "prompt");
        PUT_I(key, js.model_tokens[k][w]);
      }
  }
  PUT_R("time/generation_s", t_gen);
  PUT_R("time/training_s", t_train);
  PUT_R("time/step_s", step_s);
  if (episode_multi(&t->spec->episode)) put_episode_metrics(t, m);
  if (dist_size(trainer_dist(t)) > 1) { /* a data-parallel job's (docs/SCALE.md) */
    PUT_I("dist/ranks", dist_size(trainer_dist(t)));
    PUT_I("dist/allreduce_bytes", us.reduce_bytes);
    PUT_R("time/allreduce_s", us.reduce_s);
    PUT_R("time/rank_wait_s", us.wait_s);
  }
#undef PUT_R
#undef PUT_I
  *metrics_out = m;
  *gen_tokens_out = gen_tokens;
  *train_tokens_out = us.train_tokens;
  return STEP_OK;
}
