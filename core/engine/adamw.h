/* AdamW with decoupled weight decay and bias correction (PyTorch's torch.optim.AdamW, same order
 * of operations), global-L2-norm gradient clipping (torch.nn.utils.clip_grad_norm_), and a
 * linear learning-rate warm-up counted in training steps. It updates what the model trains: its
 * adapter (model.lora, lora.h) when it has one, else all its parameters. The moments live in
 * flat buffers laid out like those parameters; their state is saved and restored bit-exactly. */
#ifndef DAPO_ADAMW_H
#define DAPO_ADAMW_H

#include <stdint.h>

#include "error.h"
#include "model.h"

struct adamw_cfg {
  float lr;           /* peak learning rate */
  float beta1, beta2; /* 0.9, 0.999 */
  float eps;          /* 1e-8 */
  float weight_decay; /* decoupled; applied to matrices (2-D tensors) only, never to norms or
                         biases, as Hugging Face trainers do */
  float grad_clip;    /* max global L2 norm; <= 0 disables clipping */
  int warmup_steps;   /* linear warm-up over this many training steps; 0: none */
};

/* Defaults of DAPO.md (lr 1e-6, betas 0.9/0.999, eps 1e-8, wd 0, clip 1.0, warm-up 0). */
struct adamw_cfg adamw_cfg_default(void);

struct adamw {
  struct adamw_cfg cfg;
  size_t n;  /* floats in each moment buffer (== model n_params) */
  float *m;  /* first moment, owned */
  float *v;  /* second moment, owned */
  int64_t t; /* optimizer updates applied so far (bias correction exponent) */
};

int adamw_init(struct adamw *o, const struct model *m, const struct adamw_cfg *cfg,
               struct dapo_err *e);
void adamw_deinit(struct adamw *o);

/* Learning rate for training step `step` (0-based): lr * min(1, (step + 1) / warmup_steps). */
float adamw_lr_at(const struct adamw_cfg *c, int64_t step);

/* Global L2 norm of n floats (accumulated in double). */
double grad_global_norm(const float *g, size_t n);

/* Clips m->grads to cfg.grad_clip (returning the norm before clipping in *norm_out, may be NULL),
 * then applies one AdamW update with learning rate lr. A non-finite gradient norm skips the
 * update, leaves the parameters untouched and returns DAPO_ERANGE. */
int adamw_step(struct adamw *o, struct model *m, float lr, double *norm_out, struct dapo_err *e);

/* Saves/restores m, v and t as `optimizer.safetensors` (tensors exp_avg.<name>,
 * exp_avg_sq.<name>; metadata {"step": t}). Bit-exact. */
int adamw_save(const struct adamw *o, const struct model *m, const char *path, struct dapo_err *e);
int adamw_load(struct adamw *o, const struct model *m, const char *path, struct dapo_err *e);

#endif
