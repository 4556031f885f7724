/* libFuzzer target: job-spec validation (jobspec_parse, what POST /v1/jobs runs after the daemon
 * maps file and model ids to paths). The input is the JSON body. A body that validates must
 * resolve to a spec whose resolved form (jobspec_to_json) validates again to the same form;
 * a refused body lists at least one {field, message} problem. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "runner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  json_error_t jerr;
  json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
  if (!body) return 0;
  json_t *errors = json_array();
  struct job_spec s;
  int n = jobspec_parse(body, NULL, &s, errors);
  FUZZ_CHECK(n >= 0 && (size_t)n == json_array_size(errors));
  size_t i;
  json_t *x;
  json_array_foreach(errors, i, x) {
    FUZZ_CHECK(json_is_string(json_object_get(x, "field")));
    FUZZ_CHECK(json_string_length(json_object_get(x, "message")) > 0);
  }
  if (n == 0) {
    FUZZ_CHECK(s.model && s.training_file && s.judge);
    json_t *res = jobspec_to_json(&s);
    FUZZ_CHECK(res != NULL);
    json_t *errors2 = json_array();
    struct job_spec s2;
    int n2 = jobspec_parse(res, NULL, &s2, errors2);
    if (n2) {
      char *d = json_dumps(errors2, 0);
      fprintf(stderr, "resolved spec refused: %s\n", d ? d : "?");
      free(d);
    }
    FUZZ_CHECK(n2 == 0);
    json_t *res2 = jobspec_to_json(&s2);
    FUZZ_CHECK(res2 && json_equal(res, res2));
    FUZZ_CHECK(s2.seed == s.seed);
    json_decref(res2);
    jobspec_deinit(&s2);
    json_decref(errors2);
    json_decref(res);
  }
  jobspec_deinit(&s);
  json_decref(errors);
  json_decref(body);
  return 0;
}
