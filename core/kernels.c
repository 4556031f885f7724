/* Transformer kernels (see kernels.h for the legend and conventions). Matrix products go through
 * OpenBLAS; the rest are plain loops the compiler vectorises. */
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RMSNorm ---------------------------------------------------------------------------- */

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps) {
  /* inp, out: [N, C]; w: [C]; rstd: [N] */
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float *o = out + (size_t)n * C;
    double ss = 0;
    for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (rstd) rstd[n] = r;
    for (int i = 0; i < C; i++) o[i] = (x[i] * r) * w[i];
  }
}

void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C) {
  /* dinp, dout, inp: [N, C]; w, dw: [C]; rstd: [N] */
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float r = rstd[n];
    double dot = 0;
    for (int i = 0; i < C; i++) dot += (double)dy[i] * w[i] * x[i];
    float k = (float)(dot / C) * r * r * r;
    for (int i = 0; i < C; i++) dx[i] += r * dy[i] * w[i] - k * x[i];
    if (dw)
      for (int i = 0; i < C; i++) dw[i] += dy[i] * x[i] * r;
  }
}

/* ---- Linear layers ---------------------------------------------------------------------- */

void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int IN,
                    int OUT, float beta) {
  /* out[N,OUT] = inp[N,IN] . w[OUT,IN]^T (+ bias) */
  if (N == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, OUT, IN, 1.0f, w, IN, inp, 1, beta, out, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OUT, IN, 1.0f, inp, IN, w, IN, beta,
                out, OUT);
  if (bias)
    for (int n = 0; n < N; n++) {
      float *o = out + (size_t)n * OUT;
      for (int j = 0; j < OUT; j++) o[j] += bias[j];
    }
}

void matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias, int N,
                        int IN, int OUT) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < OUT; j++) {
      double s = bias ? bias[j] : 0.0;
      for (int i = 0; i < IN; i++) s += (double)inp[(size_t)n * IN + i] * w[(size_t)j * IN + i];
      out[(size_t)n * OUT + j] = (float)s;
    }
}

void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int IN, int OUT, float dinp_beta) {
  /* dinp[N,IN] = dout[N,OUT] . w[OUT,IN];  dw[OUT,IN] += dout^T . inp;  dbias += colsum(dout) */
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IN, OUT, 1.0f, dout, OUT, w, IN,
                dinp_beta, dinp, IN);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, N, 1.0f, dout, OUT, inp, IN, 1.0f,
                dw, IN);
  if (dbias)
    for (int n = 0; n < N; n++) {
      const float *d = dout + (size_t)n * OUT;
      for (int j = 0; j < OUT; j++) dbias[j] += d[j];
    }
}

/* ---- RoPE ------------------------------------------------------------------------------- */

int rope_table_init(struct rope_table *t, int max_pos, int head_dim, float theta) {
  t->max_pos = max_pos;
  t->half = head_dim / 2;
  size_t n = (size_t)max_pos * t->half;
  t->cos = malloc(n * sizeof(float));
  t->sin = malloc(n * sizeof(float));
  if (!t->cos || !t->sin) {
    rope_table_deinit(t);
    return -1;
  }
  for (int i = 0; i < t->half; i++) {
    /* as transformers: inv_freq = 1 / theta^(2i/HS) in float32, angle = float32(pos * inv_freq) */
    float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / head_dim));
    for (int p = 0; p < max_pos; p++) {
      float a = (float)p * inv_freq;
      t->cos[(size_t)p * t->half + i] = (float)cos((double)a);
      t->sin[(size_t)p * t->half + i] = (float)sin((double)a);
    }
  }
  return 0;
}

void rope_table_deinit(struct rope_table *t) {
  free(t->cos);
  free(t->sin);
  t->cos = t->sin = NULL;
}

static void rope_apply(float *x, const int *pos, int N, int ld, int nh, int HS,
                       const struct rope_table *t, float sign) {
  int h2 = HS / 2;
  for (int n = 0; n < N; n++) {
    const float *c = t->cos + (size_t)pos[n] * t->half, *s = t->sin + (size_t)pos[n] * t->half;
    for (int h = 0; h < nh; h++) {
      float *v = x + (size_t)n * ld + (size_t)h * HS;
      for (int i = 0; i < h2; i++) {
        float a = v[i], b = v[i + h2], si = sign * s[i];
        v[i] = a * c[i] - b * si;
        v[i + h2] = b * c[i] + a * si;
      }
    }
  }
}

void rope_forward(float *x, const int *pos, int N, int ld, int nh, int HS,
                  const struct rope_table *t) {
  rope_apply(x, pos, N, ld, nh, HS, t, 1.0f);
}

void rope_backward(float *dx, const int *pos, int N, int ld, int nh, int HS,
                   const struct rope_table *t) {
  rope_apply(dx, pos, N, ld, nh, HS, t, -1.0f);
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

void swiglu_forward(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sg = g[i] / (1.0f + expf(-g[i]));
    h[i] = sg * u[i];
  }
}

void swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u,
                     size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + expf(-g[i]));
    float d = dh[i];
    du[i] = d * g[i] * sig;
    dg[i] = d * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

/* ---- Attention -------------------------------------------------------------------------- */

/* Dot product with eight independent accumulators (vectorisable without reassociation flags;
 * the summation order is fixed, so results are deterministic). */
static float dot(const float *a, const float *b, int n) {
  float acc[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Softmax of row s[0..lim) in place, zeroing s[lim..n_ctx); returns the log-sum-exp. */
static float softmax_causal(float *s, int lim, int n_ctx) {
  float mx = -INFINITY;
  for (int j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
  float sum = 0;
  for (int j = 0; j < lim; j++) {
    s[j] = expf(s[j] - mx);
    sum += s[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j < lim; j++) s[j] *= inv;
  for (int j = lim; j < n_ctx; j++) s[j] = 0.0f;
  return mx + logf(sum);
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       int t_new, int n_past, int h0, int n_rep, int kvh, int HS, int ldq, int ldkv,
                       int ldo, int NH, float *scratch) {
  /* S[t_new, n_ctx] = scale * Q_h K^T; causal mask j <= n_past + i; P = softmax; O_h = P V */
  int n_ctx = n_past + t_new;
  float scale = 1.0f / sqrtf((float)HS);
  const float *kb = k + (size_t)kvh * HS, *vb = v + (size_t)kvh * HS;
  if (t_new <= 2) {
    /* decoding: a few rows against the cache; BLAS call overhead would dominate */
    for (int r = 0; r < n_rep; r++) {
      int h = h0 + r;
      for (int i = 0; i < t_new; i++) {
        const float *qi = q + (size_t)i * ldq + (size_t)h * HS;
        float *oi = out + (size_t)i * ldo + (size_t)h * HS;
        int lim = n_past + i + 1;
        for (int j = 0; j < lim; j++) scratch[j] = scale * dot(qi, kb + (size_t)j * ldkv, HS);
        float l = softmax_causal(scratch, lim, lim);
        if (lse) lse[(size_t)i * NH + h] = l;
        for (int d = 0; d < HS; d++) oi[d] = 0.0f;
        for (int j = 0; j < lim; j++) {
          const float *vj = vb + (size_t)j * ldkv;
          float p = scratch[j];
          for (int d = 0; d < HS; d++) oi[d] += p * vj[d];
        }
      }
    }
    return;
  }
  for (int r = 0; r < n_rep; r++) {
    int h = h0 + r;
    const float *qh = q + (size_t)h * HS;
    float *oh = out + (size_t)h * HS;
    float *S = scratch;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t_new, n_ctx, HS, scale, qh, ldq, kb, ldkv,
                0.0f, S, n_ctx);
    for (int i = 0; i < t_new; i++) {
      float l = softmax_causal(S + (size_t)i * n_ctx, n_past + i + 1, n_ctx);
      if (lse) lse[(size_t)i * NH + h] = l;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t_new, HS, n_ctx, 1.0f, S, n_ctx, vb,
                ldkv, 0.0f, oh, ldo);
  }
}

void attention_forward_ref(float *out, const float *q, const float *k, const float *v, int t_new,
                           int n_past, int h0, int n_rep, int kvh, int HS, int ldq, int ldkv,
                           int ldo) {
  int n_ctx = n_past + t_new;
  double scale = 1.0 / sqrt((double)HS);
  double *p = malloc(sizeof(double) * (size_t)n_ctx);
  if (!p) return;
  for (int r = 0; r < n_rep; r++) {
    int h = h0 + r;
    for (int i = 0; i < t_new; i++) {
      int lim = n_past + i + 1;
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j < lim; j++) {
        double s = 0;
        for (int d = 0; d < HS; d++)
          s += (double)q[(size_t)i * ldq + h * HS + d] * k[(size_t)j * ldkv + kvh * HS + d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      for (int j = 0; j < lim; j++) sum += (p[j] = exp(p[j] - mx));
      for (int d = 0; d < HS; d++) {
        double o = 0;
        for (int j = 0; j < lim; j++) o += p[j] / sum * v[(size_t)j * ldkv + kvh * HS + d];
        out[(size_t)i * ldo + h * HS + d] = (float)o;
      }
    }
  }
  free(p);
}

void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *lse, int T, int h0, int n_rep,
                        int kvh, int HS, int ldq, int ldkv, int ldo, int NH, float *scratch) {
  float scale = 1.0f / sqrtf((float)HS);
  const float *kb = k + (size_t)kvh * HS, *vb = v + (size_t)kvh * HS;
  float *dkb = dk + (size_t)kvh * HS, *dvb = dv + (size_t)kvh * HS;
  float *P = scratch, *dP = scratch + (size_t)T * T;
  for (int r = 0; r < n_rep; r++) {
    int h = h0 + r;
    const float *qh = q + (size_t)h * HS, *doh = dout + (size_t)h * HS;
    float *dqh = dq + (size_t)h * HS;
    /* P = exp(scale * Q K^T - lse), causal */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, qh, ldq, kb, ldkv, 0.0f,
                P, T);
    for (int i = 0; i < T; i++) {
      float *p = P + (size_t)i * T;
      float l = lse[(size_t)i * NH + h];
      for (int j = 0; j <= i; j++) p[j] = expf(p[j] - l);
      for (int j = i + 1; j < T; j++) p[j] = 0.0f;
    }
    /* dV += P^T dO;  dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, P, T, doh, ldo, 1.0f, dvb,
                ldkv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, doh, ldo, vb, ldkv, 0.0f,
                dP, T);
    /* dS = P * (dP - rowsum(P * dP)), scaled */
    for (int i = 0; i < T; i++) {
      float *p = P + (size_t)i * T, *dp = dP + (size_t)i * T;
      float D = 0;
      for (int j = 0; j <= i; j++) D += p[j] * dp[j];
      for (int j = 0; j <= i; j++) p[j] = p[j] * (dp[j] - D) * scale;
    }
    /* dQ += dS K;  dK += dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, P, T, kb, ldkv, 1.0f,
                dqh, ldq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, P, T, qh, ldq, 1.0f, dkb,
                ldkv);
  }
}

/* ---- Classifier: log-softmax, log-prob of the target, entropy ------------------------------ */

void classifier_forward(float *logits, float *logp, float *entropy, const int *targets, int R,
                        int V, float inv_temp) {
  /* logits: [R, V] -> probabilities in place */
  for (int r = 0; r < R; r++) {
    float *z = logits + (size_t)r * V;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) {
      z[j] *= inv_temp;
      mx = z[j] > mx ? z[j] : mx;
    }
    double sum = 0;
    for (int j = 0; j < V; j++) sum += expf(z[j] - mx);
    float lse = mx + (float)log(sum);
    if (logp) logp[r] = z[targets[r]] - lse;
    double pz = 0;
    for (int j = 0; j < V; j++) {
      float p = expf(z[j] - lse);
      pz += (double)p * z[j];
      z[j] = p;
    }
    if (entropy) entropy[r] = (float)((double)lse - pz);
  }
}

void classifier_backward(float *probs, const float *w, const int *targets, int R, int V,
                         float inv_temp) {
  for (int r = 0; r < R; r++) {
    float *p = probs + (size_t)r * V;
    float s = -w[r] * inv_temp;
    if (s == 0.0f) {
      memset(p, 0, sizeof(float) * (size_t)V);
      continue;
    }
    for (int j = 0; j < V; j++) p[j] *= s;
    p[targets[r]] -= s;
  }
}
