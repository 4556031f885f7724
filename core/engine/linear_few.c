/* Linear layer for a few rows (decoding), weights read in place: out[m, j] for the columns
 * [j0, j1) of one thread's share (kernels.h, linear_few).
 *
 * Why not cblas_sgemm: with M = 16 rows OpenBLAS copies ("packs") the whole weight matrix on
 * every call and then streams the copy, so a decoding step read every weight twice; the weights
 * of all but the tiniest models do not fit in the caches, so decoding is bound by memory traffic.
 * Here each group of 4 weight rows (contiguous in the row-major [OUT, IN] matrix) is loaded once
 * and multiplied with the rows of `inp` 4 at a time from L1, and the next group is prefetched
 * while the first rows are computed.
 *
 * Every out[m, j] is computed the same way whatever M, the column range, the thread split or the
 * instruction set: 16 partial sums, lane l holding the products of k = l (mod 16) accumulated in
 * increasing k with fused multiply-adds, then added in a fixed tree (l + 8, then + 4, + 2, + 1).
 * So a sequence decodes to the same bits alone or in a batch, with 1 or n threads, and the
 * AVX-512, AVX2 and portable versions agree exactly (tests/engine/test_kernels.c checks them all).
 * The portable version is GCC/Clang vector extensions (simd.h), which the compiler maps onto NEON,
 * SSE2 or whatever the target has. */
#include "kernels.h"

#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LF_X86 1
#endif

/* out = (beta ? out : 0) + dot + bias, one element */
static inline void lf_store(float *o, float dot, const float *bias, int j, float beta) {
  float r = bias ? dot + bias[j] : dot;
  *o = beta != 0.0f ? *o + r : r;
}

/* ---- portable version: vector extensions, the definition of the result ------------------- */

/* One tile of 2 rows x 2 columns (the AVX2 tile's shape: 4 accumulators of 16 lanes fit the 32
 * vector registers of NEON or SVE-128 with the loads). acc[2 * r + c] receives output (r, c). */
SIMD_INLINE void lf_tile_gen(float acc[4], const float *const xr[2], const float *const wr[2],
                             int IN, const int hw) {
  struct simd16 a00 = simd_zero(), a01 = a00, a10 = a00, a11 = a00;
  int k = 0;
  for (; k + 16 <= IN; k += 16) {
    struct simd16 b0 = simd_load(wr[0] + k), b1 = simd_load(wr[1] + k);
    struct simd16 x0 = simd_load(xr[0] + k), x1 = simd_load(xr[1] + k);
    a00 = simd_fma(x0, b0, a00, hw), a01 = simd_fma(x0, b1, a01, hw);
    a10 = simd_fma(x1, b0, a10, hw), a11 = simd_fma(x1, b1, a11, hw);
  }
  if (k < IN) { /* the tail: zero products in lanes [IN - k, 16) */
    int n = IN - k;
    struct simd16 b0 = simd_load_n(wr[0] + k, n), b1 = simd_load_n(wr[1] + k, n);
    struct simd16 x0 = simd_load_n(xr[0] + k, n), x1 = simd_load_n(xr[1] + k, n);
    a00 = simd_fma(x0, b0, a00, hw), a01 = simd_fma(x0, b1, a01, hw);
    a10 = simd_fma(x1, b0, a10, hw), a11 = simd_fma(x1, b1, a11, hw);
  }
  acc[0] = simd_tree(a00), acc[1] = simd_tree(a01), acc[2] = simd_tree(a10);
  acc[3] = simd_tree(a11);
}

SIMD_INLINE void lf_gen(float *out, const float *inp, const float *w, const float *bias, int M,
                        int IN, int OUT, int j0, int j1, float beta, const int hw) {
  for (int j = j0; j < j1; j += 2) {
    int nc = j1 - j < 2 ? j1 - j : 2;
    const float *wr[2] = {w + (size_t)j * IN, w + (size_t)(j + nc - 1) * IN};
    for (int m = 0; m < M; m += 2) {
      int nr = M - m < 2 ? M - m : 2;
      const float *xr[2] = {inp + (size_t)m * IN, inp + (size_t)(m + nr - 1) * IN};
      float acc[4];
      lf_tile_gen(acc, xr, wr, IN, hw);
      for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++)
          lf_store(out + (size_t)(m + r) * OUT + j + c, acc[2 * r + c], bias, j + c, beta);
    }
  }
}

/* Compiled for the baseline target: with its FMA instruction where it has one (AArch64...),
 * exactly emulated otherwise (x86-64: simd.h). */
static void lf_portable(float *out, const float *inp, const float *w, const float *bias, int M,
                        int IN, int OUT, int j0, int j1, float beta) {
  lf_gen(out, inp, w, bias, M, IN, OUT, j0, j1, beta, SIMD_HW_FMA);
}

#ifdef LF_X86
/* The same source for x86 CPUs with FMA3 (the portable path forced on a modern CPU, standing in
 * for an ARM server's build, which has FMA in its baseline). */
__attribute__((target("fma"))) static void lf_portable_fma(float *out, const float *inp,
                                                           const float *w, const float *bias, int M,
                                                           int IN, int OUT, int j0, int j1,
                                                           float beta) {
  lf_gen(out, inp, w, bias, M, IN, OUT, j0, j1, beta, 1);
}
#endif

#ifdef LF_X86
/* ---- AVX-512: tiles of 4 rows x 4 columns, one zmm of 16 lanes per output ------------------- */

#define LF_AVX512 __attribute__((target("avx512f")))

/* Reduction steps of 512-bit sums: [s8 of a | s8 of b] (the 256-bit halves of each added), and
 * from two of those the four s4s (the 128-bit quarters' pairs added). */
#define LF_PAIR8(a, b)                                                                             \
  _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE))
#define LF_PAIR4(a, b)                                                                             \
  _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD))

/* The 16 sums of a 4x4 tile reduced together, each by simd_tree's additions in simd_tree's order:
 * (1) pairs of sums give [s8 of one | s8 of the other], (2) pairs of those give four s4s, (3) s2s,
 * (4) s1s; acc[4 * c + r] ends up with output (r, c). */
LF_AVX512 static inline __attribute__((always_inline)) void
lf_reduce512(float acc[16], __m512 a00, __m512 a01, __m512 a02, __m512 a03, __m512 a10, __m512 a11,
             __m512 a12, __m512 a13, __m512 a20, __m512 a21, __m512 a22, __m512 a23, __m512 a30,
             __m512 a31, __m512 a32, __m512 a33) {
  __m512 t0 = LF_PAIR4(LF_PAIR8(a00, a01), LF_PAIR8(a02, a03));
  __m512 t1 = LF_PAIR4(LF_PAIR8(a10, a11), LF_PAIR8(a12, a13));
  __m512 t2 = LF_PAIR4(LF_PAIR8(a20, a21), LF_PAIR8(a22, a23));
  __m512 t3 = LF_PAIR4(LF_PAIR8(a30, a31), LF_PAIR8(a32, a33));
  __m512 z0 = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
  __m512 z1 = _mm512_add_ps(_mm512_shuffle_ps(t2, t3, 0x44), _mm512_shuffle_ps(t2, t3, 0xEE));
  _mm512_storeu_ps(acc,
                   _mm512_add_ps(_mm512_shuffle_ps(z0, z1, 0x88), _mm512_shuffle_ps(z0, z1, 0xDD)));
}

/* The 8 sums of columns 4 and 5 of a 4x6 tile (a<r>4, a<r>5 for rows r = 0..3) reduced as
 * lf_reduce512 reduces each (simd_tree's order) with half its shuffles: (1) s8 pairs, (2) s4
 * quadruples [a04 | a05 | a14 | a15] and [a24 | a25 | a34 | a35], (3) s2s, (4) s1s, so that lane
 * 4L holds the first quadruple's L-th and lane 4L + 1 the second's. acc[r] receives (r, 4),
 * acc[4 + r] (r, 5). */
LF_AVX512 static inline __attribute__((always_inline)) void
lf_reduce512x8(float acc[8], __m512 a04, __m512 a05, __m512 a14, __m512 a15, __m512 a24, __m512 a25,
               __m512 a34, __m512 a35) {
  __m512 v0 = LF_PAIR4(LF_PAIR8(a04, a05), LF_PAIR8(a14, a15));
  __m512 v1 = LF_PAIR4(LF_PAIR8(a24, a25), LF_PAIR8(a34, a35));
  __m512 z = _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x44), _mm512_shuffle_ps(v0, v1, 0xEE));
  float f[16];
  _mm512_storeu_ps(f, _mm512_add_ps(_mm512_shuffle_ps(z, z, 0x88), _mm512_shuffle_ps(z, z, 0xDD)));
  acc[0] = f[0], acc[4] = f[4], acc[1] = f[8], acc[5] = f[12];
  acc[2] = f[1], acc[6] = f[5], acc[3] = f[9], acc[7] = f[13];
}
#undef LF_PAIR8
#undef LF_PAIR4

/* x's 16 values xv times the weight vectors b0..b3 into the sums a<r>0..a<r>3 */
#define LF_FMA4(xv, r)                                                                             \
  do {                                                                                             \
    a##r##0 = _mm512_fmadd_ps(xv, b0, a##r##0);                                                    \
    a##r##1 = _mm512_fmadd_ps(xv, b1, a##r##1);                                                    \
    a##r##2 = _mm512_fmadd_ps(xv, b2, a##r##2);                                                    \
    a##r##3 = _mm512_fmadd_ps(xv, b3, a##r##3);                                                    \
  } while (0)
/* One row of a 4x4 tile: row x's 16 values (LF_LOAD) */
#define LF_ROW(x, r)                                                                               \
  do {                                                                                             \
    __m512 xv = LF_LOAD(x);                                                                        \
    LF_FMA4(xv, r);                                                                                \
  } while (0)

/* One 4x4 tile: rows xr[0..3] of inp, weight rows wr[0..3] (repeated pointers pad a partial
 * tile); pf: the next tile's weights to prefetch (4 rows of IN floats from pf), or NULL.
 * acc[4 * c + r] receives output (r, c). */
LF_AVX512 static void lf_tile512(float acc[16], const float *const xr[4], const float *const wr[4],
                                 int IN, const float *pf) {
  /* written out so that the 16 sums stay in registers (a loop over an array spills at -O2) */
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
         a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00,
         a32 = a00, a33 = a00;
  const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3], *w0 = wr[0], *w1 = wr[1],
              *w2 = wr[2], *w3 = wr[3];
  __mmask16 mk = 0xffff;
#define LF_LOAD(p) _mm512_maskz_loadu_ps(mk, (p) + k)
  for (int k = 0; k < IN; k += 16) {
    if (IN - k < 16) mk = (__mmask16)((1u << (IN - k)) - 1); /* the tail: zero products */
    if (pf) {
      _mm_prefetch((const char *)(pf + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + IN + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + 2 * (size_t)IN + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + 3 * (size_t)IN + k), _MM_HINT_T0);
    }
    __m512 b0 = LF_LOAD(w0), b1 = LF_LOAD(w1), b2 = LF_LOAD(w2), b3 = LF_LOAD(w3);
    LF_ROW(x0, 0);
    LF_ROW(x1, 1);
    LF_ROW(x2, 2);
    LF_ROW(x3, 3);
  }
#undef LF_LOAD
  lf_reduce512(acc, a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33);
}

#undef LF_ROW

/* A 4x6 tile (4 rows of inp, 6 weight rows), for many rows: each x vector, read from L2 (the rows
 * do not all fit L1), feeds 6 products instead of 4x4's 4 (measured 1.13x faster at M = 64, one
 * thread, Qwen2.5-0.5B's MLP shapes). 24 sums + 6 weight vectors + 1 input vector: 31 of the 32
 * zmm registers. Weights in float32 (wr), or (bf16, a constant) BF16 rows w16r converted in
 * registers and, when st is not NULL, stored there (6 rows of IN floats) for the other row tiles;
 * BF16 needs IN a multiple of 16. pf: the next block's 6 weight rows to prefetch (floats or
 * BF16s), or NULL. acc[4 * c + r] receives output (r, c). The same arithmetic per output as
 * lf_tile512. */
LF_AVX512 static inline __attribute__((always_inline)) void
lf_tile6_gen(float acc[24], const float *const xr[4], const float *const wr[6],
             const uint16_t *const w16r[6], int IN, float *st, const void *pf, const int bf16) {
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a04 = a00, a05 = a00,
         a10 = a00, a11 = a00, a12 = a00, a13 = a00, a14 = a00, a15 = a00, a20 = a00, a21 = a00,
         a22 = a00, a23 = a00, a24 = a00, a25 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00,
         a34 = a00, a35 = a00;
  const float *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3];
  __mmask16 mk = 0xffff;
  size_t pf_row = (size_t)IN * (bf16 ? sizeof(uint16_t) : sizeof(float)); /* bytes */
#define LF_LOAD(p) _mm512_maskz_loadu_ps(mk, (p) + k)
#define LF_W(c)                                                                                    \
  (bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(                                                   \
              _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w16r[c] + k))), 16))      \
        : LF_LOAD(wr[c]))
#define LF_ROW6(x, r)                                                                              \
  do {                                                                                             \
    __m512 xv = LF_LOAD(x);                                                                        \
    LF_FMA4(xv, r);                                                                                \
    a##r##4 = _mm512_fmadd_ps(xv, b4, a##r##4);                                                    \
    a##r##5 = _mm512_fmadd_ps(xv, b5, a##r##5);                                                    \
  } while (0)
  for (int k = 0; k < IN; k += 16) {
    if (IN - k < 16) mk = (__mmask16)((1u << (IN - k)) - 1); /* the tail: zero products */
    /* a cache line each: 16 floats, or every other step 32 BF16s */
    if (pf && (!bf16 || !(k & 31)))
      for (int c = 0; c < 6; c++)
        _mm_prefetch((const char *)pf + c * pf_row + k * (bf16 ? 2 : 4), _MM_HINT_T0);
    __m512 b0 = LF_W(0), b1 = LF_W(1), b2 = LF_W(2), b3 = LF_W(3), b4 = LF_W(4), b5 = LF_W(5);
    if (bf16 && st) {
      _mm512_storeu_ps(st + k, b0);
      _mm512_storeu_ps(st + IN + k, b1);
      _mm512_storeu_ps(st + 2 * (size_t)IN + k, b2);
      _mm512_storeu_ps(st + 3 * (size_t)IN + k, b3);
      _mm512_storeu_ps(st + 4 * (size_t)IN + k, b4);
      _mm512_storeu_ps(st + 5 * (size_t)IN + k, b5);
    }
    LF_ROW6(x0, 0);
    LF_ROW6(x1, 1);
    LF_ROW6(x2, 2);
    LF_ROW6(x3, 3);
  }
#undef LF_ROW6
#undef LF_FMA4
#undef LF_W
#undef LF_LOAD
  lf_reduce512(acc, a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33);
  lf_reduce512x8(acc + 16, a04, a05, a14, a15, a24, a25, a34, a35);
}

LF_AVX512 static void lf_tile512x6(float acc[24], const float *const xr[4],
                                   const float *const wr[6], int IN, const float *pf) {
  lf_tile6_gen(acc, xr, wr, NULL, IN, NULL, pf, 0);
}

LF_AVX512 static void lf_tile512x6_bf16(float acc[24], const float *const xr[4],
                                        const uint16_t *const w16r[6], int IN, float *st,
                                        const uint16_t *pf) {
  lf_tile6_gen(acc, xr, NULL, w16r, IN, st, pf, 1);
}

/* A 1x16 tile (one row of inp, 16 weight rows), for a single row (a decoding step of one
 * sequence): the 4x4 tile repeats a lone row 4 times, 3 of its 4 multiply-adds wasted. Here every
 * one is used: 16 sums, 16 weight vectors and the input vector per k step, over a block of 16
 * consecutive weight rows (contiguous), float32 (wr) or BF16 (bf16, a constant; IN a multiple of
 * 16) converted in registers; pf: the next block, a line of each of its rows prefetched per k
 * step, or NULL. The same arithmetic per output as lf_tile512 (lf_reduce512 reduces each sum by
 * simd_tree's tree); acc[4 * (c % 4) + c / 4] receives column c. Measured on one thread, a small
 * model's LM head ([1, 128] x [151669, 128]^T): from memory both tiles are bound by reading the
 * weights (about 27 GB/s), this one a little less often slowed (2.7-3.0 against 2.8-7 ms on the
 * loaded machine); from L2 (1024 columns) 1.7x faster. For 2 or 3 rows the 4x4 tile stays: a
 * block read again per row from L1 was slower (17 loads per 16 multiply-adds). */
LF_AVX512 static inline __attribute__((always_inline)) void
lf_tile16_gen(float acc[16], const float *x, const float *wr, const uint16_t *w16r, int IN, int nc,
              const float *pf, const int bf16) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  /* rows past nc repeat the last one (their sums are not stored) */
  size_t st[16];
  for (int c = 0; c < 16; c++) st[c] = (size_t)(c < nc ? c : nc - 1) * IN;
  __mmask16 mk = 0xffff;
#define LF_W(c)                                                                                    \
  (bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(                                                   \
              _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w16r + st[c] + k))), 16)) \
        : _mm512_maskz_loadu_ps(mk, wr + st[c] + k))
#define LF_F(c) a##c = _mm512_fmadd_ps(xv, LF_W(c), a##c)
  for (int k = 0; k < IN; k += 16) {
    if (IN - k < 16) mk = (__mmask16)((1u << (IN - k)) - 1); /* the tail: zero products */
    if (pf) /* the next block: 16 rows of IN floats, a line of each per k step */
      for (int c = 0; c < 16; c++)
        _mm_prefetch((const char *)(pf + (size_t)c * IN + k), _MM_HINT_T0);
    __m512 xv = _mm512_maskz_loadu_ps(mk, x + k);
    LF_F(0), LF_F(1), LF_F(2), LF_F(3), LF_F(4), LF_F(5), LF_F(6), LF_F(7);
    LF_F(8), LF_F(9), LF_F(10), LF_F(11), LF_F(12), LF_F(13), LF_F(14), LF_F(15);
  }
#undef LF_F
#undef LF_W
  lf_reduce512(acc, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
}

/* Rows [0, M) x columns [j0, j1) with 1x16 tiles (M = 1), float32 or BF16 weights. */
LF_AVX512 static inline __attribute__((always_inline)) void
lf_rows16_gen(float *out, const float *inp, const float *w, const uint16_t *w16, const float *bias,
              int M, int IN, int OUT, int j0, int j1, float beta, const int bf16) {
  for (int j = j0; j < j1; j += 16) {
    int nc = j1 - j < 16 ? j1 - j : 16;
    for (int m = 0; m < M; m++) {
      float acc[16];
      const float *pf = !bf16 && m == 0 && j + 32 <= j1 ? w + (size_t)(j + 16) * IN : NULL;
      lf_tile16_gen(acc, inp + (size_t)m * IN, bf16 ? NULL : w + (size_t)j * IN,
                    bf16 ? w16 + (size_t)j * IN : NULL, IN, nc, pf, bf16);
      for (int c = 0; c < nc; c++)
        lf_store(out + (size_t)m * OUT + j + c, acc[4 * (c % 4) + c / 4], bias, j + c, beta);
    }
  }
}

LF_AVX512 static void lf_rows16(float *out, const float *inp, const float *w, const float *bias,
                                int M, int IN, int OUT, int j0, int j1, float beta) {
  lf_rows16_gen(out, inp, w, NULL, bias, M, IN, OUT, j0, j1, beta, 0);
}

LF_AVX512 static void lf_rows16_bf16(float *out, const float *inp, const uint16_t *w,
                                     const float *bias, int M, int IN, int OUT, int j0, int j1,
                                     float beta) {
  lf_rows16_gen(out, inp, NULL, w, bias, M, IN, OUT, j0, j1, beta, 1);
}

/* Output tile rows [m, m + 4) x columns [j, j + nc) of lf_avx512 and lf_avx512_bf16: acc holds
 * (r, c) at [4 * c + r]. */
static inline void lf_store_tile(float *out, const float *acc, const float *bias, int m, int nr,
                                 int j, int nc, int OUT, float beta) {
  if (!bias && beta == 0.0f) { /* plain stores (an LM head, the MLP's gate and up) */
    for (int r = 0; r < nr; r++)
      for (int c = 0; c < nc; c++) out[(size_t)(m + r) * OUT + j + c] = acc[4 * c + r];
    return;
  }
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++)
      lf_store(out + (size_t)(m + r) * OUT + j + c, acc[4 * c + r], bias, j + c, beta);
}

/* Input rows xr[0..3] of tile row m (repeated pointers pad a partial tile). */
static inline void lf_rows(const float *xr[4], const float *inp, int m, int M, int IN) {
  int nr = M - m < 4 ? M - m : 4;
  for (int r = 0; r < 4; r++) xr[r] = inp + (size_t)(m + (r < nr ? r : nr - 1)) * IN;
}

/* Blocks of 6 weight rows (4x6 tiles) for M > 4, of 4 (one 4x4 tile each) for M <= 4. */
LF_AVX512 static void lf_avx512(float *out, const float *inp, const float *w, const float *bias,
                                int M, int IN, int OUT, int j0, int j1, float beta) {
  if (M == 1) {
    lf_rows16(out, inp, w, bias, M, IN, OUT, j0, j1, beta);
    return;
  }
  int nb = M > 4 ? 6 : 4;
  for (int j = j0; j < j1; j += nb) {
    int nc = j1 - j < nb ? j1 - j : nb;
    const float *wr[6];
    for (int c = 0; c < nb; c++) wr[c] = w + (size_t)(j + (c < nc ? c : nc - 1)) * IN;
    const float *next = j + 2 * nb <= j1 ? w + (size_t)(j + nb) * IN : NULL;
    for (int m = 0; m < M; m += 4) {
      const float *xr[4];
      lf_rows(xr, inp, m, M, IN);
      float acc[24];
      if (nb == 6)
        lf_tile512x6(acc, xr, wr, IN, m == 0 ? next : NULL);
      else
        lf_tile512(acc, xr, wr, IN, next);
      lf_store_tile(out, acc, bias, m, M - m < 4 ? M - m : 4, j, nc, OUT, beta);
    }
  }
}

/* linear_few_bf16 on AVX-512 for IN a multiple of 16: blocks of 6 weight rows converted in
 * registers by the first row tile, which keeps them in st (6 * IN floats) for the other row tiles
 * when there are others (M > 4). So the weights are read once, at half float32's bytes, converted
 * once, and the conversion overlaps the products and the prefetch of the next block. */
LF_AVX512 static void lf_avx512_bf16(float *out, const float *inp, const uint16_t *w,
                                     const float *bias, int M, int IN, int OUT, int j0, int j1,
                                     float beta, float *st) {
  for (int j = j0; j < j1; j += 6) {
    int nc = j1 - j < 6 ? j1 - j : 6;
    const uint16_t *wr[6];
    const float *sr[6];
    for (int c = 0; c < 6; c++) {
      wr[c] = w + (size_t)(j + (c < nc ? c : nc - 1)) * IN;
      sr[c] = st + (size_t)c * IN;
    }
    const uint16_t *next = j + 12 <= j1 ? w + (size_t)(j + 6) * IN : NULL;
    for (int m = 0; m < M; m += 4) {
      const float *xr[4];
      lf_rows(xr, inp, m, M, IN);
      float acc[24];
      if (m == 0)
        lf_tile512x6_bf16(acc, xr, wr, IN, M > 4 ? st : NULL, next);
      else
        lf_tile512x6(acc, xr, sr, IN, NULL);
      lf_store_tile(out, acc, bias, m, M - m < 4 ? M - m : 4, j, nc, OUT, beta);
    }
  }
}

/* ---- AVX2 + FMA: tiles of 2 rows x 2 columns, two ymm (lanes 0-7, 8-15) per output --------- */

#define LF_AVX2 __attribute__((target("avx2,fma")))

LF_AVX2 static inline float lf_hsum256x2(__m256 lo, __m256 hi) {
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

LF_AVX2 static __m256i lf_mask8(int n) { /* lanes [0, n) set, n in [0, 8] */
  static const int32_t t[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(t + 8 - n));
}

LF_AVX2 static void lf_tile256(float acc[4], const float *const xr[2], const float *const wr[2],
                               int IN, const float *pf) {
  __m256 a[8]; /* output (r, c): a[4r + 2c] lanes 0-7, a[4r + 2c + 1] lanes 8-15 */
  for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 16 <= IN; k += 16) {
    if (pf) {
      _mm_prefetch((const char *)(pf + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + IN + k), _MM_HINT_T0);
    }
    for (int h = 0; h < 2; h++) {
      __m256 b0 = _mm256_loadu_ps(wr[0] + k + 8 * h), b1 = _mm256_loadu_ps(wr[1] + k + 8 * h);
      for (int r = 0; r < 2; r++) {
        __m256 x = _mm256_loadu_ps(xr[r] + k + 8 * h);
        a[4 * r + h] = _mm256_fmadd_ps(x, b0, a[4 * r + h]);
        a[4 * r + 2 + h] = _mm256_fmadd_ps(x, b1, a[4 * r + 2 + h]);
      }
    }
  }
  if (k < IN) {
    int rem = IN - k;
    for (int h = 0; h < 2; h++) {
      int n = rem - 8 * h;
      n = n < 0 ? 0 : n > 8 ? 8 : n;
      if (!n) continue;
      __m256i mk = lf_mask8(n);
      __m256 b0 = _mm256_maskload_ps(wr[0] + k + 8 * h, mk),
             b1 = _mm256_maskload_ps(wr[1] + k + 8 * h, mk);
      for (int r = 0; r < 2; r++) {
        __m256 x = _mm256_maskload_ps(xr[r] + k + 8 * h, mk);
        /* zero products in the masked lanes: a + 0 == a since no partial sum is -0 */
        a[4 * r + h] = _mm256_fmadd_ps(x, b0, a[4 * r + h]);
        a[4 * r + 2 + h] = _mm256_fmadd_ps(x, b1, a[4 * r + 2 + h]);
      }
    }
  }
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 2; c++)
      acc[2 * r + c] = lf_hsum256x2(a[4 * r + 2 * c], a[4 * r + 2 * c + 1]);
}

LF_AVX2 static void lf_avx2(float *out, const float *inp, const float *w, const float *bias, int M,
                            int IN, int OUT, int j0, int j1, float beta) {
  for (int j = j0; j < j1; j += 2) {
    int nc = j1 - j < 2 ? j1 - j : 2;
    const float *wr[2] = {w + (size_t)j * IN, w + (size_t)(j + nc - 1) * IN};
    const float *next = j + 4 <= j1 ? w + (size_t)(j + 2) * IN : NULL;
    for (int m = 0; m < M; m += 2) {
      int nr = M - m < 2 ? M - m : 2;
      const float *xr[2] = {inp + (size_t)m * IN, inp + (size_t)(m + nr - 1) * IN};
      float acc[4];
      lf_tile256(acc, xr, wr, IN, m == 0 ? next : NULL);
      for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++)
          lf_store(out + (size_t)(m + r) * OUT + j + c, acc[2 * r + c], bias, j + c, beta);
    }
  }
}
#endif

/* ---- dispatch ---------------------------------------------------------------------------- */

/* The form of a kernel this processor runs, as an index into the kernel's table of forms:
 * 0 portable, 1 portable with FMA, 2 AVX2, 3 AVX-512 (kernels_isa; always 0 off x86). */
static int lf_form(void) {
#ifdef LF_X86
  int isa = kernels_isa();
  if (isa == KERNELS_ISA_AVX512) return 3;
  if (isa == KERNELS_ISA_AVX2) return 2;
  if (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma()) return 1;
#endif
  return 0;
}

typedef void lf_fn(float *, const float *, const float *, const float *, int, int, int, int, int,
                   float);

void linear_few(float *out, const float *inp, const float *w, const float *bias, int M, int IN,
                int OUT, int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
#ifdef LF_X86
  static lf_fn *const forms[] = {lf_portable, lf_portable_fma, lf_avx2, lf_avx512};
#else
  static lf_fn *const forms[] = {lf_portable};
#endif
  forms[lf_form()](out, inp, w, bias, M, IN, OUT, j0, j1, beta);
}

/* ---- narrow products (linear_few_narrow): few inputs per output ------------------------------ */

/* Columns [j, j + n) of w, n <= 16, transposed into wt: wt[k] holds w[j + l, k] in lane l (+0 in
 * lanes [n, 16)). Moves, so exact. */
static void lfn_transpose(float *wt, const float *w, int IN, int j, int n) {
  for (int k = 0; k < IN; k++) {
    float *d = wt + (size_t)k * 16;
    for (int l = 0; l < 16; l++) d[l] = l < n ? w[(size_t)(j + l) * IN + k] : 0.0f;
  }
}

/* A piece of columns [p, *end) of at most bpp blocks of 16, each block transposed (block b at
 * b * 16 * IN floats): from pre (linear_few_narrow_pack's, where p is a multiple of 16: block
 * p / 16 starts at pre + p IN), or transposed now into wt. The forms below take the columns a
 * piece at a time and each group of rows across all of the piece's blocks, so that a row's
 * outputs are read and written in order: block after block for all rows (the piece one block
 * wide) had each row's line of the block come back from L2 or further, 23% of the narrow
 * products' samples on a Zen 5 at static columns (a thread's half of gate/up is 64 x 2432
 * floats, 0.6 MB). */
static const float *lfn_piece_at(float *wt, const float *pre, const float *w, int IN, int p, int j1,
                                 int bpp, int *end) {
  *end = j1 - p < 16 * bpp ? j1 : p + 16 * bpp;
  if (pre) return pre + (size_t)p * IN;
  for (int j = p; j < *end; j += 16)
    lfn_transpose(wt + (size_t)(j - p) * IN, w, IN, j, *end - j < 16 ? *end - j : 16);
  return wt;
}

/* The definition (kernels.h): lane l of a row's 16 sums is output column j + l; one fused
 * multiply-add per k, in increasing k, starting from +0. */
SIMD_INLINE void lfn_gen(float *out, const float *inp, const float *w, int M, int IN, int OUT,
                         int j0, int j1, float beta, float *wt, const float *pre, int bpp,
                         const int hw) {
  for (int p = j0, end; p < j1; p = end) {
    const float *pw = lfn_piece_at(wt, pre, w, IN, p, j1, bpp, &end);
    for (int m = 0; m < M; m++) {
      const float *x = inp + (size_t)m * IN;
      for (int j = p; j < end; j += 16) {
        int n = end - j < 16 ? end - j : 16;
        const float *wb = pw + (size_t)(j - p) * IN;
        struct simd16 acc = simd_zero();
        for (int k = 0; k < IN; k++)
          acc = simd_fma(simd_splat(x[k]), simd_load(wb + 16 * k), acc, hw);
        float *o = out + (size_t)m * OUT + j;
        if (beta != 0.0f) acc = simd_add(simd_load_n(o, n), acc);
        simd_store_n(o, acc, n);
      }
    }
  }
}

static void lfn_portable(float *out, const float *inp, const float *w, int M, int IN, int OUT,
                         int j0, int j1, float beta, float *wt, const float *pre, int bpp) {
  lfn_gen(out, inp, w, M, IN, OUT, j0, j1, beta, wt, pre, bpp, SIMD_HW_FMA);
}

#ifdef LF_X86
__attribute__((target("fma"))) static void lfn_portable_fma(float *out, const float *inp,
                                                            const float *w, int M, int IN, int OUT,
                                                            int j0, int j1, float beta, float *wt,
                                                            const float *pre, int bpp) {
  lfn_gen(out, inp, w, M, IN, OUT, j0, j1, beta, wt, pre, bpp, 1);
}

/* AVX-512: a zmm of 16 sums per row, the same lanes and order as lfn_gen; 4 rows at a time, so
 * that 4 chains of dependent fused multiply-adds overlap (one alone waits on each one's latency) */
LF_AVX512 static void lfn_avx512(float *out, const float *inp, const float *w, int M, int IN,
                                 int OUT, int j0, int j1, float beta, float *wt, const float *pre,
                                 int bpp) {
  for (int p = j0, end; p < j1; p = end) {
    const float *pw = lfn_piece_at(wt, pre, w, IN, p, j1, bpp, &end);
    for (int m = 0; m < M; m += 4) {
      int nr = M - m < 4 ? M - m : 4; /* a partial group repeats its last row */
      const float *x0 = inp + (size_t)m * IN, *x1 = inp + (size_t)(m + (nr > 1)) * IN,
                  *x2 = inp + (size_t)(m + (nr > 2 ? 2 : nr - 1)) * IN,
                  *x3 = inp + (size_t)(m + nr - 1) * IN;
      for (int j = p; j < end; j += 16) {
        int n = end - j < 16 ? end - j : 16;
        __mmask16 mask = (__mmask16)((1u << n) - 1);
        const float *wb = pw + (size_t)(j - p) * IN;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < IN; k++) {
          __m512 b = _mm512_loadu_ps(wb + 16 * k);
          a0 = _mm512_fmadd_ps(_mm512_set1_ps(x0[k]), b, a0);
          a1 = _mm512_fmadd_ps(_mm512_set1_ps(x1[k]), b, a1);
          a2 = _mm512_fmadd_ps(_mm512_set1_ps(x2[k]), b, a2);
          a3 = _mm512_fmadd_ps(_mm512_set1_ps(x3[k]), b, a3);
        }
        __m512 acc[4] = {a0, a1, a2, a3};
        for (int r = 0; r < nr; r++) {
          float *o = out + (size_t)(m + r) * OUT + j;
          if (n == 16) { /* plain moves: masked ones are slow on AMD's processors */
            _mm512_storeu_ps(o, beta != 0.0f ? _mm512_add_ps(_mm512_loadu_ps(o), acc[r]) : acc[r]);
            continue;
          }
          __m512 v = beta != 0.0f ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), acc[r]) : acc[r];
          _mm512_mask_storeu_ps(o, mask, v);
        }
      }
    }
  }
}

/* AVX2: two ymm of 8 sums per row, 4 rows at a time (8 chains: 2 rows left half of the FMA
 * units waiting on latency, and a scalar store of the sums cost as much again: LoRA's B products
 * were 3.5% of an AVX2 decoding step at batch 64, 1% of its arithmetic) */
LF_AVX2 static void lfn_avx2(float *out, const float *inp, const float *w, int M, int IN, int OUT,
                             int j0, int j1, float beta, float *wt, const float *pre, int bpp) {
  for (int p = j0, end; p < j1; p = end) {
    const float *pw = lfn_piece_at(wt, pre, w, IN, p, j1, bpp, &end);
    for (int m = 0; m < M; m += 4) {
      int nr = M - m < 4 ? M - m : 4; /* a partial group repeats its last row */
      const float *x0 = inp + (size_t)m * IN, *x1 = inp + (size_t)(m + (nr > 1)) * IN,
                  *x2 = inp + (size_t)(m + (nr > 2 ? 2 : nr - 1)) * IN,
                  *x3 = inp + (size_t)(m + nr - 1) * IN;
      for (int j = p; j < end; j += 16) {
        int n = end - j < 16 ? end - j : 16;
        __m256i m0 = lf_mask8(n < 8 ? n : 8), m1 = lf_mask8(n > 8 ? n - 8 : 0);
        const float *wb = pw + (size_t)(j - p) * IN;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
               a30 = a00, a31 = a00;
        for (int k = 0; k < IN; k++) {
          __m256 b0 = _mm256_loadu_ps(wb + 16 * k), b1 = _mm256_loadu_ps(wb + 16 * k + 8);
          __m256 v = _mm256_broadcast_ss(x0 + k);
          a00 = _mm256_fmadd_ps(v, b0, a00), a01 = _mm256_fmadd_ps(v, b1, a01);
          v = _mm256_broadcast_ss(x1 + k);
          a10 = _mm256_fmadd_ps(v, b0, a10), a11 = _mm256_fmadd_ps(v, b1, a11);
          v = _mm256_broadcast_ss(x2 + k);
          a20 = _mm256_fmadd_ps(v, b0, a20), a21 = _mm256_fmadd_ps(v, b1, a21);
          v = _mm256_broadcast_ss(x3 + k);
          a30 = _mm256_fmadd_ps(v, b0, a30), a31 = _mm256_fmadd_ps(v, b1, a31);
        }
        __m256 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int r = 0; r < nr; r++) {
          float *o = out + (size_t)(m + r) * OUT + j;
          __m256 v0 = acc[r][0], v1 = acc[r][1];
          if (n == 16) { /* plain moves: masked ones are slow on AMD's processors */
            if (beta != 0.0f) {
              v0 = _mm256_add_ps(_mm256_loadu_ps(o), v0);
              v1 = _mm256_add_ps(_mm256_loadu_ps(o + 8), v1);
            }
            _mm256_storeu_ps(o, v0), _mm256_storeu_ps(o + 8, v1);
            continue;
          }
          if (beta != 0.0f) {
            v0 = _mm256_add_ps(_mm256_maskload_ps(o, m0), v0);
            if (n > 8) v1 = _mm256_add_ps(_mm256_maskload_ps(o + 8, m1), v1);
          }
          _mm256_maskstore_ps(o, m0, v0);
          if (n > 8) _mm256_maskstore_ps(o + 8, m1, v1);
        }
      }
    }
  }
}
#endif

/* The transposed piece: on the stack up to this many floats (16 KiB: 16 blocks of 16 columns at
 * r = 16), else one block on the heap. */
enum { LFN_STACK_FLOATS = 4096 };

typedef void lfn_fn(float *, const float *, const float *, int, int, int, int, int, float, float *,
                    const float *, int);

static lfn_fn *lfn_form(void) {
#ifdef LF_X86
  static lfn_fn *const forms[] = {lfn_portable, lfn_portable_fma, lfn_avx2, lfn_avx512};
#else
  static lfn_fn *const forms[] = {lfn_portable};
#endif
  return forms[lf_form()];
}

/* Blocks of 16 columns a piece: the piece's transposed B in LFN_STACK_FLOATS (at least one) */
static int lfn_bpp(int IN) {
  int bpp = LFN_STACK_FLOATS / (16 * IN);
  return bpp < 1 ? 1 : bpp;
}

void linear_few_narrow(float *out, const float *inp, const float *w, int M, int IN, int OUT, int j0,
                       int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
  float stack[LFN_STACK_FLOATS], *wt = stack;
  if (16 * IN > LFN_STACK_FLOATS && !(wt = malloc(sizeof(float) * 16 * (size_t)IN))) {
    /* no memory: the same arithmetic, one output at a time */
    for (int m = 0; m < M; m++)
      for (int j = j0; j < j1; j++) {
        float acc = 0.0f, *o = out + (size_t)m * OUT + j;
        for (int k = 0; k < IN; k++)
          acc = fmaf(inp[(size_t)m * IN + k], w[(size_t)j * IN + k], acc);
        *o = beta != 0.0f ? *o + acc : acc;
      }
    return;
  }
  lfn_form()(out, inp, w, M, IN, OUT, j0, j1, beta, wt, NULL, lfn_bpp(IN));
  if (wt != stack) free(wt);
}

size_t linear_few_narrow_floats(int IN, int OUT) {
  return (size_t)(OUT + 15) / 16 * 16 * (size_t)IN;
}

void linear_few_narrow_pack(float *wt, const float *w, int IN, int OUT) {
  for (int j = 0; j < OUT; j += 16)
    lfn_transpose(wt + (size_t)j * IN, w, IN, j, OUT - j < 16 ? OUT - j : 16);
}

void linear_few_narrow_packed(float *out, const float *inp, const float *wt, int M, int IN, int OUT,
                              int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
  for (; j0 % 16 && j0 < j1; j0++) /* up to a block's start: the same arithmetic, one at a time */
    for (int m = 0; m < M; m++) {
      float acc = 0.0f, *o = out + (size_t)m * OUT + j0;
      for (int k = 0; k < IN; k++)
        acc =
            fmaf(inp[(size_t)m * IN + k], wt[(size_t)(j0 / 16 * 16) * IN + 16 * k + j0 % 16], acc);
      *o = beta != 0.0f ? *o + acc : acc;
    }
  if (j0 < j1) lfn_form()(out, inp, NULL, M, IN, OUT, j0, j1, beta, NULL, wt, lfn_bpp(IN));
}

void linear_lanes_adapter_add(float *out, const struct lanes_adapter *ad, int M, int OUT, int j0,
                              int j1) {
  if (ad->bt)
    linear_few_narrow_packed(out, ad->xa, ad->bt, M, ad->r, OUT, j0, j1, 1.0f);
  else
    linear_few_narrow(out, ad->xa, ad->b, M, ad->r, OUT, j0, j1, 1.0f);
}

/* ---- BF16 weights -------------------------------------------------------------------------- */

/* AVX-512 with IN a multiple of 16 (every real model's widths): lf_avx512_bf16, converting each
 * block of weight rows in registers during its first row tile. Measured on a Xeon with AVX-512,
 * one thread, against converting a block of 4 rows first (below): at 896 x 4864 and 4864 x 896
 * 2.4x faster for M = 1, 1.2-1.5x for M = 16, 1.1-1.35x for M = 64 (and then faster than float32
 * weights: half the bytes to read). Otherwise converted weight rows go into a block of about
 * LF_BF16_ROWS_FLOATS floats (whole rows, a multiple of 4 and at least 4: the AVX-512 tile's
 * width, which a narrower block would pad with repeated rows), so that it stays in L1 while
 * linear_few reuses it for every input row. Either buffer is on the stack up to LF_BF16_STACK
 * floats, else on the heap, 64-byte aligned (unaligned, the 4864 x 896 product ran 1.2x
 * slower). */
enum { LF_BF16_STACK = 16384, LF_BF16_ROWS_FLOATS = 4096 };

/* The scalar form of linear_few's arithmetic (16 fmaf lanes, simd_tree's tree), for rows too
 * long for the block. */
static void lf_scalar_bf16(float *out, const float *inp, const uint16_t *w, const float *bias,
                           int M, int IN, int OUT, int j0, int j1, float beta) {
  for (int m = 0; m < M; m++)
    for (int j = j0; j < j1; j++) {
      const float *x = inp + (size_t)m * IN;
      const uint16_t *wr = w + (size_t)j * IN;
      float a[16] = {0}, s8[8], s4[4];
      for (int k = 0; k < IN; k++) {
        uint32_t u = (uint32_t)wr[k] << 16;
        float wf;
        memcpy(&wf, &u, sizeof wf);
        a[k & 15] = fmaf(x[k], wf, a[k & 15]);
      }
      for (int i = 0; i < 8; i++) s8[i] = a[i] + a[i + 8];
      for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
      lf_store(out + (size_t)m * OUT + j, (s4[0] + s4[2]) + (s4[1] + s4[3]), bias, j, beta);
    }
}

void linear_few_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int M,
                     int IN, int OUT, int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
#ifdef LF_X86
  int fused = kernels_isa() == KERNELS_ISA_AVX512 && IN % 16 == 0;
  if (fused && M == 1) { /* 1x16 tiles, converted in registers, no buffer */
    lf_rows16_bf16(out, inp, w, bias, M, IN, OUT, j0, j1, beta);
    return;
  }
#else
  int fused = 0;
#endif
  int rows = (LF_BF16_ROWS_FLOATS / IN) & ~3;
  rows = rows < 4 ? 4 : rows;
  /* floats; the fused path keeps its blocks only for more than one row tile */
  size_t need = (size_t)(fused ? (M > 4 ? 6 : 0) : rows) * IN;
  float stack[LF_BF16_STACK] __attribute__((aligned(64)));
  float *buf =
      need <= LF_BF16_STACK ? stack : aligned_alloc(64, (sizeof(float) * need + 63) & ~(size_t)63);
  if (!buf) { /* out of memory: the same arithmetic, unvectorised */
    lf_scalar_bf16(out, inp, w, bias, M, IN, OUT, j0, j1, beta);
    return;
  }
#ifdef LF_X86
  if (fused) {
    lf_avx512_bf16(out, inp, w, bias, M, IN, OUT, j0, j1, beta, buf);
    if (buf != stack) free(buf);
    return;
  }
#endif
  for (int j = j0; j < j1; j += rows) {
    int n = j1 - j < rows ? j1 - j : rows;
    bf16_to_f32(buf, w + (size_t)j * IN, (size_t)n * IN);
    /* columns [j, j + n) as columns [0, n) of a matrix whose rows are buf: each element's
     * arithmetic does not depend on the column range */
    linear_few(out + j, inp, buf, bias ? bias + j : NULL, M, IN, OUT, 0, n, beta);
  }
  if (buf != stack) free(buf);
}

/* ---- outputs in the lanes (linear_lanes): one chain of fused multiply-adds per output ------- */

/* Each output is fmaf's chain over k in increasing order from +0, so no reduction at all: groups
 * of 32 weight rows (64 for up to 3 input rows on AVX-512) are transposed ("packed") on the fly
 * into a k-major block pt (pt[k * width + c] = w[j + c, k0 + k], BF16 converted on the way) of
 * 4096 floats (16 KiB: LL_KC k of 32 columns), and every row of inp runs against it with
 * broadcast inputs, R rows x width columns of sums in registers (the classic SGEMM micro-kernel).
 * Longer rows carry their sums over in acc (float32 in memory: the chain is unchanged), so the
 * block stays in L1 whatever IN. The pack's cost (a 16 x 16 transpose in registers: 4 shuffles
 * per vector) is shared by the M rows; the weights are read once per call (per LL_ROWS rows), in
 * place, with no copy kept. Measured on the Xeon of bench/README.md, one thread, against 256 k
 * blocks of 32 columns with L1 prefetches of the next group: 128 k with prefetches into L2 were
 * 1.2-1.3x faster at M = 1 and 16 (the block, the rows being packed and the prefetched ones no
 * longer all compete for L1). */
enum { LL_KC = 128, LL_ROWS = 64, LL_FEW = 1 };

/* lf_store on n outputs, 16 lanes at a time (the same operations, lane by lane) */
static inline void ll_store(float *o, const float *acc, const float *bias, int n, float beta) {
  int c = 0;
  for (; c + 16 <= n; c += 16) {
    struct simd16 r = simd_load(acc + c);
    if (bias) r = simd_add(r, simd_load(bias + c));
    if (beta != 0.0f) r = simd_add(simd_load(o + c), r);
    simd_store(o + c, r);
  }
  if (c < n) {
    int l = n - c;
    struct simd16 r = simd_load_n(acc + c, l);
    if (bias) r = simd_add(r, simd_load_n(bias + c, l));
    if (beta != 0.0f) r = simd_add(simd_load_n(o + c, l), r);
    simd_store_n(o + c, r, l);
  }
}

/* Pack columns [j, j + nc) (nc <= width, the rest +0) of k in [k0, k0 + kc): moves, exact.
 * nxt: 1 when width more columns follow (which a pack may prefetch). */
typedef void ll_pack_fn(float *pt, const float *w, const uint16_t *w16, int IN, int j, int nc,
                        int k0, int kc, int width, int nxt);
/* Rows x[r * IN + k] (r < R, k < kc) against pt: acc[r * width + c] continues its chain. */
typedef void ll_tile_fn(float *acc, const float *x, int IN, const float *pt, int kc, int R,
                        int width);

static inline float ll_w(const float *w, const uint16_t *w16, size_t i) {
  if (!w16) return w[i];
  uint32_t u = (uint32_t)w16[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void ll_pack_scalar(float *pt, const float *w, const uint16_t *w16, int IN, int j, int nc,
                           int k0, int kc, int width, int nxt) {
  (void)nxt;
  for (int c = 0; c < width; c++) {
    size_t row = (size_t)(j + c) * IN + k0;
    for (int k = 0; k < kc; k++) pt[(size_t)k * width + c] = c < nc ? ll_w(w, w16, row + k) : 0.0f;
  }
}

/* Portable tiles: rows 2 at a time (a lone last row repeated), one 16-lane panel at a time. */
SIMD_INLINE void ll_tile_gen(float *acc, const float *x, int IN, const float *pt, int kc, int R,
                             int width, const int hw) {
  for (int p = 0; p < width; p += 16)
    for (int r = 0; r < R; r += 2) {
      const float *x0 = x + (size_t)r * IN, *x1 = x + (size_t)(r + 1 < R ? r + 1 : r) * IN;
      float *c0 = acc + (size_t)r * width + p,
            *c1 = acc + (size_t)(r + 1 < R ? r + 1 : r) * width + p;
      struct simd16 a0 = simd_load(c0), a1 = simd_load(c1);
      for (int k = 0; k < kc; k++) {
        struct simd16 b = simd_load(pt + (size_t)k * width + p);
        a0 = simd_fma(simd_splat(x0[k]), b, a0, hw);
        a1 = simd_fma(simd_splat(x1[k]), b, a1, hw);
      }
      simd_store(c1, a1); /* c0 last: the same row when R is odd */
      simd_store(c0, a0);
    }
}

static void ll_tile_portable(float *acc, const float *x, int IN, const float *pt, int kc, int R,
                             int width) {
  ll_tile_gen(acc, x, IN, pt, kc, R, width, SIMD_HW_FMA);
}

#ifdef LF_X86
__attribute__((target("fma"))) static void ll_tile_portable_fma(float *acc, const float *x, int IN,
                                                                const float *pt, int kc, int R,
                                                                int width) {
  ll_tile_gen(acc, x, IN, pt, kc, R, width, 1);
}

/* AVX2 pack: 8 x 8 blocks transposed in registers (two unpacks, two shuffles and a 128-bit
 * permute per vector), BF16 rows widened on load; k past kc loads as +0; when pf, a line of each
 * row pf elements on (the same rows of the next panel) prefetched into L2 as it starts. */
LF_AVX2 static inline __attribute__((always_inline)) __m256
ll_load256(const float *w, const uint16_t *w16, size_t i, int n) {
  if (w16) {
    __m128i h;
    if (n == 8) {
      h = _mm_loadu_si128((const __m128i *)(w16 + i));
    } else {
      uint16_t t[8] = {0};
      memcpy(t, w16 + i, sizeof(uint16_t) * (size_t)n);
      h = _mm_loadu_si128((const __m128i *)t);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return n == 8 ? _mm256_loadu_ps(w + i) : _mm256_maskload_ps(w + i, lf_mask8(n));
}

LF_AVX2 static inline __attribute__((always_inline)) void
ll_pack256_gen(float *pt, const float *w, const uint16_t *w16, int IN, int j, int nc, int k0,
               int kc, int width, size_t pf, const int bf16) {
  for (int c0 = 0; c0 < width; c0 += 8) {
    /* rows past nc repeat the last one (their columns are never stored) */
    size_t o[8];
    for (int i = 0; i < 8; i++) o[i] = (size_t)(j + (c0 + i < nc ? c0 + i : nc - 1)) * IN + k0;
    for (int k = 0; k < kc; k += 8) {
      int n = kc - k < 8 ? kc - k : 8;
      if (pf && !(k & (bf16 ? 31 : 15)))
        for (int i = 0; i < 8; i++)
          _mm_prefetch(bf16 ? (const char *)(w16 + o[i] + pf + k)
                            : (const char *)(w + o[i] + pf + k),
                       _MM_HINT_T1);
      __m256 r0 = ll_load256(w, w16, o[0] + k, n), r1 = ll_load256(w, w16, o[1] + k, n);
      __m256 r2 = ll_load256(w, w16, o[2] + k, n), r3 = ll_load256(w, w16, o[3] + k, n);
      __m256 r4 = ll_load256(w, w16, o[4] + k, n), r5 = ll_load256(w, w16, o[5] + k, n);
      __m256 r6 = ll_load256(w, w16, o[6] + k, n), r7 = ll_load256(w, w16, o[7] + k, n);
      /* t: pairs of rows interleaved; s<c>: k = c (rows 0-3) | k = c + 4 (rows 0-3), then 4-7 */
      __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float *d = pt + (size_t)k * width + c0;
#define LL2_S(i, a, b, h)                                                                          \
  if (n > i) _mm256_storeu_ps(d + (size_t)(i)*width, _mm256_permute2f128_ps(a, b, h))
      LL2_S(0, s0, s4, 0x20);
      LL2_S(1, s1, s5, 0x20);
      LL2_S(2, s2, s6, 0x20);
      LL2_S(3, s3, s7, 0x20);
      LL2_S(4, s0, s4, 0x31);
      LL2_S(5, s1, s5, 0x31);
      LL2_S(6, s2, s6, 0x31);
      LL2_S(7, s3, s7, 0x31);
#undef LL2_S
    }
  }
}

LF_AVX2 static void ll_pack256(float *pt, const float *w, const uint16_t *w16, int IN, int j,
                               int nc, int k0, int kc, int width, int nxt) {
  size_t pf = nc == width && nxt ? (size_t)width * IN : 0; /* elements to the next panel */
  if (w16)
    ll_pack256_gen(pt, NULL, w16, IN, j, nc, k0, kc, width, pf, 1);
  else
    ll_pack256_gen(pt, w, NULL, IN, j, nc, k0, kc, width, pf, 0);
}

/* AVX2 tile: R (a constant, <= 6) rows x one 16-lane panel at a time (two ymm per row), 12 sums
 * in registers, per k 2 loads of the block and R broadcasts (the 6 x 16 SGEMM micro-kernel). */
LF_AVX2 static inline __attribute__((always_inline)) void
ll_tile256_r(float *acc, const float *x, int IN, const float *pt, int kc, int width, const int R) {
  const __m256 z = _mm256_setzero_ps();
  for (int p = 0; p < width; p += 16) {
    float *c = acc + p;
#define LL2_DECL(i)                                                                                \
  __m256 a##i = R > i ? _mm256_loadu_ps(c + (size_t)(i)*width) : z;                                \
  __m256 b##i = R > i ? _mm256_loadu_ps(c + (size_t)(i)*width + 8) : z;                            \
  const float *x##i = x + (size_t)(R > i ? i : 0) * IN
    LL2_DECL(0);
    LL2_DECL(1);
    LL2_DECL(2);
    LL2_DECL(3);
    LL2_DECL(4);
    LL2_DECL(5);
#undef LL2_DECL
#pragma GCC unroll 4 /* as lr_tile256's */
    for (int k = 0; k < kc; k++) {
      __m256 w0 = _mm256_loadu_ps(pt + (size_t)k * width + p);
      __m256 w1 = _mm256_loadu_ps(pt + (size_t)k * width + p + 8);
#define LL2_FMA(i)                                                                                 \
  if (R > i) {                                                                                     \
    __m256 v = _mm256_broadcast_ss(x##i + k);                                                      \
    a##i = _mm256_fmadd_ps(v, w0, a##i), b##i = _mm256_fmadd_ps(v, w1, b##i);                      \
  }
      LL2_FMA(0);
      LL2_FMA(1);
      LL2_FMA(2);
      LL2_FMA(3);
      LL2_FMA(4);
      LL2_FMA(5);
#undef LL2_FMA
    }
#define LL2_ST(i)                                                                                  \
  if (R > i)                                                                                       \
  _mm256_storeu_ps(c + (size_t)(i)*width, a##i), _mm256_storeu_ps(c + (size_t)(i)*width + 8, b##i)
    LL2_ST(0);
    LL2_ST(1);
    LL2_ST(2);
    LL2_ST(3);
    LL2_ST(4);
    LL2_ST(5);
#undef LL2_ST
  }
}

LF_AVX2 static void ll_tile256(float *acc, const float *x, int IN, const float *pt, int kc, int R,
                               int width) {
  switch (R) {
  case 1: ll_tile256_r(acc, x, IN, pt, kc, width, 1); return;
  case 2: ll_tile256_r(acc, x, IN, pt, kc, width, 2); return;
  case 3: ll_tile256_r(acc, x, IN, pt, kc, width, 3); return;
  case 4: ll_tile256_r(acc, x, IN, pt, kc, width, 4); return;
  case 5: ll_tile256_r(acc, x, IN, pt, kc, width, 5); return;
  default: ll_tile256_r(acc, x, IN, pt, kc, width, 6); return;
  }
}

/* AVX-512 pack: 16 x 16 blocks transposed in registers (unpack, shuffle, two 128-bit shuffles),
 * BF16 rows widened on load; k past kc loads as +0. */
LF_AVX512 static inline __attribute__((always_inline)) __m512
ll_load512(const float *w, const uint16_t *w16, size_t i, __mmask16 mk) {
  if (w16) {
    __m256i h;
    if (mk == 0xffff) {
      h = _mm256_loadu_si256((const __m256i *)(w16 + i));
    } else { /* a masked 16-bit load needs AVX512BW: the tail through a buffer */
      uint16_t t[16] = {0};
      memcpy(t, w16 + i, sizeof(uint16_t) * (size_t)__builtin_popcount(mk));
      h = _mm256_loadu_si256((const __m256i *)t);
    }
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(mk, w + i);
}

/* Transposes the 16 vectors r0..r15 in place (r<i> ends up holding lane i of each), through
 * t0..t15: named variables, since arrays of vectors stay in memory at -O2. */
#define LL_UNPACK(a, b) t##a = _mm512_unpacklo_ps(r##a, r##b), t##b = _mm512_unpackhi_ps(r##a, r##b)
#define LL_SHUF(a, b, c, d)                                                                        \
  r##a = _mm512_shuffle_ps(t##a, t##c, 0x44), r##b = _mm512_shuffle_ps(t##a, t##c, 0xEE),          \
  r##c = _mm512_shuffle_ps(t##b, t##d, 0x44), r##d = _mm512_shuffle_ps(t##b, t##d, 0xEE)
#define LL_TRANSPOSE16()                                                                           \
  do {                                                                                             \
    LL_UNPACK(0, 1), LL_UNPACK(2, 3), LL_UNPACK(4, 5), LL_UNPACK(6, 7);                            \
    LL_UNPACK(8, 9), LL_UNPACK(10, 11), LL_UNPACK(12, 13), LL_UNPACK(14, 15);                      \
    LL_SHUF(0, 1, 2, 3), LL_SHUF(4, 5, 6, 7), LL_SHUF(8, 9, 10, 11), LL_SHUF(12, 13, 14, 15);      \
    t0 = _mm512_shuffle_f32x4(r0, r4, 0x88), t4 = _mm512_shuffle_f32x4(r0, r4, 0xDD);              \
    t1 = _mm512_shuffle_f32x4(r1, r5, 0x88), t5 = _mm512_shuffle_f32x4(r1, r5, 0xDD);              \
    t2 = _mm512_shuffle_f32x4(r2, r6, 0x88), t6 = _mm512_shuffle_f32x4(r2, r6, 0xDD);              \
    t3 = _mm512_shuffle_f32x4(r3, r7, 0x88), t7 = _mm512_shuffle_f32x4(r3, r7, 0xDD);              \
    t8 = _mm512_shuffle_f32x4(r8, r12, 0x88), t12 = _mm512_shuffle_f32x4(r8, r12, 0xDD);           \
    t9 = _mm512_shuffle_f32x4(r9, r13, 0x88), t13 = _mm512_shuffle_f32x4(r9, r13, 0xDD);           \
    t10 = _mm512_shuffle_f32x4(r10, r14, 0x88), t14 = _mm512_shuffle_f32x4(r10, r14, 0xDD);        \
    t11 = _mm512_shuffle_f32x4(r11, r15, 0x88), t15 = _mm512_shuffle_f32x4(r11, r15, 0xDD);        \
    r0 = _mm512_shuffle_f32x4(t0, t8, 0x88), r8 = _mm512_shuffle_f32x4(t0, t8, 0xDD);              \
    r1 = _mm512_shuffle_f32x4(t1, t9, 0x88), r9 = _mm512_shuffle_f32x4(t1, t9, 0xDD);              \
    r2 = _mm512_shuffle_f32x4(t2, t10, 0x88), r10 = _mm512_shuffle_f32x4(t2, t10, 0xDD);           \
    r3 = _mm512_shuffle_f32x4(t3, t11, 0x88), r11 = _mm512_shuffle_f32x4(t3, t11, 0xDD);           \
    r4 = _mm512_shuffle_f32x4(t4, t12, 0x88), r12 = _mm512_shuffle_f32x4(t4, t12, 0xDD);           \
    r5 = _mm512_shuffle_f32x4(t5, t13, 0x88), r13 = _mm512_shuffle_f32x4(t5, t13, 0xDD);           \
    r6 = _mm512_shuffle_f32x4(t6, t14, 0x88), r14 = _mm512_shuffle_f32x4(t6, t14, 0xDD);           \
    r7 = _mm512_shuffle_f32x4(t7, t15, 0x88), r15 = _mm512_shuffle_f32x4(t7, t15, 0xDD);           \
  } while (0)

/* Declares r0..r15: the 16 x 16 block at k of the weight rows at offsets o[16] (w, or w16 when
 * bf16; k past the mask mk read as +0), transposed so that r<i> holds k + i of the 16 rows; and
 * when pf, first prefetches (hint) a line of each row pf elements on (every other block for BF16:
 * a line holds 32 of them). */
#define LL_L(i) __m512 r##i = ll_load512(bf16 ? NULL : w, bf16 ? w16 : NULL, o[i] + k, mk)
#define LL_BLOCK16(hint)                                                                           \
  if (pf && (!bf16 || !(k & 16)))                                                                  \
    for (int i_ = 0; i_ < 16; i_++)                                                                \
      _mm_prefetch(                                                                                \
          bf16 ? (const char *)(w16 + o[i_] + pf + k) : (const char *)(w + o[i_] + pf + k), hint); \
  __m512 t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15;                     \
  LL_L(0);                                                                                         \
  LL_L(1);                                                                                         \
  LL_L(2);                                                                                         \
  LL_L(3);                                                                                         \
  LL_L(4);                                                                                         \
  LL_L(5);                                                                                         \
  LL_L(6);                                                                                         \
  LL_L(7);                                                                                         \
  LL_L(8);                                                                                         \
  LL_L(9);                                                                                         \
  LL_L(10);                                                                                        \
  LL_L(11);                                                                                        \
  LL_L(12);                                                                                        \
  LL_L(13);                                                                                        \
  LL_L(14);                                                                                        \
  LL_L(15);                                                                                        \
  LL_TRANSPOSE16()

LF_AVX512 static inline __attribute__((always_inline)) void
ll_pack512_gen(float *pt, const float *w, const uint16_t *w16, int IN, int j, int nc, int k0,
               int kc, int width, size_t pf, const int bf16) {
  for (int c0 = 0; c0 < width; c0 += 16) {
    /* rows past nc repeat the last one (their columns are never stored) */
    size_t o[16];
    for (int i = 0; i < 16; i++) o[i] = (size_t)(j + (c0 + i < nc ? c0 + i : nc - 1)) * IN + k0;
    for (int k = 0; k < kc; k += 16) {
      __mmask16 mk = kc - k < 16 ? (__mmask16)((1u << (kc - k)) - 1) : (__mmask16)0xffff;
      LL_BLOCK16(_MM_HINT_T1); /* prefetching the same rows of the next panel into L2 */
      float *d = pt + (size_t)k * width + c0;
      if (kc - k >= 16) {
#define LL_S(i) _mm512_store_ps(d + (size_t)(i)*width, r##i)
        LL_S(0);
        LL_S(1);
        LL_S(2);
        LL_S(3);
        LL_S(4);
        LL_S(5);
        LL_S(6);
        LL_S(7);
        LL_S(8);
        LL_S(9);
        LL_S(10);
        LL_S(11);
        LL_S(12);
        LL_S(13);
        LL_S(14);
        LL_S(15);
#undef LL_S
      } else { /* the k tail: only its rows (pt holds kc of them) */
        __m512 rr[16] = {r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15};
        for (int i = 0; i < kc - k; i++) _mm512_store_ps(d + (size_t)i * width, rr[i]);
      }
    }
  }
}
/* A lone row against 16 weight rows at a time with no block: each 16 x 16 block of weights,
 * loaded and transposed in registers, goes straight into the row's chain (lane c is output
 * j + c), in increasing k as ll_tile512 does. The weight rows stream in order (16 contiguous rows
 * at a time, the next 16 prefetched), as linear_few's 1x16 tile reads them, and the transpose's
 * shuffles overlap the chain's latency. Measured against the block (one thread, weights from L3,
 * in turns): at 896 x 4864 10.6-11.0 GFLOP/s against 7.4-7.8; for 2 and 3 rows the block was
 * faster (19 and 30 GFLOP/s against 14 and 16). */
LF_AVX512 static inline __attribute__((always_inline)) void
ll_row512_gen(float *out, const float *x, const float *w, const uint16_t *w16, const float *bias,
              int IN, int j0, int j1, float beta, const int bf16) {
  for (int j = j0; j < j1; j += 16) {
    int nc = j1 - j < 16 ? j1 - j : 16;
    size_t o[16];
    for (int i = 0; i < 16; i++) o[i] = (size_t)(j + (i < nc ? i : nc - 1)) * IN;
    size_t pf = j + 32 <= j1 ? (size_t)16 * IN : 0;
    __m512 a = _mm512_setzero_ps();
    for (int k = 0; k < IN; k += 16) {
      int n = IN - k < 16 ? IN - k : 16;
      __mmask16 mk = n < 16 ? (__mmask16)((1u << n) - 1) : (__mmask16)0xffff;
      LL_BLOCK16(_MM_HINT_T0); /* prefetching the next 16 rows into L1 */
#define LL_K(i)                                                                                    \
  if (n > i) a = _mm512_fmadd_ps(_mm512_set1_ps(x[k + i]), r##i, a)
      LL_K(0);
      LL_K(1);
      LL_K(2);
      LL_K(3);
      LL_K(4);
      LL_K(5);
      LL_K(6);
      LL_K(7);
      LL_K(8);
      LL_K(9);
      LL_K(10);
      LL_K(11);
      LL_K(12);
      LL_K(13);
      LL_K(14);
      LL_K(15);
#undef LL_K
    }
    float acc[16];
    _mm512_storeu_ps(acc, a);
    ll_store(out + j, acc, bias ? bias + j : NULL, nc, beta);
  }
}

LF_AVX512 static void ll_row512(float *out, const float *inp, const float *w, const uint16_t *w16,
                                const float *bias, int M, int IN, int OUT, int j0, int j1,
                                float beta) {
  (void)M, (void)OUT; /* one row */
  if (w16)
    ll_row512_gen(out, inp, NULL, w16, bias, IN, j0, j1, beta, 1);
  else
    ll_row512_gen(out, inp, w, NULL, bias, IN, j0, j1, beta, 0);
}
#undef LL_BLOCK16
#undef LL_L
#undef LL_TRANSPOSE16
#undef LL_SHUF
#undef LL_UNPACK

LF_AVX512 static void ll_pack512(float *pt, const float *w, const uint16_t *w16, int IN, int j,
                                 int nc, int k0, int kc, int width, int nxt) {
  size_t pf = nc == width && nxt ? (size_t)width * IN : 0; /* elements to the next panel */
  if (w16)
    ll_pack512_gen(pt, NULL, w16, IN, j, nc, k0, kc, width, pf, 1);
  else
    ll_pack512_gen(pt, w, NULL, IN, j, nc, k0, kc, width, pf, 0);
}

/* AVX-512 tile: R (a constant, <= 12) rows x P (a constant: 1 or 2, or 4 with R <= 3) panels of
 * 16 columns, up to 24 sums in registers (a<i>, b<i>, c<i>, d<i>: panels 0-3 of row i), the
 * inputs broadcast from memory. 4 panels give a lone row 4 independent chains (latency-bound
 * otherwise: each fused multiply-add waits for the previous one of its output). */
LF_AVX512 static inline __attribute__((always_inline)) void
ll_tile512_rp(float *acc, const float *x, int IN, const float *pt, int kc, const int R,
              const int P) {
  const int width = 16 * P;
  __m512 z = _mm512_setzero_ps();
#define LL_DECL(i)                                                                                 \
  __m512 a##i = R > i ? _mm512_loadu_ps(acc + i * width) : z;                                      \
  __m512 b##i = R > i && P > 1 ? _mm512_loadu_ps(acc + i * width + 16) : z;                        \
  const float *x##i = x + (size_t)(R > i ? i : 0) * IN
#define LL_DECL4(i)                                                                                \
  LL_DECL(i);                                                                                      \
  __m512 c##i = R > i && P > 2 ? _mm512_loadu_ps(acc + i * width + 32) : z;                        \
  __m512 d##i = R > i && P > 2 ? _mm512_loadu_ps(acc + i * width + 48) : z
  LL_DECL4(0);
  LL_DECL4(1);
  LL_DECL4(2);
  LL_DECL(3);
  LL_DECL(4);
  LL_DECL(5);
  LL_DECL(6);
  LL_DECL(7);
  LL_DECL(8);
  LL_DECL(9);
  LL_DECL(10);
  LL_DECL(11);
#undef LL_DECL4
#undef LL_DECL
#define LL_FMA(i)                                                                                  \
  if (R > i) {                                                                                     \
    __m512 v = _mm512_set1_ps(x##i[k]);                                                            \
    a##i = _mm512_fmadd_ps(v, p0, a##i);                                                           \
    if (P > 1) b##i = _mm512_fmadd_ps(v, p1, b##i);                                                \
  }
#define LL_FMA4(i)                                                                                 \
  if (R > i) {                                                                                     \
    __m512 v = _mm512_set1_ps(x##i[k]);                                                            \
    a##i = _mm512_fmadd_ps(v, p0, a##i);                                                           \
    if (P > 1) b##i = _mm512_fmadd_ps(v, p1, b##i);                                                \
    if (P > 2) c##i = _mm512_fmadd_ps(v, p2, c##i), d##i = _mm512_fmadd_ps(v, p3, d##i);           \
  }
  for (int k = 0; k < kc; k++) {
    const float *pk = pt + (size_t)k * width;
    __m512 p0 = _mm512_load_ps(pk), p1 = P > 1 ? _mm512_load_ps(pk + 16) : z;
    __m512 p2 = P > 2 ? _mm512_load_ps(pk + 32) : z, p3 = P > 2 ? _mm512_load_ps(pk + 48) : z;
    LL_FMA4(0);
    LL_FMA4(1);
    LL_FMA4(2);
    LL_FMA(3);
    LL_FMA(4);
    LL_FMA(5);
    LL_FMA(6);
    LL_FMA(7);
    LL_FMA(8);
    LL_FMA(9);
    LL_FMA(10);
    LL_FMA(11);
  }
#undef LL_FMA4
#undef LL_FMA
#define LL_ST(i)                                                                                   \
  if (R > i) {                                                                                     \
    _mm512_storeu_ps(acc + i * width, a##i);                                                       \
    if (P > 1) _mm512_storeu_ps(acc + i * width + 16, b##i);                                       \
  }
#define LL_ST4(i)                                                                                  \
  LL_ST(i);                                                                                        \
  if (R > i && P > 2) {                                                                            \
    _mm512_storeu_ps(acc + i * width + 32, c##i);                                                  \
    _mm512_storeu_ps(acc + i * width + 48, d##i);                                                  \
  }
  LL_ST4(0);
  LL_ST4(1);
  LL_ST4(2);
  LL_ST(3);
  LL_ST(4);
  LL_ST(5);
  LL_ST(6);
  LL_ST(7);
  LL_ST(8);
  LL_ST(9);
  LL_ST(10);
  LL_ST(11);
#undef LL_ST4
#undef LL_ST
}

#define LL_CASE(r)                                                                                 \
  case r:                                                                                          \
    if (width == 64 && r <= 3)                                                                     \
      ll_tile512_rp(acc, x, IN, pt, kc, r, 4);                                                     \
    else if (width == 32)                                                                          \
      ll_tile512_rp(acc, x, IN, pt, kc, r, 2);                                                     \
    else                                                                                           \
      ll_tile512_rp(acc, x, IN, pt, kc, r, 1);                                                     \
    return

/* width 64 only with R <= 3 (ll_drive) */
LF_AVX512 static void ll_tile512(float *acc, const float *x, int IN, const float *pt, int kc, int R,
                                 int width) {
  switch (R) {
    LL_CASE(1);
    LL_CASE(2);
    LL_CASE(3);
    LL_CASE(4);
    LL_CASE(5);
    LL_CASE(6);
    LL_CASE(7);
    LL_CASE(8);
    LL_CASE(9);
    LL_CASE(10);
    LL_CASE(11);
    LL_CASE(12);
  }
}
#undef LL_CASE
#endif

struct ll_form {
  ll_pack_fn *pack;
  ll_tile_fn *tile;
  int rmax;  /* rows per tile */
  int wide3; /* 1: up to 3 rows take 64 columns at a time (4 chains for a lone row) */
  /* NULL, or up to LL_FEW rows without the block (ll_row512) */
  void (*few)(float *, const float *, const float *, const uint16_t *, const float *, int, int, int,
              int, int, float);
};

static void ll_drive(const struct ll_form *f, float *out, const float *inp, const float *w,
                     const uint16_t *w16, const float *bias, int M, int IN, int OUT, int j0, int j1,
                     float beta) {
  float pt[LL_KC * 32] __attribute__((aligned(64)));
  float acc[LL_ROWS * 32] __attribute__((aligned(64)));
  if (f->few && M <= LL_FEW) {
    f->few(out, inp, w, w16, bias, M, IN, OUT, j0, j1, beta);
    return;
  }
  for (int m0 = 0; m0 < M; m0 += LL_ROWS) {
    int mr = M - m0 < LL_ROWS ? M - m0 : LL_ROWS;
    int nb = (mr + f->rmax - 1) / f->rmax; /* row tiles of even sizes */
    const float *x = inp + (size_t)m0 * IN;
    int group = f->wide3 && mr <= 3 ? 64 : 32, kcmax = LL_KC * 32 / group;
    for (int j = j0; j < j1; j += group) {
      int nc = j1 - j < group ? j1 - j : group, width = (nc + 15) / 16 * 16;
      width = width == 48 ? 64 : width;
      memset(acc, 0, sizeof(float) * (size_t)mr * width);
      for (int k0 = 0; k0 < IN; k0 += kcmax) {
        int kc = IN - k0 < kcmax ? IN - k0 : kcmax;
        f->pack(pt, w, w16, IN, j, nc, k0, kc, width, j + 2 * group <= j1);
        for (int b = 0, r0 = 0; b < nb; b++) {
          int R = mr / nb + (b < mr % nb);
          f->tile(acc + (size_t)r0 * width, x + (size_t)r0 * IN + k0, IN, pt, kc, R, width);
          r0 += R;
        }
      }
      for (int m = 0; m < mr; m++)
        ll_store(out + (size_t)(m0 + m) * OUT + j, acc + (size_t)m * width, bias ? bias + j : NULL,
                 nc, beta);
    }
  }
}

static const struct ll_form *ll_form_now(void) {
  static const struct ll_form forms[] = {
      {ll_pack_scalar, ll_tile_portable, 2, 0, NULL},
#ifdef LF_X86
      {ll_pack_scalar, ll_tile_portable_fma, 2, 0, NULL},
      {ll_pack256, ll_tile256, 6, 0, NULL},
      {ll_pack512, ll_tile512, 12, 1, ll_row512},
#endif
  };
  return &forms[lf_form()];
}

#ifdef LF_X86
/* ---- rows in the lanes (AVX-512 from LR_MIN rows, AVX2 from LR2_MIN): no weight transposed --- */

/* The same chains as ll_drive (each output fmaf's chain over k in increasing order from +0, then
 * ll_store's bias and beta), with the input rows in the lanes instead of the outputs: the rows of
 * inp (64 at a time) are transposed once per call into xt (xt[k * mp + m], by ll_pack512: mp a
 * multiple of 16, rows past M repeating the last one, never stored), and each weight row is read
 * in place and in order, one weight broadcast per k against V vectors of 16 rows: tiles of V x J
 * sums in registers over the whole of IN (V = mp / 16; J weight rows: 6 for 4 vectors, 8 for 3,
 * 12 for 2, 8 for 1). No weight is transposed (linear_lanes' block costs 64 shuffles per 16 x 16
 * weights, and its pack from memory did not overlap the tiles' arithmetic: bench/README.md) and
 * float32 sum leaves its register before the end of its row. BF16 weights from LR_MIN16 rows:
 * each tile's J weight rows widened into a float32 buffer, by the tile before it beside its own
 * multiply-adds (lr_ahead512; the first tile of a call by lr_widen512 before it), the tile after
 * that prefetched into L2 meanwhile (perf put 12% of lr_drive's samples on the widening's first
 * touch of memory without a prefetch, 2.5% with; widened whole before each tile, lr_widen512
 * took 8.7% of a Xeon's decoding, that tile's loads from L2 overlapping nothing), and the rows
 * in chunks of at most LINEAR_LANES_KC inputs (lr_kc), each tile's sums carried in s from chunk
 * to chunk: at the down projection's 4864 inputs a tile's 6 widened rows (117 KB) left L1 and
 * the copy of the rows (1.2 MB) crowded L2 (one thread, Xeon, [4864 -> 896] at 64 rows, in one
 * process in turns: chunks of 512-2432 within 1% of each other, 1.05-1.08x whole rows; 128 or
 * 256, 0.91-0.96x). On Zen 4, 0.5B, LoRA on a BF16 base, batch 64: 171.0-172.7
 * -> 178.0-179.7 tok/s against the block, and batch 16 no faster (119.4 / 121.4 against 119.3 /
 * 129.1; one thread at 16 rows with the rows transposed per call, 0.84-0.88x), so fewer rows stay
 * on the block (on the Xeon, 256 k at a time: 0.87-0.93x at 16 rows, 0.95-1.36x at 64;
 * docs/ENGINE.md). xt (64 IN floats) is this thread's, kept from call to call (lr_xt); LR_PF:
 * floats ahead that each weight row is prefetched (L1). */
enum {
  LR_MIN = 16,
  LR_MIN16 = 49,
  LR2_MIN = 49,
  LR2_MAX_IN = 2048,
  LR_COLS = 96,
  LR_CB = 48,
  LR_PF = 1024
};

static pthread_key_t lr_key;
static pthread_once_t lr_once = PTHREAD_ONCE_INIT;
static _Thread_local struct {
  float *p;
  size_t n;
} lr_ws;
static void lr_key_new(void) {
  if (pthread_key_create(&lr_key, free)) lr_key = (pthread_key_t)-1;
}

/* This thread's buffer of at least n floats (64-byte aligned), freed when the thread ends; NULL
 * without memory. */
static float *lr_xt(size_t n) {
  if (lr_ws.n >= n) return lr_ws.p;
  pthread_once(&lr_once, lr_key_new);
  if (lr_key == (pthread_key_t)-1) return NULL;
  float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!p) return NULL;
  free(lr_ws.p);
  lr_ws.p = p, lr_ws.n = n;
  pthread_setspecific(lr_key, p);
  return p;
}

/* One tile's work (lr_form's tile): the sums s[j * 64 + m] (j < nj <= J, m < 16 V) of weight
 * rows j (rows past nj repeat the last, their sums unused) against the rows' copy xt over kn
 * inputs, from +0, or from s's own values where add (a later chunk of k: the same chains, carried
 * exactly). The next tile's rows (nx, NULL where none; row stride nxs, nnj rows of nkn inputs):
 * float32 rows are prefetched into L1 as this tile's own run out; BF16 rows are widened into nwb
 * (row stride nkn) beside this tile's multiply-adds where nwb, and the rows of the tile after
 * them (nnx, nnnj rows of nnkn inputs, row stride nxs) prefetched into L2; without nwb the next
 * rows themselves go to L2. */
struct lr_arg {
  float *s;
  const float *xt, *w; /* the copy at the chunk's first input; the weight rows (BF16: widened) */
  size_t ws, nxs;      /* w's row stride; the next rows' */
  int mp, V, kn, nj, add, bf16;
  const void *nx;
  int nnj, nkn;
  float *nwb;
  const uint16_t *nnx;
  int nnnj, nnkn;
};

#define LR_A(v, j) a##v##_##j
#define LR_DJ(j)                                                                                   \
  __m512 LR_A(0, j) = z, LR_A(1, j) = z, LR_A(2, j) = z, LR_A(3, j) = z;                           \
  if (J > j && a->add) {                                                                           \
    LR_A(0, j) = _mm512_load_ps(s + j * 64);                                                       \
    if (V > 1) LR_A(1, j) = _mm512_load_ps(s + j * 64 + 16);                                       \
    if (V > 2) LR_A(2, j) = _mm512_load_ps(s + j * 64 + 32);                                       \
    if (V > 3) LR_A(3, j) = _mm512_load_ps(s + j * 64 + 48);                                       \
  }                                                                                                \
  const float *wj##j = w + (J > j && j < nj ? j : nj - 1) * a->ws
/* row j's line LR_PF floats on (every 16 k), or the next tile's row j's past this chunk's end */
#define LR_PJ(j)                                                                                   \
  if (J > j) {                                                                                     \
    int kp = k + LR_PF;                                                                            \
    if (kp < kn)                                                                                   \
      _mm_prefetch((const char *)(wj##j + kp), _MM_HINT_T0);                                       \
    else if (j < a->nnj && kp - kn < a->nkn)                                                       \
      _mm_prefetch((const char *)((const float *)a->nx + j * a->nxs + kp - kn), _MM_HINT_T0);      \
  }
#define LR_FJ(j)                                                                                   \
  if (J > j) {                                                                                     \
    __m512 b = _mm512_set1_ps(wj##j[k]);                                                           \
    LR_A(0, j) = _mm512_fmadd_ps(x0, b, LR_A(0, j));                                               \
    if (V > 1) LR_A(1, j) = _mm512_fmadd_ps(x1, b, LR_A(1, j));                                    \
    if (V > 2) LR_A(2, j) = _mm512_fmadd_ps(x2, b, LR_A(2, j));                                    \
    if (V > 3) LR_A(3, j) = _mm512_fmadd_ps(x3, b, LR_A(3, j));                                    \
  }
#define LR_SJ(j)                                                                                   \
  if (J > j) {                                                                                     \
    _mm512_store_ps(s + j * 64, LR_A(0, j));                                                       \
    if (V > 1) _mm512_store_ps(s + j * 64 + 16, LR_A(1, j));                                       \
    if (V > 2) _mm512_store_ps(s + j * 64 + 32, LR_A(2, j));                                       \
    if (V > 3) _mm512_store_ps(s + j * 64 + 48, LR_A(3, j));                                       \
  }
#define LR_ALL(M)                                                                                  \
  M(0);                                                                                            \
  M(1);                                                                                            \
  M(2);                                                                                            \
  M(3);                                                                                            \
  M(4);                                                                                            \
  M(5);                                                                                            \
  M(6);                                                                                            \
  M(7);                                                                                            \
  M(8);                                                                                            \
  M(9);                                                                                            \
  M(10);                                                                                           \
  M(11)

/* Every 32 k, the line at k of each of n BF16 rows (row stride rs, kn inputs) prefetched into L2 */
static inline __attribute__((always_inline)) void lr_rows_l2(const uint16_t *rows, size_t rs, int n,
                                                             int kn, int k) {
  if (!(k & 31) && k < kn)
    for (int r = 0; r < n; r++) _mm_prefetch((const char *)(rows + r * rs + k), _MM_HINT_T1);
}

/* The next tile's BF16 rows [k, k + 16) widened into nwb (exact), and every 32 k the line of the
 * tile after them at k prefetched into L2 */
LF_AVX512 static inline __attribute__((always_inline)) void lr_ahead512(const struct lr_arg *a,
                                                                        int k) {
  const uint16_t *nx = a->nx;
  if (k + 16 <= a->nkn) {
    for (int r = 0; r < a->nnj; r++) {
      __m256i h = _mm256_loadu_si256((const __m256i *)(nx + r * a->nxs + k));
      _mm512_storeu_ps(a->nwb + (size_t)r * a->nkn + k,
                       _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
  } else if (k < a->nkn) {
    for (int r = 0; r < a->nnj; r++)
      bf16_to_f32(a->nwb + (size_t)r * a->nkn + k, nx + r * a->nxs + k, (size_t)(a->nkn - k));
  }
  lr_rows_l2(a->nnx, a->nxs, a->nnnj, a->nnkn, k);
}

LF_AVX512 static inline __attribute__((always_inline)) void lr_tile(const struct lr_arg *a,
                                                                    const int V, const int J) {
  __m512 z = _mm512_setzero_ps();
  float *s = a->s;
  const float *w = a->w, *xt = a->xt;
  int kn = a->kn, nj = a->nj, mp = a->mp;
  LR_ALL(LR_DJ);
  for (int k = 0; k < kn; k++) {
    const float *xk = xt + (size_t)k * mp;
    if (!(k & 15)) {
      if (a->nwb) /* BF16, widening ahead */
        lr_ahead512(a, k);
      else if (!a->bf16) {
        LR_ALL(LR_PJ);
      } else /* BF16 widened before each tile: the next rows to L2 */
        lr_rows_l2(a->nx, a->nxs, a->nnj, a->nkn, k);
    }
    __m512 x0 = _mm512_load_ps(xk), x1 = V > 1 ? _mm512_load_ps(xk + 16) : z;
    __m512 x2 = V > 2 ? _mm512_load_ps(xk + 32) : z, x3 = V > 3 ? _mm512_load_ps(xk + 48) : z;
    LR_ALL(LR_FJ);
  }
  if (a->nwb) /* the next rows' inputs past this tile's (a shorter chunk before a longer one) */
    for (int k = (kn + 15) / 16 * 16; k < a->nkn; k += 16) lr_ahead512(a, k);
  LR_ALL(LR_SJ);
}
#undef LR_ALL
#undef LR_SJ
#undef LR_FJ
#undef LR_PJ
#undef LR_DJ
#undef LR_A

#define LR_V(v, j)                                                                                 \
  case v: lr_tile(a, v, j); return
LF_AVX512 static void lr_tile_v(const struct lr_arg *a) {
  switch (a->V) {
    LR_V(1, 8);
    LR_V(2, 12);
    LR_V(3, 8);
    LR_V(4, 6);
  }
}
#undef LR_V

/* dst[n] = the float32 of BF16 src[n] (exact), 16 at a time, the stream prefetched LR_PF on: a
 * tile's weight rows, which are contiguous, widened into an L1/L2 buffer just before the tile */
LF_AVX512 static void lr_widen512(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (!(i & 31)) _mm_prefetch((const char *)(src + i + 2 * LR_PF), _MM_HINT_T0);
    __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  if (i < n) bf16_to_f32(dst + i, src + i, n - i);
}

/* dst[k0, k1) = the float32 of BF16 src[k0, k1) (exact), 8 at a time */
LF_AVX2 static inline __attribute__((always_inline)) void
lr_widen256_k(float *dst, const uint16_t *src, int k0, int k1) {
  int k = k0;
  for (; k + 8 <= k1; k += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(src + k));
    _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  if (k < k1) bf16_to_f32(dst + k, src + k, (size_t)(k1 - k));
}

/* Rows in the lanes on AVX2, from LR2_MIN rows: lr_tile's chains with 8 rows in a ymm, a tile
 * 16 rows (two vectors) x 6 weight rows (12 sums in registers over a chunk of k, carried in s
 * from chunk to chunk as lr_tile's; per k 2 loads of the rows and 6 broadcasts of weights: the
 * shape of ll_tile256), the mp / 16 groups of rows one after another against the same weight
 * rows (from L1, or L2 at long IN). No weight is
 * transposed: on AVX2 the block's pack (8 x 8 transposes, 3 shuffles a vector) was 8% of a 0.5B
 * decoding step at batch 64 with LoRA on a BF16 base. The next tile's BF16 rows (nx) or the
 * tile's own float32 rows are prefetched during the first group; the next tile's BF16 rows are
 * widened (into nwb, nnj rows) during the last, beside its multiply-adds (widened whole between
 * tiles they were 4.6-5.9% of the samples, loads from L2 that nothing overlapped; one thread,
 * [896 -> 4864], M 64, in turns: 98.3-100.2 -> 101.6-101.7 GFLOP/s). Float32 rows of up to
 * lr2_max_in() inputs only (LR2_MAX_IN on Zen 4): every tile streams the whole copy of the rows
 * (64 IN floats), which at the down projection's 4864 (1.2 MB) left L2. That decoding (AVX2
 * emulated on Zen 4 by DAPOD_KERNELS_ISA=avx2, 2 threads, in turns): 157.4-158.9 tok/s with the
 * block, 162.2-153.7 with rows in the lanes at every IN, 167.3-170.4 up to 2048 inputs; float32
 * weights without LoRA 159.5-160.7 -> 158.7-160.2. BF16 rows of any length, in chunks (lr_kmax).
 * Tried: the groups of rows taking k in blocks of 128-512 (a block's 6 weight rows kept in L1
 * for all four groups, the sums carried between blocks): 0.87-0.96x at 896 inputs (Zen 5). */
#define L2_DJ(j)                                                                                   \
  __m256 p##j = z, q##j = z;                                                                       \
  const float *wj##j = w + (size_t)(j < nj ? j : nj - 1) * a->ws
#define L2_PJ(j) _mm_prefetch((const char *)(wj##j + k + LR_PF), _MM_HINT_T0)
#define L2_FJ(j)                                                                                   \
  {                                                                                                \
    __m256 b = _mm256_broadcast_ss(wj##j + k);                                                     \
    p##j = _mm256_fmadd_ps(x0, b, p##j), q##j = _mm256_fmadd_ps(x1, b, q##j);                      \
  }
#define L2_SJ(j)                                                                                   \
  _mm256_storeu_ps(s + (j)*64 + 16 * g, p##j), _mm256_storeu_ps(s + (j)*64 + 16 * g + 8, q##j)
#define L2_LJ(j)                                                                                   \
  p##j = _mm256_loadu_ps(s + (j)*64 + 16 * g), q##j = _mm256_loadu_ps(s + (j)*64 + 16 * g + 8)
/* M(j) for the 6 weight rows of an AVX2 tile, or the 6 columns of lr_adapt512 / lr_adapt256 */
#define LR_SIX(M)                                                                                  \
  M(0);                                                                                            \
  M(1);                                                                                            \
  M(2);                                                                                            \
  M(3);                                                                                            \
  M(4);                                                                                            \
  M(5)
/* s[j * 64 + m] (j < 6; rows past nj repeat the last, their sums unused) as lr_tile_v's */
LF_AVX2 static void lr_tile256(const struct lr_arg *a) {
  float *s = a->s, *nwb = a->nwb;
  const float *w = a->w, *xt = a->xt;
  const uint16_t *nx = a->bf16 ? a->nx : NULL;
  int mp = a->mp, kn = a->kn, nkn = a->nkn, nj = a->nj, nnj = a->nnj;
  const __m256 z = _mm256_setzero_ps();
  for (int g = 0; g < mp / 16; g++) {
    const uint16_t *ahead = nwb && g == mp / 16 - 1 ? nx : NULL;
    LR_SIX(L2_DJ);
    if (a->add) { /* a later chunk: the chains go on from s */
      LR_SIX(L2_LJ);
    }
    const float *xg = xt + 16 * g;
    for (int k0 = 0; k0 < kn; k0 += 16) {
      int k1 = kn - k0 < 16 ? kn : k0 + 16;
      if (!g) {
        int k = k0;
        if (nx) { /* the next tile's BF16 rows to L2, a line of each every 32 k */
          if (!(k & 31) && k < nkn)
            for (int r = 0; r < nnj; r++)
              _mm_prefetch((const char *)(nx + r * a->nxs + k), _MM_HINT_T1);
        } else
          LR_SIX(L2_PJ);
      }
      if (ahead) { /* the next tile's rows widened beside this one's last group */
        int e = k1 < nkn ? k1 : nkn;
        if (k0 < e)
          for (int r = 0; r < nnj; r++)
            lr_widen256_k(nwb + (size_t)r * nkn, ahead + (size_t)r * a->nxs, k0, e);
      }
      /* unrolled: per k the 12 fused multiply-adds with 8 loads leave little room for the
       * loop's own instructions */
#pragma GCC unroll 4
      for (int k = k0; k < k1; k++) {
        __m256 x0 = _mm256_loadu_ps(xg + (size_t)k * mp),
               x1 = _mm256_loadu_ps(xg + (size_t)k * mp + 8);
        LR_SIX(L2_FJ);
      }
    }
    LR_SIX(L2_SJ);
  }
  if (nwb && nx && nkn > kn) /* the next rows' inputs past this tile's (a longer chunk) */
    for (int r = 0; r < nnj; r++)
      lr_widen256_k(nwb + (size_t)r * nkn, nx + (size_t)r * a->nxs, kn, nkn);
}
#undef L2_SJ
#undef L2_LJ
#undef L2_FJ
#undef L2_PJ
#undef L2_DJ

/* lr_widen512 in 8 lanes */
LF_AVX2 static void lr_widen256(float *dst, const uint16_t *src, size_t n) {
  lr_widen256_k(dst, src, 0, (int)n);
}

/* One row's 8 columns from the transposed t (bias then out's own value added where has_bias and
 * has_beta: constants at each call, so the loop over rows carries no test of them) */
#define LS_ROW(i)                                                                                  \
  if (i < n) {                                                                                     \
    float *o = out + (size_t)(m + i) * OUT + c;                                                    \
    __m256 r = has_bias ? _mm256_add_ps(t##i, b) : t##i;                                           \
    if (has_beta) r = _mm256_add_ps(_mm256_loadu_ps(o), r);                                        \
    _mm256_storeu_ps(o, r);                                                                        \
  }
LF_AVX2 static inline __attribute__((always_inline)) void
lr_store256_k(float *out, int OUT, const float *s, int mr, int nc, const float *bias,
              const int has_bias, const int has_beta) {
  int c = 0;
  for (; c + 8 <= nc; c += 8) {
    __m256 b = has_bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
    for (int m = 0; m < mr; m += 8) {
      const float *p = s + (size_t)c * 64 + m;
      __m256 r0 = _mm256_load_ps(p), r1 = _mm256_load_ps(p + 64), r2 = _mm256_load_ps(p + 128),
             r3 = _mm256_load_ps(p + 192), r4 = _mm256_load_ps(p + 256),
             r5 = _mm256_load_ps(p + 320), r6 = _mm256_load_ps(p + 384),
             r7 = _mm256_load_ps(p + 448);
      __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1),
             u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3),
             u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5),
             u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
      __m256 v0 = _mm256_shuffle_ps(u0, u2, 0x44), v1 = _mm256_shuffle_ps(u0, u2, 0xee),
             v2 = _mm256_shuffle_ps(u1, u3, 0x44), v3 = _mm256_shuffle_ps(u1, u3, 0xee),
             v4 = _mm256_shuffle_ps(u4, u6, 0x44), v5 = _mm256_shuffle_ps(u4, u6, 0xee),
             v6 = _mm256_shuffle_ps(u5, u7, 0x44), v7 = _mm256_shuffle_ps(u5, u7, 0xee);
      /* ti: row m + i, columns c to c + 7 */
      __m256 t0 = _mm256_permute2f128_ps(v0, v4, 0x20), t1 = _mm256_permute2f128_ps(v1, v5, 0x20),
             t2 = _mm256_permute2f128_ps(v2, v6, 0x20), t3 = _mm256_permute2f128_ps(v3, v7, 0x20),
             t4 = _mm256_permute2f128_ps(v0, v4, 0x31), t5 = _mm256_permute2f128_ps(v1, v5, 0x31),
             t6 = _mm256_permute2f128_ps(v2, v6, 0x31), t7 = _mm256_permute2f128_ps(v3, v7, 0x31);
      int n = mr - m;
      LS_ROW(0);
      LS_ROW(1);
      LS_ROW(2);
      LS_ROW(3);
      LS_ROW(4);
      LS_ROW(5);
      LS_ROW(6);
      LS_ROW(7);
    }
  }
  for (; c < nc; c++)
    for (int m = 0; m < mr; m++) {
      float r = s[(size_t)c * 64 + m], *o = out + (size_t)m * OUT + c;
      if (has_bias) r += bias[c];
      if (has_beta) r = *o + r;
      *o = r;
    }
}
#undef LS_ROW

/* out[m][c] (m < mr, c < nc; out's rows OUT apart) from the sums s[c * 64 + m] as ll_store writes
 * them (the sum, + bias[c] where bias, then out's own value + that where beta: lf_store's
 * operations, lane by lane), 8 x 8 at a time transposed in registers: both forms of rows in the
 * lanes (AVX-512's processors have AVX2). The transpose into a buffer and ll_store after it (in
 * the baseline's 4 lanes, through the stack) were 3.2% of an AVX2 LoRA job's generation (perf).
 * The rows' 8 transposed vectors go straight to their stores, the bias and beta decided once per
 * call (in an array, with the tests in the loop over rows, GCC kept them on the stack: perf put
 * half of this function's samples on that loop). */
LF_AVX2 static void lr_store256(float *out, int OUT, const float *s, int mr, int nc,
                                const float *bias, float beta) {
  if (bias && beta != 0.0f)
    lr_store256_k(out, OUT, s, mr, nc, bias, 1, 1);
  else if (bias)
    lr_store256_k(out, OUT, s, mr, nc, bias, 1, 0);
  else if (beta != 0.0f)
    lr_store256_k(out, OUT, s, mr, nc, NULL, 0, 1);
  else
    lr_store256_k(out, OUT, s, mr, nc, NULL, 0, 0);
}

/* The adapter's chains of a block's columns [0, nc) added to its sums before they are stored, as
 * linear_few_narrow (beta 1) adds them to the stored outputs after: s[c * 64 + m] = (s + bias[c])
 * + (one chain of fused multiply-adds of xat[k * 64 + m] b[c * r + k] over k < r in increasing
 * order from +0), where s holds the rows of V vectors; the same bits (fma's product does not
 * depend on its operands' order). AVX-512: 6 columns x V vectors of 16 rows at a time. B's rows
 * are prefetched by the block's tiles (lr_drive): without it each block's first touch of them
 * came from memory, and this took as long as linear_few_narrow. 0.5B, LoRA r 16, batch 64, Zen 5,
 * `perf` of the old and new bench_engine --decode in turns: the adapters' B products 0.022-0.027
 * -> 0.011-0.015 of the tile's samples (AVX2 kernels: 0.013-0.017 -> 0.010-0.012), now at the
 * tile's own rate (0.85% of the step's multiply-adds, 0.9-1.0% of its samples); the O and down
 * projections (beta 1) keep linear_few_narrow. */
#define LA_A(v, j) a##v##_##j
#define LA_D(j)                                                                                    \
  __m512 LA_A(0, j) = z, LA_A(1, j) = z, LA_A(2, j) = z, LA_A(3, j) = z;                           \
  const float *bj##j = b + (size_t)(c + (j < nj ? j : nj - 1)) * r
#define LA_F(j)                                                                                    \
  {                                                                                                \
    __m512 w = _mm512_set1_ps(bj##j[k]);                                                           \
    LA_A(0, j) = _mm512_fmadd_ps(x0, w, LA_A(0, j));                                               \
    if (V > 1) LA_A(1, j) = _mm512_fmadd_ps(x1, w, LA_A(1, j));                                    \
    if (V > 2) LA_A(2, j) = _mm512_fmadd_ps(x2, w, LA_A(2, j));                                    \
    if (V > 3) LA_A(3, j) = _mm512_fmadd_ps(x3, w, LA_A(3, j));                                    \
  }
#define LA_PUT(v, j)                                                                               \
  if (V > v) {                                                                                     \
    __m512 t = _mm512_load_ps(p + 16 * v);                                                         \
    if (bias) t = _mm512_add_ps(t, bb);                                                            \
    _mm512_store_ps(p + 16 * v, _mm512_add_ps(t, LA_A(v, j)));                                     \
  }
#define LA_S(j)                                                                                    \
  if (j < nj) {                                                                                    \
    float *p = s + (size_t)(c + j) * 64;                                                           \
    __m512 bb = bias ? _mm512_set1_ps(bias[c + j]) : z;                                            \
    LA_PUT(0, j);                                                                                  \
    LA_PUT(1, j);                                                                                  \
    LA_PUT(2, j);                                                                                  \
    LA_PUT(3, j);                                                                                  \
  }
LF_AVX512 static inline __attribute__((always_inline)) void
lr_adapt512_k(float *s, const float *xat, const float *b, int r, int nc, const float *bias,
              const int V) {
  const __m512 z = _mm512_setzero_ps();
  for (int c = 0; c < nc; c += 6) {
    int nj = nc - c < 6 ? nc - c : 6;
    LR_SIX(LA_D);
    for (int k = 0; k < r; k++) {
      const float *xk = xat + (size_t)k * 64;
      __m512 x0 = _mm512_loadu_ps(xk), x1 = V > 1 ? _mm512_loadu_ps(xk + 16) : z;
      __m512 x2 = V > 2 ? _mm512_loadu_ps(xk + 32) : z, x3 = V > 3 ? _mm512_loadu_ps(xk + 48) : z;
      LR_SIX(LA_F);
    }
    LR_SIX(LA_S);
  }
}
#undef LA_S
#undef LA_PUT
#undef LA_F
#undef LA_D
#undef LA_A

LF_AVX512 static void lr_adapt512(float *s, const float *xat, const float *b, int r, int nc, int V,
                                  const float *bias) {
  switch (V) {
  case 1: lr_adapt512_k(s, xat, b, r, nc, bias, 1); return;
  case 2: lr_adapt512_k(s, xat, b, r, nc, bias, 2); return;
  case 3: lr_adapt512_k(s, xat, b, r, nc, bias, 3); return;
  default: lr_adapt512_k(s, xat, b, r, nc, bias, 4); return;
  }
}

/* lr_adapt512 on AVX2: 6 columns x 16 rows (two ymm) at a time, the V groups of 16 rows one after
 * another */
#define LA_D(j)                                                                                    \
  __m256 p##j = z, q##j = z;                                                                       \
  const float *bj##j = b + (size_t)(c + (j < nj ? j : nj - 1)) * r
#define LA_F(j)                                                                                    \
  {                                                                                                \
    __m256 w = _mm256_broadcast_ss(bj##j + k);                                                     \
    p##j = _mm256_fmadd_ps(x0, w, p##j), q##j = _mm256_fmadd_ps(x1, w, q##j);                      \
  }
#define LA_S(j)                                                                                    \
  if (j < nj) {                                                                                    \
    float *p = s + (size_t)(c + j) * 64 + 16 * g;                                                  \
    __m256 t0 = _mm256_load_ps(p), t1 = _mm256_load_ps(p + 8);                                     \
    if (bias) {                                                                                    \
      __m256 bb = _mm256_set1_ps(bias[c + j]);                                                     \
      t0 = _mm256_add_ps(t0, bb), t1 = _mm256_add_ps(t1, bb);                                      \
    }                                                                                              \
    _mm256_store_ps(p, _mm256_add_ps(t0, p##j)), _mm256_store_ps(p + 8, _mm256_add_ps(t1, q##j));  \
  }
LF_AVX2 static void lr_adapt256(float *s, const float *xat, const float *b, int r, int nc, int V,
                                const float *bias) {
  const __m256 z = _mm256_setzero_ps();
  for (int c = 0; c < nc; c += 6) {
    int nj = nc - c < 6 ? nc - c : 6;
    for (int g = 0; g < V; g++) {
      LR_SIX(LA_D);
      for (int k = 0; k < r; k++) {
        __m256 x0 = _mm256_loadu_ps(xat + (size_t)k * 64 + 16 * g),
               x1 = _mm256_loadu_ps(xat + (size_t)k * 64 + 16 * g + 8);
        LR_SIX(LA_F);
      }
      LR_SIX(LA_S);
    }
  }
}
#undef LR_SIX
#undef LA_S
#undef LA_F
#undef LA_D

/* A processor's rows in the lanes: its tile (lr_arg), the widening of BF16 rows, the transpose
 * of the rows into xt and the weight rows a tile by V (LR_CB a multiple of each); the fewest rows
 * of a block it takes, for float32 and for BF16 weights. */
struct lr_form {
  void (*tile)(const struct lr_arg *);
  void (*adapt)(float *, const float *, const float *, int, int, int, const float *);
  void (*widen)(float *, const uint16_t *, size_t);
  ll_pack_fn *pack;
  int jv[5], min, min16;
  int max_in; /* 0, or the longest rows taken whole (longer: the block, or BF16 rows in chunks
               * where kmax); -1: lr2_max_in() */
  int ahead;  /* 1: the tile widens the next tile's BF16 rows itself (after the first widen) */
  int kmax;   /* 0: whole rows a tile; else chunks of at most kmax inputs (lr_kc); -1: lr_kmax */
};

static const struct lr_form lr_avx2 = {
    lr_tile256, lr_adapt256, lr_widen256, ll_pack256, {0, 6, 6, 6, 6}, LR2_MIN, LR2_MIN, -1, 1, -1};
static const struct lr_form lr_avx512 = {
    lr_tile_v, lr_adapt512, lr_widen512, ll_pack512, {0, 8, 12, 8, 6},
    LR_MIN,    LR_MIN16,    0,           1,          LINEAR_LANES_KC};
/* lr_avx2 and lr_avx512 with linear_lanes_set_form's choices, where lr_set */
static struct lr_form lr_avx2_set, lr_avx512_set;
static int lr_set;

/* NULL where the block takes every call (the portable forms) */
static const struct lr_form *lr_form_now(void) {
  int f = lf_form();
  return f == 3   ? (lr_set ? &lr_avx512_set : &lr_avx512)
         : f == 2 ? (lr_set ? &lr_avx2_set : &lr_avx2)
                  : NULL;
}

/* AVX2's longest rows in the lanes: every tile streams the whole copy of the rows (64 IN floats),
 * which is to fit in half of this processor's L2, as measured on Zen 4's 1 MiB (2048 inputs: the
 * down projection's 4864 ran slower than the block there, 896 faster); a smaller L2 takes fewer
 * (Zen 2-3's 512 KiB: 1024), a larger more. LR2_MAX_IN where the system does not say. Read once
 * (sysconf may ask the processor, which a virtual machine traps). */
static pthread_once_t lr2_once = PTHREAD_ONCE_INIT;
static int lr2_in = LR2_MAX_IN;
static void lr2_read(void) {
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 >= 64L * 1024 && l2 <= 1L << 30) lr2_in = (int)(l2 / 512);
}
static int lr2_max_in(void) {
  pthread_once(&lr2_once, lr2_read);
  return lr2_in;
}

/* f's longest chunk of BF16 inputs (0: whole rows): its kmax, or where -1 (AVX2) LINEAR_LANES_KC
 * or lr2_max_in() if less, since each tile streams its chunk's copy of the rows (64 kc floats) as
 * AVX2's whole rows did. Chunks let AVX2 take the down projection's 4864 inputs in the lanes
 * instead of the block (Zen 5, one thread, AVX2 kernels, [4864 -> 896] at 64 rows, in one
 * process in turns: the block 107.9-112.4 GFLOP/s, chunks of 1024 118.0-122.1, of 512 116.0-119.5,
 * of 2048 117.9-121.6). */
static int lr_kmax(const struct lr_form *f) {
  if (f->kmax >= 0) return f->kmax;
  int l2 = lr2_max_in();
  return l2 < LINEAR_LANES_KC ? l2 : LINEAR_LANES_KC;
}

/* The inputs of a chunk: BF16 rows' IN in equal chunks of at most lr_kmax (whole rows without
 * one), rounded up to 16; float32 rows whole (read in place from memory, they stream best whole:
 * chunks of 1024 at [4864 -> 896] ran 0.92-0.97x) */
static int lr_kc(const struct lr_form *f, int IN, int bf16) {
  int kmax = lr_kmax(f);
  if (!bf16 || !kmax || IN <= kmax) return IN;
  int n = (IN + kmax - 1) / kmax;
  return ((IN + n - 1) / n + 15) / 16 * 16;
}

/* A tile of lr_drive's: columns [jb + c, + nj) over inputs [k0, + kn); in lr_drive's order the
 * tiles of a block of LR_CB columns, a chunk of inputs after another, then the next block */
struct lr_step {
  int jb, k0, c, nj, kn, ncb;
};

static void lr_step_at(struct lr_step *t, int jb, int k0, int c, int j1, int IN, int kc, int J) {
  t->jb = jb, t->k0 = k0, t->c = c;
  t->ncb = j1 - jb < LR_CB ? j1 - jb : LR_CB;
  t->nj = t->ncb - c < J ? t->ncb - c : J;
  t->kn = IN - k0 < kc ? IN - k0 : kc;
}

/* t moved on to the next tile; 0 after the last */
static int lr_step_next(struct lr_step *t, int j1, int IN, int kc, int J) {
  int jb = t->jb, k0 = t->k0, c = t->c + J;
  if (c >= t->ncb) {
    c = 0, k0 += kc;
    if (k0 >= IN) k0 = 0, jb += LR_CB;
  }
  if (jb >= j1) return 0;
  lr_step_at(t, jb, k0, c, j1, IN, kc, J);
  return 1;
}

/* Whether mr rows (a block of at most 64) take rows in the lanes: from f's fewest rows, with at
 * least 3/4 of the lanes of their vectors in use (AVX-512: 17-23 rows in 2 vectors were
 * 0.83-1.01x the block, 24 rows 0.96-1.23x, 40 rows 1.10-1.34x). */
static int lr_rows(const struct lr_form *f, int mr, int IN, int bf16) {
  return f && mr >= (bf16 ? f->min16 : f->min) && 4 * mr >= 3 * ((mr + 15) / 16 * 16) &&
         (!f->max_in || IN <= (f->max_in < 0 ? lr2_max_in() : f->max_in) || (bf16 && lr_kmax(f)));
}

/* 0 without memory for xt (nothing written). Row blocks that lr_rows refuses go to the block.
 * Columns LR_CB at a time, their inputs in chunks (lr_kc; the sums carried in s from chunk to
 * chunk): their tiles' sums (s[c * 64 + m]) stored into the rows by lr_store256. */
static int lr_drive(const struct lr_form *f, float *out, const float *inp, const float *xtp,
                    const float *w, const uint16_t *w16, const float *bias, int M, int IN, int OUT,
                    int j0, int j1, float beta, const struct lanes_adapter *ad) {
  float s[LR_CB * 64] __attribute__((aligned(64)));
  int kc = lr_kc(f, IN, w16 != NULL), jmax = 0;
  for (int v = 1; v <= 4; v++) jmax = f->jv[v] > jmax ? f->jv[v] : jmax;
  /* this call's transposes (unless xtp: the copy), then BF16 weights' widened rows: two halves,
   * the tile's and (with f->ahead) the next tile's, which the tile widens */
  size_t nx = xtp ? 0 : (size_t)64 * IN, half = w16 ? (size_t)jmax * kc : 0;
  float *buf = nx + half ? lr_xt(nx + 2 * half) : NULL, *wb = buf ? buf + nx : NULL;
  if (nx + half && !buf) return 0;
  float *wbuf[2] = {wb, wb ? wb + half : NULL};
  for (int m0 = 0; m0 < M; m0 += 64) {
    int mr = M - m0 < 64 ? M - m0 : 64, mp = (mr + 15) / 16 * 16, V = mp / 16, J = f->jv[V];
    if (!lr_rows(f, mr, IN, w16 != NULL)) {
      ll_drive(ll_form_now(), out + (size_t)m0 * OUT, inp + (size_t)m0 * IN, w, w16, bias, mr, IN,
               OUT, j0, j1, beta);
      if (ad) { /* the block's rows of the adapter, after the product */
        struct lanes_adapter rows = *ad;
        rows.xa += (size_t)m0 * ad->r;
        linear_lanes_adapter_add(out + (size_t)m0 * OUT, &rows, mr, OUT, j0, j1);
      }
      continue;
    }
    const float *xt = xtp ? xtp + (size_t)m0 * IN : buf; /* linear_lanes_prepare's block */
    if (!xtp) f->pack(buf, inp + (size_t)m0 * IN, NULL, IN, 0, mr, 0, IN, mp, 0);
    struct lr_step t, n, nn;
    lr_step_at(&t, j0, 0, 0, j1, IN, kc, J);
    int p = 0, widened = 0, more;
    do {
      if (!t.c && !t.k0) /* the block's outputs, while its tiles run */
        for (int m = 0; m < mr; m++)
          for (int c = 0; c < t.ncb; c += 16)
            __builtin_prefetch(out + (size_t)(m0 + m) * OUT + t.jb + c, 1, 3);
      if (ad && !t.k0) /* the adapter's B rows of the tile's columns, for the block's end */
        for (int i = 0; i < t.nj * ad->r; i += 16)
          __builtin_prefetch(ad->b + (size_t)(t.jb + t.c) * ad->r + i, 0, 3);
      size_t at = (size_t)(t.jb + t.c) * IN + t.k0; /* the tile's first weight */
      n = t, more = lr_step_next(&n, j1, IN, kc, J);
      nn = n;
      int more2 = more && lr_step_next(&nn, j1, IN, kc, J);
      if (w16 && !widened)
        for (int r = 0; r < t.nj; r++)
          f->widen(wbuf[p] + (size_t)r * t.kn, w16 + at + (size_t)r * IN, (size_t)t.kn);
      struct lr_arg a = {.s = s + t.c * 64,
                         .xt = xt + (size_t)t.k0 * mp,
                         .w = w16 ? wbuf[p] : w + at,
                         .ws = w16 ? (size_t)t.kn : (size_t)IN,
                         .nxs = (size_t)IN,
                         .mp = mp,
                         .V = V,
                         .kn = t.kn,
                         .nj = t.nj,
                         .add = t.k0 > 0,
                         .bf16 = w16 != NULL};
      if (more) {
        size_t nat = (size_t)(n.jb + n.c) * IN + n.k0;
        a.nx = w16 ? (const void *)(w16 + nat) : (const void *)(w + nat);
        a.nnj = n.nj, a.nkn = n.kn;
      }
      widened = f->ahead && w16 && more;
      if (widened) {
        a.nwb = wbuf[p ^ 1];
        if (more2)
          a.nnx = w16 + (size_t)(nn.jb + nn.c) * IN + nn.k0, a.nnnj = nn.nj, a.nnkn = nn.kn;
      }
      f->tile(&a);
      p ^= widened;
      if (t.c + t.nj >= t.ncb && t.k0 + t.kn >= IN) { /* the block's last tile */
        const float *bb = bias ? bias + t.jb : NULL;
        if (ad) { /* beta 0: the bias, then the adapter's chains, added in the lanes */
          f->adapt(s, ad->xat + (size_t)m0 * ad->r, ad->b + (size_t)t.jb * ad->r, ad->r, t.ncb, V,
                   bb);
          bb = NULL;
        }
        lr_store256(out + (size_t)m0 * OUT + t.jb, OUT, s, mr, t.ncb, bb, beta);
      }
      t = n;
    } while (more);
  }
  return 1;
}
#endif

/* linear_lanes' kernel for M rows on this processor: rows in the lanes (lr_drive) on AVX-512
 * where lr_rows takes them (BF16 weights: from LR_MIN16 rows) and the call has LR_COLS columns or
 * more, else the block (ll_drive). The transpose of the rows costs as much per call whatever its
 * columns: at [4864 -> 896], M = 64, one thread, in turns, calls of 48 columns (the sampler's
 * chunks of 1024 KiB) ran 0.83-0.86x the block, 96 columns 1.09x, 144 1.16x, 288 1.31x. */
static void ll_any(float *out, const float *inp, const float *w, const uint16_t *w16,
                   const float *bias, int M, int IN, int OUT, int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
#ifdef LF_X86
  if (j1 - j0 >= LR_COLS && linear_lanes_reads_copy(M, IN, w16 != NULL) &&
      lr_drive(lr_form_now(), out, inp, NULL, w, w16, bias, M, IN, OUT, j0, j1, beta, NULL))
    return;
#endif
  ll_drive(ll_form_now(), out, inp, w, w16, bias, M, IN, OUT, j0, j1, beta);
}

/* linear_lanes_prepare's copy: blocks of 64 rows as lr_drive transposes them (block b at
 * xt + 64 b IN, xt[k * mp + m]), for the blocks lr_rows takes; sized for any processor from
 * LL_XT_MIN rows (LR_MIN), so that a memory plan does not depend on the one it runs on. */
enum { LL_XT_MIN = 16 };

size_t linear_lanes_xt_floats(int M, int IN) {
  return M >= LL_XT_MIN ? (size_t)(M + 63) / 64 * 64 * (size_t)IN : 0;
}

int linear_lanes_reads_copy(int M, int IN, int bf16) {
#ifdef LF_X86
  int m1 = M < 64 ? M : 64; /* the first block (64 rows when M > 64) decides, as in ll_any */
  return M >= 1 && lr_rows(lr_form_now(), m1, IN, bf16);
#else
  (void)M, (void)IN, (void)bf16;
  return 0;
#endif
}

const float *linear_lanes_prepare_cols(float *xt, const float *inp, int M, int IN, int k0, int k1) {
#ifdef LF_X86
  const struct lr_form *f = lr_form_now();
  if (!xt || !linear_lanes_reads_copy(M, IN, 0)) return NULL;
  for (int m0 = 0; m0 < M && k0 < k1; m0 += 64) {
    int mr = M - m0 < 64 ? M - m0 : 64, mp = (mr + 15) / 16 * 16;
    if (lr_rows(f, mr, IN, 0))
      f->pack(xt + (size_t)m0 * IN + (size_t)k0 * mp, inp + (size_t)m0 * IN, NULL, IN, 0, mr, k0,
              k1 - k0, mp, 0);
  }
  return xt;
#else
  (void)xt, (void)inp, (void)M, (void)IN, (void)k0, (void)k1;
  return NULL;
#endif
}

const float *linear_lanes_prepare(float *xt, const float *inp, int M, int IN) {
  return linear_lanes_prepare_cols(xt, inp, M, IN, 0, IN);
}

void linear_lanes_prepared(float *out, const float *inp, const float *xt, const float *w,
                           const uint16_t *w16, const float *bias, int M, int IN, int OUT, int j0,
                           int j1, float beta) {
  if (w16) w = NULL;
#ifdef LF_X86
  if (xt && M >= 1 && j0 < j1 && lr_form_now() &&
      lr_drive(lr_form_now(), out, inp, xt, w, w16, bias, M, IN, OUT, j0, j1, beta, NULL))
    return;
#endif
  ll_any(out, inp, w, w16, bias, M, IN, OUT, j0, j1, beta);
}

size_t linear_lanes_adapter_floats(int M, int r) {
  return (size_t)(M + 63) / 64 * 64 * (size_t)r;
}

void linear_lanes_adapter_t(float *xat, const float *xa, int M, int r) {
  for (int m0 = 0; m0 < M; m0 += 64) {
    int mr = M - m0 < 64 ? M - m0 : 64;
    float *d = xat + (size_t)m0 * r;
    for (int k = 0; k < r; k++)
      for (int m = 0; m < 64; m++) d[k * 64 + m] = m < mr ? xa[(size_t)(m0 + m) * r + k] : 0.0f;
  }
}

void linear_lanes_adapted(float *out, const float *inp, const float *xt, const float *w,
                          const uint16_t *w16, const float *bias, int M, int IN, int OUT, int j0,
                          int j1, const struct lanes_adapter *ad) {
  if (M < 1 || j0 >= j1) return;
  if (w16) w = NULL;
#ifdef LF_X86
  if (xt && ad->xat && lr_form_now() &&
      lr_drive(lr_form_now(), out, inp, xt, w, w16, bias, M, IN, OUT, j0, j1, 0.0f, ad))
    return;
#endif
  ll_any(out, inp, w, w16, bias, M, IN, OUT, j0, j1, 0.0f);
  linear_lanes_adapter_add(out, ad, M, OUT, j0, j1);
}

void linear_lanes(float *out, const float *inp, const float *w, const float *bias, int M, int IN,
                  int OUT, int j0, int j1, float beta) {
  ll_any(out, inp, w, NULL, bias, M, IN, OUT, j0, j1, beta);
}

void linear_lanes_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int M,
                       int IN, int OUT, int j0, int j1, float beta) {
  ll_any(out, inp, NULL, w, bias, M, IN, OUT, j0, j1, beta);
}

void linear_lanes_block(float *out, const float *inp, const float *w, const uint16_t *w16,
                        const float *bias, int M, int IN, int OUT, int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
  ll_drive(ll_form_now(), out, inp, w, w16, bias, M, IN, OUT, j0, j1, beta);
}

void linear_lanes_set_form(int kmax, int ahead) {
#ifdef LF_X86
  lr_avx512_set = lr_avx512, lr_avx2_set = lr_avx2;
  if (kmax >= 0) lr_avx512_set.kmax = lr_avx2_set.kmax = kmax;
  if (ahead >= 0) lr_avx512_set.ahead = lr_avx2_set.ahead = ahead != 0;
  lr_set = kmax >= 0 || ahead >= 0;
#else
  (void)kmax, (void)ahead;
#endif
}

/* ---- packed panels (linear_lanes_packed): linear_lanes without the transposes ---------------- */

/* The weights packed once (linear_lanes_pack) as linear_lanes packs them per call: panel p holds
 * rows [16p, 16p + 16) k-major (panel[k * 16 + c] = w[16p + c, k], rows past OUT +0), so a step
 * only streams them. Each output is the same chain as linear_lanes' (fmaf over k in increasing
 * order from +0, then ll_store's bias and beta): the same bits. Rows run against up to LP_P
 * panels at once, each panel its own chains, so a lone row has LP_P independent chains (one
 * vector load and one fused multiply-add per k per panel) instead of waiting on one. */
/* LP_P: panels of the portable form's group (lp_avx512 chooses its own tiles) */
enum { LP_P = 4 };

size_t linear_lanes_panel_floats(int IN, int OUT) {
  return (size_t)((OUT + LINEAR_FEW_COLS - 1) / LINEAR_FEW_COLS) * LINEAR_FEW_COLS * (size_t)IN;
}

void linear_lanes_pack(float *panels, const float *w, const uint16_t *w16, int IN, int OUT) {
  for (int j = 0; j < OUT; j += 16)
    ll_pack_scalar(panels + (size_t)j * IN, w, w16, IN, j, OUT - j < 16 ? OUT - j : 16, 0, IN, 16,
                   0);
}

/* The columns of panels [p, p + np) within [j0, j1) from their sums acc[16 * i + c] */
static inline void lp_store(float *o, const float *acc, const float *bias, int p, int np, int j0,
                            int j1, float beta) {
  for (int i = 0; i < np; i++) {
    int c0 = (p + i) * 16, s = c0 > j0 ? c0 : j0, e = c0 + 16 < j1 ? c0 + 16 : j1;
    ll_store(o + s, acc + 16 * i + (s - c0), bias ? bias + s : NULL, e - s, beta);
  }
}

/* Portable: one row at a time against LP_P panels (a partial group repeating its last panel) */
SIMD_INLINE void lp_gen(float *out, const float *inp, const float *pk, const float *bias, int M,
                        int IN, int OUT, int j0, int j1, float beta, const int hw) {
  int p1 = (j1 + 15) / 16;
  for (int p = j0 / 16; p < p1; p += LP_P) { /* panels outer, as lp_avx512 */
    int np = p1 - p < LP_P ? p1 - p : LP_P;
    const float *b[LP_P];
    for (int i = 0; i < LP_P; i++) b[i] = pk + (size_t)(p + (i < np ? i : np - 1)) * 16 * IN;
    for (int m = 0; m < M; m++) {
      const float *x = inp + (size_t)m * IN;
      struct simd16 a0 = simd_zero(), a1 = a0, a2 = a0, a3 = a0;
      for (int k = 0; k < IN; k++) {
        struct simd16 v = simd_splat(x[k]);
        a0 = simd_fma(v, simd_load(b[0] + (size_t)k * 16), a0, hw);
        a1 = simd_fma(v, simd_load(b[1] + (size_t)k * 16), a1, hw);
        a2 = simd_fma(v, simd_load(b[2] + (size_t)k * 16), a2, hw);
        a3 = simd_fma(v, simd_load(b[3] + (size_t)k * 16), a3, hw);
      }
      float acc[16 * LP_P];
      simd_store(acc, a0), simd_store(acc + 16, a1), simd_store(acc + 32, a2);
      simd_store(acc + 48, a3);
      lp_store(out + (size_t)m * OUT, acc, bias, p, np, j0, j1, beta);
    }
  }
}

typedef void lp_fn(float *, const float *, const float *, const float *, int, int, int, int, int,
                   float);

static void lp_portable(float *out, const float *inp, const float *pk, const float *bias, int M,
                        int IN, int OUT, int j0, int j1, float beta) {
  lp_gen(out, inp, pk, bias, M, IN, OUT, j0, j1, beta, SIMD_HW_FMA);
}

#ifdef LF_X86
__attribute__((target("fma"))) static void lp_portable_fma(float *out, const float *inp,
                                                           const float *pk, const float *bias,
                                                           int M, int IN, int OUT, int j0, int j1,
                                                           float beta) {
  lp_gen(out, inp, pk, bias, M, IN, OUT, j0, j1, beta, 1);
}

/* AVX2 with FMA: the portable source, its 128-bit vectors as VEX instructions */
LF_AVX2 static void lp_avx2(float *out, const float *inp, const float *pk, const float *bias, int M,
                            int IN, int OUT, int j0, int j1, float beta) {
  lp_gen(out, inp, pk, bias, M, IN, OUT, j0, j1, beta, 1);
}

/* AVX-512: a lone row against 8 panels (8 independent chains), 2 to 4 rows against 4 panels
 * (lp_tile512: the sums staged in acc for lp_store), more rows in tiles of up to 12 rows against
 * 2 panels (lp_tile2: 24 sums, the SGEMM micro-kernel's shape: per k 2 vector loads and 12
 * broadcasts for 24 fused multiply-adds) whose whole groups inside the range store straight into
 * out, ll_store's bias and beta on the way (a group at the range's ends is staged). On
 * qwen-small's [151669, 128] head at batch 16 (one thread, from L3) 4 x 4 tiles with every group
 * staged ran 84 GFLOP/s, 12 x 2 (then 4 x 2) with direct stores 108-112. The 12 x 2 tile names
 * its sums one by one (as ll_tile512_rp): written as an array of 24 per tile, clang with
 * AddressSanitizer took over 20 minutes to compile this file. */
LF_AVX512 static inline __attribute__((always_inline)) void
lp_tile512(float *acc, const float *x, const float *const b[8], int IN, const int R, const int P) {
  __m512 a[4][8];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int i = 0; i < P; i++) a[r][i] = _mm512_setzero_ps();
  for (int k = 0; k < IN; k++) {
    __m512 w[8];
#pragma GCC unroll 8
    for (int i = 0; i < P; i++) w[i] = _mm512_loadu_ps(b[i] + (size_t)k * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      __m512 v = _mm512_set1_ps(x[(size_t)r * IN + k]);
#pragma GCC unroll 8
      for (int i = 0; i < P; i++) a[r][i] = _mm512_fmadd_ps(v, w[i], a[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int i = 0; i < P; i++) _mm512_storeu_ps(acc + (size_t)(r * P + i) * 16, a[r][i]);
}

/* one output vector of a whole group: + bias, then + out (beta), stored */
LF_AVX512 static inline __attribute__((always_inline)) void lp_put(float *o, __m512 y,
                                                                   const float *bias, float beta) {
  if (bias) y = _mm512_add_ps(y, _mm512_loadu_ps(bias));
  if (beta != 0.0f) y = _mm512_add_ps(_mm512_loadu_ps(o), y);
  _mm512_storeu_ps(o, y);
}

/* R (a constant, <= 12) rows x panels p0, p1; acc NULL: a whole group at column c0, stored into
 * out's rows; else the sums into acc (row r at r * 32) */
LF_AVX512 static inline __attribute__((always_inline)) void
lp_tile2(float *out, float *acc, const float *x, const float *p0, const float *p1,
         const float *bias, int IN, int OUT, int c0, float beta, const int R) {
  const __m512 z = _mm512_setzero_ps();
#define LP2_DECL(r) __m512 a##r = z, b##r = z
  LP2_DECL(0);
  LP2_DECL(1);
  LP2_DECL(2);
  LP2_DECL(3);
  LP2_DECL(4);
  LP2_DECL(5);
  LP2_DECL(6);
  LP2_DECL(7);
  LP2_DECL(8);
  LP2_DECL(9);
  LP2_DECL(10);
  LP2_DECL(11);
#undef LP2_DECL
#define LP2_FMA(r)                                                                                 \
  if (R > r) {                                                                                     \
    __m512 v = _mm512_set1_ps(x[(size_t)(r)*IN + k]);                                              \
    a##r = _mm512_fmadd_ps(v, w0, a##r);                                                           \
    b##r = _mm512_fmadd_ps(v, w1, b##r);                                                           \
  }
  for (int k = 0; k < IN; k++) {
    __m512 w0 = _mm512_loadu_ps(p0 + (size_t)k * 16), w1 = _mm512_loadu_ps(p1 + (size_t)k * 16);
    LP2_FMA(0);
    LP2_FMA(1);
    LP2_FMA(2);
    LP2_FMA(3);
    LP2_FMA(4);
    LP2_FMA(5);
    LP2_FMA(6);
    LP2_FMA(7);
    LP2_FMA(8);
    LP2_FMA(9);
    LP2_FMA(10);
    LP2_FMA(11);
  }
#undef LP2_FMA
#define LP2_ST(r)                                                                                  \
  if (R > r) {                                                                                     \
    if (acc) {                                                                                     \
      _mm512_storeu_ps(acc + (r)*32, a##r);                                                        \
      _mm512_storeu_ps(acc + (r)*32 + 16, b##r);                                                   \
    } else {                                                                                       \
      float *o = out + (size_t)(r)*OUT + c0;                                                       \
      lp_put(o, a##r, bias ? bias + c0 : NULL, beta);                                              \
      lp_put(o + 16, b##r, bias ? bias + c0 + 16 : NULL, beta);                                    \
    }                                                                                              \
  }
  LP2_ST(0);
  LP2_ST(1);
  LP2_ST(2);
  LP2_ST(3);
  LP2_ST(4);
  LP2_ST(5);
  LP2_ST(6);
  LP2_ST(7);
  LP2_ST(8);
  LP2_ST(9);
  LP2_ST(10);
  LP2_ST(11);
#undef LP2_ST
}

#define LP_CASE(r)                                                                                 \
  case r: lp_tile2(o, full ? NULL : acc, x, b[0], b[1], bias, IN, OUT, c0, beta, r); break
LF_AVX512 static void lp_avx512(float *out, const float *inp, const float *pk, const float *bias,
                                int M, int IN, int OUT, int j0, int j1, float beta) {
  int p1 = (j1 + 15) / 16, P = M == 1 ? 8 : M <= 4 ? 4 : 2;
  int nb = (M + 11) / 12; /* row tiles of up to 12 rows, the first ones full */
  float acc[12 * 2 * 16]; /* a staged tile: up to 12 x 2, 4 x 4 or 1 x 8 panels of 16 */
  /* panels outer: a group's panels (P * IN * 64 bytes) stay in L1 or L2 for all the rows */
  for (int p = j0 / 16; p < p1; p += P) {
    int np = p1 - p < P ? p1 - p : P, c0 = p * 16;
    int full = P == 2 && np == 2 && c0 >= j0 && c0 + 32 <= j1;
    const float *b[8];
    for (int i = 0; i < 8; i++) b[i] = pk + (size_t)(p + (i < np ? i : np - 1)) * 16 * IN;
    for (int m = 0, t = 0; t < nb; t++) {
      int R = M - m < 12 ? M - m : 12;
      const float *x = inp + (size_t)m * IN;
      float *o = out + (size_t)m * OUT;
      if (P == 8)
        lp_tile512(acc, x, b, IN, 1, 8);
      else if (P == 4)
        switch (R) {
        case 1: lp_tile512(acc, x, b, IN, 1, 4); break;
        case 2: lp_tile512(acc, x, b, IN, 2, 4); break;
        case 3: lp_tile512(acc, x, b, IN, 3, 4); break;
        default: lp_tile512(acc, x, b, IN, 4, 4); break;
        }
      else
        switch (R) {
          LP_CASE(1);
          LP_CASE(2);
          LP_CASE(3);
          LP_CASE(4);
          LP_CASE(5);
          LP_CASE(6);
          LP_CASE(7);
          LP_CASE(8);
          LP_CASE(9);
          LP_CASE(10);
          LP_CASE(11);
        default: LP_CASE(12);
        }
      if (!full)
        for (int r = 0; r < R; r++)
          lp_store(o + (size_t)r * OUT, acc + (size_t)r * P * 16, bias, p, np, j0, j1, beta);
      m += R;
    }
  }
}
#undef LP_CASE
#endif

void linear_lanes_packed(float *out, const float *inp, const float *panels, const float *bias,
                         int M, int IN, int OUT, int j0, int j1, float beta) {
  if (M < 1 || j0 >= j1) return;
#ifdef LF_X86
  static lp_fn *const forms[] = {lp_portable, lp_portable_fma, lp_avx2, lp_avx512};
#else
  static lp_fn *const forms[] = {lp_portable};
#endif
  forms[lf_form()](out, inp, panels, bias, M, IN, OUT, j0, j1, beta);
}
