/* Finite-difference check of the analytic gradient of L = sum_t w_t * logp_t over every parameter
 * tensor, on tiny models that cover GQA and plain MHA, tied and untied heads, Qwen2 q/k/v biases,
 * Qwen3's q/k norms and o_proj bias, scaled RoPE (yarn, llama3), a padded vocabulary, a
 * temperature, packed sequences of different lengths, and responses whose world tokens are
 * context only (fwd_batch.trained), and distributions constrained to a set of allowed ids per
 * response token (fwd_batch.allowed: structured outputs, the logits of the others -INFINITY).
 * Tolerance: each tensor's directional derivative along a random direction, and 6 single
 * entries per tensor, agree within |fd - an| <= 1e-2 * |an| + 2e-3 (central differences with
 * Richardson extrapolation from h = 1e-2 and 5e-3 on weights of scale ~0.3; float32 forward). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "lora.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "train.h"

static double loss_of(struct train_state *s, struct model *m, const struct fwd_batch *b,
                      const float *w, float inv_temp, float *logp) {
  struct dapo_err e;
  if (train_forward(s, m, b, inv_temp, logp, NULL, &e)) {
    fprintf(stderr, "forward failed: %s\n", e.msg);
    exit(1);
  }
  int R = fwd_batch_resp_tokens(b);
  double L = 0;
  for (int i = 0; i < R; i++) L += (double)w[i] * logp[i];
  return L;
}

/* Central difference along dir, Richardson-extrapolated from steps h and h/2 (error O(h^4)). */
static double richardson(struct train_state *s, struct model *m, const struct fwd_batch *b,
                         const float *w, float inv_temp, float *logp, float *x, const float *dir,
                         size_t n, float h) {
  double d[2];
  for (int i = 0; i < 2; i++) {
    float hh = i ? h / 2 : h;
    float *save = malloc(n * sizeof(float));
    memcpy(save, x, n * sizeof(float));
    for (size_t k = 0; k < n; k++) x[k] = save[k] + hh * dir[k];
    double lp = loss_of(s, m, b, w, inv_temp, logp);
    for (size_t k = 0; k < n; k++) x[k] = save[k] - hh * dir[k];
    double lm = loss_of(s, m, b, w, inv_temp, logp);
    memcpy(x, save, n * sizeof(float));
    free(save);
    d[i] = (lp - lm) / (2.0 * hh);
  }
  return (4 * d[1] - d[0]) / 3;
}

static struct pool *g_pool; /* NULL: serial; else every kernel split over 3 threads */

/* constrain: each response token's distribution restricted to about half the ids (its target
 * always among them; fwd_batch.allowed). */
static void run_case(const char *name, struct model_config cfg, float inv_temp, int constrain) {
  struct dapo_err e = {0};
  struct model *m = model_new(&cfg, &e);
  CHECK_MSG(m != NULL, "%s: %s", name, e.msg);
  if (!m) return;
  model_init_random(m, 42);
  struct rng r;
  rng_seed(&r, 7, 1);
  /* non-trivial norms and biases */
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *p = &m->tensors[i];
    if (p->ndim == 1)
      for (size_t k = 0; k < p->numel; k++)
        m->params[p->offset + k] += 0.3f * (float)rng_normal(&r);
  }
  CHECK(model_alloc_grads(m, &e) == 0);

  /* three sequences: lengths 7, 4, 9; prompts 3, 1, 5 */
  int lens[3] = {7, 4, 9}, plen[3] = {3, 1, 5};
  int off[4] = {0};
  for (int i = 0; i < 3; i++) off[i + 1] = off[i] + lens[i];
  int tokens[32];
  for (int i = 0; i < off[3]; i++) tokens[i] = (int)rng_below(&r, (uint64_t)model_vocab_used(&cfg));
  struct fwd_batch b = {.n_seq = 3, .tokens = tokens, .seq_off = off, .prompt_len = plen};
  int R = fwd_batch_resp_tokens(&b);
  float w[32], logp[32];
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&r);
  uint64_t allowed[32] = {0}; /* one word a row: V <= 64 here */
  for (int i = 0, q = 0; constrain && i < 3; i++)
    for (int t = off[i] + plen[i]; t < off[i + 1]; t++, q++) {
      for (int j = 0; j < model_vocab_used(&cfg); j++)
        if (rng_below(&r, 2)) allowed[q] |= 1ull << j;
      allowed[q] |= 1ull << tokens[t];
    }
  if (constrain) b.allowed = allowed;

  struct train_state *s = train_state_new(m, 32, 32, 16, &e);
  if (s && g_pool) CHECK(train_state_set_pool(s, g_pool, &e) == 0);
  CHECK_MSG(s != NULL, "%s: %s", name, e.msg);
  if (!s) {
    model_free(m);
    return;
  }
  model_zero_grads(m);
  loss_of(s, m, &b, w, inv_temp, logp);
  CHECK(train_backward(s, m, w, &e) == 0);

  const float h = 1e-2f;
  float *dir = malloc(sizeof(float) * m->n_params);
  int bad = 0;
  for (int t = 0; t < m->n_tensors; t++) {
    const struct param_info *p = &m->tensors[t];
    float *x = m->params + p->offset, *g = m->grads + p->offset;
    /* directional derivative along a random unit-scale direction */
    double an = 0;
    for (size_t k = 0; k < p->numel; k++) {
      dir[k] = (float)rng_normal(&r);
      an += (double)dir[k] * g[k];
    }
    double fd = richardson(s, m, &b, w, inv_temp, logp, x, dir, p->numel, h);
    double tol = 1e-2 * fabs(an) + 2e-3;
    if (fabs(fd - an) > tol) bad++;
    CHECK_MSG(fabs(fd - an) <= tol, "%s %s: directional fd %.6g vs analytic %.6g", name, p->name,
              fd, an);
    /* single entries */
    for (int j = 0; j < 6; j++) {
      size_t k = (size_t)rng_below(&r, p->numel);
      float one = 1.0f;
      double fd1 = richardson(s, m, &b, w, inv_temp, logp, x + k, &one, 1, h);
      double tol1 = 1e-2 * fabs(g[k]) + 2e-3;
      CHECK_MSG(fabs(fd1 - g[k]) <= tol1, "%s %s[%zu]: fd %.6g vs analytic %.6g", name, p->name, k,
                fd1, (double)g[k]);
    }
  }
  fprintf(stderr, "%s: %d tensors checked, %d directional mismatches\n", name, m->n_tensors, bad);
  free(dir);
  train_state_free(s);
  model_free(m);
}

/* A LoRA adapter on every linear layer of a frozen model: finite differences of the adapter's
 * tensors (A and B both random, so neither gradient vanishes), and no gradient for the base. */
static void run_lora_case(const char *name, struct model_config cfg, unsigned targets, int r,
                          float inv_temp) {
  struct dapo_err e = {0};
  struct model *m = model_new(&cfg, &e);
  CHECK_MSG(m != NULL, "%s: %s", name, e.msg);
  if (!m) return;
  model_init_random(m, 43);
  struct lora_config lc = {.r = r, .alpha = 2.0 * r, .targets = targets};
  struct lora *lo = lora_new(&lc, &cfg, &e);
  CHECK_MSG(lo != NULL, "%s: %s", name, e.msg);
  struct rng rr;
  rng_seed(&rr, 9, 2);
  for (size_t k = 0; k < lo->n_params; k++) lo->params[k] = 0.3f * (float)rng_normal(&rr);
  CHECK(lora_alloc_grads(lo, &e) == 0);
  m->lora = lo;

  int plen[2] = {3, 2}, off[3] = {0, 8, 14}, tokens[14]; /* lengths 8 and 6 */
  for (int i = 0; i < 14; i++) tokens[i] = (int)rng_below(&rr, (uint64_t)model_vocab_used(&cfg));
  struct fwd_batch b = {.n_seq = 2, .tokens = tokens, .seq_off = off, .prompt_len = plen};
  int R = fwd_batch_resp_tokens(&b);
  float w[16], logp[16];
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&rr);
  struct train_state *s = train_state_new(m, 16, 16, 16, &e);
  CHECK_MSG(s != NULL, "%s: %s", name, e.msg);
  if (s && g_pool) CHECK(train_state_set_pool(s, g_pool, &e) == 0);
  lora_zero_grads(lo);
  loss_of(s, m, &b, w, inv_temp, logp);
  CHECK_MSG(train_backward(s, m, w, &e) == 0, "%s: %s", name, e.msg);
  CHECK(m->grads == NULL); /* the base has none: it is frozen */

  const float h = 1e-2f;
  int bad = 0;
  float *dir = malloc(sizeof(float) * lo->n_params);
  for (int t = 0; t < lo->n_tensors; t++) {
    const struct param_info *p = &lo->tensors[t];
    float *x = lo->params + p->offset, *g = lo->grads + p->offset;
    double an = 0;
    for (size_t k = 0; k < p->numel; k++) {
      dir[k] = (float)rng_normal(&rr);
      an += (double)dir[k] * g[k];
    }
    double fd = richardson(s, m, &b, w, inv_temp, logp, x, dir, p->numel, h);
    double tol = 1e-2 * fabs(an) + 2e-3;
    bad += fabs(fd - an) > tol;
    CHECK_MSG(fabs(fd - an) <= tol, "%s %s: directional fd %.6g vs analytic %.6g", name, p->name,
              fd, an);
    for (int j = 0; j < 4; j++) {
      size_t k = (size_t)rng_below(&rr, p->numel);
      float one = 1.0f;
      double fd1 = richardson(s, m, &b, w, inv_temp, logp, x + k, &one, 1, h);
      CHECK_MSG(fabs(fd1 - g[k]) <= 1e-2 * fabs(g[k]) + 2e-3, "%s %s[%zu]: fd %.6g vs %.6g", name,
                p->name, k, fd1, (double)g[k]);
    }
  }
  fprintf(stderr, "%s: %d adapter tensors checked, %d directional mismatches\n", name,
          lo->n_tensors, bad);
  free(dir);
  train_state_free(s);
  lora_free(lo);
  model_free(m);
}

/* A batch whose responses hold tokens that are context only (fwd_batch.trained 0: what the
 * world wrote between a model's turns): log-probs come for the trained tokens alone and equal
 * the unmasked forward's there; the gradient equals the unmasked one with those tokens weighted
 * 0 (world tokens change nothing in it), and agrees with finite differences; a trained flag in
 * a prompt, or other than 0 and 1, is refused. */
static void run_mask_case(const char *name, struct model_config cfg) {
  struct dapo_err e = {0};
  struct model *m = model_new(&cfg, &e);
  CHECK_MSG(m != NULL, "%s: %s", name, e.msg);
  if (!m) return;
  model_init_random(m, 44);
  CHECK(model_alloc_grads(m, &e) == 0);
  struct rng r;
  rng_seed(&r, 7, 3);
  /* two episodes: prompt, model turn, world, model turn (and a trailing world token) */
  int lens[2] = {12, 9}, plen[2] = {3, 2}, off[3] = {0, 12, 21}, tokens[21];
  static const unsigned char mask[21] = {0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1,
                                         0, 0, 0, 1, 0, 0, 1, 1, 1, 0};
  for (int i = 0; i < off[2]; i++) tokens[i] = (int)rng_below(&r, (uint64_t)model_vocab_used(&cfg));
  struct fwd_batch full = {.n_seq = 2, .tokens = tokens, .seq_off = off, .prompt_len = plen},
                   part = full;
  part.trained = mask;
  int R_full = fwd_batch_resp_tokens(&full), R = fwd_batch_resp_tokens(&part);
  CHECK(R_full == lens[0] + lens[1] - plen[0] - plen[1] && R == 9);
  struct train_state *s = train_state_new(m, 32, 32, 16, &e);
  CHECK_MSG(s != NULL, "%s: %s", name, e.msg);
  float w[32], w_full[32], lp[32], lp_full[32];
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&r);
  /* the unmasked batch: the same weights at trained tokens, 0 elsewhere */
  for (int i = 0, k = 0, q = 0; i < 2; i++)
    for (int t = off[i] + plen[i]; t < off[i + 1]; t++, q++) w_full[q] = mask[t] ? w[k++] : 0.0f;
  float *g_full = malloc(sizeof(float) * m->n_params);
  model_zero_grads(m);
  loss_of(s, m, &full, w_full, 1.0f, lp_full);
  CHECK(train_backward(s, m, w_full, &e) == 0);
  memcpy(g_full, m->grads, sizeof(float) * m->n_params);
  model_zero_grads(m);
  loss_of(s, m, &part, w, 1.0f, lp);
  CHECK(train_backward(s, m, w, &e) == 0);
  double worst_lp = 0, worst_g = 0, gmax = 0;
  for (int i = 0, k = 0, q = 0; i < 2; i++)
    for (int t = off[i] + plen[i]; t < off[i + 1]; t++, q++)
      if (mask[t]) worst_lp = fmax(worst_lp, fabs((double)lp[k++] - lp_full[q]));
  for (size_t k = 0; k < m->n_params; k++) {
    worst_g = fmax(worst_g, fabs((double)m->grads[k] - g_full[k]));
    gmax = fmax(gmax, fabs((double)g_full[k]));
  }
  CHECK_MSG(worst_lp <= 1e-6, "%s: masked log-probs differ by %.3g", name, worst_lp);
  CHECK_MSG(gmax > 0 && worst_g <= 1e-5 * gmax, "%s: masked gradient differs by %.3g of %.3g", name,
            worst_g, gmax);
  /* finite differences of the masked loss along a random direction, for every tensor */
  float *dir = malloc(sizeof(float) * m->n_params);
  for (int t = 0; t < m->n_tensors; t++) {
    const struct param_info *p = &m->tensors[t];
    double an = 0;
    for (size_t k = 0; k < p->numel; k++) {
      dir[k] = (float)rng_normal(&r);
      an += (double)dir[k] * m->grads[p->offset + k];
    }
    double fd = richardson(s, m, &part, w, 1.0f, lp, m->params + p->offset, dir, p->numel, 1e-2f);
    CHECK_MSG(fabs(fd - an) <= 1e-2 * fabs(an) + 2e-3, "%s %s: masked fd %.6g vs analytic %.6g",
              name, p->name, fd, an);
  }
  /* refusals */
  unsigned char bad[21];
  memcpy(bad, mask, sizeof bad);
  bad[1] = 1; /* inside the first prompt */
  part.trained = bad;
  CHECK(train_forward(s, m, &part, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 0: token 1's trained flag is 1"));
  memcpy(bad, mask, sizeof bad);
  bad[20] = 2;
  CHECK(train_forward(s, m, &part, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 1: token 8's trained flag is 2"));
  fprintf(stderr,
          "%s: %d of %d response tokens trained; log-probs within %.2g, gradient within "
          "%.2g of the unmasked batch's\n",
          name, R, R_full, worst_lp, worst_g / gmax);
  free(dir);
  free(g_full);
  train_state_free(s);
  model_free(m);
}

/* Sequences continuing an earlier one's prompt (fwd_batch.prefix_of: a DPO pair's shared prompt
 * through the model once): two continuations of one whole sequence (its full prompt, and a
 * shorter prefix with a response of 2 tokens), one of another, and one trained-flag mask. Their
 * log-probs equal those of the same sequences packed in full (the prompt held again), the
 * gradient of every tensor (the adapter's with lora_r > 0) equals the full packing's within
 * float rounding and agrees with finite differences; malformed prefix_of entries are refused. */
static void run_prefix_case(const char *name, struct model_config cfg, int lora_r) {
  struct dapo_err e = {0};
  struct model *m = model_new(&cfg, &e);
  CHECK_MSG(m != NULL, "%s: %s", name, e.msg);
  if (!m) return;
  model_init_random(m, 45);
  struct rng r;
  rng_seed(&r, 7, 4);
  struct lora_config lc = {.r = lora_r, .alpha = 2.0 * lora_r, .targets = (1u << LT_COUNT) - 1};
  struct lora *lo = NULL;
  if (lora_r) {
    lo = lora_new(&lc, &cfg, &e);
    CHECK_MSG(lo != NULL, "%s: %s", name, e.msg);
    for (size_t k = 0; k < lo->n_params; k++) lo->params[k] = 0.3f * (float)rng_normal(&r);
    CHECK(lora_alloc_grads(lo, &e) == 0);
    m->lora = lo;
  } else
    CHECK(model_alloc_grads(m, &e) == 0);
  float *params = lo ? lo->params : m->params, *grads = lo ? lo->grads : m->grads;
  size_t n_params = lo ? lo->n_params : m->n_params;
  int n_tensors = lo ? lo->n_tensors : m->n_tensors;
  const struct param_info *tensors = lo ? lo->tensors : m->tensors;

  /* sequence: 0 whole (prompt 5, 9 tokens), 1 continues 0 (P 5, 3 own), 2 whole (prompt 3, 7
   * tokens), 3 continues 2 (P 2, 5 own), 4 continues 0 (P 4, 2 own) */
  enum { NS = 5 };
  int own[NS] = {9, 3, 7, 5, 2}, plen[NS] = {5, 5, 3, 2, 4}, pre[NS] = {-1, 0, -1, 2, 0};
  int off[NS + 1] = {0}, foff[NS + 1] = {0}, tok[64], ftok[64];
  for (int i = 0; i < NS; i++) off[i + 1] = off[i] + own[i];
  for (int i = 0; i < off[NS]; i++) tok[i] = (int)rng_below(&r, (uint64_t)model_vocab_used(&cfg));
  unsigned char tr[64] = {0}, ftr[64] = {0};
  for (int i = 0; i < NS; i++) /* sequence 3's second own token is context only */
    for (int t = pre[i] >= 0 ? 0 : plen[i]; t < own[i]; t++) tr[off[i] + t] = !(i == 3 && t == 1);
  /* the full packing: a continuation's prompt copied from its prefix */
  for (int i = 0; i < NS; i++) {
    int n = foff[i];
    if (pre[i] >= 0) {
      memcpy(ftok + n, tok + off[pre[i]], sizeof(int) * (size_t)plen[i]);
      memset(ftr + n, 0, (size_t)plen[i]);
      n += plen[i];
    }
    memcpy(ftok + n, tok + off[i], sizeof(int) * (size_t)own[i]);
    memcpy(ftr + n, tr + off[i], (size_t)own[i]);
    foff[i + 1] = n + own[i];
  }
  struct fwd_batch b = {NS, tok, off, plen, tr, NULL, pre},
                   full = {NS, ftok, foff, plen, ftr, NULL, NULL};
  int R = fwd_batch_resp_tokens(&b);
  CHECK_MSG(R == fwd_batch_resp_tokens(&full) && R == 4 + 3 + 4 + 4 + 2, "%s: %d response tokens",
            name, R);
  float w[32], lp[32], lp_full[32];
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&r);
  struct train_state *s = train_state_new(m, 64, 32, 16, &e);
  CHECK_MSG(s != NULL, "%s: %s", name, e.msg);
  if (!s) return;
  if (g_pool) CHECK(train_state_set_pool(s, g_pool, &e) == 0);
  float *g_full = malloc(sizeof(float) * n_params);
  memset(grads, 0, sizeof(float) * n_params);
  loss_of(s, m, &full, w, 1.0f, lp_full);
  CHECK(train_backward(s, m, w, &e) == 0);
  memcpy(g_full, grads, sizeof(float) * n_params);
  memset(grads, 0, sizeof(float) * n_params);
  loss_of(s, m, &b, w, 1.0f, lp);
  CHECK(train_backward(s, m, w, &e) == 0);
  double worst_lp = 0, worst_g = 0, gmax = 0;
  int same_bits = !memcmp(lp, lp_full, sizeof(float) * (size_t)R);
  for (int i = 0; i < R; i++) /* relative to the log-prob's size (a few units) */
    worst_lp = fmax(worst_lp, fabs((double)lp[i] - lp_full[i]) / fmax(1.0, fabs(lp_full[i])));
  for (size_t k = 0; k < n_params; k++) {
    worst_g = fmax(worst_g, fabs((double)grads[k] - g_full[k]));
    gmax = fmax(gmax, fabs((double)g_full[k]));
  }
  CHECK_MSG(worst_lp <= 1e-6, "%s: shared-prefix log-probs differ by %.3g", name, worst_lp);
  CHECK_MSG(gmax > 0 && worst_g <= 1e-5 * gmax,
            "%s: shared-prefix gradient differs by %.3g of %.3g", name, worst_g, gmax);
  /* finite differences of the shared-prefix loss along a random direction, for every tensor */
  float *dir = malloc(sizeof(float) * n_params);
  for (int t = 0; t < n_tensors; t++) {
    const struct param_info *p = &tensors[t];
    double an = 0;
    for (size_t k = 0; k < p->numel; k++) {
      dir[k] = (float)rng_normal(&r);
      an += (double)dir[k] * grads[p->offset + k];
    }
    /* float32 forwards: the difference quotient's rounding noise is about the tolerance for a
     * small gradient (0.01 here), and lands on either side of it by the BLAS kernel (a layer-0
     * k_proj passed at steps 1.25e-3 and 5e-3, failed at 2.5e-3 on OpenBLAS's Cooperlake and
     * SkylakeX kernels on an AMD EPYC): a second step decides, and a wrong gradient fails both */
    double fd = richardson(s, m, &b, w, 1.0f, lp, params + p->offset, dir, p->numel, 2.5e-3f),
           fd2 = fd;
    if (fabs(fd - an) > 1e-2 * fabs(an) + 2e-3)
      fd2 = richardson(s, m, &b, w, 1.0f, lp, params + p->offset, dir, p->numel, 5e-3f);
    CHECK_MSG(fmin(fabs(fd - an), fabs(fd2 - an)) <= 1e-2 * fabs(an) + 2e-3,
              "%s %s: shared-prefix fd %.6g (step 2.5e-3) and %.6g (5e-3) vs %.6g", name, p->name,
              fd, fd2, an);
  }
  /* refusals: a later sequence, a continuation of a continuation, a prompt past its prefix's */
  int bad_pre[NS] = {-1, 0, -1, 2, 0}, bad_plen[NS];
  memcpy(bad_plen, plen, sizeof plen);
  struct fwd_batch bad = b;
  bad.prefix_of = bad_pre;
  bad_pre[1] = 3;
  CHECK(train_forward(s, m, &bad, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 1: prefix_of 3 is neither -1 nor an earlier sequence"));
  bad_pre[1] = 0, bad_pre[4] = 3;
  CHECK(train_forward(s, m, &bad, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 4: prefix_of 3 is itself a continuation (of 2)"));
  bad_pre[4] = 0;
  bad.prompt_len = bad_plen;
  bad_plen[3] = 4;
  CHECK(train_forward(s, m, &bad, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 3: prompt length 4 not in [1, 3]"));
  bad_plen[3] = 2, bad_plen[1] = 9; /* within its prefix's prompt? no: 9 > 5 */
  CHECK(train_forward(s, m, &bad, 1.0f, lp, NULL, &e) == DAPO_EINVAL &&
        strstr(e.msg, "sequence 1: prompt length 9 not in [1, 5]"));
  fprintf(stderr,
          "%s: %d response tokens; log-probs within %.2g (%s bits), gradient within %.2g of the "
          "full packing's\n",
          name, R, worst_lp, same_bits ? "the same" : "not the same", worst_g / gmax);
  free(dir);
  free(g_full);
  train_state_free(s);
  m->lora = NULL;
  lora_free(lo);
  model_free(m);
}

int main(void) {
  struct model_config base = {.arch = ARCH_LLAMA,
                              .vocab_size = 23,
                              .hidden_size = 16,
                              .intermediate_size = 24,
                              .num_layers = 2,
                              .num_heads = 4,
                              .num_kv_heads = 2,
                              .head_dim = 4,
                              .max_position_embeddings = 64,
                              .rms_norm_eps = 1e-5f,
                              .rope_theta = 10000.0f,
                              .tie_word_embeddings = 1,
                              .bos_token_id = 1,
                              .eos_token_id = 2,
                              .initializer_range = 0.3f};
  run_case("llama-gqa-tied", base, 1.0f, 0);

  struct model_config c2 = base;
  c2.tie_word_embeddings = 0;
  c2.num_kv_heads = 4;
  run_case("llama-mha-untied-temp0.7", c2, 1.0f / 0.7f, 0);

  struct model_config c3 = base;
  c3.arch = ARCH_QWEN2;
  c3.qkv_bias = 1;
  c3.tie_word_embeddings = 0;
  c3.num_kv_heads = 1;
  c3.head_dim = 6; /* CQ != C */
  run_case("qwen2-bias-mqa-untied", c3, 1.0f, 0);
  /* Qwen3: per-head q/k RMSNorm (q_norm, k_norm), explicit head_dim, attention biases (q/k/v
   * and o_proj), yarn RoPE whose original context (4) the sequences run past, and a padded
   * vocabulary (the softmax covers 19 of 23 rows) */
  struct model_config c4 = base;
  c4.arch = ARCH_QWEN3;
  c4.qk_norm = 1;
  c4.qkv_bias = 1;
  c4.o_bias = 1;
  c4.tie_word_embeddings = 0;
  c4.head_dim = 6;
  c4.vocab_used = 19;
  c4.rope = (struct rope_scaling){
      .type = ROPE_YARN, .factor = 4.0, .original_max_position_embeddings = 4};
  run_case("qwen3-qknorm-bias-yarn-padded", c4, 1.0f / 0.8f, 0);
  run_case("qwen3-constrained-temp0.8", c4, 1.0f / 0.8f, 1); /* allowed ids per token */
  /* Llama 3.1's RoPE with an original context of 4, tied */
  struct model_config c5 = base;
  c5.head_dim = 8; /* 4 frequencies: kept, smoothed and interpolated ones */
  c5.rope = (struct rope_scaling){.type = ROPE_LLAMA3,
                                  .factor = 8.0,
                                  .low_freq_factor = 1.0,
                                  .high_freq_factor = 4.0,
                                  .original_max_position_embeddings = 4};
  run_case("llama3-rope-tied", c5, 1.0f, 0);
  run_mask_case("mask-qwen3", c4);
  run_lora_case("lora-all-linear-qwen3", c4, (1u << LT_COUNT) - 1, 3, 1.0f / 0.8f);
  run_lora_case("lora-qv-llama", base, 1u << LT_Q | 1u << LT_V, 2, 1.0f);
  run_prefix_case("prefix-llama-gqa", base, 0);
  run_prefix_case("prefix-qwen3", c4, 0);
  run_prefix_case("prefix-qwen2-mqa", c3, 0);
  run_prefix_case("prefix-lora-qwen3", c4, 3);
  /* again with the parallel paths of every kernel (3 threads, no work threshold) */
  kernels_set_par_min_work(0);
  g_pool = pool_new(3);
  run_case("llama-gqa-tied/pool3", base, 1.0f, 0);
  run_case("qwen2-bias-mqa-untied/pool3", c3, 1.0f, 0);
  run_case("qwen3-qknorm-bias-yarn-padded/pool3", c4, 1.0f / 0.8f, 0);
  run_case("qwen3-constrained-temp0.8/pool3", c4, 1.0f / 0.8f, 1);
  run_lora_case("lora-all-linear-qwen3/pool3", c4, (1u << LT_COUNT) - 1, 3, 1.0f / 0.8f);
  run_prefix_case("prefix-llama-gqa/pool3", base, 0);
  run_prefix_case("prefix-lora-qwen3/pool3", c4, 3);
  pool_free(g_pool);
  return check_done("test_grad");
}
