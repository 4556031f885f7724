/* The DAPO maths pinned to the seed note's worked numbers (../shared/seed): the overlong table,
 * the clip ceilings 0.01 * 1.2 and 0.01 * 1.28 (and their compounding), the 1% / 99% weighting
 * of token-level against sequence-level aggregation, zero advantages for all-equal groups; plus
 * the hyperparameter table's defaults, the grpo preset and its validation messages. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "dapo.h"
#include "hparams.h"

static void test_overlong(void) {
  /* note: L_max 20480, L_buf 4096, p 1; lengths 500, 10000, 18000, 19000, rewards +1 +1 +1 -1 */
  int len[4] = {500, 10000, 18000, 19000};
  double r[4] = {1, 1, 1, -1}, want_min[4] = {1, 1, -1616.0 / 4096, -1},
         want_add[4] = {1, 1, 1 - 1616.0 / 4096, -1 - 2616.0 / 4096};
  int pen_want[4] = {0, 0, 1, 1};
  for (int i = 0; i < 4; i++) {
    int pen;
    CHECK_NEAR(dapo_overlong_shape(r[i], len[i], 20480, 4096, 1.0, OVERLONG_MIN, &pen), want_min[i],
               1e-12);
    CHECK(pen == pen_want[i]);
    CHECK_NEAR(dapo_overlong_shape(r[i], len[i], 20480, 4096, 1.0, OVERLONG_ADDITIVE, NULL),
               want_add[i], 1e-12);
  }
  CHECK_NEAR(dapo_overlong_shape(1, 18000, 20480, 4096, 1.0, OVERLONG_MIN, NULL), -0.39453125,
             1e-12); /* the note's -0.395 */
  /* the penalty is linear: 0 at the threshold 16384, -p at L_max */
  CHECK_NEAR(dapo_overlong_shape(0.5, 16384, 20480, 4096, 1.0, OVERLONG_ADDITIVE, NULL), 0.5, 0);
  CHECK_NEAR(dapo_overlong_shape(0, 20480, 20480, 4096, 1.0, OVERLONG_ADDITIVE, NULL), -1.0, 1e-12);
  CHECK_NEAR(dapo_overlong_shape(0, 16385, 20480, 4096, 1.0, OVERLONG_ADDITIVE, NULL), -1.0 / 4096,
             1e-15);
  /* buffer 0 disables shaping */
  CHECK(dapo_overlong_shape(1, 20480, 20480, 0, 1.0, OVERLONG_MIN, NULL) == 1.0);
}

/* The highest new probability of a token with old probability 0.01 and A > 0 that still gets a
 * gradient: pi_old * (1 + eps_high). Found by bisection on dapo_pg_token's clipping decision. */
static double ceiling(double eps_high) {
  double lo = 0.01, hi = 0.05;
  for (int i = 0; i < 200; i++) {
    double mid = 0.5 * (lo + hi);
    struct pg_token t;
    dapo_pg_token(log(mid), log(0.01), 1.0, 0.2, eps_high, 0, &t);
    if (t.dl_dlogp != 0.0)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static void test_clip(void) {
  CHECK_NEAR(ceiling(0.2), 0.01 * 1.2, 1e-12);   /* symmetric clip (GRPO): 0.012 */
  CHECK_NEAR(ceiling(0.28), 0.01 * 1.28, 1e-12); /* clip-higher (DAPO): 0.0128 */
  /* compounding over updates (each update's ceiling is the next one's start): the note's table.
   * 1.2^n: 0.012, 0.025, 0.062, 0.154 at n = 1, 5, 10, 15; 1.28^n: 0.0128, 0.034 at n = 1, 5.
   * (The note prints 0.112 and 0.365 for 1.28^10 and 1.28^15; the exact values are 0.118 and
   * 0.406.) */
  double p = 0.01, q = 0.01;
  double want_sym[16] = {0}, want_dapo[16] = {0};
  want_sym[1] = 0.012, want_sym[5] = 0.025, want_sym[10] = 0.062, want_sym[15] = 0.154;
  want_dapo[1] = 0.0128, want_dapo[5] = 0.034, want_dapo[10] = 0.118, want_dapo[15] = 0.406;
  for (int n = 1; n <= 15; n++) {
    p = p * (1 + 0.2);
    q = q * (1 + 0.28);
    if (want_sym[n] > 0) CHECK_NEAR(p, want_sym[n], 0.0005);
    if (want_dapo[n] > 0) CHECK_NEAR(q, want_dapo[n], 0.0005);
  }
  /* the lower side is unchanged by clip-higher: A < 0 stops at 1 - eps_low */
  struct pg_token t;
  dapo_pg_token(log(0.0079), log(0.01), -1.0, 0.2, 0.28, 0, &t);
  CHECK(t.clipped_low && t.dl_dlogp == 0.0);
  dapo_pg_token(log(0.0081), log(0.01), -1.0, 0.2, 0.28, 0, &t);
  CHECK(!t.clipped_low && t.dl_dlogp > 0.0);
  /* ratio exactly 1: no clipping, gradient -A, loss -A */
  dapo_pg_token(-2.5, -2.5, 0.7, 0.2, 0.28, 0, &t);
  CHECK(t.ratio == 1.0 && t.dl_dlogp == -0.7 && t.loss == -0.7 && !t.clipped_high);
  /* the clipped branch only stops the gradient in the direction the advantage pushes:
   * A > 0 with a ratio below 1 - eps_low still learns */
  dapo_pg_token(log(0.5), 0, 1.0, 0.2, 0.28, 0, &t);
  CHECK(!t.clipped_low && !t.clipped_high && fabs(t.dl_dlogp + 0.5) < 1e-12);
  /* dual clip: A < 0, ratio 5, c 3: the loss is bounded by -c A = 3 and has no gradient */
  dapo_pg_token(log(5.0), 0, -1.0, 0.2, 0.28, 3.0, &t);
  CHECK(t.clipped_dual && t.loss == 3.0 && t.dl_dlogp == 0.0);
  dapo_pg_token(log(2.0), 0, -1.0, 0.2, 0.28, 3.0, &t);
  CHECK(!t.clipped_dual && fabs(t.loss - 2.0) < 1e-12 && fabs(t.dl_dlogp - 2.0) < 1e-12);
}

static void test_weighting(void) {
  /* the note: o1 50 tokens, o2 5000 tokens, both correct */
  int len[2] = {50, 5000};
  long total = 5050;
  double tok[2], seq[2];
  for (int i = 0; i < 2; i++) {
    tok[i] = dapo_agg_weight(AGG_TOKEN_MEAN, len[i], total, 2, 8192) * len[i];
    seq[i] = dapo_agg_weight(AGG_SEQ_MEAN_TOKEN_MEAN, len[i], total, 2, 8192) * len[i];
  }
  CHECK_NEAR(tok[0], 50.0 / 5050, 1e-15);   /* ~1% */
  CHECK_NEAR(tok[1], 5000.0 / 5050, 1e-15); /* ~99% */
  CHECK_NEAR(tok[0], 0.0099, 0.0001);
  CHECK_NEAR(seq[0], 0.5, 1e-15);
  CHECK_NEAR(seq[1], 0.5, 1e-15);
  /* per token: GRPO gives each of the 5000 tokens 1 / (2 * 5000) = 0.0001 */
  CHECK_NEAR(dapo_agg_weight(AGG_SEQ_MEAN_TOKEN_MEAN, 5000, total, 2, 8192), 0.0001, 1e-15);
  CHECK_NEAR(dapo_agg_weight(AGG_SEQ_MEAN_TOKEN_SUM_NORM, 5000, total, 2, 8192), 1.0 / 16384,
             1e-18);
}

static void test_advantages(void) {
  /* the note's problems A (0/16) and C (16/16): zero advantages */
  double r[16], a[16];
  for (int i = 0; i < 16; i++) r[i] = -1;
  dapo_group_advantages(r, NULL, 16, 1e-6, 1, a);
  for (int i = 0; i < 16; i++) CHECK(a[i] == 0.0);
  for (int i = 0; i < 16; i++) r[i] = 1;
  dapo_group_advantages(r, NULL, 16, 1e-6, 1, a);
  for (int i = 0; i < 16; i++) CHECK(a[i] == 0.0);
  /* problem B: 12 correct, 4 wrong; mean 0.5, unbiased std sqrt(16*0.75/15) */
  for (int i = 0; i < 16; i++) r[i] = i < 12 ? 1 : -1;
  dapo_group_advantages(r, NULL, 16, 1e-6, 1, a);
  double sd = sqrt(12.0 / 15.0);
  CHECK_NEAR(a[0], 0.5 / (sd + 1e-6), 1e-12);
  CHECK_NEAR(a[15], -1.5 / (sd + 1e-6), 1e-12);
  /* Dr.GRPO: no scaling */
  dapo_group_advantages(r, NULL, 16, 1e-6, 0, a);
  CHECK_NEAR(a[0], 0.5, 1e-15);
  CHECK_NEAR(a[15], -1.5, 1e-15);
  /* excluded responses: no advantage, not in the statistics */
  double r3[3] = {1, -1, 100};
  int inc[3] = {1, 1, 0};
  double a3[3];
  dapo_group_advantages(r3, inc, 3, 0, 1, a3);
  CHECK_NEAR(a3[0], 1 / sqrt(2.0), 1e-12);
  CHECK(a3[2] == 0.0);
}

static void test_kl_passk(void) {
  double d;
  CHECK(dapo_kl_k3(-1.0, -1.0, &d) == 0.0 && d == 0.0);
  double k = dapo_kl_k3(-1.0, -1.5, &d); /* ref - theta = -0.5 */
  CHECK_NEAR(k, exp(-0.5) + 0.5 - 1, 1e-15);
  CHECK_NEAR(d, 1 - exp(-0.5), 1e-15);
  CHECK(k > 0);
  CHECK_NEAR(dapo_pass_at_k(4, 1, 1), 0.25, 1e-15);
  CHECK_NEAR(dapo_pass_at_k(4, 1, 4), 1.0, 1e-15);
  CHECK_NEAR(dapo_pass_at_k(5, 2, 2), 0.7, 1e-15);
  CHECK_NEAR(dapo_pass_at_k(32, 0, 8), 0.0, 1e-15);
}

static void test_hparams(void) {
  struct hparams h;
  json_t *errs = json_array();
  CHECK(hparams_parse(&h, NULL, errs) == 0);
  CHECK(h.algorithm == ALGO_DAPO && h.eps_low == 0.2 && h.eps_high == 0.28 && h.dynamic_sampling);
  CHECK(h.loss_agg == AGG_TOKEN_MEAN && h.kl_coef == 0 &&
        h.overlong_buffer == h.max_new_tokens / 5);
  CHECK(h.minibatch_size == h.group_size * h.prompt_batch_size / 4);
  /* grpo preset */
  json_t *g = json_pack("{s:s}", "algorithm", "grpo");
  CHECK(hparams_parse(&h, g, errs) == 0);
  CHECK(h.eps_high == h.eps_low && !h.dynamic_sampling && h.loss_agg == AGG_SEQ_MEAN_TOKEN_MEAN);
  CHECK(h.overlong_buffer == 0 && h.kl_coef == 0.001 && h.gen_batch_multiplier == 1);
  /* an explicit knob wins over the preset */
  json_object_set_new(g, "eps_high", json_real(0.28));
  json_object_set_new(g, "kl_coef", json_real(0));
  CHECK(hparams_parse(&h, g, errs) == 0 && h.eps_high == 0.28 && h.kl_coef == 0);
  json_decref(g);
  /* the paper's values are accepted as given */
  json_t *paper =
      json_pack("{s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:i}", "group_size", 16, "prompt_batch_size", 512,
                "max_new_tokens", 20480, "overlong_buffer", 4096, "learning_rate", 1e-6, "eps_low",
                0.2, "eps_high", 0.28, "lr_warmup_steps", 20);
  CHECK(hparams_parse(&h, paper, errs) == 0);
  CHECK(h.group_size == 16 && h.prompt_batch_size == 512 && h.overlong_buffer == 4096);
  json_decref(paper);
  /* meaningless maths refused, every problem listed by field */
  json_t *bad = json_pack("{s:i,s:f,s:f,s:i,s:i,s:s,s:b,s:i}", "group_size", 1, "eps_low", 1.0,
                          "eps_high", -0.1, "max_new_tokens", 10, "overlong_buffer", 11, "loss_agg",
                          "mean", "frobnicate", 1, "epochs", 0);
  int n = hparams_parse(&h, bad, errs);
  CHECK_MSG(n == 7, "%d problems", n);
  const char *want[] = {"hyperparameters.group_size", "hyperparameters.eps_low",
                        "hyperparameters.eps_high",   "hyperparameters.overlong_buffer",
                        "hyperparameters.loss_agg",   "hyperparameters.frobnicate",
                        "hyperparameters.epochs"};
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    int found = 0;
    for (size_t i = 0; i < json_array_size(errs); i++)
      found |=
          !strcmp(json_string_value(json_object_get(json_array_get(errs, i), "field")), want[w]);
    CHECK_MSG(found, "no error for %s", want[w]);
  }
  json_decref(bad);
  json_array_clear(errs);
  json_t *mb =
      json_pack("{s:i,s:i,s:i}", "group_size", 4, "prompt_batch_size", 2, "minibatch_size", 9);
  CHECK(hparams_parse(&h, mb, errs) == 1);
  CHECK(strstr(json_string_value(json_object_get(json_array_get(errs, 0), "message")),
               "exceeds the responses of a step") != NULL);
  json_decref(mb);
  /* resolved values round-trip */
  json_t *res = hparams_to_json(&h);
  CHECK(json_integer_value(json_object_get(res, "group_size")) == 4);
  CHECK(!strcmp(json_string_value(json_object_get(res, "loss_agg")), "token-mean"));
  json_decref(res);
  json_decref(errs);
}

int main(void) {
  test_overlong();
  test_clip();
  test_weighting();
  test_advantages();
  test_kl_passk();
  test_hparams();
  return check_done("test_dapo");
}
