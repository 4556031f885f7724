/* A language model as users name it: a preset ("tiny", built from a seed, needing no files) or a
 * Hugging Face checkpoint folder, with its tokenizer. What the runner, the daemon's completions
 * and the command line open. */
#ifndef DAPO_LM_H
#define DAPO_LM_H

#include <stdint.h>

#include "error.h"
#include "model.h"
#include "tokenizer.h"

struct lm {
  struct model *model;   /* owned */
  struct tokenizer *tok; /* owned */
};

/* Opens spec: a preset name (initialised from seed) or, when spec names an existing folder, a
 * checkpoint folder (its tokenizer.json is required; seed unused). Checks that the tokenizer's
 * vocabulary fits the embedding rows. On failure out is left empty and e names the problem. */
int lm_open(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e);

/* Saves as a checkpoint folder (ckpt_save: atomic, dir must not exist). */
int lm_save(const struct lm *lm, const char *dir, int bf16, struct dapo_err *e);

void lm_close(struct lm *lm);

#endif
