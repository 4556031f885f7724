/* Opening presets and checkpoint folders with their tokenizers (lm.h). */
#include "lm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chartok.h"
#include "checkpoint.h"
#include "preset.h"

int lm_open(const char *spec, uint64_t seed, struct lm *out, struct dapo_err *e) {
  memset(out, 0, sizeof *out);
  struct stat st;
  int rc = 0;
  if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) {
    char *tj = NULL;
    if ((rc = ckpt_load(spec, &out->model, &tj, e))) return rc;
    if (!tj) {
      rc = dapo_errf(e, DAPO_EINVAL, "%s: no tokenizer.json in the model folder", spec);
      goto fail;
    }
    out->tok = tok_from_text(tj, e);
    free(tj);
    if (!out->tok) {
      rc = dapo_err_prefix(e, "%s: ", spec);
      goto fail;
    }
  } else {
    if (!preset_find(spec)) {
      char names[256];
      preset_names(names, sizeof names);
      return dapo_errf(e, DAPO_EINVAL,
                       "model '%s': neither a model folder nor a preset (presets: %s)", spec,
                       names);
    }
    struct chartok *ct = NULL;
    if ((rc = preset_build(spec, seed, &out->model, &ct, e))) return rc;
    json_t *j = chartok_to_json(ct);
    chartok_free(ct);
    out->tok = j ? tok_from_json(j, e) : NULL;
    json_decref(j);
    if (!out->tok) {
      rc = e && e->code ? e->code : DAPO_ENOMEM;
      goto fail;
    }
  }
  if (tok_vocab_size(out->tok) > out->model->cfg.vocab_size) {
    rc = dapo_errf(e, DAPO_EINVAL,
                   "model '%s': the tokenizer has %d tokens but the embedding only %d rows", spec,
                   tok_vocab_size(out->tok), out->model->cfg.vocab_size);
    goto fail;
  }
  return 0;
fail:
  lm_close(out);
  return rc;
}

int lm_save(const struct lm *lm, const char *dir, int bf16, struct dapo_err *e) {
  json_t *j = tok_to_json(lm->tok);
  char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
  json_decref(j);
  if (!text) return dapo_errf(e, DAPO_ENOMEM, "out of memory serialising tokenizer.json");
  int rc = ckpt_save(dir, lm->model, text, NULL, bf16, e);
  free(text);
  return rc;
}

void lm_close(struct lm *lm) {
  model_free(lm->model);
  tok_free(lm->tok);
  lm->model = NULL;
  lm->tok = NULL;
}
