/* Supervised fine-tuning lines (sft.h): the checks OpenAI states for its supervised files (an
 * assistant message to train, `weight` only on assistant messages, roles it knows), each
 * problem named by line and field. */
#include "sft.h"

#include <string.h>

/* "a string", "an integer", ... for messages about a value of the wrong kind. */
static const char *kind_of(const json_t *v) {
  static const char *const KINDS[] = {"an object", "an array",  "a string",  "an integer",
                                      "a number",  "a boolean", "a boolean", "null"};
  int k = (int)json_typeof(v);
  return k >= 0 && k < (int)(sizeof KINDS / sizeof KINDS[0]) ? KINDS[k] : "something else";
}

/* One message, messages[i] of line lineno; *trained set when it is an assistant's of weight 1. */
static int check_message(const json_t *m, size_t i, int lineno, int *trained, struct dapo_err *e) {
  static const char *const ROLES[] = {"system", "user", "assistant", "tool"};
  if (!json_is_object(m))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'messages[%zu]': expected an object, got %s",
                     lineno, i, kind_of(m));
  const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
  const char *r = json_string_value(role);
  int known = 0;
  for (size_t k = 0; r && k < sizeof ROLES / sizeof ROLES[0]; k++) known |= !strcmp(r, ROLES[k]);
  if (!known)
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'messages[%zu].role': expected one of %s",
                     lineno, i, SFT_ROLES);
  int assistant = !strcmp(r, "assistant");
  int calls = assistant && json_is_array(json_object_get(m, "tool_calls"));
  if (!json_is_string(content) && !(calls && json_is_null(content)))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'messages[%zu].content': expected a string%s",
                     lineno, i, calls ? " or null" : "");
  const json_t *w = json_object_get(m, "weight");
  if (w && !assistant)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'messages[%zu].weight': only assistant messages carry a "
                     "weight (this is a %s message)",
                     lineno, i, r);
  if (w && !(json_is_integer(w) && (json_integer_value(w) == 0 || json_integer_value(w) == 1)))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'messages[%zu].weight': expected 0 or 1",
                     lineno, i);
  *trained |= assistant && (!w || json_integer_value(w) == 1);
  return 0;
}

int sft_check_line(const json_t *line, int lineno, struct dapo_err *e) {
  static const char *const KNOWN[] = {"prompt", "completion", "messages",
                                      "tools",  "id",         "metadata"};
  if (!json_is_object(line))
    return dapo_errf(e, DAPO_EFORMAT, "line %d: expected a JSON object, got %s", lineno,
                     kind_of(line));
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)line, key, v) {
    int ok = 0;
    for (size_t k = 0; k < sizeof KNOWN / sizeof KNOWN[0]; k++) ok |= !strcmp(key, KNOWN[k]);
    if (!ok)
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field '%.60s': unknown (a supervised line has prompt and "
                       "completion, or messages)",
                       lineno, key);
  }
  const json_t *p = json_object_get(line, "prompt"), *c = json_object_get(line, "completion");
  const json_t *ms = json_object_get(line, "messages");
  if (!p == !ms)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: exactly one of 'prompt' (with 'completion') or 'messages' is "
                     "required",
                     lineno);
  if (p) {
    if (!json_is_string(p))
      return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'prompt': expected a string, got %s",
                       lineno, kind_of(p));
    if (!c) return dapo_errf(e, DAPO_EFORMAT, "line %d: field 'completion': required", lineno);
    if (!json_is_string(c) || !json_string_length(c))
      return dapo_errf(e, DAPO_EFORMAT,
                       "line %d: field 'completion': expected a non-empty string, got %s", lineno,
                       json_is_string(c) ? "an empty one" : kind_of(c));
    return 0;
  }
  if (c)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'completion': goes with 'prompt' (in 'messages' the "
                     "assistant messages are the completions)",
                     lineno);
  if (!json_is_array(ms) || !json_array_size(ms))
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'messages': expected a non-empty array, got %s", lineno,
                     json_is_array(ms) ? "an empty one" : kind_of(ms));
  int trained = 0;
  for (size_t i = 0; i < json_array_size(ms); i++) {
    int rc = check_message(json_array_get(ms, i), i, lineno, &trained, e);
    if (rc) return rc;
  }
  if (!trained)
    return dapo_errf(e, DAPO_EFORMAT,
                     "line %d: field 'messages': no assistant message with weight 1 (nothing to "
                     "train on)",
                     lineno);
  return 0;
}
