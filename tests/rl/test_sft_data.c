/* Supervised lines (core/rl/sft.h): both shapes accepted, and each wrong line refused with a
 * message naming its line and field ("line 3: field 'messages[2].weight': expected 0 or 1"). */
#include <string.h>

#include "check.h"
#include "sft.h"

/* sft_check_line on the JSON text (a test's own: it parses), lineno 3; the message or "". */
static const char *check(const char *text, char *buf, size_t cap) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  CHECK_MSG(j != NULL, "test line does not parse: %s", text);
  struct dapo_err e = {0};
  int rc = sft_check_line(j, 3, &e);
  json_decref(j);
  CHECK_MSG(!rc == !e.msg[0], "rc %d with message '%s'", rc, e.msg);
  snprintf(buf, cap, "%s", rc ? e.msg : "");
  return buf;
}

static void expect(const char *text, const char *want) {
  char buf[512];
  const char *got = check(text, buf, sizeof buf);
  if (!*want)
    CHECK_MSG(!*got, "%s refused: %s", text, got);
  else
    CHECK_MSG(strstr(got, want) != NULL, "%s: got '%s', want '%s'", text, got, want);
}

int main(void) {
  /* accepted */
  expect("{\"prompt\": \"1+1=\", \"completion\": \"2\"}", "");
  expect("{\"prompt\": \"\", \"completion\": \"2\", \"id\": 7, \"metadata\": {\"a\": 1}}", "");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": \"hello\"}]}",
         "");
  expect("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
         "\"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\", \"weight\": 0}, "
         "{\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"d\", "
         "\"weight\": 1}]}",
         "");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
         "\"content\": null, \"tool_calls\": []}, {\"role\": \"tool\", \"content\": \"7\"}, "
         "{\"role\": \"assistant\", \"content\": \"7\"}]}",
         "");
  /* refused, by line and field */
  expect("[1]", "line 3: expected a JSON object, got an array");
  expect("{\"prompt\": \"a\"}", "line 3: field 'completion': required");
  expect("{\"prompt\": 5, \"completion\": \"b\"}", "line 3: field 'prompt': expected a string");
  expect("{\"prompt\": \"a\", \"completion\": \"\"}",
         "line 3: field 'completion': expected a non-empty string, got an empty one");
  expect("{\"prompt\": \"a\", \"completion\": \"b\", \"answer\": \"b\"}",
         "line 3: field 'answer': unknown");
  expect("{\"completion\": \"b\"}", "line 3: exactly one of 'prompt'");
  expect("{\"prompt\": \"a\", \"completion\": \"b\", \"messages\": []}",
         "line 3: exactly one of 'prompt'");
  expect("{\"messages\": [], \"completion\": \"b\"}", "line 3: field 'completion': goes with");
  expect("{\"messages\": []}", "line 3: field 'messages': expected a non-empty array");
  expect("{\"messages\": {}}",
         "line 3: field 'messages': expected a non-empty array, got an object");
  expect("{\"messages\": [1]}", "line 3: field 'messages[0]': expected an object, got an integer");
  expect("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
         "line 3: field 'messages[0].role': expected one of system, user, assistant, tool");
  expect("{\"messages\": [{\"content\": \"x\"}]}", "line 3: field 'messages[0].role'");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": 1}]}",
         "line 3: field 'messages[0].content': expected a string");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": null}]}",
         "line 3: field 'messages[1].content': expected a string");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"c\", \"weight\": 2}]}",
         "line 3: field 'messages[2].weight': expected 0 or 1");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"weight\": true}]}",
         "line 3: field 'messages[1].weight': expected 0 or 1");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"weight\": 1}, {\"role\": "
         "\"assistant\", \"content\": \"b\"}]}",
         "line 3: field 'messages[0].weight': only assistant messages carry a weight");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"weight\": 0}]}",
         "line 3: field 'messages': no assistant message with weight 1");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}",
         "line 3: field 'messages': no assistant message with weight 1");
  return check_done("test_sft_data");
}
