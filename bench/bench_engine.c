/* Benchmark of our engine (bench/README.md): the SGEMM peak of the OpenBLAS we link, training
 * tokens/s (train_forward + train_backward + adamw_step on 4096 packed tokens) and generation
 * tokens/s (gen_run with a KV cache, batch 16 sharing one prompt, and batch 1) for one model
 * shape. Prints a human summary on stderr and JSON lines on stdout for bench/run.sh; it reports,
 * it never fails on a time. FLOP counts (model FLOPs, the same for any engine):
 *   P_blk   = L * (C*CQ + 2*C*CKV + CQ*C + 3*C*FF)             weights of the block matmuls
 *   forward = 2*N*P_blk + 2*R*V*C + L * 4*NH*HS * sum_s T_s(T_s+1)/2
 *   train   = 3 * forward                                        (backward = 2 x forward)
 *   generate= prefill of the shared prompt once + per decoded row at context t:
 *             2*P_blk + 2*V*C + L * 4*NH*HS * t
 * N tokens, R response tokens (rows through the LM head), T_s sequence lengths; embedding
 * lookups, norms, softmax and the optimizer are not counted.
 * --sgemm also prints the FMA peak (registers only) of the decoding kernels' instruction set
 * (--isa, else the best) and of AVX2.
 * Usage: bench_engine --sgemm [--isa NAME] | --bandwidth [--threads N] |
 *        --model tiny|small|medium|qwen-small|qwen-0.5b [--serve]
 *        [--train-steps N]
 *        [--gen-reps N] [--gen-new N] [--gen-batch N] [--pack on|off] [--threads N]
 *        [--phase train|gen]
 *        [--isa portable|baseline|avx2|avx512] [--vs-isa portable|baseline|avx2]
 * --serve answers commands on stdin (see serve()) so that bench_torch.py --pair can interleave
 * our measurements with PyTorch's; --phase runs one phase only, for perf. --isa forces the
 * instruction set of the hand-vectorised decoding kernels (kernels_force_isa) for the whole run;
 * --vs-isa measures each generation twice, on this CPU's best and on the one named, in turns
 * (best, named, named, best, ...), and prints the ratio of each pair's tokens/s. --gen-batch sets
 * the larger generation batch (default 16, at most 64: decoding batch 64 as bench/scale.sh's
 * rollouts, against the roofline). --pack off decodes without the packed panels of a small
 * model (gen_state_set_pack: the same tokens, the matrices transposed on the fly).
 *        --decode --model NAME [--gen-batch N] [--gen-new N] [--gen-reps N] [--lora R]
 *        [--splits rows,columns,auto,dynamic:KIB[/KMAX:AHEAD],...] [--busy] [--tune] [--threads N]
 * [--isa ..] times gen_run under each decoding split in turns (run_decode; --gen-batch default 64
 * there): "busy machine" with --busy (a CPU hog pinned to the last CPU throughout),
 * gen_state_tune's choice and its time with --tune. */
#include <cblas.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include "adamw.h"
#include "bench_util.h"
#include "kernels.h"
#include "lora.h"
#include "model.h"
#include "rng.h"
#include "pool.h"
#include "sampler.h"
#include "train.h"

static struct pool *g_pool;  /* the engine's compute pool (core/engine/pool.h), or NULL */
static int g_isa;            /* --isa: the forced instruction set, or 0 (the best) */
static int g_vs_isa;         /* --vs-isa: the instruction set measured against g_isa, or 0 */
static int g_gen_batch = 16; /* --gen-batch: the larger generation batch */
static int g_pack = 1;       /* --pack: decoding from packed panels (small models) */

#define N_SEQ 16
#define SEQ_LEN 256
#define PROMPT_LEN 64
#define GEN_PROMPT 32
#define GEN_BATCH 64 /* the most --gen-batch takes */

/* Peak resident set of this process in KiB: VmHWM (ru_maxrss would carry over the peak of a
 * parent that forked us, such as bench_torch.py's Python with torch loaded). */
static long peak_rss_kib(void) {
  long kib = -1;
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) {
      char *end = NULL;
      kib = strtol(line + 6, &end, 10);
      break;
    }
  if (f) fclose(f);
  if (kib < 0) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kib = ru.ru_maxrss;
  }
  return kib;
}

/* ---- FMA peak -------------------------------------------------------------------------------- */

/* The arithmetic ceiling of an instruction set: fused multiply-adds on registers only (no loads,
 * no stores), 12 independent chains per thread (a 4-cycle latency on up to three FMA pipes),
 * on the pool's threads, GFLOP/s best of 5. No product reaches it (OpenBLAS's SGEMM comes within
 * 5-15% where its kernel has the same width). It is printed beside the SGEMM peak because the
 * two can differ in width: with OPENBLAS_CORETYPE=Haswell on an AVX-512 processor the SGEMM peak
 * is an AVX2 one while our decoding kernels run AVX-512, and a roofline at that SGEMM peak is
 * then not the machine's. */
#define FMA_CHAINS 12
#define FMA_ITERS 20000000L
struct fma_args {
  int isa;
  long iters;
  float sink[64];
};

#if defined(__x86_64__)
#include <immintrin.h>
/* fma_chains512 / fma_chains256: FMA_CHAINS chains of iters fused multiply-adds in registers, their
 * lanes summed so that nothing is optimised away */
#define FMA_CHAINS_FN(name, TGT, V, W, LANES)                                                      \
  __attribute__((target(TGT))) static float name(long iters) {                                     \
    V acc[FMA_CHAINS], m = _mm##W##_set1_ps(0.999999f), a = _mm##W##_set1_ps(1e-7f);               \
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm##W##_set1_ps((float)c);                      \
    for (long i = 0; i < iters; i++)                                                               \
      _Pragma("GCC unroll 16") for (int c = 0; c < FMA_CHAINS; c++) acc[c] =                       \
          _mm##W##_fmadd_ps(acc[c], m, a);                                                         \
    float s = 0, l[LANES];                                                                         \
    for (int c = 0; c < FMA_CHAINS; c++) {                                                         \
      _mm##W##_storeu_ps(l, acc[c]);                                                               \
      for (int q = 0; q < LANES; q++) s += l[q];                                                   \
    }                                                                                              \
    return s;                                                                                      \
  }
FMA_CHAINS_FN(fma_chains512, "avx512f", __m512, 512, 16)
FMA_CHAINS_FN(fma_chains256, "avx2,fma", __m256, 256, 8)
#undef FMA_CHAINS_FN
#endif

/* Lanes of a vector of the instruction set (0: not measured here). */
static int fma_lanes(int isa) {
#if defined(__x86_64__)
  return isa == KERNELS_ISA_AVX512 ? 16 : isa == KERNELS_ISA_AVX2 ? 8 : 0;
#else
  (void)isa;
  return 0;
#endif
}

static void fma_task(void *ctx, int i, int n) {
  struct fma_args *a = ctx;
  (void)n;
  float s = 0;
#if defined(__x86_64__)
  s = a->isa == KERNELS_ISA_AVX512 ? fma_chains512(a->iters) : fma_chains256(a->iters);
#endif
  a->sink[i % 64] += s;
}

static double fma_peak(struct pool *p, int isa) {
  struct fma_args a = {.isa = isa, .iters = FMA_ITERS / 10};
  double best = 0;
  pool_run(p, fma_task, &a); /* warm the clocks */
  a.iters = FMA_ITERS;
  for (int r = 0; r < 5; r++) {
    double t0 = now_s();
    pool_run(p, fma_task, &a);
    double g = 2.0 * FMA_CHAINS * fma_lanes(isa) * (double)a.iters * pool_threads(p) /
               (now_s() - t0) * 1e-9;
    best = g > best ? g : best;
  }
  return best;
}

/* fma_peak_1/_n for the decoding kernels' instruction set (fma_isa) into j, and AVX2's when that
 * is wider (fma_avx2_1/_n: what OpenBLAS's Haswell kernel can reach); printed on stderr. */
static void measure_fma(json_t *j, int nt) {
  int best = kernels_isa();
  if (!fma_lanes(best)) return;
  int counts[2] = {1, nt};
  for (int w = 0; w < (best == KERNELS_ISA_AVX512 ? 2 : 1); w++) {
    int isa = w ? KERNELS_ISA_AVX2 : best;
    for (int c = 0; c < (nt > 1 ? 2 : 1); c++) {
      struct pool *p = pool_new(counts[c]);
      if (!p) return;
      double g = fma_peak(p, isa);
      pool_free(p);
      fprintf(stderr, "FMA peak %s, %d thread(s): %.1f GFLOP/s\n", kernels_isa_name(isa), counts[c],
              g);
      char k[32];
      snprintf(k, sizeof k, "fma_%s_%s", w ? "avx2" : "peak", c ? "n" : "1");
      json_object_set_new(j, k, json_real(g));
      if (nt == 1) {
        snprintf(k, sizeof k, "fma_%s_n", w ? "avx2" : "peak");
        json_object_set_new(j, k, json_real(g));
      }
    }
  }
  json_object_set_new(j, "fma_isa", json_string(kernels_isa_name(best)));
}

/* ---- SGEMM peak ----------------------------------------------------------------------------- */

/* GFLOP/s of C[M,N] = A[M,K] . B^T (B stored [N,K], as our linear layers), best of reps. */
static double sgemm_gflops(int M, int N, int K, int reps) {
  float *a = dapo_alloc_floats((size_t)M * K), *b = dapo_alloc_floats((size_t)N * K),
        *c = dapo_alloc_floats((size_t)M * N);
  double best = 0;
  if (!a || !b || !c) goto out;
  for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
  for (size_t i = 0; i < (size_t)N * K; i++) b[i] = (float)(i % 5) * 0.1f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
    double g = 2.0 * M * N * K / (now_s() - t0) * 1e-9;
    if (g > best) best = g;
  }
out:
  free(a);
  free(b);
  free(c);
  return best;
}

static int run_sgemm(void) {
  int nt = openblas_get_num_threads();
  static const int shapes[][3] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 1376, 512}};
  static const char *names[] = {"1024^3", "2048^3", "4096x1376x512 (medium up_proj)"};
  int threads[2] = {1, nt};
  double peak[2] = {0, 0};
  json_t *j = json_object(), *rows = json_array();
  fprintf(stderr, "OpenBLAS core %s, %d threads configured (%s)\n", openblas_get_corename(), nt,
          openblas_get_config());
  for (int ti = 0; ti < (nt > 1 ? 2 : 1); ti++) {
    openblas_set_num_threads(threads[ti]);
    for (int s = 0; s < 3; s++) {
      double g = sgemm_gflops(shapes[s][0], shapes[s][1], shapes[s][2], 4);
      if (g > peak[ti]) peak[ti] = g;
      fprintf(stderr, "sgemm %-32s %d thread(s): %7.1f GFLOP/s\n", names[s], threads[ti], g);
      json_array_append_new(rows, json_pack("{s:s, s:i, s:f}", "shape", names[s], "threads",
                                            threads[ti], "gflops", g));
    }
  }
  /* the decoding shape: M = 16 rows (a group) against a [1376, 512] weight */
  openblas_set_num_threads(nt);
  double g16 = sgemm_gflops(16, 1376, 512, 50);
  fprintf(stderr, "sgemm M=16 x 1376x512 (decode, %d threads): %.1f GFLOP/s\n", nt, g16);
  json_object_set_new(j, "side", json_string("ours"));
  json_object_set_new(j, "kind", json_string("sgemm"));
  json_object_set_new(j, "corename", json_string(openblas_get_corename()));
  json_object_set_new(j, "threads", json_integer(nt));
  json_object_set_new(j, "peak_1", json_real(peak[0]));
  json_object_set_new(j, "peak_n", json_real(nt > 1 ? peak[1] : peak[0]));
  json_object_set_new(j, "sgemm_m16", json_real(g16));
  measure_fma(j, nt);
  json_object_set_new(j, "rows", rows);
  json_dumpf(j, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(j);
  return 0;
}

/* ---- memory bandwidth ------------------------------------------------------------------------ */

/* Streaming over 512 MiB (far past any cache) on the pool's threads, each its own contiguous
 * share: "read" sums every float (16 independent lanes, as a decoding step reads weight rows),
 * "copy" writes a second buffer from the first (bytes read + bytes written). GB/s, best of 5. */
struct bw_args {
  const float *src;
  float *dst;
  size_t n;
  double sum[64];
};

static void bw_read_task(void *ctx, int i, int n) {
  struct bw_args *a = ctx;
  int lo, hi;
  pool_split((int)(a->n / 4096), i, n, &lo, &hi);
  typedef float v8 __attribute__((vector_size(32)));
  v8 s[4] = {{0}}; /* four independent 8-float accumulators: the loads, not the adds, bound it */
  for (size_t k = (size_t)lo * 4096; k < (size_t)hi * 4096; k += 32)
    for (int l = 0; l < 4; l++) {
      v8 x;
      memcpy(&x, a->src + k + 8 * l, sizeof x);
      s[l] += x;
    }
  double t = 0;
  for (int l = 0; l < 4; l++)
    for (int q = 0; q < 8; q++) t += s[l][q];
  a->sum[i % 64] += t;
}

static void bw_copy_task(void *ctx, int i, int n) {
  struct bw_args *a = ctx;
  int lo, hi;
  pool_split((int)(a->n / 4096), i, n, &lo, &hi);
  memcpy(a->dst + (size_t)lo * 4096, a->src + (size_t)lo * 4096,
         (size_t)(hi - lo) * 4096 * sizeof(float));
}

static double bandwidth(struct pool *p, int copy) {
  struct bw_args a = {.n = (size_t)128 << 20};
  float *src = dapo_alloc_floats(a.n), *dst = copy ? dapo_alloc_floats(a.n) : NULL;
  double best = 0;
  if (!src || (copy && !dst)) goto out;
  for (size_t i = 0; i < a.n; i++) src[i] = (float)(i & 7);
  if (dst) memset(dst, 0, a.n * sizeof(float));
  a.src = src, a.dst = dst;
  for (int r = 0; r < 5; r++) {
    double t0 = now_s();
    pool_run(p, copy ? bw_copy_task : bw_read_task, &a);
    double g = (double)a.n * sizeof(float) * (copy ? 2 : 1) / (now_s() - t0) * 1e-9;
    best = g > best ? g : best;
  }
out:
  free(src);
  free(dst);
  return best;
}

static int run_bandwidth(int threads) {
  json_t *j = json_object();
  json_object_set_new(j, "side", json_string("ours"));
  json_object_set_new(j, "kind", json_string("bandwidth"));
  json_object_set_new(j, "threads", json_integer(threads));
  int counts[2] = {1, threads};
  for (int c = 0; c < (threads > 1 ? 2 : 1); c++) {
    struct pool *p = pool_new(counts[c]);
    if (!p) return 1;
    double rd = bandwidth(p, 0), cp = bandwidth(p, 1);
    pool_free(p);
    fprintf(stderr, "memory bandwidth, %d thread(s): read %.1f GB/s, copy %.1f GB/s\n", counts[c],
            rd, cp);
    char k[32];
    snprintf(k, sizeof k, "read_gbs_%s", c ? "n" : "1");
    json_object_set_new(j, k, json_real(rd));
    snprintf(k, sizeof k, "copy_gbs_%s", c ? "n" : "1");
    json_object_set_new(j, k, json_real(cp));
    if (threads == 1) {
      json_object_set_new(j, "read_gbs_n", json_real(rd));
      json_object_set_new(j, "copy_gbs_n", json_real(cp));
    }
  }
  json_dumpf(j, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(j);
  return 0;
}

/* ---- models --------------------------------------------------------------------------------- */

static int model_shape(const char *name, struct model_config *c) {
  struct model_config base = {.arch = ARCH_LLAMA,
                              .max_position_embeddings = 512,
                              .rms_norm_eps = 1e-5f,
                              .rope_theta = 10000.0f,
                              .tie_word_embeddings = 0,
                              .bos_token_id = 1,
                              .eos_token_id = 2,
                              .initializer_range = 0.02f};
  *c = base;
  if (!strcmp(name, "tiny")) {
    c->vocab_size = 32, c->hidden_size = 64, c->intermediate_size = 176, c->num_layers = 2;
    c->num_heads = c->num_kv_heads = 4;
  } else if (!strcmp(name, "small")) {
    c->vocab_size = 512, c->hidden_size = 288, c->intermediate_size = 768, c->num_layers = 6;
    c->num_heads = c->num_kv_heads = 6;
  } else if (!strcmp(name, "medium")) {
    c->vocab_size = 4096, c->hidden_size = 512, c->intermediate_size = 1376, c->num_layers = 8;
    c->num_heads = c->num_kv_heads = 8;
  } else if (!strcmp(name, "qwen-small")) {
    /* issue 26's small model with Qwen3's tokenizer: 2.36M parameters in the blocks, the
     * 19.4M-parameter tied embedding as the LM head (151,669 ids used of 151,936 rows) */
    c->arch = ARCH_QWEN3, c->qk_norm = 1, c->tie_word_embeddings = 1;
    c->vocab_size = 151936, c->vocab_used = 151669, c->hidden_size = 128;
    c->intermediate_size = 1408, c->num_layers = 4, c->num_heads = 4, c->num_kv_heads = 2;
  } else if (!strcmp(name, "qwen-0.5b")) {
    /* Qwen2.5-0.5B's shape (q/k/v biases, tied, GQA 14/2) */
    c->arch = ARCH_QWEN2, c->qkv_bias = 1, c->tie_word_embeddings = 1;
    c->vocab_size = 151936, c->vocab_used = 151665, c->hidden_size = 896;
    c->intermediate_size = 4864, c->num_layers = 24, c->num_heads = 14, c->num_kv_heads = 2;
  } else {
    return -1;
  }
  c->head_dim = c->hidden_size / c->num_heads;
  return 0;
}

static double block_mm_params(const struct model_config *c) {
  double C = c->hidden_size, CQ = (double)c->num_heads * c->head_dim,
         CKV = (double)c->num_kv_heads * c->head_dim, FF = c->intermediate_size;
  return c->num_layers * (C * CQ + 2 * C * CKV + CQ * C + 3 * C * FF);
}

/* Model FLOPs of a forward over new rows at positions past .. past + t_new - 1 of one sequence,
 * with `heads` rows through the LM head. */
static double fwd_flops(const struct model_config *c, int t_new, int past, int heads) {
  double pairs = 0;
  for (int i = 0; i < t_new; i++) pairs += past + i + 1;
  return 2.0 * t_new * block_mm_params(c) + 2.0 * heads * model_vocab_used(c) * c->hidden_size +
         (double)c->num_layers * 4.0 * c->num_heads * c->head_dim * pairs;
}

/* Everything one model's measurements need, allocated once. */
struct bench {
  const char *name;
  struct model *m;
  struct train_state *ts;
  struct adamw opt;
  struct adamw_cfg oc;
  int64_t step;                                /* training steps taken */
  int off[N_SEQ + 1], plen[N_SEQ], *tokens, R; /* the training batch */
  float *w, *logp, *ent;                       /* [N] loss weights, outputs */
  double train_flops;                          /* model FLOPs of one training step */
  struct gen_state *gs;                        /* generation */
  int gen_new, prompt[GEN_PROMPT], *gtok, glen[GEN_BATCH], gfin[GEN_BATCH];
  float *glogp;
  struct rng r;
};

static void bench_free(struct bench *b) {
  adamw_deinit(&b->opt);
  train_state_free(b->ts);
  gen_state_free(b->gs);
  model_free(b->m);
  free(b->tokens);
  free(b->w);
  free(b->logp);
  free(b->ent);
  free(b->gtok);
  free(b->glogp);
}

static int bench_init(struct bench *b, const char *name, int train, int gen, int gen_new,
                      struct dapo_err *e) {
  struct model_config cfg;
  int N = N_SEQ * SEQ_LEN, rc = 0;
  memset(b, 0, sizeof *b);
  b->name = name;
  b->gen_new = gen_new;
  rng_seed(&b->r, 5, 0);
  if (model_shape(name, &cfg))
    return dapo_errf(e, DAPO_EINVAL,
                     "unknown model '%s' (tiny, small, medium, qwen-small, qwen-0.5b)", name);
  if (!(b->m = model_new(&cfg, e)) || (train && (rc = model_alloc_grads(b->m, e))))
    return rc ? rc : e->code;
  model_init_random(b->m, 1);
  for (int i = 0; i <= N_SEQ; i++) b->off[i] = i * SEQ_LEN;
  for (int i = 0; i < N_SEQ; i++) b->plen[i] = PROMPT_LEN;
  b->R = N_SEQ * (SEQ_LEN - PROMPT_LEN);
  b->train_flops = 3.0 * N_SEQ * fwd_flops(&cfg, SEQ_LEN, 0, 0) +
                   3.0 * 2.0 * b->R * model_vocab_used(&cfg) * cfg.hidden_size;
  b->tokens = malloc(sizeof(int) * (size_t)N);
  b->w = malloc(sizeof(float) * (size_t)N);
  b->logp = malloc(sizeof(float) * (size_t)N);
  b->ent = malloc(sizeof(float) * (size_t)N);
  b->gtok = malloc(sizeof(int) * (size_t)GEN_BATCH * gen_new);
  b->glogp = malloc(sizeof(float) * (size_t)GEN_BATCH * gen_new);
  if (!b->tokens || !b->w || !b->logp || !b->ent || !b->gtok || !b->glogp)
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  /* token ids below the tokenizer's count: the engine rejects the padding rows' */
  uint64_t V = (uint64_t)model_vocab_used(&cfg);
  for (int i = 0; i < N; i++) b->tokens[i] = (int)rng_below(&b->r, V);
  for (int i = 0; i < b->R; i++) b->w[i] = (float)rng_normal(&b->r) / (float)b->R;
  for (int i = 0; i < GEN_PROMPT; i++) b->prompt[i] = (int)rng_below(&b->r, V);
  b->oc = adamw_cfg_default();
  if (train) {
    if (!(b->ts = train_state_new(b->m, N, b->R, SEQ_LEN, e))) return e->code;
    if (g_pool && train_state_set_pool(b->ts, g_pool, e)) return e->code;
    if ((rc = adamw_init(&b->opt, b->m, &b->oc, e))) return rc;
  }
  if (gen && !(b->gs = gen_state_new(b->m, g_gen_batch, GEN_PROMPT + gen_new, e))) return e->code;
  if (gen && g_pool && gen_state_set_pool(b->gs, g_pool, e)) return e->code;
  if (gen) gen_state_set_pack(b->gs, g_pack);
  return 0;
}

/* One training step (forward, zeroed gradients, backward, AdamW); t[0..3] = step, forward,
 * backward, optimizer seconds. */
static int bench_train_step(struct bench *b, double t[4], struct dapo_err *e) {
  struct fwd_batch fb = {
      .n_seq = N_SEQ, .tokens = b->tokens, .seq_off = b->off, .prompt_len = b->plen};
  int rc;
  double t0 = now_s();
  if ((rc = train_forward(b->ts, b->m, &fb, 1.0f, b->logp, b->ent, e))) return rc;
  double t1 = now_s();
  model_zero_grads(b->m);
  if ((rc = train_backward(b->ts, b->m, b->w, e))) return rc;
  double t2 = now_s();
  if ((rc = adamw_step(&b->opt, b->m, adamw_lr_at(&b->oc, b->step++), NULL, e))) return rc;
  double t3 = now_s();
  t[0] = t3 - t0, t[1] = t1 - t0, t[2] = t2 - t1, t[3] = t3 - t2;
  return 0;
}

/* One gen_run of n sequences sharing the prompt (temperature 1, no stop tokens); *secs. */
static int bench_gen(struct bench *b, int n, uint64_t seed, double *secs, struct dapo_err *e) {
  const int *prompts[GEN_BATCH];
  int plens[GEN_BATCH];
  struct rng rngs[GEN_BATCH];
  for (int i = 0; i < n; i++) {
    prompts[i] = b->prompt;
    plens[i] = GEN_PROMPT;
    rng_seed(&rngs[i], seed, (uint64_t)i);
  }
  struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = b->gen_new};
  struct gen_out go = {.tokens = b->gtok, .logp = b->glogp, .len = b->glen, .finish = b->gfin};
  double t0 = now_s();
  int rc = gen_run(b->gs, b->m, n, prompts, plens, rngs, &so, &go, NULL, e);
  *secs = now_s() - t0;
  return rc;
}

/* The two per-step passes over the vocabulary that a decoding step of n rows makes after the
 * blocks, timed apart on the pool as decode_step runs them (sampler.c): the LM head, each thread
 * its share of the output columns in panels of LINEAR_FEW_COLS; then sampling (temperature 1, no
 * top-p), each thread its share of the rows. The rows fed to the head are random unit-RMS vectors
 * (the final norm's output); the logits it gives are the ones sampled. */
struct split_args {
  const struct model *m;
  const float *x;
  const float *pk;   /* NULL, or the head packed as decoding packs it (--pack on, small model) */
  float *logits, *p; /* [n, V]; per thread [V] */
  int *idx;          /* per thread [V] */
  int n, V, head;    /* head: the LM head, else sampling */
  struct rng *rngs;
};

static void split_task(void *ctx, int ti, int nt) {
  struct split_args *a = ctx;
  int C = a->m->cfg.hidden_size, lo, hi;
  struct pool *saved = pool_current();
  pool_set_current(NULL);
  if (a->head) {
    int cols = LINEAR_FEW_COLS;
    pool_split((a->V + cols - 1) / cols, ti, nt, &lo, &hi);
    lo *= cols, hi = hi * cols < a->V ? hi * cols : a->V;
    if (a->pk)
      linear_lanes_packed(a->logits, a->x, a->pk, NULL, a->n, C, a->V, lo, hi, 0.0f);
    else if (a->m->w.lm_head16)
      linear_lanes_bf16(a->logits, a->x, a->m->w.lm_head16, NULL, a->n, C, a->V, lo, hi, 0.0f);
    else
      linear_lanes(a->logits, a->x, a->m->w.lm_head, NULL, a->n, C, a->V, lo, hi, 0.0f);
  } else {
    struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 1};
    pool_split(a->n, ti, nt, &lo, &hi);
    for (int i = lo; i < hi; i++) {
      float lp;
      sampler_pick(a->logits + (size_t)i * a->V, a->V, &so, &a->rngs[i], &lp,
                   a->idx + (size_t)ti * a->V, a->p + (size_t)ti * a->V);
    }
  }
  pool_set_current(saved);
}

/* Seconds per decoding step of n rows in the LM head (*head) and in sampling (*pick), medians of
 * reps. 0 or DAPO_ENOMEM. */
static int gen_split(struct bench *b, int n, int reps, double *head, double *pick,
                     struct dapo_err *e) {
  int C = b->m->cfg.hidden_size, V = model_vocab_used(&b->m->cfg);
  int nt = g_pool ? pool_threads(g_pool) : 1;
  struct split_args a = {.m = b->m, .n = n, .V = V};
  float *x = malloc(sizeof(float) * (size_t)n * C);
  a.logits = malloc(sizeof(float) * (size_t)n * V);
  a.p = malloc(sizeof(float) * (size_t)nt * V);
  a.idx = malloc(sizeof(int) * (size_t)nt * V);
  a.rngs = malloc(sizeof(struct rng) * (size_t)n);
  float *pk = NULL; /* decoding's packed copy of the head (gen_state_set_pack) */
  if (g_pack && gen_pack_bytes(&b->m->cfg))
    pk = malloc(sizeof(float) * linear_lanes_panel_floats(C, V));
  double th[64], tp[64];
  int rc = 0;
  if (!x || !a.logits || !a.p || !a.idx || !a.rngs ||
      (g_pack && gen_pack_bytes(&b->m->cfg) && !pk)) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  if (pk) linear_lanes_pack(pk, b->m->w.lm_head, b->m->w.lm_head16, C, V);
  a.pk = pk;
  for (size_t i = 0; i < (size_t)n * C; i++) x[i] = (float)rng_normal(&b->r);
  for (int i = 0; i < n; i++) rng_seed(&a.rngs[i], 7, (uint64_t)i);
  a.x = x;
  if (reps > 64) reps = 64;
  for (int r = -1; r < reps; r++) { /* r -1 warms up */
    for (a.head = 1; a.head >= 0; a.head--) {
      double t0 = now_s();
      if (g_pool)
        pool_run(g_pool, split_task, &a);
      else
        split_task(&a, 0, 1);
      if (r >= 0) (a.head ? th : tp)[r] = now_s() - t0;
    }
  }
  *head = median(th, reps);
  *pick = median(tp, reps);
out:
  free(x);
  free(pk);
  free(a.logits);
  free(a.p);
  free(a.idx);
  free(a.rngs);
  return rc;
}

/* Model FLOPs of generating gen_new tokens for n sequences sharing the prompt. */
static double gen_flops(const struct bench *b, int n) {
  double f = fwd_flops(&b->m->cfg, GEN_PROMPT, 0, 1);
  for (int i = 1; i < b->gen_new; i++) f += n * fwd_flops(&b->m->cfg, 1, GEN_PROMPT + i - 1, 1);
  return f;
}

/* gen_state_tune at the larger batch, as a job tunes before its first step: the split chosen
 * (desc) and the seconds it took. */
static int bench_tune(struct bench *b, char *desc, size_t n, double *secs, struct dapo_err *e) {
  double t0 = now_s();
  int rc = gen_state_tune(b->gs, b->m, g_gen_batch, e);
  if (!rc) gen_state_describe_split(b->gs, desc, n);
  *secs = now_s() - t0;
  return rc;
}

static json_t *info_json(const struct bench *b) {
  json_t *j = json_object();
  json_object_set_new(j, "side", json_string("ours"));
  json_object_set_new(j, "kind", json_string("model"));
  json_object_set_new(j, "model", json_string(b->name));
  json_object_set_new(j, "corename", json_string(openblas_get_corename()));
  json_object_set_new(j, "threads",
                      json_integer(g_pool ? pool_threads(g_pool) : openblas_get_num_threads()));
  json_object_set_new(j, "engine_threads",
                      json_string(g_pool ? "compute pool (OpenBLAS 1 thread inside)"
                                         : "OpenBLAS threads, engine code serial"));
  json_object_set_new(j, "params", json_integer((json_int_t)b->m->n_params));
  json_object_set_new(j, "train_flops", json_real(b->train_flops));
  char key[32];
  snprintf(key, sizeof key, "gen_flops_b%d", g_gen_batch);
  json_object_set_new(j, key, json_real(gen_flops(b, g_gen_batch)));
  json_object_set_new(j, "gen_flops_b1", json_real(gen_flops(b, 1)));
  json_object_set_new(j, "gen_new", json_integer(b->gen_new));
  json_object_set_new(j, "tokens_per_step", json_integer(N_SEQ * SEQ_LEN));
  json_object_set_new(j, "peak_rss_kib", json_integer(peak_rss_kib()));
  return j;
}

static void emit(json_t *j) {
  json_dumpf(j, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  fflush(stdout);
  json_decref(j);
}

/* One-shot mode: medians of train_steps steps and gen_reps generations after a warm-up each.
 * phase: 0 both, 1 training only, 2 generation only (for profiling one phase with perf). */
static int run_model(const char *name, int train_steps, int gen_reps, int gen_new, int phase) {
  struct bench b;
  struct dapo_err e = {0};
  int rc = bench_init(&b, name, phase != 2, phase != 1, gen_new, &e);
  double st[4][64], t[4];
  json_t *j = NULL, *gen = NULL;
  if (rc) goto out;
  j = info_json(&b);
  if (train_steps > 64) train_steps = 64;
  if (gen_reps > 64) gen_reps = 64;
  if (phase != 2) {
    for (int s = -1; s < train_steps; s++) { /* step -1 warms up */
      if ((rc = bench_train_step(&b, t, &e))) goto out;
      for (int k = 0; s >= 0 && k < 4; k++) st[k][s] = t[k];
    }
    double step = median(st[0], train_steps), N = N_SEQ * SEQ_LEN;
    double tf = median(st[1], train_steps), tb = median(st[2], train_steps),
           to = median(st[3], train_steps);
    fprintf(stderr,
            "%s: %zu params (%.0f in block matmuls); train %d x %d tokens (prompt %d): %.0f "
            "tok/s, %.1f GFLOP/s, step %.3f s = forward %.3f + backward %.3f + adamw %.3f "
            "(medians of %d)\n",
            name, b.m->n_params, block_mm_params(&b.m->cfg), N_SEQ, SEQ_LEN, PROMPT_LEN, N / step,
            b.train_flops / step * 1e-9, step, tf, tb, to, train_steps);
    json_object_set_new(j, "train",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:i}", "tok_s", N / step, "step_s",
                                  step, "forward_s", tf, "backward_s", tb, "adamw_s", to, "steps",
                                  train_steps));
    json_object_set_new(j, "peak_rss_kib_train", json_integer(peak_rss_kib()));
  }
  if (phase != 1) {
    gen = json_object();
    { /* the split a job would decode with: chosen by measuring, as the runner does */
      char desc[256];
      double secs;
      if ((rc = bench_tune(&b, desc, sizeof desc, &secs, &e))) goto out;
      fprintf(stderr, "%s: decoding split (gen_state_tune, %.1f s): %s\n", name, secs, desc);
      json_object_set_new(j, "gen_split", json_string(desc));
    }
    int batches[2] = {g_gen_batch, 1};
    for (int bi = 0; bi < 2; bi++) {
      int n = batches[bi];
      double sv[64], ratio[64]; /* --vs-isa: the named ISA's seconds, and tok/s ratios */
      for (int rep = -1; rep < gen_reps; rep++) { /* rep -1 warms up */
        for (int side = 0; side < (g_vs_isa ? 2 : 1); side++) {
          int vs = (side ^ (rep & 1)) && g_vs_isa; /* best, named, named, best, ... */
          kernels_force_isa(vs ? g_vs_isa : g_isa);
          double *dst = rep < 0 ? t : vs ? &sv[rep] : &st[0][rep];
          rc = bench_gen(&b, n, 100 + (uint64_t)(rep + 1), dst, &e);
          kernels_force_isa(g_isa);
          if (rc) goto out;
        }
        if (g_vs_isa && rep >= 0) ratio[rep] = st[0][rep] / sv[rep];
      }
      double secs = median(st[0], gen_reps), fl = gen_flops(&b, n);
      double tok_s = (double)n * gen_new / secs;
      fprintf(stderr,
              "%s: generate batch %2d, prompt %d, %d new tokens: %.0f tok/s, %.1f GFLOP/s (%s)\n",
              name, n, GEN_PROMPT, gen_new, tok_s, fl / secs * 1e-9,
              kernels_isa_name(kernels_isa()));
      json_t *g = json_pack("{s:i, s:f, s:f, s:s}", "batch", n, "tok_s", tok_s, "seconds", secs,
                            "isa", kernels_isa_name(kernels_isa()));
      /* where a decoding step's time goes: the LM head and sampling measured apart, the rest
       * (the blocks, embedding, norms) is what remains of the step */
      double head = 0, pick = 0, step = secs / gen_new;
      if ((rc = gen_split(&b, n, gen_reps < 5 ? 5 : gen_reps, &head, &pick, &e))) goto out;
      fprintf(stderr,
              "%s: batch %2d, per step %.3f ms: LM head %.3f ms (%.1f GFLOP/s, %.0f%%), sampling "
              "%.3f ms (%.0f%%), the rest %.3f ms (%.0f%%)\n",
              name, n, step * 1e3, head * 1e3,
              2.0 * n * model_vocab_used(&b.m->cfg) * b.m->cfg.hidden_size / head * 1e-9,
              100 * head / step, pick * 1e3, 100 * pick / step, (step - head - pick) * 1e3,
              100 * (step - head - pick) / step);
      json_object_set_new(
          g, "split",
          json_pack("{s:f, s:f, s:f}", "step_s", step, "head_s", head, "sample_s", pick));
      if (g_vs_isa) {
        double vsecs = median(sv, gen_reps), r = median(ratio, gen_reps);
        fprintf(stderr,
                "%s: generate batch %2d on %s: %.0f tok/s, %.1f GFLOP/s; %s/%s %.3fx "
                "(median of %d paired runs)\n",
                name, n, kernels_isa_name(g_vs_isa), n * gen_new / vsecs, fl / vsecs * 1e-9,
                kernels_isa_name(g_vs_isa), kernels_isa_name(kernels_isa()), r, gen_reps);
        json_object_set_new(g, "vs",
                            json_pack("{s:s, s:f, s:f, s:f}", "isa", kernels_isa_name(g_vs_isa),
                                      "tok_s", n * gen_new / vsecs, "seconds", vsecs, "ratio", r));
      }
      char key[16];
      snprintf(key, sizeof key, "b%d", n);
      json_object_set_new(gen, key, g);
    }
    json_object_set_new(j, "gen", gen);
    gen = NULL;
  }
  json_object_set_new(j, "peak_rss_kib", json_integer(peak_rss_kib()));
  emit(j);
  j = NULL;
out:
  if (rc) fprintf(stderr, "bench_engine: %s: %s\n", name, e.msg);
  json_decref(gen);
  json_decref(j);
  bench_free(&b);
  return rc ? 1 : 0;
}

/* ---- decoding splits (--decode) ------------------------------------------------------------- */

/* --busy: the documented neighbour of the "busy machine" mode (bench/README.md): one process
 * spinning on an integer loop, pinned to the last online CPU, at the default priority; killed
 * with its parent. Its pid, or -1. */
static pid_t start_hog(void) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(pool_cpu_count() - 1, &set);
  sched_setaffinity(0, sizeof set, &set);
  for (volatile unsigned long x = 0;; x++) {
  }
}

static void stop_hog(pid_t pid) {
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
}

static double load_average(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f && fscanf(f, "%lf", &l) != 1) l = -1;
  if (f) fclose(f);
  return l;
}

struct split_opt {
  enum gen_split split;
  int chunk;
  int kmax, ahead; /* linear_lanes_set_form's, -1: the defaults */
  char name[32];
};

/* "rows,columns,dynamic:64,...": the splits, each optionally with "/KMAX:AHEAD" for
 * linear_lanes_set_form (columns/0:0: whole rows, widened before each tile); their count, or -1
 * on junk. */
static int parse_splits(const char *s, struct split_opt *o, int max) {
  int n = 0;
  while (*s && n < max) {
    size_t len = strcspn(s, ",");
    char w[32];
    snprintf(w, sizeof w, "%.*s", (int)(len < 31 ? len : 31), s);
    struct split_opt *p = &o[n++];
    p->chunk = 0, p->kmax = p->ahead = -1;
    char *form = strchr(w, '/');
    if (form && sscanf(form + 1, "%d:%d", &p->kmax, &p->ahead) != 2) return -1;
    if (form) *form = 0;
    if (!strcmp(w, "rows"))
      p->split = GEN_SPLIT_ROWS;
    else if (!strcmp(w, "columns"))
      p->split = GEN_SPLIT_COLUMNS;
    else if (!strcmp(w, "auto"))
      p->split = GEN_SPLIT_AUTO;
    else if (!strncmp(w, "dynamic:", 8) && atoi(w + 8) > 0)
      p->split = GEN_SPLIT_DYNAMIC, p->chunk = atoi(w + 8);
    else
      return -1;
    if (form) *form = '/';
    snprintf(p->name, sizeof p->name, "%s", w);
    s += len + (s[len] == ',');
  }
  return n;
}

static const char *const prof_names[GEN_PROF_KINDS] = {
    "qkv", "attention", "o", "gate-up", "down", "lm-head", "sampling", "norms", "barriers"};

/* Decoding steps of a batch of `batch` sequences sharing a 32-token prompt, gen_new tokens each
 * (temperature 1), for each split in turns (split 1, 2, ..., n, then again, reps times; one
 * warm-up round first), with --lora R the base frozen in BF16 and an adapter of rank R on every
 * linear layer. Prints per split the median tok/s, its spread, GFLOP/s, the ratio to the first
 * split (median of the rounds' ratios), and where the time of a step went (gen_profile, summed
 * over the pool's threads); with busy, a CPU hog (start_hog) runs throughout. */
static int run_decode(const char *name, int batch, int gen_new, int reps, int lora_r, int busy,
                      int tune, const struct split_opt *sp, int n_sp) {
  struct bench b;
  struct dapo_err e = {0};
  int rc = bench_init(&b, name, 0, 0, gen_new, &e);
  struct gen_state *gs = NULL;
  struct lora *la = NULL;
  int *tok = malloc(sizeof(int) * (size_t)batch * gen_new), *len = malloc(sizeof(int) * batch),
      *fin = malloc(sizeof(int) * batch);
  float *lp = malloc(sizeof(float) * (size_t)batch * gen_new);
  const int **prompts = malloc(sizeof *prompts * batch);
  int *plens = malloc(sizeof(int) * batch);
  struct rng *rngs = malloc(sizeof *rngs * batch);
  static double secs[16][64];
  static struct gen_profile prof[16];
  pid_t hog = -1;
  if (rc) goto out;
  if (!tok || !len || !fin || !lp || !prompts || !plens || !rngs) {
    rc = dapo_errf(&e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  if (lora_r) {
    struct lora_config lc = {.r = lora_r, .alpha = 2 * lora_r, .targets = (1u << LT_COUNT) - 1};
    /* a BF16 checkpoint's values: every matrix rounded to BF16 (truncated), then held so */
    for (int i = 0; i < b.m->n_tensors; i++) {
      const struct param_info *p = &b.m->tensors[i];
      uint32_t *x = (uint32_t *)(b.m->params + p->offset);
      for (size_t k = 0; p->ndim == 2 && k < p->numel; k++) x[k] &= 0xffff0000u;
    }
    if ((rc = model_freeze_bf16(b.m, &e))) goto out;
    if (!(la = lora_new(&lc, &b.m->cfg, &e))) {
      rc = e.code;
      goto out;
    }
    for (size_t k = 0; k < la->n_params; k++) la->params[k] = 0.01f * (float)rng_normal(&b.r);
    b.m->lora = la;
  }
  if (!(gs = gen_state_new(b.m, batch, GEN_PROMPT + gen_new, &e)) ||
      (g_pool && gen_state_set_pool(gs, g_pool, &e))) {
    rc = e.code;
    goto out;
  }
  gen_state_set_pack(gs, g_pack);
  for (int i = 0; i < batch; i++) prompts[i] = b.prompt, plens[i] = GEN_PROMPT;
  if (reps > 64) reps = 64;
  if (n_sp > 16) n_sp = 16;
  double load0 = load_average();
  if (busy) hog = start_hog();
  memset(prof, 0, sizeof prof);
  if (tune) {
    char desc[256];
    double t0 = now_s();
    if ((rc = gen_state_tune(gs, b.m, batch, &e))) goto out;
    fprintf(stderr, "gen_state_tune: %.1f s: %s\n", now_s() - t0,
            gen_state_describe_split(gs, desc, sizeof desc));
  }
  for (int r = -1; r < reps; r++)
    for (int k = 0; k < n_sp; k++) {
      gen_state_set_split(gs, sp[k].split);
      gen_state_set_chunk(gs, sp[k].chunk);
      linear_lanes_set_form(sp[k].kmax, sp[k].ahead);
      gen_state_set_profile(gs, r >= 0 ? &prof[k] : NULL);
      for (int i = 0; i < batch; i++) rng_seed(&rngs[i], 100 + (uint64_t)r, (uint64_t)i);
      struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = gen_new};
      struct gen_out go = {.tokens = tok, .logp = lp, .len = len, .finish = fin};
      double t0 = now_s();
      if ((rc = gen_run(gs, b.m, batch, prompts, plens, rngs, &so, &go, NULL, &e))) goto out;
      if (r >= 0) secs[k][r] = now_s() - t0;
    }
  gen_state_set_profile(gs, NULL);
  stop_hog(hog);
  hog = -1;
  /* the FLOPs done: the shared prompt once (it gives every sequence's first token), then
   * gen_new - 1 steps of the batch (counting every token as a step overstated a 16-token run's
   * rate by 4%) */
  double fl = gen_flops(&b, batch);
  fprintf(stderr,
          "%s%s: decode batch %d, %d new tokens after a %d-token prompt, %d threads, %s, %s; "
          "load average %.2f before\n",
          name, lora_r ? " LoRA (BF16 base)" : "", batch, gen_new, GEN_PROMPT,
          g_pool ? pool_threads(g_pool) : 1, kernels_isa_name(kernels_isa()),
          busy ? "BUSY (a CPU hog pinned to the last CPU)" : "quiet", load0);
  json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:b, s:s, s:f, s:[]}", "kind", "decode", "model",
                        name, "batch", batch, "gen_new", gen_new, "lora_r", lora_r, "busy", busy,
                        "isa", kernels_isa_name(kernels_isa()), "load_before", load0, "splits");
  for (int k = 0; k < n_sp; k++) {
    double ratio[64], s[64];
    for (int r = 0; r < reps; r++) ratio[r] = secs[0][r] / secs[k][r], s[r] = secs[k][r];
    double med = median(s, reps), rr = median(ratio, reps), tot = 0;
    double tok_s = (double)batch * gen_new / med;
    double kind[GEN_PROF_KINDS] = {0};
    long chunks[GEN_PROF_THREADS];
    int nt = g_pool ? pool_threads(g_pool) : 1;
    for (int t = 0; t < nt && t < GEN_PROF_THREADS; t++) {
      chunks[t] = prof[k].chunks[t];
      for (int q = 0; q < GEN_PROF_KINDS; q++)
        kind[q] += prof[k].sec[t][q], tot += prof[k].sec[t][q];
    }
    fprintf(stderr,
            "  %-12s %7.1f tok/s (%.1f-%.1f), %6.1f GFLOP/s, %.3fx the first (median of %d "
            "rounds)\n   thread-time:",
            sp[k].name, tok_s, batch * gen_new / s[reps - 1], batch * gen_new / s[0],
            fl / med * 1e-9, rr, reps);
    json_t *pk = json_object();
    for (int q = 0; q < GEN_PROF_KINDS; q++) {
      fprintf(stderr, " %s %.0f%%", prof_names[q], tot > 0 ? 100 * kind[q] / tot : 0.0);
      json_object_set_new(pk, prof_names[q], json_real(kind[q] / reps));
    }
    fprintf(stderr, "; waiting per thread:");
    for (int t = 0; t < nt && t < GEN_PROF_THREADS; t++) {
      double tt = 0;
      for (int q = 0; q < GEN_PROF_KINDS; q++) tt += prof[k].sec[t][q];
      fprintf(stderr, " %.1f%%", tt > 0 ? 100 * prof[k].sec[t][GEN_PROF_WAIT] / tt : 0.0);
    }
    fprintf(stderr, "; barrier waits per thread (of which asleep):");
    for (int t = 0; t < nt && t < GEN_PROF_THREADS; t++)
      fprintf(stderr, " %ld (%ld)", prof[k].waits[t] / reps, prof[k].slept[t] / reps);
    fprintf(stderr, "; column ranges taken per thread:");
    for (int t = 0; t < nt && t < GEN_PROF_THREADS; t++) fprintf(stderr, " %ld", chunks[t] / reps);
    fputc('\n', stderr);
    json_array_append_new(json_object_get(j, "splits"),
                          json_pack("{s:s, s:f, s:f, s:f, s:f, s:o}", "split", sp[k].name, "tok_s",
                                    tok_s, "gflops", fl / med * 1e-9, "ratio", rr, "seconds", med,
                                    "thread_seconds", pk));
  }
  json_object_set_new(j, "load_after", json_real(load_average()));
  emit(j);
out:
  stop_hog(hog);
  if (rc) fprintf(stderr, "bench_engine: %s: %s\n", name, e.msg);
  gen_state_free(gs);
  b.m->lora = NULL;
  lora_free(la);
  bench_free(&b);
  free(tok), free(len), free(fin), free(lp), free(prompts), free(plens), free(rngs);
  return rc ? 1 : 0;
}

/* Serve mode, for measurements interleaved with PyTorch's (bench_torch.py --pair): after setup,
 * prints the info object, then answers each command line on stdin with one JSON line:
 *   train       {"step_s", "forward_s", "backward_s", "adamw_s"}   one training step (not with
 *                                                                  --phase gen: no training state)
 *   gen16 SEED  {"seconds"}                          one generation, batch 16 (or --gen-batch)
 *   gen1 SEED   {"seconds"}                                         batch 1
 *   tune        {"seconds", "split"}   gen_state_tune at the larger batch, as a job does before
 *                                      its first step (on the machine as it is then: quiet, or
 *                                      beside the hog), and the split it chose
 *   info        the info object (peak RSS so far)
 *   quit
 * An error answers {"error": message} and ends the process. */
static int serve(const char *name, int gen_new, int train) {
  struct bench b;
  struct dapo_err e = {0};
  int rc = bench_init(&b, name, train, 1, gen_new, &e);
  char line[256];
  if (!rc) emit(info_json(&b));
  while (!rc && fgets(line, sizeof line, stdin)) {
    double t[4];
    unsigned long long seed = 0;
    line[strcspn(line, "\r\n")] = '\0';
    if (!strcmp(line, "quit")) break;
    if (!strcmp(line, "info")) {
      emit(info_json(&b));
    } else if (!strcmp(line, "train") && !b.ts) {
      rc = dapo_errf(&e, DAPO_EINVAL, "train: no training state (--phase gen)");
    } else if (!strcmp(line, "train")) {
      if (!(rc = bench_train_step(&b, t, &e)))
        emit(json_pack("{s:f, s:f, s:f, s:f}", "step_s", t[0], "forward_s", t[1], "backward_s",
                       t[2], "adamw_s", t[3]));
    } else if (!strcmp(line, "tune")) {
      char desc[256];
      if (!(rc = bench_tune(&b, desc, sizeof desc, &t[0], &e)))
        emit(json_pack("{s:f, s:s}", "seconds", t[0], "split", desc));
    } else if (sscanf(line, "gen16 %llu", &seed) == 1 || sscanf(line, "gen1 %llu", &seed) == 1) {
      int n = !strncmp(line, "gen16", 5) ? g_gen_batch : 1;
      if (!(rc = bench_gen(&b, n, seed, &t[0], &e))) emit(json_pack("{s:f}", "seconds", t[0]));
    } else {
      rc = dapo_errf(&e, DAPO_EINVAL, "unknown command '%.100s'", line);
    }
  }
  if (rc) {
    emit(json_pack("{s:s}", "error", e.msg));
    fprintf(stderr, "bench_engine: %s: %s\n", name, e.msg);
  }
  bench_free(&b);
  return rc ? 1 : 0;
}

/* Positive integer flag value; exits with usage on junk. */
static int parse_pos(const char *flag, const char *s) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > 100000) {
    fprintf(stderr, "bench_engine: %s: '%s' is not a positive integer\n", flag, s);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  const char *model = NULL;
  int pool_n = pool_cpu_count();
  int sgemm = 0, bw = 0, serve_mode = 0, train_steps = 3, gen_reps = 3, gen_new = 128, phase = 0;
  int decode = 0, busy = 0, tune = 0, gen_batch = 64, lora_r = 0, n_sp = 0;
  struct split_opt sp[16];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--decode") || !strcmp(a, "--busy") || !strcmp(a, "--tune")) {
      *(!strcmp(a, "--decode") ? &decode : !strcmp(a, "--busy") ? &busy : &tune) = 1;
      continue;
    }
    if (!strcmp(a, "--sgemm") || !strcmp(a, "--serve") || !strcmp(a, "--bandwidth")) {
      *(!strcmp(a, "--sgemm") ? &sgemm : !strcmp(a, "--serve") ? &serve_mode : &bw) = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr,
              "usage: bench_engine --sgemm | --bandwidth [--threads N] | --model "
              "tiny|small|medium|qwen-small|qwen-0.5b [--serve] "
              "[--train-steps N] [--gen-reps N] [--gen-new N] [--gen-batch N] [--pack on|off] "
              "[--threads N | "
              "--blas-threads N] [--phase train|gen] [--isa NAME] [--vs-isa NAME]\n");
      return 2;
    }
    i++;
    if (!strcmp(a, "--model"))
      model = v;
    else if (!strcmp(a, "--train-steps"))
      train_steps = parse_pos(a, v);
    else if (!strcmp(a, "--gen-reps"))
      gen_reps = parse_pos(a, v);
    else if (!strcmp(a, "--gen-new"))
      gen_new = parse_pos(a, v);
    else if (!strcmp(a, "--gen-batch") && atoi(v) >= 1 && atoi(v) <= GEN_BATCH)
      g_gen_batch = gen_batch = atoi(v);
    else if (!strcmp(a, "--lora"))
      lora_r = parse_pos(a, v);
    else if (!strcmp(a, "--splits") && (n_sp = parse_splits(v, sp, 16)) < 1) {
      fprintf(
          stderr,
          "bench_engine: --splits %s: rows, columns, auto or dynamic:N[/KMAX:AHEAD], by commas\n",
          v);
      return 2;
    } else if (!strcmp(a, "--splits"))
      continue;
    else if (!strcmp(a, "--pack") && (!strcmp(v, "on") || !strcmp(v, "off")))
      g_pack = !strcmp(v, "on");
    else if (!strcmp(a, "--phase") && (!strcmp(v, "train") || !strcmp(v, "gen")))
      phase = !strcmp(v, "train") ? 1 : 2;
    else if (!strcmp(a, "--threads"))
      pool_n = parse_pos(a, v);
    else if (!strcmp(a, "--isa") || !strcmp(a, "--vs-isa")) {
      int isa = kernels_isa_by_name(v);
      if (!isa || kernels_force_isa(isa) != isa) {
        fprintf(stderr, "bench_engine: %s %s: unknown, or this CPU lacks it\n", a, v);
        return 2;
      }
      *(!strcmp(a, "--isa") ? &g_isa : &g_vs_isa) = isa;
      kernels_force_isa(g_isa);
    } else if (!strcmp(a, "--blas-threads")) {
      pool_n = 0; /* the engine's kernels serial, OpenBLAS's own threads inside */
      openblas_set_num_threads(parse_pos(a, v));
    } else {
      fprintf(stderr, "bench_engine: unknown flag %s\n", a);
      return 2;
    }
  }
  if (sgemm) return run_sgemm();
  if (bw) return run_bandwidth(pool_n > 0 ? pool_n : 1);
  if (pool_n > 0) g_pool = pool_new(pool_n); /* OpenBLAS single-threaded inside the pool */
  if (!model) {
    fprintf(stderr, "bench_engine: --sgemm or --model NAME\n");
    return 2;
  }
  if (decode) {
    if (!n_sp) n_sp = parse_splits("columns,dynamic:16,dynamic:64,dynamic:256,rows", sp, 16);
    return run_decode(model, gen_batch, gen_new, gen_reps, lora_r, busy, tune, sp, n_sp);
  }
  return serve_mode ? serve(model, gen_new, phase != 2)
                    : run_model(model, train_steps, gen_reps, gen_new, phase);
}
