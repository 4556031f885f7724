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
#include "dpo.h"
#include "episode.h"
#include "jsongrammar.h"
#include "lm.h"
#include "rng.h"
#include "runner.h"
#include "sampler.h"
#include "sft.h"
#include "toolcall.h"
#include "tools.h"
#include "train.h"

/* What an episode did (runner_episode.c), for the step's metrics and its rollouts line. A plain
 * struct: a data-parallel job's exchange sends it as bytes. */
struct ep_stats {
  int turns, tool_calls, world_tokens;
  int tool_errors[TOOL_ERR_COUNT]; /* by how each answer went (an environment's calls too) */
  double tool_ms;                  /* the calls' latencies, summed (an environment's too) */
  int env_steps;                   /* an environment's /step replies */
  int env_rewards;                 /* its non-null rewards, /reset's included */
  double env_reward;               /* their sum */
  int env_failed;                  /* a call failed, retries spent (on_env_error "drop") */
};

/* How an episode ended (finish_reason): its model gave a final answer (stop), ran out of model
 * tokens (length) or of turns (max_turns), the world's answer did not fit (truncated), the
 * environment said it was done (done), or its environment failed (error: on_env_error "drop").
 * The names are shown: new reasons go at the end. */
enum ep_finish {
  EPF_NONE = 0,
  EPF_STOP,
  EPF_LENGTH,
  EPF_MAX_TURNS,
  EPF_TRUNCATED,
  EPF_DONE,
  EPF_ERROR,
  EPF_COUNT
};

/* How a job's `messages` prompts are rendered (runner.c: episode_prompts): with the tools a
 * multi-turn job's model calls in its family's format (NULL: none), and whether they end with
 * the generation prompt (not when an environment speaks first in the family's format). */
struct prompt_form {
  enum tc_format format; /* the job's call format */
  json_t *tools;         /* owned */
  int gen;
  int line_tools; /* a line's own tools replace `tools` in its prompt (chat templates that render
                     tools: a multi-turn job in its family's format, or a single-turn job) */
};

/* One sampled response, or one multi-turn episode. */
struct ro {
  int item, round, group, index; /* dataset item; generation round; group number in the step */
  int *toks;                     /* [seq_len] tokens after the prompt (owned): the response, or
                                    an episode's turns and the world's answers between them */
  unsigned char *trained;        /* [seq_len] 1 on the model's own tokens (owned); NULL: every
                                    token is the model's (a single turn) */
  float *slogp;                  /* [len] sampler log-probs of the model's tokens (owned) */
  float *lp_old, *lp_ref;        /* [len] recomputed log-probs (owned, kept responses) */
  int len, seq_len, truncated;   /* the model's tokens; every token after the prompt */
  char *text;                    /* the decoded response, an episode's final answer (owned) */
  double reward_raw, reward, adv;
  int correct, jmask, penalised, judged, kept, in_loss;
  json_t *info;
  json_t *turns; /* an episode's turns (owned; runner_out.c writes them), or NULL */
  enum ep_finish finish;
  struct ep_stats es;
};

struct trainer {
  const struct job_spec *spec;
  const struct hparams *hp;
  const struct runner_hooks *h;
  const struct runner_opts *o;
  struct runner_result *res;
  char out[PATH_MAX - 64];

  struct lm lm;
  struct chat_template *chat;     /* renders `messages` prompts; NULL until one needs it */
  struct prompt_form prompt_form; /* how its `messages` prompts are rendered */
  int chat_stop[2], n_chat_stop;  /* the chat template's end-of-turn token */
  struct model *ref;              /* frozen starting weights when kl_coef > 0 (full fine-tunes) */
  int ref_base;                   /* kl_coef > 0 with an adapter: the reference is the base, the
                                     adapter switched off (no second copy) */
  struct adamw opt;
  int have_opt;
  int ckpt_bf16; /* checkpoints' model.safetensors in BF16 (checkpoint_dtype, resolved) */
  struct train_state *ts;
  struct gen_state *gs;
  struct judge *judge;
  struct toolbox *tools;      /* a multi-turn job's tools or environment (toolbox_is_env), or
                                 NULL */
  enum tc_format tool_format; /* how its model calls them */
  const char **tool_names;    /* [toolbox_count] (borrowed from tools) */
  json_t **item_json;         /* per training item, its fields for the tools (built lazily) */
  json_t **vitem_json;        /* per validation item, the same */
  struct dataset *train, *val;
  int **ids, *ids_len;    /* prompt token ids per training item */
  int **vids, *vids_len;  /* per validation item */
  char **texts, **vtexts; /* rendered `messages` prompts per item (NULL for `prompt` items) */
  struct ds_cursor cursor;
  int64_t step;
  int cap_t, cap_tokens, gen_cap;
  int after_prompt; /* tokens a sequence may hold after its prompt (episode_after_prompt) */
  struct sampler_opts so;

  struct ro *ros;
  int n_ro, cap_ro;

  /* batch scratch, carved out of one allocation by scratch_layout (runner.c), which the memory
   * plan also counts with */
  char *scratch;
  /* capacity cap_tokens */
  int *b_tok, *b_off, *b_plen;
  unsigned char *b_trained; /* [cap_tokens] a multi-turn job's loss mask (NULL otherwise) */
  int b_masked;             /* the packed batch holds an episode: b_trained applies */
  float *b_logp, *b_ent, *b_w, *b_old, *b_ref;
  int *mb_len;
  double *mb_adv;
  struct ro **b_ro; /* the responses of the current micro-batch */
  /* generation scratch, capacity gen_cap sequences */
  int *g_tok, *g_len, *g_fin, *g_plen;
  float *g_logp;
  struct rng *g_rng;
  const int **g_prompts;
  /* a supervised job's (runner_sft.c): its examples, steps and this epoch's order; a DPO job's
   * (runner_dpo.c) steps, order and buffers too */
  struct sft_example *sft_train, *sft_val;
  int n_sft_train, n_sft_val;
  int64_t sft_total_steps;
  int *sft_order, sft_order_epoch; /* [n_sft_train], the permutation of epoch sft_order_epoch */
  float *sft_logp;                 /* [cap_tokens] */
  unsigned char *sft_hit;          /* [cap_tokens] */
  int eval_epoch_end; /* the evaluation runs at an epoch's end: full_valid/ names too */
  /* a DPO job's (runner_dpo.c): its pairs and their reference's sequence log-probs */
  struct dpo_pair *dpo_train, *dpo_val;
  int n_dpo_train, n_dpo_val;
  double *dpo_ref_train, *dpo_ref_val; /* [2 n]: pair i's chosen at 2i, rejected at 2i + 1 */
  int *dpo_prefix_of;                  /* [cap_tokens] the micro-batch's fwd_batch.prefix_of */
  /* structured outputs (spec->response_format; jk NULL: none): the grammar, vocabulary and
   * masker, one each for the job (runner_json.c); a matcher per sequence generated at once, fed
   * the drawn tokens; and the allowed ids of the packed micro-batch's response tokens */
  struct jgrammar *jg;
  struct jvocab *jv;
  struct jmasker *jk;
  struct jmatch **jm; /* [gen_cap] */
  int *j_fed;         /* [gen_cap] tokens fed to each matcher */
  int j_failed;       /* set by the hooks: 1 out of memory, 2 a matcher allows no id */
  uint64_t *b_allow;  /* [cap_resp * (V + 63) / 64]: a bitset row per response token (in
                         scratch, scratch_layout) */
  int b_allow_ns;     /* the sequences of the micro-batch b_allow holds (0: not computed) */
};

/* ---- runner_json.c: structured outputs ---- */

/* Compiles spec->response_format for the job's vocabulary and stop ids (so: after them; b_allow
 * is carved with the batch scratch). 0 (also without one), or 1 with res set. */
int trainer_json_setup(struct trainer *t);
void trainer_json_teardown(struct trainer *t);
/* Constrains the next gen_run of ns sequences (fresh matchers, the hooks set); after it,
 * trainer_json_end: 0, or 1 with res set when a hook failed. Nothing without a response_format. */
void trainer_json_begin(struct trainer *t, int ns);
int trainer_json_end(struct trainer *t);
/* The allowed ids of the packed micro-batch's ns sequences (b_allow), replayed through a fresh
 * matcher each; NULL without a response_format. NULL with res set on failure (*failed 1). */
const uint64_t *trainer_json_allowed(struct trainer *t, int ns, int *failed);

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

/* The call format of chat's family when it renders tools (chatml and qwen3: qwen; llama3.2:
 * llama3_json), else (NULL too) dapod. */
enum tc_format trainer_family_format(const struct chat_template *chat);

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
/* This rank's part [*lo, *hi) of k things (prompts of a round, responses of a minibatch, a
 * supervised step's examples, a DPO step's pairs): ranks take consecutive runs of equal size (the
 * first ones one fewer when k does not divide), the same on every run. */
void trainer_share(const struct trainer *t, int k, int *lo, int *hi);
/* A data-parallel job's gradient (the adapter's with one): the sum of every rank's, in place
 * (collective). Returns the bytes summed (0 alone). */
int64_t trainer_sum_grads(struct trainer *t);
/* Cancel (bit 1) and pause (bit 2) requests, or-ed over the ranks (collective): every rank
 * takes the same decision even when a signal reached only some of them. */
enum { TRAINER_CANCEL = 1, TRAINER_PAUSE = 2 };
int trainer_requests(struct trainer *t);
/* A log line at t->step ("info", "warning"). 0, or 1 with res set. */
int trainer_log(struct trainer *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* out/checkpoints/step-N into buf. */
void trainer_ckpt_path(const struct trainer *t, int64_t step, char *buf, size_t cap);

/* The start of a run (runner.c), for both methods: the out folder, the model (from the checkpoint
 * of step `from`, whose spec must be this one, or fresh; -1: a fresh run), the adapter, the KL
 * reference, AdamW and the gradients. 0, or 1 with res set. */
int trainer_setup_model(struct trainer *t, int64_t from);
/* The model's config and tokenizer (no weights) into *lm for runner_check_data, its facts into
 * f; 1 with a problem under "model" when it does not open (lm then needs no lm_close). */
int trainer_open_meta(const struct job_spec *s, struct runner_data_facts *f, struct lm *lm,
                      json_t *errors);
/* ---- runner_sft.c ---- */
/* A supervised job's parts of runner_run's loop. Set-up (trainer_setup_model, the files
 * encoded, t->sft_total_steps, the buffers); step t->step (already
 * incremented) with its metrics in *metrics_out (owned) and its trained tokens; valid/loss and
 * valid/mean_token_accuracy over the whole validation file; teardown (after a failure too).
 * 0, or 1 with res set. */
int trainer_sft_setup(struct trainer *t, int64_t from);
int trainer_sft_step(struct trainer *t, json_t **metrics_out, int64_t *train_tokens_out);
int trainer_sft_evaluate(struct trainer *t);
void trainer_sft_teardown(struct trainer *t);
/* runner_check_data for a supervised job: the model's config and tokenizer, its chat template,
 * every line of its files checked and encoded (field training_file or validation_file, the
 * message naming the line); f->max_prompt_tokens the longest example. */
int sft_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors);
/* What a supervised or DPO job's data check reads of one file (runner_sft.c's and runner_dpo.c's
 * loaders): its examples' count *n, the longest sequence the model sees *seq and the most tokens
 * of one example as a micro-batch packs it *packed (each left as it is when larger is not
 * found). 0, or the file's first error in e (naming the line and field). */
typedef int (*trainer_demo_load)(const char *path, const struct lm *lm,
                                 const struct chat_template *chat, int end_id,
                                 const struct hparams *hp, int *n, int *seq, int *packed,
                                 struct dapo_err *e);
/* runner_check_data for a supervised or DPO job: the model's config and tokenizer, its chat
 * template, every line of its files checked and encoded by load (errors under training_file or
 * validation_file; too_long when a sequence passes the model's context); f->max_prompt_tokens
 * the most tokens of one packed example, f->train_examples the training file's. */
int trainer_demo_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors,
                            trainer_demo_load load, const char *too_long);
/* The chat template of a job's `messages` lines: the job's, else the model's own (NULL when it
 * has none: such lines are then refused by sft_encode). 0, or a template the job gives that does
 * not build (e says why). */
int trainer_sft_chat(const struct job_spec *s, const struct lm *lm, struct chat_template **chat,
                     struct dapo_err *e);
/* The id that ends a completion: the model's first EOS (config or generation config), else the
 * tokenizer's. */
int trainer_sft_end_id(const struct lm *lm);
/* The order of epoch `epoch` (a permutation of the n training items keyed by seed and epoch)
 * into t->sft_order. */
void trainer_sft_epoch_order(struct trainer *t, int epoch, int n);
/* Steps of an epoch of a supervised or DPO job: ceil(n / batch_size) of its n training items. */
int64_t trainer_sft_epoch_steps(const struct trainer *t);
/* An evaluation's metrics m at an epoch's end (t->eval_epoch_end): each valid/x also as
 * full_valid/x (the validation is over the whole file at every evaluation, so the epoch's full
 * validation is that pass under its own names, docs/TRAINING.md). 0, or 1 (out of memory). */
int trainer_sft_full_valid(const struct trainer *t, json_t *m);
/* The start of a supervised or DPO job's set-up: trainer_setup_model, its chat template
 * (t->chat). 0, or 1 with res set. */
int trainer_sft_begin(struct trainer *t, int64_t from);
/* The buffers of a supervised or DPO job: micro-batches of cap tokens, sequences of at most
 * longest tokens, an order of n_order items; the train state. 0, or 1 with res set. */
int trainer_sft_buffers(struct trainer *t, int cap, int longest, int n_order);
/* ---- runner_dpo.c ---- */
/* A DPO job's parts of runner_run's loop, as a supervised job's: set-up (the model, the pairs
 * encoded, the reference's log-probs, the buffers), step, validation over the whole file,
 * teardown; dpo_check_data for runner_check_data. */
int trainer_dpo_setup(struct trainer *t, int64_t from);
int trainer_dpo_step(struct trainer *t, json_t **metrics_out, int64_t *train_tokens_out);
int trainer_dpo_evaluate(struct trainer *t);
void trainer_dpo_teardown(struct trainer *t);
int dpo_check_data(const struct job_spec *s, struct runner_data_facts *f, json_t *errors);
/* ---- runner_step.c ---- */

/* Progress of a long pass (runner_hooks.progress): told at its start and at each twentieth. */
#define PROGRESS_PARTS 20
struct progress {
  struct trainer *t;
  struct runner_progress p;
  int on;    /* the hook is set and the pass is long enough (runner_opts.progress_min_work) */
  int shown; /* twentieths of the pass reported so far */
};
void progress_begin(struct progress *g, struct trainer *t, const char *pass, int round,
                    int64_t total, double work);
void progress_at(struct progress *g, int64_t done, int64_t tokens, int64_t parts);

/* Frees the step's rollouts (the array is kept for the next step). */
void trainer_clear_rollouts(struct trainer *t);
/* Runs step t->step (already incremented): STEP_OK with its metrics in *metrics_out (owned) and
 * its token counts, STEP_PAUSED, or STEP_STOP with res set. */
int trainer_step(struct trainer *t, json_t **metrics_out, int64_t *gen_tokens_out,
                 int64_t *train_tokens_out);
/* Samples eval_samples responses for the validation prompts at eval_temperature and tells their
 * accuracy and pass@k as t->step's evaluation metrics. 0, or 1 with res set. */
int trainer_evaluate(struct trainer *t);

/* ---- runner_episode.c ---- */

/* Runs k episodes for each of n prompts of d (items[i] indexes ids/lens), appending one ro per
 * episode, as generate() does for single responses (runner_step.c): sampling with so, the same
 * streams for turn 0, the group numbers group0 + i, the key key0 + i of each prompt, progress as
 * the pass `pass`. 0, or 1 with res set. */
int trainer_episodes(struct trainer *t, const struct dataset *d, int n, const int *items,
                     int *const *ids, const int *lens, int k, const struct sampler_opts *so,
                     uint64_t tag, uint64_t a, int key0, int group0, int round, const char *pass,
                     int *n_tokens);
/* RNG stream for (purpose, a, b, c): a 64-bit mix so that streams never collide in practice. */
uint64_t trainer_stream(uint64_t tag, uint64_t a, uint64_t b, uint64_t c);
/* The name of an episode's finish ("stop", "length", "max_turns", "truncated"). */
const char *ep_finish_name(enum ep_finish f);

/* ---- runner_out.c ---- */

/* Writes rollouts/step-N.jsonl (every response of the step, API.md "Rollouts file"),
 * atomically. 0, or 1 with res set. */
int trainer_write_rollouts(struct trainer *t);
/* Writes the checkpoint of t->step (weights, tokenizer, optimizer, trainer state) atomically
 * unless it exists, prunes beyond keep_checkpoints, reads its manifest and tells the checkpoint
 * hook. metrics: the step's (borrowed; NULL at step 0). 0, or 1 with res set. */
int trainer_checkpoint(struct trainer *t, const json_t *metrics);

#endif
