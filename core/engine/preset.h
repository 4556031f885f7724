/* preset: the named models that need no files (the embedded default). Each is a Llama-family
 * config with a character-level tokenizer over a stated alphabet; preset_build gives a fresh,
 * randomly initialised model from a seed, so a new user can train at once. */
#ifndef DAPO_PRESET_H
#define DAPO_PRESET_H

#include <stddef.h>
#include <stdint.h>

#include "chartok.h"
#include "error.h"
#include "model.h"

struct preset {
  const char *name;        /* "tiny", "small", ... */
  const char *description; /* one line for listings and help */
  struct model_config cfg; /* cfg.vocab_size equals the tokenizer's vocabulary */
  const char *alphabet;    /* UTF-8 characters of the chartok, ids 3.. in this order */
};

/* Number of presets in the static table. */
int preset_count(void);

/* The i-th preset (borrowed, static), NULL when i is outside [0, preset_count()). */
const struct preset *preset_get(int i);

/* The preset called name (borrowed, static), or NULL when there is none. */
const struct preset *preset_find(const char *name);

/* Like preset_find, but an unknown name fills e with DAPO_EINVAL and
 * "unknown preset 'x' (known: tiny, small, tiny-qwen2)". */
const struct preset *preset_lookup(const char *name, struct dapo_err *e);

/* Writes the known names, comma separated ("tiny, small, tiny-qwen2"), into buf (cap bytes,
 * NUL-terminated, cut short if it does not fit). Returns the full length without the NUL. */
size_t preset_names(char *buf, size_t cap);

/* Builds the preset called name: model_new with its config, model_init_random(seed), and its
 * tokenizer. On success *m_out and *tok_out (either pointer may be NULL when not wanted) are
 * owned by the caller (model_free, chartok_free). Returns 0, DAPO_EINVAL for an unknown name, or
 * DAPO_ENOMEM; on failure nothing is returned and nothing leaks. Thread-safe. */
int preset_build(const char *name, uint64_t seed, struct model **m_out, struct chartok **tok_out,
                 struct dapo_err *e);

#endif
