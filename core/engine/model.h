/* The model: a Hugging Face Llama-family causal LM (Llama, Qwen2, Qwen3) as one C struct. Config,
 * the parameter table, and flat float32 buffers (parameters, gradients) carved into named views.
 * One table of {hf_name, kind, layer, shape, offset} drives checkpoint I/O, gradient norms,
 * AdamW and comparisons; a tied lm_head aliases tok_emb and is never stored twice.
 *
 * Dimension letters used across core/: V vocab, C hidden, L layers, NH query heads, NKV
 * key/value heads, HS head size, FF intermediate (SwiGLU) size, CQ = NH*HS, CKV = NKV*HS. */
#ifndef DAPO_MODEL_H
#define DAPO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"

enum model_arch { ARCH_LLAMA = 0, ARCH_QWEN2 = 1, ARCH_QWEN3 = 2 };

/* RoPE frequencies as transformers' rope_type names them (config.json `rope_scaling`). */
enum rope_type { ROPE_DEFAULT = 0, ROPE_LINEAR = 1, ROPE_LLAMA3 = 2, ROPE_YARN = 3 };

struct rope_scaling {
  int type;                                 /* enum rope_type; ROPE_DEFAULT: rope_scaling null */
  double factor;                            /* linear, llama3, yarn: >= 1 */
  double low_freq_factor, high_freq_factor; /* llama3 */
  int original_max_position_embeddings; /* llama3 (required), yarn (0: max_position_embeddings) */
  double attention_factor;              /* yarn: 0 derives it from factor (and mscale) */
  double beta_fast, beta_slow;          /* yarn: 0 means 32 and 1 */
  double mscale, mscale_all_dim;        /* yarn: 0 when absent */
  int no_truncate;                      /* yarn: `truncate: false` */
};

struct model_config {
  enum model_arch arch;
  int vocab_size;        /* V: rows of the embedding (may exceed the tokenizer's vocab) */
  int hidden_size;       /* C */
  int intermediate_size; /* FF */
  int num_layers;        /* L */
  int num_heads;         /* NH */
  int num_kv_heads;      /* NKV, divides NH */
  int head_dim;          /* HS, even (RoPE rotates halves) */
  int max_position_embeddings;
  float rms_norm_eps;
  float rope_theta;
  int tie_word_embeddings;  /* lm_head aliases model.embed_tokens */
  int qkv_bias;             /* q/k/v projections have biases (always for Qwen2) */
  int o_bias;               /* o_proj has a bias (Llama and Qwen3 with attention_bias) */
  int qk_norm;              /* per-head RMSNorm of q and k before RoPE (Qwen3) */
  struct rope_scaling rope; /* zero: plain RoPE */
  int bf16_weights; /* config.json's torch_dtype (or dtype) is bfloat16: what a frozen base can
                       be held in (model_freeze_bf16) */
  int vocab_used;   /* ids the tokenizer can produce: logits, softmax and sampling cover
                       [0, vocab_used) only, the embedding rows past it are padding;
                       0 means vocab_size (see model_vocab_used) */
  int bos_token_id; /* -1: none */
  int eos_token_id; /* -1: none */
  float initializer_range; /* std of the normal init of weights (HF default 0.02) */
};

/* The logits a model computes: vocab_used, or vocab_size when 0. */
static inline int model_vocab_used(const struct model_config *c) {
  return c->vocab_used > 0 ? c->vocab_used : c->vocab_size;
}

/* RoPE's inverse frequencies inv_freq[head_dim / 2] and the factor that scales cos and sin
 * (yarn's attention factor, else 1), as transformers' ROPE_INIT_FUNCTIONS compute them for
 * c->rope (computed in double, rounded to float). */
void model_rope_freqs(const struct model_config *c, float *inv_freq, float *attn_factor);

struct rope_table;
/* The cos/sin table of c's RoPE for its max_position_embeddings (kernels.h). 0 or -1 (out of
 * memory). */
int model_rope_table_init(struct rope_table *t, const struct model_config *c);

/* Checks ranges and divisibility; names the offending key in e. */
int model_config_validate(const struct model_config *c, struct dapo_err *e);

/* Parameters (floats) of a model with config c, as model_new lays them out: a tied lm_head is
 * not counted twice. Equals model->n_params. */
int64_t model_param_count(const struct model_config *c);
/* The bytes of c's weights held as a frozen BF16 model holds them (model_new_frozen_bf16: the
 * matrices in BF16, the 1-D tensors in float32), and in *tile (may be NULL) the largest tile of a
 * frozen matrix one compute thread converts to float32 at a time (matmul_bf16_tile_bytes). */
uint64_t model_frozen_bf16_bytes(const struct model_config *c, size_t *tile);

/* Parses a Hugging Face config.json object (borrowed). Keys that change the maths are honoured
 * (head_dim, rms_norm_eps, rope_theta, rope_scaling of types default/linear/llama3/yarn,
 * attention_bias, tie_word_embeddings) or refused by name when their value needs what we do not
 * implement (mlp_bias, sliding windows in use, layer_types other than full attention,
 * partial_rotary_factor != 1, attention or hidden dropout, other hidden_act than silu,
 * quantization_config, logit soft-capping, other rope types). Other keys are ignored. */
int model_config_from_json(struct model_config *c, const json_t *j, struct dapo_err *e);

/* A new config.json object (caller owns the reference) that transformers' from_pretrained
 * accepts; torch_dtype is "float32" or "bfloat16". */
json_t *model_config_to_json(const struct model_config *c, const char *torch_dtype);

enum param_kind {
  PK_TOK_EMB,
  PK_ATTN_NORM,
  PK_WQ,
  PK_BQ,
  PK_WK,
  PK_BK,
  PK_WV,
  PK_BV,
  PK_WO,
  PK_BO,
  PK_Q_NORM,
  PK_K_NORM,
  PK_FFN_NORM,
  PK_W_GATE,
  PK_W_UP,
  PK_W_DOWN,
  PK_FINAL_NORM,
  PK_LM_HEAD,
  PK_LORA_A, /* an adapter's tensors (lora.h), never in a model's table */
  PK_LORA_B,
};

/* One row of the parameter table. */
struct param_info {
  char name[96]; /* transformers' tensor name, e.g. "model.layers.3.self_attn.q_proj.weight" */
  enum param_kind kind;
  int layer;        /* -1 for tensors outside the blocks */
  int ndim;         /* 1 or 2 */
  int64_t shape[2]; /* [out, in] for linear weights, as PyTorch stores them */
  size_t offset;    /* in floats, into any flat buffer laid out like the parameters */
  size_t numel;
};

struct layer_views {
  float *attn_norm, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *q_norm, *k_norm, *ffn_norm, *w_gate,
      *w_up, *w_down;
  /* a frozen model's matrices in BF16 (model_freeze_bf16); the float32 views above are then NULL */
  const uint16_t *wq16, *wk16, *wv16, *wo16, *w_gate16, *w_up16, *w_down16;
};

/* Named views into one flat buffer (parameters, gradients, Adam moments all share the layout).
 * bq/bk/bv are NULL without qkv_bias, bo without o_bias, q_norm/k_norm without qk_norm;
 * lm_head == tok_emb when tied. */
struct views {
  float *tok_emb;
  struct layer_views *layers; /* L entries, owned by the struct model */
  float *final_norm;
  float *lm_head;
  const uint16_t *tok_emb16, *lm_head16; /* BF16 when frozen (tok_emb and lm_head then NULL) */
};

struct lora;

struct model {
  struct model_config cfg;
  int n_tensors;              /* rows of the table; a tied lm_head has no row of its own */
  struct param_info *tensors; /* owned */
  size_t n_params;            /* floats in each flat buffer */
  float *params;              /* owned, 64-byte aligned, n_params floats */
  float *grads;               /* owned, NULL until model_alloc_grads */
  struct views w;             /* views into params */
  struct views g;             /* views into grads (all NULL until model_alloc_grads) */
  struct lora *lora;          /* borrowed adapter (lora.h) or NULL: with one, forward passes
                                 add it and train_backward trains only it (the base is frozen,
                                 grads may stay NULL) */
  uint16_t *w16;              /* owned: every matrix (2-D tensor) in BF16 at its offset after
                                 model_freeze_bf16, else NULL */
  size_t params_map_bytes;    /* params is then a sparse mapping of this size holding only the
                                 1-D tensors (norms, biases): the matrices' pages are never
                                 touched */
  uint64_t version;           /* the weights' version (model_weights_changed): unique across all
                                 models of the process, so a copy made from (model, version)
                                 is never taken for another model's or older weights */
};

/* Every writer of a model's weights in place (AdamW, loading or restoring weights, random
 * initialisation, adapter merges, freezing) calls this afterwards: it gives the model a new
 * version, which copies derived from the weights (the decoding panels of gen_state, sampler.c)
 * compare to know they are stale. Thread-safe. */
void model_weights_changed(struct model *m);

/* Holds a frozen model's matrices in BF16 (2 bytes per parameter, converted exactly to float32
 * inside the kernels) when every one of them is exactly a BF16 value, as the weights of a BF16
 * checkpoint are: the model computes the same function. Returns 0 when frozen, 1 when some
 * weight would be rounded (nothing changes), DAPO_EINVAL when the model has gradients, or
 * DAPO_ENOMEM. Afterwards the matrices' float32 views are NULL, the BF16 views set, and nothing
 * may train or save the base (an adapter trains on it). */
int model_freeze_bf16(struct model *m, struct dapo_err *e);

/* Builds the table and allocates zeroed parameters. Returns NULL and fills e on a bad config
 * or out of memory. The caller owns the result (model_free). */
struct model *model_new(const struct model_config *c, struct dapo_err *e);
/* model_new for a base that is only read (an adapter trains on it): the layout that
 * model_freeze_bf16 leaves, with nothing in it yet. The caller writes every matrix's BF16 bits
 * into w16 and every 1-D tensor into params, at their offsets; no float32 copy of a matrix is
 * ever made, so loading a BF16 checkpoint peaks at its own size. */
struct model *model_new_frozen_bf16(const struct model_config *c, struct dapo_err *e);
void model_free(struct model *m);

/* Allocates the zeroed gradient buffer (idempotent). */
int model_alloc_grads(struct model *m, struct dapo_err *e);
/* Zeroes the gradients, the adapter's too when the model has one. */
void model_zero_grads(struct model *m);

/* Fills v with views into base (n_params floats laid out like m->params). v->layers must point
 * to cfg.num_layers entries (owned by the caller). */
void model_bind_views(const struct model *m, float *base, struct views *v);

/* Hugging Face initialisation: weights ~ N(0, initializer_range) from the given seed (drawn
 * tensor by tensor in table order), norms 1, biases 0. Deterministic across machines. */
void model_init_random(struct model *m, uint64_t seed);

/* Looks up a tensor by its transformers name; NULL when absent. Borrowed, lives with m. */
const struct param_info *model_find_tensor(const struct model *m, const char *name);

/* 64-byte aligned zeroed allocation of n floats (NULL on failure or overflow); free with free(). */
float *dapo_alloc_floats(size_t n);

#endif
