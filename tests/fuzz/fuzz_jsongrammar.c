/* libFuzzer target: structured outputs' schema compiler and matcher (core/text/jsongrammar.h).
 * Byte 0 picks what the rest is:
 *   0  a schema, NUL, then bytes fed to the matcher: the schema compiles, or is refused with a
 *      message naming "schema"; a compiled one takes the bytes (each accepted or refused, a
 *      refused one leaving the matcher as it was); after every accepted byte the matcher is
 *      complete or accepts some byte (no dead end); a complete text parses and validates
 *      against the schema (jsonschema.h)
 *   1  a response_format object: compiled, or refused naming "response_format" */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "jsongrammar.h"
#include "jsonschema.h"

#define FED_MAX 256 /* accepted bytes checked for dead ends */

static void walk(const char *s, size_t n, const char *bytes, size_t bn) {
  json_t *sj = json_loadb(s, n, JSON_DECODE_ANY, NULL);
  if (!sj) return;
  struct dapo_err e = {0};
  struct jgrammar *g = jgrammar_from_schema(sj, "schema", &e);
  if (!g) {
    FUZZ_CHECK(!strncmp(e.msg, "schema", 6));
    json_decref(sj);
    return;
  }
  struct jschema *js = jschema_new(sj, "schema", &e);
  FUZZ_CHECK(js != NULL); /* the grammar built one already */
  struct jmatch *m = jmatch_new(g);
  FUZZ_CHECK(m != NULL);
  char text[FED_MAX];
  size_t len = 0;
  for (size_t i = 0; i < bn && len < FED_MAX; i++) {
    if (jmatch_feed(m, bytes + i, 1)) continue;
    text[len++] = bytes[i];
    if (jmatch_done(m)) continue;
    FUZZ_CHECK(jmatch_can_continue(m));
  }
  if (jmatch_done(m)) {
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    FUZZ_CHECK(v != NULL);
    char why[256];
    FUZZ_CHECK(jschema_check(js, v, "v", why, sizeof why) == 0);
    json_decref(v);
  }
  jmatch_free(m);
  jschema_free(js);
  jgrammar_free(g);
  json_decref(sj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 14) return 0;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  if (data[0] % 2 == 0) {
    const char *nul = memchr(s, '\0', n);
    if (nul)
      walk(s, (size_t)(nul - s), nul + 1, n - (size_t)(nul - s) - 1);
    else
      walk(s, n, "", 0);
    return 0;
  }
  json_t *rf = json_loadb(s, n, 0, NULL);
  if (!rf) return 0;
  struct dapo_err e = {0};
  struct jgrammar *g = jgrammar_new(rf, "response_format", &e);
  if (!g) FUZZ_CHECK(!strncmp(e.msg, "response_format", 15));
  jgrammar_free(g);
  json_decref(rf);
  return 0;
}
