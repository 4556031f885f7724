/* AdamW, gradient clipping, warm-up (adamw.h). */
#include "adamw.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "lora.h"

struct adamw_cfg adamw_cfg_default(void) {
  struct adamw_cfg c = {.lr = 1e-6f,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .weight_decay = 0.0f,
                        .grad_clip = 1.0f,
                        .warmup_steps = 0};
  return c;
}

/* What m trains, as the table-driven code reads a model (tensors, n_tensors, n_params, params,
 * grads): m itself, or a view of its adapter's table and buffers when it has one (the base is
 * frozen). The view's other fields are zero: only those five are read through it. */
static struct model trainable(const struct model *m) {
  if (!m->lora) return *m;
  const struct lora *l = m->lora;
  return (struct model){.n_tensors = l->n_tensors,
                        .tensors = l->tensors,
                        .n_params = l->n_params,
                        .params = l->params,
                        .grads = l->grads};
}

int adamw_init(struct adamw *o, const struct model *m, const struct adamw_cfg *cfg,
               struct dapo_err *e) {
  memset(o, 0, sizeof *o);
  o->cfg = *cfg;
  o->n = trainable(m).n_params;
  o->m = dapo_alloc_floats(o->n);
  o->v = dapo_alloc_floats(o->n);
  if (!o->m || !o->v) {
    adamw_deinit(o);
    return dapo_errf(e, DAPO_ENOMEM, "out of memory allocating Adam moments");
  }
  return 0;
}

void adamw_deinit(struct adamw *o) {
  free(o->m);
  free(o->v);
  o->m = o->v = NULL;
}

float adamw_lr_at(const struct adamw_cfg *c, int64_t step) {
  if (c->warmup_steps <= 0 || step + 1 >= c->warmup_steps) return c->lr;
  return c->lr * (float)(step + 1) / (float)c->warmup_steps;
}

double grad_global_norm(const float *g, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
  return sqrt(s);
}

int adamw_step(struct adamw *o, struct model *model, float lr, double *norm_out,
               struct dapo_err *e) {
  struct model tv = trainable(model), *m = &tv;
  if (m->n_params != o->n || !m->grads)
    return dapo_errf(e, DAPO_EINVAL, "adamw_step: the moments were sized for other parameters");
  float *g = m->grads;
  double norm = grad_global_norm(g, o->n);
  if (norm_out) *norm_out = norm;
  if (!isfinite(norm))
    return dapo_errf(e, DAPO_ERANGE, "gradient norm is not finite (%g): update skipped", norm);
  if (o->cfg.grad_clip > 0) {
    float coef = (float)(o->cfg.grad_clip / (norm + 1e-6));
    if (coef < 1.0f)
      for (size_t i = 0; i < o->n; i++) g[i] *= coef;
  }
  o->t++;
  const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
  const float bc1 = 1.0f - powf(b1, (float)o->t), bc2 = 1.0f - powf(b2, (float)o->t);
  const float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
  for (int t = 0; t < m->n_tensors; t++) {
    const struct param_info *pi = &m->tensors[t];
    float *p = m->params + pi->offset, *gg = g + pi->offset;
    float *mm = o->m + pi->offset, *vv = o->v + pi->offset;
    float decay = pi->ndim == 2 ? 1.0f - lr * o->cfg.weight_decay : 1.0f;
    for (size_t i = 0; i < pi->numel; i++) {
      p[i] *= decay;
      mm[i] = b1 * mm[i] + (1.0f - b1) * gg[i];
      vv[i] = b2 * vv[i] + (1.0f - b2) * gg[i] * gg[i];
      float denom = sqrtf(vv[i]) / bc2_sqrt + eps;
      p[i] -= step_size * (mm[i] / denom);
    }
  }
  model_weights_changed(model);
  return 0;
}

int adamw_save(const struct adamw *o, const struct model *model, const char *path,
               struct dapo_err *e) {
  struct model tv = trainable(model), *m = &tv;
  const char *prefixes[2] = {"exp_avg.", "exp_avg_sq."};
  const float *bufs[2] = {o->m, o->v};
  char step[32];
  snprintf(step, sizeof step, "%" PRId64, o->t);
  json_t *meta = json_pack("{ss}", "step", step);
  int rc = ckpt_save_tensors(path, m, 2, prefixes, bufs, meta, e);
  json_decref(meta);
  return rc;
}

int adamw_load(struct adamw *o, const struct model *model, const char *path, struct dapo_err *e) {
  struct model tv = trainable(model), *m = &tv;
  const char *prefixes[2] = {"exp_avg.", "exp_avg_sq."};
  float *bufs[2] = {o->m, o->v};
  json_t *meta = NULL;
  int rc = ckpt_load_tensors(path, m, 2, prefixes, bufs, &meta, e);
  if (rc) return rc;
  const char *s = json_string_value(json_object_get(meta, "step"));
  char *end = NULL;
  long long t = s && *s ? strtoll(s, &end, 10) : -1;
  int bad = !s || !*s || *end || t < 0;
  json_decref(meta);
  if (bad)
    return dapo_errf(e, DAPO_EFORMAT, "%s: metadata 'step' missing or not a non-negative integer",
                     path);
  o->t = t;
  return 0;
}
