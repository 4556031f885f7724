/* Model config parsing, the parameter table, flat buffers and views, random init (model.h). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels.h"
#include "lora.h"
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
  NEED(c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3, "architectures",
       "unsupported architecture");
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
  NEED(c->vocab_used >= 0 && c->vocab_used <= c->vocab_size, "vocab_size",
       "the tokenizer's %d ids exceed the %d embedding rows", c->vocab_used, c->vocab_size);
  const struct rope_scaling *r = &c->rope;
  NEED(r->type >= ROPE_DEFAULT && r->type <= ROPE_YARN, "rope_scaling", "unknown type %d", r->type);
  if (r->type != ROPE_DEFAULT)
    NEED(r->factor >= 1 && r->factor <= 1e6, "rope_scaling.factor", "%g not in [1, 1e6]",
         r->factor);
  if (r->type == ROPE_LLAMA3) {
    NEED(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
             r->high_freq_factor < 1e6,
         "rope_scaling.high_freq_factor", "%g must exceed low_freq_factor %g > 0",
         r->high_freq_factor, r->low_freq_factor);
    NEED(r->original_max_position_embeddings >= 1, "rope_scaling.original_max_position_embeddings",
         "%d must be >= 1", r->original_max_position_embeddings);
  }
  if (r->type == ROPE_YARN) {
    NEED(r->original_max_position_embeddings >= 0 && r->original_max_position_embeddings <= 1 << 22,
         "rope_scaling.original_max_position_embeddings", "%d not in [1, 4194304]",
         r->original_max_position_embeddings);
    NEED(r->attention_factor >= 0 && r->attention_factor < 100, "rope_scaling.attention_factor",
         "%g not in (0, 100)", r->attention_factor);
    NEED(r->beta_fast >= 0 && r->beta_slow >= 0 && r->beta_fast < 1e6 && r->beta_slow < 1e6,
         "rope_scaling.beta_fast", "beta_fast %g and beta_slow %g must be >= 0", r->beta_fast,
         r->beta_slow);
    NEED(r->mscale >= 0 && r->mscale_all_dim >= 0 && r->mscale < 1e3 && r->mscale_all_dim < 1e3,
         "rope_scaling.mscale", "mscale %g and mscale_all_dim %g must be >= 0", r->mscale,
         r->mscale_all_dim);
  }
#undef NEED
  return 0;
}

/* yarn's mscale: 0.1 * m * ln(scale) + 1 for scale > 1 (transformers' get_mscale). */
static double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* The dimension index (of head_dim) whose wavelength makes n rotations in max_pos positions. */
static double yarn_correction_dim(double n, int dim, double base, int max_pos) {
  return dim * log(max_pos / (n * 2 * M_PI)) / (2 * log(base));
}

void model_rope_freqs(const struct model_config *c, float *inv_freq, float *attn_factor) {
  const struct rope_scaling *r = &c->rope;
  int dim = c->head_dim, half = dim / 2;
  double base = c->rope_theta, af = 1.0;
  double low = 0, high = 0; /* yarn's ramp */
  if (r->type == ROPE_YARN) {
    int orig = r->original_max_position_embeddings > 0 ? r->original_max_position_embeddings
                                                       : c->max_position_embeddings;
    double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
    low = yarn_correction_dim(bf, dim, base, orig);
    high = yarn_correction_dim(bs, dim, base, orig);
    if (!r->no_truncate) {
      low = floor(low);
      high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* as transformers: no division by zero */
    if (r->attention_factor > 0)
      af = r->attention_factor;
    else if (r->mscale > 0 && r->mscale_all_dim > 0)
      af = yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
    else
      af = yarn_mscale(r->factor, 1.0);
  }
  for (int i = 0; i < half; i++) {
    double f = 1.0 / pow(base, (double)(2 * i) / dim);
    switch (r->type) {
    case ROPE_LINEAR: f /= r->factor; break;
    case ROPE_LLAMA3: {
      double orig = r->original_max_position_embeddings, wavelen = 2 * M_PI / f;
      if (wavelen > orig / r->low_freq_factor) {
        f /= r->factor; /* low frequencies: interpolated */
      } else if (wavelen >= orig / r->high_freq_factor) {
        double smooth =
            (orig / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        f = (1 - smooth) * f / r->factor + smooth * f;
      } /* high frequencies: kept */
      break;
    }
    case ROPE_YARN: {
      double ramp = (i - low) / (high - low);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      /* ramp 0: extrapolated (kept), 1: interpolated (divided by factor) */
      f = f / r->factor * ramp + f * (1 - ramp);
      break;
    }
    default: break;
    }
    inv_freq[i] = (float)f;
  }
  *attn_factor = (float)af;
}

int model_rope_table_init(struct rope_table *t, const struct model_config *c) {
  int half = c->head_dim / 2;
  float *inv_freq = malloc(sizeof(float) * (size_t)(half > 0 ? half : 1)), scale = 1.0f;
  if (!inv_freq) return -1;
  model_rope_freqs(c, inv_freq, &scale);
  int rc = rope_table_init_freqs(t, c->max_position_embeddings, half, inv_freq, scale);
  free(inv_freq);
  return rc;
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

/* rope_scaling: null, or an object whose rope_type (or legacy type) is default, linear, llama3 or
 * yarn, with exactly the keys that type reads; anything else is refused by name. */
static int parse_rope_scaling(struct model_config *c, const json_t *rs, const char *name,
                              struct dapo_err *e) {
  struct rope_scaling *r = &c->rope;
  memset(r, 0, sizeof *r);
  if (!rs || json_is_null(rs)) return 0;
  if (!json_is_object(rs))
    return dapo_errf(e, DAPO_EFORMAT, "config.%s: expected an object or null", name);
  const char *t1 = json_string_value(json_object_get(rs, "rope_type"));
  const char *t2 = json_string_value(json_object_get(rs, "type"));
  if (t1 && t2 && strcmp(t1, t2) != 0)
    return dapo_errf(e, DAPO_EFORMAT, "config.%s: rope_type '%s' and type '%s' differ", name, t1,
                     t2);
  const char *t = t1 ? t1 : t2;
  if (!t) return dapo_errf(e, DAPO_EFORMAT, "config.%s.rope_type: missing", name);
  /* the keys each type reads (besides rope_type/type) */
  static const char *const LINEAR[] = {"factor", NULL};
  static const char *const LLAMA3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings", NULL};
  static const char *const YARN[] = {"factor",
                                     "original_max_position_embeddings",
                                     "attention_factor",
                                     "beta_fast",
                                     "beta_slow",
                                     "mscale",
                                     "mscale_all_dim",
                                     "truncate",
                                     NULL};
  static const char *const NONE[] = {NULL};
  const char *const *keys;
  if (!strcmp(t, "default"))
    r->type = ROPE_DEFAULT, keys = NONE;
  else if (!strcmp(t, "linear"))
    r->type = ROPE_LINEAR, keys = LINEAR;
  else if (!strcmp(t, "llama3"))
    r->type = ROPE_LLAMA3, keys = LLAMA3;
  else if (!strcmp(t, "yarn"))
    r->type = ROPE_YARN, keys = YARN;
  else
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.%s.rope_type: '%s' is not supported (default, linear, "
                     "llama3, yarn)",
                     name, t);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)rs, key, v) {
    if (!strcmp(key, "rope_type") || !strcmp(key, "type")) continue;
    if (!strcmp(key, "rope_theta") && !strcmp(name, "rope_parameters")) continue; /* read above */
    int known = 0;
    for (int i = 0; keys[i] && !known; i++) known = !strcmp(keys[i], key);
    if (!known)
      return dapo_errf(e, DAPO_EUNSUPPORTED, "config.%s.%s: not understood for rope_type '%s'",
                       name, key, t);
    if (!strcmp(key, "truncate")) {
      if (!json_is_boolean(v))
        return dapo_errf(e, DAPO_EFORMAT, "config.%s.truncate: expected true/false", name);
      r->no_truncate = json_is_false(v);
      continue;
    }
    if (json_is_null(v) && strcmp(key, "factor") != 0) continue; /* as absent */
    if (!json_is_number(v))
      return dapo_errf(e, DAPO_EFORMAT, "config.%s.%s: expected a number", name, key);
    double x = json_number_value(v);
    if (!strcmp(key, "factor"))
      r->factor = x;
    else if (!strcmp(key, "low_freq_factor"))
      r->low_freq_factor = x;
    else if (!strcmp(key, "high_freq_factor"))
      r->high_freq_factor = x;
    else if (!strcmp(key, "attention_factor")) {
      if (!(x > 0))
        return dapo_errf(e, DAPO_EINVAL, "config.%s.attention_factor: %g must be > 0", name, x);
      r->attention_factor = x;
    } else if (!strcmp(key, "beta_fast"))
      r->beta_fast = x;
    else if (!strcmp(key, "beta_slow"))
      r->beta_slow = x;
    else if (!strcmp(key, "mscale"))
      r->mscale = x;
    else if (!strcmp(key, "mscale_all_dim"))
      r->mscale_all_dim = x;
    else if (!strcmp(key, "original_max_position_embeddings")) {
      if (!json_is_integer(v) || x < 1 || x > (1 << 22))
        return dapo_errf(e, DAPO_EFORMAT,
                         "config.%s.original_max_position_embeddings: expected an "
                         "integer in [1, 4194304]",
                         name);
      r->original_max_position_embeddings = (int)x;
    }
  }
  for (int i = 0; keys[i]; i++) {
    int required = !strcmp(keys[i], "factor") || r->type == ROPE_LLAMA3;
    if (required && !json_is_number(json_object_get(rs, keys[i])))
      return dapo_errf(e, DAPO_EFORMAT, "config.%s.%s: required for rope_type '%s'", name, keys[i],
                       t);
  }
  return 0;
}

/* Keys whose presence with a value other than the harmless one changes the maths in a way we do
 * not implement: refused by name. */
static int refuse_unimplemented(const json_t *j, struct dapo_err *e) {
  int rc = 0, flag = 0;
  const char *act = json_string_value(json_object_get(j, "hidden_act"));
  if (act && strcmp(act, "silu") != 0)
    return dapo_errf(e, DAPO_EUNSUPPORTED, "config.hidden_act: '%s' is not supported (only silu)",
                     act);
  if ((rc = get_bool(j, "mlp_bias", &flag, 0, e))) return rc;
  if (flag) return dapo_errf(e, DAPO_EUNSUPPORTED, "config.mlp_bias: MLP biases are not supported");
  if ((rc = get_bool(j, "use_sliding_window", &flag, 0, e))) return rc;
  if (flag)
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.use_sliding_window: sliding-window attention is not supported");
  json_t *lt = json_object_get(j, "layer_types");
  if (lt && !json_is_null(lt)) {
    if (!json_is_array(lt))
      return dapo_errf(e, DAPO_EFORMAT, "config.layer_types: expected an array");
    for (size_t i = 0; i < json_array_size(lt); i++) {
      const char *s = json_string_value(json_array_get(lt, i));
      if (!s || strcmp(s, "full_attention") != 0)
        return dapo_errf(e, DAPO_EUNSUPPORTED,
                         "config.layer_types[%zu]: '%s' is not supported (only full_attention)", i,
                         s ? s : "(not a string)");
    }
  }
  static const char *const ZERO_OK[] = {"attention_dropout", "hidden_dropout",
                                        "attn_logit_softcapping", "final_logit_softcapping", NULL};
  for (int i = 0; ZERO_OK[i]; i++) {
    json_t *v = json_object_get(j, ZERO_OK[i]);
    if (!v || json_is_null(v)) continue;
    if (!json_is_number(v) || json_number_value(v) != 0)
      return dapo_errf(e, DAPO_EUNSUPPORTED, "config.%s: only 0 or null is supported", ZERO_OK[i]);
  }
  json_t *prf = json_object_get(j, "partial_rotary_factor");
  if (prf && !json_is_null(prf) && (!json_is_number(prf) || json_number_value(prf) != 1))
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.partial_rotary_factor: only 1 (RoPE on the whole head) is supported");
  json_t *q = json_object_get(j, "quantization_config");
  if (q && !json_is_null(q))
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.quantization_config: quantized weights are not supported");
  return 0;
}

int model_config_from_json(struct model_config *c, const json_t *j, struct dapo_err *e) {
  memset(c, 0, sizeof *c);
  if (!json_is_object(j)) return dapo_errf(e, DAPO_EFORMAT, "config.json: not a JSON object");
  const char *mt = json_string_value(json_object_get(j, "model_type"));
  json_t *archs = json_object_get(j, "architectures");
  const char *a0 = json_string_value(json_array_get(archs, 0));
  if ((mt && !strcmp(mt, "llama")) || (!mt && a0 && !strcmp(a0, "LlamaForCausalLM")))
    c->arch = ARCH_LLAMA;
  else if ((mt && !strcmp(mt, "qwen2")) || (!mt && a0 && !strcmp(a0, "Qwen2ForCausalLM")))
    c->arch = ARCH_QWEN2;
  else if ((mt && !strcmp(mt, "qwen3")) || (!mt && a0 && !strcmp(a0, "Qwen3ForCausalLM")))
    c->arch = ARCH_QWEN3;
  else
    return dapo_errf(e, DAPO_EUNSUPPORTED,
                     "config.model_type: '%s' (architectures[0] '%s') is not supported; "
                     "supported: llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM), qwen3 "
                     "(Qwen3ForCausalLM)",
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
  int attention_bias = 0;
  if ((rc = get_bool(j, "attention_bias", &attention_bias, 0, e))) return rc;
  /* Qwen2 always has q/k/v biases and never an o_proj bias (its attention_bias key, when a
   * config carries one, is not read by transformers); Llama and Qwen3 have all four with
   * attention_bias */
  c->qkv_bias = c->arch == ARCH_QWEN2 || attention_bias;
  c->o_bias = c->arch != ARCH_QWEN2 && attention_bias;
  c->qk_norm = c->arch == ARCH_QWEN3;
  if ((rc = refuse_unimplemented(j, e))) return rc;
  const char *dt = json_string_value(json_object_get(j, "torch_dtype"));
  if (!dt) dt = json_string_value(json_object_get(j, "dtype"));
  c->bf16_weights = dt && !strcmp(dt, "bfloat16");
  /* transformers 5 writes rope_parameters (rope_theta inside) where 4.x wrote rope_scaling */
  json_t *rs = json_object_get(j, "rope_scaling"), *rp = json_object_get(j, "rope_parameters");
  if (rp && !json_is_null(rp)) {
    if (rs && !json_is_null(rs))
      return dapo_errf(e, DAPO_EFORMAT,
                       "config.rope_parameters: given with rope_scaling; give one of them");
    if ((rc = get_float(rp, "rope_theta", &c->rope_theta, c->rope_theta, e))) return rc;
    rc = parse_rope_scaling(c, rp, "rope_parameters", e);
  } else {
    rc = parse_rope_scaling(c, rs, "rope_scaling", e);
  }
  if (rc) return rc;
  return model_config_validate(c, e);
}

int64_t model_param_count(const struct model_config *c) {
  int64_t C = c->hidden_size, V = c->vocab_size, FF = c->intermediate_size;
  int64_t Q = (int64_t)c->num_heads * c->head_dim, KV = (int64_t)c->num_kv_heads * c->head_dim;
  int64_t layer = C + C * Q + 2 * C * KV + Q * C + C + 3 * C * FF;
  if (c->qkv_bias) layer += Q + 2 * KV;
  if (c->o_bias) layer += C;
  if (c->qk_norm) layer += 2 * (int64_t)c->head_dim;
  return V * C + (int64_t)c->num_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}

uint64_t model_frozen_bf16_bytes(const struct model_config *c, size_t *tile) {
  int64_t C = c->hidden_size, V = c->vocab_size, FF = c->intermediate_size, L = c->num_layers,
          CQ = (int64_t)c->num_heads * c->head_dim, CKV = (int64_t)c->num_kv_heads * c->head_dim;
  /* every matrix shape {IN, OUT, how many}: q, k and v, o, gate and up, down, the embedding (and
   * an untied head) */
  const int64_t mats[][3] = {{C, CQ, L}, {C, CKV, 2 * L},
                             {CQ, C, L}, {C, FF, 2 * L},
                             {FF, C, L}, {C, V, c->tie_word_embeddings ? 1 : 2}};
  uint64_t bytes = (uint64_t)model_param_count(c) * sizeof(float);
  size_t largest = 0;
  for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
    bytes -= (uint64_t)(mats[i][0] * mats[i][1] * mats[i][2]) * 2;
    size_t b = matmul_bf16_tile_bytes((int)mats[i][0], (int)mats[i][1]);
    if (b > largest) largest = b;
  }
  if (tile) *tile = largest;
  return bytes;
}

/* config.json's rope_scaling for c->rope, as transformers reads it back (null when plain). */
static json_t *rope_to_json(const struct rope_scaling *r) {
  static const char *const NAMES[] = {"default", "linear", "llama3", "yarn"};
  if (r->type == ROPE_DEFAULT) return json_null();
  json_t *o = json_pack("{s:s, s:f}", "rope_type", NAMES[r->type], "factor", r->factor);
  if (r->type == ROPE_LLAMA3) {
    json_object_set_new(o, "low_freq_factor", json_real(r->low_freq_factor));
    json_object_set_new(o, "high_freq_factor", json_real(r->high_freq_factor));
  }
  if (r->original_max_position_embeddings > 0)
    json_object_set_new(o, "original_max_position_embeddings",
                        json_integer(r->original_max_position_embeddings));
  if (r->type == ROPE_YARN) {
#define OPT(field)                                                                                 \
  if (r->field > 0) json_object_set_new(o, #field, json_real(r->field))
    OPT(attention_factor);
    OPT(beta_fast);
    OPT(beta_slow);
    OPT(mscale);
    OPT(mscale_all_dim);
#undef OPT
    if (r->no_truncate) json_object_set_new(o, "truncate", json_false());
  }
  return o;
}

json_t *model_config_to_json(const struct model_config *c, const char *torch_dtype) {
  static const char *const ARCHS[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  static const char *const TYPES[] = {"llama", "qwen2", "qwen3"};
  json_t *j = json_object();
  json_object_set_new(j, "architectures", json_pack("[s]", ARCHS[c->arch]));
  json_object_set_new(j, "model_type", json_string(TYPES[c->arch]));
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
  json_object_set_new(j, "rope_scaling", rope_to_json(&c->rope));
  json_object_set_new(j, "initializer_range", json_real(c->initializer_range));
  json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
  if (c->arch != ARCH_QWEN2) {
    json_object_set_new(j, "attention_bias", json_boolean(c->o_bias));
    json_object_set_new(j, "mlp_bias", json_false());
  }
  if (c->arch == ARCH_LLAMA) json_object_set_new(j, "pretraining_tp", json_integer(1));
  if (c->arch != ARCH_LLAMA) {
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
  json_object_set_new(j, "transformers_version", json_string("4.51.0"));
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

void model_weights_changed(struct model *m) {
  static uint64_t next; /* 0 is never a version */
  m->version = __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
}

/* The table and the views' arrays of a model, without its parameters. */
static struct model *model_layout(const struct model_config *c, struct dapo_err *e) {
  if (model_config_validate(c, e)) return NULL;
  struct model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->cfg = *c;
  model_weights_changed(m);
  int L = c->num_layers;
  m->tensors = calloc((size_t)(15 * L + 3), sizeof *m->tensors);
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
    if (c->o_bias) T("self_attn.o_proj.bias", PK_BO, C, 0);
    if (c->qk_norm) {
      T("self_attn.q_norm.weight", PK_Q_NORM, c->head_dim, 0);
      T("self_attn.k_norm.weight", PK_K_NORM, c->head_dim, 0);
    }
    T("post_attention_layernorm.weight", PK_FFN_NORM, C, 0);
    T("mlp.gate_proj.weight", PK_W_GATE, FF, C);
    T("mlp.up_proj.weight", PK_W_UP, FF, C);
    T("mlp.down_proj.weight", PK_W_DOWN, C, FF);
#undef T
  }
  add_tensor(m, "model.norm.weight", PK_FINAL_NORM, -1, C, 0, &off);
  if (!c->tie_word_embeddings) add_tensor(m, "lm_head.weight", PK_LM_HEAD, -1, V, C, &off);
  m->n_params = off;
  return m;
oom:
  model_free(m);
  dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the model");
  return NULL;
}

/* The model's weights, which every decoding step reads whole: in 2 MiB pages where the kernel
 * lends them (transparent huge pages in "madvise" mode, Debian's default, give none without the
 * advice). With 4 KiB pages a 0.5B BF16 base's 1 GB a step crossed 250,000 page boundaries,
 * where the hardware prefetchers stop and the TLB misses: `--decode --lora 16`, AVX2, in turns,
 * 145.6 / 147.7 -> 163.7 / 162.1 tok/s (docs/ENGINE.md). Only the whole 2 MiB pages that the
 * weights fill are advised, so no page holds more than they touch (the resident size stays the
 * weights' bytes). n elements of `size` bytes, uninitialised; free() releases it. */
static void *alloc_weights(size_t n, size_t size) {
  size_t huge = (size_t)1 << 21;
  if (size && n > (SIZE_MAX - huge) / size) return NULL;
  size_t bytes = n * size;
  void *p = aligned_alloc(huge, bytes ? (bytes + huge - 1) / huge * huge : huge);
#ifdef MADV_HUGEPAGE
  if (p && bytes >= huge) (void)madvise(p, bytes / huge * huge, MADV_HUGEPAGE); /* refused: 4 KiB */
#endif
  return p;
}

struct model *model_new(const struct model_config *c, struct dapo_err *e) {
  struct model *m = model_layout(c, e);
  if (!m) return NULL;
  if ((m->params = alloc_weights(m->n_params, sizeof(float))))
    memset(m->params, 0, m->n_params * sizeof(float));
  if (!m->params) {
    model_free(m);
    dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the model");
    return NULL;
  }
  model_bind_views(m, m->params, &m->w);
  return m;
}

/* The frozen layout: params a sparse zero mapping (only the 1-D tensors' pages are ever
 * written), w16 every matrix in BF16 at its offset (allocated, not touched), the matrices'
 * views on w16. 0 or DAPO_ENOMEM (m unchanged). */
static int hold_bf16(struct model *m, struct dapo_err *e) {
  size_t bytes = (m->n_params * sizeof(float) + 4095) & ~(size_t)4095;
  uint16_t *w16 = alloc_weights(m->n_params, sizeof(uint16_t));
  float *sparse = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!w16 || sparse == MAP_FAILED) {
    free(w16);
    if (sparse != MAP_FAILED) munmap(sparse, bytes);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory holding the model in BF16");
  }
  if (m->params) { /* the 1-D tensors move over; the matrices are converted by the caller */
    for (int i = 0; i < m->n_tensors; i++) {
      const struct param_info *p = &m->tensors[i];
      if (p->ndim == 2)
        f32_to_bf16(w16 + p->offset, m->params + p->offset, p->numel);
      else
        memcpy(sparse + p->offset, m->params + p->offset, p->numel * sizeof(float));
    }
    if (m->params_map_bytes)
      munmap(m->params, m->params_map_bytes);
    else
      free(m->params);
  }
  m->params = sparse;
  m->params_map_bytes = bytes;
  m->w16 = w16;
  model_bind_views(m, m->params, &m->w);
  struct views *v = &m->w;
  v->tok_emb16 = w16 + (v->tok_emb - m->params);
  v->lm_head16 = w16 + (v->lm_head - m->params);
  v->tok_emb = v->lm_head = NULL;
  for (int l = 0; l < m->cfg.num_layers; l++) {
    struct layer_views *lv = &v->layers[l];
#define B16(x)                                                                                     \
  lv->x##16 = w16 + (lv->x - m->params);                                                           \
  lv->x = NULL
    B16(wq);
    B16(wk);
    B16(wv);
    B16(wo);
    B16(w_gate);
    B16(w_up);
    B16(w_down);
#undef B16
  }
  model_weights_changed(m); /* the same values, other views */
  return 0;
}

struct model *model_new_frozen_bf16(const struct model_config *c, struct dapo_err *e) {
  struct model *m = model_layout(c, e);
  if (m && hold_bf16(m, e)) {
    model_free(m);
    return NULL;
  }
  return m;
}

void model_free(struct model *m) {
  if (!m) return;
  free(m->tensors);
  free(m->w.layers);
  free(m->g.layers);
  if (m->params_map_bytes)
    munmap(m->params, m->params_map_bytes);
  else
    free(m->params);
  free(m->w16);
  free(m->grads);
  free(m);
}

int model_freeze_bf16(struct model *m, struct dapo_err *e) {
  if (m->grads) return dapo_errf(e, DAPO_EINVAL, "model_freeze_bf16: the model has gradients");
  if (m->w16) return 0;
  for (int i = 0; i < m->n_tensors; i++) { /* exact in BF16: the low 16 bits are zero */
    const struct param_info *p = &m->tensors[i];
    if (p->ndim != 2) continue;
    uint32_t low = 0;
    const float *x = m->params + p->offset;
    for (size_t k = 0; k < p->numel; k++) {
      uint32_t b;
      memcpy(&b, &x[k], sizeof b);
      low |= b & 0xffffu;
    }
    if (low) return 1;
  }
  return hold_bf16(m, e);
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
  if (m->lora) lora_zero_grads(m->lora);
}

void model_bind_views(const struct model *m, float *base, struct views *v) {
  struct layer_views *ls = v->layers;
  memset(ls, 0, sizeof(*ls) * (size_t)m->cfg.num_layers);
  v->tok_emb = v->final_norm = v->lm_head = NULL;
  v->tok_emb16 = v->lm_head16 = NULL;
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
    case PK_BO: lv->bo = ptr; break;
    case PK_Q_NORM: lv->q_norm = ptr; break;
    case PK_K_NORM: lv->k_norm = ptr; break;
    case PK_FFN_NORM: lv->ffn_norm = ptr; break;
    case PK_W_GATE: lv->w_gate = ptr; break;
    case PK_W_UP: lv->w_up = ptr; break;
    case PK_W_DOWN: lv->w_down = ptr; break;
    case PK_LORA_A:
    case PK_LORA_B: break;
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
    case PK_Q_NORM:
    case PK_K_NORM:
      for (size_t k = 0; k < p->numel; k++) x[k] = 1.0f;
      break;
    case PK_BQ:
    case PK_BK:
    case PK_BV:
    case PK_BO: memset(x, 0, p->numel * sizeof(float)); break;
    default:
      for (size_t k = 0; k < p->numel; k++) x[k] = (float)(rng_normal(&r) * std);
    }
  }
  model_weights_changed(m);
}

const struct param_info *model_find_tensor(const struct model *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}
