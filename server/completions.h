/* The completion service behind POST /v1/completions: a bounded queue, cfg.completion_threads
 * sampling threads pinned to compute_cpus (each with its compute pool), memory admission in the
 * server's ledger (admit.h) beside the jobs, and a small cache of opened models.
 *
 * A completion is submitted with what the caller validated and resolved (the lm_open spec and the
 * registry's config of the model); it waits in the queue (first in, first started) until a
 * thread takes it. At the head, the thread admits it: the model's weights (unless a kept model
 * serves it) and then, once the prompt is encoded, the generation state of n sequences of
 * prompt + max_tokens tokens (gen_state_bytes) and the samples' arrays must fit what running jobs
 * and completions leave of the limit; kept models nobody uses are closed to make room; otherwise
 * the completion waits at the head (the next ones behind it), until memory comes free or its
 * caller gives up (completion_cancel). One that can never fit (weights plus its generation
 * state over the limit) is refused at once, naming max_tokens and n (or the model).
 *
 * lm_sample samples on the calling thread (its generation state has no pool), so a completion
 * uses exactly one core, its sampling thread's, and gives the tokens `dapod generate` gives for
 * the same prompt, seed and options, whatever the thread configuration.
 *
 * Opened models stay open for the next completion (at most cfg.completion_cache_models, least
 * recently used closed first), keyed by the lm_open spec and a stamp of the folder's files (name,
 * size, mtime, inode): a folder changed on disk is opened again. Their weights count in the ledger
 * as cached memory, which jobs and completions may take: kept models are closed when memory is
 * needed.
 *
 * Each choice is decoded as it is sampled (the tokenizer's streaming decoder), so that a stop
 * string ends its choice at the round that completed it (a gen_run step hook), and a streamed
 * completion can be read token by token while it runs (completion_token).
 *
 * When a completion is done, the service publishes its key on the server's bus (a streamed one
 * also when it starts and after each round), so that a caller can wait for it without holding a
 * thread (the HTTP layer suspends the connection).
 *
 * Thread-safety: every function may be called from any thread, except completions_free. */
#ifndef DAPOD_COMPLETIONS_H
#define DAPOD_COMPLETIONS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "error.h"
#include "lm.h"
#include "model.h"

struct server;
struct completions;
struct completion;

/* Stop strings a request may give (completion_req.stop). */
#define COMPLETION_STOP_MAX 4

/* completions_submit's refusals (beside DAPO_ENOMEM). */
enum {
  COMPLETIONS_EFULL = -120,     /* completion_queue completions are waiting already */
  COMPLETIONS_ESTOPPING = -121, /* the daemon is stopping */
};

/* A request as the caller validated it. Everything is copied by completions_submit. */
struct completion_req {
  const char *model;              /* the id as asked (for the log) */
  const char *spec;               /* what lm_open takes: a preset name or a folder's path */
  const struct model_config *cfg; /* the registry's config of spec: sizes the weights before
                                     they are loaded */
  const char *prompt;             /* prompt_len bytes of UTF-8 */
  size_t prompt_len;
  int max_tokens, n; /* >= 1 */
  int logprobs;      /* 1: also decode each sampled token alone (result pieces) */
  int top_logprobs;  /* with logprobs, 0..SAMPLER_TOP_MAX: each token's most likely alternatives
                        (samples.top_ids, top_logp, result top_pieces) */
  float temperature, top_p;
  uint64_t seed;
  /* Stop strings (non-empty UTF-8, at most COMPLETION_STOP_MAX): a choice ends as soon as its
   * text holds one, its text cut before it, finish FINISH_STOP. One that is a single token of the
   * model's tokenizer (a special token included) is also a stop id of the sampler. */
  const char *const *stop;
  int n_stop;
  int stream; /* 1: published on the bus as it grows, read with completion_token */
  /* Structured outputs: a response_format object the caller checked with jgrammar_new
   * (json_object or json_schema; NULL: free text). Each choice is then sampled under its mask
   * (core/text/jsongrammar.h) and ends, finish FINISH_STOP, as soon as its JSON is complete. */
  const json_t *response_format;
};

enum completion_state {
  COMPLETION_WAITING, /* queued, or at the head waiting for memory */
  COMPLETION_RUNNING, /* admitted: sampling */
  COMPLETION_DONE,    /* the result is there */
};

/* How a completion ended. The first six are results (completion_poll); BUSY and TIMEOUT are what
 * a caller answers when completions_submit refused it as full or its wait ended in
 * completion_cancel (counted here for /metrics). */
enum completion_outcome {
  COMPLETION_OK,
  COMPLETION_INVALID,   /* the model, the prompt or the sizes are refused: errors */
  COMPLETION_TOO_LARGE, /* can never fit memory_limit_bytes: errors names max_tokens and n, or
                           model */
  COMPLETION_STOPPING,  /* the daemon is stopping */
  COMPLETION_NO_MEMORY, /* an allocation failed: message */
  COMPLETION_FAILED,    /* sampling failed: message */
  COMPLETION_BUSY,
  COMPLETION_TIMEOUT,
  COMPLETION_OUTCOMES
};

/* Stable snake_case name of an outcome ("ok", "too_large", ...): the /metrics label. */
const char *completion_outcome_name(enum completion_outcome o);

/* A token as a reply shows it alone. */
struct completion_piece {
  char *text;  /* decoded alone, special tokens kept, invalid UTF-8 as U+FFFD (owned; NULL:
                  not decodable) */
  char *bytes; /* the raw bytes it stands for (tok_token_bytes: a piece of a character keeps
                  its own) (owned; NULL: not decodable) */
  size_t n_bytes;
};

struct completion_result {
  enum completion_outcome outcome;
  json_t *errors;    /* INVALID, TOO_LARGE: [{field, message}] (owned) */
  char message[512]; /* the other failures */
  int *prompt_ids;   /* OK: the encoded prompt, n_prompt ids (owned) */
  int n_prompt;
  struct lm_samples samples; /* OK: samples.n rows (owned); len[i] counts sample i's tokens up
                                to the one that ended it (a stop id, or the token that completed
                                a stop string: usage and logprobs describe exactly these) */
  char **text; /* OK: [samples.n] each sample decoded, special tokens left out, cut before the
                  first stop string */
  struct completion_piece *pieces;     /* OK with logprobs: [samples.n * samples.max_new], row i's
                                          first len[i] set: each sampled token */
  struct completion_piece *top_pieces; /* OK with top_logprobs (samples.top_k > 0):
                                          [samples.n * samples.max_new * top_k], as
                                          samples.top_ids: each alternative */
};

/* Starts the service (srv->admit, srv->bus and srv->cfg ready). Owned; NULL with e set. */
struct completions *completions_start(struct server *srv, struct dapo_err *e);

/* Shutdown, first half: no new completions; the waiting ones end COMPLETION_STOPPING (and are
 * published); those sampling finish. Idempotent. */
void completions_quiesce(struct completions *c);

/* Quiesces, joins the threads, closes the kept models and frees c (NULL is fine). Every
 * completion must have been released. */
void completions_free(struct completions *c);

/* Queues req. Returns 0 with *out (owned: completion_release); COMPLETIONS_EFULL or
 * COMPLETIONS_ESTOPPING with e saying why; DAPO_ENOMEM. */
int completions_submit(struct completions *c, const struct completion_req *req,
                       struct completion **out, struct dapo_err *e);

/* The bus key the service publishes t's end under (borrowed; lives as long as t). */
const char *completion_key(const struct completion *t);

/* t's state; when COMPLETION_DONE, *res (may be NULL) points to its result, borrowed until
 * completion_release. */
enum completion_state completion_poll(struct completion *t, const struct completion_result **res);

/* ---- streaming (completion_req.stream) ----
 * A streamed completion is published on the bus under its key as it grows: (key, 1) when it
 * starts sampling, one higher id after each round of sampling (one more token of every choice
 * still running), one more at its end. Its choices advance together, so choice i's token k is out
 * once every earlier round is. A reader reads completion_version first, then completion_poll and
 * completion_token, and waits on the bus for an id above that version: it misses nothing. */

/* The id t was last published under (0 before it started). */
int64_t completion_version(struct completion *t);

struct completion_token {
  int id;
  float logp;                           /* as lm_samples.logp */
  const struct completion_piece *piece; /* with logprobs: the token shown alone (borrowed until
                                           completion_release; NULL: no logprobs) */
  int n_top; /* top_logprobs: its alternatives, most likely first (borrowed as
                piece; n_top entries each) */
  const int *top_ids;
  const float *top_logp;
  const struct completion_piece *top;
  char *text; /* the text this token releases (owned: free()), len bytes: what follows
                 the previous token's, never part of a stop string; "" while the text
                 ends in what may begin one, or in an unfinished UTF-8 character; the
                 last token releases the rest. The concatenation over k is result text */
  size_t len;
  int finish; /* -1, or on the choice's last token its enum finish_reason */
};

/* Token k of choice i as far as t is sampled: 1 (*tk filled), 0 (not out yet), -1 (the choice
 * ended before k, or no such choice), DAPO_ENOMEM. */
int completion_token(struct completion *t, int i, int k, struct completion_token *tk);

/* The encoded prompt (borrowed until completion_release), once completion_poll said RUNNING, or
 * DONE with COMPLETION_OK. */
const int *completion_prompt_ids(struct completion *t, int *n);

/* Gives up on t if it has not started sampling: it leaves the queue (or the head) and 1 is
 * returned (counted as COMPLETION_TIMEOUT); 0 when it is running or done. */
int completion_cancel(struct completion *t);

/* The caller is done with t (NULL is fine): its result is freed once the service is done with it
 * too; one still queued leaves the queue, one sampling ends its choices after the current
 * round. */
void completion_release(struct completion *t);

/* Seconds a refused caller should wait before retrying: the completions ahead (waiting and
 * running) times the recent time of one, over the threads; 1..60. */
int completions_retry_after_s(struct completions *c);

/* What /metrics shows. */
struct completions_stats {
  int threads, queue_cap;
  int waiting;        /* queued or at the head (completion_queue counts these) */
  int waiting_memory; /* 1 while the head waits for memory */
  int running;        /* sampling now */
  int models_cached;  /* models kept open (in use or not) */
  uint64_t outcomes[COMPLETION_OUTCOMES];
  uint64_t model_loads, model_evictions;
};
void completions_stats(struct completions *c, struct completions_stats *out);

/* The memory a completion holds while it samples, beside its model's weights: the generation
 * state of n sequences of seq_len tokens (gen_state_bytes) and the samples' arrays for max_new
 * tokens each, with top_k alternatives each (their ids, log-probs and pieces). */
uint64_t completion_memory(const struct model_config *cfg, int n, int seq_len, int max_new,
                           int top_k);

#endif
