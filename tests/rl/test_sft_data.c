/* Supervised lines (core/rl/sft.h): both shapes accepted, and each wrong line refused with a
 * message naming its line and field ("line 3: field 'messages[2].weight': expected 0 or 1"). */
#include <string.h>

#include "chat.h"
#include "check.h"
#include "lm.h"
#include "sft.h"
#include "tokenizer.h"

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

/* The ids of text on lm's tokenizer (at most 256). */
static int ids_of(const struct lm *lm, const char *text, int *ids) {
  int n = 0;
  struct dapo_err e = {0};
  CHECK(tok_encode(lm->tok, text, strlen(text), ids, 256, &n, &e) == 0);
  return n;
}

/* Encodes the line (JSON text) and compares it with the concatenation of parts, each trained
 * (1) or context (0), as one tokenization of each part gives them; end_id after a part marked
 * 2 (trained). */
static void expect_tokens(const struct lm *lm, const struct chat_template *chat, int end_id,
                          const char *text, const char *const *parts, const int *trained,
                          int n_parts) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  struct sft_example x;
  struct dapo_err e = {0};
  int rc = sft_encode(lm, chat, end_id, j, 5, 4096, 0, &x, &e);
  json_decref(j);
  CHECK_MSG(rc == 0, "%s: %s", text, e.msg);
  if (rc) return;
  int want[1024], mask[1024], n = 0, n_tr = 0;
  for (int p = 0; p < n_parts; p++) {
    int k = ids_of(lm, parts[p], want + n);
    for (int i = 0; i < k; i++) mask[n + i] = trained[p] != 0;
    n += k;
    if (trained[p] == 2) want[n] = end_id, mask[n++] = 1;
  }
  for (int i = 0; i < n; i++) n_tr += mask[i];
  CHECK_MSG(x.n == n && x.n_trained == n_tr, "%s: %d tokens (%d trained), want %d (%d)", text, x.n,
            x.n_trained, n, n_tr);
  for (int i = 0; i < n && i < x.n; i++)
    CHECK_MSG(x.tokens[i] == want[i] && x.trained[i] == mask[i],
              "%s: token %d is %d (trained %d), want %d (%d)", text, i, x.tokens[i], x.trained[i],
              want[i], mask[i]);
  sft_example_deinit(&x);
}

/* Token in, token out on the tiny preset: the trained tokens are exactly the completion and its
 * end, or the weight-1 assistant messages and their end of turn; truncation; refusals. */
static void test_encode(void) {
  struct lm lm;
  struct dapo_err e = {0};
  CHECK_MSG(lm_open_meta("tiny", &lm, &e) == 0, "%s", e.msg);
  int end_id = tok_eos_id(lm.tok);
  CHECK(end_id >= 0);
  json_t *spec = json_pack("{s:s,s:s,s:s,s:s}", "user", "U{content}|", "assistant", "A{content}|",
                           "generation_prompt", "A", "stop", "|");
  struct chat_template *chat = chat_from_spec(spec, NULL, &e);
  json_decref(spec);
  CHECK_MSG(chat != NULL, "%s", e.msg);
  {
    const char *parts[] = {"12+3=", "15"};
    int tr[] = {0, 2};
    expect_tokens(&lm, chat, end_id, "{\"prompt\": \"12+3=\", \"completion\": \"15\"}", parts, tr,
                  2);
  }
  {
    const char *parts[] = {"Uab|A", "xy", "|", "Ucd|A", "z", "|"};
    int tr[] = {0, 1, 1, 0, 1, 1};
    expect_tokens(&lm, chat, end_id,
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"ab\"}, {\"role\": "
                  "\"assistant\", \"content\": \"xy\"}, {\"role\": \"user\", \"content\": "
                  "\"cd\"}, {\"role\": \"assistant\", \"content\": \"z\"}, {\"role\": "
                  "\"user\", \"content\": \"after\"}]}",
                  parts, tr, 6);
    /* weight 0: the first answer becomes context */
    int tr0[] = {0, 0, 0, 0, 1, 1};
    expect_tokens(&lm, chat, end_id,
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"ab\"}, {\"role\": "
                  "\"assistant\", \"content\": \"xy\", \"weight\": 0}, {\"role\": \"user\", "
                  "\"content\": \"cd\"}, {\"role\": \"assistant\", \"content\": \"z\"}]}",
                  parts, tr0, 6);
  }
  /* longer than max_sequence_tokens: refused with the line, or cut */
  json_t *j = json_pack("{s:s,s:s}", "prompt", "12+3=", "completion", "15");
  struct sft_example x;
  CHECK(sft_encode(&lm, chat, end_id, j, 9, 7, 0, &x, &e) == DAPO_ERANGE);
  CHECK_MSG(strstr(e.msg, "line 9: 8 tokens exceed max_sequence_tokens (7") != NULL, "%s", e.msg);
  CHECK(sft_encode(&lm, chat, end_id, j, 9, 7, 1, &x, &e) == 0);
  CHECK(x.n == 7 && x.n_trained == 2 && x.cut == 1 && x.trained[6] && !x.trained[4]);
  sft_example_deinit(&x);
  CHECK(sft_encode(&lm, chat, end_id, j, 9, 5, 1, &x, &e) == DAPO_ERANGE);
  CHECK_MSG(strstr(e.msg, "line 9: nothing to train") != NULL, "%s", e.msg);
  json_decref(j);
  /* messages without a chat template, an assistant first, tool calls */
  j = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                 "\"assistant\", \"content\": \"b\"}]}",
                 0, NULL);
  CHECK(sft_encode(&lm, NULL, end_id, j, 4, 100, 0, &x, &e) != 0);
  CHECK_MSG(strstr(e.msg, "line 4: field 'messages': the model has no chat template"), "%s", e.msg);
  json_decref(j);
  j = json_loads("{\"messages\": [{\"role\": \"assistant\", \"content\": \"b\"}]}", 0, NULL);
  CHECK(sft_encode(&lm, chat, end_id, j, 4, 100, 0, &x, &e) != 0);
  CHECK_MSG(strstr(e.msg, "line 4: field 'messages[0]'"), "%s", e.msg);
  json_decref(j);
  j = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                 "\"assistant\", \"content\": null, \"tool_calls\": []}]}",
                 0, NULL);
  CHECK(sft_encode(&lm, chat, end_id, j, 4, 100, 0, &x, &e) == DAPO_EUNSUPPORTED);
  CHECK_MSG(strstr(e.msg, "line 4: field 'messages[1].tool_calls': the chat template (custom) "
                          "renders no tool calls"),
            "%s", e.msg);
  json_decref(j);
  chat_free(chat);
  lm_close(&lm);
}

int main(void) {
  test_encode();
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
