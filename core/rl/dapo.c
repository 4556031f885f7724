/* DAPO maths (dapo.h). */
#include "dapo.h"

#include <math.h>

double dapo_overlong_shape(double r, int len, int max_new, int buffer, double penalty, int mode,
                           int *penalised) {
  if (penalised) *penalised = 0;
  if (buffer <= 0) return r;
  int thresh = max_new - buffer;
  if (len <= thresh) return r;
  if (penalised) *penalised = 1;
  double pen = -(double)(len - thresh) / buffer * penalty;
  return mode == OVERLONG_ADDITIVE ? r + pen : fmin(r, pen);
}

void dapo_group_advantages(const double *r, const int *include, int n, double eps, int scale,
                           double *adv) {
  int m = 0;
  double mean = 0;
  for (int i = 0; i < n; i++)
    if (!include || include[i]) mean += r[i], m++;
  for (int i = 0; i < n; i++) adv[i] = 0.0;
  if (m < 2) return;
  mean /= m;
  double ss = 0;
  for (int i = 0; i < n; i++)
    if (!include || include[i]) ss += (r[i] - mean) * (r[i] - mean);
  double sd = sqrt(ss / (m - 1));
  for (int i = 0; i < n; i++)
    if (!include || include[i]) adv[i] = scale ? (r[i] - mean) / (sd + eps) : r[i] - mean;
}

void dapo_pg_token(double logp, double logp_old, double adv, double eps_low, double eps_high,
                   double dual_c, struct pg_token *o) {
  double ratio = exp(logp - logp_old);
  double lo = 1.0 - eps_low, hi = 1.0 + eps_high;
  double rc = ratio < lo ? lo : ratio > hi ? hi : ratio;
  double s1 = ratio * adv, s2 = rc * adv;
  o->ratio = ratio;
  o->clipped_low = adv < 0 && ratio < lo;
  o->clipped_high = adv > 0 && ratio > hi;
  o->clipped_dual = 0;
  /* -min(s1, s2): the gradient flows through s1 unless the clipped branch is strictly smaller,
   * i.e. unless the ratio left the trust region in the direction the advantage pushes it */
  o->loss = -fmin(s1, s2);
  o->dl_dlogp = (o->clipped_low || o->clipped_high) ? 0.0 : -adv * ratio;
  if (dual_c > 0 && adv < 0 && o->loss > -dual_c * adv) {
    o->loss = -dual_c * adv;
    o->dl_dlogp = 0.0;
    o->clipped_dual = 1;
  }
}

double dapo_kl_k3(double logp, double logp_ref, double *dkl_dlogp) {
  double d = logp_ref - logp, ed = exp(d);
  if (dkl_dlogp) *dkl_dlogp = 1.0 - ed;
  return ed - d - 1.0;
}

double dapo_agg_weight(int agg, int len_i, long total_tokens, int n_resp, int max_new) {
  switch (agg) {
  case AGG_SEQ_MEAN_TOKEN_MEAN: return len_i > 0 && n_resp > 0 ? 1.0 / ((double)n_resp * len_i) : 0;
  case AGG_SEQ_MEAN_TOKEN_SUM_NORM: return n_resp > 0 ? 1.0 / ((double)n_resp * max_new) : 0;
  default: return total_tokens > 0 ? 1.0 / (double)total_tokens : 0;
  }
}

double dapo_pass_at_k(int n, int c, int k) {
  if (k > n || k < 1) return NAN;
  if (n - c < k) return 1.0;
  /* 1 - prod_{i = n-c+1}^{n} (1 - k / i) */
  double p = 1.0;
  for (int i = n - c + 1; i <= n; i++) p *= 1.0 - (double)k / i;
  return 1.0 - p;
}

void dapo_token_weights(const struct hparams *hp, int n, const int *len, const double *adv,
                        const float *logp, const float *logp_old, const float *logp_ref,
                        int mb_resp, long mb_tokens, float *w, struct pg_stats *st) {
  long k = 0;
  for (int i = 0; i < n; i++) {
    double wagg = dapo_agg_weight(hp->loss_agg, len[i], mb_tokens, mb_resp, hp->max_new_tokens);
    for (int q = 0; q < len[i]; q++, k++) {
      struct pg_token pg;
      dapo_pg_token(logp[k], logp_old[k], adv[i], hp->eps_low, hp->eps_high, hp->dual_clip_c, &pg);
      double loss = pg.loss, dl = pg.dl_dlogp, kl = 0, dkl = 0;
      if (logp_ref && hp->kl_coef > 0) {
        kl = dapo_kl_k3(logp[k], logp_ref[k], &dkl);
        loss += hp->kl_coef * kl;
        dl += hp->kl_coef * dkl;
      }
      w[k] = (float)(wagg * dl);
      if (!st) continue;
      st->loss += wagg * loss;
      st->kl_ref_sum += kl;
      st->approx_kl_sum += (double)logp_old[k] - logp[k];
      st->clip_low += pg.clipped_low;
      st->clip_high += pg.clipped_high;
      st->clip_dual += pg.clipped_dual;
      if (pg.clipped_high) st->p_clip_high_sum += exp(logp_old[k]);
      st->tokens++;
    }
  }
}
