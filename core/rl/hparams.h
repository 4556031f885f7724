/* Hyperparameters of a job: every knob of DAPO.md by its API name, one table of
 * {name, type, bounds, default, help} that parses the job body, fills defaults (the `algorithm`
 * preset chooses some of them), validates, and writes the resolved values back for the job
 * object. Parsing collects every problem as {field, message}, so a 4xx can list them all. */
#ifndef DAPO_HPARAMS_H
#define DAPO_HPARAMS_H

#include <stdint.h>

#include <jansson.h>

enum algo { ALGO_DAPO = 0, ALGO_GRPO = 1 };
enum shortfall { SHORTFALL_PARTIAL = 0, SHORTFALL_ERROR = 1 };
enum overlong_mode { OVERLONG_MIN = 0, OVERLONG_ADDITIVE = 1 };
enum loss_agg { AGG_TOKEN_MEAN = 0, AGG_SEQ_MEAN_TOKEN_MEAN = 1, AGG_SEQ_MEAN_TOKEN_SUM_NORM = 2 };
enum judge_error_policy { JUDGE_ERR_FAIL = 0, JUDGE_ERR_DROP = 1 };
/* What a job trains with (the job body's `method`): DAPO/GRPO from rewards, supervised
 * fine-tuning on demonstrations (docs/TRAINING.md#supervised-fine-tuning), or DPO on preference
 * pairs (docs/TRAINING.md#dpo). */
enum method { METHOD_DAPO = 0, METHOD_SUPERVISED = 1, METHOD_DPO = 2 };
/* DPO's loss (the job's loss_type): the sigmoid loss of the DPO paper, with label smoothing. */
/* DPO's loss of h = (lp_c - ref_c) - (lp_r - ref_r) as TRL's DPOTrainer computes it: sigmoid
 * -(1-ls) log s(beta h) - ls log s(-beta h); hinge max(0, 1 - beta h); ipo (h - 1/(2 beta))^2
 * over log-probs averaged per response token; robust (-(1-ls) log s(beta h) + ls log s(-beta h))
 * / (1 - 2 ls). */
enum dpo_loss { DPO_LOSS_SIGMOID = 0, DPO_LOSS_HINGE, DPO_LOSS_IPO, DPO_LOSS_ROBUST };
enum lr_schedule { LR_CONSTANT = 0, LR_LINEAR = 1, LR_COSINE = 2 };

/* The largest group_size a spec may ask for: the DAPO step keeps a group's rewards and
 * advantages on the stack, sized by it. */
#define HPARAMS_GROUP_SIZE_MAX 1024

struct hparams {
  int method;    /* enum method (the job body's top-level `method`) */
  int algorithm; /* enum algo */
  /* sampling */
  int group_size, prompt_batch_size, gen_batch_multiplier, max_gen_batches;
  int on_sampling_shortfall; /* enum shortfall */
  int dynamic_sampling;
  double temperature, top_p;
  int max_new_tokens;
  /* rewards */
  int overlong_buffer;
  double overlong_penalty;
  int overlong_mode; /* enum overlong_mode */
  int mask_truncated;
  double adv_eps;
  int scale_advantages;
  int on_judge_error; /* enum judge_error_policy */
  /* update */
  int minibatch_size, epochs;
  double eps_low, eps_high, dual_clip_c;
  int loss_agg; /* enum loss_agg */
  double kl_coef;
  double learning_rate;
  int lr_warmup_steps;
  double weight_decay, grad_clip, adam_beta1, adam_beta2, adam_eps;
  /* schedule */
  int total_steps, checkpoint_every, keep_checkpoints;
  int eval_every, eval_samples, eval_max_prompts;
  double eval_temperature, eval_top_p;
  /* resources */
  int micro_batch_tokens, gen_batch_size;
  /* supervised fine-tuning and DPO (methods supervised and dpo; zero under dapo) */
  int batch_size, lr_schedule, max_sequence_tokens, truncate;
  /* DPO only (zero under the other methods) */
  double beta, label_smoothing;
  int loss_type; /* enum dpo_loss */
};

/* Parses the `hyperparameters` object j (borrowed; NULL = all defaults) of a DAPO job into h,
 * resolving defaults: hparams_parse_method(h, j, METHOD_DAPO, errors). */
int hparams_parse(struct hparams *h, const json_t *j, json_t *errors);

/* Parses the `hyperparameters` of a job of method `method` (enum method) into h, resolving
 * defaults. A knob of the other method only is refused ("not a hyperparameter of method ..."),
 * as an unknown one is. Each problem is appended to errors (a JSON array, borrowed) as {"field":
 * "hyperparameters.<name>", "message": ...}. Returns the number of problems added. Under
 * METHOD_SUPERVISED and METHOD_DPO, total_steps is left 0: hparams_sft_total_steps derives it
 * from the file. */
int hparams_parse_method(struct hparams *h, const json_t *j, int method, json_t *errors);

/* A supervised or DPO job's steps over a training file of `lines` examples (pairs):
 * ceil(lines / batch_size) * epochs (at least 1). */
int hparams_sft_total_steps(const struct hparams *h, int64_t lines);

/* The learning rate of training step `step` (0-based) of `total` steps: a linear warm-up over
 * lr_warmup_steps to learning_rate, then lr_schedule (constant; linear or cosine decay to 0 at
 * step total). Under METHOD_DAPO only the warm-up applies (adamw_lr_at's rule). */
double hparams_lr_at(const struct hparams *h, int64_t step, int64_t total);

/* A new object with every resolved value of h's method (what the job object shows). */
json_t *hparams_to_json(const struct hparams *h);

/* The method's name as the job body writes it ("dapo", "supervised", "dpo"). */
const char *hparams_method_name(int method);

/* A new array describing every knob in table order: {name, type ("integer", "number",
 * "boolean", "string"), default and grpo_default (null when derived from other knobs: the help
 * says how), minimum and maximum (numbers; exclusive_minimum or exclusive_maximum true when
 * that bound is itself out of range), choices (strings), help, methods (the methods whose
 * knob it is: "dapo", "supervised", "dpo")}. NULL when out of memory.
 * The web dashboard's form is built from it (api/static.c serves it). */
json_t *hparams_describe(void);

/* Names for enum values as the API spells them. */
const char *hparams_loss_agg_name(int agg);

#endif
