/* One transformer block's forward (block.h): RMSNorm -> GQA attention with RoPE -> residual,
 * RMSNorm -> SwiGLU MLP -> residual. */
#include "block.h"

#include <string.h>

void block_forward(const struct model_config *c, const struct layer_views *w,
                   const struct block_acts *a, const struct block_seqs *s, int N,
                   const struct rope_table *rope, float *scratch) {
  int C = c->hidden_size, HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads;
  int CQ = NH * HS, CKV = NKV * HS, FF = c->intermediate_size, n_rep = NH / NKV;

  rmsnorm_forward(a->xn1, a->rstd1, a->x_in, w->attn_norm, N, C, c->rms_norm_eps);
  matmul_forward(a->q, a->xn1, w->wq, w->bq, N, C, CQ, 0.0f);
  matmul_forward(a->k, a->xn1, w->wk, w->bk, N, C, CKV, 0.0f);
  matmul_forward(a->v, a->xn1, w->wv, w->bv, N, C, CKV, 0.0f);
  rope_forward(a->q, s->pos, N, CQ, NH, HS, rope);
  rope_forward(a->k, s->pos, N, CKV, NKV, HS, rope);

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
    const float *qs = a->q + (size_t)r0 * CQ;
    float *os = a->att + (size_t)r0 * CQ;
    float *ls = a->lse ? a->lse + (size_t)r0 * NH : NULL;
    for (int g = 0; g < NKV; g++)
      attention_forward(os, ls, qs, kc, vc, t, past, g * n_rep, n_rep, g, HS, CQ, CKV, CQ, NH,
                        scratch);
  }

  if (a->x_mid != a->x_in) memcpy(a->x_mid, a->x_in, sizeof(float) * (size_t)N * C);
  matmul_forward(a->x_mid, a->att, w->wo, NULL, N, CQ, C, 1.0f);

  rmsnorm_forward(a->xn2, a->rstd2, a->x_mid, w->ffn_norm, N, C, c->rms_norm_eps);
  matmul_forward(a->g, a->xn2, w->w_gate, NULL, N, C, FF, 0.0f);
  matmul_forward(a->u, a->xn2, w->w_up, NULL, N, C, FF, 0.0f);
  swiglu_forward(a->h, a->g, a->u, (size_t)N * FF);
  if (a->x_out != a->x_mid) memcpy(a->x_out, a->x_mid, sizeof(float) * (size_t)N * C);
  matmul_forward(a->x_out, a->h, w->w_down, NULL, N, FF, C, 1.0f);
}
