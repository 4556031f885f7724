/* Presets: every one builds, its config validates and survives config.json, its tokenizer
 * matches its vocabulary, its parameter count is exact (and printed), and random init is a pure
 * function of the seed. */
#include <string.h>

#include "check.h"
#include "preset.h"

/* Parameters (not padded floats) by the formula, independent of model.c's table. */
static size_t formula_params(const struct model_config *c) {
  size_t C = (size_t)c->hidden_size, V = (size_t)c->vocab_size, FF = (size_t)c->intermediate_size;
  size_t CQ = (size_t)c->num_heads * (size_t)c->head_dim;
  size_t CKV = (size_t)c->num_kv_heads * (size_t)c->head_dim;
  size_t layer = 2 * C + C * CQ + 2 * C * CKV + CQ * C + 3 * C * FF;
  if (c->qkv_bias) layer += CQ + 2 * CKV;
  return V * C + (size_t)c->num_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}

static size_t table_params(const struct model *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_tensors; i++) n += m->tensors[i].numel;
  return n;
}

struct expect {
  const char *name;
  size_t params; /* exact */
  size_t lo, hi; /* the stated range */
};

static const struct expect expected[] = {
    {"tiny", 98816, 90000, 110000},
    {"small", 9480192, 9000000, 11000000},
    {"tiny-qwen2", 105408, 90000, 120000},
};

static void test_preset(const struct preset *p) {
  struct dapo_err e = {0};
  CHECK(preset_find(p->name) == p);
  CHECK_MSG(model_config_validate(&p->cfg, &e) == 0, "%s: %s", p->name, e.msg);
  CHECK(p->description && strlen(p->description) > 10);
  CHECK(p->cfg.bos_token_id == CHARTOK_BOS && p->cfg.eos_token_id == CHARTOK_EOS);
  CHECK(p->cfg.num_heads * p->cfg.head_dim == p->cfg.hidden_size);
  CHECK(p->cfg.qkv_bias == (p->cfg.arch == ARCH_QWEN2));

  /* The config survives config.json. */
  json_t *cj = model_config_to_json(&p->cfg, "float32");
  struct model_config back;
  CHECK_MSG(model_config_from_json(&back, cj, &e) == 0, "%s: %s", p->name, e.msg);
  CHECK_MSG(!memcmp(&back, &p->cfg, sizeof back), "%s: config.json round trip differs", p->name);
  json_decref(cj);

  struct model *m = NULL, *m2 = NULL, *m3 = NULL;
  struct chartok *tok = NULL;
  int rc = preset_build(p->name, 1234, &m, &tok, &e);
  CHECK_MSG(rc == 0 && m && tok, "%s: %s", p->name, e.msg);
  if (rc) return;
  CHECK(chartok_vocab_size(tok) == p->cfg.vocab_size);
  CHECK(!strcmp(chartok_alphabet(tok), p->alphabet));
  CHECK(!memcmp(&m->cfg, &p->cfg, sizeof m->cfg));

  size_t n = table_params(m);
  fprintf(stderr, "preset %-10s %9zu parameters (%zu floats with alignment padding): %s\n", p->name,
          n, m->n_params, p->description);
  CHECK_MSG(n == formula_params(&p->cfg), "%s: %zu vs formula %zu", p->name, n,
            formula_params(&p->cfg));
  int found = 0;
  for (size_t i = 0; i < sizeof expected / sizeof *expected; i++) {
    if (strcmp(expected[i].name, p->name)) continue;
    found = 1;
    CHECK_MSG(n == expected[i].params, "%s: %zu parameters, expected %zu", p->name, n,
              expected[i].params);
    CHECK_MSG(n >= expected[i].lo && n <= expected[i].hi, "%s: %zu outside [%zu, %zu]", p->name, n,
              expected[i].lo, expected[i].hi);
  }
  CHECK_MSG(found, "preset %s has no expected parameter count in this test", p->name);

  /* Tied presets alias the head; Qwen2 has biases (zero) and its own head. */
  if (p->cfg.tie_word_embeddings) {
    CHECK(m->w.lm_head == m->w.tok_emb && !model_find_tensor(m, "lm_head.weight"));
  } else {
    CHECK(m->w.lm_head != m->w.tok_emb && model_find_tensor(m, "lm_head.weight"));
  }
  for (int l = 0; l < p->cfg.num_layers; l++) {
    CHECK((m->w.layers[l].bq != NULL) == (p->cfg.qkv_bias != 0));
    if (m->w.layers[l].bk) CHECK(m->w.layers[l].bk[0] == 0.0f);
    CHECK(m->w.layers[l].attn_norm[0] == 1.0f);
  }
  CHECK(m->w.final_norm[p->cfg.hidden_size - 1] == 1.0f);

  /* Embedding statistics: N(0, initializer_range). */
  size_t ne = (size_t)p->cfg.vocab_size * (size_t)p->cfg.hidden_size;
  double s = 0, s2 = 0;
  for (size_t i = 0; i < ne; i++)
    s += m->w.tok_emb[i], s2 += (double)m->w.tok_emb[i] * m->w.tok_emb[i];
  double mean = s / (double)ne, sd = sqrt(s2 / (double)ne - mean * mean);
  CHECK_NEAR(mean, 0.0, 0.002);
  CHECK_NEAR(sd, p->cfg.initializer_range, 0.002);

  /* Same seed, same bytes; another seed, other bytes. */
  CHECK(preset_build(p->name, 1234, &m2, NULL, &e) == 0);
  CHECK(preset_build(p->name, 1235, &m3, NULL, &e) == 0);
  if (m2 && m3) {
    CHECK(m2->n_params == m->n_params && m3->n_params == m->n_params);
    CHECK_MSG(!memcmp(m->params, m2->params, m->n_params * sizeof(float)),
              "%s: seed 1234 twice gives different parameters", p->name);
    CHECK_MSG(memcmp(m->params, m3->params, m->n_params * sizeof(float)) != 0,
              "%s: seeds 1234 and 1235 give the same parameters", p->name);
    size_t same = 0;
    for (size_t i = 0; i < ne; i++) same += m->w.tok_emb[i] == m3->w.tok_emb[i];
    CHECK_MSG(same < ne / 100, "%s: %zu of %zu embedding weights equal across seeds", p->name, same,
              ne);
  }
  model_free(m);
  model_free(m2);
  model_free(m3);
  chartok_free(tok);
}

int main(void) {
  CHECK(preset_count() >= 3);
  CHECK(preset_get(-1) == NULL && preset_get(preset_count()) == NULL);
  for (int i = 0; i < preset_count(); i++) {
    const struct preset *p = preset_get(i);
    CHECK(p != NULL);
    for (int k = 0; k < i; k++) CHECK(strcmp(preset_get(k)->name, p->name) != 0);
    test_preset(p);
  }
  CHECK(preset_find("tiny") && preset_find("small") && preset_find("tiny-qwen2"));
  CHECK(preset_find("nope") == NULL && preset_find(NULL) == NULL);

  /* Every preset's alphabet: "\n" then printable ASCII (the alphabet tests/text/test_chartok.c
   * tests as ASCII). */
  char want[97];
  want[0] = '\n';
  for (int c = 0x20; c < 0x7F; c++) want[c - 0x1F] = (char)c;
  want[96] = '\0';
  for (int i = 0; i < preset_count(); i++)
    CHECK_MSG(!strcmp(preset_get(i)->alphabet, want), "preset %s", preset_get(i)->name);

  /* Names for error messages, and their truncation. */
  char names[64];
  CHECK(preset_names(names, sizeof names) == strlen("tiny, small, tiny-qwen2"));
  CHECK(!strcmp(names, "tiny, small, tiny-qwen2"));
  char shortbuf[8];
  CHECK(preset_names(shortbuf, sizeof shortbuf) == strlen("tiny, small, tiny-qwen2"));
  CHECK(!strcmp(shortbuf, "tiny, s"));
  CHECK(preset_names(NULL, 0) == strlen("tiny, small, tiny-qwen2"));

  struct dapo_err e = {0};
  struct model *m = (struct model *)&e; /* must be reset to NULL on failure */
  struct chartok *t = (struct chartok *)&e;
  CHECK(preset_build("huge", 1, &m, &t, &e) == DAPO_EINVAL);
  CHECK(m == NULL && t == NULL);
  CHECK_MSG(!strcmp(e.msg, "unknown preset 'huge' (known: tiny, small, tiny-qwen2)"), "%s", e.msg);
  CHECK(preset_lookup("huge", NULL) == NULL);
  CHECK(preset_build("huge", 1, NULL, NULL, NULL) == DAPO_EINVAL);
  /* The tokenizer alone. */
  CHECK(preset_build("tiny", 1, NULL, &t, &e) == 0 && t && chartok_vocab_size(t) == 99);
  chartok_free(t);
  return check_done("test_preset");
}
