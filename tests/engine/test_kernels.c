/* Optimised kernels against their naive reference loops: the GEMM/GEMV linear layer, attention
 * (training prefill, and decoding against a cache with n_past > 0, GQA head groups), RoPE
 * (backward is the exact inverse rotation), RMSNorm/SwiGLU backward against finite differences,
 * and the fused classifier against a double-precision log-softmax. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "test_isa.h"
#include "pool.h"
#include "rng.h"

static struct rng R;

static float *rnd(size_t n, float scale) {
  float *x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(&R);
  return x;
}

static float maxdiff(const float *a, const float *b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(a[i] - b[i]);
    m = d > m ? d : m;
  }
  return m;
}

static void test_matmul(int N, int IN, int OUT) {
  float *x = rnd((size_t)N * IN, 1), *w = rnd((size_t)OUT * IN, 0.2f), *b = rnd(OUT, 1);
  float *y = calloc((size_t)N * OUT, sizeof(float)), *yr = calloc((size_t)N * OUT, sizeof(float));
  matmul_forward(y, x, w, b, N, IN, OUT, 0.0f);
  matmul_forward_ref(yr, x, w, b, N, IN, OUT);
  CHECK_MSG(maxdiff(y, yr, (size_t)N * OUT) < 1e-4f, "matmul N=%d IN=%d OUT=%d: %g", N, IN, OUT,
            (double)maxdiff(y, yr, (size_t)N * OUT));
  free(x), free(w), free(b), free(y), free(yr);
}

/* linear_few against the double reference (tolerance), and exactly the same bits: for every
 * instruction set this CPU has (and the baseline build, whose fused multiply-adds are emulated on
 * x86-64), for every column split and for each row computed alone. beta 1 adds to what out
 * held. */
static void test_linear_few(int M, int IN, int OUT) {
  float *x = rnd((size_t)M * IN, 1), *w = rnd((size_t)OUT * IN, 0.2f), *b = rnd(OUT, 1);
  float *y0 = rnd((size_t)M * OUT, 1), *yr = calloc((size_t)M * OUT, sizeof(float));
  float *y = malloc((size_t)M * OUT * sizeof(float)), *ya = malloc((size_t)M * OUT * sizeof(float));
  matmul_forward_ref(yr, x, w, b, M, IN, OUT);
  for (size_t i = 0; i < (size_t)M * OUT; i++) yr[i] += y0[i];
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    int isa = isas[ii];
    kernels_force_isa(isa);
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    linear_few(y, x, w, b, M, IN, OUT, 0, OUT, 1.0f);
    CHECK_MSG(maxdiff(y, yr, (size_t)M * OUT) < 1e-4f, "linear_few isa %d M=%d IN=%d OUT=%d: %g",
              isa, M, IN, OUT, (double)maxdiff(y, yr, (size_t)M * OUT));
    if (isa == KERNELS_ISA_PORTABLE) {
      memcpy(ya, y, (size_t)M * OUT * sizeof(float));
    } else {
      CHECK_MSG(!memcmp(y, ya, (size_t)M * OUT * sizeof(float)),
                "linear_few isa %d differs from the portable version (M=%d IN=%d OUT=%d)", isa, M,
                IN, OUT);
    }
    /* three uneven column ranges, and each row alone, overwrite (beta 0) then add */
    int cut1 = OUT / 3, cut2 = OUT - OUT / 5;
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    for (int m = 0; m < M; m++) {
      float *row = y + (size_t)m * OUT, *r0 = y0 + (size_t)m * OUT;
      const float *xm = x + (size_t)m * IN;
      linear_few(row, xm, w, b, 1, IN, OUT, 0, cut1, 1.0f);
      linear_few(row, xm, w, b, 1, IN, OUT, cut1, cut2, 0.0f);
      for (int j = cut1; j < cut2; j++) row[j] += r0[j];
      linear_few(row, xm, w, b, 1, IN, OUT, cut2, OUT, 1.0f);
    }
    /* (r + y0 in the middle range is y0 + r: float addition commutes exactly) */
    CHECK_MSG(!memcmp(y, ya, (size_t)M * OUT * sizeof(float)),
              "linear_few isa %d: rows alone or split columns differ (M=%d IN=%d OUT=%d)", isa, M,
              IN, OUT);
  }
  kernels_force_isa(0);
  CHECK_MSG(n_isa >= 1, "linear_few: no instruction set ran");
  free(x), free(w), free(b), free(y0), free(yr), free(y), free(ya);
}

/* linear_few_narrow: exactly a chain of fmaf in increasing k from +0 per output (the
 * definition, computed here one output at a time), on every instruction set, for every column
 * split and for each row alone; beta 1 adds it to what out held, beta 0 overwrites. Columns go
 * in pieces of up to 4096 / (16 IN) blocks of 16; IN above 256 takes one block at a time on the
 * heap. And near the double reference, so that the definition itself is right. */
static void test_linear_few_narrow(int M, int IN, int OUT) {
  float *x = rnd((size_t)M * IN, 1), *w = rnd((size_t)OUT * IN, 0.2f);
  float *y0 = rnd((size_t)M * OUT, 1), *want = malloc((size_t)M * OUT * sizeof(float));
  float *y = malloc((size_t)M * OUT * sizeof(float)), *yr = calloc((size_t)M * OUT, sizeof(float));
  float *wt = malloc(linear_few_narrow_floats(IN, OUT) * sizeof(float));
  memset(wt, 0xff, linear_few_narrow_floats(IN, OUT) * sizeof(float)); /* NaN where not written */
  linear_few_narrow_pack(wt, w, IN, OUT);
  for (int m = 0; m < M; m++)
    for (int j = 0; j < OUT; j++) {
      volatile float acc = 0.0f; /* one fmaf at a time, as written */
      for (int k = 0; k < IN; k++) acc = fmaf(x[(size_t)m * IN + k], w[(size_t)j * IN + k], acc);
      want[(size_t)m * OUT + j] = y0[(size_t)m * OUT + j] + acc;
    }
  matmul_forward_ref(yr, x, w, NULL, M, IN, OUT);
  for (size_t i = 0; i < (size_t)M * OUT; i++) yr[i] += y0[i];
  CHECK_MSG(maxdiff(want, yr, (size_t)M * OUT) < 1e-4f, "narrow reference M=%d IN=%d OUT=%d", M, IN,
            OUT);
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    linear_few_narrow(y, x, w, M, IN, OUT, 0, OUT, 1.0f);
    CHECK_MSG(!memcmp(y, want, (size_t)M * OUT * sizeof(float)),
              "linear_few_narrow isa %d differs from fmaf's chain (M=%d IN=%d OUT=%d)", isas[ii], M,
              IN, OUT);
    int cut1 = OUT / 3 + 1, cut2 = OUT - OUT / 5;
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    for (int m = 0; m < M; m++) {
      float *row = y + (size_t)m * OUT, *r0 = y0 + (size_t)m * OUT;
      const float *xm = x + (size_t)m * IN;
      linear_few_narrow(row, xm, w, 1, IN, OUT, 0, cut1, 1.0f);
      linear_few_narrow(row, xm, w, 1, IN, OUT, cut1, cut2, 0.0f);
      for (int j = cut1; j < cut2; j++) row[j] += r0[j];
      linear_few_narrow(row, xm, w, 1, IN, OUT, cut2, OUT, 1.0f);
    }
    CHECK_MSG(!memcmp(y, want, (size_t)M * OUT * sizeof(float)),
              "linear_few_narrow isa %d: rows alone or split columns differ (M=%d IN=%d OUT=%d)",
              isas[ii], M, IN, OUT);
    /* transposed once (linear_few_narrow_packed): the same bits whole, split at blocks of 16
     * (as decoding's ranges are) and at any column (a lead-in to the next block) */
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    linear_few_narrow_packed(y, x, wt, M, IN, OUT, 0, OUT, 1.0f);
    CHECK_MSG(!memcmp(y, want, (size_t)M * OUT * sizeof(float)),
              "linear_few_narrow_packed isa %d differs from fmaf's chain (M=%d IN=%d OUT=%d)",
              isas[ii], M, IN, OUT);
    int c16 = OUT / 2 / 16 * 16;
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    linear_few_narrow_packed(y, x, wt, M, IN, OUT, 0, c16, 1.0f);
    linear_few_narrow_packed(y, x, wt, M, IN, OUT, c16, cut2 > c16 ? cut2 : c16, 1.0f);
    linear_few_narrow_packed(y, x, wt, M, IN, OUT, cut2 > c16 ? cut2 : c16, OUT, 1.0f);
    CHECK_MSG(!memcmp(y, want, (size_t)M * OUT * sizeof(float)),
              "linear_few_narrow_packed isa %d: split columns differ (M=%d IN=%d OUT=%d)", isas[ii],
              M, IN, OUT);
  }
  kernels_force_isa(0);
  CHECK_MSG(n_isa >= 1, "linear_few_narrow: no instruction set ran");
  free(x), free(w), free(y0), free(want), free(y), free(yr), free(wt);
}

static void test_attention(int t_new, int n_past, int NH, int NKV, int HS) {
  int n_ctx = n_past + t_new, CQ = NH * HS, CKV = NKV * HS, rep = NH / NKV;
  float *q = rnd((size_t)t_new * CQ, 1), *k = rnd((size_t)n_ctx * CKV, 1),
        *v = rnd((size_t)n_ctx * CKV, 1);
  float *o = calloc((size_t)t_new * CQ, sizeof(float)), *orf = calloc((size_t)t_new * CQ, 4);
  float *lse = calloc((size_t)t_new * NH, 4), *scr = calloc((size_t)t_new * n_ctx, 4);
  for (int g = 0; g < NKV; g++) {
    attention_forward(o, lse, q, k, v, t_new, n_past, g * rep, rep, g, HS, CQ, CKV, CQ, NH, scr);
    attention_forward_ref(orf, q, k, v, t_new, n_past, g * rep, rep, g, HS, CQ, CKV, CQ);
  }
  CHECK_MSG(maxdiff(o, orf, (size_t)t_new * CQ) < 1e-5f, "attention t=%d past=%d: %g", t_new,
            n_past, (double)maxdiff(o, orf, (size_t)t_new * CQ));
  free(q), free(k), free(v), free(o), free(orf), free(lse), free(scr);
}

/* The attention's backward against a float64 reference of the same gradient (P recomputed in
 * double from q and k): dq of the new rows, dk and dv of every context row, the n_past past rows
 * (a sequence continuing a shared prefix) included; dq/dk/dv accumulate onto what they held. */
static void test_attention_backward(int t_new, int n_past, int NH, int NKV, int HS) {
  int n_ctx = n_past + t_new, CQ = NH * HS, CKV = NKV * HS, rep = NH / NKV;
  size_t nq = (size_t)t_new * CQ, nk = (size_t)n_ctx * CKV;
  float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dout = rnd(nq, 1);
  float *dq = rnd(nq, 1), *dk = rnd(nk, 1), *dv = rnd(nk, 1);
  double *rq = malloc(sizeof(double) * nq), *rk = malloc(sizeof(double) * nk),
         *rv = malloc(sizeof(double) * nk), *p = malloc(sizeof(double) * n_ctx),
         *dp = malloc(sizeof(double) * n_ctx);
  for (size_t i = 0; i < nq; i++) rq[i] = dq[i];
  for (size_t i = 0; i < nk; i++) rk[i] = dk[i], rv[i] = dv[i];
  float *o = calloc(nq, sizeof(float)), *lse = calloc((size_t)t_new * NH, sizeof(float));
  float *scr = calloc(2 * (size_t)t_new * n_ctx, sizeof(float));
  for (int g = 0; g < NKV; g++) {
    attention_forward(o, lse, q, k, v, t_new, n_past, g * rep, rep, g, HS, CQ, CKV, CQ, NH, scr);
    attention_backward(dq, dk, dv, dout, q, k, v, lse, t_new, n_past, g * rep, rep, g, HS, CQ, CKV,
                       CQ, NH, scr);
  }
  double scale = 1.0 / sqrt((double)HS);
  for (int h = 0; h < NH; h++) {
    int g = h / rep;
    for (int i = 0; i < t_new; i++) {
      int lim = n_past + i + 1;
      const float *qi = q + (size_t)i * CQ + h * HS, *di = dout + (size_t)i * CQ + h * HS;
      double mx = -INFINITY, sum = 0, D = 0;
      for (int j = 0; j < lim; j++) {
        double sc = 0;
        for (int d = 0; d < HS; d++) sc += (double)qi[d] * k[(size_t)j * CKV + g * HS + d];
        p[j] = sc * scale;
        mx = p[j] > mx ? p[j] : mx;
      }
      for (int j = 0; j < lim; j++) sum += (p[j] = exp(p[j] - mx));
      for (int j = 0; j < lim; j++) {
        p[j] /= sum;
        dp[j] = 0;
        for (int d = 0; d < HS; d++) dp[j] += (double)di[d] * v[(size_t)j * CKV + g * HS + d];
        D += p[j] * dp[j];
      }
      for (int j = 0; j < lim; j++) {
        double ds = p[j] * (dp[j] - D) * scale;
        for (int d = 0; d < HS; d++) {
          size_t kj = (size_t)j * CKV + g * HS + d;
          rq[(size_t)i * CQ + h * HS + d] += ds * k[kj];
          rk[kj] += ds * qi[d];
          rv[kj] += p[j] * di[d];
        }
      }
    }
  }
  double wq = 0, wk = 0, wv = 0;
  for (size_t i = 0; i < nq; i++) wq = fmax(wq, fabs(dq[i] - rq[i]));
  for (size_t i = 0; i < nk; i++)
    wk = fmax(wk, fabs(dk[i] - rk[i])), wv = fmax(wv, fabs(dv[i] - rv[i]));
  CHECK_MSG(wq < 1e-4 && wk < 1e-4 && wv < 1e-4,
            "attention backward t=%d past=%d: dq %.3g dk %.3g dv %.3g off the float64 reference",
            t_new, n_past, wq, wk, wv);
  free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv), free(rq), free(rk), free(rv);
  free(p), free(dp), free(o), free(lse), free(scr);
}

/* Decoding attention (one new row against a cache) on every instruction set: against the
 * reference, and exactly the same bits (output and log-sum-exp) as this CPU's best, whether the
 * head size has an AVX-512 path (multiples of 16 up to 96, and 128) or not. Context lengths cover
 * the 4-key blocks and 16-lane tails. */
static void test_attention_decode(int n_past, int NH, int NKV, int HS) {
  int n_ctx = n_past + 1, CQ = NH * HS, CKV = NKV * HS, rep = NH / NKV;
  float *q = rnd(CQ, 1), *k = rnd((size_t)n_ctx * CKV, 1), *v = rnd((size_t)n_ctx * CKV, 1);
  float *o[5], *lse[5], *orf = calloc(CQ, 4), *scr = calloc(n_ctx, 4);
  int isas[4], n_isa = isa_list(isas);
  for (int path = 0; path <= n_isa; path++) { /* path 0: the best, unforced */
    kernels_force_isa(path ? isas[path - 1] : 0);
    o[path] = calloc(CQ, 4), lse[path] = calloc(NH, 4);
    for (int g = 0; g < NKV; g++)
      attention_forward(o[path], lse[path], q, k, v, 1, n_past, g * rep, rep, g, HS, CQ, CKV, CQ,
                        NH, scr);
  }
  kernels_force_isa(0);
  for (int g = 0; g < NKV; g++)
    attention_forward_ref(orf, q, k, v, 1, n_past, g * rep, rep, g, HS, CQ, CKV, CQ);
  for (int path = 0; path <= n_isa; path++) {
    int isa = path ? isas[path - 1] : 0;
    CHECK_MSG(maxdiff(o[path], orf, CQ) < 1e-5f, "decode attention (isa %d) past=%d HS=%d: %g", isa,
              n_past, HS, (double)maxdiff(o[path], orf, CQ));
    CHECK_MSG(!memcmp(o[path], o[0], sizeof(float) * CQ) &&
                  !memcmp(lse[path], lse[0], sizeof(float) * NH),
              "decode attention isa %d differs from the best isa (past=%d HS=%d)", isa, n_past, HS);
  }
  /* attention_decode (the sampler's: the heads of a group together where it can) gives exactly
   * attention_forward's bits, for every group, on every instruction set; its scratch is exactly
   * the documented size (ASan sees a write past it) */
  float *scr4 = malloc(sizeof(float) * ATTENTION_DECODE_HEADS * n_ctx);
  float *od = malloc(sizeof(float) * CQ), *ld = malloc(sizeof(float) * NH);
  for (int path = 0; path <= n_isa; path++) {
    int isa = path ? isas[path - 1] : 0;
    kernels_force_isa(isa);
    memset(od, 0xff, sizeof(float) * CQ), memset(ld, 0xff, sizeof(float) * NH);
    for (int g = 0; g < NKV; g++)
      attention_decode(od, ld, q, k, v, n_past, g * rep, rep, g, HS, CKV, scr4);
    CHECK_MSG(!memcmp(od, o[0], sizeof(float) * CQ) && !memcmp(ld, lse[0], sizeof(float) * NH),
              "attention_decode (isa %d, %d heads a group) differs from attention_forward (past=%d "
              "HS=%d)",
              isa, rep, n_past, HS);
  }
  kernels_force_isa(0);
  free(scr4), free(od), free(ld);
  /* and the log-sum-exp itself, for head 0 in double */
  double mx = -1e30, sum = 0, sc[n_ctx];
  for (int j = 0; j < n_ctx; j++) {
    double d = 0;
    for (int i = 0; i < HS; i++) d += (double)q[i] * k[(size_t)j * CKV + i];
    sc[j] = d / sqrt((double)HS);
    mx = sc[j] > mx ? sc[j] : mx;
  }
  for (int j = 0; j < n_ctx; j++) sum += exp(sc[j] - mx);
  CHECK_NEAR(lse[0][0], mx + log(sum), 1e-5);
  free(q), free(k), free(v), free(orf), free(scr);
  for (int path = 0; path <= n_isa; path++) free(o[path]), free(lse[path]);
}

/* The fused multiply-add where rounding twice goes wrong: c + p lands, rounded to double, exactly
 * halfway between two floats while the exact sum lies below it. c = 1 + 2^-23 (odd), p = x w =
 * 2^-24 - 2^-70: fmaf gives c, rounding the double sum to float gives 1 + 2^-22. Lane 0 of
 * linear_few with IN = 17 computes fma(x16, w16, fma(x0, w0, 0)); every instruction set must give
 * fmaf's bits (the baseline build emulates it on x86-64). Then the mirror image, negated. */
static void test_fma_midpoint(void) {
  float x[17] = {0}, w[17] = {0};
  for (int sign = 1; sign >= -1; sign -= 2) {
    x[0] = sign * (1.0f + 0x1p-23f), w[0] = 1.0f;
    x[16] = sign * 0x1p-24f * (1.0f + 0x1p-23f), w[16] = 1.0f - 0x1p-23f;
    volatile float c = x[0], xx = x[16], ww = w[16];
    float want = fmaf(xx, ww, c);
    CHECK(want == sign * (1.0f + 0x1p-23f));
    int isas[4], n_isa = isa_list(isas);
    for (int ii = 0; ii < n_isa; ii++) {
      kernels_force_isa(isas[ii]);
      float y = -7;
      linear_few(&y, x, w, NULL, 1, 17, 1, 0, 1, 0.0f);
      CHECK_MSG(y == want, "fma midpoint isa %d: %a, fmaf %a", isas[ii], (double)y, (double)want);
    }
    kernels_force_isa(0);
  }
}

/* Random BF16 weights and their float32 values (exact). */
static uint16_t *rnd_bf16(size_t n, float scale, float **as_f32) {
  float *f = rnd(n, scale);
  uint16_t *h = malloc(n * sizeof(uint16_t));
  f32_to_bf16(h, f, n);
  bf16_to_f32(f, h, n);
  *as_f32 = f;
  return h;
}

/* Conversions: round to nearest even at the halfway points, NaN and infinities kept, exact back. */
static void test_bf16_convert(void) {
  float in[8] = {
      1.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, -3.0f, INFINITY, NAN, 0x1.fffffep127f, -0.0f};
  float want[8] = {1.0f, 1.0f, 1.0f + 0x1p-6f, -3.0f, INFINITY, NAN, INFINITY, -0.0f};
  uint16_t h[8];
  float back[8];
  f32_to_bf16(h, in, 8);
  bf16_to_f32(back, h, 8);
  for (int i = 0; i < 8; i++) {
    if (isnan(want[i]))
      CHECK_MSG(isnan(back[i]), "bf16 NaN %d: %g", i, (double)back[i]);
    else
      CHECK_MSG(back[i] == want[i] && signbit(back[i]) == signbit(want[i]), "bf16 %d: %a -> %a", i,
                (double)in[i], (double)back[i]);
  }
  /* a long run (the 8-wide conversion and its tail) against the scalar definition */
  enum { n = 37 };
  uint16_t src[n];
  float dst[n];
  for (int i = 0; i < n; i++) src[i] = (uint16_t)(0x3f80 + 97 * i);
  bf16_to_f32(dst, src, n);
  for (int i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    CHECK(dst[i] == f);
  }
}

/* linear_few_bf16 gives exactly linear_few's bits on the float32 of the weights, on every
 * instruction set and column split (beta 1 adding to out). */
static void test_linear_few_bf16(int M, int IN, int OUT) {
  float *wf, *x = rnd((size_t)M * IN, 1), *b = rnd(OUT, 1), *y0 = rnd((size_t)M * OUT, 1);
  uint16_t *w = rnd_bf16((size_t)OUT * IN, 0.2f, &wf);
  float *y = malloc((size_t)M * OUT * sizeof(float)), *yf = malloc((size_t)M * OUT * sizeof(float));
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    memcpy(yf, y0, (size_t)M * OUT * sizeof(float));
    linear_few(yf, x, wf, b, M, IN, OUT, 0, OUT, 1.0f);
    memcpy(y, y0, (size_t)M * OUT * sizeof(float));
    int cut = OUT / 3;
    linear_few_bf16(y, x, w, b, M, IN, OUT, cut, OUT, 1.0f);
    linear_few_bf16(y, x, w, b, M, IN, OUT, 0, cut, 1.0f);
    CHECK_MSG(!memcmp(y, yf, (size_t)M * OUT * sizeof(float)),
              "linear_few_bf16 isa %d differs from linear_few on its weights (M=%d IN=%d OUT=%d)",
              isas[ii], M, IN, OUT);
  }
  kernels_force_isa(0);
  free(x), free(b), free(y0), free(w), free(wf), free(y), free(yf);
}

/* linear_lanes and linear_lanes_bf16: exactly one chain of fmaf in increasing k from +0 per
 * output, then + bias, then added to out (beta 1) or stored (beta 0): the definition computed
 * here one output at a time, against every instruction set, every M in [1, Mmax], the whole
 * range and column ranges aligned to LINEAR_FEW_COLS with a partial last one, float32 and BF16
 * weights (the same bits on the float32 of the BF16 weights). And near the double reference. */
/* variant 0: linear_lanes on wf, 1: linear_lanes_bf16 on w16, 2 and 3: linear_lanes_packed on
 * panels packed from wf (pf) and from w16 (p16), 4 and 5: linear_lanes_block on wf and w16 (the
 * block linear_lanes takes below 16 rows or without AVX-512, at every M) */
static void lanes_call(int variant, float *y, const float *x, const float *wf, const uint16_t *w16,
                       const float *pf, const float *p16, const float *b, int M, int IN, int OUT,
                       int j0, int j1, float beta) {
  if (variant == 0) linear_lanes(y, x, wf, b, M, IN, OUT, j0, j1, beta);
  if (variant == 1) linear_lanes_bf16(y, x, w16, b, M, IN, OUT, j0, j1, beta);
  if (variant == 2 || variant == 3)
    linear_lanes_packed(y, x, variant == 2 ? pf : p16, b, M, IN, OUT, j0, j1, beta);
  if (variant == 4) linear_lanes_block(y, x, wf, NULL, b, M, IN, OUT, j0, j1, beta);
  if (variant == 5) linear_lanes_block(y, x, NULL, w16, b, M, IN, OUT, j0, j1, beta);
  if (variant >= 6) { /* the rows transposed beforehand, for every range: any column count;
                       * 7: BF16 weights */
    size_t nx = linear_lanes_xt_floats(M, IN);
    float *xt = nx ? aligned_alloc(64, (nx * sizeof(float) + 63) / 64 * 64) : NULL;
    if (xt) memset(xt, 0xff, nx * sizeof(float)); /* NaNs where the copy writes nothing */
    const float *p = linear_lanes_prepare(xt, x, M, IN);
    CHECK_MSG(!p || p == xt, "linear_lanes_prepare returned another buffer (M=%d)", M);
    CHECK_MSG(p || !xt || kernels_isa() != KERNELS_ISA_AVX512 || M < 16 ||
                  (M < 64 && 4 * M < 3 * ((M + 15) / 16 * 16)),
              "linear_lanes_prepare made no copy on AVX-512 (M=%d)", M);
    /* the query says where the copy is read: wherever one is made for float32, and for BF16
     * weights from 49 rows (the sampler skips the copy elsewhere) */
    CHECK_MSG(linear_lanes_reads_copy(M, IN, 0) == (p != NULL) &&
                  linear_lanes_reads_copy(M, IN, 1) == (p && M >= 49),
              "linear_lanes_reads_copy(%d, 0 / 1) = %d / %d against the copy %s", M,
              linear_lanes_reads_copy(M, IN, 0), linear_lanes_reads_copy(M, IN, 1),
              p ? "made" : "not made");
    /* the same copy from three column ranges written last first (one empty when IN < 3) */
    float *xc = nx ? aligned_alloc(64, (nx * sizeof(float) + 63) / 64 * 64) : NULL;
    if (xc) memset(xc, 0xff, nx * sizeof(float));
    int k1 = IN / 3, k2 = 2 * IN / 3 + 1 < IN ? 2 * IN / 3 + 1 : IN;
    const float *pc = linear_lanes_prepare_cols(xc, x, M, IN, k2, IN);
    CHECK_MSG(pc == linear_lanes_prepare_cols(xc, x, M, IN, k1, k2) &&
                  pc == linear_lanes_prepare_cols(xc, x, M, IN, 0, k1) && !p == !pc &&
                  (!p || !memcmp(p, pc, nx * sizeof(float))),
              "linear_lanes_prepare_cols: ranges [0, %d), [%d, %d), [%d, %d) differ from the "
              "whole copy (M=%d)",
              k1, k1, k2, k2, IN, M);
    linear_lanes_prepared(y, x, p, variant == 6 ? wf : NULL, variant == 6 ? NULL : w16, b, M, IN,
                          OUT, j0, j1, beta);
    free(xt), free(xc);
  }
}
static const char *const lanes_name[8] = {"",       "_bf16",        "_packed",   "_packed(bf16)",
                                          "_block", "_block(bf16)", "_prepared", "_prepared(bf16)"};

/* every M from Mmin to Mmax */
static void test_linear_lanes(int Mmin, int Mmax, int IN, int OUT) {
  size_t n = (size_t)Mmax * OUT;
  float *wf, *x = rnd((size_t)Mmax * IN, 1), *b = rnd(OUT, 1), *y0 = rnd(n, 1);
  uint16_t *w16 = rnd_bf16((size_t)OUT * IN, 0.2f, &wf);
  float *want = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  float *want_nb = malloc(n * sizeof(float)); /* no bias, beta 1 */
  float *yr = calloc(n, sizeof(float));
  size_t np = linear_lanes_panel_floats(IN, OUT);
  float *pf = malloc(np * sizeof(float)), *p16 = malloc(np * sizeof(float));
  memset(pf, 0xff, np * sizeof(float)); /* NaNs where the pack writes nothing */
  memset(p16, 0xff, np * sizeof(float));
  linear_lanes_pack(pf, wf, NULL, IN, OUT);
  linear_lanes_pack(p16, NULL, w16, IN, OUT);
  CHECK_MSG(np == (size_t)((OUT + 15) / 16) * 16 * IN && !memcmp(pf, p16, np * sizeof(float)),
            "linear_lanes_pack: float32 and BF16 panels differ (IN=%d OUT=%d)", IN, OUT);
  for (int m = 0; m < Mmax; m++)
    for (int j = 0; j < OUT; j++) {
      volatile float acc = 0.0f; /* one fmaf at a time, as written */
      for (int k = 0; k < IN; k++) acc = fmaf(x[(size_t)m * IN + k], wf[(size_t)j * IN + k], acc);
      volatile float r = acc + b[j];
      want[(size_t)m * OUT + j] = y0[(size_t)m * OUT + j] + r;
      want_nb[(size_t)m * OUT + j] = y0[(size_t)m * OUT + j] + acc;
    }
  matmul_forward_ref(yr, x, wf, b, Mmax, IN, OUT);
  for (size_t i = 0; i < n; i++) yr[i] += y0[i];
  CHECK_MSG(maxdiff(want, yr, n) < 1e-4f, "lanes reference IN=%d OUT=%d", IN, OUT);
  /* columns in aligned chunks of 1, 2 and 3 panels, each split overwriting then adding */
  int cut1 = LINEAR_FEW_COLS, cut2 = cut1 + 2 * LINEAR_FEW_COLS;
  cut1 = cut1 < OUT ? cut1 : OUT, cut2 = cut2 < OUT ? cut2 : OUT;
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    for (int bf = 0; bf < 8; bf++)
      for (int M = Mmin; M <= Mmax; M++) {
        size_t nm = (size_t)M * OUT;
        memcpy(y, y0, nm * sizeof(float));
        lanes_call(bf, y, x, wf, w16, pf, p16, b, M, IN, OUT, 0, OUT, 1.0f);
        CHECK_MSG(!memcmp(y, want, nm * sizeof(float)),
                  "linear_lanes%s isa %d differs from fmaf's chain (M=%d IN=%d OUT=%d)",
                  lanes_name[bf], isas[ii], M, IN, OUT);
        /* without a bias, added to out; the rows past M untouched */
        memcpy(y, y0, n * sizeof(float));
        lanes_call(bf, y, x, wf, w16, pf, p16, NULL, M, IN, OUT, 0, OUT, 1.0f);
        CHECK_MSG(!memcmp(y, want_nb, nm * sizeof(float)) &&
                      !memcmp(y + nm, y0 + nm, (n - nm) * sizeof(float)),
                  "linear_lanes%s isa %d without a bias differs from fmaf's chain, or wrote past "
                  "its rows (M=%d IN=%d OUT=%d)",
                  lanes_name[bf], isas[ii], M, IN, OUT);
        memcpy(y, y0, nm * sizeof(float));
        int cuts[4] = {0, cut1, cut2, OUT};
        for (int c = 2; c >= 0; c--) { /* [cut2, OUT) first: the order does not matter */
          if (c == 1)                  /* overwrite, then add y0 here */
            for (int m = 0; m < M; m++)
              for (int j = cuts[1]; j < cuts[2]; j++) y[(size_t)m * OUT + j] = 12345.0f;
          lanes_call(bf, y, x, wf, w16, pf, p16, b, M, IN, OUT, cuts[c], cuts[c + 1],
                     c == 1 ? 0.0f : 1.0f);
          if (c == 1)
            for (int m = 0; m < M; m++)
              for (int j = cuts[1]; j < cuts[2]; j++)
                y[(size_t)m * OUT + j] = y0[(size_t)m * OUT + j] + y[(size_t)m * OUT + j];
        }
        CHECK_MSG(!memcmp(y, want, nm * sizeof(float)),
                  "linear_lanes%s isa %d: split columns differ (M=%d IN=%d OUT=%d)", lanes_name[bf],
                  isas[ii], M, IN, OUT);
      }
  }
  /* no bias, beta 0 */
  kernels_force_isa(0);
  linear_lanes(y, x, wf, NULL, Mmax, IN, OUT, 0, OUT, 0.0f);
  for (size_t i = 0; i < n; i++) want[i] = y0[i] + (y[i] + b[i % OUT]);
  CHECK_MSG(maxdiff(y, yr, n) > 0.1f && maxdiff(want, yr, n) < 1e-4f,
            "linear_lanes without bias, beta 0 (IN=%d OUT=%d)", IN, OUT);
  CHECK_MSG(n_isa >= 1, "linear_lanes: no instruction set ran");
  free(x), free(b), free(y0), free(w16), free(wf), free(want), free(want_nb), free(y), free(yr),
      free(pf), free(p16);
}

/* linear_lanes_adapted: the product (beta 0) then linear_few_narrow's adapter over the same
 * columns, bit for bit: against fmaf's chains, (dot + bias) + the adapter's chain of r, on every
 * instruction set, float32 and BF16 weights, with and without a bias, B as rows and transposed
 * once, whole and in three column ranges (the middle one from a column inside a block of 16), from
 * a prepare's copy and without one; the rows past M untouched */
static void test_linear_lanes_adapted(int Mmin, int Mmax, int IN, int OUT, int r) {
  size_t n = (size_t)Mmax * OUT;
  float *wf, *x = rnd((size_t)Mmax * IN, 1), *bias = rnd(OUT, 1), *xa = rnd((size_t)Mmax * r, 1);
  float *b = rnd((size_t)OUT * r, 0.5f), *y0 = rnd(n, 1), *y = malloc(n * sizeof(float));
  uint16_t *w16 = rnd_bf16((size_t)OUT * IN, 0.2f, &wf);
  float *want[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))}; /* no bias, bias */
  float *bt = malloc(linear_few_narrow_floats(r, OUT) * sizeof(float));
  linear_few_narrow_pack(bt, b, r, OUT);
  for (int m = 0; m < Mmax; m++)
    for (int j = 0; j < OUT; j++) {
      volatile float acc = 0.0f, ad = 0.0f; /* one fmaf at a time, as written */
      for (int k = 0; k < IN; k++) acc = fmaf(x[(size_t)m * IN + k], wf[(size_t)j * IN + k], acc);
      for (int k = 0; k < r; k++) ad = fmaf(xa[(size_t)m * r + k], b[(size_t)j * r + k], ad);
      volatile float rb = acc + bias[j];
      want[0][(size_t)m * OUT + j] = acc + ad;
      want[1][(size_t)m * OUT + j] = rb + ad;
    }
  size_t nx = linear_lanes_xt_floats(Mmax, IN), na = linear_lanes_adapter_floats(Mmax, r);
  CHECK_MSG(na == (size_t)(Mmax + 63) / 64 * 64 * r, "linear_lanes_adapter_floats(%d, %d)", Mmax,
            r);
  float *xt = nx ? aligned_alloc(64, (nx * sizeof(float) + 63) / 64 * 64) : NULL;
  float *xat = malloc(na * sizeof(float));
  int c1 = OUT / 3 + 5 < OUT ? OUT / 3 + 5 : OUT, c2 = 2 * OUT / 3 > c1 ? 2 * OUT / 3 : c1;
  int cuts[4] = {0, c1, c2, OUT}, isas[4], n_isa = isa_list(isas), runs = 0;
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    for (int M = Mmin; M <= Mmax; M++) {
      size_t nm = (size_t)M * OUT;
      memset(xat, 0xff, na * sizeof(float)); /* NaNs where the copy writes nothing */
      linear_lanes_adapter_t(xat, xa, M, r);
      if (xt) memset(xt, 0xff, nx * sizeof(float));
      const float *p = linear_lanes_prepare(xt, x, M, IN);
      for (int v = 0; v < 16; v++) {
        int bf = v & 1, hb = v >> 1 & 1, packed = v >> 2 & 1, split = v >> 3 & 1;
        struct lanes_adapter ad = {xa, xat, b, packed ? bt : NULL, r};
        const float *pv = v == 5 ? NULL : p; /* once without the copy */
        if (v == 6) ad.xat = NULL;           /* once without the adapter's copy */
        memcpy(y, y0, n * sizeof(float));
        for (int c = split ? 2 : 0; c >= 0; c--) /* the last range first: the order is free */
          linear_lanes_adapted(y, x, pv, bf ? NULL : wf, bf ? w16 : NULL, hb ? bias : NULL, M, IN,
                               OUT, split ? cuts[c] : 0, split ? cuts[c + 1] : OUT, &ad);
        CHECK_MSG(!memcmp(y, want[hb], nm * sizeof(float)) &&
                      !memcmp(y + nm, y0 + nm, (n - nm) * sizeof(float)),
                  "linear_lanes_adapted isa %d (%s%s%s%s) differs from fmaf's chains, or wrote "
                  "past its rows (M=%d IN=%d OUT=%d r=%d)",
                  isas[ii], bf ? "BF16" : "float32", hb ? ", bias" : "", packed ? ", B packed" : "",
                  split ? ", split" : "", M, IN, OUT, r);
        runs++;
      }
    }
  }
  kernels_force_isa(0);
  CHECK_MSG(runs > 0, "linear_lanes_adapted: nothing ran");
  free(x), free(bias), free(xa), free(b), free(y0), free(y), free(w16), free(wf), free(want[0]),
      free(want[1]), free(bt), free(xt), free(xat);
}

/* linear_lanes on a pool's threads, each its columns ([0, 96) and [96, 200): rows in the lanes
 * on AVX-512, with the buffer each thread keeps from call to call, grown for a longer IN, freed
 * when the pool's threads end), the same bits as the whole range on this thread */
struct lanes_pool_ctx {
  float *y;
  const float *x, *w, *b;
  int M, IN, OUT;
};
static void lanes_pool_task(void *ctx, int i, int n) {
  const struct lanes_pool_ctx *c = ctx;
  int j0 = i == 0 ? 0 : 96, j1 = i == n - 1 ? c->OUT : 96;
  linear_lanes(c->y, c->x, c->w, c->b, c->M, c->IN, c->OUT, j0, j1, 0.0f);
}
static void test_linear_lanes_pool(void) {
  struct pool *p = pool_new(2);
  CHECK_MSG(p != NULL, "pool_new(2)");
  if (!p) return;
  for (int IN = 24; IN <= 300; IN += 276) {
    int M = 64, OUT = 200;
    float *x = rnd((size_t)M * IN, 1), *w = rnd((size_t)OUT * IN, 0.2f), *b = rnd(OUT, 1);
    float *want = malloc(sizeof(float) * M * OUT), *y = malloc(sizeof(float) * M * OUT);
    linear_lanes(want, x, w, b, M, IN, OUT, 0, OUT, 0.0f);
    for (int rep = 0; rep < 2; rep++) {
      memset(y, 0xff, sizeof(float) * M * OUT);
      struct lanes_pool_ctx c = {y, x, w, b, M, IN, OUT};
      pool_run(p, lanes_pool_task, &c);
      CHECK_MSG(!memcmp(y, want, sizeof(float) * M * OUT),
                "linear_lanes on 2 threads differs from one (IN=%d, call %d)", IN, rep);
    }
    free(x), free(w), free(b), free(want), free(y);
  }
  pool_free(p);
}

/* max over [rows, C] of |got - want| / sum_k |a[r, k] w[c * wc + k * wk]|, a: [rows, K] */
static double worst_rel(const float *got, const float *want, const float *a, const float *w,
                        int rows, int C, int K, int wc, int wk) {
  double worst = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) {
      double mag = 0;
      for (int k = 0; k < K; k++)
        mag += fabs((double)a[(size_t)r * K + k] * w[(size_t)c * wc + (size_t)k * wk]);
      double d = fabs((double)got[(size_t)r * C + c] - want[(size_t)r * C + c]) / (mag + 1e-30);
      worst = d > worst ? d : worst;
    }
  return worst;
}

/* The many-row BF16 products against the float32 kernels on the same (rounded) weights: within
 * 2e-6 of sum |a| |w| per element (float rounding in another order of sums), serially and split
 * over a pool with no work threshold. */
static void test_matmul_bf16(int N, int IN, int OUT, struct pool *pool) {
  float *wf, *x = rnd((size_t)N * IN, 1), *b = rnd(OUT, 1), *dy = rnd((size_t)N * OUT, 1);
  uint16_t *w = rnd_bf16((size_t)OUT * IN, 0.2f, &wf);
  float *y = rnd((size_t)N * OUT, 1), *yf = malloc((size_t)N * OUT * sizeof(float));
  float *dx = rnd((size_t)N * IN, 1), *dxf = malloc((size_t)N * IN * sizeof(float));
  memcpy(yf, y, (size_t)N * OUT * sizeof(float));
  memcpy(dxf, dx, (size_t)N * IN * sizeof(float));
  pool_set_current(pool);
  long pmw = kernels_par_min_work();
  if (pool) kernels_set_par_min_work(0);
  for (int beta = 0; beta <= 1; beta++) {
    matmul_forward(yf, x, wf, b, N, IN, OUT, (float)beta);
    CHECK(matmul_forward_bf16(y, x, w, b, N, IN, OUT, (float)beta) == 0);
    matmul_backward(dxf, NULL, NULL, dy, x, wf, N, IN, OUT, (float)beta);
    CHECK(matmul_backward_dinp_bf16(dx, dy, w, N, IN, OUT, (float)beta) == 0);
  }
  kernels_set_par_min_work(pmw);
  pool_set_current(NULL);
  /* the bound: each product's magnitude summed (beta 1 added the first pass's result once) */
  double worst_f = worst_rel(y, yf, x, wf, N, OUT, IN, IN, 1);
  double worst_b = worst_rel(dx, dxf, dy, wf, N, IN, OUT, 1, IN);
  CHECK_MSG(worst_f <= 2e-6, "matmul_forward_bf16 N=%d IN=%d OUT=%d pool=%d: %g of sum|x||w|", N,
            IN, OUT, pool != NULL, worst_f);
  CHECK_MSG(worst_b <= 2e-6, "matmul_backward_dinp_bf16 N=%d IN=%d OUT=%d pool=%d: %g", N, IN, OUT,
            pool != NULL, worst_b);
  free(x), free(b), free(dy), free(w), free(wf), free(y), free(yf), free(dx), free(dxf);
}

static void test_rope(void) {
  struct rope_table t;
  CHECK(rope_table_init(&t, 64, 8, 10000.0f) == 0);
  int pos[5] = {0, 3, 17, 63, 5};
  float *x = rnd(5 * 16, 1), *y = malloc(5 * 16 * sizeof(float));
  memcpy(y, x, 5 * 16 * sizeof(float));
  rope_forward(y, pos, 5, 16, 2, 8, &t);
  /* position 0 is the identity; norms are preserved; backward inverts */
  CHECK(maxdiff(x, y, 16) == 0.0f);
  double nx = 0, ny = 0;
  for (int i = 0; i < 80; i++) nx += (double)x[i] * x[i], ny += (double)y[i] * y[i];
  CHECK_NEAR(nx, ny, 1e-4 * nx);
  rope_backward(y, pos, 5, 16, 2, 8, &t);
  CHECK(maxdiff(x, y, 80) < 1e-5f);
  /* one rotation by hand: pos 3, pair i=1 rotates by 3 * 10000^(-2/8) */
  float a = 3.0f * powf(10000.0f, -0.25f);
  float z[8] = {0, 1, 0, 0, 0, 0, 0, 0};
  int p3 = 3;
  rope_forward(z, &p3, 1, 8, 1, 8, &t);
  CHECK_NEAR(z[1], cosf(a), 1e-6);
  CHECK_NEAR(z[5], sinf(a), 1e-6);
  rope_table_deinit(&t);
  free(x), free(y);
}

/* d/dx of sum(r * f(x)) by central differences in double-checked float. */
static void test_rmsnorm_swiglu(void) {
  enum { N = 3, C = 7 };
  float *x = rnd(N * C, 1), *w = rnd(C, 1), *dy = rnd(N * C, 1);
  float y[N * C], rstd[N], dx[N * C] = {0}, dw[C] = {0};
  rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
  rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
  for (int i = 0; i < N * C; i++) {
    float old = x[i], h = 1e-2f;
    double l[2];
    for (int s = 0; s < 2; s++) {
      x[i] = old + (s ? -h : h);
      rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
      l[s] = 0;
      for (int j = 0; j < N * C; j++) l[s] += (double)dy[j] * y[j];
    }
    x[i] = old;
    CHECK_NEAR(dx[i], (l[0] - l[1]) / (2 * h), 2e-3 + 1e-2 * fabs(dx[i]));
  }
  float g[C], u[C], hh[C], dg[C], du[C];
  for (int i = 0; i < C; i++) g[i] = (float)i - 3.0f, u[i] = 0.5f * (float)i - 1.0f;
  swiglu_forward(hh, g, u, C);
  float ones[C];
  for (int i = 0; i < C; i++) ones[i] = 1.0f;
  swiglu_backward(dg, du, ones, g, u, C);
  for (int i = 0; i < C; i++) {
    double gi = g[i], sig = 1 / (1 + exp(-gi));
    CHECK_NEAR(hh[i], gi * sig * u[i], 1e-6);
    double e = 1e-3, fp = (gi + e) / (1 + exp(-(gi + e))), fm = (gi - e) / (1 + exp(-(gi - e)));
    CHECK_NEAR(dg[i], u[i] * (fp - fm) / (2 * e), 1e-4);
    CHECK_NEAR(du[i], gi * sig, 1e-6);
  }
  free(x), free(w), free(dy);
}

/* RMSNorm's rows side by side (kernels.c, rms_sums): every row has the bits of the one-row
 * chains written out here (sums in double in increasing i), for row counts that take blocks of
 * 8, 4 and single rows, in place as the sampler and block.c call it, in the backward, and split
 * over a pool's 2 threads. Sums in float, or a row's sum taken from another row's values, fail
 * it (a double sum in another order almost never moves a float's bits at these sizes). */
static void test_rmsnorm_rows(void) {
  enum { C = 37, NMAX = 23 };
  float *x = rnd(NMAX * C, 3), *w = rnd(C, 1), *dy = rnd(NMAX * C, 1);
  struct pool *p = pool_new(2);
  CHECK_MSG(p != NULL, "pool_new(2)");
  long pmw = kernels_par_min_work();
  kernels_set_par_min_work(0); /* with the pool current: split over its 2 threads */
  for (int N = 1, pooled = 0; N <= NMAX; N += pooled, pooled = !pooled) {
    pool_set_current(pooled ? p : NULL);
    float y[NMAX * C], rstd[NMAX], dx[NMAX * C], ry[NMAX * C], rr[NMAX], rdx[NMAX * C];
    for (int n = 0; n < N; n++) { /* the reference: one row at a time */
      const float *xr = x + n * C, *dr = dy + n * C;
      double ss = 0, dot = 0;
      for (int i = 0; i < C; i++) ss += (double)xr[i] * xr[i];
      rr[n] = (float)(1.0 / sqrt(ss / C + (double)1e-5f));
      for (int i = 0; i < C; i++) ry[n * C + i] = (xr[i] * rr[n]) * w[i];
      for (int i = 0; i < C; i++) dot += (double)dr[i] * w[i] * xr[i];
      float k = (float)(dot / C) * rr[n] * rr[n] * rr[n];
      for (int i = 0; i < C; i++) rdx[n * C + i] = 0.5f + (rr[n] * dr[i] * w[i] - k * xr[i]);
    }
    rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
    CHECK_MSG(!memcmp(y, ry, sizeof(float) * N * C) && !memcmp(rstd, rr, sizeof(float) * N), "N %d",
              N);
    memcpy(y, x, sizeof(float) * N * C); /* in place */
    rmsnorm_forward(y, NULL, y, w, N, C, 1e-5f);
    CHECK_MSG(!memcmp(y, ry, sizeof(float) * N * C), "in place, N %d pooled %d", N, pooled);
    for (int i = 0; i < N * C; i++) dx[i] = 0.5f;
    rmsnorm_backward(dx, NULL, dy, x, w, rr, N, C);
    CHECK_MSG(!memcmp(dx, rdx, sizeof(float) * N * C), "backward, N %d pooled %d", N, pooled);
  }
  pool_set_current(NULL);
  kernels_set_par_min_work(pmw);
  pool_free(p);
  free(x), free(w), free(dy);
}

/* SwiGLU's vector forms (kernels.c, sw_any): against double precision for g over [-100, 100]
 * (exp(-|g|) below the clamp at the ends), the same bits on every instruction set, and an
 * element's bits whatever range it is computed in (offsets 0-3, lengths with partial vectors);
 * the backward in place (dg over dh, as train.c calls it). */
static void test_swiglu_isa(void) {
  enum { N = 203 };
  float g[N], u[N], dh[N], h[4][N], dg[4][N], du[4][N], t[N];
  struct rng r;
  rng_seed(&r, 77, 0);
  for (int i = 0; i < N; i++) {
    g[i] = i < 8 ? (float)(i - 4) * 25.0f : (float)(8 * rng_normal(&r));
    u[i] = (float)rng_normal(&r), dh[i] = (float)rng_normal(&r);
  }
  g[9] = -0.0f, g[10] = 0.0f;
  int isas[4], n_isa = isa_list(isas);
  for (int k = 0; k < n_isa; k++) {
    kernels_force_isa(isas[k]);
    swiglu_forward(h[k], g, u, N);
    memcpy(dg[k], dh, sizeof dh); /* dg over dh */
    swiglu_backward(dg[k], du[k], dg[k], g, u, N);
    for (int i = 0; i < N; i++) {
      double gi = g[i], sig = 1 / (1 + exp(-gi)), d = dh[i];
      CHECK_NEAR(h[k][i], gi * sig * u[i], 1e-6 + 1e-6 * fabs(gi * sig * u[i]));
      CHECK_NEAR(du[k][i], d * gi * sig, 1e-6 + 1e-6 * fabs(d * gi * sig));
      double want = d * u[i] * sig * (1 + gi * (1 - sig));
      CHECK_NEAR(dg[k][i], want, 1e-6 + 2e-6 * fabs(want));
    }
    CHECK_MSG(!memcmp(h[k], h[0], sizeof h[0]) && !memcmp(dg[k], dg[0], sizeof dg[0]) &&
                  !memcmp(du[k], du[0], sizeof du[0]),
              "swiglu: instruction set %d differs from %d", isas[k], isas[0]);
    for (int off = 0; off < 4; off++) /* the same bits from any start and length */
      for (int len = 1; off + len <= N; len += 37) {
        memset(t, 0, sizeof t);
        swiglu_forward(t + off, g + off, u + off, (size_t)len);
        CHECK_MSG(!memcmp(t + off, h[0] + off, sizeof(float) * (size_t)len),
                  "swiglu isa %d: elements [%d, %d) differ computed alone", isas[k], off,
                  off + len);
      }
  }
  kernels_force_isa(0);
}

/* The classifier against a double-precision log-softmax, for row widths inside one chunk of its
 * sums and across several with a partial vector at the end; the same bits on every instruction
 * set; a NaN or an infinity among a row's logits gives a NaN log-prob (never a finite one). */
static void test_classifier(int V) {
  enum { Rr = 4 };
  float *z = rnd((size_t)Rr * V, 3), *zc = malloc(sizeof(float) * Rr * V);
  memcpy(zc, z, sizeof(float) * Rr * V);
  int tg[Rr] = {0, 7 % V, V - 1, 13 % V};
  float lp[Rr], ent[Rr], it = 1.0f / 0.6f;
  classifier_forward(z, lp, ent, tg, NULL, Rr, V, it);
  for (int r = 0; r < Rr; r++) {
    double m = -1e30, s = 0, pz = 0;
    for (int j = 0; j < V; j++) m = fmax(m, (double)zc[r * V + j] * it);
    for (int j = 0; j < V; j++) s += exp((double)zc[r * V + j] * it - m);
    double lse = m + log(s);
    for (int j = 0; j < V; j++) {
      double zz = (double)zc[r * V + j] * it, p = exp(zz - lse);
      pz += p * zz;
      CHECK_NEAR(z[r * V + j], p, 1e-6);
    }
    CHECK_NEAR(lp[r], zc[r * V + tg[r]] * it - lse, 1e-5);
    CHECK_NEAR(ent[r], lse - pz, 1e-5);
  }
  /* the log-probs alone (no backward follows): the same bits, the row left scaled */
  float lp2[Rr];
  memcpy(z, zc, sizeof(float) * Rr * V);
  classifier_logprobs(z, lp2, tg, NULL, Rr, V, it);
  for (int r = 0; r < Rr; r++) {
    CHECK(memcmp(&lp2[r], &lp[r], sizeof(float)) == 0);
    CHECK(z[r * V + 3] == zc[r * V + 3] * it);
  }
  /* every instruction set: the same log-probs, entropies and probabilities */
  float *z0 = malloc(sizeof(float) * Rr * V);
  memcpy(z0, zc, sizeof(float) * Rr * V);
  classifier_forward(z0, lp, ent, tg, NULL, Rr, V, it);
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    float lpi[Rr], enti[Rr];
    memcpy(z, zc, sizeof(float) * Rr * V);
    classifier_forward(z, lpi, enti, tg, NULL, Rr, V, it);
    CHECK_MSG(!memcmp(lpi, lp, sizeof lp) && !memcmp(enti, ent, sizeof ent) &&
                  !memcmp(z, z0, sizeof(float) * Rr * V),
              "classifier isa %d differs (V=%d)", isas[ii], V);
  }
  kernels_force_isa(0);
  /* a NaN (row 1) or an infinity (row 2) away from the target */
  memcpy(z, zc, sizeof(float) * Rr * V);
  z[1 * V + (V > 1 ? (tg[1] + 1) % V : 0)] = NAN;
  z[2 * V + V / 2] = INFINITY;
  classifier_logprobs(z, lp2, tg, NULL, Rr, V, it);
  CHECK_MSG(isnan(lp2[1]) && isnan(lp2[2]) && !isnan(lp2[0]) && !isnan(lp2[3]),
            "classifier V=%d: NaN/infinity rows give %g %g", V, (double)lp2[1], (double)lp2[2]);
  free(z), free(zc), free(z0);
}

/* The classifier under a mask of allowed ids (structured outputs): the log-prob, entropy and
 * probabilities of the softmax over the allowed ids alone (a double-precision reference), exactly
 * 0 elsewhere, so the backward's logit gradient there is exactly 0 (its others checked by a
 * finite difference of the masked log-prob); the log-probs alone give the same bits; every
 * instruction set the same bits. */
static void test_classifier_masked(int V) {
  enum { Rr = 4 };
  size_t W = ((size_t)V + 63) / 64;
  float *z = rnd((size_t)Rr * V, 3), *zc = malloc(sizeof(float) * Rr * V);
  uint64_t *al = calloc((size_t)Rr * W, sizeof *al);
  memcpy(zc, z, sizeof(float) * Rr * V);
  int tg[Rr] = {0, 7 % V, V - 1, 13 % V};
  for (int r = 0; r < Rr; r++) /* about a third of the ids, the target always */
    for (int j = 0; j < V; j++)
      if (j == tg[r] || (j * 7 + r * 3) % 3 == 0) al[r * W + j / 64] |= 1ull << (j % 64);
  float lp[Rr], ent[Rr], it = 1.0f / 0.6f;
  classifier_forward(z, lp, ent, tg, al, Rr, V, it);
  for (int r = 0; r < Rr; r++) {
    double m = -1e30, s = 0, pz = 0;
#define ALLOWED(j) (al[r * W + (j) / 64] >> ((j) % 64) & 1)
    for (int j = 0; j < V; j++)
      if (ALLOWED(j)) m = fmax(m, (double)zc[r * V + j] * it);
    for (int j = 0; j < V; j++)
      if (ALLOWED(j)) s += exp((double)zc[r * V + j] * it - m);
    double lse = m + log(s);
    int n_zero = 0;
    for (int j = 0; j < V; j++) {
      double zz = (double)zc[r * V + j] * it, p = ALLOWED(j) ? exp(zz - lse) : 0;
      if (ALLOWED(j)) pz += p * zz;
      CHECK_NEAR(z[r * V + j], p, 1e-6);
      n_zero += !ALLOWED(j) && z[r * V + j] == 0.0f && !signbit(z[r * V + j]);
    }
    int n_out = 0;
    for (int j = 0; j < V; j++) n_out += !ALLOWED(j);
    CHECK_MSG(n_zero == n_out, "masked V=%d row %d: %d of %d masked probabilities are +0", V, r,
              n_zero, n_out);
    CHECK_NEAR(lp[r], zc[r * V + tg[r]] * it - lse, 1e-5);
    CHECK_NEAR(ent[r], lse - pz, 1e-5);
  }
  /* the backward: exactly 0 outside the mask; inside, the derivative of w * logp by the logit
   * (a central difference of the masked log-prob, in double) */
  float w[Rr] = {1.0f, -0.5f, 2.0f, 0.25f};
  classifier_backward(z, w, tg, Rr, V, it);
  for (int r = 0; r < Rr; r++)
    for (int j = 0; j < V; j++) {
      if (!ALLOWED(j)) {
        CHECK_MSG(z[r * V + j] == 0.0f, "masked V=%d: dlogit[%d][%d] = %g", V, r, j,
                  (double)z[r * V + j]);
        continue;
      }
      if (j % 5) continue; /* a sample of the allowed ids */
      double f[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        double h = sgn ? -1e-3 : 1e-3, m = -1e30, s = 0;
        for (int k = 0; k < V; k++)
          if (ALLOWED(k)) m = fmax(m, ((double)zc[r * V + k] + (k == j ? h : 0)) * it);
        for (int k = 0; k < V; k++)
          if (ALLOWED(k)) s += exp(((double)zc[r * V + k] + (k == j ? h : 0)) * it - m);
        f[sgn] = w[r] * (((double)zc[r * V + tg[r]] + (tg[r] == j ? h : 0)) * it - m - log(s));
      }
      CHECK_NEAR(z[r * V + j], (f[0] - f[1]) / 2e-3, 1e-3); /* d(w logp) / dlogit */
    }
#undef ALLOWED
  /* the log-probs alone: the same bits */
  float lp2[Rr];
  memcpy(z, zc, sizeof(float) * Rr * V);
  classifier_logprobs(z, lp2, tg, al, Rr, V, it);
  CHECK(!memcmp(lp2, lp, sizeof lp));
  /* every instruction set: the same bits */
  float *z0 = malloc(sizeof(float) * Rr * V);
  memcpy(z0, zc, sizeof(float) * Rr * V);
  classifier_forward(z0, lp, ent, tg, al, Rr, V, it);
  int isas[4], n_isa = isa_list(isas);
  for (int ii = 0; ii < n_isa; ii++) {
    kernels_force_isa(isas[ii]);
    float lpi[Rr], enti[Rr];
    memcpy(z, zc, sizeof(float) * Rr * V);
    classifier_forward(z, lpi, enti, tg, al, Rr, V, it);
    CHECK_MSG(!memcmp(lpi, lp, sizeof lp) && !memcmp(enti, ent, sizeof ent) &&
                  !memcmp(z, z0, sizeof(float) * Rr * V),
              "masked classifier isa %d differs (V=%d)", isas[ii], V);
  }
  kernels_force_isa(0);
  free(z), free(zc), free(z0), free(al);
}

int main(void) {
  rng_seed(&R, 5, 5);
  test_matmul(1, 33, 17); /* GEMV path */
  test_matmul(16, 64, 48);
  test_matmul(37, 100, 3);
  test_linear_few(16, 288, 40); /* IN a multiple of 16 */
  test_linear_few(7, 61, 13);   /* partial tiles and a 13-element tail */
  test_linear_few(1, 8, 5);     /* shorter than one vector */
  test_linear_few(5, 100, 9);
  test_linear_few(3, 896, 37); /* Qwen2.5-0.5B's hidden size */
  test_linear_few(66, 40, 23); /* 4x6 tiles: partial in rows, columns and the k tail */
  test_linear_few(1, 128, 37); /* 1x16 tiles (fewer than 4 rows): a partial block */
  test_linear_few(2, 61, 50);  /* 1x16 tiles with a k tail */
  test_linear_few(3, 896, 16);
  test_linear_few_narrow(1, 16, 5);    /* fewer columns than lanes */
  test_linear_few_narrow(64, 16, 896); /* LoRA r = 16 at Qwen2.5-0.5B's width, 64 sequences */
  test_linear_few_narrow(7, 3, 37);    /* partial blocks of 16 */
  test_linear_few_narrow(5, 70, 40);   /* 70 inputs: pieces of 3 blocks of 16 columns */
  test_linear_few_narrow(6, 16, 600);  /* pieces of 256 columns: two whole and one of 88 */
  test_linear_few_narrow(3, 300, 20);  /* more than 256 inputs: one block at a time, on the heap */
  test_linear_few_narrow(13, 16, 33);  /* groups of 4 rows and a partial one */
  test_linear_few_narrow(9, 16, 48);   /* a row past whole groups of 4 (or 8), blocks of 16 */
  test_linear_few_narrow(23, 8, 30);   /* a partial group of 3 after groups of 4 (7 after 8) */
  test_fma_midpoint();
  test_bf16_convert();
  test_linear_few_bf16(16, 288, 40);
  test_linear_few_bf16(1, 128, 37); /* 1x16 tiles converted in registers */
  test_linear_few_bf16(3, 64, 50);
  test_linear_few_bf16(7, 61, 13);
  test_linear_few_bf16(1, 8, 5);
  test_linear_few_bf16(3, 1500, 9);  /* 4 rows a block, on the heap */
  test_linear_few_bf16(2, 16400, 6); /* on the heap */
  /* AVX-512: converted in registers, 16 row tiles reading the kept block; one row tile (nothing
   * kept); a block on the heap */
  test_linear_few_bf16(64, 896, 14);
  test_linear_few_bf16(3, 4864, 7);
  test_linear_few_bf16(5, 4864, 7);
  test_linear_lanes(1, 70, 37, 53); /* every M to 70 (6 tiles of 12 rows); odd IN and OUT */
  /* rows in the lanes (float32 on AVX-512, 16 rows and more, 96 columns and more: the whole
   * range and [48, 200), over blocks of 48 columns, a partial one last), 64 rows and a few more
   * (a second block of 6 rows, the block's); the block on the other ISAs and BF16 */
  test_linear_lanes(1, 70, 40, 200);
  test_linear_lanes(1, 96, 20, 40); /* two blocks of rows, the second taken from 16 rows */
  test_linear_lanes_pool();
  /* the adapter added with the sums where rows are in the lanes (16 rows on, float32 on AVX-512;
   * 49 BF16), after the block elsewhere; two blocks of 64 rows and 2 on the block; r = 1 */
  test_linear_lanes_adapted(1, 20, 40, 50, 16);
  test_linear_lanes_adapted(128, 130, 40, 70, 4);
  test_linear_lanes_adapted(64, 64, 896, 200, 1);
  test_linear_lanes(1, 13, 600, 19); /* IN over 2 blocks of 256 k, with a tail */
  test_linear_lanes(1, 3, 5, 70);
  test_linear_lanes(1, 2, 128, 200);   /* a lone row over 13 panels (groups of 8 and 4, partial) */
  test_linear_lanes(63, 65, 1100, 50); /* rows in the lanes over more than 1024 inputs */
  /* AVX-512's rows in the lanes with BF16 rows in chunks of inputs (the sums carried from chunk to
   * chunk; 16: chunks of 16 and a tail of 5 or 12; 40: of 48; 0: whole rows) and the next tile's
   * rows widened by the tile or before it: the same bits (49 rows and more, where BF16 takes rows
   * in the lanes; 101 columns: the blocks' last tile widens the next block's first chunk, longer
   * than its own) */
  static const int lanes_forms[][2] = {{16, 1}, {16, 0}, {40, 1}, {0, 1}, {0, 0}};
  for (int f = 0; f < 5; f++) {
    linear_lanes_set_form(lanes_forms[f][0], lanes_forms[f][1]);
    test_linear_lanes(49, 66, 37, 101);
    test_linear_lanes(63, 65, 300, 60);
    test_linear_lanes_adapted(49, 66, 37, 101, 16);
    test_linear_lanes_adapted(63, 65, 300, 60, 3);
  }
  linear_lanes_set_form(-1, -1);
  struct pool *pool = pool_new(3);
  for (int p = 0; p < 2; p++) {
    struct pool *use = p ? pool : NULL;
    test_matmul_bf16(1, 33, 17, use);     /* N = 1: linear_few_bf16 */
    test_matmul_bf16(7, 61, 13, use);     /* few rows */
    test_matmul_bf16(37, 100, 3, use);    /* SGEMM, fewer columns than threads */
    test_matmul_bf16(40, 3000, 300, use); /* several weight tiles each way */
    test_matmul_bf16(9, 17, 1000, use);
  }
  pool_free(pool);
  test_attention(9, 0, 4, 2, 8);           /* training prefill, GQA */
  test_attention(1, 12, 4, 1, 8);          /* one decoding step against a cache, MQA */
  test_attention(3, 5, 6, 6, 4);           /* several new tokens after a cached prefix, MHA */
  test_attention_backward(9, 0, 4, 2, 8);  /* a whole sequence, GQA */
  test_attention_backward(5, 7, 4, 1, 8);  /* continuing a shared prefix, MQA */
  test_attention_backward(2, 11, 6, 6, 4); /* a short continuation, MHA */
  test_attention_backward(6, 3, 4, 2, 16); /* the attention forward's t_new > 2 path */
  test_attention_decode(0, 2, 1, 16);
  test_attention_decode(2, 4, 2, 48);
  test_attention_decode(5, 6, 6, 48);
  test_attention_decode(130, 8, 8, 64);
  test_attention_decode(37, 4, 2, 128);
  test_attention_decode(20, 2, 2, 40); /* not a multiple of 16: the vector-extension code only */
  test_attention_decode(9, 2, 1, 8);   /* shorter than one vector */
  test_attention_decode(33, 2, 2, 256);
  /* grouped query heads: every AVX-512 group size (4 heads a pass at 16-32 lanes, 3 at 48-64,
   * 2 above) with the heads left over one at a time, contexts in and out of whole 4-key blocks */
  test_attention_decode(130, 14, 2, 64); /* Qwen2.5-0.5B: 7 heads a group, 3 + 3 + 1 */
  test_attention_decode(66, 8, 1, 32);
  test_attention_decode(18, 7, 1, 16);
  test_attention_decode(40, 6, 1, 48);
  test_attention_decode(2, 5, 1, 80);
  test_attention_decode(49, 6, 2, 96);
  test_attention_decode(69, 4, 1, 128);
  test_attention_decode(1, 3, 1, 64);
  test_rope();
  test_rmsnorm_swiglu();
  test_rmsnorm_rows();
  test_swiglu_isa();
  test_classifier(50);
  test_classifier(16);
  test_classifier(1203); /* several chunks of sums, a partial vector at the end */
  test_classifier_masked(50);
  test_classifier_masked(1203);
  return check_done("test_kernels");
}
