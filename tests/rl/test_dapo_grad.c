/* The gradient of one DAPO minibatch, end to end through the model:
 *  - first minibatch of the first epoch (ratio exactly 1): the per-token weights are exactly
 *    -A_i / n_tokens, so the gradient is -sum_i A_i grad(logp_i) / n_tokens;
 *  - a later epoch with weights moved so that tokens are clipped on both sides: the analytic
 *    gradient of the clipped token-mean loss equals central finite differences of the loss;
 *  - all three aggregations, and the gradient of a minibatch does not depend on how it is split
 *    into micro-batches (while normalising per micro-batch, the known framework bug, would);
 *  - multi-turn episodes: responses that hold the world's tokens between the model's turns
 *    (trained 0): the token mean counts the model's tokens alone, finite differences of the
 *    masked loss (clipped on both sides, with the k3 KL term) agree with the gradient, and
 *    training one world token as if it were the model's changes the gradient. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dapo.h"
#include "model.h"
#include "rng.h"
#include "train.h"

enum { NS = 4, CAP = 64 };
static int lens[NS] = {9, 6, 11, 7}, plen[NS] = {3, 2, 5, 1};
static int toks[CAP], off[NS + 1];
static double adv[NS] = {1.2, -0.7, 0.4, -1.5};
static float lp_old[CAP], lp_ref[CAP];
static const unsigned char *g_mask; /* NULL: single turns; else the episodes' loss mask */

static struct model *m;
static struct train_state *ts;

static void setup(void) {
  struct model_config c = {.arch = ARCH_LLAMA,
                           .vocab_size = 29,
                           .hidden_size = 16,
                           .intermediate_size = 24,
                           .num_layers = 2,
                           .num_heads = 4,
                           .num_kv_heads = 2,
                           .head_dim = 4,
                           .max_position_embeddings = 64,
                           .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000.0f,
                           .tie_word_embeddings = 0,
                           .bos_token_id = 1,
                           .eos_token_id = 2,
                           .initializer_range = 0.3f};
  struct dapo_err e;
  m = model_new(&c, &e);
  model_init_random(m, 9);
  model_alloc_grads(m, &e);
  ts = train_state_new(m, CAP, CAP, 32, &e);
  struct rng r;
  rng_seed(&r, 1, 2);
  off[0] = 0;
  for (int i = 0; i < NS; i++) off[i + 1] = off[i] + lens[i];
  for (int i = 0; i < off[NS]; i++) toks[i] = 3 + (int)rng_below(&r, 26);
}

/* Forward of sequences [a, b) into logp (response tokens in order). */
static int fwd(int a, int b, float *logp) {
  int o[NS + 1], pl[NS];
  for (int i = a; i <= b; i++) o[i - a] = off[i] - off[a];
  for (int i = a; i < b; i++) pl[i - a] = plen[i];
  struct fwd_batch fb = {.n_seq = b - a,
                         .tokens = toks + off[a],
                         .seq_off = o,
                         .prompt_len = pl,
                         .trained = g_mask ? g_mask + off[a] : NULL};
  struct dapo_err e;
  CHECK(train_forward(ts, m, &fb, 1.0f, logp, NULL, &e) == 0);
  return fwd_batch_resp_tokens(&fb);
}

/* The trained response tokens of each sequence. */
static void resp_lens(int *rl) {
  for (int i = 0; i < NS; i++) {
    rl[i] = 0;
    for (int t = off[i] + plen[i]; t < off[i + 1]; t++) rl[i] += !g_mask || g_mask[t];
  }
}

/* The minibatch loss at the current weights (logp_old fixed). */
static double loss_now(const struct hparams *hp, struct pg_stats *st) {
  float lp[CAP], w[CAP];
  int rl[NS];
  resp_lens(rl);
  int R = fwd(0, NS, lp);
  struct pg_stats s = {0};
  dapo_token_weights(hp, NS, rl, adv, lp, lp_old, hp->kl_coef > 0 ? lp_ref : NULL, NS, R, w, &s);
  if (st) *st = s;
  return s.loss;
}

/* Gradient of the minibatch loss, processed as micro-batches split at `cut` (0: one piece);
 * per_micro: the buggy normalisation by the micro-batch's own token count. */
static void grad_of(const struct hparams *hp, int cut, int per_micro, float *out) {
  int rl[NS];
  resp_lens(rl);
  long total = 0;
  for (int i = 0; i < NS; i++) total += rl[i];
  model_zero_grads(m);
  int pieces[3] = {0, cut ? cut : NS, NS};
  for (int p = 0; p < (cut ? 2 : 1); p++) {
    int a = pieces[p], b = pieces[p + 1];
    float lp[CAP], w[CAP];
    int R = fwd(a, b, lp);
    int old0 = 0;
    for (int i = 0; i < a; i++) old0 += rl[i];
    dapo_token_weights(hp, b - a, rl + a, adv + a, lp, lp_old + old0,
                       hp->kl_coef > 0 ? lp_ref + old0 : NULL, per_micro ? b - a : NS,
                       per_micro ? R : total, w, NULL);
    struct dapo_err e;
    CHECK(train_backward(ts, m, w, &e) == 0);
  }
  memcpy(out, m->grads, sizeof(float) * m->n_params);
}

static double rel_diff(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return sqrt(num / (den + 1e-30));
}

/* Directional derivative of the loss by central differences (Richardson, h and h/2). */
static double fd_dir(const struct hparams *hp, const float *dir, float h) {
  float *save = malloc(sizeof(float) * m->n_params);
  memcpy(save, m->params, sizeof(float) * m->n_params);
  double d[2];
  for (int k = 0; k < 2; k++) {
    float hh = k ? h / 2 : h;
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = save[i] + hh * dir[i];
    double lp = loss_now(hp, NULL);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = save[i] - hh * dir[i];
    double lm = loss_now(hp, NULL);
    d[k] = (lp - lm) / (2 * hh);
  }
  memcpy(m->params, save, sizeof(float) * m->n_params);
  free(save);
  return (4 * d[1] - d[0]) / 3;
}

int main(void) {
  setup();
  struct hparams hp;
  json_t *errs = json_array();
  hparams_parse(&hp, NULL, errs);
  hp.max_new_tokens = 16;
  int rl[NS];
  resp_lens(rl);
  int R = fwd(0, NS, lp_old); /* pi_old */

  /* 1. ratio 1: weights are exactly -A / n_tokens, no clipping */
  {
    float lp[CAP], w[CAP];
    fwd(0, NS, lp);
    CHECK(memcmp(lp, lp_old, sizeof(float) * (size_t)R) == 0); /* same packing: bit-identical */
    struct pg_stats st = {0};
    dapo_token_weights(&hp, NS, rl, adv, lp, lp_old, NULL, NS, R, w, &st);
    int exact = 1;
    for (int i = 0, k = 0; i < NS; i++)
      for (int q = 0; q < rl[i]; q++, k++) exact &= w[k] == (float)(-adv[i] / R);
    CHECK_MSG(exact, "first-minibatch weights are not -A/n_tokens");
    CHECK(st.clip_low == 0 && st.clip_high == 0 && st.tokens == R);
  }

  float *g1 = malloc(sizeof(float) * m->n_params), *g2 = malloc(sizeof(float) * m->n_params);
  float *dir = malloc(sizeof(float) * m->n_params);
  struct rng r;
  rng_seed(&r, 77, 0);
  for (size_t i = 0; i < m->n_params; i++) dir[i] = (float)rng_normal(&r);

  /* 2. FD of the loss at ratio 1 for every aggregation */
  int aggs[3] = {AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM_NORM};
  for (int a = 0; a < 3; a++) {
    hp.loss_agg = aggs[a];
    grad_of(&hp, 0, 0, g1);
    double an = 0;
    for (size_t i = 0; i < m->n_params; i++) an += (double)g1[i] * dir[i];
    double fd = fd_dir(&hp, dir, 1e-3f);
    CHECK_MSG(fabs(fd - an) <= 1e-2 * fabs(an) + 1e-4, "agg %d: fd %.6g vs analytic %.6g", a, fd,
              an);
    /* 3. micro-batch split invariance */
    grad_of(&hp, 1, 0, g2);
    double d = rel_diff(g2, g1, m->n_params);
    CHECK_MSG(d < 1e-5, "agg %d: split into micro-batches changes the gradient by %.3g", a, d);
    grad_of(&hp, 3, 0, g2);
    CHECK(rel_diff(g2, g1, m->n_params) < 1e-5);
    if (aggs[a] == AGG_TOKEN_MEAN) {
      grad_of(&hp, 1, 1, g2); /* per-micro-batch normalisation: must differ */
      CHECK_MSG(rel_diff(g2, g1, m->n_params) > 1e-2, "the buggy normalisation went unnoticed");
    }
    fprintf(stderr, "agg %s: directional fd %.6g analytic %.6g; split rel diff %.2g\n",
            hparams_loss_agg_name(aggs[a]), fd, an, d);
  }

  /* 4. a later epoch: move the weights along the gradient so ratios leave the clip range on both
   * sides, then compare with finite differences of the clipped loss */
  hp.loss_agg = AGG_TOKEN_MEAN;
  hp.eps_low = 0.05;
  hp.eps_high = 0.08;
  grad_of(&hp, 0, 0, g1);
  for (size_t i = 0; i < m->n_params; i++) m->params[i] -= 0.4f * g1[i] + 0.02f * dir[i];
  struct pg_stats st;
  loss_now(&hp, &st);
  fprintf(stderr, "epoch 2: %ld tokens, %ld clipped low, %ld clipped high\n", st.tokens,
          st.clip_low, st.clip_high);
  CHECK_MSG(st.clip_low > 0 && st.clip_high > 0, "no clipping on one side (low %ld, high %ld)",
            st.clip_low, st.clip_high);
  grad_of(&hp, 2, 0, g1);
  double an = 0;
  for (size_t i = 0; i < m->n_params; i++) an += (double)g1[i] * dir[i];
  double fd = fd_dir(&hp, dir, 2e-4f);
  CHECK_MSG(fabs(fd - an) <= 1e-2 * fabs(an) + 1e-4, "clipped: fd %.6g vs analytic %.6g", fd, an);
  fprintf(stderr, "clipped loss: directional fd %.6g analytic %.6g\n", fd, an);

  /* 5. multi-turn episodes: each response is [model turn, world answer, model turn] */
  static unsigned char mask[CAP];
  for (int i = 0; i < NS; i++)
    for (int t = off[i]; t < off[i + 1]; t++) {
      int q = t - off[i] - plen[i];           /* place in the response */
      mask[t] = q >= 0 && !(q >= 2 && q < 4); /* tokens 2 and 3 of each response: the world's */
    }
  g_mask = mask;
  resp_lens(rl);
  int trained = 0;
  for (int i = 0; i < NS; i++) trained += rl[i];
  hp.eps_low = 0.2, hp.eps_high = 0.28, hp.kl_coef = 0;
  R = fwd(0, NS, lp_old);
  CHECK(R == trained && R == off[NS] - (plen[0] + plen[1] + plen[2] + plen[3]) - 2 * NS);
  {
    float lp[CAP], w[CAP];
    fwd(0, NS, lp);
    struct pg_stats s = {0};
    dapo_token_weights(&hp, NS, rl, adv, lp, lp_old, NULL, NS, R, w, &s);
    int exact = 1;
    for (int i = 0, k = 0; i < NS; i++)
      for (int q = 0; q < rl[i]; q++, k++) exact &= w[k] == (float)(-adv[i] / trained);
    CHECK_MSG(exact && s.tokens == trained,
              "episodes: the token mean is not over the model's tokens alone");
  }
  grad_of(&hp, 0, 0, g1);
  an = 0;
  for (size_t i = 0; i < m->n_params; i++) an += (double)g1[i] * dir[i];
  fd = fd_dir(&hp, dir, 1e-3f);
  CHECK_MSG(fabs(fd - an) <= 1e-2 * fabs(an) + 1e-4, "episodes: fd %.6g vs analytic %.6g", fd, an);
  grad_of(&hp, 1, 0, g2);
  CHECK(rel_diff(g2, g1, m->n_params) < 1e-5);
  /* one world token trained as the model's: a different gradient */
  static unsigned char wrong[CAP];
  memcpy(wrong, mask, sizeof wrong);
  wrong[off[1] + plen[1] + 2] = 1;
  g_mask = wrong;
  float *g3 = malloc(sizeof(float) * m->n_params);
  R = fwd(0, NS, lp_old);
  grad_of(&hp, 0, 0, g3);
  double d = rel_diff(g3, g1, m->n_params);
  CHECK_MSG(d > 1e-3, "training a world token changed the gradient by %.3g only", d);
  g_mask = mask;
  R = fwd(0, NS, lp_old);
  /* a later epoch, clipped on both sides, with the k3 KL term against a reference */
  hp.eps_low = 0.05, hp.eps_high = 0.08, hp.kl_coef = 0.05;
  for (int k = 0; k < R; k++) lp_ref[k] = lp_old[k] + 0.3f * (float)rng_normal(&r);
  grad_of(&hp, 0, 0, g1);
  for (size_t i = 0; i < m->n_params; i++) m->params[i] -= 0.4f * g1[i] + 0.02f * dir[i];
  loss_now(&hp, &st);
  CHECK_MSG(st.clip_low > 0 && st.clip_high > 0 && st.tokens == trained,
            "episodes, epoch 2: clipped low %ld, high %ld, tokens %ld", st.clip_low, st.clip_high,
            st.tokens);
  grad_of(&hp, 2, 0, g1);
  an = 0;
  for (size_t i = 0; i < m->n_params; i++) an += (double)g1[i] * dir[i];
  fd = fd_dir(&hp, dir, 2e-4f);
  CHECK_MSG(fabs(fd - an) <= 1e-2 * fabs(an) + 1e-4, "episodes, clipped with KL: fd %.6g vs %.6g",
            fd, an);
  fprintf(stderr,
          "episodes: %d of %d response tokens the model's; clipped with KL: fd %.6g analytic "
          "%.6g; a world token trained moves the gradient by %.2g\n",
          trained, trained + 2 * NS, fd, an, d);
  free(g3);
  free(g1), free(g2), free(dir);
  json_decref(errs);
  train_state_free(ts);
  model_free(m);
  return check_done("test_dapo_grad");
}
