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

/* The largest group_size a spec may ask for: the DAPO step keeps a group's rewards and
 * advantages on the stack, sized by it. */
#define HPARAMS_GROUP_SIZE_MAX 1024

struct hparams {
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
};

/* Parses the `hyperparameters` object j (borrowed; NULL = all defaults) into h, resolving
 * defaults. Each problem is appended to errors (a JSON array, borrowed) as {"field":
 * "hyperparameters.<name>", "message": ...}. Returns the number of problems added. */
int hparams_parse(struct hparams *h, const json_t *j, json_t *errors);

/* A new object with every resolved value (what the job object shows). */
json_t *hparams_to_json(const struct hparams *h);

/* A new array describing every knob in table order: {name, type ("integer", "number",
 * "boolean", "string"), default and grpo_default (null when derived from other knobs: the help
 * says how), minimum and maximum (numbers), choices (strings), help}. NULL when out of memory.
 * The web dashboard's form is built from it (api/static.c serves it). */
json_t *hparams_describe(void);

/* Names for enum values as the API spells them. */
const char *hparams_loss_agg_name(int agg);

#endif
