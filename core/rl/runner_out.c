/* What a job run leaves in its folder (runner_impl.h): rollouts/step-N.jsonl and checkpoints/
 * step-N folders written atomically (a crash leaves them complete or absent), pruned beyond
 * keep_checkpoints, and each checkpoint's manifest told to the hooks. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "parse.h"
#include "runner_impl.h"

/* ---- outputs: rollouts file, checkpoints ----------------------------------------------------- */

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

/* An episode's own fields on its rollouts line (docs/AGENTS.md): every token after the prompt
 * with its loss mask (1: the model's), the turns, how it ended and what it did; an environment's
 * (env) its rewards too. 0, or -1 out of memory. */
static int put_episode(json_t *o, const struct ro *r, int env) {
  json_t *mask = json_array(), *model = json_array(), *errs = json_object();
  for (int q = 0; mask && model && q < r->seq_len; q++) {
    json_array_append_new(mask, json_integer(r->trained[q]));
    if (r->trained[q]) json_array_append_new(model, json_integer(r->toks[q]));
  }
  for (int k = 1; errs && k < TOOL_ERR_COUNT; k++)
    if (r->es.tool_errors[k])
      json_object_set_new(errs, tool_err_name((enum tool_err)k),
                          json_integer(r->es.tool_errors[k]));
  /* the tools' latencies are the step's metrics': a rollouts file is the same for the same job */
  json_t *stats =
      json_pack("{s:i, s:i, s:i, s:o}", "turns", r->es.turns, "tool_calls", r->es.tool_calls,
                "world_tokens", r->es.world_tokens, "tool_errors", errs);
  int bad = !mask || !model || !stats;
  if (!bad && env) {
    /* an environment's episode: its rewards as it gave them (null: none), their sum */
    json_t *rewards = json_array();
    size_t i;
    json_t *turn;
    json_array_foreach(r->turns, i, turn) {
      json_t *rw = json_object_get(turn, "reward");
      if (rewards && !strcmp(json_string_value(json_object_get(turn, "role")), "environment"))
        json_array_append(rewards, rw ? rw : json_null());
    }
    bad |= !rewards || json_object_set_new(o, "env_rewards", rewards);
    bad |= json_object_set_new(o, "env_reward",
                               r->es.env_rewards ? json_real(r->es.env_reward) : json_null());
    bad |= json_object_set_new(stats, "env_steps", json_integer(r->es.env_steps));
  }
  bad |= json_object_set_new(o, "token_ids", int_array(r->toks, r->seq_len));
  bad |= json_object_set_new(o, "loss_mask", mask);
  bad |= json_object_set_new(o, "response_token_ids", model); /* the model's tokens alone */
  bad |= json_object_set(o, "turns", r->turns ? r->turns : json_null());
  bad |= json_object_set_new(o, "finish_reason", json_string(ep_finish_name(r->finish)));
  bad |= json_object_set_new(o, "episode", stats);
  return bad ? -1 : 0;
}

/* Writes rollouts/step-N.jsonl atomically (temporary file, fsync, rename). */
int trainer_write_rollouts(struct trainer *t) {
  if (trainer_rank(t) != 0) return 0; /* rank 0 writes a data-parallel job's files */
  char path[PATH_MAX], tmp[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/rollouts/step-%" PRId64 ".jsonl", t->out, t->step);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return trainer_fail(t, FAIL_IO_ERROR, NULL, "cannot write %s: %s", tmp, strerror(errno));
  int bad = 0;
  for (int i = 0; i < t->n_ro && !bad; i++) {
    const struct ro *r = &t->ros[i];
    const struct ds_item *it = ds_get(t->train, r->item);
    json_t *o = json_pack(
        "{s:I,s:i,s:i,s:i,s:s,s:s,s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:i,s:b,s:b,s:b,s:b}", "step",
        (json_int_t)t->step, "round", r->round, "group", r->group, "index", r->index, "id", it->id,
        "prompt", it->prompt ? it->prompt : t->texts[r->item], "response", r->text, "answer",
        it->answer, "prompt_token_ids", int_array(t->ids[r->item], t->ids_len[r->item]),
        "response_token_ids", int_array(r->toks, r->len), "reward_raw",
        r->judged ? json_real(r->reward_raw) : json_null(), "reward",
        r->judged ? json_real(r->reward) : json_null(), "correct",
        r->judged ? json_boolean(r->correct > 0) : json_null(), "advantage",
        r->kept ? json_real(r->adv) : json_null(), "length", r->len, "truncated", r->truncated,
        "kept", r->kept, "in_loss", r->in_loss, "overlong_penalised", r->penalised);
    if (!o) {
      bad = 1;
      break;
    }
    if (it->messages) json_object_set(o, "messages", it->messages); /* prompt: as rendered */
    if (r->trained && put_episode(o, r, toolbox_is_env(t->tools))) {
      json_decref(o);
      bad = 1;
      break;
    }
    if (r->info) json_object_set(o, "info", r->info);
    if (!r->judged) json_object_set_new(o, "judge_error", json_true());
    char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!line || fputs(line, f) == EOF || fputc('\n', f) == EOF) bad = 1;
    free(line);
  }
  if (fflush(f) || fsync(fileno(f))) bad = 1;
  if (fclose(f)) bad = 1;
  if (bad || rename(tmp, path)) {
    unlink(tmp);
    return trainer_fail(t, FAIL_IO_ERROR, NULL, "cannot write %s: %s", path, strerror(errno));
  }
  return 0;
}

struct ckpt_ctx {
  struct trainer *t;
  const json_t *metrics;
};

/* Whether every weight is a BF16 value (its low 16 bits zero), so that a BF16 model.safetensors
 * holds it exactly: the starting weights of a BF16 folder are. */
static int weights_exact_in_bf16(const struct model *m) {
  const uint32_t *bits = (const uint32_t *)(const void *)m->params;
  uint32_t low = 0;
  for (size_t i = 0; i < m->n_params; i++) low |= bits[i] & 0xffffu;
  return low == 0;
}

/* The trainer's files of a checkpoint: optimizer.safetensors (not at step 0, whose moments are
 * zeros: a resume from it starts AdamW afresh), trainer_weights.safetensors (the exact float32
 * weights when model.safetensors is BF16 and would lose bits: resumes stay bit-identical), the
 * model's tokenizer_config.json, trainer_state.json (what it says of both files). */
static int ckpt_extra(void *ctx, const char *tmp_dir, struct dapo_err *e) {
  struct ckpt_ctx *c = ctx;
  struct trainer *t = c->t;
  char p[PATH_MAX];
  int rc = 0, with_opt = t->step > 0;
  /* an adapter is written in float32 and the base never changes: nothing to keep exactly */
  int exact_file = !t->lm.lora && t->ckpt_bf16 && !weights_exact_in_bf16(t->lm.model);
  if (with_opt) {
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp_dir);
    rc = adamw_save(&t->opt, t->lm.model, p, e);
  }
  if (!rc && exact_file) {
    const char *prefix[1] = {""};
    const float *buf[1] = {t->lm.model->params};
    snprintf(p, sizeof p, "%s/trainer_weights.safetensors", tmp_dir);
    rc = ckpt_save_tensors(p, t->lm.model, 1, prefix, buf, NULL, e);
  }
  if (rc || (rc = lm_write_extra(&t->lm, tmp_dir, e))) return rc;
  json_t *st =
      json_pack("{s:I,s:{s:I,s:I,s:I},s:o,s:O?,s:b,s:b}", "step", (json_int_t)t->step, "cursor",
                "seed", (json_int_t)t->cursor.seed, "epoch", (json_int_t)t->cursor.epoch, "pos",
                (json_int_t)t->cursor.pos, "spec", jobspec_to_json(t->spec), "metrics", c->metrics,
                "optimizer_state", with_opt, "exact_weights_file", exact_file);
  if (!st) return dapo_errf(e, DAPO_ENOMEM, "trainer_state.json: out of memory");
  snprintf(p, sizeof p, "%s/trainer_state.json", tmp_dir);
  rc = ckpt_write_json(p, st, e);
  json_decref(st);
  return rc;
}

/* Deletes the oldest checkpoints beyond keep_checkpoints (never the newest one). */
static void prune(struct trainer *t) {
  int keep = t->hp->keep_checkpoints;
  if (keep <= 0) return;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/checkpoints", t->out);
  for (;;) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t oldest = INT64_MAX;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
      int64_t s;
      if (strncmp(de->d_name, "step-", 5) || parse_i64(de->d_name + 5, 0, INT64_MAX, &s, "", NULL))
        continue;
      count++;
      if (s < oldest) oldest = s;
    }
    closedir(d);
    if (count <= keep || oldest == t->step) return;
    char p[PATH_MAX];
    trainer_ckpt_path(t, oldest, p, sizeof p);
    ckpt_remove_folder(p);
  }
}

int trainer_checkpoint(struct trainer *t, const json_t *metrics) {
  if (trainer_rank(t) != 0) return 0;
  trainer_phase(t, "checkpointing");
  char dir[PATH_MAX];
  trainer_ckpt_path(t, t->step, dir, sizeof dir);
  struct stat st;
  char probe[PATH_MAX + 32];
  snprintf(probe, sizeof probe, "%s/trainer_state.json", dir);
  if (stat(probe, &st) == 0) return 0; /* already there (a resumed run passing it again) */
  if (stat(dir, &st) == 0) ckpt_remove_folder(dir); /* incomplete leftovers cannot exist, but */
  json_t *tj = tok_to_json(t->lm.tok);
  char *text = tj ? json_dumps(tj, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
  json_decref(tj);
  if (!text) return trainer_oom(t);
  struct ckpt_ctx c = {t, metrics};
  struct dapo_err e = {0};
  int rc = 0;
  if (t->lm.lora) { /* PEFT's adapter files and the base they apply to */
    json_t *base =
        json_pack("{s:s, s:I}", "model", t->lm.base, "seed", (json_int_t)t->lm.base_seed);
    rc = base
             ? ckpt_save_adapter(dir, t->lm.model, base, text, t->lm.gen_config, ckpt_extra, &c, &e)
             : dapo_errf(&e, DAPO_ENOMEM, "out of memory");
    json_decref(base);
  } else {
    rc = ckpt_save_with(dir, t->lm.model, text, t->lm.gen_config, t->ckpt_bf16, ckpt_extra, &c, &e);
  }
  free(text);
  if (rc) return trainer_fail_err(t, FAIL_IO_ERROR, NULL, &e);
  prune(t);
  /* the writer reads what it wrote once, while it is cached: the daemon indexes this manifest
   * and serves downloads by it without reading the files again */
  struct ckpt_manifest man;
  if ((rc = ckpt_manifest_read(dir, &man, &e))) return trainer_fail_err(t, FAIL_IO_ERROR, NULL, &e);
  struct runner_checkpoint told = {
      .step = t->step, .path = dir, .manifest = &man, .metrics = metrics};
  if (t->h && t->h->checkpoint && t->h->checkpoint(t->h->ctx, &told))
    return trainer_hook_failed(t, "checkpoint");
  return 0;
}
