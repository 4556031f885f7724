/* Python graders (grader.h): the user's grade(sample, item) run in the sandbox (sandbox.h). One
 * process grades a whole batch: the rows go in on stdin as JSON, one result line per row comes
 * back on a duplicate of stdout (the user's own prints go to /dev/null). */
#include "grader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sandbox.h"

/* The program the sandbox runs: reads {"source", "rows"} on stdin, writes {"i", "score"} or
 * {"i", "error"} per row, or one {"setup_error"} when the source does not define grade. */
static const char RUNNER[] =
    "import json, math, numbers, os, sys\n"
    "out = os.fdopen(os.dup(1), 'w')\n"
    "null = open(os.devnull, 'w')\n"
    "os.dup2(null.fileno(), 1)\n"
    "os.dup2(null.fileno(), 2)\n"
    "sys.stdout = sys.stderr = null\n"
    "def say(o):\n"
    "    out.write(json.dumps(o) + '\\n')\n"
    "    out.flush()\n"
    "def why(ex):\n"
    "    return ('%s: %s' % (type(ex).__name__, ex))[:240]\n"
    "req = json.loads(sys.stdin.buffer.read())\n"
    "ns = {'__name__': 'grader'}\n"
    "try:\n"
    "    exec(compile(req['source'], 'grader.py', 'exec'), ns)\n"
    "    grade = ns['grade']\n"
    "except BaseException as ex:\n"
    "    say({'setup_error': why(ex)})\n"
    "    sys.exit(0)\n"
    "for i, row in enumerate(req['rows']):\n"
    "    try:\n"
    "        v = grade(row['sample'], row['item'])\n"
    "        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):\n"
    "            raise TypeError('grade returned %s, not a finite number' % type(v).__name__)\n"
    "        say({'i': i, 'score': float(v)})\n"
    "    except BaseException as ex:\n"
    "        say({'i': i, 'error': why(ex)})\n";

int grader_python_run(const char *source, const json_t *rows, double *scores, int *kinds,
                      char *detail, size_t cap) {
  size_t n = json_array_size(rows);
  for (size_t i = 0; i < n; i++) scores[i] = 0, kinds[i] = GE_PYTHON_RUNTIME;
  if (cap) *detail = '\0';
  json_t *req = json_pack("{s:s, s:O}", "source", source, "rows", rows);
  char *input = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  if (!input) return DAPO_ENOMEM;
  char *out = NULL, why[256] = "";
  static const struct sandbox_limits lim = {.wall_ms = GRADER_PY_WALL_S * 1000,
                                            .wall_s = GRADER_PY_WALL_S,
                                            .memory = GRADER_PY_MEMORY,
                                            .output_bytes = GRADER_PY_OUTPUT_BYTES};
  int r = sandbox_run(RUNNER, input, strlen(input), &lim, &out, why, sizeof why);
  free(input);
  if (r < 0) {
    for (size_t i = 0; i < n; i++) kinds[i] = GE_PYTHON_SERVER;
    snprintf(detail, cap, "%s", why);
    free(out);
    return 0;
  }
  /* One JSON object a line; anything else (junk the grader wrote to the real stdout) is
   * skipped, and rows without a line keep their runtime error. */
  for (char *line = out, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    json_t *o = json_loads(line, 0, NULL);
    const char *setup = json_string_value(json_object_get(o, "setup_error"));
    if (setup) {
      snprintf(detail, cap, "%s", setup);
      json_decref(o);
      break;
    }
    json_t *ji = json_object_get(o, "i");
    if (json_is_integer(ji) && json_integer_value(ji) >= 0 && (size_t)json_integer_value(ji) < n) {
      size_t i = (size_t)json_integer_value(ji);
      json_t *sc = json_object_get(o, "score");
      const char *err = json_string_value(json_object_get(o, "error"));
      if (json_is_number(sc)) {
        scores[i] = json_number_value(sc);
        kinds[i] = GE_COUNT;
      } else if (err && cap && !*detail) {
        snprintf(detail, cap, "%s", err);
      }
    }
    json_decref(o);
  }
  if (r == 1 && cap && !*detail)
    snprintf(detail, cap, "the grader ran past %d s (or wrote over %zu bytes) and was stopped",
             GRADER_PY_WALL_S, GRADER_PY_OUTPUT_BYTES);
  free(out);
  return 0;
}

int grader_python_available(char *why, size_t cap) {
  return sandbox_available(why, cap);
}
