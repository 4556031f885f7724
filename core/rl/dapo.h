/* The DAPO/GRPO maths of one step as pure functions (DAPO.md): overlong reward shaping, group
 * advantages, the per-token clipped policy-gradient loss and its derivative with respect to the
 * token's log-probability, loss aggregation weights, the k3 KL term, and pass@k. The step itself
 * (runner.c) only wires these to the model; the tests pin them to the seed note's numbers. */
#ifndef DAPO_DAPO_H
#define DAPO_DAPO_H

#include "hparams.h"

/* Overlong shaping of reward r for a response of len tokens (DAPO.md step 2). With
 * buffer == 0 nothing changes. *penalised (may be NULL) is set when len > max_new - buffer. */
double dapo_overlong_shape(double r, int len, int max_new, int buffer, double penalty, int mode,
                           int *penalised);

/* Group advantages over n responses: A_i = (r_i - mean) / (std + eps) with the unbiased (n-1)
 * std over the responses with include[i] != 0 (include may be NULL: all), or r_i - mean when
 * !scale. Excluded responses and groups with fewer than 2 included responses get A = 0. */
void dapo_group_advantages(const double *r, const int *include, int n, double eps, int scale,
                           double *adv);

/* One response token of the clipped surrogate (DAPO.md step 4 and 6). */
struct pg_token {
  double loss;      /* L_t = -min(r A, clip(r, 1-eps_low, 1+eps_high) A), dual-clipped for A<0 */
  double dl_dlogp;  /* dL_t / d logp_theta(o_t) (0 where clipping stops the gradient) */
  double ratio;     /* r_t */
  int clipped_low;  /* A < 0 and r < 1 - eps_low */
  int clipped_high; /* A > 0 and r > 1 + eps_high */
  int clipped_dual; /* A < 0 and the dual bound -c A is the loss */
};
void dapo_pg_token(double logp, double logp_old, double adv, double eps_low, double eps_high,
                   double dual_c, struct pg_token *out);

/* k3 estimate of KL(theta || ref) at one token and its derivative with respect to logp. */
double dapo_kl_k3(double logp, double logp_ref, double *dkl_dlogp);

/* The factor that multiplies each token loss of response i in the minibatch loss:
 * token-mean 1 / total_tokens; seq-mean-token-mean 1 / (n_resp * len_i);
 * seq-mean-token-sum-norm 1 / (n_resp * max_new). len_i, total_tokens and n_resp count only
 * tokens and responses that enter the loss. */
double dapo_agg_weight(int agg, int len_i, long total_tokens, int n_resp, int max_new);

/* Accumulators of dapo_token_weights over a step's updates. */
struct pg_stats {
  double loss;            /* sum over micro-batches of the aggregated loss (policy + KL) */
  double kl_ref_sum;      /* sum of per-token k3 KL to the reference */
  double approx_kl_sum;   /* sum of logp_old - logp (KL(old || new) estimate) */
  double p_clip_high_sum; /* sum of the old probability of tokens clipped at the upper bound */
  long tokens, clip_low, clip_high, clip_dual;
};

/* The per-token weights w = dL/dlogp of one micro-batch of n responses (len[i] tokens each, all
 * entering the loss; token arrays concatenated in response order), where L is the minibatch
 * loss of DAPO.md step 4 aggregated over a minibatch of mb_resp responses and mb_tokens tokens
 * (so that splitting a minibatch into micro-batches never changes the gradient). logp_ref may
 * be NULL (no KL term). Adds to st (may be NULL). */
void dapo_token_weights(const struct hparams *hp, int n, const int *len, const double *adv,
                        const float *logp, const float *logp_old, const float *logp_ref,
                        int mb_resp, long mb_tokens, float *w, struct pg_stats *st);

/* Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (k <= n). */
double dapo_pass_at_k(int n, int c, int k);

#endif
