/* Unit checks of the byte-level BPE tokenizer (core/text/bpe.c) through the facade (tokenizer.h),
 * on small hand-made tokenizer.json files whose results are worked out by hand here: merge ranks in
 * both merge forms, ignore_merges, added tokens with lstrip/rstrip, the post-processor template,
 * streaming decode of a 4-byte emoji split over tokens and lossy decoding, every refusal message,
 * a 100 kB word, and several threads sharing one tokenizer; then SentencePiece-style files (Llama
 * 2's shape): Prepend/Replace normalizers, byte fallback, unk fused or not or null, Metaspace
 * schemes and split, the Replace/ByteFallback/Fuse/Strip and Metaspace decoders, streaming of byte
 * runs, a character BPE with its own unk token, and their refusals. Parity with the reference
 * library on real files is tests/text/bpe_ref/bpe_ref.mjs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
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

/* ---- SentencePiece-style BPE (Llama 2's shape) on a hand-made vocabulary ---- */

/* "▁" is U+2581 (E2 96 81). Byte tokens exist for F0 9F 98 80 (U+1F600), E2 82 AC (U+20AC) and
 * FF only, so "é" (C3 A9) has no byte fallback and becomes <unk>. The expected ids and texts
 * below were worked out by hand, then checked once against the reference library. */
#define MS "\xE2\x96\x81"
static const char *SP =
    "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
    "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xF0>\": 3, "
    "\"<0x9F>\": 4, \"<0x98>\": 5, \"<0x80>\": 6, \"<0xE2>\": 7, \"<0x82>\": 8, \"<0xAC>\": 9, "
    "\"<0xFF>\": 10, \"" MS "\": 11, \"a\": 12, \"b\": 13, \"c\": 14, \"" MS "a\": 15, \"ab\": 16, "
    "\"" MS "ab\": 17, \"x\": 18, \"b" MS "\": 19}, \"merges\": [\"b " MS "\", \"" MS " a\", "
    "\"a b\", \"" MS "a b\"]}, "
    "\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": "
    "false}, {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false}, "
    "{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}], "
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
    "\"prepend\": \"" MS "\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
    "\"content\": \"" MS "\"}]}, \"pre_tokenizer\": null, "
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
    "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
    "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}, "
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
    "{\"String\": \"" MS "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": "
    "\"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}}";

/* SP with one member replaced ("model.fuse_unk" style path, value as JSON). */
static json_t *sp_with(const char *path, const char *value_json) {
  json_t *j = json_loads(SP, 0, NULL);
  if (!path) return j;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  json_t *parent = j;
  char *dot, *key = buf;
  while ((dot = strchr(key, '.'))) {
    *dot = 0;
    parent = json_object_get(parent, key);
    key = dot + 1;
  }
  json_object_set_new(parent, key, json_loads(value_json, JSON_DECODE_ANY, NULL));
  return j;
}

static struct tokenizer *sp_tok(const char *path, const char *value_json) {
  struct dapo_err e = {0};
  struct tokenizer *t = build(sp_with(path, value_json), &e);
  CHECK_MSG(t != NULL, "%s = %s: %s", path ? path : "SP", value_json ? value_json : "", e.msg);
  return t;
}

#define CHECK_DEC(t, skip, want, ...)                                                              \
  do {                                                                                             \
    int ids_[] = {__VA_ARGS__};                                                                    \
    struct dapo_err e_ = {0};                                                                      \
    char *d_ = tok_decode_alloc(t, ids_, (int)(sizeof ids_ / sizeof *ids_), skip, &e_);            \
    CHECK_MSG(d_ &&strcmp(d_, want) == 0, "decode: got \"%s\" want \"%s\" (%s)",                   \
              d_ ? d_ : "(null)", want, e_.msg);                                                   \
    free(d_);                                                                                      \
  } while (0)

static void test_sentencepiece(void) {
  struct tokenizer *t = sp_tok(NULL, NULL);
  if (!t) return;
  CHECK_IDS(t, "ab", 0, 17);            /* ▁ab: "▁ a" (rank 1) then "▁a b" (rank 3) */
  CHECK_IDS(t, "ab", 1, 1, 17);         /* the <s> template */
  CHECK_IDS(t, "a b", 0, 15, 11, 13);   /* ▁a▁b: no merge joins ▁a ▁ b */
  CHECK_IDS(t, "ab ab", 0, 15, 19, 16); /* one word ▁ab▁ab: "b ▁" (rank 0) first */
  CHECK_IDS(t, " ab", 0, 11, 17);
  CHECK_IDS(t, "", 1, 1);                               /* Prepend skips empty text */
  CHECK_IDS(t, "a\xF0\x9F\x98\x80", 0, 15, 3, 4, 5, 6); /* the emoji's bytes */
  CHECK_IDS(t, "\xE2\x82\xAC", 0, 11, 7, 8, 9);         /* the euro sign's bytes */
  CHECK_IDS(t, "\xC3\xA9", 0, 11, 0);                   /* é: no <0xC3>: unk */
  CHECK_IDS(t, "\xC3\xA9\xC3\xA9", 0, 11, 0);           /* fused */
  CHECK_IDS(t, "\xC3\xA9x\xC3\xA9", 0, 11, 0, 18, 0);
  /* the reference's order: a pending unk is written after the byte tokens that follow it */
  CHECK_IDS(t, "\xC3\xA9\xF0\x9F\x98\x80", 0, 11, 3, 4, 5, 6, 0);
  CHECK_IDS(t, "<s>ab</s>", 0, 1, 17, 2); /* each piece between added tokens gets its ▁ */
  CHECK_IDS(t, "<s>ab</s>", 1, 1, 1, 17, 2);
  CHECK(tok_bos_id(t) == 1 && tok_eos_id(t) == -1);
  CHECK(tok_token_to_id(t, "<0xE2>") == 7 && tok_token_to_id(t, MS "ab") == 17);
  /* decode: Replace ▁ -> space, byte runs, Fuse, Strip one leading space */
  CHECK_DEC(t, 0, "<s> ab</s>", 1, 17, 2);
  CHECK_DEC(t, 1, "ab", 1, 17, 2);
  CHECK_DEC(t, 0, "a\xF0\x9F\x98\x80", 15, 3, 4, 5, 6);
  CHECK_DEC(t, 0, "\xEF\xBF\xBD\xEF\xBF\xBD a", 7, 8, 15); /* an invalid run: U+FFFD per byte */
  CHECK_DEC(t, 0, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 7, 8, 9, 10);
  CHECK_DEC(t, 0, "\xE2\x82\xAC a", 7, 8, 9, 15);
  CHECK_DEC(t, 0, "", 11);
  CHECK_DEC(t, 0, "\xEF\xBF\xBD\xEF\xBF\xBD", 7, 8);
  CHECK_DEC(t, 0, "a", 11, 12);
  /* streaming: a run is held until a token that is not a byte (or the end) decides it */
  struct dapo_err e = {0};
  struct tok_stream *s = tok_stream_new(t, 0);
  size_t len = 99;
  const char *out;
  int run[] = {7, 8, 9};
  for (int i = 0; i < 3; i++) {
    out = tok_stream_push(s, run[i], &len, &e);
    CHECK(out && len == 0);
  }
  out = tok_stream_push(s, 15, &len, &e);
  CHECK(out && len == 5 && memcmp(out, "\xE2\x82\xAC a", 5) == 0);
  out = tok_stream_push(s, 7, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_push(s, 8, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_finish(s, &len, &e);
  CHECK(out && len == 6 && memcmp(out, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0);
  CHECK(tok_stream_push(s, 500, &len, &e) == NULL && e.code == DAPO_EINVAL);
  tok_stream_free(s);
  s = tok_stream_new(t, 0); /* the leading space of the whole text is stripped */
  out = tok_stream_push(s, 11, &len, &e);
  CHECK(out && len == 0);
  out = tok_stream_push(s, 15, &len, &e);
  CHECK(out && len == 2 && memcmp(out, " a", 2) == 0);
  tok_stream_free(s);
  tok_free(t);

  t = sp_tok("model.fuse_unk", "false");
  CHECK_IDS(t, "\xC3\xA9\xC3\xA9", 0, 11, 0, 0);
  CHECK_IDS(t, "\xC3\xA9x\xC3\xA9", 0, 11, 0, 18, 0);
  tok_free(t);
  t = sp_tok("model.unk_token", "null"); /* no unk: dropped */
  CHECK_IDS(t, "\xC3\xA9", 0, 11);
  CHECK_IDS(t, "a\xC3\xA9\xF0\x9F\x98\x80", 0, 15, 3, 4, 5, 6);
  tok_free(t);
  t = sp_tok("model.byte_fallback", "false");
  CHECK_IDS(t, "a\xF0\x9F\x98\x80\xE2\x82\xAC", 0, 15, 0);
  tok_free(t);
  /* an unk_token outside the vocabulary fails the encode that needs it, as in the reference */
  t = sp_tok("model.unk_token", "\"<nope>\"");
  CHECK_IDS(t, "ab", 0, 17);
  int ids[8], n = 0;
  CHECK(tok_encode(t, "\xC3\xA9", 2, ids, 8, &n, &e) == DAPO_EINVAL &&
        strstr(e.msg, "model.unk_token \"<nope>\" is not in model.vocab"));
  tok_free(t);
  /* a Replace regex normalizer, before Prepend */
  t = sp_tok("normalizer",
             "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": "
             "{\"Regex\": \"\\\\s+\"}, \"content\": \"" MS "\"}, {\"type\": \"Prepend\", "
             "\"prepend\": \"" MS "\"}]}");
  CHECK_IDS(t, "ab  \t ab", 0, 15, 19, 16);
  tok_free(t);
  /* a normalized added token is matched by its normalized form (▁ab) */
  t = sp_tok("added_tokens", "[{\"id\": 20, \"content\": \"ab\", \"normalized\": true}]");
  CHECK_IDS(t, "ab ab", 0, 16, 16);
  tok_free(t);
}

/* Metaspace as pre-tokenizer (no normalizer) and decoder, each scheme. */
static void test_metaspace(void) {
  static const struct {
    const char *ms;
    int ab_ab[3], n_ab_ab, s_ab[2], ab_s_ab[3], lead[1];
    const char *dec;
  } cases[] = {
      /* always + split: ▁ab ▁ab; <s> then ▁ab; " ab" starts with ▁ already */
      {"\"prepend_scheme\": \"always\", \"split\": true",
       {17, 17},
       2,
       {1, 17},
       {17, 1, 17},
       {17},
       "ab b"},
      /* no split: ▁ab▁ab is one word ("b ▁" merges first) */
      {"\"prepend_scheme\": \"always\", \"split\": false",
       {15, 19, 16},
       3,
       {1, 17},
       {17, 1, 17},
       {17},
       "ab b"},
      /* first: only the piece at the start of the input gets ▁, not one after <s> */
      {"\"prepend_scheme\": \"first\"", {17, 17}, 2, {1, 16}, {17, 1, 16}, {17}, "ab b"},
      /* never */
      {"\"prepend_scheme\": \"never\"", {16, 17}, 2, {1, 16}, {16, 1, 16}, {17}, " ab b"},
      /* legacy add_prefix_space true: always */
      {"\"add_prefix_space\": true", {17, 17}, 2, {1, 17}, {17, 1, 17}, {17}, "ab b"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char pre[256];
    snprintf(pre, sizeof pre, "{\"type\": \"Metaspace\", \"replacement\": \"" MS "\", %s}",
             cases[i].ms);
    json_t *j = sp_with("pre_tokenizer", pre);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set(j, "decoder", json_object_get(j, "pre_tokenizer"));
    struct dapo_err e = {0};
    struct tokenizer *t = build(j, &e);
    CHECK_MSG(t != NULL, "case %zu: %s", i, e.msg);
    if (!t) continue;
    int got[16];
    int n = enc(t, "ab ab", 0, got, 16);
    CHECK_MSG(ids_are(got, n, cases[i].ab_ab, cases[i].n_ab_ab), "case %zu: ab ab", i);
    n = enc(t, "<s>ab", 0, got, 16);
    CHECK_MSG(ids_are(got, n, cases[i].s_ab, 2), "case %zu: <s>ab", i);
    n = enc(t, "ab<s>ab", 0, got, 16);
    CHECK_MSG(ids_are(got, n, cases[i].ab_s_ab, 3), "case %zu: ab<s>ab", i);
    n = enc(t, " ab", 0, got, 16);
    CHECK_MSG(ids_are(got, n, cases[i].lead, 1), "case %zu: \" ab\"", i);
    /* the decoder drops ▁ in the first token unless "never" */
    CHECK_DEC(t, 0, cases[i].dec, 17, 11, 13);
    tok_free(t);
  }
}

/* Strip after Fuse: one leading "a" and up to two trailing ones of the whole text; streaming
 * holds trailing candidates back. Then a character BPE with a Fuse decoder and unk [UNK]. */
static void test_strip_and_char_bpe(void) {
  struct tokenizer *t =
      sp_tok("decoder", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
                        "\"Strip\", \"content\": \"a\", \"start\": 1, \"stop\": 2}]}");
  if (!t) return;
  CHECK_DEC(t, 0, "aba", 12, 12, 13, 12, 12, 12);
  struct dapo_err e = {0};
  struct tok_stream *s = tok_stream_new(t, 0);
  const char *want[] = {"", "", "ab", "", "", "a"};
  int ids[] = {12, 12, 13, 12, 12, 12};
  size_t len;
  for (int i = 0; i < 6; i++) {
    const char *out = tok_stream_push(s, ids[i], &len, &e);
    CHECK_MSG(out && len == strlen(want[i]) && memcmp(out, want[i], len) == 0, "push %d", i);
  }
  const char *out = tok_stream_finish(s, &len, &e);
  CHECK(out && len == 0);
  tok_stream_free(s);
  tok_free(t);

  const char *cb = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"[UNK]\", \"fuse_unk\": false, "
                   "\"vocab\": {\"[UNK]\": 0, \"a\": 1, \"b\": 2, \"ab\": 3}, \"merges\": "
                   "[\"a b\"]}, \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": "
                   "null, \"post_processor\": null, \"decoder\": {\"type\": \"Fuse\"}}";
  t = tok_from_text(cb, &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  CHECK_IDS(t, "abxa", 0, 3, 0, 1);
  CHECK_IDS(t, "abxxa", 0, 3, 0, 0, 1);
  CHECK_DEC(t, 0, "ab[UNK]a", 3, 0, 1);
  tok_free(t);
  json_t *j = json_loads(cb, 0, NULL);
  json_object_set_new(json_object_get(j, "model"), "unk_token", json_null());
  t = build(j, &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  CHECK_IDS(t, "abxa", 0, 3, 1);
  tok_free(t);
}

/* Each edit of the SentencePiece-style file must be refused with this text in the message. */
static void refuse_sp(const char *path, const char *value_json, int code, const char *want) {
  struct dapo_err e = {0};
  struct tokenizer *t = build(sp_with(path, value_json), &e);
  CHECK_MSG(t == NULL && e.code == code && strstr(e.msg, want),
            "%s = %s: got %d \"%s\", want \"%s\"", path, value_json, e.code,
            t ? "(accepted)" : e.msg, want);
  tok_free(t);
}

static void test_sp_refusals(void) {
  refuse_sp("normalizer",
            "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"\"}",
            DAPO_EFORMAT, "normalizer.pattern: regex does not compile at offset 1");
  refuse_sp("normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a\"}}", DAPO_EFORMAT,
            "normalizer.content must be a string");
  refuse_sp("normalizer", "{\"type\": \"Prepend\"}", DAPO_EFORMAT,
            "normalizer.prepend must be a string");
  refuse_sp("normalizer", "{\"type\": \"Lowercase\"}", DAPO_EUNSUPPORTED,
            "normalizer.type \"Lowercase\" is not supported (NFC, NFD, NFKC, NFKD, Prepend, "
            "Replace, Sequence)");
  refuse_sp("pre_tokenizer", "{\"type\": \"Metaspace\"}", DAPO_EFORMAT,
            "pre_tokenizer.replacement must be a string");
  refuse_sp("pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", DAPO_EFORMAT,
            "pre_tokenizer.replacement must be one character");
  refuse_sp("pre_tokenizer",
            "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"often\"}",
            DAPO_EFORMAT, "pre_tokenizer.prepend_scheme \"often\" is not one of always");
  refuse_sp("pre_tokenizer",
            "{\"type\": \"Metaspace\", \"replacement\": \"_\", "
            "\"add_prefix_space\": false}",
            DAPO_EFORMAT, "add_prefix_space false does not match prepend_scheme \"always\"");
  refuse_sp("pre_tokenizer", "{\"type\": \"Whitespace\"}", DAPO_EUNSUPPORTED,
            "pre_tokenizer.type \"Whitespace\" is not supported");
  refuse_sp("decoder",
            "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
            "\"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"b\"}]}",
            DAPO_EUNSUPPORTED, "decoder.decoders[1]: Replace after Fuse is not supported");
  refuse_sp("decoder",
            "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
            "\"ByteFallback\"}]}",
            DAPO_EUNSUPPORTED, "decoder.decoders[1]: ByteFallback after Fuse is not supported");
  refuse_sp("decoder",
            "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
            "{\"type\": \"ByteFallback\"}]}",
            DAPO_EUNSUPPORTED, "decoder.decoders[1]: a second ByteFallback is not supported");
  refuse_sp("decoder",
            "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, "
            "{\"type\": \"Fuse\"}]}",
            DAPO_EUNSUPPORTED, "decoder.decoders[0]: ByteLevel is only supported alone");
  refuse_sp("decoder", "{\"type\": \"CTC\"}", DAPO_EUNSUPPORTED,
            "decoder.type \"CTC\" is not supported (ByteLevel, Replace, ByteFallback, Fuse, "
            "Strip, Metaspace, Sequence, null)");
  refuse_sp("decoder", "{\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}",
            DAPO_EFORMAT, "decoder.start must be an integer in [0, 4096]");
  refuse_sp("decoder", "{\"type\": \"Strip\", \"content\": \"\", \"start\": 1, \"stop\": 0}",
            DAPO_EFORMAT, "decoder.content must be one character");
  refuse_sp("model.unk_token", "5", DAPO_EFORMAT, "model.unk_token must be a string or null");
  refuse_sp("model.fuse_unk", "1", DAPO_EFORMAT, "model.fuse_unk must be a boolean");
  refuse_sp("model.byte_fallback", "\"yes\"", DAPO_EFORMAT,
            "model.byte_fallback must be a boolean");
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
  refuse("pre_tokenizer", "{\"type\": \"UnicodeScripts\"}",
         "pre_tokenizer.type \"UnicodeScripts\" is not supported");
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
  refuse("decoder", "{\"type\": \"WordPiece\"}", "decoder.type \"WordPiece\" is not supported");
  refuse(
      "decoder",
      "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, "
      "{\"type\": \"ByteLevel\"}]}",
      "decoder.decoders[0]: ByteLevel is only supported alone or as the one decoder of a Sequence");
  refuse("model.dropout", "0.1", "model.dropout is not supported");
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

static json_t *bytelevel_mut(void) {
  json_t *j = bytelevel_json();
  json_object_set_new(j, "added_tokens",
                      json_pack("[{s:i,s:s,s:b},{s:i,s:s,s:b,s:b}]", "id", 259, "content", "<s>",
                                "special", 1, "id", 260, "content", "ab", "lstrip", 1, "normalized",
                                1));
  json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
  return j;
}

static json_t *sp_mut(void) {
  return json_loads(SP, 0, NULL);
}

static void mutations(json_t *(*base)(void), const char *name) {
  static const char *const values[] = {"null",      "true",       "0",
                                       "-1",        "4294967297", "1e300",
                                       "\"\"",      "\"x\"",      "[]",
                                       "{}",        "[[]]",       "{\"type\": \"Sequence\"}",
                                       "\"a b c\"", "2097152",    "[\"a\", \"a\"]"};
  unsigned seed = 12345;
  int built = 0, refused = 0;
  for (int it = 0; it < 1500; it++) {
    json_t *j = base();
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
    const char *text = "<s>ab caf\xC3\xA9 \xF0\x9F\x98\x80 aaaa \xE2\x82\xAC\xC3\xA9\xC3\xA9 ";
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
  fprintf(stderr, "test_bpe: mutations of %s: %d built, %d refused\n", name, built, refused);
  CHECK(built > 0 && refused > 0);
}

int main(void) {
  test_merges();
  test_added();
  test_bytelevel_and_stream();
  test_long_word();
  test_threads();
  test_refusals();
  test_sentencepiece();
  test_metaspace();
  test_strip_and_char_bpe();
  test_sp_refusals();
  mutations(bytelevel_mut, "the byte-level file");
  mutations(sp_mut, "the SentencePiece-style file");
  return check_done("test_bpe");
}
