/* Structured outputs through the sampler: random models generate under a schema's mask
 * (gen_state_set_mask, the matchers fed from gen_state_set_step), and every sample is printed for
 * tests/text/test_jsongrammar_sample.py to parse and validate with python3-jsonschema.
 * Usage: test_jsongrammar_sample SCHEMAS.json (--preset NAME | --tokenizer tokenizer.json)
 *        [--per N] [--max-new T] [--seed S] [--bias B] [--threads K] [--advance]
 * SCHEMAS.json is a list of schemas. Prints one JSON line a sample: {"schema": i, "text", "finish":
 * "stop"|"length"}, then a summary line {"summary": ...} with the mask's cost (per token and per
 * walk of the vocabulary). The model is the preset (random weights from seed), or for a
 * tokenizer file a one-layer Qwen3-shaped model of that vocabulary with random weights; its
 * stop ids are the preset's </s>, or <|im_end|> and <|endoftext|>. --bias B adds B to the
 * logit of every token holding '"', ',', '}' or ']' (a model that closes what it opens, so that
 * most samples end within T tokens; the mask comes after it). --threads K > 1 runs generation on
 * a pool of K threads: decoding steps then call the mask hook from the pool's threads, for
 * several sequences at once (the samples must not change). --advance generates with gen_advance
 * a token at a time instead of gen_run (the samples must not change either). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsongrammar.h"
#include "lm.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"
#include "tokenizer.h"

#define BATCH 16

struct glue {
  struct jmasker *k;
  struct jmatch *m[BATCH];
  int fed[BATCH], bad;
  double mask_s, walk_s; /* all masks; those that walked the vocabulary */
  int64_t masks;
  const float *bias; /* [V] or NULL */
  int pooled;        /* masks come from pool threads: no timing (it would race) */
  const int *seq_of; /* gen_advance's feeds: the sequence of feed i (NULL: gen_run's q) */
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_mask(void *ctx, int seq, float *logits, int V) {
  struct glue *g = ctx;
  if (g->seq_of) seq = g->seq_of[seq];
  if (g->bias)
    for (int i = 0; i < V; i++) logits[i] += g->bias[i];
  if (g->pooled) {
    if (jmasker_apply(g->k, g->m[seq], logits, V) <= 0)
      __atomic_add_fetch(&g->bad, 1, __ATOMIC_RELAXED);
    return;
  }
  int64_t h0, w0, h1, w1;
  jmasker_stats(g->k, &h0, &w0);
  double t0 = now();
  if (jmasker_apply(g->k, g->m[seq], logits, V) <= 0) g->bad++;
  double dt = now() - t0; /* serial generation: one thread */
  jmasker_stats(g->k, &h1, &w1);
  g->mask_s += dt;
  if (w1 > w0) g->walk_s += dt;
  g->masks++;
}

static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct glue *g = ctx;
  for (int q = 0; q < n; q++)
    for (; g->fed[q] < out->len[q]; g->fed[q]++)
      if (jmasker_feed(g->k, g->m[q], out->tokens[q * max_new + g->fed[q]])) g->bad++;
}

/* gen_run's work done with gen_advance a token at a time (the prompt fed into slot q, then each
 * sampled token), the matchers fed here and a sequence ended as on_step ends it: the mask hook's
 * gen_advance call sites (its prefill, and decode_step with feed indices). */
static int advance_run(struct gen_state *gs, const struct model *m, int n, const int *prompt,
                       struct rng *rngs, const struct sampler_opts *so, struct gen_out *out,
                       struct glue *g, int max_new, struct dapo_err *e) {
  int map[BATCH], tok[BATCH];
  float lp[BATCH];
  struct gen_feed feeds[BATCH];
  struct rng r[BATCH];
  g->seq_of = map;
  for (int q = 0; q < n; q++) {
    gen_slot_clear(gs, q);
    out->len[q] = 0;
    out->finish[q] = FINISH_LENGTH;
  }
  for (int t = 0; t < max_new; t++) {
    int nf = 0;
    for (int q = 0; q < n; q++) {
      if (out->finish[q] == FINISH_STOP || out->len[q] >= max_new) continue;
      const int *at = t ? &out->tokens[q * max_new + t - 1] : prompt;
      feeds[nf] = (struct gen_feed){q, at, 1};
      map[nf] = q, r[nf] = rngs[q];
      nf++;
    }
    if (!nf) break;
    if (gen_advance(gs, m, nf, feeds, r, so, tok, lp, e)) return -1;
    for (int i = 0; i < nf; i++) {
      int q = map[i];
      rngs[q] = r[i];
      out->tokens[q * max_new + t] = tok[i];
      out->logp[q * max_new + t] = lp[i];
      out->len[q] = t + 1;
      int stop = 0;
      for (int k = 0; k < so->n_stop; k++) stop |= tok[i] == so->stop_ids[k];
      if (jmasker_feed(g->k, g->m[q], tok[i])) g->bad++;
      if (stop) out->finish[q] = FINISH_STOP;
    }
  }
  g->seq_of = NULL;
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: test_jsongrammar_sample SCHEMAS.json (--preset NAME | --tokenizer "
                  "FILE) [--per N] [--max-new T] [--seed S]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *schemas_path = NULL, *preset = NULL, *tok_path = NULL;
  int per = 100, max_new = 160;
  uint64_t seed = 1;
  float bias_b = 0;
  int threads = 1, by_advance = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--preset") && i + 1 < argc)
      preset = argv[++i];
    else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
      tok_path = argv[++i];
    else if (!strcmp(argv[i], "--per") && i + 1 < argc)
      per = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--max-new") && i + 1 < argc)
      max_new = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--advance"))
      by_advance = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bias") && i + 1 < argc)
      bias_b = (float)atof(argv[++i]);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 10);
    else if (argv[i][0] != '-' && !schemas_path)
      schemas_path = argv[i];
    else
      return usage();
  }
  if (!schemas_path || !!preset == !!tok_path) return usage();
  struct dapo_err e = {0};
  json_error_t je;
  json_t *schemas = json_load_file(schemas_path, 0, &je);
  if (!json_is_array(schemas)) {
    fprintf(stderr, "%s: %s\n", schemas_path, je.text);
    return 1;
  }
  struct lm lm = {0};
  struct model *model = NULL;
  struct tokenizer *tok = NULL;
  int stop[2], n_stop = 0;
  if (preset) {
    if (lm_open(preset, seed, &lm, &e)) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    model = lm.model, tok = lm.tok;
    for (int i = 0; i < lm.n_stop && n_stop < 2; i++) stop[n_stop++] = lm.stop_ids[i];
  } else {
    if (!(tok = tok_from_file(tok_path, &e))) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    struct model_config c = {.arch = ARCH_QWEN3,
                             .vocab_size = tok_vocab_size(tok),
                             .hidden_size = 32,
                             .intermediate_size = 64,
                             .num_layers = 1,
                             .num_heads = 4,
                             .num_kv_heads = 2,
                             .head_dim = 8,
                             .max_position_embeddings = 1024,
                             .rms_norm_eps = 1e-6f,
                             .rope_theta = 1e6f,
                             .tie_word_embeddings = 1,
                             .qk_norm = 1,
                             .bos_token_id = -1,
                             .eos_token_id = -1,
                             .initializer_range = 0.5f};
    if (!(model = model_new(&c, &e))) {
      fprintf(stderr, "%s\n", e.msg);
      return 1;
    }
    model_init_random(model, seed);
    const char *names[] = {"<|im_end|>", "<|endoftext|>"};
    for (int i = 0; i < 2; i++)
      if (tok_token_to_id(tok, names[i]) >= 0) stop[n_stop++] = tok_token_to_id(tok, names[i]);
  }
  int V = model_vocab_used(&model->cfg);
  double t0 = now();
  struct jvocab *voc = jvocab_new(tok, V, &e);
  double vocab_s = now() - t0;
  float *bias = calloc((size_t)V, sizeof *bias);
  for (int i = 0; bias && bias_b != 0 && i < V; i++) {
    char *b;
    size_t bl;
    struct dapo_err ignore;
    if (tok_is_special(tok, i) || tok_token_bytes(tok, i, &b, &bl, &ignore)) continue;
    for (size_t j = 0; j < bl; j++)
      if (b[j] && strchr("\",}]", b[j])) bias[i] = bias_b;
    free(b);
  }
  struct gen_state *gs = gen_state_new(model, BATCH, 1 + max_new, &e);
  if (!voc || !gs) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  struct pool *pool = threads > 1 ? pool_new(threads) : NULL;
  if (pool && gen_state_set_pool(gs, pool, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = max_new};
  so.n_stop = n_stop;
  memcpy(so.stop_ids, stop, sizeof stop);
  int *tokens = malloc(sizeof *tokens * BATCH * (size_t)max_new);
  float *logp = malloc(sizeof *logp * BATCH * (size_t)max_new);
  int len[BATCH], finish[BATCH], prompt0 = 0, bad_total = 0;
  struct gen_out out = {tokens, logp, len, finish, NULL, NULL};
  const int *prompts[BATCH];
  int plen[BATCH];
  struct rng rngs[BATCH];
  int64_t n_tokens = 0, hits_total = 0, walks_total = 0, samples = 0;
  double mask_s = 0, walk_s = 0, gen_s = 0;
  for (int q = 0; q < BATCH; q++) prompts[q] = &prompt0, plen[q] = 1;
  size_t si;
  json_t *schema;
  json_array_foreach(schemas, si, schema) {
    struct jgrammar *g = jgrammar_from_schema(schema, "schema", &e);
    struct glue gl = {.bias = bias_b != 0 ? bias : NULL, .pooled = pool != NULL};
    if (!g || !(gl.k = jmasker_new(g, voc, stop, n_stop, &e))) {
      fprintf(stderr, "schema %zu: %s\n", si, e.msg);
      return 1;
    }
    for (int q = 0; q < BATCH; q++) gl.m[q] = jmatch_new(g);
    gen_state_set_mask(gs, on_mask, &gl);
    gen_state_set_step(gs, on_step, &gl);
    for (int done = 0; done < per; done += BATCH) {
      int n = per - done < BATCH ? per - done : BATCH;
      for (int q = 0; q < n; q++) {
        jmatch_reset(gl.m[q]);
        gl.fed[q] = 0;
        rng_seed(&rngs[q], seed, (uint64_t)(si * 100000 + (size_t)done + (size_t)q));
      }
      double g0 = now();
      if (by_advance ? advance_run(gs, model, n, &prompt0, rngs, &so, &out, &gl, max_new, &e)
                     : gen_run(gs, model, n, prompts, plen, rngs, &so, &out, NULL, &e)) {
        fprintf(stderr, "schema %zu: %s\n", si, e.msg);
        return 1;
      }
      gen_s += now() - g0;
      for (int q = 0; q < n; q++) {
        size_t tl;
        int body = len[q] - (finish[q] == FINISH_STOP ? 1 : 0);
        char *text = tok_decode_alloc(tok, tokens + (size_t)q * max_new, body, 0, &e);
        tl = text ? strlen(text) : 0;
        json_t *line = json_pack("{s:i,s:s%,s:s}", "schema", (int)si, "text", text ? text : "", tl,
                                 "finish", finish[q] == FINISH_STOP ? "stop" : "length");
        char *s = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
        printf("%s\n", s);
        free(s);
        json_decref(line);
        free(text);
        n_tokens += len[q];
        samples++;
      }
    }
    int64_t h, w;
    jmasker_stats(gl.k, &h, &w);
    hits_total += h, walks_total += w;
    mask_s += gl.mask_s;
    walk_s += gl.walk_s;
    bad_total += gl.bad;
    gen_state_set_mask(gs, NULL, NULL);
    gen_state_set_step(gs, NULL, NULL);
    for (int q = 0; q < BATCH; q++) jmatch_free(gl.m[q]);
    jmasker_free(gl.k);
    jgrammar_free(g);
  }
  int64_t masks = hits_total + walks_total;
  printf("{\"summary\":{\"samples\":%lld,\"tokens\":%lld,\"vocab\":%d,\"vocab_build_ms\":%.1f,"
         "\"masks\":%lld,\"walks\":%lld,\"mask_ms_per_token\":%.3f,\"walk_ms\":%.3f,"
         "\"cached_ms\":%.3f,\"gen_s\":%.2f,\"refused_feeds\":%d}}\n",
         (long long)samples, (long long)n_tokens, V, 1e3 * vocab_s, (long long)masks,
         (long long)walks_total, masks ? 1e3 * mask_s / (double)masks : 0.0,
         walks_total ? 1e3 * walk_s / (double)walks_total : 0.0,
         masks > walks_total ? 1e3 * (mask_s - walk_s) / (double)(masks - walks_total) : 0.0, gen_s,
         bad_total);
  free(tokens);
  free(logp);
  free(bias);
  gen_state_free(gs);
  pool_free(pool);
  jvocab_free(voc);
  if (preset) {
    lm_close(&lm);
  } else {
    model_free(model);
    tok_free(tok);
  }
  json_decref(schemas);
  return bad_total ? 1 : 0;
}
