/* Structured outputs in a DAPO job (runner_impl.h, job field `response_format`): the sampling is
 * constrained as the completion routes constrain it (server/completions.c), and the update's
 * log-probs come from the same constrained distribution.
 *
 * - One grammar (compiled from the spec once), one vocabulary (the tokenizer's byte strings of
 *   the ids the model scores) and one masker per job; its stop ids are the sampler's (the
 *   model's and the chat template's end of turn), allowed only once the value is complete.
 * - Generation: a matcher per sequence of a gen_run, reset before it; the mask hook sets the
 *   logits of the ids its matcher refuses to -INFINITY before each draw (sampler.h: the draw
 *   and the log-prob it records are then the constrained distribution's), the step hook feeds
 *   each drawn token to its matcher. Nothing is saved with a checkpoint: every generation starts
 *   fresh matchers, so a resumed job constrains as the first run did.
 * - The update: each response's tokens are replayed through a fresh matcher (deterministic; the
 *   masker caches masks by the matcher's state) into a bitset row per response token
 *   (fwd_batch.allowed), so the old-log-prob, reference and update passes all score the token
 *   under the mask it was drawn with (train.h). */
#include <stdlib.h>
#include <string.h>

#include "runner_impl.h"

static size_t words(const struct trainer *t) {
  return ((size_t)model_vocab_used(&t->lm.model->cfg) + 63) / 64;
}

int trainer_json_setup(struct trainer *t) {
  const json_t *rf = t->spec->response_format;
  if (!rf) return 0;
  struct dapo_err e = {0};
  int V = model_vocab_used(&t->lm.model->cfg);
  if (!(t->jg = jgrammar_new(rf, "response_format", &e))) /* checked when the job was parsed */
    return trainer_fail_err(t, FAIL_INVALID_SPEC, "response_format", &e);
  if (!(t->jv = jvocab_new(t->lm.tok, V, &e)) ||
      !(t->jk = jmasker_new(t->jg, t->jv, t->so.stop_ids, t->so.n_stop, &e)))
    return trainer_fail_err(t, FAIL_OUT_OF_MEMORY, NULL, &e);
  t->jm = calloc((size_t)t->gen_cap, sizeof *t->jm);
  t->j_fed = calloc((size_t)t->gen_cap, sizeof *t->j_fed);
  if (!t->jm || !t->j_fed) return trainer_oom(t);
  for (int i = 0; i < t->gen_cap; i++)
    if (!(t->jm[i] = jmatch_new(t->jg))) return trainer_oom(t);
  return 0;
}

void trainer_json_teardown(struct trainer *t) {
  for (int i = 0; t->jm && i < t->gen_cap; i++) jmatch_free(t->jm[i]);
  free(t->jm), free(t->j_fed); /* (b_allow is the batch scratch's) */
  jmasker_free(t->jk);
  jvocab_free(t->jv);
  jgrammar_free(t->jg);
  t->jm = NULL, t->j_fed = NULL, t->jk = NULL, t->jv = NULL, t->jg = NULL;
}

/* gen_run's mask hook (decoding steps call it from the pool's threads, for distinct sequences:
 * each touches its own matcher; the masker is thread-safe). */
static void on_mask(void *ctx, int seq, float *logits, int V) {
  struct trainer *t = ctx;
  int allowed = jmasker_apply(t->jk, t->jm[seq], logits, V);
  if (allowed < 0) __atomic_store_n(&t->j_failed, 1, __ATOMIC_RELAXED);
  if (allowed == 0) { /* a tokenizer without the bytes the schema needs: the job fails after */
    __atomic_store_n(&t->j_failed, 2, __ATOMIC_RELAXED);
    logits[0] = 0.0f;
  }
}

/* gen_run's step hook: each sequence's new tokens to its matcher. */
static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct trainer *t = ctx;
  for (int q = 0; q < n; q++)
    for (; t->j_fed[q] < out->len[q]; t->j_fed[q]++)
      if (jmasker_feed(t->jk, t->jm[q], out->tokens[(size_t)q * max_new + t->j_fed[q]]))
        __atomic_store_n(&t->j_failed, 3, __ATOMIC_RELAXED); /* (never: drawn under the mask) */
}

void trainer_json_begin(struct trainer *t, int ns) {
  if (!t->jk) return;
  for (int q = 0; q < ns; q++) {
    jmatch_reset(t->jm[q]);
    t->j_fed[q] = 0;
  }
  t->j_failed = 0;
  gen_state_set_mask(t->gs, on_mask, t);
  gen_state_set_step(t->gs, on_step, t);
}

int trainer_json_end(struct trainer *t) {
  if (!t->jk) return 0;
  gen_state_set_mask(t->gs, NULL, NULL);
  gen_state_set_step(t->gs, NULL, NULL);
  switch (t->j_failed) {
  case 0: return 0;
  case 1: return trainer_oom(t);
  case 2:
    return trainer_fail(t, FAIL_GENERATION_FAILED, "response_format",
                        "the model's tokenizer has no token for what the schema requires next (a "
                        "character outside its vocabulary, or no stop token to end the value)");
  default:
    return trainer_fail(t, FAIL_INTERNAL, "response_format",
                        "a sampled token was refused by the response_format's matcher");
  }
}

const uint64_t *trainer_json_allowed(struct trainer *t, int ns, int *failed) {
  *failed = 0;
  if (!t->jk) return NULL;
  if (t->b_allow_ns == ns) return t->b_allow; /* this micro-batch's, computed already */
  size_t W = words(t), row = 0;
  struct jmatch *m = t->jm[0]; /* (no generation runs during the update) */
  for (int s = 0; s < ns; s++) {
    const struct ro *r = t->b_ro[s];
    jmatch_reset(m);
    for (int q = 0; q < r->len; q++, row++) {
      uint64_t *bits = t->b_allow + row * W;
      int tok = r->toks[q];
      if (jmasker_mask(t->jk, m, bits) < 0) {
        *failed = trainer_oom(t);
        return NULL;
      }
      if (!(bits[tok / 64] >> (tok % 64) & 1) || jmasker_feed(t->jk, m, tok)) {
        *failed = trainer_fail(t, FAIL_INTERNAL, "response_format",
                               "response token %d (id %d) is not allowed by the response_format "
                               "on replay",
                               q, tok);
        return NULL;
      }
    }
  }
  t->b_allow_ns = ns;
  return t->b_allow;
}
