/* Our supervised (SFT) and DPO steps at the DAPO update benchmark's shape (bench/README.md,
 * "SFT and DPO"), answering commands on stdin so that bench_torch.py --methods can measure them
 * alternately with PyTorch's. The work is what core/rl/runner_sft.c and runner_dpo.c do a step:
 *   sft: 16 examples of 256 tokens, the last 192 of each trained (3072 tokens): train_forward
 *        (log-probs, no entropies), train_argmax_hits (token accuracy), train_backward of the
 *        token mean of -log p, AdamW (clipping at 1);
 *   dpo: 8 pairs, each a 64-token prompt with two 192-token responses (16 sequences of 256),
 *        packed as the runner packs them: [prompt, chosen] and [rejected] continuing its prompt
 *        (fwd_batch.prefix_of; 3584 rows through the model, not 4096): train_forward, DPO's
 *        sigmoid loss on sequence log-probs against reference log-probs computed once at start
 *        (train_logprobs, not timed), train_backward, AdamW.
 * Usage: bench_methods --shape VOCAB,HIDDEN,INTERMEDIATE,LAYERS,HEADS [--threads N]
 * After setup it prints {"threads"}, then answers each line with one JSON line:
 *   sft | dpo   {"step_s", "forward_s", "backward_s", "adamw_s"}   one step
 *   info        {"threads"}
 *   quit
 * An error answers {"error": message} and ends the process. Reports, never fails on a time. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "bench_util.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "train.h"

#define N_SEQ 16
#define SEQ_LEN 256
#define PROMPT_LEN 64
#define N_TOK (N_SEQ * SEQ_LEN)
#define N_RESP (N_SEQ * (SEQ_LEN - PROMPT_LEN))
#define DPO_TOK (N_TOK - N_SEQ / 2 * PROMPT_LEN) /* each pair's prompt once */
#define BETA 0.1

struct bench {
  struct model *m;
  struct train_state *ts;
  struct adamw opt;
  struct adamw_cfg oc;
  int64_t step;
  int off[N_SEQ + 1], plen[N_SEQ], tok[N_TOK];
  int dpo_off[N_SEQ + 1], dpo_pre[N_SEQ], dpo_tok[DPO_TOK]; /* the DPO pairs' packing */
  unsigned char trained[N_TOK], hit[N_RESP];
  float logp[N_RESP];
  double ref[N_SEQ]; /* DPO: the reference's sequence log-probs */
};

static void emit(json_t *j) {
  json_dumpf(j, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  fflush(stdout);
  json_decref(j);
}

/* The SFT batch (dpo 0: 16 sequences whole), or the DPO pairs' (their prompt once). */
static struct fwd_batch batch(struct bench *b, int dpo) {
  struct fwd_batch fb = {N_SEQ, b->tok, b->off, b->plen, b->trained, NULL, NULL};
  if (dpo) fb = (struct fwd_batch){N_SEQ, b->dpo_tok, b->dpo_off, b->plen, NULL, NULL, b->dpo_pre};
  return fb;
}

/* Sequence log-probs (sums over each response) of the last forward into lp[N_SEQ]. */
static void seq_logprobs(const struct bench *b, double *lp) {
  for (int s = 0, r = 0; s < N_SEQ; s++) {
    lp[s] = 0;
    for (int j = PROMPT_LEN; j < SEQ_LEN; j++) lp[s] += b->logp[r++];
  }
}

static int init(struct bench *b, const int shape[5], struct pool *pool, struct dapo_err *e) {
  struct model_config c = {.arch = ARCH_LLAMA,
                           .max_position_embeddings = 512,
                           .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000.0f,
                           .bos_token_id = 1,
                           .eos_token_id = 2,
                           .initializer_range = 0.02f};
  c.vocab_size = shape[0], c.hidden_size = shape[1], c.intermediate_size = shape[2];
  c.num_layers = shape[3], c.num_heads = c.num_kv_heads = shape[4];
  c.head_dim = c.hidden_size / c.num_heads;
  struct rng r;
  rng_seed(&r, 5, 0);
  if (!(b->m = model_new(&c, e)) || model_alloc_grads(b->m, e)) return DAPO_EINVAL;
  model_init_random(b->m, 1);
  for (int s = 0; s <= N_SEQ; s++) b->off[s] = s * SEQ_LEN;
  for (int s = 0; s < N_SEQ; s++) b->plen[s] = PROMPT_LEN;
  for (int i = 0; i < N_TOK; i++) {
    b->tok[i] = (int)rng_below(&r, (uint64_t)c.vocab_size);
    b->trained[i] = i % SEQ_LEN >= PROMPT_LEN;
  }
  /* DPO pairs: sequence 2k whole, 2k + 1 its response alone, continuing 2k's prompt */
  b->dpo_off[0] = 0;
  for (int s = 0, n = 0; s < N_SEQ; s++) {
    int from = s % 2 ? PROMPT_LEN : 0;
    memcpy(b->dpo_tok + n, b->tok + s * SEQ_LEN + from, sizeof(int) * (size_t)(SEQ_LEN - from));
    b->dpo_off[s + 1] = n += SEQ_LEN - from;
    b->dpo_pre[s] = s % 2 ? s - 1 : -1;
  }
  b->oc = adamw_cfg_default();
  if (!(b->ts = train_state_new(b->m, N_TOK, N_RESP, SEQ_LEN, e))) return e->code;
  if (pool && train_state_set_pool(b->ts, pool, e)) return e->code;
  struct fwd_batch fb = batch(b, 1);
  if (train_logprobs(b->ts, b->m, &fb, 1.0f, b->logp, e)) return e->code;
  seq_logprobs(b, b->ref);
  return adamw_init(&b->opt, b->m, &b->oc, e);
}

/* One step of the method (0 sft, 1 dpo); t[0..3] = step, forward, backward, optimizer seconds. */
static int step(struct bench *b, int dpo, double t[4], struct dapo_err *e) {
  struct fwd_batch fb = batch(b, dpo);
  double t0 = now_s(), lp[N_SEQ];
  model_zero_grads(b->m);
  if (train_forward(b->ts, b->m, &fb, 1.0f, b->logp, NULL, e)) return e->code;
  if (!dpo) {
    if (train_argmax_hits(b->ts, b->hit, e)) return e->code;
    for (int i = 0; i < N_RESP; i++) b->logp[i] = -1.0f / N_RESP;
  } else {
    seq_logprobs(b, lp);
    for (int k = 0; k < N_SEQ / 2; k++) {
      double z = BETA * ((lp[2 * k] - b->ref[2 * k]) - (lp[2 * k + 1] - b->ref[2 * k + 1]));
      double g = -BETA / (1.0 + exp(z)) / (N_SEQ / 2); /* d(-log sigmoid z)/d lp_chosen / pairs */
      for (int w = 0; w < 2; w++)
        for (int j = 0; j < SEQ_LEN - PROMPT_LEN; j++)
          b->logp[(2 * k + w) * (SEQ_LEN - PROMPT_LEN) + j] = (float)(w ? -g : g);
    }
  }
  double t1 = now_s();
  if (train_backward(b->ts, b->m, b->logp, e)) return e->code;
  double t2 = now_s(), gn = 0;
  if (adamw_step(&b->opt, b->m, adamw_lr_at(&b->oc, b->step++), &gn, e)) return e->code;
  double t3 = now_s();
  t[0] = t3 - t0, t[1] = t1 - t0, t[2] = t2 - t1, t[3] = t3 - t2;
  return 0;
}

int main(int argc, char **argv) {
  int shape[5] = {0}, threads = pool_cpu_count();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--shape") && sscanf(argv[i + 1], "%d,%d,%d,%d,%d", &shape[0], &shape[1],
                                              &shape[2], &shape[3], &shape[4]) == 5)
      continue;
    if (!strcmp(argv[i], "--threads") && (threads = atoi(argv[i + 1])) > 0) continue;
    shape[0] = 0;
    break;
  }
  if (shape[0] <= 0 || shape[4] <= 0 || (argc - 1) % 2) {
    fprintf(stderr, "usage: bench_methods --shape VOCAB,HIDDEN,INTERMEDIATE,LAYERS,HEADS "
                    "[--threads N]  (commands on stdin: sft, dpo, info, quit)\n");
    return 2;
  }
  struct pool *pool = pool_new(threads);
  static struct bench b;
  struct dapo_err e = {0};
  int rc = init(&b, shape, pool, &e);
  char line[64];
  if (!rc) emit(json_pack("{s:i}", "threads", threads));
  while (!rc && fgets(line, sizeof line, stdin)) {
    double t[4] = {0};
    line[strcspn(line, "\r\n")] = '\0';
    if (!strcmp(line, "quit")) break;
    if (!strcmp(line, "info")) {
      emit(json_pack("{s:i}", "threads", threads));
    } else if (!strcmp(line, "sft") || !strcmp(line, "dpo")) {
      if (!(rc = step(&b, line[0] == 'd', t, &e)))
        emit(json_pack("{s:f, s:f, s:f, s:f}", "step_s", t[0], "forward_s", t[1], "backward_s",
                       t[2], "adamw_s", t[3]));
    } else {
      rc = dapo_errf(&e, DAPO_EINVAL, "unknown command '%.40s'", line);
    }
  }
  if (rc) {
    emit(json_pack("{s:s}", "error", e.msg));
    fprintf(stderr, "bench_methods: %s\n", e.msg);
  }
  adamw_deinit(&b.opt);
  train_state_free(b.ts);
  model_free(b.m);
  pool_free(pool);
  return rc ? 1 : 0;
}
