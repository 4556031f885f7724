/* Portable vectors for the decoding kernels (linear_few.c, kernels.c): GCC/Clang vector
 * extensions, and the one primitive their fixed arithmetic rests on, a lane-wise fused
 * multiply-add with the bits of fmaf on every target, hardware or not. 16 lanes (the AVX-512
 * width, which fixes the arithmetic) are held as 4 vectors of 4: 128 bits is native on every
 * SIMD target (NEON, SSE2, AltiVec, ...), and wider generic vectors make GCC spill them to the
 * stack on targets narrower than they are. Internal to core/; everything is static and inlined. */
#ifndef DAPO_SIMD_H
#define DAPO_SIMD_H

#include <float.h>
#include <stdint.h>
#include <string.h>

typedef float simd_v4 __attribute__((vector_size(16)));
typedef int32_t simd_i4 __attribute__((vector_size(16)));

/* 16 float lanes: lane l in q<l / 4>[l % 4] (named fields, not an array: GCC keeps those in
 * registers) */
struct simd16 {
  simd_v4 q0, q1, q2, q3;
};

#define SIMD_INLINE __attribute__((always_inline)) static inline

/* SIMD_HW_FMA: the baseline target has a fused multiply-add instruction (AArch64, POWER, x86 built
 * with -mfma...), so fmaf is one instruction that the compiler vectorises. Otherwise (x86-64's
 * baseline, SSE2) fmaf is a library call, and simd_fma computes it exactly in double instead. */
#if defined(__FP_FAST_FMAF) || defined(__FMA__) || defined(__aarch64__) ||                         \
    defined(__ARM_FEATURE_FMA)
#define SIMD_HW_FMA 1
#else
#define SIMD_HW_FMA 0
#endif

SIMD_INLINE struct simd16 simd_zero(void) {
  struct simd16 r = {{0}, {0}, {0}, {0}};
  return r;
}
SIMD_INLINE struct simd16 simd_splat(float x) {
  simd_v4 v = {x, x, x, x};
  struct simd16 r = {v, v, v, v};
  return r;
}
/* Full and partial (n < 16 lanes, the rest +0) unaligned loads and stores. */
SIMD_INLINE struct simd16 simd_load(const float *p) {
  struct simd16 r;
  memcpy(&r, p, sizeof r);
  return r;
}
SIMD_INLINE struct simd16 simd_load_n(const float *p, int n) {
  struct simd16 r = simd_zero();
  memcpy(&r, p, sizeof(float) * (size_t)n);
  return r;
}
SIMD_INLINE void simd_store(float *p, struct simd16 v) {
  memcpy(p, &v, sizeof v);
}
SIMD_INLINE void simd_store_n(float *p, struct simd16 v, int n) {
  memcpy(p, &v, sizeof(float) * (size_t)n);
}
/* Lanes [n, 16) set to +0. */
SIMD_INLINE struct simd16 simd_keep_n(struct simd16 v, int n) {
  struct simd16 r = simd_zero();
  memcpy(&r, &v, sizeof(float) * (size_t)n);
  return r;
}
SIMD_INLINE struct simd16 simd_add(struct simd16 a, struct simd16 b) {
  struct simd16 r = {a.q0 + b.q0, a.q1 + b.q1, a.q2 + b.q2, a.q3 + b.q3};
  return r;
}
SIMD_INLINE struct simd16 simd_scale(struct simd16 a, float s) {
  struct simd16 r = {a.q0 * s, a.q1 * s, a.q2 * s, a.q3 * s};
  return r;
}

/* c + a * b rounded once, 4 lanes, with the target's FMA instruction (the caller's target must
 * have one: SIMD_HW_FMA, or a target("fma") function); GCC and Clang vectorise this form. */
SIMD_INLINE simd_v4 simd_fma4_hw(simd_v4 a, simd_v4 b, simd_v4 c) {
  return (simd_v4){__builtin_fmaf(a[0], b[0], c[0]), __builtin_fmaf(a[1], b[1], c[1]),
                   __builtin_fmaf(a[2], b[2], c[2]), __builtin_fmaf(a[3], b[3], c[3])};
}

/* fmaf without an FMA instruction, exactly: the product of two floats is exact in double, so
 * s = p + c rounded to double and then to float is right except when s falls exactly halfway
 * between two floats while the exact sum lies beyond it (TwoSum's error has the sign of s's
 * distance from the float it rounded to); then the other neighbour is the answer. In SSE2
 * intrinsics on x86-64 (its baseline); elsewhere the library's fmaf, lane by lane. */
#if defined(__x86_64__) && FLT_EVAL_METHOD == 0
#include <emmintrin.h>
SIMD_INLINE __m128 simd_fma2_sse2(__m128 a, __m128 b, __m128 c) { /* lanes 0-1 */
  __m128d p = _mm_mul_pd(_mm_cvtps_pd(a), _mm_cvtps_pd(b)), cd = _mm_cvtps_pd(c);
  __m128d s = _mm_add_pd(p, cd), bb = _mm_sub_pd(s, p);
  __m128d err = _mm_add_pd(_mm_sub_pd(p, _mm_sub_pd(s, bb)), _mm_sub_pd(cd, bb));
  __m128 r = _mm_cvtpd_ps(s);
  __m128d rd = _mm_cvtps_pd(r), diff = _mm_sub_pd(s, rd);
  __m128d other = _mm_add_pd(rd, _mm_add_pd(diff, diff));
  __m128 ro = _mm_cvtpd_ps(other);
  /* s is a midpoint iff the float across it from r is exactly representable */
  __m128d fix = _mm_and_pd(_mm_cmpgt_pd(_mm_mul_pd(err, diff), _mm_setzero_pd()),
                           _mm_cmpeq_pd(_mm_cvtps_pd(ro), other));
  /* fix has a 64-bit mask per double; r and ro hold their 2 floats in lanes 0-1 */
  __m128 m = _mm_shuffle_ps(_mm_castpd_ps(fix), _mm_castpd_ps(fix), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm_or_ps(_mm_andnot_ps(m, r), _mm_and_ps(m, ro));
}
SIMD_INLINE simd_v4 simd_fma4_emul(simd_v4 a, simd_v4 b, simd_v4 c) {
  __m128 va = (__m128)a, vb = (__m128)b, vc = (__m128)c;
  __m128 lo = simd_fma2_sse2(va, vb, vc);
  __m128 hi = simd_fma2_sse2(_mm_movehl_ps(va, va), _mm_movehl_ps(vb, vb), _mm_movehl_ps(vc, vc));
  return (simd_v4)_mm_movelh_ps(lo, hi);
}
#else
SIMD_INLINE simd_v4 simd_fma4_emul(simd_v4 a, simd_v4 b, simd_v4 c) {
  return simd_fma4_hw(a, b, c); /* a library call per lane where fmaf is not an instruction */
}
#endif

/* c + a * b rounded once per lane, the bits of fmaf. hw: a constant, 1 in functions compiled for
 * a target with an FMA instruction, SIMD_HW_FMA in baseline ones. */
SIMD_INLINE simd_v4 simd_fma4(simd_v4 a, simd_v4 b, simd_v4 c, const int hw) {
  return hw ? simd_fma4_hw(a, b, c) : simd_fma4_emul(a, b, c);
}
SIMD_INLINE struct simd16 simd_fma(struct simd16 a, struct simd16 b, struct simd16 c,
                                   const int hw) {
  struct simd16 r = {simd_fma4(a.q0, b.q0, c.q0, hw), simd_fma4(a.q1, b.q1, c.q1, hw),
                     simd_fma4(a.q2, b.q2, c.q2, hw), simd_fma4(a.q3, b.q3, c.q3, hw)};
  return r;
}

/* The fixed reduction tree of 16 lanes: (l + 8), then + 4, then ((0 + 2) + (1 + 3)). */
SIMD_INLINE float simd_tree(struct simd16 v) {
  simd_v4 s4 = (v.q0 + v.q2) + (v.q1 + v.q3); /* s8 = q0 + q2 | q1 + q3; s4 = s8 + s8' */
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* Cephes' expf: n = round(x log2 e), r = x - n ln 2 in two steps, a degree-7 polynomial, times
 * 2^n; x clamped at -87.3 (exp(-87.3) ~ 1e-38: the softmax's zero). The operations of
 * kernels.c's exp512 (decoding attention, the classifier, the sampler's softmax.c). */
SIMD_INLINE simd_v4 simd_exp4(simd_v4 x, const int hw) {
#define C4(c) ((simd_v4){c, c, c, c})
  simd_v4 lo = C4(-87.3f);
  simd_i4 keep = x > lo;
  x = (simd_v4)(((simd_i4)x & keep) | ((simd_i4)lo & ~keep)); /* max(x, lo); lo where NaN */
  /* round to nearest even by adding and subtracting 1.5 * 2^23 (|x log2 e| < 2^22 here) */
  simd_v4 fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f, nfx = -fx;
  x = simd_fma4(nfx, C4(0.693359375f), x, hw);
  x = simd_fma4(nfx, C4(-2.12194440e-4f), x, hw);
  simd_v4 y = C4(1.9875691500e-4f);
  y = simd_fma4(y, x, C4(1.3981999507e-3f), hw);
  y = simd_fma4(y, x, C4(8.3334519073e-3f), hw);
  y = simd_fma4(y, x, C4(4.1665795894e-2f), hw);
  y = simd_fma4(y, x, C4(1.6666665459e-1f), hw);
  y = simd_fma4(y, x, C4(5.0000001201e-1f), hw);
  y = simd_fma4(y, x * x, x + 1.0f, hw);
#undef C4
  simd_i4 e = (__builtin_convertvector(fx, simd_i4) + 127) << 23; /* 2^n, n in [-126, 0] */
  return y * (simd_v4)e;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* simd_exp4 on 16 lanes in AVX-512 (the same bits: the rounding to an integer by roundscale,
 * 2^n by scalef, both exact here): decoding attention (kernels.c) and the sampler (softmax.c). */
__attribute__((target("avx512f"), always_inline)) static inline __m512 simd_exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f)); /* exp(-87.3) ~ 1e-38: the softmax's zero */
  __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, fx);
}

/* simd_exp4 on 8 lanes in AVX2 (the same bits: the rounding to an integer by round_ps, exact
 * here as the adding and subtracting of 1.5 * 2^23 is): SwiGLU (kernels.c). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 simd_exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f)); /* the bound where x is NaN, as simd_exp4 */
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

#endif
