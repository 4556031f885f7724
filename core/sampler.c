/* Batched KV-cache generation (sampler.h). Prefill runs each distinct prompt once through the
 * shared block forward (sequences with the same prompt copy its cache rows); decoding then feeds
 * all active sequences as one [B, C] batch per step, so every weight product is a GEMM. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "kernels.h"
#include "pool.h"

struct gen_state {
  struct model_config cfg;
  int cap_batch, cap_t, cap_rows;
  float *mem;
  struct rope_table rope;
  float *cache_k, *cache_v;  /* [L][cap_batch * cap_t][CKV] */
  struct block_acts acts;    /* one set, x_in == x_mid == x_out */
  float *sel, *logits;       /* [cap_rows, C], [cap_rows, V] */
  struct thread_scratch scr; /* attention scratch per pool thread */
  struct pool *pool;         /* borrowed */
  float *pick_p;             /* [V] */
  int *ints;                 /* pos, row0, t_new, n_past, slot: cap_rows each; idx[V]; misc */
  int *pos, *row0, *t_new, *n_past, *slot, *pick_idx, *active, *src, *last_row;
  int *iota; /* 0, 1, 2, ...: the row offsets of a decoding slice */
};

struct glayout {
  size_t cache, acts, sel, logits, scratch, pick, total, ints;
};

static void gplan(const struct model_config *c, int B, int T, struct glayout *p) {
  size_t C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size, L = c->num_layers,
         V = c->vocab_size;
  size_t rows = (size_t)(B > T ? B : T);
  p->cache = 2 * L * (size_t)B * T * CKV;
  p->acts = rows * (C + C + 1 + CQ + 2 * CKV + CQ + C + 1 + 3 * FF);
  p->sel = rows * C;
  p->logits = rows * V;
  p->scratch = (size_t)T * T;
  p->pick = V;
  p->total = p->cache + p->acts + p->sel + p->logits + p->pick;
  p->ints = rows * 5 + V + 3 * (size_t)B + rows + rows;
}

size_t gen_state_bytes(const struct model_config *c, int cap_batch, int cap_seq_len) {
  struct glayout p;
  gplan(c, cap_batch, cap_seq_len, &p);
  return (p.total + p.scratch) * sizeof(float) + p.ints * sizeof(int);
}

void gen_state_free(struct gen_state *s) {
  if (!s) return;
  free(s->mem);
  thread_scratch_deinit(&s->scr);
  free(s->ints);
  rope_table_deinit(&s->rope);
  free(s);
}

struct gen_state *gen_state_new(const struct model *m, int cap_batch, int cap_seq_len,
                                struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
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
  s->cap_batch = cap_batch;
  s->cap_t = cap_seq_len;
  s->cap_rows = cap_batch > cap_seq_len ? cap_batch : cap_seq_len;
  struct glayout p;
  gplan(c, cap_batch, cap_seq_len, &p);
  s->mem = dapo_alloc_floats(p.total);
  s->ints = calloc(p.ints, sizeof(int));
  if (!s->mem || !s->ints) goto oom;
  if (rope_table_init(&s->rope, c->max_position_embeddings, c->head_dim, c->rope_theta)) goto oom;

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
  s->sel = TAKE(p.sel);
  s->logits = TAKE(p.logits);
  s->pick_p = TAKE(p.pick);
#undef TAKE
  if (thread_scratch_init(&s->scr, p.scratch, NULL)) goto oom;
  int *ip = s->ints;
  s->pos = ip;
  s->row0 = ip + rows;
  s->t_new = ip + 2 * rows;
  s->n_past = ip + 3 * rows;
  s->slot = ip + 4 * rows;
  s->pick_idx = ip + 5 * rows;
  s->active = s->pick_idx + c->vocab_size;
  s->src = s->active + cap_batch;
  s->last_row = s->src + cap_batch;
  s->iota = s->last_row + rows;
  for (size_t i = 0; i < rows; i++) s->iota[i] = (int)i;
  return s;
oom:
  gen_state_free(s);
  dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the KV cache (%zu MiB)",
            gen_state_bytes(c, cap_batch, cap_seq_len) >> 20);
  return NULL;
}

int gen_state_set_pool(struct gen_state *s, struct pool *p, struct dapo_err *e) {
  int rc = thread_scratch_fit(&s->scr, p, e);
  if (!rc) s->pool = p;
  return rc;
}

/* Descending probability, ties by ascending index: a total order, so sorting is deterministic.
 * The probabilities come through qsort_r's argument (no shared state: samplers of different
 * jobs run at the same time). */
static int cmp_desc(const void *a, const void *b, void *ctx) {
  const float *p = ctx;
  int i = *(const int *)a, j = *(const int *)b;
  if (p[i] != p[j]) return p[i] > p[j] ? -1 : 1;
  return i - j;
}

int sampler_pick(float *logits, int V, const struct sampler_opts *o, struct rng *r, float *logp,
                 int *scratch_idx, float *scratch_p) {
  /* logits: [V] */
  float mx = -INFINITY;
  int arg = 0;
  for (int j = 0; j < V; j++)
    if (logits[j] > mx) {
      mx = logits[j];
      arg = j;
    }
  if (o->temperature <= 0.0f) {
    double sum = 0;
    for (int j = 0; j < V; j++) sum += expf(logits[j] - mx);
    *logp = -(float)log(sum);
    return arg;
  }
  float inv_t = 1.0f / o->temperature, zmax = mx * inv_t;
  double sum = 0;
  for (int j = 0; j < V; j++) {
    float p = expf(logits[j] * inv_t - zmax);
    scratch_p[j] = p;
    sum += p;
  }
  float lse = zmax + (float)log(sum);
  int pick = -1;
  if (o->top_p >= 1.0f) {
    double u = rng_float(r) * sum, c = 0;
    for (int j = 0; j < V; j++) {
      c += scratch_p[j];
      if (scratch_p[j] > 0) pick = j;
      if (u < c) break;
    }
  } else {
    /* nucleus: a token whose probability is below (1 - top_p) / (V - 1) can never be inside it */
    float cutoff = (float)((1.0 - o->top_p) / (V - 1) * sum);
    int n = 0;
    for (int j = 0; j < V; j++)
      if (scratch_p[j] >= cutoff) scratch_idx[n++] = j;
    qsort_r(scratch_idx, (size_t)n, sizeof(int), cmp_desc, scratch_p);
    double target = o->top_p * sum, c = 0;
    int last = n - 1;
    for (int i = 0; i < n; i++) {
      c += scratch_p[scratch_idx[i]];
      if (c >= target) {
        last = i;
        break;
      }
    }
    double kept = 0;
    for (int i = 0; i <= last; i++) kept += scratch_p[scratch_idx[i]];
    double u = rng_float(r) * kept;
    c = 0;
    pick = scratch_idx[last];
    for (int i = 0; i <= last; i++) {
      c += scratch_p[scratch_idx[i]];
      if (u < c) {
        pick = scratch_idx[i];
        break;
      }
    }
  }
  if (pick < 0) pick = arg;
  *logp = logits[pick] * inv_t - lse;
  return pick;
}

static int is_stop(const struct sampler_opts *o, int tok) {
  for (int i = 0; i < o->n_stop; i++)
    if (o->stop_ids[i] == tok) return 1;
  return 0;
}

/* Runs the blocks over the packed rows already embedded in acts.x_in, then the final norm and LM
 * head over the rows listed in last_row[0..n_out), leaving logits [n_out, V]. */
static void run_rows(struct gen_state *s, const struct model *m, int n_seq, int N, int n_out) {
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
    block_forward(c, &m->w.layers[l], &s->acts, &bs, N, &s->rope, s->scr.buf, s->scr.stride);
  }
  for (int i = 0; i < n_out; i++)
    memcpy(s->sel + (size_t)i * C, s->acts.x_out + (size_t)s->last_row[i] * C, sizeof(float) * C);
  rmsnorm_forward(s->sel, s->acts.rstd2, s->sel, m->w.final_norm, n_out, C, c->rms_norm_eps);
  matmul_forward(s->logits, s->sel, m->w.lm_head, NULL, n_out, C, c->vocab_size, 0.0f);
}

/* One decoding step of rows [lo, hi) on the calling thread alone: decoding rows are independent
 * sequences, so each pool thread runs its slice through every layer with serial kernels, one
 * pool_run per step instead of one per kernel (whose wake-ups would cost more than the work). */
struct decode_args {
  struct gen_state *s;
  const struct model *m;
  int n_act;
};

static void decode_slice(void *ctx, int ti, int nt) {
  const struct decode_args *x = ctx;
  struct gen_state *s = x->s;
  const struct model *m = x->m;
  const struct model_config *c = &m->cfg;
  int lo, hi;
  pool_split(x->n_act, ti, nt, &lo, &hi);
  if (lo >= hi) return;
  struct pool *saved = pool_current();
  pool_set_current(NULL);
  size_t C = c->hidden_size, CQ = (size_t)c->num_heads * c->head_dim,
         CKV = (size_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size, V = c->vocab_size,
         L0 = (size_t)lo;
  const struct block_acts *a = &s->acts;
  struct block_acts v = {.x_in = a->x_in + L0 * C,
                         .xn1 = a->xn1 + L0 * C,
                         .rstd1 = a->rstd1 + L0,
                         .q = a->q + L0 * CQ,
                         .k = a->k + L0 * CKV,
                         .v = a->v + L0 * CKV,
                         .att = a->att + L0 * CQ,
                         .lse = NULL,
                         .xn2 = a->xn2 + L0 * C,
                         .rstd2 = a->rstd2 + L0,
                         .g = a->g + L0 * FF,
                         .u = a->u + L0 * FF,
                         .h = a->h + L0 * FF};
  v.x_mid = v.x_out = v.x_in;
  int n = hi - lo;
  size_t layer_cache = (size_t)s->cap_batch * s->cap_t * CKV;
  for (int l = 0; l < c->num_layers; l++) {
    struct block_seqs bs = {.n_seq = n,
                            .row0 = s->iota,
                            .t_new = s->t_new + lo,
                            .n_past = s->n_past + lo,
                            .pos = s->pos + lo,
                            .cache_k = s->cache_k + l * layer_cache,
                            .cache_v = s->cache_v + l * layer_cache,
                            .slot = s->slot + lo,
                            .cap_t = s->cap_t};
    block_forward(c, &m->w.layers[l], &v, &bs, n, &s->rope, s->scr.buf + (size_t)ti * s->scr.stride,
                  s->scr.stride);
  }
  rmsnorm_forward(s->sel + L0 * C, v.rstd2, v.x_out, m->w.final_norm, n, (int)C, c->rms_norm_eps);
  matmul_forward(s->logits + L0 * V, s->sel + L0 * C, m->w.lm_head, NULL, n, (int)C, (int)V, 0.0f);
  pool_set_current(saved);
}

static void embed(struct gen_state *s, const struct model *m, int row, int tok) {
  int C = m->cfg.hidden_size;
  memcpy(s->acts.x_in + (size_t)row * C, m->w.tok_emb + (size_t)tok * C, sizeof(float) * C);
}

static int gen_run_impl(struct gen_state *s, const struct model *m, int n,
                        const int *const *prompts, const int *prompt_len, struct rng *rngs,
                        const struct sampler_opts *o, struct gen_out *out,
                        const volatile int *cancel, struct dapo_err *e) {
  const struct model_config *c = &m->cfg;
  int V = c->vocab_size, maxn = o->max_new_tokens;
  if (n < 1 || n > s->cap_batch)
    return dapo_errf(e, DAPO_ERANGE, "generate: %d sequences (capacity %d)", n, s->cap_batch);
  if (maxn < 1) return dapo_errf(e, DAPO_EINVAL, "max_new_tokens: %d must be >= 1", maxn);
  if (!(o->temperature >= 0.0f) || !(o->top_p > 0.0f && o->top_p <= 1.0f))
    return dapo_errf(e, DAPO_EINVAL, "temperature %g must be >= 0 and top_p %g in (0, 1]",
                     (double)o->temperature, (double)o->top_p);
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
    run_rows(s, m, n_seq, N, n_seq);
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
        int tok = sampler_pick(lg, V, o, &rngs[q], &lp, s->pick_idx, s->pick_p);
        out->tokens[(size_t)q * maxn] = tok;
        out->logp[(size_t)q * maxn] = lp;
        out->len[q] = 1;
        out->finish[q] = is_stop(o, tok) ? FINISH_STOP : FINISH_LENGTH;
      }
    }
  }

  /* decode: all unfinished sequences advance together */
  for (;;) {
    if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) /* set by another thread */
      return dapo_errf(e, DAPO_ECANCELLED, "generation cancelled");
    int n_act = 0;
    for (int q = 0; q < n; q++) {
      int len = out->len[q];
      if (out->finish[q] == FINISH_STOP || len >= maxn) continue;
      s->row0[n_act] = n_act;
      s->t_new[n_act] = 1;
      s->n_past[n_act] = prompt_len[q] + len - 1;
      s->pos[n_act] = prompt_len[q] + len - 1;
      s->slot[n_act] = q;
      s->last_row[n_act] = n_act;
      s->active[n_act] = q;
      embed(s, m, n_act, out->tokens[(size_t)q * maxn + len - 1]);
      n_act++;
    }
    if (n_act == 0) break;
    struct decode_args da = {s, m, n_act};
    if (s->pool && pool_threads(s->pool) > 1 && n_act > 1) {
      pool_run(s->pool, decode_slice, &da);
    } else { /* one sequence: per-kernel wake-ups cost more than they save */
      struct pool *saved = pool_current();
      pool_set_current(NULL);
      run_rows(s, m, n_act, n_act, n_act);
      pool_set_current(saved);
    }
    for (int k = 0; k < n_act; k++) {
      int q = s->active[k], len = out->len[q];
      float lp;
      int tok =
          sampler_pick(s->logits + (size_t)k * V, V, o, &rngs[q], &lp, s->pick_idx, s->pick_p);
      out->tokens[(size_t)q * maxn + len] = tok;
      out->logp[(size_t)q * maxn + len] = lp;
      out->len[q] = len + 1;
      if (is_stop(o, tok)) out->finish[q] = FINISH_STOP;
    }
  }
  return 0;
}

int gen_run(struct gen_state *s, const struct model *m, int n, const int *const *prompts,
            const int *prompt_len, struct rng *rngs, const struct sampler_opts *o,
            struct gen_out *out, const volatile int *cancel, struct dapo_err *e) {
  struct pool *saved = pool_current();
  pool_set_current(s->pool);
  int rc = gen_run_impl(s, m, n, prompts, prompt_len, rngs, o, out, cancel, e);
  pool_set_current(saved);
  return rc;
}
