/* AdamW: the first update moves every weight by lr * sign(g) (bias correction), decoupled decay
 * touches only matrices, clipping scales to the global norm, warm-up is linear, a NaN gradient
 * skips the update, and the optimizer state round-trips bit-exactly through optimizer.safetensors.
 * (Step-by-step agreement with torch.optim.AdamW is in the PyTorch parity test.) */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adamw.h"
#include "check.h"
#include "model.h"

static struct model *tiny(void) {
  struct model_config c = {.arch = ARCH_QWEN2,
                           .vocab_size = 11,
                           .hidden_size = 8,
                           .intermediate_size = 12,
                           .num_layers = 1,
                           .num_heads = 2,
                           .num_kv_heads = 1,
                           .head_dim = 4,
                           .max_position_embeddings = 16,
                           .rms_norm_eps = 1e-6f,
                           .rope_theta = 10000.0f,
                           .qkv_bias = 1,
                           .bos_token_id = -1,
                           .eos_token_id = -1,
                           .initializer_range = 0.02f};
  struct dapo_err e;
  struct model *m = model_new(&c, &e);
  model_init_random(m, 1);
  model_alloc_grads(m, &e);
  return m;
}

int main(void) {
  struct dapo_err e;
  struct model *m = tiny();
  float *p0 = malloc(m->n_params * sizeof(float));
  memcpy(p0, m->params, m->n_params * sizeof(float));

  struct adamw_cfg cfg = adamw_cfg_default();
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  cfg.grad_clip = 0.0f;
  struct adamw o;
  CHECK(adamw_init(&o, m, &cfg, &e) == 0);
  for (size_t i = 0; i < m->n_params; i++) m->grads[i] = (i % 3 == 0) ? -0.25f : 0.5f;
  double norm;
  CHECK(adamw_step(&o, m, cfg.lr, &norm, &e) == 0);
  int ok = 1;
  for (int t = 0; t < m->n_tensors; t++) {
    const struct param_info *pi = &m->tensors[t];
    for (size_t k = 0; k < pi->numel; k++) {
      size_t i = pi->offset + k;
      float g = m->grads[i];
      float dec = pi->ndim == 2 ? 1.0f - 0.1f * 0.5f : 1.0f;
      float want = p0[i] * dec - 0.1f * (g > 0 ? 1.0f : -1.0f);
      ok &= fabsf(m->params[i] - want) < 1e-6f;
    }
  }
  CHECK_MSG(ok, "first AdamW update is not lr * sign(g) after decoupled decay of matrices");

  /* clipping: a global norm of 10 with grad_clip 1 scales gradients by ~1/10 */
  o.cfg.grad_clip = 1.0f;
  memset(m->grads, 0, m->n_params * sizeof(float));
  m->grads[m->tensors[1].offset] = 6.0f;
  m->grads[m->tensors[2].offset] = 8.0f;
  CHECK(adamw_step(&o, m, 0.0f, &norm, &e) == 0);
  CHECK_NEAR(norm, 10.0, 1e-7);
  CHECK_NEAR(m->grads[m->tensors[1].offset], 0.6, 1e-6);
  CHECK_NEAR(m->grads[m->tensors[2].offset], 0.8, 1e-6);

  /* warm-up */
  struct adamw_cfg w = cfg;
  w.warmup_steps = 4;
  CHECK_NEAR(adamw_lr_at(&w, 0), 0.025, 1e-7);
  CHECK_NEAR(adamw_lr_at(&w, 2), 0.075, 1e-7);
  CHECK_NEAR(adamw_lr_at(&w, 3), 0.1, 1e-7);
  CHECK_NEAR(adamw_lr_at(&w, 100), 0.1, 1e-7);
  w.warmup_steps = 0;
  CHECK_NEAR(adamw_lr_at(&w, 0), 0.1, 1e-7);

  /* NaN gradient: refused, parameters untouched */
  memcpy(p0, m->params, m->n_params * sizeof(float));
  int64_t t_before = o.t;
  m->grads[3] = NAN;
  CHECK(adamw_step(&o, m, 0.1f, &norm, &e) == DAPO_ERANGE);
  CHECK(strstr(e.msg, "not finite") != NULL);
  CHECK(memcmp(p0, m->params, m->n_params * sizeof(float)) == 0 && o.t == t_before);

  /* save / load bit-exact */
  char dir[] = "/tmp/dapo-adamw-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  CHECK_MSG(adamw_save(&o, m, path, &e) == 0, "%s", e.msg);
  struct adamw o2;
  CHECK(adamw_init(&o2, m, &cfg, &e) == 0);
  CHECK_MSG(adamw_load(&o2, m, path, &e) == 0, "%s", e.msg);
  CHECK(o2.t == o.t);
  CHECK(memcmp(o2.m, o.m, o.n * sizeof(float)) == 0 && memcmp(o2.v, o.v, o.n * sizeof(float)) == 0);
  if (!check_failures) {
    unlink(path);
    rmdir(dir);
  }
  adamw_deinit(&o);
  adamw_deinit(&o2);
  free(p0);
  model_free(m);
  return check_done("test_adamw");
}
