/* Forward and backward over a batch of packed (prompt, response) sequences of different lengths,
 * with no padding: sequences lie back to back in one token array. The forward returns, for every
 * response token, its log-probability and the entropy of the full next-token distribution; the
 * backward accumulates into the model's gradients the gradient of sum_t dlogp[t] * logp[t] (the
 * DAPO/GRPO losses reduce to such a weighting, recomputed per minibatch).
 *
 * Only positions that predict a response token go through the LM head, and attention is causal
 * within each sequence. Activations live in one struct train_state allocated once per job for a
 * stated capacity; nothing is allocated per call. Not thread-safe: one state per worker. */
#ifndef DAPO_TRAIN_H
#define DAPO_TRAIN_H

#include <stdint.h>

#include "error.h"
#include "model.h"

/* Packed sequences (all arrays borrowed for the duration of the call). Sequence s occupies
 * tokens[seq_off[s] .. seq_off[s+1]); its first prompt_len[s] tokens (>= 1) are the prompt, the
 * rest the response. Response tokens are numbered in order: sequence 0's first, then 1's...
 *
 * trained (NULL: every response token) marks, aligned with tokens, the response tokens whose
 * log-probs are computed and trained (1) and those that are only context (0): in a multi-turn
 * episode the model's sampled tokens are trained and what the world wrote between its turns is
 * not. Only trained tokens are numbered, go through the LM head and get a gradient; the others
 * are still attended to. A prompt token is never trained (its entry must be 0).
 *
 * allowed (NULL: every id) restricts each trained response token's distribution to a set of ids,
 * as the sampler's mask hook did when it drew it (structured outputs, gen_state_set_mask): one
 * bitset row of (V + 63) / 64 words per trained response token, numbered as above (bit j of word
 * j / 64 allows id j; V = model_vocab_used). The logits of the other ids are -INFINITY after the
 * temperature and before the log-softmax, as the sampler divides by the temperature and masks:
 * log-probs and entropy are the constrained distribution's, the probabilities outside the set
 * exactly 0 and so the gradient of their logits. Each row must allow its own target.
 *
 * prefix_of (NULL: every sequence whole) lets a sequence continue an earlier one's prompt without
 * holding it again (a DPO pair's two responses to one prompt): prefix_of[j] is -1 (sequence j is
 * whole, as above) or i, 0 <= i < j, with prefix_of[i] == -1: then j's first P = prompt_len[j]
 * tokens are i's first P tokens (1 <= P <= prompt_len[i]), not stored, and j's own tokens
 * tokens[seq_off[j] .. seq_off[j+1]) (at least one) are all response, at positions P, P + 1...
 * Its first response token is predicted from i's row P - 1; its rows attend to i's first P rows
 * and then causally to its own. The log-probs and gradients are those of the batch with j's
 * prompt packed in full (up to float rounding: the shared rows' gradients are summed once), for
 * the prompt's rows passing through the model once. trained and allowed number j's response
 * tokens as any other's; a continuation's length P + its own tokens counts against the state's
 * sequence capacity. */
struct fwd_batch {
  int n_seq;
  const int *tokens;
  const int *seq_off;           /* n_seq + 1 entries, seq_off[0] == 0 */
  const int *prompt_len;        /* n_seq entries */
  const unsigned char *trained; /* NULL, or seq_off[n_seq] entries of 0 or 1 */
  const uint64_t *allowed;      /* NULL, or a bitset row per trained response token */
  const int *prefix_of;         /* NULL, or n_seq entries: -1 or an earlier whole sequence */
};

struct train_state;

/* Capacities: total tokens of a batch, total response tokens, longest sequence. Returns NULL and
 * fills e when out of memory. Owned by the caller (train_state_free). */
struct train_state *train_state_new(const struct model *m, int cap_tokens, int cap_resp,
                                    int cap_seq_len, struct dapo_err *e);
void train_state_free(struct train_state *s);

struct pool;

/* Runs this state's passes on pool p's threads (borrowed; NULL: serial, with OpenBLAS's own
 * threading). Allocates per-thread attention scratch once. Returns 0 or DAPO_ENOMEM. */
int train_state_set_pool(struct train_state *s, struct pool *p, struct dapo_err *e);

/* Bytes train_state_new would allocate for these capacities (memory planning). */
struct lora_config;
/* lc: the adapter the model will carry (model.lora), or NULL. */
size_t train_state_bytes(const struct model_config *c, const struct lora_config *lc, int cap_tokens,
                         int cap_resp, int cap_seq_len);

/* Number of response tokens in b (sum of lengths minus prompt lengths), the trained ones only
 * when b->trained is given. */
int fwd_batch_resp_tokens(const struct fwd_batch *b);

/* Checks b against the model and the state's capacities (token ids in range, offsets
 * increasing, prompt_len in [1, length], positions < max_position_embeddings, trained entries 0
 * or 1 and 0 in the prompts, prefix_of -1 or an earlier whole sequence whose prompt holds the
 * continuation's). */
int fwd_batch_validate(const struct train_state *s, const struct model *m,
                       const struct fwd_batch *b, struct dapo_err *e);

/* Forward pass. Logits are multiplied by inv_temp (1/temperature; 1 for none) before the softmax.
 * logp and entropy (either may be NULL) receive one value per (trained) response token. Saves what
 * the backward needs; the next train_backward refers to this batch. */
int train_forward(struct train_state *s, const struct model *m, const struct fwd_batch *b,
                  float inv_temp, float *logp, float *entropy, struct dapo_err *e);

/* train_forward's log-probs alone, for a pass that no backward follows (old and reference
 * log-probs): the same bits in logp, without the classifier's softmax pass
 * (classifier_logprobs). train_backward cannot follow it. */
int train_logprobs(struct train_state *s, const struct model *m, const struct fwd_batch *b,
                   float inv_temp, float *logp, struct dapo_err *e);

/* After train_forward and before train_backward: hit[r] = 1 when trained token r is the most
 * likely next token of its distribution (the first maximum, as torch.argmax), else 0; one entry
 * per (trained) response token, as logp. Reads the probabilities the forward left (no pass over
 * the model). Returns 0, or DAPO_EINVAL when no train_forward awaits its backward. */
int train_argmax_hits(const struct train_state *s, unsigned char *hit, struct dapo_err *e);

/* Backward of sum_t dlogp[t] * logp[t] for the batch of the last train_forward: accumulates
 * (+=) into m->grads (model_alloc_grads first). Consumes the saved state: call once per forward. */
int train_backward(struct train_state *s, struct model *m, const float *dlogp, struct dapo_err *e);

#endif
