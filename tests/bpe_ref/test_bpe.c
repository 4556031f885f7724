/* Unit checks of the byte-level BPE tokenizer (core/bpe.c) through the facade (tokenizer.h), on
 * small hand-made tokenizer.json files whose results are worked out by hand here: merge ranks in
 * both merge forms, ignore_merges, added tokens with lstrip/rstrip, the post-processor template,
 * streaming decode of a 4-byte emoji split over tokens and lossy decoding, every refusal message,
 * a 100 kB word, and several threads sharing one tokenizer. Parity with the reference library
 * on real files is tests/bpe_ref/bpe_ref.mjs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../check.h"
#include "tokenizer.h"

/* Encodes (no specials) into a static buffer; returns the count or -1. */
static int enc(const struct tokenizer *t, const char *s, int special, int *ids, int cap) {
  int n = 0;
  struct dapo_err e = {0};
  if (tok_encode_special(t, s, strlen(s), special, ids, cap, &n, &e)) {
    fprintf(stderr, "encode \"%s\": %s\n", s, e.msg);
    return -1;
  }
  return n;
}

static int ids_are(const int *got, int n, const int *want, int nwant) {
  if (n != nwant) return 0;
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) return 0;
  return 1;
}

#define CHECK_IDS(t, text, special, ...)                                                           \
  do {                                                                                             \
    int want_[] = {__VA_ARGS__}, got_[64];                                                         \
    int n_ = enc(t, text, special, got_, 64);                                                      \
    CHECK_MSG(ids_are(got_, n_, want_, (int)(sizeof want_ / sizeof *want_)), "encode \"%s\"",      \
              text);                                                                               \
  } while (0)

/* A character-level BPE (no pre-tokenizer, no decoder: tokens joined with spaces). */
static const char *TINY =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, "
    "\"bc\": 4, \"abc\": 5, \"aa\": 6, \"aaaa\": 7, \" \": 8}, \"merges\": []}, "
    "\"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": null, "
    "\"post_processor\": null, \"decoder\": null}";

static struct tokenizer *build(json_t *j, struct dapo_err *e) {
  struct tokenizer *t = tok_from_json(j, e);
  json_decref(j);
  return t;
}

static json_t *tiny_with_merges(const char *merges_json) {
  json_t *j = json_loads(TINY, 0, NULL);
  json_object_set_new(json_object_get(j, "model"), "merges", json_loads(merges_json, 0, NULL));
  return j;
}

static void test_merges(void) {
  struct dapo_err e = {0};
  /* both forms, same ranks: "a b" (0), "ab c" (1), "a a" (2), "aa aa" (3) */
  const char *forms[] = {"[\"a b\", \"ab c\", \"a a\", \"aa aa\"]",
                         "[[\"a\", \"b\"], [\"ab\", \"c\"], [\"a\", \"a\"], [\"aa\", \"aa\"]]"};
  for (int f = 0; f < 2; f++) {
    struct tokenizer *t = build(tiny_with_merges(forms[f]), &e);
    CHECK_MSG(t != NULL, "%s", e.msg);
    if (!t) continue;
    CHECK_IDS(t, "abc", 0, 5);
    CHECK_IDS(t, "abab", 0, 3, 3);
    CHECK_IDS(t, "aaa", 0, 6, 0);         /* the leftmost pair merges first */
    CHECK_IDS(t, "aaaaa", 0, 7, 0);       /* aa aa a */
    CHECK_IDS(t, "aab", 0, 0, 3);         /* "a b" (rank 0) before "a a" (rank 2) */
    CHECK_IDS(t, "cab c", 0, 2, 3, 8, 2); /* no pre-tokenizer: one word, space in vocab */
    CHECK_IDS(t, "axb", 0, 3);            /* x not in vocab and no unk: dropped, then a b merge */
    char *d = tok_decode_alloc(t, (int[]){3, 2}, 2, 0, &e);
    CHECK(d && strcmp(d, "ab c") == 0); /* no decoder: joined with spaces as the reference */
    free(d);
    tok_free(t);
  }
  /* ranks decide: with "b c" before "a b", "abc" becomes a + bc */
  struct tokenizer *t = build(tiny_with_merges("[\"b c\", \"a b\"]"), &e);
  CHECK_IDS(t, "abc", 0, 0, 4);
  tok_free(t);
  /* ignore_merges: a word in the vocabulary is taken whole, merges or not */
  json_t *j = tiny_with_merges("[\"a b\"]");
  t = build(json_deep_copy(j), &e);
  CHECK_IDS(t, "abc", 0, 3, 2);
  tok_free(t);
  json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_true());
  t = build(j, &e);
  CHECK_IDS(t, "abc", 0, 5);
  CHECK_IDS(t, "abcabc", 0, 3, 2, 3, 2); /* not in the vocabulary: merges as usual */
  tok_free(t);
}

static void test_added(void) {
  struct dapo_err e = {0};
  json_t *j = tiny_with_merges("[\"a b\"]");
  json_t *added = json_loads(
      "[{\"id\": 9, \"content\": \"<m>\", \"lstrip\": true, \"special\": true, \"normalized\": "
      "false},"
      " {\"id\": 10, \"content\": \"<r>\", \"rstrip\": true, \"special\": false, \"normalized\": "
      "false}, {\"id\": 11, \"content\": \"<p>\", \"special\": true}]",
      0, NULL);
  json_object_set_new(j, "added_tokens", added);
  json_object_set_new(
      j, "post_processor",
      json_loads("{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                 "{\"id\": \"<p>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": "
                 "\"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<m>\", "
                 "\"type_id\": 0}}], \"special_tokens\": {\"<p>\": {\"id\": "
                 "\"<p>\", \"ids\": [11], \"tokens\": [\"<p>\"]}, \"<m>\": {\"id\": "
                 "\"<m>\", \"ids\": [9], \"tokens\": [\"<m>\"]}}}",
                 0, NULL));
  struct tokenizer *t = build(j, &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  CHECK_IDS(t, "ab <m>c", 0, 3, 9, 2);         /* lstrip takes the space before */
  CHECK_IDS(t, "ab <r> c", 0, 3, 8, 10, 2);    /* rstrip takes the space after only */
  CHECK_IDS(t, "ab <p> c", 0, 3, 8, 11, 8, 2); /* no strip */
  CHECK_IDS(t, "<m<m>>", 0, 9);                /* '<', 'm', '>' are not in the vocabulary */
  CHECK_IDS(t, "ab", 1, 11, 3, 9);             /* the template around the text */
  CHECK(tok_bos_id(t) == 11);
  CHECK(tok_eos_id(t) == -1);
  CHECK(tok_token_to_id(t, "<r>") == 10);
  CHECK(tok_token_to_id(t, "ab") == 3);
  CHECK(tok_token_to_id(t, "zz") == -1);
  CHECK(tok_id_to_token(t, 9) && strcmp(tok_id_to_token(t, 9), "<m>") == 0);
  CHECK(tok_id_to_token(t, 12) == NULL);
  CHECK(tok_is_special(t, 9) && !tok_is_special(t, 10) && !tok_is_special(t, 3));
  CHECK(tok_vocab_size(t) == 12);
  char *d = tok_decode_alloc(t, (int[]){11, 3, 10, 9}, 4, 1, &e);
  CHECK(d && strcmp(d, "ab <r>") == 0); /* specials skipped, the rest joined with spaces */
  free(d);
  tok_free(t);
}

/* GPT-2's bytes_to_unicode, written out again here as an independent reference. */
static void byte_char(int b, char out[3]) {
  static int map[256];
  static int done;
  if (!done) {
    int n = 0;
    for (int i = 0; i < 256; i++) {
      int keep = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      map[i] = keep ? i : 256 + n++;
    }
    done = 1;
  }
  int cp = map[b];
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
  }
}

/* A byte-level tokenizer: id b for byte b, then "aa" 256, "aaaa" 257, "Ġa" 258 with merges. */
static json_t *bytelevel_json(void) {
  json_t *vocab = json_object();
  char c[3];
  for (int b = 0; b < 256; b++) {
    byte_char(b, c);
    json_object_set_new(vocab, c, json_integer(b));
  }
  json_object_set_new(vocab, "aa", json_integer(256));
  json_object_set_new(vocab, "aaaa", json_integer(257));
  byte_char(' ', c);
  char ga[8];
  snprintf(ga, sizeof ga, "%sa", c);
  json_object_set_new(vocab, ga, json_integer(258));
  json_t *merges = json_pack("[s,s,[s,s]]", "a a", "aa aa", c, "a");
  return json_pack("{s:{s:s,s:o,s:o},s:[],s:n,s:{s:s,s:b,s:b},s:n,s:{s:s}}", "model", "type", "BPE",
                   "vocab", vocab, "merges", merges, "added_tokens", "normalizer", "pre_tokenizer",
                   "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1, "post_processor",
                   "decoder", "type", "ByteLevel");
}

static void test_bytelevel_and_stream(void) {
  struct dapo_err e = {0};
  struct tokenizer *t = build(bytelevel_json(), &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  CHECK_IDS(t, "\xF0\x9F\x98\x80", 0, 0xF0, 0x9F, 0x98, 0x80); /* U+1F600, one id per byte */
  CHECK_IDS(t, "aaaaa a", 0, 257, 'a', 258);                   /* regex splits " a" off */
  CHECK(enc(t, "", 1, NULL, 0) == 0);
  /* streaming: nothing until the emoji's last byte */
  struct tok_stream *s = tok_stream_new(t, 0);
  size_t len = 99;
  const char *out;
  int bytes[] = {0xF0, 0x9F, 0x98};
  for (int i = 0; i < 3; i++) {
    out = tok_stream_push(s, bytes[i], &len, &e);
    CHECK(out && len == 0 && out[0] == 0);
  }
  out = tok_stream_push(s, 0x80, &len, &e);
  CHECK(out && len == 4 && memcmp(out, "\xF0\x9F\x98\x80", 4) == 0);
  out = tok_stream_push(s, 'x', &len, &e);
  CHECK(out && len == 1 && out[0] == 'x');
  /* an unfinished character at the end becomes one U+FFFD */
  out = tok_stream_push(s, 0xF0, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_push(s, 0x9F, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_finish(s, &len, &e);
  CHECK(out && len == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0);
  /* an interrupted character: U+FFFD then the byte that interrupted it */
  out = tok_stream_push(s, 0xE2, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_push(s, 'A', &len, &e);
  CHECK(out && len == 4 &&
        memcmp(out,
               "\xEF\xBF\xBD"
               "A",
               4) == 0);
  CHECK(tok_stream_push(s, 5000, &len, &e) == NULL && e.code == DAPO_EINVAL);
  tok_stream_free(s);
  /* batch decoding replaces as Rust's from_utf8_lossy (maximal subparts) */
  struct {
    int ids[4], n;
    const char *want;
  } lossy[] = {
      {{0xF0, 0x9F}, 2, "\xEF\xBF\xBD"},
      {{0xFF}, 1, "\xEF\xBF\xBD"},
      {{0xE0, 0x80}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},                   /* E0 needs A0..BF next */
      {{0xED, 0xA0, 0x80}, 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate */
      {{0xC3, 0xA9, 0xC3}, 3, "\xC3\xA9\xEF\xBF\xBD"},
  };
  for (size_t i = 0; i < sizeof lossy / sizeof *lossy; i++) {
    char *d = tok_decode_alloc(t, lossy[i].ids, lossy[i].n, 0, &e);
    CHECK_MSG(d && strcmp(d, lossy[i].want) == 0, "lossy case %zu", i);
    free(d);
  }
  char small[3];
  size_t need = 0;
  CHECK(tok_decode(t, (int[]){'a', 'b', 'c', 'd'}, 4, small, sizeof small, &need, 0, &e) ==
        DAPO_ERANGE);
  CHECK(need == 4 && strcmp(small, "ab") == 0);
  int ids[4], n = 0;
  CHECK(tok_encode(t, "a\xC3", 2, ids, 4, &n, &e) == DAPO_EINVAL);
  CHECK(strstr(e.msg, "invalid UTF-8 at byte 1") != NULL);
  CHECK(tok_encode(t, "aaaaa", 5, ids, 1, &n, &e) == DAPO_ERANGE && n == 2);
  CHECK(tok_encode(t, "aaaaa", 5, NULL, 0, &n, &e) == 0 && n == 2);
  tok_free(t);
}

/* 100 kB of one letter: one pre-token, 25,000 "aaaa" after 75,000 merges (a heap, not a rescan). */
static void test_long_word(void) {
  struct dapo_err e = {0};
  struct tokenizer *t = build(bytelevel_json(), &e);
  if (!t) return;
  size_t n = 100000;
  char *s = malloc(n + 1);
  memset(s, 'a', n);
  s[n] = 0;
  int *ids = malloc(n * sizeof *ids), k = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(tok_encode(t, s, n, ids, (int)n, &k, &e) == 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int all = k == 25000;
  for (int i = 0; i < k && all; i++) all = ids[i] == 257;
  CHECK_MSG(all, "k = %d", k);
  fprintf(stderr, "test_bpe: 100 kB word encoded in %.1f ms\n",
          (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
  free(s);
  free(ids);
  tok_free(t);
}

struct worker {
  const struct tokenizer *t;
  int bad;
};

static void *work(void *p) {
  struct worker *w = p;
  const char *texts[] = {"aaaa aaa a", "hello world", "\xF0\x9F\x98\x80 aaaaaaa", "a a a a"};
  for (int r = 0; r < 300; r++) {
    for (int i = 0; i < 4; i++) {
      int ids[64], n = enc(w->t, texts[i], 0, ids, 64);
      char *d = n >= 0 ? tok_decode_alloc(w->t, ids, n, 0, NULL) : NULL;
      if (!d || strcmp(d, texts[i]) != 0) w->bad++;
      free(d);
    }
  }
  return NULL;
}

static void test_threads(void) {
  struct dapo_err e = {0};
  struct tokenizer *t = build(bytelevel_json(), &e);
  if (!t) return;
  pthread_t th[4];
  struct worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (struct worker){t, 0};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(w[i].bad == 0);
  }
  tok_free(t);
}

/* Each edit of the byte-level file must be refused with this text in the message. */
static void refuse(const char *path, const char *value_json, const char *want) {
  json_t *j = bytelevel_json();
  json_t *parent = j;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  char *dot, *key = buf;
  while ((dot = strchr(key, '.'))) {
    *dot = 0;
    parent = json_object_get(parent, key);
    key = dot + 1;
  }
  json_t *v = json_loads(value_json, JSON_DECODE_ANY, NULL);
  CHECK_MSG(v != NULL, "bad test JSON %s", value_json);
  json_object_set_new(parent, key, v);
  struct dapo_err e = {0};
  struct tokenizer *t = build(j, &e);
  CHECK_MSG(t == NULL && strstr(e.msg, want) && strncmp(e.msg, "tokenizer.json: ", 16) == 0,
            "%s = %s: got \"%s\", want \"%s\"", path, value_json, t ? "(accepted)" : e.msg, want);
  tok_free(t);
}

static void test_refusals(void) {
  refuse("model.type", "\"WordPiece\"", "model.type \"WordPiece\" is not supported");
  refuse("normalizer", "{\"type\": \"Precompiled\"}",
         "normalizer.type \"Precompiled\" is not supported");
  refuse("normalizer",
         "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": "
         "\"Lowercase\"}]}",
         "normalizer.normalizers[1].type \"Lowercase\" is not supported");
  refuse("normalizer", "{\"type\": \"Sequence\"}", "normalizer.normalizers must be an array");
  refuse("normalizer", "7", "normalizer must be an object or null");
  refuse("pre_tokenizer", "{\"type\": \"Metaspace\"}",
         "pre_tokenizer.type \"Metaspace\" is not supported");
  refuse("pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
         "{\"type\": \"Digits\"}]}",
         "pre_tokenizer.pretokenizers[1]: a pre-tokenizer after ByteLevel is not supported");
  refuse("pre_tokenizer",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
         "\"Isolated\"}",
         "pre_tokenizer.pattern: regex does not compile at offset 1");
  refuse("pre_tokenizer",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
         "\"Weird\"}",
         "pre_tokenizer.behavior \"Weird\" is not supported");
  refuse("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": \"Isolated\"}",
         "pre_tokenizer.pattern must be {\"Regex\": string} or {\"String\": string}");
  refuse("pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": 1}",
         "pre_tokenizer.add_prefix_space must be a boolean");
  refuse("post_processor", "{\"type\": \"RobertaProcessing\"}",
         "post_processor.type \"RobertaProcessing\" is not supported");
  refuse("post_processor",
         "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
         "{\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}",
         "post_processor.single[0]: special token \"<s>\" is not in special_tokens");
  refuse("post_processor", "{\"type\": \"TemplateProcessing\", \"single\": []}",
         "post_processor.single has no Sequence \"A\"");
  refuse("decoder", "{\"type\": \"Metaspace\"}", "decoder.type \"Metaspace\" is not supported");
  refuse("decoder", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}]}",
         "decoder: only a Sequence of one ByteLevel decoder is supported");
  refuse("model.byte_fallback", "true", "model.byte_fallback true is not supported");
  refuse("model.dropout", "0.1", "model.dropout is not supported");
  refuse("model.unk_token", "\"<unk>\"", "model.unk_token is not supported");
  refuse("model.continuing_subword_prefix", "\"##\"",
         "model.continuing_subword_prefix is not supported");
  refuse("model.merges", "[\"a\"]", "model.merges[0]: \"a\" is not two tokens");
  refuse("model.merges", "[[1, 2]]", "model.merges[0] must be a string \"a b\" or a pair");
  refuse("model.merges", "[\"a a\", \"a \\u0100z\"]",
         "model.merges[1]: token \"\xC4\x80z\" is not in model.vocab");
  refuse("model.merges", "[\"b c\"]", "model.merges[0]: merged token \"bc\" is not in model.vocab");
  refuse("model.merges", "{}", "model.merges must be an array");
  refuse("model.vocab", "[]", "model.vocab must be an object");
  refuse("model.vocab", "{\"a\": -1}", "model.vocab[\"a\"]: id must be an integer");
  refuse("model.vocab", "{\"a\": 0, \"b\": 0}", "model.vocab: id 0 is given to two tokens");
  refuse("model", "[]", "model must be an object");
  refuse("added_tokens", "{}", "added_tokens must be an array");
  refuse("added_tokens", "[{\"id\": 300, \"content\": \"\"}]",
         "added_tokens[0].content must be a string of 1..4096 bytes");
  refuse("added_tokens", "[{\"id\": \"x\", \"content\": \"<s>\"}]",
         "added_tokens[0].id must be an integer");
  refuse("added_tokens", "[{\"id\": 300, \"content\": \"<s>\", \"lstrip\": \"yes\"}]",
         "added_tokens[0].lstrip must be a boolean");
  refuse("truncation", "{}", "truncation is not supported");
  refuse("padding", "{}", "padding is not supported");
  struct dapo_err e = {0};
  CHECK(tok_from_text("[1]", &e) == NULL && strstr(e.msg, "the top level must be an object"));
  /* from a file: the path leads the message */
  char path[] = "/tmp/test_bpe_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    json_t *j = bytelevel_json();
    char *text = json_dumps(j, 0);
    json_decref(j);
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    free(text);
    struct tokenizer *t = tok_from_file(path, &e);
    CHECK_MSG(t && tok_vocab_size(t) == 259, "%s", e.msg);
    tok_free(t);
    unlink(path);
    CHECK(tok_from_file(path, &e) == NULL && e.code == DAPO_EIO && strstr(e.msg, path));
  }
  CHECK(tok_from_text("{", &e) == NULL && strstr(e.msg, "tokenizer.json: line 1"));
}

/* Structural mutations of a valid file (a value replaced by one of another type or an extreme
 * one): the loader must refuse or build a tokenizer that encodes and decodes without crashing
 * (run under ASan by the suite's sanitizer stage). */
struct slot {
  json_t *parent;
  const char *key; /* NULL: array index */
  size_t index;
};

static void collect(json_t *j, struct slot *out, int *n, int cap) {
  const char *k;
  json_t *v;
  size_t i;
  if (json_is_object(j)) {
    json_object_foreach(j, k, v) {
      if (*n < cap) out[(*n)++] = (struct slot){j, k, 0};
      /* the vocabulary's 259 entries would take most picks: only a few of them */
      if (strcmp(k, "vocab") == 0) {
        const char *picks[] = {"a", "aa", "aaaa"};
        for (int p = 0; p < 3 && *n < cap; p++) out[(*n)++] = (struct slot){v, picks[p], 0};
      } else {
        collect(v, out, n, cap);
      }
    }
  } else if (json_is_array(j)) {
    json_array_foreach(j, i, v) {
      if (*n < cap) out[(*n)++] = (struct slot){j, NULL, i};
      collect(v, out, n, cap);
    }
  }
}

static void test_mutations(void) {
  static const char *const values[] = {"null",      "true",       "0",
                                       "-1",        "4294967297", "1e300",
                                       "\"\"",      "\"x\"",      "[]",
                                       "{}",        "[[]]",       "{\"type\": \"Sequence\"}",
                                       "\"a b c\"", "2097152",    "[\"a\", \"a\"]"};
  unsigned seed = 12345;
  int built = 0, refused = 0;
  for (int it = 0; it < 1500; it++) {
    json_t *j = bytelevel_json();
    json_object_set_new(j, "added_tokens",
                        json_pack("[{s:i,s:s,s:b},{s:i,s:s,s:b,s:b}]", "id", 259, "content", "<s>",
                                  "special", 1, "id", 260, "content", "ab", "lstrip", 1,
                                  "normalized", 1));
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    static struct slot slots[1024];
    int n = 0;
    collect(j, slots, &n, 1024);
    for (int m = 0; m < 1 + it % 3; m++) {
      seed = seed * 1103515245u + 12345u;
      struct slot sl = slots[(seed >> 8) % (unsigned)n];
      seed = seed * 1103515245u + 12345u;
      json_t *v =
          json_loads(values[(seed >> 8) % (sizeof values / sizeof *values)], JSON_DECODE_ANY, NULL);
      if (sl.key)
        json_object_set_new(sl.parent, sl.key, v);
      else
        json_array_set_new(sl.parent, sl.index, v);
      n = 0; /* the tree changed: collect again before the next mutation */
      collect(j, slots, &n, 1024);
      if (n == 0) break;
    }
    struct dapo_err e = {0};
    struct tokenizer *t = build(j, &e);
    if (!t) {
      refused++;
      CHECK_MSG(e.code != 0 && e.msg[0], "iteration %d refused without a message", it);
      continue;
    }
    built++;
    int ids[256], k = 0;
    const char *text = "<s>ab caf\xC3\xA9 \xF0\x9F\x98\x80 aaaa";
    if (tok_encode_special(t, text, strlen(text), 1, ids, 256, &k, &e) == 0) {
      char *d = tok_decode_alloc(t, ids, k, 0, &e);
      free(d);
    }
    int rnd[8];
    for (int i = 0; i < 8; i++)
      rnd[i] = (int)((seed >> (i * 3)) % (unsigned)(tok_vocab_size(t) + 1));
    free(tok_decode_alloc(t, rnd, 8, 1, &e));
    tok_free(t);
  }
  fprintf(stderr, "test_bpe: mutations: %d built, %d refused\n", built, refused);
  CHECK(built > 0 && refused > 0);
}

int main(void) {
  test_merges();
  test_added();
  test_bytelevel_and_stream();
  test_long_word();
  test_threads();
  test_refusals();
  test_mutations();
  return check_done("test_bpe");
}
