/* Training forward/backward over packed variable-length sequences (train.h). The LM head and its
 * softmax cover the tokenizer's ids only (model_vocab_used): padding rows get no logits.
 * Activations are saved per layer in one allocation; attention probabilities are not stored but
 * recomputed in the backward from the saved log-sum-exp (memory O(tokens), not O(tokens^2)). */
#include "train.h"

#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "kernels.h"
#include "lora.h"
#include "pool.h"

struct train_state {
  struct model_config cfg;
  int cap_tokens, cap_resp, cap_seq_len;
  float *mem; /* the one allocation all buffers below point into */
  size_t mem_floats;
  struct rope_table rope;

  /* saved activations: res[L+1][N,C] and per layer the block_acts slots */
  float *res;
  struct block_acts *acts; /* [L] */
  int *pos;                /* [N] */
  int *row0, *t_new, *n_past;
  int *prefix_of;      /* [n_seq] the last batch's (-1: whole), when has_prefix */
  int *roots, n_roots; /* the whole sequences, in order */
  int *cont_next;      /* per sequence: the next continuation of its root (-1: none) */
  int has_prefix;
  int *sel_rows;                     /* [R] packed row whose output predicts response token r */
  int *targets;                      /* [R] */
  int *tokens;                       /* [N] copy of the last batch's tokens */
  float *sel_in, *sel_rstd, *sel_xn; /* [R,C], [R], [R,C] */
  float *probs;                      /* [R,V] */
  /* recomputed, not saved: every layer's xn1, xn2 [N,C] and h [N,FF] live in these (the forward
   * uses them within the layer; the backward recomputes them from x_in, x_mid, g and u with the
   * forward's own kernels, so the same bits), rstd_tmp [N] takes the recomputed statistics */
  float *xn, *h, *rstd_tmp;
  /* backward scratch */
  float *dres, *dxn, *dq, *dk, *dv, *datt, *dff_a, *dff_b, *dsel, *dsel_in;
  float *dk_pre;             /* [N,CKV] with qk_norm (dq_pre reuses datt) */
  float *dlora;              /* [N,r] with an adapter */
  int lora_r, lora_targets;  /* the adapter the state was sized for (0: none) */
  struct thread_scratch scr; /* attention scratch per pool thread */
  struct pool *pool;         /* borrowed */

  /* the batch of the last forward */
  int have_fwd, N, R, n_seq;
  int V; /* the vocabulary the rows of probs span */
  float inv_temp;
};

/* Sizes of every buffer in floats, in one place so that train_state_bytes and the allocation
 * agree. */
struct layout {
  size_t res, per_layer, sel, probs, bwd, scratch, total;
};

/* lc: the adapter's config, or NULL. */
static void plan(const struct model_config *c, const struct lora_config *lc, int N, int R, int T,
                 struct layout *p) {
  size_t C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size, NH = c->num_heads,
         L = c->num_layers, V = model_vocab_used(c), NKV = c->num_kv_heads;
  p->res = (L + 1) * N * C;
  /* rstd1, q, k, v, att, lse, x_mid, rstd2, g, u; qk_norm: q_pre, k_pre, rstd_q, rstd_k (xn1,
   * xn2 and h are recomputed in the backward: one shared set, in bwd) */
  p->per_layer = N * (1 + CQ + 2 * CKV + CQ + NH + C + 1 + 2 * FF);
  if (c->qk_norm) p->per_layer += N * (CQ + CKV + NH + NKV);
  p->sel = (size_t)R * (2 * C + 1);
  p->probs = (size_t)R * V;
  p->bwd = N * (2 * C + 2 * CQ + 2 * CKV + 2 * FF) + (size_t)R * 2 * C + N * (C + FF + 1);
  if (c->qk_norm) p->bwd += N * CKV;
  if (lc) { /* s x A^T of each targeted layer, and its gradient */
    int nt = 0;
    for (int t = 0; t < LT_COUNT; t++) nt += (lc->targets >> t) & 1;
    p->per_layer += N * (size_t)lc->r * nt;
    p->bwd += N * (size_t)lc->r;
  }
  /* per thread, allocated separately: the attention's P and dP, and a continuation's gathered
   * keys, values and their gradients (block_gather_kv) */
  p->scratch = 2 * (size_t)T * T + 4 * (size_t)T * c->head_dim;
  p->total = p->res + L * p->per_layer + p->sel + p->probs + p->bwd;
}

size_t train_state_bytes(const struct model_config *c, const struct lora_config *lc, int cap_tokens,
                         int cap_resp, int cap_seq_len) {
  struct layout p;
  plan(c, lc, cap_tokens, cap_resp, cap_seq_len, &p);
  size_t ints = (size_t)cap_tokens * 8 + (size_t)cap_resp * 2;
  return p.total * sizeof(float) + ints * sizeof(int) +
         (size_t)c->num_layers * sizeof(struct block_acts);
}

void train_state_free(struct train_state *s) {
  if (!s) return;
  free(s->mem);
  thread_scratch_deinit(&s->scr);
  free(s->acts);
  free(s->pos);
  rope_table_deinit(&s->rope);
  free(s);
}

struct train_state *train_state_new(const struct model *m, int cap_tokens, int cap_resp,
                                    int cap_seq_len, struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
  if (cap_tokens < 1 || cap_resp < 1 || cap_seq_len < 1 || cap_resp > cap_tokens ||
      cap_seq_len > cap_tokens || cap_seq_len > c->max_position_embeddings) {
    dapo_errf(e, DAPO_EINVAL,
              "train state capacities: tokens %d, response tokens %d, sequence length %d "
              "(need 1 <= resp <= tokens, 1 <= seq_len <= min(tokens, max_position_embeddings "
              "%d))",
              cap_tokens, cap_resp, cap_seq_len, c->max_position_embeddings);
    return NULL;
  }
  struct train_state *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->cfg = *c;
  s->cap_tokens = cap_tokens;
  s->cap_resp = cap_resp;
  s->cap_seq_len = cap_seq_len;
  const struct lora_config *lc = m->lora ? &m->lora->cfg : NULL;
  struct layout p;
  plan(c, lc, cap_tokens, cap_resp, cap_seq_len, &p);
  s->mem = dapo_alloc_floats(p.total);
  s->acts = calloc((size_t)c->num_layers, sizeof *s->acts);
  s->pos = calloc((size_t)cap_tokens * 8 + (size_t)cap_resp * 2, sizeof(int));
  if (!s->mem || !s->acts || !s->pos) goto oom;
  if (model_rope_table_init(&s->rope, c)) goto oom;
  s->row0 = s->pos + cap_tokens;
  s->t_new = s->row0 + cap_tokens;
  s->n_past = s->t_new + cap_tokens;
  s->sel_rows = s->n_past + cap_tokens;
  s->targets = s->sel_rows + cap_resp;
  s->tokens = s->targets + cap_resp;
  s->prefix_of = s->tokens + cap_tokens;
  s->roots = s->prefix_of + cap_tokens;
  s->cont_next = s->roots + cap_tokens;

  size_t N = cap_tokens, R = cap_resp, C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size;
  float *q = s->mem;
#define TAKE(n) (q += (n), q - (n))
  s->res = TAKE(p.res);
  for (int l = 0; l < c->num_layers; l++) {
    struct block_acts *a = &s->acts[l];
    a->x_in = s->res + (size_t)l * N * C;
    a->x_out = s->res + (size_t)(l + 1) * N * C;
    a->rstd1 = TAKE(N);
    a->q = TAKE(N * CQ);
    a->k = TAKE(N * CKV);
    a->v = TAKE(N * CKV);
    a->att = TAKE(N * CQ);
    a->lse = TAKE(N * c->num_heads);
    a->x_mid = TAKE(N * C);
    a->rstd2 = TAKE(N);
    a->g = TAKE(N * FF);
    a->u = TAKE(N * FF);
    if (c->qk_norm) {
      a->q_pre = TAKE(N * CQ);
      a->k_pre = TAKE(N * CKV);
      a->rstd_q = TAKE(N * c->num_heads);
      a->rstd_k = TAKE(N * c->num_kv_heads);
    }
    for (int t = 0; lc && t < LT_COUNT; t++)
      if (lc->targets & 1u << t) a->lora_u[t] = TAKE(N * (size_t)lc->r);
  }
  s->sel_in = TAKE(R * C);
  s->sel_xn = TAKE(R * C);
  s->sel_rstd = TAKE(R);
  s->probs = TAKE(R * (size_t)model_vocab_used(c));
  s->dres = TAKE(N * C);
  s->dxn = TAKE(N * C);
  s->dq = TAKE(N * CQ);
  s->datt = TAKE(N * CQ);
  s->dk = TAKE(N * CKV);
  s->dv = TAKE(N * CKV);
  s->dff_a = TAKE(N * FF);
  s->dff_b = TAKE(N * FF);
  s->dsel = TAKE(R * C);
  s->dsel_in = TAKE(R * C);
  if (c->qk_norm) s->dk_pre = TAKE(N * CKV);
  s->xn = TAKE(N * C);
  s->h = TAKE(N * FF);
  s->rstd_tmp = TAKE(N);
  for (int l = 0; l < c->num_layers; l++) {
    s->acts[l].xn1 = s->acts[l].xn2 = s->xn;
    s->acts[l].h = s->h;
  }
  if (lc) {
    s->dlora = TAKE(N * (size_t)lc->r);
    s->lora_r = lc->r;
    s->lora_targets = (int)lc->targets;
  }
#undef TAKE
  if (thread_scratch_init(&s->scr, p.scratch, NULL)) goto oom;
  s->mem_floats = p.total;
  return s;
oom:
  train_state_free(s);
  dapo_errf(
      e, DAPO_ENOMEM, "out of memory allocating training activations (%zu MiB)",
      train_state_bytes(c, m->lora ? &m->lora->cfg : NULL, cap_tokens, cap_resp, cap_seq_len) >>
          20);
  return NULL;
}

int train_state_set_pool(struct train_state *s, struct pool *p, struct dapo_err *e) {
  int rc = thread_scratch_fit(&s->scr, p, e);
  if (!rc) s->pool = p;
  return rc;
}

/* Whether the token at index n (after its sequence's prompt) is a response token b trains. */
static int is_trained(const struct fwd_batch *b, int n) {
  return !b->trained || b->trained[n];
}

/* The prefix sequence i continues, or -1. */
static int prefix(const struct fwd_batch *b, int i) {
  return b->prefix_of ? b->prefix_of[i] : -1;
}

/* How many of sequence i's own tokens are prompt: none for a continuation. */
static int own_prompt(const struct fwd_batch *b, int i) {
  return prefix(b, i) >= 0 ? 0 : b->prompt_len[i];
}

int fwd_batch_resp_tokens(const struct fwd_batch *b) {
  int r = 0;
  for (int i = 0; i < b->n_seq; i++)
    for (int n = b->seq_off[i] + own_prompt(b, i); n < b->seq_off[i + 1]; n++)
      r += is_trained(b, n);
  return r;
}

/* fwd_batch_validate's checks of sequence i's prefix_of entry. */
static int validate_prefix(const struct train_state *s, const struct fwd_batch *b, int i,
                           struct dapo_err *e) {
  int p = prefix(b, i), len = b->seq_off[i + 1] - b->seq_off[i];
  if (p == -1) return 0;
  if (p < -1 || p >= i)
    return dapo_errf(e, DAPO_EINVAL,
                     "batch: sequence %d: prefix_of %d is neither -1 nor an earlier sequence", i,
                     p);
  if (prefix(b, p) != -1)
    return dapo_errf(e, DAPO_EINVAL,
                     "batch: sequence %d: prefix_of %d is itself a continuation (of %d)", i, p,
                     prefix(b, p));
  if (b->prompt_len[i] < 1 || b->prompt_len[i] > b->prompt_len[p])
    return dapo_errf(e, DAPO_EINVAL,
                     "batch: sequence %d: prompt length %d not in [1, %d] (sequence %d's prompt, "
                     "which it continues)",
                     i, b->prompt_len[i], b->prompt_len[p], p);
  if (b->prompt_len[i] + len > s->cap_seq_len)
    return dapo_errf(e, DAPO_ERANGE,
                     "batch: sequence %d has length %d with the prefix it continues (capacity %d)",
                     i, b->prompt_len[i] + len, s->cap_seq_len);
  return 0;
}

int fwd_batch_validate(const struct train_state *s, const struct model *m,
                       const struct fwd_batch *b, struct dapo_err *e) {
  if (b->n_seq < 1 || b->seq_off[0] != 0)
    return dapo_errf(e, DAPO_EINVAL, "batch: needs at least one sequence and seq_off[0] == 0");
  long R = 0;
  for (int i = 0; i < b->n_seq; i++) {
    int len = b->seq_off[i + 1] - b->seq_off[i];
    if (len < 1 || len > s->cap_seq_len)
      return dapo_errf(e, DAPO_ERANGE, "batch: sequence %d has length %d (capacity %d)", i, len,
                       s->cap_seq_len);
    if (prefix(b, i) == -1 && (b->prompt_len[i] < 1 || b->prompt_len[i] > len))
      return dapo_errf(e, DAPO_EINVAL, "batch: sequence %d: prompt length %d not in [1, %d]", i,
                       b->prompt_len[i], len);
    int rc = validate_prefix(s, b, i, e);
    if (rc) return rc;
    if (b->seq_off[i + 1] > s->cap_tokens)
      return dapo_errf(e, DAPO_ERANGE, "batch: %d tokens exceed the capacity %d", b->seq_off[i + 1],
                       s->cap_tokens);
    for (int t = 0; b->trained && t < len; t++) {
      unsigned char f = b->trained[b->seq_off[i] + t];
      if (f > 1 || (f && t < own_prompt(b, i)))
        return dapo_errf(e, DAPO_EINVAL,
                         "batch: sequence %d: token %d's trained flag is %d (0 or 1, 0 in the "
                         "prompt)",
                         i, t, f);
    }
  }
  R = fwd_batch_resp_tokens(b);
  if (R > s->cap_resp)
    return dapo_errf(e, DAPO_ERANGE, "batch: %ld response tokens exceed the capacity %d", R,
                     s->cap_resp);
  int V = model_vocab_used(&m->cfg);
  for (int i = 0; i < b->seq_off[b->n_seq]; i++)
    if (b->tokens[i] < 0 || b->tokens[i] >= V)
      return dapo_errf(e, DAPO_EINVAL, "batch: token %d at index %d outside the vocabulary (%d)",
                       b->tokens[i], i, V);
  return 0;
}

/* train_forward, and with !grad train_logprobs: the classifier stops at the log-prob. */
static int forward(struct train_state *s, const struct model *m, const struct fwd_batch *b,
                   float inv_temp, float *logp, float *entropy, int grad, struct dapo_err *e) {
  int rc = fwd_batch_validate(s, m, b, e);
  if (rc) return rc;
  /* a state sized for an adapter also runs the model without it (the KL reference's pass) */
  if (m->lora && (s->lora_r != m->lora->cfg.r || s->lora_targets != (int)m->lora->cfg.targets))
    return dapo_errf(e, DAPO_EINVAL,
                     "train_forward: the state was sized for another adapter than the model's "
                     "(create it after attaching the adapter)");
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  const struct model_config *c = &m->cfg;
  int C = c->hidden_size, V = model_vocab_used(c), N = b->seq_off[b->n_seq];
  s->have_fwd = 0;

  /* sequence layout, positions, response rows and targets; a continuation's rows sit at
   * positions P.. after its prefix's P rows, and its first token is predicted from row P - 1 */
  int R = 0;
  s->has_prefix = b->prefix_of != NULL;
  s->n_roots = 0;
  for (int i = 0; i < b->n_seq; i++) {
    int r0 = b->seq_off[i], len = b->seq_off[i + 1] - r0, p = prefix(b, i);
    int past = p >= 0 ? b->prompt_len[i] : 0;
    s->row0[i] = r0;
    s->t_new[i] = len;
    s->n_past[i] = past;
    s->prefix_of[i] = p;
    s->cont_next[i] = -1;
    if (p < 0)
      s->roots[s->n_roots++] = i;
    else { /* appended to its root's chain of continuations */
      int k = p;
      while (s->cont_next[k] >= 0) k = s->cont_next[k];
      s->cont_next[k] = i;
    }
    for (int t = 0; t < len; t++) s->pos[r0 + t] = past + t;
    for (int t = own_prompt(b, i); t < len; t++) {
      if (!is_trained(b, r0 + t)) continue;
      s->sel_rows[R] = t > 0 ? r0 + t - 1 : s->row0[p] + past - 1;
      s->targets[R] = b->tokens[r0 + t];
      R++;
    }
  }

  /* embeddings */
  for (int n = 0; n < N; n++) block_embed(m, b->tokens[n], s->res + (size_t)n * C);

  struct block_seqs bs = {.n_seq = b->n_seq,
                          .row0 = s->row0,
                          .t_new = s->t_new,
                          .n_past = s->n_past,
                          .prefix_of = s->has_prefix ? s->prefix_of : NULL,
                          .pos = s->pos};
  for (int l = 0; l < c->num_layers; l++)
    rc |= block_forward(m, l, &s->acts[l], &bs, N, &s->rope, s->scr.buf, s->scr.stride);

  /* final norm and LM head only on the rows that predict response tokens */
  const float *last = s->acts[c->num_layers - 1].x_out;
  for (int r = 0; r < R; r++)
    memcpy(s->sel_in + (size_t)r * C, last + (size_t)s->sel_rows[r] * C, sizeof(float) * C);
  if (R > 0) {
    rmsnorm_forward(s->sel_xn, s->sel_rstd, s->sel_in, m->w.final_norm, R, C, c->rms_norm_eps);
    rc |= block_linear(s->probs, s->sel_xn, m->w.lm_head, m->w.lm_head16, NULL, R, C, V, 0.0f);
    if (grad)
      classifier_forward(s->probs, logp, entropy, s->targets, b->allowed, R, V, inv_temp);
    else
      classifier_logprobs(s->probs, logp, s->targets, b->allowed, R, V, inv_temp);
  }

  s->have_fwd = grad;
  s->N = N;
  s->R = R;
  s->V = V;
  s->n_seq = b->n_seq;
  s->inv_temp = inv_temp;
  memcpy(s->tokens, b->tokens, sizeof(int) * (size_t)N);
  pool_set_current(saved);
  if (rc) {
    s->have_fwd = 0;
    return dapo_errf(e, DAPO_ENOMEM, "train_forward: out of memory for a BF16 weight tile");
  }
  return 0;
}

int train_forward(struct train_state *s, const struct model *m, const struct fwd_batch *b,
                  float inv_temp, float *logp, float *entropy, struct dapo_err *e) {
  return forward(s, m, b, inv_temp, logp, entropy, 1, e);
}

int train_logprobs(struct train_state *s, const struct model *m, const struct fwd_batch *b,
                   float inv_temp, float *logp, struct dapo_err *e) {
  return forward(s, m, b, inv_temp, logp, NULL, 0, e);
}

/* Attention backward of every (whole sequence, KV head) pair over the pool, interleaved, each
 * thread with its own scratch; a whole sequence's task also does the sequences continuing its
 * prefix, after it (they add into its rows' dk and dv), so the tasks write disjoint slices of dq,
 * dk and dv. */
struct attn_bwd_args {
  struct train_state *s;
  const struct block_acts *a;
  int NKV, n_rep, HS, CQ, CKV, NH;
};

static void attn_bwd_thread(void *ctx, int ti, int nt) {
  const struct attn_bwd_args *x = ctx;
  struct train_state *s = x->s;
  const struct block_acts *a = x->a;
  float *scr = s->scr.buf + (size_t)ti * s->scr.stride;
  int CQ = x->CQ, CKV = x->CKV, NH = x->NH;
  int HS = x->HS;
  for (int task = ti; task < s->n_roots * x->NKV; task += nt) {
    int i = s->roots[task / x->NKV], kv = task % x->NKV;
    size_t r0 = s->row0[i];
    attention_backward(s->dq + r0 * CQ, s->dk + r0 * CKV, s->dv + r0 * CKV, s->datt + r0 * CQ,
                       a->q + r0 * CQ, a->k + r0 * CKV, a->v + r0 * CKV, a->lse + r0 * NH,
                       s->t_new[i], 0, kv * x->n_rep, x->n_rep, kv, HS, CQ, CKV, CQ, NH, scr);
    for (int j = s->cont_next[i]; j >= 0; j = s->cont_next[j]) {
      /* its context (i's first P rows, then its own) gathered, the gradients of it scattered back
       */
      int P = s->n_past[j], t = s->t_new[j], rj = s->row0[j];
      size_t n_ctx = (size_t)P + t;
      float *kc = scr, *vc = kc + n_ctx * HS, *dkc = vc + n_ctx * HS, *dvc = dkc + n_ctx * HS;
      block_gather_kv(kc, vc, a->k, a->v, (int)r0, P, rj, t, kv, HS, CKV);
      memset(dkc, 0, sizeof(float) * 2 * n_ctx * HS);
      attention_backward(s->dq + (size_t)rj * CQ, dkc, dvc, s->datt + (size_t)rj * CQ,
                         a->q + (size_t)rj * CQ, kc, vc, a->lse + (size_t)rj * NH, t, P,
                         kv * x->n_rep, x->n_rep, 0, HS, CQ, HS, CQ, NH, dvc + n_ctx * HS);
      for (size_t c = 0; c < n_ctx; c++) {
        size_t row = c < (size_t)P ? r0 + c : rj + c - P, o = row * CKV + (size_t)kv * HS;
        for (int d = 0; d < HS; d++) {
          s->dk[o + d] += dkc[c * HS + d];
          s->dv[o + d] += dvc[c * HS + d];
        }
      }
    }
  }
}

/* dinp (+)= dout . W through a layer's matrix: float32 (accumulating dw and dbias when given)
 * or a frozen model's BF16 (w16: the input gradient only). 0 or DAPO_ENOMEM. */
static int lin_back(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                    const float *w, const uint16_t *w16, int N, int IN, int OUT, float beta) {
  if (w16) return matmul_backward_dinp_bf16(dinp, dout, w16, N, IN, OUT, beta) ? DAPO_ENOMEM : 0;
  matmul_backward(dinp, dw, dbias, dout, inp, w, N, IN, OUT, beta);
  return 0;
}

/* The adapter of target t in layer l, whose layer got dout [N,OUT] from input x [N,IN] and kept
 * u = s x A^T: adds to its dA and dB and to dx (which holds the base layer's input gradient). */
static void lora_backward(struct train_state *s, const struct lora *lo, int l, int t,
                          const float *dout, const float *x, const float *u, float *dx, int N,
                          int IN, int OUT) {
  if (!lo || !lo->w[l].a[t]) return;
  int r = lo->cfg.r;
  /* y += u B^T: dB += dout^T u, du = dout B */
  matmul_backward(s->dlora, lo->g[l].b[t], NULL, dout, u, lo->w[l].b[t], N, r, OUT, 0.0f);
  /* u = s x A^T: dA += (s du)^T x, dx += (s du) A */
  for (size_t i = 0; i < (size_t)N * r; i++) s->dlora[i] *= lo->scale;
  matmul_backward(dx, lo->g[l].a[t], NULL, s->dlora, x, lo->w[l].a[t], N, IN, r, 1.0f);
}

int train_argmax_hits(const struct train_state *s, unsigned char *hit, struct dapo_err *e) {
  if (!s->have_fwd)
    return dapo_errf(e, DAPO_EINVAL, "train_argmax_hits: no forward awaits its backward");
  for (int r = 0; r < s->R; r++) {
    /* probs [R, V]: softmax is monotone, so its first maximum is the logits' */
    const float *p = s->probs + (size_t)r * s->V;
    int best = 0;
    for (int j = 1; j < s->V; j++)
      if (p[j] > p[best]) best = j;
    hit[r] = best == s->targets[r];
  }
  return 0;
}

int train_backward(struct train_state *s, struct model *m, const float *dlogp, struct dapo_err *e) {
  if (!s->have_fwd)
    return dapo_errf(e, DAPO_EINVAL, "train_backward: no forward pass to differentiate");
  /* with an adapter only it trains: the base gets no gradient (its grads may not exist) */
  const struct lora *lo = m->lora;
  if (lo && (!lo->grads || s->lora_r != lo->cfg.r || s->lora_targets != (int)lo->cfg.targets))
    return dapo_errf(e, DAPO_EINVAL,
                     "train_backward: adapter gradients not allocated, or the state was sized "
                     "for another adapter");
  if (!lo && !m->grads) return dapo_errf(e, DAPO_EINVAL, "train_backward: gradients not allocated");
  s->have_fwd = 0;
  int rc = 0;
  static const struct layer_views frozen_layer;
  struct views gm = lo ? (struct views){0} : m->g;
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  const struct model_config *c = &m->cfg;
  int C = c->hidden_size, V = model_vocab_used(c), N = s->N, R = s->R, L = c->num_layers;
  int HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads, FF = c->intermediate_size;
  int CQ = NH * HS, CKV = NKV * HS, n_rep = NH / NKV;

  memset(s->dres, 0, sizeof(float) * (size_t)N * C);
  if (R > 0) {
    classifier_backward(s->probs, dlogp, s->targets, R, V, s->inv_temp);
    rc |= lin_back(s->dsel, gm.lm_head, NULL, s->probs, s->sel_xn, m->w.lm_head, m->w.lm_head16, R,
                   C, V, 0.0f);
    memset(s->dsel_in, 0, sizeof(float) * (size_t)R * C);
    rmsnorm_backward(s->dsel_in, gm.final_norm, s->dsel, s->sel_in, m->w.final_norm, s->sel_rstd, R,
                     C);
    for (int r = 0; r < R; r++) {
      float *d = s->dres + (size_t)s->sel_rows[r] * C;
      const float *src = s->dsel_in + (size_t)r * C;
      for (int i = 0; i < C; i++) d[i] += src[i];
    }
  }

  for (int l = L - 1; l >= 0; l--) {
    const struct block_acts *a = &s->acts[l];
    const struct layer_views *w = &m->w.layers[l];
    const struct layer_views *g = lo ? &frozen_layer : &m->g.layers[l];
    /* MLP: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)); xn2 and h recomputed */
    rmsnorm_forward(a->xn2, s->rstd_tmp, a->x_mid, w->ffn_norm, N, C, c->rms_norm_eps);
    swiglu_forward(a->h, a->g, a->u, (size_t)N * FF);
    rc |=
        lin_back(s->dff_a, g->w_down, NULL, s->dres, a->h, w->w_down, w->w_down16, N, FF, C, 0.0f);
    lora_backward(s, lo, l, LT_DOWN, s->dres, a->h, a->lora_u[LT_DOWN], s->dff_a, N, FF, C);
    swiglu_backward(s->dff_a, s->dff_b, s->dff_a, a->g, a->u, (size_t)N * FF);
    rc |=
        lin_back(s->dxn, g->w_gate, NULL, s->dff_a, a->xn2, w->w_gate, w->w_gate16, N, C, FF, 0.0f);
    rc |= lin_back(s->dxn, g->w_up, NULL, s->dff_b, a->xn2, w->w_up, w->w_up16, N, C, FF, 1.0f);
    lora_backward(s, lo, l, LT_GATE, s->dff_a, a->xn2, a->lora_u[LT_GATE], s->dxn, N, C, FF);
    lora_backward(s, lo, l, LT_UP, s->dff_b, a->xn2, a->lora_u[LT_UP], s->dxn, N, C, FF);
    rmsnorm_backward(s->dres, g->ffn_norm, s->dxn, a->x_mid, w->ffn_norm, a->rstd2, N, C);

    /* attention: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)) */
    rc |= lin_back(s->datt, g->wo, g->bo, s->dres, a->att, w->wo, w->wo16, N, CQ, C, 0.0f);
    lora_backward(s, lo, l, LT_O, s->dres, a->att, a->lora_u[LT_O], s->datt, N, CQ, C);
    memset(s->dq, 0, sizeof(float) * (size_t)N * CQ);
    memset(s->dk, 0, sizeof(float) * (size_t)N * CKV);
    memset(s->dv, 0, sizeof(float) * (size_t)N * CKV);
    struct attn_bwd_args ab = {s, a, NKV, n_rep, HS, CQ, CKV, NH};
    if (s->pool && pool_threads(s->pool) > 1 && s->n_roots * NKV > 1)
      pool_run(s->pool, attn_bwd_thread, &ab);
    else
      attn_bwd_thread(&ab, 0, 1);
    rope_backward(s->dq, s->pos, N, CQ, NH, HS, &s->rope);
    rope_backward(s->dk, s->pos, N, CKV, NKV, HS, &s->rope);
    const float *dq_pre = s->dq, *dk_pre = s->dk;
    if (c->qk_norm) { /* through the per-head norms; datt is free again */
      memset(s->datt, 0, sizeof(float) * (size_t)N * CQ);
      memset(s->dk_pre, 0, sizeof(float) * (size_t)N * CKV);
      rmsnorm_backward(s->datt, g->q_norm, s->dq, a->q_pre, w->q_norm, a->rstd_q, N * NH, HS);
      rmsnorm_backward(s->dk_pre, g->k_norm, s->dk, a->k_pre, w->k_norm, a->rstd_k, N * NKV, HS);
      dq_pre = s->datt;
      dk_pre = s->dk_pre;
    }
    rmsnorm_forward(a->xn1, s->rstd_tmp, a->x_in, w->attn_norm, N, C, c->rms_norm_eps);
    rc |= lin_back(s->dxn, g->wq, g->bq, dq_pre, a->xn1, w->wq, w->wq16, N, C, CQ, 0.0f);
    rc |= lin_back(s->dxn, g->wk, g->bk, dk_pre, a->xn1, w->wk, w->wk16, N, C, CKV, 1.0f);
    rc |= lin_back(s->dxn, g->wv, g->bv, s->dv, a->xn1, w->wv, w->wv16, N, C, CKV, 1.0f);
    lora_backward(s, lo, l, LT_Q, dq_pre, a->xn1, a->lora_u[LT_Q], s->dxn, N, C, CQ);
    lora_backward(s, lo, l, LT_K, dk_pre, a->xn1, a->lora_u[LT_K], s->dxn, N, C, CKV);
    lora_backward(s, lo, l, LT_V, s->dv, a->xn1, a->lora_u[LT_V], s->dxn, N, C, CKV);
    rmsnorm_backward(s->dres, g->attn_norm, s->dxn, a->x_in, w->attn_norm, a->rstd1, N, C);
  }

  for (int n = 0; gm.tok_emb && n < N; n++) {
    float *d = gm.tok_emb + (size_t)s->tokens[n] * C;
    const float *src = s->dres + (size_t)n * C;
    for (int i = 0; i < C; i++) d[i] += src[i];
  }
  pool_set_current(saved);
  if (rc) return dapo_errf(e, DAPO_ENOMEM, "train_backward: out of memory for a BF16 weight tile");
  return 0;
}
