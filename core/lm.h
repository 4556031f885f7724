/* A language model as users name it: a preset ("tiny", built from a seed, needing no files) or a
 * Hugging Face checkpoint folder, with its tokenizer. What the runner, the daemon's completions
 * and the command line open. */
#ifndef DAPO_LM_H
#define DAPO_LM_H

#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "model.h"
#include "tokenizer.h"

struct lm {
  struct model *model;     /* owned; NULL after lm_open_meta */
  struct model_config cfg; /* the model's config */
  struct tokenizer *tok;   /* owned */
  json_t *tok_config;      /* the folder's tokenizer_config.json (chat template, special tokens);
                              NULL for presets and folders without one (owned reference) */
  json_t *gen_config;      /* the folder's generation_config.json, or NULL (owned reference) */
  int stop_ids[8];         /* ids that end a response: eos_token_id of config.json and of
                              generation_config.json (an id or a list), without duplicates */
  int n_stop;
};

/* Opens spec: a preset name (initialised from seed) or, when spec names an existing folder, a
 * checkpoint folder (its tokenizer.json is required; seed unused). Checks that the tokenizer's
 * vocabulary fits the embedding rows. On failure out is left empty and e names the problem. */
int lm_open(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e);

/* As lm_open without the weights: the config, the tokenizer and the side files (job checks and
 * memory planning before a job starts). out->model stays NULL. */
int lm_open_meta(const char *spec, struct lm *out, struct dapo_err *e);

/* Reads dir/name as a JSON object of at most 16 MiB into *out (NULL when the file does not
 * exist; large integers become reals). A present but malformed file is an error naming it. */
int lm_read_json(const char *dir, const char *name, json_t **out, struct dapo_err *e);

/* Writes lm->tok_config as tmp_dir/tokenizer_config.json when there is one (a ckpt_save_with
 * extra hook's helper, so that a fine-tuned checkpoint keeps its chat template). */
int lm_write_extra(const struct lm *lm, const char *tmp_dir, struct dapo_err *e);

/* Saves as a checkpoint folder (ckpt_save: atomic, dir must not exist), with the folder's
 * tokenizer_config.json and generation_config.json when it had them. */
int lm_save(const struct lm *lm, const char *dir, int bf16, struct dapo_err *e);

void lm_close(struct lm *lm);

#endif
