/* Internal: the job runner's insides, shared by its three files (not a public header):
 *   runner.c       set-up from the spec (model, datasets, judge, buffers by one plan), teardown,
 *                  the memory plan and the pre-queue check, and runner_run's loop
 *   runner_step.c  one DAPO step (DAPO.md steps 1-7): generation, judging, reward shaping,
 *                  dynamic sampling, the update's minibatch epochs, its metrics; evaluation
 *   runner_out.c   what a run leaves: rollouts files, atomic checkpoints and their pruning
 * Dimension letters follow the kernels' legend (core/engine/kernels.h): T tokens of a sequence, N
 * tokens of a packed batch; G group_size; plus the runner's own: P prompts of a step, S sequences
 * generated at once (gen_cap), R response tokens per sequence (max_new_tokens). */
#ifndef DAPO_RUNNER_IMPL_H
#define DAPO_RUNNER_IMPL_H

#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "adamw.h"
#include "chat.h"
#include "dataset.h"
#include "dist.h"
#include "lm.h"
#include "rng.h"
#include "runner.h"
#include "sampler.h"
#include "train.h"

/* One sampled response. */
struct ro {
  int item, round, group, index; /* dataset item; generation round; group number in the step */
  int *toks;                     /* [len] response tokens (owned) */
  float *slogp;                  /* [len] sampler log-probs (owned) */
  float *lp_old, *lp_ref;        /* [len] recomputed log-probs (owned, kept responses) */
  int len, truncated;
  char *text; /* decoded response (owned) */
  double reward_raw, reward, adv;
  int correct, jmask, penalised, judged, kept, in_loss;
  json_t *info;
};

struct trainer {
  const struct job_spec *spec;
  const struct hparams *hp;
  const struct runner_hooks *h;
  const struct runner_opts *o;
  struct runner_result *res;
  char out[PATH_MAX - 64];

  struct lm lm;
  struct chat_template *chat;    /* renders `messages` prompts; NULL until one needs it */
  int chat_stop[2], n_chat_stop; /* the chat template's end-of-turn token */
  struct model *ref;             /* frozen starting weights when kl_coef > 0 (full fine-tunes) */
  int ref_base;                  /* kl_coef > 0 with an adapter: the reference is the base, the
                                    adapter switched off (no second copy) */
  struct adamw opt;
  int have_opt;
  int ckpt_bf16; /* checkpoints' model.safetensors in BF16 (checkpoint_dtype, resolved) */
  struct train_state *ts;
  struct gen_state *gs;
  struct judge *judge;
  struct dataset *train, *val;
  int **ids, *ids_len;    /* prompt token ids per training item */
  int **vids, *vids_len;  /* per validation item */
  char **texts, **vtexts; /* rendered `messages` prompts per item (NULL for `prompt` items) */
  struct ds_cursor cursor;
  int64_t step;
  int cap_t, cap_tokens, gen_cap;
  struct sampler_opts so;

  struct ro *ros;
  int n_ro, cap_ro;

  /* batch scratch, carved out of one allocation by scratch_layout (runner.c), which the memory
   * plan also counts with */
  char *scratch;
  /* capacity cap_tokens */
  int *b_tok, *b_off, *b_plen;
  float *b_logp, *b_ent, *b_w, *b_old, *b_ref;
  int *mb_len;
  double *mb_adv;
  struct ro **b_ro; /* the responses of the current micro-batch */
  /* generation scratch, capacity gen_cap sequences */
  int *g_tok, *g_len, *g_fin, *g_plen;
  float *g_logp;
  struct rng *g_rng;
  const int **g_prompts;
};

/* How a step ended: trained (STEP_OK), stopped with res set (STEP_STOP), or paused between
 * generation rounds before anything was trained (STEP_PAUSED). */
enum { STEP_OK = 0, STEP_STOP = 1, STEP_PAUSED = 2 };

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void trainer_phase(struct trainer *t, const char *p) {
  if (t->h && t->h->phase) t->h->phase(t->h->ctx, p);
}

/* The job's ranks (runner_opts.dist): NULL alone. */
static inline const struct dist *trainer_dist(const struct trainer *t) {
  return t->o ? t->o->dist : NULL;
}
static inline int trainer_rank(const struct trainer *t) {
  return dist_rank(trainer_dist(t));
}

static inline int trainer_cancelled(const struct trainer *t) {
  /* the flags are set by another thread (the daemon's workers): relaxed atomic loads */
  return t->o && t->o->cancel && __atomic_load_n(t->o->cancel, __ATOMIC_RELAXED);
}
static inline int trainer_pause_requested(const struct trainer *t) {
  return t->o && t->o->pause && __atomic_load_n(t->o->pause, __ATOMIC_RELAXED);
}

/* ---- runner.c: failures and what the hooks are told ---- */

/* Records a failure in res (code from core/rl/failure.h, param the field at fault or NULL); returns
 * 1, the "stop" signal of the step functions. */
int trainer_fail(struct trainer *t, enum failure code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A failure from a libdapo call: out of memory and I/O are the system's, whatever code says. */
int trainer_fail_err(struct trainer *t, enum failure code, const char *param,
                     const struct dapo_err *e);
int trainer_oom(struct trainer *t);
/* A hook refused what it was told (the daemon could not record it): FAIL_EVENT_STORE_FAILED. */
int trainer_hook_failed(struct trainer *t, const char *what);
/* Tells the metrics of step t->step (m stolen; eval: an evaluation's). 0, or 1 with res set. */
int trainer_emit_metrics(struct trainer *t, json_t *m, int eval, int64_t gen_tokens,
                         int64_t train_tokens);
/* A data-parallel job's agreement point (collective: every rank calls it at the same place with
 * its own stop flag): 1 on every rank when any rank stopped, with the failure of the lowest
 * such rank copied into every rank's res, so that all ranks end the same way. One process:
 * returns stop. */
int trainer_agree(struct trainer *t, int stop);
/* Cancel (bit 1) and pause (bit 2) requests, or-ed over the ranks (collective): every rank
 * takes the same decision even when a signal reached only some of them. */
enum { TRAINER_CANCEL = 1, TRAINER_PAUSE = 2 };
int trainer_requests(struct trainer *t);
/* A log line at t->step ("info", "warning"). 0, or 1 with res set. */
int trainer_log(struct trainer *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* out/checkpoints/step-N into buf. */
void trainer_ckpt_path(const struct trainer *t, int64_t step, char *buf, size_t cap);

/* ---- runner_step.c ---- */

/* Frees the step's rollouts (the array is kept for the next step). */
void trainer_clear_rollouts(struct trainer *t);
/* Runs step t->step (already incremented): STEP_OK with its metrics in *metrics_out (owned) and
 * its token counts, STEP_PAUSED, or STEP_STOP with res set. */
int trainer_step(struct trainer *t, json_t **metrics_out, int64_t *gen_tokens_out,
                 int64_t *train_tokens_out);
/* Samples eval_samples responses for the validation prompts at eval_temperature and tells their
 * accuracy and pass@k as t->step's evaluation metrics. 0, or 1 with res set. */
int trainer_evaluate(struct trainer *t);

/* ---- runner_out.c ---- */

/* Writes rollouts/step-N.jsonl (every response of the step, API.md "Rollouts file"),
 * atomically. 0, or 1 with res set. */
int trainer_write_rollouts(struct trainer *t);
/* Writes the checkpoint of t->step (weights, tokenizer, optimizer, trainer state) atomically
 * unless it exists, prunes beyond keep_checkpoints, reads its manifest and tells the checkpoint
 * hook. metrics: the step's (borrowed; NULL at step 0). 0, or 1 with res set. */
int trainer_checkpoint(struct trainer *t, const json_t *metrics);

#endif
