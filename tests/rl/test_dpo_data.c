/* DPO lines (core/rl/dpo.h): OpenAI's shape (and its older field names) and TRL's accepted, each
 * wrong line refused naming its line and field ("line 3: field 'preferred_output': expected
 * exactly one assistant message"); the encoding token in, token out on the tiny preset: the
 * prompt once as context, each response and its end token trained; max_sequence_tokens refused
 * by the response's field or cut with truncate. */
#include <string.h>

#include "chat.h"
#include "check.h"
#include "dpo.h"
#include "lm.h"
#include "tokenizer.h"

static void expect(const char *text, const char *want) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  CHECK_MSG(j != NULL, "test line does not parse: %s", text);
  struct dapo_err e = {0};
  int rc = dpo_check_line(j, 3, &e);
  json_decref(j);
  CHECK_MSG(!rc == !e.msg[0], "rc %d with message '%s'", rc, e.msg);
  if (!*want)
    CHECK_MSG(!rc, "%s refused: %s", text, e.msg);
  else
    CHECK_MSG(rc && strstr(e.msg, want) != NULL, "%s: got '%s', want '%s'", text, e.msg, want);
}

/* The ids of text on lm's tokenizer (at most 256), appended at ids + *n. */
static void put(const struct lm *lm, const char *text, int *ids, int *n) {
  int k = 0;
  struct dapo_err e = {0};
  CHECK(tok_encode(lm->tok, text, strlen(text), ids + *n, 256, &k, &e) == 0);
  *n += k;
}

static void same(const int *got, int n_got, const int *want, int n_want, const char *what) {
  CHECK_MSG(n_got == n_want, "%s: %d tokens, want %d", what, n_got, n_want);
  for (int i = 0; i < n_got && i < n_want; i++)
    CHECK_MSG(got[i] == want[i], "%s: token %d is %d, want %d", what, i, got[i], want[i]);
}

/* Encodes text (a line) at max_tokens 4096 and compares with the prompt's and responses' parts;
 * end_id closes each response (the text form), else the template's end of turn "|". */
static void expect_pair(const struct lm *lm, const struct chat_template *chat, int end_id,
                        const char *text, const char *prompt, const char *chosen,
                        const char *rejected) {
  json_t *j = json_loads(text, 0, NULL);
  CHECK_MSG(j != NULL, "test line does not parse: %s", text);
  struct dapo_err e = {0};
  CHECK_MSG(dpo_check_line(j, 5, &e) == 0, "%s", e.msg);
  struct dpo_pair p;
  int rc = dpo_encode(lm, chat, end_id, j, 5, 4096, 0, &p, &e);
  json_decref(j);
  CHECK_MSG(rc == 0, "%s: %s", text, e.msg);
  if (rc) return;
  int want[512], n = 0;
  put(lm, prompt, want, &n);
  if (!n) want[n++] = tok_bos_id(lm->tok); /* an empty text prompt: BOS alone */
  same(p.prompt, p.n_prompt, want, n, "prompt");
  const char *r[2] = {chosen, rejected};
  for (int w = 0; w < 2; w++) {
    n = 0;
    put(lm, r[w], want, &n);
    if (prompt[0] != 'U') /* a text prompt: EOS; a conversation: the end of turn */
      want[n++] = end_id;
    else
      put(lm, "|", want, &n);
    same(p.resp[w], p.n_resp[w], want, n, w ? "rejected" : "chosen");
  }
  dpo_pair_deinit(&p);
}

static void test_encode(void) {
  struct lm lm;
  struct dapo_err e = {0};
  CHECK_MSG(lm_open_meta("tiny", &lm, &e) == 0, "%s", e.msg);
  int end_id = tok_eos_id(lm.tok);
  json_t *spec = json_pack("{s:s,s:s,s:s,s:s}", "user", "U{content}|", "assistant", "A{content}|",
                           "generation_prompt", "A", "stop", "|");
  struct chat_template *chat = chat_from_spec(spec, NULL, &e);
  json_decref(spec);
  CHECK_MSG(chat != NULL, "%s", e.msg);
  /* OpenAI's shape: the conversation up to the generation prompt, an earlier answer context */
  expect_pair(&lm, chat, end_id,
              "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"ab\"}, {\"role\": "
              "\"assistant\", \"content\": \"xy\"}, {\"role\": \"user\", \"content\": \"cd\"}]}, "
              "\"preferred_output\": [{\"role\": \"assistant\", \"content\": \"good\"}], "
              "\"non_preferred_output\": [{\"role\": \"assistant\", \"content\": \"bad\"}]}",
              "Uab|Axy|Ucd|A", "good", "bad");
  /* the older names */
  expect_pair(&lm, chat, end_id,
              "{\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}, "
              "\"preferred_completion\": [{\"role\": \"assistant\", \"content\": \"1\"}], "
              "\"non_preferred_completion\": [{\"role\": \"assistant\", \"content\": \"22\"}]}",
              "Uq|A", "1", "22");
  /* TRL's: text, and a conversation with string responses */
  expect_pair(&lm, chat, end_id, "{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"5\"}",
              "2+2=", "4", "5");
  expect_pair(&lm, chat, end_id, "{\"prompt\": \"\", \"chosen\": \"yes\", \"rejected\": \"no\"}",
              "", "yes", "no");
  expect_pair(&lm, chat, end_id,
              "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": \"yo\", "
              "\"rejected\": [{\"role\": \"assistant\", \"content\": \"go\"}]}",
              "Uhi|A", "yo", "go");

  /* longer than max_sequence_tokens (prompt 4 + "4" + EOS = 6; "55555" 10): refused by the
   * response's field, or its end cut */
  json_t *j =
      json_loads("{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"55555\"}", 0, NULL);
  struct dpo_pair p;
  CHECK(dpo_encode(&lm, chat, end_id, j, 9, 8, 0, &p, &e) == DAPO_ERANGE);
  CHECK_MSG(strstr(e.msg, "line 9: field 'rejected': 10 tokens with the prompt exceed "
                          "max_sequence_tokens (8"),
            "%s", e.msg);
  CHECK(dpo_encode(&lm, chat, end_id, j, 9, 8, 1, &p, &e) == 0);
  CHECK(p.n_prompt == 4 && p.n_resp[0] == 2 && p.cut[0] == 0 && p.n_resp[1] == 4 && p.cut[1] == 2);
  dpo_pair_deinit(&p);
  CHECK(dpo_encode(&lm, chat, end_id, j, 9, 4, 1, &p, &e) == DAPO_ERANGE);
  CHECK_MSG(strstr(e.msg, "line 9: field 'chosen': nothing of the response"), "%s", e.msg);
  json_decref(j);
  /* a conversation without a chat template */
  j = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": \"a\", "
                 "\"rejected\": \"b\"}",
                 0, NULL);
  CHECK(dpo_encode(&lm, NULL, end_id, j, 4, 100, 0, &p, &e) != 0);
  CHECK_MSG(strstr(e.msg, "line 4: field 'messages': the model has no chat template"), "%s", e.msg);
  json_decref(j);
  chat_free(chat);
  lm_close(&lm);
}

int main(void) {
  test_encode();
  const char *in = "\"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}";
  const char *a = "[{\"role\": \"assistant\", \"content\": \"a\"}]";
  char buf[1024];
#define LINE(...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)
  /* accepted */
  expect(LINE("{%s, \"preferred_output\": %s, \"non_preferred_output\": %s}", in, a, a), "");
  expect(LINE("{%s, \"preferred_output\": %s, \"non_preferred_output\": %s, \"id\": 1, "
              "\"metadata\": {}}",
              in, a, a),
         "");
  expect("{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": "
         "\"assistant\", \"content\": \"a\"}], \"rejected\": \"b\"}",
         "");
  /* refused, by line and field */
  expect("[1]", "line 3: expected a JSON object, got an array");
  expect("{\"question\": \"q\"}", "line 3: not a preference pair");
  expect(LINE("{%s, \"preferred_output\": [{\"role\": \"assistant\", \"content\": \"a\"}, "
              "{\"role\": \"assistant\", \"content\": \"b\"}], \"non_preferred_output\": %s}",
              in, a),
         "line 3: field 'preferred_output': expected exactly one assistant message (got several)");
  expect(LINE("{%s, \"preferred_output\": [], \"non_preferred_output\": %s}", in, a),
         "line 3: field 'preferred_output': expected exactly one assistant message (got none)");
  expect(LINE("{%s, \"preferred_output\": \"a\", \"non_preferred_output\": %s}", in, a),
         "line 3: field 'preferred_output': expected exactly one assistant message (got a string)");
  expect(LINE("{%s, \"preferred_output\": %s}", in, a),
         "line 3: field 'non_preferred_output': required");
  expect(LINE("{\"preferred_output\": %s, \"non_preferred_output\": %s}", a, a),
         "line 3: field 'input': required");
  expect(LINE("{\"input\": [], \"preferred_output\": %s, \"non_preferred_output\": %s}", a, a),
         "line 3: field 'input': expected an object, got an array");
  expect(LINE("{\"input\": {\"messages\": [{\"role\": \"robot\", \"content\": \"q\"}]}, "
              "\"preferred_output\": %s, \"non_preferred_output\": %s}",
              a, a),
         "line 3: field 'input.messages[0].role': expected one of");
  expect(LINE("{\"input\": {\"messages\": [], \"x\": 1}, \"preferred_output\": %s, "
              "\"non_preferred_output\": %s}",
              a, a),
         "line 3: field 'input.x': unknown");
  expect(LINE("{%s, \"preferred_output\": [{\"role\": \"user\", \"content\": \"a\"}], "
              "\"non_preferred_output\": %s}",
              in, a),
         "line 3: field 'preferred_output[0].role': expected \"assistant\"");
  expect(LINE("{%s, \"preferred_output\": %s, \"non_preferred_output\": [{\"role\": "
              "\"assistant\", \"content\": 5}]}",
              in, a),
         "line 3: field 'non_preferred_output[0].content': expected a string");
  expect(LINE("{%s, \"preferred_output\": %s, \"non_preferred_output\": [{\"role\": "
              "\"assistant\", \"content\": \"b\", \"weight\": 1}]}",
              in, a),
         "line 3: field 'non_preferred_output[0].weight'");
  expect(LINE("{%s, \"preferred_output\": %s, \"preferred_completion\": %s, "
              "\"non_preferred_output\": %s}",
              in, a, a, a),
         "line 3: field 'preferred_completion': give preferred_output or its older name");
  expect(
      LINE("{%s, \"preferred_output\": %s, \"non_preferred_output\": %s, \"extra\": 1}", in, a, a),
      "line 3: field 'extra': unknown (an OpenAI DPO line");
  expect("{\"prompt\": \"q\", \"chosen\": \"a\"}", "line 3: field 'rejected': required");
  expect("{\"chosen\": \"a\", \"rejected\": \"b\"}",
         "line 3: exactly one of 'prompt' or 'messages'");
  expect("{\"prompt\": \"q\", \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
         "\"rejected\": \"b\"}",
         "line 3: field 'chosen': expected a string (the prompt is text)");
  expect("{\"prompt\": 4, \"chosen\": \"a\", \"rejected\": \"b\"}",
         "line 3: field 'prompt': expected a string or an array of messages, got an integer");
  expect("{\"messages\": [{\"role\": \"user\"}], \"chosen\": \"a\", \"rejected\": \"b\"}",
         "line 3: field 'messages[0].content': expected a string");
  expect("{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\", \"score\": 1}",
         "line 3: field 'score': unknown (a TRL line");
  return check_done("test_dpo_data");
}
