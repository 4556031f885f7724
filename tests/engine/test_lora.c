/* LoRA adapters (core/engine/lora.c): the job's adapter object and its field errors, PEFT's
 * adapter_config.json keys and tensor names, the save/load round trip, PEFT's initialisation
 * (the adapted model starts equal to the base), and the merged export (W + s B A gives the
 * adapter path's log-probs). Gradients are checked in test_grad.c (finite differences) and
 * test_torch_parity.py (an independent PyTorch LoRA). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kernels.h"
#include "lm.h"
#include "lora.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "sampler.h"
#include "train.h"

static struct model_config cfg(void) {
  return (struct model_config){.arch = ARCH_QWEN3,
                               .vocab_size = 41,
                               .hidden_size = 24,
                               .intermediate_size = 40,
                               .num_layers = 2,
                               .num_heads = 4,
                               .num_kv_heads = 2,
                               .head_dim = 8,
                               .max_position_embeddings = 64,
                               .rms_norm_eps = 1e-6f,
                               .rope_theta = 10000.0f,
                               .qk_norm = 1,
                               .tie_word_embeddings = 1,
                               .bos_token_id = 1,
                               .eos_token_id = 2,
                               .initializer_range = 0.3f};
}

/* Parses text as the adapter object; returns the number of problems, the first field in field. */
static int parse(const char *text, struct lora_config *c, char *field, size_t cap) {
  json_t *j = json_loads(text, 0, NULL), *errs = json_array();
  int n = lora_config_parse(c, j, errs);
  if (field) {
    const char *f = json_string_value(json_object_get(json_array_get(errs, 0), "field"));
    snprintf(field, cap, "%s", f ? f : "");
  }
  json_decref(j);
  json_decref(errs);
  return n;
}

static void test_config(void) {
  struct lora_config c;
  char f[96];
  CHECK(parse("{\"type\": \"lora\"}", &c, f, sizeof f) == 0);
  CHECK(c.r == 8 && c.alpha == 8 && c.targets == (1u << LT_Q | 1u << LT_V) && !c.use_rslora);
  CHECK(parse("{\"type\": \"lora\", \"r\": 16, \"alpha\": 32, \"target_modules\": [\"q_proj\", "
              "\"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"], "
              "\"dropout\": 0}",
              &c, f, sizeof f) == 0);
  CHECK(c.r == 16 && c.alpha == 32 && c.targets == (1u << LT_COUNT) - 1);
  CHECK_NEAR(lora_scale(&c), 2.0, 1e-7);
  CHECK(parse("{\"type\": \"lora\", \"r\": 16, \"lora_alpha\": 16, \"use_rslora\": true, "
              "\"target_modules\": \"all-linear\"}",
              &c, f, sizeof f) == 0);
  CHECK(c.use_rslora && c.targets == (1u << LT_COUNT) - 1);
  CHECK_NEAR(lora_scale(&c), 4.0, 1e-7);
  /* refusals name the field */
  static const struct {
    const char *text, *field;
  } BAD[] = {
      {"{\"type\": \"lora\", \"r\": 0}", "adapter.r"},
      {"{\"type\": \"lora\", \"r\": 2.5}", "adapter.r"},
      {"{\"type\": \"lora\", \"target_modules\": [\"q_proj\", \"qkv_proj\"]}",
       "adapter.target_modules[1]"},
      {"{\"type\": \"lora\", \"target_modules\": []}", "adapter.target_modules"},
      {"{\"type\": \"lora\", \"dropout\": 0.05}", "adapter.dropout"},
      {"{\"type\": \"lora\", \"lora_dropout\": 0.1}", "adapter.lora_dropout"},
      {"{\"type\": \"lora\", \"alpha\": -1}", "adapter.alpha"},
      {"{\"type\": \"lora\", \"alpha\": 8, \"lora_alpha\": 8}", "adapter.lora_alpha"},
      {"{\"type\": \"lora\", \"bias\": \"all\"}", "adapter.bias"},
      {"{\"type\": \"lora\", \"rank\": 8}", "adapter.rank"},
      {"{\"type\": \"dora\"}", "adapter.type"},
      {"[1]", "adapter"},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    int n = parse(BAD[i].text, &c, f, sizeof f);
    CHECK_MSG(n >= 1 && !strcmp(f, BAD[i].field), "%s: %d problems, first field '%s' (want %s)",
              BAD[i].text, n, f, BAD[i].field);
  }
  /* r larger than a targeted layer's smaller dimension */
  struct model_config mc = cfg();
  CHECK(parse("{\"type\": \"lora\", \"r\": 25, \"target_modules\": [\"q_proj\"]}", &c, NULL, 0) ==
        0);
  json_t *errs = json_array();
  CHECK(lora_config_check(&c, &mc, errs) == 1);
  CHECK(!strcmp(json_string_value(json_object_get(json_array_get(errs, 0), "field")), "adapter.r"));
  json_decref(errs);
}

/* Log-probs of a fixed batch under m (with its adapter, if any). */
static void logprobs(struct model *m, float *logp, int *R) {
  struct dapo_err e = {0};
  int tokens[14], off[3] = {0, 8, 14}, plen[2] = {2, 3};
  struct rng r;
  rng_seed(&r, 4, 4);
  for (int i = 0; i < 14; i++) tokens[i] = (int)rng_below(&r, 41);
  struct fwd_batch b = {.n_seq = 2, .tokens = tokens, .seq_off = off, .prompt_len = plen};
  struct train_state *s = train_state_new(m, 16, 16, 16, &e);
  CHECK_MSG(s && train_forward(s, m, &b, 1.0f, logp, NULL, &e) == 0, "%s", e.msg);
  *R = fwd_batch_resp_tokens(&b);
  train_state_free(s);
}

static void test_init_merge_save(void) {
  struct dapo_err e = {0};
  struct model_config mc = cfg();
  struct model *m = model_new(&mc, &e);
  model_init_random(m, 1);
  float base[16], lp[16], merged[16];
  int R;
  logprobs(m, base, &R);

  struct lora_config c = {.r = 4, .alpha = 12, .targets = (1u << LT_COUNT) - 1};
  struct lora *l = lora_new(&c, &mc, &e);
  CHECK(l != NULL && l->n_tensors == 2 * LT_COUNT * mc.num_layers);
  /* r (IN + OUT) per layer: q 4(24+32), k and v 4(24+16), o 4(32+24), gate and up 4(24+40), down
   * 4(40+24): 1,536, twice */
  CHECK(lora_param_count(&c, &mc) == 3072);
  lora_init(l, 7);
  /* PEFT: A ~ U(-1/sqrt(IN), 1/sqrt(IN)), B = 0 */
  const struct param_info *a =
      lora_find_tensor(l, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
  const struct param_info *b =
      lora_find_tensor(l, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  CHECK(a && b && a->shape[0] == 4 && a->shape[1] == 40 && b->shape[0] == 24 && b->shape[1] == 4);
  float amax = 0;
  for (size_t k = 0; a && k < a->numel; k++) amax = fmaxf(amax, fabsf(l->params[a->offset + k]));
  CHECK(amax > 0.1f && amax <= 1.0f / sqrtf(40.0f));
  m->lora = l;
  logprobs(m, lp, &R);
  int same = 1;
  for (int i = 0; i < R; i++) same &= lp[i] == base[i];
  CHECK_MSG(same, "a fresh adapter (B = 0) changes the model's log-probs");

  /* B random: the adapter changes the model, and merging gives the same log-probs */
  struct rng r;
  rng_seed(&r, 3, 3);
  for (int i = 0; i < l->n_tensors; i++)
    if (l->tensors[i].kind == PK_LORA_B)
      for (size_t k = 0; k < l->tensors[i].numel; k++)
        l->params[l->tensors[i].offset + k] = 0.3f * (float)rng_normal(&r);
  logprobs(m, lp, &R);
  float moved = 0;
  for (int i = 0; i < R; i++) moved = fmaxf(moved, fabsf(lp[i] - base[i]));
  CHECK(moved > 0.05f);
  m->lora = NULL;
  lora_merge(l, m);
  logprobs(m, merged, &R);
  float d = 0;
  for (int i = 0; i < R; i++) d = fmaxf(d, fabsf(lp[i] - merged[i]));
  CHECK_MSG(d < 2e-5f, "merged vs adapter path: max |dlogp| %g", (double)d);
  fprintf(stderr, "merged vs adapter: max |dlogp| %.2g (the adapter moved them by %.2g)\n",
          (double)d, (double)moved);

  /* save / load: PEFT files, bit-exact */
  char dir[] = "/tmp/dapo-lora-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_MSG(lora_save(l, dir, "Qwen/Qwen3-0.6B", &e) == 0, "%s", e.msg);
  char p[256];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  json_t *ac = json_load_file(p, 0, NULL);
  CHECK(ac && !strcmp(json_string_value(json_object_get(ac, "peft_type")), "LORA") &&
        !strcmp(json_string_value(json_object_get(ac, "task_type")), "CAUSAL_LM") &&
        json_integer_value(json_object_get(ac, "r")) == 4 &&
        json_number_value(json_object_get(ac, "lora_alpha")) == 12 &&
        json_array_size(json_object_get(ac, "target_modules")) == LT_COUNT &&
        !strcmp(json_string_value(json_object_get(ac, "base_model_name_or_path")),
                "Qwen/Qwen3-0.6B") &&
        json_is_false(json_object_get(ac, "use_dora")));
  json_decref(ac);
  struct lora *l2 = NULL;
  CHECK_MSG(lora_load(dir, &mc, &l2, &e) == 0, "%s", e.msg);
  CHECK(l2 && l2->n_params == l->n_params &&
        !memcmp(l2->params, l->params, l->n_params * sizeof(float)));
  /* a model of another shape: refused naming the tensor */
  struct model_config other = mc;
  other.intermediate_size = 48;
  struct lora *l3 = NULL;
  CHECK(lora_load(dir, &other, &l3, &e) == DAPO_EFORMAT && strstr(e.msg, "mlp.gate_proj"));
  lora_free(l3);
  snprintf(p, sizeof p, "rm -rf '%s'", dir);
  CHECK(system(p) == 0);
  lora_free(l2);
  lora_free(l);
  model_free(m);
}

/* An adapter folder (PEFT files + base_model.json naming a preset and its seed) opens as the
 * preset with the adapter attached; lm_save exports the merged model, which opens as a plain
 * folder with the adapter path's log-probs. */
static void test_adapter_folder(void) {
  struct dapo_err e = {0};
  struct lm base, ad, merged;
  CHECK_MSG(lm_open("tiny", 5, &base, &e) == 0, "%s", e.msg);
  struct lora_config c = {.r = 2, .alpha = 4, .targets = 1u << LT_Q | 1u << LT_V | 1u << LT_DOWN};
  struct lora *l = lora_new(&c, &base.cfg, &e);
  struct rng r;
  rng_seed(&r, 8, 8);
  for (size_t k = 0; k < l->n_params; k++) l->params[k] = 0.2f * (float)rng_normal(&r);
  char dir[] = "/tmp/dapo-lora-lm-XXXXXX", p[256];
  CHECK(mkdtemp(dir) != NULL);
  CHECK_MSG(lora_save(l, dir, "tiny", &e) == 0, "%s", e.msg);
  snprintf(p, sizeof p, "%s/" LORA_BASE_FILE, dir);
  json_t *bj = json_pack("{s:s, s:i}", "model", "tiny", "seed", 5);
  CHECK(json_dump_file(bj, p, 0) == 0);
  json_decref(bj);
  CHECK_MSG(lm_open(dir, 0, &ad, &e) == 0, "%s", e.msg);
  CHECK(ad.lora && ad.model->lora == ad.lora && !strcmp(ad.base, "tiny") && ad.base_seed == 5);
  CHECK(!memcmp(ad.model->params, base.model->params, base.model->n_params * sizeof(float)));
  CHECK(!memcmp(ad.lora->params, l->params, l->n_params * sizeof(float)));

  /* the merged export */
  char out[300];
  snprintf(out, sizeof out, "%s/merged", dir);
  CHECK_MSG(lm_save(&ad, out, 0, &e) == 0, "%s", e.msg);
  CHECK(ad.model->lora == ad.lora); /* lm_save leaves the adapter in place */
  CHECK_MSG(lm_open(out, 0, &merged, &e) == 0, "%s", e.msg);
  CHECK(merged.lora == NULL && merged.model->lora == NULL);
  int ids[12], R = 0;
  for (int i = 0; i < 12; i++) ids[i] = 3 + (int)rng_below(&r, 60);
  int off[2] = {0, 12}, plen[1] = {4};
  struct fwd_batch b = {.n_seq = 1, .tokens = ids, .seq_off = off, .prompt_len = plen};
  float la[12], lm_[12], lb[12];
  struct lm *ms[3] = {&ad, &merged, &base};
  float *outs[3] = {la, lm_, lb};
  for (int k = 0; k < 3; k++) {
    struct train_state *s = train_state_new(ms[k]->model, 12, 12, 12, &e);
    CHECK_MSG(s && train_forward(s, ms[k]->model, &b, 1.0f, outs[k], NULL, &e) == 0, "%s", e.msg);
    train_state_free(s);
  }
  R = fwd_batch_resp_tokens(&b);
  float d = 0, moved = 0;
  for (int i = 0; i < R; i++) {
    d = fmaxf(d, fabsf(la[i] - lm_[i]));
    moved = fmaxf(moved, fabsf(la[i] - lb[i]));
  }
  CHECK_MSG(d < 2e-5f && moved > 1e-3f, "merged folder vs adapter folder %g (moved %g)", (double)d,
            (double)moved);
  /* a folder whose base is missing: refused naming it */
  snprintf(p, sizeof p, "%s/" LORA_BASE_FILE, dir);
  bj = json_pack("{s:s}", "model", "/nonexistent/base");
  CHECK(json_dump_file(bj, p, 0) == 0);
  json_decref(bj);
  struct lm bad;
  CHECK(lm_open(dir, 0, &bad, &e) != 0 && strstr(e.msg, "/nonexistent/base"));
  lm_close(&merged);
  lm_close(&ad);
  lm_close(&base);
  lora_free(l);
  snprintf(p, sizeof p, "rm -rf '%s'", dir);
  CHECK(system(p) == 0);
}

/* A frozen base held in BF16 (model_freeze_bf16): with weights that BF16 holds exactly, the
 * adapter's log-probs and gradients equal the float32 base's to float rounding, decoding gives
 * the same tokens, and the matrices' float32 pages are gone. */
/* 64 rows decoded from varied prompts (panels off: the matrices read in place, so rows in the
 * lanes on AVX-512, a BF16 base's from 49 rows), serially (p NULL) or on p with split */
enum { G64 = 64, G64_NEW = 6 };
static void gen64(struct model *m, struct pool *p, enum gen_split split, int tok[G64 * G64_NEW],
                  float lp[G64 * G64_NEW]) {
  struct dapo_err e;
  int prompt[G64][4], plen[G64], len[G64], fin[G64];
  const int *pp[G64];
  struct rng r[G64];
  for (int i = 0; i < G64; i++) {
    plen[i] = 1 + i % 4, pp[i] = prompt[i];
    for (int t = 0; t < 4; t++) prompt[i][t] = (7 * i + 3 * t) % 41;
    rng_seed(&r[i], 21, (uint64_t)i);
  }
  struct gen_state *g = gen_state_new(m, G64, 4 + G64_NEW, &e);
  CHECK_MSG(g != NULL, "%s", e.msg);
  if (!g) return;
  gen_state_set_pack(g, 0);
  if (p) {
    CHECK(gen_state_set_pool(g, p, &e) == 0);
    gen_state_set_split(g, split);
    gen_state_set_chunk(g, 1);
  }
  struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = G64_NEW};
  struct gen_out go = {.tokens = tok, .logp = lp, .len = len, .finish = fin};
  CHECK_MSG(gen_run(g, m, G64, pp, plen, r, &so, &go, NULL, &e) == 0, "%s", e.msg);
  gen_state_free(g);
}

static void test_bf16_base(void) {
  struct dapo_err e = {0};
  struct model_config mc = cfg();
  mc.tie_word_embeddings = 0;
  struct model *a = model_new(&mc, &e), *b = model_new(&mc, &e);
  model_init_random(a, 2);
  for (int i = 0; i < a->n_tensors; i++) /* exactly BF16 values, as a BF16 checkpoint's */
    if (a->tensors[i].ndim == 2)
      for (size_t k = 0; k < a->tensors[i].numel; k++) {
        float *x = a->params + a->tensors[i].offset + k;
        uint16_t h;
        f32_to_bf16(&h, x, 1);
        bf16_to_f32(x, &h, 1);
      }
  memcpy(b->params, a->params, a->n_params * sizeof(float));
  struct model *c = model_new(&mc, &e); /* not exact: refused, unchanged */
  model_init_random(c, 2);
  CHECK(model_freeze_bf16(c, &e) == 1 && c->w16 == NULL && c->w.layers[0].wq != NULL);
  model_free(c);
  CHECK_MSG(model_freeze_bf16(b, &e) == 0, "%s", e.msg);
  CHECK(b->w16 && b->w.layers[1].w_down == NULL && b->w.layers[1].w_down16 && !b->w.lm_head &&
        b->w.lm_head16 && b->w.final_norm && b->w.layers[0].attn_norm);

  struct lora_config lc = {.r = 3, .alpha = 6, .targets = (1u << LT_COUNT) - 1};
  struct lora *la = lora_new(&lc, &mc, &e), *lb = lora_new(&lc, &mc, &e);
  struct rng r;
  rng_seed(&r, 6, 6);
  for (size_t k = 0; k < la->n_params; k++) la->params[k] = 0.2f * (float)rng_normal(&r);
  memcpy(lb->params, la->params, la->n_params * sizeof(float));
  CHECK(lora_alloc_grads(la, &e) == 0 && lora_alloc_grads(lb, &e) == 0);
  a->lora = la;
  b->lora = lb;
  int tokens[14], off[3] = {0, 8, 14}, plen[2] = {2, 3};
  for (int i = 0; i < 14; i++) tokens[i] = (int)rng_below(&r, 41);
  struct fwd_batch fb = {.n_seq = 2, .tokens = tokens, .seq_off = off, .prompt_len = plen};
  float lpa[16], lpb[16], w[16];
  int R = fwd_batch_resp_tokens(&fb);
  for (int i = 0; i < R; i++) w[i] = (float)rng_normal(&r);
  struct model *ms[2] = {a, b};
  float *lps[2] = {lpa, lpb};
  for (int k = 0; k < 2; k++) {
    struct train_state *s = train_state_new(ms[k], 16, 16, 16, &e);
    CHECK_MSG(s && train_forward(s, ms[k], &fb, 1.0f, lps[k], NULL, &e) == 0 &&
                  train_backward(s, ms[k], w, &e) == 0,
              "%s", e.msg);
    train_state_free(s);
  }
  float dl = 0, dg = 0, gmax = 0;
  for (int i = 0; i < R; i++) dl = fmaxf(dl, fabsf(lpa[i] - lpb[i]));
  for (size_t k = 0; k < la->n_params; k++) {
    dg = fmaxf(dg, fabsf(la->grads[k] - lb->grads[k]));
    gmax = fmaxf(gmax, fabsf(la->grads[k]));
  }
  CHECK_MSG(dl < 1e-5f && dg < 1e-5f * gmax, "BF16 base vs float32: |dlogp| %g, |dgrad| %g of %g",
            (double)dl, (double)dg, (double)gmax);
  /* decoding reads the BF16 matrices with linear_few's own arithmetic: the same tokens */
  int prompt[3] = {4, 9, 16}, plen1 = 3;
  const int *pp = prompt;
  int toks[2][12], len[2], fin[2];
  float glp[2][12];
  for (int k = 0; k < 2; k++) {
    struct gen_state *g = gen_state_new(ms[k], 1, 16, &e);
    struct rng gr;
    rng_seed(&gr, 11, 0);
    struct sampler_opts so = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 12};
    struct gen_out go = {.tokens = toks[k], .logp = glp[k], .len = &len[k], .finish = &fin[k]};
    CHECK_MSG(g && gen_run(g, ms[k], 1, &pp, &plen1, &gr, &so, &go, NULL, &e) == 0, "%s", e.msg);
    gen_state_free(g);
  }
  CHECK(len[0] == len[1] && !memcmp(toks[0], toks[1], sizeof(int) * (size_t)len[0]));
  /* 64 rows: serially the same bits as float32; on 2 threads, every split the bits of the split
   * by rows (by columns the down projection's rows are transposed into one shared copy by the
   * threads that compute its input) and the serial run's tokens */
  static int t64[5][G64 * G64_NEW];
  static float l64[5][G64 * G64_NEW];
  gen64(a, NULL, GEN_SPLIT_AUTO, t64[0], l64[0]);
  gen64(b, NULL, GEN_SPLIT_AUTO, t64[1], l64[1]);
  CHECK_MSG(!memcmp(t64[0], t64[1], sizeof t64[0]) && !memcmp(l64[0], l64[1], sizeof l64[0]),
            "BF16 base, 64 rows: other bits than float32's");
  struct pool *p = pool_new(2);
  static const enum gen_split sp[3] = {GEN_SPLIT_ROWS, GEN_SPLIT_COLUMNS, GEN_SPLIT_DYNAMIC};
  for (int k = 0; k < 3; k++) {
    gen64(b, p, sp[k], t64[2 + k], l64[2 + k]);
    float d = 0;
    for (int i = 0; i < G64 * G64_NEW; i++) d = fmaxf(d, fabsf(l64[2 + k][i] - l64[1][i]));
    CHECK_MSG(!memcmp(t64[2 + k], t64[1], sizeof t64[1]) && d < 1e-4f,
              "BF16 base, 64 rows, split %d: tokens or log-probs (%g) differ from serial", sp[k],
              (double)d);
    CHECK_MSG(!memcmp(l64[2 + k], l64[2], sizeof l64[2]),
              "BF16 base, 64 rows, split %d: log-probs not the bits of the split by rows", sp[k]);
  }
  pool_free(p);
  fprintf(stderr,
          "BF16 base: |dlogp| %.2g, |dgrad| %.2g (max %.2g), same %d sampled tokens; 64 rows "
          "the same bits, and on 2 threads by rows, columns and chunks\n",
          (double)dl, (double)dg, (double)gmax, len[0]);
  model_free(a);
  model_free(b);
  lora_free(la);
  lora_free(lb);
}

int main(void) {
  test_config();
  test_init_merge_save();
  test_adapter_folder();
  test_bf16_base();
  return check_done("test_lora");
}
