/* Sampler: reproducibility, batch-of-G == G single runs, KV-cache decoding agrees with the
 * training forward (log-probs of the sampled tokens), greedy == argmax, and the temperature /
 * top-p distribution checked statistically on a known logit vector; multi-turn generation
 * (gen_advance) against gen_run and the training forward; Llama, Qwen2 and Qwen3 (q/k
 * norms, yarn RoPE, a padded vocabulary whose padding logits dwarf the real ones and must never
 * be drawn). */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "lora.h"
#include "test_isa.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "sampler.h"
#include "softmax.h"
#include "adamw.h"
#include "train.h"

#define MAXN 24
#define NSEQ 8

static struct model *model_from(const struct model_config *c);

static struct model *make_model(int arch, int tied, int nkv) {
  struct model_config c = {.arch = arch,
                           .vocab_size = 37,
                           .hidden_size = 32,
                           .intermediate_size = 48,
                           .num_layers = 2,
                           .num_heads = 4,
                           .num_kv_heads = nkv,
                           .head_dim = 8,
                           .max_position_embeddings = 128,
                           .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000.0f,
                           .tie_word_embeddings = tied,
                           .qkv_bias = arch != ARCH_LLAMA,
                           .bos_token_id = 1,
                           .eos_token_id = 2,
                           .initializer_range = 0.5f};
  if (arch == ARCH_QWEN3) {
    /* Qwen3's q/k norms, attention biases, yarn RoPE past its original context of 16, and a
     * padded vocabulary: 30 ids, 7 padding rows whose logits dwarf the real ones */
    c.qk_norm = c.o_bias = 1;
    c.rope = (struct rope_scaling){
        .type = ROPE_YARN, .factor = 4.0, .original_max_position_embeddings = 16};
    c.vocab_used = 30;
  }
  return model_from(&c);
}

/* A random model of config c, its norms and biases off their trivial values and its padding
 * rows (past vocab_used) large. */
static struct model *model_from(const struct model_config *cp) {
  struct model_config c = *cp;
  struct dapo_err e;
  struct model *m = model_new(&c, &e);
  if (!m) {
    fprintf(stderr, "model_new: %s\n", e.msg);
    exit(1);
  }
  model_init_random(m, 3);
  struct rng r;
  rng_seed(&r, 5, 5);
  for (int i = 0; i < m->n_tensors; i++) /* norms and biases off their trivial values */
    if (m->tensors[i].ndim == 1)
      for (size_t k = 0; k < m->tensors[i].numel; k++)
        m->params[m->tensors[i].offset + k] += 0.3f * (float)rng_normal(&r);
  for (size_t k = (size_t)model_vocab_used(&c) * c.hidden_size;
       k < (size_t)c.vocab_size * c.hidden_size; k++)
    m->w.lm_head[k] = 3.0f * (float)rng_normal(&r);
  return m;
}

/* No sampled token is a padding id (at or past vocab_used). */
static int padding_drawn(const struct model *m, const int *tokens, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad += tokens[i] >= model_vocab_used(&m->cfg);
  return bad;
}

struct run {
  int tokens[NSEQ * MAXN], len[NSEQ], finish[NSEQ];
  float logp[NSEQ * MAXN];
};

/* rngs for a call that must be refused before it draws */
static struct rng *rngs_dummy(void) {
  static struct rng r[NSEQ];
  return r;
}

static void gen(struct gen_state *s, const struct model *m, int n, const int *const *prompts,
                const int *plen, const uint64_t *seeds, const struct sampler_opts *o,
                struct run *r) {
  memset(r, 0, sizeof *r);
  struct rng rngs[NSEQ];
  for (int i = 0; i < n; i++) rng_seed(&rngs[i], seeds[i], 0);
  struct gen_out out = {.tokens = r->tokens, .logp = r->logp, .len = r->len, .finish = r->finish};
  struct dapo_err e;
  int rc = gen_run(s, m, n, prompts, plen, rngs, o, &out, NULL, &e);
  CHECK_MSG(rc == 0, "gen_run: %s", e.msg);
}

/* What gen_run's progress callback told. */
struct progress_log {
  int calls, backwards, finished;
  int64_t tokens, first_tokens;
};

static void on_progress(void *ctx, int64_t tokens, int finished) {
  struct progress_log *l = ctx;
  if (l->calls++ == 0) l->first_tokens = tokens;
  l->backwards += tokens < l->tokens || finished < l->finished;
  l->tokens = tokens;
  l->finished = finished;
}

/* What gen_run's step hook saw; with end set it ends sequence q after q % 3 + 1 tokens. */
struct step_log {
  int calls, bad, end;
  int seen[NSEQ];
};

static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct step_log *l = ctx;
  l->calls++;
  for (int q = 0; q < n; q++) {
    /* every round adds at most one token to each sequence, none once it finished */
    l->bad += out->len[q] < l->seen[q] || out->len[q] > l->seen[q] + 1 || out->len[q] > max_new;
    l->seen[q] = out->len[q];
    if (l->end && out->len[q] == q % 3 + 1) out->finish[q] = FINISH_STOP;
  }
}

static void test_model(int arch, int tied, int nkv) {
  struct model *m = make_model(arch, tied, nkv);
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, NSEQ, 64, &e);
  CHECK(s != NULL);
  int pa[5] = {5, 6, 7, 8, 9}, pb[3] = {10, 11, 12}, pc[1] = {1};
  /* six sequences share prompt a (one group of G=6), one has b, one has c */
  const int *prompts[NSEQ] = {pa, pa, pa, pa, pa, pa, pb, pc};
  int plen[NSEQ] = {5, 5, 5, 5, 5, 5, 3, 1};
  uint64_t seeds[NSEQ] = {11, 12, 13, 14, 15, 16, 17, 18};
  struct sampler_opts o = {
      .temperature = 0.9f, .top_p = 0.95f, .max_new_tokens = MAXN, .n_stop = 1, .stop_ids = {2}};
  struct run a, b;
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &a);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &b);
  CHECK(memcmp(a.tokens, b.tokens, sizeof a.tokens) == 0 &&
        memcmp(a.len, b.len, sizeof a.len) == 0);
  for (int i = 0; i < NSEQ; i++)
    CHECK_MSG(!padding_drawn(m, a.tokens + i * MAXN, a.len[i]), "arch %d: a padding id drawn",
              arch);

  /* the progress callback sees every decoding step and changes nothing */
  struct progress_log pg = {0};
  struct run c;
  gen_state_set_progress(s, on_progress, &pg);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &c);
  gen_state_set_progress(s, NULL, NULL);
  CHECK(!memcmp(a.tokens, c.tokens, sizeof a.tokens) && !memcmp(a.logp, c.logp, sizeof a.logp) &&
        !memcmp(a.len, c.len, sizeof a.len) && !memcmp(a.finish, c.finish, sizeof a.finish));
  int64_t sampled = 0;
  int longest = 0;
  for (int i = 0; i < NSEQ; i++) {
    sampled += a.len[i];
    longest = a.len[i] > longest ? a.len[i] : longest;
  }
  /* one call after the prefill's first tokens and one after each decoding step, the last with
   * every token and every sequence finished; counts never go back */
  CHECK_MSG(pg.calls == longest && !pg.backwards && pg.tokens == sampled && pg.finished == NSEQ &&
                pg.first_tokens == NSEQ,
            "progress: %d calls for %d steps, last %lld tokens of %lld, %d finished, first %lld",
            pg.calls, longest, (long long)pg.tokens, (long long)sampled, pg.finished,
            (long long)pg.first_tokens);

  /* the step hook: told after every round of sampling; unused it changes nothing, and ending a
   * sequence (sequence i after i % 3 + 1 tokens) keeps its tokens so far and every other
   * sequence's tokens */
  struct step_log sl = {0};
  struct run hk;
  gen_state_set_step(s, on_step, &sl);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &hk);
  CHECK(!memcmp(a.tokens, hk.tokens, sizeof a.tokens) && !memcmp(a.logp, hk.logp, sizeof a.logp) &&
        !memcmp(a.len, hk.len, sizeof a.len) && !memcmp(a.finish, hk.finish, sizeof a.finish));
  CHECK_MSG(sl.calls == longest && sl.bad == 0, "step hook: %d calls for %d steps, %d bad",
            sl.calls, longest, sl.bad);
  struct step_log cut = {.end = 1};
  gen_state_set_step(s, on_step, &cut);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &hk);
  gen_state_set_step(s, NULL, NULL);
  for (int i = 0; i < NSEQ; i++) {
    int keep = i % 3 + 1 < a.len[i] ? i % 3 + 1 : a.len[i];
    CHECK_MSG(hk.len[i] == keep &&
                  !memcmp(hk.tokens + i * MAXN, a.tokens + i * MAXN, sizeof(int) * (size_t)keep),
              "step hook: sequence %d kept %d tokens, expected %d of %d", i, hk.len[i], keep,
              a.len[i]);
    CHECK(hk.finish[i] == (keep < a.len[i] ? FINISH_STOP : a.finish[i]));
  }
  CHECK(cut.bad == 0);

  /* batch of 8 == 8 single runs */
  int same = 1, total = 0;
  float maxd = 0;
  for (int i = 0; i < NSEQ; i++) {
    struct run one;
    gen(s, m, 1, &prompts[i], &plen[i], &seeds[i], &o, &one);
    same &= one.len[0] == a.len[i] && one.finish[0] == a.finish[i] &&
            !memcmp(one.tokens, a.tokens + i * MAXN, sizeof(int) * (size_t)one.len[0]);
    for (int t = 0; t < one.len[0] && t < a.len[i]; t++) {
      float d = fabsf(one.logp[t] - a.logp[i * MAXN + t]);
      maxd = d > maxd ? d : maxd;
    }
    total += a.len[i];
  }
  CHECK_MSG(same, "a batch of %d differs from single-sequence runs", NSEQ);
  CHECK_MSG(maxd < 1e-4f, "batch vs single log-prob difference %g", (double)maxd);
  /* the group's responses are not all identical (sampling really happens) */
  CHECK(memcmp(a.tokens, a.tokens + MAXN, sizeof(int) * MAXN) != 0);

  /* KV-cache log-probs == training forward over prompt + response, at the same temperature */
  int toks[NSEQ * 64], off[NSEQ + 1] = {0}, pl[NSEQ];
  for (int i = 0; i < NSEQ; i++) {
    int k = off[i];
    for (int t = 0; t < plen[i]; t++) toks[k++] = prompts[i][t];
    for (int t = 0; t < a.len[i]; t++) toks[k++] = a.tokens[i * MAXN + t];
    off[i + 1] = k;
    pl[i] = plen[i];
  }
  struct fwd_batch fb = {.n_seq = NSEQ, .tokens = toks, .seq_off = off, .prompt_len = pl};
  struct train_state *ts = train_state_new(m, NSEQ * 64, NSEQ * 64, 64, &e);
  float lp[NSEQ * 64];
  CHECK(train_forward(ts, m, &fb, 1.0f / o.temperature, lp, NULL, &e) == 0);
  float maxm = 0;
  int r = 0;
  for (int i = 0; i < NSEQ; i++)
    for (int t = 0; t < a.len[i]; t++, r++) {
      float d = fabsf(lp[r] - a.logp[i * MAXN + t]);
      maxm = d > maxm ? d : maxm;
    }
  CHECK_MSG(maxm < 1e-4f, "sampler vs training-forward log-prob mismatch %g", (double)maxm);
  fprintf(stderr,
          "arch %d tied %d nkv %d: %d tokens, batch/single max |dlogp| %.2g, "
          "sampler/trainer max |dlogp| %.2g\n",
          arch, tied, nkv, total, (double)maxd, (double)maxm);

  /* greedy: every generated token is the argmax of the training forward's distribution, i.e.
   * its log-prob is the row maximum: check via log-prob >= log(1/V) and equal to the sampler's */
  struct sampler_opts g = {.temperature = 0.0f, .top_p = 1.0f, .max_new_tokens = 12};
  struct run gr, gr2;
  gen(s, m, NSEQ, prompts, plen, seeds, &g, &gr);
  uint64_t other[NSEQ] = {99, 98, 97, 96, 95, 94, 93, 92};
  gen(s, m, NSEQ, prompts, plen, other, &g, &gr2);
  CHECK_MSG(!memcmp(gr.tokens, gr2.tokens, sizeof gr.tokens), "greedy depends on the seed");
  CHECK_MSG(!memcmp(gr.tokens, gr.tokens + MAXN, sizeof(int) * 12), "greedy group differs");
  train_state_free(ts);
  gen_state_free(s);
  model_free(m);
}

/* Greedy decoding equals an argmax computed from the training forward, one token at a time. */
static void test_greedy_argmax(int arch) {
  struct model *m = make_model(arch, 1, 2);
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, 1, 32, &e);
  struct train_state *ts = train_state_new(m, 32, 32, 32, &e);
  int prompt[3] = {4, 9, 16};
  const int *pp = prompt;
  int plen = 3;
  struct sampler_opts g = {.temperature = 0.0f, .top_p = 1.0f, .max_new_tokens = 10};
  struct run r;
  uint64_t seed = 1;
  gen(s, m, 1, &pp, &plen, &seed, &g, &r);
  int toks[32] = {4, 9, 16}, ok = 1;
  int V = model_vocab_used(&m->cfg);
  for (int t = 0; t < r.len[0]; t++) {
    /* score every candidate next token with the training forward and take the best */
    int best = -1;
    float bestlp = -INFINITY;
    for (int v = 0; v < V; v++) {
      toks[3 + t] = v;
      int off[2] = {0, 4 + t}, pl[1] = {3 + t};
      struct fwd_batch fb = {.n_seq = 1, .tokens = toks, .seq_off = off, .prompt_len = pl};
      float lp;
      train_forward(ts, m, &fb, 1.0f, &lp, NULL, &e);
      if (lp > bestlp) {
        bestlp = lp;
        best = v;
      }
    }
    ok &= best == r.tokens[t];
    toks[3 + t] = r.tokens[t];
  }
  CHECK_MSG(ok, "greedy decoding differs from the argmax of the training forward");
  train_state_free(ts);
  gen_state_free(s);
  model_free(m);
}

/* Temperature and top-p on a known logit vector: empirical frequencies over 200k draws match the
 * analytic nucleus distribution within 4.5 standard errors (and 0 outside the nucleus). */
static void test_distribution(float temp, float top_p) {
  enum { V = 6, DRAWS = 200000 };
  const float logits0[V] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.0f};
  double p[V], sum = 0;
  for (int j = 0; j < V; j++) sum += (p[j] = exp(logits0[j] / temp));
  for (int j = 0; j < V; j++) p[j] /= sum;
  /* analytic nucleus: sort descending (ties by index), keep until cumulative >= top_p */
  int order[V] = {0, 1, 5, 2, 3, 4}; /* logits order: 2, 1, 1, .5, 0, -1 */
  double keep[V] = {0}, cum = 0, kept = 0;
  for (int i = 0; i < V; i++) {
    keep[order[i]] = p[order[i]];
    kept += p[order[i]];
    cum += p[order[i]];
    if (cum >= top_p) break;
  }
  struct sampler_opts o = {.temperature = temp, .top_p = top_p, .max_new_tokens = 1};
  struct rng r;
  rng_seed(&r, 2024, 0);
  int cnt[V] = {0}, idx[V];
  float sp[V], logits[V];
  for (int d = 0; d < DRAWS; d++) {
    memcpy(logits, logits0, sizeof logits);
    float lp;
    cnt[sampler_pick(logits, V, &o, &r, &lp, idx, sp)]++;
  }
  for (int j = 0; j < V; j++) {
    double want = keep[j] / kept, got = (double)cnt[j] / DRAWS;
    double se = sqrt(want * (1 - want) / DRAWS) + 1e-12;
    CHECK_MSG(fabs(got - want) <= 4.5 * se, "T=%g top_p=%g token %d: frequency %.5f, expected %.5f",
              (double)temp, (double)top_p, j, got, want);
  }
}

/* sampler_top against a float64 log-softmax: over random rows (with exact ties planted, and a
 * NaN-free row of equal logits), every temperature (greedy included), k from 1 to
 * SAMPLER_TOP_MAX: the list is the k likeliest (none left out), most likely first, ties by
 * ascending id, each log-prob within 1e-5 of the reference; the token sampler_pick draws, when
 * listed, has exactly the log-prob it was drawn with. */
static void test_top_reference(void) {
  enum { V = 301 };
  const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.7f};
  struct rng r;
  rng_seed(&r, 77, 0);
  float logits[V], sp[V], lps[SAMPLER_TOP_MAX];
  int idx[V], ids[SAMPLER_TOP_MAX], listed = 0;
  double worst = 0;
  for (int row = 0; row < 40; row++) {
    for (int j = 0; j < V; j++) logits[j] = 3.0f * (float)rng_normal(&r);
    if (row % 4 == 1) /* the likeliest three share a value */
      for (int j = 0; j < 3; j++) logits[(row * 37 + j * 101) % V] = 20.0f;
    if (row % 4 == 2) /* ties in the middle of the list */
      for (int j = 0; j < 6; j++) logits[(row * 13 + j * 53) % V] = 7.25f;
    if (row == 3)
      for (int j = 0; j < V; j++) logits[j] = 1.5f; /* a flat row: ids 0..k-1 */
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
      double t = temps[ti] > 0 ? temps[ti] : 1.0, mx = -INFINITY, sum = 0, ref[V];
      for (int j = 0; j < V; j++) mx = fmax(mx, logits[j] / t);
      for (int j = 0; j < V; j++) sum += exp(logits[j] / t - mx);
      for (int j = 0; j < V; j++) ref[j] = logits[j] / t - mx - log(sum);
      int k = 1 + (row * 7 + (int)ti) % SAMPLER_TOP_MAX;
      sampler_top(logits, V, temps[ti], k, ids, lps);
      /* the k-th largest reference value: every listed one is at least it, every other at most */
      for (int a = 0; a < k; a++) {
        CHECK(ids[a] >= 0 && ids[a] < V);
        worst = fmax(worst, fabs(lps[a] - ref[ids[a]]));
        if (a) {
          CHECK_MSG(lps[a] < lps[a - 1] || (lps[a] == lps[a - 1] && ids[a] > ids[a - 1]),
                    "row %d T=%g: entries %d, %d out of order", row, t, a - 1, a);
          if (logits[ids[a]] == logits[ids[a - 1]]) CHECK(ids[a] > ids[a - 1]);
        }
      }
      for (int j = 0; j < V; j++) {
        int in = 0;
        for (int a = 0; a < k; a++) in |= ids[a] == j;
        /* an unlisted id is no likelier than the last listed, and on an exact tie comes later */
        if (!in)
          CHECK_MSG(ref[j] <= ref[ids[k - 1]] + 1e-6 &&
                        (logits[j] != logits[ids[k - 1]] || j > ids[k - 1]),
                    "row %d T=%g k=%d: id %d left out", row, t, k, j);
      }
      if (row == 3)
        for (int a = 0; a < k; a++) CHECK(ids[a] == a);
      struct sampler_opts o = {.temperature = temps[ti], .top_p = 1.0f, .max_new_tokens = 1};
      float lp, copy[V];
      memcpy(copy, logits, sizeof copy);
      int tok = sampler_pick(copy, V, &o, &r, &lp, idx, sp);
      for (int a = 0; a < k; a++)
        if (ids[a] == tok) {
          listed++;
          CHECK_MSG(lps[a] == lp, "row %d T=%g: the sampled token's %.9g, listed %.9g", row, t,
                    (double)lp, (double)lps[a]);
        }
      if (temps[ti] == 0.0f) CHECK(ids[0] == tok); /* greedy: the argmax, the lowest id of ties */
    }
  }
  CHECK_MSG(worst < 1e-5, "sampler_top: %g from the float64 log-softmax", worst);
  CHECK(listed > 100); /* the sampled token was listed often enough to be compared */
  printf("sampler_top: max |logp - float64 reference| %.3g, %d sampled tokens compared\n", worst,
         listed);
}

/* gen_run with top_k: the same tokens, log-probs, lengths and finishes bit for bit as without
 * (serial and on a pool, split by rows and by columns), and the same alternatives either way;
 * each sampled token, when listed, with exactly its log-prob; greedy: the sampled token first.
 * With top_p < 1 the alternatives are those of the untruncated distribution (their
 * probabilities are those top_p = 1 lists for the first token, which both draw from the same
 * logits). */
static void test_top_gen(int arch) {
  struct model *m = make_model(arch, 0, 2);
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, NSEQ, 64, &e);
  CHECK(s != NULL);
  int pa[5] = {5, 6, 7, 8, 9}, pb[3] = {10, 11, 12};
  const int *prompts[NSEQ] = {pa, pa, pa, pa, pb, pb, pb, pa};
  int plen[NSEQ] = {5, 5, 5, 5, 3, 3, 3, 2};
  uint64_t seeds[NSEQ] = {1, 2, 3, 4, 5, 6, 7, 8};
  enum { K = 7 };
  static int ids[3][NSEQ * MAXN * K];
  static float lps[3][NSEQ * MAXN * K];
  const float temps[] = {0.0f, 0.8f, 0.8f}, top_ps[] = {1.0f, 1.0f, 0.5f};
  struct pool *p = pool_new(3);
  for (int v = 0; v < 3; v++) {
    struct sampler_opts o = {.temperature = temps[v],
                             .top_p = top_ps[v],
                             .max_new_tokens = MAXN,
                             .n_stop = 1,
                             .stop_ids = {2}};
    struct run plain, top;
    gen(s, m, NSEQ, prompts, plen, seeds, &o, &plain);
    o.top_k = K;
    for (int par = 0; par < 3; par++) {
      if (par) {
        CHECK(gen_state_set_pool(s, p, &e) == 0);
        gen_state_set_split(s, par == 1 ? GEN_SPLIT_ROWS : GEN_SPLIT_DYNAMIC);
        gen_state_set_chunk(s, 1);
      }
      memset(&top, 0, sizeof top);
      struct rng rngs[NSEQ];
      for (int i = 0; i < NSEQ; i++) rng_seed(&rngs[i], seeds[i], 0);
      static int ids2[NSEQ * MAXN * K];
      static float lps2[NSEQ * MAXN * K];
      struct gen_out out = {.tokens = top.tokens,
                            .logp = top.logp,
                            .len = top.len,
                            .finish = top.finish,
                            .top_ids = par ? ids2 : ids[v],
                            .top_logp = par ? lps2 : lps[v]};
      CHECK_MSG(gen_run(s, m, NSEQ, prompts, plen, rngs, &o, &out, NULL, &e) == 0, "%s", e.msg);
      gen_state_set_pool(s, NULL, &e);
      gen_state_set_split(s, GEN_SPLIT_AUTO);
      CHECK_MSG(!memcmp(plain.tokens, top.tokens, sizeof top.tokens) &&
                    !memcmp(plain.logp, top.logp, sizeof top.logp) &&
                    !memcmp(plain.len, top.len, sizeof top.len) &&
                    !memcmp(plain.finish, top.finish, sizeof top.finish),
                "arch %d variant %d pool %d: top_k changed what is sampled", arch, v, par);
      if (par) {
        float d = 0;
        for (int q = 0; q < NSEQ; q++)
          for (int t = 0; t < top.len[q]; t++)
            for (int a = 0; a < K; a++) {
              size_t at = ((size_t)q * MAXN + t) * K + a;
              CHECK(ids2[at] == ids[v][at]);
              d = fmaxf(d, fabsf(lps2[at] - lps[v][at]));
            }
        CHECK_MSG(d < 1e-4f, "pool %d: alternatives' log-probs moved by %g", par, (double)d);
      }
    }
    for (int q = 0; q < NSEQ; q++)
      for (int t = 0; t < top.len[q]; t++) {
        size_t at = ((size_t)q * MAXN + t) * K;
        int tok = top.tokens[q * MAXN + t];
        for (int a = 0; a < K; a++) {
          if (a) CHECK(lps[v][at + a] <= lps[v][at + a - 1]);
          if (ids[v][at + a] == tok) CHECK(lps[v][at + a] == top.logp[q * MAXN + t]);
        }
        if (temps[v] == 0.0f) CHECK(ids[v][at] == tok);
      }
  }
  /* top_p 0.5 lists the untruncated distribution: the first token's alternatives (the same
   * logits, the same temperature) equal those of top_p 1 */
  for (int q = 0; q < NSEQ; q++)
    for (int a = 0; a < K; a++) {
      size_t at = (size_t)q * MAXN * K + a;
      CHECK(ids[1][at] == ids[2][at] && lps[1][at] == lps[2][at]);
    }
  /* refusals: top_k out of range, or without its arrays */
  struct sampler_opts bad = {
      .temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 2, .top_k = SAMPLER_TOP_MAX + 1};
  struct run rr;
  struct gen_out out = {.tokens = rr.tokens,
                        .logp = rr.logp,
                        .len = rr.len,
                        .finish = rr.finish,
                        .top_ids = ids[0],
                        .top_logp = lps[0]};
  CHECK(gen_run(s, m, 1, prompts, plen, rngs_dummy(), &bad, &out, NULL, &e) == DAPO_EINVAL);
  bad.top_k = 3;
  out.top_ids = NULL;
  CHECK(gen_run(s, m, 1, prompts, plen, rngs_dummy(), &bad, &out, NULL, &e) == DAPO_EINVAL);
  pool_free(p);
  gen_state_free(s);
  model_free(m);
}

/* Every split of decoding (sampler.h, gen_split) on a pool of nt threads: rows, static columns,
 * and dynamic columns with ranges of up to 1, 4 and 64 KiB (16, 32 and all the columns of the test
 * model's matrices, whose rows are 32-48 floats: one to three ranges a matrix, the last one
 * partial; at 64 KiB the guided shares of what is left, 48 columns and more), then dynamic again
 * with thread 1 sleeping 300 us before each phase (a neighbour taking its core: the others take
 * its ranges). */
struct split_case {
  enum gen_split split;
  int chunk, delay_us;
};
static const struct split_case split_cases[] = {
    {GEN_SPLIT_ROWS, 0, 0},    {GEN_SPLIT_COLUMNS, 0, 0},  {GEN_SPLIT_DYNAMIC, 1, 0},
    {GEN_SPLIT_DYNAMIC, 4, 0}, {GEN_SPLIT_DYNAMIC, 64, 0}, {GEN_SPLIT_DYNAMIC, 1, 300},
    {GEN_SPLIT_AUTO, 0, 0}};
enum { N_SPLIT_CASES = sizeof split_cases / sizeof split_cases[0] };

static void set_split_case(struct gen_state *s, int c) {
  gen_state_set_split(s, split_cases[c].split);
  gen_state_set_chunk(s, split_cases[c].chunk);
  gen_state_set_delay(s, 1, split_cases[c].delay_us);
}

/* The pool's parallel paths (every kernel split, no work threshold) sample the same tokens as
 * the serial run, for every split of decoding on 2 and 3 threads, with and without a LoRA
 * adapter on every target (decoding's adapter products are split with the base's columns); the
 * log-probs within 1e-4 of the serial run's (prefill's products differ) and the same bits as the
 * pool's split by rows. */
static void test_pool(int arch) {
  for (int adapter = 0; adapter < 2; adapter++) {
    struct model *m = make_model(arch, 0, 2);
    struct dapo_err e;
    struct lora *la = NULL;
    if (adapter) {
      struct lora_config lc = {.r = 3, .alpha = 6, .targets = (1u << LT_COUNT) - 1};
      la = lora_new(&lc, &m->cfg, &e);
      CHECK_MSG(la != NULL, "%s", e.msg);
      struct rng r;
      rng_seed(&r, 6, 6);
      for (size_t k = 0; k < la->n_params; k++) la->params[k] = 0.2f * (float)rng_normal(&r);
      m->lora = la;
    }
    struct gen_state *s = gen_state_new(m, NSEQ, 64, &e);
    int pa[5] = {5, 6, 7, 8, 9}, pb[3] = {10, 11, 12};
    const int *prompts[NSEQ] = {pa, pa, pa, pa, pb, pb, pb, pa};
    int plen[NSEQ] = {5, 5, 5, 5, 3, 3, 3, 2};
    uint64_t seeds[NSEQ] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct sampler_opts o = {.temperature = 1.0f, .top_p = 0.9f, .max_new_tokens = MAXN};
    struct run serial, rows, par;
    gen(s, m, NSEQ, prompts, plen, seeds, &o, &serial);
    long old = kernels_par_min_work();
    kernels_set_par_min_work(0);
    for (int nt = 2; nt <= 3; nt++) {
      struct pool *p = pool_new(nt);
      CHECK(gen_state_set_pool(s, p, &e) == 0);
      for (int c = 0; c < N_SPLIT_CASES; c++) {
        set_split_case(s, c);
        gen(s, m, NSEQ, prompts, plen, seeds, &o, c ? &par : &rows);
        struct run *got = c ? &par : &rows;
        CHECK_MSG(!memcmp(serial.tokens, got->tokens, sizeof serial.tokens),
                  "adapter %d, %d threads, split %d chunk %d delay %d: the tokens changed", adapter,
                  nt, split_cases[c].split, split_cases[c].chunk, split_cases[c].delay_us);
        CHECK_MSG(!padding_drawn(m, got->tokens, NSEQ * MAXN), "pool (case %d) drew a padding id",
                  c);
        float d = 0;
        for (int i = 0; i < NSEQ * MAXN; i++) d = fmaxf(d, fabsf(serial.logp[i] - got->logp[i]));
        CHECK_MSG(d < 1e-4f, "pool (case %d) changed log-probs by %g", c, (double)d);
        CHECK_MSG(!c || !memcmp(rows.logp, par.logp, sizeof rows.logp),
                  "adapter %d, %d threads, case %d: log-probs not the bits of the split by rows",
                  adapter, nt, c);
      }
      /* the split chosen by timing steps: whichever it is, the same bits */
      CHECK(gen_state_tune(s, m, NSEQ, &e) == 0);
      char desc[256];
      CHECK(strstr(gen_state_describe_split(s, desc, sizeof desc), "measured per step") != NULL);
      gen(s, m, NSEQ, prompts, plen, seeds, &o, &par);
      CHECK_MSG(!memcmp(serial.tokens, par.tokens, sizeof serial.tokens) &&
                    !memcmp(rows.logp, par.logp, sizeof rows.logp),
                "adapter %d, %d threads, after gen_state_tune (%s): other bits", adapter, nt, desc);
      set_split_case(s, N_SPLIT_CASES - 1);
      gen_state_set_pool(s, NULL, &e);
      pool_free(p);
    }
    kernels_set_par_min_work(old);
    if (adapter) {
      /* the adapter trained (its weights' version moved): the same state decodes with the new B,
       * which it keeps transposed for a generation, the bits of a fresh state's */
      for (int l = 0; l < m->cfg.num_layers; l++)
        for (int t = 0; t < LT_COUNT; t++) {
          int out, in;
          lora_target_dims(t, &m->cfg, &out, &in);
          for (int i = 0; i < out * la->cfg.r; i++) la->w[l].b[t][i] *= -1.5f;
        }
      model_weights_changed(m);
      struct run again, fresh;
      gen(s, m, NSEQ, prompts, plen, seeds, &o, &again);
      struct gen_state *s2 = gen_state_new(m, NSEQ, 64, &e);
      gen(s2, m, NSEQ, prompts, plen, seeds, &o, &fresh);
      gen_state_free(s2);
      CHECK_MSG(!memcmp(again.tokens, fresh.tokens, sizeof fresh.tokens) &&
                    !memcmp(again.logp, fresh.logp, sizeof fresh.logp),
                "after the adapter changed: a reused state's bits differ from a fresh one's");
      CHECK_MSG(memcmp(again.logp, serial.logp, sizeof serial.logp) != 0,
                "the adapter's change changed nothing");
    }
    gen_state_free(s);
    model_free(m);
    lora_free(la);
  }
}

/* gen_advance drives the sequences of a gen_run token by token: the same tokens bit for bit
 * whether every slot is fed each round, slots wait (for a tool) and rejoin, or each runs alone,
 * serially and on a pool split either way; gen_run's tokens, its log-probs within 1e-4 (it packs
 * prompts into one prefill); the same again with the world's tokens fed into every sequence
 * after its second token (short and long answers in one call). Then a second turn: the world's
 * tokens fed after the first (short: decoding steps; long: a prefill onto the cache), and the
 * second turn's log-probs equal the training forward's over the whole episode with only the model's
 * tokens trained. Refusals: a slot fed twice, a feed past the capacity. */
static void test_advance(int arch) {
  struct model *m = make_model(arch, 0, 2);
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, NSEQ, 64, &e);
  int pa[5] = {5, 6, 7, 8, 9}, pb[3] = {10, 11, 12};
  const int *prompts[NSEQ] = {pa, pa, pa, pa, pb, pb, pb, pa};
  int plen[NSEQ] = {5, 5, 5, 5, 3, 3, 3, 2};
  uint64_t seeds[NSEQ] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct sampler_opts o = {.temperature = 1.0f, .top_p = 0.9f, .max_new_tokens = MAXN};
  struct run want;
  struct pool *p = pool_new(3);
  long old = kernels_par_min_work();
  /* serial; then on the pool, each split of decoding (split_cases: rows, static columns,
   * dynamic chunks, a delayed thread) */
  for (int mode = 0; mode <= N_SPLIT_CASES; mode++) {
    if (mode == 1) {
      kernels_set_par_min_work(0);
      CHECK(gen_state_set_pool(s, p, &e) == 0);
    }
    if (mode)
      set_split_case(s, mode - 1);
    else
      gen_state_set_split(s, GEN_SPLIT_ROWS);
    gen(s, m, NSEQ, prompts, plen, seeds, &o, &want); /* gen_run in the same mode */
    /* every slot fed each round (wait 0); slots that wait one round in three (wait 1); each
     * slot alone in its own calls (wait 2). With world = 1 every sequence's third feed is its
     * last token and 1-4 of the world's tokens after it (through decoding steps, beside the
     * others' single tokens), or, for the last slot, GEN_DECODE_FEED_MAX + 1 (a prefill onto
     * its cache) */
    struct run got[2][3];
    int wbuf[NSEQ][GEN_DECODE_FEED_MAX + 2];
    for (int world = 0; world < 2; world++)
      for (int wait = 0; wait < 3; wait++) {
        struct run *g = &got[world][wait];
        memset(g, 0, sizeof *g);
        struct rng rngs[NSEQ], rr[NSEQ];
        for (int i = 0; i < NSEQ; i++) rng_seed(&rngs[i], seeds[i], 0), gen_slot_clear(s, i);
        struct gen_feed f[NSEQ];
        int slot_of[NSEQ], tok[NSEQ], nw[NSEQ];
        for (int q = 0; q < NSEQ; q++) nw[q] = q == NSEQ - 1 ? GEN_DECODE_FEED_MAX + 1 : 1 + q % 4;
        float lp[NSEQ];
        for (int round = 0; round < 3 * NSEQ * MAXN; round++) {
          int n = 0;
          for (int q = 0; q < NSEQ; q++) {
            if (g->len[q] == MAXN) continue;
            if (wait == 1 && g->len[q] > 0 && (round + q) % 3 == 0) continue;
            if (wait == 2 && (n > 0 || round % NSEQ != q)) continue;
            const int *last = g->len[q] ? &g->tokens[q * MAXN + g->len[q] - 1] : NULL;
            if (!last) {
              f[n] = (struct gen_feed){q, prompts[q], plen[q]};
            } else if (world && g->len[q] == 2) {
              wbuf[q][0] = *last;
              for (int t = 0; t < nw[q]; t++) wbuf[q][1 + t] = 3 + (q + t) % 20;
              f[n] = (struct gen_feed){q, wbuf[q], nw[q] + 1};
            } else {
              f[n] = (struct gen_feed){q, last, 1};
            }
            rr[n] = rngs[q];
            slot_of[n++] = q;
          }
          if (!n) continue;
          CHECK_MSG(gen_advance(s, m, n, f, rr, &o, tok, lp, &e) == 0, "advance: %s", e.msg);
          for (int i = 0; i < n; i++) {
            int q = slot_of[i];
            rngs[q] = rr[i];
            g->tokens[q * MAXN + g->len[q]] = tok[i];
            g->logp[q * MAXN + g->len[q]] = lp[i];
            g->len[q]++;
          }
        }
        for (int q = 0; q < NSEQ; q++)
          CHECK(gen_slot_len(s, q) == plen[q] + MAXN - 1 + (world ? nw[q] : 0));
        if (wait)
          CHECK_MSG(!memcmp(g->tokens, got[world][0].tokens, sizeof g->tokens) &&
                        !memcmp(g->logp, got[world][0].logp, sizeof g->logp),
                    "mode %d: who else is fed changed a sequence (wait %d, world %d)", mode, wait,
                    world);
      }
    CHECK_MSG(memcmp(got[0][0].tokens, got[1][0].tokens, sizeof want.tokens),
              "mode %d: the world's tokens changed nothing after them", mode);
    /* gen_run packs distinct prompts into one prefill: the same tokens, log-probs within the
     * batch/single tolerance */
    float d = 0;
    for (int i = 0; i < NSEQ * MAXN; i++) d = fmaxf(d, fabsf(got[0][0].logp[i] - want.logp[i]));
    CHECK_MSG(!memcmp(got[0][0].tokens, want.tokens, sizeof want.tokens) && d < 1e-4f,
              "mode %d: gen_advance vs gen_run: tokens %s, log-probs within %g", mode,
              memcmp(got[0][0].tokens, want.tokens, sizeof want.tokens) ? "differ" : "agree",
              (double)d);
  }
  kernels_set_par_min_work(old);
  gen_state_set_pool(s, NULL, &e);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, &want); /* serial again; slots left empty */
  CHECK(gen_slot_len(s, 0) == 0);

  /* two turns on slot 0: the first as gen_run's sequence 0, then its last sampled token with 4
   * world tokens after it, then 8 more tokens */
  /* the world's answer short (through decoding steps) and long (a prefill onto the cache) */
  static const int WS[2] = {4, GEN_DECODE_FEED_MAX + 8};
  struct train_state *ts = train_state_new(m, 64, 64, 64, &e);
  for (int wi = 0; wi < 2; wi++) {
    int T1 = wi ? 8 : MAXN, W = WS[wi], T2 = 8;
    int seq[64], n = 0, tk;
    unsigned char trained[64] = {0};
    struct rng r0;
    rng_seed(&r0, seeds[0], 0);
    gen_slot_clear(s, 0);
    struct gen_feed f = {0, prompts[0], plen[0]};
    for (int t = 0; t < plen[0]; t++) seq[n++] = prompts[0][t];
    float lp1[MAXN], lp2[8];
    for (int t = 0; t < T1; t++) {
      CHECK(gen_advance(s, m, 1, &f, &r0, &o, &tk, &lp1[t], &e) == 0);
      CHECK_MSG(tk == want.tokens[t] && fabsf(lp1[t] - want.logp[t]) < 1e-4f, "turn 1, token %d",
                t);
      trained[n] = 1;
      seq[n++] = tk;
      f = (struct gen_feed){0, &seq[n - 1], 1};
    }
    int world0 = n - 1; /* the turn's last token, then the world's */
    for (int t = 0; t < W; t++) seq[n++] = 3 + t % 20;
    f = (struct gen_feed){0, seq + world0, W + 1};
    for (int t = 0; t < T2; t++) {
      CHECK(gen_advance(s, m, 1, &f, &r0, &o, &tk, &lp2[t], &e) == 0);
      trained[n] = 1;
      seq[n++] = tk;
      f = (struct gen_feed){0, &seq[n - 1], 1};
    }
    CHECK(gen_slot_len(s, 0) == n - 1);
    int off[2] = {0, n}, pl[1] = {plen[0]};
    struct fwd_batch fb = {
        .n_seq = 1, .tokens = seq, .seq_off = off, .prompt_len = pl, .trained = trained};
    float lpt[64];
    CHECK(fwd_batch_resp_tokens(&fb) == T1 + T2);
    CHECK(train_forward(ts, m, &fb, 1.0f, lpt, NULL, &e) == 0);
    float d = 0;
    for (int t = 0; t < T1; t++) d = fmaxf(d, fabsf(lpt[t] - lp1[t]));
    for (int t = 0; t < T2; t++) d = fmaxf(d, fabsf(lpt[T1 + t] - lp2[t]));
    CHECK_MSG(d < 1e-4f, "two turns, %d world tokens: sampler vs training-forward mismatch %g", W,
              (double)d);
    fprintf(stderr,
            "arch %d: gen_advance alike with waiting and lone slots; two turns, %d world tokens "
            "in between: sampler/trainer max |dlogp| %.2g\n",
            arch, W, (double)d);
  }

  /* refusals */
  int tok[2];
  float lp[2];
  struct gen_feed twice[2] = {{1, pa, 1}, {1, pa, 1}};
  CHECK(gen_advance(s, m, 2, twice, rngs_dummy(), &o, tok, lp, &e) == DAPO_EINVAL &&
        strstr(e.msg, "slot 1 fed twice"));
  static const int many[64];
  struct gen_feed big = {2, many, 64};
  CHECK(gen_advance(s, m, 1, &big, rngs_dummy(), &o, tok, lp, &e) == DAPO_ERANGE &&
        strstr(e.msg, "exceed the sequence capacity 64"));
  train_state_free(ts);
  gen_state_free(s);
  pool_free(p);
  model_free(m);
}

/* Two samplers at once (two jobs' workers): each must stay inside its own nucleus. With
 * top_p 0.05 on 4096 logits rising (thread 0) or falling (thread 1) with the token id, the
 * nucleus is a few tokens at one end; a shared sort context would mix the two. */
struct race_arg {
  int dir, outside;
};

static void *race_thread(void *p) {
  struct race_arg *a = p;
  enum { V = 4096 };
  static _Thread_local float logits[V], sp[V];
  static _Thread_local int idx[V];
  struct sampler_opts o = {.temperature = 1.0f, .top_p = 0.05f, .max_new_tokens = 1};
  struct rng r;
  rng_seed(&r, 11, (uint64_t)a->dir);
  for (int it = 0; it < 1500; it++) {
    for (int j = 0; j < V; j++) logits[j] = (a->dir ? (float)(V - j) : (float)j) * 0.01f;
    float lp;
    int t = sampler_pick(logits, V, &o, &r, &lp, idx, sp);
    a->outside += a->dir ? t > 600 : t < V - 600;
  }
  return NULL;
}

static void test_concurrent_pick(void) {
  pthread_t th[2];
  struct race_arg args[2] = {{0, 0}, {1, 0}};
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, race_thread, &args[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK_MSG(args[0].outside == 0 && args[1].outside == 0,
            "concurrent samplers left their nucleus %d and %d times", args[0].outside,
            args[1].outside);
}

/* ---- the vectorised passes (softmax.c) against a scalar reference of the same arithmetic ---- */

/* simd_exp4 (simd.h) one lane at a time, with fmaf */
static float ref_exp(float x) {
  if (!(x > -87.3f)) x = -87.3f;
  float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  x = fmaf(-fx, 0.693359375f, x);
  x = fmaf(-fx, -2.12194440e-4f, x);
  float y = 1.9875691500e-4f;
  y = fmaf(y, x, 1.3981999507e-3f);
  y = fmaf(y, x, 8.3334519073e-3f);
  y = fmaf(y, x, 4.1665795894e-2f);
  y = fmaf(y, x, 1.6666665459e-1f);
  y = fmaf(y, x, 5.0000001201e-1f);
  y = fmaf(y, x * x, x + 1.0f);
  int32_t e = ((int32_t)fx + 127) * (1 << 23);
  float two;
  memcpy(&two, &e, sizeof two);
  return y * two;
}

/* e_j (softmax.h): 0 below -87.3 and for a NaN */
static float ref_e(float x, float scale, float sub) {
  float z = x * scale - sub;
  return z >= -87.3f ? ref_exp(z) : 0.0f;
}

/* simd_tree of 16 lanes */
static float ref_tree(const float *l) {
  float s4[4];
  for (int i = 0; i < 4; i++) s4[i] = (l[i] + l[i + 8]) + (l[i + 4] + l[i + 12]);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static float ref_max(const float *x, int V) {
  float lane[16], mx = -INFINITY;
  int j = 0;
  for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
  for (; j + 16 <= V; j += 16)
    for (int l = 0; l < 16; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  for (int l = 0; l < 16; l++) mx = lane[l] > mx ? lane[l] : mx;
  for (; j < V; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

/* chunks of 256 ids: 16 float lanes (id k in lane k mod 16), the tree, the chunks in double */
static double ref_sum(const float *x, int V, float scale, float sub, float *p, float *chunks) {
  double sum = 0;
  for (int j = 0, c = 0; j < V; j += 256, c++) {
    float lane[16] = {0};
    for (int k = j; k < V && k < j + 256; k++) {
      float e = ref_e(x[k], scale, sub);
      if (p) p[k] = e;
      lane[k % 16] += e;
    }
    chunks[c] = ref_tree(lane);
    sum += chunks[c];
  }
  return sum;
}

static int ref_argmax(const float *x, int V, float mx) {
  for (int j = 0; j < V; j++)
    if (x[j] == mx) return j;
  return 0;
}

/* sampler_pick with top_p 1 (or greedy), one id at a time */
static float ref_p[5000]; /* ref_pick's probabilities (unnormalised: sampler_pick's scratch_p) */

static int ref_pick(const float *x, int V, float temp, struct rng *r, float *lp) {
  static float chunks[32];
  float *p = ref_p;
  float mx = ref_max(x, V);
  if (temp <= 0.0f) {
    *lp = -(float)log(ref_sum(x, V, 1.0f, mx, NULL, chunks));
    return ref_argmax(x, V, mx);
  }
  float inv_t = 1.0f / temp, zmax = mx * inv_t;
  double sum = ref_sum(x, V, inv_t, zmax, p, chunks), u = rng_float(r) * sum, c = 0;
  float lse = zmax + (float)log(sum);
  int pick = -1;
  for (int j = 0, ci = 0; j < V && pick < 0; j += 256, ci++) {
    if (!(u < c + chunks[ci])) {
      c += chunks[ci];
      continue;
    }
    for (int k = j; k < V && k < j + 256; k++) {
      c += p[k];
      if (p[k] > 0) pick = k;
      if (u < c) break;
    }
    if (pick < 0) pick = V; /* stop: no draw in this chunk (the walk ends here) */
  }
  if (pick < 0 || pick == V) pick = ref_argmax(x, V, mx);
  *lp = x[pick] * inv_t - lse;
  return pick;
}

/* sampler_top: the scalar selection with the log-sum-exp above */
static void ref_top(const float *x, int V, float temp, int k, int *ids, float *lps) {
  static float chunks[32];
  float mx = ref_max(x, V);
  int greedy = temp <= 0.0f, n = 0;
  float inv_t = greedy ? 1.0f : 1.0f / temp, zmax = mx * inv_t;
  double sum = ref_sum(x, V, inv_t, zmax, NULL, chunks);
  float lse = greedy ? (float)log(sum) : zmax + (float)log(sum);
  for (int j = 0; j < V; j++) {
    float y = greedy ? (x[j] - mx) - lse : x[j] * inv_t - lse;
    if (y != y) y = -INFINITY;
    if (n == k && !(y > lps[k - 1])) continue;
    int at = n < k ? n++ : k - 1;
    while (at > 0 && y > lps[at - 1]) {
      ids[at] = ids[at - 1];
      lps[at] = lps[at - 1];
      at--;
    }
    ids[at] = j;
    lps[at] = y;
  }
}

/* p descending, ties by ascending id */
static const float *nuc_p;
static int cmp_nuc(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  if (nuc_p[i] != nuc_p[j]) return nuc_p[i] > nuc_p[j] ? -1 : 1;
  return (i > j) - (i < j);
}

/* smx_nucleus keeps what a full sort keeps: the smallest prefix of the ids ordered by p
 * descending (ties by ascending id) whose mass reaches top_p of the sum, in ascending order.
 * Returns the number of rows that differ. */
static int nucleus_vs_sort(const float *x, int V, float top_p) {
  static float p[5000], chunks[32];
  static int idx[5000], order[5000], keep[5000];
  double sum = ref_sum(x, V, 1.0f, ref_max(x, V), p, chunks), target = top_p * sum;
  if (!(sum > 0)) return 0;
  int n = smx_at_least(p, V, V > 1 ? (float)((1.0 - top_p) / (V - 1) * sum) : 0.0f, idx);
  int m = smx_nucleus(p, V, idx, n, target), k = 0;
  for (int j = 0; j < V; j++) order[j] = j;
  nuc_p = p;
  qsort(order, (size_t)V, sizeof(int), cmp_nuc);
  double c = 0;
  while (k < V && c < target) c += p[order[k++]];
  for (int j = 0; j < V; j++) keep[j] = 0;
  for (int i = 0; i < k; i++) keep[order[i]] = 1;
  int bad = m != k;
  for (int i = 0; i < m && !bad; i++) bad = !keep[idx[i]] || (i && idx[i] <= idx[i - 1]);
  return bad;
}

/* The kind of row r: normal logits, then masks, huge and tiny values, ties, zeros of both
 * signs, a NaN, an infinity. */
static void fill_row(float *x, int V, int kind, struct rng *r) {
  for (int j = 0; j < V; j++) x[j] = 3.0f * (float)rng_normal(r);
  switch (kind) {
  case 1: /* the constrained decoding mask: most ids -INFINITY */
    for (int j = 0; j < V; j++)
      if (rng_below(r, 10)) x[j] = -INFINITY;
    break;
  case 2: /* one id allowed */
    for (int j = 0; j < V; j++)
      if (j != V / 3) x[j] = -INFINITY;
    break;
  case 3: /* huge and tiny magnitudes (exp underflows for most) */
    for (int j = 0; j < V; j++)
      x[j] = rng_below(r, 2) ? x[j] * 1e4f : (rng_below(r, 2) ? 1e-30f : -1e-38f) * x[j];
    break;
  case 4: /* ties: few distinct values */
    for (int j = 0; j < V; j++) x[j] = (float)rng_below(r, 4) * 0.5f;
    break;
  case 5: /* zeros of both signs around a maximum of 0 */
    for (int j = 0; j < V; j++)
      x[j] = rng_below(r, 2) ? -0.0f : (rng_below(r, 2) ? 0.0f : -x[j] * x[j]);
    break;
  case 6: /* a NaN and a -INFINITY among normal logits */
    x[V / 2] = NAN;
    x[V - 1] = -INFINITY;
    break;
  case 7: /* the largest finite float (an overflow to +inf at a low temperature) */
    x[0] = FLT_MAX;
    break;
  default: break;
  }
}

/* Every instruction set's sampler_pick and sampler_top give the reference's bits: the token, its
 * log-prob, every e_j it draws from (smx_exp_sum's), the draw from the chunks' sums equal to the
 * draw from the row for many u, the listed ids and log-probs, over row lengths
 * around the 16 lanes and the 256-id chunks; top_p < 1 agrees across instruction sets; a masked id
 * (-INFINITY) is never drawn, and the softmax's sum is within 1e-5 of the float64 one. */
static void test_passes_bits(void) {
  enum { VMAX = 4099, NT = 5 };
  static const int lens[] = {1, 5, 16, 17, 255, 256, 257, 1000, 4099};
  static const float temps[NT] = {0.0f, 0.3f, 1.0f, 1.7f, 1.0f};
  static float x[VMAX], copy[VMAX], sp[VMAX], lps[SAMPLER_TOP_MAX], rlps[SAMPLER_TOP_MAX];
  static float chunk_sums[(VMAX + SMX_CHUNK - 1) / SMX_CHUNK];
  static int idx[VMAX], ids[SAMPLER_TOP_MAX], rids[SAMPLER_TOP_MAX];
  int isas[4], n_isa = isa_list(isas), compared = 0, bad = 0, masked = 0, nucleus_bad = 0,
               nucleus_rows = 0;
  double worst = 0;
  struct rng r;
  rng_seed(&r, 99, 0);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int kind = 0; kind < 8; kind++)
      for (int rep = 0; rep < 3; rep++) {
        int V = lens[li], k = V < SAMPLER_TOP_MAX ? V : SAMPLER_TOP_MAX;
        fill_row(x, V, kind, &r);
        int finite = 0; /* some id is allowed (and no overflow to +inf leaves all at 0) */
        for (int j = 0; j < V; j++) finite |= isfinite(x[j]) && kind != 7;
        if (kind == 0) { /* the float64 softmax's sum */
          double mx = -INFINITY, sum = 0;
          static float chunks[32];
          for (int j = 0; j < V; j++) mx = fmax(mx, x[j]);
          for (int j = 0; j < V; j++) sum += exp(x[j] - mx);
          double got = ref_sum(x, V, 1.0f, (float)mx, NULL, chunks);
          worst = fmax(worst, fabs(got - sum) / sum);
        }
        static const float top_ps[] = {0.05f, 0.3f, 0.6f, 0.9f, 0.99f};
        for (int pi = 0; pi < 5; pi++) {
          nucleus_bad += nucleus_vs_sort(x, V, top_ps[pi]);
          nucleus_rows++;
        }
        for (int ti = 0; ti < NT; ti++) {
          float want_lp = 0, lp, top_p = ti == NT - 1 ? 0.6f : 1.0f, first_lp = 0;
          uint64_t seed = 1000 + (uint64_t)(li * 100 + kind * 10 + rep);
          int want = -1, first = -1;
          struct rng rr;
          if (top_p >= 1.0f) {
            rng_seed(&rr, seed, 0);
            want = ref_pick(x, V, temps[ti], &rr, &want_lp);
            ref_top(x, V, temps[ti], k, rids, rlps);
          }
          for (int i = 0; i < n_isa; i++) {
            kernels_force_isa(isas[i]);
            struct sampler_opts o = {.temperature = temps[ti], .top_p = top_p, .max_new_tokens = 1};
            memcpy(copy, x, sizeof(float) * (size_t)V);
            rng_seed(&rr, seed, 0);
            int tok = sampler_pick(copy, V, &o, &rr, &lp, idx, sp);
            sampler_top(x, V, temps[ti], k, ids, lps);
            compared++;
            masked += x[tok] == -INFINITY && finite;
            if (top_p < 1.0f) { /* the nucleus: every instruction set as the first */
              if (i == 0) first = tok, first_lp = lp;
              bad += tok != first || memcmp(&lp, &first_lp, sizeof lp);
              continue;
            }
            int e_ok = 1; /* the e_j the draw walks (sampler_pick no longer writes them) */
            if (temps[ti] > 0.0f) {
              float inv_t = 1.0f / temps[ti], zmax = smx_max(x, V) * inv_t;
              double sum = smx_exp_sum(x, V, inv_t, zmax, sp, chunk_sums);
              e_ok = !memcmp(sp, ref_p, sizeof(float) * (size_t)V);
              /* the draw from the chunks' sums is the draw from the row, for any u: a grid, the
               * chunks' own boundaries and the end */
              double c = 0;
              for (int q = 0; q <= 40 && sum > 0; q++) {
                double u = q < 20 ? sum * q / 20.0 : q < 40 ? c : sum * (1 - 1e-12);
                if (q >= 20 && q < 40 && (q - 20) * SMX_CHUNK < V) c += chunk_sums[q - 20];
                e_ok &= smx_draw(sp, V, u) == smx_draw_chunks(x, V, inv_t, zmax, chunk_sums, u);
              }
            }
            int ok = tok == want && !memcmp(&lp, &want_lp, sizeof lp) && e_ok &&
                     !memcmp(ids, rids, sizeof(int) * (size_t)k) &&
                     !memcmp(lps, rlps, sizeof(float) * (size_t)k);
            if (!ok && bad++ < 5)
              fprintf(stderr,
                      "isa %d V %d kind %d T %g: token %d (%.9g), reference %d (%.9g); top[0] %d "
                      "(%.9g), reference %d (%.9g)\n",
                      isas[i], V, kind, (double)temps[ti], tok, (double)lp, want, (double)want_lp,
                      ids[0], (double)lps[0], rids[0], (double)rlps[0]);
          }
        }
      }
  kernels_force_isa(0);
  CHECK_MSG(bad == 0, "%d of %d draws differ from the scalar reference", bad, compared);
  CHECK_MSG(masked == 0, "%d draws of a masked (-INFINITY) id", masked);
  CHECK_MSG(nucleus_bad == 0, "%d of %d nuclei differ from the sorted prefix's", nucleus_bad,
            nucleus_rows);
  CHECK_MSG(worst < 1e-5, "softmax sum %g from float64", worst);
  printf("sampler passes: %d draws on %d instruction sets bit-identical to the reference; sum "
         "within %.2g of float64\n",
         compared, n_isa, worst);
}

/* Decoding from the packed panels (gen_state_set_pack): the tokens and log-probs of the matrices
 * read in place, bit for bit, for the test model and a wider one shaped like qwen-small (a head
 * of 3001 ids, widths not multiples of 16), batch 1 and NSEQ, serially and on 2 threads split
 * either way. Then freshness: a generation, an AdamW step on the model, a generation again on
 * the same state equals a fresh state's (the panels are packed again: model.version). */
static void test_pack(int wide) {
  struct model *m = make_model(ARCH_QWEN3, 0, 2);
  if (wide) {
    struct model_config c = m->cfg;
    c.hidden_size = 72, c.intermediate_size = 200, c.num_heads = 6, c.head_dim = 12;
    c.vocab_size = 3008, c.vocab_used = 3001;
    model_free(m);
    m = model_from(&c);
  }
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, NSEQ, 64, &e), *s2 = NULL;
  int pa[5] = {5, 6, 7, 8, 9}, pb[3] = {10, 11, 12};
  const int *prompts[NSEQ] = {pa, pb, pa, pa, pb, pb, pb, pa};
  int plen[NSEQ] = {5, 3, 5, 4, 3, 3, 2, 2};
  uint64_t seeds[NSEQ] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct sampler_opts o = {.temperature = 1.0f, .top_p = 0.95f, .max_new_tokens = MAXN};
  struct run *r = malloc(4 * sizeof *r), *off = r, *on = r + 1, *fresh = r + 2, *before = r + 3;
  struct pool *p = pool_new(2);
  long old = kernels_par_min_work();
  kernels_set_par_min_work(0);
  for (int threads = 1; threads <= 2; threads++)
    for (int split = GEN_SPLIT_ROWS; split <= (threads > 1 ? GEN_SPLIT_COLUMNS : GEN_SPLIT_ROWS);
         split++) {
      CHECK(gen_state_set_pool(s, threads > 1 ? p : NULL, &e) == 0);
      gen_state_set_split(s, (enum gen_split)split);
      for (int n = 1; n <= NSEQ; n += NSEQ - 1) {
        gen_state_set_pack(s, 0);
        gen(s, m, n, prompts, plen, seeds, &o, off);
        gen_state_set_pack(s, 1);
        gen(s, m, n, prompts, plen, seeds, &o, on);
        CHECK_MSG(!memcmp(off, on, sizeof *on),
                  "packed decoding changed the tokens or log-probs (wide %d, %d threads, split %d, "
                  "batch %d)",
                  wide, threads, split, n);
      }
    }
  kernels_set_par_min_work(old);
  /* freshness: s packed m above; an AdamW step changes every weight */
  CHECK(gen_state_set_pool(s, NULL, &e) == 0);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, before);
  struct adamw opt;
  struct adamw_cfg cfg = adamw_cfg_default();
  cfg.lr = 0.05f, cfg.grad_clip = 0;
  CHECK(model_alloc_grads(m, &e) == 0 && adamw_init(&opt, m, &cfg, &e) == 0);
  struct rng rg;
  rng_seed(&rg, 9, 9);
  for (size_t i = 0; i < m->n_params; i++) m->grads[i] = (float)rng_normal(&rg);
  CHECK(adamw_step(&opt, m, cfg.lr, NULL, &e) == 0);
  gen(s, m, NSEQ, prompts, plen, seeds, &o, on);
  CHECK((s2 = gen_state_new(m, NSEQ, 64, &e)) != NULL);
  gen(s2, m, NSEQ, prompts, plen, seeds, &o, fresh);
  CHECK_MSG(memcmp(before, fresh, sizeof *fresh), "the AdamW step changed nothing (wide %d)", wide);
  CHECK_MSG(!memcmp(on, fresh, sizeof *on),
            "after an AdamW step the state decoded with stale panels (wide %d)", wide);
  adamw_deinit(&opt);
  pool_free(p);
  gen_state_free(s);
  gen_state_free(s2);
  free(r);
  model_free(m);
}

/* Decoding batches that take rows in the lanes from a transposed copy of each phase's input
 * (linear_lanes_prepare, float32 weights read in place, 16 rows or more on AVX-512, 49 on AVX2):
 * 40 rows (one block) and 80 (a block of 64 and one of 16), test_pack's wide model with a wider
 * FFN, unpacked. The same
 * tokens and log-prob bits serially on every instruction set (the copy on AVX-512, on AVX2 for a
 * block of 64 rows but for the down projection, the block elsewhere), and on 2 threads split by
 * rows (20 and 40 rows a thread: the block, then the copy), by static columns and by chunks of 1
 * KiB (down to 16 columns a call), with a thread delayed (against the pool's split by rows: its
 * prefill goes through OpenBLAS on 2 threads). */
enum { PB_MAX = 80, PB_NEW = 6 };
static void test_prepared_batch(void) {
  struct model *m0 = make_model(ARCH_QWEN3, 0, 2);
  struct model_config c = m0->cfg;
  model_free(m0);
  /* an FFN of 2100: a thread's gate/up share in slices of FF_COLS (by rows 4 x 384 then 564, by
   * columns 384 then 666), the down projection's 2100 inputs past AVX2's rows in the lanes */
  c.hidden_size = 72, c.intermediate_size = 2100, c.num_heads = 6, c.head_dim = 12;
  c.vocab_size = 3008, c.vocab_used = 3001;
  struct model *m = model_from(&c);
  struct dapo_err e;
  struct gen_state *s = gen_state_new(m, PB_MAX, 16, &e);
  CHECK_MSG(s != NULL, "%s", s ? "" : e.msg);
  gen_state_set_pack(s, 0);
  static int toks[2][PB_MAX * PB_NEW], len[PB_MAX], fin[PB_MAX];
  static float lp[2][PB_MAX * PB_NEW];
  int pa[4] = {5, 6, 7, 8}, pb[2] = {10, 11}, plen[PB_MAX];
  const int *prompts[PB_MAX];
  for (int i = 0; i < PB_MAX; i++) prompts[i] = i % 3 ? pa : pb, plen[i] = i % 3 ? 4 : 2;
  struct sampler_opts o = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = PB_NEW};
  struct pool *p = pool_new(2);
  int isas[4], n_isa = isa_list(isas);
  long old = kernels_par_min_work();
  kernels_set_par_min_work(0);
  for (int n = 40; n <= PB_MAX; n += 40) {
    int ref = 0;
    /* cases: serial on each instruction set, then 2 threads: rows, columns, chunks (delayed) */
    for (int cs = 0; cs < n_isa + 3; cs++) {
      if (cs == n_isa) ref = 0; /* a pool's prefill products differ: its own first run */
      int r = ref ? 1 : 0;
      kernels_force_isa(cs < n_isa ? isas[cs] : 0);
      CHECK(gen_state_set_pool(s, cs < n_isa ? NULL : p, &e) == 0);
      gen_state_set_split(s, cs < n_isa || cs == n_isa ? GEN_SPLIT_ROWS
                             : cs == n_isa + 1         ? GEN_SPLIT_COLUMNS
                                                       : GEN_SPLIT_DYNAMIC);
      gen_state_set_chunk(s, 1);
      gen_state_set_delay(s, 1, cs == n_isa + 2 ? 200 : 0);
      struct rng rngs[PB_MAX];
      for (int i = 0; i < n; i++) rng_seed(&rngs[i], 100 + (uint64_t)i, 0);
      memset(toks[r], 0, sizeof toks[r]), memset(lp[r], 0, sizeof lp[r]);
      struct gen_out out = {.tokens = toks[r], .logp = lp[r], .len = len, .finish = fin};
      CHECK_MSG(gen_run(s, m, n, prompts, plen, rngs, &o, &out, NULL, &e) == 0, "gen_run: %s",
                e.msg);
      CHECK_MSG(!ref || (!memcmp(toks[0], toks[1], sizeof toks[0]) &&
                         !memcmp(lp[0], lp[1], sizeof lp[0])),
                "batch %d, case %d (isa %d): tokens or log-prob bits differ from the first", n, cs,
                cs < n_isa ? isas[cs] : 0);
      ref = 1;
    }
  }
  gen_state_set_delay(s, 1, 0);
  kernels_force_isa(0);
  kernels_set_par_min_work(old);
  pool_free(p);
  gen_state_free(s);
  model_free(m);
}

/* gen_tune_pick from medians (rows, static columns, dynamic 256 KiB, dynamic 1024 KiB): the
 * fastest; static columns only where more than GEN_TUNE_STATIC_MARGIN faster than the fastest
 * dynamic split, else the fastest of the others (the seconds of the tunings in docs/ENGINE.md) */
static void test_tune_pick(void) {
  const double cases[][5] = {
      /* medians..., expected */
      {0.57733, 0.63638, 0.52145, 0.47443, 3}, /* Zen 3: dynamic 1024 fastest */
      {0.75209, 0.52735, 0.53919, 0.56724, 2}, /* static 2.2% ahead of 256 KiB: dynamic */
      {0.3100, 0.2767, 0.3000, 0.2936, 1},     /* the quiet Xeon: static 6.1% ahead, kept */
      {0.7250, 0.7710, 0.7950, 0.8740, 0},     /* rows fastest (busy Zen 4): rows */
      {0.9000, 0.5000, 0.5240, 0.5260, 2},     /* static 4.8% ahead: dynamic */
      {0.9000, 0.5000, 0.5260, 0.5300, 1},     /* static 5.2% ahead: static */
      {0.5100, 0.5000, 0.5200, 0.5200, 0},     /* static 4% ahead, rows next: rows */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got = gen_tune_pick(cases[i]);
    CHECK_MSG(got == (int)cases[i][4], "tune case %zu: picked %d, expected %d", i, got,
              (int)cases[i][4]);
  }
}

int main(void) {
  test_tune_pick();
  test_passes_bits();
  test_prepared_batch();
  test_model(ARCH_LLAMA, 1, 2);
  test_model(ARCH_QWEN2, 0, 4);
  test_model(ARCH_QWEN3, 0, 2);
  test_model(ARCH_QWEN3, 1, 1);
  test_greedy_argmax(ARCH_LLAMA);
  test_greedy_argmax(ARCH_QWEN3);
  test_pool(ARCH_QWEN2);
  test_pool(ARCH_QWEN3);
  test_pack(0);
  test_pack(1);
  test_advance(ARCH_QWEN2);
  test_advance(ARCH_QWEN3);
  test_concurrent_pick();
  test_top_reference();
  test_top_gen(ARCH_QWEN2);
  test_top_gen(ARCH_QWEN3);
  test_distribution(1.0f, 1.0f);
  test_distribution(0.7f, 1.0f);
  test_distribution(1.0f, 0.8f);
  test_distribution(1.3f, 0.5f);
  return check_done("test_sampler");
}
