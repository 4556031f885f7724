/* The job runner: turns a job spec (the body of POST /v1/jobs) into DAPO steps over a model, a
 * training file and a judge, emitting events and metrics through hooks, writing checkpoints
 * (atomic folders with the optimizer and trainer state) and rollouts files under an output
 * folder, evaluating on a validation file, observing cancel/pause flags, and resuming from the
 * newest complete checkpoint bit-identically. Used by the daemon's workers and by
 * `dapod train`.
 *
 * Output folder layout (created as needed):
 *   checkpoints/step-N/  config.json, model.safetensors, tokenizer.json, generation_config.json,
 *                        optimizer.safetensors, trainer_state.json   (step 0: starting weights)
 *   rollouts/step-N.jsonl  one line per sampled response of step N (API.md "Rollouts file") */
#ifndef DAPO_RUNNER_H
#define DAPO_RUNNER_H

#include <stdint.h>

#include <jansson.h>

#include "checkpoint.h"
#include "error.h"
#include "failure.h"
#include "hparams.h"
#include "jobspec.h"
#include "model.h"
#include "judge.h"

struct pool;
struct dist;

/* What the runner tells its caller, typed (all hooks optional; called from the runner's thread;
 * pointers borrowed for the call). A non-zero return from metrics, checkpoint or log fails the
 * job with FAIL_EVENT_STORE_FAILED (the daemon could not record it).
 *
 * metrics: a training step's figures (after its checkpoint, if it has one) or an evaluation's
 *   (eval = 1; at step 0 before any training, and after the steps eval_every names). data holds
 *   every figure under its API.md name ("reward/mean", "eval/accuracy", ...) and "step"; the
 *   ones the daemon acts on are typed beside it.
 * checkpoint: a complete checkpoint folder, with the manifest its writer read (every file, its
 *   size and SHA-256) and the step's training metrics (NULL at step 0).
 * log: a line for the job's log ("info", "warning"), at a step.
 * phase: one of "loading", "sampling", "judging", "updating", "evaluating", "checkpointing".
 * progress: how far a long pass of the step has got (struct runner_progress): at its start
 *   (done 0), then whenever another twentieth of it is done, and at its end (done == total), so
 *   at most 21 reports a pass, paced by work done, never by the clock; passes of less work than
 *   runner_opts.progress_min_work report nothing. Its figures are deterministic (the same job
 *   reports the same progress). */
struct runner_metrics {
  int64_t step;
  int eval;                 /* 1: an evaluation's figures, 0: a training step's */
  int64_t tokens_generated; /* a training step's sampled tokens (0 for an evaluation) */
  int64_t tokens_trained;   /* a training step's tokens in the loss (0 for an evaluation) */
  const json_t *data;
};
struct runner_checkpoint {
  int64_t step;
  const char *path;                     /* the folder, renamed into place */
  const struct ckpt_manifest *manifest; /* its files (core/engine/checkpoint.h) */
  const json_t *metrics;                /* the step's training metrics; NULL at step 0 */
};
/* pass: "generation" (a round of dynamic sampling; done/total count its sequences finished,
 *   tokens its tokens sampled so far), "evaluation" (the validation prompts' generation, the same
 *   units), "old_logprob" (the forwards of pi_old and, with kl_coef > 0, of the reference, micro-
 *   batch by micro-batch: done/total count micro-batch forwards, tokens the tokens through the
 *   model so far, prompts included), "update" (every epoch's micro-batches, forward and
 *   backward; the same units). total is known at the pass's start (the packing is counted
 *   ahead, one count per epoch's order) and never changes during it. */
struct runner_progress {
  int64_t step;
  const char *pass;
  int round;           /* generation: the round of dynamic sampling (from 1); else 0 */
  int64_t done, total; /* sequences finished / of the pass, or micro-batches run / of the pass */
  int64_t tokens;      /* tokens sampled, or through the model, so far in the pass */
};
struct runner_hooks {
  void *ctx;
  int (*metrics)(void *ctx, const struct runner_metrics *m);
  int (*checkpoint)(void *ctx, const struct runner_checkpoint *c);
  int (*log)(void *ctx, const char *level, int64_t step, const char *message);
  void (*phase)(void *ctx, const char *phase);
  void (*progress)(void *ctx, const struct runner_progress *p);
};

/* The work below which a pass reports no progress (runner_opts.progress_min_work), in
 * parameter-tokens: the model's parameters times the pass's tokens (generation: its sequences
 * times max_new_tokens; the update counts 3 per token, forward and backward). 2e11 is about 4 s
 * of generation, or 3 s of update, of a 494M-parameter model on the 2-core development machine
 * (docs/TRAINING.md, "Progress"); the quick start's tiny model never reaches it. */
#define RUNNER_PROGRESS_MIN_WORK 200000000000LL

struct runner_opts {
  const struct judge_policy *judge_policy; /* NULL: loopback only */
  const volatile int *cancel;              /* non-zero: stop as soon as possible */
  const volatile int *pause;               /* non-zero: stop at the next safe point with a
                                              checkpoint of the last completed step */
  int stop_after_step;                     /* > 0: pause after this step (tests, CLI) */
  int compute_all; /* tests: run every response through the model, also where it cannot change
                      the update (zero advantage with kl_coef 0; the first minibatch's old
                      log-probs), to compare with the default, which skips that work */
  int64_t progress_min_work; /* passes of less work (parameter-tokens) report no progress;
                                 0: every pass reports. Callers pass RUNNER_PROGRESS_MIN_WORK
                                 unless they want every pass (tests) */
  const struct dist *dist;   /* the ranks of a data-parallel job (core/rl/dist.h; borrowed); NULL:
                                one process. Every rank runs runner_run on the same spec and out
                                folder; rank 0 alone writes there and calls the hooks */
  struct pool *pool; /* compute threads of this job (borrowed; core/engine/pool.h); NULL: serial
                        kernels with OpenBLAS's own threading. Results are reproducible for a given
                        thread count. */
};

enum runner_status { RUNNER_SUCCEEDED, RUNNER_PAUSED, RUNNER_CANCELLED, RUNNER_FAILED };

struct runner_result {
  enum runner_status status;
  int64_t step;         /* last completed step */
  int64_t resumed_from; /* step of the checkpoint the run started from (-1: fresh) */
  /* RUNNER_FAILED: why (core/rl/failure.h: name and category), the field at fault or "", and a
   * message naming the line, tensor or file */
  enum failure failure;
  char param[96];
  char message[512];
};

/* The memory a job allocates, by part, in bytes (what runner_run allocates at set-up; buffers
 * of the rollouts themselves, the dataset and the tokenizer are not counted). */
struct mem_plan {
  int64_t parameters;   /* floats of the model (a tied head counted once) */
  uint64_t weights;     /* parameters, float32 */
  uint64_t gradients;   /* one float per parameter */
  uint64_t optimizer;   /* AdamW's two moments */
  uint64_t reference;   /* the frozen reference model when kl_coef > 0, else 0 */
  uint64_t activations; /* the training pass's saved activations for micro_batch_tokens */
  uint64_t generation;  /* the sampler's KV cache and logits for the generation batch */
  uint64_t buffers;     /* the runner's per-token batch arrays */
  uint64_t trainable;   /* parameters the job trains: all of them, or the adapter's */
  uint64_t total;
  int cap_seq_len; /* longest sequence: max prompt tokens + max_new_tokens */
  int cap_tokens;  /* tokens of one micro-batch: micro_batch_tokens, at most minibatch_size
                      longest sequences */
  int gen_batch;   /* sequences generated at once */
};

/* The plan of a job on a model with config c and hyperparameters hp, whose longest prompt has
 * max_prompt_tokens tokens; with_validation when it has a validation file (eval_samples may
 * widen the generation batch). The same capacities runner_run allocates. */
struct lora_config;
/* With an adapter (NULL: a full fine-tune), the base is frozen: gradients and moments exist for
 * the adapter only, and the KL reference is the base itself (no second copy). */
/* ep: a multi-turn job's episodes (NULL or single turns: max_new_tokens after each prompt).
 * constrained: the job has a response_format (its update's allowed ids: a bitset of the
 * vocabulary per response token of a micro-batch, counted in buffers). */
void runner_memory_plan(const struct model_config *c, const struct lora_config *adapter,
                        const struct hparams *hp, const struct episode_spec *ep,
                        int max_prompt_tokens, int with_validation, int constrained,
                        struct mem_plan *p);

/* A job's plan once its model's config is known (runner_check_data's cfg: config.json as
 * lm_open_meta reads it, vocab_used from the tokenizer): the adapter (NULL: a full fine-tune)
 * checked against it as lora_config_check does (problems appended to errors), then
 * runner_memory_plan. The one sequence that runner_check_job, the daemon's admission and GET
 * /v1/models/{id} (through runner_plan_model) follow, so that they plan alike. *plan is filled
 * in any case; returns the adapter's problem count. */
int runner_plan_job(const struct model_config *c, const struct lora_config *adapter,
                    const struct hparams *hp, const struct episode_spec *ep, int max_prompt_tokens,
                    int with_validation, int constrained, struct mem_plan *plan, json_t *errors);

/* The plan of a job on model (what lm_open takes: a preset name or a folder) whose longest
 * prompt has max_prompt_tokens tokens and which has no validation file: the model's config and
 * tokenizer opened as runner_check_data opens them (lm_open_meta: no weights), then
 * runner_plan_job for single turns. Returns 0 with *plan; the adapter's problem count (> 0, in
 * errors); or a negative DAPO_E... code with e set when the model does not open (a job on it is
 * refused with field "model"). Reads the tokenizer on every call. */
int runner_plan_model(const char *model, const struct lora_config *adapter,
                      const struct hparams *hp, int max_prompt_tokens, struct mem_plan *plan,
                      json_t *errors, struct dapo_err *e);

/* A plan as the job object and GET /v1/models/{id} show it: bytes by part ("weights_bytes",
 * ..., "total_bytes") and the capacities under "for". New reference; NULL out of memory. */
json_t *mem_plan_to_json(const struct mem_plan *p);

/* What checking a job's data against its model learns (runner_check_data): whether the model's
 * config and tokenizer open (model_ok), its config, and the longest prompt in tokens. */
struct runner_data_facts {
  int model_ok;
  struct model_config cfg;
  int max_prompt_tokens;
  int model_adapter;              /* the model is an adapter checkpoint ... */
  struct lora_config adapter_cfg; /* ... whose adapter this is */
  int train_examples;             /* a supervised job's training examples (its steps:
                                     hparams_sft_total_steps); 0 for DAPO jobs */
};

/* The adapter a job trains: its own `adapter`, or on an adapter checkpoint that checkpoint's
 * adapter, which the job continues (its weights loaded, a fresh optimizer); NULL for a full
 * fine-tune. A job's `adapter` that differs from its adapter checkpoint's is a problem under
 * "adapter" (a new adapter needs a full model: `dapod merge` first). */
const struct lora_config *runner_job_adapter(const struct job_spec *s,
                                             const struct runner_data_facts *f, json_t *errors);

/* The part of runner_check_job that reads the model's config and tokenizer and every prompt of
 * the datasets (rendered, tokenized, checked against the context with max_new_tokens): what it
 * depends on is the model's files, the datasets, chat_template and max_new_tokens only, so that
 * a caller may keep its answer for those. Problems as runner_check_job; returns their count. */
int runner_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors);

/* Checks a parsed job against its model and data before it is queued, without loading weights:
 * the model's config and tokenizer open, every prompt of the datasets renders (chat template)
 * and fits the context with max_new_tokens. Problems are appended to errors as {"field",
 * "message"} (field "model", "chat_template", "training_file", "validation_file"; messages name
 * the line). *plan is the job's memory plan (for the longest prompt). Returns the problem count. */
int runner_check_job(const struct job_spec *s, struct mem_plan *plan, json_t *errors);

/* The newest complete checkpoint (a step-N folder with trainer_state.json) under
 * out_dir/checkpoints, the one runner_run resumes from; -1 when there is none. */
int64_t runner_latest_checkpoint(const char *out_dir);

/* Runs (or resumes) the job into out_dir. Returns 0 when res->status says what happened
 * (including a failed job, described in res), or a negative code only for invalid arguments. */
int runner_run(const struct job_spec *spec, const char *out_dir, const struct runner_hooks *h,
               const struct runner_opts *o, struct runner_result *res);

#endif
