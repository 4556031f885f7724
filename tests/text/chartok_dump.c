/* Test helper for the reference-tokenizer check (tests/text/chartok_ref/run.sh, label node): writes
 * the tokenizer.json of the presets' alphabet and of a non-ASCII alphabet, and cases.json, a list
 * of {tokenizer, text, ids, decoded, decoded_skip} from chartok_encode/chartok_decode, for
 * tests/text/chartok_ref/chartok_ref.mjs to replay through Hugging Face `tokenizers`.
 * Usage: chartok_dump OUTDIR */
#include <stdio.h>
#include <string.h>

#include "chartok.h"
#include "preset.h"
#include "rng.h"

/* \n a é € 😀 < s > / and space: code points of 1 to 4 bytes. */
#define WIDE "\na \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80<s>/"

static const char *fixed_cases[] = {
    "",
    "Hello, world!\nThe answer is 42.",
    "a<s>b</s>c<unk>d",
    "<s <s> </s </s> <unk <unk> <<s>> </</s> <s/> <S> <UNK>",
    "<s></s><s></s>",
    "tab\there, cr\r\n, nul-free control \x01\x7f",
    "h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\x98\x80 \xe2\x82\xac 5 \xe4\xb8\xad\xe6\x96\x87",
    "  leading and trailing spaces  ",
    "\n\n\n",
    "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80<s>/\na s",
    "combining e\xcc\x81 and \xef\xbb\xbf BOM and \xe2\x80\x8b zero width",
};

/* Pieces random cases are made of: alphabet characters, unknowns, specials and fragments. */
static const char *pieces[] = {
    "a",
    "s",
    "<",
    ">",
    "/",
    " ",
    "\n",
    "Z",
    "~",
    "\t",
    "\xc3\xa9",
    "\xe2\x82\xac",
    "\xf0\x9f\x98\x80",
    "\xe4\xb8\xad",
    "<s>",
    "</s>",
    "<unk>",
    "<u",
    "nk>",
    "</",
    "\xcc\x81",
};

static int add_case(json_t *cases, const char *file, const struct chartok *t, const char *text) {
  int ids[1024], n = 0;
  char dec[4096], dec_skip[4096];
  size_t len = 0;
  struct dapo_err e = {0};
  if (chartok_encode(t, text, strlen(text), ids, 1024, &n, &e) ||
      chartok_decode(t, ids, n, dec, sizeof dec, &len, 0, &e) ||
      chartok_decode(t, ids, n, dec_skip, sizeof dec_skip, &len, 1, &e)) {
    fprintf(stderr, "chartok_dump: %s\n", e.msg);
    return -1;
  }
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
  return json_array_append_new(cases, json_pack("{s:s, s:s, s:o, s:s, s:s}", "tokenizer", file,
                                                "text", text, "ids", arr, "decoded", dec,
                                                "decoded_skip", dec_skip));
}

static int dump_tokenizer(const char *dir, const char *file, const char *alphabet, json_t *cases,
                          uint64_t seed) {
  struct dapo_err e = {0};
  struct chartok *t = chartok_new(alphabet, &e);
  if (!t) {
    fprintf(stderr, "chartok_dump: %s\n", e.msg);
    return -1;
  }
  int rc = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  json_t *j = chartok_to_json(t);
  if (!j || json_dump_file(j, path, JSON_INDENT(2))) {
    fprintf(stderr, "chartok_dump: cannot write %s\n", path);
    rc = -1;
  }
  json_decref(j);
  for (size_t i = 0; !rc && i < sizeof fixed_cases / sizeof *fixed_cases; i++)
    rc = add_case(cases, file, t, fixed_cases[i]);
  struct rng r;
  rng_seed(&r, seed, 0);
  for (int it = 0; !rc && it < 300; it++) {
    char text[512];
    size_t w = 0;
    int k = (int)rng_below(&r, 60);
    for (int i = 0; i < k; i++) {
      const char *p = pieces[rng_below(&r, sizeof pieces / sizeof *pieces)];
      memcpy(text + w, p, strlen(p));
      w += strlen(p);
    }
    text[w] = '\0';
    rc = add_case(cases, file, t, text);
  }
  chartok_free(t);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: chartok_dump OUTDIR\n");
    return 2;
  }
  json_t *cases = json_array();
  int rc = dump_tokenizer(argv[1], "tokenizer_ascii.json", preset_find("tiny")->alphabet, cases, 1);
  if (!rc) rc = dump_tokenizer(argv[1], "tokenizer_wide.json", WIDE, cases, 2);
  char path[4096];
  snprintf(path, sizeof path, "%s/cases.json", argv[1]);
  if (!rc && json_dump_file(cases, path, JSON_INDENT(1))) {
    fprintf(stderr, "chartok_dump: cannot write %s\n", path);
    rc = -1;
  }
  if (!rc) fprintf(stderr, "chartok_dump: %zu cases in %s\n", json_array_size(cases), path);
  json_decref(cases);
  return rc ? 1 : 0;
}
