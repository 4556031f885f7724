/* Batched KV-cache generation (sampler.h). Prefill runs each distinct prompt once through the
 * shared block forward (sequences with the same prompt copy its cache rows); decoding then feeds
 * all active sequences as one [B, C] batch per step, so every weight product is a GEMM. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block.h"
#include "kernels.h"
#include "lora.h"
#include "pool.h"
#include "softmax.h"

/* Tickets of one decoding step split dynamically (decode_step): per layer its five phases (QKV,
 * attention, O, gate-up, down), then the LM head and sampling; one cache line each. */
enum { PHASES_PER_LAYER = 5, TICKET_STRIDE = 16 };
/* FF_COLS: the gate and up products' columns taken at a time in a thread's share, so that their
 * outputs are still in cache when LoRA's B products add to them and SwiGLU reads them (a share
 * whole, 64 rows x 2432 columns of each at 0.5B's shape on 2 threads, left L2: LoRA's B products
 * waited on their loads); 384 is a multiple of every tile width of linear_lanes (16-64 columns,
 * 6, 8, 12 and 48 rows of weights). */
enum { FF_COLS = 384 };

struct gen_state {
  struct model_config cfg;
  int cap_batch, cap_t, cap_rows;
  int lora_r; /* the adapter rank the state was sized for (0: none) */
  float *mem;
  struct rope_table rope;
  float *cache_k, *cache_v;  /* [L][cap_batch * cap_t][CKV] */
  struct block_acts acts;    /* one set, x_in == x_mid == x_out */
  float *sel, *logits;       /* [cap_rows, C], [cap_rows, V] */
  struct thread_scratch scr; /* attention scratch per pool thread */
  struct pool *pool;         /* borrowed */
  float *pick_p;             /* [V] */
  float *xt_h; /* acts.h transposed for the down projection by the threads that compute it */
  int *ints;   /* pos, row0, t_new, n_past, slot: cap_rows each; idx[V]; misc */
  int *pos, *row0, *t_new, *n_past, *slot, *pick_idx, *active, *src, *last_row;
  /* gen_advance: [cap_batch] each: tokens each slot's cache holds; per feed, whether it is a
   * prefill and its decoded tokens (0 or 1, gen_out's len for decode_step); per decoding row,
   * whether its sample is skipped (a token fed that is not the feed's last) */
  int *slot_len, *feed_pre, *feed_len, *row_skip;
  enum gen_split split;
  int chunk;                  /* GEN_SPLIT_DYNAMIC's KiB per chunk (gen_state_set_chunk) */
  int *tickets;               /* per phase of a decoding step, one cache line each (decode_step) */
  int delay_thread, delay_us; /* gen_state_set_delay (tests) */
  struct gen_profile *prof;   /* gen_state_set_profile; NULL: none */
  int tuned;                  /* gen_state_tune chose split and chunk */
  double tune_s[4];           /* its medians per candidate (tune_cands) */
  int64_t weight_bytes;       /* what one decoding step reads */
  struct pool_barrier bar;    /* between decode_step's phases; its spin budget persists */
  gen_progress_fn progress;   /* told between decoding steps (gen_state_set_progress); NULL: none */
  void *progress_ctx;
  gen_step_fn step; /* told after each round of sampling (gen_state_set_step); NULL: none */
  void *step_ctx;
  gen_mask_fn mask; /* masks the logits before each draw (gen_state_set_mask); NULL: none */
  void *mask_ctx;
  /* The decoding matrices packed into panels (linear_lanes_pack) for a model whose float32
   * matrices total at most DECODE_PACK_MAX_BYTES, else NULL: pk[7 * l + t] (t: wq, wk, wv, wo,
   * w_gate, w_up, w_down) and pk[7 * L] (the LM head) point into pack. They hold the weights of
   * pack_m at pack_version (model.version), refreshed by pack_refresh at every gen_run and
   * gen_advance; panels: pk while decoding uses them, NULL otherwise (gen_state_set_pack). */
  float *pack;
  const float **pk, *const *panels;
  const struct model *pack_m;
  uint64_t pack_version;
  int pack_off;
  /* An adapter's B matrices transposed once for the generation (linear_few_narrow_pack), for
   * lb_m at lb_version, refreshed with the panels: lb[LT_COUNT l + t] points into lbt (lbt_n
   * floats, sized for the adapter the state was made for), NULL where target t of layer l has none;
   * lbs: lb while it holds the model decoded now, else NULL (each call transposes its columns). */
  float *lbt;
  size_t lbt_n;
  const float **lb, *const *lbs;
  const struct model *lb_m;
  uint64_t lb_version;
};

struct glayout {
  size_t cache, acts, sel, logits, scratch, pick, xt_h, total, ints;
};

static void gplan(const struct model_config *c, const struct lora_config *lc, int B, int T,
                  struct glayout *p) {
  size_t C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size, L = c->num_layers,
         V = model_vocab_used(c);
  size_t rows = (size_t)(B > T ? B : T);
  p->cache = 2 * L * (size_t)B * T * CKV;
  p->acts = rows * (C + C + 1 + CQ + 2 * CKV + CQ + C + 1 + 3 * FF);
  p->sel = rows * C;
  p->logits = rows * V;
  /* per thread: prefill's attention scores [T, T], or decoding's (decode_step: the scores of
   * ATTENTION_DECODE_HEADS heads) */
  size_t lr = lc ? (size_t)lc->r : 0; /* an adapter's x A^T: [rows, r] in prefill, [B, r] */
  p->acts += rows * lr;
  size_t in_max = C > CQ ? C : CQ;
  in_max = in_max > FF ? in_max : FF;
  /* + a phase's input transposed (linear_lanes_prepare), 64-byte aligned */
  size_t dec = ATTENTION_DECODE_HEADS * (size_t)T + (size_t)B * C + 2 * V +
               /* 3 targets a phase: x A^T and its copy for linear_lanes_adapted */
               3 * ((size_t)B * lr + linear_lanes_adapter_floats(B, (int)lr)) +
               linear_lanes_xt_floats(B, (int)in_max) + 16;
  p->scratch = (size_t)T * T > dec ? (size_t)T * T : dec;
  p->pick = V;
  /* the down projection's input transposed, shared by the pool's threads, 64-byte aligned */
  p->xt_h = linear_lanes_xt_floats(B, (int)FF) + 16;
  p->total = p->cache + p->acts + p->sel + p->logits + p->pick + p->xt_h;
  p->ints = rows * 5 + V + 7 * (size_t)B + rows;
}

/* Floats of the packed decoding matrices of c (gen_state.pack), 0 when over the budget. */
static size_t pack_floats(const struct model_config *c) {
  int C = c->hidden_size, CQ = c->num_heads * c->head_dim, CKV = c->num_kv_heads * c->head_dim,
      FF = c->intermediate_size;
  size_t n = linear_lanes_panel_floats(C, CQ) + 2 * linear_lanes_panel_floats(C, CKV) +
             linear_lanes_panel_floats(CQ, C) + 2 * linear_lanes_panel_floats(C, FF) +
             linear_lanes_panel_floats(FF, C);
  n = n * c->num_layers + linear_lanes_panel_floats(C, model_vocab_used(c));
  return n * sizeof(float) <= DECODE_PACK_MAX_BYTES ? n : 0;
}

/* Floats of an adapter's B matrices transposed (gen_state.lbt) for lc on c; 0 without one. */
static size_t lbt_floats(const struct model_config *c, const struct lora_config *lc) {
  size_t n = 0;
  for (int t = 0; lc && t < LT_COUNT; t++) {
    int out, in;
    lora_target_dims(t, c, &out, &in);
    if (lc->targets & (1u << t)) n += linear_few_narrow_floats(lc->r, out);
  }
  return n * (size_t)c->num_layers;
}

size_t gen_pack_bytes(const struct model_config *c) {
  return pack_floats(c)
             ? pack_floats(c) * sizeof(float) + sizeof(float *) * (7 * (size_t)c->num_layers + 1)
             : 0;
}

size_t gen_state_bytes(const struct model_config *c, const struct lora_config *lc, int cap_batch,
                       int cap_seq_len) {
  struct glayout p;
  gplan(c, lc, cap_batch, cap_seq_len, &p);
  size_t lb = lbt_floats(c, lc);
  return (p.total + p.scratch) * sizeof(float) + p.ints * sizeof(int) + gen_pack_bytes(c) +
         (lb ? lb * sizeof(float) + sizeof(float *) * LT_COUNT * (size_t)c->num_layers : 0);
}

/* Transposes m's adapter B matrices into s->lbt unless it holds them at m's version already, or
 * they do not fit (an adapter other than the one s was made for: then each call transposes). */
static void lb_refresh(struct gen_state *s, const struct model *m) {
  const struct lora *lo = m->lora;
  s->lbs = NULL;
  if (!lo || !s->lbt || m->cfg.num_layers > s->cfg.num_layers ||
      lbt_floats(&m->cfg, &lo->cfg) > s->lbt_n)
    return;
  if (s->lb_m != m || s->lb_version != m->version) {
    float *q = s->lbt;
    for (int l = 0; l < m->cfg.num_layers; l++)
      for (int t = 0; t < LT_COUNT; t++) {
        const float *b = lo->w[l].b[t];
        int out, in;
        lora_target_dims(t, &m->cfg, &out, &in);
        s->lb[LT_COUNT * l + t] = b ? q : NULL;
        if (!b) continue;
        linear_few_narrow_pack(q, b, lo->cfg.r, out);
        q += linear_few_narrow_floats(lo->cfg.r, out);
      }
    s->lb_m = m, s->lb_version = m->version;
  }
  s->lbs = s->lb;
}

/* Packs m's decoding matrices into s->pack unless it holds them at m's version already. */
static void pack_refresh(struct gen_state *s, const struct model *m) {
  lb_refresh(s, m);
  s->panels = s->pack && !s->pack_off ? s->pk : NULL;
  if (!s->panels || (s->pack_m == m && s->pack_version == m->version)) return;
  const struct model_config *c = &m->cfg;
  int C = c->hidden_size, CQ = c->num_heads * c->head_dim, CKV = c->num_kv_heads * c->head_dim,
      FF = c->intermediate_size, L = c->num_layers;
  float *q = s->pack;
#define PACK(i, w, w16, IN, OUT)                                                                   \
  (linear_lanes_pack(q, w, w16, IN, OUT), s->pk[i] = q, q += linear_lanes_panel_floats(IN, OUT))
  for (int l = 0; l < L; l++) {
    const struct layer_views *w = &m->w.layers[l];
    PACK(7 * l, w->wq, w->wq16, C, CQ);
    PACK(7 * l + 1, w->wk, w->wk16, C, CKV);
    PACK(7 * l + 2, w->wv, w->wv16, C, CKV);
    PACK(7 * l + 3, w->wo, w->wo16, CQ, C);
    PACK(7 * l + 4, w->w_gate, w->w_gate16, C, FF);
    PACK(7 * l + 5, w->w_up, w->w_up16, C, FF);
    PACK(7 * l + 6, w->w_down, w->w_down16, FF, C);
  }
  PACK(7 * L, m->w.lm_head, m->w.lm_head16, C, model_vocab_used(c));
#undef PACK
  s->pack_m = m, s->pack_version = m->version;
}

void gen_state_free(struct gen_state *s) {
  if (!s) return;
  free(s->mem);
  thread_scratch_deinit(&s->scr);
  free(s->ints);
  free(s->tickets);
  free(s->pack);
  free(s->pk);
  free(s->lbt);
  free(s->lb);
  rope_table_deinit(&s->rope);
  free(s);
}

struct gen_state *gen_state_new(const struct model *m, int cap_batch, int cap_seq_len,
                                struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
  const struct lora_config *lc = m->lora ? &m->lora->cfg : NULL;
  if (cap_batch < 1 || cap_seq_len < 2 || cap_seq_len > c->max_position_embeddings) {
    dapo_errf(e, DAPO_EINVAL,
              "generation capacities: batch %d, sequence length %d (need batch >= 1 and "
              "2 <= length <= max_position_embeddings %d)",
              cap_batch, cap_seq_len, c->max_position_embeddings);
    return NULL;
  }
  struct gen_state *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->cfg = *c;
  s->weight_bytes = model_param_count(c) * (int64_t)sizeof(float);
  pool_barrier_init(&s->bar);
  s->cap_batch = cap_batch;
  s->cap_t = cap_seq_len;
  s->cap_rows = cap_batch > cap_seq_len ? cap_batch : cap_seq_len;
  s->lora_r = lc ? lc->r : 0;
  struct glayout p;
  gplan(c, lc, cap_batch, cap_seq_len, &p);
  s->mem = dapo_alloc_floats(p.total);
  s->ints = calloc(p.ints, sizeof(int));
  s->chunk = GEN_CHUNK_DEFAULT;
  s->tickets = calloc(((size_t)PHASES_PER_LAYER * c->num_layers + 2) * TICKET_STRIDE, sizeof(int));
  if (!s->mem || !s->ints || !s->tickets) goto oom;
  if (model_rope_table_init(&s->rope, c)) goto oom;
  if (pack_floats(c)) {
    s->pack = dapo_alloc_floats(pack_floats(c));
    s->pk = calloc(7 * (size_t)c->num_layers + 1, sizeof *s->pk);
    if (!s->pack || !s->pk) goto oom;
  }
  if ((s->lbt_n = lbt_floats(c, lc))) {
    s->lbt = dapo_alloc_floats(s->lbt_n);
    s->lb = calloc(LT_COUNT * (size_t)c->num_layers, sizeof *s->lb);
    if (!s->lbt || !s->lb) goto oom;
  }

  size_t rows = s->cap_rows, C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size;
  float *q = s->mem;
#define TAKE(n) (q += (n), q - (n))
  s->cache_k = TAKE(p.cache / 2);
  s->cache_v = TAKE(p.cache / 2);
  struct block_acts *a = &s->acts;
  a->x_in = a->x_mid = a->x_out = TAKE(rows * C);
  a->xn1 = TAKE(rows * C);
  a->rstd1 = TAKE(rows);
  a->q = TAKE(rows * CQ);
  a->k = TAKE(rows * CKV);
  a->v = TAKE(rows * CKV);
  a->att = TAKE(rows * CQ);
  a->lse = NULL;
  a->xn2 = TAKE(rows * C);
  a->rstd2 = TAKE(rows);
  a->g = TAKE(rows * FF);
  a->u = TAKE(rows * FF);
  a->h = TAKE(rows * FF);
  if (lc) a->lora_tmp = TAKE(rows * (size_t)lc->r);
  s->sel = TAKE(p.sel);
  s->logits = TAKE(p.logits);
  s->pick_p = TAKE(p.pick);
  s->xt_h = (float *)(((uintptr_t)TAKE(p.xt_h) + 63) & ~(uintptr_t)63);
#undef TAKE
  if (thread_scratch_init(&s->scr, p.scratch, NULL)) goto oom;
  int *ip = s->ints;
  s->pos = ip;
  s->row0 = ip + rows;
  s->t_new = ip + 2 * rows;
  s->n_past = ip + 3 * rows;
  s->slot = ip + 4 * rows;
  s->pick_idx = ip + 5 * rows;
  s->active = s->pick_idx + model_vocab_used(c);
  s->src = s->active + cap_batch;
  s->last_row = s->src + cap_batch;
  s->slot_len = s->last_row + rows;
  s->feed_pre = s->slot_len + cap_batch;
  s->feed_len = s->feed_pre + cap_batch;
  s->row_skip = s->feed_len + cap_batch;
  return s;
oom:
  gen_state_free(s);
  dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the KV cache (%zu MiB)",
            gen_state_bytes(c, lc, cap_batch, cap_seq_len) >> 20);
  return NULL;
}

void gen_state_set_pack(struct gen_state *s, int on) {
  s->pack_off = !on;
  s->pack_m = NULL; /* packed again when turned back on */
}

void gen_state_set_split(struct gen_state *s, enum gen_split split) {
  s->split = split;
}

void gen_state_set_chunk(struct gen_state *s, int kib) {
  s->chunk = kib > 0 ? kib : GEN_CHUNK_DEFAULT;
}

void gen_state_set_profile(struct gen_state *s, struct gen_profile *p) {
  s->prof = p;
}

void gen_state_set_delay(struct gen_state *s, int thread, int usec) {
  s->delay_thread = thread;
  s->delay_us = usec > 0 ? usec : 0;
}

void gen_state_set_progress(struct gen_state *s, gen_progress_fn fn, void *ctx) {
  s->progress = fn;
  s->progress_ctx = ctx;
}

void gen_state_set_step(struct gen_state *s, gen_step_fn fn, void *ctx) {
  s->step = fn;
  s->step_ctx = ctx;
}

void gen_state_set_mask(struct gen_state *s, gen_mask_fn fn, void *ctx) {
  s->mask = fn;
  s->mask_ctx = ctx;
}

/* Above this many bytes of weights a decoding step splits by columns: measured on the 2-core
 * development machine (docs/ENGINE.md), its last-level cache holds about 8 MB; the 0.4 MB tiny
 * preset decodes 1.75x faster by rows, the 25 MB small one 1.1x faster by columns (2x at batch
 * 1, where rows leave a thread idle). */
#define DECODE_COLUMNS_MIN_BYTES (4LL << 20)

int gen_state_set_pool(struct gen_state *s, struct pool *p, struct dapo_err *e) {
  int rc = thread_scratch_fit(&s->scr, p, e);
  if (!rc) s->pool = p;
  return rc;
}

int sampler_pick(float *logits, int V, const struct sampler_opts *o, struct rng *r, float *logp,
                 int *scratch_idx, float *scratch_p) {
  /* logits: [V]; the passes over it are softmax.c's (one arithmetic on every instruction set) */
  float mx = smx_max(logits, V);
  if (o->temperature <= 0.0f) {
    *logp = -(float)log(smx_exp_sum(logits, V, 1.0f, mx, NULL, NULL));
    return smx_argmax(logits, V, mx);
  }
  float inv_t = 1.0f / o->temperature, zmax = mx * inv_t;
  int whole = o->top_p >= 1.0f; /* no nucleus: the row's e_j need not be written */
  double sum =
      smx_exp_sum(logits, V, inv_t, zmax, whole ? NULL : scratch_p, whole ? scratch_p : NULL);
  float lse = zmax + (float)log(sum);
  int pick = -1;
  if (whole) {
    pick = smx_draw_chunks(logits, V, inv_t, zmax, scratch_p, rng_float(r) * sum);
  } else {
    /* nucleus: a token whose probability is below (1 - top_p) / (V - 1) can never be inside it */
    float cutoff = V > 1 ? (float)((1.0 - o->top_p) / (V - 1) * sum) : 0.0f;
    int n = smx_at_least(scratch_p, V, cutoff, scratch_idx);
    n = smx_nucleus(scratch_p, V, scratch_idx, n, o->top_p * sum);
    /* the draw among the kept tokens, walked by ascending id */
    double kept = 0, c = 0;
    for (int i = 0; i < n; i++) kept += scratch_p[scratch_idx[i]];
    double u = rng_float(r) * kept;
    pick = n > 0 ? scratch_idx[n - 1] : -1;
    for (int i = 0; i < n; i++) {
      c += scratch_p[scratch_idx[i]];
      if (u < c) {
        pick = scratch_idx[i];
        break;
      }
    }
  }
  if (pick < 0) pick = smx_argmax(logits, V, mx);
  *logp = logits[pick] * inv_t - lse;
  return pick;
}

void sampler_top(const float *logits, int V, float temperature, int k, int *ids, float *logp) {
  /* logits: [V]; the arithmetic is sampler_pick's, expression for expression: the listed
   * log-prob (x * inv_t - 0) - lse is x * inv_t - lse, and greedy's (x * 1 - mx) - lse */
  float mx = smx_max(logits, V);
  int greedy = temperature <= 0.0f;
  float inv_t = greedy ? 1.0f : 1.0f / temperature, zmax = mx * inv_t;
  double sum = smx_exp_sum(logits, V, inv_t, zmax, NULL, NULL);
  float lse = greedy ? (float)log(sum) : zmax + (float)log(sum);
  if (k > V) k = V;
  smx_top(logits, V, inv_t, greedy ? mx : 0.0f, lse, k, ids, logp);
}

/* With o->top_k: the alternatives of sequence q's next token (the slot its len points at), from
 * the logits row it is drawn from. */
static void record_top(struct gen_out *out, int q, int maxn, const float *logits, int V,
                       const struct sampler_opts *o) {
  if (o->top_k <= 0) return;
  size_t at = ((size_t)q * maxn + (size_t)out->len[q]) * (size_t)o->top_k;
  sampler_top(logits, V, o->temperature, o->top_k, out->top_ids + at, out->top_logp + at);
}

static int is_stop(const struct sampler_opts *o, int tok) {
  for (int i = 0; i < o->n_stop; i++)
    if (o->stop_ids[i] == tok) return 1;
  return 0;
}

/* Sequence q's next token and its log-prob; a stop token finishes the sequence. */
static void append_token(struct gen_out *out, int q, int maxn, int tok, float lp,
                         const struct sampler_opts *o) {
  int len = out->len[q];
  out->tokens[(size_t)q * maxn + len] = tok;
  out->logp[(size_t)q * maxn + len] = lp;
  out->len[q] = len + 1;
  if (is_stop(o, tok)) out->finish[q] = FINISH_STOP;
}

static void lm_head(struct gen_state *s, const struct model *m, int n);

/* Runs the blocks over the packed rows already embedded in acts.x_in, then the final norm and LM
 * head over the rows listed in last_row[0..n_out), leaving logits [n_out, V]. */
static int run_rows(struct gen_state *s, const struct model *m, int n_seq, int N, int n_out) {
  int rc = 0;
  const struct model_config *c = &m->cfg;
  int C = c->hidden_size, CKV = c->num_kv_heads * c->head_dim;
  size_t layer_cache = (size_t)s->cap_batch * s->cap_t * CKV;
  for (int l = 0; l < c->num_layers; l++) {
    struct block_seqs bs = {.n_seq = n_seq,
                            .row0 = s->row0,
                            .t_new = s->t_new,
                            .n_past = s->n_past,
                            .pos = s->pos,
                            .cache_k = s->cache_k + l * layer_cache,
                            .cache_v = s->cache_v + l * layer_cache,
                            .slot = s->slot,
                            .cap_t = s->cap_t};
    rc |= block_forward(m, l, &s->acts, &bs, N, &s->rope, s->scr.buf, s->scr.stride);
  }
  for (int i = 0; i < n_out; i++)
    memcpy(s->sel + (size_t)i * C, s->acts.x_out + (size_t)s->last_row[i] * C, sizeof(float) * C);
  rmsnorm_forward(s->sel, s->acts.rstd2, s->sel, m->w.final_norm, n_out, C, c->rms_norm_eps);
  lm_head(s, m, n_out);
  return rc;
}

/* Decoding: columns [lo, hi) of out[n,OUT] = inp . W^T (+ bias, beta) for a float32 or a frozen
 * BF16 matrix, by linear_lanes (each output one chain of fused multiply-adds in increasing k: the
 * same bits for any n, column range, thread or instruction set, and for BF16 weights as for
 * their float32). */
static void few(float *out, const float *inp, const float *xt, const float *w, const uint16_t *w16,
                const float *pk, const float *bias, int n, int IN, int OUT, int lo, int hi,
                float beta) {
  if (pk) /* the same bits from the panels packed beforehand (gen_state.pack) */
    linear_lanes_packed(out, inp, pk, bias, n, IN, OUT, lo, hi, beta);
  else /* the same bits again, inp transposed once for the phase where xt holds it */
    linear_lanes_prepared(out, inp, xt, w, w16, bias, n, IN, OUT, lo, hi, beta);
}

/* A phase's input inp [n, IN] transposed into this thread's xtb for few(), when its products
 * read the weights in place (float32 or BF16; pk NULL); else, or where linear_lanes takes no
 * copy, NULL. One transpose a phase per thread instead of one per call (a phase takes up to 34
 * calls a thread at 0.5B's shapes, and the down projection's chunks of 48 columns could not pay
 * theirs). */
static const float *prepare(float *xtb, const float *inp, int n, int IN, const float *pk,
                            const uint16_t *w16) {
  return pk || !linear_lanes_reads_copy(n, IN, w16 != NULL) ? NULL
                                                            : linear_lanes_prepare(xtb, inp, n, IN);
}

/* One decoding step of the n_act active rows, run by every thread of the pool (ti of nt). Split
 * by columns: in phases separated by barriers, the weight products split by output columns (each
 * thread streams its share of every weight matrix once per step: decoding is bound by reading
 * the weights, linear_few.c), RoPE, the cache append and attention split by rows, the RMSNorms
 * recomputed by every thread into its own buffer (cheaper than another barrier), and sampling by
 * rows. Split by rows: each thread runs the same code alone on its own rows (a group of one, no
 * barriers). Every value is computed the same way for any split, thread count and batch size, so
 * a sequence decodes to the same tokens alone or in a batch. The scratch slice of thread ti
 * holds: attention scores [cap_t], the normed rows [cap_batch, C], sampling's probabilities [V]
 * and indices [V]. */
struct decode_args {
  struct gen_state *s;
  const struct model *m;
  int n_act, maxn;
  const struct sampler_opts *o;
  struct rng *rngs;
  struct gen_out *out;
  int by_rows;     /* each thread decodes its own rows alone (no barriers) */
  int chunk;       /* > 0: the group takes chunks of this many KiB of weights from tickets */
  const int *skip; /* NULL, or per row: 1 when its token is not sampled (gen_advance) */
};

/* Columns of this thread's share of [0, n), in whole panels of LINEAR_FEW_COLS (linear_lanes). */
static void col_share(int n, int ti, int nt, int *lo, int *hi) {
  pool_split((n + LINEAR_FEW_COLS - 1) / LINEAR_FEW_COLS, ti, nt, lo, hi);
  *lo *= LINEAR_FEW_COLS;
  *hi = *hi * LINEAR_FEW_COLS < n ? *hi * LINEAR_FEW_COLS : n;
}

/* The work of one phase of a decoding step, as a queue of ranges over up to 3 matrices' output
 * columns (or over rows: unit 1). Static (ticket NULL): thread gi of gn takes its own share of
 * each matrix once (col_share; rows: pool_split). Dynamic: the group's threads take ranges from
 * one cursor over the phase's columns (every matrix of the phase in one queue), so a thread that
 * loses its core to another process delays its current range only, not the whole phase. Guided:
 * each range is a share of what is left (left / (2 gn), in whole units of GUIDE_COLS), at most
 * `chunk` and at least GUIDE_COLS, so the ranges shrink towards the end of the phase and the
 * threads finish it together (fixed chunks of 1024 KiB, 288 columns at 896 inputs, split Q's 896
 * columns 576 / 320 between two threads where nothing else ran: docs/ENGINE.md). Which thread
 * computes a range never changes its bits: linear_lanes' columns do not depend on the range, and
 * ranges start on its panels (GEN_CHUNK_ALIGN). */
struct phase_q {
  int *ticket; /* NULL: static shares; else the cursor: columns (rows) taken so far */
  int nm, w[3], total, chunk, rows;
  int gi, gn, next;
  long *taken; /* NULL, or counts the column ranges taken (gen_profile.chunks) */
};

/* the guided ranges' unit: whole panels of linear_lanes' block (GEN_CHUNK_ALIGN), whole tiles of
 * rows in the lanes (6, 8 or 12 weight rows), whole blocks of lr_drive's LR_CB (48) columns */
enum { GUIDE_COLS = 48 };
_Static_assert(GEN_CHUNK_ALIGN % LINEAR_FEW_COLS == 0, "chunks must start on linear_lanes' panels");
_Static_assert(GUIDE_COLS % GEN_CHUNK_ALIGN == 0, "guided ranges must start on chunk boundaries");

/* A dynamic chunk's columns of a matrix with IN inputs: kib KiB of its float32 rows, a multiple
 * of GEN_CHUNK_ALIGN (at least one). */
static int chunk_cols(int kib, int IN) {
  long c = (long)kib * 1024 / ((long)IN * 4) / GEN_CHUNK_ALIGN * GEN_CHUNK_ALIGN;
  return c < GEN_CHUNK_ALIGN ? GEN_CHUNK_ALIGN : c > (1 << 20) ? (1 << 20) : (int)c;
}

static void phase_q_init(struct phase_q *q, int *ticket, int chunk, int gi, int gn, int rows,
                         int nm, const int *w, long *taken) {
  *q = (struct phase_q){.ticket = ticket,
                        .nm = nm,
                        .chunk = chunk,
                        .rows = rows,
                        .gi = gi,
                        .gn = gn,
                        .taken = rows ? NULL : taken};
  for (int j = 0; j < nm; j++) q->w[j] = w[j], q->total += w[j];
}

/* The next range [*lo, *hi) of matrix *j; 0 when the phase has no more work for this thread. */
static int phase_q_take(struct phase_q *q, int *j, int *lo, int *hi) {
  if (!q->ticket) {
    while (q->next < q->nm) {
      int m = q->next++;
      if (q->rows)
        pool_split(q->w[m], q->gi, q->gn, lo, hi);
      else
        col_share(q->w[m], q->gi, q->gn, lo, hi);
      if (*lo < *hi) {
        *j = m;
        if (q->taken) ++*q->taken;
        return 1;
      }
    }
    return 0;
  }
  int unit = q->rows ? 1 : GUIDE_COLS, cur = __atomic_load_n(q->ticket, __ATOMIC_RELAXED);
  for (;;) {
    if (cur >= q->total) return 0;
    int m = 0, base = 0;
    while (cur >= base + q->w[m]) base += q->w[m++];
    int size = (q->total - cur) / (2 * q->gn) / unit * unit;
    size = size < unit ? unit : size;
    size = size > q->chunk ? q->chunk : size;
    int end = cur + size < base + q->w[m] ? cur + size : base + q->w[m]; /* within matrix m */
    /* relaxed: the barriers order the phase's data; the cursor only hands out ranges */
    if (__atomic_compare_exchange_n(q->ticket, &cur, end, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      *j = m, *lo = cur - base, *hi = end - base;
      if (q->taken) ++*q->taken;
      return 1;
    }
  }
}

/* The LM head of a prefill: logits [n, V] of the n normed rows in s->sel (one per distinct
 * prompt), by linear_lanes on the pool's threads, each its share of the columns as decode_step
 * splits them, so a sequence's first token comes from decoding's arithmetic. Through OpenBLAS
 * (block_linear), which packs the whole [V, C] matrix on every call, a small model's head with
 * Qwen's vocabulary ([1, 128] x [151669, 128]^T) took 16 ms on one thread, against 3 ms. */
struct head_args {
  struct gen_state *s;
  const struct model *m;
  int n;
};

static void head_cols(void *ctx, int ti, int nt) {
  struct head_args *a = ctx;
  const struct model *m = a->m;
  int lo, hi, V = model_vocab_used(&m->cfg);
  struct pool *saved = pool_current();
  pool_set_current(NULL); /* the kernel runs on this thread alone */
  col_share(V, ti, nt, &lo, &hi);
  const float *const *pk = a->s->panels;
  few(a->s->logits, a->s->sel, NULL, m->w.lm_head, m->w.lm_head16,
      pk ? pk[7 * m->cfg.num_layers] : NULL, NULL, a->n, m->cfg.hidden_size, V, lo, hi, 0.0f);
  pool_set_current(saved);
}

static void lm_head(struct gen_state *s, const struct model *m, int n) {
  struct head_args a = {.s = s, .m = m, .n = n};
  if (s->pool && pool_threads(s->pool) > 1)
    pool_run(s->pool, head_cols, &a);
  else
    head_cols(&a, 0, 1);
}

/* Decoding with an adapter, in two halves so that a phase's columns can be taken in chunks: the
 * thread computes tbuf[n,r] = s (x A^T) whole for target t of layer l (r is small; every thread
 * the same arithmetic for any split) and describes it in ad (ad->xa NULL where the target has no
 * adapter); then lora_xb adds tbuf B^T to columns [lo, hi) of y with linear_few_narrow (16
 * columns in the lanes, one fused multiply-add per k: at r = 16, 64 sequences and 0.5B's widths,
 * one thread, 3.3-3.6x faster than linear_few, whose every output ended in a 16-lane reduction),
 * or few_ad adds it with the product's sums. lora_xa reads the phase's copy of the rows xt where
 * prepare made one (rows in the lanes: A's 16 rows as tiles of 6, 6 and 4 weight rows, none
 * transposed), the same bits as linear_lanes' block, which it took before: 0.5B LoRA r 16, batch
 * 64, AVX-512 on the Xeon, in turns 233.8 / 234.2 -> 242.4 / 241.0 tok/s (every thread computes
 * it whole, so it counted twice); there it also writes tbuf's copy for linear_lanes_adapted, after
 * tbuf in its slot of the scratch. */
static void lora_xa(const struct gen_state *s, const struct lora *lo, int l, int t, const float *x,
                    const float *xt, int n, int IN, float *tbuf, struct lanes_adapter *ad) {
  ad->xa = NULL;
  if (!lo || !lo->w[l].a[t]) return;
  int r = lo->cfg.r;
  linear_lanes_prepared(tbuf, x, xt, lo->w[l].a[t], NULL, NULL, n, IN, r, 0, r, 0.0f);
  for (size_t i = 0; i < (size_t)n * r; i++) tbuf[i] *= lo->scale;
  float *tbt = tbuf + (size_t)s->cap_batch * s->lora_r;
  if (xt) linear_lanes_adapter_t(tbt, tbuf, n, r);
  *ad = (struct lanes_adapter){tbuf, xt ? tbt : NULL, lo->w[l].b[t],
                               s->lbs ? s->lbs[LT_COUNT * l + t] : NULL, r};
}

/* Columns [c_lo, c_hi) of y += tbuf B^T (a phase that adds to its outputs) */
static void lora_xb(const struct lanes_adapter *ad, float *y, int n, int OUT, int c_lo, int c_hi) {
  if (ad->xa) linear_lanes_adapter_add(y, ad, n, OUT, c_lo, c_hi);
}

/* few() (beta 0) and then the adapter's product where ad has one, with the same bits as lora_xb
 * after it: from the phase's copy of the rows (pk NULL) linear_lanes_adapted adds the adapter to
 * the sums in the lanes, and the outputs are written once. */
static void few_ad(float *out, const float *inp, const float *xt, const float *w,
                   const uint16_t *w16, const float *pk, const float *bias, int n, int IN, int OUT,
                   int lo, int hi, const struct lanes_adapter *ad) {
  if (ad->xa && !pk) {
    linear_lanes_adapted(out, inp, xt, w, w16, bias, n, IN, OUT, lo, hi, ad);
    return;
  }
  few(out, inp, xt, w, w16, pk, bias, n, IN, OUT, lo, hi, 0.0f);
  lora_xb(ad, out, n, OUT, lo, hi);
}

static int *step_ticket(const struct decode_args *x, int phase) {
  return x->chunk > 0 ? x->s->tickets + (size_t)phase * TICKET_STRIDE : NULL;
}

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* gen_state_set_profile: the time since the last mark goes to kind k of this thread's row. */
struct prof_mark {
  double *row, t;
};
static void prof(struct prof_mark *pm, int k) {
  if (!pm->row) return;
  double t = mono_s();
  pm->row[k] += t - pm->t;
  pm->t = t;
}

/* Test hook (gen_state_set_delay): this thread sleeps before the work of each phase. */
static void maybe_delay(const struct gen_state *s, int ti) {
  if (s->delay_us > 0 && ti == s->delay_thread) {
    struct timespec ts = {0, 1000L * s->delay_us};
    nanosleep(&ts, NULL);
  }
}

/* The barrier at the end of a phase of kind k (gn threads), with the profile's time and counts. */
static void phase_wait(struct gen_state *s, struct prof_mark *pm, int k, int ti, int gn) {
  prof(pm, k);
  int slept = pool_barrier_wait(&s->bar, gn);
  prof(pm, GEN_PROF_WAIT);
  if (pm->row && gn > 1) {
    s->prof->waits[ti]++;
    s->prof->slept[ti] += slept;
  }
}

static void decode_step(void *ctx, int ti, int nt) {
  struct decode_args *x = ctx;
  struct gen_state *s = x->s;
  const struct model *m = x->m;
  const struct model_config *c = &m->cfg;
  struct pool *saved = pool_current();
  pool_set_current(NULL); /* the kernels called here run on this thread alone */
  int C = c->hidden_size, HS = c->head_dim, NH = c->num_heads, NKV = c->num_kv_heads, CQ = NH * HS,
      CKV = NKV * HS, FF = c->intermediate_size, V = model_vocab_used(c), n_rep = NH / NKV;
  float *scr = s->scr.buf + (size_t)ti * s->scr.stride,
        *xn = scr + (size_t)ATTENTION_DECODE_HEADS * s->cap_t;
  float *pick_p = xn + (size_t)s->cap_batch * C;
  int *pick_idx = (int *)(pick_p + V);
  const struct lora *lo = m->lora;
  /* per adapter target of a phase (three at most: Q, K, V): [cap_batch, r], then its copy for
   * linear_lanes_adapted */
  size_t lr = (size_t)s->cap_batch * (size_t)s->lora_r,
         lrt = lr + linear_lanes_adapter_floats(s->cap_batch, s->lora_r);
  float *lt[3] = {(float *)(pick_idx + V), (float *)(pick_idx + V) + lrt,
                  (float *)(pick_idx + V) + 2 * lrt};
  float *xtb = (float *)(((uintptr_t)(lt[2] + lrt) + 63) & ~(uintptr_t)63); /* prepare()'s */
  const float *xt;
  const struct block_acts *a = &s->acts;
  /* the rows this group of threads computes together, and this thread's place in the group */
  int g_lo = 0, g_hi = x->n_act, gi = ti, gn = nt;
  if (x->by_rows) {
    pool_split(x->n_act, ti, nt, &g_lo, &g_hi);
    gi = 0, gn = 1;
  }
  int n = g_hi - g_lo;
  if (n <= 0) {
    pool_set_current(saved);
    return;
  }
  float *xs = a->x_in + (size_t)g_lo * C, *q = a->q + (size_t)g_lo * CQ,
        *k = a->k + (size_t)g_lo * CKV, *v = a->v + (size_t)g_lo * CKV,
        *att = a->att + (size_t)g_lo * CQ, *gg = a->g + (size_t)g_lo * FF,
        *uu = a->u + (size_t)g_lo * FF, *hh = a->h + (size_t)g_lo * FF,
        *logits = s->logits + (size_t)g_lo * V;
  /* by rows the group is this thread alone: static shares, which are then everything */
  int chunk = gn > 1 ? x->chunk : 0, ph = 0, j, lo_, hi_;
  const int w_qkv[3] = {CQ, CKV, CKV}, w_c[1] = {C}, w_ff[1] = {FF}, w_v[1] = {V}, w_n[1] = {n};
  struct phase_q pq;
  int pt = s->prof && ti < GEN_PROF_THREADS;
  struct prof_mark pm = {pt ? s->prof->sec[ti] : NULL, pt ? mono_s() : 0};
  long *taken = pt ? &s->prof->chunks[ti] : NULL;
#define PHASE(nm, w, rows, IN)                                                                     \
  (maybe_delay(s, ti),                                                                             \
   phase_q_init(&pq, chunk ? step_ticket(x, ph) : NULL, (rows) ? 1 : chunk_cols(chunk, IN), gi,    \
                gn, rows, nm, w, taken),                                                           \
   ph++)
#define WAIT(k) phase_wait(s, &pm, k, ti, gn)
  size_t layer_cache = (size_t)s->cap_batch * s->cap_t * CKV;
  const float *const *pk = s->panels; /* packed matrices (pack_refresh) or NULL */
#define PK(t) (pk ? pk[7 * l + (t)] : NULL)
  for (int l = 0; l < c->num_layers; l++) {
    const struct layer_views *w = &m->w.layers[l];
    rmsnorm_forward(xn, NULL, xs, w->attn_norm, n, C, c->rms_norm_eps);
    struct lanes_adapter ad[3];
    xt = prepare(xtb, xn, n, C, PK(0), w->wq16);
    for (int t = 0; t < 3; t++) lora_xa(s, lo, l, LT_Q + t, xn, xt, n, C, lt[t], &ad[t]);
    prof(&pm, GEN_PROF_NORM);
    PHASE(3, w_qkv, 0, C);
    while (phase_q_take(&pq, &j, &lo_, &hi_)) {
      float *out = j == 0 ? q : j == 1 ? k : v;
      const float *wf = j == 0   ? w->wq
                        : j == 1 ? w->wk
                                 : w->wv,
                  *bias = j == 0   ? w->bq
                          : j == 1 ? w->bk
                                   : w->bv;
      const uint16_t *w16 = j == 0 ? w->wq16 : j == 1 ? w->wk16 : w->wv16;
      few_ad(out, xn, xt, wf, w16, PK(j), bias, n, C, w_qkv[j], lo_, hi_, &ad[j]);
    }
    WAIT(GEN_PROF_QKV);
    float *ck = s->cache_k + l * layer_cache, *cv = s->cache_v + l * layer_cache;
    PHASE(1, w_n, 1, 1);
    while (phase_q_take(&pq, &j, &lo_, &hi_))
      for (int i = lo_; i < hi_; i++) {
        int row = g_lo + i;
        float *qi = q + (size_t)i * CQ, *ki = k + (size_t)i * CKV;
        block_qk_finish(c, w, qi, ki, NULL, NULL, NULL, NULL, s->pos + row, 1, &s->rope);
        size_t base = (size_t)s->slot[row] * s->cap_t;
        int past = s->n_past[row];
        memcpy(ck + (base + past) * CKV, ki, sizeof(float) * CKV);
        memcpy(cv + (base + past) * CKV, v + (size_t)i * CKV, sizeof(float) * CKV);
        for (int g = 0; g < NKV; g++)
          attention_decode(att + (size_t)i * CQ, NULL, qi, ck + base * CKV, cv + base * CKV, past,
                           g * n_rep, n_rep, g, HS, CKV, scr);
      }
    WAIT(GEN_PROF_ATTN);
    xt = prepare(xtb, att, n, CQ, PK(3), w->wo16);
    lora_xa(s, lo, l, LT_O, att, xt, n, CQ, lt[0], &ad[0]);
    prof(&pm, GEN_PROF_NORM);
    PHASE(1, w_c, 0, CQ);
    while (phase_q_take(&pq, &j, &lo_, &hi_)) {
      few(xs, att, xt, w->wo, w->wo16, PK(3), w->bo, n, CQ, C, lo_, hi_, 1.0f);
      lora_xb(&ad[0], xs, n, C, lo_, hi_);
    }
    WAIT(GEN_PROF_O);
    rmsnorm_forward(xn, NULL, xs, w->ffn_norm, n, C, c->rms_norm_eps);
    xt = prepare(xtb, xn, n, C, PK(4), w->w_gate16);
    lora_xa(s, lo, l, LT_GATE, xn, xt, n, C, lt[0], &ad[0]);
    lora_xa(s, lo, l, LT_UP, xn, xt, n, C, lt[1], &ad[1]);
    /* split by columns, the down projection's input is transposed by the threads that compute
     * its columns, into one shared copy (not by every thread whole after the barrier) */
    const float *xt_h = x->by_rows || PK(6) || !linear_lanes_reads_copy(n, FF, w->w_down16 != NULL)
                            ? NULL
                            : linear_lanes_prepare_cols(s->xt_h, hh, n, FF, 0, 0);
    prof(&pm, GEN_PROF_NORM);
    PHASE(1, w_ff, 0, C);
    while (phase_q_take(&pq, &j, &lo_, &hi_))
      for (int c0 = lo_, c1; c0 < hi_; c0 = c1) { /* FF_COLS at a time: gg, uu in cache */
        c1 = hi_ - c0 < 2 * FF_COLS ? hi_ : c0 + FF_COLS;
        few_ad(gg, xn, xt, w->w_gate, w->w_gate16, PK(4), NULL, n, C, FF, c0, c1, &ad[0]);
        few_ad(uu, xn, xt, w->w_up, w->w_up16, PK(5), NULL, n, C, FF, c0, c1, &ad[1]);
        for (int i = 0; i < n; i++) {
          size_t o = (size_t)i * FF + c0;
          swiglu_forward(hh + o, gg + o, uu + o, (size_t)(c1 - c0));
        }
        if (xt_h) linear_lanes_prepare_cols(s->xt_h, hh, n, FF, c0, c1);
      }
    WAIT(GEN_PROF_FFN);
    xt = xt_h ? xt_h : prepare(xtb, hh, n, FF, PK(6), w->w_down16);
    lora_xa(s, lo, l, LT_DOWN, hh, xt, n, FF, lt[0], &ad[0]);
    prof(&pm, GEN_PROF_NORM);
    PHASE(1, w_c, 0, FF);
    while (phase_q_take(&pq, &j, &lo_, &hi_)) {
      few(xs, hh, xt, w->w_down, w->w_down16, PK(6), NULL, n, FF, C, lo_, hi_, 1.0f);
      lora_xb(&ad[0], xs, n, C, lo_, hi_);
    }
    WAIT(GEN_PROF_DOWN);
  }
  rmsnorm_forward(xn, NULL, xs, m->w.final_norm, n, C, c->rms_norm_eps);
  xt = prepare(xtb, xn, n, C, pk ? pk[7 * c->num_layers] : NULL, m->w.lm_head16);
  prof(&pm, GEN_PROF_NORM);
  PHASE(1, w_v, 0, C);
  while (phase_q_take(&pq, &j, &lo_, &hi_))
    few(logits, xn, xt, m->w.lm_head, m->w.lm_head16, pk ? pk[7 * c->num_layers] : NULL, NULL, n, C,
        V, lo_, hi_, 0.0f);
#undef PK
  WAIT(GEN_PROF_HEAD);
  PHASE(1, w_n, 1, 1);
  while (phase_q_take(&pq, &j, &lo_, &hi_))
    for (int i = lo_; i < hi_; i++) {
      if (x->skip && x->skip[g_lo + i]) continue;
      int qq = s->active[g_lo + i];
      float lp;
      if (s->mask) s->mask(s->mask_ctx, qq, logits + (size_t)i * V, V);
      record_top(x->out, qq, x->maxn, logits + (size_t)i * V, V, x->o);
      int tok = sampler_pick(logits + (size_t)i * V, V, x->o, &x->rngs[qq], &lp, pick_idx, pick_p);
      append_token(x->out, qq, x->maxn, tok, lp, x->o);
    }
#undef PHASE
#undef WAIT
  prof(&pm, GEN_PROF_SAMPLE);
  pool_set_current(saved);
}

/* Whether decode_step splits a step by rows (gen_state_set_split; AUTO: small weights). */
static int decode_by_rows(const struct gen_state *s) {
  return s->split == GEN_SPLIT_ROWS ||
         (s->split == GEN_SPLIT_AUTO && s->weight_bytes < DECODE_COLUMNS_MIN_BYTES);
}

/* One decoding step on the pool (or serially): the tickets of a dynamic split start at 0 (the
 * pool's lock orders these stores before the threads' first take). */
static void run_step(struct gen_state *s, struct decode_args *da) {
  da->by_rows = decode_by_rows(s);
  da->chunk = !da->by_rows && s->split != GEN_SPLIT_COLUMNS ? s->chunk : 0;
  int nt = s->pool ? pool_threads(s->pool) : 1;
  if (nt > 1 && da->chunk)
    memset(s->tickets, 0,
           ((size_t)PHASES_PER_LAYER * s->cfg.num_layers + 2) * TICKET_STRIDE * sizeof(int));
  if (nt > 1)
    pool_run(s->pool, decode_step, da);
  else
    decode_step(da, 0, 1);
}

static void embed(struct gen_state *s, const struct model *m, int row, int tok) {
  block_embed(m, tok, s->acts.x_in + (size_t)row * m->cfg.hidden_size);
}

static int gen_run_impl(struct gen_state *s, const struct model *m, int n,
                        const int *const *prompts, const int *prompt_len, struct rng *rngs,
                        const struct sampler_opts *o, struct gen_out *out,
                        const volatile int *cancel, struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
  int V = model_vocab_used(c), maxn = o->max_new_tokens;
  if (n < 1 || n > s->cap_batch)
    return dapo_errf(e, DAPO_ERANGE, "generate: %d sequences (capacity %d)", n, s->cap_batch);
  if (m->lora && m->lora->cfg.r > s->lora_r)
    return dapo_errf(e, DAPO_EINVAL,
                     "generate: the state was sized without the model's adapter (create it after "
                     "attaching the adapter)");
  if (maxn < 1) return dapo_errf(e, DAPO_EINVAL, "max_new_tokens: %d must be >= 1", maxn);
  if (!(o->temperature >= 0.0f) || !(o->top_p > 0.0f && o->top_p <= 1.0f))
    return dapo_errf(e, DAPO_EINVAL, "temperature %g must be >= 0 and top_p %g in (0, 1]",
                     (double)o->temperature, (double)o->top_p);
  if (o->top_k < 0 || o->top_k > SAMPLER_TOP_MAX || o->top_k > V ||
      (o->top_k && (!out->top_ids || !out->top_logp)))
    return dapo_errf(e, DAPO_EINVAL,
                     "top_k %d must be in [0, %d] (and the vocabulary), with its arrays", o->top_k,
                     SAMPLER_TOP_MAX);
  for (int i = 0; i < n; i++) {
    if (prompt_len[i] < 1 || prompt_len[i] + maxn > s->cap_t)
      return dapo_errf(e, DAPO_ERANGE,
                       "generate: sequence %d: prompt %d + max_new_tokens %d tokens exceed the "
                       "sequence capacity %d",
                       i, prompt_len[i], maxn, s->cap_t);
    for (int t = 0; t < prompt_len[i]; t++)
      if (prompts[i][t] < 0 || prompts[i][t] >= V)
        return dapo_errf(e, DAPO_EINVAL, "generate: sequence %d: token %d outside the vocabulary",
                         i, prompts[i][t]);
  }
  int CKV = c->num_kv_heads * c->head_dim;
  size_t layer_cache = (size_t)s->cap_batch * s->cap_t * CKV;
  for (int i = 0; i < n; i++) s->slot_len[i] = 0; /* gen_advance finds them empty */

  /* prefill: each distinct prompt once; src[i] = the sequence whose cache i copies */
  for (int i = 0; i < n; i++) {
    s->src[i] = i;
    for (int j = 0; j < i; j++)
      if (prompts[j] == prompts[i] && prompt_len[j] == prompt_len[i]) {
        s->src[i] = j;
        break;
      }
  }
  int i = 0;
  while (i < n) {
    /* pack distinct prompts up to cap_rows rows */
    int n_seq = 0, N = 0;
    for (; i < n; i++) {
      if (s->src[i] != i) continue;
      if (N + prompt_len[i] > s->cap_rows) break;
      s->row0[n_seq] = N;
      s->t_new[n_seq] = prompt_len[i];
      s->n_past[n_seq] = 0;
      s->slot[n_seq] = i;
      for (int t = 0; t < prompt_len[i]; t++) {
        s->pos[N + t] = t;
        embed(s, m, N + t, prompts[i][t]);
      }
      N += prompt_len[i];
      s->last_row[n_seq] = N - 1;
      n_seq++;
    }
    if (run_rows(s, m, n_seq, N, n_seq))
      return dapo_errf(e, DAPO_ENOMEM, "generate: out of memory for a BF16 weight tile");
    /* sample the first token of every sequence whose prompt was in this chunk */
    for (int k = 0; k < n_seq; k++) {
      int owner = s->slot[k];
      for (int q = owner; q < n; q++) {
        if (s->src[q] != owner) continue;
        if (q != owner)
          for (int l = 0; l < c->num_layers; l++) {
            size_t from = l * layer_cache + (size_t)owner * s->cap_t * CKV;
            size_t to = l * layer_cache + (size_t)q * s->cap_t * CKV;
            size_t cnt = (size_t)prompt_len[q] * CKV;
            memcpy(s->cache_k + to, s->cache_k + from, cnt * sizeof(float));
            memcpy(s->cache_v + to, s->cache_v + from, cnt * sizeof(float));
          }
        float lp;
        float *lg = s->logits + (size_t)k * V;
        out->len[q] = 0;
        out->finish[q] = FINISH_LENGTH;
        if (s->mask) s->mask(s->mask_ctx, q, lg, V);
        record_top(out, q, maxn, lg, V, o);
        int tok = sampler_pick(lg, V, o, &rngs[q], &lp, s->pick_idx, s->pick_p);
        append_token(out, q, maxn, tok, lp, o);
      }
    }
  }

  /* decode: all unfinished sequences advance together */
  int64_t sampled = n; /* every sequence has its first token */
  for (;;) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) /* set by another thread */
      return dapo_errf(e, DAPO_ECANCELLED, "generation cancelled");
    if (s->step) s->step(s->step_ctx, out, n, maxn); /* it may end sequences */
    int n_act = 0;
    for (int q = 0; q < n; q++) {
      int len = out->len[q];
      if (out->finish[q] == FINISH_STOP || len >= maxn) continue;
      /* row n_act: the token at position pos, appended to sequence q's cache slot */
      s->n_past[n_act] = s->pos[n_act] = prompt_len[q] + len - 1;
      s->slot[n_act] = s->active[n_act] = q;
      embed(s, m, n_act, out->tokens[(size_t)q * maxn + len - 1]);
      n_act++;
    }
    if (s->progress) s->progress(s->progress_ctx, sampled, n - n_act);
    if (n_act == 0) break;
    sampled += n_act;
    struct decode_args da = {
        .s = s, .m = m, .n_act = n_act, .maxn = maxn, .o = o, .rngs = rngs, .out = out};
    run_step(s, &da);
  }
  return 0;
}

int gen_run(struct gen_state *s, const struct model *m, int n, const int *const *prompts,
            const int *prompt_len, struct rng *rngs, const struct sampler_opts *o,
            struct gen_out *out, const volatile int *cancel, struct dapo_err *e) {
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  pack_refresh(s, m);
  int rc = gen_run_impl(s, m, n, prompts, prompt_len, rngs, o, out, cancel, e);
  pool_set_current(saved);
  return rc;
}

/* ---- multi-turn generation (gen_advance) ---------------------------------------------------- */

void gen_slot_clear(struct gen_state *s, int slot) {
  if (slot >= 0 && slot < s->cap_batch) s->slot_len[slot] = 0;
}

int gen_slot_len(const struct gen_state *s, int slot) {
  return slot >= 0 && slot < s->cap_batch ? s->slot_len[slot] : 0;
}

/* Whether a feed is a prefill (run alone through the packed block forward, as gen_run's prompts
 * are): anything fed into an empty slot, or more than GEN_DECODE_FEED_MAX tokens. Anything else
 * goes through decoding steps (decode_step, as gen_run's later tokens do), one token a step,
 * batched with the other feeds: a tool's short answer costs a few decoding steps shared by every
 * episode that is ready, not a forward pass of its own. The choice depends on the feed and its
 * slot alone, and neither path's arithmetic depends on the batch, so a sequence gets the same
 * bits whatever runs beside it. */
static int is_prefill(const struct gen_state *s, const struct gen_feed *f) {
  return f->n > GEN_DECODE_FEED_MAX || s->slot_len[f->slot] == 0;
}

static int advance_impl(struct gen_state *s, const struct model *m, int n,
                        const struct gen_feed *feeds, struct rng *rngs,
                        const struct sampler_opts *o, int *tok, float *lp, struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
  int V = model_vocab_used(c);
  if (n < 1 || n > s->cap_batch)
    return dapo_errf(e, DAPO_ERANGE, "advance: %d sequences (capacity %d)", n, s->cap_batch);
  if (m->lora && m->lora->cfg.r > s->lora_r)
    return dapo_errf(e, DAPO_EINVAL,
                     "advance: the state was sized without the model's adapter (create it after "
                     "attaching the adapter)");
  if (!(o->temperature >= 0.0f) || !(o->top_p > 0.0f && o->top_p <= 1.0f))
    return dapo_errf(e, DAPO_EINVAL, "temperature %g must be >= 0 and top_p %g in (0, 1]",
                     (double)o->temperature, (double)o->top_p);
  for (int i = 0; i < n; i++) {
    const struct gen_feed *f = &feeds[i];
    if (f->slot < 0 || f->slot >= s->cap_batch)
      return dapo_errf(e, DAPO_ERANGE, "advance: feed %d: slot %d (capacity %d)", i, f->slot,
                       s->cap_batch);
    for (int j = 0; j < i; j++)
      if (feeds[j].slot == f->slot)
        return dapo_errf(e, DAPO_EINVAL, "advance: slot %d fed twice", f->slot);
    /* the sampled token is fed next: it needs a place too */
    if (f->n < 1 || s->slot_len[f->slot] + f->n + 1 > s->cap_t)
      return dapo_errf(e, DAPO_ERANGE,
                       "advance: feed %d: %d tokens after %d (and the one sampled) exceed the "
                       "sequence capacity %d",
                       i, f->n, s->slot_len[f->slot], s->cap_t);
    for (int t = 0; t < f->n; t++)
      if (f->tokens[t] < 0 || f->tokens[t] >= V)
        return dapo_errf(e, DAPO_EINVAL, "advance: feed %d: token %d outside the vocabulary", i,
                         f->tokens[t]);
  }
  int CKV = c->num_kv_heads * c->head_dim;
  size_t layer_cache = (size_t)s->cap_batch * s->cap_t * CKV;

  /* prefills: a feed into an empty slot with the tokens (pointer and length) of an earlier one
   * into an empty slot copies that one's cache and logits (gen_run's shared prompts) */
  for (int i = 0; i < n; i++) {
    s->feed_pre[i] = is_prefill(s, &feeds[i]);
    s->src[i] = i;
    if (!s->feed_pre[i] || s->slot_len[feeds[i].slot]) continue;
    for (int j = 0; j < i; j++)
      if (s->feed_pre[j] && !s->slot_len[feeds[j].slot] && feeds[j].tokens == feeds[i].tokens &&
          feeds[j].n == feeds[i].n) {
        s->src[i] = j;
        break;
      }
  }
  /* each distinct prefill alone (rows of no other sequence beside it), so that its arithmetic
   * depends on the feed and the slot's past alone: which sequences are ready together (tools
   * answer when they answer) never changes a bit */
  for (int i = 0; i < n; i++) {
    const struct gen_feed *f = &feeds[i];
    if (!s->feed_pre[i] || s->src[i] != i) continue;
    int past = s->slot_len[f->slot];
    s->row0[0] = 0;
    s->t_new[0] = f->n;
    s->n_past[0] = past;
    s->slot[0] = f->slot;
    for (int t = 0; t < f->n; t++) {
      s->pos[t] = past + t;
      embed(s, m, t, f->tokens[t]);
    }
    s->last_row[0] = f->n - 1;
    if (run_rows(s, m, 1, f->n, 1))
      return dapo_errf(e, DAPO_ENOMEM, "advance: out of memory for a BF16 weight tile");
    for (int q = i; q < n; q++) {
      if (s->src[q] != i || !s->feed_pre[q]) continue;
      if (q != i)
        for (int l = 0; l < c->num_layers; l++) {
          size_t a = l * layer_cache + (size_t)f->slot * s->cap_t * CKV;
          size_t b = l * layer_cache + (size_t)feeds[q].slot * s->cap_t * CKV;
          size_t cnt = (size_t)f->n * CKV;
          memcpy(s->cache_k + b, s->cache_k + a, cnt * sizeof(float));
          memcpy(s->cache_v + b, s->cache_v + a, cnt * sizeof(float));
        }
      if (s->mask) s->mask(s->mask_ctx, q, s->logits, V);
      tok[q] = sampler_pick(s->logits, V, o, &rngs[q], &lp[q], s->pick_idx, s->pick_p);
    }
  }

  /* decoding steps: every other feed, its tokens one a step, the feeds that still have one
   * batched; the token after a feed's last is sampled (decode_step appends it to gen_out row q,
   * feed_len 0 before) */
  int steps = 0;
  for (int q = 0; q < n; q++) {
    s->feed_len[q] = 0;
    if (!s->feed_pre[q] && feeds[q].n > steps) steps = feeds[q].n;
  }
  struct sampler_opts od = *o;
  od.n_stop = 0; /* gen_out.finish is not used: the caller decides where a turn ends */
  od.top_k = 0;  /* nowhere to list alternatives */
  struct gen_out out = {.tokens = tok, .logp = lp, .len = s->feed_len, .finish = NULL};
  for (int t = 0; t < steps; t++) {
    int n_act = 0;
    for (int q = 0; q < n; q++) {
      if (s->feed_pre[q] || t >= feeds[q].n) continue;
      s->n_past[n_act] = s->pos[n_act] = s->slot_len[feeds[q].slot] + t;
      s->slot[n_act] = feeds[q].slot;
      s->active[n_act] = q;
      s->row_skip[n_act] = t != feeds[q].n - 1;
      embed(s, m, n_act, feeds[q].tokens[t]);
      n_act++;
    }
    struct decode_args da = {.s = s,
                             .m = m,
                             .n_act = n_act,
                             .maxn = 1,
                             .o = &od,
                             .rngs = rngs,
                             .out = &out,
                             .skip = s->row_skip};
    run_step(s, &da);
  }
  for (int q = 0; q < n; q++) s->slot_len[feeds[q].slot] += feeds[q].n;
  return 0;
}

int gen_advance(struct gen_state *s, const struct model *m, int n, const struct gen_feed *feeds,
                struct rng *rngs, const struct sampler_opts *o, int *tok, float *logp,
                struct dapo_err *e) {
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  pack_refresh(s, m);
  int rc = advance_impl(s, m, n, feeds, rngs, o, tok, logp, e);
  pool_set_current(saved);
  return rc;
}

/* ---- the split chosen by measuring (gen_state_tune) ----------------------------------------- */

/* The candidates gen_state_tune times: rows, static columns, and dynamic columns at two chunk
 * sizes (docs/ENGINE.md, "Where decoding's time goes": static was 4% faster than chunks of 256
 * KiB on the quiet 2-vCPU Xeon, chunks up to 1.29x faster than static beside other work; chunks
 * of 64 KiB were never the fastest at 0.5B). */
static const struct {
  enum gen_split split;
  int kib;
} tune_cands[] = {{GEN_SPLIT_ROWS, 0},
                  {GEN_SPLIT_COLUMNS, 0},
                  {GEN_SPLIT_DYNAMIC, 256},
                  {GEN_SPLIT_DYNAMIC, 1024}};
enum { TUNE_CANDS = sizeof tune_cands / sizeof tune_cands[0], TUNE_ROUNDS = 3 };
_Static_assert(TUNE_CANDS == 4, "gen_tune_pick takes 4 medians");

/* The fastest median; static columns only where they beat the fastest dynamic split by more than
 * GEN_TUNE_STATIC_MARGIN, else the fastest of the others: static stalls every thread on the
 * slowest at each phase, so a neighbour that arrives after the timing costs it most (2-vCPU Zen
 * 3, one process in turns: dynamic 1.14x static, yet static won one of three tunings by 2%; the
 * quiet Xeon's 6% lead of static stays chosen). */
int gen_tune_pick(const double med[4]) {
  int stat = -1, dyn = -1, best = -1; /* best: the fastest but static columns */
  for (int c = 0; c < TUNE_CANDS; c++) {
    if (tune_cands[c].split == GEN_SPLIT_COLUMNS) {
      stat = c;
      continue;
    }
    if (best < 0 || med[c] < med[best]) best = c;
    if (tune_cands[c].split == GEN_SPLIT_DYNAMIC && (dyn < 0 || med[c] < med[dyn])) dyn = c;
  }
  int static_wins = stat >= 0 && med[stat] < med[best] &&
                    (dyn < 0 || med[stat] * (1.0 + GEN_TUNE_STATIC_MARGIN) < med[dyn]);
  return static_wins ? stat : best;
}

int gen_state_tune(struct gen_state *s, const struct model *m, int batch, struct dapo_err *e) {
  if (!s->pool || pool_threads(s->pool) < 2) return 0; /* one thread: nothing to split */
  if (batch > s->cap_batch) batch = s->cap_batch;
  if (batch < 1) batch = 1;
  int V = model_vocab_used(&m->cfg), pos = s->cap_t / 2;
  int *tok = calloc((size_t)batch * 3, sizeof(int));
  float *lp = calloc((size_t)batch, sizeof(float));
  struct rng *rngs = calloc((size_t)batch, sizeof *rngs);
  if (!tok || !lp || !rngs) {
    free(tok), free(lp), free(rngs);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory timing the decoding splits");
  }
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  pack_refresh(s, m); /* timed as gen_run will decode */
  gen_mask_fn mask = s->mask;
  s->mask = NULL;
  double t[TUNE_CANDS][TUNE_ROUNDS];
  /* rows at mid-capacity (a cache half full: attention's share as in a typical step), the
   * rounds in turns (candidate 1, 2, ..., then again) after one warm-up step */
  for (int r = -1; r < TUNE_ROUNDS; r++)
    for (int c = 0; c < (r < 0 ? 1 : TUNE_CANDS); c++) {
      for (int i = 0; i < batch; i++) {
        s->n_past[i] = s->pos[i] = pos;
        s->slot[i] = s->active[i] = i;
        tok[i] = tok[batch + i] = 0;
        rng_seed(&rngs[i], 1, (uint64_t)i);
        embed(s, m, i, (i * 7919) % V);
      }
      struct sampler_opts o = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 1};
      struct gen_out out = {
          .tokens = tok, .logp = lp, .len = tok + batch, .finish = tok + 2 * batch};
      struct decode_args da = {
          .s = s, .m = m, .n_act = batch, .maxn = 1, .o = &o, .rngs = rngs, .out = &out};
      s->split = tune_cands[c].split;
      int chunk0 = s->chunk;
      s->chunk = tune_cands[c].kib ? tune_cands[c].kib : chunk0;
      double t0 = mono_s();
      run_step(s, &da);
      if (r >= 0) t[c][r] = mono_s() - t0;
      s->chunk = chunk0;
    }
  pool_set_current(saved);
  for (int c = 0; c < TUNE_CANDS; c++) { /* the median of its rounds */
    double *v = t[c], lo = fmin(v[0], fmin(v[1], v[2])), hi = fmax(v[0], fmax(v[1], v[2]));
    s->tune_s[c] = v[0] + v[1] + v[2] - lo - hi;
  }
  int best = gen_tune_pick(s->tune_s);
  s->mask = mask;
  s->split = tune_cands[best].split;
  if (tune_cands[best].kib) s->chunk = tune_cands[best].kib;
  s->tuned = 1;
  free(tok), free(lp), free(rngs);
  return 0;
}

const char *gen_state_describe_split(const struct gen_state *s, char *buf, size_t n) {
  int by_rows = decode_by_rows(s);
  int off = snprintf(buf, n, "%s",
                     by_rows                         ? "rows"
                     : s->split == GEN_SPLIT_COLUMNS ? "static columns"
                                                     : "dynamic columns");
  if (!by_rows && s->split != GEN_SPLIT_COLUMNS && off >= 0 && (size_t)off < n)
    off += snprintf(buf + off, n - (size_t)off, " (guided, ranges of up to %d KiB)", s->chunk);
  if (s->tuned && off >= 0 && (size_t)off < n) {
    off += snprintf(buf + off, n - (size_t)off, "; measured per step:");
    for (int c = 0; c < TUNE_CANDS && off >= 0 && (size_t)off < n; c++) {
      off += snprintf(buf + off, n - (size_t)off, "%s %s", c ? "," : "",
                      tune_cands[c].split == GEN_SPLIT_ROWS      ? "rows"
                      : tune_cands[c].split == GEN_SPLIT_COLUMNS ? "static columns"
                                                                 : "dynamic");
      if (tune_cands[c].kib && off >= 0 && (size_t)off < n)
        off += snprintf(buf + off, n - (size_t)off, " %d KiB", tune_cands[c].kib);
      if (off >= 0 && (size_t)off < n)
        off += snprintf(buf + off, n - (size_t)off, " %.2f ms", s->tune_s[c] * 1e3);
    }
  }
  return buf;
}
