/* Opening presets and checkpoint folders with their tokenizers; encoding prompts and sampling
 * from them (lm.h). */
#include "lm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chartok.h"
#include "checkpoint.h"
#include "preset.h"

#define SIDE_JSON_MAX ((off_t)16 << 20)
#define TOKENIZER_JSON_MAX ((off_t)256 << 20)

static int read_json(const char *dir, const char *name, size_t flags, off_t max, json_t **out,
                     struct dapo_err *e) {
  *out = NULL;
  char p[4096];
  if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p)
    return dapo_errf(e, DAPO_EINVAL, "%s: path too long", name);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : dapo_errf(e, DAPO_EIO, "%s: %s", name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > max) {
    close(fd);
    return dapo_errf(e, DAPO_EFORMAT, "%s: not a regular file of at most %lld MiB", name,
                     (long long)(max >> 20));
  }
  /* read whole, then parse: json_loadfd reads one byte per read(2) (43 s for Qwen's 7 MB
   * tokenizer.json) */
  char *buf = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (buf && got < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (!buf || got != (size_t)st.st_size) {
    free(buf);
    return dapo_errf(e, buf ? DAPO_EIO : DAPO_ENOMEM, "%s: %s", name,
                     buf ? "short read" : "out of memory");
  }
  json_error_t je;
  json_t *j = json_loadb(buf, got, flags, &je);
  free(buf);
  if (!j)
    return dapo_errf(e, DAPO_EFORMAT, "%s: line %d, column %d: %s", name, je.line, je.column,
                     je.text);
  if (!json_is_object(j)) {
    json_decref(j);
    return dapo_errf(e, DAPO_EFORMAT, "%s: expected a JSON object", name);
  }
  *out = j;
  return 0;
}

int lm_read_json(const char *dir, const char *name, json_t **out, struct dapo_err *e) {
  return read_json(dir, name, JSON_DECODE_INT_AS_REAL, SIDE_JSON_MAX, out, e);
}

static void add_stop(struct lm *lm, json_int_t id) {
  if (id < 0 || id >= lm->cfg.vocab_size) return;
  for (int i = 0; i < lm->n_stop; i++)
    if (lm->stop_ids[i] == id) return;
  if (lm->n_stop < (int)(sizeof lm->stop_ids / sizeof lm->stop_ids[0]))
    lm->stop_ids[lm->n_stop++] = (int)id;
}

/* eos_token_id of generation_config.json: an id or a list of ids (reals from the reader). */
static int gen_stops(struct lm *lm, struct dapo_err *e) {
  json_t *v = json_object_get(lm->gen_config, "eos_token_id");
  if (!v || json_is_null(v)) return 0;
  size_t n = json_is_array(v) ? json_array_size(v) : 1;
  for (size_t i = 0; i < n; i++) {
    json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
    double d = json_number_value(x);
    if (!json_is_number(x) || d != (double)(json_int_t)d || d < 0 || d >= lm->cfg.vocab_size)
      return dapo_errf(e, DAPO_EFORMAT,
                       "generation_config.json: eos_token_id must be token ids below %d",
                       lm->cfg.vocab_size);
    add_stop(lm, (json_int_t)d);
  }
  return 0;
}

int lm_write_extra(const struct lm *lm, const char *tmp_dir, struct dapo_err *e) {
  if (!lm->tok_config) return 0;
  char p[4096];
  snprintf(p, sizeof p, "%s/tokenizer_config.json", tmp_dir);
  return ckpt_write_json(p, lm->tok_config, e);
}

static int save_extra(void *ctx, const char *tmp_dir, struct dapo_err *e) {
  return lm_write_extra(ctx, tmp_dir, e);
}

/* The tokenizer of a folder without its weights: config.json parsed and checked, tokenizer.json
 * built. */
static int open_folder_meta(const char *spec, struct lm *out, struct dapo_err *e) {
  json_t *cj = NULL, *tj = NULL;
  int rc = read_json(spec, "config.json", 0, SIDE_JSON_MAX, &cj, e);
  if (rc) return rc;
  if (!cj) return dapo_errf(e, DAPO_EINVAL, "no config.json in the model folder");
  rc = model_config_from_json(&out->cfg, cj, e);
  json_decref(cj);
  if (rc || (rc = model_config_validate(&out->cfg, e)) ||
      (rc = read_json(spec, "tokenizer.json", 0, TOKENIZER_JSON_MAX, &tj, e)))
    return rc;
  if (!tj) return dapo_errf(e, DAPO_EINVAL, "no tokenizer.json in the model folder");
  out->tok = tok_from_json(tj, e);
  json_decref(tj);
  return out->tok ? 0 : e && e->code ? e->code : DAPO_ENOMEM;
}

/* What open_lm reads: the config and tokenizer only, the weights as well, or the weights of a
 * base that is only read (ckpt_load_frozen). */
enum { META, WEIGHTS, FROZEN };

/* A folder with its weights (ckpt_load, ckpt_load_frozen) and tokenizer. */
static int open_folder(const char *spec, int what, struct lm *out, struct dapo_err *e) {
  char *tj = NULL;
  int rc = what == FROZEN ? ckpt_load_frozen(spec, &out->model, &tj, e)
                          : ckpt_load(spec, &out->model, &tj, e);
  if (rc) return rc;
  out->cfg = out->model->cfg;
  if (!tj) return dapo_errf(e, DAPO_EINVAL, "no tokenizer.json in the model folder");
  out->tok = tok_from_text(tj, e);
  free(tj);
  return out->tok ? 0 : e && e->code ? e->code : DAPO_ENOMEM;
}

static int open_lm(const char *spec, uint64_t seed, int what, struct lm *out, struct dapo_err *e);

/* An adapter folder: its base (LORA_BASE_FILE, else adapter_config.json's base_model_name_or_path)
 * opened as usual, then the adapter loaded and attached; the folder's own side files win. */
static int open_adapter(const char *spec, int what, struct lm *out, struct dapo_err *e) {
  json_t *bj = NULL, *ac = NULL;
  char base[sizeof out->base];
  uint64_t seed = 0;
  int rc = lm_read_json(spec, LORA_BASE_FILE, &bj, e);
  if (!rc) rc = lm_read_json(spec, "adapter_config.json", &ac, e);
  if (rc) goto out;
  const char *b = json_string_value(json_object_get(bj, "model"));
  if (!b) b = json_string_value(json_object_get(ac, "base_model_name_or_path"));
  double sd = json_number_value(json_object_get(bj, "seed"));
  if (sd >= 0 && sd < 18446744073709551616.0) seed = (uint64_t)sd;
  if (!b || !*b || strlen(b) >= sizeof base) {
    rc = dapo_errf(e, DAPO_EFORMAT, "adapter_config.json: base_model_name_or_path missing");
    goto out;
  }
  snprintf(base, sizeof base, "%s", b);
  struct stat st;
  char p[sizeof base + 32];
  snprintf(p, sizeof p, "%s/adapter_config.json", base);
  if (stat(p, &st) == 0) {
    rc = dapo_errf(e, DAPO_EFORMAT, "the base model '%s' is itself an adapter", base);
    goto out;
  }
  if ((rc = open_lm(base, seed, what, out, e))) {
    dapo_err_prefix(e, "the adapter's base: ");
    goto out;
  }
  snprintf(out->base, sizeof out->base, "%s", base);
  out->base_seed = seed;
  if ((rc = lora_load(spec, &out->cfg, &out->lora, e))) goto out;
  if (out->model) out->model->lora = out->lora;
  /* the adapter folder's chat template and stop tokens, when it has them */
  json_t *tc = NULL, *gc = NULL;
  if ((rc = lm_read_json(spec, "tokenizer_config.json", &tc, e)) ||
      (rc = lm_read_json(spec, "generation_config.json", &gc, e)))
    goto out;
  if (tc) json_decref(out->tok_config), out->tok_config = tc;
  if (gc) {
    json_decref(out->gen_config);
    out->gen_config = gc;
    rc = gen_stops(out, e);
  }
out:
  json_decref(bj);
  json_decref(ac);
  return rc;
}

int lm_is_adapter_folder(const char *spec) {
  struct stat st;
  char ap[4096];
  int apn = snprintf(ap, sizeof ap, "%s/adapter_config.json", spec);
  return apn > 0 && (size_t)apn < sizeof ap && stat(spec, &st) == 0 && S_ISDIR(st.st_mode) &&
         stat(ap, &st) == 0;
}

/* Opens spec with what (META, WEIGHTS, FROZEN); see lm_open, lm_open_meta, lm_open_frozen. */
static int open_lm(const char *spec, uint64_t seed, int what, struct lm *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  struct stat st;
  int rc = 0;
  if (lm_is_adapter_folder(spec)) {
    if ((rc = open_adapter(spec, what, out, e))) {
      dapo_err_prefix(e, "%s: ", spec);
      lm_close(out);
    }
    return rc;
  }
  if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
    if ((rc = what != META ? open_folder(spec, what, out, e) : open_folder_meta(spec, out, e)) ||
        (rc = lm_read_json(spec, "tokenizer_config.json", &out->tok_config, e)) ||
        (rc = lm_read_json(spec, "generation_config.json", &out->gen_config, e)) ||
        (rc = gen_stops(out, e))) {
      dapo_err_prefix(e, "%s: ", spec);
      goto fail;
    }
  } else {
    const struct preset *p = preset_find(spec);
    if (!p) {
      char names[256];
      preset_names(names, sizeof names);
      return dapo_errf(e, DAPO_EINVAL,
                       "model '%s': neither a model folder nor a preset (presets: %s)", spec,
                       names);
    }
    out->cfg = p->cfg;
    struct chartok *ct = NULL;
    if ((rc = preset_build(spec, seed, what != META ? &out->model : NULL, &ct, e))) return rc;
    json_t *j = chartok_to_json(ct);
    chartok_free(ct);
    out->tok = j ? tok_from_json(j, e) : NULL;
    json_decref(j);
    if (!out->tok) {
      rc = e && e->code ? e->code : DAPO_ENOMEM;
      goto fail;
    }
  }
  if (tok_vocab_size(out->tok) > out->cfg.vocab_size) {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "model '%s': the tokenizer has %d tokens but the embedding only %d rows", spec,
                   tok_vocab_size(out->tok), out->cfg.vocab_size);
    goto fail;
  }
  /* logits and sampling over the tokenizer's ids only: embedding rows past them (Qwen's 151,936
   * rows for 151,669 ids) are padding that no text encodes and no sample may draw */
  out->cfg.vocab_used = tok_vocab_size(out->tok);
  if (out->model) out->model->cfg.vocab_used = out->cfg.vocab_used;
  add_stop(out, out->cfg.eos_token_id);
  return 0;
fail:
  lm_close(out);
  return rc;
}

int lm_open(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e) {
  return open_lm(spec, seed, WEIGHTS, out, e);
}

int lm_open_frozen(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e) {
  return open_lm(spec, seed, FROZEN, out, e);
}

int lm_open_meta(const char *spec, struct lm *out, struct dapo_err *e) {
  return open_lm(spec, 0, META, out, e);
}

int lm_save(const struct lm *lm, const char *dir, int bf16, struct dapo_err *e) {
  json_t *j = tok_to_json(lm->tok);
  char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
  json_decref(j);
  if (!text) return dapo_errf(e, DAPO_ENOMEM, "out of memory serialising tokenizer.json");
  struct model *merged = NULL, *m = lm->model;
  int rc = 0;
  if (m->lora) { /* a copy with the adapter merged in */
    if (!(merged = model_new(&m->cfg, e))) {
      free(text);
      return e && e->code ? e->code : DAPO_ENOMEM;
    }
    memcpy(merged->params, m->params, m->n_params * sizeof(float));
    lora_merge(m->lora, merged);
    m = merged;
  }
  rc = ckpt_save_with(dir, m, text, lm->gen_config, bf16, save_extra, (void *)lm, e);
  model_free(merged);
  free(text);
  return rc;
}

void lm_close(struct lm *lm) {
  model_free(lm->model);
  lora_free(lm->lora);
  tok_free(lm->tok);
  json_decref(lm->tok_config);
  json_decref(lm->gen_config);
  memset(lm, 0, sizeof *lm);
}

int lm_encode_prompt(const struct lm *lm, const char *text, size_t len, enum lm_prompt_kind kind,
                     int max_new, int **ids, int *n, struct dapo_err *e) {
  *ids = NULL;
  *n = 0;
  int special = kind == LM_PROMPT_TEXT, k = 0, rc;
  int *v = NULL;
  /* count, then encode into room for one more id (the BOS of an empty prompt) */
  if ((rc = tok_encode_special(lm->tok, text, len, special, NULL, 0, &k, e))) return rc;
  if (!(v = malloc(sizeof(int) * (size_t)(k + 1))))
    return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  if ((rc = tok_encode_special(lm->tok, text, len, special, v, k, &k, e))) goto fail;
  const struct model_config *c = &lm->cfg;
  if (k == 0) {
    if (c->bos_token_id < 0) {
      rc = dapo_errf(e, DAPO_EINVAL, "the prompt is empty and the model has no BOS token");
      goto fail;
    }
    v[k++] = c->bos_token_id;
  }
  if ((long long)k + max_new > c->max_position_embeddings) {
    rc = dapo_errf(e, DAPO_ERANGE,
                   "the prompt has %d tokens; with %d tokens to generate that exceeds the "
                   "model's context of %d",
                   k, max_new, c->max_position_embeddings);
    goto fail;
  }
  *ids = v;
  *n = k;
  return 0;
fail:
  free(v);
  return rc;
}

void lm_samples_free(struct lm_samples *out) {
  free(out->tokens), free(out->logp), free(out->len), free(out->finish);
  free(out->top_ids), free(out->top_logp);
  memset(out, 0, sizeof *out);
}

int lm_sample(const struct lm *lm, const int *ids, int n_ids, int n, const struct sampler_opts *o,
              uint64_t seed, struct lm_samples *out, struct dapo_err *e) {
  return lm_sample_step(lm, ids, n_ids, n, o, seed, NULL, NULL, out, e);
}

int lm_sample_step(const struct lm *lm, const int *ids, int n_ids, int n,
                   const struct sampler_opts *o, uint64_t seed, gen_step_fn step, void *step_ctx,
                   struct lm_samples *out, struct dapo_err *e) {
  return lm_sample_hooks(lm, ids, n_ids, n, o, seed, step, step_ctx, NULL, NULL, out, e);
}

int lm_sample_hooks(const struct lm *lm, const int *ids, int n_ids, int n,
                    const struct sampler_opts *o, uint64_t seed, gen_step_fn step, void *step_ctx,
                    gen_mask_fn mask, void *mask_ctx, struct lm_samples *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  if (!lm->model || n < 1 || n_ids < 1 || o->max_new_tokens < 1)
    return dapo_errf(e, DAPO_EINVAL, "lm_sample: no weights, no samples or an empty prompt");
  int rc = 0, max_new = o->max_new_tokens;
  struct sampler_opts so = *o;
  for (int i = 0; i < lm->n_stop && so.n_stop < SAMPLER_MAX_STOP; i++) {
    int dup = 0;
    for (int j = 0; j < so.n_stop; j++) dup |= so.stop_ids[j] == lm->stop_ids[i];
    if (!dup) so.stop_ids[so.n_stop++] = lm->stop_ids[i];
  }
  struct gen_state *gs = NULL;
  struct rng *rngs = malloc(sizeof(struct rng) * (size_t)n);
  const int **prompts = malloc(sizeof(int *) * (size_t)n);
  int *plens = malloc(sizeof(int) * (size_t)n);
  size_t slots = (size_t)n * (size_t)max_new;
  out->n = n;
  out->max_new = max_new;
  out->tokens = malloc(sizeof(int) * slots);
  out->logp = malloc(sizeof(float) * slots);
  out->len = malloc(sizeof(int) * (size_t)n);
  out->finish = malloc(sizeof(int) * (size_t)n);
  if (o->top_k > 0 && o->top_k <= SAMPLER_TOP_MAX) {
    out->top_k = o->top_k;
    out->top_ids = malloc(sizeof(int) * slots * (size_t)o->top_k);
    out->top_logp = malloc(sizeof(float) * slots * (size_t)o->top_k);
  }
  if (!rngs || !prompts || !plens || !out->tokens || !out->logp || !out->len || !out->finish ||
      (out->top_k && (!out->top_ids || !out->top_logp))) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  /* one prompt pointer for all: the sampler prefills it once */
  for (int i = 0; i < n; i++) {
    rng_seed(&rngs[i], seed, (uint64_t)i);
    prompts[i] = ids;
    plens[i] = n_ids;
  }
  if (!(gs = gen_state_new(lm->model, n, n_ids + max_new, e))) {
    rc = e && e->code ? e->code : DAPO_ENOMEM;
    goto out;
  }
  gen_state_set_step(gs, step, step_ctx);
  gen_state_set_mask(gs, mask, mask_ctx);
  struct gen_out go = {.tokens = out->tokens,
                       .logp = out->logp,
                       .len = out->len,
                       .finish = out->finish,
                       .top_ids = out->top_ids,
                       .top_logp = out->top_logp};
  rc = gen_run(gs, lm->model, n, prompts, plens, rngs, &so, &go, NULL, e);
out:
  gen_state_free(gs);
  free(rngs), free(prompts), free(plens);
  return rc;
}
