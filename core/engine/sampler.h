/* Batched generation with a KV cache: B sequences advance together, so each decoding step is one
 * GEMM per weight matrix ([B, C] x W^T), not B GEMVs. Sequences that share a prompt (same pointer
 * and length) share one prefill. Each sequence draws from its own struct rng, so a batch of G
 * gives the same tokens as G single runs with the same seeds. Not thread-safe: one state per
 * worker; allocated once for a capacity. */
#ifndef DAPO_SAMPLER_H
#define DAPO_SAMPLER_H

#include "error.h"
#include "model.h"
#include "rng.h"

#define SAMPLER_MAX_STOP 8
/* The most alternatives a step lists (sampler_opts.top_k): OpenAI's top_logprobs bound. */
#define SAMPLER_TOP_MAX 20

struct sampler_opts {
  float temperature;  /* 0: greedy (argmax) */
  float top_p;        /* (0, 1]; 1: no nucleus truncation */
  int max_new_tokens; /* >= 1 */
  int n_stop;         /* stop ids (EOS); a sampled stop id is part of the response */
  int stop_ids[SAMPLER_MAX_STOP];
  /* 0, or 1..SAMPLER_TOP_MAX (and at most the ids in use): gen_run also lists, for every token it
   * samples, the top_k most likely tokens of the distribution it drew from (gen_out.top_ids,
   * top_logp). What is sampled never depends on it. gen_advance ignores it. */
  int top_k;
};

enum finish_reason { FINISH_STOP = 0, FINISH_LENGTH = 1 };

/* Per-sequence results, arrays of n entries; tokens/logp rows hold max_new_tokens slots each. */
struct gen_out {
  int *tokens; /* [n * max_new_tokens] */
  float *logp; /* [n * max_new_tokens] log-prob of each sampled token under
                  softmax(logits / temperature) (softmax(logits) when greedy), untruncated */
  int *len;    /* [n] generated tokens, the stop token included */
  int *finish; /* [n] enum finish_reason */
  /* With sampler_opts.top_k = k > 0 (else unused, may be NULL): [n * max_new_tokens * k], slot
   * (q * max_new_tokens + t) * k + j holds the j-th most likely token of the distribution
   * sequence q's token t was drawn from and its log-prob (sampler_top) */
  int *top_ids;
  float *top_logp;
};

struct gen_state;

/* cap_batch sequences of up to cap_seq_len tokens (prompt + response), for m with its adapter
 * (m->lora) if it has one: create the state after attaching it. NULL + e on failure. */
struct gen_state *gen_state_new(const struct model *m, int cap_batch, int cap_seq_len,
                                struct dapo_err *e);
void gen_state_free(struct gen_state *s);
struct lora_config;
/* lc: the adapter the model will carry (model.lora), or NULL. */
size_t gen_state_bytes(const struct model_config *c, const struct lora_config *lc, int cap_batch,
                       int cap_seq_len);

struct pool;
/* Runs generation on pool p's threads (borrowed; NULL: serial). Returns 0 or DAPO_ENOMEM. */
int gen_state_set_pool(struct gen_state *s, struct pool *p, struct dapo_err *e);

/* How a pool shares a decoding step (sampler.c, decode_step). GEN_SPLIT_ROWS: each thread decodes
 * its own rows alone (no barriers). GEN_SPLIT_COLUMNS: in phases separated by barriers, each
 * thread its fixed share of every weight matrix's columns (each weight read once per step).
 * GEN_SPLIT_DYNAMIC: the same phases, the threads taking ranges of columns from a shared cursor,
 * so that a thread slowed by another process costs a range, not a phase; guided: each range a
 * share of what is left, at most gen_state_set_chunk's, down to 48 columns at a phase's end.
 * GEN_SPLIT_AUTO: dynamic columns when the weights exceed 4 MiB, else rows (gen_state_tune
 * replaces it by what it measures). The
 * tokens and log-probs are the same bits for every split and chunk; tests and benchmarks force
 * one. */
enum gen_split { GEN_SPLIT_AUTO, GEN_SPLIT_ROWS, GEN_SPLIT_COLUMNS, GEN_SPLIT_DYNAMIC };
void gen_state_set_split(struct gen_state *s, enum gen_split split);
/* GEN_SPLIT_DYNAMIC's (and AUTO's) chunk, its longest range: KiB of a matrix's float32 rows (a
 * BF16 matrix: the same columns), rounded down to a multiple of GEN_CHUNK_ALIGN columns, at least
 * one; <= 0: GEN_CHUNK_DEFAULT. */
enum { GEN_CHUNK_ALIGN = 16, GEN_CHUNK_DEFAULT = 1024 };
void gen_state_set_chunk(struct gen_state *s, int kib);
/* Chooses the split and chunk of decoding on s's pool (gen_state_set_pool first) by timing a
 * few decoding steps of `batch` rows (capped by the state's capacity) at half the sequence
 * capacity, for each candidate (rows; static columns; dynamic columns in chunks of 256 and
 * 1024 KiB) in turns: the fastest median of 3 (gen_tune_pick). The choice never changes a token or
 * a log-prob (every split computes the same bits), only the speed; it stays until
 * gen_state_set_split/_chunk. It overwrites the KV cache and the logits: call it before generating
 * (gen_advance's slots lose what they held). Without a pool of 2 or more threads it does nothing. 0
 * or DAPO_ENOMEM. */
int gen_state_tune(struct gen_state *s, const struct model *m, int batch, struct dapo_err *e);
/* gen_state_tune's choice from its medians (seconds a step, in its candidates' order: rows,
 * static columns, dynamic 256 KiB, dynamic 1024 KiB): the index of the fastest, except that
 * static columns must be more than GEN_TUNE_STATIC_MARGIN faster than the fastest dynamic
 * split (which a thread slowed later costs a range, not a phase), else the fastest of the
 * others. */
#define GEN_TUNE_STATIC_MARGIN 0.05
int gen_tune_pick(const double med[4]);
/* The split decoding uses now (and, after gen_state_tune, what it measured), in buf. */
const char *gen_state_describe_split(const struct gen_state *s, char *buf, size_t n);

/* Where decoding steps' time goes, per thread of the pool (benchmarks: bench_engine --decode):
 * seconds summed over the steps decoded while set, by kind of work. GEN_PROF_NORM: the RMSNorms
 * and the adapters' x A^T (every thread computes them whole); GEN_PROF_WAIT: waiting at the
 * barriers between phases. gen_state_set_profile(s, NULL) stops. */
enum {
  GEN_PROF_QKV,
  GEN_PROF_ATTN,
  GEN_PROF_O,
  GEN_PROF_FFN, /* gate, up and SwiGLU */
  GEN_PROF_DOWN,
  GEN_PROF_HEAD,
  GEN_PROF_SAMPLE,
  GEN_PROF_NORM,
  GEN_PROF_WAIT,
  GEN_PROF_KINDS
};
enum { GEN_PROF_THREADS = 16 };
struct gen_profile {
  double sec[GEN_PROF_THREADS][GEN_PROF_KINDS];
  long chunks[GEN_PROF_THREADS]; /* column ranges taken */
  long waits[GEN_PROF_THREADS];  /* barrier waits */
  long slept[GEN_PROF_THREADS];  /* of which ended asleep (pool_barrier_wait) */
};
void gen_state_set_profile(struct gen_state *s, struct gen_profile *p);

/* For tests: thread `thread` of the pool sleeps usec microseconds before its work in each phase
 * of a decoding step (a neighbour taking its core); usec 0: none (the default). */
void gen_state_set_delay(struct gen_state *s, int thread, int usec);

/* Decoding packs the weight matrices of a small model (their float32 bytes, with the LM head, at
 * most DECODE_PACK_MAX_BYTES; a frozen BF16 base counted and packed in float32) once into panels
 * the state owns (linear_lanes_pack, counted in gen_state_bytes), so that no step transposes
 * them: a lone sequence decodes several times faster. The panels are packed again at the start
 * of gen_run or gen_advance when the model or its version (model_weights_changed) differs.
 * Tokens and log-probs are the same bits either way (linear_lanes_packed); on (1, the default)
 * or off (0) for tests and benchmarks. A LoRA adapter's B matrices are likewise kept transposed
 * (linear_few_narrow_pack, any model size, counted in gen_state_bytes) and transposed again on
 * the same condition: whoever changes an adapter's weights calls model_weights_changed. */
#define DECODE_PACK_MAX_BYTES ((size_t)256 << 20)
/* The bytes of that copy for a model of config c (part of gen_state_bytes), 0 over the budget. */
size_t gen_pack_bytes(const struct model_config *c);
void gen_state_set_pack(struct gen_state *s, int on);

/* Told by gen_run after its prefill and after each decoding step, on gen_run's thread: tokens
 * sampled so far by this gen_run (all sequences) and how many of its n sequences have finished
 * (a stop token or max_new_tokens); the last call has finished == n. It must be cheap (it runs
 * between decoding steps) and must not touch the state. fn NULL: none (the default). ctx is
 * borrowed until the next gen_state_set_progress. The tokens sampled never depend on it. */
typedef void (*gen_progress_fn)(void *ctx, int64_t tokens, int finished);
void gen_state_set_progress(struct gen_state *s, gen_progress_fn fn, void *ctx);

/* Told by gen_run after every round of sampling (the prefill's first token of each sequence,
 * then each decoding step), on gen_run's thread, before it picks the sequences that go on: out
 * holds every sequence's tokens so far (rows of max_new slots) with len and finish. It may end
 * sequence q after its last token by setting out->finish[q] = FINISH_STOP (e.g. its text now holds
 * a stop string); it must change nothing else, nor touch the state. fn NULL: none (the default):
 * gen_run's tokens are then its own. ctx is borrowed until the next gen_state_set_step. */
typedef void (*gen_step_fn)(void *ctx, struct gen_out *out, int n, int max_new);
void gen_state_set_step(struct gen_state *s, gen_step_fn fn, void *ctx);

/* Constrained decoding (structured outputs): called just before each token is drawn, with the
 * row of logits[V] it is drawn from; it may set the logits of disallowed tokens to -INFINITY (at
 * least one must stay finite). seq is gen_run's sequence index q (gen_out row q), or gen_advance's
 * feed index. Called on gen_run's or gen_advance's thread for the prefill's first token, but from
 * the pool's threads for decoding steps (decode_step), for different seqs at once: it must be
 * safe to call concurrently for distinct seqs. Everything after it (top_k's alternatives, the
 * draw, the log-prob) sees the masked row: the log-prob is that of the constrained distribution
 * the token was drawn from. It learns the tokens drawn from gen_state_set_step (gen_run calls it
 * after every round) or from gen_advance's results. fn NULL: none (the default). ctx is borrowed
 * until the next gen_state_set_mask. */
typedef void (*gen_mask_fn)(void *ctx, int seq, float *logits, int V);
void gen_state_set_mask(struct gen_state *s, gen_mask_fn fn, void *ctx);

/* Generates n <= cap_batch sequences. prompts[i] (borrowed) has prompt_len[i] >= 1 tokens;
 * rngs[i] advances as sequence i samples. Returns 0, DAPO_ECANCELLED when *cancel becomes
 * non-zero (checked between tokens; may be NULL), or an error. */
int gen_run(struct gen_state *s, const struct model *m, int n, const int *const *prompts,
            const int *prompt_len, struct rng *rngs, const struct sampler_opts *o,
            struct gen_out *out, const volatile int *cancel, struct dapo_err *e);

/* Multi-turn generation (an agent's episodes): each of the state's cap_batch slots holds one
 * sequence that grows by what is fed into it, the model's own tokens and the world's between
 * its turns, with its KV cache kept from call to call, so a sequence can wait (for a tool or an
 * environment) while others go on, and rejoin when its answer comes.
 *
 * gen_advance appends feeds[i].tokens (borrowed, n >= 1) to slot feeds[i].slot's sequence, runs
 * them through the model, and samples the next token from what follows the last of them into
 * tok[i] (its log-prob, as gen_out.logp, into logp[i]), drawing from rngs[i]. The sampled token
 * is not in the cache yet: the caller feeds it back (alone, to go on decoding; or with the
 * world's tokens after it, when the turn ended). A feed into an empty slot, or of more than
 * GEN_DECODE_FEED_MAX tokens, is a prefill (gen_run's prompt pass, each feed alone); the others
 * go through decoding steps, a token a step (gen_run's, batched with the call's other feeds).
 * Neither depends on what else is fed in the call, so a sequence gets the same tokens and
 * log-probs bit for bit whichever others are ready beside it, and those of gen_run when gen_run's
 * batch held its prompt alone. Feeds into empty slots with the same tokens (pointer and length)
 * share one prefill. o's temperature and
 * top_p apply; its max_new_tokens and stop ids do not (the caller decides where a turn ends).
 * Each slot at most once per call; a slot's length plus the feed plus the token sampled must fit
 * cap_seq_len. gen_run uses slots 0 .. n-1 and leaves them empty. */
#define GEN_DECODE_FEED_MAX 32 /* tokens fed through decoding steps (more: a prefill) */
struct gen_feed {
  int slot;
  const int *tokens;
  int n;
};
int gen_advance(struct gen_state *s, const struct model *m, int n, const struct gen_feed *feeds,
                struct rng *rngs, const struct sampler_opts *o, int *tok, float *logp,
                struct dapo_err *e);
/* Empties slot (its sequence starts again at the next feed); the tokens its cache holds. */
void gen_slot_clear(struct gen_state *s, int slot);
int gen_slot_len(const struct gen_state *s, int slot);

/* Draws one token from logits[V] (modified in place) with o's temperature and top_p; writes
 * the sampled token's log-prob (see gen_out.logp) to *logp. A logit of -INFINITY or a NaN has
 * probability exactly 0 (as has one more than 87.3 T below the largest): such a token is drawn
 * only when no logit is finite (then the first largest, as greedy). The passes over the row are
 * softmax.c's, the same bits on every instruction set. scratch_idx and scratch_p hold V entries
 * each. Exposed for statistical tests. */
int sampler_pick(float *logits, int V, const struct sampler_opts *o, struct rng *r, float *logp,
                 int *scratch_idx, float *scratch_p);

/* The k (1..V) most likely tokens of the distribution sampler_pick draws from logits[V] (read
 * only) with this temperature: softmax(logits / temperature), softmax(logits) when greedy, before
 * any top_p truncation; most likely first, ties by ascending id, into ids[k] and logp[k]. Each
 * log-prob is computed as sampler_pick computes the sampled token's, so the sampled token, when
 * listed, has exactly the log-prob it was sampled with. One pass over the row for the softmax's
 * normaliser, one for the selection. */
void sampler_top(const float *logits, int V, float temperature, int k, int *ids, float *logp);

#endif
