/* Encodes supervised lines with core/rl/sft.c for tests/rl/test_sft_tools.py: argv[1] a model
 * folder (its tokenizer and tokenizer_config.json's chat template, "auto"); stdin one JSON array
 * of lines; prints a JSON array with, per line, {"tokens": [ids], "trained": [0|1], "text": the
 * tokens decoded, "trained_text": [the decoded runs of trained tokens]} or {"error": message}. */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "chat.h"
#include "lm.h"
#include "sft.h"
#include "tokenizer.h"

static json_t *decoded(const struct lm *lm, const int *ids, int n) {
  struct dapo_err e = {0};
  char *s = tok_decode_alloc(lm->tok, ids, n, 0, &e);
  json_t *j = json_string(s ? s : e.msg);
  free(s);
  return j;
}

static json_t *one(const struct lm *lm, const struct chat_template *chat, const json_t *line,
                   int lineno) {
  struct dapo_err e = {0};
  struct sft_example x;
  int end = lm->n_stop > 0 ? lm->stop_ids[0] : tok_eos_id(lm->tok);
  if (sft_check_line(line, lineno, &e) ||
      sft_encode(lm, chat, end, line, lineno, 1 << 20, 0, &x, &e))
    return json_pack("{s:s}", "error", e.msg);
  json_t *toks = json_array(), *tr = json_array(), *runs = json_array();
  for (int i = 0; i < x.n; i++) {
    json_array_append_new(toks, json_integer(x.tokens[i]));
    json_array_append_new(tr, json_integer(x.trained[i]));
    if (x.trained[i] && (i == 0 || !x.trained[i - 1])) {
      int j = i;
      while (j < x.n && x.trained[j]) j++;
      json_array_append_new(runs, decoded(lm, x.tokens + i, j - i));
    }
  }
  json_t *o = json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "trained", tr, "text",
                        decoded(lm, x.tokens, x.n), "trained_text", runs);
  sft_example_deinit(&x);
  return o;
}

int main(int argc, char **argv) {
  struct lm lm;
  struct dapo_err e = {0};
  json_error_t je;
  json_t *in = argc == 2 ? json_loadf(stdin, 0, &je) : NULL;
  if (!in || lm_open_meta(argv[1], &lm, &e)) {
    fprintf(stderr, "usage: sft_dump MODEL_DIR < lines.json (%s)\n", in ? e.msg : "no input");
    return 2;
  }
  struct chat_template *chat = chat_from_spec(NULL, lm.tok_config, &e);
  if (!chat) {
    fprintf(stderr, "sft_dump: %s\n", e.msg);
    return 2;
  }
  json_t *out = json_array(), *line;
  size_t i;
  json_array_foreach(in, i, line) json_array_append_new(out, one(&lm, chat, line, (int)i + 1));
  json_dumpf(out, stdout, JSON_ENSURE_ASCII);
  putchar('\n');
  json_decref(out);
  json_decref(in);
  chat_free(chat);
  lm_close(&lm);
  return 0;
}
