/* bpe_dump: encodes a corpus with our tokenizer for the parity check against the reference
 * (bpe_ref.mjs). Reads TOKENIZER.json and CORPUS.json (an array of strings), writes OUT.json: per
 * string {"ids", "ids_special", "decoded", "decoded_skip"} (decoded from ids_special, without and
 * with skip_special), as {"corpus": [...], "decode": [...]} where "decode" holds, for each id list
 * of the optional IDS.json (an array of arrays), [decoded, decoded_skip]. It also checks that
 * streaming decode, one token at a time, gives the same text as decoding all at once, and exits 1
 * if not. Usage: bpe_dump TOKENIZER CORPUS OUT [IDS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer.h"

static json_t *ids_json(const int *ids, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return a;
}

static int *encode(const struct tokenizer *t, const char *s, size_t len, int special, int *n) {
  struct dapo_err e = {0};
  if (tok_encode_special(t, s, len, special, NULL, 0, n, &e)) {
    fprintf(stderr, "bpe_dump: encode: %s\n", e.msg);
    return NULL;
  }
  int *ids = malloc(((size_t)*n + 1) * sizeof *ids);
  if (!ids || tok_encode_special(t, s, len, special, ids, *n, n, &e)) {
    fprintf(stderr, "bpe_dump: encode: %s\n", e.msg);
    free(ids);
    return NULL;
  }
  return ids;
}

/* Decodes with its length (the text may hold NULs); NULL on failure. */
static char *decode(const struct tokenizer *t, const int *ids, int n, int skip, size_t *len,
                    struct dapo_err *e) {
  if (tok_decode(t, ids, n, NULL, 0, len, skip, e)) return NULL;
  char *s = malloc(*len + 1);
  if (s && tok_decode(t, ids, n, s, *len + 1, len, skip, e)) {
    free(s);
    return NULL;
  }
  return s;
}

/* Streams ids through tok_stream and compares with want; 0 when equal. */
static int stream_check(const struct tokenizer *t, const int *ids, int n, int skip,
                        const char *want, size_t want_len) {
  struct dapo_err e = {0};
  struct tok_stream *s = tok_stream_new(t, skip);
  size_t cap = want_len + 64, at = 0, len;
  char *got = malloc(cap);
  int bad = !s || !got;
  for (int i = 0; i <= n && !bad; i++) {
    const char *piece =
        i < n ? tok_stream_push(s, ids[i], &len, &e) : tok_stream_finish(s, &len, &e);
    if (!piece || at + len > want_len || memcmp(want + at, piece, len) != 0)
      bad = 1;
    else
      at += len;
  }
  if (!bad && at != want_len) bad = 1;
  tok_stream_free(s);
  free(got);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: bpe_dump TOKENIZER.json CORPUS.json OUT.json [IDS.json]\n");
    return 2;
  }
  json_error_t je;
  json_t *tj = json_load_file(argv[1], 0, &je);
  json_t *corpus = json_load_file(argv[2], JSON_ALLOW_NUL, &je);
  if (!tj || !json_is_array(corpus)) {
    fprintf(stderr, "bpe_dump: cannot read %s / %s: %s\n", argv[1], argv[2], je.text);
    return 2;
  }
  struct dapo_err e = {0};
  struct tokenizer *t = tok_from_json(tj, &e);
  if (!t) {
    fprintf(stderr, "bpe_dump: %s\n", e.msg);
    return 1;
  }
  json_t *out = json_array();
  int stream_bad = 0, rc = 0;
  size_t i;
  json_t *v;
  json_array_foreach(corpus, i, v) {
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    int n0, n1;
    int *a = encode(t, s, len, 0, &n0), *b = encode(t, s, len, 1, &n1);
    if (!a || !b) {
      fprintf(stderr, "bpe_dump: corpus[%zu] failed\n", i);
      return 1;
    }
    size_t l0, l1;
    char *d0 = decode(t, b, n1, 0, &l0, &e), *d1 = decode(t, b, n1, 1, &l1, &e);
    if (!d0 || !d1) {
      fprintf(stderr, "bpe_dump: corpus[%zu]: decode: %s\n", i, e.msg);
      return 1;
    }
    if (stream_check(t, b, n1, 0, d0, l0) || stream_check(t, b, n1, 1, d1, l1)) {
      if (stream_bad++ < 10) fprintf(stderr, "bpe_dump: corpus[%zu]: streaming differs\n", i);
    }
    json_t *o = json_object();
    json_object_set_new(o, "ids", ids_json(a, n0));
    json_object_set_new(o, "ids_special", ids_json(b, n1));
    json_object_set_new(o, "decoded", json_stringn(d0, l0));
    json_object_set_new(o, "decoded_skip", json_stringn(d1, l1));
    json_array_append_new(out, o);
    free(a);
    free(b);
    free(d0);
    free(d1);
  }
  json_t *dec = json_array(), *lists = argc == 5 ? json_load_file(argv[4], 0, &je) : NULL;
  json_array_foreach(lists, i, v) {
    int n = (int)json_array_size(v);
    int *ids = malloc(((size_t)n + 1) * sizeof *ids);
    for (int k = 0; ids && k < n; k++) ids[k] = (int)json_integer_value(json_array_get(v, k));
    size_t l0 = 0, l1 = 0;
    char *d0 = ids ? decode(t, ids, n, 0, &l0, &e) : NULL;
    char *d1 = ids ? decode(t, ids, n, 1, &l1, &e) : NULL;
    if (!d0 || !d1) {
      fprintf(stderr, "bpe_dump: ids[%zu]: decode: %s\n", i, e.msg);
      return 1;
    }
    if (stream_check(t, ids, n, 0, d0, l0) || stream_check(t, ids, n, 1, d1, l1)) {
      if (stream_bad++ < 10) fprintf(stderr, "bpe_dump: ids[%zu]: streaming differs\n", i);
    }
    json_array_append_new(dec, json_pack("[s%,s%]", d0, l0, d1, l1));
    free(ids);
    free(d0);
    free(d1);
  }
  json_decref(lists);
  out = json_pack("{s:o,s:o}", "corpus", out, "decode", dec);
  if (json_dump_file(out, argv[3], JSON_COMPACT)) {
    fprintf(stderr, "bpe_dump: cannot write %s\n", argv[3]);
    rc = 1;
  }
  fprintf(stderr, "bpe_dump: %zu strings, streaming decode differs for %d\n",
          json_array_size(corpus), stream_bad);
  json_decref(out);
  json_decref(corpus);
  json_decref(tj);
  tok_free(t);
  return rc || stream_bad ? 1 : 0;
}
