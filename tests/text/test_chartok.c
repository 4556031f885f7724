/* chartok: encode/decode round trips on ASCII and non-ASCII alphabets, unknowns, specials,
 * error paths with their positions, bounded buffers, and the tokenizer.json round trip and
 * refusals. The alphabet called ASCII here is the presets' (tests/engine/test_preset.c checks
 * that side); the reference-library check is tests/text/chartok_ref/ (label node). */
#include <string.h>

#include "chartok.h"
#include "check.h"
#include "utf8.h"
#include "rng.h"

#define ASCII                                                                                      \
  "\n "                                                                                            \
  "!\"#$%&'()*+,-./"                                                                               \
  "0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"

static int contains(const char *hay, const char *needle) {
  return strstr(hay, needle) != NULL;
}

/* Encodes then decodes (keeping specials) and checks the text comes back. */
static void check_round_trip(const struct chartok *t, const char *text) {
  int ids[512], n = -1;
  struct dapo_err e = {0};
  int rc = chartok_encode(t, text, strlen(text), ids, 512, &n, &e);
  CHECK_MSG(rc == 0, "encode \"%s\": %s", text, e.msg);
  char buf[2048];
  size_t len = 0;
  rc = chartok_decode(t, ids, n, buf, sizeof buf, &len, 0, &e);
  CHECK_MSG(rc == 0, "decode: %s", e.msg);
  CHECK_MSG(len == strlen(text) && !strcmp(buf, text), "round trip \"%s\" -> \"%s\"", text, buf);
}

static void test_ascii(void) {
  struct dapo_err e = {0};
  struct chartok *t = chartok_new(ASCII, &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  CHECK(chartok_vocab_size(t) == 99);
  CHECK(!strcmp(chartok_alphabet(t), ASCII));
  CHECK(!strcmp(chartok_token_text(t, 0), "<unk>"));
  CHECK(!strcmp(chartok_token_text(t, 1), "<s>"));
  CHECK(!strcmp(chartok_token_text(t, 2), "</s>"));
  CHECK(!strcmp(chartok_token_text(t, 3), "\n"));
  CHECK(!strcmp(chartok_token_text(t, 4), " "));
  CHECK(!strcmp(chartok_token_text(t, 98), "~"));
  CHECK(chartok_token_text(t, 99) == NULL);
  CHECK(chartok_token_text(t, -1) == NULL);

  /* Every character maps to 3 + its index in the alphabet. */
  int ids[128], n = 0;
  CHECK(chartok_encode(t, ASCII, strlen(ASCII), ids, 128, &n, &e) == 0);
  CHECK(n == 96);
  int ok = 1;
  for (int i = 0; i < n; i++) ok &= ids[i] == 3 + i;
  CHECK_MSG(ok, "ids of the alphabet are not 3..98 in order");

  check_round_trip(t, "Hello, world!\nThe answer is 42.");
  check_round_trip(t, "");
  check_round_trip(t, "a<s>b</s>c<unk>");
  check_round_trip(t, "<s <s> </s </s> <unk <unk> <<s>> </</s>");

  /* Specials are matched in the text, like Hugging Face added tokens. */
  const char *s = "a<s>b</s><unk><s";
  CHECK(chartok_encode(t, s, strlen(s), ids, 128, &n, &e) == 0);
  int want[] = {3 + 'a' - 0x20 + 1, 1, 3 + 'b' - 0x20 + 1, 2, 0, 3 + '<' - 0x20 + 1,
                3 + 's' - 0x20 + 1};
  CHECK(n == 7);
  for (int i = 0; i < 7 && i < n; i++)
    CHECK_MSG(ids[i] == want[i], "ids[%d] = %d, want %d", i, ids[i], want[i]);

  /* Unknown characters (tab, non-ASCII) become <unk>, one per code point. */
  s = "a\tb\xc3\xa9\xf0\x9f\x98\x80";
  CHECK(chartok_encode(t, s, strlen(s), ids, 128, &n, &e) == 0);
  CHECK(n == 5 && ids[1] == 0 && ids[3] == 0 && ids[4] == 0);
  char buf[64];
  size_t len;
  CHECK(chartok_decode(t, ids, n, buf, sizeof buf, &len, 0, &e) == 0);
  CHECK(!strcmp(buf, "a<unk>b<unk><unk>") && len == 17);
  CHECK(chartok_decode(t, ids, n, buf, sizeof buf, &len, 1, &e) == 0);
  CHECK(!strcmp(buf, "ab") && len == 2);

  /* An embedded NUL is a character outside the alphabet. */
  CHECK(chartok_encode(t, "a\0b", 3, ids, 128, &n, &e) == 0);
  CHECK(n == 3 && ids[1] == CHARTOK_UNK);

  /* Invalid UTF-8 in the input names the byte. */
  s = "ab\x80z";
  CHECK(chartok_encode(t, s, strlen(s), ids, 128, &n, &e) == DAPO_EINVAL);
  CHECK_MSG(contains(e.msg, "byte 2"), "%s", e.msg);
  s = "abc\xe2\x82";
  CHECK(chartok_encode(t, s, strlen(s), ids, 128, &n, &e) == DAPO_EINVAL);
  CHECK_MSG(contains(e.msg, "byte 3"), "%s", e.msg);

  /* Capacity: counting mode, then too small. */
  s = "hello";
  CHECK(chartok_encode(t, s, 5, NULL, 0, &n, &e) == 0 && n == 5);
  ids[2] = -77;
  CHECK(chartok_encode(t, s, 5, ids, 2, &n, &e) == DAPO_ERANGE);
  CHECK(n == 5 && ids[2] == -77);
  CHECK(chartok_encode(t, s, 5, ids, 5, &n, &e) == 0 && n == 5);

  /* Decode: ids out of range, bounded buffers. */
  int bad[] = {3, 99};
  CHECK(chartok_decode(t, bad, 2, buf, sizeof buf, &len, 0, &e) == DAPO_EINVAL);
  CHECK_MSG(contains(e.msg, "ids[1]") && contains(e.msg, "99"), "%s", e.msg);
  bad[1] = -1;
  CHECK(chartok_decode(t, bad, 2, buf, sizeof buf, &len, 1, &e) == DAPO_EINVAL);
  int hi[] = {CHARTOK_BOS,    4 + 'H' - 0x20, 4 + 'e' - 0x20, 4 + 'l' - 0x20,
              4 + 'l' - 0x20, 4 + 'o' - 0x20, CHARTOK_EOS}; /* <s>Hello</s> */
  CHECK(chartok_decode(t, hi, 7, NULL, 0, &len, 0, &e) == 0 && len == 12);
  CHECK(chartok_decode(t, hi, 7, NULL, 0, &len, 1, &e) == 0 && len == 5);
  CHECK(chartok_decode(t, hi, 7, buf, 13, &len, 0, &e) == 0 && !strcmp(buf, "<s>Hello</s>"));
  CHECK(chartok_decode(t, hi, 7, buf, 12, &len, 0, &e) == DAPO_ERANGE);
  CHECK(len == 12 && !strcmp(buf, "<s>Hello"));
  CHECK(chartok_decode(t, hi, 7, buf, 6, &len, 1, &e) == 0 && !strcmp(buf, "Hello"));
  CHECK(chartok_decode(t, hi, 0, buf, 1, &len, 0, &e) == 0 && len == 0 && buf[0] == '\0');
  chartok_free(t);
}

/* \n a é € 😀 < s > / : code points of 1, 2, 3 and 4 bytes. */
#define WIDE "\na\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80<s>/"

static void test_wide(void) {
  struct dapo_err e = {0};
  struct chartok *t = chartok_new(WIDE, &e);
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  CHECK(chartok_vocab_size(t) == 3 + 9);
  CHECK(!strcmp(chartok_token_text(t, 5), "\xc3\xa9"));
  CHECK(!strcmp(chartok_token_text(t, 6), "\xe2\x82\xac"));
  CHECK(!strcmp(chartok_token_text(t, 7), "\xf0\x9f\x98\x80"));
  const char *s = "\xf0\x9f\x98\x80"
                  "a\xe2\x82\xac\xc3\xa9\n<s>b</s";
  int ids[64], n = 0;
  CHECK(chartok_encode(t, s, strlen(s), ids, 64, &n, &e) == 0);
  int want[] = {7, 4, 6, 5, 3, 1, 0, 8, 11, 9};
  CHECK(n == 10);
  for (int i = 0; i < 10 && i < n; i++)
    CHECK_MSG(ids[i] == want[i], "ids[%d] = %d, want %d", i, ids[i], want[i]);
  check_round_trip(t, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80"
                      "a</s>");
  check_round_trip(t, "\xc3\xa9\xe2\x82\xac\n");
  /* A buffer cut at a character boundary, never inside one. */
  char buf[16];
  size_t len;
  int e2[] = {5, 6, 7};
  CHECK(chartok_decode(t, e2, 3, buf, 5, &len, 0, &e) == DAPO_ERANGE);
  CHECK(len == 9 && !strcmp(buf, "\xc3\xa9"));
  CHECK(chartok_decode(t, e2, 3, buf, 10, &len, 0, &e) == 0 && len == 9);

  /* Random strings over the alphabet round-trip; random bytes never crash. */
  static const char *chars[] = {"\n", "a", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "<",
                                "s",  ">", "/"};
  struct rng r;
  rng_seed(&r, 7, 1);
  for (int it = 0; it < 200; it++) {
    char text[256] = "";
    size_t w = 0;
    int k = (int)rng_below(&r, 40);
    for (int i = 0; i < k; i++) {
      const char *c = chars[rng_below(&r, 9)];
      memcpy(text + w, c, strlen(c));
      w += strlen(c);
    }
    text[w] = '\0';
    check_round_trip(t, text);
    unsigned char junk[32];
    for (int i = 0; i < 32; i++) junk[i] = (unsigned char)rng_below(&r, 256);
    int rc = chartok_encode(t, (const char *)junk, 32, ids, 64, &n, &e);
    CHECK(rc == 0 || rc == DAPO_EINVAL);
  }
  chartok_free(t);
}

static void expect_new_fails(const char *alphabet, const char *what) {
  struct dapo_err e = {0};
  struct chartok *t = chartok_new(alphabet, &e);
  CHECK_MSG(t == NULL, "alphabet accepted, expected: %s", what);
  CHECK_MSG(e.code == DAPO_EINVAL && contains(e.msg, what), "message '%s' lacks '%s'", e.msg, what);
  chartok_free(t);
}

static void test_bad_alphabets(void) {
  expect_new_fails("", "empty");
  expect_new_fails(NULL, "empty");
  expect_new_fails("ab\xff", "invalid UTF-8 at byte 2");
  expect_new_fails("a\xc0\x80", "invalid UTF-8 at byte 1");         /* overlong NUL */
  expect_new_fails("abc\xe0\x80\xaf", "invalid UTF-8 at byte 3");   /* overlong '/' */
  expect_new_fails("\xed\xa0\x80", "invalid UTF-8 at byte 0");      /* surrogate */
  expect_new_fails("x\xf4\x90\x80\x80", "invalid UTF-8 at byte 1"); /* > U+10FFFF */
  expect_new_fails("a\xe2\x82", "invalid UTF-8 at byte 1");         /* truncated */
  expect_new_fails("a\x80", "invalid UTF-8 at byte 1");             /* stray continuation */
  expect_new_fails("abca", "duplicate character 'a' (U+0061) at byte 3 (character 3), first at "
                           "byte 0");
  expect_new_fails("x\xc3\xa9\xe2\x82\xac\xc3\xa9", "duplicate character U+00E9 at byte 6 "
                                                    "(character 3), first at byte 1");
  /* The earliest duplicate is reported, whatever its code point. */
  expect_new_fails("\xc3\xa9z\xc3\xa9zz", "at byte 3");
}

static json_t *json_of(const struct chartok *t) {
  json_t *j = chartok_to_json(t);
  CHECK(j != NULL);
  return j;
}

static void test_json_structure(const struct chartok *t) {
  json_t *j = json_of(t);
  if (!j) return;
  CHECK(!strcmp(json_string_value(json_object_get(j, "version")), "1.0"));
  static const char *nulls[] = {"truncation", "padding", "normalizer", "pre_tokenizer",
                                "post_processor"};
  for (int i = 0; i < 5; i++) CHECK_MSG(json_is_null(json_object_get(j, nulls[i])), "%s", nulls[i]);
  CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "decoder"), "type")), "Fuse"));
  json_t *added = json_object_get(j, "added_tokens");
  CHECK(json_array_size(added) == 3);
  for (size_t i = 0; i < json_array_size(added); i++) {
    json_t *a = json_array_get(added, i);
    CHECK(json_integer_value(json_object_get(a, "id")) == (json_int_t)i);
    CHECK(!strcmp(json_string_value(json_object_get(a, "content")), chartok_token_text(t, (int)i)));
    CHECK(json_is_true(json_object_get(a, "special")));
    CHECK(json_is_false(json_object_get(a, "normalized")));
    CHECK(json_is_false(json_object_get(a, "lstrip")) &&
          json_is_false(json_object_get(a, "rstrip")));
    CHECK(json_is_false(json_object_get(a, "single_word")));
  }
  json_t *m = json_object_get(j, "model");
  CHECK(!strcmp(json_string_value(json_object_get(m, "type")), "BPE"));
  CHECK(!strcmp(json_string_value(json_object_get(m, "unk_token")), "<unk>"));
  CHECK(json_is_null(json_object_get(m, "dropout")));
  CHECK(json_is_null(json_object_get(m, "continuing_subword_prefix")));
  CHECK(json_is_null(json_object_get(m, "end_of_word_suffix")));
  CHECK(json_is_false(json_object_get(m, "fuse_unk")));
  CHECK(json_is_false(json_object_get(m, "byte_fallback")));
  CHECK(json_is_false(json_object_get(m, "ignore_merges")));
  CHECK(json_is_array(json_object_get(m, "merges")) &&
        json_array_size(json_object_get(m, "merges")) == 0);
  json_t *vocab = json_object_get(m, "vocab");
  CHECK((int)json_object_size(vocab) == chartok_vocab_size(t));
  /* Keys in id order, each mapping to its id. */
  int id = 0, ordered = 1;
  const char *key;
  json_t *v;
  json_object_foreach(vocab, key, v) {
    ordered &= json_integer_value(v) == id && !strcmp(key, chartok_token_text(t, id));
    id++;
  }
  CHECK_MSG(ordered, "model.vocab is not the tokens in id order");
  json_decref(j);
}

/* to_json -> text -> parse -> from_json gives the same tokenizer. */
static void test_json_round_trip(const char *alphabet) {
  struct dapo_err e = {0};
  struct chartok *t = chartok_new(alphabet, &e), *u = NULL;
  CHECK_MSG(t != NULL, "%s", e.msg);
  if (!t) return;
  test_json_structure(t);
  json_t *j = json_of(t);
  char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
  json_t *back = text ? json_loads(text, 0, NULL) : NULL;
  CHECK(back != NULL);
  u = back ? chartok_from_json(back, &e) : NULL;
  CHECK_MSG(u != NULL, "from_json: %s", e.msg);
  if (u) {
    CHECK(chartok_vocab_size(u) == chartok_vocab_size(t));
    CHECK(!strcmp(chartok_alphabet(u), alphabet));
    for (int id = 0; id < chartok_vocab_size(t); id++)
      CHECK(!strcmp(chartok_token_text(u, id), chartok_token_text(t, id)));
  }
  free(text);
  json_decref(j);
  json_decref(back);
  chartok_free(t);
  chartok_free(u);
}

/* Parses a template, applies one edit (a JSON merge into the top level or into model), and
 * expects from_json to refuse with code and a message containing what. */
static void expect_refused(const char *edit_top, const char *edit_model, int code,
                           const char *what) {
  struct chartok *t = chartok_new("ab", NULL);
  json_t *j = chartok_to_json(t);
  json_error_t je;
  if (edit_top) {
    json_t *ed = json_loads(edit_top, 0, &je);
    CHECK_MSG(ed != NULL, "bad test edit: %s", je.text);
    json_object_update(j, ed);
    json_decref(ed);
  }
  if (edit_model) {
    json_t *ed = json_loads(edit_model, 0, &je);
    CHECK_MSG(ed != NULL, "bad test edit: %s", je.text);
    json_object_update(json_object_get(j, "model"), ed);
    json_decref(ed);
  }
  struct dapo_err e = {0};
  struct chartok *u = chartok_from_json(j, &e);
  CHECK_MSG(u == NULL, "accepted a tokenizer.json that should fail with '%s'", what);
  CHECK_MSG(e.code == code && contains(e.msg, what), "code %d message '%s', expected %d '%s'",
            e.code, e.msg, code, what);
  chartok_free(u);
  json_decref(j);
  chartok_free(t);
}

static void test_json_refusals(void) {
  /* The shape of a GPT-2 style byte-level BPE. */
  expect_refused("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                 " \"decoder\": {\"type\": \"ByteLevel\"}}",
                 "{\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"a\": 3, \"b\": 4, \"ab\": "
                 "5}, \"merges\": [\"a b\"]}",
                 DAPO_EUNSUPPORTED,
                 "model.merges: not a character-level tokenizer (byte-level BPE lands with issue "
                 "5)");
  expect_refused(NULL, "{\"merges\": [[\"a\", \"b\"]]}", DAPO_EUNSUPPORTED, "model.merges");
  expect_refused(NULL, "{\"merges\": 3}", DAPO_EFORMAT, "model.merges: not an array");
  expect_refused(NULL, "{\"type\": \"WordPiece\"}", DAPO_EUNSUPPORTED,
                 "model.type: 'WordPiece' is not supported");
  expect_refused("{\"model\": 7}", NULL, DAPO_EFORMAT, "model: missing");
  expect_refused(NULL, "{\"unk_token\": null}", DAPO_EUNSUPPORTED, "model.unk_token");
  expect_refused(NULL, "{\"continuing_subword_prefix\": \"##\"}", DAPO_EUNSUPPORTED,
                 "model.continuing_subword_prefix");
  expect_refused(NULL, "{\"dropout\": 0.1}", DAPO_EUNSUPPORTED, "model.dropout");
  expect_refused(NULL, "{\"fuse_unk\": true}", DAPO_EUNSUPPORTED, "model.fuse_unk");
  expect_refused(NULL, "{\"byte_fallback\": true}", DAPO_EUNSUPPORTED, "model.byte_fallback");
  expect_refused("{\"normalizer\": {\"type\": \"NFC\"}}", NULL, DAPO_EUNSUPPORTED,
                 "normalizer: 'NFC' is not supported");
  expect_refused("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}}", NULL, DAPO_EUNSUPPORTED,
                 "pre_tokenizer: 'Whitespace'");
  expect_refused("{\"post_processor\": {\"type\": \"TemplateProcessing\"}}", NULL,
                 DAPO_EUNSUPPORTED, "post_processor: 'TemplateProcessing'");
  expect_refused("{\"truncation\": {\"max_length\": 5}}", NULL, DAPO_EUNSUPPORTED, "truncation");
  expect_refused("{\"decoder\": null}", NULL, DAPO_EUNSUPPORTED, "decoder: '(none)'");
  expect_refused("{\"decoder\": {\"type\": \"ByteLevel\"}}", NULL, DAPO_EUNSUPPORTED,
                 "decoder: 'ByteLevel'");
  expect_refused(NULL, "{\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"ab\": 3}}",
                 DAPO_EUNSUPPORTED, "model.vocab: token 3 \"ab\" is not a single character");
  expect_refused(NULL, "{\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"a\": 4}}",
                 DAPO_EFORMAT, "model.vocab: \"a\" has no id in [0, 4)");
  expect_refused(NULL, "{\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"a\": 3, \"b\": 3}}",
                 DAPO_EFORMAT, "model.vocab: id 3 given twice");
  expect_refused(NULL, "{\"vocab\": {\"<s>\": 0, \"<unk>\": 1, \"</s>\": 2, \"a\": 3}}",
                 DAPO_EUNSUPPORTED, "model.vocab: id 0 is \"<s>\", expected \"<unk>\"");
  expect_refused(NULL, "{\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2}}", DAPO_EFORMAT,
                 "model.vocab: 3 entries");
  expect_refused(NULL, "{\"vocab\": [1]}", DAPO_EFORMAT, "model.vocab: missing");
  expect_refused("{\"added_tokens\": []}", NULL, DAPO_EUNSUPPORTED,
                 "added_tokens: <unk> (id 0) is missing");
  expect_refused("{\"added_tokens\": 1}", NULL, DAPO_EFORMAT, "added_tokens: missing");
  expect_refused("{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
                 " {\"id\": 1, \"content\": \"<s>\", \"special\": true},"
                 " {\"id\": 2, \"content\": \"</s>\", \"special\": true},"
                 " {\"id\": 3, \"content\": \"a\", \"special\": true}]}",
                 NULL, DAPO_EUNSUPPORTED, "added_tokens[3]: 3 is not one of");
  expect_refused("{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
                 " {\"id\": 1, \"content\": \"<s>\", \"special\": false},"
                 " {\"id\": 2, \"content\": \"</s>\", \"special\": true}]}",
                 NULL, DAPO_EUNSUPPORTED, "added_tokens[1]: <s> must be special");
  expect_refused("{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true,"
                 " \"lstrip\": true}]}",
                 NULL, DAPO_EUNSUPPORTED, "added_tokens[0].lstrip: must be false");
  expect_refused("{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
                 " {\"id\": 0, \"content\": \"<unk>\", \"special\": true}]}",
                 NULL, DAPO_EFORMAT, "added_tokens[1]: id 0 repeated");
  struct dapo_err e = {0};
  json_t *arr = json_array();
  CHECK(chartok_from_json(arr, &e) == NULL && contains(e.msg, "not a JSON object"));
  json_decref(arr);

  struct chartok *t, *u;
  json_t *j;
  /* A vocabulary key holding U+0000 (only possible through json_object_setn, not parsing). */
  t = chartok_new("ab", NULL);
  j = chartok_to_json(t);
  json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
  json_object_del(vocab, "b");
  json_object_setn_new(vocab, "\0", 1, json_integer(4));
  u = chartok_from_json(j, &e);
  CHECK(u == NULL && e.code == DAPO_EUNSUPPORTED && contains(e.msg, "not a single character"));
  chartok_free(u);
  json_decref(j);
  chartok_free(t);

  /* Absent optional keys are accepted (HF omits some in older files). */
  t = chartok_new("xy", NULL);
  j = chartok_to_json(t);
  json_object_del(j, "truncation");
  json_object_del(json_object_get(j, "model"), "dropout");
  json_object_del(json_object_get(j, "model"), "ignore_merges");
  u = chartok_from_json(j, &e);
  CHECK_MSG(u != NULL, "%s", e.msg);
  chartok_free(u);
  json_decref(j);
  chartok_free(t);
}

/* utf8_next at the edges of UTF-8 (RFC 3629, Unicode's table 3-7 of well-formed sequences):
 * the shortest and longest of each length, and each way to be malformed. */
static void test_utf8(void) {
  static const struct {
    const char *bytes;
    size_t n, len; /* bytes given, the character's length (0: none) */
    uint32_t cp;
  } V[] = {
      {"", 0, 0, 0},
      {"\0", 1, 1, 0}, /* NUL is a character */
      {"A", 1, 1, 'A'},
      {"\x7f", 1, 1, 0x7F},
      {"\xc2\x80", 2, 2, 0x80},
      {"\xdf\xbf", 2, 2, 0x7FF},
      {"\xe0\xa0\x80", 3, 3, 0x800},
      {"\xed\x9f\xbf", 3, 3, 0xD7FF},
      {"\xee\x80\x80", 3, 3, 0xE000},
      {"\xef\xbf\xbf", 3, 3, 0xFFFF},
      {"\xf0\x90\x80\x80", 4, 4, 0x10000},
      {"\xf4\x8f\xbf\xbf", 4, 4, 0x10FFFF},
      {"\xe2\x82\xacZ", 4, 3, 0x20AC}, /* only the first character */
      {"\x80", 1, 0, 0},               /* a lone continuation byte */
      {"\xc0\x80", 2, 0, 0},           /* overlong NUL */
      {"\xc1\xbf", 2, 0, 0},           /* overlong */
      {"\xe0\x9f\xbf", 3, 0, 0},       /* overlong */
      {"\xf0\x8f\xbf\xbf", 4, 0, 0},   /* overlong */
      {"\xed\xa0\x80", 3, 0, 0},       /* a surrogate, U+D800 */
      {"\xed\xbf\xbf", 3, 0, 0},       /* U+DFFF */
      {"\xf4\x90\x80\x80", 4, 0, 0},   /* past U+10FFFF */
      {"\xf5\x80\x80\x80", 4, 0, 0},
      {"\xff", 1, 0, 0},
      {"\xe2\x82", 2, 0, 0},     /* cut short */
      {"\xe2\x82\xac", 2, 0, 0}, /* cut short by n */
      {"\xe2\x28\xa1", 3, 0, 0}, /* a bad continuation byte */
  };
  for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
    uint32_t cp = 0xFFFFFFFF;
    size_t len = utf8_next((const unsigned char *)V[i].bytes, V[i].n, &cp);
    CHECK_MSG(len == V[i].len, "case %zu: length %zu, want %zu", i, len, V[i].len);
    if (V[i].len) CHECK_MSG(cp == V[i].cp, "case %zu: U+%04X, want U+%04X", i, cp, V[i].cp);
    CHECK(utf8_next((const unsigned char *)V[i].bytes, V[i].n, NULL) == V[i].len);
  }
}

int main(void) {
  test_utf8();
  test_ascii();
  test_wide();
  test_bad_alphabets();
  test_json_round_trip(ASCII);
  test_json_round_trip(WIDE);
  test_json_refusals();
  return check_done("test_chartok");
}
