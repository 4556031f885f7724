/* The hyperparameter table (hparams.h). */
#include "hparams.h"

#include "error.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

enum htype { H_INT, H_NUM, H_BOOL, H_ENUM };

/* A default of D_DERIVED is resolved after parsing from other knobs (see resolve()). */
#define D_DERIVED (-1e300)

struct hrow {
  const char *name;
  enum htype type;
  size_t off;
  double min, max;
  double dflt;                /* for the dapo preset; H_ENUM: index */
  double grpo;                /* default under algorithm "grpo" (NAN: same as dflt) */
  const char *const *choices; /* H_ENUM */
  const char *help;
  /* the methods (HM_*, or-ed) whose knob it is (none: every method), or-ed with the bounds
   * left out of the range: OPEN_MIN (min, ...), OPEN_MAX (..., max) */
  int only;
};

enum { HM_DAPO = 1, HM_SFT = 2, HM_DPO = 4, HM_ALL = 7, HM_DEMO = HM_SFT | HM_DPO };
enum { OPEN_MIN = 8, OPEN_MAX = 16 };

static const char *const ALGOS[] = {"dapo", "grpo", NULL};
static const char *const SHORTFALLS[] = {"partial", "error", NULL};
static const char *const OVERLONG_MODES[] = {"min", "additive", NULL};
static const char *const AGGS[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                   NULL};
static const char *const JUDGE_ERRS[] = {"fail", "drop", NULL};
static const char *const SCHEDULES[] = {"constant", "linear", "cosine", NULL};
static const char *const METHODS[] = {"dapo", "supervised", "dpo", NULL};
static const char *const DPO_LOSSES[] = {"sigmoid", "hinge", "ipo", "robust", NULL};

#define F(x) offsetof(struct hparams, x)
#define SAME NAN
static const struct hrow ROWS[] = {
    {"algorithm", H_ENUM, F(algorithm), 0, 0, ALGO_DAPO, SAME, ALGOS,
     "dapo or grpo: chooses the defaults of the other knobs", HM_DAPO},
    {"group_size", H_INT, F(group_size), 2, HPARAMS_GROUP_SIZE_MAX, 8, SAME, NULL,
     "G, responses per prompt", HM_DAPO},
    {"prompt_batch_size", H_INT, F(prompt_batch_size), 1, 65536, 8, SAME, NULL,
     "prompt groups trained on per step", HM_DAPO},
    {"gen_batch_multiplier", H_INT, F(gen_batch_multiplier), 1, 64, 3, 1, NULL,
     "prompts drawn per generation round = prompt_batch_size * this", HM_DAPO},
    {"max_gen_batches", H_INT, F(max_gen_batches), 1, 1000, 10, SAME, NULL,
     "generation rounds per step before the shortfall policy applies", HM_DAPO},
    {"on_sampling_shortfall", H_ENUM, F(on_sampling_shortfall), 0, 0, SHORTFALL_PARTIAL, SAME,
     SHORTFALLS, "partial: train on the kept groups and warn; error: fail the job", HM_DAPO},
    {"dynamic_sampling", H_BOOL, F(dynamic_sampling), 0, 1, 1, 0, NULL,
     "keep only groups with 0 < correct < G", HM_DAPO},
    {"temperature", H_NUM, F(temperature), 1e-3, 10, 1.0, SAME, NULL, "rollout temperature",
     HM_DAPO},
    {"top_p", H_NUM, F(top_p), 1e-6, 1, 1.0, SAME, NULL, "rollout nucleus", HM_DAPO},
    {"max_new_tokens", H_INT, F(max_new_tokens), 1, 1 << 20, 64, SAME, NULL, "L_max", HM_DAPO},
    {"overlong_buffer", H_INT, F(overlong_buffer), 0, 1 << 20, D_DERIVED, 0, NULL,
     "L_buf; default max_new_tokens / 5 (the paper's 4096 of 20480); 0 disables shaping", HM_DAPO},
    {"overlong_penalty", H_NUM, F(overlong_penalty), 0, 1e6, 1.0, SAME, NULL, "p", HM_DAPO},
    {"overlong_mode", H_ENUM, F(overlong_mode), 0, 0, OVERLONG_MIN, SAME, OVERLONG_MODES,
     "min: r' = min(r, penalty) (the note); additive: r' = r + penalty (the paper, verl)", HM_DAPO},
    {"mask_truncated", H_BOOL, F(mask_truncated), 0, 1, 0, SAME, NULL,
     "leave responses cut at max_new_tokens out of the loss", HM_DAPO},
    {"adv_eps", H_NUM, F(adv_eps), 0, 1, 1e-6, SAME, NULL, "A = (r - mean) / (std + adv_eps)",
     HM_DAPO},
    {"scale_advantages", H_BOOL, F(scale_advantages), 0, 1, 1, SAME, NULL,
     "false: Dr.GRPO's A = r - mean", HM_DAPO},
    {"on_judge_error", H_ENUM, F(on_judge_error), 0, 0, JUDGE_ERR_FAIL, SAME, JUDGE_ERRS,
     "fail the job, or drop the affected groups from the step", HM_DAPO},
    {"minibatch_size", H_INT, F(minibatch_size), 1, 1 << 24, D_DERIVED, SAME, NULL,
     "responses per optimizer update; default a quarter of the step's responses", HM_DAPO},
    {"epochs", H_INT, F(epochs), 1, 64, 1, SAME, NULL,
     "passes over the step's responses (supervised, dpo: passes over the training file)", 0},
    {"eps_low", H_NUM, F(eps_low), 0, 0.999999, 0.2, SAME, NULL, "clip 1 - eps_low", HM_DAPO},
    {"eps_high", H_NUM, F(eps_high), 0, 10, 0.28, D_DERIVED, NULL,
     "clip 1 + eps_high (grpo: equal to eps_low)", HM_DAPO},
    {"dual_clip_c", H_NUM, F(dual_clip_c), 0, 1e3, 0, SAME, NULL,
     "0 off; else for A < 0 the loss is bounded by -c * A (c > 1)", HM_DAPO},
    {"loss_agg", H_ENUM, F(loss_agg), 0, 0, AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_MEAN, AGGS,
     "token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr.GRPO)", HM_DAPO},
    {"kl_coef", H_NUM, F(kl_coef), 0, 100, 0, 0.001, NULL,
     "k3 KL to the starting weights; > 0 keeps a second copy of the model in memory", HM_DAPO},
    {"learning_rate", H_NUM, F(learning_rate), 0, 1, 1e-5, SAME, NULL, "AdamW peak rate", 0},
    {"lr_warmup_steps", H_INT, F(lr_warmup_steps), 0, 1 << 24, 0, SAME, NULL,
     "linear warm-up, in training steps", 0},
    {"weight_decay", H_NUM, F(weight_decay), 0, 10, 0, SAME, NULL, "decoupled, matrices only", 0},
    {"grad_clip", H_NUM, F(grad_clip), 0, 1e6, 1.0, SAME, NULL, "global L2 norm; 0 off", 0},
    {"adam_beta1", H_NUM, F(adam_beta1), 0, 0.999999, 0.9, SAME, NULL, "", 0},
    {"adam_beta2", H_NUM, F(adam_beta2), 0, 0.999999999, 0.999, SAME, NULL, "", 0},
    {"adam_eps", H_NUM, F(adam_eps), 1e-30, 1, 1e-8, SAME, NULL, "", 0},
    {"total_steps", H_INT, F(total_steps), 1, 1 << 24, 20, SAME, NULL, "training steps", HM_DAPO},
    {"checkpoint_every", H_INT, F(checkpoint_every), 0, 1 << 24, 0, SAME, NULL,
     "steps between checkpoints (0: only step 0 and the final step)", 0},
    {"keep_checkpoints", H_INT, F(keep_checkpoints), 0, 1 << 24, 0, SAME, NULL,
     "0 keeps all; else the newest N (the final one always)", 0},
    {"eval_every", H_INT, F(eval_every), 0, 1 << 24, 0, SAME, NULL,
     "steps between evaluations on the validation file (0: none)", 0},
    {"eval_samples", H_INT, F(eval_samples), 1, 1024, 4, SAME, NULL,
     "k responses per validation prompt (avg@k, pass@k)", HM_DAPO},
    {"eval_max_prompts", H_INT, F(eval_max_prompts), 0, 1 << 24, 0, SAME, NULL,
     "0: every validation prompt", HM_DAPO},
    {"eval_temperature", H_NUM, F(eval_temperature), 0, 10, 1.0, SAME, NULL, "", HM_DAPO},
    {"eval_top_p", H_NUM, F(eval_top_p), 1e-6, 1, 0.7, SAME, NULL, "", HM_DAPO},
    {"micro_batch_tokens", H_INT, F(micro_batch_tokens), 16, 1 << 24, 1024, SAME, NULL,
     "tokens per forward/backward pass (memory); never changes the result's maths", 0},
    {"gen_batch_size", H_INT, F(gen_batch_size), 1, 1 << 16, 64, SAME, NULL,
     "sequences generated together (KV cache memory)", HM_DAPO},
    {"batch_size", H_INT, F(batch_size), 1, 65536, 8, SAME, NULL,
     "examples (dpo: pairs) per optimizer step", HM_DEMO},
    {"lr_schedule", H_ENUM, F(lr_schedule), 0, 0, LR_LINEAR, SAME, SCHEDULES,
     "after the warm-up: constant, or linear or cosine decay to 0 at the last step", HM_DEMO},
    {"max_sequence_tokens", H_INT, F(max_sequence_tokens), 2, 1 << 20, 2048, SAME, NULL,
     "tokens of an example (prompt and completion); longer ones are refused, or cut with truncate",
     HM_DEMO},
    {"truncate", H_BOOL, F(truncate), 0, 1, 0, SAME, NULL,
     "cut examples longer than max_sequence_tokens (their end) instead of refusing the file",
     HM_DEMO},
    {"beta", H_NUM, F(beta), 0, 2, 0.1, SAME, NULL,
     "DPO's beta: how far the policy may move from the reference (rewards are beta * log-ratio)",
     HM_DPO | OPEN_MIN},
    {"loss_type", H_ENUM, F(loss_type), 0, 0, DPO_LOSS_SIGMOID, SAME, DPO_LOSSES,
     "of h, how much more the policy prefers the chosen response than the reference does, as "
     "TRL computes them: sigmoid -log sigmoid(beta h) (the DPO paper's); hinge max(0, 1 - beta "
     "h) (SLiC); ipo (h - 1/(2 beta))^2 over log-probs averaged per response token (IPO); robust "
     "the sigmoid loss unbiased for flipped labels (label_smoothing their share)",
     HM_DPO},
    {"label_smoothing", H_NUM, F(label_smoothing), 0, 0.5, 0, SAME, NULL,
     "in [0, 0.5): the chance a pair's preference is flipped (the sigmoid and robust losses: "
     "conservative DPO and robust DPO)",
     HM_DPO | OPEN_MAX},
};
#define NROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

static void add_err(json_t *errors, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_err(json_t *errors, const char *name, const char *fmt, ...) {
  char field[96], msg[256];
  snprintf(field, sizeof field, "hyperparameters.%s", name);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dapo_errors_add(errors, field, msg);
}

static void set_val(struct hparams *h, const struct hrow *r, double v) {
  char *base = (char *)h + r->off;
  if (r->type == H_NUM)
    *(double *)base = v;
  else
    *(int *)base = (int)v;
}

static double get_val(const struct hparams *h, const struct hrow *r) {
  const char *base = (const char *)h + r->off;
  return r->type == H_NUM ? *(const double *)base : *(const int *)base;
}

static const struct hrow *find_row(const char *name) {
  for (int i = 0; i < NROWS; i++)
    if (!strcmp(ROWS[i].name, name)) return &ROWS[i];
  return NULL;
}

/* Whether row r is a knob of method m. */
static int row_in(const struct hrow *r, int m) {
  return !(r->only & HM_ALL) || (r->only & (1 << m));
}

const char *hparams_method_name(int method) {
  return method >= 0 && method <= METHOD_DPO ? METHODS[method] : "?";
}

/* "dapo", "supervised and dpo": the methods of row r, into buf. */
static const char *methods_of(const struct hrow *r, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int m = 0; METHODS[m] && n < cap; m++)
    if (r->only & (1 << m))
      n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? " and " : "", METHODS[m]);
  return buf;
}

int hparams_parse(struct hparams *h, const json_t *j, json_t *errors) {
  return hparams_parse_method(h, j, METHOD_DAPO, errors);
}

int hparams_parse_method(struct hparams *h, const json_t *j, int method, json_t *errors) {
  size_t before = json_array_size(errors);
  memset(h, 0, sizeof *h);
  h->method = method;
  unsigned char given[NROWS] = {0};
  if (j && !json_is_object(j)) {
    json_array_append_new(errors, json_pack("{s:s,s:s}", "field", "hyperparameters", "message",
                                            "expected an object"));
    j = NULL;
  }
  /* algorithm first: it chooses the defaults */
  const json_t *alg = j ? json_object_get(j, "algorithm") : NULL;
  int grpo = 0;
  if (alg) {
    const char *s = json_string_value(alg);
    if (s && !strcmp(s, "grpo")) grpo = 1;
  }
  const char *key;
  json_t *v;
  if (j) json_object_foreach((json_t *)j, key, v) {
      const struct hrow *r = find_row(key);
      if (!r) {
        add_err(errors, key, "unknown hyperparameter");
        continue;
      }
      if (!row_in(r, method)) {
        char of[64];
        add_err(errors, key, "not a hyperparameter of method %s (it is one of %s jobs)",
                hparams_method_name(method), methods_of(r, of, sizeof of));
        continue;
      }
      int idx = (int)(r - ROWS);
      double x = 0;
      switch (r->type) {
      case H_INT:
        if (!json_is_integer(v)) {
          add_err(errors, key, "expected an integer");
          continue;
        }
        x = (double)json_integer_value(v);
        break;
      case H_NUM:
        if (!json_is_number(v)) {
          add_err(errors, key, "expected a number");
          continue;
        }
        x = json_number_value(v);
        break;
      case H_BOOL:
        if (!json_is_boolean(v)) {
          add_err(errors, key, "expected true or false");
          continue;
        }
        x = json_is_true(v);
        break;
      case H_ENUM: {
        const char *s = json_string_value(v);
        int k = -1;
        for (int c = 0; s && r->choices[c]; c++)
          if (!strcmp(s, r->choices[c])) k = c;
        if (k < 0) {
          char list[160] = "";
          size_t n = 0;
          for (int c = 0; r->choices[c] && n < sizeof list; c++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", c ? ", " : "", r->choices[c]);
          add_err(errors, key, "expected one of: %s", list);
          continue;
        }
        x = k;
        break;
      }
      }
      if (r->type == H_INT || r->type == H_NUM) {
        int open = r->only & (OPEN_MIN | OPEN_MAX);
        if (!(x >= r->min && x <= r->max) || ((open & OPEN_MIN) && x == r->min) ||
            ((open & OPEN_MAX) && x == r->max)) {
          if (open)
            add_err(errors, key, "%g not in %c%g, %g%c", x, open & OPEN_MIN ? '(' : '[', r->min,
                    r->max, open & OPEN_MAX ? ')' : ']');
          else if (r->type == H_INT)
            add_err(errors, key, "%.0f not in [%.0f, %.0f]", x, r->min, r->max);
          else
            add_err(errors, key, "%g not in [%g, %g]", x, r->min, r->max);
          continue;
        }
      }
      set_val(h, r, x);
      given[idx] = 1;
    }
  for (int i = 0; i < NROWS; i++) {
    const struct hrow *r = &ROWS[i];
    if (given[i] || !row_in(r, method)) continue;
    double d = grpo && !isnan(r->grpo) ? r->grpo : r->dflt;
    if (d != D_DERIVED) set_val(h, r, d);
  }
  if (method == METHOD_DPO && h->label_smoothing != 0 &&
      (h->loss_type == DPO_LOSS_HINGE || h->loss_type == DPO_LOSS_IPO))
    add_err(errors, "label_smoothing",
            "%g: the %s loss has no label smoothing (sigmoid and "
            "robust have)",
            h->label_smoothing, DPO_LOSSES[h->loss_type]);
  if (method != METHOD_DAPO) return (int)(json_array_size(errors) - before);
  /* derived defaults */
  if (!given[find_row("overlong_buffer") - ROWS] && !grpo)
    h->overlong_buffer = h->max_new_tokens / 5;
  if (!given[find_row("eps_high") - ROWS]) h->eps_high = grpo ? h->eps_low : 0.28;
  int total = h->group_size * h->prompt_batch_size;
  if (!given[find_row("minibatch_size") - ROWS]) h->minibatch_size = total >= 4 ? total / 4 : 1;

  /* cross-field checks: the ones that make the maths meaningless */
  if (h->overlong_buffer > h->max_new_tokens)
    add_err(errors, "overlong_buffer", "%d exceeds max_new_tokens (%d)", h->overlong_buffer,
            h->max_new_tokens);
  if (h->minibatch_size > total)
    add_err(errors, "minibatch_size",
            "%d exceeds the responses of a step (group_size %d x prompt_batch_size %d = %d)",
            h->minibatch_size, h->group_size, h->prompt_batch_size, total);
  if (h->dual_clip_c != 0 && h->dual_clip_c <= 1)
    add_err(errors, "dual_clip_c", "%g must be 0 (off) or greater than 1", h->dual_clip_c);
  if (!h->dynamic_sampling) h->gen_batch_multiplier = 1; /* one round of exactly the batch */
  return (int)(json_array_size(errors) - before);
}

int hparams_sft_total_steps(const struct hparams *h, int64_t lines) {
  int64_t per_epoch = h->batch_size > 0 ? (lines + h->batch_size - 1) / h->batch_size : 1;
  int64_t n = (per_epoch < 1 ? 1 : per_epoch) * (h->epochs < 1 ? 1 : h->epochs);
  return n > INT_MAX ? INT_MAX : (int)n;
}

double hparams_lr_at(const struct hparams *h, int64_t step, int64_t total) {
  int64_t w = h->lr_warmup_steps;
  if (w > 0 && step + 1 < w) return h->learning_rate * (double)(step + 1) / (double)w;
  if (h->method == METHOD_DAPO || h->lr_schedule == LR_CONSTANT || total <= w)
    return h->learning_rate;
  double progress = (double)(step - (w > 0 ? w : 0)) / (double)(total - (w > 0 ? w : 0));
  if (progress < 0) progress = 0;
  if (progress > 1) progress = 1;
  if (h->lr_schedule == LR_LINEAR) return h->learning_rate * (1 - progress);
  return h->learning_rate * 0.5 * (1 + cos(M_PI * progress));
}

json_t *hparams_to_json(const struct hparams *h) {
  json_t *o = json_object();
  for (int i = 0; i < NROWS; i++) {
    const struct hrow *r = &ROWS[i];
    if (!row_in(r, h->method)) continue;
    double x = get_val(h, r);
    json_t *v = NULL;
    switch (r->type) {
    case H_INT: v = json_integer((json_int_t)x); break;
    case H_NUM: v = json_real(x); break;
    case H_BOOL: v = json_boolean(x != 0); break;
    case H_ENUM: v = json_string(r->choices[(int)x]); break;
    }
    json_object_set_new(o, r->name, v);
  }
  return o;
}

const char *hparams_loss_agg_name(int agg) {
  return agg >= 0 && agg <= 2 ? AGGS[agg] : "?";
}

/* One value of row r in the API's type: a number, boolean or choice name; null when derived. */
static json_t *row_value(const struct hrow *r, double x) {
  if (x == D_DERIVED) return json_null();
  switch (r->type) {
  case H_INT: return json_integer((json_int_t)x);
  case H_NUM: return json_real(x);
  case H_BOOL: return json_boolean(x != 0);
  case H_ENUM: return json_string(r->choices[(int)x]);
  }
  return json_null();
}

json_t *hparams_describe(void) {
  static const char *const TYPES[] = {"integer", "number", "boolean", "string"};
  json_t *a = json_array();
  for (int i = 0; a && i < NROWS; i++) {
    const struct hrow *r = &ROWS[i];
    json_t *ms = json_array();
    for (int m = 0; ms && METHODS[m]; m++)
      if (row_in(r, m)) json_array_append_new(ms, json_string(METHODS[m]));
    json_t *o = ms ? json_pack("{s:s, s:s, s:o, s:o, s:s, s:o}", "name", r->name, "type",
                               TYPES[r->type], "default", row_value(r, r->dflt), "grpo_default",
                               row_value(r, isnan(r->grpo) ? r->dflt : r->grpo), "help", r->help,
                               "methods", ms)
                   : NULL;
    if (o && (r->type == H_INT || r->type == H_NUM)) {
      json_object_set_new(o, "minimum", row_value(r, r->min));
      json_object_set_new(o, "maximum", row_value(r, r->max));
      /* a bound left out of the range: beta (0, 2], label_smoothing [0, 0.5) */
      if (r->only & OPEN_MIN) json_object_set_new(o, "exclusive_minimum", json_true());
      if (r->only & OPEN_MAX) json_object_set_new(o, "exclusive_maximum", json_true());
    }
    if (o && r->type == H_ENUM) {
      json_t *c = json_array();
      for (int k = 0; c && r->choices[k]; k++) json_array_append_new(c, json_string(r->choices[k]));
      json_object_set_new(o, "choices", c);
    }
    if (!o || json_array_append_new(a, o)) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}
