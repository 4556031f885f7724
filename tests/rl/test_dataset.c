/* dataset: line validation (every error kind names its line and field), files with prompts,
 * messages, ids, metadata, blank lines, BOM and CRLF; the report's first-100 cap; the line cap;
 * chunked feeding; the bundled tests/data files; and the epoch-shuffled cursor (every item once
 * per epoch, seeded orders, exact resumption mid-epoch and at an epoch boundary). Scratch files
 * live under a mkdtemp folder in /tmp. */
#include "check.h"
#include "files.h"

#include <ftw.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "rng.h"

static char scratch[64];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", scratch, name);
}

static void write_bytes(const char *name, const char *data, size_t n) {
  char p[256];
  path_in(p, sizeof p, name);
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(data, 1, n, f) == n);
  fclose(f);
}

static void write_text(const char *name, const char *text) {
  write_bytes(name, text, strlen(text));
}

/* ds_check_line on a C string: returns its code, message in e. */
static int line_rc(const char *s, int lineno, struct dapo_err *e) {
  dapo_err_clear(e);
  return ds_check_line(s, strlen(s), lineno, NULL, e);
}

#define CHECK_LINE_ERR(text, lineno, want)                                                         \
  do {                                                                                             \
    struct dapo_err e_;                                                                            \
    int rc_ = line_rc(text, lineno, &e_);                                                          \
    CHECK_MSG(rc_ == DAPO_EFORMAT, "rc %d for %s", rc_, text);                                     \
    CHECK_MSG(strstr(e_.msg, want) != NULL, "message '%s' lacks '%s'", e_.msg, want);              \
  } while (0)

static void test_check_line(void) {
  struct dapo_err e;
  struct ds_item it = {0};

  /* Blank lines. */
  CHECK(line_rc("", 1, &e) == 1);
  CHECK(line_rc("\n", 4, &e) == 1);
  CHECK(line_rc("\r\n", 4, &e) == 1);
  CHECK(line_rc(" \t \r\n", 4, &e) == 1);
  CHECK(line_rc("\xEF\xBB\xBF\r\n", 1, &e) == 1);

  /* A prompt line with every optional field. */
  const char *l = "{\"id\": \"q-1\", \"prompt\": \"What is 2+3?\", \"answer\": \"5\", "
                  "\"metadata\": {\"level\": 1, \"tags\": [\"add\"]}, \"extra\": true}\r\n";
  CHECK(ds_check_line(l, strlen(l), 5, &it, &e) == 0);
  CHECK(it.id && strcmp(it.id, "q-1") == 0);
  CHECK(it.prompt && strcmp(it.prompt, "What is 2+3?") == 0);
  CHECK(it.messages == NULL);
  CHECK(it.answer && strcmp(it.answer, "5") == 0);
  CHECK(json_is_object(it.metadata) &&
        json_integer_value(json_object_get(it.metadata, "level")) == 1);
  CHECK(it.line == 5);
  ds_item_deinit(&it);
  CHECK(it.id == NULL && it.metadata == NULL);

  /* Messages, an integer id, UTF-8 text, a BOM on line 1, null optional fields. */
  l = "\xEF\xBB\xBF{\"id\": 42, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
      "{\"role\": \"user\", \"content\": \"Combien font 2+2 ? \xC3\xA9\"}], \"answer\": \"4\", "
      "\"metadata\": null}";
  CHECK(ds_check_line(l, strlen(l), 1, &it, &e) == 0);
  CHECK(it.id && strcmp(it.id, "42") == 0);
  CHECK(it.prompt == NULL);
  CHECK(json_array_size(it.messages) == 2);
  CHECK(strcmp(json_string_value(json_object_get(json_array_get(it.messages, 1), "role")),
               "user") == 0);
  CHECK(it.metadata == NULL);
  ds_item_deinit(&it);

  /* No id: "line-N". */
  l = "{\"prompt\": \"p\", \"answer\": \"\", \"id\": null}";
  CHECK(ds_check_line(l, strlen(l), 17, &it, &e) == 0);
  CHECK(it.id && strcmp(it.id, "line-17") == 0);
  CHECK(it.answer && it.answer[0] == '\0');
  ds_item_deinit(&it);
  ds_item_deinit(NULL);

  /* Every error kind, with its line and field. */
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": 4}", 7,
                 "line 7: field 'answer': expected a string, got an integer");
  CHECK_LINE_ERR("{\"prompt\": \"p\"}", 8, "line 8: field 'answer': required");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\"", 3, "line 3: not valid JSON: ");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\"", 3, " at column ");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": tru}", 3, "at column 29");
  CHECK_LINE_ERR("{\"answer\": \"a\"}", 9,
                 "line 9: exactly one of 'prompt' or 'messages' is required");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"messages\": [{\"role\": \"user\", \"content\": \"c\"}], "
                 "\"answer\": \"a\"}",
                 9, "line 9: exactly one of 'prompt' or 'messages' is required");
  CHECK_LINE_ERR("{\"prompt\": 3, \"answer\": \"a\"}", 2,
                 "line 2: field 'prompt': expected a string");
  CHECK_LINE_ERR("{\"prompt\": \"\", \"answer\": \"a\"}", 2, "line 2: field 'prompt': must not be");
  CHECK_LINE_ERR("{\"messages\": [], \"answer\": \"a\"}", 4, "line 4: field 'messages': must not");
  CHECK_LINE_ERR("{\"messages\": {}, \"answer\": \"a\"}", 4,
                 "line 4: field 'messages': expected an array");
  CHECK_LINE_ERR("{\"messages\": [\"hi\"], \"answer\": \"a\"}", 4,
                 "line 4: field 'messages[0]': expected an object");
  CHECK_LINE_ERR("{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"robot\", "
                 "\"content\": \"c\"}], \"answer\": \"a\"}",
                 5, "line 5: field 'messages[1].role': expected one of system, user, assistant");
  CHECK_LINE_ERR("{\"messages\": [{\"content\": \"c\"}], \"answer\": \"a\"}", 5,
                 "line 5: field 'messages[0].role': required");
  CHECK_LINE_ERR("{\"messages\": [{\"role\": \"tool\", \"content\": 1}], \"answer\": \"a\"}", 6,
                 "line 6: field 'messages[0].content': expected a string");
  CHECK_LINE_ERR("{\"messages\": [{\"role\": \"tool\"}], \"answer\": \"a\"}", 6,
                 "line 6: field 'messages[0].content': required");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\", \"id\": 1.5}", 10,
                 "line 10: field 'id': expected a string or an integer, got a number");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\", \"id\": \"\"}", 10,
                 "line 10: field 'id': must not be empty");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\", \"metadata\": [1]}", 11,
                 "line 11: field 'metadata': expected an object, got an array");
  CHECK_LINE_ERR("[1, 2]", 12, "line 12: expected a JSON object, got an array");
  CHECK_LINE_ERR("42", 12, "line 12: not valid JSON");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\"} {}", 13, "line 13: not valid JSON");
  CHECK_LINE_ERR("{\"prompt\": \"p\", \"answer\": \"a\", \"answer\": \"b\"}", 14,
                 "line 14: not valid JSON: duplicate object key");
  CHECK_LINE_ERR("{\"prompt\": \"p\xFF\", \"answer\": \"a\"}", 15, "line 15: not valid UTF-8");
  CHECK_LINE_ERR("{\"prompt\": \"\xC3\", \"answer\": \"a\"}", 15, "line 15: not valid UTF-8");
  CHECK_LINE_ERR("{\"prompt\": \"\xED\xA0\x80\", \"answer\": \"a\"}", 15, "not valid UTF-8");
  CHECK_LINE_ERR("{\"prompt\": \"p\\u0000\", \"answer\": \"a\"}", 16, "line 16: not valid JSON");
  CHECK_LINE_ERR("\xEF\xBB\xBF{\"prompt\": \"p\", \"answer\": \"a\"}", 2,
                 "line 2: byte-order mark inside the file");
  CHECK_LINE_ERR("{\"prompt\": \"p\",\n \"answer\": \"a\"}", 3, "line 3: contains a line break");

  /* A message quoting input cut inside a character stays valid UTF-8 (it goes into JSON). */
  char role[256];
  int w0 = snprintf(role, sizeof role, "{\"messages\": [{\"role\": \"x");
  for (int i = 0; i < 30; i++) w0 += snprintf(role + w0, sizeof role - (size_t)w0, "\xC3\xA9");
  snprintf(role + w0, sizeof role - (size_t)w0, "\", \"content\": \"c\"}], \"answer\": \"a\"}");
  CHECK(line_rc(role, 3, &e) == DAPO_EFORMAT && strstr(e.msg, "got 'x\xC3\xA9"));
  json_t *js = json_string(e.msg);
  CHECK_MSG(js != NULL, "not UTF-8: %s", e.msg);
  json_decref(js);

  /* Metadata nesting: depth 64 passes, 65 is refused. */
  char deep[1024];
  for (int depth = 63; depth <= 66; depth++) {
    int w = snprintf(deep, sizeof deep, "{\"prompt\": \"p\", \"answer\": \"a\", \"metadata\": ");
    for (int i = 1; i < depth; i++) w += snprintf(deep + w, sizeof deep - (size_t)w, "{\"x\":");
    w += snprintf(deep + w, sizeof deep - (size_t)w, "[]");
    for (int i = 1; i < depth; i++) w += snprintf(deep + w, sizeof deep - (size_t)w, "}");
    snprintf(deep + w, sizeof deep - (size_t)w, "}");
    int rc = line_rc(deep, 21, &e);
    if (depth <= 64)
      CHECK_MSG(rc == 0, "depth %d: rc %d %s", depth, rc, e.msg);
    else
      CHECK_MSG(rc == DAPO_EFORMAT &&
                    strstr(e.msg, "line 21: field 'metadata': nested deeper than 64"),
                "depth %d: rc %d %s", depth, rc, e.msg);
  }
  /* Deep nesting outside metadata is jansson's business (its own limit, 2048). */
  CHECK(line_rc("{\"prompt\": \"p\", \"answer\": \"a\", \"other\": [[[[[[[[[[[[1]]]]]]]]]]]]}", 1,
                &e) == 0);
}

/* A line's `tools`: kept (OpenAI's function shapes) on messages lines, refused field by field. */
static void test_line_tools(void) {
  struct dapo_err e;
  struct ds_item it = {0};
  const char *l = "{\"messages\": [{\"role\": \"user\", \"content\": \"2+3?\"}], \"sum\": \"5\", "
                  "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"calc\", "
                  "\"description\": \"adds\", \"parameters\": {\"type\": \"object\"}, \"strict\": "
                  "true}}, {\"type\": \"function\", \"function\": {\"name\": \"look-up_2\"}}]}";
  CHECK(ds_check_line(l, strlen(l), 3, &it, &e) == 0);
  CHECK(json_array_size(it.tools) == 2 &&
        !strcmp(json_string_value(json_object_get(
                    json_object_get(json_array_get(it.tools, 1), "function"), "name")),
                "look-up_2"));
  /* the item graders read holds neither messages nor tools */
  CHECK(json_object_get(it.metadata, "sum") && !json_object_get(it.metadata, "tools"));
  ds_item_deinit(&it);
  CHECK(it.tools == NULL);
  /* null, [] and absent: no tools; a native messages line keeps them too */
  const char *none[] = {
      "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"tools\": null}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"tools\": []}",
      "{\"prompt\": \"p\", \"answer\": \"a\", \"tools\": []}"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    CHECK_MSG(ds_check_line(none[i], strlen(none[i]), 1, &it, &e) == 0 && !it.tools, "%s: %s",
              none[i], e.msg);
    ds_item_deinit(&it);
  }
  l = "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"answer\": \"a\", \"tools\": "
      "[{\"type\": \"function\", \"function\": {\"name\": \"x\"}}]}";
  CHECK(ds_check_line(l, strlen(l), 1, &it, &e) == 0 && json_array_size(it.tools) == 1);
  ds_item_deinit(&it);

#define MSGS "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"tools\": "
#define FN(x) "{\"type\": \"function\", \"function\": " x "}"
  static const struct {
    const char *text;
    int line;
    const char *want;
  } BAD[] = {
      {MSGS "{}}", 3, "line 3: field 'tools': expected an array, got an object"},
      {MSGS "[1]}", 3, "line 3: field 'tools[0]': expected an object, got an integer"},
      {MSGS "[" FN("{\"name\": \"a\"}") ", {\"type\": \"python\"}]}", 3,
       "line 3: field 'tools[1].type': expected \"function\""},
      {MSGS "[{\"type\": \"function\"}]}", 4,
       "line 4: field 'tools[0].function': expected an object"},
      {MSGS "[" FN("{\"name\": \"a\"}") ", " FN("{\"name\": \"a b\"}") "]}", 3,
       "line 3: field 'tools[1].function.name': expected 1 to 64 of a-z, A-Z, 0-9, _ "
       "and -"},
      {MSGS "[" FN("{\"name\": 7}") "]}", 3,
       "line 3: field 'tools[0].function.name': expected 1 to 64"},
      {MSGS "[" FN("{\"name\": \"\"}") "]}", 3,
       "line 3: field 'tools[0].function.name': expected 1 to 64"},
      {MSGS "[" FN("{\"name\": \"a\", \"parameters\": [1]}") "]}", 5,
       "line 5: field 'tools[0].function.parameters': expected a JSON Schema object, "
       "got an array"},
      {MSGS "[" FN("{\"name\": \"a\", \"description\": 1}") "]}", 5,
       "line 5: field 'tools[0].function.description': expected a string"},
      {MSGS "[" FN("{\"name\": \"a\", \"strict\": \"yes\"}") "]}", 5,
       "line 5: field 'tools[0].function.strict': expected a boolean, got a string"},
      {MSGS
       "[" FN("{\"name\": \"a\"}") ", " FN("{\"name\": \"b\"}") ", " FN("{\"name\": \"a\"}") "]}",
       6, "line 6: field 'tools[2].function.name': a second tool named 'a'"},
      {"{\"prompt\": \"p\", \"answer\": \"a\", \"tools\": [" FN("{\"name\": \"a\"}") "]}", 7,
       "line 7: field 'tools': needs 'messages'"},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
    CHECK_LINE_ERR(BAD[i].text, BAD[i].line, BAD[i].want);
  /* the 65th tool is one too many */
  char many[8192];
  int w = snprintf(many, sizeof many, MSGS "[");
  for (int i = 0; i < 65; i++)
    w += snprintf(many + w, sizeof many - (size_t)w, "%s" FN("{\"name\": \"t%d\"}"), i ? ", " : "",
                  i);
  snprintf(many + w, sizeof many - (size_t)w, "]}");
  CHECK_LINE_ERR(many, 8, "line 8: field 'tools': at most 64 tools, got 65");
  int cut = w - 2 - (int)strlen(FN("{\"name\": \"t64\"}")); /* after the 64th */
  snprintf(many + cut, sizeof many - (size_t)cut, "]}");
  CHECK_MSG(line_rc(many, 8, &e) == 0, "64 tools: %s", e.msg);
#undef FN
#undef MSGS
}

static void test_valid_file(void) {
  char p[256];
  struct dapo_err e;
  struct ds_report rep;
  struct dataset *d = NULL;
  ds_report_init(&rep);
  const char *text =
      "\xEF\xBB\xBF{\"id\": \"a\", \"prompt\": \"What is 1+1?\", \"answer\": \"2\"}\r\n"
      "\r\n"
      "{\"id\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], "
      "\"answer\": \"4\", \"metadata\": {\"k\": \"v\"}}\r\n"
      "   \n"
      "{\"prompt\": \"What is 3+3?\", \"answer\": \"6\"}\n"
      "\n"
      "{\"prompt\": \"What is 4+4?\", \"answer\": \"8\", \"unknown\": {\"a\": [1]}}";
  write_text("valid.jsonl", text);
  path_in(p, sizeof p, "valid.jsonl");
  int rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == 0, "rc %d: %s", rc, e.msg);
  CHECK(d != NULL);
  CHECK(ds_count(d) == 4);
  CHECK(rep.n_lines == 7 && rep.n_items == 4 && rep.n_errors == 0 && rep.n_reported == 0);
  const struct ds_item *it = ds_get(d, 0);
  CHECK(it && strcmp(it->id, "a") == 0 && strcmp(it->prompt, "What is 1+1?") == 0 &&
        strcmp(it->answer, "2") == 0 && it->line == 1 && it->metadata == NULL);
  it = ds_get(d, 1);
  CHECK(it && strcmp(it->id, "7") == 0 && it->prompt == NULL &&
        json_array_size(it->messages) == 1 && strcmp(it->answer, "4") == 0 && it->line == 3 &&
        strcmp(json_string_value(json_object_get(it->metadata, "k")), "v") == 0);
  it = ds_get(d, 2);
  CHECK(it && strcmp(it->id, "line-5") == 0 && it->line == 5);
  it = ds_get(d, 3);
  CHECK(it && strcmp(it->id, "line-7") == 0 && strcmp(it->answer, "8") == 0 && it->line == 7);
  CHECK(ds_get(d, 4) == NULL && ds_get(d, -1) == NULL);
  ds_free(d);

  /* The same bytes fed one at a time give the same result. */
  struct ds_stream *s = ds_stream_new(NULL, 1);
  CHECK(s != NULL);
  for (size_t i = 0; s && i < strlen(text); i++) CHECK(ds_stream_feed(s, text + i, 1, &e) == 0);
  d = NULL;
  CHECK(ds_stream_finish(s, &d, &rep, &e) == 0);
  CHECK(ds_count(d) == 4 && rep.n_lines == 7);
  CHECK(d && strcmp(ds_get(d, 1)->id, "7") == 0 && ds_get(d, 3)->line == 7);
  CHECK(ds_stream_feed(s, "x", 1, &e) == DAPO_EINVAL); /* finished */
  ds_stream_free(s);
  ds_free(d);

  /* Validation alone: same checks, no items. */
  rc = ds_validate_file(p, NULL, &rep, &e);
  CHECK(rc == 0 && rep.n_items == 4);
  ds_report_deinit(&rep);
  ds_free(NULL);
}

static void test_invalid_file(void) {
  char p[256];
  struct dapo_err e;
  struct ds_report rep;
  struct dataset *d = (struct dataset *)&rep; /* must be reset to NULL */
  ds_report_init(&rep);
  write_text("bad.jsonl", "{\"prompt\": \"p\", \"answer\": \"a\"}\n"
                          "{\"prompt\": \"p\", \"answer\": 1}\n"
                          "\n"
                          "not json\n"
                          "{\"prompt\": \"p\", \"answer\": \"a\"}\n"
                          "{\"answer\": \"a\"}\n");
  path_in(p, sizeof p, "bad.jsonl");
  int rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK(rc == DAPO_EFORMAT && d == NULL);
  CHECK_MSG(strstr(e.msg, "dataset invalid: 3 errors, first: line 2: field 'answer': expected a "
                          "string") == e.msg,
            "%s", e.msg);
  CHECK(rep.n_lines == 6 && rep.n_items == 2 && rep.n_errors == 3 && rep.n_reported == 3);
  CHECK(rep.n_reported == 3 && rep.errors[0].line == 2 && rep.errors[1].line == 4 &&
        rep.errors[2].line == 6);
  CHECK(rep.n_reported == 3 &&
        strstr(rep.errors[1].message, "not valid JSON") == rep.errors[1].message);
  CHECK(rep.n_reported == 3 && strstr(rep.errors[2].message, "exactly one of"));
  json_t *j = ds_report_to_json(&rep);
  CHECK(json_array_size(j) == 3);
  json_t *j0 = json_array_get(j, 0);
  CHECK(json_integer_value(json_object_get(j0, "line")) == 2);
  CHECK(json_is_string(json_object_get(j0, "message")) &&
        strcmp(json_string_value(json_object_get(j0, "message")),
               "field 'answer': expected a string, got an integer") == 0);
  json_decref(j);

  /* The same through validation, and a single error reads "1 error". */
  CHECK(ds_validate_file(p, NULL, &rep, &e) == DAPO_EFORMAT && rep.n_errors == 3);
  write_text("one.jsonl", "{\"prompt\": \"p\", \"answer\": \"a\"}\n{\"prompt\": \"p\"}\n");
  path_in(p, sizeof p, "one.jsonl");
  CHECK(ds_validate_file(p, NULL, &rep, &e) == DAPO_EFORMAT);
  CHECK_MSG(strstr(e.msg, "dataset invalid: 1 error, first: line 2: field 'answer': required"),
            "%s", e.msg);

  /* Invalid UTF-8 in a file: the message stays valid UTF-8 for the JSON report. */
  write_bytes("utf8.jsonl", "{\"prompt\": \"a\xC3(\", \"answer\": \"x\"}\n", 33);
  path_in(p, sizeof p, "utf8.jsonl");
  CHECK(ds_validate_file(p, NULL, &rep, &e) == DAPO_EFORMAT);
  CHECK_MSG(strstr(e.msg, "line 1: not valid UTF-8"), "%s", e.msg);
  j = ds_report_to_json(&rep);
  CHECK(json_array_size(j) == 1);
  json_decref(j);

  /* 150 bad lines: the first 100 listed, all counted. */
  char *big = malloc(150 * 64 + 1);
  CHECK(big != NULL);
  if (big) {
    size_t w = 0;
    for (int i = 0; i < 150; i++)
      w += (size_t)snprintf(big + w, 64, "{\"prompt\": \"p%d\", \"answer\": %d}\n", i, i);
    write_bytes("150.jsonl", big, w);
    free(big);
  }
  path_in(p, sizeof p, "150.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK(rc == DAPO_EFORMAT && d == NULL);
  CHECK(rep.n_errors == 150 && rep.n_reported == 100 && rep.n_items == 0);
  CHECK(rep.n_reported == 100 && rep.errors[0].line == 1 && rep.errors[99].line == 100);
  CHECK(strstr(e.msg, "dataset invalid: 150 errors, first: line 1: field 'answer'") == e.msg);
  j = ds_report_to_json(&rep);
  CHECK(json_array_size(j) == 100);
  CHECK(json_integer_value(json_object_get(json_array_get(j, 99), "line")) == 100);
  json_decref(j);
  struct ds_limits lim = {.max_errors_reported = 5};
  CHECK(ds_validate_file(p, &lim, &rep, &e) == DAPO_EFORMAT);
  CHECK(rep.n_errors == 150 && rep.n_reported == 5);

  /* Empty and blank-only files, a missing file. */
  write_text("empty.jsonl", "");
  path_in(p, sizeof p, "empty.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK(rc == DAPO_EFORMAT && d == NULL && strstr(e.msg, "no items"));
  write_text("blank.jsonl", "\n  \r\n\n");
  path_in(p, sizeof p, "blank.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK(rc == DAPO_EFORMAT && d == NULL && strstr(e.msg, "no items") && rep.n_lines == 3);
  path_in(p, sizeof p, "missing.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == DAPO_EIO && d == NULL && strstr(e.msg, "missing.jsonl"), "%d %s", rc, e.msg);

  /* Too many items. */
  write_text("three.jsonl", "{\"prompt\": \"p\", \"answer\": \"a\"}\n"
                            "{\"prompt\": \"p\", \"answer\": \"a\"}\n"
                            "{\"prompt\": \"p\", \"answer\": \"a\"}\n");
  path_in(p, sizeof p, "three.jsonl");
  lim = (struct ds_limits){.max_items = 2};
  rc = ds_load(p, &lim, &d, &rep, &e);
  CHECK_MSG(rc == DAPO_ERANGE && d == NULL && strstr(e.msg, "more than 2 items"), "%d %s", rc,
            e.msg);
  lim.max_items = 3;
  rc = ds_load(p, &lim, &d, &rep, &e);
  CHECK(rc == 0 && ds_count(d) == 3);
  ds_free(d);
  ds_report_deinit(&rep);
}

static void test_line_cap(void) {
  char p[256];
  struct dapo_err e;
  struct ds_report rep;
  struct dataset *d = NULL;
  ds_report_init(&rep);

  /* Default cap (1 MiB): a line of 1 MiB + 10 bytes between two good lines. */
  size_t big = ((size_t)1 << 20) + 10;
  const char *good = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
  size_t gl = strlen(good);
  char *buf = malloc(big + 2 * gl + 1);
  CHECK(buf != NULL);
  if (!buf) return;
  memcpy(buf, good, gl);
  memset(buf + gl, ' ', big);
  memcpy(buf + gl, "{\"prompt\": \"", 12);
  buf[gl + big - 1] = '\n';
  memcpy(buf + gl + big, good, gl);
  write_bytes("long.jsonl", buf, gl + big + gl);
  path_in(p, sizeof p, "long.jsonl");
  int rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == DAPO_EFORMAT && strstr(e.msg, "line 2: longer than 1048576 bytes"), "%d %s", rc,
            e.msg);
  CHECK(rep.n_lines == 3 && rep.n_items == 2 && rep.n_errors == 1);
  /* An unterminated overlong last line too. */
  write_bytes("long2.jsonl", buf, gl + big - 1);
  path_in(p, sizeof p, "long2.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == DAPO_EFORMAT && strstr(e.msg, "line 2: longer than 1048576 bytes"), "%d %s", rc,
            e.msg);
  free(buf);

  /* A small cap, at its edge: the cap counts the line without "\n" or "\r\n". */
  struct ds_limits lim = {.max_line_bytes = 40};
  char line[128];
  /* {"prompt": "ppp...", "answer": "a"} padded to exactly 40 bytes. */
  int plen = 40 - (int)strlen("{\"prompt\": \"\", \"answer\": \"a\"}");
  snprintf(line, sizeof line, "{\"prompt\": \"%.*s\", \"answer\": \"a\"}", plen,
           "pppppppppppppppppppppppppppppppppppppppp");
  CHECK(strlen(line) == 40);
  char text[512];
  snprintf(text, sizeof text, "%s\n%s\r\n%s", line, line, line);
  struct ds_stream *s = ds_stream_new(&lim, 0);
  CHECK(s && ds_stream_feed(s, text, strlen(text), &e) == 0);
  rc = ds_stream_finish(s, NULL, &rep, &e);
  CHECK_MSG(rc == 0 && rep.n_items == 3, "%d %s", rc, e.msg);
  ds_stream_free(s);
  snprintf(text, sizeof text, "%s\n %s\r\n%s \n%s", line, line, line, line);
  s = ds_stream_new(&lim, 0);
  for (size_t i = 0; s && i < strlen(text); i += 7) {
    size_t k = strlen(text) - i < 7 ? strlen(text) - i : 7;
    CHECK(ds_stream_feed(s, text + i, k, &e) == 0);
  }
  rc = ds_stream_finish(s, NULL, &rep, &e);
  CHECK(rc == DAPO_EFORMAT && rep.n_items == 2 && rep.n_errors == 2);
  CHECK(rep.n_reported == 2 && rep.errors[0].line == 2 && rep.errors[1].line == 3 &&
        strcmp(rep.errors[0].message, "longer than 40 bytes") == 0);
  ds_stream_free(s);
  ds_report_deinit(&rep);
}

static void test_large_file(void) {
  char p[256];
  struct dapo_err e;
  struct dataset *d = NULL;
  path_in(p, sizeof p, "large.jsonl");
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  if (!f) return;
  for (int i = 0; i < 100000; i++) {
    if (i % 3 == 0)
      fprintf(f, "{\"id\": %d, \"prompt\": \"What is %d+%d?\", \"answer\": \"%d\"}\n", i, i, i,
              2 * i);
    else
      fprintf(f,
              "{\"id\": \"m%d\", \"messages\": [{\"role\": \"user\", \"content\": \"%d*2\"}], "
              "\"answer\": \"%d\", \"metadata\": {\"i\": %d}}\n",
              i, i, 2 * i, i);
  }
  fclose(f);
  struct ds_report rep;
  ds_report_init(&rep);
  int rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == 0, "%d %s", rc, e.msg);
  CHECK(ds_count(d) == 100000 && rep.n_lines == 100000);
  const struct ds_item *it = ds_get(d, 99999);
  CHECK(it && strcmp(it->id, "99999") == 0 && strcmp(it->answer, "199998") == 0 &&
        it->line == 100000);
  it = ds_get(d, 50000);
  CHECK(it && strcmp(it->id, "m50000") == 0 &&
        json_integer_value(json_object_get(it->metadata, "i")) == 50000);
  ds_free(d);
  ds_report_deinit(&rep);
}

static void test_data_files(void) {
  char p[512];
  struct dapo_err e;
  struct ds_report rep;
  struct dataset *d = NULL;
  ds_report_init(&rep);
  data_path(p, sizeof p, "addition.jsonl");
  int rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == 0, "%s: %d %s", p, rc, e.msg);
  CHECK(ds_count(d) == 64);
  for (int i = 0; d && i < ds_count(d); i++) {
    const struct ds_item *it = ds_get(d, i);
    char want[16];
    snprintf(want, sizeof want, "add-%02d", i);
    CHECK(strcmp(it->id, want) == 0);
    int a = -1, b = -1, c = -1;
    CHECK(sscanf(it->prompt, "What is %d+%d?", &a, &b) == 2);
    CHECK(sscanf(it->answer, "%d", &c) == 1 && a + b == c);
  }
  ds_free(d);

  data_path(p, sizeof p, "invalid.jsonl");
  rc = ds_load(p, NULL, &d, &rep, &e);
  CHECK_MSG(rc == DAPO_EFORMAT && d == NULL, "%s: %d %s", p, rc, e.msg);
  CHECK(rep.n_items == 2 && rep.n_errors == 4 && rep.n_reported == 4);
  if (rep.n_reported == 4) {
    CHECK(rep.errors[0].line == 2 && strstr(rep.errors[0].message, "field 'answer'"));
    CHECK(rep.errors[1].line == 4 && strstr(rep.errors[1].message, "not valid JSON"));
    CHECK(rep.errors[2].line == 5 && strstr(rep.errors[2].message, "exactly one of"));
    CHECK(rep.errors[3].line == 7 && strstr(rep.errors[3].message, "messages[0].role"));
  }
  ds_report_deinit(&rep);
}

/* Loads n items "{prompt: i}" into a dataset. */
static struct dataset *make_dataset(int n, const char *name) {
  char p[256];
  path_in(p, sizeof p, name);
  FILE *f = fopen(p, "wb");
  if (!f) return NULL;
  for (int i = 0; i < n; i++) fprintf(f, "{\"prompt\": \"%d\", \"answer\": \"a\"}\n", i);
  fclose(f);
  struct dataset *d = NULL;
  struct dapo_err e;
  CHECK(ds_load(p, NULL, &d, NULL, &e) == 0);
  return d;
}

static void test_cursor(void) {
  enum { N = 37, EPOCHS = 4 };
  struct dataset *d = make_dataset(N, "cursor.jsonl");
  struct dataset *d2 = make_dataset(N, "cursor2.jsonl");
  CHECK(d && d2 && ds_count(d) == N);
  if (!d || !d2) return;

  /* Every item exactly once per epoch; the epoch and pos fields move as documented; the order
   * is the documented one (rng_seed(seed, DS_RNG_STREAM_TAG ^ k) + rng_shuffle_int). */
  int seq[EPOCHS][N];
  struct ds_cursor c = {.seed = 1234, .epoch = 0, .pos = 0};
  for (int k = 0; k < EPOCHS; k++) {
    int seen[N] = {0};
    int ref[N];
    for (int i = 0; i < N; i++) ref[i] = i;
    struct rng r;
    rng_seed(&r, 1234, DS_RNG_STREAM_TAG ^ (uint64_t)k);
    rng_shuffle_int(&r, ref, N);
    for (int i = 0; i < N; i++) {
      int idx = ds_next(d, &c);
      CHECK(idx >= 0 && idx < N);
      if (idx < 0 || idx >= N) return;
      seq[k][i] = idx;
      seen[idx]++;
      CHECK(idx == ref[i]);
      CHECK(c.epoch == k && c.pos == i + 1);
    }
    for (int i = 0; i < N; i++) CHECK_MSG(seen[i] == 1, "epoch %d item %d seen %d", k, i, seen[i]);
  }
  CHECK(c.epoch == EPOCHS - 1 && c.pos == N);
  for (int k = 1; k < EPOCHS; k++) CHECK(memcmp(seq[0], seq[k], sizeof seq[0]) != 0);
  int identity = 1;
  for (int i = 0; i < N; i++) identity &= seq[0][i] == i;
  CHECK(!identity);

  /* Same seed, same order (on another handle, interleaved with a different seed on d so that
   * d's cache keeps changing); another seed, another order. */
  struct ds_cursor a = {.seed = 1234}, b = {.seed = 99}, a2 = {.seed = 1234};
  int diff_seed = 0;
  for (int k = 0; k < EPOCHS; k++)
    for (int i = 0; i < N; i++) {
      int ia = ds_next(d, &a), ib = ds_next(d, &b), ia2 = ds_next(d2, &a2);
      CHECK(ia == seq[k][i] && ia2 == seq[k][i]);
      diff_seed |= ib != ia;
    }
  CHECK(diff_seed);

  /* Resume from copies mid-epoch and exactly at an epoch boundary. */
  struct ds_cursor orig = {.seed = 777};
  struct ds_cursor mid, boundary;
  for (int i = 0; i < N + 5; i++) ds_next(d, &orig);
  mid = orig;
  CHECK(mid.epoch == 1 && mid.pos == 5);
  int from_orig[3 * N], from_mid[3 * N];
  for (int i = 0; i < 3 * N; i++) from_orig[i] = ds_next(d, &orig);
  for (int i = 0; i < 3 * N; i++) from_mid[i] = ds_next(d2, &mid);
  CHECK(memcmp(from_orig, from_mid, sizeof from_orig) == 0);

  orig = (struct ds_cursor){.seed = 777};
  for (int i = 0; i < 2 * N; i++) ds_next(d, &orig);
  CHECK(orig.epoch == 1 && orig.pos == N);
  boundary = orig;
  struct ds_cursor fresh_epoch = {.seed = 777, .epoch = 2, .pos = 0};
  int from_fresh[2 * N];
  for (int i = 0; i < 2 * N; i++) from_orig[i] = ds_next(d, &orig);
  for (int i = 0; i < 2 * N; i++) from_mid[i] = ds_next(d2, &boundary);
  for (int i = 0; i < 2 * N; i++) from_fresh[i] = ds_next(d, &fresh_epoch);
  CHECK(memcmp(from_orig, from_mid, 2 * N * sizeof(int)) == 0);
  CHECK(memcmp(from_orig, from_fresh, 2 * N * sizeof(int)) == 0);
  CHECK(boundary.epoch == 3 && boundary.pos == N);

  /* Cursors that do not fit, and a one-item dataset. */
  struct ds_cursor bad = {.seed = 1, .epoch = 0, .pos = N + 1};
  CHECK(ds_next(d, &bad) == DAPO_EINVAL && bad.pos == N + 1);
  bad = (struct ds_cursor){.seed = 1, .epoch = -1, .pos = 0};
  CHECK(ds_next(d, &bad) == DAPO_EINVAL);
  bad = (struct ds_cursor){.seed = 1, .epoch = 0, .pos = -1};
  CHECK(ds_next(d, &bad) == DAPO_EINVAL);
  CHECK(ds_next(NULL, &bad) == DAPO_EINVAL);
  ds_free(d);
  ds_free(d2);
  d = make_dataset(1, "one.jsonl");
  struct ds_cursor one = {.seed = 5};
  for (int i = 0; d && i < 3; i++) CHECK(ds_next(d, &one) == 0 && one.epoch == i && one.pos == 1);
  ds_free(d);
}

int main(void) {
  snprintf(scratch, sizeof scratch, "/tmp/dapo-dataset-XXXXXX");
  if (!mkdtemp(scratch)) {
    perror("mkdtemp");
    return 1;
  }
  test_check_line();
  test_line_tools();
  test_valid_file();
  test_invalid_file();
  test_line_cap();
  test_large_file();
  test_data_files();
  test_cursor();
  nftw(scratch, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return check_done("test_dataset");
}
