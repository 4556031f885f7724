/* Hugging Face checkpoint folders (config.json, model.safetensors or a sharded index,
 * tokenizer.json, generation_config.json), written atomically, and flat buffers laid out like
 * the parameters (the optimizer's moments) as one safetensors file. The parameter table of
 * struct model drives both directions. Messages name the file and the tensor at fault. */
#ifndef DAPO_CHECKPOINT_H
#define DAPO_CHECKPOINT_H

#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "model.h"

/* Writes a checkpoint folder dir that transformers' from_pretrained loads as it is:
 *   config.json            model_config_to_json, torch_dtype "bfloat16" if bf16 else "float32"
 *   model.safetensors      every row of m->tensors under its transformers name (a tied lm_head
 *                          has no row and is not written, as transformers does), F32 or BF16
 *                          (round to nearest even), metadata {"format": "pt"}
 *   tokenizer.json         tokenizer_json verbatim (borrowed text), omitted when NULL
 *   generation_config.json generation_config (borrowed) or, when NULL, {bos_token_id,
 *                          eos_token_id} from m->cfg (null where the id is -1)
 * Atomic: the files are written and fsynced in a sibling folder "<dir>.tmp-<pid>-XXXXXX", which
 * is then renamed to dir (never replacing anything) and the parent folder fsynced. dir must not
 * exist (DAPO_EINVAL naming it). On any failure the temporary folder is removed and dir does not
 * exist. Reentrant (distinct dirs may be saved from several threads); m is only read. */
int ckpt_save(const char *dir, const struct model *m, const char *tokenizer_json,
              const json_t *generation_config, int bf16, struct dapo_err *e);

/* Writes extra files into the temporary folder tmp_dir before it is renamed into place (the
 * trainer's optimizer.safetensors and trainer_state.json), each fsynced by the hook itself, so
 * that a checkpoint is complete or absent. Returns 0 or a DAPO error (the save then fails). */
typedef int (*ckpt_extra_fn)(void *ctx, const char *tmp_dir, struct dapo_err *e);

/* ckpt_save plus the extra hook (may be NULL). */
int ckpt_save_with(const char *dir, const struct model *m, const char *tokenizer_json,
                   const json_t *generation_config, int bf16, ckpt_extra_fn extra, void *extra_ctx,
                   struct dapo_err *e);

/* As ckpt_save_with for a model with an adapter (m->lora): the folder holds the adapter
 * (adapter_config.json naming base's "model", adapter_model.safetensors in F32, PEFT's names)
 * and base (borrowed: {"model": spec, "seed": n}) as LORA_BASE_FILE, instead of config.json and
 * model.safetensors; the frozen base is not written. */
int ckpt_save_adapter(const char *dir, const struct model *m, const json_t *base,
                      const char *tokenizer_json, const json_t *generation_config,
                      ckpt_extra_fn extra, void *extra_ctx, struct dapo_err *e);

/* Removes what a process killed while writing left in folder dir (a job's checkpoints or
 * rollouts folder): entries whose name contains ".tmp-" (ckpt_save_with's temporary folders, with
 * everything in them, and ckpt_save_tensors' temporary files) or ends in ".tmp" (the runner's
 * rollouts file being written). Only for a folder nobody is writing into (the runner calls it
 * before it resumes). Returns how many entries were removed (0 when dir does not exist). */
int ckpt_remove_temporaries(const char *dir);
/* Removes a checkpoint folder and the files in it (a checkpoint holds files only): 0, or -1 with
 * errno set when the folder could not be removed. */
int ckpt_remove_folder(const char *dir);

/* The files a checkpoint folder may hold, in listing order: ckpt_save_with's four (an adapter
 * checkpoint's three of ckpt_save_adapter instead of config.json and model.safetensors), the
 * tokenizer_config.json a model brings (core/engine/lm.h lm_write_extra), and the trainer's
 * optimizer.safetensors (absent at step 0: AdamW has no state yet), trainer_weights.safetensors
 * (the exact float32 weights, only when model.safetensors is narrower and would lose bits) and
 * trainer_state.json. The one list that the writers, the daemon's index and its downloads go by. */
#define CKPT_N_FILES 11
extern const char *const ckpt_file_names[CKPT_N_FILES];

struct ckpt_file {
  const char *name; /* one of ckpt_file_names (borrowed static) */
  int64_t bytes;
  char sha256[65]; /* lower-case hex */
};

/* What a complete checkpoint folder holds: the files of ckpt_file_names present, in that order. */
struct ckpt_manifest {
  int n;
  struct ckpt_file files[CKPT_N_FILES];
};

/* Reads the manifest of folder dir: each file of ckpt_file_names that is there, with its size
 * and SHA-256 (read once, in 64 KiB pieces). Called by the writer right after the folder is
 * renamed into place (its pages are still cached), and by recovery for a folder whose writer died
 * before it was indexed. Returns 0, or DAPO_EIO naming the file that cannot be read. Reentrant. */
int ckpt_manifest_read(const char *dir, struct ckpt_manifest *m, struct dapo_err *e);

/* Writes j (borrowed) as indented JSON to path and fsyncs it. */
int ckpt_write_json(const char *path, const json_t *j, struct dapo_err *e);

/* Loads a checkpoint folder: config.json (model_config_from_json), a new model, and every row of
 * its table from model.safetensors, or, when that is absent, from the shards named by
 * model.safetensors.index.json's "weight_map" (shard names must be plain file names in dir).
 * F32, F16 and BF16 convert to float32. A missing tensor, a shape that disagrees with
 * config.json, an unconvertible dtype or an unexpected tensor is an error naming it; tensors
 * "*.rotary_emb.inv_freq" and, with tied embeddings, "lm_head.weight" are ignored.
 * On success *out is owned by the caller (model_free) and, if tokenizer_json is not NULL,
 * *tokenizer_json is the owned text of tokenizer.json (free()) or NULL if the folder has none.
 * On failure both are NULL. Reentrant. */
int ckpt_load(const char *dir, struct model **out, char **tokenizer_json, struct dapo_err *e);

/* ckpt_load for a base that is only read (an adapter trains on it): when config.json says
 * bfloat16 and every matrix is stored in BF16, the model comes in model_new_frozen_bf16's
 * layout, each matrix's bits read straight into it, so that the load never holds a float32 copy
 * (a 1.5B model peaked at 3x its BF16 size converting one); otherwise exactly ckpt_load. */
int ckpt_load_frozen(const char *dir, struct model **out, char **tokenizer_json,
                     struct dapo_err *e);

/* Writes nbuf flat buffers laid out like m->params (m->n_params floats each, borrowed) as one F32
 * safetensors file at path: the tensor of row r of buffer b is named prefixes[b] + r's name and
 * holds bufs[b][r.offset .. r.offset + r.numel) bit for bit. metadata (borrowed, NULL or a
 * string->string object) goes into "__metadata__". Atomic replace: written to a temporary
 * sibling, fsynced, renamed over path, parent folder fsynced. Used for optimizer.safetensors
 * with prefixes "exp_avg." and "exp_avg_sq.". Reentrant. */
int ckpt_save_tensors(const char *path, const struct model *m, int nbuf,
                      const char *const *prefixes, const float *const *bufs, const json_t *metadata,
                      struct dapo_err *e);

/* Reads such a file back into nbuf buffers laid out like m->params (owned by the caller; only the
 * rows' ranges are written). Every tensor must be F32 with the row's shape; a missing or
 * unexpected tensor is an error naming it. If metadata_out is not NULL, *metadata_out is a new
 * reference (caller owns) to a copy of "__metadata__", or NULL if the file has none. On failure
 * the buffers may be partly written and *metadata_out is NULL. Reentrant. */
int ckpt_load_tensors(const char *path, const struct model *m, int nbuf,
                      const char *const *prefixes, float *const *bufs, json_t **metadata_out,
                      struct dapo_err *e);

#endif
