/* One transformer block's forward (block.h): RMSNorm -> GQA attention with RoPE (Qwen3: q and k
 * RMSNormed per head first) -> residual, RMSNorm -> SwiGLU MLP -> residual. */
#include "block.h"

#include <stdlib.h>
#include <string.h>

#include "pool.h"

int thread_scratch_init(struct thread_scratch *t, size_t stride, struct dapo_err *e) {
  t->stride = stride;
  t->threads = 1;
  t->buf = dapo_alloc_floats(stride);
  return t->buf ? 0 : dapo_errf(e, DAPO_ENOMEM, "out of memory for attention scratch");
}

int thread_scratch_fit(struct thread_scratch *t, const struct pool *p, struct dapo_err *e) {
  int n = pool_threads(p);
  if (n <= t->threads) return 0;
  float *nb = dapo_alloc_floats(t->stride * (size_t)n);
  if (!nb) return dapo_errf(e, DAPO_ENOMEM, "out of memory for per-thread attention scratch");
  free(t->buf);
  t->buf = nb;
  t->threads = n;
  return 0;
}

void thread_scratch_deinit(struct thread_scratch *t) {
  free(t->buf);
  t->buf = NULL;
}

/* Attention of every (sequence, KV head) pair, spread over the pool: task t goes to thread
 * t mod n (interleaved, so that long and short sequences mix), each thread with its own
 * scratch slice. */
struct attn_fwd_args {
  const struct model_config *c;
  const struct block_acts *a;
  const struct block_seqs *s;
  const float *const *kc, *const *vc; /* per sequence: context keys/values */
  float *scratch;
  size_t stride;
  int n_tasks;
};

static void attn_fwd_thread(void *ctx, int ti, int nt) {
  const struct attn_fwd_args *x = ctx;
  const struct model_config *c = x->c;
  int HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads;
  int CQ = NH * HS, CKV = NKV * HS, n_rep = NH / NKV;
  float *scr = x->scratch + (size_t)ti * x->stride;
  for (int task = ti; task < x->n_tasks; task += nt) {
    int i = task / NKV, g = task % NKV;
    int r0 = x->s->row0[i], t = x->s->t_new[i], past = x->s->n_past[i];
    const float *qs = x->a->q + (size_t)r0 * CQ;
    float *os = x->a->att + (size_t)r0 * CQ;
    float *ls = x->a->lse ? x->a->lse + (size_t)r0 * NH : NULL;
    if (x->s->prefix_of && x->s->prefix_of[i] >= 0) { /* its context gathered: head g alone */
      size_t n_ctx = (size_t)past + t;
      float *kc = scr, *vc = scr + n_ctx * HS;
      block_gather_kv(kc, vc, x->a->k, x->a->v, x->s->row0[x->s->prefix_of[i]], past, r0, t, g, HS,
                      CKV);
      attention_forward(os, ls, qs, kc, vc, t, past, g * n_rep, n_rep, 0, HS, CQ, HS, CQ, NH,
                        scr + 2 * n_ctx * HS);
      continue;
    }
    attention_forward(os, ls, qs, x->kc[i], x->vc[i], t, past, g * n_rep, n_rep, g, HS, CQ, CKV, CQ,
                      NH, scr);
  }
}

void block_gather_kv(float *kc, float *vc, const float *k, const float *v, int p0, int P, int r0,
                     int t, int kvh, int HS, int CKV) {
  for (int j = 0; j < P + t; j++) {
    size_t src = (size_t)(j < P ? p0 + j : r0 + j - P) * CKV + (size_t)kvh * HS;
    memcpy(kc + (size_t)j * HS, k + src, sizeof(float) * HS);
    memcpy(vc + (size_t)j * HS, v + src, sizeof(float) * HS);
  }
}

void block_qk_finish(const struct model_config *c, const struct layer_views *w, float *q, float *k,
                     const float *q_pre, const float *k_pre, float *rstd_q, float *rstd_k,
                     const int *pos, int N, const struct rope_table *rope) {
  int HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads;
  if (c->qk_norm) {
    rmsnorm_forward(q, rstd_q, q_pre ? q_pre : q, w->q_norm, N * NH, HS, c->rms_norm_eps);
    rmsnorm_forward(k, rstd_k, k_pre ? k_pre : k, w->k_norm, N * NKV, HS, c->rms_norm_eps);
  }
  rope_forward(q, pos, N, NH * HS, NH, HS, rope);
  rope_forward(k, pos, N, NKV * HS, NKV, HS, rope);
}

void block_lora_add(const struct lora *lora, int l, int t, float *y, const float *x, int N, int IN,
                    int OUT, float *u) {
  if (!lora || !lora->w[l].a[t]) return;
  int r = lora->cfg.r;
  matmul_forward(u, x, lora->w[l].a[t], NULL, N, IN, r, 0.0f);
  for (size_t i = 0; i < (size_t)N * r; i++) u[i] *= lora->scale;
  matmul_forward(y, u, lora->w[l].b[t], NULL, N, r, OUT, 1.0f);
}

int block_linear(float *out, const float *inp, const float *w, const uint16_t *w16,
                 const float *bias, int N, int IN, int OUT, float beta) {
  if (!w16) {
    matmul_forward(out, inp, w, bias, N, IN, OUT, beta);
    return 0;
  }
  return matmul_forward_bf16(out, inp, w16, bias, N, IN, OUT, beta) ? DAPO_ENOMEM : 0;
}

void block_embed(const struct model *m, int tok, float *dst) {
  size_t C = (size_t)m->cfg.hidden_size;
  if (m->w.tok_emb16)
    bf16_to_f32(dst, m->w.tok_emb16 + (size_t)tok * C, C);
  else
    memcpy(dst, m->w.tok_emb + (size_t)tok * C, sizeof(float) * C);
}

int block_forward(const struct model *m, int l, const struct block_acts *a,
                  const struct block_seqs *s, int N, const struct rope_table *rope, float *scratch,
                  size_t scratch_stride) {
  const struct model_config *c = &m->cfg;
  const struct layer_views *w = &m->w.layers[l];
  const struct lora *lo = m->lora;
#define U(t) (a->lora_u[t] ? a->lora_u[t] : a->lora_tmp)
  int C = c->hidden_size, HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads;
  int CQ = NH * HS, CKV = NKV * HS, FF = c->intermediate_size;

  /* with qk_norm and saved activations, the projections land in q_pre/k_pre */
  float *qp = c->qk_norm && a->q_pre ? a->q_pre : a->q,
        *kp = c->qk_norm && a->k_pre ? a->k_pre : a->k;
  rmsnorm_forward(a->xn1, a->rstd1, a->x_in, w->attn_norm, N, C, c->rms_norm_eps);
  int rc = 0;
  rc |= block_linear(qp, a->xn1, w->wq, w->wq16, w->bq, N, C, CQ, 0.0f);
  rc |= block_linear(kp, a->xn1, w->wk, w->wk16, w->bk, N, C, CKV, 0.0f);
  rc |= block_linear(a->v, a->xn1, w->wv, w->wv16, w->bv, N, C, CKV, 0.0f);
  block_lora_add(lo, l, LT_Q, qp, a->xn1, N, C, CQ, U(LT_Q));
  block_lora_add(lo, l, LT_K, kp, a->xn1, N, C, CKV, U(LT_K));
  block_lora_add(lo, l, LT_V, a->v, a->xn1, N, C, CKV, U(LT_V));
  block_qk_finish(c, w, a->q, a->k, qp, kp, a->rstd_q, a->rstd_k, s->pos, N, rope);

  /* context of each sequence: its packed rows (training) or its cache slot, after appending */
  const float *kcs[s->n_seq > 0 ? s->n_seq : 1], *vcs[s->n_seq > 0 ? s->n_seq : 1];
  for (int i = 0; i < s->n_seq; i++) {
    int r0 = s->row0[i], t = s->t_new[i], past = s->n_past[i];
    const float *kc = a->k + (size_t)r0 * CKV, *vc = a->v + (size_t)r0 * CKV;
    if (s->cache_k) {
      size_t base = (size_t)s->slot[i] * s->cap_t;
      float *kd = s->cache_k + (base + past) * CKV, *vd = s->cache_v + (base + past) * CKV;
      memcpy(kd, kc, sizeof(float) * (size_t)t * CKV);
      memcpy(vd, vc, sizeof(float) * (size_t)t * CKV);
      kc = s->cache_k + base * CKV;
      vc = s->cache_v + base * CKV;
    }
    kcs[i] = kc;
    vcs[i] = vc;
  }
  struct attn_fwd_args args = {c, a, s, kcs, vcs, scratch, scratch_stride, s->n_seq * NKV};
  struct pool *p = pool_current();
  long work = 0;
  for (int i = 0; i < s->n_seq; i++) work += (long)s->t_new[i] * (s->n_past[i] + s->t_new[i]);
  if (p && pool_threads(p) > 1 && args.n_tasks > 1 && work * CQ >= kernels_par_min_work())
    pool_run(p, attn_fwd_thread, &args);
  else
    attn_fwd_thread(&args, 0, 1);

  if (a->x_mid != a->x_in) memcpy(a->x_mid, a->x_in, sizeof(float) * (size_t)N * C);
  rc |= block_linear(a->x_mid, a->att, w->wo, w->wo16, w->bo, N, CQ, C, 1.0f);
  block_lora_add(lo, l, LT_O, a->x_mid, a->att, N, CQ, C, U(LT_O));

  rmsnorm_forward(a->xn2, a->rstd2, a->x_mid, w->ffn_norm, N, C, c->rms_norm_eps);
  rc |= block_linear(a->g, a->xn2, w->w_gate, w->w_gate16, NULL, N, C, FF, 0.0f);
  rc |= block_linear(a->u, a->xn2, w->w_up, w->w_up16, NULL, N, C, FF, 0.0f);
  block_lora_add(lo, l, LT_GATE, a->g, a->xn2, N, C, FF, U(LT_GATE));
  block_lora_add(lo, l, LT_UP, a->u, a->xn2, N, C, FF, U(LT_UP));
  swiglu_forward(a->h, a->g, a->u, (size_t)N * FF);
  if (a->x_out != a->x_mid) memcpy(a->x_out, a->x_mid, sizeof(float) * (size_t)N * C);
  rc |= block_linear(a->x_out, a->h, w->w_down, w->w_down16, NULL, N, FF, C, 1.0f);
  block_lora_add(lo, l, LT_DOWN, a->x_out, a->h, N, FF, C, U(LT_DOWN));
#undef U
  return rc ? DAPO_ENOMEM : 0;
}
