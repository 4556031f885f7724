/* The sampler's passes over a row of logits (softmax.h). Each pass is written once in GCC/Clang
 * vector extensions (simd.h: 16 lanes as four 128-bit vectors, lane l holding ids j = l mod 16)
 * and compiled for the baseline target, for FMA3 and for AVX2; the exponentials' pass, the one
 * that bounds the sampler, also in AVX-512 intrinsics with the same operations in the same
 * order. Only smx_exp_sum rounds differently with and without a fused multiply-add, and it uses
 * simd_fma (fmaf's bits on every target); the other passes compare, add and multiply, so their
 * results do not depend on the target at all. */
#include "softmax.h"

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SMX_X86 1
#endif

#define SMX_C4(c) ((simd_v4){c, c, c, c})

/* v where v > m, else m (so never a NaN from v) */
SIMD_INLINE simd_v4 smx_max4(simd_v4 m, simd_v4 v) {
  simd_i4 gt = v > m;
  return (simd_v4)(((simd_i4)v & gt) | ((simd_i4)m & ~gt));
}

SIMD_INLINE float max_gen(const float *x, int V) {
  struct simd16 m = simd_splat(-INFINITY);
  int j = 0;
  for (; j + 16 <= V; j += 16) {
    struct simd16 v = simd_load(x + j);
    m.q0 = smx_max4(m.q0, v.q0), m.q1 = smx_max4(m.q1, v.q1);
    m.q2 = smx_max4(m.q2, v.q2), m.q3 = smx_max4(m.q3, v.q3);
  }
  /* lanes 0..15 in order, then the tail in order (the sign of a zero maximum depends on it) */
  float lanes[16], mx = -INFINITY;
  simd_store(lanes, m);
  for (int l = 0; l < 16; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; j < V; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

/* e_j of 4 lanes (softmax.h) */
SIMD_INLINE simd_v4 smx_e4(simd_v4 x, float scale, float sub, const int hw) {
  simd_v4 z = x * scale - sub;
  simd_i4 live = z >= SMX_C4(-87.3f);
  return (simd_v4)((simd_i4)simd_exp4(z, hw) & live);
}

SIMD_INLINE double exp_sum_gen(const float *x, int V, float scale, float sub, float *p,
                               float *chunks, const int hw) {
  double sum = 0;
  for (int j = 0; j < V; j += SMX_CHUNK) {
    int end = V - j < SMX_CHUNK ? V : j + SMX_CHUNK;
    struct simd16 acc = simd_zero();
    for (int k = j; k < end; k += 16) {
      int n = end - k < 16 ? end - k : 16;
      struct simd16 v = n == 16 ? simd_load(x + k) : simd_load_n(x + k, n);
      struct simd16 e = {smx_e4(v.q0, scale, sub, hw), smx_e4(v.q1, scale, sub, hw),
                         smx_e4(v.q2, scale, sub, hw), smx_e4(v.q3, scale, sub, hw)};
      if (n < 16) e = simd_keep_n(e, n);
      if (p) simd_store_n(p + k, e, n);
      acc = simd_add(acc, e);
    }
    float cs = simd_tree(acc);
    if (chunks) chunks[j / SMX_CHUNK] = cs;
    sum += cs;
  }
  return sum;
}

/* The sum of p[j, end) as exp_sum_gen added that chunk's e_j. */
SIMD_INLINE float chunk_sum(const float *p, int j, int end) {
  struct simd16 acc = simd_zero();
  for (int k = j; k < end; k += 16) {
    int n = end - k < 16 ? end - k : 16;
    acc = simd_add(acc, n == 16 ? simd_load(p + k) : simd_load_n(p + k, n));
  }
  return simd_tree(acc);
}

SIMD_INLINE int draw_gen(const float *p, int V, double u) {
  double c = 0;
  for (int j = 0; j < V; j += SMX_CHUNK) {
    int end = V - j < SMX_CHUNK ? V : j + SMX_CHUNK;
    float s = chunk_sum(p, j, end);
    if (u < c + s) {
      int last = -1;
      for (int k = j; k < end; k++) {
        c += p[k];
        if (p[k] > 0) last = k;
        if (u < c) return k;
      }
      return last;
    }
    c += s;
  }
  return -1;
}

SIMD_INLINE int at_least_gen(const float *p, int V, float cutoff, int *idx) {
  int n = 0, j = 0;
  simd_v4 t = SMX_C4(cutoff);
  for (; j + 16 <= V; j += 16) {
    struct simd16 v = simd_load(p + j);
    simd_i4 any = (v.q0 >= t) | (v.q1 >= t) | (v.q2 >= t) | (v.q3 >= t);
    if (!(any[0] | any[1] | any[2] | any[3])) continue;
    for (int k = j; k < j + 16; k++)
      if (p[k] >= cutoff) idx[n++] = k;
  }
  for (; j < V; j++)
    if (p[j] >= cutoff) idx[n++] = j;
  return n;
}

SIMD_INLINE void top_gen(const float *x, int V, float scale, float sub, float lse, int k, int *ids,
                         float *lp) {
  int n = 0;
  for (int j = 0; j < V; j += 16) {
    int m = V - j < 16 ? V - j : 16;
    struct simd16 v = m == 16 ? simd_load(x + j) : simd_load_n(x + j, m);
    struct simd16 l = {(v.q0 * scale - sub) - lse, (v.q1 * scale - sub) - lse,
                       (v.q2 * scale - sub) - lse, (v.q3 * scale - sub) - lse};
    if (n == k) { /* a full list: only a value above its last can enter (a NaN never does) */
      simd_v4 t = SMX_C4(lp[k - 1]);
      simd_i4 any = (l.q0 > t) | (l.q1 > t) | (l.q2 > t) | (l.q3 > t);
      if (!(any[0] | any[1] | any[2] | any[3])) continue;
    }
    float lanes[16];
    simd_store(lanes, l);
    for (int a = 0; a < m; a++) {
      float y = lanes[a];
      if (y != y) y = -INFINITY; /* a NaN row still lists k ids */
      /* j + a is above every listed id: it goes after the equal ones */
      if (n == k && !(y > lp[k - 1])) continue;
      int at = n < k ? n++ : k - 1;
      while (at > 0 && y > lp[at - 1]) {
        ids[at] = ids[at - 1];
        lp[at] = lp[at - 1];
        at--;
      }
      ids[at] = j + a;
      lp[at] = y;
    }
  }
}

/* ---- the forms: one per target, the same source ------------------------------------------- */

struct smx_form {
  float (*max)(const float *, int);
  double (*exp_sum)(const float *, int, float, float, float *, float *);
  int (*draw)(const float *, int, double);
  int (*at_least)(const float *, int, float, int *);
  void (*top)(const float *, int, float, float, float, int, int *, float *);
};

#define SMX_FORM(name, attr, hw)                                                                   \
  attr static float max_##name(const float *x, int V) {                                            \
    return max_gen(x, V);                                                                          \
  }                                                                                                \
  attr static double exp_sum_##name(const float *x, int V, float scale, float sub, float *p,       \
                                    float *chunks) {                                               \
    return exp_sum_gen(x, V, scale, sub, p, chunks, hw);                                           \
  }                                                                                                \
  attr static int draw_##name(const float *p, int V, double u) {                                   \
    return draw_gen(p, V, u);                                                                      \
  }                                                                                                \
  attr static int at_least_##name(const float *p, int V, float cutoff, int *idx) {                 \
    return at_least_gen(p, V, cutoff, idx);                                                        \
  }                                                                                                \
  attr static void top_##name(const float *x, int V, float scale, float sub, float lse, int k,     \
                              int *ids, float *lp) {                                               \
    top_gen(x, V, scale, sub, lse, k, ids, lp);                                                    \
  }                                                                                                \
  static const struct smx_form form_##name = {max_##name, exp_sum_##name, draw_##name,             \
                                              at_least_##name, top_##name};

SMX_FORM(portable, , SIMD_HW_FMA)
#ifdef SMX_X86
SMX_FORM(fma, __attribute__((target("fma"))), 1)
SMX_FORM(avx2, __attribute__((target("avx2,fma"))), 1)
#endif

#ifdef SMX_X86
/* AVX-512: e_j as smx_e4 computes it (simd_exp512: simd_exp4's bits), 16 lanes in one
 * register; the sums as exp_sum_gen's. */
__attribute__((target("avx512f"))) static double
exp_sum_avx512(const float *x, int V, float scale, float sub, float *p, float *chunks) {
  const __m512 sc = _mm512_set1_ps(scale), sb = _mm512_set1_ps(sub), lo = _mm512_set1_ps(-87.3f);
  double sum = 0;
  for (int j = 0; j < V; j += SMX_CHUNK) {
    int end = V - j < SMX_CHUNK ? V : j + SMX_CHUNK;
    __m512 acc = _mm512_setzero_ps();
    for (int k = j; k < end; k += 16) {
      __mmask16 mk = end - k < 16 ? (__mmask16)((1u << (end - k)) - 1) : (__mmask16)0xffff;
      __m512 z = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + k), sc), sb);
      __mmask16 live = _mm512_mask_cmp_ps_mask(mk, z, lo, _CMP_GE_OQ);
      __m512 v = _mm512_maskz_mov_ps(live, simd_exp512(z));
      if (p) _mm512_mask_storeu_ps(p + k, mk, v);
      acc = _mm512_add_ps(acc, v);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    float cs = simd_tree(simd_load(lanes));
    if (chunks) chunks[j / SMX_CHUNK] = cs;
    sum += cs;
  }
  return sum;
}

/* AVX-512: max_gen's maximum, 16 lanes in one register: vmaxps(v, m) is v > m ? v : m lane by
 * lane (m where either is a NaN or both are zeros), smx_max4's select; then max_gen's order. */
__attribute__((target("avx512f"))) static float max_avx512(const float *x, int V) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 16 <= V; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
  float lanes[16], mx = -INFINITY;
  _mm512_storeu_ps(lanes, m);
  for (int l = 0; l < 16; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; j < V; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

static const struct smx_form form_avx512 = {max_avx512, exp_sum_avx512, draw_avx2, at_least_avx2,
                                            top_avx2};
#endif

static const struct smx_form *form(void) {
#ifdef SMX_X86
  int isa = kernels_isa();
  if (isa == KERNELS_ISA_AVX512) return &form_avx512;
  if (isa == KERNELS_ISA_AVX2) return &form_avx2;
  if (isa == KERNELS_ISA_PORTABLE && kernels_cpu_fma()) return &form_fma;
#endif
  return &form_portable;
}

float smx_max(const float *x, int V) {
  return form()->max(x, V);
}

int smx_argmax(const float *x, int V, float mx) {
  for (int j = 0; j < V; j++)
    if (x[j] == mx) return j;
  return 0;
}

double smx_exp_sum(const float *x, int V, float scale, float sub, float *p, float *chunks) {
  return form()->exp_sum(x, V, scale, sub, p, chunks);
}

int smx_draw(const float *p, int V, double u) {
  return form()->draw(p, V, u);
}

int smx_draw_chunks(const float *x, int V, float scale, float sub, const float *chunks, double u) {
  const struct smx_form *f = form();
  double c = 0;
  for (int j = 0; j < V; j += SMX_CHUNK) {
    float s = chunks[j / SMX_CHUNK];
    if (u < c + s) { /* this chunk's e_j again (each depends on x[j] alone), then draw_gen's walk */
      int end = V - j < SMX_CHUNK ? V : j + SMX_CHUNK, last = -1;
      float p[SMX_CHUNK];
      f->exp_sum(x + j, end - j, scale, sub, p, NULL);
      for (int k = j; k < end; k++) {
        c += p[k - j];
        if (p[k - j] > 0) last = k;
        if (u < c) return k;
      }
      return last;
    }
    c += s;
  }
  return -1;
}

int smx_at_least(const float *p, int V, float cutoff, int *idx) {
  return form()->at_least(p, V, cutoff, idx);
}

void smx_top(const float *x, int V, float scale, float sub, float lse, int k, int *ids, float *lp) {
  form()->top(x, V, scale, sub, lse, k, ids, lp);
}

/* ---- the nucleus ------------------------------------------------------------------------ */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* idx[lo, hi) partitioned in place around v: [lo, *a) p > v, [*a, *b) p == v, [*b, hi) p < v,
 * by two branch-free passes (Lomuto's, each element swapped whatever it is: on a near-uniform row
 * the comparisons are coin flips, which branches mispredict); *g and *e: the masses of the first
 * two parts, added in the order the passes meet them. */
static void partition3(const float *p, int *idx, int lo, int hi, float v, int *a, int *b, double *g,
                       double *e) {
  int lt = lo;
  double m = 0;
  for (int i = lo; i < hi; i++) {
    int t = idx[i];
    float x = p[t];
    int c = x > v;
    idx[i] = idx[lt];
    idx[lt] = t;
    lt += c;
    m += c ? x : 0.0f;
  }
  *a = lt, *g = m, m = 0;
  for (int i = lt; i < hi; i++) {
    int t = idx[i];
    float x = p[t];
    int c = x == v;
    idx[i] = idx[lt];
    idx[lt] = t;
    lt += c;
    m += c ? x : 0.0f;
  }
  *b = lt, *e = m;
}

int smx_nucleus(const float *p, int V, int *idx, int n, double target) {
  if (n <= 0) return 0;
  if (!(target > 0)) return 1; /* nothing to reach (a row of zeros): the first candidate */
  /* the boundary: the last kept token's p (t) and, among the tokens with p == t, the highest id
   * kept (tie). Invariant: above (the mass of every token above idx[lo, hi)) < target. */
  int lo = 0, hi = n, tie = -1;
  float t = 0;
  double above = 0;
  for (;;) {
    int mid = lo + (hi - lo) / 2;
    float a0 = p[idx[lo]], a1 = p[idx[mid]], a2 = p[idx[hi - 1]]; /* the median of three */
    float v = a0 < a1 ? (a1 < a2 ? a1 : (a0 < a2 ? a2 : a0)) : (a0 < a2 ? a0 : (a1 < a2 ? a2 : a1));
    int a, b;
    double g, e;
    partition3(p, idx, lo, hi, v, &a, &b, &g, &e);
    if (above + g >= target) { /* inside the larger ones (g > 0: there are some) */
      hi = a;
      continue;
    }
    if (above + g + e >= target || b == hi) {
      /* among the ties, by ascending id, up to the one where the mass reaches the target (all
       * of them when rounding leaves the whole set short of it) */
      qsort(idx + a, (size_t)(b - a), sizeof(int), cmp_int);
      double c = above + g;
      t = v, tie = idx[b - 1];
      for (int i = a; i < b; i++) {
        c += p[idx[i]];
        if (c >= target) {
          tie = idx[i];
          break;
        }
      }
      break;
    }
    above += g + e;
    lo = b;
  }
  /* the kept ids in ascending order: p > t, or p == t up to tie */
  int k = smx_at_least(p, V, t, idx), m = 0;
  for (int i = 0; i < k; i++)
    if (p[idx[i]] > t || idx[i] <= tie) idx[m++] = idx[i];
  return m;
}
