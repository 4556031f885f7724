/* libFuzzer target: the tokenizer facade (tok_from_text: chartok today, byte-level BPE once it
 * lands). The input is a tokenizer.json text; when it loads, a few fixed strings and the input's
 * own bytes are encoded and decoded: ids stay inside the vocabulary, counting agrees with
 * encoding, decode reports the length it needs, and the saved JSON loads again into a tokenizer
 * that encodes the same. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tokenizer.h"

#define CAP 512

static void probe(const struct tokenizer *t, const struct tokenizer *t2, const char *s,
                  size_t len) {
  int ids[CAP], ids2[CAP], n = -1, n2 = -1, cnt = -1;
  struct dapo_err e = {0};
  int rc = tok_encode(t, s, len, ids, CAP, &n, &e);
  if (rc == DAPO_ERANGE || rc == DAPO_EINVAL || rc == DAPO_EFORMAT) return;
  FUZZ_CHECK(rc == 0 || rc == DAPO_ENOMEM);
  if (rc) return;
  FUZZ_CHECK(n >= 0 && n <= CAP);
  FUZZ_CHECK(tok_encode(t, s, len, NULL, 0, &cnt, &e) == 0 && cnt == n);
  int V = tok_vocab_size(t);
  for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < V);
  if (t2) {
    FUZZ_CHECK(tok_encode(t2, s, len, ids2, CAP, &n2, &e) == 0);
    FUZZ_CHECK(n2 == n && memcmp(ids, ids2, (size_t)n * sizeof *ids) == 0);
  }
  for (int skip = 0; skip < 2; skip++) {
    size_t need = 0;
    char small[4];
    int r = tok_decode(t, ids, n, small, sizeof small, &need, skip, &e);
    FUZZ_CHECK(r == 0 || r == DAPO_ERANGE);
    char *full = tok_decode_alloc(t, ids, n, skip, &e);
    FUZZ_CHECK(full != NULL);
    FUZZ_CHECK(strlen(full) <= need); /* shorter only when a token decodes to NUL */
    if (r == 0) FUZZ_CHECK(need < sizeof small);
    free(full);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  struct dapo_err e = {0};
  struct tokenizer *t = tok_from_text(text, &e);
  if (!t) {
    FUZZ_CHECK(e.msg[0] != '\0');
    free(text);
    return 0;
  }
  FUZZ_CHECK(tok_vocab_size(t) > 0);
  json_t *saved = tok_to_json(t);
  FUZZ_CHECK(saved != NULL);
  struct tokenizer *t2 = tok_from_json(saved, &e);
  FUZZ_CHECK(t2 != NULL);
  FUZZ_CHECK(tok_vocab_size(t2) == tok_vocab_size(t));
  json_decref(saved);
  static const char *const fixed[] = {
      "",         "Hello, world!", "12+34=46", " \n\t", "caf\xc3\xa9 \xe2\x82\xac",
      "\xff\xfe", "<|endoftext|>"};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
    probe(t, t2, fixed[i], strlen(fixed[i]));
  probe(t, t2, text, size < 256 ? size : 256);
  /* every id decodes */
  int V = tok_vocab_size(t);
  for (int id = 0; id < V && id < 4096; id++) {
    char *s = tok_decode_alloc(t, &id, 1, 0, &e);
    free(s);
  }
  int bad = V;
  size_t need;
  char buf[16];
  FUZZ_CHECK(tok_decode(t, &bad, 1, buf, sizeof buf, &need, 0, &e) != 0);
  tok_free(t2);
  tok_free(t);
  free(text);
  return 0;
}
