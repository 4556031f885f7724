/* Model folders (core/engine/lm.h):
 * - a BF16 folder and an F32 folder of the same random model give the same log-probs to BF16
 *   precision, and the BF16 weights written back as F32 give bit-identical log-probs;
 * - tokenizer_config.json and generation_config.json travel: eos_token_id lists become stop ids,
 *   lm_save keeps both files; lm_open_meta agrees with lm_open without reading weights;
 * - lm_open_frozen: a BF16 folder comes in BF16 with lm_open + model_freeze_bf16's bits and
 *   log-probs, peaking at its BF16 size (within 10%, not 3x); any other folder as lm_open;
 * - lm_encode_prompt on a folder with a Llama-3-style tokenizer (tests/data: a TemplateProcessing
 *   post-processor that puts <|begin_of_text|> first): a prompt text gets the BOS once, a rendered
 *   chat none added, an empty prompt the BOS, a too long one DAPO_ERANGE; the presets add nothing;
 *   lm_sample draws sample i from rng_seed(seed, i) whatever the number of samples. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "memory.h"
#include "checkpoint.h"
#include "lm.h"
#include "train.h"

static char tmpdir[] = "/tmp/dapo-lm-XXXXXX";

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

/* Log-probs of a fixed batch of two sequences under lm (n_out values). */
static float *logprobs(struct lm *lm, int *n_out) {
  static const int toks[] = {3, 7, 9, 12, 4, 8, 15, 20, 5, 6, 11, 3, 14};
  static const int off[] = {0, 6, 13}, plen[] = {2, 3};
  struct fwd_batch b = {.n_seq = 2, .tokens = toks, .seq_off = off, .prompt_len = plen};
  int nr = fwd_batch_resp_tokens(&b);
  struct dapo_err e = {0};
  struct train_state *s = train_state_new(lm->model, 13, 13, 7, &e);
  float *lp = calloc((size_t)nr, sizeof *lp);
  CHECK_MSG(s && !train_forward(s, lm->model, &b, 1.0f, lp, NULL, &e), "%s", e.msg);
  /* the log-probs alone (old and reference passes): the same bits, and no backward after them */
  float *lp2 = calloc((size_t)nr, sizeof *lp2), *dl = calloc((size_t)nr, sizeof *dl);
  CHECK_MSG(s && !train_logprobs(s, lm->model, &b, 0.7f, lp2, &e), "%s", e.msg);
  CHECK_MSG(s && !train_forward(s, lm->model, &b, 0.7f, dl, NULL, &e), "%s", e.msg);
  CHECK(!memcmp(lp2, dl, sizeof(float) * (size_t)nr));
  CHECK_MSG(s && !train_logprobs(s, lm->model, &b, 1.0f, lp2, &e), "%s", e.msg);
  CHECK(!memcmp(lp2, lp, sizeof(float) * (size_t)nr));
  CHECK(s && train_backward(s, lm->model, dl, &e) == DAPO_EINVAL);
  free(lp2), free(dl);
  train_state_free(s);
  *n_out = nr;
  return lp;
}

static void test_bf16_folder(void) {
  char f32[256], bf16[256], back[256];
  snprintf(f32, sizeof f32, "%s/q-f32", tmpdir);
  snprintf(bf16, sizeof bf16, "%s/q-bf16", tmpdir);
  snprintf(back, sizeof back, "%s/q-back", tmpdir);
  struct lm a, b, c;
  struct dapo_err e = {0};
  CHECK_MSG(!lm_open("tiny-qwen2", 11, &a, &e), "%s", e.msg);
  CHECK_MSG(!lm_save(&a, f32, 0, &e) && !lm_save(&a, bf16, 1, &e), "%s", e.msg);
  lm_close(&a);
  CHECK_MSG(!lm_open(f32, 0, &a, &e) && !lm_open(bf16, 0, &b, &e), "%s", e.msg);
  CHECK_MSG(!lm_save(&b, back, 0, &e), "%s", e.msg);
  CHECK_MSG(!lm_open(back, 0, &c, &e), "%s", e.msg);
  int n;
  float *la = logprobs(&a, &n), *lb = logprobs(&b, &n), *lc = logprobs(&c, &n);
  double maxd = 0;
  for (int i = 0; i < n; i++) {
    double d = fabs((double)la[i] - lb[i]);
    if (d > maxd) maxd = d;
    CHECK(lb[i] == lc[i]); /* BF16 -> F32 is exact: the same weights, the same log-probs */
  }
  /* BF16 keeps 8 bits of mantissa: relative weight error <= 2^-9; the log-probs of this tiny
   * model move by a few 1e-3 at most, and by something (the rounding is real) */
  printf("bf16 vs f32 folder: max |dlogp| %.3g over %d tokens\n", maxd, n);
  CHECK(maxd > 0 && maxd < 2e-2);
  free(la), free(lb), free(lc);
  lm_close(&a), lm_close(&b), lm_close(&c);
}

static void test_side_files(void) {
  char dir[256], saved[256], p[300];
  snprintf(dir, sizeof dir, "%s/side", tmpdir);
  snprintf(saved, sizeof saved, "%s/side-saved", tmpdir);
  struct lm a, m;
  struct dapo_err e = {0};
  CHECK(!lm_open("tiny", 3, &a, &e));
  CHECK(!lm_save(&a, dir, 0, &e));
  lm_close(&a);
  snprintf(p, sizeof p, "%s/generation_config.json", dir);
  write_text(p, "{\"bos_token_id\": 1, \"eos_token_id\": [2, 5, 2], \"do_sample\": true}");
  snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
  write_text(p,
             "{\"chat_template\": \"x\", \"model_max_length\": 1000000000000000019884624838656}");
  CHECK_MSG(!lm_open(dir, 0, &a, &e), "%s", e.msg);
  CHECK(a.n_stop == 2 && a.stop_ids[0] == 2 && a.stop_ids[1] == 5);
  CHECK(a.tok_config && json_is_string(json_object_get(a.tok_config, "chat_template")));
  CHECK_MSG(!lm_open_meta(dir, &m, &e), "%s", e.msg);
  CHECK(!m.model && !memcmp(&m.cfg, &a.cfg, sizeof m.cfg) && m.n_stop == 2);
  CHECK(tok_vocab_size(m.tok) == tok_vocab_size(a.tok));
  lm_close(&m);
  CHECK(!lm_save(&a, saved, 0, &e));
  lm_close(&a);
  json_t *tc = NULL;
  CHECK(!lm_read_json(saved, "tokenizer_config.json", &tc, &e) && tc);
  CHECK(json_is_string(json_object_get(tc, "chat_template")));
  json_decref(tc);
  CHECK(!lm_read_json(saved, "generation_config.json", &tc, &e) && tc);
  CHECK(json_array_size(json_object_get(tc, "eos_token_id")) == 3);
  json_decref(tc);
  /* a broken generation_config.json is named */
  snprintf(p, sizeof p, "%s/generation_config.json", dir);
  write_text(p, "{\"eos_token_id\": [2, \"x\"]}");
  CHECK(lm_open(dir, 0, &a, &e) != 0 && strstr(e.msg, "generation_config.json: eos_token_id"));
  write_text(p, "{\"eos_token_id\": ");
  CHECK(lm_open(dir, 0, &a, &e) != 0 && strstr(e.msg, "generation_config.json: line 1"));
  CHECK(lm_open_meta("no-such-preset", &m, &e) != 0 && strstr(e.msg, "neither a model folder"));
}

/* ---- one prompt encoder ---- */

/* The tiny preset saved to dir with tests/data/llama3_style_tokenizer.json (99 ids: printable
 * ASCII byte-level, "th", <|begin_of_text|> 97, <|end_of_text|> 98) and config.json's BOS/EOS
 * set to bos/eos (-1: none). */
static void llama3_style_folder(const char *dir, int bos, int eos, int with_post) {
  struct lm a;
  struct dapo_err e = {0};
  char p[300], src[600];
  CHECK_MSG(!lm_open("tiny", 7, &a, &e) && !lm_save(&a, dir, 0, &e), "%s", e.msg);
  lm_close(&a);
  data_path(src, sizeof src, "llama3_style_tokenizer.json");
  json_t *tj = json_load_file(src, 0, NULL);
  CHECK_MSG(tj != NULL, "cannot read %s", src);
  if (!with_post) json_object_set_new(tj, "post_processor", json_null());
  snprintf(p, sizeof p, "%s/tokenizer.json", dir);
  CHECK(json_dump_file(tj, p, 0) == 0);
  json_decref(tj);
  snprintf(p, sizeof p, "%s/config.json", dir);
  json_t *cj = json_load_file(p, 0, NULL);
  CHECK(cj != NULL);
  json_object_set_new(cj, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
  json_object_set_new(cj, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
  CHECK(json_dump_file(cj, p, 0) == 0);
  json_decref(cj);
}

/* lm_encode_prompt of text; *ids owned (NULL on failure); returns the code. */
static int encode(const struct lm *lm, const char *text, enum lm_prompt_kind kind, int max_new,
                  int **ids, int *n, struct dapo_err *e) {
  return lm_encode_prompt(lm, text, strlen(text), kind, max_new, ids, n, e);
}

static void test_encode_prompt(void) {
  char dir[256], nobos[256];
  snprintf(dir, sizeof dir, "%s/llama3-style", tmpdir);
  snprintf(nobos, sizeof nobos, "%s/no-bos", tmpdir);
  llama3_style_folder(dir, 97, 98, 1);
  llama3_style_folder(nobos, -1, 98, 0);
  struct lm lm, nb, tiny;
  struct dapo_err e = {0};
  CHECK_MSG(!lm_open(dir, 0, &lm, &e), "%s", e.msg);
  CHECK_MSG(!lm_open(nobos, 0, &nb, &e), "%s", e.msg);
  CHECK_MSG(!lm_open("tiny", 0, &tiny, &e), "%s", e.msg);
  CHECK(tok_bos_id(lm.tok) == 97 && lm.cfg.bos_token_id == 97);
  int *ids = NULL, n = 0;
  /* "the cat": t h -> "th", e, "Ġ" c a t: the post-processor's BOS first, as tokenizer(prompt) */
  int text_ids[] = {97, 96, 'e' - 0x21, 94, 'c' - 0x21, 'a' - 0x21, 't' - 0x21};
  CHECK_MSG(!encode(&lm, "the cat", LM_PROMPT_TEXT, 8, &ids, &n, &e), "%s", e.msg);
  CHECK(n == 7 && ids && !memcmp(ids, text_ids, sizeof text_ids));
  free(ids);
  /* a rendered chat holds its own BOS: nothing added, as apply_chat_template(tokenize=True) */
  CHECK_MSG(!encode(&lm, "<|begin_of_text|>the cat", LM_PROMPT_CHAT, 8, &ids, &n, &e), "%s", e.msg);
  CHECK(n == 7 && ids && !memcmp(ids, text_ids, sizeof text_ids));
  free(ids);
  CHECK(!encode(&lm, "the cat", LM_PROMPT_CHAT, 8, &ids, &n, &e));
  CHECK(n == 6 && ids && ids[0] == 96);
  free(ids);
  /* empty: the post-processor's BOS (text) or the model's BOS (chat): the same one token */
  CHECK(!encode(&lm, "", LM_PROMPT_TEXT, 8, &ids, &n, &e) && n == 1 && ids[0] == 97);
  free(ids);
  CHECK(!encode(&lm, "", LM_PROMPT_CHAT, 8, &ids, &n, &e) && n == 1 && ids[0] == 97);
  free(ids);
  /* the context: 7 + 505 = 512 fits, 7 + 506 does not */
  int ctx = lm.cfg.max_position_embeddings;
  CHECK(!encode(&lm, "the cat", LM_PROMPT_TEXT, ctx - 7, &ids, &n, &e) && n == 7);
  free(ids);
  CHECK(encode(&lm, "the cat", LM_PROMPT_TEXT, ctx - 6, &ids, &n, &e) == DAPO_ERANGE);
  CHECK(!ids && n == 0 && strstr(e.msg, "the prompt has 7 tokens") &&
        strstr(e.msg, "context of 512"));
  CHECK(encode(&lm, "\xff", LM_PROMPT_TEXT, 8, &ids, &n, &e) == DAPO_EINVAL && !ids);
  /* a model without BOS (no post-processor, config.json's bos_token_id null) */
  CHECK(!encode(&nb, "the cat", LM_PROMPT_TEXT, 8, &ids, &n, &e) && n == 6 && ids[0] == 96);
  free(ids);
  CHECK(encode(&nb, "", LM_PROMPT_TEXT, 8, &ids, &n, &e) == DAPO_EINVAL && !ids);
  CHECK(strstr(e.msg, "empty") && strstr(e.msg, "no BOS token"));
  /* the presets' character tokenizer adds nothing: one id per character; empty -> <s> */
  CHECK(!encode(&tiny, "1+1=", LM_PROMPT_TEXT, 8, &ids, &n, &e) && n == 4);
  free(ids);
  CHECK(!encode(&tiny, "", LM_PROMPT_TEXT, 8, &ids, &n, &e) && n == 1 &&
        ids[0] == tiny.cfg.bos_token_id && tok_bos_id(tiny.tok) == ids[0]);
  free(ids);

  /* lm_sample: 3 samples, and sample 0 alone with the same seed draws the same tokens */
  CHECK(!encode(&lm, "the cat", LM_PROMPT_TEXT, 8, &ids, &n, &e));
  struct sampler_opts o = {.temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 8};
  struct lm_samples three = {0}, one = {0};
  CHECK_MSG(!lm_sample(&lm, ids, n, 3, &o, 42, &three, &e), "%s", e.msg);
  CHECK_MSG(!lm_sample(&lm, ids, n, 1, &o, 42, &one, &e), "%s", e.msg);
  CHECK(three.n == 3 && three.max_new == 8 && one.n == 1);
  CHECK(one.len[0] == three.len[0] && one.len[0] >= 1 && one.finish[0] == three.finish[0] &&
        !memcmp(one.tokens, three.tokens, sizeof(int) * (size_t)one.len[0]));
  CHECK(three.len[1] != three.len[0] ||
        memcmp(three.tokens, three.tokens + 8, sizeof(int) * (size_t)three.len[0]));
  lm_samples_free(&three);
  lm_samples_free(&one);
  lm_samples_free(&one); /* a freed (zeroed) set is fine */
  free(ids);
  lm_close(&lm), lm_close(&nb), lm_close(&tiny);
}

/* lm_open_frozen on the folders of test_bf16_folder: the BF16 folder comes in BF16 with the
 * bits and log-probs of lm_open + model_freeze_bf16, the F32 folder exactly as lm_open. */
static void test_frozen_open(void) {
  char f32[256], bf16[256];
  snprintf(f32, sizeof f32, "%s/q-f32", tmpdir);
  snprintf(bf16, sizeof bf16, "%s/q-bf16", tmpdir);
  struct lm a, b, c, d;
  struct dapo_err e = {0};
  CHECK_MSG(!lm_open(bf16, 0, &a, &e) && !lm_open_frozen(bf16, 0, &b, &e), "%s", e.msg);
  CHECK_MSG(!lm_open(f32, 0, &c, &e) && !lm_open_frozen(f32, 0, &d, &e), "%s", e.msg);
  CHECK(model_freeze_bf16(a.model, &e) == 0 && a.model->w16 && b.model->w16 && !d.model->w16);
  const struct model *ma = a.model, *mb = b.model;
  for (int i = 0; i < ma->n_tensors; i++) {
    const struct param_info *t = &ma->tensors[i];
    if (t->ndim == 2)
      CHECK(!memcmp(ma->w16 + t->offset, mb->w16 + t->offset, t->numel * sizeof *ma->w16));
    else
      CHECK(!memcmp(ma->params + t->offset, mb->params + t->offset, t->numel * sizeof(float)));
  }
  CHECK(!mb->cfg.tie_word_embeddings || mb->w.lm_head16 == mb->w.tok_emb16);
  CHECK(mb->w.layers[1].w_down == NULL && mb->w.layers[1].w_down16 &&
        mb->w.layers[1].ffn_norm == mb->params + (ma->w.layers[1].ffn_norm - ma->params));
  int n;
  float *la = logprobs(&a, &n), *lb = logprobs(&b, &n), *lc = logprobs(&c, &n),
        *ld = logprobs(&d, &n);
  CHECK(!memcmp(la, lb, sizeof(float) * (size_t)n) && !memcmp(lc, ld, sizeof(float) * (size_t)n));
  lm_close(&b), lm_close(&d);
  /* a config that says bfloat16 over float32 tensors: the float32 layout after all, the model
   * lm_open gives */
  char mixed[300], cmd[1400];
  snprintf(mixed, sizeof mixed, "%s/q-mixed", tmpdir);
  snprintf(cmd, sizeof cmd,
           "cp -r %s %s && sed -i 's/\"torch_dtype\": *\"float32\"/\"torch_dtype\": "
           "\"bfloat16\"/' %s/config.json && grep -q bfloat16 %s/config.json",
           f32, mixed, mixed, mixed);
  CHECK(system(cmd) == 0);
  CHECK_MSG(!lm_open_frozen(mixed, 0, &d, &e), "%s", e.msg);
  CHECK(d.cfg.bf16_weights && !d.model->w16);
  free(ld);
  ld = logprobs(&d, &n);
  CHECK(!memcmp(lc, ld, sizeof(float) * (size_t)n));
  free(la), free(lb), free(lc), free(ld);
  lm_close(&a), lm_close(&c), lm_close(&d);
}

/* The peak RSS of opening a BF16 folder for an adapter: the BF16 weights (2 bytes a parameter)
 * within 10%. lm_open + model_freeze_bf16 peaked at 6 bytes a parameter (float32 weights, then
 * the BF16 copy beside them): a 1.5B model's LoRA job peaked 23% above its plan (the whole
 * job's peak on such a folder: tests/rl/test_plan.c). */
static __attribute__((unused)) void test_frozen_peak(void) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/small-bf16", tmpdir);
  struct lm a;
  struct dapo_err e = {0};
  CHECK_MSG(!lm_open("small", 5, &a, &e) && !lm_save(&a, dir, 1, &e), "%s", e.msg);
  double bytes16 = 2.0 * (double)model_param_count(&a.cfg);
  lm_close(&a);
  const char *how[2] = {"lm_open_frozen", "lm_open + model_freeze_bf16"};
  double used[2];
  for (int k = 0; k < 2; k++) {
    malloc_trim(0);
    size_t before, peak, after;
    int reset = peak_restart();
    rss(&before, &peak);
    CHECK_MSG(!(k ? lm_open(dir, 0, &a, &e) : lm_open_frozen(dir, 0, &a, &e)), "%s", e.msg);
    CHECK(k || a.model->w16);
    if (k) CHECK(model_freeze_bf16(a.model, &e) == 0);
    rss(&after, &peak);
    lm_close(&a);
    if (!reset) {
      printf("frozen load peak: /proc/self/clear_refs not writable, skipped\n");
      return;
    }
    used[k] = (double)peak - (double)before;
    printf("%s: peak RSS %.1f MiB above the start, the BF16 weights %.1f MiB (%.2fx)\n", how[k],
           used[k] / 1048576.0, bytes16 / 1048576.0, used[k] / bytes16);
  }
  CHECK(fabs(used[0] - bytes16) < 0.10 * bytes16);
}

int main(void) {
  if (!mkdtemp(tmpdir)) return 1;
  test_bf16_folder();
  test_frozen_open();
  test_side_files();
  test_encode_prompt();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  printf("frozen load peak: skipped under a sanitizer (its allocator is not malloc's)\n");
#else
  test_frozen_peak();
#endif
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done("test_lm");
}
