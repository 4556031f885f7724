/* libFuzzer target: tool calls in text (core/text/toolcall.h, jsonschema.h). Byte 0 picks what
 * the rest is:
 *   0  a model's turn read in the dapod format with one tool, 1  the same with two tools: it is
 *      a final answer, calls (each naming a tool of the job, its arguments a JSON object), or
 *      malformed with a reason; the answers to its calls render, one "=...\n" each
 *   2  a JSON Schema: it builds, or is refused with a message naming "parameters"; a built one
 *      checks a few fixed values, each valid or refused with a reason under "arguments"
 *   3  schema NUL value: the value checked against the schema
 *   4  a model's turn read in the qwen format (<tool_call> blocks), 5  in the llama3_json format,
 *      each with two tools: a final answer, calls of the job's tools, or malformed with a reason */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "jsonschema.h"
#include "toolcall.h"

static void turn(enum tc_format f, const char *s, size_t n, int n_tools) {
  static const char *const tools[] = {"lookup", "calc"};
  struct tc_turn t;
  FUZZ_CHECK(tc_read_turn(f, s, n, tools, n_tools, &t) == 0);
  FUZZ_CHECK(t.n_calls >= 0 && t.n_calls <= TC_MAX_CALLS);
  FUZZ_CHECK(!(t.malformed && t.n_calls));
  if (t.malformed) FUZZ_CHECK(t.why[0] != '\0');
  struct tc_answer a[TC_MAX_CALLS];
  for (int i = 0; i < t.n_calls; i++) {
    int known = 0;
    for (int k = 0; k < n_tools; k++) known |= !strcmp(t.calls[i].name, tools[k]);
    FUZZ_CHECK(known && json_is_object(t.calls[i].arguments));
    a[i] = (struct tc_answer){t.calls[i].name, t.calls[i].name, NULL};
  }
  if (t.n_calls && f == TC_DAPOD) {
    char *out = NULL;
    FUZZ_CHECK(tc_render_answers(TC_DAPOD, a, t.n_calls, &out) == 0 && out && out[0] == '=');
    free(out);
  }
  tc_turn_free(&t);
}

static void schema(const char *s, size_t n, const char *v, size_t vn) {
  json_t *sj = json_loadb(s, n, JSON_DECODE_ANY, NULL);
  if (!sj) return;
  struct dapo_err e = {0};
  struct jschema *js = jschema_new(sj, "parameters", &e);
  if (!js) FUZZ_CHECK(!strncmp(e.msg, "parameters", 10));
  static const char *const fixed[] = {"{}",    "[]",   "1",    "1.5",
                                      "\"x\"", "null", "true", "{\"a\": [1, {\"b\": null}]}"};
  char why[256];
  for (size_t i = 0; js && i < sizeof fixed / sizeof fixed[0] + (v ? 1 : 0); i++) {
    json_t *x = i < sizeof fixed / sizeof fixed[0] ? json_loads(fixed[i], JSON_DECODE_ANY, NULL)
                                                   : json_loadb(v, vn, JSON_DECODE_ANY, NULL);
    if (!x) continue;
    int r = jschema_check(js, x, "arguments", why, sizeof why);
    FUZZ_CHECK(r == 0 || r == 1);
    if (r) FUZZ_CHECK(!strncmp(why, "arguments", 9));
    json_decref(x);
  }
  jschema_free(js);
  json_decref(sj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 16) return 0;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  switch (data[0] % 6) {
  case 0:
  case 1: turn(TC_DAPOD, s, n, data[0] % 6 + 1); break;
  case 2: schema(s, n, NULL, 0); break;
  case 3: {
    const char *nul = memchr(s, '\0', n);
    if (nul) schema(s, (size_t)(nul - s), nul + 1, n - (size_t)(nul - s) - 1);
    break;
  }
  case 4: turn(TC_QWEN, s, n, 2); break;
  default: turn(TC_LLAMA3_JSON, s, n, 2); break;
  }
  return 0;
}
