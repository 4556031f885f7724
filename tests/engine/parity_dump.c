/* Helper of tests/engine/test_torch_parity.py (label torch): for several small model configs,
 * builds a random model, saves it with ckpt_save (F32, and BF16 for some), and writes
 * OUTDIR/parity.json with the packed batch, our log-probs and entropies (train_forward), every
 * gradient tensor of sum_t w_t * logp_t (train_backward), tokens sampled by gen_run with their
 * log-probs, and the parameters after 3 AdamW steps, for the PyTorch reference
 * (tests/torch_ref/llama.py) to recompute independently. Usage: parity_dump OUTDIR (OUTDIR must
 * exist; the checkpoint folders must not). */
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>

#include "adamw.h"
#include "checkpoint.h"
#include "lora.h"
#include "model.h"
#include "rng.h"
#include "sampler.h"
#include "train.h"

#define MAX_SEQ 4
#define MAX_TOK 256

struct pcase {
  const char *name;
  struct model_config cfg;
  float inv_temp;
  int n_seq;
  int lens[MAX_SEQ], plen[MAX_SEQ];
  int bf16;        /* also save as BF16, reload with ckpt_load, and dump that model's log-probs */
  float pad_scale; /* > 0: lm_head rows past vocab_used ~ N(0, pad_scale^2), logits far larger
                      than the real ones, which training and sampling must never see */
  struct lora_config lora; /* r > 0: a frozen model with this adapter (A and B random), saved as
                              a PEFT folder NAME-adapter; the gradients are the adapter's */
};

static json_t *floats_json(const float *x, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_real((double)x[i]));
  return a;
}

static json_t *ints_json(const int *x, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(x[i]));
  return a;
}

/* {name: flat values} of every tensor of m's table, read from buf (laid out like m->params). */
static json_t *tensors_json(const struct model *m, const float *buf) {
  json_t *o = json_object();
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *p = &m->tensors[i];
    json_object_set_new(o, p->name, floats_json(buf + p->offset, p->numel));
  }
  return o;
}

/* {PEFT name: flat values} of every tensor of an adapter, from buf (laid out like l->params). */
static json_t *adapter_json_of(const struct lora *l, const float *buf) {
  json_t *o = json_object();
  for (int i = 0; i < l->n_tensors; i++)
    json_object_set_new(o, l->tensors[i].name,
                        floats_json(buf + l->tensors[i].offset, l->tensors[i].numel));
  return o;
}

static json_t *adapter_json(const struct lora *l) {
  return adapter_json_of(l, l->params);
}

static int fail(const char *what, const struct dapo_err *e) {
  fprintf(stderr, "parity_dump: %s: %s\n", what, e->msg);
  return -1;
}

/* Forward on b, then (if w) zeroed gradients and the backward of sum_t w_t * logp_t. */
static int fwd_bwd(struct train_state *s, struct model *m, const struct fwd_batch *b,
                   float inv_temp, float *logp, float *ent, const float *w, struct dapo_err *e) {
  int rc = train_forward(s, m, b, inv_temp, logp, ent, e);
  if (rc || !w) return rc;
  model_zero_grads(m);
  if (m->lora) lora_zero_grads(m->lora);
  return train_backward(s, m, w, e);
}

static int run_case(const char *outdir, const struct pcase *pc, uint64_t seed, json_t *cases) {
  struct dapo_err e = {0};
  struct model *m = NULL, *mb = NULL;
  struct train_state *s = NULL, *sb = NULL;
  struct gen_state *gs = NULL;
  struct adamw opt = {0};
  struct lora *lo = NULL;
  int rc = -1;
  char dir[512], dir_bf16[512], dir_ad[600];
  snprintf(dir, sizeof dir, "%s/%s", outdir, pc->name);
  snprintf(dir_bf16, sizeof dir_bf16, "%s/%s-bf16", outdir, pc->name);

  m = model_new(&pc->cfg, &e);
  if (!m) return fail(pc->name, &e);
  model_init_random(m, seed);
  /* nothing trivial: norms ~ 1 + N(0, 0.3^2), biases ~ N(0, 0.3^2) */
  struct rng r;
  rng_seed(&r, seed, 99);
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *p = &m->tensors[i];
    if (p->ndim == 1)
      for (size_t k = 0; k < p->numel; k++)
        m->params[p->offset + k] += 0.3f * (float)rng_normal(&r);
  }
  int V_used = model_vocab_used(&pc->cfg);
  if (pc->pad_scale > 0)
    for (size_t k = (size_t)V_used * pc->cfg.hidden_size;
         k < (size_t)pc->cfg.vocab_size * pc->cfg.hidden_size; k++)
      m->w.lm_head[k] = pc->pad_scale * (float)rng_normal(&r);
  if (pc->lora.r > 0) {
    if (!(lo = lora_new(&pc->lora, &pc->cfg, &e)) || lora_alloc_grads(lo, &e)) {
      fail("lora_new", &e);
      goto out;
    }
    lora_init(lo, seed); /* PEFT's A, then B random too: a zero B would hide A's gradient */
    for (int i = 0; i < lo->n_tensors; i++)
      if (lo->tensors[i].kind == PK_LORA_B)
        for (size_t k = 0; k < lo->tensors[i].numel; k++)
          lo->params[lo->tensors[i].offset + k] = 0.2f * (float)rng_normal(&r);
    m->lora = lo;
    snprintf(dir_ad, sizeof dir_ad, "%s/%s-adapter", outdir, pc->name);
    if (mkdir(dir_ad, 0755) != 0 || lora_save(lo, dir_ad, dir, &e)) {
      fail("lora_save", &e);
      goto out;
    }
  }
  if (ckpt_save(dir, m, NULL, NULL, 0, &e)) {
    fail("ckpt_save", &e);
    goto out;
  }
  if (pc->bf16 && ckpt_save(dir_bf16, m, NULL, NULL, 1, &e)) {
    fail("ckpt_save bf16", &e);
    goto out;
  }

  /* the packed batch and the loss weights */
  int off[MAX_SEQ + 1] = {0}, tokens[MAX_TOK];
  for (int i = 0; i < pc->n_seq; i++) off[i + 1] = off[i] + pc->lens[i];
  for (int i = 0; i < off[pc->n_seq]; i++) tokens[i] = (int)rng_below(&r, (uint64_t)V_used);
  struct fwd_batch b = {
      .n_seq = pc->n_seq, .tokens = tokens, .seq_off = off, .prompt_len = pc->plen};
  int R = fwd_batch_resp_tokens(&b);
  float w[MAX_TOK], logp[MAX_TOK], ent[MAX_TOK];
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&r);

  int cap_t = pc->cfg.max_position_embeddings < MAX_TOK ? pc->cfg.max_position_embeddings : MAX_TOK;
  s = train_state_new(m, MAX_TOK, MAX_TOK, cap_t, &e);
  if (!s || (!lo && model_alloc_grads(m, &e))) {
    fail(pc->name, &e);
    goto out;
  }
  if (fwd_bwd(s, m, &b, pc->inv_temp, logp, ent, w, &e)) {
    fail("forward/backward", &e);
    goto out;
  }

  json_t *c = json_object();
  json_array_append_new(cases, c);
  json_t *seqs = json_array();
  for (int i = 0; i < pc->n_seq; i++)
    json_array_append_new(seqs, json_pack("{s:o, s:i}", "tokens",
                                          ints_json(tokens + off[i], (size_t)pc->lens[i]),
                                          "prompt_len", pc->plen[i]));
  json_object_set_new(c, "name", json_string(pc->name));
  json_object_set_new(c, "dir", json_string(dir));
  json_object_set_new(c, "inv_temp", json_real(pc->inv_temp));
  json_object_set_new(c, "vocab_used", json_integer(V_used));
  json_object_set_new(c, "vocab_size", json_integer(pc->cfg.vocab_size));
  json_object_set_new(c, "seqs", seqs);
  json_object_set_new(c, "weights", floats_json(w, (size_t)R));
  json_object_set_new(c, "logp", floats_json(logp, (size_t)R));
  json_object_set_new(c, "entropy", floats_json(ent, (size_t)R));
  if (lo) {
    json_object_set_new(c, "grads", adapter_json_of(lo, lo->grads));
    json_object_set_new(c, "adapter", json_string(dir_ad));
  } else {
    json_object_set_new(c, "grads", tensors_json(m, m->grads));
  }

  /* the BF16 checkpoint, read back by ckpt_load */
  if (pc->bf16) {
    if (ckpt_load(dir_bf16, &mb, NULL, &e)) {
      fail("ckpt_load bf16", &e);
      goto out;
    }
    mb->cfg.vocab_used = pc->cfg.vocab_used; /* lm_open's part: the tokenizer's ids */
    sb = train_state_new(mb, MAX_TOK, MAX_TOK, cap_t, &e);
    if (!sb || fwd_bwd(sb, mb, &b, pc->inv_temp, logp, ent, NULL, &e)) {
      fail("bf16 forward", &e);
      goto out;
    }
    json_object_set_new(c, "bf16",
                        json_pack("{s:s, s:o, s:o}", "dir", dir_bf16, "logp",
                                  floats_json(logp, (size_t)R), "entropy",
                                  floats_json(ent, (size_t)R)));
  }

  /* generation with the KV cache: two sequences share prompt 0 (one prefill), a third has its
   * own; temperature != 1; the reference recomputes the log-prob of every sampled token */
  {
    enum { G = 3, NEW = 9 };
    const int *prompts[G] = {tokens, tokens, tokens + off[1]};
    int plens[G] = {pc->plen[0], pc->plen[0], pc->lens[1]};
    int gtok[G * NEW], glen[G], gfin[G];
    float glogp[G * NEW];
    struct rng grng[G];
    for (int i = 0; i < G; i++) rng_seed(&grng[i], seed, 50 + (uint64_t)i);
    struct sampler_opts so = {.temperature = 0.8f, .top_p = 1.0f, .max_new_tokens = NEW};
    struct gen_out go = {.tokens = gtok, .logp = glogp, .len = glen, .finish = gfin};
    gs = gen_state_new(m, G, cap_t, &e);
    if (!gs || gen_run(gs, m, G, prompts, plens, grng, &so, &go, NULL, &e)) {
      fail("gen_run", &e);
      goto out;
    }
    json_t *gj = json_array();
    for (int i = 0; i < G; i++)
      json_array_append_new(gj, json_pack("{s:o, s:o, s:o}", "prompt",
                                          ints_json(prompts[i], (size_t)plens[i]), "tokens",
                                          ints_json(gtok + i * NEW, (size_t)glen[i]), "logp",
                                          floats_json(glogp + i * NEW, (size_t)glen[i])));
    json_object_set_new(c, "generate",
                        json_pack("{s:f, s:o}", "temperature", (double)so.temperature, "seqs", gj));
  }

  /* 3 AdamW steps on the same batch: weight decay, clipping (the norm is >> grad_clip), warm-up.
   * Adam divides by sqrt(v) + eps, which turns float32 noise in a near-zero gradient entry into an
   * update of up to lr * noise / eps. eps = 1e-4 sits well below the clipped per-entry gradients
   * (~2e-3) but keeps that amplification below ~1e-6 per step, while the updates themselves
   * (~lr = 1e-3 per step, weight decay ~4e-5 per step on matrices) stay far above the 1e-5 the
   * test allows. */
  struct adamw_cfg oc = {.lr = 1e-3f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-4f,
                         .weight_decay = 0.2f,
                         .grad_clip = 0.5f,
                         .warmup_steps = 2};
  if (adamw_init(&opt, m, &oc, &e)) {
    fail("adamw_init", &e);
    goto out;
  }
  json_t *steps = json_array();
  for (int t = 0; t < 3; t++) {
    double norm = 0;
    float lr = adamw_lr_at(&oc, t);
    if (fwd_bwd(s, m, &b, pc->inv_temp, logp, ent, w, &e) || adamw_step(&opt, m, lr, &norm, &e)) {
      json_decref(steps);
      fail("adamw", &e);
      goto out;
    }
    json_array_append_new(steps, json_pack("{s:f, s:f, s:o}", "lr", (double)lr, "grad_norm", norm,
                                           "logp", floats_json(logp, (size_t)R)));
  }
  json_object_set_new(c, "adamw",
                      json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:o, s:o}", "lr",
                                (double)oc.lr, "beta1", (double)oc.beta1, "beta2", (double)oc.beta2,
                                "eps", (double)oc.eps, "weight_decay", (double)oc.weight_decay,
                                "grad_clip", (double)oc.grad_clip, "warmup_steps", oc.warmup_steps,
                                "steps", steps, "params",
                                lo ? adapter_json(lo) : tensors_json(m, m->params)));
  fprintf(stderr, "parity_dump: %s: %d params, %d response tokens\n", pc->name, (int)m->n_params,
          R);
  rc = 0;
out:
  adamw_deinit(&opt);
  gen_state_free(gs);
  train_state_free(sb);
  train_state_free(s);
  model_free(mb);
  model_free(m);
  lora_free(lo);
  return rc;
}

/* For each {name, config} of OUTDIR/configs.json (when present): model_config_from_json's
 * verdict (the error message of a refusal), and for an accepted config its parameter count, RoPE
 * inverse frequencies and attention factor (model_rope_freqs), for the reference to recompute. */
static json_t *dump_configs(const char *outdir) {
  char path[512];
  snprintf(path, sizeof path, "%s/configs.json", outdir);
  json_t *in = json_load_file(path, 0, NULL), *out = json_array();
  size_t i;
  json_t *item;
  json_array_foreach(in, i, item) {
    struct model_config c;
    struct dapo_err e = {0};
    json_t *o = json_pack("{s:O}", "name", json_object_get(item, "name"));
    if (model_config_from_json(&c, json_object_get(item, "config"), &e)) {
      json_object_set_new(o, "error", json_string(e.msg));
    } else {
      float inv[512], af = 0;
      model_rope_freqs(&c, inv, &af);
      json_object_set_new(o, "inv_freq", floats_json(inv, (size_t)c.head_dim / 2));
      json_object_set_new(o, "attention_factor", json_real(af));
      json_object_set_new(o, "n_params", json_integer(model_param_count(&c)));
      json_object_set_new(o, "written", model_config_to_json(&c, "float32"));
    }
    json_array_append_new(out, o);
  }
  json_decref(in);
  return out;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: parity_dump OUTDIR\n");
    return 2;
  }
  struct model_config base = {.arch = ARCH_LLAMA,
                              .vocab_size = 97,
                              .hidden_size = 48,
                              .intermediate_size = 80,
                              .num_layers = 2,
                              .num_heads = 6,
                              .num_kv_heads = 2,
                              .head_dim = 8,
                              .max_position_embeddings = 64,
                              .rms_norm_eps = 1e-6f,
                              .rope_theta = 10000.0f,
                              .tie_word_embeddings = 1,
                              .qkv_bias = 0,
                              .bos_token_id = 1,
                              .eos_token_id = 2,
                              .initializer_range = 0.2f};
  struct pcase cases[11];
  int n = 0;

  cases[n] = (struct pcase){.name = "llama-tied-gqa",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 4,
                            .lens = {9, 5, 13, 7},
                            .plen = {4, 1, 6, 7}, /* the last one is all prompt */
                            .bf16 = 1};
  n++;

  cases[n] = (struct pcase){.name = "llama-untied-mha-temp",
                            .cfg = base,
                            .inv_temp = 1.0f / 0.7f,
                            .n_seq = 3,
                            .lens = {11, 6, 16},
                            .plen = {3, 2, 9}};
  cases[n].cfg.vocab_size = 64;
  cases[n].cfg.hidden_size = 32;
  cases[n].cfg.intermediate_size = 64;
  cases[n].cfg.num_heads = cases[n].cfg.num_kv_heads = 4;
  cases[n].cfg.tie_word_embeddings = 0;
  cases[n].cfg.rms_norm_eps = 1e-5f;
  n++;

  cases[n] = (struct pcase){.name = "qwen2-bias-untied-gqa",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 3,
                            .lens = {12, 8, 10},
                            .plen = {5, 3, 1},
                            .bf16 = 1};
  cases[n].cfg.arch = ARCH_QWEN2;
  cases[n].cfg.qkv_bias = 1;
  cases[n].cfg.num_layers = 3;
  cases[n].cfg.num_heads = 4;
  cases[n].cfg.num_kv_heads = 2;
  cases[n].cfg.head_dim = 12;
  cases[n].cfg.intermediate_size = 96;
  cases[n].cfg.vocab_size = 80;
  cases[n].cfg.tie_word_embeddings = 0;
  cases[n].cfg.rope_theta = 1000000.0f;
  n++;

  cases[n] = (struct pcase){.name = "qwen2-bias-tied-mqa",
                            .cfg = base,
                            .inv_temp = 1.0f / 1.3f,
                            .n_seq = 4,
                            .lens = {6, 10, 4, 14},
                            .plen = {2, 4, 3, 5}};
  cases[n].cfg.arch = ARCH_QWEN2;
  cases[n].cfg.qkv_bias = 1;
  cases[n].cfg.vocab_size = 50;
  cases[n].cfg.hidden_size = 40;
  cases[n].cfg.num_heads = 5;
  cases[n].cfg.num_kv_heads = 1;
  cases[n].cfg.head_dim = 8;
  n++;

  cases[n] = (struct pcase){.name = "llama-headdim-untied-gqa",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 3,
                            .lens = {15, 9, 12},
                            .plen = {6, 2, 4}};
  cases[n].cfg.hidden_size = 32;
  cases[n].cfg.num_heads = 4;
  cases[n].cfg.num_kv_heads = 2;
  cases[n].cfg.head_dim = 16; /* CQ = 64 != C = 32 */
  cases[n].cfg.tie_word_embeddings = 0;
  cases[n].cfg.rope_theta = 500000.0f;
  cases[n].cfg.rms_norm_eps = 1e-5f;
  n++;

  cases[n] = (struct pcase){.name = "qwen3-tied-gqa",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 3,
                            .lens = {14, 9, 11},
                            .plen = {5, 3, 2},
                            .bf16 = 1};
  cases[n].cfg.arch = ARCH_QWEN3;
  cases[n].cfg.qk_norm = 1;
  cases[n].cfg.hidden_size = 32;
  cases[n].cfg.num_heads = 4;
  cases[n].cfg.num_kv_heads = 2;
  cases[n].cfg.head_dim = 16; /* explicit, CQ = 64 != C, as Qwen3-0.6B's 16 x 128 != 1024 */
  cases[n].cfg.rope_theta = 1000000.0f;
  n++;

  /* Qwen3 with attention_bias (q/k/v and o_proj biases), yarn RoPE (positions past the original
   * context of 16), and a padded vocabulary whose padding rows have huge logits */
  cases[n] = (struct pcase){.name = "qwen3-bias-yarn-padded",
                            .cfg = base,
                            .inv_temp = 1.0f / 0.9f,
                            .n_seq = 3,
                            .lens = {34, 12, 22},
                            .plen = {10, 4, 13},
                            .pad_scale = 3.0f};
  cases[n].cfg.arch = ARCH_QWEN3;
  cases[n].cfg.qk_norm = 1;
  cases[n].cfg.qkv_bias = 1;
  cases[n].cfg.o_bias = 1;
  cases[n].cfg.tie_word_embeddings = 0;
  cases[n].cfg.vocab_size = 80;
  cases[n].cfg.vocab_used = 70;
  cases[n].cfg.hidden_size = 32;
  cases[n].cfg.num_heads = 4;
  cases[n].cfg.num_kv_heads = 1;
  cases[n].cfg.head_dim = 16;
  cases[n].cfg.rope_theta = 10000.0f;
  cases[n].cfg.rope = (struct rope_scaling){
      .type = ROPE_YARN, .factor = 4.0, .original_max_position_embeddings = 16};
  n++;

  /* Llama 3.1/3.2's RoPE: original context 64, high-frequency dimensions kept, medium ones
   * smoothed, low ones interpolated; a response that runs past position 64; attention biases */
  cases[n] = (struct pcase){.name = "llama3-rope-attnbias",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 3,
                            .lens = {96, 20, 40},
                            .plen = {70, 5, 12}};
  cases[n].cfg.max_position_embeddings = 160;
  cases[n].cfg.hidden_size = 32;
  cases[n].cfg.num_heads = 2;
  cases[n].cfg.num_kv_heads = 1;
  cases[n].cfg.head_dim = 16;
  cases[n].cfg.qkv_bias = 1;
  cases[n].cfg.o_bias = 1;
  cases[n].cfg.rope_theta = 10000.0f;
  cases[n].cfg.rope = (struct rope_scaling){.type = ROPE_LLAMA3,
                                            .factor = 8.0,
                                            .low_freq_factor = 1.0,
                                            .high_freq_factor = 4.0,
                                            .original_max_position_embeddings = 64};
  n++;

  cases[n] = (struct pcase){.name = "llama-linear-rope",
                            .cfg = base,
                            .inv_temp = 1.0f,
                            .n_seq = 2,
                            .lens = {40, 17},
                            .plen = {8, 6}};
  cases[n].cfg.max_position_embeddings = 128;
  cases[n].cfg.num_heads = cases[n].cfg.num_kv_heads = 4;
  cases[n].cfg.head_dim = 12;
  cases[n].cfg.rope = (struct rope_scaling){.type = ROPE_LINEAR, .factor = 2.5};
  n++;

  /* LoRA on every linear layer of a Qwen3 with attention biases, rsLoRA scaling */
  cases[n] = (struct pcase){
      .name = "qwen3-lora-all-linear",
      .cfg = cases[5].cfg,
      .inv_temp = 1.0f,
      .n_seq = 3,
      .lens = {14, 9, 11},
      .plen = {5, 3, 2},
      .lora = {.r = 4, .alpha = 8, .targets = (1u << LT_COUNT) - 1, .use_rslora = 1}};
  cases[n].cfg.qkv_bias = cases[n].cfg.o_bias = 1;
  n++;
  /* PEFT's default targets (q_proj, v_proj) on a Llama with a temperature */
  cases[n] = (struct pcase){.name = "llama-lora-qv",
                            .cfg = base,
                            .inv_temp = 1.0f / 0.7f,
                            .n_seq = 2,
                            .lens = {12, 9},
                            .plen = {4, 3},
                            .lora = {.r = 8, .alpha = 16, .targets = 1u << LT_Q | 1u << LT_V}};
  n++;

  json_t *root = json_object(), *arr = json_array();
  json_object_set_new(root, "cases", arr);
  json_object_set_new(root, "configs", dump_configs(argv[1]));
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) rc = run_case(argv[1], &cases[i], 1000 + (uint64_t)i, arr);
  if (!rc) {
    char path[512];
    snprintf(path, sizeof path, "%s/parity.json", argv[1]);
    if (json_dump_file(root, path, JSON_COMPACT) != 0) {
      fprintf(stderr, "parity_dump: cannot write %s\n", path);
      rc = -1;
    }
  }
  json_decref(root);
  return rc ? 1 : 0;
}
