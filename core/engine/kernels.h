/* Forward/backward kernel pairs of the transformer, each with one argument order: outputs, saved
 * statistics, inputs, weights, then dimensions. Backward kernels accumulate (+=) into gradients.
 * Beside each optimised kernel is a naive reference loop (suffix _ref) that the tests compare it
 * with. Row-major throughout.
 *
 * Legend: N rows (tokens), C hidden, IN/OUT linear dims, FF intermediate, V vocab, HS head size,
 * NH query heads, NKV key/value heads, T sequence length (context). */
#ifndef DAPO_KERNELS_H
#define DAPO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Kernels spread over the calling thread's pool (pool.h) only when a call has at least this much
 * work (multiply-adds or elements); tests set 0 to exercise the parallel paths on tiny shapes.
 * Process-wide; set it before starting work. */
void kernels_set_par_min_work(long w);
long kernels_par_min_work(void);

/* out[N,C] = inp[N,C] * rstd[n] * w[C], rstd[n] = 1/sqrt(mean(inp[n]^2) + eps). */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps);
/* dinp[N,C] += ..., dw[C] += ... (dw may be NULL). */
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C);

/* out[N,OUT] = inp[N,IN] . w[OUT,IN]^T + bias[OUT] (bias may be NULL); beta 1 accumulates into out
 * (bias is then still added). GEMV when N == 1. */
void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int IN,
                    int OUT, float beta);
void matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias, int N,
                        int IN, int OUT);
/* Few rows (linear_few.c): columns [j0, j1) of out[M,OUT] = inp[M,IN] . w[OUT,IN]^T (+ bias[OUT],
 * may be NULL; beta 1 adds to out, 0 overwrites), on the calling thread. Each element's
 * arithmetic is fixed (16 FMA lanes, a fixed reduction tree), so it does not depend on M, the
 * column range or the instruction set used. Decoding now uses linear_lanes (below); this one
 * stays for matmul_forward_bf16's few rows. */
void linear_few(float *out, const float *inp, const float *w, const float *bias, int M, int IN,
                int OUT, int j0, int j1, float beta);

/* The instruction set of the hand-vectorised decoding kernels (linear_few, decoding attention):
 * the best this CPU has, unless a test forced one. PORTABLE is their GCC/Clang vector-extension
 * code (simd.h), what a CPU without AVX2 runs (an ARM server: NEON or SVE with fused
 * multiply-adds); on an x86 CPU that has FMA3 but not AVX2 it is compiled with FMA3. BASELINE is
 * the same code compiled for the baseline target only: on x86-64, SSE2 with every fused
 * multiply-add computed exactly in double (an x86 CPU without FMA); elsewhere it is PORTABLE.
 * Every one gives the same bits (tested). */
enum {
  KERNELS_ISA_PORTABLE = 1,
  KERNELS_ISA_AVX2 = 2,
  KERNELS_ISA_AVX512 = 3,
  KERNELS_ISA_BASELINE = 4
};
int kernels_isa(void);
/* Tests and benchmarks: 0 restores the best (returned); another value forces that instruction
 * set (returned) or fails with -1 when this CPU lacks it (BASELINE never fails). Process-wide. */
int kernels_force_isa(int isa);
/* "avx512", "avx2", "portable", "baseline"; kernels_isa_by_name gives the value of such a name,
 * or 0 for any other string. */
const char *kernels_isa_name(int isa);
int kernels_isa_by_name(const char *name);
/* Whether this CPU has fused multiply-add instructions that the portable code may use (x86:
 * FMA3; always 1 on targets whose baseline has them). 0 while BASELINE is forced. */
int kernels_cpu_fma(void);
/* dinp[N,IN] (+= when dinp_beta 1, = when 0; may be NULL), dw[OUT,IN] +=, dbias[OUT] += (may be
 * NULL). */
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int IN, int OUT, float dinp_beta);

/* ---- BF16 weights (frozen matrices, e.g. a LoRA job's base) ---------------------------------
 * A weight matrix may be stored as bfloat16: uint16_t, the top 16 bits of a float32 (the same
 * row-major [OUT, IN] layout as the float32 kernels). Activations, outputs and gradients stay
 * float32; weights are converted (exactly) to float32 on the fly, a block at a time, inside the
 * kernels, so the model keeps 2 bytes per frozen parameter and never a float32 copy. Only the
 * input gradient flows through a frozen matrix: there is no weight gradient entry point.
 * Thread-safety as the float32 kernels: pure functions of their arguments, spread over the
 * calling thread's pool (pool_current) when the work exceeds kernels_par_min_work. */

/* dst[n] = the float32 of src[n] (exact). */
void bf16_to_f32(float *dst, const uint16_t *src, size_t n);
/* dst[n] = src[n] rounded to bfloat16, to nearest even (what PyTorch's .to(torch.bfloat16) does);
 * a NaN stays a NaN (quiet), infinities stay infinite. */
void f32_to_bf16(uint16_t *dst, const float *src, size_t n);

/* out[N,OUT] = inp[N,IN] . w[OUT,IN]^T + bias[OUT] (bias may be NULL; beta 1 accumulates into
 * out, 0 overwrites), w in BF16. Few rows (N < 8 per thread) go through linear_few_bf16 (its
 * bits); more through OpenBLAS SGEMM on float32 tiles of about 16 MiB of converted weight rows,
 * each thread its own output columns: the result equals matmul_forward on the float32 of w to
 * within float rounding (the tiles change the order of OpenBLAS's sums, not the terms; tested at
 * 2e-6 of sum |inp| |w| per element). Returns 0, or -1 when a tile buffer could not be allocated
 * (out is then partly written). */
int matmul_forward_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int N,
                        int IN, int OUT, float beta);
/* Input gradient through a frozen BF16 matrix: dinp[N,IN] = dout[N,OUT] . w[OUT,IN] (dinp_beta 0
 * overwrites, 1 accumulates). SGEMM over float32 tiles of w (each thread its own columns of
 * dinp, summing over OUT a tile at a time); equals matmul_backward's dinp on the float32 of w to
 * within float rounding (tested at 2e-6 of sum |dout| |w|). 0, or -1 out of memory. */
int matmul_backward_dinp_bf16(float *dinp, const float *dout, const uint16_t *w, int N, int IN,
                              int OUT, float dinp_beta);
/* The most bytes one thread's converted tile takes in matmul_forward_bf16 or
 * matmul_backward_dinp_bf16 with an OUT x IN BF16 matrix: 16 MiB, or 16 rows when they are
 * longer, or the whole matrix when smaller. Allocated inside the call and freed before it
 * returns; each compute thread holds one at a time (the memory plan counts one). */
size_t matmul_bf16_tile_bytes(int IN, int OUT);
/* Columns [j0, j1) of out[M,OUT] (+)= inp[M,IN] . w[OUT,IN]^T for a small IN (a LoRA adapter's B
 * in decoding, IN = r), on the calling thread: each output is one chain of fused multiply-adds in
 * increasing k from +0, then added to out (beta 1) or stored (beta 0). 16 columns share the
 * vector lanes, so an output costs IN / 16 vector operations, where linear_few would spend a whole
 * 16-lane reduction on it. The same bits for any M, column range or instruction set (tested). */
void linear_few_narrow(float *out, const float *inp, const float *w, int M, int IN, int OUT, int j0,
                       int j1, float beta);
/* linear_few_narrow with w transposed once (decoding keeps an adapter's B so for a whole
 * generation instead of transposing 16 columns of it per call): linear_few_narrow_pack writes w
 * [OUT, IN] into wt (linear_few_narrow_floats(IN, OUT) floats) as blocks of 16 columns, column j's
 * k-th weight at wt[(j / 16 * 16) IN + 16 k + j % 16] (+0 past OUT); linear_few_narrow_packed
 * takes wt for w, with the same bits. */
size_t linear_few_narrow_floats(int IN, int OUT);
void linear_few_narrow_pack(float *wt, const float *w, int IN, int OUT);
void linear_few_narrow_packed(float *out, const float *inp, const float *wt, int M, int IN, int OUT,
                              int j0, int j1, float beta);

/* linear_few (decoding) with BF16 weights: columns [j0, j1) on the calling thread. Blocks of 4 or
 * more weight rows are converted into a float32 buffer (on the stack up to 16,384 floats, else
 * on the heap) and multiplied by linear_few's own code, so every element has exactly the bits
 * linear_few gives on the float32 of w (tested), on every instruction set. Cannot fail: without
 * memory for the buffer it takes a scalar loop with the same arithmetic. */
void linear_few_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int M,
                     int IN, int OUT, int j0, int j1, float beta);

/* Decoding with the outputs in the vector lanes: columns [j0, j1) of out[M,OUT] = inp[M,IN] .
 * w[OUT,IN]^T (+ bias[OUT], may be NULL; beta 1 adds to out, 0 overwrites: out = (beta ? out : 0)
 * + (dot + bias)), on the calling thread, w in float32 or (linear_lanes_bf16) BF16 converted
 * exactly. Each dot is ONE chain of fused multiply-adds over k in increasing order from +0, the
 * bits of fmaf's loop, so an element does not depend on M, the column range, the thread or the
 * instruction set (tested against that loop). No reduction: panels of 16 or 32 weight rows are
 * transposed on the fly into a small block on the stack (about 40 KiB), each shared by the M
 * rows; except from 16 rows on AVX-512 (BF16 weights from 49) and from 49 rows on AVX2 (float32
 * rows of up to L2 / 512 inputs: 2048 on a 1 MiB L2; BF16 rows of any length), where the rows of
 * inp (64 at a time) are transposed instead, into a buffer of 64 IN floats that the calling
 * thread keeps from call to call (freed when it ends), and the weights are read in place (rows in
 * the lanes; BF16 weights widened a few rows at a time into more floats of that buffer: 12 times,
 * on AVX-512 24 times, a chunk of at most LINEAR_LANES_KC inputs, on AVX2 also at most L2 / 512
 * inputs). Any [j0, j1) is correct; the kernel works
 * in whole panels from j0, so column ranges aligned to LINEAR_FEW_COLS (a partial one last) waste
 * nothing. Cannot fail (without memory for the buffer it takes the block). */
#define LINEAR_FEW_COLS 16
void linear_lanes(float *out, const float *inp, const float *w, const float *bias, int M, int IN,
                  int OUT, int j0, int j1, float beta);
void linear_lanes_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int M,
                       int IN, int OUT, int j0, int j1, float beta);
/* linear_lanes with the rows of inp transposed beforehand, for decoding's phases, whose every
 * call (a range of columns of one or more matrices sharing an input) would otherwise transpose
 * them again: linear_lanes_prepare writes the copy of inp [M, IN] into xt (64-byte aligned,
 * linear_lanes_xt_floats(M, IN) floats, 0 below 16 rows) and returns it, or returns NULL where
 * linear_lanes would not use it (no rows in the lanes on this processor, or too few rows);
 * linear_lanes_prepared then gives linear_lanes' bits for inp (xt from inp's prepare, or NULL:
 * linear_lanes) on w, or on w16 in BF16 when w16 is not NULL (w then unused: linear_lanes_bf16's
 * bits), and takes rows in the lanes for any number of columns (linear_lanes, which pays the
 * transpose per call, only from 96). */
size_t linear_lanes_xt_floats(int M, int IN);
/* Whether linear_lanes_prepared reads a prepare's copy for M rows of IN inputs against float32
 * weights, or BF16 ones when bf16 (rows in the lanes take BF16 weights from more rows than
 * float32 on AVX-512, and on AVX2 rows of up to L2 / 512 inputs only): where it does not, the copy
 * need not be written (linear_lanes_prepare returns NULL only on the first). */
int linear_lanes_reads_copy(int M, int IN, int bf16);
const float *linear_lanes_prepare(float *xt, const float *inp, int M, int IN);
/* linear_lanes_prepare's copy of inp's columns [k0, k1) alone (the rest of xt untouched), for
 * threads that each write their own columns of one shared copy (disjoint ranges never share a
 * cache line); returns what linear_lanes_prepare would, also for an empty range (nothing
 * written). The copy assembled from ranges that cover [0, IN) is linear_lanes_prepare's. */
const float *linear_lanes_prepare_cols(float *xt, const float *inp, int M, int IN, int k0, int k1);
void linear_lanes_prepared(float *out, const float *inp, const float *xt, const float *w,
                           const uint16_t *w16, const float *bias, int M, int IN, int OUT, int j0,
                           int j1, float beta);
/* A LoRA adapter's product for linear_lanes_adapted: xa [M, r] (the rows' s (x A^T)), xat its
 * copy by linear_lanes_adapter_t (blocks of 64 rows, block b at xat + 64 b r, xat[k * 64 + m];
 * linear_lanes_adapter_floats(M, r) floats), b [OUT, r], and bt linear_few_narrow_pack's b or
 * NULL. */
struct lanes_adapter {
  const float *xa, *xat, *b, *bt;
  int r;
};
size_t linear_lanes_adapter_floats(int M, int r);
void linear_lanes_adapter_t(float *xat, const float *xa, int M, int r);
/* Columns [j0, j1) of out[M,OUT] += ad's product (xa b^T), after a product that stored them:
 * linear_few_narrow (beta 1) on b, or linear_few_narrow_packed on bt where ad has it. */
void linear_lanes_adapter_add(float *out, const struct lanes_adapter *ad, int M, int OUT, int j0,
                              int j1);
/* linear_lanes_prepared with beta 0, then linear_lanes_adapter_add over the same columns, bit for
 * bit: out = (dot + bias) + ad's chain. Where rows are in the lanes the adapter's chains (r fused
 * multiply-adds an output, in increasing k from +0) run in the lanes too and are added to a
 * block's sums before they are stored, so the outputs are written once (linear_few_narrow reads
 * and writes them again). */
void linear_lanes_adapted(float *out, const float *inp, const float *xt, const float *w,
                          const uint16_t *w16, const float *bias, int M, int IN, int OUT, int j0,
                          int j1, const struct lanes_adapter *ad);
/* linear_lanes' block alone (w, or w16 when w is NULL), whatever M and the instruction set: for
 * tests and bench_kernels --lanes, which compare it with the rows-in-the-lanes kernel that
 * linear_lanes takes from 16 rows on AVX-512 (the same bits). */
void linear_lanes_block(float *out, const float *inp, const float *w, const uint16_t *w16,
                        const float *bias, int M, int IN, int OUT, int j0, int j1, float beta);
/* Rows in the lanes' two choices on AVX-512 and AVX2, for tests and bench_kernels --lanes-vs (the
 * same bits whatever they are): kmax, the longest chunk of BF16 inputs a tile runs over before the
 * next tile (0: whole rows, on AVX2 then only up to L2 / 512 inputs; -1: the default,
 * LINEAR_LANES_KC, on AVX2 at most L2 / 512), and ahead, whether a tile widens the next
 * tile's BF16 rows beside its own multiply-adds (1, the default; 0: each tile's before it; -1:
 * the default). Process-wide: set before the calls, not during them. */
#define LINEAR_LANES_KC 1024
void linear_lanes_set_form(int kmax, int ahead);
/* linear_lanes on weights packed beforehand, for decoding small models whose weights sit in the
 * caches (a lone row otherwise spends most of its time transposing): linear_lanes_pack writes
 * w[OUT,IN] (float32, or w16 in BF16 when w is NULL, converted exactly) as panels of
 * LINEAR_FEW_COLS rows in k-major order (panel p = rows [16p, 16p + 16), [IN][16] floats, the last
 * one padded with +0), linear_lanes_panel_floats(IN, OUT) floats; linear_lanes_packed computes
 * from them exactly the bits linear_lanes gives on w, for any M, column range and instruction set
 * (tested), a lone row with several panels' chains in flight. */
size_t linear_lanes_panel_floats(int IN, int OUT);
void linear_lanes_pack(float *panels, const float *w, const uint16_t *w16, int IN, int OUT);
void linear_lanes_packed(float *out, const float *inp, const float *panels, const float *bias,
                         int M, int IN, int OUT, int j0, int j1, float beta);

/* RoPE, Hugging Face rotate_half convention: for i < HS/2, (x[i], x[i+HS/2]) rotated by
 * pos * theta^(-2i/HS). cos/sin tables are [max_pos, HS/2]. x rows have stride ld, nh heads. */
struct rope_table {
  int max_pos, half;
  float *cos, *sin; /* owned */
};
/* Plain RoPE with base theta. */
int rope_table_init(struct rope_table *t, int max_pos, int head_dim, float theta);
/* Given inverse frequencies inv_freq[half] (scaled RoPE types, model_rope_freqs) and a factor
 * that multiplies cos and sin (yarn's attention factor; 1 otherwise). 0 or -1 (out of memory). */
int rope_table_init_freqs(struct rope_table *t, int max_pos, int half, const float *inv_freq,
                          float scale);
void rope_table_deinit(struct rope_table *t);
void rope_forward(float *x, const int *pos, int N, int ld, int nh, int HS,
                  const struct rope_table *t);
/* In place: dx = R^T dx (the inverse rotation). */
void rope_backward(float *dx, const int *pos, int N, int ld, int nh, int HS,
                   const struct rope_table *t);

/* h = silu(g) * u over n elements. */
void swiglu_forward(float *h, const float *g, const float *u, size_t n);
/* dg = dh * u * silu'(g), du = dh * silu(g) (overwrite; dg may alias dh). */
void swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u,
                     size_t n);

/* Causal attention of t_new query rows at positions n_past..n_past+t_new-1 against n_ctx =
 * n_past + t_new context rows, for the n_rep query heads h0..h0+n_rep-1 that share KV head kvh.
 * q: [t_new, ldq] (head h at column h*HS), k/v: [n_ctx, ldkv] (head kvh at column kvh*HS),
 * out: [t_new, ldo], lse: [t_new, NH] log-sum-exp of the scaled scores (may be NULL).
 * scratch: t_new * n_ctx floats. */
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       int t_new, int n_past, int h0, int n_rep, int kvh, int HS, int ldq, int ldkv,
                       int ldo, int NH, float *scratch);
/* attention_forward of one decoding row (t_new = 1) with the same bits, for the sampler: q, out
 * and lse ([n_rep heads from h0], head h at q + h HS, out + h HS, lse[h]) of that one row; k/v
 * [n_past + 1, ldkv] as there. Where the processor allows it (AVX-512), heads that share the KV
 * head are computed together, each key and value row loaded once for up to
 * ATTENTION_DECODE_HEADS of them. scratch: ATTENTION_DECODE_HEADS * (n_past + 1) floats. */
enum { ATTENTION_DECODE_HEADS = 4 };
void attention_decode(float *out, float *lse, const float *q, const float *k, const float *v,
                      int n_past, int h0, int n_rep, int kvh, int HS, int ldkv, float *scratch);
void attention_forward_ref(float *out, const float *q, const float *k, const float *v, int t_new,
                           int n_past, int h0, int n_rep, int kvh, int HS, int ldq, int ldkv,
                           int ldo);
/* Backward of attention_forward (lse saved by it): recomputes P from q, k and lse. T query rows at
 * positions n_past .. n_past + T - 1 against n_ctx = n_past + T context rows (n_past 0:
 * training a whole sequence; > 0: rows continuing a shared prefix). dq [T, ldq] and dk/dv
 * [n_ctx, ldkv] accumulate (the past rows get their share too). scratch: 2 * T * n_ctx floats. */
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *lse, int T, int n_past, int h0,
                        int n_rep, int kvh, int HS, int ldq, int ldkv, int ldo, int NH,
                        float *scratch);

/* For each of R rows of logits [R,V]: z = logits * inv_temp; logp[r] = z[y_r] - logsumexp(z);
 * entropy[r] = H(softmax(z)); then the row is replaced by softmax(z) (saved for the backward).
 * logp/entropy may be NULL. allowed: NULL, or per row a bitset of (V + 63) / 64 words (bit j of
 * word j / 64): the other ids' z are -INFINITY (structured outputs: the constrained softmax, whose
 * probabilities there are exactly 0, and so their gradient in classifier_backward). */
void classifier_forward(float *logits, float *logp, float *entropy, const int *targets,
                        const uint64_t *allowed, int R, int V, float inv_temp);
/* classifier_forward's log-probs alone, for a pass no backward follows (old and reference
 * log-probs): the same arithmetic up to the log-sum-exp, so logp has the same bits, without the
 * second pass over the row (no softmax written back, no entropy). logits are left scaled. */
void classifier_logprobs(float *logits, float *logp, const int *targets, const uint64_t *allowed,
                         int R, int V, float inv_temp);
/* probs [R,V] in place -> dlogits: w[r] * inv_temp * (onehot(y_r) - p). */
void classifier_backward(float *probs, const float *w, const int *targets, int R, int V,
                         float inv_temp);

#endif
