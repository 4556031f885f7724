/* Structured outputs' cost: generation with and without a response_format mask, at batch 1 and
 * 16, on issue 26's small Qwen-vocabulary model (bench_engine's qwen-small shape: 4 layers of
 * 128, tied 151,936-row embedding, 151,669 ids used) with Qwen3's real tokenizer (its byte
 * strings make the mask). One core (no pool), as the completion service samples; random
 * weights, temperature 1, a 16-token prompt. Each case runs `--reps` times, alternating
 * unconstrained and constrained, and prints the median tokens/s of each and their ratio:
 *   free-string: {"text": string}, a long free string (the mask is cached: the state repeats)
 *   mixed: an object of a bounded string, integers, an enum, an array and anyOf with null
 *          (numbers and keys: new states, vocabulary walks)
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
      for (int q = 0; q < n; q++) jmatch_free(con.m[q]);
      jmasker_free(con.k);
    }
    jgrammar_free(g);
  }
  gen_state_free(gs);
  jvocab_free(voc);
  model_free(m);
  tok_free(tok);
  return 0;
}
