/* LoRA adapters: config, PEFT names, buffers, initialisation, merging (lora.h). */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "rng.h"
#include "safetensors.h"

static const char *const TARGETS[LT_COUNT] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};

const char *lora_target_name(int t) {
  return t >= 0 && t < LT_COUNT ? TARGETS[t] : "?";
}

/* The module path of target t inside a decoder layer ("self_attn.q_proj", "mlp.up_proj"). */
static const char *target_parent(int t) {
  return t <= LT_O ? "self_attn" : "mlp";
}

void lora_target_dims(int t, const struct model_config *m, int *out, int *in) {
  int C = m->hidden_size, CQ = m->num_heads * m->head_dim, CKV = m->num_kv_heads * m->head_dim,
      FF = m->intermediate_size;
  switch (t) {
  case LT_Q: *out = CQ, *in = C; break;
  case LT_K:
  case LT_V: *out = CKV, *in = C; break;
  case LT_O: *out = C, *in = CQ; break;
  case LT_GATE:
  case LT_UP: *out = FF, *in = C; break;
  default: *out = C, *in = FF; break;
  }
}

static void add_err(json_t *errors, const char *key, const char *msg) {
  char field[64];
  snprintf(field, sizeof field, "adapter%s%s", key ? "." : "", key ? key : "");
  dapo_errors_add(errors, field, msg);
}

/* The value of key or of its PEFT synonym (both given is an error). */
static const json_t *either(const json_t *j, const char *key, const char *peft, json_t *errors) {
  const json_t *a = json_object_get(j, key), *b = json_object_get(j, peft);
  if (a && b) {
    char msg[128];
    snprintf(msg, sizeof msg, "give %s or %s, not both", key, peft);
    add_err(errors, peft, msg);
  }
  return a ? a : b;
}

int lora_config_parse(struct lora_config *c, const json_t *j, json_t *errors) {
  size_t before = json_array_size(errors);
  memset(c, 0, sizeof *c);
  c->r = 8;
  c->alpha = 8;
  c->targets = 1u << LT_Q | 1u << LT_V;
  if (!json_is_object(j)) {
    add_err(errors, NULL, "expected an object such as {\"type\": \"lora\", \"r\": 16}");
    return (int)(json_array_size(errors) - before);
  }
  static const char *const KNOWN[] = {
      "type",           "r",          "alpha", "lora_alpha", "dropout", "lora_dropout",
      "target_modules", "use_rslora", "bias",  NULL};
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)j, key, v) {
    int k = 0;
    while (KNOWN[k] && strcmp(KNOWN[k], key) != 0) k++;
    if (!KNOWN[k]) add_err(errors, key, "unknown adapter key");
  }
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type || strcmp(type, "lora") != 0) add_err(errors, "type", "must be \"lora\"");
  v = json_object_get(j, "r");
  if (v) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4096)
      add_err(errors, "r", "must be an integer in [1, 4096]");
    else
      c->r = (int)json_integer_value(v);
  }
  const json_t *a = either(j, "alpha", "lora_alpha", errors);
  if (a) {
    if (!json_is_number(a) || !(json_number_value(a) > 0) || json_number_value(a) > 1e6)
      add_err(errors, json_object_get(j, "alpha") ? "alpha" : "lora_alpha",
              "must be a number in (0, 1e6]");
    else
      c->alpha = json_number_value(a);
  }
  const json_t *d = either(j, "dropout", "lora_dropout", errors);
  if (d && (!json_is_number(d) || json_number_value(d) != 0))
    add_err(errors, json_object_get(j, "dropout") ? "dropout" : "lora_dropout",
            "only 0 is supported: dropout would make the sampler's and the trainer's log-probs "
            "differ, and the clipped ratio meaningless");
  v = json_object_get(j, "use_rslora");
  if (v) {
    if (!json_is_boolean(v))
      add_err(errors, "use_rslora", "expected true or false");
    else
      c->use_rslora = json_is_true(v);
  }
  v = json_object_get(j, "bias");
  if (v && (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0))
    add_err(errors, "bias", "only \"none\" is supported");
  v = json_object_get(j, "target_modules");
  if (v) {
    unsigned t = 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
      t = (1u << LT_COUNT) - 1;
    } else if (json_is_array(v) && json_array_size(v) > 0) {
      size_t i;
      json_t *x;
      json_array_foreach(v, i, x) {
        const char *s = json_string_value(x);
        int k = 0;
        while (s && k < LT_COUNT && strcmp(TARGETS[k], s) != 0) k++;
        if (!s || k == LT_COUNT) {
          char field[48], msg[192];
          snprintf(field, sizeof field, "target_modules[%zu]", i);
          snprintf(msg, sizeof msg,
                   "'%.40s' is not a linear layer of the model (q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj)",
                   s ? s : "(not a string)");
          add_err(errors, field, msg);
        } else {
          t |= 1u << k;
        }
      }
    } else {
      add_err(errors, "target_modules",
              "expected a non-empty array of layer names or \"all-linear\"");
    }
    if (t) c->targets = t;
  }
  return (int)(json_array_size(errors) - before);
}

int lora_config_check(const struct lora_config *c, const struct model_config *m, json_t *errors) {
  size_t before = json_array_size(errors);
  for (int t = 0; t < LT_COUNT; t++) {
    if (!(c->targets & 1u << t)) continue;
    int out, in;
    lora_target_dims(t, m, &out, &in);
    if (c->r > out || c->r > in) {
      char msg[160];
      snprintf(msg, sizeof msg, "%d exceeds the smaller dimension of %s (%d x %d)", c->r,
               TARGETS[t], out, in);
      add_err(errors, "r", msg);
      break;
    }
  }
  return (int)(json_array_size(errors) - before);
}

static json_t *targets_json(unsigned targets) {
  json_t *a = json_array();
  for (int t = 0; t < LT_COUNT; t++)
    if (targets & 1u << t) json_array_append_new(a, json_string(TARGETS[t]));
  return a;
}

int lora_config_same(const struct lora_config *a, const struct lora_config *b) {
  return a->r == b->r && a->alpha == b->alpha && a->targets == b->targets &&
         !a->use_rslora == !b->use_rslora;
}

json_t *lora_config_to_json(const struct lora_config *c) {
  return json_pack("{s:s, s:i, s:f, s:o, s:f, s:b}", "type", "lora", "r", c->r, "alpha", c->alpha,
                   "target_modules", targets_json(c->targets), "dropout", 0.0, "use_rslora",
                   c->use_rslora);
}

json_t *lora_peft_config(const struct lora_config *c, const char *base_model) {
  json_t *o = json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:b, s:b}", "peft_type",
                        "LORA", "task_type", "CAUSAL_LM", "r", c->r, "lora_alpha", c->alpha,
                        "lora_dropout", 0.0, "target_modules", targets_json(c->targets), "bias",
                        "none", "use_rslora", c->use_rslora, "use_dora", 0, "fan_in_fan_out", 0,
                        "inference_mode", 1, "init_lora_weights", 1);
  if (!o) return NULL;
  json_object_set_new(o, "base_model_name_or_path", json_string(base_model ? base_model : ""));
  json_object_set_new(o, "modules_to_save", json_null());
  json_object_set_new(o, "layers_to_transform", json_null());
  json_object_set_new(o, "layers_pattern", json_null());
  json_object_set_new(o, "rank_pattern", json_object());
  json_object_set_new(o, "alpha_pattern", json_object());
  json_object_set_new(o, "revision", json_null());
  return o;
}

float lora_scale(const struct lora_config *c) {
  return (float)(c->use_rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r);
}

int64_t lora_param_count(const struct lora_config *c, const struct model_config *m) {
  int64_t per_layer = 0;
  for (int t = 0; t < LT_COUNT; t++) {
    if (!(c->targets & 1u << t)) continue;
    int out, in;
    lora_target_dims(t, m, &out, &in);
    per_layer += (int64_t)c->r * (in + out);
  }
  return per_layer * m->num_layers;
}

void lora_free(struct lora *l) {
  if (!l) return;
  free(l->tensors);
  free(l->params);
  free(l->grads);
  free(l->w);
  free(l->g);
  free(l);
}

/* Fills views v[L] from base (laid out like l->params): the table holds A then B of each
 * targeted layer, layer by layer, targets in enum order (lora_new). */
static void bind(const struct lora *l, float *base, struct lora_layer *v) {
  memset(v, 0, sizeof *v * (size_t)l->num_layers);
  int i = 0;
  for (int layer = 0; layer < l->num_layers; layer++)
    for (int t = 0; t < LT_COUNT; t++) {
      if (!(l->cfg.targets & 1u << t)) continue;
      v[layer].a[t] = base + l->tensors[i++].offset;
      v[layer].b[t] = base + l->tensors[i++].offset;
    }
}

struct lora *lora_new(const struct lora_config *c, const struct model_config *m,
                      struct dapo_err *e) {
  if (c->r < 1 || !c->targets || !(c->alpha > 0)) {
    dapo_errf(e, DAPO_EINVAL, "adapter: r %d, alpha %g and targets %#x must be positive", c->r,
              c->alpha, c->targets);
    return NULL;
  }
  struct lora *l = calloc(1, sizeof *l);
  if (!l) goto oom;
  l->cfg = *c;
  l->scale = lora_scale(c);
  l->num_layers = m->num_layers;
  int per = 0;
  for (int t = 0; t < LT_COUNT; t++) per += (c->targets >> t) & 1;
  l->tensors = calloc((size_t)(2 * per * m->num_layers), sizeof *l->tensors);
  l->w = calloc((size_t)m->num_layers, sizeof *l->w);
  l->g = calloc((size_t)m->num_layers, sizeof *l->g);
  if (!l->tensors || !l->w || !l->g) goto oom;
  size_t off = 0;
  for (int layer = 0; layer < m->num_layers; layer++)
    for (int t = 0; t < LT_COUNT; t++) {
      if (!(c->targets & 1u << t)) continue;
      int out, in;
      lora_target_dims(t, m, &out, &in);
      for (int ab = 0; ab < 2; ab++) {
        struct param_info *p = &l->tensors[l->n_tensors++];
        snprintf(p->name, sizeof p->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight",
                 layer, target_parent(t), TARGETS[t], ab ? 'B' : 'A');
        p->kind = ab ? PK_LORA_B : PK_LORA_A;
        p->layer = layer;
        p->ndim = 2;
        p->shape[0] = ab ? out : c->r;
        p->shape[1] = ab ? c->r : in;
        p->numel = (size_t)p->shape[0] * (size_t)p->shape[1];
        p->offset = off;
        off += (p->numel + 15) & ~(size_t)15;
      }
    }
  l->n_params = off;
  if (!(l->params = dapo_alloc_floats(off))) goto oom;
  bind(l, l->params, l->w);
  return l;
oom:
  lora_free(l);
  dapo_errf(e, DAPO_ENOMEM, "out of memory allocating the adapter");
  return NULL;
}

int lora_alloc_grads(struct lora *l, struct dapo_err *e) {
  if (l->grads) return 0;
  if (!(l->grads = dapo_alloc_floats(l->n_params)))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory allocating adapter gradients");
  bind(l, l->grads, l->g);
  return 0;
}

void lora_zero_grads(struct lora *l) {
  if (l->grads) memset(l->grads, 0, l->n_params * sizeof(float));
}

void lora_init(struct lora *l, uint64_t seed) {
  struct rng r;
  rng_seed(&r, seed, 0x10ba);
  for (int i = 0; i < l->n_tensors; i++) {
    const struct param_info *p = &l->tensors[i];
    float *x = l->params + p->offset;
    if (p->kind == PK_LORA_B) {
      memset(x, 0, p->numel * sizeof(float));
      continue;
    }
    double bound = 1.0 / sqrt((double)p->shape[1]);
    for (size_t k = 0; k < p->numel; k++) x[k] = (float)((2 * rng_float(&r) - 1) * bound);
  }
}

/* The base matrix of target t in layer views w. */
static float *base_of(struct layer_views *w, int t) {
  float *const M[LT_COUNT] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
  return M[t];
}

void lora_merge(const struct lora *l, struct model *m) {
  int r = l->cfg.r;
  for (int layer = 0; layer < l->num_layers; layer++)
    for (int t = 0; t < LT_COUNT; t++) {
      const float *A = l->w[layer].a[t], *B = l->w[layer].b[t];
      if (!A) continue;
      int out, in;
      lora_target_dims(t, &m->cfg, &out, &in);
      float *W = base_of(&m->w.layers[layer], t);
      for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
          double s = 0;
          for (int k = 0; k < r; k++) s += (double)B[(size_t)o * r + k] * A[(size_t)k * in + i];
          W[(size_t)o * in + i] += (float)(l->scale * s);
        }
    }
  model_weights_changed(m);
}

int lora_save(const struct lora *l, const char *dir, const char *base_model, struct dapo_err *e) {
  char p[4096];
  json_t *cfg = lora_peft_config(&l->cfg, base_model);
  if (!cfg) return dapo_errf(e, DAPO_ENOMEM, "adapter_config.json: out of memory");
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  int rc = ckpt_write_json(p, cfg, e);
  json_decref(cfg);
  if (rc) return rc;
  struct st_tensor_in *ts = calloc((size_t)l->n_tensors + 1, sizeof *ts);
  if (!ts) return dapo_errf(e, DAPO_ENOMEM, "adapter_model.safetensors: out of memory");
  for (int i = 0; i < l->n_tensors; i++) {
    const struct param_info *t = &l->tensors[i];
    ts[i] = (struct st_tensor_in){.name = t->name,
                                  .data = l->params + t->offset,
                                  .ndim = 2,
                                  .shape = {t->shape[0], t->shape[1]}};
  }
  json_t *meta = json_pack("{s:s}", "format", "pt");
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  rc = st_write(p, ts, l->n_tensors, ST_F32, meta, e);
  json_decref(meta);
  free(ts);
  return rc;
}

int lora_load(const char *dir, const struct model_config *m, struct lora **out,
              struct dapo_err *e) {
  *out = NULL;
  char p[4096];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  json_error_t je;
  json_t *cj = json_load_file(p, 0, &je);
  if (!cj) return dapo_errf(e, DAPO_EFORMAT, "adapter_config.json: %s", je.text);
  const char *pt = json_string_value(json_object_get(cj, "peft_type"));
  struct lora_config c = {0};
  int rc = 0;
  if (!pt || strcmp(pt, "LORA") != 0) {
    rc = dapo_errf(e, DAPO_EUNSUPPORTED, "adapter_config.json: peft_type '%s' (only LORA)",
                   pt ? pt : "(none)");
    goto out;
  }
  /* PEFT's keys onto the job's adapter object, then the one parser */
  json_t *spec = json_pack(
      "{s:s, s:O?, s:O?, s:O?, s:O?}", "type", "lora", "r", json_object_get(cj, "r"), "lora_alpha",
      json_object_get(cj, "lora_alpha"), "target_modules", json_object_get(cj, "target_modules"),
      "use_rslora", json_object_get(cj, "use_rslora"));
  json_t *errs = json_array();
  static const char *const NONE[] = {"use_dora", "layers_to_transform", "modules_to_save", NULL};
  for (int i = 0; NONE[i]; i++) {
    json_t *v = json_object_get(cj, NONE[i]);
    if (v && !json_is_null(v) && !json_is_false(v))
      dapo_errors_add(errs, NONE[i], "not supported (plain LoRA only)");
  }
  json_t *rp = json_object_get(cj, "rank_pattern"), *ap = json_object_get(cj, "alpha_pattern");
  if (json_object_size(rp) || json_object_size(ap))
    dapo_errors_add(errs, "rank_pattern", "per-layer ranks or alphas are not supported");
  lora_config_parse(&c, spec, errs);
  lora_config_check(&c, m, errs);
  json_decref(spec);
  if (json_array_size(errs)) {
    json_t *x = json_array_get(errs, 0);
    rc = dapo_errf(e, DAPO_EFORMAT, "adapter_config.json: %s: %s",
                   json_string_value(json_object_get(x, "field")),
                   json_string_value(json_object_get(x, "message")));
  }
  json_decref(errs);
  if (rc) goto out;
  struct lora *l = lora_new(&c, m, e);
  if (!l) {
    rc = e && e->code ? e->code : DAPO_ENOMEM;
    goto out;
  }
  struct st_file *f = NULL;
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  if ((rc = st_open(p, &f, e))) {
    lora_free(l);
    goto out;
  }
  for (int i = 0; i < st_count(f) && !rc; i++) {
    const struct st_info *t = st_at(f, i);
    if (!lora_find_tensor(l, t->name))
      rc = dapo_errf(e, DAPO_EFORMAT, "adapter_model.safetensors: unexpected tensor '%s'", t->name);
  }
  for (int i = 0; i < l->n_tensors && !rc; i++) {
    const struct param_info *t = &l->tensors[i];
    const struct st_info *si = st_find(f, t->name);
    if (!si)
      rc = dapo_errf(e, DAPO_EFORMAT, "missing tensor '%s'", t->name);
    else if (si->ndim != 2 || si->shape[0] != t->shape[0] || si->shape[1] != t->shape[1])
      rc = dapo_errf(e, DAPO_EFORMAT, "tensor '%s' is not [%lld, %lld] (r and the model's shape)",
                     t->name, (long long)t->shape[0], (long long)t->shape[1]);
    else
      rc = st_read_f32(f, si, l->params + t->offset, t->numel, e);
  }
  st_close(f);
  if (rc) {
    dapo_err_prefix(e, "adapter_model.safetensors: ");
    lora_free(l);
    goto out;
  }
  *out = l;
out:
  json_decref(cj);
  return rc;
}

const struct param_info *lora_find_tensor(const struct lora *l, const char *name) {
  for (int i = 0; i < l->n_tensors; i++)
    if (!strcmp(l->tensors[i].name, name)) return &l->tensors[i];
  return NULL;
}
