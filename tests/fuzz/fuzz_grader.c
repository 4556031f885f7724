/* libFuzzer target: the graders' parsers (core/reward: formula.c, grader.c, similarity.c).
 * Byte 0 picks what the rest is:
 *   0  a calculate_output formula over the names a, b, c: it compiles, or fails with a message;
 *      a compiled one evaluates (any double) and uses only its three names
 *   1  a template rendered against a fixed {item, sample}: rendered (0, a string), an invalid
 *      variable (1, naming it) or out of memory
 *   2  a grader spec (JSON): built, or refused with a message that names the field under
 *      "grader"; a built one grades two samples to finite scores (in [0, 1] but for multi)
 *   3  output NUL reference for every text_similarity metric: a score in [0, 1]
 * Python graders are skipped (they start a sandbox process per batch). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "formula.h"
#include "fuzz.h"
#include "grader.h"
#include "similarity.h"

static const char ROOT[] =
    "{\"item\": {\"x\": \"1\", \"sum\": \"5\", \"arr\": [1, {\"y\": \"z\"}], \"n\": null, "
    "\"o\": {\"k\": [true, 2.5]}}, \"sample\": {\"output_text\": \"5\", \"output_json\": "
    "{\"a\": [1, 2], \"s\": \"t\"}, \"output_tools\": [], \"choices\": []}}";

static char *text_of(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

static void fuzz_formula(const uint8_t *data, size_t size) {
  static const char *const names[] = {"a", "b", "c"};
  struct dapo_err e = {0};
  if (size > FORMULA_MAX_BYTES) size = FORMULA_MAX_BYTES;
  struct formula *f = formula_new((const char *)data, size, names, 3, &e);
  if (!f) {
    FUZZ_CHECK(e.code != 0 && e.msg[0] != '\0');
    return;
  }
  static const double vals[][3] = {{0, 0, 0}, {1, 0.5, -2}, {1e300, -1e-300, 7}};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) (void)formula_eval(f, vals[i]);
  for (int i = 0; i < 3; i++) FUZZ_CHECK(formula_uses(f, i) == 0 || formula_uses(f, i) == 1);
  formula_free(f);
}

static void fuzz_template(const uint8_t *data, size_t size) {
  json_t *root = json_loads(ROOT, 0, NULL);
  FUZZ_CHECK(root != NULL);
  char *tmpl = text_of(data, size), *out = NULL, bad[64] = "";
  int rc = grader_render(tmpl, root, &out, bad, sizeof bad);
  FUZZ_CHECK(rc == 0 || rc == 1 || rc == DAPO_ENOMEM);
  if (rc == 0) FUZZ_CHECK(out != NULL);
  if (rc == 1) FUZZ_CHECK(out == NULL && bad[0] != '\0' && strlen(bad) < sizeof bad);
  free(out);
  free(tmpl);
  json_decref(root);
}

static void fuzz_spec(const uint8_t *data, size_t size) {
  json_t *spec = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  if (!spec) return;
  char *dump = json_dumps(spec, JSON_COMPACT);
  int python = dump && strstr(dump, "python");
  free(dump);
  if (python) {
    json_decref(spec);
    return;
  }
  struct dapo_err e = {0};
  struct grader *g = grader_new(spec, "grader", NULL, &e);
  if (!g) {
    FUZZ_CHECK(e.code != 0 && !strncmp(e.msg, "grader", 6));
  } else {
    json_t *root = json_loads(ROOT, 0, NULL);
    const json_t *item = json_object_get(root, "item");
    const json_t *oj = json_object_get(json_object_get(root, "sample"), "output_json");
    struct grader_sample s[2] = {{.output_text = "5", .output_json = oj, .item = item},
                                 {.output_text = NULL, .output_json = NULL, .item = NULL}};
    double scores[2];
    json_t *sub[2] = {NULL, NULL};
    struct grader_errs errs[2];
    int rc = grader_grade(g, s, 2, scores, sub, errs);
    FUZZ_CHECK(rc == 0 || rc == DAPO_ENOMEM);
    int multi = !strcmp(grader_type(g), "multi");
    for (int i = 0; rc == 0 && i < 2; i++) {
      FUZZ_CHECK(isfinite(scores[i]));
      if (!multi) FUZZ_CHECK(scores[i] >= 0 && scores[i] <= 1);
      FUZZ_CHECK(json_is_object(sub[i]));
    }
    json_decref(sub[0]);
    json_decref(sub[1]);
    json_decref(root);
    grader_free(g);
  }
  json_decref(spec);
}

static void fuzz_similarity(const uint8_t *data, size_t size) {
  char *text = text_of(data, size);
  const char *nul = memchr(data, 0, size);
  const char *ref = nul ? text + (nul - (const char *)data) + 1 : "";
  for (int m = 0; m < SIM_COUNT; m++) {
    double v = sim_score((enum sim_metric)m, text, ref);
    FUZZ_CHECK(v == -1 || (v >= 0 && v <= 1));
  }
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] & 3) {
  case 0: fuzz_formula(data + 1, size - 1); break;
  case 1: fuzz_template(data + 1, size - 1); break;
  case 2: fuzz_spec(data + 1, size - 1); break;
  default: fuzz_similarity(data + 1, size - 1); break;
  }
  return 0;
}
