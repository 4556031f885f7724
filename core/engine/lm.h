/* A language model as users name it: a preset ("tiny", built from a seed, needing no files) or a
 * Hugging Face checkpoint folder, with its tokenizer. What the runner, the daemon's completions
 * and the command line open, and the one way they encode a prompt (and the latter two sample). */
#ifndef DAPO_LM_H
#define DAPO_LM_H

#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "lora.h"
#include "model.h"
#include "sampler.h"
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
  struct lora *lora;  /* owned: the adapter of an adapter folder (attached to model), or
                         NULL */
  char base[4096];    /* an adapter folder's base model spec ("" otherwise) */
  uint64_t base_seed; /* and the seed a preset base is built from */
};

/* An adapter folder holds adapter_config.json and adapter_model.safetensors (PEFT's files; see
 * lora.h) instead of config.json and model.safetensors, with the tokenizer files, and names its
 * base in LORA_BASE_FILE ({"model": spec, "seed": n}; else adapter_config.json's
 * base_model_name_or_path with seed 0). Opening it opens the base and attaches the adapter. */

/* 1 when spec names an adapter folder (a folder holding adapter_config.json). */
int lm_is_adapter_folder(const char *spec);

/* Opens spec: a preset name (initialised from seed) or, when spec names an existing folder, a
 * checkpoint folder (its tokenizer.json is required; seed unused). Checks that the tokenizer's
 * vocabulary fits the embedding rows. On failure out is left empty and e names the problem. */
int lm_open(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e);

/* As lm_open for a base model that is only read, as an adapter trains on it: a BF16 folder's
 * matrices are read straight into BF16 (ckpt_load_frozen), never held in float32. The model then
 * has no float32 matrices and cannot be trained or saved as a whole; for an adapter folder, its
 * base is opened so. */
int lm_open_frozen(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e);

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
 * tokenizer_config.json and generation_config.json when it had them. With an adapter, the saved
 * model is the merged one (W + s B A for every targeted matrix; lm itself is unchanged): a full
 * model folder that transformers loads without PEFT. */
int lm_save(const struct lm *lm, const char *dir, int bf16, struct dapo_err *e);

void lm_close(struct lm *lm);

/* What a prompt's text is, which decides the special tokens its encoding gets. */
enum lm_prompt_kind {
  LM_PROMPT_TEXT, /* a plain prompt: gets what the tokenizer's post-processor adds (Llama 3's
                     <|begin_of_text|>; GPT-2, Qwen and the presets add nothing), as the
                     reference's tokenizer(prompt) encodes it */
  LM_PROMPT_CHAT  /* a rendered chat template: it already holds its special tokens (BOS
                     included), so nothing is added, as apply_chat_template(tokenize=True) */
};

/* The one prompt encoder (training, /v1/completions and `dapod generate` all sample from what it
 * gives): len bytes of UTF-8 text of the given kind -> *ids (owned, free(); *n >= 1 ids). An
 * empty encoding becomes the model's BOS token alone. Then prompt + max_new tokens must fit the
 * model's context (max_position_embeddings). Errors, the message naming no field (callers prefix
 * their own): DAPO_EINVAL for text the tokenizer refuses (invalid UTF-8) or an empty prompt on a
 * model without a BOS token; DAPO_ERANGE when the prompt's tokens plus max_new exceed the
 * context; DAPO_ENOMEM. On failure *ids is NULL and *n 0. Thread-safe (the tokenizer is). */
int lm_encode_prompt(const struct lm *lm, const char *text, size_t len, enum lm_prompt_kind kind,
                     int max_new, int **ids, int *n, struct dapo_err *e);

/* n samples continuing one prompt, as /v1/completions and `dapod generate` draw them. */
struct lm_samples {
  int n, max_new;  /* n samples; the rows of tokens and logp hold max_new slots each */
  int *tokens;     /* [n * max_new] the sampled ids (owned) */
  float *logp;     /* [n * max_new] their log-probs (struct gen_out's) (owned) */
  int *len;        /* [n] tokens of each sample, a stop token included (owned) */
  int *finish;     /* [n] enum finish_reason (owned) */
  int top_k;       /* sampler_opts.top_k as asked; with it (else NULL): */
  int *top_ids;    /* [n * max_new * top_k] each token's alternatives (struct gen_out's) (owned) */
  float *top_logp; /* [n * max_new * top_k] their log-probs (owned) */
};

/* Samples n >= 1 continuations of ids (borrowed, n_ids >= 1 tokens, as lm_encode_prompt gives
 * them, so that n_ids + o->max_new_tokens fits the context) from lm's weights on the calling
 * thread. Sample i draws from its own stream rng_seed(seed, i), so a (prompt, seed, options)
 * gives the same samples every time, and sample i is the same whatever n. o gives temperature,
 * top_p, max_new_tokens and any stop ids of the caller's; lm's own stop ids (lm->stop_ids) are
 * added to them; with o->top_k, each token's top_k alternatives are listed too. *out is filled with
 * arrays allocated here (lm_samples_free; also on failure). Returns 0, DAPO_ENOMEM, or a sampler
 * error. The run state (KV cache) is this call's own and lm is only read. */
int lm_sample(const struct lm *lm, const int *ids, int n_ids, int n, const struct sampler_opts *o,
              uint64_t seed, struct lm_samples *out, struct dapo_err *e);
/* lm_sample with gen_run's step hook (sampler.h, gen_state_set_step; NULL: none), told on the
 * calling thread after each round of sampling with the rows of out's arrays: it may end samples
 * early (a stop string); lm_sample is lm_sample_step without one. */
int lm_sample_step(const struct lm *lm, const int *ids, int n_ids, int n,
                   const struct sampler_opts *o, uint64_t seed, gen_step_fn step, void *step_ctx,
                   struct lm_samples *out, struct dapo_err *e);
/* lm_sample_step with gen_run's mask hook too (sampler.h, gen_state_set_mask; NULL: none),
 * called before each token is drawn (on the calling thread: the state has no pool): constrained
 * decoding (structured outputs). */
int lm_sample_hooks(const struct lm *lm, const int *ids, int n_ids, int n,
                    const struct sampler_opts *o, uint64_t seed, gen_step_fn step, void *step_ctx,
                    gen_mask_fn mask, void *mask_ctx, struct lm_samples *out, struct dapo_err *e);
/* Frees out's arrays (NULL or already freed arrays are fine) and zeroes it. */
void lm_samples_free(struct lm_samples *out);

#endif
