/* Internal: one transformer block's forward over packed rows, shared by training (activations
 * saved per layer, keys/values in the packed buffers) and generation (one scratch set reused by
 * every layer, keys/values appended to a KV cache). Not part of the public API. */
#ifndef DAPO_BLOCK_H
#define DAPO_BLOCK_H

#include "error.h"
#include "kernels.h"
#include "lora.h"
#include "model.h"

struct pool;

/* One layer's activations over N packed rows. x_in, x_mid and x_out may all be the same buffer
 * (in-place residual stream, for inference). Shapes: x_* xn* [N,C], rstd* [N], q/att [N,CQ],
 * k/v [N,CKV] (after RoPE), lse [N,NH] (may be NULL), g/u/h [N,FF]. With qk_norm (Qwen3):
 * q_pre [N,CQ] and k_pre [N,CKV] the projections before the per-head norm, rstd_q [N,NH] and
 * rstd_k [N,NKV] its statistics (all four NULL for inference: q and k are normed in place). */
struct block_acts {
  float *x_in, *xn1, *rstd1, *q, *k, *v, *att, *lse, *x_mid, *xn2, *rstd2, *g, *u, *h, *x_out;
  float *q_pre, *k_pre, *rstd_q, *rstd_k;
  /* with an adapter (model.lora): lora_u[t] [N,r] keeps s * x A^T of each targeted layer for the
   * backward (training), or all NULL and lora_tmp [N,r] is scratch (inference) */
  float *lora_u[LT_COUNT], *lora_tmp;
};

/* y[N,OUT] += s (x A^T) B^T for target t of layer l of the adapter (nothing when lora is NULL
 * or t is not targeted), keeping s x A^T in u [N,r]. */
void block_lora_add(const struct lora *lora, int l, int t, float *y, const float *x, int N, int IN,
                    int OUT, float *u);

/* q and k of one or more rows after the projections: Qwen3's per-head RMSNorm (from q_pre/k_pre
 * into q/k, or in place when those are NULL or equal), then RoPE at each row's position. The one
 * definition both block_forward and the sampler's decoding step use. */
void block_qk_finish(const struct model_config *c, const struct layer_views *w, float *q, float *k,
                     const float *q_pre, const float *k_pre, float *rstd_q, float *rstd_k,
                     const int *pos, int N, const struct rope_table *rope);

/* How the packed rows split into sequences. Sequence s owns rows row0[s] .. row0[s]+t_new[s]-1 at
 * positions n_past[s]... With cache_k == NULL (training) the context is the packed k/v rows
 * themselves: n_past[s] is 0, or s continues a shared prefix (prefix_of[s] = i >= 0, training
 * only): its context is sequence i's first n_past[s] rows, then its own (gathered per thread into
 * the scratch, block_gather_kv). Otherwise new keys/values are copied into the cache at
 * [slot[s] * cap_t + n_past[s]] and attention reads the cache. */
struct block_seqs {
  int n_seq;
  const int *row0, *t_new, *n_past;
  const int *prefix_of;     /* NULL, or per sequence -1 or the sequence whose prefix it continues */
  const int *pos;           /* [N] position of each row */
  float *cache_k, *cache_v; /* this layer's cache, [slots * cap_t, CKV], or NULL */
  const int *slot;
  int cap_t;
};

/* Attention scratch, one slice of `stride` floats per thread of the pool the state runs on. */
struct thread_scratch {
  float *buf; /* owned: stride * threads floats */
  size_t stride;
  int threads;
};

/* One thread's worth; 0 or DAPO_ENOMEM. */
int thread_scratch_init(struct thread_scratch *t, size_t stride, struct dapo_err *e);
/* Grows to the pool's thread count (allocation only when it grows). */
int thread_scratch_fit(struct thread_scratch *t, const struct pool *p, struct dapo_err *e);
void thread_scratch_deinit(struct thread_scratch *t);

/* Head kvh's keys and values of a continuation's context, contiguous ([P + t, HS] each, in kc and
 * vc): rows p0 .. p0 + P - 1 of k/v [., CKV] (the prefix), then rows r0 .. r0 + t - 1 (its own). */
void block_gather_kv(float *kc, float *vc, const float *k, const float *v, int p0, int P, int r0,
                     int t, int kvh, int HS, int CKV);

/* scratch: one slice of scratch_stride floats per thread of the calling thread's pool (pool.h),
 * each at least max over sequences of t_new * (n_past + t_new) floats, and with prefix_of
 * 2 * (n_past + t_new) * head_dim more for the gathered context. */
/* out[N,OUT] = inp . W^T (+ bias; beta 1 accumulates into out) for a matrix held in float32 (w)
 * or, in a frozen model, in BF16 (w16, model_freeze_bf16). 0 or DAPO_ENOMEM. */
int block_linear(float *out, const float *inp, const float *w, const uint16_t *w16,
                 const float *bias, int N, int IN, int OUT, float beta);

/* Row tok of the embedding into dst[C] (float32 or BF16). */
void block_embed(const struct model *m, int tok, float *dst);

/* Layer l of model m (its adapter too, when m->lora). 0 or DAPO_ENOMEM (a BF16 tile). */
int block_forward(const struct model *m, int l, const struct block_acts *a,
                  const struct block_seqs *s, int N, const struct rope_table *rope, float *scratch,
                  size_t scratch_stride);

#endif
