/* The static table of named presets and their construction (preset.h). Parameter counts
 * (tests/engine/test_preset.c prints and checks them): tiny 98,816; small 9,480,192; tiny-qwen2
 * 105,408. */
#include "preset.h"

#include <stdio.h>
#include <string.h>

/* "\n" then printable ASCII 0x20..0x7E: 96 characters, vocabulary 99 with the specials. */
#define ASCII_ALPHABET                                                                             \
  "\n "                                                                                            \
  "!\"#$%&'()*+,-./"                                                                               \
  "0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
#define ASCII_VOCAB 99

static const struct preset presets[] = {
    {
        .name = "tiny",
        .description = "Llama, ~100k parameters: hidden 64, 2 layers, 4 heads (2 KV), "
                       "tied embeddings, ASCII characters",
        .cfg =
            {
                .arch = ARCH_LLAMA,
                .vocab_size = ASCII_VOCAB,
                .hidden_size = 64,
                .intermediate_size = 176,
                .num_layers = 2,
                .num_heads = 4,
                .num_kv_heads = 2,
                .head_dim = 16,
                .max_position_embeddings = 512,
                .rms_norm_eps = 1e-5f,
                .rope_theta = 10000.0f,
                .tie_word_embeddings = 1,
                .qkv_bias = 0,
                .bos_token_id = CHARTOK_BOS,
                .eos_token_id = CHARTOK_EOS,
                .initializer_range = 0.02f,
            },
        .alphabet = ASCII_ALPHABET,
    },
    {
        .name = "small",
        .description = "Llama, ~10M parameters: hidden 384, 6 layers, 6 heads (2 KV), "
                       "tied embeddings, ASCII characters",
        .cfg =
            {
                .arch = ARCH_LLAMA,
                .vocab_size = ASCII_VOCAB,
                .hidden_size = 384,
                .intermediate_size = 1024,
                .num_layers = 6,
                .num_heads = 6,
                .num_kv_heads = 2,
                .head_dim = 64,
                .max_position_embeddings = 1024,
                .rms_norm_eps = 1e-5f,
                .rope_theta = 10000.0f,
                .tie_word_embeddings = 1,
                .qkv_bias = 0,
                .bos_token_id = CHARTOK_BOS,
                .eos_token_id = CHARTOK_EOS,
                .initializer_range = 0.02f,
            },
        .alphabet = ASCII_ALPHABET,
    },
    {
        /* The Qwen2 code paths: q/k/v biases and an untied lm_head. */
        .name = "tiny-qwen2",
        .description = "Qwen2, ~100k parameters: hidden 64, 2 layers, 4 heads (2 KV), "
                       "q/k/v biases, untied lm_head, ASCII characters",
        .cfg =
            {
                .arch = ARCH_QWEN2,
                .vocab_size = ASCII_VOCAB,
                .hidden_size = 64,
                .intermediate_size = 176,
                .num_layers = 2,
                .num_heads = 4,
                .num_kv_heads = 2,
                .head_dim = 16, /* = hidden / heads, which Qwen2 configs imply */
                .max_position_embeddings = 512,
                .rms_norm_eps = 1e-5f,
                .rope_theta = 10000.0f,
                .tie_word_embeddings = 0,
                .qkv_bias = 1,
                .bos_token_id = CHARTOK_BOS,
                .eos_token_id = CHARTOK_EOS,
                .initializer_range = 0.02f,
            },
        .alphabet = ASCII_ALPHABET,
    },
};

#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

int preset_count(void) {
  return N_PRESETS;
}

const struct preset *preset_get(int i) {
  return i >= 0 && i < N_PRESETS ? &presets[i] : NULL;
}

const struct preset *preset_find(const char *name) {
  if (!name) return NULL;
  for (int i = 0; i < N_PRESETS; i++)
    if (!strcmp(presets[i].name, name)) return &presets[i];
  return NULL;
}

size_t preset_names(char *buf, size_t cap) {
  size_t w = 0;
  if (cap > 0) buf[0] = '\0';
  for (int i = 0; i < N_PRESETS; i++) {
    const char *sep = i ? ", " : "";
    int k = snprintf(cap > w ? buf + w : NULL, cap > w ? cap - w : 0, "%s%s", sep, presets[i].name);
    if (k > 0) w += (size_t)k;
  }
  return w;
}

const struct preset *preset_lookup(const char *name, struct dapo_err *e) {
  const struct preset *p = preset_find(name);
  if (!p) {
    char known[256];
    preset_names(known, sizeof known);
    dapo_errf(e, DAPO_EINVAL, "unknown preset '%.64s' (known: %s)", name ? name : "(null)", known);
  }
  return p;
}

int preset_build(const char *name, uint64_t seed, struct model **m_out, struct chartok **tok_out,
                 struct dapo_err *e) {
  struct dapo_err local;
  if (!e) e = &local; /* the codes below are read back from e */
  struct model *m = NULL;
  struct chartok *tok = NULL;
  if (m_out) *m_out = NULL;
  if (tok_out) *tok_out = NULL;
  const struct preset *p = preset_lookup(name, e);
  if (!p) return e->code;
  int rc = 0;
  tok = chartok_new(p->alphabet, e);
  if (!tok) {
    rc = e->code;
    goto out;
  }
  if (chartok_vocab_size(tok) != p->cfg.vocab_size) {
    /* A table bug, caught by the tests; survive it rather than build a mismatched pair. */
    rc = dapo_errf(e, DAPO_EINVAL, "vocab_size %d but the alphabet gives %d", p->cfg.vocab_size,
                   chartok_vocab_size(tok));
    goto out;
  }
  if (m_out) {
    m = model_new(&p->cfg, e);
    if (!m) {
      rc = e->code;
      goto out;
    }
    model_init_random(m, seed);
  }
out:
  if (rc) {
    dapo_err_prefix(e, "preset '%s': ", p->name);
    model_free(m);
    chartok_free(tok);
    return rc;
  }
  if (m_out) *m_out = m;
  if (tok_out)
    *tok_out = tok;
  else
    chartok_free(tok);
  return 0;
}
