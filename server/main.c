/* dapod: entry point. `dapod` / `dapod serve` runs the daemon (issue 4); the other subcommands
 * work offline over libdapo: list presets, save a preset as a checkpoint folder, sample text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm.h"
#include "parse.h"
#include "preset.h"
#include "rng.h"
#include "sampler.h"

static void usage(FILE *f) {
  fprintf(f, "usage: dapod [serve] [--listen HOST:PORT] [--data-dir DIR] [--models-dir DIR]\n"
             "       dapod presets\n"
             "       dapod save-preset NAME DIR [--seed N] [--bf16]\n"
             "       dapod generate MODEL --prompt TEXT [--max-tokens N] [--temperature T]\n"
             "                      [--top-p P] [--n N] [--seed N]\n"
             "       dapod --help\n"
             "MODEL is a preset name or a checkpoint folder (config.json, model.safetensors,\n"
             "tokenizer.json).\n");
}

static int fail(const struct dapo_err *e) {
  fprintf(stderr, "dapod: %s\n", e->msg);
  return 1;
}

static int cmd_presets(void) {
  for (int i = 0; i < preset_count(); i++) {
    const struct preset *p = preset_get(i);
    struct dapo_err e;
    struct model *m = model_new(&p->cfg, &e);
    printf("%-12s %10zu parameters  %s\n", p->name, m ? m->n_params : 0, p->description);
    model_free(m);
  }
  return 0;
}

static int cmd_save_preset(int argc, char **argv) {
  struct dapo_err e = {0};
  uint64_t seed = 0;
  int bf16 = 0;
  if (argc < 4) {
    usage(stderr);
    return 2;
  }
  for (int i = 4; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      if (parse_u64(argv[++i], &seed, "--seed", &e)) return fail(&e);
    } else if (!strcmp(argv[i], "--bf16"))
      bf16 = 1;
    else {
      fprintf(stderr, "dapod save-preset: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!preset_find(argv[2])) {
    preset_lookup(argv[2], &e);
    return fail(&e);
  }
  struct lm lm;
  if (lm_open(argv[2], seed, &lm, &e)) return fail(&e);
  int rc = lm_save(&lm, argv[3], bf16, &e);
  lm_close(&lm);
  if (rc) return fail(&e);
  printf("%s\n", argv[3]);
  return 0;
}

static int cmd_generate(int argc, char **argv) {
  struct dapo_err e = {0};
  const char *prompt = NULL;
  int max_tokens = 64, n = 1;
  double temp = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  if (argc < 3) {
    usage(stderr);
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!v) {
      fprintf(stderr, "dapod generate: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--prompt"))
      prompt = v;
    else if (!strcmp(a, "--max-tokens"))
      bad = parse_int(v, 1, 1 << 20, &max_tokens, a, &e);
    else if (!strcmp(a, "--temperature"))
      bad = parse_double(v, 0, 100, &temp, a, &e);
    else if (!strcmp(a, "--top-p"))
      bad = parse_double(v, 1e-6, 1, &top_p, a, &e);
    else if (!strcmp(a, "--n"))
      bad = parse_int(v, 1, 256, &n, a, &e);
    else if (!strcmp(a, "--seed"))
      bad = parse_u64(v, &seed, a, &e);
    else {
      fprintf(stderr, "dapod generate: unknown argument '%s'\n", a);
      return 2;
    }
    if (bad) return fail(&e);
    i++;
  }
  if (!prompt) {
    fprintf(stderr, "dapod generate: --prompt is required\n");
    return 2;
  }
  struct lm lm;
  if (lm_open(argv[2], seed, &lm, &e)) return fail(&e);
  int rc = 1, n_ids = 0;
  int *ids = NULL, *toks = NULL, *len = NULL, *fin = NULL;
  float *lp = NULL;
  struct gen_state *gs = NULL;
  struct rng *rngs = NULL;
  const int **prompts = NULL;
  int *plens = NULL;
  if (tok_encode(lm.tok, prompt, strlen(prompt), NULL, 0, &n_ids, &e)) goto out;
  ids = malloc(sizeof(int) * (size_t)(n_ids + 1));
  if (!ids || tok_encode(lm.tok, prompt, strlen(prompt), ids, n_ids, &n_ids, &e)) goto out;
  if (n_ids == 0 && lm.model->cfg.bos_token_id >= 0) ids[n_ids++] = lm.model->cfg.bos_token_id;
  if (n_ids == 0) {
    dapo_errf(&e, DAPO_EINVAL, "--prompt: empty prompt and the model has no BOS token");
    goto out;
  }
  int cap_t = n_ids + max_tokens;
  if (!(gs = gen_state_new(lm.model, n, cap_t, &e))) goto out;
  toks = malloc(sizeof(int) * (size_t)n * max_tokens);
  lp = malloc(sizeof(float) * (size_t)n * max_tokens);
  len = malloc(sizeof(int) * (size_t)n);
  fin = malloc(sizeof(int) * (size_t)n);
  rngs = malloc(sizeof(struct rng) * (size_t)n);
  prompts = malloc(sizeof(int *) * (size_t)n);
  plens = malloc(sizeof(int) * (size_t)n);
  if (!toks || !lp || !len || !fin || !rngs || !prompts || !plens) {
    dapo_errf(&e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    rng_seed(&rngs[i], seed, (uint64_t)i);
    prompts[i] = ids;
    plens[i] = n_ids;
  }
  struct sampler_opts o = {
      .temperature = (float)temp, .top_p = (float)top_p, .max_new_tokens = max_tokens};
  if (lm.model->cfg.eos_token_id >= 0) o.stop_ids[o.n_stop++] = lm.model->cfg.eos_token_id;
  struct gen_out go = {toks, lp, len, fin};
  if (gen_run(gs, lm.model, n, prompts, plens, rngs, &o, &go, NULL, &e)) goto out;
  for (int i = 0; i < n; i++) {
    char *text = tok_decode_alloc(lm.tok, toks + (size_t)i * max_tokens, len[i], 1, &e);
    if (!text) goto out;
    double sum = 0;
    for (int t = 0; t < len[i]; t++) sum += lp[(size_t)i * max_tokens + t];
    printf("--- sample %d: %d tokens, finish %s, logprob %.3f\n%s%s\n", i, len[i],
           fin[i] == FINISH_STOP ? "stop" : "length", sum, prompt, text);
    free(text);
  }
  rc = 0;
out:
  if (rc) fail(&e);
  free(ids), free(toks), free(lp), free(len), free(fin), free(rngs), free(prompts), free(plens);
  gen_state_free(gs);
  lm_close(&lm);
  return rc;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : "serve";
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "presets")) return cmd_presets();
  if (!strcmp(cmd, "save-preset")) return cmd_save_preset(argc, argv);
  if (!strcmp(cmd, "generate")) return cmd_generate(argc, argv);
  if (!strcmp(cmd, "serve") || cmd[0] == '-') {
    fprintf(stderr, "dapod: the HTTP daemon is not built yet (issue 4); offline commands: "
                    "presets, save-preset, generate (see --help)\n");
    return 2;
  }
  fprintf(stderr, "dapod: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
