/* Tokenizer facade (tokenizer.h): a tagged union over the implementations. */
#include "tokenizer.h"

#include <stdlib.h>

#include "chartok.h"

enum tok_kind { TOK_CHAR };

struct tokenizer {
  enum tok_kind kind;
  struct chartok *ct;
};

struct tokenizer *tok_from_json(const json_t *j, struct dapo_err *e) {
  struct chartok *ct = chartok_from_json(j, e);
  if (!ct) {
    dapo_err_prefix(e, "tokenizer.json: ");
    return NULL;
  }
  struct tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    chartok_free(ct);
    dapo_errf(e, DAPO_ENOMEM, "out of memory");
    return NULL;
  }
  t->kind = TOK_CHAR;
  t->ct = ct;
  return t;
}

struct tokenizer *tok_from_text(const char *text, struct dapo_err *e) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) {
    dapo_errf(e, DAPO_EFORMAT, "tokenizer.json: line %d: %s", je.line, je.text);
    return NULL;
  }
  struct tokenizer *t = tok_from_json(j, e);
  json_decref(j);
  return t;
}

void tok_free(struct tokenizer *t) {
  if (!t) return;
  chartok_free(t->ct);
  free(t);
}

int tok_vocab_size(const struct tokenizer *t) {
  return chartok_vocab_size(t->ct);
}

json_t *tok_to_json(const struct tokenizer *t) {
  return chartok_to_json(t->ct);
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int *ids, int cap,
               int *n_out, struct dapo_err *e) {
  return chartok_encode(t->ct, text, len, ids, cap, n_out, e);
}

int tok_decode(const struct tokenizer *t, const int *ids, int n, char *buf, size_t cap,
               size_t *len_out, int skip_special, struct dapo_err *e) {
  return chartok_decode(t->ct, ids, n, buf, cap, len_out, skip_special, e);
}

char *tok_decode_alloc(const struct tokenizer *t, const int *ids, int n, int skip_special,
                       struct dapo_err *e) {
  size_t need = 0;
  if (tok_decode(t, ids, n, NULL, 0, &need, skip_special, e)) return NULL;
  char *buf = malloc(need + 1);
  if (!buf) {
    dapo_errf(e, DAPO_ENOMEM, "out of memory decoding %d tokens", n);
    return NULL;
  }
  if (tok_decode(t, ids, n, buf, need + 1, &need, skip_special, e)) {
    free(buf);
    return NULL;
  }
  return buf;
}
