/* The update's log-probs under structured outputs (train.h fwd_batch.allowed) are the sampler's:
 * the tiny preset samples a batch under a json_schema's mask (gen_state_set_mask, matchers fed
 * from gen_state_set_step, at temperature 0.7, as a job's generation does, core/rl/runner_json.c),
 * then each response is replayed through a fresh matcher into a bitset per response token, and
 * train_logprobs (the old-log-prob pass) scores the batch:
 * - every response token's log-prob equals the one the sampler returned within 1e-4 (the
 *   tolerance of the sampler-vs-trainer check, policy/logp_mismatch in tests/api), and without
 *   the mask the trainer's differ by more (an unconstrained log-prob is never larger, and smaller
 *   wherever the mask removed mass): the check fails when the trainer does not mask;
 * - every response that ended by a stop token is a complete value of the schema (the matcher);
 * - train_forward gives the same log-probs and a finite entropy, and its backward leaves exactly
 *   0 in the LM head's gradient rows of the ids that no row allowed (and no sequence holds),
 *   where the unmasked backward does not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jsongrammar.h"
#include "lm.h"
#include "sampler.h"
#include "train.h"

#define BATCH 8
#define MAX_NEW 48
#define PLEN 3

static const char *SCHEMA =
    "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", \"strict\": true, \"schema\": "
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 5}, "
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 99}, \"pet\": {\"enum\": "
    "[\"cat\", \"dog\", null]}}, \"required\": [\"name\", \"age\", \"pet\"], "
    "\"additionalProperties\": false}}}";

struct glue {
  struct jmasker *k;
  struct jmatch *m[BATCH];
  int fed[BATCH], bad;
};

static void on_mask(void *ctx, int seq, float *logits, int V) {
  struct glue *g = ctx;
  if (jmasker_apply(g->k, g->m[seq], logits, V) <= 0) __atomic_add_fetch(&g->bad, 1, 0);
}

static void on_step(void *ctx, struct gen_out *out, int n, int max_new) {
  struct glue *g = ctx;
  for (int q = 0; q < n; q++)
    for (; g->fed[q] < out->len[q]; g->fed[q]++)
      if (jmasker_feed(g->k, g->m[q], out->tokens[q * max_new + g->fed[q]])) g->bad++;
}

int main(void) {
  struct dapo_err e = {0};
  struct lm lm = {0};
  if (lm_open("tiny", 7, &lm, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  struct model *m = lm.model;
  int V = model_vocab_used(&m->cfg), C = m->cfg.hidden_size;
  size_t W = ((size_t)V + 63) / 64;
  json_t *rf = json_loads(SCHEMA, 0, NULL);
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  struct jvocab *voc = g ? jvocab_new(lm.tok, V, &e) : NULL;
  struct glue gl = {0};
  if (!voc || !(gl.k = jmasker_new(g, voc, lm.stop_ids, lm.n_stop, &e))) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  for (int q = 0; q < BATCH; q++) gl.m[q] = jmatch_new(g);

  /* generation under the mask */
  float temp = 0.7f;
  struct sampler_opts so = {.temperature = temp, .top_p = 1.0f, .max_new_tokens = MAX_NEW};
  for (int i = 0; i < lm.n_stop; i++) so.stop_ids[so.n_stop++] = lm.stop_ids[i];
  struct gen_state *gs = gen_state_new(m, BATCH, PLEN + MAX_NEW, &e);
  CHECK(gs != NULL);
  int prompt[PLEN] = {3, 7, 11}, plen[BATCH], tokens[BATCH * MAX_NEW], len[BATCH], fin[BATCH];
  float slogp[BATCH * MAX_NEW];
  const int *prompts[BATCH];
  struct rng rngs[BATCH];
  for (int q = 0; q < BATCH; q++) {
    prompts[q] = prompt, plen[q] = PLEN;
    rng_seed(&rngs[q], 11, (uint64_t)q);
  }
  struct gen_out out = {tokens, slogp, len, fin, NULL, NULL};
  gen_state_set_mask(gs, on_mask, &gl);
  gen_state_set_step(gs, on_step, &gl);
  CHECK(gen_run(gs, m, BATCH, prompts, plen, rngs, &so, &out, NULL, &e) == 0);
  CHECK(gl.bad == 0);

  /* the batch packed as the runner packs it, and each response replayed into its masks */
  int seq_off[BATCH + 1] = {0}, plens[BATCH], R = 0, complete = 0;
  int *btok = malloc(sizeof(int) * BATCH * (PLEN + MAX_NEW));
  uint64_t *allowed = calloc(W * BATCH * MAX_NEW, sizeof *allowed);
  unsigned char *ever = calloc((size_t)V, 1); /* allowed in some row, or a token of the batch */
  for (int q = 0; q < BATCH; q++) {
    int o = seq_off[q];
    memcpy(btok + o, prompt, sizeof prompt);
    memcpy(btok + o + PLEN, tokens + q * MAX_NEW, sizeof(int) * (size_t)len[q]);
    plens[q] = PLEN;
    seq_off[q + 1] = o + PLEN + len[q];
    for (int i = o; i < seq_off[q + 1]; i++) ever[btok[i]] = 1;
    jmatch_reset(gl.m[0]);
    for (int k = 0; k < len[q]; k++, R++) {
      uint64_t *row = allowed + (size_t)R * W;
      int tok = tokens[q * MAX_NEW + k];
      CHECK(jmasker_mask(gl.k, gl.m[0], row) > 0);
      CHECK(row[tok / 64] >> (tok % 64) & 1);
      CHECK(jmasker_feed(gl.k, gl.m[0], tok) == 0);
      for (int j = 0; j < V; j++) ever[j] |= row[j / 64] >> (j % 64) & 1;
    }
    if (fin[q] == FINISH_STOP) { /* a complete value of the schema (the stop token fed nothing) */
      CHECK_MSG(jmatch_done(gl.m[0]), "response %d ended by a stop token is not complete", q);
      complete++;
    }
  }
  CHECK_MSG(complete > 0, "no response of %d ended within %d tokens", BATCH, MAX_NEW);

  /* the old-log-prob pass: the sampler's log-probs, masked; not so unmasked */
  struct train_state *ts = train_state_new(m, seq_off[BATCH], R, PLEN + MAX_NEW, &e);
  CHECK(ts != NULL);
  float *lp = malloc(sizeof(float) * (size_t)R), *lp_free = malloc(sizeof(float) * (size_t)R);
  float *lp_fwd = malloc(sizeof(float) * (size_t)R), *ent = malloc(sizeof(float) * (size_t)R);
  struct fwd_batch b = {BATCH, btok, seq_off, plens, NULL, allowed, NULL};
  CHECK(train_logprobs(ts, m, &b, 1.0f / temp, lp, &e) == 0);
  struct fwd_batch bu = b;
  bu.allowed = NULL;
  CHECK(train_logprobs(ts, m, &bu, 1.0f / temp, lp_free, &e) == 0);
  double worst = 0, worst_free = 0;
  for (int q = 0, r = 0; q < BATCH; q++)
    for (int k = 0; k < len[q]; k++, r++) {
      double s = slogp[q * MAX_NEW + k];
      worst = fmax(worst, fabs(s - lp[r]));
      worst_free = fmax(worst_free, fabs(s - lp_free[r]));
      CHECK(lp_free[r] <= lp[r] + 1e-5f);
    }
  printf("%d responses (%d complete), %d tokens: max |sampler - trainer| %.3g masked, %.3g "
         "unmasked\n",
         BATCH, complete, R, worst, worst_free);
  CHECK_MSG(worst < 1e-4, "masked: max |sampler - trainer| = %g", worst);
  CHECK_MSG(worst_free > 1e-2, "unmasked: max |sampler - trainer| = %g", worst_free);

  /* the update's forward: the same log-probs, a finite entropy; the backward's LM head rows of
   * ids no row allowed (nor any sequence holds) exactly 0 */
  CHECK(model_alloc_grads(m, &e) == 0);
  float *dlogp = malloc(sizeof(float) * (size_t)R);
  for (int r = 0; r < R; r++) dlogp[r] = (r % 3 == 0 ? -1.0f : 0.5f) / (float)R;
  int never = 0, nonzero_free = 0, nonzero_masked = 0;
  for (int pass = 0; pass < 2; pass++) {
    memset(m->grads, 0, sizeof(float) * m->n_params);
    struct fwd_batch *pb = pass ? &bu : &b;
    CHECK(train_forward(ts, m, pb, 1.0f / temp, lp_fwd, ent, &e) == 0);
    if (!pass)
      for (int r = 0; r < R; r++) {
        CHECK(lp_fwd[r] == lp[r]);
        CHECK(isfinite(ent[r]) && ent[r] >= 0.0f);
      }
    CHECK(train_backward(ts, m, dlogp, &e) == 0);
    for (int j = 0; j < V; j++) {
      if (ever[j]) continue;
      never += !pass;
      const float *row = m->g.lm_head + (size_t)j * C;
      int nz = 0;
      for (int c = 0; c < C; c++) nz |= row[c] != 0.0f;
      if (pass)
        nonzero_free += nz;
      else
        nonzero_masked += nz;
    }
  }
  printf("%d ids never allowed: %d LM head gradient rows non-zero masked, %d unmasked\n", never,
         nonzero_masked, nonzero_free);
  CHECK(never > 0);
  CHECK_MSG(nonzero_masked == 0, "%d never-allowed ids got a gradient", nonzero_masked);
  CHECK(nonzero_free == never);

  free(dlogp), free(lp), free(lp_free), free(lp_fwd), free(ent), free(btok), free(allowed);
  free(ever);
  train_state_free(ts);
  gen_state_free(gs);
  for (int q = 0; q < BATCH; q++) jmatch_free(gl.m[q]);
  jmasker_free(gl.k);
  jvocab_free(voc);
  jgrammar_free(g);
  json_decref(rf);
  lm_close(&lm);
  return check_done("test_train_mask");
}
