/* A job spec: what a job trains (method, model, data, judge, hyperparameters, seed, chat
 * template, episodes),
 * parsed from the body of POST /v1/jobs or a `dapod train` job file and validated field by field.
 * The runner (runner.h) runs one; the daemon stores the body it was parsed from. */
#ifndef DAPO_JOBSPEC_H
#define DAPO_JOBSPEC_H

#include <stdint.h>

#include <jansson.h>

#include "episode.h"
#include "hparams.h"
#include "judge.h"
#include "lora.h"

/* The dtype of a checkpoint's model.safetensors (job field `checkpoint_dtype`). AUTO: the
 * source's (bfloat16 when the model folder's config.json says torch_dtype bfloat16, else
 * float32: presets, F32 and F16 folders). */
enum ckpt_dtype { CKPT_DTYPE_AUTO = 0, CKPT_DTYPE_FLOAT32, CKPT_DTYPE_BFLOAT16 };

struct job_spec {
  char *model;           /* preset name or model folder path (owned) */
  char *training_file;   /* path (owned) */
  char *validation_file; /* path or NULL (owned) */
  json_t *judge;         /* judge spec object (owned reference) */
  struct hparams hp;     /* resolved */
  uint64_t seed;
  char *job_id;          /* name used in judge requests; "job-local" by default (owned) */
  json_t *chat_template; /* how `messages` prompts are rendered (core/text/chat.h): NULL when the
                            body has none ("auto": the model's own template), else the given
                            value (owned reference) */
  enum ckpt_dtype checkpoint_dtype;
  int checkpoint_dtype_given; /* the body named it (the resolved spec then records it) */
  int has_adapter;            /* the body's `adapter`: train a LoRA adapter (lora.h) on the
                                 frozen model instead of every weight */
  struct lora_config adapter;
  int processes; /* the body's resources.processes: ranks of a data-parallel job (1: this
                    process). Not part of jobspec_to_json: where a job runs is not what it
                    computes, so a job may resume under another count */
  struct episode_spec episode; /* multi-turn episodes with tools (episode.h); .on 0: none */
  int method_given; /* the body named `method` (hp.method holds it): a DAPO job's resolved spec
                       then records it, so that specs of jobs without it stay as they were */
  json_t *response_format; /* the body's `response_format` (structured outputs: the sampling is
                              constrained to it, jsongrammar.h), checked; NULL when absent, null
                              or {"type": "text"} (owned reference) */
};

#define JOBSPEC_PROCESSES_MAX 4096

/* The name of d as the job body writes it ("auto", "float32", "bfloat16"). */
const char *jobspec_dtype_name(enum ckpt_dtype d);

/* Parses and validates a job body (borrowed). Problems are appended to errors (a JSON array) as
 * {"field", "message"}; returns their count (0: s is usable; release it with jobspec_deinit in
 * any case). Files are paths here: the daemon maps file ids to paths before calling. The judge
 * spec is checked with judge_new under pol (NULL: the loopback default). */
int jobspec_parse(const json_t *body, const struct judge_policy *pol, struct job_spec *s,
                  json_t *errors);
/* The resolved spec (every hyperparameter with its value), a new reference. */
json_t *jobspec_to_json(const struct job_spec *s);
void jobspec_deinit(struct job_spec *s);

#endif
