/* OpenAI-style graders (core/reward/grader.h), the calculate_output formula parser
 * (core/reward/formula.h) and the text_similarity metrics (core/reward/similarity.h): hand-computed
 * cases from each metric's definition (nltk's and rouge_score's formulas; rapidfuzz's documented
 * examples), every operation and error kind, and the python sandbox when bubblewrap is there. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formula.h"
#include "grader.h"
#include "judge.h"
#include "similarity.h"

static double fx(const char *src, const double *vals) {
  static const char *const names[] = {"a", "b", "c_1"};
  struct dapo_err e = {0};
  struct formula *f = formula_new(src, strlen(src), names, 3, &e);
  if (!f) {
    fprintf(stderr, "formula '%s': %s\n", src, e.msg);
    return NAN;
  }
  double r = formula_eval(f, vals);
  formula_free(f);
  return r;
}

static void formula_refused(const char *src, const char *want) {
  static const char *const names[] = {"a", "b"};
  struct dapo_err e = {0};
  struct formula *f = formula_new(src, strlen(src), names, 2, &e);
  CHECK_MSG(!f && strstr(e.msg, want), "'%s' gave '%s', want '%s'", src, e.msg, want);
  formula_free(f);
}

static void test_formula(void) {
  double v[] = {0.5, 2, 3};
  CHECK_NEAR(fx("0.5 * a + 0.5 * b", v), 1.25, 1e-12);
  CHECK_NEAR(fx("a+b*c_1", v), 6.5, 1e-12);
  CHECK_NEAR(fx("(a+b)*c_1", v), 7.5, 1e-12);
  CHECK_NEAR(fx("b^c_1", v), 8, 1e-12);
  CHECK_NEAR(fx("2^3^2", v), 512, 1e-9); /* right-associative */
  CHECK_NEAR(fx("-b^2", v), -4, 1e-12);  /* power binds tighter than unary minus */
  CHECK_NEAR(fx("b^-1", v), 0.5, 1e-12);
  CHECK_NEAR(fx("10 - 4 - 3", v), 3, 1e-12);
  CHECK_NEAR(fx("12 / 3 / 2", v), 2, 1e-12);
  CHECK_NEAR(fx("min(a, b, c_1)", v), 0.5, 1e-12);
  CHECK_NEAR(fx("max(a, b, c_1)", v), 3, 1e-12);
  CHECK_NEAR(fx("abs(a - b)", v), 1.5, 1e-12);
  CHECK_NEAR(fx("floor(2.7) + ceil(2.1)", v), 5, 1e-12);
  CHECK_NEAR(fx("exp(0) + sqrt(16) + log(1)", v), 5, 1e-12);
  CHECK_NEAR(fx("1.5e1 + .5", v), 15.5, 1e-12);
  CHECK(isinf(fx("a / 0", v)));
  CHECK(isnan(fx("log(-1)", v)));
  formula_refused("", "must not be empty");
  formula_refused("a +", "at the end");
  formula_refused("a + d", "unknown name (not a key of graders) at column 5");
  formula_refused("pow(a, 2)", "unknown function");
  formula_refused("abs(a, b)", "one argument");
  formula_refused("(a + b", "expected ')'");
  formula_refused("a b", "unexpected character at column 3");
  formula_refused("a $ b", "unexpected character");
  formula_refused("1e999", "number out of range");
  char deep[300];
  memset(deep, '(', 100);
  deep[100] = 'a';
  memset(deep + 101, ')', 100);
  deep[201] = '\0';
  formula_refused(deep, "nested deeper than 64");
}

static void test_similarity(void) {
  /* ROUGE-1: 3 of 3 output words in the 6 of the reference: P 1, R 1/2 */
  CHECK_NEAR(sim_score(SIM_ROUGE_1, "the cat sat", "The cat sat on the mat."), 2.0 / 3, 1e-12);
  /* ROUGE-2: 2 of 2 bigrams, 2 of 5 */
  CHECK_NEAR(sim_score(SIM_ROUGE_2, "the cat sat", "the cat sat on the mat"), 0.8 / 1.4, 1e-12);
  CHECK_NEAR(sim_score(SIM_ROUGE_3, "a b", "a b c"), 0, 1e-12);
  CHECK_NEAR(sim_score(SIM_ROUGE_5, "a b c d e", "a b c d e"), 1, 1e-12);
  /* ROUGE-L: LCS 3 of 4 on both sides */
  CHECK_NEAR(sim_score(SIM_ROUGE_L, "a b c d", "a c b d"), 0.75, 1e-12);
  /* BLEU: p1..p4 = 6/7, 5/6, 4/5, 3/4, no brevity penalty (7 > 6) */
  CHECK_NEAR(sim_score(SIM_BLEU, "the cat sat on the mat today", "the cat sat on the mat"),
             pow(3.0 / 7, 0.25), 1e-12);
  /* brevity penalty exp(1 - 7/6) with the same matches reversed */
  CHECK_NEAR(sim_score(SIM_BLEU, "the cat sat on the mat", "the cat sat on the mat today"),
             exp(1 - 7.0 / 6) * pow(1.0 * 5 / 5 * 4 / 4 * 3 / 3, 0.25), 1e-12);
  CHECK(sim_score(SIM_BLEU, "a b", "a b") < 1e-70); /* no 3-grams: nltk's method0 */
  CHECK_NEAR(sim_score(SIM_BLEU, "x", "a b"), 0, 0);
  /* GLEU: 18 matched n-grams of 22 output and 18 reference ones */
  CHECK_NEAR(sim_score(SIM_GLEU, "the cat sat on the mat today", "the cat sat on the mat"),
             18.0 / 22, 1e-12);
  /* METEOR: 6 matches in one chunk: (1 - 0.5 (1/6)^3) */
  CHECK_NEAR(sim_score(SIM_METEOR, "the cat sat on the mat", "the cat sat on the mat"),
             1 - 0.5 * pow(1.0 / 6, 3), 1e-12);
  /* 2 matches (a, b) of 3 output and 2 reference words, in 2 chunks ("b a" vs "a b") */
  {
    double p = 2.0 / 3, r = 1, fmean = p * r / (0.9 * p + 0.1 * r);
    CHECK_NEAR(sim_score(SIM_METEOR, "b x a", "a b"), (1 - 0.5 * pow(1.0, 3)) * fmean, 1e-12);
  }
  CHECK_NEAR(sim_score(SIM_METEOR, "", "a"), 0, 0);
  /* fuzzy_match: rapidfuzz's documented values */
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "this is a test", "this is a test!"), 0.9655172413793104,
             1e-9);
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "fuzzy wuzzy was a bear", "wuzzy fuzzy was a bear"), 0.95,
             1e-9);
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "hello", "hallo"), 0.8, 1e-12);
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "abc", "abc"), 1, 0);
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "", "abc"), 0, 0);
  /* partial: "york" inside a much longer text: 100 * 0.6 (length ratio >= 8) */
  CHECK_NEAR(sim_score(SIM_FUZZY_MATCH, "york", "new york is a big city with many people"), 0.6,
             1e-12);
  CHECK(sim_metric_find("rouge_l") == SIM_ROUGE_L && sim_metric_find("cosine") < 0);
  for (int m = 0; m < SIM_COUNT; m++) {
    double s = sim_score(m, "\xff\xfe bad \xc3", "bad");
    CHECK_MSG(s >= 0 && s <= 1, "%s on invalid UTF-8: %g", sim_metric_name(m), s);
  }
}

static struct grader *mk(const char *spec, struct dapo_err *e) {
  json_t *j = json_loads(spec, 0, NULL);
  CHECK_MSG(j, "bad test JSON: %s", spec);
  struct grader *g = grader_new(j, "grader", NULL, e);
  json_decref(j);
  return g;
}

static void refused(const char *spec, const char *want) {
  struct dapo_err e = {0};
  struct grader *g = mk(spec, &e);
  CHECK_MSG(!g && strstr(e.msg, want), "%s gave '%s', want '%s'", spec, e.msg, want);
  grader_free(g);
}

/* Grades one output against an item (JSON text) and returns the score; errs out. */
static double grade1(const char *spec, const char *output, const char *item,
                     struct grader_errs *errs, json_t **sub) {
  struct dapo_err e = {0};
  struct grader *g = mk(spec, &e);
  CHECK_MSG(g, "%s: %s", spec, e.msg);
  if (!g) return NAN;
  json_t *it = json_loads(item, 0, NULL), *oj = json_loads(output, JSON_DECODE_ANY, NULL);
  struct grader_sample s = {.output_text = output, .output_json = oj, .item = it};
  double score = NAN;
  struct grader_errs local;
  json_t *sub_local = NULL;
  CHECK(grader_grade(g, &s, 1, &score, sub ? sub : &sub_local, errs ? errs : &local) == 0);
  json_decref(sub_local);
  json_decref(it);
  json_decref(oj);
  grader_free(g);
  return score;
}

static void test_string_check(void) {
  const char *eq = "{\"type\":\"string_check\",\"name\":\"x\",\"input\":\"{{sample.output_text}}\","
                   "\"reference\":\"{{ item.answer }}\",\"operation\":\"%s\"}";
  char spec[512];
  struct {
    const char *op, *out, *ref;
    double want;
  } cases[] = {
      {"eq", "7", "7", 1},
      {"eq", "7 ", "7", 0},
      {"ne", "7", "8", 1},
      {"ne", "7", "7", 0},
      {"like", "is 7.", "7", 1},
      {"like", "Seven", "seven", 0},
      {"ilike", "SEVEN", "seven", 1},
      {"ilike", "STRASSE", "straße", 1},
      {"ilike", "six", "7", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(spec, sizeof spec, eq, cases[i].op);
    char item[128];
    snprintf(item, sizeof item, "{\"answer\": \"%s\"}", cases[i].ref);
    double s = grade1(spec, cases[i].out, item, NULL, NULL);
    CHECK_MSG(s == cases[i].want, "%s('%s', '%s') = %g", cases[i].op, cases[i].out, cases[i].ref,
              s);
  }
  /* a number, a nested path and an array index render as text */
  CHECK(grade1("{\"type\":\"string_check\",\"input\":\"{{sample.output_text}}\",\"reference\":"
               "\"{{item.a.b[1]}}\",\"operation\":\"eq\"}",
               "5", "{\"a\": {\"b\": [4, 5]}}", NULL, NULL) == 1);
  CHECK(grade1("{\"type\":\"string_check\",\"input\":\"{{sample.output_json.k}}\",\"reference\":"
               "\"yes\",\"operation\":\"eq\"}",
               "{\"k\": \"yes\"}", "{}", NULL, NULL) == 1);
  /* an unresolved variable: 0 and counted */
  struct grader_errs er;
  CHECK(grade1("{\"type\":\"string_check\",\"input\":\"{{sample.output_text}}\",\"reference\":"
               "\"{{item.missing}}\",\"operation\":\"eq\"}",
               "x", "{}", &er, NULL) == 0);
  CHECK(er.n[GE_INVALID_VARIABLE] == 1);
  refused("{\"type\":\"string_check\",\"input\":\"a\",\"reference\":\"b\",\"operation\":\"neq\"}",
          "grader.operation: 'neq' is not one of eq, ne, like, ilike");
  refused("{\"type\":\"string_check\",\"input\":\"a\",\"operation\":\"eq\"}",
          "grader.reference: required");
  refused("{\"type\":\"string_check\",\"input\":\"{{x.y}}\",\"reference\":\"b\",\"operation\":"
          "\"eq\"}",
          "grader.input: variables start with item. or sample.");
  refused("{\"type\":\"string_check\",\"input\":\"a\",\"reference\":\"b\",\"operation\":\"eq\","
          "\"extra\":1}",
          "grader.extra: unknown field");
  /* without the server's judge_models (tests/api/test_model_graders.py has them) */
  refused("{\"type\":\"score_model\",\"model\":\"gpt-4o\",\"input\":[]}",
          "grader.model: 'gpt-4o' is not one of the server's judge_models (none configured");
  refused("{\"type\":\"label_model\"}", "grader.model: required");
  refused("{\"type\":\"text_similarity\",\"input\":\"a\",\"reference\":\"b\","
          "\"evaluation_metric\":\"cosine\"}",
          "grader.evaluation_metric: cosine needs an embeddings model");
  refused("{\"type\":\"text_similarity\",\"input\":\"a\",\"reference\":\"b\","
          "\"evaluation_metric\":\"rouge_9\"}",
          "grader.evaluation_metric: 'rouge_9' is not one of");
  refused("{\"type\":\"nope\"}", "grader.type: 'nope' is not one of");
  refused("[]", "grader: expected a grader object");
}

/* A sample's calls (a single-turn RFT response to a line with tools): sample.output_tools and the
 * choice's message.tool_calls, finish_reason "tool_calls"; none: [] (a path into it does not
 * resolve), no tool_calls, "stop". */
static void test_output_tools(void) {
  struct dapo_err e = {0};
  struct grader *g =
      mk("{\"type\":\"multi\",\"calculate_output\":\"name + args + fin + text\",\"graders\":{"
         "\"name\":{\"type\":\"string_check\",\"name\":\"n\",\"operation\":\"eq\",\"input\":"
         "\"{{sample.output_tools[0].function.name}}\",\"reference\":\"calc\"},"
         "\"args\":{\"type\":\"string_check\",\"name\":\"a\",\"operation\":\"eq\",\"input\":"
         "\"{{sample.choices[0].message.tool_calls[0].function.arguments}}\",\"reference\":"
         "\"{\\\"x\\\":1}\"},"
         "\"fin\":{\"type\":\"string_check\",\"name\":\"f\",\"operation\":\"eq\",\"input\":"
         "\"{{sample.choices[0].finish_reason}}\",\"reference\":\"tool_calls\"},"
         "\"text\":{\"type\":\"string_check\",\"name\":\"t\",\"operation\":\"eq\",\"input\":"
         "\"{{sample.output_text}}\",\"reference\":\"@calc {\\\"x\\\": 1}\"}}}",
         &e);
  CHECK_MSG(g, "%s", e.msg);
  json_t *calls = json_loads("[{\"id\": \"call_0\", \"type\": \"function\", \"function\": "
                             "{\"name\": \"calc\", \"arguments\": \"{\\\"x\\\":1}\"}}]",
                             0, NULL),
         *none = json_array();
  CHECK(calls != NULL);
  struct grader_sample s[3] = {{.output_text = "@calc {\"x\": 1}", .output_tools = calls},
                               {.output_text = "@calc {\"x\": 1}", .output_tools = none},
                               {.output_text = "@calc {\"x\": 1}"}};
  double sc[3];
  struct grader_errs er[3];
  CHECK(g && grader_grade(g, s, 3, sc, NULL, er) == 0);
  CHECK_MSG(sc[0] == 4 && er[0].n[GE_INVALID_VARIABLE] == 0, "with calls: %g", sc[0]);
  /* no calls: output_tools is [] (its [0] does not resolve), the message has no tool_calls */
  for (int i = 1; i < 3; i++)
    CHECK_MSG(sc[i] == 1 && er[i].n[GE_INVALID_VARIABLE] > 0, "without calls: %g", sc[i]);
  json_decref(calls);
  json_decref(none);
  grader_free(g);
}

static void test_multi(void) {
  const char *spec =
      "{\"type\":\"multi\",\"name\":\"m\",\"graders\":{"
      "\"exact\":{\"type\":\"string_check\",\"name\":\"e\",\"input\":\"{{sample.output_text}}\","
      "\"reference\":\"{{item.answer}}\",\"operation\":\"eq\"},"
      "\"sim\":{\"type\":\"text_similarity\",\"name\":\"s\",\"input\":\"{{sample.output_text}}\","
      "\"reference\":\"{{item.answer}}\",\"evaluation_metric\":\"rouge_1\"}},"
      "\"calculate_output\":\"0.5 * exact + 0.5 * sim\"}";
  json_t *sub = NULL;
  CHECK_NEAR(grade1(spec, "the cat", "{\"answer\": \"the cat\"}", NULL, &sub), 1, 1e-12);
  CHECK_NEAR(json_real_value(json_object_get(sub, "sim")), 1, 1e-12);
  json_decref(sub);
  /* exact 0, rouge_1 = 2/3 */
  CHECK_NEAR(grade1(spec, "the cat sat", "{\"answer\": \"the cat\"}", NULL, NULL),
             0.5 * (2 * 1.0 * (2.0 / 3) / (1 + 2.0 / 3)), 1e-12);
  /* the array form: keys are the graders' names */
  CHECK_NEAR(grade1("{\"type\":\"multi\",\"graders\":[{\"type\":\"string_check\",\"name\":\"a\","
                    "\"input\":\"x\",\"reference\":\"x\",\"operation\":\"eq\"},{\"type\":"
                    "\"string_check\",\"name\":\"b\",\"input\":\"x\",\"reference\":\"y\","
                    "\"operation\":\"eq\"}],\"calculate_output\":\"a + 2*b\"}",
                    "", "{}", NULL, NULL),
             1, 0);
  /* a non-finite result: 0 and a formula error */
  struct grader_errs er;
  CHECK(grade1("{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"string_check\",\"input\":\"x\","
               "\"reference\":\"y\",\"operation\":\"eq\"}},\"calculate_output\":\"1 / a\"}",
               "", "{}", &er, NULL) == 0);
  CHECK(er.n[GE_FORMULA_PARSE] == 1);
  refused("{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"string_check\",\"input\":\"x\","
          "\"reference\":\"y\",\"operation\":\"eq\"}},\"calculate_output\":\"a + b\"}",
          "grader.calculate_output: unknown name (not a key of graders) at column 5");
  refused(
      "{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"multi\"}},\"calculate_output\":\"a\"}",
      "grader.graders.a.type: a multi grader cannot hold another multi grader");
  refused("{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"string_check\",\"input\":\"x\","
          "\"reference\":\"y\",\"operation\":\"bad\"}},\"calculate_output\":\"a\"}",
          "grader.graders.a.operation: 'bad'");
  refused("{\"type\":\"multi\",\"graders\":{},\"calculate_output\":\"1\"}",
          "grader.graders: 0 graders");
  refused("{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"string_check\",\"input\":\"x\","
          "\"reference\":\"y\",\"operation\":\"eq\"}}}",
          "grader.calculate_output: required");
}

static void test_python(void) {
  char why[320];
  if (!grader_python_available(why, sizeof why)) {
    fprintf(stderr, "test_grader: python graders not checked: %s\n", why);
    refused("{\"type\":\"python\",\"source\":\"def grade(s, i): return 1\"}",
            "grader.type: python graders cannot run here");
    return;
  }
  const char *spec = "{\"type\":\"python\",\"source\":\"def grade(sample, item):\\n"
                     "    print('junk')\\n"
                     "    if item.get('boom'): raise ValueError('boom')\\n"
                     "    if item.get('str'): return 'x'\\n"
                     "    return 1.0 if sample['output_text'] == item['answer'] else 0.25\\n\"}";
  struct dapo_err e = {0};
  struct grader *g = mk(spec, &e);
  CHECK_MSG(g, "%s", e.msg);
  if (!g) return;
  const char *items[] = {"{\"answer\": \"7\"}", "{\"answer\": \"8\"}", "{\"boom\": 1}",
                         "{\"str\": 1}"};
  struct grader_sample s[4];
  json_t *it[4];
  for (int i = 0; i < 4; i++) {
    it[i] = json_loads(items[i], 0, NULL);
    s[i] = (struct grader_sample){.output_text = "7", .item = it[i]};
  }
  double sc[4];
  struct grader_errs er[4];
  CHECK(grader_grade(g, s, 4, sc, NULL, er) == 0);
  CHECK(sc[0] == 1 && sc[1] == 0.25 && sc[2] == 0 && sc[3] == 0);
  CHECK(er[0].n[GE_PYTHON_RUNTIME] == 0 && er[2].n[GE_PYTHON_RUNTIME] == 1 &&
        er[3].n[GE_PYTHON_RUNTIME] == 1);
  CHECK_MSG(strstr(er[2].detail, "ValueError: boom"), "%s", er[2].detail);
  for (int i = 0; i < 4; i++) json_decref(it[i]);
  grader_free(g);
  /* no network, no host files: both raise inside the sandbox and score 0 */
  struct grader_errs one;
  CHECK(grade1("{\"type\":\"python\",\"source\":\"import socket\\ndef grade(s, i):\\n"
               "    socket.create_connection(('1.1.1.1', 80), timeout=2)\\n    return 1\\n\"}",
               "x", "{}", &one, NULL) == 0);
  CHECK(one.n[GE_PYTHON_RUNTIME] == 1);
  CHECK(grade1("{\"type\":\"python\",\"source\":\"def grade(s, i):\\n"
               "    return len(open('/etc/hostname').read())\\n\"}",
               "x", "{}", &one, NULL) == 0);
  CHECK(one.n[GE_PYTHON_RUNTIME] == 1);
  /* a source without grade: every row fails with the setup error */
  CHECK(grade1("{\"type\":\"python\",\"source\":\"def grade_x(s, i): pass\\n# def grade\"}", "x",
               "{}", &one, NULL) == 0);
  CHECK_MSG(strstr(one.detail, "KeyError"), "%s", one.detail);
}

static void test_judge(void) {
  json_t *spec = json_loads(
      "{\"type\":\"grader\",\"pass_threshold\":1,\"response_format\":{\"type\":\"json_schema\","
      "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\",\"required\":[\"v\"]}}},"
      "\"grader\":{\"type\":\"string_check\",\"input\":\"{{sample.output_json.v}}\","
      "\"reference\":\"{{item.answer}}\",\"operation\":\"eq\"}}",
      0, NULL);
  struct dapo_err e = {0};
  struct judge *j = judge_new(spec, NULL, &e);
  CHECK_MSG(j, "%s", e.msg);
  json_decref(spec);
  if (!j) return;
  CHECK(!strcmp(judge_type(j), "grader"));
  json_t *meta = json_loads("{\"answer\": \"7\"}", 0, NULL);
  struct judge_item items[] = {
      {.response = "{\"v\": \"7\"}", .metadata = meta},
      {.response = "{\"v\": \"8\"}", .answer = "8"}, /* the native answer reads as item.answer */
      {.response = "not json", .answer = "7"},
      {.response = "{\"w\": 1}", .answer = "7"},
  };
  struct judge_result res[4];
  struct judge_stats st = {0};
  CHECK(judge_run(j, NULL, 0, items, 4, res, &st, NULL, &e) == 0);
  /* the step metrics' counts: samples that hit each error of the taxonomy (the two that are not
   * the JSON asked for also leave sample.output_json.v undefined) */
  CHECK_MSG(st.n_grader[GE_SAMPLE_PARSE] == 2 && st.n_grader[GE_INVALID_VARIABLE] == 2 &&
                st.n_grader[GE_FORMULA_PARSE] == 0,
            "grader error counts %d %d %d", st.n_grader[GE_SAMPLE_PARSE],
            st.n_grader[GE_INVALID_VARIABLE], st.n_grader[GE_FORMULA_PARSE]);
  CHECK(res[0].reward == 1 && res[0].correct == 1);
  CHECK(res[1].reward == 1 && res[1].correct == 1);
  CHECK(res[2].reward == 0 && res[2].correct == 0);
  CHECK(json_integer_value(
            json_object_get(json_object_get(res[2].info, "errors"), "sample_parse_error")) == 1);
  CHECK(res[3].reward == 0);
  judge_results_release(res, 4);
  json_decref(meta);
  judge_free(j);
  spec = json_loads("{\"type\":\"grader\",\"grader\":{\"type\":\"string_check\"}}", 0, NULL);
  j = judge_new(spec, NULL, &e);
  CHECK_MSG(!j && strstr(e.msg, "judge.grader.input: required"), "%s", e.msg);
  json_decref(spec);
}

int main(void) {
  test_formula();
  test_similarity();
  test_string_check();
  test_multi();
  test_output_tools();
  test_python();
  test_judge();
  return check_done("test_grader");
}
