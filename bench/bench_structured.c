/* Structured outputs' cost: generation with and without a response_format mask, at batch 1 and
 * 16, on issue 26's small Qwen-vocabulary model (bench_engine's qwen-small shape: 4 layers of
 * 128, tied 151,936-row embedding, 151,669 ids used) with Qwen3's real tokenizer (its byte
 * strings make the mask). One core (no pool), as the completion service samples; random
 * weights, temperature 1, a 16-token prompt. Each case runs `--reps` times, alternating
 * unconstrained and constrained, and prints the median tokens/s of each and their ratio:
 *   free-string: {"text": string}, a long free string (the mask is cached: the state repeats)
 *   mixed: an object of a bounded string, integers, an enum, an array and anyOf with null
 *          (numbers and keys: new states, vocabulary walks)
 * Then the update's side (a training job under a response_format, core/rl/runner_json.c): the 16
 * constrained responses of each case scored by train_logprobs (the old-log-prob pass) without a
 * mask, and with one (each response replayed through a fresh matcher into a bitset per token,
 * with the generation's masker and its cache, then the masked classifier), alternating; medians
 * of the pass's time and their ratio.
 * --shape 0.5b takes Qwen2.5-0.5B's shape instead (24 layers of 896, GQA 14/2, q/k/v biases).
 * Usage: bench_structured TOKENIZER.json [--new N] [--reps R] [--shape small|0.5b]
 * (bench/README.md "Structured outputs"). Reports; never fails on a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsongrammar.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"
#include "train.h"

#define BMAX 16

struct glue {
  struct jmasker *k;
  struct jmatch *m[BMAX];
  int fed[BMAX];
};

static void on_mask(void *ctx, int seq, float *logits, int V) {
  struct glue *g = ctx;
  jmasker_apply(g->k, g->m[seq], logits, V);
}

static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct glue *g = ctx;
  for (int q = 0; q < n; q++)
    for (; g->fed[q] < out->len[q]; g->fed[q]++) {
      jmasker_feed(g->k, g->m[q], out->tokens[q * max_new + g->fed[q]]);
      if (jmatch_done(g->m[q]) && !jmatch_can_continue(g->m[q])) out->finish[q] = FINISH_STOP;
    }
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int g_keep; /* run() keeps its tokens in g_tok, g_len (the update's batch) */
static int *g_tok, g_len[BMAX];

/* The update's old-log-prob pass over the n responses run() kept (prompt 16 tokens), without and
 * with the mask (replay + masked classifier), alternating; prints the medians. */
static void update_cost(const struct model *m, const struct jgrammar *g, struct glue *con, int n,
                        int max_new, int reps) {
  static const int prompt[16] = {785,  3974, 13876, 38835, 34208, 916, 279, 15678,
                                 5562, 13,   576,   3974,  374,   220, 16,  15};
  int V = model_vocab_used(&m->cfg), off[BMAX + 1] = {0}, plen[BMAX], R = 0;
  size_t W = ((size_t)V + 63) / 64;
  int *btok = malloc(sizeof(int) * (size_t)n * (16 + (size_t)max_new));
  for (int q = 0; q < n; q++) {
    memcpy(btok + off[q], prompt, sizeof prompt);
    memcpy(btok + off[q] + 16, g_tok + (size_t)q * max_new, sizeof(int) * (size_t)g_len[q]);
    plen[q] = 16;
    off[q + 1] = off[q] + 16 + g_len[q];
    R += g_len[q];
  }
  uint64_t *allowed = malloc(sizeof *allowed * W * (size_t)R);
  float *lp = malloc(sizeof(float) * (size_t)R);
  struct dapo_err e = {0};
  struct train_state *ts = train_state_new(m, off[n], R, 16 + max_new, &e);
  struct jmatch *mt = jmatch_new(g);
  if (!btok || !allowed || !lp || !ts || !mt) {
    fprintf(stderr, "update: %s\n", e.msg[0] ? e.msg : "out of memory");
    exit(1);
  }
  struct fwd_batch b = {n, btok, off, plen, NULL, NULL, NULL};
  double a[32], c[32], r[32];
  int kk = reps < 32 ? reps : 32;
  for (int k = 0; k < kk; k++) {
    double t0 = now();
    b.allowed = NULL;
    train_logprobs(ts, m, &b, 1.0f, lp, &e);
    a[k] = now() - t0;
    t0 = now();
    for (int q = 0, row = 0; q < n; q++) {
      jmatch_reset(mt);
      for (int i = 0; i < g_len[q]; i++, row++) {
        jmasker_mask(con->k, mt, allowed + (size_t)row * W);
        jmasker_feed(con->k, mt, btok[off[q] + 16 + i]);
      }
    }
    b.allowed = allowed;
    train_logprobs(ts, m, &b, 1.0f, lp, &e);
    c[k] = now() - t0;
    r[k] = c[k] / a[k];
  }
  qsort(a, (size_t)kk, sizeof *a, cmp_d);
  qsort(c, (size_t)kk, sizeof *c, cmp_d);
  qsort(r, (size_t)kk, sizeof *r, cmp_d);
  printf("  update: old-log-prob pass over %d response tokens: unmasked %.1f ms, masked %.1f ms "
         "(replay + masked classifier), ratio %.2f (medians of %d)\n",
         R, 1e3 * a[kk / 2], 1e3 * c[kk / 2], r[kk / 2], kk);
  jmatch_free(mt);
  train_state_free(ts);
  free(btok), free(allowed), free(lp);
}

/* tokens/s of one gen_run of n sequences (constrained when g->k) */
static double run(struct gen_state *gs, const struct model *m, int n, int max_new, struct glue *g,
                  uint64_t seed) {
  static int prompt[16] = {785,  3974, 13876, 38835, 34208, 916, 279, 15678,
                           5562, 13,   576,   3974,  374,   220, 16,  15};
  const int *prompts[BMAX];
  int plen[BMAX], len[BMAX], fin[BMAX];
  struct rng rngs[BMAX];
  int *tok = malloc(sizeof *tok * BMAX * (size_t)max_new);
  float *lp = malloc(sizeof *lp * BMAX * (size_t)max_new);
  struct gen_out out = {tok, lp, len, fin, NULL, NULL};
  for (int q = 0; q < n; q++) {
    prompts[q] = prompt, plen[q] = 16;
    rng_seed(&rngs[q], seed, (uint64_t)q);
    if (g->k) jmatch_reset(g->m[q]), g->fed[q] = 0;
  }
  gen_state_set_mask(gs, g->k ? on_mask : NULL, g);
  gen_state_set_step(gs, g->k ? on_step : NULL, g);
  struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = max_new};
  struct dapo_err e = {0};
  double t0 = now();
  int rc = gen_run(gs, m, n, prompts, plen, rngs, &so, &out, NULL, &e);
  double dt = now() - t0;
  long total = 0;
  for (int q = 0; q < n; q++) total += len[q];
  if (g_keep) {
    free(g_tok);
    g_tok = tok, tok = NULL;
    memcpy(g_len, len, sizeof len);
  }
  free(tok);
  free(lp);
  if (rc) {
    fprintf(stderr, "gen_run: %s\n", e.msg);
    exit(1);
  }
  return (double)total / dt;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_structured TOKENIZER.json [--new N] [--reps R]\n");
    return 2;
  }
  int max_new = 64, reps = 5, big = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--new")) max_new = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--shape")) big = !strcmp(argv[i + 1], "0.5b");
  }
  struct dapo_err e = {0};
  struct tokenizer *tok = tok_from_file(argv[1], &e);
  if (!tok) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  struct model_config c = {.arch = ARCH_QWEN3,
                           .vocab_size = 151936,
                           .vocab_used = tok_vocab_size(tok),
                           .hidden_size = 128,
                           .intermediate_size = 1408,
                           .num_layers = 4,
                           .num_heads = 4,
                           .num_kv_heads = 2,
                           .head_dim = 32,
                           .max_position_embeddings = 4096,
                           .rms_norm_eps = 1e-6f,
                           .rope_theta = 1e6f,
                           .tie_word_embeddings = 1,
                           .qk_norm = 1,
                           .bos_token_id = -1,
                           .eos_token_id = -1,
                           .initializer_range = 0.02f};
  if (big) { /* Qwen2.5-0.5B's shape */
    c.arch = ARCH_QWEN2, c.qk_norm = 0, c.qkv_bias = 1, c.hidden_size = 896;
    c.intermediate_size = 4864, c.num_layers = 24, c.num_heads = 14, c.num_kv_heads = 2;
    c.head_dim = 64;
  }
  struct model *m = model_new(&c, &e);
  if (!m) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  model_init_random(m, 1);
  int V = model_vocab_used(&c);
  double t0 = now();
  struct jvocab *voc = jvocab_new(tok, V, &e);
  printf("%s shape; vocabulary: %d ids sorted by bytes in %.1f ms\n",
         big ? "qwen-0.5b" : "qwen-small", V, 1e3 * (now() - t0));
  struct gen_state *gs = gen_state_new(m, BMAX, 16 + max_new, &e);
  static const char *const cases[][2] = {
      {"free-string", "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},"
                      "\"required\":[\"text\"],\"additionalProperties\":false}"},
      {"mixed",
       "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":"
       "12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"pet\":{"
       "\"anyOf\":[{\"enum\":[\"cat\",\"dog\"]},{\"type\":\"null\"}]},\"scores\":{\"type\":"
       "\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":4}},\"required\":[\"name\","
       "\"age\",\"pet\",\"scores\"],\"additionalProperties\":false}"}};
  int stop = -1;
  for (size_t ci = 0; ci < 2; ci++) {
    json_t *s = json_loads(cases[ci][1], 0, NULL);
    struct jgrammar *g = jgrammar_from_schema(s, "schema", &e);
    json_decref(s);
    for (int bi = 0; bi < 2; bi++) {
      int n = bi ? 16 : 1;
      struct glue free_g = {0}, con = {0};
      con.k = jmasker_new(g, voc, &stop, 0, &e); /* a fresh cache for each case */
      for (int q = 0; q < n; q++) con.m[q] = jmatch_new(g);
      double a[32], b[32], r[32];
      run(gs, m, n, max_new, &free_g, 99); /* warm-up */
      for (int k = 0; k < reps && k < 32; k++) {
        a[k] = run(gs, m, n, max_new, &free_g, (uint64_t)k + 1);
        b[k] = run(gs, m, n, max_new, &con, (uint64_t)k + 1);
        r[k] = b[k] / a[k];
      }
      int64_t hits, walks;
      jmasker_stats(con.k, &hits, &walks);
      int kk = reps < 32 ? reps : 32;
      qsort(a, (size_t)kk, sizeof *a, cmp_d);
      qsort(b, (size_t)kk, sizeof *b, cmp_d);
      qsort(r, (size_t)kk, sizeof *r, cmp_d);
      printf("%-11s batch %2d: unconstrained %7.1f tok/s, constrained %7.1f tok/s, ratio %.2f "
             "(medians of %d; %lld masks, %lld vocabulary walks)\n",
             cases[ci][0], n, a[kk / 2], b[kk / 2], r[kk / 2], kk, (long long)(hits + walks),
             (long long)walks);
      if (n == BMAX) { /* the update's side, on one more constrained batch */
        g_keep = 1;
        run(gs, m, n, max_new, &con, 1000);
        g_keep = 0;
        update_cost(m, g, &con, n, max_new, reps);
      }
      for (int q = 0; q < n; q++) jmatch_free(con.m[q]);
      jmasker_free(con.k);
    }
    jgrammar_free(g);
  }
  free(g_tok);
  gen_state_free(gs);
  jvocab_free(voc);
  model_free(m);
  tok_free(tok);
  return 0;
}
