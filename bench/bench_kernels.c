/* Benchmark of the BF16-weight kernels against their float32 peers (bench/README.md): the forward
 * product (matmul_forward_bf16 vs matmul_forward), the input gradient through a frozen matrix
 * (matmul_backward_dinp_bf16 vs matmul_backward's dinp) and decoding (linear_few_bf16 vs
 * linear_few, columns split over the pool as the sampler does), at Qwen2.5-0.5B's MLP shapes,
 * measured in turns in one process (F32, BF16, BF16, F32, ...) and printed as ratios beside this
 * machine's measured peaks (SGEMM at 1 and n threads, memory bandwidth), and says whether
 * cblas_sbgemm and AVX512_BF16 exist here. It reports, it never fails on a time.
 * Usage: bench_kernels [--threads N] [--reps N] [--isa avx2|avx512|portable] [--lanes |
 * --attention]
 * --isa forces the decoding kernels' instruction set (kernels_force_isa) for the whole run. */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kernels.h"
#include "pool.h"
#include "rng.h"

enum { ROWS = 512, DEC_M = 16, N_MAT = 8 }; /* a micro-batch's rows; a decoding batch; matrices */
#define HIDDEN 896                          /* Qwen2.5-0.5B */
#define FF 4864

static float *rnd(struct rng *r, size_t n, float scale) {
  float *x = malloc(n * sizeof(float));
  if (!x) {
    fprintf(stderr, "bench_kernels: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) x[i] = scale * (float)rng_normal(r);
  return x;
}

/* ---- peaks ---------------------------------------------------------------------------------- */

static double sgemm_peak(int threads) {
  int n = 1024;
  float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
  openblas_set_num_threads(threads);
  double best = 0;
  for (int r = 0; r < 4; r++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double g = 2.0 * n * n * n / (now_s() - t0) * 1e-9;
    best = g > best ? g : best;
  }
  openblas_set_num_threads(1);
  free(a), free(b), free(c);
  return best;
}

struct bw_args {
  const float *buf;
  size_t n;
  double sum[64];
};

static void bw_task(void *ctx, int i, int n) {
  struct bw_args *a = ctx;
  int lo, hi;
  pool_split((int)(a->n / 1024), i, n, &lo, &hi);
  float s[16] = {0};
  for (size_t k = (size_t)lo * 1024; k < (size_t)hi * 1024; k += 16)
    for (int l = 0; l < 16; l++) s[l] += a->buf[k + l];
  double t = 0;
  for (int l = 0; l < 16; l++) t += s[l];
  a->sum[i % 64] = t;
}

/* Best of 4 reads of 256 MiB over the pool's threads, GB/s. */
static double read_bandwidth(struct pool *p) {
  size_t n = (size_t)64 << 20;
  float *buf = malloc(n * sizeof(float));
  if (!buf) return 0;
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
  struct bw_args a = {.buf = buf, .n = n};
  double best = 0;
  for (int r = 0; r < 4; r++) {
    double t0 = now_s();
    pool_run(p, bw_task, &a);
    double g = (double)n * sizeof(float) / (now_s() - t0) * 1e-9;
    best = g > best ? g : best;
  }
  free(buf);
  return best;
}

/* ---- the workloads -------------------------------------------------------------------------- */

struct work {
  int IN, OUT;
  float *w32[N_MAT], *x, *y, *dy, *dx, *xd, *yd;
  uint16_t *w16[N_MAT];
  int mat; /* the matrix this call uses: calls cycle over N_MAT so decoding reads from memory */
};

struct dec_args {
  struct work *wk;
  int bf16;
};

static void dec_task(void *ctx, int i, int n) {
  struct dec_args *a = ctx;
  struct work *wk = a->wk;
  int lo, hi;
  pool_split(wk->OUT / 4, i, n, &lo, &hi); /* whole tiles of 4 columns, as the sampler */
  lo *= 4, hi = hi == wk->OUT / 4 ? wk->OUT : hi * 4;
  if (a->bf16)
    linear_few_bf16(wk->yd, wk->xd, wk->w16[wk->mat], NULL, DEC_M, wk->IN, wk->OUT, lo, hi, 0.0f);
  else
    linear_few(wk->yd, wk->xd, wk->w32[wk->mat], NULL, DEC_M, wk->IN, wk->OUT, lo, hi, 0.0f);
}

/* One call of kernel k (0 forward, 1 dinp backward, 2 decoding) with BF16 or F32 weights; s. */
static double run_once(struct pool *p, struct work *wk, int k, int bf16) {
  int IN = wk->IN, OUT = wk->OUT, m = wk->mat = (wk->mat + 1) % N_MAT, rc = 0;
  double t0 = now_s();
  if (k == 0 && bf16)
    rc = matmul_forward_bf16(wk->y, wk->x, wk->w16[m], NULL, ROWS, IN, OUT, 0.0f);
  else if (k == 0)
    matmul_forward(wk->y, wk->x, wk->w32[m], NULL, ROWS, IN, OUT, 0.0f);
  else if (k == 1 && bf16)
    rc = matmul_backward_dinp_bf16(wk->dx, wk->dy, wk->w16[m], ROWS, IN, OUT, 0.0f);
  else if (k == 1)
    matmul_backward(wk->dx, NULL, NULL, wk->dy, wk->x, wk->w32[m], ROWS, IN, OUT, 0.0f);
  else {
    struct dec_args a = {wk, bf16};
    pool_run(p, dec_task, &a);
  }
  if (rc) {
    fprintf(stderr, "bench_kernels: out of memory\n");
    exit(1);
  }
  return now_s() - t0;
}

/* Whether the OpenBLAS we run exports cblas_sbgemm (BF16 x BF16 -> F32: Debian 12's 0.3.21
 * declares it in cblas.h but is built without it) and whether the CPU has AVX512_BF16. */
static void probe_bf16_support(void) {
  void *sb = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
  int cpu = 0;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  cpu = __builtin_cpu_supports("avx512bf16");
#endif
  printf("cblas_sbgemm in the OpenBLAS loaded: %s; CPU AVX512_BF16: %s (neither is used: both "
         "round the activations to BF16 as well, docs/ENGINE.md)\n",
         sb ? "yes" : "no", cpu ? "yes" : "no");
}

static void work_init(struct work *wk, struct rng *r, int IN, int OUT) {
  memset(wk, 0, sizeof *wk);
  wk->IN = IN, wk->OUT = OUT;
  for (int m = 0; m < N_MAT; m++) {
    wk->w32[m] = rnd(r, (size_t)OUT * IN, 0.03f);
    wk->w16[m] = malloc((size_t)OUT * IN * sizeof(uint16_t));
    if (!wk->w16[m]) exit(1);
    f32_to_bf16(wk->w16[m], wk->w32[m], (size_t)OUT * IN);
    bf16_to_f32(wk->w32[m], wk->w16[m], (size_t)OUT * IN); /* both sides: the same weights */
  }
  wk->x = rnd(r, (size_t)ROWS * IN, 1), wk->y = rnd(r, (size_t)ROWS * OUT, 1);
  wk->dy = rnd(r, (size_t)ROWS * OUT, 1), wk->dx = rnd(r, (size_t)ROWS * IN, 1);
  wk->xd = rnd(r, (size_t)DEC_M * IN, 1), wk->yd = rnd(r, (size_t)DEC_M * OUT, 1);
}

static void work_free(struct work *wk) {
  for (int m = 0; m < N_MAT; m++) free(wk->w32[m]), free(wk->w16[m]);
  free(wk->x), free(wk->y), free(wk->dy), free(wk->dx), free(wk->xd), free(wk->yd);
}

/* --lanes: linear_lanes_block (the outputs in the lanes: weight rows transposed into a block on
 * the fly; main's kernel until rows in the lanes) against linear_lanes (the rows in the lanes
 * from 16 rows on AVX-512, the block otherwise; the same bits) on this thread alone, float32
 * weights (--lanes-bf16: BF16, linear_lanes_bf16 against the block on them), GFLOP/s at M = 1,
 * 4, 16, 32, 64 for Qwen2.5-0.5B's shapes and a small model's LM head with Qwen's vocabulary, in
 * turns (old, new, new, old, ...); the weights cycle over copies of about 256 MB in all, so that
 * they come from memory as in decoding. */
/* vs: NULL, or linear_lanes_set_form's "KMAX,AHEAD" for the old column (linear_lanes with those
 * choices instead of the block; the new column the defaults) */
static void lanes_bench(struct rng *r, int reps, int bf16, const char *vs) {
  int vk = -1, va = -1;
  if (vs && sscanf(vs, "%d,%d", &vk, &va) != 2) vk = va = -1;
  static const int shapes[5][2] = {{896, 896}, {896, 128}, {896, 4864}, {4864, 896}, {128, 151669}};
  static const int Ms[5] = {1, 4, 16, 32, 64};
  pool_set_current(NULL);
  printf("one thread, decoding ISA %d (kernels.h); OpenBLAS %s, SGEMM 1024^3 %.0f GFLOP/s\n",
         kernels_isa(), openblas_get_corename(), sgemm_peak(1));
  if (vs)
    printf("old: linear_lanes with linear_lanes_set_form(%d, %d); new: the defaults (%d, 1)\n", vk,
           va, LINEAR_LANES_KC);
  printf("%-13s %3s %11s %11s %9s\n", "IN x OUT", "M", "old GFLOP/s", "new GFLOP/s", "new/old");
  for (int s = 0; s < 5; s++) {
    int IN = shapes[s][0], OUT = shapes[s][1];
    size_t nw = (size_t)IN * OUT;
    int nmat = (int)((256u << 20) / (nw * sizeof(float)));
    nmat = nmat < 1 ? 1 : nmat > 512 ? 512 : nmat;
    if (bf16) nmat = nmat * 2 > 512 ? 512 : nmat * 2; /* the same bytes */
    float **w = malloc(sizeof(float *) * (size_t)nmat);
    uint16_t **w16 = calloc((size_t)nmat, sizeof(uint16_t *));
    for (int i = 0; i < nmat; i++) {
      w[i] = rnd(r, nw, 0.03f);
      if (bf16 && (w16[i] = malloc(nw * sizeof(uint16_t)))) {
        f32_to_bf16(w16[i], w[i], nw);
        free(w[i]), w[i] = NULL;
      }
    }
    float *x = rnd(r, (size_t)64 * IN, 1), *y = rnd(r, (size_t)64 * OUT, 1);
    for (int mi = 0; mi < 5; mi++) {
      int M = Ms[mi], at = 0, calls = (int)(2e8 / (2.0 * M * nw)) + 1; /* ~0.2 GFLOP a sample */
      double t[2][64], q[64];
      for (int rep = -1; rep < reps; rep++)
        for (int h = 0; h < 2; h++) {
          int k = (rep & 1) ^ h; /* 0 old, 1 new */
          if (vs) linear_lanes_set_form(k ? -1 : vk, k ? -1 : va);
          double t0 = now_s();
          for (int c = 0; c < calls; c++, at = (at + 1) % nmat)
            if ((k || vs) && bf16)
              linear_lanes_bf16(y, x, w16[at], NULL, M, IN, OUT, 0, OUT, 0.0f);
            else if (k || vs)
              linear_lanes(y, x, w[at], NULL, M, IN, OUT, 0, OUT, 0.0f);
            else
              linear_lanes_block(y, x, w[at], w16[at], NULL, M, IN, OUT, 0, OUT, 0.0f);
          if (rep >= 0) t[k][rep] = (now_s() - t0) / calls;
        }
      for (int i = 0; i < reps; i++) q[i] = t[0][i] / t[1][i];
      double flop = 2.0 * M * nw, mq = median(q, reps);
      double g0 = flop / median(t[0], reps) * 1e-9, g1 = flop / median(t[1], reps) * 1e-9;
      printf("%5d x %-6d %3d %11.1f %11.1f %8.2fx\n", IN, OUT, M, g0, g1, mq);
      fflush(stdout);
    }
    for (int i = 0; i < nmat; i++) free(w[i]), free(w16[i]);
    free(w), free(w16), free(x), free(y);
  }
  printf("(medians of %d samples each, in turns; new/old > 1: linear_lanes faster)\n", reps);
}

/* --attention: decoding attention at Qwen2.5-0.5B's heads (14 query heads, 2 KV heads of 64), one
 * row against its cache, on this thread alone: attention_forward (each query head a pass over
 * the cache) against attention_decode (the sampler's: the heads of a group together where the
 * processor allows; the same bits), in turns, at contexts of 128, 512 and 2048 positions. The
 * caches cycle over about 256 MB, so that they come from memory as in decoding (every row of a
 * batch has its own). GFLOP/s of the attention's 4 NH HS n_ctx FLOPs a row, and GB/s of the
 * cache it reads (keys and values once). */
static void attention_bench(struct rng *r, int reps) {
  enum { NH = 14, NKV = 2, HS = 64, CQ = NH * HS, CKV = NKV * HS };
  static const int ctxs[3] = {128, 512, 2048};
  pool_set_current(NULL);
  printf("one thread; SGEMM 1024^3 %.0f GFLOP/s\n", sgemm_peak(1));
  printf("%6s %16s %16s %9s\n", "n_ctx", "old GFLOP/s GB/s", "new GFLOP/s GB/s", "new/old");
  float *q = rnd(r, CQ, 1), *o = calloc(CQ, sizeof(float));
  float *scr = malloc(sizeof(float) * ATTENTION_DECODE_HEADS * 2048);
  for (int ci = 0; ci < 3; ci++) {
    int n_ctx = ctxs[ci];
    size_t per = (size_t)n_ctx * CKV;
    int nrow = (int)((256u << 20) / (2 * per * sizeof(float)));
    float **kv = malloc(sizeof(float *) * (size_t)nrow);
    for (int i = 0; i < nrow; i++) { /* 64-byte aligned, as gen_state's cache */
      float *x = rnd(r, 2 * per, 1);
      kv[i] = aligned_alloc(64, 2 * per * sizeof(float));
      memcpy(kv[i], x, 2 * per * sizeof(float));
      free(x);
    }
    int at = 0, calls = (int)(2e8 / (4.0 * NH * HS * n_ctx)) + 1; /* ~0.2 GFLOP a sample */
    double t[2][64], qq[64];
    for (int rep = -1; rep < reps; rep++)
      for (int h = 0; h < 2; h++) {
        int k = (rep & 1) ^ h; /* 0 old, 1 new */
        double t0 = now_s();
        for (int c = 0; c < calls; c++, at = (at + 1) % nrow)
          for (int g = 0; g < NKV; g++)
            if (k)
              attention_decode(o, NULL, q, kv[at], kv[at] + per, n_ctx - 1, g * (NH / NKV),
                               NH / NKV, g, HS, CKV, scr);
            else
              attention_forward(o, NULL, q, kv[at], kv[at] + per, 1, n_ctx - 1, g * (NH / NKV),
                                NH / NKV, g, HS, CQ, CKV, CQ, NH, scr);
        if (rep >= 0) t[k][rep] = (now_s() - t0) / calls;
      }
    for (int i = 0; i < reps; i++) qq[i] = t[0][i] / t[1][i];
    double flop = 4.0 * NH * HS * n_ctx, bytes = 2.0 * per * sizeof(float);
    double m0 = median(t[0], reps), m1 = median(t[1], reps);
    printf("%6d %9.1f %6.1f %9.1f %6.1f %8.2fx\n", n_ctx, flop / m0 * 1e-9, bytes / m0 * 1e-9,
           flop / m1 * 1e-9, bytes / m1 * 1e-9, median(qq, reps));
    fflush(stdout);
    for (int i = 0; i < nrow; i++) free(kv[i]);
    free(kv);
  }
  printf("(medians of %d samples each, in turns; new/old > 1: attention_decode faster)\n", reps);
  free(q), free(o), free(scr);
}

int main(int argc, char **argv) {
  int threads = pool_cpu_count(), reps = 9;
  const char *lanes_vs = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--threads"))
      threads = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : threads;
    else if (!strcmp(argv[i], "--lanes-vs"))
      lanes_vs = argv[i + 1];
    else if (!strcmp(argv[i], "--reps"))
      reps = atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 64 ? atoi(argv[i + 1]) : reps;
    else if (!strcmp(argv[i], "--isa")) {
      const char *v = argv[i + 1];
      int isa = kernels_isa_by_name(v);
      if (!isa || kernels_force_isa(isa) != isa) {
        fprintf(stderr, "bench_kernels: --isa %s: unknown, or this CPU lacks it\n", v);
        return 2;
      }
    }
  }
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--lanes") || !strcmp(argv[i], "--lanes-bf16") ||
        !strcmp(argv[i], "--attention")) {
      struct rng r;
      rng_seed(&r, 3, 0);
      if (strcmp(argv[i], "--attention"))
        lanes_bench(&r, reps, !strcmp(argv[i], "--lanes-bf16"), lanes_vs);
      else
        attention_bench(&r, reps);
      return 0;
    }
  struct rng r;
  rng_seed(&r, 3, 0);
  printf("OpenBLAS %s (OPENBLAS_CORETYPE=%s), %d threads, decoding ISA %d (kernels.h)\n",
         openblas_get_corename(),
         getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset", threads,
         kernels_isa());
  double peak1 = sgemm_peak(1), peakn = sgemm_peak(threads);
  struct pool *p = pool_new(threads);
  if (!p) return 1;
  pool_set_current(p);
  double bw = read_bandwidth(p);
  probe_bf16_support();
  printf("peaks: SGEMM 1024^3 %.0f GFLOP/s (1 thread), %.0f (%d threads); read bandwidth %.1f GB/s "
         "(%d threads)\n",
         peak1, peakn, threads, bw, threads);
  static const char *kname[3] = {"forward  [512 x IN] . W^T", "dinp     [512 x OUT] . W",
                                 "decoding linear_few M=16"};
  int shapes[2][2] = {{HIDDEN, FF}, {FF, HIDDEN}}; /* up/gate_proj, down_proj */
  printf("%-27s %-11s %9s %9s %8s %16s\n", "kernel", "IN x OUT", "F32 ms", "BF16 ms", "F32/BF16",
         "BF16 vs peak");
  for (int s = 0; s < 2; s++) {
    struct work wk;
    work_init(&wk, &r, shapes[s][0], shapes[s][1]);
    for (int k = 0; k < 3; k++) {
      double t32[64], t16[64], ratio[64];
      for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up */
        double a, b;
        if (rep & 1) /* F32, BF16, BF16, F32, ... */
          b = run_once(p, &wk, k, 1), a = run_once(p, &wk, k, 0);
        else
          a = run_once(p, &wk, k, 0), b = run_once(p, &wk, k, 1);
        if (rep >= 0) t32[rep] = a, t16[rep] = b, ratio[rep] = a / b;
      }
      double m32 = median(t32, reps), m16 = median(t16, reps), q = median(ratio, reps);
      double flops = 2.0 * (k == 2 ? DEC_M : ROWS) * wk.IN * wk.OUT;
      char vs[64];
      if (k == 2) /* bytes of BF16 weights read against the bandwidth */
        snprintf(vs, sizeof vs, "%.1f GB/s %3.0f%%", 2.0 * wk.IN * wk.OUT / m16 * 1e-9,
                 100.0 * 2.0 * wk.IN * wk.OUT / m16 * 1e-9 / bw);
      else
        snprintf(vs, sizeof vs, "%.0f GFLOP/s %3.0f%%", flops / m16 * 1e-9,
                 100.0 * flops / m16 * 1e-9 / peakn);
      char shape[24];
      snprintf(shape, sizeof shape, "%d x %d", wk.IN, wk.OUT);
      printf("%-27s %-11s %9.3f %9.3f %7.2fx %16s\n", kname[k], shape, m32 * 1e3, m16 * 1e3, q, vs);
    }
    work_free(&wk);
  }
  printf("(F32/BF16 > 1: BF16 faster; medians of %d calls each, in turns; the machine may be "
         "shared: compare the ratios)\n",
         reps);
  pool_set_current(NULL);
  pool_free(p);
  return 0;
}
