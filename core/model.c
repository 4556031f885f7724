/* Model config parsing, the parameter table, flat buffers and views, random init (model.h). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

float *dapo_alloc_floats(size_t n) {
  if (n == 0) n = 1;
  if (n > SIZE_MAX / sizeof(float) - 64) return NULL;
  size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
  float *p = aligned_alloc(64, bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

int model_config_validate(const struct model_config *c, struct dapo_err *e) {
#define NEED(cond, key, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) return dapo_errf(e, DAPO_EINVAL, "config." key ": " __VA_ARGS__);                 \
  } while (0)
  NEED(c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN2, "architectures", "unsupported architecture");
  NEED(c->vocab_size >= 2 && c->vocab_size <= (1 << 24), "vocab_size", "%d not in [2, 16777216]",
       c->vocab_size);
  NEED(c->hidden_size >= 2 && c->hidden_size <= 65536, "hidden_size", "%d not in [2, 65536]",
       c->hidden_size);
  NEED(c->intermediate_size >= 1 && c->intermediate_size <= 1 << 20, "intermediate_size",
       "%d not in [1, 1048576]", c->intermediate_size);
  NEED(c->num_layers >= 1 && c->num_layers <= 1024, "num_hidden_layers", "%d not in [1, 1024]",
       c->num_layers);
  NEED(c->num_heads >= 1 && c->num_heads <= 1024, "num_attention_heads", "%d not in [1, 1024]",
       c->num_heads);
  NEED(c->num_kv_heads >= 1 && c->num_heads % c->num_kv_heads == 0, "num_key_value_heads",
       "%d must be >= 1 and divide num_attention_heads (%d)", c->num_kv_heads, c->num_heads);
  NEED(c->head_dim >= 2 && c->head_dim % 2 == 0 && c->head_dim <= 1024, "head_dim",
       "%d must be even and in [2, 1024]", c->head_dim);
  NEED(c->max_position_embeddings >= 1 && c->max_position_embeddings <= 1 << 22,
       "max_position_embeddings", "%d not in [1, 4194304]", c->max_position_embeddings);
  NEED(c->rms_norm_eps > 0 && c->rms_norm_eps < 1, "rms_norm_eps", "%g not in (0, 1)",
       (double)c->rms_norm_eps);
  NEED(c->rope_theta > 1 && isfinite(c->rope_theta), "rope_theta", "%g must be > 1",
       (double)c->rope_theta);
  NEED(c->bos_token_id >= -1 && c->bos_token_id < c->vocab_size, "bos_token_id",
       "%d outside the vocabulary (%d)", c->bos_token_id, c->vocab_size);
  NEED(c->eos_token_id >= -1 && c->eos_token_id < c->vocab_size, "eos_token_id",
       "%d outside the vocabulary (%d)", c->eos_token_id, c->vocab_size);
  NEED(c->initializer_range >= 0 && c->initializer_range < 10, "initializer_range",
       "%g not in [0, 10)", (double)c->initializer_range);
#undef NEED
  return 0;
}

/* Reads an optional integer key; a present key of the wrong type is an error. */
static int get_int(const json_t *j, const char *key, int *out, int dflt, struct dapo_err *e) {
  json_t *v = json_object_get(j, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0); /* eos lists */
  if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > INT32_MAX)
    return dapo_errf(e, DAPO_EFORMAT, "config.%s: expected an integer", key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_float(const json_t *j, const char *key, float *out, float dflt, struct dapo_err *e) {
  json_t *v = json_object_get(j, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (!json_is_number(v)) return dapo_errf(e, DAPO_EFORMAT, "config.%s: expected a number", key);
  *out = (float)json_number_value(v);
  return 0;
}

static int get_bool(const json_t *j, const char *key, int *out, int dflt, struct dapo_err *e) {
  json_t *v = json_object_get(j, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v)) return dapo_errf(e, DAPO_EFORMAT, "config.%s: expected true/false", key);
  *out = json_is_true(v);
  return 0;
}

int model_config_from_json(struct model_config *c, const json_t *j, struct dapo_err *e) {
  memset(c, 0, sizeof *c);
  if (!json_is_object(j)) return dapo_errf(e, DAPO_EFORMAT, "config.json: not a JSON object");
  const char *mt = json_string_value(json_object_get(j, "model_type"));
  json_t *archs = json_object_get(j, "architectures");
  const char *a0 = json_string_value(json_array_get(archs, 0));
  if ((mt && !strcmp(mt, "llama")) || (a0 && !strcmp(a0, "LlamaForCausalLM")))
    c->arch = ARCH_LLAMA;
  else if ((mt && !strcmp(mt, "qwen2")) || (a0 && !strcmp(a0, "Qwen2ForCausalLM")))
    c->arch = ARCH_QWEN2;
  else
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.model_type: '%s' (architectures[0] '%s') is not supported; "
                     "supported: llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM)",
                     mt ? mt : "(none)", a0 ? a0 : "(none)");
  int rc = 0;
  if ((rc = get_int(j, "vocab_size", &c->vocab_size, 0, e)) ||
      (rc = get_int(j, "hidden_size", &c->hidden_size, 0, e)) ||
      (rc = get_int(j, "intermediate_size", &c->intermediate_size, 0, e)) ||
      (rc = get_int(j, "num_hidden_layers", &c->num_layers, 0, e)) ||
      (rc = get_int(j, "num_attention_heads", &c->num_heads, 0, e)) ||
      (rc = get_int(j, "num_key_value_heads", &c->num_kv_heads, c->num_heads, e)) ||
      (rc = get_int(j, "max_position_embeddings", &c->max_position_embeddings, 2048, e)) ||
      (rc = get_float(j, "rms_norm_eps", &c->rms_norm_eps, 1e-6f, e)) ||
      (rc = get_float(j, "rope_theta", &c->rope_theta, 10000.0f, e)) ||
      (rc = get_float(j, "initializer_range", &c->initializer_range, 0.02f, e)) ||
      (rc = get_bool(j, "tie_word_embeddings", &c->tie_word_embeddings, 0, e)) ||
      (rc = get_int(j, "bos_token_id", &c->bos_token_id, -1, e)) ||
      (rc = get_int(j, "eos_token_id", &c->eos_token_id, -1, e)))
    return rc;
  if (c->num_heads <= 0) return dapo_errf(e, DAPO_EFORMAT, "config.num_attention_heads: missing");
  if ((rc = get_int(j, "head_dim", &c->head_dim, c->hidden_size / c->num_heads, e))) return rc;
  c->qkv_bias = c->arch == ARCH_QWEN2;

  const char *act = json_string_value(json_object_get(j, "hidden_act"));
  if (act && strcmp(act, "silu") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "config.hidden_act: '%s' is not supported (only silu)",
                     act);
  json_t *rs = json_object_get(j, "rope_scaling");
  if (rs && !json_is_null(rs))
    return dapo_errf(e, DAPO_EUNSUPPORTED, "config.rope_scaling: RoPE scaling is not supported");
  int flag = 0;
  if (c->arch == ARCH_LLAMA) {
    if ((rc = get_bool(j, "attention_bias", &flag, 0, e))) return rc;
    if (flag)
      return dapo_errf(e, DAPO_EUNSUPPORTED,
                       "config.attention_bias: Llama attention biases are not supported");
  }
  if ((rc = get_bool(j, "mlp_bias", &flag, 0, e))) return rc;
  if (flag) return dapo_errf(e, DAPO_EUNSUPPORTED, "config.mlp_bias: MLP biases are not supported");
  if ((rc = get_bool(j, "use_sliding_window", &flag, 0, e))) return rc;
  if (flag)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.use_sliding_window: sliding-window attention is not supported");
  return model_config_validate(c, e);
}

int64_t model_param_count(const struct model_config *c) {
  int64_t C = c->hidden_size, V = c->vocab_size, FF = c->intermediate_size;
  int64_t Q = (int64_t)c->num_heads * c->head_dim, KV = (int64_t)c->num_kv_heads * c->head_dim;
  int64_t layer = C + C * Q + 2 * C * KV + Q * C + C + 3 * C * FF;
  if (c->qkv_bias) layer += Q + 2 * KV;
  return V * C + (int64_t)c->num_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}

json_t *model_config_to_json(const struct model_config *c, const char *torch_dtype) {
  int q = c->arch == ARCH_QWEN2;
  json_t *j = json_object();
  json_object_set_new(j, "architectures",
                      json_pack("[s]", q ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
  json_object_set_new(j, "model_type", json_string(q ? "qwen2" : "llama"));
  json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
  json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
  json_object_set_new(j, "num_hidden_layers", json_integer(c->num_layers));
  json_object_set_new(j, "num_attention_heads", json_integer(c->num_heads));
  json_object_set_new(j, "num_key_value_heads", json_integer(c->num_kv_heads));
  json_object_set_new(j, "head_dim", json_integer(c->head_dim));
  json_object_set_new(j, "hidden_act", json_string("silu"));
  json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
  json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
  json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
  json_object_set_new(j, "rope_scaling", json_null());
  json_object_set_new(j, "initializer_range", json_real(c->initializer_range));
  json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
  if (!q) {
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "pretraining_tp", json_integer(1));
  } else {
    json_object_set_new(j, "use_sliding_window", json_false());
    json_object_set_new(j, "sliding_window", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "max_window_layers", json_integer(c->num_layers));
  }
  json_object_set_new(j, "attention_dropout", json_real(0.0));
  json_object_set_new(j, "use_cache", json_true());
  json_object_set_new(j, "bos_token_id",
                      c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
  json_object_set_new(j, "eos_token_id",
                      c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
  json_object_set_new(j, "torch_dtype", json_string(torch_dtype));
  json_object_set_new(j, "transformers_version", json_string("4.40.0"));
  return j;
}

static void add_tensor(struct model *m, const char *name, enum param_kind kind, int layer,
                       int64_t d0, int64_t d1, size_t *off) {
  struct param_info *p = &m->tensors[m->n_tensors++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->kind = kind;
  p->layer = layer;
  p->ndim = d1 ? 2 : 1;
  p->shape[0] = d0;
  p->shape[1] = d1;
  p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
  p->offset = *off;
  /* keep every tensor 64-byte aligned inside the flat buffer */
  *off += (p->numel + 15) & ~(size_t)15;
}

struct model *model_new(const struct model_config *c, struct dapo_err *e) {
  if (model_config_validate(c, e)) return NULL;
  struct model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->cfg = *c;
  int L = c->num_layers;
  m->tensors = calloc((size_t)(12 * L + 3), sizeof *m->tensors);
  m->w.layers = calloc((size_t)L, sizeof(struct layer_views));
  m->g.layers = calloc((size_t)L, sizeof(struct layer_views));
  if (!m->tensors || !m->w.layers || !m->g.layers) goto oom;

  int64_t C = c->hidden_size, CQ = (int64_t)c->num_heads * c->head_dim,
          CKV = (int64_t)c->num_kv_heads * c->head_dim, FF = c->intermediate_size,
          V = c->vocab_size;
  size_t off = 0;
  char nm[96];
  add_tensor(m, "model.embed_tokens.weight", PK_TOK_EMB, -1, V, C, &off);
  for (int l = 0; l < L; l++) {
#define T(suffix, kind, d0, d1)                                                                    \
  do {                                                                                             \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                                      \
    add_tensor(m, nm, kind, l, d0, d1, &off);                                                      \
  } while (0)
    T("input_layernorm.weight", PK_ATTN_NORM, C, 0);
    T("self_attn.q_proj.weight", PK_WQ, CQ, C);
    if (c->qkv_bias) T("self_attn.q_proj.bias", PK_BQ, CQ, 0);
    T("self_attn.k_proj.weight", PK_WK, CKV, C);
    if (c->qkv_bias) T("self_attn.k_proj.bias", PK_BK, CKV, 0);
    T("self_attn.v_proj.weight", PK_WV, CKV, C);
    if (c->qkv_bias) T("self_attn.v_proj.bias", PK_BV, CKV, 0);
    T("self_attn.o_proj.weight", PK_WO, C, CQ);
    T("post_attention_layernorm.weight", PK_FFN_NORM, C, 0);
    T("mlp.gate_proj.weight", PK_W_GATE, FF, C);
    T("mlp.up_proj.weight", PK_W_UP, FF, C);
    T("mlp.down_proj.weight", PK_W_DOWN, C, FF);
#undef T
  }
  add_tensor(m, "model.norm.weight", PK_FINAL_NORM, -1, C, 0, &off);
  if (!c->tie_word_embeddings) add_tensor(m, "lm_head.weight", PK_LM_HEAD, -1, V, C, &off);
  m->n_params = off;
  m->params = dapo_alloc_floats(off);
  if (!m->params) goto oom;
  model_bind_views(m, m->params, &m->w);
  return m;
oom:
  model_free(m);
  dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the model");
  return NULL;
}

void model_free(struct model *m) {
  if (!m) return;
  free(m->tensors);
  free(m->w.layers);
  free(m->g.layers);
  free(m->params);
  free(m->grads);
  free(m);
}

int model_alloc_grads(struct model *m, struct dapo_err *e) {
  if (m->grads) return 0;
  m->grads = dapo_alloc_floats(m->n_params);
  if (!m->grads) return dapo_errf(e, DAPO_ENOMEM, "out of memory allocating gradients");
  model_bind_views(m, m->grads, &m->g);
  return 0;
}

void model_zero_grads(struct model *m) {
  if (m->grads) memset(m->grads, 0, m->n_params * sizeof(float));
}

void model_bind_views(const struct model *m, float *base, struct views *v) {
  struct layer_views *ls = v->layers;
  memset(ls, 0, sizeof(*ls) * (size_t)m->cfg.num_layers);
  v->tok_emb = v->final_norm = v->lm_head = NULL;
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *p = &m->tensors[i];
    float *ptr = base + p->offset;
    struct layer_views *lv = p->layer >= 0 ? &ls[p->layer] : NULL;
    switch (p->kind) {
    case PK_TOK_EMB: v->tok_emb = ptr; break;
    case PK_FINAL_NORM: v->final_norm = ptr; break;
    case PK_LM_HEAD: v->lm_head = ptr; break;
    case PK_ATTN_NORM: lv->attn_norm = ptr; break;
    case PK_WQ: lv->wq = ptr; break;
    case PK_BQ: lv->bq = ptr; break;
    case PK_WK: lv->wk = ptr; break;
    case PK_BK: lv->bk = ptr; break;
    case PK_WV: lv->wv = ptr; break;
    case PK_BV: lv->bv = ptr; break;
    case PK_WO: lv->wo = ptr; break;
    case PK_FFN_NORM: lv->ffn_norm = ptr; break;
    case PK_W_GATE: lv->w_gate = ptr; break;
    case PK_W_UP: lv->w_up = ptr; break;
    case PK_W_DOWN: lv->w_down = ptr; break;
    }
  }
  if (m->cfg.tie_word_embeddings) v->lm_head = v->tok_emb;
}

void model_init_random(struct model *m, uint64_t seed) {
  struct rng r;
  rng_seed(&r, seed, 0x1417);
  float std = m->cfg.initializer_range;
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *p = &m->tensors[i];
    float *x = m->params + p->offset;
    switch (p->kind) {
    case PK_ATTN_NORM:
    case PK_FFN_NORM:
    case PK_FINAL_NORM:
      for (size_t k = 0; k < p->numel; k++) x[k] = 1.0f;
      break;
    case PK_BQ:
    case PK_BK:
    case PK_BV: memset(x, 0, p->numel * sizeof(float)); break;
    default:
      for (size_t k = 0; k < p->numel; k++) x[k] = (float)(rng_normal(&r) * std);
    }
  }
}

const struct param_info *model_find_tensor(const struct model *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}
