/* Transformer kernels (see kernels.h for the legend and conventions). Matrix products go through
 * OpenBLAS; the rest are plain loops the compiler vectorises. */
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "pool.h"
#include "simd.h"

/* ---- parallel loops over the calling thread's pool (pool.h) ---------------------------------- */

/* Below this much work (multiply-adds or elements) a kernel runs on the calling thread alone:
 * waking the pool costs more than it saves. */
static long par_min_work = 32768L;

void kernels_set_par_min_work(long w) {
  par_min_work = w;
}
long kernels_par_min_work(void) {
  return par_min_work;
}

struct par {
  void (*body)(void *arg, int lo, int hi);
  void *arg;
  int total;
};

static void par_thunk(void *ctx, int i, int n) {
  struct par *p = ctx;
  int lo, hi;
  pool_split(p->total, i, n, &lo, &hi);
  if (lo < hi) p->body(p->arg, lo, hi);
}

/* body(arg, lo, hi) over [0, total) split statically over the pool's threads. */
static void parallel_for(int total, long work, void (*body)(void *, int, int), void *arg) {
  struct pool *p = pool_current();
  if (!p || pool_threads(p) == 1 || total < 2 || work < par_min_work) {
    if (total > 0) body(arg, 0, total);
    return;
  }
  struct par pp = {body, arg, total};
  pool_run(p, par_thunk, &pp);
}

/* ---- instruction set of the hand-vectorised kernels ------------------------------------------ */

static int isa_forced; /* kernels_force_isa; 0: the best available */

static int isa_best(void) {
  static int best; /* computed once; a benign race: every thread computes the same value */
  int b = __atomic_load_n(&best, __ATOMIC_RELAXED);
  if (b) return b;
  b = KERNELS_ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f"))
    b = KERNELS_ISA_AVX512;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    b = KERNELS_ISA_AVX2;
#endif
  __atomic_store_n(&best, b, __ATOMIC_RELAXED);
  return b;
}

int kernels_cpu_fma(void) {
  static int fma; /* 1 + the answer, computed once (the same benign race as isa_best) */
  if (kernels_isa() == KERNELS_ISA_BASELINE) return 0;
  int f = __atomic_load_n(&fma, __ATOMIC_RELAXED);
  if (f) return f - 1;
  f = SIMD_HW_FMA;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f = f || __builtin_cpu_supports("fma");
#endif
  __atomic_store_n(&fma, f + 1, __ATOMIC_RELAXED);
  return f;
}

int kernels_isa(void) {
  int f = __atomic_load_n(&isa_forced, __ATOMIC_RELAXED);
  return f ? f : isa_best();
}

int kernels_force_isa(int isa) {
  if (isa > isa_best() && isa != KERNELS_ISA_BASELINE) return -1;
  __atomic_store_n(&isa_forced, isa, __ATOMIC_RELAXED);
  return isa ? isa : isa_best();
}

static const char *const isa_names[] = {[KERNELS_ISA_PORTABLE] = "portable",
                                        [KERNELS_ISA_AVX2] = "avx2",
                                        [KERNELS_ISA_AVX512] = "avx512",
                                        [KERNELS_ISA_BASELINE] = "baseline"};

const char *kernels_isa_name(int isa) {
  return isa >= KERNELS_ISA_PORTABLE && isa <= KERNELS_ISA_BASELINE ? isa_names[isa] : "unknown";
}

int kernels_isa_by_name(const char *name) {
  for (int i = KERNELS_ISA_PORTABLE; name && i <= KERNELS_ISA_BASELINE; i++)
    if (!strcmp(name, isa_names[i])) return i;
  return 0;
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

struct rms_args {
  float *out, *rstd, *dinp;
  const float *inp, *w, *dout, *rstd_in;
  int C;
  float eps;
};

/* A row's sum of squares (the forward) or of dy w x (the backward) is one chain of double adds in
 * increasing i, which fixes its bits; alone it waits out each add's latency (0.5B decoding at
 * batch 64: rmsnorm_fwd_rows 1.7-1.8% of a step's samples, about 4 cycles an element). RMS_ROWS
 * rows side by side keep as many independent chains in flight, each still the same chain. R is a
 * constant at every call (always inlined): 8, 4, then 1 row at a time. The element-wise loops after
 * them in 4 lanes (simd_v4: the same operations; GCC -O2 left them scalar, out may alias inp). */
enum { RMS_ROWS = 8 };
SIMD_INLINE void rms_sums(double *ss, const float *x, const float *dy, const float *w, int C, int R,
                          int bwd) {
  /* named, not an array (GCC kept an array's pairs in memory: a store and a load in each chain) */
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#define RMS_T(r)                                                                                   \
  (bwd ? (double)dy[(size_t)(r)*C + i] * w[i] * x[(size_t)(r)*C + i]                               \
       : (double)x[(size_t)(r)*C + i] * x[(size_t)(r)*C + i])
  for (int i = 0; i < C; i++) {
    s0 += RMS_T(0);
    if (R >= 4) s1 += RMS_T(1), s2 += RMS_T(2), s3 += RMS_T(3);
    if (R >= 8) s4 += RMS_T(4), s5 += RMS_T(5), s6 += RMS_T(6), s7 += RMS_T(7);
  }
#undef RMS_T
  ss[0] = s0;
  if (R >= 4) ss[1] = s1, ss[2] = s2, ss[3] = s3;
  if (R >= 8) ss[4] = s4, ss[5] = s5, ss[6] = s6, ss[7] = s7;
}

/* rms_sums of rows [0, n) of x (bwd: with dy and w, the backward's), into ss[n] */
SIMD_INLINE void rms_rows_sums(double *ss, const float *x, const float *dy, const float *w, int n,
                               int C, int bwd) {
  int r = 0;
  for (; r + 8 <= n; r += 8) rms_sums(ss + r, x + (size_t)r * C, dy + (size_t)r * C, w, C, 8, bwd);
  for (; r + 4 <= n; r += 4) rms_sums(ss + r, x + (size_t)r * C, dy + (size_t)r * C, w, C, 4, bwd);
  for (; r < n; r++) rms_sums(ss + r, x + (size_t)r * C, dy + (size_t)r * C, w, C, 1, bwd);
}

static void rmsnorm_fwd_rows(void *a_, int lo, int hi) {
  struct rms_args *a = a_;
  float *out = a->out, *rstd = a->rstd;
  const float *inp = a->inp, *w = a->w;
  int C = a->C;
  double eps = a->eps;
  for (int n0 = lo; n0 < hi; n0 += RMS_ROWS) {
    int nr = hi - n0 < RMS_ROWS ? hi - n0 : RMS_ROWS;
    double ss[RMS_ROWS];
    rms_rows_sums(ss, inp + (size_t)n0 * C, inp, w, nr, C, 0); /* dy unread */
    for (int j = 0; j < nr; j++) {
      int n = n0 + j;
      const float *x = inp + (size_t)n * C;
      float *o = out + (size_t)n * C;
      float r = (float)(1.0 / sqrt(ss[j] / C + eps));
      if (rstd) rstd[n] = r;
      int i = 0;
      for (; i + 4 <= C; i += 4) {
        simd_v4 xv, wv;
        memcpy(&xv, x + i, sizeof xv), memcpy(&wv, w + i, sizeof wv);
        xv = (xv * r) * wv;
        memcpy(o + i, &xv, sizeof xv);
      }
      for (; i < C; i++) o[i] = (x[i] * r) * w[i];
    }
  }
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps) {
  /* inp, out: [N, C]; w: [C]; rstd: [N] */
  struct rms_args a = {.out = out, .rstd = rstd, .inp = inp, .w = w, .C = C, .eps = eps};
  parallel_for(N, (long)N * C, rmsnorm_fwd_rows, &a);
}

static void rmsnorm_bwd_rows(void *a_, int lo, int hi) {
  struct rms_args *a = a_;
  const float *dout = a->dout, *inp = a->inp, *w = a->w, *rstd = a->rstd_in;
  float *dinp = a->dinp;
  int C = a->C;
  for (int n0 = lo; n0 < hi; n0 += RMS_ROWS) {
    int nr = hi - n0 < RMS_ROWS ? hi - n0 : RMS_ROWS;
    double dot[RMS_ROWS];
    rms_rows_sums(dot, inp + (size_t)n0 * C, dout + (size_t)n0 * C, w, nr, C, 1);
    for (int j = 0; j < nr; j++) {
      int n = n0 + j;
      const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
      float *dx = dinp + (size_t)n * C;
      float r = rstd[n];
      float k = (float)(dot[j] / C) * r * r * r;
      int i = 0;
      for (; i + 4 <= C; i += 4) {
        simd_v4 dxv, dyv, wv, xv;
        memcpy(&dxv, dx + i, sizeof dxv), memcpy(&dyv, dy + i, sizeof dyv);
        memcpy(&wv, w + i, sizeof wv), memcpy(&xv, x + i, sizeof xv);
        dxv += r * dyv * wv - k * xv;
        memcpy(dx + i, &dxv, sizeof dxv);
      }
      for (; i < C; i++) dx[i] += r * dy[i] * w[i] - k * x[i];
    }
  }
}

void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C) {
  /* dinp, dout, inp: [N, C]; w, dw: [C]; rstd: [N] */
  struct rms_args a = {.dinp = dinp, .dout = dout, .inp = inp, .w = w, .rstd_in = rstd, .C = C};
  parallel_for(N, (long)N * C, rmsnorm_bwd_rows, &a);
  if (dw)
    for (int n = 0; n < N; n++) {
      const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
      float r = rstd[n];
      for (int i = 0; i < C; i++) dw[i] += dy[i] * x[i] * r;
    }
}

/* ---- Linear layers ---------------------------------------------------------------------- */

struct mm_args {
  float *out, *dinp, *dw, *dbias;
  const float *inp, *w, *bias, *dout;
  int N, IN, OUT;
  float beta;
};

/* Rows [lo, hi) of out = inp . w^T (+ bias). */
static void mm_fwd_rows(void *a_, int lo, int hi) {
  struct mm_args *a = a_;
  int n = hi - lo, IN = a->IN, OUT = a->OUT;
  float *out = a->out + (size_t)lo * OUT;
  const float *inp = a->inp + (size_t)lo * IN;
  if (n == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, OUT, IN, 1.0f, a->w, IN, inp, 1, a->beta, out, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OUT, IN, 1.0f, inp, IN, a->w, IN,
                a->beta, out, OUT);
  if (a->bias)
    for (int r = 0; r < n; r++)
      for (int j = 0; j < OUT; j++) out[(size_t)r * OUT + j] += a->bias[j];
}

/* Output columns [lo, hi) of out = inp . w^T (+ bias): for few rows (decoding). */
static void mm_fwd_cols(void *a_, int lo, int hi) {
  struct mm_args *a = a_;
  int N = a->N, IN = a->IN, OUT = a->OUT, m = hi - lo;
  const float *w = a->w + (size_t)lo * IN;
  float *out = a->out + lo;
  if (N == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, m, IN, 1.0f, w, IN, a->inp, 1, a->beta, out, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, m, IN, 1.0f, a->inp, IN, w, IN, a->beta,
                out, OUT);
  if (a->bias)
    for (int r = 0; r < N; r++)
      for (int j = 0; j < m; j++) out[(size_t)r * OUT + j] += a->bias[lo + j];
}

void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int IN,
                    int OUT, float beta) {
  /* out[N,OUT] = inp[N,IN] . w[OUT,IN]^T (+ bias) */
  struct mm_args a = {
      .out = out, .inp = inp, .w = w, .bias = bias, .N = N, .IN = IN, .OUT = OUT, .beta = beta};
  long work = (long)N * IN * OUT;
  struct pool *p = pool_current();
  int nt = pool_threads(p);
  if (N >= 8 * nt)
    parallel_for(N, work, mm_fwd_rows, &a);
  else
    parallel_for(OUT, work, mm_fwd_cols, &a);
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

/* Rows [lo, hi) of dinp = dout . w (beta: 0 overwrite, 1 accumulate). */
static void mm_bwd_dinp_rows(void *a_, int lo, int hi) {
  struct mm_args *a = a_;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, a->IN, a->OUT, 1.0f,
              a->dout + (size_t)lo * a->OUT, a->OUT, a->w, a->IN, a->beta,
              a->dinp + (size_t)lo * a->IN, a->IN);
}

/* Rows [lo, hi) of dw += dout^T . inp, and of dbias += colsum(dout). */
static void mm_bwd_dw_rows(void *a_, int lo, int hi) {
  struct mm_args *a = a_;
  int N = a->N, IN = a->IN, OUT = a->OUT;
  if (a->dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, IN, N, 1.0f, a->dout + lo, OUT,
                a->inp, IN, 1.0f, a->dw + (size_t)lo * IN, IN);
  if (a->dbias)
    for (int n = 0; n < N; n++) {
      const float *d = a->dout + (size_t)n * OUT;
      for (int j = lo; j < hi; j++) a->dbias[j] += d[j];
    }
}

void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int IN, int OUT, float dinp_beta) {
  /* dinp[N,IN] = dout[N,OUT] . w[OUT,IN];  dw[OUT,IN] += dout^T . inp;  dbias += colsum(dout) */
  struct mm_args a = {.dinp = dinp,
                      .dw = dw,
                      .dbias = dbias,
                      .dout = dout,
                      .inp = inp,
                      .w = w,
                      .N = N,
                      .IN = IN,
                      .OUT = OUT,
                      .beta = dinp_beta};
  long work = (long)N * IN * OUT;
  if (dinp) parallel_for(N, work, mm_bwd_dinp_rows, &a);
  if (dw || dbias) parallel_for(OUT, work, mm_bwd_dw_rows, &a);
}

/* ---- BF16 weights (kernels.h) ---------------------------------------------------------------- */

void bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  /* a float's bits are (h << 16): in memory, the 16-bit halves (0, h); interleaving 8 halves of
   * zeros with 8 of src gives 4 floats twice (SSE2's punpcklwd/punpckhwd, NEON's zip) */
  typedef uint16_t u16x8 __attribute__((vector_size(16)));
  u16x8 z = {0};
  for (; i + 8 <= n; i += 8) {
    u16x8 h, lo, hi;
    memcpy(&h, src + i, sizeof h);
    lo = __builtin_shufflevector(z, h, 0, 8, 1, 9, 2, 10, 3, 11);
    hi = __builtin_shufflevector(z, h, 4, 12, 5, 13, 6, 14, 7, 15);
    memcpy(dst + i, &lo, sizeof lo);
    memcpy(dst + i + 4, &hi, sizeof hi);
  }
#endif
  for (; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(dst + i, &u, sizeof u);
  }
}

void f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign and a quiet payload */
      dst[i] = (uint16_t)((u >> 16) | 0x40);
    else /* to nearest even; overflow rounds to infinity as it should */
      dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
  }
}

/* A converted tile of weights holds about this many floats (16 MiB). OpenBLAS packs the
 * activations again for every tile, which costs most where IN is large: at Qwen2.5-0.5B's
 * down_proj (4864 -> 896, 1,024 rows, 2 threads) tiles of 1 Mi floats (215 weight rows) ran
 * 1.24-1.44x slower than the float32 kernel, 4 Mi floats (each thread's share one tile) 1.04x.
 * Each thread holds one tile at a time, freed when its share is done. */
enum { BF16_TILE_FLOATS = 1 << 22 };

struct bf16_args {
  float *out;
  const float *inp, *bias;
  const uint16_t *w;
  int N, IN, OUT;
  float beta;
  int failed; /* a tile buffer could not be allocated (set by any thread) */
};

/* Output columns [lo, hi) of out = inp . w^T (+ bias), w in BF16: tiles of whole weight rows
 * converted to float32, one SGEMM each (few rows: linear_few_bf16). */
static void mmb_fwd_cols(void *a_, int lo, int hi) {
  struct bf16_args *a = a_;
  int N = a->N, IN = a->IN, OUT = a->OUT;
  if (N < 8) {
    linear_few_bf16(a->out, a->inp, a->w, a->bias, N, IN, OUT, lo, hi, a->beta);
    return;
  }
  int rows = BF16_TILE_FLOATS / IN;
  rows = rows < 16 ? 16 : rows;
  rows = rows > hi - lo ? hi - lo : rows;
  float *buf = malloc(sizeof(float) * (size_t)rows * IN);
  if (!buf) {
    __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int j = lo; j < hi; j += rows) {
    int n = hi - j < rows ? hi - j : rows;
    bf16_to_f32(buf, a->w + (size_t)j * IN, (size_t)n * IN);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n, IN, 1.0f, a->inp, IN, buf, IN,
                a->beta, a->out + j, OUT);
    if (a->bias)
      for (int r = 0; r < N; r++)
        for (int c = 0; c < n; c++) a->out[(size_t)r * OUT + j + c] += a->bias[j + c];
  }
  free(buf);
}

int matmul_forward_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int N,
                        int IN, int OUT, float beta) {
  /* out[N,OUT] = inp[N,IN] . w[OUT,IN]^T (+ bias), w in BF16 */
  struct bf16_args a = {
      .out = out, .inp = inp, .w = w, .bias = bias, .N = N, .IN = IN, .OUT = OUT, .beta = beta};
  if (N < 1 || OUT < 1) return 0;
  if (IN < 1) { /* an empty sum */
    for (size_t i = 0; i < (size_t)N * OUT; i++)
      out[i] = (beta != 0.0f ? out[i] : 0.0f) + (bias ? bias[i % OUT] : 0.0f);
    return 0;
  }
  parallel_for(OUT, (long)N * IN * OUT, mmb_fwd_cols, &a);
  return a.failed ? -1 : 0;
}

/* Columns [lo, hi) of dinp = dout . w (w in BF16): w[:, lo:hi] converted a tile of OUT rows at a
 * time, each tile's product accumulated into dinp. */
static void mmb_bwd_dinp_cols(void *a_, int lo, int hi) {
  struct bf16_args *a = a_;
  int N = a->N, IN = a->IN, OUT = a->OUT, width = hi - lo;
  int rows = BF16_TILE_FLOATS / width;
  rows = rows < 16 ? 16 : rows;
  rows = rows > OUT ? OUT : rows;
  float *buf = malloc(sizeof(float) * (size_t)rows * width);
  if (!buf) {
    __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int o = 0; o < OUT; o += rows) {
    int n = OUT - o < rows ? OUT - o : rows;
    for (int r = 0; r < n; r++)
      bf16_to_f32(buf + (size_t)r * width, a->w + (size_t)(o + r) * IN + lo, (size_t)width);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, width, n, 1.0f, a->inp + o, OUT, buf,
                width, o == 0 ? a->beta : 1.0f, a->out + lo, IN);
  }
  free(buf);
}

size_t matmul_bf16_tile_bytes(int IN, int OUT) {
  /* mmb_fwd_cols: rows of IN floats, BF16_TILE_FLOATS / IN of them but at least 16, at most the
   * thread's OUT; mmb_bwd_dinp_cols: the same with the thread's width <= IN */
  size_t tile = BF16_TILE_FLOATS, least = 16 * (size_t)IN, all = (size_t)IN * (size_t)OUT;
  if (tile < least) tile = least;
  return sizeof(float) * (tile < all ? tile : all);
}

int matmul_backward_dinp_bf16(float *dinp, const float *dout, const uint16_t *w, int N, int IN,
                              int OUT, float dinp_beta) {
  /* dinp[N,IN] (+)= dout[N,OUT] . w[OUT,IN], w in BF16 */
  struct bf16_args a = {
      .out = dinp, .inp = dout, .w = w, .N = N, .IN = IN, .OUT = OUT, .beta = dinp_beta};
  if (N < 1 || IN < 1) return 0;
  if (OUT < 1) { /* an empty sum */
    if (dinp_beta == 0.0f) memset(dinp, 0, sizeof(float) * (size_t)N * IN);
    return 0;
  }
  parallel_for(IN, (long)N * IN * OUT, mmb_bwd_dinp_cols, &a);
  return a.failed ? -1 : 0;
}

/* ---- RoPE ------------------------------------------------------------------------------- */

int rope_table_init_freqs(struct rope_table *t, int max_pos, int half, const float *inv_freq,
                          float scale) {
  t->max_pos = max_pos;
  t->half = half;
  size_t n = (size_t)max_pos * t->half;
  t->cos = malloc(n * sizeof(float));
  t->sin = malloc(n * sizeof(float));
  if (!t->cos || !t->sin) {
    rope_table_deinit(t);
    return -1;
  }
  for (int i = 0; i < t->half; i++) {
    /* as transformers: angle = float32(pos * inv_freq), cos and sin times the attention scale */
    for (int p = 0; p < max_pos; p++) {
      float a = (float)p * inv_freq[i];
      t->cos[(size_t)p * t->half + i] = (float)cos((double)a) * scale;
      t->sin[(size_t)p * t->half + i] = (float)sin((double)a) * scale;
    }
  }
  return 0;
}

int rope_table_init(struct rope_table *t, int max_pos, int head_dim, float theta) {
  int half = head_dim / 2;
  float *inv_freq = malloc(sizeof(float) * (size_t)(half > 0 ? half : 1));
  if (!inv_freq) return -1;
  /* inv_freq = 1 / theta^(2i/HS), computed in double and rounded */
  for (int i = 0; i < half; i++)
    inv_freq[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / head_dim));
  int rc = rope_table_init_freqs(t, max_pos, half, inv_freq, 1.0f);
  free(inv_freq);
  return rc;
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

struct rope_args {
  float *x;
  const int *pos;
  int ld, nh, HS;
  const struct rope_table *t;
  float sign;
};

static void rope_rows(void *a_, int lo, int hi) {
  struct rope_args *a = a_;
  rope_apply(a->x + (size_t)lo * a->ld, a->pos + lo, hi - lo, a->ld, a->nh, a->HS, a->t, a->sign);
}

void rope_forward(float *x, const int *pos, int N, int ld, int nh, int HS,
                  const struct rope_table *t) {
  struct rope_args a = {x, pos, ld, nh, HS, t, 1.0f};
  parallel_for(N, (long)N * nh * HS, rope_rows, &a);
}

void rope_backward(float *dx, const int *pos, int N, int ld, int nh, int HS,
                   const struct rope_table *t) {
  struct rope_args a = {dx, pos, ld, nh, HS, t, -1.0f};
  parallel_for(N, (long)N * nh * HS, rope_rows, &a);
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

/* The sigmoid of SwiGLU from the softmax's exponential (simd_exp4, simd_exp512: the same bits on
 * every instruction set) in its range: t = exp(-|g|) <= 1, sigma(g) = 1 / (1 + t) for g >= 0 and
 * t / (1 + t) below (no overflow for any g; the clamp at -87.3 leaves 1e-38 where t is smaller).
 * Forward h = (g sigma) u; backward du = (dh g) sigma, dg = ((dh u) sigma) (1 + g (1 - sigma)).
 * Four lanes at a time in the portable form; 16 in AVX-512 with the same operations. Was libm's
 * expf one element at a time: 3.4 ns an element, 25 ms of a 0.5B decoding step's thread time at
 * batch 64 (4% of it). */
SIMD_INLINE simd_v4 sw_sig4(simd_v4 g, const int hw) {
  simd_i4 sign = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
  simd_v4 t = simd_exp4((simd_v4)((simd_i4)g | sign), hw), one = {1.0f, 1.0f, 1.0f, 1.0f};
  simd_i4 pos = g >= 0.0f;
  simd_v4 num = (simd_v4)(((simd_i4)one & pos) | ((simd_i4)t & ~pos));
  return num / (one + t);
}

/* Elements [lo, hi): backward when dg (du, dh) is given, else forward; a partial last vector
 * through a padded copy, so that an element's bits do not depend on where a range starts. */
SIMD_INLINE void sw_gen(float *h, float *dg, float *du, const float *dh, const float *g,
                        const float *u, int lo, int hi, const int hw) {
  for (int i = lo; i < hi; i += 4) {
    int n = hi - i < 4 ? hi - i : 4;
    simd_v4 gv = {0}, uv = {0}, dv = {0};
    memcpy(&gv, g + i, sizeof(float) * (size_t)n);
    memcpy(&uv, u + i, sizeof(float) * (size_t)n);
    if (dg) memcpy(&dv, dh + i, sizeof(float) * (size_t)n);
    simd_v4 sg = sw_sig4(gv, hw), one = {1.0f, 1.0f, 1.0f, 1.0f};
    if (!dg) {
      simd_v4 r = (gv * sg) * uv;
      memcpy(h + i, &r, sizeof(float) * (size_t)n);
    } else {
      simd_v4 ru = (dv * gv) * sg, rg = ((dv * uv) * sg) * (one + gv * (one - sg));
      memcpy(du + i, &ru, sizeof(float) * (size_t)n);
      memcpy(dg + i, &rg, sizeof(float) * (size_t)n);
    }
  }
}

static void sw_portable(float *h, float *dg, float *du, const float *dh, const float *g,
                        const float *u, int lo, int hi) {
  sw_gen(h, dg, du, dh, g, u, lo, hi, SIMD_HW_FMA);
}

#if defined(__x86_64__) || defined(__i386__)
/* the portable form with FMA3 in hardware: the portable set on a CPU with FMA (FMA3 alone, no
 * AVX2 assumed) */
__attribute__((target("fma"))) static void sw_fma(float *h, float *dg, float *du, const float *dh,
                                                  const float *g, const float *u, int lo, int hi) {
  sw_gen(h, dg, du, dh, g, u, lo, hi, 1);
}
/* sw_gen in 8 lanes of AVX2: the same operations in the same order (was the 4-lane form: 8% of
 * an AVX2 0.5B decoding step at batch 64) */
__attribute__((target("avx2,fma"))) static void sw_256(float *h, float *dg, float *du,
                                                       const float *dh, const float *g,
                                                       const float *u, int lo, int hi) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = lo; i < hi; i += 8) {
    /* masked moves only for a partial last vector: they are slow on AMD's processors */
    int n = hi - i < 8 ? hi - i : 8;
    __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
#define SW_LD(p) (n == 8 ? _mm256_loadu_ps((p) + i) : _mm256_maskload_ps((p) + i, mk))
#define SW_ST(p, v) (n == 8 ? _mm256_storeu_ps((p) + i, v) : _mm256_maskstore_ps((p) + i, mk, v))
    __m256 gv = SW_LD(g), uv = SW_LD(u);
    __m256 t = simd_exp256(_mm256_or_ps(gv, sign));
    __m256 pos = _mm256_cmp_ps(gv, zero, _CMP_GE_OQ);
    __m256 sg = _mm256_div_ps(_mm256_blendv_ps(t, one, pos), _mm256_add_ps(one, t));
    if (!dg) {
      SW_ST(h, _mm256_mul_ps(_mm256_mul_ps(gv, sg), uv));
    } else {
      __m256 dv = SW_LD(dh);
      __m256 ru = _mm256_mul_ps(_mm256_mul_ps(dv, gv), sg);
      __m256 f = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sg)));
      __m256 rg = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(dv, uv), sg), f);
      SW_ST(du, ru);
      SW_ST(dg, rg);
    }
#undef SW_ST
#undef SW_LD
  }
}

/* sw_gen in 16 lanes: the same operations in the same order */
__attribute__((target("avx512f"))) static void sw_512(float *h, float *dg, float *du,
                                                      const float *dh, const float *g,
                                                      const float *u, int lo, int hi) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  for (int i = lo; i < hi; i += 16) {
    __mmask16 mk = hi - i < 16 ? (__mmask16)((1u << (hi - i)) - 1) : (__mmask16)0xffff;
    __m512 gv = _mm512_maskz_loadu_ps(mk, g + i), uv = _mm512_maskz_loadu_ps(mk, u + i);
    __m512 t = simd_exp512(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(gv), sign)));
    __mmask16 pos = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ);
    __m512 sg = _mm512_div_ps(_mm512_mask_blend_ps(pos, t, one), _mm512_add_ps(one, t));
    if (!dg) {
      _mm512_mask_storeu_ps(h + i, mk, _mm512_mul_ps(_mm512_mul_ps(gv, sg), uv));
    } else {
      __m512 dv = _mm512_maskz_loadu_ps(mk, dh + i);
      __m512 ru = _mm512_mul_ps(_mm512_mul_ps(dv, gv), sg);
      __m512 f = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sg)));
      __m512 rg = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dv, uv), sg), f);
      _mm512_mask_storeu_ps(du + i, mk, ru);
      _mm512_mask_storeu_ps(dg + i, mk, rg);
    }
  }
}
#endif

static void sw_any(float *h, float *dg, float *du, const float *dh, const float *g, const float *u,
                   int lo, int hi) {
#if defined(__x86_64__) || defined(__i386__)
  int isa = kernels_isa();
  if (isa == KERNELS_ISA_AVX512)
    sw_512(h, dg, du, dh, g, u, lo, hi);
  else if (isa == KERNELS_ISA_AVX2)
    sw_256(h, dg, du, dh, g, u, lo, hi);
  else if (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma())
    sw_fma(h, dg, du, dh, g, u, lo, hi);
  else
#endif
    sw_portable(h, dg, du, dh, g, u, lo, hi);
}

struct sw_args {
  float *h, *dg, *du;
  const float *g, *u, *dh;
};

static void swiglu_fwd_range(void *a_, int lo, int hi) {
  struct sw_args *a = a_;
  sw_any(a->h, NULL, NULL, NULL, a->g, a->u, lo, hi);
}

void swiglu_forward(float *h, const float *g, const float *u, size_t n) {
  struct sw_args a = {.h = h, .g = g, .u = u};
  parallel_for((int)n, (long)n, swiglu_fwd_range, &a);
}

static void swiglu_bwd_range(void *a_, int lo, int hi) {
  struct sw_args *a = a_;
  sw_any(NULL, a->dg, a->du, a->dh, a->g, a->u, lo, hi);
}

void swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u,
                     size_t n) {
  struct sw_args a = {.dg = dg, .du = du, .dh = dh, .g = g, .u = u};
  parallel_for((int)n, (long)n, swiglu_bwd_range, &a);
}

/* ---- Attention -------------------------------------------------------------------------- */

static float softmax_causal(float *s, int lim, int n_ctx);

/* Decoding attention, one query row against lim cached keys/values: scores, softmax, weighted sum
 * of values; returns the log-sum-exp. Its arithmetic is fixed, and the same on every path (the
 * AVX-512 and AVX2 intrinsics below, and this portable version compiled for the baseline target
 * and for AVX2 + FMA where the intrinsics do not take the head size), so a sequence decodes to the
 * same bits on every CPU:
 * - q is scaled first (q * scale, rounded), then each score is 16 lanes of fused multiply-adds
 *   over the head (lane l takes d = l mod 16; a head size that is not a multiple of 16 is
 *   zero-padded), reduced by att_tree4 for keys in whole blocks of 4 from the first, by
 *   simd_tree for the rest;
 * - the softmax's numerator is Cephes' expf polynomial (simd_exp4, within 2 ulp of expf) of
 *   s - max, summed in 16 lanes (key j in lane j mod 16), then simd_tree;
 * - the output is 16-lane fused multiply-adds of the unnormalised weights over the keys in order,
 *   times 1 / sum once at the end; the log-sum-exp is max + logf(sum). */

/* The 4-key block's reduction (AVX-512: two rounds of horizontal adds, then the 128-bit halves):
 * x_i = a_i + a_(i+8), then ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)). */
SIMD_INLINE float att_tree4(struct simd16 v) {
  simd_v4 x0 = v.q0 + v.q2, x1 = v.q1 + v.q3; /* x_0..3, x_4..7 */
  return ((x0[0] + x0[1]) + (x0[2] + x0[3])) + ((x1[0] + x1[1]) + (x1[2] + x1[3]));
}

/* The head in NV vectors of 16, the last one holding nl lanes (1..16); NV is a constant where
 * the compiler can unroll (att_row_any), at most ATT_MAX_NV. */
enum { ATT_MAX_NV = 64 }; /* head_dim <= 1024 (model.c) */

SIMD_INLINE struct simd16 att_ld(const float *p, int v, int NV, int nl) {
  return v == NV - 1 && nl < 16 ? simd_load_n(p + 16 * v, nl) : simd_load(p + 16 * v);
}

SIMD_INLINE float att_row_gen(float *restrict o, const float *restrict qi, const float *restrict kb,
                              const float *restrict vb, int lim, int HS, int ldkv, float scale,
                              float *restrict s, const int NV, const int hw) {
  int nl = HS - 16 * (NV - 1);
  struct simd16 q[ATT_MAX_NV], acc[ATT_MAX_NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; v++) q[v] = simd_scale(att_ld(qi, v, NV, nl), scale);
  int j = 0;
  for (; j + 4 <= lim; j += 4) {
    const float *k0 = kb + (size_t)j * ldkv, *k1 = k0 + ldkv, *k2 = k1 + ldkv, *k3 = k2 + ldkv;
    struct simd16 a0 = simd_zero(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      a0 = simd_fma(q[v], att_ld(k0, v, NV, nl), a0, hw);
      a1 = simd_fma(q[v], att_ld(k1, v, NV, nl), a1, hw);
      a2 = simd_fma(q[v], att_ld(k2, v, NV, nl), a2, hw);
      a3 = simd_fma(q[v], att_ld(k3, v, NV, nl), a3, hw);
    }
    s[j] = att_tree4(a0), s[j + 1] = att_tree4(a1), s[j + 2] = att_tree4(a2);
    s[j + 3] = att_tree4(a3);
  }
  for (; j < lim; j++) {
    const float *kj = kb + (size_t)j * ldkv;
    struct simd16 a = simd_zero();
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) a = simd_fma(q[v], att_ld(kj, v, NV, nl), a, hw);
    s[j] = simd_tree(a);
  }
  float mx = -INFINITY;
  for (j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
  struct simd16 sv = simd_zero();
  for (j = 0; j < lim; j += 16) {
    int n = lim - j < 16 ? lim - j : 16;
    struct simd16 e = simd_load_n(s + j, n);
    e.q0 = simd_exp4(e.q0 - mx, hw), e.q1 = simd_exp4(e.q1 - mx, hw);
    e.q2 = simd_exp4(e.q2 - mx, hw), e.q3 = simd_exp4(e.q3 - mx, hw);
    e = simd_keep_n(e, n);
    simd_store_n(s + j, e, n);
    sv = simd_add(sv, e);
  }
  float sum = simd_tree(sv);
#pragma GCC unroll 8
  for (int v = 0; v < NV; v++) acc[v] = simd_zero();
  for (j = 0; j < lim; j++) {
    const float *vj = vb + (size_t)j * ldkv;
    struct simd16 p = simd_splat(s[j]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[v] = simd_fma(p, att_ld(vj, v, NV, nl), acc[v], hw);
  }
  float inv = 1.0f / sum;
#pragma GCC unroll 8
  for (int v = 0; v < NV; v++) {
    struct simd16 r = simd_scale(acc[v], inv);
    if (v == NV - 1 && nl < 16)
      simd_store_n(o + 16 * v, r, nl);
    else
      simd_store(o + 16 * v, r);
  }
  return mx + logf(sum);
}

/* att_row_gen with the common head sizes' vector counts as constants. */
SIMD_INLINE float att_row_any(float *restrict o, const float *restrict qi, const float *restrict kb,
                              const float *restrict vb, int lim, int HS, int ldkv, float scale,
                              float *restrict s, const int hw) {
  switch ((HS + 15) / 16) {
  case 1: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, 1, hw);
  case 2: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, 2, hw);
  case 3: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, 3, hw);
  case 4: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, 4, hw);
  case 8: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, 8, hw);
  default: return att_row_gen(o, qi, kb, vb, lim, HS, ldkv, scale, s, (HS + 15) / 16, hw);
  }
}

static float attn_row_portable(float *restrict o, const float *restrict qi,
                               const float *restrict kb, const float *restrict vb, int lim, int HS,
                               int ldkv, float scale, float *restrict s) {
  return att_row_any(o, qi, kb, vb, lim, HS, ldkv, scale, s, SIMD_HW_FMA);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma"))) static float
attn_row_avx2(float *restrict o, const float *restrict qi, const float *restrict kb,
              const float *restrict vb, int lim, int HS, int ldkv, float scale, float *restrict s) {
  return att_row_any(o, qi, kb, vb, lim, HS, ldkv, scale, s, 1);
}

/* att_row_gen in 8 AVX2 lanes for NV = HS / 16 vectors a head (a constant; at most 8): each
 * 16-lane vector in two ymm (lanes 0-7, 8-15), every operation att_row_gen's in its order (the
 * same bits, tested), the 4-key blocks' reductions attn_heads512_nv's. The scaled q is read from
 * L1 (qs) rather than held: 4 keys' 8 sums in registers; the output 4 vectors (8 ymm) at a time
 * over the values. att_row_gen in 4 lanes held q in 4 NV of the 16 registers: at Qwen2.5-0.5B's
 * shape, batch 64, 128 new tokens (AVX2 emulated on Zen 4, 2 threads, in turns) attention was
 * 6-7% of the thread time, 3% with this; 150.7 / 165.9 -> 171.9 / 169.8 tok/s. */
#define K256 __attribute__((target("avx2,fma")))
K256 static inline float hsum256(__m256 lo, __m256 hi) { /* simd_tree */
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

__attribute__((always_inline)) K256 static inline float
attn_row256_nv(float *restrict o, const float *restrict qi, const float *restrict kb,
               const float *restrict vb, int lim, int ldkv, float scale, float *restrict s,
               const int NV) {
  float qs[128] __attribute__((aligned(32)));
  const __m256 z = _mm256_setzero_ps(), sc = _mm256_set1_ps(scale);
#pragma GCC unroll 16
  for (int v = 0; v < 2 * NV; v++)
    _mm256_store_ps(qs + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(qi + 8 * v), sc));
  int j = 0;
  for (; j + 4 <= lim; j += 4) {
    const float *k0 = kb + (size_t)j * ldkv, *k1 = k0 + ldkv, *k2 = k1 + ldkv, *k3 = k2 + ldkv;
    __m256 a0 = z, b0 = z, a1 = z, b1 = z, a2 = z, b2 = z, a3 = z, b3 = z;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      __m256 ql = _mm256_load_ps(qs + 16 * v), qh = _mm256_load_ps(qs + 16 * v + 8);
      a0 = _mm256_fmadd_ps(ql, _mm256_loadu_ps(k0 + 16 * v), a0);
      b0 = _mm256_fmadd_ps(qh, _mm256_loadu_ps(k0 + 16 * v + 8), b0);
      a1 = _mm256_fmadd_ps(ql, _mm256_loadu_ps(k1 + 16 * v), a1);
      b1 = _mm256_fmadd_ps(qh, _mm256_loadu_ps(k1 + 16 * v + 8), b1);
      a2 = _mm256_fmadd_ps(ql, _mm256_loadu_ps(k2 + 16 * v), a2);
      b2 = _mm256_fmadd_ps(qh, _mm256_loadu_ps(k2 + 16 * v + 8), b2);
      a3 = _mm256_fmadd_ps(ql, _mm256_loadu_ps(k3 + 16 * v), a3);
      b3 = _mm256_fmadd_ps(qh, _mm256_loadu_ps(k3 + 16 * v + 8), b3);
    }
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1)),
                              _mm256_hadd_ps(_mm256_add_ps(a2, b2), _mm256_add_ps(a3, b3)));
    _mm_storeu_ps(s + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
  for (; j < lim; j++) {
    const float *kj = kb + (size_t)j * ldkv;
    __m256 a = z, b = z;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      a = _mm256_fmadd_ps(_mm256_load_ps(qs + 16 * v), _mm256_loadu_ps(kj + 16 * v), a);
      b = _mm256_fmadd_ps(_mm256_load_ps(qs + 16 * v + 8), _mm256_loadu_ps(kj + 16 * v + 8), b);
    }
    s[j] = hsum256(a, b);
  }
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (j = 0; j + 8 <= lim; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  float m8[8], mx = -INFINITY;
  _mm256_storeu_ps(m8, mv);
  for (int i = 0; i < 8; i++) mx = m8[i] > mx ? m8[i] : mx;
  for (; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
  /* the numerators, key j in lane j mod 16 (lanes past lim +0) */
  const __m256 mxv = _mm256_set1_ps(mx);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 sa = z, sb = z;
  for (j = 0; j < lim; j += 16) {
    int n = lim - j < 16 ? lim - j : 16;
    float t[16] __attribute__((aligned(32))) = {0};
    float *p = n == 16 ? s + j : t;
    if (n < 16) memcpy(t, s + j, sizeof(float) * (size_t)n);
    __m256 ea = simd_exp256(_mm256_sub_ps(_mm256_loadu_ps(p), mxv));
    __m256 eb = simd_exp256(_mm256_sub_ps(_mm256_loadu_ps(p + 8), mxv));
    if (n < 16) {
      __m256i nv = _mm256_set1_epi32(n);
      ea = _mm256_and_ps(ea, _mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, lane)));
      eb = _mm256_and_ps(eb, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                 nv, _mm256_add_epi32(lane, _mm256_set1_epi32(8)))));
    }
    _mm256_storeu_ps(p, ea), _mm256_storeu_ps(p + 8, eb);
    if (n < 16) memcpy(s + j, t, sizeof(float) * (size_t)n);
    sa = _mm256_add_ps(sa, ea), sb = _mm256_add_ps(sb, eb);
  }
  float sum = hsum256(sa, sb);
  __m256 inv = _mm256_set1_ps(1.0f / sum);
#pragma GCC unroll 2
  for (int v0 = 0; v0 < NV; v0 += 4) { /* 4 vectors of the output at a time */
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = z;
    for (j = 0; j < lim; j++) {
      const float *vj = vb + (size_t)j * ldkv + 16 * v0;
      __m256 pj = _mm256_broadcast_ss(s + j);
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++)
        if (v0 + i / 2 < NV) acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
      if (v0 + i / 2 < NV) _mm256_storeu_ps(o + 16 * v0 + 8 * i, _mm256_mul_ps(acc[i], inv));
  }
  return mx + logf(sum);
}

/* A call of attn_heads512_nv or attn_row256_nv for each head size they take (HS / 16 = 1-6 or 8;
 * NV a constant in each, so that its loops unroll). */
#define ATT_NV_CASES(CALL)                                                                         \
  switch (HS / 16) {                                                                               \
  case 1: CALL(1); break;                                                                          \
  case 2: CALL(2); break;                                                                          \
  case 3: CALL(3); break;                                                                          \
  case 4: CALL(4); break;                                                                          \
  case 5: CALL(5); break;                                                                          \
  case 6: CALL(6); break;                                                                          \
  default: CALL(8); break;                                                                         \
  }
/* the head sizes ATT_NV_CASES takes */
#define ATT_NV_HS(HS) ((HS) % 16 == 0 && ((HS) <= 96 || (HS) == 128))

/* One head (attention_forward's decoding rows) of ATT_NV_HS's sizes. */
K256 static float attn_row256(float *restrict o, const float *restrict qi, const float *restrict kb,
                              const float *restrict vb, int lim, int HS, int ldkv, float scale,
                              float *restrict s) {
  float l = 0;
#define ATT_ONE(nv) l = attn_row256_nv(o, qi, kb, vb, lim, ldkv, scale, s, nv)
  ATT_NV_CASES(ATT_ONE)
#undef ATT_ONE
  return l;
}

/* the portable path on a CPU with FMA3 (kernels.h) */
__attribute__((target("fma"))) static float
attn_row_fma(float *restrict o, const float *restrict qi, const float *restrict kb,
             const float *restrict vb, int lim, int HS, int ldkv, float scale, float *restrict s) {
  return att_row_any(o, qi, kb, vb, lim, HS, ldkv, scale, s, 1);
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* AVX-512 version of the decoding attention row for head sizes 16-96 and 128, in registers: the
 * same operations in the same order as att_row_gen (the same bits, tested). */
#define K512 __attribute__((target("avx512f")))

/* lanes i + (i + 8) */
K512 static inline __m256 fold512(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

K512 static inline float hsum512(__m512 a) {
  __m256 s8 = fold512(a);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* the first n of 16 lanes (n >= 1) */
static inline __mmask16 mask16(int n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* G query heads (qi + g HS, outputs o + g HS, log-sum-exps lse[g]) that share one KV head, at
 * one query row, NV = HS / 16 vectors a head (constants, so that the loops unroll): each head's
 * operations are att_row_gen's in the same order (the same bits, tested), every key and value
 * row loaded once for the G heads instead of once per head (docs/ENGINE.md: 1.34-1.49x at
 * Qwen2.5-0.5B's 7 heads a group). Scores in s[g * lim + j]. */
__attribute__((always_inline)) K512 static inline void
attn_heads512_nv(float *restrict o, float *restrict lse, const float *restrict qi,
                 const float *restrict kb, const float *restrict vb, int lim, int HS, int ldkv,
                 float scale, float *restrict s, const int NV, const int G) {
  __m512 q[4][8], sc = _mm512_set1_ps(scale);
#pragma GCC unroll 4
  for (int g = 0; g < G; g++)
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) q[g][v] = _mm512_mul_ps(_mm512_loadu_ps(qi + g * HS + 16 * v), sc);
  int j = 0;
  for (; j + 4 <= lim; j += 4) {
    const float *k0 = kb + (size_t)j * ldkv, *k1 = k0 + ldkv, *k2 = k1 + ldkv, *k3 = k2 + ldkv;
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
      __m512 x0 = _mm512_loadu_ps(k0 + 16 * v), x1 = _mm512_loadu_ps(k1 + 16 * v);
      __m512 x2 = _mm512_loadu_ps(k2 + 16 * v), x3 = _mm512_loadu_ps(k3 + 16 * v);
#pragma GCC unroll 4
      for (int g = 0; g < G; g++) {
        a[g][0] = _mm512_fmadd_ps(q[g][v], x0, a[g][0]);
        a[g][1] = _mm512_fmadd_ps(q[g][v], x1, a[g][1]);
        a[g][2] = _mm512_fmadd_ps(q[g][v], x2, a[g][2]);
        a[g][3] = _mm512_fmadd_ps(q[g][v], x3, a[g][3]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
      __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(fold512(a[g][0]), fold512(a[g][1])),
                                _mm256_hadd_ps(fold512(a[g][2]), fold512(a[g][3])));
      _mm_storeu_ps(s + (size_t)g * lim + j,
                    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
  for (; j < lim; j++) {
    const float *kj = kb + (size_t)j * ldkv;
    __m512 a[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) a[g] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
      __m512 x = _mm512_loadu_ps(kj + 16 * v);
#pragma GCC unroll 4
      for (int g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(q[g][v], x, a[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) s[(size_t)g * lim + j] = hsum512(a[g]);
  }
  float sum[4], mx[4];
  for (int g = 0; g < G; g++) {
    float *sg = s + (size_t)g * lim;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (j = 0; j < lim; j += 16) {
      __mmask16 mk = mask16(lim - j);
      mv = _mm512_mask_max_ps(mv, mk, mv, _mm512_maskz_loadu_ps(mk, sg + j));
    }
    mx[g] = _mm512_reduce_max_ps(mv);
    __m512 sv = _mm512_setzero_ps(), mxv = _mm512_set1_ps(mx[g]);
    for (j = 0; j < lim; j += 16) {
      __mmask16 mk = mask16(lim - j);
      __m512 e = simd_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sg + j), mxv));
      e = _mm512_maskz_mov_ps(mk, e);
      _mm512_mask_storeu_ps(sg + j, mk, e);
      sv = _mm512_add_ps(sv, e);
    }
    sum[g] = hsum512(sv);
  }
  __m512 acc[4][8];
#pragma GCC unroll 4
  for (int g = 0; g < G; g++)
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) acc[g][v] = _mm512_setzero_ps();
  for (j = 0; j < lim; j++) {
    const float *vj = vb + (size_t)j * ldkv;
    __m512 p[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) p[g] = _mm512_set1_ps(s[(size_t)g * lim + j]);
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) {
      __m512 x = _mm512_loadu_ps(vj + 16 * v);
#pragma GCC unroll 4
      for (int g = 0; g < G; g++) acc[g][v] = _mm512_fmadd_ps(p[g], x, acc[g][v]);
    }
  }
  for (int g = 0; g < G; g++) {
    __m512 inv = _mm512_set1_ps(1.0f / sum[g]);
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++)
      _mm512_storeu_ps(o + g * HS + 16 * v, _mm512_mul_ps(acc[g][v], inv));
    lse[g] = mx[g] + logf(sum[g]);
  }
}

/* Heads per attn_heads512_nv call by vectors per head: q, 4 keys' sums and 4 key vectors in the
 * 32 registers (at most ATTENTION_DECODE_HEADS). */
static inline int attn_heads512_g(int NV) {
  return NV <= 2 ? 4 : NV <= 4 ? 3 : 2;
}

/* One head (attention_forward's decoding rows): G = 1. */
K512 static float attn_row512(float *restrict o, const float *restrict qi, const float *restrict kb,
                              const float *restrict vb, int lim, int HS, int ldkv, float scale,
                              float *restrict s) {
  float l;
#define ATT_ONE(nv) attn_heads512_nv(o, &l, qi, kb, vb, lim, HS, ldkv, scale, s, nv, 1)
  ATT_NV_CASES(ATT_ONE)
#undef ATT_ONE
  return l;
}

/* attn_heads512_g(HS / 16) heads (attention_decode's). */
K512 static void attn_heads512(float *restrict o, float *restrict lse, const float *restrict qi,
                               const float *restrict kb, const float *restrict vb, int lim, int HS,
                               int ldkv, float scale, float *restrict s) {
#define ATT_ALL(nv)                                                                                \
  attn_heads512_nv(o, lse, qi, kb, vb, lim, HS, ldkv, scale, s, nv, attn_heads512_g(nv))
  ATT_NV_CASES(ATT_ALL)
#undef ATT_ALL
}
#undef ATT_NV_CASES

#endif

/* p[j] = exp(p[j] - sub) in place for j < n, returning their sum: training attention's softmax
 * (forward, and the backward's probabilities again from the log-sum-exp), with decoding's
 * exponential (simd_exp4, simd_exp512: the same bits on every instruction set; exp(-87.3) ~ 1e-38
 * below -87.3) where it took libm's expf one element at a time (3.3 ns each: 38 M a step at the
 * small benchmark model's shape, 5% of a training step). A NaN stays a NaN (and so the sum), as
 * with expf. Sums in 16 lanes, reduced by simd_tree. */
SIMD_INLINE float exp_shift_gen(float *p, int n, float sub, const int hw) {
  struct simd16 acc = simd_zero();
  for (int j = 0; j < n; j += 16) {
    int m = n - j < 16 ? n - j : 16;
    struct simd16 z = simd_load_n(p + j, m), e;
    simd_v4 sb = {sub, sub, sub, sub};
#define EXP_Q(q)                                                                                   \
  do {                                                                                             \
    simd_v4 zq = z.q - sb;                                                                         \
    simd_i4 nan = zq != zq;                                                                        \
    e.q = (simd_v4)(((simd_i4)simd_exp4(zq, hw) & ~nan) | ((simd_i4)zq & nan));                    \
  } while (0)
    EXP_Q(q0);
    EXP_Q(q1);
    EXP_Q(q2);
    EXP_Q(q3);
#undef EXP_Q
    e = simd_keep_n(e, m);
    simd_store_n(p + j, e, m);
    acc = simd_add(acc, e);
  }
  return simd_tree(acc);
}

static float exp_shift_portable(float *p, int n, float sub) {
  return exp_shift_gen(p, n, sub, SIMD_HW_FMA);
}

#if defined(__x86_64__) || defined(__i386__)
/* FMA3 alone: also the portable set on a CPU with FMA but no AVX2 */
__attribute__((target("fma"))) static float exp_shift_fma(float *p, int n, float sub) {
  return exp_shift_gen(p, n, sub, 1);
}
/* exp_shift_gen in 16 lanes: the same operations */
__attribute__((target("avx512f"))) static float exp_shift_512(float *p, int n, float sub) {
  __m512 acc = _mm512_setzero_ps(), sb = _mm512_set1_ps(sub);
  for (int j = 0; j < n; j += 16) {
    __mmask16 mk = n - j < 16 ? (__mmask16)((1u << (n - j)) - 1) : (__mmask16)0xffff;
    __m512 z = _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, p + j), sb);
    __mmask16 nan = _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
    __m512 e = _mm512_maskz_mov_ps(mk, _mm512_mask_blend_ps(nan, simd_exp512(z), z));
    _mm512_mask_storeu_ps(p + j, mk, e);
    acc = _mm512_add_ps(acc, e);
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, acc);
  return simd_tree(simd_load(lanes));
}
#endif

static float exp_shift(float *p, int n, float sub) {
#if defined(__x86_64__) || defined(__i386__)
  int isa = kernels_isa();
  if (isa == KERNELS_ISA_AVX512) return exp_shift_512(p, n, sub);
  if (isa == KERNELS_ISA_AVX2 || (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma()))
    return exp_shift_fma(p, n, sub);
#endif
  return exp_shift_portable(p, n, sub);
}

/* Softmax of row s[0..lim) in place, zeroing s[lim..n_ctx); returns the log-sum-exp. */
static float softmax_causal(float *s, int lim, int n_ctx) {
  float mx = -INFINITY;
  for (int j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
  float sum = exp_shift(s, lim, mx);
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
        float *oi = out + (size_t)i * ldo + (size_t)h * HS;
        const float *qi = q + (size_t)i * ldq + (size_t)h * HS;
        int lim = n_past + i + 1, isa = kernels_isa();
        float l;
        (void)isa; /* off x86 only the portable row is compiled */
#if defined(__x86_64__) || defined(__i386__)
        if (isa == KERNELS_ISA_AVX512 && ATT_NV_HS(HS))
          l = attn_row512(oi, qi, kb, vb, lim, HS, ldkv, scale, scratch);
        else if (isa == KERNELS_ISA_AVX2 && ATT_NV_HS(HS))
          l = attn_row256(oi, qi, kb, vb, lim, HS, ldkv, scale, scratch);
        else if (isa == KERNELS_ISA_AVX2 || isa == KERNELS_ISA_AVX512)
          l = attn_row_avx2(oi, qi, kb, vb, lim, HS, ldkv, scale, scratch);
        else if (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma())
          l = attn_row_fma(oi, qi, kb, vb, lim, HS, ldkv, scale, scratch);
        else
#endif
          l = attn_row_portable(oi, qi, kb, vb, lim, HS, ldkv, scale, scratch);
        if (lse) lse[(size_t)i * NH + h] = l;
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

/* One decoding row's heads of one KV group: attention_forward's bits (its t_new = 1 rows), with
 * the AVX-512 path taking ATTENTION_DECODE_HEADS or fewer heads per pass over the cache. */
void attention_decode(float *out, float *lse, const float *q, const float *k, const float *v,
                      int n_past, int h0, int n_rep, int kvh, int HS, int ldkv, float *scratch) {
  int lim = n_past + 1, h = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (kernels_isa() == KERNELS_ISA_AVX512 && ATT_NV_HS(HS)) {
    float scale = 1.0f / sqrtf((float)HS), l[ATTENTION_DECODE_HEADS];
    const float *kb = k + (size_t)kvh * HS, *vb = v + (size_t)kvh * HS;
    for (int G = attn_heads512_g(HS / 16); h + G <= n_rep; h += G) {
      attn_heads512(out + (size_t)(h0 + h) * HS, l, q + (size_t)(h0 + h) * HS, kb, vb, lim, HS,
                    ldkv, scale, scratch);
      if (lse)
        for (int g = 0; g < G; g++) lse[h0 + h + g] = l[g];
    }
  }
#endif
  /* the heads left (all of them off AVX-512), one at a time: row 0 only, so no strides */
  if (h < n_rep)
    attention_forward(out, lse, q, k, v, 1, n_past, h0 + h, n_rep - h, kvh, HS, 0, ldkv, 0, 0,
                      scratch);
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
                        const float *k, const float *v, const float *lse, int T, int n_past, int h0,
                        int n_rep, int kvh, int HS, int ldq, int ldkv, int ldo, int NH,
                        float *scratch) {
  /* P, dP: [T, n_ctx]; query row i sees context rows 0 .. n_past + i */
  int n_ctx = n_past + T;
  float scale = 1.0f / sqrtf((float)HS);
  const float *kb = k + (size_t)kvh * HS, *vb = v + (size_t)kvh * HS;
  float *dkb = dk + (size_t)kvh * HS, *dvb = dv + (size_t)kvh * HS;
  float *P = scratch, *dP = scratch + (size_t)T * n_ctx;
  for (int r = 0; r < n_rep; r++) {
    int h = h0 + r;
    const float *qh = q + (size_t)h * HS, *doh = dout + (size_t)h * HS;
    float *dqh = dq + (size_t)h * HS;
    /* P = exp(scale * Q K^T - lse), causal */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n_ctx, HS, scale, qh, ldq, kb, ldkv,
                0.0f, P, n_ctx);
    for (int i = 0; i < T; i++) {
      float *p = P + (size_t)i * n_ctx;
      float l = lse[(size_t)i * NH + h];
      int lim = n_past + i + 1;
      exp_shift(p, lim, l);
      for (int j = lim; j < n_ctx; j++) p[j] = 0.0f;
    }
    /* dV += P^T dO;  dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_ctx, HS, T, 1.0f, P, n_ctx, doh, ldo,
                1.0f, dvb, ldkv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n_ctx, HS, 1.0f, doh, ldo, vb, ldkv,
                0.0f, dP, n_ctx);
    /* dS = P * (dP - rowsum(P * dP)), scaled */
    for (int i = 0; i < T; i++) {
      float *p = P + (size_t)i * n_ctx, *dp = dP + (size_t)i * n_ctx;
      int lim = n_past + i + 1;
      float D = 0;
      for (int j = 0; j < lim; j++) D += p[j] * dp[j];
      for (int j = 0; j < lim; j++) p[j] = p[j] * (dp[j] - D) * scale;
    }
    /* dQ += dS K;  dK += dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, n_ctx, 1.0f, P, n_ctx, kb, ldkv,
                1.0f, dqh, ldq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_ctx, HS, T, 1.0f, P, n_ctx, qh, ldq,
                1.0f, dkb, ldkv);
  }
}

/* ---- Classifier: log-softmax, log-prob of the target, entropy ------------------------------ */

struct cls_args {
  float *logits, *logp, *entropy;
  const float *w;
  const int *targets;
  const uint64_t *allowed; /* NULL, or a bitset of (V + 63) / 64 words per row */
  int V;
  float inv_temp;
  int probs; /* write the softmax back (and the entropy) */
};

/* One row of logits z[V]: scaled by inv_temp in place, log p of the target, and with probs the
 * softmax written back and the entropy. Vectorised in 16 lanes (simd.h), the same bits on every
 * instruction set (the dispatch below, as the attention's):
 * - the exponentials are simd_exp4 (Cephes' expf, within 2 ulp of expf);
 * - the sums go in chunks of CLS_CHUNK logits: 16 float lanes (logit j in lane j mod 16), reduced
 *   by simd_tree, the chunks' sums added in double;
 * - a NaN or an infinity among the logits makes the log-sum-exp NaN, as expf's sum would (the
 *   sum of z - z is then not 0): simd_exp4 alone would clamp it away;
 * - with a row of allowed ids (structured outputs), the others are -INFINITY: left out of the
 *   maximum, their exponential exactly 0 (their lanes go through the pass as z = sub, then are
 *   zeroed), so their probability is exactly 0, they add nothing to the entropy and the sums of
 *   the allowed lanes are those of a row without them. */
enum { CLS_CHUNK = 256 };

/* Lanes of 4 ids whose bits are b (bit i: lane i allowed) as a lane mask. */
SIMD_INLINE simd_i4 cls_bits4(unsigned b) {
  simd_i4 m = {-(int)(b & 1), -(int)(b >> 1 & 1), -(int)(b >> 2 & 1), -(int)(b >> 3 & 1)};
  return m;
}

SIMD_INLINE simd_v4 cls_sel4(simd_i4 m, simd_v4 a, simd_v4 b) { /* a where m, else b */
  return (simd_v4)(((simd_i4)a & m) | ((simd_i4)b & ~m));
}

/* x's lanes where bits (16 ids from a multiple of 16) allow them, the other's elsewhere. */
SIMD_INLINE struct simd16 cls_keep_bits(struct simd16 x, unsigned bits, struct simd16 other) {
  struct simd16 r = {cls_sel4(cls_bits4(bits), x.q0, other.q0),
                     cls_sel4(cls_bits4(bits >> 4), x.q1, other.q1),
                     cls_sel4(cls_bits4(bits >> 8), x.q2, other.q2),
                     cls_sel4(cls_bits4(bits >> 12), x.q3, other.q3)};
  return r;
}

SIMD_INLINE struct simd16 cls_exp16(struct simd16 x, float sub, const int hw) {
  struct simd16 r = {simd_exp4(x.q0 - sub, hw), simd_exp4(x.q1 - sub, hw),
                     simd_exp4(x.q2 - sub, hw), simd_exp4(x.q3 - sub, hw)};
  return r;
}

SIMD_INLINE simd_v4 cls_max4(simd_v4 m, simd_v4 v) { /* v where v > m (never a NaN) */
  simd_i4 gt = v > m;
  return (simd_v4)(((simd_i4)v & gt) | ((simd_i4)m & ~gt));
}

/* One pass over z[V] in chunks (above), exp(z - sub) in each lane: !probs, the sum of the
 * exponentials (NaN when a logit is not finite); probs, writes them back as the probabilities
 * (sub: the log-sum-exp) and returns the entropy, the sum of p (lse - z), terms >= 0. allow: NULL,
 * or the row's allowed ids (the others count as exactly 0). */
SIMD_INLINE double cls_pass(float *z, int V, float sub, int probs, const uint64_t *allow,
                            const int hw) {
  double sum = 0;
  struct simd16 bad = simd_zero();
  for (int j = 0; j < V; j += CLS_CHUNK) {
    int end = V - j < CLS_CHUNK ? V : j + CLS_CHUNK;
    struct simd16 acc = simd_zero();
    for (int k = j; k < end; k += 16) {
      int n = end - k < 16 ? end - k : 16;
      struct simd16 v = n == 16 ? simd_load(z + k) : simd_load_n(z + k, n);
      unsigned bits = allow ? (unsigned)(allow[k >> 6] >> (k & 63)) & 0xffffu : 0;
      if (allow) v = cls_keep_bits(v, bits, simd_splat(sub)); /* masked: exp(0), then 0 */
      struct simd16 e = cls_exp16(v, sub, hw);
      if (allow) e = cls_keep_bits(e, bits, simd_zero());
      if (n < 16) e = simd_keep_n(e, n);
      if (probs) {
        struct simd16 nlp = {sub - v.q0, sub - v.q1, sub - v.q2, sub - v.q3}; /* -log p */
        acc = simd_fma(e, nlp, acc, hw);
        simd_store_n(z + k, e, n);
      } else {
        struct simd16 zero = {v.q0 - v.q0, v.q1 - v.q1, v.q2 - v.q2, v.q3 - v.q3};
        bad = simd_add(bad, zero);
        acc = simd_add(acc, e);
      }
    }
    sum += simd_tree(acc);
  }
  return !probs && simd_tree(bad) != 0.0f ? NAN : sum;
}

SIMD_INLINE void cls_row_gen(float *z, int V, float inv_temp, int target, float *logp,
                             float *entropy, int probs, const uint64_t *allow, const int hw) {
  for (int j = 0; allow && j < V; j++) /* masked ids out of the maximum */
    if (!(allow[j >> 6] >> (j & 63) & 1)) z[j] = -INFINITY;
  struct simd16 mv = simd_splat(-INFINITY);
  int j = 0;
  for (; j + 16 <= V; j += 16) {
    struct simd16 v = simd_scale(simd_load(z + j), inv_temp);
    simd_store(z + j, v);
    mv.q0 = cls_max4(mv.q0, v.q0), mv.q1 = cls_max4(mv.q1, v.q1);
    mv.q2 = cls_max4(mv.q2, v.q2), mv.q3 = cls_max4(mv.q3, v.q3);
  }
  float lanes[16], mx = -INFINITY;
  simd_store(lanes, mv);
  for (int l = 0; l < 16; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; j < V; j++) {
    z[j] *= inv_temp;
    mx = z[j] > mx ? z[j] : mx;
  }
  float lse = mx + (float)log(cls_pass(z, V, mx, 0, allow, hw));
  if (logp) *logp = z[target] - lse;
  if (!probs) return;
  double h = cls_pass(z, V, lse, 1, allow, hw); /* writes the probabilities */
  if (entropy) *entropy = (float)h;
}

typedef void cls_row_fn(float *, int, float, int, float *, float *, int, const uint64_t *);

static void cls_row_portable(float *z, int V, float inv_temp, int target, float *logp,
                             float *entropy, int probs, const uint64_t *allow) {
  cls_row_gen(z, V, inv_temp, target, logp, entropy, probs, allow, SIMD_HW_FMA);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("fma"))) static void cls_row_fma(float *z, int V, float inv_temp, int target,
                                                       float *logp, float *entropy, int probs,
                                                       const uint64_t *allow) {
  cls_row_gen(z, V, inv_temp, target, logp, entropy, probs, allow, 1);
}
__attribute__((target("avx2,fma"))) static void cls_row_avx2(float *z, int V, float inv_temp,
                                                             int target, float *logp,
                                                             float *entropy, int probs,
                                                             const uint64_t *allow) {
  cls_row_gen(z, V, inv_temp, target, logp, entropy, probs, allow, 1);
}
#endif

static cls_row_fn *cls_row_pick(void) {
#if defined(__x86_64__) || defined(__i386__)
  int isa = kernels_isa();
  /* not compiled for AVX-512: GCC 12 then keeps values in zmm16-31, which vzeroupper does not
   * clear, and the libm expf calls that follow elsewhere ran 50x slower (measured) */
  if (isa == KERNELS_ISA_AVX512 || isa == KERNELS_ISA_AVX2) return cls_row_avx2;
  if (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma()) return cls_row_fma;
#endif
  return cls_row_portable;
}

static void cls_fwd_rows(void *a_, int lo, int hi) {
  struct cls_args *a = a_;
  cls_row_fn *row = cls_row_pick();
  size_t W = ((size_t)a->V + 63) / 64;
  for (int r = lo; r < hi; r++)
    row(a->logits + (size_t)r * a->V, a->V, a->inv_temp, a->targets[r],
        a->logp ? a->logp + r : NULL, a->entropy ? a->entropy + r : NULL, a->probs,
        a->allowed ? a->allowed + (size_t)r * W : NULL);
}

void classifier_forward(float *logits, float *logp, float *entropy, const int *targets,
                        const uint64_t *allowed, int R, int V, float inv_temp) {
  /* logits: [R, V] -> probabilities in place */
  struct cls_args a = {.logits = logits,
                       .logp = logp,
                       .entropy = entropy,
                       .targets = targets,
                       .allowed = allowed,
                       .V = V,
                       .inv_temp = inv_temp,
                       .probs = 1};
  parallel_for(R, (long)R * V * 8, cls_fwd_rows, &a);
}

void classifier_logprobs(float *logits, float *logp, const int *targets, const uint64_t *allowed,
                         int R, int V, float inv_temp) {
  struct cls_args a = {.logits = logits,
                       .logp = logp,
                       .targets = targets,
                       .allowed = allowed,
                       .V = V,
                       .inv_temp = inv_temp};
  parallel_for(R, (long)R * V * 4, cls_fwd_rows, &a);
}

static void cls_bwd_rows(void *a_, int lo, int hi) {
  struct cls_args *a = a_;
  float *probs = a->logits, inv_temp = a->inv_temp;
  const float *w = a->w;
  const int *targets = a->targets;
  int V = a->V;
  for (int r = lo; r < hi; r++) {
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

void classifier_backward(float *probs, const float *w, const int *targets, int R, int V,
                         float inv_temp) {
  struct cls_args a = {.logits = probs, .w = w, .targets = targets, .V = V, .inv_temp = inv_temp};
  parallel_for(R, (long)R * V, cls_bwd_rows, &a);
}
