/* A DPO job's run (issue 27; docs/TRAINING.md "DPO"): the pairs of its files encoded once
 * (dpo.h), the reference's sequence log-probs computed once before step 1 (the starting weights;
 * with an adapter the base with the adapter switched off) and kept in the out folder, so that a
 * resumed run reads the very bits a straight one uses; then per step batch_size pairs in an
 * epoch-wise shuffled order (as a supervised job's), each pair's two sequences in one
 * micro-batch, DPO's loss (loss_type: sigmoid, hinge, ipo, robust) minimised by one AdamW step.
 * Checkpoints, pause and resume as DAPO jobs. Data-parallel over N ranks (docs/SCALE.md) as a
 * supervised job: each rank its share of the step's pairs (of the reference's pass, gathered; of
 * the validation), the mean over the whole step's pairs, gradients and sums summed over the ranks;
 * rank 0 writes the reference's file, and on resume reads it and sends it to the others.
 *
 * A pair goes through the model as [prompt, chosen] and [rejected] continuing the first's prompt
 * (fwd_batch.prefix_of): its prompt's rows once, in every pass (reference, training, validation),
 * where PyTorch and TRL run the prompt twice. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner_impl.h"

/* The file of the reference's log-probs in the out folder: REF_MAGIC, the pair counts of the
 * training and validation files (two int64), then their 2 n doubles each, host byte order. */
#define REF_FILE "dpo_reference.bin"
static const char REF_MAGIC[8] = "DPOREF1";

/* Whether pair p's rejected sequence continues the chosen one's prompt (not when it has no
 * token of its own). */
static int shares_prompt(const struct dpo_pair *p) {
  return p->n_resp[1] > 0;
}

/* Tokens of pair p through the model: its prompt once, each response once. */
static int pair_tokens(const struct dpo_pair *p) {
  return (shares_prompt(p) ? 1 : 2) * p->n_prompt + p->n_resp[0] + p->n_resp[1];
}

static void longest(const struct dpo_pair *p, int n, int *pair, int *seq) {
  for (int i = 0; i < n; i++) {
    if (pair_tokens(&p[i]) > *pair) *pair = pair_tokens(&p[i]);
    for (int w = 0; w < 2; w++)
      if (p[i].n_prompt + p[i].n_resp[w] > *seq) *seq = p[i].n_prompt + p[i].n_resp[w];
  }
}

/* trainer_demo_load for DPO lines: a pair is packed whole (its prompt once, each response
 * once); the model sees a prompt and one response at a time. */
static int dpo_sizes(const char *path, const struct lm *lm, const struct chat_template *chat,
                     int end_id, const struct hparams *hp, int *n, int *seq, int *packed,
                     struct dapo_err *e) {
  struct dpo_pair *p = NULL;
  int rc = dpo_load_file(path, lm, chat, end_id, hp->max_sequence_tokens, hp->truncate, &p, n, e);
  longest(p, *n, packed, seq);
  dpo_pairs_free(p, *n);
  return rc;
}

int dpo_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors) {
  return trainer_demo_check_data(s, f, errors, dpo_sizes,
                                 "a prompt and response are longer than the model's context");
}

/* What a pass adds up over its pairs. */
struct dpo_sums {
  double loss, chosen, rejected, margin, lp_chosen, lp_rejected;
  int64_t correct, pairs, tokens;
};

enum { PASS_REF, PASS_EVAL, PASS_TRAIN };

/* log sigmoid(x), without overflow. */
static double log_sigmoid(double x) {
  return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

/* The loss of one pair at z = beta h (hparams.h, enum dpo_loss) and its derivative in z (*dz),
 * label smoothing ls; ipo's h is of averaged log-probs (the caller's). */
static double dpo_loss(int type, double beta, double ls, double z, double *dz) {
  switch (type) {
  case DPO_LOSS_HINGE: /* max(0, 1 - z); the derivative at the kink is 0, as relu's */
    *dz = z < 1 ? -1 : 0;
    return z < 1 ? 1 - z : 0;
  case DPO_LOSS_IPO: { /* (h - 1/(2 beta))^2 */
    double d = z / beta - 1 / (2 * beta);
    *dz = 2 * d / beta;
    return d * d;
  }
  case DPO_LOSS_ROBUST: /* (-(1 - ls) log s(z) + ls log s(-z)) / (1 - 2 ls) */
    *dz = (-(1 - ls) * exp(log_sigmoid(-z)) - ls * exp(log_sigmoid(z))) / (1 - 2 * ls);
    return (-(1 - ls) * log_sigmoid(z) + ls * log_sigmoid(-z)) / (1 - 2 * ls);
  default: /* sigmoid: -(1 - ls) log s(z) - ls log s(-z) */
    *dz = -(1 - ls) * exp(log_sigmoid(-z)) + ls * exp(log_sigmoid(z));
    return -(1 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
  }
}

/* Over pairs idx[0 .. n) of p, micro-batches of whole pairs (at most micro_batch_tokens; a pair
 * longer alone) through model m:
 *   PASS_REF: each pair's sequence log-probs into ref[2 i], ref[2 i + 1] (no backward);
 *   PASS_EVAL: the loss and rewards against ref, summed into st;
 *   PASS_TRAIN: the same, and the gradient of the loss's mean over `scale` pairs accumulated.
 * The sequence log-prob is the sum over the response's tokens (its end token included), in
 * double. 0, or 1 with res. */
static int pass(struct trainer *t, struct model *m, const struct dpo_pair *p, double *ref,
                const int *idx, int n, int mode, double scale, struct dpo_sums *st) {
  struct dapo_err e = {0};
  const double beta = t->hp->beta, ls = t->hp->label_smoothing;
  for (int i = 0; i < n;) {
    int np = 0, ns = 0, nt = 0;
    t->b_off[0] = 0;
    int64_t counted = 0; /* train/tokens: each pair's prompt twice, as TRL counts them */
    while (i + np < n) {
      const struct dpo_pair *x = &p[idx[i + np]];
      if (np && nt + pair_tokens(x) > t->hp->micro_batch_tokens) break;
      for (int w = 0; w < 2; w++) { /* the rejected continues the chosen's prompt */
        int cont = w && shares_prompt(x), pl = cont ? 0 : x->n_prompt;
        memcpy(t->b_tok + nt, x->prompt, sizeof(int) * (size_t)pl);
        memcpy(t->b_tok + nt + pl, x->resp[w], sizeof(int) * (size_t)x->n_resp[w]);
        t->b_plen[ns] = x->n_prompt;
        t->dpo_prefix_of[ns] = cont ? ns - 1 : -1;
        nt += pl + x->n_resp[w];
        t->b_off[++ns] = nt;
      }
      counted += 2 * x->n_prompt + x->n_resp[0] + x->n_resp[1];
      np++;
    }
    struct fwd_batch b = {ns, t->b_tok, t->b_off, t->b_plen, NULL, NULL, t->dpo_prefix_of};
    int rc = mode == PASS_TRAIN ? train_forward(t->ts, m, &b, 1.0f, t->sft_logp, NULL, &e)
                                : train_logprobs(t->ts, m, &b, 1.0f, t->sft_logp, &e);
    if (rc) return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
    for (int k = 0, r = 0; k < np; k++) {
      const struct dpo_pair *x = &p[idx[i + k]];
      double lp[2] = {0, 0};
      int r0 = r;
      for (int w = 0; w < 2; w++)
        for (int j = 0; j < x->n_resp[w]; j++) lp[w] += t->sft_logp[r++];
      double *rf = ref + 2 * (size_t)idx[i + k], dz;
      if (mode == PASS_REF) {
        rf[0] = lp[0], rf[1] = lp[1];
        continue;
      }
      /* IPO's log-probs are averages over each response's tokens (TRL's), the others sums */
      double per[2] = {1, 1};
      if (t->hp->loss_type == DPO_LOSS_IPO) per[0] = x->n_resp[0], per[1] = x->n_resp[1];
      double a[2] = {lp[0] / per[0], lp[1] / per[1]};
      /* z = beta h, h: how much more the policy prefers the chosen response than the
       * reference does; dz: d loss / d z */
      double rw_c = beta * (a[0] - rf[0] / per[0]), rw_r = beta * (a[1] - rf[1] / per[1]);
      double z = rw_c - rw_r;
      st->loss += dpo_loss(t->hp->loss_type, beta, ls, z, &dz);
      st->chosen += rw_c, st->rejected += rw_r, st->margin += z;
      st->lp_chosen += a[0], st->lp_rejected += a[1];
      st->correct += rw_c > rw_r;
      st->pairs++;
      /* d loss / d lp_chosen = beta dz / per[0] / scale, the rejected's the negative (over
       * per[1]); every token of a response gets its sequence's */
      for (int w = 0, q = r0; w < 2; w++) {
        float g = (float)((w ? -beta : beta) * dz / per[w] / scale);
        for (int j = 0; j < x->n_resp[w]; j++) t->sft_logp[q++] = g;
      }
    }
    st->tokens += counted;
    if (mode == PASS_TRAIN && train_backward(t->ts, m, t->sft_logp, &e))
      return trainer_fail_err(t, FAIL_INTERNAL, NULL, &e);
    i += np;
  }
  return 0;
}

/* pass over this rank's share of idx[0 .. n) (trainer_share; all of it alone), then summed over
 * the ranks (collective): st, with PASS_TRAIN the gradient, with PASS_REF the log-probs of ref
 * (idx the identity; ref zero outside this rank's share: a sum where the others add zeros, so
 * every rank holds the bits the rank that computed them has). 0, or 1 on every rank with res. */
static int share_pass(struct trainer *t, struct model *m, const struct dpo_pair *p, double *ref,
                      const int *idx, int n, int mode, double scale, struct dpo_sums *st) {
  int lo, hi;
  trainer_share(t, n, &lo, &hi);
  if (trainer_agree(t, pass(t, m, p, ref, idx + lo, hi - lo, mode, scale, st))) return 1;
  const struct dist *d = trainer_dist(t);
  if (mode == PASS_REF) {
    dist_sum_f64(d, ref, 2 * (size_t)n);
    return 0;
  }
  double f[] = {st->loss, st->chosen, st->rejected, st->margin, st->lp_chosen, st->lp_rejected};
  int64_t c[] = {st->correct, st->pairs, st->tokens};
  dist_sum_f64(d, f, sizeof f / sizeof f[0]);
  dist_sum_i64(d, c, sizeof c / sizeof c[0]);
  st->loss = f[0], st->chosen = f[1], st->rejected = f[2], st->margin = f[3];
  st->lp_chosen = f[4], st->lp_rejected = f[5];
  st->correct = c[0], st->pairs = c[1], st->tokens = c[2];
  if (mode == PASS_TRAIN) trainer_sum_grads(t);
  return 0;
}

/* The metrics of sums st, added to o: a step's under TRL's names (train/loss, rewards/...,
 * logps/...: prefix ""), an evaluation's under prefix "valid/". */
static int put_sums(json_t *o, const char *prefix, const struct dpo_sums *st) {
  double n = st->pairs ? (double)st->pairs : 1;
  const char *names[] = {"loss",           "rewards/chosen", "rewards/rejected", "rewards/accuracy",
                         "rewards/margin", "logps/chosen",   "logps/rejected"};
  double v[] = {st->loss / n,   st->chosen / n,    st->rejected / n,   (double)st->correct / n,
                st->margin / n, st->lp_chosen / n, st->lp_rejected / n};
  int rc = 0;
  for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
    char key[64];
    snprintf(key, sizeof key, "%s%s", !*prefix && !k ? "train/" : prefix, names[k]);
    rc |= json_object_set_new(o, key, json_real(v[k]));
  }
  return rc;
}

int trainer_dpo_step(struct trainer *t, json_t **out, int64_t *train_tokens_out) {
  const struct hparams *hp = t->hp;
  trainer_phase(t, "updating");
  int n = t->n_dpo_train, bs = hp->batch_size;
  int per_epoch = (n + bs - 1) / bs;
  int64_t k = t->step - 1;
  int epoch = (int)(k / per_epoch), lo = (int)(k % per_epoch) * bs;
  int hi = lo + bs < n ? lo + bs : n;
  trainer_sft_epoch_order(t, epoch, n);
  t->cursor.epoch = epoch;
  t->cursor.pos = hi;
  model_zero_grads(t->lm.model);
  struct dpo_sums st = {0};
  if (share_pass(t, t->lm.model, t->dpo_train, t->dpo_ref_train, t->sft_order + lo, hi - lo,
                 PASS_TRAIN, (double)(hi - lo), &st))
    return 1;
  double lr = hparams_lr_at(hp, t->step - 1, t->sft_total_steps), gn = 0;
  struct dapo_err e = {0};
  if (adamw_step(&t->opt, t->lm.model, (float)lr, &gn, &e))
    return trainer_fail(t, FAIL_NON_FINITE_GRADIENT, NULL, "step %" PRId64 ": %s", t->step, e.msg);
  *train_tokens_out = st.tokens;
  *out = json_pack("{s:I,s:I,s:I,s:I,s:f,s:f,s:I}", "step", (json_int_t)t->step, "total_steps",
                   (json_int_t)t->sft_total_steps, "train/tokens", (json_int_t)st.tokens,
                   "train/pairs", (json_int_t)st.pairs, "learning_rate", lr, "grad_norm", gn,
                   "epoch", (json_int_t)epoch);
  if (*out && put_sums(*out, "", &st)) json_decref(*out), *out = NULL;
  return *out ? 0 : trainer_oom(t);
}

int trainer_dpo_evaluate(struct trainer *t) {
  if (!t->n_dpo_val) return 0;
  trainer_phase(t, "evaluating");
  int *idx = malloc(sizeof(int) * (size_t)t->n_dpo_val);
  if (!idx) return trainer_agree(t, trainer_oom(t)); /* meets share_pass's */
  for (int i = 0; i < t->n_dpo_val; i++) idx[i] = i;
  struct dpo_sums st = {0};
  int rc =
      share_pass(t, t->lm.model, t->dpo_val, t->dpo_ref_val, idx, t->n_dpo_val, PASS_EVAL, 1, &st);
  free(idx);
  if (rc) return 1;
  json_t *m = json_pack("{s:I,s:I,s:I}", "step", (json_int_t)t->step, "valid/tokens",
                        (json_int_t)st.tokens, "valid/pairs", (json_int_t)st.pairs);
  if (m && (put_sums(m, "valid/", &st) || trainer_sft_full_valid(t, m))) json_decref(m), m = NULL;
  /* agreed as DAPO's evaluation: rank 0 alone writes them */
  return trainer_agree(t, m ? trainer_emit_metrics(t, m, 1, 0, 0) : trainer_oom(t));
}

/* The reference's log-probs of both files from the starting weights (with an adapter, the base:
 * the adapter switched off, no copy) into t->dpo_ref_*, written to the out folder (atomically). */
static int compute_reference(struct trainer *t, const char *path) {
  struct model *m = t->lm.model;
  struct lora *l = m->lora;
  m->lora = NULL;
  int most = t->n_dpo_train > t->n_dpo_val ? t->n_dpo_train : t->n_dpo_val;
  int *idx = malloc(sizeof(int) * (size_t)(most ? most : 1));
  int rc = trainer_agree(t, idx ? 0 : trainer_oom(t)); /* the ranks pass on together */
  for (int i = 0; i < most && idx; i++) idx[i] = i;
  for (int k = 0; k < 2 && !rc; k++) {
    int n = k ? t->n_dpo_val : t->n_dpo_train;
    struct dpo_sums st = {0};
    double *ref = k ? t->dpo_ref_val : t->dpo_ref_train;
    memset(ref, 0, sizeof(double) * 2 * (size_t)n);
    rc = share_pass(t, m, k ? t->dpo_val : t->dpo_train, ref, idx, n, PASS_REF, 1, &st);
  }
  free(idx);
  m->lora = l;
  if (rc) return rc;
  if (trainer_rank(t) != 0) return trainer_agree(t, 0); /* rank 0 writes the file */
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int64_t counts[2] = {t->n_dpo_train, t->n_dpo_val};
  int ok =
      f && fwrite(REF_MAGIC, 8, 1, f) == 1 && fwrite(counts, sizeof counts, 1, f) == 1 &&
      fwrite(t->dpo_ref_train, sizeof(double), 2 * (size_t)counts[0], f) == 2 * (size_t)counts[0] &&
      (!counts[1] ||
       fwrite(t->dpo_ref_val, sizeof(double), 2 * (size_t)counts[1], f) == 2 * (size_t)counts[1]);
  if (f && fflush(f)) ok = 0;
  if (f && fsync(fileno(f))) ok = 0;
  if (f && fclose(f)) ok = 0;
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return trainer_agree(
        t, trainer_fail(t, FAIL_IO_ERROR, NULL, "cannot write %s: %s", path, strerror(errno)));
  }
  return trainer_agree(t, 0);
}

/* read_reference's reading (rank 0), then agreed. */
static int read_file(struct trainer *t, const char *path) {
  FILE *f = fopen(path, "rb");
  char magic[8];
  int64_t counts[2];
  int ok =
      f && fread(magic, 8, 1, f) == 1 && !memcmp(magic, REF_MAGIC, 8) &&
      fread(counts, sizeof counts, 1, f) == 1 && counts[0] == t->n_dpo_train &&
      counts[1] == t->n_dpo_val &&
      fread(t->dpo_ref_train, sizeof(double), 2 * (size_t)counts[0], f) == 2 * (size_t)counts[0] &&
      (!counts[1] ||
       fread(t->dpo_ref_val, sizeof(double), 2 * (size_t)counts[1], f) == 2 * (size_t)counts[1]);
  if (f) fclose(f);
  if (!ok)
    return trainer_agree(t, trainer_fail(t, FAIL_INVALID_CHECKPOINT, NULL,
                                         "%s is missing or does not match the job's files: the "
                                         "reference's log-probs of a DPO job are written before "
                                         "its step 1",
                                         path));
  return trainer_agree(t, 0);
}

/* The reference's log-probs as a fresh run wrote them (a resumed run: they must be there): rank 0
 * reads them, every rank gets them (collective). */
static int read_reference(struct trainer *t, const char *path) {
  if (trainer_rank(t) == 0 ? read_file(t, path) : trainer_agree(t, 0)) return 1;
  const struct dist *d = trainer_dist(t);
  dist_bcast(d, t->dpo_ref_train, sizeof(double) * 2 * (size_t)t->n_dpo_train, 0);
  dist_bcast(d, t->dpo_ref_val, sizeof(double) * 2 * (size_t)t->n_dpo_val, 0);
  return 0;
}

/* trainer_dpo_setup's part on each rank alone: all but the reference's log-probs. */
static int setup_local(struct trainer *t, int64_t from, int *pair, int *seq) {
  struct dapo_err e = {0};
  const struct hparams *hp = t->hp;
  if (trainer_sft_begin(t, from)) return 1;
  int end = trainer_sft_end_id(&t->lm);
  if (dpo_load_file(t->spec->training_file, &t->lm, t->chat, end, hp->max_sequence_tokens,
                    hp->truncate, &t->dpo_train, &t->n_dpo_train, &e))
    return trainer_fail(t, FAIL_INVALID_DATASET, "training_file", "training_file %s", e.msg);
  if (t->spec->validation_file &&
      dpo_load_file(t->spec->validation_file, &t->lm, t->chat, end, hp->max_sequence_tokens,
                    hp->truncate, &t->dpo_val, &t->n_dpo_val, &e))
    return trainer_fail(t, FAIL_INVALID_DATASET, "validation_file", "validation_file %s", e.msg);
  longest(t->dpo_train, t->n_dpo_train, pair, seq);
  longest(t->dpo_val, t->n_dpo_val, pair, seq);
  if (*seq > t->lm.cfg.max_position_embeddings)
    return trainer_fail(t, FAIL_PROMPT_TOO_LONG, "training_file",
                        "a prompt and response of %d tokens exceed the model's context (%d)", *seq,
                        t->lm.cfg.max_position_embeddings);
  t->sft_total_steps = hparams_sft_total_steps(hp, t->n_dpo_train);
  t->dpo_ref_train = malloc(sizeof(double) * 2 * (size_t)t->n_dpo_train);
  t->dpo_ref_val = malloc(sizeof(double) * 2 * (size_t)(t->n_dpo_val ? t->n_dpo_val : 1));
  int cap = hp->micro_batch_tokens > *pair ? hp->micro_batch_tokens : *pair;
  t->dpo_prefix_of = malloc(sizeof(int) * (size_t)cap);
  if (!t->dpo_ref_train || !t->dpo_ref_val || !t->dpo_prefix_of) return trainer_oom(t);
  return trainer_sft_buffers(t, cap, *seq, t->n_dpo_train);
}

int trainer_dpo_setup(struct trainer *t, int64_t from) {
  int pair = 0, seq = 0;
  /* every rank passes here, so that the reference's collectives meet */
  if (trainer_agree(t, setup_local(t, from, &pair, &seq))) return 1;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/" REF_FILE, t->out);
  /* a fresh run (step 0: the starting weights) computes them; a resumed one reads them */
  return t->step == 0 ? compute_reference(t, path) : read_reference(t, path);
}

void trainer_dpo_teardown(struct trainer *t) {
  dpo_pairs_free(t->dpo_train, t->n_dpo_train);
  dpo_pairs_free(t->dpo_val, t->n_dpo_val);
  free(t->dpo_ref_train), free(t->dpo_ref_val), free(t->dpo_prefix_of);
  trainer_sft_teardown(t);
}
