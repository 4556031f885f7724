/* LoRA adapters (Hu et al. 2021) as Hugging Face PEFT defines them: a targeted linear layer
 * y = x W^T becomes y = x W^T + s (x A^T) B^T with A [r, IN], B [OUT, r] and s = alpha / r
 * (alpha / sqrt(r) with use_rslora). The base model is frozen; only A and B train. Tensors are
 * named as PEFT saves them in adapter_model.safetensors
 * ("base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight"), so the adapter loads with
 * PeftModel.from_pretrained, and the table has the model's struct param_info rows, so the
 * optimizer, gradient norms and checkpoint I/O treat it as they treat a model. */
#ifndef DAPO_LORA_H
#define DAPO_LORA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "model.h"

/* The linear layers an adapter may target, in PEFT's names. */
enum lora_target { LT_Q, LT_K, LT_V, LT_O, LT_GATE, LT_UP, LT_DOWN, LT_COUNT };
const char *lora_target_name(int t);
/* [OUT, IN] of target t's matrix on model config m. */
void lora_target_dims(int t, const struct model_config *m, int *out, int *in);

struct lora_config {
  int r;            /* rank, >= 1 */
  double alpha;     /* lora_alpha */
  unsigned targets; /* bit (1u << enum lora_target) per targeted layer */
  int use_rslora;   /* scale alpha / sqrt(r) instead of alpha / r */
};

/* Parses a job's `adapter` object (borrowed): {"type": "lora", "r", "alpha" (or PEFT's
 * "lora_alpha"), "target_modules" (names above or "all-linear"), "dropout" (or "lora_dropout"),
 * "use_rslora", "bias"}, PEFT's defaults for what is absent (r 8, alpha 8, q_proj and v_proj,
 * dropout 0, no rslora, bias "none"). A dropout other than 0 is refused: it would make the
 * sampler's and the trainer's log-probs differ. Each problem is appended to errors as
 * {"field": "adapter.<key>", "message"}; returns the number added. */
int lora_config_parse(struct lora_config *c, const json_t *j, json_t *errors);

/* Checks c against the model it adapts (r no larger than the smallest targeted dimension);
 * problems as lora_config_parse. */
int lora_config_check(const struct lora_config *c, const struct model_config *m, json_t *errors);

/* 1 when a and b describe the same adapter (rank, alpha, targets, scaling rule). */
int lora_config_same(const struct lora_config *a, const struct lora_config *b);

/* {"type": "lora", "r", "alpha", "target_modules", "dropout": 0, "use_rslora"}: the resolved
 * form the job object shows (new reference). */
json_t *lora_config_to_json(const struct lora_config *c);

/* PEFT's adapter_config.json for c, naming the base model (new reference). */
json_t *lora_peft_config(const struct lora_config *c, const char *base_model);

/* The scaling s of the adapter's product. */
float lora_scale(const struct lora_config *c);

/* One layer's A and B matrices per target (NULL when not targeted). */
struct lora_layer {
  float *a[LT_COUNT], *b[LT_COUNT];
};

struct lora {
  struct lora_config cfg;
  float scale;
  int num_layers;
  int n_tensors;
  struct param_info *tensors; /* owned: PEFT names, kinds PK_LORA_A / PK_LORA_B */
  size_t n_params;
  float *params;            /* owned */
  float *grads;             /* owned, NULL until lora_alloc_grads */
  struct lora_layer *w, *g; /* [num_layers] views into params and grads (owned arrays) */
};

/* Parameters (floats) of an adapter with config c on model config m. */
int64_t lora_param_count(const struct lora_config *c, const struct model_config *m);

/* A zero adapter for model config m (A and B zero); NULL + e on failure. */
struct lora *lora_new(const struct lora_config *c, const struct model_config *m,
                      struct dapo_err *e);
void lora_free(struct lora *l);
int lora_alloc_grads(struct lora *l, struct dapo_err *e);
void lora_zero_grads(struct lora *l);

/* PEFT's initialisation: A ~ U(-1/sqrt(IN), 1/sqrt(IN)) (kaiming_uniform with a = sqrt(5)),
 * B = 0, so the adapted model starts equal to the base. Drawn from seed, tensor by tensor. */
void lora_init(struct lora *l, uint64_t seed);

/* W += s B A for every targeted matrix of m: the merged model (same outputs, no adapter). */
void lora_merge(const struct lora *l, struct model *m);

/* The file of a dapod adapter folder that names its base: {"model": a preset name or model
 * folder, "seed": the seed a preset is built from} (core/engine/lm.h opens such folders). */
#define LORA_BASE_FILE "base_model.json"

/* Writes a PEFT adapter folder's two files into dir (which must exist): adapter_config.json
 * (lora_peft_config naming base_model) and adapter_model.safetensors (F32, PEFT's names), each
 * atomically. */
int lora_save(const struct lora *l, const char *dir, const char *base_model, struct dapo_err *e);

/* Reads a PEFT adapter folder written by lora_save or by PEFT (LoRA without DoRA, per-layer
 * patterns or bias; F32, F16 or BF16 tensors) for a model with config m. Every tensor must be
 * present with the shape m implies; an unexpected one is an error naming it. */
int lora_load(const char *dir, const struct model_config *m, struct lora **out, struct dapo_err *e);

/* Looks up a tensor by its PEFT name; NULL when absent. */
const struct param_info *lora_find_tensor(const struct lora *l, const char *name);

#endif
