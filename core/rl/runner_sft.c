/* A supervised job's run (issue 27; docs/TRAINING.md "Supervised fine-tuning"): the examples of
 * its files encoded once (sft.h), then per step batch_size of them in an epoch-wise shuffled
 * order, packed into micro-batches of micro_batch_tokens, the token mean of -log p over the
 * batch's trained tokens minimised by one AdamW step; checkpoints, pause and resume as DAPO
 * jobs (the order is a function of the step, so a resumed run is the straight one).
 * Data-parallel over N ranks (docs/SCALE.md): each rank runs its consecutive share of the
 * step's examples (of the validation file's), divided by the whole step's trained tokens; the
 * gradients and sums are summed over the ranks and every rank takes the same AdamW step. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "runner_impl.h"

#define TAG_SFT_ORDER 0x5346544f52444552ULL /* "SFTORDER" */

int trainer_sft_chat(const struct job_spec *s, const struct lm *lm, struct chat_template **chat,
                     struct dapo_err *e) {
  *chat = NULL;
  if (!s->chat_template && !lm->tok_config) return 0;
  struct dapo_err ignored = {0};
  *chat = chat_from_spec(s->chat_template, lm->tok_config, s->chat_template ? e : &ignored);
  return !*chat && s->chat_template ? DAPO_EINVAL : 0;
}

int trainer_sft_end_id(const struct lm *lm) {
  return lm->n_stop > 0 ? lm->stop_ids[0] : tok_eos_id(lm->tok);
}

/* The longest example of x[0 .. n). */
static int longest(const struct sft_example *x, int n) {
  int m = 0;
  for (int i = 0; i < n; i++)
    if (x[i].n > m) m = x[i].n;
  return m;
}

int trainer_demo_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors,
                            trainer_demo_load load, const char *too_long) {
  size_t before = json_array_size(errors);
  struct lm lm;
  struct dapo_err e = {0};
  if (trainer_open_meta(s, f, &lm, errors)) return (int)(json_array_size(errors) - before);
  struct chat_template *chat = NULL;
  if (trainer_sft_chat(s, &lm, &chat, &e)) dapo_errors_add(errors, "chat_template", e.msg);
  const char *files[2] = {s->training_file, s->validation_file};
  const char *names[2] = {"training_file", "validation_file"};
  for (int k = 0; k < 2 && json_array_size(errors) == before; k++) {
    if (!files[k]) continue;
    int n = 0, seq = 0, packed = 0;
    if (load(files[k], &lm, chat, trainer_sft_end_id(&lm), &s->hp, &n, &seq, &packed, &e))
      dapo_errors_add(errors, names[k], e.msg);
    if (seq > lm.cfg.max_position_embeddings) dapo_errors_add(errors, names[k], too_long);
    if (packed > f->max_prompt_tokens) f->max_prompt_tokens = packed;
    if (k == 0) f->train_examples = n;
  }
  chat_free(chat);
  lm_close(&lm);
  return (int)(json_array_size(errors) - before);
}

/* trainer_demo_load for supervised lines: an example is one sequence, packed as it is. */
static int sft_sizes(const char *path, const struct lm *lm, const struct chat_template *chat,
                     int end_id, const struct hparams *hp, int *n, int *seq, int *packed,
                     struct dapo_err *e) {
  struct sft_example *x = NULL;
  int rc = sft_load_file(path, lm, chat, end_id, hp->max_sequence_tokens, hp->truncate, &x, n, e);
  *seq = *packed = longest(x, *n);
  sft_examples_free(x, *n);
  return rc;
}

int sft_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors) {
  return trainer_demo_check_data(s, f, errors, sft_sizes,
                                 "an example is longer than the model's context");
}

void trainer_sft_epoch_order(struct trainer *t, int epoch, int n) {
  if (t->sft_order_epoch == epoch) return;
  for (int i = 0; i < n; i++) t->sft_order[i] = i;
  struct rng r;
  rng_seed(&r, t->spec->seed, trainer_stream(TAG_SFT_ORDER, (uint64_t)epoch, 0, 0));
  rng_shuffle_int(&r, t->sft_order, n);
  t->sft_order_epoch = epoch;
}

int64_t trainer_sft_epoch_steps(const struct trainer *t) {
  int n = t->hp->method == METHOD_DPO ? t->n_dpo_train : t->n_sft_train, bs = t->hp->batch_size;
  return (n + bs - 1) / bs;
}

int trainer_sft_full_valid(const struct trainer *t, json_t *m) {
  if (!t->eval_epoch_end) return 0;
  json_t *full = json_object();
  const char *k;
  json_t *v;
  json_object_foreach(m, k, v) {
    char key[96];
    if (strncmp(k, "valid/", 6)) continue;
    snprintf(key, sizeof key, "full_%s", k);
    if (!full || json_object_set(full, key, v)) return json_decref(full), 1;
  }
  int rc = json_object_update(m, full);
  json_decref(full);
  return rc ? 1 : 0;
}

/* Sums over examples idx[0 .. n) of x: -log p and argmax hits of their trained tokens; with
 * train, the gradient of the token mean over `scale` tokens (dlogp = -1 / scale) accumulated.
 * Micro-batches of at most micro_batch_tokens (an example longer alone). 0, or 1 with res. */
static int pass(struct trainer *t, const struct sft_example *x, const int *idx, int n, int train,
                double scale, double *nll, int64_t *hits, int64_t *tokens) {
  struct dapo_err e = {0};
  for (int i = 0; i < n;) {
    int ns = 0, nt = 0;
    t->b_off[0] = 0;
    while (i + ns < n) {
      const struct sft_example *ex = &x[idx[i + ns]];
      if (ns && nt + ex->n > t->hp->micro_batch_tokens) break;
      memcpy(t->b_tok + nt, ex->tokens, sizeof(int) * (size_t)ex->n);
      memcpy(t->b_trained + nt, ex->trained, (size_t)ex->n);
      int first = 0;
      while (first < ex->n && !ex->trained[first]) first++;
      t->b_plen[ns] = first;
      nt += ex->n;
      t->b_off[++ns] = nt;
    }
    struct fwd_batch b = {ns, t->b_tok, t->b_off, t->b_plen, t->b_trained, NULL, NULL};
    int R = fwd_batch_resp_tokens(&b);
    if (train_forward(t->ts, t->lm.model, &b, 1.0f, t->sft_logp, NULL, &e) ||
        train_argmax_hits(t->ts, t->sft_hit, &e))
      return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
    for (int r = 0; r < R; r++) {
      *nll -= t->sft_logp[r];
      *hits += t->sft_hit[r];
      t->sft_logp[r] = (float)(-1.0 / scale); /* now dlogp */
    }
    *tokens += R;
    if (train && train_backward(t->ts, t->lm.model, t->sft_logp, &e))
      return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
    i += ns;
  }
  return 0;
}

/* pass over this rank's share of idx[0 .. n) (trainer_share; all of it alone), then the sums and
 * with train the gradient summed over the ranks (collective), so that every rank holds the whole
 * step's, as one process computes them (in another order). 0, or 1 on every rank with res. */
static int share_pass(struct trainer *t, const struct sft_example *x, const int *idx, int n,
                      int train, double scale, double *nll, int64_t *hits, int64_t *tokens) {
  int lo, hi;
  trainer_share(t, n, &lo, &hi);
  if (trainer_agree(t, pass(t, x, idx + lo, hi - lo, train, scale, nll, hits, tokens))) return 1;
  const struct dist *d = trainer_dist(t);
  int64_t c[2] = {*hits, *tokens};
  dist_sum_f64(d, nll, 1);
  dist_sum_i64(d, c, 2);
  *hits = c[0], *tokens = c[1];
  if (train) trainer_sum_grads(t);
  return 0;
}

int trainer_sft_step(struct trainer *t, json_t **out, int64_t *train_tokens_out) {
  const struct hparams *hp = t->hp;
  trainer_phase(t, "updating");
  int n = t->n_sft_train, bs = hp->batch_size;
  int per_epoch = (n + bs - 1) / bs;
  int64_t k = t->step - 1;
  int epoch = (int)(k / per_epoch), lo = (int)(k % per_epoch) * bs;
  int hi = lo + bs < n ? lo + bs : n;
  trainer_sft_epoch_order(t, epoch, n);
  t->cursor.epoch = epoch;
  t->cursor.pos = hi;
  int64_t ntr = 0;
  for (int i = lo; i < hi; i++) ntr += t->sft_train[t->sft_order[i]].n_trained;
  model_zero_grads(t->lm.model); /* an adapter's too, as the DAPO update opens its window */
  double nll = 0;
  int64_t hits = 0, tokens = 0;
  if (share_pass(t, t->sft_train, t->sft_order + lo, hi - lo, 1, (double)ntr, &nll, &hits, &tokens))
    return 1;
  double lr = hparams_lr_at(hp, t->step - 1, t->sft_total_steps), gn = 0;
  struct dapo_err e = {0};
  if (adamw_step(&t->opt, t->lm.model, (float)lr, &gn, &e))
    return trainer_fail(t, FAIL_NON_FINITE_GRADIENT, NULL, "step %" PRId64 ": %s", t->step, e.msg);
  *train_tokens_out = tokens;
  *out = json_pack("{s:I,s:I,s:f,s:f,s:I,s:I,s:f,s:f,s:I}", "step", (json_int_t)t->step,
                   "total_steps", (json_int_t)t->sft_total_steps, "train/loss",
                   nll / (double)tokens, "train/mean_token_accuracy", (double)hits / (double)tokens,
                   "train/tokens", (json_int_t)tokens, "train/examples", (json_int_t)(hi - lo),
                   "learning_rate", lr, "grad_norm", gn, "epoch", (json_int_t)epoch);
  return *out ? 0 : trainer_oom(t);
}

int trainer_sft_evaluate(struct trainer *t) {
  if (!t->n_sft_val) return 0;
  trainer_phase(t, "evaluating");
  int *idx = malloc(sizeof(int) * (size_t)t->n_sft_val);
  if (!idx) return trainer_agree(t, trainer_oom(t)); /* meets share_pass's */
  for (int i = 0; i < t->n_sft_val; i++) idx[i] = i;
  double nll = 0;
  int64_t hits = 0, tokens = 0;
  int rc = share_pass(t, t->sft_val, idx, t->n_sft_val, 0, 1.0, &nll, &hits, &tokens);
  free(idx);
  if (rc) return 1;
  json_t *m = json_pack("{s:I,s:f,s:f,s:I}", "step", (json_int_t)t->step, "valid/loss",
                        nll / (double)tokens, "valid/mean_token_accuracy",
                        (double)hits / (double)tokens, "valid/tokens", (json_int_t)tokens);
  if (m && trainer_sft_full_valid(t, m)) json_decref(m), m = NULL;
  /* agreed as DAPO's evaluation: rank 0 alone writes them */
  return trainer_agree(t, m ? trainer_emit_metrics(t, m, 1, 0, 0) : trainer_oom(t));
}

int trainer_sft_begin(struct trainer *t, int64_t from) {
  struct dapo_err e = {0};
  if (trainer_setup_model(t, from)) return 1;
  if (trainer_sft_chat(t->spec, &t->lm, &t->chat, &e))
    return trainer_fail(t, FAIL_INVALID_CHAT_TEMPLATE, "chat_template", "%s", e.msg);
  return 0;
}

int trainer_sft_setup(struct trainer *t, int64_t from) {
  struct dapo_err e = {0};
  const struct hparams *hp = t->hp;
  if (trainer_sft_begin(t, from)) return 1;
  int end = trainer_sft_end_id(&t->lm);
  if (sft_load_file(t->spec->training_file, &t->lm, t->chat, end, hp->max_sequence_tokens,
                    hp->truncate, &t->sft_train, &t->n_sft_train, &e))
    return trainer_fail(t, FAIL_INVALID_DATASET, "training_file", "training_file %s", e.msg);
  if (t->spec->validation_file &&
      sft_load_file(t->spec->validation_file, &t->lm, t->chat, end, hp->max_sequence_tokens,
                    hp->truncate, &t->sft_val, &t->n_sft_val, &e))
    return trainer_fail(t, FAIL_INVALID_DATASET, "validation_file", "validation_file %s", e.msg);
  int m = longest(t->sft_train, t->n_sft_train), mv = longest(t->sft_val, t->n_sft_val);
  if (mv > m) m = mv;
  if (m > t->lm.cfg.max_position_embeddings)
    return trainer_fail(t, FAIL_PROMPT_TOO_LONG, "training_file",
                        "an example of %d tokens exceeds the model's context (%d)", m,
                        t->lm.cfg.max_position_embeddings);
  t->sft_total_steps = hparams_sft_total_steps(hp, t->n_sft_train);
  return trainer_sft_buffers(t, hp->micro_batch_tokens > m ? hp->micro_batch_tokens : m, m,
                             t->n_sft_train);
}

int trainer_sft_buffers(struct trainer *t, int cap, int longest, int n_order) {
  struct dapo_err e = {0};
  t->cap_t = longest;
  t->cap_tokens = cap;
  t->b_tok = malloc(sizeof(int) * (size_t)cap);
  t->b_off = malloc(sizeof(int) * ((size_t)cap + 1));
  t->b_plen = malloc(sizeof(int) * (size_t)cap);
  t->b_trained = malloc((size_t)cap);
  t->sft_logp = malloc(sizeof(float) * (size_t)cap);
  t->sft_hit = malloc((size_t)cap);
  t->sft_order = malloc(sizeof(int) * (size_t)n_order);
  t->sft_order_epoch = -1;
  if (!t->b_tok || !t->b_off || !t->b_plen || !t->b_trained || !t->sft_logp || !t->sft_hit ||
      !t->sft_order)
    return trainer_oom(t);
  if (!(t->ts = train_state_new(t->lm.model, cap, cap, longest, &e)) ||
      (t->o && t->o->pool && train_state_set_pool(t->ts, t->o->pool, &e)))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  return 0;
}

void trainer_sft_teardown(struct trainer *t) {
  sft_examples_free(t->sft_train, t->n_sft_train);
  sft_examples_free(t->sft_val, t->n_sft_val);
  free(t->sft_order), free(t->sft_logp), free(t->sft_hit);
  free(t->b_tok), free(t->b_off), free(t->b_plen), free(t->b_trained);
  train_state_free(t->ts);
  if (t->have_opt) adamw_deinit(&t->opt);
  model_free(t->ref);
  lm_close(&t->lm);
  chat_free(t->chat);
}
